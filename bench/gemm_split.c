/* gemm_split.c - can AMX's bf16 GEMMs stand in for f32 ones? Issue 16's configuration (b) is
 * bound by its f32 GEMMs (bench/cpu_train.py's GEMM-only column). This CPU has AMX-BF16, and
 * oneDNN's bf16 GEMM with f32 sums runs about 3x its f32 one on 1024^3 (the runner's measured
 * peaks: 817 against 273 GFLOP/s at 2 threads). One bf16 product is not f32 arithmetic (8
 * significand bits an operand), but split operands are: x = x1 + x2 + x3 in bf16 holds x's 24
 * bits, and the six products x_i y_j with i + j <= 4 give A B to about f32's rounding (the three
 * left out are below 2^-24 of it; cuBLAS's emulated f32 takes all nine). The six run as one bf16
 * GEMM over a 6x longer inner dimension: [A1 A2 A3 A1 A2 A1] [B1; B1; B1; B2; B2; B3]. bf16x3
 * (two-part splits, three products) is shown for scale: fewer products, but about 2^-16
 * accurate, not f32.
 *
 * For every GEMM of the configuration's training step (each weight's forward, input gradient and
 * weight gradient, and the tied head's), through ptc's own CPU GEMM (ptrt_cpu_gemm_instr: oneDNN
 * where installed) on the pool's threads: the f32 GEMM against the split bf16 GEMM (the splitting
 * not timed), best of 3, and each result's largest error against a double product over the
 * result's largest element (over its first 64 rows).
 *
 *   cmake --build build --target gemm_split
 *   build/bench/gemm_split [a|b]          # configuration (default b), PTC_THREADS (default 2)
 *
 * Results: bench/results/gemm_split_*.md. A measurement; nothing fails on its numbers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"
#include "cpu_internal.h"
#include "half.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* x as `parts` bf16 matrices whose sum is x to 8 * parts significand bits */
static void split(const float *x, int64_t n, int parts, uint16_t **out)
{
    float *rest = malloc(sizeof(float) * (size_t)n);
    memcpy(rest, x, sizeof(float) * (size_t)n);
    for (int p = 0; p < parts; p++) {
        out[p] = malloc(sizeof(uint16_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            out[p][i] = ptc_bf16_bits(rest[i]);
            rest[i] -= ptc_bf16_value(out[p][i]);
        }
    }
    free(rest);
}

/* the operands of one bf16 GEMM computing the sum over pairs (i, j) of a_i b_j: A' [m, np k]
 * (the a_i side by side), B' [np k, n] (the b_j stacked) */
static void joined(uint16_t *const *a, uint16_t *const *b, const int (*pairs)[2], int np,
                   int64_t m, int64_t k, int64_t n, uint16_t **ja, uint16_t **jb)
{
    *ja = malloc(sizeof(uint16_t) * (size_t)(m * k * np));
    *jb = malloc(sizeof(uint16_t) * (size_t)(k * n * np));
    for (int q = 0; q < np; q++) {
        for (int64_t i = 0; i < m; i++)
            memcpy(*ja + i * k * np + q * k, a[pairs[q][0]] + i * k, sizeof(uint16_t) * (size_t)k);
        memcpy(*jb + q * k * n, b[pairs[q][1]], sizeof(uint16_t) * (size_t)(k * n));
    }
}

static double best(const ptc_gemm *g, const void *a, const void *b, float *c)
{
    double t = INFINITY;
    for (int r = 0; r < 4; r++) {
        double t0 = now();
        ptrt_cpu_gemm_instr(g, a, b, c);
        double dt = now() - t0;
        if (r > 0 && dt < t)
            t = dt;
    }
    return t;
}

/* largest |c - exact| over the largest |exact| */
static double rel_err(const float *c, const double *exact, int64_t n)
{
    double e = 0, top = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs(c[i] - exact[i]));
        top = fmax(top, fabs(exact[i]));
    }
    return top > 0 ? e / top : e;
}

int main(int argc, char **argv)
{
    /* tokens, d, layers, vocab: issue 16's GPT-2 configurations */
    bool a_cfg = argc > 1 && strcmp(argv[1], "a") == 0;
    int64_t T = 1024, d = a_cfg ? 256 : 768, L = a_cfg ? 4 : 2;
    int64_t V = a_cfg ? 4096 : 8192;
    const char *th = getenv("PTC_THREADS");
    ptrt_cpu_set_threads(th ? atoi(th) : 2);
    if (!ptrt_cpu_has_bf16_gemm()) {
        printf("gemm_split: the GEMM library (%s) has no bf16 GEMM\n", ptrt_cpu_blas_name());
        return 1;
    }
    int64_t w[5][2] = {{d, 3 * d}, {d, d}, {d, 4 * d}, {4 * d, d}, {d, V}};
    static const int six[6][2] = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1}, {0, 2}};
    static const int three[3][2] = {{0, 0}, {1, 0}, {0, 1}};
    double tf = 0, t6 = 0, t3 = 0, ef = 0, e6 = 0, e3 = 0;
    int count = 0;
    printf("# gemm_split: f32 GEMMs against split bf16 ones, configuration (%s), %s, %d threads\n\n",
           a_cfg ? "a" : "b", ptrt_cpu_blas_name(), th ? atoi(th) : 2);
    printf("| m x k x n | f32 ms | bf16x6 ms | bf16x3 ms |\n|---|---|---|---|\n");
    for (int s = 0; s < 5; s++)
        for (int kind = 0; kind < 3; kind++) { /* forward, input gradient, weight gradient */
            int64_t k0 = w[s][0], n0 = w[s][1];
            int64_t m = kind == 2 ? k0 : T, k = kind == 0 ? k0 : kind == 1 ? n0 : T;
            int64_t n = kind == 0 ? n0 : kind == 1 ? k0 : n0;
            int reps = s == 4 ? 1 : (int)L;
            float *A = malloc(sizeof(float) * (size_t)(m * k)), *B = malloc(sizeof(float) * (size_t)(k * n));
            float *C = malloc(sizeof(float) * (size_t)(m * n));
            int64_t mx = m < 64 ? m : 64; /* rows checked against the double product */
            double *X = calloc((size_t)(mx * n), sizeof(double));
            srand(7 + s * 3 + kind);
            for (int64_t i = 0; i < m * k; i++)
                A[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.04f;
            for (int64_t i = 0; i < k * n; i++)
                B[i] = (float)rand() / RAND_MAX - 0.5f;
            for (int64_t i = 0; i < mx; i++)
                for (int64_t p = 0; p < k; p++)
                    for (int64_t j = 0; j < n; j++)
                        X[i * n + j] += (double)A[i * k + p] * B[p * n + j];
            ptc_gemm g = {.m = m, .n = n, .k = k, .batch = 1, .lda = k, .ldb = n, .ldc = n,
                          .alpha = 1, .beta = 0, .ab = PTC_F32};
            double f = best(&g, A, B, C);
            ef = fmax(ef, rel_err(C, X, mx * n));
            uint16_t *as[3], *bs[3], *ja, *jb;
            split(A, m * k, 3, as);
            split(B, k * n, 3, bs);
            double t[2];
            for (int v = 0; v < 2; v++) {
                int np = v == 0 ? 6 : 3;
                joined(as, bs, v == 0 ? six : three, np, m, k, n, &ja, &jb);
                ptc_gemm h = {.m = m, .n = n, .k = np * k, .batch = 1, .lda = np * k, .ldb = n,
                              .ldc = n, .alpha = 1, .beta = 0, .ab = PTC_BF16};
                t[v] = best(&h, ja, jb, C);
                double e = rel_err(C, X, mx * n);
                *(v == 0 ? &e6 : &e3) = fmax(v == 0 ? e6 : e3, e);
                free(ja);
                free(jb);
            }
            printf("| %lld x %lld x %lld (x%d) | %.2f | %.2f | %.2f |\n", (long long)m,
                   (long long)k, (long long)n, reps, f * 1e3, t[0] * 1e3, t[1] * 1e3);
            tf += reps * f;
            t6 += reps * t[0];
            t3 += reps * t[1];
            count += reps;
            for (int p = 0; p < 3; p++) {
                free(as[p]);
                free(bs[p]);
            }
            free(A);
            free(B);
            free(C);
            free(X);
        }
    printf("\n%d GEMMs a step, the splitting not counted:\n\n", count);
    printf("| | f32 | bf16x6 | bf16x3 |\n|---|---|---|---|\n");
    printf("| ms a step | %.1f | %.1f | %.1f |\n", tf * 1e3, t6 * 1e3, t3 * 1e3);
    printf("| against f32 | 1.00x | %.2fx | %.2fx |\n", tf / t6, tf / t3);
    printf("| largest error / largest element | %.1e | %.1e | %.1e |\n", ef, e6, e3);
    return 0;
}
