/* cuda_emu.h - the host emulation of the CUDA C that cuda_emit.c writes, so that every generated
 * GPU kernel runs, and is compared with the reference kernels, on a machine without a GPU.
 *
 * Included first (cc -include cuda_emu.h) into the generated translation unit, compiled as C11
 * into a shared object. A launch runs the grid's blocks one after another; a block's threads are
 * fibers (ucontext) switched at every barrier, or, under ASan (which does not follow fibers) or
 * with PTC_CUDA_EMU_THREADS defined, real threads (POSIX). Either way a missing barrier shows as a
 * wrong result, as on a GPU (fibers run in an order that changes from launch to launch):
 *
 *   threadIdx, blockIdx   the running fiber's (thread-local with threads); blockDim, gridDim set
 *                         by the launch;
 *   __syncthreads()       a barrier of the block's threads;
 *   __shfl_xor_sync       each lane leaves its value in a slot, a barrier of its warp, it reads
 *                         its partner's slot, a barrier of its warp: exact for code whose
 *                         shuffles all 32 lanes of a warp reach together (the generated block
 *                         reductions);
 *   __shared__            a static variable, one per kernel; blocks do not overlap in time;
 *   atomicAdd             under a lock (no generated kernel uses it yet; flash-style kernels will).
 *
 * Entry point, exported from the shared object: ptc_cuda_emu_launch(fn, args, grid, block),
 * fn being a kernel's `k_<name>__emu`. One launch at a time per process.
 */
#ifndef PTC_CUDA_EMU_H
#define PTC_CUDA_EMU_H

#define PTC_CUDA_EMULATE 1
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* pthread barriers under -std=c11 */
#endif

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define PTC_KERNEL void
#define PTC_DEVICE static inline
#define PTC_RESTRICT restrict
#define PTC_INF ((float)INFINITY)
#define PTC_NAN ((float)NAN)
static inline unsigned int ptc_emu_f2u(float x)
{
    unsigned int u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float ptc_emu_u2f(unsigned int u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
/* an address kept in device memory (the device communicator's argument block) is the emulated
 * driver's: the host address below bit 48, a tag and the GPU's number above */
#define PTC_DEVPTR(u) ((void *)(uintptr_t)((u) & (((unsigned long long)1 << 48) - 1)))
#define PTC_F2U(x) ptc_emu_f2u(x)
#define PTC_U2F(x) ptc_emu_u2f(x)
#define __launch_bounds__(n)
#define __shared__ static

typedef struct ptc_emu_dim3 {
    unsigned x, y, z;
} ptc_emu_dim3;

#if !defined(__SANITIZE_ADDRESS__) && !defined(PTC_CUDA_EMU_THREADS)
/* ---- a block's threads as fibers (ucontext) on the calling thread ----
 * A barrier switches to the next fiber that can run: cheap, where a barrier of real threads costs
 * an OS context switch for each (32 to 1024 of them on a machine of a few cores). Waiting is
 * exact: a fiber passes a barrier when every member has arrived (the block's threads for
 * __syncthreads, its warp's 32 for the shuffles). A launch whose fibers all wait on barriers
 * that can never complete (a barrier some threads skip) returns -1 instead of hanging. */
#include <stdlib.h>
#include <ucontext.h>

#define PTC_EMU_STACK ((size_t)64 << 10)

static ptc_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
static float ptc_emu_slot[1024];

typedef void (*ptc_emu_fn)(void *const *args);

typedef struct ptc_emu_fiber {
    ucontext_t uc;
    int state; /* 0 runnable, 1 waiting at barrier bar, 2 done */
    int bar;
} ptc_emu_fiber;

static ptc_emu_fiber ptc_emu_fibers[1024];
static ucontext_t ptc_emu_sched;
static unsigned ptc_emu_cur;
static unsigned ptc_emu_arrived[33]; /* 0: the block's barrier; 1 + w: warp w's */
static ptc_emu_fn ptc_emu_fn_now;
static void *const *ptc_emu_args_now;
static char *ptc_emu_stacks;
static size_t ptc_emu_nstacks;
static unsigned ptc_emu_launches;

static void ptc_emu_wait(int bar, unsigned members)
{
    if (++ptc_emu_arrived[bar] == members) { /* the last to arrive releases the others */
        ptc_emu_arrived[bar] = 0;
        for (unsigned t = 0; t < blockDim.x; t++)
            if (ptc_emu_fibers[t].state == 1 && ptc_emu_fibers[t].bar == bar)
                ptc_emu_fibers[t].state = 0;
        return;
    }
    unsigned me = ptc_emu_cur;
    ptc_emu_fibers[me].state = 1;
    ptc_emu_fibers[me].bar = bar;
    swapcontext(&ptc_emu_fibers[me].uc, &ptc_emu_sched);
}

static inline void __syncthreads(void)
{
    ptc_emu_wait(0, blockDim.x);
}

static inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask)
{
    (void)mask;
    int warp = 1 + (int)(threadIdx.x >> 5);
    ptc_emu_slot[threadIdx.x] = v;
    ptc_emu_wait(warp, 32);
    float u = ptc_emu_slot[threadIdx.x ^ ((unsigned)lane_mask & 31u)];
    ptc_emu_wait(warp, 32);
    return u;
}

static inline float atomicAdd(float *p, float v)
{
    float old = *p; /* fibers do not run at once */
    *p = old + v;
    return old;
}

static void ptc_emu_entry(void)
{
    ptc_emu_fn_now(ptc_emu_args_now);
    ptc_emu_fibers[ptc_emu_cur].state = 2; /* then back to the scheduler (uc_link) */
}

/* Runs fn on grid blocks of block threads. 0, or -1 for a block size the generated code does
 * not take (not a multiple of 32, or above 1024), no memory for the stacks, or a deadlock. */
int ptc_cuda_emu_launch(ptc_emu_fn fn, void *const *args, unsigned grid, unsigned block);

int ptc_cuda_emu_launch(ptc_emu_fn fn, void *const *args, unsigned grid, unsigned block)
{
    if (block == 0 || block % 32 || block > 1024 || grid == 0)
        return -1;
    if (ptc_emu_nstacks < block) {
        free(ptc_emu_stacks);
        ptc_emu_stacks = (char *)malloc(PTC_EMU_STACK * block);
        ptc_emu_nstacks = ptc_emu_stacks ? block : 0;
        if (!ptc_emu_stacks)
            return -1;
    }
    blockDim = (ptc_emu_dim3){block, 1, 1};
    gridDim = (ptc_emu_dim3){grid, 1, 1};
    ptc_emu_fn_now = fn;
    ptc_emu_args_now = args;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = (ptc_emu_dim3){b, 0, 0};
        memset(ptc_emu_arrived, 0, sizeof ptc_emu_arrived);
        for (unsigned t = 0; t < block; t++) {
            ptc_emu_fiber *f = &ptc_emu_fibers[t];
            getcontext(&f->uc);
            f->uc.uc_stack.ss_sp = ptc_emu_stacks + PTC_EMU_STACK * t;
            f->uc.uc_stack.ss_size = PTC_EMU_STACK;
            f->uc.uc_link = &ptc_emu_sched;
            makecontext(&f->uc, ptc_emu_entry, 0);
            f->state = 0;
        }
        /* the order fibers run in changes from launch to launch (rotated, either direction), so
         * that code missing a barrier meets a writer that has not yet run */
        ptc_emu_launches++;
        unsigned rot = (ptc_emu_launches * 7u) % block;
        bool down = ptc_emu_launches & 1;
        for (unsigned done = 0; done < block;) {
            bool ran = false;
            for (unsigned i = 0; i < block; i++) {
                unsigned t = (rot + (down ? block - 1 - i : i)) % block;
                if (ptc_emu_fibers[t].state != 0)
                    continue;
                ptc_emu_cur = t;
                threadIdx = (ptc_emu_dim3){t, 0, 0};
                swapcontext(&ptc_emu_sched, &ptc_emu_fibers[t].uc);
                ran = true;
                done += ptc_emu_fibers[t].state == 2;
            }
            if (!ran)
                return -1; /* every fiber left waits on a barrier that cannot complete */
        }
    }
    return 0;
}

#else /* ---- a block's threads as POSIX threads (ASan builds, or PTC_CUDA_EMU_THREADS) ---- */
static _Thread_local ptc_emu_dim3 threadIdx, blockIdx;
static ptc_emu_dim3 blockDim, gridDim;
static pthread_barrier_t ptc_emu_barrier, ptc_emu_warp_barrier[32];
static float ptc_emu_slot[1024];
static pthread_mutex_t ptc_emu_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ptc_emu_go = PTHREAD_COND_INITIALIZER;
static int ptc_emu_state; /* 0 starting, 1 run, -1 give up (a thread could not be started) */

static inline void __syncthreads(void)
{
    pthread_barrier_wait(&ptc_emu_barrier);
}

static inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask)
{
    (void)mask;
    pthread_barrier_t *warp = &ptc_emu_warp_barrier[threadIdx.x >> 5];
    ptc_emu_slot[threadIdx.x] = v;
    pthread_barrier_wait(warp);
    float u = ptc_emu_slot[threadIdx.x ^ ((unsigned)lane_mask & 31u)];
    pthread_barrier_wait(warp);
    return u;
}

static inline float atomicAdd(float *p, float v)
{
    pthread_mutex_lock(&ptc_emu_lock);
    float old = *p;
    *p = old + v;
    pthread_mutex_unlock(&ptc_emu_lock);
    return old;
}

typedef void (*ptc_emu_fn)(void *const *args);

typedef struct ptc_emu_thread {
    ptc_emu_fn fn;
    void *const *args;
    unsigned tid;
} ptc_emu_thread;

static void *ptc_emu_run(void *arg)
{
    ptc_emu_thread *t = arg;
    pthread_mutex_lock(&ptc_emu_lock);
    while (ptc_emu_state == 0)
        pthread_cond_wait(&ptc_emu_go, &ptc_emu_lock);
    bool run = ptc_emu_state > 0;
    pthread_mutex_unlock(&ptc_emu_lock);
    if (!run)
        return NULL;
    threadIdx.x = t->tid;
    threadIdx.y = threadIdx.z = 0;
    for (unsigned b = 0; b < gridDim.x; b++) {
        blockIdx.x = b;
        blockIdx.y = blockIdx.z = 0;
        t->fn(t->args);
        __syncthreads(); /* the next block starts when this one has ended */
    }
    return NULL;
}

/* Runs fn on grid blocks of block threads. 0, or -1 for a block size the generated code does
 * not take (not a multiple of 32, or above 1024) or threads that could not be started. */
int ptc_cuda_emu_launch(ptc_emu_fn fn, void *const *args, unsigned grid, unsigned block);

int ptc_cuda_emu_launch(ptc_emu_fn fn, void *const *args, unsigned grid, unsigned block)
{
    if (block == 0 || block % 32 || block > 1024 || grid == 0)
        return -1;
    blockDim = (ptc_emu_dim3){block, 1, 1};
    gridDim = (ptc_emu_dim3){grid, 1, 1};
    if (pthread_barrier_init(&ptc_emu_barrier, NULL, block))
        return -1;
    for (unsigned w = 0; w < block / 32; w++)
        pthread_barrier_init(&ptc_emu_warp_barrier[w], NULL, 32);
    pthread_t th[1024];
    ptc_emu_thread ts[1024];
    unsigned started = 0;
    int rc = 0;
    ptc_emu_state = 0;
    for (; started < block; started++) {
        ts[started] = (ptc_emu_thread){fn, args, started};
        if (pthread_create(&th[started], NULL, ptc_emu_run, &ts[started])) {
            rc = -1;
            break;
        }
    }
    /* the threads start together, or not at all: a missing one would hold a barrier forever */
    pthread_mutex_lock(&ptc_emu_lock);
    ptc_emu_state = rc ? -1 : 1;
    pthread_cond_broadcast(&ptc_emu_go);
    pthread_mutex_unlock(&ptc_emu_lock);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&ptc_emu_barrier);
    for (unsigned w = 0; w < block / 32; w++)
        pthread_barrier_destroy(&ptc_emu_warp_barrier[w]);
    return rc;
}

#endif /* fibers or threads */

#endif
