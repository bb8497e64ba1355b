/* kir_ops.h - single ops as kernels of the kernel IR: the instructions of a plan that no fused
 * kernel covers (a gradient sum, the parameters' sums of squares, layernorm's backward, the
 * embedding and its gradient, slices, ...), so that a device backend runs every instruction as
 * generated code, compiled by the target's own compiler, and tested through the interpreter
 * against the reference kernels.
 *
 * An op becomes one to three kernels run in order (a later one may read what an earlier one
 * wrote anywhere: there is no grid-wide barrier inside a kernel). Their parameters are the op's
 * operands and results and, where an op needs it, a scratch array of f32 (layernorm's row
 * statistics between its two kernels) that the backend provides.
 *
 * Float operands may be f32, bf16 or f16 (loads widen to f32, stores round to nearest even, as
 * a cast does), ids and targets i32. Semantics are the reference kernels' (runtime/kernels/ref),
 * with f32 arithmetic and f32 sums;
 * where a reference kernel reports an error (an embedding id out of range), the kernel writes NaN
 * instead, which the loss then shows.
 */
#ifndef PTC_KIR_OPS_H
#define PTC_KIR_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kir.h"

#define PTC_OPK_MAX 3       /* kernels of one op */
/* A long column sum (over more than 2 x this many rows: sum_to of a bias, the norms' parameter
 * gradients) takes two kernels: a thread per (chunk of this many rows, column) adds its chunk
 * into scratch, then a thread per column adds the chunks. The CUDA emitter runs a reduction this
 * short on one thread (cuda_loops.c: ptc_cuda_row_loop), so a warp reads 32 columns of a row
 * at once. */
#define PTC_OPK_COLSUM_ROWS 32
#define PTC_OPK_MAX_ARGS 16 /* parameters of one kernel */

/* what parameter p of a kernel is bound to */
enum { PTC_OPK_IN = 0, PTC_OPK_OUT = 1000, PTC_OPK_SCRATCH = 2000 };

typedef struct ptc_op_kernels {
    int n;
    ptc_kir *k[PTC_OPK_MAX];
    /* arg[q][p]: PTC_OPK_IN + i (operand i), PTC_OPK_OUT + j (result j) or PTC_OPK_SCRATCH */
    int arg[PTC_OPK_MAX][PTC_OPK_MAX_ARGS];
    int64_t scratch; /* f32 elements of scratch the kernels use (0: none) */
} ptc_op_kernels;

/* The kernels of one op instance, named name_0, name_1, ...; coord is the rank's coordinate on
 * the op's mesh axis (the rank-dependent ops: partialize, shard_slice, embedding_shard, the
 * vocabulary-parallel cross-entropy pieces), 0 for the others. Returns 0, or -1 with why (the op
 * or its operands are not covered; nothing is allocated then). */
int ptc_op_kernels_build(const char *name, ptc_op op, const ptc_attrs *at, int coord, int nin,
                         const ptc_type *it, int nout, const ptc_type *ot, ptc_op_kernels *out,
                         char *why, size_t whyn);
void ptc_op_kernels_free(ptc_op_kernels *ok);

/* The value of an elementwise op (add ... silu_grad: the ops a fused chain holds) over operand
 * values v, as the reference kernels compute it. */
int ptc_kx_op(ptc_kir *k, ptc_op op, const int *v);
/* Whether ptc_kx_op covers op. */
bool ptc_kx_op_pointwise(ptc_op op);

/* The index into an operand of type t broadcast (NumPy rules) to type o of the element at flat
 * index i (an i64 expression) of o. */
int ptc_kx_bcast_index(ptc_kir *k, int i, const ptc_type *t, const ptc_type *o);

#endif
