/* ref_model.c - reference kernels for the model ops (embedding, attention, rope) and the losses
 * (cross_entropy, mse), written straight from "Exact semantics" on the language page.
 *
 * Attention is computed one (batch, head, query) at a time with the scores in double; nothing is
 * fused or tiled, so it can be checked by hand. Bad data (an id or target out of range) is a user
 * error: the kernel returns -1 with a message naming the value, where it was and the valid range.
 */
#include <math.h>
#include <stdlib.h>

#include "ref_internal.h"

int ptrt_ref_embedding(const ptc_type *tt, const float *table, const ptc_type *ti,
                       const int32_t *ids, float *o, char *err, size_t errn)
{
    int64_t rows = tt->dims[0], d = tt->dims[1], n = ptc_type_numel(ti);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= rows) {
            ptc_fmt(err, errn,
                    "embedding: id %d at position %lld is out of range for a table of %lld rows "
                    "(valid ids are 0 to %lld)",
                    (int)ids[i], (long long)i, (long long)rows, (long long)(rows - 1));
            return -1;
        }
        for (int64_t j = 0; j < d; j++)
            o[i * d + j] = table[(int64_t)ids[i] * d + j];
    }
    return 0;
}

/* q [B,S,H*dh], k and v [B,S2,G*dh] -> [B,S,H*dh]. Per head h (using kv head h / (H/G)) and query
 * position i: softmax over key positions j of q_i.k_j / sqrt(dh), where causal leaves out j > i;
 * the result is the weighted sum of the v_j. */
void ptrt_ref_attention(const ptc_type *tq, const float *q, const ptc_type *tk, const float *k,
                        const float *v, int64_t heads, int64_t kv_heads, bool causal, float *o)
{
    int64_t nb = tq->dims[0], s = tq->dims[1], qf = tq->dims[2];
    int64_t s2 = tk->dims[1], kf = tk->dims[2], dh = qf / heads, group = heads / kv_heads;
    PTC_ASSERT(group * kv_heads == heads && kv_heads * dh == kf);
    double scale = 1.0 / sqrt((double)dh);
    double *w = ptc_xmalloc((size_t)s2 * sizeof *w);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t kh = h / group;
            for (int64_t i = 0; i < s; i++) {
                const float *qi = q + (b * s + i) * qf + h * dh;
                int64_t nkeys = causal && i + 1 < s2 ? i + 1 : s2;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < nkeys; j++) {
                    const float *kj = k + (b * s2 + j) * kf + kh * dh;
                    double dot = 0;
                    for (int64_t d = 0; d < dh; d++)
                        dot += (double)qi[d] * kj[d];
                    w[j] = dot * scale;
                    if (w[j] > mx)
                        mx = w[j];
                }
                for (int64_t j = 0; j < nkeys; j++) {
                    w[j] = exp(w[j] - mx);
                    sum += w[j];
                }
                float *oi = o + (b * s + i) * qf + h * dh;
                for (int64_t d = 0; d < dh; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < nkeys; j++)
                        acc += w[j] * v[(b * s2 + j) * kf + kh * dh + d];
                    oi[d] = (float)(acc / sum);
                }
            }
        }
    free(w);
}

/* x [B,S,H*dh]: in each head, the pair (2j, 2j+1) at position p turns by p * base^(-2j/dh). */
void ptrt_ref_rope(const ptc_type *tx, const float *x, int64_t heads, double base, float *o)
{
    int64_t nb = tx->dims[0], s = tx->dims[1], f = tx->dims[2], dh = f / heads;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t p = 0; p < s; p++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t j = 0; j < dh / 2; j++) {
                    double theta = (double)p * pow(base, -2.0 * (double)j / (double)dh);
                    double c = cos(theta), sn = sin(theta);
                    int64_t at = (b * s + p) * f + h * dh + 2 * j;
                    double x0 = x[at], x1 = x[at + 1];
                    o[at] = (float)(x0 * c - x1 * sn);
                    o[at + 1] = (float)(x0 * sn + x1 * c);
                }
}

int ptrt_ref_check_target(const char *op, int32_t t, int64_t r, int64_t c, char *err, size_t errn)
{
    if (t >= 0 && t < c)
        return 0;
    ptc_fmt(err, errn,
            "%s: target %d at position %lld is out of range for %lld classes (valid targets are "
            "0 to %lld)",
            op, (int)t, (long long)r, (long long)c, (long long)(c - 1));
    return -1;
}

double ptrt_ref_logsumexp(const float *row, int64_t c, double *max)
{
    double mx = row[0], sum = 0;
    for (int64_t i = 1; i < c; i++)
        if (row[i] > mx)
            mx = row[i];
    for (int64_t i = 0; i < c; i++)
        sum += exp(row[i] - mx);
    *max = mx;
    return mx + log(sum);
}

/* Mean over all rows of logsumexp(row) - row[target]. */
int ptrt_ref_cross_entropy(const ptc_type *tl, const float *logits, const int32_t *targets,
                           float *o, char *err, size_t errn)
{
    int64_t c = tl->dims[tl->rank - 1], rows = ptc_type_numel(tl) / c;
    double total = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = logits + r * c;
        int32_t t = targets[r];
        if (ptrt_ref_check_target("cross_entropy", t, r, c, err, errn) < 0)
            return -1;
        double mx;
        total += ptrt_ref_logsumexp(row, c, &mx) - row[t];
    }
    o[0] = (float)(total / (double)rows);
    return 0;
}

void ptrt_ref_mse(const ptc_type *ta, const float *a, const float *b, float *o)
{
    int64_t n = ptc_type_numel(ta);
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        total += d * d;
    }
    o[0] = (float)(total / (double)n);
}
