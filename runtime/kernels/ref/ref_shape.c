/* ref_shape.c - reference kernels for the ops that only move elements: transpose, permute, split,
 * concat, slice (reshape is a plain copy in ref.c).
 *
 * Every element of the reference storage is 4 bytes (float or int32_t), so these move bytes with
 * memcpy and serve every dtype alike, bit for bit. Split, concat and slice view the tensor as
 * [outer, n, inner] around their axis and copy contiguous runs of whole inner blocks.
 */
#include <string.h>

#include "ref_internal.h"

#define E PTRT_REF_ELEM

/* [..., r, c] -> [..., c, r] */
void ptrt_ref_transpose(const ptc_type *tx, const void *x, void *o)
{
    const char *src = x;
    char *dst = o;
    int64_t r = tx->dims[tx->rank - 2], c = tx->dims[tx->rank - 1];
    int64_t batches = ptc_type_numel(tx) / (r * c);
    for (int64_t b = 0; b < batches; b++)
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++)
                memcpy(dst + (b * r * c + j * r + i) * E, src + (b * r * c + i * c + j) * E, E);
}

/* Result dim i is operand dim axes[i]. */
void ptrt_ref_permute(const ptc_type *tx, const void *x, const int64_t *axes, void *o)
{
    const char *src = x;
    char *dst = o;
    int rank = tx->rank;
    int64_t sx[PTC_MAX_RANK], odims[PTC_MAX_RANK];
    ptrt_ref_strides(tx, sx);
    for (int i = 0; i < rank; i++) {
        PTC_ASSERT(axes[i] >= 0 && axes[i] < rank);
        odims[i] = tx->dims[axes[i]];
    }
    int64_t n = ptc_type_numel(tx);
    for (int64_t i = 0; i < n; i++) {
        int64_t rest = i, off = 0;
        for (int d = rank - 1; d >= 0; d--) {
            off += (rest % odims[d]) * sx[axes[d]];
            rest /= odims[d];
        }
        memcpy(dst + i * E, src + off * E, E);
    }
}

void ptrt_ref_split(const ptc_type *tx, const void *x, int axis, int nout, void *const *out)
{
    const char *src = x;
    int64_t outer, n, inner;
    ptrt_ref_axis_view(tx, axis, &outer, &n, &inner);
    PTC_ASSERT(nout > 0 && n % nout == 0);
    int64_t part = n / nout;
    for (int j = 0; j < nout; j++) {
        char *dst = out[j];
        for (int64_t a = 0; a < outer; a++)
            memcpy(dst + a * part * inner * E, src + (a * n + j * part) * inner * E,
                   (size_t)(part * inner * E));
    }
}

void ptrt_ref_concat(int nin, const ptc_type *it, const void *const *in, int axis, void *o)
{
    char *dst = o;
    int64_t outer, n0, inner, total = 0;
    ptrt_ref_axis_view(&it[0], axis, &outer, &n0, &inner);
    for (int i = 0; i < nin; i++)
        total += it[i].dims[axis];
    for (int64_t a = 0; a < outer; a++) {
        int64_t at = 0; /* where operand i starts along the axis */
        for (int i = 0; i < nin; i++) {
            int64_t ni = it[i].dims[axis];
            const char *src = in[i];
            memcpy(dst + (a * total + at) * inner * E, src + a * ni * inner * E,
                   (size_t)(ni * inner * E));
            at += ni;
        }
    }
}

void ptrt_ref_slice(const ptc_type *tx, const void *x, int axis, int64_t start, int64_t len,
                    void *o)
{
    const char *src = x;
    char *dst = o;
    int64_t outer, n, inner;
    ptrt_ref_axis_view(tx, axis, &outer, &n, &inner);
    PTC_ASSERT(start >= 0 && len >= 0 && start + len <= n);
    for (int64_t a = 0; a < outer; a++)
        memcpy(dst + a * len * inner * E, src + (a * n + start) * inner * E,
               (size_t)(len * inner * E));
}
