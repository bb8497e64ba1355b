/* cuda.c - the CUDA backend (see cuda.h). */
#include "cuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_emit.h"
#include "cuda_internal.h"
#include "cudalib.h"
#include "kir_ops.h"
#include "ref.h"
#include "util.h"

/* ---- the process's devices ----
 * The driver is started once per process, on the real libraries or the emulation. Each GPU is
 * started when a rank is first bound to it (bind: rank r runs on GPU r mod the number of GPUs):
 * its primary context and architecture. A thread's calls go to the GPU it was last bound to
 * (thread-local); the executor binds before it calls anything.
 *
 * Each rank has a cuBLASLt handle and workspace of its own, made on its GPU when it first binds.
 * Ranks that share a GPU are threads that queue GEMMs at the same time, and one handle used from
 * two threads at once gave wrong products on an H200 (every plan of 2 or 4 ranks on one GPU
 * trained to other losses than the CPU, differently each run; with a handle per rank they match
 * it: bench/results/gpu_check_2026-11-26_*.md). The emulated cuBLASLt fails a call that finds
 * its handle in use by another thread. */

#define MAX_GPUS 64

typedef struct gpu {
    int state; /* 0 not started, 1 running, -1 failed (msg) */
    char msg[768];
    void *ctx;
    int sm; /* compute capability, 80 for 8.0 */
    ptc_cuda_arch arch;
    char name[256];
    char bus[64]; /* PCI bus id */
    /* the device communicator's reduction (comm_reduce): its module, loaded on first use, and
     * the block of device memory its arguments go through */
    void *comm_module, *comm_fn;
    ptrt_cudev comm_args;
    size_t comm_cap; /* words */
} gpu;

static struct {
    pthread_mutex_t lock;
    int state; /* the driver: 0 not started, 1 running, -1 failed (msg) */
    char msg[1024];
    const ptrt_cuda_impl *impl;
    const ptrt_cuda_driver *d;
    int count;
    gpu gpus[MAX_GPUS];
    /* by rank: its cuBLASLt handle and workspace, on the GPU it was made on (grows under lock) */
    struct rank_gemm {
        int gpu; /* -1: none yet */
        void *lt;
        ptrt_cudev ws;
    } *gemms;
    int ngemms;
    /* the first error since the last sync */
    int err_rc;
    char err_call[160];
} G = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int cur = -1;      /* the GPU this thread is bound to */
static _Thread_local int cur_rank = -1; /* and the rank it was bound for */
static _Thread_local void *cur_lt;       /* that rank's cuBLASLt handle and workspace */
static _Thread_local ptrt_cudev cur_ws;

static void latch(int rc, const char *call)
{
    if (rc == 0)
        return;
    pthread_mutex_lock(&G.lock);
    if (!G.err_rc) {
        G.err_rc = rc;
        ptc_fmt(G.err_call, sizeof G.err_call, "%s", call);
    }
    pthread_mutex_unlock(&G.lock);
}

static const char *errstr(int rc)
{
    const char *s = NULL;
    if (G.d && G.d->cuGetErrorString(rc, &s) != 0)
        s = NULL;
    return s ? s : "unknown error";
}

#define WS_BYTES ((size_t)32 << 20) /* cuBLASLt's workspace: what it asks for on Hopper */

static int start_driver_locked(const ptrt_cuda_impl *impl)
{
    char e[768];
    const ptrt_cuda_driver *d = NULL;
    if (impl->open(&d, e, sizeof e) < 0) {
        ptc_fmt(G.msg, sizeof G.msg, "%s", e);
        return -1;
    }
    G.d = d;
    int rc, count = 0;
    if ((rc = d->cuInit(0)) || (rc = d->cuDeviceGetCount(&count)) || count < 1) {
        ptc_fmt(G.msg, sizeof G.msg, "the CUDA driver found no usable GPU: %s",
                rc ? errstr(rc) : "no device");
        return -1;
    }
    G.count = count < MAX_GPUS ? count : MAX_GPUS;
    return 0;
}

static int start_gpu_locked(int i)
{
    gpu *g = &G.gpus[i];
    const ptrt_cuda_driver *d = G.d;
    int rc, dev = 0, major = 0, minor = 0, sms = 0;
    char nm[200] = "?";
    if ((rc = d->cuDeviceGet(&dev, i))) {
        ptc_fmt(g->msg, sizeof g->msg, "cuDeviceGet(%d): %s", i, errstr(rc));
        return -1;
    }
    d->cuDeviceGetName(nm, (int)sizeof nm, dev);
    d->cuDeviceGetAttribute(&major, PTRT_CU_ATTR_CC_MAJOR, dev);
    d->cuDeviceGetAttribute(&minor, PTRT_CU_ATTR_CC_MINOR, dev);
    d->cuDeviceGetAttribute(&sms, PTRT_CU_ATTR_SMS, dev);
    if (d->cuDeviceGetPCIBusId(g->bus, (int)sizeof g->bus, dev) != 0)
        ptc_fmt(g->bus, sizeof g->bus, "?");
    g->sm = major * 10 + minor;
    if (g->sm < 80) {
        ptc_fmt(g->msg, sizeof g->msg,
                "GPU %d (%s) is sm_%d; the generated kernels need sm_80 (Ampere) or newer", i, nm,
                g->sm);
        return -1;
    }
    /* PTX of the newest architecture ptc tunes for that the device runs (the driver compiles
     * it for the device's own) */
    g->arch = ptc_cuda_archs[0];
    for (int a = 0; a < ptc_cuda_narchs; a++)
        if (ptc_cuda_archs[a].sm <= g->sm)
            g->arch = ptc_cuda_archs[a];
    if (sms > 0)
        g->arch.sms = sms;
    ptc_fmt(g->name, sizeof g->name, "GPU %d: %s (sm_%d, %d SMs%s)", i, nm, g->sm, sms,
            G.impl->emulated ? ", emulated on the host" : "");
    if ((rc = d->cuDevicePrimaryCtxRetain(&g->ctx, dev)) || (rc = d->cuCtxSetCurrent(g->ctx))) {
        ptc_fmt(g->msg, sizeof g->msg, "cannot make a context on GPU %d (%s): %s", i, nm,
                errstr(rc));
        return -1;
    }
    return 0;
}

/* rank's cuBLASLt handle and workspace on GPU i, made where it has none there yet (G.lock
 * held; GPU i started and current in this thread). 0, or -1 with why. */
static int rank_gemm_locked(int rank, int i, char *err, size_t errn)
{
    if (rank < 0)
        rank = 0;
    if (rank >= G.ngemms) {
        int n = rank + 1 > 2 * G.ngemms ? rank + 1 : 2 * G.ngemms;
        G.gemms = ptc_xrealloc(G.gemms, (size_t)n * sizeof *G.gemms);
        for (int k = G.ngemms; k < n; k++)
            G.gemms[k] = (struct rank_gemm){.gpu = -1};
        G.ngemms = n;
    }
    struct rank_gemm *r = &G.gemms[rank];
    if (r->gpu != i) { /* (rank r is always on GPU r mod the count: made once) */
        char e[768];
        void *lt = NULL;
        ptrt_cudev ws = 0;
        int rc = 0;
        if (G.impl->gemm_start(&lt, e, sizeof e) < 0) {
            ptc_fmt(err, errn, "GPU %d, rank %d: %s", i, rank, e);
            return -1;
        }
        if ((rc = G.d->cuMemAlloc(&ws, WS_BYTES))) {
            ptc_fmt(err, errn,
                    "GPU %d, rank %d: cannot allocate cuBLASLt's workspace of %zu bytes: %s", i,
                    rank, WS_BYTES, errstr(rc));
            return -1;
        }
        *r = (struct rank_gemm){.gpu = i, .lt = lt, .ws = ws};
    }
    cur_lt = r->lt;
    cur_ws = r->ws;
    return 0;
}

/* Binds the calling thread to the GPU of rank ordinal `rank` (started on impl, with the driver,
 * where it is not yet). 0, or -1 with why. */
static int bind_on(const ptrt_cuda_impl *impl, int rank, char *err, size_t errn)
{
    /* already bound there (the executor binds before its every call): no lock. A thread that
     * bound once saw the driver's start and G.count under the lock, set once. */
    if (cur >= 0 && G.impl == impl && cur == (rank > 0 ? rank : 0) % G.count &&
        rank == cur_rank)
        return 0;
    pthread_mutex_lock(&G.lock);
    if (G.state == 0) {
        G.impl = impl;
        G.state = start_driver_locked(impl) == 0 ? 1 : -1;
    }
    int rc = G.state > 0 && G.impl == impl ? 0 : -1, i = -1;
    if (G.state < 0)
        ptc_fmt(err, errn, "%s", G.msg);
    else if (rc)
        ptc_fmt(err, errn, "this process already runs the %s; it cannot also run the %s",
                G.impl->what, impl->what);
    if (rc == 0) {
        i = (rank > 0 ? rank : 0) % G.count;
        if (G.gpus[i].state == 0)
            G.gpus[i].state = start_gpu_locked(i) == 0 ? 1 : -1;
        if (G.gpus[i].state < 0) {
            ptc_fmt(err, errn, "%s", G.gpus[i].msg);
            rc = -1;
        }
    }
    if (rc == 0 && cur != i) {
        latch(G.d->cuCtxSetCurrent(G.gpus[i].ctx), "cuCtxSetCurrent");
        cur = i;
    }
    if (rc == 0 && (rc = rank_gemm_locked(rank, i, err, errn)) == 0)
        cur_rank = rank;
    pthread_mutex_unlock(&G.lock);
    return rc;
}

static int bind_real(int rank, char *err, size_t errn)
{
    return bind_on(&ptrt_cuda_real, rank, err, errn);
}

static int bind_emulated(int rank, char *err, size_t errn)
{
    return bind_on(&ptrt_cuda_emulation, rank, err, errn);
}

/* the bound GPU (the executor binds before every call; a thread that never bound gets GPU 0) */
static gpu *here(void)
{
    if (cur < 0) {
        char e[256];
        if (G.impl)
            bind_on(G.impl, 0, e, sizeof e);
    }
    return &G.gpus[cur >= 0 ? cur : 0];
}

static void current(void)
{
    (void)here();
}

const ptrt_cuda_driver *ptrt_cuda_driver_now(void)
{
    return G.state > 0 ? G.d : NULL;
}

int ptrt_cuda_gpu_count(void)
{
    return G.state > 0 ? G.count : 0;
}

int ptrt_cuda_bound_rank(void)
{
    return cur_rank;
}

const char *ptrt_cuda_bus_id(void)
{
    return G.state > 0 && cur >= 0 ? G.gpus[cur].bus : "?";
}

void ptrt_cuda_nccl_transport(ptrt_comm *host)
{
    if (G.state > 0 && G.impl->nccl_transport)
        G.impl->nccl_transport(host);
}

const ptrt_nccl *ptrt_cuda_nccl_now(char *err, size_t errn)
{
    if (G.state <= 0) {
        ptc_fmt(err, errn, "the CUDA backend has not started");
        return NULL;
    }
    return G.impl->nccl(err, errn);
}

/* ---- memory ---- */

static ptrt_cudev dev_of(const void *p)
{
    return (ptrt_cudev)(uintptr_t)p;
}

/* on the bound GPU (the executor binds first; its message tells a failed bind) */
static void *dev_alloc(size_t n)
{
    if (G.state <= 0 || cur < 0)
        return NULL;
    ptrt_cudev p = 0;
    return G.d->cuMemAlloc(&p, n) == 0 ? (void *)(uintptr_t)p : NULL;
}

static void dev_free(void *p, size_t n)
{
    (void)n;
    if (p && G.state > 0) {
        current();
        latch(G.d->cuMemFree(dev_of(p)), "cuMemFree");
    }
}

static void upload(void *dev, const void *host, size_t n)
{
    current();
    latch(G.d->cuMemcpyHtoD(dev_of(dev), host, n), "cuMemcpyHtoD");
}

static void download(void *host, const void *dev, size_t n)
{
    current();
    int rc = G.d->cuMemcpyDtoH(host, dev_of(dev), n);
    latch(rc, "cuMemcpyDtoH");
    if (rc) /* what the caller reads is then not the device's: NaN, loudly */
        memset(host, 0xff, n);
}

static void move(void *dst, const void *src, size_t n)
{
    current();
    latch(G.d->cuMemcpyDtoD(dev_of(dst), dev_of(src), n), "cuMemcpyDtoD");
}

static void zero(void *dst, size_t n)
{
    current();
    latch(G.d->cuMemsetD8(dev_of(dst), 0, n), "cuMemsetD8");
}

static int dev_sync(char *err, size_t errn)
{
    current();
    latch(G.d->cuCtxSynchronize(), "cuCtxSynchronize");
    pthread_mutex_lock(&G.lock);
    int rc = G.err_rc;
    if (rc)
        ptc_fmt(err, errn, "the GPU reported %s (%d) at %s", errstr(rc), rc, G.err_call);
    G.err_rc = 0;
    pthread_mutex_unlock(&G.lock);
    return rc ? -1 : 0;
}

static int launch(void *fn, int grid, int block, void *const *ptrs, int n, char *err,
                  size_t errn);

/* ---- the device communicator's hooks (backend.h) ---- */

static void copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height)
{
    if (!width || !height)
        return;
    current();
    ptrt_cuda_copy2d k = {.src_type = PTRT_CU_MEMORYTYPE_DEVICE,
                          .src = dev_of(src),
                          .src_pitch = spitch,
                          .dst_type = PTRT_CU_MEMORYTYPE_DEVICE,
                          .dst = dev_of(dst),
                          .dst_pitch = dpitch,
                          .width = width,
                          .height = height};
    latch(G.d->cuMemcpy2D(&k), "cuMemcpy2D");
}

/* One reduction at a time per process: its arguments are uploaded to the GPU's block, then the
 * kernel that reads them is queued (the stream orders the next upload after it). */
static pthread_mutex_t comm_lock = PTHREAD_MUTEX_INITIALIZER;

/* the comm unit's kernel on the bound GPU h, its argument block holding `words` (comm_lock
 * held); 0, or -1 with why */
static int comm_ready_locked(gpu *h, size_t words, char *err, size_t errn)
{
    int rc;
    if (!h->comm_fn) {
        char *unit = NULL, e[4096];
        size_t len = 0;
        FILE *f = open_memstream(&unit, &len);
        ptc_cuda_emit_comm(f);
        fclose(f);
        char *image = G.impl->compile(unit, "comm", h->arch.sm, e, sizeof e);
        free(unit);
        if (!image) {
            ptc_fmt(err, errn, "the device communicator's kernel: %s", e);
            return -1;
        }
        rc = G.d->cuModuleLoadData(&h->comm_module, image);
        free(image);
        if (!rc)
            rc = G.d->cuModuleGetFunction(&h->comm_fn, h->comm_module, "k_ptc_comm_reduce");
        if (rc) {
            ptc_fmt(err, errn, "loading the device communicator's kernel: %s", errstr(rc));
            return -1;
        }
    }
    if (words > h->comm_cap) {
        /* the kernels that read the old block first finish */
        if (h->comm_args && ((rc = G.d->cuCtxSynchronize()) || (rc = G.d->cuMemFree(h->comm_args)))) {
            ptc_fmt(err, errn, "the device communicator's argument block: %s", errstr(rc));
            return -1;
        }
        h->comm_args = 0;
        h->comm_cap = 0;
        size_t cap = words < 64 ? 64 : words;
        if ((rc = G.d->cuMemAlloc(&h->comm_args, cap * 8))) {
            ptc_fmt(err, errn, "the device communicator's argument block: %s", errstr(rc));
            return -1;
        }
        h->comm_cap = cap;
    }
    return 0;
}

static int comm_reduce(void *dst, const void *const *src, int n, int64_t len, int op,
                       ptc_dtype dt, char *err, size_t errn)
{
    if (n < 1 || len < 0 || (dt != PTC_F32 && dt != PTC_BF16 && dt != PTC_F16)) {
        ptc_fmt(err, errn, "internal error: a device reduction of %d %s sources", n,
                ptc_dtype_name(dt));
        return -1;
    }
    if (len == 0)
        return 0;
    gpu *h = here();
    size_t words = 4 + (size_t)n;
    uint64_t stack[68], *a = words <= 68 ? stack : ptc_xmalloc(words * 8);
    a[0] = dev_of(dst);
    a[1] = (uint64_t)len;
    a[2] = (uint64_t)n;
    a[3] = (uint64_t)(op ? 1 : 0) | (uint64_t)dt << 8;
    for (int j = 0; j < n; j++)
        a[4 + j] = dev_of(src[j]);
    int64_t blocks = (len + 255) / 256, most = 8 * (int64_t)(h->arch.sms > 0 ? h->arch.sms : 1);
    pthread_mutex_lock(&comm_lock);
    int rc = comm_ready_locked(h, words, err, errn);
    if (rc == 0) {
        int urc = G.d->cuMemcpyHtoD(h->comm_args, a, words * 8);
        if (urc)
            ptc_fmt(err, errn, "cuMemcpyHtoD: %s (%d)", errstr(urc), urc);
        rc = urc ? -1
                 : launch(h->comm_fn, (int)(blocks < most ? blocks : most), 256,
                          (void *[]){(void *)(uintptr_t)h->comm_args}, 1, err, errn);
    }
    pthread_mutex_unlock(&comm_lock);
    if (a != stack)
        free(a);
    return rc;
}

/* ---- GEMMs ---- */

ptrt_cuda_gemm ptrt_cuda_gemm_of(const ptc_gemm *g, const void *a, const void *b, void *c)
{
    ptrt_cuda_gemm q = {
        .transa = g->tb ? PTRT_CUBLAS_OP_T : PTRT_CUBLAS_OP_N,
        .transb = g->ta ? PTRT_CUBLAS_OP_T : PTRT_CUBLAS_OP_N,
        .m = g->n,
        .n = g->m,
        .k = g->k,
        .ldx = g->ldb,
        .ldy = g->lda,
        .ldd = g->ldc,
        .batch = g->batch,
        .sx = g->sb,
        .sy = g->sa,
        .sd = g->sc,
        .x = b,
        .y = a,
        .d = c,
        .ab = g->ab,
        .cd = g->cd,
        .compute = PTRT_CUBLAS_COMPUTE_32F,
        .alpha = (float)g->alpha,
        .beta = (float)g->beta,
    };
    if (g->ab == PTC_F32) { /* tensor cores for f32 operands, where the run allows them */
        ptrt_matmul_precision p = ptrt_matmul_precision_asked();
        q.compute = p == PTRT_MATMUL_HIGH     ? PTRT_CUBLAS_COMPUTE_32F_FAST_TF32
                    : p == PTRT_MATMUL_MEDIUM ? PTRT_CUBLAS_COMPUTE_32F_FAST_16BF
                                              : PTRT_CUBLAS_COMPUTE_32F;
    }
    /* the stored shapes, column-major: op(X) is m x k, op(Y) k x n */
    q.x_rows = g->tb ? q.k : q.m;
    q.x_cols = g->tb ? q.m : q.k;
    q.y_rows = g->ta ? q.n : q.k;
    q.y_cols = g->ta ? q.k : q.n;
    return q;
}

static void gemm(const ptc_gemm *g, const void *a, const void *b, void *c)
{
    (void)here();
    ptrt_cuda_gemm q = ptrt_cuda_gemm_of(g, a, b, c);
    char call[160];
    int rc = G.impl->gemm(cur_lt, &q, cur_ws, WS_BYTES, call, sizeof call);
    latch(rc, call);
}

/* ---- the plan's kernels ---- */

typedef struct opk {
    int fn[PTC_OPK_MAX]; /* functions (indices into st->fns) */
    int n;
    int arg[PTC_OPK_MAX][PTC_OPK_MAX_ARGS];
    int nargs[PTC_OPK_MAX];
    int grid[PTC_OPK_MAX], block[PTC_OPK_MAX];
} opk;

typedef struct ikern { /* a kernel instruction */
    int *attn; /* its attention shape by coordinate (one unless attention_shard), or NULL */
    int nattn;
    opk *ops;  /* its kernels by the rank's coordinate on the op's mesh axis (one where the op
                * does not depend on it) */
    int nops;
    int moe;   /* its expert shape + 1 (moe_ffn(_grad), moe_ep_ffn(_grad) in f32), or 0 */
    int rows;  /* its row shape + 1 (moe_pack, moe_unpack, moe_combine(_grad) in f32), or 0 */
    int route; /* its routing shape + 1 (moe_topk, moe_count, ...), or 0 */
    bool host; /* no kernel for its op yet: the executor runs it on the host */
} ikern;

#define MAX_ROUTES 64 /* routing shapes of a plan */

typedef struct cstate {
    void *module;
    void **fns;
    int nfns;
    int *fused_fn, *fused_grid, *fused_block; /* by plan kernel */
    int attn_fn[16][PTC_CUDA_ATTN_NKERNELS], attn_grid[16][PTC_CUDA_ATTN_NKERNELS],
        attn_block[16][PTC_CUDA_ATTN_NKERNELS];
    ptc_cuda_attn at[16];
    int nat;
    int moe_fn[16][PTC_CUDA_MOE_NKERNELS];
    ptc_cuda_moe moe[16];
    int nmoe;
    int rows_fn[16][PTC_CUDA_MOE_ROWS_NKERNELS];
    ptc_cuda_moe_rows rows[16];
    int nrows;
    int route_fn[MAX_ROUTES], route_grid[MAX_ROUTES], route_block[MAX_ROUTES];
    ptc_cuda_moe_route routes[MAX_ROUTES];
    int nroutes;
    const ptc_cuda_arch *arch;
    ikern **prog; /* [program][instruction] */
    int nprog, *ninstrs;
    ptrt_cudev scratch;
    int64_t scratch_bytes;
    int gpu; /* the GPU its module is loaded on */
    char host_ops[512]; /* the ops of the instructions on the host, for the note */
    int nhost;          /* those instructions */
} cstate;

static int p_ninstrs(const struct cstate *s, int q)
{
    return s->ninstrs ? s->ninstrs[q] : 0;
}

static void release(void *state)
{
    cstate *s = state;
    if (!s)
        return;
    current();
    for (int q = 0; q < s->nprog; q++) {
        for (int i = 0; s->prog[q] && i < p_ninstrs(s, q); i++) {
            free(s->prog[q][i].ops);
            free(s->prog[q][i].attn);
        }
        free(s->prog[q]);
    }
    free(s->ninstrs);
    free(s->prog);
    free(s->fns);
    free(s->fused_fn);
    free(s->fused_grid);
    free(s->fused_block);
    if (s->scratch)
        latch(G.d->cuMemFree(s->scratch), "cuMemFree");
    if (s->module)
        latch(G.d->cuModuleUnload(s->module), "cuModuleUnload");
    free(s);
}

/* the kernel names of the unit in emission order, resolved after loading */
typedef struct names {
    char **v;
    int n, cap;
} names;

static int add_name(names *nm, const char *fmt, const char *a, const char *b)
{
    PTC_GROW(nm->v, nm->cap, nm->n);
    char buf[300];
    ptc_fmt(buf, sizeof buf, fmt, a, b);
    nm->v[nm->n] = ptc_xstrdup(buf);
    return nm->n++;
}

/* the names k_<prefix><id>_<kernel> of a shape's n kernels, their indices into fn */
static void add_shape_names(names *nm, int *fn, const char *prefix, int id,
                            const char *const *kernels, int n)
{
    char pre[48];
    ptc_fmt(pre, sizeof pre, "%s%d", prefix, id);
    for (int w = 0; w < n; w++)
        fn[w] = add_name(nm, "k_%s_%s", pre, kernels[w]);
}

static int attention_id(cstate *s, const ptc_program *pg, const ptc_instr *in, int coord)
{
    ptc_cuda_attn a;
    if (!ptc_cuda_attn_of(pg, in, coord, &a))
        return -1;
    for (int i = 0; i < s->nat; i++)
        if (ptc_cuda_attn_same(&s->at[i], &a))
            return i;
    return -1;
}

/* whether buffers a and b of a program are the same bytes on every rank */
static bool same_bytes(const ptc_program *pg, int a, int b)
{
    const ptc_buffer *x = &pg->bufs[a], *y = &pg->bufs[b];
    return a == b || (x->region == y->region && x->offset == y->offset && (x->view >= 0) == (y->view >= 0) &&
                      x->view_axis == y->view_axis && x->view_step == y->view_step &&
                      x->view_offset == y->view_offset);
}

/* ---- the experts of a mixture of experts (cuda_moe.c's kernels, cuBLASLt's GEMMs) ---- */

#define MOE_BLOCK_FLOATS ((int64_t)1 << 26) /* an expert block's matrices: 256 MiB at most */

typedef struct moe_layout {
    int64_t E, n, block, nblocks; /* experts, rows (choices), rows of a block, blocks at most */
    int64_t floats;               /* byte offset of the block's matrices */
    int64_t X, H, A, O, dO, dA, dH, dX; /* their float offsets there */
} moe_layout;

/* The scratch of moe instruction in: its rows by expert (int64: first, src, choice, and each
 * block's rows), then a block's matrices, 256-byte aligned; its bytes. */
static int64_t moe_scratch(const ptc_program *pg, const ptc_instr *in, moe_layout *out)
{
    ptc_cuda_moe m;
    moe_layout l = {0};
    if (!ptc_cuda_moe_of(pg, in, &m))
        return 0;
    const ptc_type *tx = &pg->bufs[in->in[0]].type, *tr = &pg->bufs[in->in[1]].type;
    l.E = pg->bufs[in->in[m.ep ? 2 : 3]].type.dims[0];
    l.n = m.ep ? tx->dims[0] : ptc_type_numel(tr);
    /* an expert's rows: at most every token (it takes one at most once), or every row */
    int64_t most = m.ep ? l.n : ptc_type_numel(tx) / m.d, per_row = 4 * m.d + 2 * m.F + 2 * m.f;
    l.block = (MOE_BLOCK_FLOATS - 8 * 64) / per_row; /* (8 matrices, each padded to 64) */
    const char *cap = getenv("PTC_CUDA_MOE_BLOCK"); /* (for tests: several blocks an expert) */
    if (cap && atoll(cap) > 0 && atoll(cap) < l.block)
        l.block = atoll(cap);
    l.block = l.block < most ? l.block : most;
    l.block = l.block > 1 ? l.block : 1;
    l.nblocks = l.E + l.n / l.block + 1;
    l.floats = ((l.E + 1 + 2 * l.n + 2 * l.nblocks) * 8 + 255) / 256 * 256;
    int64_t at = 0, w[8] = {m.d, m.F, m.f, m.d, m.d, m.f, m.F, m.d};
    int64_t *o[8] = {&l.X, &l.H, &l.A, &l.O, &l.dO, &l.dA, &l.dH, &l.dX};
    for (int k = 0; k < 8; k++) {
        *o[k] = at;
        at += (l.block * w[k] + 63) / 64 * 64;
    }
    if (out)
        *out = l;
    return l.floats + 4 * at;
}

static int launch(void *fn, int grid, int block, void *const *ptrs, int n, char *err, size_t errn);

/* one moe kernel over work elements */
static int moe_launch(cstate *s, int id, ptc_cuda_moe_kernel w, int64_t work, void *const *args,
                      int n, char *err, size_t errn)
{
    int grid, block;
    ptc_cuda_moe_launch(s->arch, work, &grid, &block);
    return launch(s->fns[s->moe_fn[id][w]], grid, block, args, n, err, errn);
}

static void gemm(const ptc_gemm *g, const void *a, const void *b, void *c);

/* C = op(A) op(B) + beta C, f32, row-major with lda, ldb, ldc = their rows' lengths */
static void moe_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                     const void *b, double beta, void *c)
{
    ptc_gemm g = {.ta = ta, .tb = tb, .ab = PTC_F32, .cd = PTC_F32, .m = m, .n = n, .k = k,
                  .batch = 1, .lda = ta ? m : k, .ldb = tb ? k : n, .ldc = n, .alpha = 1.0,
                  .beta = beta};
    gemm(&g, a, b, c);
}

static void download(void *host, const void *dev, size_t n);
static void upload(void *dev, const void *host, size_t n);
static void zero(void *dst, size_t n);

/* moe_ffn(_grad) or moe_ep_ffn(_grad) of expert shape id, instruction ins of program pg, on the
 * GPU: its rows by expert on the host (ptrt_moe_rows over a download of the route or counts: a
 * sync), then, per expert and block of its rows, cuda_moe.c's kernels and the GEMMs on the
 * stream, as cpu_moe.c runs them (see there): forward H = X W_up, A = act(H), O = A W_down;
 * backward dA = dO W_down^T, dW_down += A^T dO, dH = act'(H) dA, dX = dH W_up^T, dW_up += X^T dH.
 * A token's rows add into it in expert order (the experts run in order on the stream). */
static int moe_run(cstate *s, int id, const ptc_program *pg, const ptc_instr *ins, int coord,
                   void *const *in, void *const *out, char *err, size_t errn)
{
    const ptc_cuda_moe *m = &s->moe[id];
    moe_layout l;
    moe_scratch(pg, ins, &l);
    bool grad = ins->op == PTC_OP_MOE_FFN_GRAD || ins->op == PTC_OP_MOE_EP_FFN_GRAD, ep = m->ep;
    ptc_type it[PTC_MAX_RESULTS * 2];
    for (int k = 0; k < ins->nin && k < PTC_MAX_RESULTS * 2; k++)
        it[k] = pg->bufs[ins->in[k]].type;
    int64_t nr = ptc_type_numel(&it[1]);
    int32_t *route = ptc_xmalloc(sizeof(int32_t) * (size_t)(nr + 1));
    download(route, in[1], sizeof(int32_t) * (size_t)nr);
    int64_t *first = ptc_xcalloc((size_t)l.floats / 8, 8), *src = first + l.E + 1;
    int64_t *choice = src + l.n;
    int64_t *blocks = choice + l.n, *expert = ptc_xmalloc(sizeof(int64_t) * (size_t)l.nblocks);
    ptrt_kcall kc = {.op = ins->op, .nin = ins->nin, .nout = ins->nout, .attrs = ins->attrs,
                     .coord = coord};
    int64_t rows = ptrt_moe_rows(&kc, it, route, first, src, ep ? NULL : choice, err, errn);
    free(route);
    int64_t nb = 0;
    for (int64_t e = 0; rows >= 0 && e < l.E; e++)
        for (int64_t r0 = first[e]; r0 < first[e + 1]; r0 += l.block, nb++) {
            blocks[2 * nb] = r0;
            blocks[2 * nb + 1] = first[e + 1] - r0 < l.block ? first[e + 1] : r0 + l.block;
            expert[nb] = e;
        }
    char *sc = (char *)(uintptr_t)s->scratch;
    if (rows >= 0)
        upload(sc, first, (size_t)l.floats);
    for (int o = 0; rows >= 0 && o < ins->nout; o++) /* dropped choices, rows not received */
        zero(out[o], (size_t)pg->bufs[ins->out[o]].bytes);
    float *f = (float *)(sc + l.floats);
    void *X = f + l.X, *H = f + l.H, *A = f + l.A, *O = f + l.O, *dO = f + l.dO, *dA = f + l.dA,
         *dH = f + l.dH, *dX = f + l.dX;
    void *srcd = sc + 8 * (l.E + 1), *idx = ep ? srcd : sc + 8 * (l.E + 1 + l.n);
    void *gate = ep ? in[0] : in[2], *dy = grad ? in[ep ? 4 : 5] : NULL;
    int rc = rows < 0 ? -1 : 0;
    for (int64_t b = 0; b < nb && rc == 0; b++) {
        int64_t e = expert[b], c = blocks[2 * b + 1] - blocks[2 * b], d = m->d, F = m->F,
                f1 = m->f;
        void *at = sc + 8 * (l.E + 1 + 2 * l.n + 2 * b);
        const char *up = (const char *)in[ep ? 2 : 3] + 4 * e * d * F,
                   *down = (const char *)in[ep ? 3 : 4] + 4 * e * f1 * d;
        rc = moe_launch(s, id, PTC_CUDA_MOE_GATHER, c * d, (void *[]){in[0], srcd, at, X}, 4, err,
                        errn);
        moe_gemm(false, false, c, F, d, X, up, 0.0, H);
        if (rc == 0)
            rc = moe_launch(s, id, PTC_CUDA_MOE_ACT, c * f1, (void *[]){H, at, A}, 3, err, errn);
        if (!grad || !ep) /* (the gradient of moe_ffn needs O for dgate) */
            moe_gemm(false, false, c, d, f1, A, down, 0.0, O);
        if (!grad) {
            if (rc == 0)
                rc = moe_launch(s, id, PTC_CUDA_MOE_OUT, c * d,
                                (void *[]){O, idx, gate, at, out[0]}, 5, err, errn);
            continue;
        }
        void *dgate = ep ? dA : out[1]; /* (moe_ep_ffn has none: a buffer it leaves alone) */
        char *gup = (char *)out[ep ? 1 : 2] + 4 * e * d * F,
             *gdown = (char *)out[ep ? 2 : 3] + 4 * e * f1 * d;
        if (rc == 0)
            rc = moe_launch(s, id, PTC_CUDA_MOE_OUT_GRAD, ep ? c * d : c,
                            (void *[]){O, dy, idx, gate, at, dO, dgate}, 7, err, errn);
        moe_gemm(false, true, c, f1, d, dO, down, 0.0, dA);
        moe_gemm(true, false, f1, d, c, A, dO, 1.0, gdown);
        if (rc == 0)
            rc = moe_launch(s, id, PTC_CUDA_MOE_ACT_GRAD, c * f1, (void *[]){H, dA, at, dH}, 4,
                            err, errn);
        moe_gemm(false, true, c, d, F, dH, up, 0.0, dX);
        moe_gemm(true, false, d, F, c, X, dH, 1.0, gup);
        if (rc == 0)
            rc = moe_launch(s, id, PTC_CUDA_MOE_SCATTER, c * d, (void *[]){dX, idx, at, out[0]},
                            4, err, errn);
    }
    free(first); /* (and blocks) */
    free(expert);
    return rc;
}

/* moe_pack, moe_unpack, moe_combine or moe_combine_grad of row shape id on the GPU: each choice's
 * row on the host (ptrt_ref_moe_row_of over a download of the route: a sync), then one kernel */
static int moe_rows_run(cstate *s, int id, const ptc_program *pg, const ptc_instr *ins,
                        void *const *in, void *const *out, char *err, size_t errn)
{
    const ptc_cuda_moe_rows *m = &s->rows[id];
    bool pack = ins->op == PTC_OP_MOE_PACK;
    int64_t planned = pg->bufs[pack ? ins->out[0] : ins->in[0]].type.dims[0];
    int32_t *route = ptc_xmalloc(sizeof(int32_t) * (size_t)m->n);
    int64_t *pos = ptc_xmalloc(sizeof(int64_t) * (size_t)m->n);
    download(route, in[1], sizeof(int32_t) * (size_t)m->n);
    int64_t rows = ptrt_ref_moe_row_of(route, m->n, planned, pos, err, errn);
    void *sc = (void *)(uintptr_t)s->scratch;
    if (rows >= 0)
        upload(sc, pos, sizeof(int64_t) * (size_t)m->n);
    free(route);
    free(pos);
    if (rows < 0)
        return -1;
    if (pack || ins->op == PTC_OP_MOE_COMBINE_GRAD) /* (rows past the last kept) */
        zero(out[0], (size_t)pg->bufs[ins->out[0]].bytes);
    int w = pack                           ? PTC_CUDA_MOE_PACK
            : ins->op == PTC_OP_MOE_UNPACK  ? PTC_CUDA_MOE_UNPACK
            : ins->op == PTC_OP_MOE_COMBINE ? PTC_CUDA_MOE_COMBINE
                                            : PTC_CUDA_MOE_COMBINE_GRAD;
    void *args[6] = {in[0], sc};
    int n = 2;
    if (w == PTC_CUDA_MOE_COMBINE || w == PTC_CUDA_MOE_COMBINE_GRAD)
        args[n++] = in[2];
    if (w == PTC_CUDA_MOE_COMBINE_GRAD)
        args[n++] = in[3];
    for (int o = 0; o < ins->nout; o++)
        args[n++] = out[o];
    int64_t work = w == PTC_CUDA_MOE_COMBINE_GRAD ? m->n
                   : w == PTC_CUDA_MOE_PACK       ? m->n * m->d
                                                  : m->n / m->K * m->d;
    int grid, block;
    ptc_cuda_moe_launch(s->arch, work, &grid, &block);
    return launch(s->fns[s->rows_fn[id][w]], grid, block, args, n, err, errn);
}

/* Whether in is a moe op the GPU runs: its expert shape (ik->moe), row shape (ik->rows) or
 * routing shape (ik->route), + 1 (0: none of the unit's). */
static bool moe_ids(const cstate *s, const ptc_program *pg, const ptc_instr *in, ikern *ik)
{
    ptc_cuda_moe moe;
    ptc_cuda_moe_rows rows;
    ptc_cuda_moe_route route;
    if (ptc_cuda_moe_of(pg, in, &moe))
        for (int m = 0; m < s->nmoe && !ik->moe; m++)
            ik->moe = ptc_cuda_moe_same(&s->moe[m], &moe) ? m + 1 : 0;
    else if (ptc_cuda_moe_rows_of(pg, in, &rows))
        for (int m = 0; m < s->nrows && !ik->rows; m++)
            ik->rows = ptc_cuda_moe_rows_same(&s->rows[m], &rows) ? m + 1 : 0;
    else if (ptc_cuda_moe_route_of(pg, in, &route))
        for (int m = 0; m < s->nroutes && !ik->route; m++)
            ik->route = ptc_cuda_moe_route_same(&s->routes[m], &route) ? m + 1 : 0;
    else
        return false;
    return true;
}

/* the op kernels of kernel instruction i for coordinate coord, emitted into f (deduplicated by
 * their text's hash); 1 where the op has none (the instruction runs on the host) */
static int prepare_ops(cstate *s, const ptc_plan *p, const ptc_cuda_arch *arch,
                       const ptc_program *pg, int i, int coord, opk *ko, FILE *f, names *nm,
                       uint64_t **hashes, int *nh, int *caph, char *err, size_t errn)
{
    const ptc_instr *in = &pg->instrs[i];
    ptc_type *it = ptc_xcalloc((size_t)in->nin + 1, sizeof *it), ot[PTC_MAX_RESULTS + 1];
    for (int k = 0; k < in->nin; k++)
        it[k] = pg->bufs[in->in[k]].type;
    for (int k = 0; k < in->nout; k++)
        ot[k] = pg->bufs[in->out[k]].type;
    char nmb[64], why[512];
    ptc_fmt(nmb, sizeof nmb, "op%d", *nh);
    ptc_op_kernels ok;
    int brc = ptc_op_kernels_build(nmb, in->op, &in->attrs, coord, in->nin, it, in->nout, ot, &ok,
                                   why, sizeof why);
    free(it);
    if (brc < 0)
        return 1;
    (void)p, (void)err, (void)errn;
    ko->n = ok.n;
    for (int q = 0; q < ok.n; q++) {
        ptc_kir *k = ok.k[q];
        /* a result written over an operand (in place: AdamW's state, a planned reuse) is an
         * alias of it, so that the CUDA C does not promise the compiler they differ */
        for (int a = 0; a < k->nparams; a++) {
            int wa = ok.arg[q][a];
            if (wa < PTC_OPK_OUT || wa >= PTC_OPK_SCRATCH)
                continue;
            for (int b2 = 0; b2 < k->nparams; b2++) {
                int wb = ok.arg[q][b2];
                if (wb < PTC_OPK_OUT && k->params[b2].dtype == k->params[a].dtype &&
                    k->params[b2].numel == k->params[a].numel &&
                    same_bytes(pg, in->in[wb - PTC_OPK_IN], in->out[wa - PTC_OPK_OUT]))
                    k->params[a].alias = b2;
            }
        }
        uint64_t h = ptc_kir_hash(k);
        /* the same text under another name: reuse its function (names are op<N>_<q>) */
        int found = -1;
        for (int j = 0; j < *nh && found < 0; j++)
            if ((*hashes)[2 * j] == h)
                found = (int)(*hashes)[2 * j + 1];
        if (found < 0) {
            /* the kernel renamed to the function's own name, then emitted */
            found = add_name(nm, "k_%s%s", k->name, "");
            ptc_cuda_emit_kernel(k, f);
            if (*nh + 1 > *caph) {
                *caph = *caph ? 2 * *caph : 64;
                *hashes = ptc_xrealloc(*hashes, sizeof(uint64_t) * 2 * (size_t)*caph);
            }
            (*hashes)[2 * *nh] = h;
            (*hashes)[2 * *nh + 1] = (uint64_t)found;
            (*nh)++;
        }
        ko->fn[q] = found;
        ko->nargs[q] = k->nparams;
        memcpy(ko->arg[q], ok.arg[q], sizeof ok.arg[q]);
        ptc_cuda_launch(k, arch, &ko->grid[q], &ko->block[q]);
    }
    if (ok.scratch * 4 > s->scratch_bytes)
        s->scratch_bytes = ok.scratch * 4;
    ptc_op_kernels_free(&ok);
    return 0;
}

/* The plan's unit for arch into *unit (malloc'd) and s: its functions' names in nm, in order, and
 * how each instruction launches them. 0, or -1 with a message naming an instruction the backend
 * has no kernel for. */
static int build_unit(cstate *s, const ptc_plan *p, const ptc_cuda_arch *arch, char **unit,
                      names *nm, char *err, size_t errn)
{
    size_t len = 0;
    FILE *f = open_memstream(unit, &len);
    /* the plan's fused kernels and attention kernels */
    ptc_cuda_emit_plan(p, f);
    s->fused_fn = ptc_xcalloc((size_t)(p->nkernels + 1), sizeof(int));
    s->fused_grid = ptc_xcalloc((size_t)(p->nkernels + 1), sizeof(int));
    s->fused_block = ptc_xcalloc((size_t)(p->nkernels + 1), sizeof(int));
    for (int k = 0; k < p->nkernels; k++) {
        s->fused_fn[k] = add_name(nm, "k_%s%s", p->kernels[k]->name, "");
        ptc_cuda_launch(p->kernels[k], arch, &s->fused_grid[k], &s->fused_block[k]);
    }
    s->nat = ptc_cuda_plan_attentions(p, s->at, 16);
    int64_t attn_scratch = 0;
    for (int a = 0; a < s->nat && a < 16; a++) {
        char id[16];
        ptc_fmt(id, sizeof id, "%d", a);
        for (int w = 0; w < PTC_CUDA_ATTN_NKERNELS; w++) {
            s->attn_fn[a][w] = add_name(nm, "k_attn%s_%s", id, ptc_cuda_attn_names[w]);
            ptc_cuda_attention_launch(&s->at[a], (ptc_cuda_attn_kernel)w, arch,
                                      &s->attn_grid[a][w], &s->attn_block[a][w]);
        }
        int64_t stats = 2 * 4 * s->at[a].batch * s->at[a].heads * s->at[a].seq;
        attn_scratch = stats > attn_scratch ? stats : attn_scratch;
    }
    int rc = s->nat > 16 ? -1 : 0;
    if (rc)
        ptc_fmt(err, errn, "the plan has %d attention shapes; the CUDA backend takes 16", s->nat);
    if (attn_scratch > s->scratch_bytes)
        s->scratch_bytes = attn_scratch;
    s->nmoe = ptc_cuda_plan_moes(p, s->moe, 16);
    for (int m = 0; m < s->nmoe && m < 16; m++)
        add_shape_names(nm, s->moe_fn[m], "moe", m, ptc_cuda_moe_names, PTC_CUDA_MOE_NKERNELS);
    s->nrows = ptc_cuda_plan_moe_rows(p, s->rows, 16);
    for (int m = 0; m < s->nrows && m < 16; m++) {
        add_shape_names(nm, s->rows_fn[m], "moerows", m, ptc_cuda_moe_rows_names,
                        PTC_CUDA_MOE_ROWS_NKERNELS);
        int64_t need = 8 * s->rows[m].n; /* (each choice's row) */
        s->scratch_bytes = need > s->scratch_bytes ? need : s->scratch_bytes;
    }
    s->nroutes = ptc_cuda_plan_moe_routes(p, s->routes, MAX_ROUTES);
    for (int m = 0; m < s->nroutes && m < MAX_ROUTES; m++) {
        char id[16];
        ptc_fmt(id, sizeof id, "%d", m);
        s->route_fn[m] = add_name(nm, "k_moeroute%s%s", id, "");
        ptc_cuda_moe_launch(arch, ptc_cuda_moe_route_work(&s->routes[m]), &s->route_grid[m],
                            &s->route_block[m]);
    }
    if (rc == 0 && (s->nmoe > 16 || s->nrows > 16 || s->nroutes > MAX_ROUTES)) {
        ptc_fmt(err, errn,
                "the plan has %d expert, %d row and %d routing shapes; the CUDA backend takes "
                "16, 16 and %d",
                s->nmoe, s->nrows, s->nroutes, MAX_ROUTES);
        rc = -1;
    }
    s->arch = arch;
    /* every other kernel instruction of every program */
    uint64_t *hashes = NULL;
    int nh = 0, caph = 0;
    s->nprog = p->nprograms;
    s->prog = ptc_xcalloc((size_t)(p->nprograms + 1), sizeof(ikern *));
    s->ninstrs = ptc_xcalloc((size_t)(p->nprograms + 1), sizeof(int));
    for (int q = 0; q < p->nprograms && rc == 0; q++) {
        const ptc_program *pg = &p->programs[q];
        s->prog[q] = ptc_xcalloc((size_t)(pg->ninstrs + 1), sizeof(ikern));
        s->ninstrs[q] = pg->ninstrs;
        for (int i = 0; i < pg->ninstrs && rc == 0; i++) {
            const ptc_instr *in = &pg->instrs[i];
            ikern *ik = &s->prog[q][i];
            if (in->kind != PTC_INSTR_KERNEL)
                continue;
            /* the coordinates the kernel may run at: a microbatch's, fixed; the rank's on the
             * op's mesh axis, each of them; else none */
            bool per_rank = !in->has_coord && (ptc_ops[in->op].kw & PTC_A_MESH_AXIS) &&
                            p->mesh.naxes;
            ptc_cuda_attn shape;
            if (ptc_cuda_attn_of(pg, in, 0, &shape)) {
                ik->nattn = per_rank ? p->mesh.sizes[in->attrs.mesh_axis] : 1;
                ik->attn = ptc_xcalloc((size_t)ik->nattn, sizeof(int));
                for (int c = 0; c < ik->nattn && rc == 0; c++)
                    if ((ik->attn[c] = attention_id(s, pg, in, in->has_coord ? in->coord : c)) < 0) {
                        ptc_fmt(err, errn, "internal error: an attention with no CUDA kernels");
                        rc = -1;
                    }
                continue;
            }
            if (moe_ids(s, pg, in, ik)) {
                if (!ik->moe && !ik->rows && !ik->route) {
                    ptc_fmt(err, errn, "internal error: a moe op with no CUDA kernels");
                    rc = -1;
                }
                int64_t need = moe_scratch(pg, in, NULL); /* (the rows': prepared above) */
                s->scratch_bytes = need > s->scratch_bytes ? need : s->scratch_bytes;
                continue;
            }
            ik->nops = per_rank ? p->mesh.sizes[in->attrs.mesh_axis] : 1;
            ik->ops = ptc_xcalloc((size_t)ik->nops, sizeof(opk));
            for (int c = 0; c < ik->nops && rc == 0 && !ik->host; c++)
                if ((rc = prepare_ops(s, p, arch, pg, i, in->has_coord ? in->coord : c,
                                      &ik->ops[c], f, nm, &hashes, &nh, &caph, err, errn)) == 1) {
                    rc = 0;
                    ik->host = true;
                }
            if (ik->host) {
                const char *name = ptc_ops[in->op].name;
                size_t len = strlen(s->host_ops);
                char pat[80];
                ptc_fmt(pat, sizeof pat, "%s,", name);
                if (!strstr(s->host_ops, pat) && len + strlen(pat) + 1 < sizeof s->host_ops)
                    memcpy(s->host_ops + len, pat, strlen(pat) + 1);
            }
            s->nhost += ik->host;
        }
    }
    fclose(f);
    free(hashes);
    return rc;
}

/* on the GPU the executor bound (it binds before it prepares) */
static int prepare(const ptc_plan *p, void **state, char *err, size_t errn)
{
    if (G.state <= 0 || cur < 0) {
        ptc_fmt(err, errn, "internal error: the CUDA backend prepared before a bind");
        return -1;
    }
    const ptrt_cuda_impl *impl = G.impl;
    gpu *h = &G.gpus[cur];
    cstate *s = ptc_xcalloc(1, sizeof *s);
    s->gpu = cur;
    char *unit = NULL;
    names nm = {0};
    int rc = build_unit(s, p, &h->arch, &unit, &nm, err, errn);
    if (rc == 0 && s->scratch_bytes > 0 &&
        (rc = G.d->cuMemAlloc(&s->scratch, (size_t)s->scratch_bytes)) != 0) {
        ptc_fmt(err, errn, "cannot allocate the kernels' scratch of %lld bytes: %s",
                (long long)s->scratch_bytes, errstr(rc));
        rc = -1;
    }
    if (rc == 0) {
        char e[4096];
        char *image = impl->compile(unit, p->model ? p->model : "plan", h->arch.sm, e, sizeof e);
        int lrc = image ? G.d->cuModuleLoadData(&s->module, image) : -1;
        if (!image)
            ptc_fmt(err, errn, "%s", e);
        else if (lrc)
            ptc_fmt(err, errn, "cuModuleLoadData of the plan's kernels (sm_%d): %s", h->arch.sm,
                    errstr(lrc));
        rc = image && !lrc ? 0 : -1;
        free(image);
    }
    if (rc == 0) {
        s->fns = ptc_xcalloc((size_t)(nm.n + 1), sizeof(void *));
        s->nfns = nm.n;
        for (int k = 0; k < nm.n && rc == 0; k++) {
            int frc = G.d->cuModuleGetFunction(&s->fns[k], s->module, nm.v[k]);
            if (frc) {
                ptc_fmt(err, errn, "cuModuleGetFunction(%s): %s", nm.v[k], errstr(frc));
                rc = -1;
            }
        }
    }
    for (int k = 0; k < nm.n; k++)
        free(nm.v[k]);
    free(nm.v);
    free(unit);
    if (rc < 0) {
        release(s);
        return -1;
    }
    static bool noted; /* once per process: every rank's plan has the same ops */
    pthread_mutex_lock(&G.lock);
    if (s->nhost && !noted) {
        noted = true;
        s->host_ops[strlen(s->host_ops) - 1] = '\0';
        fprintf(stderr,
                "note: --device %s: no GPU kernel yet for %s: %d instruction%s of the plan's "
                "programs run on the host, their operands copied over the bus each way\n",
                G.impl->device, s->host_ops, s->nhost, s->nhost == 1 ? "" : "s");
    }
    pthread_mutex_unlock(&G.lock);
    *state = s;
    return 0;
}

char *ptrt_cuda_unit(const ptc_plan *p, int sm, char *err, size_t errn)
{
    const ptc_cuda_arch *arch = NULL;
    for (int a = 0; a < ptc_cuda_narchs; a++)
        if (ptc_cuda_archs[a].sm == sm)
            arch = &ptc_cuda_archs[a];
    if (!arch) {
        ptc_fmt(err, errn, "no tuning for sm_%d (ptc knows sm_80 and sm_90)", sm);
        return NULL;
    }
    cstate *s = ptc_xcalloc(1, sizeof *s);
    char *unit = NULL;
    names nm = {0};
    int rc = build_unit(s, p, arch, &unit, &nm, err, errn);
    for (int k = 0; k < nm.n; k++)
        free(nm.v[k]);
    free(nm.v);
    release(s);
    if (rc < 0) {
        free(unit);
        return NULL;
    }
    return unit;
}

/* one launch: params point at device addresses, a NULL after the last (the emulation counts
 * them by it; the driver reads as many as the kernel has) */
static int launch(void *fn, int grid, int block, void *const *ptrs, int n, char *err, size_t errn)
{
    ptrt_cudev vs[64], *v = n <= 64 ? vs : ptc_xmalloc(sizeof(ptrt_cudev) * (size_t)n);
    void *ps[65], **params = n <= 64 ? ps : ptc_xmalloc(sizeof(void *) * (size_t)(n + 1));
    for (int k = 0; k < n; k++) {
        v[k] = dev_of(ptrs[k]);
        params[k] = &v[k];
    }
    params[n] = NULL;
    int rc = G.d->cuLaunchKernel(fn, (unsigned)grid, 1, 1, (unsigned)block, 1, 1, 0, NULL, params,
                                 NULL);
    if (v != vs) {
        free(v);
        free(params);
    }
    if (rc)
        ptc_fmt(err, errn, "cuLaunchKernel: %s (%d)", errstr(rc), rc);
    return rc ? -1 : 0;
}

static int fused(void *state, const ptc_plan *p, int k, void *const *args, char *err, size_t errn)
{
    cstate *s = state;
    current();
    return launch(s->fns[s->fused_fn[k]], s->fused_grid[k], s->fused_block[k], args,
                  p->kernels[k]->nparams, err, errn);
}

static int attn(cstate *s, int a, ptc_cuda_attn_kernel w, void *const *args, int n, char *err,
                size_t errn)
{
    return launch(s->fns[s->attn_fn[a][w]], s->attn_grid[a][w], s->attn_block[a][w], args, n,
                  err, errn);
}

static int instr(void *state, const ptc_plan *p, int prog, int i, int coord, void *const *in,
                 void *const *out, char *err, size_t errn)
{
    cstate *s = state;
    current();
    const ptc_instr *ins = &p->programs[prog].instrs[i];
    const ikern *ik = &s->prog[prog][i];
    void *scratch = (void *)(uintptr_t)s->scratch;
    if (ik->attn) {
        int id = ik->attn[ik->nattn > 1 ? coord : 0];
        const ptc_cuda_attn *a = &s->at[id];
        if (ins->op == PTC_OP_ATTENTION || ins->op == PTC_OP_ATTENTION_SHARD)
            return attn(s, id, PTC_CUDA_ATTN_FWD, (void *[]){in[0], in[1], in[2], out[0]}, 4, err,
                        errn);
        size_t ns = (size_t)(a->batch * a->heads * a->seq) * 4;
        void *lse = scratch, *ds = (char *)scratch + ns;
        int rc = attn(s, id, PTC_CUDA_ATTN_STATS,
                      (void *[]){in[0], in[1], in[2], in[3], lse, ds}, 6, err, errn);
        if (rc == 0)
            rc = attn(s, id, PTC_CUDA_ATTN_BWD_KV,
                      (void *[]){in[0], in[1], in[2], in[3], lse, ds, out[1], out[2]}, 8, err,
                      errn);
        if (rc == 0)
            rc = attn(s, id, PTC_CUDA_ATTN_BWD_Q,
                      (void *[]){in[0], in[1], in[2], in[3], lse, ds, out[0]}, 7, err, errn);
        return rc;
    }
    if (ik->rows)
        return moe_rows_run(s, ik->rows - 1, &p->programs[prog], ins, in, out, err, errn);
    if (ik->route) { /* operands, then results */
        void *args[8];
        int n = 0, r = ik->route - 1;
        PTC_ASSERT(ins->nin + ins->nout <= 8);
        for (int k = 0; k < ins->nin; k++)
            args[n++] = in[k];
        for (int k = 0; k < ins->nout; k++)
            args[n++] = out[k];
        return launch(s->fns[s->route_fn[r]], s->route_grid[r], s->route_block[r], args, n, err,
                      errn);
    }
    if (ik->moe)
        return moe_run(s, ik->moe - 1, &p->programs[prog], ins, coord, in, out, err, errn);
    if (ik->host)
        return PTRT_ON_HOST;
    const opk *ko = &ik->ops[ik->nops > 1 ? coord : 0];
    PTC_ASSERT(ik->nops == 1 || (coord >= 0 && coord < ik->nops));
    for (int q = 0; q < ko->n; q++) {
        void *args[PTC_OPK_MAX_ARGS];
        for (int k = 0; k < ko->nargs[q]; k++) {
            int a = ko->arg[q][k];
            args[k] = a >= PTC_OPK_SCRATCH ? scratch
                      : a >= PTC_OPK_OUT   ? out[a - PTC_OPK_OUT]
                                           : in[a - PTC_OPK_IN];
        }
        if (launch(s->fns[ko->fn[q]], ko->grid[q], ko->block[q], args, ko->nargs[q], err, errn) <
            0)
            return -1;
    }
    return 0;
}

static int no_kernel(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                     void *const *out, char *err, size_t errn)
{
    ptc_fmt(err, errn, "internal error: the CUDA backend runs kernel instructions through instr");
    return -1;
}

/* the backend on the real libraries and on the emulation: the same code, but for which one
 * the first bind starts */
#define CUDA_BACKEND(nm, bind_fn)                                                                  \
    {                                                                                              \
        .name = nm, .kernel = no_kernel, .gemm = gemm, .alloc = dev_alloc, .free = dev_free,      \
        .host = false, .prepare = prepare, .bind = bind_fn, .release = release, .fused = fused,   \
        .instr = instr, .upload = upload, .download = download, .move = move, .zero = zero,       \
        .sync = dev_sync, .copy2d = copy2d, .reduce = comm_reduce,                                \
    }

const ptrt_backend ptrt_backend_cuda = CUDA_BACKEND("cuda", bind_real);
const ptrt_backend ptrt_backend_cuda_emulated = CUDA_BACKEND("cuda-emulated", bind_emulated);
