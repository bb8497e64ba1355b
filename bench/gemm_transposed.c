/* gemm_transposed.c - oneDNN's transposed-A sgemm (the weight gradients: dW = X^T dY) against the
 * same product taken as its transpose (C^T = dY^T X, then a transposition), which is what
 * runtime/backend/cpu/cpu_gemm.c does for tall, narrow C. One thread on one thread's piece of C
 * (half the rows, as ptc's pool splits it at 2 threads); best of 7 after a warm-up; the plain
 * product (A already transposed) as the yardstick.
 *
 *   cc -O2 -Iruntime/backend/cpu bench/gemm_transposed.c -o /tmp/gemm_transposed \
 *       build/runtime/libptrt.a build/common/libptc_common.a -ldl -lm -lpthread
 *   /tmp/gemm_transposed
 *
 * Results: bench/results/gemm_transposed_*.md. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void ptrt_cpu_transpose_tiled(const float *x, int64_t ldx, float *o, int64_t ldo, int64_t rows,
                              int64_t cols);
typedef int (*dnnl_t)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                      const float *, int64_t, float, float *, int64_t);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void)
{
    void *h = dlopen("libdnnl.so.2", RTLD_NOW);
    if (!h) {
        printf("libdnnl.so.2: %s\n", dlerror());
        return 1;
    }
    dnnl_t d = (dnnl_t)dlsym(h, "dnnl_sgemm");
    void (*omp)(int) = (void (*)(int))dlsym(h, "omp_set_num_threads");
    if (!d || !omp)
        return 1;
    omp(1);
    /* C[M x N] = A^T B, A [K x M], B [K x N]: gpt2 config (a)'s head, fc and attention weight
     * gradients, config (b)'s, and widths in between */
    static const int64_t shapes[][3] = {
        {4096, 256, 1024}, {1024, 256, 1024}, {256, 256, 1024}, {256, 1024, 1024},
        {8192, 768, 1024}, {3072, 768, 1024}, {768, 768, 1024}, {4096, 128, 1024},
        {4096, 384, 1024}, {4096, 512, 1024}, {4096, 640, 1024}, {4096, 1024, 1024},
        {4096, 256, 4096}};
    printf("%-20s %10s %10s %10s %8s\n", "piece m x n x k", "A^T B ms", "(B^T A)^T", "A B ms",
           "gain");
    for (unsigned s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], m = M / 2;
        float *a = malloc(sizeof(float) * (size_t)(K * M));
        float *b = malloc(sizeof(float) * (size_t)(K * N));
        float *c = malloc(sizeof(float) * (size_t)(m * N));
        float *ct = malloc(sizeof(float) * (size_t)(m * N)); /* C^T */
        float *at = malloc(sizeof(float) * (size_t)(m * K)); /* the piece's A^T */
        for (int64_t i = 0; i < K * M; i++)
            a[i] = (float)(i % 7) * 0.1f;
        for (int64_t i = 0; i < K * N; i++)
            b[i] = (float)(i % 5) * 0.1f;
        ptrt_cpu_transpose_tiled(a, M, at, K, K, m); /* the runtime's, as cpu_gemm.c */
        double best[3] = {1e9, 1e9, 1e9};
        for (int r = 0; r < 8; r++) {
            double t0 = now();
            d('T', 'N', m, N, K, 1, a, M, b, N, 0, c, N);
            double t1 = now();
            d('T', 'N', N, m, K, 1, b, N, a, M, 0, ct, m);
            ptrt_cpu_transpose_tiled(ct, m, c, N, N, m);
            double t2 = now();
            d('N', 'N', m, N, K, 1, at, K, b, N, 0, c, N);
            double t3 = now();
            if (r) {
                best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
                best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
                best[2] = t3 - t2 < best[2] ? t3 - t2 : best[2];
            }
        }
        char name[32];
        snprintf(name, sizeof name, "%ldx%ldx%ld", (long)m, (long)N, (long)K);
        printf("%-20s %10.3f %10.3f %10.3f %7.0f%%\n", name, best[0] * 1e3, best[1] * 1e3,
               best[2] * 1e3, 100.0 * (best[0] - best[1]) / best[0]);
        free(a);
        free(b);
        free(c);
        free(ct);
        free(at);
    }
    return 0;
}
