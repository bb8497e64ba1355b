/* test_moe.c - mixture of experts: the capacity, the reference kernels of moe's pieces against
 * hand-computed routing and finite differences, the expert-parallel row kernels against the
 * single-device experts (bit for bit), and moe whole against its pieces. */
#include "ref_test.h"

/* ---- capacity ---- */

Test(moe, capacity_is_exact_on_the_decimal_written)
{
    /* the language page's example */
    cr_expect_eq(ptc_moe_capacity(1.1, 100, 2, 4), 55);
    /* 0.3 * 1 * 10 / 3 is 1 in decimal; in binary doubles it is 1.0000000000000002 */
    cr_expect_eq(ptc_moe_capacity(0.3, 10, 1, 3), 1);
    cr_expect_eq(ptc_moe_capacity(1.0, 256, 2, 4), 128);
    cr_expect_eq(ptc_moe_capacity(1.25, 256, 2, 4), 160);
    cr_expect_eq(ptc_moe_capacity(0.01, 100, 1, 8), 1); /* rounded up: at least one */
    /* no capacity, or one an expert cannot reach (it takes a token at most once): all tokens */
    cr_expect_eq(ptc_moe_capacity(0, 100, 2, 4), 100);
    cr_expect_eq(ptc_moe_capacity(2.0, 100, 2, 4), 100);
    cr_expect_eq(ptc_moe_capacity(1e300, 100, 2, 4), 100);
}

/* ---- the gate ---- */

Test(moe, topk_ties_go_to_the_lower_expert_and_gates_renormalise)
{
    float p[] = {0.1f, 0.3f, 0.3f, 0.3f, /* a three-way tie */
                 0.4f, 0.1f, 0.2f, 0.3f};
    ptc_type it[] = {TY(PTC_F32, 1, 2, 4)};
    ptc_attrs at = ptc_attrs_default(PTC_OP_MOE_TOPK);
    at.top_k = 2;
    rt_result r = rt_ok(PTC_OP_MOE_TOPK, at, 1, it, (void *[]){p});
    EXPECT_INTS(r, 0, 1, 2, 0, 3);
    EXPECT_OUT(r, 1, 1e-7, 0.5, 0.5, 0.4 / 0.7, 0.3 / 0.7);
    rt_free(&r);
    at.normalize = false;
    r = rt_ok(PTC_OP_MOE_TOPK, at, 1, it, (void *[]){p});
    EXPECT_OUT(r, 1, 1e-7, 0.3, 0.3, 0.4, 0.3);
    rt_free(&r);
}

/* ---- routing ---- */

/* Four tokens, two experts, top 2, capacity 0.5: C = ceil(0.5 * 2 * 4 / 2) = 2 places each.
 * First choices 0 0 0 1, second 1 1 1 0. Expert 0: first choices of tokens 0, 1 (places 0, 1),
 * token 2's first choice finds it full, and so does token 3's second. Expert 1: token 3's first
 * choice (place 0), then the second choices in token order: token 0 (place 1), tokens 1 and 2
 * dropped. */
static const int32_t ids4[] = {0, 1, 0, 1, 0, 1, 1, 0};
static const int32_t route4[] = {0, 1, 0, -1, -1, -1, 1, -1};

static void route_rows(int64_t B, int64_t S, int32_t *out)
{
    ptc_type ti = TY(PTC_I32, B, S, 2);
    ptc_attrs cn = ptc_attrs_default(PTC_OP_MOE_COUNT);
    cn.n = 2;
    rt_result c = rt_ok(PTC_OP_MOE_COUNT, cn, 1, &ti, (void *[]){(void *)ids4});
    rt_result pt = rt_ok(PTC_OP_MOE_PREFIX, ptc_attrs_default(PTC_OP_MOE_PREFIX), 1, c.ot, c.out);
    EXPECT_INTS(pt, 1, 3, 1, 1, 3); /* totals [choice rank, expert] */
    ptc_attrs ra = ptc_attrs_default(PTC_OP_MOE_ROUTE);
    ra.capacity = 0.5;
    ptc_type it[] = {ti, pt.ot[0], pt.ot[1]};
    rt_result r =
        rt_ok(PTC_OP_MOE_ROUTE, ra, 3, it, (void *[]){(void *)ids4, pt.out[0], pt.out[1]});
    memcpy(out, r.out[0], sizeof ids4);
    rt_free(&r);
    rt_free(&pt);
    rt_free(&c);
}

Test(moe, route_places_first_choices_first_in_token_order)
{
    int32_t got[8];
    /* one row of four tokens, and two rows of two: the prefix carries the first row's counts
     * into the second, so the places are the same */
    route_rows(1, 4, got);
    rt_expect_ints(got, 8, route4, 8);
    route_rows(2, 2, got);
    rt_expect_ints(got, 8, route4, 8);
}

Test(moe, route_of_a_slice_of_rows_needs_only_the_prefix)
{
    /* the second row alone (as a rank holding it sees it), with the prefix of the whole step */
    int32_t pre[] = {2, 0, 0, 2}, tot[] = {3, 1, 1, 3}; /* row 0's counts, totals */
    ptc_type it[] = {TY(PTC_I32, 1, 2, 2), TY(PTC_I32, 1, 2, 2), TY(PTC_I32, 2, 2)};
    ptc_attrs ra = ptc_attrs_default(PTC_OP_MOE_ROUTE);
    ra.capacity = 0.5;
    rt_result r = rt_ok(PTC_OP_MOE_ROUTE, ra, 3, it, (void *[]){(void *)(ids4 + 4), pre, tot});
    EXPECT_INTS(r, 0, -1, -1, 1, -1);
    rt_free(&r);
}

Test(moe, stats_count_what_the_capacity_drops)
{
    int32_t tot[] = {3, 1, 1, 3};
    ptc_attrs at = ptc_attrs_default(PTC_OP_MOE_STATS);
    at.capacity = 0.5;
    ptc_type it = TY(PTC_I32, 2, 2);
    rt_result r = rt_ok(PTC_OP_MOE_STATS, at, 1, &it, (void *[]){tot});
    /* loads 4 and 4 (2 experts x 4, over 8 choices: max / mean 1); 4 of 8 choices dropped
     * (route4 keeps 4) */
    EXPECT_OUT(r, 0, 0, 8, 4, 8);
    rt_free(&r);
    /* three experts, dropless: loads 4, 2, 2 of 8 choices (3 x 4 over 8: max / mean 1.5) */
    at.capacity = 0;
    int32_t skew[] = {3, 1, 0, 1, 1, 2};
    ptc_type i3 = TY(PTC_I32, 2, 3);
    r = rt_ok(PTC_OP_MOE_STATS, at, 1, &i3, (void *[]){skew});
    EXPECT_OUT(r, 0, 0, 12, 0, 8);
    rt_free(&r);
    rt_result f =
        rt_ok(PTC_OP_MOE_FRAC, ptc_attrs_default(PTC_OP_MOE_FRAC), 1, &it, (void *[]){tot});
    EXPECT_OUT(f, 0, 1e-7, 0.5, 0.5);
    rt_free(&f);
}

/* ---- the experts ---- */

enum { B = 2, S = 3, K = 2, E = 3, D = 4, F = 5 };

typedef struct experts {
    ptc_act act;
    int64_t hid; /* columns of w_up: F, or 2 F for swiglu */
    float x[B * S * D], gate[B * S * K], up[E * D * 2 * F], down[E * F * D], dy[B * S * D];
    int32_t route[B * S * K];
    ptc_type it[6];
} experts;

static void experts_init(experts *m, ptc_act act)
{
    m->act = act;
    m->hid = act == PTC_ACT_SWIGLU ? 2 * F : F;
    rt_fill(m->x, B * S * D, 1, -1, 1);
    rt_fill(m->gate, B * S * K, 2, 0.2f, 0.8f);
    rt_fill(m->up, E * D * m->hid, 3, -0.8f, 0.8f);
    rt_fill(m->down, E * F * D, 4, -0.8f, 0.8f);
    rt_fill(m->dy, B * S * D, 5, -1, 1);
    /* every expert used, one choice dropped (-1) */
    static const int32_t r[B * S * K] = {0, 2, 1, 0, 2, -1, 1, 2, 0, 1, 2, 0};
    memcpy(m->route, r, sizeof r);
    m->it[0] = TY(PTC_F32, B, S, D);
    m->it[1] = TY(PTC_I32, B, S, K);
    m->it[2] = TY(PTC_F32, B, S, K);
    m->it[3] = TY(PTC_F32, E, D, m->hid);
    m->it[4] = TY(PTC_F32, E, F, D);
    m->it[5] = m->it[0];
}

static ptc_attrs ffn_attrs(ptc_op op, ptc_act act)
{
    ptc_attrs at = ptc_attrs_default(op);
    at.act = act;
    at.n = E;
    return at;
}

/* sum(w * y) of moe_ffn: the loss the finite differences differentiate */
static double ffn_loss(experts *m, const float *w)
{
    rt_result r = rt_ok(PTC_OP_MOE_FFN, ffn_attrs(PTC_OP_MOE_FFN, m->act), 5, m->it,
                        (void *[]){m->x, m->route, m->gate, m->up, m->down});
    double s = 0;
    for (int64_t i = 0; i < B * S * D; i++)
        s += (double)w[i] * ((float *)r.out[0])[i];
    rt_free(&r);
    return s;
}

/* central differences on every element of x (n of them) against grad; see test_ref_grad.c for
 * why a step of 1e-3 and |fd - grad| <= 1e-3 + 1e-2 |grad| */
static void fd_experts(experts *m, const char *what, float *x, int64_t n, const float *grad)
{
    double biggest = 0;
    for (int64_t i = 0; i < n; i++) {
        float x0 = x[i], xp = x0 + 1e-3f, xm = x0 - 1e-3f;
        x[i] = xp;
        double lp = ffn_loss(m, m->dy);
        x[i] = xm;
        double lm = ffn_loss(m, m->dy);
        x[i] = x0;
        double num = (lp - lm) / ((double)xp - (double)xm);
        cr_expect(fabs(num - grad[i]) <= 1e-3 + 1e-2 * fabs(grad[i]),
                  "%s (%s): element %lld: finite difference %.7g, kernel %.7g", what,
                  ptc_act_name(m->act), (long long)i, num, (double)grad[i]);
        biggest = fmax(biggest, fabs(grad[i]));
    }
    cr_expect(biggest > 1e-2, "%s: the gradient is (nearly) zero everywhere", what);
}

Test(moe, ffn_grad_matches_finite_differences)
{
    for (int act = 0; act < PTC_NACTS; act++) {
        experts *m = calloc(1, sizeof *m);
        experts_init(m, (ptc_act)act);
        rt_result g = rt_ok(PTC_OP_MOE_FFN_GRAD, ffn_attrs(PTC_OP_MOE_FFN_GRAD, m->act), 6, m->it,
                            (void *[]){m->x, m->route, m->gate, m->up, m->down, m->dy});
        fd_experts(m, "dx", m->x, B * S * D, g.out[0]);
        fd_experts(m, "dgate", m->gate, B * S * K, g.out[1]);
        fd_experts(m, "dw_up", m->up, E * D * m->hid, g.out[2]);
        fd_experts(m, "dw_down", m->down, E * F * D, g.out[3]);
        /* a dropped choice has no gradient */
        cr_expect_eq(((float *)g.out[1])[5], 0.0f);
        rt_free(&g);
        free(m);
    }
}

static bool same_bits(const void *a, const void *b, int64_t n)
{
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* moe_pack, moe_ep_ffn on one member, moe_combine: the forward of expert parallelism; then
 * moe_combine_grad, moe_ep_ffn_grad, moe_unpack: its backward. Each row is computed as the
 * single-device experts compute it, so y, dx and dgate are the same bits; with one member the
 * rows are summed in the same order, so the weight gradients are too. */
Test(moe, expert_parallel_rows_give_the_single_device_bits)
{
    for (int act = 0; act < PTC_NACTS; act++) {
        experts *m = calloc(1, sizeof *m);
        experts_init(m, (ptc_act)act);
        void *fin[] = {m->x, m->route, m->gate, m->up, m->down, m->dy};
        rt_result y = rt_ok(PTC_OP_MOE_FFN, ffn_attrs(PTC_OP_MOE_FFN, m->act), 5, m->it, fin);
        rt_result g =
            rt_ok(PTC_OP_MOE_FFN_GRAD, ffn_attrs(PTC_OP_MOE_FFN_GRAD, m->act), 6, m->it, fin);

        ptc_attrs ca = ptc_attrs_default(PTC_OP_MOE_EP_COUNT);
        ca.n = E;
        rt_result cnt = rt_ok(PTC_OP_MOE_EP_COUNT, ca, 1, &m->it[1], (void *[]){m->route});
        EXPECT_INTS(cnt, 0, 4, 3, 4); /* kept choices per expert */
        ptc_attrs pa = ptc_attrs_default(PTC_OP_MOE_PACK);
        pa.len = 13; /* one spare row: it must stay zero */
        rt_result rows = rt_ok(PTC_OP_MOE_PACK, pa, 2, m->it, (void *[]){m->x, m->route});
        for (int k = 0; k < D; k++)
            cr_expect_eq(((float *)rows.out[0])[12 * D + k], 0.0f);
        ptc_attrs ea = ffn_attrs(PTC_OP_MOE_EP_FFN, m->act);
        ptc_type et[] = {rows.ot[0], cnt.ot[0], m->it[3], m->it[4], rows.ot[0]};
        rt_result o = rt_ok(PTC_OP_MOE_EP_FFN, ea, 4, et,
                            (void *[]){rows.out[0], cnt.out[0], m->up, m->down});
        ptc_type ct[] = {o.ot[0], m->it[1], m->it[2], m->it[0]};
        rt_result y2 = rt_ok(PTC_OP_MOE_COMBINE, ptc_attrs_default(PTC_OP_MOE_COMBINE), 3, ct,
                             (void *[]){o.out[0], m->route, m->gate});
        cr_expect(same_bits(y.out[0], y2.out[0], B * S * D), "y differs (%s)",
                  ptc_act_name(m->act));

        rt_result cg = rt_ok(PTC_OP_MOE_COMBINE_GRAD, ptc_attrs_default(PTC_OP_MOE_COMBINE_GRAD), 4,
                             ct, (void *[]){o.out[0], m->route, m->gate, m->dy});
        ea = ffn_attrs(PTC_OP_MOE_EP_FFN_GRAD, m->act);
        rt_result eg = rt_ok(PTC_OP_MOE_EP_FFN_GRAD, ea, 5, et,
                             (void *[]){rows.out[0], cnt.out[0], m->up, m->down, cg.out[0]});
        rt_result dx = rt_ok(PTC_OP_MOE_UNPACK, ptc_attrs_default(PTC_OP_MOE_UNPACK), 2, ct,
                             (void *[]){eg.out[0], m->route});
        cr_expect(same_bits(g.out[0], dx.out[0], B * S * D), "dx differs");
        cr_expect(same_bits(g.out[1], cg.out[1], B * S * K), "dgate differs");
        cr_expect(same_bits(g.out[2], eg.out[1], E * D * m->hid), "dw_up differs");
        cr_expect(same_bits(g.out[3], eg.out[2], E * F * D), "dw_down differs");
        rt_result *all[] = {&y, &g, &cnt, &rows, &o, &y2, &cg, &eg, &dx};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            rt_free(all[i]);
        free(m);
    }
}

Test(moe, rows_that_do_not_fit_are_an_error)
{
    experts *m = calloc(1, sizeof *m);
    experts_init(m, PTC_ACT_GELU);
    ptc_attrs pa = ptc_attrs_default(PTC_OP_MOE_PACK);
    pa.len = 10; /* 11 kept choices */
    rt_result r = rt_run(PTC_OP_MOE_PACK, pa, 2, m->it, (void *[]){m->x, m->route});
    cr_expect_eq(r.rc, -1);
    cr_expect(strstr(r.err, "11 kept choices do not fit the 10 rows") != NULL, "%s", r.err);
    rt_free(&r);
    free(m);
}

/* ---- the gate's gradient ---- */

Test(moe, topk_grad_matches_finite_differences)
{
    /* well separated probabilities: a step of 1e-3 changes no choice */
    float p[] = {0.05f, 0.5f, 0.15f, 0.3f, 0.4f, 0.02f, 0.33f, 0.25f};
    float w[] = {0.7f, -1.3f, 0.4f, 2.0f};
    ptc_type it = TY(PTC_F32, 2, 4);
    for (int nz = 0; nz < 2; nz++) {
        ptc_attrs at = ptc_attrs_default(PTC_OP_MOE_TOPK);
        at.top_k = 2;
        at.normalize = nz;
        rt_result r = rt_ok(PTC_OP_MOE_TOPK, at, 1, &it, (void *[]){p});
        ptc_attrs ga = ptc_attrs_default(PTC_OP_MOE_TOPK_GRAD);
        ga.normalize = nz;
        ptc_type gt[] = {it, r.ot[0], r.ot[1]};
        rt_result g = rt_ok(PTC_OP_MOE_TOPK_GRAD, ga, 3, gt, (void *[]){p, r.out[0], w});
        const float *dp = g.out[0];
        for (int i = 0; i < 8; i++) {
            double l[2];
            float p0 = p[i];
            for (int s = 0; s < 2; s++) {
                p[i] = p0 + (s ? -1e-3f : 1e-3f);
                rt_result q = rt_ok(PTC_OP_MOE_TOPK, at, 1, &it, (void *[]){p});
                l[s] = 0;
                for (int j = 0; j < 4; j++)
                    l[s] += (double)w[j] * ((float *)q.out[1])[j];
                rt_free(&q);
            }
            p[i] = p0;
            double num = (l[0] - l[1]) / 2e-3;
            cr_expect(fabs(num - dp[i]) <= 1e-3 + 1e-2 * fabs(dp[i]),
                      "normalize=%d element %d: finite difference %.7g, kernel %.7g", nz, i, num,
                      (double)dp[i]);
        }
        rt_free(&g);
        rt_free(&r);
    }
}

/* ---- moe whole ---- */

Test(moe, whole_op_is_its_pieces)
{
    experts *m = calloc(1, sizeof *m);
    experts_init(m, PTC_ACT_SWIGLU);
    float router[D * E];
    rt_fill(router, D * E, 9, -2, 2);
    ptc_attrs at = ptc_attrs_default(PTC_OP_MOE);
    at.top_k = K;
    at.capacity = 0.5; /* C = ceil(0.5 * 2 * 6 / 3) = 2: some choices are dropped */
    ptc_type wt[] = {m->it[0], TY(PTC_F32, D, E), m->it[3], m->it[4]};
    rt_result whole = rt_ok(PTC_OP_MOE, at, 4, wt, (void *[]){m->x, router, m->up, m->down});

    /* the pieces, in the order the moe pass emits them */
    ptc_type lt = TY(PTC_F32, B, S, E);
    rt_result lg =
        rt_ok(PTC_OP_MATMUL, ptc_attrs_default(PTC_OP_MATMUL), 2, wt, (void *[]){m->x, router});
    ptc_attrs sm = ptc_attrs_default(PTC_OP_SOFTMAX);
    sm.axis = -1;
    rt_result p = rt_ok(PTC_OP_SOFTMAX, sm, 1, &lt, lg.out);
    ptc_attrs tk = ptc_attrs_default(PTC_OP_MOE_TOPK);
    tk.top_k = K;
    rt_result sel = rt_ok(PTC_OP_MOE_TOPK, tk, 1, &lt, p.out);
    ptc_attrs cn = ptc_attrs_default(PTC_OP_MOE_COUNT);
    cn.n = E;
    rt_result c = rt_ok(PTC_OP_MOE_COUNT, cn, 1, sel.ot, sel.out);
    rt_result pt = rt_ok(PTC_OP_MOE_PREFIX, ptc_attrs_default(PTC_OP_MOE_PREFIX), 1, c.ot, c.out);
    ptc_attrs ra = ptc_attrs_default(PTC_OP_MOE_ROUTE);
    ra.capacity = 0.5;
    ptc_type rt3[] = {sel.ot[0], pt.ot[0], pt.ot[1]};
    rt_result route =
        rt_ok(PTC_OP_MOE_ROUTE, ra, 3, rt3, (void *[]){sel.out[0], pt.out[0], pt.out[1]});
    int dropped = 0;
    for (int i = 0; i < B * S * K; i++)
        dropped += ((int32_t *)route.out[0])[i] < 0;
    cr_expect(dropped > 0, "the capacity drops nothing: the test would not test it");
    ptc_type ft[] = {m->it[0], route.ot[0], sel.ot[1], m->it[3], m->it[4]};
    rt_result y = rt_ok(PTC_OP_MOE_FFN, ffn_attrs(PTC_OP_MOE_FFN, PTC_ACT_SWIGLU), 5, ft,
                        (void *[]){m->x, route.out[0], sel.out[1], m->up, m->down});
    cr_expect(same_bits(whole.out[0], y.out[0], B * S * D), "y differs from the pieces'");

    /* aux = E * sum(frac * mean of p over the tokens) */
    rt_result fr =
        rt_ok(PTC_OP_MOE_FRAC, ptc_attrs_default(PTC_OP_MOE_FRAC), 1, &pt.ot[1], &pt.out[1]);
    double aux = 0;
    for (int e = 0; e < E; e++) {
        double mean = 0;
        for (int t = 0; t < B * S; t++)
            mean += ((float *)p.out[0])[t * E + e];
        aux += ((float *)fr.out[0])[e] * (mean / (B * S));
    }
    cr_expect(fabs(((float *)whole.out[1])[0] - E * aux) < 1e-6, "aux %.9g, want %.9g",
              (double)((float *)whole.out[1])[0], E * aux);
    rt_result *all[] = {&whole, &lg, &p, &sel, &c, &pt, &route, &y, &fr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        rt_free(all[i]);
    free(m);
}
