/* test_schedule.c - pipeline schedules (plan/schedule.c): every task once and in a valid order,
 * the simulated bubble against the published fractions, and microbatches in flight. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "schedule.h"

static const int Ps[] = {1, 2, 3, 4, 8};
static const int Ms[] = {1, 2, 3, 4, 8, 16};

/* Every (kind, chunk, mb) task of a rank exactly once; on a rank, F before B before W of one
 * chunk-microbatch, and chunk-microbatch order of F's is ascending for a fixed chunk. */
static void expect_complete(const ptc_pp_plan *pp)
{
    bool split = ptc_pp_splits_backward(pp->kind);
    int kinds = split ? 3 : 2;
    for (int r = 0; r < pp->P; r++) {
        int n = pp->M * pp->V;
        int *pos = malloc(sizeof(int) * (size_t)(3 * n));
        cr_assert_not_null(pos);
        for (int i = 0; i < 3 * n; i++)
            pos[i] = -1;
        cr_expect_eq(pp->len[r], kinds * n, "%s rank %d: %d tasks", ptc_pp_schedule_name(pp->kind),
                     r, pp->len[r]);
        for (int i = 0; i < pp->len[r]; i++) {
            const ptc_task *t = &pp->order[r][i];
            cr_assert(t->mb >= 0 && t->mb < pp->M && t->chunk >= 0 && t->chunk < pp->V);
            int k = t->kind * n + t->chunk * pp->M + t->mb;
            cr_expect_eq(pos[k], -1, "rank %d runs a task twice", r);
            pos[k] = i;
        }
        for (int c = 0; c < n; c++) {
            cr_expect(pos[c] >= 0 && pos[n + c] > pos[c], "rank %d: backward before forward", r);
            if (split)
                cr_expect(pos[2 * n + c] > pos[n + c], "rank %d: weight gradient before B", r);
        }
        free(pos);
    }
}

Test(schedule, gpipe_and_1f1b_have_the_published_bubble)
{
    for (int k = PTC_PP_GPIPE; k <= PTC_PP_1F1B; k++)
        for (size_t a = 0; a < sizeof Ps / sizeof Ps[0]; a++)
            for (size_t b = 0; b < sizeof Ms / sizeof Ms[0]; b++) {
                int P = Ps[a], M = Ms[b];
                ptc_pp_plan pp;
                char err[256];
                cr_assert_eq(ptc_pp_plan_build(&pp, k, P, M, 1, err, sizeof err), 0, "%s", err);
                expect_complete(&pp);
                cr_expect(fabs(pp.bubble - (double)(P - 1) / (M + P - 1)) < 1e-12,
                          "%s P=%d M=%d: bubble %g", ptc_pp_schedule_name(k), P, M, pp.bubble);
                for (int r = 0; r < P; r++) {
                    int want = k == PTC_PP_GPIPE ? M : (P - r < M ? P - r : M);
                    cr_expect_eq(pp.max_inflight[r], want, "%s P=%d M=%d rank %d: %d in flight",
                                 ptc_pp_schedule_name(k), P, M, r, pp.max_inflight[r]);
                }
                ptc_pp_plan_free(&pp);
            }
}

Test(schedule, interleaved_divides_the_bubble_by_v)
{
    int cases[][3] = {{2, 2, 2}, {2, 8, 2}, {4, 4, 2}, {4, 8, 2}, {4, 8, 3}, {4, 16, 4}, {8, 16, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int P = cases[i][0], M = cases[i][1], V = cases[i][2];
        ptc_pp_plan pp;
        char err[256];
        cr_assert_eq(ptc_pp_plan_build(&pp, PTC_PP_INTERLEAVED, P, M, V, err, sizeof err), 0, "%s",
                     err);
        expect_complete(&pp);
        cr_expect(fabs(pp.bubble - (double)(P - 1) / (V * M + P - 1)) < 1e-12,
                  "interleaved P=%d M=%d V=%d: bubble %g", P, M, V, pp.bubble);
        ptc_pp_plan_free(&pp);
    }
    ptc_pp_plan pp;
    char err[256];
    cr_expect_eq(ptc_pp_plan_build(&pp, PTC_PP_INTERLEAVED, 4, 6, 2, err, sizeof err), -1);
    cr_expect(strstr(err, "divisible") != NULL, "%s", err);
    cr_expect_eq(ptc_pp_plan_build(&pp, PTC_PP_INTERLEAVED, 4, 8, 1, err, sizeof err), -1);
}

/* Zero bubble H1: a third of 1F1B's bubble once the microbatches fill the pipeline (M >= P), and
 * never more microbatches in flight than 1F1B's first rank. */
Test(schedule, zb_h1_cuts_the_bubble_to_a_third)
{
    for (size_t a = 0; a < sizeof Ps / sizeof Ps[0]; a++)
        for (size_t b = 0; b < sizeof Ms / sizeof Ms[0]; b++) {
            int P = Ps[a], M = Ms[b];
            ptc_pp_plan zb, f;
            char err[256];
            cr_assert_eq(ptc_pp_plan_build(&zb, PTC_PP_ZB_H1, P, M, 1, err, sizeof err), 0, "%s",
                         err);
            cr_assert_eq(ptc_pp_plan_build(&f, PTC_PP_1F1B, P, M, 1, err, sizeof err), 0, "%s", err);
            expect_complete(&zb);
            /* idle time per rank: 1F1B (P-1)(F+B+W) = 3(P-1), zb-h1 (P-1)(F+B-W) = P-1 */
            if (M >= P)
                cr_expect(fabs(zb.bubble - (double)(P - 1) / (3 * M + P - 1)) < 1e-12,
                          "zb-h1 P=%d M=%d: bubble %g", P, M, zb.bubble);
            cr_expect_leq(zb.makespan, f.makespan, "P=%d M=%d", P, M);
            for (int r = 0; r < P; r++)
                cr_expect_leq(zb.max_inflight[r], f.max_inflight[0], "P=%d M=%d rank %d", P, M, r);
            ptc_pp_plan_free(&zb);
            ptc_pp_plan_free(&f);
        }
}

/* The pipeline pass weighs each stage's activations by the microbatches its schedule keeps in
 * flight (passes/pipeline.c's ptc_pp_stage_inflight): the counts the simulation finds, for every
 * schedule (the interleaved one's over a rank's chunks). */
Test(schedule, the_stage_cut_counts_the_microbatches_in_flight_the_schedule_keeps)
{
    static const ptc_pp_inflight rule[PTC_NPP_SCHEDULES] = {
        [PTC_PP_GPIPE] = PTC_INFLIGHT_ALL, [PTC_PP_1F1B] = PTC_INFLIGHT_1F1B,
        [PTC_PP_INTERLEAVED] = PTC_INFLIGHT_1F1B, [PTC_PP_ZB_H1] = PTC_INFLIGHT_PP};
    for (int kind = 0; kind < PTC_NPP_SCHEDULES; kind++)
        for (int P = 2; P <= 8; P++)
            for (int V = 1; V <= 3; V++)
                for (int M = 1; M <= 16; M++) {
                    if ((kind == PTC_PP_INTERLEAVED) != (V > 1) ||
                        (kind == PTC_PP_INTERLEAVED && M % P))
                        continue;
                    ptc_pp_plan pp;
                    char err[256];
                    cr_assert_eq(ptc_pp_plan_build(&pp, kind, P, M, V, err, sizeof err), 0, "%s",
                                 err);
                    for (int r = 0; r < P; r++) {
                        double n = 0; /* over the rank's chunks: stages r, r + P, ... */
                        for (int c = 0; c < V; c++)
                            n += ptc_pp_stage_inflight(rule[kind], M, P, P * V, c * P + r);
                        cr_expect(fabs(n - pp.max_inflight[r]) < 1e-9,
                                  "%s P=%d V=%d M=%d rank %d: the cut counts %g in flight, the "
                                  "simulation %d", ptc_pp_schedule_name(kind), P, V, M, r, n,
                                  pp.max_inflight[r]);
                    }
                    ptc_pp_plan_free(&pp);
                }
}
