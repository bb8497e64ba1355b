/* lower_emit.c - the instructions of one item: a graph node run for one microbatch, or once (see
 * planner.h for what each node becomes and lower_internal.h for items and keys). */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "lower_internal.h"

void lw_fail(lw *L, const char *fmt, ...)
{
    if (L->failed)
        return;
    L->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err, L->errn, fmt, ap);
    va_end(ap);
}

static bool is_16bit(ptc_dtype t)
{
    return t == PTC_BF16 || t == PTC_F16;
}

/* ---- buffers ---- */

/* The placement of a graph value on the plan's axes (the microbatch axis is run in time). */
static void plan_place(const lw *L, const ptc_placement *gp, ptc_placement *out)
{
    memset(out, 0, sizeof(ptc_placement) * PTC_MAX_MESH_AXES);
    for (int a = 0; a < L->g->mesh.naxes; a++)
        if (L->axis_map[a] >= 0)
            out[L->axis_map[a]] = gp[a];
}

int lw_new_buffer(lw *L, const ptc_type *t, const ptc_placement *gplace, int kind)
{
    ptc_buffer b;
    memset(&b, 0, sizeof b);
    b.type = *t;
    if (gplace)
        plan_place(L, gplace, b.place);
    b.kind = (uint8_t)kind;
    b.view = b.view_axis = -1;
    b.region = kind == PTC_BUF_PARAM   ? PTC_REGION_PARAM
               : kind == PTC_BUF_STATE ? PTC_REGION_OPTIM
                                       : PTC_REGION_ACT;
    b.bytes = ptc_type_numel(t) * ptc_dtype_size(t->dtype);
    int id = ptc_prog_add_buffer(L->p, L->pg, &b);
    if (L->pg->capbufs > L->capbuf) {
        L->capbuf = L->pg->capbufs;
        L->root_last = ptc_xrealloc(L->root_last, sizeof(int) * (size_t)L->capbuf);
        L->src_of = ptc_xrealloc(L->src_of, sizeof(int) * (size_t)L->capbuf);
    }
    L->root_last[id] = -1;
    L->src_of[id] = -1;
    return id;
}

/* A buffer for value v under key k. */
int lw_key_buffer(lw *L, size_t k, int v, int kind)
{
    const ptc_value *val = &L->g->values[v];
    int b = lw_new_buffer(L, &val->type, val->place, kind);
    L->buf[k] = b;
    L->root_last[b] = L->last_use[k];
    return b;
}

/* Value v (key k) as a view of buffer `of`, at of's place in their root. */
static int view_of(lw *L, size_t k, int v, int of)
{
    const ptc_value *val = &L->g->values[v];
    int root = ptc_prog_root(L->pg, of);
    int b = lw_new_buffer(L, &val->type, val->place, PTC_BUF_TEMP);
    ptc_buffer *bf = &L->pg->bufs[b];
    bf->view = root;
    bf->region = L->pg->bufs[root].region;
    bf->view_axis = L->pg->bufs[of].view_axis;
    bf->view_step = L->pg->bufs[of].view_step;
    bf->view_offset = L->pg->bufs[of].view_offset;
    L->buf[k] = b;
    if (L->last_use[k] > L->root_last[root])
        L->root_last[root] = L->last_use[k];
    return b;
}

/* Microbatch `inst`'s slice of an input split over the microbatches: a view of the input's buffer
 * (it holds the rank's whole batch: one slice after the other). */
static int input_slice(lw *L, const item *it, int v)
{
    int all = L->buf[lw_key(L, v, -1, 0)];
    PTC_ASSERT(all >= 0 && it->inst >= 0);
    size_t k = lw_key(L, v, it->inst, 0);
    int b = view_of(L, k, v, all);
    L->pg->bufs[b].view_offset = (int64_t)it->inst * L->pg->bufs[b].bytes;
    L->src_of[b] = all;
    return b;
}

int lw_operand(lw *L, const item *it, int v)
{
    size_t k = lw_read_key(L, it, v);
    if (L->buf[k] >= 0)
        return L->buf[k];
    const ptc_node *d = &L->g->nodes[L->g->values[v].def];
    if (d->op == PTC_OP_INPUT && L->val_mb[v])
        return input_slice(L, it, v);
    lw_fail(L, "internal error: lowering reads %%%d (%s) before it has a buffer", v,
            ptc_ops[d->op].name);
    return L->buf[lw_key(L, v, -1, 0)] >= 0 ? L->buf[lw_key(L, v, -1, 0)] : 0;
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

static int emit(lw *L, const item *it, ptc_instr *in)
{
    int ni = it->kind == IT_NODE ? it->ni : L->g->values[it->v].def;
    const ptc_node *n = &L->g->nodes[ni];
    in->phase = it->ver ? PTC_PHASE_BACKWARD : L->phase[ni];
    in->work = it->work;
    in->mb = (int16_t)(it->inst >= 0 ? it->inst : it->label_mb >= 0 ? it->label_mb : 0);
    in->vstage = it->vstage;
    in->recompute = it->ver != 0;
    in->loc = n->loc;
    in->loc.file = intern(L, n->loc.file, true);
    in->loc.scope = intern(L, n->loc.scope, false);
    return ptc_prog_add_instr(L->p, L->pg, in);
}

static void emit_two(lw *L, const item *it, ptc_instr_kind kind, ptc_op op, int from, int with,
                     int to)
{
    ptc_instr in;
    memset(&in, 0, sizeof in);
    int ins[2] = {from, with};
    in.kind = (uint8_t)kind;
    in.op = op;
    in.attrs = ptc_attrs_default(op);
    in.nin = with >= 0 ? 2 : 1;
    in.nout = 1;
    in.in = ins;
    in.out = &to;
    if (kind == PTC_INSTR_COPY)
        in.bytes = L->pg->bufs[to].bytes;
    if (op == PTC_OP_CAST)
        in.attrs.dtype = L->pg->bufs[to].type.dtype;
    emit(L, it, &in);
}

/* An f32 copy of a 16-bit buffer, for a kernel that computes in f32. */
static int widened(lw *L, const item *it, int b)
{
    ptc_type t = L->pg->bufs[b].type;
    t.dtype = PTC_F32;
    int w = lw_new_buffer(L, &t, NULL, PTC_BUF_TEMP);
    memcpy(L->pg->bufs[w].place, L->pg->bufs[b].place, sizeof L->pg->bufs[w].place);
    emit_two(L, it, PTC_INSTR_KERNEL, PTC_OP_CAST, b, -1, w);
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
    /* the vocabulary-parallel cross-entropy's gradient over its logit shard: each element from
     * the logit at its place and per-row values (tensor parallel: the shard is the largest
     * activation of a language model, and its gradient another as large) */
    case PTC_OP_CE_GRAD_SHARD:
        if (cand != 0)
            return -1;
        break;
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
static int update_target(lw *L, const item *it, int v)
{
    int st = L->updates[v];
    if (st < 0 || L->val_mb[v] || it->ver)
        return -1;
    int sb = L->buf[lw_key(L, st, -1, 0)];
    if (sb < 0)
        return -1;
    int root = ptc_prog_root(L->pg, sb);
    const ptc_buffer *rb = &L->pg->bufs[root];
    const ptc_type *t = &L->g->values[v].type;
    if (L->root_last[root] >= L->pos || L->pg->bufs[sb].view_axis >= 0 ||
        rb->bytes != ptc_type_numel(t) * ptc_dtype_size(t->dtype) || rb->type.dtype != t->dtype)
        return -1;
    return view_of(L, lw_out_key(L, it, v), v, root);
}

/* Result k may take the bytes of an operand that nothing reads afterwards. */
static int try_inplace(lw *L, const item *it, int k, const int *ins)
{
    const ptc_node *n = &L->g->nodes[it->ni];
    size_t ok = lw_out_key(L, it, n->out[k]);
    if (L->last_use[ok] < 0 || L->acc[n->out[k]] >= 0)
        return -1;
    for (int c = 0; c < n->nin; c++) {
        int x = inplace_operand(L->g, n, k, c);
        if (x != c || L->fold[n->in[x]] >= 0)
            continue;
        int root = ptc_prog_root(L->pg, ins[x]);
        const ptc_buffer *rb = &L->pg->bufs[root];
        if (rb->kind == PTC_BUF_INPUT || rb->type.dtype != L->g->values[n->out[k]].type.dtype ||
            L->root_last[root] != L->pos)
            continue;
        /* claimed: the operand's bytes now hold this result (at the operand's place) */
        return view_of(L, ok, n->out[k], ins[x]);
    }
    return -1;
}

/* A per-microbatch gradient summed over the microbatches: the first microbatch writes straight
 * into the sum (GEMMs of the later ones add to it with beta = 1, see emit_gemm). */
static int accumulated(lw *L, const item *it, int v, bool *first)
{
    int y = L->acc[v];
    *first = false;
    if (y < 0)
        return -1;
    size_t yk = lw_key(L, y, -1, 0);
    if (L->buf[yk] < 0) {
        *first = true;
        int b = lw_key_buffer(L, yk, y, PTC_BUF_TEMP);
        L->buf[lw_out_key(L, it, v)] = b;
        return b;
    }
    return -1;
}

/* The result buffers of a kernel: in place, into its state, into a gradient sum, or new. */
static int result_buffer(lw *L, const item *it, int k, const int *ins)
{
    const ptc_node *n = &L->g->nodes[it->ni];
    bool first;
    int b = accumulated(L, it, n->out[k], &first);
    if (b < 0)
        b = try_inplace(L, it, k, ins);
    if (b < 0)
        b = update_target(L, it, n->out[k]);
    if (b < 0)
        b = lw_key_buffer(L, lw_out_key(L, it, n->out[k]), n->out[k], PTC_BUF_TEMP);
    return b;
}

static void emit_kernel(lw *L, const item *it)
{
    const ptc_node *n = &L->g->nodes[it->ni];
    int ins[PTC_MAX_RESULTS * 2], outs[PTC_MAX_RESULTS], wide[PTC_MAX_RESULTS];
    bool convert = false;
    for (int k = 0; k < n->nin; k++)
        convert |= is_16bit(L->g->values[n->in[k]].type.dtype);
    for (int k = 0; k < n->nout; k++)
        convert |= is_16bit(L->g->values[n->out[k]].type.dtype);
    if (n->op == PTC_OP_CAST)
        convert = false; /* a cast reads and writes 16-bit storage itself */
    bool fresh0 = false; /* operand 0 is an f32 copy made for this op alone */
    for (int k = 0; k < n->nin; k++) {
        ins[k] = lw_operand(L, it, n->in[k]);
        if (convert && is_16bit(L->pg->bufs[ins[k]].type.dtype)) {
            ins[k] = widened(L, it, ins[k]);
            fresh0 |= k == 0;
        }
    }
    for (int k = 0; k < n->nout; k++) {
        if (convert)
            outs[k] = lw_key_buffer(L, lw_out_key(L, it, n->out[k]), n->out[k], PTC_BUF_TEMP);
        else
            outs[k] = result_buffer(L, it, k, ins);
        wide[k] = outs[k];
        if (convert && is_16bit(L->pg->bufs[outs[k]].type.dtype)) {
            ptc_type t = L->pg->bufs[outs[k]].type;
            t.dtype = PTC_F32;
            /* the vocabulary-parallel cross-entropy's f32 gradient over the f32 copy of its 16-bit
             * logit shard, as in f32 (try_inplace): the copy is read by this op alone */
            if (k == 0 && fresh0 && n->op == PTC_OP_CE_GRAD_SHARD &&
                ptc_type_eq(&t, &L->pg->bufs[ins[0]].type)) {
                wide[k] = lw_new_buffer(L, &t, NULL, PTC_BUF_TEMP);
                ptc_buffer *bf = &L->pg->bufs[wide[k]];
                bf->view = ins[0];
                bf->region = L->pg->bufs[ins[0]].region;
                bf->view_axis = -1;
                continue;
            }
            wide[k] = lw_new_buffer(L, &t, NULL, PTC_BUF_TEMP);
        }
    }
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.kind = PTC_INSTR_KERNEL;
    in.op = n->op;
    in.attrs = n->attrs;
    in.attrs.name = NULL;
    if (ptc_ops[n->op].kw & PTC_A_MESH_AXIS) {
        if (n->attrs.mesh_axis == L->mb_axis) { /* rank-dependent over the microbatches */
            in.has_coord = true;
            in.coord = it->inst < 0 ? 0 : it->inst;
            in.attrs.mesh_axis = 0;
        } else {
            in.attrs.mesh_axis = L->axis_map[n->attrs.mesh_axis];
        }
    }
    in.nin = n->nin;
    in.nout = n->nout;
    in.in = ins;
    in.out = wide;
    emit(L, it, &in);
    for (int k = 0; k < n->nout; k++)
        if (wide[k] != outs[k])
            emit_two(L, it, PTC_INSTR_KERNEL, PTC_OP_CAST, wide[k], -1, outs[k]);
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
static int gather_in_place(lw *L, const item *it, int x)
{
    const ptc_node *n = &L->g->nodes[it->ni];
    const ptc_buffer *xb = &L->pg->bufs[x];
    if (xb->view < 0 || n->attrs.mesh_axis2 >= 0 ||
        xb->view_axis != L->axis_map[n->attrs.mesh_axis] ||
        xb->view_step != xb->bytes || xb->view_offset || n->attrs.n > 1)
        return -1;
    int root = xb->view;
    const ptc_buffer *rb = &L->pg->bufs[root];
    const ptc_value *out = &L->g->values[n->out[0]];
    int64_t outer = 1;
    for (int i = 0; i < n->attrs.axis; i++)
        outer *= out->type.dims[i];
    if (outer != 1 || rb->kind == PTC_BUF_INPUT || rb->type.dtype != out->type.dtype ||
        rb->bytes != ptc_type_numel(&out->type) * ptc_dtype_size(out->type.dtype) ||
        L->root_last[root] != L->pos)
        return -1;
    return view_of(L, lw_out_key(L, it, n->out[0]), n->out[0], root);
}

/* An allreduce over the microbatches is their sum, made in time: the first microbatch wrote its
 * term into the sum (see accumulated); the others add theirs. */
static void emit_accumulate(lw *L, const item *it)
{
    const ptc_node *n = &L->g->nodes[it->ni];
    if (n->op != PTC_OP_ALLREDUCE || n->attrs.reduce != 0) {
        lw_fail(L, "%s:%d:%d: error: this model needs %s%s over its microbatches, which ptc does "
                   "not run in time (only sums): use fewer microbatches",
                n->loc.file ? n->loc.file : "?", n->loc.line, n->loc.col, ptc_ops[n->op].name,
                n->op == PTC_OP_ALLREDUCE ? " (max)" : "");
        return;
    }
    int x = lw_operand(L, it, n->in[0]);
    size_t yk = lw_key(L, n->out[0], -1, 0);
    if (L->buf[yk] < 0) {
        lw_key_buffer(L, yk, n->out[0], PTC_BUF_TEMP);
        emit_two(L, it, PTC_INSTR_COPY, PTC_OP_RESHAPE, x, -1, L->buf[yk]);
    } else if (ptc_prog_root(L->pg, x) != ptc_prog_root(L->pg, L->buf[yk])) {
        int y = L->buf[yk];
        if (!is_16bit(L->pg->bufs[y].type.dtype)) {
            emit_two(L, it, PTC_INSTR_KERNEL, PTC_OP_ADD, y, x, y);
        } else { /* a 16-bit sum: added in f32, rounded once, like every 16-bit op */
            int a = widened(L, it, y), b = widened(L, it, x);
            emit_two(L, it, PTC_INSTR_KERNEL, PTC_OP_ADD, a, b, a);
            emit_two(L, it, PTC_INSTR_KERNEL, PTC_OP_CAST, a, -1, y);
        }
    }
}

static void emit_collective(lw *L, const item *it)
{
    const ptc_node *n = &L->g->nodes[it->ni];
    const ptc_attrs *a = &n->attrs;
    if (a->mesh_axis == L->mb_axis) {
        emit_accumulate(L, it);
        return;
    }
    /* communicators move and reduce every dtype (16-bit sums in float, rounded once); an
     * allreduce sums in place over an operand nothing reads afterwards (a gradient: the
     * unreduced copy would otherwise sit among the activations beside the reduced one) */
    int x = lw_operand(L, it, n->in[0]), y = -1;
    int ins[2] = {x, n->nin > 1 ? lw_operand(L, it, n->in[1]) : -1};
    if (n->op == PTC_OP_ALLREDUCE)
        y = try_inplace(L, it, 0, &x);
    else if (n->op == PTC_OP_ALLGATHER)
        y = gather_in_place(L, it, x);
    if (y < 0)
        y = update_target(L, it, n->out[0]);
    if (y < 0)
        y = lw_key_buffer(L, lw_out_key(L, it, n->out[0]), n->out[0], PTC_BUF_TEMP);
    const ptc_type *ity = &L->pg->bufs[x].type, *oty = &L->pg->bufs[y].type;
    int parts = L->g->mesh.sizes[a->mesh_axis];
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.kind = PTC_INSTR_COLL;
    in.op = n->op;
    in.coll.axes = 1u << L->axis_map[a->mesh_axis];
    /* a collective over two axes at once (dp+ep) is one group */
    if ((n->op == PTC_OP_ALLREDUCE || n->op == PTC_OP_ALLGATHER ||
         n->op == PTC_OP_REDUCE_SCATTER) &&
        a->mesh_axis2 >= 0 && a->mesh_axis2 < L->g->mesh.naxes) {
        in.coll.axes |= 1u << L->axis_map[a->mesh_axis2];
        parts *= L->g->mesh.sizes[a->mesh_axis2];
    }
    in.coll.reduce = (uint8_t)a->reduce;
    switch (n->op) {
    case PTC_OP_ALLREDUCE:
        in.coll.kind = PTC_COLL_ALLREDUCE;
        in.coll.count = ptc_type_numel(ity);
        break;
    case PTC_OP_ALLGATHER:
        in.coll.kind = PTC_COLL_ALLGATHER;
        split_layout(oty, (int)a->axis, (int)a->n, parts, &in.coll.outer, &in.coll.chunk);
        break;
    case PTC_OP_REDUCE_SCATTER:
        in.coll.kind = PTC_COLL_REDUCE_SCATTER;
        split_layout(ity, (int)a->axis, (int)a->n, parts, &in.coll.outer, &in.coll.chunk);
        break;
    case PTC_OP_ALL_TO_ALL_V: /* rows and every member's counts (program.h) */
        in.coll.kind = PTC_COLL_ALL_TO_ALL_V;
        in.coll.count = a->n;
        in.coll.chunk = oty->dims[oty->rank - 1];
        in.coll.outer = a->to;
        break;
    default: /* all_to_all */
        in.coll.kind = PTC_COLL_ALL_TO_ALL;
        split_layout(ity, a->to, 1, parts, &in.coll.outer, &in.coll.chunk);
        split_layout(oty, (int)a->axis, 1, parts, &in.coll.outer2, &in.coll.chunk2);
    }
    ins[0] = x;
    in.nin = n->op == PTC_OP_ALL_TO_ALL_V ? 2 : 1;
    in.nout = 1;
    in.in = ins;
    in.out = &y;
    emit(L, it, &in);
}

/* The GEMM operand a matmul reads: a folded transpose's operand, or the value itself. */
static int gemm_operand(lw *L, const item *it, int v)
{
    return lw_operand(L, it, L->fold[v] >= 0 ? L->fold[v] : v);
}

static void emit_gemm(lw *L, const item *it)
{
    const ptc_node *n = &L->g->nodes[it->ni];
    const ptc_type *A = &L->g->values[n->in[0]].type, *B = &L->g->values[n->in[1]].type,
                   *O = &L->g->values[n->out[0]].type;
    int va = n->in[0], vb = n->in[1];
    ptc_gemm gm;
    memset(&gm, 0, sizeof gm);
    gm.ta = L->fold[va] >= 0;
    gm.tb = L->fold[vb] >= 0;
    int x[2] = {gemm_operand(L, it, va), gemm_operand(L, it, vb)};
    int64_t m = A->dims[A->rank - 2], k = A->dims[A->rank - 1], nn = B->dims[B->rank - 1];
    int64_t ob = lw_batch_of(O), ab = lw_batch_of(A), bb = lw_batch_of(B);
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
    int y, v = n->out[0];
    if (L->tout[it->ni] >= 0) { /* C^T = op(B)^T op(A)^T: write the transpose of the result */
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
        v = L->tout[it->ni];
    }
    bool first;
    y = accumulated(L, it, v, &first);
    int ysum = L->acc[v] >= 0 ? L->buf[lw_key(L, L->acc[v], -1, 0)] : -1;
    if (y < 0 && ysum >= 0) { /* a later microbatch adds its gradient to the sum */
        y = ysum;
        L->buf[lw_out_key(L, it, v)] = y;
        gm.beta = 1.0;
    }
    if (y < 0)
        y = lw_key_buffer(L, lw_out_key(L, it, v), v, PTC_BUF_TEMP);
    /* 16-bit operands: the GEMM accumulates in f32 and rounds its result to 16 bits once as it
     * stores it (gm.cd), as a cast after an f32 result would: no f32 copy of the result is made
     * (for gpt2's logits at b=8, s=1024 that would be 1.6 GB beside their 0.8 GB in bf16) */
    gm.ab = (uint8_t)L->pg->bufs[x[0]].type.dtype;
    gm.cd = (uint8_t)L->pg->bufs[y].type.dtype;
    /* (a matmul's result has its operands' dtype; 16-bit gradient sums are added by kernels) */
    PTC_ASSERT(gm.cd == PTC_F32 || (gm.cd == gm.ab && gm.beta == 0));
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.kind = PTC_INSTR_GEMM;
    in.op = PTC_OP_MATMUL;
    in.gemm = gm;
    in.nin = gm.beta != 0 ? 3 : 2;
    in.nout = 1;
    int ins[3] = {x[0], x[1], y};
    in.in = ins;
    in.out = &y;
    emit(L, it, &in);
}

/* A rank's part of a tensor split along its first dimension that is larger than 1 (no groups, no
 * remainder) is a contiguous run of it: a view at coordinate x part bytes, no copy. ZeRO-1's
 * shard of an allreduced gradient is one. */
static bool shard_view(lw *L, const item *it)
{
    const ptc_node *n = &L->g->nodes[it->ni];
    const ptc_type *ity = &L->g->values[n->in[0]].type, *oty = &L->g->values[n->out[0]].type;
    if (n->attrs.mesh_axis == L->mb_axis)
        return false;
    int d = (int)n->attrs.axis, T = L->g->mesh.sizes[n->attrs.mesh_axis];
    int64_t outer = 1;
    for (int i = 0; i < d; i++)
        outer *= ity->dims[i];
    int src = lw_operand(L, it, n->in[0]);
    const ptc_buffer *sb = &L->pg->bufs[src];
    /* (a shard of a shard would be two steps from its root: it is copied) */
    if (outer != 1 || n->attrs.n > 1 || ptc_type_numel(oty) * T != ptc_type_numel(ity) ||
        sb->view_axis >= 0 || sb->view_offset)
        return false;
    int b = view_of(L, lw_out_key(L, it, n->out[0]), n->out[0], src);
    ptc_buffer *bf = &L->pg->bufs[b];
    bf->view_axis = L->axis_map[n->attrs.mesh_axis];
    bf->view_step = bf->bytes;
    L->src_of[b] = src;
    return true;
}

void lw_emit_copy(lw *L, const item *it, int from, int to)
{
    emit_two(L, it, PTC_INSTR_COPY, PTC_OP_RESHAPE, from, -1, to);
}

/* The plan mesh's pipeline axis. */
static int pp_axis(const lw *L)
{
    for (int a = 0; a < L->p->mesh.naxes; a++)
        if (strcmp(L->p->mesh.names[a], "pp") == 0)
            return a;
    return -1;
}

/* A message between stages: this stage's buffer of the value to the peer stage, or the peer's
 * into a new buffer of the value (or straight into a state's buffer). */
static void emit_message(lw *L, const item *it)
{
    ptc_instr in;
    memset(&in, 0, sizeof in);
    in.op = PTC_OP_RESHAPE;
    in.peer_axis = pp_axis(L);
    in.peer_delta = it->peer - L->pg->stage;
    in.tag = it->tag;
    int b;
    if (it->kind == IT_SEND) {
        b = L->buf[lw_key(L, it->v, lw_inst(L, it->v, it->inst), 0)];
        PTC_ASSERT(b >= 0);
        in.kind = PTC_INSTR_SEND;
        in.nin = 1;
        in.in = &b;
    } else {
        size_t k = lw_key(L, it->v, lw_inst(L, it->v, it->inst), 0);
        if (it->into >= 0) {
            b = L->buf[lw_key(L, it->into, -1, 0)];
            L->buf[k] = b;
        } else {
            b = lw_key_buffer(L, k, it->v, PTC_BUF_TEMP);
        }
        in.kind = PTC_INSTR_RECV;
        in.nout = 1;
        in.out = &b;
    }
    emit(L, it, &in);
}

void lw_emit_item(lw *L, const item *it)
{
    if (it->kind != IT_NODE) {
        emit_message(L, it);
        return;
    }
    const ptc_node *n = &L->g->nodes[it->ni];
    int v = n->out[0], b;
    switch (n->op) {
    case PTC_OP_INPUT:
    case PTC_OP_PARAM:
    case PTC_OP_STATE: return; /* buffers of their own (lower.c) */
    case PTC_OP_RESHAPE:
        if (L->fold[n->in[0]] < 0) {
            int src = lw_operand(L, it, n->in[0]);
            b = view_of(L, lw_out_key(L, it, v), v, src);
            L->src_of[b] = src;
            return;
        }
        break;
    case PTC_OP_SHARD_SLICE:
        if (shard_view(L, it))
            return;
        break;
    case PTC_OP_TRANSPOSE:
        if (L->tout[it->ni] == -2) /* written by the GEMM before it */
            return;
        if (L->undo[v] >= 0) {
            int src = lw_operand(L, it, L->undo[v]);
            b = view_of(L, lw_out_key(L, it, v), v, src);
            L->src_of[b] = src;
            return;
        }
        if (L->fold[v] >= 0)
            return; /* read by its GEMMs from its operand */
        break;
    case PTC_OP_MATMUL:
        if (L->gemm[it->ni]) {
            emit_gemm(L, it);
            return;
        }
        break;
    default:
        if (ptc_ops[n->op].flags & PTC_F_COMM) {
            emit_collective(L, it);
            return;
        }
    }
    emit_kernel(L, it);
}
