/* optimizer.c - gradient clipping and the optimizer update as part of the step graph.
 *
 * Assumes: autodiff has run (ctx->grads holds one gradient per PARAM, graph order).
 * Guarantees: scalar inputs opt.lr, opt.step (counting from 1) and opt.max_norm (+inf disables
 *   clipping) are added (and opt.loss_scale is divided out, with fp16 loss scaling); gradients
 *   are scaled by min(1, max_norm / (norm + 1e-6)) with the global
 *   norm of all gradients (PyTorch's clip_grad_norm_); each parameter gets its update (adamw:
 *   STATE values optim.m.NAME and optim.v.NAME; sgd with momentum: optim.momentum.NAME) and an
 *   `update` pair per parameter and state. The global gradient norm squared is the graph's first
 *   output, for logging, and the gradient of the i-th parameter (before clipping) is output 1 + i,
 *   for checking against other frameworks. Weight decay applies only to parameters of rank 2 or
 *   more, as the language says.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct opt_ctx {
    ptc_graph *g;
    ptc_loc loc;
    char *err;
    size_t errn;
    bool failed;
} opt_ctx;

static void build(opt_ctx *o, ptc_op op, const int *in, int nin, const ptc_attrs *at, int *out)
{
    ptc_pass_build(o->g, "the optimizer pass", op, in, nin, at, o->loc, out, &o->failed, o->err,
                   o->errn);
}

static int b1(opt_ctx *o, ptc_op op, const int *in, int nin, const ptc_attrs *at)
{
    int out[PTC_MAX_RESULTS];
    build(o, op, in, nin, at, out);
    return out[0];
}

static int scalar_input(opt_ctx *o, const char *name)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_INPUT);
    at.name = name;
    at.dtype = PTC_F32;
    return b1(o, PTC_OP_INPUT, NULL, 0, &at);
}

static int state(opt_ctx *o, const char *prefix, const char *pname, const ptc_type *t)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_STATE);
    char name[512];
    ptc_fmt(name, sizeof name, "%s%s", prefix, pname);
    at.name = name;
    at.nshape = t->rank;
    memcpy(at.shape, t->dims, sizeof(int64_t) * (size_t)t->rank);
    at.init.kind = PTC_INIT_ZEROS;
    return b1(o, PTC_OP_STATE, NULL, 0, &at);
}

static int cast_to(opt_ctx *o, int v, ptc_dtype to)
{
    return ptc_pass_cast(o->g, "the optimizer pass", v, to, o->loc, &o->failed, o->err, o->errn);
}

/* The fp32 master weight of a 16-bit parameter: optimizer state initialised exactly as the
 * parameter (runtime/exec/init.c takes the name after the prefix), so the working copy is the
 * master rounded. */
static int master_of(opt_ctx *o, const ptc_node *pn)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_STATE);
    char name[512];
    ptc_fmt(name, sizeof name, "%s%s", PTC_MASTER_PREFIX, pn->attrs.name);
    at.name = name;
    at.nshape = pn->attrs.nshape;
    memcpy(at.shape, pn->attrs.shape, sizeof at.shape);
    at.init = pn->attrs.init;
    return b1(o, PTC_OP_STATE, NULL, 0, &at);
}

/* The update of parameter p by its (f32, clipped) gradient. A 16-bit parameter is the working
 * copy of an f32 master weight: the optimizer updates the master and writes the copy rounded. */
static void update_param(opt_ctx *o, const ptc_optim *opt, int p16, const char *name, int grad,
                         int lr, int step)
{
    ptc_graph *g = o->g;
    int p = p16;
    if (g->values[p16].type.dtype != PTC_F32)
        p = master_of(o, &g->nodes[g->values[p16].def]);
    if (o->failed)
        return;
    ptc_type t = g->values[p].type;
    double wd = t.rank >= 2 ? opt->weight_decay : 0.0;
    int out[PTC_MAX_RESULTS];
    if (opt->kind == PTC_OPTIM_ADAMW) {
        int m = state(o, "optim.m.", name, &t), v = state(o, "optim.v.", name, &t);
        ptc_attrs at = ptc_attrs_default(PTC_OP_ADAMW_UPDATE);
        at.beta1 = opt->beta1;
        at.beta2 = opt->beta2;
        at.eps = opt->eps;
        at.wd = wd;
        build(o, PTC_OP_ADAMW_UPDATE, (int[]){p, grad, m, v, lr, step}, 6, &at, out);
        if (o->failed)
            return;
        ptc_graph_add_update(g, p, out[0]);
        if (p != p16)
            ptc_graph_add_update(g, p16, cast_to(o, out[0], g->values[p16].type.dtype));
        ptc_graph_add_update(g, m, out[1]);
        ptc_graph_add_update(g, v, out[2]);
    } else {
        /* without momentum SGD keeps no state: buf is the gradient itself, never stored */
        int buf = opt->momentum != 0 ? state(o, "optim.momentum.", name, &t) : grad;
        ptc_attrs at = ptc_attrs_default(PTC_OP_SGD_UPDATE);
        at.momentum = opt->momentum;
        at.wd = wd;
        build(o, PTC_OP_SGD_UPDATE, (int[]){p, grad, buf, lr}, 4, &at, out);
        if (o->failed)
            return;
        ptc_graph_add_update(g, p, out[0]);
        if (p != p16)
            ptc_graph_add_update(g, p16, cast_to(o, out[0], g->values[p16].type.dtype));
        if (opt->momentum != 0)
            ptc_graph_add_update(g, buf, out[1]);
    }
}

int ptc_pass_optimizer(ptc_pass_ctx *ctx)
{
    ptc_graph *g = ctx->g;
    opt_ctx o = {.g = g, .err = ctx->err, .errn = ctx->errn};
    if (!ctx->grads) {
        ptc_fmt(ctx->err, ctx->errn, "optimizer: autodiff has not run");
        return -1;
    }
    int np = ctx->nparams;
    int *params = ptc_xmalloc(sizeof(int) * (size_t)(np ? np : 1));
    ptc_graph_params(g, params, np);
    int lr = scalar_input(&o, PTC_IN_LR), step = scalar_input(&o, PTC_IN_STEP),
        max_norm = scalar_input(&o, PTC_IN_MAX_NORM);

    /* --grad-dtype fp32: every gradient in f32 before it is accumulated or reduced */
    for (int i = 0; i < np && ctx->opts->grad_f32; i++) {
        o.loc = g->nodes[params[i]].loc;
        ctx->grads[i] = cast_to(&o, ctx->grads[i], PTC_F32);
    }
    int total = -1;
    for (int i = 0; i < np; i++) {
        /* the gradient's square norm belongs to its parameter: the partitioner reduces the
         * gradient here, and plans account that traffic to the parameter's layer and line */
        o.loc = g->nodes[params[i]].loc;
        int ss = b1(&o, PTC_OP_SUMSQ, &ctx->grads[i], 1, NULL);
        o.loc = (ptc_loc){0};
        total = total < 0 ? ss : b1(&o, PTC_OP_ADD, (int[]){total, ss}, 2, NULL);
    }
    /* fp16 loss scaling: the gradients are scale times the true ones (autodiff seeded the
     * backward with opt.loss_scale): the norm is divided by scale^2 (an overflow stays inf, and
     * the runtime skips that step), and the clipping coefficient by the scale, so that the
     * updates see the true, clipped gradients */
    int scale = -1;
    for (int i = 0; i < g->nnodes && ctx->opts->loss_scaling; i++)
        if (g->nodes[i].op == PTC_OP_INPUT && strcmp(g->nodes[i].attrs.name, PTC_IN_LOSS_SCALE) == 0)
            scale = g->nodes[i].out[0];
    if (total >= 0 && scale >= 0)
        total = b1(&o, PTC_OP_DIV,
                   (int[]){total, b1(&o, PTC_OP_MUL, (int[]){scale, scale}, 2, NULL)}, 2, NULL);
    if (total >= 0) {
        ptc_graph_add_output(g, total);
        for (int i = 0; i < np; i++)
            ptc_graph_add_output(g, ctx->grads[i]);
        int coef = b1(&o, PTC_OP_CLIP_COEF, (int[]){total, max_norm}, 2, NULL);
        if (scale >= 0)
            coef = b1(&o, PTC_OP_DIV, (int[]){coef, scale}, 2, NULL);
        for (int i = 0; i < np && !o.failed; i++) {
            ptc_node pn = g->nodes[params[i]];
            o.loc = pn.loc;
            int g32 = cast_to(&o, ctx->grads[i], PTC_F32); /* a 16-bit gradient, reduced */
            int clipped = b1(&o, PTC_OP_MUL, (int[]){g32, coef}, 2, NULL);
            update_param(&o, &g->optim, pn.out[0], pn.attrs.name, clipped, lr, step);
        }
    }
    free(params);
    return o.failed ? -1 : 0;
}
