/* passes.c - the ordered pass list and its runner (see passes.h). */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

const ptc_pass ptc_passes[] = {
    {"precision", "the mixed-precision policy: 16-bit weights and activations (--precision)",
     ptc_pass_precision, false},
    {"moe", "mixture-of-experts layers into routing, experts and the auxiliary loss", ptc_pass_moe,
     false},
    {"autodiff", "reverse-mode gradient of the loss for every parameter", ptc_pass_autodiff, true},
    {"optimizer", "gradient clipping and the optimizer update, in the graph", ptc_pass_optimizer,
     true},
    {"partition", "SPMD partition over the mesh: placements, collectives, rank-local shapes",
     ptc_pass_partition, false},
    {"moe_ep", "expert-parallel experts as all-to-alls; the load-balance output", ptc_pass_moe_ep,
     false},
    {"pipeline", "pipeline stages cut by balance, activation recompute marks",
     ptc_pass_pipeline, true},
};
const int ptc_npasses = (int)(sizeof ptc_passes / sizeof ptc_passes[0]);

int ptc_run_passes(ptc_pass_ctx *ctx)
{
    const ptc_compile_opts *o = ctx->opts;
    for (int i = 0; i < ptc_npasses; i++) {
        const ptc_pass *p = &ptc_passes[i];
        if (p->train_only && !o->train)
            continue;
        char msg[512];
        if (p->run(ctx) < 0)
            return -1;
        if (o->verify_each && ptc_verify(ctx->g, msg, sizeof msg) < 0) {
            ptc_fmt(ctx->err, ctx->errn, "internal error: IR invalid after pass %s: %s", p->name,
                    msg);
            return -1;
        }
        if (o->dump_after && strcmp(o->dump_after, p->name) == 0)
            ptc_print(ctx->g, o->dump ? o->dump : stdout);
    }
    return 0;
}

void ptc_pass_build(ptc_graph *g, const char *pass, ptc_op op, const int *in, int nin,
                    const ptc_attrs *at, ptc_loc loc, int *out, bool *failed, char *err,
                    size_t errn)
{
    char msg[400];
    out[0] = -1;
    if (*failed)
        return;
    if (ptc_build(g, op, in, nin, at, loc, out, msg, sizeof msg) < 0) {
        ptc_fmt(err, errn, "internal error: %s built an invalid %s: %s", pass, ptc_ops[op].name,
                msg);
        *failed = true;
        out[0] = -1;
    }
}

int ptc_pass_cast(ptc_graph *g, const char *pass, int v, ptc_dtype dt, ptc_loc loc, bool *failed,
                  char *err, size_t errn)
{
    if (*failed || g->values[v].type.dtype == dt)
        return v;
    ptc_attrs at = ptc_attrs_default(PTC_OP_CAST);
    at.dtype = dt;
    int out[PTC_MAX_RESULTS];
    ptc_pass_build(g, pass, PTC_OP_CAST, &v, 1, &at, loc, out, failed, err, errn);
    return out[0];
}

void ptc_pass_copy_node(ptc_graph *out, const ptc_graph *g, const char *pass, const ptc_node *n,
                        const int *in, const ptc_attrs *at, int *vmap, bool *failed, char *err,
                        size_t errn)
{
    int res[PTC_MAX_RESULTS];
    ptc_pass_build(out, pass, n->op, in, n->nin, at, n->loc, res, failed, err, errn);
    if (*failed)
        return;
    ptc_node *c = &out->nodes[out->nnodes - 1];
    c->stage = n->stage;
    c->recompute = n->recompute;
    for (int k = 0; k < n->nout; k++) {
        vmap[n->out[k]] = res[k];
        memcpy(out->values[res[k]].place, g->values[n->out[k]].place,
               sizeof out->values[res[k]].place);
    }
}

void ptc_pass_copy_mapped(ptc_graph *out, const ptc_graph *g, const char *pass, const ptc_node *n,
                          int *vmap, bool *failed, char *err, size_t errn)
{
    int in[PTC_MAX_RESULTS * 4];
    PTC_ASSERT(n->nin <= (int)(sizeof in / sizeof in[0]));
    for (int k = 0; k < n->nin; k++)
        in[k] = vmap[n->in[k]];
    ptc_pass_copy_node(out, g, pass, n, in, &n->attrs, vmap, failed, err, errn);
}

ptc_graph *ptc_pass_graph_like(const ptc_graph *g)
{
    ptc_graph *out = ptc_graph_new(g->name);
    out->optim = g->optim;
    out->mesh = g->mesh;
    out->max_nodes = g->max_nodes;
    return out;
}

void ptc_pass_map_ends(ptc_graph *out, const ptc_graph *g, const int *vmap)
{
    out->loss = g->loss >= 0 ? vmap[g->loss] : -1;
    for (int i = 0; i < g->noutputs; i++)
        ptc_graph_add_output(out, vmap[g->outputs[i]]);
    for (int i = 0; i < g->nupdates; i++)
        ptc_graph_add_update(out, vmap[g->updates[i].state], vmap[g->updates[i].to]);
}

void ptc_pass_ctx_free(ptc_pass_ctx *ctx)
{
    free(ctx->grads);
    ctx->grads = NULL;
}
