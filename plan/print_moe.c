/* print_moe.c - the mixture-of-experts part of a plan's summary (--emit plan): per moe layer
 * the experts this rank holds, the dispatch buffers the plan reserves for expert parallelism's
 * all-to-alls and the bytes they move, the per-expert counts the ranks exchange, and the memory
 * of the rank's experts (parameters, gradients, optimizer state).
 *
 * Everything here is read from the program (kernels of the moe ops, all_to_all_v instructions,
 * the optimizer updates), so it describes what the executable runs.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

static void put_bytes(FILE *f, int64_t b)
{
    char h[32];
    ptc_human_bytes(b, h, sizeof h);
    fputs(h, f);
}

static bool experts_op(ptc_op op)
{
    return op == PTC_OP_MOE_FFN || op == PTC_OP_MOE_FFN_GRAD || op == PTC_OP_MOE_EP_FFN ||
           op == PTC_OP_MOE_EP_FFN_GRAD;
}

/* The parameter buffer (root) whose value buffer b holds: itself, a view of it, or what an
 * all-gather (ZeRO-3) made of it; -1 if none. */
static int param_of(const ptc_program *pg, int b, int depth)
{
    int r = ptc_prog_root(pg, b);
    if (pg->bufs[r].kind == PTC_BUF_PARAM)
        return r;
    for (int i = 0; i < pg->ninstrs && depth < 4; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind == PTC_INSTR_COLL && in->coll.kind == PTC_COLL_ALLGATHER &&
            ptc_prog_root(pg, in->out[0]) == r)
            return param_of(pg, in->in[0], depth + 1);
    }
    return -1;
}

/* The expert weights of the program (parameter buffers), marked in expert[]. */
static void mark_experts(const ptc_program *pg, bool *expert)
{
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_KERNEL || !experts_op(in->op))
            continue;
        int first = in->op == PTC_OP_MOE_EP_FFN || in->op == PTC_OP_MOE_EP_FFN_GRAD ? 2 : 3;
        for (int k = first; k < first + 2; k++) {
            int pb = param_of(pg, in->in[k], 0);
            if (pb >= 0)
                expert[pb] = true;
        }
    }
}

/* Bytes of the experts' parameters, gradients (what the update reads) and optimizer state. */
static void expert_memory(const ptc_program *pg, const bool *expert, int64_t *param, int64_t *grad,
                          int64_t *state)
{
    *param = *grad = *state = 0;
    for (int b = 0; b < pg->nbufs; b++)
        if (expert[b])
            *param += pg->bufs[b].bytes;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        bool adam = in->op == PTC_OP_ADAMW_UPDATE, sgd = in->op == PTC_OP_SGD_UPDATE;
        if (in->kind == PTC_INSTR_FUSED && adam) {
            /* the fusion pass's multi-tensor AdamW: (parameter, m, v) written per tensor, each
             * over its input; the gradient it reads has the parameter's shape */
            for (int o = 0; o + 2 < in->nout; o += 3) {
                int pb = param_of(pg, in->out[o], 0);
                if (pb < 0 || !expert[pb])
                    continue;
                *grad += pg->bufs[in->out[o]].bytes;
                *state += pg->bufs[ptc_prog_root(pg, in->out[o + 1])].bytes +
                          pg->bufs[ptc_prog_root(pg, in->out[o + 2])].bytes;
            }
            continue;
        }
        if (in->kind != PTC_INSTR_KERNEL || !(adam || sgd))
            continue;
        int pb = param_of(pg, in->in[0], 0);
        if (pb < 0 || !expert[pb])
            continue;
        *grad += pg->bufs[ptc_prog_root(pg, in->in[1])].bytes;
        for (int k = 2; k < (adam ? 4 : 3); k++)
            *state += pg->bufs[ptc_prog_root(pg, in->in[k])].bytes;
    }
}

typedef struct moe_layer {
    char name[64];
    int64_t experts, local, send_rows, recv_rows, row_bytes, a2a_bytes, a2a_max, a2a_n;
    int64_t count_bytes, tokens; /* tokens: of the step (the route's full shape) */
    double capacity;
    int top_k, a2a_axis;
} moe_layer;

static moe_layer *layer_of(moe_layer *ls, int *n, int cap, const ptc_instr *in)
{
    char name[64];
    ptc_plan_layer(in->loc.scope, name, sizeof name);
    for (int k = 0; k < *n; k++)
        if (strcmp(ls[k].name, name) == 0)
            return &ls[k];
    if (*n == cap)
        return NULL;
    moe_layer *l = &ls[(*n)++];
    memset(l, 0, sizeof *l);
    snprintf(l->name, sizeof l->name, "%s", name);
    l->a2a_axis = -1;
    return l;
}

static int collect(const ptc_plan *p, const ptc_program *pg, moe_layer *ls, int cap)
{
    int n = 0;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        bool route = in->kind == PTC_INSTR_KERNEL && in->op == PTC_OP_MOE_ROUTE;
        bool ffn = in->kind == PTC_INSTR_KERNEL &&
                   (in->op == PTC_OP_MOE_FFN || in->op == PTC_OP_MOE_EP_FFN);
        bool a2a = in->kind == PTC_INSTR_COLL && in->coll.kind == PTC_COLL_ALL_TO_ALL_V;
        /* the per-expert counts: i32 gathers of moe layers (batch-row counts, kept choices) */
        bool counts = in->kind == PTC_INSTR_COLL && in->coll.kind == PTC_COLL_ALLGATHER &&
                      pg->bufs[in->in[0]].type.dtype == PTC_I32;
        if (!route && !ffn && !a2a && !counts)
            continue;
        moe_layer *l = layer_of(ls, &n, cap, in);
        if (!l)
            continue;
        if (route) {
            ptc_type full = ptc_buffer_full_type(&p->mesh, &pg->bufs[in->in[0]]);
            l->capacity = in->attrs.capacity;
            l->top_k = (int)full.dims[2];
            l->tokens = full.dims[0] * full.dims[1];
        }
        if (ffn) {
            int w = in->op == PTC_OP_MOE_EP_FFN ? 2 : 3;
            l->experts = in->attrs.n;
            l->local = pg->bufs[in->in[w]].type.dims[0];
        }
        if (counts)
            l->count_bytes += ptc_plan_comm_bytes(p, pg, in);
        if (!a2a)
            continue;
        const ptc_buffer *x = &pg->bufs[in->in[0]], *y = &pg->bufs[in->out[0]];
        l->row_bytes = in->coll.chunk * ptc_dtype_size(x->type.dtype);
        if (in->coll.outer == 0 && in->phase == PTC_PHASE_FORWARD) {
            l->send_rows = x->type.dims[0];
            l->recv_rows = y->type.dims[0];
        }
        l->a2a_bytes += ptc_plan_comm_bytes(p, pg, in);
        l->a2a_max += x->bytes; /* every row it holds to the other members */
        l->a2a_n++;
        for (int a = 0; a < p->mesh.naxes; a++)
            if (in->coll.axes & (1u << a))
                l->a2a_axis = a;
    }
    return n;
}

/* Layers a and b report the same figures (so one line serves both). */
static bool alike(const moe_layer *a, const moe_layer *b)
{
    return a->experts == b->experts && a->local == b->local && a->top_k == b->top_k &&
           a->capacity == b->capacity && a->tokens == b->tokens && a->send_rows == b->send_rows &&
           a->recv_rows == b->recv_rows && a->row_bytes == b->row_bytes &&
           a->a2a_bytes == b->a2a_bytes && a->a2a_max == b->a2a_max && a->a2a_n == b->a2a_n &&
           a->count_bytes == b->count_bytes && a->a2a_axis == b->a2a_axis;
}

static void put_layer(FILE *f, const ptc_plan *p, const moe_layer *l, const moe_layer *last,
                      int count)
{
    if (count > 1)
        fprintf(f, "    %s .. %s (%d layers, each):\n      %-15s ", l->name, last->name, count,
                "experts");
    else
        fprintf(f, "    %-17s ", l->name);
    fprintf(f, "%lld of %lld", (long long)l->local, (long long)l->experts);
    if (l->a2a_axis >= 0)
        fprintf(f, " (split over %s)", p->mesh.names[l->a2a_axis]);
    fprintf(f, ", top_k %d, ", l->top_k);
    int64_t C = ptc_moe_capacity(l->capacity, l->tokens, l->top_k, l->experts);
    if (l->capacity > 0)
        fprintf(f, "capacity %g: %lld of the step's %lld tokens per expert\n", l->capacity,
                (long long)C, (long long)l->tokens);
    else
        fprintf(f, "dropless (%lld tokens in the step)\n", (long long)l->tokens);
    if (l->count_bytes) {
        fputs("      count exchange  ", f);
        put_bytes(f, l->count_bytes);
        fputs(" sent (all-gathers of per-expert counts: routing over the whole step)\n", f);
    }
    if (!l->a2a_n) {
        fputs("      dispatch        none: the experts run on this rank's own tokens, in place\n",
              f);
        return;
    }
    fprintf(f, "      dispatch        send %lld rows (", (long long)l->send_rows);
    put_bytes(f, l->send_rows * l->row_bytes);
    fprintf(f, "), receive %lld rows (", (long long)l->recv_rows);
    put_bytes(f, l->recv_rows * l->row_bytes);
    fprintf(f, "), reserved for %s\n",
            l->capacity > 0 ? "the most the capacity lets through" : "the worst case");
    fprintf(f, "      all-to-all      %lld per step: ", (long long)l->a2a_n);
    put_bytes(f, l->a2a_bytes);
    fputs(" sent with balanced routing, at most ", f);
    put_bytes(f, l->a2a_max);
    fputc('\n', f);
}

void ptc_print_moe(FILE *f, const ptc_plan *p, int program)
{
    const ptc_program *pg = &p->programs[program];
    moe_layer ls[256];
    int n = collect(p, pg, ls, 256), nmoe = 0;
    for (int i = 0; i < n; i++)
        nmoe += ls[i].experts > 0;
    if (!nmoe)
        return;
    bool *expert = ptc_xcalloc((size_t)(pg->nbufs ? pg->nbufs : 1), sizeof(bool));
    mark_experts(pg, expert);
    int64_t pb, gb, sb;
    expert_memory(pg, expert, &pb, &gb, &sb);
    free(expert);
    fprintf(f, "  mixture of experts (%d layer%s, per rank):\n", nmoe, nmoe > 1 ? "s" : "");
    fputs("    expert memory     ", f);
    put_bytes(f, pb + gb + sb);
    fputs(": parameters ", f);
    put_bytes(f, pb);
    fputs(", gradients ", f);
    put_bytes(f, gb);
    fputs(", optimizer state ", f);
    put_bytes(f, sb);
    fputc('\n', f);
    for (int i = 0; i < n;) {
        if (!ls[i].experts) {
            i++;
            continue;
        }
        int j = i + 1;
        while (j < n && ls[j].experts && alike(&ls[i], &ls[j]))
            j++;
        put_layer(f, p, &ls[i], &ls[j - 1], j - i);
        i = j;
    }
}
