/* test_ref_props.c - properties the reference kernels must have on pseudo-random data: softmax
 * lines sum to one, log_softmax = log(softmax), split then concat and permute then its inverse are
 * the identity, rope keeps each pair's norm, layernorm output is standardised, broadcasting is
 * symmetric, and the bf16/f16 rounding agrees with independent implementations.
 */
#include "ref_test.h"

static float *rand_floats(int64_t n, uint32_t seed, float lo, float hi)
{
    float *p = malloc((size_t)n * sizeof *p);
    cr_assert(p != NULL);
    rt_fill(p, n, seed, lo, hi);
    return p;
}

Test(ref_props, softmax_lines_sum_to_one_on_every_axis)
{
    ptc_type t = TY(PTC_F32, 3, 5, 7);
    float *x = rand_floats(105, 1, -20, 20);
    for (int axis = 0; axis < 3; axis++) {
        ptc_attrs at = ptc_attrs_default(PTC_OP_SOFTMAX);
        at.axis = axis;
        rt_result r = rt_ok(PTC_OP_SOFTMAX, at, 1, (ptc_type[]){t}, (void *[]){x});
        const float *o = r.out[0];
        int64_t stride = axis == 0 ? 35 : axis == 1 ? 7 : 1, n = t.dims[axis];
        for (int64_t i = 0; i < 105; i++) {
            /* i is the start of a line when its coordinate along axis is 0 */
            if ((i / stride) % n != 0)
                continue;
            double s = 0;
            for (int64_t j = 0; j < n; j++) {
                cr_expect(o[i + j * stride] >= 0 && o[i + j * stride] <= 1);
                s += o[i + j * stride];
            }
            cr_expect(fabs(s - 1) < 1e-6, "axis %d line at %lld sums to %.9g", axis, (long long)i,
                      s);
        }
        rt_free(&r);
    }
    free(x);
}

Test(ref_props, log_softmax_is_log_of_softmax)
{
    ptc_type t = TY(PTC_F32, 4, 9);
    float *x = rand_floats(36, 2, -5, 5);
    for (int axis = 0; axis < 2; axis++) {
        ptc_attrs at = ptc_attrs_default(PTC_OP_SOFTMAX);
        at.axis = axis;
        rt_result s = rt_ok(PTC_OP_SOFTMAX, at, 1, (ptc_type[]){t}, (void *[]){x});
        rt_result l = rt_ok(PTC_OP_LOG_SOFTMAX, at, 1, (ptc_type[]){t}, (void *[]){x});
        const float *so = s.out[0], *lo = l.out[0];
        for (int i = 0; i < 36; i++)
            cr_expect(fabs(log(so[i]) - lo[i]) < 1e-5, "axis %d element %d: log %.9g vs %.9g", axis,
                      i, log(so[i]), lo[i]);
        rt_free(&s);
        rt_free(&l);
    }
    free(x);
}

Test(ref_props, split_then_concat_is_identity)
{
    ptc_type t = TY(PTC_F32, 2, 6, 4);
    float *x = rand_floats(48, 3, -1, 1);
    int64_t ns[] = {1, 2, 3, 6};
    for (int axis = 0; axis < 3; axis++)
        for (int k = 0; k < 4; k++) {
            if (t.dims[axis] % ns[k])
                continue;
            ptc_attrs sa = ptc_attrs_default(PTC_OP_SPLIT);
            sa.axis = axis;
            sa.n = ns[k];
            rt_result parts = rt_ok(PTC_OP_SPLIT, sa, 1, (ptc_type[]){t}, (void *[]){x});
            cr_assert_eq(parts.nout, ns[k]);
            ptc_attrs ca = ptc_attrs_default(PTC_OP_CONCAT);
            ca.axis = axis;
            rt_result whole = rt_ok(PTC_OP_CONCAT, ca, parts.nout, parts.ot, parts.out);
            rt_expect_type(&whole.ot[0], t);
            cr_expect(memcmp(whole.out[0], x, sizeof(float) * 48) == 0,
                      "split %lld along axis %d then concat differs", (long long)ns[k], axis);
            rt_free(&whole);
            rt_free(&parts);
        }
    free(x);
}

/* The permutation number k of 0..3 (Lehmer code), so the test walks all 24. */
static void nth_permutation(int k, int64_t *p)
{
    int64_t pool[4] = {0, 1, 2, 3};
    int left = 4;
    for (int i = 0; i < 4; i++) {
        int f = 1;
        for (int j = 2; j < left; j++)
            f *= j;
        int pick = k / f;
        k %= f;
        p[i] = pool[pick];
        for (int j = pick; j + 1 < left; j++)
            pool[j] = pool[j + 1];
        left--;
    }
}

Test(ref_props, permute_then_inverse_is_identity)
{
    ptc_type t = TY(PTC_F32, 2, 3, 4, 5);
    float *x = rand_floats(120, 4, -1, 1);
    for (int k = 0; k < 24; k++) {
        ptc_attrs pa = ptc_attrs_default(PTC_OP_PERMUTE), ia = pa;
        pa.nshape = ia.nshape = 4;
        nth_permutation(k, pa.shape);
        for (int i = 0; i < 4; i++)
            ia.shape[pa.shape[i]] = i; /* result dim i came from dim p[i]: it goes back there */
        rt_result p = rt_ok(PTC_OP_PERMUTE, pa, 1, (ptc_type[]){t}, (void *[]){x});
        for (int i = 0; i < 4; i++)
            cr_expect_eq(p.ot[0].dims[i], t.dims[pa.shape[i]]);
        rt_result back = rt_ok(PTC_OP_PERMUTE, ia, 1, p.ot, p.out);
        rt_expect_type(&back.ot[0], t);
        cr_expect(memcmp(back.out[0], x, sizeof(float) * 120) == 0, "permutation %d", k);
        rt_free(&back);
        rt_free(&p);
    }
    free(x);
}

Test(ref_props, transpose_twice_is_identity_and_matches_permute)
{
    ptc_type t = TY(PTC_F32, 3, 4, 5);
    float *x = rand_floats(60, 5, -1, 1);
    rt_result once = rt_ok(PTC_OP_TRANSPOSE, ptc_attrs_default(PTC_OP_TRANSPOSE), 1,
                           (ptc_type[]){t}, (void *[]){x});
    rt_result twice =
        rt_ok(PTC_OP_TRANSPOSE, ptc_attrs_default(PTC_OP_TRANSPOSE), 1, once.ot, once.out);
    cr_expect(memcmp(twice.out[0], x, sizeof(float) * 60) == 0);
    ptc_attrs pa = ptc_attrs_default(PTC_OP_PERMUTE);
    pa.nshape = 3;
    pa.shape[0] = 0;
    pa.shape[1] = 2;
    pa.shape[2] = 1;
    rt_result perm = rt_ok(PTC_OP_PERMUTE, pa, 1, (ptc_type[]){t}, (void *[]){x});
    cr_expect(memcmp(perm.out[0], once.out[0], sizeof(float) * 60) == 0);
    rt_free(&perm);
    rt_free(&twice);
    rt_free(&once);
    free(x);
}

Test(ref_props, rope_preserves_pair_norms)
{
    ptc_type t = TY(PTC_F32, 2, 7, 12); /* 3 heads of 4 */
    float *x = rand_floats(168, 6, -3, 3);
    ptc_attrs at = ptc_attrs_default(PTC_OP_ROPE);
    at.heads = 3;
    rt_result r = rt_ok(PTC_OP_ROPE, at, 1, (ptc_type[]){t}, (void *[]){x});
    const float *o = r.out[0];
    for (int i = 0; i < 168; i += 2) {
        double before = hypot(x[i], x[i + 1]), after = hypot(o[i], o[i + 1]);
        cr_expect(fabs(before - after) < 1e-5 * (1 + before), "pair %d: %.9g -> %.9g", i / 2,
                  before, after);
    }
    /* position 0 (every batch) is left alone */
    for (int b = 0; b < 2; b++)
        cr_expect(memcmp(o + b * 84, x + b * 84, sizeof(float) * 12) == 0);
    rt_free(&r);
    free(x);
}

Test(ref_props, layernorm_standardises)
{
    ptc_type t = TY(PTC_F32, 5, 16);
    float *x = rand_floats(80, 7, -10, 30), g[16], b[16];
    for (int i = 0; i < 16; i++) {
        g[i] = 1;
        b[i] = 0;
    }
    ptc_attrs at = ptc_attrs_default(PTC_OP_LAYERNORM);
    at.eps = 0;
    rt_result r = rt_ok(PTC_OP_LAYERNORM, at, 3, (ptc_type[]){t, TY(PTC_F32, 16), TY(PTC_F32, 16)},
                        (void *[]){x, g, b});
    const float *o = r.out[0];
    for (int row = 0; row < 5; row++) {
        double m = 0, v = 0;
        for (int i = 0; i < 16; i++)
            m += o[row * 16 + i];
        m /= 16;
        for (int i = 0; i < 16; i++)
            v += (o[row * 16 + i] - m) * (o[row * 16 + i] - m);
        v /= 16;
        cr_expect(fabs(m) < 1e-6 && fabs(v - 1) < 1e-5, "row %d: mean %.9g var %.9g", row, m, v);
    }
    rt_free(&r);
    free(x);
}

Test(ref_props, broadcasting_is_symmetric)
{
    float *a = rand_floats(6, 8, -2, 2), *b = rand_floats(4, 9, -2, 2);
    ptc_type ta = TY(PTC_F32, 2, 1, 3), tb = TY(PTC_F32, 4, 1);
    ptc_op ops[] = {PTC_OP_ADD, PTC_OP_MUL};
    for (int k = 0; k < 2; k++) {
        rt_result ab =
            rt_ok(ops[k], ptc_attrs_default(ops[k]), 2, (ptc_type[]){ta, tb}, (void *[]){a, b});
        rt_result ba =
            rt_ok(ops[k], ptc_attrs_default(ops[k]), 2, (ptc_type[]){tb, ta}, (void *[]){b, a});
        rt_expect_type(&ba.ot[0], ab.ot[0]);
        cr_expect(memcmp(ab.out[0], ba.out[0], sizeof(float) * 24) == 0, "%s",
                  ptc_ops[ops[k]].name);
        rt_free(&ab);
        rt_free(&ba);
    }
    free(a);
    free(b);
}

Test(ref_props, matmul_broadcast_equals_explicit_batches)
{
    /* [2,1,3,4] @ [5,4,2] must equal, for each (i, j), the plain [3,4] @ [4,2] of A_i and B_j */
    float *a = rand_floats(24, 10, -1, 1), *b = rand_floats(40, 11, -1, 1);
    rt_result r =
        rt_ok(PTC_OP_MATMUL, ptc_attrs_default(PTC_OP_MATMUL), 2,
              (ptc_type[]){TY(PTC_F32, 2, 1, 3, 4), TY(PTC_F32, 5, 4, 2)}, (void *[]){a, b});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 5, 3, 2));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++) {
            rt_result one = rt_ok(PTC_OP_MATMUL, ptc_attrs_default(PTC_OP_MATMUL), 2,
                                  (ptc_type[]){TY(PTC_F32, 3, 4), TY(PTC_F32, 4, 2)},
                                  (void *[]){a + i * 12, b + j * 8});
            cr_expect(memcmp((float *)r.out[0] + (i * 5 + j) * 6, one.out[0], 6 * sizeof(float)) ==
                          0,
                      "batch (%d, %d)", i, j);
            rt_free(&one);
        }
    rt_free(&r);
    free(a);
    free(b);
}

/* ---- rounding against independent implementations ---- */

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

/* The usual bit trick for bf16 (round to nearest even on the top 16 bits), for non-NaN inputs. */
static float bf16_bit_trick(float x)
{
    uint32_t u = bits_of(x);
    u += 0x7FFF + ((u >> 16) & 1);
    return float_of(u & 0xFFFF0000u);
}

Test(ref_props, bf16_rounding_matches_bit_trick)
{
    uint32_t s = 12345;
    for (int i = 0; i < 1000000; i++) {
        s = s * 1664525u + 1013904223u;
        float x = float_of(s);
        if (isnan(x))
            continue;
        float got = ptrt_round_bf16(x), want = bf16_bit_trick(x);
        if (bits_of(got) != bits_of(want)) {
            cr_expect(false, "bf16(%a): got %a, want %a", (double)x, (double)got, (double)want);
            break;
        }
    }
    cr_expect(isnan(ptrt_round_bf16(NAN)));
    cr_expect(isnan(ptrt_round_bf16(float_of(0x7F800001u)))); /* a NaN the bit trick makes inf */
}

#ifdef __FLT16_MAX__
/* The compiler's _Float16 conversion (libgcc rounds to nearest even) as the second opinion. */
Test(ref_props, f16_rounding_matches_compiler)
{
    uint32_t s = 777;
    for (int i = 0; i < 1000000; i++) {
        s = s * 1664525u + 1013904223u;
        /* bias toward the f16 range: exponents 2^-30 .. 2^17 */
        uint32_t u = (s & 0x807FFFFFu) | ((97u + (s >> 23) % 48u) << 23);
        float x = float_of(u);
        __extension__ _Float16 h = (_Float16)x;
        float got = ptrt_round_f16(x), want = (float)h;
        if (bits_of(got) != bits_of(want)) {
            cr_expect(false, "f16(%a): got %a, want %a", (double)x, (double)got, (double)want);
            break;
        }
    }
}
#endif

Test(ref_props, rounding_is_idempotent)
{
    float *x = rand_floats(10000, 12, -70000, 70000);
    int bad = 0;
    for (int i = 0; i < 10000; i++) {
        float b = ptrt_round_bf16(x[i]), h = ptrt_round_f16(x[i]);
        bad +=
            bits_of(ptrt_round_bf16(b)) != bits_of(b) || bits_of(ptrt_round_f16(h)) != bits_of(h);
    }
    cr_expect_eq(bad, 0, "%d values change when rounded twice", bad);
    free(x);
}

/* C = alpha op(A) op(B) + beta C by its definition: each element's products summed over p = 0,
 * 1, ..., k - 1 in order, in double, rounded once (the reference GEMM promises these bits) */
static double def_at(const void *x, uint8_t dt, int64_t i)
{
    return dt == PTC_BF16  ? ptc_bf16_value(((const uint16_t *)x)[i])
           : dt == PTC_F16 ? ptc_f16_value(((const uint16_t *)x)[i])
                           : ((const float *)x)[i];
}

static void gemm_by_definition(const ptc_gemm *g, const void *a, const void *b, void *c)
{
    for (int64_t bi = 0; bi < g->batch; bi++)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++) {
                double s = 0;
                for (int64_t p = 0; p < g->k; p++)
                    s += def_at(a, g->ab, bi * g->sa + (g->ta ? p * g->lda + i : i * g->lda + p)) *
                         def_at(b, g->ab, bi * g->sb + (g->tb ? j * g->ldb + p : p * g->ldb + j));
                int64_t at = bi * g->sc + i * g->ldc + j;
                if (g->cd == PTC_F32) {
                    float *pc = (float *)c + at;
                    *pc = (float)(g->alpha * s + (g->beta != 0 ? g->beta * *pc : 0));
                } else {
                    float v = (float)(g->alpha * s);
                    ((uint16_t *)c)[at] = g->cd == PTC_BF16 ? ptc_bf16_bits(v) : ptc_f16_bits(v);
                }
            }
}

/* ptrt_ref_gemm's blocks (4 rows by 8 columns, panels of 256 columns, copies of transposed and
 * 16-bit operands) give the definition's bits: every transpose, row and column counts around the
 * block sizes (1, 3, 4, 5; 7, 8, 9, 300 across two panels), k from 0 to 33, 16-bit operands and
 * results, alpha and beta, a batch whose A is one matrix for all (sa = 0) */
Test(ref_props, gemm_gives_the_bits_of_its_definition)
{
    const int64_t ms[] = {1, 3, 4, 5, 9}, ns[] = {1, 7, 8, 9, 300}, ks[] = {0, 1, 5, 33};
    const uint8_t dts[][2] = {{PTC_F32, PTC_F32}, {PTC_BF16, PTC_F32}, {PTC_F16, PTC_BF16}};
    int cases = 0;
    for (int t = 0; t < 4; t++)
        for (int d = 0; d < 3; d++)
            for (size_t mi = 0; mi < 5; mi++)
                for (size_t ni = 0; ni < 5; ni++)
                    for (size_t ki = 0; ki < 4; ki++) {
                        int64_t m = ms[mi], n = ns[ni], k = ks[ki], batch = 2;
                        bool ta = t & 1, tb = t >> 1, f32c = dts[d][1] == PTC_F32;
                        ptc_gemm g = {.ta = ta, .tb = tb, .ab = dts[d][0], .cd = dts[d][1],
                                      .m = m, .n = n, .k = k, .batch = batch,
                                      .lda = (ta ? m : k) + 1, .ldb = (tb ? k : n) + 2,
                                      .ldc = n + 3,
                                      .alpha = f32c ? 0.75 : 1.0, .beta = f32c ? -0.5 : 0.0};
                        g.sa = 0; /* (one A for the whole batch) */
                        g.sb = (tb ? n : k) * g.ldb;
                        g.sc = m * g.ldc;
                        int64_t na = (ta ? k : m) * g.lda + 1, nb = batch * g.sb + 1;
                        int64_t nc = batch * g.sc;
                        size_t es = dts[d][0] == PTC_F32 ? 4 : 2, cs = f32c ? 4 : 2;
                        float *fa = rand_floats(na, 11 + (uint32_t)cases, -2, 2);
                        float *fb = rand_floats(nb, 12 + (uint32_t)cases, -2, 2);
                        float *c0 = rand_floats(nc, 13 + (uint32_t)cases, -2, 2);
                        void *a = malloc((size_t)na * es), *b = malloc((size_t)nb * es);
                        for (int64_t i = 0; i < na; i++)
                            es == 4 ? (void)(((float *)a)[i] = fa[i])
                                    : (void)(((uint16_t *)a)[i] = dts[d][0] == PTC_BF16
                                                                      ? ptc_bf16_bits(fa[i])
                                                                      : ptc_f16_bits(fa[i]));
                        for (int64_t i = 0; i < nb; i++)
                            es == 4 ? (void)(((float *)b)[i] = fb[i])
                                    : (void)(((uint16_t *)b)[i] = dts[d][0] == PTC_BF16
                                                                      ? ptc_bf16_bits(fb[i])
                                                                      : ptc_f16_bits(fb[i]));
                        void *want = malloc((size_t)nc * cs), *got = malloc((size_t)nc * cs);
                        if (f32c) {
                            memcpy(want, c0, (size_t)nc * 4);
                            memcpy(got, c0, (size_t)nc * 4);
                        } else {
                            memset(want, 0x5a, (size_t)nc * 2);
                            memset(got, 0x5a, (size_t)nc * 2);
                        }
                        gemm_by_definition(&g, a, b, want);
                        ptrt_ref_gemm(&g, a, b, got);
                        cr_expect(memcmp(want, got, (size_t)nc * cs) == 0,
                                  "ta %d tb %d dtypes %d/%d m %lld n %lld k %lld: not the "
                                  "definition's bits", ta, tb, dts[d][0], dts[d][1], (long long)m,
                                  (long long)n, (long long)k);
                        free(fa), free(fb), free(c0), free(a), free(b), free(want), free(got);
                        cases++;
                    }
    cr_expect_eq(cases, 4 * 3 * 5 * 5 * 4);
}
