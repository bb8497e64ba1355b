/* kjit.h - kernels of the kernel IR compiled for the CPU through LLVM (the C API of LLVM 14 or
 * later), at run time, with an on-disk cache.
 *
 * A kernel becomes one function `void f(void *const *args, int64_t tid, int64_t nt)`: args holds
 * one pointer per kernel parameter; thread tid of nt runs its part of every parallel loop. The
 * module is optimised by the new pass manager (LLVMRunPasses with "default<O3>", loop and SLP
 * vectorization on) for the host CPU (its name and features, so AVX2 or AVX-512 where present),
 * compiled to an object file, and linked into one process-wide ORC LLJIT.
 *
 * Why at run time and not ahead of time in ptc: the executable is the runner plus the plan's text
 * (no linker is involved when ptc writes it), the code is generated for the CPU that actually runs
 * it (clusters mix CPU generations; the build machine's features are a guess), and the CUDA
 * backend compiles its kernels at run time the same way (NVRTC, cached on disk). The cost is the
 * start-up compile, which the cache removes after the first run: object files are stored under
 * the cache directory by a key of the kernel's text, the CPU's name and features, the LLVM version
 * and the emitter's version.
 *
 * Library code of the runtime (prefix ptc_ as it is code generation, like the plan it runs): it
 * links LLVM, never the compiler.
 */
#ifndef PTC_KJIT_H
#define PTC_KJIT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kir.h"

typedef void (*ptc_kfn)(void *const *args, int64_t tid, int64_t nt);

/* The compiled function of kernel k (compiling it, or loading it from the cache, the first time
 * a kernel of that text is asked for in this process). Thread-safe. NULL with a message (LLVM's
 * own included) when it cannot be compiled. cache_dir NULL: the default
 * ($XDG_CACHE_HOME/ptc/kernels or ~/.cache/ptc/kernels); "": no disk cache. */
ptc_kfn ptc_kjit_get(const ptc_kir *k, const char *cache_dir, char *err, size_t errn);

/* Counters of this process, for tests: kernels compiled by LLVM, loaded from the disk cache. */
void ptc_kjit_counts(int *compiled, int *cached);

/* The LLVM IR of kernel k as text, after optimisation when optimize is set (ptc --emit llvm).
 * 0, or -1 with a message. */
int ptc_kjit_print_llvm(const ptc_kir *k, bool optimize, FILE *f, char *err, size_t errn);

/* "LLVM 14.0.6, sapphirerapids +avx512f,..." : what code is generated for. */
void ptc_kjit_target(char *buf, size_t n);

#endif
