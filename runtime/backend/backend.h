/* backend.h - what the executor needs from a backend (ggml-backend's idea, kept as small): its
 * kernels, its GEMM, and memory for the arenas of the static memory plan.
 *
 * Backends: ref (the plain reference kernels, double accumulation: what everything is tested
 * against) and cpu (OpenBLAS GEMMs and fast float kernels, the reference for what it does not
 * cover). Both keep their arenas in host memory; a device backend (cuda) will keep them on the
 * device and move bytes with upload/download.
 */
#ifndef PTRT_BACKEND_H
#define PTRT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "kernel.h"
#include "program.h"

typedef struct ptrt_backend {
    const char *name;
    ptrt_kernel_fn kernel;
    /* C = alpha op(A) op(B) + beta C over g's batches (f32) */
    void (*gemm)(const ptc_gemm *g, const float *a, const float *b, float *c);
    /* An arena of n bytes (n > 0), aligned to at least PTC_ALIGN; NULL when it cannot be had.
     * Memory is committed as it is first touched. */
    void *(*alloc)(size_t n);
    void (*free)(void *p, size_t n);
    /* Whether arenas are host memory the runtime may read and write directly. */
    bool host;
} ptrt_backend;

extern const ptrt_backend ptrt_backend_ref;
extern const ptrt_backend ptrt_backend_cpu;

/* The backend named name ("ref", "cpu"), or NULL. */
const ptrt_backend *ptrt_backend_find(const char *name);

/* Host arenas for the CPU backends: anonymous mappings, released to the system when freed. */
void *ptrt_host_alloc(size_t n);
void ptrt_host_free(void *p, size_t n);

#endif
