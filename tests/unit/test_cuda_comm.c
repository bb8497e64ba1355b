/* test_cuda_comm.c - the GPU communicators without a GPU, on the emulated GPUs (--device
 * cuda-emulated's driver and NCCL): the NCCL communicator and the device communicator (all ranks
 * on one GPU), each called directly from rank threads with device buffers and held to the
 * in-process communicator on host copies of the same data. (Split from test_cuda.c, which holds
 * the kernels.) The tests skip, saying why, where a C compiler is missing.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_test.h"
#include "cuda.h"
#include "cuda_emit.h"
#include "backend.h"
#include "cpu.h"
#include "cudalib.h"
#include "exec.h"
#include "kernel.h"
#include "ref.h"
#include "frontend.h"
#include "half.h"
#include "inproc.h"
#include "nccl_comm.h"
#include "passes.h"
#include "plan.h"
#include "planner.h"

TestSuite(cuda_comm, .timeout = 600);

static bool have_cc(void) /* (the emulated GPU builds the units it loads with cc) */
{
    return system("cc --version >/dev/null 2>&1") == 0;
}

/* ---- NCCL (emulated) against the in-process communicator ----
 *
 * The NCCL communicator (runtime/backend/cuda/nccl_comm.c) of a dp=2,tp=2 plan on 4 emulated
 * GPUs, called directly by 4 rank threads with device buffers, against the in-process
 * communicator on host copies of the same data: allreduce (sum, max), allgather and
 * reduce_scatter of parts interleaved in blocks (the strided packing around NCCL), all_to_all
 * and all_to_all_v, on the group of the plan's first collective. */

typedef struct ncase {
    ptrt_comm *nc, *ip;
    const int *members;
    int n, rank, fails;
} ncase;

static float *dev_floats(int64_t n, const float *host)
{
    void *d = ptrt_backend_cuda_emulated.alloc((size_t)n * 4);
    cr_assert_not_null(d);
    ptrt_backend_cuda_emulated.upload(d, host, (size_t)n * 4);
    return d;
}

static int same_as_host(const void *dev, const float *want, int64_t n, const char *what, int rank)
{
    float *got = malloc((size_t)n * 4);
    ptrt_backend_cuda_emulated.download(got, dev, (size_t)n * 4);
    int bad = 0;
    for (int64_t i = 0; i < n && !bad; i++)
        if (fabsf(got[i] - want[i]) > 1e-5f * (1 + fabsf(want[i]))) {
            fprintf(stderr, "rank %d: %s element %lld: nccl %g, in-process %g\n", rank, what,
                    (long long)i, got[i], want[i]);
            bad = 1;
        }
    free(got);
    return bad;
}

static void *nccl_rank(void *arg)
{
    ncase *c = arg;
    char err[512];
    cr_assert_eq(ptrt_backend_cuda_emulated.bind(c->rank, err, sizeof err), 0, "%s", err);
    int n = c->n, me = c->rank;
    const int64_t outer = 3, chunk = 5, part = outer * chunk;
    float *x = random_floats(n * part, 100 + (unsigned)me), *h = malloc(sizeof(float) * (size_t)(n * part));
    float *dx = dev_floats(n * part, x), *dy = dev_floats(n * part, x);
    /* allreduce, sum and max */
    for (int op = 0; op < 2; op++) {
        ptrt_reduce red = op ? PTRT_RED_MAX : PTRT_RED_SUM;
        cr_assert_eq(c->ip->ops->allreduce(c->ip->impl, me, c->members, n, x, h, n * part,
                                           PTC_F32, red, NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(c->nc->ops->allreduce(c->nc->impl, me, c->members, n, dx, dy, n * part,
                                           PTC_F32, red, NULL, err, sizeof err), 0, "%s", err);
        ptrt_backend_cuda_emulated.sync(err, sizeof err);
        c->fails += same_as_host(dy, h, n * part, op ? "allreduce max" : "allreduce", me);
    }
    /* allgather and reduce_scatter of parts in blocks */
    cr_assert_eq(c->ip->ops->allgather(c->ip->impl, me, c->members, n, x, h, outer, chunk, PTC_F32,
                                       NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c->nc->ops->allgather(c->nc->impl, me, c->members, n, dx, dy, outer, chunk,
                                       PTC_F32, NULL, err, sizeof err), 0, "%s", err);
    c->fails += same_as_host(dy, h, n * part, "allgather", me);
    cr_assert_eq(c->ip->ops->reduce_scatter(c->ip->impl, me, c->members, n, x, h, outer, chunk,
                                            PTC_F32, PTRT_RED_SUM, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c->nc->ops->reduce_scatter(c->nc->impl, me, c->members, n, dx, dy, outer, chunk,
                                            PTC_F32, PTRT_RED_SUM, NULL, err, sizeof err), 0, "%s", err);
    c->fails += same_as_host(dy, h, part, "reduce_scatter", me);
    /* all_to_all: n parts of (outer 3, chunk 5) to n parts of (outer 5, chunk 3) */
    cr_assert_eq(c->ip->ops->all_to_all(c->ip->impl, me, c->members, n, x, h, outer, chunk, chunk,
                                        outer, PTC_F32, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c->nc->ops->all_to_all(c->nc->impl, me, c->members, n, dx, dy, outer, chunk,
                                        chunk, outer, PTC_F32, NULL, err, sizeof err), 0, "%s", err);
    c->fails += same_as_host(dy, h, n * part, "all_to_all", me);
    /* all_to_all_v: member i sends i + j + 1 elements to member j */
    int64_t sc[8], so[8], rc[8], ro[8], s = 0, r = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = me + j + 1, so[j] = s, s += sc[j];
        rc[j] = j + me + 1, ro[j] = r, r += rc[j];
    }
    for (int64_t i = 0; i < n * part; i++)
        h[i] = -1;
    float *hv = malloc(sizeof(float) * (size_t)(n * part));
    memcpy(hv, h, sizeof(float) * (size_t)(n * part));
    ptrt_backend_cuda_emulated.upload(dy, h, (size_t)(n * part) * 4);
    cr_assert_eq(c->ip->ops->all_to_all_v(c->ip->impl, me, c->members, n, x, sc, so, n * part, hv,
                                          rc, ro, n * part, PTC_F32, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c->nc->ops->all_to_all_v(c->nc->impl, me, c->members, n, dx, sc, so, n * part,
                                          dy, rc, ro, n * part, PTC_F32, NULL, err, sizeof err), 0, "%s", err);
    c->fails += same_as_host(dy, hv, r, "all_to_all_v", me);
    ptrt_backend_cuda_emulated.free(dx, 0);
    ptrt_backend_cuda_emulated.free(dy, 0);
    free(x), free(h), free(hv);
    return NULL;
}

Test(cuda_comm, nccl_communicator_emulated)
{
    if (!have_cc())
        cr_skip_test("no C compiler (cc) to build the emulation with");
    setenv("PTC_CUDA_EMULATED_GPUS", "4", 1); /* (this test's own process) */
    char path[512], err[2048];
    snprintf(path, sizeof path, "%s/examples/gpt2_tiny.ptm", PTC_SOURCE_DIR);
    size_t len;
    char *src = ptc_read_file(path, &len);
    ptc_diag d;
    ptc_diag_init(&d, stderr, "gpt2_tiny.ptm", src, len);
    ptc_frontend_opts fo = {0};
    ptc_graph *g = ptc_frontend_compile("gpt2_tiny.ptm", src, len, &fo, &d);
    ptc_compile_opts co = {.train = true, .seq_parallel = true};
    co.mesh.naxes = 2;
    snprintf(co.mesh.names[0], sizeof co.mesh.names[0], "dp");
    snprintf(co.mesh.names[1], sizeof co.mesh.names[1], "tp");
    co.mesh.sizes[0] = co.mesh.sizes[1] = 2;
    ptc_pass_ctx ctx = {.g = g, .opts = &co, .err = err, .errn = sizeof err};
    cr_assert_eq(ptc_run_passes(&ctx), 0, "%s", err);
    ptc_pass_ctx_free(&ctx);
    ptc_lower_opts lo = {.fuse = true};
    ptc_plan *p = ptc_lower(ctx.g, &lo, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    cr_assert_eq(p->nranks, 4);
    ptrt_inproc *ip = ptrt_inproc_new(4, 30, err, sizeof err);
    bool failed = false;
    ptrt_ncclc *nc = ptrt_nccl_new(p, &ptrt_backend_cuda_emulated, ptrt_inproc_comm(ip), 0, 4,
                                   &failed, err, sizeof err);
    cr_assert_not_null(nc, "%s", err);
    /* the group of the first collective of rank 0's program, and each rank's own */
    const ptc_program *pg = &p->programs[p->rank_program[0]];
    unsigned axes = 0;
    for (int i = 0; i < pg->ninstrs && !axes; i++)
        if (pg->instrs[i].kind == PTC_INSTR_COLL)
            axes = pg->instrs[i].coll.axes;
    cr_assert_neq(axes, 0u);
    int members[4][4];
    ncase cs[4];
    pthread_t th[4];
    for (int r = 0; r < 4; r++) {
        int n = ptc_plan_group(&p->mesh, r, axes, members[r]);
        cs[r] = (ncase){ptrt_nccl_comm(nc), ptrt_inproc_comm(ip), members[r], n, r, 0};
        pthread_create(&th[r], NULL, nccl_rank, &cs[r]);
    }
    int fails = 0;
    for (int r = 0; r < 4; r++) {
        pthread_join(th[r], NULL);
        fails += cs[r].fails;
    }
    cr_expect_eq(fails, 0, "%d results differ from the in-process communicator's", fails);
    ptrt_nccl_free(nc);
    ptrt_inproc_free(ip);
    ptc_plan_free(p);
    ptc_graph_free(ctx.g);
    free(src);
}

/* ---- the device communicator (emulated) against the in-process communicator ----
 *
 * Four ranks on one emulated GPU, each a thread, call the device communicator (inproc.h,
 * ptrt_inproc_new_on: the in-process communicator over GPU memory, its reductions a kernel of
 * the comm unit) with device buffers, and the host communicator with host copies of the same
 * data: the results must be the same bytes (the same reduction order), in f32, bf16 and f16,
 * with NaN in max, in place and with overlapping buffers (device temporaries), for every layout
 * of all_to_all's strided copies, all_to_all_v, and buffered sends between the ranks. */

#define DC_RANKS 4

typedef struct dcase {
    ptrt_comm *dc, *ip;
    int rank, fails;
} dcase;

static const ptrt_backend *const emu_be = &ptrt_backend_cuda_emulated;

/* n elements of dt from seed (NaN at one place of rank 2's, for max) */
static void *dc_data(int64_t n, ptc_dtype dt, unsigned seed, bool nan)
{
    float *f = random_floats(n, seed);
    if (nan && n > 3)
        f[3] = NAN;
    if (dt == PTC_F32)
        return f;
    uint16_t *h = malloc((size_t)n * 2 + 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == PTC_BF16 ? ptc_bf16_bits(f[i]) : ptc_f16_bits(f[i]);
    free(f);
    return h;
}

static void *dc_dev(const void *host, size_t bytes)
{
    void *d = emu_be->alloc(bytes ? bytes : 1);
    cr_assert_not_null(d);
    if (host)
        emu_be->upload(d, host, bytes);
    return d;
}

static int dc_same(const void *dev, const void *want, size_t bytes, const char *what, int rank)
{
    unsigned char *got = malloc(bytes + 1);
    emu_be->download(got, dev, bytes);
    int bad = memcmp(got, want, bytes) != 0;
    if (bad) {
        size_t i = 0;
        while (i < bytes && got[i] == ((const unsigned char *)want)[i])
            i++;
        fprintf(stderr, "rank %d: %s: byte %zu differs (device %02x, host %02x)\n", rank, what, i,
                got[i], ((const unsigned char *)want)[i]);
    }
    free(got);
    return bad;
}

static void *dc_rank(void *arg)
{
    dcase *c = arg;
    char err[512];
    int me = c->rank, n = DC_RANKS, members[DC_RANKS] = {0, 1, 2, 3};
    cr_assert_eq(emu_be->bind(me, err, sizeof err), 0, "%s", err);
    static const ptc_dtype dts[] = {PTC_F32, PTC_BF16, PTC_F16};
    for (int t = 0; t < 3; t++) {
        ptc_dtype dt = dts[t];
        size_t es = (size_t)ptc_dtype_size(dt);
        const int64_t total = 4 * 3 * 5; /* n parts of (outer 3, chunk 5) */
        void *x = dc_data(total, dt, 7 + (unsigned)me * 31 + (unsigned)t, me == 2);
        void *h = malloc(total * es), *dx = dc_dev(x, total * es), *dy = dc_dev(NULL, total * es);
        char what[64];
        /* allreduce: sum and max, out of place, in place, and into an overlapping buffer */
        for (int op = 0; op < 2; op++) {
            ptrt_reduce red = op ? PTRT_RED_MAX : PTRT_RED_SUM;
            snprintf(what, sizeof what, "allreduce %s %s", op ? "max" : "sum", ptc_dtype_name(dt));
            cr_assert_eq(c->ip->ops->allreduce(c->ip->impl, me, members, n, x, h, total, dt, red,
                                               NULL, err, sizeof err), 0, "%s", err);
            cr_assert_eq(c->dc->ops->allreduce(c->dc->impl, me, members, n, dx, dy, total, dt,
                                               red, NULL, err, sizeof err), 0, "%s", err);
            c->fails += dc_same(dy, h, total * es, what, me);
        }
        emu_be->upload(dy, x, total * es);
        cr_assert_eq(c->dc->ops->allreduce(c->dc->impl, me, members, n, dy, dy, total, dt,
                                           PTRT_RED_SUM, NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(c->ip->ops->allreduce(c->ip->impl, me, members, n, x, h, total, dt,
                                           PTRT_RED_SUM, NULL, err, sizeof err), 0, "%s", err);
        c->fails += dc_same(dy, h, total * es, "allreduce in place", me);
        /* overlapping: in = dy[0 .. 40), out = dy[8 .. 48) */
        emu_be->upload(dy, x, total * es);
        memcpy(h, x, total * es);
        cr_assert_eq(c->ip->ops->allreduce(c->ip->impl, me, members, n, h, (char *)h + 8 * es, 40,
                                           dt, PTRT_RED_SUM, NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(c->dc->ops->allreduce(c->dc->impl, me, members, n, dy, (char *)dy + 8 * es,
                                           40, dt, PTRT_RED_SUM, NULL, err, sizeof err), 0, "%s", err);
        c->fails += dc_same(dy, h, 48 * es, "allreduce overlapping", me);
        /* allgather and reduce_scatter of parts in blocks (outer 3, chunk 5) */
        cr_assert_eq(c->ip->ops->allgather(c->ip->impl, me, members, n, x, h, 3, 5, dt, NULL, err,
                                           sizeof err), 0, "%s", err);
        cr_assert_eq(c->dc->ops->allgather(c->dc->impl, me, members, n, dx, dy, 3, 5, dt, NULL,
                                           err, sizeof err), 0, "%s", err);
        c->fails += dc_same(dy, h, total * es, "allgather", me);
        cr_assert_eq(c->ip->ops->reduce_scatter(c->ip->impl, me, members, n, x, h, 3, 5, dt,
                                                PTRT_RED_SUM, NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(c->dc->ops->reduce_scatter(c->dc->impl, me, members, n, dx, dy, 3, 5, dt,
                                                PTRT_RED_SUM, NULL, err, sizeof err), 0, "%s", err);
        c->fails += dc_same(dy, h, 15 * es, "reduce_scatter", me);
        /* all_to_all: (outer_in, chunk_in) -> (outer_out, chunk_out) of every kind of copy:
         * equal chunks, a destination row of whole source rows, a source row of whole
         * destination rows, and neither (run by run) */
        static const int64_t shapes[][4] = {{3, 5, 3, 5}, {5, 3, 1, 15}, {1, 15, 5, 3}, {3, 5, 5, 3}};
        for (int s = 0; s < 4; s++) {
            const int64_t *q = shapes[s];
            snprintf(what, sizeof what, "all_to_all (%lld,%lld)->(%lld,%lld) %s", (long long)q[0],
                     (long long)q[1], (long long)q[2], (long long)q[3], ptc_dtype_name(dt));
            cr_assert_eq(c->ip->ops->all_to_all(c->ip->impl, me, members, n, x, h, q[0], q[1],
                                                q[2], q[3], dt, NULL, err, sizeof err), 0, "%s", err);
            cr_assert_eq(c->dc->ops->all_to_all(c->dc->impl, me, members, n, dx, dy, q[0], q[1],
                                                q[2], q[3], dt, NULL, err, sizeof err), 0, "%s", err);
            c->fails += dc_same(dy, h, total * es, what, me);
        }
        /* all_to_all_v: member i sends i + j + 1 elements to member j; the rest of out keeps
         * its bytes */
        int64_t sc[DC_RANKS], so[DC_RANKS], rc[DC_RANKS], ro[DC_RANKS], so_far = 0, r = 0;
        for (int j = 0; j < n; j++) {
            sc[j] = me + j + 1, so[j] = so_far, so_far += sc[j];
            rc[j] = j + me + 1, ro[j] = r, r += rc[j];
        }
        memset(h, 0x5a, total * es);
        emu_be->upload(dy, h, total * es);
        cr_assert_eq(c->ip->ops->all_to_all_v(c->ip->impl, me, members, n, x, sc, so, total, h, rc,
                                              ro, total, dt, NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(c->dc->ops->all_to_all_v(c->dc->impl, me, members, n, dx, sc, so, total, dy,
                                              rc, ro, total, dt, NULL, err, sizeof err), 0, "%s", err);
        c->fails += dc_same(dy, h, total * es, "all_to_all_v", me);
        /* buffered sends: each rank sends to the next before it receives from the previous */
        int next = (me + 1) % n, prev = (me + n - 1) % n;
        cr_assert_eq(c->dc->ops->send(c->dc->impl, me, next, dx, 17, dt, NULL, err, sizeof err), 0,
                     "%s", err);
        emu_be->upload(dx, h, total * es); /* (the message holds its own copy) */
        cr_assert_eq(c->ip->ops->send(c->ip->impl, me, next, x, 17, dt, NULL, err, sizeof err), 0,
                     "%s", err);
        cr_assert_eq(c->dc->ops->recv(c->dc->impl, me, prev, dy, 17, dt, NULL, err, sizeof err), 0,
                     "%s", err);
        cr_assert_eq(c->ip->ops->recv(c->ip->impl, me, prev, h, 17, dt, NULL, err, sizeof err), 0,
                     "%s", err);
        c->fails += dc_same(dy, h, 17 * es, "send/recv", me);
        cr_assert_eq(emu_be->sync(err, sizeof err), 0, "%s", err);
        emu_be->free(dx, 0);
        emu_be->free(dy, 0);
        free(x), free(h);
    }
    return NULL;
}

/* The identity record that decides whether NCCL serves (nccl_comm.c): a function of (ok, host,
 * bus id) alone, whatever the memory held before: bytes left from the stack after the text once
 * made two ranks on one GPU look apart under ASan, and chose NCCL for them. A host name too long
 * for the record is cut and ends inside it. */
Test(cuda_comm, nccl_identity_is_its_fields_alone)
{
    enum { W = PTRT_NCCL_ID_WORDS };
    int32_t a[W + 1], b[W + 1];
    memset(a, 0xAA, sizeof a);
    memset(b, 0x55, sizeof b);
    ptrt_nccl_identity(a, true, "node7", "0000:19:00.0");
    ptrt_nccl_identity(b, true, "node7", "0000:19:00.0");
    cr_expect(memcmp(a, b, W * 4) == 0, "the same fields, different records");
    cr_expect(a[W] == (int32_t)0xAAAAAAAA && b[W] == 0x55555555, "written past the record");
    ptrt_nccl_identity(b, true, "node7", "0000:1a:00.0");
    cr_expect(memcmp(a, b, W * 4) != 0, "another GPU, the same record");
    ptrt_nccl_identity(b, false, "node7", "0000:19:00.0");
    cr_expect(memcmp(a, b, W * 4) != 0, "a process without NCCL, the same record");
    char host[200];
    memset(host, 'h', sizeof host - 1);
    host[sizeof host - 1] = '\0';
    ptrt_nccl_identity(b, true, host, "0000:19:00.0");
    cr_expect(b[W] == 0x55555555 && memchr(b + 1, '\0', (W - 1) * 4) != NULL,
              "a long host name overran the record");
}

Test(cuda_comm, device_communicator_emulated)
{
    if (!have_cc())
        cr_skip_test("no C compiler (cc) to build the emulation with");
    setenv("PTC_CUDA_EMULATED_GPUS", "1", 1); /* (this test's own process) */
    char err[1024];
    ptrt_inproc *hc = ptrt_inproc_new_on(2, 30, &ptrt_backend_cpu, err, sizeof err);
    cr_expect(hc && !ptrt_inproc_comm(hc)->device, "a host backend gives the host communicator");
    ptrt_inproc_free(hc);
    ptrt_inproc *ip = ptrt_inproc_new(DC_RANKS, 30, err, sizeof err);
    ptrt_inproc *dv = ptrt_inproc_new_on(DC_RANKS, 30, emu_be, err, sizeof err);
    cr_assert(ip && dv, "%s", err);
    cr_expect(ptrt_inproc_comm(dv)->device);
    cr_expect(!ptrt_inproc_comm(ip)->device);
    dcase cs[DC_RANKS];
    pthread_t th[DC_RANKS];
    for (int r = 0; r < DC_RANKS; r++) {
        cs[r] = (dcase){ptrt_inproc_comm(dv), ptrt_inproc_comm(ip), r, 0};
        pthread_create(&th[r], NULL, dc_rank, &cs[r]);
    }
    int fails = 0;
    for (int r = 0; r < DC_RANKS; r++) {
        pthread_join(th[r], NULL);
        fails += cs[r].fails;
    }
    cr_expect_eq(fails, 0, "%d results differ from the in-process communicator's", fails);
    cr_expect_eq(ptrt_cuda_gpu_count(), 1);
    ptrt_inproc_free(dv);
    ptrt_inproc_free(ip);
}
