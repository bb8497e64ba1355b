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

/* the op through the kernels, against rt_run; ids (i32 operands) below bound */
static void check(ptc_op op, ptc_attrs at, int nin, const ptc_type *it, int64_t bound)
{
    void *in[8];
    for (int i = 0; i < nin; i++) {
        int64_t n = ptc_type_numel(&it[i]);
        in[i] = malloc(4 * (size_t)(n ? n : 1));
        for (int64_t e = 0; e < n; e++) {
            if (it[i].dtype == PTC_I32)
                ((int32_t *)in[i])[e] = (int32_t)(urand() * (float)bound) % (int32_t)bound;
            else
                ((float *)in[i])[e] = 2.0f * urand() - 1.0f;
        }
    }
    rt_result want = rt_ok(op, at, nin, it, in);
    ptc_op_kernels ok;
    char why[512];
    int rc = ptc_op_kernels_build("t", op, &at, nin, it, want.nout, want.ot, &ok, why, sizeof why);
    cr_assert_eq(rc, 0, "%s: %s", ptc_ops[op].name, why);
    void *got[PTC_MAX_RESULTS];
    for (int j = 0; j < want.nout; j++) {
        size_t bytes = 4 * (size_t)ptc_type_numel(&want.ot[j]);
        got[j] = malloc(bytes ? bytes : 4);
        memset(got[j], 0xff, bytes); /* NaN: a forgotten element shows */
    }
    float *scratch = ok.scratch ? malloc(4 * (size_t)ok.scratch) : NULL;
    for (int q = 0; q < ok.n; q++) {
        void *args[PTC_OPK_MAX_ARGS];
        for (int p = 0; p < ok.k[q]->nparams; p++) {
            int a = ok.arg[q][p];
            args[p] = a >= PTC_OPK_SCRATCH ? (void *)scratch
                      : a >= PTC_OPK_OUT   ? got[a - PTC_OPK_OUT]
                                           : in[a - PTC_OPK_IN];
        }
        /* two threads: the parallel loops split, as on a target */
        for (int t = 0; t < 2; t++) {
            cr_assert_eq(ptc_kir_run(ok.k[q], args, t, 2, why, sizeof why), 0, "%s kernel %d: %s",
                         ptc_ops[op].name, q, why);
        }
    }
    for (int j = 0; j < want.nout; j++) {
        int64_t n = ptc_type_numel(&want.ot[j]);
        const float *g = got[j], *w = want.out[j];
        for (int64_t e = 0; e < n; e++) {
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
    ptc_type clip[] = {SCALAR(PTC_F32), SCALAR(PTC_F32)};
    check(PTC_OP_CLIP_COEF, none(), 2, clip, 0);
    ptc_attrs e = none();
    e.eps = 1e-5;
    ptc_type ln[] = {TY(PTC_F32, 3, 7, 13), TY(PTC_F32, 13), TY(PTC_F32, 3, 7, 13)};
    check(PTC_OP_LAYERNORM_GRAD, e, 3, ln, 0);
    ptc_type ln1[] = {TY(PTC_F32, 1, 1), TY(PTC_F32, 1), TY(PTC_F32, 1, 1)};
    check(PTC_OP_LAYERNORM_GRAD, e, 3, ln1, 0);
}

Test(kir_ops, refuses_what_it_does_not_cover)
{
    ptc_op_kernels ok;
    char why[256];
    ptc_type t[] = {TY(PTC_F32, 2, 8), TY(PTC_F32, 8)};
    ptc_attrs a = none();
    a.eps = 1e-5;
    cr_expect_eq(ptc_op_kernels_build("t", PTC_OP_RMSNORM_GRAD, &a, 3,
                                      (ptc_type[]){t[0], t[1], t[0]}, 2,
                                      (ptc_type[]){t[0], t[1]}, &ok, why, sizeof why),
                 -1);
    cr_expect(strstr(why, "rmsnorm_grad") != NULL, "%s", why);
    ptc_type h[] = {TY(PTC_BF16, 2, 8), TY(PTC_BF16, 2, 8)};
    cr_expect_eq(ptc_op_kernels_build("t", PTC_OP_ADD, &a, 2, h, 1, h, &ok, why, sizeof why), -1);
    cr_expect(strstr(why, "non-f32") != NULL, "%s", why);
}
