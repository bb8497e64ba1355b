/* test_ref_model.c - the reference model ops (embedding, attention, rope) and losses
 * (cross_entropy, mse) against values worked out by hand, and their data errors.
 */
#include "ref_test.h"

#define TOL 1e-6

/* ---- embedding ---- */

Test(ref_embedding, rows_of_the_table)
{
    /* table [3,2] = [[0,1],[10,11],[20,21]]; ids [[2,0],[1,2]] -> rows 2, 0, 1, 2 */
    float table[] = {0, 1, 10, 11, 20, 21};
    int32_t ids[] = {2, 0, 1, 2};
    ptc_type it[] = {TY(PTC_F32, 3, 2), TY(PTC_I32, 2, 2)};
    rt_result r =
        rt_ok(PTC_OP_EMBEDDING, ptc_attrs_default(PTC_OP_EMBEDDING), 2, it, (void *[]){table, ids});
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 2, 2));
    EXPECT_OUT(r, 0, 0, 20, 21, 0, 1, 10, 11, 20, 21);
    rt_free(&r);
}

Test(ref_embedding, id_out_of_range_is_an_error)
{
    float table[] = {0, 1, 10, 11, 20, 21};
    int32_t ids[] = {0, 3};
    ptc_type it[] = {TY(PTC_F32, 3, 2), TY(PTC_I32, 2)};
    rt_result r = rt_run(PTC_OP_EMBEDDING, ptc_attrs_default(PTC_OP_EMBEDDING), 2, it,
                         (void *[]){table, ids});
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "id 3") != NULL, "message: %s", r.err);
    cr_expect(strstr(r.err, "3 rows") != NULL, "message: %s", r.err);
    rt_free(&r);
    int32_t neg[] = {-1, 0};
    r = rt_run(PTC_OP_EMBEDDING, ptc_attrs_default(PTC_OP_EMBEDDING), 2, it,
               (void *[]){table, neg});
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "id -1") != NULL, "message: %s", r.err);
    cr_expect(strstr(r.err, "3 rows") != NULL, "message: %s", r.err);
    rt_free(&r);
}

/* ---- attention ---- */

static rt_result attention(float *q, float *k, float *v, ptc_type tq, ptc_type tkv, int64_t heads,
                           int64_t kv_heads, bool causal)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_ATTENTION);
    at.heads = heads;
    at.kv_heads = kv_heads;
    at.causal = causal;
    return rt_ok(PTC_OP_ATTENTION, at, 3, (ptc_type[]){tq, tkv, tkv}, (void *[]){q, k, v});
}

Test(ref_attention, one_head_causal_by_hand)
{
    /* B=2, S=2, H=1, dh=2, scale 1/sqrt(2).
     * batch 0: q = [[1,0],[0,1]], k = [[1,0],[1,1]], v = [[1,2],[3,4]].
     *   position 0 sees key 0 only: out = v0 = [1,2].
     *   position 1: scores q1.k0 = 0, q1.k1 = 1, scaled [0, 0.7071068];
     *   w1 = 1/(1 + e^-0.7071068) = 0.6697615, w0 = 0.3302385;
     *   out = w0 [1,2] + w1 [3,4] = [1 + 2 w1, 2 + 2 w1] = [2.3395231, 3.3395231].
     * batch 1: q = 0, so the weights are uniform over the visible keys; v = [[0,2],[4,6]]:
     *   position 0: [0,2]; position 1: the mean [2,4]. */
    float q[] = {1, 0, 0, 1, 0, 0, 0, 0};
    float k[] = {1, 0, 1, 1, 5, -3, 2, 7};
    float v[] = {1, 2, 3, 4, 0, 2, 4, 6};
    rt_result r = attention(q, k, v, TY(PTC_F32, 2, 2, 2), TY(PTC_F32, 2, 2, 2), 1, 0, true);
    rt_expect_type(&r.ot[0], TY(PTC_F32, 2, 2, 2));
    EXPECT_OUT(r, 0, TOL, 1, 2, 2.3395231, 3.3395231, 0, 2, 2, 4);
    rt_free(&r);
    /* not causal: batch 0 position 0 has scores q0.k0 = 1 = q0.k1, so the mean [2,3];
     * position 1 as before. batch 1: both positions the mean [2,4]. */
    r = attention(q, k, v, TY(PTC_F32, 2, 2, 2), TY(PTC_F32, 2, 2, 2), 1, 1, false);
    EXPECT_OUT(r, 0, TOL, 2, 3, 2.3395231, 3.3395231, 2, 4, 2, 4);
    rt_free(&r);
}

Test(ref_attention, grouped_query_heads_4_kv_2)
{
    /* B=1, S=2, H=4, G=2, dh=1 (scale 1). q = 1 everywhere, so head h's scores are the keys of its
     * kv head: k = pos 0 [0, 0], pos 1 [0, ln 3]; v = pos 0 [2, 8], pos 1 [4, 4].
     * kv head 0: scores [0, 0] -> weights [1/2, 1/2] -> (2 + 4)/2 = 3.
     * kv head 1: scores [0, ln 3] -> weights [1/4, 3/4] -> 8/4 + 3*4/4 = 5.
     * Query heads 0,1 use kv head 0 and heads 2,3 kv head 1 (i / (H/G)): [3,3,5,5] per position
     * (i % G would give [3,5,3,5]). */
    float q[] = {1, 1, 1, 1, 1, 1, 1, 1};
    float k[] = {0, 0, 0, 1.0986123f};
    float v[] = {2, 8, 4, 4};
    rt_result r = attention(q, k, v, TY(PTC_F32, 1, 2, 4), TY(PTC_F32, 1, 2, 2), 4, 2, false);
    EXPECT_OUT(r, 0, 1e-6, 3, 3, 5, 5, 3, 3, 5, 5);
    rt_free(&r);
    /* causal: position 0 sees key 0 only: kv head 0 -> 2, kv head 1 -> 8 */
    r = attention(q, k, v, TY(PTC_F32, 1, 2, 4), TY(PTC_F32, 1, 2, 2), 4, 2, true);
    EXPECT_OUT(r, 0, 1e-6, 2, 2, 8, 8, 3, 3, 5, 5);
    rt_free(&r);
}

Test(ref_attention, two_heads_use_their_own_features)
{
    /* B=1, S=1, H=2, dh=2: with a single key each head returns its own slice of v:
     * v = [1,2 | 3,4] -> out = [1,2,3,4] */
    float q[] = {1, 2, 3, 4}, k[] = {5, 6, 7, 8}, v[] = {1, 2, 3, 4};
    rt_result r = attention(q, k, v, TY(PTC_F32, 1, 1, 4), TY(PTC_F32, 1, 1, 4), 2, 2, true);
    EXPECT_OUT(r, 0, TOL, 1, 2, 3, 4);
    rt_free(&r);
}

/* ---- rope ---- */

static rt_result rope(float *x, ptc_type t, int64_t heads, double base)
{
    ptc_attrs at = ptc_attrs_default(PTC_OP_ROPE);
    at.heads = heads;
    at.base = base;
    return rt_ok(PTC_OP_ROPE, at, 1, (ptc_type[]){t}, (void *[]){x});
}

Test(ref_rope, dh2_positions_0_1_2)
{
    /* dh = 2: one pair, angle p * base^0 = p.
     * p = 0: [1,2] unchanged.
     * p = 1: [1,0] -> [cos 1, sin 1] = [0.5403023, 0.8414710].
     * p = 2: [1,1] -> [cos 2 - sin 2, sin 2 + cos 2] = [-0.4161468 - 0.9092974,
     *        0.9092974 - 0.4161468] = [-1.3254443, 0.4931506] */
    float x[] = {1, 2, 1, 0, 1, 1};
    rt_result r = rope(x, TY(PTC_F32, 1, 3, 2), 1, 10000);
    EXPECT_OUT(r, 0, TOL, 1, 2, 0.5403023, 0.8414710, -1.3254443, 0.4931506);
    rt_free(&r);
}

Test(ref_rope, dh4_second_pair_slower)
{
    /* dh = 4, base 100: pair j = 0 turns by p, pair j = 1 by p * 100^(-2/4) = p / 10.
     * p = 0: [1,2,3,4] unchanged.
     * p = 1: [1,0, 0,1] -> [cos 1, sin 1, 0 cos 0.1 - 1 sin 0.1, 0 sin 0.1 + 1 cos 0.1]
     *        = [0.5403023, 0.8414710, -0.0998334, 0.9950042] */
    float x[] = {1, 2, 3, 4, 1, 0, 0, 1};
    rt_result r = rope(x, TY(PTC_F32, 1, 2, 4), 1, 100);
    EXPECT_OUT(r, 0, TOL, 1, 2, 3, 4, 0.5403023, 0.8414710, -0.0998334, 0.9950042);
    rt_free(&r);
}

Test(ref_rope, two_heads_rotate_alike)
{
    /* heads = 2, dh = 2: in each head the one pair turns by p (not by p / 100 as the second pair
     * of a 4-wide head would). p = 1: head 0 [1,0] -> [cos 1, sin 1]; head 1 [0,1] ->
     * [-sin 1, cos 1] = [-0.8414710, 0.5403023]. Batch 1 repeats batch 0 (position restarts). */
    float x[] = {1, 2, 3, 4, 1, 0, 0, 1, 1, 2, 3, 4, 1, 0, 0, 1};
    rt_result r = rope(x, TY(PTC_F32, 2, 2, 4), 2, 100);
    EXPECT_OUT(r, 0, TOL, 1, 2, 3, 4, 0.5403023, 0.8414710, -0.8414710, 0.5403023, //
               1, 2, 3, 4, 0.5403023, 0.8414710, -0.8414710, 0.5403023);
    rt_free(&r);
}

/* ---- losses ---- */

Test(ref_loss, cross_entropy_2x3)
{
    /* row 0: logits [1,2,3], target 2: -log softmax = log(e^-2 + e^-1 + 1) = 0.4076059
     * row 1: logits [1,1,1], target 0: -log(1/3) = 1.0986123
     * mean: (0.4076059 + 1.0986123)/2 = 0.7531091 */
    float logits[] = {1, 2, 3, 1, 1, 1};
    int32_t targets[] = {2, 0};
    ptc_type it[] = {TY(PTC_F32, 2, 3), TY(PTC_I32, 2)};
    rt_result r = rt_ok(PTC_OP_CROSS_ENTROPY, ptc_attrs_default(PTC_OP_CROSS_ENTROPY), 2, it,
                        (void *[]){logits, targets});
    rt_expect_type(&r.ot[0], SCALAR(PTC_F32));
    EXPECT_OUT(r, 0, TOL, 0.7531091);
    rt_free(&r);
    /* the same as [B=2, S=1, 3] with targets [2, 1]: row 1's target 1 also gives log 3 */
    int32_t t2[] = {2, 1};
    ptc_type it3[] = {TY(PTC_F32, 2, 1, 3), TY(PTC_I32, 2, 1)};
    r = rt_ok(PTC_OP_CROSS_ENTROPY, ptc_attrs_default(PTC_OP_CROSS_ENTROPY), 2, it3,
              (void *[]){logits, t2});
    EXPECT_OUT(r, 0, TOL, 0.7531091);
    rt_free(&r);
    /* large logits do not overflow: [1000,1001,1002] target 2 is row 0 again */
    float big[] = {1000, 1001, 1002};
    int32_t t1[] = {2};
    r = rt_ok(PTC_OP_CROSS_ENTROPY, ptc_attrs_default(PTC_OP_CROSS_ENTROPY), 2,
              (ptc_type[]){TY(PTC_F32, 1, 3), TY(PTC_I32, 1)}, (void *[]){big, t1});
    EXPECT_OUT(r, 0, TOL, 0.4076059);
    rt_free(&r);
}

Test(ref_loss, cross_entropy_target_out_of_range)
{
    float logits[] = {1, 2, 3, 1, 1, 1};
    int32_t targets[] = {2, 3};
    ptc_type it[] = {TY(PTC_F32, 2, 3), TY(PTC_I32, 2)};
    rt_result r = rt_run(PTC_OP_CROSS_ENTROPY, ptc_attrs_default(PTC_OP_CROSS_ENTROPY), 2, it,
                         (void *[]){logits, targets});
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "target 3") != NULL, "message: %s", r.err);
    cr_expect(strstr(r.err, "3 classes") != NULL, "message: %s", r.err);
    rt_free(&r);
    int32_t neg[] = {-1, 0};
    r = rt_run(PTC_OP_CROSS_ENTROPY, ptc_attrs_default(PTC_OP_CROSS_ENTROPY), 2, it,
               (void *[]){logits, neg});
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "target -1") != NULL, "message: %s", r.err);
    rt_free(&r);
}

Test(ref_loss, mse)
{
    /* a = [1,2,3], b = [1,0,0]: (0 + 4 + 9)/3 = 4.3333333 */
    float a[] = {1, 2, 3}, b[] = {1, 0, 0};
    rt_result r = rt_ok(PTC_OP_MSE, ptc_attrs_default(PTC_OP_MSE), 2,
                        (ptc_type[]){TY(PTC_F32, 3), TY(PTC_F32, 3)}, (void *[]){a, b});
    rt_expect_type(&r.ot[0], SCALAR(PTC_F32));
    EXPECT_OUT(r, 0, TOL, 4.3333333);
    rt_free(&r);
}
