/* ref_elementwise.c - reference kernels for the elementwise ops (with NumPy broadcasting) and
 * matmul (with broadcast leading dims).
 *
 * Broadcasting is done the plain way: every result element is decomposed into its coordinates and
 * each operand is read at those coordinates with stride 0 along the dims where it has size 1 or
 * lacks the dim. Arithmetic is in double; results are stored as float (ref.c rounds them further
 * when the result is bf16/f16).
 */
#include <math.h>

#include "ref_internal.h"

/* Strides of the leading t->rank - skip dims of t, aligned to the leading orank dims of a result
 * (right-aligned as NumPy does): 0 where t has size 1 or lacks the dim. */
static void bcast_strides(const ptc_type *t, int skip, int orank, int64_t *st)
{
    int64_t s[PTC_MAX_RANK];
    ptrt_ref_strides(t, s);
    int trank = t->rank - skip, off = orank - trank;
    PTC_ASSERT(off >= 0);
    for (int i = 0; i < orank; i++) {
        int ti = i - off;
        st[i] = ti < 0 || t->dims[ti] == 1 ? 0 : s[ti];
    }
}

/* The offset (with strides st) of element i of a row-major index space of the given dims. */
static int64_t bcast_offset(int64_t i, const int64_t *dims, int rank, const int64_t *st)
{
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; d--) {
        off += (i % dims[d]) * st[d];
        i /= dims[d];
    }
    return off;
}

void ptrt_ref_binary(ptc_op op, const ptc_type *ta, const float *a, const ptc_type *tb,
                     const float *b, const ptc_type *to, float *o)
{
    int64_t sa[PTC_MAX_RANK], sb[PTC_MAX_RANK];
    bcast_strides(ta, 0, to->rank, sa);
    bcast_strides(tb, 0, to->rank, sb);
    int64_t n = ptc_type_numel(to);
    for (int64_t i = 0; i < n; i++) {
        double x = a[bcast_offset(i, to->dims, to->rank, sa)];
        double y = b[bcast_offset(i, to->dims, to->rank, sb)];
        double r;
        switch (op) {
        case PTC_OP_ADD: r = x + y; break;
        case PTC_OP_SUB: r = x - y; break;
        case PTC_OP_MUL: r = x * y; break;
        case PTC_OP_DIV: r = x / y; break;
        default: PTC_UNREACHABLE("not a binary op");
        }
        o[i] = (float)r;
    }
}

static double sigmoid(double x)
{
    /* the two forms keep exp's argument non-positive, so neither overflows */
    if (x >= 0)
        return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static double unary(ptc_op op, double x)
{
    switch (op) {
    case PTC_OP_NEG: return -x;
    case PTC_OP_EXP: return exp(x);
    case PTC_OP_LOG: return log(x);
    case PTC_OP_SQRT: return sqrt(x);
    case PTC_OP_RSQRT: return 1.0 / sqrt(x);
    case PTC_OP_TANH: return tanh(x);
    case PTC_OP_SIGMOID: return sigmoid(x);
    case PTC_OP_RELU: return x < 0 ? 0.0 : x; /* NaN passes through */
    case PTC_OP_GELU: {
        /* the tanh approximation of GPT-2, exactly as the language page gives it */
        const double c = sqrt(2.0 / 3.14159265358979323846);
        return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
    }
    case PTC_OP_SILU: return x * sigmoid(x);
    default: PTC_UNREACHABLE("not a unary op");
    }
}

double ptrt_ref_unary1(ptc_op op, double x)
{
    return unary(op, x);
}

void ptrt_ref_unary(ptc_op op, int64_t n, const float *x, float *o)
{
    for (int64_t i = 0; i < n; i++)
        o[i] = (float)unary(op, x[i]);
}

/* [..., m, k] @ [..., k, n] -> [..., m, n], the leading dims broadcasting as elementwise ones. */
void ptrt_ref_matmul(const ptc_type *ta, const float *a, const ptc_type *tb, const float *b,
                     const ptc_type *to, float *o)
{
    int lead = to->rank - 2;
    int64_t m = to->dims[lead], n = to->dims[lead + 1], k = ta->dims[ta->rank - 1];
    PTC_ASSERT(tb->dims[tb->rank - 2] == k && ta->dims[ta->rank - 2] == m &&
               tb->dims[tb->rank - 1] == n);
    int64_t sa[PTC_MAX_RANK], sb[PTC_MAX_RANK];
    bcast_strides(ta, 2, lead, sa);
    bcast_strides(tb, 2, lead, sb);
    int64_t batches = 1;
    for (int d = 0; d < lead; d++)
        batches *= to->dims[d];
    for (int64_t bi = 0; bi < batches; bi++) {
        const float *pa = a + bcast_offset(bi, to->dims, lead, sa);
        const float *pb = b + bcast_offset(bi, to->dims, lead, sb);
        float *po = o + bi * m * n;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++)
                    s += (double)pa[i * k + p] * pb[p * n + j];
                po[i * n + j] = (float)s;
            }
    }
}
