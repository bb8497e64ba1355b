/* cpu_moe.c - the experts of a mixture of experts in f32 on the fast CPU backend: moe_ffn and
 * moe_ffn_grad (every expert on this rank), moe_ep_ffn and moe_ep_ffn_grad (the rows expert
 * parallelism brought to this rank's experts). ops.def and docs/moe.md say what they compute.
 *
 * The reference computes one expert on one row at a time, in double. Here the rows of an expert
 * are gathered into a block, so each product is one GEMM on the library:
 *
 *   forward   H = X W_up[e]            A = act(H)               O = A W_down[e]
 *   backward  dA = dO W_down[e]^T      dW_down[e] += A^T dO     dH = act'(H) dA
 *             dX = dH W_up[e]^T        dW_up[e] += X^T dH
 *
 * X the block's rows of x. moe_ffn's rows are its kept choices, each weighted by its gate: y of a
 * token adds gate * O of its rows, dO = gate * dy of the token, dgate = O . dy (the backward
 * recomputes H, A and O, as the reference does, rather than keeping them). An expert's rows are
 * taken in blocks of at most ptrt_cpu_moe_scratch floats of scratch (16 MiB; at least MIN_ROWS
 * rows), so the memory outside the plan is bounded whatever the step's tokens. An expert takes a
 * token at most once, so a block's rows scatter to distinct tokens and run in parallel; the GEMMs
 * split across the pool themselves.
 *
 * Sums are f32 in a fixed order (experts in order, blocks in order; within an expert its rows by
 * token), so a run repeats bit for bit. They differ from the reference's doubles by float rounding,
 * as every fast kernel does; the equivalence matrix bounds that against the single device.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "ref.h"

#define MIN_ROWS 16 /* (a GEMM of fewer rows runs well below the library's rate) */

int64_t ptrt_cpu_moe_scratch = (int64_t)1 << 22;

typedef enum { GATHER, ACT, OUT, OUT_GRAD, ACT_GRAD, SCATTER_DX } phase;

typedef struct moe_job {
    int64_t d, f, F, K;
    ptc_act act;
    const float *x, *gate, *dy;
    /* rows of expert e: first[e] .. first[e + 1]; row r reads x row src[r]; choice[r] its choice
     * (t K + j) for moe_ffn, NULL for the rows of moe_ep_ffn (no gate: row r is its own result) */
    const int64_t *first, *src, *choice;
    float *y, *dx, *dgate; /* y: moe_ffn's [T, d] or moe_ep_ffn's rows; dx: the same for dx */
    /* the block being run: rows r0 .. of the scratch below, [rows, d or F or f] each */
    phase ph;
    int64_t r0;
    float *X, *H, *A, *O, *dO, *dA, *dH, *dX, *tmp;
} moe_job;

/* where row r's result goes: its token (moe_ffn) or itself */
static int64_t dest(const moe_job *j, int64_t r)
{
    return j->choice ? j->choice[r] / j->K : j->src[r];
}

static void act_row(const moe_job *j, const float *h, float *a, float *tmp)
{
    int64_t f = j->f;
    switch (j->act) {
    case PTC_ACT_GELU: ptrt_cpu_gelu(h, a, f); break;
    case PTC_ACT_SILU: ptrt_cpu_silu(h, a, f); break;
    case PTC_ACT_RELU:
        for (int64_t c = 0; c < f; c++)
            a[c] = h[c] < 0 ? 0.0f : h[c]; /* NaN passes through, as in the reference */
        break;
    default: /* swiglu: silu(h[:f]) * h[f:] */
        ptrt_cpu_silu(h, tmp, f);
        for (int64_t c = 0; c < f; c++)
            a[c] = tmp[c] * h[f + c];
    }
}

/* dh of a row from h and da */
static void act_grad_row(const moe_job *j, const float *h, const float *da, float *dh, float *tmp)
{
    int64_t f = j->f;
    switch (j->act) {
    case PTC_ACT_GELU: ptrt_cpu_gelu_grad(h, da, dh, f); break;
    case PTC_ACT_SILU: ptrt_cpu_silu_grad(h, da, dh, f); break;
    case PTC_ACT_RELU:
        for (int64_t c = 0; c < f; c++)
            dh[c] = h[c] > 0 ? da[c] : 0.0f;
        break;
    default: /* a = silu(h1) h2: dh2 = da silu(h1), dh1 = silu'(h1) (da h2) */
        ptrt_cpu_silu(h, tmp, f);
        for (int64_t c = 0; c < f; c++) {
            dh[f + c] = da[c] * tmp[c];
            tmp[c] = da[c] * h[f + c];
        }
        ptrt_cpu_silu_grad(h, tmp, dh, f);
    }
}

/* rows [begin, end) of the block, one phase */
static void block_rows(void *ctx, int64_t begin, int64_t end)
{
    const moe_job *j = ctx;
    int64_t d = j->d, f = j->f, F = j->F;
    for (int64_t i = begin; i < end; i++) {
        int64_t r = j->r0 + i, t = dest(j, r);
        const float *g = j->choice ? &j->gate[j->choice[r]] : NULL;
        switch (j->ph) {
        case GATHER: memcpy(j->X + i * d, j->x + j->src[r] * d, sizeof(float) * (size_t)d); break;
        case ACT: act_row(j, j->H + i * F, j->A + i * f, j->tmp + i * f); break;
        case OUT: /* y of the token += gate O (moe_ffn), or the row's result */
            for (int64_t k = 0; k < d; k++)
                j->y[t * d + k] = g ? j->y[t * d + k] + *g * j->O[i * d + k] : j->O[i * d + k];
            break;
        case OUT_GRAD: { /* dgate = O . dy and dO = gate dy (moe_ffn), or the row's dO */
            const float *dy = j->dy + t * d;
            if (!g) {
                memcpy(j->dO + i * d, dy, sizeof(float) * (size_t)d);
                break;
            }
            double s = 0;
            for (int64_t k = 0; k < d; k++) {
                s += (double)j->O[i * d + k] * dy[k];
                j->dO[i * d + k] = *g * dy[k];
            }
            j->dgate[j->choice[r]] = (float)s;
            break;
        }
        case ACT_GRAD:
            act_grad_row(j, j->H + i * F, j->dA + i * f, j->dH + i * F, j->tmp + i * f);
            break;
        case SCATTER_DX:
            for (int64_t k = 0; k < d; k++)
                j->dx[t * d + k] = g ? j->dx[t * d + k] + j->dX[i * d + k] : j->dX[i * d + k];
            break;
        }
    }
}

static void run_phase(moe_job *j, phase ph, int64_t rows)
{
    j->ph = ph;
    ptrt_cpu_parallel_for(rows, 8, block_rows, j);
}

/* Every expert over its rows: y (forward), or dx, dgate and the weight gradients gup, gdown. */
static void experts(moe_job *j, int64_t E, const float *up, const float *down, float *gup,
                    float *gdown)
{
    int64_t d = j->d, f = j->f, F = j->F;
    int64_t per_row = 4 * d + 2 * F + 3 * f, most = 0;
    for (int64_t e = 0; e < E; e++)
        most = j->first[e + 1] - j->first[e] > most ? j->first[e + 1] - j->first[e] : most;
    int64_t block = ptrt_cpu_moe_scratch / per_row;
    block = block > MIN_ROWS ? block : MIN_ROWS;
    block = block < most ? block : most;
    float *s = ptc_xmalloc(sizeof(float) * (size_t)(block * per_row + 1));
    j->X = s, j->H = j->X + block * d, j->A = j->H + block * F, j->O = j->A + block * f;
    j->dO = j->O + block * d, j->dA = j->dO + block * d, j->dH = j->dA + block * f;
    j->dX = j->dH + block * F, j->tmp = j->dX + block * d;
    for (int64_t e = 0; e < E; e++) {
        const float *u = up + e * d * F, *w = down + e * f * d;
        for (j->r0 = j->first[e]; j->r0 < j->first[e + 1]; j->r0 += block) {
            int64_t c = j->first[e + 1] - j->r0 < block ? j->first[e + 1] - j->r0 : block;
            run_phase(j, GATHER, c);
            ptrt_cpu_gemm(false, false, c, F, d, 1.0f, j->X, d, u, F, 0.0f, j->H, F);
            run_phase(j, ACT, c);
            if (!gup || j->choice) /* (the gradient of moe_ffn needs O for dgate) */
                ptrt_cpu_gemm(false, false, c, d, f, 1.0f, j->A, f, w, d, 0.0f, j->O, d);
            if (!gup) {
                run_phase(j, OUT, c);
                continue;
            }
            run_phase(j, OUT_GRAD, c);
            ptrt_cpu_gemm(false, true, c, f, d, 1.0f, j->dO, d, w, d, 0.0f, j->dA, f);
            ptrt_cpu_gemm(true, false, f, d, c, 1.0f, j->A, f, j->dO, d, 1.0f, gdown + e * f * d,
                          d);
            run_phase(j, ACT_GRAD, c);
            ptrt_cpu_gemm(false, true, c, d, F, 1.0f, j->dH, F, u, F, 0.0f, j->dX, d);
            ptrt_cpu_gemm(true, false, d, F, c, 1.0f, j->X, d, j->dH, F, 1.0f, gup + e * d * F, F);
            run_phase(j, SCATTER_DX, c);
        }
    }
    free(s);
}

/* first[E + 1] from the expert of each of n rows (-1: none); src and choice (may be NULL) in
 * expert order, each expert's rows in their order. */
static void sort_rows(const int64_t *expert_of, int64_t n, int64_t E, int64_t K, int64_t *first,
                      int64_t *src, int64_t *choice)
{
    memset(first, 0, sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < n; i++)
        if (expert_of[i] >= 0)
            first[expert_of[i] + 1]++;
    for (int64_t e = 0; e < E; e++)
        first[e + 1] += first[e];
    int64_t *at = ptc_xmalloc(sizeof(int64_t) * (size_t)(E + 1));
    memcpy(at, first, sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < n; i++) {
        if (expert_of[i] < 0)
            continue;
        int64_t r = at[expert_of[i]]++;
        src[r] = choice ? i / K : i;
        if (choice)
            choice[r] = i;
    }
    free(at);
}

int ptrt_cpu_moe(const ptrt_kcall *k, const ptc_type *it, void *const *in, const ptc_type *ot,
                 void *const *out)
{
    bool ep = k->op == PTC_OP_MOE_EP_FFN || k->op == PTC_OP_MOE_EP_FFN_GRAD;
    bool grad = k->op == PTC_OP_MOE_FFN_GRAD || k->op == PTC_OP_MOE_EP_FFN_GRAD;
    if (!ep && k->attrs.group > 1) /* (the reference names the error) */
        return 0;
    const ptc_type *tu = &it[ep ? 2 : 3], *td = &it[ep ? 3 : 4];
    moe_job j = {.d = tu->dims[1],
                 .F = tu->dims[2],
                 .f = td->dims[1],
                 .act = k->attrs.act,
                 .x = in[0],
                 .y = grad ? NULL : out[0],
                 .dx = grad ? out[0] : NULL};
    int64_t E = tu->dims[0], n = ep ? it[0].dims[0] : ptc_type_numel(&it[1]);
    if (tu->rank != 3 || td->rank != 3 || td->dims[0] != E || td->dims[2] != j.d ||
        j.F != (j.act == PTC_ACT_SWIGLU ? 2 : 1) * j.f || j.d <= 0 || j.f <= 0)
        return 0; /* (experts of no width: the reference's, trivially) */
    int64_t *eo = ptc_xmalloc(sizeof(int64_t) * (size_t)(3 * n + E + 1));
    int64_t *first = eo + n, *src = first + E + 1, *choice = src + n;
    if (ep) { /* (shape inference holds w_up to the n / group experts the counts give a rank) */
        int64_t r = ptrt_ref_moe_ep_rows(in[1], k->attrs.n, k->attrs.group, k->coord, n, eo);
        if (r < 0) { /* more rows than planned: the reference says so */
            free(eo);
            return 0;
        }
        for (int64_t i = r; i < n; i++)
            eo[i] = -1;
        j.dy = grad ? in[4] : NULL;
    } else {
        const int32_t *route = in[1];
        for (int64_t i = 0; i < n; i++) {
            if (route[i] >= E) { /* an id out of range: the reference's case */
                free(eo);
                return 0;
            }
            eo[i] = route[i] < 0 ? -1 : route[i];
        }
        j.K = it[1].dims[it[1].rank - 1];
        j.gate = in[2];
        j.dy = grad ? in[5] : NULL;
        j.dgate = grad ? out[1] : NULL;
    }
    sort_rows(eo, n, E, j.K, first, src, ep ? NULL : choice);
    j.first = first, j.src = src, j.choice = ep ? NULL : choice;
    for (int o = 0; o < k->nout; o++) /* rows past those received, dropped choices: zero */
        memset(out[o], 0, sizeof(float) * (size_t)ptc_type_numel(&ot[o]));
    float *gup = grad ? out[ep ? 1 : 2] : NULL, *gdown = grad ? out[ep ? 2 : 3] : NULL;
    experts(&j, E, in[ep ? 2 : 3], in[ep ? 3 : 4], gup, gdown);
    free(eo);
    return 1;
}
