/* cuda_emulated.c - the CUDA backend's host emulation (--device cuda-emulated): the driver calls
 * the backend makes, implemented over host memory, so that the backend itself (arenas, the
 * plan's unit, every launch with its parameters, the GEMMs' column-major description, copies,
 * syncs) runs and is compared with the CPU on a machine without a GPU.
 *
 *   GPUs      $PTC_CUDA_EMULATED_GPUS of them (1 to 16, default 1), each with its context; a
 *             thread's calls go to its current context's GPU.
 *   memory    device addresses are host addresses with bit 56 set (non-canonical: host code
 *             that dereferences one faults at once, as it would with a GPU's memory) and the
 *             GPU's number in bits 48 to 55. A launch or GEMM given another GPU's memory, or a
 *             function of another context's module, fails as the driver would. New allocations
 *             hold NaN bytes (0xff), as a GPU's hold whatever was there: a kernel that reads
 *             before it writes shows.
 *   kernels   the unit is compiled by the host C compiler ($CC, else cc) with cuda_emu.h (built
 *             into this library) into a shared object; the "image" cuModuleLoadData takes names
 *             it. A launch runs the kernel's __emu entry with blocks one after another and each
 *             block's threads as fibers (cuda_emu.h), at most 4 blocks: every generated kernel
 *             strides over its grid, so fewer blocks compute the same (and test the striding).
 *             Blocks have the launch's size (in an ASan build too: the unit, not itself
 *             instrumented, announces its fibers' stack switches to the process's ASan). One
 *             launch at a time.
 *   GEMMs     computed from the column-major description cuBLASLt would get (ptrt_cuda_gemm),
 *             in double, so the row-major to column-major mapping is what is tested.
 *   streams   the default stream runs every call at once; a stream of its own (NCCL's calls,
 *             bucket copies) runs only when the default stream waits for its events or the
 *             thread that queued on it synchronizes the context, so a missing wait shows in
 *             the results.
 *   NCCL      over the job's host communicator (threads or MPI processes): see below.
 */
#define _GNU_SOURCE /* mkdtemp */
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cuda_internal.h"
#include "file.h"
#include "half.h"
#include "util.h"

extern const char ptrt_cuda_emu_header[]; /* cuda_emu.h (generated at build time) */

#define TAG ((uint64_t)1 << 56)
#define GPU_SHIFT 48 /* a device address: TAG | gpu << 48 | host address (below 2^47) */
#define MAX_GPUS 16
#define IMAGE_PREFIX "ptc-emulated-module:"
#define MAX_BLOCKS 4
#define MAX_THREADS 1024
#if defined(__SANITIZE_ADDRESS__)
#define EMU_FLAGS " -DPTC_CUDA_EMU_ASAN" /* (cuda_emu.h: its fibers' switches announced) */
#else
#define EMU_FLAGS ""
#endif

enum { E_OK = 0, E_INVALID_VALUE = 1, E_OUT_OF_MEMORY = 2, E_INVALID_IMAGE = 200,
       E_INVALID_CONTEXT = 201, E_INVALID_HANDLE = 400, E_NOT_FOUND = 500,
       E_LAUNCH_FAILED = 719 };

void *ptrt_cuda_emu_host(ptrt_cudev p)
{
    return p >= TAG ? (void *)(uintptr_t)(p & (((uint64_t)1 << GPU_SHIFT) - 1)) : NULL;
}

static int gpu_of(ptrt_cudev p)
{
    return (int)((p >> GPU_SHIFT) & 0xff);
}

/* the emulated GPUs: $PTC_CUDA_EMULATED_GPUS (1 to 16; default 1), a context each; a thread's
 * current context */
static int ngpus(void)
{
    const char *e = getenv("PTC_CUDA_EMULATED_GPUS");
    int n = e && *e ? atoi(e) : 1;
    return n < 1 ? 1 : n > MAX_GPUS ? MAX_GPUS : n;
}

static int contexts[MAX_GPUS];
static _Thread_local int current_gpu = -1;

static int e_init(unsigned flags)
{
    (void)flags;
    return E_OK;
}

static int e_version(int *v)
{
    *v = 13000;
    return E_OK;
}

static int e_count(int *c)
{
    *c = ngpus();
    return E_OK;
}

static int e_get(int *d, int ordinal)
{
    *d = ordinal;
    return ordinal >= 0 && ordinal < ngpus() ? E_OK : E_INVALID_VALUE;
}

static int e_name(char *name, int len, int dev)
{
    (void)dev;
    snprintf(name, (size_t)len, "host emulation of an sm_90 GPU");
    return E_OK;
}

static int e_bus_id(char *id, int len, int dev)
{
    snprintf(id, (size_t)len, "0000:%02x:00.0", dev + 1);
    return E_OK;
}

static int e_attr(int *v, int attr, int dev)
{
    (void)dev;
    *v = attr == PTRT_CU_ATTR_SMS ? 132 : attr == PTRT_CU_ATTR_CC_MAJOR ? 9 : 0;
    return E_OK;
}

static int e_errstr(int rc, const char **s)
{
    *s = rc == E_INVALID_VALUE    ? "invalid argument"
         : rc == E_OUT_OF_MEMORY  ? "out of memory"
         : rc == E_INVALID_IMAGE  ? "device kernel image is invalid"
         : rc == E_INVALID_CONTEXT ? "invalid device context"
         : rc == E_INVALID_HANDLE ? "invalid resource handle"
         : rc == E_NOT_FOUND      ? "named symbol not found"
         : rc == E_LAUNCH_FAILED  ? "unspecified launch failure"
                                  : "unknown error";
    return E_OK;
}

static int e_retain(void **ctx, int dev)
{
    if (dev < 0 || dev >= ngpus())
        return E_INVALID_VALUE;
    *ctx = &contexts[dev];
    return E_OK;
}

static int e_set_current(void *ctx)
{
    int *c = ctx;
    if (!c || c < contexts || c >= contexts + MAX_GPUS)
        return E_INVALID_VALUE;
    current_gpu = (int)(c - contexts);
    return E_OK;
}

/* The live allocations' host addresses: a device address does not look like a pointer to its
 * block, so without this list a leak checker would call every live allocation lost. */
static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static void **live;
static int nlive, caplive;

static int e_alloc(ptrt_cudev *p, size_t n)
{
    if (current_gpu < 0)
        return E_INVALID_CONTEXT;
    size_t m = (n + 255) & ~(size_t)255;
    void *h = aligned_alloc(256, m ? m : 256);
    if (!h)
        return E_OUT_OF_MEMORY;
    memset(h, 0xff, m);
    pthread_mutex_lock(&alloc_lock);
    PTC_GROW(live, caplive, nlive);
    live[nlive++] = h;
    pthread_mutex_unlock(&alloc_lock);
    *p = (ptrt_cudev)(uintptr_t)h | TAG | (ptrt_cudev)current_gpu << GPU_SHIFT;
    return E_OK;
}

static int e_free(ptrt_cudev p)
{
    if (p && p < TAG)
        return E_INVALID_VALUE;
    void *h = ptrt_cuda_emu_host(p);
    pthread_mutex_lock(&alloc_lock);
    int i = 0;
    while (i < nlive && live[i] != h)
        i++;
    bool found = i < nlive;
    if (found)
        live[i] = live[--nlive];
    pthread_mutex_unlock(&alloc_lock);
    if (!h)
        return E_OK;
    if (!found) /* not an allocation of this driver, or freed twice */
        return E_INVALID_VALUE;
    free(h);
    return E_OK;
}

static int e_h2d(ptrt_cudev dst, const void *src, size_t n)
{
    if (dst < TAG)
        return E_INVALID_VALUE;
    memcpy(ptrt_cuda_emu_host(dst), src, n);
    return E_OK;
}

static int e_d2h(void *dst, ptrt_cudev src, size_t n)
{
    if (src < TAG)
        return E_INVALID_VALUE;
    memcpy(dst, ptrt_cuda_emu_host(src), n);
    return E_OK;
}

static int e_d2d(ptrt_cudev dst, ptrt_cudev src, size_t n)
{
    if (dst < TAG || src < TAG)
        return E_INVALID_VALUE;
    memmove(ptrt_cuda_emu_host(dst), ptrt_cuda_emu_host(src), n);
    return E_OK;
}

static int e_memset(ptrt_cudev dst, unsigned char v, size_t n)
{
    if (dst < TAG)
        return E_INVALID_VALUE;
    memset(ptrt_cuda_emu_host(dst), v, n);
    return E_OK;
}

typedef int (*launch_fn)(void (*)(void *const *), void *const *, unsigned, unsigned);

typedef struct efn {
    void (*fn)(void *const *);
    launch_fn launch;
    const char *(*error)(void); /* why the module's last launch failed */
    int gpu;                    /* its module's */
    char name[128];
} efn;

typedef struct emodule {
    void *so;
    efn **fns;
    int n, cap;
    int gpu; /* the context it was loaded in */
} emodule;

static int e_load(void **module, const void *image)
{
    const char *s = image;
    if (strncmp(s, IMAGE_PREFIX, strlen(IMAGE_PREFIX)) != 0)
        return E_INVALID_IMAGE;
    void *so = dlopen(s + strlen(IMAGE_PREFIX), RTLD_NOW | RTLD_LOCAL);
    if (!so)
        return E_INVALID_IMAGE;
    if (current_gpu < 0) {
        dlclose(so);
        return E_INVALID_CONTEXT;
    }
    emodule *m = ptc_xcalloc(1, sizeof *m);
    m->so = so;
    m->gpu = current_gpu;
    *module = m;
    return E_OK;
}

static int e_function(void **fn, void *module, const char *name)
{
    emodule *m = module;
    char sym[512];
    snprintf(sym, sizeof sym, "%s__emu", name);
    void *p = dlsym(m->so, sym), *l = dlsym(m->so, "ptc_cuda_emu_launch"),
         *er = dlsym(m->so, "ptc_cuda_emu_error");
    if (!p || !l || !er)
        return E_NOT_FOUND;
    efn *f = ptc_xmalloc(sizeof *f);
    memcpy(&f->fn, &p, sizeof p);
    memcpy(&f->launch, &l, sizeof l);
    memcpy(&f->error, &er, sizeof er);
    f->gpu = m->gpu;
    ptc_fmt(f->name, sizeof f->name, "%s", name);
    PTC_GROW(m->fns, m->cap, m->n);
    m->fns[m->n++] = f;
    *fn = f;
    return E_OK;
}

static int e_unload(void *module)
{
    emodule *m = module;
    for (int i = 0; i < m->n; i++)
        free(m->fns[i]);
    free(m->fns);
    dlclose(m->so);
    free(m);
    return E_OK;
}

static pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;

static int e_launch(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                    unsigned bz, unsigned smem, void *stream, void **params, void **extra)
{
    (void)smem, (void)stream, (void)extra;
    if (!fn || gy != 1 || gz != 1 || by != 1 || bz != 1 || gx == 0)
        return E_INVALID_VALUE;
    efn *f = fn;
    if (f->gpu != current_gpu) /* a function of another context's module */
        return E_INVALID_HANDLE;
    int n = 0;
    while (params[n])
        n++;
    void **args = ptc_xmalloc(sizeof(void *) * (size_t)(n + 1));
    for (int k = 0; k < n; k++) {
        ptrt_cudev p;
        memcpy(&p, params[k], sizeof p);
        /* every parameter of a generated kernel is an address on the launching GPU */
        if (p < TAG || gpu_of(p) != current_gpu) {
            free(args);
            return E_INVALID_VALUE;
        }
        args[k] = ptrt_cuda_emu_host(p);
    }
    pthread_mutex_lock(&launch_lock);
    int rc = f->launch(f->fn, args, gx < MAX_BLOCKS ? gx : MAX_BLOCKS,
                       bx < MAX_THREADS ? bx : MAX_THREADS);
    if (rc) /* the driver says only "launch failed": the emulation says why */
        fprintf(stderr, "ptc: cuda-emulated: kernel %s (GPU %d): %s\n", f->name, f->gpu,
                f->error());
    pthread_mutex_unlock(&launch_lock);
    free(args);
    return rc ? E_LAUNCH_FAILED : E_OK;
}

static int flush_gpu(void);

static int e_sync(void)
{
    return flush_gpu();
}

static int e_memcpy2d(const ptrt_cuda_copy2d *c)
{
    if (c->src_type != PTRT_CU_MEMORYTYPE_DEVICE || c->dst_type != PTRT_CU_MEMORYTYPE_DEVICE ||
        c->src < TAG || c->dst < TAG || c->width > c->src_pitch || c->width > c->dst_pitch)
        return E_INVALID_VALUE;
    const char *src = (const char *)ptrt_cuda_emu_host(c->src) + c->src_y * c->src_pitch + c->src_x;
    char *dst = (char *)ptrt_cuda_emu_host(c->dst) + c->dst_y * c->dst_pitch + c->dst_x;
    for (size_t r = 0; r < c->height; r++)
        memmove(dst + r * c->dst_pitch, src + r * c->src_pitch, c->width);
    return E_OK;
}

/* (streams and events: with NCCL's emulation below) */
static int e_stream_create(void **stream, unsigned flags);
static int e_stream_destroy(void *stream);
static int e_event_create(void **event, unsigned flags);
static int e_event_destroy(void *event);
static int e_event_record(void *event, void *stream);
static int e_stream_wait_event(void *stream, void *event, unsigned flags);
static int e_copy_async(ptrt_cudev dst, ptrt_cudev src, size_t n, void *stream);

static const ptrt_cuda_driver emulated_driver = {
    .cuInit = e_init,
    .cuDriverGetVersion = e_version,
    .cuDeviceGetCount = e_count,
    .cuDeviceGet = e_get,
    .cuDeviceGetName = e_name,
    .cuDeviceGetAttribute = e_attr,
    .cuGetErrorString = e_errstr,
    .cuDevicePrimaryCtxRetain = e_retain,
    .cuCtxSetCurrent = e_set_current,
    .cuMemAlloc = e_alloc,
    .cuMemFree = e_free,
    .cuMemcpyHtoD = e_h2d,
    .cuMemcpyDtoH = e_d2h,
    .cuMemcpyDtoD = e_d2d,
    .cuMemsetD8 = e_memset,
    .cuModuleLoadData = e_load,
    .cuModuleGetFunction = e_function,
    .cuModuleUnload = e_unload,
    .cuLaunchKernel = e_launch,
    .cuCtxSynchronize = e_sync,
    .cuMemcpy2D = e_memcpy2d,
    .cuDeviceGetPCIBusId = e_bus_id,
    .cuStreamCreate = e_stream_create,
    .cuStreamDestroy = e_stream_destroy,
    .cuEventCreate = e_event_create,
    .cuEventDestroy = e_event_destroy,
    .cuEventRecord = e_event_record,
    .cuStreamWaitEvent = e_stream_wait_event,
    .cuMemcpyDtoDAsync = e_copy_async,
};

/* ---- NCCL, emulated: communicators whose calls move bytes over the job's host communicator
 * (the transport: in-process among threads, MPI among processes, handed over by nccl_comm.c),
 * with the global ranks of their members; the calls take device addresses. ncclGetUniqueId
 * makes a random key; ncclCommInitRank learns its group by a gather of every rank's (key,
 * communicator rank) over the transport, so every rank of the job joins the same number of
 * communicators in the same order (as ptc does: one per set of mesh axes), each from its own
 * thread, bound to its rank. Sends are buffered (NCCL's are not: nccl_comm.c never relies on
 * it, sending point-to-point through the host). ---- */

typedef struct ecomm {
    int *members; /* global ranks, in communicator rank order */
    int n, me;    /* size, this member's communicator rank */
} ecomm;

static ptrt_comm *transport;

static void e_transport(ptrt_comm *host)
{
    transport = host;
}

enum { N_OK = 0, N_INTERNAL = 3, N_INVALID_ARGUMENT = 4, N_INVALID_USAGE = 5 };

static const char *n_error(int rc)
{
    return rc == N_OK                 ? "no error"
           : rc == N_INVALID_ARGUMENT ? "invalid argument (emulated NCCL)"
           : rc == N_INVALID_USAGE    ? "invalid usage (emulated NCCL)"
                                      : "internal error (emulated NCCL)";
}

static int n_version(int *v)
{
    *v = 22700;
    return N_OK;
}

#define ID_MAGIC "ptc emulated nccl"

static int n_unique_id(ptrt_nccl_id *id)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t counter;
    pthread_mutex_lock(&lock);
    uint64_t k = ++counter;
    pthread_mutex_unlock(&lock);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC);
    /* unique in the job: this process's id and a count */
    uint64_t key = (uint64_t)getpid() << 32 ^ k;
    char host[32] = "";
    gethostname(host, sizeof host - 1);
    memcpy(id->internal + 32, &key, sizeof key);
    memcpy(id->internal + 40, host, sizeof host);
    return N_OK;
}

static int n_init_rank(void **comm, int n, ptrt_nccl_id id, int rank)
{
    int g = ptrt_cuda_bound_rank();
    if (!transport || g < 0 || n < 1 || rank < 0 || rank >= n ||
        memcmp(id.internal, ID_MAGIC, sizeof ID_MAGIC) != 0)
        return N_INVALID_USAGE;
    int N = transport->nranks;
    /* (key: the id's 8 key bytes and 32 host bytes, as 10 words; then n and rank) */
    int32_t mine[12], *all = ptc_xmalloc(sizeof mine * (size_t)N);
    int *world = ptc_xmalloc(sizeof(int) * (size_t)N);
    memcpy(mine, id.internal + 32, 40);
    mine[10] = n;
    mine[11] = rank;
    for (int r = 0; r < N; r++)
        world[r] = r;
    char err[512];
    int rc = transport->ops->allgather(transport->impl, g, world, N, mine, all, 1, 12, PTC_I32,
                                       NULL, err, sizeof err);
    ecomm *c = ptc_xcalloc(1, sizeof *c);
    c->n = n;
    c->me = rank;
    c->members = ptc_xmalloc(sizeof(int) * (size_t)n);
    for (int k = 0; k < n; k++)
        c->members[k] = -1;
    int found = 0;
    for (int r = 0; r < N && rc == 0; r++) {
        const int32_t *o = all + 12 * r;
        if (memcmp(o, mine, 40) != 0)
            continue;
        if (o[10] != n || o[11] < 0 || o[11] >= n || c->members[o[11]] >= 0) {
            ptc_fmt(err, sizeof err, "rank %d joins a communicator of %d as rank %d, which does "
                    "not fit", r, o[10], o[11]);
            rc = -1;
            break;
        }
        c->members[o[11]] = r;
        found++;
    }
    if (rc == 0 && found != n) {
        ptc_fmt(err, sizeof err, "%d ranks joined a communicator of %d", found, n);
        rc = -1;
    }
    free(all);
    free(world);
    if (rc) {
        fprintf(stderr, "ptc: emulated NCCL: rank %d: ncclCommInitRank: %s\n", g, err);
        free(c->members);
        free(c);
        return N_INTERNAL;
    }
    *comm = c;
    return N_OK;
}

static int n_group_start(void)
{
    return N_OK;
}

static int n_group_end(void)
{
    return N_OK;
}

static int n_destroy(void *comm)
{
    ecomm *c = comm;
    if (c)
        free(c->members);
    free(c);
    return N_OK;
}

static ptc_dtype n_dtype(int t)
{
    return t == PTRT_NCCL_BFLOAT16 ? PTC_BF16 : t == PTRT_NCCL_FLOAT16 ? PTC_F16
                                   : t == PTRT_NCCL_INT32  ? PTC_I32 : PTC_F32;
}

static void *host_of(const void *p)
{
    return ptrt_cuda_emu_host((ptrt_cudev)(uintptr_t)p);
}

static int n_result(int rc, const char *err)
{
    if (rc < 0)
        fprintf(stderr, "ptc: emulated NCCL: %s\n", err);
    return rc < 0 ? N_INTERNAL : N_OK;
}

/* An NCCL call, run now (the default stream) or queued on a stream of its own (below). */
enum { Q_ALLREDUCE, Q_ALLGATHER, Q_REDUCE_SCATTER, Q_SEND, Q_RECV, Q_COPY };
typedef struct eop {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    int dtype, op, peer;
    ecomm *c;
} eop;

static int n_run(const eop *q)
{
    if (q->kind == Q_COPY) { /* cuMemcpyDtoDAsync: count bytes */
        memmove(host_of(q->recv), host_of(q->send), q->count);
        return N_OK;
    }
    ecomm *c = q->c;
    char err[512];
    void *impl = transport->impl;
    int me = c->members[c->me], rc = -1;
    ptc_dtype dt = n_dtype(q->dtype);
    ptrt_reduce red = q->op == PTRT_NCCL_MAX ? PTRT_RED_MAX : PTRT_RED_SUM;
    const ptrt_comm_ops *o = transport->ops;
    switch (q->kind) {
    case Q_ALLREDUCE:
        rc = o->allreduce(impl, me, c->members, c->n, host_of(q->send), host_of(q->recv),
                          (int64_t)q->count, dt, red, NULL, err, sizeof err);
        break;
    case Q_ALLGATHER:
        rc = o->allgather(impl, me, c->members, c->n, host_of(q->send), host_of(q->recv), 1,
                          (int64_t)q->count, dt, NULL, err, sizeof err);
        break;
    case Q_REDUCE_SCATTER:
        rc = o->reduce_scatter(impl, me, c->members, c->n, host_of(q->send), host_of(q->recv), 1,
                               (int64_t)q->count, dt, red, NULL, err, sizeof err);
        break;
    case Q_SEND:
        rc = o->send(impl, me, c->members[q->peer], host_of(q->send), (int64_t)q->count, dt, NULL,
                     err, sizeof err);
        break;
    default:
        rc = o->recv(impl, me, c->members[q->peer], host_of(q->recv), (int64_t)q->count, dt, NULL,
                     err, sizeof err);
        break;
    }
    return n_result(rc, err);
}

/* ---- streams and events. The default stream (NULL) runs every call at once, as above. A
 * stream of its own (cuStreamCreate; ptc queues only NCCL's calls there) defers what is queued
 * on it until the default stream waits for an event recorded after it (cuStreamWaitEvent), or
 * the thread that queued on it synchronizes the context: a kernel that reads a collective's
 * output, or overwrites its input, without that wait sees the buffers as they were before the
 * collective, as on a GPU where the collective has not run yet. A stream belongs to one rank's
 * thread (nccl_comm.c makes one per rank); ranks may share a GPU (threads), and each runs only
 * its own streams' calls. ---- */

typedef struct estream {
    int gpu;
    pthread_t owner; /* the thread that last queued on it (its rank's) */
    eop *q;
    int n, cap, done; /* queued [done, n) */
    int64_t head;     /* calls run before q[0] */
    bool failed;
} estream;

typedef struct eevent {
    estream *s;  /* NULL: complete when recorded */
    int64_t pos; /* the stream's calls before it, counted from its first */
} eevent;

static pthread_mutex_t stream_lock = PTHREAD_MUTEX_INITIALIZER;
static estream **streams;
static int nstreams, capstreams;

/* runs s's calls up to the upto-th (counted from its first) */
static int flush(estream *s, int64_t upto)
{
    for (; s->head + s->done < upto && s->done < s->n; s->done++)
        if (n_run(&s->q[s->done]) != N_OK)
            s->failed = true;
    if (s->done == s->n) {
        s->head += s->n;
        s->done = s->n = 0;
    }
    return s->failed ? E_LAUNCH_FAILED : E_OK;
}

static int e_stream_create(void **stream, unsigned flags)
{
    (void)flags;
    if (current_gpu < 0)
        return E_INVALID_CONTEXT;
    estream *s = ptc_xcalloc(1, sizeof *s);
    s->gpu = current_gpu;
    s->owner = pthread_self(); /* (until a rank's thread queues on it) */
    pthread_mutex_lock(&stream_lock);
    PTC_GROW(streams, capstreams, nstreams);
    streams[nstreams++] = s;
    pthread_mutex_unlock(&stream_lock);
    *stream = s;
    return E_OK;
}

static int e_stream_destroy(void *stream)
{
    estream *s = stream;
    if (!s)
        return E_INVALID_HANDLE;
    int rc = flush(s, s->head + s->n);
    pthread_mutex_lock(&stream_lock);
    for (int i = 0; i < nstreams; i++)
        if (streams[i] == s)
            streams[i] = streams[--nstreams];
    pthread_mutex_unlock(&stream_lock);
    free(s->q);
    free(s);
    return rc;
}

static int e_event_create(void **event, unsigned flags)
{
    (void)flags;
    *event = ptc_xcalloc(1, sizeof(eevent));
    return E_OK;
}

static int e_event_destroy(void *event)
{
    free(event);
    return E_OK;
}

static int e_event_record(void *event, void *stream)
{
    eevent *e = event;
    estream *s = stream;
    if (!e)
        return E_INVALID_HANDLE;
    e->s = s;
    e->pos = s ? s->head + s->n : 0;
    return E_OK;
}

static int e_stream_wait_event(void *stream, void *event, unsigned flags)
{
    (void)flags;
    eevent *e = event;
    if (!e)
        return E_INVALID_HANDLE;
    /* a stream of its own waiting for the default stream: what it queues later runs later
     * anyway; the default stream waiting for a stream: that stream's calls up to the event run
     * now */
    if (stream || !e->s)
        return E_OK;
    return flush(e->s, e->pos);
}

/* everything queued on the current GPU's streams by this thread. Ranks that share a GPU
 * (threads; --device cuda-emulated has one GPU by default) each flush their own: a stream is
 * one rank's (nccl_comm.c), and flushing another rank's raced with that rank queueing on it and
 * running it (ThreadSanitizer saw it; 4 ranks on one GPU failed under it) */
static int flush_gpu(void)
{
    int rc = E_OK;
    pthread_mutex_lock(&stream_lock);
    int n = nstreams;
    estream **mine = ptc_xmalloc(sizeof *mine * (size_t)(n + 1));
    int k = 0;
    for (int i = 0; i < n; i++)
        if (streams[i]->gpu == current_gpu && pthread_equal(streams[i]->owner, pthread_self()))
            mine[k++] = streams[i];
    pthread_mutex_unlock(&stream_lock);
    for (int i = 0; i < k; i++)
        if (flush(mine[i], mine[i]->head + mine[i]->n) != E_OK)
            rc = E_LAUNCH_FAILED;
    free(mine);
    return rc;
}

static int n_call(eop q, void *stream)
{
    estream *s = stream;
    if (!s)
        return n_run(&q);
    if (s->gpu != current_gpu)
        return N_INVALID_ARGUMENT;
    PTC_GROW(s->q, s->cap, s->n);
    s->q[s->n++] = q;
    if (!pthread_equal(s->owner, pthread_self())) { /* (read under the lock by flush_gpu) */
        pthread_mutex_lock(&stream_lock);
        s->owner = pthread_self();
        pthread_mutex_unlock(&stream_lock);
    }
    return N_OK;
}

static int e_copy_async(ptrt_cudev dst, ptrt_cudev src, size_t n, void *stream)
{
    if (dst < TAG || src < TAG)
        return E_INVALID_VALUE;
    return n_call((eop){Q_COPY, (const void *)(uintptr_t)src, (void *)(uintptr_t)dst, n, 0, 0, 0,
                        NULL},
                  stream) == N_OK
               ? E_OK
               : E_INVALID_VALUE;
}

static int n_allreduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm,
                       void *stream)
{
    return n_call((eop){Q_ALLREDUCE, send, recv, count, dtype, op, 0, comm}, stream);
}

static int n_allgather(const void *send, void *recv, size_t count, int dtype, void *comm,
                       void *stream)
{
    return n_call((eop){Q_ALLGATHER, send, recv, count, dtype, 0, 0, comm}, stream);
}

static int n_reduce_scatter(const void *send, void *recv, size_t count, int dtype, int op,
                            void *comm, void *stream)
{
    return n_call((eop){Q_REDUCE_SCATTER, send, recv, count, dtype, op, 0, comm}, stream);
}

static int n_send(const void *send, size_t count, int dtype, int peer, void *comm, void *stream)
{
    return n_call((eop){Q_SEND, send, NULL, count, dtype, 0, peer, comm}, stream);
}

static int n_recv(void *recv, size_t count, int dtype, int peer, void *comm, void *stream)
{
    return n_call((eop){Q_RECV, NULL, recv, count, dtype, 0, peer, comm}, stream);
}

static const ptrt_nccl emulated_nccl = {
    .ncclGetVersion = n_version,
    .ncclGetErrorString = n_error,
    .ncclGetUniqueId = n_unique_id,
    .ncclCommInitRank = n_init_rank,
    .ncclCommDestroy = n_destroy,
    .ncclAllReduce = n_allreduce,
    .ncclAllGather = n_allgather,
    .ncclReduceScatter = n_reduce_scatter,
    .ncclSend = n_send,
    .ncclRecv = n_recv,
    .ncclGroupStart = n_group_start,
    .ncclGroupEnd = n_group_end,
};

static const ptrt_nccl *emu_nccl(char *err, size_t errn)
{
    (void)err, (void)errn;
    return &emulated_nccl;
}

static int emu_open(const ptrt_cuda_driver **d, char *err, size_t errn)
{
    (void)err, (void)errn;
    *d = &emulated_driver;
    return 0;
}

/* units built in this process, by their key (the ranks of a plan share one) */
static pthread_mutex_t built_lock = PTHREAD_MUTEX_INITIALIZER;
static struct built {
    uint64_t hash;
    char *image;
    bool temporary; /* built in a temporary directory (no disk cache), removed at exit */
} *built;
static int nbuilt, capbuilt;

static char *build(const char *src, const char *cc, uint64_t key, bool *temporary, char *err,
                   size_t errn);

/* at exit: the shared objects built outside the disk cache, and their directories (the modules
 * dlopen'd them by name, so they stay while the process runs) */
static void remove_built(void)
{
    for (int i = 0; i < nbuilt; i++) {
        if (!built[i].temporary)
            continue;
        char *so = built[i].image + strlen(IMAGE_PREFIX), *slash = strrchr(so, '/');
        unlink(so);
        if (slash) {
            *slash = 0;
            rmdir(so);
        }
    }
}

/* PTC_CUDA_EMULATED_NVRTC=1 (tests/train/cuda_emulated.py sets it where NVRTC is installed):
 * each unit the emulation builds is first compiled by NVRTC for the emulated GPU's architecture
 * too, and a unit NVRTC refuses fails as it would on a GPU. The host compiler takes C that NVRTC
 * does not: the moe routing kernels' unsigned __int128, which NVRTC takes only with
 * --device-int128, ran here and failed on the first H200 that ran it (2026-11-27). */
static int nvrtc_too(const char *src, const char *name, int sm, char *err, size_t errn)
{
    const char *v = getenv("PTC_CUDA_EMULATED_NVRTC");
    if (!v || !*v || !strcmp(v, "0"))
        return 0;
    if (ptrt_cuda_open(PTRT_CUDA_NVRTC, err, errn) < 0)
        return -1;
    int cached = 0;
    char *ptx = ptrt_nvrtc_compile(src, name, sm, NULL, &cached, err, errn);
    bool ok = ptx != NULL;
    free(ptx);
    return ok ? 0 : -1;
}

/* the compiler's flags (the disk cache's key hashes them too) */
#define EMU_CFLAGS "-std=c11 -O1 -fPIC -shared -w" EMU_FLAGS

/* A unit's shared object: built once per distinct unit and process, and kept on disk
 * ($XDG_CACHE_HOME/ptc/cuda-emulated, else ~/.cache/ptc/cuda-emulated) under a hash of the
 * unit, cuda_emu.h, the compiler's name and flags and the host's machine, so that the next
 * process (the next run, the next test) loads it instead of compiling: 1 to 2 s a unit. Where
 * no cache directory can be made, in a temporary directory removed at exit. */
static char *emu_compile(const char *src, const char *name, int sm, char *err, size_t errn)
{
    const char *cc = getenv("CC");
    cc = cc && *cc ? cc : "cc";
    struct utsname host;
    ptc_hash64_state h;
    ptc_hash64_init(&h, 0x656d75ull);
    /* (each with its NUL: "a", "bc" is not "ab", "c") */
    ptc_hash64_update(&h, src, strlen(src) + 1);
    ptc_hash64_update(&h, ptrt_cuda_emu_header, strlen(ptrt_cuda_emu_header) + 1);
    ptc_hash64_update(&h, cc, strlen(cc) + 1);
    ptc_hash64_update(&h, EMU_CFLAGS, sizeof EMU_CFLAGS);
    if (uname(&host) == 0)
        ptc_hash64_update(&h, host.machine, strlen(host.machine) + 1);
    uint64_t key = ptc_hash64_final(&h);
    pthread_mutex_lock(&built_lock);
    char *image = NULL;
    for (int i = 0; i < nbuilt && !image; i++)
        if (built[i].hash == key)
            image = ptc_xstrdup(built[i].image);
    bool temporary = false;
    if (!image && nvrtc_too(src, name, sm, err, errn) == 0 &&
        (image = build(src, cc, key, &temporary, err, errn))) {
        if (nbuilt == 0)
            atexit(remove_built);
        PTC_GROW(built, capbuilt, nbuilt);
        built[nbuilt++] = (struct built){key, ptc_xstrdup(image), temporary};
    }
    pthread_mutex_unlock(&built_lock);
    return image;
}

static char *image_of(const char *so)
{
    size_t n = strlen(IMAGE_PREFIX) + strlen(so) + 1;
    char *image = ptc_xmalloc(n);
    snprintf(image, n, "%s%s", IMAGE_PREFIX, so);
    return image;
}

/* whether path is a whole 64-bit ELF object: its section headers (the linker writes them last)
 * end within the file. An object cut short (by a full disk, say, or a copy) would kill the
 * process with SIGBUS when dlopen maps it, not fail. */
static bool whole_object(const char *path)
{
    Elf64_Ehdr e;
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool ok = fstat(fd, &st) == 0 && read(fd, &e, sizeof e) == (ssize_t)sizeof e &&
              memcmp(e.e_ident, ELFMAG, SELFMAG) == 0 && e.e_ident[EI_CLASS] == ELFCLASS64 &&
              e.e_shoff + (uint64_t)e.e_shnum * e.e_shentsize <= (uint64_t)st.st_size;
    close(fd);
    return ok;
}

/* The unit and cuda_emu.h into a temporary directory, cc into a shared object: in the disk
 * cache, under a name of its own and then renamed to the key's (so that no process, this or
 * another building the same unit at once, ever loads a part-written object), or in that
 * temporary directory. */
static char *build(const char *src, const char *cc, uint64_t key, bool *temporary, char *err,
                   size_t errn)
{
    char cache[4096], cached[4200] = "", part[4300] = "";
    if (ptc_file_cache_dir("cuda-emulated", cache, sizeof cache)) {
        ptc_fmt(cached, sizeof cached, "%s/%016llx.so", cache, (unsigned long long)key);
        if (whole_object(cached))
            return image_of(cached);
        unlink(cached); /* (if there: one cut short is built again) */
        /* (builds are one at a time in a process: under built_lock) */
        ptc_fmt(part, sizeof part, "%s.%ld.part", cached, (long)getpid());
    }
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    ptc_fmt(dir, sizeof dir, "%s/ptc-cuda-emulated-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        ptc_fmt(err, errn, "cannot make a directory for the emulation build in %s",
                tmp && *tmp ? tmp : "/tmp");
        return NULL;
    }
    char hdr[4200], c[4200], so[4200], log[4200], werr[256];
    ptc_fmt(hdr, sizeof hdr, "%s/cuda_emu.h", dir);
    ptc_fmt(c, sizeof c, "%s/unit.c", dir);
    ptc_fmt(so, sizeof so, "%s/unit.so", dir);
    ptc_fmt(log, sizeof log, "%s/cc.log", dir);
    if (ptc_file_write_file(hdr, ptrt_cuda_emu_header, strlen(ptrt_cuda_emu_header), werr,
                            sizeof werr) < 0 ||
        ptc_file_write_file(c, src, strlen(src), werr, sizeof werr) < 0) {
        ptc_fmt(err, errn, "the emulation build: %s", werr);
        unlink(hdr);
        unlink(c);
        rmdir(dir);
        return NULL;
    }
    const char *out = *part ? part : so;
    char cmd[16384];
    ptc_fmt(cmd, sizeof cmd, "'%s' " EMU_CFLAGS " -include '%s' -o '%s' '%s' -lm >'%s' 2>&1", cc,
            hdr, out, c, log);
    int rc = system(cmd);
    if (rc != 0) {
        size_t len = 0;
        char rerr[128];
        char *text = ptc_file_read_all(log, 2000, &len, rerr, sizeof rerr);
        ptc_fmt(err, errn,
                "--device cuda-emulated needs a C compiler to build the kernels for the host "
                "(cc, or $CC): %s failed: %s",
                cc, text && len ? text : "(no output)");
        free(text);
        unlink(hdr);
        unlink(c);
        unlink(log);
        unlink(out);
        rmdir(dir);
        return NULL;
    }
    unlink(hdr);
    unlink(c);
    unlink(log);
    if (!*part) { /* the object stays until the process ends (the module dlopen's it by name) */
        *temporary = true;
        return image_of(so);
    }
    rmdir(dir);
    if (rename(part, cached) == 0)
        return image_of(cached);
    *temporary = true; /* (the cache would not take it: this process's alone, removed at exit) */
    return image_of(part);
}

/* A handle serves one thread at a time: the real cuBLASLt, given one handle from two threads
 * at once, computed wrong products (cuda.c gives each rank its own). The emulated call marks
 * its handle busy and fails where another thread has it. Handles live as long as the process,
 * as the backend's do. */
typedef struct emu_lt {
    atomic_int busy;
} emu_lt;

static int emu_gemm_start(void **handle, char *err, size_t errn)
{
    (void)err, (void)errn;
    emu_lt *h = ptc_xcalloc(1, sizeof *h);
    atomic_init(&h->busy, 0);
    *handle = h;
    return 0;
}

static double at(const void *p, int ab, int64_t i)
{
    return ab == PTC_BF16  ? ptc_bf16_value(((const uint16_t *)p)[i])
           : ab == PTC_F16 ? ptc_f16_value(((const uint16_t *)p)[i])
                           : ((const float *)p)[i];
}

/* An f32 operand as a tensor core takes it under a fast compute type: TF32 (10 significand bits
 * stored, rounded to nearest, ties away, as cvt.rna.tf32.f32) or bf16 (nearest even). */
static double tensor_core_input(double v, int compute)
{
    if (compute == PTRT_CUBLAS_COMPUTE_32F_FAST_16BF)
        return ptc_round_bf16(v);
    if (compute != PTRT_CUBLAS_COMPUTE_32F_FAST_TF32 || !isfinite(v))
        return v;
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x1000u) & ~0x1fffu;
    memcpy(&f, &u, 4);
    return f;
}

static int emu_matmul(const ptrt_cuda_gemm *g, char *call, size_t calln);

/* one cublasLtMatmul on handle */
static int emu_gemm(void *handle, const ptrt_cuda_gemm *g, ptrt_cudev ws, size_t ws_bytes,
                    char *call, size_t calln)
{
    (void)ws, (void)ws_bytes;
    emu_lt *h = handle;
    if (!h || atomic_exchange(&h->busy, 1)) {
        ptc_fmt(call, calln, "cublasLtMatmul (emulated): %s",
                h ? "its handle is in use by another thread (a handle serves one thread at a time)"
                  : "no handle");
        return E_INVALID_VALUE;
    }
    int rc = emu_matmul(g, call, calln);
    atomic_store(&h->busy, 0);
    return rc;
}

/* D = alpha op(X) op(Y) + beta D, column-major, as cuBLASLt reads the description */
static int emu_matmul(const ptrt_cuda_gemm *g, char *call, size_t calln)
{
    const void *x = ptrt_cuda_emu_host((ptrt_cudev)(uintptr_t)g->x);
    const void *y = ptrt_cuda_emu_host((ptrt_cudev)(uintptr_t)g->y);
    void *d = ptrt_cuda_emu_host((ptrt_cudev)(uintptr_t)g->d);
    ptrt_cudev gx = (ptrt_cudev)(uintptr_t)g->x, gy = (ptrt_cudev)(uintptr_t)g->y;
    ptrt_cudev gd = (ptrt_cudev)(uintptr_t)g->d;
    if (!x || !y || !d || gpu_of(gx) != current_gpu || gpu_of(gy) != current_gpu ||
        gpu_of(gd) != current_gpu || g->x_rows > g->ldx || g->y_rows > g->ldy || g->m > g->ldd) {
        ptc_fmt(call, calln, "cublasLtMatmul (emulated): an operand that is not memory of the "
                             "current GPU, or a leading dimension below its rows");
        return E_INVALID_VALUE;
    }
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t j = 0; j < g->n; j++)
            for (int64_t i = 0; i < g->m; i++) {
                double s = 0;
                for (int64_t p = 0; p < g->k; p++) {
                    int64_t xi = g->transa == PTRT_CUBLAS_OP_N ? i + p * g->ldx : p + i * g->ldx;
                    int64_t yi = g->transb == PTRT_CUBLAS_OP_N ? p + j * g->ldy : j + p * g->ldy;
                    s += tensor_core_input(at(x, g->ab, b * g->sx + xi), g->compute) *
                         tensor_core_input(at(y, g->ab, b * g->sy + yi), g->compute);
                }
                int64_t at_d = b * g->sd + i + j * g->ldd;
                if (g->cd == PTC_F32) {
                    float *o = (float *)d + at_d;
                    *o = (float)(g->alpha * s + (g->beta != 0 ? g->beta * (double)*o : 0.0));
                } else { /* a 16-bit D: the f32 value rounded (cuBLASLt takes beta 0 here) */
                    float v = (float)(g->alpha * s);
                    ((uint16_t *)d)[at_d] = g->cd == PTC_BF16 ? ptc_bf16_bits(v) : ptc_f16_bits(v);
                }
            }
    return E_OK;
}

const ptrt_cuda_impl ptrt_cuda_emulation = {
    .what = "CUDA backend's host emulation",
    .device = "cuda-emulated",
    .emulated = true,
    .open = emu_open,
    .compile = emu_compile,
    .gemm_start = emu_gemm_start,
    .gemm = emu_gemm,
    .nccl = emu_nccl,
    .nccl_transport = e_transport,
};
