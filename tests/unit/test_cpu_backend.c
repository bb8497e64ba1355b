/* test_cpu_backend.c - every fast CPU kernel (runtime/cpu*.c) against its reference kernel.
 *
 * Each case runs one node through ptrt_ref_run and through ptrt_cpu_run on the same random inputs
 * of awkward shapes (odd sizes, sizes that are not multiples of the vector width, the GEMM block
 * or the attention query block; broadcasting; grouped-query and causal attention) and compares the
 * results with the error measure of tests/torch/compare.py: max |cpu - ref| over the tensor divided
 * by max |ref|. The tolerances, by kind of kernel:
 *
 *   exact (0)  the fast kernel does the reference's arithmetic: float +,-,*,/ round once, like the
 *              reference's double op rounded to float; AdamW and rope repeat its double arithmetic;
 *              sum_to adds the same terms in the same order into double; moves copy bits.
 *   1e-6       float exp/tanh (a polynomial within 2 ulp) and short float sums (softmax rows,
 *              cross-entropy): a few float roundings, ~6e-8 each, relative to the largest value.
 *   2e-5       float dot products over k <= ~300 terms (GEMM, attention, norm statistics, the
 *              experts of moe): the rounding error of a float sum grows like sqrt(k) u on random
 *              data (u = 6e-8), with u k = 2e-5 as the worst case for k = 300; the reference
 *              sums in double.
 *
 * Every case runs twice at each of 1, 2 and 3 threads and must give the same bits both times; and,
 * except for matmul and moe's experts (GEMMs both), the same bits at every thread count (kernels
 * split work so that no result depends on where the pieces are cut; OpenBLAS's edge tiles do not
 * promise that). The vector math runs both its AVX2 and its portable path.
 *
 * The ops of ptc_op_storage16 over bf16/f16 storage, on both backends, give exactly the bits of
 * the casts the fusion pass folded into them (cpu_storage16).
 */
#include "ref_test.h"

#include "cpu.h"
#include "cpu_internal.h"

#define EXACT 0.0
#define TRANSC 1e-6
#define DOT 2e-5

typedef struct both {
    int nout;
    ptc_type ot[PTC_MAX_RESULTS];
    void *ref[PTC_MAX_RESULTS], *cpu[PTC_MAX_RESULTS];
    int rc_ref, rc_cpu;
    char err_ref[512], err_cpu[512];
} both;

static void *alloc_poison(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert(p != NULL);
    memset(p, 0xFF, bytes); /* NaN for floats: an element a kernel forgets shows up */
    return p;
}

/* the rank's coordinate on the op's mesh axis that run_both gives the kernels (moe_ep_ffn) */
static int run_coord;

/* Runs op on both backends (shape inference first, as the executor does). */
static both run_both(ptc_op op, ptc_attrs at, int nin, const ptc_type *it, void *const *in)
{
    both r;
    memset(&r, 0, sizeof r);
    char err[512] = "";
    r.nout = ptc_infer(op, it, nin, &at, r.ot, err, sizeof err);
    cr_assert(r.nout > 0, "shape inference of %s failed: %s", ptc_ops[op].name, err);
    ptrt_kcall node;
    memset(&node, 0, sizeof node);
    node.op = op;
    node.nin = nin;
    node.nout = r.nout;
    node.attrs = at;
    node.coord = run_coord;
    for (int j = 0; j < r.nout; j++) {
        size_t bytes = (size_t)ptc_type_numel(&r.ot[j]) * 4;
        r.ref[j] = alloc_poison(bytes);
        r.cpu[j] = alloc_poison(bytes);
    }
    r.rc_ref = ptrt_ref_run(&node, it, in, r.ot, r.ref, r.err_ref, sizeof r.err_ref);
    r.rc_cpu = ptrt_cpu_run(&node, it, in, r.ot, r.cpu, r.err_cpu, sizeof r.err_cpu);
    return r;
}

static void free_both(both *r)
{
    for (int j = 0; j < r->nout; j++) {
        free(r->ref[j]);
        free(r->cpu[j]);
    }
}

/* max |a - b| / max |b| (0/0 = 0); NaN anywhere in a that b does not have counts as infinite. */
static double rel_error(const float *a, const float *b, int64_t n)
{
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i]))
            return INFINITY;
        if (isnan(b[i]))
            continue;
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return worst == 0 ? 0 : scale == 0 ? INFINITY : worst / scale;
}

/* Compares every result of r within tol, and the return codes and messages. */
static void expect_close(const both *r, const char *what, double tol)
{
    cr_expect_eq(r->rc_cpu, r->rc_ref, "%s: cpu returned %d, reference %d (%s / %s)", what,
                 r->rc_cpu, r->rc_ref, r->err_cpu, r->err_ref);
    if (r->rc_ref != 0) {
        cr_expect_str_eq(r->err_cpu, r->err_ref, "%s: messages differ", what);
        return;
    }
    for (int j = 0; j < r->nout; j++) {
        int64_t n = ptc_type_numel(&r->ot[j]);
        if (r->ot[j].dtype == PTC_I32) {
            cr_expect(memcmp(r->cpu[j], r->ref[j], (size_t)n * 4) == 0, "%s: result %d differs",
                      what, j);
            continue;
        }
        double e = rel_error(r->cpu[j], r->ref[j], n);
        if (tol == 0)
            cr_expect(memcmp(r->cpu[j], r->ref[j], (size_t)n * 4) == 0,
                      "%s: result %d is not bit-identical to the reference (error %.3g)", what, j,
                      e);
        else
            cr_expect(e <= tol, "%s: result %d error %.3g > %.3g", what, j, e, tol);
    }
}

static void expect_same_bits(const both *a, const both *b, const char *what, int threads)
{
    for (int j = 0; j < a->nout && a->rc_cpu == 0; j++)
        cr_expect(memcmp(a->cpu[j], b->cpu[j], (size_t)ptc_type_numel(&a->ot[j]) * 4) == 0,
                  "%s: result %d at %d threads is not the same bits", what, j, threads);
}

/* Runs op at 1, 2 and 3 threads, twice each: within tol of the reference, the same bits on both
 * runs and, unless varies_with_threads, the same bits at every thread count. */
static void check_threads(const char *what, ptc_op op, ptc_attrs at, int nin, const ptc_type *it,
                          void *const *in, double tol, bool varies_with_threads)
{
    both first;
    memset(&first, 0, sizeof first);
    for (int threads = 1; threads <= 3; threads++) {
        ptrt_cpu_set_threads(threads);
        both r = run_both(op, at, nin, it, in), again = run_both(op, at, nin, it, in);
        expect_close(&r, what, tol);
        expect_same_bits(&r, &again, what, threads);
        free_both(&again);
        if (threads == 1) {
            first = r;
            continue;
        }
        if (!varies_with_threads)
            expect_same_bits(&r, &first, what, threads);
        free_both(&r);
    }
    free_both(&first);
    ptrt_cpu_set_threads(0);
}

static void check(const char *what, ptc_op op, ptc_attrs at, int nin, const ptc_type *it,
                  void *const *in, double tol)
{
    check_threads(what, op, at, nin, it, in, tol, false);
}

static float *rnd(int64_t n, uint32_t seed, float lo, float hi)
{
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    cr_assert(p != NULL);
    rt_fill(p, n, seed, lo, hi);
    return p;
}

static int32_t *ids(int64_t n, uint32_t seed, int32_t bound)
{
    int32_t *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    cr_assert(p != NULL);
    uint32_t s = seed * 2654435761u + 7;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (int32_t)((s >> 8) % (uint32_t)bound);
    }
    return p;
}

#define DEF(op) ptc_attrs_default(PTC_OP_##op)

/* ---- elementwise ---- */

static void binary_case(const char *what, ptc_type ta, ptc_type tb)
{
    float *a = rnd(ptc_type_numel(&ta), 1, -2, 2), *b = rnd(ptc_type_numel(&tb), 2, 0.5f, 3);
    ptc_op ops[] = {PTC_OP_ADD, PTC_OP_SUB, PTC_OP_MUL, PTC_OP_DIV};
    for (int i = 0; i < 4; i++) {
        char name[200];
        snprintf(name, sizeof name, "%s %s", ptc_ops[ops[i]].name, what);
        check(name, ops[i], ptc_attrs_default(ops[i]), 2, (ptc_type[]){ta, tb}, (void *[]){a, b},
              EXACT);
        check(name, ops[i], ptc_attrs_default(ops[i]), 2, (ptc_type[]){tb, ta}, (void *[]){b, a},
              EXACT);
    }
    free(a);
    free(b);
}

Test(cpu_elementwise, binary_broadcasts)
{
    binary_case("same shape", TY(PTC_F32, 3, 37, 129), TY(PTC_F32, 3, 37, 129));
    binary_case("bias", TY(PTC_F32, 5, 33, 131), TY(PTC_F32, 131));
    binary_case("positions", TY(PTC_F32, 4, 9, 65), TY(PTC_F32, 9, 65));
    binary_case("leading ones", TY(PTC_F32, 4, 9, 65), TY(PTC_F32, 1, 1, 65));
    binary_case("same shape, several blocks", TY(PTC_F32, 5, 70, 130), TY(PTC_F32, 5, 70, 130));
    binary_case("scalar", TY(PTC_F32, 7, 1001), SCALAR(PTC_F32));
    binary_case("scalar, several blocks", TY(PTC_F32, 3, 20011), SCALAR(PTC_F32));
    binary_case("both scalar", SCALAR(PTC_F32), SCALAR(PTC_F32));
    binary_case("short rows (reference)", TY(PTC_F32, 50, 3), TY(PTC_F32, 3));
    binary_case("outer (reference)", TY(PTC_F32, 70, 1), TY(PTC_F32, 1, 90));
    binary_case("middle (reference)", TY(PTC_F32, 6, 70, 80), TY(PTC_F32, 6, 1, 80));
}

Test(cpu_elementwise, binary_bf16_goes_to_the_reference)
{
    ptc_type t = TY(PTC_BF16, 9, 77);
    float *a = rnd(9 * 77, 3, -2, 2), *b = rnd(9 * 77, 4, -2, 2);
    for (int i = 0; i < 9 * 77; i++) { /* values representable in bf16 */
        a[i] = ptrt_round_bf16(a[i]);
        b[i] = ptrt_round_bf16(b[i]);
    }
    check("add bf16", PTC_OP_ADD, DEF(ADD), 2, (ptc_type[]){t, t}, (void *[]){a, b}, EXACT);
    free(a);
    free(b);
}

static void unary_cases(bool portable)
{
    ptrt_cpu_vec_force_portable(portable);
    int64_t n = 4099; /* not a multiple of 8 */
    ptc_type t = TY(PTC_F32, n);
    float *x = rnd(n, 5, -12, 12), *dy = rnd(n, 6, -1, 1);
    x[0] = 0;
    x[1] = -0.0f;
    x[2] = 1e-7f;
    x[3] = -30;
    x[4] = 30;
    ptc_op fwd[] = {PTC_OP_GELU, PTC_OP_SILU, PTC_OP_RELU, PTC_OP_NEG};
    double tol[] = {TRANSC, TRANSC, EXACT, EXACT};
    for (int i = 0; i < 4; i++)
        check(ptc_ops[fwd[i]].name, fwd[i], ptc_attrs_default(fwd[i]), 1, &t, (void *[]){x},
              tol[i]);
    ptc_op bwd[] = {PTC_OP_GELU_GRAD, PTC_OP_SILU_GRAD, PTC_OP_RELU_GRAD};
    for (int i = 0; i < 3; i++)
        check(ptc_ops[bwd[i]].name, bwd[i], ptc_attrs_default(bwd[i]), 2, (ptc_type[]){t, t},
              (void *[]){x, dy}, tol[i]);
    /* small |x|, where GELU's tanh(u) is nearly u: errors relative to a small tensor */
    rt_fill(x, n, 7, -1e-3f, 1e-3f);
    check("gelu small", PTC_OP_GELU, DEF(GELU), 1, &t, (void *[]){x}, TRANSC);
    check("gelu_grad small", PTC_OP_GELU_GRAD, DEF(GELU_GRAD), 2, (ptc_type[]){t, t},
          (void *[]){x, dy}, TRANSC);
    free(x);
    free(dy);
    ptrt_cpu_vec_force_portable(false);
}

Test(cpu_elementwise, unary_and_grads_vector_path)
{
    unary_cases(false);
}

Test(cpu_elementwise, unary_and_grads_portable_path)
{
    unary_cases(true);
}

Test(cpu_elementwise, transpose_and_reshape)
{
    float *x = rnd(130 * 70, 8, -1, 1);
    for (int portable = 0; portable < 2; portable++) { /* 8x8 register blocks, plain loop */
        ptrt_cpu_vec_force_portable(portable);
        check("transpose [3,37,41]", PTC_OP_TRANSPOSE, DEF(TRANSPOSE), 1,
              (ptc_type[]){TY(PTC_F32, 3, 37, 41)}, (void *[]){x}, EXACT);
        check("transpose [1,1]", PTC_OP_TRANSPOSE, DEF(TRANSPOSE), 1,
              (ptc_type[]){TY(PTC_F32, 1, 1)}, (void *[]){x}, EXACT);
        check("transpose [130,70]", PTC_OP_TRANSPOSE, DEF(TRANSPOSE), 1,
              (ptc_type[]){TY(PTC_F32, 130, 70)}, (void *[]){x}, EXACT);
        check("transpose i32 [2,16,24]", PTC_OP_TRANSPOSE, DEF(TRANSPOSE), 1,
              (ptc_type[]){TY(PTC_I32, 2, 16, 24)}, (void *[]){x}, EXACT);
    }
    ptrt_cpu_vec_force_portable(false);
    ptc_attrs at = DEF(RESHAPE);
    at.nshape = 2;
    at.shape[0] = 111;
    at.shape[1] = 41;
    check("reshape", PTC_OP_RESHAPE, at, 1, (ptc_type[]){TY(PTC_F32, 3, 37, 41)}, (void *[]){x},
          EXACT);
    free(x);
}

/* concat: rows split across the pool (3 x [64, 300] along the last axis: pieces of rows), other
 * axes, i32, an empty operand, and more operands than the fast kernel takes (the reference) */
Test(cpu_elementwise, concat)
{
    float *x = rnd(3 * 64 * 300, 10, -1, 1), *y = rnd(64 * 300, 11, -1, 1);
    ptc_attrs at = DEF(CONCAT);
    at.axis = 1;
    check("concat [64,300] x 3, axis 1", PTC_OP_CONCAT, at, 3,
          (ptc_type[]){TY(PTC_F32, 64, 300), TY(PTC_F32, 64, 300), TY(PTC_F32, 64, 300)},
          (void *[]){x, y, x + 64 * 300}, EXACT);
    check("concat [3,5,7] [3,2,7] [3,1,7], axis 1", PTC_OP_CONCAT, at, 3,
          (ptc_type[]){TY(PTC_F32, 3, 5, 7), TY(PTC_F32, 3, 2, 7), TY(PTC_F32, 3, 1, 7)},
          (void *[]){x, y, x + 500}, EXACT);
    check("concat i32 [4,3] [4,0] [4,5], axis 1", PTC_OP_CONCAT, at, 3,
          (ptc_type[]){TY(PTC_I32, 4, 3), TY(PTC_I32, 4, 0), TY(PTC_I32, 4, 5)},
          (void *[]){x, y, x + 100}, EXACT);
    at.axis = 0;
    check("concat [2,3] [5,3], axis 0", PTC_OP_CONCAT, at, 2,
          (ptc_type[]){TY(PTC_F32, 2, 3), TY(PTC_F32, 5, 3)}, (void *[]){x, y}, EXACT);
    enum { MANY = 70 };
    ptc_type ts[MANY];
    void *ps[MANY];
    for (int i = 0; i < MANY; i++) {
        ts[i] = TY(PTC_F32, 2, 1 + i % 3);
        ps[i] = x + 7 * i;
    }
    at.axis = 1;
    check("concat of 70 operands, axis 1", PTC_OP_CONCAT, at, MANY, ts, ps, EXACT);
    free(x);
    free(y);
}

/* The softmax rows' exp_sum and max: the AVX-512 paths give the AVX2 paths' bits (the same exp
 * on 16 lanes, the same 8 running sums in the same order), on rows of 1 to 300, in place and not:
 * random rows, rows with values past exp's range, and rows with a NaN (first, and later). */
Test(cpu_vec, avx512_softmax_rows_match_avx2)
{
    if (!ptrt_cpu_vec_avx2())
        cr_skip_test("no AVX2 on this CPU");
    float *a = malloc(300 * sizeof *a), *b = malloc(300 * sizeof *b);
    cr_assert(a && b);
    for (int set = 0; set < 4; set++) {
        float *x = rnd(300, 12 + (uint32_t)set, -3, 3);
        if (set == 1) { /* past exp's range both ways, and a large maximum late */
            x[40] = -INFINITY;
            x[77] = -200.0f;
            x[150] = 95.0f;
        }
        if (set == 2)
            x[0] = NAN;
        if (set == 3)
            x[37] = NAN;
        for (int64_t n = 1; n <= 300; n++) {
            ptrt_cpu_vec_no_avx512(true);
            float m2 = ptrt_cpu_max(x, n), s2 = ptrt_cpu_exp_sum(x, m2, b, n);
            memcpy(a, x, (size_t)n * sizeof *a);
            float s2i = ptrt_cpu_exp_sum(a, m2, a, n); /* in place */
            ptrt_cpu_vec_no_avx512(false);
            float m5 = ptrt_cpu_max(x, n), s5 = ptrt_cpu_exp_sum(x, m5, a, n);
            cr_assert(memcmp(&m2, &m5, sizeof m2) == 0, "set %d, max of %lld: %.9g vs %.9g", set,
                      (long long)n, m2, m5);
            cr_assert(memcmp(&s2, &s5, sizeof s2) == 0 && memcmp(&s2, &s2i, sizeof s2) == 0,
                      "set %d, exp_sum of %lld: %.9g vs %.9g (in place %.9g)", set, (long long)n,
                      s2, s5, s2i);
            cr_assert(memcmp(a, b, (size_t)n * sizeof *a) == 0, "set %d: exps of %lld differ", set,
                      (long long)n);
        }
        free(x);
    }
    free(a);
    free(b);
}

static void sum_to_case(const char *what, ptc_type tx, ptc_type to)
{
    float *x = rnd(ptc_type_numel(&tx), 9, -1, 1);
    ptc_attrs at = DEF(SUM_TO);
    at.nshape = to.rank;
    memcpy(at.shape, to.dims, sizeof(int64_t) * (size_t)to.rank);
    check(what, PTC_OP_SUM_TO, at, 1, &tx, (void *[]){x}, EXACT);
    free(x);
}

Test(cpu_elementwise, sum_to)
{
    sum_to_case("bias grad", TY(PTC_F32, 5, 33, 131), TY(PTC_F32, 131));
    sum_to_case("positions grad", TY(PTC_F32, 4, 33, 70), TY(PTC_F32, 33, 70));
    sum_to_case("leading ones", TY(PTC_F32, 4, 33, 70), TY(PTC_F32, 1, 70));
    sum_to_case("same shape", TY(PTC_F32, 3, 70), TY(PTC_F32, 3, 70));
    sum_to_case("to scalar (reference)", TY(PTC_F32, 3, 70), SCALAR(PTC_F32));
    sum_to_case("middle (reference)", TY(PTC_F32, 3, 7, 70), TY(PTC_F32, 3, 1, 70));
}

Test(cpu_elementwise, sumsq)
{
    int64_t n = 7 * 14287; /* several blocks and a partial one */
    float *x = rnd(n, 10, -3, 3);
    check("sumsq big", PTC_OP_SUMSQ, DEF(SUMSQ), 1, (ptc_type[]){TY(PTC_F32, 7, 14287)},
          (void *[]){x}, TRANSC);
    check("sumsq small", PTC_OP_SUMSQ, DEF(SUMSQ), 1, (ptc_type[]){TY(PTC_F32, 77)}, (void *[]){x},
          EXACT);
    free(x);
}

Test(cpu_elementwise, adamw_update_is_the_reference_arithmetic)
{
    int64_t n = 70001;
    ptc_type t = TY(PTC_F32, n), s = SCALAR(PTC_F32);
    float *p = rnd(n, 11, -1, 1), *g = rnd(n, 12, -0.1f, 0.1f), *m = rnd(n, 13, -0.01f, 0.01f);
    float *v = rnd(n, 14, 0, 1e-4f), lr = 3e-3f, step = 7;
    ptc_attrs at = DEF(ADAMW_UPDATE);
    at.beta2 = 0.95;
    at.wd = 0.1;
    for (int portable = 0; portable < 2; portable++) { /* 4 doubles at a time, and one */
        ptrt_cpu_vec_force_portable(portable);
        check("adamw", PTC_OP_ADAMW_UPDATE, at, 6, (ptc_type[]){t, t, t, t, s, s},
              (void *[]){p, g, m, v, &lr, &step}, EXACT);
    }
    ptrt_cpu_vec_force_portable(false);
    free(p);
    free(g);
    free(m);
    free(v);
}

/* ---- matmul and the GEMM ---- */

static void matmul_case(const char *what, ptc_type ta, ptc_type tb)
{
    float *a = rnd(ptc_type_numel(&ta), 15, -1, 1), *b = rnd(ptc_type_numel(&tb), 16, -1, 1);
    /* OpenBLAS's edge tiles may round differently when the split points move: a GEMM gives the
     * same bits run after run at one thread count, not across thread counts */
    check_threads(what, PTC_OP_MATMUL, DEF(MATMUL), 2, (ptc_type[]){ta, tb}, (void *[]){a, b}, DOT,
                  true);
    free(a);
    free(b);
}

Test(cpu_gemm, matmul_shapes)
{
    matmul_case("x @ w", TY(PTC_F32, 3, 17, 33), TY(PTC_F32, 33, 29));
    matmul_case("2-d big enough to split", TY(PTC_F32, 130, 70), TY(PTC_F32, 70, 90));
    matmul_case("wide (split by columns)", TY(PTC_F32, 20, 90), TY(PTC_F32, 90, 1300));
    matmul_case("batched", TY(PTC_F32, 5, 31, 23), TY(PTC_F32, 5, 23, 19));
    matmul_case("broadcast batches", TY(PTC_F32, 2, 1, 5, 7), TY(PTC_F32, 3, 7, 4));
    matmul_case("left broadcast", TY(PTC_F32, 9, 11), TY(PTC_F32, 4, 11, 13));
    matmul_case("few big batches", TY(PTC_F32, 2, 150, 120), TY(PTC_F32, 2, 120, 140));
    matmul_case("k = 1", TY(PTC_F32, 40, 1), TY(PTC_F32, 1, 50));
    matmul_case("1 x 1", TY(PTC_F32, 1, 1), TY(PTC_F32, 1, 1));
}

/* The library routes a piece may take (cpu_gemm.c's piece_to_openblas): the rule, and each
 * library forced, where both are open (a CPU without AVX-512); elsewhere all three run the one. */
static const int ROUTES[3] = {PTRT_GEMM_ROUTE_RULE, PTRT_GEMM_ROUTE_ONEDNN,
                              PTRT_GEMM_ROUTE_OPENBLAS};

/* The GEMM with every transpose combination, through the library on every route and through
 * the plain loop, against a double loop. */
Test(cpu_gemm, transposes_and_plain_loop)
{
    int64_t m = 37, n = 45, k = 29;
    float *a = rnd(m * k, 17, -1, 1), *b = rnd(k * n, 18, -1, 1), *c0 = rnd(m * n, 19, -1, 1);
    float *c = malloc((size_t)(m * n) * sizeof *c), *want = malloc((size_t)(m * n) * sizeof *c);
    for (int mode = 0; mode < 16; mode++) {
        bool ta = mode & 1, tb = mode & 2, plain = (mode >> 2) == 3;
        ptrt_cpu_gemm_route = ROUTES[(mode >> 2) % 3];
        int64_t lda = ta ? m : k, ldb = tb ? k : n;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++)
                    s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                         (tb ? b[j * ldb + p] : b[p * ldb + j]);
                want[i * n + j] = (float)(0.5 * s + 0.25 * c0[i * n + j]);
            }
        memcpy(c, c0, (size_t)(m * n) * sizeof *c);
        if (plain)
            ptrt_cpu_gemm_plain(ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c, n);
        else
            ptrt_cpu_gemm(ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c, n);
        double e = rel_error(c, want, m * n);
        cr_expect(e <= DOT, "gemm ta=%d tb=%d plain=%d route %d (%s): error %.3g", ta, tb, plain,
                  ptrt_cpu_gemm_route, ptrt_cpu_blas_name(), e);
    }
    ptrt_cpu_gemm_route = PTRT_GEMM_ROUTE_RULE;
    free(a);
    free(b);
    free(c0);
    free(c);
    free(want);
}

/* The transposed-A product with beta 0 and C taller than wide, which oneDNN runs faster as
 * (B^T A)^T (cpu_gemm.c), on odd sizes with row strides past the matrices' widths, a C so tall
 * it splits across the pool, and one whose pieces are made a chunk of C^T (1M floats) at a time:
 * against a double loop, and the row padding of C untouched. */
Test(cpu_gemm, transposed_a_tall_c)
{
    int64_t shapes[][3] = {{301, 37, 53}, {1, 1, 7},    {17, 16, 1},
                           {4099, 67, 131}, {640, 511, 9}, {40009, 67, 3}};
    for (int sr = 0; sr < 18; sr++) { /* every shape on every route */
        int sh = sr % 6;
        ptrt_cpu_gemm_route = ROUTES[sr / 6];
        int64_t m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2];
        int64_t lda = m + 3, ldb = n + 2, ldc = n + 5;
        float *a = rnd(k * lda, 41 + sh, -1, 1), *b = rnd(k * ldb, 51 + sh, -1, 1);
        float *c = malloc((size_t)(m * ldc) * sizeof *c), *want = malloc((size_t)(m * n) * sizeof *c);
        float *got = malloc((size_t)(m * n) * sizeof *c);
        for (int64_t i = 0; i < m * ldc; i++)
            c[i] = 7.0f;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++)
                    s += (double)a[p * lda + i] * b[p * ldb + j];
                want[i * n + j] = (float)(1.5 * s);
            }
        ptrt_cpu_gemm(true, false, m, n, k, 1.5f, a, lda, b, ldb, 0.0f, c, ldc);
        bool pad_kept = true;
        for (int64_t i = 0; i < m; i++) {
            memcpy(got + i * n, c + i * ldc, (size_t)n * sizeof *c);
            for (int64_t j = n; j < ldc; j++)
                pad_kept = pad_kept && c[i * ldc + j] == 7.0f;
        }
        double e = rel_error(got, want, m * n);
        cr_expect(e <= DOT, "%ldx%ldx%ld route %d: error %.3g", (long)m, (long)n, (long)k,
                  ptrt_cpu_gemm_route, e);
        cr_expect(pad_kept, "%ldx%ldx%ld: C's row padding written", (long)m, (long)n, (long)k);
        free(a);
        free(b);
        free(c);
        free(want);
        free(got);
    }
    ptrt_cpu_gemm_route = PTRT_GEMM_ROUTE_RULE;
}

/* n random values in [-1, 1) rounded to bf16 or f16 storage */
static uint16_t *halves(int64_t n, uint32_t seed, bool f16)
{
    float *f = rnd(n, seed, -1, 1);
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        h[i] = f16 ? ptc_f16_bits(f[i]) : ptc_bf16_bits(f[i]);
    free(f);
    return h;
}

/* A row-major gemm instruction: mode bit 0 transposes A, bit 1 B, mode 3 adds to C (beta 1);
 * nb > 1 matrices one after another (A shared by all when shared_a). */
static ptc_gemm gemm_of(int mode, int64_t m, int64_t n, int64_t k, int64_t nb, bool shared_a)
{
    return (ptc_gemm){.ta = mode & 1,
                      .tb = (mode & 2) != 0,
                      .m = m,
                      .n = n,
                      .k = k,
                      .batch = nb,
                      .lda = (mode & 1) ? m : k,
                      .ldb = (mode & 2) ? k : n,
                      .ldc = n,
                      .sa = nb > 1 && !shared_a ? m * k : 0,
                      .sb = nb > 1 ? k * n : 0,
                      .sc = m * n,
                      .alpha = 1.0,
                      .beta = mode == 3 ? 1.0 : 0.0};
}

/* gemm_of for shape {m, n, k, batch} with f16 (else bf16) operands, alpha 0.75 */
static ptc_gemm gemm16_of(int mode, const int64_t shape[4], bool f16)
{
    ptc_gemm g = gemm_of(mode, shape[0], shape[1], shape[2], shape[3], false);
    g.ab = (uint8_t)(f16 ? PTC_F16 : PTC_BF16);
    g.alpha = 0.75;
    return g;
}

/* A plan's gemm instruction with bf16 and f16 operands (--precision) against the reference's: both
 * transposes, beta, a batch of strided matrices and one split across the pool; with oneDNN's bf16
 * GEMM where the library has it (f32 accumulation: DOT), else the operands widened to f32 (the
 * sanitizer build, which runs OpenBLAS). */
Test(cpu_gemm, bf16_operands)
{
    int64_t shapes[][4] = {{37, 45, 29, 1}, {5, 7, 3, 6}, {130, 70, 96, 1}, {1, 1, 1, 1}};
    for (int f16 = 0; f16 < 2; f16++) /* (f16 operands: always widened) */
    for (int sh = 0; sh < 4; sh++)
        for (int mode = 0; mode < 4; mode++) {
            int64_t m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2], nb = shapes[sh][3];
            ptc_gemm g = gemm_of(mode, m, n, k, nb, false);
            g.ab = f16 ? PTC_F16 : PTC_BF16;
            uint16_t *a = halves(nb * m * k, 21 + sh, f16), *b = halves(nb * k * n, 31 + sh, f16);
            float *c = rnd(nb * m * n, 41, -1, 1), *want = malloc(sizeof(float) * (size_t)(nb * m * n));
            memcpy(want, c, sizeof(float) * (size_t)(nb * m * n));
            ptrt_ref_gemm(&g, a, b, want);
            ptrt_cpu_gemm_instr(&g, a, b, c);
            double e = rel_error(c, want, nb * m * n);
            cr_expect(e <= DOT, "%s gemm %lldx%lldx%lld batch %lld ta=%d tb=%d beta=%g (%s): "
                      "error %.3g", f16 ? "f16" : "bf16", (long long)m, (long long)n,
                      (long long)k, (long long)nb, g.ta, g.tb, g.beta,
                      !f16 && ptrt_cpu_has_bf16_gemm() ? "oneDNN bf16" : "widened", e);
            free(a);
            free(b);
            free(c);
            free(want);
        }
}

/* How far a 16-bit C (got) is from want, the f32 result rounded, at alpha 0.75 over sums of k
 * products of |a|, |b| <= 1: the worst distance, less the summation-order term 2 k^2 alpha 2^-24,
 * in units of the 16-bit format's ulp (floored at 1e-4 near zero); <= 1 passes. */
static double off16(const uint16_t *got, const uint16_t *want, size_t n, bool f16, int64_t k)
{
    double worst = 0, order = 2.0 * (double)k * (double)k * 0.75 * 0x1p-24;
    for (size_t i = 0; i < n; i++) {
        double w = f16 ? ptc_f16_value(want[i]) : ptc_bf16_value(want[i]);
        double v = f16 ? ptc_f16_value(got[i]) : ptc_bf16_value(got[i]);
        double ulp = fmax(fabs(w), 1e-4) * (f16 ? 0x1p-10 : 0x1p-7);
        worst = fmax(worst, fmax(fabs(v - w) - order, 0) / ulp);
    }
    return worst;
}

/* A 16-bit C is the f32 sum rounded to nearest, ties to even, not truncated: with k = 1 every
 * element of C is one product of two 16-bit values, exact in f32 whatever the kernel's order, so C
 * must be exactly its rounding (ptc_bf16_bits, ptc_f16_bits). A C made whole, and one made in
 * tiles of 16 (cpu_gemm.c's gemm_widened); sixteen_bit_results' bound cannot tell the two apart.
 * Truncation differs from rounding in about half the elements. */
Test(cpu_gemm, sixteen_bit_c_rounds_to_nearest_even)
{
    int64_t tile = ptrt_cpu_widen_tile;
    for (int tiled = 0; tiled < 2; tiled++)
        for (int f16 = 0; f16 < 2; f16++)
            for (int mode = 0; mode < 4; mode++) {
                int64_t m = 61, n = 700;
                ptc_dtype dt = f16 ? PTC_F16 : PTC_BF16;
                ptc_gemm g = gemm_of(mode, m, n, 1, 1, false);
                g.beta = 0;
                g.ab = g.cd = (uint8_t)dt;
                uint16_t *a = halves(m, 141 + mode, f16), *b = halves(n, 151 + mode, f16);
                uint16_t *c = malloc(sizeof(uint16_t) * (size_t)(m * n));
                ptrt_cpu_widen_tile = tiled ? 16 : tile;
                ptrt_cpu_gemm_instr(&g, a, b, c);
                ptrt_cpu_widen_tile = tile;
                int64_t bad = 0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        float p = f16 ? ptc_f16_value(a[i]) * ptc_f16_value(b[j])
                                      : ptc_bf16_value(a[i]) * ptc_bf16_value(b[j]);
                        bad += c[i * n + j] != (f16 ? ptc_f16_bits(p) : ptc_bf16_bits(p));
                    }
                cr_expect_eq(bad, 0,
                             "%s gemm %lldx%lldx1 ta=%d tb=%d%s: %lld of %lld elements of C are "
                             "not the products rounded to nearest even",
                             f16 ? "f16" : "bf16", (long long)m, (long long)n, g.ta, g.tb,
                             tiled ? ", tiles of 16" : "", (long long)bad, (long long)(m * n));
                free(a);
                free(b);
                free(c);
            }
}

/* 16-bit operands too large to widen whole (cpu_gemm.c's gemm_widened), here with tiles of 16 so
 * that small shapes reach each path: C in tiles with the sum whole (k <= 32), the sum in chunks
 * of 16 added into an f32 C (beta 1 applied once), f32 sums of a tile rounded into a 16-bit C
 * once, a batch of matrices one at a time, part tiles on every side. Against the reference's
 * double sums: DOT for f32 C; for a 16-bit C, one 16-bit ulp of the reference rounded, plus the
 * summation-order term of sixteen_bit_results. Nothing past C is written. */
Test(cpu_gemm, sixteen_bit_tiles)
{
    int64_t shapes[][4] = {{37, 53, 71, 1}, {50, 33, 20, 1}, {19, 40, 45, 3}, {1, 70, 100, 1}};
    int64_t tile = ptrt_cpu_widen_tile;
    ptrt_cpu_widen_tile = 16;
    for (int f16 = 0; f16 < 2; f16++)
        for (int sh = 0; sh < 4; sh++)
            for (int mode = 0; mode < 4; mode++)
                for (int c16 = 0; c16 < 2; c16++) {
                    ptc_gemm g = gemm16_of(mode, shapes[sh], f16);
                    int64_t m = g.m, n = g.n, k = g.k, nb = g.batch;
                    ptc_dtype dt = (ptc_dtype)g.ab;
                    if (c16)
                        g.beta = 0;
                    uint16_t *a = halves(nb * m * k, 111 + sh, f16);
                    uint16_t *b = halves(nb * k * n, 121 + sh, f16);
                    size_t nc = (size_t)(nb * m * n);
                    float *want = rnd(nb * m * n, 131, -1, 1);
                    float *c = malloc(sizeof(float) * (nc + 1));
                    memcpy(c, want, sizeof(float) * nc);
                    ptrt_ref_gemm(&g, a, b, want);
                    double worst = 0;
                    bool past;
                    if (!c16) {
                        c[nc] = 42.0f;
                        ptrt_cpu_gemm_instr(&g, a, b, c);
                        worst = rel_error(c, want, nb * m * n) / DOT;
                        past = c[nc] != 42.0f;
                    } else {
                        uint16_t *got = (uint16_t *)c, *w16 = malloc(2 * nc);
                        ptc_type tc = {.dtype = PTC_F32, .rank = 1, .dims = {(int64_t)nc}};
                        ptrt_cpu_cast(&tc, want, dt, w16);
                        got[nc] = 0x5a5a;
                        g.cd = (uint8_t)dt;
                        ptrt_cpu_gemm_instr(&g, a, b, got);
                        worst = off16(got, w16, nc, f16, k);
                        past = got[nc] != 0x5a5a;
                        free(w16);
                    }
                    cr_expect(worst <= 1.0 && !past,
                              "%s gemm %lldx%lldx%lld batch %lld ta=%d tb=%d beta=%g into %s, "
                              "tiles of 16: %.2f of the bound%s",
                              f16 ? "f16" : "bf16", (long long)m, (long long)n, (long long)k,
                              (long long)nb, g.ta, g.tb, g.beta, c16 ? "16 bits" : "f32", worst,
                              past ? "; wrote past C" : "");
                    free(a);
                    free(b);
                    free(c);
                    free(want);
                }
    ptrt_cpu_widen_tile = tile;
}

/* A gemm instruction with a 16-bit C (c=bf16 / c=f16) against the same GEMM into f32 rounded
 * by the cast kernel afterwards (what the plan did before): within one unit in the last place of
 * the 16-bit format, plus what adding the f32 sums in another order may change (C is made a chunk
 * of rows at a time, and the BLAS picks its kernel by shape): 2 k 2^-24 alpha sum|a||b|, with
 * |a|, |b| <= 1, so sum|a||b| <= k. Near zero that term is several of f16's subnormal steps;
 * AVX2 kernels (AMD EPYC) met 2 steps where AVX-512 ones had met 1. The shapes reach each path:
 * C split by rows across the pool in chunks of a scratch (3001 columns: 87 rows a chunk, 200
 * rows: a part chunk), split by columns (a chunk's rows are not whole rows of C), a batch of
 * matrices one per piece, and 1 x 1 x 1. */
Test(cpu_gemm, sixteen_bit_results)
{
    int64_t shapes[][4] = {{200, 3001, 19, 1}, {23, 509, 40, 1}, {7, 5, 3, 6}, {1, 1, 1, 1}};
    for (int f16 = 0; f16 < 2; f16++)
        for (int sh = 0; sh < 4; sh++)
            for (int mode = 0; mode < 4; mode++) {
                ptc_gemm g = gemm16_of(mode, shapes[sh], f16);
                int64_t m = g.m, n = g.n, k = g.k, nb = g.batch;
                ptc_dtype dt = (ptc_dtype)g.ab;
                g.beta = 0;
                uint16_t *a = halves(nb * m * k, 51 + sh, f16);
                uint16_t *b = halves(nb * k * n, 61 + sh, f16);
                size_t nc = (size_t)(nb * m * n);
                float *c32 = malloc(sizeof(float) * nc);
                uint16_t *want = malloc(2 * nc), *got = malloc(2 * (nc + 1));
                ptrt_cpu_gemm_instr(&g, a, b, c32);
                ptc_type tc = {.dtype = PTC_F32, .rank = 1, .dims = {(int64_t)nc}};
                ptrt_cpu_cast(&tc, c32, dt, want);
                got[nc] = 0x5a5a; /* past C: untouched */
                g.cd = (uint8_t)dt;
                ptrt_cpu_gemm_instr(&g, a, b, got);
                double worst = off16(got, want, nc, f16, k);
                cr_expect(worst <= 1.0 && got[nc] == 0x5a5a,
                          "%s gemm %lldx%lldx%lld batch %lld ta=%d tb=%d: %.2f ulp from the f32 "
                          "result rounded%s",
                          f16 ? "f16" : "bf16", (long long)m, (long long)n, (long long)k,
                          (long long)nb, g.ta, g.tb, worst,
                          got[nc] == 0x5a5a ? "" : "; wrote past C");
                free(a);
                free(b);
                free(c32);
                free(want);
                free(got);
            }
}

/* f32 gemm instructions at each float32 matmul precision (--matmul-precision): the split into
 * bf16 GEMMs (cpu_gemm_split.c) forced on whatever this CPU has, against the reference's double
 * sums: highest within DOT, high (two-part splits, three products) within 2^-15 of the largest
 * element, medium (one bf16 product) within 2^-6; both transposes, beta 1, a batch of strided
 * matrices and one with a shared A, 1 x 1 x 1. A wrong pairing of the parts (A2 B2 for A1 B2,
 * or a part twice) is off by the size of a whole product. */
Test(cpu_gemm, matmul_precision_splits)
{
    int64_t shapes[][5] = {{37, 45, 29, 1, 0},
                           {5, 7, 3, 6, 0},
                           {9, 11, 13, 4, 1},
                           {130, 70, 96, 1, 0},
                           {1, 1, 1, 1, 0}};
    static const ptrt_matmul_precision ps[3] = {PTRT_MATMUL_HIGHEST, PTRT_MATMUL_HIGH,
                                                PTRT_MATMUL_MEDIUM};
    static const double tol[3] = {DOT, 0x1p-15, 0x1p-6};
    ptrt_cpu_matmul_precision_force(true);
    for (int q = 0; q < 3; q++)
        for (int sh = 0; sh < 5; sh++)
            for (int mode = 0; mode < 4; mode++) {
                int64_t m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2];
                int64_t nb = shapes[sh][3];
                bool shared_a = shapes[sh][4];
                ptc_gemm g = gemm_of(mode, m, n, k, nb, shared_a);
                float *a = rnd((g.sa ? nb : 1) * m * k, 71 + sh, -1, 1);
                float *b = rnd(nb * k * n, 81 + sh, -1, 1);
                float *c = rnd(nb * m * n, 91, -1, 1),
                      *want = malloc(sizeof(float) * (size_t)(nb * m * n));
                memcpy(want, c, sizeof(float) * (size_t)(nb * m * n));
                ptrt_ref_gemm(&g, a, b, want);
                ptrt_set_matmul_precision(ps[q]);
                ptrt_cpu_gemm_instr(&g, a, b, c);
                ptrt_set_matmul_precision(PTRT_MATMUL_HIGHEST);
                double e = rel_error(c, want, nb * m * n);
                cr_expect(e <= tol[q],
                          "%s: gemm %lldx%lldx%lld batch %lld%s ta=%d tb=%d beta=%g: error %.3g "
                          "(at most %.3g)",
                          ptrt_matmul_precision_name(ps[q]), (long long)m, (long long)n,
                          (long long)k, (long long)nb, shared_a ? " (one A)" : "", g.ta, g.tb,
                          g.beta, e, tol[q]);
                free(a);
                free(b);
                free(c);
                free(want);
            }
    ptrt_cpu_matmul_precision_force(false);
}

/* ---- normalisation, softmax, losses, embedding ---- */

Test(cpu_norm, layernorm_and_rmsnorm)
{
    int64_t rows = 3 * 37, d = 131;
    ptc_type tx = TY(PTC_F32, 3, 37, 131), tg = TY(PTC_F32, 131);
    float *x = rnd(rows * d, 20, -2, 3), *g = rnd(d, 21, 0.5f, 1.5f), *b = rnd(d, 22, -1, 1);
    float *dy = rnd(rows * d, 23, -1, 1);
    ptc_attrs ln = DEF(LAYERNORM), lng = DEF(LAYERNORM_GRAD);
    check("layernorm", PTC_OP_LAYERNORM, ln, 3, (ptc_type[]){tx, tg, tg}, (void *[]){x, g, b}, DOT);
    check("layernorm_grad", PTC_OP_LAYERNORM_GRAD, lng, 3, (ptc_type[]){tx, tg, tx},
          (void *[]){x, g, dy}, DOT);
    ptc_attrs rms = DEF(RMSNORM), rmsg = DEF(RMSNORM_GRAD);
    check("rmsnorm", PTC_OP_RMSNORM, rms, 2, (ptc_type[]){tx, tg}, (void *[]){x, g}, DOT);
    check("rmsnorm_grad", PTC_OP_RMSNORM_GRAD, rmsg, 3, (ptc_type[]){tx, tg, tx},
          (void *[]){x, g, dy}, DOT);
    /* a constant row: variance 0, eps alone */
    for (int64_t i = 0; i < d; i++)
        x[i] = 1.25f;
    check("layernorm constant row", PTC_OP_LAYERNORM, ln, 3, (ptc_type[]){tx, tg, tg},
          (void *[]){x, g, b}, DOT);
    free(x);
    free(g);
    free(b);
    free(dy);
}

Test(cpu_norm, softmax_last_axis_and_fallback)
{
    float *x = rnd(13 * 301, 24, -20, 20);
    ptc_type t = TY(PTC_F32, 13, 301);
    ptc_attrs at = DEF(SOFTMAX);
    check("softmax", PTC_OP_SOFTMAX, at, 1, &t, (void *[]){x}, TRANSC);
    check("log_softmax", PTC_OP_LOG_SOFTMAX, DEF(LOG_SOFTMAX), 1, &t, (void *[]){x}, TRANSC);
    at.axis = 0;
    check("softmax axis 0 (reference)", PTC_OP_SOFTMAX, at, 1, &t, (void *[]){x}, EXACT);
    free(x);
}

Test(cpu_norm, cross_entropy)
{
    int64_t rows = 3 * 37, c = 301;
    ptc_type tl = TY(PTC_F32, 3, 37, 301), tt = TY(PTC_I32, 3, 37), s = SCALAR(PTC_F32);
    float *l = rnd(rows * c, 25, -8, 8), dl = 0.7f;
    int32_t *t = ids(rows, 26, (int32_t)c);
    check("cross_entropy", PTC_OP_CROSS_ENTROPY, DEF(CROSS_ENTROPY), 2, (ptc_type[]){tl, tt},
          (void *[]){l, t}, TRANSC);
    check("cross_entropy_grad", PTC_OP_CROSS_ENTROPY_GRAD, DEF(CROSS_ENTROPY_GRAD), 3,
          (ptc_type[]){tl, tt, s}, (void *[]){l, t, &dl}, TRANSC);
    t[40] = (int32_t)c; /* out of range: the reference's message */
    check("cross_entropy bad target", PTC_OP_CROSS_ENTROPY, DEF(CROSS_ENTROPY), 2,
          (ptc_type[]){tl, tt}, (void *[]){l, t}, EXACT);
    t[40] = -1;
    check("cross_entropy_grad bad target", PTC_OP_CROSS_ENTROPY_GRAD, DEF(CROSS_ENTROPY_GRAD), 3,
          (ptc_type[]){tl, tt, s}, (void *[]){l, t, &dl}, EXACT);
    free(l);
    free(t);
}

Test(cpu_norm, embedding_and_grad)
{
    int64_t rows = 53, d = 133, n = 4 * 67;
    ptc_type tt = TY(PTC_F32, 53, 133), ti = TY(PTC_I32, 4, 67), tdy = TY(PTC_F32, 4, 67, 133);
    float *table = rnd(rows * d, 27, -1, 1), *dy = rnd(n * d, 28, -1, 1);
    int32_t *id = ids(n, 29, 11); /* few distinct ids: many repeats add up */
    id[5] = 52;
    check("embedding", PTC_OP_EMBEDDING, DEF(EMBEDDING), 2, (ptc_type[]){tt, ti},
          (void *[]){table, id}, EXACT);
    ptc_attrs at = DEF(EMBEDDING_GRAD);
    at.n = rows;
    check("embedding_grad", PTC_OP_EMBEDDING_GRAD, at, 2, (ptc_type[]){ti, tdy}, (void *[]){id, dy},
          TRANSC);
    id[7] = (int32_t)rows;
    check("embedding bad id", PTC_OP_EMBEDDING, DEF(EMBEDDING), 2, (ptc_type[]){tt, ti},
          (void *[]){table, id}, EXACT);
    check("embedding_grad bad id", PTC_OP_EMBEDDING_GRAD, at, 2, (ptc_type[]){ti, tdy},
          (void *[]){id, dy}, EXACT);
    free(table);
    free(dy);
    free(id);
}

/* ---- attention and rope ---- */

static void attention_case(const char *what, int64_t nb, int64_t s, int64_t s2, int64_t heads,
                           int64_t kv, int64_t dh, bool causal)
{
    ptc_type tq = TY(PTC_F32, nb, s, heads * dh), tk = TY(PTC_F32, nb, s2, kv * dh);
    float *q = rnd(nb * s * heads * dh, 30, -1, 1), *k = rnd(nb * s2 * kv * dh, 31, -1, 1);
    float *v = rnd(nb * s2 * kv * dh, 32, -1, 1), *dy = rnd(nb * s * heads * dh, 33, -1, 1);
    ptc_attrs at = DEF(ATTENTION);
    at.heads = heads;
    at.kv_heads = kv;
    at.causal = causal;
    char name[200];
    snprintf(name, sizeof name, "attention %s", what);
    check(name, PTC_OP_ATTENTION, at, 3, (ptc_type[]){tq, tk, tk}, (void *[]){q, k, v}, DOT);
    ptc_attrs ag = DEF(ATTENTION_GRAD);
    ag.heads = heads;
    ag.kv_heads = kv;
    ag.causal = causal;
    snprintf(name, sizeof name, "attention_grad %s", what);
    check(name, PTC_OP_ATTENTION_GRAD, ag, 4, (ptc_type[]){tq, tk, tk, tq}, (void *[]){q, k, v, dy},
          DOT);
    free(q);
    free(k);
    free(v);
    free(dy);
}

Test(cpu_attention, causal_and_not)
{
    attention_case("causal, seq 70 (blocks of 64 and 6)", 2, 70, 70, 3, 3, 5, true);
    attention_case("not causal", 2, 70, 70, 3, 3, 5, false);
    attention_case("one row", 1, 1, 1, 1, 1, 4, true);
    attention_case("causal, 130 rows, dh 64", 1, 130, 130, 2, 2, 64, true);
    /* key counts of an even number of vectors, whose packed rows are padded by one (ld) */
    attention_case("causal, 128 rows, dh 64", 2, 128, 128, 2, 2, 64, true);
    attention_case("not causal, 29 rows on 64 keys", 1, 29, 64, 3, 1, 24, false);
}

/* Head widths that fill the block products' vectors in every way (16 floats to a vector with
 * AVX-512, 8 with AVX2, 4 in the baseline copy): 16, 48, 80, 20 (vectors and a scalar tail), 6;
 * query counts off the 6-row tiles; on every copy of the kernel this CPU can run. */
Test(cpu_attention, head_widths_on_every_kernel_copy)
{
    const char *isa[] = {"base", "avx2", "avx512"};
    int ran = 0;
    for (int c = 0; c < 3; c++) {
        if (!ptrt_cpu_attention_isa(isa[c]))
            continue;
        ran++;
        char what[5][64];
        snprintf(what[0], sizeof what[0], "%s: dh 16, 9 rows", isa[c]);
        snprintf(what[1], sizeof what[1], "%s: dh 48, GQA, 67 rows", isa[c]);
        snprintf(what[2], sizeof what[2], "%s: dh 80, not causal, keys longer", isa[c]);
        snprintf(what[3], sizeof what[3], "%s: dh 20, causal, keys shorter", isa[c]);
        snprintf(what[4], sizeof what[4], "%s: dh 6, causal, 70 rows", isa[c]);
        attention_case(what[0], 2, 9, 9, 2, 2, 16, true);
        attention_case(what[1], 1, 67, 67, 4, 2, 48, true);
        attention_case(what[2], 1, 37, 101, 2, 1, 80, false);
        attention_case(what[3], 2, 71, 33, 2, 2, 20, true);
        attention_case(what[4], 2, 70, 70, 3, 3, 6, true);
    }
    ptrt_cpu_attention_isa(NULL);
    cr_expect(ran >= 1, "the baseline copy always runs");
}

Test(cpu_attention, grouped_query_and_other_key_length)
{
    attention_case("GQA 6 heads on 2", 2, 67, 67, 6, 2, 7, true);
    attention_case("GQA 4 heads on 1", 3, 19, 19, 4, 1, 8, false);
    attention_case("keys longer than queries", 2, 21, 83, 4, 2, 6, false);
    attention_case("causal, keys longer than queries", 2, 21, 83, 4, 2, 6, true);
    attention_case("causal, keys shorter than queries", 2, 83, 21, 2, 1, 6, true);
}

Test(cpu_attention, rope_is_the_reference_arithmetic)
{
    ptc_type t = TY(PTC_F32, 3, 37, 4 * 10);
    float *x = rnd(3 * 37 * 40, 34, -2, 2);
    ptc_attrs at = DEF(ROPE);
    at.heads = 4;
    check("rope", PTC_OP_ROPE, at, 1, &t, (void *[]){x}, EXACT);
    ptc_attrs ag = DEF(ROPE_GRAD);
    ag.heads = 4;
    check("rope_grad", PTC_OP_ROPE_GRAD, ag, 1, &t, (void *[]){x}, EXACT);
    free(x);
}

/* ---- mixture of experts ---- */

/* moe_route's result for T tokens: each token's K choices distinct experts below E - 1 (expert
 * E - 1 gets no rows), about one choice in 8 dropped (-1) */
static int32_t *moe_route(int64_t T, int64_t K, int64_t E, uint32_t seed)
{
    int32_t *r = ids(T * (K + 1), seed, 1 << 20);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < K; j++)
            r[t * K + j] = r[T * K + t] % 8 == j + 1 ? -1 : (int32_t)((r[t] + j) % (E - 1));
    return r;
}

/* with lanes forced (ptrt_cpu_moe_lanes 1), the same bits at 2 threads as at 3: every expert runs
 * on one thread, whichever lane takes it */
static void same_bits_on_lanes(const char *what, ptc_op op, ptc_attrs at, int nin,
                               const ptc_type *it, void *const *in)
{
    if (ptrt_cpu_moe_lanes != 1)
        return;
    ptrt_cpu_set_threads(2);
    both two = run_both(op, at, nin, it, in);
    ptrt_cpu_set_threads(3);
    both three = run_both(op, at, nin, it, in);
    expect_same_bits(&three, &two, what, 3);
    free_both(&two);
    free_both(&three);
    ptrt_cpu_set_threads(0);
}

static void moe_case(ptc_act act, int64_t K, int64_t scratch)
{
    const char *names[] = {"gelu", "relu", "silu", "swiglu"};
    int64_t B = 4, S = 16, d = 13, f = 9, E = 5, F = act == PTC_ACT_SWIGLU ? 2 * f : f;
    ptc_type it[6] = {{.dtype = PTC_F32, .rank = 3, .dims = {B, S, d}},
                      {.dtype = PTC_I32, .rank = 3, .dims = {B, S, K}},
                      {.dtype = PTC_F32, .rank = 3, .dims = {B, S, K}},
                      {.dtype = PTC_F32, .rank = 3, .dims = {E, d, F}},
                      {.dtype = PTC_F32, .rank = 3, .dims = {E, f, d}},
                      {.dtype = PTC_F32, .rank = 3, .dims = {B, S, d}}};
    float *x = rnd(B * S * d, 1, -1, 1), *gate = rnd(B * S * K, 2, 0, 1),
          *up = rnd(E * d * F, 3, -0.5f, 0.5f), *down = rnd(E * f * d, 4, -0.5f, 0.5f),
          *dy = rnd(B * S * d, 5, -1, 1);
    int32_t *route = moe_route(B * S, K, E, (uint32_t)(K * 10 + act));
    ptc_attrs at = DEF(MOE_FFN), ag = DEF(MOE_FFN_GRAD);
    at.act = ag.act = act;
    at.n = ag.n = E;
    char what[96];
    ptrt_cpu_moe_scratch = scratch;
    snprintf(what, sizeof what, "moe_ffn %s top %lld, scratch %lld", names[act], (long long)K,
             (long long)scratch);
    check_threads(what, PTC_OP_MOE_FFN, at, 5, it, (void *[]){x, route, gate, up, down}, DOT,
                  true);
    same_bits_on_lanes(what, PTC_OP_MOE_FFN, at, 5, it, (void *[]){x, route, gate, up, down});
    snprintf(what, sizeof what, "moe_ffn_grad %s top %lld, scratch %lld", names[act],
             (long long)K, (long long)scratch);
    check_threads(what, PTC_OP_MOE_FFN_GRAD, ag, 6, it,
                  (void *[]){x, route, gate, up, down, dy}, DOT, true);
    same_bits_on_lanes(what, PTC_OP_MOE_FFN_GRAD, ag, 6, it,
                       (void *[]){x, route, gate, up, down, dy});
    ptrt_cpu_moe_scratch = (int64_t)1 << 22;
    free(x), free(gate), free(up), free(down), free(dy), free(route);
}

/* split (one expert at a time, its GEMMs across the threads) and lanes (experts side by side) */
Test(cpu_moe, experts_of_every_activation)
{
    for (int lanes = 0; lanes <= 1; lanes++) {
        ptrt_cpu_moe_lanes = lanes;
        for (int act = 0; act < PTC_NACTS; act++) {
            moe_case((ptc_act)act, 2, (int64_t)1 << 22);
            moe_case((ptc_act)act, 3, 1); /* blocks of 16 rows: each expert takes several */
        }
    }
    ptrt_cpu_moe_lanes = -1;
}

/* moe_ep_ffn on the rows member q sends to this rank (coord 1 of 2: experts 3, 4, 5 of 6), more
 * rows planned than received; and rows past the plan, which the reference names. */
Test(cpu_moe, expert_parallel_rows)
{
    int64_t d = 11, f = 7, el = 3, m = 50;
    int32_t counts[12] = {9, 9, 9, 5, 0, 20, 9, 9, 9, 17, 3, 0}; /* 45 rows */
    for (int c = 0; c < 2 * PTC_NACTS; c++) {
        int act = c % PTC_NACTS;
        ptrt_cpu_moe_lanes = c / PTC_NACTS; /* split, then lanes */
        int64_t F = act == PTC_ACT_SWIGLU ? 2 * f : f;
        ptc_type it[5] = {{.dtype = PTC_F32, .rank = 2, .dims = {m, d}},
                          {.dtype = PTC_I32, .rank = 1, .dims = {12}},
                          {.dtype = PTC_F32, .rank = 3, .dims = {el, d, F}},
                          {.dtype = PTC_F32, .rank = 3, .dims = {el, f, d}},
                          {.dtype = PTC_F32, .rank = 2, .dims = {m, d}}};
        float *rows = rnd(m * d, 6, -1, 1), *up = rnd(el * d * F, 7, -0.5f, 0.5f),
              *down = rnd(el * f * d, 8, -0.5f, 0.5f), *dy = rnd(m * d, 9, -1, 1);
        ptc_attrs at = DEF(MOE_EP_FFN), ag = DEF(MOE_EP_FFN_GRAD);
        at.act = ag.act = (ptc_act)act;
        at.n = ag.n = 6;
        at.group = ag.group = 2;
        run_coord = 1;
        ptrt_cpu_moe_scratch = act % 2 ? 1 : (int64_t)1 << 22;
        check_threads("moe_ep_ffn", PTC_OP_MOE_EP_FFN, at, 4, it,
                      (void *[]){rows, counts, up, down}, DOT, true);
        check_threads("moe_ep_ffn_grad", PTC_OP_MOE_EP_FFN_GRAD, ag, 5, it,
                      (void *[]){rows, counts, up, down, dy}, DOT, true);
        same_bits_on_lanes("moe_ep_ffn_grad", PTC_OP_MOE_EP_FFN_GRAD, ag, 5, it,
                           (void *[]){rows, counts, up, down, dy});
        int32_t over[12] = {0, 0, 0, 40, 0, 0, 0, 0, 0, 0, 11, 0}; /* 51 rows of 50 */
        both r = run_both(PTC_OP_MOE_EP_FFN, at, 4, it, (void *[]){rows, over, up, down});
        cr_expect(r.rc_ref != 0 && strstr(r.err_ref, "exceed") != NULL, "%s", r.err_ref);
        expect_close(&r, "moe_ep_ffn, rows past the plan", DOT);
        free_both(&r);
        run_coord = 0;
        ptrt_cpu_moe_scratch = (int64_t)1 << 22;
        free(rows), free(up), free(down), free(dy);
    }
    ptrt_cpu_moe_lanes = -1;
}

/* ---- the thread pool ---- */

typedef struct sum_ctx {
    int64_t *hits;
} sum_ctx;

static void mark(void *ctx, int64_t begin, int64_t end)
{
    sum_ctx *c = ctx;
    for (int64_t i = begin; i < end; i++)
        c->hits[i]++;
}

Test(cpu_pool, every_index_once)
{
    int64_t n = 10007;
    int64_t *hits = calloc((size_t)n, sizeof *hits);
    sum_ctx c = {hits};
    for (int threads = 1; threads <= 4; threads++) {
        ptrt_cpu_set_threads(threads);
        for (int64_t grain = 1; grain < 20000; grain = grain * 7 + 1)
            for (int rep = 0; rep < 20; rep++)
                ptrt_cpu_parallel_for(n, grain, mark, &c);
    }
    int64_t grains = 0;
    for (int64_t grain = 1; grain < 20000; grain = grain * 7 + 1)
        grains++;
    int64_t want = 4 * 20 * grains; /* threads x grains x repetitions */
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(hits[i], want, "index %lld ran %lld times, want %lld", (long long)i,
                     (long long)hits[i], (long long)want);
    free(hits);
    ptrt_cpu_set_threads(0);
}

/* ---- results written over an operand ----
 * The plan's lowering lets elementwise ops, activation gradients and optimizer updates write
 * their result over an operand whose bytes nothing reads afterwards (plan/lower.c). Every such
 * kernel, on both backends, must give the same bits in place as into a fresh buffer. */

typedef struct inplace_case {
    const char *what;
    ptc_op op;
    int nin;
    ptc_type it[6];
    int over[3]; /* for result j: the operand it overwrites */
} inplace_case;

static void check_in_place(const inplace_case *c, ptrt_kernel_fn fn, const char *backend)
{
    ptc_attrs at = ptc_attrs_default(c->op);
    at.wd = 0.1;        /* optimizer updates: every term of the update */
    at.momentum = 0.9;
    ptc_type ot[PTC_MAX_RESULTS];
    char err[512];
    int nout = ptc_infer(c->op, c->it, c->nin, &at, ot, err, sizeof err);
    cr_assert(nout > 0, "%s: %s", c->what, err);
    float *in[6], *fresh[3], *copy[6];
    for (int k = 0; k < c->nin; k++) {
        int64_t n = ptc_type_numel(&c->it[k]);
        in[k] = alloc_poison((size_t)n * 4);
        rt_fill(in[k], n, 100u + (uint32_t)k, k == 3 ? 0.1f : -2.0f, 2.0f); /* v > 0 for adamw */
        if (c->op == PTC_OP_ADAMW_UPDATE && k >= 4)
            in[k][0] = k == 4 ? 0.01f : 3.0f; /* lr, step */
        if (c->op == PTC_OP_SGD_UPDATE && k == 3)
            in[k][0] = 0.05f;
        copy[k] = alloc_poison((size_t)n * 4);
        memcpy(copy[k], in[k], (size_t)n * 4);
    }
    for (int j = 0; j < nout; j++)
        fresh[j] = alloc_poison((size_t)ptc_type_numel(&ot[j]) * 4);
    ptrt_kcall k = {.op = c->op, .nin = c->nin, .nout = nout, .attrs = at};
    cr_assert_eq(fn(&k, c->it, (void *const *)in, ot, (void *const *)fresh, err, sizeof err), 0,
                 "%s: %s", c->what, err);
    void *over[3];
    for (int j = 0; j < nout; j++)
        over[j] = copy[c->over[j]];
    cr_assert_eq(fn(&k, c->it, (void *const *)copy, ot, over, err, sizeof err), 0, "%s: %s",
                 c->what, err);
    for (int j = 0; j < nout; j++)
        cr_expect(memcmp(over[j], fresh[j], (size_t)ptc_type_numel(&ot[j]) * 4) == 0,
                  "%s on %s: result %d in place differs", c->what, backend, j);
    for (int k2 = 0; k2 < c->nin; k2++) {
        free(in[k2]);
        free(copy[k2]);
    }
    for (int j = 0; j < nout; j++)
        free(fresh[j]);
}

Test(cpu_in_place, every_kernel_the_plan_runs_in_place)
{
    ptc_type x = TY(PTC_F32, 7, 131), row = TY(PTC_F32, 131), s = SCALAR(PTC_F32);
    static const ptc_op unary[] = {PTC_OP_NEG,     PTC_OP_EXP,  PTC_OP_LOG,  PTC_OP_SQRT,
                                   PTC_OP_RSQRT,   PTC_OP_TANH, PTC_OP_SIGMOID, PTC_OP_RELU,
                                   PTC_OP_GELU,    PTC_OP_SILU};
    static const ptc_op binary[] = {PTC_OP_ADD, PTC_OP_SUB, PTC_OP_MUL, PTC_OP_DIV};
    static const ptc_op grads[] = {PTC_OP_RELU_GRAD, PTC_OP_GELU_GRAD, PTC_OP_SILU_GRAD};
    inplace_case cases[64];
    int n = 0;
    for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++)
        cases[n++] = (inplace_case){ptc_ops[unary[i]].name, unary[i], 1, {x}, {0}};
    for (size_t i = 0; i < sizeof binary / sizeof binary[0]; i++) {
        cases[n++] = (inplace_case){ptc_ops[binary[i]].name, binary[i], 2, {x, x}, {0}};
        cases[n++] = (inplace_case){ptc_ops[binary[i]].name, binary[i], 2, {x, x}, {1}};
        cases[n++] = (inplace_case){ptc_ops[binary[i]].name, binary[i], 2, {x, row}, {0}};
        cases[n++] = (inplace_case){ptc_ops[binary[i]].name, binary[i], 2, {row, x}, {1}};
        cases[n++] = (inplace_case){ptc_ops[binary[i]].name, binary[i], 2, {x, s}, {0}};
    }
    for (size_t i = 0; i < sizeof grads / sizeof grads[0]; i++) {
        cases[n++] = (inplace_case){ptc_ops[grads[i]].name, grads[i], 2, {x, x}, {0}};
        cases[n++] = (inplace_case){ptc_ops[grads[i]].name, grads[i], 2, {x, x}, {1}};
    }
    cases[n++] = (inplace_case){"adamw_update", PTC_OP_ADAMW_UPDATE, 6, {x, x, x, x, s, s},
                                {0, 2, 3}};
    cases[n++] = (inplace_case){"sgd_update", PTC_OP_SGD_UPDATE, 4, {x, x, x, s}, {0, 2}};
    for (int i = 0; i < n; i++) {
        check_in_place(&cases[i], ptrt_ref_run, "ref");
        check_in_place(&cases[i], ptrt_cpu_run, "cpu");
    }
}

/* Casts between f32, bf16 and f16 storage: bit-identical to the reference's rounding
 * (common/half.c) on every kind of value: random bit patterns (normals, subnormals, infinities,
 * NaNs of either sign), the ties and the edges of each format (65504, 65520, 2^-14, 2^-24). A NaN
 * read from f16 is only required to stay a NaN (the reference makes it the canonical one). */
Test(cpu_elementwise, casts_round_like_the_reference)
{
    enum { N = 40000 };
    uint32_t *w = malloc(sizeof(uint32_t) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        w[i] = s ^ (s >> 7);
        h[i] = (uint16_t)(s >> 9);
    }
    static const float edges[] = {65504.0f, 65519.99f, 65520.0f, 65536.0f, 0x1p-14f, 0x1.ffcp-15f,
                                  0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1.002p0f, 0x1.006p0f,
                                  0x1.01p0f, 0x1.03p0f, 3.3895314e38f, 3.4e38f, 0x1p-133f, 0.0f,
                                  -0.0f, 1.0f / 0.0f};
    for (int i = 0; i < (int)(sizeof edges / sizeof edges[0]); i++) {
        memcpy(&w[i], &edges[i], 4);
        float neg = -edges[i];
        memcpy(&w[100 + i], &neg, 4);
    }
    for (int i = 0; i < N; i++)
        if ((h[i] & 0x7c00) == 0x7c00 && (h[i] & 0x3ff)) /* no f16 NaN: see above */
            h[i] &= 0xfc00;
    ptc_dtype f[] = {PTC_F32, PTC_BF16, PTC_F16};
    for (int portable = 0; portable < 2; portable++) /* the AVX2 path and the portable one */
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            if (a == b)
                continue;
            ptrt_cpu_vec_force_portable(portable);
            ptc_attrs at = DEF(CAST);
            at.dtype = f[b];
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", ptc_dtype_name(f[a]),
                     ptc_dtype_name(f[b]));
            ptc_type t = TY(f[a], N);
            check(what, PTC_OP_CAST, at, 1, &t, (void *[]){f[a] == PTC_F32 ? (void *)w : h},
                  EXACT);
        }
    ptrt_cpu_vec_force_portable(false);
    free(w);
    free(h);
}

/* ---- ops over 16-bit storage (ptc_op_storage16) ---- */

/* op over operands x (values of it32's shapes) in 16-bit storage of dtype t, on backend run (the
 * reference or the cpu backend), gives the bits of the casts it stands for: every operand widened,
 * the op on f32, each result rounded as the cast kernel rounds (sumsq's sum stays f32). */
static void storage16_case(const char *what, ptrt_kernel_fn run, ptc_dtype t, ptc_op op,
                           ptc_attrs at, int nin, const ptc_type *it32, float *const *x)
{
    ptc_type it16[8], ot32[PTC_MAX_RESULTS], ot16[PTC_MAX_RESULTS];
    void *in16[8], *in32[8], *o16[PTC_MAX_RESULTS], *o32[PTC_MAX_RESULTS];
    cr_assert(nin <= 8);
    for (int k = 0; k < nin; k++) {
        int64_t n = ptc_type_numel(&it32[k]);
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
        float *w = malloc(sizeof(float) * (size_t)(n ? n : 1));
        cr_assert(h && w);
        for (int64_t i = 0; i < n; i++) {
            h[i] = t == PTC_BF16 ? ptc_bf16_bits(x[k][i]) : ptc_f16_bits(x[k][i]);
            w[i] = t == PTC_BF16 ? ptc_bf16_value(h[i]) : ptc_f16_value(h[i]);
        }
        it16[k] = it32[k];
        it16[k].dtype = t;
        in16[k] = h;
        in32[k] = w;
    }
    char err[512] = "";
    ptc_attrs a = at;
    int nout = ptc_infer(op, it32, nin, &a, ot32, err, sizeof err);
    cr_assert(nout > 0, "%s: %s", what, err);
    for (int j = 0; j < nout; j++) {
        ot16[j] = ot32[j];
        ot16[j].dtype = op == PTC_OP_SUMSQ ? PTC_F32 : t;
        o16[j] = alloc_poison((size_t)ptc_type_numel(&ot32[j]) * 4);
        o32[j] = alloc_poison((size_t)ptc_type_numel(&ot32[j]) * 4);
    }
    ptrt_kcall node = {.op = op, .nin = nin, .nout = nout, .attrs = at};
    cr_assert_eq(run(&node, it16, in16, ot16, o16, err, sizeof err), 0, "%s: %s", what, err);
    cr_assert_eq(run(&node, it32, in32, ot32, o32, err, sizeof err), 0, "%s: %s", what, err);
    for (int j = 0; j < nout; j++) {
        int64_t n = ptc_type_numel(&ot32[j]), bad = 0;
        for (int64_t i = 0; i < n; i++) {
            float v = ((const float *)o32[j])[i];
            if (ot16[j].dtype == PTC_F32)
                bad += memcmp(&v, (const float *)o16[j] + i, 4) != 0;
            else
                bad += ((const uint16_t *)o16[j])[i] !=
                       (t == PTC_BF16 ? ptc_bf16_bits(v) : ptc_f16_bits(v));
        }
        cr_expect_eq(bad, 0, "%s: %lld of result %d's %lld elements are not the casts' bits", what,
                     (long long)bad, j, (long long)n);
        free(o16[j]);
        free(o32[j]);
    }
    for (int k = 0; k < nin; k++) {
        free(in16[k]);
        free(in32[k]);
    }
}

/* Every op of ptc_op_storage16, bf16 and f16, on the reference and the cpu backend: concat,
 * sum_to, sumsq (over two blocks of the pool) and the norms' gradients read and write 16 bits
 * themselves; so does the cpu backend's attention, widening a few rows at a time and summing
 * dK, dV of a (batch, kv head) in f32 (cases of 3 query blocks, grouped heads, keys of another
 * length); the reference's widens whole batch elements into per-thread scratch, and the cases
 * run large then small then large again through it. */
Test(cpu_storage16, ops_over_16_bit_storage_give_their_casts_bits)
{
    float *x[4];
    for (int k = 0; k < 4; k++)
        x[k] = rnd(7 * 3000, 40 + (uint32_t)k, -1, 1);
    ptc_attrs att = DEF(ATTENTION), attg = DEF(ATTENTION_GRAD), cat = DEF(CONCAT);
    att.heads = attg.heads = 3;
    att.causal = attg.causal = true;
    ptc_attrs gqa = att, gqag = attg, cross = att, crossg = attg; /* 3 heads on 1 kv head */
    gqa.kv_heads = gqag.kv_heads = 1;
    cross.causal = crossg.causal = false;
    ptc_type tq3 = TY(PTC_F32, 2, 130, 12), tk3 = TY(PTC_F32, 2, 130, 4);
    ptc_type tk2 = TY(PTC_F32, 2, 70, 12);
    cat.axis = 2;
    ptc_attrs st = DEF(SUM_TO);
    st.nshape = 1;
    st.shape[0] = 70;
    ptc_type tq = TY(PTC_F32, 2, 9, 12), tx = TY(PTC_F32, 5, 70), tg = TY(PTC_F32, 70);
    struct {
        const char *what;
        ptc_op op;
        ptc_attrs at;
        int nin;
        ptc_type it[4];
    } cases[] = {
        {"attention", PTC_OP_ATTENTION, att, 3, {tq, tq, tq}},
        {"attention_grad", PTC_OP_ATTENTION_GRAD, attg, 4, {tq, tq, tq, tq}},
        {"attention, grouped, 3 blocks", PTC_OP_ATTENTION, gqa, 3, {tq3, tk3, tk3}},
        {"attention_grad, grouped, 3 blocks", PTC_OP_ATTENTION_GRAD, gqag, 4, {tq3, tk3, tk3, tq3}},
        {"attention, 70 keys", PTC_OP_ATTENTION, cross, 3, {tq, tk2, tk2}},
        {"attention_grad, 70 keys", PTC_OP_ATTENTION_GRAD, crossg, 4, {tq, tk2, tk2, tq}},
        {"concat", PTC_OP_CONCAT, cat, 3, {TY(PTC_F32, 3, 5, 4), TY(PTC_F32, 3, 5, 2), TY(PTC_F32, 3, 5, 4)}},
        {"sum_to", PTC_OP_SUM_TO, st, 1, {TY(PTC_F32, 4, 33, 70)}},
        {"sumsq", PTC_OP_SUMSQ, DEF(SUMSQ), 1, {TY(PTC_F32, 7, 300)}},
        {"sumsq of two blocks", PTC_OP_SUMSQ, DEF(SUMSQ), 1, {TY(PTC_F32, 7, 3000)}},
        {"layernorm_grad", PTC_OP_LAYERNORM_GRAD, DEF(LAYERNORM_GRAD), 3, {tx, tg, tx}},
        {"rmsnorm_grad", PTC_OP_RMSNORM_GRAD, DEF(RMSNORM_GRAD), 3, {tx, tg, tx}},
        {"sum_to again", PTC_OP_SUM_TO, st, 1, {TY(PTC_F32, 4, 33, 70)}},
    };
    ptrt_kernel_fn runs[2] = {ptrt_ref_run, ptrt_cpu_run};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cr_assert(ptc_op_storage16(cases[c].op), "%s", cases[c].what);
        for (int f16 = 0; f16 < 2; f16++)
            for (int r = 0; r < 2; r++) {
                char what[128];
                snprintf(what, sizeof what, "%s, %s, %s", cases[c].what, f16 ? "f16" : "bf16",
                         r ? "cpu" : "reference");
                storage16_case(what, runs[r], f16 ? PTC_F16 : PTC_BF16, cases[c].op, cases[c].at,
                               cases[c].nin, cases[c].it, x);
            }
    }
    for (int k = 0; k < 4; k++)
        free(x[k]);
}
