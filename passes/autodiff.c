/* autodiff.c - reverse-mode differentiation of the logical forward graph.
 *
 * Assumes: a verified forward graph with a scalar loss, containing only ops of the language and
 *          the internal forward ops a pass expanded one into (PTC_F_FWD: moe's pieces).
 * Guarantees: the graph is extended, after the forward nodes, with the backward nodes; ctx->grads
 *          holds for every PARAM (graph order) the value of d loss / d param, of the param's type
 *          (a zero fill for a parameter the loss does not depend on). The forward part is
 *          unchanged, so the logical program is still there for checking plans against.
 *
 * Each op's rule is one case of the switch in backprop_node. Rules build their results with the
 * same builder as the front end, so shape inference checks every gradient's type. Gradients of
 * broadcast operands are summed back to the operand's shape (sum_to). Values that do not depend
 * on a parameter get no gradient.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct ad {
    ptc_graph *g;
    int *adj;    /* forward value -> accumulated gradient value, or -1 */
    bool *needs; /* forward value depends on a parameter */
    int nfwd;    /* values [0, nfwd) are forward values */
    ptc_loc loc; /* of the forward node being differentiated */
    char *err;
    size_t errn;
    bool failed;
} ad;

static ptc_type ty(ad *a, int v)
{
    return a->g->values[v].type;
}

static void build(ad *a, ptc_op op, const int *in, int nin, const ptc_attrs *at, int *out)
{
    ptc_pass_build(a->g, "autodiff", op, in, nin, at, a->loc, out, &a->failed, a->err, a->errn);
}

static int b1(ad *a, ptc_op op, const int *in, int nin, const ptc_attrs *at)
{
    int out[PTC_MAX_RESULTS];
    build(a, op, in, nin, at, out);
    return out[0];
}

#define B(op, ...)                                                                                 \
    b1(a, PTC_OP_##op, (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)),    \
       NULL)

static int cst(ad *a, double value, ptc_dtype dt)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_CONST);
    at.value = value;
    at.dtype = dt;
    return b1(a, PTC_OP_CONST, NULL, 0, &at);
}

static int fill(ad *a, const ptc_type *t, double value)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_FILL);
    at.value = value;
    at.dtype = t->dtype;
    at.nshape = t->rank;
    memcpy(at.shape, t->dims, sizeof(int64_t) * (size_t)t->rank);
    return b1(a, PTC_OP_FILL, NULL, 0, &at);
}

static int shaped(ad *a, ptc_op op, int v, const ptc_type *t)
{
    ptc_attrs at = ptc_attrs_default(op);
    at.nshape = t->rank;
    memcpy(at.shape, t->dims, sizeof(int64_t) * (size_t)t->rank);
    return b1(a, op, &v, 1, &at);
}

/* d summed down to the shape of t (the adjoint of broadcasting). */
static int sum_to(ad *a, int d, const ptc_type *t)
{
    if (a->failed)
        return -1;
    ptc_type td = ty(a, d);
    if (td.rank == t->rank && !memcmp(td.dims, t->dims, sizeof(int64_t) * (size_t)t->rank))
        return d;
    return shaped(a, PTC_OP_SUM_TO, d, t);
}

/* Adds gradient d to the adjoint of forward value x. */
static void acc(ad *a, int x, int d)
{
    if (a->failed || d < 0 || !a->needs[x])
        return;
    a->adj[x] = a->adj[x] < 0 ? d : B(ADD, a->adj[x], d);
}

static int transpose(ad *a, int v)
{
    return b1(a, PTC_OP_TRANSPOSE, &v, 1, NULL);
}

static int reshape(ad *a, int v, int rank, const int64_t *dims)
{
    ptc_type t = {.rank = rank};
    memcpy(t.dims, dims, sizeof(int64_t) * (size_t)rank);
    return shaped(a, PTC_OP_RESHAPE, v, &t);
}

/* C = A @ B with A[..., m, k], B[..., k, n]. Weight-like operands of rank 2 get their gradient
 * from a single GEMM over the flattened leading dims instead of a batched one plus a sum. */
static void matmul_rule(ad *a, const int *x, int dy)
{
    ptc_type ta = ty(a, x[0]), tb = ty(a, x[1]), tc = ty(a, dy);
    if (a->needs[x[0]])
        acc(a, x[0], sum_to(a, B(MATMUL, dy, transpose(a, x[1])), &ta));
    if (a->needs[x[1]]) {
        if (tb.rank == 2 && ta.rank > 2) {
            int64_t m = ptc_type_numel(&ta) / ta.dims[ta.rank - 1];
            int64_t da[] = {m, ta.dims[ta.rank - 1]}, dc[] = {m, tc.dims[tc.rank - 1]};
            int a2 = reshape(a, x[0], 2, da), c2 = reshape(a, dy, 2, dc);
            acc(a, x[1], B(MATMUL, transpose(a, a2), c2));
        } else {
            acc(a, x[1], sum_to(a, B(MATMUL, transpose(a, x[0]), dy), &tb));
        }
    }
}

static void reduce_rule(ad *a, const ptc_node *n, int x, int dy)
{
    ptc_type tx = ty(a, x);
    if (n->op == PTC_OP_MAX) {
        ptc_attrs at = ptc_attrs_default(PTC_OP_MAX_GRAD);
        at.axis = n->attrs.axis;
        acc(a, x, b1(a, PTC_OP_MAX_GRAD, (int[]){x, dy}, 2, &at));
        return;
    }
    ptc_type keep = tx;
    keep.dims[n->attrs.axis] = 1;
    int d = shaped(a, PTC_OP_BROADCAST_TO, reshape(a, dy, keep.rank, keep.dims), &tx);
    if (n->op == PTC_OP_MEAN)
        d = B(MUL, d, cst(a, 1.0 / (double)tx.dims[n->attrs.axis], tx.dtype));
    acc(a, x, d);
}

static void shape_rule(ad *a, const ptc_node *n, const int *x, int dy)
{
    ptc_type tx = ty(a, x[0]);
    ptc_attrs at;
    switch (n->op) {
    case PTC_OP_RESHAPE: acc(a, x[0], reshape(a, dy, tx.rank, tx.dims)); break;
    case PTC_OP_TRANSPOSE: acc(a, x[0], transpose(a, dy)); break;
    case PTC_OP_PERMUTE:
        at = ptc_attrs_default(PTC_OP_PERMUTE);
        at.nshape = n->attrs.nshape;
        for (int i = 0; i < at.nshape; i++)
            at.shape[n->attrs.shape[i]] = i;
        acc(a, x[0], b1(a, PTC_OP_PERMUTE, &dy, 1, &at));
        break;
    case PTC_OP_SLICE:
        at = ptc_attrs_default(PTC_OP_PAD);
        at.axis = n->attrs.axis;
        at.start = n->attrs.start;
        at.len = tx.dims[n->attrs.axis];
        acc(a, x[0], b1(a, PTC_OP_PAD, &dy, 1, &at));
        break;
    case PTC_OP_CONCAT: {
        int64_t start = 0;
        for (int i = 0; i < n->nin; i++) {
            ptc_type ti = ty(a, x[i]);
            at = ptc_attrs_default(PTC_OP_SLICE);
            at.axis = n->attrs.axis;
            at.start = start;
            at.len = ti.dims[n->attrs.axis];
            start += at.len;
            if (a->needs[x[i]])
                acc(a, x[i], b1(a, PTC_OP_SLICE, &dy, 1, &at));
        }
        break;
    }
    default: PTC_UNREACHABLE("not a shape op");
    }
}

/* Split: the gradient is the concatenation of the results' gradients (zeros where unused). */
static void split_rule(ad *a, const ptc_node *n, int x)
{
    int parts[PTC_MAX_RESULTS];
    for (int i = 0; i < n->nout; i++) {
        int d = a->adj[n->out[i]];
        if (d < 0) {
            ptc_type t = ty(a, n->out[i]);
            d = fill(a, &t, 0.0);
        }
        parts[i] = d;
    }
    ptc_attrs at = ptc_attrs_default(PTC_OP_CONCAT);
    at.axis = n->attrs.axis;
    acc(a, x, b1(a, PTC_OP_CONCAT, parts, n->nout, &at));
}

static void model_rule(ad *a, const ptc_node *n, const int *x, int y, int dy)
{
    int out[PTC_MAX_RESULTS];
    ptc_attrs at;
    switch (n->op) {
    case PTC_OP_LAYERNORM:
    case PTC_OP_RMSNORM: {
        ptc_op gop = n->op == PTC_OP_LAYERNORM ? PTC_OP_LAYERNORM_GRAD : PTC_OP_RMSNORM_GRAD;
        at = ptc_attrs_default(gop);
        at.eps = n->attrs.eps;
        build(a, gop, (int[]){x[0], x[1], dy}, 3, &at, out);
        for (int i = 0; i < n->nin && !a->failed; i++)
            acc(a, x[i], out[i]);
        break;
    }
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX: {
        ptc_op gop = n->op == PTC_OP_SOFTMAX ? PTC_OP_SOFTMAX_GRAD : PTC_OP_LOG_SOFTMAX_GRAD;
        at = ptc_attrs_default(gop);
        at.axis = n->attrs.axis;
        acc(a, x[0], b1(a, gop, (int[]){y, dy}, 2, &at));
        break;
    }
    case PTC_OP_EMBEDDING:
        at = ptc_attrs_default(PTC_OP_EMBEDDING_GRAD);
        at.n = ty(a, x[0]).dims[0];
        acc(a, x[0], b1(a, PTC_OP_EMBEDDING_GRAD, (int[]){x[1], dy}, 2, &at));
        break;
    case PTC_OP_ATTENTION:
        at = ptc_attrs_default(PTC_OP_ATTENTION_GRAD);
        at.heads = n->attrs.heads;
        at.kv_heads = n->attrs.kv_heads;
        at.causal = n->attrs.causal;
        build(a, PTC_OP_ATTENTION_GRAD, (int[]){x[0], x[1], x[2], dy}, 4, &at, out);
        for (int i = 0; i < 3 && !a->failed; i++)
            acc(a, x[i], out[i]);
        break;
    case PTC_OP_ROPE:
        at = ptc_attrs_default(PTC_OP_ROPE_GRAD);
        at.heads = n->attrs.heads;
        at.base = n->attrs.base;
        acc(a, x[0], b1(a, PTC_OP_ROPE_GRAD, &dy, 1, &at));
        break;
    case PTC_OP_CROSS_ENTROPY: acc(a, x[0], B(CROSS_ENTROPY_GRAD, x[0], x[1], dy)); break;
    case PTC_OP_MSE: {
        ptc_type t = ty(a, x[0]);
        int scale = B(MUL, dy, cst(a, 2.0 / (double)ptc_type_numel(&t), PTC_F32));
        if (t.dtype != PTC_F32) {
            at = ptc_attrs_default(PTC_OP_CAST);
            at.dtype = t.dtype;
            scale = b1(a, PTC_OP_CAST, &scale, 1, &at);
        }
        int d = B(MUL, B(SUB, x[0], x[1]), scale);
        acc(a, x[0], d);
        if (a->needs[x[1]])
            acc(a, x[1], B(NEG, d));
        break;
    }
    default: PTC_UNREACHABLE("not a model op");
    }
}

/* moe's pieces: the gate weights' gradient goes to p through the top-k (not through the
 * choices), the experts' to x, the gate and both weights at once (moe_ffn_grad recomputes the
 * experts' activations instead of keeping them). */
static void moe_rule(ad *a, const ptc_node *n, const int *x)
{
    int out[PTC_MAX_RESULTS];
    ptc_attrs at;
    if (n->op == PTC_OP_MOE_TOPK) {
        int dg = a->adj[n->out[1]];
        if (dg < 0)
            return;
        at = ptc_attrs_default(PTC_OP_MOE_TOPK_GRAD);
        at.normalize = n->attrs.normalize;
        acc(a, x[0], b1(a, PTC_OP_MOE_TOPK_GRAD, (int[]){x[0], n->out[0], dg}, 3, &at));
        return;
    }
    at = n->attrs; /* moe_ffn's act, experts and capacity */
    build(a, PTC_OP_MOE_FFN_GRAD, (int[]){x[0], x[1], x[2], x[3], x[4], a->adj[n->out[0]]}, 6, &at,
          out);
    int operand[4] = {0, 2, 3, 4}; /* dx, dgate, dw_up, dw_down; the route has none */
    for (int i = 0; i < 4 && !a->failed; i++)
        acc(a, x[operand[i]], out[i]);
}

static void elementwise_rule(ad *a, const ptc_node *n, const int *x, int y, int dy)
{
    ptc_type t0 = ty(a, x[0]);
    ptc_dtype dt = t0.dtype;
    switch (n->op) {
    case PTC_OP_ADD:
    case PTC_OP_SUB: {
        ptc_type t1 = ty(a, x[1]);
        acc(a, x[0], sum_to(a, dy, &t0));
        if (a->needs[x[1]])
            acc(a, x[1], sum_to(a, n->op == PTC_OP_ADD ? dy : B(NEG, dy), &t1));
        break;
    }
    case PTC_OP_MUL: {
        ptc_type t1 = ty(a, x[1]);
        if (a->needs[x[0]])
            acc(a, x[0], sum_to(a, B(MUL, dy, x[1]), &t0));
        if (a->needs[x[1]])
            acc(a, x[1], sum_to(a, B(MUL, dy, x[0]), &t1));
        break;
    }
    case PTC_OP_DIV: {
        ptc_type t1 = ty(a, x[1]);
        if (a->needs[x[0]])
            acc(a, x[0], sum_to(a, B(DIV, dy, x[1]), &t0));
        if (a->needs[x[1]]) /* d(a/b)/db = -(a/b)/b = -y/b */
            acc(a, x[1], sum_to(a, B(NEG, B(DIV, B(MUL, dy, y), x[1])), &t1));
        break;
    }
    case PTC_OP_NEG: acc(a, x[0], B(NEG, dy)); break;
    case PTC_OP_EXP: acc(a, x[0], B(MUL, dy, y)); break;
    case PTC_OP_LOG: acc(a, x[0], B(DIV, dy, x[0])); break;
    case PTC_OP_SQRT: acc(a, x[0], B(DIV, dy, B(MUL, y, cst(a, 2.0, dt)))); break;
    case PTC_OP_RSQRT: /* d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3 */
        acc(a, x[0], B(MUL, dy, B(MUL, B(MUL, y, B(MUL, y, y)), cst(a, -0.5, dt))));
        break;
    case PTC_OP_TANH: acc(a, x[0], B(MUL, dy, B(SUB, cst(a, 1.0, dt), B(MUL, y, y)))); break;
    case PTC_OP_SIGMOID: acc(a, x[0], B(MUL, dy, B(MUL, y, B(SUB, cst(a, 1.0, dt), y)))); break;
    case PTC_OP_RELU: acc(a, x[0], B(RELU_GRAD, x[0], dy)); break;
    case PTC_OP_GELU: acc(a, x[0], B(GELU_GRAD, x[0], dy)); break;
    case PTC_OP_SILU: acc(a, x[0], B(SILU_GRAD, x[0], dy)); break;
    case PTC_OP_CAST: {
        ptc_attrs at = ptc_attrs_default(PTC_OP_CAST);
        at.dtype = dt;
        acc(a, x[0], b1(a, PTC_OP_CAST, &dy, 1, &at));
        break;
    }
    default: PTC_UNREACHABLE("not an elementwise op");
    }
}

static void backprop_node(ad *a, int ni)
{
    /* Copy what the rules read: building nodes may move g->nodes. */
    ptc_node n = a->g->nodes[ni];
    int x[PTC_MAX_RESULTS * 4];
    PTC_ASSERT(n.nin <= (int)(sizeof x / sizeof x[0]));
    memcpy(x, n.in, sizeof(int) * (size_t)n.nin);
    int y = n.out[0], dy = a->adj[y];
    a->loc = n.loc;
    switch (n.op) {
    case PTC_OP_INPUT:
    case PTC_OP_PARAM:
    case PTC_OP_CONST: break;
    case PTC_OP_MATMUL: matmul_rule(a, x, dy); break;
    case PTC_OP_SUM:
    case PTC_OP_MEAN:
    case PTC_OP_MAX: reduce_rule(a, &n, x[0], dy); break;
    case PTC_OP_RESHAPE:
    case PTC_OP_TRANSPOSE:
    case PTC_OP_PERMUTE:
    case PTC_OP_SLICE:
    case PTC_OP_CONCAT: shape_rule(a, &n, x, dy); break;
    case PTC_OP_SPLIT: split_rule(a, &n, x[0]); break;
    case PTC_OP_LAYERNORM:
    case PTC_OP_RMSNORM:
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
    case PTC_OP_EMBEDDING:
    case PTC_OP_ATTENTION:
    case PTC_OP_ROPE:
    case PTC_OP_CROSS_ENTROPY:
    case PTC_OP_MSE: model_rule(a, &n, x, y, dy); break;
    case PTC_OP_MOE_TOPK:
    case PTC_OP_MOE_FFN: moe_rule(a, &n, x); break;
    default:
        if (ptc_ops[n.op].flags & (PTC_F_UNARY | PTC_F_BINARY) || n.op == PTC_OP_CAST) {
            elementwise_rule(a, &n, x, y, dy);
            break;
        }
        ptc_fmt(a->err, a->errn, "internal error: autodiff has no rule for op %s",
                ptc_ops[n.op].name);
        a->failed = true;
    }
}

/* A node contributes to gradients when one of its results has a gradient and one of its operands
 * depends on a parameter. */
static bool has_adjoint(const ad *a, const ptc_node *n)
{
    for (int i = 0; i < n->nout; i++)
        if (a->adj[n->out[i]] >= 0)
            return true;
    return false;
}

int ptc_pass_autodiff(ptc_pass_ctx *ctx)
{
    ptc_graph *g = ctx->g;
    if (g->loss < 0) {
        ptc_fmt(ctx->err, ctx->errn, "autodiff: the graph has no loss");
        return -1;
    }
    ad a = {.g = g, .nfwd = g->nvalues, .err = ctx->err, .errn = ctx->errn};
    a.adj = ptc_xmalloc(sizeof(int) * (size_t)g->nvalues);
    a.needs = ptc_xcalloc((size_t)g->nvalues, sizeof(bool));
    for (int v = 0; v < g->nvalues; v++)
        a.adj[v] = -1;
    int nfwd_nodes = g->nnodes;
    for (int i = 0; i < nfwd_nodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (!(ptc_ops[n->op].flags & (PTC_F_LANG | PTC_F_FWD)) &&
            !(ptc_ops[n->op].flags & (PTC_F_UNARY | PTC_F_BINARY)) && n->op != PTC_OP_MATMUL &&
            n->op != PTC_OP_INPUT && n->op != PTC_OP_PARAM && n->op != PTC_OP_CONST) {
            ptc_fmt(ctx->err, ctx->errn, "autodiff: the graph already contains %s",
                    ptc_ops[n->op].name);
            goto fail;
        }
        bool dep = n->op == PTC_OP_PARAM;
        for (int k = 0; k < n->nin; k++)
            dep |= a.needs[n->in[k]];
        for (int k = 0; k < n->nout; k++)
            a.needs[n->out[k]] = dep && g->values[n->out[k]].type.dtype != PTC_I32;
    }
    a.loc = g->nodes[g->values[g->loss].def].loc;
    if (a.needs[g->loss] && ctx->opts->loss_scaling) {
        /* d(scale * loss): every gradient comes out multiplied by the scale (fp16 keeps small
         * gradients above its underflow); the optimizer pass divides it out */
        ptc_attrs at = ptc_attrs_default(PTC_OP_INPUT);
        at.name = PTC_IN_LOSS_SCALE;
        at.dtype = PTC_F32;
        int out[PTC_MAX_RESULTS];
        ptc_pass_build(g, "autodiff", PTC_OP_INPUT, NULL, 0, &at, a.loc, out, &a.failed, a.err,
                       a.errn);
        int seed = out[0];
        if (!a.failed && g->values[g->loss].type.dtype != PTC_F32) {
            at = ptc_attrs_default(PTC_OP_CAST);
            at.dtype = g->values[g->loss].type.dtype;
            ptc_pass_build(g, "autodiff", PTC_OP_CAST, &seed, 1, &at, a.loc, out, &a.failed,
                           a.err, a.errn);
            seed = out[0];
        }
        a.adj[g->loss] = seed;
    } else if (a.needs[g->loss]) {
        a.adj[g->loss] = cst(&a, 1.0, g->values[g->loss].type.dtype);
    }
    for (int i = nfwd_nodes - 1; i >= 0 && !a.failed; i--)
        if (has_adjoint(&a, &g->nodes[i]))
            backprop_node(&a, i);
    if (a.failed)
        goto fail;

    ctx->nparams = ptc_graph_params(g, NULL, 0);
    ctx->grads = ptc_xmalloc(sizeof(int) * (size_t)(ctx->nparams ? ctx->nparams : 1));
    for (int i = 0, k = 0; i < nfwd_nodes; i++) {
        if (g->nodes[i].op != PTC_OP_PARAM)
            continue;
        int p = g->nodes[i].out[0];
        ptc_type t = g->values[p].type;
        a.loc = g->nodes[i].loc;
        ctx->grads[k++] = a.adj[p] >= 0 ? a.adj[p] : fill(&a, &t, 0.0);
    }
    free(a.adj);
    free(a.needs);
    return a.failed ? -1 : 0;
fail:
    free(a.adj);
    free(a.needs);
    return -1;
}
