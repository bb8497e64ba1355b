/* kir_ops.c - single ops as kernels of the kernel IR (see kir_ops.h). */
#include "kir_ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kir_ops_build.h"
#include "util.h"

static int sigmoid(ptc_kir *k, int x)
{
    return B(k, PTC_KX_DIV, F(k, 1.0), B(k, PTC_KX_ADD, F(k, 1.0), U(k, PTC_KX_EXP, U(k, PTC_KX_NEG, x))));
}

/* GPT-2's tanh GELU and its derivative (as the reference kernels compute them) */
#define GELU_C 0.7978845608028654 /* sqrt(2 / pi) */
static int gelu_t(ptc_kir *k, int x)
{
    int x3 = B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, x, x), x);
    return U(k, PTC_KX_TANH, B(k, PTC_KX_MUL, F(k, GELU_C), B(k, PTC_KX_ADD, x, B(k, PTC_KX_MUL, F(k, 0.044715), x3))));
}

bool ptc_kx_op_pointwise(ptc_op op)
{
    switch (op) {
    case PTC_OP_ADD:
    case PTC_OP_SUB:
    case PTC_OP_MUL:
    case PTC_OP_DIV:
    case PTC_OP_NEG:
    case PTC_OP_EXP:
    case PTC_OP_LOG:
    case PTC_OP_SQRT:
    case PTC_OP_RSQRT:
    case PTC_OP_TANH:
    case PTC_OP_SIGMOID:
    case PTC_OP_RELU:
    case PTC_OP_GELU:
    case PTC_OP_SILU:
    case PTC_OP_RELU_GRAD:
    case PTC_OP_GELU_GRAD:
    case PTC_OP_SILU_GRAD: return true;
    default: return false;
    }
}

int ptc_kx_op(ptc_kir *k, ptc_op op, const int *v)
{
    switch (op) {
    case PTC_OP_ADD: return B(k, PTC_KX_ADD, v[0], v[1]);
    case PTC_OP_SUB: return B(k, PTC_KX_SUB, v[0], v[1]);
    case PTC_OP_MUL: return B(k, PTC_KX_MUL, v[0], v[1]);
    case PTC_OP_DIV: return B(k, PTC_KX_DIV, v[0], v[1]);
    case PTC_OP_NEG: return U(k, PTC_KX_NEG, v[0]);
    case PTC_OP_EXP: return U(k, PTC_KX_EXP, v[0]);
    case PTC_OP_LOG: return U(k, PTC_KX_LOG, v[0]);
    case PTC_OP_SQRT: return U(k, PTC_KX_SQRT, v[0]);
    case PTC_OP_RSQRT: return B(k, PTC_KX_DIV, F(k, 1.0), U(k, PTC_KX_SQRT, v[0]));
    case PTC_OP_TANH: return U(k, PTC_KX_TANH, v[0]);
    case PTC_OP_SIGMOID: return sigmoid(k, v[0]);
    case PTC_OP_RELU: /* x < 0 ? 0 : x (NaN passes) */
        return ptc_kx_select(k, B(k, PTC_KX_LT, v[0], F(k, 0.0)), F(k, 0.0), v[0]);
    case PTC_OP_GELU:
        return B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, F(k, 0.5), v[0]), B(k, PTC_KX_ADD, F(k, 1.0), gelu_t(k, v[0])));
    case PTC_OP_SILU: return B(k, PTC_KX_MUL, v[0], sigmoid(k, v[0]));
    case PTC_OP_RELU_GRAD:
        return ptc_kx_select(k, B(k, PTC_KX_LT, F(k, 0.0), v[0]), v[1], F(k, 0.0));
    case PTC_OP_GELU_GRAD: {
        int x = v[0], t = gelu_t(k, x);
        int a = B(k, PTC_KX_MUL, F(k, 0.5), B(k, PTC_KX_ADD, F(k, 1.0), t));
        int d = B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, F(k, 0.5), x),
                                   B(k, PTC_KX_SUB, F(k, 1.0), B(k, PTC_KX_MUL, t, t))),
                  B(k, PTC_KX_MUL, F(k, GELU_C),
                    B(k, PTC_KX_ADD, F(k, 1.0), B(k, PTC_KX_MUL, F(k, 3 * 0.044715), B(k, PTC_KX_MUL, x, x)))));
        return B(k, PTC_KX_MUL, B(k, PTC_KX_ADD, a, d), v[1]);
    }
    case PTC_OP_SILU_GRAD: { /* s (1 + x (1 - s)) dy */
        int s = sigmoid(k, v[0]);
        int g = B(k, PTC_KX_MUL, s, B(k, PTC_KX_ADD, F(k, 1.0), B(k, PTC_KX_MUL, v[0], B(k, PTC_KX_SUB, F(k, 1.0), s))));
        return B(k, PTC_KX_MUL, g, v[1]);
    }
    default: PTC_UNREACHABLE("not an elementwise op");
    }
}

int ptc_kx_bcast_index(ptc_kir *k, int i, const ptc_type *t, const ptc_type *o)
{
    int64_t n = ptc_type_numel(t);
    if (n == ptc_type_numel(o))
        return i;
    if (n == 1)
        return I(k, 0);
    int idx = -1;
    int64_t stride = 1, inner = 1;
    for (int d = o->rank - 1; d >= 0; d--) {
        int td = d - (o->rank - t->rank);
        if (td >= 0 && t->dims[td] != 1) {
            int c = B(k, PTC_KX_REM, inner > 1 ? B(k, PTC_KX_DIV, i, I(k, inner)) : i, I(k, o->dims[d]));
            int term = stride > 1 ? B(k, PTC_KX_MUL, c, I(k, stride)) : c;
            idx = idx < 0 ? term : B(k, PTC_KX_ADD, idx, term);
        }
        if (td >= 0)
            stride *= t->dims[td];
        inner *= o->dims[d];
    }
    return idx < 0 ? I(k, 0) : idx;
}

/* ---- long column sums in two passes (PTC_OPK_COLSUM_ROWS) ---- */

#define CHUNK PTC_OPK_COLSUM_ROWS

static bool two_pass(int64_t rows)
{
    return rows > 2 * CHUNK;
}

static int64_t chunks_of(int64_t rows)
{
    return (rows + CHUNK - 1) / CHUNK;
}

/* a value at row c CHUNK + t of chunk c (body, given the row), 0 past the last row */
typedef struct chunked {
    int (*body)(ob *, int, void *);
    void *ctx;
    int c;
    int64_t rows;
} chunked;
static int chunk_row(ob *b, int t, void *p)
{
    chunked *h = p;
    ptc_kir *k = b->k;
    int r = B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, h->c, I(k, CHUNK)), t);
    if (h->rows % CHUNK == 0)
        return h->body(b, r, h->ctx);
    int live = B(k, PTC_KX_LT, r, I(k, h->rows));
    int v = h->body(b, ptc_kx_select(k, live, r, I(k, 0)), h->ctx);
    return ptc_kx_select(k, live, v, F(k, 0.0));
}

/* the first pass's sum for chunk c (the caller's column already set in ctx) */
static int chunk_sum(ob *b, const char *v, int c, int64_t rows, int (*body)(ob *, int, void *),
                     void *ctx)
{
    chunked h = {.body = body, .ctx = ctx, .c = c, .rows = rows};
    return sum(b, v, CHUNK, chunk_row, &h);
}

/* the second pass: results outs[o] (the op's result numbers) [j] = the sum over the chunks c of
 * scratch[at[o] + c cols + j], as a kernel of its own */
typedef struct partials {
    int s, j;
    int64_t at, cols;
} partials;
static int partial(ob *b, int c, void *p)
{
    partials *q = p;
    ptc_kir *k = b->k;
    return L(b, q->s, B(k, PTC_KX_ADD, I(k, q->at), MA(k, c, q->cols, q->j)));
}
static void sum_chunks(ob *b, int64_t scratch, int64_t rows, int64_t cols, int n,
                       const int *outs, const int64_t *at, const ptc_type *ot)
{
    begin(b);
    partials q = {.s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, scratch, false), .cols = cols};
    int y[PTC_MAX_RESULTS];
    for (int o = 0; o < n; o++)
        y[o] = out(b, outs[o], &ot[outs[o]]);
    q.j = par(b, "j", cols);
    for (int o = 0; o < n; o++) {
        q.at = at[o];
        ptc_kir_store(b->k, y[o], q.j, sum(b, "c", chunks_of(rows), partial, &q));
    }
    ptc_kir_end(b->k);
}


/* ---- the ops ---- */

static void build_pointwise(ob *b, ptc_op op, int nin, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int p[4];
    for (int i = 0; i < nin; i++)
        p[i] = in(b, i, &it[i]);
    int y = out(b, 0, ot);
    int i = par(b, "i", ptc_type_numel(ot));
    int v[4];
    for (int q = 0; q < nin; q++)
        v[q] = L(b, p[q], ptc_kx_bcast_index(b->k, i, &it[q], ot));
    ptc_kir_store(b->k, y, i, ptc_kx_op(b->k, op, v));
    ptc_kir_end(b->k);
}

void ptc_kop_const(ob *b, double value, const ptc_type *ot)
{
    begin(b);
    int y = out(b, 0, ot);
    int i = par(b, "i", ptc_type_numel(ot));
    ptc_kir_store(b->k, y, i, F(b->k, (float)value));
    ptc_kir_end(b->k);
}

typedef struct sq {
    int x;
    int64_t n, chunk;
    int blk; /* the chunk's index */
} sq;
static int sq_body(ob *b, int j, void *c)
{
    sq *q = c;
    ptc_kir *k = b->k;
    /* element blk x chunk + j, where it exists */
    int at = MA(k, q->blk, q->chunk, j); /* (no let: j is the reduction's own) */
    if (q->n % q->chunk == 0) { /* whole chunks: every element exists */
        int v = L(b, q->x, at);
        return B(k, PTC_KX_MUL, v, v);
    }
    int live = B(k, PTC_KX_LT, at, I(k, q->n));
    int v = L(b, q->x, ptc_kx_select(k, live, at, I(k, 0)));
    return ptc_kx_select(k, live, B(k, PTC_KX_MUL, v, v), F(k, 0.0));
}
static int sq_part(ob *b, int i, void *c)
{
    return L(b, ((sq *)c)->x, i);
}

#define SUMSQ_CHUNK 8192 /* elements a block sums in the first pass */

/* sum of squares in two passes, so that a GPU spreads a large tensor over its blocks: chunks'
 * sums into scratch, then their sum (one chunk: one pass) */
static void build_sumsq(ob *b, const ptc_type *it, const ptc_type *ot)
{
    int64_t n = ptc_type_numel(it), nb = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    nb = nb ? nb : 1;
    sq c = {.n = n, .chunk = nb > 1 ? SUMSQ_CHUNK : n};
    begin(b);
    c.x = in(b, 0, it);
    int dst = nb > 1 ? param(b, PTC_OPK_SCRATCH, "s", PTC_F32, nb, true) : out(b, 0, ot);
    c.blk = par(b, "r", nb);
    ptc_kir_store(b->k, dst, c.blk, sum(b, "j", c.chunk, sq_body, &c));
    ptc_kir_end(b->k);
    if (nb == 1)
        return;
    b->ok->scratch = nb;
    begin(b);
    sq parts = {.x = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, nb, false)};
    int y = out(b, 0, ot);
    par(b, "o", 1);
    ptc_kir_store(b->k, y, I(b->k, 0), sum(b, "i", nb, sq_part, &parts));
    ptc_kir_end(b->k);
}

typedef struct ax {
    int x;
    int64_t n, inner;
    int a, c; /* outer and inner index expressions */
} ax;
static int ax_body(ob *b, int i, void *c)
{
    ax *a = c;
    /* x[(a * n + i) * inner + c] */
    return L(b, a->x, MA(b->k, MA(b->k, a->a, a->n, i), a->inner, a->c));
}

/* sum or mean along an axis */
static void build_reduce(ob *b, bool mean, int axis, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    ax c = {.x = in(b, 0, it)};
    int y = out(b, 0, ot);
    int64_t outer;
    axis_view(it, axis, &outer, &c.n, &c.inner);
    int o = par(b, "o", outer * c.inner);
    c.a = B(b->k, PTC_KX_DIV, o, I(b->k, c.inner));
    c.c = B(b->k, PTC_KX_REM, o, I(b->k, c.inner));
    int s = sum(b, "i", c.n, ax_body, &c);
    ptc_kir_store(b->k, y, o, mean ? B(b->k, PTC_KX_DIV, s, F(b->k, (double)c.n)) : s);
    ptc_kir_end(b->k);
}

/* sum_to: out[j] = the sum of the elements of x that broadcast_to copies from j. The dims of x
 * split into kept ones (where out's right-aligned dim is x's, not 1) and summed ones. */
typedef struct st {
    int x;
    const ptc_type *tx;
    bool kept[PTC_MAX_RANK];
    int j; /* out's index */
} st;
static int st_body(ob *b, int q, void *c)
{
    st *s = c;
    ptc_kir *k = b->k;
    int idx = -1, jr = s->j, qr = q;
    int64_t stride = 1;
    for (int d = s->tx->rank - 1; d >= 0; d--) {
        int64_t n = s->tx->dims[d];
        int *rest = s->kept[d] ? &jr : &qr;
        int coord = B(k, PTC_KX_REM, *rest, I(k, n));
        *rest = B(k, PTC_KX_DIV, *rest, I(k, n));
        int term = B(k, PTC_KX_MUL, coord, I(k, stride));
        idx = idx < 0 ? term : B(k, PTC_KX_ADD, idx, term);
        stride *= n;
    }
    return L(b, s->x, idx < 0 ? I(k, 0) : idx);
}

static int build_sum_to(ob *b, const ptc_type *it, const ptc_type *ot, char *why, size_t whyn)
{
    st c = {.tx = it};
    int64_t kept = 1, summed = 1;
    for (int d = 0; d < it->rank; d++) {
        int od = d - (it->rank - ot->rank);
        c.kept[d] = od >= 0 && ot->dims[od] != 1;
        if (c.kept[d] && ot->dims[od] != it->dims[d]) {
            ptc_fmt(why, whyn, "sum_to of a dim of %lld into %lld", (long long)it->dims[d],
                    (long long)ot->dims[od]);
            return -1;
        }
        if (c.kept[d])
            kept *= it->dims[d];
        else
            summed *= it->dims[d];
    }
    /* the innermost dim kept (a bias's gradient): rows of columns, summed in two passes where
     * long; otherwise the summed elements of a result are close together already */
    if (it->rank > 0 && c.kept[it->rank - 1] && two_pass(summed)) {
        int64_t nch = chunks_of(summed);
        b->ok->scratch = nch * kept;
        begin(b);
        c.x = in(b, 0, it);
        int s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, nch * kept, true);
        int cj = par(b, "cj", nch * kept);
        c.j = B(b->k, PTC_KX_REM, cj, I(b->k, kept));
        int ch = B(b->k, PTC_KX_DIV, cj, I(b->k, kept));
        ptc_kir_store(b->k, s, cj, chunk_sum(b, "t", ch, summed, st_body, &c));
        ptc_kir_end(b->k);
        int outs[1] = {0};
        int64_t at[1] = {0};
        sum_chunks(b, nch * kept, summed, kept, 1, outs, at, ot);
        return 0;
    }
    begin(b);
    c.x = in(b, 0, it);
    int y = out(b, 0, ot);
    c.j = par(b, "j", kept);
    ptc_kir_store(b->k, y, c.j, sum(b, "q", summed, st_body, &c));
    ptc_kir_end(b->k);
    return 0;
}

/* slice, pad and concat: every result element from one place of one operand (or zero) */
static void build_slice(ob *b, int axis, int64_t start, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int x = in(b, 0, it), y = out(b, 0, ot);
    int64_t outer, n, inner, len = ot->dims[axis];
    axis_view(it, axis, &outer, &n, &inner);
    ptc_kir *k = b->k;
    int i = par(b, "i", ptc_type_numel(ot));
    /* i = (a * len + s) * inner + c  ->  x[(a * n + start + s) * inner + c] */
    int a = B(k, PTC_KX_DIV, i, I(k, len * inner)), r = B(k, PTC_KX_REM, i, I(k, len * inner));
    int src = B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, a, I(k, n * inner)), B(k, PTC_KX_ADD, r, I(k, start * inner)));
    ptc_kir_store(k, y, i, L(b, x, src));
    ptc_kir_end(k);
}

/* out[i] = x[i] over the elements (dtypes may differ) */
void ptc_kop_copy(ob *b, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int x = in(b, 0, it), y = out(b, 0, ot);
    int i = par(b, "i", ptc_type_numel(ot));
    ptc_kir_store(b->k, y, i, L(b, x, i));
    ptc_kir_end(b->k);
}

static void build_pad(ob *b, int axis, int64_t start, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int x = in(b, 0, it), y = out(b, 0, ot);
    int64_t outer, n, inner, len = ot->dims[axis];
    axis_view(it, axis, &outer, &n, &inner);
    ptc_kir *k = b->k;
    int i = par(b, "i", ptc_type_numel(ot));
    int a = B(k, PTC_KX_DIV, i, I(k, len * inner)), r = B(k, PTC_KX_REM, i, I(k, len * inner));
    int s = B(k, PTC_KX_SUB, r, I(k, start * inner)); /* (position - start) * inner + c */
    int inside = ptc_kx_select(k, B(k, PTC_KX_LE, I(k, 0), s), B(k, PTC_KX_LT, s, I(k, n * inner)),
                               B(k, PTC_KX_LT, I(k, 1), I(k, 0)));
    int src = ptc_kx_select(k, inside, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, a, I(k, n * inner)), s), I(k, 0));
    ptc_kir_store(k, y, i, ptc_kx_select(k, inside, L(b, x, src), F(k, 0.0)));
    ptc_kir_end(k);
}

static void build_concat(ob *b, int nin, int axis, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int p[PTC_OPK_MAX_ARGS - 1];
    for (int q = 0; q < nin; q++)
        p[q] = in(b, q, &it[q]);
    int y = out(b, 0, ot);
    int64_t outer, total, inner;
    axis_view(ot, axis, &outer, &total, &inner);
    ptc_kir *k = b->k;
    int i = par(b, "i", ptc_type_numel(ot));
    int a = B(k, PTC_KX_DIV, i, I(k, total * inner)), r = B(k, PTC_KX_REM, i, I(k, total * inner));
    /* the last operand's value, then each earlier one where r falls in it */
    int64_t at = 0, starts[PTC_OPK_MAX_ARGS];
    for (int q = 0; q < nin; q++) {
        starts[q] = at;
        at += it[q].dims[axis];
    }
    int v = -1;
    for (int q = nin - 1; q >= 0; q--) {
        int64_t nq = it[q].dims[axis];
        int s = B(k, PTC_KX_SUB, r, I(k, starts[q] * inner));
        /* a clamped index keeps the load in bounds where r is not in operand q */
        int in_q = B(k, PTC_KX_LT, s, I(k, nq * inner));
        int ok = ptc_kx_select(k, B(k, PTC_KX_LE, I(k, 0), s), in_q, B(k, PTC_KX_LT, I(k, 1), I(k, 0)));
        int src = ptc_kx_select(k, ok, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, a, I(k, nq * inner)), s), I(k, 0));
        int load = L(b, p[q], src);
        v = v < 0 ? load : ptc_kx_select(k, ok, load, v);
    }
    ptc_kir_store(k, y, i, v);
    ptc_kir_end(k);
}

/* embedding: out[i, j] = table[ids[i], j]; NaN for an id out of range */
static void build_embedding(ob *b, const ptc_type *tt, const ptc_type *ti, const ptc_type *ot)
{
    begin(b);
    int t = in(b, 0, tt), ids = in(b, 1, ti), y = out(b, 0, ot);
    int64_t rows = tt->dims[0], d = tt->dims[1];
    ptc_kir *k = b->k;
    int e = par(b, "e", ptc_type_numel(ot));
    int id = L(b, ids, B(k, PTC_KX_DIV, e, I(k, d)));
    int ok = ptc_kx_select(k, B(k, PTC_KX_LE, I(k, 0), id), B(k, PTC_KX_LT, id, I(k, rows)),
                           B(k, PTC_KX_LT, I(k, 1), I(k, 0)));
    int src = ptc_kx_select(k, ok, MA(k, id, d, B(k, PTC_KX_REM, e, I(k, d))), I(k, 0));
    ptc_kir_store(k, y, e, ptc_kx_select(k, ok, L(b, t, src), F(k, NAN)));
    ptc_kir_end(k);
}

/* clip_coef: min(1, max_norm / (sqrt(sumsq) + 1e-6)), NaN passing */
static void build_clip_coef(ob *b, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int s = in(b, 0, &it[0]), m = in(b, 1, &it[1]), y = out(b, 0, ot);
    ptc_kir *k = b->k;
    int i = par(b, "i", 1);
    int c = ptc_kir_bind(k, B(k, PTC_KX_DIV, L(b, m, I(k, 0)),
                              B(k, PTC_KX_ADD, U(k, PTC_KX_SQRT, L(b, s, I(k, 0))), F(k, 1e-6))));
    ptc_kir_store(k, y, i, ptc_kx_select(k, B(k, PTC_KX_LT, F(k, 1.0), c), F(k, 1.0), c));
    ptc_kir_end(k);
}

/* layernorm_grad (x, g, dy) -> (dx, dg, db): a kernel over rows (dx, and each row's mean and
 * 1/std into scratch), then one over columns (dg, db) */
/* a row r of d columns of x (and g, dy), its statistics, a column j (layernorm and rmsnorm,
 * forward and backward) */
typedef struct nrm {
    int x, g, dy, s;
    int64_t d, rows;
    int r, mean, inv, j;
} nrm;
static int n_x(ob *b, int j, void *c)
{
    nrm *l = c;
    return L(b, l->x, MA(b->k, l->r, l->d, j));
}
static int n_var(ob *b, int j, void *c)
{
    nrm *l = c;
    int v = B(b->k, PTC_KX_SUB, n_x(b, j, c), l->mean);
    return B(b->k, PTC_KX_MUL, v, v);
}
static int ln_e(ob *b, int j, void *c) /* dy g */
{
    nrm *l = c;
    return B(b->k, PTC_KX_MUL, L(b, l->dy, MA(b->k, l->r, l->d, j)), L(b, l->g, j));
}
static int ln_xh(ob *b, int j, void *c)
{
    nrm *l = c;
    return B(b->k, PTC_KX_MUL, B(b->k, PTC_KX_SUB, n_x(b, j, c), l->mean), l->inv);
}
static int ln_exh(ob *b, int j, void *c)
{
    return B(b->k, PTC_KX_MUL, ln_e(b, j, c), ln_xh(b, j, c));
}
static int ln_dg(ob *b, int r, void *c) /* over rows r, column l->j */
{
    nrm *l = c;
    ptc_kir *k = b->k;
    int at = MA(k, r, l->d, l->j);
    int mean = L(b, l->s, B(k, PTC_KX_MUL, r, I(k, 2)));
    int inv = L(b, l->s, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, r, I(k, 2)), I(k, 1)));
    return B(k, PTC_KX_MUL, L(b, l->dy, at), B(k, PTC_KX_MUL, B(k, PTC_KX_SUB, L(b, l->x, at), mean), inv));
}
static int ln_db(ob *b, int r, void *c)
{
    nrm *l = c;
    return L(b, l->dy, MA(b->k, r, l->d, l->j));
}

/* The norms' parameter gradients over many rows (x, dy: operands 0 and 2): results outs[o] [j]
 * = the sum over the rows r of body[o] at (r, column l->j), in two passes whose chunk sums follow
 * the rows' statistics (stats floats) in scratch. */
static void norm_param_grads(ob *b, nrm *l, int64_t stats, int n,
                             int (*const *body)(ob *, int, void *), const int *outs,
                             const ptc_type *it, const ptc_type *ot)
{
    int64_t nch = chunks_of(l->rows), at[PTC_MAX_RESULTS];
    b->ok->scratch = stats + n * nch * l->d;
    begin(b);
    l->x = in(b, 0, &it[0]);
    l->dy = in(b, 2, &it[2]);
    l->s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, b->ok->scratch, true);
    ptc_kir *k = b->k;
    int cj = par(b, "cj", nch * l->d);
    l->j = B(k, PTC_KX_REM, cj, I(k, l->d));
    int ch = B(k, PTC_KX_DIV, cj, I(k, l->d));
    for (int o = 0; o < n; o++) {
        char v[16];
        snprintf(v, sizeof v, "t%d", o);
        at[o] = stats + o * nch * l->d;
        ptc_kir_store(k, l->s, B(k, PTC_KX_ADD, cj, I(k, at[o])),
                      chunk_sum(b, v, ch, l->rows, body[o], l));
    }
    ptc_kir_end(k);
    sum_chunks(b, b->ok->scratch, l->rows, l->d, n, outs, at, ot);
}

static void build_layernorm_grad(ob *b, double eps, const ptc_type *it, const ptc_type *ot)
{
    nrm l = {.d = it[0].dims[it[0].rank - 1]};
    l.rows = ptc_type_numel(&it[0]) / l.d;
    b->ok->scratch = 2 * l.rows;
    begin(b);
    l.x = in(b, 0, &it[0]);
    l.g = in(b, 1, &it[1]);
    l.dy = in(b, 2, &it[2]);
    int dx = out(b, 0, &ot[0]);
    l.s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, 2 * l.rows, true);
    ptc_kir *k = b->k;
    l.r = par(b, "r", l.rows);
    double inv_d = 1.0 / (double)l.d;
    l.mean = ptc_kir_bind(k, B(k, PTC_KX_MUL, sum(b, "j0", l.d, n_x, &l), F(k, inv_d)));
    int var = B(k, PTC_KX_MUL, sum(b, "j1", l.d, n_var, &l), F(k, inv_d));
    l.inv = ptc_kir_bind(k, B(k, PTC_KX_DIV, F(k, 1.0), U(k, PTC_KX_SQRT, B(k, PTC_KX_ADD, var, F(k, eps)))));
    ptc_kir_store(k, l.s, B(k, PTC_KX_MUL, l.r, I(k, 2)), l.mean);
    ptc_kir_store(k, l.s, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, l.r, I(k, 2)), I(k, 1)), l.inv);
    int me = ptc_kir_bind(k, B(k, PTC_KX_MUL, sum(b, "j2", l.d, ln_e, &l), F(k, inv_d)));
    int mexh = ptc_kir_bind(k, B(k, PTC_KX_MUL, sum(b, "j3", l.d, ln_exh, &l), F(k, inv_d)));
    int j = ptc_kir_for(k, "j", I(k, l.d), false);
    int v = B(k, PTC_KX_MUL, l.inv,
              B(k, PTC_KX_SUB, B(k, PTC_KX_SUB, ln_e(b, j, &l), me), B(k, PTC_KX_MUL, ln_xh(b, j, &l), mexh)));
    ptc_kir_store(k, dx, MA(k, l.r, l.d, j), v);
    ptc_kir_end(k);
    ptc_kir_end(k);

    if (two_pass(l.rows)) {
        int (*const body[2])(ob *, int, void *) = {ln_dg, ln_db};
        norm_param_grads(b, &l, 2 * l.rows, 2, body, (const int[]){1, 2}, it, ot);
        return;
    }
    begin(b);
    l.x = in(b, 0, &it[0]);
    l.dy = in(b, 2, &it[2]);
    l.s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, 2 * l.rows, false);
    int dg = out(b, 1, &ot[1]), db = out(b, 2, &ot[2]);
    k = b->k;
    l.j = par(b, "j", l.d);
    ptc_kir_store(k, dg, l.j, sum(b, "r0", l.rows, ln_dg, &l));
    ptc_kir_store(k, db, l.j, sum(b, "r1", l.rows, ln_db, &l));
    ptc_kir_end(k);
}


/* ---- optimizers (torch.optim, as the reference kernels and the fused AdamW) ---- */

static void build_adamw(ob *b, const ptc_attrs *at, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int p = in(b, 0, &it[0]), g = in(b, 1, &it[1]), m = in(b, 2, &it[2]), v = in(b, 3, &it[3]);
    int lrp = in(b, 4, &it[4]), stp = in(b, 5, &it[5]);
    int po = out(b, 0, &ot[0]), mo = out(b, 1, &ot[1]), vo = out(b, 2, &ot[2]);
    ptc_kir *k = b->k;
    int lr = ptc_kir_bind(k, LOADF(b, lrp, 0)), step = ptc_kir_bind(k, LOADF(b, stp, 0));
    /* beta^step = exp(step log beta) */
    int bc1 = ptc_kir_bind(k, B(k, PTC_KX_SUB, F(k, 1.0), U(k, PTC_KX_EXP, B(k, PTC_KX_MUL, step, F(k, log(at->beta1))))));
    int bc2 = ptc_kir_bind(k, B(k, PTC_KX_SUB, F(k, 1.0), U(k, PTC_KX_EXP, B(k, PTC_KX_MUL, step, F(k, log(at->beta2))))));
    int step_size = ptc_kir_bind(k, B(k, PTC_KX_DIV, lr, bc1));
    int bc2_sqrt = ptc_kir_bind(k, U(k, PTC_KX_SQRT, bc2));
    int i = par(b, "i", ptc_type_numel(&it[0]));
    int gi = ptc_kir_bind(k, L(b, g, i));
    int mm = ptc_kir_bind(k, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, F(k, at->beta1), L(b, m, i)), B(k, PTC_KX_MUL, F(k, 1 - at->beta1), gi)));
    int vv = ptc_kir_bind(k, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, F(k, at->beta2), L(b, v, i)),
                              B(k, PTC_KX_MUL, F(k, 1 - at->beta2), B(k, PTC_KX_MUL, gi, gi))));
    int denom = B(k, PTC_KX_ADD, B(k, PTC_KX_DIV, U(k, PTC_KX_SQRT, vv), bc2_sqrt), F(k, at->eps));
    int pd = B(k, PTC_KX_MUL, L(b, p, i), B(k, PTC_KX_SUB, F(k, 1.0), B(k, PTC_KX_MUL, lr, F(k, at->wd))));
    ptc_kir_store(k, po, i, B(k, PTC_KX_SUB, pd, B(k, PTC_KX_DIV, B(k, PTC_KX_MUL, step_size, mm), denom)));
    ptc_kir_store(k, mo, i, mm);
    ptc_kir_store(k, vo, i, vv);
    ptc_kir_end(k);
}

static void build_sgd(ob *b, const ptc_attrs *at, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int p = in(b, 0, &it[0]), g = in(b, 1, &it[1]), buf = in(b, 2, &it[2]), lrp = in(b, 3, &it[3]);
    int po = out(b, 0, &ot[0]), bo = out(b, 1, &ot[1]);
    ptc_kir *k = b->k;
    int lr = ptc_kir_bind(k, LOADF(b, lrp, 0));
    int i = par(b, "i", ptc_type_numel(&it[0]));
    int pi = ptc_kir_bind(k, L(b, p, i));
    int d = ptc_kir_bind(k, B(k, PTC_KX_ADD, L(b, g, i), B(k, PTC_KX_MUL, F(k, at->wd), pi)));
    if (at->momentum != 0) {
        d = ptc_kir_bind(k, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, F(k, at->momentum), L(b, buf, i)), d));
        ptc_kir_store(k, bo, i, d);
    } else {
        ptc_kir_store(k, bo, i, L(b, buf, i));
    }
    ptc_kir_store(k, po, i, B(k, PTC_KX_SUB, pi, B(k, PTC_KX_MUL, lr, d)));
    ptc_kir_end(k);
}

/* ---- along an axis: line (a, c) of an [outer, n, inner] view, element i at
 * a n inner + i inner + c ---- */

typedef struct line {
    int x, y;      /* two arrays read along the line (y may be -1) */
    int64_t n, inner;
    int base;      /* a n inner + c */
    int mx, s;     /* per-line values */
    int logy;
} line;
static int at_(ob *b, line *l, int i)
{
    return B(b->k, PTC_KX_ADD, l->base, l->inner > 1 ? B(b->k, PTC_KX_MUL, i, I(b->k, l->inner)) : i);
}
static int line_x(ob *b, int i, void *cx)
{
    line *l = cx;
    return L(b, l->x, at_(b, l, i));
}
static int line_nan(ob *b, int i, void *cx)
{
    int v = line_x(b, i, cx);
    return ptc_kx_select(b->k, B(b->k, PTC_KX_NE, v, v), F(b->k, 1.0), F(b->k, 0.0));
}
static int line_expm(ob *b, int i, void *cx)
{
    line *l = cx;
    return U(b->k, PTC_KX_EXP, B(b->k, PTC_KX_SUB, line_x(b, i, cx), l->mx));
}
static int line_dyy(ob *b, int i, void *cx) /* softmax: dy y; log_softmax: dy */
{
    line *l = cx;
    int dy = L(b, l->y, at_(b, l, i));
    return l->logy ? dy : B(b->k, PTC_KX_MUL, dy, line_x(b, i, cx));
}

/* a line loop over the [outer, n, inner] view of t: opens the parallel loop, sets l->base;
 * returns the line's index (a inner + c) */
static int open_lines(ob *b, line *l, const ptc_type *t, int axis)
{
    int64_t outer;
    axis_view(t, axis, &outer, &l->n, &l->inner);
    int o = par(b, "o", outer * l->inner);
    ptc_kir *k = b->k;
    l->base = ptc_kir_bind(k, l->inner > 1 ? B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, B(k, PTC_KX_DIV, o, I(k, l->inner)), I(k, l->n * l->inner)),
                                               B(k, PTC_KX_REM, o, I(k, l->inner)))
                                           : B(k, PTC_KX_MUL, o, I(k, l->n)));
    return o;
}

/* max along an axis; NaN wins, as in the reference (maxr alone would pass over it) */
static void build_max(ob *b, int axis, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    line l = {.x = in(b, 0, it), .y = -1};
    int y = out(b, 0, ot);
    int o = open_lines(b, &l, it, axis);
    ptc_kir *k = b->k;
    int m = reduce(b, PTC_KX_RMAX, "i", l.n, line_x, &l);
    int nans = reduce(b, PTC_KX_SUM, "i2", l.n, line_nan, &l);
    ptc_kir_store(k, y, o, ptc_kx_select(k, B(k, PTC_KX_LT, F(k, 0.0), nans), F(k, NAN), m));
    ptc_kir_end(k);
}

static void build_softmax(ob *b, bool log_out, int axis, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    line l = {.x = in(b, 0, it), .y = -1};
    int y = out(b, 0, ot);
    open_lines(b, &l, it, axis);
    ptc_kir *k = b->k;
    l.mx = ptc_kir_bind(k, reduce(b, PTC_KX_RMAX, "i0", l.n, line_x, &l));
    l.s = ptc_kir_bind(k, reduce(b, PTC_KX_SUM, "i1", l.n, line_expm, &l));
    int lse = ptc_kir_bind(k, B(k, PTC_KX_ADD, U(k, PTC_KX_LOG, l.s), l.mx));
    int i = ptc_kir_for(k, "i", I(k, l.n), false);
    int v = line_x(b, i, &l);
    ptc_kir_store(k, y, at_(b, &l, i), log_out ? B(k, PTC_KX_SUB, v, lse)
                                                : B(k, PTC_KX_DIV, U(k, PTC_KX_EXP, B(k, PTC_KX_SUB, v, l.mx)), l.s));
    ptc_kir_end(k);
    ptc_kir_end(k);
}

static void build_softmax_grad(ob *b, bool log_in, int axis, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    line l = {.x = in(b, 0, &it[0]), .y = in(b, 1, &it[1]), .logy = log_in};
    int dx = out(b, 0, ot);
    open_lines(b, &l, &it[0], axis);
    ptc_kir *k = b->k;
    int s = ptc_kir_bind(k, reduce(b, PTC_KX_SUM, "i0", l.n, line_dyy, &l));
    int i = ptc_kir_for(k, "i", I(k, l.n), false);
    int at = ptc_kir_bind(k, at_(b, &l, i));
    int yv = L(b, l.x, at), dy = L(b, l.y, at);
    ptc_kir_store(k, dx, at, log_in ? B(k, PTC_KX_SUB, dy, B(k, PTC_KX_MUL, U(k, PTC_KX_EXP, yv), s))
                                    : B(k, PTC_KX_MUL, yv, B(k, PTC_KX_SUB, dy, s)));
    ptc_kir_end(k);
    ptc_kir_end(k);
}

static void build_broadcast_to(ob *b, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    int x = in(b, 0, it), y = out(b, 0, ot);
    int i = par(b, "i", ptc_type_numel(ot));
    ptc_kir_store(b->k, y, i, L(b, x, ptc_kx_bcast_index(b->k, i, it, ot)));
    ptc_kir_end(b->k);
}

/* ---- norms over the last axis ---- */

static int n_sq(ob *b, int j, void *c)
{
    int v = n_x(b, j, c);
    return B(b->k, PTC_KX_MUL, v, v);
}
static int n_egx(ob *b, int j, void *c) /* dy g x */
{
    nrm *l = c;
    ptc_kir *k = b->k;
    return B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, L(b, l->dy, MA(k, l->r, l->d, j)), L(b, l->g, j)), n_x(b, j, c));
}
static int n_dgx(ob *b, int r, void *c) /* over rows: dy x inv */
{
    nrm *l = c;
    ptc_kir *k = b->k;
    int at = MA(k, r, l->d, l->j);
    return B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, L(b, l->dy, at), L(b, l->x, at)), L(b, l->s, r));
}

/* layernorm (x, g, b) and rmsnorm (x, g) */
static void build_norm(ob *b, bool rms, double eps, const ptc_type *it, const ptc_type *ot)
{
    nrm l = {.d = it[0].dims[it[0].rank - 1]};
    l.rows = ptc_type_numel(&it[0]) / l.d;
    begin(b);
    l.x = in(b, 0, &it[0]);
    l.g = in(b, 1, &it[1]);
    int bb = rms ? -1 : in(b, 2, &it[2]);
    int y = out(b, 0, ot);
    ptc_kir *k = b->k;
    l.r = par(b, "r", l.rows);
    double inv_d = 1.0 / (double)l.d;
    int inv;
    if (rms) {
        inv = ptc_kir_bind(k, B(k, PTC_KX_DIV, F(k, 1.0), U(k, PTC_KX_SQRT, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, sum(b, "j0", l.d, n_sq, &l), F(k, inv_d)), F(k, eps)))));
        l.mean = -1;
    } else {
        l.mean = ptc_kir_bind(k, B(k, PTC_KX_MUL, sum(b, "j0", l.d, n_x, &l), F(k, inv_d)));
        int var = B(k, PTC_KX_MUL, sum(b, "j1", l.d, n_var, &l), F(k, inv_d));
        inv = ptc_kir_bind(k, B(k, PTC_KX_DIV, F(k, 1.0), U(k, PTC_KX_SQRT, B(k, PTC_KX_ADD, var, F(k, eps)))));
    }
    int j = ptc_kir_for(k, "j", I(k, l.d), false);
    int xv = n_x(b, j, &l);
    int v = B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, rms ? xv : B(k, PTC_KX_SUB, xv, l.mean), inv), L(b, l.g, j));
    if (!rms)
        v = B(k, PTC_KX_ADD, v, L(b, bb, j));
    ptc_kir_store(k, y, MA(k, l.r, l.d, j), v);
    ptc_kir_end(k);
    ptc_kir_end(k);
}

/* rmsnorm_grad (x, g, dy) -> (dx, dg): dx = r e - x r^3 mean(e x) over rows (r into scratch),
 * then dg = sum over rows of dy x r over columns */
static void build_rmsnorm_grad(ob *b, double eps, const ptc_type *it, const ptc_type *ot)
{
    nrm l = {.d = it[0].dims[it[0].rank - 1]};
    l.rows = ptc_type_numel(&it[0]) / l.d;
    b->ok->scratch = l.rows;
    begin(b);
    l.x = in(b, 0, &it[0]);
    l.g = in(b, 1, &it[1]);
    l.dy = in(b, 2, &it[2]);
    int dx = out(b, 0, &ot[0]);
    l.s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, l.rows, true);
    ptc_kir *k = b->k;
    l.r = par(b, "r", l.rows);
    double inv_d = 1.0 / (double)l.d;
    int inv = ptc_kir_bind(k, B(k, PTC_KX_DIV, F(k, 1.0), U(k, PTC_KX_SQRT, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, sum(b, "j0", l.d, n_sq, &l), F(k, inv_d)), F(k, eps)))));
    ptc_kir_store(k, l.s, l.r, inv);
    int mex = ptc_kir_bind(k, B(k, PTC_KX_MUL, sum(b, "j1", l.d, n_egx, &l), F(k, inv_d)));
    int j = ptc_kir_for(k, "j", I(k, l.d), false);
    int at = ptc_kir_bind(k, MA(k, l.r, l.d, j));
    int e = B(k, PTC_KX_MUL, L(b, l.dy, at), L(b, l.g, j));
    int v = B(k, PTC_KX_SUB, B(k, PTC_KX_MUL, inv, e),
              B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, L(b, l.x, at), B(k, PTC_KX_MUL, B(k, PTC_KX_MUL, inv, inv), inv)), mex));
    ptc_kir_store(k, dx, at, v);
    ptc_kir_end(k);
    ptc_kir_end(k);

    if (two_pass(l.rows)) {
        int (*const body[1])(ob *, int, void *) = {n_dgx};
        norm_param_grads(b, &l, l.rows, 1, body, (const int[]){1}, it, ot);
        return;
    }
    begin(b);
    l.x = in(b, 0, &it[0]);
    l.dy = in(b, 2, &it[2]);
    l.s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, l.rows, false);
    int dg = out(b, 1, &ot[1]);
    k = b->k;
    l.j = par(b, "j", l.d);
    ptc_kir_store(k, dg, l.j, sum(b, "r0", l.rows, n_dgx, &l));
    ptc_kir_end(k);
}

/* ---- losses ---- */

/* cross_entropy (logits [.., C], targets) -> the mean over rows of logsumexp(row) - row[t]:
 * each row's loss into scratch, then their mean */
static void build_cross_entropy(ob *b, const ptc_type *it, const ptc_type *ot)
{
    row w = {.n = it[0].dims[it[0].rank - 1]};
    int64_t R = ptc_type_numel(&it[0]) / w.n;
    b->ok->scratch = R;
    begin(b);
    w.x = in(b, 0, &it[0]);
    int t = in(b, 1, &it[1]);
    int s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, R, true);
    ptc_kir *k = b->k;
    w.r = par(b, "r", R);
    w.m = ptc_kir_bind(k, reduce(b, PTC_KX_RMAX, "j0", w.n, row_x, &w));
    int se = ptc_kir_bind(k, reduce(b, PTC_KX_SUM, "j1", w.n, row_expm, &w));
    int tv = ptc_kir_bind(k, L(b, t, w.r));
    int ok = IN(k, tv, 0, w.n);
    int pick = L(b, w.x, MA(k, w.r, w.n, ptc_kx_select(k, ok, tv, I(k, 0))));
    int loss = B(k, PTC_KX_SUB, B(k, PTC_KX_ADD, U(k, PTC_KX_LOG, se), w.m), pick);
    ptc_kir_store(k, s, w.r, ptc_kx_select(k, ok, loss, F(k, NAN)));
    ptc_kir_end(k);

    begin(b);
    s = param(b, PTC_OPK_SCRATCH, "s", PTC_F32, R, false);
    int y = out(b, 0, ot);
    k = b->k;
    par(b, "o", 1);
    row all = {.x = s, .n = R, .r = I(k, 0)};
    ptc_kir_store(k, y, I(k, 0), B(k, PTC_KX_DIV, reduce(b, PTC_KX_SUM, "r", R, row_x, &all), F(k, (double)R)));
    ptc_kir_end(k);
}

static void build_cross_entropy_grad(ob *b, const ptc_type *it, const ptc_type *ot)
{
    row w = {.n = it[0].dims[it[0].rank - 1]};
    int64_t R = ptc_type_numel(&it[0]) / w.n;
    begin(b);
    w.x = in(b, 0, &it[0]);
    int t = in(b, 1, &it[1]), dl = in(b, 2, &it[2]), y = out(b, 0, ot);
    ptc_kir *k = b->k;
    int scale = ptc_kir_bind(k, B(k, PTC_KX_DIV, LOADF(b, dl, 0), F(k, (double)R)));
    w.r = par(b, "r", R);
    w.m = ptc_kir_bind(k, reduce(b, PTC_KX_RMAX, "j0", w.n, row_x, &w));
    int se = ptc_kir_bind(k, reduce(b, PTC_KX_SUM, "j1", w.n, row_expm, &w));
    int tv = ptc_kir_bind(k, L(b, t, w.r));
    int ok = ptc_kir_bind(k, IN(k, tv, 0, w.n));
    int j = ptc_kir_for(k, "j", I(k, w.n), false);
    int at = ptc_kir_bind(k, MA(k, w.r, w.n, j));
    int p = B(k, PTC_KX_DIV, U(k, PTC_KX_EXP, B(k, PTC_KX_SUB, L(b, w.x, at), w.m)), se);
    int hit = ptc_kx_select(k, B(k, PTC_KX_EQ, j, tv), F(k, 1.0), F(k, 0.0));
    int g = B(k, PTC_KX_MUL, B(k, PTC_KX_SUB, p, hit), scale);
    ptc_kir_store(k, y, at, ptc_kx_select(k, ok, g, F(k, NAN)));
    ptc_kir_end(k);
    ptc_kir_end(k);
}

/* rope over x [B, S, heads x dh]: pair (2j, 2j + 1) of a head at position p turns by
 * p base^(-2j/dh) (backward: by its negative) */
static void build_rope(ob *b, bool grad, int64_t heads, double base, const ptc_type *it,
                       const ptc_type *ot)
{
    int64_t S = it->dims[1], f = it->dims[2], dh = f / heads, half = dh / 2;
    int64_t pairs = ptc_type_numel(it) / 2;
    begin(b);
    int x = in(b, 0, it), y = out(b, 0, ot);
    ptc_kir *k = b->k;
    int q = par(b, "q", pairs);
    /* q = ((b S + p) heads + h) half + j */
    int j = B(k, PTC_KX_REM, q, I(k, half));
    int p = B(k, PTC_KX_REM, B(k, PTC_KX_DIV, q, I(k, heads * half)), I(k, S));
    int at = ptc_kir_bind(k, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, B(k, PTC_KX_DIV, q, I(k, half)), I(k, dh)),
                              B(k, PTC_KX_MUL, j, I(k, 2))));
    int freq = U(k, PTC_KX_EXP, B(k, PTC_KX_MUL, U(k, PTC_KX_FLOAT, j), F(k, -2.0 * log(base) / (double)dh)));
    int theta = ptc_kir_bind(k, B(k, PTC_KX_MUL, U(k, PTC_KX_FLOAT, p), freq));
    int c = ptc_kir_bind(k, U(k, PTC_KX_COS, theta)), sn = ptc_kir_bind(k, U(k, PTC_KX_SIN, theta));
    int x0 = ptc_kir_bind(k, L(b, x, at)), x1 = ptc_kir_bind(k, L(b, x, B(k, PTC_KX_ADD, at, I(k, 1))));
    if (grad) {
        ptc_kir_store(k, y, at, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, x0, c), B(k, PTC_KX_MUL, x1, sn)));
        ptc_kir_store(k, y, B(k, PTC_KX_ADD, at, I(k, 1)),
                      B(k, PTC_KX_SUB, B(k, PTC_KX_MUL, x1, c), B(k, PTC_KX_MUL, x0, sn)));
    } else {
        ptc_kir_store(k, y, at, B(k, PTC_KX_SUB, B(k, PTC_KX_MUL, x0, c), B(k, PTC_KX_MUL, x1, sn)));
        ptc_kir_store(k, y, B(k, PTC_KX_ADD, at, I(k, 1)),
                      B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, x0, sn), B(k, PTC_KX_MUL, x1, c)));
    }
    ptc_kir_end(k);
}

/* ---- more shape ops and losses ---- */

/* split along axis into nout equal parts: one loop over a part's elements storing each part */
static void build_split(ob *b, int axis, int nout, const ptc_type *it, const ptc_type *ot)
{
    int64_t outer, n, inner;
    axis_view(it, axis, &outer, &n, &inner);
    int64_t part = n / nout;
    begin(b);
    int x = in(b, 0, it), y[PTC_OPK_MAX_ARGS];
    for (int j = 0; j < nout; j++)
        y[j] = out(b, j, &ot[j]);
    ptc_kir *k = b->k;
    int i = par(b, "i", outer * part * inner);
    int a = ptc_kir_bind(k, B(k, PTC_KX_DIV, i, I(k, part * inner)));
    int r = ptc_kir_bind(k, B(k, PTC_KX_REM, i, I(k, part * inner)));
    for (int j = 0; j < nout; j++) /* x[(a n + j part) inner + r] */
        ptc_kir_store(k, y[j], i, L(b, x, B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, a, I(k, n * inner)),
                                           B(k, PTC_KX_ADD, r, I(k, j * part * inner)))));
    ptc_kir_end(k);
}

/* permute: result dim d is operand dim axes[d] */
static void build_permute(ob *b, const int64_t *axes, const ptc_type *it, const ptc_type *ot)
{
    int64_t sx[PTC_MAX_RANK], st = 1;
    for (int d = it->rank - 1; d >= 0; d--) {
        sx[d] = st;
        st *= it->dims[d];
    }
    begin(b);
    int x = in(b, 0, it), y = out(b, 0, ot);
    ptc_kir *k = b->k;
    int i = par(b, "i", ptc_type_numel(ot));
    int off = -1, rest = i;
    for (int d = it->rank - 1; d >= 0; d--) {
        int64_t od = it->dims[axes[d]];
        int term = B(k, PTC_KX_MUL, B(k, PTC_KX_REM, rest, I(k, od)), I(k, sx[axes[d]]));
        off = off < 0 ? term : B(k, PTC_KX_ADD, off, term);
        rest = B(k, PTC_KX_DIV, rest, I(k, od));
    }
    ptc_kir_store(k, y, i, L(b, x, off < 0 ? I(k, 0) : off));
    ptc_kir_end(k);
}

/* max_grad (x, dy) along an axis: dy to the first maximum of each line (the first NaN, where
 * there is one, as the reference picks), zeros elsewhere. Indices as floats: exact below 2^24. */
static int line_nanidx(ob *b, int i, void *cx) /* -i at a NaN, -n elsewhere */
{
    line *l = cx;
    int v = line_x(b, i, cx);
    return ptc_kx_select(b->k, B(b->k, PTC_KX_NE, v, v), U(b->k, PTC_KX_NEG, U(b->k, PTC_KX_FLOAT, i)),
                         F(b->k, -(double)l->n));
}
static int line_maxidx(ob *b, int i, void *cx) /* -i at the maximum, -n elsewhere */
{
    line *l = cx;
    return ptc_kx_select(b->k, B(b->k, PTC_KX_EQ, line_x(b, i, cx), l->mx),
                         U(b->k, PTC_KX_NEG, U(b->k, PTC_KX_FLOAT, i)), F(b->k, -(double)l->n));
}

static void build_max_grad(ob *b, int axis, const ptc_type *it, const ptc_type *ot)
{
    begin(b);
    line l = {.x = in(b, 0, &it[0]), .y = -1};
    int dy = in(b, 1, &it[1]), dx = out(b, 0, ot);
    int o = open_lines(b, &l, &it[0], axis);
    ptc_kir *k = b->k;
    l.mx = ptc_kir_bind(k, reduce(b, PTC_KX_RMAX, "i0", l.n, line_x, &l));
    int first_nan = ptc_kir_bind(k, U(k, PTC_KX_NEG, reduce(b, PTC_KX_RMAX, "i1", l.n, line_nanidx, &l)));
    int first_max = U(k, PTC_KX_NEG, reduce(b, PTC_KX_RMAX, "i2", l.n, line_maxidx, &l));
    int best = ptc_kir_bind(k, ptc_kx_select(k, B(k, PTC_KX_LT, first_nan, F(k, (double)l.n)), first_nan, first_max));
    int g = ptc_kir_bind(k, L(b, dy, o));
    int i = ptc_kir_for(k, "i", I(k, l.n), false);
    ptc_kir_store(k, dx, at_(b, &l, i), ptc_kx_select(k, B(k, PTC_KX_EQ, U(k, PTC_KX_FLOAT, i), best), g, F(k, 0.0)));
    ptc_kir_end(k);
    ptc_kir_end(k);
}

typedef struct two {
    int a, b;
} two;
static int sqdiff(ob *b, int i, void *cx)
{
    two *t = cx;
    int d = B(b->k, PTC_KX_SUB, L(b, t->a, i), L(b, t->b, i));
    return B(b->k, PTC_KX_MUL, d, d);
}

/* mse (a, b): the mean of (a - b)^2, one block's reduction */
static void build_mse(ob *b, const ptc_type *it, const ptc_type *ot)
{
    int64_t n = ptc_type_numel(&it[0]);
    begin(b);
    two t = {in(b, 0, &it[0]), in(b, 1, &it[1])};
    int y = out(b, 0, ot);
    par(b, "o", 1);
    ptc_kir_store(b->k, y, I(b->k, 0), B(b->k, PTC_KX_DIV, reduce(b, PTC_KX_SUM, "i", n, sqdiff, &t), F(b->k, (double)n)));
    ptc_kir_end(b->k);
}

/* ---- the table ---- */

/* every operand but except is a float (f32, or bf16/f16 storage: loads widen, stores round) */
static bool all_float(int n, const ptc_type *t, int except)
{
    for (int i = 0; i < n; i++)
        if (i != except && t[i].dtype != PTC_F32 && t[i].dtype != PTC_BF16 &&
            t[i].dtype != PTC_F16)
            return false;
    return true;
}

/* the operand of op that holds i32 ids or targets, or -1 */
static int ids_operand(ptc_op op)
{
    switch (op) {
    case PTC_OP_EMBEDDING:
    case PTC_OP_EMBEDDING_SHARD:
    case PTC_OP_CE_PICK:
    case PTC_OP_CE_GRAD_SHARD:
    case PTC_OP_CROSS_ENTROPY:
    case PTC_OP_CROSS_ENTROPY_GRAD: return 1;
    case PTC_OP_EMBEDDING_GRAD:
    case PTC_OP_EMBEDDING_GRAD_SHARD: return 0;
    default: return -1;
    }
}

/* the ops ptc_op_kernels_build takes (its switch's cases) */
static bool covered(ptc_op op)
{
    if (ptc_kx_op_pointwise(op))
        return true;
    switch (op) {
    case PTC_OP_CONST:
    case PTC_OP_FILL:
    case PTC_OP_SUMSQ:
    case PTC_OP_SUM:
    case PTC_OP_MEAN:
    case PTC_OP_SUM_TO:
    case PTC_OP_SLICE:
    case PTC_OP_PAD:
    case PTC_OP_CONCAT:
    case PTC_OP_RESHAPE:
    case PTC_OP_CAST:
    case PTC_OP_SPLIT:
    case PTC_OP_PERMUTE:
    case PTC_OP_TRANSPOSE:
    case PTC_OP_MAX_GRAD:
    case PTC_OP_MSE:
    case PTC_OP_EMBEDDING:
    case PTC_OP_EMBEDDING_GRAD:
    case PTC_OP_CLIP_COEF:
    case PTC_OP_LAYERNORM_GRAD:
    case PTC_OP_PARTIALIZE:
    case PTC_OP_SHARD_SLICE:
    case PTC_OP_EMBEDDING_SHARD:
    case PTC_OP_EMBEDDING_GRAD_SHARD:
    case PTC_OP_CE_SUMEXP:
    case PTC_OP_CE_PICK:
    case PTC_OP_CE_LOSS:
    case PTC_OP_CE_GRAD_SHARD:
    case PTC_OP_ADAMW_UPDATE:
    case PTC_OP_SGD_UPDATE:
    case PTC_OP_MAX:
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
    case PTC_OP_SOFTMAX_GRAD:
    case PTC_OP_LOG_SOFTMAX_GRAD:
    case PTC_OP_BROADCAST_TO:
    case PTC_OP_LAYERNORM:
    case PTC_OP_RMSNORM:
    case PTC_OP_RMSNORM_GRAD:
    case PTC_OP_CROSS_ENTROPY:
    case PTC_OP_CROSS_ENTROPY_GRAD:
    case PTC_OP_ROPE:
    case PTC_OP_ROPE_GRAD: return true;
    default: return false;
    }
}

int ptc_op_kernels_build(const char *name, ptc_op op, const ptc_attrs *at, int coord, int nin,
                         const ptc_type *it, int nout, const ptc_type *ot, ptc_op_kernels *ok,
                         char *why, size_t whyn)
{
    memset(ok, 0, sizeof *ok);
    ob b = {.ok = ok, .name = name};
    if (!covered(op)) {
        ptc_fmt(why, whyn, "op %s has no generated kernel yet", ptc_ops[op].name);
        return -1;
    }
    int ids = ids_operand(op);
    /* (a shard_slice of i32 moves ids: expert parallelism's routes) */
    bool ints = op == PTC_OP_SHARD_SLICE && it[0].dtype == PTC_I32 && ot[0].dtype == PTC_I32;
    if (!ints && (!all_float(nin, it, ids) || !all_float(nout, ot, -1) ||
                  (ids >= 0 && it[ids].dtype != PTC_I32))) {
        ptc_fmt(why, whyn, "op %s over integer operands has no generated kernel", ptc_ops[op].name);
        return -1;
    }
    if (nin > PTC_OPK_MAX_ARGS - 2 || nout > PTC_OPK_MAX_ARGS - 2) {
        ptc_fmt(why, whyn, "op %s with %d operands has no generated kernel", ptc_ops[op].name, nin);
        return -1;
    }
    int rc = 0;
    if (ptc_kx_op_pointwise(op)) {
        build_pointwise(&b, op, nin, it, &ot[0]);
    } else {
        switch (op) {
        case PTC_OP_CONST:
        case PTC_OP_FILL: ptc_kop_const(&b, at->value, &ot[0]); break;
        case PTC_OP_SUMSQ: build_sumsq(&b, &it[0], &ot[0]); break;
        case PTC_OP_SUM:
        case PTC_OP_MEAN: build_reduce(&b, op == PTC_OP_MEAN, (int)at->axis, &it[0], &ot[0]); break;
        case PTC_OP_SUM_TO: rc = build_sum_to(&b, &it[0], &ot[0], why, whyn); break;
        case PTC_OP_SLICE: build_slice(&b, (int)at->axis, at->start, &it[0], &ot[0]); break;
        case PTC_OP_PAD: build_pad(&b, (int)at->axis, at->start, &it[0], &ot[0]); break;
        case PTC_OP_CONCAT: build_concat(&b, nin, (int)at->axis, it, &ot[0]); break;
        case PTC_OP_RESHAPE:
        case PTC_OP_CAST: { /* (a cast: the load widens, the store rounds) */
            ptc_type fi = {.dtype = it[0].dtype, .rank = 1, .dims = {ptc_type_numel(&it[0])}};
            ptc_type fo = {.dtype = ot[0].dtype, .rank = 1, .dims = {ptc_type_numel(&ot[0])}};
            ptc_kop_copy(&b, &fi, &fo);
            break;
        }
        case PTC_OP_EMBEDDING: build_embedding(&b, &it[0], &it[1], &ot[0]); break;
        case PTC_OP_EMBEDDING_GRAD:
            ptc_kop_embedding_grad_shard(&b, 1, 0, &it[0], &it[1], &ot[0]);
            break;
        case PTC_OP_CLIP_COEF: build_clip_coef(&b, it, &ot[0]); break;
        case PTC_OP_LAYERNORM_GRAD: build_layernorm_grad(&b, at->eps, it, ot); break;
        case PTC_OP_PARTIALIZE: ptc_kop_partialize(&b, coord, &it[0], &ot[0]); break;
        case PTC_OP_SHARD_SLICE: ptc_kop_shard_slice(&b, at, coord, &it[0], &ot[0]); break;
        case PTC_OP_EMBEDDING_SHARD:
            ptc_kop_embedding_shard(&b, at->group, coord, &it[0], &it[1], &ot[0]);
            break;
        case PTC_OP_EMBEDDING_GRAD_SHARD:
            ptc_kop_embedding_grad_shard(&b, at->group, coord, &it[0], &it[1], &ot[0]);
            break;
        case PTC_OP_CE_SUMEXP: ptc_kop_ce_sumexp(&b, &it[0], &it[1], &ot[0]); break;
        case PTC_OP_CE_PICK: ptc_kop_ce_pick(&b, at->group, coord, &it[0], &it[1], &ot[0]); break;
        case PTC_OP_CE_LOSS: ptc_kop_ce_loss(&b, it, &ot[0]); break;
        case PTC_OP_CE_GRAD_SHARD: ptc_kop_ce_grad_shard(&b, at->group, coord, it, &ot[0]); break;
        case PTC_OP_ADAMW_UPDATE: build_adamw(&b, at, it, ot); break;
        case PTC_OP_SGD_UPDATE: build_sgd(&b, at, it, ot); break;
        case PTC_OP_MAX: build_max(&b, (int)at->axis, &it[0], &ot[0]); break;
        case PTC_OP_SOFTMAX:
        case PTC_OP_LOG_SOFTMAX:
            build_softmax(&b, op == PTC_OP_LOG_SOFTMAX, (int)at->axis, &it[0], &ot[0]);
            break;
        case PTC_OP_SOFTMAX_GRAD:
        case PTC_OP_LOG_SOFTMAX_GRAD:
            build_softmax_grad(&b, op == PTC_OP_LOG_SOFTMAX_GRAD, (int)at->axis, it, &ot[0]);
            break;
        case PTC_OP_BROADCAST_TO: build_broadcast_to(&b, &it[0], &ot[0]); break;
        case PTC_OP_LAYERNORM:
        case PTC_OP_RMSNORM: build_norm(&b, op == PTC_OP_RMSNORM, at->eps, it, &ot[0]); break;
        case PTC_OP_RMSNORM_GRAD: build_rmsnorm_grad(&b, at->eps, it, ot); break;
        case PTC_OP_CROSS_ENTROPY: build_cross_entropy(&b, it, &ot[0]); break;
        case PTC_OP_CROSS_ENTROPY_GRAD: build_cross_entropy_grad(&b, it, &ot[0]); break;
        case PTC_OP_ROPE:
        case PTC_OP_ROPE_GRAD:
            build_rope(&b, op == PTC_OP_ROPE_GRAD, at->heads, at->base, &it[0], &ot[0]);
            break;
        case PTC_OP_SPLIT: build_split(&b, (int)at->axis, nout, &it[0], ot); break;
        case PTC_OP_PERMUTE: build_permute(&b, at->shape, &it[0], &ot[0]); break;
        case PTC_OP_TRANSPOSE: { /* the last two dims swapped */
            int64_t axes[PTC_MAX_RANK];
            for (int d = 0; d < it[0].rank; d++)
                axes[d] = d;
            if (it[0].rank >= 2) {
                axes[it[0].rank - 1] = it[0].rank - 2;
                axes[it[0].rank - 2] = it[0].rank - 1;
            }
            build_permute(&b, axes, &it[0], &ot[0]);
            break;
        }
        case PTC_OP_MAX_GRAD: build_max_grad(&b, (int)at->axis, it, &ot[0]); break;
        case PTC_OP_MSE: build_mse(&b, it, &ot[0]); break;
        default:
            ptc_fmt(why, whyn, "op %s has no generated kernel yet", ptc_ops[op].name);
            rc = -1;
        }
    }
    for (int q = 0; q < ok->n && rc == 0; q++)
        rc = ptc_kir_verify(ok->k[q], why, whyn);
    if (rc < 0)
        ptc_op_kernels_free(ok);
    return rc;
}

void ptc_op_kernels_free(ptc_op_kernels *ok)
{
    for (int q = 0; q < ok->n; q++)
        ptc_kir_free(ok->k[q]);
    memset(ok, 0, sizeof *ok);
}
