/* plan.c - accounting, printing (text and JSON) and the pre-launch check of a rank program
 * (see plan.h for what each figure counts). */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

enum { K_ALLREDUCE, K_ALLGATHER, K_REDUCE_SCATTER, K_ALL_TO_ALL, K_NONE };
static const char *const kind_names[] = {"allreduce", "allgather", "reduce_scatter", "all_to_all"};

static int kind_of(ptc_op op)
{
    switch (op) {
    case PTC_OP_ALLREDUCE: return K_ALLREDUCE;
    case PTC_OP_ALLGATHER: return K_ALLGATHER;
    case PTC_OP_REDUCE_SCATTER: return K_REDUCE_SCATTER;
    case PTC_OP_ALL_TO_ALL: return K_ALL_TO_ALL;
    default: return K_NONE;
    }
}

static int64_t value_bytes(const ptc_graph *g, int v)
{
    const ptc_type *t = &g->values[v].type;
    return ptc_type_numel(t) * ptc_dtype_size(t->dtype);
}

int64_t ptc_plan_comm_bytes(const ptc_graph *g, const ptc_node *n)
{
    int k = kind_of(n->op);
    if (k == K_NONE)
        return 0;
    int64_t t = g->mesh.sizes[n->attrs.mesh_axis];
    int64_t in = value_bytes(g, n->in[0]), out = value_bytes(g, n->out[0]);
    switch (k) {
    case K_ALLREDUCE: return 2 * in * (t - 1) / t;
    case K_ALLGATHER: return out * (t - 1) / t;
    case K_REDUCE_SCATTER: return in * (t - 1) / t;
    default: return in * (t - 1) / t;
    }
}

void ptc_plan_layer(const ptc_node *n, char *buf, size_t bufn)
{
    const char *s = n->loc.scope;
    if (!s || !*s) {
        ptc_fmt(buf, bufn, "(model)");
        return;
    }
    /* up to the first numeric component (a repeat index), else the first component */
    for (const char *p = s;;) {
        size_t len = strcspn(p, ".");
        if (len > 0 && strspn(p, "0123456789") >= len) {
            ptc_fmt(buf, bufn, "%.*s", (int)(p + len - s), s);
            return;
        }
        if (!p[len])
            break;
        p += len + 1;
    }
    ptc_fmt(buf, bufn, "%.*s", (int)strcspn(s, "."), s);
}

/* The reduced gradient feeding an update: back from its grad operand through clipping and shard
 * slices to the data-parallel reduction, if any. */
static int reduced_grad(const ptc_graph *g, int v)
{
    for (int depth = 0; depth < 8; depth++) {
        const ptc_node *n = &g->nodes[g->values[v].def];
        if (n->op == PTC_OP_ALLREDUCE || n->op == PTC_OP_REDUCE_SCATTER)
            return v;
        if (n->op == PTC_OP_SHARD_SLICE)
            v = n->in[0];
        else if (n->op == PTC_OP_MUL && g->values[n->in[1]].type.rank == 0)
            v = n->in[0];
        else
            return v;
    }
    return v;
}

static int64_t peak_activations(const ptc_graph *g, const bool *excluded)
{
    int nv = g->nvalues ? g->nvalues : 1;
    int *last = ptc_xmalloc(sizeof(int) * (size_t)nv);
    for (int v = 0; v < g->nvalues; v++)
        last[v] = g->values[v].def;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            last[g->nodes[i].in[k]] = i;
    for (int i = 0; i < g->noutputs; i++)
        last[g->outputs[i]] = g->nnodes;
    for (int i = 0; i < g->nupdates; i++)
        last[g->updates[i].to] = g->nnodes;
    if (g->loss >= 0)
        last[g->loss] = g->nnodes;
    int64_t live = 0, peak = 0;
    int64_t *free_at = ptc_xcalloc((size_t)g->nnodes + 1, sizeof(int64_t));
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        for (int k = 0; k < n->nout; k++) {
            int v = n->out[k];
            if (excluded[v])
                continue;
            live += value_bytes(g, v);
            free_at[last[v]] += value_bytes(g, v);
        }
        peak = live > peak ? live : peak;
        live -= free_at[i];
    }
    free(free_at);
    free(last);
    return peak;
}

void ptc_plan_stats_of(const ptc_graph *g, ptc_plan_stats *s)
{
    memset(s, 0, sizeof *s);
    bool *excluded = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(bool));
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        int k = kind_of(n->op);
        if (n->op == PTC_OP_PARAM) {
            s->param_bytes += value_bytes(g, n->out[0]);
            excluded[n->out[0]] = true;
        } else if (n->op == PTC_OP_STATE) {
            s->optim_bytes += value_bytes(g, n->out[0]);
            excluded[n->out[0]] = true;
        } else if (n->op == PTC_OP_ADAMW_UPDATE || n->op == PTC_OP_SGD_UPDATE) {
            int gv = reduced_grad(g, n->in[1]);
            if (!excluded[gv]) {
                s->grad_bytes += value_bytes(g, gv);
                excluded[gv] = true;
            }
        } else if (k != K_NONE) {
            int64_t b = ptc_plan_comm_bytes(g, n);
            s->comm_bytes += b;
            s->kind_bytes[k] += b;
            s->kind_count[k]++;
            s->axis_bytes[n->attrs.mesh_axis] += b;
            s->ncollectives++;
        }
    }
    s->peak_act_bytes = peak_activations(g, excluded);
    free(excluded);
}

/* ---- printing ---- */

static void put_count(FILE *f, int64_t n)
{
    char d[32];
    int len = snprintf(d, sizeof d, "%lld", (long long)n);
    for (int i = 0; i < len; i++) {
        if (i && (len - i) % 3 == 0)
            fputc(',', f);
        fputc(d[i], f);
    }
}

static void put_bytes(FILE *f, int64_t b)
{
    put_count(f, b);
    double x = (double)b;
    const char *u = "B";
    if (x >= 1 << 30) {
        x /= 1 << 30;
        u = "GiB";
    } else if (x >= 1 << 20) {
        x /= 1 << 20;
        u = "MiB";
    } else if (x >= 1 << 10) {
        x /= 1 << 10;
        u = "KiB";
    }
    if (b >= 1024)
        fprintf(f, " (%.2f %s)", x, u);
}

static void put_placement(FILE *f, const ptc_graph *g, const ptc_value *v, bool json)
{
    for (int a = 0; a < g->mesh.naxes; a++) {
        const ptc_placement *p = &v->place[a];
        char pl[16];
        if (p->kind == PTC_PLACE_SHARD && p->groups > 1)
            snprintf(pl, sizeof pl, "S%dx%d", p->dim, p->groups);
        else if (p->kind == PTC_PLACE_SHARD)
            snprintf(pl, sizeof pl, "S%d", p->dim);
        else
            snprintf(pl, sizeof pl, "%s", p->kind == PTC_PLACE_PARTIAL ? "P" : "R");
        if (json)
            fprintf(f, "%s\"%s\": \"%s\"", a ? ", " : "", g->mesh.names[a], pl);
        else
            fprintf(f, "%s%s:%s", a ? " " : "", g->mesh.names[a], pl);
    }
}

static ptc_type full_type(const ptc_graph *g, const ptc_value *v)
{
    ptc_type t = v->type;
    for (int a = 0; a < g->mesh.naxes; a++)
        if (v->place[a].kind == PTC_PLACE_SHARD)
            t.dims[v->place[a].dim] *= g->mesh.sizes[a];
    return t;
}

typedef struct layer_sum {
    char name[64];
    int64_t bytes;
    int count;
} layer_sum;

static int layers_of(const ptc_graph *g, layer_sum *ls, int cap)
{
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *nd = &g->nodes[i];
        if (kind_of(nd->op) == K_NONE)
            continue;
        char name[64];
        ptc_plan_layer(nd, name, sizeof name);
        int k = 0;
        while (k < n && strcmp(ls[k].name, name))
            k++;
        if (k == n) {
            if (n == cap)
                continue;
            snprintf(ls[n].name, sizeof ls[n].name, "%s", name);
            ls[n].bytes = 0;
            ls[n].count = 0;
            n++;
        }
        ls[k].bytes += ptc_plan_comm_bytes(g, nd);
        ls[k].count++;
    }
    return n;
}

static void put_mesh(FILE *f, const ptc_graph *g)
{
    for (int a = 0; a < g->mesh.naxes; a++)
        fprintf(f, "%s%s=%d", a ? "," : "", g->mesh.names[a], g->mesh.sizes[a]);
    if (!g->mesh.naxes)
        fputs("single device", f);
}

void ptc_print_plan(const ptc_graph *g, const ptc_plan_info *info, FILE *f)
{
    int nranks = g->mesh.naxes ? ptc_mesh_nranks(&g->mesh) : 1;
    ptc_plan_stats s;
    ptc_plan_stats_of(g, &s);
    fprintf(f, "plan: model '%s' on mesh ", g->name);
    put_mesh(f, g);
    fprintf(f, " (%d rank%s), ZeRO %d, sequence parallel %s; ", nranks, nranks > 1 ? "s" : "",
            info->zero, info->seq_parallel ? "on" : "off");
    put_count(f, info->logical_params);
    fputs(" parameters\n\n", f);

    fputs("parameters (placement per mesh axis; shape on every rank):\n", f);
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_PARAM)
            continue;
        const ptc_value *v = &g->values[n->out[0]];
        char full[160], loc[160];
        ptc_type ft = full_type(g, v);
        ptc_type_str(&ft, full, sizeof full);
        ptc_type_str(&v->type, loc, sizeof loc);
        fprintf(f, "  %-28s %-20s ", n->attrs.name, full + 3);
        put_placement(f, g, v, false);
        fprintf(f, "  -> %s\n", loc + 3);
    }

    fprintf(f, "\nper rank, per step (every rank: ranks 0-%d run the program below):\n",
            nranks - 1);
    fputs("  parameters        ", f);
    put_bytes(f, s.param_bytes);
    fputs("\n  gradients         ", f);
    put_bytes(f, s.grad_bytes);
    fputs("\n  optimizer state   ", f);
    put_bytes(f, s.optim_bytes);
    fputs("\n  model states      ", f);
    put_bytes(f, s.param_bytes + s.grad_bytes + s.optim_bytes);
    fputs("\n  peak activations  ", f);
    put_bytes(f, s.peak_act_bytes);
    fprintf(f, "\n  communication     ");
    put_bytes(f, s.comm_bytes);
    fprintf(f, " sent in %d collectives\n", s.ncollectives);
    for (int k = 0; k < 4; k++)
        if (s.kind_count[k]) {
            fprintf(f, "    %-16s %4d  ", kind_names[k], s.kind_count[k]);
            put_bytes(f, s.kind_bytes[k]);
            fputc('\n', f);
        }
    for (int a = 0; a < g->mesh.naxes; a++) {
        fprintf(f, "    over %-11s       ", g->mesh.names[a]);
        put_bytes(f, s.axis_bytes[a]);
        fputc('\n', f);
    }
    layer_sum ls[512];
    int nl = layers_of(g, ls, 512);
    if (nl)
        fputs("  communication by layer (forward and backward):\n", f);
    for (int i = 0; i < nl; i++) {
        fprintf(f, "    %-20s %3d collectives  ", ls[i].name, ls[i].count);
        put_bytes(f, ls[i].bytes);
        fputc('\n', f);
    }
    fputs("  (bytes: parameters and optimizer state are their storage on this rank; gradients the\n"
          "   reduced gradient of every parameter; peak activations every other value live at\n"
          "   once, each freed after its last use; communication the bytes this rank sends in a\n"
          "   ring: allreduce 2N(t-1)/t, allgather/reduce-scatter N(t-1)/t of the full tensor)\n",
          f);

    fprintf(f, "\nprogram of ranks 0-%d:\n", nranks - 1);
    ptc_print(g, f);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 32)
            fprintf(f, "\\u%04x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void json_dims(FILE *f, const ptc_type *t)
{
    fputc('[', f);
    for (int i = 0; i < t->rank; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    fputc(']', f);
}

void ptc_print_plan_json(const ptc_graph *g, const ptc_plan_info *info, FILE *f)
{
    int nranks = g->mesh.naxes ? ptc_mesh_nranks(&g->mesh) : 1;
    ptc_plan_stats s;
    ptc_plan_stats_of(g, &s);
    fputs("{\n  \"schema\": \"ptc-plan/1\",\n  \"model\": ", f);
    json_string(f, g->name);
    fputs(",\n  \"mesh\": {", f);
    for (int a = 0; a < g->mesh.naxes; a++)
        fprintf(f, "%s\"%s\": %d", a ? ", " : "", g->mesh.names[a], g->mesh.sizes[a]);
    fprintf(f, "},\n  \"ranks\": %d,\n  \"zero\": %d,\n  \"seq_parallel\": %s,\n", nranks,
            info->zero, info->seq_parallel ? "true" : "false");
    fprintf(f, "  \"parameter_count\": %lld,\n  \"parameters\": [",
            (long long)info->logical_params);
    bool first = true;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_PARAM)
            continue;
        const ptc_value *v = &g->values[n->out[0]];
        ptc_type ft = full_type(g, v);
        fputs(first ? "\n    {\"name\": " : ",\n    {\"name\": ", f);
        first = false;
        json_string(f, n->attrs.name);
        fputs(", \"shape\": ", f);
        json_dims(f, &ft);
        fputs(", \"placement\": {", f);
        put_placement(f, g, v, true);
        fputs("}, \"local_shape\": ", f);
        json_dims(f, &v->type);
        fputc('}', f);
    }
    fprintf(f, "\n  ],\n  \"programs\": [\n    {\n      \"ranks\": [");
    for (int r = 0; r < nranks; r++)
        fprintf(f, "%s%d", r ? ", " : "", r);
    fprintf(f,
            "],\n      \"memory_bytes\": {\"parameters\": %lld, \"gradients\": %lld, "
            "\"optimizer_state\": %lld, \"peak_activations\": %lld},\n",
            (long long)s.param_bytes, (long long)s.grad_bytes, (long long)s.optim_bytes,
            (long long)s.peak_act_bytes);
    fprintf(f, "      \"communication\": {\"bytes\": %lld, \"collectives\": %d, \"by_kind\": {",
            (long long)s.comm_bytes, s.ncollectives);
    first = true;
    for (int k = 0; k < 4; k++)
        if (s.kind_count[k]) {
            fprintf(f, "%s\"%s\": {\"count\": %d, \"bytes\": %lld}", first ? "" : ", ",
                    kind_names[k], s.kind_count[k], (long long)s.kind_bytes[k]);
            first = false;
        }
    fputs("}, \"by_axis\": {", f);
    for (int a = 0; a < g->mesh.naxes; a++)
        fprintf(f, "%s\"%s\": %lld", a ? ", " : "", g->mesh.names[a], (long long)s.axis_bytes[a]);
    fputs("}, \"by_layer\": {", f);
    layer_sum ls[512];
    int nl = layers_of(g, ls, 512);
    for (int i = 0; i < nl; i++) {
        fputs(i ? ", " : "", f);
        json_string(f, ls[i].name);
        fprintf(f, ": {\"count\": %d, \"bytes\": %lld}", ls[i].count, (long long)ls[i].bytes);
    }
    fputs("}},\n      \"collectives\": [", f);
    first = true;
    int loss_node = g->loss >= 0 ? g->values[g->loss].def : g->nnodes;
    int first_update = g->nnodes;
    for (int i = g->nnodes - 1; i >= 0; i--)
        if (g->nodes[i].op == PTC_OP_ADAMW_UPDATE || g->nodes[i].op == PTC_OP_SGD_UPDATE ||
            g->nodes[i].op == PTC_OP_SUMSQ)
            first_update = i;
    for (int i = 0, idx = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (kind_of(n->op) == K_NONE)
            continue;
        fprintf(f, "%s\n        {\"index\": %d, \"kind\": \"%s\", \"axis\": \"%s\", \"shape\": ",
                first ? "" : ",", idx++, kind_names[kind_of(n->op)],
                g->mesh.names[n->attrs.mesh_axis]);
        first = false;
        json_dims(f, &g->values[n->in[0]].type);
        fprintf(f, ", \"bytes\": %lld, \"scope\": ", (long long)ptc_plan_comm_bytes(g, n));
        json_string(f, n->loc.scope ? n->loc.scope : "");
        fprintf(f, ", \"line\": %d, \"phase\": \"%s\"}", n->loc.line,
                i <= loss_node     ? "forward"
                : i < first_update ? "backward"
                                   : "update");
    }
    fputs("\n      ],\n      \"ir\": ", f);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    ptc_print(g, m);
    fclose(m);
    json_string(f, text);
    free(text);
    fputs("\n    }\n  ]\n}\n", f);
}
