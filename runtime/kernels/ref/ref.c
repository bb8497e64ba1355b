/* ref.c - the CPU reference: one switch that sends every op of ops.def to its plain kernel, the
 * rounding to bf16/f16 and the 16-bit storage formats, casts, the source ops and the GEMM. The
 * internal ops (after "internal ops" in ops.def: backward ops, optimizer updates) go on to
 * ptrt_ref_run_internal in ref_grad.c, the rank-dependent ones to ref_spmd.c.
 *
 * Low precision: a plan stores bf16 and f16 tensors in 2 bytes and converts them with casts; every
 * other kernel computes in double (or float) on float arrays. A kernel called with bf16/f16 types
 * (as the unit tests do) treats its operands as floats holding such values and rounds its results
 * to that format here, once, after the kernel: the rounding a cast to 16-bit storage applies.
 */
#include <math.h>
#include <string.h>

#include "half.h"
#include "ref_grad.h"
#include "ref_internal.h"

void ptrt_ref_axis_view(const ptc_type *t, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    PTC_ASSERT(axis >= 0 && axis < t->rank);
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= t->dims[i];
    for (int i = axis + 1; i < t->rank; i++)
        *inner *= t->dims[i];
    *n = t->dims[axis];
}

void ptrt_ref_strides(const ptc_type *t, int64_t *strides)
{
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= t->dims[i];
    }
}

double ptrt_ref_round_bf16d(double x)
{
    return ptc_round_bf16(x);
}

double ptrt_ref_round_f16d(double x)
{
    return ptc_round_f16(x);
}

/* A double to a floating dtype's stored float: rounded once, to that dtype's precision. */
static float to_float_dtype(double v, ptc_dtype t)
{
    switch (t) {
    case PTC_BF16: return (float)ptrt_ref_round_bf16d(v);
    case PTC_F16: return (float)ptrt_ref_round_f16d(v);
    default: return (float)v;
    }
}

/* Element i of x, stored as dtype t, as a double. */
static double load_elem(const void *x, ptc_dtype t, int64_t i)
{
    switch (t) {
    case PTC_I32: return ((const int32_t *)x)[i];
    case PTC_BF16: return ptc_bf16_value(((const uint16_t *)x)[i]);
    case PTC_F16: return ptc_f16_value(((const uint16_t *)x)[i]);
    default: return ((const float *)x)[i];
    }
}

int32_t ptrt_ref_to_i32(double v)
{
    if (isnan(v))
        return 0;
    if (v >= 2147483647.0)
        return INT32_MAX;
    if (v <= -2147483648.0)
        return INT32_MIN;
    return (int32_t)trunc(v);
}

/* Casts read and write the storage of their dtypes: bf16 and f16 in 2 bytes. A value is rounded
 * once, from the double it is exactly. */
static void ref_cast(const ptc_type *ti, const void *x, const ptc_type *to, void *o)
{
    int64_t n = ptc_type_numel(ti);
    for (int64_t i = 0; i < n; i++) {
        double v = load_elem(x, ti->dtype, i);
        switch (to->dtype) {
        case PTC_I32:
            ((int32_t *)o)[i] =
                ti->dtype == PTC_I32 ? ((const int32_t *)x)[i] : ptrt_ref_to_i32(v);
            break;
        case PTC_BF16: ((uint16_t *)o)[i] = ptc_bf16_bits(v); break;
        case PTC_F16: ((uint16_t *)o)[i] = ptc_f16_bits(v); break;
        default: ((float *)o)[i] = (float)v;
        }
    }
}

static void ref_const(const ptc_attrs *at, const ptc_type *to, void *o)
{
    int64_t n = ptc_type_numel(to);
    for (int64_t i = 0; i < n; i++) {
        if (to->dtype == PTC_I32)
            ((int32_t *)o)[i] = ptrt_ref_to_i32(at->value);
        else
            ((float *)o)[i] = to_float_dtype(at->value, to->dtype);
    }
}

void ptrt_ref_round_results(int nout, const ptc_type *ot, void *const *out)
{
    for (int j = 0; j < nout; j++) {
        if (ot[j].dtype != PTC_BF16 && ot[j].dtype != PTC_F16)
            continue;
        float *o = out[j];
        int64_t n = ptc_type_numel(&ot[j]);
        for (int64_t i = 0; i < n; i++)
            o[i] = to_float_dtype(o[i], ot[j].dtype);
    }
}

int ptrt_ref_run(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                 void *const *out, char *err, size_t errn)
{
    const ptc_attrs *at = &n->attrs;
    const char *name = (unsigned)n->op < PTC_NOPS ? ptc_ops[n->op].name : "?";
    int rc = 0;
    if (errn)
        err[0] = '\0';
    switch (n->op) {
    case PTC_OP_INPUT:
    case PTC_OP_PARAM:
        ptc_fmt(err, errn, "%s is a source op: the executor fills it, there is no kernel to run",
                name);
        return -1;
    case PTC_OP_CONST: ref_const(at, &ot[0], out[0]); break;
    case PTC_OP_ADD:
    case PTC_OP_SUB:
    case PTC_OP_MUL:
    case PTC_OP_DIV: ptrt_ref_binary(n->op, &it[0], in[0], &it[1], in[1], &ot[0], out[0]); break;
    case PTC_OP_NEG:
    case PTC_OP_EXP:
    case PTC_OP_LOG:
    case PTC_OP_SQRT:
    case PTC_OP_RSQRT:
    case PTC_OP_TANH:
    case PTC_OP_SIGMOID:
    case PTC_OP_RELU:
    case PTC_OP_GELU:
    case PTC_OP_SILU: ptrt_ref_unary(n->op, ptc_type_numel(&it[0]), in[0], out[0]); break;
    case PTC_OP_MATMUL: ptrt_ref_matmul(&it[0], in[0], &it[1], in[1], &ot[0], out[0]); break;
    case PTC_OP_CAST: ref_cast(&it[0], in[0], &ot[0], out[0]); break;
    case PTC_OP_SUM:
    case PTC_OP_MEAN:
    case PTC_OP_MAX: ptrt_ref_reduce(n->op, &it[0], in[0], (int)at->axis, out[0]); break;
    case PTC_OP_LAYERNORM: ptrt_ref_layernorm(&it[0], in[0], in[1], in[2], at->eps, out[0]); break;
    case PTC_OP_RMSNORM: ptrt_ref_rmsnorm(&it[0], in[0], in[1], at->eps, out[0]); break;
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
        ptrt_ref_softmax(n->op == PTC_OP_LOG_SOFTMAX, &it[0], in[0], (int)at->axis, out[0]);
        break;
    case PTC_OP_RESHAPE:
        memcpy(out[0], in[0], (size_t)ptc_type_numel(&it[0]) * PTRT_REF_ELEM);
        break;
    case PTC_OP_TRANSPOSE: ptrt_ref_transpose(&it[0], in[0], out[0]); break;
    case PTC_OP_PERMUTE: ptrt_ref_permute(&it[0], in[0], at->shape, out[0]); break;
    case PTC_OP_SPLIT: ptrt_ref_split(&it[0], in[0], (int)at->axis, n->nout, out); break;
    case PTC_OP_CONCAT:
        ptrt_ref_concat(n->nin, it, (const void *const *)in, (int)at->axis, out[0]);
        break;
    case PTC_OP_SLICE:
        ptrt_ref_slice(&it[0], in[0], (int)at->axis, at->start, at->len, out[0]);
        break;
    case PTC_OP_EMBEDDING:
        rc = ptrt_ref_embedding(&it[0], in[0], &it[1], in[1], out[0], err, errn);
        break;
    case PTC_OP_ATTENTION:
        ptrt_ref_attention(&it[0], in[0], &it[1], in[1], in[2], at->heads,
                           at->kv_heads ? at->kv_heads : at->heads, at->causal, out[0]);
        break;
    case PTC_OP_ROPE: ptrt_ref_rope(&it[0], in[0], at->heads, at->base, out[0]); break;
    case PTC_OP_CROSS_ENTROPY:
        rc = ptrt_ref_cross_entropy(&it[0], in[0], in[1], out[0], err, errn);
        break;
    case PTC_OP_MSE: ptrt_ref_mse(&it[0], in[0], in[1], out[0]); break;
    default:
        /* moe and its pieces in ref_moe.c; rank-dependent ops in ref_spmd.c; the other internal
         * ops (autodiff, optimizer) in ref_grad.c */
        if (ptc_op_is_moe(n->op))
            return ptrt_ref_run_moe(n, it, in, ot, out, err, errn);
        if (ptc_ops[n->op].flags & (PTC_F_RANKDEP | PTC_F_SPMD))
            return ptrt_ref_run_spmd(n, it, in, ot, out, err, errn);
        return ptrt_ref_run_internal(n, it, in, ot, out, err, errn);
    }
    if (rc == 0 && n->op != PTC_OP_CAST)
        ptrt_ref_round_results(n->nout, ot, out);
    return rc;
}

/* Element i of a GEMM operand of dtype ab (f32, or bf16 or f16 storage). */
static double gemm_at(const void *x, uint8_t ab, int64_t i)
{
    return ab == PTC_BF16  ? ptc_bf16_value(((const uint16_t *)x)[i])
           : ab == PTC_F16 ? ptc_f16_value(((const uint16_t *)x)[i])
                           : ((const float *)x)[i];
}

void ptrt_ref_gemm(const ptc_gemm *g, const void *a, const void *b, void *c)
{
    for (int64_t bi = 0; bi < g->batch; bi++) {
        int64_t oa = bi * g->sa, ob = bi * g->sb;
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++) {
                double s = 0;
                for (int64_t p = 0; p < g->k; p++)
                    s += gemm_at(a, g->ab, oa + (g->ta ? p * g->lda + i : i * g->lda + p)) *
                         gemm_at(b, g->ab, ob + (g->tb ? j * g->ldb + p : p * g->ldb + j));
                int64_t at = bi * g->sc + i * g->ldc + j;
                if (g->cd == PTC_F32) {
                    float *pc = (float *)c + at;
                    *pc = (float)(g->alpha * s + (g->beta != 0 ? g->beta * *pc : 0));
                    continue;
                }
                float v = (float)(g->alpha * s); /* (16-bit results: beta is 0) */
                ((uint16_t *)c)[at] = g->cd == PTC_BF16 ? ptc_bf16_bits(v) : ptc_f16_bits(v);
            }
    }
}
