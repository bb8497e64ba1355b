/* gemm_generated.c - GEMMs generated from the kernel IR through LLVM (codegen/llvm, the jit
 * backend's path: default<O3>, host CPU, 512-bit vectors) against the library GEMM the cpu
 * backend runs (oneDNN where installed: runtime/backend/cpu/cpu_gemm.c), one thread each, on the
 * issue-16 shapes that bench/gemm_libraries.c times. It is the measurement behind keeping library
 * GEMMs: the kernel IR has loop nests, loads, stores and reductions, and no packing or register
 * tiling, so a GEMM written in it is what LLVM's vectorizer makes of the loop nest.
 *
 * Each product is written in the IR in the loop order that suits its layout:
 *   NN, TN  C = A B, C = A^T B: per block of R rows of C (R = 4, 2 or 1, what divides m), for
 *           each p < k the R values of A broadcast against row p of B and accumulated into the
 *           R rows of C (i-k-j order: unit stride over j, R rows share each load of B);
 *   NT      C = A B^T: each element a dot product over k, rows of A and B both unit stride (a
 *           vectorized sum).
 *
 *   cmake --build build --target gemm_generated
 *   build/bench/gemm_generated                  # the shapes, GFLOP/s of both, best of 5
 *   build/bench/gemm_generated --check          # small odd shapes (1, primes): the generated
 *                                               # GEMMs against the library's (ctest)
 *
 * Results: bench/results/gemm_generated_*.md. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"
#include "cpu_internal.h"
#include "kir.h"
#include "kjit.h"

typedef struct {
    int64_t m, n, k;
    bool ta, tb;
    const char *what;
} shape;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The kernel IR text of C = op(A) op(B) for a row-major shape (see the top of the file). */
static char *gemm_text(const shape *g)
{
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    if (!f)
        abort();
    int64_t m = g->m, n = g->n, k = g->k;
    fprintf(f, "kernel gemm(a: f32[%lld], b: f32[%lld], c: out f32[%lld]) {\n", (long long)(m * k),
            (long long)(k * n), (long long)(m * n));
    if (g->tb) {
        /* NT (A not transposed: the shapes with B^T have plain A) */
        fprintf(f,
                "for i < %lld parallel {\n for j < %lld {\n"
                "  c[i * %lld + j] = sum(p < %lld: a[i * %lld + p] * b[j * %lld + p])\n }\n}\n}\n",
                (long long)m, (long long)n, (long long)n, (long long)k, (long long)k, (long long)k);
        fclose(f);
        return s;
    }
    int r = m % 4 == 0 ? 4 : m % 2 == 0 ? 2 : 1;
    fprintf(f, "for i < %lld parallel {\n", (long long)(m / r));
    for (int q = 0; q < r; q++)
        fprintf(f, " for j < %lld {\n  c[(i * %d + %d) * %lld + j] = 0.0\n }\n", (long long)n, r, q,
                (long long)n);
    fprintf(f, " for p < %lld {\n", (long long)k);
    for (int q = 0; q < r; q++) {
        if (g->ta)
            fprintf(f, "  let a%d = a[p * %lld + i * %d + %d]\n", q, (long long)m, r, q);
        else
            fprintf(f, "  let a%d = a[(i * %d + %d) * %lld + p]\n", q, r, q, (long long)k);
    }
    fprintf(f, "  for j < %lld {\n   let bj = b[p * %lld + j]\n", (long long)n, (long long)n);
    for (int q = 0; q < r; q++)
        fprintf(f, "   c[(i * %d + %d) * %lld + j] = c[(i * %d + %d) * %lld + j] + a%d * bj\n", r,
                q, (long long)n, r, q, (long long)n, q);
    fprintf(f, "  }\n }\n}\n}\n");
    fclose(f);
    return s;
}

static ptc_kfn compile(const shape *g)
{
    char err[1024];
    char *text = gemm_text(g);
    ptc_kir *k = ptc_kir_parse_text(text, err, sizeof err);
    free(text);
    if (!k) {
        fprintf(stderr, "gemm_generated: kernel text: %s\n", err);
        exit(2);
    }
    ptc_kfn f = ptc_kjit_get(k, "", err, sizeof err);
    ptc_kir_free(k);
    if (!f) {
        fprintf(stderr, "gemm_generated: compile: %s\n", err);
        exit(2);
    }
    return f;
}

static void library(const shape *g, const float *a, const float *b, float *c)
{
    ptrt_cpu_gemm_serial(g->ta, g->tb, g->m, g->n, g->k, 1.0f, a, g->ta ? g->m : g->k, b,
                         g->tb ? g->k : g->n, 0.0f, c, g->n);
}

static float *filled(int64_t n, unsigned seed)
{
    float *x = malloc((size_t)n * sizeof(float));
    if (!x)
        abort();
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f;
    }
    return x;
}

/* Largest |generated - library| over the largest |library|, for one shape. */
static double compare(const shape *g, ptc_kfn f, double *gen_s, double *lib_s, int reps)
{
    float *a = filled(g->m * g->k, 1), *b = filled(g->k * g->n, 2);
    float *c = calloc((size_t)(g->m * g->n), sizeof(float));
    float *r = calloc((size_t)(g->m * g->n), sizeof(float));
    if (!c || !r)
        abort();
    void *args[3] = {a, b, c};
    double bg = 1e30, bl = 1e30;
    for (int i = 0; i <= reps; i++) { /* run 0 warms up */
        double t = now();
        f(args, 0, 1);
        t = now() - t;
        if (i && t < bg)
            bg = t;
        t = now();
        library(g, a, b, r);
        t = now() - t;
        if (i && t < bl)
            bl = t;
    }
    double diff = 0, big = 0;
    for (int64_t i = 0; i < g->m * g->n; i++) {
        diff = fmax(diff, fabs((double)c[i] - r[i]));
        big = fmax(big, fabs((double)r[i]));
    }
    free(a), free(b), free(c), free(r);
    *gen_s = bg, *lib_s = bl;
    return big > 0 ? diff / big : diff;
}

int main(int argc, char **argv)
{
    bool check = argc > 1 && strcmp(argv[1], "--check") == 0;
    if (argc > 2 || (argc == 2 && !check)) {
        fprintf(stderr, "usage: gemm_generated [--check]\n");
        return 2;
    }
    ptrt_cpu_set_threads(1);
    static const shape bench[] = {
        {1024, 1024, 1024, false, false, "1024^3"},
        {1024, 2304, 768, false, false, "(b) qkv"},
        {1024, 768, 3072, false, false, "(b) mlp proj"},
        {1024, 8192, 768, false, true, "(b) logits, B^T"},
        {768, 3072, 1024, true, false, "(b) weight grad, A^T"},
        {1024, 768, 768, false, true, "(b) B^T"},
        {1024, 768, 256, false, false, "(a) qkv"},
        {1024, 4096, 256, false, true, "(a) logits, B^T"},
        {256, 1024, 1024, true, false, "(a) weight grad, A^T"},
    };
    static const shape small[] = {
        {1, 1, 1, false, false, ""},  {7, 13, 5, false, false, ""},  {13, 1, 17, false, true, ""},
        {6, 31, 1, true, false, ""},  {1, 29, 37, false, false, ""}, {41, 3, 2, false, true, ""},
        {9, 10, 23, true, false, ""}, {12, 7, 19, false, false, ""},
    };
    const shape *sh = check ? small : bench;
    int nsh = check ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof bench / sizeof bench[0]);
    char target[256];
    ptc_kjit_target(target, sizeof target);
    bool avx512 = strstr(target, "+avx512f") != NULL;
    char *features = strchr(strchr(target, ',') ? strchr(target, ',') + 2 : target, ' ');
    if (features) /* "LLVM 14.0, rocketlake +avx512f,...": the name, then the width */
        snprintf(features, sizeof target - (size_t)(features - target), "%s",
                 avx512 ? " (AVX-512)" : "");
    if (!check)
        printf("generated: %s; library: %s; one thread, GFLOP/s, best of 5 after a warm-up\n\n"
               "| shape (m x n x k) | | generated | library | generated / library |\n"
               "|---|---|---|---|---|\n",
               target, ptrt_cpu_blas_name());
    double gt = 0, lt = 0, flops = 0;
    int bad = 0;
    for (int s = 0; s < nsh; s++) {
        const shape *g = &sh[s];
        ptc_kfn f = compile(g);
        double gs, ls;
        double err = compare(g, f, &gs, &ls, check ? 1 : 5);
        /* f32 sums in another order: k * 2^-24 relative to the operands, with room */
        double tol = 4e-7 * (double)(g->k + 8);
        if (!(err <= tol)) {
            printf("%lld x %lld x %lld %s%s: generated differs from the library by %.3g "
                   "(of its largest value; at most %.3g)\n",
                   (long long)g->m, (long long)g->n, (long long)g->k, g->ta ? "A^T" : "",
                   g->tb ? "B^T" : "", err, tol);
            bad++;
        }
        double fl = 2.0 * (double)g->m * (double)g->n * (double)g->k;
        if (!check)
            printf("| %lld x %lld x %lld | %s | %.1f | %.1f | %.2f |\n", (long long)g->m,
                   (long long)g->n, (long long)g->k, g->what, fl / gs / 1e9, fl / ls / 1e9,
                   ls / gs);
        gt += gs, lt += ls, flops += fl;
    }
    if (!check)
        printf("| all | | %.1f | %.1f | %.2f |\n", flops / gt / 1e9, flops / lt / 1e9, lt / gt);
    else if (!bad)
        printf("gemm_generated: %d shapes match the library\n", nsh);
    return bad ? 1 : 0;
}
