/* kir_attention.h - attention forward and backward as kernels of the kernel IR, in the manner of
 * FlashAttention-2 (one query row, or one key row, per iteration of the parallel loop; no s x s
 * matrix is ever stored), with the semantics of the reference attention and its gradient
 * (runtime/kernels/ref: causal leaves out keys after the query's position, grouped-query
 * attention shares a kv head among H/G query heads), f32 arithmetic and f32 sums.
 *
 * For q [B,S,H*dh], k and v [B,S2,G*dh], the kernels, run in this order for a training step:
 *   fwd     q, k, v -> o: an online softmax over the keys, its running maximum and sum and the
 *           weighted rows of v in local arrays;
 *   stats   q, k, v, dy -> lse [B*H*S] (log of the softmax's sum plus its maximum) and dsum
 *           [B*H*S] (dy . o, recomputed as the sum over keys of p * (dy . v)): what the backward
 *           needs, recomputed because the plan keeps no softmax statistics;
 *   dq      q, k, v, dy, lse, dsum -> dq: per query row, over its keys;
 *   dkv     q, k, v, dy, lse, dsum -> dk, dv: per key row, over the query heads that share its
 *           kv head and the queries that see it; each dk, dv row has one writer, no atomics.
 * The CPU keeps its register-blocked C kernels (cpu_attention.c) and the CUDA backend its own
 * CUDA C (cuda_attention.c); these say what the kernel IR can express, and are held to the
 * reference in tests (test_kir_attention: interpreter, checked, and LLVM-compiled).
 */
#ifndef PTC_KIR_ATTENTION_H
#define PTC_KIR_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "kir.h"

typedef struct ptc_kir_attn {
    int64_t batch, seq, kv_seq, heads, kv_heads, head_dim;
    bool causal;
} ptc_kir_attn;

typedef enum {
    PTC_KIR_ATTN_FWD,
    PTC_KIR_ATTN_STATS,
    PTC_KIR_ATTN_DQ,
    PTC_KIR_ATTN_DKV,
    PTC_KIR_ATTN_NKERNELS
} ptc_kir_attn_kernel;

/* The kernel `which` for shape a, named name_<fwd|stats|dq|dkv>, verified; NULL with a message
 * for a shape it cannot take (heads not a multiple of kv_heads, a size below 1, a head_dim above
 * PTC_KIR_LOCAL_MAX). Parameters in the order given above. */
ptc_kir *ptc_kir_attention(const ptc_kir_attn *a, ptc_kir_attn_kernel which, const char *name,
                           char *err, size_t errn);

#endif
