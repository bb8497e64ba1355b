/* cpu_internal.h - what the fast CPU backend's files share (private to runtime/cpu*.c and its
 * test).
 *
 * cpu.c dispatches; cpu_pool.c runs loops on every core; cpu_gemm.c holds the GEMM (OpenBLAS, or a
 * plain loop without it) and matmul; cpu_vec.c the inner loops that want vector instructions (exp
 * and softmax sums, GELU, SiLU, 8x8 transposes, AdamW) with an AVX2 path chosen at run time;
 * cpu_elementwise.c, cpu_norm.c, cpu_attention.c and cpu_moe.c the kernels.
 *
 * Determinism: every kernel splits its work into pieces whose results do not depend on how many
 * threads run them or which thread runs which (a row, a column block, a fixed-size block of a
 * reduction), and partial sums are combined in a fixed order. So a run gives the same bits every
 * time, and the same bits whatever --threads says except for the GEMMs (see cpu_gemm.c).
 *
 * A kernel returns 1 when it ran, 0 when the case is not one it handles (the dispatcher then runs
 * the reference kernel), so a fast path can be narrow without being wrong.
 */
#ifndef PTRT_CPU_INTERNAL_H
#define PTRT_CPU_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernel.h"
#include "program.h"


/* Reductions keep PTRT_LANES running sums in double (lane l takes elements l, l + PTRT_LANES, ...):
 * independent chains, so the loops vectorize, in an order that does not depend on the ISA.
 * ptrt_fold_lanes adds them in a fixed tree and returns the total. */
#define PTRT_LANES 16
static inline double ptrt_fold_lanes(double *s)
{
    for (int w = PTRT_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++)
            s[l] += s[l + w];
    return s[0];
}

/* ---- cpu_pool.c ---- */

/* fn(ctx, begin, end) over [begin, end) of a range split across threads. */
typedef void (*ptrt_cpu_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n) cut into contiguous pieces of at least grain (at most two per thread, one
 * piece in all with one thread), on the calling thread and the pool's workers; returns when all
 * are done. The pieces depend only on n, grain and the thread count: a caller inside a region, or
 * one that finds the pool busy with another thread's region, runs the same pieces itself. Kernels
 * give fn pieces whose results do not depend on where the pieces are cut. Safe to call from
 * several threads at once. */
void ptrt_cpu_parallel_for(int64_t n, int64_t grain, ptrt_cpu_range_fn fn, void *ctx);
/* Threads the pool uses (the calling thread included); at least 1. */
int ptrt_cpu_threads(void);
void ptrt_cpu_pool_set_threads(int n);
void ptrt_cpu_pool_shared(void);

/* f32 bits and back; f to bf16 (nearest, ties to even; NaN to the reference's quiet NaN), bit
 * for bit as common/half.c rounds (the cast kernel and the GEMM split share it) */
static inline uint32_t ptrt_f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ptrt_bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t ptrt_to_bf16(float f)
{
    uint32_t u = ptrt_f_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(0x7fc0u | ((u >> 16) & 0x8000u));
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---- cpu_gemm.c ---- */

/* C[m,n] = alpha op(A) op(B) + beta C, row-major, op = transpose when trans_*; split across the
 * pool by rows or columns of C when big enough (one piece per thread). */
void ptrt_cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                   int64_t ldc);
/* The same on the calling thread only (for kernels that are already parallel). */
void ptrt_cpu_gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc);
/* The plain GEMM used without OpenBLAS (exposed so the test can check it in every build). */
void ptrt_cpu_gemm_plain(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc);
/* Which library runs an f32 piece when oneDNN and OpenBLAS are both open (cpu_gemm.c): the rule
 * (default), or one of them, for measurements (bench/gemm_split.c --route). */
enum { PTRT_GEMM_ROUTE_RULE, PTRT_GEMM_ROUTE_ONEDNN, PTRT_GEMM_ROUTE_OPENBLAS };
extern int ptrt_cpu_gemm_route;
/* A plan's gemm instruction (batches in parallel when they are many or small). */
void ptrt_cpu_gemm_instr(const ptc_gemm *g, const void *a, const void *b, void *c);
/* 16-bit operands the library has no GEMM for are widened to f32 in tiles of C this many rows and
 * columns on a side (scratch of at most 5 x its square in floats; default 1024): tests lower it. */
extern int64_t ptrt_cpu_widen_tile;
/* ---- cpu_gemm_split.c ---- */
/* An f32 gemm instruction as bf16 GEMMs over split operands, when ptrt_cpu_matmul_precision is
 * high or medium; false (nothing done) when it is highest or g is not f32. */
bool ptrt_cpu_gemm_split(const ptc_gemm *g, const float *a, const float *b, float *c);
/* Tests: take the precision asked whatever the CPU and library have (the split's bf16 GEMM then
 * runs on operands widened to f32 where the library has none: slow, the same arithmetic). */
void ptrt_cpu_matmul_precision_force(bool force);
/* A matmul kernel instruction (batched, with broadcasting) in f32. */
int ptrt_cpu_matmul(const ptc_type *ta, const float *a, const ptc_type *tb, const float *b,
                    const ptc_type *to, float *o);

/* ---- cpu_vec.c: float vector math over arrays ---- */

/* o[i] = exp(x[i] - sub) for i < n; returns the sum of the o[i]. o may be x. */
float ptrt_cpu_exp_sum(const float *x, float sub, float *o, int64_t n);
/* Largest element of x[0..n), n >= 1. Like the reference's running maximum it passes over a NaN
 * (unless x[0] is one); the NaN still reaches every result through exp. */
float ptrt_cpu_max(const float *x, int64_t n);
/* GELU (tanh approximation) and its derivative times dy. */
void ptrt_cpu_gelu(const float *x, float *o, int64_t n);
void ptrt_cpu_gelu_grad(const float *x, const float *dy, float *o, int64_t n);
/* SiLU x sigmoid(x) and its derivative times dy. */
void ptrt_cpu_silu(const float *x, float *o, int64_t n);
void ptrt_cpu_silu_grad(const float *x, const float *dy, float *o, int64_t n);
/* o[k * ldo + i] = x[i * ldx + k] for a rows x cols block (8x8 register transposes on AVX2). Moves
 * 4-byte words exactly, so it serves every dtype. */
void ptrt_cpu_transpose_block(const float *x, int64_t ldx, float *o, int64_t ldo, int64_t rows,
                              int64_t cols);
/* The same for a matrix of any size, on one thread, in 64 x 64 blocks that stay in cache. */
void ptrt_cpu_transpose_tiled(const float *x, int64_t ldx, float *o, int64_t ldo, int64_t rows,
                              int64_t cols);
/* The AdamW update of elements [0, n): ref_grad.c's double arithmetic, operation for operation
 * (4 doubles at a time on AVX2, no FMA), so the results are the reference's bits. */
typedef struct ptrt_cpu_adam {
    double decay;     /* 1 - lr wd */
    double b1, b2;    /* beta1, beta2 */
    double c1, c2;    /* 1 - beta1, 1 - beta2 */
    double step_size; /* lr / (1 - beta1^t) */
    double bc2_sqrt;  /* sqrt(1 - beta2^t) */
    double eps;
} ptrt_cpu_adam;
void ptrt_cpu_adamw_span(const ptrt_cpu_adam *a, const float *p, const float *g, const float *m,
                         const float *v, float *po, float *mo, float *vo, int64_t n);
/* Whether the AVX2+FMA paths are in use (the test runs the portable ones too). */
bool ptrt_cpu_vec_avx2(void);
void ptrt_cpu_vec_force_portable(bool on);
/* exp_sum and max take their AVX-512 paths where the CPU has AVX-512F, unless this is set (the
 * test holds them to the AVX2 paths' bits) */
void ptrt_cpu_vec_no_avx512(bool on);

/* ---- cpu_elementwise.c ---- */

int ptrt_cpu_binary(ptc_op op, const ptc_type *ta, const float *a, const ptc_type *tb,
                    const float *b, const ptc_type *to, float *o);
int ptrt_cpu_unary(ptc_op op, const ptc_type *tx, const float *x, float *o);
int ptrt_cpu_unary_grad(ptc_op op, const ptc_type *tx, const float *x, const float *dy, float *o);
int ptrt_cpu_transpose(const ptc_type *tx, const void *x, void *o);
/* n elements at x cast from one of f32, bf16, f16 to another at o, on this thread */
void ptrt_cpu_cast_serial(ptc_dtype from, const void *x, ptc_dtype to, void *o, int64_t n);
/* x (of dtype t) as floats from element off: x itself where it is f32, else its elements
 * [off, off + n) widened into buf (inline: the f32 case is a row's pointer in hot loops) */
static inline const float *ptrt_cpu_floats_at(const void *x, ptc_dtype t, int64_t off, int64_t n,
                                              float *buf)
{
    if (t == PTC_F32)
        return (const float *)x + off;
    ptrt_cpu_cast_serial(t, (const uint16_t *)x + off, PTC_F32, buf, n);
    return buf;
}
/* sum_to and sumsq over f32 or 16-bit x (sum_to's o of its dtype; sumsq's f32) */
int ptrt_cpu_sum_to(const ptc_type *tx, const void *x, const ptc_type *to, void *o);
int ptrt_cpu_sumsq(const ptc_type *tx, const void *x, float *o);
int ptrt_cpu_adamw(const ptrt_kcall *n, const ptc_type *it, void *const *in, void *const *out);
int ptrt_cpu_copy(int64_t bytes, const void *x, void *o);
/* concat along axis of nin operands of 4-byte elements, or of one 16-bit dtype (their bits
 * moved as they are), the rows split across the pool */
int ptrt_cpu_concat(int nin, const ptc_type *it, const void *const *in, int axis, void *o);
/* A cast between f32, bf16 and f16 storage, bit-exact with the reference (common/half.c); 0 for
 * i32 (the reference's). */
int ptrt_cpu_cast(const ptc_type *tx, const void *x, ptc_dtype to, void *o);

/* ---- cpu_norm.c: normalisations, softmax, losses, embedding ---- */

int ptrt_cpu_layernorm(const ptc_type *tx, const float *x, const float *g, const float *b,
                       double eps, float *o);
/* layernorm's (rmsnorm's) gradient, (x, g, dy) -> (dx, dg[, db]), any of them f32 or 16-bit */
int ptrt_cpu_norm_grad(bool rms, const ptc_type *it, void *const *in, const ptc_type *ot,
                       void *const *out, double eps);
int ptrt_cpu_rmsnorm(const ptc_type *tx, const float *x, const float *g, double eps, float *o);
int ptrt_cpu_softmax(bool log_out, const ptc_type *tx, const float *x, int axis, float *o);
int ptrt_cpu_cross_entropy(const ptc_type *tl, const float *logits, const int32_t *targets,
                           float *o);
int ptrt_cpu_cross_entropy_grad(const ptc_type *tl, const float *logits, const int32_t *targets,
                                const float *dloss, float *o);
int ptrt_cpu_embedding(const ptc_type *tt, const float *table, const ptc_type *ti,
                       const int32_t *ids, float *o);
int ptrt_cpu_embedding_grad(const ptc_type *ti, const int32_t *ids, const float *dy,
                            const ptc_type *to, float *o);

/* ---- cpu_attention.c ---- */

/* attention (it: q, k, v; ot: o) and its gradient (it: q, k, v, dy; ot: dq, dk, dv), each operand
 * f32, bf16 or f16 storage (16-bit ones widened and rounded a few rows at a time) */
int ptrt_cpu_attention(const ptc_type *it, void *const *in, const ptc_type *ot, void *o,
                       int64_t heads, int64_t kv_heads, bool causal);
int ptrt_cpu_attention_grad(const ptc_type *it, void *const *in, const ptc_type *ot,
                            void *const *out, int64_t heads, int64_t kv_heads, bool causal);
/* Which copy of the attention's block-product kernel runs: "avx512", "avx2" or "base"; NULL:
 * the widest this CPU has (the default). False, and nothing changed, when the CPU lacks it. For
 * tests, which run every copy the CPU has. */
bool ptrt_cpu_attention_isa(const char *name);
int ptrt_cpu_rope(const ptc_type *tx, const float *x, int64_t heads, double base, bool inverse,
                  float *o);

/* ---- cpu_moe.c ---- */

/* moe_ffn, moe_ffn_grad, moe_ep_ffn, moe_ep_ffn_grad in f32: an expert's rows a block at a time,
 * each product one GEMM */
int ptrt_cpu_moe(const ptrt_kcall *k, const ptc_type *it, void *const *in, const ptc_type *ot,
                 void *const *out);
/* Floats of scratch the experts' blocks of rows take at most (default 4M: 16 MiB; a block has at
 * least 16 rows): tests lower it so that an expert's rows take several blocks. */
extern int64_t ptrt_cpu_moe_scratch;
/* Experts side by side on the threads (cpu_moe.c's lanes): -1 (default) when it pays, 0 never,
 * 1 whenever two threads and two experts with rows are there (tests). */
extern int ptrt_cpu_moe_lanes;

#endif
