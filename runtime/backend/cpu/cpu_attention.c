/* cpu_attention.c - fast CPU kernels for attention (forward and backward) and rope.
 *
 * Attention runs per (batch, head) on blocks of 64 query rows: the scores of a block are one GEMM
 * against the keys the block can see (with causal masking, keys up to its last row: about half the
 * work of the full square), a float softmax per row, and one GEMM with the values. q, k and v are
 * read in place ([B, S, heads*dh] with a row stride), so nothing is gathered or copied. The
 * backward recomputes the weights the same way (as the reference does) and takes dV, dP, dS, dQ
 * and dK as five GEMMs per block. Work is split across the pool by (batch, kv head): the query
 * heads that share a kv head (grouped-query attention) are visited in order by one thread, so
 * their dK, dV contributions add up in a fixed order without locks.
 *
 * rope is the reference's arithmetic (double) with its angles computed once per (position, pair)
 * instead of once per element.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

#define QB 64 /* query rows per block */

typedef struct attn_job {
    const float *q, *k, *v, *dy;
    float *o, *dq, *dk, *dv;
    int64_t nb, s, qf, s2, kf, dh, heads, kv_heads, group;
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
    PTC_ASSERT(j->group * kv_heads == heads && kv_heads * j->dh == j->kf);
}

/* Keys query row i sees (the reference's rule). */
static int64_t row_keys(const attn_job *j, int64_t i)
{
    return j->causal && i + 1 < j->s2 ? i + 1 : j->s2;
}

/* Softmax weights of query rows [i0, i1) of head h in batch b over the block's nk keys, into p
 * (rows of nk); a row's entries past its own last key are 0. */
static void block_probs(const attn_job *j, int64_t b, int64_t h, int64_t i0, int64_t i1, int64_t nk,
                        float *p)
{
    const float *q = j->q + (b * j->s + i0) * j->qf + h * j->dh;
    const float *k = j->k + b * j->s2 * j->kf + h / j->group * j->dh;
    ptrt_cpu_gemm_serial(false, true, i1 - i0, nk, j->dh, j->scale, q, j->qf, k, j->kf, 0.0f, p,
                         nk);
    for (int64_t i = i0; i < i1; i++) {
        float *row = p + (i - i0) * nk;
        int64_t n = row_keys(j, i);
        float mx = ptrt_cpu_max(row, n);
        float inv = 1.0f / ptrt_cpu_exp_sum(row, mx, row, n);
        for (int64_t t = 0; t < n; t++)
            row[t] *= inv;
        for (int64_t t = n; t < nk; t++)
            row[t] = 0.0f;
    }
}

static int64_t block_keys(const attn_job *j, int64_t i1)
{
    return j->causal && i1 < j->s2 ? i1 : j->s2;
}

/* Forward for (batch, head) pairs [begin, end). */
static void attn_fwd(void *ctx, int64_t begin, int64_t end)
{
    const attn_job *j = ctx;
    float *p = ptc_xmalloc((size_t)(QB * (j->s2 ? j->s2 : 1)) * sizeof(float));
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / j->heads, h = t % j->heads, kh = h / j->group;
        const float *v = j->v + b * j->s2 * j->kf + kh * j->dh;
        for (int64_t i0 = 0; i0 < j->s; i0 += QB) {
            int64_t i1 = i0 + QB < j->s ? i0 + QB : j->s, nk = block_keys(j, i1);
            block_probs(j, b, h, i0, i1, nk, p);
            ptrt_cpu_gemm_serial(false, false, i1 - i0, j->dh, nk, 1.0f, p, nk, v, j->kf, 0.0f,
                                 j->o + (b * j->s + i0) * j->qf + h * j->dh, j->qf);
        }
    }
    free(p);
}

int ptrt_cpu_attention(const ptc_type *tq, const float *q, const ptc_type *tk, const float *k,
                       const float *v, int64_t heads, int64_t kv_heads, bool causal, float *o)
{
    attn_job j = {.q = q, .k = k, .v = v, .o = o};
    attn_setup(&j, tq, tk, heads, kv_heads, causal);
    if (j.s2 == 0 || j.dh == 0)
        return 0;
    ptrt_cpu_parallel_for(j.nb * heads, 1, attn_fwd, &j);
    return 1;
}

/* One block of the backward: o_i = sum_j p_ij v_j, so dV += P^T dO and dP = dO V^T; through the
 * softmax dS = P (dP - rowsum(P dP)) scale; the scores are scale Q K^T, so dQ = dS K and
 * dK += dS^T Q. */
static void block_grad(const attn_job *j, int64_t b, int64_t h, int64_t i0, int64_t i1, float *p,
                       float *dp)
{
    int64_t rows = i1 - i0, nk = block_keys(j, i1), kh = h / j->group;
    int64_t qo = (b * j->s + i0) * j->qf + h * j->dh, ko = b * j->s2 * j->kf + kh * j->dh;
    block_probs(j, b, h, i0, i1, nk, p);
    ptrt_cpu_gemm_serial(false, true, rows, nk, j->dh, 1.0f, j->dy + qo, j->qf, j->v + ko, j->kf,
                         0.0f, dp, nk);
    ptrt_cpu_gemm_serial(true, false, nk, j->dh, rows, 1.0f, p, nk, j->dy + qo, j->qf, 1.0f,
                         j->dv + ko, j->kf);
    for (int64_t r = 0; r < rows; r++) {
        float *pr = p + r * nk, *dpr = dp + r * nk;
        int64_t n = row_keys(j, i0 + r);
        double s0 = 0, s1 = 0;
        int64_t t = 0;
        for (; t + 2 <= n; t += 2) {
            s0 += (double)pr[t] * dpr[t];
            s1 += (double)pr[t + 1] * dpr[t + 1];
        }
        if (t < n)
            s0 += (double)pr[t] * dpr[t];
        float dot = (float)(s0 + s1);
        for (t = 0; t < nk; t++) /* past the row's keys p is 0, so dS is 0 there */
            dpr[t] = pr[t] * (dpr[t] - dot) * j->scale;
    }
    ptrt_cpu_gemm_serial(false, false, rows, j->dh, nk, 1.0f, dp, nk, j->k + ko, j->kf, 0.0f,
                         j->dq + qo, j->qf);
    ptrt_cpu_gemm_serial(true, false, nk, j->dh, rows, 1.0f, dp, nk, j->q + qo, j->qf, 1.0f,
                         j->dk + ko, j->kf);
}

/* Backward for (batch, kv head) pairs [begin, end), each with all its query heads in order. */
static void attn_bwd(void *ctx, int64_t begin, int64_t end)
{
    const attn_job *j = ctx;
    size_t scratch = (size_t)(QB * (j->s2 ? j->s2 : 1));
    float *p = ptc_xmalloc(scratch * sizeof(float)), *dp = ptc_xmalloc(scratch * sizeof(float));
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / j->kv_heads, kh = t % j->kv_heads;
        for (int64_t r = 0; r < j->s2; r++) {
            int64_t at = (b * j->s2 + r) * j->kf + kh * j->dh;
            memset(j->dk + at, 0, (size_t)j->dh * sizeof(float));
            memset(j->dv + at, 0, (size_t)j->dh * sizeof(float));
        }
        for (int64_t h = kh * j->group; h < (kh + 1) * j->group; h++)
            for (int64_t i0 = 0; i0 < j->s; i0 += QB)
                block_grad(j, b, h, i0, i0 + QB < j->s ? i0 + QB : j->s, p, dp);
    }
    free(p);
    free(dp);
}

int ptrt_cpu_attention_grad(const ptc_type *tq, const ptc_type *tk, void *const *in, int64_t heads,
                            int64_t kv_heads, bool causal, void *const *out)
{
    attn_job j = {
        .q = in[0], .k = in[1], .v = in[2], .dy = in[3], .dq = out[0], .dk = out[1], .dv = out[2]};
    attn_setup(&j, tq, tk, heads, kv_heads, causal);
    if (j.s2 == 0 || j.dh == 0)
        return 0;
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
