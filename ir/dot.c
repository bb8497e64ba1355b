/* dot.c - Graphviz output of a graph (`ptc --emit dot`): one box per node labelled with its op,
 * attributes that matter for reading, and result types; edges carry value numbers. Parameters and
 * inputs are drawn as ellipses so the model's interface stands out.
 */
#include <stdlib.h>

#include "ir.h"

static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
}

void ptc_print_dot(const ptc_graph *g, FILE *f)
{
    fputs("digraph \"", f);
    put_escaped(f, g->name);
    fputs("\" {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n", f);
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        char ty[256];
        ptc_type_str(&g->values[n->out[0]].type, ty, sizeof ty);
        fprintf(f, "  n%d [shape=%s, label=\"", i,
                (ptc_ops[n->op].flags & PTC_F_SOURCE) ? "ellipse" : "box");
        if (n->attrs.name && (ptc_ops[n->op].kw & PTC_A_NAME)) {
            put_escaped(f, n->attrs.name);
            fputs("\\n", f);
        }
        fprintf(f, "%s", ptc_ops[n->op].name);
        if (n->op == PTC_OP_CONST)
            fprintf(f, " %g", n->attrs.value);
        fprintf(f, "\\n%s%s\"", ty, n->nout > 1 ? " ..." : "");
        if (g->loss >= 0 && g->values[g->loss].def == i)
            fputs(", style=bold", f);
        fputs("];\n", f);
    }
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            const ptc_value *v = &g->values[n->in[k]];
            fprintf(f, "  n%d -> n%d", v->def, i);
            if (g->nodes[v->def].nout > 1)
                fprintf(f, " [label=\"%d\"]", v->index);
            fputs(";\n", f);
        }
    }
    fputs("}\n", f);
}
