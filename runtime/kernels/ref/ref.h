/* ref.h - the plain, obviously correct CPU reference kernels: one per op of the language page.
 *
 * They are the reference that every other backend (OpenBLAS, LLVM, CUDA) and every parallel plan
 * is tested against, so they favour clarity over speed: row-major contiguous tensors, double
 * accumulators, no blocking.
 *
 * Storage: every floating dtype (f32, bf16, f16) is held in float arrays; cast to bf16/f16 rounds to
 * that format's precision (round to nearest even) and keeps the result as float. i32 is int32_t.
 */
#ifndef PTRT_REF_H
#define PTRT_REF_H

#include <stdint.h>

#include "half.h"
#include "kernel.h"
#include "program.h"

/* Whether call n is of an op of ptc_op_storage16 over 16-bit storage (its first operand), and
 * that call run through `run` on f32 copies, its results rounded into the storage (kernel.h);
 * attention and its gradient one batch element at a time. */
bool ptrt_storage16(const ptrt_kcall *n, const ptc_type *it);
/* x of type tx cast to dtype `to` at o (as the cast kernel; 1 when done) */
typedef int (*ptrt_cast_fn)(const ptc_type *tx, const void *x, ptc_dtype to, void *o);
int ptrt_ref_cast_to(const ptc_type *tx, const void *x, ptc_dtype to, void *o);
int ptrt_run_storage16(ptrt_kernel_fn run, ptrt_cast_fn cast, const ptrt_kcall *n,
                       const ptc_type *it, void *const *in, const ptc_type *ot, void *const *out,
                       char *err, size_t errn);
/* f32 copies of 16-bit operands made outside the memory plan, by kernels that do not read 16 bits
 * (ptrt_run_storage16's scratch, GEMMs without a 16-bit one): bytes added (or, negative, freed),
 * and the most held at once in the process, which --check-memory reports */
void ptrt_widened_add(int64_t bytes);
int64_t ptrt_widened_high_water(void);
/* Runs node n on the CPU: in[i] points at the data of operand i (of type it[i]), out[j] at the
 * already allocated result j (of type ot[j]). Returns 0, or -1 with a message in err for data
 * errors (e.g. an embedding id out of range, a target outside the classes). */
int ptrt_ref_run(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                 void *const *out, char *err, size_t errn);

/* Rounds a float to bfloat16 / float16 precision (nearest even), returned as float (common/half.c
 * holds the rounding and the 2-byte storage formats). */
static inline float ptrt_round_bf16(float x)
{
    return (float)ptc_round_bf16(x);
}
static inline float ptrt_round_f16(float x)
{
    return (float)ptc_round_f16(x);
}

/* The reference GEMM of a plan's gemm instruction: every element a double sum, rounded to float
 * once (as ptrt_ref_run's matmul), and then to g->cd's 16 bits where C is 16-bit (as a cast of
 * the f32 result would). */
void ptrt_ref_gemm(const ptc_gemm *g, const void *a, const void *b, void *c);

/* moe_ep_ffn's rows, received from the group's members in order of member, then of this rank's
 * experts (counts[q * n + e]: member q's kept choices for expert e of n; this rank, at coord,
 * holds n / group of them): expert_of[r] the local expert of row r. Returns the rows in all, or
 * -1 when they do not fit in m. */
int64_t ptrt_ref_moe_ep_rows(const int32_t *counts, int64_t n, int group, int coord, int64_t m,
                             int64_t *expert_of);

/* The row of each of n choices in moe_pack's order (by expert, then token; -1 where dropped),
 * for m rows planned: the rows in all, or -1 with the reference's message. */
int64_t ptrt_ref_moe_row_of(const int32_t *route, int64_t n, int64_t m, int64_t *row, char *err,
                            size_t errn);

/* The rows of a moe_ffn(_grad) or moe_ep_ffn(_grad) call in expert order, for kernels that run an
 * expert's rows together (cpu_moe.c, the CUDA backend): expert e's rows are first[e] ..
 * first[e + 1] (E + 1 entries), each expert's in the order of its choices (tokens) or rows; row
 * r reads row src[r] of x (moe_ffn: its token; moe_ep_ffn: the row received), and moe_ffn's
 * choice[r] is its choice, t top_k + j (choice NULL for moe_ep_ffn). route: moe_ffn's expert ids
 * (-1: dropped), or moe_ep_ffn's counts; src and choice take a row per choice (moe_ffn) or per
 * row planned (moe_ep_ffn). Returns the rows, or -1 with the reference's message. */
int64_t ptrt_moe_rows(const ptrt_kcall *k, const ptc_type *it, const int32_t *route,
                      int64_t *first, int64_t *src, int64_t *choice, char *err, size_t errn);

#endif
