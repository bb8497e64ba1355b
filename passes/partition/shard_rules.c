/* shard_rules.c - the sharding rule of every op kind, in one table (ptc_shard_rule's switch).
 *
 * A rule sees the placements of a node's operands on one mesh axis (Replicate, Shard(d), Partial,
 * or undecided for a parameter not used before) and decides what each operand must be and what
 * the results are. The walker (partition.c) inserts the redistributions and emits the op.
 *
 * Tensor parallelism comes out of these rules, not out of per-model code:
 *   - a matmul whose weight is undecided makes it column-parallel (Shard(1): the output is sharded
 *     on its features) when the input is replicated, and row-parallel (Shard(0): the output is
 *     Partial) when the input is sharded on the contracted features. A split or attention
 *     downstream decides whether the columns are one block or strided groups (a fused qkv gives
 *     each rank whole heads of q, k and v), or forbids the split (key/value heads that do not
 *     divide by the axis);
 *   - an embedding table is split over the vocabulary (the output is Partial) and
 *     cross_entropy over vocabulary-sharded logits runs vocabulary-parallel (never gathering them);
 *   - Partial values are reduced where a non-linear op needs them: allreduce, or reduce_scatter
 *     over the sequence with --seq-parallel.
 * Data parallelism: model inputs are split over the batch, means over a split batch become Partial
 * with a 1/T scale, parameter gradients come out Partial and are reduced where the global norm's
 * sumsq first uses them (the walker makes that reduction as soon as the gradient is complete);
 * under ZeRO the update runs on the state's shard (part_zero_placement: a dim dp divides, or a
 * shard with a remainder).
 */
#include <string.h>

#include "partition.h"

static const ptc_type *gty(const part *p, int v)
{
    return &part_graph(p)->values[v].type;
}

static const ptc_node *node(const part *p, int ni)
{
    return &part_graph(p)->nodes[ni];
}

static bool undecided(ptc_placement a)
{
    return a.kind == PLACE_UNDECIDED;
}

static bool sharded(ptc_placement a)
{
    return a.kind == PTC_PLACE_SHARD;
}

static bool partial(ptc_placement a)
{
    return a.kind == PTC_PLACE_PARTIAL;
}

static ptc_placement pl_und(void)
{
    return PL_UNDECIDED;
}

static void all_req(rule_out *ro, int nin, ptc_placement pl)
{
    for (int k = 0; k < nin; k++)
        ro->req[k] = pl;
}

static void all_out(rule_out *ro, int nout, ptc_placement pl)
{
    for (int k = 0; k < nout; k++)
        ro->out[k] = pl;
}

/* Where a Partial operand of an elementwise-like consumer is reduced to: Replicate, or with
 * sequence parallelism Shard over the sequence dim (dim 1 of [batch, seq, ...]). */
static ptc_placement resolve_partial(const part *p, const ptc_type *t)
{
    if (part_seq_parallel(p) && t->rank >= 3 && t->dims[1] % part_size(p) == 0)
        return pl_s(1, 1);
    return pl_r();
}

/* ---- elementwise: operands aligned from the right (NumPy broadcasting) ---- */

static bool is_update(ptc_op op)
{
    return op == PTC_OP_ADAMW_UPDATE || op == PTC_OP_SGD_UPDATE;
}

/* Linear in the Partial operands: a sum of per-rank parts stays a sum. */
static bool linear_in_partials(const ptc_node *n, const ptc_placement *in)
{
    int np = 0, k0 = -1;
    for (int k = 0; k < n->nin; k++)
        if (partial(in[k])) {
            np++;
            if (k0 < 0)
                k0 = k;
        }
    switch (n->op) {
    case PTC_OP_ADD:
    case PTC_OP_SUB: return np == n->nin;
    case PTC_OP_NEG:
    case PTC_OP_CAST: return true;
    case PTC_OP_MUL: return np == 1;
    case PTC_OP_DIV: return np == 1 && k0 == 0;
    case PTC_OP_RELU_GRAD:
    case PTC_OP_GELU_GRAD:
    case PTC_OP_SILU_GRAD: return np == 1 && k0 == 1; /* linear in dy */
    default: return false;
    }
}

/* Whether old value v has one consumer and it is a sum (the next link of an accumulation). */
static bool accumulates(const part *p, int v)
{
    const ptc_graph *g = part_graph(p);
    int uses = 0, sums = 0;
    for (int i = g->values[v].def + 1; i < g->nnodes && uses < 2; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] == v) {
                uses++;
                sums += g->nodes[i].op == PTC_OP_ADD || g->nodes[i].op == PTC_OP_SUB;
            }
    for (int i = 0; i < g->noutputs; i++)
        uses += g->outputs[i] == v;
    return uses == 1 && sums == 1;
}

/* Under sequence parallelism, a sum of sequence-sharded and Partial terms that feeds another sum
 * (a gradient accumulating the contributions of several column-parallel matmuls, as separate
 * q, k and v projections give, onto the residual's): reducing each Partial term to the sequence
 * shard costs a reduce-scatter per term, while gathering the sharded term once and keeping the
 * chain Partial costs one all-gather and one reduce-scatter at the chain's end. */
static bool sp_accumulation(const part *p, const ptc_node *n, const ptc_placement *in)
{
    if (!part_seq_parallel(p) || (n->op != PTC_OP_ADD && n->op != PTC_OP_SUB) ||
        !accumulates(p, n->out[0]))
        return false;
    int np = 0;
    for (int k = 0; k < n->nin; k++) {
        np += partial(in[k]);
        if (undecided(in[k]) || (sharded(in[k]) && (in[k].dim != 1 || pl_groups(in[k]) > 1)))
            return false;
    }
    return np > 0;
}

static int rule_elementwise(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    const ptc_type *to = gty(p, n->out[0]);
    int R = to->rank, nin = n->nin;
    if (sp_accumulation(p, n, in)) {
        all_req(ro, nin, pl_p());
        all_out(ro, n->nout, pl_p());
        return 0;
    }
    ptc_placement target = pl_und();
    if (is_update(n->op) && part_axis_kind(p) == PART_DATA) {
        target = part_zero(p) >= 1 ? part_zero_placement(p, to) : pl_r();
    } else if (is_update(n->op)) {
        target = undecided(in[0]) ? pl_r() : in[0];
        if (part_axis_kind(p) == PART_EXPERT && part_zero(p) >= 1 && !sharded(target))
            target = part_zero_placement(p, to);
    }
    for (int k = 0; k < nin && undecided(target); k++) {
        const ptc_type *t = gty(p, n->in[k]);
        if (sharded(in[k]) && t->dims[in[k].dim] == to->dims[in[k].dim + R - t->rank]) {
            target = in[k]; /* the same split (groups, remainder) on the output's dim */
            target.dim = (int8_t)(in[k].dim + R - t->rank);
        }
    }
    if (undecided(target)) {
        bool anyp = false;
        for (int k = 0; k < nin; k++)
            anyp |= partial(in[k]);
        bool small = ptc_type_numel(to) <= 16;
        bool sum = n->op == PTC_OP_ADD || n->op == PTC_OP_SUB;
        if (anyp && sum && (small || accumulates(p, n->out[0]))) {
            /* tiny sums (gradient-norm terms), and a chain of sums (a gradient accumulating the
             * contributions of several column-parallel matmuls onto a replicated one): make the
             * replicated terms Partial (a local op), so the chain is reduced once, at its end */
            all_req(ro, nin, pl_p());
            all_out(ro, n->nout, pl_p());
            return 0;
        }
        if (anyp && linear_in_partials(n, in)) {
            for (int k = 0; k < nin; k++)
                ro->req[k] = partial(in[k]) ? pl_p() : pl_r();
            all_out(ro, n->nout, pl_p());
            return 0;
        }
        target = anyp ? resolve_partial(p, to) : pl_r();
    }
    for (int k = 0; k < nin; k++) {
        const ptc_type *t = gty(p, n->in[k]);
        int d = target.dim - (R - t->rank);
        bool aligned = sharded(target) && d >= 0 && t->dims[d] == to->dims[target.dim];
        ro->req[k] = aligned ? target : pl_r();
        ro->req[k].dim = aligned ? (int8_t)d : 0;
    }
    if (is_update(n->op)) /* lr and step are scalars */
        for (int k = n->op == PTC_OP_ADAMW_UPDATE ? 4 : 3; k < nin; k++)
            ro->req[k] = pl_r();
    all_out(ro, n->nout, target);
    return 0;
}

/* ---- matmul ---- */

/* Follows the single chain of consumers of old value v (through elementwise ops, rope and
 * reshapes that keep the last dim) to see how its last dim may be sharded: returns the number of
 * strided groups (1 = plain), 0 if it stays whole (attention key/value heads that do not divide
 * by the axis: they are replicated, the stated strategy for grouped-query attention), or -1 with
 * *why set when query heads do not divide (an error: attention is split by heads). */
static int column_groups(const part *p, int v, int depth, const ptc_node **why)
{
    const ptc_graph *g = part_graph(p);
    int T = part_size(p);
    int64_t last = g->values[v].type.dims[g->values[v].type.rank - 1];
    for (int i = g->values[v].def + 1; i < g->nnodes && depth < 8; i++) {
        const ptc_node *n = &g->nodes[i];
        int k = -1;
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] == v)
                k = j;
        if (k < 0)
            continue;
        switch (n->op) {
        case PTC_OP_SPLIT:
            if (n->attrs.axis == g->values[v].type.rank - 1) {
                int gsub = 1;
                for (int j = 0; j < n->nout; j++) {
                    int s = column_groups(p, n->out[j], depth + 1, why);
                    if (s <= 0)
                        return s;
                    gsub = s > gsub ? s : gsub;
                }
                return gsub > 1 ? 0 : (int)n->attrs.n;
            }
            return 1;
        case PTC_OP_ATTENTION: {
            int64_t h = k == 0 ? n->attrs.heads : n->attrs.kv_heads;
            if (h % T == 0)
                return 1;
            *why = n;
            return k == 0 ? -1 : 0;
        }
        case PTC_OP_ROPE: {
            int s = column_groups(p, n->out[0], depth + 1, why);
            return s > 0 && n->attrs.heads % T ? 0 : s;
        }
        case PTC_OP_SOFTMAX:
        case PTC_OP_LOG_SOFTMAX: /* over the columns (a moe router): split, it would be gathered
                                    at once, so the weight stays whole */
            return n->attrs.axis == g->values[v].type.rank - 1 ? 0 : 1;
        case PTC_OP_ADD:
        case PTC_OP_SUB:
        case PTC_OP_MUL:
        case PTC_OP_DIV:
        case PTC_OP_NEG:
        case PTC_OP_CAST:
            if (ptc_ops[n->op].flags & (PTC_F_UNARY | PTC_F_BINARY) || n->op == PTC_OP_CAST) {
                const ptc_type *ot = &g->values[n->out[0]].type;
                if (ot->dims[ot->rank - 1] != last)
                    return 1;
                return column_groups(p, n->out[0], depth + 1, why);
            }
            return 1;
        default:
            if (ptc_ops[n->op].flags & PTC_F_UNARY)
                return column_groups(p, n->out[0], depth + 1, why);
            return 1;
        }
    }
    return 1;
}

/* Attention is split by heads: a mesh axis that does not divide the query heads is an error,
 * reported at the weight that would have to be split. */
static int heads_error(part *p, int weight, const ptc_node *attn)
{
    const ptc_graph *g = part_graph(p);
    const ptc_node *w = &g->nodes[g->values[weight].def];
    const ptc_type *t = &g->values[weight].type;
    char ty[160];
    ptc_type_str(t, ty, sizeof ty);
    return part_error(p, g->values[weight].def,
                      "mesh axis %s=%d does not divide the %lld heads of the attention at line %d, "
                      "so %s '%s' %s cannot be split by heads along dimension %d (size %lld)",
                      g->mesh.names[part_axis(p)], part_size(p), (long long)attn->attrs.heads,
                      attn->loc.line, w->op == PTC_OP_PARAM ? "parameter" : "value",
                      w->attrs.name ? w->attrs.name : "?", ty, t->rank - 1,
                      (long long)t->dims[t->rank - 1]);
}

/* Output dim of operand dim d of a broadcast operand of rank r into an output of rank R. */
static int out_dim(int d, int r, int R)
{
    return d + R - r;
}

static int rule_matmul(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    const ptc_type *ta = gty(p, n->in[0]), *tb = gty(p, n->in[1]), *tc = gty(p, n->out[0]);
    int ra = ta->rank, rb = tb->rank, rc = tc->rank;
    ptc_placement a = in[0], b = in[1];
    ro->req[0] = a;
    ro->req[1] = b;
    if (undecided(a))
        ro->req[0] = a = pl_r();
    if (undecided(b)) {
        b = pl_r();
        if (part_axis_kind(p) == PART_TENSOR && rb == 2) {
            if (sharded(a) && a.dim == ra - 1) {
                b = pl_s(0, 1); /* row-parallel */
            } else {
                /* column-parallel, on the whole input: a sequence-sharded input (Megatron-SP) is
                 * all-gathered first */
                const ptc_node *why = NULL;
                int groups = column_groups(p, n->out[0], 0, &why);
                if (groups < 0)
                    return heads_error(p, n->in[1], why);
                if (groups > 0) {
                    ro->req[0] = pl_r();
                    ro->req[1] = pl_s(1, groups); /* the walker reports a mesh that does not
                                                     divide the columns */
                    ro->out[0] = pl_s(rc - 1, groups);
                    return 0;
                }
            }
        }
        ro->req[1] = b;
    }
    /* the contracted dim sharded alike on both sides (or made so by a free local slice of a
     * replicated side): each rank sums over its part of k, the result is Partial */
    bool ak = sharded(a) && a.dim == ra - 1;
    bool bk = sharded(b) && b.dim == rb - 2;
    if ((ak && bk && pl_groups(a) == pl_groups(b)) || (ak && b.kind == PTC_PLACE_REPLICATE) ||
        (bk && a.kind == PTC_PLACE_REPLICATE)) {
        int groups = ak ? pl_groups(a) : pl_groups(b);
        ro->req[0] = pl_s(ra - 1, groups);
        ro->req[1] = pl_s(rb - 2, groups);
        ro->out[0] = pl_p();
        return 0;
    }
    if ((partial(a) && b.kind == PTC_PLACE_REPLICATE) ||
        (partial(b) && a.kind == PTC_PLACE_REPLICATE)) {
        ro->out[0] = pl_p();
        return 0;
    }
    /* a weight (rank 2) sharded on its columns stays sharded: a sequence-sharded activation is
     * gathered instead (the backward of Megatron-SP's row-parallel layer, and the logits) */
    if (part_axis_kind(p) == PART_TENSOR && sharded(b) && rb == 2 && b.dim == 1 && sharded(a) &&
        a.dim != ra - 1) {
        ro->req[0] = pl_r();
        ro->out[0] = pl_s(rc - 1, pl_groups(b));
        return 0;
    }
    /* a replicated weight (key/value heads that do not divide) on a sequence-sharded activation
     * whose gathered copy exists already (gathered for the query projection): every rank
     * computes the whole output from it, which sends nothing, where computing on the shard
     * would all-gather the output for rope and attention */
    if (part_seq_parallel(p) && sharded(a) && a.dim == 1 && ra == 3 && rb == 2 &&
        b.kind == PTC_PLACE_REPLICATE && part_available(p, n->in[0], pl_r())) {
        ro->req[0] = pl_r();
        ro->out[0] = pl_r();
        return 0;
    }
    /* A sharded on a leading or row dim, B replicated or sharded alike on a shared leading dim */
    if (sharded(a) && a.dim < ra - 1 && !partial(b)) {
        int od = out_dim(a.dim, ra, rc);
        int bd = od - (rc - rb);
        bool b_has = a.dim < ra - 2 && bd >= 0 && bd < rb - 2 && tb->dims[bd] > 1;
        ro->req[1] = b_has ? pl_s(bd, pl_groups(a)) : pl_r();
        ro->out[0] = pl_s(od, pl_groups(a));
        return 0;
    }
    if (sharded(b) && b.dim != rb - 2 && !partial(a)) {
        int od = out_dim(b.dim, rb, rc);
        int ad = od - (rc - ra);
        bool a_has = b.dim < rb - 2 && ad >= 0 && ad < ra - 2 && ta->dims[ad] > 1;
        ro->req[0] = a_has ? pl_s(ad, pl_groups(b)) : pl_r();
        ro->out[0] = pl_s(od, pl_groups(b));
        return 0;
    }
    ro->req[0] = pl_r();
    ro->req[1] = pl_r();
    ro->out[0] = pl_r();
    return 0;
}

/* ---- reductions over one axis ---- */

static int rule_reduce(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    int a = (int)n->attrs.axis;
    ptc_placement x = undecided(in[0]) ? pl_r() : in[0];
    ro->req[0] = x;
    if (sharded(x) && x.dim == a && pl_groups(x) == 1) {
        ro->out[0] = n->op == PTC_OP_MAX ? pl_r() : pl_p();
        ro->emit = n->op == PTC_OP_SUM ? EMIT_PLAIN : EMIT_CUSTOM;
    } else if (sharded(x) && x.dim == a) {
        ro->req[0] = pl_r();
        ro->out[0] = pl_r();
    } else if (sharded(x)) {
        ro->out[0] = pl_s(x.dim > a ? x.dim - 1 : x.dim, pl_groups(x));
    } else if (partial(x) && n->op == PTC_OP_MAX) {
        ro->req[0] = pl_r();
        ro->out[0] = pl_r();
    } else {
        ro->out[0] = x;
    }
    return 0;
}

/* ---- row-wise ops (normalised over one axis; other operands are per-feature vectors) ---- */

static int row_axis(const ptc_node *n, const ptc_type *t)
{
    switch (n->op) {
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
    case PTC_OP_SOFTMAX_GRAD:
    case PTC_OP_LOG_SOFTMAX_GRAD:
    case PTC_OP_MAX_GRAD: return (int)n->attrs.axis;
    default: return t->rank - 1;
    }
}

static int rule_rowwise(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    const ptc_type *tx = gty(p, n->in[0]);
    int ax = row_axis(n, tx);
    /* the main operand: x (norms, softmax, rope), y (softmax grads) */
    ptc_placement x = undecided(in[0]) ? pl_r() : in[0];
    if (partial(x))
        x = resolve_partial(p, tx);
    if (sharded(x) && (x.dim == ax || pl_groups(x) > 1))
        x = pl_r();
    bool grad2 = n->op == PTC_OP_LAYERNORM_GRAD || n->op == PTC_OP_RMSNORM_GRAD;
    for (int k = 0; k < n->nin; k++)
        ro->req[k] = pl_r();
    ro->req[0] = x;
    if (grad2)
        ro->req[2] = x; /* dy like x */
    else if (n->nin == 2 && (n->op == PTC_OP_SOFTMAX_GRAD || n->op == PTC_OP_LOG_SOFTMAX_GRAD))
        ro->req[1] = x;
    else if (n->op == PTC_OP_MAX_GRAD)
        ro->req[1] = sharded(x) ? pl_s(x.dim > ax ? x.dim - 1 : x.dim, 1) : x;
    ro->out[0] = x;
    for (int k = 1; k < n->nout; k++) /* gains and biases: summed over the rows */
        ro->out[k] = sharded(x) ? pl_p() : pl_r();
    return 0;
}

/* rope and its gradient rotate pairs of features inside each head by the position: linear, the
 * same rotation for every head. So a Partial passes, a batch shard passes, and a shard of the
 * features passes when it holds whole heads (plain, or strided groups of whole heads, as a fused
 * qkv gives); positions (dim 1) must stay whole. */
static int rule_rope(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    ptc_placement x = undecided(in[0]) ? pl_r() : in[0];
    int64_t parts = (int64_t)part_size(p) * pl_groups(x);
    if (sharded(x) && (x.dim == 1 || (x.dim == 2 && n->attrs.heads % parts)))
        x = pl_r();
    ro->req[0] = x;
    ro->out[0] = x;
    return 0;
}

/* ---- shape ops ---- */

/* For a reshape, the output dim that carries a shard of input dim d: d must be the outermost of
 * a group of dims whose product equals that of a group of output dims, and the first output dim
 * of the group must divide; -1 if none. */
static int reshape_dim(const ptc_type *ti, const ptc_type *to, int d, int parts, int groups)
{
    int i = 0, o = 0;
    while (i < ti->rank && o < to->rank) {
        int i0 = i, o0 = o;
        int64_t pi = ti->dims[i++], po = to->dims[o++];
        while (pi != po) {
            if (pi < po)
                pi *= ti->dims[i++];
            else
                po *= to->dims[o++];
        }
        if (d < i0 || d >= i)
            continue;
        if (i - i0 == 1 && o - o0 == 1) /* the dim maps to one output dim of the same size */
            return o0;
        /* merged or split dims: the shard must be the outermost factor, and contiguous */
        int first = i0, ofirst = o0;
        while (first < d && ti->dims[first] == 1)
            first++;
        while (ofirst < o - 1 && to->dims[ofirst] == 1)
            ofirst++;
        if (groups > 1 || first != d || to->dims[ofirst] % parts)
            return -1;
        return ofirst;
    }
    return -1;
}

static int rule_shape(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    const ptc_type *tx = gty(p, n->in[0]), *to = gty(p, n->out[0]);
    ptc_placement x = undecided(in[0]) ? pl_r() : in[0];
    int T = part_size(p);
    all_req(ro, n->nin, x);
    if (!sharded(x)) {
        all_out(ro, n->nout, x);
        return 0;
    }
    int d = x.dim, od = -1, g = pl_groups(x);
    switch (n->op) {
    case PTC_OP_TRANSPOSE: od = d == tx->rank - 1 ? d - 1 : d == tx->rank - 2 ? d + 1 : d; break;
    case PTC_OP_PERMUTE:
        for (int i = 0; i < n->attrs.nshape; i++)
            if (n->attrs.shape[i] == d)
                od = i;
        break;
    case PTC_OP_RESHAPE: od = reshape_dim(tx, to, d, T * g, g); break;
    case PTC_OP_SLICE:
    case PTC_OP_PAD: od = d == n->attrs.axis ? -1 : d; break;
    case PTC_OP_SPLIT:
        if (d != n->attrs.axis)
            od = d;
        else if (g == n->attrs.n) {
            all_out(ro, n->nout, pl_s(d, 1));
            return 0;
        }
        break;
    case PTC_OP_CONCAT: {
        bool same = true;
        for (int k = 0; k < n->nin; k++)
            same &= !undecided(in[k]) && pl_eq(in[k], x) &&
                    gty(p, n->in[k])->dims[n->attrs.axis] == tx->dims[n->attrs.axis];
        if (d != n->attrs.axis) {
            od = d;
        } else if (same && g == 1) {
            ro->out[0] = pl_s(d, n->nin);
            return 0;
        }
        break;
    }
    case PTC_OP_BROADCAST_TO: od = d + to->rank - tx->rank; break;
    case PTC_OP_SUM_TO: {
        int td = d - (tx->rank - to->rank);
        if (td < 0 || to->dims[td] != tx->dims[d]) {
            if (g == 1) {
                ro->out[0] = pl_p();
                return 0;
            }
        } else {
            od = td;
        }
        break;
    }
    default: break;
    }
    if (od < 0) { /* the shard cannot pass through: gather */
        all_req(ro, n->nin, pl_r());
        all_out(ro, n->nout, pl_r());
        return 0;
    }
    all_out(ro, n->nout, pl_s(od, g));
    return 0;
}

/* ---- model ops ---- */

/* The placement the gradient value v should end in: that of the parameter it updates, found by
 * following its consumers (sums with other gradients, clipping) to the optimizer update. */
static ptc_placement grad_target(const part *p, int v, int depth)
{
    const ptc_graph *g = part_graph(p);
    for (int i = g->values[v].def + 1; i < g->nnodes && depth < 6; i++) {
        const ptc_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            if (n->in[k] != v)
                continue;
            if (is_update(n->op) && k == 1) {
                ptc_placement pin;
                if (part_pinned(p, n->in[0], &pin))
                    return pin;
                return pl_und();
            }
            if (n->op == PTC_OP_ADD || n->op == PTC_OP_MUL) {
                ptc_placement t = grad_target(p, n->out[0], depth + 1);
                if (!undecided(t))
                    return t;
            }
        }
    }
    return pl_und();
}

static int rule_embedding(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    ptc_placement tab = in[0], ids = undecided(in[1]) ? pl_r() : in[1];
    const ptc_type *tt = gty(p, n->in[0]);
    int T = part_size(p), R = gty(p, n->out[0])->rank;
    if (partial(ids))
        ids = pl_r();
    if (undecided(tab) && part_axis_kind(p) == PART_TENSOR && tt->dims[0] % T) {
        const ptc_graph *g = part_graph(p);
        const ptc_node *w = &g->nodes[g->values[n->in[0]].def];
        return part_error(p, g->values[n->in[0]].def,
                          "mesh axis %s=%d does not divide dimension 0 (the %lld rows) of "
                          "embedding table '%s': pad the vocabulary to a multiple of %d, or keep "
                          "the table whole with --place '%s=%s:R'",
                          g->mesh.names[part_axis(p)], T, (long long)tt->dims[0],
                          w->attrs.name ? w->attrs.name : "?", T,
                          w->attrs.name ? w->attrs.name : "?", g->mesh.names[part_axis(p)]);
    }
    if (undecided(tab))
        tab = part_axis_kind(p) == PART_TENSOR ? pl_s(0, 1) : pl_r();
    ro->req[0] = tab;
    if (sharded(tab) && tab.dim == 0) { /* vocabulary-parallel */
        ro->req[1] = pl_r();
        ro->out[0] = pl_p();
        ro->emit = EMIT_CUSTOM;
    } else if (sharded(tab)) {
        ro->req[1] = pl_r();
        ro->out[0] = pl_s(R - 1, pl_groups(tab));
    } else {
        ro->req[1] = ids;
        ro->out[0] = ids;
    }
    return 0;
}

static int rule_embedding_grad(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    ptc_placement ids = undecided(in[0]) ? pl_r() : in[0];
    ptc_placement dy = undecided(in[1]) ? pl_r() : in[1];
    int R = gty(p, n->in[1])->rank;
    if (part_axis_kind(p) == PART_TENSOR) {
        ptc_placement want = grad_target(p, n->out[0], 0);
        if (undecided(want) && n->attrs.n % part_size(p) == 0)
            want = pl_s(0, 1); /* embedding tables are vocabulary-parallel on tp */
        if (sharded(want) && want.dim == 0) {
            ro->req[0] = pl_r(); /* every rank scatters the rows of its vocabulary range */
            ro->req[1] = pl_r();
            ro->out[0] = want;
            ro->emit = EMIT_CUSTOM;
            return 0;
        }
    }
    if (partial(dy))
        dy = pl_r();
    if (sharded(dy) && dy.dim == R - 1) { /* feature-sharded rows */
        ro->req[0] = pl_r();
        ro->req[1] = dy;
        ro->out[0] = pl_s(1, pl_groups(dy));
    } else if (sharded(ids) || sharded(dy)) { /* rows split over positions: partial sums */
        ptc_placement pos = sharded(ids) ? ids : dy;
        ro->req[0] = pos;
        ro->req[1] = pos;
        ro->out[0] = pl_p();
    } else {
        ro->req[0] = pl_r();
        ro->req[1] = pl_r();
        ro->out[0] = pl_r();
    }
    return 0;
}

static int rule_attention(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    int T = part_size(p);
    bool grad = n->op == PTC_OP_ATTENTION_GRAD;
    ptc_placement q = undecided(in[0]) ? pl_r() : in[0];
    int64_t H = n->attrs.heads, G = n->attrs.kv_heads ? n->attrs.kv_heads : H;
    if (sharded(q) && q.dim == 2 && pl_groups(q) == 1 && H % T == 0 &&
        part_axis_kind(p) == PART_TENSOR) {
        ro->req[0] = q;
        if (grad)
            ro->req[3] = q;
        if (G % T == 0) {
            ro->req[1] = ro->req[2] = q;
            all_out(ro, n->nout, q);
        } else { /* grouped-query heads that do not divide: every rank has all k/v heads */
            ro->req[1] = ro->req[2] = pl_r();
            ro->out[0] = q;
            if (grad)
                ro->out[1] = ro->out[2] = pl_p();
            ro->emit = EMIT_CUSTOM;
        }
        return 0;
    }
    if (sharded(q) && q.dim == 0) { /* batch */
        all_req(ro, n->nin, q);
        all_out(ro, n->nout, q);
        return 0;
    }
    all_req(ro, n->nin, pl_r());
    all_out(ro, n->nout, pl_r());
    return 0;
}

/* cross_entropy and mse: means over positions; and their gradients */
static int rule_loss(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    const ptc_type *tl = gty(p, n->in[0]);
    ptc_placement l = undecided(in[0]) ? pl_r() : in[0];
    if (partial(l))
        l = pl_r();
    bool ce = n->op == PTC_OP_CROSS_ENTROPY || n->op == PTC_OP_CROSS_ENTROPY_GRAD;
    bool grad = n->op == PTC_OP_CROSS_ENTROPY_GRAD;
    all_req(ro, n->nin, pl_r());
    if (ce && sharded(l) && l.dim == tl->rank - 1 && pl_groups(l) == 1 &&
        part_axis_kind(p) == PART_TENSOR) { /* vocabulary-parallel */
        ro->req[0] = l;
        ro->out[0] = grad ? l : pl_r();
        ro->emit = EMIT_CUSTOM;
        return 0;
    }
    if (sharded(l) && (!ce || l.dim < tl->rank - 1) && pl_groups(l) == 1) { /* positions */
        ro->req[0] = l;
        ro->req[1] = l; /* targets share the position dims; mse's b is like a */
        ro->out[0] = grad ? l : pl_p();
        ro->emit = EMIT_CUSTOM;
        return 0;
    }
    ro->out[0] = pl_r();
    return 0;
}

static int rule_sumsq(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    const ptc_type *t = gty(p, n->in[0]);
    ptc_placement x = undecided(in[0]) ? pl_r() : in[0];
    if (partial(x)) /* reduce a gradient the way its update wants it */
        x = part_zero(p) >= 2 ? part_zero_placement(p, t) : pl_r();
    ro->req[0] = x;
    ro->out[0] = sharded(x) ? pl_p() : pl_r();
    if (pl_ragged(x)) /* the remainder is on every rank: counted once */
        ro->emit = EMIT_CUSTOM;
    return 0;
}

/* The ep pass's collectives that the data-parallel pass widens to one collective over dp and ep
 * (the group dp+ep; ep is data parallel for all but the experts), x the operand's placement
 * here, *out the result's:
 *   - an allreduce of a value Partial here too (the gradients of everything but the experts,
 *     the loss), to Replicate; not under ZeRO 2 and 3, which scatter gradients over dp;
 *   - ZeRO over dp x ep, where the ep pass gathers a parameter's ep shard or scatters its
 *     gradient over ep and this axis shards the same dimension again: an allgather of a value
 *     this axis shards plainly on the dimension it gathers, to Replicate; under ZeRO 2 and 3 a
 *     reduce-scatter of a value Partial here, to the shard ZeRO gives its result on this axis,
 *     when that is a plain shard of the dimension it splits. One collective moves what two in a
 *     row would: ptc_plan_group orders the members as the layout is, ep's coordinate major. */
bool ptc_shard_merges_with_ep(const part *p, const ptc_node *n, ptc_placement x,
                              ptc_placement *out)
{
    const ptc_graph *g = part_graph(p);
    if (n->attrs.mesh_axis2 >= 0 || part_axis_kind(p) != PART_DATA ||
        strcmp(g->mesh.names[n->attrs.mesh_axis], "ep") != 0)
        return false;
    *out = pl_r();
    switch (n->op) {
    case PTC_OP_ALLREDUCE:
        return n->attrs.reduce == 0 && part_zero(p) < 2 && x.kind == PTC_PLACE_PARTIAL;
    case PTC_OP_ALLGATHER:
        return n->attrs.n <= 1 && part_zero(p) >= 1 && x.kind == PTC_PLACE_SHARD &&
               x.dim == n->attrs.axis && pl_groups(x) == 1 && !x.rem;
    case PTC_OP_REDUCE_SCATTER:
        *out = part_zero_placement(p, &g->values[n->out[0]].type);
        return n->attrs.n <= 1 && part_zero(p) >= 2 && x.kind == PTC_PLACE_PARTIAL &&
               out->kind == PTC_PLACE_SHARD && out->dim == n->attrs.axis &&
               pl_groups(*out) == 1 && !out->rem;
    default: return false;
    }
}

/* Collectives and shard ops of an inner axis, seen from an outer one: linear, and a shard passes
 * unless it is on the dimension the op gathers or splits. */
static int rule_inner_comm(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    ptc_placement x = undecided(in[0]) ? pl_r() : in[0], y;
    if (ptc_shard_merges_with_ep(p, n, x, &y)) {
        ro->req[0] = x;
        ro->out[0] = y;
        ro->emit = EMIT_CUSTOM;
        return 0;
    }
    /* only all_to_all has a `to`; allreduce and partialize act on no dimension (their unused
     * attributes are 0, which must not read as "dim 0": that gathered the batch over dp) */
    bool has_axis = n->op != PTC_OP_ALLREDUCE && n->op != PTC_OP_PARTIALIZE;
    bool touches = sharded(x) && has_axis &&
                   (x.dim == n->attrs.axis || (n->op == PTC_OP_ALL_TO_ALL && x.dim == n->attrs.to));
    if (touches)
        x = pl_r();
    ro->req[0] = x;
    ro->out[0] = x;
    return 0;
}

/* Rank-dependent ops of an inner axis (vocabulary-parallel pieces, sharded attention), seen from
 * the data-parallel axis: batch-like, row-wise. */
static int rule_inner_rows(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    ptc_placement x = pl_r();
    for (int k = 0; k < n->nin; k++)
        if (sharded(in[k]) && in[k].dim == 0)
            x = in[k];
    for (int k = 0; k < n->nin; k++) {
        const ptc_type *t = gty(p, n->in[k]);
        /* operands with the batch dim follow it; the embedding table does not have one */
        bool batch = t->rank >= 1 && t->dims[0] == gty(p, n->in[0])->dims[0] &&
                     !(n->op == PTC_OP_EMBEDDING_SHARD && k == 0);
        ro->req[k] = sharded(x) && batch ? x : pl_r();
    }
    if (n->op == PTC_OP_EMBEDDING_SHARD) {
        ro->req[1] = x;
        ro->out[0] = x;
        return 0;
    }
    if (n->op == PTC_OP_EMBEDDING_GRAD_SHARD) {
        ro->out[0] = sharded(x) ? pl_p() : pl_r();
        return 0;
    }
    if (n->op == PTC_OP_CE_LOSS || n->op == PTC_OP_CE_GRAD_SHARD) {
        ro->out[0] = n->op == PTC_OP_CE_LOSS ? (sharded(x) ? pl_p() : pl_r()) : x;
        ro->emit = sharded(x) ? EMIT_CUSTOM : EMIT_PLAIN;
        return 0;
    }
    all_out(ro, n->nout, x);
    return 0;
}

int ptc_shard_rule(part *p, int ni, const ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = node(p, ni);
    ro->emit = EMIT_PLAIN;
    if (ptc_ops[n->op].flags & (PTC_F_UNARY | PTC_F_BINARY))
        return rule_elementwise(p, ni, in, ro);
    switch (n->op) {
    case PTC_OP_CAST:
    case PTC_OP_RELU_GRAD:
    case PTC_OP_GELU_GRAD:
    case PTC_OP_SILU_GRAD:
    case PTC_OP_ADAMW_UPDATE:
    case PTC_OP_SGD_UPDATE:
    case PTC_OP_CLIP_COEF: return rule_elementwise(p, ni, in, ro);
    case PTC_OP_MATMUL: return rule_matmul(p, ni, in, ro);
    case PTC_OP_SUM:
    case PTC_OP_MEAN:
    case PTC_OP_MAX: return rule_reduce(p, ni, in, ro);
    case PTC_OP_LAYERNORM:
    case PTC_OP_RMSNORM:
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
    case PTC_OP_LAYERNORM_GRAD:
    case PTC_OP_RMSNORM_GRAD:
    case PTC_OP_SOFTMAX_GRAD:
    case PTC_OP_LOG_SOFTMAX_GRAD:
    case PTC_OP_MAX_GRAD: return rule_rowwise(p, ni, in, ro);
    case PTC_OP_ROPE:
    case PTC_OP_ROPE_GRAD: return rule_rope(p, ni, in, ro);
    case PTC_OP_RESHAPE:
    case PTC_OP_TRANSPOSE:
    case PTC_OP_PERMUTE:
    case PTC_OP_SPLIT:
    case PTC_OP_CONCAT:
    case PTC_OP_SLICE:
    case PTC_OP_PAD:
    case PTC_OP_BROADCAST_TO:
    case PTC_OP_SUM_TO: return rule_shape(p, ni, in, ro);
    case PTC_OP_EMBEDDING: return rule_embedding(p, ni, in, ro);
    case PTC_OP_EMBEDDING_GRAD: return rule_embedding_grad(p, ni, in, ro);
    case PTC_OP_ATTENTION:
    case PTC_OP_ATTENTION_GRAD: return rule_attention(p, ni, in, ro);
    case PTC_OP_CROSS_ENTROPY:
    case PTC_OP_CROSS_ENTROPY_GRAD:
    case PTC_OP_MSE: return rule_loss(p, ni, in, ro);
    case PTC_OP_SUMSQ: return rule_sumsq(p, ni, in, ro);
    case PTC_OP_ALLREDUCE:
    case PTC_OP_ALLGATHER:
    case PTC_OP_REDUCE_SCATTER:
    case PTC_OP_ALL_TO_ALL:
    case PTC_OP_SHARD_SLICE:
    case PTC_OP_PARTIALIZE: return rule_inner_comm(p, ni, in, ro);
    case PTC_OP_EMBEDDING_SHARD:
    case PTC_OP_EMBEDDING_GRAD_SHARD:
    case PTC_OP_CE_SUMEXP:
    case PTC_OP_CE_PICK:
    case PTC_OP_CE_LOSS:
    case PTC_OP_CE_GRAD_SHARD:
    case PTC_OP_ATTENTION_SHARD:
    case PTC_OP_ATTENTION_SHARD_GRAD: return rule_inner_rows(p, ni, in, ro);
    case PTC_OP_MOE_TOPK:
    case PTC_OP_MOE_TOPK_GRAD:
    case PTC_OP_MOE_COUNT:
    case PTC_OP_MOE_PREFIX:
    case PTC_OP_MOE_ROUTE:
    case PTC_OP_MOE_FRAC:
    case PTC_OP_MOE_STATS:
    case PTC_OP_MOE_FFN:
    case PTC_OP_MOE_FFN_GRAD: return ptc_shard_rule_moe(p, ni, in, ro);
    default:
        return part_error(p, ni, "internal error: no sharding rule for %s", ptc_ops[n->op].name);
    }
}
