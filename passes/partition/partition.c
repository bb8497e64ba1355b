/* partition.c - the SPMD partition pass: the walker, redistribution and emission (see
 * partition.h for the method; the per-op rules are in shard_rules.c).
 *
 * Assumes: a verified graph (logical, or already partitioned over the inner mesh axes) and a mesh
 *   in ctx->opts. Axes named "tp" are tensor-parallel, "dp" data-parallel.
 * Guarantees: ctx->g is replaced by the rank program: every value has its rank-local type and a
 *   placement per mesh axis; every redistribution is an explicit collective or local op; the loss
 *   and the gradient-norm output are Replicate; every update stores a value whose placement is
 *   that of its parameter or state. One program serves every rank (rank-dependent offsets are
 *   resolved from the rank's coordinates when it runs).
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "partition.h"

typedef struct cache_entry {
    ptc_placement pl;
    int nv;
} cache_entry;

enum { DEF_NONE, DEF_SOURCE, DEF_TRANSPOSE };

struct part {
    const ptc_graph *g;
    ptc_graph *out;
    int axis, T;
    part_kind kind;
    const ptc_compile_opts *o;
    int *vmap;         /* old value -> new value, -1 while deferred */
    ptc_placement *pl; /* old value -> placement of vmap[v] on this axis */
    uint8_t *deferred; /* DEF_* */
    cache_entry (*cache)[6];
    uint8_t *ncache;
    int *ce_m, *ce_s;
    char *err;
    size_t errn;
    bool failed;
    int cur; /* node being partitioned */
};

const ptc_graph *part_graph(const part *p)
{
    return p->g;
}
part_kind part_axis_kind(const part *p)
{
    return p->kind;
}
int part_size(const part *p)
{
    return p->T;
}
int part_axis(const part *p)
{
    return p->axis;
}
bool part_seq_parallel(const part *p)
{
    return p->kind == PART_TENSOR && p->o->seq_parallel;
}
int part_zero(const part *p)
{
    return p->kind == PART_DATA ? p->o->zero : 0;
}

int part_error(part *p, int ni, const char *fmt, ...)
{
    if (p->failed)
        return -1;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const ptc_loc *l = ni >= 0 ? &p->g->nodes[ni].loc : NULL;
    if (l && l->line)
        ptc_fmt(p->err, p->errn, "%s:%d:%d: error: %s", l->file ? l->file : "?", l->line, l->col,
                msg);
    else
        ptc_fmt(p->err, p->errn, "error: %s", msg);
    p->failed = true;
    return -1;
}

void part_set_ce_stats(part *p, int old_logits, int m, int s)
{
    p->ce_m[old_logits] = m;
    p->ce_s[old_logits] = s;
}

bool part_ce_stats(const part *p, int old_logits, int *m, int *s)
{
    *m = p->ce_m[old_logits];
    *s = p->ce_s[old_logits];
    return *m >= 0;
}

bool part_pinned(const part *p, int v, ptc_placement *pl)
{
    const ptc_node *n = &p->g->nodes[p->g->values[v].def];
    if (n->op != PTC_OP_PARAM || !n->attrs.name)
        return false;
    for (int i = p->o->npins - 1; i >= 0; i--) {
        const ptc_pin *pin = &p->o->pins[i];
        if (strcmp(pin->axis, p->g->mesh.names[p->axis]) == 0 &&
            ptc_glob_match(pin->pattern, n->attrs.name)) {
            *pl = pin->pl;
            return true;
        }
    }
    return false;
}

/* ---- emission ---- */

static void set_place(part *p, int nv, const ptc_placement *other_axes, ptc_placement pl)
{
    ptc_value *v = &p->out->values[nv];
    if (other_axes)
        memcpy(v->place, other_axes, sizeof v->place);
    v->place[p->axis] = pl;
}

int part_emit(part *p, ptc_op op, const int *in, int nin, const ptc_attrs *at, ptc_loc loc,
              int *outs)
{
    if (p->failed)
        return -1;
    int tmp[PTC_MAX_RESULTS];
    int *o = outs ? outs : tmp;
    char msg[512];
    if (ptc_build(p->out, op, in, nin, at, loc, o, msg, sizeof msg) < 0) {
        part_error(p, p->cur, "internal error: partitioning over %s made an invalid %s: %s",
                   p->g->mesh.names[p->axis], ptc_ops[op].name, msg);
        return -1;
    }
    /* results inherit the placements of the first operand on the other axes; callers fix this
     * axis through part_bind */
    ptc_node *n = &p->out->nodes[p->out->nnodes - 1];
    for (int k = 0; k < n->nout; k++)
        if (nin)
            set_place(p, n->out[k], p->out->values[in[0]].place, pl_r());
    return o[0];
}

void part_bind(part *p, int v, int nv, ptc_placement pl)
{
    p->vmap[v] = nv;
    p->pl[v] = pl;
    if (nv >= 0) {
        /* placements on the other axes are those of the old value (already partitioned axes) */
        set_place(p, nv, p->g->values[v].place, pl);
    }
}

/* Local size of dim d of old value v under placement pl, or -1 if T does not divide it. */
static int64_t local_dim(const part *p, int64_t size, ptc_placement pl)
{
    int64_t parts = (int64_t)p->T * pl_groups(pl);
    if (pl.kind != PTC_PLACE_SHARD)
        return size;
    return size % parts ? -1 : size / p->T;
}

/* The local type of old value v under pl; false (after an error naming what does not divide). */
static bool local_type(part *p, int v, ptc_placement pl, ptc_type *t)
{
    *t = p->g->values[v].type;
    if (pl.kind != PTC_PLACE_SHARD)
        return true;
    if (pl.dim < 0 || pl.dim >= t->rank) {
        part_error(p, p->cur, "internal error: placement S%d of a rank-%d value", pl.dim, t->rank);
        return false;
    }
    int64_t l = local_dim(p, t->dims[pl.dim], pl);
    if (l < 0) {
        const ptc_node *def = &p->g->nodes[p->g->values[v].def];
        char ty[160];
        ptc_type_str(&p->g->values[v].type, ty, sizeof ty);
        bool named = def->attrs.name && (ptc_ops[def->op].flags & PTC_F_SOURCE);
        if (named && def->loc.line)
            ptc_fmt(p->err, p->errn,
                    "%s:%d:%d: error: mesh axis %s=%d does not divide dimension %d (size %lld) of "
                    "%s '%s' %s%s",
                    def->loc.file ? def->loc.file : "?", def->loc.line, def->loc.col,
                    p->g->mesh.names[p->axis], p->T, pl.dim, (long long)t->dims[pl.dim],
                    def->op == PTC_OP_INPUT ? "input" : "parameter", def->attrs.name, ty,
                    pl_groups(pl) > 1 ? " (split into groups, as a fused weight)" : "");
        else
            part_error(p, p->cur,
                       "mesh axis %s=%d does not divide dimension %d (size %lld) of %s, the %s "
                       "here needs it sharded",
                       p->g->mesh.names[p->axis], p->T, pl.dim, (long long)t->dims[pl.dim], ty,
                       ptc_ops[p->g->nodes[p->cur].op].name);
        p->failed = true;
        return false;
    }
    t->dims[pl.dim] = l;
    return true;
}

static ptc_attrs comm_attrs(const part *p, ptc_op op)
{
    ptc_attrs at = ptc_attrs_default(op);
    at.mesh_axis = p->axis;
    at.group = p->T;
    return at;
}

static bool is_param(const part *p, int v)
{
    return p->g->nodes[p->g->values[v].def].op == PTC_OP_PARAM;
}

/* ZeRO-3 releases gathered parameters after use: each use gathers its own copy. */
static bool cacheable(const part *p, int v)
{
    return !(p->kind == PART_DATA && p->o->zero >= 3 && is_param(p, v));
}

/* One redistribution step from (nv, from) to `to`; returns the new value or -1. */
static int convert(part *p, int v, int nv, ptc_placement from, ptc_placement to)
{
    ptc_loc loc = p->g->nodes[p->cur].loc;
    ptc_attrs at;
    ptc_type lt;
    if (!local_type(p, v, to, &lt))
        return -1;
    if (from.kind == PTC_PLACE_REPLICATE && to.kind == PTC_PLACE_SHARD) {
        at = comm_attrs(p, PTC_OP_SHARD_SLICE);
        at.axis = to.dim;
        at.n = pl_groups(to);
        return part_emit(p, PTC_OP_SHARD_SLICE, &nv, 1, &at, loc, NULL);
    }
    if (from.kind == PTC_PLACE_REPLICATE && to.kind == PTC_PLACE_PARTIAL) {
        at = comm_attrs(p, PTC_OP_PARTIALIZE);
        return part_emit(p, PTC_OP_PARTIALIZE, &nv, 1, &at, loc, NULL);
    }
    if (from.kind == PTC_PLACE_SHARD && to.kind == PTC_PLACE_REPLICATE) {
        at = comm_attrs(p, PTC_OP_ALLGATHER);
        at.axis = from.dim;
        at.n = pl_groups(from);
        return part_emit(p, PTC_OP_ALLGATHER, &nv, 1, &at, loc, NULL);
    }
    if (from.kind == PTC_PLACE_SHARD && to.kind == PTC_PLACE_SHARD && pl_groups(from) == 1 &&
        pl_groups(to) == 1) {
        at = comm_attrs(p, PTC_OP_ALL_TO_ALL);
        at.axis = from.dim;
        at.to = to.dim;
        return part_emit(p, PTC_OP_ALL_TO_ALL, &nv, 1, &at, loc, NULL);
    }
    if (from.kind == PTC_PLACE_PARTIAL && to.kind == PTC_PLACE_REPLICATE) {
        at = comm_attrs(p, PTC_OP_ALLREDUCE);
        return part_emit(p, PTC_OP_ALLREDUCE, &nv, 1, &at, loc, NULL);
    }
    if (from.kind == PTC_PLACE_PARTIAL && to.kind == PTC_PLACE_SHARD) {
        at = comm_attrs(p, PTC_OP_REDUCE_SCATTER);
        at.axis = to.dim;
        at.n = pl_groups(to);
        return part_emit(p, PTC_OP_REDUCE_SCATTER, &nv, 1, &at, loc, NULL);
    }
    /* Shard -> Partial, or Shard -> differently grouped Shard: through Replicate */
    int r = convert(p, v, nv, from, pl_r());
    return r < 0 ? -1 : convert(p, v, r, pl_r(), to);
}

static int cache_find(const part *p, int v, ptc_placement pl)
{
    for (int i = 0; i < p->ncache[v]; i++)
        if (pl_eq(p->cache[v][i].pl, pl))
            return p->cache[v][i].nv;
    return -1;
}

static void cache_add(part *p, int v, ptc_placement pl, int nv)
{
    if (p->ncache[v] < 6)
        p->cache[v][p->ncache[v]++] = (cache_entry){pl, nv};
}

int part_redist(part *p, int v, ptc_placement to)
{
    if (p->failed)
        return -1;
    PTC_ASSERT(p->vmap[v] >= 0);
    if (pl_eq(p->pl[v], to))
        return p->vmap[v];
    int nv = cacheable(p, v) ? cache_find(p, v, to) : -1;
    if (nv >= 0)
        return nv;
    /* ZeRO-1 reduces gradients with an allreduce and keeps this rank's part */
    if (p->kind == PART_DATA && p->o->zero == 1 && p->pl[v].kind == PTC_PLACE_PARTIAL &&
        to.kind == PTC_PLACE_SHARD) {
        int r = part_redist(p, v, pl_r());
        nv = r < 0 ? -1 : convert(p, v, r, pl_r(), to);
    } else {
        nv = convert(p, v, p->vmap[v], p->pl[v], to);
    }
    if (nv < 0)
        return -1;
    set_place(p, nv, p->g->values[v].place, to);
    if (cacheable(p, v))
        cache_add(p, v, to, nv);
    return nv;
}

/* ---- sources ---- */

/* Storage placement of a parameter or optimizer state on this axis, given what its first use
 * asks for. */
static ptc_placement storage(part *p, int v, ptc_placement want)
{
    ptc_placement pin;
    if (part_pinned(p, v, &pin))
        return pin;
    const ptc_type *t = &p->g->values[v].type;
    if (p->kind == PART_DATA) {
        ptc_op op = p->g->nodes[p->g->values[v].def].op;
        int level = op == PTC_OP_PARAM ? 3 : 1; /* ZeRO stage that shards it */
        if (p->o->zero >= level && t->rank >= 1 && t->dims[0] % p->T == 0)
            return pl_s(0, 1);
        return pl_r();
    }
    return want.kind == PLACE_UNDECIDED || want.kind == PTC_PLACE_PARTIAL ? pl_r() : want;
}

static int emit_source(part *p, int v, ptc_placement want)
{
    const ptc_node *n = &p->g->nodes[p->g->values[v].def];
    ptc_node copy = *n;
    ptc_placement st =
        n->op == PTC_OP_FILL ? (want.kind == PLACE_UNDECIDED ? pl_r() : want) : storage(p, v, want);
    if (n->op == PTC_OP_FILL && st.kind == PTC_PLACE_PARTIAL)
        st = pl_r(); /* a fill of zeros is also a valid partial; others are replicated */
    ptc_type lt;
    int save = p->cur;
    p->cur = p->g->values[v].def;
    if (!local_type(p, v, st, &lt)) {
        p->cur = save;
        return -1;
    }
    ptc_attrs at = copy.attrs;
    at.nshape = lt.rank;
    memcpy(at.shape, lt.dims, sizeof(int64_t) * (size_t)lt.rank);
    int nv = part_emit(p, copy.op, NULL, 0, &at, copy.loc, NULL);
    p->cur = save;
    if (nv < 0)
        return -1;
    p->out->nodes[p->out->nnodes - 1].stage = copy.stage;
    if (n->op == PTC_OP_FILL && n->attrs.value == 0 && want.kind == PTC_PLACE_PARTIAL)
        st = pl_p();
    if (n->op == PTC_OP_FILL) {
        set_place(p, nv, p->g->values[v].place, st);
        cache_add(p, v, st, nv);
        return nv;
    }
    part_bind(p, v, nv, st);
    p->deferred[v] = DEF_NONE;
    return nv;
}

static ptc_placement transposed(ptc_placement pl, int rank)
{
    if (pl.kind == PTC_PLACE_SHARD && pl.dim >= rank - 2)
        pl.dim = (int8_t)(pl.dim == rank - 1 ? rank - 2 : rank - 1);
    return pl;
}

/* The new value of old value v in placement want, emitting deferred sources. */
static int obtain(part *p, int v, ptc_placement want)
{
    if (p->failed)
        return -1;
    if (p->deferred[v] == DEF_TRANSPOSE) {
        const ptc_node *t = &p->g->nodes[p->g->values[v].def];
        int src = t->in[0];
        int rank = p->g->values[v].type.rank;
        ptc_placement sw = want.kind == PLACE_UNDECIDED ? want : transposed(want, rank);
        int ns = obtain(p, src, sw);
        if (ns < 0)
            return -1;
        int nv = part_emit(p, PTC_OP_TRANSPOSE, &ns, 1, NULL, t->loc, NULL);
        part_bind(p, v, nv, transposed(p->pl[src], rank));
        p->deferred[v] = DEF_NONE;
    } else if (p->deferred[v] == DEF_SOURCE) {
        if (p->g->nodes[p->g->values[v].def].op == PTC_OP_FILL) {
            ptc_placement w = want.kind == PLACE_UNDECIDED ? pl_r() : want;
            int nv = cache_find(p, v, w);
            return nv >= 0 ? nv : emit_source(p, v, w);
        }
        if (emit_source(p, v, want) < 0)
            return -1;
    }
    if (want.kind == PLACE_UNDECIDED)
        return p->vmap[v];
    return part_redist(p, v, want);
}

int part_obtain(part *p, int v, ptc_placement pl)
{
    return obtain(p, v, pl);
}

int part_const(part *p, double value, ptc_loc loc)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_CONST);
    at.value = value;
    at.dtype = PTC_F32;
    int nv = part_emit(p, PTC_OP_CONST, NULL, 0, &at, loc, NULL);
    if (nv >= 0)
        set_place(p, nv, NULL, pl_r());
    return nv;
}

/* The placement a rule should see for old value v: a Partial value that has already been
 * reduced (for another consumer) is offered in its reduced form, so it is not reduced twice. */
static ptc_placement best_placement(const part *p, int v)
{
    if (p->pl[v].kind != PTC_PLACE_PARTIAL)
        return p->pl[v];
    for (int i = 0; i < p->ncache[v]; i++)
        if (p->cache[v][i].pl.kind != PTC_PLACE_PARTIAL)
            return p->cache[v][i].pl;
    return p->pl[v];
}

static int input_source(part *p, int ni)
{
    const ptc_node *n = &p->g->nodes[ni];
    int v = n->out[0];
    ptc_placement pl = pl_r();
    const ptc_type *t = &p->g->values[v].type;
    /* model inputs are split over the batch on a data-parallel axis; scalars are replicated */
    if (p->kind == PART_DATA && t->rank >= 1 && strncmp(n->attrs.name, "opt.", 4) != 0)
        pl = pl_s(0, 1);
    ptc_type lt;
    if (!local_type(p, v, pl, &lt))
        return -1;
    ptc_attrs at = n->attrs;
    at.nshape = lt.rank;
    memcpy(at.shape, lt.dims, sizeof(int64_t) * (size_t)lt.rank);
    int nv = part_emit(p, PTC_OP_INPUT, NULL, 0, &at, n->loc, NULL);
    part_bind(p, v, nv, pl);
    return nv < 0 ? -1 : 0;
}

/* ---- plain emission: the op with local attributes ---- */

static void localize(part *p, const ptc_node *n, const rule_out *ro, ptc_attrs *at)
{
    int T = p->T;
    switch (n->op) {
    case PTC_OP_RESHAPE:
    case PTC_OP_BROADCAST_TO:
    case PTC_OP_SUM_TO: {
        ptc_type lt;
        if (local_type(p, n->out[0], ro->out[0], &lt)) {
            at->nshape = lt.rank;
            memcpy(at->shape, lt.dims, sizeof(int64_t) * (size_t)lt.rank);
        }
        break;
    }
    case PTC_OP_ATTENTION:
    case PTC_OP_ATTENTION_GRAD:
    case PTC_OP_ROPE:
    case PTC_OP_ROPE_GRAD:
        if (ro->req[0].kind == PTC_PLACE_SHARD && ro->req[0].dim == 2) {
            at->heads /= T;
            if (at->kv_heads)
                at->kv_heads /= T;
        }
        break;
    case PTC_OP_EMBEDDING_GRAD:
        if (ro->out[0].kind == PTC_PLACE_SHARD && ro->out[0].dim == 0)
            at->n /= T;
        break;
    case PTC_OP_PAD:
        if (ro->out[0].kind == PTC_PLACE_SHARD && ro->out[0].dim == at->axis)
            at->len /= T;
        break;
    default: break;
    }
}

static int emit_plain(part *p, int ni, rule_out *ro)
{
    const ptc_node *n0 = &p->g->nodes[ni];
    ptc_node n = *n0;
    int ins[PTC_MAX_RESULTS * 2], outs[PTC_MAX_RESULTS];
    int oldin[PTC_MAX_RESULTS * 2], oldout[PTC_MAX_RESULTS];
    PTC_ASSERT(n.nin <= PTC_MAX_RESULTS * 2);
    memcpy(oldin, n.in, sizeof(int) * (size_t)n.nin);
    memcpy(oldout, n.out, sizeof(int) * (size_t)n.nout);
    for (int k = 0; k < n.nin; k++)
        if ((ins[k] = obtain(p, oldin[k], ro->req[k])) < 0)
            return -1;
    ptc_attrs at = n.attrs;
    localize(p, &n, ro, &at);
    if (p->failed || part_emit(p, n.op, ins, n.nin, &at, n.loc, outs) < 0)
        return -1;
    ptc_node *e = &p->out->nodes[p->out->nnodes - 1];
    e->stage = n.stage;
    e->recompute = n.recompute;
    for (int k = 0; k < n.nout; k++) {
        ptc_type want;
        if (!local_type(p, oldout[k], ro->out[k], &want))
            return -1;
        if (!ptc_type_eq(&want, &p->out->values[outs[k]].type)) {
            char a[160], b[160];
            return part_error(
                p, ni, "internal error: %s over %s gives %s, placement %c%d expects %s",
                ptc_ops[n.op].name, p->g->mesh.names[p->axis],
                ptc_type_str(&p->out->values[outs[k]].type, a, sizeof a), "RSP"[ro->out[k].kind],
                ro -> out[k].dim, ptc_type_str(&want, b, sizeof b));
        }
        part_bind(p, oldout[k], outs[k], ro->out[k]);
    }
    return 0;
}

static int partition_node(part *p, int ni)
{
    const ptc_node *n = &p->g->nodes[ni];
    p->cur = ni;
    switch (n->op) {
    case PTC_OP_INPUT: return input_source(p, ni);
    case PTC_OP_CONST: {
        ptc_node c = *n;
        int nv = part_emit(p, PTC_OP_CONST, NULL, 0, &c.attrs, c.loc, NULL);
        part_bind(p, c.out[0], nv, pl_r());
        return nv < 0 ? -1 : 0;
    }
    case PTC_OP_PARAM:
    case PTC_OP_STATE:
    case PTC_OP_FILL: {
        p->deferred[n->out[0]] = DEF_SOURCE;
        ptc_placement pin;
        if (part_pinned(p, n->out[0], &pin))
            return obtain(p, n->out[0], pin) < 0 ? -1 : 0;
        return 0;
    }
    case PTC_OP_TRANSPOSE:
        if (p->deferred[n->in[0]] == DEF_SOURCE &&
            p->g->nodes[p->g->values[n->in[0]].def].op != PTC_OP_FILL) {
            p->deferred[n->out[0]] = DEF_TRANSPOSE;
            return 0;
        }
        break;
    default: break;
    }
    ptc_placement in[PTC_MAX_RESULTS * 2];
    bool update = n->op == PTC_OP_ADAMW_UPDATE || n->op == PTC_OP_SGD_UPDATE;
    for (int k = 0; k < n->nin; k++) {
        in[k] = p->deferred[n->in[k]] ? (ptc_placement){PLACE_UNDECIDED, 0, 0}
                                      : best_placement(p, n->in[k]);
        /* ZeRO-3: a parameter is gathered before every use but its update */
        if (p->kind == PART_DATA && !update && is_param(p, n->in[k]))
            in[k] = pl_r();
    }
    rule_out ro;
    memset(&ro, 0, sizeof ro);
    if (ptc_shard_rule(p, ni, in, &ro) < 0)
        return -1;
    if (ro.emit == EMIT_CUSTOM)
        return ptc_shard_emit_custom(p, ni, in, &ro);
    return emit_plain(p, ni, &ro);
}

/* Loss and gradient norm end Replicate; updates store values placed like their state. */
static int finish(part *p)
{
    const ptc_graph *g = p->g;
    p->cur = g->loss >= 0 ? g->values[g->loss].def : -1;
    if (g->loss >= 0) {
        int nv = part_redist(p, g->loss, pl_r());
        if (nv < 0)
            return -1;
        p->out->loss = nv;
    }
    for (int i = 0; i < g->noutputs; i++) {
        int v = g->outputs[i];
        p->cur = g->values[v].def;
        int nv = i == 0 ? part_redist(p, v, pl_r())
                        : obtain(p, v, (ptc_placement){PLACE_UNDECIDED, 0, 0});
        if (nv < 0)
            return -1;
        ptc_graph_add_output(p->out, nv);
    }
    for (int i = 0; i < g->nupdates; i++) {
        int st = g->updates[i].state, to = g->updates[i].to;
        p->cur = g->values[to].def;
        if (p->deferred[st] && obtain(p, st, (ptc_placement){PLACE_UNDECIDED, 0, 0}) < 0)
            return -1;
        int nv = part_redist(p, to, p->pl[st]);
        if (nv < 0)
            return -1;
        ptc_graph_add_update(p->out, p->vmap[st], nv);
    }
    return 0;
}

static ptc_graph *partition_axis(const ptc_graph *g, int axis, part_kind kind,
                                 const ptc_compile_opts *o, char *err, size_t errn)
{
    part p = {.g = g,
              .axis = axis,
              .T = g->mesh.sizes[axis],
              .kind = kind,
              .o = o,
              .err = err,
              .errn = errn};
    int nv = g->nvalues ? g->nvalues : 1;
    p.out = ptc_graph_new(g->name);
    p.out->optim = g->optim;
    p.out->mesh = g->mesh;
    p.vmap = ptc_xmalloc(sizeof(int) * (size_t)nv);
    p.pl = ptc_xcalloc((size_t)nv, sizeof(ptc_placement));
    p.deferred = ptc_xcalloc((size_t)nv, 1);
    p.cache = ptc_xcalloc((size_t)nv, sizeof *p.cache);
    p.ncache = ptc_xcalloc((size_t)nv, 1);
    p.ce_m = ptc_xmalloc(sizeof(int) * (size_t)nv);
    p.ce_s = ptc_xmalloc(sizeof(int) * (size_t)nv);
    for (int i = 0; i < nv; i++)
        p.vmap[i] = p.ce_m[i] = p.ce_s[i] = -1;
    for (int i = 0; i < g->nnodes && !p.failed; i++)
        partition_node(&p, i);
    if (!p.failed)
        finish(&p);
    free(p.vmap);
    free(p.pl);
    free(p.deferred);
    free(p.cache);
    free(p.ncache);
    free(p.ce_m);
    free(p.ce_s);
    if (p.failed) {
        ptc_graph_free(p.out);
        return NULL;
    }
    return p.out;
}

int ptc_pass_partition(ptc_pass_ctx *ctx)
{
    const ptc_mesh *m = &ctx->opts->mesh;
    if (m->naxes == 0 || ptc_mesh_nranks(m) == 1)
        return 0;
    ctx->g->mesh = *m;
    /* innermost axis first: the data-parallel pass partitions the tensor-parallel program */
    for (int a = m->naxes - 1; a >= 0; a--) {
        if (m->sizes[a] == 1)
            continue;
        part_kind kind;
        if (strcmp(m->names[a], "tp") == 0)
            kind = PART_TENSOR;
        else if (strcmp(m->names[a], "dp") == 0)
            kind = PART_DATA;
        else {
            ptc_fmt(ctx->err, ctx->errn, "error: mesh axis '%s' is not supported (dp, tp)",
                    m->names[a]);
            return -1;
        }
        ptc_graph *ng = partition_axis(ctx->g, a, kind, ctx->opts, ctx->err, ctx->errn);
        if (!ng)
            return -1;
        ptc_graph_free(ctx->g);
        ctx->g = ng;
    }
    free(ctx->grads); /* gradient ids named the logical graph */
    ctx->grads = NULL;
    return 0;
}
