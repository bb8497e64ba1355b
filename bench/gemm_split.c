/* gemm_split.c - the f32 GEMMs of issue 16's training steps at each float32 matmul precision
 * (--matmul-precision; runtime/backend/cpu/cpu_gemm_split.c): highest (the f32 GEMM), high (each
 * operand split into two bf16, three bf16 products on AMX) and medium (one bf16 product), through
 * ptc's own CPU GEMM instruction (ptrt_cpu_gemm_instr: oneDNN) on the pool's threads, the
 * splitting included, best of 4 after 2 warm-up calls; and each one's largest error against a
 * double product (over the first 64 rows of C) over the largest element.
 *
 * Every GEMM of the step, as the plan has them: each weight's forward (x W), input gradient
 * (dy W^T: tb) and weight gradient (x^T dy: ta), and the tied head's.
 *
 *   cmake --build build --target gemm_split
 *   build/bench/gemm_split [a|b]          # configuration (default b), PTC_THREADS (default 2)
 *   build/bench/gemm_split [a|b] --route  # f32 only, by library where oneDNN and OpenBLAS are
 *                                         # both open: oneDNN, OpenBLAS, the rule
 *                                         # (cpu_gemm.c's piece_to_openblas)
 *
 * Results: bench/results/gemm_split_*.md. A measurement; nothing fails on its numbers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu.h"
#include "cpu_internal.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double best(const ptc_gemm *g, const float *a, const float *b, float *c)
{
    double t = INFINITY;
    for (int r = 0; r < 10; r++) { /* (oneDNN makes a shape's kernel in a thread's first calls) */
        double t0 = now();
        ptrt_cpu_gemm_instr(g, a, b, c);
        double dt = now() - t0;
        if (r > 1 && dt < t)
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
    bool route = argc > 2 && strcmp(argv[2], "--route") == 0;
    int64_t T = 1024, d = a_cfg ? 256 : 768, L = a_cfg ? 4 : 2, V = a_cfg ? 4096 : 8192;
    const char *th = getenv("PTC_THREADS");
    ptrt_cpu_set_threads(th ? atoi(th) : 2);
    static const ptrt_matmul_precision P[3] = {PTRT_MATMUL_HIGHEST, PTRT_MATMUL_HIGH,
                                               PTRT_MATMUL_MEDIUM};
    /* the library of each column under --route */
    static const int R[3] = {PTRT_GEMM_ROUTE_ONEDNN, PTRT_GEMM_ROUTE_OPENBLAS,
                             PTRT_GEMM_ROUTE_RULE};
    const char *ran[3];
    for (int p = 0; p < 3; p++) {
        ptrt_set_matmul_precision(P[p]);
        ran[p] = ptrt_matmul_precision_name(ptrt_cpu_matmul_precision());
    }
    /* --route compares f32 GEMMs: the probe above left the precision at medium (bf16 products
     * where the CPU has them, which ran this mode at twice the FMA rate, 2.7e-3 off, on a Zen 5) */
    ptrt_set_matmul_precision(PTRT_MATMUL_HIGHEST);
    if (route) {
        printf("# gemm_split --route: configuration (%s)'s f32 GEMMs by library, %s, %d "
               "threads\n\n",
               a_cfg ? "a" : "b", ptrt_cpu_blas_name(), th ? atoi(th) : 2);
        if (strcmp(ptrt_cpu_blas_name(), "onednn+openblas") != 0)
            printf("(one library is open: the three columns run the same GEMM)\n\n");
        printf("| GEMM (m x n x k) | oneDNN ms | OpenBLAS ms | rule ms |\n|---|---|---|---|\n");
    } else {
        printf("# gemm_split: configuration (%s)'s f32 GEMMs by matmul precision, %s, %d "
               "threads\n\n(the precision that ran: %s, %s, %s)\n\n",
               a_cfg ? "a" : "b", ptrt_cpu_blas_name(), th ? atoi(th) : 2, ran[0], ran[1],
               ran[2]);
        printf("| GEMM (m x n x k) | highest ms | high ms | medium ms |\n|---|---|---|---|\n");
    }
    int64_t w[5][2] = {{d, 3 * d}, {d, d}, {d, 4 * d}, {4 * d, d}, {d, V}};
    double tot[3] = {0}, err[3] = {0};
    int count = 0;
    for (int s = 0; s < 5; s++)
        for (int kind = 0; kind < 3; kind++) { /* x W, dy W^T, x^T dy */
            int64_t din = w[s][0], dout = w[s][1], reps = s == 4 ? 1 : L;
            ptc_gemm g = {.ta = kind == 2, .tb = kind == 1, .batch = 1, .alpha = 1};
            g.m = kind == 2 ? din : T;
            g.n = kind == 1 ? din : dout;
            g.k = kind == 0 ? din : kind == 1 ? dout : T;
            g.lda = g.ta ? g.m : g.k;
            g.ldb = g.tb ? g.k : g.n;
            g.ldc = g.n;
            float *A = malloc(sizeof(float) * (size_t)(g.m * g.k));
            float *B = malloc(sizeof(float) * (size_t)(g.k * g.n));
            float *C = malloc(sizeof(float) * (size_t)(g.m * g.n));
            srand(7 + s * 3 + kind);
            for (int64_t i = 0; i < g.m * g.k; i++)
                A[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.04f;
            for (int64_t i = 0; i < g.k * g.n; i++)
                B[i] = (float)rand() / RAND_MAX - 0.5f;
            int64_t mx = g.m < 64 ? g.m : 64; /* rows checked against the double product */
            double *X = calloc((size_t)(mx * g.n), sizeof(double));
            for (int64_t i = 0; i < mx; i++)
                for (int64_t p = 0; p < g.k; p++) {
                    double a = g.ta ? A[p * g.lda + i] : A[i * g.lda + p];
                    for (int64_t j = 0; j < g.n; j++)
                        X[i * g.n + j] += a * (g.tb ? B[j * g.ldb + p] : B[p * g.ldb + j]);
                }
            double t[3];
            for (int p = 0; p < 3; p++) {
                if (route)
                    ptrt_cpu_gemm_route = R[p];
                else
                    ptrt_set_matmul_precision(P[p]);
                t[p] = best(&g, A, B, C);
                err[p] = fmax(err[p], rel_err(C, X, mx * g.n));
                tot[p] += (double)reps * t[p];
            }
            count += (int)reps;
            printf("| %s%lld x %lld x %lld (x%lld) | %.2f | %.2f | %.2f |\n",
                   kind == 0   ? "x W: "
                   : kind == 1 ? "dy W^T: "
                               : "x^T dy: ",
                   (long long)g.m, (long long)g.n, (long long)g.k, (long long)reps, t[0] * 1e3,
                   t[1] * 1e3, t[2] * 1e3);
            free(A);
            free(B);
            free(C);
            free(X);
        }
    ptrt_set_matmul_precision(PTRT_MATMUL_HIGHEST);
    ptrt_cpu_gemm_route = PTRT_GEMM_ROUTE_RULE;
    printf("\n%d GEMMs a step:\n\n| | %s |\n|---|---|---|---|\n", count,
           route ? "oneDNN | OpenBLAS | rule" : "highest | high | medium");
    printf("| ms a step | %.1f | %.1f | %.1f |\n", tot[0] * 1e3, tot[1] * 1e3, tot[2] * 1e3);
    printf("| against the first | 1.00x | %.2fx | %.2fx |\n", tot[0] / tot[1], tot[0] / tot[2]);
    printf("| largest error / largest element | %.1e | %.1e | %.1e |\n", err[0], err[1], err[2]);
    return 0;
}
