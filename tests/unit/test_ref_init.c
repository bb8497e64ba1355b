/* test_ref_init.c - bf16/f16 rounding on known bit patterns, and the deterministic parameter
 * initialisation: a pure function of (seed, name, index), the same for any sub-range, with the
 * right distribution, and equal to the documented formula (values from an independent Python
 * reimplementation of the comment in runtime/init.c).
 */
#include "exec.h"
#include "ref_test.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- rounding ---- */

Test(ref_round, bf16_known_patterns)
{
    cr_expect_eq(bits_of(ptrt_round_bf16(1.0f)), 0x3F800000u); /* exact */
    /* 1 + 2^-8: a tie, to the even 1 */
    cr_expect_eq(bits_of(ptrt_round_bf16(float_of(0x3F808000u))), 0x3F800000u);
    cr_expect_eq(bits_of(ptrt_round_bf16(float_of(0x3F818000u))), 0x3F820000u); /* tie, odd -> up */
    cr_expect_eq(bits_of(ptrt_round_bf16(float_of(0x3F808001u))), 0x3F810000u); /* above the tie */
    cr_expect_eq(bits_of(ptrt_round_bf16(float_of(0x3F807FFFu))), 0x3F800000u); /* below the tie */
    cr_expect_eq(bits_of(ptrt_round_bf16(3.14159265f)), 0x40490000u);           /* pi -> 3.140625 */
    cr_expect_eq(bits_of(ptrt_round_bf16(-3.14159265f)), 0xC0490000u);
    cr_expect_eq(bits_of(ptrt_round_bf16(float_of(0x7F7FFFFFu))), 0x7F800000u); /* FLT_MAX -> inf */
    cr_expect_eq(bits_of(ptrt_round_bf16(float_of(0x7F7F7FFFu))), 0x7F7F0000u); /* bf16 max stays */
    cr_expect_eq(bits_of(ptrt_round_bf16(INFINITY)), 0x7F800000u);
    cr_expect_eq(bits_of(ptrt_round_bf16(-INFINITY)), 0xFF800000u);
    cr_expect_eq(bits_of(ptrt_round_bf16(-0.0f)), 0x80000000u);
    cr_expect_eq(bits_of(ptrt_round_bf16(float_of(0x00018000u))), 0x00020000u); /* subnormal tie */
    cr_expect(isnan(ptrt_round_bf16(NAN)));
    cr_expect(isnan(ptrt_round_bf16(float_of(0x7F800001u)))); /* NaN with a low payload */
}

Test(ref_round, f16_known_values)
{
    cr_expect_eq(ptrt_round_f16(1.0f), 1.0f);
    cr_expect_eq(ptrt_round_f16(65504.0f), 65504.0f); /* the largest f16 */
    cr_expect_eq(ptrt_round_f16(65519.0f), 65504.0f); /* below the halfway point 65520 */
    cr_expect(isinf(ptrt_round_f16(65520.0f)));       /* the tie goes to the even 2^16: inf */
    cr_expect_eq(ptrt_round_f16(-1e6f), -INFINITY);
    cr_expect_eq(ptrt_round_f16(1.00048828125f), 1.0f);         /* 1 + 2^-11: tie, even */
    cr_expect_eq(ptrt_round_f16(1.00146484375f), 1.001953125f); /* 1 + 3*2^-11: tie, odd -> up */
    cr_expect_eq(ptrt_round_f16(3.14159265f), 3.140625f);
    cr_expect_eq(ptrt_round_f16(0x1p-14f), 0x1p-14f);   /* smallest normal */
    cr_expect_eq(ptrt_round_f16(0x1p-24f), 0x1p-24f);   /* smallest subnormal */
    cr_expect_eq(ptrt_round_f16(0x1p-25f), 0.0f);       /* tie between 0 and 2^-24: 0 */
    cr_expect_eq(ptrt_round_f16(0x1.8p-25f), 0x1p-24f); /* 1.5 * 2^-25 -> 2^-24 */
    cr_expect_eq(ptrt_round_f16(0x1.8p-24f), 0x1p-23f); /* 3 * 2^-25: tie, odd -> up */
    cr_expect_eq(ptrt_round_f16(0x1.4p-23f), 0x1p-23f); /* 2.5 * 2^-24: tie, even -> 2 */
    cr_expect_eq(ptrt_round_f16(1e-30f), 0.0f);
    cr_expect_eq(bits_of(ptrt_round_f16(-1e-30f)), 0x80000000u); /* keeps the sign of zero */
    cr_expect(isnan(ptrt_round_f16(NAN)));
    cr_expect_eq(ptrt_round_f16(INFINITY), INFINITY);
}

/* ---- init ---- */

static float *init(ptc_init_kind kind, double a, double b, const char *name, uint64_t seed,
                   int64_t offset, int64_t n)
{
    ptc_init in = {.kind = kind, .a = a, .b = b};
    float *out = malloc((size_t)n * sizeof *out);
    cr_assert(out != NULL);
    ptrt_init_param(&in, name, seed, out, offset, n);
    return out;
}

Test(ref_init, documented_function)
{
    /* From a Python transcription of the comment in init.c (the values rounded to float). */
    float *x = init(PTC_INIT_NORMAL, 1.0, 0, "wte", 0, 0, 4);
    double want0[] = {-0.9282487034797668, -0.36755067110061646, 0.49396970868110657,
                      1.6368508338928223};
    for (int i = 0; i < 4; i++)
        cr_expect(fabs(x[i] - want0[i]) <= 1e-6 * fabs(want0[i]), "wte[%d] = %.9g", i, x[i]);
    free(x);
    x = init(PTC_INIT_NORMAL, 0.02, 0, "h.0.attn.w_qkv", 1234, 0, 4);
    double want1[] = {-0.015044859610497952, -0.010215839371085167, -0.030739927664399147,
                      0.01638505607843399};
    for (int i = 0; i < 4; i++)
        cr_expect(fabs(x[i] - want1[i]) <= 1e-6 * fabs(want1[i]), "w_qkv[%d] = %.9g", i, x[i]);
    free(x);
    x = init(PTC_INIT_UNIFORM, -1.0, 1.0, "w", 7, 0, 4);
    double want2[] = {-0.8127135038375854, 0.9417920112609863, -0.9501127600669861,
                      -0.2067798525094986};
    for (int i = 0; i < 4; i++)
        cr_expect(fabs(x[i] - want2[i]) <= 1e-6 * fabs(want2[i]), "w[%d] = %.9g", i, x[i]);
    free(x);
}

Test(ref_init, same_inputs_same_values)
{
    float *a = init(PTC_INIT_NORMAL, 0.02, 0, "h.3.attn.w_qkv", 42, 0, 1000);
    float *b = init(PTC_INIT_NORMAL, 0.02, 0, "h.3.attn.w_qkv", 42, 0, 1000);
    cr_expect(memcmp(a, b, 1000 * sizeof(float)) == 0);
    free(a);
    free(b);
}

Test(ref_init, names_and_seeds_change_values)
{
    float *a = init(PTC_INIT_NORMAL, 0.02, 0, "h.0.mlp.w_fc", 42, 0, 1000);
    float *b = init(PTC_INIT_NORMAL, 0.02, 0, "h.1.mlp.w_fc", 42, 0, 1000);
    float *c = init(PTC_INIT_NORMAL, 0.02, 0, "h.0.mlp.w_fc", 43, 0, 1000);
    int same_ab = 0, same_ac = 0;
    for (int i = 0; i < 1000; i++) {
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
    }
    cr_expect_eq(same_ab, 0, "%d of 1000 values equal across names", same_ab);
    cr_expect_eq(same_ac, 0, "%d of 1000 values equal across seeds", same_ac);
    free(a);
    free(b);
    free(c);
}

Test(ref_init, sub_range_is_slice_of_full)
{
    ptc_init_kind kinds[] = {PTC_INIT_NORMAL, PTC_INIT_UNIFORM};
    for (int k = 0; k < 2; k++) {
        float *full = init(kinds[k], 0.5, 1.5, "wpe", 9, 0, 4096);
        int64_t offs[] = {0, 1, 337, 2048, 4095}, lens[] = {4096, 100, 1000, 2048, 1};
        for (int j = 0; j < 5; j++) {
            float *part = init(kinds[k], 0.5, 1.5, "wpe", 9, offs[j], lens[j]);
            cr_expect(memcmp(part, full + offs[j], (size_t)lens[j] * sizeof(float)) == 0,
                      "kind %d: offset %lld, %lld values", k, (long long)offs[j],
                      (long long)lens[j]);
            free(part);
        }
        free(full);
    }
}

Test(ref_init, normal_statistics)
{
    int n = 100000;
    float *x = init(PTC_INIT_NORMAL, 0.02, 0, "wte", 1, 0, n);
    double m = 0, v = 0;
    int beyond3 = 0;
    for (int i = 0; i < n; i++)
        m += x[i];
    m /= n;
    for (int i = 0; i < n; i++) {
        v += (x[i] - m) * (x[i] - m);
        beyond3 += fabs(x[i]) > 3 * 0.02;
    }
    double sd = sqrt(v / n);
    /* the mean's standard error is 0.02/sqrt(1e5) = 6.3e-5; 3 sigma from 0 at most */
    cr_expect(fabs(m) < 2e-4, "mean %.6g", m);
    cr_expect(fabs(sd - 0.02) < 0.05 * 0.02, "std %.6g", sd);
    /* P(|z| > 3) = 0.27%: 270 expected */
    cr_expect(beyond3 > 150 && beyond3 < 400, "%d beyond 3 sigma", beyond3);
    free(x);
}

Test(ref_init, uniform_bounds_and_mean)
{
    int n = 100000;
    float *x = init(PTC_INIT_UNIFORM, -0.5, 2.0, "w", 3, 0, n);
    double m = 0, lo = 1e9, hi = -1e9;
    for (int i = 0; i < n; i++) {
        m += x[i];
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    m /= n;
    cr_expect(lo >= -0.5 && hi <= 2.0, "range [%.9g, %.9g]", lo, hi);
    cr_expect(lo < -0.49 && hi > 1.99, "range [%.9g, %.9g] does not fill the interval", lo, hi);
    /* mean 0.75, standard error 2.5/sqrt(12e5) = 0.0023 */
    cr_expect(fabs(m - 0.75) < 0.01, "mean %.6g", m);
    free(x);
}

Test(ref_init, constants)
{
    float *z = init(PTC_INIT_ZEROS, 0, 0, "b", 1, 5, 3);
    float *o = init(PTC_INIT_ONES, 0, 0, "g", 1, 0, 3);
    float *c = init(PTC_INIT_CONSTANT, -0.25, 0, "c", 1, 0, 3);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(z[i], 0.0f);
        cr_expect_eq(o[i], 1.0f);
        cr_expect_eq(c[i], -0.25f);
    }
    free(z);
    free(o);
    free(c);
}
