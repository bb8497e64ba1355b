/* cudalib.h - the CUDA libraries, opened with dlopen when first needed, so that one executable
 * runs on machines with and without a GPU: the driver (libcuda.so.1), NVRTC (the run-time
 * compiler of the generated kernels), cuBLASLt (GEMMs) and NCCL (collectives).
 *
 * Where they are looked for: the driver by its soname only (it belongs to the installed NVIDIA
 * driver; the toolkit's stubs/libcuda.so is a link-time stand-in that fails every call); the
 * others by soname (LD_LIBRARY_PATH, the system's paths), then in $CUDA_HOME/lib64 and
 * /usr/local/cuda/lib64, newest major version first. A missing library or symbol is an error
 * that names the library, what it is for and dlopen's reason.
 *
 * No CUDA header is needed to build this: the few types are declared here (handles as pointers,
 * results as int), as the driver API defines them.
 */
#ifndef PTRT_CUDALIB_H
#define PTRT_CUDALIB_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PTRT_CUDA_DRIVER,
    PTRT_CUDA_NVRTC,
    PTRT_CUDA_CUBLASLT,
    PTRT_CUDA_NCCL,
    PTRT_CUDA_NLIBS
} ptrt_cuda_lib;

typedef unsigned long long ptrt_cudev; /* CUdeviceptr */

/* CUDA_MEMCPY2D (cuda.h), device to device only: no arrays */
typedef struct ptrt_cuda_copy2d {
    size_t src_x, src_y;
    int src_type; /* CU_MEMORYTYPE_DEVICE: 2 */
    const void *src_host;
    ptrt_cudev src;
    void *src_array;
    size_t src_pitch;
    size_t dst_x, dst_y;
    int dst_type;
    void *dst_host;
    ptrt_cudev dst;
    void *dst_array;
    size_t dst_pitch;
    size_t width, height; /* bytes, rows */
} ptrt_cuda_copy2d;
enum { PTRT_CU_MEMORYTYPE_DEVICE = 2 };

typedef struct ptrt_cuda_driver {
    int (*cuInit)(unsigned flags);
    int (*cuDriverGetVersion)(int *version);
    int (*cuDeviceGetCount)(int *count);
    int (*cuDeviceGet)(int *device, int ordinal);
    int (*cuDeviceGetName)(char *name, int len, int device);
    int (*cuDeviceGetAttribute)(int *value, int attribute, int device);
    int (*cuGetErrorString)(int result, const char **str);
    /* the executor's (backend/cuda/cuda.c) */
    int (*cuDevicePrimaryCtxRetain)(void **ctx, int device);
    int (*cuCtxSetCurrent)(void *ctx);
    int (*cuMemAlloc)(ptrt_cudev *p, size_t n);    /* cuMemAlloc_v2 */
    int (*cuMemFree)(ptrt_cudev p);                /* cuMemFree_v2 */
    int (*cuMemcpyHtoD)(ptrt_cudev dst, const void *src, size_t n);
    int (*cuMemcpyDtoH)(void *dst, ptrt_cudev src, size_t n);
    int (*cuMemcpyDtoD)(ptrt_cudev dst, ptrt_cudev src, size_t n);
    int (*cuMemsetD8)(ptrt_cudev dst, unsigned char v, size_t n);
    int (*cuModuleLoadData)(void **module, const void *image);
    int (*cuModuleGetFunction)(void **fn, void *module, const char *name);
    int (*cuModuleUnload)(void *module);
    int (*cuLaunchKernel)(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                          void **extra);
    int (*cuCtxSynchronize)(void);
    int (*cuMemcpy2D)(const ptrt_cuda_copy2d *c); /* cuMemcpy2D_v2 */
    int (*cuDeviceGetPCIBusId)(char *id, int len, int device);
    /* streams and events (nccl_comm.c: collectives on a stream of their own, ordered with the
     * default stream's kernels by events) */
    int (*cuStreamCreate)(void **stream, unsigned flags);
    int (*cuStreamDestroy)(void *stream); /* cuStreamDestroy_v2 */
    int (*cuEventCreate)(void **event, unsigned flags);
    int (*cuEventDestroy)(void *event); /* cuEventDestroy_v2 */
    int (*cuEventRecord)(void *event, void *stream);
    int (*cuStreamWaitEvent)(void *stream, void *event, unsigned flags);
    int (*cuMemcpyDtoDAsync)(ptrt_cudev dst, ptrt_cudev src, size_t n, void *stream);
} ptrt_cuda_driver;
enum { PTRT_CU_STREAM_NON_BLOCKING = 1, PTRT_CU_EVENT_DISABLE_TIMING = 2 };


/* NCCL (nccl.h): communicators as pointers, enums as int */
typedef struct ptrt_nccl_id { /* ncclUniqueId, passed by value */
    char internal[128];
} ptrt_nccl_id;
typedef struct ptrt_nccl {
    int (*ncclGetVersion)(int *version);
    const char *(*ncclGetErrorString)(int result);
    int (*ncclGetUniqueId)(ptrt_nccl_id *id);
    int (*ncclCommInitRank)(void **comm, int nranks, ptrt_nccl_id id, int rank);
    int (*ncclCommDestroy)(void *comm);
    int (*ncclAllReduce)(const void *send, void *recv, size_t count, int dtype, int op, void *comm,
                         void *stream);
    int (*ncclAllGather)(const void *send, void *recv, size_t sendcount, int dtype, void *comm,
                         void *stream);
    int (*ncclReduceScatter)(const void *send, void *recv, size_t recvcount, int dtype, int op,
                             void *comm, void *stream);
    int (*ncclSend)(const void *send, size_t count, int dtype, int peer, void *comm,
                    void *stream);
    int (*ncclRecv)(void *recv, size_t count, int dtype, int peer, void *comm, void *stream);
    int (*ncclGroupStart)(void);
    int (*ncclGroupEnd)(void);
} ptrt_nccl;
enum {
    PTRT_NCCL_SUM = 0,
    PTRT_NCCL_MAX = 2,
    PTRT_NCCL_INT32 = 2,
    PTRT_NCCL_FLOAT16 = 6,
    PTRT_NCCL_FLOAT32 = 7,
    PTRT_NCCL_BFLOAT16 = 9
};

/* the driver's attribute numbers ptc asks for */
enum {
    PTRT_CU_ATTR_SMS = 16,      /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
    PTRT_CU_ATTR_CC_MAJOR = 75, /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
    PTRT_CU_ATTR_CC_MINOR = 76
};

/* cuBLASLt, the calls of one GEMM (handles as pointers, enums as int, as in cublasLt.h) */
typedef struct ptrt_cublaslt {
    size_t (*cublasLtGetVersion)(void);
    int (*cublasLtCreate)(void **handle);
    int (*cublasLtMatmulDescCreate)(void **desc, int compute_type, int scale_type);
    int (*cublasLtMatmulDescDestroy)(void *desc);
    int (*cublasLtMatmulDescSetAttribute)(void *desc, int attr, const void *buf, size_t n);
    int (*cublasLtMatrixLayoutCreate)(void **layout, int type, uint64_t rows, uint64_t cols,
                                      int64_t ld);
    int (*cublasLtMatrixLayoutDestroy)(void *layout);
    int (*cublasLtMatrixLayoutSetAttribute)(void *layout, int attr, const void *buf, size_t n);
    int (*cublasLtMatmul)(void *handle, void *desc, const void *alpha, const void *a,
                          void *adesc, const void *b, void *bdesc, const void *beta,
                          const void *c, void *cdesc, void *d, void *ddesc, const void *algo,
                          void *workspace, size_t workspace_bytes, void *stream);
} ptrt_cublaslt;

/* cublasLt.h's numbers */
enum {
    PTRT_CUBLAS_OP_N = 0,
    PTRT_CUBLAS_OP_T = 1,
    PTRT_CUBLAS_COMPUTE_32F = 68,
    PTRT_CUBLAS_COMPUTE_32F_FAST_16BF = 75, /* f32 operands may be rounded to bf16 */
    PTRT_CUBLAS_COMPUTE_32F_FAST_TF32 = 77, /* ... to TF32 (10 significand bits stored) */
    PTRT_CUDA_R_32F = 0,
    PTRT_CUDA_R_16F = 2,
    PTRT_CUDA_R_16BF = 14,
    PTRT_CUBLASLT_MATMUL_DESC_TRANSA = 3,
    PTRT_CUBLASLT_MATMUL_DESC_TRANSB = 4,
    PTRT_CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
    PTRT_CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6
};

typedef struct ptrt_nvrtc {
    int (*nvrtcVersion)(int *major, int *minor);
    const char *(*nvrtcGetErrorString)(int result);
    int (*nvrtcCreateProgram)(void **prog, const char *src, const char *name, int nheaders,
                              const char *const *headers, const char *const *include_names);
    int (*nvrtcCompileProgram)(void *prog, int nopts, const char *const *opts);
    int (*nvrtcGetProgramLogSize)(void *prog, size_t *size);
    int (*nvrtcGetProgramLog)(void *prog, char *log);
    int (*nvrtcGetPTXSize)(void *prog, size_t *size);
    int (*nvrtcGetPTX)(void *prog, char *ptx);
    int (*nvrtcDestroyProgram)(void **prog);
} ptrt_nvrtc;

/* The name a library goes by in messages ("the CUDA driver (libcuda.so.1)"). */
const char *ptrt_cuda_lib_name(ptrt_cuda_lib lib);

/* Opens lib and resolves its functions, once per process (thread-safe; a failure is remembered
 * and reported again). Returns 0, or -1 with a message naming the library. */
int ptrt_cuda_open(ptrt_cuda_lib lib, char *err, size_t errn);

/* The resolved functions; valid after ptrt_cuda_open of their library returned 0. */
const ptrt_cuda_driver *ptrt_cuda_driver_api(void);
const ptrt_nvrtc *ptrt_cuda_nvrtc_api(void);
const ptrt_cublaslt *ptrt_cuda_cublaslt_api(void);
const ptrt_nccl *ptrt_cuda_nccl_api(void);

/* The version the library reports ("NVRTC 13.0", "cuBLASLt 130000", "NCCL 2.27.3", "driver
 * 13.0"), after a successful open. */
void ptrt_cuda_lib_version(ptrt_cuda_lib lib, char *buf, size_t n);

/* What --device cuda finds: -1 with a message naming the first missing piece (the driver, a
 * device, NVRTC, cuBLASLt, NCCL), or 0 with the devices and versions found in err. */
int ptrt_cuda_probe(char *err, size_t errn);

/* For tests: look for the libraries other than the driver only in dirs (colon-separated; ""
 * searches nowhere), and forget what was opened. NULL restores the default search. */
void ptrt_cuda_set_search_path(const char *dirs);

/* CUDA C source -> PTX for sm (80, 90) through NVRTC, cached on disk under cache_dir (NULL: the
 * default, $XDG_CACHE_HOME/ptc/cuda; "": no cache) by a key of the source's hash, the
 * architecture, NVRTC's version and the options it is given. Returns the PTX (malloc'd,
 * NUL-terminated), or NULL with NVRTC's error and log. *cached tells whether it came from the
 * cache. */
char *ptrt_nvrtc_compile(const char *src, const char *name, int sm, const char *cache_dir,
                         int *cached, char *err, size_t errn);

#endif
