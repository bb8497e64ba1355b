/* kir_ops_build.h - the builder's toolkit shared by kir_ops.c and kir_ops_rank.c (internal to
 * ptc_kir): short names for the kernel IR's expressions, and the state of an op's kernels as they
 * are built (ob: the op's kernel table, the kernel under construction, its parameters). */
#ifndef PTC_KIR_OPS_BUILD_H
#define PTC_KIR_OPS_BUILD_H

#include <stdio.h>

#include "kir_ops.h"

/* ---- expressions ---- */

static inline int F(ptc_kir *k, double v)
{
    return ptc_kx_f(k, v);
}
static inline int I(ptc_kir *k, int64_t v)
{
    return ptc_kx_i(k, v);
}
static inline int B(ptc_kir *k, ptc_kx_kind kind, int x, int y)
{
    return ptc_kx_bin(k, kind, x, y);
}
static inline int U(ptc_kir *k, ptc_kx_kind kind, int x)
{
    return ptc_kx_un(k, kind, x);
}
/* x * m + y on i64 */
static inline int MA(ptc_kir *k, int x, int64_t m, int y)
{
    return B(k, PTC_KX_ADD, B(k, PTC_KX_MUL, x, I(k, m)), y);
}

/* ---- building ---- */

typedef struct ob {
    ptc_op_kernels *ok;
    const char *name;
    ptc_kir *k; /* the kernel being built */
    int q;      /* its number */
    int np;
} ob;

static inline void begin(ob *b)
{
    char nm[200];
    snprintf(nm, sizeof nm, "%s_%d", b->name, b->ok->n);
    b->q = b->ok->n++;
    b->k = b->ok->k[b->q] = ptc_kir_new(nm);
    b->np = 0;
}

/* a parameter bound to what (PTC_OPK_IN + i, ...) */
static inline int param(ob *b, int what, const char *nm, ptc_dtype dt, int64_t numel, bool out)
{
    PTC_ASSERT(b->np < PTC_OPK_MAX_ARGS);
    b->ok->arg[b->q][b->np++] = what;
    return ptc_kir_param(b->k, nm, dt, numel, out, -1);
}

static inline int in(ob *b, int i, const ptc_type *t)
{
    char nm[16];
    snprintf(nm, sizeof nm, "x%d", i);
    return param(b, PTC_OPK_IN + i, nm, t->dtype, ptc_type_numel(t), false);
}

static inline int out(ob *b, int j, const ptc_type *t)
{
    char nm[16];
    snprintf(nm, sizeof nm, "y%d", j);
    return param(b, PTC_OPK_OUT + j, nm, t->dtype, ptc_type_numel(t), true);
}

static inline int L(ob *b, int p, int idx)
{
    return ptc_kx_load(b->k, p, idx);
}

/* for v < n parallel: returns the index expression */
static inline int par(ob *b, const char *v, int64_t n)
{
    return ptc_kir_for(b->k, v, ptc_kx_i(b->k, n), true);
}

/* a reduction of body(b, index, ctx) over n, by kind (PTC_KX_SUM or PTC_KX_RMAX) */
static inline int reduce(ob *b, ptc_kx_kind kind, const char *v, int64_t n,
                         int (*body)(ob *, int, void *), void *ctx)
{
    int var = ptc_kir_var(b->k, v, PTC_KT_I64);
    int e = body(b, ptc_kx_v(b->k, var), ctx);
    return ptc_kx_reduce(b->k, kind, var, ptc_kx_i(b->k, n), e);
}

static inline int sum(ob *b, const char *v, int64_t n, int (*body)(ob *, int, void *), void *ctx)
{
    return reduce(b, PTC_KX_SUM, v, n, body, ctx);
}

static inline void axis_view(const ptc_type *t, int axis, int64_t *outer, int64_t *n,
                             int64_t *inner)
{
    *outer = *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= t->dims[i];
    for (int i = axis + 1; i < t->rank; i++)
        *inner *= t->dims[i];
    *n = t->dims[axis];
}

/* ---- more helpers ---- */

static inline int NOT_(ptc_kir *k)
{
    return B(k, PTC_KX_LT, I(k, 1), I(k, 0)); /* false */
}
/* a && b (bools) */
static inline int AND(ptc_kir *k, int a, int b)
{
    return ptc_kx_select(k, a, b, NOT_(k));
}
/* lo <= v < hi (i64) */
static inline int IN(ptc_kir *k, int v, int64_t lo, int64_t hi)
{
    return AND(k, B(k, PTC_KX_LE, I(k, lo), v), B(k, PTC_KX_LT, v, I(k, hi)));
}
static inline int LOADF(ob *b, int p, int64_t i)
{
    return L(b, p, I(b->k, i));
}

/* a row r of n elements of array x, and a per-row value m (the max): x, and exp(x - m) */
typedef struct row {
    int x, m;  /* the rows' array, a per-row value (max) */
    int64_t n; /* row length */
    int r;
} row;
static inline int row_expm(ob *b, int j, void *cx)
{
    row *w = cx;
    return U(b->k, PTC_KX_EXP, B(b->k, PTC_KX_SUB, L(b, w->x, MA(b->k, w->r, w->n, j)), w->m));
}
static inline int row_x(ob *b, int j, void *cx)
{
    row *w = cx;
    return L(b, w->x, MA(b->k, w->r, w->n, j));
}

/* builders kir_ops.c shares with kir_ops_rank.c */
void ptc_kop_const(ob *b, double value, const ptc_type *ot);
void ptc_kop_copy(ob *b, const ptc_type *it, const ptc_type *ot);

/* the ops whose kernels depend on the rank's coordinate c on their mesh axis (kir_ops_rank.c) */
void ptc_kop_partialize(ob *b, int c, const ptc_type *it, const ptc_type *ot);
void ptc_kop_shard_slice(ob *b, const ptc_attrs *at, int c, const ptc_type *it, const ptc_type *ot);
void ptc_kop_embedding_shard(ob *b, int64_t group, int c, const ptc_type *tt, const ptc_type *ti,
                             const ptc_type *ot);
void ptc_kop_embedding_grad_shard(ob *b, int64_t group, int c, const ptc_type *ti,
                                  const ptc_type *tdy, const ptc_type *ot);
void ptc_kop_ce_sumexp(ob *b, const ptc_type *tl, const ptc_type *tm, const ptc_type *ot);
void ptc_kop_ce_pick(ob *b, int64_t group, int c, const ptc_type *tl, const ptc_type *tt,
                     const ptc_type *ot);
void ptc_kop_ce_loss(ob *b, const ptc_type *it, const ptc_type *ot);
void ptc_kop_ce_grad_shard(ob *b, int64_t group, int c, const ptc_type *it, const ptc_type *ot);

#endif
