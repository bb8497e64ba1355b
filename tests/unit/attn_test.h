/* attn_test.h - the reference side of the attention kernels' tests (test_cuda: the CUDA C
 * kernels, emulated; test_kir_attention: the kernel IR's): random inputs, the reference attention
 * and attention_grad on them (double precision, the softmax recomputed), and the comparison. */
#ifndef PTC_TEST_ATTN_TEST_H
#define PTC_TEST_ATTN_TEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "half.h"
#include "kernel.h"
#include "ref.h"

static inline float *random_floats(int64_t n, unsigned seed)
{
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    srand(seed);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    return x;
}

/* got within tol of want's largest magnitude (and 1e-6) */
static inline void expect_within(const float *got, const float *want, int64_t n, const char *what,
                                 double tol)
{
    double big = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        big = fabs(want[i]) > big ? fabs(want[i]) : big;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        worst = d > worst || d != d ? d : worst;
    }
    cr_expect(worst <= tol * big + 1e-6, "%s: off by %g (largest value %g)", what, worst, big);
}

static inline void expect_close(const float *got, const float *want, int64_t n, const char *what)
{
    expect_within(got, want, n, what, 1e-5);
}

/* q [B,S,H*dh], k and v [B,S2,G*dh], dy like q (random, seeds 1 to 4), and the reference's o,
 * dq, dk, dv for them; ratio > 0: the attention_shard of coordinate h0 / heads, the kv heads
 * shared by ratio query heads in the full model; mma PTC_BF16 or PTC_F16: the inputs are values of
 * that type (a 16-bit plan's), and the results are held to FlashAttention-2's rounding of the
 * probabilities and their gradients to it (6e-3 of the largest in bf16, 1.5e-3 in f16; 1e-5
 * otherwise) */
typedef struct attn_ref {
    int64_t nq, nk, ns; /* elements of q (and o, dy, dq), of k (v, dk, dv), rows (lse) */
    float *q, *k, *v, *dy, *o, *dq, *dk, *dv;
    double tol;
} attn_ref;

static inline void round_floats(float *x, int64_t n, int dtype)
{
    for (int64_t i = 0; dtype && i < n; i++)
        x[i] = (float)(dtype == PTC_BF16 ? ptc_round_bf16(x[i]) : ptc_round_f16(x[i]));
}

static inline attn_ref attn_ref_make(int64_t batch, int64_t seq, int64_t kv_seq, int64_t heads,
                                     int64_t kv_heads, int64_t head_dim, bool causal, int64_t ratio,
                                     int64_t h0, int mma)
{
    attn_ref r;
    int64_t qf = heads * head_dim, kf = kv_heads * head_dim;
    r.nq = batch * seq * qf;
    r.nk = batch * kv_seq * kf;
    r.ns = batch * heads * seq;
    r.q = random_floats(r.nq, 1), r.k = random_floats(r.nk, 2), r.v = random_floats(r.nk, 3);
    r.dy = random_floats(r.nq, 4);
    round_floats(r.q, r.nq, mma), round_floats(r.k, r.nk, mma), round_floats(r.v, r.nk, mma);
    round_floats(r.dy, r.nq, mma);
    r.tol = mma == PTC_BF16 ? 6e-3 : mma ? 1.5e-3 : 1e-5;
    r.o = malloc((size_t)r.nq * 4), r.dq = malloc((size_t)r.nq * 4);
    r.dk = malloc((size_t)r.nk * 4), r.dv = malloc((size_t)r.nk * 4);
    ptc_type tq = {PTC_F32, 3, {batch, seq, qf}}, tk = {PTC_F32, 3, {batch, kv_seq, kf}};
    ptrt_kcall n = {.op = ratio ? PTC_OP_ATTENTION_SHARD : PTC_OP_ATTENTION, .nin = 3, .nout = 1};
    n.attrs.heads = heads;
    n.attrs.kv_heads = kv_heads;
    n.attrs.causal = causal;
    if (ratio) {
        n.attrs.n = ratio * kv_heads;
        n.coord = (int)(h0 / heads);
    }
    char err[512];
    ptc_type it[4] = {tq, tk, tk, tq}, ot[3] = {tq, tk, tk};
    cr_assert_eq(
        ptrt_ref_run(&n, it, (void *[]){r.q, r.k, r.v}, ot, (void *[]){r.o}, err, sizeof err), 0,
        "%s", err);
    n.op = ratio ? PTC_OP_ATTENTION_SHARD_GRAD : PTC_OP_ATTENTION_GRAD;
    n.nin = 4;
    n.nout = 3;
    cr_assert_eq(ptrt_ref_run(&n, it, (void *[]){r.q, r.k, r.v, r.dy}, ot,
                              (void *[]){r.dq, r.dk, r.dv}, err, sizeof err),
                 0, "%s", err);
    return r;
}

/* o, dq, dk, dv against the reference's; what names the case */
static inline void attn_ref_expect(const attn_ref *r, const float *o, const float *dq,
                                   const float *dk, const float *dv, const char *what)
{
    char w[256];
    snprintf(w, sizeof w, "%s: o", what);
    expect_within(o, r->o, r->nq, w, r->tol);
    snprintf(w, sizeof w, "%s: dq", what);
    expect_within(dq, r->dq, r->nq, w, r->tol);
    snprintf(w, sizeof w, "%s: dk", what);
    expect_within(dk, r->dk, r->nk, w, r->tol);
    snprintf(w, sizeof w, "%s: dv", what);
    expect_within(dv, r->dv, r->nk, w, r->tol);
}

static inline void attn_ref_free(attn_ref *r)
{
    free(r->q), free(r->k), free(r->v), free(r->dy);
    free(r->o), free(r->dq), free(r->dk), free(r->dv);
}

#endif
