/* ref.c - the CPU reference: one switch that sends every op of ops.def to its plain kernel, the
 * rounding to bf16/f16 and the 16-bit storage formats, casts, the source ops and the GEMM. The
 * internal ops (after "internal ops" in ops.def: backward ops, optimizer updates) go on to
 * ptrt_ref_run_internal in ref_grad.c, the rank-dependent ones to ref_spmd.c.
 *
 * Low precision: a plan stores bf16 and f16 tensors in 2 bytes and converts them with casts; every
 * other kernel computes in double (or float) on float arrays. A kernel called with bf16/f16 types
 * (as the unit tests do) treats its operands as floats holding such values and rounds its results
 * to that format here, once, after the kernel: the rounding a cast to 16-bit storage applies.
 * The exceptions are the ops of ptc_op_storage16 (kernel.h): over 16-bit operands they read and
 * write the 2-byte storage, which the fusion pass lets them do in place of the casts around them.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "ref_grad.h"
#include "ref_internal.h"

void ptrt_ref_axis_view(const ptc_type *t, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    PTC_ASSERT(axis >= 0 && axis < t->rank);
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= t->dims[i];
    for (int i = axis + 1; i < t->rank; i++)
        *inner *= t->dims[i];
    *n = t->dims[axis];
}

void ptrt_ref_strides(const ptc_type *t, int64_t *strides)
{
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= t->dims[i];
    }
}

double ptrt_ref_round_bf16d(double x)
{
    return ptc_round_bf16(x);
}

double ptrt_ref_round_f16d(double x)
{
    return ptc_round_f16(x);
}

/* A double to a floating dtype's stored float: rounded once, to that dtype's precision. */
static float to_float_dtype(double v, ptc_dtype t)
{
    switch (t) {
    case PTC_BF16: return (float)ptrt_ref_round_bf16d(v);
    case PTC_F16: return (float)ptrt_ref_round_f16d(v);
    default: return (float)v;
    }
}

/* Element i of x, stored as dtype t, as a double. */
static double load_elem(const void *x, ptc_dtype t, int64_t i)
{
    switch (t) {
    case PTC_I32: return ((const int32_t *)x)[i];
    case PTC_BF16: return ptc_bf16_value(((const uint16_t *)x)[i]);
    case PTC_F16: return ptc_f16_value(((const uint16_t *)x)[i]);
    default: return ((const float *)x)[i];
    }
}

int32_t ptrt_ref_to_i32(double v)
{
    if (isnan(v))
        return 0;
    if (v >= 2147483647.0)
        return INT32_MAX;
    if (v <= -2147483648.0)
        return INT32_MIN;
    return (int32_t)trunc(v);
}

/* Casts read and write the storage of their dtypes: bf16 and f16 in 2 bytes. A value is rounded
 * once, from the double it is exactly. */
static void ref_cast(const ptc_type *ti, const void *x, const ptc_type *to, void *o)
{
    int64_t n = ptc_type_numel(ti);
    for (int64_t i = 0; i < n; i++) {
        double v = load_elem(x, ti->dtype, i);
        switch (to->dtype) {
        case PTC_I32:
            ((int32_t *)o)[i] =
                ti->dtype == PTC_I32 ? ((const int32_t *)x)[i] : ptrt_ref_to_i32(v);
            break;
        case PTC_BF16: ((uint16_t *)o)[i] = ptc_bf16_bits(v); break;
        case PTC_F16: ((uint16_t *)o)[i] = ptc_f16_bits(v); break;
        default: ((float *)o)[i] = (float)v;
        }
    }
}

/* The ops of ptc_op_storage16 over 16-bit operands read and write the 16-bit storage (kernel.h):
 * the operands widened into float arrays, the kernel run on those as f32, each result rounded to
 * the storage once as a cast rounds. */
bool ptrt_storage16(const ptrt_kcall *n, const ptc_type *it)
{
    return ptc_op_storage16(n->op) && n->nin > 0 &&
           (it[0].dtype == PTC_BF16 || it[0].dtype == PTC_F16);
}

int ptrt_ref_cast_to(const ptc_type *tx, const void *x, ptc_dtype to, void *o)
{
    ptc_type t = *tx;
    t.dtype = to;
    ref_cast(tx, x, &t, o);
    return 1;
}

/* Bytes of f32 copies of 16-bit operands held now, and the most held at once (all threads) */
static _Atomic int64_t widened_now, widened_peak;

void ptrt_widened_add(int64_t bytes)
{
    int64_t now = atomic_fetch_add(&widened_now, bytes) + bytes;
    int64_t peak = atomic_load(&widened_peak);
    while (now > peak && !atomic_compare_exchange_weak(&widened_peak, &peak, now))
        ;
}

int64_t ptrt_widened_high_water(void)
{
    return atomic_load(&widened_peak);
}

/* The f32 copies of ptrt_run_storage16, per thread and operand slot: 64-byte aligned as the
 * memory plan's buffers are (on malloc's 16 bytes the fast kernels made issue 16's config (a) in
 * bf16 11% slower), grown to the largest call's and kept (no page faults a call). Each thread's
 * set is on a list while the thread lives, freed when it ends. */
enum { S16_SLOTS = 16 };
typedef struct s16_cache {
    float *p[S16_SLOTS];
    int64_t cap[S16_SLOTS];
    struct s16_cache *next, **prev;
} s16_cache;
static pthread_key_t s16_key;
static pthread_once_t s16_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t s16_lock = PTHREAD_MUTEX_INITIALIZER;
static s16_cache *s16_all;

static void s16_end(void *v)
{
    s16_cache *c = v;
    pthread_mutex_lock(&s16_lock);
    *c->prev = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&s16_lock);
    for (int k = 0; k < S16_SLOTS; k++) {
        free(c->p[k]);
        ptrt_widened_add(-(int64_t)sizeof(float) * c->cap[k]);
    }
    free(c);
}

static void s16_init(void)
{
    PTC_ASSERT(pthread_key_create(&s16_key, s16_end) == 0);
}

static float *s16_slot(int k, int64_t n)
{
    pthread_once(&s16_once, s16_init);
    s16_cache *c = pthread_getspecific(s16_key);
    if (!c) {
        c = ptc_xcalloc(1, sizeof *c);
        pthread_mutex_lock(&s16_lock);
        c->next = s16_all;
        c->prev = &s16_all;
        if (s16_all)
            s16_all->prev = &c->next;
        s16_all = c;
        pthread_mutex_unlock(&s16_lock);
        pthread_setspecific(s16_key, c);
    }
    if (c->cap[k] < n) {
        free(c->p[k]);
        c->p[k] = aligned_alloc(64, (sizeof(float) * (size_t)n + 63) / 64 * 64 + 64);
        PTC_ASSERT(c->p[k]);
        ptrt_widened_add((int64_t)sizeof(float) * (n - c->cap[k]));
        c->cap[k] = n;
    }
    return c->p[k];
}

/* Attention and its gradient are independent across the batch, the leading dim of each operand:
 * over 16-bit storage they run one batch element at a time, so the f32 copies hold 1/B of the
 * operands (gpt2's, b=8 s=1024, take 25 MB a slot instead of 200). The number of batch
 * elements, or 1 where the op or its operands do not split so. */
static int64_t batch_split(const ptrt_kcall *n, const ptc_type *it, const ptc_type *ot)
{
    if (n->op != PTC_OP_ATTENTION && n->op != PTC_OP_ATTENTION_GRAD &&
        n->op != PTC_OP_ATTENTION_SHARD && n->op != PTC_OP_ATTENTION_SHARD_GRAD)
        return 1;
    int64_t b = it[0].rank >= 2 ? it[0].dims[0] : 1;
    for (int k = 0; k < n->nin + n->nout; k++) {
        const ptc_type *t = k < n->nin ? &it[k] : &ot[k - n->nin];
        if (t->rank < 2 || t->dims[0] != b)
            return 1;
    }
    return b > 1 ? b : 1;
}

/* the op on f32 copies of its 16-bit operands, whole */
static int run_storage16_whole(ptrt_kernel_fn run, ptrt_cast_fn cast, const ptrt_kcall *n,
                               const ptc_type *it, void *const *in, const ptc_type *ot,
                               void *const *out, char *err, size_t errn)
{
    enum { MAXN = S16_SLOTS / 2 };
    ptc_type it2[MAXN], ot2[MAXN];
    void *in2[MAXN] = {0}, *out2[MAXN] = {0};
    if (n->nin > MAXN || n->nout > MAXN) {
        ptc_fmt(err, errn, "%s over 16-bit storage: too many operands", ptc_ops[n->op].name);
        return -1;
    }
    for (int k = 0; k < n->nin + n->nout; k++) {
        const ptc_type *t = k < n->nin ? &it[k] : &ot[k - n->nin];
        ptc_type *w = k < n->nin ? &it2[k] : &ot2[k - n->nin];
        void **x = k < n->nin ? &in2[k] : &out2[k - n->nin];
        *w = *t;
        if (t->dtype != PTC_BF16 && t->dtype != PTC_F16) {
            *x = k < n->nin ? in[k] : out[k - n->nin];
            continue;
        }
        float *f = s16_slot(k, ptc_type_numel(t));
        if (k < n->nin)
            cast(t, in[k], PTC_F32, f);
        w->dtype = PTC_F32;
        *x = f;
    }
    int rc = run(n, it2, in2, ot2, out2, err, errn);
    for (int k = 0; k < n->nout; k++) {
        if (out2[k] == out[k])
            continue;
        if (rc == 0)
            cast(&ot2[k], out2[k], ot[k].dtype, out[k]);
    }
    return rc;
}

int ptrt_run_storage16(ptrt_kernel_fn run, ptrt_cast_fn cast, const ptrt_kcall *n,
                       const ptc_type *it, void *const *in, const ptc_type *ot, void *const *out,
                       char *err, size_t errn)
{
    enum { MAXN = S16_SLOTS / 2 };
    int64_t nb = n->nin <= MAXN && n->nout <= MAXN ? batch_split(n, it, ot) : 1;
    if (nb == 1)
        return run_storage16_whole(run, cast, n, it, in, ot, out, err, errn);
    ptc_type it1[MAXN], ot1[MAXN];
    void *in1[MAXN], *out1[MAXN];
    for (int64_t bi = 0; bi < nb; bi++) {
        for (int k = 0; k < n->nin + n->nout; k++) {
            const ptc_type *t = k < n->nin ? &it[k] : &ot[k - n->nin];
            ptc_type *t1 = k < n->nin ? &it1[k] : &ot1[k - n->nin];
            void *p = k < n->nin ? in[k] : out[k - n->nin];
            *t1 = *t;
            t1->dims[0] = 1;
            p = (char *)p + (size_t)(bi * ptc_type_numel(t1)) * (size_t)ptc_dtype_size(t->dtype);
            if (k < n->nin)
                in1[k] = p;
            else
                out1[k - n->nin] = p;
        }
        int rc = run_storage16_whole(run, cast, n, it1, in1, ot1, out1, err, errn);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static void ref_const(const ptc_attrs *at, const ptc_type *to, void *o)
{
    int64_t n = ptc_type_numel(to);
    for (int64_t i = 0; i < n; i++) {
        if (to->dtype == PTC_I32)
            ((int32_t *)o)[i] = ptrt_ref_to_i32(at->value);
        else
            ((float *)o)[i] = to_float_dtype(at->value, to->dtype);
    }
}

void ptrt_ref_round_results(int nout, const ptc_type *ot, void *const *out)
{
    for (int j = 0; j < nout; j++) {
        if (ot[j].dtype != PTC_BF16 && ot[j].dtype != PTC_F16)
            continue;
        float *o = out[j];
        int64_t n = ptc_type_numel(&ot[j]);
        for (int64_t i = 0; i < n; i++)
            o[i] = to_float_dtype(o[i], ot[j].dtype);
    }
}

int ptrt_ref_run(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                 void *const *out, char *err, size_t errn)
{
    const ptc_attrs *at = &n->attrs;
    const char *name = (unsigned)n->op < PTC_NOPS ? ptc_ops[n->op].name : "?";
    int rc = 0;
    if (errn)
        err[0] = '\0';
    if (ptrt_storage16(n, it))
        return ptrt_run_storage16(ptrt_ref_run, ptrt_ref_cast_to, n, it, in, ot, out, err, errn);
    switch (n->op) {
    case PTC_OP_INPUT:
    case PTC_OP_PARAM:
        ptc_fmt(err, errn, "%s is a source op: the executor fills it, there is no kernel to run",
                name);
        return -1;
    case PTC_OP_CONST: ref_const(at, &ot[0], out[0]); break;
    case PTC_OP_ADD:
    case PTC_OP_SUB:
    case PTC_OP_MUL:
    case PTC_OP_DIV: ptrt_ref_binary(n->op, &it[0], in[0], &it[1], in[1], &ot[0], out[0]); break;
    case PTC_OP_NEG:
    case PTC_OP_EXP:
    case PTC_OP_LOG:
    case PTC_OP_SQRT:
    case PTC_OP_RSQRT:
    case PTC_OP_TANH:
    case PTC_OP_SIGMOID:
    case PTC_OP_RELU:
    case PTC_OP_GELU:
    case PTC_OP_SILU: ptrt_ref_unary(n->op, ptc_type_numel(&it[0]), in[0], out[0]); break;
    case PTC_OP_MATMUL: ptrt_ref_matmul(&it[0], in[0], &it[1], in[1], &ot[0], out[0]); break;
    case PTC_OP_CAST: ref_cast(&it[0], in[0], &ot[0], out[0]); break;
    case PTC_OP_SUM:
    case PTC_OP_MEAN:
    case PTC_OP_MAX: ptrt_ref_reduce(n->op, &it[0], in[0], (int)at->axis, out[0]); break;
    case PTC_OP_LAYERNORM: ptrt_ref_layernorm(&it[0], in[0], in[1], in[2], at->eps, out[0]); break;
    case PTC_OP_RMSNORM: ptrt_ref_rmsnorm(&it[0], in[0], in[1], at->eps, out[0]); break;
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
        ptrt_ref_softmax(n->op == PTC_OP_LOG_SOFTMAX, &it[0], in[0], (int)at->axis, out[0]);
        break;
    case PTC_OP_RESHAPE:
        memcpy(out[0], in[0], (size_t)ptc_type_numel(&it[0]) * PTRT_REF_ELEM);
        break;
    case PTC_OP_TRANSPOSE: ptrt_ref_transpose(&it[0], in[0], out[0]); break;
    case PTC_OP_PERMUTE: ptrt_ref_permute(&it[0], in[0], at->shape, out[0]); break;
    case PTC_OP_SPLIT: ptrt_ref_split(&it[0], in[0], (int)at->axis, n->nout, out); break;
    case PTC_OP_CONCAT:
        ptrt_ref_concat(n->nin, it, (const void *const *)in, (int)at->axis, out[0]);
        break;
    case PTC_OP_SLICE:
        ptrt_ref_slice(&it[0], in[0], (int)at->axis, at->start, at->len, out[0]);
        break;
    case PTC_OP_EMBEDDING:
        rc = ptrt_ref_embedding(&it[0], in[0], &it[1], in[1], out[0], err, errn);
        break;
    case PTC_OP_ATTENTION:
        ptrt_ref_attention(&it[0], in[0], &it[1], in[1], in[2], at->heads,
                           at->kv_heads ? at->kv_heads : at->heads, at->causal, out[0]);
        break;
    case PTC_OP_ROPE: ptrt_ref_rope(&it[0], in[0], at->heads, at->base, out[0]); break;
    case PTC_OP_CROSS_ENTROPY:
        rc = ptrt_ref_cross_entropy(&it[0], in[0], in[1], out[0], err, errn);
        break;
    case PTC_OP_MSE: ptrt_ref_mse(&it[0], in[0], in[1], out[0]); break;
    default:
        /* moe and its pieces in ref_moe.c; rank-dependent ops in ref_spmd.c; the other internal
         * ops (autodiff, optimizer) in ref_grad.c */
        if (ptc_op_is_moe(n->op))
            return ptrt_ref_run_moe(n, it, in, ot, out, err, errn);
        if (ptc_ops[n->op].flags & (PTC_F_RANKDEP | PTC_F_SPMD))
            return ptrt_ref_run_spmd(n, it, in, ot, out, err, errn);
        return ptrt_ref_run_internal(n, it, in, ot, out, err, errn);
    }
    if (rc == 0 && n->op != PTC_OP_CAST)
        ptrt_ref_round_results(n->nout, ot, out);
    return rc;
}

/* Element i of a GEMM operand of dtype ab (f32, or bf16 or f16 storage). */
static double gemm_at(const void *x, uint8_t ab, int64_t i)
{
    return ab == PTC_BF16  ? ptc_bf16_value(((const uint16_t *)x)[i])
           : ab == PTC_F16 ? ptc_f16_value(((const uint16_t *)x)[i])
                           : ((const float *)x)[i];
}

/* Elements j..j+n-1 of a row of C (at element `at`) from their sums over p (acc): alpha s + beta C,
 * rounded once. */
static void gemm_store(const ptc_gemm *g, const double *acc, int64_t n, void *c, int64_t at)
{
    for (int64_t j = 0; j < n; j++) {
        if (g->cd == PTC_F32) {
            float *pc = (float *)c + at + j;
            *pc = (float)(g->alpha * acc[j] + (g->beta != 0 ? g->beta * *pc : 0));
            continue;
        }
        float v = (float)(g->alpha * acc[j]); /* (16-bit results: beta is 0) */
        ((uint16_t *)c)[at + j] = g->cd == PTC_BF16 ? ptc_bf16_bits(v) : ptc_f16_bits(v);
    }
}

enum { GEMM_RI = 4, GEMM_RJ = 8, GEMM_JB = 256 };

/* The sums of rows < GEMM_RI of A (element (r, p) at a[r * ars + p * acs]) times columns < n of
 * B (element (p, j) at b[p * ldb + j]) into acc (row r at acc + r * GEMM_JB): every sum over
 * p = 0, 1, ..., k - 1 in order, in double, each product of two floats exact there. Blocks of
 * GEMM_RI x GEMM_RJ sums stay in registers over p (the row loops before them loaded and stored
 * every sum at every p); the last columns and a block of fewer rows take a row of sums at a
 * time. The order of every sum's terms is the same either way, so are its bits. */
PTRT_CLONES static void gemm_rows(int rows, int64_t n, int64_t k, const float *a, int64_t ars,
                                  int64_t acs, const float *b, int64_t ldb, double *acc)
{
    int64_t j = 0;
    if (rows == GEMM_RI)
        for (; j + GEMM_RJ <= n; j += GEMM_RJ) {
            double s[GEMM_RI][GEMM_RJ] = {{0}};
            for (int64_t p = 0; p < k; p++) {
                const float *bp = b + p * ldb + j;
                for (int r = 0; r < GEMM_RI; r++) {
                    double x = a[r * ars + p * acs];
                    for (int c = 0; c < GEMM_RJ; c++)
                        s[r][c] += x * bp[c];
                }
            }
            for (int r = 0; r < GEMM_RI; r++)
                for (int c = 0; c < GEMM_RJ; c++)
                    acc[r * GEMM_JB + j + c] = s[r][c];
        }
    for (int r = 0; r < rows; r++) {
        double *restrict row = acc + r * GEMM_JB;
        for (int64_t c = j; c < n; c++)
            row[c] = 0;
        for (int64_t p = 0; p < k; p++) {
            double x = a[r * ars + p * acs];
            const float *restrict bp = b + p * ldb;
            for (int64_t c = j; c < n; c++)
                row[c] += x * bp[c];
        }
    }
}

/* Each element of C is its sum over p = 0, 1, ..., k - 1 of the products in double (a product
 * of two floats is exact there, so a fused multiply-add rounds as the sum does), rounded once:
 * the plain i-j-p loop's bits. The work goes in panels of GEMM_JB columns of B (as f32, row-major:
 * B itself where it is f32 and not transposed, else a copy, transposed and widened) and blocks
 * of GEMM_RI rows of A (a widened copy where A is 16-bit). On a 256^3 product (Zen 3, AVX2) it
 * runs 11.8 GFLOP/s where the row loops before it ran 4.4, and 13.3 where B is transposed (1.4):
 * the reference runs of the equivalence matrix take half the time. */
void ptrt_ref_gemm(const ptc_gemm *g, const void *a, const void *b, void *c)
{
    double *acc = ptc_xmalloc(sizeof(double) * GEMM_RI * GEMM_JB);
    bool af32 = g->ab == PTC_F32, direct_b = af32 && !g->tb;
    float *bpanel = direct_b ? NULL : ptc_xmalloc(sizeof(float) * (size_t)(g->k > 0 ? g->k : 1) *
                                                  GEMM_JB);
    float *arows = af32 ? NULL : ptc_xmalloc(sizeof(float) * (size_t)(g->k > 0 ? g->k : 1) *
                                             GEMM_RI);
    for (int64_t bi = 0; bi < g->batch; bi++) {
        int64_t oa = bi * g->sa, ob = bi * g->sb;
        for (int64_t j0 = 0; j0 < g->n; j0 += GEMM_JB) {
            int64_t jn = g->n - j0 < GEMM_JB ? g->n - j0 : GEMM_JB, ldb = jn;
            const float *bp = bpanel;
            if (direct_b) {
                bp = (const float *)b + ob + j0, ldb = g->ldb;
            } else {
                for (int64_t p = 0; p < g->k; p++)
                    for (int64_t j = 0; j < jn; j++)
                        bpanel[p * jn + j] = (float)gemm_at(
                            b, g->ab, ob + (g->tb ? (j0 + j) * g->ldb + p : p * g->ldb + j0 + j));
            }
            for (int64_t i0 = 0; i0 < g->m; i0 += GEMM_RI) {
                int rows = g->m - i0 < GEMM_RI ? (int)(g->m - i0) : GEMM_RI;
                const float *ap;
                int64_t ars, acs;
                if (af32) {
                    ap = (const float *)a + oa + (g->ta ? i0 : i0 * g->lda);
                    ars = g->ta ? 1 : g->lda, acs = g->ta ? g->lda : 1;
                } else {
                    for (int r = 0; r < rows; r++)
                        for (int64_t p = 0; p < g->k; p++)
                            arows[r * g->k + p] = (float)gemm_at(
                                a, g->ab,
                                oa + (g->ta ? p * g->lda + i0 + r : (i0 + r) * g->lda + p));
                    ap = arows, ars = g->k, acs = 1;
                }
                gemm_rows(rows, jn, g->k, ap, ars, acs, bp, ldb, acc);
                for (int r = 0; r < rows; r++)
                    gemm_store(g, acc + r * GEMM_JB, jn, c, bi * g->sc + (i0 + r) * g->ldc + j0);
            }
        }
    }
    free(acc);
    free(bpanel);
    free(arows);
}
