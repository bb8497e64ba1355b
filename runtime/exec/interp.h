/* interp.h - runs a logical graph on the CPU with the reference kernels, one buffer per value.
 *
 * This is the single-device reference execution: the slowest and simplest way to run a graph, the
 * one every plan and backend is compared against. Buffers hold float for every floating dtype and
 * int32_t for i32 (see ref.h).
 */
#ifndef PTRT_INTERP_H
#define PTRT_INTERP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ir.h"

typedef struct ptrt_interp ptrt_interp;

ptrt_interp *ptrt_interp_new(const ptc_graph *g);
void ptrt_interp_free(ptrt_interp *it);
/* The buffer of value v (allocated on first use, numel elements of 4 bytes). */
void *ptrt_interp_buffer(ptrt_interp *it, int v);
/* Fills every parameter and optimizer state with its deterministic initial value for seed. */
void ptrt_interp_init_params(ptrt_interp *it, uint64_t seed);
/* Fills every input not yet marked as given with random data: floats normal(0,1); i32 ids uniform
 * in [0, bound) where bound comes from the consumers (embedding rows, cross_entropy classes).
 * Returns -1 with a message if an i32 input has no such consumer. */
int ptrt_interp_random_inputs(ptrt_interp *it, uint64_t seed, char *err, size_t errn);
/* Marks an input value as given by the caller (its buffer already holds the data). */
void ptrt_interp_mark_given(ptrt_interp *it, int v);
/* Runs every non-source node in order. Returns 0, or -1 with a message naming the node. */
int ptrt_interp_run(ptrt_interp *it, char *err, size_t errn);
/* Runs only the nodes needed to compute value v (e.g. the loss, for evaluation). */
int ptrt_interp_run_for(ptrt_interp *it, int v, char *err, size_t errn);
/* Stores every `update` of the graph: the new value is copied into its parameter or state. */
void ptrt_interp_apply_updates(ptrt_interp *it);

/* A kernel runner with ptrt_ref_run's signature; the interpreter runs every node through one. */
typedef int (*ptrt_kernel_fn)(const ptc_node *n, const ptc_type *it, void *const *in,
                              const ptc_type *ot, void *const *out, char *err, size_t errn);
void ptrt_interp_set_kernels(ptrt_interp *it, ptrt_kernel_fn fn);

/* Makes the interpreter run one rank of an SPMD program: collectives and rank-dependent ops go to
 * ptrt_spmd_run with ctx, and parameters are initialised with the values their elements have in
 * the full tensor (so every plan starts from the same model). */
struct ptrt_spmd_ctx;
void ptrt_interp_set_spmd(ptrt_interp *it, struct ptrt_spmd_ctx *ctx);
/* Fills value v's local buffer with init's values at its elements' full-tensor indices. */
void ptrt_interp_fill(ptrt_interp *it, int v, const ptc_init *init, const char *name,
                      uint64_t seed);
/* Index in the full tensor of element i of value v's local buffer (i itself without SPMD). */
int64_t ptrt_interp_global_index(const ptrt_interp *it, int v, int64_t i);
/* Profiling: with it on, the time of every node run is added up by op kind (two clock reads per
 * node). Switching it on (again) clears the sums. */
void ptrt_interp_set_profile(ptrt_interp *it, bool on);
/* Prints the sums as a table, largest first: op, calls and milliseconds per step (divided by
 * steps), share of the total. */
void ptrt_interp_print_profile(const ptrt_interp *it, FILE *f, int64_t steps);
/* Value id of the input or parameter named name, or -1. */
int ptrt_graph_find(const ptc_graph *g, ptc_op op, const char *name);

#endif
