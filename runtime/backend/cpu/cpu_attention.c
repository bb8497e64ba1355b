/* cpu_attention.c - fast CPU kernels for attention (forward and backward) and rope.
 *
 * Attention runs per (batch, head) on blocks of 64 query rows: the scores of a block against the
 * keys it can see, a float softmax per row, and the product with the values; the backward
 * recomputes the weights the same way (as the reference does) and takes dV, dP, dS, dQ and dK per
 * block. The products are small (64 rows, head-dim and key-count wide), too small for a library
 * GEMM's packing and dispatch to pay off, so they run on one register-blocked kernel here
 * (mk_gemm, cpu_attention_mk.h: 6 rows by up to 64 columns of C held in vector registers, a row
 * of B loaded per step of the sum, the A element broadcast; a copy per vector width, the CPU's
 * widest chosen once), with the keys and values of a (batch, kv head) packed
 * transposed once (kt, vt: head-dim rows of the key count rounded up to a vector, zero past the
 * end) so that every product reads B along its rows. With causal masking each tile of rows of a
 * product stops at the last key (or starts at the first query) its rows can see, which skips the
 * masked half of the diagonal block as well as the blocks past it. q, k and v are read in place
 * ([B, S, heads*dh] with a row stride), and dq, dk, dv written in place.
 *
 * Work is split across the pool by (batch, head) forward and by (batch, kv head) backward: the
 * query heads that share a kv head (grouped-query attention) are visited in order by one thread,
 * so their dK, dV contributions add up in a fixed order without locks.
 *
 * rope is the reference's arithmetic (double) with its angles computed once per (position, pair)
 * instead of once per element.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

#define QB 64 /* query rows per block */
#define MR 6  /* rows of a micro-tile */
#define VL 16 /* the key count is padded to a multiple of this */

typedef struct attn_job {
    const float *q, *k, *v, *dy;
    float *o, *dq, *dk, *dv;
    int64_t nb, s, qf, s2, kf, dh, heads, kv_heads, group, np;
    bool causal;
    float scale;
} attn_job;

static void attn_setup(attn_job *j, const ptc_type *tq, const ptc_type *tk, int64_t heads,
                       int64_t kv_heads, bool causal)
{
    j->nb = tq->dims[0];
    j->s = tq->dims[1];
    j->qf = tq->dims[2];
    j->s2 = tk->dims[1];
    j->kf = tk->dims[2];
    j->heads = heads;
    j->kv_heads = kv_heads;
    j->dh = j->qf / heads;
    j->group = heads / kv_heads;
    j->causal = causal;
    j->scale = (float)(1.0 / sqrt((double)j->dh));
    j->np = (j->s2 + VL - 1) / VL * VL;
    PTC_ASSERT(j->group * kv_heads == heads && kv_heads * j->dh == j->kf);
}

/* ---- the block products ---- */

/* Which part of a product row i (of the block) can be nonzero: columns below i + nd, terms of the
 * sum from i + ks up to below i + kd. A tile of rows takes the widest range of its rows; the
 * extra terms are products with weights the softmax set to 0. */
typedef struct lim {
    int64_t nd, ks, kd;
} lim;
#define FAR ((int64_t)1 << 40)
static const lim NOLIM = {FAR, -FAR, FAR};

/* The micro-kernel, once per vector width (cpu_attention_mk.h), and the copy for this CPU. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MK_NAME mk_gemm_avx512
#define MK_VL 16
#define MK_NV 4
#define MK_TARGET __attribute__((target("arch=x86-64-v4")))
#include "cpu_attention_mk.h"
#define MK_NAME mk_gemm_avx2
#define MK_VL 8
#define MK_NV 2
#define MK_TARGET __attribute__((target("arch=x86-64-v3")))
#include "cpu_attention_mk.h"
#endif
#define MK_NAME mk_gemm_base
#define MK_VL 4
#define MK_NV 2
#define MK_TARGET
#include "cpu_attention_mk.h"

typedef void mk_fn(int64_t, int64_t, int64_t, bool, const float *, int64_t, const float *, int64_t,
                   float, bool, float *, int64_t, lim);

static mk_fn *mk_gemm;
static pthread_once_t mk_once = PTHREAD_ONCE_INIT;

/* the copies this CPU can run: 1 base, 2 and AVX2, 4 and AVX-512 */
static int mk_have(void)
{
    int have = 1;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
        have |= 2;
    if ((have & 2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
        have |= 4;
#endif
    return have;
}

/* the copy named (NULL: the widest this CPU has); NULL when the CPU lacks it */
static mk_fn *mk_named(const char *name)
{
    int have = mk_have();
    if (!name)
        name = have & 4 ? "avx512" : have & 2 ? "avx2" : "base";
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (strcmp(name, "avx512") == 0)
        return have & 4 ? mk_gemm_avx512 : NULL;
    if (strcmp(name, "avx2") == 0)
        return have & 2 ? mk_gemm_avx2 : NULL;
#endif
    return strcmp(name, "base") == 0 ? mk_gemm_base : NULL;
}

static void mk_pick(void)
{
    mk_gemm = mk_named(NULL);
}

bool ptrt_cpu_attention_isa(const char *name)
{
    pthread_once(&mk_once, mk_pick);
    mk_fn *f = mk_named(name);
    if (f)
        mk_gemm = f;
    return f != NULL;
}

/* o (dh x np) = the (batch b, kv head kh) columns of x ([B, s2, kf]) transposed, zero past s2 */
static void pack_t(const attn_job *j, const float *x, int64_t b, int64_t kh, float *o)
{
    ptrt_cpu_transpose_tiled(x + b * j->s2 * j->kf + kh * j->dh, j->kf, o, j->np, j->s2, j->dh);
    for (int64_t d = 0; d < j->dh; d++)
        memset(o + d * j->np + j->s2, 0, (size_t)(j->np - j->s2) * sizeof(float));
}

/* Keys query row i sees (the reference's rule). */
static int64_t row_keys(const attn_job *j, int64_t i)
{
    return j->causal && i + 1 < j->s2 ? i + 1 : j->s2;
}

static int64_t block_keys(const attn_job *j, int64_t i1)
{
    return j->causal && i1 < j->s2 ? i1 : j->s2;
}

/* The keys query row i of the block starting at i0 sees, up to its own (causal): as the columns
 * of its scores (score_lim), as the terms of a sum over keys (keys_lim). */
static lim score_lim(const attn_job *j, int64_t i0)
{
    return j->causal ? (lim){i0 + 1, -FAR, FAR} : NOLIM;
}

static lim keys_lim(const attn_job *j, int64_t i0)
{
    return j->causal ? (lim){FAR, -FAR, i0 + 1} : NOLIM;
}

/* ... and what key row t reaches: the block's queries from its own on. */
static lim queries_lim(const attn_job *j, int64_t i0)
{
    return j->causal ? (lim){FAR, -i0, FAR} : NOLIM;
}

/* Softmax weights of query rows [i0, i1) of head h in batch b over the block's nk keys, into p
 * (rows of np, from the packed keys kt); a row's entries past its own last key are 0 up to nk
 * rounded up to a vector. */
static void block_probs(const attn_job *j, const float *kt, int64_t b, int64_t h, int64_t i0,
                        int64_t i1, int64_t nk, float *p)
{
    const float *q = j->q + (b * j->s + i0) * j->qf + h * j->dh;
    int64_t nkv = (nk + VL - 1) / VL * VL;
    mk_gemm(i1 - i0, nkv, j->dh, false, q, j->qf, kt, j->np, j->scale, false, p, j->np,
            score_lim(j, i0));
    for (int64_t i = i0; i < i1; i++) {
        float *row = p + (i - i0) * j->np;
        int64_t n = row_keys(j, i);
        float mx = ptrt_cpu_max(row, n);
        float inv = 1.0f / ptrt_cpu_exp_sum(row, mx, row, n);
        for (int64_t t = 0; t < n; t++)
            row[t] *= inv;
        memset(row + n, 0, (size_t)(nkv - n) * sizeof(float));
    }
}

/* Forward for (batch, head) pairs [begin, end). */
static void attn_fwd(void *ctx, int64_t begin, int64_t end)
{
    const attn_job *j = ctx;
    float *kt = ptc_xmalloc((size_t)(j->dh * j->np) * sizeof(float));
    float *p = ptc_xmalloc((size_t)(QB * j->np) * sizeof(float));
    int64_t packed = -1;
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / j->heads, h = t % j->heads, kh = h / j->group;
        if (packed != b * j->kv_heads + kh) {
            pack_t(j, j->k, b, kh, kt);
            packed = b * j->kv_heads + kh;
        }
        const float *v = j->v + b * j->s2 * j->kf + kh * j->dh;
        for (int64_t i0 = 0; i0 < j->s; i0 += QB) {
            int64_t i1 = i0 + QB < j->s ? i0 + QB : j->s, nk = block_keys(j, i1);
            block_probs(j, kt, b, h, i0, i1, nk, p);
            mk_gemm(i1 - i0, j->dh, nk, false, p, j->np, v, j->kf, 1.0f, false,
                    j->o + (b * j->s + i0) * j->qf + h * j->dh, j->qf, keys_lim(j, i0));
        }
    }
    free(kt);
    free(p);
}

int ptrt_cpu_attention(const ptc_type *tq, const float *q, const ptc_type *tk, const float *k,
                       const float *v, int64_t heads, int64_t kv_heads, bool causal, float *o)
{
    attn_job j = {.q = q, .k = k, .v = v, .o = o};
    attn_setup(&j, tq, tk, heads, kv_heads, causal);
    if (j.s2 == 0 || j.dh == 0)
        return 0;
    pthread_once(&mk_once, mk_pick);
    ptrt_cpu_parallel_for(j.nb * heads, 1, attn_fwd, &j);
    return 1;
}

/* dp = p (dp - sum_t p dp) scale over a row's n keys (the sum in double lanes) */
PTRT_CLONES static void softmax_grad_row(const float *p, float *dp, int64_t n, float scale)
{
    double acc[PTRT_LANES] = {0};
    int64_t t = 0;
    for (; t + PTRT_LANES <= n; t += PTRT_LANES)
        for (int l = 0; l < PTRT_LANES; l++)
            acc[l] += (double)p[t + l] * dp[t + l];
    for (; t < n; t++)
        acc[t % PTRT_LANES] += (double)p[t] * dp[t];
    float dot = (float)ptrt_fold_lanes(acc);
    for (t = 0; t < n; t++)
        dp[t] = p[t] * (dp[t] - dot) * scale;
}

/* One block of the backward: o_i = sum_j p_ij v_j, so dV += P^T dO and dP = dO V^T; through the
 * softmax dS = P (dP - rowsum(P dP)) scale; the scores are scale Q K^T, so dQ = dS K and
 * dK += dS^T Q. kt and vt: the (batch, kv head)'s keys and values, packed transposed. */
static void block_grad(const attn_job *j, const float *kt, const float *vt, int64_t b, int64_t h,
                       int64_t i0, int64_t i1, float *p, float *dp)
{
    int64_t rows = i1 - i0, nk = block_keys(j, i1), kh = h / j->group;
    int64_t nkv = (nk + VL - 1) / VL * VL;
    int64_t qo = (b * j->s + i0) * j->qf + h * j->dh, ko = b * j->s2 * j->kf + kh * j->dh;
    block_probs(j, kt, b, h, i0, i1, nk, p);
    mk_gemm(rows, nkv, j->dh, false, j->dy + qo, j->qf, vt, j->np, 1.0f, false, dp, j->np,
            score_lim(j, i0));
    mk_gemm(nk, j->dh, rows, true, p, j->np, j->dy + qo, j->qf, 1.0f, true, j->dv + ko, j->kf,
            queries_lim(j, i0));
    for (int64_t r = 0; r < rows; r++) {
        int64_t n = row_keys(j, i0 + r);
        softmax_grad_row(p + r * j->np, dp + r * j->np, n, j->scale);
        memset(dp + r * j->np + n, 0, (size_t)(nkv - n) * sizeof(float)); /* (p is 0 there) */
    }
    mk_gemm(rows, j->dh, nk, false, dp, j->np, j->k + ko, j->kf, 1.0f, false, j->dq + qo, j->qf,
            keys_lim(j, i0));
    mk_gemm(nk, j->dh, rows, true, dp, j->np, j->q + qo, j->qf, 1.0f, true, j->dk + ko, j->kf,
            queries_lim(j, i0));
}

/* Backward for (batch, kv head) pairs [begin, end), each with all its query heads in order. */
static void attn_bwd(void *ctx, int64_t begin, int64_t end)
{
    const attn_job *j = ctx;
    size_t block = (size_t)(QB * j->np) * sizeof(float), packed = (size_t)(j->dh * j->np) * sizeof(float);
    float *p = ptc_xmalloc(block), *dp = ptc_xmalloc(block);
    float *kt = ptc_xmalloc(packed), *vt = ptc_xmalloc(packed);
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / j->kv_heads, kh = t % j->kv_heads;
        for (int64_t r = 0; r < j->s2; r++) {
            int64_t at = (b * j->s2 + r) * j->kf + kh * j->dh;
            memset(j->dk + at, 0, (size_t)j->dh * sizeof(float));
            memset(j->dv + at, 0, (size_t)j->dh * sizeof(float));
        }
        pack_t(j, j->k, b, kh, kt);
        pack_t(j, j->v, b, kh, vt);
        for (int64_t h = kh * j->group; h < (kh + 1) * j->group; h++)
            for (int64_t i0 = 0; i0 < j->s; i0 += QB)
                block_grad(j, kt, vt, b, h, i0, i0 + QB < j->s ? i0 + QB : j->s, p, dp);
    }
    free(p);
    free(dp);
    free(kt);
    free(vt);
}

int ptrt_cpu_attention_grad(const ptc_type *tq, const ptc_type *tk, void *const *in, int64_t heads,
                            int64_t kv_heads, bool causal, void *const *out)
{
    attn_job j = {
        .q = in[0], .k = in[1], .v = in[2], .dy = in[3], .dq = out[0], .dk = out[1], .dv = out[2]};
    attn_setup(&j, tq, tk, heads, kv_heads, causal);
    if (j.s2 == 0 || j.dh == 0)
        return 0;
    pthread_once(&mk_once, mk_pick);
    ptrt_cpu_parallel_for(j.nb * kv_heads, 1, attn_bwd, &j);
    return 1;
}

/* ---- rope ---- */

typedef struct rope_job {
    const float *x;
    float *o;
    const double *cs, *sn; /* [s, dh/2] */
    int64_t s, f, dh, heads;
    bool inverse;
} rope_job;

static void rope_rows(void *ctx, int64_t begin, int64_t end)
{
    const rope_job *j = ctx;
    int64_t half = j->dh / 2;
    for (int64_t row = begin; row < end; row++) {
        const double *cs = j->cs + row % j->s * half, *sn = j->sn + row % j->s * half;
        for (int64_t h = 0; h < j->heads; h++)
            for (int64_t i = 0; i < half; i++) {
                int64_t at = row * j->f + h * j->dh + 2 * i;
                double x0 = j->x[at], x1 = j->x[at + 1], c = cs[i], s = sn[i];
                if (j->inverse) {
                    j->o[at] = (float)(x0 * c + x1 * s);
                    j->o[at + 1] = (float)(-x0 * s + x1 * c);
                } else {
                    j->o[at] = (float)(x0 * c - x1 * s);
                    j->o[at + 1] = (float)(x0 * s + x1 * c);
                }
            }
    }
}

int ptrt_cpu_rope(const ptc_type *tx, const float *x, int64_t heads, double base, bool inverse,
                  float *o)
{
    int64_t s = tx->dims[1], f = tx->dims[2], dh = f / heads, half = dh / 2;
    if (dh % 2 || s == 0 || half == 0)
        return 0;
    double *cs = ptc_xmalloc((size_t)(s * half) * sizeof(double));
    double *sn = ptc_xmalloc((size_t)(s * half) * sizeof(double));
    for (int64_t p = 0; p < s; p++)
        for (int64_t i = 0; i < half; i++) {
            double theta = (double)p * pow(base, -2.0 * (double)i / (double)dh);
            cs[p * half + i] = cos(theta);
            sn[p * half + i] = sin(theta);
        }
    rope_job j = {x, o, cs, sn, s, f, dh, heads, inverse};
    ptrt_cpu_parallel_for(tx->dims[0] * s, (1 << 14) / f + 1, rope_rows, &j);
    free(cs);
    free(sn);
    return 1;
}
