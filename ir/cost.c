/* cost.c - what an op costs: floating-point operations and bytes it reads and writes (see ir.h).
 *
 * Counts are the usual ones: a multiply-add is 2 flops; attention's two matrix products 4 b h s^2 dh
 * forward (halved when causal: half the scores are masked, and kernels skip them), twice that
 * backward; elementwise ops a few flops an element. They feed the planned timeline (--emit trace)
 * and pipeline stage balancing, which need relative costs, not cycle counts.
 */
#include "ir.h"

/* flops an element of the result, for the ops that are a pass over their data */
static double per_element(ptc_op op)
{
    switch (op) {
    case PTC_OP_EXP:
    case PTC_OP_LOG:
    case PTC_OP_TANH:
    case PTC_OP_SIGMOID:
    case PTC_OP_SILU:
    case PTC_OP_RSQRT:
    case PTC_OP_SQRT: return 4;
    case PTC_OP_GELU:
    case PTC_OP_GELU_GRAD:
    case PTC_OP_SILU_GRAD: return 8;
    case PTC_OP_LAYERNORM:
    case PTC_OP_RMSNORM:
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
    case PTC_OP_CROSS_ENTROPY_GRAD:
    case PTC_OP_ROPE:
    case PTC_OP_ROPE_GRAD: return 5;
    case PTC_OP_LAYERNORM_GRAD:
    case PTC_OP_RMSNORM_GRAD:
    case PTC_OP_SOFTMAX_GRAD:
    case PTC_OP_LOG_SOFTMAX_GRAD: return 8;
    case PTC_OP_ADAMW_UPDATE: return 12;
    case PTC_OP_SGD_UPDATE: return 4;
    default: return 1;
    }
}

double ptc_op_flops(ptc_op op, const ptc_attrs *a, const ptc_type *in, int nin,
                    const ptc_type *out, int nout)
{
    switch (op) {
    case PTC_OP_MATMUL: {
        const ptc_type *x = &in[0];
        return 2.0 * (double)ptc_type_numel(&out[0]) * (double)x->dims[x->rank - 1];
    }
    case PTC_OP_ATTENTION:
    case PTC_OP_ATTENTION_SHARD:
    case PTC_OP_ATTENTION_GRAD:
    case PTC_OP_ATTENTION_SHARD_GRAD: {
        const ptc_type *q = &in[0]; /* [b, s, heads_here * dh] */
        double b = (double)q->dims[0], s = (double)q->dims[1], f = (double)q->dims[2];
        double flops = 4.0 * b * s * s * f * (a->causal ? 0.5 : 1.0);
        bool grad = op == PTC_OP_ATTENTION_GRAD || op == PTC_OP_ATTENTION_SHARD_GRAD;
        return grad ? 2.0 * flops : flops;
    }
    case PTC_OP_CROSS_ENTROPY:
    case PTC_OP_CE_SUMEXP:
        return 5.0 * (double)ptc_type_numel(&in[0]);
    case PTC_OP_MOE_FFN:
    case PTC_OP_MOE_FFN_GRAD:
    case PTC_OP_MOE_EP_FFN:
    case PTC_OP_MOE_EP_FFN_GRAD: {
        /* two products a kept choice forward (x @ w_up, @ w_down); the backward recomputes
         * them and makes four more. Rows: every choice (as if none were dropped), or the rows a
         * dispatch buffer holds (the most a rank receives) */
        bool ep = op == PTC_OP_MOE_EP_FFN || op == PTC_OP_MOE_EP_FFN_GRAD;
        bool grad = op == PTC_OP_MOE_FFN_GRAD || op == PTC_OP_MOE_EP_FFN_GRAD;
        const ptc_type *up = &in[ep ? 2 : 3], *down = &in[ep ? 3 : 4];
        double rows = ep ? (double)in[0].dims[0] : (double)ptc_type_numel(&in[1]);
        double per = 2.0 * ((double)up->dims[1] * (double)up->dims[2] +
                            (double)down->dims[1] * (double)down->dims[2]);
        return rows * per * (grad ? 3.0 : 1.0);
    }
    default: break;
    }
    double n = 0;
    for (int k = 0; k < nout; k++)
        n += (double)ptc_type_numel(&out[k]);
    (void)nin;
    return per_element(op) * n;
}

double ptc_op_bytes(const ptc_type *in, int nin, const ptc_type *out, int nout)
{
    double b = 0;
    for (int k = 0; k < nin; k++)
        b += (double)ptc_type_numel(&in[k]) * ptc_dtype_size(in[k].dtype);
    for (int k = 0; k < nout; k++)
        b += (double)ptc_type_numel(&out[k]) * ptc_dtype_size(out[k].dtype);
    return b;
}

double ptc_graph_model_flops(const ptc_graph *g)
{
    double total = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_MATMUL && n->op != PTC_OP_ATTENTION && n->op != PTC_OP_MOE_FFN)
            continue;
        ptc_type in[PTC_MAX_RESULTS * 2], out[PTC_MAX_RESULTS];
        int nin = n->nin < PTC_MAX_RESULTS * 2 ? n->nin : PTC_MAX_RESULTS * 2;
        int nout = n->nout < PTC_MAX_RESULTS ? n->nout : PTC_MAX_RESULTS;
        for (int k = 0; k < nin; k++)
            in[k] = g->values[n->in[k]].type;
        for (int k = 0; k < nout; k++)
            out[k] = g->values[n->out[k]].type;
        ptc_attrs a = n->attrs;
        a.causal = false; /* PaLM's count: the masked half counts too */
        total += 3.0 * ptc_op_flops(n->op, &a, in, nin, out, nout);
    }
    return total;
}
