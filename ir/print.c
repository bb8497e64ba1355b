/* print.c - the deterministic text form of the IR (read back by parse.c).
 *
 *   model NAME
 *   source "FILE"                                   (when nodes carry locations)
 *   optimizer adamw(lr=0.0006, beta1=0.9, ...)
 *   %0 = input {dtype=i32, shape=[8,64], name="tokens"} : i32[8,64]
 *   %5, %6, %7 = split %4 {axis=2, n=3} : f32[4,64,64], f32[4,64,64], f32[4,64,64] @12:5
 *   loss %40
 *   output %41
 *
 * Values are renumbered densely in order of definition, so equal graphs print equal text whatever
 * passes did to the ids. Placements print after a type as <R,S0,P> (one entry per mesh axis) when
 * any is not Replicate; a pipeline stage and a recompute mark print among the attributes.
 */
#include <stdlib.h>
#include <string.h>

#include "text.h"

static void put_node(FILE *f, const ptc_graph *g, const ptc_node *n, const int *num)
{
    const ptc_op_info *info = &ptc_ops[n->op];
    for (int i = 0; i < n->nout; i++)
        fprintf(f, "%s%%%d", i ? ", " : "", num[n->out[i]]);
    fprintf(f, " = %s", info->name);
    for (int i = 0; i < n->nin; i++)
        fprintf(f, "%s%%%d", i ? ", " : " ", num[n->in[i]]);
    int k = ptc_put_attrs(f, n->op, &n->attrs);
    if (n->stage)
        fprintf(f, "%sstage=%d", k++ ? ", " : " {", n->stage);
    if (n->recompute)
        fprintf(f, "%srecompute=true", k++ ? ", " : " {");
    if (k)
        fputc('}', f);
    fputs(" : ", f);
    for (int i = 0; i < n->nout; i++) {
        if (i)
            fputs(", ", f);
        ptc_put_type(f, &g->values[n->out[i]].type, g->values[n->out[i]].place);
    }
    if (n->loc.line)
        fprintf(f, " @%d:%d", n->loc.line, n->loc.col);
    fputc('\n', f);
}

void ptc_print(const ptc_graph *g, FILE *f)
{
    int *num = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(int));
    int next = 0;
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i].nout; j++)
            num[g->nodes[i].out[j]] = next++;
    fprintf(f, "model %s\n", g->name);
    if (g->mesh.naxes) {
        fputs("mesh ", f);
        ptc_put_mesh(f, &g->mesh);
        fputc('\n', f);
    }
    const char *src = NULL;
    for (int i = 0; i < g->nnodes && !src; i++)
        src = g->nodes[i].loc.file;
    if (src) {
        fputs("source ", f);
        ptc_put_string(f, src);
        fputc('\n', f);
    }
    fputs("optimizer ", f);
    ptc_put_optim(f, &g->optim);
    fputc('\n', f);
    for (int i = 0; i < g->nnodes; i++)
        put_node(f, g, &g->nodes[i], num);
    if (g->loss >= 0)
        fprintf(f, "loss %%%d\n", num[g->loss]);
    for (int i = 0; i < g->noutputs; i++)
        fprintf(f, "output %%%d\n", num[g->outputs[i]]);
    for (int i = 0; i < g->nupdates; i++)
        fprintf(f, "update %%%d = %%%d\n", num[g->updates[i].state], num[g->updates[i].to]);
    free(num);
}
