/* cuda_emit.h - kernels of the kernel IR as CUDA C: one translation unit that NVRTC, `nvcc --ptx`
 * and a host C compiler (through cuda_emu.h, the emulation header) all accept.
 *
 * How a kernel maps onto the GPU. A kernel becomes one `__global__` function launched on a 1-D
 * grid; every top-level parallel loop is spread over the whole grid by striding, so any grid and
 * any block size (a multiple of 32, at most 1024) give the same results:
 *
 *   flat loop   a parallel loop whose body holds no loop and no reduction (elementwise chains,
 *               the multi-tensor AdamW): one iteration per thread, `i += gridDim.x * blockDim.x`;
 *   row loop    a parallel loop whose body holds loops or reductions (norms, softmax, the
 *               cross-entropy with its gradient): one iteration per block, `r += gridDim.x`. In
 *               the row's body the loops at its top level are spread over the block's threads
 *               (coalesced: thread t takes j = t, t + blockDim.x, ...) and its reductions are
 *               block reductions (a strided partial per thread, warp shuffles, one shared-memory
 *               step; every thread gets the same sum, added in the same order). Scalars of the
 *               row are computed by every thread; a store of the row is made by thread 0.
 *               Barriers separate the row's statements that write memory from the others. A loop
 *               runs on thread 0 alone, in order, unless its iterations are independent: every
 *               store's index c v + R in the loop's variable v, with |c| larger than R's spread
 *               (so no two iterations store one element), one index per stored array, and loads
 *               of a stored array only at that index. A store at a data index (an embedding
 *               gradient's token rows) is therefore sequential: two tokens of one id add into
 *               one element, and there are no atomics.
 *
 * Top-level scalars are computed by every thread, as the CPU's threads each compute them.
 * Values are f32 and sums accumulate in f32, as on the CPU; exp, log, sqrt and tanh are CUDA's
 * accurate (not fast-math) functions; min and max are fminf and fmaxf (LLVM's minnum/maxnum).
 */
#ifndef PTC_CUDA_EMIT_H
#define PTC_CUDA_EMIT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kir.h"

/* The architectures kernels are compiled for: sm_80 (A100: 108 SMs) and sm_90 (H100: 132). */
typedef struct ptc_cuda_arch {
    int sm;  /* 80, 90 */
    int sms; /* streaming multiprocessors of the reference part */
} ptc_cuda_arch;

extern const ptc_cuda_arch ptc_cuda_archs[];
extern const int ptc_cuda_narchs;

/* The launch of kernel k on arch: block threads (a multiple of 32: 256 for flat loops, the row's
 * widest loop rounded up to a warp, at most 256, for row loops) and a grid that covers the widest
 * loop, capped at one full wave of blocks (2048 threads an SM) since loops stride. */
void ptc_cuda_launch(const ptc_kir *k, const ptc_cuda_arch *arch, int *grid, int *block);

/* The definitions every translation unit starts with (macros that differ between CUDA and the
 * host emulation, the block reductions). */
void ptc_cuda_emit_prelude(FILE *f);

/* One kernel: `extern "C" __global__ void k_<name>(...)`, and under PTC_CUDA_EMULATE a host
 * entry `k_<name>__emu(void *const *args)` taking one pointer per parameter. */
void ptc_cuda_emit_kernel(const ptc_kir *k, FILE *f);

/* The device communicator's unit: the prelude and k_ptc_comm_reduce, which reduces any number
 * of same-length sources (f32, bf16, f16) as the in-process communicator does (see there). */
void ptc_cuda_emit_comm(FILE *f);

/* A whole translation unit: the prelude and the n kernels. */
void ptc_cuda_emit_unit(ptc_kir *const *ks, int n, FILE *f);

/* ---- attention (cuda_attention.c: flash-attention style, see there) ---- */

/* one attention shape: q [batch, seq, heads x head_dim], k and v [batch, kv_seq, kv_heads x
 * head_dim]. Query head h reads key/value head (h + h0) / ratio; ratio 0 means heads / kv_heads
 * (and h0 0). A rank's share of a tensor-parallel attention whose kv_heads do not divide by the
 * axis (attention_shard): its heads are h0 = c x heads .. of n, all kv_heads present, ratio
 * n / kv_heads; a key/value head none of its query heads reads gets zero gradients. */
typedef struct ptc_cuda_attn {
    int64_t batch, seq, kv_seq, heads, kv_heads, head_dim, h0, ratio;
    bool causal;
    /* PTC_BF16 or PTC_F16: the operands hold values of that 16-bit type (a 16-bit plan's
     * attention), and the kernels run on tensor cores in it (cuda_attention_mma.c); 0: f32 */
    int mma;
    /* PTC_BF16 or PTC_F16: q, k, v, dy and the results are that 16-bit storage itself (the
     * fusion pass folded the casts around the attention into it); 0: f32 */
    int io;
} ptc_cuda_attn;

/* Whether a and b are one shape. */
bool ptc_cuda_attn_same(const ptc_cuda_attn *a, const ptc_cuda_attn *b);
struct ptc_program;
struct ptc_instr;
/* The shape of an attention, attention_grad, attention_shard or attention_shard_grad instruction
 * of program pg, at coordinate coord on the op's mesh axis (the shard ops); false for another
 * op. */
bool ptc_cuda_attn_of(const struct ptc_program *pg, const struct ptc_instr *in, int coord,
                      ptc_cuda_attn *a);

typedef enum {
    PTC_CUDA_ATTN_FWD,    /* (q, k, v) -> o */
    PTC_CUDA_ATTN_STATS,  /* (q, k, v, dy) -> lse, dsum: [batch, heads, seq] each */
    PTC_CUDA_ATTN_BWD_KV, /* (q, k, v, dy, lse, dsum) -> dk, dv */
    PTC_CUDA_ATTN_BWD_Q,  /* (q, k, v, dy, lse, dsum) -> dq */
    PTC_CUDA_ATTN_NKERNELS
} ptc_cuda_attn_kernel;

extern const char *const ptc_cuda_attn_names[PTC_CUDA_ATTN_NKERNELS]; /* "fwd", ... */

/* The four kernels of shape a: k_<name>_fwd, _stats, _bwd_kv, _bwd_q (and their __emu entries). */
void ptc_cuda_emit_attention(const ptc_cuda_attn *a, const char *name, FILE *f);
void ptc_cuda_attention_launch(const ptc_cuda_attn *a, ptc_cuda_attn_kernel which,
                               const ptc_cuda_arch *arch, int *grid, int *block);

/* Internal to the attention emitters: text with @ standing for the attention's name, printed
 * with it substituted; the tensor-core kernels' head sizes; their definitions for one shape
 * (after the shape's constants) and the body of one of their kernels. */
void ptc_cuda_put_named(FILE *f, const char *text, const char *name);
bool ptc_cuda_attn_mma_fits(int64_t head_dim);
void ptc_cuda_emit_attn_mma_defs(const ptc_cuda_attn *a, const char *name, FILE *f);
void ptc_cuda_emit_attn_mma_body(ptc_cuda_attn_kernel w, const char *name, FILE *f);

/* ---- mixture of experts (cuda_moe.c: the row kernels around the experts' GEMMs) ---- */

/* one expert shape of moe_ffn(_grad) (K its top_k) or moe_ep_ffn(_grad) (ep, K 1), f32: w_up
 * [E, d, F], w_down [E, f, d], F = 2 f for swiglu */
typedef struct ptc_cuda_moe {
    int64_t d, f, F, K;
    int act; /* ptc_act */
    bool ep;
} ptc_cuda_moe;

/* The shape of a moe_ffn(_grad) or moe_ep_ffn(_grad) instruction whose operands are f32 (and
 * whose experts are not split: moe_ffn's group 1), or false. */
bool ptc_cuda_moe_of(const struct ptc_program *pg, const struct ptc_instr *in, ptc_cuda_moe *m);

/* Whether a and b are one shape. */
bool ptc_cuda_moe_same(const ptc_cuda_moe *a, const ptc_cuda_moe *b);

typedef enum {
    PTC_CUDA_MOE_GATHER,   /* (x, src, at) -> X */
    PTC_CUDA_MOE_ACT,      /* (H, at) -> A */
    PTC_CUDA_MOE_OUT,      /* (O, idx, gate, at) -> y */
    PTC_CUDA_MOE_OUT_GRAD, /* (O, dy, idx, gate, at) -> dO, dgate */
    PTC_CUDA_MOE_ACT_GRAD, /* (H, dA, at) -> dH */
    PTC_CUDA_MOE_SCATTER,  /* (dX, idx, at) -> dx */
    PTC_CUDA_MOE_NKERNELS
} ptc_cuda_moe_kernel;

extern const char *const ptc_cuda_moe_names[PTC_CUDA_MOE_NKERNELS]; /* "gather", ... */

/* The kernels of shape m: k_<name>_gather, ... (and their __emu entries). */
void ptc_cuda_emit_moe(const ptc_cuda_moe *m, const char *name, FILE *f);
/* The launch of a moe kernel over work elements (rows, for out_grad of moe_ffn). */
void ptc_cuda_moe_launch(const ptc_cuda_arch *arch, int64_t work, int *grid, int *block);

/* Expert parallelism's row ops on rows of d (moe_pack, moe_unpack, moe_combine,
 * moe_combine_grad), n choices, K a token: each choice's row pos[c] (-1: dropped) comes from the
 * host; one thread an element (combine_grad: a choice), a token's choices summed in order. */
typedef struct ptc_cuda_moe_rows {
    int64_t d, K, n;
} ptc_cuda_moe_rows;

typedef enum {
    PTC_CUDA_MOE_PACK,         /* (x, pos) -> rows (zeroed first) */
    PTC_CUDA_MOE_UNPACK,       /* (rows, pos) -> y */
    PTC_CUDA_MOE_COMBINE,      /* (rows, pos, gate) -> y */
    PTC_CUDA_MOE_COMBINE_GRAD, /* (rows, pos, gate, dy) -> drows (zeroed first), dgate */
    PTC_CUDA_MOE_ROWS_NKERNELS
} ptc_cuda_moe_rows_kernel;

extern const char *const ptc_cuda_moe_rows_names[PTC_CUDA_MOE_ROWS_NKERNELS]; /* "pack", ... */

/* The shape of a moe_pack, moe_unpack, moe_combine or moe_combine_grad instruction of f32 rows,
 * or false. */
bool ptc_cuda_moe_rows_of(const struct ptc_program *pg, const struct ptc_instr *in,
                          ptc_cuda_moe_rows *m);
/* Whether a and b are one shape. */
bool ptc_cuda_moe_rows_same(const ptc_cuda_moe_rows *a, const ptc_cuda_moe_rows *b);
/* The kernels of shape m: k_<name>_pack, ... (and their __emu entries). */
void ptc_cuda_emit_moe_rows(const ptc_cuda_moe_rows *m, const char *name, FILE *f);

/* A routing op of moe layers, f32 floats and i32 ids: moe_topk (p [R, E] -> ids, gate [R, K]),
 * moe_topk_grad (p, ids, dgate -> dp), moe_count (ids [B, S, K] -> counts [B, K, E]),
 * moe_prefix (counts -> before [B, K, E], totals [K, E]), moe_route (ids, before, totals ->
 * route [B, S, K]), moe_frac (totals -> [E]), moe_stats (totals -> [3]), moe_ep_count (route
 * [R] -> kept [E]). One kernel a shape, computing what the reference computes in its order (the
 * capacity C of route and stats exactly, from the capacity's shortest decimal: digits x 10^e10;
 * cap false: nothing is dropped). */
typedef struct ptc_cuda_moe_route {
    int64_t op; /* ptc_op */
    int64_t R, E, K, B, S;
    uint64_t digits;
    int64_t e10;
    bool cap, normalize;
} ptc_cuda_moe_route;

bool ptc_cuda_moe_route_of(const struct ptc_program *pg, const struct ptc_instr *in,
                           ptc_cuda_moe_route *m);
bool ptc_cuda_moe_route_same(const ptc_cuda_moe_route *a, const ptc_cuda_moe_route *b);
/* The kernel of shape m: k_<name> (and its __emu entry), over operands then results. */
void ptc_cuda_emit_moe_route(const ptc_cuda_moe_route *m, const char *name, FILE *f);
/* The threads a routing kernel runs over (its grid-stride loop's length). */
int64_t ptc_cuda_moe_route_work(const ptc_cuda_moe_route *m);

struct ptc_plan;
/* The distinct routing shapes of a plan. */
int ptc_cuda_plan_moe_routes(const struct ptc_plan *p, ptc_cuda_moe_route *out, int cap);
/* The distinct row shapes of a plan's expert-parallel row ops. */
int ptc_cuda_plan_moe_rows(const struct ptc_plan *p, ptc_cuda_moe_rows *out, int cap);
/* The distinct expert shapes of a plan; returns their number, filling at most cap. */
int ptc_cuda_plan_moes(const struct ptc_plan *p, ptc_cuda_moe *out, int cap);
/* The experts' kernels of each shape of the plan (moe0, ...), then the rows' (moerows0, ...),
 * then the routing kernels (moeroute0, ...). */
void ptc_cuda_emit_plan_moes(const struct ptc_plan *p, FILE *f);
/* The distinct attention shapes of a plan's attention and attention_grad instructions, and of its
 * attention_shard(_grad) instructions at every coordinate of their axis; returns their number,
 * filling at most cap. */
int ptc_cuda_plan_attentions(const struct ptc_plan *p, ptc_cuda_attn *out, int cap);
/* ptc --emit cuda: the plan's generated kernels, then the attention kernels of each shape
 * (named attn0, attn1, ... in the order of ptc_cuda_plan_attentions), then the experts' kernels
 * of each shape (moe0, moe1, ... in the order of ptc_cuda_plan_moes), then expert parallelism's
 * row kernels of each row shape (moerows0, ...: ptc_cuda_plan_moe_rows), then the routing kernel
 * of each routing shape (moeroute0, ...: ptc_cuda_plan_moe_routes). */
void ptc_cuda_emit_plan(const struct ptc_plan *p, FILE *f);

#endif
