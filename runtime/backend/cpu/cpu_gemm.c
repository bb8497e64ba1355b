/* cpu_gemm.c - GEMM and matmul for the fast CPU backend.
 *
 * The GEMM is a library's sgemm kept to one thread; the pool splits C by rows or columns into
 * pieces of whole 16-wide blocks, one sgemm each. The split depends only on the shapes and the
 * thread count, so a run repeats bit for bit; a library's edge tiles may round differently when
 * the split points move, so two thread counts may differ in the last bit.
 *
 * The library is opened with dlopen at the first GEMM: the first of oneDNN's dnnl_sgemm
 * (Debian's libdnnl2), OpenBLAS's cblas_sgemm and a plain loop (same contract, slow) that is
 * there. oneDNN comes first because it picks its kernels for the CPU it runs on by itself; OpenBLAS
 * runs the kernels OPENBLAS_CORETYPE names where that is set (this project's build machines pin
 * Haswell's AVX2 kernels, as older OpenBLAS builds failed on their processors), and it is left as
 * set. Measured on this project's shapes, one thread (bench/results/gemm_libraries_2026-11-24.md,
 * Xeon with AVX-512): oneDNN 87 GFLOP/s, OpenBLAS 50 with Haswell's kernels and 91 with the
 * Cooperlake ones it detects when not pinned, MKL (PyPI only) 89. On a CPU without AVX-512
 * oneDNN runs its AVX2 sgemm, which is as fast as OpenBLAS's Haswell kernels on wide pieces and
 * up to twice as slow on narrow ones and on weight gradients (Zen 3: 34 against 77 GFLOP/s on
 * config (a)'s head gradient): there both are opened and piece_to_openblas sends a piece to the
 * faster one (bench/results/gemm_route_2026-12-01.md). The rule depends only on the shapes and
 * the CPU, so a run still repeats bit for bit. PTC_GEMM=onednn|openblas|plain picks one, for
 * measurements; ptrt_cpu_blas_name says which runs ("onednn+openblas" for the pair).
 *
 * Matmul with NumPy-style broadcasting of the leading dimensions becomes one GEMM per distinct
 * pair of matrices: when the right operand is a single matrix (x[B,S,d] @ w[d,f]) the left
 * operand's leading dims fold into rows and it is one GEMM in all; many small batched matrices run
 * one serial GEMM per batch, the batches split across the pool.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "ref.h"

/* CBLAS's row-major sgemm, and oneDNN's (row-major, 'N'/'T'; returns a dnnl_status_t) */
typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                               const float *a, int lda, const float *b, int ldb, float beta,
                               float *c, int ldc);
typedef int (*dnnl_sgemm_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                             float *c, int64_t ldc);
/* oneDNN's bf16 GEMM: bf16 A and B, f32 accumulation and C (row-major, like dnnl_sgemm) */
typedef int (*dnnl_bf16_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                            float beta, float *c, int64_t ldc);
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

static struct {
    cblas_sgemm_fn cblas;
    dnnl_sgemm_fn dnnl;
    dnnl_bf16_fn dnnl_bf16; /* NULL: bf16 operands are converted to f32 first */
    void (*omp_set_num_threads)(int); /* oneDNN's OpenMP, one thread per calling thread */
    bool route; /* both open, the CPU without AVX-512: some pieces go to OpenBLAS (see
                 * piece_to_openblas) */
    char name[64];
} blas;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static _Thread_local bool omp_single; /* this thread's OpenMP team is set to one thread */

/* fp = dlsym(h, name), without ISO C's object-to-function pointer cast */
#define SYM(fp, h, name)                                                                          \
    do {                                                                                          \
        void *sym_ = dlsym(h, name);                                                              \
        memcpy(&(fp), &sym_, sizeof sym_);                                                        \
    } while (0)

static bool open_onednn(void)
{
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return false;
    SYM(blas.dnnl, h, "dnnl_sgemm");
    SYM(blas.dnnl_bf16, h, "dnnl_gemm_bf16bf16f32");
    SYM(blas.omp_set_num_threads, h, "omp_set_num_threads"); /* (from its libgomp) */
    if (!blas.dnnl)
        return false;
    if (blas.dnnl_bf16) { /* oneDNN has it only for AVX-512 CPUs and up: try one */
        uint16_t one[4] = {0x3f80, 0, 0, 0x3f80};
        float c[4] = {0};
        if (blas.dnnl_bf16('N', 'N', 2, 2, 2, 1.0f, one, 2, one, 2, 0.0f, c, 2) != 0 || c[0] != 1 ||
            c[3] != 1)
            blas.dnnl_bf16 = NULL;
    }
    snprintf(blas.name, sizeof blas.name, "onednn");
    return true;
}

/* OpenBLAS runs one thread for each thread that calls it here (openblas_set_num_threads(1)
 * below), but by then its library constructor has started a server thread per core, which spin
 * in sched_yield for ~0.1 s before they sleep: 20-100 ms of a core in every process that opens it
 * (10-30% of a small reference run's time, and in every ptc test). OPENBLAS_NUM_THREADS=1 at
 * load starts none. Set before main, while the process has one thread (setenv is not safe beside
 * another thread's getenv), and only where the user has not set it. */
__attribute__((constructor)) static void openblas_one_thread(void)
{
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
}

static bool open_openblas(void)
{
    void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return false;
    void (*set_threads)(int);
    char *(*corename)(void);
    SYM(blas.cblas, h, "cblas_sgemm");
    SYM(set_threads, h, "openblas_set_num_threads");
    SYM(corename, h, "openblas_get_corename");
    if (!blas.cblas)
        return false;
    if (set_threads)
        set_threads(1);
    snprintf(blas.name, sizeof blas.name, "openblas %s", corename ? corename() : "");
    return true;
}

/* Under AddressSanitizer oneDNN is not the default: LeakSanitizer's stop-the-world tracer faults
 * on the threads its OpenMP runtime leaves (CI saw "Tracer caught signal 11" at exit in 15
 * runs), and the sanitizers are there to check ptc's code, not the GEMM's. */
#if defined(__SANITIZE_ADDRESS__)
#define ONEDNN_BY_DEFAULT false
#else
#define ONEDNN_BY_DEFAULT true
#endif

/* whether oneDNN runs its AVX-512 sgemm here (elsewhere than x86-64, the rule is not measured:
 * no second library) */
static bool cpu_has_avx512(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx512f");
#else
    return true;
#endif
}

static void open_blas(void)
{
    const char *want = getenv("PTC_GEMM");
    bool any = !want || !*want;
    if (((any && ONEDNN_BY_DEFAULT) || (want && strcmp(want, "onednn") == 0)) && open_onednn()) {
        /* oneDNN's AVX2 sgemm (no AVX-512) is slow on a narrow piece: OpenBLAS beside it */
        if (any && !cpu_has_avx512() && open_openblas()) {
            blas.route = true;
            snprintf(blas.name, sizeof blas.name, "onednn+openblas");
        }
        return;
    }
    blas.dnnl = NULL;
    blas.dnnl_bf16 = NULL;
    if ((any || strcmp(want, "openblas") == 0) && open_openblas())
        return;
    blas.cblas = NULL;
    snprintf(blas.name, sizeof blas.name, "plain loop");
}

const char *ptrt_cpu_blas_name(void)
{
    pthread_once(&blas_once, open_blas);
    return blas.name;
}

int ptrt_cpu_has_blas(void)
{
    pthread_once(&blas_once, open_blas);
    return blas.cblas || blas.dnnl;
}

bool ptrt_cpu_has_bf16_gemm(void)
{
    pthread_once(&blas_once, open_blas);
    return blas.dnnl_bf16 != NULL;
}

/* C = beta C for the k = 0 case and the plain loop's start. */
static void scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
}

void ptrt_cpu_gemm_plain(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc)
{
    scale_c(m, n, beta, c, ldc);
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        if (!trans_b) { /* row i of C gathers rows of B: unit stride in the inner loop */
            for (int64_t p = 0; p < k; p++) {
                float aip = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
                const float *bp = b + p * ldb;
                for (int64_t j = 0; j < n; j++)
                    ci[j] += aip * bp[j];
            }
            continue;
        }
        for (int64_t j = 0; j < n; j++) { /* B transposed: rows of B are columns of op(B) */
            const float *bj = b + j * ldb;
            float s = 0;
            for (int64_t p = 0; p < k; p++)
                s += (trans_a ? a[p * lda + i] : a[i * lda + p]) * bj[p];
            ci[j] += alpha * s;
        }
    }
}

int ptrt_cpu_gemm_route = PTRT_GEMM_ROUTE_RULE;

/* Whether one thread's f32 piece (m x n of C) goes to OpenBLAS while oneDNN is the library (both
 * open, blas.route). oneDNN's AVX2 sgemm runs a piece with a side of 256 or less, and a
 * transposed-A product (a weight gradient) with a side of 512 or less, 10-50% slower than
 * OpenBLAS's Haswell kernels; on wider pieces it is as fast or faster (bench/gemm_split.c --route,
 * bench/results/gemm_route_*.md). */
static bool piece_to_openblas(bool ta, bool tb, int64_t m, int64_t n)
{
    if (!blas.route || ptrt_cpu_gemm_route == PTRT_GEMM_ROUTE_ONEDNN)
        return false;
    if (ptrt_cpu_gemm_route == PTRT_GEMM_ROUTE_OPENBLAS)
        return true;
    int64_t side = m < n ? m : n;
    return side <= 256 || (ta && !tb && side <= 512);
}

void ptrt_cpu_gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    pthread_once(&blas_once, open_blas);
    bool fits = m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && lda <= INT32_MAX &&
                ldb <= INT32_MAX && ldc <= INT32_MAX; /* (CBLAS's int) */
    if (blas.dnnl && !(fits && piece_to_openblas(trans_a, trans_b, m, n))) {
        if (!omp_single && blas.omp_set_num_threads) {
            blas.omp_set_num_threads(1);
            omp_single = true;
        }
        blas.dnnl(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta,
                  c, ldc);
    } else if (blas.cblas && fits) {
        blas.cblas(CBLAS_ROW_MAJOR, trans_a ? CBLAS_TRANS : CBLAS_NO_TRANS,
                   trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS, (int)m, (int)n, (int)k, alpha, a,
                   (int)lda, b, (int)ldb, beta, c, (int)ldc);
    } else {
        ptrt_cpu_gemm_plain(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
}

/* One thread's GEMM of f32 or (bf16, with oneDNN's bf16 GEMM) operands. */
static void gemm_serial_any(bool bf16, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                            float beta, float *c, int64_t ldc)
{
    if (!bf16) {
        ptrt_cpu_gemm_serial(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    if (!omp_single && blas.omp_set_num_threads) {
        blas.omp_set_num_threads(1);
        omp_single = true;
    }
    blas.dnnl_bf16(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* p advanced by n elements of 2 (bf16) or 4 bytes */
static const void *elems(const void *p, int64_t n, bool bf16)
{
    return (const char *)p + n * (bf16 ? 2 : 4);
}

typedef struct gemm_job {
    bool ta, tb, by_rows, bf16;
    ptc_dtype cd; /* of C: f32, or bf16 / f16 (beta 0) */
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const void *a, *b;
    void *c;
} gemm_job;

#define BLOCK 16
#define SCRATCH16 (1 << 18) /* floats of f32 sums a piece of a 16-bit C holds at once (1 MiB) */

/* C = alpha op(A) op(B) into a 16-bit C (m x n at c, rows ldc apart; a and b at the first row and
 * column of the piece): the f32 sums of a chunk of rows at a time, each rounded into C by the
 * cast kernel while it is in cache, so the f32 result is never whole. */
static void gemm_serial16(bool bf16, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const void *a, int64_t lda, const void *b, int64_t ldb, ptc_dtype cd,
                          void *c, int64_t ldc)
{
    if (m <= 0 || n <= 0)
        return;
    int64_t rows = SCRATCH16 / n < 1 ? 1 : SCRATCH16 / n;
    rows = rows > m ? m : rows;
    float *s = ptc_xmalloc((size_t)(rows * n) * sizeof(float));
    for (int64_t r = 0; r < m; r += rows) {
        int64_t h = m - r < rows ? m - r : rows;
        gemm_serial_any(bf16, ta, tb, h, n, k, alpha, elems(a, ta ? r : r * lda, bf16), lda, b, ldb,
                        0.0f, s, n);
        for (int64_t i = 0; i < (ldc == n ? 1 : h); i++) { /* whole rows: one cast */
            ptc_type t = {.dtype = PTC_F32, .rank = 1, .dims = {ldc == n ? h * n : n}};
            ptrt_cpu_cast(&t, s + i * n, cd, (uint16_t *)c + (r + i) * ldc);
        }
    }
    free(s);
}

/* one thread's GEMM into C of dtype cd (f32: beta applies) */
static void gemm_serial_into(bool bf16, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                             float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                             float beta, ptc_dtype cd, void *c, int64_t ldc)
{
    if (cd == PTC_F32)
        gemm_serial_any(bf16, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        gemm_serial16(bf16, ta, tb, m, n, k, alpha, a, lda, b, ldb, cd, c, ldc);
}

/* element off of C */
static void *c_at(void *c, ptc_dtype cd, int64_t off)
{
    return (char *)c + off * (cd == PTC_F32 ? 4 : 2);
}

/* C = alpha A^T B (beta 0) for a C taller than wide, as its transpose C^T = alpha B^T A and a
 * transposition. oneDNN runs the transposed-A product 16-38% slower in this orientation than in
 * the other when C has fewer than 768 columns, and as fast or faster from 768 on (one thread on
 * one thread's piece, bench/gemm_transposed.c, bench/results/gemm_transposed_2026-11-26.md; gpt2
 * config (a)'s head gradient, m=2048 n=256 k=1024: 9.1 ms direct, 7.3 ms this way, 7.0 for the
 * plain product), hence the rule in gemm_piece. */
static void gemm_tn_tall(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                         const float *b, int64_t ldb, float *c, int64_t ldc)
{
    /* C^T of up to 1M floats (4 MiB) at a time, still taller than wide: a tall gradient (gpt2's
     * head, 50257 x 512) is not copied whole */
    if (n <= 0)
        return;
    int64_t rows = (1 << 20) / n > 2 * n ? (1 << 20) / n : 2 * n;
    rows = rows < m ? rows : m;
    float *t = ptc_xmalloc((size_t)(rows * n) * sizeof(float)); /* C^T, n x rows */
    for (int64_t r = 0; r < m; r += rows) {
        int64_t h = m - r < rows ? m - r : rows;
        ptrt_cpu_gemm_serial(true, false, n, h, k, alpha, b, ldb, a + r, lda, 0.0f, t, h);
        ptrt_cpu_transpose_tiled(t, h, c + r * ldc, ldc, n, h);
    }
    free(t);
}

/* Blocks [begin, end) of 16 rows (or columns) of C. */
static void gemm_piece(void *ctx, int64_t begin, int64_t end)
{
    const gemm_job *j = ctx;
    int64_t lo = begin * BLOCK, hi = end * BLOCK;
    if (j->by_rows) {
        hi = hi < j->m ? hi : j->m;
        const void *a = elems(j->a, j->ta ? lo : lo * j->lda, j->bf16);
        if (j->ta && !j->tb && !j->bf16 && j->cd == PTC_F32 && j->beta == 0.0f && hi - lo > j->n &&
            j->n < 768 && blas.dnnl && !piece_to_openblas(true, false, hi - lo, j->n)) {
            gemm_tn_tall(hi - lo, j->n, j->k, j->alpha, a, j->lda, j->b, j->ldb,
                         (float *)j->c + lo * j->ldc, j->ldc);
            return;
        }
        gemm_serial_into(j->bf16, j->ta, j->tb, hi - lo, j->n, j->k, j->alpha, a, j->lda, j->b,
                         j->ldb, j->beta, j->cd, c_at(j->c, j->cd, lo * j->ldc), j->ldc);
    } else {
        hi = hi < j->n ? hi : j->n;
        const void *b = elems(j->b, j->tb ? lo * j->ldb : lo, j->bf16);
        gemm_serial_into(j->bf16, j->ta, j->tb, j->m, hi - lo, j->k, j->alpha, j->a, j->lda, b,
                         j->ldb, j->beta, j->cd, c_at(j->c, j->cd, lo), j->ldc);
    }
}

static void gemm_split(bool bf16, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       float beta, ptc_dtype cd, void *c, int64_t ldc)
{
    gemm_job j = {.ta = trans_a,
                  .tb = trans_b,
                  .bf16 = bf16,
                  .cd = cd,
                  .by_rows = m >= n,
                  .m = m,
                  .n = n,
                  .k = k,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .alpha = alpha,
                  .beta = beta,
                  .a = a,
                  .b = b,
                  .c = c};
    int64_t split = j.by_rows ? m : n, other = j.by_rows ? n : m;
    int64_t blocks = (split + BLOCK - 1) / BLOCK;
    /* a piece worth splitting off does at least ~1M multiply-adds; and one piece per thread, as
     * each piece packs the operand it does not split again (the smaller one: see by_rows) */
    int64_t per_block = BLOCK * (other > 0 ? other : 1) * (k > 0 ? k : 1);
    int64_t grain = (1 << 20) / per_block + 1, threads = ptrt_cpu_threads();
    if (grain < (blocks + threads - 1) / threads)
        grain = (blocks + threads - 1) / threads;
    ptrt_cpu_parallel_for(blocks, grain, gemm_piece, &j);
}

void ptrt_cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                   int64_t ldc)
{
    gemm_split(false, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, PTC_F32, c, ldc);
}

/* Offset (in elements) of the matrix at flat batch index bi of a broadcast operand t of the
 * result o (leading dims right-aligned; size-1 or missing dims repeat). */
static int64_t batch_offset(const ptc_type *t, const ptc_type *o, int64_t bi, int64_t mat)
{
    int lead = o->rank - 2, tlead = t->rank - 2;
    int64_t off = 0, stride = 1;
    for (int i = lead - 1; i >= 0; i--) {
        int64_t idx = bi % o->dims[i];
        bi /= o->dims[i];
        int ti = i - (lead - tlead);
        if (ti >= 0) {
            if (t->dims[ti] != 1)
                off += idx * stride;
            stride *= t->dims[ti];
        }
    }
    return off * mat;
}

typedef struct batch_job {
    const ptc_type *ta, *tb, *to;
    const float *a, *b;
    float *o;
    int64_t m, n, k;
} batch_job;

static void batch_piece(void *ctx, int64_t begin, int64_t end)
{
    const batch_job *j = ctx;
    for (int64_t bi = begin; bi < end; bi++)
        ptrt_cpu_gemm_serial(false, false, j->m, j->n, j->k, 1.0f,
                             j->a + batch_offset(j->ta, j->to, bi, j->m * j->k), j->k,
                             j->b + batch_offset(j->tb, j->to, bi, j->k * j->n), j->n, 0.0f,
                             j->o + bi * j->m * j->n, j->n);
}

int ptrt_cpu_matmul(const ptc_type *ta, const float *a, const ptc_type *tb, const float *b,
                    const ptc_type *to, float *o)
{
    int64_t m = ta->dims[ta->rank - 2], k = ta->dims[ta->rank - 1], n = tb->dims[tb->rank - 1];
    int64_t rows = ptc_type_numel(ta) / (k > 0 ? k : 1);
    if (ptc_type_numel(tb) == k * n && ptc_type_numel(to) == rows * n) {
        /* one right matrix: A's leading dims fold into rows */
        ptrt_cpu_gemm(false, false, rows, n, k, 1.0f, a, k, b, n, 0.0f, o, n);
        return 1;
    }
    int64_t batches = m * n > 0 ? ptc_type_numel(to) / (m * n) : 0;
    batch_job j = {ta, tb, to, a, b, o, m, n, k};
    if (batches >= ptrt_cpu_threads() || m * n * k < (1 << 20)) {
        ptrt_cpu_parallel_for(batches, (1 << 20) / (m * n * k + 1) + 1, batch_piece, &j);
        return 1;
    }
    for (int64_t bi = 0; bi < batches; bi++) /* few big matrices: split each one */
        ptrt_cpu_gemm(false, false, m, n, k, 1.0f, a + batch_offset(ta, to, bi, m * k), k,
                      b + batch_offset(tb, to, bi, k * n), n, 0.0f, o + bi * m * n, n);
    return 1;
}

/* ---- a plan's gemm instruction ---- */

typedef struct strided_job {
    const ptc_gemm *g;
    const void *a, *b;
    void *c;
} strided_job;

static void strided_piece(void *ctx, int64_t begin, int64_t end)
{
    const strided_job *j = ctx;
    const ptc_gemm *g = j->g;
    bool bf16 = g->ab == PTC_BF16;
    for (int64_t bi = begin; bi < end; bi++)
        gemm_serial_into(bf16, g->ta, g->tb, g->m, g->n, g->k, (float)g->alpha,
                         elems(j->a, bi * g->sa, bf16), g->lda, elems(j->b, bi * g->sb, bf16),
                         g->ldb, (float)g->beta, (ptc_dtype)g->cd,
                         c_at(j->c, (ptc_dtype)g->cd, bi * g->sc), g->ldc);
}

/* ---- 16-bit operands without a 16-bit GEMM: widened to f32 a tile at a time ---- */

/* The side of the tiles of C (and of the chunks of the sum) a 16-bit GEMM is widened in; a test
 * sets it small. */
int64_t ptrt_cpu_widen_tile = 1024;

typedef struct rows_job {
    const char *x;
    char *o;
    ptc_dtype xt, ot;
    int64_t xld, old, nc;
} rows_job;

static void rows_piece(void *ctx, int64_t begin, int64_t end)
{
    const rows_job *j = ctx;
    ptc_type t = {.dtype = j->xt, .rank = 1, .dims = {j->nc}};
    for (int64_t r = begin; r < end; r++)
        ptrt_cpu_cast(&t, j->x + (size_t)(r * j->xld) * (size_t)ptc_dtype_size(j->xt), j->ot,
                      j->o + (size_t)(r * j->old) * (size_t)ptc_dtype_size(j->ot));
}

/* nr rows of nc elements, xld apart at x (dtype xt), cast into rows old apart at o (dtype ot):
 * the cast kernel's rounding (widening is exact) */
static void cast_rows(const void *x, ptc_dtype xt, int64_t xld, void *o, ptc_dtype ot, int64_t old,
                      int64_t nr, int64_t nc)
{
    if (nr <= 0 || nc <= 0)
        return;
    if (xld == nc && old == nc) {
        ptc_type t = {.dtype = xt, .rank = 1, .dims = {nr * nc}};
        ptrt_cpu_cast(&t, x, ot, o);
        return;
    }
    rows_job j = {x, o, xt, ot, xld, old, nc};
    ptrt_cpu_parallel_for(nr, (1 << 16) / nc + 1, rows_piece, &j);
}

/* The rows [r0, r0 + nr) and columns [c0, c0 + nc) of a 16-bit matrix (rows ld apart), widened
 * into a packed nr x nc f32 one */
static void widen_tile(const void *x, ptc_dtype dt, int64_t ld, int64_t r0, int64_t nr, int64_t c0,
                       int64_t nc, float *o)
{
    cast_rows((const uint16_t *)x + r0 * ld + c0, dt, ld, o, PTC_F32, nc, nr, nc);
}

static void gemm_instr(const ptc_gemm *g, const void *a, const void *b, void *c);

/* scratch for n widened floats, counted by ptrt_widened_add until widened_free */
static float *widened_alloc(int64_t n)
{
    n = n > 0 ? n : 1;
    ptrt_widened_add((int64_t)sizeof(float) * n);
    return ptc_xmalloc(sizeof(float) * (size_t)n);
}

static void widened_free(float *p, int64_t n)
{
    if (!p)
        return;
    ptrt_widened_add(-(int64_t)sizeof(float) * (n > 0 ? n : 1));
    free(p);
}

/* One 16-bit matrix product (batch 1) on the f32 GEMM. Operands that fit in five tiles' floats are
 * widened whole (exact) for one f32 GEMM. Larger ones are never widened whole: a 16-bit gradient
 * of gpt2's logits (8 x 1024 x 50257) is 1.6 GB as f32, memory the plan does not have. C is then
 * made a tile of T x T at a time, summed over chunks of the shared dimension (K whole up to 2T),
 * each chunk's pieces of A and B widened into scratch of at most 5 T^2 floats (20 MiB): f32 sums
 * across the chunks (beta for the first), into C where it is f32; into a tile of f32 sums where it
 * is 16-bit, rounded into C once at the end, as the 16-bit C of one GEMM is. Each element of A is
 * widened n/T times and of B m/T times, one conversion per T/2 multiply-adds. */
static void gemm_widened(const ptc_gemm *g, const void *a, const void *b, void *c)
{
    ptc_dtype dt = (ptc_dtype)g->ab, cd = (ptc_dtype)g->cd;
    int64_t m = g->m, n = g->n, k = g->k, t = ptrt_cpu_widen_tile;
    ptc_gemm f = *g;
    f.ab = PTC_F32;
    f.batch = 1;
    f.sa = f.sb = f.sc = 0;
    if (m * k + k * n <= 5 * t * t) {
        float *fa = widened_alloc(m * k), *fb = widened_alloc(k * n);
        widen_tile(a, dt, g->lda, 0, g->ta ? k : m, 0, g->ta ? m : k, fa);
        widen_tile(b, dt, g->ldb, 0, g->tb ? n : k, 0, g->tb ? k : n, fb);
        f.lda = g->ta ? m : k;
        f.ldb = g->tb ? k : n;
        gemm_instr(&f, fa, fb, c);
        widened_free(fa, m * k);
        widened_free(fb, k * n);
        return;
    }
    int64_t kc = k <= 2 * t ? k : t;
    bool sums = cd != PTC_F32 && kc < k; /* a 16-bit C summed over chunks: f32 sums of a tile */
    float *fa = widened_alloc(t * kc), *fb = widened_alloc(t * kc);
    float *acc = sums ? widened_alloc(t * t) : NULL;
    for (int64_t m0 = 0; m0 < m; m0 += t) {
        int64_t hm = m - m0 < t ? m - m0 : t;
        for (int64_t n0 = 0; n0 < n; n0 += t) {
            int64_t hn = n - n0 < t ? n - n0 : t;
            for (int64_t k0 = 0; k0 < k; k0 += kc) {
                int64_t hk = k - k0 < kc ? k - k0 : kc;
                if (g->ta)
                    widen_tile(a, dt, g->lda, k0, hk, m0, hm, fa);
                else
                    widen_tile(a, dt, g->lda, m0, hm, k0, hk, fa);
                if (g->tb)
                    widen_tile(b, dt, g->ldb, n0, hn, k0, hk, fb);
                else
                    widen_tile(b, dt, g->ldb, k0, hk, n0, hn, fb);
                f.m = hm;
                f.n = hn;
                f.k = hk;
                f.lda = g->ta ? hm : hk;
                f.ldb = g->tb ? hk : hn;
                f.beta = k0 == 0 ? g->beta : 1.0;
                f.cd = sums ? PTC_F32 : cd;
                f.ldc = sums ? hn : g->ldc;
                gemm_instr(&f, fa, fb, sums ? acc : c_at(c, cd, m0 * g->ldc + n0));
            }
            if (sums)
                cast_rows(acc, PTC_F32, hn, c_at(c, cd, m0 * g->ldc + n0), cd, g->ldc, hm, hn);
        }
    }
    widened_free(fa, t * kc);
    widened_free(fb, t * kc);
    widened_free(acc, t * t);
}

/* a gemm instruction as its operands' dtype says (f32: at f32 precision) */
static void gemm_instr(const ptc_gemm *g, const void *a, const void *b, void *c)
{
    bool bf16 = g->ab == PTC_BF16;
    if ((bf16 && !ptrt_cpu_has_bf16_gemm()) || g->ab == PTC_F16) {
        /* no bf16 GEMM in the library, and no f16 one in any: the operands widened to f32
         * (exact), the f32 GEMM; a batch of small matrices widened whole (the f32 GEMM runs
         * them in parallel), else one matrix at a time */
        int64_t na = (g->sa ? g->batch : 1) * g->m * g->k;
        int64_t nb = (g->sb ? g->batch : 1) * g->k * g->n;
        int64_t t = ptrt_cpu_widen_tile;
        if (g->batch > 1 && na + nb <= 5 * t * t) {
            ptc_gemm f = *g;
            f.ab = PTC_F32;
            float *fa = widened_alloc(na), *fb = widened_alloc(nb);
            cast_rows(a, (ptc_dtype)g->ab, na, fa, PTC_F32, na, 1, na);
            cast_rows(b, (ptc_dtype)g->ab, nb, fb, PTC_F32, nb, 1, nb);
            gemm_instr(&f, fa, fb, c);
            widened_free(fa, na);
            widened_free(fb, nb);
            return;
        }
        for (int64_t bi = 0; bi < g->batch; bi++)
            gemm_widened(g, (const uint16_t *)a + bi * g->sa, (const uint16_t *)b + bi * g->sb,
                         c_at(c, (ptc_dtype)g->cd, bi * g->sc));
        return;
    }
    int64_t work = g->m * g->n * g->k;
    if (g->batch >= ptrt_cpu_threads() || (g->batch > 1 && work < (1 << 20))) {
        /* many matrices: one per piece */
        strided_job j = {g, a, b, c};
        ptrt_cpu_parallel_for(g->batch, (1 << 20) / (work + 1) + 1, strided_piece, &j);
        return;
    }
    for (int64_t bi = 0; bi < g->batch; bi++) /* few big matrices: split each one */
        gemm_split(bf16, g->ta, g->tb, g->m, g->n, g->k, (float)g->alpha,
                   elems(a, bi * g->sa, bf16), g->lda, elems(b, bi * g->sb, bf16), g->ldb,
                   (float)g->beta, (ptc_dtype)g->cd, c_at(c, (ptc_dtype)g->cd, bi * g->sc), g->ldc);
}

void ptrt_cpu_gemm_instr(const ptc_gemm *g, const void *a, const void *b, void *c)
{
    /* f32 operands at a lower float32 matmul precision: bf16 GEMMs over their parts, which come
     * back here as bf16 gemm instructions */
    if (g->ab == PTC_F32 && ptrt_cpu_gemm_split(g, a, b, c))
        return;
    gemm_instr(g, a, b, c);
}
