/* kir_ops_rank.c - the ops whose kernels depend on the rank: a tensor-parallel rank's shard of a
 * slice, an embedding or the cross-entropy pieces, built for coordinate c on the op's mesh axis
 * (see kir_ops.h; the builder's toolkit is kir_ops_build.h). */
#include <math.h>
#include <string.h>

#include "kir_ops_build.h"

/* ---- rank-dependent ops (c: the rank's coordinate on the op's mesh axis) ---- */

void ptc_kop_partialize(ob *b, int c, const ptc_type *it, const ptc_type *ot)
{
    if (c != 0) {
        ptc_kop_const(b, 0.0, ot);
        return;
    }
    ptc_kop_copy(b, it, ot);
}

void ptc_kop_shard_slice(ob *b, const ptc_attrs *at, int c, const ptc_type *it, const ptc_type *ot)
{
    int d = (int)at->axis;
    int64_t groups = at->n > 1 ? at->n : 1, T = at->group, outer, D, inner;
    axis_view(it, d, &outer, &D, &inner);
    int64_t per = D / groups / T, blk = groups * per * inner;
    begin(b);
    int x = in(b, 0, it), y = out(b, 0, ot);
    ptc_kir *k = b->k;
    int i = par(b, "i", ptc_type_numel(ot));
    int o = B(k, PTC_KX_DIV, i, I(k, blk)), r = B(k, PTC_KX_REM, i, I(k, blk));
    int g = B(k, PTC_KX_DIV, r, I(k, per * inner)), q = B(k, PTC_KX_REM, r, I(k, per * inner));
    /* (o D + g D/groups + c per) inner + q */
    int src = B(k, PTC_KX_ADD,
                B(k, PTC_KX_MUL,
                  B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, o, I(k, D)),
                    B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, g, I(k, D / groups)), I(k, c * per))),
                  I(k, inner)),
                q);
    ptc_kir_store(k, y, i, L(b, x, src));
    ptc_kir_end(k);
}

/* embedding over this rank's rows [c rows, (c + 1) rows) of a table of rows x group: zero for an
 * id another rank holds, NaN for one outside the whole table */
void ptc_kop_embedding_shard(ob *b, int64_t group, int c, const ptc_type *tt, const ptc_type *ti,
                             const ptc_type *ot)
{
    begin(b);
    int t = in(b, 0, tt), ids = in(b, 1, ti), y = out(b, 0, ot);
    int64_t rows = tt->dims[0], d = tt->dims[1], V = rows * group;
    ptc_kir *k = b->k;
    int e = par(b, "e", ptc_type_numel(ot));
    int id = ptc_kir_bind(k, L(b, ids, B(k, PTC_KX_DIV, e, I(k, d))));
    int r = ptc_kir_bind(k, B(k, PTC_KX_SUB, id, I(k, c * rows)));
    int mine = IN(k, r, 0, rows);
    int src = ptc_kx_select(k, mine, MA(k, r, d, B(k, PTC_KX_REM, e, I(k, d))), I(k, 0));
    int v = ptc_kx_select(k, mine, L(b, t, src), F(k, 0.0));
    ptc_kir_store(k, y, e, ptc_kx_select(k, IN(k, id, 0, V), v, F(k, NAN)));
    ptc_kir_end(k);
}

/* The embedding's gradient, zeros first: rows [c rows, (c + 1) rows) of a vocabulary of
 * V = rows x group. A thread per (block of rows, column) walks the tokens in order and adds those
 * whose id falls in its block: each element has one writer, and its sum the tokens' order, as
 * the reference's. Blocks: 64 (or one a row), so that a GPU has 64 x d threads rather than d,
 * each with a sixty-fourth of the read-modify-writes (GPT-2 124M on an H200: 5.9 ms a step with
 * a thread a column). `for u < (owner == block ? 1 : 0)` is the kernel IR's conditional. An id
 * outside the vocabulary puts NaN in row 0 (block 0), which the loss then shows. */
void ptc_kop_embedding_grad_shard(ob *b, int64_t group, int c, const ptc_type *ti,
                                  const ptc_type *tdy, const ptc_type *ot)
{
    int64_t rows = ot->dims[0], d = ot->dims[1], n = ptc_type_numel(ti), V = rows * group;
    int64_t nb = rows < 64 ? rows : 64, per = (rows + nb - 1) / nb;
    nb = (rows + per - 1) / per; /* every block holds a row */
    ptc_kop_const(b, 0.0, ot);
    begin(b);
    int ids = in(b, 0, ti), dy = in(b, 1, tdy), y = out(b, 0, ot);
    ptc_kir *k = b->k;
    int t = par(b, "t", nb * d);
    int blk = ptc_kir_bind(k, B(k, PTC_KX_DIV, t, I(k, d)));
    int j = ptc_kir_bind(k, B(k, PTC_KX_REM, t, I(k, d)));
    int i = ptc_kir_for(k, "i", I(k, n), false);
    int id = ptc_kir_bind(k, L(b, ids, i));
    int r = ptc_kir_bind(k, B(k, PTC_KX_SUB, id, I(k, c * rows)));
    int valid = ptc_kir_bind(k, IN(k, id, 0, V)), mine = ptc_kir_bind(k, IN(k, r, 0, rows));
    int owner = ptc_kx_select(k, valid,
                              ptc_kx_select(k, mine, B(k, PTC_KX_DIV, r, I(k, per)), I(k, -1)),
                              I(k, 0));
    ptc_kir_for(k, "u", ptc_kx_select(k, B(k, PTC_KX_EQ, owner, blk), I(k, 1), I(k, 0)), false);
    int at = ptc_kir_bind(k, ptc_kx_select(k, mine, MA(k, r, d, j), j));
    int add = ptc_kx_select(k, valid, L(b, dy, MA(k, i, d, j)), F(k, NAN));
    ptc_kir_store(k, y, at, B(k, PTC_KX_ADD, L(b, y, at), add));
    ptc_kir_end(k);
    ptc_kir_end(k);
    ptc_kir_end(k);
}

/* the vocabulary-parallel cross-entropy pieces: logits [R, V] are this rank's classes
 * [c V, (c + 1) V) of V x group (rows through row_x and row_expm) */
void ptc_kop_ce_sumexp(ob *b, const ptc_type *tl, const ptc_type *tm, const ptc_type *ot)
{
    row w = {.n = tl->dims[tl->rank - 1]};
    int64_t R = ptc_type_numel(tl) / w.n;
    begin(b);
    w.x = in(b, 0, tl);
    int m = in(b, 1, tm), y = out(b, 0, ot);
    w.r = par(b, "r", R);
    w.m = ptc_kir_bind(b->k, L(b, m, w.r));
    ptc_kir_store(b->k, y, w.r, reduce(b, PTC_KX_SUM, "j", w.n, row_expm, &w));
    ptc_kir_end(b->k);
}

void ptc_kop_ce_pick(ob *b, int64_t group, int c, const ptc_type *tl, const ptc_type *tt,
                     const ptc_type *ot)
{
    int64_t V = tl->dims[tl->rank - 1], R = ptc_type_numel(tl) / V;
    begin(b);
    int l = in(b, 0, tl), t = in(b, 1, tt), y = out(b, 0, ot);
    ptc_kir *k = b->k;
    int r = par(b, "r", R);
    int tv = ptc_kir_bind(k, L(b, t, r));
    int j = ptc_kir_bind(k, B(k, PTC_KX_SUB, tv, I(k, c * V)));
    int mine = IN(k, j, 0, V);
    int v =
        ptc_kx_select(k, mine, L(b, l, ptc_kx_select(k, mine, MA(k, r, V, j), I(k, 0))), F(k, 0.0));
    ptc_kir_store(k, y, r, ptc_kx_select(k, IN(k, tv, 0, V * group), v, F(k, NAN)));
    ptc_kir_end(k);
}

typedef struct cel {
    int M, S, T;
} cel;
static int cel_body(ob *b, int r, void *cx)
{
    cel *c = cx;
    ptc_kir *k = b->k;
    return B(k, PTC_KX_SUB, B(k, PTC_KX_ADD, U(k, PTC_KX_LOG, L(b, c->S, r)), L(b, c->M, r)),
             L(b, c->T, r));
}

void ptc_kop_ce_loss(ob *b, const ptc_type *it, const ptc_type *ot)
{
    int64_t R = ptc_type_numel(&it[0]);
    begin(b);
    cel c = {in(b, 0, &it[0]), in(b, 1, &it[1]), in(b, 2, &it[2])};
    int y = out(b, 0, ot);
    par(b, "o", 1);
    ptc_kir_store(
        b->k, y, I(b->k, 0),
        B(b->k, PTC_KX_DIV, reduce(b, PTC_KX_SUM, "r", R, cel_body, &c), F(b->k, (double)R)));
    ptc_kir_end(b->k);
}

void ptc_kop_ce_grad_shard(ob *b, int64_t group, int c, const ptc_type *it, const ptc_type *ot)
{
    int64_t V = it[0].dims[it[0].rank - 1], R = ptc_type_numel(&it[0]) / V;
    begin(b);
    int l = in(b, 0, &it[0]), t = in(b, 1, &it[1]), M = in(b, 2, &it[2]), S = in(b, 3, &it[3]);
    int sc = in(b, 4, &it[4]), y = out(b, 0, ot);
    ptc_kir *k = b->k;
    int e = par(b, "e", R * V);
    int r = ptc_kir_bind(k, B(k, PTC_KX_DIV, e, I(k, V))), j = B(k, PTC_KX_REM, e, I(k, V));
    int tv = ptc_kir_bind(k, L(b, t, r));
    int p =
        B(k, PTC_KX_DIV, U(k, PTC_KX_EXP, B(k, PTC_KX_SUB, L(b, l, e), L(b, M, r))), L(b, S, r));
    int hit = ptc_kx_select(k, B(k, PTC_KX_EQ, tv, B(k, PTC_KX_ADD, j, I(k, c * V))), F(k, 1.0),
                            F(k, 0.0));
    int g = B(k, PTC_KX_MUL, B(k, PTC_KX_SUB, p, hit),
              B(k, PTC_KX_DIV, LOADF(b, sc, 0), F(k, (double)R)));
    ptc_kir_store(k, y, e, ptc_kx_select(k, IN(k, tv, 0, V * group), g, F(k, NAN)));
    ptc_kir_end(k);
}
