/* attention_generated.c - attention written in the kernel IR (codegen/kir_attention.c), compiled
 * through LLVM as the jit backend compiles fused kernels, against the cpu backend's hand-written
 * attention (runtime/backend/cpu/cpu_attention.c: register-blocked block products), forward and
 * backward, on the issue-16 configurations' attention shapes, on the pool's threads (2 unless
 * PTC_THREADS says otherwise), run as the jit backend runs a fused kernel (ptrt_jit_run). It is the
 * measurement behind keeping the C kernels on the CPU.
 *
 *   cmake --build build --target attention_generated
 *   build/bench/attention_generated          # ms of each, best of 5
 *
 * Results: bench/results/attention_generated_*.md. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu.h"
#include "cpu_internal.h"
#include "kir_attention.h"
#include "kjit.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *randoms(int64_t n)
{
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    return x;
}

int main(void)
{
    const char *env = getenv("PTC_THREADS");
    ptrt_cpu_pool_set_threads(env ? atoi(env) : 2);
    static const struct {
        const char *what;
        ptc_kir_attn a;
    } cases[] = {
        {"issue16 (a): b8 s128 h4 dh64 causal", {8, 128, 128, 4, 4, 64, true}},
        {"issue16 (b): b4 s256 h12 dh64 causal", {4, 256, 256, 12, 12, 64, true}},
    };
    printf("attention: the kernel IR through LLVM vs the C kernels, %d threads, best of 5 (ms)\n",
           ptrt_cpu_threads());
    printf("| shape | C forward | IR forward | C backward | IR backward (stats + dq + dkv) |\n");
    printf("|---|---|---|---|---|\n");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const ptc_kir_attn *a = &cases[c].a;
        int64_t qf = a->heads * a->head_dim, kf = a->kv_heads * a->head_dim;
        int64_t nq = a->batch * a->seq * qf, nk = a->batch * a->kv_seq * kf;
        int64_t ns = a->batch * a->heads * a->seq;
        float *q = randoms(nq), *k = randoms(nk), *v = randoms(nk), *dy = randoms(nq);
        float *o = randoms(nq), *dq = randoms(nq), *dk = randoms(nk), *dv = randoms(nk);
        float *lse = randoms(ns), *ds = randoms(ns);
        ptc_type tq = {PTC_F32, 3, {a->batch, a->seq, qf}};
        ptc_type tk = {PTC_F32, 3, {a->batch, a->kv_seq, kf}};
        ptc_kfn fn[PTC_KIR_ATTN_NKERNELS];
        char err[1024];
        for (int w = 0; w < PTC_KIR_ATTN_NKERNELS; w++) {
            ptc_kir *kk = ptc_kir_attention(a, (ptc_kir_attn_kernel)w, "bench", err, sizeof err);
            if (!kk || !(fn[w] = ptc_kjit_get(kk, "", err, sizeof err))) {
                fprintf(stderr, "attention_generated: %s\n", err);
                return 1;
            }
            ptc_kir_free(kk);
        }
        double best[4] = {1e9, 1e9, 1e9, 1e9};
        int64_t nt = ptrt_cpu_threads();
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now();
            ptrt_cpu_attention((ptc_type[]){tq, tk, tk}, (void *const[]){q, k, v}, &tq, o,
                               a->heads, a->kv_heads, a->causal);
            double t1 = now();
            ptrt_jit_run(fn[PTC_KIR_ATTN_FWD], (void *const[]){q, k, v, o, NULL, NULL}, nt);
            double t2 = now();
            ptrt_cpu_attention_grad((ptc_type[]){tq, tk, tk, tq}, (void *const[]){q, k, v, dy},
                                    (ptc_type[]){tq, tk, tk}, (void *const[]){dq, dk, dv},
                                    a->heads, a->kv_heads, a->causal);
            double t3 = now();
            ptrt_jit_run(fn[PTC_KIR_ATTN_STATS], (void *const[]){q, k, v, dy, lse, ds}, nt);
            ptrt_jit_run(fn[PTC_KIR_ATTN_DQ], (void *const[]){q, k, v, dy, lse, ds, dq, NULL}, nt);
            ptrt_jit_run(fn[PTC_KIR_ATTN_DKV],
                         (void *const[]){q, k, v, dy, lse, ds, dk, dv, NULL, NULL}, nt);
            double t4 = now(), d[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3};
            for (int i = 0; i < 4; i++)
                best[i] = d[i] < best[i] ? d[i] : best[i];
        }
        printf("| %s | %.2f | %.2f (%.1fx) | %.2f | %.2f (%.1fx) |\n", cases[c].what, 1e3 * best[0],
               1e3 * best[1], best[1] / best[0], 1e3 * best[2], 1e3 * best[3], best[3] / best[2]);
        free(q), free(k), free(v), free(dy), free(o), free(dq), free(dk), free(dv), free(lse);
        free(ds);
    }
    return 0;
}
