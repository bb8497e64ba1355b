/* interp.c - reference execution of a logical graph (see interp.h). */
#include "interp.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref.h"
#include "spmd.h"

struct ptrt_interp {
    const ptc_graph *g;
    void **buf;
    bool *given;
    ptrt_kernel_fn kernels;
    ptrt_spmd_ctx *spmd;
    bool profile;
    double prof_s[PTC_NOPS]; /* seconds spent in each op kind since profiling was switched on */
    int64_t prof_calls[PTC_NOPS];
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

void ptrt_interp_set_spmd(ptrt_interp *it, ptrt_spmd_ctx *ctx)
{
    it->spmd = ctx;
}

int64_t ptrt_interp_global_index(const ptrt_interp *it, int v, int64_t i)
{
    if (!it->spmd)
        return i;
    const ptc_value *val = &it->g->values[v];
    return ptrt_spmd_global_index(&val->type, val->place, it->spmd->mesh, it->spmd->coords, i);
}

/* Fills value v's local buffer with init's values for the matching elements of the full tensor,
 * in runs of consecutive global indices. */
void ptrt_interp_fill(ptrt_interp *it, int v, const ptc_init *init, const char *name, uint64_t seed)
{
    float *buf = ptrt_interp_buffer(it, v);
    int64_t n = ptc_type_numel(&it->g->values[v].type);
    for (int64_t i = 0; i < n;) {
        int64_t g0 = ptrt_interp_global_index(it, v, i), len = 1;
        while (i + len < n && ptrt_interp_global_index(it, v, i + len) == g0 + len)
            len++;
        ptrt_init_param(init, name, seed, buf + i, g0, len);
        i += len;
    }
}

void ptrt_interp_init_params(ptrt_interp *it, uint64_t seed)
{
    const ptc_graph *g = it->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_PARAM && n->op != PTC_OP_STATE)
            continue;
        ptrt_interp_fill(it, n->out[0], &n->attrs.init, n->attrs.name, seed);
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

void ptrt_interp_set_profile(ptrt_interp *it, bool on)
{
    it->profile = on;
    memset(it->prof_s, 0, sizeof it->prof_s);
    memset(it->prof_calls, 0, sizeof it->prof_calls);
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ptrt_interp_print_profile(const ptrt_interp *it, FILE *f, int64_t steps)
{
    int order[PTC_NOPS], n = 0;
    double total = 0;
    for (int op = 0; op < PTC_NOPS; op++)
        if (it->prof_calls[op]) {
            order[n++] = op;
            total += it->prof_s[op];
        }
    for (int i = 1; i < n; i++) /* insertion sort, largest time first */
        for (int j = i; j > 0 && it->prof_s[order[j]] > it->prof_s[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double per = steps > 0 ? (double)steps : 1.0;
    fprintf(f, "%-20s %8s %12s %7s\n", "op", "calls", "ms/step", "share");
    for (int i = 0; i < n; i++) {
        int op = order[i];
        fprintf(f, "%-20s %8lld %12.3f %6.1f%%\n", ptc_ops[op].name,
                (long long)((double)it->prof_calls[op] / per + 0.5), 1e3 * it->prof_s[op] / per,
                total > 0 ? 100.0 * it->prof_s[op] / total : 0.0);
    }
    fprintf(f, "%-20s %8s %12.3f %6.1f%%\n", "total", "", 1e3 * total / per, 100.0);
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
        char msg[1024];
        double t0 = it->profile ? seconds() : 0;
        bool spmd = ptc_ops[n->op].flags & (PTC_F_COMM | PTC_F_RANKDEP | PTC_F_SPMD);
        int rc;
        if (spmd && !it->spmd) {
            ptc_fmt(msg, sizeof msg, "an SPMD op in a program run without ranks");
            rc = -1;
        } else if (spmd) {
            rc = ptrt_spmd_run(it->spmd, n, it_, in, ot, out, msg, sizeof msg);
        } else {
            rc = it->kernels(n, it_, in, ot, out, msg, sizeof msg);
        }
        if (it->profile) {
            it->prof_s[n->op] += seconds() - t0;
            it->prof_calls[n->op]++;
        }
        if (rc < 0) {
            if (n->loc.line)
                ptc_fmt(err, errn, "%s:%d:%d: %s: %s", n->loc.file ? n->loc.file : "?", n->loc.line,
                        n->loc.col, ptc_ops[n->op].name, msg);
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
