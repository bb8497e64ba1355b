/* trace.h - timelines of a plan in the Chrome trace-event format (opens in Perfetto and
 * chrome://tracing): the planned one (`ptc --emit trace`), simulated from the programs with a
 * cost model, and the measured one an executable writes (`--trace FILE`), from the same writer so
 * the two lie side by side.
 *
 * One row (thread) per rank. Every instruction is a slice named by its op or collective, with its
 * phase as the category and its instruction number, microbatch, stage, layer and bytes in args;
 * the instructions of one unit of pipeline work (the forward or backward of one microbatch on one
 * stage, or the step's own work) that run back to back are grouped under a slice named by it
 * ("F3", "B3", "W3", "update").
 */
#ifndef PTC_TRACE_H
#define PTC_TRACE_H

#include <stdbool.h>
#include <stdio.h>

#include "program.h"

typedef struct ptc_trace_event {
    int rank;          /* or, in a planned trace, the program */
    int instr;         /* in the rank's program */
    double start, dur; /* seconds */
    long long step;
} ptc_trace_event;

/* The machine the planned timeline assumes. Defaults (ptc_cost_model_default): a CPU core's worth
 * of flops (50 GFLOP/s), memory at 20 GB/s, links at 10 GB/s with 10 us of latency a message. */
typedef struct ptc_cost_model {
    double flops_per_s, bytes_per_s, link_bytes_per_s, latency_s;
} ptc_cost_model;
ptc_cost_model ptc_cost_model_default(void);
/* The cost model spec names (--cost-model): "cpu" (the default above); "h100" or "h200", an SXM
 * part's data-sheet rates (16-bit tensor-core flops, or FP32's without tensor cores when f32 is
 * true: what a plan in fp32 runs its GEMMs at; HBM; NVLink one way; 10 us a message); or
 * "flops=F,mem=B,link=L,latency=S" in per-second units and seconds, any left out keeping cpu's.
 * Returns 0, or -1 with a message. */
int ptc_cost_model_parse(const char *spec, bool f32, ptc_cost_model *m, char *err, size_t errn);
/* "50 GFLOP/s, 20 GB/s memory, 10 GB/s links, 10 us latency" */
void ptc_cost_model_str(const ptc_cost_model *m, char *buf, size_t n);

/* How long instruction i of program pg takes under model m (seconds): the larger of its flops
 * and its memory traffic at the model's rates; communication its bytes per link plus latency. */
double ptc_instr_seconds(const ptc_plan *p, const ptc_program *pg, int i, const ptc_cost_model *m);

/* Runs every program (one rank stands for the ranks that run it: their collectives are
 * symmetric) in simulation: each instruction starts when its rank is free and, for a receive,
 * when its message has been sent. Returns the events (rank = the program; malloc'd, *n of them)
 * and the makespan, or NULL with a message if the programs would wait on each other forever. */
ptc_trace_event *ptc_plan_simulate(const ptc_plan *p, const ptc_cost_model *m, int *n,
                                   double *makespan, char *err, size_t errn);

/* Writes events as a trace-event JSON object. by_program: events name programs (a planned
 * trace) and every rank of a program gets its row (one row per program beyond 64 ranks);
 * otherwise they name ranks (a measured trace). title names the trace. */
void ptc_trace_write(FILE *f, const ptc_plan *p, const ptc_trace_event *ev, int n, bool by_program,
                     const char *title);

#endif
