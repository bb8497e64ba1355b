/* ref_norm.c - reference kernels for the reductions (sum, mean, max over one axis) and the
 * normalisations (layernorm, rmsnorm, softmax, log_softmax).
 *
 * An axis op views its operand as [outer, n, inner] and works on each of the outer*inner lines of
 * n elements, so one loop serves every axis. Sums are accumulated in double; softmax subtracts the
 * line's maximum first so that exp never overflows.
 */
#include <math.h>

#include "ref_internal.h"

void ptrt_ref_reduce(ptc_op op, const ptc_type *tx, const float *x, int axis, float *o)
{
    int64_t outer, n, inner;
    ptrt_ref_axis_view(tx, axis, &outer, &n, &inner);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            const float *line = x + a * n * inner + c;
            double r = op == PTC_OP_MAX ? line[0] : 0.0;
            for (int64_t i = 0; i < n; i++) {
                double v = line[i * inner];
                if (op != PTC_OP_MAX)
                    r += v;
                else if (v > r || isnan(v)) /* NaN wins, as in NumPy and PyTorch */
                    r = v;
            }
            if (op == PTC_OP_MEAN)
                r /= (double)n;
            o[a * inner + c] = (float)r;
        }
}

void ptrt_ref_softmax(bool log_out, const ptc_type *tx, const float *x, int axis, float *o)
{
    int64_t outer, n, inner;
    ptrt_ref_axis_view(tx, axis, &outer, &n, &inner);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            const float *line = x + a * n * inner + c;
            float *oline = o + a * n * inner + c;
            double mx = line[0];
            for (int64_t i = 1; i < n; i++)
                if (line[i * inner] > mx)
                    mx = line[i * inner];
            double sum = 0;
            for (int64_t i = 0; i < n; i++)
                sum += exp(line[i * inner] - mx);
            double lse = log(sum);
            for (int64_t i = 0; i < n; i++) {
                double d = line[i * inner] - mx;
                oline[i * inner] = (float)(log_out ? d - lse : exp(d) / sum);
            }
        }
}

/* layernorm: (x - mean) / sqrt(var + eps) * g + b over the last axis, var the biased variance. */
void ptrt_ref_layernorm(const ptc_type *tx, const float *x, const float *g, const float *b,
                        double eps, float *o)
{
    int64_t d = tx->dims[tx->rank - 1], rows = ptc_type_numel(tx) / d;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * d;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++)
            mean += row[i];
        mean /= (double)d;
        for (int64_t i = 0; i < d; i++)
            var += (row[i] - mean) * (row[i] - mean);
        var /= (double)d;
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t i = 0; i < d; i++)
            o[r * d + i] = (float)((row[i] - mean) * inv * g[i] + b[i]);
    }
}

/* rmsnorm: x / sqrt(mean(x^2) + eps) * g over the last axis. */
void ptrt_ref_rmsnorm(const ptc_type *tx, const float *x, const float *g, double eps, float *o)
{
    int64_t d = tx->dims[tx->rank - 1], rows = ptc_type_numel(tx) / d;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * d;
        double ms = 0;
        for (int64_t i = 0; i < d; i++)
            ms += (double)row[i] * row[i];
        ms /= (double)d;
        double inv = 1.0 / sqrt(ms + eps);
        for (int64_t i = 0; i < d; i++)
            o[r * d + i] = (float)(row[i] * inv * g[i]);
    }
}
