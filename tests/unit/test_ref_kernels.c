/* test_ref_kernels.c - the CPU reference kernels against values worked out by hand: elementwise
 * ops with broadcasting, matmul, casts and sources, reductions, normalisations and shape ops.
 * (Model ops and losses: test_ref_model.c; properties: test_ref_props.c; rounding and init:
 * test_ref_init.c.) Each expected value carries its arithmetic in a comment.
 */
#include "ref_test.h"

#define TOL 1e-6

static ptc_attrs attrs(ptc_op op)
{
    return ptc_attrs_default(op);
}

/* ---- elementwise with broadcasting ---- */

Test(ref_elementwise, add_broadcast_2x1x3_plus_4x1)
{
    /* a[i][0][k] = {{1,2,3}},{{4,5,6}}; b[j][0] = 10,20,30,40; out[i][j][k] = a[i][0][k] + b[j] */
    float a[] = {1, 2, 3, 4, 5, 6}, b[] = {10, 20, 30, 40};
    ptc_type it[] = {TY(PTC_F32, 2, 1, 3), TY(PTC_F32, 4, 1)};
    rt_result r = rt_ok(PTC_OP_ADD, attrs(PTC_OP_ADD), 2, it, (void *[]){a, b});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 4, 3));
    /* the first line is i = 0, the second i = 1 */
    EXPECT_OUT(r, 0, TOL, 11, 12, 13, 21, 22, 23, 31, 32, 33, 41, 42, 43, //
               14, 15, 16, 24, 25, 26, 34, 35, 36, 44, 45, 46);
    rt_free(&r);
}

Test(ref_elementwise, sub_mul_div_broadcast)
{
    float m[] = {1, 2, 3, 4}, s[] = {0.5f}, row[] = {1, 2, 3}, col[] = {2, 4}, c2[] = {1, 8};
    /* [2,2] - [] : 1-0.5, 2-0.5, 3-0.5, 4-0.5 */
    rt_result r = rt_ok(PTC_OP_SUB, attrs(PTC_OP_SUB), 2,
                        (ptc_type[]){TY(PTC_F32, 2, 2), SCALAR(PTC_F32)}, (void *[]){m, s});
    EXPECT_OUT(r, 0, TOL, 0.5, 1.5, 2.5, 3.5);
    rt_free(&r);
    /* [] - [2,2]: the scalar on the left, 0.5-1 ... 0.5-4 */
    r = rt_ok(PTC_OP_SUB, attrs(PTC_OP_SUB), 2, (ptc_type[]){SCALAR(PTC_F32), TY(PTC_F32, 2, 2)},
              (void *[]){s, m});
    EXPECT_OUT(r, 0, TOL, -0.5, -1.5, -2.5, -3.5);
    rt_free(&r);
    /* [3] * [2,3]: row {1,2,3} times the rows {1,1,1} and {2,2,2} */
    float m23[] = {1, 1, 1, 2, 2, 2};
    r = rt_ok(PTC_OP_MUL, attrs(PTC_OP_MUL), 2, (ptc_type[]){TY(PTC_F32, 3), TY(PTC_F32, 2, 3)},
              (void *[]){row, m23});
    EXPECT_OUT(r, 0, TOL, 1, 2, 3, 2, 4, 6);
    rt_free(&r);
    /* [2,1] / [1,2]: out[i][j] = col[i] / c2[j] = {2/1, 2/8}, {4/1, 4/8} */
    r = rt_ok(PTC_OP_DIV, attrs(PTC_OP_DIV), 2, (ptc_type[]){TY(PTC_F32, 2, 1), TY(PTC_F32, 1, 2)},
              (void *[]){col, c2});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 2));
    EXPECT_OUT(r, 0, TOL, 2, 0.25, 4, 0.5);
    rt_free(&r);
}

Test(ref_elementwise, add_rank8_broadcast)
{
    /* a f32[2,1,1,1,1,1,1,2] = {1,2},{3,4}; b f32[3,1] = 10,20,30.
     * out f32[2,1,1,1,1,1,3,2]: out[i,...,j,k] = a[i,...,0,k] + b[j,0] */
    float a[] = {1, 2, 3, 4}, b[] = {10, 20, 30};
    ptc_type it[] = {TY(PTC_F32, 2, 1, 1, 1, 1, 1, 1, 2), TY(PTC_F32, 3, 1)};
    rt_result r = rt_ok(PTC_OP_ADD, attrs(PTC_OP_ADD), 2, it, (void *[]){a, b});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 1, 1, 1, 1, 1, 3, 2));
    EXPECT_OUT(r, 0, TOL, 11, 12, 21, 22, 31, 32, 13, 14, 23, 24, 33, 34);
    rt_free(&r);
}

Test(ref_elementwise, unary_functions)
{
    /* x = {-2, -1, 0, 0.5, 1, 2, 4} */
    float x[] = {-2, -1, 0, 0.5f, 1, 2, 4};
    ptc_type it[] = {TY(PTC_F32, 7)};
    void *in[] = {x};
    rt_result r = rt_ok(PTC_OP_NEG, attrs(PTC_OP_NEG), 1, it, in);
    EXPECT_OUT(r, 0, TOL, 2, 1, -0.0, -0.5, -1, -2, -4);
    rt_free(&r);
    /* exp: e^-2 = 0.135335283, e^-1 = 0.367879441, 1, e^0.5 = 1.648721271, e = 2.718281828,
     * e^2 = 7.389056099, e^4 = 54.59815003 */
    r = rt_ok(PTC_OP_EXP, attrs(PTC_OP_EXP), 1, it, in);
    EXPECT_OUT(r, 0, TOL, 0.135335283, 0.367879441, 1, 1.648721271, 2.718281828, 7.389056099,
               54.59815003);
    rt_free(&r);
    /* tanh(0.5) = (e - 1)/(e + 1) = 0.462117157; tanh(1) = 0.761594156; tanh(2) = 0.964027580;
     * tanh(4) = 0.999329300 */
    r = rt_ok(PTC_OP_TANH, attrs(PTC_OP_TANH), 1, it, in);
    EXPECT_OUT(r, 0, TOL, -0.964027580, -0.761594156, 0, 0.462117157, 0.761594156, 0.964027580,
               0.999329300);
    rt_free(&r);
    /* sigmoid(x) = 1/(1+e^-x): sigmoid(2) = 1/(1+0.135335283) = 0.880797078, sigmoid(-x) =
     * 1 - sigmoid(x); sigmoid(1) = 0.731058579; sigmoid(0.5) = 0.622459331; sigmoid(4) =
     * 0.982013790 */
    r = rt_ok(PTC_OP_SIGMOID, attrs(PTC_OP_SIGMOID), 1, it, in);
    EXPECT_OUT(r, 0, TOL, 0.119202922, 0.268941421, 0.5, 0.622459331, 0.731058579, 0.880797078,
               0.982013790);
    rt_free(&r);
    r = rt_ok(PTC_OP_RELU, attrs(PTC_OP_RELU), 1, it, in);
    EXPECT_OUT(r, 0, TOL, 0, 0, 0, 0.5, 1, 2, 4);
    rt_free(&r);
    /* silu(x) = x * sigmoid(x): -2 * 0.119202922 = -0.238405844; -1 * 0.268941421; 0;
     * 0.5 * 0.622459331 = 0.311229666; 0.731058579; 2 * 0.880797078 = 1.761594156;
     * 4 * 0.982013790 = 3.928055160 */
    r = rt_ok(PTC_OP_SILU, attrs(PTC_OP_SILU), 1, it, in);
    EXPECT_OUT(r, 0, TOL, -0.238405844, -0.268941421, 0, 0.311229666, 0.731058579, 1.761594156,
               3.928055160);
    rt_free(&r);
}

Test(ref_elementwise, gelu_tanh_approximation)
{
    /* gelu(x) = 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi) = 0.7978845608
     * x = 1:  c * 1.044715 = 0.8335619689; tanh = 0.6823839812; 0.5 * 1.6823839812 = 0.8411919906
     * x = -1: gelu(-x) = gelu(x) - x  (tanh is odd)  = 0.8411919906 - 1 = -0.1588080094
     * x = 2:  c * (2 + 0.35772) = 1.8811960; tanh = 0.9545976941; 0.5*2*1.9545976941 = 1.9545976941
     * x = 0.5: c * (0.5 + 0.005589375) = 0.4033935; tanh = 0.3828560; 0.25 * 1.3828560 = 0.3457140
     * x = 0: 0 */
    float x[] = {1, -1, 2, 0.5f, 0};
    rt_result r =
        rt_ok(PTC_OP_GELU, attrs(PTC_OP_GELU), 1, (ptc_type[]){TY(PTC_F32, 5)}, (void *[]){x});
    EXPECT_OUT(r, 0, TOL, 0.8411919906, -0.1588080094, 1.9545976941, 0.3457140098, 0);
    rt_free(&r);
}

Test(ref_elementwise, log_sqrt_rsqrt)
{
    /* log: log 1 = 0, log 2 = 0.693147181, log 4 = 2 log 2 = 1.386294361, log 0.25 = -1.386294361
     * sqrt: 1, 1.414213562, 2, 0.5; rsqrt: 1, 0.707106781, 0.5, 2 */
    float x[] = {1, 2, 4, 0.25f};
    ptc_type it[] = {TY(PTC_F32, 4)};
    rt_result r = rt_ok(PTC_OP_LOG, attrs(PTC_OP_LOG), 1, it, (void *[]){x});
    EXPECT_OUT(r, 0, TOL, 0, 0.693147181, 1.386294361, -1.386294361);
    rt_free(&r);
    r = rt_ok(PTC_OP_SQRT, attrs(PTC_OP_SQRT), 1, it, (void *[]){x});
    EXPECT_OUT(r, 0, TOL, 1, 1.414213562, 2, 0.5);
    rt_free(&r);
    r = rt_ok(PTC_OP_RSQRT, attrs(PTC_OP_RSQRT), 1, it, (void *[]){x});
    EXPECT_OUT(r, 0, TOL, 1, 0.707106781, 0.5, 2);
    rt_free(&r);
    /* log 0 = -inf, log -1 = NaN, sqrt -1 = NaN: the reference follows IEEE */
    float bad[] = {0, -1};
    r = rt_ok(PTC_OP_LOG, attrs(PTC_OP_LOG), 1, (ptc_type[]){TY(PTC_F32, 2)}, (void *[]){bad});
    EXPECT_OUT(r, 0, TOL, -INFINITY, NAN);
    rt_free(&r);
}

Test(ref_elementwise, bf16_results_are_rounded)
{
    /* bf16 keeps 8 significand bits: the spacing above 1 is 2^-7.
     * 1 + 2^-8 (exact in float) is halfway between 1 and 1 + 2^-7: ties to even gives 1.
     * 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): 1.015625. */
    float a[] = {1, 1, 0.0078125f}, b[] = {0.00390625f, 0.01171875f, 0.0078125f};
    ptc_type it[] = {TY(PTC_BF16, 3), TY(PTC_BF16, 3)};
    rt_result r = rt_ok(PTC_OP_ADD, attrs(PTC_OP_ADD), 2, it, (void *[]){a, b});
    rt_expect_type(&r.ot[0], TY(PTC_BF16, 3));
    EXPECT_OUT(r, 0, 0, 1.0, 1.015625, 0.015625); /* 2^-7 + 2^-7 = 2^-6 exactly */
    rt_free(&r);
    /* f16: 2048 + 1 = 2049 is halfway between 2048 and 2050 (spacing 2 above 2048): 2048 */
    float c[] = {2048}, d[] = {1};
    r = rt_ok(PTC_OP_ADD, attrs(PTC_OP_ADD), 2, (ptc_type[]){TY(PTC_F16, 1), TY(PTC_F16, 1)},
              (void *[]){c, d});
    EXPECT_OUT(r, 0, 0, 2048);
    rt_free(&r);
}

/* ---- matmul ---- */

Test(ref_matmul, plain_2x3_by_3x2)
{
    /* [[1,2,3],[4,5,6]] @ [[7,8],[9,10],[11,12]]
     * = [[1*7+2*9+3*11, 1*8+2*10+3*12], [4*7+5*9+6*11, 4*8+5*10+6*12]] = [[58,64],[139,154]] */
    float a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10, 11, 12};
    rt_result r = rt_ok(PTC_OP_MATMUL, attrs(PTC_OP_MATMUL), 2,
                        (ptc_type[]){TY(PTC_F32, 2, 3), TY(PTC_F32, 3, 2)}, (void *[]){a, b});
    EXPECT_OUT(r, 0, TOL, 58, 64, 139, 154);
    rt_free(&r);
}

Test(ref_matmul, batch_seq_by_matrix)
{
    /* [B=2,S=2,d=2] @ [d=2,f=1] with w = [1, -1]^T: each row (x0, x1) gives x0 - x1 */
    float x[] = {1, 2, 5, 3, -1, -1, 0.5f, 2}, w[] = {1, -1};
    rt_result r = rt_ok(PTC_OP_MATMUL, attrs(PTC_OP_MATMUL), 2,
                        (ptc_type[]){TY(PTC_F32, 2, 2, 2), TY(PTC_F32, 2, 1)}, (void *[]){x, w});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 2, 1));
    EXPECT_OUT(r, 0, TOL, -1, 2, 0, -1.5);
    rt_free(&r);
}

Test(ref_matmul, heads_q_by_k_transposed)
{
    /* [B=1,H=2,S=2,d=1] @ [1,2,1,2]: per head an outer product.
     * head 0: [1,2]^T [3,4] = [[3,4],[6,8]]; head 1: [-1,0.5]^T [2,2] = [[-2,-2],[1,1]] */
    float q[] = {1, 2, -1, 0.5f}, k[] = {3, 4, 2, 2};
    rt_result r =
        rt_ok(PTC_OP_MATMUL, attrs(PTC_OP_MATMUL), 2,
              (ptc_type[]){TY(PTC_F32, 1, 2, 2, 1), TY(PTC_F32, 1, 2, 1, 2)}, (void *[]){q, k});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 1, 2, 2, 2));
    EXPECT_OUT(r, 0, TOL, 3, 4, 6, 8, -2, -2, 1, 1);
    rt_free(&r);
}

Test(ref_matmul, broadcast_leading_2x1_with_3)
{
    /* [2,1,2,2] @ [3,2,1] -> [2,3,2,1]: out[i][j] = A_i @ B_j.
     * A_0 = [[1,2],[3,4]], A_1 = [[0,1],[1,0]]; B_0 = [1,1]^T, B_1 = [1,0]^T, B_2 = [0,2]^T.
     * A_0 B_0 = [3,7], A_0 B_1 = [1,3], A_0 B_2 = [4,8];
     * A_1 B_0 = [1,1], A_1 B_1 = [0,1], A_1 B_2 = [2,0] */
    float a[] = {1, 2, 3, 4, 0, 1, 1, 0}, b[] = {1, 1, 1, 0, 0, 2};
    rt_result r =
        rt_ok(PTC_OP_MATMUL, attrs(PTC_OP_MATMUL), 2,
              (ptc_type[]){TY(PTC_F32, 2, 1, 2, 2), TY(PTC_F32, 3, 2, 1)}, (void *[]){a, b});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 3, 2, 1));
    EXPECT_OUT(r, 0, TOL, 3, 7, 1, 3, 4, 8, 1, 1, 0, 1, 2, 0);
    rt_free(&r);
}

Test(ref_matmul, bf16_result_rounded)
{
    /* [1, 1] @ [1, 2^-8]^T = 1 + 2^-8 exactly in double, rounded to bf16: 1 (tie to even) */
    float a[] = {1, 1}, b[] = {1, 0.00390625f};
    rt_result r = rt_ok(PTC_OP_MATMUL, attrs(PTC_OP_MATMUL), 2,
                        (ptc_type[]){TY(PTC_BF16, 1, 2), TY(PTC_BF16, 2, 1)}, (void *[]){a, b});
    EXPECT_OUT(r, 0, 0, 1.0);
    rt_free(&r);
}

/* ---- sources and casts ---- */

Test(ref_source, const_writes_its_value)
{
    ptc_attrs at = attrs(PTC_OP_CONST);
    at.value = 2.5;
    at.dtype = PTC_F32;
    rt_result r = rt_ok(PTC_OP_CONST, at, 0, NULL, NULL);
    rt_expect_type(&r.ot[0], SCALAR(PTC_F32));
    EXPECT_OUT(r, 0, 0, 2.5);
    rt_free(&r);
    /* a bf16 constant is rounded: 1 + 2^-9 -> 1 */
    at.value = 1.001953125;
    at.dtype = PTC_BF16;
    r = rt_ok(PTC_OP_CONST, at, 0, NULL, NULL);
    EXPECT_OUT(r, 0, 0, 1.0);
    rt_free(&r);
    at.value = 7;
    at.dtype = PTC_I32;
    r = rt_ok(PTC_OP_CONST, at, 0, NULL, NULL);
    EXPECT_INTS(r, 0, 7);
    rt_free(&r);
}

Test(ref_source, input_and_param_are_not_kernels)
{
    ptc_attrs at = attrs(PTC_OP_PARAM);
    at.nshape = 1;
    at.shape[0] = 2;
    at.name = "w";
    rt_result r = rt_run(PTC_OP_PARAM, at, 0, NULL, NULL);
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "source op") != NULL, "message: %s", r.err);
    rt_free(&r);
    at = attrs(PTC_OP_INPUT);
    at.nshape = 1;
    at.shape[0] = 2;
    at.dtype = PTC_I32;
    at.name = "tokens";
    r = rt_run(PTC_OP_INPUT, at, 0, NULL, NULL);
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "source op") != NULL, "message: %s", r.err);
    rt_free(&r);
}

static rt_result cast(void *x, ptc_type from, ptc_dtype to)
{
    ptc_attrs at = attrs(PTC_OP_CAST);
    at.dtype = to;
    return rt_ok(PTC_OP_CAST, at, 1, (ptc_type[]){from}, (void *[]){x});
}

Test(ref_cast, f32_to_bf16_and_f16)
{
    /* bf16 (spacing 2^-7 above 1): 1 stays; 1 + 2^-8 ties to 1; 1 + 3*2^-8 ties to 1 + 2^-6;
     * pi = 3.14159265 -> 2 * (1 + 73/128) = 3.140625; 3.4e38 -> inf (past (2 - 2^-7) 2^127) */
    float x[] = {1, 1.00390625f, 1.01171875f, 3.14159265f, 3.4e38f, -2.0f};
    rt_result r = cast(x, TY(PTC_F32, 6), PTC_BF16);
    EXPECT_OUT16(r, 0, 0, 1, 1, 1.015625, 3.140625, INFINITY, -2);
    rt_free(&r);
    /* f16 (10 fraction bits): 65504 is the largest; 65519 < 65520 (the halfway point to 65536)
     * rounds down to 65504; 65520 ties to the even 65536 = inf; 2^-24 = 5.96e-8 is the smallest
     * subnormal; 1e-8 < 2^-25 -> 0; 1 + 2^-11 ties to 1 */
    float y[] = {65504, 65519, 65520, 5.9604644775390625e-8f, 1e-8f, 1.00048828125f};
    r = cast(y, TY(PTC_F32, 6), PTC_F16);
    EXPECT_OUT16(r, 0, 0, 65504, 65504, INFINITY, 5.9604644775390625e-8, 0, 1);
    rt_free(&r);
}

Test(ref_cast, f32_to_i32_truncates)
{
    /* toward zero; NaN -> 0 and out of range saturates (the reference's definition) */
    float x[] = {2.7f, -2.7f, 0.5f, -0.0f, 3e9f, -3e9f, NAN, 16777216.0f};
    rt_result r = cast(x, TY(PTC_F32, 8), PTC_I32);
    rt_expect_type(&r.ot[0], TY(PTC_I32, 8));
    EXPECT_INTS(r, 0, 2, -2, 0, 0, INT32_MAX, INT32_MIN, 0, 16777216);
    rt_free(&r);
}

Test(ref_cast, i32_to_floats)
{
    /* to f32: 16777217 = 2^24 + 1 is a tie between 2^24 and 2^24 + 2: 2^24 (even).
     * to bf16: 257 ties between 256 and 258 -> 256; 259 ties between 258 and 260 -> 260;
     * 16842753 = 2^24 + 2^16 + 1 is just above the halfway point 2^24 + 2^16 between 2^24 and
     * 2^24 + 2^17, so it rounds up to 16908288 (rounding once; via f32 it would tie down). */
    int32_t x[] = {-3, 16777217, 257, 259, 16842753};
    rt_result r = cast(x, TY(PTC_I32, 5), PTC_F32);
    EXPECT_OUT(r, 0, 0, -3, 16777216, 257, 259, 16842752);
    rt_free(&r);
    r = cast(x, TY(PTC_I32, 5), PTC_BF16);
    EXPECT_OUT16(r, 0, 0, -3, 16777216, 256, 260, 16908288);
    rt_free(&r);
    r = cast(x, TY(PTC_I32, 5), PTC_I32);
    EXPECT_INTS(r, 0, -3, 16777217, 257, 259, 16842753);
    rt_free(&r);
}

/* bf16 and f16 are stored in 2 bytes: what a cast writes, and what one reads. */
Test(ref_cast, between_low_precisions)
{
    /* f16 -> bf16: 1 + 2^-10 (exact in f16) is below the bf16 halfway point 1 + 2^-8: 1.
     * bf16 -> f16: 2^20 is exact in bf16 but above 65504: inf. bf16 -> f32 keeps values. */
    float xf[] = {1.0009765625f, 3};
    uint16_t x[2], y[2];
    rt_encode16(PTC_F16, xf, x, 2);
    rt_result r = cast(x, TY(PTC_F16, 2), PTC_BF16);
    EXPECT_OUT16(r, 0, 0, 1, 3);
    rt_free(&r);
    float yf[] = {1048576, 1.5f};
    rt_encode16(PTC_BF16, yf, y, 2);
    r = cast(y, TY(PTC_BF16, 2), PTC_F16);
    EXPECT_OUT16(r, 0, 0, INFINITY, 1.5);
    rt_free(&r);
    r = cast(y, TY(PTC_BF16, 2), PTC_F32);
    EXPECT_OUT(r, 0, 0, 1048576, 1.5);
    rt_free(&r);
}

/* ---- reductions ---- */

static rt_result reduce(ptc_op op, float *x, ptc_type t, int64_t axis)
{
    ptc_attrs at = attrs(op);
    at.axis = axis;
    return rt_ok(op, at, 1, (ptc_type[]){t}, (void *[]){x});
}

Test(ref_reduce, sum_mean_max_2x3)
{
    /* x = [[1,2,3],[4,5,-6]] */
    float x[] = {1, 2, 3, 4, 5, -6};
    ptc_type t = TY(PTC_F32, 2, 3);
    rt_result r = reduce(PTC_OP_SUM, x, t, 0); /* columns: 1+4, 2+5, 3-6 */
    rt_expect_type(&r.ot[0], TY(PTC_F32, 3));
    EXPECT_OUT(r, 0, TOL, 5, 7, -3);
    rt_free(&r);
    r = reduce(PTC_OP_SUM, x, t, 1); /* rows: 1+2+3, 4+5-6 */
    EXPECT_OUT(r, 0, TOL, 6, 3);
    rt_free(&r);
    r = reduce(PTC_OP_MEAN, x, t, 1); /* 6/3, 3/3 */
    EXPECT_OUT(r, 0, TOL, 2, 1);
    rt_free(&r);
    r = reduce(PTC_OP_MEAN, x, t, 0); /* 5/2, 7/2, -3/2 */
    EXPECT_OUT(r, 0, TOL, 2.5, 3.5, -1.5);
    rt_free(&r);
    r = reduce(PTC_OP_MAX, x, t, 0);
    EXPECT_OUT(r, 0, TOL, 4, 5, 3);
    rt_free(&r);
    r = reduce(PTC_OP_MAX, x, t, 1);
    EXPECT_OUT(r, 0, TOL, 3, 5);
    rt_free(&r);
}

Test(ref_reduce, middle_axis_of_2x3x2)
{
    /* x[a][i][c] = 6a + 2i + c (0..11); sum over i: out[a][c] = 3*(6a + c) + (0+2+4)
     * a=0: c=0 -> 6, c=1 -> 9; a=1: c=0 -> 24, c=1 -> 27. max over i: 6a + 4 + c. */
    float *x = rt_iota(12);
    ptc_type t = TY(PTC_F32, 2, 3, 2);
    rt_result r = reduce(PTC_OP_SUM, x, t, 1);
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 2));
    EXPECT_OUT(r, 0, TOL, 6, 9, 24, 27);
    rt_free(&r);
    r = reduce(PTC_OP_MAX, x, t, 1);
    EXPECT_OUT(r, 0, TOL, 4, 5, 10, 11);
    rt_free(&r);
    r = reduce(PTC_OP_MEAN, x, t, 1);
    EXPECT_OUT(r, 0, TOL, 2, 3, 8, 9);
    rt_free(&r);
    free(x);
}

Test(ref_reduce, max_of_negatives_and_nan)
{
    float x[] = {-5, -3, -4, 1, NAN, 2};
    rt_result r = reduce(PTC_OP_MAX, x, TY(PTC_F32, 2, 3), 1);
    EXPECT_OUT(r, 0, TOL, -3, NAN);
    rt_free(&r);
}

/* ---- normalisations ---- */

Test(ref_norm, layernorm_biased_variance)
{
    /* row 0: x = [1,2,3,4]: mean 2.5, var = (2.25+0.25+0.25+2.25)/4 = 1.25 (biased);
     *   with eps = 0: (x - 2.5)/sqrt(1.25) = [-1.3416408, -0.4472136, 0.4472136, 1.3416408],
     *   then * g = [1,2,1,1] + b = [0,0,1,0]: [-1.3416408, -0.8944272, 1.4472136, 1.3416408]
     * row 1: x = [-1,0,2,7]: mean 2, var = (9+4+0+25)/4 = 9.5; (x-2)/sqrt(9.5) =
     *   [-0.9733285, -0.6488857, 0, 1.6222142] -> [-0.9733285, -1.2977714, 1, 1.6222142] */
    float x[] = {1, 2, 3, 4, -1, 0, 2, 7}, g[] = {1, 2, 1, 1}, b[] = {0, 0, 1, 0};
    ptc_attrs at = attrs(PTC_OP_LAYERNORM);
    at.eps = 0;
    ptc_type it[] = {TY(PTC_F32, 2, 4), TY(PTC_F32, 4), TY(PTC_F32, 4)};
    rt_result r = rt_ok(PTC_OP_LAYERNORM, at, 3, it, (void *[]){x, g, b});
    EXPECT_OUT(r, 0, TOL, -1.3416408, -0.8944272, 1.4472136, 1.3416408, -0.9733285, -1.2977714, 1,
               1.6222142);
    rt_free(&r);
    /* eps = 1e-5 (the default): row 0 scale 1/sqrt(1.25001) = 0.8944236, so x0 -> -1.5 * 0.8944236
     */
    at = attrs(PTC_OP_LAYERNORM);
    r = rt_ok(PTC_OP_LAYERNORM, at, 3, it, (void *[]){x, g, b});
    float *o = r.out[0];
    cr_expect(fabs(o[0] - (-1.5 * 0.894423613)) < 1e-6, "got %.9g", o[0]);
    rt_free(&r);
}

Test(ref_norm, rmsnorm)
{
    /* x = [3,4]: mean(x^2) = (9+16)/2 = 12.5, sqrt = 3.5355339; x/3.5355339 = [0.8485281,
     * 1.1313708]; * g = [1, 0.5] -> [0.8485281, 0.5656854]. Row 2: x = [1,-1]: rms 1 -> [1,-0.5] */
    float x[] = {3, 4, 1, -1}, g[] = {1, 0.5f};
    ptc_attrs at = attrs(PTC_OP_RMSNORM);
    at.eps = 0;
    rt_result r = rt_ok(PTC_OP_RMSNORM, at, 2, (ptc_type[]){TY(PTC_F32, 2, 2), TY(PTC_F32, 2)},
                        (void *[]){x, g});
    EXPECT_OUT(r, 0, TOL, 0.8485281, 0.5656854, 1, -0.5);
    rt_free(&r);
}

Test(ref_norm, softmax_last_axis)
{
    /* softmax([1,2,3]): e^-2, e^-1, 1 over their sum 1.5032147 = [0.0900306, 0.2447285,
     * 0.6652410]; [1000,1001,1002] gives the same (the max is subtracted first, no overflow) */
    float x[] = {1, 2, 3, 1000, 1001, 1002};
    ptc_attrs at = attrs(PTC_OP_SOFTMAX);
    at.axis = 1;
    rt_result r = rt_ok(PTC_OP_SOFTMAX, at, 1, (ptc_type[]){TY(PTC_F32, 2, 3)}, (void *[]){x});
    EXPECT_OUT(r, 0, TOL, 0.0900306, 0.2447285, 0.6652410, 0.0900306, 0.2447285, 0.6652410);
    rt_free(&r);
}

Test(ref_norm, softmax_first_axis)
{
    /* x = [[1,1],[2,3]] over axis 0: column 0 softmax(1,2) = [0.2689414, 0.7310586],
     * column 1 softmax(1,3) = [0.1192029, 0.8807971] */
    float x[] = {1, 1, 2, 3};
    ptc_attrs at = attrs(PTC_OP_SOFTMAX);
    at.axis = 0;
    rt_result r = rt_ok(PTC_OP_SOFTMAX, at, 1, (ptc_type[]){TY(PTC_F32, 2, 2)}, (void *[]){x});
    EXPECT_OUT(r, 0, TOL, 0.2689414, 0.1192029, 0.7310586, 0.8807971);
    rt_free(&r);
}

Test(ref_norm, log_softmax)
{
    /* log_softmax([1,2,3]) = x - 3 - log(1.5032147) = x - 3.4076059 -> [-2.4076059, -1.4076059,
     * -0.4076059]; for [-1000, 0, 1000] the first two are -2000 and -1000, the last 0 */
    float x[] = {1, 2, 3, -1000, 0, 1000};
    ptc_attrs at = attrs(PTC_OP_LOG_SOFTMAX);
    at.axis = 1;
    rt_result r = rt_ok(PTC_OP_LOG_SOFTMAX, at, 1, (ptc_type[]){TY(PTC_F32, 2, 3)}, (void *[]){x});
    EXPECT_OUT(r, 0, TOL, -2.4076059, -1.4076059, -0.4076059, -2000, -1000, 0);
    rt_free(&r);
}

/* ---- shape ---- */

Test(ref_shape, reshape_copies)
{
    float *x = rt_iota(6);
    ptc_attrs at = attrs(PTC_OP_RESHAPE);
    at.nshape = 3;
    at.shape[0] = 3;
    at.shape[1] = 1;
    at.shape[2] = 2;
    rt_result r = rt_ok(PTC_OP_RESHAPE, at, 1, (ptc_type[]){TY(PTC_F32, 2, 3)}, (void *[]){x});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 3, 1, 2));
    EXPECT_OUT(r, 0, 0, 0, 1, 2, 3, 4, 5);
    rt_free(&r);
    free(x);
}

Test(ref_shape, transpose_last_two)
{
    /* x[b][i][j] = 6b + 3i + j, [2,2,3] -> out[b][j][i] */
    float *x = rt_iota(12);
    rt_result r = rt_ok(PTC_OP_TRANSPOSE, attrs(PTC_OP_TRANSPOSE), 1,
                        (ptc_type[]){TY(PTC_F32, 2, 2, 3)}, (void *[]){x});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 3, 2));
    EXPECT_OUT(r, 0, 0, 0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11);
    rt_free(&r);
    free(x);
}

Test(ref_shape, permute_2x3x4_by_201)
{
    /* x[a][b][c] = 12a + 4b + c; axes (2,0,1): out[c][a][b] = x[a][b][c], out f32[4,2,3] */
    float *x = rt_iota(24);
    ptc_attrs at = attrs(PTC_OP_PERMUTE);
    at.nshape = 3;
    at.shape[0] = 2;
    at.shape[1] = 0;
    at.shape[2] = 1;
    rt_result r = rt_ok(PTC_OP_PERMUTE, at, 1, (ptc_type[]){TY(PTC_F32, 2, 3, 4)}, (void *[]){x});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 4, 2, 3));
    /* one line per c = 0, 1, 2, 3 */
    EXPECT_OUT(r, 0, 0, 0, 4, 8, 12, 16, 20, //
               1, 5, 9, 13, 17, 21,          //
               2, 6, 10, 14, 18, 22,         //
               3, 7, 11, 15, 19, 23);
    rt_free(&r);
    free(x);
}

Test(ref_shape, split_along_each_axis)
{
    /* x = [[0,1,2,3],[4,5,6,7]]; split 2 along axis 1 -> [[0,1],[4,5]] and [[2,3],[6,7]] */
    float *x = rt_iota(8);
    ptc_attrs at = attrs(PTC_OP_SPLIT);
    at.n = 2;
    at.axis = 1;
    rt_result r = rt_ok(PTC_OP_SPLIT, at, 1, (ptc_type[]){TY(PTC_F32, 2, 4)}, (void *[]){x});
    cr_assert_eq(r.nout, 2);
    EXPECT_OUT(r, 0, 0, 0, 1, 4, 5);
    EXPECT_OUT(r, 1, 0, 2, 3, 6, 7);
    rt_free(&r);
    /* split 2 along axis 0: the two rows */
    at.axis = 0;
    r = rt_ok(PTC_OP_SPLIT, at, 1, (ptc_type[]){TY(PTC_F32, 2, 4)}, (void *[]){x});
    EXPECT_OUT(r, 0, 0, 0, 1, 2, 3);
    EXPECT_OUT(r, 1, 0, 4, 5, 6, 7);
    rt_free(&r);
    /* split 4 along axis 1: the columns */
    at.axis = 1;
    at.n = 4;
    r = rt_ok(PTC_OP_SPLIT, at, 1, (ptc_type[]){TY(PTC_F32, 2, 4)}, (void *[]){x});
    cr_assert_eq(r.nout, 4);
    EXPECT_OUT(r, 0, 0, 0, 4);
    EXPECT_OUT(r, 3, 0, 3, 7);
    rt_free(&r);
    free(x);
}

Test(ref_shape, concat_three)
{
    /* [[1],[2]] ++ [[3,4],[5,6]] ++ [[7],[8]] along axis 1 -> [[1,3,4,7],[2,5,6,8]] */
    float a[] = {1, 2}, b[] = {3, 4, 5, 6}, c[] = {7, 8};
    ptc_attrs at = attrs(PTC_OP_CONCAT);
    at.axis = 1;
    ptc_type it[] = {TY(PTC_F32, 2, 1), TY(PTC_F32, 2, 2), TY(PTC_F32, 2, 1)};
    rt_result r = rt_ok(PTC_OP_CONCAT, at, 3, it, (void *[]){a, b, c});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 4));
    EXPECT_OUT(r, 0, 0, 1, 3, 4, 7, 2, 5, 6, 8);
    rt_free(&r);
    /* along axis 0: [[1,2]] ++ [[3,4],[5,6]] -> rows one after another */
    at.axis = 0;
    ptc_type it0[] = {TY(PTC_F32, 1, 2), TY(PTC_F32, 2, 2)};
    r = rt_ok(PTC_OP_CONCAT, at, 2, it0, (void *[]){a, b});
    EXPECT_OUT(r, 0, 0, 1, 2, 3, 4, 5, 6);
    rt_free(&r);
}

Test(ref_shape, slice_middle)
{
    /* x = [[0,1,2,3],[4,5,6,7],[8,9,10,11]]; axis 1, start 1, len 2 -> [[1,2],[5,6],[9,10]];
     * axis 0, start 2, len 1 -> [[8,9,10,11]] */
    float *x = rt_iota(12);
    ptc_attrs at = attrs(PTC_OP_SLICE);
    at.axis = 1;
    at.start = 1;
    at.len = 2;
    rt_result r = rt_ok(PTC_OP_SLICE, at, 1, (ptc_type[]){TY(PTC_F32, 3, 4)}, (void *[]){x});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 3, 2));
    EXPECT_OUT(r, 0, 0, 1, 2, 5, 6, 9, 10);
    rt_free(&r);
    at.axis = 0;
    at.start = 2;
    at.len = 1;
    r = rt_ok(PTC_OP_SLICE, at, 1, (ptc_type[]){TY(PTC_F32, 3, 4)}, (void *[]){x});
    EXPECT_OUT(r, 0, 0, 8, 9, 10, 11);
    rt_free(&r);
    free(x);
}

Test(ref_shape, i32_moves_bit_for_bit)
{
    /* shape ops serve i32 too: transpose [[1,-2],[INT32_MAX, INT32_MIN]] */
    int32_t x[] = {1, -2, INT32_MAX, INT32_MIN};
    rt_result r = rt_ok(PTC_OP_TRANSPOSE, attrs(PTC_OP_TRANSPOSE), 1,
                        (ptc_type[]){TY(PTC_I32, 2, 2)}, (void *[]){x});
    EXPECT_INTS(r, 0, 1, INT32_MAX, -2, INT32_MIN);
    rt_free(&r);
    ptc_attrs at = attrs(PTC_OP_SLICE);
    at.axis = 1;
    at.start = 1;
    at.len = 1;
    r = rt_ok(PTC_OP_SLICE, at, 1, (ptc_type[]){TY(PTC_I32, 2, 2)}, (void *[]){x});
    EXPECT_INTS(r, 0, -2, INT32_MIN);
    rt_free(&r);
}
