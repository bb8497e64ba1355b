/* moe.c - the types of moe and of its pieces (ops.def, "mixture of experts"), and the one place
 * an expert's capacity is computed, so the compiler (buffer sizes) and the kernels (dropping)
 * agree on it.
 *
 * Every type rule names both shapes of a mismatch, like the rest of inference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        ptc_fmt(err, errn, __VA_ARGS__);                                                           \
        return -1;                                                                                 \
    } while (0)

__extension__ typedef unsigned __int128 u128;

/* c as digits * 10^exp10 with the fewest digits that read back as c (the decimal number written in
 * the model: 1.1 is 11 * 10^-1, not the binary double nearest to it). */
static void shortest_decimal(double c, uint64_t *digits, int *exp10)
{
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, c);
        if (strtod(buf, NULL) == c)
            break;
    }
    /* buf is "d.ddde[+-]x" */
    uint64_t m = 0;
    int frac = 0;
    char *p = buf;
    for (bool dot = false; *p && *p != 'e'; p++) {
        if (*p == '.') {
            dot = true;
            continue;
        }
        m = m * 10 + (uint64_t)(*p - '0');
        frac += dot;
    }
    *digits = m;
    *exp10 = (*p == 'e' ? atoi(p + 1) : 0) - frac;
}

bool ptc_moe_capacity_decimal(double c, int64_t top_k, int64_t experts, uint64_t *digits,
                              int *e10)
{
    /* an expert takes at most one choice per token: a capacity of N or more drops nothing */
    if (!(c > 0) || !isfinite(c) || experts < 1 ||
        c * (double)top_k / (double)experts >= 1.0 - 1e-12)
        return false;
    shortest_decimal(c, digits, e10);
    return true;
}

int64_t ptc_moe_capacity(double c, int64_t tokens, int64_t top_k, int64_t experts)
{
    uint64_t digits;
    int e10;
    if (!ptc_moe_capacity_decimal(c, top_k, experts, &digits, &e10))
        return tokens;
    /* ceil(digits * 10^e10 * K * N / E), exactly; the value is below N here */
    u128 num = (u128)digits * (u128)top_k * (u128)tokens, den = (u128)experts;
    for (int i = 0; i < e10; i++)
        num *= 10;
    for (int i = 0; i < -e10; i++) {
        if (den > ((u128)1 << 120) / 10)
            return 1; /* c below 1e-20: less than one choice, rounded up */
        den *= 10;
    }
    u128 q = (num + den - 1) / den;
    return q > (u128)tokens ? tokens : (int64_t)q;
}

int ptc_graph_moe_stats(const ptc_graph *g, int *vals, int cap)
{
    int n = 0;
    for (int i = 0; i < g->noutputs; i++) {
        const ptc_node *d = &g->nodes[g->values[g->outputs[i]].def];
        if (d->op == PTC_OP_ALLREDUCE) /* the sum over the microbatches */
            d = &g->nodes[g->values[d->in[0]].def];
        if (d->op != PTC_OP_MOE_STATS)
            continue;
        if (vals && n < cap)
            vals[n] = g->outputs[i];
        n++;
    }
    return n;
}

static bool is_float(ptc_dtype t)
{
    return t != PTC_I32;
}

/* w_up [E, d, F] and w_down [E, f, d] with F = f, or 2 f for swiglu; *f set. */
static int expert_weights(const char *name, const ptc_type *up, const ptc_type *down, int64_t e,
                          int64_t d, ptc_act act, int64_t *f, char *err, size_t errn)
{
    char su[160], sd[160];
    ptc_type_str(up, su, sizeof su);
    ptc_type_str(down, sd, sizeof sd);
    bool ok = up->rank == 3 && down->rank == 3 && up->dims[0] == e && down->dims[0] == e &&
              up->dims[1] == d && down->dims[2] == d;
    int64_t hid = down->rank == 3 ? down->dims[1] : 0;
    ok = ok && up->dims[2] == (act == PTC_ACT_SWIGLU ? 2 * hid : hid);
    if (!ok)
        FAIL("shape mismatch in %s: w_up %s and w_down %s do not fit %lld experts of width %lld "
             "with act=%s (w_up [E, d, %s], w_down [E, f, d])",
             name, su, sd, (long long)e, (long long)d, ptc_act_name(act),
             act == PTC_ACT_SWIGLU ? "2*f" : "f");
    if (up->dtype != down->dtype || !is_float(up->dtype))
        FAIL("%s: w_up %s and w_down %s must be float tensors of one dtype", name, su, sd);
    *f = hid;
    return 0;
}

/* ids/route/gate [B, S, K] against x [B, S, d]. */
static int per_choice(const char *name, const char *what, const ptc_type *t, const ptc_type *x,
                      int64_t k, bool ints, char *err, size_t errn)
{
    char st[160], sx[160];
    bool ok = t->rank == 3 && t->dims[0] == x->dims[0] && t->dims[1] == x->dims[1] &&
              (k < 0 || t->dims[2] == k) && (ints ? t->dtype == PTC_I32 : is_float(t->dtype));
    if (!ok)
        FAIL("%s: %s %s does not fit x %s (%s[batch, seq, top_k])", name, what,
             ptc_type_str(t, st, sizeof st), ptc_type_str(x, sx, sizeof sx),
             ints ? "i32" : "float");
    return 0;
}

static int infer_moe_op(const ptc_type *in, ptc_attrs *at, ptc_type *out, char *err, size_t errn)
{
    char sx[160], sr[160];
    const ptc_type *x = &in[0], *r = &in[1];
    ptc_type_str(x, sx, sizeof sx);
    ptc_type_str(r, sr, sizeof sr);
    if (x->rank != 3 || !is_float(x->dtype))
        FAIL("moe needs x of shape [batch, seq, d], got %s", sx);
    if (r->rank != 2 || r->dims[0] != x->dims[2] || !is_float(r->dtype))
        FAIL("shape mismatch in moe: router %s does not fit x %s (router [d, experts])", sr, sx);
    int64_t e = r->dims[1], f;
    if (at->top_k < 1 || at->top_k > e)
        FAIL("moe: top_k=%lld must be between 1 and the %lld experts of router %s",
             (long long)at->top_k, (long long)e, sr);
    if (!(at->capacity >= 0) || !isfinite(at->capacity))
        FAIL("moe: capacity must be 0 (drop nothing) or positive, got %g", at->capacity);
    if ((unsigned)at->act >= PTC_NACTS)
        FAIL("moe: unknown activation");
    if (expert_weights("moe", &in[2], &in[3], e, x->dims[2], at->act, &f, err, errn) < 0)
        return -1;
    if (in[2].dtype != x->dtype)
        FAIL("moe: w_up %s must have the dtype of x %s", ptc_type_str(&in[2], sr, sizeof sr), sx);
    out[0] = *x;
    out[1] = (ptc_type){.dtype = PTC_F32, .rank = 0};
    return 2;
}

/* (x, route, gate, w_up, w_down[, dy]) of moe_ffn and its gradient */
static int infer_ffn(ptc_op op, const ptc_type *in, ptc_attrs *at, ptc_type *out, char *err,
                     size_t errn)
{
    const char *name = ptc_ops[op].name;
    char sx[160];
    const ptc_type *x = &in[0];
    ptc_type_str(x, sx, sizeof sx);
    if (x->rank != 3 || !is_float(x->dtype))
        FAIL("%s needs x of shape [batch, seq, d], got %s", name, sx);
    if (at->group < 1 || at->n < 1 || at->n % at->group)
        FAIL("%s: %lld experts do not split into %d groups", name, (long long)at->n, at->group);
    int64_t k = in[1].rank == 3 ? in[1].dims[2] : 0, f;
    if (per_choice(name, "route", &in[1], x, -1, true, err, errn) < 0 ||
        per_choice(name, "gate", &in[2], x, k, false, err, errn) < 0 ||
        expert_weights(name, &in[3], &in[4], at->n / at->group, x->dims[2], at->act, &f, err,
                       errn) < 0)
        return -1;
    if (in[3].dtype != x->dtype)
        FAIL("%s: the experts' dtype differs from x %s", name, sx);
    out[0] = *x;
    if (op == PTC_OP_MOE_FFN)
        return 1;
    if (!ptc_type_eq(&in[5], x))
        FAIL("%s: dy %s differs from x %s", name, ptc_type_str(&in[5], (char[160]){0}, 160), sx);
    out[1] = in[2];
    out[2] = in[3];
    out[3] = in[4];
    return 4;
}

/* (rows, counts, w_up, w_down[, dy]) of the expert-parallel experts */
static int infer_ep_ffn(ptc_op op, const ptc_type *in, ptc_attrs *at, ptc_type *out, char *err,
                        size_t errn)
{
    const char *name = ptc_ops[op].name;
    char s0[160];
    int64_t f;
    if (at->group < 1 || at->n < 1 || at->n % at->group)
        FAIL("%s: %lld experts do not split into %d groups", name, (long long)at->n, at->group);
    if (in[0].rank != 2 || !is_float(in[0].dtype))
        FAIL("%s needs rows [m, d], got %s", name, ptc_type_str(&in[0], s0, sizeof s0));
    if (in[1].rank != 1 || in[1].dtype != PTC_I32 || in[1].dims[0] != at->n * at->group)
        FAIL("%s: counts %s are not i32[%lld]", name, ptc_type_str(&in[1], s0, sizeof s0),
             (long long)(at->n * at->group));
    if (expert_weights(name, &in[2], &in[3], at->n / at->group, in[0].dims[1], at->act, &f, err,
                       errn) < 0)
        return -1;
    out[0] = in[0];
    if (op == PTC_OP_MOE_EP_FFN)
        return 1;
    if (!ptc_type_eq(&in[4], &in[0]))
        FAIL("%s: dy differs from the rows %s", name, ptc_type_str(&in[0], s0, sizeof s0));
    out[1] = in[2];
    out[2] = in[3];
    return 3;
}

static int infer_routing(ptc_op op, const ptc_type *in, ptc_attrs *at, ptc_type *out, char *err,
                         size_t errn)
{
    const char *name = ptc_ops[op].name;
    char s0[160], s1[160];
    ptc_type_str(&in[0], s0, sizeof s0);
    switch (op) {
    case PTC_OP_MOE_TOPK:
        if (in[0].rank < 1 || !is_float(in[0].dtype))
            FAIL("%s needs float probabilities, got %s", name, s0);
        if (at->top_k < 1 || at->top_k > in[0].dims[in[0].rank - 1])
            FAIL("%s: top_k=%lld must be between 1 and the experts of %s", name,
                 (long long)at->top_k, s0);
        out[0] = out[1] = in[0];
        out[0].dtype = PTC_I32;
        out[0].dims[in[0].rank - 1] = out[1].dims[in[0].rank - 1] = at->top_k;
        return 2;
    case PTC_OP_MOE_TOPK_GRAD: {
        ptc_type want = in[0];
        want.dims[want.rank - 1] = in[1].rank == in[0].rank ? in[1].dims[want.rank - 1] : 0;
        ptc_type wi = want, wg = want;
        wi.dtype = PTC_I32;
        wg.dtype = in[2].dtype;
        if (in[0].rank < 1 || !ptc_type_eq(&in[1], &wi) || !ptc_type_eq(&in[2], &wg))
            FAIL("%s: ids %s and dgate %s do not fit p %s", name,
                 ptc_type_str(&in[1], s1, sizeof s1), ptc_type_str(&in[2], (char[160]){0}, 160),
                 s0);
        out[0] = in[0];
        return 1;
    }
    case PTC_OP_MOE_COUNT:
        if (in[0].rank != 3 || in[0].dtype != PTC_I32 || at->n < 1)
            FAIL("%s needs i32 ids [batch, seq, top_k], got %s", name, s0);
        out[0] =
            (ptc_type){.dtype = PTC_I32, .rank = 3, .dims = {in[0].dims[0], in[0].dims[2], at->n}};
        return 1;
    case PTC_OP_MOE_PREFIX:
        if (in[0].rank != 3 || in[0].dtype != PTC_I32)
            FAIL("%s needs i32 counts [batch, top_k, experts], got %s", name, s0);
        out[0] = in[0];
        out[1] = (ptc_type){.dtype = PTC_I32, .rank = 2, .dims = {in[0].dims[1], in[0].dims[2]}};
        return 2;
    case PTC_OP_MOE_ROUTE: {
        bool ok = in[0].rank == 3 && in[0].dtype == PTC_I32 && in[1].rank == 3 &&
                  in[1].dtype == PTC_I32 && in[2].rank == 2 && in[2].dtype == PTC_I32 &&
                  in[1].dims[0] == in[0].dims[0] && in[1].dims[1] == in[0].dims[2] &&
                  in[2].dims[0] == in[0].dims[2] && in[2].dims[1] == in[1].dims[2];
        if (!ok)
            FAIL("%s: ids %s, prefix %s and totals %s do not fit", name, s0,
                 ptc_type_str(&in[1], s1, sizeof s1), ptc_type_str(&in[2], (char[160]){0}, 160));
        if (!(at->capacity >= 0) || !isfinite(at->capacity))
            FAIL("%s: capacity must be 0 or positive", name);
        out[0] = in[0];
        return 1;
    }
    case PTC_OP_MOE_FRAC:
    case PTC_OP_MOE_STATS:
        if (in[0].rank != 2 || in[0].dtype != PTC_I32)
            FAIL("%s needs i32 totals [top_k, experts], got %s", name, s0);
        out[0] = (ptc_type){
            .dtype = PTC_F32, .rank = 1, .dims = {op == PTC_OP_MOE_FRAC ? in[0].dims[1] : 3}};
        return 1;
    case PTC_OP_MOE_EP_COUNT:
        if (in[0].rank != 3 || in[0].dtype != PTC_I32 || at->n < 1)
            FAIL("%s needs an i32 route [batch, seq, top_k], got %s", name, s0);
        out[0] = (ptc_type){.dtype = PTC_I32, .rank = 1, .dims = {at->n}};
        return 1;
    default: PTC_UNREACHABLE("not a routing op");
    }
    return -1;
}

/* pack, unpack, combine and its gradient: rows of kept choices against tokens */
static int infer_rows(ptc_op op, const ptc_type *in, ptc_attrs *at, ptc_type *out, char *err,
                      size_t errn)
{
    const char *name = ptc_ops[op].name;
    const ptc_type *route = &in[1];
    char s0[160];
    if (route->rank != 3 || route->dtype != PTC_I32)
        FAIL("%s needs an i32 route [batch, seq, top_k], got %s", name,
             ptc_type_str(route, s0, sizeof s0));
    ptc_type tok = {.dtype = in[0].dtype,
                    .rank = 3,
                    .dims = {route->dims[0], route->dims[1], in[0].dims[in[0].rank - 1]}};
    if (op == PTC_OP_MOE_PACK) {
        if (in[0].rank != 3 || in[0].dims[0] != route->dims[0] || in[0].dims[1] != route->dims[1] ||
            !is_float(in[0].dtype) || at->len < 1)
            FAIL("%s: x %s does not fit route %s", name, ptc_type_str(&in[0], s0, sizeof s0),
                 ptc_type_str(route, (char[160]){0}, 160));
        out[0] = (ptc_type){.dtype = in[0].dtype, .rank = 2, .dims = {at->len, in[0].dims[2]}};
        return 1;
    }
    if (in[0].rank != 2 || !is_float(in[0].dtype))
        FAIL("%s needs float rows [m, d], got %s", name, ptc_type_str(&in[0], s0, sizeof s0));
    if (op != PTC_OP_MOE_UNPACK &&
        per_choice(name, "gate", &in[2], &tok, route->dims[2], false, err, errn) < 0)
        return -1;
    out[0] = tok;
    if (op != PTC_OP_MOE_COMBINE_GRAD)
        return 1;
    if (!ptc_type_eq(&in[3], &tok))
        FAIL("%s: dy %s does not fit the tokens %s", name, ptc_type_str(&in[3], s0, sizeof s0),
             ptc_type_str(&tok, (char[160]){0}, 160));
    out[0] = in[0];
    out[1] = in[2];
    return 2;
}

int ptc_infer_moe(ptc_op op, const ptc_type *in, int nin, ptc_attrs *at, ptc_type *out, char *err,
                  size_t errn)
{
    (void)nin; /* the caller checked the arity */
    char s0[160];
    switch (op) {
    case PTC_OP_MOE: return infer_moe_op(in, at, out, err, errn);
    case PTC_OP_MOE_FFN:
    case PTC_OP_MOE_FFN_GRAD: return infer_ffn(op, in, at, out, err, errn);
    case PTC_OP_MOE_EP_FFN:
    case PTC_OP_MOE_EP_FFN_GRAD: return infer_ep_ffn(op, in, at, out, err, errn);
    case PTC_OP_MOE_PACK:
    case PTC_OP_MOE_UNPACK:
    case PTC_OP_MOE_COMBINE:
    case PTC_OP_MOE_COMBINE_GRAD: return infer_rows(op, in, at, out, err, errn);
    case PTC_OP_ALL_TO_ALL_V:
        if (in[0].rank != 2 || at->group < 1 || at->n < 1 || at->n % at->group || at->len < 1 ||
            (at->to != 0 && at->to != 1))
            FAIL("all_to_all_v: rows %s over %d ranks of %lld experts do not fit",
                 ptc_type_str(&in[0], s0, sizeof s0), at->group, (long long)at->n);
        if (in[1].rank != 1 || in[1].dtype != PTC_I32 || in[1].dims[0] != at->n * at->group)
            FAIL("all_to_all_v: counts %s are not i32[%lld]", ptc_type_str(&in[1], s0, sizeof s0),
                 (long long)(at->n * at->group));
        out[0] = in[0];
        out[0].dims[0] = at->len;
        return 1;
    default: return infer_routing(op, in, at, out, err, errn);
    }
}

bool ptc_op_is_moe(ptc_op op)
{
    switch (op) {
    case PTC_OP_MOE:
    case PTC_OP_MOE_TOPK:
    case PTC_OP_MOE_TOPK_GRAD:
    case PTC_OP_MOE_COUNT:
    case PTC_OP_MOE_PREFIX:
    case PTC_OP_MOE_ROUTE:
    case PTC_OP_MOE_FRAC:
    case PTC_OP_MOE_STATS:
    case PTC_OP_MOE_FFN:
    case PTC_OP_MOE_FFN_GRAD:
    case PTC_OP_MOE_EP_COUNT:
    case PTC_OP_MOE_PACK:
    case PTC_OP_MOE_UNPACK:
    case PTC_OP_MOE_COMBINE:
    case PTC_OP_MOE_COMBINE_GRAD:
    case PTC_OP_MOE_EP_FFN:
    case PTC_OP_MOE_EP_FFN_GRAD: return true;
    default: return false;
    }
}
