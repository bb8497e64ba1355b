/* cuda_real.c - the CUDA backend on the real libraries: the driver, NVRTC and cuBLASLt, opened
 * with dlopen (cudalib.c). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"
#include "util.h"

static int real_open(const ptrt_cuda_driver **d, char *err, size_t errn)
{
    for (int lib = PTRT_CUDA_DRIVER; lib <= PTRT_CUDA_CUBLASLT; lib++)
        if (ptrt_cuda_open((ptrt_cuda_lib)lib, err, errn) < 0)
            return -1;
    *d = ptrt_cuda_driver_api();
    return 0;
}

static char *real_compile(const char *src, const char *name, int sm, char *err, size_t errn)
{
    int cached = 0;
    return ptrt_nvrtc_compile(src, name, sm, NULL, &cached, err, errn);
}

static int real_gemm_start(void **handle, char *err, size_t errn)
{
    int rc = ptrt_cuda_cublaslt_api()->cublasLtCreate(handle);
    if (rc)
        ptc_fmt(err, errn, "cublasLtCreate failed (status %d)", rc);
    return rc ? -1 : 0;
}

static int cuda_type(int ab)
{
    return ab == PTC_BF16 ? PTRT_CUDA_R_16BF : ab == PTC_F16 ? PTRT_CUDA_R_16F : PTRT_CUDA_R_32F;
}

/* a layout of rows x cols (ld), batched with stride (elements) */
static int layout(const ptrt_cublaslt *lt, void **l, int type, int64_t rows, int64_t cols,
                  int64_t ld, int64_t batch, int64_t stride)
{
    int rc = lt->cublasLtMatrixLayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, ld);
    if (rc == 0 && batch > 1) {
        int32_t b = (int32_t)batch;
        rc = lt->cublasLtMatrixLayoutSetAttribute(*l, PTRT_CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b,
                                                  sizeof b);
        if (rc == 0)
            rc = lt->cublasLtMatrixLayoutSetAttribute(
                *l, PTRT_CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    }
    return rc;
}

/* Descriptors are made for each call (a few microseconds against the GEMM); the algorithm is
 * cuBLASLt's own heuristic choice (algo NULL). */
static int real_gemm(void *handle, const ptrt_cuda_gemm *g, ptrt_cudev ws, size_t ws_bytes,
                     char *call, size_t calln)
{
    const ptrt_cublaslt *lt = ptrt_cuda_cublaslt_api();
    void *desc = NULL, *lx = NULL, *ly = NULL, *ld = NULL;
    int32_t ta = g->transa, tb = g->transb;
    int rc;
    const char *what = "cublasLtMatmulDescCreate";
    if ((rc = lt->cublasLtMatmulDescCreate(&desc, g->compute, PTRT_CUDA_R_32F)))
        goto out;
    what = "cublasLtMatmulDescSetAttribute";
    if ((rc = lt->cublasLtMatmulDescSetAttribute(desc, PTRT_CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                 sizeof ta)) ||
        (rc = lt->cublasLtMatmulDescSetAttribute(desc, PTRT_CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                 sizeof tb)))
        goto out;
    what = "cublasLtMatrixLayoutCreate";
    if ((rc = layout(lt, &lx, cuda_type(g->ab), g->x_rows, g->x_cols, g->ldx, g->batch, g->sx)) ||
        (rc = layout(lt, &ly, cuda_type(g->ab), g->y_rows, g->y_cols, g->ldy, g->batch, g->sy)) ||
        (rc = layout(lt, &ld, cuda_type(g->cd), g->m, g->n, g->ldd, g->batch, g->sd)))
        goto out;
    what = "cublasLtMatmul";
    rc = lt->cublasLtMatmul(handle, desc, &g->alpha, g->x, lx, g->y, ly, &g->beta, g->d, ld, g->d,
                            ld, NULL, (void *)(uintptr_t)ws, ws_bytes, NULL);
out:
    if (ld)
        lt->cublasLtMatrixLayoutDestroy(ld);
    if (ly)
        lt->cublasLtMatrixLayoutDestroy(ly);
    if (lx)
        lt->cublasLtMatrixLayoutDestroy(lx);
    if (desc)
        lt->cublasLtMatmulDescDestroy(desc);
    if (rc)
        ptc_fmt(call, calln, "%s (cuBLASLt status %d) of a %lld x %lld x %lld GEMM", what, rc,
                (long long)g->m, (long long)g->n, (long long)g->k);
    return rc;
}

static const ptrt_nccl *real_nccl(char *err, size_t errn)
{
    return ptrt_cuda_open(PTRT_CUDA_NCCL, err, errn) < 0 ? NULL : ptrt_cuda_nccl_api();
}

const ptrt_cuda_impl ptrt_cuda_real = {
    .what = "CUDA backend on the GPU",
    .device = "cuda",
    .emulated = false,
    .open = real_open,
    .compile = real_compile,
    .gemm_start = real_gemm_start,
    .gemm = real_gemm,
    .nccl = real_nccl,
};
