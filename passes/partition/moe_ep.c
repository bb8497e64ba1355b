/* moe_ep.c - the moe_ep pass: expert parallelism as all-to-alls, and the load-balance output.
 *
 * The partitioner leaves an expert-parallel layer as moe_ffn (and moe_ffn_grad) with mesh_axis
 * and group set: this rank holds E/group experts and its own tokens. Once every axis is
 * partitioned the local shapes are final, and each becomes
 *
 *   counts = allgather(moe_ep_count(route))      every member's kept choices per expert
 *   rows   = moe_pack(x, route)                  this rank's kept choices, in expert order
 *   recv   = all_to_all_v(rows, counts)          to the members holding their experts
 *   out    = moe_ep_ffn(recv, counts, w_up, w_down)
 *   back   = all_to_all_v(out, counts)  (to=1)   and back
 *   y      = moe_combine(back, route, gate)
 *
 * and the gradient reuses counts, recv and back of its forward (found by the route they share):
 * moe_combine_grad (dgate from back, rows gate * dy), all_to_all_v, moe_ep_ffn_grad,
 * all_to_all_v back, moe_unpack (dx). The exchanges move only the kept rows (uneven counts); the
 * buffers hold the most a rank can send or receive, which the plan reports as the dispatch
 * buffers: with capacity C (the same on every mesh: over all the tokens of the step) a rank of n
 * tokens sends at most min(n K, E min(n, C)) rows and receives at most
 * min(El min(G, C), G min(K, El)) rows for its El experts, G = n x group tokens of its group;
 * without a capacity C = all the tokens of the step (an expert takes a token at most once).
 *
 * Then the graph's load-balance outputs: the moe_stats of every layer (f32[3]: the experts times
 * the most choices one expert got, the choices dropped, all choices), summed over the
 * microbatches, as outputs of a training step (the runtime's step line reads them; see
 * plan/program.h).
 *
 * Assumes: a partitioned step graph. Guarantees: no moe_ffn or moe_ffn_grad with group > 1 is
 * left; every other node is kept in order.
 */
#include <stdlib.h>
#include <string.h>

#include "partition.h"

typedef struct fwd_parts {
    int route; /* new value of the route, -1 when the slot is free */
    int counts, recv, back;
} fwd_parts;

typedef struct ep {
    const ptc_graph *g;
    ptc_graph *out;
    int *vmap;
    ptc_loc loc;
    const ptc_value *like; /* the placements new values take (of the node being expanded) */
    fwd_parts *fwd;
    int nfwd, capfwd;
    char *err;
    size_t errn;
    bool failed;
} ep;

/* The placement of a buffer of rows: no shard of anything, but Partial where the layer's result
 * is (a tensor-parallel split of the experts' hidden units gives Partial rows). */
static void row_place(ep *e, int v, bool partial)
{
    if (v < 0)
        return;
    ptc_value *nv = &e->out->values[v];
    for (int a = 0; a < PTC_MAX_MESH_AXES; a++)
        nv->place[a] = partial && e->like->place[a].kind == PTC_PLACE_PARTIAL
                           ? e->like->place[a]
                           : (ptc_placement){.kind = PTC_PLACE_REPLICATE};
}

static int emit(ep *e, ptc_op op, const int *in, int nin, const ptc_attrs *at, int *outs,
                bool partial)
{
    int tmp[PTC_MAX_RESULTS], *o = outs ? outs : tmp;
    ptc_pass_build(e->out, "the moe_ep pass", op, in, nin, at, e->loc, o, &e->failed, e->err,
                   e->errn);
    if (e->failed)
        return -1;
    const ptc_node *n = &e->out->nodes[e->out->nnodes - 1];
    for (int k = 0; k < n->nout; k++)
        row_place(e, n->out[k], partial);
    return o[0];
}

/* Binds old value v to new value nv with v's placements. */
static void bind(ep *e, int v, int nv)
{
    e->vmap[v] = nv;
    if (nv >= 0)
        memcpy(e->out->values[nv].place, e->g->values[v].place, sizeof e->g->values[v].place);
}

/* Rows this rank sends (m_send) and receives (m_recv) at most, see the top of the file. */
static void row_bounds(const ptc_graph *g, const ptc_node *n, int64_t *m_send, int64_t *m_recv)
{
    const ptc_value *x = &g->values[n->in[0]];
    /* the tokens routed together: a microbatch's, over the mesh (not over mb, which is time) */
    int64_t tokens = x->type.dims[0] * x->type.dims[1], all = tokens;
    for (int a = 0; a < g->mesh.naxes; a++)
        if (x->place[a].kind == PTC_PLACE_SHARD && x->place[a].dim <= 1 &&
            strcmp(g->mesh.names[a], "mb") != 0)
            all *= g->mesh.sizes[a];
    int64_t K = g->values[n->in[1]].type.dims[2], E = n->attrs.n, el = E / n->attrs.group;
    int64_t C = ptc_moe_capacity(n->attrs.capacity, all, K, E), G = tokens * n->attrs.group;
    int64_t a = tokens * K, b = E * (tokens < C ? tokens : C);
    *m_send = a < b ? a : b;
    a = el * (G < C ? G : C);
    b = G * (K < el ? K : el);
    *m_recv = a < b ? a : b;
    if (*m_send < 1)
        *m_send = 1;
    if (*m_recv < 1)
        *m_recv = 1;
}

static ptc_attrs a2a_attrs(const ptc_node *n, int64_t len, int to)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_ALL_TO_ALL_V);
    at.mesh_axis = n->attrs.mesh_axis;
    at.group = n->attrs.group;
    at.n = n->attrs.n;
    at.len = len;
    at.to = to;
    return at;
}

static ptc_attrs ffn_attrs(ptc_op op, const ptc_node *n)
{
    ptc_attrs at = ptc_attrs_default(op);
    at.act = n->attrs.act;
    at.n = n->attrs.n;
    at.mesh_axis = n->attrs.mesh_axis;
    at.group = n->attrs.group;
    return at;
}

static void forward(ep *e, const ptc_node *n)
{
    int x = e->vmap[n->in[0]], route = e->vmap[n->in[1]], gate = e->vmap[n->in[2]];
    int wu = e->vmap[n->in[3]], wd = e->vmap[n->in[4]];
    int64_t m_send, m_recv;
    row_bounds(e->g, n, &m_send, &m_recv);
    ptc_attrs at = ptc_attrs_default(PTC_OP_MOE_EP_COUNT);
    at.n = n->attrs.n;
    int kc = emit(e, PTC_OP_MOE_EP_COUNT, &route, 1, &at, NULL, false);
    at = ptc_attrs_default(PTC_OP_ALLGATHER);
    at.mesh_axis = n->attrs.mesh_axis;
    at.group = n->attrs.group;
    at.axis = 0;
    int counts = kc < 0 ? -1 : emit(e, PTC_OP_ALLGATHER, &kc, 1, &at, NULL, false);
    at = ptc_attrs_default(PTC_OP_MOE_PACK);
    at.len = m_send;
    int rows = counts < 0 ? -1 : emit(e, PTC_OP_MOE_PACK, (int[]){x, route}, 2, &at, NULL, false);
    at = a2a_attrs(n, m_recv, 0);
    int recv =
        rows < 0 ? -1 : emit(e, PTC_OP_ALL_TO_ALL_V, (int[]){rows, counts}, 2, &at, NULL, false);
    at = ffn_attrs(PTC_OP_MOE_EP_FFN, n);
    int o = recv < 0
                ? -1
                : emit(e, PTC_OP_MOE_EP_FFN, (int[]){recv, counts, wu, wd}, 4, &at, NULL, true);
    at = a2a_attrs(n, m_send, 1);
    int back = o < 0 ? -1 : emit(e, PTC_OP_ALL_TO_ALL_V, (int[]){o, counts}, 2, &at, NULL, true);
    int y = back < 0 ? -1
                     : emit(e, PTC_OP_MOE_COMBINE, (int[]){back, route, gate}, 3, NULL, NULL, true);
    bind(e, n->out[0], y);
    PTC_GROW(e->fwd, e->capfwd, e->nfwd);
    e->fwd[e->nfwd++] = (fwd_parts){route, counts, recv, back};
}

static void backward(ep *e, const ptc_node *n)
{
    int route = e->vmap[n->in[1]], gate = e->vmap[n->in[2]];
    int wu = e->vmap[n->in[3]], wd = e->vmap[n->in[4]], dy = e->vmap[n->in[5]];
    const fwd_parts *f = NULL;
    for (int i = 0; i < e->nfwd && !f; i++)
        f = e->fwd[i].route == route ? &e->fwd[i] : NULL;
    if (!f) {
        ptc_fmt(e->err, e->errn,
                "internal error: the moe_ep pass found no forward for the "
                "expert-parallel moe_ffn_grad at line %d",
                n->loc.line);
        e->failed = true;
        return;
    }
    int64_t m_send, m_recv;
    row_bounds(e->g, n, &m_send, &m_recv);
    int cg[2], fg[3];
    emit(e, PTC_OP_MOE_COMBINE_GRAD, (int[]){f->back, route, gate, dy}, 4, NULL, cg, false);
    ptc_attrs at = a2a_attrs(n, m_recv, 0);
    int drecv = e->failed
                    ? -1
                    : emit(e, PTC_OP_ALL_TO_ALL_V, (int[]){cg[0], f->counts}, 2, &at, NULL, false);
    at = ffn_attrs(PTC_OP_MOE_EP_FFN_GRAD, n);
    if (drecv >= 0)
        emit(e, PTC_OP_MOE_EP_FFN_GRAD, (int[]){f->recv, f->counts, wu, wd, drecv}, 5, &at, fg,
             true);
    at = a2a_attrs(n, m_send, 1);
    int dback = e->failed
                    ? -1
                    : emit(e, PTC_OP_ALL_TO_ALL_V, (int[]){fg[0], f->counts}, 2, &at, NULL, true);
    int dx =
        dback < 0 ? -1 : emit(e, PTC_OP_MOE_UNPACK, (int[]){dback, route}, 2, NULL, NULL, true);
    if (e->failed)
        return;
    bind(e, n->out[0], dx);
    bind(e, n->out[1], cg[1]);
    bind(e, n->out[2], fg[1]);
    bind(e, n->out[3], fg[2]);
}

static void copy_node(ep *e, const ptc_node *n)
{
    int in[PTC_MAX_RESULTS * 4], out[PTC_MAX_RESULTS];
    PTC_ASSERT(n->nin <= (int)(sizeof in / sizeof in[0]));
    for (int k = 0; k < n->nin; k++)
        in[k] = e->vmap[n->in[k]];
    ptc_pass_build(e->out, "the moe_ep pass", n->op, in, n->nin, &n->attrs, n->loc, out, &e->failed,
                   e->err, e->errn);
    if (e->failed)
        return;
    ptc_node *c = &e->out->nodes[e->out->nnodes - 1];
    c->stage = n->stage;
    c->recompute = n->recompute;
    for (int k = 0; k < n->nout; k++)
        bind(e, n->out[k], out[k]);
}

static bool expert_parallel(const ptc_node *n)
{
    return (n->op == PTC_OP_MOE_FFN || n->op == PTC_OP_MOE_FFN_GRAD) && n->attrs.group > 1;
}

/* The moe_stats of every layer as outputs of a training step, summed over the microbatches (an
 * allreduce over mb: the lowering's sum in time). */
static void stats_outputs(ptc_graph *g, char *err, size_t errn, bool *failed)
{
    int mb = -1, nn = g->nnodes;
    for (int a = 0; a < g->mesh.naxes; a++)
        if (strcmp(g->mesh.names[a], "mb") == 0 && g->mesh.sizes[a] > 1)
            mb = a;
    if (g->noutputs == 0) /* a forward program: no step line to show them */
        return;
    for (int i = 0; i < nn && !*failed; i++) {
        if (g->nodes[i].op != PTC_OP_MOE_STATS)
            continue;
        int v = g->nodes[i].out[0];
        if (mb >= 0) {
            ptc_attrs at = ptc_attrs_default(PTC_OP_ALLREDUCE);
            at.mesh_axis = mb;
            at.group = g->mesh.sizes[mb];
            ptc_loc loc = g->nodes[i].loc;
            g->values[v].place[mb] = (ptc_placement){.kind = PTC_PLACE_PARTIAL};
            int sum;
            ptc_pass_build(g, "the moe_ep pass", PTC_OP_ALLREDUCE, &v, 1, &at, loc, &sum, failed,
                           err, errn);
            v = sum;
        }
        if (!*failed)
            ptc_graph_add_output(g, v);
    }
}

int ptc_pass_moe_ep(ptc_pass_ctx *ctx)
{
    const ptc_graph *g = ctx->g;
    bool any = false, failed = false;
    for (int i = 0; i < g->nnodes && !any; i++)
        any = expert_parallel(&g->nodes[i]);
    if (any) {
        ep e = {.g = g, .err = ctx->err, .errn = ctx->errn};
        e.out = ptc_pass_graph_like(g);
        e.vmap = ptc_xmalloc(sizeof(int) * (size_t)(g->nvalues ? g->nvalues : 1));
        for (int i = 0; i < g->nnodes && !e.failed; i++) {
            const ptc_node *n = &g->nodes[i];
            e.loc = n->loc;
            e.like = &g->values[n->out[0]];
            if (!expert_parallel(n))
                copy_node(&e, n);
            else if (n->op == PTC_OP_MOE_FFN)
                forward(&e, n);
            else
                backward(&e, n);
        }
        if (!e.failed)
            ptc_pass_map_ends(e.out, g, e.vmap);
        free(e.vmap);
        free(e.fwd);
        if (e.failed) {
            ptc_graph_free(e.out);
            return -1;
        }
        ptc_graph_free(ctx->g);
        ctx->g = e.out;
    }
    stats_outputs(ctx->g, ctx->err, ctx->errn, &failed);
    return failed ? -1 : 0;
}
