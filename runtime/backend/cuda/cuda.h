/* cuda.h - the CUDA backend: a rank's program on an NVIDIA GPU.
 *
 *   memory     one cuMemAlloc arena per region of the static memory plan (the executor's alloc
 *              hook), and one scratch allocation made when the plan's kernels are prepared (the
 *              row statistics of layernorm's backward, attention's softmax statistics: sized
 *              for the largest instruction); nothing per tensor;
 *   kernels    one translation unit per plan, compiled by NVRTC for the device's architecture
 *              (PTX cached on disk, cudalib.h) and loaded with cuModuleLoadData: the plan's fused
 *              kernels, the flash-style attention kernels of each attention shape, and every
 *              other kernel instruction as a kernel-IR kernel of its own (codegen/kir_ops.h);
 *              an instruction with none (an op or dtype not covered yet) fails the start,
 *              naming the op and where it comes from in the model;
 *   GEMMs      cuBLASLt (fp32 compute, f32 or bf16/f16 operands), the row-major GEMM of the
 *              plan given to it as the column-major product C^T = op(B)^T op(A)^T;
 *   order      every launch and copy on the default stream, in program order; errors are the
 *              device's, reported when the executor syncs at the end of a run (the first one,
 *              naming the call).
 *
 * The backend calls the driver through a function table: the real libraries (dlopen,
 * cudalib.h), or the host emulation (ptrt_backend_cuda_emulated: the driver's calls over host
 * memory with device addresses that the host cannot dereference, the CUDA C compiled by the
 * host C compiler through cuda_emu.h, GEMMs computed from the same column-major description
 * cuBLASLt gets), so that everything but the libraries themselves runs in CI without a GPU.
 * One process uses one of the two.
 *
 * Several ranks: NCCL where each has its own GPU (nccl_comm.h), the device communicator where
 * all share one (inproc.h, ptrt_inproc_new_on, over this backend's copy2d and reduce hooks:
 * the reduction is a kernel of a small unit of its own, ptc_cuda_emit_comm, compiled and loaded
 * per GPU on first use), else through host memory (staged.h). NCCL's calls run on a stream of
 * their own, beside the kernels (nccl_comm.h); the kernels, GEMMs and copies are on the default
 * stream. Not yet: moe ops.
 */
#ifndef PTRT_CUDA_H
#define PTRT_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "program.h"

extern const ptrt_backend ptrt_backend_cuda;
extern const ptrt_backend ptrt_backend_cuda_emulated;

struct ptrt_cuda_driver;
struct ptrt_nccl;
/* Once the backend has started (a bind): the driver's functions in use (the real or emulated
 * ones), the number of GPUs, and NCCL's functions (NULL with why). */
const struct ptrt_cuda_driver *ptrt_cuda_driver_now(void);
int ptrt_cuda_gpu_count(void);
const struct ptrt_nccl *ptrt_cuda_nccl_now(char *err, size_t errn);
/* The PCI bus id of the GPU the calling thread is bound to ("0000:41:00.0"; "?" when the driver
 * does not say): with the host's name, which GPU a rank has, across processes. */
const char *ptrt_cuda_bus_id(void);
struct ptrt_comm;
/* Before NCCL communicators are made: the host communicator of the job (the emulation's NCCL
 * moves its bytes over it; the real NCCL has its own network). */
void ptrt_cuda_nccl_transport(struct ptrt_comm *host);

/* The translation unit the backend compiles for plan p on architecture sm (80, 90): the plan's
 * fused kernels, its attention kernels, and a kernel of every other kernel instruction
 * (deduplicated); malloc'd. NULL with a message naming the first instruction it has no kernel
 * for. No device is needed (ptc --emit cuda, the NVRTC tests). */
char *ptrt_cuda_unit(const ptc_plan *p, int sm, char *err, size_t errn);

/* A row-major GEMM of the plan (C = alpha op(A) op(B) + beta C, batched) as the column-major
 * product cuBLASLt computes: D^T = alpha op'(X) op'(Y) + beta D^T, X and Y being B and A. */
typedef struct ptrt_cuda_gemm {
    int transa, transb; /* of X and Y: PTRT_CUBLAS_OP_N or _T */
    int64_t m, n, k;    /* of the column-major product: m = n of the plan, n = m */
    int64_t x_rows, x_cols, ldx, y_rows, y_cols, ldy, ldd; /* the layouts as stored */
    int64_t batch, sx, sy, sd;
    const void *x, *y;
    void *d;
    int ab; /* operand dtype (ptc_dtype): f32, bf16 or f16 */
    int cd; /* D's: f32, or (beta 0) bf16 or f16, the f32 sums rounded as cuBLASLt stores them */
    int compute; /* PTRT_CUBLAS_COMPUTE_32F, or for f32 operands at a lower float32 matmul
                  * precision (backend.h) _FAST_TF32 (high) or _FAST_16BF (medium) */
    float alpha, beta;
} ptrt_cuda_gemm;

ptrt_cuda_gemm ptrt_cuda_gemm_of(const ptc_gemm *g, const void *a, const void *b, void *c);

#endif
