/* kir_attention.c - attention forward and backward as kernels of the kernel IR (see
 * kir_attention.h). */
#include "kir_attention.h"

#include <float.h>
#include <math.h>
#include <stdio.h>

#include "util.h"

typedef struct at {
    ptc_kir *k;
    const ptc_kir_attn *a;
    int64_t ratio, gd, hd; /* H / G, G * dh, H * dh */
    double scale;
    int q, kp, v, dy, lse, dsum; /* parameters (-1: not this kernel's) */
} at;

static int I(at *t, int64_t v)
{
    return ptc_kx_i(t->k, v);
}
static int F(at *t, double v)
{
    return ptc_kx_f(t->k, v);
}
static int B(at *t, ptc_kx_kind kind, int x, int y)
{
    return ptc_kx_bin(t->k, kind, x, y);
}
static int add(at *t, int x, int y)
{
    return B(t, PTC_KX_ADD, x, y);
}
static int mul(at *t, int x, int y)
{
    return B(t, PTC_KX_MUL, x, y);
}
static int ld(at *t, int param, int index)
{
    return ptc_kx_load(t->k, param, index);
}
static int let(at *t, int value)
{
    return ptc_kir_bind(t->k, value);
}

/* sum over the head dimension of p1[o1 + e] * p2[o2 + e] */
static int dot(at *t, int p1, int o1, int p2, int o2)
{
    int e = ptc_kir_var(t->k, NULL, PTC_KT_I64), ev = ptc_kx_v(t->k, e);
    return ptc_kx_reduce(t->k, PTC_KX_SUM, e, I(t, t->a->head_dim),
                         mul(t, ld(t, p1, add(t, o1, ev)), ld(t, p2, add(t, o2, ev))));
}

/* the scaled score of the query row at qo and the key row at ko */
static int score(at *t, int qo, int ko)
{
    return mul(t, dot(t, t->q, qo, t->kp, ko), F(t, t->scale));
}

/* for d < head_dim { p[base + d] = value(d) } with value given as a callback's expression */
typedef int (*row_fn)(at *t, int d, const int *ctx);
static void row_store(at *t, const char *var, int param, int base, row_fn value, const int *ctx)
{
    int d = ptc_kir_for(t->k, var, I(t, t->a->head_dim), false);
    ptc_kir_store(t->k, param, base >= 0 ? add(t, base, d) : d, value(t, d, ctx));
    ptc_kir_end(t->k);
}
static int zero(at *t, int d, const int *ctx)
{
    (void)d, (void)ctx;
    return F(t, 0.0);
}

/* a query row's part: r over B*H*S names batch b, head h, position i; qo its row of q, kb the
 * first key row of its kv head, n the keys it sees */
typedef struct qrow {
    int r, qo, kb, n;
} qrow;

static qrow query_row(at *t)
{
    const ptc_kir_attn *a = t->a;
    qrow w;
    w.r = ptc_kir_for(t->k, "r", I(t, a->batch * a->heads * a->seq), true);
    int b = let(t, B(t, PTC_KX_DIV, w.r, I(t, a->heads * a->seq)));
    int h = let(t, B(t, PTC_KX_REM, B(t, PTC_KX_DIV, w.r, I(t, a->seq)), I(t, a->heads)));
    int i = let(t, B(t, PTC_KX_REM, w.r, I(t, a->seq)));
    int kh = let(t, B(t, PTC_KX_DIV, h, I(t, t->ratio)));
    w.qo = let(t, add(t, mul(t, add(t, mul(t, b, I(t, a->seq)), i), I(t, t->hd)),
                      mul(t, h, I(t, a->head_dim))));
    w.kb = let(t, add(t, mul(t, b, I(t, a->kv_seq * t->gd)), mul(t, kh, I(t, a->head_dim))));
    w.n =
        a->causal ? let(t, B(t, PTC_KX_MIN, add(t, i, I(t, 1)), I(t, a->kv_seq))) : I(t, a->kv_seq);
    return w;
}

/* acc[d] * c + p * v[krow + d] (ctx: acc, c, p, krow) */
static int fwd_acc(at *t, int d, const int *c)
{
    return add(t, mul(t, ld(t, c[0], d), c[1]), mul(t, c[2], ld(t, t->v, add(t, c[3], d))));
}
/* acc[d] / l (ctx: acc, l) */
static int fwd_out(at *t, int d, const int *c)
{
    return B(t, PTC_KX_DIV, ld(t, c[0], d), c[1]);
}
/* acc[d] + g * x[row + d] (ctx: acc, g, x, row) */
static int axpy(at *t, int d, const int *c)
{
    return add(t, ld(t, c[0], d), mul(t, c[1], ld(t, c[2], add(t, c[3], d))));
}
/* acc[d] (ctx: acc) */
static int copy(at *t, int d, const int *c)
{
    return ld(t, c[0], d);
}

static void build_fwd(at *t, int o)
{
    ptc_kir *k = t->k;
    int acc = ptc_kir_local(k, "acc", t->a->head_dim), st = ptc_kir_local(k, "st", 2);
    qrow w = query_row(t);
    ptc_kir_store(k, st, I(t, 0), F(t, -FLT_MAX)); /* the running maximum */
    ptc_kir_store(k, st, I(t, 1), F(t, 0.0));      /* the running sum */
    row_store(t, "d0", acc, -1, zero, NULL);
    int j = ptc_kir_for(k, "j", w.n, false);
    int krow = let(t, add(t, w.kb, mul(t, j, I(t, t->gd))));
    int s = let(t, score(t, w.qo, krow));
    int mo = let(t, ld(t, st, I(t, 0)));
    int mn = let(t, B(t, PTC_KX_MAX, mo, s));
    int c = let(t, ptc_kx_un(k, PTC_KX_EXP, B(t, PTC_KX_SUB, mo, mn)));
    int p = let(t, ptc_kx_un(k, PTC_KX_EXP, B(t, PTC_KX_SUB, s, mn)));
    ptc_kir_store(k, st, I(t, 1), add(t, mul(t, ld(t, st, I(t, 1)), c), p));
    ptc_kir_store(k, st, I(t, 0), mn);
    row_store(t, "d1", acc, -1, fwd_acc, (const int[]){acc, c, p, krow});
    ptc_kir_end(k);
    int l = let(t, ld(t, st, I(t, 1)));
    row_store(t, "d2", o, w.qo, fwd_out, (const int[]){acc, l});
    ptc_kir_end(k);
}

static void build_stats(at *t)
{
    ptc_kir *k = t->k;
    qrow w = query_row(t);
    int j0 = ptc_kir_var(k, "j0", PTC_KT_I64), j1 = ptc_kir_var(k, "j1", PTC_KT_I64);
    int j2 = ptc_kir_var(k, "j2", PTC_KT_I64);
    int k0 = add(t, w.kb, mul(t, ptc_kx_v(k, j0), I(t, t->gd)));
    int m = let(t, ptc_kx_reduce(k, PTC_KX_RMAX, j0, w.n, score(t, w.qo, k0)));
    int k1 = add(t, w.kb, mul(t, ptc_kx_v(k, j1), I(t, t->gd)));
    int l =
        let(t, ptc_kx_reduce(k, PTC_KX_SUM, j1, w.n,
                             ptc_kx_un(k, PTC_KX_EXP, B(t, PTC_KX_SUB, score(t, w.qo, k1), m))));
    int lse = let(t, add(t, m, ptc_kx_un(k, PTC_KX_LOG, l)));
    ptc_kir_store(k, t->lse, w.r, lse);
    int k2 = add(t, w.kb, mul(t, ptc_kx_v(k, j2), I(t, t->gd)));
    int p = ptc_kx_un(k, PTC_KX_EXP, B(t, PTC_KX_SUB, score(t, w.qo, k2), lse));
    ptc_kir_store(k, t->dsum, w.r,
                  ptc_kx_reduce(k, PTC_KX_SUM, j2, w.n, mul(t, p, dot(t, t->dy, w.qo, t->v, k2))));
    ptc_kir_end(k);
}

static void build_dq(at *t, int dq)
{
    ptc_kir *k = t->k;
    int acc = ptc_kir_local(k, "acc", t->a->head_dim);
    qrow w = query_row(t);
    int lse = let(t, ld(t, t->lse, w.r)), dsum = let(t, ld(t, t->dsum, w.r));
    row_store(t, "d0", acc, -1, zero, NULL);
    int j = ptc_kir_for(k, "j", w.n, false);
    int krow = let(t, add(t, w.kb, mul(t, j, I(t, t->gd))));
    int p = let(t, ptc_kx_un(k, PTC_KX_EXP, B(t, PTC_KX_SUB, score(t, w.qo, krow), lse)));
    int dp = let(t, dot(t, t->dy, w.qo, t->v, krow));
    int ds = let(t, mul(t, mul(t, p, B(t, PTC_KX_SUB, dp, dsum)), F(t, t->scale)));
    row_store(t, "d1", acc, -1, axpy, (const int[]){acc, ds, t->kp, krow});
    ptc_kir_end(k);
    row_store(t, "d2", dq, w.qo, copy, (const int[]){acc});
    ptc_kir_end(k);
}

static void build_dkv(at *t, int dk, int dv)
{
    ptc_kir *k = t->k;
    const ptc_kir_attn *a = t->a;
    int gk = ptc_kir_local(k, "gk", a->head_dim), gv = ptc_kir_local(k, "gv", a->head_dim);
    int r = ptc_kir_for(k, "r", I(t, a->batch * a->kv_heads * a->kv_seq), true);
    int b = let(t, B(t, PTC_KX_DIV, r, I(t, a->kv_heads * a->kv_seq)));
    int kh = let(t, B(t, PTC_KX_REM, B(t, PTC_KX_DIV, r, I(t, a->kv_seq)), I(t, a->kv_heads)));
    int j = let(t, B(t, PTC_KX_REM, r, I(t, a->kv_seq)));
    int ko = let(t, add(t, mul(t, add(t, mul(t, b, I(t, a->kv_seq)), j), I(t, t->gd)),
                        mul(t, kh, I(t, a->head_dim))));
    row_store(t, "d0", gk, -1, zero, NULL);
    row_store(t, "d1", gv, -1, zero, NULL);
    /* the query heads of this kv head, and the queries that see key j (causal: from j on) */
    int hh = ptc_kir_for(k, "hh", I(t, t->ratio), false);
    int h = let(t, add(t, mul(t, kh, I(t, t->ratio)), hh));
    int i0 = a->causal ? j : I(t, 0);
    int nq =
        a->causal ? B(t, PTC_KX_MAX, B(t, PTC_KX_SUB, I(t, a->seq), j), I(t, 0)) : I(t, a->seq);
    int u = ptc_kir_for(k, "u", nq, false);
    int i = let(t, add(t, i0, u));
    int qo = let(t, add(t, mul(t, add(t, mul(t, b, I(t, a->seq)), i), I(t, t->hd)),
                        mul(t, h, I(t, a->head_dim))));
    int row = let(t, add(t, mul(t, add(t, mul(t, b, I(t, a->heads)), h), I(t, a->seq)), i));
    int p =
        let(t, ptc_kx_un(k, PTC_KX_EXP, B(t, PTC_KX_SUB, score(t, qo, ko), ld(t, t->lse, row))));
    int dp = let(t, dot(t, t->dy, qo, t->v, ko));
    int ds = let(t, mul(t, mul(t, p, B(t, PTC_KX_SUB, dp, ld(t, t->dsum, row))), F(t, t->scale)));
    row_store(t, "d2", gv, -1, axpy, (const int[]){gv, p, t->dy, qo});
    row_store(t, "d3", gk, -1, axpy, (const int[]){gk, ds, t->q, qo});
    ptc_kir_end(k);
    ptc_kir_end(k);
    row_store(t, "d4", dk, ko, copy, (const int[]){gk});
    row_store(t, "d5", dv, ko, copy, (const int[]){gv});
    ptc_kir_end(k);
}

ptc_kir *ptc_kir_attention(const ptc_kir_attn *a, ptc_kir_attn_kernel which, const char *name,
                           char *err, size_t errn)
{
    static const char *const kinds[PTC_KIR_ATTN_NKERNELS] = {"fwd", "stats", "dq", "dkv"};
    if (a->batch < 1 || a->seq < 1 || a->kv_seq < 1 || a->heads < 1 || a->kv_heads < 1 ||
        a->head_dim < 1 || a->heads % a->kv_heads || a->head_dim > PTC_KIR_LOCAL_MAX ||
        (int)which < 0 || which >= PTC_KIR_ATTN_NKERNELS) {
        ptc_fmt(err, errn,
                "attention in the kernel IR: no kernel for batch %lld, seq %lld, kv_seq %lld, "
                "%lld heads over %lld kv heads of %lld",
                (long long)a->batch, (long long)a->seq, (long long)a->kv_seq, (long long)a->heads,
                (long long)a->kv_heads, (long long)a->head_dim);
        return NULL;
    }
    char kname[256];
    ptc_fmt(kname, sizeof kname, "%s_%s", name, kinds[which]);
    at t = {.k = ptc_kir_new(kname),
            .a = a,
            .ratio = a->heads / a->kv_heads,
            .gd = a->kv_heads * a->head_dim,
            .hd = a->heads * a->head_dim,
            .scale = (double)(float)(1.0 / sqrt((double)a->head_dim)),
            .lse = -1,
            .dsum = -1,
            .dy = -1};
    int64_t nq = a->batch * a->seq * t.hd, nk = a->batch * a->kv_seq * t.gd;
    int64_t ns = a->batch * a->heads * a->seq;
    t.q = ptc_kir_param(t.k, "q", PTC_F32, nq, false, -1);
    t.kp = ptc_kir_param(t.k, "k", PTC_F32, nk, false, -1);
    t.v = ptc_kir_param(t.k, "v", PTC_F32, nk, false, -1);
    if (which != PTC_KIR_ATTN_FWD)
        t.dy = ptc_kir_param(t.k, "dy", PTC_F32, nq, false, -1);
    bool stats = which == PTC_KIR_ATTN_STATS;
    if (which != PTC_KIR_ATTN_FWD) {
        t.lse = ptc_kir_param(t.k, "lse", PTC_F32, ns, stats, -1);
        t.dsum = ptc_kir_param(t.k, "dsum", PTC_F32, ns, stats, -1);
    }
    switch (which) {
    case PTC_KIR_ATTN_FWD: build_fwd(&t, ptc_kir_param(t.k, "o", PTC_F32, nq, true, -1)); break;
    case PTC_KIR_ATTN_STATS: build_stats(&t); break;
    case PTC_KIR_ATTN_DQ: build_dq(&t, ptc_kir_param(t.k, "dq", PTC_F32, nq, true, -1)); break;
    default: {
        int dk = ptc_kir_param(t.k, "dk", PTC_F32, nk, true, -1);
        build_dkv(&t, dk, ptc_kir_param(t.k, "dv", PTC_F32, nk, true, -1));
    }
    }
    if (ptc_kir_verify(t.k, err, errn) < 0) {
        ptc_kir_free(t.k);
        return NULL;
    }
    return t.k;
}
