/* backend.h - what the executor needs from a backend (ggml-backend's idea, kept as small): its
 * kernels, its GEMM, the plan's generated (fused) kernels, and memory for the arenas of the static
 * memory plan.
 *
 * Backends: ref (the plain reference kernels, double accumulation: what everything is tested
 * against), cpu (OpenBLAS GEMMs and fast float kernels, the reference for what it does not
 * cover) and jit (the cpu backend's kernels, with the plan's fused kernels compiled through LLVM
 * when an executor starts: backend/jit/). ref and cpu run fused kernels by interpreting their
 * kernel IR (ptc_kir_run). These keep their arenas in host memory. A device backend (cuda,
 * backend/cuda/) keeps them in device memory (host false): the executor never reads or writes
 * them itself but moves bytes through upload, download, move and zero, and learns of the
 * device's errors (asynchronous, as a GPU reports them) from sync at the end of every run.
 */
#ifndef PTRT_BACKEND_H
#define PTRT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "kernel.h"
#include "program.h"

enum { PTRT_ON_HOST = 1 }; /* instr: run this one on the host */

typedef struct ptrt_backend {
    const char *name;
    ptrt_kernel_fn kernel;
    /* C = alpha op(A) op(B) + beta C over g's batches, accumulated in f32: a and b hold g->ab
     * elements (f32, bf16 or f16), c g->cd elements (f32, or with beta 0 bf16 or f16: each f32
     * sum rounded once, as ptc_bf16_bits / ptc_f16_bits round) */
    void (*gemm)(const ptc_gemm *g, const void *a, const void *b, void *c);
    /* An arena of n bytes (n > 0), aligned to at least PTC_ALIGN; NULL when it cannot be had.
     * Memory is committed as it is first touched. */
    void *(*alloc)(size_t n);
    void (*free)(void *p, size_t n);
    /* Whether arenas are host memory the runtime may read and write directly. */
    bool host;
    /* Once per executor, before anything runs: makes the plan's kernels ready (compiles them)
     * and returns the state `fused` gets. NULL: nothing to prepare. 0, or -1 with a message. */
    int (*prepare)(const ptc_plan *p, void **state, char *err, size_t errn);
    void (*release)(void *state);
    /* Kernel k of the plan's kernel table over args (one pointer per kernel parameter). */
    int (*fused)(void *state, const ptc_plan *p, int k, void *const *args, char *err,
                 size_t errn);
    /* Kernel instruction i of program prog over its operands, where the backend prepared its
     * own code for each (a device backend), coord being the kernel call's (ptrt_kcall); NULL:
     * the executor calls kernel. PTRT_ON_HOST: the backend has no code for it, and the
     * executor runs the CPU backend's kernel on host copies of the operands. */
    int (*instr)(void *state, const ptc_plan *p, int prog, int i, int coord, void *const *in,
                 void *const *out, char *err, size_t errn);
    /* Device backends only (NULL on host backends, where the executor uses memcpy): n bytes from
     * host memory into an arena, from an arena to host memory (complete on return), within
     * arenas (overlap allowed), zeros; and sync: waits for the work queued so far and returns 0,
     * or -1 with the first error the device reported since the last sync. */
    /* Device backends with several devices: binds the calling thread to the device of rank
     * `rank` (the executor binds before its every call, so a rank's calls from any thread go to
     * its device). 0, or -1 with why. NULL: one device. */
    int (*bind)(int rank, char *err, size_t errn);
    void (*upload)(void *dev, const void *host, size_t n);
    void (*download)(void *host, const void *dev, size_t n);
    void (*move)(void *dst, const void *src, size_t n);
    void (*zero)(void *dst, size_t n);
    int (*sync)(char *err, size_t errn);
    /* Device backends whose ranks may share one device's memory, for the device communicator
     * (ptrt_inproc_new_on: inproc.h); NULL elsewhere. copy2d: height rows of width bytes, rows
     * spitch bytes apart in src and dpitch in dst (no overlap). reduce: dst[i] = src[0][i] op
     * src[1][i] op ... op src[n-1][i] for i < len, elements of dt (f32, bf16, f16) widened to
     * float, taken left to right and rounded once, op 0 a sum and 1 a maximum that propagates
     * NaN (the in-process communicator's reduction, bit for bit); dst may be one of the
     * sources. Both queue on the device's one stream, in order with its kernels; reduce
     * returns 0, or -1 with why (its kernels could not be had). */
    void (*copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height);
    int (*reduce)(void *dst, const void *const *src, int n, int64_t len, int op, ptc_dtype dt,
                  char *err, size_t errn);
} ptrt_backend;

extern const ptrt_backend ptrt_backend_ref;
extern const ptrt_backend ptrt_backend_cpu;
/* NULL in a build without LLVM */
extern const ptrt_backend *const ptrt_backend_jit;
/* (builds with LLVM) A compiled kernel (codegen/llvm/kjit.h's ptc_kfn) as the jit backend runs a
 * fused kernel: part t of nt on each of the CPU backend's threads (nt 1: the calling thread). */
void ptrt_jit_run(void (*fn)(void *const *args, int64_t tid, int64_t nt), void *const *args,
                  int64_t nt);

/* Runs a fused kernel by interpreting its kernel IR, on the calling thread (the ref backend) or on
 * the CPU backend's threads (cpu). */
int ptrt_fused_interp(void *state, const ptc_plan *p, int k, void *const *args, char *err,
                      size_t errn);
int ptrt_fused_interp_parallel(void *state, const ptc_plan *p, int k, void *const *args,
                               char *err, size_t errn);

/* The float32 matmul precision of a run (the runner's --matmul-precision; PyTorch's
 * torch.set_float32_matmul_precision): how a backend computes the GEMM instructions over f32
 * operands. highest (the default): f32 products and sums. high and medium let a backend use
 * faster units where it has them: the CPU AMX-BF16 GEMMs over operands split into two bf16
 * (high, about 2^-17 relative) or rounded to one (medium, about 2^-8; AVX-512-BF16 too;
 * cpu_gemm_split.c), a GPU its tensor cores (TF32 inputs for high, about 2^-11, and bf16 for
 * medium, as cuBLASLt's fast compute types). Elsewhere, and on the reference backend, f32 stays
 * f32. Process-wide. */
typedef enum { PTRT_MATMUL_HIGHEST, PTRT_MATMUL_HIGH, PTRT_MATMUL_MEDIUM } ptrt_matmul_precision;
void ptrt_set_matmul_precision(ptrt_matmul_precision p);
ptrt_matmul_precision ptrt_matmul_precision_asked(void);
const char *ptrt_matmul_precision_name(ptrt_matmul_precision p);

/* The backend named name ("ref", "cpu", "jit" where built), or NULL. */
const ptrt_backend *ptrt_backend_find(const char *name);

/* Host arenas for the CPU backends: anonymous mappings, released to the system when freed. */
void *ptrt_host_alloc(size_t n);
void ptrt_host_free(void *p, size_t n);

#endif
