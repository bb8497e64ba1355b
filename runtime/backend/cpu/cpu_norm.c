/* cpu_norm.c - fast CPU kernels for the row-wise ops: layernorm and rmsnorm with their backward,
 * softmax over the last axis, cross-entropy with its backward, embedding with its backward.
 *
 * Rows are independent, so they split across the pool. The parameter gradients of the norms are
 * sums over rows: each block of rows (fixed by the row count) sums its rows in order into partial
 * sums while the rows are in cache, and a second pass adds the blocks' partials in block order.
 * The embedding's table gradient is split by columns, every row added in order. No thread ever
 * adds into another's sums, and the order is fixed. Row statistics (mean, variance, the dot
 * products of the backward, the loss) are summed in double with sixteen running sums (they
 * vectorize); the elementwise parts are float. Bad ids or targets are left to the reference
 * kernel, which reports them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

#define GRAIN (1 << 14) /* elements per piece */
#define COLS 64         /* columns per piece of the embedding's gradient */

/* Sixteen float lanes as two values of eight (GCC's and Clang's vector extension), for a
 * reduction whose lane order must not depend on the ISA, where an array of sixteen float running
 * sums is left scalar by GCC. Eight, not sixteen in one: GCC lowers a vector wider than the
 * hardware's through memory inside a loop, which made the AVX2 copy of this loop several times
 * slower than scalar code; eight is one AVX2 register and half an AVX-512 one. */
typedef float f32x8 __attribute__((vector_size(32)));
#define LOAD8(v, p) __builtin_memcpy(&(v), (p), sizeof(v))
_Static_assert(2 * sizeof(f32x8) / sizeof(float) == PTRT_LANES, "one f32x8 lane per running sum");

/* sum of x[i], and of (x[i] - c)^2 */
static inline double sum_d(const float *restrict x, int64_t n)
{
    double s[PTRT_LANES] = {0};
    int64_t i = 0;
    for (; i + PTRT_LANES <= n; i += PTRT_LANES)
        for (int l = 0; l < PTRT_LANES; l++)
            s[l] += x[i + l];
    for (int l = 0; l < PTRT_LANES && i < n; l++, i++)
        s[l] += x[i];
    return ptrt_fold_lanes(s);
}

static inline double sumsq_d(const float *restrict x, double c, int64_t n)
{
    double s[PTRT_LANES] = {0};
    int64_t i = 0;
    for (; i + PTRT_LANES <= n; i += PTRT_LANES)
        for (int l = 0; l < PTRT_LANES; l++) {
            double a = x[i + l] - c;
            s[l] += a * a;
        }
    for (int l = 0; l < PTRT_LANES && i < n; l++, i++)
        s[l] += (x[i] - c) * (x[i] - c);
    return ptrt_fold_lanes(s);
}

/* ---- layernorm ---- */

typedef struct norm_job {
    const float *x, *g, *b, *dy;
    float *o, *dx, *dg, *db;
    ptc_dtype xt, dyt, dxt; /* the backward: x, dy, dx may be 16-bit (then they point at it) */
    double *pg, *pb;      /* the backward: partial sums of dg and db, blocks x d */
    int64_t blocks, block; /* the backward: row blocks, rows per block */
    int64_t rows, d;
    double eps;
    bool rms;
} norm_job;

/* mean and 1/sqrt(var + eps) of a row (layernorm), or 0 and 1/sqrt(mean(x^2) + eps) (rmsnorm) */
static inline void row_stats(const norm_job *j, const float *x, float *mean, float *inv)
{
    double m = j->rms ? 0.0 : sum_d(x, j->d) / (double)j->d;
    double var = sumsq_d(x, m, j->d) / (double)j->d;
    *mean = (float)m;
    *inv = (float)(1.0 / sqrt(var + j->eps));
}

PTRT_CLONES static void norm_fwd_rows(void *ctx, int64_t begin, int64_t end)
{
    const norm_job *j = ctx;
    int64_t d = j->d;
    for (int64_t r = begin; r < end; r++) {
        const float *restrict x = j->x + r * d;
        float *restrict o = j->o + r * d;
        float m, inv;
        row_stats(j, x, &m, &inv);
        if (j->rms)
            for (int64_t i = 0; i < d; i++)
                o[i] = x[i] * inv * j->g[i];
        else
            for (int64_t i = 0; i < d; i++)
                o[i] = (x[i] - m) * inv * j->g[i] + j->b[i];
    }
}

int ptrt_cpu_layernorm(const ptc_type *tx, const float *x, const float *g, const float *b,
                       double eps, float *o)
{
    int64_t d = tx->dims[tx->rank - 1];
    if (d == 0)
        return 0;
    norm_job j = {
        .x = x, .g = g, .b = b, .o = o, .rows = ptc_type_numel(tx) / d, .d = d, .eps = eps};
    ptrt_cpu_parallel_for(j.rows, GRAIN / d + 1, norm_fwd_rows, &j);
    return 1;
}

int ptrt_cpu_rmsnorm(const ptc_type *tx, const float *x, const float *g, double eps, float *o)
{
    int64_t d = tx->dims[tx->rank - 1];
    if (d == 0)
        return 0;
    norm_job j = {
        .x = x, .g = g, .o = o, .rows = ptc_type_numel(tx) / d, .d = d, .eps = eps, .rms = true};
    ptrt_cpu_parallel_for(j.rows, GRAIN / d + 1, norm_fwd_rows, &j);
    return 1;
}

/* Row blocks of the backward: dx of each row, and the block's partial sums of dg (and db) in
 * double, while the row is in cache. layernorm, xh = (x - mean) r, e = dy g:
 * dx = r (e - mean(e) - xh mean(e xh)); rmsnorm, xh = x r: dx = r (e - xh mean(e xh)). */
PTRT_CLONES static void norm_bwd_blocks(void *ctx, int64_t begin, int64_t end)
{
    const norm_job *j = ctx;
    int64_t d = j->d;
    bool all_f32 = j->xt == PTC_F32 && j->dyt == PTC_F32 && j->dxt == PTC_F32;
    float *buf = all_f32 ? NULL : ptc_xmalloc((size_t)(3 * d) * sizeof *buf); /* x, dy, dx rows */
    for (int64_t blk = begin; blk < end; blk++) {
        double *restrict pg = j->pg + blk * d, *restrict pb = j->pb + blk * d;
        memset(pg, 0, (size_t)d * sizeof *pg);
        memset(pb, 0, (size_t)d * sizeof *pb);
        int64_t r1 = (blk + 1) * j->block < j->rows ? (blk + 1) * j->block : j->rows;
        for (int64_t r = blk * j->block; r < r1; r++) {
            /* 16-bit rows widened as they are read (exact), dx rounded as it is stored */
            const float *restrict x = ptrt_cpu_floats_at(j->x, j->xt, r * d, d, buf);
            const float *restrict dy = ptrt_cpu_floats_at(j->dy, j->dyt, r * d, d, buf + d);
            const float *restrict g = j->g;
            float *restrict dx = j->dxt == PTC_F32 ? j->dx + r * d : buf + 2 * d;
            float m, inv;
            row_stats(j, x, &m, &inv);
            /* sixteen float lanes (each sums d / 16 terms), then the tail and the fold in double */
            f32x8 se[2] = {{0}, {0}}, sx[2] = {{0}, {0}};
            int64_t i = 0;
            for (; i + 16 <= d; i += 16)
                for (int h = 0; h < 2; h++) {
                    f32x8 vdy, vg, vx;
                    LOAD8(vdy, dy + i + 8 * h);
                    LOAD8(vg, g + i + 8 * h);
                    LOAD8(vx, x + i + 8 * h);
                    f32x8 e = vdy * vg;
                    se[h] += e;
                    sx[h] += e * ((vx - m) * inv);
                }
            double sed[PTRT_LANES], sxd[PTRT_LANES];
            for (int l = 0; l < PTRT_LANES; l++) {
                sed[l] = se[l / 8][l % 8];
                sxd[l] = sx[l / 8][l % 8];
            }
            for (int l = 0; l < PTRT_LANES && i < d; l++, i++) {
                float e = dy[i] * g[i];
                sed[l] += e;
                sxd[l] += e * ((x[i] - m) * inv);
            }
            float me = j->rms ? 0.0f : (float)(ptrt_fold_lanes(sed) / (double)d);
            float mex = (float)(ptrt_fold_lanes(sxd) / (double)d);
            for (int64_t c = 0; c < d; c++) {
                float xh = (x[c] - m) * inv;
                dx[c] = inv * (dy[c] * g[c] - me - xh * mex);
                pg[c] += (double)dy[c] * xh;
                pb[c] += dy[c];
            }
            if (j->dxt != PTC_F32)
                ptrt_cpu_cast_serial(PTC_F32, dx, j->dxt, (uint16_t *)(void *)j->dx + r * d, d);
        }
    }
    free(buf);
}

/* dg (and db) for columns [begin, end): the blocks' partial sums added in block order */
PTRT_CLONES static void norm_bwd_cols(void *ctx, int64_t begin, int64_t end)
{
    const norm_job *j = ctx;
    int64_t d = j->d;
    for (int64_t c = begin; c < end; c++) {
        double sg = 0, sb = 0;
        for (int64_t blk = 0; blk < j->blocks; blk++) {
            sg += j->pg[blk * d + c];
            sb += j->pb[blk * d + c];
        }
        j->dg[c] = (float)sg;
        if (j->db)
            j->db[c] = (float)sb;
    }
}

/* Row blocks fixed by the row count alone (at most 64, of at least 16 rows), so the sums of dg and
 * db do not depend on the thread count. */
static int norm_grad(norm_job *j)
{
    if (j->d == 0)
        return 0;
    int64_t rows = j->rows ? j->rows : 1;
    j->blocks = (rows + 15) / 16 < 64 ? (rows + 15) / 16 : 64;
    j->block = (rows + j->blocks - 1) / j->blocks;
    j->pg = ptc_xmalloc((size_t)(j->blocks * j->d) * sizeof(double));
    j->pb = ptc_xmalloc((size_t)(j->blocks * j->d) * sizeof(double));
    ptrt_cpu_parallel_for(j->blocks, GRAIN / (j->block * j->d) + 1, norm_bwd_blocks, j);
    ptrt_cpu_parallel_for(j->d, 16 + GRAIN / (j->blocks + 1), norm_bwd_cols, j);
    free(j->pg);
    free(j->pb);
    return 1;
}

int ptrt_cpu_norm_grad(bool rms, const ptc_type *it, void *const *in, const ptc_type *ot,
                       void *const *out, double eps)
{
    int64_t d = it[0].dims[it[0].rank - 1];
    for (int k = 0; k < 3; k++)
        if (it[k].dtype == PTC_I32 || (k < (rms ? 2 : 3) && ot[k].dtype == PTC_I32))
            return 0;
    norm_job j = {.x = in[0],
                  .dy = in[2],
                  .dx = out[0],
                  .xt = it[0].dtype,
                  .dyt = it[2].dtype,
                  .dxt = ot[0].dtype,
                  .d = d,
                  .eps = eps,
                  .rms = rms,
                  .rows = d ? ptc_type_numel(&it[0]) / d : 0};
    /* a 16-bit gamma widened, and dgamma (dbeta) summed into f32, rounded after: d floats each */
    bool f32 = it[1].dtype == PTC_F32 && ot[1].dtype == PTC_F32 && (rms || ot[2].dtype == PTC_F32);
    float *g = f32 ? NULL : ptc_xmalloc((size_t)(3 * (d ? d : 1)) * sizeof *g);
    j.g = ptrt_cpu_floats_at(in[1], it[1].dtype, 0, d, g);
    j.dg = ot[1].dtype == PTC_F32 ? out[1] : g + d;
    j.db = rms ? NULL : ot[2].dtype == PTC_F32 ? out[2] : g + 2 * d;
    int done = norm_grad(&j);
    for (int k = 1; done && k < (rms ? 2 : 3); k++)
        if (ot[k].dtype != PTC_F32) {
            ptc_type t = {.dtype = PTC_F32, .rank = 1, .dims = {d}};
            ptrt_cpu_cast(&t, k == 1 ? j.dg : j.db, ot[k].dtype, out[k]);
        }
    free(g);
    return done;
}

/* ---- softmax and cross-entropy ---- */

typedef struct row_job {
    const float *x, *dloss;
    const int32_t *t;
    float *o;
    double *loss; /* per row */
    int64_t c, rows;
    bool log_out;
} row_job;

static void softmax_rows(void *ctx, int64_t begin, int64_t end)
{
    const row_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + r * j->c;
        float *o = j->o + r * j->c;
        float mx = ptrt_cpu_max(x, j->c);
        float s = ptrt_cpu_exp_sum(x, mx, j->log_out ? NULL : o, j->c);
        if (j->log_out) {
            float lse = logf(s);
            for (int64_t i = 0; i < j->c; i++)
                o[i] = (x[i] - mx) - lse;
        } else {
            float inv = 1.0f / s;
            for (int64_t i = 0; i < j->c; i++)
                o[i] *= inv;
        }
    }
}

/* Over the last axis only; another axis goes to the reference. */
int ptrt_cpu_softmax(bool log_out, const ptc_type *tx, const float *x, int axis, float *o)
{
    int64_t c = tx->dims[tx->rank - 1];
    if (axis != tx->rank - 1 || c == 0)
        return 0;
    row_job j = {.x = x, .o = o, .c = c, .log_out = log_out};
    ptrt_cpu_parallel_for(ptc_type_numel(tx) / c, GRAIN / c + 1, softmax_rows, &j);
    return 1;
}

static bool targets_ok(const int32_t *t, int64_t rows, int64_t c)
{
    for (int64_t r = 0; r < rows; r++)
        if (t[r] < 0 || t[r] >= c)
            return false;
    return true;
}

static void ce_rows(void *ctx, int64_t begin, int64_t end)
{
    const row_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + r * j->c;
        float mx = ptrt_cpu_max(x, j->c);
        double s = ptrt_cpu_exp_sum(x, mx, NULL, j->c);
        j->loss[r] = (double)mx + log(s) - x[j->t[r]];
    }
}

int ptrt_cpu_cross_entropy(const ptc_type *tl, const float *logits, const int32_t *targets,
                           float *o)
{
    int64_t c = tl->dims[tl->rank - 1], rows = c ? ptc_type_numel(tl) / c : 0;
    if (rows == 0 || !targets_ok(targets, rows, c))
        return 0;
    row_job j = {
        .x = logits, .t = targets, .c = c, .loss = ptc_xmalloc((size_t)rows * sizeof(double))};
    ptrt_cpu_parallel_for(rows, GRAIN / c + 1, ce_rows, &j);
    double total = 0;
    for (int64_t r = 0; r < rows; r++)
        total += j.loss[r];
    free(j.loss);
    o[0] = (float)(total / (double)rows);
    return 1;
}

/* dlogits = (softmax(row) - onehot(target)) dloss / rows */
static void ce_grad_rows(void *ctx, int64_t begin, int64_t end)
{
    const row_job *j = ctx;
    float scale = (float)((double)j->dloss[0] / (double)j->rows);
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + r * j->c;
        float *o = j->o + r * j->c;
        float mx = ptrt_cpu_max(x, j->c);
        float s = ptrt_cpu_exp_sum(x, mx, o, j->c);
        float k = scale / s;
        for (int64_t i = 0; i < j->c; i++)
            o[i] *= k;
        o[j->t[r]] -= scale;
    }
}

int ptrt_cpu_cross_entropy_grad(const ptc_type *tl, const float *logits, const int32_t *targets,
                                const float *dloss, float *o)
{
    int64_t c = tl->dims[tl->rank - 1], rows = c ? ptc_type_numel(tl) / c : 0;
    if (rows == 0 || !targets_ok(targets, rows, c))
        return 0;
    row_job j = {.x = logits, .t = targets, .dloss = dloss, .o = o, .c = c, .rows = rows};
    ptrt_cpu_parallel_for(rows, GRAIN / c + 1, ce_grad_rows, &j);
    return 1;
}

/* ---- embedding ---- */

typedef struct emb_job {
    const float *table, *dy;
    const int32_t *ids;
    float *o;
    int64_t n, d, rows;
} emb_job;

static bool ids_ok(const int32_t *ids, int64_t n, int64_t rows)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= rows)
            return false;
    return true;
}

static void emb_rows(void *ctx, int64_t begin, int64_t end)
{
    const emb_job *j = ctx;
    for (int64_t i = begin; i < end; i++)
        memcpy(j->o + i * j->d, j->table + (int64_t)j->ids[i] * j->d, (size_t)j->d * sizeof(float));
}

int ptrt_cpu_embedding(const ptc_type *tt, const float *table, const ptc_type *ti,
                       const int32_t *ids, float *o)
{
    emb_job j = {.table = table,
                 .ids = ids,
                 .o = o,
                 .n = ptc_type_numel(ti),
                 .d = tt->dims[1],
                 .rows = tt->dims[0]};
    if (!ids_ok(ids, j.n, j.rows))
        return 0;
    ptrt_cpu_parallel_for(j.n, GRAIN / (j.d + 1) + 1, emb_rows, &j);
    return 1;
}

/* Column blocks [begin, end) of the table gradient: zeroed, then every position added in order. */
static void emb_grad_cols(void *ctx, int64_t begin, int64_t end)
{
    const emb_job *j = ctx;
    int64_t c0 = begin * COLS, c1 = end * COLS < j->d ? end * COLS : j->d;
    for (int64_t r = 0; r < j->rows; r++)
        memset(j->o + r * j->d + c0, 0, (size_t)(c1 - c0) * sizeof(float));
    for (int64_t i = 0; i < j->n; i++) {
        float *restrict o = j->o + (int64_t)j->ids[i] * j->d;
        const float *restrict dy = j->dy + i * j->d;
        for (int64_t c = c0; c < c1; c++)
            o[c] += dy[c];
    }
}

int ptrt_cpu_embedding_grad(const ptc_type *ti, const int32_t *ids, const float *dy,
                            const ptc_type *to, float *o)
{
    emb_job j = {.dy = dy,
                 .ids = ids,
                 .o = o,
                 .n = ptc_type_numel(ti),
                 .d = to->dims[1],
                 .rows = to->dims[0]};
    if (!ids_ok(ids, j.n, j.rows))
        return 0;
    ptrt_cpu_parallel_for((j.d + COLS - 1) / COLS, 1, emb_grad_cols, &j);
    return 1;
}
