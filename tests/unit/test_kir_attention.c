/* test_kir_attention.c - attention in the kernel IR (codegen/kir_attention.c) and the local
 * arrays it needs:
 *   - the four kernels, run by the interpreter with the parallel-loop contract checked
 *     (ptc_kir_run_checked), against the reference attention and attention_grad (double
 *     precision, the softmax recomputed) on shapes with sizes of 1, odd and prime, causal and
 *     not, grouped-query, and more keys than queries;
 *   - the same kernels compiled through LLVM (the jit backend's emitter), on 3 threads, against
 *     the reference;
 *   - local arrays: the text form round-trips them, the verifier rejects bad ones, a part that
 *     reads what it did not write is named, and the CUDA emitter refuses them in words.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_test.h"
#include "cuda_emit.h"
#include "kernel.h"
#include "kir.h"
#include "kir_attention.h"
#include "ref.h"
#ifdef PTC_TEST_JIT
#include "kjit.h"
#endif

typedef enum { INTERP, JIT } how;

/* kernel k on args: the checked interpreter, or LLVM's code on 3 threads (one after another:
 * the parts are independent, which the checked run holds) */
static void run(const ptc_kir *k, void **args, how h)
{
    char err[1024];
    if (h == INTERP) {
        cr_assert_eq(ptc_kir_run_checked(k, args, err, sizeof err), 0, "%s", err);
        return;
    }
#ifdef PTC_TEST_JIT
    ptc_kfn fn = ptc_kjit_get(k, "", err, sizeof err);
    cr_assert_not_null(fn, "%s", err);
    for (int t = 0; t < 3; t++)
        fn(args, t, 3);
#endif
}

static void check_shape(ptc_kir_attn a, how h)
{
    attn_ref r =
        attn_ref_make(a.batch, a.seq, a.kv_seq, a.heads, a.kv_heads, a.head_dim, a.causal, 0, 0, 0);
    int64_t nq = r.nq, nk = r.nk, ns = r.ns;
    float *q = r.q, *k = r.k, *v = r.v, *dy = r.dy;
    char err[1024];
    ptc_kir *ks[PTC_KIR_ATTN_NKERNELS];
    for (int w = 0; w < PTC_KIR_ATTN_NKERNELS; w++) {
        ks[w] = ptc_kir_attention(&a, (ptc_kir_attn_kernel)w, "at", err, sizeof err);
        cr_assert_not_null(ks[w], "%s", err);
    }
    float *o = calloc((size_t)nq, 4), *dq = calloc((size_t)nq, 4), *dk = calloc((size_t)nk, 4);
    float *dv = calloc((size_t)nk, 4), *lse = calloc((size_t)ns, 4), *ds = calloc((size_t)ns, 4);
    /* (the locals' slots, last, are ignored: NULL) */
    run(ks[PTC_KIR_ATTN_FWD], (void *[]){q, k, v, o, NULL, NULL}, h);
    run(ks[PTC_KIR_ATTN_STATS], (void *[]){q, k, v, dy, lse, ds}, h);
    run(ks[PTC_KIR_ATTN_DQ], (void *[]){q, k, v, dy, lse, ds, dq, NULL}, h);
    run(ks[PTC_KIR_ATTN_DKV], (void *[]){q, k, v, dy, lse, ds, dk, dv, NULL, NULL}, h);
    char what[160];
    snprintf(what, sizeof what, "%s: b%lld s%lld s2%lld h%lld g%lld dh%lld%s",
             h == INTERP ? "interpreter" : "LLVM", (long long)a.batch, (long long)a.seq,
             (long long)a.kv_seq, (long long)a.heads, (long long)a.kv_heads, (long long)a.head_dim,
             a.causal ? " causal" : "");
    attn_ref_expect(&r, o, dq, dk, dv, what);
    for (int w = 0; w < PTC_KIR_ATTN_NKERNELS; w++)
        ptc_kir_free(ks[w]);
    attn_ref_free(&r);
    free(o), free(dq), free(dk), free(dv), free(lse), free(ds);
}

/* clang-format off */
static const ptc_kir_attn shapes[] = {
    /* batch, seq, kv_seq, heads, kv_heads, head_dim, causal */
    {1, 1, 1, 1, 1, 1, true},
    {2, 7, 7, 3, 3, 5, true},
    {2, 13, 13, 4, 2, 8, true},   /* grouped-query */
    {1, 13, 13, 6, 1, 16, false},
    {2, 5, 11, 2, 2, 3, false},   /* more keys than queries */
    {1, 5, 11, 2, 1, 4, true},    /* causal: query i sees keys 0..i */
    {1, 37, 37, 2, 2, 64, true},
};
/* clang-format on */

Test(kir_attention, interpreter_matches_reference)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(shapes[i], INTERP);
}

#ifdef PTC_TEST_JIT
Test(kir_attention, compiled_matches_reference)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(shapes[i], JIT);
}
#endif

Test(kir_attention, shapes_it_cannot_take)
{
    char err[512];
    ptc_kir_attn bad[] = {{1, 4, 4, 3, 2, 8, true},
                          {1, 0, 4, 2, 2, 8, true},
                          {1, 4, 4, 2, 2, PTC_KIR_LOCAL_MAX + 1, true}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_null(ptc_kir_attention(&bad[i], PTC_KIR_ATTN_FWD, "at", err, sizeof err));
        cr_expect(strstr(err, "no kernel for") != NULL, "%s", err);
    }
}

/* the text form keeps a local; the verifier and the checked run hold locals to their rules */
Test(kir_attention, local_arrays)
{
    char err[512];
    ptc_kir_attn a = {2, 7, 7, 3, 3, 5, true};
    ptc_kir *k = ptc_kir_attention(&a, PTC_KIR_ATTN_FWD, "at", err, sizeof err);
    cr_assert_not_null(k, "%s", err);
    char *t1 = NULL, *t2 = NULL;
    size_t n1, n2;
    FILE *f = open_memstream(&t1, &n1);
    ptc_kir_print(k, f);
    fclose(f);
    cr_expect(strstr(t1, "acc: local f32[5]") != NULL, "%s", t1);
    ptc_kir *back = ptc_kir_parse_text(t1, err, sizeof err);
    cr_assert_not_null(back, "%s\n%s", err, t1);
    f = open_memstream(&t2, &n2);
    ptc_kir_print(back, f);
    fclose(f);
    cr_expect_str_eq(t1, t2);
    cr_expect_eq(ptc_kir_hash(k), ptc_kir_hash(back));

    /* CUDA: refused in words (NVRTC would stop at the #error) */
    char *cu = NULL;
    size_t ncu;
    f = open_memstream(&cu, &ncu);
    ptc_cuda_emit_kernel(k, f);
    fclose(f);
    cr_expect(strstr(cu, "#error \"kernel at_fwd: local arrays are not emitted as CUDA yet\"") !=
                  NULL,
              "%s", cu);
    free(cu);
    free(t1);
    free(t2);
    ptc_kir_free(back);
    ptc_kir_free(k);

    static const char *const bad[] = {
        "kernel k(a: local i32[4]) { }",
        "kernel k(a: local f32[0]) { }",
        "kernel k(a: local f32[5000]) { }",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ptc_kir *b = ptc_kir_parse_text(bad[i], err, sizeof err);
        cr_expect_null(b, "accepted: %s", bad[i]);
        cr_expect(strstr(err, "local array 'a'") != NULL, "%s: %s", bad[i], err);
        ptc_kir_free(b);
    }

    /* a part reading a local it did not write: the last part's values do not carry over */
    ptc_kir *c = ptc_kir_parse_text("kernel k(x: f32[4], y: out f32[4], t: local f32[1]) {\n"
                                    "for r < 4 parallel {\n"
                                    "  y[r] = select(r < 1, 0.0, t[0]) + x[r]\n"
                                    "  t[0] = x[r]\n"
                                    "}\n}\n",
                                    err, sizeof err);
    cr_assert_not_null(c, "%s", err);
    float x[4] = {1, 2, 3, 4}, y[4];
    cr_expect_eq(ptc_kir_run_checked(c, (void *[]){x, y, NULL}, err, sizeof err), -1);
    cr_expect(strstr(err, "local 't'[0] is read by iteration r=1 of a parallel loop over 4 before "
                          "it writes it") != NULL,
              "%s", err);
    /* and the plain run gives that read NaN, not the last part's value */
    cr_expect_eq(ptc_kir_run(c, (void *[]){x, y, NULL}, 0, 1, err, sizeof err), 0, "%s", err);
    cr_expect(y[0] == 1.0f && isnan(y[1]), "y = %g %g", y[0], y[1]);
    ptc_kir_free(c);
}
