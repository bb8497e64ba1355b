/* cpu.h - the fast CPU backend: GEMMs through OpenBLAS (CBLAS), float kernels written for speed
 * for the ops that dominate a training step, and the reference kernels (ref.h) for everything
 * else. Every fast kernel is tested against its reference kernel (tests/unit/test_cpu_backend.c).
 */
#ifndef PTRT_CPU_H
#define PTRT_CPU_H

#include <stdbool.h>

#include "backend.h"
#include "kernel.h"

/* Same contract as ptrt_ref_run. */
int ptrt_cpu_run(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                 void *const *out, char *err, size_t errn);
/* Threads for GEMMs and parallel kernels, the calling thread included (0 = one per online CPU).
 * The GEMM library itself is kept to one thread: the backend splits GEMMs across its own threads. */
void ptrt_cpu_set_threads(int n);
/* Other threads or processes of the run compute on the same cores (ranks as threads, several
 * processes on a node): the pool's idle threads then spin only briefly before they sleep. */
void ptrt_cpu_share_cores(void);
/* Whether GEMMs go to a library (oneDNN or OpenBLAS, opened at the first GEMM), and its name
 * ("onednn", "openblas SkylakeX", "plain loop"). */
int ptrt_cpu_has_blas(void);
const char *ptrt_cpu_blas_name(void);
/* Whether the library has a bf16 GEMM (oneDNN; bf16 operands, f32 sums): a plan's bf16 GEMMs
 * run on it, else on the f32 GEMM over operands widened to f32. */
bool ptrt_cpu_has_bf16_gemm(void);
/* The float32 matmul precision the CPU's GEMM instructions run at: the one asked
 * (ptrt_set_matmul_precision, backend.h) where this CPU and library have the units for it, else
 * highest (cpu_gemm_split.c). */
ptrt_matmul_precision ptrt_cpu_matmul_precision(void);

#endif
