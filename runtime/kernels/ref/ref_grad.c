/* ref_grad.c - reference kernels for the internal ops: fill, broadcasting and its adjoint, pad, the
 * backward ops autodiff emits, gradient clipping and the AdamW / SGD updates.
 *
 * Each backward kernel is written from the derivative of the forward kernel it pairs with (ref*.c,
 * "Exact semantics" on the language page) and recomputes what it needs (softmax weights, norms)
 * instead of taking saved intermediates, so it can be checked against that forward kernel by finite
 * differences. Sums are accumulated in double, results stored as float; the optimizer updates do
 * all their arithmetic in double, step by step as torch/optim does, and store once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref_grad.h"
#include "ref_internal.h"

/* ---- sources, broadcasting, pad ---- */

static void fill(double value, const ptc_type *to, void *o)
{
    int64_t n = ptc_type_numel(to);
    for (int64_t i = 0; i < n; i++) {
        if (to->dtype == PTC_I32)
            ((int32_t *)o)[i] = ptrt_ref_to_i32(value);
        else
            ((float *)o)[i] = (float)value;
    }
}

/* The offset in small of element i of big, where small broadcasts to big (NumPy rules: dims
 * right-aligned, a missing or size-1 dim of small repeats). */
static int64_t bcast_offset(int64_t i, const ptc_type *big, const ptc_type *small)
{
    int64_t st[PTC_MAX_RANK], off = 0;
    ptrt_ref_strides(small, st);
    int lead = big->rank - small->rank;
    for (int d = big->rank - 1; d >= 0; d--) {
        int64_t c = i % big->dims[d];
        i /= big->dims[d];
        int sd = d - lead;
        if (sd >= 0 && small->dims[sd] != 1)
            off += c * st[sd];
    }
    return off;
}

/* Moves 4-byte words, so it serves every dtype. */
static void broadcast_to(const ptc_type *tx, const void *x, const ptc_type *to, void *o)
{
    int64_t n = ptc_type_numel(to);
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)o + i * PTRT_REF_ELEM,
               (const char *)x + bcast_offset(i, to, tx) * PTRT_REF_ELEM, PTRT_REF_ELEM);
}

/* The adjoint of broadcast_to: every element of x adds into the element of o it was copied from.
 * Like broadcast_to it takes every dtype; i32 sums are exact in the double accumulator while they
 * stay below 2^53 and are then stored as a cast would. */
static void sum_to(const ptc_type *tx, const void *x, const ptc_type *to, void *o)
{
    int64_t n = ptc_type_numel(tx), m = ptc_type_numel(to);
    bool ints = tx->dtype == PTC_I32;
    double *acc = ptc_xcalloc((size_t)m, sizeof *acc);
    for (int64_t i = 0; i < n; i++)
        acc[bcast_offset(i, tx, to)] +=
            ints ? (double)((const int32_t *)x)[i] : ((const float *)x)[i];
    for (int64_t i = 0; i < m; i++) {
        if (ints)
            ((int32_t *)o)[i] = ptrt_ref_to_i32(acc[i]);
        else
            ((float *)o)[i] = (float)acc[i];
    }
    free(acc);
}

/* The adjoint of slice: x lands at start along axis in zeros of size len (4-byte words). */
static void pad(const ptc_type *tx, const void *x, int axis, int64_t start, int64_t len, void *o)
{
    int64_t outer, n, inner;
    ptrt_ref_axis_view(tx, axis, &outer, &n, &inner);
    size_t block = (size_t)(n * inner) * PTRT_REF_ELEM;
    memset(o, 0, (size_t)(outer * len * inner) * PTRT_REF_ELEM);
    for (int64_t a = 0; a < outer; a++)
        memcpy((char *)o + (a * len + start) * inner * PTRT_REF_ELEM,
               (const char *)x + (size_t)a * block, block);
}

static void sumsq(const ptc_type *tx, const float *x, float *o)
{
    int64_t n = ptc_type_numel(tx);
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    o[0] = (float)s;
}

/* ---- elementwise and axis backward ---- */

static double sigmoid(double x)
{
    if (x >= 0) /* both forms keep exp's argument non-positive */
        return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* d/dx of relu, gelu (tanh approximation) and silu at x. */
static double unary_deriv(ptc_op op, double x)
{
    switch (op) {
    case PTC_OP_RELU_GRAD: return x > 0 ? 1.0 : 0.0;
    case PTC_OP_GELU_GRAD: {
        const double c = sqrt(2.0 / 3.14159265358979323846);
        double t = tanh(c * (x + 0.044715 * x * x * x));
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
    }
    case PTC_OP_SILU_GRAD: {
        double s = sigmoid(x);
        return s * (1 + x * (1 - s));
    }
    default: PTC_UNREACHABLE("not an elementwise backward op");
    }
}

double ptrt_ref_unary_deriv(ptc_op grad_op, double x)
{
    return unary_deriv(grad_op, x);
}

static void unary_grad(ptc_op op, int64_t n, const float *x, const float *dy, float *dx)
{
    for (int64_t i = 0; i < n; i++)
        dx[i] = op == PTC_OP_RELU_GRAD ? (x[i] > 0 ? dy[i] : 0.0f)
                                       : (float)(dy[i] * unary_deriv(op, x[i]));
}

/* dy (x's shape without axis) goes to the first position of the maximum along axis; a NaN counts as
 * the maximum, as in the forward max. */
static void max_grad(const ptc_type *tx, const float *x, const float *dy, int axis, float *dx)
{
    int64_t outer, n, inner;
    ptrt_ref_axis_view(tx, axis, &outer, &n, &inner);
    memset(dx, 0, (size_t)ptc_type_numel(tx) * sizeof *dx);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            const float *line = x + a * n * inner + c;
            int64_t best = 0;
            for (int64_t i = 1; i < n; i++) {
                float v = line[i * inner], b = line[best * inner];
                if (!isnan(b) && (v > b || isnan(v)))
                    best = i;
            }
            dx[a * n * inner + best * inner + c] = dy[a * inner + c];
        }
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax (y = log p): dx = dy - exp(y) sum(dy). */
static void softmax_grad(bool log_in, const ptc_type *ty, const float *y, const float *dy, int axis,
                         float *dx)
{
    int64_t outer, n, inner;
    ptrt_ref_axis_view(ty, axis, &outer, &n, &inner);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            int64_t base = a * n * inner + c;
            double s = 0;
            for (int64_t i = 0; i < n; i++)
                s += log_in ? (double)dy[base + i * inner]
                            : (double)dy[base + i * inner] * y[base + i * inner];
            for (int64_t i = 0; i < n; i++) {
                int64_t at = base + i * inner;
                dx[at] = (float)(log_in ? dy[at] - exp((double)y[at]) * s : y[at] * (dy[at] - s));
            }
        }
}

/* ---- normalisation backward (over the last axis) ---- */

/* With xh = (x - mean) r, r = 1/sqrt(var + eps) and e = dy g:
 * dx = r (e - mean(e) - xh mean(e xh)), dg = sum over rows of dy xh, db = sum of dy. */
static void layernorm_grad(const ptc_type *tx, const float *x, const float *g, const float *dy,
                           double eps, float *dx, float *dg, float *db)
{
    int64_t d = tx->dims[tx->rank - 1], rows = ptc_type_numel(tx) / d;
    double *sg = ptc_xcalloc((size_t)d, sizeof *sg), *sb = ptc_xcalloc((size_t)d, sizeof *sb);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *dyr = dy + r * d;
        double mean = 0, var = 0, me = 0, mexh = 0;
        for (int64_t i = 0; i < d; i++)
            mean += xr[i];
        mean /= (double)d;
        for (int64_t i = 0; i < d; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        var /= (double)d;
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t i = 0; i < d; i++) {
            double xh = (xr[i] - mean) * inv, e = (double)dyr[i] * g[i];
            me += e;
            mexh += e * xh;
            sg[i] += (double)dyr[i] * xh;
            sb[i] += dyr[i];
        }
        me /= (double)d;
        mexh /= (double)d;
        for (int64_t i = 0; i < d; i++) {
            double xh = (xr[i] - mean) * inv;
            dx[r * d + i] = (float)(inv * ((double)dyr[i] * g[i] - me - xh * mexh));
        }
    }
    for (int64_t i = 0; i < d; i++) {
        dg[i] = (float)sg[i];
        db[i] = (float)sb[i];
    }
    free(sg);
    free(sb);
}

/* y = x r g with r = 1/sqrt(mean(x^2) + eps) and e = dy g:
 * dx = r e - x r^3 mean(e x), dg = sum over rows of dy x r. */
static void rmsnorm_grad(const ptc_type *tx, const float *x, const float *g, const float *dy,
                         double eps, float *dx, float *dg)
{
    int64_t d = tx->dims[tx->rank - 1], rows = ptc_type_numel(tx) / d;
    double *sg = ptc_xcalloc((size_t)d, sizeof *sg);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *dyr = dy + r * d;
        double ms = 0, mex = 0;
        for (int64_t i = 0; i < d; i++)
            ms += (double)xr[i] * xr[i];
        ms /= (double)d;
        double inv = 1.0 / sqrt(ms + eps);
        for (int64_t i = 0; i < d; i++) {
            mex += (double)dyr[i] * g[i] * xr[i];
            sg[i] += (double)dyr[i] * xr[i] * inv;
        }
        mex /= (double)d;
        for (int64_t i = 0; i < d; i++)
            dx[r * d + i] = (float)(inv * dyr[i] * g[i] - xr[i] * inv * inv * inv * mex);
    }
    for (int64_t i = 0; i < d; i++)
        dg[i] = (float)sg[i];
    free(sg);
}

/* ---- model and loss backward ---- */

/* dtable [rows, D]: row ids[i] gathers dy row i (repeated ids add up). */
static int embedding_grad(const ptc_type *ti, const int32_t *ids, const ptc_type *tdy,
                          const float *dy, const ptc_type *to, float *o, char *err, size_t errn)
{
    int64_t rows = to->dims[0], d = to->dims[1], n = ptc_type_numel(ti);
    PTC_ASSERT(ptc_type_numel(tdy) == n * d); /* inference checks only the rank of dy */
    double *acc = ptc_xcalloc((size_t)(rows * d), sizeof *acc);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= rows) {
            ptc_fmt(err, errn,
                    "embedding_grad: id %d at position %lld is out of range for a table of %lld "
                    "rows (valid ids are 0 to %lld)",
                    (int)ids[i], (long long)i, (long long)rows, (long long)(rows - 1));
            free(acc);
            return -1;
        }
        for (int64_t j = 0; j < d; j++)
            acc[(int64_t)ids[i] * d + j] += dy[i * d + j];
    }
    for (int64_t i = 0; i < rows * d; i++)
        o[i] = (float)acc[i];
    free(acc);
    return 0;
}

/* The shapes of one attention: q [nb, s, qf] with heads of dh, k and v [nb, s2, kf]. */
typedef struct attn_dims {
    int64_t nb, s, qf, s2, kf, dh, heads, group;
    bool causal;
    double scale;
} attn_dims;

/* The softmax weights p[0..nkeys) of query i of head h in batch b, exactly as the forward computes
 * them; returns nkeys (causal leaves out keys after the query position). */
static int64_t attn_probs(const attn_dims *a, const float *q, const float *k, int64_t b, int64_t h,
                          int64_t i, double *p)
{
    const float *qi = q + (b * a->s + i) * a->qf + h * a->dh;
    int64_t kh = h / a->group, nkeys = a->causal && i + 1 < a->s2 ? i + 1 : a->s2;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < nkeys; j++) {
        const float *kj = k + (b * a->s2 + j) * a->kf + kh * a->dh;
        double dot = 0;
        for (int64_t d = 0; d < a->dh; d++)
            dot += (double)qi[d] * kj[d];
        p[j] = dot * a->scale;
        if (p[j] > mx)
            mx = p[j];
    }
    for (int64_t j = 0; j < nkeys; j++) {
        p[j] = exp(p[j] - mx);
        sum += p[j];
    }
    for (int64_t j = 0; j < nkeys; j++)
        p[j] /= sum;
    return nkeys;
}

/* One query row: o_i = sum_j p_j v_j, so dv_j += p_j dy_i, dp_j = dy_i . v_j, and through the
 * softmax ds_j = p_j (dp_j - sum_l p_l dp_l); the scores are scale q_i . k_j, so
 * dq_i += scale ds_j k_j and dk_j += scale ds_j q_i. Accumulates into gq, gk, gv (double). */
static void attn_row_grad(const attn_dims *a, const float *q, const float *k, const float *v,
                          const float *dy, int64_t b, int64_t h, int64_t i, double *p, double *dp,
                          double *gq, double *gk, double *gv)
{
    int64_t nkeys = attn_probs(a, q, k, b, h, i, p), kh = h / a->group;
    int64_t qo = (b * a->s + i) * a->qf + h * a->dh;
    double pdp = 0;
    for (int64_t j = 0; j < nkeys; j++) {
        int64_t ko = (b * a->s2 + j) * a->kf + kh * a->dh;
        dp[j] = 0;
        for (int64_t d = 0; d < a->dh; d++) {
            dp[j] += (double)dy[qo + d] * v[ko + d];
            gv[ko + d] += p[j] * dy[qo + d];
        }
        pdp += p[j] * dp[j];
    }
    for (int64_t j = 0; j < nkeys; j++) {
        int64_t ko = (b * a->s2 + j) * a->kf + kh * a->dh;
        double ds = p[j] * (dp[j] - pdp) * a->scale;
        for (int64_t d = 0; d < a->dh; d++) {
            gq[qo + d] += ds * k[ko + d];
            gk[ko + d] += ds * q[qo + d];
        }
    }
}

static void store(int64_t n, const double *src, float *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)src[i];
}

/* Recomputes the softmax of every (batch, head, query) and takes it back. With grouped-query
 * attention a kv head's dk, dv add up the contributions of all the query heads that share it. */
static void attention_grad(const ptc_type *tq, const ptc_type *tk, void *const *in, int64_t heads,
                           int64_t kv_heads, bool causal, void *const *out)
{
    const float *q = in[0], *k = in[1], *v = in[2], *dy = in[3];
    attn_dims a = {.nb = tq->dims[0],
                   .s = tq->dims[1],
                   .qf = tq->dims[2],
                   .s2 = tk->dims[1],
                   .kf = tk->dims[2],
                   .heads = heads,
                   .causal = causal};
    a.dh = a.qf / heads;
    a.group = heads / kv_heads;
    a.scale = 1.0 / sqrt((double)a.dh);
    PTC_ASSERT(a.group * kv_heads == heads && kv_heads * a.dh == a.kf);
    int64_t nq = ptc_type_numel(tq), nk = ptc_type_numel(tk);
    double *gq = ptc_xcalloc((size_t)nq, sizeof *gq), *gk = ptc_xcalloc((size_t)nk, sizeof *gk);
    double *gv = ptc_xcalloc((size_t)nk, sizeof *gv);
    double *p = ptc_xmalloc((size_t)a.s2 * sizeof *p), *dp = ptc_xmalloc((size_t)a.s2 * sizeof *dp);
    for (int64_t b = 0; b < a.nb; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < a.s; i++)
                attn_row_grad(&a, q, k, v, dy, b, h, i, p, dp, gq, gk, gv);
    store(nq, gq, out[0]);
    store(nk, gk, out[1]);
    store(nk, gv, out[2]);
    free(gq);
    free(gk);
    free(gv);
    free(p);
    free(dp);
}

/* rope turns each pair by theta; its transpose (and inverse) turns it by -theta. */
static void rope_grad(const ptc_type *ty, const float *dy, int64_t heads, double base, float *dx)
{
    int64_t nb = ty->dims[0], s = ty->dims[1], f = ty->dims[2], dh = f / heads;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t p = 0; p < s; p++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t j = 0; j < dh / 2; j++) {
                    double theta = (double)p * pow(base, -2.0 * (double)j / (double)dh);
                    double c = cos(theta), sn = sin(theta);
                    int64_t at = (b * s + p) * f + h * dh + 2 * j;
                    double y0 = dy[at], y1 = dy[at + 1];
                    dx[at] = (float)(y0 * c + y1 * sn);
                    dx[at + 1] = (float)(-y0 * sn + y1 * c);
                }
}

/* The loss is the mean over rows of logsumexp(row) - row[target]:
 * dlogits = (softmax(row) - onehot(target)) dloss / rows. */
static int cross_entropy_grad(const ptc_type *tl, const float *logits, const int32_t *targets,
                              const float *dloss, float *o, char *err, size_t errn)
{
    int64_t c = tl->dims[tl->rank - 1], rows = ptc_type_numel(tl) / c;
    double scale = (double)dloss[0] / (double)rows;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = logits + r * c;
        int32_t t = targets[r];
        if (ptrt_ref_check_target("cross_entropy_grad", t, r, c, err, errn) < 0)
            return -1;
        double mx, sum = exp(ptrt_ref_logsumexp(row, c, &mx) - mx);
        for (int64_t i = 0; i < c; i++)
            o[r * c + i] = (float)((exp(row[i] - mx) / sum - (i == t ? 1.0 : 0.0)) * scale);
    }
    return 0;
}

/* ---- optimizer ---- */

/* torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)); written so that a NaN norm
 * gives NaN as torch.clamp does (fmin would hide it), and max_norm = inf gives 1. */
static void clip_coef(const float *sumsq_, const float *max_norm, float *o)
{
    double c = (double)max_norm[0] / (sqrt((double)sumsq_[0]) + 1e-6);
    o[0] = (float)(c > 1.0 ? 1.0 : c);
}

/* torch/optim/adamw.py, single tensor, no amsgrad; lr and step (from 1) are f32 scalars. */
static void adamw_update(int64_t n, void *const *in, const ptc_attrs *at, void *const *out)
{
    const float *p = in[0], *g = in[1], *m = in[2], *v = in[3];
    double lr = ((const float *)in[4])[0], step = ((const float *)in[5])[0];
    float *po = out[0], *mo = out[1], *vo = out[2];
    double b1 = at->beta1, b2 = at->beta2;
    double bias_c1 = 1 - pow(b1, step), bias_c2 = 1 - pow(b2, step);
    double step_size = lr / bias_c1, bias_c2_sqrt = sqrt(bias_c2);
    for (int64_t i = 0; i < n; i++) {
        double pi = p[i] * (1 - lr * at->wd);
        double mi = b1 * m[i] + (1 - b1) * g[i];
        double vi = b2 * v[i] + (1 - b2) * (double)g[i] * g[i];
        double denom = sqrt(vi) / bias_c2_sqrt + at->eps;
        po[i] = (float)(pi - step_size * mi / denom);
        mo[i] = (float)mi;
        vo[i] = (float)vi;
    }
}

/* torch/optim/sgd.py, dampening 0, no nesterov. The buffer starts at zeros, so the first step's
 * momentum * 0 + d equals torch's buf = clone(d). Without momentum the buffer is passed through. */
static void sgd_update(int64_t n, void *const *in, const ptc_attrs *at, void *const *out)
{
    const float *p = in[0], *g = in[1], *buf = in[2];
    double lr = ((const float *)in[3])[0];
    float *po = out[0], *bo = out[1];
    for (int64_t i = 0; i < n; i++) {
        double d = g[i] + at->wd * p[i];
        if (at->momentum != 0) {
            d = at->momentum * buf[i] + d;
            bo[i] = (float)d;
        } else {
            bo[i] = buf[i];
        }
        po[i] = (float)(p[i] - lr * d);
    }
}

/* ---- dispatch ---- */

int ptrt_ref_run_internal(const ptrt_kcall *n, const ptc_type *it, void *const *in,
                          const ptc_type *ot, void *const *out, char *err, size_t errn)
{
    const ptc_attrs *at = &n->attrs;
    const char *name = (unsigned)n->op < PTC_NOPS ? ptc_ops[n->op].name : "?";
    int axis = (int)at->axis, rc = 0;
    if (errn)
        err[0] = '\0';
    switch (n->op) {
    case PTC_OP_STATE:
        ptc_fmt(err, errn, "%s is a source op: the executor fills it, there is no kernel to run",
                name);
        return -1;
    case PTC_OP_FILL: fill(at->value, &ot[0], out[0]); break;
    case PTC_OP_BROADCAST_TO: broadcast_to(&it[0], in[0], &ot[0], out[0]); break;
    case PTC_OP_SUM_TO: sum_to(&it[0], in[0], &ot[0], out[0]); break;
    case PTC_OP_PAD: pad(&it[0], in[0], axis, at->start, at->len, out[0]); break;
    case PTC_OP_SUMSQ: sumsq(&it[0], in[0], out[0]); break;
    case PTC_OP_RELU_GRAD:
    case PTC_OP_GELU_GRAD:
    case PTC_OP_SILU_GRAD: unary_grad(n->op, ptc_type_numel(&it[0]), in[0], in[1], out[0]); break;
    case PTC_OP_MAX_GRAD: max_grad(&it[0], in[0], in[1], axis, out[0]); break;
    case PTC_OP_SOFTMAX_GRAD:
    case PTC_OP_LOG_SOFTMAX_GRAD:
        softmax_grad(n->op == PTC_OP_LOG_SOFTMAX_GRAD, &it[0], in[0], in[1], axis, out[0]);
        break;
    case PTC_OP_LAYERNORM_GRAD:
        layernorm_grad(&it[0], in[0], in[1], in[2], at->eps, out[0], out[1], out[2]);
        break;
    case PTC_OP_RMSNORM_GRAD:
        rmsnorm_grad(&it[0], in[0], in[1], in[2], at->eps, out[0], out[1]);
        break;
    case PTC_OP_EMBEDDING_GRAD:
        rc = embedding_grad(&it[0], in[0], &it[1], in[1], &ot[0], out[0], err, errn);
        break;
    case PTC_OP_ATTENTION_GRAD:
        attention_grad(&it[0], &it[1], in, at->heads, at->kv_heads ? at->kv_heads : at->heads,
                       at->causal, out);
        break;
    case PTC_OP_ROPE_GRAD: rope_grad(&it[0], in[0], at->heads, at->base, out[0]); break;
    case PTC_OP_CROSS_ENTROPY_GRAD:
        rc = cross_entropy_grad(&it[0], in[0], in[1], in[2], out[0], err, errn);
        break;
    case PTC_OP_CLIP_COEF: clip_coef(in[0], in[1], out[0]); break;
    case PTC_OP_ADAMW_UPDATE: adamw_update(ptc_type_numel(&it[0]), in, at, out); break;
    case PTC_OP_SGD_UPDATE: sgd_update(ptc_type_numel(&it[0]), in, at, out); break;
    default: ptc_fmt(err, errn, "%s is not an internal op (ptrt_ref_run runs it)", name); return -1;
    }
    if (rc == 0)
        ptrt_ref_round_results(ptc_ops[n->op].nout, ot, out);
    return rc;
}
