/* test_frontend.c - the .ptm front end: parameter naming, unrolling, consts and -D, every op of the
 * language through the op table, keyword defaults, diagnostics (one error, with a caret), and
 * inputs that must fail cleanly (NUL bytes, deep nesting, huge counts). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frontend.h"

/* Compiles src; *msgs (if asked for) gets everything the diagnostics printed. */
static ptc_graph *compile_defs(const char *src, size_t len, const ptc_define *defs, int ndefs,
                               char **msgs)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ptc_diag d;
    ptc_diag_init(&d, f, "t.ptm", src, len);
    ptc_frontend_opts o = {.defines = defs, .ndefines = ndefs};
    ptc_graph *g = ptc_frontend_compile("t.ptm", src, len, &o, &d);
    fclose(f);
    cr_assert_eq(g == NULL, d.nerrors > 0, "a graph and %d errors", d.nerrors);
    if (msgs)
        *msgs = buf;
    else
        free(buf);
    return g;
}

static ptc_graph *compile_ok(const char *src)
{
    char *msgs;
    ptc_graph *g = compile_defs(src, strlen(src), NULL, 0, &msgs);
    cr_assert_not_null(g, "compilation failed:\n%s", msgs);
    cr_assert_eq(strlen(msgs), 0, "unexpected output:\n%s", msgs);
    free(msgs);
    return g;
}

static int count(const char *s, const char *sub)
{
    int n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
        n++;
    return n;
}

/* Compiles src, which must fail with exactly one error (and at most one note); returns the text. */
static char *compile_err_len(const char *src, size_t len, const ptc_define *defs, int ndefs)
{
    char *msgs;
    ptc_graph *g = compile_defs(src, len, defs, ndefs, &msgs);
    cr_assert_null(g, "compiled, but an error was expected");
    ptc_graph_free(g);
    cr_assert_eq(count(msgs, "error: "), 1, "not exactly one error:\n%s", msgs);
    cr_assert_leq(count(msgs, "note: "), 1, "more than one note:\n%s", msgs);
    return msgs;
}

static char *compile_err(const char *src)
{
    return compile_err_len(src, strlen(src), NULL, 0);
}

#define ASSERT_ERR(src, want)                                                                      \
    do {                                                                                           \
        char *m_ = compile_err(src);                                                               \
        cr_assert_not_null(strstr(m_, want), "expected \"%s\" in:\n%s", want, m_);                 \
        free(m_);                                                                                  \
    } while (0)

static char *read_example(const char *name, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/examples/%s", PTC_SOURCE_DIR, name);
    char *src = ptc_read_file(path, len);
    cr_assert_not_null(src, "cannot read %s", path);
    return src;
}

static ptc_graph *compile_example(const char *name, const ptc_define *defs, int ndefs)
{
    size_t len;
    char *src = read_example(name, &len), *msgs;
    ptc_graph *g = compile_defs(src, len, defs, ndefs, &msgs);
    cr_assert_not_null(g, "%s:\n%s", name, msgs);
    free(msgs);
    free(src);
    return g;
}

/* The PARAM node with full name `name`, or NULL. */
static const ptc_node *param(const ptc_graph *g, const char *name)
{
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == PTC_OP_PARAM && strcmp(g->nodes[i].attrs.name, name) == 0)
            return &g->nodes[i];
    return NULL;
}

static const ptc_type *vtype(const ptc_graph *g, int vid)
{
    return &g->values[vid].type;
}

static const ptc_type *out_type(const ptc_graph *g, const ptc_node *n)
{
    return vtype(g, n->out[0]);
}

static int count_op(const ptc_graph *g, ptc_op op)
{
    int n = 0;
    for (int i = 0; i < g->nnodes; i++)
        n += g->nodes[i].op == op;
    return n;
}

/* The last node of kind op. */
static const ptc_node *last_op(const ptc_graph *g, ptc_op op)
{
    for (int i = g->nnodes - 1; i >= 0; i--)
        if (g->nodes[i].op == op)
            return &g->nodes[i];
    cr_assert_fail("no %s node", ptc_ops[op].name);
    return NULL;
}

static void assert_type(const ptc_type *t, const char *want)
{
    char s[160];
    cr_assert_str_eq(ptc_type_str(t, s, sizeof s), want);
}

#define HEADER "const b = 4\nconst s = 8\nconst d = 16\n"
#define LOSS "    return mean(mean(mean(y, axis=-1), axis=-1), axis=-1)\n"

/* ---- the examples ---- */

Test(frontend, gpt2_has_124m_parameters_named_like_checkpoints)
{
    ptc_graph *g = compile_example("gpt2.ptm", NULL, 0);
    cr_assert_eq(ptc_graph_param_count(g), 124475904LL);
    cr_assert_eq(ptc_graph_params(g, NULL, 0), 2 + 12 * 12 + 2);
    cr_assert_str_eq(g->name, "gpt2");
    const char *names[] = {"wte",
                           "wpe",
                           "h.0.ln_1.g",
                           "h.0.ln_1.b",
                           "h.0.attn.w_qkv",
                           "h.3.attn.w_qkv",
                           "h.0.ln_2.g",
                           "h.11.mlp.b_proj",
                           "ln_f.g",
                           "ln_f.b"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        cr_assert_not_null(param(g, names[i]), "no param %s", names[i]);
    cr_assert_null(param(g, "h.12.attn.w_qkv"));
    assert_type(out_type(g, param(g, "h.3.attn.w_qkv")), "f32[768,2304]");
    assert_type(out_type(g, param(g, "wte")), "f32[50304,768]");
    /* init values, with a const expression for the std */
    const ptc_init *in = &param(g, "h.0.attn.w_o")->attrs.init;
    cr_assert_eq(in->kind, PTC_INIT_NORMAL);
    cr_assert_float_eq(in->a, 0.02 / sqrt(24.0), 1e-15);
    cr_assert_eq(param(g, "h.0.ln_1.g")->attrs.init.kind, PTC_INIT_ONES);
    cr_assert_eq(param(g, "h.0.attn.b_o")->attrs.init.kind, PTC_INIT_ZEROS);
    /* the loss, the inputs and the optimizer line */
    cr_assert_geq(g->loss, 0);
    assert_type(vtype(g, g->loss), "f32[]");
    cr_assert_eq(g->nodes[g->values[g->loss].def].op, PTC_OP_CROSS_ENTROPY);
    cr_assert_eq(g->nodes[0].op, PTC_OP_INPUT);
    cr_assert_str_eq(g->nodes[0].attrs.name, "tokens");
    assert_type(out_type(g, &g->nodes[0]), "i32[8,1024]");
    cr_assert_eq(g->optim.kind, PTC_OPTIM_ADAMW);
    cr_assert_float_eq(g->optim.lr, 6e-4, 1e-18);
    cr_assert_float_eq(g->optim.beta1, 0.9, 1e-15);
    cr_assert_float_eq(g->optim.beta2, 0.95, 1e-15);
    cr_assert_float_eq(g->optim.weight_decay, 0.1, 1e-15);
    /* 12 layers of attention, each from the fused q, k, v split */
    cr_assert_eq(count_op(g, PTC_OP_ATTENTION), 12);
    cr_assert_eq(count_op(g, PTC_OP_SPLIT), 12);
    cr_assert_eq(count_op(g, PTC_OP_LAYERNORM), 25);
    ptc_graph_free(g);
}

Test(frontend, tiny_and_llama_examples)
{
    ptc_graph *g = compile_example("gpt2_tiny.ptm", NULL, 0);
    cr_assert_eq(ptc_graph_param_count(g), 120576);
    assert_type(out_type(g, param(g, "h.1.mlp.w_fc")), "f32[64,256]");
    ptc_graph_free(g);

    g = compile_example("llama.ptm", NULL, 0);
    cr_assert_eq(ptc_graph_param_count(g), 1100048384LL); /* TinyLlama-1.1B */
    ptc_graph_free(g);

    g = compile_example("llama_tiny.ptm", NULL, 0);
    cr_assert_eq(ptc_graph_param_count(g), 106816);
    assert_type(out_type(g, param(g, "layers.1.attention.wk")), "f32[64,32]");
    assert_type(out_type(g, param(g, "layers.0.feed_forward.w2")), "f32[128,64]");
    cr_assert_not_null(param(g, "layers.0.attention_norm.g"));
    cr_assert_not_null(param(g, "norm.g"));
    cr_assert_not_null(param(g, "lm_head"));
    const ptc_node *att = last_op(g, PTC_OP_ATTENTION);
    cr_assert_eq(att->attrs.heads, 4);
    cr_assert_eq(att->attrs.kv_heads, 2);
    cr_assert_eq(count_op(g, PTC_OP_ROPE), 4);
    cr_assert_eq(count_op(g, PTC_OP_RMSNORM), 5);
    cr_assert_float_eq(last_op(g, PTC_OP_RMSNORM)->attrs.eps, 1e-5, 1e-20);
    ptc_graph_free(g);

    g = compile_example("mlp.ptm", NULL, 0);
    cr_assert_eq(ptc_graph_param_count(g), 784 * 256 + 256 + 256 * 10 + 10);
    cr_assert_eq(g->optim.kind, PTC_OPTIM_SGD);
    cr_assert_float_eq(g->optim.momentum, 0.9, 1e-15);
    cr_assert_float_eq(g->optim.lr, 0.05, 1e-15);
    cr_assert_float_eq(param(g, "w1")->attrs.init.a, sqrt(2.0 / 784), 1e-15);
    ptc_graph_free(g);
}

Test(frontend, defines_override_consts)
{
    ptc_define defs[] = {{"layers", 2}, {"seq", 128}};
    ptc_graph *g = compile_example("gpt2.ptm", defs, 2);
    cr_assert_not_null(param(g, "h.1.mlp.w_fc"));
    cr_assert_null(param(g, "h.2.mlp.w_fc"));
    cr_assert_eq(ptc_graph_param_count(g), 124475904LL - 10 * 7087872LL);
    assert_type(out_type(g, &g->nodes[0]), "i32[8,128]");
    /* the std of w_o follows the overridden const */
    cr_assert_float_eq(param(g, "h.0.attn.w_o")->attrs.init.a, 0.02 / 2, 1e-15);
    ptc_graph_free(g);

    size_t len;
    char *src = read_example("gpt2.ptm", &len);
    ptc_define bad = {"nlayers", 2};
    char *m = compile_err_len(src, len, &bad, 1);
    cr_assert_str_eq(m, "t.ptm: error: -D nlayers: this file has no const named 'nlayers'; did you "
                        "mean 'layers'?\n");
    free(m);
    free(src);
}

Test(frontend, define_parse)
{
    char a[] = "layers=4", b[] = "eps=1e-5", c[] = "=4", d[] = "x=", e[] = "x=4q", f[] = "9a=1";
    ptc_define def;
    cr_assert_eq(ptc_define_parse(a, &def), 0);
    cr_assert_str_eq(def.name, "layers");
    cr_assert_eq(def.value, 4);
    cr_assert_eq(ptc_define_parse(b, &def), 0);
    cr_assert_float_eq(def.value, 1e-5, 1e-20);
    cr_assert_eq(ptc_define_parse(c, &def), -1);
    cr_assert_eq(ptc_define_parse(d, &def), -1);
    cr_assert_eq(ptc_define_parse(e, &def), -1);
    cr_assert_eq(ptc_define_parse(f, &def), -1);
}

/* ---- consts ---- */

Test(frontend, const_arithmetic)
{
    ptc_graph *g = compile_ok("const d = 64\nconst heads = 4\nconst hd = d / heads\n"
                              "const r = sqrt(16) + 2 * (3 - 1)\nconst q = 1 / 4\n"
                              "const big = 2 * -hd\n"
                              "model m(x: f32[2, d]) {\n"
                              "    param w : [d, hd * heads / 2] init normal(q)\n"
                              "    param v : [r, -big / 4] init uniform(-q, 2.5e-1)\n"
                              "    y = x @ w\n"
                              "    return mean(mean(y, axis=-1), axis=-1)\n}\n");
    assert_type(out_type(g, param(g, "w")), "f32[64,32]");
    assert_type(out_type(g, param(g, "v")), "f32[8,8]");
    cr_assert_eq(param(g, "w")->attrs.init.a,
                 0.25); /* a non-integer division is fine as a number */
    cr_assert_eq(param(g, "v")->attrs.init.kind, PTC_INIT_UNIFORM);
    cr_assert_eq(param(g, "v")->attrs.init.a, -0.25);
    cr_assert_eq(param(g, "v")->attrs.init.b, 0.25);
    ptc_graph_free(g);

    /* ... but not where an integer is needed: the error points at the division */
    char *m = compile_err("const d = 10\nconst hd = d / 4\n"
                          "model m(x: f32[2, d]) {\n    param w : [d, hd] init zeros\n"
                          "    y = x @ w\n" LOSS "}\n");
    cr_assert_str_eq(m, "t.ptm:2:14: error: integer division is not exact: 10 / 4\n"
                        "const hd = d / 4\n"
                        "             ^\n");
    free(m);
    ASSERT_ERR("const a = 2.5\nmodel m(x: f32[a]) { return sum(x, axis=0) }\n",
               "t.ptm:2:16: error: a dimension must be an integer, got 2.5");
    ASSERT_ERR("const a = 1 / 0\nmodel m(x: f32[2]) { return sum(x, axis=0) }\n",
               "1:13: error: division by zero");
    ASSERT_ERR("const a = sqrt(0 - 4)\nmodel m(x: f32[2]) { return sum(x, axis=0) }\n",
               "sqrt of a negative number: -4");
    ASSERT_ERR("const a = 1e300 * 1e300\nmodel m(x: f32[2]) { return sum(x, axis=0) }\n",
               "constant arithmetic overflows");
    ASSERT_ERR("const a = b + 1\nconst b = 2\nmodel m(x: f32[2]) { return sum(x, axis=0) }\n",
               "const 'b' is defined later (line 2)");
    ASSERT_ERR("const a = 2\nconst a = 3\nmodel m(x: f32[2]) { return sum(x, axis=0) }\n",
               "2:7: error: const 'a' is already defined at line 1");
    ASSERT_ERR("const a = 0\nmodel m(x: f32[a]) { return sum(x, axis=0) }\n",
               "a dimension must be positive, got 0");
    ASSERT_ERR("const a = 3e15\nmodel m(x: f32[a]) { return sum(x, axis=0) }\n",
               "too large (more than 2^46 elements)");
    ASSERT_ERR("const a = 3e25\nmodel m(x: f32[a]) { return sum(x, axis=0) }\n",
               "a dimension is too large: 3e+25");
}

/* ---- naming ---- */

static const char *norm_block = "block norm(x: f32[b, s, d]) -> f32[b, s, d] {\n"
                                "    param g : [d] init ones\n"
                                "    param b : [d] init zeros\n"
                                "    return layernorm(x, g, b)\n"
                                "}\n";

Test(frontend, instance_names)
{
    char src[2048];
    snprintf(src, sizeof src,
             HEADER "%s"
                    "block outer(x: f32[b, s, d]) -> f32[b, s, d] {\n"
                    "    param w : [d, d] init normal(0.02)\n"
                    "    return norm(x @ w) as inner\n"
                    "}\n"
                    "model m(x: f32[b, s, d]) {\n"
                    "    param top : [d] init zeros\n"
                    "    y = norm(x)\n"
                    "    y = norm(y) as second\n"
                    "    repeat 2 as h {\n"
                    "        param own : [d] init zeros\n"
                    "        y = outer(y) + own\n"
                    "        y = norm(y) as ln\n"
                    "    }\n"
                    "    y = y + top\n" LOSS "}\n",
             norm_block);
    ptc_graph *g = compile_ok(src);
    const char *names[] = {"top",
                           "norm.g",
                           "norm.b",
                           "second.g",
                           "h.0.own",
                           "h.0.outer.w",
                           "h.0.outer.inner.g",
                           "h.0.ln.b",
                           "h.1.own",
                           "h.1.outer.inner.b",
                           "h.1.ln.g"};
    int ids[32];
    int n = ptc_graph_params(g, ids, 32);
    cr_assert_eq(n, 1 + 2 + 2 + 2 * (1 + 1 + 2 + 2));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        cr_assert_not_null(param(g, names[i]), "no param %s", names[i]);
    /* the param of the model comes first, then instances in call order */
    cr_assert_str_eq(g->nodes[ids[0]].attrs.name, "top");
    cr_assert_str_eq(g->nodes[ids[1]].attrs.name, "norm.g");
    cr_assert_str_eq(g->nodes[ids[5]].attrs.name, "h.0.own");
    cr_assert_str_eq(g->nodes[ids[6]].attrs.name, "h.0.outer.w");
    cr_assert_str_eq(g->nodes[ids[7]].attrs.name, "h.0.outer.inner.g");
    ptc_graph_free(g);
}

Test(frontend, duplicate_instances_need_as)
{
    char src[2048];
    snprintf(src, sizeof src,
             HEADER "%smodel m(x: f32[b, s, d]) {\n    y = norm(x)\n    y = norm(y)\n" LOSS "}\n",
             norm_block);
    char *m = compile_err(src);
    cr_assert_str_eq(m, "t.ptm:11:9: error: two block instances named 'norm' in the model; give "
                        "this one its own name with 'as', e.g. norm(...) as norm_2\n"
                        "    y = norm(y)\n"
                        "        ^\n");
    free(m);
    snprintf(src, sizeof src,
             HEADER "%smodel m(x: f32[b, s, d]) {\n    repeat 2 as h {\n"
                    "        y = norm(x) as ln\n        y = norm(y) as ln\n    }\n" LOSS "}\n",
             norm_block);
    ASSERT_ERR(src, "two block instances named 'ln' in scope 'h.0'");
    snprintf(src, sizeof src,
             HEADER "%smodel m(x: f32[b, s, d]) {\n    param norm : [d] init zeros\n"
                    "    y = norm(x)\n" LOSS "}\n",
             norm_block);
    ASSERT_ERR(src, "11:9: error: the name 'norm' is already taken in the model by the param at "
                    "line 10");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    param w : [d] init zeros\n"
                      "    param w : [d] init ones\n    y = x * w\n" LOSS "}\n",
               "6:11: error: 'w' is already a variable (line 5); a param needs a name of its own");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    repeat 1 as h { y = x }\n"
                      "    repeat 1 as h { y = x }\n" LOSS "}\n",
               "6:17: error: the name 'h' is already taken in the model by the repeat at line 5");
}

/* ---- repeat and variables ---- */

Test(frontend, repeat_unrolls_and_carries_outer_variables)
{
    ptc_graph *g = compile_ok(HEADER "model m(x: f32[b, s, d]) {\n"
                                     "    y = x\n"
                                     "    repeat 3 as h {\n"
                                     "        t = y * 2\n" /* local to the body */
                                     "        y = t + 1\n" /* carries */
                                     "    }\n"
                                     "    repeat 0 as none { y = y * 100 }\n" LOSS "}\n");
    cr_assert_eq(count_op(g, PTC_OP_MUL), 3);
    cr_assert_eq(count_op(g, PTC_OP_ADD), 3);
    /* a chain: each iteration's y * 2 reads the previous iteration's t + 1 */
    int prev = g->nodes[0].out[0], k = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op == PTC_OP_MUL) {
            cr_assert_eq(n->in[0], prev, "iteration %d does not read the previous one", k);
            cr_assert_eq(g->nodes[g->values[n->in[1]].def].attrs.value, 2);
            k++;
        }
        if (n->op == PTC_OP_ADD)
            prev = n->out[0];
    }
    cr_assert_eq(k, 3);
    /* the loss reads the last iteration's y */
    const ptc_node *mean = &g->nodes[g->values[g->loss].def];
    while (mean->op == PTC_OP_MEAN && g->nodes[g->values[mean->in[0]].def].op == PTC_OP_MEAN)
        mean = &g->nodes[g->values[mean->in[0]].def];
    cr_assert_eq(mean->in[0], prev);
    ptc_graph_free(g);

    char *m = compile_err(HEADER "model m(x: f32[b, s, d]) {\n    repeat 2 as h {\n"
                                 "        t = x * 2\n    }\n    y = t\n" LOSS "}\n");
    cr_assert_str_eq(m, "t.ptm:8:9: error: unknown name 't' (the 't' assigned at line 6 is local "
                        "to its repeat body)\n    y = t\n        ^\n");
    free(m);
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    repeat 2 as h { return x }\n}\n",
               "5:21: error: return inside repeat");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    repeat 2.5 as h { y = x }\n" LOSS "}\n",
               "the repeat count must be an integer, got 2.5");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    repeat -1 as h { y = x }\n" LOSS "}\n",
               "the repeat count must not be negative, got -1");
}

Test(frontend, repeat_chain_of_blocks)
{
    char src[2048];
    snprintf(src, sizeof src,
             HEADER "%smodel m(x: f32[b, s, d]) {\n    y = x\n"
                    "    repeat 4 as h { y = y + norm(y) as ln }\n" LOSS "}\n",
             norm_block);
    ptc_graph *g = compile_ok(src);
    /* each layernorm reads the add of the previous layer (the first reads the input) */
    int prev = g->nodes[0].out[0], k = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op == PTC_OP_LAYERNORM) {
            cr_assert_eq(n->in[0], prev, "layer %d does not read the previous layer", k);
            k++;
        }
        if (n->op == PTC_OP_ADD)
            prev = n->out[0];
    }
    cr_assert_eq(k, 4);
    ptc_graph_free(g);
}

/* ---- every op of the language ---- */

Test(frontend, every_op_parses_and_shape_checks)
{
    ptc_graph *g = compile_ok(
        "const b = 2\nconst s = 4\nconst d = 8\nconst v = 10\n"
        "model all(x: f32[b, s, d], ids: i32[b, s], h: bf16[b, s, d]) {\n"
        "    param g : [d] init ones\n"
        "    param be : [d] init zeros\n"
        "    param tab : [v, d] init normal(0.02)\n"
        "    e = exp(x) + log(x) + sqrt(x) + rsqrt(x) + tanh(x) + sigmoid(x)\n"
        "    e = e + relu(x) + gelu(x) + silu(x) + -x\n"
        "    c = cast(cast(x, bf16), f32) + cast(h, f32)\n"
        "    r = sum(x, axis=0) + mean(x, axis=0) + max(x, axis=0)\n"
        "    n = layernorm(x, g, be, eps=1e-5) + rmsnorm(x, g) + softmax(x) + log_softmax(x, "
        "axis=1)\n"
        "    t = reshape(x, [b * s, d]) @ transpose(reshape(x, [b * s, d]))\n"
        "    p = permute(reshape(x, [b, s, 2, d / 2]), [0, 2, 1, 3])\n"
        "    q, k, w = split(concat(x, x, x, axis=-1), 3, axis=2)\n"
        "    sl = slice(x, axis=1, start=1, len=2)\n"
        "    a = attention(rope(q, heads=2), rope(k, heads=2, base=500), w, heads=2, kv_heads=1 + "
        "1)\n"
        "    m1 = embedding(tab, ids)\n"
        "    param ro : [d, 4] init normal(0.02)\n"
        "    param wu : [4, d, 12] init normal(0.02)\n"
        "    param wd : [4, 6, d] init normal(0.02)\n"
        "    ym, aux = moe(x, ro, wu, wd, top_k=2, capacity=1.25, normalize=false, act=swiglu)\n"
        "    y = e * c * n * a * m1 * ym / (x - 1) + aux\n"
        "    return cross_entropy(y @ transpose(tab), ids) + mse(r, sum(y, axis=0))"
        " + mean(mean(t, axis=0), axis=0) + sum(sum(sum(sum(p, axis=0), axis=0), axis=0), axis=0)"
        " + mean(mean(mean(sl, axis=0), axis=0), axis=0)\n"
        "}\n");
    /* every op callable from .ptm appears, and so do the operators */
    for (int op = 0; op < PTC_NOPS; op++)
        if (ptc_ops[op].flags & PTC_F_LANG)
            cr_assert_gt(count_op(g, (ptc_op)op), 0, "op %s is not exercised", ptc_ops[op].name);
    ptc_op ops[] = {PTC_OP_ADD,    PTC_OP_SUB,   PTC_OP_MUL,   PTC_OP_DIV,  PTC_OP_NEG,
                    PTC_OP_MATMUL, PTC_OP_CONST, PTC_OP_INPUT, PTC_OP_PARAM};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        cr_assert_gt(count_op(g, ops[i]), 0, "op %s is not exercised", ptc_ops[ops[i]].name);
    assert_type(out_type(g, last_op(g, PTC_OP_PERMUTE)), "f32[2,2,4,4]");
    assert_type(out_type(g, last_op(g, PTC_OP_MATMUL)), "f32[2,4,10]");
    assert_type(out_type(g, last_op(g, PTC_OP_CONCAT)), "f32[2,4,24]");
    assert_type(out_type(g, last_op(g, PTC_OP_SLICE)), "f32[2,2,8]");
    assert_type(out_type(g, last_op(g, PTC_OP_SUM)), "f32[]");
    assert_type(out_type(g, last_op(g, PTC_OP_EMBEDDING)), "f32[2,4,8]");
    const ptc_node *sp = last_op(g, PTC_OP_SPLIT);
    cr_assert_eq(sp->nout, 3);
    cr_assert_eq(sp->attrs.axis, 2);
    const ptc_node *pm = last_op(g, PTC_OP_PERMUTE);
    cr_assert_eq(pm->attrs.nshape, 4);
    cr_assert_eq(pm->attrs.shape[1], 2);
    const ptc_node *cast = &g->nodes[0];
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == PTC_OP_CAST) {
            cast = &g->nodes[i];
            break;
        }
    cr_assert_eq(cast->attrs.dtype, PTC_BF16);
    assert_type(out_type(g, cast), "bf16[2,4,8]");
    const ptc_node *sl = last_op(g, PTC_OP_SLICE);
    cr_assert_eq(sl->attrs.start, 1);
    cr_assert_eq(sl->attrs.len, 2);
    cr_assert_eq(last_op(g, PTC_OP_ATTENTION)->attrs.kv_heads, 2);
    cr_assert_float_eq(last_op(g, PTC_OP_ROPE)->attrs.base, 500, 1e-12);
    ptc_graph_free(g);
}

Test(frontend, keyword_defaults_come_from_the_table)
{
    ptc_graph *g = compile_ok(HEADER "model m(x: f32[b, s, d]) {\n"
                                     "    param g : [d] init ones\n"
                                     "    param be : [d] init zeros\n"
                                     "    y = layernorm(x, g, be) + rmsnorm(x, g) + softmax(x)\n"
                                     "    y = y + log_softmax(x) + rope(x, heads=4)\n"
                                     "    y = attention(y, x, x, heads=4)\n" LOSS "}\n");
    cr_assert_float_eq(last_op(g, PTC_OP_LAYERNORM)->attrs.eps, 1e-5, 1e-20);
    cr_assert_float_eq(last_op(g, PTC_OP_RMSNORM)->attrs.eps, 1e-6, 1e-20);
    cr_assert_eq(last_op(g, PTC_OP_SOFTMAX)->attrs.axis, 2); /* -1, normalised */
    cr_assert_eq(last_op(g, PTC_OP_LOG_SOFTMAX)->attrs.axis, 2);
    cr_assert_float_eq(last_op(g, PTC_OP_ROPE)->attrs.base, 10000, 1e-9);
    const ptc_node *a = last_op(g, PTC_OP_ATTENTION);
    cr_assert_eq(a->attrs.heads, 4);
    cr_assert_eq(a->attrs.kv_heads, 4); /* defaults to heads */
    cr_assert(a->attrs.causal);
    ptc_graph_free(g);

    g = compile_ok(HEADER
                   "model m(x: f32[b, s, d]) {\n"
                   "    y = attention(x, x, x, heads=2, causal=false) + softmax(x, axis=0)\n" LOSS
                   "}\n");
    cr_assert_not(last_op(g, PTC_OP_ATTENTION)->attrs.causal);
    cr_assert_eq(last_op(g, PTC_OP_SOFTMAX)->attrs.axis, 0);
    ptc_graph_free(g);
}

Test(frontend, variables_hide_consts_except_where_a_number_is_needed)
{
    ptc_graph *g = compile_ok(HEADER "model m(x: f32[b, s, d]) {\n"
                                     "    param b : [d] init zeros\n"    /* a tensor named b */
                                     "    param w : [b, s] init zeros\n" /* the const b */
                                     "    d = x * b\n"                   /* a tensor named d */
                                     "    y = d + reshape(w, [b, s, 1])\n" LOSS "}\n");
    assert_type(out_type(g, param(g, "b")), "f32[16]");
    assert_type(out_type(g, param(g, "w")), "f32[4,8]");
    const ptc_node *mul = last_op(g, PTC_OP_MUL);
    cr_assert_eq(mul->in[1], param(g, "b")->out[0]);
    cr_assert_eq(g->nodes[g->values[last_op(g, PTC_OP_ADD)->in[0]].def].op, PTC_OP_MUL);
    ptc_graph_free(g);
}

Test(frontend, numbers_become_consts_of_the_other_dtype)
{
    ptc_graph *g = compile_ok(HEADER "model m(x: bf16[b, s, d]) {\n"
                                     "    y = cast(x * (2 * 3) - 1 / 4, f32)\n" LOSS "}\n");
    const ptc_node *mul = last_op(g, PTC_OP_MUL);
    const ptc_node *c = &g->nodes[g->values[mul->in[1]].def];
    cr_assert_eq(c->op, PTC_OP_CONST);
    cr_assert_eq(c->attrs.value, 6); /* folded */
    cr_assert_eq(c->attrs.dtype, PTC_BF16);
    assert_type(out_type(g, c), "bf16[]");
    const ptc_node *sub = last_op(g, PTC_OP_SUB);
    cr_assert_eq(g->nodes[g->values[sub->in[1]].def].attrs.value, 0.25);
    cr_assert_eq(count_op(g, PTC_OP_CONST), 2);
    ptc_graph_free(g);
}

Test(frontend, operator_precedence)
{
    /* a + b * c @ w: `*` and `@` share a level, left to right; unary minus binds tightest */
    ptc_graph *g = compile_ok(HEADER "model m(x: f32[b, s, d], w: f32[d, d]) {\n"
                                     "    y = x + x * x @ w - -x / 2\n" LOSS "}\n");
    const ptc_node *mm = last_op(g, PTC_OP_MATMUL);
    cr_assert_eq(g->nodes[g->values[mm->in[0]].def].op, PTC_OP_MUL);
    const ptc_node *sub = last_op(g, PTC_OP_SUB);
    cr_assert_eq(g->nodes[g->values[sub->in[0]].def].op, PTC_OP_ADD);
    cr_assert_eq(g->nodes[g->values[sub->in[1]].def].op, PTC_OP_DIV);
    const ptc_node *div = last_op(g, PTC_OP_DIV);
    cr_assert_eq(g->nodes[g->values[div->in[0]].def].op, PTC_OP_NEG);
    ptc_graph_free(g);
}

/* ---- diagnostics ---- */

Test(frontend, errors_name_place_and_both_shapes)
{
    char *m = compile_err(HEADER "model m(x: f32[b, s, d]) {\n    param w : [d + 1, d] init zeros\n"
                                 "    y = x @ w\n" LOSS "}\n");
    cr_assert_str_eq(m, "t.ptm:6:11: error: shape mismatch in matmul: f32[4,8,16] and f32[17,16] "
                        "(inner dimensions 16 and 17 differ)\n"
                        "    y = x @ w\n"
                        "          ^\n");
    free(m);
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = x + q\n" LOSS "}\n",
               "t.ptm:5:13: error: unknown name 'q'\n    y = x + q\n            ^\n");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = softmx(x)\n" LOSS "}\n",
               "5:9: error: unknown op or block 'softmx'; did you mean 'softmax'?");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = layernorm(x)\n" LOSS "}\n",
               "layernorm takes 3 tensors, got 1 positional argument");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = reshape(x)\n" LOSS "}\n",
               "reshape takes a tensor and a list of dimensions, got 1 positional argument");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y, z = split(x, 2)\n" LOSS "}\n",
               "5:12: error: split needs the keyword argument axis=...");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = softmax(x, axes=1)\n" LOSS "}\n",
               "5:20: error: unknown keyword argument 'axes' for softmax (it takes axis)");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = softmax(x, axis=1, axis=2)\n" LOSS "}\n",
               "keyword argument 'axis' is given twice");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = exp(x, axis=1)\n" LOSS "}\n",
               "unknown keyword argument 'axis': exp takes none");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = split(x, n=2, axis=0)\n" LOSS "}\n",
               "split takes the number of parts as a positional argument, not as n=...");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = split(x, 2, axis=0)\n" LOSS "}\n",
               "split returns 2 values; assign them to as many names");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y, z, w = split(x, 2, axis=0)\n" LOSS "}\n",
               "split returns 2 values, but 3 names are assigned");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y, z = x\n" LOSS "}\n",
               "this gives one value, but 2 names are assigned");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = cast(x, f64)\n" LOSS "}\n",
               "cast takes a dtype here: f32, bf16, f16 or i32");
    ASSERT_ERR(HEADER
               "model m(x: f32[b, s, d]) {\n    y = attention(x, x, x, heads=4, causal=1)\n" LOSS
               "}\n",
               "causal must be true or false");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = sum(x, axis=x)\n" LOSS "}\n",
               "axis must be a compile-time number, but 'x' is a tensor (f32[4,8,16])");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = exp(x) as e\n" LOSS "}\n",
               "'as' names a block instance, but exp is a built-in op");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = x\n" LOSS "    y = x\n}\n",
               "statement after return");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = x\n}\n",
               "6:1: error: model m ends without returning its loss");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    return x\n}\n",
               "5:12: error: the model must return a scalar loss (f32[]), got f32[4,8,16]");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    param w : f32[d] init zeros\n"
                      "    y = x * w\n" LOSS "}\n",
               "a param's type has no dtype");
    ASSERT_ERR(HEADER "model m(x: f64[b, s, d]) {\n    y = x\n" LOSS "}\n",
               "4:12: error: unknown dtype 'f64' (expected f32, bf16, f16 or i32)");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    param w : [d] init normal()\n"
                      "    y = x * w\n" LOSS "}\n",
               "normal takes 1 argument (the standard deviation), got 0");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    param w : [d] init normal(-1)\n"
                      "    y = x * w\n" LOSS "}\n",
               "the standard deviation of normal must not be negative, got -1");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = x\n" LOSS "}\n"
                      "optimizer adamw(lr=1, beta2=1)\n",
               "beta2 must be less than 1, got 1");
    ASSERT_ERR(HEADER "model m(x: f32[b, s, d]) {\n    y = x\n" LOSS "}\n"
                      "optimizer adamw(lr=1)\noptimizer sgd(lr=1)\n",
               "a second optimizer");
}

Test(frontend, block_errors)
{
    char src[2048];
    snprintf(src, sizeof src,
             HEADER "%smodel m(x: f32[b, s, 2 * d]) {\n    y = norm(x)\n" LOSS "}\n", norm_block);
    char *m = compile_err(src);
    cr_assert_str_eq(m, "t.ptm:10:14: error: type mismatch: argument 'x' of block norm is "
                        "f32[4,8,16], but this is f32[4,8,32]\n"
                        "    y = norm(x)\n"
                        "             ^\n");
    free(m);
    /* an error inside an instance: the error where it is, one note naming the instance */
    m = compile_err(HEADER "block bad(x: f32[b, s, d]) -> f32[b, s, d] {\n"
                           "    param w : [d, 3] init zeros\n"
                           "    return x @ w\n"
                           "}\n"
                           "model m(x: f32[b, s, d]) {\n"
                           "    repeat 2 as h { x = bad(x) as lay }\n"
                           "    y = x\n" LOSS "}\n");
    cr_assert_str_eq(m, "t.ptm:6:14: error: type mismatch: block bad returns f32[4,8,16], but "
                        "this is f32[4,8,3]\n"
                        "    return x @ w\n"
                        "             ^\n"
                        "t.ptm:9:25: note: in instance h.0.lay\n"
                        "    repeat 2 as h { x = bad(x) as lay }\n"
                        "                        ^\n");
    free(m);
    ASSERT_ERR(HEADER "block p(x: f32[b, s, d]) -> f32[b, s, d] { return q(x) }\n"
                      "block q(x: f32[b, s, d]) -> f32[b, s, d] { return p(x) }\n"
                      "model m(x: f32[b, s, d]) {\n    y = p(x)\n" LOSS "}\n",
               "error: block p calls itself through p -> q -> p (blocks may not be recursive)");
    ASSERT_ERR(HEADER "block p(x: f32[b, s, d]) -> f32[b, s, d] { return p(x) }\n"
                      "model m(x: f32[b, s, d]) {\n    y = p(x)\n" LOSS "}\n",
               "error: block p calls itself (blocks may not be recursive)");
    ASSERT_ERR(HEADER "block p(x: f32[b, s, d]) -> f32[b, s, d] { y = x }\n"
                      "model m(x: f32[b, s, d]) {\n    y = p(x)\n" LOSS "}\n",
               "4:50: error: block p ends without a return");
    ASSERT_ERR(HEADER "block p(x: f32[b, s, d]) -> f32[b, s, d] { return x }\n"
                      "model m(x: f32[b, s, d]) {\n    y = p(x, x)\n" LOSS "}\n",
               "block p takes 1 argument, got 2");
    ASSERT_ERR(HEADER "block gelu(x: f32[b, s, d]) -> f32[b, s, d] { return x }\n"
                      "model m(x: f32[b, s, d]) {\n    y = gelu(x)\n" LOSS "}\n",
               "4:7: error: block 'gelu' has the name of a built-in op");
}

Test(frontend, model_count)
{
    ASSERT_ERR("const a = 1\n", "t.ptm:1:1: error: no model in this file");
    ASSERT_ERR("", "t.ptm:1:1: error: no model in this file");
    ASSERT_ERR("model a(x: f32[2]) { return sum(x, axis=0) }\n"
               "model b(x: f32[2]) { return sum(x, axis=0) }\n",
               "2:7: error: a second model 'b': a file has exactly one model");
}

Test(frontend, syntax_errors)
{
    ASSERT_ERR("model m(x: f32[2]) {\n    y = exp(x\n    return sum(y, axis=0)\n}\n",
               "t.ptm:3:5: error: expected ')' or ',' before 'return'\n");
    ASSERT_ERR("model m(x: f32[2]) {\n    y = x +\n}\n",
               "t.ptm:3:1: error: expected an expression before '}'\n");
    ASSERT_ERR("model m(x: f32[2]) {\n    return sum(x, axis=0)\n",
               "t.ptm:2:26: error: expected a statement or '}' at end of input\n");
    ASSERT_ERR("model m(x: f32[2]) {\n    repeat 2 { y = x }\n    return sum(x, axis=0)\n}\n",
               "2:14: error: expected 'as NAME' after the repeat count");
    ASSERT_ERR("model m(x: f32[2]) { y = 12abc }\n", "1:26: error: invalid number '12abc'");
    ASSERT_ERR("model m(x: f32[2]) { y = x $ 2 }\n", "1:28: error: unexpected character '$'");
}

/* ---- robustness ---- */

Test(frontend, hostile_inputs_fail_cleanly)
{
    static const char nul[] = "model m(x: f32[2]) {\0 return sum(x, axis=0) }\n";
    char *m = compile_err_len(nul, sizeof nul - 1, NULL, 0);
    cr_assert_not_null(strstr(m, "1:21: error: unexpected NUL byte in input"), "%s", m);
    free(m);
    ASSERT_ERR("model m(x: f32[2]) { \xff\xfe }", "unexpected non-ASCII byte 0xff");

    /* nesting far deeper than lowering may recurse */
    size_t n = 20000;
    char *deep = malloc(3 * n + 64);
    size_t k = (size_t)sprintf(deep, "const a = ");
    for (size_t i = 0; i < n; i++)
        deep[k++] = '(';
    deep[k++] = '1';
    for (size_t i = 0; i < n; i++)
        deep[k++] = ')';
    deep[k] = 0;
    m = compile_err(deep);
    cr_assert(strstr(m, "nested too deeply") || strstr(m, "nested too deeply"), "%s", m);
    free(m);
    k = (size_t)sprintf(deep, "const a = 1");
    for (size_t i = 0; i < n; i++)
        k += (size_t)sprintf(deep + k, "+1");
    ASSERT_ERR(deep, "expression nested too deeply (more than 1000 levels)");
    free(deep);

    /* counts that would unroll forever: refused promptly, with one error */
    clock_t t0 = clock();
    ASSERT_ERR(
        "model m(x: f32[2]) {\n    repeat 1e9 as h { x = x + 1 }\n    return sum(x, axis=0)\n}\n",
        "the repeat count 1000000000 is too large");
    ASSERT_ERR("model m(x: f32[2]) {\n    repeat 1000000 as h { repeat 1000000 as i { y = 1 } }\n"
               "    return sum(x, axis=0)\n}\n",
               "model too large");
    ASSERT_ERR("model m(x: f32[2]) {\n    repeat 1000000 as h { x = x + 1 }\n"
               "    return sum(x, axis=0)\n}\n",
               "model too large");
    cr_assert_lt((double)(clock() - t0) / CLOCKS_PER_SEC, 30.0);

    /* sizes that overflow */
    ASSERT_ERR("model m(x: f32[1e6, 1e6, 1e6]) { return sum(sum(sum(x, axis=0), axis=0), axis=0) }",
               "too large");
    ASSERT_ERR("model m(x: f32[1e7, 1], y: f32[1, 1e7]) {\n    z = x @ y\n"
               "    return sum(sum(z, axis=0), axis=0)\n}\n",
               "the result of matmul, f32[10000000,10000000], is too large");
    ASSERT_ERR("model m(x: f32[65536]) {\n    repeat 40 as h { x = concat(x, x, axis=0) }\n"
               "    return sum(x, axis=0)\n}\n",
               "is too large");
}

Test(frontend, compiles_again_and_again)
{
    /* no state survives a compilation: the same text gives the same graph */
    size_t len;
    char *src = read_example("gpt2_tiny.ptm", &len);
    for (int i = 0; i < 3; i++) {
        ptc_graph *g = compile_defs(src, len, NULL, 0, NULL);
        cr_assert_not_null(g);
        cr_assert_eq(ptc_graph_param_count(g), 120576);
        ptc_graph_free(g);
    }
    free(src);
}
