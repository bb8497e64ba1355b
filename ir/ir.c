/* ir.c - the op table instantiated from ops.def, types, and the graph builder. */
#include "ir.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const ptc_op_info ptc_ops[PTC_NOPS] = {
#define OP(id, nm, nin_, nout_, lp, kw_, req_, fl, ...)                                            \
    [PTC_OP_##id] = {.name = nm,                                                                   \
                     .nin = nin_,                                                                  \
                     .nout = nout_,                                                                \
                     .langpos = lp,                                                                \
                     .kw = kw_,                                                                    \
                     .req = req_,                                                                  \
                     .flags = fl,                                                                  \
                     .defaults = {__VA_ARGS__}},
#include "ops.def"
#undef OP
};

static const struct {
    const char *name;
    ptc_attr_kind kind;
    size_t offset;
} attr_table[PTC_A_COUNT] = {
#define ATTR(id, nm, k, field) [PTC_A_BIT_##id] = {nm, PTC_AK_##k, offsetof(ptc_attrs, field)},
#include "attrs.def"
#undef ATTR
};

static int attr_index(unsigned bit)
{
    for (int i = 0; i < PTC_A_COUNT; i++)
        if (bit == (1u << i))
            return i;
    return -1;
}

const char *ptc_attr_name(unsigned bit)
{
    int i = attr_index(bit);
    return i >= 0 ? attr_table[i].name : "?";
}

unsigned ptc_attr_lookup(const char *name)
{
    for (int i = 0; i < PTC_A_COUNT; i++)
        if (strcmp(attr_table[i].name, name) == 0)
            return 1u << i;
    return 0;
}

ptc_attr_kind ptc_attr_kind_of(unsigned bit)
{
    int i = attr_index(bit);
    PTC_ASSERT(i >= 0);
    return attr_table[i].kind;
}

void *ptc_attr_field(ptc_attrs *attrs, unsigned bit)
{
    int i = attr_index(bit);
    PTC_ASSERT(i >= 0);
    return (char *)attrs + attr_table[i].offset;
}

ptc_op ptc_op_lookup(const char *name)
{
    for (int i = 0; i < PTC_NOPS; i++)
        if (strcmp(ptc_ops[i].name, name) == 0)
            return (ptc_op)i;
    return PTC_NOPS;
}

static const char *const act_names[PTC_NACTS] = {"gelu", "relu", "silu", "swiglu"};

const char *ptc_act_name(int act)
{
    return act >= 0 && act < PTC_NACTS ? act_names[act] : "?";
}

int ptc_act_parse(const char *name, ptc_act *out)
{
    for (int i = 0; i < PTC_NACTS; i++)
        if (strcmp(name, act_names[i]) == 0) {
            *out = (ptc_act)i;
            return 0;
        }
    return -1;
}

static const char *const dtype_names[PTC_NDTYPES] = {"f32", "bf16", "f16", "i32"};

const char *ptc_dtype_name(ptc_dtype t)
{
    return (unsigned)t < PTC_NDTYPES ? dtype_names[t] : "?";
}

int ptc_dtype_size(ptc_dtype t)
{
    return t == PTC_BF16 || t == PTC_F16 ? 2 : 4;
}

int ptc_dtype_parse(const char *name, ptc_dtype *out)
{
    for (int i = 0; i < PTC_NDTYPES; i++)
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (ptc_dtype)i;
            return 0;
        }
    return -1;
}

int64_t ptc_type_numel(const ptc_type *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->dims[i];
    return n;
}

bool ptc_type_eq(const ptc_type *a, const ptc_type *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return false;
    return true;
}

char *ptc_type_str(const ptc_type *t, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "%s[", ptc_dtype_name(t->dtype));
    for (int i = 0; i < t->rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)t->dims[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

ptc_attrs ptc_attrs_default(ptc_op op)
{
    PTC_ASSERT((unsigned)op < PTC_NOPS);
    return ptc_ops[op].defaults;
}

int ptc_mesh_nranks(const ptc_mesh *m)
{
    int n = 1;
    for (int i = 0; i < m->naxes; i++)
        n *= m->sizes[i];
    return n;
}

void ptc_mesh_coords(const ptc_mesh *m, int rank, int *coords)
{
    for (int i = m->naxes - 1; i >= 0; i--) {
        coords[i] = rank % m->sizes[i];
        rank /= m->sizes[i];
    }
}

int ptc_mesh_group(const ptc_mesh *m, int rank, int axis, int *members)
{
    int stride = 1;
    for (int i = m->naxes - 1; i > axis; i--)
        stride *= m->sizes[i];
    int coords[PTC_MAX_MESH_AXES];
    ptc_mesh_coords(m, rank, coords);
    int base = rank - coords[axis] * stride;
    for (int k = 0; k < m->sizes[axis]; k++)
        members[k] = base + k * stride;
    return m->sizes[axis];
}

ptc_optim ptc_optim_default(ptc_optim_kind kind)
{
    if (kind == PTC_OPTIM_SGD)
        return (ptc_optim){.kind = PTC_OPTIM_SGD, .lr = 1e-3};
    return (ptc_optim){.kind = PTC_OPTIM_ADAMW,
                       .lr = 1e-3,
                       .beta1 = 0.9,
                       .beta2 = 0.999,
                       .eps = 1e-8,
                       .weight_decay = 0.01};
}

/* The settings of each optimizer and the range each must be in. */
static const struct {
    const char *key;
    size_t off;
    unsigned kinds; /* 1 << ptc_optim_kind */
    double lo, hi;  /* lo <= v < hi; lo_open: lo < v */
    bool lo_open;
} optim_keys[] = {
    {"lr", offsetof(ptc_optim, lr), 3, 0, INFINITY, true},
    {"beta1", offsetof(ptc_optim, beta1), 1, 0, 1, false},
    {"beta2", offsetof(ptc_optim, beta2), 1, 0, 1, false},
    {"eps", offsetof(ptc_optim, eps), 1, 0, INFINITY, false},
    {"weight_decay", offsetof(ptc_optim, weight_decay), 3, 0, INFINITY, false},
    {"momentum", offsetof(ptc_optim, momentum), 2, 0, 1, false},
};
#define NOPTIM_KEYS (int)(sizeof optim_keys / sizeof optim_keys[0])

int ptc_optim_key(ptc_optim_kind kind, const char *key, char *err, size_t errn)
{
    for (int k = 0; k < NOPTIM_KEYS; k++)
        if (strcmp(optim_keys[k].key, key) == 0 && (optim_keys[k].kinds & (1u << kind)))
            return k;
    ptc_fmt(err, errn, "unknown setting '%s' of %s (it takes %s)", key,
            kind == PTC_OPTIM_ADAMW ? "adamw" : "sgd",
            kind == PTC_OPTIM_ADAMW ? "lr, beta1, beta2, eps, weight_decay"
                                    : "lr, momentum, weight_decay");
    return -1;
}

int ptc_optim_set(ptc_optim *o, const char *key, double v, char *err, size_t errn)
{
    int k = ptc_optim_key(o->kind, key, err, errn);
    if (k < 0)
        return -1;
    if (!isfinite(v)) {
        ptc_fmt(err, errn, "%s must be a finite number, got %g", key, v);
        return -1;
    }
    if (optim_keys[k].lo_open ? v <= optim_keys[k].lo : v < optim_keys[k].lo) {
        ptc_fmt(err, errn, "%s must be %s, got %.15g", key,
                optim_keys[k].lo_open ? "positive" : "zero or more", v);
        return -1;
    }
    if (v >= optim_keys[k].hi) {
        ptc_fmt(err, errn, "%s must be less than %g, got %.15g", key, optim_keys[k].hi, v);
        return -1;
    }
    *(double *)((char *)o + optim_keys[k].off) = v;
    return k;
}

ptc_graph *ptc_graph_new(const char *name)
{
    ptc_graph *g = ptc_xcalloc(1, sizeof *g);
    g->arena = ptc_arena_new();
    g->name = ptc_arena_strdup(g->arena, name ? name : "main");
    g->loss = -1;
    g->optim = ptc_optim_default(PTC_OPTIM_ADAMW);
    g->max_nodes = 4 << 20;
    return g;
}

void ptc_graph_free(ptc_graph *g)
{
    if (!g)
        return;
    free(g->nodes);
    free(g->values);
    free(g->outputs);
    free(g->updates);
    ptc_arena_free(g->arena);
    free(g);
}

void ptc_graph_add_output(ptc_graph *g, int value)
{
    PTC_ASSERT(value >= 0 && value < g->nvalues);
    PTC_GROW(g->outputs, g->capoutputs, g->noutputs);
    g->outputs[g->noutputs++] = value;
}

void ptc_graph_add_update(ptc_graph *g, int state, int to)
{
    PTC_ASSERT(state >= 0 && state < g->nvalues && to >= 0 && to < g->nvalues);
    PTC_GROW(g->updates, g->capupdates, g->nupdates);
    g->updates[g->nupdates++] = (struct ptc_update){state, to};
}

int ptc_build(ptc_graph *g, ptc_op op, const int *in, int nin, const ptc_attrs *attrs, ptc_loc loc,
              int *out, char *err, size_t errn)
{
    PTC_ASSERT((unsigned)op < PTC_NOPS);
    if (g->nnodes >= g->max_nodes) {
        ptc_fmt(err, errn, "model too large: more than %d operations after unrolling",
                g->max_nodes);
        return -1;
    }
    ptc_type it[nin > 0 ? nin : 1];
    for (int i = 0; i < nin; i++) {
        PTC_ASSERT(in[i] >= 0 && in[i] < g->nvalues);
        it[i] = g->values[in[i]].type;
    }
    ptc_attrs a = attrs ? *attrs : ptc_attrs_default(op);
    ptc_type ot[PTC_MAX_RESULTS];
    int nout = ptc_infer(op, it, nin, &a, ot, err, errn);
    if (nout < 0)
        return -1;
    if (a.name)
        a.name = ptc_arena_strdup(g->arena, a.name);
    if (loc.file)
        loc.file = ptc_arena_strdup(g->arena, loc.file);
    if (loc.scope) { /* nodes of one instance share one copy */
        if (!g->last_scope || strcmp(g->last_scope, loc.scope) != 0)
            g->last_scope = ptc_arena_strdup(g->arena, loc.scope);
        loc.scope = g->last_scope;
    }

    int nid = g->nnodes;
    PTC_GROW(g->nodes, g->capnodes, nid);
    ptc_node *n = &g->nodes[nid];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->nin = nin;
    n->nout = nout;
    n->in = ptc_arena_alloc(g->arena, sizeof(int) * (size_t)(nin ? nin : 1));
    n->out = ptc_arena_alloc(g->arena, sizeof(int) * (size_t)nout);
    if (nin)
        memcpy(n->in, in, sizeof(int) * (size_t)nin);
    n->attrs = a;
    n->loc = loc;
    for (int i = 0; i < nout; i++) {
        int vid = g->nvalues;
        PTC_GROW(g->values, g->capvalues, vid);
        ptc_value *v = &g->values[vid];
        memset(v, 0, sizeof *v);
        v->type = ot[i];
        v->def = nid;
        v->index = i;
        g->nvalues++;
        n->out[i] = vid;
        if (out)
            out[i] = vid;
    }
    g->nnodes++;
    return 0;
}

int ptc_build1(ptc_graph *g, ptc_op op, const int *in, int nin, const ptc_attrs *attrs, ptc_loc loc,
               char *err, size_t errn)
{
    int out[PTC_MAX_RESULTS];
    if (ptc_build(g, op, in, nin, attrs, loc, out, err, errn) < 0)
        return -1;
    PTC_ASSERT(g->nodes[g->nnodes - 1].nout == 1);
    return out[0];
}

int ptc_graph_params(const ptc_graph *g, int *node_ids, int cap)
{
    int k = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == PTC_OP_PARAM) {
            if (k < cap)
                node_ids[k] = i;
            k++;
        }
    return k;
}

int64_t ptc_graph_param_count(const ptc_graph *g)
{
    int64_t total = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == PTC_OP_PARAM) {
            int64_t n = ptc_type_numel(&g->values[g->nodes[i].out[0]].type);
            total = n > INT64_MAX - total ? INT64_MAX : total + n;
        }
    return total;
}

bool ptc_op_storage16(ptc_op op)
{
    switch (op) {
    case PTC_OP_ATTENTION:
    case PTC_OP_ATTENTION_GRAD:
    case PTC_OP_ATTENTION_SHARD:
    case PTC_OP_ATTENTION_SHARD_GRAD:
    case PTC_OP_CONCAT:
    case PTC_OP_SUM_TO:
    case PTC_OP_SUMSQ:
    case PTC_OP_LAYERNORM_GRAD:
    case PTC_OP_RMSNORM_GRAD: return true;
    default: return false;
    }
}
