/* test_ir.c - the IR on its own: builder and shape inference (with their messages), the text
 * printer and parser (print -> parse -> print is the identity), and the verifier. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static ptc_loc L = {.file = "t.ptm", .line = 1, .col = 1};

static int input(ptc_graph *g, const char *name, ptc_dtype dt, int rank, const int64_t *dims)
{
    ptc_attrs a = ptc_attrs_default(PTC_OP_INPUT);
    a.name = name;
    a.dtype = dt;
    a.nshape = rank;
    memcpy(a.shape, dims, sizeof(int64_t) * (size_t)rank);
    char err[256];
    int v = ptc_build1(g, PTC_OP_INPUT, NULL, 0, &a, L, err, sizeof err);
    cr_assert_geq(v, 0, "%s", err);
    return v;
}

static int param(ptc_graph *g, const char *name, int rank, const int64_t *dims)
{
    ptc_attrs a = ptc_attrs_default(PTC_OP_PARAM);
    a.name = name;
    a.nshape = rank;
    a.init = (ptc_init){PTC_INIT_NORMAL, 0.02, 0};
    memcpy(a.shape, dims, sizeof(int64_t) * (size_t)rank);
    char err[256];
    int v = ptc_build1(g, PTC_OP_PARAM, NULL, 0, &a, L, err, sizeof err);
    cr_assert_geq(v, 0, "%s", err);
    return v;
}

static char *print_str(const ptc_graph *g)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ptc_print(g, f);
    fclose(f);
    return buf;
}

/* A small MLP-like graph exercising several ops, attributes and a split. */
static ptc_graph *small_graph(void)
{
    ptc_graph *g = ptc_graph_new("small");
    char err[256];
    int x = input(g, "x", PTC_F32, 2, (int64_t[]){4, 6});
    int t = input(g, "t", PTC_I32, 1, (int64_t[]){4});
    int w = param(g, "w", 2, (int64_t[]){6, 12});
    int h = ptc_build1(g, PTC_OP_MATMUL, (int[]){x, w}, 2, NULL, L, err, sizeof err);
    ptc_attrs sa = ptc_attrs_default(PTC_OP_SPLIT);
    sa.n = 3;
    sa.axis = -1;
    int parts[3];
    cr_assert_eq(ptc_build(g, PTC_OP_SPLIT, &h, 1, &sa, L, parts, err, sizeof err), 0, "%s", err);
    int s = ptc_build1(g, PTC_OP_ADD, (int[]){parts[0], parts[1]}, 2, NULL, L, err, sizeof err);
    int gl = ptc_build1(g, PTC_OP_GELU, &s, 1, NULL, (ptc_loc){.file = "t.ptm", .line = 3, .col = 7}, err, sizeof err);
    int loss = ptc_build1(g, PTC_OP_CROSS_ENTROPY, (int[]){gl, t}, 2, NULL, L, err, sizeof err);
    cr_assert_geq(loss, 0, "%s", err);
    g->loss = loss;
    return g;
}

Test(ir, builder_infers_types)
{
    ptc_graph *g = small_graph();
    char buf[128];
    cr_assert_str_eq(ptc_type_str(&g->values[g->nodes[3].out[0]].type, buf, sizeof buf),
                     "f32[4,12]");
    cr_assert_eq(g->nodes[4].nout, 3);
    cr_assert_eq(g->nodes[4].attrs.axis, 1, "split axis -1 is normalised to 1");
    cr_assert_str_eq(ptc_type_str(&g->values[g->nodes[4].out[2]].type, buf, sizeof buf),
                     "f32[4,4]");
    cr_assert_eq(ptc_graph_param_count(g), 72);
    ptc_graph_free(g);
}

Test(ir, shape_mismatch_names_both_shapes)
{
    ptc_graph *g = ptc_graph_new("bad");
    int a = input(g, "a", PTC_F32, 2, (int64_t[]){8, 16});
    int b = input(g, "b", PTC_F32, 2, (int64_t[]){8, 32});
    char err[256];
    cr_assert_eq(ptc_build1(g, PTC_OP_ADD, (int[]){a, b}, 2, NULL, L, err, sizeof err), -1);
    cr_assert(strstr(err, "f32[8,16]") && strstr(err, "f32[8,32]"), "message: %s", err);
    cr_assert_eq(ptc_build1(g, PTC_OP_MATMUL, (int[]){a, a}, 2, NULL, L, err, sizeof err), -1);
    cr_assert(strstr(err, "inner dimensions 16 and 8"), "message: %s", err);
    ptc_graph_free(g);
}

Test(ir, broadcast_and_matmul_batch)
{
    ptc_graph *g = ptc_graph_new("bc");
    char err[256], buf[128];
    int a = input(g, "a", PTC_F32, 3, (int64_t[]){2, 1, 3});
    int b = input(g, "b", PTC_F32, 2, (int64_t[]){4, 1});
    int s = ptc_build1(g, PTC_OP_ADD, (int[]){a, b}, 2, NULL, L, err, sizeof err);
    cr_assert_str_eq(ptc_type_str(&g->values[s].type, buf, sizeof buf), "f32[2,4,3]");
    int x = input(g, "x", PTC_F32, 4, (int64_t[]){2, 1, 5, 6});
    int y = input(g, "y", PTC_F32, 3, (int64_t[]){3, 6, 7});
    int m = ptc_build1(g, PTC_OP_MATMUL, (int[]){x, y}, 2, NULL, L, err, sizeof err);
    cr_assert_str_eq(ptc_type_str(&g->values[m].type, buf, sizeof buf), "f32[2,3,5,7]");
    ptc_graph_free(g);
}

Test(ir, attention_rules)
{
    ptc_graph *g = ptc_graph_new("attn");
    char err[256];
    int q = input(g, "q", PTC_F32, 3, (int64_t[]){2, 5, 32});
    int kv = input(g, "kv", PTC_F32, 3, (int64_t[]){2, 5, 16});
    ptc_attrs a = ptc_attrs_default(PTC_OP_ATTENTION);
    a.heads = 4;
    cr_assert_eq(ptc_build1(g, PTC_OP_ATTENTION, (int[]){q, kv, kv}, 3, &a, L, err, sizeof err), -1,
                 "k with 16 features needs kv_heads=2");
    a.kv_heads = 2;
    int o = ptc_build1(g, PTC_OP_ATTENTION, (int[]){q, kv, kv}, 3, &a, L, err, sizeof err);
    cr_assert_geq(o, 0, "%s", err);
    a.kv_heads = 3;
    cr_assert_eq(ptc_build1(g, PTC_OP_ATTENTION, (int[]){q, kv, kv}, 3, &a, L, err, sizeof err), -1);
    cr_assert(strstr(err, "not divisible by kv_heads=3"), "%s", err);
    ptc_graph_free(g);
}

Test(ir, print_parse_roundtrip)
{
    ptc_graph *g = small_graph();
    g->values[5].place[1] = (ptc_placement){.kind = PTC_PLACE_SHARD, .dim = 1};
    g->values[6].place[0] = (ptc_placement){.kind = PTC_PLACE_PARTIAL};
    g->nodes[5].stage = 2;
    g->nodes[6].recompute = true;
    g->optim.beta2 = 0.95;
    ptc_graph_add_output(g, 3);
    char *t1 = print_str(g);
    char err[256] = "";
    ptc_graph *h = ptc_parse_ir(t1, err, sizeof err);
    cr_assert_not_null(h, "parse failed: %s\n%s", err, t1);
    char *t2 = print_str(h);
    cr_assert_str_eq(t1, t2);
    cr_assert(strstr(t1, "<R,S1>"), "%s", t1);
    cr_assert(strstr(t1, "stage=2"), "%s", t1);
    cr_assert(strstr(t1, "@3:7"), "%s", t1);
    cr_assert_eq(ptc_verify(h, err, sizeof err), 0, "%s", err);
    free(t1);
    free(t2);
    ptc_graph_free(g);
    ptc_graph_free(h);
}

/* A shard with a remainder (ZeRO over a dim the axis does not divide) prints as S<dim>r<rem>,
 * parses back, and the verifier accepts a remainder smaller than its axis only. */
Test(ir, remainder_shard_placement)
{
    ptc_graph *g = small_graph();
    g->mesh = (ptc_mesh){.naxes = 1, .names = {"dp"}, .sizes = {4}};
    g->values[2].place[0] = (ptc_placement){.kind = PTC_PLACE_SHARD, .dim = 1, .rem = 3};
    char *t1 = print_str(g);
    cr_assert(strstr(t1, "f32[6,12]<S1r3>"), "%s", t1);
    char err[256] = "";
    ptc_graph *h = ptc_parse_ir(t1, err, sizeof err);
    cr_assert_not_null(h, "parse failed: %s\n%s", err, t1);
    cr_assert_eq(h->values[2].place[0].rem, 3);
    char *t2 = print_str(h);
    cr_assert_str_eq(t1, t2);
    cr_assert_eq(ptc_verify(h, err, sizeof err), 0, "%s", err);
    h->values[2].place[0].rem = 4; /* 4 ranks would divide 4 more slices */
    cr_assert_eq(ptc_verify(h, err, sizeof err), -1);
    cr_assert(strstr(err, "remainder of 4"), "%s", err);
    free(t1);
    free(t2);
    ptc_graph_free(g);
    ptc_graph_free(h);
}

Test(ir, parse_reports_errors_with_position)
{
    char err[256];
    const char *bad_type = "model m\n%0 = input {dtype=f32, shape=[2,3], name=\"x\"} : f32[2,3]\n"
                           "%1 = exp %0 : f32[3,2]\n";
    cr_assert_null(ptc_parse_ir(bad_type, err, sizeof err));
    cr_assert(strstr(err, "3:1:") && strstr(err, "disagrees"), "%s", err);
    cr_assert_null(ptc_parse_ir("model m\n%1 = exp %0 : f32[]\n", err, sizeof err));
    cr_assert(strstr(err, "2:10: value %0 used before it is defined"), "%s", err);
    cr_assert_null(ptc_parse_ir("model m\n%0 = frobnicate : f32[]\n", err, sizeof err));
    cr_assert(strstr(err, "unknown op 'frobnicate'"), "%s", err);
}

Test(ir, verifier_catches_broken_graphs)
{
    ptc_graph *g = small_graph();
    char err[256];
    cr_assert_eq(ptc_verify(g, err, sizeof err), 0, "%s", err);
    g->values[g->nodes[3].out[0]].type.dims[1] = 13; /* corrupt a result type */
    cr_assert_eq(ptc_verify(g, err, sizeof err), -1);
    cr_assert(strstr(err, "inference gives f32[4,12]"), "%s", err);
    g->values[g->nodes[3].out[0]].type.dims[1] = 12;
    g->nodes[3].in[0] = g->nodes[5].out[0]; /* use before definition */
    cr_assert_eq(ptc_verify(g, err, sizeof err), -1);
    cr_assert(strstr(err, "not defined before use"), "%s", err);
    ptc_graph_free(g);
}

Test(ir, op_table_is_consistent)
{
    for (int i = 0; i < PTC_NOPS; i++) {
        const ptc_op_info *o = &ptc_ops[i];
        cr_assert_not_null(o->name);
        cr_assert_eq(ptc_op_lookup(o->name), i, "op names are unique: %s", o->name);
        cr_assert_eq(o->req & ~o->kw, 0u, "%s: required attributes are attributes", o->name);
        cr_assert_eq(o->langpos & ~o->kw, 0u, "%s: positional attribute is an attribute", o->name);
    }
}
