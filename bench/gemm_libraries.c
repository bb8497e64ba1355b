/* gemm_libraries.c - the sgemm of each GEMM library the registries offer, on the shapes of the
 * issue-16 GPT-2 configurations (forward, and the transposed products of the backward), opened
 * with dlopen: OpenBLAS, BLIS, oneDNN (Debian) and MKL (PyPI's mkl). Prints GFLOP/s per shape and
 * over all of them (best of 5 runs after a warm-up).
 *
 *   cc -O2 bench/gemm_libraries.c -o /tmp/gemm_libraries -ldl
 *   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 BLIS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
 *       /tmp/gemm_libraries libopenblas.so.0     # (or libblis.so.4, libdnnl.so.2, .../libmkl_rt.so.3)
 *
 * ptc runs one single-threaded sgemm per thread on a piece of C (runtime/backend/cpu/cpu_gemm.c),
 * so the one-thread figures are the ones that decide. Results: bench/results/gemm_libraries_*.md. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef void (*cblas_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
typedef int (*dnnl_t)(char, char, long, long, long, float, const float *, long, const float *, long, float, float *, long);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc, char **argv) {
  const char *lib = argv[1]; int isdnnl = strstr(lib, "dnnl") != NULL;
  void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL); if (!h) { printf("%s: %s\n", lib, dlerror()); return 1; }
  cblas_t g = isdnnl ? NULL : (cblas_t)dlsym(h, "cblas_sgemm"); dnnl_t d = isdnnl ? (dnnl_t)dlsym(h, "dnnl_sgemm") : NULL;
  if (!g && !d) { printf("no sgemm\n"); return 1; }
  /* m n k ta tb */
  int shapes[][5] = {{1024,1024,1024,0,0},{1024,2304,768,0,0},{1024,768,3072,0,0},{1024,8192,768,0,1},{768,3072,1024,1,0},{1024,768,768,0,1},{1024,768,256,0,0},{1024,4096,256,0,1},{256,1024,1024,1,0}};
  double tot = 0, flops = 0;
  printf("%-40s", lib);
  for (unsigned s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], ta = shapes[s][3], tb = shapes[s][4];
    float *a = malloc(4L*m*k), *b = malloc(4L*k*n), *c = malloc(4L*m*n);
    for (long i = 0; i < (long)m*k; i++) a[i] = (i % 7) * 0.1f; for (long i = 0; i < (long)k*n; i++) b[i] = (i % 5) * 0.1f;
    int lda = ta ? m : k, ldb = tb ? k : n;
    double best = 1e9;
    for (int r = 0; r < 6; r++) { double t = now();
      if (g) g(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1, a, lda, b, ldb, 0, c, n);
      else d(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1, a, lda, b, ldb, 0, c, n);
      t = now() - t; if (r && t < best) best = t; }
    printf(" %6.1f", 2.0*m*n*k/best/1e9); tot += best; flops += 2.0*m*n*k;
    free(a); free(b); free(c);
  }
  printf(" | all %6.1f GFLOP/s\n", flops / tot / 1e9);
  return 0;
}
