/* cpu_elementwise.c - fast CPU kernels for the elementwise ops, transpose, the broadcasting adjoint
 * sum_to, the squared norm and the AdamW update.
 *
 * Binary ops take the broadcasts a training step has: same shape (residual adds), a trailing block
 * repeated (a bias [f] over [B,S,f], positions [S,d] over [B,S,d]) and a scalar (the clipping
 * coefficient). Float +, -, *, / round once, as the reference's double op rounded to float does, so
 * these are bit-identical to it; other broadcasts go to the reference. The AdamW update repeats the
 * reference's double arithmetic step for step (bit-identical too) and only spreads it over the
 * pool. Reductions keep double accumulators, summed in fixed-size blocks combined in order.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

/* Elements per piece for memory-bound loops (below 2 pieces a loop stays on one thread). */
#define GRAIN (1 << 14)

/* ---- binary ---- */

/* The period of operand t within result o: numel(t) when t, without leading 1s, is the trailing
 * dims of o (so element i of o reads t[i % period]); 0 for any other broadcast. */
static int64_t period(const ptc_type *t, const ptc_type *o)
{
    int lead = 0;
    while (lead < t->rank && t->dims[lead] == 1)
        lead++;
    int r = t->rank - lead;
    if (r > o->rank)
        return 0;
    for (int i = 0; i < r; i++)
        if (t->dims[lead + i] != o->dims[o->rank - r + i])
            return 0;
    return ptc_type_numel(t);
}

typedef struct bin_job {
    ptc_op op;
    const float *a, *b;
    float *o;
    int64_t pa, pb; /* periods of a and b (1 = scalar) */
    int64_t row, n; /* a row: the shorter period below n (neither operand wraps within a row) */
} bin_job;

#define BIN_LOOP(EXPR)                                                                             \
    do {                                                                                           \
        if (j->pa == 1) {                                                                          \
            const float x = a[0];                                                                  \
            for (int64_t i = 0; i < len; i++) {                                                    \
                const float y = b[i];                                                              \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else if (j->pb == 1) {                                                                   \
            const float y = b[0];                                                                  \
            for (int64_t i = 0; i < len; i++) {                                                    \
                const float x = a[i];                                                              \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < len; i++) {                                                    \
                const float x = a[i], y = b[i];                                                    \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Rows [begin, end) of length j->row: within a row neither operand wraps around its period. */
static void bin_rows(void *ctx, int64_t begin, int64_t end)
{
    const bin_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        int64_t at = r * j->row, len = j->n - at < j->row ? j->n - at : j->row;
        const float *restrict a = j->pa == 1 ? j->a : j->a + at % j->pa;
        const float *restrict b = j->pb == 1 ? j->b : j->b + at % j->pb;
        float *restrict o = j->o + at;
        switch (j->op) {
        case PTC_OP_ADD: BIN_LOOP(x + y); break;
        case PTC_OP_SUB: BIN_LOOP(x - y); break;
        case PTC_OP_MUL: BIN_LOOP(x * y); break;
        default: BIN_LOOP(x / y); break;
        }
    }
}

int ptrt_cpu_binary(ptc_op op, const ptc_type *ta, const float *a, const ptc_type *tb,
                    const float *b, const ptc_type *to, float *o)
{
    int64_t n = ptc_type_numel(to);
    bin_job j = {
        .op = op, .a = a, .b = b, .o = o, .pa = period(ta, to), .pb = period(tb, to), .n = n};
    if (!j.pa || !j.pb || n == 0)
        return 0;
    /* a period is a product of o's trailing dims, so the shorter one divides the longer and n */
    j.row = n;
    if (j.pa > 1 && j.pa < j.row)
        j.row = j.pa;
    if (j.pb > 1 && j.pb < j.row)
        j.row = j.pb;
    if (j.row < 64 && j.row < n) /* short rows (e.g. [.., 2] + [2]): the reference serves */
        return 0;
    if (j.row == n) /* nothing wraps: any row length will do */
        j.row = GRAIN;
    ptrt_cpu_parallel_for((n + j.row - 1) / j.row, GRAIN / j.row + 1, bin_rows, &j);
    return 1;
}

/* ---- unary and their gradients ---- */

typedef struct un_job {
    ptc_op op;
    const float *x, *dy;
    float *o;
} un_job;

static void un_piece(void *ctx, int64_t begin, int64_t end)
{
    const un_job *j = ctx;
    const float *restrict x = j->x + begin;
    float *restrict o = j->o + begin;
    int64_t n = end - begin;
    switch (j->op) {
    case PTC_OP_GELU: ptrt_cpu_gelu(x, o, n); break;
    case PTC_OP_SILU: ptrt_cpu_silu(x, o, n); break;
    case PTC_OP_GELU_GRAD: ptrt_cpu_gelu_grad(x, j->dy + begin, o, n); break;
    case PTC_OP_SILU_GRAD: ptrt_cpu_silu_grad(x, j->dy + begin, o, n); break;
    case PTC_OP_RELU_GRAD: {
        const float *restrict dy = j->dy + begin;
        for (int64_t i = 0; i < n; i++)
            o[i] = x[i] > 0 ? dy[i] : 0.0f;
        break;
    }
    case PTC_OP_RELU:
        for (int64_t i = 0; i < n; i++)
            o[i] = x[i] < 0 ? 0.0f : x[i]; /* NaN passes through, as in the reference */
        break;
    case PTC_OP_NEG:
        for (int64_t i = 0; i < n; i++)
            o[i] = -x[i];
        break;
    default: PTC_UNREACHABLE("not a fast unary op");
    }
}

/* Pieces are whole multiples of 8 elements, so the vector paths see the same tails. */
static void un_blocks(void *ctx, int64_t begin, int64_t end)
{
    un_piece(ctx, begin * 8, end * 8);
}

static int unary_run(ptc_op op, int64_t n, const float *x, const float *dy, float *o)
{
    un_job j = {op, x, dy, o};
    int64_t blocks = n / 8;
    ptrt_cpu_parallel_for(blocks, GRAIN / 8, un_blocks, &j);
    if (blocks * 8 < n)
        un_piece(&j, blocks * 8, n);
    return 1;
}

int ptrt_cpu_unary(ptc_op op, const ptc_type *tx, const float *x, float *o)
{
    switch (op) {
    case PTC_OP_GELU:
    case PTC_OP_SILU:
    case PTC_OP_RELU:
    case PTC_OP_NEG: return unary_run(op, ptc_type_numel(tx), x, NULL, o);
    default: return 0; /* exp, log, tanh, ...: libm through the reference */
    }
}

int ptrt_cpu_unary_grad(ptc_op op, const ptc_type *tx, const float *x, const float *dy, float *o)
{
    return unary_run(op, ptc_type_numel(tx), x, dy, o);
}

/* ---- transpose ---- */

typedef struct tr_job {
    const float *x;
    float *o;
    int64_t r, c, rblocks, cblocks;
} tr_job;

#define TILE 64

/* Tiles [begin, end) of all batches: a TILE x TILE block of rows is written as columns, in 8x8
 * register transposes, so reads and writes both go a vector at a time. */
static void tr_tiles(void *ctx, int64_t begin, int64_t end)
{
    const tr_job *j = ctx;
    int64_t per = j->rblocks * j->cblocks;
    for (int64_t t = begin; t < end; t++) {
        int64_t bi = t / per, rb = t % per / j->cblocks, cb = t % j->cblocks;
        int64_t i0 = rb * TILE, k0 = cb * TILE;
        int64_t rows = j->r - i0 < TILE ? j->r - i0 : TILE,
                cols = j->c - k0 < TILE ? j->c - k0 : TILE;
        const float *x = j->x + bi * j->r * j->c + i0 * j->c + k0;
        float *o = j->o + bi * j->r * j->c + k0 * j->r + i0;
        ptrt_cpu_transpose_block(x, j->c, o, j->r, rows, cols);
    }
}

/* Moves 4-byte words (as floats, bit for bit), so it serves every dtype. */
int ptrt_cpu_transpose(const ptc_type *tx, const void *x, void *o)
{
    int64_t r = tx->dims[tx->rank - 2], c = tx->dims[tx->rank - 1];
    if (r * c == 0)
        return 1;
    tr_job j = {x, o, r, c, (r + TILE - 1) / TILE, (c + TILE - 1) / TILE};
    int64_t batches = ptc_type_numel(tx) / (r * c);
    ptrt_cpu_parallel_for(batches * j.rblocks * j.cblocks, GRAIN / (TILE * TILE) + 1, tr_tiles, &j);
    return 1;
}

/* ---- sum_to, sumsq ---- */

typedef struct sum_job {
    const void *x;
    ptc_dtype xt;
    float *o;
    int64_t rows, cols;
} sum_job;

#define SUM_AHEAD 4 /* rows prefetched ahead */

/* Columns [begin, end): every row added in order into double accumulators, the rows streamed
 * one contiguous segment at a time (the segment's columns are the vector lanes, so each column's
 * sum is still the reference's, term by term). A 16-bit x is widened a segment at a time. */
PTRT_CLONES static void sum_cols(void *ctx, int64_t begin, int64_t end)
{
    const sum_job *j = ctx;
    int64_t w = end - begin;
    size_t es = (size_t)ptc_dtype_size(j->xt);
    double *restrict acc = ptc_xcalloc((size_t)w, sizeof *acc);
    float *buf = j->xt == PTC_F32 ? NULL : ptc_xmalloc((size_t)w * sizeof *buf);
    for (int64_t r = 0; r < j->rows; r++) {
        int64_t off = r * j->cols + begin;
        if (r + SUM_AHEAD < j->rows) /* a piece is a short segment of each of many rows, which
                                      * the hardware's stream prefetch does not follow */
            for (int64_t c = 0; c < w; c += 64 / (int64_t)es)
                __builtin_prefetch((const char *)j->x +
                                   (size_t)(off + SUM_AHEAD * j->cols + c) * es);
        const float *restrict xr = ptrt_cpu_floats_at(j->x, j->xt, off, w, buf);
        for (int64_t c = 0; c < w; c++)
            acc[c] += xr[c];
    }
    for (int64_t c = 0; c < w; c++)
        j->o[begin + c] = (float)acc[c];
    free(acc);
    free(buf);
}

/* The adjoint of a trailing broadcast: o [trailing dims of x] sums x over its leading dims. x and
 * o may be 16-bit: x is widened as it is read, the f32 sums rounded into o once (as a cast of the
 * f32 result would). */
int ptrt_cpu_sum_to(const ptc_type *tx, const void *x, const ptc_type *to, void *o)
{
    int64_t p = period(to, tx), n = ptc_type_numel(tx);
    /* scalars and short rows: the reference */
    if (!p || p < 16 || tx->dtype == PTC_I32 || to->dtype == PTC_I32)
        return 0;
    float *o32 = to->dtype == PTC_F32 ? o : ptc_xmalloc((size_t)p * sizeof(float));
    sum_job j = {x, tx->dtype, o32, n / p, p};
    ptrt_cpu_parallel_for(p, 16 + GRAIN / j.rows, sum_cols, &j);
    if (o32 != o) {
        ptc_type t = {.dtype = PTC_F32, .rank = 1, .dims = {p}};
        ptrt_cpu_cast(&t, o32, to->dtype, o);
        free(o32);
    }
    return 1;
}

typedef struct sq_job {
    const void *x;
    ptc_dtype xt;
    double *part;
    int64_t n;
} sq_job;

/* PTRT_LANES running sums of a block, folded in a fixed order; the square of a float is exact in
 * double. A 16-bit x is widened a block at a time. */
PTRT_CLONES static void sq_blocks(void *ctx, int64_t begin, int64_t end)
{
    const sq_job *j = ctx;
    float *buf = j->xt == PTC_F32 ? NULL : ptc_xmalloc(GRAIN * sizeof *buf);
    for (int64_t bl = begin; bl < end; bl++) {
        int64_t lo = bl * GRAIN, len = (lo + GRAIN < j->n ? lo + GRAIN : j->n) - lo;
        const float *restrict x = ptrt_cpu_floats_at(j->x, j->xt, lo, len, buf); /* (from lo) */
        double s[PTRT_LANES] = {0};
        int64_t i = 0;
        for (; i + PTRT_LANES <= len; i += PTRT_LANES)
            for (int l = 0; l < PTRT_LANES; l++)
                s[l] += (double)x[i + l] * x[i + l];
        for (int l = 0; l < PTRT_LANES && i < len; l++, i++)
            s[l] += (double)x[i] * x[i];
        j->part[bl] = ptrt_fold_lanes(s);
    }
    free(buf);
}

/* The f32 sum of squares of x (f32 or 16-bit) */
int ptrt_cpu_sumsq(const ptc_type *tx, const void *x, float *o)
{
    int64_t n = ptc_type_numel(tx), blocks = (n + GRAIN - 1) / GRAIN;
    if (blocks < 2 || tx->dtype == PTC_I32)
        return 0;
    sq_job j = {x, tx->dtype, ptc_xmalloc((size_t)blocks * sizeof(double)), n};
    ptrt_cpu_parallel_for(blocks, 1, sq_blocks, &j);
    double s = 0;
    for (int64_t b = 0; b < blocks; b++)
        s += j.part[b];
    free(j.part);
    o[0] = (float)s;
    return 1;
}

/* ---- AdamW ---- */

typedef struct adam_job {
    ptrt_cpu_adam a;
    const float *p, *g, *m, *v;
    float *po, *mo, *vo;
} adam_job;

static void adam_piece(void *ctx, int64_t begin, int64_t end)
{
    const adam_job *j = ctx;
    ptrt_cpu_adamw_span(&j->a, j->p + begin, j->g + begin, j->m + begin, j->v + begin,
                        j->po + begin, j->mo + begin, j->vo + begin, end - begin);
}

/* torch/optim/adamw.py as ref_grad.c writes it: the per-call constants are computed the same
 * way, so the update is the reference's to the bit. */
int ptrt_cpu_adamw(const ptrt_kcall *n, const ptc_type *it, void *const *in, void *const *out)
{
    const ptc_attrs *at = &n->attrs;
    double lr = ((const float *)in[4])[0], step = ((const float *)in[5])[0];
    double b1 = at->beta1, b2 = at->beta2;
    adam_job j = {.a = {.decay = 1 - lr * at->wd,
                        .b1 = b1,
                        .b2 = b2,
                        .c1 = 1 - b1,
                        .c2 = 1 - b2,
                        .step_size = lr / (1 - pow(b1, step)),
                        .bc2_sqrt = sqrt(1 - pow(b2, step)),
                        .eps = at->eps},
                  .p = in[0],
                  .g = in[1],
                  .m = in[2],
                  .v = in[3],
                  .po = out[0],
                  .mo = out[1],
                  .vo = out[2]};
    ptrt_cpu_parallel_for(ptc_type_numel(&it[0]), GRAIN, adam_piece, &j);
    return 1;
}

/* ---- copies ---- */

typedef struct copy_job {
    const char *x;
    char *o;
} copy_job;

static void copy_piece(void *ctx, int64_t begin, int64_t end)
{
    const copy_job *j = ctx;
    memcpy(j->o + begin, j->x + begin, (size_t)(end - begin));
}

int ptrt_cpu_copy(int64_t bytes, const void *x, void *o)
{
    copy_job j = {x, o};
    ptrt_cpu_parallel_for(bytes, 1 << 18, copy_piece, &j);
    return 1;
}

/* concat: each row of the axes before `axis` is the operands' rows one after another (up to
 * CONCAT_MAX operands; more take the reference) */
#define CONCAT_MAX 64
typedef struct concat_job {
    int nin;
    const void *const *in;
    int64_t row[CONCAT_MAX]; /* bytes of one row of operand i */
    int64_t total;           /* ... of the result */
    char *o;
} concat_job;

static void concat_piece(void *ctx, int64_t begin, int64_t end)
{
    const concat_job *j = ctx;
    for (int64_t a = begin; a < end; a++) {
        char *dst = j->o + a * j->total;
        for (int i = 0; i < j->nin; i++) {
            memcpy(dst, (const char *)j->in[i] + a * j->row[i], (size_t)j->row[i]);
            dst += j->row[i];
        }
    }
}

int ptrt_cpu_concat(int nin, const ptc_type *it, const void *const *in, int axis, void *o)
{
    if (nin < 1 || nin > CONCAT_MAX || axis < 0 || axis >= it[0].rank)
        return 0;
    concat_job j = {.nin = nin, .in = in, .o = o};
    /* every operand of one dtype (the caller checks the result's), its bits moved as they are */
    int64_t outer = 1, inner = ptc_dtype_size(it[0].dtype);
    for (int i = 1; i < nin; i++)
        if (it[i].dtype != it[0].dtype)
            return 0;
    for (int d = 0; d < axis; d++)
        outer *= it[0].dims[d];
    for (int d = axis + 1; d < it[0].rank; d++)
        inner *= it[0].dims[d];
    for (int i = 0; i < nin; i++) {
        j.row[i] = it[i].dims[axis] * inner;
        j.total += j.row[i];
    }
    if (outer == 0 || j.total == 0)
        return 1;
    ptrt_cpu_parallel_for(outer, (1 << 18) / j.total + 1, concat_piece, &j);
    return 1;
}

/* ---- casts between f32, bf16 and f16 ----
 * Bit-exact with common/half.c (round to nearest, ties to even; overflow to infinity; NaN to the
 * reference's quiet NaN) but in integer arithmetic: f32 -> f16 after Fabian Giesen's
 * float_to_half_fast3_rtne, f32 -> bf16 by the carry of the rounding bit. Every 16-bit value is
 * exact in f32, so a cast between 16-bit formats goes through f32 and rounds once. */

static inline uint16_t to_f16(float f)
{
    uint32_t u = ptrt_f_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7e00;
    if (a >= 0x477ff000u) /* 65520 and above round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) /* a normal f16: rebias the exponent, round the 13 dropped bits */
        return (uint16_t)(sign | ((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13));
    /* below 2^-14: adding 0.5 leaves the f16 subnormal's multiple of 2^-24 in the low bits, rounded
     * by the float addition itself */
    return (uint16_t)(sign | (ptrt_f_bits(ptrt_bits_f(a) + 0.5f) - 0x3f000000u));
}

static inline float from_f16(uint16_t h)
{
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13, e = o & (0x7c00u << 13);
    o += (127u - 15u) << 23;
    if (e == 0x7c00u << 13) {
        o += (128u - 16u) << 23; /* infinity, NaN */
    } else if (e == 0) {
        o += 1u << 23; /* subnormal: renormalise by a float subtraction (exact) */
        o = ptrt_f_bits(ptrt_bits_f(o) - ptrt_bits_f(113u << 23));
    }
    return ptrt_bits_f(o | (uint32_t)(h & 0x8000u) << 16);
}

typedef struct cast_job {
    ptc_dtype from, to;
    const void *x;
    void *o;
} cast_job;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define CAST_AVX2 1
/* f32 <-> bf16, 8 at a time: the same integer rounding as to_bf16 (NaN by a blend) */
__attribute__((target("avx2"))) static int64_t f32_to_bf16_avx2(const float *x, uint16_t *o,
                                                                 int64_t n)
{
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                  absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                  qnan = _mm256_set1_epi32(0x7fc0), sign = _mm256_set1_epi32(0x8000);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
        __m256i hi = _mm256_srli_epi32(u, 16);
        __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
        __m256i q = _mm256_or_si256(qnan, _mm256_and_si256(hi, sign));
        r = _mm256_blendv_epi8(r, q, nan);
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(o + i), _mm256_castsi256_si128(packed));
    }
    return i;
}

__attribute__((target("avx2"))) static int64_t bf16_to_f32_avx2(const uint16_t *x, float *o,
                                                                 int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_si256((__m256i *)(o + i), _mm256_slli_epi32(w, 16));
    }
    return i;
}
/* f32 <-> f16 by F16C, 8 at a time: vcvtps2ph rounds to nearest even, overflows to infinity and
 * handles subnormals as common/half.c does; only its NaN keeps the payload, so NaNs are made
 * 0x7e00 as there */
__attribute__((target("avx2,f16c"))) static int64_t f32_to_f16_f16c(const float *x, uint16_t *o,
                                                                    int64_t n)
{
    const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m128i qnan = _mm_set1_epi16(0x7e00);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(v), absm), inf);
        __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
        _mm_storeu_si128((__m128i *)(o + i), _mm_blendv_epi8(h, qnan, nan16));
    }
    return i;
}

__attribute__((target("avx2,f16c"))) static int64_t f16_to_f32_f16c(const uint16_t *x, float *o,
                                                                    int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    return i;
}

/* (CPUID leaf 1, ECX bit 29: clang's __builtin_cpu_supports has no "f16c") */
static bool have_f16c(void)
{
    static atomic_int have = -1; /* (pool threads may look at once: see cpu_vec.c's have_avx2) */
    int f = atomic_load_explicit(&have, memory_order_relaxed);
    if (f < 0) {
        unsigned int a, b, c, d;
        f = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
        atomic_store_explicit(&have, f, memory_order_relaxed);
    }
    return f && ptrt_cpu_vec_avx2();
}
#endif

static void cast_piece(void *ctx, int64_t begin, int64_t end)
{
    const cast_job *j = ctx;
#ifdef CAST_AVX2
    if (have_f16c() && j->from == PTC_F32 && j->to == PTC_F16)
        begin += f32_to_f16_f16c((const float *)j->x + begin, (uint16_t *)j->o + begin,
                                 end - begin);
    else if (have_f16c() && j->from == PTC_F16 && j->to == PTC_F32)
        begin += f16_to_f32_f16c((const uint16_t *)j->x + begin, (float *)j->o + begin,
                                 end - begin);
    else if (ptrt_cpu_vec_avx2() && j->from == PTC_F32 && j->to == PTC_BF16)
        begin += f32_to_bf16_avx2((const float *)j->x + begin, (uint16_t *)j->o + begin,
                                  end - begin);
    else if (ptrt_cpu_vec_avx2() && j->from == PTC_BF16 && j->to == PTC_F32)
        begin += bf16_to_f32_avx2((const uint16_t *)j->x + begin, (float *)j->o + begin,
                                  end - begin);
#endif
    const float *xf = j->x;
    const uint16_t *xh = j->x;
    float *of = j->o;
    uint16_t *oh = j->o;
    /* one loop per pair, branch-free inside, so that the compiler vectorises the common ones */
    if (j->from == PTC_F32 && j->to == PTC_BF16)
        for (int64_t i = begin; i < end; i++)
            oh[i] = ptrt_to_bf16(xf[i]);
    else if (j->from == PTC_BF16 && j->to == PTC_F32)
        for (int64_t i = begin; i < end; i++)
            of[i] = ptrt_bits_f((uint32_t)xh[i] << 16);
    else if (j->from == PTC_F32 && j->to == PTC_F16)
        for (int64_t i = begin; i < end; i++)
            oh[i] = to_f16(xf[i]);
    else if (j->from == PTC_F16 && j->to == PTC_F32)
        for (int64_t i = begin; i < end; i++)
            of[i] = from_f16(xh[i]);
    else
        for (int64_t i = begin; i < end; i++) {
            float v = j->from == PTC_F32    ? xf[i]
                      : j->from == PTC_BF16 ? ptrt_bits_f((uint32_t)xh[i] << 16)
                                            : from_f16(xh[i]);
            if (j->to == PTC_F32)
                of[i] = v;
            else
                oh[i] = j->to == PTC_BF16 ? ptrt_to_bf16(v) : to_f16(v);
        }
}

void ptrt_cpu_cast_serial(ptc_dtype from, const void *x, ptc_dtype to, void *o, int64_t n)
{
    cast_job j = {from, to, x, o};
    cast_piece(&j, 0, n);
}

int ptrt_cpu_cast(const ptc_type *tx, const void *x, ptc_dtype to, void *o)
{
    if (tx->dtype == PTC_I32 || to == PTC_I32)
        return 0;
    cast_job j = {tx->dtype, to, x, o};
    ptrt_cpu_parallel_for(ptc_type_numel(tx), GRAIN, cast_piece, &j);
    return 1;
}
