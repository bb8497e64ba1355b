/* cpu_pool.c - the worker threads of the fast CPU backend (see cpu_internal.h).
 *
 * One pool for the whole process, sized from --threads (default: the online CPUs). OpenBLAS is
 * kept to one thread (cpu_gemm.c) and the GEMMs are split here instead, so there is one set of
 * threads and no two pools fighting over the same cores.
 *
 * A region is cut into pieces whose bounds depend only on the range, the grain and the thread
 * count; threads (the caller too) claim pieces from one atomic counter until none are left. When a
 * worker is slow to wake or is descheduled (a loaded machine), the others take its pieces instead
 * of waiting for it. Which thread runs a piece never changes what the piece computes, and the
 * pieces are the same when there is no pool to run them: one region runs at a time, and a caller
 * that finds the pool busy (the rank threads of a partitioned plan each run kernels) or that is
 * already inside a region runs the same pieces itself, one after another.
 *
 * Waiting threads spin for a while and then sleep on a condition variable, so an idle process
 * burns no CPU. The spin is 250 us while the pool's threads have the cores to themselves: a
 * training step's regions come every few tens of microseconds to a few hundred, and a worker that
 * has gone to sleep costs the next region a wake-up (a futex call, and the sleeper's wake latency,
 * during which the caller runs the pieces alone). It was 6 us until gpt2 config (a) showed its
 * worker asleep ~100 times a step; at 250 us a few times, and the step 6-10% faster. The spin is
 * the short one where other threads or processes compute on the same cores (ptrt_cpu_pool_shared,
 * or a caller found the pool busy), as a spinning thread would take a core from one of them.
 * PTC_SPIN_NS sets it, for measurements. The spin has no PAUSE instruction on purpose: in a
 * virtual machine a pause loop traps to the hypervisor (pause-loop exiting), which deschedules the
 * vCPU; on a 2-vCPU VM that made every region cost milliseconds.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cpu_internal.h"

#define MAX_THREADS 64
#define SPIN_LONG_NS 250000 /* how long a waiting thread spins before it sleeps: a pool whose */
#define SPIN_SHORT_NS 6000   /* threads have the cores to themselves, and a shared one */
#define SPIN_PREEMPTED_NS 50000 /* a gap between two reads of the clock that means descheduled */
#define PIECES_PER_THREAD 2 /* pieces per thread at most (a little slack for a slow thread) */

/* The claim word: generation (24 bits) | pieces (20 bits) | next piece (20 bits). A thread may
 * run piece `next` of region `generation` only by winning the compare-and-swap that bumps next,
 * so it never runs a piece of a region that has ended. */
#define NEXT_BITS 20
#define PIECES_MAX ((1 << NEXT_BITS) - 1)
#define MASK ((UINT64_C(1) << NEXT_BITS) - 1)

static struct {
    pthread_mutex_t region; /* held by the thread whose region the pool runs */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    int want;    /* threads to use, the caller included; 0 = not chosen yet */
    int started; /* workers running (ids 1 .. started) */
    atomic_uint gen;
    _Atomic uint64_t claim;
    atomic_int finished; /* pieces of the current region done */
    /* the region being run: written before claim is published, read after a piece is won */
    ptrt_cpu_range_fn fn;
    void *ctx;
    int64_t n;
} pool = {.region = PTHREAD_MUTEX_INITIALIZER,
          .mu = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

static _Thread_local bool in_region;
/* Rank threads that found the pool busy and run their region alone, and workers helping with a
 * piece now: a worker helps only while the threads computing (those, the pool's caller and
 * itself) leave it a core. Ranks as threads of one process (a partitioned plan) would otherwise
 * run a region's workers beside the other ranks' lone callers, more threads than cores: dp=2 on
 * 2 cores ran 3 threads, 11% slower than a core each. A pipeline's rank that waits for its
 * neighbour is not computing, so its core goes to the pool. A --threads above the cores still
 * cuts regions into that many threads' pieces, but no more threads than cores run them. */
static atomic_int solo, helping;
static int ncores;
/* set once a caller has found the pool busy, or by ptrt_cpu_pool_shared: other threads or
 * processes compute on these cores, and a long spin would take a core from one of them */
static atomic_bool shared;
static int64_t spin_ns = -1; /* PTC_SPIN_NS, read when the workers start; -1: not set */

typedef struct spin_clock {
    uint64_t until, last; /* until 0: not started */
    unsigned n;
} spin_clock;

/* True while a waiting thread should keep spinning (the clock read every 64 loads). A spin that
 * finds it was descheduled between two reads (the core is wanted by another thread, of this
 * process or another) ends there. */
static bool spinning(spin_clock *sc)
{
    if (++sc->n % 64)
        return true;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    uint64_t now = (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
    if (!sc->until)
        sc->until = now + (uint64_t)(spin_ns >= 0 ? spin_ns
                                     : atomic_load_explicit(&shared, memory_order_relaxed)
                                         ? SPIN_SHORT_NS
                                         : SPIN_LONG_NS);
    else if (now - sc->last > SPIN_PREEMPTED_NS)
        return false;
    sc->last = now;
    return now < sc->until;
}

void ptrt_cpu_pool_shared(void)
{
    atomic_store_explicit(&shared, true, memory_order_relaxed);
}
/* The generation each worker was started at (it must not wait for one already begun). */
static unsigned start_gen[MAX_THREADS];

/* Wins the next piece of region gen; false when the region has none left or has ended. */
static bool claim_piece(unsigned gen, int64_t *piece, int64_t *pieces)
{
    uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        uint64_t g = c >> (2 * NEXT_BITS), np = (c >> NEXT_BITS) & MASK, next = c & MASK;
        if (g != (gen & 0xFFFFFF) || next >= np)
            return false;
        if (atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *piece = (int64_t)next;
            *pieces = (int64_t)np;
            return true;
        }
    }
}

/* A worker may take a piece: the threads computing leave it a core (see solo). */
static bool may_help(void)
{
    int h = atomic_fetch_add_explicit(&helping, 1, memory_order_relaxed);
    if (h + 2 + atomic_load_explicit(&solo, memory_order_relaxed) <= ncores)
        return true;
    atomic_fetch_sub_explicit(&helping, 1, memory_order_relaxed);
    return false;
}

/* Runs pieces of region gen until none are left; a worker (helper) while it may help. */
static void work(unsigned gen, bool helper)
{
    int64_t piece, pieces;
    for (;;) {
        if (helper && !may_help())
            return;
        bool won = claim_piece(gen, &piece, &pieces);
        if (won) {
            int64_t begin = pool.n * piece / pieces, end = pool.n * (piece + 1) / pieces;
            if (begin < end)
                pool.fn(pool.ctx, begin, end);
            if (atomic_fetch_add_explicit(&pool.finished, 1, memory_order_acq_rel) + 1 ==
                pieces) {
                pthread_mutex_lock(&pool.mu);
                pthread_cond_signal(&pool.done);
                pthread_mutex_unlock(&pool.mu);
            }
        }
        if (helper)
            atomic_fetch_sub_explicit(&helping, 1, memory_order_relaxed);
        if (!won)
            return;
    }
}

static void *worker(void *arg)
{
    unsigned seen = start_gen[(intptr_t)arg];
    in_region = true;
    for (;;) {
        unsigned g;
        spin_clock sc = {0};
        while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen) {
            if (spinning(&sc))
                continue;
            pthread_mutex_lock(&pool.mu);
            while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen)
                pthread_cond_wait(&pool.wake, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
            break;
        }
        seen = g;
        work(g, true);
    }
    return NULL;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

void ptrt_cpu_pool_set_threads(int n)
{
    PTC_ASSERT(!in_region);
    pool.want = n < 1 ? online_cpus() : n > MAX_THREADS ? MAX_THREADS : n;
}

static pthread_once_t want_once = PTHREAD_ONCE_INIT;

static void default_want(void)
{
    if (!pool.want)
        pool.want = online_cpus();
}

int ptrt_cpu_threads(void)
{
    pthread_once(&want_once, default_want);
    return pool.want;
}

static pthread_once_t cores_once = PTHREAD_ONCE_INIT;

static void find_cores(void)
{
    ncores = online_cpus();
}

/* Starts workers up to the wanted count; after a lower --threads the extra ones just sleep. */
static void start_workers(void)
{
    if (spin_ns < 0 && !pool.started) {
        const char *e = getenv("PTC_SPIN_NS");
        spin_ns = e && *e ? atoll(e) : -2;
    }
    pthread_once(&cores_once, find_cores);
    while (pool.started + 1 < pool.want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        start_gen[pool.started + 1] = atomic_load_explicit(&pool.gen, memory_order_relaxed);
        int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)(pool.started + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) { /* no more threads: run with the ones there are */
            pool.want = pool.started + 1;
            break;
        }
        pool.started++;
    }
}

void ptrt_cpu_parallel_for(int64_t n, int64_t grain, ptrt_cpu_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    int threads = ptrt_cpu_threads();
    int64_t pieces = n / (grain > 0 ? grain : 1), most = (int64_t)threads * PIECES_PER_THREAD;
    pieces = threads < 2 ? 1 : pieces < most ? pieces : most;
    pieces = pieces < PIECES_MAX ? pieces : PIECES_MAX;
    if (pieces < 2) {
        fn(ctx, 0, n);
        return;
    }
    if (in_region || pthread_mutex_trylock(&pool.region) != 0) {
        bool alone = !in_region; /* another rank's thread, not a piece of this one's region */
        if (alone) {
            atomic_store_explicit(&shared, true, memory_order_relaxed);
            atomic_fetch_add_explicit(&solo, 1, memory_order_relaxed);
        }
        for (int64_t p = 0; p < pieces; p++)
            fn(ctx, n * p / pieces, n * (p + 1) / pieces);
        if (alone)
            atomic_fetch_sub_explicit(&solo, 1, memory_order_relaxed);
        return;
    }
    start_workers();
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    atomic_store_explicit(&pool.finished, 0, memory_order_relaxed);
    unsigned gen = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&pool.claim,
                          ((uint64_t)(gen & 0xFFFFFF) << (2 * NEXT_BITS)) |
                              ((uint64_t)pieces << NEXT_BITS),
                          memory_order_release);
    pthread_mutex_lock(&pool.mu);
    atomic_store_explicit(&pool.gen, gen, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    in_region = true;
    work(gen, false);
    in_region = false;
    spin_clock sc = {0};
    while (atomic_load_explicit(&pool.finished, memory_order_acquire) != pieces) {
        if (spinning(&sc))
            continue;
        pthread_mutex_lock(&pool.mu);
        while (atomic_load_explicit(&pool.finished, memory_order_acquire) != pieces)
            pthread_cond_wait(&pool.done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
        break;
    }
    pthread_mutex_unlock(&pool.region);
}
