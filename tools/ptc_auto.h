/* ptc_auto.h - the automatic planner (ptc --auto N) and the device-memory check.
 *
 * The planner does not model a plan: it compiles each candidate the way the command line would
 * (front end, pass list, lowering, fusion, memory plan), so the bytes it weighs are the plan's own
 * (ptc --emit plan prints the same figure), and simulates the step on the cost model the way
 * `ptc --emit trace` does. The candidates:
 *   - every mesh of N ranks over pp, dp and tp (and ep where the model has moe layers), with
 *     sequence parallelism and without wherever tp > 1;
 *   - ZeRO 0 to 3 wherever dp (or ep) > 1;
 *   - with pp > 1: the schedules 1f1b, interleaved (2 chunks) and zb-h1 at pp, 2 pp and 4 pp
 *     microbatches (GPipe keeps more in flight than 1F1B for the same bubble: never better);
 *   - recompute none, then selective, then full, each only where the one before does not fit
 *     (recompute adds work and saves nothing else); with pp = 1, 1, 2, 4, ... microbatches
 *     (gradient accumulation) while the fewer need recompute to fit.
 * The one chosen is the fastest that fits, then the least memory, then the first searched. What it
 * changes is how the step runs, never what it computes: precision, the model and its batch are the
 * user's. The chains of candidates (a mesh, ZeRO stage and SP, whose ladders above run in order)
 * are shared among forked workers, one per core this process may run on; the report is the same
 * whatever their number.
 */
#ifndef PTC_AUTO_H
#define PTC_AUTO_H

#include <stdio.h>

#include "ptc_flags.h"

/* Chooses the plan of o->auto_devices devices for the model in src (forward: its graph as the
 * front end made it; logical_params parameters) and sets o's plan flags to it, after printing the
 * candidates on out; note gets one line for the plan's choices ("auto: ..."). Returns 0, or 1
 * after a message on errf when no candidate compiles or none fits o->device_memory. */
int ptc_auto_choose(ptc_options *o, const ptc_graph *forward, const char *src, size_t len,
                    int64_t logical_params, FILE *out, FILE *errf, char *note, size_t noten);

/* The bytes the fullest rank of p allocates at start (every region's arena), and its program. */
int64_t ptc_plan_fullest(const ptc_plan *p, int *program);

/* With o->device_memory set: 0 if every rank of p fits, else 1 after a message on errf naming
 * the fullest rank, its bytes by region, and what to try. */
int ptc_check_device_memory(const ptc_plan *p, const ptc_options *o, FILE *errf);

#endif
