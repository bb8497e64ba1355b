/* ref_internal.h - what the reference kernel files share (private to runtime/ref*.c).
 *
 * ref.c holds the dispatcher (one switch over ops), the rounding to bf16/f16 and casts; the other
 * files hold the kernels of one family each. Every kernel takes the types inference gave (shapes
 * are trusted: the graph was verified) and plain row-major data. Floating tensors of every dtype
 * are float arrays and i32 tensors int32_t arrays, so every element is 4 bytes, which lets the
 * shape kernels move elements without looking at the dtype.
 */
#ifndef PTRT_REF_INTERNAL_H
#define PTRT_REF_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ref.h"

/* Size in bytes of one element in the reference storage, whatever the dtype. */
#define PTRT_REF_ELEM 4

/* Views t as [outer, n, inner] around axis: outer = product of the dims before axis, n =
 * dims[axis], inner = product of the dims after it. */
void ptrt_ref_axis_view(const ptc_type *t, int axis, int64_t *outer, int64_t *n, int64_t *inner);

/* Row-major strides of t in elements (strides[rank-1] = 1). */
void ptrt_ref_strides(const ptc_type *t, int64_t *strides);

/* Rounds x to the nearest (ties to even) value of bf16 / f16, overflowing to infinity; NaN stays
 * NaN. Works from a double so that casts from i32 round only once. */
double ptrt_ref_round_bf16d(double x);
/* Rounds every bf16/f16 result of a kernel (float storage) to its format: the one place results
 * are rounded (forward and internal ops alike). */
void ptrt_ref_round_results(int nout, const ptc_type *ot, void *const *out);
/* Float to i32 as a cast does: toward zero, NaN to 0, saturating at the ends of the range (C
 * leaves those undefined, so the reference defines them). */
int32_t ptrt_ref_to_i32(double v);
/* Cross-entropy rows: checks that target t of row r is one of the c classes (-1 with a message
 * naming op otherwise), and the log-sum-exp of a row with its max (for stability). */
int ptrt_ref_check_target(const char *op, int32_t t, int64_t r, int64_t c, char *err, size_t errn);
double ptrt_ref_logsumexp(const float *row, int64_t c, double *max);
double ptrt_ref_round_f16d(double x);

/* ref_spmd.c: the rank-dependent ops and the vocabulary-parallel cross-entropy pieces (the
 * rank's coordinate is k->coord) */
int ptrt_ref_run_spmd(const ptrt_kcall *k, const ptc_type *it, void *const *in,
                      const ptc_type *ot, void *const *out, char *err, size_t errn);

/* ref_moe.c: moe and its pieces (ops.def, "mixture of experts") */
int ptrt_ref_run_moe(const ptrt_kcall *k, const ptc_type *it, void *const *in, const ptc_type *ot,
                     void *const *out, char *err, size_t errn);

/* ref_elementwise.c */
void ptrt_ref_binary(ptc_op op, const ptc_type *ta, const float *a, const ptc_type *tb,
                     const float *b, const ptc_type *to, float *o);
void ptrt_ref_unary(ptc_op op, int64_t n, const float *x, float *o);
/* One element of a unary op (in double, unrounded), and the derivative its backward op
 * (RELU_GRAD, GELU_GRAD, SILU_GRAD) multiplies dy by (ref_grad.c). */
double ptrt_ref_unary1(ptc_op op, double x);
double ptrt_ref_unary_deriv(ptc_op grad_op, double x);
void ptrt_ref_matmul(const ptc_type *ta, const float *a, const ptc_type *tb, const float *b,
                     const ptc_type *to, float *o);

/* ref_norm.c */
void ptrt_ref_reduce(ptc_op op, const ptc_type *tx, const float *x, int axis, float *o);
void ptrt_ref_softmax(bool log, const ptc_type *tx, const float *x, int axis, float *o);
void ptrt_ref_layernorm(const ptc_type *tx, const float *x, const float *g, const float *b,
                        double eps, float *o);
void ptrt_ref_rmsnorm(const ptc_type *tx, const float *x, const float *g, double eps, float *o);

/* ref_shape.c: elements are moved as 4-byte words, so these serve every dtype. */
void ptrt_ref_transpose(const ptc_type *tx, const void *x, void *o);
void ptrt_ref_permute(const ptc_type *tx, const void *x, const int64_t *axes, void *o);
void ptrt_ref_split(const ptc_type *tx, const void *x, int axis, int nout, void *const *out);
void ptrt_ref_concat(int nin, const ptc_type *it, const void *const *in, int axis, void *o);
void ptrt_ref_slice(const ptc_type *tx, const void *x, int axis, int64_t start, int64_t len,
                    void *o);

/* ref_model.c: the ones that can meet bad data return -1 with a message. */
int ptrt_ref_embedding(const ptc_type *tt, const float *table, const ptc_type *ti,
                       const int32_t *ids, float *o, char *err, size_t errn);
void ptrt_ref_attention(const ptc_type *tq, const float *q, const ptc_type *tk, const float *k,
                        const float *v, int64_t heads, int64_t kv_heads, bool causal, float *o);
void ptrt_ref_rope(const ptc_type *tx, const float *x, int64_t heads, double base, float *o);
int ptrt_ref_cross_entropy(const ptc_type *tl, const float *logits, const int32_t *targets,
                           float *o, char *err, size_t errn);
void ptrt_ref_mse(const ptc_type *ta, const float *a, const float *b, float *o);

#endif
