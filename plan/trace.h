/* trace.h - timelines of a plan in the Chrome trace-event format (opens in Perfetto and
 * chrome://tracing): the planned one (`ptc --emit trace`), simulated from the programs with a
 * cost model, and the measured one an executable writes (`--trace FILE`), from the same writer so
 * the two lie side by side.
 *
 * One row (thread) per rank. Every instruction is a slice named by its op or collective, with its
 * phase as the category and its instruction number, source scope, layer and bytes in args; the
 * instructions of one phase (forward, backward, update) that run back to back are grouped under a
 * slice of that phase.
 */
#ifndef PTC_TRACE_H
#define PTC_TRACE_H

#include <stdio.h>

#include "program.h"

typedef struct ptc_trace_event {
    int rank;
    int instr;       /* in the rank's program */
    double start, dur; /* seconds */
    long long step;
} ptc_trace_event;

/* The machine the planned timeline assumes. Defaults (ptc_cost_model_default): a CPU core's worth
 * of flops (50 GFLOP/s), memory at 20 GB/s, links at 10 GB/s with 10 us of latency a message. */
typedef struct ptc_cost_model {
    double flops_per_s, bytes_per_s, link_bytes_per_s, latency_s;
} ptc_cost_model;
ptc_cost_model ptc_cost_model_default(void);

/* How long instruction i of program pg takes under model m (seconds). */
double ptc_instr_seconds(const ptc_plan *p, const ptc_program *pg, int i, const ptc_cost_model *m);

/* Runs every rank's program in simulation: each instruction starts when its rank is free and, for
 * a collective, when every member of its group has reached it (for a receive, when its message
 * was sent). Returns the events of every rank (malloc'd, *n of them) and the makespan, or NULL
 * if the plan would hang (ptc_plan_check says why). */
ptc_trace_event *ptc_plan_simulate(const ptc_plan *p, const ptc_cost_model *m, int *n,
                                   double *makespan);

/* Writes the events as a trace-event JSON object; title names the trace (metadata). */
void ptc_trace_write(FILE *f, const ptc_plan *p, const ptc_trace_event *ev, int n,
                     const char *title);

#endif
