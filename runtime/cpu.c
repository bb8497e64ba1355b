/* cpu.c - the fast CPU backend (see cpu.h).
 *
 * Matmul with NumPy-style broadcasting of the leading dimensions becomes one sgemm per distinct
 * pair of matrices: when the right operand is a single matrix (the common x[B,S,d] @ w[d,f]), the
 * left operand's leading dims are folded into the rows and it is one sgemm in all. Transposes
 * that feed a matmul are not fused yet; the reference transpose copies.
 */
#include "cpu.h"

#include <string.h>

#include "ref.h"

#ifdef PTC_HAVE_OPENBLAS
#include <cblas.h>
#endif

int ptrt_cpu_has_blas(void)
{
#ifdef PTC_HAVE_OPENBLAS
    return 1;
#else
    return 0;
#endif
}

void ptrt_cpu_set_threads(int n)
{
#ifdef PTC_HAVE_OPENBLAS
    if (n > 0)
        openblas_set_num_threads(n);
#else
    (void)n;
#endif
}

#ifdef PTC_HAVE_OPENBLAS
/* Offset (in elements) of the matrix at flat batch index b of a broadcast operand. */
static int64_t batch_offset(const ptc_type *t, const ptc_type *o, int64_t b, int64_t mat)
{
    int lead = o->rank - 2, tlead = t->rank - 2;
    int64_t off = 0, stride = 1;
    for (int i = lead - 1; i >= 0; i--) {
        int64_t idx = b % o->dims[i];
        b /= o->dims[i];
        int ti = i - (lead - tlead);
        if (ti >= 0) {
            if (t->dims[ti] != 1)
                off += idx * stride;
            stride *= t->dims[ti];
        }
    }
    return off * mat;
}

static int matmul(const ptc_type *it, void *const *in, const ptc_type *ot, void *const *out)
{
    const ptc_type *a = &it[0], *b = &it[1], *o = &ot[0];
    int64_t m = a->dims[a->rank - 2], k = a->dims[a->rank - 1], n = b->dims[b->rank - 1];
    const float *A = in[0], *Bm = in[1];
    float *C = out[0];
    if (b->rank == 2) { /* fold all of A's leading dims into rows */
        int64_t rows = ptc_type_numel(a) / k;
        if (ptc_type_numel(o) == rows * n) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)n, (int)k, 1.0f,
                        A, (int)k, Bm, (int)n, 0.0f, C, (int)n);
            return 0;
        }
    }
    int64_t batches = ptc_type_numel(o) / (m * n);
    for (int64_t bi = 0; bi < batches; bi++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f,
                    A + batch_offset(a, o, bi, m * k), (int)k, Bm + batch_offset(b, o, bi, k * n),
                    (int)n, 0.0f, C + bi * m * n, (int)n);
    return 0;
}
#endif

int ptrt_cpu_run(const ptc_node *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                 void *const *out, char *err, size_t errn)
{
#ifdef PTC_HAVE_OPENBLAS
    /* bf16/f16 math must round like the reference: leave those to it */
    if (n->op == PTC_OP_MATMUL && ot[0].dtype == PTC_F32)
        return matmul(it, in, ot, out);
#endif
    return ptrt_ref_run(n, it, in, ot, out, err, errn);
}
