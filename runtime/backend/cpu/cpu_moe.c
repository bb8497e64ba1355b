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
 * rows), so the memory outside the plan is bounded whatever the step's tokens.
 *
 * Two ways to use the threads. Split: one expert at a time, each GEMM split across the pool, a
 * block's rows (an expert takes a token at most once, so they scatter to distinct tokens) in
 * parallel. Lanes: experts side by side, a lane (a piece of the pool) running whole experts on one
 * thread, each GEMM serial. Small experts' GEMMs split poorly (moe_small's, 2 x 256 rows of
 * 256 x 1024: 1.69x at 2 threads against 1.85x for the step's other GEMMs), and lanes sync once per
 * call instead of twice per product. Lanes get experts by their rows, the most first, each to the
 * least loaded lane. Two experts of a token then run at once, so moe_ffn's lanes leave each row's
 * result (gate O, or dX) in a buffer of its own, [choices, d], and a last pass adds a token's rows
 * in expert order. Lanes are taken when the buffer fits the scratch limit too and the busiest lane
 * has at most LANE_SLACK times its share of the rows (ptrt_cpu_moe_lanes forces either way).
 *
 * Sums are f32 in a fixed order (a token's rows in expert order; an expert's blocks in order;
 * within a block its rows by token), so a run repeats bit for bit; with lanes the bits are the
 * same at any thread count above one, as each expert runs on one thread whichever lane takes it.
 * They differ from the reference's doubles by float rounding, as every fast kernel does; the
 * equivalence matrix bounds that against the single device.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_internal.h"
#include "ref.h"

#define MIN_ROWS 16     /* (a GEMM of fewer rows runs well below the library's rate) */
#define LANE_SLACK 1.15 /* the busiest lane's rows over its share, at most, for lanes */

int64_t ptrt_cpu_moe_scratch = (int64_t)1 << 22;
int ptrt_cpu_moe_lanes = -1;

typedef enum { GATHER, ACT, OUT, OUT_GRAD, ACT_GRAD, SCATTER_DX } phase;

typedef struct moe_job {
    int64_t d, f, F, K;
    ptc_act act;
    const float *x, *gate, *dy;
    /* rows of expert e: first[e] .. first[e + 1]; row r reads x row src[r]; choice[r] its choice
     * (t K + j) for moe_ffn, NULL for the rows of moe_ep_ffn (no gate: row r is its own result) */
    const int64_t *first, *src, *choice;
    float *y, *dx, *dgate; /* y: moe_ffn's [T, d] or moe_ep_ffn's rows; dx: the same for dx */
    bool by_row;           /* y or dx are [rows, d], row r's own result (moe_ffn's lanes) */
    bool serial;           /* GEMMs and phases on the calling thread (a lane) */
    /* the block being run: rows r0 .. of the scratch below, [rows, d or F or f] each */
    phase ph;
    int64_t r0;
    float *X, *H, *A, *O, *dO, *dA, *dH, *dX, *tmp;
} moe_job;

/* row r's token (moe_ffn), or the row itself (moe_ep_ffn) */
static int64_t token(const moe_job *j, int64_t r)
{
    return j->choice ? j->choice[r] / j->K : j->src[r];
}

/* where row r's result goes: its token, or its own row of the lanes' buffer */
static int64_t dest(const moe_job *j, int64_t r)
{
    return j->by_row ? r : token(j, r);
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
        bool add = g && !j->by_row; /* (into a token that other rows add to) */
        switch (j->ph) {
        case GATHER: memcpy(j->X + i * d, j->x + j->src[r] * d, sizeof(float) * (size_t)d); break;
        case ACT: act_row(j, j->H + i * F, j->A + i * f, j->tmp + i * f); break;
        case OUT: /* y of the token += gate O (moe_ffn; lanes: gate O, the row's own), or the row */
            for (int64_t k = 0; k < d; k++)
                j->y[t * d + k] = add ? j->y[t * d + k] + *g * j->O[i * d + k]
                                  : g ? *g * j->O[i * d + k]
                                      : j->O[i * d + k];
            break;
        case OUT_GRAD: { /* dgate = O . dy and dO = gate dy (moe_ffn), or the row's dO */
            const float *dy = j->dy + token(j, r) * d;
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
                j->dx[t * d + k] = add ? j->dx[t * d + k] + j->dX[i * d + k] : j->dX[i * d + k];
            break;
        }
    }
}

static void run_phase(moe_job *j, phase ph, int64_t rows)
{
    j->ph = ph;
    if (j->serial)
        block_rows(j, 0, rows);
    else
        ptrt_cpu_parallel_for(rows, 8, block_rows, j);
}

static void gemm(const moe_job *j, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                 int64_t ldc)
{
    (j->serial ? ptrt_cpu_gemm_serial : ptrt_cpu_gemm)(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta,
                                                       c, ldc);
}

static int64_t per_row(const moe_job *j)
{
    return 4 * j->d + 2 * j->F + 3 * j->f;
}

/* The blocks' scratch: an anonymous mapping, returned to the system when the call ends. (From
 * malloc, glibc kept the freed megabytes of the calls in its heaps: moe_small ran 76.7 MiB past
 * its plan instead of 57.1, bench/results/memory_rss_2026-11-27_174748.md.) */
static float *scratch_alloc(size_t floats, bool *mapped)
{
    void *p = ptrt_host_alloc(sizeof(float) * floats);
    *mapped = p != NULL;
    return p ? p : ptc_xmalloc(sizeof(float) * floats);
}

static void scratch_free(float *s, size_t floats, bool mapped)
{
    if (mapped)
        ptrt_host_free(s, sizeof(float) * floats);
    else
        free(s);
}

/* rows of a block with budget floats of scratch, for experts of at most most rows */
static int64_t block_of(const moe_job *j, int64_t budget, int64_t most)
{
    int64_t block = budget / per_row(j);
    block = block > MIN_ROWS ? block : MIN_ROWS;
    return block < most ? block : most;
}

/* point the job's block matrices into s, of block rows */
static void use_scratch(moe_job *j, float *s, int64_t block)
{
    int64_t d = j->d, f = j->f, F = j->F;
    j->X = s, j->H = j->X + block * d, j->A = j->H + block * F, j->O = j->A + block * f;
    j->dO = j->O + block * d, j->dA = j->dO + block * d, j->dH = j->dA + block * f;
    j->dX = j->dH + block * F, j->tmp = j->dX + block * d;
}

typedef struct weights {
    const float *up, *down;
    float *gup, *gdown; /* NULL for the forward */
} weights;

/* Expert e over its rows, a block of at most block rows at a time: y (forward), or dx, dgate
 * and e's weight gradients. */
static void expert(moe_job *j, int64_t e, int64_t block, const weights *w)
{
    int64_t d = j->d, f = j->f, F = j->F;
    const float *u = w->up + e * d * F, *dn = w->down + e * f * d;
    float *gup = w->gup ? w->gup + e * d * F : NULL,
          *gdown = w->gdown ? w->gdown + e * f * d : NULL;
    for (j->r0 = j->first[e]; j->r0 < j->first[e + 1]; j->r0 += block) {
        int64_t c = j->first[e + 1] - j->r0 < block ? j->first[e + 1] - j->r0 : block;
        run_phase(j, GATHER, c);
        gemm(j, false, false, c, F, d, j->X, d, u, F, 0.0f, j->H, F);
        run_phase(j, ACT, c);
        if (!gup || j->choice) /* (the gradient of moe_ffn needs O for dgate) */
            gemm(j, false, false, c, d, f, j->A, f, dn, d, 0.0f, j->O, d);
        if (!gup) {
            run_phase(j, OUT, c);
            continue;
        }
        run_phase(j, OUT_GRAD, c);
        gemm(j, false, true, c, f, d, j->dO, d, dn, d, 0.0f, j->dA, f);
        gemm(j, true, false, f, d, c, j->A, f, j->dO, d, 1.0f, gdown, d);
        run_phase(j, ACT_GRAD, c);
        gemm(j, false, true, c, d, F, j->dH, F, u, F, 0.0f, j->dX, d);
        gemm(j, true, false, d, F, c, j->X, d, j->dH, F, 1.0f, gup, F);
        run_phase(j, SCATTER_DX, c);
    }
}

/* ---- lanes ---- */

static int64_t rows_of(const moe_job *j, int64_t e)
{
    return j->first[e + 1] - j->first[e];
}

/* The experts with rows to nl lanes, the most rows first (then by number), each to the least
 * loaded lane (then the first): lane l's are of[start[l] .. start[l + 1]). Returns the rows of
 * the busiest lane. */
static int64_t assign_lanes(const moe_job *j, int64_t E, int64_t nl, int64_t *of, int64_t *start)
{
    int64_t *by = ptc_xmalloc(sizeof(int64_t) * (size_t)(2 * E + nl));
    int64_t *lane = by + E, *load = lane + E, busy = 0, peak = 0;
    for (int64_t e = 0; e < E; e++) {
        if (rows_of(j, e) == 0)
            continue;
        int64_t at = busy++;
        for (; at > 0 && rows_of(j, by[at - 1]) < rows_of(j, e); at--)
            by[at] = by[at - 1];
        by[at] = e;
    }
    memset(load, 0, sizeof(int64_t) * (size_t)nl);
    for (int64_t i = 0; i < busy; i++) {
        int64_t least = 0;
        for (int64_t l = 1; l < nl; l++)
            least = load[l] < load[least] ? l : least;
        lane[i] = least;
        load[least] += rows_of(j, by[i]);
        peak = load[least] > peak ? load[least] : peak;
    }
    int64_t at = 0;
    for (int64_t l = 0; l < nl; l++) {
        start[l] = at;
        for (int64_t i = 0; i < busy; i++)
            if (lane[i] == l)
                of[at++] = by[i];
    }
    start[nl] = at;
    free(by);
    return peak;
}

typedef struct lanes {
    const moe_job *job;
    const weights *w;
    const int64_t *of, *start; /* lane l's experts: of[start[l] .. start[l + 1]) */
    int64_t block;             /* rows of a lane's block, in its scratch */
    float *scratch;            /* lane l's: scratch + l block per_row */
} lanes;

static void lane_run(void *ctx, int64_t begin, int64_t end)
{
    const lanes *L = ctx;
    for (int64_t l = begin; l < end; l++) {
        moe_job j = *L->job;
        use_scratch(&j, L->scratch + l * L->block * per_row(&j), L->block);
        for (int64_t i = L->start[l]; i < L->start[l + 1]; i++)
            expert(&j, L->of[i], L->block, L->w);
    }
}

typedef struct combine {
    int64_t d, K;
    const int64_t *pos; /* the row of each choice (-1: dropped) */
    const float *rows;  /* each row's result */
    float *to;          /* y or dx, [T, d] */
} combine;

/* tokens [begin, end): the sum of each one's rows, in expert order (their rows' order) */
static void combine_rows(void *ctx, int64_t begin, int64_t end)
{
    const combine *c = ctx;
    int64_t d = c->d, K = c->K;
    for (int64_t t = begin; t < end; t++) {
        int64_t r[16], n = 0; /* (run_lanes takes K <= 16) */
        for (int64_t i = t * K; i < (t + 1) * K; i++) {
            int64_t p = c->pos[i], at = n;
            if (p < 0)
                continue;
            for (n++; at > 0 && r[at - 1] > p; at--)
                r[at] = r[at - 1];
            r[at] = p;
        }
        float *o = c->to + t * d;
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < d; k++)
                o[k] = i ? o[k] + c->rows[r[i] * d + k] : c->rows[r[i] * d + k];
    }
}

/* Experts side by side (see the top) when it pays; false to run them split. n: the rows
 * (moe_ffn: choices) of the call. */
static bool run_lanes(moe_job *j, int64_t E, const weights *w, int64_t n)
{
    int64_t busy = 0, most = 0, rows = j->first[E];
    for (int64_t e = 0; e < E; e++) {
        busy += rows_of(j, e) > 0;
        most = rows_of(j, e) > most ? rows_of(j, e) : most;
    }
    int64_t nl = ptrt_cpu_threads() < busy ? ptrt_cpu_threads() : busy;
    bool by_row = j->choice != NULL, forced = ptrt_cpu_moe_lanes > 0;
    if (ptrt_cpu_moe_lanes == 0 || nl < 2 || (by_row && j->K > 16) ||
        (!forced && by_row && n * j->d > ptrt_cpu_moe_scratch))
        return false;
    int64_t *of = ptc_xmalloc(sizeof(int64_t) * (size_t)(E + nl + 1)), *start = of + E;
    int64_t peak = assign_lanes(j, E, nl, of, start);
    if (!forced && (double)peak * (double)nl > LANE_SLACK * (double)rows) {
        free(of);
        return false;
    }
    int64_t block = block_of(j, ptrt_cpu_moe_scratch / nl, most), mine = block * per_row(j);
    size_t floats = (size_t)(nl * mine + (by_row ? n * j->d : 0));
    bool mapped;
    float *s = scratch_alloc(floats, &mapped);
    /* moe_ffn: each row's result into a buffer of its own, then added per token */
    float *rb = s + nl * mine, *to = w->gup ? j->dx : j->y;
    moe_job jl = *j;
    jl.serial = true;
    jl.by_row = by_row;
    if (by_row)
        *(w->gup ? &jl.dx : &jl.y) = rb;
    lanes L = {.job = &jl, .w = w, .of = of, .start = start, .block = block, .scratch = s};
    ptrt_cpu_parallel_for(nl, 1, lane_run, &L);
    if (by_row) {
        int64_t *pos = ptc_xmalloc(sizeof(int64_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            pos[i] = -1;
        for (int64_t r = 0; r < rows; r++)
            pos[j->choice[r]] = r;
        combine c = {.d = j->d, .K = j->K, .pos = pos, .rows = rb, .to = to};
        ptrt_cpu_parallel_for(n / j->K, 8, combine_rows, &c);
        free(pos);
    }
    scratch_free(s, floats, mapped);
    free(of);
    return true;
}

/* Every expert over its rows: y (forward), or dx, dgate and the weight gradients. n: the rows
 * (moe_ffn: choices) of the call. */
static void experts(moe_job *j, int64_t E, const weights *w, int64_t n)
{
    if (run_lanes(j, E, w, n))
        return;
    int64_t most = 0;
    for (int64_t e = 0; e < E; e++)
        most = rows_of(j, e) > most ? rows_of(j, e) : most;
    int64_t block = block_of(j, ptrt_cpu_moe_scratch, most);
    size_t floats = (size_t)(block * per_row(j) + 1);
    bool mapped;
    float *s = scratch_alloc(floats, &mapped);
    use_scratch(j, s, block);
    for (int64_t e = 0; e < E; e++)
        expert(j, e, block, w);
    scratch_free(s, floats, mapped);
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
    int64_t *first = ptc_xmalloc(sizeof(int64_t) * (size_t)(2 * n + E + 1));
    int64_t *src = first + E + 1, *choice = ep ? NULL : src + n;
    char why[160];
    if (ptrt_moe_rows(k, it, in[1], first, src, choice, why, sizeof why) < 0) {
        free(first); /* (the reference says why) */
        return 0;
    }
    if (ep) {
        j.dy = grad ? in[4] : NULL;
    } else {
        j.K = it[1].dims[it[1].rank - 1];
        j.gate = in[2];
        j.dy = grad ? in[5] : NULL;
        j.dgate = grad ? out[1] : NULL;
    }
    j.first = first, j.src = src, j.choice = choice;
    for (int o = 0; o < k->nout; o++) /* rows past those received, dropped choices: zero */
        memset(out[o], 0, sizeof(float) * (size_t)ptc_type_numel(&ot[o]));
    weights w = {.up = in[ep ? 2 : 3],
                 .down = in[ep ? 3 : 4],
                 .gup = grad ? out[ep ? 1 : 2] : NULL,
                 .gdown = grad ? out[ep ? 2 : 3] : NULL};
    experts(&j, E, &w, n);
    free(first);
    return 1;
}
