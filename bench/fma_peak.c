/* fma_peak.c - the FLOP rate of this CPU's FMA units: the ceiling no f32 GEMM can pass.
 *
 *   build/bench/fma_peak [--threads N] [--json]
 *
 * Each of N threads runs 12 independent chains of fused multiply-adds on the widest vectors the
 * CPU has (AVX-512, else AVX2 + FMA, else SSE multiply and add), enough chains to cover the FMA
 * latency on two pipes, for about 0.3 s; the rate is 2 FLOPs per lane per FMA, summed over the
 * threads, the best of five rounds. That is the machine as it runs now (its clock under load, a
 * hypervisor's share), not a datasheet figure: the model name a virtual machine shows (e.g. "AMD
 * EPYC", family 23 model 1) need not be the silicon under it, so the vector width and the clock
 * are measured, not looked up.
 *
 * bench/cpu_train.py runs it to bound a training step from below: the step's GEMM FLOPs (from the
 * executable's --profile) at this rate, with every other op free. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { CHAINS = 12 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* run_<isa>(n): n rounds of CHAINS multiply-adds on vectors of `lanes` floats (GCC's vector
 * extensions; a * b + c contracts to one FMA where the target has it); returns a sum of the
 * chains so that nothing is optimised away */
#define CHAINS_FN(isa, tgt, lanes)                                                                \
    typedef float isa##_v __attribute__((vector_size(4 * (lanes))));                             \
    __attribute__((target(tgt))) static float run_##isa(long n)                                   \
    {                                                                                             \
        isa##_v a[CHAINS], b = (isa##_v){0} + 0.999999f, c = (isa##_v){0} + 1e-7f;                \
        for (int i = 0; i < CHAINS; i++)                                                          \
            a[i] = (isa##_v){0} + (float)i;                                                       \
        for (long r = 0; r < n; r++)                                                              \
            _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++) a[i] = a[i] * b + c;        \
        float s = 0;                                                                              \
        for (int i = 0; i < CHAINS; i++)                                                          \
            for (int l = 0; l < (lanes); l++)                                                     \
                s += a[i][l];                                                                     \
        return s;                                                                                 \
    }
CHAINS_FN(avx512, "avx512f", 16)
CHAINS_FN(avx2, "avx2,fma", 8)
CHAINS_FN(sse, "sse2", 4) /* no FMA: a multiply and an add, counted as the same 2 FLOPs a lane */

typedef struct {
    float (*fn)(long);
    long n;
    double seconds;
    float sum;
    pthread_barrier_t *start;
} job;

static void *worker(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->start);
    double t0 = now();
    j->sum = j->fn(j->n);
    j->seconds = now() - t0;
    return NULL;
}

/* FLOP/s of `threads` threads, each running n rounds, started together; the slowest thread's time
 * (the rate they hold side by side) */
static double round_rate(float (*fn)(long), int lanes, int threads, long n)
{
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    job *j = calloc((size_t)threads, sizeof *j);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        j[i] = (job){.fn = fn, .n = n, .start = &start};
        if (pthread_create(&t[i], NULL, worker, &j[i]) != 0) {
            fprintf(stderr, "fma_peak: cannot start thread %d\n", i);
            exit(1);
        }
    }
    double slowest = 0;
    volatile float sink = 0; /* keeps the sums, so the chains are not optimised away */
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        slowest = j[i].seconds > slowest ? j[i].seconds : slowest;
        sink += j[i].sum;
    }
    pthread_barrier_destroy(&start);
    free(t);
    free(j);
    return slowest > 0 ? (double)threads * (double)n * CHAINS * lanes * 2 / slowest : 0;
}

int main(int argc, char **argv)
{
    int threads = 1;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1024) {
                fprintf(stderr, "fma_peak: --threads wants 1 to 1024, not '%s'\n", argv[i]);
                return 2;
            }
            threads = (int)v;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else {
            fprintf(stderr, "usage: %s [--threads N] [--json]\n", argv[0]);
            return 2;
        }
    }
    __builtin_cpu_init();
    float (*fn)(long) = run_sse;
    int lanes = 4;
    const char *isa = "sse";
    if (__builtin_cpu_supports("avx512f"))
        fn = run_avx512, lanes = 16, isa = "avx512";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        fn = run_avx2, lanes = 8, isa = "avx2+fma";
    /* size a round to about 0.3 s from a short one */
    long n = 1 << 20;
    double r0 = round_rate(fn, lanes, 1, n);
    if (r0 > 0)
        n = (long)(0.3 * r0 / (CHAINS * lanes * 2.0));
    if (n < 1)
        n = 1;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double r = round_rate(fn, lanes, threads, n);
        best = r > best ? r : best;
    }
    if (json)
        printf("{\"isa\": \"%s\", \"threads\": %d, \"gflops\": %.6g}\n", isa, threads, best * 1e-9);
    else
        printf("%s, %d thread%s: %.1f GFLOP/s (f32 FMA peak)\n", isa, threads,
               threads == 1 ? "" : "s", best * 1e-9);
    return 0;
}
