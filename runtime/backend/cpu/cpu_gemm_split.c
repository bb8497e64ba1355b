/* cpu_gemm_split.c - f32 GEMMs on a bf16 GEMM, where the run asks for a lower float32 matmul
 * precision (--matmul-precision, PyTorch's torch.set_float32_matmul_precision):
 *
 *   highest  (the default) the f32 GEMM;
 *   high     each f32 operand as the sum of two bf16 (x = x1 + x2, 16 significand bits), and
 *            the three products x1 y1 + x2 y1 + x1 y2 (x2 y2 is below 2^-16 of the product): one
 *            bf16 GEMM with f32 sums over a 3x longer inner dimension, [A1 A2 A1] [B1; B1; B2].
 *            About 2^-17 accurate;
 *   medium   each operand rounded to bf16, one product: about 2^-8 accurate.
 * On issue 16 (b)'s step GEMMs, 2 threads of this project's Xeon with AMX (bench/gemm_split.c,
 * the splitting included): high 1.19x the f32 GEMMs' speed with 5.2e-6 of the largest element
 * as its largest error (f32: 7.1e-7), medium 3.4x with 2.5e-3. The split takes most of what
 * high's three bf16 products gain (1.43x without it).
 * Taken only where it is faster: high on a CPU with AMX-BF16 (AVX-512-BF16 alone runs bf16 at
 * twice f32's rate, so three products would be slower than one f32 one), medium on one with
 * AVX-512-BF16 or AMX; both need the library's bf16 GEMM (oneDNN). Elsewhere f32 GEMMs stay f32:
 * ptrt_cpu_matmul_precision says which one runs.
 *
 * The joined operands (bf16, 3x (high) the elements of A and B) are made per call into a scratch
 * that each calling thread keeps for its next call, so a step does not map fresh pages for them.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu.h"
#include "cpu_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

/* bit 1: AVX-512-BF16, bit 2: AMX-BF16 (CPUID leaf 7: EAX of subleaf 1 bit 5; EDX of subleaf 0
 * bit 22), asked once (CPUID leaves a virtual machine for its hypervisor: microseconds a call) */
static int bf16_units(void)
{
    static atomic_int units = -1;
    int have = atomic_load_explicit(&units, memory_order_relaxed);
    if (have >= 0)
        return have;
    have = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        if (d & (1u << 22))
            have |= 2;
        if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)))
            have |= 1;
    }
#endif
    atomic_store_explicit(&units, have, memory_order_relaxed);
    return have;
}

static atomic_bool forced;

void ptrt_cpu_matmul_precision_force(bool force)
{
    atomic_store(&forced, force);
}

ptrt_matmul_precision ptrt_cpu_matmul_precision(void)
{
    ptrt_matmul_precision p = ptrt_matmul_precision_asked();
    if (atomic_load(&forced))
        return p;
    if (p == PTRT_MATMUL_HIGHEST || !ptrt_cpu_has_bf16_gemm())
        return PTRT_MATMUL_HIGHEST;
    int units = bf16_units();
    if (p == PTRT_MATMUL_HIGH)
        return units & 2 ? PTRT_MATMUL_HIGH : PTRT_MATMUL_HIGHEST;
    return units ? PTRT_MATMUL_MEDIUM : PTRT_MATMUL_HIGHEST;
}

/* ---- the calling thread's scratch ---- */

typedef struct scratch {
    void *p;
    size_t n;
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *s)
{
    free(((scratch *)s)->p);
    free(s);
}

static void scratch_make_key(void)
{
    PTC_ASSERT(pthread_key_create(&scratch_key, scratch_free) == 0);
}

static void *scratch_get(size_t n)
{
    pthread_once(&scratch_once, scratch_make_key);
    scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = ptc_xcalloc(1, sizeof *s);
        PTC_ASSERT(pthread_setspecific(scratch_key, s) == 0);
    }
    if (s->n < n) {
        free(s->p);
        s->p = ptc_xmalloc(n);
        s->n = n;
    }
    return s->p;
}

/* ---- splitting ---- */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define HAVE_CVTNE 1
/* hi (and lo, when not NULL) of x[0..n) by VCVTNEPS2BF16 (nearest even, as to_bf16; it reads a
 * subnormal input as 0, which moves a part by less than 2^-126) */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static int64_t
parts_cvtne(const float *x, int64_t n, uint16_t *hi, uint16_t *lo)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m256bh h = _mm512_cvtneps_pbh(v);
        _mm256_storeu_si256((__m256i *)(hi + i), (__m256i)h);
        if (lo) {
            __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16);
            __m256bh l = _mm512_cvtneps_pbh(_mm512_sub_ps(v, _mm512_castsi512_ps(w)));
            _mm256_storeu_si256((__m256i *)(lo + i), (__m256i)l);
        }
    }
    return i;
}
#endif

/* x[0..n) as its parts: hi = bf16(x), and lo = bf16(x - hi) when lo is not NULL (the difference
 * is exact in f32) */
static void parts_of(const float *x, int64_t n, uint16_t *hi, uint16_t *lo)
{
    int64_t i = 0;
#ifdef HAVE_CVTNE
    static atomic_int cvtne = -1; /* (threads may find it out at once: the same answer) */
    int have = atomic_load_explicit(&cvtne, memory_order_relaxed);
    if (have < 0) {
        have = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
        atomic_store_explicit(&cvtne, have, memory_order_relaxed);
    }
    if (have)
        i = parts_cvtne(x, n, hi, lo);
#endif
    for (; i < n; i++) {
        uint16_t h = ptrt_to_bf16(x[i]);
        hi[i] = h;
        if (lo)
            lo[i] = ptrt_to_bf16(x[i] - ptrt_bits_f((uint32_t)h << 16));
    }
}

/* The joined operand of one matrix x (rows x cols, rows ld apart): copies of the parts named by
 * which[] (0 hi, 1 lo) side by side when along_cols (o: rows x np cols), else stacked (o: np rows
 * x cols). */
typedef struct join_job {
    const float *x;
    int64_t rows, cols, ld;
    bool along_cols;
    const int *which;
    int np;
    uint16_t *o;
} join_job;

/* (which[0] is 0: the first place takes hi) */
static void join_rows(void *ctx, int64_t begin, int64_t end)
{
    const join_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        uint16_t *dst[3], *lo = NULL;
        for (int q = 0; q < j->np; q++) {
            dst[q] = j->o + (j->along_cols ? r * (j->np * j->cols) + q * j->cols
                                           : (q * j->rows + r) * j->cols);
            if (j->which[q] == 1 && !lo)
                lo = dst[q];
        }
        /* the parts go straight to their first places, then are copied to the others */
        parts_of(j->x + r * j->ld, j->cols, dst[0], lo);
        for (int q = 1; q < j->np; q++)
            if (dst[q] != lo)
                memcpy(dst[q], j->which[q] ? lo : dst[0], sizeof(uint16_t) * (size_t)j->cols);
    }
}

static void join(const float *x, int64_t rows, int64_t cols, int64_t ld, bool along_cols,
                 const int *which, int np, uint16_t *o)
{
    join_job j = {x, rows, cols, ld, along_cols, which, np, o};
    ptrt_cpu_parallel_for(rows, (1 << 14) / (cols + 1) + 1, join_rows, &j);
}

bool ptrt_cpu_gemm_split(const ptc_gemm *g, const float *a, const float *b, float *c)
{
    ptrt_matmul_precision p = ptrt_cpu_matmul_precision();
    if (g->ab != PTC_F32 || g->cd != PTC_F32 || p == PTRT_MATMUL_HIGHEST || g->k < 1 || g->m < 1 ||
        g->n < 1)
        return false;
    /* high: A1 B1 + A2 B1 + A1 B2, as [A1 A2 A1] [B1; B1; B2]; medium: A1 B1 */
    static const int high_a[3] = {0, 1, 0}, high_b[3] = {0, 0, 1}, one[1] = {0};
    int np = p == PTRT_MATMUL_HIGH ? 3 : 1;
    const int *wa = np == 3 ? high_a : one, *wb = np == 3 ? high_b : one;
    int64_t m = g->m, n = g->n, k = g->k, K = np * k;
    size_t na = (size_t)(m * K), nb = (size_t)(K * n);
    uint16_t *ja = scratch_get(sizeof(uint16_t) * (na + nb)), *jb = ja + na;
    ptc_gemm h = *g;
    h.ab = PTC_BF16;
    h.k = K;
    h.lda = g->ta ? m : K;
    h.ldb = g->tb ? K : n;
    h.batch = 1;
    h.sa = h.sb = h.sc = 0;
    for (int64_t bi = 0; bi < g->batch; bi++) {
        /* op(A) is m x k: stored m x k (parts side by side along k) or k x m (stacked) */
        if (bi == 0 || g->sa)
            join(a + bi * g->sa, g->ta ? k : m, g->ta ? m : k, g->lda, !g->ta, wa, np, ja);
        /* op(B) is k x n: stored k x n (parts stacked along k) or n x k (side by side) */
        if (bi == 0 || g->sb)
            join(b + bi * g->sb, g->tb ? n : k, g->tb ? k : n, g->ldb, g->tb, wb, np, jb);
        ptrt_cpu_gemm_instr(&h, ja, jb, c + bi * g->sc);
    }
    return true;
}
