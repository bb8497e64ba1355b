/* test_autodiff.c - the reverse-mode pass (passes/autodiff.c) checked by finite differences.
 *
 * Every test writes a tiny .ptm model that routes parameters through the op under test into a
 * scalar loss, compiles it with the front end, runs the training pass list (autodiff, then the
 * optimizer pass, with the verifier after each), lowers it to an execution plan and runs the
 * whole step once on the reference backend (lr 0, step 1, no clipping: the in-place updates leave
 * the parameters as they were). The gradient of every parameter (graph output 1 + i, kept
 * readable by the plan) is then compared element by element with a central finite difference of
 * the loss, recomputed by perturbing the parameter's buffer and running the plan's eval entry
 * (the instructions the loss needs). Inputs are random (normal(0, 1)) unless a test gives them;
 * parameters start from their init, and tests that sit near a kink (relu, max) or need exact
 * values (cast) write them.
 *
 * Beyond one test per op: broadcasting in both directions, the three kinds of matmul, every axis
 * of the reductions and of softmax, split with an unused result, embedding with repeated ids,
 * causal / non-causal / grouped-query attention, a parameter the loss does not depend on (exact
 * zeros), gradients that accumulate over several uses, casts (exact points and the identity-cast
 * property), and the whole gpt2_tiny and llama_tiny models at tiny sizes.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "frontend.h"
#include "passes.h"
#include "planner.h"
#include "ref.h"

/* ---- tolerance ----
 * The kernels accumulate in double but store every intermediate as float, so one evaluation of an
 * O(1) loss carries an error of a few float ulps (about 1e-7 relative, more after a long chain).
 * The central difference divides that by 2h: with h = 1e-2 and |L| <= ~10 that is <= ~1e-4 of
 * noise, which FD_NOISE bounds from the loss actually seen (16 ulps of |L|, divided by the step).
 * The truncation error of the central difference is h^2/6 * |f'''|, about 2e-5 for O(1) third
 * derivatives (these models keep values O(1) and away from the singular points of log, rsqrt,
 * division, and away from the kinks of relu and max, by construction). A wrong rule (a missing
 * term, a wrong scale, a transposed or mis-broadcast index) is off by O(10%) or more. So each
 * element must satisfy
 *     |analytic - fd| <= atol + rtol * |fd|,  atol = 1e-3 * max|analytic| + FD_NOISE,  rtol = 1e-2,
 * and the gradient must not be all zero (max|analytic| > 1e-3 and the finite differences see it
 * too), so no check passes trivially. The worst element of each parameter is logged
 * (--verbose) as a fraction of its allowance: at most 0.09 over every test here (0.21 in the bf16
 * cast test, whose gradient is rounded to bf16 by design), while a rule whose result is off by as
 * little as 2% fails. */
#define FD_H 1e-2
#define FD_RTOL 1e-2
#define FD_ATOL_REL 1e-3
#define FD_NOISE(loss, h) (16.0 * FLT_EPSILON * fmax(fabs(loss), 1.0) / (2.0 * (h)))
#define FD_MIN_GRAD 1e-3

static const ptc_compile_opts train_opts = {.train = true, .verify_each = true};

/* One model, compiled for training, lowered to a plan and loaded into an executor. */
typedef struct adc {
    const char *what; /* for messages */
    ptc_graph *g;
    ptc_pass_ctx ctx;
    ptc_plan *plan;
    ptrt_exec *x;
    int *params; /* value id of the i-th PARAM, graph order */
    int *pbuf;   /* its buffer in the plan */
    bool *given; /* inputs the test set (by buffer) */
    float **grads; /* every parameter's gradient, copied after the step (a later run of the plan
                      may reuse the bytes of its buffer) */
    void **inputs; /* every input's data, to feed again before each run (the plan reuses the
                      bytes of an input after its last use) */
    char err[512];
    bool ran;
} adc;

static int find_input(const adc *c, const char *name)
{
    int b = ptrt_exec_find(c->x, PTC_BUF_INPUT, name);
    cr_assert_geq(b, 0, "no input '%s'", name);
    return b;
}

static float *input_data(adc *c, const char *name)
{
    return ptrt_exec_data(c->x, find_input(c, name));
}

static void set_scalar(adc *c, const char *name, float value)
{
    int b = find_input(c, name);
    *(float *)ptrt_exec_data(c->x, b) = value;
    c->given[b] = true;
}

/* Compiles src with the defines, runs the training passes and sets up an interpreter with the
 * parameters at their initial values for seed 1. */
static void adc_open_defs(adc *c, const char *what, const char *src, size_t len,
                          const ptc_define *defs, int ndefs)
{
    memset(c, 0, sizeof *c);
    c->what = what;
    char *msgs = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&msgs, &n);
    cr_assert_not_null(f);
    ptc_diag d;
    ptc_diag_init(&d, f, "t.ptm", src, len);
    ptc_frontend_opts fo = {.defines = defs, .ndefines = ndefs};
    c->g = ptc_frontend_compile("t.ptm", src, len, &fo, &d);
    fclose(f);
    cr_assert_not_null(c->g, "%s: compilation failed:\n%s", what, msgs);
    free(msgs);

    int np = ptc_graph_params(c->g, NULL, 0);
    c->ctx = (ptc_pass_ctx){.g = c->g, .opts = &train_opts, .err = c->err, .errn = sizeof c->err};
    cr_assert_eq(ptc_run_passes(&c->ctx), 0, "%s: passes failed: %s", what, c->err);
    cr_assert_eq(c->ctx.nparams, np, "%s: %d gradients for %d params", what, c->ctx.nparams, np);
    c->params = malloc(sizeof(int) * (size_t)(np ? np : 1));
    cr_assert_not_null(c->params);
    int nodes[256];
    cr_assert_leq(np, 256);
    ptc_graph_params(c->g, nodes, np);
    for (int i = 0; i < np; i++) {
        c->params[i] = c->g->nodes[nodes[i]].out[0];
        int gv = c->ctx.grads[i];
        cr_assert(gv >= 0 && gv < c->g->nvalues, "%s: gradient %d is value %d", what, i, gv);
        cr_assert(ptc_type_eq(&c->g->values[gv].type, &c->g->values[c->params[i]].type),
                  "%s: the gradient of %s does not have the parameter's type", what,
                  c->g->nodes[nodes[i]].attrs.name);
        /* the optimizer pass exports the norm, then the gradients */
        cr_assert_eq(c->g->outputs[1 + i], gv, "%s: output %d is not gradient %d", what, 1 + i, i);
    }
    if (np)
        cr_assert_eq(c->g->noutputs, 1 + np);

    ptc_lower_opts lo = {.keep_grad_outputs = true};
    c->plan = ptc_lower(c->g, &lo, c->err, sizeof c->err);
    cr_assert_not_null(c->plan, "%s: %s", what, c->err);
    c->x = ptrt_exec_new(c->plan, 0, NULL, c->err, sizeof c->err);
    cr_assert_not_null(c->x, "%s: %s", what, c->err);
    const ptc_program *pg = ptrt_exec_program(c->x);
    cr_assert_eq(pg->noutputs, np, "%s: the plan keeps %d gradients for %d params", what,
                 pg->noutputs, np);
    c->pbuf = malloc(sizeof(int) * (size_t)(np ? np : 1));
    c->given = calloc((size_t)(pg->nbufs ? pg->nbufs : 1), sizeof(bool));
    cr_assert(c->pbuf && c->given);
    for (int i = 0; i < np; i++) {
        c->pbuf[i] = ptrt_exec_find(c->x, PTC_BUF_PARAM, c->g->nodes[nodes[i]].attrs.name);
        cr_assert_geq(c->pbuf[i], 0);
    }
    ptrt_exec_init_state(c->x, 1);
    /* harmless optimizer inputs (the updates are never applied anyway) */
    set_scalar(c, PTC_IN_LR, 0.0f);
    set_scalar(c, PTC_IN_STEP, 1.0f);
    set_scalar(c, PTC_IN_MAX_NORM, INFINITY);
}

static void adc_open(adc *c, const char *what, const char *src)
{
    adc_open_defs(c, what, src, strlen(src), NULL, 0);
}

static void adc_close(adc *c)
{
    for (int b = 0; c->inputs && b < c->plan->programs[0].nbufs; b++)
        free(c->inputs[b]);
    free(c->inputs);
    ptrt_exec_free(c->x);
    ptc_plan_free(c->plan);
    ptc_pass_ctx_free(&c->ctx);
    ptc_graph_free(c->g);
    free(c->params);
    free(c->pbuf);
    free(c->given);
    for (int i = 0; c->grads && i < c->ctx.nparams; i++)
        free(c->grads[i]);
    free(c->grads);
    memset(c, 0, sizeof *c);
}

static int nparams(const adc *c)
{
    return c->ctx.nparams;
}

static const char *param_name(const adc *c, int i)
{
    return c->g->nodes[c->g->values[c->params[i]].def].attrs.name;
}

static int64_t numel(const adc *c, int v)
{
    return ptc_type_numel(&c->g->values[v].type);
}

/* The index (graph order) of the parameter called name. */
static int param_index(const adc *c, const char *name)
{
    for (int i = 0; i < nparams(c); i++)
        if (strcmp(param_name(c, i), name) == 0)
            return i;
    cr_assert_fail("%s: no parameter '%s'", c->what, name);
    return -1;
}

static float *param_data(adc *c, int i)
{
    return ptrt_exec_data(c->x, c->pbuf[i]);
}

static void set_param(adc *c, const char *name, const float *vals, int64_t n)
{
    int i = param_index(c, name), v = c->params[i];
    cr_assert_eq(numel(c, v), n, "%s: %s has %lld elements", c->what, name, (long long)numel(c, v));
    memcpy(param_data(c, i), vals, (size_t)n * sizeof(float));
}

static int64_t input_numel(const adc *c, const char *name)
{
    return ptc_type_numel(&ptrt_exec_program(c->x)->bufs[find_input(c, name)].type);
}

static void set_input(adc *c, const char *name, const void *vals, int64_t n)
{
    int b = find_input(c, name);
    cr_assert_eq(input_numel(c, name), n, "%s: input %s has %lld elements", c->what, name,
                 (long long)input_numel(c, name));
    memcpy(ptrt_exec_data(c->x, b), vals, (size_t)n * 4);
    c->given[b] = true;
}

/* Deterministic pseudo-random numbers (an LCG), uniform in [0, 1). */
static double lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (double)(*s >> 8) * (1.0 / 16777216.0);
}

/* Adds uniform(-amp, amp) to every parameter: the whole-model tests move the weights away from
 * their small init (std 0.02), where the deep paths have gradients of 1e-4 or less, i.e. at the
 * level of the finite-difference noise. */
static void jitter_params(adc *c, double amp)
{
    for (int i = 0; i < nparams(c); i++) {
        float *p = param_data(c, i);
        uint32_t s = 0x9e3779b9u * (uint32_t)(i + 1);
        for (int64_t k = 0; k < numel(c, c->params[i]); k++)
            p[k] += (float)(amp * (2 * lcg(&s) - 1));
    }
}

/* Gives the remaining inputs random values and runs the whole step. */
static void adc_run(adc *c)
{
    const ptc_program *pg = ptrt_exec_program(c->x);
    for (int b = 0; b < pg->nbufs; b++)
        if (pg->bufs[b].kind == PTC_BUF_INPUT && !c->given[b])
            cr_assert_eq(ptrt_exec_random_input(c->x, b, pg->bufs[b].name, 7, c->err,
                                                sizeof c->err),
                         0, "%s: %s", c->what, c->err);
    c->inputs = calloc((size_t)(pg->nbufs ? pg->nbufs : 1), sizeof *c->inputs);
    cr_assert_not_null(c->inputs);
    for (int b = 0; b < pg->nbufs; b++)
        if (pg->bufs[b].kind == PTC_BUF_INPUT) {
            c->inputs[b] = malloc((size_t)pg->bufs[b].bytes + 1);
            cr_assert_not_null(c->inputs[b]);
            memcpy(c->inputs[b], ptrt_exec_data(c->x, b), (size_t)pg->bufs[b].bytes);
        }
    cr_assert_eq(ptrt_exec_run(c->x, PTRT_ENTRY_STEP, 1, c->err, sizeof c->err), 0,
                 "%s: run failed: %s", c->what, c->err);
    float loss = *(float *)ptrt_exec_data(c->x, pg->loss);
    cr_assert(isfinite(loss), "%s: loss %g", c->what, (double)loss);
    c->grads = calloc((size_t)(nparams(c) ? nparams(c) : 1), sizeof *c->grads);
    cr_assert_not_null(c->grads);
    for (int i = 0; i < nparams(c); i++) {
        size_t bytes = (size_t)numel(c, c->params[i]) * sizeof(float);
        c->grads[i] = malloc(bytes ? bytes : 1);
        cr_assert_not_null(c->grads[i]);
        memcpy(c->grads[i], ptrt_exec_data(c->x, pg->outputs[i]), bytes);
    }
    c->ran = true;
}

static const float *grad(adc *c, int i)
{
    cr_assert(c->ran);
    return c->grads[i];
}

static double eval_loss(adc *c)
{
    const ptc_program *pg = ptrt_exec_program(c->x);
    for (int b = 0; b < pg->nbufs; b++)
        if (c->inputs[b])
            memcpy(ptrt_exec_data(c->x, b), c->inputs[b], (size_t)pg->bufs[b].bytes);
    cr_assert_eq(ptrt_exec_run(c->x, PTRT_ENTRY_EVAL, 1, c->err, sizeof c->err), 0, "%s: %s",
                 c->what, c->err);
    return *(float *)ptrt_exec_data(c->x, ptrt_exec_program(c->x)->loss);
}

typedef struct fd_opts {
    double h;        /* step (FD_H when 0) */
    int max_elems;   /* check a random subset of this many elements per parameter (0: all) */
    bool allow_zero; /* a parameter may have an all-zero gradient (the loss ignores it) */
} fd_opts;

/* Compares every parameter's gradient with central finite differences (see the tolerance note).
 * Returns the worst error over all checked elements as a fraction of its allowance. */
static double fd_check(adc *c, const fd_opts *o)
{
    fd_opts def = {0};
    if (!o)
        o = &def;
    double h = o->h > 0 ? o->h : FD_H, worst_all = 0;
    if (!c->ran)
        adc_run(c);
    double loss0 = eval_loss(c);
    for (int i = 0; i < nparams(c); i++) {
        const char *name = param_name(c, i);
        int v = c->params[i];
        int64_t n = numel(c, v);
        float *g = malloc((size_t)n * sizeof *g);
        cr_assert_not_null(g);
        memcpy(g, grad(c, i), (size_t)n * sizeof *g);
        double gmax = 0;
        for (int64_t k = 0; k < n; k++) {
            cr_assert(isfinite(g[k]), "%s: d/d%s[%lld] = %g", c->what, name, (long long)k,
                      (double)g[k]);
            gmax = fmax(gmax, fabs(g[k]));
        }
        /* which elements: all, or the first, the last and a random sample */
        int64_t m = o->max_elems > 0 && n > o->max_elems ? o->max_elems : n;
        uint32_t s = 12345u + 977u * (uint32_t)i;
        float *p = param_data(c, i);
        double atol = FD_ATOL_REL * gmax + FD_NOISE(loss0, h), worst = 0, fdmax = 0;
        int bad = 0;
        for (int64_t j = 0; j < m; j++) {
            int64_t k = m == n ? j : j == 0 ? 0 : j == 1 ? n - 1 : (int64_t)(lcg(&s) * (double)n);
            float x0 = p[k], xp = (float)(x0 + h), xm = (float)(x0 - h);
            p[k] = xp;
            double lp = eval_loss(c);
            p[k] = xm;
            double lm = eval_loss(c);
            p[k] = x0;
            /* the perturbed values are floats: divide by the step actually taken */
            double fd = (lp - lm) / ((double)xp - (double)xm);
            double err = fabs(fd - g[k]), allow = atol + FD_RTOL * fabs(fd);
            fdmax = fmax(fdmax, fabs(fd));
            worst = fmax(worst, err / allow);
            if (err > allow && bad++ < 8)
                cr_expect(0,
                          "%s: d loss / d %s[%lld]: autodiff %.7g, finite difference %.7g "
                          "(|diff| %.3g > %.3g)",
                          c->what, name, (long long)k, (double)g[k], fd, err, allow);
        }
        cr_expect_eq(bad, 0, "%s: %s: %d of %lld checked elements off", c->what, name, bad,
                     (long long)m);
        cr_expect(o->allow_zero || (gmax > FD_MIN_GRAD && fdmax > FD_MIN_GRAD),
                  "%s: the gradient of %s is (nearly) zero everywhere: max |autodiff| %.3g, "
                  "max |fd| %.3g: the check would pass trivially",
                  c->what, name, gmax, fdmax);
        cr_log_info("%s: %s: %lld of %lld elements, max |grad| %.3g, worst %.3f of the allowance",
                    c->what, name, (long long)m, (long long)n, gmax, worst);
        worst_all = fmax(worst_all, worst);
        free(g);
    }
    return worst_all;
}

/* The common case: compile, run, check every element of every parameter. */
static void check(const char *what, const char *src)
{
    adc c;
    adc_open(&c, what, src);
    cr_assert_gt(nparams(&c), 0);
    fd_check(&c, NULL);
    adc_close(&c);
}

/* A model over parameters w[2,3] (init as given) and an input t[2,3]: mse(EXPR, t). */
#define UNARY(init, expr)                                                                          \
    "model m(t: f32[2, 3]) {\n"                                                                    \
    "    param w : [2, 3] init " init "\n"                                                         \
    "    return mse(" expr ", t)\n"                                                                \
    "}\n"

/* ---- elementwise functions ---- */

Test(autodiff_unary, exp)
{
    check("exp", UNARY("uniform(-1, 1)", "exp(w)"));
}

Test(autodiff_unary, log_of_positive_values)
{
    check("log", UNARY("uniform(-1, 1)", "log(w * w + 0.5)"));
}

Test(autodiff_unary, sqrt_of_positive_values)
{
    check("sqrt", UNARY("uniform(-1, 1)", "sqrt(w * w + 0.5)"));
}

Test(autodiff_unary, rsqrt_of_positive_values)
{
    check("rsqrt", UNARY("uniform(-1, 1)", "rsqrt(exp(w))"));
    check("rsqrt direct", UNARY("uniform(0.5, 2)", "rsqrt(w)"));
}

Test(autodiff_unary, tanh)
{
    check("tanh", UNARY("uniform(-2, 2)", "tanh(w)"));
}

Test(autodiff_unary, sigmoid)
{
    check("sigmoid", UNARY("uniform(-3, 3)", "sigmoid(w)"));
}

Test(autodiff_unary, relu_away_from_the_kink)
{
    adc c;
    adc_open(&c, "relu", UNARY("zeros", "relu(w) * 3"));
    /* both sides of 0, every value at least 10 steps from it */
    float w[] = {-1.2f, 0.7f, -0.4f, 1.5f, 0.3f, -0.8f};
    set_param(&c, "w", w, 6);
    adc_run(&c);
    const float *g = grad(&c, 0);
    for (int k = 0; k < 6; k++)
        if (w[k] < 0)
            cr_expect_eq(g[k], 0.0f, "relu: negative input %d has gradient %g", k, (double)g[k]);
    fd_check(&c, NULL);
    adc_close(&c);
}

Test(autodiff_unary, gelu)
{
    check("gelu", UNARY("uniform(-3, 3)", "gelu(w)"));
}

Test(autodiff_unary, silu)
{
    check("silu", UNARY("uniform(-3, 3)", "silu(w)"));
}

Test(autodiff_unary, neg)
{
    check("neg", UNARY("uniform(-1, 1)", "-w"));
    check("neg of an expression", UNARY("uniform(-1, 1)", "-(w * w) + -w"));
}

/* ---- cast ----
 * cast(cast(x, bf16), f32) is piecewise constant, so a finite difference through it means nothing
 * in general; its gradient is the identity (straight through), with the incoming gradient rounded
 * to bf16 on the way (the backward of cast(y, f32) casts dy to y's dtype). Two checks:
 *  - at points where x, x + h and x - h are all exactly representable in the narrow format (k/64,
 *    h = 1/64), the cast is exact and the finite difference is well defined: it must agree, within
 *    the rounding of the gradient to the narrow format (2^-9 relative for bf16), and the gradient
 *    must be exactly the incoming one rounded to the format;
 *  - a nonlinear computation done in bf16 / f16 has the gradient of the same computation in f32
 *    (the identity-cast property), within the narrow format's rounding of each of its few steps. */

#define CAST_MODEL(dt)                                                                             \
    "model m(u: f32[2, 3]) {\n"                                                                    \
    "    param x : [2, 3] init zeros\n"                                                            \
    "    return sum(sum(cast(cast(x, " dt "), f32) * u, axis=1), axis=0)\n"                        \
    "}\n"

/* Sets x to k/64 (exact in bf16 and f16, and so are x +- 1/64), runs, and checks the gradient:
 * exactly the incoming gradient u rounded to the narrow format, and the finite difference. */
static void cast_exact_points(const char *what, const char *src, float (*round_fn)(float))
{
    adc c;
    adc_open(&c, what, src);
    float x[6];
    for (int k = 0; k < 6; k++)
        x[k] = (float)(20 + 7 * k) / 64.0f;
    set_param(&c, "x", x, 6);
    adc_run(&c);
    const float *u = input_data(&c, "u");
    const float *g = grad(&c, 0);
    for (int k = 0; k < 6; k++)
        cr_expect_eq(g[k], round_fn(u[k]), "%s: element %d: gradient %.9g, want %.9g", what, k,
                     (double)g[k], (double)round_fn(u[k]));
    fd_opts o = {.h = 1.0 / 64};
    fd_check(&c, &o);
    adc_close(&c);
}

static float round_none(float x)
{
    return x;
}

Test(autodiff_cast, bf16_round_trip_at_exact_points)
{
    cast_exact_points("cast bf16", CAST_MODEL("bf16"), ptrt_round_bf16);
}

Test(autodiff_cast, f16_round_trip_at_exact_points)
{
    cast_exact_points("cast f16", CAST_MODEL("f16"), ptrt_round_f16);
}

Test(autodiff_cast, f32_to_f32_is_the_identity)
{
    cast_exact_points("cast f32", CAST_MODEL("f32"), round_none);
    check("cast f32 nonlinear", UNARY("uniform(-1, 1)", "cast(tanh(cast(w, f32)), f32)"));
}

/* The same computation in DT: a matmul, tanh, a product, mse in DT and mse of a cast back. */
#define MIXED(dt)                                                                                  \
    "model m(t: f32[2, 3]) {\n"                                                                    \
    "    param w : [2, 3] init uniform(-1, 1)\n"                                                   \
    "    param v : [3, 3] init uniform(-1, 1)\n"                                                   \
    "    y = cast(w, " dt ")\n"                                                                    \
    "    z = tanh(y @ cast(v, " dt ")) * y\n"                                                      \
    "    return mse(z, cast(t, " dt ")) + mse(cast(z * z, f32), t)\n"                              \
    "}\n"

/* Gradients of a model in a narrow format against the same model in f32: equal up to tol
 * (relative to the largest gradient element). Returns the worst relative difference. */
static double compare_with_f32(const char *what, const char *narrow, const char *wide, double tol)
{
    adc a, b;
    adc_open(&a, what, narrow);
    adc_open(&b, "f32", wide);
    adc_run(&a);
    adc_run(&b);
    cr_assert_eq(nparams(&a), nparams(&b));
    double worst = 0, ss = 0;
    long cnt = 0;
    for (int i = 0; i < nparams(&a); i++) {
        int64_t n = numel(&a, a.params[i]);
        const float *ga = grad(&a, i), *gb = grad(&b, i);
        double gmax = 0;
        for (int64_t k = 0; k < n; k++)
            gmax = fmax(gmax, fabs(gb[k]));
        cr_assert_gt(gmax, FD_MIN_GRAD);
        for (int64_t k = 0; k < n; k++) {
            double d = fabs((double)ga[k] - gb[k]) / gmax;
            worst = fmax(worst, d);
            ss += d * d;
            cnt++;
            cr_expect(d <= tol, "%s: d/d%s[%lld]: %.7g in %s, %.7g in f32", what, param_name(&a, i),
                      (long long)k, (double)ga[k], what, (double)gb[k]);
        }
    }
    cr_log_info("%s: worst difference %.3g of the largest gradient, rms %.3g", what, worst,
                sqrt(ss / (double)cnt));
    adc_close(&a);
    adc_close(&b);
    return worst;
}

Test(autodiff_cast, bf16_and_f16_computations_have_the_f32_gradient)
{
    /* the f32 model itself against finite differences */
    check("mixed f32", MIXED("f32"));
    /* bf16 keeps 8 significant bits (rounding 2^-9 relative), f16 11 (2^-12); the forward and
     * backward here round about ten times on any path, so 10 roundings bound the difference */
    compare_with_f32("bf16", MIXED("bf16"), MIXED("f32"), 10 * 0x1p-9);
    compare_with_f32("f16", MIXED("f16"), MIXED("f32"), 10 * 0x1p-12);
}

/* Every model op in the narrow format, the parameters cast into it. */
#define DEEP(dt)                                                                                   \
    "model m(ids: i32[2, 4], y: i32[2, 4]) {\n"                                                    \
    "    param table : [6, 8] init uniform(-1, 1)\n"                                               \
    "    param g : [8] init uniform(0.5, 1.5)\n"                                                   \
    "    param b : [8] init uniform(-0.5, 0.5)\n"                                                  \
    "    param w : [8, 24] init uniform(-0.5, 0.5)\n"                                              \
    "    param w2 : [8, 6] init uniform(-0.5, 0.5)\n"                                              \
    "    x = cast(embedding(table, ids), " dt ")\n"                                                \
    "    h = layernorm(x, cast(g, " dt "), cast(b, " dt "))\n"                                     \
    "    q, k, v = split(h @ cast(w, " dt "), 3, axis=-1)\n"                                       \
    "    a = attention(rope(q, heads=2), rope(k, heads=2), v, heads=2)\n"                          \
    "    h = rmsnorm(gelu(a) + silu(x) + x, cast(g, " dt "))\n"                                    \
    "    return cross_entropy(log_softmax(h @ cast(w2, " dt                                        \
    ")), y) + mse(softmax(h, axis=1), x)\n"                                                        \
    "}\n"

Test(autodiff_cast, a_deep_model_in_bf16_and_f16_has_the_f32_gradient)
{
    check("deep f32", DEEP("f32"));
    /* some 30 roundings on the longest paths (measured: 0.027 for bf16, 0.0014 for f16) */
    compare_with_f32("deep bf16", DEEP("bf16"), DEEP("f32"), 30 * 0x1p-9);
    compare_with_f32("deep f16", DEEP("f16"), DEEP("f32"), 30 * 0x1p-12);
}

/* ---- arithmetic with broadcasting ---- */

/* Parameters a (init uniform(-1, 1)) and b (uniform(1, 2), so it divides safely) of the given
 * shapes, an expression of shape [2, 3]. */
#define BIN(sa, sb, expr)                                                                          \
    "model m(t: f32[2, 3]) {\n"                                                                    \
    "    param a : " sa " init uniform(-1, 1)\n"                                                   \
    "    param b : " sb " init uniform(1, 2)\n"                                                    \
    "    return mse(" expr ", t)\n"                                                                \
    "}\n"

Test(autodiff_binary, add_broadcasts_both_ways)
{
    check("[2,3]+[3]", BIN("[2, 3]", "[3]", "a + b"));
    check("[3]+[2,3]", BIN("[3]", "[2, 3]", "a + b"));
    check("[2,1]+[1,3]", BIN("[2, 1]", "[1, 3]", "a + b"));
    check("[2,3]+[2,1]", BIN("[2, 3]", "[2, 1]", "a + b"));
}

Test(autodiff_binary, sub_broadcasts_both_ways)
{
    check("[2,3]-[3]", BIN("[2, 3]", "[3]", "a - b"));
    check("[3]-[2,3]", BIN("[3]", "[2, 3]", "a - b"));
    check("[2,1]-[1,3]", BIN("[2, 1]", "[1, 3]", "a - b"));
}

Test(autodiff_binary, mul_broadcasts_both_ways)
{
    check("[2,3]*[3]", BIN("[2, 3]", "[3]", "a * b"));
    check("[3]*[2,3]", BIN("[3]", "[2, 3]", "a * b"));
    check("[2,1]*[1,3]", BIN("[2, 1]", "[1, 3]", "a * b"));
    check("[1,3]*[2,1]", BIN("[1, 3]", "[2, 1]", "a * b"));
}

Test(autodiff_binary, div_broadcasts_both_ways)
{
    check("[2,3]/[3]", BIN("[2, 3]", "[3]", "a / b"));
    check("[3]/[2,3]", BIN("[3]", "[2, 3]", "a / b"));
    check("[2,1]/[1,3]", BIN("[2, 1]", "[1, 3]", "a / b"));
    check("[1,3]/[2,1]", BIN("[1, 3]", "[2, 1]", "a / b + b / 3"));
}

Test(autodiff_binary, scalar_numbers)
{
    check("numbers", BIN("[2, 3]", "[2, 3]", "2 * a - a / 4 + 1 - (3 - b) * 0.5 + 1 / b"));
    check("numbers on a broadcast operand", BIN("[3]", "[2, 1]", "(a + 1) * (b - 0.5) / 2"));
}

Test(autodiff_binary, rank_3_against_rank_2)
{
    check("[2,3,4]*[3,1]+[4]", "model m(t: f32[2, 3, 4]) {\n"
                               "    param a : [2, 3, 4] init uniform(-1, 1)\n"
                               "    param b : [3, 1] init uniform(-1, 1)\n"
                               "    param c : [4] init uniform(-1, 1)\n"
                               "    return mse(a * b + c - b / (c * c + 1), t)\n"
                               "}\n");
}

/* ---- matmul ---- */

Test(autodiff_matmul, rank_2)
{
    check("[2,3]@[3,4]", "model m(t: f32[2, 4]) {\n"
                         "    param a : [2, 3] init uniform(-1, 1)\n"
                         "    param b : [3, 4] init uniform(-1, 1)\n"
                         "    return mse(a @ b, t)\n"
                         "}\n");
}

Test(autodiff_matmul, rank_3_with_a_rank_2_weight)
{
    check("[2,3,4]@[4,5]", "model m(t: f32[2, 3, 5]) {\n"
                           "    param a : [2, 3, 4] init uniform(-1, 1)\n"
                           "    param w : [4, 5] init uniform(-1, 1)\n"
                           "    return mse(a @ w, t)\n"
                           "}\n");
    /* the weight of an input (the activation needs no gradient) */
    check("x@[4,5]", "model m(x: f32[2, 3, 4], t: f32[2, 3, 5]) {\n"
                     "    param w : [4, 5] init uniform(-1, 1)\n"
                     "    return mse(x @ w, t)\n"
                     "}\n");
    /* a rank-2 activation against a batched weight */
    check("[3,4]@[2,4,2]", "model m(t: f32[2, 3, 2]) {\n"
                           "    param a : [3, 4] init uniform(-1, 1)\n"
                           "    param b : [2, 4, 2] init uniform(-1, 1)\n"
                           "    return mse(a @ b, t)\n"
                           "}\n");
}

Test(autodiff_matmul, batched_with_broadcast_leading_dims)
{
    check("[2,3,4]@[2,4,2]", "model m(t: f32[2, 3, 2]) {\n"
                             "    param a : [2, 3, 4] init uniform(-1, 1)\n"
                             "    param b : [2, 4, 2] init uniform(-1, 1)\n"
                             "    return mse(a @ b, t)\n"
                             "}\n");
    check("[2,1,3,4]@[1,3,4,2]", "model m(t: f32[2, 3, 3, 2]) {\n"
                                 "    param a : [2, 1, 3, 4] init uniform(-1, 1)\n"
                                 "    param b : [1, 3, 4, 2] init uniform(-1, 1)\n"
                                 "    return mse(a @ b, t)\n"
                                 "}\n");
    check("[2,3,4]@[1,4,2]", "model m(t: f32[2, 3, 2]) {\n"
                             "    param a : [2, 3, 4] init uniform(-1, 1)\n"
                             "    param b : [1, 4, 2] init uniform(-1, 1)\n"
                             "    return mse(a @ b, t)\n"
                             "}\n");
}

/* ---- reductions ---- */

/* Builds a model over x[2,3,4] into buf: mse(OP(x, axis=A), t) with t of the reduced shape. */
static const char *reduce_model(char *buf, size_t n, const char *op, int axis, const char *init)
{
    static const char *tshape[] = {"[3, 4]", "[2, 4]", "[2, 3]"};
    snprintf(buf, n,
             "model m(t: f32%s) {\n"
             "    param x : [2, 3, 4] init %s\n"
             "    return mse(%s(x, axis=%d), t)\n"
             "}\n",
             tshape[(axis + 3) % 3], init, op, axis);
    return buf;
}

Test(autodiff_reduce, sum_and_mean_over_each_axis)
{
    const char *ops[] = {"sum", "mean"};
    for (int o = 0; o < 2; o++)
        for (int axis = -3; axis <= 2; axis++) {
            char src[400], what[64];
            snprintf(what, sizeof what, "%s axis=%d", ops[o], axis);
            check(what, reduce_model(src, sizeof src, ops[o], axis, "uniform(-1, 1)"));
        }
    check("sum to a scalar", "model m(t: f32[]) {\n"
                             "    param x : [3] init uniform(-1, 1)\n"
                             "    return mse(sum(x * x, axis=0), t) + mean(x, axis=0)\n"
                             "}\n");
}

Test(autodiff_reduce, max_over_each_axis)
{
    /* distinct values 0.1 apart, so no ties and every max is 5 steps from the runner-up */
    float x[24];
    for (int k = 0; k < 24; k++)
        x[k] = (float)((k * 7) % 24) * 0.1f - 1.2f;
    for (int axis = -3; axis <= 2; axis++) {
        char src[400], what[64];
        snprintf(what, sizeof what, "max axis=%d", axis);
        adc c;
        adc_open(&c, what, reduce_model(src, sizeof src, "max", axis, "zeros"));
        set_param(&c, "x", x, 24);
        adc_run(&c);
        /* exactly one element per reduced row gets a gradient */
        const float *g = grad(&c, 0);
        int nonzero = 0;
        for (int k = 0; k < 24; k++)
            nonzero += g[k] != 0;
        int64_t reduced = input_numel(&c, "t");
        cr_expect_leq(nonzero, reduced, "%s: %d nonzero gradient elements for %lld maxima", what,
                      nonzero, (long long)reduced);
        fd_check(&c, NULL);
        adc_close(&c);
    }
}

Test(autodiff_reduce, chains_to_the_loss)
{
    check("sum/mean/max chain", "model m() {\n"
                                "    param x : [2, 3, 4] init uniform(-1, 1)\n"
                                "    return sum(mean(max(exp(x), axis=1), axis=0), axis=0)\n"
                                "}\n");
}

/* ---- normalisation ---- */

Test(autodiff_norm, layernorm)
{
    check("layernorm", "model m(t: f32[2, 3, 4]) {\n"
                       "    param x : [2, 3, 4] init uniform(-1, 1)\n"
                       "    param g : [4] init uniform(0.5, 1.5)\n"
                       "    param b : [4] init uniform(-0.5, 0.5)\n"
                       "    return mse(layernorm(x, g, b), t)\n"
                       "}\n");
    check("layernorm eps=0.1 rank 2", "model m(t: f32[3, 5]) {\n"
                                      "    param x : [3, 5] init uniform(-1, 1)\n"
                                      "    param g : [5] init uniform(0.5, 1.5)\n"
                                      "    param b : [5] init uniform(-0.5, 0.5)\n"
                                      "    return mse(layernorm(x, g, b, eps=0.1), t)\n"
                                      "}\n");
}

Test(autodiff_norm, rmsnorm)
{
    check("rmsnorm", "model m(t: f32[2, 3, 4]) {\n"
                     "    param x : [2, 3, 4] init uniform(-1, 1)\n"
                     "    param g : [4] init uniform(0.5, 1.5)\n"
                     "    return mse(rmsnorm(x, g), t)\n"
                     "}\n");
    check("rmsnorm eps=0.1 rank 2", "model m(t: f32[3, 5]) {\n"
                                    "    param x : [3, 5] init uniform(-1, 1)\n"
                                    "    param g : [5] init uniform(0.5, 1.5)\n"
                                    "    return mse(rmsnorm(x, g, eps=0.1), t)\n"
                                    "}\n");
}

static void softmax_axes(const char *op)
{
    for (int axis = -3; axis <= 2; axis++) {
        char src[400], what[64];
        snprintf(what, sizeof what, "%s axis=%d", op, axis);
        snprintf(src, sizeof src,
                 "model m(t: f32[2, 3, 4]) {\n"
                 "    param x : [2, 3, 4] init uniform(-2, 2)\n"
                 "    return mse(%s(x, axis=%d), t)\n"
                 "}\n",
                 op, axis);
        check(what, src);
    }
    char src[400];
    snprintf(src, sizeof src,
             "model m(t: f32[2, 5]) {\n"
             "    param x : [2, 5] init uniform(-2, 2)\n"
             "    return mse(%s(x), t)\n"
             "}\n",
             op);
    check(op, src);
}

Test(autodiff_norm, softmax_over_each_axis)
{
    softmax_axes("softmax");
}

Test(autodiff_norm, log_softmax_over_each_axis)
{
    softmax_axes("log_softmax");
}

/* ---- shape ops ---- */

Test(autodiff_shape, reshape)
{
    check("reshape [4,6]", "model m(t: f32[4, 6]) {\n"
                           "    param x : [2, 3, 4] init uniform(-1, 1)\n"
                           "    return mse(reshape(x, [4, 6]), t)\n"
                           "}\n");
    check("reshape [24] and up", "model m(t: f32[3, 2, 2, 2]) {\n"
                                 "    param x : [2, 3, 4] init uniform(-1, 1)\n"
                                 "    y = reshape(x, [24]) * 2\n"
                                 "    return mse(reshape(y, [3, 2, 2, 2]), t)\n"
                                 "}\n");
}

Test(autodiff_shape, transpose)
{
    check("transpose rank 2", "model m(t: f32[4, 3]) {\n"
                              "    param x : [3, 4] init uniform(-1, 1)\n"
                              "    return mse(transpose(x), t)\n"
                              "}\n");
    check("transpose rank 3", "model m(t: f32[2, 4, 3]) {\n"
                              "    param x : [2, 3, 4] init uniform(-1, 1)\n"
                              "    return mse(transpose(x), t)\n"
                              "}\n");
}

Test(autodiff_shape, permute)
{
    /* permutations that are not their own inverse, so an inverted rule shows */
    check("permute [2,0,1]", "model m(t: f32[4, 2, 3]) {\n"
                             "    param x : [2, 3, 4] init uniform(-1, 1)\n"
                             "    return mse(permute(x, [2, 0, 1]), t)\n"
                             "}\n");
    check("permute [1,2,0]", "model m(t: f32[3, 4, 2]) {\n"
                             "    param x : [2, 3, 4] init uniform(-1, 1)\n"
                             "    return mse(permute(x, [1, 2, 0]), t)\n"
                             "}\n");
    check("permute rank 4", "model m(t: f32[3, 2, 2, 2]) {\n"
                            "    param x : [2, 2, 3, 2] init uniform(-1, 1)\n"
                            "    return mse(permute(x, [2, 0, 3, 1]), t)\n"
                            "}\n");
}

Test(autodiff_shape, split_with_an_unused_result)
{
    adc c;
    adc_open(&c, "split",
             "model m(t: f32[2, 2]) {\n"
             "    param x : [2, 6] init uniform(-1, 1)\n"
             "    a, b, unused = split(x, 3, axis=-1)\n"
             "    return mse(a * b, t)\n"
             "}\n");
    adc_run(&c);
    const float *g = grad(&c, 0);
    for (int r = 0; r < 2; r++)
        for (int col = 4; col < 6; col++)
            cr_expect_eq(g[r * 6 + col], 0.0f, "split: unused element [%d,%d] has gradient %g", r,
                         col, (double)g[r * 6 + col]);
    fd_check(&c, NULL);
    adc_close(&c);
    check("split axis 0", "model m(t: f32[2, 3]) {\n"
                          "    param x : [4, 3] init uniform(-1, 1)\n"
                          "    p, q = split(x, 2, axis=0)\n"
                          "    return mse(p - 2 * q, t)\n"
                          "}\n");
    check("split, only the middle used", "model m(t: f32[2, 2, 2]) {\n"
                                         "    param x : [2, 2, 6] init uniform(-1, 1)\n"
                                         "    a, b, c = split(x, 3, axis=2)\n"
                                         "    return mse(tanh(b), t)\n"
                                         "}\n");
}

Test(autodiff_shape, concat)
{
    check("concat axis 0", "model m(t: f32[3, 3]) {\n"
                           "    param a : [2, 3] init uniform(-1, 1)\n"
                           "    param b : [1, 3] init uniform(-1, 1)\n"
                           "    return mse(concat(a, b, axis=0), t)\n"
                           "}\n");
    check("concat axis -1 of three", "model m(t: f32[2, 6]) {\n"
                                     "    param a : [2, 3] init uniform(-1, 1)\n"
                                     "    param b : [2, 2] init uniform(-1, 1)\n"
                                     "    param c : [2, 1] init uniform(-1, 1)\n"
                                     "    return mse(concat(a, b * b, c, axis=-1), t)\n"
                                     "}\n");
    check("concat of one value twice", "model m(t: f32[4, 3]) {\n"
                                       "    param a : [2, 3] init uniform(-1, 1)\n"
                                       "    return mse(concat(a, exp(a), axis=0), t)\n"
                                       "}\n");
    check("concat with an input", "model m(x: f32[2, 2], t: f32[2, 5]) {\n"
                                  "    param a : [2, 3] init uniform(-1, 1)\n"
                                  "    return mse(concat(x, a, axis=1), t)\n"
                                  "}\n");
}

Test(autodiff_shape, slice)
{
    adc c;
    adc_open(&c, "slice",
             "model m(t: f32[2, 3, 3]) {\n"
             "    param x : [2, 5, 3] init uniform(-1, 1)\n"
             "    return mse(slice(x, axis=1, start=1, len=3), t)\n"
             "}\n");
    adc_run(&c);
    const float *g = grad(&c, 0);
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 3; k++) {
            cr_expect_eq(g[b * 15 + 0 * 3 + k], 0.0f);
            cr_expect_eq(g[b * 15 + 4 * 3 + k], 0.0f);
        }
    fd_check(&c, NULL);
    adc_close(&c);
    check("slice last axis", "model m(t: f32[2, 2]) {\n"
                             "    param x : [2, 4] init uniform(-1, 1)\n"
                             "    return mse(slice(x, axis=-1, start=2, len=2), t)\n"
                             "}\n");
}

/* ---- model ops ---- */

Test(autodiff_model, embedding_with_repeated_ids)
{
    adc c;
    adc_open(&c, "embedding",
             "model m(ids: i32[2, 4], t: f32[2, 4, 3]) {\n"
             "    param table : [5, 3] init uniform(-1, 1)\n"
             "    return mse(embedding(table, ids), t)\n"
             "}\n");
    /* row 1 four times, row 3 twice, rows 0 and 4 once, row 2 never */
    int32_t ids[] = {1, 3, 1, 1, 0, 3, 4, 1};
    set_input(&c, "ids", ids, 8);
    adc_run(&c);
    const float *g = grad(&c, 0);
    for (int k = 0; k < 3; k++)
        cr_expect_eq(g[2 * 3 + k], 0.0f, "embedding: unused row 2 has gradient %g",
                     (double)g[6 + k]);
    fd_check(&c, NULL);
    adc_close(&c);

    adc_open(&c, "embedding into cross_entropy",
             "model m(ids: i32[2, 4], y: i32[2, 4]) {\n"
             "    param table : [5, 3] init uniform(-1, 1)\n"
             "    param w : [3, 6] init uniform(-1, 1)\n"
             "    return cross_entropy(embedding(table, ids) @ w, y)\n"
             "}\n");
    set_input(&c, "ids", ids, 8);
    fd_check(&c, NULL);
    adc_close(&c);
}

/* q [2,3,H*2] and k, v [2,3,G*2] as parameters (dh = 2), mse of the attention against t. */
static void attention_case(int heads, int kv_heads, bool causal)
{
    char src[600], what[80];
    snprintf(what, sizeof what, "attention heads=%d kv_heads=%d causal=%s", heads, kv_heads,
             causal ? "true" : "false");
    snprintf(src, sizeof src,
             "model m(t: f32[2, 3, %d]) {\n"
             "    param q : [2, 3, %d] init uniform(-1, 1)\n"
             "    param k : [2, 3, %d] init uniform(-1, 1)\n"
             "    param v : [2, 3, %d] init uniform(-1, 1)\n"
             "    return mse(attention(q, k, v, heads=%d, kv_heads=%d, causal=%s), t)\n"
             "}\n",
             2 * heads, 2 * heads, 2 * kv_heads, 2 * kv_heads, heads, kv_heads,
             causal ? "true" : "false");
    check(what, src);
}

Test(autodiff_model, attention_causal_and_not)
{
    attention_case(1, 1, true);
    attention_case(1, 1, false);
    attention_case(2, 2, true);
    attention_case(2, 2, false);
    check("attention with default kv_heads and causal",
          "model m(t: f32[2, 3, 4]) {\n"
          "    param x : [2, 3, 4] init uniform(-1, 1)\n"
          "    param w : [4, 12] init uniform(-1, 1)\n"
          "    q, k, v = split(x @ w, 3, axis=-1)\n"
          "    return mse(attention(q, k, v, heads=2), t)\n"
          "}\n");
}

Test(autodiff_model, attention_grouped_query)
{
    attention_case(4, 2, true);
    attention_case(4, 2, false);
    attention_case(4, 1, true);
    attention_case(3, 1, false);
}

Test(autodiff_model, rope)
{
    check("rope heads=2", "model m(t: f32[2, 3, 8]) {\n"
                          "    param x : [2, 3, 8] init uniform(-1, 1)\n"
                          "    return mse(rope(x, heads=2), t)\n"
                          "}\n");
    check("rope heads=1 base=100", "model m(t: f32[1, 4, 6]) {\n"
                                   "    param x : [1, 4, 6] init uniform(-1, 1)\n"
                                   "    return mse(rope(x, heads=1, base=100), t)\n"
                                   "}\n");
    check("rope of a projection", "model m(x: f32[2, 3, 4], t: f32[2, 3, 4]) {\n"
                                  "    param w : [4, 4] init uniform(-1, 1)\n"
                                  "    return mse(rope(x @ w, heads=2) * rope(x, heads=2), t)\n"
                                  "}\n");
}

Test(autodiff_loss, cross_entropy)
{
    check("cross_entropy rank 3", "model m(y: i32[2, 3]) {\n"
                                  "    param logits : [2, 3, 5] init uniform(-2, 2)\n"
                                  "    return cross_entropy(logits, y)\n"
                                  "}\n");
    check("cross_entropy rank 2 of a matmul", "model m(x: f32[4, 3], y: i32[4]) {\n"
                                              "    param w : [3, 5] init uniform(-1, 1)\n"
                                              "    return cross_entropy(x @ w, y)\n"
                                              "}\n");
}

Test(autodiff_loss, mse)
{
    check("mse(a, b)", "model m() {\n"
                       "    param a : [2, 3] init uniform(-1, 1)\n"
                       "    param b : [2, 3] init uniform(-1, 1)\n"
                       "    return mse(a, b)\n"
                       "}\n");
    check("mse(t, a)", "model m(t: f32[2, 3]) {\n"
                       "    param a : [2, 3] init uniform(-1, 1)\n"
                       "    return mse(t, a)\n"
                       "}\n");
    check("mse(a, a * b)", "model m() {\n"
                           "    param a : [4] init uniform(-1, 1)\n"
                           "    param b : [4] init uniform(-1, 1)\n"
                           "    return mse(a, a * b)\n"
                           "}\n");
}

/* ---- structure: unused parameters, accumulation ---- */

Test(autodiff_structure, unused_parameters_get_zero_gradients)
{
    adc c;
    adc_open(&c, "unused",
             "model m(t: f32[2, 3]) {\n"
             "    param w : [2, 3] init uniform(-1, 1)\n"
             "    param unused : [4] init uniform(-1, 1)\n"
             "    param dead : [2, 3] init uniform(-1, 1)\n"
             "    z = exp(dead) * w\n" /* computed, but not part of the loss */
             "    return mse(w * 2, t)\n"
             "}\n");
    adc_run(&c);
    for (int i = 1; i < 3; i++) {
        const float *g = grad(&c, i);
        for (int64_t k = 0; k < numel(&c, c.params[i]); k++)
            cr_expect_eq(g[k], 0.0f, "%s[%lld] has gradient %g", param_name(&c, i), (long long)k,
                         (double)g[k]);
    }
    fd_opts o = {.allow_zero = true};
    fd_check(&c, &o);
    adc_close(&c);

    /* a loss that depends on no parameter at all */
    adc_open(&c, "no dependence",
             "model m(t: f32[3]) {\n"
             "    param w : [3] init ones\n"
             "    return sum(t * t, axis=0)\n"
             "}\n");
    adc_run(&c);
    for (int k = 0; k < 3; k++)
        cr_expect_eq(grad(&c, 0)[k], 0.0f);
    adc_close(&c);
}

Test(autodiff_structure, gradients_accumulate_over_uses)
{
    check("x*x", UNARY("uniform(-1, 1)", "w * w"));
    check("x in two branches",
          "model m(t: f32[2, 3]) {\n"
          "    param w : [2, 3] init uniform(-1, 1)\n"
          "    param v : [3, 3] init uniform(-1, 1)\n"
          "    y = w @ v\n"
          "    return mse(tanh(y) + sigmoid(y) * y, t) + mean(mean(w, axis=0), axis=0)\n"
          "}\n");
    check("w @ transpose(w)", "model m(t: f32[2, 2]) {\n"
                              "    param w : [2, 3] init uniform(-1, 1)\n"
                              "    return mse(w @ transpose(w), t)\n"
                              "}\n");
    check("reassigned in repeat", "model m(t: f32[2, 3]) {\n"
                                  "    param w : [2, 3] init uniform(-1, 1)\n"
                                  "    x = w\n"
                                  "    repeat 3 as i {\n"
                                  "        x = tanh(x) * w + x\n"
                                  "    }\n"
                                  "    return mse(x, t)\n"
                                  "}\n");
    check("one block, two instances and a shared param",
          "block lin(x: f32[2, 3]) -> f32[2, 3] {\n"
          "    param w : [3, 3] init uniform(-1, 1)\n"
          "    return tanh(x @ w)\n"
          "}\n"
          "model m(x: f32[2, 3], t: f32[2, 3]) {\n"
          "    param s : [3] init uniform(0.5, 1.5)\n"
          "    y = lin(x * s) as l1\n"
          "    y = lin(y * s) as l2\n"
          "    return mse(y, t)\n"
          "}\n");
}

/* ---- whole models ---- */

static void check_example(const char *name, const ptc_define *defs, int ndefs, int per_param)
{
    char path[512];
    snprintf(path, sizeof path, "%s/examples/%s", PTC_SOURCE_DIR, name);
    size_t len;
    char *src = ptc_read_file(path, &len);
    cr_assert_not_null(src, "cannot read %s", path);
    adc c;
    adc_open_defs(&c, name, src, len, defs, ndefs);
    free(src);
    jitter_params(&c, 0.3);
    fd_opts o = {.max_elems = per_param};
    double worst = fd_check(&c, &o);
    cr_log_info("%s: %d parameters, worst %.3f of the allowance", name, nparams(&c), worst);
    adc_close(&c);
}

Test(autodiff_models, gpt2_tiny)
{
    /* ctx > seq: the rows of wpe past seq are sliced away and must get exact zeros */
    const ptc_define defs[] = {{"vocab", 16}, {"ctx", 6},   {"d", 8},  {"heads", 2},
                               {"layers", 2}, {"batch", 2}, {"seq", 4}};
    check_example("gpt2_tiny.ptm", defs, (int)(sizeof defs / sizeof defs[0]), 24);
}

Test(autodiff_models, llama_tiny)
{
    const ptc_define defs[] = {{"vocab", 16},   {"d", 16},   {"heads", 4}, {"kv_heads", 2},
                               {"n_layers", 2}, {"ffn", 12}, {"batch", 2}, {"seq", 4}};
    check_example("llama_tiny.ptm", defs, (int)(sizeof defs / sizeof defs[0]), 24);
}

/* ---- edge cases ---- */

Test(autodiff_edge, scalar_parameter_and_a_parameter_as_the_loss)
{
    check("scalar param", "model m(x: f32[3]) {\n"
                          "    param s : [] init constant(0.7)\n"
                          "    param w : [3] init uniform(-1, 1)\n"
                          "    return s * s + mean(x * s * w, axis=0)\n"
                          "}\n");
    check("the loss is a param", "model m() {\n"
                                 "    param s : [] init constant(0.7)\n"
                                 "    return s\n"
                                 "}\n");
}

Test(autodiff_edge, rank_1_operands)
{
    check("rank 1 norms and softmax",
          "model m(t: f32[5]) {\n"
          "    param x : [5] init uniform(-1, 1)\n"
          "    param g : [5] init uniform(0.5, 1.5)\n"
          "    param b : [5] init uniform(-0.5, 0.5)\n"
          "    y = softmax(x, axis=0) + layernorm(x, g, b) + rmsnorm(x, g) + log_softmax(x)\n"
          "    return mse(y, t)\n"
          "}\n");
    check("cross_entropy of one position", "model m(y: i32[]) {\n"
                                           "    param x : [5] init uniform(-1, 1)\n"
                                           "    return cross_entropy(x, y)\n"
                                           "}\n");
}
