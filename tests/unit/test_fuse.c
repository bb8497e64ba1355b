/* test_fuse.c - the kernel IR, its LLVM code and the fusion pass against the reference kernels.
 *
 *   - kernel IR: a kernel using every expression kind prints, parses back to the same text, and
 *     its compiled code (codegen/llvm) gives the interpreter's results at 1, 2 and 3 threads
 *     (float tolerance 1e-5 relative to the largest value: exp and tanh are polynomials within a
 *     few ulp, sums are reassociated by the vectorizer);
 *   - fusion: small GPT-2s and LLaMAs of awkward sizes (1, odd and prime dimensions) are lowered
 *     without fusion and with it; one training step of the unfused plan on the reference backend
 *     (every op its reference kernel) is the reference for the fused plan on the ref and cpu
 *     backends (fused kernels interpreted) and on the jit backend (fused kernels compiled): the
 *     loss, every gradient and every updated weight must agree within 1e-4 relative to the
 *     largest value of the tensor (fp32 sums in other orders; AdamW's eps is 1e-3 here, so an
 *     update is a smooth function of its gradient);
 *   - memory: GPT-2 small (b=8, s=1024) at one rank plans at least 2.5 GB less peak activation
 *     memory with fusion than without (the logits' gradient over the logits, gelu recomputed).
 * Built with the rest under ASan/UBSan (tools/test.sh), so every generated kernel also runs there.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "half.h"
#include "kir_samples.h"
#include "cpu.h"
#include "exec.h"
#include "frontend.h"
#include "kir.h"
#include "passes.h"
#include "plan.h"
#include "planner.h"
#ifdef PTC_TEST_JIT
#include "kjit.h"
#endif

/* ---- the kernel IR ---- */


static char *print_kernel(const ptc_kir *k)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ptc_kir_print(k, f);
    fclose(f);
    return buf;
}

Test(kir, text_round_trip)
{
    char err[512];
    ptc_kir *k = ptc_kir_parse_text(kir_every_kind, err, sizeof err);
    cr_assert_not_null(k, "%s", err);
    char *a = print_kernel(k);
    ptc_kir *k2 = ptc_kir_parse_text(a, err, sizeof err);
    cr_assert_not_null(k2, "%s\n%s", err, a);
    char *b = print_kernel(k2);
    cr_assert_str_eq(a, b);
    cr_assert_eq(ptc_kir_hash(k), ptc_kir_hash(k2));
    free(a);
    free(b);
    ptc_kir_free(k);
    ptc_kir_free(k2);
}

Test(kir, verifier_rejects)
{
    static const char *const bad[] = {
        "kernel k(x: f32[4]) { x[0] = 1.0 }",                          /* store to an in param */
        "kernel k(x: f32[4], y: out f32[4]) { y[0] = x[1.0] }",        /* float index */
        "kernel k(y: out f32[4]) { for i < 4 { for j < 4 parallel { y[j] = 0.0 } } }",
        "kernel k(y: out f32[4]) { let a = 1 let a = 2 y[0] = 0.0 }",  /* bound twice */
        "kernel k(y: out f32[4]) { for i < 4 { let a = 1.0 } y[0] = a }", /* out of scope */
        "kernel k(y: out f32[4]) { y[0] = 1 + 1.0 }",                   /* mixed types */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[512] = "";
        ptc_kir *k = ptc_kir_parse_text(bad[i], err, sizeof err);
        cr_expect_null(k, "accepted: %s", bad[i]);
        cr_expect(err[0], "no message for: %s", bad[i]);
        ptc_kir_free(k);
    }
}

Test(kir, interpreter_checks_bounds)
{
    char err[512];
    ptc_kir *k = ptc_kir_parse_text("kernel k(x: f32[4], y: out f32[4]) { for i < 5 { y[i] = x[i] } }",
                                    err, sizeof err);
    cr_assert_not_null(k, "%s", err);
    float x[4] = {0}, y[4];
    void *args[2] = {x, y};
    cr_expect_eq(ptc_kir_run(k, args, 0, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "out of bounds") != NULL, "%s", err);
    ptc_kir_free(k);
}

static double max_rel(const float *a, const float *b, int64_t n)
{
    double scale = 0, d = 0;
    for (int64_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(b[i]));
        d = fmax(d, fabs((double)a[i] - b[i]));
        if (isnan(a[i]) != isnan(b[i]))
            return INFINITY;
    }
    return d / (scale > 0 ? scale : 1);
}

/* ptc_kir_run_checked holds kernels to the contract on parallel loops: each pattern that would
 * race on a target's threads is named, and the patterns that would not pass. */
Test(kir, checked_run_finds_dependent_iterations)
{
    static const struct {
        const char *body;
        const char *race; /* the start of "'ARRAY'[I] is ..." in the message, or NULL */
    } cases[] = {
        {"for r < 4 parallel { y[r] = x[r] } for r < 4 parallel { z[r] = y[r] * 2.0 }", NULL},
        {"for r < 4 parallel { y[0] = y[0] + x[r] }", "'y'[0] is written by iteration r=0"},
        {"for r < 4 parallel { y[r] = x[r] } for r < 4 parallel { z[r] = y[3 - r] }",
         "'y'[3] is written by iteration r=3"},
        {"for r < 4 parallel { y[r] = x[r] } for q < 2 parallel { z[q] = y[q] }",
         "'y'[0] is written by iteration r=0 of a parallel loop over 4 and read by iteration q=0"},
        {"for r < 4 parallel { y[r] = x[r] } m[0] = y[2]",
         "'y'[2] is written by iteration r=2 of a parallel loop over 4 and read by the top-level"},
        {"m[0] = x[0] * 3.0 for r < 4 parallel { y[r] = m[0] + x[r] }", NULL},
        {"m[0] = 7.0 for r < 4 parallel { m[0] = 7.0 y[r] = x[r] }", NULL},
        {"m[0] = 7.0 for r < 4 parallel { m[0] = x[r] }",
         "'m'[0] is written by the top-level statements (every thread) and written (another "
         "value) by iteration r=0"},
        {"for r < 4 parallel { y[r] = m[0] } m[0] = 5.0",
         "'m'[0] is read by iteration r=0 of a parallel loop over 4 and changed by the top-level"},
        {"for r < 4 parallel { let t = ids[r] y[t] = y[t] + x[r] }", NULL}, /* distinct ids */
        {"for r < 4 parallel { let t = ids[r] % 2 y[t] = y[t] + x[r] }",
         "'y'[0] is written by iteration r=0"},
        {"for r < 4 parallel { for j < 4 { z[j] = x[j] } y[r] = z[r] }", NULL}, /* same bits */
        {"for r < 4 parallel { for j < 4 { z[j] = x[j] + float(r) } y[r] = z[r] }",
         "'z'[0] is written by iteration r=0 of a parallel loop over 4 and written (another "
         "value) by iteration r=1"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char text[1024], err[512];
        snprintf(text, sizeof text,
                 "kernel k(x: f32[4], ids: i32[4], y: out f32[4], z: out f32[4], m: out f32[1]) "
                 "{\n%s\n}\n",
                 cases[c].body);
        ptc_kir *k = ptc_kir_parse_text(text, err, sizeof err);
        cr_assert_not_null(k, "%s\n%s", err, text);
        float x[4] = {1, 2, 3, 4}, y[4] = {0}, z[4] = {0}, m[1] = {0};
        int32_t ids[4] = {2, 0, 3, 1};
        int rc = ptc_kir_run_checked(k, (void *[]){x, ids, y, z, m}, err, sizeof err);
        if (!cases[c].race)
            cr_expect_eq(rc, 0, "case %zu (%s): %s", c, cases[c].body, err);
        else
            cr_expect(rc == -1 && strstr(err, cases[c].race), "case %zu (%s): %s", c, cases[c].body,
                      rc ? err : "passed");
        ptc_kir_free(k);
    }
}

#ifdef PTC_TEST_JIT
Test(kir, compiled_matches_interpreter)
{
    char err[1024];
    ptc_kir *k = ptc_kir_parse_text(kir_every_kind, err, sizeof err);
    cr_assert_not_null(k, "%s", err);
    ptc_kfn fn = ptc_kjit_get(k, "", err, sizeof err);
    cr_assert_not_null(fn, "%s", err);
    srand(7);
    for (int nt = 1; nt <= 3; nt++) {
        float x[91], x2[91], y[2][91], z[2][13];
        int32_t ids[13];
        for (int i = 0; i < 91; i++)
            x[i] = x2[i] = (float)rand() / RAND_MAX * 4 - 2;
        for (int i = 0; i < 13; i++)
            ids[i] = rand() % 9;
        void *a0[5] = {x, ids, y[0], z[0], x}, *a1[5] = {x2, ids, y[1], z[1], x2};
        for (int t = 0; t < nt; t++) { /* thread t's part; the parts write disjoint rows */
            cr_assert_eq(ptc_kir_run(k, a0, t, nt, err, sizeof err), 0, "%s", err);
            fn(a1, t, nt);
        }
        cr_expect_lt(max_rel(y[1], y[0], 91), 1e-5, "y at %d threads", nt);
        cr_expect_lt(max_rel(z[1], z[0], 13), 1e-5, "z at %d threads", nt);
        cr_expect_lt(max_rel(x2, x, 91), 1e-5, "w (in place) at %d threads", nt);
    }
    ptc_kir_free(k);
}
/* bf16 and f16 parameters, round_bf16 and round_f16: the compiled kernel and the interpreter agree
 * bit for bit, on values that need rounding, ties, NaN and infinity, and (f16) overflow to
 * infinity and subnormals */
static void check_half_kernel(const char *text, ptc_dtype dt)
{
    char err[1024];
    ptc_kir *k = ptc_kir_parse_text(text, err, sizeof err);
    cr_assert_not_null(k, "%s", err);
    ptc_kfn fn = ptc_kjit_get(k, "", err, sizeof err);
    cr_assert_not_null(fn, "%s", err);
    uint16_t h[2][97], o[2][97];
    float x[97], r[2][97];
    srand(11);
    bool bf = dt == PTC_BF16;
    for (int i = 0; i < 97; i++) {
        float v = (float)rand() / RAND_MAX * 4 - 2;
        h[0][i] = h[1][i] = bf ? ptc_bf16_bits(v) : ptc_f16_bits(v);
        /* multiples of 2^-12 (bf16) or 2^-14 (f16) below 2^-7: h + x is exact in float (the
         * interpreter computes in double) and lands between 16-bit values */
        x[i] = (float)(rand() % 64 - 32) * (bf ? 0x1p-12f : 0x1p-14f);
    }
    h[0][5] = h[1][5] = bf ? 0x7fc0 : 0x7e00; /* NaN, and -infinity, pass through */
    h[0][6] = h[1][6] = bf ? 0xff80 : 0xfc00;
    if (!bf) {
        h[0][7] = h[1][7] = 0x7bff; /* 65504 + 16 = 65520: a tie, to infinity */
        x[7] = 16.0f;
        h[0][8] = h[1][8] = 0; /* 3 2^-26: an f16 subnormal's rounding */
        x[8] = 0x3p-26f;
        h[0][9] = h[1][9] = 0x0001; /* the smallest subnormal and a half of it */
        x[9] = 0x1p-25f;
    }
    void *a0[5] = {h[0], x, o[0], r[0], h[0]}, *a1[5] = {h[1], x, o[1], r[1], h[1]};
    cr_assert_eq(ptc_kir_run(k, a0, 0, 1, err, sizeof err), 0, "%s", err);
    fn(a1, 0, 1);
    for (int i = 0; i < 97; i++) {
        cr_expect_eq(o[0][i], o[1][i], "%s: the store at %d: %#x, interpreter %#x", k->name, i,
                     o[1][i], o[0][i]);
        cr_expect_eq(h[0][i], h[1][i], "%s: the in-place store at %d", k->name, i);
        cr_expect(r[0][i] == r[1][i] || (isnan(r[0][i]) && isnan(r[1][i])), /* (NaN: free) */
                  "%s: the rounding at %d: %.9g, interpreter %.9g", k->name, i, r[1][i], r[0][i]);
    }
    int nonzero = 0;
    for (int i = 0; i < 97; i++)
        nonzero += r[0][i] != 0 && r[0][i] == r[0][i];
    cr_expect_gt(nonzero, 30, "%s: the rounding rounded nothing (%d)", k->name, nonzero);
    ptc_kir_free(k);
}

Test(kir, compiled_bf16_matches_interpreter)
{
    check_half_kernel(kir_bf16, PTC_BF16);
}

Test(kir, compiled_f16_matches_interpreter)
{
    check_half_kernel(kir_f16, PTC_F16);
}
#endif

/* ---- fusion against the reference kernels ---- */

static ptc_dtype precision = PTC_F32; /* --precision of the models compiled below */
static int head_chunks = 1;           /* --head-chunks of the fused plans below (1: one chunk) */

static ptc_graph *compile_text(const char *src)
{
    char err[2048];
    ptc_diag d;
    ptc_diag_init(&d, stderr, "test.ptm", src, strlen(src));
    ptc_frontend_opts fo = {0};
    ptc_graph *g = ptc_frontend_compile("test.ptm", src, strlen(src), &fo, &d);
    cr_assert_not_null(g, "%s", src);
    ptc_compile_opts co = {.train = true, .verify_each = true, .precision = precision};
    ptc_pass_ctx ctx = {.g = g, .opts = &co, .err = err, .errn = sizeof err};
    cr_assert_eq(ptc_run_passes(&ctx), 0, "%s", err);
    ptc_pass_ctx_free(&ctx);
    return ctx.g;
}

/* buffer b of run x as floats (bf16 and f16 widened), malloc'd */
static float *floats_of(ptrt_exec *x, int b)
{
    int64_t n = ptc_type_numel(&ptrt_exec_program(x)->bufs[b].type);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = ptrt_exec_get(x, b, i);
    return v;
}

typedef struct run {
    ptrt_exec *x;
    const ptc_program *pg;
} run;

/* one training step of plan p on backend be, from seed 3 and random inputs of seed 4 */
static run step(const ptc_plan *p, const ptrt_backend *be)
{
    char err[1024];
    ptrt_exec_opts o = {.backend = be, .drop = -1};
    run r = {.x = ptrt_exec_new(p, 0, &o, err, sizeof err)};
    cr_assert_not_null(r.x, "%s", err);
    r.pg = ptrt_exec_program(r.x);
    ptrt_exec_init_state(r.x, 3);
    for (int b = 0; b < r.pg->nbufs; b++) {
        const ptc_buffer *bf = &r.pg->bufs[b];
        if (bf->kind != PTC_BUF_INPUT || bf->view >= 0)
            continue;
        float *v = ptrt_exec_data(r.x, b);
        if (bf->role == PTC_ROLE_LR)
            v[0] = 1e-2f;
        else if (bf->role == PTC_ROLE_STEP)
            v[0] = 1.0f;
        else if (bf->role == PTC_ROLE_MAX_NORM)
            v[0] = 1.0f;
        else
            cr_assert_eq(ptrt_exec_random_input(r.x, b, bf->name, 4, err, sizeof err), 0, "%s", err);
    }
    cr_assert_eq(ptrt_exec_run(r.x, PTRT_ENTRY_STEP, 1, err, sizeof err), 0, "%s: %s", be->name,
                 err);
    return r;
}

/* Tolerances: f32, as the fused kernels compute in f32 without storing intermediates (a few float
 * roundings: 1e-5 on the loss, 1e-4 on a tensor's largest element). bf16: the fused kernels round
 * to bf16 exactly where the unfused program stores bf16, but a value computed in a different f32
 * order (or in double by the interpreter) can land on the other side of a bf16 rounding boundary:
 * one bf16 ulp (2^-8 = 4e-3) on that element, carried on through the backward: 1e-3 on the loss
 * (a mean), 3e-2 on a tensor (a lost or doubled term is 100%). */
static void compare(const run *ref, const run *got, const char *what)
{
    double lt = precision == PTC_F32 ? 1e-5 : 1e-3, tt = precision == PTC_F32 ? 1e-4 : 3e-2;
    const float *la = ptrt_exec_data(ref->x, ref->pg->loss), *lb = ptrt_exec_data(got->x, got->pg->loss);
    cr_expect_leq(fabs(la[0] - lb[0]), lt * fabs(la[0]) + 1e-7, "%s: loss %g vs %g", what, lb[0],
                  la[0]);
    cr_assert_eq(ref->pg->noutputs, got->pg->noutputs);
    for (int k = 0; k < ref->pg->noutputs; k++) {
        int a = ref->pg->outputs[k], b = got->pg->outputs[k];
        int64_t n = ptc_type_numel(&ref->pg->bufs[a].type);
        float *va = floats_of(ref->x, a), *vb = floats_of(got->x, b);
        double d = max_rel(vb, va, n);
        cr_expect_lt(d, tt, "%s: gradient output %d differs by %g", what, k, d);
        free(va);
        free(vb);
    }
    for (int b = 0; b < ref->pg->nbufs; b++) {
        const ptc_buffer *bf = &ref->pg->bufs[b];
        if ((bf->kind != PTC_BUF_PARAM && bf->kind != PTC_BUF_STATE) || bf->view >= 0)
            continue;
        int c = ptrt_exec_find(got->x, bf->kind, bf->name);
        cr_assert_geq(c, 0);
        float *va = floats_of(ref->x, b), *vb = floats_of(got->x, c);
        double d = max_rel(vb, va, ptc_type_numel(&bf->type));
        cr_expect_lt(d, tt, "%s: %s %s differs by %g", what,
                     bf->kind == PTC_BUF_PARAM ? "weight" : "state", bf->name, d);
        free(va);
        free(vb);
    }
}

static void check_model(const char *src)
{
    ptc_graph *g = compile_text(src);
    char err[2048];
    ptc_lower_opts plain = {.keep_grad_outputs = true}, fused = plain;
    fused.fuse = true;
    fused.head_chunks = head_chunks;
    ptc_plan *p0 = ptc_lower(g, &plain, err, sizeof err), *p1 = ptc_lower(g, &fused, err, sizeof err);
    cr_assert_not_null(p0, "%s", err);
    cr_assert_not_null(p1, "%s", err);
    cr_expect_gt(p1->nkernels, 0, "nothing was fused in\n%s", src);
    if (head_chunks > 1) { /* the head ran in chunks: a cross-entropy kernel and three GEMMs each */
        int ces = 0, rows = 0;
        const ptc_program *pg = &p1->programs[0];
        for (int i = 0; i < pg->ninstrs; i++)
            if (pg->instrs[i].kind == PTC_INSTR_FUSED &&
                strstr(p1->kernels[pg->instrs[i].kernel]->name, "cross_entropy_with_grad")) {
                ces++;
                const ptc_type *lt = &pg->bufs[pg->instrs[i].in[0]].type;
                rows += (int)(ptc_type_numel(lt) / lt->dims[lt->rank - 1]);
            }
        const ptc_buffer *t = NULL;
        for (int b = 0; b < pg->nbufs && !t; b++)
            if (pg->bufs[b].role == PTC_ROLE_TARGETS)
                t = &pg->bufs[b];
        cr_assert_not_null(t);
        int64_t R = ptc_type_numel(&t->type), want = R < head_chunks ? R : head_chunks;
        cr_expect_eq(ces, want, "%d cross-entropy chunks, %d asked\n%s", ces, head_chunks, src);
        cr_expect_eq(rows, R, "the chunks cover %d rows", rows);
    }
    run ref = step(p0, &ptrt_backend_ref);
    const ptrt_backend *backends[3] = {&ptrt_backend_ref, &ptrt_backend_cpu, ptrt_backend_jit};
    for (int k = 0; k < 3; k++) {
        if (!backends[k])
            continue;
        run got = step(p1, backends[k]);
        compare(&ref, &got, backends[k]->name);
        ptrt_exec_free(got.x);
    }
    ptrt_exec_free(ref.x);
    ptc_plan_free(p0);
    ptc_plan_free(p1);
    ptc_graph_free(g);
}

static const char gpt[] =
    "block attn(x: f32[batch, seq, d]) -> f32[batch, seq, d] {\n"
    "    param w_qkv : [d, 3*d] init normal(0.2)\n"
    "    param b_qkv : [3*d] init normal(0.1)\n"
    "    param w_o : [d, d] init normal(0.2)\n"
    "    param b_o : [d] init normal(0.1)\n"
    "    q, k, v = split(x @ w_qkv + b_qkv, 3, axis=-1)\n"
    "    return attention(q, k, v, heads=heads, causal=true) @ w_o + b_o\n"
    "}\n"
    "block mlp(x: f32[batch, seq, d]) -> f32[batch, seq, d] {\n"
    "    param w_fc : [d, 4*d] init normal(0.2)\n"
    "    param b_fc : [4*d] init normal(0.1)\n"
    "    param w_proj : [4*d, d] init normal(0.2)\n"
    "    param b_proj : [d] init normal(0.1)\n"
    "    return gelu(x @ w_fc + b_fc) @ w_proj + b_proj\n"
    "}\n"
    "block norm(x: f32[batch, seq, d]) -> f32[batch, seq, d] {\n"
    "    param g : [d] init normal(1.0)\n"
    "    param b : [d] init normal(0.1)\n"
    "    return layernorm(x, g, b, eps=1e-5)\n"
    "}\n"
    "model gpt2(tokens: i32[batch, seq], targets: i32[batch, seq]) {\n"
    "    param wte : [vocab, d] init normal(0.5)\n"
    "    param wpe : [seq, d] init normal(0.5)\n"
    "    x = embedding(wte, tokens) + wpe\n"
    "    repeat layers as h {\n"
    "        x = x + attn(norm(x) as ln_1)\n"
    "        x = x + mlp(norm(x) as ln_2)\n"
    "    }\n"
    "    x = norm(x) as ln_f\n"
    "    return cross_entropy(x @ transpose(wte), targets)\n"
    "}\n"
    "optimizer adamw(lr=0.01, eps=0.001, weight_decay=0.1)\n";

static const char llama[] =
    "block mlp(x: f32[batch, seq, d]) -> f32[batch, seq, d] {\n"
    "    param w1 : [d, 3] init normal(0.3)\n"
    "    param w3 : [d, 3] init normal(0.3)\n"
    "    param w2 : [3, d] init normal(0.3)\n"
    "    return (silu(x @ w1) * (x @ w3)) @ w2\n"
    "}\n"
    "model llama(tokens: i32[batch, seq], targets: i32[batch, seq]) {\n"
    "    param wte : [vocab, d] init normal(0.5)\n"
    "    param g : [d] init normal(1.0)\n"
    "    param head : [d, vocab] init normal(0.3)\n"
    "    x = embedding(wte, tokens)\n"
    "    repeat layers as h {\n"
    "        x = x + mlp(rmsnorm(x, g))\n"
    "    }\n"
    "    y = softmax(x @ head) * 2.0 + sigmoid(x @ head) - tanh(exp(x @ head) * 0.1)\n"
    "    return cross_entropy(relu(y) - sqrt(y * y + 1.0), targets)\n"
    "}\n"
    "optimizer adamw(lr=0.01, eps=0.001, weight_decay=0.1)\n";

/* const lines for vocab, d, heads, layers, batch, seq, then the model */
static void check_sizes(const char *model, int vocab, int d, int heads, int layers, int batch,
                        int seq)
{
    size_t n = strlen(model) + 512;
    char *src = malloc(n);
    snprintf(src, n,
             "const vocab = %d\nconst d = %d\nconst heads = %d\nconst layers = %d\n"
             "const batch = %d\nconst seq = %d\n%s",
             vocab, d, heads, layers, batch, seq, model);
    check_model(src);
    free(src);
}

Test(fuse, gpt2_odd_and_prime_sizes, .timeout = 120)
{
    ptrt_cpu_set_threads(3);
    check_sizes(gpt, 7, 3, 1, 1, 1, 5);
    check_sizes(gpt, 13, 6, 2, 2, 3, 1);
    check_sizes(gpt, 31, 10, 5, 1, 2, 7);
    check_sizes(gpt, 1, 1, 1, 1, 1, 1);
    check_sizes(gpt, 67, 16, 2, 1, 2, 11);
}

/* --precision bf16: chains read and write bf16 (the casts around every op fused as loads and
 * roundings), against the unfused bf16 program on the reference kernels */
Test(fuse, gpt2_bf16_odd_and_prime_sizes, .timeout = 120)
{
    ptrt_cpu_set_threads(3);
    precision = PTC_BF16;
    check_sizes(gpt, 7, 3, 1, 1, 1, 5);
    check_sizes(gpt, 31, 10, 5, 1, 2, 7);
    check_sizes(gpt, 67, 16, 2, 1, 2, 11);
    precision = PTC_F32;
}

/* --precision fp16 likewise (f16 loads, stores and round_f16; matmuls stay unfused kernels) */
Test(fuse, gpt2_f16_odd_and_prime_sizes, .timeout = 120)
{
    ptrt_cpu_set_threads(2);
    precision = PTC_F16;
    check_sizes(gpt, 7, 3, 1, 1, 1, 5);
    check_sizes(gpt, 67, 16, 2, 1, 2, 11);
    precision = PTC_F32;
}

/* The language-model head over chunks of rows (--head-chunks): uneven chunks (14 rows in 3: 5,
 * 5, 4; 3 in 2: 2, 1), a chunk a row (5 rows in 7 asked: 5 of 1), 2 of 11; the gradients (the
 * tied embedding's summed over the chunks) against the unfused one-chunk program */
Test(fuse, gpt2_head_chunks, .timeout = 120)
{
    ptrt_cpu_set_threads(2);
    head_chunks = 3;
    check_sizes(gpt, 31, 10, 5, 1, 2, 7);
    head_chunks = 7;
    check_sizes(gpt, 7, 3, 1, 1, 1, 5);
    head_chunks = 2;
    check_sizes(gpt, 67, 16, 2, 1, 2, 11);
    check_sizes(gpt, 13, 6, 2, 2, 3, 1);
    /* bf16: 16-bit chunks of logits, the weight's gradient summed in f32 and rounded once */
    precision = PTC_BF16;
    head_chunks = 3;
    check_sizes(gpt, 31, 10, 5, 1, 2, 7);
    check_sizes(gpt, 67, 16, 2, 1, 2, 11);
    precision = PTC_F32;
    head_chunks = 1;
}

Test(fuse, llama_like_odd_and_prime_sizes, .timeout = 120)
{
    ptrt_cpu_set_threads(2);
    check_sizes(llama, 11, 5, 1, 2, 3, 7);
    check_sizes(llama, 2, 1, 1, 1, 1, 1);
    check_sizes(llama, 37, 13, 1, 1, 2, 3);
}

static ptc_graph *compile_file(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", PTC_SOURCE_DIR, rel);
    size_t len;
    char *src = ptc_read_file(path, &len);
    cr_assert_not_null(src, "cannot read %s", path);
    ptc_graph *g = compile_text(src);
    free(src);
    return g;
}

Test(fuse, gpt2_peak_memory, .timeout = 120)
{
    ptc_graph *g = compile_file("examples/gpt2.ptm");
    char err[2048];
    ptc_lower_opts plain = {.keep_grad_outputs = false}, fused = plain;
    fused.fuse = true;
    ptc_plan *p0 = ptc_lower(g, &plain, err, sizeof err), *p1 = ptc_lower(g, &fused, err, sizeof err);
    cr_assert(p0 && p1, "%s", err);
    ptc_plan_stats s0, s1;
    ptc_plan_stats_of(p0, 0, &s0);
    ptc_plan_stats_of(p1, 0, &s1);
    cr_expect_geq(s0.peak_act_bytes - s1.peak_act_bytes, (int64_t)2500000000,
                  "peak %lld without fusion, %lld with", (long long)s0.peak_act_bytes,
                  (long long)s1.peak_act_bytes);
    /* the head in chunks (the default: 7 of 1176 rows) against one: its 1.65 GB of logits
     * become one chunk's 237 MB */
    fused.head_chunks = 1;
    ptc_plan *p2 = ptc_lower(g, &fused, err, sizeof err);
    cr_assert(p2, "%s", err);
    ptc_plan_stats s2;
    ptc_plan_stats_of(p2, 0, &s2);
    cr_expect_geq(s2.peak_act_bytes - s1.peak_act_bytes, (int64_t)1350000000,
                  "peak %lld with the head whole, %lld in chunks", (long long)s2.peak_act_bytes,
                  (long long)s1.peak_act_bytes);
    ptc_plan_free(p0);
    ptc_plan_free(p1);
    ptc_plan_free(p2);
    ptc_graph_free(g);
}

/* ---- casts folded into ops over 16-bit storage (plan/fold_casts.c) ---- */

typedef struct fold_prog {
    ptc_plan *p;
    ptc_program *pg;
    int q16[3], q32[3], o32, o16; /* bf16 q, k, v; their f32 copies; the f32 and bf16 result */
} fold_prog;

static int fold_buf(fold_prog *f, ptc_dtype dt, int kind)
{
    ptc_buffer b = {.kind = (uint8_t)kind, .region = PTC_REGION_ACT, .view = -1, .view_axis = -1};
    b.type = (ptc_type){.dtype = dt, .rank = 3, .dims = {1, 4, 8}};
    b.bytes = 32 * (dt == PTC_F32 ? 4 : 2);
    return ptc_prog_add_buffer(f->p, f->pg, &b);
}

static void fold_cast(fold_prog *f, int *from, int *to, ptc_dtype dt)
{
    ptc_instr c = {.kind = PTC_INSTR_KERNEL, .op = PTC_OP_CAST, .nin = 1, .nout = 1};
    c.attrs = ptc_attrs_default(PTC_OP_CAST);
    c.attrs.dtype = dt;
    c.in = from;
    c.out = to;
    ptc_prog_add_instr(f->p, f->pg, &c);
}

/* bf16 inputs q, k, v widened; [`between` after the widenings;] attention; its result rounded */
static fold_prog fold_make(void (*between)(fold_prog *))
{
    fold_prog f = {.p = ptc_plan_new()};
    f.pg = ptc_plan_add_program(f.p);
    f.pg->loss = f.pg->grad_norm = -1;
    for (int k = 0; k < 3; k++) {
        f.q16[k] = fold_buf(&f, PTC_BF16, PTC_BUF_INPUT);
        f.q32[k] = fold_buf(&f, PTC_F32, PTC_BUF_TEMP);
    }
    f.o32 = fold_buf(&f, PTC_F32, PTC_BUF_TEMP);
    f.o16 = fold_buf(&f, PTC_BF16, PTC_BUF_TEMP);
    for (int k = 0; k < 3; k++)
        fold_cast(&f, &f.q16[k], &f.q32[k], PTC_F32);
    if (between)
        between(&f);
    ptc_instr a = {.kind = PTC_INSTR_KERNEL, .op = PTC_OP_ATTENTION, .nin = 3, .nout = 1};
    a.attrs = ptc_attrs_default(PTC_OP_ATTENTION);
    a.attrs.heads = 2;
    a.attrs.causal = true;
    a.in = f.q32;
    a.out = &f.o32;
    ptc_prog_add_instr(f.p, f.pg, &a);
    fold_cast(&f, &f.o32, &f.o16, PTC_BF16);
    return f;
}

static const ptc_instr *fold_attention(const fold_prog *f)
{
    for (int i = 0; i < f->pg->ninstrs; i++)
        if (f->pg->instrs[i].op == PTC_OP_ATTENTION)
            return &f->pg->instrs[i];
    cr_assert_fail("no attention left");
    return NULL;
}

static void read_k_copy_too(fold_prog *f)
{
    int y = fold_buf(f, PTC_F32, PTC_BUF_TEMP);
    ptc_instr n = {.kind = PTC_INSTR_KERNEL, .op = PTC_OP_NEG, .nin = 1, .nout = 1};
    n.attrs = ptc_attrs_default(PTC_OP_NEG);
    n.in = &f->q32[1];
    n.out = &y;
    ptc_prog_add_instr(f->p, f->pg, &n);
}

static void overwrite_v(fold_prog *f)
{
    int y = fold_buf(f, PTC_F32, PTC_BUF_TEMP);
    fold_cast(f, &y, &f->q16[2], PTC_BF16); /* v's bytes change after its copy was made */
}

Test(fold, casts_around_attention)
{
    fold_prog f = fold_make(NULL);
    ptc_plan_fold_casts(f.pg);
    cr_expect_eq(f.pg->ninstrs, 1, "the casts fold: %d instructions left", f.pg->ninstrs);
    const ptc_instr *a = fold_attention(&f);
    for (int k = 0; k < 3; k++)
        cr_expect_eq(a->in[k], f.q16[k], "operand %d reads the bf16 tensor", k);
    cr_expect_eq(a->out[0], f.o16, "the result is written as bf16");
    ptc_plan_free(f.p);

    /* a copy another op reads too, or a source written after its copy: nothing folds */
    void (*cases[])(fold_prog *) = {read_k_copy_too, overwrite_v};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        f = fold_make(cases[c]);
        int n = f.pg->ninstrs;
        ptc_plan_fold_casts(f.pg);
        cr_expect_eq(f.pg->ninstrs, n, "case %zu: %d of %d instructions left", c, f.pg->ninstrs, n);
        a = fold_attention(&f);
        for (int k = 0; k < 3; k++)
            cr_expect_eq(a->in[k], f.q32[k], "case %zu: operand %d", c, k);
        cr_expect_eq(a->out[0], f.o32, "case %zu: the result", c);
        ptc_plan_free(f.p);
    }
}

/* In a bf16 GPT-2 the ops of ptc_op_storage16 read and write bf16 themselves; what casts stay
 * are those of the embeddings and the position slice, whose ops compute on f32 copies. */
Test(fold, gpt2_bf16_casts_left)
{
    precision = PTC_BF16;
    ptc_graph *g = compile_file("examples/gpt2_tiny.ptm");
    precision = PTC_F32;
    char err[2048];
    ptc_lower_opts o = {.fuse = true};
    ptc_plan *p = ptc_lower(g, &o, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    const ptc_program *pg = &p->programs[0];
    int casts = 0, s16 = 0;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_KERNEL)
            continue;
        if (in->op == PTC_OP_CAST) {
            casts++;
            const ptc_instr *next = i + 1 < pg->ninstrs ? &pg->instrs[i + 1] : in;
            const ptc_instr *prev = i > 0 ? &pg->instrs[i - 1] : in;
            bool embed = next->op == PTC_OP_EMBEDDING || next->op == PTC_OP_SLICE ||
                         next->op == PTC_OP_PAD || next->op == PTC_OP_EMBEDDING_GRAD ||
                         prev->op == PTC_OP_EMBEDDING || prev->op == PTC_OP_SLICE ||
                         prev->op == PTC_OP_PAD || prev->op == PTC_OP_SUM_TO;
            cr_expect(embed, "i%d: a cast beside %s", i, ptc_ops[next->op].name);
        }
        if (ptc_op_storage16(in->op)) {
            cr_expect_eq(pg->bufs[in->in[0]].type.dtype, PTC_BF16, "i%d: %s reads f32", i,
                         ptc_ops[in->op].name);
            s16++;
        }
    }
    /* per layer: attention, its gradient, concat, 4 sum_to, 2 layernorm_grad, 12 sumsq */
    cr_expect_geq(s16, 2 * 21, "%d ops over bf16", s16);
    cr_expect_leq(casts, 8, "%d casts", casts);
    ptc_plan_free(p);
    ptc_graph_free(g);
}
