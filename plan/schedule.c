/* schedule.c - pipeline schedules and their simulation (see schedule.h).
 *
 * Every schedule is a fixed order of forward and backward tasks per rank; zb-h1 also places the
 * weight-gradient tasks, greedily: a rank whose next forward or backward cannot start yet (its
 * input has not arrived) runs its oldest pending weight gradient instead, and before a forward
 * that would put more microbatches in flight than 1F1B does, it runs one. The simulation is list
 * scheduling in time order with the unit costs of schedule.h, so the orders, the makespan and the
 * bubble are exact for equal stages; a real run keeps the orders, whatever the times.
 */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

static const char *const names[PTC_NPP_SCHEDULES] = {"gpipe", "1f1b", "interleaved", "zb-h1"};

const char *ptc_pp_schedule_name(int s)
{
    return s >= 0 && s < PTC_NPP_SCHEDULES ? names[s] : "?";
}

int ptc_pp_schedule_parse(const char *name)
{
    for (int s = 0; s < PTC_NPP_SCHEDULES; s++)
        if (strcmp(name, names[s]) == 0)
            return s;
    return -1;
}

bool ptc_pp_splits_backward(ptc_pp_schedule kind)
{
    return kind == PTC_PP_ZB_H1;
}

double ptc_pp_bubble_formula(ptc_pp_schedule kind, int P, int M, int V)
{
    switch (kind) {
    case PTC_PP_INTERLEAVED: return (double)(P - 1) / (double)(V * M + P - 1);
    case PTC_PP_ZB_H1: return (double)(P - 1) / (double)(3 * M + P - 1);
    default: return (double)(P - 1) / (double)(M + P - 1);
    }
}

/* ---- the forward/backward order of each rank ---- */

typedef struct seq {
    ptc_task *t;
    int n, cap;
} seq;

static void push(seq *s, int kind, int mb, int chunk)
{
    PTC_GROW(s->t, s->cap, s->n);
    s->t[s->n++] = (ptc_task){(uint8_t)kind, mb, chunk};
}

static void order_gpipe(seq *s, int M)
{
    for (int m = 0; m < M; m++)
        push(s, PTC_TASK_F, m, 0);
    for (int m = 0; m < M; m++)
        push(s, PTC_TASK_B, m, 0);
}

static void order_1f1b(seq *s, int rank, int P, int M)
{
    int warm = P - rank - 1 < M ? P - rank - 1 : M;
    for (int m = 0; m < warm; m++)
        push(s, PTC_TASK_F, m, 0);
    for (int i = 0; i < M - warm; i++) {
        push(s, PTC_TASK_F, warm + i, 0);
        push(s, PTC_TASK_B, i, 0);
    }
    for (int m = M - warm; m < M; m++)
        push(s, PTC_TASK_B, m, 0);
}

/* Megatron's interleaved order: the k-th forward (backward) of a rank works on chunk
 * (k mod PV) / P (reversed for backwards) and microbatch (k / PV) P + k mod P. */
static void interleaved_task(seq *s, int kind, int k, int P, int V)
{
    int chunk = (k % (P * V)) / P;
    if (kind == PTC_TASK_B)
        chunk = V - 1 - chunk;
    push(s, kind, (k / (P * V)) * P + k % P, chunk);
}

static void order_interleaved(seq *s, int rank, int P, int M, int V)
{
    int total = M * V, warm = (P - rank - 1) * 2 + (V - 1) * P;
    if (warm > total)
        warm = total;
    for (int k = 0; k < warm; k++)
        interleaved_task(s, PTC_TASK_F, k, P, V);
    for (int k = 0; k < total - warm; k++) {
        interleaved_task(s, PTC_TASK_F, warm + k, P, V);
        interleaved_task(s, PTC_TASK_B, k, P, V);
    }
    for (int k = total - warm; k < total; k++)
        interleaved_task(s, PTC_TASK_B, k, P, V);
}

/* ---- simulation ---- */

typedef struct sim {
    int P, M, V;
    bool split;
    double *done; /* [kind][virtual stage][mb] finish time, or -1 */
} sim;

static double *slot(sim *s, int kind, int vstage, int mb)
{
    return &s->done[((size_t)kind * (size_t)(s->P * s->V) + (size_t)vstage) * (size_t)s->M +
                    (size_t)mb];
}

/* When task t of rank r may start as far as its inputs go, or -1 if one is not scheduled yet. */
static double ready_at(sim *s, int r, const ptc_task *t)
{
    int v = t->chunk * s->P + r, last = s->P * s->V - 1;
    double dep = 0;
    switch (t->kind) {
    case PTC_TASK_F: dep = v > 0 ? *slot(s, PTC_TASK_F, v - 1, t->mb) : 0; break;
    case PTC_TASK_B:
        dep = *slot(s, PTC_TASK_F, v, t->mb);
        if (dep >= 0 && v < last)
            dep = *slot(s, PTC_TASK_B, v + 1, t->mb) >= 0
                      ? (dep > *slot(s, PTC_TASK_B, v + 1, t->mb) ? dep
                                                                  : *slot(s, PTC_TASK_B, v + 1, t->mb))
                      : -1;
        break;
    default: dep = *slot(s, PTC_TASK_B, v, t->mb); break;
    }
    return dep;
}

static double cost(const sim *s, int kind)
{
    return kind == PTC_TASK_B && !s->split ? 2.0 : 1.0;
}

typedef struct rank_state {
    int next;     /* next task of the forward/backward sequence */
    double free;  /* when the rank is free */
    int *pending; /* microbatch*V + chunk of B's whose W has not run (oldest first) */
    int npending, head;
    int inflight, max_inflight;
} rank_state;

/* The next task rank r runs and when it starts; false when it must wait for another rank. */
static bool choose(sim *s, const seq *fb, rank_state *rs, int r, ptc_task *t, double *start)
{
    bool has_fb = rs->next < fb->n, has_w = rs->head < rs->npending;
    double fb_at = -1;
    if (has_fb) {
        const ptc_task *n = &fb->t[rs->next];
        /* zb-h1 never has more microbatches in flight on a rank than 1F1B's first rank (P),
         * so its peak memory is 1F1B's */
        bool full = s->split && n->kind == PTC_TASK_F && rs->inflight >= s->P;
        fb_at = full ? -1 : ready_at(s, r, n);
        if (fb_at >= 0 && fb_at < rs->free)
            fb_at = rs->free;
    }
    if (has_fb && fb_at >= 0 && (fb_at <= rs->free || !has_w)) {
        *t = fb->t[rs->next];
        *start = fb_at;
        return true;
    }
    if (has_w) { /* the rank would idle: fill it with a weight gradient */
        int k = rs->pending[rs->head];
        *t = (ptc_task){PTC_TASK_W, k / s->V, k % s->V};
        *start = rs->free;
        return true;
    }
    return false;
}

static void run_task(sim *s, const seq *fb, rank_state *rs, int r, const ptc_task *t, double at,
                     seq *out)
{
    double end = at + cost(s, t->kind);
    *slot(s, t->kind, t->chunk * s->P + r, t->mb) = end;
    rs->free = end;
    push(out, t->kind, t->mb, t->chunk);
    if (t->kind == PTC_TASK_W) {
        rs->head++;
        rs->inflight--;
        return;
    }
    rs->next++;
    if (t->kind == PTC_TASK_F && ++rs->inflight > rs->max_inflight)
        rs->max_inflight = rs->inflight;
    if (t->kind == PTC_TASK_B && s->split)
        rs->pending[rs->npending++] = t->mb * s->V + t->chunk;
    else if (t->kind == PTC_TASK_B)
        rs->inflight--;
    (void)fb;
}

/* List scheduling in time order: the rank that can start earliest goes first. */
static int simulate(ptc_pp_plan *pp, sim *s, const seq *fb, char *err, size_t errn)
{
    int P = s->P;
    rank_state *rs = ptc_xcalloc((size_t)P, sizeof *rs);
    seq *out = ptc_xcalloc((size_t)P, sizeof *out);
    int total = 0, placed = 0, rc = 0;
    for (int r = 0; r < P; r++) {
        rs[r].pending = ptc_xmalloc(sizeof(int) * (size_t)(s->M * s->V + 1));
        total += fb[r].n + (s->split ? fb[r].n / 2 : 0);
    }
    while (placed < total) {
        int best = -1;
        double best_at = 0;
        ptc_task best_t = {0};
        for (int r = 0; r < P; r++) {
            ptc_task t;
            double at;
            if (choose(s, &fb[r], &rs[r], r, &t, &at) && (best < 0 || at < best_at)) {
                best = r;
                best_at = at;
                best_t = t;
            }
        }
        if (best < 0) {
            ptc_fmt(err, errn, "%s schedule of %d stages and %d microbatches deadlocks",
                    ptc_pp_schedule_name(pp->kind), P, s->M);
            rc = -1;
            break;
        }
        run_task(s, &fb[best], &rs[best], best, &best_t, best_at, &out[best]);
        placed++;
    }
    double busy = 0;
    pp->makespan = 0;
    for (int r = 0; r < P; r++) {
        pp->makespan = rs[r].free > pp->makespan ? rs[r].free : pp->makespan;
        for (int i = 0; i < out[r].n; i++)
            busy += cost(s, out[r].t[i].kind);
        pp->order[r] = out[r].t;
        pp->len[r] = out[r].n;
        pp->max_inflight[r] = rs[r].max_inflight;
        free(rs[r].pending);
    }
    pp->bubble = pp->makespan > 0 ? 1.0 - busy / ((double)P * pp->makespan) : 0;
    free(rs);
    free(out);
    return rc;
}

int ptc_pp_plan_build(ptc_pp_plan *pp, ptc_pp_schedule kind, int P, int M, int V, char *err,
                      size_t errn)
{
    memset(pp, 0, sizeof *pp);
    if (kind != PTC_PP_INTERLEAVED)
        V = 1;
    if (P < 1 || M < 1 || V < 1 || P > 4096 || M > 1 << 16 || V > 64) {
        ptc_fmt(err, errn, "pipeline of %d stages, %d microbatches, %d chunks is out of range", P, M,
                V);
        return -1;
    }
    if (kind == PTC_PP_INTERLEAVED && (V < 2 || M % P)) {
        ptc_fmt(err, errn,
                V < 2 ? "the interleaved schedule needs --virtual-stages of 2 or more"
                      : "the interleaved schedule needs a number of microbatches divisible by "
                        "the pipeline's %d stages",
                P);
        return -1;
    }
    pp->kind = kind;
    pp->P = P;
    pp->M = M;
    pp->V = V;
    pp->order = ptc_xcalloc((size_t)P, sizeof *pp->order);
    pp->len = ptc_xcalloc((size_t)P, sizeof(int));
    pp->max_inflight = ptc_xcalloc((size_t)P, sizeof(int));
    seq *fb = ptc_xcalloc((size_t)P, sizeof *fb);
    for (int r = 0; r < P; r++) {
        if (kind == PTC_PP_GPIPE)
            order_gpipe(&fb[r], M);
        else if (kind == PTC_PP_INTERLEAVED)
            order_interleaved(&fb[r], r, P, M, V);
        else
            order_1f1b(&fb[r], r, P, M);
    }
    size_t nslots = (size_t)3 * (size_t)(P * V) * (size_t)M;
    sim s = {.P = P, .M = M, .V = V, .split = ptc_pp_splits_backward(kind)};
    s.done = ptc_xmalloc(sizeof(double) * nslots);
    for (size_t i = 0; i < nslots; i++)
        s.done[i] = -1;
    int rc = simulate(pp, &s, fb, err, errn);
    for (int r = 0; r < P; r++)
        free(fb[r].t);
    free(fb);
    free(s.done);
    if (rc < 0)
        ptc_pp_plan_free(pp);
    return rc;
}

void ptc_pp_plan_free(ptc_pp_plan *pp)
{
    for (int r = 0; pp->order && r < pp->P; r++)
        free(pp->order[r]);
    free(pp->order);
    free(pp->len);
    free(pp->max_inflight);
    memset(pp, 0, sizeof *pp);
}
