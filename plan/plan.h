/* plan.h - what an execution plan costs, how it prints for people, and the check it passes
 * before it runs.
 *
 * Accounting of one rank program (bytes per rank, per training step):
 *   parameters        storage of every parameter (its local shard)
 *   gradients         the reduced gradient of every parameter (the gradient region): the output
 *                     of its data-parallel reduction, or the gradient itself where there is
 *                     none. This is what the ZeRO paper counts; gradients still being reduced
 *                     are temporaries and appear among the activations
 *   optimizer state   storage of every optimizer state (AdamW m and v; SGD momentum)
 *   peak activations  the most bytes of activations and workspace live at once, at the
 *                     instruction named; the activation arena the memory planner lays them out
 *                     in is at least that large (its excess is fragmentation)
 *   communication     bytes each rank sends, as a ring implementation moves them: allreduce of
 *                     N bytes 2N(t-1)/t, allgather and reduce-scatter N(t-1)/t with N the full
 *                     tensor, all-to-all of a local N bytes N(t-1)/t, send N; t = ranks in the
 *                     group. all_to_all_v (mixture of experts) moves the rows routing decides:
 *                     counted as a balanced routing that drops nothing, N(t-1)/t of the rows a
 *                     rank dispatches (N its send buffer going out, its receive buffer coming
 *                     back); the moe summary gives the most it can send.
 */
#ifndef PTC_PLAN_H
#define PTC_PLAN_H

#include <stdio.h>

#include "program.h"

typedef struct ptc_plan_stats {
    int64_t param_bytes, grad_bytes, optim_bytes;
    int64_t peak_act_bytes; /* live at once */
    int peak_instr;         /* where (-1: nothing live) */
    int64_t region_bytes[PTC_NREGIONS];
    int64_t comm_bytes;
    int ncollectives;
    int64_t kind_bytes[PTC_NCOLLS + 1]; /* + point-to-point sends */
    int kind_count[PTC_NCOLLS + 1];
    int64_t axis_bytes[PTC_MAX_MESH_AXES]; /* a group of several axes counts on each */
    int64_t group_bytes[1 << PTC_MAX_MESH_AXES]; /* by the exact set of axes: they add up */
    int64_t phase_bytes[3];
} ptc_plan_stats;

void ptc_plan_stats_of(const ptc_plan *p, int program, ptc_plan_stats *s);
/* Bytes a rank sends for instruction in (0 for computation). */
int64_t ptc_plan_comm_bytes(const ptc_plan *p, const ptc_program *pg, const ptc_instr *in);
/* The layer of an instruction, from its instance scope: up to the first numeric component ("h.3"
 * of "h.3.attn"), or the first component, or "(model)". */
void ptc_plan_layer(const char *scope, char *buf, size_t bufn);

/* Activations a layer keeps for the backward: the bytes of the activation buffers its forward
 * instructions (of microbatch 0) write that are still live when that microbatch's backward
 * begins, per layer ("h.3", "(model)" for the embedding and head), in the order the forward
 * runs. What activation recompute changes, and what Korthikanti et al. count per layer
 * (docs/pipeline.md derives the figures for our kernels). Returns the number of layers (at most
 * cap). */
typedef struct ptc_layer_act {
    char layer[64];
    int64_t bytes;
} ptc_layer_act;
int ptc_plan_layer_activations(const ptc_plan *p, int program, ptc_layer_act *out, int cap);

/* The pipeline of a plan (microbatches and pp stages): what the schedule promises and what the
 * programs do. */
typedef struct ptc_stage_info {
    int program;     /* the stage's program (stage s runs program s) */
    char layers[256]; /* the layers its forward work runs, in order: "(model) h.0..h.2" */
    int inflight;    /* most microbatches (x chunks) whose forward has begun and whose last
                        backward work has not ended, counted in the program */
    char *order;     /* its work in order: "F0 F1 B0 ...", chunk c of interleaved as F0.c, W
                        the weight-gradient part of zb-h1 (malloc'd) */
} ptc_stage_info;

typedef struct ptc_pipeline_info {
    int P, M, V, schedule;
    int bubble_num, bubble_den;  /* the published bubble fraction of the schedule */
    double bubble_simulated;     /* of its task order with equal stages (schedule.c) */
    int *inflight_schedule;      /* [P]: the same count in the simulated schedule */
    ptc_stage_info *stages;      /* [P] */
} ptc_pipeline_info;

/* 0 and pi filled (free with ptc_pipeline_info_free), or -1 when the plan has neither
 * microbatches nor pipeline stages. */
int ptc_plan_pipeline(const ptc_plan *p, ptc_pipeline_info *pi);
void ptc_pipeline_info_free(ptc_pipeline_info *pi);

typedef struct ptc_plan_print_opts {
    bool summary_only; /* --summary: the one-screen summary of every program, nothing else */
    int64_t device_memory; /* --device-memory, to say what share of it a rank plans (0: none) */
} ptc_plan_print_opts;

/* --emit plan: per distinct rank program a one-screen summary (memory per rank and where the
 * peak is, bytes sent by axis and kind, the largest tensors, warnings), then the detail:
 * parameter placements, communication by layer, and the program. */
void ptc_print_plan(const ptc_plan *p, const ptc_plan_print_opts *o, FILE *f);
/* "1.84 MiB", "512 B": bytes in the unit the printers use (binary units, 2 decimals). */
void ptc_human_bytes(int64_t b, char *buf, size_t n);
/* The mixture-of-experts lines of program's summary (print_moe.c): per moe layer the experts
 * this rank holds, the dispatch buffers reserved and the all-to-all and count-exchange bytes,
 * and the experts' memory. Prints nothing for a program without moe layers. */
void ptc_print_moe(FILE *f, const ptc_plan *p, int program);
/* --emit plan-json (schema: docs/plan-json.md). */
void ptc_print_plan_json(const ptc_plan *p, FILE *f);
/* --emit memory: per program the live bytes of every region after each instruction, the peak
 * and the instruction where it happens, and the arenas. */
void ptc_print_memory(const ptc_plan *p, FILE *f);

/* Before launch: every group must issue the same collectives in the same order and every receive
 * must meet its send, or the plan could deadlock or mismatch. Simulates every rank (rank
 * drop_rank leaving out its drop_index-th collective: the test hook; -1 for none) and returns 0,
 * or -1 with a message naming the ranks, the group and the instructions that disagree or wait
 * forever. */
int ptc_plan_check(const ptc_plan *p, int drop_rank, int drop_index, char *err, size_t errn);

#endif
