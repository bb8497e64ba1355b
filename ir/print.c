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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* Shortest %g form that reads back to the same double. */
static void put_double(FILE *f, double x)
{
    char buf[64];
    for (int p = 6; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    fputs(buf, f);
}

static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 32)
            fprintf(f, "\\x%02x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void put_list(FILE *f, const int64_t *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%lld", i ? "," : "", (long long)v[i]);
    fputc(']', f);
}

static const char *const init_names[] = {"zeros", "ones", "constant", "normal", "uniform"};

static void put_init(FILE *f, const ptc_init *in)
{
    fputs(init_names[in->kind], f);
    if (in->kind == PTC_INIT_CONSTANT || in->kind == PTC_INIT_NORMAL) {
        fputc('(', f);
        put_double(f, in->a);
        fputc(')', f);
    } else if (in->kind == PTC_INIT_UNIFORM) {
        fputc('(', f);
        put_double(f, in->a);
        fputs(", ", f);
        put_double(f, in->b);
        fputc(')', f);
    }
}

static void put_attr(FILE *f, const ptc_attrs *a, unsigned bit)
{
    fprintf(f, "%s=", ptc_attr_name(bit));
    switch (bit) {
    case PTC_A_AXIS: fprintf(f, "%lld", (long long)a->axis); break;
    case PTC_A_N: fprintf(f, "%lld", (long long)a->n); break;
    case PTC_A_START: fprintf(f, "%lld", (long long)a->start); break;
    case PTC_A_LEN: fprintf(f, "%lld", (long long)a->len); break;
    case PTC_A_HEADS: fprintf(f, "%lld", (long long)a->heads); break;
    case PTC_A_KV_HEADS: fprintf(f, "%lld", (long long)a->kv_heads); break;
    case PTC_A_EPS: put_double(f, a->eps); break;
    case PTC_A_BASE: put_double(f, a->base); break;
    case PTC_A_VALUE: put_double(f, a->value); break;
    case PTC_A_BETA1: put_double(f, a->beta1); break;
    case PTC_A_BETA2: put_double(f, a->beta2); break;
    case PTC_A_WD: put_double(f, a->wd); break;
    case PTC_A_MOMENTUM: put_double(f, a->momentum); break;
    case PTC_A_MESH_AXIS: fprintf(f, "%d", a->mesh_axis); break;
    case PTC_A_REDUCE: fputs(a->reduce ? "max" : "sum", f); break;
    case PTC_A_TO: fprintf(f, "%d", a->to); break;
    case PTC_A_GROUP: fprintf(f, "%d", a->group); break;
    case PTC_A_CAUSAL: fputs(a->causal ? "true" : "false", f); break;
    case PTC_A_DTYPE: fputs(ptc_dtype_name(a->dtype), f); break;
    case PTC_A_SHAPE:
    case PTC_A_PERM: put_list(f, a->shape, a->nshape); break;
    case PTC_A_NAME: put_string(f, a->name ? a->name : ""); break;
    case PTC_A_INIT: put_init(f, &a->init); break;
    default: PTC_UNREACHABLE("unknown attribute");
    }
}

static void put_type(FILE *f, const ptc_value *v)
{
    char buf[256];
    fputs(ptc_type_str(&v->type, buf, sizeof buf), f);
    int last = -1;
    for (int i = 0; i < PTC_MAX_MESH_AXES; i++)
        if (v->place[i].kind != PTC_PLACE_REPLICATE)
            last = i;
    if (last < 0)
        return;
    fputc('<', f);
    for (int i = 0; i <= last; i++) {
        const ptc_placement *p = &v->place[i];
        if (i)
            fputc(',', f);
        if (p->kind == PTC_PLACE_SHARD && p->groups > 1)
            fprintf(f, "S%dx%d", p->dim, p->groups);
        else if (p->kind == PTC_PLACE_SHARD)
            fprintf(f, "S%d", p->dim);
        else
            fputc(p->kind == PTC_PLACE_PARTIAL ? 'P' : 'R', f);
    }
    fputc('>', f);
}

static void put_optim(FILE *f, const ptc_optim *o)
{
    if (o->kind == PTC_OPTIM_SGD) {
        fputs("optimizer sgd(lr=", f);
        put_double(f, o->lr);
        fputs(", momentum=", f);
        put_double(f, o->momentum);
    } else {
        fputs("optimizer adamw(lr=", f);
        put_double(f, o->lr);
        fputs(", beta1=", f);
        put_double(f, o->beta1);
        fputs(", beta2=", f);
        put_double(f, o->beta2);
        fputs(", eps=", f);
        put_double(f, o->eps);
    }
    fputs(", weight_decay=", f);
    put_double(f, o->weight_decay);
    fputs(")\n", f);
}

static void put_node(FILE *f, const ptc_graph *g, const ptc_node *n, const int *num)
{
    const ptc_op_info *info = &ptc_ops[n->op];
    for (int i = 0; i < n->nout; i++)
        fprintf(f, "%s%%%d", i ? ", " : "", num[n->out[i]]);
    fprintf(f, " = %s", info->name);
    for (int i = 0; i < n->nin; i++)
        fprintf(f, "%s%%%d", i ? ", " : " ", num[n->in[i]]);
    int k = 0;
    for (unsigned bit = 1; bit < (1u << PTC_A_COUNT); bit <<= 1)
        if (info->kw & bit) {
            fputs(k++ ? ", " : " {", f);
            put_attr(f, &n->attrs, bit);
        }
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
        put_type(f, &g->values[n->out[i]]);
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
        fputs("mesh", f);
        for (int i = 0; i < g->mesh.naxes; i++)
            fprintf(f, "%s%s=%d", i ? "," : " ", g->mesh.names[i], g->mesh.sizes[i]);
        fputc('\n', f);
    }
    const char *src = NULL;
    for (int i = 0; i < g->nnodes && !src; i++)
        src = g->nodes[i].loc.file;
    if (src) {
        fputs("source ", f);
        put_string(f, src);
        fputc('\n', f);
    }
    put_optim(f, &g->optim);
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
