/* peak.c - the CPU's FLOP rate the runner's MFU is taken against (see peak.h). */
#include "peak.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu.h"
#include "file.h"
#include "half.h"
#include "util.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The CPU's FLOP rate for MFU, where no --peak-flops is given: after one to warm up (threads,
 * pages), the best of three GEMMs of 1024^3 on the backend's threads, about 0.1 s (what the
 * machine's BLAS reaches on a large square product: a practical peak, below the vector units'
 * nominal one); over bf16 operands where the plan's GEMMs run on the library's bf16 GEMM (AMX or
 * AVX-512-BF16 reach several times the f32 rate, and a plan in bf16 against the f32 peak would
 * show an MFU above 100%). */
static double measure_gemm(bool bf16)
{
    enum { N = 1024 };
    size_t es = bf16 ? 2 : 4;
    char *a = ptc_xcalloc((size_t)N * N * 2, es), *b = a + (size_t)N * N * es;
    float *c = ptc_xcalloc((size_t)N * N, sizeof(float));
    for (int i = 0; i < N * N; i++) {
        float v = (float)((i % 7) - 3) * 0.25f; /* (exact in bf16) */
        if (bf16)
            ((uint16_t *)a)[i] = ((uint16_t *)b)[i] = ptc_bf16_bits(v);
        else
            ((float *)a)[i] = ((float *)b)[i] = v;
    }
    ptc_gemm g = {.m = N,
                  .n = N,
                  .k = N,
                  .batch = 1,
                  .lda = N,
                  .ldb = N,
                  .ldc = N,
                  .alpha = 1,
                  .beta = 0,
                  .ab = bf16 ? PTC_BF16 : PTC_F32};
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = now();
        ptrt_backend_cpu.gemm(&g, a, b, c);
        double dt = now() - t0;
        if (rep > 0 && dt > 0 && 2.0 * N * N * N / dt > best)
            best = 2.0 * N * N * N / dt;
    }
    free(a);
    free(c);
    return best;
}

bool ptrt_peak_bf16(const ptc_plan *p)
{
    for (int k = 0; k < p->nprograms; k++)
        for (int i = 0; i < p->programs[k].ninstrs; i++) {
            const ptc_instr *in = &p->programs[k].instrs[i];
            if (in->kind == PTC_INSTR_GEMM)
                return in->gemm.ab == PTC_BF16 && ptrt_cpu_has_bf16_gemm();
        }
    return false;
}

/* Where measure_gemm's figure is kept: beside the kernel cache ($XDG_CACHE_HOME/ptc or
 * ~/.cache/ptc), by the CPU's model name, the GEMM library, the operands' dtype, the float32
 * matmul precision and the thread count, so that a machine measures it once and not every start
 * (runs of a test suite start thousands of times). False where there is no cache directory. */
static bool peak_path(int threads, bool bf16, char *path, size_t n)
{
    char dir[2048], cpu[256] = "?", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            ptc_fmt(cpu, sizeof cpu, "%s", line);
            break;
        }
    if (f)
        fclose(f);
    /* (and by the GEMM library: each has its own peak) */
    size_t cl = strlen(cpu);
    ptc_fmt(cpu + cl, sizeof cpu - cl, " %s", ptrt_cpu_blas_name());
    if (!ptc_file_cache_dir("", dir, sizeof dir))
        return false;
    ptc_fmt(path, n, "%s/peak_flops_%016llx_t%d%s", dir,
            (unsigned long long)ptc_hash64(cpu, strlen(cpu), 0x70656b), threads,
            bf16                                                 ? "_bf16"
            : ptrt_cpu_matmul_precision() == PTRT_MATMUL_HIGHEST ? ""
            : ptrt_cpu_matmul_precision() == PTRT_MATMUL_HIGH    ? "_f32high"
                                                                 : "_f32medium");
    return true;
}

static void keep(const char *path, double v)
{
    char buf[64], err[256];
    int n = snprintf(buf, sizeof buf, "%.6g\n", v);
    ptc_file_write_file(path, buf, (size_t)n, err, sizeof err);
}

/* the figure kept at path, or 0 */
static double kept(const char *path)
{
    size_t len;
    char *text = ptc_read_file_max(path, 64, &len);
    double v = text ? strtod(text, NULL) : 0;
    free(text);
    return v > 0 && isfinite(v) ? v : 0;
}

/* (peak.h) measure_gemm, kept (peak_path); a cache that cannot be read or written costs only
 * the measurement. */
double ptrt_peak_flops(int threads, bool bf16)
{
    char path[2400];
    bool cached = peak_path(threads, bf16, path, sizeof path);
    double v = cached ? kept(path) : 0;
    if (v > 0)
        return v;
    v = measure_gemm(bf16);
    if (cached)
        keep(path, v);
    return v;
}

/* (peak.h) (never a measurement: this runs between steps) */
void ptrt_peak_flops_seen(int threads, bool bf16, double rate)
{
    char path[2400];
    if (rate > 0 && isfinite(rate) && peak_path(threads, bf16, path, sizeof path) &&
        rate > kept(path))
        keep(path, rate);
}
