/* cuda_internal.h - what the CUDA backend (cuda.c) runs on: the real libraries (cuda_real.c) or
 * the host emulation (cuda_emulated.c), behind one table. */
#ifndef PTRT_CUDA_INTERNAL_H
#define PTRT_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "comm.h"
#include "cuda.h"
#include "cudalib.h"

typedef struct ptrt_cuda_impl {
    const char *what;   /* for messages: "CUDA backend on the GPU" */
    const char *device; /* the --device value */
    bool emulated;
    /* the driver's functions: 0, or -1 with a message naming what is missing */
    int (*open)(const ptrt_cuda_driver **d, char *err, size_t errn);
    /* a translation unit for architecture sm -> the image cuModuleLoadData takes (malloc'd),
     * or NULL with the compiler's message */
    char *(*compile)(const char *src, const char *name, int sm, char *err, size_t errn);
    /* the GEMM library's handle, made once */
    int (*gemm_start)(void **handle, char *err, size_t errn);
    /* one GEMM, queued on the default stream; a failure's code, with the call named in call */
    int (*gemm)(void *handle, const ptrt_cuda_gemm *g, ptrt_cudev ws, size_t ws_bytes, char *call,
                size_t calln);
    /* NCCL's functions, or NULL with why */
    const ptrt_nccl *(*nccl)(char *err, size_t errn);
    /* the emulation's NCCL has no network of its own: it moves bytes over the job's host
     * communicator (in-process or MPI), given here before any communicator is made; NULL on
     * the real libraries */
    void (*nccl_transport)(ptrt_comm *host);
} ptrt_cuda_impl;

extern const ptrt_cuda_impl ptrt_cuda_real;
extern const ptrt_cuda_impl ptrt_cuda_emulation;

/* the rank the calling thread was last bound to (-1: none) */
int ptrt_cuda_bound_rank(void);

/* the address tag of the emulation's device memory (cuda_emulated.c) */
void *ptrt_cuda_emu_host(ptrt_cudev p);

#endif
