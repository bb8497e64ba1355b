/* lower.c - a step graph to an execution plan (see planner.h for what each node becomes).
 *
 * Assumes: g is verified and partitioned (placements over its mesh, which may hold the
 *          microbatch axis "mb"); with a pipeline, node.stage is every node's virtual stage
 *          (passes/pipeline.c).
 * Guarantees: the plan verifies (ptc_plan_verify); running the step entry of every rank computes
 *          what running the graph's nodes in order computes, with the graph's state updates
 *          applied at the end.
 *
 * The work: analyse the graph (phases, GEMMs and folded transposes, what runs per microbatch);
 * list each pipeline stage's items in the order they run (the schedule's tasks, each a forward or
 * backward of one microbatch on one virtual stage, the step's own work after them; recomputed
 * forward nodes just before the backward that reads them); insert the messages between stages
 * (a send right after the value is made, its receive before its first use, in the order the
 * sender sends); then emit every stage's items as instructions over buffers (lower_emit.c) and
 * plan the memory.
 */
#include <stdlib.h>
#include <string.h>

#include "lower_internal.h"
#include "schedule.h"

static bool is_source_op(ptc_op op)
{
    return op == PTC_OP_INPUT || op == PTC_OP_PARAM || op == PTC_OP_STATE;
}

/* ---- analysis of the graph ---- */

static bool gemmable(const ptc_graph *g, const ptc_node *n)
{
    const ptc_type *a = &g->values[n->in[0]].type, *b = &g->values[n->in[1]].type,
                   *o = &g->values[n->out[0]].type;
    /* f32, or 16-bit operands (the GEMM's result is f32, rounded to a 16-bit result after it) */
    if (a->dtype != b->dtype || a->dtype == PTC_I32 ||
        (o->dtype != PTC_F32 && o->dtype != a->dtype))
        return false;
    int64_t ob = lw_batch_of(o), ab = lw_batch_of(a), bb = lw_batch_of(b);
    return (ab == 1 || ab == ob) && (bb == 1 || bb == ob);
}

static void find_node_last_uses(lw *L)
{
    const ptc_graph *g = L->g;
    for (int v = 0; v < g->nvalues; v++)
        L->nlast[v] = -1;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            L->nlast[g->nodes[i].in[k]] = i;
    int end = g->nnodes;
    if (g->loss >= 0)
        L->nlast[g->loss] = end;
    for (int i = 0; i < g->noutputs; i++)
        if (i == 0 || L->o->keep_grad_outputs)
            L->nlast[g->outputs[i]] = end;
    for (int i = 0; i < g->nupdates; i++)
        L->nlast[g->updates[i].to] = end;
}

/* Marks the nodes that value v depends on (mark[node] = 1), stopping at marked ones. */
static void cone(const ptc_graph *g, int v, uint8_t *mark, int *stack)
{
    int sp = 0;
    stack[sp++] = g->values[v].def;
    while (sp) {
        int ni = stack[--sp];
        if (mark[ni])
            continue;
        mark[ni] = 1;
        for (int k = 0; k < g->nodes[ni].nin; k++)
            stack[sp++] = g->values[g->nodes[ni].in[k]].def;
    }
}

/* forward: what the loss needs; backward: what the gradient norm (or the gradients) need
 * besides; update: the rest (clipping, the optimizer). */
static void find_phases(lw *L)
{
    const ptc_graph *g = L->g;
    int nn = g->nnodes ? g->nnodes : 1;
    uint8_t *fwd = ptc_xcalloc((size_t)nn, 1), *bwd = ptc_xcalloc((size_t)nn, 1);
    int64_t stack_n = 0;
    for (int i = 0; i < g->nnodes; i++)
        stack_n += g->nodes[i].nin;
    int *stack = ptc_xmalloc(sizeof(int) * (size_t)(stack_n + 1));
    if (g->loss >= 0)
        cone(g, g->loss, fwd, stack);
    memcpy(bwd, fwd, (size_t)nn);
    for (int i = 0; i < g->noutputs; i++)
        cone(g, g->outputs[i], bwd, stack);
    bool training = g->nupdates > 0;
    for (int i = 0; i < g->nnodes; i++)
        L->phase[i] = fwd[i] || !training ? PTC_PHASE_FORWARD
                      : bwd[i]            ? PTC_PHASE_BACKWARD
                                          : PTC_PHASE_UPDATE;
    free(fwd);
    free(bwd);
    free(stack);
}

/* A matrix product whose result only a transpose reads (the weight gradient of x @
 * transpose(w)) computes the transposed result directly (C^T = B^T A^T): one buffer and one copy
 * fewer. Only single 2-D products: a batched one's transpose is per matrix. */
static void find_transposed_results(lw *L)
{
    const ptc_graph *g = L->g;
    int *readers = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(int));
    for (int i = 0; i < g->nnodes; i++) {
        L->tout[i] = -1;
        for (int k = 0; k < g->nodes[i].nin; k++)
            readers[g->nodes[i].in[k]]++;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *t = &g->nodes[i];
        if (t->op != PTC_OP_TRANSPOSE || L->fold[t->out[0]] >= 0 || L->undo[t->out[0]] >= 0)
            continue;
        int v = t->in[0], m = g->values[v].def;
        if (!L->gemm[m] || readers[v] != 1 || L->nlast[v] != i || g->values[v].type.rank != 2 ||
            lw_batch_of(&g->values[g->nodes[m].in[0]].type) != 1 ||
            lw_batch_of(&g->values[g->nodes[m].in[1]].type) != 1 ||
            g->nodes[m].recompute != t->recompute)
            continue;
        L->tout[m] = t->out[0];
        L->tout[i] = -2; /* the transpose itself: nothing to run */
    }
    free(readers);
}

/* Matmuls that become GEMMs, transposes that fold into them, and transposes of transposes (the
 * backward of x @ transpose(w) reads transpose(transpose(w))), which are views of the original. */
static void find_gemms(lw *L)
{
    const ptc_graph *g = L->g;
    for (int i = 0; i < g->nnodes; i++)
        L->gemm[i] = g->nodes[i].op == PTC_OP_MATMUL && gemmable(g, &g->nodes[i]);
    for (int v = 0; v < g->nvalues; v++) {
        const ptc_node *d = &g->nodes[g->values[v].def];
        const ptc_node *dd = d->op == PTC_OP_TRANSPOSE ? &g->nodes[g->values[d->in[0]].def] : d;
        L->undo[v] = d->op == PTC_OP_TRANSPOSE && dd->op == PTC_OP_TRANSPOSE ? dd->in[0] : -1;
    }
    bool *ok = ptc_xmalloc((size_t)(g->nvalues ? g->nvalues : 1));
    for (int v = 0; v < g->nvalues; v++) {
        const ptc_node *d = &g->nodes[g->values[v].def];
        ok[v] = d->op == PTC_OP_TRANSPOSE && g->values[v].type.dtype != PTC_I32 &&
                L->nlast[v] >= 0 && L->nlast[v] < g->nnodes;
    }
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (!L->gemm[i] && !(g->nodes[i].nout == 1 && L->undo[g->nodes[i].out[0]] >= 0))
                ok[g->nodes[i].in[k]] = false;
    for (int v = 0; v < g->nvalues; v++) {
        const ptc_node *d = &g->nodes[g->values[v].def];
        L->fold[v] = ok[v] && !ok[d->in[0]] ? d->in[0] : -1;
    }
    find_transposed_results(L);
    free(ok);
}

/* What runs where and how often: sources; free nodes (only sources and free nodes as operands:
 * run wherever needed); per-microbatch nodes (they depend on the microbatch's data); and the
 * step's own work after the microbatches. An allreduce over mb is the microbatches' sum (its
 * result is the step's); a gradient only such a sum reads accumulates straight into it. */
static int find_classes(lw *L)
{
    const ptc_graph *g = L->g;
    for (int v = 0; v < g->nvalues; v++)
        L->acc[v] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        L->mbsum[i] = L->mb_axis >= 0 && (ptc_ops[n->op].flags & PTC_F_COMM) &&
                      n->attrs.mesh_axis == L->mb_axis;
        if (is_source_op(n->op)) {
            L->cls[i] = CLS_SOURCE;
            /* the data of a step: split over the microbatches (or, with one microbatch and a
             * pipeline, every input but the optimizer's) */
            bool data = L->mb_axis >= 0
                            ? n->op == PTC_OP_INPUT &&
                                  g->values[n->out[0]].place[L->mb_axis].kind == PTC_PLACE_SHARD
                            : L->tasks && n->op == PTC_OP_INPUT &&
                                  strncmp(n->attrs.name, "opt.", 4) != 0;
            L->val_mb[n->out[0]] = data;
            continue;
        }
        bool free_ = true, mb = false, post = false;
        for (int k = 0; k < n->nin; k++) {
            int d = g->values[n->in[k]].def;
            int cd = L->cls[d];
            /* the data is no free node's operand: what reads it runs once per microbatch */
            bool data = g->nodes[d].op == PTC_OP_INPUT &&
                        strncmp(g->nodes[d].attrs.name, "opt.", 4) != 0;
            free_ &= (cd == CLS_SOURCE && !data) || cd == CLS_FREE;
            mb |= L->val_mb[n->in[k]];
            post |= cd == CLS_POST || (cd == CLS_MB && !L->val_mb[n->in[k]]);
        }
        if (L->mb_axis >= 0 && (ptc_ops[n->op].kw & PTC_A_MESH_AXIS) &&
            !(ptc_ops[n->op].flags & PTC_F_COMM) && n->attrs.mesh_axis == L->mb_axis)
            mb = true; /* rank-dependent over the microbatches */
        if (!L->tasks) {
            L->cls[i] = free_ ? CLS_FREE : CLS_POST;
        } else if (mb && L->phase[i] == PTC_PHASE_UPDATE && L->M == 1) {
            L->cls[i] = CLS_POST; /* the one microbatch's values, read after it */
        } else if (mb) {
            if (post) {
                lw_fail(L, "internal error: %%%d (%s) mixes per-microbatch values with the step's",
                        n->out[0], ptc_ops[n->op].name);
                return -1;
            }
            L->cls[i] = CLS_MB;
        } else {
            L->cls[i] = free_ ? CLS_FREE : CLS_POST;
        }
        for (int k = 0; k < n->nout; k++)
            L->val_mb[n->out[k]] = L->cls[i] == CLS_MB && !L->mbsum[i];
        if (L->mbsum[i]) {
            if (L->cls[i] != CLS_MB) {
                lw_fail(L, "internal error: a sum over the microbatches of the step's value %%%d",
                        n->in[0]);
                return -1;
            }
            /* the gradient it sums accumulates straight into the sum when nothing else reads
             * it (f32 only: a 16-bit result is computed in f32 and then rounded into its
             * buffer, which would overwrite the sum rather than add to it) */
            int x = n->in[0];
            if (n->op == PTC_OP_ALLREDUCE && L->nlast[x] == i && L->fold[x] < 0 &&
                !is_source_op(g->nodes[g->values[x].def].op) &&
                g->values[x].type.dtype == PTC_F32 &&
                g->values[x].type.dtype == g->values[n->out[0]].type.dtype) {
                int readers = 0;
                for (int j = 0; j < g->nnodes; j++)
                    for (int k = 0; k < g->nodes[j].nin; k++)
                        readers += g->nodes[j].in[k] == x;
                if (readers == 1)
                    L->acc[x] = n->out[0];
            }
        }
    }
    return 0;
}

bool lw_reads_recomputed(const lw *L, const item *it, int v)
{
    if (it->kind != IT_NODE)
        return false;
    int d = L->g->values[v].def;
    const ptc_node *dn = &L->g->nodes[d];
    if (!dn->recompute || L->phase[d] != PTC_PHASE_FORWARD || L->cls[d] == CLS_FREE ||
        L->cls[d] == CLS_SOURCE)
        return false;
    /* a clone reads clones; the backward reads clones of its own stage's forward */
    if (it->ver)
        return true;
    return L->phase[it->ni] != PTC_PHASE_FORWARD && L->cls[it->ni] != CLS_FREE &&
           (L->P == 1 || dn->stage % L->P == L->g->nodes[it->ni].stage % L->P);
}

/* ---- the items of every stage ---- */

typedef struct msg {
    int v, inst;
    int from, to;
    int into;     /* recv straight into this state's buffer, or -1 */
    int send_pos; /* position of the producing item (then of the send) in from's list */
    int use_pos;  /* position of the first use in to's list (then of the receive) */
} msg;

typedef struct list {
    item *it;
    int n, cap;
} list;

typedef struct build {
    lw *L;
    list *stage;     /* [P] */
    int *produced;   /* [P][nkeys]: position of the item that makes the key, -1, -2: received */
    bool *uses;      /* [P][nvalues]: the stage reads the source value */
    size_t nkeys;
    msg *msgs;
    int nmsgs, capmsgs;
    int **task_nodes; /* [P V][3]: the nodes of a forward, backward, weight-gradient task */
    int *ntask_nodes;
} build;

static int stage_of(const lw *L, int ni)
{
    return L->P > 1 ? L->g->nodes[ni].stage % L->P : 0;
}

/* The values node ni's instructions read (a folded transpose's operand for the transpose). */
static int node_reads(const lw *L, int ni, int *vals)
{
    const ptc_node *n = &L->g->nodes[ni];
    int v = n->out[0];
    switch (n->op) {
    case PTC_OP_INPUT:
    case PTC_OP_PARAM:
    case PTC_OP_STATE: return 0;
    case PTC_OP_TRANSPOSE:
        if (L->tout[ni] == -2 || (L->fold[v] >= 0 && L->undo[v] < 0))
            return 0;
        if (L->undo[v] >= 0) {
            vals[0] = L->undo[v];
            return 1;
        }
        break;
    case PTC_OP_MATMUL:
        if (L->gemm[ni]) {
            for (int k = 0; k < 2; k++)
                vals[k] = L->fold[n->in[k]] >= 0 ? L->fold[n->in[k]] : n->in[k];
            return 2;
        }
        break;
    default: break;
    }
    for (int k = 0; k < n->nin; k++)
        vals[k] = n->in[k];
    return n->nin;
}

/* The values node ni's instructions make. */
static int node_writes(const lw *L, int ni, int *vals)
{
    const ptc_node *n = &L->g->nodes[ni];
    if (n->op == PTC_OP_TRANSPOSE &&
        (L->tout[ni] == -2 || (L->fold[n->out[0]] >= 0 && L->undo[n->out[0]] < 0)))
        return 0;
    if (L->tout[ni] >= 0) {
        vals[0] = L->tout[ni];
        return 1;
    }
    for (int k = 0; k < n->nout; k++)
        vals[k] = n->out[k];
    return n->nout;
}

static int *produced(build *B, int s, size_t key)
{
    return &B->produced[(size_t)s * B->nkeys + key];
}

static void push_item(list *l, const item *it)
{
    PTC_GROW(l->it, l->cap, l->n);
    l->it[l->n++] = *it;
}

static void add_node(build *B, int s, int ni, int inst, int ver, int work, int vstage);

/* Value v is there on stage s when item `it` (about to be appended) reads it: made on s before,
 * a free node run now, a recomputed copy made now, or a message from the stage that makes it. */
static void ensure(build *B, int s, const item *it, int v)
{
    lw *L = B->L;
    int d = L->g->values[v].def;
    if (L->cls[d] == CLS_SOURCE) {
        B->uses[(size_t)s * (size_t)L->g->nvalues + (size_t)v] = true;
        return;
    }
    int inst = lw_inst(L, v, it->inst), ver = lw_reads_recomputed(L, it, v);
    size_t key = lw_key(L, v, inst, ver);
    if (*produced(B, s, key) != -1)
        return;
    if (L->cls[d] == CLS_FREE) { /* shown as part of the work that first needs it */
        add_node(B, s, d, -1, 0, it->work, it->vstage);
        B->stage[s].it[B->stage[s].n - 1].label_mb = it->inst;
        return;
    }
    if (ver) {
        add_node(B, s, d, inst, 1, it->work, it->vstage);
        return;
    }
    int home = stage_of(L, d);
    if (home == s) {
        lw_fail(L,
                "internal error: stage %d reads %%%d (%s, microbatch %d) before it is computed "
                "(the schedule's order is not a valid one)",
                s, v, ptc_ops[L->g->nodes[d].op].name, inst);
        *produced(B, s, key) = -2;
        return;
    }
    PTC_GROW(B->msgs, B->capmsgs, B->nmsgs);
    B->msgs[B->nmsgs++] =
        (msg){.v = v, .inst = inst, .from = home, .to = s, .into = -1, .use_pos = B->stage[s].n};
    *produced(B, s, key) = -2;
}

static void add_node(build *B, int s, int ni, int inst, int ver, int work, int vstage)
{
    lw *L = B->L;
    const ptc_node *n = &L->g->nodes[ni];
    item it = {.kind = IT_NODE,
               .ver = (uint8_t)ver,
               .work = (uint8_t)work,
               .vstage = (int16_t)vstage,
               .ni = ni,
               .inst = inst,
               .v = -1,
               .into = -1,
               .label_mb = inst};
    int w[PTC_MAX_RESULTS], nw = node_writes(L, ni, w);
    if (L->cls[ni] == CLS_FREE && nw && *produced(B, s, lw_out_key(L, &it, w[0])) != -1)
        return; /* a free node already run on this stage */
    int r[PTC_MAX_RESULTS * 2], nr = node_reads(L, ni, r);
    for (int k = 0; k < nr; k++)
        ensure(B, s, &it, r[k]);
    if (is_source_op(n->op))
        B->uses[(size_t)s * (size_t)L->g->nvalues + (size_t)n->out[0]] = true;
    for (int k = 0; k < nw; k++)
        *produced(B, s, lw_out_key(L, &it, w[k])) = B->stage[s].n;
    push_item(&B->stage[s], &it);
}

/* The nodes of every task: per virtual stage, its per-microbatch forward nodes (F), its backward
 * nodes (B) and, when the schedule splits the backward, the weight-gradient ones (W): those that
 * do not lead to the gradient another stage's backward reads. */
static void find_task_nodes(build *B, bool split)
{
    lw *L = B->L;
    const ptc_graph *g = L->g;
    int S = L->P * L->V;
    B->task_nodes = ptc_xcalloc((size_t)S * 3, sizeof(int *));
    B->ntask_nodes = ptc_xcalloc((size_t)S * 3, sizeof(int));
    uint8_t *kind = ptc_xcalloc((size_t)(g->nnodes ? g->nnodes : 1), 1);
    for (int i = 0; i < g->nnodes; i++)
        if (L->cls[i] == CLS_MB)
            kind[i] = L->phase[i] == PTC_PHASE_FORWARD ? 1 : split ? 3 : 2;
    if (split) { /* B: the cone of values another virtual stage's backward reads */
        for (int i = g->nnodes - 1; i >= 0; i--) {
            const ptc_node *n = &g->nodes[i];
            if (kind[i] == 0)
                continue;
            for (int k = 0; k < n->nin; k++) {
                int d = g->values[n->in[k]].def;
                if (kind[d] == 3 && (g->nodes[d].stage != n->stage || kind[i] == 2))
                    kind[d] = 2;
            }
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        if (!kind[i])
            continue;
        int vs = L->P * L->V > 1 ? g->nodes[i].stage : 0;
        if (vs < 0 || vs >= S)
            vs = 0;
        int t = vs * 3 + kind[i] - 1;
        B->task_nodes[t] = ptc_xrealloc(B->task_nodes[t], sizeof(int) * (size_t)(B->ntask_nodes[t] + 1));
        B->task_nodes[t][B->ntask_nodes[t]++] = i;
    }
    free(kind);
}

static void build_stage(build *B, int s, const ptc_pp_plan *pp)
{
    lw *L = B->L;
    const ptc_graph *g = L->g;
    if (!L->tasks) {
        for (int i = 0; i < g->nnodes && !L->failed; i++)
            add_node(B, s, i, -1, 0, PTC_WORK_STEP, 0);
        return;
    }
    for (int t = 0; t < pp->len[s] && !L->failed; t++) {
        const ptc_task *task = &pp->order[s][t];
        int vs = task->chunk * L->P + s;
        int k = task->kind == PTC_TASK_F ? 0 : task->kind == PTC_TASK_B ? 1 : 2;
        int work = k == 0 ? PTC_WORK_F : k == 1 ? PTC_WORK_B : PTC_WORK_W;
        int *nodes = B->task_nodes[vs * 3 + k];
        for (int j = 0; j < B->ntask_nodes[vs * 3 + k]; j++)
            add_node(B, s, nodes[j], task->mb, 0, work, vs);
    }
    for (int i = 0; i < g->nnodes && !L->failed; i++)
        if (L->cls[i] == CLS_POST && stage_of(L, i) == s)
            add_node(B, s, i, -1, 0, PTC_WORK_STEP, g->nodes[i].stage);
}

/* A value every stage holds at the end of the step (the loss, the gradient norm): sent from the
 * stage that makes it to every other. */
static void broadcast_at_end(build *B, int v)
{
    lw *L = B->L;
    if (v < 0 || L->cls[L->g->values[v].def] == CLS_SOURCE)
        return;
    int d = L->g->values[v].def, home = stage_of(L, d), inst = lw_inst(L, v, 0);
    size_t key = lw_key(L, v, inst, 0);
    for (int s = 0; s < L->P; s++) {
        if (s == home || L->cls[d] == CLS_FREE || *produced(B, s, key) != -1)
            continue;
        PTC_GROW(B->msgs, B->capmsgs, B->nmsgs);
        B->msgs[B->nmsgs++] = (msg){
            .v = v, .inst = inst, .from = home, .to = s, .into = -1, .use_pos = B->stage[s].n};
        *produced(B, s, key) = -2;
    }
}

/* A state updated on one stage and held by others too (a parameter tied between the first and
 * the last stage): its new value is sent to them, into their copy. */
static void share_updates(build *B)
{
    lw *L = B->L;
    const ptc_graph *g = L->g;
    for (int i = 0; i < g->nupdates; i++) {
        int st = g->updates[i].state, to = g->updates[i].to, d = g->values[to].def;
        if (L->cls[d] == CLS_SOURCE || L->cls[d] == CLS_FREE)
            continue;
        int home = stage_of(L, d);
        for (int s = 0; s < L->P; s++) {
            if (s == home || !B->uses[(size_t)s * (size_t)g->nvalues + (size_t)st])
                continue;
            PTC_GROW(B->msgs, B->capmsgs, B->nmsgs);
            B->msgs[B->nmsgs++] = (msg){.v = to,
                                        .inst = lw_inst(L, to, 0),
                                        .from = home,
                                        .to = s,
                                        .into = st,
                                        .use_pos = B->stage[s].n};
        }
    }
}

static int cmp_int2(const void *a, const void *b)
{
    const int *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* Sends right after the item that makes the value; receives before the first use, in the order
 * the sender sends (a receive moves up to the next one's place when a later message is used
 * first: the sender has sent it by then). */
static void place_messages(build *B)
{
    lw *L = B->L;
    int P = L->P;
    for (int m = 0; m < B->nmsgs; m++) {
        msg *x = &B->msgs[m];
        int pos = *produced(B, x->from, lw_key(L, x->v, x->inst, 0));
        if (pos < 0) {
            lw_fail(L, "internal error: stage %d needs %%%d from stage %d, which does not make it",
                    x->to, x->v, x->from);
            return;
        }
        x->send_pos = pos;
    }
    /* sends: merged after their producers; old -> new positions kept for the receivers */
    int **remap = ptc_xcalloc((size_t)P, sizeof(int *));
    int *order = ptc_xmalloc(sizeof(int) * 2 * (size_t)(B->nmsgs + 1));
    for (int s = 0; s < P; s++) {
        list *l = &B->stage[s];
        int n = 0;
        for (int m = 0; m < B->nmsgs; m++)
            if (B->msgs[m].from == s) {
                order[2 * n] = B->msgs[m].send_pos * P + B->msgs[m].to;
                order[2 * n + 1] = m;
                n++;
            }
        qsort(order, (size_t)n, sizeof(int) * 2, cmp_int2);
        list nl = {0};
        remap[s] = ptc_xmalloc(sizeof(int) * (size_t)(l->n + 1));
        int j = 0;
        for (int i = 0; i < l->n; i++) {
            remap[s][i] = nl.n;
            push_item(&nl, &l->it[i]);
            for (; j < n && B->msgs[order[2 * j + 1]].send_pos == i; j++) {
                msg *x = &B->msgs[order[2 * j + 1]];
                item it = {.kind = IT_SEND,
                           .work = x->inst >= 0 ? l->it[i].work : PTC_WORK_STEP,
                           .vstage = l->it[i].vstage,
                           .ni = -1,
                           .inst = x->inst,
                           .v = x->v,
                           .peer = x->to,
                           .tag = order[2 * j + 1],
                           .into = -1};
                x->send_pos = nl.n;
                push_item(&nl, &it);
            }
        }
        remap[s][l->n] = nl.n;
        free(l->it);
        *l = nl;
    }
    for (int m = 0; m < B->nmsgs; m++)
        B->msgs[m].use_pos = remap[B->msgs[m].to][B->msgs[m].use_pos];
    /* receives */
    for (int t = 0; t < P; t++) {
        list *l = &B->stage[t];
        int n = 0;
        for (int s = 0; s < P; s++) {
            int first = n;
            for (int m = 0; m < B->nmsgs; m++)
                if (B->msgs[m].to == t && B->msgs[m].from == s) {
                    order[2 * n] = B->msgs[m].send_pos;
                    order[2 * n + 1] = m;
                    n++;
                }
            qsort(order + 2 * first, (size_t)(n - first), sizeof(int) * 2, cmp_int2);
            for (int j = n - 2; j >= first; j--) { /* suffix minimum of the uses */
                msg *a = &B->msgs[order[2 * j + 1]], *b = &B->msgs[order[2 * j + 3]];
                if (b->use_pos < a->use_pos)
                    a->use_pos = b->use_pos;
            }
        }
        /* by position, then sender, then send order */
        for (int j = 0; j < n; j++) {
            msg *x = &B->msgs[order[2 * j + 1]];
            order[2 * j] = x->use_pos;
        }
        /* stable: insertion sort on use_pos keeps each sender's send order */
        for (int a = 1; a < n; a++)
            for (int b = a; b > 0 && order[2 * b - 2] > order[2 * b]; b--) {
                int t0 = order[2 * b - 2], t1 = order[2 * b - 1];
                order[2 * b - 2] = order[2 * b];
                order[2 * b - 1] = order[2 * b + 1];
                order[2 * b] = t0;
                order[2 * b + 1] = t1;
            }
        list nl = {0};
        int j = 0;
        for (int i = 0; i <= l->n; i++) {
            for (; j < n && order[2 * j] == i; j++) {
                msg *x = &B->msgs[order[2 * j + 1]];
                const item *next = i < l->n ? &l->it[i] : NULL;
                item it = {.kind = IT_RECV,
                           .work = next && x->inst >= 0 ? next->work : PTC_WORK_STEP,
                           .vstage = next ? next->vstage : 0,
                           .ni = -1,
                           .inst = x->inst,
                           .v = x->v,
                           .peer = x->from,
                           .tag = order[2 * j + 1],
                           .into = x->into};
                push_item(&nl, &it);
            }
            if (i < l->n)
                push_item(&nl, &l->it[i]);
        }
        free(l->it);
        *l = nl;
    }
    for (int s = 0; s < P; s++)
        free(remap[s]);
    free(remap);
    free(order);
}

/* ---- emission of one stage's program ---- */

/* Last reads of every key, in item positions; values the runtime reads after the step live to
 * its end. */
static void key_last_uses(lw *L, int loss_key_inst)
{
    const ptc_graph *g = L->g;
    size_t nk = lw_nkeys(L);
    for (size_t k = 0; k < nk; k++)
        L->last_use[k] = -1;
    for (int pos = 0; pos < L->nitems; pos++) {
        const item *it = &L->items[pos];
        if (it->kind == IT_SEND) {
            L->last_use[lw_key(L, it->v, lw_inst(L, it->v, it->inst), 0)] = pos;
            continue;
        }
        if (it->kind != IT_NODE)
            continue;
        int r[PTC_MAX_RESULTS * 2], nr = node_reads(L, it->ni, r);
        for (int k = 0; k < nr; k++) {
            L->last_use[lw_read_key(L, it, r[k])] = pos;
            if (L->val_mb[r[k]] && L->cls[g->values[r[k]].def] == CLS_SOURCE)
                L->last_use[lw_key(L, r[k], -1, 0)] = pos; /* the whole batch's buffer */
        }
    }
    int end = L->nitems;
    if (g->loss >= 0)
        L->last_use[lw_key(L, g->loss, lw_inst(L, g->loss, loss_key_inst), 0)] = end;
    for (int i = 0; i < g->noutputs; i++)
        if (i == 0 || L->o->keep_grad_outputs)
            L->last_use[lw_key(L, g->outputs[i], lw_inst(L, g->outputs[i], 0), 0)] = end;
    for (int i = 0; i < g->nupdates; i++)
        L->last_use[lw_key(L, g->updates[i].to, -1, 0)] = end;
}

static int input_role_by_name(const char *name)
{
    return strcmp(name, PTC_IN_LR) == 0         ? PTC_ROLE_LR
           : strcmp(name, PTC_IN_STEP) == 0     ? PTC_ROLE_STEP
           : strcmp(name, PTC_IN_MAX_NORM) == 0 ? PTC_ROLE_MAX_NORM
           : strcmp(name, PTC_IN_LOSS_SCALE) == 0 ? PTC_ROLE_LOSS_SCALE
                                                : PTC_ROLE_DATA;
}

/* The buffer of a parameter, a state or an input (an input split over the microbatches holds
 * the rank's whole batch: the microbatches' slices one after the other). */
static void source_buffer(lw *L, int ni)
{
    const ptc_node *n = &L->g->nodes[ni];
    int v = n->out[0];
    size_t k = lw_key(L, v, -1, 0);
    if (L->buf[k] >= 0)
        return;
    int kind = n->op == PTC_OP_INPUT   ? PTC_BUF_INPUT
               : n->op == PTC_OP_PARAM ? PTC_BUF_PARAM
                                       : PTC_BUF_STATE;
    int b;
    if (L->val_mb[v] && L->M > 1) {
        ptc_type t = L->g->values[v].type;
        t.dims[0] *= L->M;
        b = lw_new_buffer(L, &t, L->g->values[v].place, kind);
        L->buf[k] = b;
        L->root_last[b] = L->last_use[k];
        /* mb is partitioned before dp (and ep), so microbatch i is rows [i B/M, (i+1) B/M) of
         * the step's batch, split over the data axes: the rank holds its part of each
         * microbatch in turn, a strided shard of M groups (what the runtime feeds by index).
         * Which tokens form a microbatch must not depend on the mesh: a mixture-of-experts
         * layer routes each microbatch's tokens together. (issue 14) */
        ptc_placement *pl = L->pg->bufs[b].place;
        for (int a = 0; a < L->p->mesh.naxes && L->M <= 255; a++)
            if (pl[a].kind == PTC_PLACE_SHARD && pl[a].dim == 0 && pl[a].groups <= 1 && !pl[a].rem)
                pl[a].groups = (uint8_t)L->M;
    } else {
        b = lw_key_buffer(L, k, v, kind);
    }
    ptc_buffer *bf = &L->pg->bufs[b];
    bf->name = ptc_arena_strdup(L->p->arena, n->attrs.name);
    if (n->op == PTC_OP_INPUT)
        bf->role = (uint8_t)input_role_by_name(n->attrs.name);
    else
        bf->init = n->attrs.init;
}

static int value_buf(const lw *L, int v)
{
    if (v < 0)
        return -1;
    return L->buf[lw_key(L, v, lw_inst(L, v, 0), 0)];
}

/* The reduced gradient a state update consumes: back from its operand through clipping, the
 * widening of a 16-bit gradient (--precision) and shard slices to the data-parallel reduction
 * (or the gradient itself). It lives in the gradient
 * region for the whole step, as the ZeRO paper counts it. */
static void mark_gradients(lw *L)
{
    const ptc_graph *g = L->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_ADAMW_UPDATE && n->op != PTC_OP_SGD_UPDATE)
            continue;
        int v = n->in[1];
        for (int depth = 0; depth < 8; depth++) {
            const ptc_node *d = &g->nodes[g->values[v].def];
            if (d->op == PTC_OP_ALLREDUCE || d->op == PTC_OP_REDUCE_SCATTER)
                break;
            if (d->op == PTC_OP_SHARD_SLICE || d->op == PTC_OP_CAST ||
                (d->op == PTC_OP_MUL && g->values[d->in[1]].type.rank == 0))
                v = d->in[0];
            else
                break;
        }
        int b = value_buf(L, v);
        if (b < 0)
            continue;
        ptc_buffer *r = &L->pg->bufs[ptc_prog_root(L->pg, b)];
        if (r->kind == PTC_BUF_TEMP)
            r->region = PTC_REGION_GRAD;
    }
    for (int b = 0; b < L->pg->nbufs; b++)
        if (L->pg->bufs[b].view >= 0)
            L->pg->bufs[b].region = L->pg->bufs[L->pg->bufs[b].view].region;
}

/* The full type of value v (local dims times the mesh sizes it is sharded over). */
static ptc_type full_of(const ptc_graph *g, int v)
{
    ptc_buffer b;
    memset(&b, 0, sizeof b);
    b.type = g->values[v].type;
    memcpy(b.place, g->values[v].place, sizeof b.place);
    return ptc_buffer_full_type(&g->mesh, &b);
}

/* What the runtime feeds into each input, and the bound of i32 ids. */
static void input_roles(lw *L)
{
    const ptc_graph *g = L->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->nin < 2)
            continue;
        int v = n->in[1], role = 0;
        ptc_type t;
        if (n->op == PTC_OP_EMBEDDING || n->op == PTC_OP_EMBEDDING_SHARD) {
            role = PTC_ROLE_TOKENS;
            t = full_of(g, n->in[0]);
            t.dims[t.rank - 1] = t.dims[0]; /* the bound is the table's rows */
        } else if (n->op == PTC_OP_CROSS_ENTROPY || n->op == PTC_OP_CE_PICK) {
            role = PTC_ROLE_TARGETS;
            t = full_of(g, n->in[0]); /* the bound is the classes */
        } else {
            continue;
        }
        int b = L->buf[lw_key(L, v, -1, 0)];
        if (b < 0 || L->pg->bufs[b].kind != PTC_BUF_INPUT)
            continue;
        ptc_buffer *bf = &L->pg->bufs[b];
        int64_t bound = t.dims[t.rank - 1];
        if (bf->role == PTC_ROLE_DATA || bf->role == role)
            bf->role = (uint8_t)role;
        if (!bf->bound || bound < bf->bound)
            bf->bound = bound;
    }
}

/* The updates this stage makes: a result not written into its state's bytes is copied there at
 * the end of the step. */
static void apply_updates(lw *L)
{
    const ptc_graph *g = L->g;
    for (int i = 0; i < g->nupdates; i++) {
        int st = L->buf[lw_key(L, g->updates[i].state, -1, 0)];
        int to = L->buf[lw_key(L, g->updates[i].to, -1, 0)];
        if (st < 0 || to < 0 || ptc_prog_root(L->pg, st) == ptc_prog_root(L->pg, to))
            continue;
        item it = {.kind = IT_NODE, .ni = g->values[g->updates[i].to].def, .inst = -1, .v = -1,
                   .into = -1};
        lw_emit_copy(L, &it, to, st);
    }
}

static void finish(lw *L)
{
    const ptc_graph *g = L->g;
    ptc_program *pg = L->pg;
    pg->loss = value_buf(L, g->loss);
    pg->grad_norm = g->noutputs > 0 && g->nupdates > 0 ? value_buf(L, g->outputs[0]) : -1;
    /* (issue 14: the moe load balance the step line shows) */
    int nst = ptc_graph_moe_stats(g, NULL, 0), *st = ptc_xmalloc(sizeof(int) * (size_t)(nst + 1));
    ptc_graph_moe_stats(g, st, nst);
    pg->stats = ptc_arena_alloc(L->p->arena, sizeof(int) * (size_t)(nst + 1));
    for (int k = 0; k < nst; k++)
        if (value_buf(L, st[k]) >= 0) /* a layer of this program's stage */
            pg->stats[pg->nstats++] = value_buf(L, st[k]);
    free(st);
    int first = L->o->forward_outputs ? 0 : 1;
    int nout = (L->o->keep_grad_outputs || L->o->forward_outputs) && g->noutputs > first
                   ? g->noutputs - first
                   : 0;
    pg->outputs = ptc_arena_alloc(L->p->arena, sizeof(int) * (size_t)(nout ? nout : 1));
    for (int i = 0; i < nout; i++) {
        int b = value_buf(L, g->outputs[first + i]);
        if (b >= 0)
            pg->outputs[pg->noutputs++] = b;
    }
    input_roles(L);
    mark_gradients(L);
}

static void emit_stage(lw *L, build *B, int s)
{
    const ptc_graph *g = L->g;
    L->items = B->stage[s].it;
    L->nitems = B->stage[s].n;
    size_t nk = lw_nkeys(L);
    for (size_t k = 0; k < nk; k++)
        L->buf[k] = -1;
    key_last_uses(L, 0);
    if (L->tasks) /* every source this stage reads, in graph order */
        for (int i = 0; i < g->nnodes; i++)
            if (L->cls[i] == CLS_SOURCE &&
                B->uses[(size_t)s * (size_t)g->nvalues + (size_t)g->nodes[i].out[0]])
                source_buffer(L, i);
    for (int pos = 0; pos < L->nitems && !L->failed; pos++) {
        L->pos = pos;
        const item *it = &L->items[pos];
        if (it->kind == IT_NODE && L->cls[it->ni] == CLS_SOURCE) {
            source_buffer(L, it->ni);
            continue;
        }
        if (it->kind == IT_RECV && it->into >= 0) {
            int sb = L->buf[lw_key(L, it->into, -1, 0)];
            if (sb < 0 || L->root_last[ptc_prog_root(L->pg, sb)] > pos) {
                lw_fail(L, "internal error: stage %d receives the update of %%%d while it still "
                           "reads the old value",
                        s, it->into);
                return;
            }
        }
        lw_emit_item(L, it);
    }
    if (L->failed)
        return;
    L->pos = L->nitems;
    apply_updates(L);
    finish(L);
}

/* ---- the eval entry ---- */

/* The instructions the loss depends on, across programs: a receive the loss needs makes its
 * send needed on the sending stage. Each program is walked backward from its end, so a buffer is
 * needed only where a later needed instruction reads it (an update received into a parameter at
 * the end of the step is not part of evaluating the loss that read the parameter before); the
 * walks repeat, with the sends other programs' walks found, until no new send is needed. */
static void find_eval(ptc_plan *p, int **src_of)
{
    int np = p->nprograms, ntags = 0;
    bool **run = ptc_xcalloc((size_t)np, sizeof(bool *)), **forced = ptc_xcalloc((size_t)np,
                                                                                sizeof(bool *));
    for (int k = 0; k < np; k++) {
        ptc_program *pg = &p->programs[k];
        run[k] = ptc_xcalloc((size_t)(pg->ninstrs ? pg->ninstrs : 1), 1);
        forced[k] = ptc_xcalloc((size_t)(pg->ninstrs ? pg->ninstrs : 1), 1);
        for (int i = 0; i < pg->ninstrs; i++)
            if (pg->instrs[i].kind == PTC_INSTR_SEND && pg->instrs[i].tag >= ntags)
                ntags = pg->instrs[i].tag + 1;
    }
    int *send_at = ptc_xmalloc(sizeof(int) * 2 * (size_t)(ntags + 1));
    for (int t = 0; t < 2 * ntags; t++)
        send_at[t] = -1;
    for (int k = 0; k < np; k++)
        for (int i = 0; i < p->programs[k].ninstrs; i++)
            if (p->programs[k].instrs[i].kind == PTC_INSTR_SEND) {
                send_at[2 * p->programs[k].instrs[i].tag] = k;
                send_at[2 * p->programs[k].instrs[i].tag + 1] = i;
            }
    for (bool changed = true; changed;) {
        changed = false;
        for (int k = 0; k < np; k++) {
            ptc_program *pg = &p->programs[k];
            bool *need = ptc_xcalloc((size_t)(pg->nbufs ? pg->nbufs : 1), 1);
            for (int b = pg->loss; b >= 0 && !need[b]; b = src_of[k][b])
                need[b] = true;
            for (int i = pg->ninstrs - 1; i >= 0; i--) {
                const ptc_instr *in = &pg->instrs[i];
                bool r = forced[k][i];
                for (int o = 0; o < in->nout && !r; o++)
                    r = need[in->out[o]];
                run[k][i] = r;
                if (!r)
                    continue;
                for (int o = 0; o < in->nin; o++)
                    for (int b = in->in[o]; b >= 0 && !need[b]; b = src_of[k][b])
                        need[b] = true;
                if (in->kind == PTC_INSTR_RECV && in->tag < ntags && send_at[2 * in->tag] >= 0) {
                    int sk = send_at[2 * in->tag], si = send_at[2 * in->tag + 1];
                    if (!forced[sk][si])
                        forced[sk][si] = changed = true;
                }
            }
            free(need);
        }
    }
    for (int k = 0; k < np; k++) {
        ptc_program *pg = &p->programs[k];
        int n = 0;
        for (int i = 0; i < pg->ninstrs; i++)
            n += run[k][i];
        pg->eval = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)(n ? n : 1));
        pg->neval = 0;
        if (pg->loss >= 0)
            for (int i = 0; i < pg->ninstrs; i++)
                if (run[k][i])
                    pg->eval[pg->neval++] = i;
        free(run[k]);
        free(forced[k]);
    }
    free(run);
    free(forced);
    free(send_at);
}

/* ---- the whole ---- */

static int mesh_axis_named(const ptc_mesh *m, const char *name)
{
    for (int a = 0; a < m->naxes; a++)
        if (strcmp(m->names[a], name) == 0)
            return a;
    return -1;
}

static void free_build(build *B, int P, int S)
{
    for (int s = 0; s < P; s++)
        free(B->stage[s].it);
    free(B->stage);
    free(B->produced);
    free(B->uses);
    free(B->msgs);
    for (int t = 0; B->task_nodes && t < S * 3; t++)
        free(B->task_nodes[t]);
    free(B->task_nodes);
    free(B->ntask_nodes);
}

ptc_plan *ptc_lower(const ptc_graph *g, const ptc_lower_opts *o, char *err, size_t errn)
{
    ptc_plan *p = ptc_plan_new();
    p->model = ptc_arena_strdup(p->arena, g->name ? g->name : "");
    p->optim = g->optim;
    /* the plan's mesh: the compile mesh (with pp), or the graph's without mb */
    if (o->mesh.naxes) {
        p->mesh = o->mesh;
    } else {
        for (int a = 0; a < g->mesh.naxes; a++)
            if (strcmp(g->mesh.names[a], "mb") != 0) {
                memcpy(p->mesh.names[p->mesh.naxes], g->mesh.names[a], PTC_MAX_AXIS_NAME);
                p->mesh.sizes[p->mesh.naxes++] = g->mesh.sizes[a];
            }
    }
    p->nranks = p->mesh.naxes ? ptc_mesh_nranks(&p->mesh) : 1;
    p->zero = o->zero;
    p->seq_parallel = o->seq_parallel;
    p->logical_params = o->logical_params;
    p->model_flops = o->model_flops;
    p->notes = ptc_arena_strdup(p->arena, o->notes ? o->notes : "");
    p->rank_program = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)p->nranks);

    lw L = {.g = g, .o = o, .p = p, .err = err, .errn = errn};
    L.mb_axis = mesh_axis_named(&g->mesh, "mb");
    L.M = L.mb_axis >= 0 ? g->mesh.sizes[L.mb_axis] : 1;
    int ppa = mesh_axis_named(&p->mesh, "pp");
    L.P = ppa >= 0 ? p->mesh.sizes[ppa] : 1;
    L.V = o->pp_schedule == PTC_PP_INTERLEAVED && o->virtual_stages > 1 ? o->virtual_stages : 1;
    L.tasks = L.M > 1 || L.P > 1;
    p->microbatches = L.M;
    p->pp_schedule = L.P > 1 || L.M > 1 ? o->pp_schedule : PTC_PP_1F1B;
    p->virtual_stages = L.V;
    for (int a = 0; a < g->mesh.naxes; a++)
        L.axis_map[a] = mesh_axis_named(&p->mesh, g->mesh.names[a]);

    size_t nv = (size_t)(g->nvalues ? g->nvalues : 1), nn = (size_t)(g->nnodes ? g->nnodes : 1);
    L.fold = ptc_xmalloc(sizeof(int) * nv);
    L.undo = ptc_xmalloc(sizeof(int) * nv);
    L.tout = ptc_xmalloc(sizeof(int) * nn);
    L.nlast = ptc_xmalloc(sizeof(int) * nv);
    L.updates = ptc_xmalloc(sizeof(int) * nv);
    L.acc = ptc_xmalloc(sizeof(int) * nv);
    L.val_mb = ptc_xcalloc(nv, sizeof(bool));
    L.gemm = ptc_xcalloc(nn, sizeof(bool));
    L.mbsum = ptc_xcalloc(nn, sizeof(bool));
    L.cls = ptc_xcalloc(nn, 1);
    L.phase = ptc_xcalloc(nn, 1);
    for (size_t v = 0; v < nv; v++)
        L.updates[v] = -1;
    for (int i = 0; i < g->nupdates; i++)
        L.updates[g->updates[i].to] = g->updates[i].state;
    size_t nk = lw_nkeys(&L) + 1;
    L.buf = ptc_xmalloc(sizeof(int) * nk);
    L.last_use = ptc_xmalloc(sizeof(int) * nk);

    find_node_last_uses(&L);
    find_phases(&L);
    find_gemms(&L);
    ptc_pp_plan pp = {0};
    char msg[1024];
    bool have_pp = false;
    if (find_classes(&L) == 0 && L.tasks) {
        if (ptc_pp_plan_build(&pp, (ptc_pp_schedule)p->pp_schedule, L.P, L.M, L.V, msg,
                              sizeof msg) < 0)
            lw_fail(&L, "error: %s", msg);
        else
            have_pp = true;
    }

    /* the items of every stage, then the messages between them */
    build B = {.L = &L, .nkeys = lw_nkeys(&L)};
    B.stage = ptc_xcalloc((size_t)L.P, sizeof(list));
    B.produced = ptc_xmalloc(sizeof(int) * B.nkeys * (size_t)L.P + sizeof(int));
    for (size_t i = 0; i < B.nkeys * (size_t)L.P; i++)
        B.produced[i] = -1;
    B.uses = ptc_xcalloc(nv * (size_t)L.P, sizeof(bool));
    if (!L.failed && L.tasks)
        find_task_nodes(&B, ptc_pp_splits_backward((ptc_pp_schedule)p->pp_schedule));
    for (int s = 0; s < L.P && !L.failed; s++)
        build_stage(&B, s, &pp);
    if (!L.failed && L.P > 1) {
        broadcast_at_end(&B, g->loss);
        if (g->noutputs > 0 && g->nupdates > 0)
            broadcast_at_end(&B, g->outputs[0]);
        share_updates(&B);
        place_messages(&B);
    }

    /* one program per stage */
    int **src_of = ptc_xcalloc((size_t)L.P, sizeof(int *));
    for (int s = 0; s < L.P && !L.failed; s++) {
        ptc_program *pg = L.pg = ptc_plan_add_program(p);
        pg->stage = s;
        pg->ranks = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)p->nranks);
        for (int r = 0; r < p->nranks; r++) {
            int c[PTC_MAX_MESH_AXES] = {0};
            if (p->mesh.naxes)
                ptc_mesh_coords(&p->mesh, r, c);
            if (ppa < 0 || c[ppa] == s) {
                pg->ranks[pg->nranks++] = r;
                p->rank_program[r] = s;
            }
        }
        L.capbuf = 0;
        L.root_last = NULL;
        L.src_of = NULL;
        emit_stage(&L, &B, s);
        free(L.root_last);
        src_of[s] = L.src_of;
        L.src_of = NULL;
    }
    if (!L.failed)
        find_eval(p, src_of);
    for (int s = 0; s < L.P; s++)
        free(src_of[s]);
    free(src_of);
    free_build(&B, L.P, L.P * L.V);
    if (have_pp)
        ptc_pp_plan_free(&pp);
    free(L.buf);
    free(L.last_use);
    free(L.fold);
    free(L.undo);
    free(L.tout);
    free(L.nlast);
    free(L.updates);
    free(L.acc);
    free(L.val_mb);
    free(L.gemm);
    free(L.mbsum);
    free(L.cls);
    free(L.phase);
    if (L.failed) {
        ptc_plan_free(p);
        return NULL;
    }
    if (o->fuse)
        ptc_plan_fuse(p, o->head_chunks);
    ptc_plan_memory(p);
    if (ptc_plan_verify(p, msg, sizeof msg) < 0) {
        ptc_fmt(err, errn, "internal error: the lowered plan does not verify: %s", msg);
        ptc_plan_free(p);
        return NULL;
    }
    return p;
}
