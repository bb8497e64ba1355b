/* test_comm.c - the in-process communicator: every collective against a serial computation of the
 * same thing (bit for bit: reductions run in group order), groups of a mesh running concurrently,
 * point to point, and the failures: mismatch, timeout (naming who did not come and where it is),
 * abort, invalid arguments. Ranks are threads; they record what happened and the test thread
 * checks it after joining them (Criterion's asserts belong to the test thread). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "half.h"
#include "inproc.h"
#include "util.h"

#define MAXR 8
#define LONG_TIMEOUT 20.0 /* never reached when things work */

static const int SIZES[] = {1, 2, 3, 4, 8};
#define NSIZES (int)(sizeof SIZES / sizeof SIZES[0])

typedef struct rank_ctx rank_ctx;
typedef void (*rank_fn)(rank_ctx *r);
struct rank_ctx {
    ptrt_inproc *c;
    int rank;
    int nranks;
    void *job;
    rank_fn fn;
    int rc;
    char err[1024];
    double seconds; /* how long the rank's calls took */
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&t, NULL);
}

static void *thread_main(void *p)
{
    rank_ctx *r = p;
    double t0 = now();
    r->fn(r);
    r->seconds = now() - t0;
    return NULL;
}

/* Runs fn on ranks 0 .. n-1 of c, one thread each, and waits for all. */
static void run_ranks(ptrt_inproc *c, int n, rank_fn fn, void *job, rank_ctx *ctx)
{
    pthread_t th[64];
    cr_assert(n <= 64);
    for (int r = 0; r < n; r++) {
        ctx[r] = (rank_ctx){.c = c, .rank = r, .nranks = n, .job = job, .fn = fn};
        cr_assert_eq(pthread_create(&th[r], NULL, thread_main, &ctx[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
}

static ptrt_inproc *new_comm(int n, double timeout)
{
    char err[256];
    ptrt_inproc *c = ptrt_inproc_new(n, timeout, err, sizeof err);
    cr_assert_not_null(c, "%s", err);
    return c;
}

static void expect_ok(const rank_ctx *ctx, int n)
{
    for (int r = 0; r < n; r++)
        cr_assert_eq(ctx[r].rc, 0, "rank %d: %s", r, ctx[r].err);
}

static void expect_has(const char *msg, const char *want)
{
    cr_assert(strstr(msg, want), "message '%s' lacks '%s'", msg, want);
}

/* Deterministic test data with a wide range of magnitudes, so that the order of a sum shows in its
 * rounding. */
static float value(uint64_t seed, int rank, int64_t i)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)i * 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float mant = (float)(int64_t)(z % 2000001) / 1e6f - 1.0f;
    return ldexpf(mant, (int)((z >> 40) % 24) - 12);
}

static void fill(float *x, int64_t n, uint64_t seed, int rank)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = value(seed, rank, i);
}

static void iota(int *m, int n, int first)
{
    for (int i = 0; i < n; i++)
        m[i] = first + i;
}

/* Serial reduction of srcs in the given order: the reference the communicator must match bit for
 * bit. */
static void serial_reduce(float *dst, float *const *src, const int *order, int n, int64_t len,
                          ptrt_reduce op)
{
    for (int64_t i = 0; i < len; i++) {
        float acc = src[order[0]][i];
        for (int j = 1; j < n; j++) {
            float v = src[order[j]][i];
            acc = op == PTRT_RED_SUM ? acc + v : (acc > v || isnan(acc) ? acc : v);
        }
        dst[i] = acc;
    }
}

static void expect_same_bits(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        cr_assert(!memcmp(&got[i], &want[i], sizeof(float)), "%s: element %lld is %a, want %a",
                  what, (long long)i, (double)got[i], (double)want[i]);
}

/* ---- allreduce --------------------------------------------------------------------------- */

typedef struct {
    int n;
    int members[MAXR]; /* group order (any permutation of 0 .. n-1) */
    int64_t count;
    ptrt_reduce op;
    bool in_place;
    int rounds; /* repeated, to reuse the group's barrier many times */
    float *in[MAXR], *out[MAXR];
} ar_job;

static void ar_rank(rank_ctx *r)
{
    ar_job *j = r->job;
    for (int round = 0; round < j->rounds && !r->rc; round++) {
        ptrt_coll_desc d = {"dp", round, 0, NULL};
        float *out = j->out[r->rank];
        if (j->in_place)
            memcpy(out, j->in[r->rank], (size_t)j->count * sizeof(float));
        const float *in = j->in_place ? out : j->in[r->rank];
        r->rc = ptrt_inproc_allreduce(r->c, r->rank, j->members, j->n, in, out, j->count, j->op, &d,
                                    r->err, sizeof r->err);
    }
}

/* Runs an allreduce on n ranks; returns every rank's output (caller frees) after checking them
 * against the serial reduction. */
static float *check_allreduce(int n, const int *order, int64_t count, ptrt_reduce op, bool in_place,
                              uint64_t seed)
{
    ar_job j = {.n = n, .count = count, .op = op, .in_place = in_place, .rounds = 3};
    memcpy(j.members, order, (size_t)n * sizeof(int));
    float *all = ptc_xmalloc((size_t)(n * count) * sizeof(float));
    for (int r = 0; r < n; r++) {
        j.in[r] = ptc_xmalloc((size_t)count * sizeof(float));
        j.out[r] = all + r * count;
        fill(j.in[r], count, seed, r);
    }
    ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
    rank_ctx ctx[MAXR];
    run_ranks(c, n, ar_rank, &j, ctx);
    expect_ok(ctx, n);
    float *want = ptc_xmalloc((size_t)count * sizeof(float));
    serial_reduce(want, j.in, order, n, count, op);
    for (int r = 0; r < n; r++)
        expect_same_bits(j.out[r], want, count, "allreduce");
    for (int r = 0; r < n; r++)
        free(j.in[r]);
    free(want);
    ptrt_inproc_free(c);
    return all;
}

Test(comm, allreduce_sum_and_max)
{
    int order[MAXR] = {0};
    for (int s = 0; s < NSIZES; s++) {
        int n = SIZES[s];
        iota(order, n, 0);
        for (int op = 0; op < 2; op++)
            for (int in_place = 0; in_place < 2; in_place++)
                free(check_allreduce(n, order, 1037, (ptrt_reduce)op, in_place, 7));
        free(check_allreduce(n, order, n > 1 ? n - 1 : 0, PTRT_RED_SUM, false, 8)); /* tiny */
    }
}

/* The sum runs in group order, not rank order: [2,0,3,1] gives that order's rounding. */
Test(comm, allreduce_sums_in_group_order)
{
    int order[] = {2, 0, 3, 1};
    free(check_allreduce(4, order, 4099, PTRT_RED_SUM, false, 11));
    /* and the order matters for this data, so the test above can tell */
    float *in[4];
    for (int r = 0; r < 4; r++) {
        in[r] = ptc_xmalloc(4099 * sizeof(float));
        fill(in[r], 4099, 11, r);
    }
    float a[4099], b[4099];
    int sorted[] = {0, 1, 2, 3};
    serial_reduce(a, in, order, 4, 4099, PTRT_RED_SUM);
    serial_reduce(b, in, sorted, 4, 4099, PTRT_RED_SUM);
    cr_assert(memcmp(a, b, sizeof a), "the data does not show the order of the sum");
    for (int r = 0; r < 4; r++)
        free(in[r]);
}

Test(comm, results_repeat_bit_for_bit)
{
    int order[MAXR] = {0};
    iota(order, 8, 0);
    float *a = check_allreduce(8, order, 3001, PTRT_RED_SUM, false, 5);
    float *b = check_allreduce(8, order, 3001, PTRT_RED_SUM, true, 5);
    cr_assert(!memcmp(a, b, 8 * 3001 * sizeof(float)));
    for (int r = 1; r < 8; r++) /* and every member holds the same bits */
        cr_assert(!memcmp(a, a + r * 3001, 3001 * sizeof(float)));
    free(a);
    free(b);
}

/* Reductions that see NaN keep it (max as well as sum), on every member. */
Test(comm, max_propagates_nan)
{
    ar_job j = {.n = 3, .count = 4, .op = PTRT_RED_MAX, .rounds = 1};
    iota(j.members, 3, 0);
    float in[3][4] = {{1, NAN, 3, -1}, {2, 0, NAN, -2}, {0, 5, 1, NAN}}, out[3][4];
    for (int r = 0; r < 3; r++) {
        j.in[r] = in[r];
        j.out[r] = out[r];
    }
    ptrt_inproc *c = new_comm(3, LONG_TIMEOUT);
    rank_ctx ctx[3];
    run_ranks(c, 3, ar_rank, &j, ctx);
    expect_ok(ctx, 3);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(out[r][0], 2.0f);
        cr_assert(isnan(out[r][1]) && isnan(out[r][2]) && isnan(out[r][3]));
    }
    ptrt_inproc_free(c);
}

/* ---- allgather, reduce_scatter, all_to_all: a 3-D tensor sharded along a dimension ---------- */

/* Copies shard k (of n, along dim) of a [s0][s1][s2] tensor into dst (the shard's own layout). */
static void take_shard(float *dst, const float *t, const int64_t *s, int dim, int n, int k)
{
    int64_t lo[3] = {0, 0, 0}, hi[3] = {s[0], s[1], s[2]};
    lo[dim] = s[dim] / n * k;
    hi[dim] = s[dim] / n * (k + 1);
    int64_t o = 0;
    for (int64_t a = lo[0]; a < hi[0]; a++)
        for (int64_t b = lo[1]; b < hi[1]; b++)
            for (int64_t c = lo[2]; c < hi[2]; c++)
                dst[o++] = t[(a * s[1] + b) * s[2] + c];
}

static int64_t numel(const int64_t *s)
{
    return s[0] * s[1] * s[2];
}

typedef struct {
    int n, dim, from, to;
    bool overlap; /* in place: the input inside the output buffer */
    int64_t full[3], local[3], outer, chunk, outer_out, chunk_out;
    float *in[MAXR], *out[MAXR];
} shard_job;

static void allgather_rank(rank_ctx *r)
{
    shard_job *j = r->job;
    int members[MAXR] = {0};
    iota(members, j->n, 0);
    ptrt_coll_desc d = {"tp", 1, 4, NULL};
    r->rc = ptrt_inproc_allgather(r->c, r->rank, members, j->n, j->in[r->rank], j->out[r->rank],
                                j->outer, j->chunk, &d, r->err, sizeof r->err);
}

/* Shard(1) -> Replicate of a [3][2n][5] tensor: every member ends with the whole tensor. */
static void check_allgather(int n, bool in_place)
{
    shard_job j = {.n = n, .dim = 1, .full = {3, 2 * n, 5}};
    float *t = ptc_xmalloc((size_t)numel(j.full) * sizeof(float));
    fill(t, numel(j.full), 21, 0);
    cr_assert_eq(ptrt_comm_split(j.full, 3, 1, n, &j.outer, &j.chunk), 0);
    cr_assert(j.outer == 3 && j.chunk == 10);
    for (int r = 0; r < n; r++) {
        j.out[r] = ptc_xmalloc((size_t)numel(j.full) * sizeof(float));
        /* in place: the input lies inside the output (so they overlap) */
        j.in[r] = in_place ? j.out[r] + r * j.chunk : ptc_xmalloc(60 * sizeof(float));
        take_shard(j.in[r], t, j.full, 1, n, r);
    }
    ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
    rank_ctx ctx[MAXR];
    run_ranks(c, n, allgather_rank, &j, ctx);
    expect_ok(ctx, n);
    for (int r = 0; r < n; r++) {
        expect_same_bits(j.out[r], t, numel(j.full), "allgather");
        if (!in_place)
            free(j.in[r]);
        free(j.out[r]);
    }
    free(t);
    ptrt_inproc_free(c);
}

Test(comm, allgather_middle_dim)
{
    for (int s = 0; s < NSIZES; s++) {
        check_allgather(SIZES[s], false);
        check_allgather(SIZES[s], true);
    }
}

static void reduce_scatter_rank(rank_ctx *r)
{
    shard_job *j = r->job;
    int members[MAXR] = {0};
    iota(members, j->n, 0);
    ptrt_coll_desc d = {"tp", 1, 5, NULL};
    r->rc = ptrt_inproc_reduce_scatter(r->c, r->rank, members, j->n, j->in[r->rank], j->out[r->rank],
                                     j->outer, j->chunk, PTRT_RED_SUM, &d, r->err, sizeof r->err);
}

/* Partial -> Shard(1) of a [3][2n][5] tensor: member k gets shard k of the sum. */
static void check_reduce_scatter(int n, bool in_place)
{
    shard_job j = {.n = n, .dim = 1, .full = {3, 2 * n, 5}};
    int64_t len = numel(j.full), part = len / n;
    cr_assert_eq(ptrt_comm_split(j.full, 3, 1, n, &j.outer, &j.chunk), 0);
    float *keep[MAXR] = {0};
    for (int r = 0; r < n; r++) {
        j.in[r] = ptc_xmalloc((size_t)len * sizeof(float));
        fill(j.in[r], len, 31, r);
        keep[r] = ptc_xmalloc((size_t)len * sizeof(float));
        memcpy(keep[r], j.in[r], (size_t)len * sizeof(float));
        j.out[r] = in_place ? j.in[r] + r * j.chunk : ptc_xmalloc((size_t)part * sizeof(float));
    }
    ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
    rank_ctx ctx[MAXR];
    run_ranks(c, n, reduce_scatter_rank, &j, ctx);
    expect_ok(ctx, n);
    int order[MAXR] = {0};
    iota(order, n, 0);
    float *sum = ptc_xmalloc((size_t)len * sizeof(float));
    float *want = ptc_xmalloc((size_t)part * sizeof(float));
    serial_reduce(sum, keep, order, n, len, PTRT_RED_SUM);
    for (int r = 0; r < n; r++) {
        take_shard(want, sum, j.full, 1, n, r);
        expect_same_bits(j.out[r], want, part, "reduce_scatter");
        if (!in_place)
            free(j.out[r]);
        free(j.in[r]);
        free(keep[r]);
    }
    free(sum);
    free(want);
    ptrt_inproc_free(c);
}

Test(comm, reduce_scatter_middle_dim)
{
    for (int s = 0; s < NSIZES; s++) {
        check_reduce_scatter(SIZES[s], false);
        check_reduce_scatter(SIZES[s], true);
    }
}

static void all_to_all_rank(rank_ctx *r)
{
    shard_job *j = r->job;
    int members[MAXR] = {0};
    iota(members, j->n, 0);
    ptrt_coll_desc d = {"sp", 2, 6, NULL};
    r->rc = ptrt_inproc_all_to_all(r->c, r->rank, members, j->n, j->in[r->rank], j->out[r->rank],
                                 j->outer, j->chunk, j->outer_out, j->chunk_out, &d, r->err,
                                 sizeof r->err);
}

/* Shard(from) -> Shard(to) of a [2n][3n][n+n] tensor equals slicing the whole tensor. */
static void check_all_to_all(int n, int from, int to, bool in_place)
{
    shard_job j = {.n = n, .from = from, .to = to, .full = {2 * n, 3 * n, 2 * n}};
    int64_t len = numel(j.full), part = len / n;
    int64_t in_shape[3], out_shape[3];
    memcpy(in_shape, j.full, sizeof in_shape);
    memcpy(out_shape, j.full, sizeof out_shape);
    in_shape[from] /= n;
    out_shape[to] /= n;
    cr_assert_eq(ptrt_comm_split(in_shape, 3, to, n, &j.outer, &j.chunk), 0);
    cr_assert_eq(ptrt_comm_split(out_shape, 3, from, n, &j.outer_out, &j.chunk_out), 0);
    float *t = ptc_xmalloc((size_t)len * sizeof(float));
    fill(t, len, 41, 0);
    for (int r = 0; r < n; r++) {
        j.in[r] = ptc_xmalloc((size_t)part * sizeof(float));
        j.out[r] = in_place ? j.in[r] : ptc_xmalloc((size_t)part * sizeof(float));
        take_shard(j.in[r], t, j.full, from, n, r);
    }
    ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
    rank_ctx ctx[MAXR];
    run_ranks(c, n, all_to_all_rank, &j, ctx);
    expect_ok(ctx, n);
    float *want = ptc_xmalloc((size_t)part * sizeof(float));
    for (int r = 0; r < n; r++) {
        take_shard(want, t, j.full, to, n, r);
        expect_same_bits(j.out[r], want, part, "all_to_all");
        if (!in_place)
            free(j.out[r]);
        free(j.in[r]);
    }
    free(want);
    free(t);
    ptrt_inproc_free(c);
}

Test(comm, all_to_all_shard0_to_shard1)
{
    for (int s = 0; s < NSIZES; s++)
        check_all_to_all(SIZES[s], 0, 1, false);
}

Test(comm, all_to_all_every_pair_of_dims)
{
    for (int s = 0; s < NSIZES; s++)
        for (int from = 0; from < 3; from++)
            for (int to = 0; to < 3; to++)
                if (from != to)
                    check_all_to_all(SIZES[s], from, to, (from + to) % 2 == 1);
}

/* The worked example in comm.h: [4][6], two members, Shard(0) -> Shard(1). */
Test(comm, all_to_all_header_example)
{
    int64_t in_shape[] = {2, 6}, out_shape[] = {4, 3}, oi, ci, oo, co;
    cr_assert_eq(ptrt_comm_split(in_shape, 2, 1, 2, &oi, &ci), 0);
    cr_assert_eq(ptrt_comm_split(out_shape, 2, 0, 2, &oo, &co), 0);
    cr_assert(oi == 2 && ci == 3 && oo == 1 && co == 6);
    int64_t bad[] = {3, 5};
    cr_assert_eq(ptrt_comm_split(bad, 2, 1, 2, &oi, &ci), -1);
    cr_assert_eq(ptrt_comm_split(bad, 2, 2, 1, &oi, &ci), -1);
}

/* ---- a mesh: row and column groups running concurrently ----------------------------------- */

typedef struct {
    int rows, cols, iters, count;
    float *got[MAXR]; /* per rank: iters * (rows * count) gathered floats */
} mesh_job;

static void mesh_rank(rank_ctx *r)
{
    mesh_job *j = r->job;
    int row = r->rank / j->cols, col = r->rank % j->cols;
    int rowm[MAXR] = {0}, colm[MAXR] = {0};
    iota(rowm, j->cols, row * j->cols);
    for (int i = 0; i < j->rows; i++)
        colm[i] = i * j->cols + col;
    float *v = ptc_xmalloc((size_t)j->count * sizeof(float));
    for (int it = 0; it < j->iters && !r->rc; it++) {
        ptrt_coll_desc tp = {"tp", it, 2 * it, NULL}, dp = {"dp", it, 2 * it + 1, NULL};
        float *g = j->got[r->rank] + (int64_t)it * j->rows * j->count;
        fill(v, j->count, (uint64_t)it, r->rank);
        /* the row sum, then gathered down the column: but odd ranks first do an unrelated
         * column barrier, so the two groups' collectives interleave differently on each rank */
        if (r->rank % 2)
            r->rc = ptrt_inproc_barrier(r->c, r->rank, colm, j->rows, &dp, r->err, sizeof r->err);
        else
            r->rc = 0;
        if (!r->rc)
            r->rc = ptrt_inproc_allreduce(r->c, r->rank, rowm, j->cols, v, v, j->count, PTRT_RED_SUM,
                                        &tp, r->err, sizeof r->err);
        if (!r->rc && r->rank % 2 == 0)
            r->rc = ptrt_inproc_barrier(r->c, r->rank, colm, j->rows, &dp, r->err, sizeof r->err);
        if (!r->rc)
            r->rc = ptrt_inproc_allgather(r->c, r->rank, colm, j->rows, v, g, 1, j->count, &dp,
                                        r->err, sizeof r->err);
    }
    free(v);
}

static void check_mesh(int rows, int cols)
{
    mesh_job j = {.rows = rows, .cols = cols, .iters = 40, .count = 97};
    int n = rows * cols;
    int64_t per = (int64_t)j.iters * rows * j.count;
    for (int r = 0; r < n; r++)
        j.got[r] = ptc_xmalloc((size_t)per * sizeof(float));
    ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
    rank_ctx ctx[MAXR];
    run_ranks(c, n, mesh_rank, &j, ctx);
    expect_ok(ctx, n);
    float *in[MAXR] = {0}, *want = ptc_xmalloc((size_t)per * sizeof(float));
    for (int r = 0; r < n; r++)
        in[r] = ptc_xmalloc((size_t)j.count * sizeof(float));
    for (int it = 0; it < j.iters; it++) {
        for (int r = 0; r < n; r++)
            fill(in[r], j.count, (uint64_t)it, r);
        for (int row = 0; row < rows; row++) {
            int order[MAXR] = {0};
            iota(order, cols, row * cols);
            serial_reduce(want + ((int64_t)it * rows + row) * j.count, in, order, cols, j.count,
                          PTRT_RED_SUM);
        }
    }
    for (int r = 0; r < n; r++) { /* every rank of a column gathered the same rows: all of them */
        expect_same_bits(j.got[r], want, per, "mesh");
        free(j.got[r]);
        free(in[r]);
    }
    free(want);
    ptrt_inproc_free(c);
}

Test(comm, mesh_groups_interleave)
{
    check_mesh(2, 2);
    check_mesh(2, 4);
    check_mesh(4, 2);
}

/* Every pair of 8 ranks is a group (28 groups: the group table grows); each rank visits its pairs
 * in one global order, so nothing waits in a cycle. */
static void pairs_rank(rank_ctx *r)
{
    for (int a = 0; a < 8 && !r->rc; a++) {
        for (int b = a + 1; b < 8 && !r->rc; b++) {
            if (r->rank != a && r->rank != b)
                continue;
            int m[2] = {a, b};
            float x = (float)r->rank, y;
            r->rc = ptrt_inproc_allreduce(r->c, r->rank, m, 2, &x, &y, 1, PTRT_RED_SUM, NULL, r->err,
                                        sizeof r->err);
            if (!r->rc && y != (float)(a + b))
                r->rc = 1;
        }
    }
}

Test(comm, many_groups)
{
    ptrt_inproc *c = new_comm(8, LONG_TIMEOUT);
    rank_ctx ctx[8];
    run_ranks(c, 8, pairs_rank, NULL, ctx);
    expect_ok(ctx, 8);
    ptrt_inproc_free(c);
}

/* ---- send / recv --------------------------------------------------------------------------- */

static void ring_rank(rank_ctx *r)
{
    int n = r->nranks, next = (r->rank + 1) % n, prev = (r->rank + n - 1) % n;
    float buf[64], got[64];
    for (int round = 0; round < 20 && !r->rc; round += 2) {
        /* two sends before the receives: sends are buffered, and arrive in order */
        for (int k = 0; k < 2 && !r->rc; k++) {
            ptrt_coll_desc d = {"pp", round + k, round + k, NULL};
            fill(buf, 10 + round + k, (uint64_t)(round + k), r->rank);
            r->rc =
                ptrt_inproc_send(r->c, r->rank, next, buf, 10 + round + k, &d, r->err, sizeof r->err);
        }
        for (int k = 0; k < 2 && !r->rc; k++) {
            ptrt_coll_desc d = {"pp", round + k, 100 + round + k, NULL};
            r->rc =
                ptrt_inproc_recv(r->c, r->rank, prev, got, 10 + round + k, &d, r->err, sizeof r->err);
            fill(buf, 10 + round + k, (uint64_t)(round + k), prev);
            if (!r->rc && memcmp(buf, got, (size_t)(10 + round + k) * sizeof(float)))
                r->rc = 2;
        }
    }
}

Test(comm, send_recv_ring)
{
    for (int s = 0; s < NSIZES; s++) {
        int n = SIZES[s];
        ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
        rank_ctx ctx[MAXR];
        run_ranks(c, n, ring_rank, NULL, ctx);
        expect_ok(ctx, n);
        ptrt_inproc_free(c);
    }
}

static void p2p_mismatch_rank(rank_ctx *r)
{
    float buf[16] = {0};
    if (r->rank == 0) {
        ptrt_coll_desc d = {"pp", 3, 7, NULL};
        r->rc = ptrt_inproc_send(r->c, 0, 1, buf, 16, &d, r->err, sizeof r->err);
    } else {
        ptrt_coll_desc d = {"pp", 3, 9, NULL};
        r->rc = ptrt_inproc_recv(r->c, 1, 0, buf, 12, &d, r->err, sizeof r->err);
    }
}

Test(comm, recv_count_mismatch)
{
    ptrt_inproc *c = new_comm(2, LONG_TIMEOUT);
    rank_ctx ctx[2];
    run_ranks(c, 2, p2p_mismatch_rank, NULL, ctx);
    cr_assert_eq(ctx[0].rc, 0, "%s", ctx[0].err); /* the send had gone before */
    cr_assert_eq(ctx[1].rc, -1);
    cr_assert_str_eq(ctx[1].err, "rank 1: send/recv mismatch: rank 0 called send to rank 1 on "
                                 "group pp (collective #7, step 3) with count 16 but rank 1 "
                                 "called recv from rank 0 on group pp (collective #9, step 3) "
                                 "with count 12");
    /* the sender learns at its next call */
    char err[1024];
    float x = 0;
    cr_assert_eq(ptrt_inproc_send(c, 0, 1, &x, 1, NULL, err, sizeof err), -1);
    expect_has(err, "failed: rank 1: send/recv mismatch");
    ptrt_inproc_free(c);
}

/* ---- failures -------------------------------------------------------------------------------- */

static void mismatch_rank(rank_ctx *r)
{
    int m[4] = {0, 1, 2, 3};
    float *in = ptc_xcalloc(4096, sizeof(float)), *out = ptc_xcalloc(4 * 4096, sizeof(float));
    ptrt_coll_desc d = {"tp", 3, 12, NULL};
    if (r->rank == 2)
        r->rc = ptrt_inproc_allgather(r->c, 2, m, 4, in, out, 1, 4096, &d, r->err, sizeof r->err);
    else
        r->rc = ptrt_inproc_allreduce(r->c, r->rank, m, 4, in, out, 4096, PTRT_RED_SUM, &d, r->err,
                                    sizeof r->err);
    free(in);
    free(out);
}

Test(comm, mismatch_names_both)
{
    ptrt_inproc *c = new_comm(4, LONG_TIMEOUT);
    rank_ctx ctx[4];
    run_ranks(c, 4, mismatch_rank, NULL, ctx);
    const char *tail = "collective mismatch on group tp [0,1,2,3] at step 3: rank 2 called "
                       "allgather(outer 1, chunk 4096) but rank 0 called allreduce(count 4096, "
                       "sum)";
    for (int r = 0; r < 4; r++) {
        char want[512];
        snprintf(want, sizeof want, "rank %d: %s", r, tail);
        cr_assert_eq(ctx[r].rc, -1);
        cr_assert_str_eq(ctx[r].err, want);
    }
    /* poisoned: later calls fail at once with the reason */
    char err[1024];
    int m[1] = {0};
    cr_assert_eq(ptrt_inproc_barrier(c, 0, m, 1, NULL, err, sizeof err), -1);
    expect_has(err, "rank 0: barrier on group [0] failed: rank ");
    expect_has(err, tail);
    cr_assert(ptrt_inproc_failed(c, err, sizeof err));
    expect_has(err, tail);
    ptrt_inproc_free(c);
}

typedef struct {
    int variant;
} mm_job;

/* Members 0 and 1 disagree on one thing: 0 count, 1 step, 2 member order, 3 op. */
static void mismatch2_rank(rank_ctx *r)
{
    int v = ((mm_job *)r->job)->variant, odd = r->rank == 1;
    int m[2] = {0, 1}, rev[2] = {1, 0};
    float in[8] = {0}, out[8];
    ptrt_coll_desc d = {"dp", v == 1 && odd ? 5 : 4, 0, NULL};
    r->rc = ptrt_inproc_allreduce(r->c, r->rank, v == 2 && odd ? rev : m, 2, in, out,
                                v == 0 && odd ? 7 : 8, v == 3 && odd ? PTRT_RED_MAX : PTRT_RED_SUM,
                                &d, r->err, sizeof r->err);
}

Test(comm, mismatch_of_each_kind)
{
    const char *want[] = {"rank 1 called allreduce(count 7, sum) but rank 0 called "
                          "allreduce(count 8, sum)",
                          "rank 1 called allreduce(count 8, sum) at step 5 but rank 0 called "
                          "allreduce(count 8, sum) at step 4",
                          "with members [1,0]", "rank 1 called allreduce(count 8, max)"};
    for (int v = 0; v < 4; v++) {
        mm_job j = {v};
        ptrt_inproc *c = new_comm(2, LONG_TIMEOUT);
        rank_ctx ctx[2];
        run_ranks(c, 2, mismatch2_rank, &j, ctx);
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(ctx[r].rc, -1, "variant %d rank %d", v, r);
            expect_has(ctx[r].err, "collective mismatch on group dp");
            if (v != 2) /* with different orders each rank compares with its own member 0 */
                expect_has(ctx[r].err, want[v]);
        }
        if (v == 2)
            expect_has(ctx[0].err, want[v]);
        ptrt_inproc_free(c);
    }
}

typedef struct {
    int absent;     /* this rank does not call (until the others have given up) */
    double delay_s; /* some ranks start late */
    int late;
} timeout_job;

static void timeout_rank(rank_ctx *r)
{
    timeout_job *j = r->job;
    if (r->rank < 4 || r->rank == j->absent)
        return;
    int m[4] = {4, 5, 6, 7};
    float x[3] = {1, 2, 3};
    ptrt_coll_desc d = {"tp", 3, 12, NULL};
    r->rc =
        ptrt_inproc_allreduce(r->c, r->rank, m, 4, x, x, 3, PTRT_RED_SUM, &d, r->err, sizeof r->err);
}

Test(comm, timeout_names_the_missing_rank)
{
    timeout_job j = {.absent = 6};
    ptrt_inproc *c = new_comm(8, 0.2);
    rank_ctx ctx[8];
    double t0 = now();
    run_ranks(c, 8, timeout_rank, &j, ctx);
    cr_assert_lt(now() - t0, 3.0);
    int own = 0;
    for (int r = 4; r < 8; r++) {
        if (r == 6)
            continue;
        cr_assert_eq(ctx[r].rc, -1);
        expect_has(ctx[r].err, "timeout after 0.2 s in allreduce on group tp [4,5,6,7] "
                               "(collective #12, step 3): ranks 4, 5, 7 arrived; rank 6 did not "
                               "(rank 6 is in no communicator call)");
        char head[64];
        snprintf(head, sizeof head, "rank %d: timeout after", r);
        own += strncmp(ctx[r].err, head, strlen(head)) == 0;
    }
    cr_assert_geq(own, 1, "no rank reported its own timeout");
    /* the late rank fails at once, with the original reason */
    char err[1024];
    int m[4] = {4, 5, 6, 7};
    float x[3] = {0};
    ptrt_coll_desc d = {"tp", 3, 12, NULL};
    t0 = now();
    cr_assert_eq(ptrt_inproc_allreduce(c, 6, m, 4, x, x, 3, PTRT_RED_SUM, &d, err, sizeof err), -1);
    cr_assert_lt(now() - t0, 0.1);
    expect_has(err, "rank 6: allreduce on group tp [4,5,6,7] (collective #12, step 3) failed: "
                    "rank ");
    expect_has(err, "rank 6 did not");
    ptrt_inproc_free(c);
}

/* Rank 0 waits for rank 1 in their row; rank 1 waits in its column for rank 3, who never comes.
 * Rank 0's timeout says where rank 1 is. Rank 1 starts 0.1 s late, so rank 0 gives up first. */
static void deadlock_rank(rank_ctx *r)
{
    float x = 1;
    if (r->rank == 0) {
        int row[2] = {0, 1};
        ptrt_coll_desc d = {"tp", 0, 3, NULL};
        r->rc = ptrt_inproc_allreduce(r->c, 0, row, 2, &x, &x, 1, PTRT_RED_SUM, &d, r->err,
                                    sizeof r->err);
    } else if (r->rank == 1) {
        sleep_s(0.1);
        int col[2] = {1, 3};
        ptrt_coll_desc d = {"dp", 0, 1, NULL};
        r->rc = ptrt_inproc_allreduce(r->c, 1, col, 2, &x, &x, 1, PTRT_RED_SUM, &d, r->err,
                                    sizeof r->err);
    }
}

Test(comm, timeout_says_where_the_missing_rank_waits)
{
    ptrt_inproc *c = new_comm(4, 0.2);
    rank_ctx ctx[4];
    run_ranks(c, 4, deadlock_rank, NULL, ctx);
    cr_assert_eq(ctx[0].rc, -1);
    cr_assert_eq(ctx[1].rc, -1);
    cr_assert_str_eq(ctx[0].err, "rank 0: timeout after 0.2 s in allreduce on group tp [0,1] "
                                 "(collective #3, step 0): rank 0 arrived; rank 1 did not (rank 1 "
                                 "is waiting in allreduce on group dp [1,3] (collective #1, step "
                                 "0))");
    expect_has(ctx[1].err, "rank 1: allreduce on group dp [1,3] (collective #1, step 0) failed: "
                           "rank 0: timeout");
    ptrt_inproc_free(c);
}

static void recv_timeout_rank(rank_ctx *r)
{
    float x;
    if (r->rank == 1) {
        ptrt_coll_desc d = {"pp", 2, 5, NULL};
        r->rc = ptrt_inproc_recv(r->c, 1, 0, &x, 1, &d, r->err, sizeof r->err);
    }
}

Test(comm, recv_timeout)
{
    ptrt_inproc *c = new_comm(2, 0.2);
    rank_ctx ctx[2];
    run_ranks(c, 2, recv_timeout_rank, NULL, ctx);
    cr_assert_eq(ctx[1].rc, -1);
    cr_assert_str_eq(ctx[1].err, "rank 1: timeout after 0.2 s in recv from rank 0 on group pp "
                                 "(collective #5, step 2): nothing arrived from rank 0 (0 "
                                 "received before; rank 0 is in no communicator call)");
    ptrt_inproc_free(c);
}

/* Rank 3 fails; the others wait in an allreduce, a barrier and a recv, with a long timeout. */
static void abort_rank(rank_ctx *r)
{
    int m[4] = {0, 1, 2, 3}, pair[2] = {0, 1};
    float x[2] = {0};
    ptrt_coll_desc d = {"dp", 9, 1, NULL};
    if (r->rank == 3) {
        sleep_s(0.05);
        ptrt_inproc_abort(r->c, 3, "out of memory in matmul");
    } else if (r->rank == 2) {
        r->rc = ptrt_inproc_recv(r->c, 2, 3, x, 2, &d, r->err, sizeof r->err);
    } else if (r->rank == 1) {
        r->rc = ptrt_inproc_barrier(r->c, 1, pair, 2, &d, r->err, sizeof r->err);
        if (!r->rc) /* with rank 0, then the group of all four */
            r->rc = ptrt_inproc_allreduce(r->c, 1, m, 4, x, x, 2, PTRT_RED_SUM, &d, r->err,
                                        sizeof r->err);
    } else {
        r->rc = ptrt_inproc_barrier(r->c, 0, pair, 2, &d, r->err, sizeof r->err);
        if (!r->rc)
            r->rc = ptrt_inproc_allreduce(r->c, 0, m, 4, x, x, 2, PTRT_RED_SUM, &d, r->err,
                                        sizeof r->err);
    }
}

Test(comm, abort_wakes_the_others)
{
    ptrt_inproc *c = new_comm(4, LONG_TIMEOUT);
    rank_ctx ctx[4];
    run_ranks(c, 4, abort_rank, NULL, ctx);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(ctx[r].rc, -1, "rank %d", r);
        expect_has(ctx[r].err, "failed: aborted: rank 3 failed: out of memory in matmul");
        cr_assert_lt(ctx[r].seconds, 2.0, "rank %d took %.2f s", r, ctx[r].seconds);
    }
    expect_has(ctx[0].err, "rank 0: allreduce on group dp [0,1,2,3] (collective #1, step 9)");
    expect_has(ctx[2].err, "rank 2: recv from rank 3 on group dp (collective #1, step 9)");
    ptrt_inproc_abort(c, 1, "second"); /* the first reason stays */
    char why[256];
    cr_assert(ptrt_inproc_failed(c, why, sizeof why));
    cr_assert_str_eq(why, "aborted: rank 3 failed: out of memory in matmul");
    ptrt_inproc_free(c);
}

/* Bad arguments fail at once (and fail the communicator, since the others would wait for them). */
Test(comm, invalid_arguments)
{
    char err[512];
    cr_assert_null(ptrt_inproc_new(0, 1.0, err, sizeof err));
    expect_has(err, "0 ranks");
    cr_assert_null(ptrt_inproc_new(2, 0.0, err, sizeof err));
    expect_has(err, "timeout 0 s");
    cr_assert_null(ptrt_inproc_new(2, NAN, err, sizeof err));

    struct {
        int me, n, members[3];
        int64_t oi, ci, oo, co;
        const char *want;
    } cases[] = {
        {0, 2, {1, 2}, 1, 1, 1, 1, "rank 0: all_to_all on group t [1,2]: rank 0 is not a member"},
        {0, 2, {0, 0}, 1, 1, 1, 1, "member 0 appears twice"},
        {0, 2, {0, 5}, 1, 1, 1, 1, "member 5 is not in 0..3"},
        {7, 2, {0, 1}, 1, 1, 1, 1, "rank 7 is not in 0..3"},
        {0, 0, {0}, 1, 1, 1, 1, "a group has 1..4 members, not 0"},
        {0,
         2,
         {0, 1},
         2,
         3,
         1,
         5,
         "outer_in * chunk_in (2 x 3) differs from outer_out * "
         "chunk_out (1 x 5)"},
        {0, 2, {0, 1}, -1, 3, -1, 3, "negative size -1"},
        {0, 2, {0, 1}, INT64_MAX / 2, 3, INT64_MAX / 2, 3, "sizes overflow"},
    };
    float buf[64] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ptrt_inproc *c = new_comm(4, LONG_TIMEOUT);
        ptrt_coll_desc d = {"t", -1, -1, NULL};
        int rc = ptrt_inproc_all_to_all(c, cases[i].me, cases[i].members, cases[i].n, buf, buf,
                                      cases[i].oi, cases[i].ci, cases[i].oo, cases[i].co, &d, err,
                                      sizeof err);
        cr_assert_eq(rc, -1, "case %zu", i);
        expect_has(err, cases[i].want);
        cr_assert(ptrt_inproc_failed(c, NULL, 0));
        ptrt_inproc_free(c);
    }
    ptrt_inproc *c = new_comm(2, LONG_TIMEOUT);
    cr_assert_eq(ptrt_inproc_send(c, 0, 2, buf, 1, NULL, err, sizeof err), -1);
    cr_assert_str_eq(err, "rank 0: send to rank 2: peer 2 is not in 0..1");
    ptrt_inproc_free(c);
    c = new_comm(2, LONG_TIMEOUT);
    int m[2] = {0, 1};
    cr_assert_eq(ptrt_inproc_allreduce(c, 0, m, 2, NULL, buf, 4, PTRT_RED_SUM, NULL, err, sizeof err),
                 -1);
    expect_has(err, "a buffer is NULL");
    ptrt_inproc_free(c);
}

/* One rank: every collective is a copy (or nothing), and messages to oneself work. */
Test(comm, single_rank)
{
    ptrt_inproc *c = new_comm(1, LONG_TIMEOUT);
    char err[256];
    int m[1] = {0};
    float in[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0};
    cr_assert_eq(ptrt_inproc_allreduce(c, 0, m, 1, in, out, 6, PTRT_RED_SUM, NULL, err, sizeof err),
                 0, "%s", err);
    cr_assert(!memcmp(in, out, sizeof in));
    cr_assert_eq(
        ptrt_inproc_allreduce(c, 0, m, 1, NULL, NULL, 0, PTRT_RED_MAX, NULL, err, sizeof err), 0,
        "%s", err);
    cr_assert_eq(ptrt_inproc_all_to_all(c, 0, m, 1, in, out, 2, 3, 1, 6, NULL, err, sizeof err), 0,
                 "%s", err);
    cr_assert(!memcmp(in, out, sizeof in));
    cr_assert_eq(ptrt_inproc_barrier(c, 0, m, 1, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ptrt_inproc_send(c, 0, 0, in, 6, NULL, err, sizeof err), 0, "%s", err);
    memset(out, 0, sizeof out);
    cr_assert_eq(ptrt_inproc_recv(c, 0, 0, out, 6, NULL, err, sizeof err), 0, "%s", err);
    cr_assert(!memcmp(in, out, sizeof in));
    cr_assert_eq(ptrt_inproc_send(c, 0, 0, in, 6, NULL, err, sizeof err), 0);
    cr_assert_not(ptrt_inproc_failed(c, NULL, 0));
    ptrt_inproc_free(c); /* with a message never received */
}

/* ---- dtypes ---- */

#define DTN 37 /* elements: an odd count, so 16-bit buffers end mid-word */

typedef struct dt_job {
    ptc_dtype dt;
    uint16_t in[MAXR][DTN], out[MAXR][DTN * MAXR];
    int32_t iin[MAXR][DTN], iout[MAXR][DTN * MAXR];
} dt_job;

static uint16_t enc(ptc_dtype dt, double x)
{
    return dt == PTC_BF16 ? ptc_bf16_bits(x) : ptc_f16_bits(x);
}

static float dec(ptc_dtype dt, uint16_t u)
{
    return dt == PTC_BF16 ? ptc_bf16_value(u) : ptc_f16_value(u);
}

static void dt_allreduce(rank_ctx *r)
{
    dt_job *j = r->job;
    int m[MAXR];
    iota(m, r->nranks, 0);
    r->rc = ptrt_inproc_allreduce_dt(r->c, r->rank, m, r->nranks, j->in[r->rank], j->out[r->rank],
                                     DTN, j->dt, PTRT_RED_SUM, NULL, r->err, sizeof r->err);
}

/* 16-bit sums: every member's values widened, added in float in group order, rounded once. */
Test(comm, sixteen_bit_allreduce_rounds_once)
{
    ptc_dtype dts[] = {PTC_BF16, PTC_F16};
    for (int k = 0; k < 2; k++) {
        int n = 3;
        dt_job j;
        memset(&j, 0, sizeof j);
        j.dt = dts[k];
        for (int r = 0; r < n; r++)
            for (int i = 0; i < DTN; i++)
                j.in[r][i] = enc(j.dt, (1 + 0.01 * i) * (r == 1 ? -0.7 : 1.3));
        ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
        rank_ctx ctx[MAXR];
        run_ranks(c, n, dt_allreduce, &j, ctx);
        expect_ok(ctx, n);
        for (int i = 0; i < DTN; i++) {
            float acc = dec(j.dt, j.in[0][i]);
            for (int r = 1; r < n; r++)
                acc += dec(j.dt, j.in[r][i]);
            for (int r = 0; r < n; r++)
                cr_expect_eq(j.out[r][i], enc(j.dt, acc), "%s element %d rank %d",
                             ptc_dtype_name(j.dt), i, r);
        }
        ptrt_inproc_free(c);
    }
}

static void dt_gather(rank_ctx *r)
{
    dt_job *j = r->job;
    int m[MAXR];
    iota(m, r->nranks, 0);
    if (j->dt == PTC_I32)
        r->rc = ptrt_inproc_allgather_dt(r->c, r->rank, m, r->nranks, j->iin[r->rank],
                                         j->iout[r->rank], 1, DTN, j->dt, NULL, r->err,
                                         sizeof r->err);
    else
        r->rc = ptrt_inproc_allgather_dt(r->c, r->rank, m, r->nranks, j->in[r->rank],
                                         j->out[r->rank], 1, DTN, j->dt, NULL, r->err,
                                         sizeof r->err);
}

/* Gathers move 2- and 4-byte elements as they are. */
Test(comm, gathers_move_every_dtype)
{
    ptc_dtype dts[] = {PTC_BF16, PTC_F16, PTC_I32};
    for (int k = 0; k < 3; k++) {
        int n = 4;
        dt_job j;
        memset(&j, 0, sizeof j);
        j.dt = dts[k];
        for (int r = 0; r < n; r++)
            for (int i = 0; i < DTN; i++) {
                j.in[r][i] = (uint16_t)(1000 * r + i);
                j.iin[r][i] = 100000 * r - i;
            }
        ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
        rank_ctx ctx[MAXR];
        run_ranks(c, n, dt_gather, &j, ctx);
        expect_ok(ctx, n);
        for (int r = 0; r < n; r++)
            for (int q = 0; q < n; q++)
                for (int i = 0; i < DTN; i++) {
                    if (j.dt == PTC_I32)
                        cr_expect_eq(j.iout[r][q * DTN + i], j.iin[q][i]);
                    else
                        cr_expect_eq(j.out[r][q * DTN + i], j.in[q][i]);
                }
        ptrt_inproc_free(c);
    }
}

static void dt_mixed(rank_ctx *r)
{
    dt_job *j = r->job;
    int m[MAXR];
    iota(m, r->nranks, 0);
    ptc_dtype dt = r->rank == 0 ? PTC_BF16 : PTC_F16;
    r->rc = ptrt_inproc_allgather_dt(r->c, r->rank, m, r->nranks, j->in[r->rank], j->out[r->rank],
                                     1, DTN, dt, NULL, r->err, sizeof r->err);
}

static void dt_int_sum(rank_ctx *r)
{
    dt_job *j = r->job;
    int m[MAXR];
    iota(m, r->nranks, 0);
    r->rc = ptrt_inproc_allreduce_dt(r->c, r->rank, m, r->nranks, j->iin[r->rank], j->iout[r->rank],
                                     DTN, PTC_I32, PTRT_RED_SUM, NULL, r->err, sizeof r->err);
}

/* Members that disagree on the dtype fail with both named; integers cannot be reduced. */
Test(comm, dtype_mismatches_and_integer_reductions_fail)
{
    dt_job j;
    memset(&j, 0, sizeof j);
    ptrt_inproc *c = new_comm(2, LONG_TIMEOUT);
    rank_ctx ctx[MAXR];
    run_ranks(c, 2, dt_mixed, &j, ctx);
    cr_expect_eq(ctx[0].rc, -1);
    expect_has(ctx[0].err, "of bf16");
    expect_has(ctx[0].err, "of f16");
    ptrt_inproc_free(c);
    c = new_comm(2, LONG_TIMEOUT);
    run_ranks(c, 2, dt_int_sum, &j, ctx);
    cr_expect_eq(ctx[0].rc, -1);
    expect_has(ctx[0].err, "cannot reduce i32 data");
    ptrt_inproc_free(c);
}

static void dt_p2p(rank_ctx *r)
{
    dt_job *j = r->job;
    if (r->rank == 0)
        r->rc = ptrt_inproc_send_dt(r->c, 0, 1, j->in[0], DTN, PTC_F16, NULL, r->err,
                                    sizeof r->err);
    else
        r->rc = ptrt_inproc_recv_dt(r->c, 1, 0, j->out[1], DTN, PTC_F16, NULL, r->err,
                                    sizeof r->err);
}

Test(comm, sixteen_bit_messages)
{
    dt_job j;
    memset(&j, 0, sizeof j);
    for (int i = 0; i < DTN; i++)
        j.in[0][i] = enc(PTC_F16, i * 0.125);
    ptrt_inproc *c = new_comm(2, LONG_TIMEOUT);
    rank_ctx ctx[MAXR];
    run_ranks(c, 2, dt_p2p, &j, ctx);
    expect_ok(ctx, 2);
    cr_expect(memcmp(j.out[1], j.in[0], DTN * 2) == 0);
    ptrt_inproc_free(c);
}

/* ---- all-to-all with uneven counts (expert parallelism) ---- */

/* Rank r sends s(r, q) = (r + 2 q) % 3 elements to rank q (some zero), each element naming its
 * source and position, through the communicator interface (comm.h) as the executor calls it. */
static int64_t uneven_count(int r, int q)
{
    return (r + 2 * q) % 3;
}

static void uneven_rank(rank_ctx *r)
{
    int n = r->nranks, members[MAXR];
    iota(members, n, 0);
    int64_t sc[MAXR], so[MAXR], rc[MAXR], ro[MAXR], in_len = 0, out_len = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = uneven_count(r->rank, q);
        rc[q] = uneven_count(q, r->rank);
        so[q] = in_len;
        ro[q] = out_len;
        in_len += sc[q];
        out_len += rc[q];
    }
    int32_t in[3 * MAXR], out[3 * MAXR + 1];
    for (int q = 0; q < n; q++)
        for (int64_t k = 0; k < sc[q]; k++)
            in[so[q] + k] = 100 * r->rank + 10 * q + (int32_t)k;
    out[out_len] = -7; /* one element past the parts: must keep its value */
    ptrt_comm *c = ptrt_inproc_comm(r->c);
    r->rc = c->ops->all_to_all_v(c->impl, r->rank, members, n, in, sc, so, in_len, out, rc, ro,
                                 out_len + 1, PTC_I32, NULL, r->err, sizeof r->err);
    for (int q = 0; q < n && !r->rc; q++)
        for (int64_t k = 0; k < rc[q]; k++)
            if (out[ro[q] + k] != 100 * q + 10 * r->rank + k) {
                snprintf(r->err, sizeof r->err, "element %lld from rank %d is %d", (long long)k, q,
                         out[ro[q] + k]);
                r->rc = -1;
            }
    if (!r->rc && out[out_len] != -7) {
        snprintf(r->err, sizeof r->err, "the element past the parts changed");
        r->rc = -1;
    }
}

Test(comm, all_to_all_v_uneven_counts)
{
    for (int si = 0; si < NSIZES; si++) {
        int n = SIZES[si];
        ptrt_inproc *c = new_comm(n, LONG_TIMEOUT);
        rank_ctx ctx[MAXR];
        run_ranks(c, n, uneven_rank, NULL, ctx);
        expect_ok(ctx, n);
        ptrt_inproc_free(c);
    }
}

/* Rank 1 expects one element more from rank 0 than rank 0 sends: every member fails, naming
 * both ranks and both counts. */
static void uneven_mismatch_rank(rank_ctx *r)
{
    int members[2] = {0, 1};
    float in[4] = {1, 2, 3, 4}, out[4];
    int64_t sc[2] = {1, 1}, so[2] = {0, 1}, rc[2] = {1, 1}, ro[2] = {0, 1};
    if (r->rank == 1)
        rc[0] = 2, ro[1] = 2;
    r->rc = ptrt_inproc_all_to_all_v_dt(r->c, r->rank, members, 2, in, sc, so, 4, out, rc, ro, 4,
                                        PTC_F32, NULL, r->err, sizeof r->err);
}

Test(comm, all_to_all_v_count_mismatch)
{
    ptrt_inproc *c = new_comm(2, LONG_TIMEOUT);
    rank_ctx ctx[2];
    run_ranks(c, 2, uneven_mismatch_rank, NULL, ctx);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(ctx[r].rc, -1, "rank %d succeeded", r);
        expect_has(ctx[r].err, "rank 0 sends 1 elements to rank 1, which expects 2");
    }
    ptrt_inproc_free(c);
}

static void uneven_outside_rank(rank_ctx *r)
{
    int members[1] = {0};
    float in[2] = {1, 2}, out[2];
    int64_t sc[1] = {3}, so[1] = {0}, rc[1] = {3}, ro[1] = {0};
    r->rc = ptrt_inproc_all_to_all_v_dt(r->c, r->rank, members, 1, in, sc, so, 2, out, rc, ro, 2,
                                        PTC_F32, NULL, r->err, sizeof r->err);
}

Test(comm, all_to_all_v_part_outside_its_buffer)
{
    ptrt_inproc *c = new_comm(1, LONG_TIMEOUT);
    rank_ctx ctx[1];
    run_ranks(c, 1, uneven_outside_rank, NULL, ctx);
    cr_assert_eq(ctx[0].rc, -1);
    expect_has(ctx[0].err, "part 0 of all_to_all_v lies outside its buffer");
    ptrt_inproc_free(c);
}
