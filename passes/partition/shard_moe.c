/* shard_moe.c - the sharding rules of moe's pieces (ops.def, "mixture of experts"), and the
 * expert-parallel emission of the experts.
 *
 * Tokens: every piece works per token or per batch row, so a split batch (data parallelism, and
 * expert parallelism outside the experts) passes through all of them except moe_prefix, which
 * needs the counts of every row: that is where the ranks exchange their per-expert counts (an
 * all-gather of i32[rows, top_k, experts] per mesh axis that splits the batch). Its results are
 * replicated; moe_route takes this rank's rows of the prefix (a local slice), so every choice
 * gets the place it has on one device, and dropping is the same on every mesh. The microbatch
 * axis (mb) is the exception: the language routes the tokens of one microbatch together, so
 * moe_prefix counts the microbatch's rows only and its totals are the microbatch's (replicated
 * on mb: every node that depends on the batch runs once per microbatch).
 *
 * Experts (moe_ffn and its gradient):
 *   - tensor parallel: each expert's hidden dimension is split (w_up by columns, in two strided
 *     groups for swiglu so every rank holds matching halves; w_down by rows), the tokens are
 *     whole, the result and dx are Partial (reduced where the residual needs them), the weight
 *     gradients are sharded like the weights;
 *   - expert parallel (ep): the experts are split (w_up and w_down by dim 0), the tokens stay
 *     split by batch; the op is emitted with mesh_axis/group set, and the moe_ep pass turns it
 *     into the all-to-alls that bring tokens to their experts' ranks and back. Expert weight
 *     gradients are sharded over ep, so only dp reduces them;
 *   - data parallel: weights replicated (gathered under ZeRO-3), gradients Partial.
 */
#include <string.h>

#include "partition.h"

static const ptc_node *node(const part *p, int ni)
{
    return &part_graph(p)->nodes[ni];
}

static bool undecided(ptc_placement a)
{
    return a.kind == PLACE_UNDECIDED;
}

static bool shard_on(ptc_placement a, int dim)
{
    return a.kind == PTC_PLACE_SHARD && a.dim == dim;
}

/* The placement of a per-token operand that the op can keep: a batch split (dim 0), or with
 * positions too (dim 1) for the ops that work token by token. Anything else is gathered. */
static ptc_placement tokens(ptc_placement a, bool positions)
{
    if (a.kind == PTC_PLACE_SHARD && pl_groups(a) == 1 && !a.rem &&
        (a.dim == 0 || (positions && a.dim == 1)))
        return a;
    return pl_r();
}

static void all(rule_out *ro, int n, ptc_placement pl, bool req)
{
    for (int k = 0; k < n; k++) {
        if (req)
            ro->req[k] = pl;
        else
            ro->out[k] = pl;
    }
}

/* moe_ffn and moe_ffn_grad */
static int rule_experts(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    bool grad = n->op == PTC_OP_MOE_FFN_GRAD;
    ptc_placement wu = in[3], wd = in[4];
    int groups = n->attrs.act == PTC_ACT_SWIGLU ? 2 : 1;
    part_kind kind = part_axis_kind(p);
    if (kind == PART_TENSOR) {
        wu = undecided(wu) ? pl_s(2, groups) : wu;
        wd = undecided(wd) ? pl_s(1, 1) : wd;
    } else if (kind == PART_EXPERT) {
        wu = undecided(wu) ? pl_s(0, 1) : wu;
        wd = undecided(wd) ? pl_s(0, 1) : wd;
    }
    bool hidden = kind == PART_TENSOR && shard_on(wu, 2) && pl_groups(wu) == groups &&
                  shard_on(wd, 1) && pl_groups(wd) == 1;
    bool experts = kind == PART_EXPERT && shard_on(wu, 0) && shard_on(wd, 0) &&
                   pl_groups(wu) == 1 && pl_groups(wd) == 1 && !wu.rem && !wd.rem;
    ptc_placement tk = tokens(in[0], false);
    if (grad && tk.kind == PTC_PLACE_REPLICATE)
        tk = tokens(in[5], false);
    if (hidden) { /* every rank has every token and its part of every expert's hidden units */
        all(ro, n->nin, pl_r(), true);
        ro->req[3] = wu;
        ro->req[4] = wd;
        ro->out[0] = pl_p();
        if (grad) {
            ro->out[1] = pl_p();
            ro->out[2] = wu;
            ro->out[3] = wd;
        }
        return 0;
    }
    if (!experts)
        wu = wd = pl_r();
    all(ro, n->nin, tk, true);
    ro->req[3] = wu;
    ro->req[4] = wd;
    all(ro, n->nout, tk, false);
    if (grad) { /* weight gradients: a sum over the tokens, or this rank's experts */
        bool split = tk.kind == PTC_PLACE_SHARD;
        ro->out[2] = experts ? wu : split ? pl_p() : pl_r();
        ro->out[3] = experts ? wd : split ? pl_p() : pl_r();
    }
    if (experts)
        ro->emit = EMIT_CUSTOM;
    return 0;
}

int ptc_shard_rule_moe(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    ptc_placement x = undecided(in[0]) ? pl_r() : in[0];
    switch (n->op) {
    case PTC_OP_MOE_TOPK: /* token by token */
        x = tokens(x, true);
        ro->req[0] = x;
        all(ro, 2, x, false);
        return 0;
    case PTC_OP_MOE_TOPK_GRAD:
        if (in[2].kind == PTC_PLACE_PARTIAL) { /* linear in dgate */
            all(ro, 3, pl_r(), true);
            ro->req[2] = pl_p();
            ro->out[0] = pl_p();
            return 0;
        }
        x = tokens(x, true);
        for (int k = 1; k < 3 && x.kind == PTC_PLACE_REPLICATE; k++)
            x = undecided(in[k]) ? x : tokens(in[k], true);
        all(ro, 3, x, true);
        ro->out[0] = x;
        return 0;
    case PTC_OP_MOE_COUNT: /* per batch row: a row needs all its positions */
    case PTC_OP_MOE_ROUTE:
        x = tokens(x, false);
        all(ro, n->nin, x, true);
        if (n->op == PTC_OP_MOE_ROUTE)
            ro->req[2] = pl_r(); /* the totals */
        ro->out[0] = x;
        return 0;
    case PTC_OP_MOE_PREFIX: /* every row of the step: the exchange of per-expert counts */
        if (strcmp(part_graph(p)->mesh.names[part_axis(p)], "mb") == 0) {
            x = tokens(x, false); /* the rows of this microbatch */
            ro->req[0] = x;
            ro->out[0] = x;
            ro->out[1] = pl_r(); /* this microbatch's totals */
            return 0;
        }
        /* fall through */
    case PTC_OP_MOE_FRAC:
    case PTC_OP_MOE_STATS:
        all(ro, n->nin, pl_r(), true);
        all(ro, n->nout, pl_r(), false);
        return 0;
    case PTC_OP_MOE_FFN:
    case PTC_OP_MOE_FFN_GRAD: return rule_experts(p, ni, in, ro);
    default:
        return part_error(p, ni, "internal error: no sharding rule for %s", ptc_ops[n->op].name);
    }
}

/* The experts of this rank only: the op with the axis it splits them over. */
int ptc_shard_emit_moe(part *p, int ni, const rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    ptc_node copy = *n;
    int ins[8], outs[PTC_MAX_RESULTS], old[8];
    PTC_ASSERT(copy.nin <= 8);
    memcpy(old, copy.in, sizeof(int) * (size_t)copy.nin);
    for (int k = 0; k < copy.nin; k++)
        if ((ins[k] = part_obtain(p, old[k], ro->req[k])) < 0)
            return -1;
    ptc_attrs at = copy.attrs;
    at.mesh_axis = part_axis(p);
    at.group = part_size(p);
    if (part_emit(p, copy.op, ins, copy.nin, &at, copy.loc, outs) < 0)
        return -1;
    for (int k = 0; k < copy.nout; k++)
        part_bind(p, copy.out[k], outs[k], ro->out[k]);
    return 0;
}
