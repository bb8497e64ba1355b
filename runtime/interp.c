/* interp.c - reference execution of a logical graph (see interp.h). */
#include "interp.h"

#include <stdlib.h>
#include <string.h>

#include "ref.h"

struct ptrt_interp {
    const ptc_graph *g;
    void **buf;
    bool *given;
    ptrt_kernel_fn kernels;
};

ptrt_interp *ptrt_interp_new(const ptc_graph *g)
{
    ptrt_interp *it = ptc_xcalloc(1, sizeof *it);
    it->g = g;
    it->buf = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(void *));
    it->given = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(bool));
    it->kernels = ptrt_ref_run;
    return it;
}

void ptrt_interp_free(ptrt_interp *it)
{
    if (!it)
        return;
    for (int i = 0; i < it->g->nvalues; i++)
        free(it->buf[i]);
    free(it->buf);
    free(it->given);
    free(it);
}

void *ptrt_interp_buffer(ptrt_interp *it, int v)
{
    PTC_ASSERT(v >= 0 && v < it->g->nvalues);
    if (!it->buf[v])
        it->buf[v] = ptc_xcalloc((size_t)ptc_type_numel(&it->g->values[v].type), 4);
    return it->buf[v];
}

void ptrt_interp_mark_given(ptrt_interp *it, int v)
{
    it->given[v] = true;
}

void ptrt_interp_init_params(ptrt_interp *it, uint64_t seed)
{
    const ptc_graph *g = it->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_PARAM && n->op != PTC_OP_STATE)
            continue;
        int v = n->out[0];
        ptrt_init_param(&n->attrs.init, n->attrs.name, seed, ptrt_interp_buffer(it, v), 0,
                        ptc_type_numel(&g->values[v].type));
    }
}

/* Exclusive upper bound for the ids in i32 value v, from the ops that consume it (0 = none). */
static int64_t id_bound(const ptc_graph *g, int v)
{
    int64_t bound = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        int64_t b = 0;
        if (n->op == PTC_OP_EMBEDDING && n->in[1] == v)
            b = g->values[n->in[0]].type.dims[0];
        else if (n->op == PTC_OP_CROSS_ENTROPY && n->in[1] == v) {
            const ptc_type *t = &g->values[n->in[0]].type;
            b = t->dims[t->rank - 1];
        }
        if (b && (!bound || b < bound))
            bound = b;
    }
    return bound;
}

int ptrt_interp_random_inputs(ptrt_interp *it, uint64_t seed, char *err, size_t errn)
{
    const ptc_graph *g = it->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        int v = n->out[0];
        if (n->op != PTC_OP_INPUT || it->given[v])
            continue;
        int64_t numel = ptc_type_numel(&g->values[v].type);
        if (g->values[v].type.dtype != PTC_I32) {
            ptc_init init = {.kind = PTC_INIT_NORMAL, .a = 1.0};
            ptrt_init_param(&init, n->attrs.name, seed, ptrt_interp_buffer(it, v), 0, numel);
            continue;
        }
        int64_t bound = id_bound(g, v);
        if (!bound) {
            ptc_fmt(err, errn,
                    "cannot choose random values for i32 input '%s': give it with --input %s=FILE",
                    n->attrs.name, n->attrs.name);
            return -1;
        }
        float *u = ptc_xmalloc((size_t)numel * sizeof(float));
        ptc_init init = {.kind = PTC_INIT_UNIFORM, .a = 0.0, .b = 1.0};
        ptrt_init_param(&init, n->attrs.name, seed, u, 0, numel);
        int32_t *ids = ptrt_interp_buffer(it, v);
        for (int64_t k = 0; k < numel; k++) {
            int64_t id = (int64_t)(u[k] * (double)bound);
            ids[k] = (int32_t)(id < bound ? id : bound - 1);
        }
        free(u);
    }
    return 0;
}

void ptrt_interp_set_kernels(ptrt_interp *it, ptrt_kernel_fn fn)
{
    it->kernels = fn;
}

static int run_nodes(ptrt_interp *it, const bool *mask, char *err, size_t errn)
{
    const ptc_graph *g = it->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op == PTC_OP_INPUT || n->op == PTC_OP_PARAM || n->op == PTC_OP_STATE)
            continue;
        if (mask && !mask[i])
            continue;
        ptc_type it_[n->nin ? n->nin : 1], ot[PTC_MAX_RESULTS];
        void *in[n->nin ? n->nin : 1], *out[PTC_MAX_RESULTS];
        for (int k = 0; k < n->nin; k++) {
            it_[k] = g->values[n->in[k]].type;
            in[k] = ptrt_interp_buffer(it, n->in[k]);
        }
        for (int k = 0; k < n->nout; k++) {
            ot[k] = g->values[n->out[k]].type;
            out[k] = ptrt_interp_buffer(it, n->out[k]);
        }
        char msg[400];
        if (it->kernels(n, it_, in, ot, out, msg, sizeof msg) < 0) {
            if (n->loc.line)
                ptc_fmt(err, errn, "%s:%d:%d: %s: %s", n->loc.file ? n->loc.file : "?",
                        n->loc.line, n->loc.col, ptc_ops[n->op].name, msg);
            else
                ptc_fmt(err, errn, "%s: %s", ptc_ops[n->op].name, msg);
            return -1;
        }
    }
    return 0;
}

int ptrt_interp_run(ptrt_interp *it, char *err, size_t errn)
{
    return run_nodes(it, NULL, err, errn);
}

int ptrt_interp_run_for(ptrt_interp *it, int v, char *err, size_t errn)
{
    const ptc_graph *g = it->g;
    bool *need = ptc_xcalloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof(bool));
    bool *live = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(bool));
    live[v] = true;
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const ptc_node *n = &g->nodes[i];
        for (int k = 0; k < n->nout && !need[i]; k++)
            need[i] = live[n->out[k]];
        for (int k = 0; need[i] && k < n->nin; k++)
            live[n->in[k]] = true;
    }
    int rc = run_nodes(it, need, err, errn);
    free(need);
    free(live);
    return rc;
}

void ptrt_interp_apply_updates(ptrt_interp *it)
{
    const ptc_graph *g = it->g;
    for (int i = 0; i < g->nupdates; i++) {
        int st = g->updates[i].state, to = g->updates[i].to;
        memcpy(ptrt_interp_buffer(it, st), ptrt_interp_buffer(it, to),
               (size_t)ptc_type_numel(&g->values[st].type) * 4);
    }
}

int ptrt_graph_find(const ptc_graph *g, ptc_op op, const char *name)
{
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == op && g->nodes[i].attrs.name &&
            strcmp(g->nodes[i].attrs.name, name) == 0)
            return g->nodes[i].out[0];
    return -1;
}
