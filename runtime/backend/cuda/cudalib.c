/* cudalib.c - dlopen of the CUDA libraries and NVRTC compiles with a disk cache (cudalib.h). */
#include "cudalib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"
#include "util.h"

/* one check per foreign call: the call, its code and NVRTC's words for it */
#define NVRTC_CHECK(call)                                                                          \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            ptc_fmt(err, errn, "%s failed: %s (%d)", #call, nv.nvrtcGetErrorString(rc_), rc_);     \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

typedef struct libdesc {
    const char *what;          /* for messages */
    const char *sonames[5];    /* newest first; NULL-terminated */
    const char *const *syms;   /* NULL-terminated */
    bool driver;               /* by soname only */
} libdesc;

/* in the order of the structures' members */
static const char *const driver_syms[] = {
    "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
    "cuDeviceGetAttribute", "cuGetErrorString", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2",
    "cuMemsetD8_v2", "cuModuleLoadData", "cuModuleGetFunction", "cuModuleUnload",
    "cuLaunchKernel", "cuCtxSynchronize", "cuMemcpy2D_v2", "cuDeviceGetPCIBusId",
    "cuStreamCreate", "cuStreamDestroy_v2", "cuEventCreate", "cuEventDestroy_v2", "cuEventRecord",
    "cuStreamWaitEvent", "cuMemcpyDtoDAsync_v2", NULL};
static const char *const nvrtc_syms[] = {
    "nvrtcVersion", "nvrtcGetErrorString", "nvrtcCreateProgram", "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcGetPTXSize", "nvrtcGetPTX",
    "nvrtcDestroyProgram", NULL};
static const char *const cublaslt_syms[] = {
    "cublasLtGetVersion", "cublasLtCreate", "cublasLtMatmulDescCreate",
    "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate",
    "cublasLtMatrixLayoutDestroy", "cublasLtMatrixLayoutSetAttribute", "cublasLtMatmul", NULL};
static const char *const nccl_syms[] = {
    "ncclGetVersion", "ncclGetErrorString", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy",
    "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclSend", "ncclRecv",
    "ncclGroupStart", "ncclGroupEnd", NULL};

/* each table has one function per name, in order */
#define NSYMS(a) (sizeof(a) / sizeof((a)[0]) - 1)
_Static_assert(NSYMS(driver_syms) * sizeof(void (*)(void)) == sizeof(ptrt_cuda_driver),
               "driver_syms and ptrt_cuda_driver differ");
_Static_assert(NSYMS(nvrtc_syms) * sizeof(void (*)(void)) == sizeof(ptrt_nvrtc),
               "nvrtc_syms and ptrt_nvrtc differ");
_Static_assert(NSYMS(cublaslt_syms) * sizeof(void (*)(void)) == sizeof(ptrt_cublaslt),
               "cublaslt_syms and ptrt_cublaslt differ");
_Static_assert(NSYMS(nccl_syms) * sizeof(void (*)(void)) == sizeof(ptrt_nccl),
               "nccl_syms and ptrt_nccl differ");

static const libdesc libs[PTRT_CUDA_NLIBS] = {
    [PTRT_CUDA_DRIVER] = {"the CUDA driver", {"libcuda.so.1"}, driver_syms, true},
    [PTRT_CUDA_NVRTC] = {"NVRTC, the CUDA run-time compiler",
                         {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}, nvrtc_syms, false},
    [PTRT_CUDA_CUBLASLT] = {"cuBLASLt",
                            {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
                            cublaslt_syms, false},
    [PTRT_CUDA_NCCL] = {"NCCL", {"libnccl.so.2", "libnccl.so"}, nccl_syms, false},
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int state; /* 0 not tried, 1 open, -1 failed */
    char msg[768];
    void *fn[32];
    const char *soname;
} st[PTRT_CUDA_NLIBS];
static char *search; /* NULL: the default search */
static ptrt_cuda_driver drv;
static ptrt_nvrtc nv;
static ptrt_cublaslt lt;
static ptrt_nccl nccl;

const char *ptrt_cuda_lib_name(ptrt_cuda_lib lib)
{
    static char names[PTRT_CUDA_NLIBS][96];
    snprintf(names[lib], sizeof names[lib], "%s (%s)", libs[lib].what, libs[lib].sonames[0]);
    return names[lib];
}

void ptrt_cuda_set_search_path(const char *dirs)
{
    pthread_mutex_lock(&lock);
    free(search);
    search = dirs ? ptc_xstrdup(dirs) : NULL;
    memset(st, 0, sizeof st);
    pthread_mutex_unlock(&lock);
}

/* dlopen of soname in the search directories (or by soname and in the toolkit's directories) */
static void *open_in(const libdesc *d, const char *soname, char *why, size_t whyn)
{
    void *h = NULL;
    const char *e;
    if (d->driver || !search) {
        if ((h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)))
            return h;
        e = dlerror();
        snprintf(why, whyn, "%s", e ? e : "not found");
        if (d->driver)
            return NULL;
    }
    char dirs[2048];
    const char *home = getenv("CUDA_HOME");
    if (search)
        snprintf(dirs, sizeof dirs, "%s", search);
    else
        snprintf(dirs, sizeof dirs, "%s%s%s/usr/local/cuda/lib64", home && *home ? home : "",
                 home && *home ? "/lib64" : "", home && *home ? ":" : "");
    for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, soname);
        if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
            return h;
    }
    if (search)
        snprintf(why, whyn, "not in %s", *search ? search : "(no directory)");
    return NULL;
}

static int open_locked(ptrt_cuda_lib lib)
{
    const libdesc *d = &libs[lib];
    char why[512] = "not found";
    void *h = NULL;
    for (int i = 0; !h && d->sonames[i]; i++)
        if ((h = open_in(d, d->sonames[i], why, sizeof why)))
            st[lib].soname = d->sonames[i];
    if (!h) {
        snprintf(st[lib].msg, sizeof st[lib].msg, "%s was not found (%s)%s",
                 ptrt_cuda_lib_name(lib), why,
                 d->driver ? ": this machine has no NVIDIA driver, or it is not on the library "
                             "path"
                           : "; install the CUDA toolkit or set CUDA_HOME");
        return -1;
    }
    for (int i = 0; d->syms[i]; i++) {
        PTC_ASSERT(i < 32);
        if (!(st[lib].fn[i] = dlsym(h, d->syms[i]))) {
            snprintf(st[lib].msg, sizeof st[lib].msg, "%s (%s) has no function %s",
                     d->what, st[lib].soname, d->syms[i]);
            dlclose(h);
            return -1;
        }
    }
    /* function pointers from dlsym's object pointers (POSIX guarantees the conversion) */
    if (lib == PTRT_CUDA_DRIVER)
        memcpy(&drv, st[lib].fn, sizeof drv);
    else if (lib == PTRT_CUDA_NVRTC)
        memcpy(&nv, st[lib].fn, sizeof nv);
    else if (lib == PTRT_CUDA_CUBLASLT)
        memcpy(&lt, st[lib].fn, sizeof lt);
    else if (lib == PTRT_CUDA_NCCL)
        memcpy(&nccl, st[lib].fn, sizeof nccl);
    return 0;
}

int ptrt_cuda_open(ptrt_cuda_lib lib, char *err, size_t errn)
{
    pthread_mutex_lock(&lock);
    if (st[lib].state == 0)
        st[lib].state = open_locked(lib) == 0 ? 1 : -1;
    int rc = st[lib].state > 0 ? 0 : -1;
    if (rc)
        ptc_fmt(err, errn, "%s", st[lib].msg);
    pthread_mutex_unlock(&lock);
    return rc;
}

const ptrt_cuda_driver *ptrt_cuda_driver_api(void)
{
    return &drv;
}

const ptrt_nvrtc *ptrt_cuda_nvrtc_api(void)
{
    return &nv;
}

const ptrt_cublaslt *ptrt_cuda_cublaslt_api(void)
{
    return &lt;
}

const ptrt_nccl *ptrt_cuda_nccl_api(void)
{
    return &nccl;
}

void ptrt_cuda_lib_version(ptrt_cuda_lib lib, char *buf, size_t n)
{
    int a = 0, b = 0;
    switch (lib) {
    case PTRT_CUDA_DRIVER:
        drv.cuDriverGetVersion(&a);
        snprintf(buf, n, "driver %d.%d", a / 1000, a % 1000 / 10);
        break;
    case PTRT_CUDA_NVRTC:
        nv.nvrtcVersion(&a, &b);
        snprintf(buf, n, "NVRTC %d.%d", a, b);
        break;
    case PTRT_CUDA_CUBLASLT: {
        size_t (*version)(void);
        memcpy(&version, &st[lib].fn[0], sizeof version);
        size_t v = version();
        snprintf(buf, n, "cuBLASLt %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
        break;
    }
    default: {
        int (*version)(int *);
        memcpy(&version, &st[lib].fn[0], sizeof version);
        version(&a);
        snprintf(buf, n, "NCCL %d.%d.%d", a / 10000, a / 100 % 100, a % 100);
        break;
    }
    }
}

/* ---- NVRTC ---- */

/* NVRTC's options after the architecture (the disk cache's key hashes them too).
 * --device-int128: the moe routing kernels' capacity is an exact ceiling in 128-bit integers
 * (cuda_moe.c), which NVRTC on Linux takes only with it. */
static const char *const nvrtc_opts[] = {"--std=c++17", "--restrict", "--device-int128"};
#define NVRTC_NOPTS ((int)(sizeof nvrtc_opts / sizeof nvrtc_opts[0]))

static char *compile(const char *src, const char *name, int sm, char *err, size_t errn)
{
    void *prog = NULL;
    char *ptx = NULL, *log = NULL;
    char arch[40];
    snprintf(arch, sizeof arch, "--gpu-architecture=compute_%d", sm);
    const char *opts[NVRTC_NOPTS + 1] = {arch};
    for (int i = 0; i < NVRTC_NOPTS; i++)
        opts[i + 1] = nvrtc_opts[i];
    NVRTC_CHECK(nv.nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL));
    int rc = nv.nvrtcCompileProgram(prog, NVRTC_NOPTS + 1, opts);
    if (rc != 0) {
        size_t n = 0;
        nv.nvrtcGetProgramLogSize(prog, &n);
        log = ptc_xmalloc(n + 1);
        log[0] = 0;
        nv.nvrtcGetProgramLog(prog, log);
        log[n] = 0;
        ptc_fmt(err, errn, "nvrtcCompileProgram(%s, sm_%d) failed: %s (%d): %s", name, sm,
                nv.nvrtcGetErrorString(rc), rc, log);
        goto fail;
    }
    size_t n = 0;
    NVRTC_CHECK(nv.nvrtcGetPTXSize(prog, &n));
    ptx = ptc_xmalloc(n + 1);
    NVRTC_CHECK(nv.nvrtcGetPTX(prog, ptx));
    ptx[n] = 0;
    nv.nvrtcDestroyProgram(&prog);
    return ptx;
fail:
    free(log);
    free(ptx);
    if (prog)
        nv.nvrtcDestroyProgram(&prog);
    return NULL;
}

char *ptrt_nvrtc_compile(const char *src, const char *name, int sm, const char *cache_dir,
                         int *cached, char *err, size_t errn)
{
    *cached = 0;
    if (ptrt_cuda_open(PTRT_CUDA_NVRTC, err, errn))
        return NULL;
    int major = 0, minor = 0;
    nv.nvrtcVersion(&major, &minor);
    ptc_hash64_state h;
    ptc_hash64_init(&h, 0x6e7672746370ull);
    ptc_hash64_update(&h, src, strlen(src));
    int key[3] = {sm, major, minor};
    ptc_hash64_update(&h, key, sizeof key);
    for (int i = 0; i < NVRTC_NOPTS; i++) /* with its NUL: "a", "bc" is not "ab", "c" */
        ptc_hash64_update(&h, nvrtc_opts[i], strlen(nvrtc_opts[i]) + 1);
    char buf[4096], *dir = NULL, path[4200] = "";
    if (!cache_dir)
        dir = ptc_file_cache_dir("cuda", buf, sizeof buf);
    else if (*cache_dir && strlen(cache_dir) < sizeof buf)
        dir = ptc_file_mkdirs(strcpy(buf, cache_dir)) ? buf : NULL;
    if (dir) {
        snprintf(path, sizeof path, "%s/%016llx.ptx", dir,
                 (unsigned long long)ptc_hash64_final(&h));
        size_t len;
        char rerr[256];
        char *ptx = ptc_file_read_all(path, (size_t)1 << 30, &len, rerr, sizeof rerr);
        if (ptx && len > 0 && strstr(ptx, ".target")) {
            *cached = 1;
            return ptx;
        }
        free(ptx);
    }
    char *ptx = compile(src, name, sm, err, errn);
    if (ptx && *path) { /* a cache that cannot be written only costs the next start a compile */
        char werr[256];
        ptc_file_write_file(path, ptx, strlen(ptx), werr, sizeof werr);
    }
    return ptx;
}

int ptrt_cuda_probe(char *err, size_t errn)
{
    char e[768];
    if (ptrt_cuda_open(PTRT_CUDA_DRIVER, e, sizeof e)) {
        ptc_fmt(err, errn, "--device cuda: %s", e);
        return -1;
    }
    const char *what = NULL;
    int rc = drv.cuInit(0), count = 0;
    if (rc == 0)
        rc = drv.cuDeviceGetCount(&count);
    if (rc != 0 || count == 0) {
        if (rc == 0 || drv.cuGetErrorString(rc, &what) != 0)
            what = rc == 0 ? "no device" : "unknown error";
        ptc_fmt(err, errn, "--device cuda: the CUDA driver (libcuda.so.1) found no usable GPU: %s",
                what);
        return -1;
    }
    char found[1024], v[64];
    ptrt_cuda_lib_version(PTRT_CUDA_DRIVER, v, sizeof v);
    int k = snprintf(found, sizeof found, "%s", v);
    for (int i = 0; i < count && k < (int)sizeof found - 200; i++) {
        int dev = 0, major = 0, minor = 0;
        char name[128] = "?";
        drv.cuDeviceGet(&dev, i);
        drv.cuDeviceGetName(name, (int)sizeof name, dev);
        drv.cuDeviceGetAttribute(&major, 75, dev); /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
        drv.cuDeviceGetAttribute(&minor, 76, dev);
        k += snprintf(found + k, sizeof found - (size_t)k, ", GPU %d %s (sm_%d%d)", i, name, major,
                      minor);
    }
    for (int lib = PTRT_CUDA_NVRTC; lib < PTRT_CUDA_NLIBS; lib++) {
        if (ptrt_cuda_open((ptrt_cuda_lib)lib, e, sizeof e)) {
            if (lib == PTRT_CUDA_NCCL) { /* only plans of several GPUs need it */
                k += snprintf(found + k, sizeof found - (size_t)k, ", no NCCL");
                continue;
            }
            ptc_fmt(err, errn, "--device cuda: %s", e);
            return -1;
        }
        ptrt_cuda_lib_version((ptrt_cuda_lib)lib, v, sizeof v);
        k += snprintf(found + k, sizeof found - (size_t)k, ", %s", v);
    }
    ptc_fmt(err, errn, "%s", found);
    return 0;
}
