/* lower.c - a step graph to an execution plan (see planner.h for what each node becomes).
 *
 * Assumes: g is verified; every rank runs the same program (SPMD or a single device).
 * Guarantees: the plan verifies (ptc_plan_verify); running its step entry computes what running
 * the graph's nodes in order computes, with the graph's state updates applied at the end.
 */
#include "planner.h"

#include <stdlib.h>
#include <string.h>

typedef struct lw {
    const ptc_graph *g;
    const ptc_lower_opts *o;
    ptc_plan *p;
    ptc_program *pg;
    int *buf;       /* value -> buffer id; -1 for a transpose folded into its GEMMs */
    int *fold;      /* value -> the value a folded transpose reads, or -1 */
    int *undo;      /* value -> w when the value is transpose(transpose(w)) (a view of w), or -1 */
    int *tout;      /* matmul node -> the transpose of its result it writes directly, or -1 */
    int *updates;   /* value -> the state it becomes at the end of the step (its `update`), or -1 */
    int *last_use;  /* value -> last node reading it (nnodes: live at exit) */
    int *root_last; /* buffer -> last node reading any value whose bytes it holds */
    int *src_of;    /* buffer -> the buffer a reshape view was made from (-1) */
    bool *gemm;     /* node -> a matmul lowered to a GEMM */
    uint8_t *phase; /* node -> forward, backward or update */
    const char *last_file, *last_file_copy, *last_scope, *last_scope_copy;
    char *err;
    size_t errn;
} lw;

static bool is_16bit(ptc_dtype t)
{
    return t == PTC_BF16 || t == PTC_F16;
}

/* ---- buffers ---- */

static int new_buffer(lw *L, const ptc_type *t, const ptc_placement *place, int kind)
{
    ptc_buffer b;
    memset(&b, 0, sizeof b);
    b.type = *t;
    if (place)
        memcpy(b.place, place, sizeof b.place);
    b.kind = (uint8_t)kind;
    b.view_axis = -1;
    b.region = kind == PTC_BUF_PARAM   ? PTC_REGION_PARAM
               : kind == PTC_BUF_STATE ? PTC_REGION_OPTIM
                                       : PTC_REGION_ACT;
    b.view = -1;
    b.bytes = ptc_type_numel(t) * ptc_dtype_size(t->dtype);
    int id = ptc_prog_add_buffer(L->p, L->pg, &b);
    L->root_last = ptc_xrealloc(L->root_last, sizeof(int) * (size_t)L->pg->capbufs);
    L->src_of = ptc_xrealloc(L->src_of, sizeof(int) * (size_t)L->pg->capbufs);
    L->root_last[id] = -1;
    L->src_of[id] = -1;
    return id;
}

/* A buffer for value v (its type and placement). */
static int value_buffer(lw *L, int v, int kind)
{
    const ptc_value *val = &L->g->values[v];
    int b = new_buffer(L, &val->type, val->place, kind);
    L->buf[v] = b;
    L->root_last[b] = L->last_use[v];
    return b;
}

/* Value v as a view of buffer of (bytes shared). */
static int view_of(lw *L, int v, int of)
{
    const ptc_value *val = &L->g->values[v];
    int root = ptc_prog_root(L->pg, of);
    int b = new_buffer(L, &val->type, val->place, PTC_BUF_TEMP);
    L->pg->bufs[b].view = root;
    L->pg->bufs[b].region = L->pg->bufs[root].region;
    /* a view of a rank's shard of its root is at the same place in the root */
    L->pg->bufs[b].view_axis = L->pg->bufs[of].view_axis;
    L->pg->bufs[b].view_step = L->pg->bufs[of].view_step;
    L->buf[v] = b;
    if (L->last_use[v] > L->root_last[root])
        L->root_last[root] = L->last_use[v];
    return b;
}

/* ---- instructions ---- */

static const char *intern(lw *L, const char *s, bool file)
{
    const char **last = file ? &L->last_file : &L->last_scope;
    const char **copy = file ? &L->last_file_copy : &L->last_scope_copy;
    if (!s)
        return NULL;
    if (s != *last) { /* consecutive nodes mostly share their strings */
        *last = s;
        *copy = ptc_arena_strdup(L->p->arena, s);
    }
    return *copy;
}

static int emit(lw *L, int ni, ptc_instr *in)
{
    const ptc_node *n = &L->g->nodes[ni];
    in->phase = L->phase[ni];
    in->loc = n->loc;
    in->loc.file = intern(L, n->loc.file, true);
    in->loc.scope = intern(L, n->loc.scope, false);
    return ptc_prog_add_instr(L->p, L->pg, in);
}

static void emit_cast(lw *L, int ni, int from, int to)
{
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.kind = PTC_INSTR_KERNEL;
    in.op = PTC_OP_CAST;
    in.attrs = ptc_attrs_default(PTC_OP_CAST);
    in.attrs.dtype = L->pg->bufs[to].type.dtype;
    in.nin = in.nout = 1;
    in.in = &from;
    in.out = &to;
    emit(L, ni, &in);
}

/* An f32 copy of a 16-bit buffer, for a kernel that computes in f32. */
static int widened(lw *L, int ni, int b)
{
    ptc_type t = L->pg->bufs[b].type;
    t.dtype = PTC_F32;
    int w = new_buffer(L, &t, L->pg->bufs[b].place, PTC_BUF_TEMP);
    emit_cast(L, ni, b, w);
    return w;
}

/* Which operand result k of node n may overwrite, or -1: elementwise results over an operand of
 * the same type, activation gradients, and optimizer updates over their state. */
static int inplace_operand(const ptc_graph *g, const ptc_node *n, int k, int cand)
{
    switch (n->op) {
    case PTC_OP_ADAMW_UPDATE: return k == 0 ? 0 : k + 1; /* p' -> p, m' -> m, v' -> v */
    case PTC_OP_SGD_UPDATE: return k == 0 ? 0 : 2;       /* p' -> p, buf' -> buf */
    case PTC_OP_RELU_GRAD:
    case PTC_OP_GELU_GRAD:
    case PTC_OP_SILU_GRAD:
    case PTC_OP_ALLREDUCE: break;
    default:
        if (!(ptc_ops[n->op].flags & (PTC_F_UNARY | PTC_F_BINARY)))
            return -1;
    }
    const ptc_type *o = &g->values[n->out[k]].type, *x = &g->values[n->in[cand]].type;
    return ptc_type_eq(o, x) ? cand : -1;
}

/* A result that becomes a parameter or state at the end of the step is written straight into it
 * when nothing reads the old value any more (the ZeRO gather of an updated parameter): no copy at
 * the end, no second buffer. */
static int update_target(lw *L, int ni, int v)
{
    int st = L->updates[v];
    if (st < 0 || L->buf[st] < 0)
        return -1;
    int root = ptc_prog_root(L->pg, L->buf[st]);
    const ptc_buffer *rb = &L->pg->bufs[root];
    const ptc_type *t = &L->g->values[v].type;
    if (L->root_last[root] >= ni || L->pg->bufs[L->buf[st]].view_axis >= 0 ||
        rb->bytes != ptc_type_numel(t) * ptc_dtype_size(t->dtype) || rb->type.dtype != t->dtype)
        return -1;
    return view_of(L, v, root);
}

/* Result k of node ni may take the bytes of an operand that nothing reads afterwards. */
static int try_inplace(lw *L, int ni, int k, const int *ins)
{
    const ptc_node *n = &L->g->nodes[ni];
    if (L->last_use[n->out[k]] < 0)
        return -1;
    for (int c = 0; c < n->nin; c++) {
        int x = inplace_operand(L->g, n, k, c);
        if (x != c || L->fold[n->in[x]] >= 0)
            continue;
        int root = ptc_prog_root(L->pg, ins[x]);
        const ptc_buffer *rb = &L->pg->bufs[root];
        if (rb->kind == PTC_BUF_INPUT || rb->type.dtype != L->g->values[n->out[k]].type.dtype ||
            L->root_last[root] != ni)
            continue;
        /* claimed: the operand's bytes now hold this result */
        return view_of(L, n->out[k], ins[x]); /* (at the operand's place: a shard view's too) */
    }
    return -1;
}

static void emit_kernel(lw *L, int ni)
{
    const ptc_node *n = &L->g->nodes[ni];
    int ins[PTC_MAX_RESULTS * 2], outs[PTC_MAX_RESULTS], wide[PTC_MAX_RESULTS];
    bool convert = false;
    for (int k = 0; k < n->nin; k++)
        convert |= is_16bit(L->g->values[n->in[k]].type.dtype);
    for (int k = 0; k < n->nout; k++)
        convert |= is_16bit(L->g->values[n->out[k]].type.dtype);
    if (n->op == PTC_OP_CAST)
        convert = false; /* a cast reads and writes 16-bit storage itself */
    for (int k = 0; k < n->nin; k++) {
        ins[k] = L->buf[n->in[k]];
        if (convert && is_16bit(L->pg->bufs[ins[k]].type.dtype))
            ins[k] = widened(L, ni, ins[k]);
    }
    for (int k = 0; k < n->nout; k++) {
        outs[k] = convert ? -1 : try_inplace(L, ni, k, ins);
        if (outs[k] < 0)
            outs[k] = update_target(L, ni, n->out[k]);
        if (outs[k] < 0)
            outs[k] = value_buffer(L, n->out[k], PTC_BUF_TEMP);
        wide[k] = outs[k];
        if (convert && is_16bit(L->pg->bufs[outs[k]].type.dtype)) {
            ptc_type t = L->pg->bufs[outs[k]].type;
            t.dtype = PTC_F32;
            wide[k] = new_buffer(L, &t, L->pg->bufs[outs[k]].place, PTC_BUF_TEMP);
        }
    }
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.kind = PTC_INSTR_KERNEL;
    in.op = n->op;
    in.attrs = n->attrs;
    in.attrs.name = NULL;
    in.nin = n->nin;
    in.nout = n->nout;
    in.in = ins;
    in.out = wide;
    emit(L, ni, &in);
    for (int k = 0; k < n->nout; k++)
        if (wide[k] != outs[k])
            emit_cast(L, ni, wide[k], outs[k]);
}

/* outer/chunk of a tensor of type t split on dim d into `parts` blocks, with `groups` strided
 * groups: the dim is viewed as [groups, size/groups] and each group is split. */
static void split_layout(const ptc_type *t, int d, int groups, int parts, int64_t *outer,
                         int64_t *chunk)
{
    int64_t o = groups, inner = 1;
    for (int i = 0; i < d; i++)
        o *= t->dims[i];
    for (int i = d + 1; i < t->rank; i++)
        inner *= t->dims[i];
    *outer = o;
    *chunk = t->dims[d] / groups / parts * inner;
}

/* An allgather whose input is this rank's shard view of a buffer of the output's size, which
 * nothing reads afterwards, gathers into that buffer (ZeRO-1/2 gather each updated parameter
 * into the parameter itself: no second copy, and no copy at the end of the step). */
static int gather_in_place(lw *L, int ni, int x)
{
    const ptc_node *n = &L->g->nodes[ni];
    const ptc_buffer *xb = &L->pg->bufs[x];
    if (xb->view < 0 || xb->view_axis != n->attrs.mesh_axis || xb->view_step != xb->bytes ||
        n->attrs.n > 1)
        return -1;
    int root = xb->view;
    const ptc_buffer *rb = &L->pg->bufs[root];
    const ptc_value *out = &L->g->values[n->out[0]];
    int64_t outer = 1;
    for (int i = 0; i < n->attrs.axis; i++)
        outer *= out->type.dims[i];
    if (outer != 1 || rb->kind == PTC_BUF_INPUT || rb->type.dtype != out->type.dtype ||
        rb->bytes != ptc_type_numel(&out->type) * ptc_dtype_size(out->type.dtype) ||
        L->root_last[root] != ni)
        return -1;
    return view_of(L, n->out[0], root);
}

static void emit_collective(lw *L, int ni)
{
    const ptc_node *n = &L->g->nodes[ni];
    const ptc_attrs *a = &n->attrs;
    /* communicators move and reduce every dtype (16-bit sums in float, rounded once); an
     * allreduce sums in place over an operand nothing reads afterwards (a gradient: the
     * unreduced copy would otherwise sit among the activations beside the reduced one) */
    int x = L->buf[n->in[0]], y = -1;
    if (n->op == PTC_OP_ALLREDUCE)
        y = try_inplace(L, ni, 0, &x);
    else if (n->op == PTC_OP_ALLGATHER)
        y = gather_in_place(L, ni, x);
    if (y < 0)
        y = update_target(L, ni, n->out[0]);
    if (y < 0)
        y = value_buffer(L, n->out[0], PTC_BUF_TEMP);
    const ptc_type *it = &L->pg->bufs[x].type, *ot = &L->pg->bufs[y].type;
    int parts = L->g->mesh.sizes[a->mesh_axis];
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.kind = PTC_INSTR_COLL;
    in.op = n->op;
    in.coll.axes = 1u << a->mesh_axis;
    in.coll.reduce = (uint8_t)a->reduce;
    switch (n->op) {
    case PTC_OP_ALLREDUCE:
        in.coll.kind = PTC_COLL_ALLREDUCE;
        in.coll.count = ptc_type_numel(it);
        break;
    case PTC_OP_ALLGATHER:
        in.coll.kind = PTC_COLL_ALLGATHER;
        split_layout(ot, (int)a->axis, (int)a->n, parts, &in.coll.outer, &in.coll.chunk);
        break;
    case PTC_OP_REDUCE_SCATTER:
        in.coll.kind = PTC_COLL_REDUCE_SCATTER;
        split_layout(it, (int)a->axis, (int)a->n, parts, &in.coll.outer, &in.coll.chunk);
        break;
    default: /* all_to_all */
        in.coll.kind = PTC_COLL_ALL_TO_ALL;
        split_layout(it, a->to, 1, parts, &in.coll.outer, &in.coll.chunk);
        split_layout(ot, (int)a->axis, 1, parts, &in.coll.outer2, &in.coll.chunk2);
    }
    in.nin = in.nout = 1;
    in.in = &x;
    in.out = &y;
    emit(L, ni, &in);
}

static int64_t batch_of(const ptc_type *t)
{
    int64_t b = 1;
    for (int i = 0; i + 2 < t->rank; i++)
        b *= t->dims[i];
    return b;
}

/* A matmul becomes one GEMM when its operands are f32 and each is either batched like the result
 * or one matrix for every batch. */
static bool gemmable(const ptc_graph *g, const ptc_node *n)
{
    const ptc_type *a = &g->values[n->in[0]].type, *b = &g->values[n->in[1]].type,
                   *o = &g->values[n->out[0]].type;
    if (a->dtype != PTC_F32 || b->dtype != PTC_F32 || o->dtype != PTC_F32)
        return false;
    int64_t ob = batch_of(o), ab = batch_of(a), bb = batch_of(b);
    return (ab == 1 || ab == ob) && (bb == 1 || bb == ob);
}

static void emit_gemm(lw *L, int ni)
{
    const ptc_node *n = &L->g->nodes[ni];
    const ptc_type *A = &L->g->values[n->in[0]].type, *B = &L->g->values[n->in[1]].type,
                   *O = &L->g->values[n->out[0]].type;
    int va = n->in[0], vb = n->in[1];
    ptc_gemm gm;
    memset(&gm, 0, sizeof gm);
    gm.ta = L->fold[va] >= 0;
    gm.tb = L->fold[vb] >= 0;
    int x[2] = {L->buf[gm.ta ? L->fold[va] : va], L->buf[gm.tb ? L->fold[vb] : vb]};
    int64_t m = A->dims[A->rank - 2], k = A->dims[A->rank - 1], nn = B->dims[B->rank - 1];
    int64_t ob = batch_of(O), ab = batch_of(A), bb = batch_of(B);
    gm.m = m;
    gm.n = nn;
    gm.k = k;
    gm.lda = gm.ta ? m : k;
    gm.ldb = gm.tb ? k : nn;
    gm.ldc = nn;
    gm.alpha = 1.0;
    if (bb == 1 && ab == ob && !gm.ta) { /* one right matrix: A's batches are more rows */
        gm.m = m * ab;
        gm.batch = 1;
    } else {
        gm.batch = ob;
        gm.sa = ab == 1 ? 0 : m * k;
        gm.sb = bb == 1 ? 0 : k * nn;
        gm.sc = m * nn;
    }
    int y;
    if (L->tout[ni] >= 0) { /* C^T = op(B)^T op(A)^T: write the transpose of the result */
        int t = x[0];
        x[0] = x[1];
        x[1] = t;
        bool ta = gm.ta;
        gm.ta = !gm.tb;
        gm.tb = !ta;
        gm.m = nn;
        gm.n = m;
        gm.lda = gm.ta ? gm.m : gm.k;
        gm.ldb = gm.tb ? gm.k : gm.n;
        gm.ldc = gm.n;
        y = value_buffer(L, L->tout[ni], PTC_BUF_TEMP);
    } else {
        y = value_buffer(L, n->out[0], PTC_BUF_TEMP);
    }
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.kind = PTC_INSTR_GEMM;
    in.op = PTC_OP_MATMUL;
    in.gemm = gm;
    in.nin = 2;
    in.nout = 1;
    in.in = x;
    in.out = &y;
    emit(L, ni, &in);
}

static void emit_copy(lw *L, int ni, int from, int to)
{
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.kind = PTC_INSTR_COPY;
    in.op = PTC_OP_RESHAPE;
    in.bytes = L->pg->bufs[to].bytes;
    in.nin = in.nout = 1;
    in.in = &from;
    in.out = &to;
    emit(L, ni, &in);
}

/* ---- analysis before emission ---- */

static void find_last_uses(lw *L)
{
    const ptc_graph *g = L->g;
    for (int v = 0; v < g->nvalues; v++)
        L->last_use[v] = -1;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            L->last_use[g->nodes[i].in[k]] = i;
    int end = g->nnodes;
    if (g->loss >= 0)
        L->last_use[g->loss] = end;
    for (int i = 0; i < g->noutputs; i++)
        if (i == 0 || L->o->keep_grad_outputs)
            L->last_use[g->outputs[i]] = end;
    for (int i = 0; i < g->nupdates; i++)
        L->last_use[g->updates[i].to] = end;
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
        if (!L->gemm[m] || readers[v] != 1 || L->last_use[v] != i ||
            g->values[v].type.rank != 2 || batch_of(&g->values[g->nodes[m].in[0]].type) != 1 ||
            batch_of(&g->values[g->nodes[m].in[1]].type) != 1)
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
        ok[v] = d->op == PTC_OP_TRANSPOSE && g->values[v].type.dtype == PTC_F32 &&
                L->last_use[v] >= 0 && L->last_use[v] < g->nnodes;
    }
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (!L->gemm[i] && !(g->nodes[i].nout == 1 && L->undo[g->nodes[i].out[0]] >= 0))
                ok[g->nodes[i].in[k]] = false;
    for (int v = 0; v < g->nvalues; v++) {
        const ptc_node *d = &g->nodes[g->values[v].def];
        L->fold[v] = ok[v] && !ok[d->in[0]] ? d->in[0] : -1;
        /* the GEMMs read the transpose's operand: it lives until they have run */
        if (L->fold[v] >= 0 && L->last_use[v] > L->last_use[L->fold[v]])
            L->last_use[L->fold[v]] = L->last_use[v];
    }
    for (int v = 0; v < g->nvalues; v++) /* likewise the original of a double transpose */
        if (L->undo[v] >= 0 && L->last_use[v] > L->last_use[L->undo[v]])
            L->last_use[L->undo[v]] = L->last_use[v];
    find_transposed_results(L);
    free(ok);
}

/* ---- after emission ---- */

/* The reduced gradient a state update consumes: back from its operand through clipping and
 * shard slices to the data-parallel reduction (or the gradient itself). It lives in the gradient
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
            if (d->op == PTC_OP_SHARD_SLICE ||
                (d->op == PTC_OP_MUL && g->values[d->in[1]].type.rank == 0))
                v = d->in[0];
            else
                break;
        }
        if (L->buf[v] < 0)
            continue;
        ptc_buffer *r = &L->pg->bufs[ptc_prog_root(L->pg, L->buf[v])];
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
        int b = L->buf[v];
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

static int input_role_by_name(const char *name)
{
    return strcmp(name, PTC_IN_LR) == 0         ? PTC_ROLE_LR
           : strcmp(name, PTC_IN_STEP) == 0     ? PTC_ROLE_STEP
           : strcmp(name, PTC_IN_MAX_NORM) == 0 ? PTC_ROLE_MAX_NORM
                                                : PTC_ROLE_DATA;
}

/* The instructions the loss depends on: the eval entry. */
static void find_eval(lw *L)
{
    ptc_program *pg = L->pg;
    if (pg->loss < 0)
        return;
    bool *need = ptc_xcalloc((size_t)(pg->nbufs ? pg->nbufs : 1), sizeof(bool));
    bool *run = ptc_xcalloc((size_t)(pg->ninstrs ? pg->ninstrs : 1), sizeof(bool));
    for (int b = pg->loss; b >= 0; b = L->src_of[b])
        need[b] = true;
    int n = 0;
    for (int i = pg->ninstrs - 1; i >= 0; i--) {
        const ptc_instr *in = &pg->instrs[i];
        for (int k = 0; k < in->nout && !run[i]; k++)
            run[i] = need[in->out[k]];
        if (!run[i])
            continue;
        n++;
        for (int k = 0; k < in->nin; k++)
            for (int b = in->in[k]; b >= 0 && !need[b]; b = L->src_of[b])
                need[b] = true;
    }
    pg->eval = ptc_arena_alloc(L->p->arena, sizeof(int) * (size_t)(n ? n : 1));
    pg->neval = 0;
    for (int i = 0; i < pg->ninstrs; i++)
        if (run[i])
            pg->eval[pg->neval++] = i;
    free(need);
    free(run);
}

/* A rank's part of a tensor split along its first dimension that is larger than 1 (no groups, no
 * remainder) is a contiguous run of it: a view at coordinate x part bytes, no copy. ZeRO-1's
 * shard of an allreduced gradient is one. */
static bool shard_view(lw *L, int ni)
{
    const ptc_node *n = &L->g->nodes[ni];
    const ptc_type *it = &L->g->values[n->in[0]].type, *ot = &L->g->values[n->out[0]].type;
    int d = (int)n->attrs.axis, T = L->g->mesh.sizes[n->attrs.mesh_axis];
    int64_t outer = 1;
    for (int i = 0; i < d; i++)
        outer *= it->dims[i];
    int src = L->buf[n->in[0]];
    /* (a shard of a shard would be two steps from its root: it is copied) */
    if (outer != 1 || n->attrs.n > 1 || src < 0 || ptc_type_numel(ot) * T != ptc_type_numel(it) ||
        L->pg->bufs[src].view_axis >= 0)
        return false;
    int b = view_of(L, n->out[0], src);
    ptc_buffer *bf = &L->pg->bufs[b];
    bf->view_axis = n->attrs.mesh_axis;
    bf->view_step = bf->bytes;
    L->src_of[b] = src;
    return true;
}

/* ---- the walk ---- */

static void lower_node(lw *L, int ni)
{
    const ptc_node *n = &L->g->nodes[ni];
    int v = n->out[0], b;
    switch (n->op) {
    case PTC_OP_INPUT:
        b = value_buffer(L, v, PTC_BUF_INPUT);
        L->pg->bufs[b].name = ptc_arena_strdup(L->p->arena, n->attrs.name);
        L->pg->bufs[b].role = (uint8_t)input_role_by_name(n->attrs.name);
        return;
    case PTC_OP_PARAM:
    case PTC_OP_STATE:
        b = value_buffer(L, v, n->op == PTC_OP_PARAM ? PTC_BUF_PARAM : PTC_BUF_STATE);
        L->pg->bufs[b].name = ptc_arena_strdup(L->p->arena, n->attrs.name);
        L->pg->bufs[b].init = n->attrs.init;
        return;
    case PTC_OP_RESHAPE:
        if (L->fold[n->in[0]] < 0) {
            b = view_of(L, v, L->buf[n->in[0]]);
            L->src_of[b] = L->buf[n->in[0]];
            return;
        }
        break;
    case PTC_OP_SHARD_SLICE:
        if (shard_view(L, ni))
            return;
        break;
    case PTC_OP_TRANSPOSE:
        if (L->tout[ni] == -2) /* written by the GEMM before it */
            return;
        if (L->undo[v] >= 0 && L->buf[L->undo[v]] >= 0) {
            b = view_of(L, v, L->buf[L->undo[v]]);
            L->src_of[b] = L->buf[L->undo[v]];
            return;
        }
        if (L->fold[v] >= 0) {
            L->buf[v] = -1;
            return;
        }
        break;
    case PTC_OP_MATMUL:
        if (L->gemm[ni]) {
            emit_gemm(L, ni);
            return;
        }
        break;
    default:
        if (ptc_ops[n->op].flags & PTC_F_COMM) {
            emit_collective(L, ni);
            return;
        }
    }
    emit_kernel(L, ni);
}

static void apply_updates(lw *L)
{
    const ptc_graph *g = L->g;
    for (int i = 0; i < g->nupdates; i++) {
        int st = L->buf[g->updates[i].state], to = L->buf[g->updates[i].to];
        if (ptc_prog_root(L->pg, st) != ptc_prog_root(L->pg, to))
            emit_copy(L, g->values[g->updates[i].to].def, to, st);
    }
}

static void finish(lw *L)
{
    const ptc_graph *g = L->g;
    ptc_program *pg = L->pg;
    pg->loss = g->loss >= 0 ? L->buf[g->loss] : -1;
    pg->grad_norm = g->noutputs > 0 && g->nupdates > 0 ? L->buf[g->outputs[0]] : -1;
    int nout = L->o->keep_grad_outputs && g->noutputs > 1 ? g->noutputs - 1 : 0;
    pg->outputs = ptc_arena_alloc(L->p->arena, sizeof(int) * (size_t)(nout ? nout : 1));
    for (int i = 0; i < nout; i++)
        pg->outputs[pg->noutputs++] = L->buf[g->outputs[1 + i]];
    input_roles(L);
    mark_gradients(L);
    find_eval(L);
}

ptc_plan *ptc_lower(const ptc_graph *g, const ptc_lower_opts *o, char *err, size_t errn)
{
    ptc_plan *p = ptc_plan_new();
    p->model = ptc_arena_strdup(p->arena, g->name ? g->name : "");
    p->optim = g->optim;
    p->mesh = g->mesh;
    p->nranks = g->mesh.naxes ? ptc_mesh_nranks(&g->mesh) : 1;
    p->zero = o->zero;
    p->seq_parallel = o->seq_parallel;
    p->logical_params = o->logical_params;
    p->notes = ptc_arena_strdup(p->arena, o->notes ? o->notes : "");
    p->rank_program = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)p->nranks);
    ptc_program *pg = ptc_plan_add_program(p);
    pg->ranks = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)p->nranks);
    for (int r = 0; r < p->nranks; r++) {
        pg->ranks[pg->nranks++] = r;
        p->rank_program[r] = 0;
    }

    size_t nv = (size_t)(g->nvalues ? g->nvalues : 1), nn = (size_t)(g->nnodes ? g->nnodes : 1);
    lw L = {.g = g, .o = o, .p = p, .pg = pg, .err = err, .errn = errn};
    L.buf = ptc_xmalloc(sizeof(int) * nv);
    L.fold = ptc_xmalloc(sizeof(int) * nv);
    L.undo = ptc_xmalloc(sizeof(int) * nv);
    L.tout = ptc_xmalloc(sizeof(int) * nn);
    L.updates = ptc_xmalloc(sizeof(int) * nv);
    for (size_t v = 0; v < nv; v++)
        L.updates[v] = -1;
    for (int i = 0; i < g->nupdates; i++)
        L.updates[g->updates[i].to] = g->updates[i].state;
    L.last_use = ptc_xmalloc(sizeof(int) * nv);
    L.gemm = ptc_xcalloc(nn, sizeof(bool));
    L.phase = ptc_xcalloc(nn, 1);
    for (size_t v = 0; v < nv; v++)
        L.buf[v] = -1;
    find_last_uses(&L);
    find_phases(&L);
    find_gemms(&L);
    for (int i = 0; i < g->nnodes; i++)
        lower_node(&L, i);
    apply_updates(&L);
    finish(&L);
    ptc_plan_memory(p);
    free(L.buf);
    free(L.fold);
    free(L.undo);
    free(L.tout);
    free(L.updates);
    free(L.last_use);
    free(L.root_last);
    free(L.src_of);
    free(L.gemm);
    free(L.phase);
    char msg[1024];
    if (ptc_plan_verify(p, msg, sizeof msg) < 0) {
        ptc_fmt(err, errn, "internal error: the lowered plan does not verify: %s", msg);
        ptc_plan_free(p);
        return NULL;
    }
    return p;
}
