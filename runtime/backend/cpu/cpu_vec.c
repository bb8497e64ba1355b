/* cpu_vec.c - float vector math for the fast CPU kernels: exp (with the sum softmax needs), max,
 * GELU and SiLU with their derivatives.
 *
 * libm's expf and tanhf are scalar calls; a training step takes hundreds of millions of them
 * (softmax, cross-entropy, GELU), so they are computed here from one polynomial: exp(x) =
 * 2^n exp(r) with n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, so r is exact) and
 * exp(r) by Cephes' polynomial, within 2 ulp of exp for x <= 88 (the kernels only take exp of
 * values <= 0). GELU's tanh and the sigmoid come from exp(-|u|), which never overflows, in forms
 * that do not cancel (1 + tanh u and 1 - tanh^2 u directly from it).
 *
 * Each function has a portable C path and, on x86-64 CPUs that have them, an AVX2+FMA path chosen
 * once at run time. The two paths evaluate the same formulas (FMA rounds once where the portable
 * path rounds twice), so results may differ in the last bit between machines, never between runs.
 * Tails shorter than a vector go through the vector path too, padded, so an element's result does
 * not depend on where it sits in the array.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PTRT_X86 1
#include <immintrin.h>
#endif

#define EXP_HI 88.0f /* exp(EXP_HI) < FLT_MAX with n = 127; above, the result saturates there */
#define EXP_LO -87.3365447505531f /* below, exp would be subnormal: it is taken as exp(EXP_LO) */
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f
#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K 0.044715f

static bool force_portable;

void ptrt_cpu_vec_force_portable(bool on)
{
    force_portable = on;
}

/* ---- portable ---- */

static float exp_portable(float x)
{
    if (isnan(x))
        return x;
    x = x > EXP_HI ? EXP_HI : x < EXP_LO ? EXP_LO : x;
    float n = floorf(x * LOG2E + 0.5f);
    float r = x - n * LN2_HI;
    r = r - n * LN2_LO;
    float p = P0;
    p = p * r + P1;
    p = p * r + P2;
    p = p * r + P3;
    p = p * r + P4;
    p = p * r + P5;
    p = p * (r * r) + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* sigmoid(x) and 1 - sigmoid(x) = sigmoid(-x), both from e = exp(-|x|) without cancellation. */
static float sigmoid_portable(float x, float *one_minus)
{
    float e = exp_portable(-fabsf(x)), r = 1.0f / (1.0f + e);
    if (one_minus)
        *one_minus = x >= 0 ? e * r : r;
    return x >= 0 ? r : e * r;
}

/* GELU's tanh(u), u = c (x + k x^3), from e = exp(-2|u|) without cancellation: with r = 1/(1+e),
 * (1 + tanh u) / 2 = r for u >= 0 and e r below (u has x's sign), and 1 - tanh^2 u = 4 e r^2. */
static float gelu_half_portable(float x, float *sech2)
{
    float e = exp_portable(-2.0f * fabsf(GELU_C * (x + GELU_K * x * x * x)));
    float r = 1.0f / (1.0f + e);
    if (sech2)
        *sech2 = 4.0f * e * r * r;
    return x < 0 ? e * r : r;
}

static float gelu_portable(float x)
{
    return x * gelu_half_portable(x, NULL);
}

static float gelu_deriv_portable(float x)
{
    float sech2, h = gelu_half_portable(x, &sech2);
    return h + 0.5f * x * sech2 * GELU_C * (1.0f + 3.0f * GELU_K * x * x);
}

/* Elements [lo, hi) of the AdamW update, in the reference's order of operations. */
static void adam_tail(const ptrt_cpu_adam *a, const float *p, const float *g, const float *m,
                      const float *v, float *po, float *mo, float *vo, int64_t lo, int64_t hi)
{
    for (int64_t i = lo; i < hi; i++) {
        double pi = p[i] * a->decay;
        double mi = a->b1 * m[i] + a->c1 * g[i];
        double vi = a->b2 * v[i] + a->c2 * (double)g[i] * g[i];
        double denom = sqrt(vi) / a->bc2_sqrt + a->eps;
        po[i] = (float)(pi - a->step_size * mi / denom);
        mo[i] = (float)mi;
        vo[i] = (float)vi;
    }
}

/* ---- AVX2 + FMA ---- */

#ifdef PTRT_X86
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static __m256 exp8(__m256 x)
{
    /* min/max return their second operand when one is NaN: written so that NaN passes */
    x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), _mm256_min_ps(_mm256_set1_ps(EXP_HI), x));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

AVX2 static __m256 sigmoid8(__m256 x, __m256 *one_minus)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 e = exp8(_mm256_or_ps(x, sign)); /* exp(-|x|) */
    __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e)), er = _mm256_mul_ps(e, r);
    __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    if (one_minus)
        *one_minus = _mm256_blendv_ps(er, r, neg);
    return _mm256_blendv_ps(r, er, neg);
}

/* (1 + tanh u) / 2 of GELU and 1 - tanh^2 u, as gelu_half_portable computes them. */
AVX2 static __m256 gelu_half8(__m256 x, __m256 *sech2)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u =
        _mm256_mul_ps(_mm256_set1_ps(GELU_C), _mm256_fmadd_ps(_mm256_set1_ps(GELU_K), x3, x));
    __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, u)));
    __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
    if (sech2)
        *sech2 = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(4.0f), e), _mm256_mul_ps(r, r));
    __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(r, _mm256_mul_ps(e, r), neg);
}

/* Loads up to 8 floats (the rest padded with pad), so tails run through the vector path. */
AVX2 static __m256 load_part(const float *x, int64_t n, float pad)
{
    if (n >= 8)
        return _mm256_loadu_ps(x);
    float buf[8];
    for (int i = 0; i < 8; i++)
        buf[i] = i < n ? x[i] : pad;
    return _mm256_loadu_ps(buf);
}

AVX2 static void store_part(float *o, __m256 v, int64_t n)
{
    if (n >= 8) {
        _mm256_storeu_ps(o, v);
        return;
    }
    float buf[8];
    _mm256_storeu_ps(buf, v);
    memcpy(o, buf, (size_t)n * sizeof *o);
}

AVX2 static float hsum8(__m256 v)
{
    float b[8];
    _mm256_storeu_ps(b, v);
    return ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
}

/* acc + exp(x[i] - sub) for i from `from` to n, 8 at a time (the AVX-512 loop's tail too) */
AVX2 static __m256 exp_sum_from(const float *x, float sub, float *o, int64_t from, int64_t n,
                                __m256 acc)
{
    __m256 s = _mm256_set1_ps(sub);
    for (int64_t i = from; i < n; i += 8) {
        int64_t left = n - i;
        __m256 e = exp8(_mm256_sub_ps(load_part(x + i, left, 0), s));
        if (left < 8) /* padding must not count */
            e = _mm256_and_ps(
                e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                       _mm256_set1_epi32((int)left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
        acc = _mm256_add_ps(acc, e);
        if (o)
            store_part(o + i, e, left);
    }
    return acc;
}

AVX2 static float exp_sum_avx2(const float *x, float sub, float *o, int64_t n)
{
    return hsum8(exp_sum_from(x, sub, o, 0, n, _mm256_setzero_ps()));
}

AVX2 static float max_avx2(const float *x, int64_t n)
{
    __m256 m = _mm256_set1_ps(x[0]);
    for (int64_t i = 0; i < n; i += 8)
        m = _mm256_max_ps(load_part(x + i, n - i, x[0]), m);
    float b[8];
    _mm256_storeu_ps(b, m);
    float r = b[0];
    for (int i = 1; i < 8; i++)
        r = b[i] > r ? b[i] : r;
    return r;
}

/* ---- AVX-512: exp and max of the softmax rows (attention, softmax, cross-entropy) ----
 * exp16 is exp8 on 16 lanes, operation for operation, and exp_sum_avx512 adds each 16 into the
 * same 8 running sums in the same order as exp_sum_avx2 adds two 8s, so both give the same bits;
 * the maximum is exact in any order (and passes over a NaN as max_avx2 does). */
#define AVX512 __attribute__((target("avx512f,avx2,fma")))

AVX512 static __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(EXP_LO), _mm512_min_ps(_mm512_set1_ps(EXP_HI), x));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_set1_ps(P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i bits =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

AVX512 static float exp_sum_avx512(const float *x, float sub, float *o, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    __m512 s = _mm512_set1_ps(sub);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
        acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
        if (o)
            _mm512_storeu_ps(o + i, e);
    }
    return hsum8(exp_sum_from(x, sub, o, i, n, acc));
}

AVX512 static float max_avx512(const float *x, int64_t n)
{
    __m512 m = _mm512_set1_ps(x[0]);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        m = _mm512_max_ps(_mm512_loadu_ps(x + i), m);
    for (; i < n; i++) /* (as max_avx2: an element joins unless it is a NaN) */
        m = _mm512_max_ps(_mm512_set1_ps(x[i]), m);
    float b[16];
    _mm512_storeu_ps(b, m);
    float r = b[0];
    for (int k = 1; k < 16; k++)
        r = b[k] > r ? b[k] : r;
    return r;
}

AVX2 static void gelu_avx2(const float *x, float *o, int64_t n)
{
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = load_part(x + i, n - i, 0);
        store_part(o + i, _mm256_mul_ps(v, gelu_half8(v, NULL)), n - i);
    }
}

AVX2 static void gelu_grad_avx2(const float *x, const float *dy, float *o, int64_t n)
{
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 c = _mm256_set1_ps(GELU_C), k3 = _mm256_set1_ps(3.0f * GELU_K);
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = load_part(x + i, n - i, 0), g = load_part(dy + i, n - i, 0), sech2;
        __m256 h = gelu_half8(v, &sech2);
        __m256 inner = _mm256_mul_ps(c, _mm256_fmadd_ps(k3, _mm256_mul_ps(v, v), one));
        __m256 d = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(half, v), sech2), inner, h);
        store_part(o + i, _mm256_mul_ps(g, d), n - i);
    }
}

AVX2 static void silu_avx2(const float *x, float *o, int64_t n)
{
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = load_part(x + i, n - i, 0);
        store_part(o + i, _mm256_mul_ps(v, sigmoid8(v, NULL)), n - i);
    }
}

AVX2 static void silu_grad_avx2(const float *x, const float *dy, float *o, int64_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = load_part(x + i, n - i, 0), g = load_part(dy + i, n - i, 0);
        __m256 oms, s = sigmoid8(v, &oms);
        __m256 d = _mm256_mul_ps(s, _mm256_fmadd_ps(v, oms, one));
        store_part(o + i, _mm256_mul_ps(g, d), n - i);
    }
}

/* o (8 rows, stride ldo) = the 8x8 block of x (stride ldx) transposed, in registers. */
AVX2 static void transpose8x8(const float *x, int64_t ldx, float *o, int64_t ldo)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(x + i * ldx);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(o + i * ldo, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(o + (i + 4) * ldo, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

AVX2 static void transpose_avx2(const float *x, int64_t ldx, float *o, int64_t ldo, int64_t rows,
                                int64_t cols)
{
    int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
    for (int64_t i = 0; i < r8; i += 8)
        for (int64_t k = 0; k < c8; k += 8)
            transpose8x8(x + i * ldx + k, ldx, o + k * ldo + i, ldo);
    for (int64_t i = 0; i < rows; i++) /* the edges */
        for (int64_t k = i < r8 ? c8 : 0; k < cols; k++)
            memcpy(o + k * ldo + i, x + i * ldx + k, sizeof *o);
}

AVX2 static void adamw_avx2(const ptrt_cpu_adam *a, const float *p, const float *g, const float *m,
                            const float *v, float *po, float *mo, float *vo, int64_t n)
{
    const __m256d decay = _mm256_set1_pd(a->decay), b1 = _mm256_set1_pd(a->b1);
    const __m256d b2 = _mm256_set1_pd(a->b2), c1 = _mm256_set1_pd(a->c1);
    const __m256d c2 = _mm256_set1_pd(a->c2), step = _mm256_set1_pd(a->step_size);
    const __m256d bc2 = _mm256_set1_pd(a->bc2_sqrt), eps = _mm256_set1_pd(a->eps);
    int64_t n4 = n / 4 * 4;
    for (int64_t i = 0; i < n4; i += 4) {
        __m256d gi = _mm256_cvtps_pd(_mm_loadu_ps(g + i));
        __m256d pi = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(p + i)), decay);
        __m256d mi = _mm256_add_pd(_mm256_mul_pd(b1, _mm256_cvtps_pd(_mm_loadu_ps(m + i))),
                                   _mm256_mul_pd(c1, gi));
        __m256d vi = _mm256_add_pd(_mm256_mul_pd(b2, _mm256_cvtps_pd(_mm_loadu_ps(v + i))),
                                   _mm256_mul_pd(_mm256_mul_pd(c2, gi), gi));
        __m256d denom = _mm256_add_pd(_mm256_div_pd(_mm256_sqrt_pd(vi), bc2), eps);
        __m256d upd = _mm256_div_pd(_mm256_mul_pd(step, mi), denom);
        _mm_storeu_ps(po + i, _mm256_cvtpd_ps(_mm256_sub_pd(pi, upd)));
        _mm_storeu_ps(mo + i, _mm256_cvtpd_ps(mi));
        _mm_storeu_ps(vo + i, _mm256_cvtpd_ps(vi));
    }
    adam_tail(a, p, g, m, v, po, mo, vo, n4, n);
}

/* what the CPU has, -1 until a call first looks: any pool thread may be first, so relaxed
 * atomics (each thread that looks finds the same answer; ThreadSanitizer saw the plain ints) */
static atomic_int have_avx2 = -1, have_avx512 = -1;
static bool no_avx512;
#endif

void ptrt_cpu_vec_no_avx512(bool on)
{
#ifdef PTRT_X86
    no_avx512 = on;
#else
    (void)on;
#endif
}

#ifdef PTRT_X86
/* the AVX-512 paths: AVX-512F on top of AVX2 and FMA, unless forced off */
static bool vec_avx512(void)
{
    int have = atomic_load_explicit(&have_avx512, memory_order_relaxed);
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f");
        atomic_store_explicit(&have_avx512, have, memory_order_relaxed);
    }
    return have && !no_avx512 && ptrt_cpu_vec_avx2();
}
#endif

bool ptrt_cpu_vec_avx2(void)
{
#ifdef PTRT_X86
    int have = atomic_load_explicit(&have_avx2, memory_order_relaxed);
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        atomic_store_explicit(&have_avx2, have, memory_order_relaxed);
    }
    return have && !force_portable;
#else
    return false;
#endif
}

/* ---- the array functions ---- */

float ptrt_cpu_exp_sum(const float *x, float sub, float *o, int64_t n)
{
#ifdef PTRT_X86
    if (vec_avx512())
        return exp_sum_avx512(x, sub, o, n);
    if (ptrt_cpu_vec_avx2())
        return exp_sum_avx2(x, sub, o, n);
#endif
    float acc[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        float e = exp_portable(x[i] - sub);
        acc[i % 8] += e;
        if (o)
            o[i] = e;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

float ptrt_cpu_max(const float *x, int64_t n)
{
#ifdef PTRT_X86
    if (vec_avx512())
        return max_avx512(x, n);
    if (ptrt_cpu_vec_avx2())
        return max_avx2(x, n);
#endif
    float m = x[0];
    for (int64_t i = 1; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

void ptrt_cpu_gelu(const float *x, float *o, int64_t n)
{
#ifdef PTRT_X86
    if (ptrt_cpu_vec_avx2()) {
        gelu_avx2(x, o, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        o[i] = gelu_portable(x[i]);
}

void ptrt_cpu_gelu_grad(const float *x, const float *dy, float *o, int64_t n)
{
#ifdef PTRT_X86
    if (ptrt_cpu_vec_avx2()) {
        gelu_grad_avx2(x, dy, o, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        o[i] = dy[i] * gelu_deriv_portable(x[i]);
}

void ptrt_cpu_silu(const float *x, float *o, int64_t n)
{
#ifdef PTRT_X86
    if (ptrt_cpu_vec_avx2()) {
        silu_avx2(x, o, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        o[i] = x[i] * sigmoid_portable(x[i], NULL);
}

void ptrt_cpu_silu_grad(const float *x, const float *dy, float *o, int64_t n)
{
#ifdef PTRT_X86
    if (ptrt_cpu_vec_avx2()) {
        silu_grad_avx2(x, dy, o, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        float oms, s = sigmoid_portable(x[i], &oms);
        o[i] = dy[i] * (s * (1.0f + x[i] * oms));
    }
}

void ptrt_cpu_transpose_block(const float *x, int64_t ldx, float *o, int64_t ldo, int64_t rows,
                              int64_t cols)
{
#ifdef PTRT_X86
    if (ptrt_cpu_vec_avx2()) {
        transpose_avx2(x, ldx, o, ldo, rows, cols);
        return;
    }
#endif
    for (int64_t k = 0; k < cols; k++) /* writes in order; the block's rows stay in cache */
        for (int64_t i = 0; i < rows; i++)
            memcpy(o + k * ldo + i, x + i * ldx + k, sizeof *o); /* the bits, whatever the dtype */
}

void ptrt_cpu_transpose_tiled(const float *x, int64_t ldx, float *o, int64_t ldo, int64_t rows,
                              int64_t cols)
{
    for (int64_t r = 0; r < rows; r += 64)
        for (int64_t c = 0; c < cols; c += 64)
            ptrt_cpu_transpose_block(x + r * ldx + c, ldx, o + c * ldo + r, ldo,
                                     rows - r < 64 ? rows - r : 64, cols - c < 64 ? cols - c : 64);
}

void ptrt_cpu_adamw_span(const ptrt_cpu_adam *a, const float *p, const float *g, const float *m,
                         const float *v, float *po, float *mo, float *vo, int64_t n)
{
#ifdef PTRT_X86
    if (ptrt_cpu_vec_avx2()) {
        adamw_avx2(a, p, g, m, v, po, mo, vo, n);
        return;
    }
#endif
    adam_tail(a, p, g, m, v, po, mo, vo, 0, n);
}
