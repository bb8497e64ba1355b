/* ref_spmd.c - reference kernels of the rank-dependent ops and of the vocabulary-parallel
 * cross-entropy pieces (see ops.def for their definitions). Plain loops, double accumulation,
 * like the other reference kernels; c is the rank's coordinate on the op's mesh axis.
 */
#include <math.h>
#include <string.h>

#include "ref_internal.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        ptc_fmt(err, errn, __VA_ARGS__);                                                           \
        return -1;                                                                                 \
    } while (0)

static int64_t rows_of(const ptc_type *t)
{
    return ptc_type_numel(t) / t->dims[t->rank - 1];
}

/* Replicate -> Shard(axis) with groups: this rank's blocks. */
static void shard_slice(const ptrt_kcall *n, int c, const ptc_type *it, const float *x, float *y)
{
    int d = (int)n->attrs.axis;
    int64_t groups = n->attrs.n > 1 ? n->attrs.n : 1, T = n->attrs.group;
    int64_t outer = 1, inner = 1, D = it->dims[d];
    for (int i = 0; i < d; i++)
        outer *= it->dims[i];
    for (int i = d + 1; i < it->rank; i++)
        inner *= it->dims[i];
    int64_t per = D / groups / T; /* per group per rank */
    for (int64_t o = 0; o < outer; o++)
        for (int64_t g = 0; g < groups; g++)
            memcpy(y + (o * groups + g) * per * inner,
                   x + (o * D + g * (D / groups) + c * per) * inner,
                   sizeof(float) * (size_t)(per * inner));
}

/* The row of this rank's shard that id i selects, or -1 when another rank holds it; -2 (after a
 * message) for an id outside the whole table of V rows. */
static int64_t shard_row(const int32_t *ids, int64_t i, int64_t rows, int64_t off, int64_t V,
                         char *err, size_t errn)
{
    if (ids[i] < 0 || ids[i] >= V) {
        ptc_fmt(err, errn,
                "embedding: id %d at position %lld is out of range for a table of %lld "
                "rows",
                ids[i], (long long)i, (long long)V);
        return -2;
    }
    int64_t r = ids[i] - off;
    return r >= 0 && r < rows ? r : -1;
}

static int embedding_shard(const ptrt_kcall *n, int c, const ptc_type *it, void *const *in, float *y,
                           char *err, size_t errn)
{
    const float *tab = in[0];
    const int32_t *ids = in[1];
    int64_t rows = it[0].dims[0], D = it[0].dims[1], V = rows * n->attrs.group;
    int64_t nid = ptc_type_numel(&it[1]), off = c * rows;
    for (int64_t i = 0; i < nid; i++) {
        int64_t r = shard_row(ids, i, rows, off, V, err, errn);
        if (r == -2)
            return -1;
        if (r >= 0)
            memcpy(y + i * D, tab + r * D, sizeof(float) * (size_t)D);
        else
            memset(y + i * D, 0, sizeof(float) * (size_t)D);
    }
    return 0;
}

static int embedding_grad_shard(const ptrt_kcall *n, int c, const ptc_type *it, void *const *in,
                                const ptc_type *ot, float *dt, char *err, size_t errn)
{
    const int32_t *ids = in[0];
    const float *dy = in[1];
    int64_t rows = ot->dims[0], D = ot->dims[1], V = rows * n->attrs.group;
    int64_t nid = ptc_type_numel(&it[0]), off = c * rows;
    memset(dt, 0, sizeof(float) * (size_t)(rows * D));
    for (int64_t i = 0; i < nid; i++) {
        int64_t r = shard_row(ids, i, rows, off, V, err, errn);
        if (r == -2)
            return -1;
        if (r >= 0)
            for (int64_t j = 0; j < D; j++)
                dt[r * D + j] += dy[i * D + j];
    }
    return 0;
}

static int ce_pieces(const ptrt_kcall *n, int c, const ptc_type *it, void *const *in, float *y,
                     char *err, size_t errn)
{
    const float *l = in[0];
    int64_t R = rows_of(&it[0]), V = it[0].dims[it[0].rank - 1];
    for (int64_t r = 0; r < R; r++) {
        const float *row = l + r * V;
        if (n->op == PTC_OP_CE_SUMEXP) {
            double m = ((const float *)in[1])[r], s = 0;
            for (int64_t j = 0; j < V; j++)
                s += exp((double)row[j] - m);
            y[r] = (float)s;
        } else { /* CE_PICK */
            int32_t t = ((const int32_t *)in[1])[r];
            int64_t off = c * V;
            if (t < 0 || t >= V * n->attrs.group)
                FAIL("cross_entropy: target %d at position %lld is out of range for %lld classes",
                     t, (long long)r, (long long)(V * n->attrs.group));
            y[r] = t >= off && t < off + V ? row[t - off] : 0.0f;
        }
    }
    return 0;
}

static int ce_grad_shard(const ptrt_kcall *n, int c, const ptc_type *it, void *const *in, float *dl,
                         char *err, size_t errn)
{
    const float *l = in[0], *M = in[2], *S = in[3];
    const int32_t *t = in[1];
    double scale = *(const float *)in[4];
    int64_t R = rows_of(&it[0]), V = it[0].dims[it[0].rank - 1], off = c * V;
    for (int64_t r = 0; r < R; r++) {
        if (t[r] < 0 || t[r] >= V * n->attrs.group)
            FAIL("cross_entropy: target %d at position %lld is out of range for %lld classes", t[r],
                 (long long)r, (long long)(V * n->attrs.group));
        for (int64_t j = 0; j < V; j++) {
            double p = exp((double)l[r * V + j] - M[r]) / S[r];
            dl[r * V + j] = (float)((p - (t[r] == off + j ? 1.0 : 0.0)) * scale / (double)R);
        }
    }
    return 0;
}

/* Attention over this rank's query heads: local head j is global head c*heads + j and uses
 * key/value head (c*heads + j) / (n / kv_heads). Forward (dq == NULL) or backward. */
static void attention_shard(const ptrt_kcall *n, int c, const ptc_type *it, void *const *in,
                            void *const *out, bool grad)
{
    const ptc_attrs *a = &n->attrs;
    const float *q = in[0], *k = in[1], *v = in[2], *dy = grad ? in[3] : NULL;
    int64_t B = it[0].dims[0], S = it[0].dims[1], S2 = it[1].dims[1];
    int64_t hl = a->heads, G = a->kv_heads, H = a->n, dh = it[0].dims[2] / hl;
    int64_t qs = hl * dh, ks = G * dh;
    double scale = 1.0 / sqrt((double)dh);
    double p[S2 > 0 ? S2 : 1], dp[S2 > 0 ? S2 : 1];
    if (grad) {
        memset(out[0], 0, sizeof(float) * (size_t)(B * S * qs));
        memset(out[1], 0, sizeof(float) * (size_t)(B * S2 * ks));
        memset(out[2], 0, sizeof(float) * (size_t)(B * S2 * ks));
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < hl; j++) {
            int64_t kvh = (c * hl + j) / (H / G);
            for (int64_t i = 0; i < S; i++) {
                const float *qi = q + (b * S + i) * qs + j * dh;
                double mx = -INFINITY, sum = 0;
                int64_t last = a->causal ? (i < S2 ? i : S2 - 1) : S2 - 1;
                for (int64_t t = 0; t <= last; t++) {
                    const float *kt = k + (b * S2 + t) * ks + kvh * dh;
                    double s = 0;
                    for (int64_t e = 0; e < dh; e++)
                        s += (double)qi[e] * kt[e];
                    p[t] = s * scale;
                    mx = p[t] > mx ? p[t] : mx;
                }
                for (int64_t t = 0; t <= last; t++)
                    sum += (p[t] = exp(p[t] - mx));
                for (int64_t t = 0; t <= last; t++)
                    p[t] /= sum;
                if (!grad) {
                    float *yi = (float *)out[0] + (b * S + i) * qs + j * dh;
                    for (int64_t e = 0; e < dh; e++) {
                        double acc = 0;
                        for (int64_t t = 0; t <= last; t++)
                            acc += p[t] * v[(b * S2 + t) * ks + kvh * dh + e];
                        yi[e] = (float)acc;
                    }
                    continue;
                }
                const float *dyi = dy + (b * S + i) * qs + j * dh;
                float *dqi = (float *)out[0] + (b * S + i) * qs + j * dh;
                double dot = 0;
                for (int64_t t = 0; t <= last; t++) {
                    const float *vt = v + (b * S2 + t) * ks + kvh * dh;
                    float *dvt = (float *)out[2] + (b * S2 + t) * ks + kvh * dh;
                    double s = 0;
                    for (int64_t e = 0; e < dh; e++) {
                        s += (double)dyi[e] * vt[e];
                        dvt[e] += (float)(p[t] * dyi[e]);
                    }
                    dp[t] = s;
                    dot += p[t] * s;
                }
                for (int64_t t = 0; t <= last; t++) {
                    double ds = p[t] * (dp[t] - dot) * scale;
                    const float *kt = k + (b * S2 + t) * ks + kvh * dh;
                    float *dkt = (float *)out[1] + (b * S2 + t) * ks + kvh * dh;
                    for (int64_t e = 0; e < dh; e++) {
                        dqi[e] += (float)(ds * kt[e]);
                        dkt[e] += (float)(ds * qi[e]);
                    }
                }
            }
        }
}

int ptrt_ref_run_spmd(const ptrt_kcall *n, const ptc_type *it, void *const *in,
                      const ptc_type *ot, void *const *out, char *err, size_t errn)
{
    int c = n->coord;
    switch (n->op) {
    case PTC_OP_SHARD_SLICE: shard_slice(n, c, &it[0], in[0], out[0]); return 0;
    case PTC_OP_PARTIALIZE:
        if (c == 0)
            memcpy(out[0], in[0], sizeof(float) * (size_t)ptc_type_numel(&it[0]));
        else
            memset(out[0], 0, sizeof(float) * (size_t)ptc_type_numel(&it[0]));
        return 0;
    case PTC_OP_EMBEDDING_SHARD: return embedding_shard(n, c, it, in, out[0], err, errn);
    case PTC_OP_EMBEDDING_GRAD_SHARD:
        return embedding_grad_shard(n, c, it, in, &ot[0], out[0], err, errn);
    case PTC_OP_CE_SUMEXP:
    case PTC_OP_CE_PICK: return ce_pieces(n, c, it, in, out[0], err, errn);
    case PTC_OP_CE_LOSS: {
        const float *M = in[0], *S = in[1], *T = in[2];
        int64_t R = ptc_type_numel(&it[0]);
        double acc = 0;
        for (int64_t r = 0; r < R; r++)
            acc += log((double)S[r]) + M[r] - T[r];
        *(float *)out[0] = (float)(acc / (double)R);
        return 0;
    }
    case PTC_OP_CE_GRAD_SHARD: return ce_grad_shard(n, c, it, in, out[0], err, errn);
    case PTC_OP_ATTENTION_SHARD:
    case PTC_OP_ATTENTION_SHARD_GRAD:
        attention_shard(n, c, it, in, out, n->op == PTC_OP_ATTENTION_SHARD_GRAD);
        return 0;
    default: ptc_fmt(err, errn, "%s is not a rank-dependent op", ptc_ops[n->op].name); return -1;
    }
}
