/* backend.c - the reference backend, host arenas and the backend registry (see backend.h). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "backend.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu.h"
#include "kir.h"
#include "ref.h"

void *ptrt_host_alloc(size_t n)
{
    /* an anonymous mapping is page-aligned and takes memory only as pages are touched; the
     * kernel refuses it when overcommit is off and memory is short */
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    /* an arena is touched all over every step: huge pages mean fewer faults and TLB misses
     * (a hint; without transparent huge pages it changes nothing) */
    if (n >= (size_t)2 << 20)
        madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

void ptrt_host_free(void *p, size_t n)
{
    if (p)
        munmap(p, n);
}

static atomic_int matmul_precision = PTRT_MATMUL_HIGHEST;

void ptrt_set_matmul_precision(ptrt_matmul_precision p)
{
    atomic_store(&matmul_precision, (int)p);
}

ptrt_matmul_precision ptrt_matmul_precision_asked(void)
{
    return (ptrt_matmul_precision)atomic_load(&matmul_precision);
}

const char *ptrt_matmul_precision_name(ptrt_matmul_precision p)
{
    return p == PTRT_MATMUL_HIGH ? "high" : p == PTRT_MATMUL_MEDIUM ? "medium" : "highest";
}

int ptrt_fused_interp(void *state, const ptc_plan *p, int k, void *const *args, char *err,
                      size_t errn)
{
    return ptc_kir_run(p->kernels[k], args, 0, 1, err, errn);
}

const ptrt_backend ptrt_backend_ref = {
    .name = "ref",
    .kernel = ptrt_ref_run,
    .gemm = ptrt_ref_gemm,
    .alloc = ptrt_host_alloc,
    .free = ptrt_host_free,
    .host = true,
    .fused = ptrt_fused_interp,
};

#ifndef PTC_HAVE_LLVM
const ptrt_backend *const ptrt_backend_jit = NULL;
#endif

const ptrt_backend *ptrt_backend_find(const char *name)
{
    if (strcmp(name, "ref") == 0)
        return &ptrt_backend_ref;
    if (strcmp(name, "cpu") == 0)
        return &ptrt_backend_cpu;
    if (strcmp(name, "jit") == 0)
        return ptrt_backend_jit;
    return NULL;
}
