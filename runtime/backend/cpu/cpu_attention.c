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
 * Any operand may be bf16 or f16 storage (the plan's --precision, its casts folded into the op):
 * a thread widens what it reads as it goes (a (batch, kv head)'s keys and values, a block's query
 * and output-gradient rows), and sums what it writes in f32 (a block's output or dQ rows, a (batch,
 * kv head)'s dK and dV), each rounded into storage once, as the cast after an f32 kernel would
 * round it: the same bits as the f32 kernel between casts, with f32 copies of a few rows in place
 * of whole operands (gpt2 at s=1024: 1.1 MB a thread in the backward, counted in
 * ptrt_widened_add).
 *
 * rope is the reference's arithmetic (double) with its angles computed once per (position, pair)
 * instead of once per element.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "ref.h"

#define QB 64 /* query rows per block */
#define MR 6  /* rows of a micro-tile */
#define VL 16 /* the key count is padded to a multiple of this */

/* the operands, each f32, bf16 or f16 */
enum { Q, K, V, DY, O, DQ, DK, DV, NOPND };

typedef struct attn_job {
    const void *x[NOPND];
    ptc_dtype t[NOPND];
    int64_t nb, s, qf, s2, kf, dh, heads, kv_heads, group, np, ld;
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
    /* the rows of the packed keys and values and of a block's weights: an odd number of 64-byte
     * lines apart, so that a tile's rows spread over every set of the L1 cache (rows 1 KB
     * apart, s2 = 256, fell in 4 of its 64 sets: the key products ran at 68 GFLOP/s on one Zen 3
     * core, 87 with rows 1088 bytes apart) */
    j->ld = j->np / VL % 2 ? j->np : j->np + VL;
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

/* ---- operands in f32 or 16-bit storage ---- */

/* Rows of an operand read as f32: in place (f32 storage) or a thread's widened copy. */
typedef struct rows {
    const float *p; /* the first row */
    int64_t ld;     /* floats from one row to the next */
} rows;

/* The element of operand w ([B, s or s2, f]) at row r0 of batch b, column block hc of dh (a head
 * of q, o, dy, dq; a kv head of k, v, dk, dv); f: its row length */
static int64_t at_of(const attn_job *j, int w, int64_t b, int64_t hc, int64_t r0, int64_t *f)
{
    bool kv = w == K || w == V || w == DK || w == DV;
    *f = kv ? j->kf : j->qf;
    return (b * (kv ? j->s2 : j->s) + r0) * *f + hc * j->dh;
}

/* rows [r0, r0 + n) of operand w at (batch b, column block hc): in place if f32, else widened
 * into buf (n x dh) */
static rows rows_of(const attn_job *j, int w, int64_t b, int64_t hc, int64_t r0, int64_t n,
                    float *buf)
{
    int64_t f, at = at_of(j, w, b, hc, r0, &f);
    if (j->t[w] == PTC_F32)
        return (rows){(const float *)j->x[w] + at, f};
    for (int64_t r = 0; r < n; r++)
        ptrt_cpu_cast_serial(j->t[w], (const uint16_t *)j->x[w] + at + r * f, PTC_F32,
                             buf + r * j->dh, j->dh);
    return (rows){buf, j->dh};
}

/* where a result's rows [r0, r0 + n) of (batch b, head column block hc) are summed: the
 * operand itself if f32, else buf (n x dh), rounded by store_rows */
static float *sums_of(const attn_job *j, int w, int64_t b, int64_t hc, int64_t r0, float *buf,
                      int64_t *ld)
{
    int64_t at = at_of(j, w, b, hc, r0, ld);
    if (j->t[w] != PTC_F32) {
        *ld = j->dh;
        return buf;
    }
    return (float *)j->x[w] + at;
}

/* buf's n rows (from sums_of) rounded into the 16-bit operand w; nothing for f32 */
static void store_rows(const attn_job *j, int w, int64_t b, int64_t hc, int64_t r0, int64_t n,
                       const float *buf)
{
    if (j->t[w] == PTC_F32)
        return;
    int64_t f;
    uint16_t *o = (uint16_t *)j->x[w] + at_of(j, w, b, hc, r0, &f);
    for (int64_t r = 0; r < n; r++)
        ptrt_cpu_cast_serial(PTC_F32, buf + r * j->dh, j->t[w], o + r * f, j->dh);
}

/* A thread's scratch: f32 copies of 16-bit rows (counted as widened copies), and the blocks the
 * kernel works in. */
typedef struct scratch {
    float *kt, *vt;        /* keys and values of a (batch, kv head), packed transposed */
    float *p, *dp;         /* a block's weights and their gradient */
    float *kr, *vr;        /* its keys and values as f32 rows (16-bit storage only) */
    float *qr, *dyr, *out; /* a block's query, output-gradient and output (or dQ) rows */
    float *dks, *dvs;      /* dK and dV of a (batch, kv head) summed in f32 (16-bit only) */
    int64_t widened;       /* bytes of the f32 copies */
} scratch;

static float *take(int64_t n)
{
    return ptc_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
}

static void scratch_open(const attn_job *j, scratch *w, bool backward)
{
    memset(w, 0, sizeof *w);
    int64_t kv = j->s2 * j->dh, blk = QB * j->dh;
    w->kt = take(j->dh * j->ld);
    w->p = take(QB * j->ld);
    if (backward) {
        w->vt = take(j->dh * j->ld);
        w->dp = take(QB * j->ld);
    }
    /* (16-bit operands only: f32 ones are read and written in place) */
    struct {
        float **at;
        int64_t n;
        bool need;
    } c[] = {{&w->kr, kv, j->t[K] != PTC_F32},
             {&w->vr, kv, j->t[V] != PTC_F32},
             {&w->qr, blk, j->t[Q] != PTC_F32},
             {&w->dyr, blk, backward && j->t[DY] != PTC_F32},
             {&w->out, blk, backward ? j->t[DQ] != PTC_F32 : j->t[O] != PTC_F32},
             {&w->dks, kv, backward && j->t[DK] != PTC_F32},
             {&w->dvs, kv, backward && j->t[DV] != PTC_F32}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (c[i].need) {
            *c[i].at = take(c[i].n);
            w->widened += c[i].n * (int64_t)sizeof(float);
        }
    ptrt_widened_add(w->widened);
}

static void scratch_close(scratch *w)
{
    float *all[] = {w->kt, w->vt, w->p, w->dp, w->kr, w->vr, w->qr, w->dyr, w->out, w->dks, w->dvs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    ptrt_widened_add(-w->widened);
}

/* o (dh rows of np, ld apart) = the key (or value) rows x of a (batch, kv head) transposed,
 * zero past s2 */
static void pack_t(const attn_job *j, rows x, float *o)
{
    ptrt_cpu_transpose_tiled(x.p, x.ld, o, j->ld, j->s2, j->dh);
    for (int64_t d = 0; d < j->dh; d++)
        memset(o + d * j->ld + j->s2, 0, (size_t)(j->np - j->s2) * sizeof(float));
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

/* Softmax weights of query rows [i0, i1) (q: their rows) over the block's nk keys, into p (rows
 * of np, from the packed keys kt); a row's entries past its own last key are 0 up to nk rounded
 * up to a vector. */
static void block_probs(const attn_job *j, const float *kt, rows q, int64_t i0, int64_t i1,
                        int64_t nk, float *p)
{
    int64_t nkv = (nk + VL - 1) / VL * VL;
    mk_gemm(i1 - i0, nkv, j->dh, false, q.p, q.ld, kt, j->ld, j->scale, false, p, j->ld,
            score_lim(j, i0));
    for (int64_t i = i0; i < i1; i++) {
        float *row = p + (i - i0) * j->ld;
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
    scratch w;
    scratch_open(j, &w, false);
    int64_t packed = -1;
    rows v = {0};
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / j->heads, h = t % j->heads, kh = h / j->group;
        if (packed != b * j->kv_heads + kh) {
            pack_t(j, rows_of(j, K, b, kh, 0, j->s2, w.kr), w.kt);
            v = rows_of(j, V, b, kh, 0, j->s2, w.vr);
            packed = b * j->kv_heads + kh;
        }
        for (int64_t i0 = 0; i0 < j->s; i0 += QB) {
            int64_t i1 = i0 + QB < j->s ? i0 + QB : j->s, nk = block_keys(j, i1), ldo;
            block_probs(j, w.kt, rows_of(j, Q, b, h, i0, i1 - i0, w.qr), i0, i1, nk, w.p);
            float *o = sums_of(j, O, b, h, i0, w.out, &ldo);
            mk_gemm(i1 - i0, j->dh, nk, false, w.p, j->ld, v.p, v.ld, 1.0f, false, o, ldo,
                    keys_lim(j, i0));
            store_rows(j, O, b, h, i0, i1 - i0, o);
        }
    }
    scratch_close(&w);
}

/* it: q, k, v (k and v of one shape), ot: o; each f32, bf16 or f16 */
int ptrt_cpu_attention(const ptc_type *it, void *const *in, const ptc_type *ot, void *o,
                       int64_t heads, int64_t kv_heads, bool causal)
{
    attn_job j = {.x = {in[0], in[1], in[2], NULL, o},
                  .t = {it[0].dtype, it[1].dtype, it[2].dtype, PTC_F32, ot[0].dtype}};
    attn_setup(&j, &it[0], &it[1], heads, kv_heads, causal);
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
 * dK += dS^T Q. w: the (batch, kv head)'s keys and values packed transposed (kt, vt), k its key
 * rows, dk and dv where its dK and dV are summed (rows ldk and ldv apart). */
static void block_grad(const attn_job *j, scratch *w, rows k, float *dk, int64_t ldk, float *dv,
                       int64_t ldv, int64_t b, int64_t h, int64_t i0, int64_t i1)
{
    int64_t n = i1 - i0, nk = block_keys(j, i1), ldq;
    int64_t nkv = (nk + VL - 1) / VL * VL;
    float *p = w->p, *dp = w->dp;
    rows q = rows_of(j, Q, b, h, i0, n, w->qr), dy = rows_of(j, DY, b, h, i0, n, w->dyr);
    block_probs(j, w->kt, q, i0, i1, nk, p);
    mk_gemm(n, nkv, j->dh, false, dy.p, dy.ld, w->vt, j->ld, 1.0f, false, dp, j->ld,
            score_lim(j, i0));
    mk_gemm(nk, j->dh, n, true, p, j->ld, dy.p, dy.ld, 1.0f, true, dv, ldv, queries_lim(j, i0));
    for (int64_t r = 0; r < n; r++) {
        int64_t nr = row_keys(j, i0 + r);
        softmax_grad_row(p + r * j->ld, dp + r * j->ld, nr, j->scale);
        memset(dp + r * j->ld + nr, 0, (size_t)(nkv - nr) * sizeof(float)); /* (p is 0 there) */
    }
    float *dq = sums_of(j, DQ, b, h, i0, w->out, &ldq);
    mk_gemm(n, j->dh, nk, false, dp, j->ld, k.p, k.ld, 1.0f, false, dq, ldq, keys_lim(j, i0));
    store_rows(j, DQ, b, h, i0, n, dq);
    mk_gemm(nk, j->dh, n, true, dp, j->ld, q.p, q.ld, 1.0f, true, dk, ldk, queries_lim(j, i0));
}

/* Backward for (batch, kv head) pairs [begin, end), each with all its query heads in order. */
static void attn_bwd(void *ctx, int64_t begin, int64_t end)
{
    const attn_job *j = ctx;
    scratch w;
    scratch_open(j, &w, true);
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / j->kv_heads, kh = t % j->kv_heads, ldk, ldv;
        float *dk = sums_of(j, DK, b, kh, 0, w.dks, &ldk);
        float *dv = sums_of(j, DV, b, kh, 0, w.dvs, &ldv);
        for (int64_t r = 0; r < j->s2; r++) {
            memset(dk + r * ldk, 0, (size_t)j->dh * sizeof(float));
            memset(dv + r * ldv, 0, (size_t)j->dh * sizeof(float));
        }
        rows k = rows_of(j, K, b, kh, 0, j->s2, w.kr);
        pack_t(j, k, w.kt);
        pack_t(j, rows_of(j, V, b, kh, 0, j->s2, w.vr), w.vt);
        for (int64_t h = kh * j->group; h < (kh + 1) * j->group; h++)
            for (int64_t i0 = 0; i0 < j->s; i0 += QB)
                block_grad(j, &w, k, dk, ldk, dv, ldv, b, h, i0, i0 + QB < j->s ? i0 + QB : j->s);
        store_rows(j, DK, b, kh, 0, j->s2, dk);
        store_rows(j, DV, b, kh, 0, j->s2, dv);
    }
    scratch_close(&w);
}

/* it: q, k, v, dy; ot: dq, dk, dv; each f32, bf16 or f16 */
int ptrt_cpu_attention_grad(const ptc_type *it, void *const *in, const ptc_type *ot,
                            void *const *out, int64_t heads, int64_t kv_heads, bool causal)
{
    attn_job j = {.x = {in[0], in[1], in[2], in[3], NULL, out[0], out[1], out[2]},
                  .t = {it[0].dtype, it[1].dtype, it[2].dtype, it[3].dtype, PTC_F32, ot[0].dtype,
                        ot[1].dtype, ot[2].dtype}};
    attn_setup(&j, &it[0], &it[1], heads, kv_heads, causal);
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
