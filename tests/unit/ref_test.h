/* ref_test.h - helpers shared by the reference-kernel tests (test_ref_*.c).
 *
 * rt_run runs one op the way the executor will: shape inference (ptc_infer) gives the result types
 * and normalises the attributes, then ptrt_ref_run fills freshly allocated results. Results start
 * as all-ones bytes (NaN for floats, -1 for ints) so an element a kernel forgets shows up.
 * EXPECT_OUT compares a result with hand-computed values written in the test.
 */
#ifndef PTC_REF_TEST_H
#define PTC_REF_TEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "ref.h"

static inline ptc_type rt_type(ptc_dtype dt, const int64_t *dims, int rank)
{
    ptc_type t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.rank = rank;
    for (int i = 0; i < rank; i++)
        t.dims[i] = dims[i];
    return t;
}

#define RT_DIMS(...)                                                                               \
    ((const int64_t[]){__VA_ARGS__}), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
/* TY(PTC_F32, 2, 3) is f32[2,3]; SCALAR(PTC_F32) is f32[]. */
#define TY(dt, ...) rt_type((dt), RT_DIMS(__VA_ARGS__))
#define SCALAR(dt) rt_type((dt), NULL, 0)

typedef struct rt_result {
    int rc;
    int nout;
    ptc_type ot[PTC_MAX_RESULTS];
    void *out[PTC_MAX_RESULTS];
    char err[512];
} rt_result;

/* ... at coordinate coord on the op's mesh axis (the rank-dependent ops) */
static inline rt_result rt_run_at(ptc_op op, ptc_attrs at, int coord, int nin, const ptc_type *it,
                                  void *const *in)
{
    rt_result r;
    char err[512] = "";
    memset(&r, 0, sizeof r);
    r.nout = ptc_infer(op, it, nin, &at, r.ot, err, sizeof err);
    cr_assert(r.nout > 0, "shape inference of %s failed: %s", ptc_ops[op].name, err);
    for (int j = 0; j < r.nout; j++) {
        size_t bytes = (size_t)ptc_type_numel(&r.ot[j]) * 4;
        r.out[j] = malloc(bytes);
        cr_assert(r.out[j] != NULL);
        memset(r.out[j], 0xFF, bytes);
    }
    ptrt_kcall node;
    memset(&node, 0, sizeof node);
    node.op = op;
    node.nin = nin;
    node.nout = r.nout;
    node.attrs = at;
    node.coord = coord;
    r.rc = ptrt_ref_run(&node, it, in, r.ot, r.out, r.err, sizeof r.err);
    return r;
}

static inline rt_result rt_run(ptc_op op, ptc_attrs at, int nin, const ptc_type *it,
                               void *const *in)
{
    return rt_run_at(op, at, 0, nin, it, in);
}

static inline void rt_free(rt_result *r)
{
    for (int j = 0; j < r->nout; j++)
        free(r->out[j]);
    r->nout = 0;
}

/* Runs op and asserts that it succeeded. */
static inline rt_result rt_ok(ptc_op op, ptc_attrs at, int nin, const ptc_type *it, void *const *in)
{
    rt_result r = rt_run(op, at, nin, it, in);
    cr_assert_eq(r.rc, 0, "%s failed: %s", ptc_ops[op].name, r.err);
    return r;
}

/* |got - want| <= tol * (1 + |want|) for each element; infinities and NaNs must match exactly. */
static inline void rt_expect_near(const float *got, int64_t ngot, const double *want, int64_t n,
                                  double tol)
{
    cr_expect_eq(ngot, n, "result has %lld elements, the test expects %lld", (long long)ngot,
                 (long long)n);
    for (int64_t i = 0; i < n && i < ngot; i++) {
        double g = got[i], w = want[i];
        bool ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= tol * (1 + fabs(w));
        cr_expect(ok, "element %lld: got %.9g, want %.9g", (long long)i, g, w);
    }
}

#define RT_LIST(...)                                                                               \
    ((const double[]){__VA_ARGS__}), (int64_t)(sizeof((double[]){__VA_ARGS__}) / sizeof(double))
/* EXPECT_OUT(r, j, tol, values...): result j of r equals the values (row-major). */
#define EXPECT_OUT(r, j, tol, ...)                                                                 \
    rt_expect_near((const float *)(r).out[j], ptc_type_numel(&(r).ot[j]), RT_LIST(__VA_ARGS__),    \
                   (tol))

/* 16-bit storage: result j of r (bf16 or f16, 2 bytes an element) decoded to floats, and floats
 * encoded into it (rounded once). */
static inline float *rt_decode16(const rt_result *r, int j)
{
    int64_t n = ptc_type_numel(&r->ot[j]);
    float *d = malloc(sizeof(float) * (size_t)(n ? n : 1));
    cr_assert(d != NULL);
    const uint16_t *u = r->out[j];
    for (int64_t i = 0; i < n; i++)
        d[i] = r->ot[j].dtype == PTC_BF16 ? ptc_bf16_value(u[i]) : ptc_f16_value(u[i]);
    return d;
}

static inline void rt_encode16(ptc_dtype dt, const float *x, uint16_t *o, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        o[i] = dt == PTC_BF16 ? ptc_bf16_bits(x[i]) : ptc_f16_bits(x[i]);
}

/* EXPECT_OUT16(r, j, tol, values...): result j of r, in 16-bit storage, equals the values. */
#define EXPECT_OUT16(r, j, tol, ...)                                                               \
    do {                                                                                           \
        float *rt_d_ = rt_decode16(&(r), j);                                                       \
        rt_expect_near(rt_d_, ptc_type_numel(&(r).ot[j]), RT_LIST(__VA_ARGS__), (tol));            \
        free(rt_d_);                                                                               \
    } while (0)

static inline void rt_expect_ints(const int32_t *got, int64_t ngot, const int32_t *want, int64_t n)
{
    cr_expect_eq(ngot, n, "result has %lld elements, the test expects %lld", (long long)ngot,
                 (long long)n);
    for (int64_t i = 0; i < n && i < ngot; i++)
        cr_expect_eq(got[i], want[i], "element %lld: got %d, want %d", (long long)i, got[i],
                     want[i]);
}
#define EXPECT_INTS(r, j, ...)                                                                     \
    rt_expect_ints((const int32_t *)(r).out[j], ptc_type_numel(&(r).ot[j]),                        \
                   ((const int32_t[]){__VA_ARGS__}),                                               \
                   (int64_t)(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t)))

/* The result type j of r is want. */
static inline void rt_expect_type(const ptc_type *got, ptc_type want)
{
    char a[160], b[160];
    cr_expect(ptc_type_eq(got, &want), "result type %s, want %s", ptc_type_str(got, a, sizeof a),
              ptc_type_str(&want, b, sizeof b));
}

/* 0, 1, 2, ... n-1 as floats (for shape tests). */
static inline float *rt_iota(int64_t n)
{
    float *p = malloc((size_t)n * sizeof *p);
    cr_assert(p != NULL);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)i;
    return p;
}

/* Deterministic pseudo-random floats in [lo, hi) (an LCG: tests must not depend on a seed). */
static inline void rt_fill(float *p, int64_t n, uint32_t seed, float lo, float hi)
{
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = lo + (hi - lo) * (float)(s >> 8) * (1.0f / 16777216.0f);
    }
}

#endif
