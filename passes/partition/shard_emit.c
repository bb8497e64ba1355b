/* shard_emit.c - rank programs for ops whose partitioned form is more than the same op on local
 * shapes (the EMIT_CUSTOM cases of shard_rules.c):
 *   - mean over a sharded axis: the local mean scaled by 1/T (Partial); max: local max + allreduce
 *   - a loss (cross_entropy, mse) over sharded positions: the local loss scaled by 1/T (Partial);
 *     its gradient: the local gradient of dloss/T
 *   - vocabulary-parallel embedding and its gradient (this rank's rows of the table)
 *   - vocabulary-parallel cross-entropy: three small allreduces over rows (max, sum of
 *     exponentials, the target's logit) instead of gathering the logits; the gradient reuses the
 *     forward's row statistics
 *   - attention whose key/value heads do not divide by the axis: every rank keeps all k/v heads
 *     and attends with its own query heads; k/v gradients come out Partial;
 *   - an allreduce over an inner expert-parallel axis of a value Partial here as well: one
 *     allreduce over both axes (a group of dp x ep ranks);
 *   - moe's experts split over an ep axis (shard_moe.c).
 */
#include <string.h>

#include "partition.h"

static const ptc_node *node(const part *p, int ni)
{
    return &part_graph(p)->nodes[ni];
}

static ptc_attrs axis_attrs(const part *p, ptc_op op)
{
    ptc_attrs at = ptc_attrs_default(op);
    at.mesh_axis = part_axis(p);
    at.group = part_size(p);
    return at;
}

/* Operands of node n in the placements the rule required; false after an error. */
static bool operands(part *p, const ptc_node *n, const rule_out *ro, int *ins)
{
    int old[PTC_MAX_RESULTS * 2];
    memcpy(old, n->in, sizeof(int) * (size_t)n->nin);
    int nin = n->nin;
    for (int k = 0; k < nin; k++)
        if ((ins[k] = part_obtain(p, old[k], ro->req[k])) < 0)
            return false;
    return true;
}

static int scaled(part *p, int v, double s, ptc_loc loc)
{
    int c = part_const(p, s, part_out(p)->values[v].type.dtype, loc); /* (v's dtype: bf16 too) */
    return c < 0 ? -1 : part_emit(p, PTC_OP_MUL, (int[]){v, c}, 2, NULL, loc, NULL);
}

static int emit_reduce(part *p, const ptc_node *n, const rule_out *ro, int *ins)
{
    ptc_attrs at = n->attrs;
    int r = part_emit(p, n->op, ins, 1, &at, n->loc, NULL);
    if (r < 0)
        return -1;
    /* placed like the result on the other axes (not like the operand, whose shards on an inner
     * data-parallel axis the reduction removed) */
    part_set_place(p, r, n->out[0], n->op == PTC_OP_MEAN ? pl_p() : pl_r());
    if (n->op == PTC_OP_MEAN)
        return scaled(p, r, 1.0 / part_size(p), n->loc);
    ptc_attrs ar = axis_attrs(p, PTC_OP_ALLREDUCE);
    ar.reduce = 1; /* max */
    return part_emit(p, PTC_OP_ALLREDUCE, &r, 1, &ar, n->loc, NULL);
}

static int emit_vocab_ce(part *p, const ptc_node *n, const int *ins)
{
    ptc_loc loc = n->loc;
    const ptc_type *tl = &part_graph(p)->values[n->in[0]].type;
    ptc_attrs mx = ptc_attrs_default(PTC_OP_MAX);
    mx.axis = tl->rank - 1;
    ptc_attrs sum = axis_attrs(p, PTC_OP_ALLREDUCE), max = sum;
    max.reduce = 1;
    int m0 = part_emit(p, PTC_OP_MAX, &ins[0], 1, &mx, loc, NULL);
    int m = m0 < 0 ? -1 : part_emit(p, PTC_OP_ALLREDUCE, &m0, 1, &max, loc, NULL);
    int s0 = m < 0 ? -1 : part_emit(p, PTC_OP_CE_SUMEXP, (int[]){ins[0], m}, 2, NULL, loc, NULL);
    int s = s0 < 0 ? -1 : part_emit(p, PTC_OP_ALLREDUCE, &s0, 1, &sum, loc, NULL);
    ptc_attrs pick = axis_attrs(p, PTC_OP_CE_PICK);
    int t0 =
        s < 0 ? -1 : part_emit(p, PTC_OP_CE_PICK, (int[]){ins[0], ins[1]}, 2, &pick, loc, NULL);
    int t = t0 < 0 ? -1 : part_emit(p, PTC_OP_ALLREDUCE, &t0, 1, &sum, loc, NULL);
    if (t < 0)
        return -1;
    return part_emit(p, PTC_OP_CE_LOSS, (int[]){m, s, t}, 3, NULL, loc, NULL);
}

/* The row statistics (M, S) that the vocabulary-parallel cross-entropy computed from the rank's
 * logits nl, read back from the program emitted so far (the ce_sumexp of nl and the allreduce of
 * its result), so the gradient reuses them without a side table; false if there is none. */
static bool ce_stats(const part *p, int nl, int *m, int *s)
{
    const ptc_graph *g = part_out(p);
    int sumexp = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op == PTC_OP_CE_SUMEXP && n->in[0] == nl && sumexp < 0) {
            *m = n->in[1];
            sumexp = n->out[0];
        } else if (n->op == PTC_OP_ALLREDUCE && sumexp >= 0 && n->in[0] == sumexp) {
            *s = n->out[0];
            return true;
        }
    }
    return false;
}

/* sumsq of a shard with a remainder: the rank's own slices, plus the remainder (held by every
 * rank) counted on coordinate 0 only, so the sum over the axis counts every element once. */
static int emit_sumsq_rem(part *p, const ptc_node *n, const rule_out *ro, const int *ins)
{
    ptc_placement x = ro->req[0];
    const ptc_type *t = &part_out(p)->values[ins[0]].type;
    int64_t q = t->dims[x.dim] - x.rem;
    int part[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
        ptc_attrs sl = ptc_attrs_default(PTC_OP_SLICE);
        sl.axis = x.dim;
        sl.start = k ? q : 0;
        sl.len = k ? x.rem : q;
        int s = part_emit(p, PTC_OP_SLICE, &ins[0], 1, &sl, n->loc, NULL);
        part_set_place(p, s, -1, k ? pl_r() : pl_s(x.dim, 1));
        part[k] = s < 0 ? -1 : part_emit(p, PTC_OP_SUMSQ, &s, 1, NULL, n->loc, NULL);
        if (part[k] < 0)
            return -1;
        part_set_place(p, part[k], n->out[0], k ? pl_r() : pl_p());
    }
    ptc_attrs pa = axis_attrs(p, PTC_OP_PARTIALIZE);
    int tail = part_emit(p, PTC_OP_PARTIALIZE, &part[1], 1, &pa, n->loc, NULL);
    part_set_place(p, tail, n->out[0], pl_p());
    return tail < 0 ? -1 : part_emit(p, PTC_OP_ADD, (int[]){part[0], tail}, 2, NULL, n->loc, NULL);
}

int ptc_shard_emit_custom(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    if (n->op == PTC_OP_MOE_FFN || n->op == PTC_OP_MOE_FFN_GRAD)
        return ptc_shard_emit_moe(p, ni, ro);
    int ins[PTC_MAX_RESULTS * 2], outs[PTC_MAX_RESULTS];
    ptc_node copy = *n;
    if (!operands(p, &copy, ro, ins))
        return -1;
    n = node(p, ni);
    int T = part_size(p), r = -1;
    ptc_attrs at;
    (void)in;
    switch (copy.op) {
    case PTC_OP_MEAN:
    case PTC_OP_MAX: r = emit_reduce(p, &copy, ro, ins); break;
    case PTC_OP_SUMSQ: r = emit_sumsq_rem(p, &copy, ro, ins); break;
    case PTC_OP_ALLREDUCE: /* over an inner ep axis and this one at once: one group */
    case PTC_OP_ALLGATHER:
    case PTC_OP_REDUCE_SCATTER:
        at = copy.attrs;
        at.mesh_axis2 = part_axis(p);
        at.group = copy.attrs.group * T;
        r = part_emit(p, copy.op, ins, 1, &at, copy.loc, NULL);
        break;
    case PTC_OP_EMBEDDING:
        at = axis_attrs(p, PTC_OP_EMBEDDING_SHARD);
        r = part_emit(p, PTC_OP_EMBEDDING_SHARD, ins, 2, &at, copy.loc, NULL);
        break;
    case PTC_OP_EMBEDDING_GRAD:
        at = axis_attrs(p, PTC_OP_EMBEDDING_GRAD_SHARD);
        at.n = copy.attrs.n / T;
        r = part_emit(p, PTC_OP_EMBEDDING_GRAD_SHARD, ins, 2, &at, copy.loc, NULL);
        break;
    case PTC_OP_ATTENTION:
    case PTC_OP_ATTENTION_GRAD: {
        ptc_op op =
            copy.op == PTC_OP_ATTENTION ? PTC_OP_ATTENTION_SHARD : PTC_OP_ATTENTION_SHARD_GRAD;
        at = axis_attrs(p, op);
        at.n = copy.attrs.heads;
        at.heads = copy.attrs.heads / T;
        at.kv_heads = copy.attrs.kv_heads ? copy.attrs.kv_heads : copy.attrs.heads;
        at.causal = copy.attrs.causal;
        if (part_emit(p, op, ins, copy.nin, &at, copy.loc, outs) < 0)
            return -1;
        for (int k = 0; k < copy.nout; k++)
            part_bind(p, copy.out[k], outs[k], ro->out[k]);
        return 0;
    }
    case PTC_OP_CROSS_ENTROPY:
    case PTC_OP_MSE:
    case PTC_OP_CE_LOSS:
        if (copy.op == PTC_OP_CROSS_ENTROPY && ro->req[0].kind == PTC_PLACE_SHARD &&
            ro->req[0].dim == part_graph(p)->values[copy.in[0]].type.rank - 1 &&
            part_axis_kind(p) == PART_TENSOR) {
            r = emit_vocab_ce(p, &copy, ins);
            break;
        }
        r = part_emit(p, copy.op, ins, copy.nin, &copy.attrs, copy.loc, NULL);
        /* a scalar: not the operands' placements on the axes partitioned before (an inner data
         * axis has it partial too) */
        part_set_place(p, r, copy.out[0], pl_p());
        r = r < 0 ? -1 : scaled(p, r, 1.0 / T, copy.loc);
        break;
    case PTC_OP_CROSS_ENTROPY_GRAD: {
        int m = -1, s = -1;
        if (ro->out[0].dim == part_graph(p)->values[copy.in[0]].type.rank - 1 &&
            part_axis_kind(p) == PART_TENSOR) {
            if (!ce_stats(p, ins[0], &m, &s))
                return part_error(p, ni,
                                  "internal error: cross_entropy gradient before its "
                                  "forward");
            at = axis_attrs(p, PTC_OP_CE_GRAD_SHARD);
            r = part_emit(p, PTC_OP_CE_GRAD_SHARD, (int[]){ins[0], ins[1], m, s, ins[2]}, 5, &at,
                          copy.loc, NULL);
            break;
        }
        int dl = scaled(p, ins[2], 1.0 / T, copy.loc);
        r = dl < 0 ? -1
                   : part_emit(p, PTC_OP_CROSS_ENTROPY_GRAD, (int[]){ins[0], ins[1], dl}, 3, NULL,
                               copy.loc, NULL);
        break;
    }
    case PTC_OP_CE_GRAD_SHARD: {
        int dl = scaled(p, ins[4], 1.0 / T, copy.loc);
        int in5[5] = {ins[0], ins[1], ins[2], ins[3], dl};
        r = dl < 0 ? -1 : part_emit(p, copy.op, in5, 5, &copy.attrs, copy.loc, NULL);
        break;
    }
    default:
        return part_error(p, ni, "internal error: no custom partition for %s",
                          ptc_ops[copy.op].name);
    }
    if (r < 0)
        return -1;
    part_bind(p, copy.out[0], r, ro->out[0]);
    return 0;
}
