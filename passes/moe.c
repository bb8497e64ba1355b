/* moe.c - the moe pass: every moe layer becomes its pieces (ops.def, "mixture of experts").
 *
 *   logits = x @ router                      (f32 under every dtype of x: casts when needed)
 *   p = softmax(logits)
 *   ids, gate = moe_topk(p)                  top_k, renormalised or raw
 *   counts = moe_count(ids)                  per batch row, choice rank and expert
 *   prefix, totals = moe_prefix(counts)      over all the rows of the step
 *   route = moe_route(ids, prefix, totals)   expert or -1 (dropped), capacity over the step
 *   y = moe_ffn(x, route, gate, w_up, w_down)
 *   aux = E * sum(moe_frac(totals) * mean(p over tokens))
 *   moe_stats(totals)                        load balance for the training log
 *
 * Why pieces: each has a plain sharding rule (rows of the batch pass through; moe_prefix needs
 * every row, which is where a split batch exchanges its per-expert counts; the experts take the
 * tensor-parallel split of their hidden dimension and the expert-parallel split of their
 * experts), and autodiff differentiates the float ones (moe_topk, moe_ffn) and the generic ops
 * around them, so gradients flow through the gate weights and the mean of p, never through the
 * choices. Routing from counts of the whole step is what makes dropping the same on every mesh.
 *
 * Assumes: a verified forward graph (moe nodes only where the language wrote them).
 * Guarantees: no moe node is left; every other node, the loss, outputs and updates are kept
 * (renumbered); the pieces carry the moe's source location and scope.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct mx {
    const ptc_graph *g;
    ptc_graph *out;
    int *vmap; /* old value -> new value */
    ptc_loc loc;
    char *err;
    size_t errn;
    bool failed;
} mx;

static void build(mx *m, ptc_op op, const int *in, int nin, const ptc_attrs *at, int *out)
{
    ptc_pass_build(m->out, "the moe pass", op, in, nin, at, m->loc, out, &m->failed, m->err,
                   m->errn);
}

static int b1(mx *m, ptc_op op, const int *in, int nin, const ptc_attrs *at)
{
    int out[PTC_MAX_RESULTS];
    build(m, op, in, nin, at, out);
    return out[0];
}

static int cast_to(mx *m, int v, ptc_dtype dt)
{
    return ptc_pass_cast(m->out, "the moe pass", v, dt, m->loc, &m->failed, m->err, m->errn);
}

/* aux = E * sum(frac * P), P[e] the mean of p[:, e] over all tokens */
static int aux_loss(mx *m, int p, int totals, int64_t tokens, int64_t E)
{
    ptc_attrs rs = ptc_attrs_default(PTC_OP_RESHAPE);
    rs.nshape = 2;
    rs.shape[0] = tokens;
    rs.shape[1] = E;
    int flat = b1(m, PTC_OP_RESHAPE, &p, 1, &rs);
    ptc_attrs mean = ptc_attrs_default(PTC_OP_MEAN);
    mean.axis = 0;
    int P = b1(m, PTC_OP_MEAN, &flat, 1, &mean);
    int f = b1(m, PTC_OP_MOE_FRAC, &totals, 1, NULL);
    int s = b1(m, PTC_OP_SUM, (int[]){b1(m, PTC_OP_MUL, (int[]){f, P}, 2, NULL)}, 1, &mean);
    ptc_attrs c = ptc_attrs_default(PTC_OP_CONST);
    c.dtype = PTC_F32;
    c.value = (double)E;
    return b1(m, PTC_OP_MUL, (int[]){s, b1(m, PTC_OP_CONST, NULL, 0, &c)}, 2, NULL);
}

static void expand(mx *m, const ptc_node *n)
{
    const ptc_attrs *a = &n->attrs;
    int x = m->vmap[n->in[0]], router = m->vmap[n->in[1]];
    int w_up = m->vmap[n->in[2]], w_down = m->vmap[n->in[3]];
    const ptc_type *tx = &m->g->values[n->in[0]].type;
    int64_t E = m->g->values[n->in[1]].type.dims[1], tokens = tx->dims[0] * tx->dims[1];
    m->loc = n->loc;

    int logits =
        b1(m, PTC_OP_MATMUL, (int[]){cast_to(m, x, PTC_F32), cast_to(m, router, PTC_F32)}, 2, NULL);
    ptc_attrs sm = ptc_attrs_default(PTC_OP_SOFTMAX);
    sm.axis = -1;
    int p = b1(m, PTC_OP_SOFTMAX, &logits, 1, &sm);
    ptc_attrs tk = ptc_attrs_default(PTC_OP_MOE_TOPK);
    tk.top_k = a->top_k;
    tk.normalize = a->normalize;
    int sel[2];
    build(m, PTC_OP_MOE_TOPK, &p, 1, &tk, sel);
    ptc_attrs cn = ptc_attrs_default(PTC_OP_MOE_COUNT);
    cn.n = E;
    int counts = b1(m, PTC_OP_MOE_COUNT, &sel[0], 1, &cn);
    int pre[2];
    build(m, PTC_OP_MOE_PREFIX, &counts, 1, NULL, pre);
    ptc_attrs rt = ptc_attrs_default(PTC_OP_MOE_ROUTE);
    rt.capacity = a->capacity;
    int route = b1(m, PTC_OP_MOE_ROUTE, (int[]){sel[0], pre[0], pre[1]}, 3, &rt);

    ptc_attrs ff = ptc_attrs_default(PTC_OP_MOE_FFN);
    ff.act = a->act;
    ff.n = E;
    ff.capacity = a->capacity;
    int gate = cast_to(m, sel[1], tx->dtype);
    int y = b1(m, PTC_OP_MOE_FFN, (int[]){x, route, gate, w_up, w_down}, 5, &ff);
    int aux = aux_loss(m, p, pre[1], tokens, E);
    ptc_attrs st = ptc_attrs_default(PTC_OP_MOE_STATS);
    st.capacity = a->capacity;
    b1(m, PTC_OP_MOE_STATS, &pre[1], 1, &st);
    m->vmap[n->out[0]] = y;
    m->vmap[n->out[1]] = aux;
}

static void copy_node(mx *m, const ptc_node *n)
{
    m->loc = n->loc;
    ptc_pass_copy_mapped(m->out, m->g, "the moe pass", n, m->vmap, &m->failed, m->err, m->errn);
}

int ptc_pass_moe(ptc_pass_ctx *ctx)
{
    const ptc_graph *g = ctx->g;
    bool any = false;
    for (int i = 0; i < g->nnodes && !any; i++)
        any = g->nodes[i].op == PTC_OP_MOE;
    if (!any)
        return 0;
    mx m = {.g = g, .err = ctx->err, .errn = ctx->errn};
    m.out = ptc_pass_graph_like(g);
    m.vmap = ptc_xmalloc(sizeof(int) * (size_t)(g->nvalues ? g->nvalues : 1));
    for (int i = 0; i < g->nnodes && !m.failed; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op == PTC_OP_MOE)
            expand(&m, n);
        else
            copy_node(&m, n);
    }
    if (!m.failed)
        ptc_pass_map_ends(m.out, g, m.vmap);
    free(m.vmap);
    if (m.failed) {
        ptc_graph_free(m.out);
        return -1;
    }
    ptc_graph_free(ctx->g);
    ctx->g = m.out;
    return 0;
}
