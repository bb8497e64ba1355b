/* sample.c - the forward-only program that executables sample text with (planner.h,
 * ptc_lower_sample).
 *
 * A language model's graph ends in cross_entropy(logits, targets). The sampling program is what
 * the logits depend on, nothing else: the cone of the logits copied into a new graph (the
 * cross-entropy, the targets and anything only the loss reads are left out), lowered for one
 * device with the logits as the program's output. The executable feeds it a window of tokens and
 * reads the logits of the window's last filled position, so the model must see no position after
 * the one it predicts: every attention must be causal.
 */
#include <stdlib.h>
#include <string.h>

#include "planner.h"
#include "util.h"

/* The logits: the first operand of the graph's one cross-entropy, or -1 with the reason. */
static int find_logits(const ptc_graph *g, char *why, size_t whyn)
{
    int logits = -1, nce = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == PTC_OP_CROSS_ENTROPY) {
            logits = g->nodes[i].in[0];
            nce++;
        }
    if (nce != 1) {
        ptc_fmt(why, whyn, "the model has %s cross_entropy (a next-token model ends in one)",
                nce ? "more than one" : "no");
        return -1;
    }
    return logits;
}

/* Marks the nodes the value v depends on. */
static void mark_cone(const ptc_graph *g, int v, bool *mark)
{
    int cap = 64, sp = 0, *stack = ptc_xmalloc(sizeof(int) * (size_t)cap);
    stack[sp++] = g->values[v].def;
    while (sp) {
        int ni = stack[--sp];
        if (mark[ni])
            continue;
        mark[ni] = true;
        for (int k = 0; k < g->nodes[ni].nin; k++) {
            PTC_GROW(stack, cap, sp);
            stack[sp++] = g->values[g->nodes[ni].in[k]].def;
        }
    }
    free(stack);
}

/* The cone of the logits as a graph of its own, the logits its one output; NULL with the reason
 * when the model cannot be sampled from. */
static ptc_graph *sample_graph(const ptc_graph *g, char *why, size_t whyn)
{
    int logits = find_logits(g, why, whyn);
    if (logits < 0)
        return NULL;
    const ptc_type *lt = &g->values[logits].type;
    if (lt->dtype != PTC_F32 || lt->rank < 2) {
        ptc_fmt(why, whyn, "the cross_entropy's logits are not f32 [.., classes]");
        return NULL;
    }
    bool *mark = ptc_xcalloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof(bool));
    mark_cone(g, logits, mark);
    int *map = ptc_xmalloc(sizeof(int) * (size_t)(g->nvalues ? g->nvalues : 1));
    ptc_graph *s = ptc_graph_new(g->name);
    s->optim = g->optim;
    bool tokens = false;
    char err[512];
    for (int i = 0; i < g->nnodes && s; i++) {
        const ptc_node *n = &g->nodes[i];
        if (!mark[i])
            continue;
        if (n->op == PTC_OP_ATTENTION && !n->attrs.causal) {
            ptc_fmt(why, whyn,
                    "the attention at %s:%d:%d is not causal: every position sees the ones "
                    "after it, so the model cannot predict a next token",
                    n->loc.file ? n->loc.file : "?", n->loc.line, n->loc.col);
            ptc_graph_free(s);
            s = NULL;
            break;
        }
        if (n->op == PTC_OP_INPUT && n->attrs.dtype == PTC_I32)
            tokens = true;
        int in[n->nin > 0 ? n->nin : 1], out[PTC_MAX_RESULTS];
        for (int k = 0; k < n->nin; k++)
            in[k] = map[n->in[k]];
        if (ptc_build(s, n->op, in, n->nin, &n->attrs, n->loc, out, err, sizeof err) < 0) {
            ptc_fmt(why, whyn, "internal error: copying the forward pass: %s", err);
            ptc_graph_free(s);
            s = NULL;
            break;
        }
        for (int k = 0; k < n->nout; k++)
            map[n->out[k]] = out[k];
    }
    if (s && !tokens) {
        ptc_fmt(why, whyn, "the logits depend on no i32 token input");
        ptc_graph_free(s);
        s = NULL;
    }
    if (s)
        ptc_graph_add_output(s, map[logits]);
    free(map);
    free(mark);
    return s;
}

ptc_plan *ptc_lower_sample(const ptc_graph *g, bool fuse, char *why, size_t whyn)
{
    ptc_graph *s = sample_graph(g, why, whyn);
    if (!s)
        return NULL;
    char err[1024];
    ptc_lower_opts lo = {
        .logical_params = ptc_graph_param_count(s), .forward_outputs = true, .fuse = fuse};
    ptc_plan *p = ptc_lower(s, &lo, err, sizeof err);
    ptc_graph_free(s);
    if (!p) {
        ptc_fmt(why, whyn, "lowering the forward pass failed: %s", err);
        return NULL;
    }
    const ptc_program *pg = &p->programs[0];
    if (pg->noutputs != 1) {
        ptc_fmt(why, whyn, "internal error: the sampling program has %d outputs", pg->noutputs);
        ptc_plan_free(p);
        return NULL;
    }
    return p;
}
