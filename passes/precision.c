/* precision.c - the mixed-precision policy (ptc --precision bf16|fp16): the model's math on a
 * 16-bit copy of its weights.
 *
 * What each value becomes (the README's table, op by op, is written from this):
 *   - a parameter is stored in the 16-bit dtype (the working copy, 2 bytes an element); its fp32
 *     master weight is optimizer state (optim.master.NAME, made by the optimizer pass), so ZeRO-1
 *     shards it with the moments while the working copy stays whole until ZeRO-3 (the ZeRO
 *     paper's 2 + 2 + 12 bytes per parameter);
 *   - an op whose float operands are not all of one dtype (a 16-bit weight meets an f32 model
 *     input or a scalar constant) gets its f32 operands cast to the 16-bit dtype, the rule of
 *     PyTorch's autocast for the ops that run in 16 bits; except that scalars stay f32 (an op
 *     whose float operands are all rank 0: the loss and what is added to it), that a loss
 *     (mse against an f32 target) casts its 16-bit operand up, as autocast's fp32 list does, and
 *     that an
 *     operand the model itself casts to f32 (cast(x, f32) @ w) keeps the op in f32, its 16-bit
 *     operands cast up;
 *   - everything else keeps its op and takes the dtype of its operands: activations are stored in
 *     16 bits. The kernels compute in f32 whatever the storage (GEMMs and reductions accumulate in
 *     f32, softmax, norm statistics and cross-entropy run in f32 and only their results are
 *     rounded), and the losses (cross_entropy, mse) return f32, so the loss and its scaling are
 *     f32.
 * Gradients come out of autodiff in the dtype of their parameter (16-bit); the optimizer pass
 * casts them to f32 first with --grad-dtype fp32 (fp32 accumulation over microbatches and fp32
 * reductions, Megatron's main_grad).
 *
 * Assumes: the forward graph (no update pairs yet), moe layers still whole: the moe pass after
 *   this one builds each router's logits, softmax and the auxiliary loss in f32 (casts of the
 *   16-bit input and router), so the routing decisions are not made on 16-bit scores.
 * Guarantees: with precision f32, nothing changes. Otherwise every PARAM has the 16-bit dtype,
 *   the graph verifies, the loss and outputs are kept (an output that was f32 is cast back, so
 *   --run prints the same kinds of values), names and locations are kept.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct pr {
    const ptc_graph *g;
    ptc_graph *out;
    int *vmap;
    ptc_dtype low;
    ptc_loc loc;
    char *err;
    size_t errn;
    bool failed;
} pr;

#define PASS "the precision pass"

static bool is_float(ptc_dtype t)
{
    return t == PTC_F32 || t == PTC_BF16 || t == PTC_F16;
}

static ptc_dtype dt(const pr *p, int v)
{
    return p->out->values[v].type.dtype;
}

static int cast_to(pr *p, int v, ptc_dtype to)
{
    return ptc_pass_cast(p->out, PASS, v, to, p->loc, &p->failed, p->err, p->errn);
}

static void copy_node(pr *p, const ptc_node *n)
{
    int in[PTC_MAX_RESULTS * 4];
    PTC_ASSERT(n->nin <= (int)(sizeof in / sizeof in[0]));
    p->loc = n->loc;
    bool mixed = false;
    ptc_dtype first = PTC_NDTYPES; /* the first float operand's dtype */
    for (int k = 0; k < n->nin; k++) {
        in[k] = p->vmap[n->in[k]];
        ptc_dtype d = dt(p, in[k]);
        if (is_float(d) && first == PTC_NDTYPES)
            first = d;
        mixed |= is_float(d) && d != first;
    }
    if (mixed && n->op != PTC_OP_CAST) {
        bool scalars = true, upcast = false;
        for (int k = 0; k < n->nin; k++) {
            const ptc_value *v = &p->out->values[in[k]];
            if (!is_float(v->type.dtype))
                continue;
            scalars &= v->type.rank == 0;
            upcast |= v->type.dtype == PTC_F32 && p->out->nodes[v->def].op == PTC_OP_CAST;
        }
        bool loss = n->op == PTC_OP_MSE || n->op == PTC_OP_CROSS_ENTROPY;
        ptc_dtype to = scalars || upcast || loss ? PTC_F32 : p->low;
        for (int k = 0; k < n->nin; k++)
            if (is_float(dt(p, in[k])))
                in[k] = cast_to(p, in[k], to);
    }
    ptc_attrs at = n->attrs;
    if (n->op == PTC_OP_PARAM)
        at.dtype = p->low;
    ptc_pass_copy_node(p->out, p->g, PASS, n, in, &at, p->vmap, &p->failed, p->err, p->errn);
}

int ptc_pass_precision(ptc_pass_ctx *ctx)
{
    ptc_dtype low = ctx->opts->precision;
    if (low == PTC_F32)
        return 0;
    const ptc_graph *g = ctx->g;
    if (g->nupdates) {
        ptc_fmt(ctx->err, ctx->errn, "precision: the graph already has its updates");
        return -1;
    }
    pr p = {.g = g, .low = low, .err = ctx->err, .errn = ctx->errn};
    p.out = ptc_pass_graph_like(g);
    p.vmap = ptc_xmalloc(sizeof(int) * (size_t)(g->nvalues ? g->nvalues : 1));
    for (int i = 0; i < g->nnodes && !p.failed; i++)
        copy_node(&p, &g->nodes[i]);
    if (!p.failed) {
        p.loc = (ptc_loc){0};
        p.out->loss = g->loss >= 0 ? cast_to(&p, p.vmap[g->loss], g->values[g->loss].type.dtype)
                                   : -1;
        for (int i = 0; i < g->noutputs; i++) {
            int o = g->outputs[i];
            ptc_graph_add_output(p.out, cast_to(&p, p.vmap[o], g->values[o].type.dtype));
        }
    }
    free(p.vmap);
    if (p.failed) {
        ptc_graph_free(p.out);
        return -1;
    }
    ptc_graph_free(ctx->g);
    ctx->g = p.out;
    return 0;
}
