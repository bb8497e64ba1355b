/* exec.h - runs one rank's program of an execution plan on a backend, talking to the other ranks
 * through a communicator.
 *
 * At start the executor allocates one arena per region of the static memory plan (running out of
 * memory is reported then, naming the arena and the bytes, never midway) and points every buffer
 * at its offset; nothing is allocated per tensor afterwards. A run executes the instructions of an
 * entry in order: the whole training step (forward, backward, optimizer update, written in place)
 * or the loss alone (evaluation).
 *
 * Memory check: with `canary` on, every arena starts filled with a 16-bit pattern that no kernel
 * writes (0x7fa5: a signalling NaN as bf16, the high half of a signalling NaN as f32), and
 * ptrt_exec_high_water scans for the last unit that is not the pattern: the bytes of the arena
 * the run has really used, measured, for comparison with the plan.
 */
#ifndef PTRT_EXEC_H
#define PTRT_EXEC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "comm.h"
#include "program.h"

typedef struct ptrt_exec ptrt_exec;

typedef enum { PTRT_ENTRY_STEP, PTRT_ENTRY_EVAL } ptrt_entry;

typedef struct ptrt_exec_opts {
    const ptrt_backend *backend; /* NULL: the reference backend */
    ptrt_comm *comm;             /* NULL for a single-rank plan */
    bool canary;                 /* fill the arenas with the canary pattern (memory check) */
    int drop;                    /* test hook: leave out this collective of every step; -1 none */
    bool no_overlap;             /* every collective complete before the next instruction, even
                                  * on a communicator that can finish them in the background */
} ptrt_exec_opts;

/* The executor of rank's program. NULL with a message when an arena cannot be allocated. */
ptrt_exec *ptrt_exec_new(const ptc_plan *plan, int rank, const ptrt_exec_opts *o, char *err,
                         size_t errn);
void ptrt_exec_free(ptrt_exec *x);
/* Collectives that ran in the background since the executor was made (a communicator with wait,
 * comm.h: NCCL), and the instructions they ran beside, summed over them. */
void ptrt_exec_overlap(const ptrt_exec *x, int64_t *started, int64_t *beside);
/* Expert parallelism's all_to_all_v: the bytes this rank sent to the other members since the
 * executor was made (what the routing made of it), and the plan's bytes for one step (the rows
 * of a balanced routing: plan/stats.c). */
void ptrt_exec_all_to_all(const ptrt_exec *x, int64_t *sent, int64_t *planned);
const ptc_program *ptrt_exec_program(const ptrt_exec *x);
int ptrt_exec_rank(const ptrt_exec *x);

/* The buffer of kind (ptc_buf_kind) named name, or -1. */
int ptrt_exec_find(const ptrt_exec *x, int kind, const char *name);
/* The host address of buffer b's data on a host backend; NULL on a device backend, whose
 * buffers are reached through the calls below. */
void *ptrt_exec_data(ptrt_exec *x, int b);
/* Bytes [off, off + n) of buffer b's local part to dst, and from src (any backend; a device's
 * copy is complete on return). */
void ptrt_exec_read(ptrt_exec *x, int b, int64_t off, void *dst, int64_t n);
void ptrt_exec_write(ptrt_exec *x, int b, int64_t off, const void *src, int64_t n);
/* Element i of float buffer b as a float, whatever its dtype (f32, bf16, f16), and element i
 * set to v (rounded to the buffer's dtype, as a cast rounds). One element a call: for a whole
 * buffer, ptrt_exec_floats and ptrt_exec_store. */
float ptrt_exec_get(ptrt_exec *x, int b, int64_t i);
void ptrt_exec_set(ptrt_exec *x, int b, int64_t i, float v);
/* Float buffer b's local part as floats (malloc'd; the caller frees it), and set from v (its
 * numel floats, rounded to the buffer's dtype). */
float *ptrt_exec_floats(ptrt_exec *x, int b);
void ptrt_exec_store(ptrt_exec *x, int b, const float *v);
/* Index in the full (logical) tensor of element i of buffer b's local part. */
int64_t ptrt_exec_global_index(const ptrt_exec *x, int b, int64_t i);

/* Every parameter and optimizer state to its deterministic initial value for seed: element i of
 * the full tensor is a pure function of (seed, name, i), so every plan starts from one model. */
void ptrt_exec_init_state(ptrt_exec *x, uint64_t seed);
/* Buffer b (float dtypes) filled with init's values of (seed, name) at its elements' full-tensor
 * indices. */
void ptrt_exec_fill(ptrt_exec *x, int b, const ptc_init *init, const char *name, uint64_t seed);
/* Random data for input b from (seed, key), by full-tensor index: floats from N(0, 1); i32 ids
 * uniform below the buffer's bound. -1 with a message for i32 data without a bound. */
int ptrt_exec_random_input(ptrt_exec *x, int b, const char *key, uint64_t seed, char *err,
                           size_t errn);

/* Runs an entry of the program for training step `step` (for messages and matching of
 * collectives). Returns 0, or -1 with a message naming the instruction and where in the model
 * it came from. */
int ptrt_exec_run(ptrt_exec *x, ptrt_entry e, int64_t step, char *err, size_t errn);
/* Whether the last step's gradient norm was not finite: its update-phase instructions after the
 * norm were skipped (the weights and optimizer state are the step before's). */
bool ptrt_exec_skipped_update(const ptrt_exec *x);

/* Bytes of region's arena from its start to the end of the last 16-bit unit written since the
 * executor was made (the canary scan), or -1 without the canary. */
int64_t ptrt_exec_high_water(const ptrt_exec *x, int region);

/* Tracing: with it on, every instruction run is recorded (start and duration in seconds since
 * t0 on CLOCK_MONOTONIC, its step), up to max events. */
void ptrt_exec_set_trace(ptrt_exec *x, bool on, double t0, int max);
/* The events recorded (rank = this rank), *n of them. */
const struct ptc_trace_event *ptrt_exec_trace(const ptrt_exec *x, int *n);

/* Profiling: with it on, the time of every instruction is added up by op kind. Switching it on
 * (again) clears the sums. On a device, profiling and tracing wait for each instruction's work
 * to finish before its clock stops (be->sync), so the times are the device's: no collective
 * overlaps then, and where ranks share a device an instruction's time includes the other ranks'
 * work queued before it. */
void ptrt_exec_set_profile(ptrt_exec *x, bool on);
/* The sums as a table, largest first: op, calls and milliseconds per step (divided by steps);
 * under the fused kernels, their kinds (a kernel's name without its number), largest first. */
void ptrt_exec_print_profile(const ptrt_exec *x, FILE *f, int64_t steps);

/* Deterministic initial values (init.c): values [offset, offset + n) of the full tensor of a
 * parameter named name. */
void ptrt_init_param(const ptc_init *init, const char *name, uint64_t seed, float *out,
                     int64_t offset, int64_t n);

#endif
