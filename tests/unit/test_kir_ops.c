/* test_kir_ops.c - single ops as kernel-IR kernels (codegen/kir_ops.c) against the reference
 * kernels: every op the builder covers, on shapes with sizes of 1, odd and prime, run through
 * the interpreter (ptc_kir_run, bounds-checked) kernel after kernel with the scratch the op asks
 * for. The CUDA backend runs these same kernels (test_cuda.c runs them under the emulation). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kir_ops.h"
#include "ref_test.h"

static unsigned rng = 12345;
static float urand(void)
{
    rng = rng * 1103515245u + 12345u;
    return (float)((rng >> 8) & 0xffff) / 65536.0f;
}

/* the op through the kernels at coordinate coord, against the reference; ids (i32 operands)
 * below bound; the operands in mask positive are in [0.5, 1.5), the others in [-1, 1) */
static void check_at(ptc_op op, ptc_attrs at, int coord, int nin, const ptc_type *it,
                     int64_t bound, unsigned positive)
{
    void *in[8];
    for (int i = 0; i < nin; i++) {
        int64_t n = ptc_type_numel(&it[i]);
        in[i] = malloc(4 * (size_t)(n ? n : 1));
        for (int64_t e = 0; e < n; e++) {
            if (it[i].dtype == PTC_I32)
                ((int32_t *)in[i])[e] = (int32_t)(urand() * (float)bound) % (int32_t)bound;
            else
                ((float *)in[i])[e] = positive >> i & 1 ? 0.5f + urand() : 2.0f * urand() - 1.0f;
        }
    }
    rt_result want = rt_run_at(op, at, coord, nin, it, in);
    cr_assert_eq(want.rc, 0, "%s failed: %s", ptc_ops[op].name, want.err);
    ptc_op_kernels ok;
    char why[512];
    int rc = ptc_op_kernels_build("t", op, &at, coord, nin, it, want.nout, want.ot, &ok, why, sizeof why);
    cr_assert_eq(rc, 0, "%s: %s", ptc_ops[op].name, why);
    void *got[PTC_MAX_RESULTS];
    for (int j = 0; j < want.nout; j++) {
        size_t bytes = 4 * (size_t)ptc_type_numel(&want.ot[j]);
        got[j] = malloc(bytes ? bytes : 4);
        memset(got[j], 0xff, bytes); /* NaN: a forgotten element shows */
    }
    float *scratch = ok.scratch ? malloc(4 * (size_t)ok.scratch) : NULL;
    if (scratch)
        memset(scratch, 0xff, 4 * (size_t)ok.scratch);
    for (int q = 0; q < ok.n; q++) {
        void *args[PTC_OPK_MAX_ARGS];
        for (int p = 0; p < ok.k[q]->nparams; p++) {
            int a = ok.arg[q][p];
            args[p] = a >= PTC_OPK_SCRATCH ? (void *)scratch
                      : a >= PTC_OPK_OUT   ? got[a - PTC_OPK_OUT]
                                           : in[a - PTC_OPK_IN];
        }
        /* the whole kernel, checking that its parallel loops' iterations are independent (the
         * split over a target's threads; two parts run one after the other here could not show
         * a race) */
        cr_assert_eq(ptc_kir_run_checked(ok.k[q], args, why, sizeof why), 0, "%s kernel %d: %s",
                     ptc_ops[op].name, q, why);
    }
    for (int j = 0; j < want.nout; j++) {
        int64_t n = ptc_type_numel(&want.ot[j]);
        const float *g = got[j], *w = want.out[j];
        const int32_t *gi = got[j], *wi = want.out[j];
        for (int64_t e = 0; e < n && want.ot[j].dtype == PTC_I32; e++) { /* ids: exactly */
            cr_expect_eq(gi[e], wi[e], "%s result %d element %lld: kernel %d, reference %d",
                         ptc_ops[op].name, j, (long long)e, gi[e], wi[e]);
            if (gi[e] != wi[e])
                break;
        }
        for (int64_t e = 0; e < n && want.ot[j].dtype != PTC_I32; e++) {
            bool same = isnan(w[e]) ? isnan(g[e]) : fabs(g[e] - w[e]) <= 1e-5 * (1 + fabs(w[e]));
            cr_expect(same, "%s result %d element %lld: kernel %.9g, reference %.9g",
                      ptc_ops[op].name, j, (long long)e, g[e], w[e]);
            if (!same)
                break;
        }
        free(got[j]);
    }
    free(scratch);
    ptc_op_kernels_free(&ok);
    rt_free(&want);
    for (int i = 0; i < nin; i++)
        free(in[i]);
}

static void check(ptc_op op, ptc_attrs at, int nin, const ptc_type *it, int64_t bound)
{
    check_at(op, at, 0, nin, it, bound, 0);
}

static ptc_attrs none(void)
{
    ptc_attrs a;
    memset(&a, 0, sizeof a);
    return a;
}

Test(kir_ops, pointwise_with_broadcasting)
{
    ptc_op bin[] = {PTC_OP_ADD, PTC_OP_SUB, PTC_OP_MUL, PTC_OP_GELU_GRAD, PTC_OP_SILU_GRAD,
                    PTC_OP_RELU_GRAD};
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++) {
        ptc_type same[] = {TY(PTC_F32, 3, 7, 5), TY(PTC_F32, 3, 7, 5)};
        check(bin[i], none(), 2, same, 0);
    }
    ptc_type row[] = {TY(PTC_F32, 3, 7, 5), TY(PTC_F32, 5)};
    check(PTC_OP_ADD, none(), 2, row, 0);
    ptc_type mid[] = {TY(PTC_F32, 3, 1, 5), TY(PTC_F32, 7, 1)};
    check(PTC_OP_MUL, none(), 2, mid, 0);
    ptc_type scalar[] = {TY(PTC_F32, 13), SCALAR(PTC_F32)};
    check(PTC_OP_DIV, none(), 2, scalar, 0);
    ptc_op un[] = {PTC_OP_NEG, PTC_OP_EXP, PTC_OP_TANH, PTC_OP_SIGMOID, PTC_OP_RELU, PTC_OP_GELU,
                   PTC_OP_SILU};
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++) {
        ptc_type t[] = {TY(PTC_F32, 1, 11)};
        check(un[i], none(), 1, t, 0);
    }
}

Test(kir_ops, reductions)
{
    ptc_type big[] = {TY(PTC_F32, 7, 13, 3)};
    check(PTC_OP_SUMSQ, none(), 1, big, 0);
    ptc_type one[] = {TY(PTC_F32, 1)};
    check(PTC_OP_SUMSQ, none(), 1, one, 0);
    ptc_type many[] = {TY(PTC_F32, 3, 8191)}; /* three chunks, the last not full */
    check(PTC_OP_SUMSQ, none(), 1, many, 0);
    for (int axis = 0; axis < 3; axis++) {
        ptc_attrs a = none();
        a.axis = axis;
        check(PTC_OP_MEAN, a, 1, big, 0);
        check(PTC_OP_SUM, a, 1, big, 0);
    }
    ptc_type loss[] = {TY(PTC_F32, 29)};
    check(PTC_OP_MEAN, none(), 1, loss, 0);
}

/* sum_to takes its result's shape from the attrs (the shape it sums to) */
static void sum_to(ptc_type x, ptc_type to)
{
    ptc_attrs a = none();
    a.nshape = to.rank;
    for (int d = 0; d < to.rank; d++)
        a.shape[d] = to.dims[d];
    ptc_type t[] = {x};
    check(PTC_OP_SUM_TO, a, 1, t, 0);
}

Test(kir_ops, sum_to)
{
    sum_to(TY(PTC_F32, 5, 7, 3), TY(PTC_F32, 3));
    sum_to(TY(PTC_F32, 5, 7, 3), TY(PTC_F32, 7, 1));
    sum_to(TY(PTC_F32, 5, 7, 3), TY(PTC_F32, 5, 1, 3));
    sum_to(TY(PTC_F32, 2, 11), SCALAR(PTC_F32));
    sum_to(TY(PTC_F32, 1, 1), TY(PTC_F32, 1));
    /* long column sums, in two passes: rows a multiple of the chunk, and not; two kept dims */
    sum_to(TY(PTC_F32, 2, 64, 3), TY(PTC_F32, 3));
    sum_to(TY(PTC_F32, 67, 5), TY(PTC_F32, 5));
    sum_to(TY(PTC_F32, 97, 4, 3), TY(PTC_F32, 4, 3));
    sum_to(TY(PTC_F32, 3, 67, 5), TY(PTC_F32, 3, 1, 5));
}

Test(kir_ops, shape_ops)
{
    ptc_attrs a = none();
    a.axis = 1;
    a.start = 2;
    a.len = 3;
    ptc_type x[] = {TY(PTC_F32, 3, 7, 5)};
    check(PTC_OP_SLICE, a, 1, x, 0);
    a.len = 11; /* pad [3,7,5] to [3,11,5] at 2 */
    check(PTC_OP_PAD, a, 1, x, 0);
    ptc_attrs c = none();
    c.axis = 2;
    ptc_type cat[] = {TY(PTC_F32, 2, 3, 5), TY(PTC_F32, 2, 3, 1), TY(PTC_F32, 2, 3, 7)};
    check(PTC_OP_CONCAT, c, 3, cat, 0);
    c.axis = 0;
    ptc_type cat0[] = {TY(PTC_F32, 1, 4), TY(PTC_F32, 3, 4)};
    check(PTC_OP_CONCAT, c, 2, cat0, 0);
}

Test(kir_ops, model_ops)
{
    ptc_type emb[] = {TY(PTC_F32, 17, 5), TY(PTC_I32, 3, 7)};
    check(PTC_OP_EMBEDDING, none(), 2, emb, 17);
    ptc_attrs g = none();
    g.n = 17; /* the table's rows */
    ptc_type egrad[] = {TY(PTC_I32, 3, 7), TY(PTC_F32, 3, 7, 5)};
    check(PTC_OP_EMBEDDING_GRAD, g, 2, egrad, 17);
    /* 201 rows: 51 blocks of 4 rows a thread (the last holding one), 145 tokens */
    g.n = 201;
    ptc_type egrad_blocks[] = {TY(PTC_I32, 5, 29), TY(PTC_F32, 5, 29, 3)};
    check(PTC_OP_EMBEDDING_GRAD, g, 2, egrad_blocks, 201);
    ptc_type clip[] = {SCALAR(PTC_F32), SCALAR(PTC_F32)};
    check(PTC_OP_CLIP_COEF, none(), 2, clip, 0);
    ptc_attrs e = none();
    e.eps = 1e-5;
    ptc_type ln[] = {TY(PTC_F32, 3, 7, 13), TY(PTC_F32, 13), TY(PTC_F32, 3, 7, 13)};
    check(PTC_OP_LAYERNORM_GRAD, e, 3, ln, 0);
    ptc_type ln1[] = {TY(PTC_F32, 1, 1), TY(PTC_F32, 1), TY(PTC_F32, 1, 1)};
    check(PTC_OP_LAYERNORM_GRAD, e, 3, ln1, 0);
    /* 145 and 128 rows: the parameters' gradients in two passes */
    ptc_type lnl[] = {TY(PTC_F32, 5, 29, 13), TY(PTC_F32, 13), TY(PTC_F32, 5, 29, 13)};
    check(PTC_OP_LAYERNORM_GRAD, e, 3, lnl, 0);
    ptc_type ln128[] = {TY(PTC_F32, 128, 3), TY(PTC_F32, 3), TY(PTC_F32, 128, 3)};
    check(PTC_OP_LAYERNORM_GRAD, e, 3, ln128, 0);
}

Test(kir_ops, rank_dependent_ops)
{
    for (int c = 0; c < 3; c++) {
        ptc_attrs a = none();
        ptc_type x[] = {TY(PTC_F32, 2, 12, 5)};
        check_at(PTC_OP_PARTIALIZE, a, c, 1, x, 0, 0);
        a.axis = 1;
        a.group = 3;
        a.n = 1;
        check_at(PTC_OP_SHARD_SLICE, a, c, 1, x, 0, 0);
        a.n = 2; /* two groups (q and k of a fused projection) */
        check_at(PTC_OP_SHARD_SLICE, a, c, 1, x, 0, 0);
        a.n = 1; /* ids (expert parallelism's routes) */
        ptc_type xi[] = {TY(PTC_I32, 2, 12, 5)};
        check_at(PTC_OP_SHARD_SLICE, a, c, 1, xi, 1000, 0);
        ptc_attrs e = none();
        e.group = 3;
        ptc_type emb[] = {TY(PTC_F32, 7, 5), TY(PTC_I32, 3, 4)};
        check_at(PTC_OP_EMBEDDING_SHARD, e, c, 2, emb, 21, 0);
        e.n = 7;
        ptc_type eg[] = {TY(PTC_I32, 3, 4), TY(PTC_F32, 3, 4, 5)};
        check_at(PTC_OP_EMBEDDING_GRAD_SHARD, e, c, 2, eg, 21, 0);
        e.n = 70; /* 70 rows a rank: 35 blocks of 2 */
        ptc_type egb[] = {TY(PTC_I32, 4, 29), TY(PTC_F32, 4, 29, 3)};
        check_at(PTC_OP_EMBEDDING_GRAD_SHARD, e, c, 2, egb, 210, 0);
        e.n = 7;
        ptc_type pick[] = {TY(PTC_F32, 2, 3, 11), TY(PTC_I32, 2, 3)};
        check_at(PTC_OP_CE_PICK, e, c, 2, pick, 33, 0);
        ptc_type gs[] = {TY(PTC_F32, 6, 11), TY(PTC_I32, 6), TY(PTC_F32, 6), TY(PTC_F32, 6),
                         SCALAR(PTC_F32)};
        check_at(PTC_OP_CE_GRAD_SHARD, e, c, 5, gs, 33, 1u << 3);
    }
    ptc_type se[] = {TY(PTC_F32, 6, 11), TY(PTC_F32, 6)};
    check(PTC_OP_CE_SUMEXP, none(), 2, se, 0);
    ptc_type cl[] = {TY(PTC_F32, 6), TY(PTC_F32, 6), TY(PTC_F32, 6)};
    check_at(PTC_OP_CE_LOSS, none(), 0, 3, cl, 0, 1u << 1);
}

Test(kir_ops, optimizers)
{
    ptc_attrs a = none();
    a.beta1 = 0.9;
    a.beta2 = 0.95;
    a.eps = 1e-8;
    a.wd = 0.1;
    ptc_type t[] = {TY(PTC_F32, 37), TY(PTC_F32, 37), TY(PTC_F32, 37), TY(PTC_F32, 37),
                    SCALAR(PTC_F32), SCALAR(PTC_F32)};
    check_at(PTC_OP_ADAMW_UPDATE, a, 0, 6, t, 0, 1u << 3 | 1u << 5);
    ptc_attrs g = none();
    g.wd = 0.01;
    g.momentum = 0.9;
    ptc_type sg[] = {TY(PTC_F32, 37), TY(PTC_F32, 37), TY(PTC_F32, 37), SCALAR(PTC_F32)};
    check(PTC_OP_SGD_UPDATE, g, 4, sg, 0);
    g.momentum = 0;
    check(PTC_OP_SGD_UPDATE, g, 4, sg, 0);
}

Test(kir_ops, rows_and_norms)
{
    ptc_type x[] = {TY(PTC_F32, 3, 7, 5)};
    for (int axis = 0; axis < 3; axis++) {
        ptc_attrs a = none();
        a.axis = axis;
        check(PTC_OP_MAX, a, 1, x, 0);
        check(PTC_OP_SOFTMAX, a, 1, x, 0);
        check(PTC_OP_LOG_SOFTMAX, a, 1, x, 0);
        ptc_type yg[] = {x[0], x[0]};
        check(PTC_OP_SOFTMAX_GRAD, a, 2, yg, 0);
        check(PTC_OP_LOG_SOFTMAX_GRAD, a, 2, yg, 0);
    }
    ptc_attrs b = none();
    b.nshape = 3;
    b.shape[0] = 3, b.shape[1] = 7, b.shape[2] = 5;
    ptc_type bt[] = {TY(PTC_F32, 7, 1)};
    check(PTC_OP_BROADCAST_TO, b, 1, bt, 0);
    ptc_attrs e = none();
    e.eps = 1e-5;
    ptc_type ln[] = {TY(PTC_F32, 3, 7, 13), TY(PTC_F32, 13), TY(PTC_F32, 13)};
    check(PTC_OP_LAYERNORM, e, 3, ln, 0);
    check(PTC_OP_RMSNORM, e, 2, ln, 0);
    ptc_type rg[] = {TY(PTC_F32, 3, 7, 13), TY(PTC_F32, 13), TY(PTC_F32, 3, 7, 13)};
    check(PTC_OP_RMSNORM_GRAD, e, 3, rg, 0);
    ptc_type one[] = {TY(PTC_F32, 1, 1), TY(PTC_F32, 1), TY(PTC_F32, 1, 1)};
    check(PTC_OP_RMSNORM_GRAD, e, 3, one, 0);
    ptc_type rgl[] = {TY(PTC_F32, 5, 29, 13), TY(PTC_F32, 13), TY(PTC_F32, 5, 29, 13)};
    check(PTC_OP_RMSNORM_GRAD, e, 3, rgl, 0);
}

Test(kir_ops, losses_and_rope)
{
    ptc_type ce[] = {TY(PTC_F32, 2, 3, 17), TY(PTC_I32, 2, 3)};
    check(PTC_OP_CROSS_ENTROPY, none(), 2, ce, 17);
    ptc_type cg[] = {TY(PTC_F32, 2, 3, 17), TY(PTC_I32, 2, 3), SCALAR(PTC_F32)};
    check(PTC_OP_CROSS_ENTROPY_GRAD, none(), 3, cg, 17);
    ptc_attrs r = none();
    r.heads = 3;
    r.base = 10000;
    ptc_type x[] = {TY(PTC_F32, 2, 5, 12)};
    check(PTC_OP_ROPE, r, 1, x, 0);
    check(PTC_OP_ROPE_GRAD, r, 1, x, 0);
}

Test(kir_ops, split_permute_max_grad_mse)
{
    ptc_type x[] = {TY(PTC_F32, 3, 6, 5)};
    for (int axis = 0; axis < 3; axis++) {
        ptc_attrs a = none();
        a.axis = axis;
        a.n = axis == 0 ? 3 : axis == 1 ? 2 : 5; /* parts */
        check(PTC_OP_SPLIT, a, 1, x, 0);
        ptc_type g[] = {x[0], axis == 0 ? TY(PTC_F32, 6, 5) : axis == 1 ? TY(PTC_F32, 3, 5)
                                                                         : TY(PTC_F32, 3, 6)};
        check(PTC_OP_MAX_GRAD, a, 2, g, 0);
    }
    ptc_attrs p = none();
    p.nshape = 3;
    p.shape[0] = 2, p.shape[1] = 0, p.shape[2] = 1;
    check(PTC_OP_PERMUTE, p, 1, x, 0);
    check(PTC_OP_TRANSPOSE, none(), 1, x, 0);
    ptc_type m[] = {TY(PTC_F32, 7, 3), TY(PTC_F32, 7, 3)};
    check(PTC_OP_MSE, none(), 2, m, 0);
}

Test(kir_ops, refuses_what_it_does_not_cover)
{
    ptc_op_kernels ok;
    char why[256];
    ptc_type t[] = {TY(PTC_F32, 2, 8), TY(PTC_F32, 8)};
    ptc_attrs a = none();
    a.eps = 1e-5;
    cr_expect_eq(ptc_op_kernels_build("t", PTC_OP_MOE_ROUTE, &a, 0, 3,
                                      (ptc_type[]){t[0], t[1], t[0]}, 2,
                                      (ptc_type[]){t[0], t[1]}, &ok, why, sizeof why),
                 -1);
    cr_expect(strstr(why, "moe_route") != NULL, "%s", why);
    ptc_type h[] = {TY(PTC_I32, 2, 8), TY(PTC_I32, 2, 8)};
    cr_expect_eq(ptc_op_kernels_build("t", PTC_OP_ADD, &a, 0, 2, h, 1, h, &ok, why, sizeof why), -1);
    cr_expect(strstr(why, "integer") != NULL, "%s", why);
}
