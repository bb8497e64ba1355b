/* test_ref_grad.c - the reference kernels of the internal ops (runtime/ref_grad.c).
 *
 * Every backward op is checked by central finite differences against the forward kernel of the op
 * it differentiates (run through ptrt_ref_run): with weights w, the gradient of L = sum(w * f(x))
 * with respect to x must be op_grad(x, w). Linear ops are checked as exact adjoints
 * (<f(x), y> = <x, f_grad(y)>), the rest (fill, sum_to, pad, sumsq, clip_coef and the optimizer
 * updates) against numbers worked out by hand in the comments.
 */
#include "ref_grad.h"
#include "ref_test.h"

/* Internal ops run through ptrt_ref_run like forward ones: its default case hands them to
 * ptrt_ref_run_internal, so these tests check that wiring as well. */
static rt_result rg_run(ptc_op op, ptc_attrs at, int nin, const ptc_type *it, void *const *in)
{
    return rt_run(op, at, nin, it, in);
}

static rt_result rg_ok(ptc_op op, ptc_attrs at, int nin, const ptc_type *it, void *const *in)
{
    rt_result r = rg_run(op, at, nin, it, in);
    cr_assert_eq(r.rc, 0, "%s failed: %s", ptc_ops[op].name, r.err);
    return r;
}

static float *fbuf(int64_t n, uint32_t seed, float lo, float hi)
{
    float *p = malloc((size_t)n * sizeof *p);
    cr_assert(p != NULL);
    rt_fill(p, n, seed, lo, hi);
    return p;
}

static double dot(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static double dot_abs(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += fabs((double)a[i] * b[i]);
    return s;
}

/* ---- finite differences ----
 * Step and tolerance. The forward kernels store float, so L = sum(w * y) carries a rounding error
 * of about 2^-24 * sum|w y| (a few 1e-7 for the O(1)-valued, O(100)-element tensors here), which
 * the central difference divides by 2h = 2e-3: about 1e-4 of noise. The truncation error of the
 * central difference is h^2/6 * f''' ~ 2e-7 for O(1) derivatives. A wrong gradient (a missing
 * term, a transposed index, a wrong scale) is off by O(0.1) or more. So each element must satisfy
 * |numeric - kernel| <= 1e-3 + 1e-2 |kernel| (the worst seen is 1.3e-4, in cross_entropy_grad). */
#define FD_H 1e-3f
#define FD_ATOL 1e-3
#define FD_RTOL 1e-2

/* sum(w * y) for the first result y of the forward op. */
static double fwd_loss(ptc_op op, ptc_attrs at, int nin, const ptc_type *it, void *const *in,
                       const float *w)
{
    rt_result r = rt_ok(op, at, nin, it, in);
    double s = dot(w, r.out[0], ptc_type_numel(&r.ot[0]));
    rt_free(&r);
    return s;
}

/* Checks grad (the kernel's gradient with respect to operand wrt of the forward op, for output
 * weights w) against central differences, element by element. The perturbed values are floats, so
 * the step divided by is the one actually taken. */
static void fd_check(const char *what, ptc_op op, ptc_attrs at, int nin, const ptc_type *it,
                     void *const *in, int wrt, const float *w, const float *grad)
{
    float *x = in[wrt];
    int64_t n = ptc_type_numel(&it[wrt]);
    double biggest = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        float x0 = x[i], xp = x0 + FD_H, xm = x0 - FD_H;
        x[i] = xp;
        double lp = fwd_loss(op, at, nin, it, in, w);
        x[i] = xm;
        double lm = fwd_loss(op, at, nin, it, in, w);
        x[i] = x0;
        double num = (lp - lm) / ((double)xp - (double)xm), err = fabs(num - grad[i]);
        cr_expect(err <= FD_ATOL + FD_RTOL * fabs(grad[i]),
                  "%s: element %lld: finite difference %.7g, kernel %.7g", what, (long long)i, num,
                  (double)grad[i]);
        biggest = fmax(biggest, fabs(grad[i]));
        worst = fmax(worst, err);
    }
    /* a gradient that is zero everywhere would pass trivially */
    cr_expect(biggest > 1e-2, "%s: the gradient is (nearly) zero everywhere", what);
    cr_log_info("%s: %lld elements, largest |grad| %.3g, worst |fd - grad| %.2g", what,
                (long long)n, biggest, worst);
}

/* ---- sources, broadcasting, pad, sumsq ---- */

Test(ref_grad, fill)
{
    ptc_attrs a = ptc_attrs_default(PTC_OP_FILL);
    a.nshape = 2;
    a.shape[0] = 2;
    a.shape[1] = 3;
    a.value = 1.5;
    a.dtype = PTC_F32;
    rt_result r = rg_ok(PTC_OP_FILL, a, 0, NULL, NULL);
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 3));
    EXPECT_OUT(r, 0, 0, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5);
    rt_free(&r);

    a.dtype = PTC_I32; /* like a cast: toward zero */
    a.value = -2.7;
    a.nshape = 1;
    r = rg_ok(PTC_OP_FILL, a, 0, NULL, NULL);
    EXPECT_INTS(r, 0, -2, -2);
    rt_free(&r);

    /* bf16 keeps 8 significant bits: 1/3 = 0.0101010101..b rounds to 0.01010101b = 0.333984375 */
    a.dtype = PTC_BF16;
    a.value = 1.0 / 3.0;
    a.nshape = 0;
    r = rg_ok(PTC_OP_FILL, a, 0, NULL, NULL);
    EXPECT_OUT(r, 0, 0, 0.333984375);
    rt_free(&r);
}

Test(ref_grad, state_has_no_kernel)
{
    ptc_attrs a = ptc_attrs_default(PTC_OP_STATE);
    a.nshape = 1;
    a.shape[0] = 2;
    rt_result r = rg_run(PTC_OP_STATE, a, 0, NULL, NULL);
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "state") != NULL, "message: %s", r.err);
    rt_free(&r);

    /* a forward op is not this function's business */
    ptc_type it[2] = {TY(PTC_F32, 1), TY(PTC_F32, 1)};
    float x[1] = {1}, y[1] = {2};
    void *in[2] = {x, y};
    ptrt_kcall add = {.op = PTC_OP_ADD, .nin = 2, .nout = 1};
    add.attrs = ptc_attrs_default(PTC_OP_ADD);
    float z[1];
    void *out[1] = {z};
    char err[256] = "";
    cr_expect_eq(ptrt_ref_run_internal(&add, it, in, it, out, err, sizeof err), -1);
    cr_expect(strstr(err, "add") != NULL, "message: %s", err);
}

/* The executor runs every op through ptrt_ref_run, which hands the internal ones to
 * ptrt_ref_run_internal: one op with one result and one with three. */
Test(ref_grad, reached_through_ptrt_ref_run)
{
    float x[2] = {3, 4};
    rt_result r = rt_ok(PTC_OP_SUMSQ, ptc_attrs_default(PTC_OP_SUMSQ), 1,
                        (ptc_type[]){TY(PTC_F32, 2)}, (void *[]){x});
    EXPECT_OUT(r, 0, 0, 25);
    rt_free(&r);

    /* AdamW with g = 0 and zero moments only decays: p (1 - lr wd) = 2 (1 - 0.5 * 0.5) = 1.5 */
    float p[1] = {2}, g[1] = {0}, m[1] = {0}, v[1] = {0}, lr[1] = {0.5f}, t[1] = {1};
    ptc_attrs a = ptc_attrs_default(PTC_OP_ADAMW_UPDATE);
    a.wd = 0.5;
    ptc_type s = SCALAR(PTC_F32), one = TY(PTC_F32, 1);
    r = rt_ok(PTC_OP_ADAMW_UPDATE, a, 6, (ptc_type[]){one, one, one, one, s, s},
              (void *[]){p, g, m, v, lr, t});
    cr_assert_eq(r.nout, 3);
    EXPECT_OUT(r, 0, 0, 1.5);
    EXPECT_OUT(r, 1, 0, 0);
    EXPECT_OUT(r, 2, 0, 0);
    rt_free(&r);
}

Test(ref_grad, broadcast_to)
{
    /* f32[3,1] -> [2,3,2]: out[a][b][c] = x[b][0] */
    ptc_type it[1] = {TY(PTC_F32, 3, 1)};
    float x[3] = {1, 2, 3};
    void *in[1] = {x};
    ptc_attrs a = ptc_attrs_default(PTC_OP_BROADCAST_TO);
    a.nshape = 3;
    memcpy(a.shape, (int64_t[]){2, 3, 2}, 3 * sizeof(int64_t));
    rt_result r = rg_ok(PTC_OP_BROADCAST_TO, a, 1, it, in);
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 3, 2));
    EXPECT_OUT(r, 0, 0, 1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3);
    rt_free(&r);

    /* i32[2] -> [2,2] (rows repeat), and a scalar -> [3] */
    int32_t ids[2] = {7, -4};
    it[0] = TY(PTC_I32, 2);
    in[0] = ids;
    a.nshape = 2;
    a.shape[0] = 2;
    a.shape[1] = 2;
    r = rg_ok(PTC_OP_BROADCAST_TO, a, 1, it, in);
    EXPECT_INTS(r, 0, 7, -4, 7, -4);
    rt_free(&r);

    float s[1] = {0.25f};
    it[0] = SCALAR(PTC_F32);
    in[0] = s;
    a.nshape = 1;
    a.shape[0] = 3;
    r = rg_ok(PTC_OP_BROADCAST_TO, a, 1, it, in);
    EXPECT_OUT(r, 0, 0, 0.25, 0.25, 0.25);
    rt_free(&r);
}

Test(ref_grad, sum_to)
{
    /* x = iota f32[2,3,2] to [3,1]: the leading dim and the last (size 1 in the target) are summed:
     * row b is (x[0,b,0] + x[0,b,1]) + (x[1,b,0] + x[1,b,1]):
     * b=0: 0+1+6+7 = 14, b=1: 2+3+8+9 = 22, b=2: 4+5+10+11 = 30 */
    ptc_type it[1] = {TY(PTC_F32, 2, 3, 2)};
    float *x = rt_iota(12);
    void *in[1] = {x};
    ptc_attrs a = ptc_attrs_default(PTC_OP_SUM_TO);
    a.nshape = 2;
    a.shape[0] = 3;
    a.shape[1] = 1;
    rt_result r = rg_ok(PTC_OP_SUM_TO, a, 1, it, in);
    rt_expect_type(&r.ot[0], TY(PTC_F32, 3, 1));
    EXPECT_OUT(r, 0, 0, 14, 22, 30);
    rt_free(&r);

    /* to [2]: the two leading dims go: even elements 0+2+...+10 = 30, odd 1+3+...+11 = 36 */
    a.nshape = 1;
    a.shape[0] = 2;
    r = rg_ok(PTC_OP_SUM_TO, a, 1, it, in);
    EXPECT_OUT(r, 0, 0, 30, 36);
    rt_free(&r);

    /* to a scalar: 0 + 1 + ... + 11 = 66; to its own shape: a copy */
    a.nshape = 0;
    r = rg_ok(PTC_OP_SUM_TO, a, 1, it, in);
    EXPECT_OUT(r, 0, 0, 66);
    rt_free(&r);
    a.nshape = 3;
    memcpy(a.shape, (int64_t[]){2, 3, 2}, 3 * sizeof(int64_t));
    r = rg_ok(PTC_OP_SUM_TO, a, 1, it, in);
    EXPECT_OUT(r, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    rt_free(&r);
    free(x);

    /* i32 sums stay integers: [[1, -2], [30, 4]] to [2] gives (31, 2) */
    int32_t ids[4] = {1, -2, 30, 4};
    it[0] = TY(PTC_I32, 2, 2);
    in[0] = ids;
    a.nshape = 1;
    a.shape[0] = 2;
    r = rg_ok(PTC_OP_SUM_TO, a, 1, it, in);
    EXPECT_INTS(r, 0, 31, 2);
    rt_free(&r);

    /* over bf16, sum_to reads and writes the 2-byte storage (kernel.h), its result rounded as a
     * cast rounds the f32 sum: 1 + 2^-8 is halfway between the bf16 neighbours 1 and 1 + 2^-7,
     * and ties go to the even one, 1; 1 + 2^-8 + 2^-8 is 1 + 2^-7 */
    float y[3] = {1.0f, 0.00390625f, 0.00390625f};
    uint16_t y16[3];
    rt_encode16(PTC_BF16, y, y16, 3);
    it[0] = TY(PTC_BF16, 2);
    in[0] = y16;
    a.nshape = 0;
    r = rg_ok(PTC_OP_SUM_TO, a, 1, it, in);
    rt_expect_type(&r.ot[0], SCALAR(PTC_BF16));
    EXPECT_OUT16(r, 0, 0, 1.0);
    rt_free(&r);
    it[0] = TY(PTC_BF16, 3);
    r = rg_ok(PTC_OP_SUM_TO, a, 1, it, in);
    EXPECT_OUT16(r, 0, 0, 1.0078125);
    rt_free(&r);
}

/* sum_to is the adjoint of broadcast_to: <broadcast_to(x), y> = <x, sum_to(y)>. */
Test(ref_grad, sum_to_is_adjoint_of_broadcast_to)
{
    ptc_type tx = TY(PTC_F32, 3, 1, 4), ty = TY(PTC_F32, 2, 3, 5, 4);
    float *x = fbuf(12, 1, -1, 1), *y = fbuf(120, 2, -1, 1);
    ptc_attrs a = ptc_attrs_default(PTC_OP_BROADCAST_TO);
    a.nshape = 4;
    memcpy(a.shape, ty.dims, 4 * sizeof(int64_t));
    rt_result bx = rg_ok(PTC_OP_BROADCAST_TO, a, 1, &tx, (void *[]){x});
    a.nshape = 3;
    memcpy(a.shape, tx.dims, 3 * sizeof(int64_t));
    rt_result sy = rg_ok(PTC_OP_SUM_TO, a, 1, &ty, (void *[]){y});
    double lhs = dot(bx.out[0], y, 120), rhs = dot(x, sy.out[0], 12);
    cr_expect(fabs(lhs - rhs) <= 1e-6 * (1 + dot_abs(bx.out[0], y, 120)), "%.9g vs %.9g", lhs, rhs);
    rt_free(&bx);
    rt_free(&sy);
    free(x);
    free(y);
}

Test(ref_grad, pad)
{
    /* f32[2,2] along axis 1 at start 1 in len 4: each row becomes 0, x0, x1, 0 */
    ptc_type it[1] = {TY(PTC_F32, 2, 2)};
    float x[4] = {1, 2, 3, 4};
    void *in[1] = {x};
    ptc_attrs a = ptc_attrs_default(PTC_OP_PAD);
    a.axis = 1;
    a.start = 1;
    a.len = 4;
    rt_result r = rg_ok(PTC_OP_PAD, a, 1, it, in);
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 4));
    EXPECT_OUT(r, 0, 0, 0, 1, 2, 0, 0, 3, 4, 0);
    rt_free(&r);

    /* f32[1,3] along axis 0 at start 2 in len 3: two rows of zeros, then x */
    it[0] = TY(PTC_F32, 1, 3);
    a.axis = 0;
    a.start = 2;
    a.len = 3;
    r = rg_ok(PTC_OP_PAD, a, 1, it, in);
    EXPECT_OUT(r, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3);
    rt_free(&r);
}

/* pad is the adjoint of slice: <slice(x), y> = <x, pad(y)>, slice run by the forward kernel. */
Test(ref_grad, pad_is_adjoint_of_slice)
{
    ptc_type tx = TY(PTC_F32, 2, 7, 3), ty = TY(PTC_F32, 2, 4, 3);
    float *x = fbuf(42, 3, -1, 1), *y = fbuf(24, 4, -1, 1);
    ptc_attrs a = ptc_attrs_default(PTC_OP_SLICE);
    a.axis = -2;
    a.start = 2;
    a.len = 4;
    rt_result sx = rt_ok(PTC_OP_SLICE, a, 1, &tx, (void *[]){x});
    a = ptc_attrs_default(PTC_OP_PAD);
    a.axis = -2;
    a.start = 2;
    a.len = 7;
    rt_result py = rg_ok(PTC_OP_PAD, a, 1, &ty, (void *[]){y});
    rt_expect_type(&py.ot[0], tx);
    double lhs = dot(sx.out[0], y, 24), rhs = dot(x, py.out[0], 42);
    cr_expect(fabs(lhs - rhs) <= 1e-6 * (1 + dot_abs(sx.out[0], y, 24)), "%.9g vs %.9g", lhs, rhs);
    rt_free(&sx);
    rt_free(&py);
    free(x);
    free(y);
}

Test(ref_grad, sumsq)
{
    /* 1 + 4 + 9 + 0.25 = 14.25 */
    ptc_type it[1] = {TY(PTC_F32, 2, 2)};
    float x[4] = {1, -2, 3, 0.5f};
    rt_result r = rg_ok(PTC_OP_SUMSQ, ptc_attrs_default(PTC_OP_SUMSQ), 1, it, (void *[]){x});
    rt_expect_type(&r.ot[0], SCALAR(PTC_F32));
    EXPECT_OUT(r, 0, 0, 14.25);
    rt_free(&r);

    /* 100000 squares of 0.1f (= 0.100000001490116...): 1000.0000298 in double, which the result
     * must match to float precision (a float accumulator drifts well beyond that) */
    int64_t n = 100000;
    float *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++)
        y[i] = 0.1f;
    it[0] = TY(PTC_F32, 100000);
    r = rg_ok(PTC_OP_SUMSQ, ptc_attrs_default(PTC_OP_SUMSQ), 1, it, (void *[]){y});
    EXPECT_OUT(r, 0, 1e-7, 1000.0000298);
    rt_free(&r);
    free(y);
}

static double clip(float sumsq, float max_norm)
{
    ptc_type it[2] = {SCALAR(PTC_F32), SCALAR(PTC_F32)};
    rt_result r = rg_ok(PTC_OP_CLIP_COEF, ptc_attrs_default(PTC_OP_CLIP_COEF), 2, it,
                        (void *[]){&sumsq, &max_norm});
    double c = ((float *)r.out[0])[0];
    rt_free(&r);
    return c;
}

Test(ref_grad, clip_coef)
{
    /* norm 4, max 1: 1 / (4 + 1e-6) = 0.24999993750001... */
    cr_expect_float_eq(clip(16, 1), 0.2499999375, 1e-8);
    /* norm 3, max 6: 6 / 3.000001 = 1.9999993 > 1, so 1 (never scales up) */
    cr_expect_eq(clip(9, 6), 1.0);
    /* norm 0: 1 / 1e-6 clamps to 1; max_norm = inf means no clipping */
    cr_expect_eq(clip(0, 1), 1.0);
    cr_expect_eq(clip(1e30f, INFINITY), 1.0);
    /* a NaN norm stays NaN (as torch.clamp leaves it), so the step shows it */
    cr_expect(isnan(clip(NAN, 1)));
}

/* ---- elementwise backward ---- */

static void check_unary(ptc_op fwd, ptc_op bwd, bool away_from_zero)
{
    ptc_type it[2] = {TY(PTC_F32, 4, 6), TY(PTC_F32, 4, 6)};
    float *x = fbuf(24, 5, -3, 3), *w = fbuf(24, 6, -1, 1);
    for (int i = 0; away_from_zero && i < 24; i++) /* relu has a kink at 0 */
        x[i] = x[i] < 0 ? x[i] - 0.05f : x[i] + 0.05f;
    rt_result g = rg_ok(bwd, ptc_attrs_default(bwd), 2, it, (void *[]){x, w});
    fd_check(ptc_ops[bwd].name, fwd, ptc_attrs_default(fwd), 1, it, (void *[]){x}, 0, w, g.out[0]);
    rt_free(&g);
    free(x);
    free(w);
}

Test(ref_grad, relu_gelu_silu_grad_fd)
{
    check_unary(PTC_OP_RELU, PTC_OP_RELU_GRAD, true);
    check_unary(PTC_OP_GELU, PTC_OP_GELU_GRAD, false);
    check_unary(PTC_OP_SILU, PTC_OP_SILU_GRAD, false);
}

Test(ref_grad, relu_gelu_silu_grad_values)
{
    /* at x = 0 gelu' = 0.5 (1 + tanh 0) + 0 = 0.5 and silu' = s(0) (1 + 0) = 0.5; relu' is 0 at 0
     * and below, 1 above. With dy = 2 the results are twice that. */
    ptc_type it[2] = {TY(PTC_F32, 3), TY(PTC_F32, 3)};
    float x[3] = {-1, 0, 2}, dy[3] = {2, 2, 2};
    void *in[2] = {x, dy};
    rt_result r = rg_ok(PTC_OP_RELU_GRAD, ptc_attrs_default(PTC_OP_RELU_GRAD), 2, it, in);
    EXPECT_OUT(r, 0, 0, 0, 0, 2);
    rt_free(&r);
    x[0] = 0;
    r = rg_ok(PTC_OP_GELU_GRAD, ptc_attrs_default(PTC_OP_GELU_GRAD), 2, it, in);
    /* gelu'(2): u = sqrt(2/pi) (2 + 0.35772) = 1.881188, t = tanh u = 0.954598,
     * 0.5 (1 + t) + 0.5 * 2 (1 - t^2) sqrt(2/pi) (1 + 0.53658) = 0.977299 + 0.108800 = 1.086099 */
    EXPECT_OUT(r, 0, 1e-5, 1, 1, 2 * 1.086099);
    rt_free(&r);
    r = rg_ok(PTC_OP_SILU_GRAD, ptc_attrs_default(PTC_OP_SILU_GRAD), 2, it, in);
    /* silu'(2): s = 1/(1 + e^-2) = 0.880797, s (1 + 2 (1 - s)) = 0.880797 * 1.238406 = 1.090784 */
    EXPECT_OUT(r, 0, 1e-5, 1, 1, 2 * 1.090784);
    rt_free(&r);
}

/* ---- axis backward ---- */

Test(ref_grad, max_grad_fd)
{
    /* distinct values 0.25 apart (7 i mod 24 is a permutation), so the max is differentiable */
    ptc_type tx = TY(PTC_F32, 2, 4, 3);
    float x[24];
    for (int i = 0; i < 24; i++)
        x[i] = (float)((7 * i) % 24) * 0.25f - 3;
    for (int axis = 0; axis < 3; axis++) {
        ptc_type tdy = tx;
        for (int d = axis; d + 1 < 3; d++)
            tdy.dims[d] = tx.dims[d + 1];
        tdy.rank = 2;
        float *w = fbuf(ptc_type_numel(&tdy), 7 + (uint32_t)axis, -1, 1);
        ptc_attrs a = ptc_attrs_default(PTC_OP_MAX_GRAD);
        a.axis = axis;
        rt_result g = rg_ok(PTC_OP_MAX_GRAD, a, 2, (ptc_type[]){tx, tdy}, (void *[]){x, w});
        a = ptc_attrs_default(PTC_OP_MAX);
        a.axis = axis;
        fd_check("max_grad", PTC_OP_MAX, a, 1, &tx, (void *[]){x}, 0, w, g.out[0]);
        rt_free(&g);
        free(w);
    }
}

Test(ref_grad, max_grad_ties_and_nan)
{
    /* [1, 3, 3] along axis 1: dy goes to the first 3 only; [1, NaN, 5, NaN]: to the first NaN (the
     * forward max is NaN there) */
    ptc_attrs a = ptc_attrs_default(PTC_OP_MAX_GRAD);
    a.axis = -1;
    float x[3] = {1, 3, 3}, dy[1] = {2};
    rt_result r = rg_ok(PTC_OP_MAX_GRAD, a, 2, (ptc_type[]){TY(PTC_F32, 1, 3), TY(PTC_F32, 1)},
                        (void *[]){x, dy});
    EXPECT_OUT(r, 0, 0, 0, 2, 0);
    rt_free(&r);
    float y[4] = {1, NAN, 5, NAN};
    r = rg_ok(PTC_OP_MAX_GRAD, a, 2, (ptc_type[]){TY(PTC_F32, 4), SCALAR(PTC_F32)},
              (void *[]){y, dy});
    EXPECT_OUT(r, 0, 0, 0, 2, 0, 0);
    rt_free(&r);
}

/* softmax_grad / log_softmax_grad take the forward result y, which the test gets from the forward
 * kernel, and the weights as dy. */
static void check_softmax(ptc_op fwd, ptc_op bwd, int axis)
{
    ptc_type tx = TY(PTC_F32, 2, 3, 4);
    float *x = fbuf(24, 11 + (uint32_t)axis, -2, 2), *w = fbuf(24, 12, -1, 1);
    ptc_attrs a = ptc_attrs_default(fwd);
    a.axis = axis;
    rt_result y = rt_ok(fwd, a, 1, &tx, (void *[]){x});
    ptc_attrs ab = ptc_attrs_default(bwd);
    ab.axis = axis;
    rt_result g = rg_ok(bwd, ab, 2, (ptc_type[]){tx, tx}, (void *[]){y.out[0], w});
    fd_check(ptc_ops[bwd].name, fwd, a, 1, &tx, (void *[]){x}, 0, w, g.out[0]);
    rt_free(&g);
    rt_free(&y);
    free(x);
    free(w);
}

Test(ref_grad, softmax_grad_fd)
{
    check_softmax(PTC_OP_SOFTMAX, PTC_OP_SOFTMAX_GRAD, -1);
    check_softmax(PTC_OP_SOFTMAX, PTC_OP_SOFTMAX_GRAD, 1);
    check_softmax(PTC_OP_SOFTMAX, PTC_OP_SOFTMAX_GRAD, 0);
}

Test(ref_grad, log_softmax_grad_fd)
{
    check_softmax(PTC_OP_LOG_SOFTMAX, PTC_OP_LOG_SOFTMAX_GRAD, -1);
    check_softmax(PTC_OP_LOG_SOFTMAX, PTC_OP_LOG_SOFTMAX_GRAD, 1);
}

/* ---- normalisation backward ---- */

Test(ref_grad, layernorm_grad_fd)
{
    ptc_type tx = TY(PTC_F32, 2, 3, 5), tg = TY(PTC_F32, 5);
    float *x = fbuf(30, 13, -2, 2), *g = fbuf(5, 14, 0.5f, 1.5f), *b = fbuf(5, 15, -0.5f, 0.5f);
    float *w = fbuf(30, 16, -1, 1);
    ptc_attrs a = ptc_attrs_default(PTC_OP_LAYERNORM_GRAD);
    a.eps = 1e-5;
    rt_result r = rg_ok(PTC_OP_LAYERNORM_GRAD, a, 3, (ptc_type[]){tx, tg, tx}, (void *[]){x, g, w});
    cr_assert_eq(r.nout, 3);
    ptc_attrs af = ptc_attrs_default(PTC_OP_LAYERNORM);
    af.eps = 1e-5;
    ptc_type it[3] = {tx, tg, tg};
    void *in[3] = {x, g, b};
    fd_check("layernorm_grad dx", PTC_OP_LAYERNORM, af, 3, it, in, 0, w, r.out[0]);
    fd_check("layernorm_grad dg", PTC_OP_LAYERNORM, af, 3, it, in, 1, w, r.out[1]);
    fd_check("layernorm_grad db", PTC_OP_LAYERNORM, af, 3, it, in, 2, w, r.out[2]);
    rt_free(&r);
    free(x);
    free(g);
    free(b);
    free(w);
}

Test(ref_grad, rmsnorm_grad_fd)
{
    ptc_type tx = TY(PTC_F32, 2, 3, 5), tg = TY(PTC_F32, 5);
    float *x = fbuf(30, 17, -2, 2), *g = fbuf(5, 18, 0.5f, 1.5f), *w = fbuf(30, 19, -1, 1);
    ptc_attrs a = ptc_attrs_default(PTC_OP_RMSNORM_GRAD);
    rt_result r = rg_ok(PTC_OP_RMSNORM_GRAD, a, 3, (ptc_type[]){tx, tg, tx}, (void *[]){x, g, w});
    cr_assert_eq(r.nout, 2);
    ptc_type it[2] = {tx, tg};
    void *in[2] = {x, g};
    ptc_attrs af = ptc_attrs_default(PTC_OP_RMSNORM);
    fd_check("rmsnorm_grad dx", PTC_OP_RMSNORM, af, 2, it, in, 0, w, r.out[0]);
    fd_check("rmsnorm_grad dg", PTC_OP_RMSNORM, af, 2, it, in, 1, w, r.out[1]);
    rt_free(&r);
    free(x);
    free(g);
    free(w);
}

/* ---- model and loss backward ---- */

Test(ref_grad, embedding_grad)
{
    /* ids [2,3] into a table of 5 rows of 3: id 1 three times, row 2 never */
    ptc_type tt = TY(PTC_F32, 5, 3), ti = TY(PTC_I32, 2, 3), tdy = TY(PTC_F32, 2, 3, 3);
    int32_t ids[6] = {1, 4, 1, 0, 1, 3};
    float *table = fbuf(15, 20, -1, 1), *w = fbuf(18, 21, -1, 1);
    ptc_attrs a = ptc_attrs_default(PTC_OP_EMBEDDING_GRAD);
    a.n = 5;
    rt_result r = rg_ok(PTC_OP_EMBEDDING_GRAD, a, 2, (ptc_type[]){ti, tdy}, (void *[]){ids, w});
    rt_expect_type(&r.ot[0], tt);
    const float *d = r.out[0];
    for (int j = 0; j < 3; j++) {
        /* row 1 collects positions 0, 2 and 4; row 2 is untouched */
        double want = (double)w[0 * 3 + j] + w[2 * 3 + j] + w[4 * 3 + j];
        cr_expect(fabs(d[1 * 3 + j] - want) <= 1e-6, "row 1 col %d: %g vs %g", j, d[3 + j], want);
        cr_expect_eq(d[2 * 3 + j], 0.0f);
    }
    fd_check("embedding_grad", PTC_OP_EMBEDDING, ptc_attrs_default(PTC_OP_EMBEDDING), 2,
             (ptc_type[]){tt, ti}, (void *[]){table, ids}, 0, w, r.out[0]);
    rt_free(&r);

    ids[4] = 5;
    r = rg_run(PTC_OP_EMBEDDING_GRAD, a, 2, (ptc_type[]){ti, tdy}, (void *[]){ids, w});
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "id 5 at position 4") != NULL, "message: %s", r.err);
    rt_free(&r);
    ids[4] = -1;
    r = rg_run(PTC_OP_EMBEDDING_GRAD, a, 2, (ptc_type[]){ti, tdy}, (void *[]){ids, w});
    cr_expect_eq(r.rc, -1);
    rt_free(&r);
    free(table);
    free(w);
}

/* q [2,s,heads*2] and k, v [2,s2,kv*2] (head size 2); checks dq, dk and dv by finite differences
 * of the forward attention. */
static void check_attention(int s, int s2, int heads, int kv, bool causal)
{
    int64_t dh = 2, nq = 2 * s * heads * dh, nk = 2 * s2 * kv * dh;
    ptc_type tq = TY(PTC_F32, 2, s, heads * dh), tk = TY(PTC_F32, 2, s2, kv * dh);
    uint32_t seed = (uint32_t)(100 * s + 10 * heads + kv + (causal ? 1000 : 0));
    float *q = fbuf(nq, seed, -1.5f, 1.5f), *k = fbuf(nk, seed + 1, -1.5f, 1.5f);
    float *v = fbuf(nk, seed + 2, -1, 1), *w = fbuf(nq, seed + 3, -1, 1);
    ptc_attrs a = ptc_attrs_default(PTC_OP_ATTENTION_GRAD);
    a.heads = heads;
    a.kv_heads = kv;
    a.causal = causal;
    rt_result r =
        rg_ok(PTC_OP_ATTENTION_GRAD, a, 4, (ptc_type[]){tq, tk, tk, tq}, (void *[]){q, k, v, w});
    cr_assert_eq(r.nout, 3);
    ptc_attrs af = ptc_attrs_default(PTC_OP_ATTENTION);
    af.heads = heads;
    af.kv_heads = kv;
    af.causal = causal;
    ptc_type it[3] = {tq, tk, tk};
    void *in[3] = {q, k, v};
    char what[96];
    const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        ptc_fmt(what, sizeof what, "attention_grad %s (s=%d s2=%d heads=%d kv=%d causal=%d)",
                names[i], s, s2, heads, kv, causal);
        fd_check(what, PTC_OP_ATTENTION, af, 3, it, in, i, w, r.out[i]);
    }
    rt_free(&r);
    free(q);
    free(k);
    free(v);
    free(w);
}

Test(ref_grad, attention_grad_gqa_causal)
{
    for (int s = 3; s <= 5; s++)
        check_attention(s, s, 4, 2, true);
}

Test(ref_grad, attention_grad_gqa_full)
{
    for (int s = 3; s <= 5; s++)
        check_attention(s, s, 4, 2, false);
}

Test(ref_grad, attention_grad_mha_mqa)
{
    check_attention(4, 4, 4, 4, true);  /* one kv head per query head */
    check_attention(4, 4, 4, 1, false); /* all query heads share one */
}

Test(ref_grad, attention_grad_other_key_length)
{
    /* shape inference lets k, v have their own sequence length; the forward's causal mask then
     * keeps keys 0..i for query i */
    check_attention(3, 5, 4, 2, false);
    check_attention(3, 5, 4, 2, true);
}

/* rope is a rotation, so rope_grad must be its exact transpose: <rope(x), y> = <x, rope_grad(y)>
 * up to the float rounding of the two results (2^-24 each, relative to the sum of |terms|), and
 * also its inverse: rope_grad(rope(x)) = x. */
Test(ref_grad, rope_grad_is_transpose)
{
    ptc_type t = TY(PTC_F32, 2, 5, 16);
    float *x = fbuf(160, 22, -1, 1), *y = fbuf(160, 23, -1, 1);
    double bases[2] = {10000.0, 100.0};
    for (int i = 0; i < 2; i++) {
        ptc_attrs a = ptc_attrs_default(PTC_OP_ROPE);
        a.heads = 2;
        a.base = bases[i];
        rt_result rx = rt_ok(PTC_OP_ROPE, a, 1, &t, (void *[]){x});
        ptc_attrs ag = ptc_attrs_default(PTC_OP_ROPE_GRAD);
        ag.heads = 2;
        ag.base = bases[i];
        rt_result gy = rg_ok(PTC_OP_ROPE_GRAD, ag, 1, &t, (void *[]){y});
        double lhs = dot(rx.out[0], y, 160), rhs = dot(x, gy.out[0], 160);
        cr_expect(fabs(lhs - rhs) <= 1e-6 * dot_abs(rx.out[0], y, 160), "base %g: %.9g vs %.9g",
                  bases[i], lhs, rhs);
        rt_result back = rg_ok(PTC_OP_ROPE_GRAD, ag, 1, &t, (void *[]){rx.out[0]});
        for (int64_t j = 0; j < 160; j++)
            cr_expect(fabs(((float *)back.out[0])[j] - x[j]) <= 1e-6, "element %lld", (long long)j);
        rt_free(&rx);
        rt_free(&gy);
        rt_free(&back);
    }
    free(x);
    free(y);
}

Test(ref_grad, cross_entropy_grad)
{
    /* logits [2,2,5]: N = 4 positions (every dim but the last), dloss = 3 */
    ptc_type tl = TY(PTC_F32, 2, 2, 5), tt = TY(PTC_I32, 2, 2), ts = SCALAR(PTC_F32);
    float *logits = fbuf(20, 24, -2, 2), dloss[1] = {3};
    int32_t targets[4] = {4, 0, 2, 2};
    ptc_attrs a = ptc_attrs_default(PTC_OP_CROSS_ENTROPY_GRAD);
    rt_result r = rg_ok(PTC_OP_CROSS_ENTROPY_GRAD, a, 3, (ptc_type[]){tl, tt, ts},
                        (void *[]){logits, targets, dloss});
    rt_expect_type(&r.ot[0], tl);
    /* each row of softmax - onehot sums to 0 */
    for (int row = 0; row < 4; row++) {
        double s = 0;
        for (int i = 0; i < 5; i++)
            s += ((float *)r.out[0])[row * 5 + i];
        cr_expect(fabs(s) <= 1e-6, "row %d sums to %g", row, s);
    }
    fd_check("cross_entropy_grad", PTC_OP_CROSS_ENTROPY, ptc_attrs_default(PTC_OP_CROSS_ENTROPY), 2,
             (ptc_type[]){tl, tt}, (void *[]){logits, targets}, 0, dloss, r.out[0]);
    rt_free(&r);

    /* equal logits over 2 classes, target 1, dloss 1, N = 1: (0.5, 0.5) - (0, 1) */
    float two[2] = {0.3f, 0.3f}, one[1] = {1};
    int32_t t1[1] = {1};
    r = rg_ok(PTC_OP_CROSS_ENTROPY_GRAD, a, 3, (ptc_type[]){TY(PTC_F32, 1, 2), TY(PTC_I32, 1), ts},
              (void *[]){two, t1, one});
    EXPECT_OUT(r, 0, 1e-7, 0.5, -0.5);
    rt_free(&r);

    targets[3] = 5;
    r = rg_run(PTC_OP_CROSS_ENTROPY_GRAD, a, 3, (ptc_type[]){tl, tt, ts},
               (void *[]){logits, targets, dloss});
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "target 5 at position 3") != NULL, "message: %s", r.err);
    rt_free(&r);
    free(logits);
}

/* ---- optimizer updates ---- */

/* One optimizer step on 3 elements: runs op on (p, g, state..., scalars...) and writes the new p
 * and states back into the operand buffers, as the executor's update list does. */
static void step(ptc_op op, ptc_attrs a, int nin, float *const *bufs, int nstate)
{
    ptc_type it[6];
    for (int i = 0; i < nin; i++)
        it[i] = i < nstate + 1 ? TY(PTC_F32, 3) : SCALAR(PTC_F32);
    rt_result r = rg_ok(op, a, nin, it, (void *const *)bufs);
    cr_assert_eq(r.nout, nstate);
    for (int j = 0; j < nstate; j++) /* result j is the new value of p (j = 0) or state j + 1 */
        memcpy(bufs[j == 0 ? 0 : j + 1], r.out[j], 3 * sizeof(float));
    rt_free(&r);
}

/* lr = 0.1, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.1 on p = (1, -0.5, 2), m = v = 0, with
 * gradients (0.5, -0.1, 0) then (-0.25, 0.3, 0). (torch.optim.AdamW gives the same digits.)
 * step 1: bias_c1 = 1 - 0.9 = 0.1, bias_c2 = 1 - 0.999 = 0.001, step_size = 0.1 / 0.1 = 1
 *   p0: decay 1 * (1 - 0.1*0.1) = 0.99; m = 0.1*0.5 = 0.05; v = 0.001*0.25 = 0.00025;
 *       denom = sqrt(0.00025)/sqrt(0.001) + 1e-8 = 0.5 + 1e-8; p = 0.99 - 0.05/0.50000001
 *       = 0.99 - 0.099999998 = 0.890000002
 *   p1: decay -0.495; m = -0.01; v = 1e-5; denom = 0.1 + 1e-8; p = -0.495 + 0.09999999 =
 * -0.39500001 p2: g = 0 gives m = v = 0, so only the decay: 2 * 0.99 = 1.98 step 2: bias_c1 = 1 -
 * 0.81 = 0.19, bias_c2 = 1 - 0.998001 = 0.001999, step_size = 0.1/0.19 p0: decay 0.890000002 * 0.99
 * = 0.88110000198; m = 0.9*0.05 + 0.1*(-0.25) = 0.02; v = 0.999*0.00025 + 0.001*0.0625 =
 * 0.00031225; denom = sqrt(0.00031225/0.001999) + 1e-8 = 0.39522539; p = 0.88110000198 -
 * 0.52631579*0.02/0.39522539 = 0.88110000198 - 0.0266337 = 0.854466299 p1: decay -0.3910500099; m =
 * -0.009 + 0.03 = 0.021; v = 0.00000999 + 0.00009 = 0.00009999; denom = sqrt(0.00009999/0.001999) +
 * 1e-8 = 0.22365155; p = -0.3910500099 - 0.0494190 = -0.440468991 p2: 1.98 * 0.99 = 1.9602 */
Test(ref_grad, adamw_update_two_steps)
{
    float p[3] = {1, -0.5f, 2}, g[3], m[3] = {0}, v[3] = {0}, lr[1] = {0.1f}, t[1] = {1};
    float *bufs[6] = {p, g, m, v, lr, t};
    ptc_attrs a = ptc_attrs_default(PTC_OP_ADAMW_UPDATE);
    a.beta1 = 0.9;
    a.beta2 = 0.999;
    a.eps = 1e-8;
    a.wd = 0.1;
    /* lr is stored as a float (0.1f = 0.100000001490116), so results carry a relative error of
     * about 1e-8 from it; 1e-6 relative tolerance leaves room for that and the float stores */
    memcpy(g, (float[]){0.5f, -0.1f, 0}, sizeof g);
    step(PTC_OP_ADAMW_UPDATE, a, 6, bufs, 3);
    rt_expect_near(p, 3, RT_LIST(0.890000002, -0.39500001, 1.98), 1e-6);
    rt_expect_near(m, 3, RT_LIST(0.05, -0.01, 0), 1e-6);
    rt_expect_near(v, 3, RT_LIST(0.00025, 1e-5, 0), 1e-6);
    memcpy(g, (float[]){-0.25f, 0.3f, 0}, sizeof g);
    t[0] = 2;
    step(PTC_OP_ADAMW_UPDATE, a, 6, bufs, 3);
    rt_expect_near(p, 3, RT_LIST(0.854466299, -0.440468991, 1.9602), 1e-6);
    rt_expect_near(m, 3, RT_LIST(0.02, 0.021, 0), 1e-6);
    rt_expect_near(v, 3, RT_LIST(0.00031225, 0.00009999, 0), 1e-6);
}

/* lr = 0.1, momentum = 0.9, wd = 0.1, p = (1, -0.5, 2), buf = 0, gradients (0.5, -0.1, 0) then
 * (-0.25, 0.3, 0). (torch.optim.SGD gives the same digits.)
 * step 1: d = g + 0.1 p = (0.6, -0.15, 0.2); buf = 0.9*0 + d = d; p -= 0.1 d: (0.94, -0.485, 1.98)
 * step 2: d = (-0.25 + 0.094, 0.3 - 0.0485, 0 + 0.198) = (-0.156, 0.2515, 0.198);
 *         buf = 0.9 (0.6, -0.15, 0.2) + d = (0.384, 0.1165, 0.378);
 *         p -= 0.1 buf: (0.94 - 0.0384, -0.485 - 0.01165, 1.98 - 0.0378) = (0.9016,
 * -0.49665, 1.9422) Without momentum (buf stays as given, here 7s): d is the step. step 1: d =
 * (0.6, -0.15, 0.2): p = (0.94, -0.485, 1.98); step 2: d = (-0.156, 0.2515, 0.198): p = (0.9556,
 * -0.51015, 1.9602) */
Test(ref_grad, sgd_update_two_steps)
{
    float p[3] = {1, -0.5f, 2}, g[3], buf[3] = {0}, lr[1] = {0.1f};
    float *bufs[4] = {p, g, buf, lr};
    ptc_attrs a = ptc_attrs_default(PTC_OP_SGD_UPDATE);
    a.momentum = 0.9;
    a.wd = 0.1;
    memcpy(g, (float[]){0.5f, -0.1f, 0}, sizeof g);
    step(PTC_OP_SGD_UPDATE, a, 4, bufs, 2);
    rt_expect_near(p, 3, RT_LIST(0.94, -0.485, 1.98), 1e-6);
    rt_expect_near(buf, 3, RT_LIST(0.6, -0.15, 0.2), 1e-6);
    memcpy(g, (float[]){-0.25f, 0.3f, 0}, sizeof g);
    step(PTC_OP_SGD_UPDATE, a, 4, bufs, 2);
    rt_expect_near(p, 3, RT_LIST(0.9016, -0.49665, 1.9422), 1e-6);
    rt_expect_near(buf, 3, RT_LIST(0.384, 0.1165, 0.378), 1e-6);

    memcpy(p, (float[]){1, -0.5f, 2}, sizeof p);
    memcpy(buf, (float[]){7, 7, 7}, sizeof buf);
    a.momentum = 0;
    memcpy(g, (float[]){0.5f, -0.1f, 0}, sizeof g);
    step(PTC_OP_SGD_UPDATE, a, 4, bufs, 2);
    rt_expect_near(p, 3, RT_LIST(0.94, -0.485, 1.98), 1e-6);
    rt_expect_near(buf, 3, RT_LIST(7, 7, 7), 0);
    memcpy(g, (float[]){-0.25f, 0.3f, 0}, sizeof g);
    step(PTC_OP_SGD_UPDATE, a, 4, bufs, 2);
    rt_expect_near(p, 3, RT_LIST(0.9556, -0.51015, 1.9602), 1e-6);
}
