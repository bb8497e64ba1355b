/* plan.h - what a partitioned step costs, and the checks a plan passes before it runs.
 *
 * Accounting of one rank program (bytes are per rank, per training step):
 *   parameters        storage of every PARAM (its local shard)
 *   gradients         the reduced gradient of every parameter: the output of its data-parallel
 *                     reduction (allreduce, or reduce-scatter under ZeRO 2/3), or the gradient
 *                     itself where there is none. This is what the ZeRO paper counts;
 *                     gradients still being reduced are transient and appear in the peak below
 *   optimizer state   storage of every STATE (AdamW m and v; SGD momentum)
 *   peak activations  the largest total of the other values live at one time when the program
 *                     runs in order and each value is freed after its last use
 *   communication     bytes each rank sends, as a ring implementation moves them: allreduce of
 *                     N bytes 2N(t-1)/t, allgather and reduce-scatter N(t-1)/t with N the full
 *                     tensor, all-to-all of a local N bytes N(t-1)/t; t = ranks in the group.
 */
#ifndef PTC_PLAN_H
#define PTC_PLAN_H

#include <stdio.h>

#include "ir.h"

typedef struct ptc_plan_stats {
    int64_t param_bytes, grad_bytes, optim_bytes, peak_act_bytes;
    int64_t comm_bytes;
    int ncollectives;
    int64_t kind_bytes[4]; /* allreduce, allgather, reduce_scatter, all_to_all */
    int kind_count[4];
    int64_t axis_bytes[PTC_MAX_MESH_AXES];
} ptc_plan_stats;

void ptc_plan_stats_of(const ptc_graph *g, ptc_plan_stats *s);
/* Bytes a rank sends for collective node n of program g (0 for other ops). */
int64_t ptc_plan_comm_bytes(const ptc_graph *g, const ptc_node *n);
/* The layer a node belongs to, from its instance scope: up to the first numeric component
 * ("h.3" of "h.3.attn"), or the first component, or "(model)". */
void ptc_plan_layer(const ptc_node *n, char *buf, size_t bufn);

typedef struct ptc_plan_info {
    int zero;
    bool seq_parallel;
    int64_t logical_params; /* parameter count of the logical model */
} ptc_plan_info;

void ptc_print_plan(const ptc_graph *g, const ptc_plan_info *info, FILE *f);
void ptc_print_plan_json(const ptc_graph *g, const ptc_plan_info *info, FILE *f);

/* Before launch: every group must issue the same collectives in the same order, or the plan
 * could deadlock or mismatch. Simulates the ranks of program g (rank drop_rank leaving out its
 * drop_index-th collective: the test hook; -1 for none) and returns 0, or -1 with a message
 * naming the ranks, the group and the collectives that disagree or wait forever. */
int ptc_plan_check(const ptc_graph *g, int drop_rank, int drop_index, char *err, size_t errn);

#endif
