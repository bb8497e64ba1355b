/* schedule.h - pipeline schedules: in what order every pipeline rank runs the forward, backward
 * and weight-gradient work of every microbatch, and what that order costs.
 *
 *   gpipe        every forward, then every backward (GPipe, Huang et al. 2019)
 *   1f1b         PipeDream-flush / Megatron: P-s-1 warm-up forwards on rank s, then one forward
 *                and one backward in turn, then the remaining backwards; at most P-s
 *                microbatches in flight on rank s (Narayanan et al. 2021)
 *   interleaved  Megatron's virtual pipeline: each rank holds V model chunks (virtual stages s,
 *                s+P, s+2P, ...) and runs 1F1B over chunk-microbatches; needs M divisible by P
 *   zb-h1        zero bubble, handcrafted H1 (Qi et al. 2023): the backward split into the input
 *                gradient (B, on the critical path) and the weight gradient (W), the W's
 *                postponed into the bubbles, never more microbatches in flight than 1F1B
 *
 * Costs are in units of one forward of one stage: a backward costs 2 (B 1 and W 1 when split), so
 * the bubble fractions match the published ones: GPipe and 1F1B (P-1)/(M+P-1), interleaved
 * (P-1)/(V M+P-1), zb-h1 (P-1)/(3M+P-1) once M >= P (with fewer microbatches no schedule
 * fills the pipeline: the critical path of one microbatch is longer than the work).
 */
#ifndef PTC_SCHEDULE_H
#define PTC_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PTC_PP_GPIPE,
    PTC_PP_1F1B,
    PTC_PP_INTERLEAVED,
    PTC_PP_ZB_H1,
    PTC_NPP_SCHEDULES
} ptc_pp_schedule;
const char *ptc_pp_schedule_name(int s);
/* The schedule named name, or -1. */
int ptc_pp_schedule_parse(const char *name);

typedef enum {
    PTC_TASK_F, /* forward of one microbatch through one stage (chunk) */
    PTC_TASK_B, /* backward (with the weight gradient unless the schedule splits it off) */
    PTC_TASK_W  /* the weight gradient alone (zb-h1) */
} ptc_task_kind;

typedef struct ptc_task {
    uint8_t kind;
    int mb;    /* microbatch */
    int chunk; /* model chunk on this rank: virtual stage chunk * P + rank */
} ptc_task;

typedef struct ptc_pp_plan {
    ptc_pp_schedule kind;
    int P, M, V;
    ptc_task **order; /* [P]: the tasks of rank s in the order it runs them */
    int *len;         /* [P] */
    /* simulated with the unit costs above, every rank starting when its inputs are there */
    double makespan;
    double bubble;     /* idle time / (P x makespan) */
    int *max_inflight; /* [P]: most microbatches (chunk-microbatches) whose forward has run and
                          whose last backward work has not */
} ptc_pp_plan;

/* The schedule of kind for P ranks, M microbatches and V chunks per rank (1 unless interleaved),
 * simulated. Returns 0, or -1 with a message (M not divisible by P for interleaved, V < 2 for
 * interleaved, sizes out of range). */
int ptc_pp_plan_build(ptc_pp_plan *pp, ptc_pp_schedule kind, int P, int M, int V, char *err,
                      size_t errn);
void ptc_pp_plan_free(ptc_pp_plan *pp);

/* The published bubble fraction of the schedule (the figure the simulation is held to). */
double ptc_pp_bubble_formula(ptc_pp_schedule kind, int P, int M, int V);

/* Whether the schedule splits the backward into B and W tasks. */
bool ptc_pp_splits_backward(ptc_pp_schedule kind);

#endif
