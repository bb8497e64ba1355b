/* cuda_emu.h - the host emulation of the CUDA C that cuda_emit.c writes, so that every generated
 * GPU kernel runs, and is compared with the reference kernels, on a machine without a GPU.
 *
 * Included first (cc -include cuda_emu.h) into the generated translation unit, compiled as C11
 * into a shared object. A launch runs the grid's blocks one after another; a block's threads are
 * fibers switched at every barrier, announced to AddressSanitizer where it runs. A
 * missing barrier shows as a wrong result, as on a GPU (fibers run in an order that changes from
 * launch to launch), or as a race (below):
 *
 *   threadIdx, blockIdx   the running fiber's; blockDim, gridDim set by the launch;
 *   __syncthreads()       a barrier of the block's threads;
 *   __shfl_xor_sync       each lane leaves its value in a slot, a barrier of its warp, it reads
 *                         its partner's slot, a barrier of its warp: exact for code whose
 *                         shuffles all 32 lanes of a warp reach together (the generated block
 *                         reductions);
 *   __shared__            a static variable, one per kernel; blocks do not overlap in time;
 *   mma.sync              ptc_emu_mma_share: the warp's fragments, exchanged as the shuffles'
 *                         values are; the generated code multiplies (the tensor-core attention);
 *   ldmatrix              ptc_emu_rows_share: the warp's row addresses, exchanged likewise; the
 *                         generated code loads each lane's fragment from them;
 *   atomicAdd             under a lock (no generated kernel uses it yet; flash-style kernels will);
 *   PTC_LD(p, i)          p[i], and PTC_ST(p, i, v), p[i] = v: every load and store of the
 *                         kernel-IR, attention and communicator kernels (global and shared
 *                         memory) is written so, and the fibers build checks each one for a
 *                         race (below); PTC_LD4(p, i), float4 of p[4i .. 4i + 3], as 4 loads.
 *
 * Entry points, exported from the shared object: ptc_cuda_emu_launch(fn, args, grid, block),
 * fn being a kernel's `k_<name>__emu`, and ptc_cuda_emu_error(), what made the last launch fail.
 * One launch at a time per process.
 *
 * The race check. A missing barrier shows as a wrong result only when the fibers happen
 * to run in an order that exposes it, and two threads adding into one element show nothing at
 * all: fibers do not interleave within a barrier interval, so no update is lost here that a GPU
 * would lose. So each access is recorded, in a table keyed by address and cleared every launch,
 * with the (block, barrier interval, thread) of its last writer and last reader, and a launch
 * fails (-2, the first race described by ptc_cuda_emu_error) when
 *   - two threads of one block touch one address between the same two barriers, one writing; or
 *   - two blocks touch one address of global memory, one writing: a GPU runs blocks at once and
 *     orders them not at all;
 * except that stores of the same bits (the generated code's top-level statements, which every
 * thread runs) leave the same memory in any order, and a store that leaves the bits there as
 * they were changes nothing another thread read. Shared memory (__shared__, placed in a section of
 * its own to be told apart) is each block's own: a block starts its record afresh. atomicAdd is not
 * recorded.
 */
#ifndef PTC_CUDA_EMU_H
#define PTC_CUDA_EMU_H

#define PTC_CUDA_EMULATE 1
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <math.h>
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
#define __align__(n) __attribute__((aligned(n)))

/* CUDA's float4, and PTC_LD4(p, i): the 4 floats p[4i .. 4i + 3] as one float4 (a 16-byte
 * load on the GPU), checked as 4 loads (PTC_LD is defined below, by build) */
typedef struct float4 {
    float x, y, z, w;
} float4;
#define PTC_LD4(p, i)                                                                              \
    ((float4){PTC_LD(p, 4 * (i)), PTC_LD(p, 4 * (i) + 1), PTC_LD(p, 4 * (i) + 2),                 \
              PTC_LD(p, 4 * (i) + 3)})

/* PTC_LDV(d, p, i, n): p[i .. i + n - 1] into the array d (16-byte loads on the GPU), checked
 * as n loads; PTC_STV(p, i, d, n) the other way. p + i not at a 16-byte boundary fails the
 * launch, as the GPU's load would fault (ptc_emu_aligned16, below). */
#define PTC_LDV(d, p, i, n)                                                                        \
    do {                                                                                           \
        ptc_emu_aligned16(&(p)[i], #p);                                                            \
        for (int ptc_q = 0; ptc_q < (n); ptc_q++)                                                  \
            (d)[ptc_q] = PTC_LD(p, (i) + ptc_q);                                                   \
    } while (0)
#define PTC_STV(p, i, d, n)                                                                        \
    do {                                                                                           \
        ptc_emu_aligned16(&(p)[i], #p);                                                            \
        for (int ptc_q = 0; ptc_q < (n); ptc_q++)                                                  \
            PTC_ST(p, (i) + ptc_q, (d)[ptc_q]);                                                    \
    } while (0)
#define PTC_ADDR(p) ((unsigned long long)(uintptr_t)(p))
#define PTC_UNROLL
#define PTC_UNUSED __attribute__((unused))

typedef struct ptc_emu_dim3 {
    unsigned x, y, z;
} ptc_emu_dim3;

/* ---- a block's threads as fibers on the calling thread ----
 * A barrier switches to the next fiber that can run: cheap, where a barrier of real threads costs
 * an OS context switch for each (32 to 1024 of them on a machine of a few cores). Waiting is
 * exact: a fiber passes a barrier when every member has arrived (the block's threads for
 * __syncthreads, its warp's 32 for the shuffles). A launch whose fibers all wait on barriers
 * that can never complete (a barrier some threads skip) returns -1 instead of hanging. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* Under AddressSanitizer (a unit built with -fsanitize=address, or loaded into a process that
 * was: PTC_CUDA_EMU_ASAN) every switch is announced to it, so that it knows which stack runs:
 * its checks of stack memory, and its unpoisoning at a function that does not return, would
 * otherwise take a fiber's stack for the thread's. */
#if defined(__SANITIZE_ADDRESS__) || defined(PTC_CUDA_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define PTC_EMU_STACK ((size_t)128 << 10) /* (its redzones widen the frames) */
#define PTC_EMU_SWITCH_TO(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define PTC_EMU_SWITCHED(save, from_bottom, from_size)                                             \
    __sanitizer_finish_switch_fiber(save, from_bottom, from_size)
/* the stacks of fibers a deadlock left in the middle of their frames, made plain memory again */
#define PTC_EMU_STACKS_CLEAN(p, n) __asan_unpoison_memory_region(p, n)
#else
#define PTC_EMU_STACK ((size_t)64 << 10)
#define PTC_EMU_SWITCH_TO(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define PTC_EMU_SWITCHED(save, from_bottom, from_size)                                             \
    ((void)(save), (void)(from_bottom), (void)(from_size))
#define PTC_EMU_STACKS_CLEAN(p, n) ((void)(p), (void)(n))
#endif

/* A context: ptc_emu_ctx_make(c, stack, size, entry) readies entry to run on the stack (entry
 * never returns: it ends by switching away for good); ptc_emu_ctx_switch(from, to) suspends the
 * running code in from and resumes to. On x86-64 the switch saves and restores the callee-saved
 * registers and the stack pointer, 15 instructions: glibc's swapcontext also saves the floating
 * point environment and makes a system call for the signal mask, and was 60% of an emulated
 * training run (perf). The kernels change neither, so neither is kept. Elsewhere, or with
 * PTC_CUDA_EMU_UCONTEXT defined (as one test builds it), ucontext. */
#if defined(__x86_64__) && !defined(PTC_CUDA_EMU_UCONTEXT)
typedef struct ptc_emu_ctx {
    void *sp;
} ptc_emu_ctx;
void ptc_emu_jump(void **save_sp, void *sp) __attribute__((visibility("hidden")));
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".globl ptc_emu_jump\n"
        ".hidden ptc_emu_jump\n"
        ".type ptc_emu_jump, @function\n"
        "ptc_emu_jump:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size ptc_emu_jump, .-ptc_emu_jump\n"
        ".popsection\n"); /* (the section the compiler was in, whatever it was) */
static void ptc_emu_ctx_make(ptc_emu_ctx *c, char *stack, size_t size, void (*entry)(void))
{
    /* from the top (16-byte aligned): a return address entry never uses, entry's address for
     * ptc_emu_jump's ret, six registers for its pops; entry starts as if called */
    void **sp = (void **)(void *)(stack + (size & ~(size_t)15));
    *--sp = NULL;
    *--sp = (void *)(uintptr_t)entry;
    for (int r = 0; r < 6; r++)
        *--sp = NULL;
    c->sp = sp;
}
static inline void ptc_emu_ctx_switch(ptc_emu_ctx *from, ptc_emu_ctx *to)
{
    ptc_emu_jump(&from->sp, to->sp);
}
#else
#include <ucontext.h>
typedef struct ptc_emu_ctx {
    ucontext_t uc;
} ptc_emu_ctx;
static void ptc_emu_ctx_make(ptc_emu_ctx *c, char *stack, size_t size, void (*entry)(void))
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, entry, 0);
}
static inline void ptc_emu_ctx_switch(ptc_emu_ctx *from, ptc_emu_ctx *to)
{
    swapcontext(&from->uc, &to->uc);
}
#endif

static ptc_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
static float ptc_emu_slot[1024];
static unsigned ptc_emu_cur;
static int ptc_emu_epoch; /* the block's barrier intervals so far */
static char ptc_emu_err[512];

/* ---- the race check (see the top of this file) ---- */
#define __shared__ static __attribute__((section("ptc_emu_shared")))
extern char __start_ptc_emu_shared[] __attribute__((weak, visibility("hidden")));
extern char __stop_ptc_emu_shared[] __attribute__((weak, visibility("hidden")));

typedef struct ptc_emu_acc {
    const void *addr;
    unsigned launch; /* the launch that recorded it: entries of earlier ones are free */
    int wb, we, wt;  /* the last write: block, barrier interval, thread (wb < 0: none) */
    int rb, re, rt;  /* the last read, likewise (rt < 0: several threads of that interval) */
    int rblocks;     /* blocks that read it: 1, or 2 for two or more */
    uint64_t wval;   /* the bits the last write stored */
} ptc_emu_acc;

static ptc_emu_acc *ptc_emu_tab;
static size_t ptc_emu_cap, ptc_emu_used; /* slots (a power of 2), entries of this launch */
static unsigned ptc_emu_gen;             /* this launch */
static int ptc_emu_raced;                /* 1: a race, 2: no memory to check */

static size_t ptc_emu_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    return (size_t)x;
}

/* p's entry, a fresh one if this launch has not seen p; NULL without memory */
static ptc_emu_acc *ptc_emu_entry_of(const void *p)
{
    if (2 * (ptc_emu_used + 1) > ptc_emu_cap) {
        size_t cap = ptc_emu_cap ? 2 * ptc_emu_cap : (size_t)1 << 16;
        ptc_emu_acc *t = (ptc_emu_acc *)calloc(cap, sizeof *t);
        if (!t)
            return NULL;
        for (size_t i = 0; i < ptc_emu_cap; i++) {
            if (ptc_emu_tab[i].launch != ptc_emu_gen)
                continue;
            size_t j = ptc_emu_hash(ptc_emu_tab[i].addr) & (cap - 1);
            while (t[j].launch == ptc_emu_gen)
                j = (j + 1) & (cap - 1);
            t[j] = ptc_emu_tab[i];
        }
        free(ptc_emu_tab);
        ptc_emu_tab = t;
        ptc_emu_cap = cap;
    }
    for (size_t i = ptc_emu_hash(p) & (ptc_emu_cap - 1);; i = (i + 1) & (ptc_emu_cap - 1)) {
        ptc_emu_acc *a = &ptc_emu_tab[i];
        if (a->launch != ptc_emu_gen) {
            *a = (ptc_emu_acc){p, ptc_emu_gen, -1, 0, 0, -1, 0, 0, 0, 0};
            ptc_emu_used++;
            return a;
        }
        if (a->addr == p)
            return a;
    }
}

static void ptc_emu_race(const char *what, long long at, const char *fmt, ...)
{
    if (ptc_emu_raced)
        return;
    ptc_emu_raced = 1;
    int n = snprintf(ptc_emu_err, sizeof ptc_emu_err, "a race on %s[%lld]: ", what, at);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof ptc_emu_err)
        vsnprintf(ptc_emu_err + n, sizeof ptc_emu_err - (size_t)n, fmt, ap);
    va_end(ap);
}

/* a 16-byte access (PTC_LDV, PTC_STV) at p: off a 16-byte boundary, the launch fails */
static void ptc_emu_aligned16(const void *p, const char *what)
{
    if (((uintptr_t)p & 15) == 0 || ptc_emu_raced)
        return;
    ptc_emu_raced = 1;
    snprintf(ptc_emu_err, sizeof ptc_emu_err,
             "a 16-byte access to %s at %p, not at a 16-byte boundary (a fault on the GPU)", what,
             p);
}

/* p's entry for an access by block b (a shared word's afresh when b is a new block); NULL,
 * and the check off for the rest of the launch, when a race was found or memory ran out */
static ptc_emu_acc *ptc_emu_acc_for(const void *p, int b)
{
    if (ptc_emu_raced)
        return NULL;
    ptc_emu_acc *a = ptc_emu_entry_of(p);
    if (!a) {
        ptc_emu_raced = 2;
        snprintf(ptc_emu_err, sizeof ptc_emu_err, "no memory for the race check");
        return NULL;
    }
    const char *c = (const char *)p;
    if (c >= __start_ptc_emu_shared && c < __stop_ptc_emu_shared &&
        ((a->wb >= 0 && a->wb != b) || (a->rb >= 0 && a->rb != b)))
        *a = (ptc_emu_acc){p, ptc_emu_gen, -1, 0, 0, -1, 0, 0, 0, 0};
    return a;
}

/* Records a load of p, element (p - base) / size of the array named what; returns p. A race: a
 * write by another block, or by another thread of this block since the last barrier. */
static const void *ptc_emu_load(const void *base, const void *p, size_t size, const char *what)
{
    const int b = (int)blockIdx.x, e = ptc_emu_epoch, t = (int)ptc_emu_cur;
    ptc_emu_acc *a = ptc_emu_acc_for(p, b);
    if (!a)
        return p;
    const long long at = (long long)(((const char *)p - (const char *)base) / (ptrdiff_t)size);
    if (a->wb >= 0 && a->wb != b)
        ptc_emu_race(what, at, "block %d writes it and block %d reads it", a->wb, b);
    else if (a->wb >= 0 && a->we == e && a->wt != t)
        ptc_emu_race(what, at,
                     "thread %d of block %d writes it and thread %d reads it between the same two "
                     "barriers",
                     a->wt, b, t);
    if (a->rb != b) {
        a->rblocks = a->rb < 0 ? 1 : 2;
        a->rb = b, a->re = e, a->rt = t;
    } else if (a->re == e) {
        a->rt = a->rt == t ? t : -1;
    } else {
        a->re = e, a->rt = t;
    }
    return p;
}

/* Records a store of the size bytes at v to p (element (p - base) / size of what) and makes it.
 * A race: a write of other bits by another block, or by another thread since the last barrier;
 * or a read by another block, or another thread since the last barrier, when the store changes
 * the bits there. Stores of the same bits from many threads (the generated code's top-level
 * statements, which every thread runs) leave the same memory in any order. */
static void ptc_emu_store(const void *base, void *p, const void *v, size_t size, const char *what)
{
    const int b = (int)blockIdx.x, e = ptc_emu_epoch, t = (int)ptc_emu_cur;
    ptc_emu_acc *a = ptc_emu_acc_for(p, b);
    uint64_t bits = 0;
    memcpy(&bits, v, size < sizeof bits ? size : sizeof bits);
    if (a) {
        const long long at = (long long)(((const char *)p - (const char *)base) / (ptrdiff_t)size);
        const bool same = a->wval == bits;
        if (a->wb >= 0 && a->wb != b && !same)
            ptc_emu_race(what, at, "blocks %d and %d both write it", a->wb, b);
        else if (a->wb >= 0 && a->we == e && a->wt != t && !same)
            ptc_emu_race(what, at,
                         "threads %d and %d of block %d both write it (other values) between "
                         "the same two barriers",
                         a->wt, t, b);
        if (a->rb >= 0 && memcmp(p, v, size) != 0) {
            if (a->rblocks > 1)
                ptc_emu_race(what, at, "two blocks or more read it and block %d writes it", b);
            else if (a->rb != b)
                ptc_emu_race(what, at, "block %d reads it and block %d writes it", a->rb, b);
            else if (a->re == e && a->rt < 0)
                ptc_emu_race(what, at,
                             "threads of block %d read it and thread %d writes it between the "
                             "same two barriers",
                             b, t);
            else if (a->re == e && a->rt != t)
                ptc_emu_race(what, at,
                             "thread %d of block %d reads it and thread %d writes it between the "
                             "same two barriers",
                             a->rt, b, t);
        }
        a->wb = b, a->we = e, a->wt = t, a->wval = bits;
    }
    memcpy(p, v, size);
}
#define PTC_LD(p, i)                                                                               \
    (*(__typeof__(&(p)[0]))ptc_emu_load((const void *)(p), (const void *)&(p)[i], sizeof *(p), #p))
#define PTC_ST(p, i, v)                                                                            \
    do {                                                                                           \
        __typeof__(&(p)[0]) ptc_emu_p = &(p)[i];                                                   \
        const __typeof__((p)[0]) ptc_emu_v = (v);                                                  \
        ptc_emu_store((const void *)(p), (void *)ptc_emu_p, &ptc_emu_v, sizeof ptc_emu_v, #p);     \
    } while (0)

typedef void (*ptc_emu_fn)(void *const *args);

typedef struct ptc_emu_fiber {
    ptc_emu_ctx ctx;
    int state; /* 0 runnable, 1 waiting at barrier bar, 2 done */
    int bar;
} ptc_emu_fiber;

static ptc_emu_fiber ptc_emu_fibers[1024];
static ptc_emu_ctx ptc_emu_sched;
static const void *ptc_emu_sched_stack; /* the scheduler's stack (the sanitizer's announcements) */
static size_t ptc_emu_sched_size;
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
        ptc_emu_epoch += bar == 0; /* a new interval of the block (a warp's is not one) */
        for (unsigned t = 0; t < blockDim.x; t++)
            if (ptc_emu_fibers[t].state == 1 && ptc_emu_fibers[t].bar == bar)
                ptc_emu_fibers[t].state = 0;
        return;
    }
    unsigned me = ptc_emu_cur;
    ptc_emu_fibers[me].state = 1;
    ptc_emu_fibers[me].bar = bar;
    void *save = NULL;
    PTC_EMU_SWITCH_TO(&save, ptc_emu_sched_stack, ptc_emu_sched_size);
    ptc_emu_ctx_switch(&ptc_emu_fibers[me].ctx, &ptc_emu_sched);
    PTC_EMU_SWITCHED(save, NULL, NULL);
}

static inline void __syncthreads(void)
{
    ptc_emu_wait(0, blockDim.x);
}

/* a barrier of the running thread's warp */
static inline void ptc_emu_warp_wait(void)
{
    ptc_emu_wait(1 + (int)(threadIdx.x >> 5), 32);
}

static inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask)
{
    (void)mask;
    ptc_emu_slot[threadIdx.x] = v;
    ptc_emu_warp_wait();
    float u = ptc_emu_slot[threadIdx.x ^ ((unsigned)lane_mask & 31u)];
    ptc_emu_warp_wait();
    return u;
}

static inline float atomicAdd(float *p, float v)
{
    float old = *p; /* fibers do not run at once */
    *p = old + v;
    return old;
}

/* the fibers' stacks and the race check's table go with the module (dlclose) */
__attribute__((destructor)) static void ptc_emu_unload(void)
{
    free(ptc_emu_stacks);
    free(ptc_emu_tab);
    ptc_emu_stacks = NULL, ptc_emu_tab = NULL;
    ptc_emu_nstacks = ptc_emu_cap = 0;
}

static void ptc_emu_entry(void)
{
    PTC_EMU_SWITCHED(NULL, &ptc_emu_sched_stack, &ptc_emu_sched_size);
    ptc_emu_fn_now(ptc_emu_args_now);
    ptc_emu_fibers[ptc_emu_cur].state = 2;
    PTC_EMU_SWITCH_TO(NULL, ptc_emu_sched_stack, ptc_emu_sched_size); /* (for good) */
    ptc_emu_ctx_switch(&ptc_emu_fibers[ptc_emu_cur].ctx, &ptc_emu_sched);
    abort(); /* (a finished fiber is never resumed) */
}

/* Runs fn on grid blocks of block threads. 0; -1 for a block size the generated code does not
 * take (not a multiple of 32, or above 1024), no memory, or a deadlock; -2 for a race. The
 * reason: ptc_cuda_emu_error(). */
int ptc_cuda_emu_launch(ptc_emu_fn fn, void *const *args, unsigned grid, unsigned block);
const char *ptc_cuda_emu_error(void);

const char *ptc_cuda_emu_error(void)
{
    return ptc_emu_err;
}

int ptc_cuda_emu_launch(ptc_emu_fn fn, void *const *args, unsigned grid, unsigned block)
{
    ptc_emu_err[0] = 0;
    if (block == 0 || block % 32 || block > 1024 || grid == 0) {
        snprintf(ptc_emu_err, sizeof ptc_emu_err, "a launch of %u blocks of %u threads", grid,
                 block);
        return -1;
    }
    if (ptc_emu_nstacks < block) {
        free(ptc_emu_stacks);
        ptc_emu_stacks = (char *)malloc(PTC_EMU_STACK * block);
        ptc_emu_nstacks = ptc_emu_stacks ? block : 0;
        if (!ptc_emu_stacks) {
            snprintf(ptc_emu_err, sizeof ptc_emu_err, "no memory for %u fibers' stacks", block);
            return -1;
        }
    }
    ptc_emu_gen++;
    ptc_emu_used = 0;
    ptc_emu_raced = 0;
    blockDim = (ptc_emu_dim3){block, 1, 1};
    gridDim = (ptc_emu_dim3){grid, 1, 1};
    ptc_emu_fn_now = fn;
    ptc_emu_args_now = args;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = (ptc_emu_dim3){b, 0, 0};
        memset(ptc_emu_arrived, 0, sizeof ptc_emu_arrived);
        ptc_emu_epoch = 0;
        for (unsigned t = 0; t < block; t++) {
            ptc_emu_fiber *f = &ptc_emu_fibers[t];
            ptc_emu_ctx_make(&f->ctx, ptc_emu_stacks + PTC_EMU_STACK * t, PTC_EMU_STACK,
                             ptc_emu_entry);
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
                void *save = NULL;
                PTC_EMU_SWITCH_TO(&save, ptc_emu_stacks + PTC_EMU_STACK * t, PTC_EMU_STACK);
                ptc_emu_ctx_switch(&ptc_emu_sched, &ptc_emu_fibers[t].ctx);
                PTC_EMU_SWITCHED(save, NULL, NULL);
                ran = true;
                done += ptc_emu_fibers[t].state == 2;
            }
            if (!ran) {
                PTC_EMU_STACKS_CLEAN(ptc_emu_stacks, PTC_EMU_STACK * block);
                snprintf(ptc_emu_err, sizeof ptc_emu_err,
                         "a deadlock in block %u: every thread left waits at a barrier that "
                         "some threads of the block never reach",
                         b);
                return -1;
            }
        }
    }
    return ptc_emu_raced == 1 ? -2 : ptc_emu_raced ? -1 : 0;
}

/* The exchange of a warp-wide matrix multiply-add (mma.sync, the tensor-core attention): each
 * lane leaves its A fragment (4 words) and B fragment (2 words) in its warp's slots, and after a
 * barrier of the warp reads all 32 lanes' (the returned rows, lane 0 first); the generated code
 * does the arithmetic, then ptc_emu_mma_done, a second barrier, frees the slots. Exact for code
 * whose every lane reaches the multiply together, as mma.sync requires. */
static unsigned ptc_emu_frag[1024][6];
static inline const unsigned (*ptc_emu_mma_share(const unsigned *a, const unsigned *b))[6]
{
    unsigned *s = ptc_emu_frag[threadIdx.x];
    s[0] = a[0], s[1] = a[1], s[2] = a[2], s[3] = a[3], s[4] = b[0], s[5] = b[1];
    ptc_emu_warp_wait();
    return &ptc_emu_frag[threadIdx.x & ~31u];
}
static inline void ptc_emu_mma_done(void)
{
    ptc_emu_warp_wait();
}

/* The exchange of ldmatrix (the tensor-core attention's fragment loads from shared memory): each
 * lane leaves the address of the row it names, and after a barrier of the warp reads all 32
 * (lane 0 first); the generated code loads its fragment's elements from those rows, then
 * ptc_emu_mma_done frees the slots. */
static const unsigned short *ptc_emu_rowp[1024];
static inline const unsigned short *const *ptc_emu_rows_share(const unsigned short *p)
{
    ptc_emu_rowp[threadIdx.x] = p;
    ptc_emu_warp_wait();
    return &ptc_emu_rowp[threadIdx.x & ~31u];
}

#endif
