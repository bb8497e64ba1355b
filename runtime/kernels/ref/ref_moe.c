/* ref_moe.c - reference kernels of moe and of its pieces (ops.def, "mixture of experts").
 *
 * The gate (top-k, renormalised or raw weights), the routing over all the tokens of the step (per
 * batch row counts, their prefix, the capacity with first choices first), the experts and their
 * gradients, and the row kernels of expert parallelism (pack, combine, unpack and the local
 * experts on received rows).
 *
 * One expert on one row is computed by one function (expert_fwd, expert_bwd), rounding to float
 * where the ops of the language would (x @ w_up, the activation, @ w_down; sums in double), so a
 * single device (moe_ffn) and expert parallelism (moe_pack, moe_ep_ffn, moe_combine) give the
 * same bits for every row of the forward and of dx: only the order in which the weight gradients
 * sum their rows differs between meshes.
 *
 * Rows of kept choices are ordered by expert, then by token: row(t, j) = first row of expert e +
 * the kept choices of e in tokens before t (a token picks an expert at most once). Every kernel
 * that reads or writes rows computes this order from the route alone.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref_internal.h"

/* ---- the gate and the routing ---- */

/* Per row of p[rows, E]: the top_k experts by p (a tie goes to the lower index) and their weights,
 * divided by the sum over the chosen when normalize. */
static void topk(const float *p, int64_t rows, int64_t E, int64_t K, bool normalize, int32_t *ids,
                 float *gate)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *pr = p + r * E;
        int32_t *id = ids + r * K;
        double sum = 0;
        for (int64_t j = 0; j < K; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t i = 0; i < j && !taken; i++)
                    taken = id[i] == e;
                if (!taken && (best < 0 || pr[e] > pr[best]))
                    best = e;
            }
            id[j] = (int32_t)best;
            sum += pr[best];
        }
        for (int64_t j = 0; j < K; j++)
            gate[r * K + j] = normalize ? (float)(pr[id[j]] / sum) : pr[id[j]];
    }
}

/* dp of gate = p[chosen] / s (normalize, s = sum of p over the chosen) or p[chosen]:
 * dp[chosen j] = (dg_j - sum_i dg_i g_i) / s, or dg_j; zero elsewhere. */
static void topk_grad(const float *p, const int32_t *ids, const float *dg, int64_t rows, int64_t E,
                      int64_t K, bool normalize, float *dp)
{
    memset(dp, 0, sizeof(float) * (size_t)(rows * E));
    for (int64_t r = 0; r < rows; r++) {
        const int32_t *id = ids + r * K;
        const float *d = dg + r * K;
        double s = 0, dot = 0;
        for (int64_t j = 0; j < K; j++)
            s += p[r * E + id[j]];
        for (int64_t j = 0; j < K; j++)
            dot += (double)d[j] * (p[r * E + id[j]] / s);
        for (int64_t j = 0; j < K; j++)
            dp[r * E + id[j]] = normalize ? (float)((d[j] - dot) / s) : d[j];
    }
}

/* counts[b, j, e]: the choices of rank j of batch row b that picked e. */
static int count(const ptc_type *ti, const int32_t *ids, int64_t E, int32_t *cnt, char *err,
                 size_t errn)
{
    int64_t B = ti->dims[0], S = ti->dims[1], K = ti->dims[2];
    memset(cnt, 0, sizeof(int32_t) * (size_t)(B * K * E));
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t j = 0; j < K; j++) {
                int32_t e = ids[(b * S + s) * K + j];
                if (e < 0 || e >= E) {
                    ptc_fmt(err, errn, "expert id %d outside 0..%lld", e, (long long)(E - 1));
                    return -1;
                }
                cnt[(b * K + j) * E + e]++;
            }
    return 0;
}

static void prefix(const ptc_type *tc, const int32_t *cnt, int32_t *pre, int32_t *tot)
{
    int64_t B = tc->dims[0], KE = tc->dims[1] * tc->dims[2];
    memset(tot, 0, sizeof(int32_t) * (size_t)KE);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < KE; i++) {
            pre[b * KE + i] = tot[i];
            tot[i] += cnt[b * KE + i];
        }
}

/* Tokens in the step (every token has one first choice) and the capacity of an expert. */
static int64_t step_tokens(const int32_t *tot, int64_t E)
{
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++)
        n += tot[e];
    return n;
}

/* The place of every choice in its expert: all first choices in token order, then all second
 * choices, and so on; a choice whose place is beyond the capacity is dropped (-1). The rows here
 * are rows [pre..] of the step: pre holds the counts of the rows before them. */
static int route(const ptc_type *ti, const int32_t *ids, const int32_t *pre, const int32_t *tot,
                 int64_t E, double capacity, int32_t *out, char *err, size_t errn)
{
    int64_t B = ti->dims[0], S = ti->dims[1], K = ti->dims[2];
    int64_t C = ptc_moe_capacity(capacity, step_tokens(tot, E), K, E);
    int64_t *pos = ptc_xmalloc(sizeof(int64_t) * (size_t)(K * E));
    int rc = 0;
    for (int64_t b = 0; b < B && !rc; b++) {
        for (int64_t e = 0; e < E; e++) {
            int64_t before = 0; /* the earlier choice ranks of every token */
            for (int64_t j = 0; j < K; j++) {
                pos[j * E + e] = before + pre[(b * K + j) * E + e];
                before += tot[j * E + e];
            }
        }
        for (int64_t s = 0; s < S && !rc; s++)
            for (int64_t j = 0; j < K; j++) {
                int64_t i = (b * S + s) * K + j;
                int32_t e = ids[i];
                if (e < 0 || e >= E) {
                    ptc_fmt(err, errn, "expert id %d outside 0..%lld", e, (long long)(E - 1));
                    rc = -1;
                    break;
                }
                out[i] = pos[j * E + e]++ < C ? e : -1;
            }
    }
    free(pos);
    return rc;
}

static void frac(const int32_t *tot, int64_t K, int64_t E, float *f)
{
    double all = 0;
    for (int64_t i = 0; i < K * E; i++)
        all += tot[i];
    for (int64_t e = 0; e < E; e++) {
        double n = 0;
        for (int64_t j = 0; j < K; j++)
            n += tot[j * E + e];
        f[e] = (float)(all > 0 ? n / all : 0);
    }
}

/* [E x the most choices one expert got, choices dropped, all choices]: sums over microbatches
 * stay meaningful (the first over the last is the largest load over the mean) */
static void stats(const int32_t *tot, int64_t K, int64_t E, double capacity, float *o)
{
    int64_t N = step_tokens(tot, E), C = ptc_moe_capacity(capacity, N, K, E), kept = 0, mx = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t load = 0;
        for (int64_t j = 0; j < K; j++) {
            int64_t t = tot[j * E + e], room = C - load;
            kept += t < room ? t : room > 0 ? room : 0;
            load += t;
        }
        mx = load > mx ? load : mx;
    }
    o[0] = (float)(mx * E);
    o[1] = (float)(N * K - kept);
    o[2] = (float)(N * K);
}

/* ---- one expert on one row ---- */

typedef struct expert {
    int64_t d, f, F; /* F = f, or 2 f for swiglu */
    ptc_act act;
    const float *up, *down; /* w_up[e] [d, F], w_down[e] [f, d] */
    float *h, *a, *da, *dh; /* scratch: h [F], a [f], da [f], dh [F] */
    double *acc;            /* scratch: sums of F or d elements */
} expert;

static void expert_init(expert *x, const ptc_type *tu, const ptc_type *td, ptc_act act)
{
    x->d = tu->dims[1];
    x->F = tu->dims[2];
    x->f = td->dims[1];
    x->act = act;
    x->h = ptc_xmalloc(sizeof(float) * (size_t)(2 * x->F + 2 * x->f));
    x->a = x->h + x->F;
    x->da = x->a + x->f;
    x->dh = x->da + x->f;
    x->acc = ptc_xmalloc(sizeof(double) * (size_t)(x->F > x->d ? x->F : x->d));
}

static void expert_free(expert *x)
{
    free(x->h);
    free(x->acc);
}

static void expert_at(expert *x, const float *w_up, const float *w_down, int64_t e)
{
    x->up = w_up + e * x->d * x->F;
    x->down = w_down + e * x->f * x->d;
}

static ptc_op act_op(ptc_act act)
{
    return act == PTC_ACT_GELU ? PTC_OP_GELU : act == PTC_ACT_RELU ? PTC_OP_RELU : PTC_OP_SILU;
}

/* h = u @ w_up, a = act(h) (swiglu: silu(h[:f]) * h[f:]), o = a @ w_down. The sums run over
 * rows of the weights (contiguous), each element's terms still in index order. */
static void expert_fwd(expert *x, const float *u, float *o)
{
    int64_t d = x->d, F = x->F, f = x->f;
    double *s = x->acc;
    memset(s, 0, sizeof(double) * (size_t)F);
    for (int64_t i = 0; i < d; i++) {
        const float *w = x->up + i * F;
        double ui = u[i];
        for (int64_t c = 0; c < F; c++)
            s[c] += ui * w[c];
    }
    for (int64_t c = 0; c < F; c++)
        x->h[c] = (float)s[c];
    for (int64_t c = 0; c < f; c++) {
        float g = (float)ptrt_ref_unary1(act_op(x->act), x->h[c]);
        x->a[c] = x->act == PTC_ACT_SWIGLU ? (float)((double)g * x->h[f + c]) : g;
    }
    memset(s, 0, sizeof(double) * (size_t)d);
    for (int64_t c = 0; c < f; c++) {
        const float *w = x->down + c * d;
        double ac = x->a[c];
        for (int64_t k = 0; k < d; k++)
            s[k] += ac * w[k];
    }
    for (int64_t k = 0; k < d; k++)
        o[k] = (float)s[k];
}

/* The backward of expert_fwd on row u given do (the gradient of its output): du, and the weight
 * gradients added into gup [d, F] and gdown [f, d] (double). expert_fwd must have run on u. */
static void expert_bwd(expert *x, const float *u, const float *dout, float *du, double *gup,
                       double *gdown)
{
    int64_t d = x->d, F = x->F, f = x->f;
    for (int64_t c = 0; c < f; c++) {
        double s = 0;
        for (int64_t k = 0; k < d; k++)
            s += (double)dout[k] * x->down[c * d + k];
        x->da[c] = (float)s;
        for (int64_t k = 0; k < d; k++)
            gdown[c * d + k] += (double)x->a[c] * dout[k];
    }
    ptc_op gop = x->act == PTC_ACT_GELU   ? PTC_OP_GELU_GRAD
                 : x->act == PTC_ACT_RELU ? PTC_OP_RELU_GRAD
                                          : PTC_OP_SILU_GRAD;
    for (int64_t c = 0; c < f; c++) {
        double dg = x->da[c];
        if (x->act == PTC_ACT_SWIGLU) { /* a = silu(h1) * h2 */
            float s1 = (float)ptrt_ref_unary1(PTC_OP_SILU, x->h[c]);
            x->dh[f + c] = (float)(dg * s1);
            dg = (float)(dg * x->h[f + c]);
        }
        x->dh[c] = gop == PTC_OP_RELU_GRAD ? (x->h[c] > 0 ? (float)dg : 0.0f)
                                           : (float)(dg * ptrt_ref_unary_deriv(gop, x->h[c]));
    }
    for (int64_t i = 0; i < d; i++) {
        double s = 0;
        for (int64_t c = 0; c < F; c++) {
            s += (double)x->dh[c] * x->up[i * F + c];
            gup[i * F + c] += (double)u[i] * x->dh[c];
        }
        du[i] = (float)s;
    }
}

/* ---- rows of kept choices ---- */

/* first[e]: the first row of expert e (experts in order); returns the rows in all. */
static int64_t row_starts(const int32_t *route, int64_t n, int64_t E, int64_t *first)
{
    memset(first, 0, sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < n; i++)
        if (route[i] >= 0 && route[i] < E)
            first[route[i] + 1]++;
    for (int64_t e = 0; e < E; e++)
        first[e + 1] += first[e];
    return first[E];
}

/* row[t * K + j]: the row of choice (t, j), or -1 when dropped; returns the rows in all, or -1
 * when they do not fit in m rows or an expert id is out of range. */
static int64_t rows_of(const ptc_type *tr, const int32_t *route, int64_t E, int64_t m, int64_t *row,
                       char *err, size_t errn)
{
    int64_t n = ptc_type_numel(tr);
    int64_t *next = ptc_xmalloc(sizeof(int64_t) * (size_t)(E + 1));
    int64_t total = row_starts(route, n, E, next);
    for (int64_t i = 0; i < n && total >= 0; i++) {
        if (route[i] >= E) {
            ptc_fmt(err, errn, "expert id %d outside 0..%lld", route[i], (long long)(E - 1));
            total = -1;
        }
        row[i] = route[i] >= 0 ? next[route[i]]++ : -1;
    }
    free(next);
    if (total > m) {
        ptc_fmt(err, errn, "%lld kept choices do not fit the %lld rows planned for them",
                (long long)total, (long long)m);
        return -1;
    }
    return total;
}

/* The experts one op names: moe_ffn carries n = E; the row ops have E in their counts operand or
 * only the route (the largest id + 1 is enough to order rows, as ids sort the same way). */
static int64_t experts_in(const int32_t *route, int64_t n)
{
    int64_t E = 0;
    for (int64_t i = 0; i < n; i++)
        E = route[i] + 1 > E ? route[i] + 1 : E;
    return E;
}

int64_t ptrt_ref_moe_row_of(const int32_t *route, int64_t n, int64_t m, int64_t *row, char *err,
                            size_t errn)
{
    ptc_type t = {.dtype = PTC_I32, .rank = 1, .dims = {n}};
    return rows_of(&t, route, experts_in(route, n), m, row, err, errn);
}

static int pack(const ptc_type *tx, const float *x, const ptc_type *tr, const int32_t *route,
                const ptc_type *to, float *rows, char *err, size_t errn)
{
    int64_t K = tr->dims[2], d = tx->dims[2], n = ptc_type_numel(tr);
    int64_t *row = ptc_xmalloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    int64_t total = rows_of(tr, route, experts_in(route, n), to->dims[0], row, err, errn);
    if (total >= 0) {
        memset(rows, 0, sizeof(float) * (size_t)(to->dims[0] * d));
        for (int64_t i = 0; i < n; i++)
            if (row[i] >= 0)
                memcpy(rows + row[i] * d, x + (i / K) * d, sizeof(float) * (size_t)d);
    }
    free(row);
    return total < 0 ? -1 : 0;
}

/* unpack (gate NULL): out[t] = sum over t's kept choices of their rows; combine: gate * row */
static int combine(const ptc_type *trows, const float *rows, const ptc_type *tr,
                   const int32_t *route, const float *gate, float *out, char *err, size_t errn)
{
    int64_t K = tr->dims[2], d = trows->dims[1], n = ptc_type_numel(tr), T = n / K;
    int64_t *row = ptc_xmalloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    double *acc = ptc_xmalloc(sizeof(double) * (size_t)d);
    int64_t total = rows_of(tr, route, experts_in(route, n), trows->dims[0], row, err, errn);
    for (int64_t t = 0; t < T && total >= 0; t++) {
        memset(acc, 0, sizeof(double) * (size_t)d);
        for (int64_t j = 0; j < K; j++) {
            int64_t r = row[t * K + j];
            if (r < 0)
                continue;
            double g = gate ? gate[t * K + j] : 1.0;
            for (int64_t k = 0; k < d; k++)
                acc[k] += g * rows[r * d + k];
        }
        for (int64_t k = 0; k < d; k++)
            out[t * d + k] = (float)acc[k];
    }
    free(acc);
    free(row);
    return total < 0 ? -1 : 0;
}

/* drows[row(t, j)] = gate * dy[t]; dgate[t, j] = rows[row(t, j)] . dy[t] (0 when dropped) */
static int combine_grad(const ptc_type *trows, const float *rows, const ptc_type *tr,
                        const int32_t *route, const float *gate, const float *dy, float *drows,
                        float *dgate, char *err, size_t errn)
{
    int64_t K = tr->dims[2], d = trows->dims[1], m = trows->dims[0], n = ptc_type_numel(tr);
    int64_t *row = ptc_xmalloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    int64_t total = rows_of(tr, route, experts_in(route, n), m, row, err, errn);
    if (total >= 0) {
        memset(drows, 0, sizeof(float) * (size_t)(m * d));
        for (int64_t i = 0; i < n; i++) {
            int64_t r = row[i];
            const float *g = dy + (i / K) * d;
            double s = 0;
            for (int64_t k = 0; k < d && r >= 0; k++) {
                s += (double)rows[r * d + k] * g[k];
                drows[r * d + k] = (float)((double)gate[i] * g[k]);
            }
            dgate[i] = (float)s;
        }
    }
    free(row);
    return total < 0 ? -1 : 0;
}

/* ---- the experts ---- */

/* moe_ffn: y[t] = sum over t's kept choices of gate * expert_e(x[t]) */
static void ffn(const ptc_type *it, void *const *in, ptc_act act, float *y)
{
    const float *x = in[0], *gate = in[2], *up = in[3], *down = in[4];
    const int32_t *route = in[1];
    int64_t K = it[1].dims[2], T = it[0].dims[0] * it[0].dims[1];
    expert ex;
    expert_init(&ex, &it[3], &it[4], act);
    int64_t d = ex.d;
    float *o = ptc_xmalloc(sizeof(float) * (size_t)d);
    double *acc = ptc_xmalloc(sizeof(double) * (size_t)d);
    for (int64_t t = 0; t < T; t++) {
        memset(acc, 0, sizeof(double) * (size_t)d);
        for (int64_t j = 0; j < K; j++) {
            int32_t e = route[t * K + j];
            if (e < 0)
                continue;
            expert_at(&ex, up, down, e);
            expert_fwd(&ex, x + t * d, o);
            for (int64_t k = 0; k < d; k++)
                acc[k] += (double)gate[t * K + j] * o[k];
        }
        for (int64_t k = 0; k < d; k++)
            y[t * d + k] = (float)acc[k];
    }
    free(acc);
    free(o);
    expert_free(&ex);
}

static void store_sums(const double *g, int64_t n, float *o)
{
    for (int64_t i = 0; i < n; i++)
        o[i] = (float)g[i];
}

/* moe_ffn_grad: dgate from the recomputed expert outputs, and each kept choice's row backward
 * with do = gate * dy, as combine_grad and moe_ep_ffn_grad compute them */
static void ffn_grad(const ptc_type *it, void *const *in, ptc_act act, void *const *out)
{
    const float *x = in[0], *gate = in[2], *up = in[3], *down = in[4], *dy = in[5];
    const int32_t *route = in[1];
    float *dx = out[0], *dgate = out[1];
    int64_t K = it[1].dims[2], T = it[0].dims[0] * it[0].dims[1], E = it[3].dims[0];
    expert ex;
    expert_init(&ex, &it[3], &it[4], act);
    int64_t d = ex.d, nu = d * ex.F, nd = ex.f * d;
    double *gup = ptc_xcalloc((size_t)(E * (nu + nd)), sizeof(double)), *gdown = gup + E * nu;
    float *o = ptc_xmalloc(sizeof(float) * (size_t)(3 * d)), *dout = o + d, *du = dout + d;
    double *acc = ptc_xmalloc(sizeof(double) * (size_t)d);
    for (int64_t t = 0; t < T; t++) {
        memset(acc, 0, sizeof(double) * (size_t)d);
        for (int64_t j = 0; j < K; j++) {
            int64_t i = t * K + j;
            int32_t e = route[i];
            dgate[i] = 0;
            if (e < 0)
                continue;
            expert_at(&ex, up, down, e);
            expert_fwd(&ex, x + t * d, o);
            double s = 0;
            for (int64_t k = 0; k < d; k++) {
                s += (double)o[k] * dy[t * d + k];
                dout[k] = (float)((double)gate[i] * dy[t * d + k]);
            }
            dgate[i] = (float)s;
            expert_bwd(&ex, x + t * d, dout, du, gup + e * nu, gdown + e * nd);
            for (int64_t k = 0; k < d; k++)
                acc[k] += du[k];
        }
        for (int64_t k = 0; k < d; k++)
            dx[t * d + k] = (float)acc[k];
    }
    store_sums(gup, E * nu, out[2]);
    store_sums(gdown, E * nd, out[3]);
    free(acc);
    free(o);
    free(gup);
    expert_free(&ex);
}

int64_t ptrt_ref_moe_ep_rows(const int32_t *counts, int64_t n, int group, int coord, int64_t m,
                             int64_t *expert_of)
{
    int64_t el = n / group, r = 0;
    for (int q = 0; q < group; q++)
        for (int64_t e = 0; e < el; e++)
            for (int32_t c = 0; c < counts[q * n + coord * el + e]; c++) {
                if (r >= m)
                    return -1;
                expert_of[r++] = e;
            }
    return r;
}

int64_t ptrt_moe_rows(const ptrt_kcall *k, const ptc_type *it, const int32_t *route,
                      int64_t *first, int64_t *src, int64_t *choice, char *err, size_t errn)
{
    bool ep = k->op == PTC_OP_MOE_EP_FFN || k->op == PTC_OP_MOE_EP_FFN_GRAD;
    int64_t E = it[ep ? 2 : 3].dims[0], n = ep ? it[0].dims[0] : ptc_type_numel(&it[1]);
    int64_t K = ep ? 1 : it[1].dims[it[1].rank - 1];
    int32_t *ids = NULL; /* moe_ep_ffn: each row's local expert (-1 past those received) */
    if (ep) {
        int64_t *eo = ptc_xmalloc(sizeof(int64_t) * (size_t)(n + 1));
        int64_t got = ptrt_ref_moe_ep_rows(route, k->attrs.n, k->attrs.group, k->coord, n, eo);
        if (got < 0) {
            ptc_fmt(err, errn, "the rows received exceed the %lld planned for them", (long long)n);
            free(eo);
            return -1;
        }
        ids = ptc_xmalloc(sizeof(int32_t) * (size_t)(n + 1));
        for (int64_t i = 0; i < n; i++)
            ids[i] = i < got ? (int32_t)eo[i] : -1;
        free(eo);
        route = ids;
    }
    int64_t *row = ptc_xmalloc(sizeof(int64_t) * (size_t)(n + 1));
    ptc_type t = {.dtype = PTC_I32, .rank = 1, .dims = {n}};
    int64_t r = rows_of(&t, route, E, n, row, err, errn);
    if (r >= 0) {
        row_starts(route, n, E, first);
        for (int64_t i = 0; i < n; i++) {
            if (row[i] < 0)
                continue;
            src[row[i]] = i / K;
            if (choice)
                choice[row[i]] = i;
        }
    }
    free(row);
    free(ids);
    return r;
}

static int ep_ffn(const ptrt_kcall *k, const ptc_type *it, void *const *in, const ptc_type *ot,
                  void *const *out, char *err, size_t errn)
{
    const float *rows = in[0], *up = in[2], *down = in[3];
    int64_t m = it[0].dims[0];
    int64_t *eo = ptc_xmalloc(sizeof(int64_t) * (size_t)(m ? m : 1));
    int64_t total = ptrt_ref_moe_ep_rows(in[1], k->attrs.n, k->attrs.group, k->coord, m, eo);
    if (total < 0) {
        free(eo);
        ptc_fmt(err, errn, "the rows received exceed the %lld planned for them", (long long)m);
        return -1;
    }
    expert ex;
    expert_init(&ex, &it[2], &it[3], k->attrs.act);
    int64_t d = ex.d, nu = d * ex.F, nd = ex.f * d, el = it[2].dims[0];
    for (int j = 0; j < k->nout; j++)
        memset(out[j], 0, sizeof(float) * (size_t)ptc_type_numel(&ot[j]));
    double *gup = NULL, *gdown = NULL;
    float *tmp = ptc_xmalloc(sizeof(float) * (size_t)d);
    if (k->op == PTC_OP_MOE_EP_FFN_GRAD) {
        gup = ptc_xcalloc((size_t)(el * (nu + nd)), sizeof(double));
        gdown = gup + el * nu;
    }
    for (int64_t r = 0; r < total; r++) {
        expert_at(&ex, up, down, eo[r]);
        if (k->op == PTC_OP_MOE_EP_FFN) {
            expert_fwd(&ex, rows + r * d, (float *)out[0] + r * d);
            continue;
        }
        expert_fwd(&ex, rows + r * d, tmp);
        expert_bwd(&ex, rows + r * d, (const float *)in[4] + r * d, (float *)out[0] + r * d,
                   gup + eo[r] * nu, gdown + eo[r] * nd);
    }
    if (gup) {
        store_sums(gup, el * nu, out[1]);
        store_sums(gdown, el * nd, out[2]);
    }
    free(gup);
    free(tmp);
    free(eo);
    expert_free(&ex);
    return 0;
}

/* ---- moe whole, for `ptc --run`: the pieces in the order the moe pass emits them ---- */

static int moe_whole(const ptrt_kcall *k, const ptc_type *it, void *const *in, void *const *out,
                     char *err, size_t errn)
{
    const ptc_attrs *at = &k->attrs;
    const float *x = in[0], *router = in[1];
    int64_t B = it[0].dims[0], S = it[0].dims[1], E = it[1].dims[1];
    int64_t K = at->top_k, T = B * S;
    float *p = ptc_xmalloc(sizeof(float) * (size_t)(T * (E + K + 2) + E));
    float *gate = p + T * E, *f = gate + T * K, *P = f + E;
    int32_t *ids = ptc_xmalloc(sizeof(int32_t) * (size_t)(2 * T * K + 2 * B * K * E + K * E));
    int32_t *rt = ids + T * K, *cnt = rt + T * K, *pre = cnt + B * K * E, *tot = pre + B * K * E;
    ptc_type tl = {.dtype = PTC_F32, .rank = 3, .dims = {B, S, E}};
    ptc_type tx = it[0], ti = {.dtype = PTC_I32, .rank = 3, .dims = {B, S, K}};
    ptc_type tc = {.dtype = PTC_I32, .rank = 3, .dims = {B, K, E}};
    tx.dtype = PTC_F32;
    ptrt_ref_matmul(&tx, x, &it[1], router, &tl, p);
    ptrt_ref_softmax(false, &tl, p, 2, p);
    topk(p, T, E, K, at->normalize, ids, gate);
    int rc = count(&ti, ids, E, cnt, err, errn);
    if (rc == 0) {
        prefix(&tc, cnt, pre, tot);
        rc = route(&ti, ids, pre, tot, E, at->capacity, rt, err, errn);
    }
    if (rc == 0) {
        void *fin[5] = {in[0], rt, gate, in[2], in[3]};
        ptc_type fit[5] = {
            it[0], ti, {.dtype = PTC_F32, .rank = 3, .dims = {B, S, K}}, it[2], it[3]};
        ffn(fit, fin, at->act, out[0]);
        /* aux = E * sum_e f_e * P_e, P the mean of p over the tokens */
        ptc_type tp = {.dtype = PTC_F32, .rank = 2, .dims = {T, E}};
        ptrt_ref_reduce(PTC_OP_MEAN, &tp, p, 0, P);
        frac(tot, K, E, f);
        double s = 0;
        for (int64_t e = 0; e < E; e++)
            s += (float)((double)f[e] * P[e]);
        ((float *)out[1])[0] = (float)((float)s * (double)E);
    }
    free(ids);
    free(p);
    return rc;
}

int ptrt_ref_run_moe(const ptrt_kcall *k, const ptc_type *it, void *const *in, const ptc_type *ot,
                     void *const *out, char *err, size_t errn)
{
    const ptc_attrs *at = &k->attrs;
    int rc = 0;
    int64_t last = it[0].rank ? it[0].dims[it[0].rank - 1] : 1;
    switch (k->op) {
    case PTC_OP_MOE: rc = moe_whole(k, it, in, out, err, errn); break;
    case PTC_OP_MOE_TOPK:
        topk(in[0], ptc_type_numel(&it[0]) / last, last, at->top_k, at->normalize, out[0], out[1]);
        break;
    case PTC_OP_MOE_TOPK_GRAD:
        topk_grad(in[0], in[1], in[2], ptc_type_numel(&it[0]) / last, last,
                  it[1].dims[it[1].rank - 1], at->normalize, out[0]);
        break;
    case PTC_OP_MOE_COUNT: rc = count(&it[0], in[0], at->n, out[0], err, errn); break;
    case PTC_OP_MOE_PREFIX: prefix(&it[0], in[0], out[0], out[1]); break;
    case PTC_OP_MOE_ROUTE:
        rc = route(&it[0], in[0], in[1], in[2], it[2].dims[1], at->capacity, out[0], err, errn);
        break;
    case PTC_OP_MOE_FRAC: frac(in[0], it[0].dims[0], it[0].dims[1], out[0]); break;
    case PTC_OP_MOE_STATS: stats(in[0], it[0].dims[0], it[0].dims[1], at->capacity, out[0]); break;
    case PTC_OP_MOE_FFN:
        if (at->group > 1) {
            ptc_fmt(err, errn,
                    "moe_ffn with its experts split over a mesh axis runs as the "
                    "all-to-alls of the moe_ep pass, not as one kernel");
            return -1;
        }
        ffn(it, in, at->act, out[0]);
        break;
    case PTC_OP_MOE_FFN_GRAD:
        if (at->group > 1) {
            ptc_fmt(err, errn,
                    "moe_ffn_grad with its experts split over a mesh axis runs as the "
                    "all-to-alls of the moe_ep pass, not as one kernel");
            return -1;
        }
        ffn_grad(it, in, at->act, out);
        break;
    case PTC_OP_MOE_EP_COUNT: {
        int64_t n = ptc_type_numel(&it[0]);
        const int32_t *r = in[0];
        int32_t *c = out[0];
        memset(c, 0, sizeof(int32_t) * (size_t)at->n);
        for (int64_t i = 0; i < n && rc == 0; i++) {
            if (r[i] >= at->n) {
                ptc_fmt(err, errn, "expert id %d outside 0..%lld", r[i], (long long)(at->n - 1));
                rc = -1;
            } else if (r[i] >= 0) {
                c[r[i]]++;
            }
        }
        break;
    }
    case PTC_OP_MOE_PACK: rc = pack(&it[0], in[0], &it[1], in[1], &ot[0], out[0], err, errn); break;
    case PTC_OP_MOE_UNPACK:
    case PTC_OP_MOE_COMBINE:
        rc = combine(&it[0], in[0], &it[1], in[1], k->op == PTC_OP_MOE_COMBINE ? in[2] : NULL,
                     out[0], err, errn);
        break;
    case PTC_OP_MOE_COMBINE_GRAD:
        rc = combine_grad(&it[0], in[0], &it[1], in[1], in[2], in[3], out[0], out[1], err, errn);
        break;
    case PTC_OP_MOE_EP_FFN:
    case PTC_OP_MOE_EP_FFN_GRAD: rc = ep_ffn(k, it, in, ot, out, err, errn); break;
    default: PTC_UNREACHABLE("not a moe op");
    }
    if (rc == 0)
        ptrt_ref_round_results(k->nout, ot, out);
    return rc;
}
