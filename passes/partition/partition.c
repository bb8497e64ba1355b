/* partition.c - the SPMD partition pass: the walker, redistribution and emission (see
 * partition.h for the method; the per-op rules are in shard_rules.c).
 *
 * Assumes: a verified graph (logical, or already partitioned over the inner mesh axes) and a mesh
 *   in ctx->opts. Axes named "tp" are tensor-parallel, "dp" data-parallel, "ep" expert-parallel
 *   (data-parallel but for the experts of moe layers, which it splits).
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
    bool bwd; /* made in the backward (after the loss) */
} cache_entry;

enum { DEF_NONE, DEF_SOURCE, DEF_TRANSPOSE };

struct part {
    const ptc_graph *g;
    ptc_graph *out;
    int axis, T;
    part_kind kind;
    int zero; /* the ZeRO stage on this axis (only dp has one) */
    const ptc_compile_opts *o;
    int *vmap;         /* old value -> new value, -1 while deferred */
    ptc_placement *pl; /* old value -> placement of vmap[v] on this axis */
    uint8_t *deferred; /* DEF_* */
    cache_entry (*cache)[6];
    uint8_t *ncache;
    char *err;
    size_t errn;
    bool failed;
    int cur;       /* node being partitioned */
    int fwd_end;   /* the node that computes the loss: later nodes are backward and update */
    bool regather; /* sequence parallelism keeps shards and all-gathers again in backward */
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
    return p->zero;
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

const ptc_graph *part_out(const part *p)
{
    return p->out;
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

void part_set_place(part *p, int nv, int like, ptc_placement pl)
{
    if (nv >= 0)
        set_place(p, nv, like >= 0 ? p->g->values[like].place : NULL, pl);
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

/* Local size of a dim of `size` under placement pl, or -1 if T does not divide it (or, for a
 * shard with a remainder, if the remainder is not what T leaves). */
static int64_t local_dim(const part *p, int64_t size, ptc_placement pl)
{
    int64_t parts = (int64_t)p->T * pl_groups(pl);
    if (pl.kind != PTC_PLACE_SHARD)
        return size;
    if (pl.rem)
        return size % p->T == pl.rem && size >= p->T ? size / p->T + pl.rem : -1;
    return size % parts ? -1 : size / p->T;
}

ptc_placement part_zero_placement(const part *p, const ptc_type *t)
{
    /* dim 0 when T divides it (the plain shard), else the first dim T divides; else the dim
     * with the fewest elements left over (size % T slices, held whole by every rank: no
     * padding, so every local element is an element of the full tensor); Replicate only when
     * no dim has T slices (a tensor smaller than the axis in every dim) */
    int best = -1;
    int64_t best_extra = 0, numel = ptc_type_numel(t);
    for (int d = 0; d < t->rank; d++)
        if (t->dims[d] % p->T == 0)
            return pl_s(d, 1);
    for (int d = 0; d < t->rank; d++) {
        int64_t extra = (t->dims[d] % p->T) * (numel / t->dims[d]);
        if (t->dims[d] >= p->T && (best < 0 || extra < best_extra)) {
            best = d;
            best_extra = extra;
        }
    }
    return best < 0 ? pl_r() : pl_rem(best, (int)(t->dims[best] % p->T));
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

static bool moe_experts(ptc_op op)
{
    return op == PTC_OP_MOE_FFN || op == PTC_OP_MOE_FFN_GRAD;
}

/* ZeRO-3 releases gathered parameters after use: each use gathers its own copy. */
static bool cacheable(const part *p, int v)
{
    return !(p->zero >= 3 && is_param(p, v));
}

/* A local slice [start, start + len) of dim d of new value nv, placed like `pl` on this axis. */
static int slice_of(part *p, int nv, int d, int64_t start, int64_t len, ptc_placement pl)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_SLICE);
    at.axis = d;
    at.start = start;
    at.len = len;
    int r = part_emit(p, PTC_OP_SLICE, &nv, 1, &at, p->g->nodes[p->cur].loc, NULL);
    if (r >= 0)
        set_place(p, r, NULL, pl);
    return r;
}

/* A collective or shard slice over this axis on dim d of nv (allreduce: d unused). */
static int axis_op(part *p, ptc_op op, int nv, int d, ptc_placement out)
{
    ptc_attrs at = comm_attrs(p, op);
    if (op != PTC_OP_ALLREDUCE)
        at.axis = d;
    int r = part_emit(p, op, &nv, 1, &at, p->g->nodes[p->cur].loc, NULL);
    if (r >= 0)
        set_place(p, r, NULL, out);
    return r;
}

static int convert(part *p, int v, int nv, ptc_placement from, ptc_placement to);

/* Redistributions to and from a shard with a remainder (dim d of size n = T*q + rem): the first
 * T*q slices move as a plain shard does, the last rem slices as a replicated value does (from
 * Partial: one small allreduce). Replicate or Partial -> remainder shard, and back to
 * Replicate; anything else goes through Replicate. */
static int convert_rem(part *p, int v, int nv, ptc_placement from, ptc_placement to)
{
    const ptc_type *t = &p->g->values[v].type;
    ptc_placement rg = from.rem ? from : to;
    int d = rg.dim, r = rg.rem, b, tail;
    int64_t q = t->dims[d] / p->T;
    if (to.rem && (from.kind == PTC_PLACE_REPLICATE || from.kind == PTC_PLACE_PARTIAL)) {
        bool part = from.kind == PTC_PLACE_PARTIAL;
        b = slice_of(p, nv, d, 0, q * p->T, from);
        b = b < 0 ? -1
                  : axis_op(p, part ? PTC_OP_REDUCE_SCATTER : PTC_OP_SHARD_SLICE, b, d, pl_s(d, 1));
        tail = b < 0 ? -1 : slice_of(p, nv, d, q * p->T, r, from);
        if (part && tail >= 0)
            tail = axis_op(p, PTC_OP_ALLREDUCE, tail, d, pl_r());
    } else if (from.rem && to.kind == PTC_PLACE_REPLICATE) {
        b = slice_of(p, nv, d, 0, q, pl_s(d, 1));
        b = b < 0 ? -1 : axis_op(p, PTC_OP_ALLGATHER, b, d, pl_r());
        tail = b < 0 ? -1 : slice_of(p, nv, d, q, r, pl_r());
    } else {
        int rep = convert(p, v, nv, from, pl_r());
        return rep < 0 ? -1 : convert(p, v, rep, pl_r(), to);
    }
    if (tail < 0)
        return -1;
    ptc_attrs at = ptc_attrs_default(PTC_OP_CONCAT);
    at.axis = d;
    return part_emit(p, PTC_OP_CONCAT, (int[]){b, tail}, 2, &at, p->g->nodes[p->cur].loc, NULL);
}

/* One redistribution step from (nv, from) to `to`; returns the new value or -1. */
static int convert(part *p, int v, int nv, ptc_placement from, ptc_placement to)
{
    ptc_loc loc = p->g->nodes[p->cur].loc;
    ptc_attrs at;
    ptc_type lt;
    if (!local_type(p, v, to, &lt))
        return -1;
    if (from.rem || to.rem)
        return convert_rem(p, v, nv, from, to);
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

/* A redistribution of v to pl made before; bwd_only: only one made in the backward. */
static int cache_find(const part *p, int v, ptc_placement pl, bool bwd_only)
{
    for (int i = 0; i < p->ncache[v]; i++)
        if (pl_eq(p->cache[v][i].pl, pl) && (p->cache[v][i].bwd || !bwd_only))
            return p->cache[v][i].nv;
    return -1;
}

static void cache_add(part *p, int v, ptc_placement pl, int nv)
{
    if (p->ncache[v] < 6)
        p->cache[v][p->ncache[v]++] = (cache_entry){pl, nv, p->cur > p->fwd_end};
}

/* With the shard-keeping choice of sequence parallelism, the backward all-gathers a sharded
 * activation again rather than reuse the copy the forward gathered, which is then freed after
 * its forward use; only the shard stays live until the backward. */
static bool regathers(const part *p, int v, ptc_placement to)
{
    ptc_op def = p->g->nodes[p->g->values[v].def].op;
    return p->regather && p->cur > p->fwd_end && to.kind == PTC_PLACE_REPLICATE &&
           p->pl[v].kind == PTC_PLACE_SHARD && !(ptc_ops[def].flags & PTC_F_SOURCE);
}

bool part_available(const part *p, int v, ptc_placement pl)
{
    if (p->vmap[v] < 0)
        return false;
    return pl_eq(p->pl[v], pl) ||
           (cacheable(p, v) && cache_find(p, v, pl, regathers(p, v, pl)) >= 0);
}

int part_redist(part *p, int v, ptc_placement to)
{
    if (p->failed)
        return -1;
    PTC_ASSERT(p->vmap[v] >= 0);
    if (pl_eq(p->pl[v], to))
        return p->vmap[v];
    bool again = regathers(p, v, to);
    int nv = cacheable(p, v) ? cache_find(p, v, to, again) : -1;
    if (nv >= 0)
        return nv;
    /* a gather the forward made too: mark it as rebuilt in the backward */
    bool rebuilt = again && cache_find(p, v, to, false) >= 0;
    /* ZeRO-1 reduces gradients with an allreduce and keeps this rank's part */
    if (p->zero == 1 && p->pl[v].kind == PTC_PLACE_PARTIAL &&
        to.kind == PTC_PLACE_SHARD) {
        int r = part_redist(p, v, pl_r());
        nv = r < 0 ? -1 : convert(p, v, r, pl_r(), to);
    } else {
        nv = convert(p, v, p->vmap[v], p->pl[v], to);
    }
    if (nv < 0)
        return -1;
    set_place(p, nv, p->g->values[v].place, to);
    if (rebuilt)
        p->out->nodes[p->out->nnodes - 1].recompute = true;
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
    ptc_op op = p->g->nodes[p->g->values[v].def].op;
    int level = op == PTC_OP_PARAM ? 3 : 1; /* ZeRO stage that shards it */
    if (p->kind == PART_DATA)
        return p->zero >= level ? part_zero_placement(p, &p->g->values[v].type) : pl_r();
    /* ep is data parallel but for the experts, whose split on dim 0 (E, which ep divides) is
     * what ZeRO's placement gives them too */
    if (p->kind == PART_EXPERT && p->zero >= level)
        return part_zero_placement(p, &p->g->values[v].type);
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
        if (!cacheable(p, src)) {
            /* the transpose of a ZeRO-3 parameter is released after each use like the
             * parameter: every use gathers and transposes its own copy */
            int ns = obtain(p, src, pl_r());
            int nv = ns < 0 ? -1 : part_emit(p, PTC_OP_TRANSPOSE, &ns, 1, NULL, t->loc, NULL);
            if (nv >= 0)
                set_place(p, nv, p->g->values[v].place, pl_r());
            return nv < 0 || want.kind == PLACE_UNDECIDED || want.kind == PTC_PLACE_REPLICATE
                       ? nv
                       : convert(p, v, nv, pl_r(), want);
        }
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
            int nv = cache_find(p, v, w, false);
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

int part_const(part *p, double value, ptc_dtype dt, ptc_loc loc)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_CONST);
    at.value = value;
    at.dtype = dt;
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
    /* model inputs are split over the batch on a data-parallel axis (ep is one outside the
     * experts); scalars are replicated */
    if (p->kind != PART_TENSOR && t->rank >= 1 && strncmp(n->attrs.name, "opt.", 4) != 0)
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

static bool takes_ragged(ptc_op op)
{
    return (ptc_ops[op].flags & (PTC_F_UNARY | PTC_F_BINARY)) || op == PTC_OP_CAST ||
           op == PTC_OP_ADAMW_UPDATE || op == PTC_OP_SGD_UPDATE || op == PTC_OP_SUMSQ;
}

/* The placements node ni's rule sees for its operands, and what the rule decides. */
static int rule_of(part *p, int ni, ptc_placement *in, rule_out *ro)
{
    const ptc_node *n = &p->g->nodes[ni];
    bool update = n->op == PTC_OP_ADAMW_UPDATE || n->op == PTC_OP_SGD_UPDATE;
    for (int k = 0; k < n->nin; k++) {
        in[k] = p->deferred[n->in[k]] ? PL_UNDECIDED : best_placement(p, n->in[k]);
        /* ZeRO-3: a parameter is gathered before every use but its update (and, over ep, but
         * the experts' use of their split weights; over dp, an ep gather of the parameter
         * that gathers this axis's shard with it) */
        if (p->zero >= 3 && !update && is_param(p, n->in[k]) &&
            (p->kind == PART_DATA || (p->kind == PART_EXPERT && !moe_experts(n->op)))) {
            ptc_placement held = p->deferred[n->in[k]] == DEF_SOURCE
                                     ? storage(p, n->in[k], in[k]) /* (its first use) */
                                     : in[k],
                          merged;
            in[k] = ptc_shard_merges_with_ep(p, n, held, &merged) ? held : pl_r();
        }
        /* a shard with a remainder (ZeRO state and gradients) is only understood by the rules
         * of elementwise ops and sumsq; any other op sees it as what it gathers to */
        if (pl_ragged(in[k]) && !takes_ragged(n->op))
            in[k] = pl_r();
    }
    memset(ro, 0, sizeof *ro);
    return ptc_shard_rule(p, ni, in, ro);
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
        if ((p->deferred[n->in[0]] == DEF_SOURCE &&
             p->g->nodes[p->g->values[n->in[0]].def].op != PTC_OP_FILL) ||
            !cacheable(p, n->in[0])) {
            p->deferred[n->out[0]] = DEF_TRANSPOSE;
            return 0;
        }
        break;
    default: break;
    }
    ptc_placement in[PTC_MAX_RESULTS * 2];
    rule_out ro;
    if (rule_of(p, ni, in, &ro) < 0)
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
        int nv = i == 0 ? part_redist(p, v, pl_r()) : obtain(p, v, PL_UNDECIDED);
        /* the other outputs (gradients): the reduced form the update uses, when there is one, so
         * the unreduced gradient is not kept alive to the end of the step for an output */
        if (i > 0 && nv >= 0 && p->pl[v].kind == PTC_PLACE_PARTIAL)
            for (int k = 0; k < p->ncache[v]; k++)
                if (p->cache[v][k].pl.kind != PTC_PLACE_PARTIAL)
                    nv = p->cache[v][k].nv;
        if (nv < 0)
            return -1;
        ptc_graph_add_output(p->out, nv);
    }
    for (int i = 0; i < g->nupdates; i++) {
        int st = g->updates[i].state, to = g->updates[i].to;
        p->cur = g->values[to].def;
        if (p->deferred[st] && obtain(p, st, PL_UNDECIDED) < 0)
            return -1;
        int nv = part_redist(p, to, p->pl[st]);
        if (nv < 0)
            return -1;
        ptc_graph_add_update(p->out, p->vmap[st], nv);
    }
    return 0;
}

/* Partitions every node in order. A parameter's gradient is first used by the sumsq of the
 * global norm, after the whole backward; that is where its rule reduces it over the axis. The
 * walker makes that reduction (what the sumsq's rule asks of its operand) right after the node
 * that finishes the gradient instead, so it runs during the backward, as DDP and ZeRO schedule
 * it, and the unreduced gradient is freed there rather than kept, with every other unreduced
 * gradient, until the optimizer's part of the step. Likewise the loss is reduced where it is
 * computed, so the program's loss marks the end of its forward. */
static void walk(part *p)
{
    const ptc_graph *g = p->g;
    int nv = g->nvalues ? g->nvalues : 1;
    int *sumsq_of = ptc_xmalloc(sizeof(int) * (size_t)nv);
    for (int v = 0; v < nv; v++)
        sumsq_of[v] = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == PTC_OP_SUMSQ && sumsq_of[g->nodes[i].in[0]] < 0)
            sumsq_of[g->nodes[i].in[0]] = i;
    for (int i = 0; i < g->nnodes && !p->failed; i++) {
        partition_node(p, i);
        if (g->loss >= 0 && g->values[g->loss].def == i && !p->failed)
            part_redist(p, g->loss, pl_r());
        for (int k = 0; k < g->nodes[i].nout && !p->failed; k++) {
            int v = g->nodes[i].out[k], j = sumsq_of[v];
            ptc_placement in[PTC_MAX_RESULTS * 2];
            rule_out ro;
            if (j <= i || p->deferred[v] || p->pl[v].kind != PTC_PLACE_PARTIAL)
                continue;
            p->cur = j; /* the reduction belongs to the sumsq's parameter */
            if (rule_of(p, j, in, &ro) == 0 && ro.req[0].kind != PTC_PLACE_PARTIAL)
                obtain(p, v, ro.req[0]);
        }
    }
    free(sumsq_of);
}

static ptc_graph *partition_axis(const ptc_graph *g, int axis, part_kind kind,
                                 const ptc_compile_opts *o, bool regather, char *err, size_t errn)
{
    /* ZeRO shards over dp, and over ep (data parallel for all but the experts) */
    bool zero =
        kind == PART_EXPERT || (kind == PART_DATA && strcmp(g->mesh.names[axis], "dp") == 0);
    part p = {.g = g,
              .axis = axis,
              .T = g->mesh.sizes[axis],
              .kind = kind,
              .zero = zero ? o->zero : 0,
              .o = o,
              .err = err,
              .errn = errn,
              .fwd_end = g->loss >= 0 ? g->values[g->loss].def : g->nnodes,
              .regather = regather};
    int nv = g->nvalues ? g->nvalues : 1;
    p.out = ptc_graph_new(g->name);
    p.out->optim = g->optim;
    p.out->mesh = g->mesh;
    p.vmap = ptc_xmalloc(sizeof(int) * (size_t)nv);
    p.pl = ptc_xcalloc((size_t)nv, sizeof(ptc_placement));
    p.deferred = ptc_xcalloc((size_t)nv, 1);
    p.cache = ptc_xcalloc((size_t)nv, sizeof *p.cache);
    p.ncache = ptc_xcalloc((size_t)nv, 1);
    for (int i = 0; i < nv; i++)
        p.vmap[i] = -1;
    walk(&p);
    if (!p.failed)
        finish(&p);
    free(p.vmap);
    free(p.pl);
    free(p.deferred);
    free(p.cache);
    free(p.ncache);
    if (p.failed) {
        ptc_graph_free(p.out);
        return NULL;
    }
    return p.out;
}

/* ---- sequence parallelism: keep the gathered layer inputs, or the shards? ---- */

static int64_t value_bytes(const ptc_graph *g, int v)
{
    const ptc_type *t = &g->values[v].type;
    return ptc_type_numel(t) * ptc_dtype_size(t->dtype);
}

/* What a tensor-parallel program g (partitioned keeping the gathered tensors) costs per rank:
 * bytes sent over the axis per step (ring: allreduce 2N(t-1)/t, allgather and reduce-scatter
 * N(t-1)/t of the full N), the peak of live activations (every value but parameters and state,
 * freed after its last use), and the part of both that re-gathering would trade: the forward
 * all-gathers still live after the loss, each N(t-1)/t bytes to send again or to free. */
typedef struct sp_cost {
    int64_t sent, peak, stash;
    int nstash;
} sp_cost;

static void sp_cost_of(const ptc_graph *g, int axis, sp_cost *c)
{
    int64_t T = g->mesh.sizes[axis], live = 0;
    int loss = g->loss >= 0 ? g->values[g->loss].def : g->nnodes;
    int *last = ptc_xmalloc(sizeof(int) * (size_t)(g->nvalues ? g->nvalues : 1));
    int64_t *freed = ptc_xcalloc((size_t)g->nnodes + 1, sizeof(int64_t));
    memset(c, 0, sizeof *c);
    for (int v = 0; v < g->nvalues; v++)
        last[v] = g->values[v].def;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            last[g->nodes[i].in[k]] = i;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        bool comm = (ptc_ops[n->op].flags & PTC_F_COMM) && n->attrs.mesh_axis == axis;
        int64_t in = value_bytes(g, n->nin ? n->in[0] : n->out[0]);
        int64_t out = value_bytes(g, n->out[0]);
        int64_t full = n->op == PTC_OP_ALLREDUCE ? 2 * in : n->op == PTC_OP_ALLGATHER ? out : in;
        if (comm)
            c->sent += full * (T - 1) / T;
        if (comm && n->op == PTC_OP_ALLGATHER && i < loss && last[n->out[0]] > loss) {
            c->stash += out * (T - 1) / T;
            c->nstash++;
        }
        for (int k = 0; k < n->nout && n->op != PTC_OP_PARAM && n->op != PTC_OP_STATE; k++) {
            live += value_bytes(g, n->out[k]);
            freed[last[n->out[k]]] += value_bytes(g, n->out[k]);
        }
        c->peak = live > c->peak ? live : c->peak;
        live -= freed[i];
    }
    free(freed);
    free(last);
}

/* Re-gathering frees `stash` bytes of activations and sends as many bytes more. Each is weighed
 * against what the rank already spends: re-gather when it saves a larger fraction of the
 * activation peak than it adds to the bytes sent (stash/peak >= stash/sent, so when the step
 * already sends at least its activation peak: wide tensor parallelism, where the gathered copies
 * are t times the shards). */
static bool sp_choose(const ptc_compile_opts *o, const sp_cost *c)
{
    if (o->sp_stash != PTC_SP_STASH_AUTO)
        return o->sp_stash == PTC_SP_STASH_SHARD;
    return c->nstash > 0 && c->sent >= c->peak;
}

static ptc_graph *partition_tp(ptc_pass_ctx *ctx, int axis)
{
    const ptc_compile_opts *o = ctx->opts;
    ptc_graph *ng = partition_axis(ctx->g, axis, PART_TENSOR, o, false, ctx->err, ctx->errn);
    if (!ng || !o->seq_parallel)
        return ng;
    sp_cost c;
    sp_cost_of(ng, axis, &c);
    if (!c.nstash)
        return ng;
    bool shard = sp_choose(o, &c);
    /* one line for the plan: what was chosen, why, and what the other choice costs */
    ptc_fmt(ctx->notes, sizeof ctx->notes,
            "sequence parallel (%s): %d all-gathered layer inputs are %s for the backward: "
            "%lld bytes of activations per tp rank (peak %lld) against %lld bytes sent again "
            "over tp per step (%lld sent), counted at the whole batch before any data-parallel "
            "split\n",
            o->sp_stash == PTC_SP_STASH_AUTO ? "chosen" : "asked", c.nstash,
            shard ? "gathered again (1/t shards kept)" : "kept gathered", (long long)c.stash,
            (long long)c.peak, (long long)c.stash, (long long)c.sent);
    if (!shard)
        return ng;
    ptc_graph_free(ng);
    return partition_axis(ctx->g, axis, PART_TENSOR, o, true, ctx->err, ctx->errn);
}

/* The mesh the step is partitioned over: the compile mesh without its pipeline axis (stages are
 * the lowering's), with the microbatch axis "mb" right inside dp when the batch is split in time.
 * mb inside dp means a microbatch is a contiguous slice of the global batch, split over dp, and
 * the data-parallel reductions act on gradients already accumulated over the microbatches. ep
 * splits the batch too (it is data parallel outside the experts), so mb goes inside it as well:
 * a microbatch stays a contiguous slice, the tokens a mixture-of-experts layer routes together
 * whatever the mesh. */
static void partition_mesh(const ptc_compile_opts *o, ptc_mesh *m)
{
    memset(m, 0, sizeof *m);
    bool placed = o->microbatches <= 1;
    for (int a = 0; a < o->mesh.naxes; a++) {
        if (strcmp(o->mesh.names[a], "pp") == 0)
            continue;
        bool inner = strcmp(o->mesh.names[a], "dp") != 0 && strcmp(o->mesh.names[a], "ep") != 0;
        if (!placed && inner) {
            strcpy(m->names[m->naxes], "mb");
            m->sizes[m->naxes++] = o->microbatches;
            placed = true;
        }
        memcpy(m->names[m->naxes], o->mesh.names[a], PTC_MAX_AXIS_NAME);
        m->sizes[m->naxes++] = o->mesh.sizes[a];
    }
    if (!placed) {
        strcpy(m->names[m->naxes], "mb");
        m->sizes[m->naxes++] = o->microbatches;
    }
}

int ptc_pass_partition(ptc_pass_ctx *ctx)
{
    ptc_mesh mesh;
    partition_mesh(ctx->opts, &mesh);
    const ptc_mesh *m = &mesh;
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
        else if (strcmp(m->names[a], "dp") == 0 || strcmp(m->names[a], "mb") == 0)
            kind = PART_DATA;
        else if (strcmp(m->names[a], "ep") == 0)
            kind = PART_EXPERT;
        else {
            ptc_fmt(ctx->err, ctx->errn, "error: mesh axis '%s' is not supported (dp, ep, tp)",
                    m->names[a]);
            return -1;
        }
        ptc_graph *ng = kind == PART_TENSOR ? partition_tp(ctx, a)
                                            : partition_axis(ctx->g, a, kind, ctx->opts, false,
                                                             ctx->err, ctx->errn);
        if (!ng)
            return -1;
        ptc_graph_free(ctx->g);
        ctx->g = ng;
    }
    free(ctx->grads); /* gradient ids named the logical graph */
    ctx->grads = NULL;
    return 0;
}
