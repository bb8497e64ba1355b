/* cpu.c - the fast CPU backend's dispatcher (see cpu.h and cpu_internal.h).
 *
 * f32 nodes of the ops a training step spends its time in go to the fast kernels, and casts between
 * the float formats (bit-exact with the reference's rounding); everything else (other ops over
 * bf16/f16, whose rounding the reference emulates, and the ops or broadcasts no fast kernel takes)
 * goes to the reference kernel, as does any case a fast kernel declines (a bad id or target, whose
 * message the reference writes).
 */
#include "cpu.h"

#include <string.h>

#include "backend.h"
#include "cpu_internal.h"
#include "kir.h"
#include "ref.h"

void ptrt_cpu_set_threads(int n)
{
    ptrt_cpu_pool_set_threads(n);
}

void ptrt_cpu_share_cores(void)
{
    ptrt_cpu_pool_shared();
}

/* No bf16/f16 operand or result: the fast kernels compute in float and do not round to those. */
static bool plain(const ptrt_kcall *n, const ptc_type *it, const ptc_type *ot)
{
    for (int k = 0; k < n->nin; k++)
        if (it[k].dtype == PTC_BF16 || it[k].dtype == PTC_F16)
            return false;
    for (int k = 0; k < n->nout; k++)
        if (ot[k].dtype == PTC_BF16 || ot[k].dtype == PTC_F16)
            return false;
    return true;
}

/* Runs n on a fast kernel; 0 when there is none for this case. */
static int fast(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                void *const *out)
{
    const ptc_attrs *at = &n->attrs;
    int64_t kv = at->kv_heads ? at->kv_heads : at->heads;
    switch (n->op) {
    case PTC_OP_ADD:
    case PTC_OP_SUB:
    case PTC_OP_MUL:
    case PTC_OP_DIV:
        return ot[0].dtype == PTC_F32 &&
               ptrt_cpu_binary(n->op, &it[0], in[0], &it[1], in[1], &ot[0], out[0]);
    case PTC_OP_NEG:
    case PTC_OP_RELU:
    case PTC_OP_GELU:
    case PTC_OP_SILU: return ot[0].dtype == PTC_F32 && ptrt_cpu_unary(n->op, &it[0], in[0], out[0]);
    case PTC_OP_MATMUL: return ptrt_cpu_matmul(&it[0], in[0], &it[1], in[1], &ot[0], out[0]);
    case PTC_OP_LAYERNORM: return ptrt_cpu_layernorm(&it[0], in[0], in[1], in[2], at->eps, out[0]);
    case PTC_OP_RMSNORM: return ptrt_cpu_rmsnorm(&it[0], in[0], in[1], at->eps, out[0]);
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
        return ptrt_cpu_softmax(n->op == PTC_OP_LOG_SOFTMAX, &it[0], in[0], (int)at->axis, out[0]);
    case PTC_OP_RESHAPE: return ptrt_cpu_copy(ptc_type_numel(&it[0]) * 4, in[0], out[0]);
    case PTC_OP_CONCAT:
        return ptrt_cpu_concat(n->nin, it, (const void *const *)in, (int)at->axis, out[0]);
    case PTC_OP_TRANSPOSE: return ptrt_cpu_transpose(&it[0], in[0], out[0]);
    case PTC_OP_EMBEDDING: return ptrt_cpu_embedding(&it[0], in[0], &it[1], in[1], out[0]);
    case PTC_OP_ATTENTION:
        return ptrt_cpu_attention(it, in, ot, out[0], at->heads, kv, at->causal);
    case PTC_OP_ROPE: return ptrt_cpu_rope(&it[0], in[0], at->heads, at->base, false, out[0]);
    case PTC_OP_CROSS_ENTROPY: return ptrt_cpu_cross_entropy(&it[0], in[0], in[1], out[0]);
    case PTC_OP_SUM_TO: return ptrt_cpu_sum_to(&it[0], in[0], &ot[0], out[0]);
    case PTC_OP_SUMSQ: return ptrt_cpu_sumsq(&it[0], in[0], out[0]);
    case PTC_OP_RELU_GRAD:
    case PTC_OP_GELU_GRAD:
    case PTC_OP_SILU_GRAD: return ptrt_cpu_unary_grad(n->op, &it[0], in[0], in[1], out[0]);
    case PTC_OP_LAYERNORM_GRAD:
    case PTC_OP_RMSNORM_GRAD:
        return ptrt_cpu_norm_grad(n->op == PTC_OP_RMSNORM_GRAD, it, in, ot, out, at->eps);
    case PTC_OP_EMBEDDING_GRAD:
        return ptrt_cpu_embedding_grad(&it[0], in[0], in[1], &ot[0], out[0]);
    case PTC_OP_ATTENTION_GRAD:
        return ptrt_cpu_attention_grad(it, in, ot, out, at->heads, kv, at->causal);
    case PTC_OP_ROPE_GRAD: return ptrt_cpu_rope(&it[0], in[0], at->heads, at->base, true, out[0]);
    case PTC_OP_CROSS_ENTROPY_GRAD:
        return ptrt_cpu_cross_entropy_grad(&it[0], in[0], in[1], in[2], out[0]);
    case PTC_OP_ADAMW_UPDATE: return ptrt_cpu_adamw(n, it, in, out);
    case PTC_OP_MOE_FFN:
    case PTC_OP_MOE_FFN_GRAD:
    case PTC_OP_MOE_EP_FFN:
    case PTC_OP_MOE_EP_FFN_GRAD: return ptrt_cpu_moe(n, it, in, ot, out);
    default: return 0;
    }
}

/* Runs n over 16-bit operands on a kernel that reads and writes them itself, with no f32 copy of
 * them (attention: of a few rows at a time); 0 when there is none for this case. */
static int sixteen(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                   void *const *out)
{
    switch (n->op) {
    case PTC_OP_ATTENTION:
    case PTC_OP_ATTENTION_GRAD: return fast(n, it, in, ot, out); /* (any dtype of each operand) */
    case PTC_OP_CONCAT: /* one 16-bit dtype: the bits moved as they are */
        return ot[0].dtype == it[0].dtype &&
               ptrt_cpu_concat(n->nin, it, (const void *const *)in, (int)n->attrs.axis, out[0]);
    case PTC_OP_SUM_TO: return ptrt_cpu_sum_to(&it[0], in[0], &ot[0], out[0]);
    case PTC_OP_SUMSQ: return ot[0].dtype == PTC_F32 && ptrt_cpu_sumsq(&it[0], in[0], out[0]);
    case PTC_OP_LAYERNORM_GRAD:
    case PTC_OP_RMSNORM_GRAD:
        return ptrt_cpu_norm_grad(n->op == PTC_OP_RMSNORM_GRAD, it, in, ot, out, n->attrs.eps);
    default: return 0;
    }
}

int ptrt_cpu_run(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                 void *const *out, char *err, size_t errn)
{
    if (n->op == PTC_OP_CAST          ? ptrt_cpu_cast(&it[0], in[0], ot[0].dtype, out[0])
        : plain(n, it, ot) ? fast(n, it, in, ot, out)
                           : sixteen(n, it, in, ot, out)) {
        if (errn)
            err[0] = '\0';
        return 0;
    }
    if (ptrt_storage16(n, it)) /* (widened, run on the fast kernel, rounded into storage) */
        return ptrt_run_storage16(ptrt_cpu_run, ptrt_cpu_cast, n, it, in, ot, out, err, errn);
    return ptrt_ref_run(n, it, in, ot, out, err, errn);
}

typedef struct interp_job {
    const ptc_kir *k;
    void *const *args;
    int nt;
    int failed;
    char err[512];
} interp_job;

static void interp_piece(void *ctx, int64_t begin, int64_t end)
{
    interp_job *j = ctx;
    for (int64_t t = begin; t < end; t++) {
        char msg[512];
        if (ptc_kir_run(j->k, j->args, (int)t, j->nt, msg, sizeof msg) < 0 &&
            !__atomic_exchange_n(&j->failed, 1, __ATOMIC_SEQ_CST))
            ptc_fmt(j->err, sizeof j->err, "%s", msg);
    }
}

int ptrt_fused_interp_parallel(void *state, const ptc_plan *p, int k, void *const *args,
                               char *err, size_t errn)
{
    interp_job j = {.k = p->kernels[k], .args = args, .nt = ptrt_cpu_threads()};
    ptrt_cpu_parallel_for(j.nt, 1, interp_piece, &j);
    if (j.failed)
        ptc_fmt(err, errn, "%s", j.err);
    return j.failed ? -1 : 0;
}

const ptrt_backend ptrt_backend_cpu = {
    .name = "cpu",
    .kernel = ptrt_cpu_run,
    .gemm = ptrt_cpu_gemm_instr,
    .alloc = ptrt_host_alloc,
    .free = ptrt_host_free,
    .host = true,
    .fused = ptrt_fused_interp_parallel,
};
