/* nccl_comm.c - collectives of ranks on distinct GPUs through NCCL (see nccl_comm.h). */
#include "nccl_comm.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda.h"
#include "cudalib.h"
#include "staged.h"
#include "util.h"

typedef struct group {
    unsigned axes;
    int *members; /* this rank's group on those axes */
    int n;
    void *comm;
} group;

typedef struct rank_state {
    group *groups;
    int ngroups;
    void *scratch; /* device memory of the rank's GPU */
    size_t scratch_bytes;
    /* the rank's NCCL calls go on a stream of their own: it waits for ev_in, recorded on the
     * default stream (the kernels before the call); the call's done event ev[k] is its token
     * k + 1, which the default stream waits for at once (a call complete on return) or when the
     * executor asks (one finishing in the background) */
    void *stream, *ev_in;
    void **ev;
    int nev, issued; /* events made; tokens issued since the last wait for all */
    /* the bucket: small allreduces in the background of one group, dtype and op, gathered
     * (packed on the default stream when it is sent) into one NCCL call on one of two buffers
     * in turn, each result copied out on the collectives' stream; items[] wait to be sent */
    char *bucket[2];
    size_t bucket_bytes, used;
    int turn;
    void *turn_ev[2]; /* the last send from each buffer (NULL: none yet) */
    struct bitem {
        const void *in;
        void *out;
        size_t bytes, at;
        int token;
    } *items;
    int nitems, capitems;
    const struct group *bg;
    ptc_dtype bdt;
    ptrt_reduce bop;
    int64_t bucketed, sends; /* allreduces gathered, and NCCL calls made of them */
} rank_state;

/* allreduces of at most ITEM_BYTES go into buckets of at most BUCKET_BYTES */
#define ITEM_BYTES ((size_t)256 << 10)
#define BUCKET_BYTES ((size_t)4 << 20)

struct ptrt_ncclc {
    ptrt_comm comm;
    ptrt_comm *host;
    ptrt_staged *p2p; /* point to point through host memory */
    const ptrt_backend *be;
    const ptrt_nccl *nc;
    const ptrt_cuda_driver *d;
    int nranks;
    rank_state *r;
};

static int nccl_dtype(ptc_dtype dt)
{
    return dt == PTC_BF16 ? PTRT_NCCL_BFLOAT16
           : dt == PTC_F16 ? PTRT_NCCL_FLOAT16
           : dt == PTC_I32 ? PTRT_NCCL_INT32
                           : PTRT_NCCL_FLOAT32;
}

static int nccl_op(ptrt_reduce op)
{
    return op == PTRT_RED_MAX ? PTRT_NCCL_MAX : PTRT_NCCL_SUM;
}

/* the communicator of me's group members[0..n) (matched by the member list) */
static const group *group_of(const ptrt_ncclc *c, int me, const int *members, int n)
{
    const rank_state *r = &c->r[me];
    for (int g = 0; g < r->ngroups; g++)
        if (r->groups[g].n == n && !memcmp(r->groups[g].members, members, sizeof(int) * (size_t)n))
            return &r->groups[g];
    return NULL;
}

static int fail(const ptrt_ncclc *c, int me, const char *what, const ptrt_coll_desc *d, int rc,
                char *err, size_t errn)
{
    ptc_fmt(err, errn, "rank %d: NCCL %s on group %s (step %lld): %s", me, what,
            d && d->group_name ? d->group_name : "?", d ? (long long)d->step : -1LL,
            c->nc->ncclGetErrorString(rc));
    return -1;
}

static int no_group(int me, const char *what, char *err, size_t errn)
{
    ptc_fmt(err, errn, "rank %d: %s on a group no NCCL communicator was made for", me, what);
    return -1;
}

/* the driver's failure rc at call, as the call's error */
static int drv_fail(const ptrt_ncclc *c, int me, const char *call, int rc, char *err, size_t errn)
{
    const char *s = NULL;
    if (c->d->cuGetErrorString(rc, &s) != 0 || !s)
        s = "unknown error";
    ptc_fmt(err, errn, "rank %d: %s: %s (%d)", me, call, s, rc);
    return -1;
}

/* before an NCCL call of rank me: its stream waits for the default stream's work so far */
static int enter(const ptrt_ncclc *c, int me, char *err, size_t errn)
{
    const rank_state *s = &c->r[me];
    int rc = c->d->cuEventRecord(s->ev_in, NULL);
    if (!rc)
        rc = c->d->cuStreamWaitEvent(s->stream, s->ev_in, 0);
    return rc ? drv_fail(c, me, "ordering a collective after the kernels", rc, err, errn) : 0;
}

/* the next token's event (made where there is none yet) */
static void *next_event(ptrt_ncclc *c, int me, char *err, size_t errn)
{
    rank_state *s = &c->r[me];
    int rc = 0;
    if (s->issued == s->nev) {
        int had = s->nev;
        PTC_GROW(s->ev, s->nev, s->issued);
        for (int k = had; k < s->nev && !rc; k++)
            if ((rc = c->d->cuEventCreate(&s->ev[k], PTRT_CU_EVENT_DISABLE_TIMING)))
                s->ev[k] = NULL;
        if (rc) {
            drv_fail(c, me, "cuEventCreate", rc, err, errn);
            return NULL;
        }
    }
    return s->ev[s->issued++];
}

/* the bucket's items as one NCCL call: packed on the default stream into the buffer whose turn
 * it is (once its previous send is done), reduced in place on the collectives' stream, each
 * result copied out there, then each item's event recorded */
static int send_bucket(ptrt_ncclc *c, int me, char *err, size_t errn)
{
    rank_state *s = &c->r[me];
    if (!s->nitems)
        return 0;
    const ptrt_cuda_driver *d = c->d;
    char *buf = s->bucket[s->turn];
    int rc = s->turn_ev[s->turn] ? d->cuStreamWaitEvent(NULL, s->turn_ev[s->turn], 0) : 0;
    for (int k = 0; k < s->nitems && !rc; k++)
        rc = d->cuMemcpyDtoD((ptrt_cudev)(uintptr_t)(buf + s->items[k].at),
                             (ptrt_cudev)(uintptr_t)s->items[k].in, s->items[k].bytes);
    if (rc)
        return drv_fail(c, me, "packing a bucket", rc, err, errn);
    if (enter(c, me, err, errn) < 0)
        return -1;
    size_t es = (size_t)ptc_dtype_size(s->bdt), last = s->items[s->nitems - 1].at +
                                                       s->items[s->nitems - 1].bytes;
    rc = c->nc->ncclAllReduce(buf, buf, last / es, nccl_dtype(s->bdt),
                              nccl_op(s->bop), s->bg->comm, s->stream);
    if (rc)
        return fail(c, me, "allreduce (a bucket)", NULL, rc, err, errn);
    for (int k = 0; k < s->nitems && !rc; k++) {
        const struct bitem *b = &s->items[k];
        rc = d->cuMemcpyDtoDAsync((ptrt_cudev)(uintptr_t)b->out, (ptrt_cudev)(uintptr_t)(buf + b->at),
                                  b->bytes, s->stream);
        if (!rc)
            rc = d->cuEventRecord(s->ev[b->token - 1], s->stream);
    }
    if (rc)
        return drv_fail(c, me, "a bucket's results", rc, err, errn);
    s->turn_ev[s->turn] = s->ev[s->items[s->nitems - 1].token - 1];
    s->turn ^= 1;
    s->nitems = 0;
    s->used = 0;
    s->sends++;
    return 0;
}

/* before any NCCL call but a bucket's item: the bucket first (its items were called earlier,
 * and every member calls in the same order), then the call after the kernels */
static int begin(ptrt_ncclc *c, int me, char *err, size_t errn)
{
    return send_bucket(c, me, err, errn) < 0 ? -1 : enter(c, me, err, errn);
}

/* after it: its done event; a token where the caller asked for one and `background` (the call
 * leaves nothing for the host to do after it), else the default stream waits for it now */
static int leave(ptrt_ncclc *c, int me, const ptrt_coll_desc *d, bool background, char *err,
                 size_t errn)
{
    rank_state *s = &c->r[me];
    int rc = 0;
    void *ev = next_event(c, me, err, errn);
    if (!ev)
        return -1;
    if ((rc = c->d->cuEventRecord(ev, s->stream)))
        return drv_fail(c, me, "cuEventRecord", rc, err, errn);
    bool token = background && d && d->token;
    if (d && d->token)
        *d->token = token ? s->issued : 0;
    if (!token && (rc = c->d->cuStreamWaitEvent(NULL, ev, 0)))
        return drv_fail(c, me, "cuStreamWaitEvent", rc, err, errn);
    return 0;
}

static int n_wait(void *impl, int me, int64_t token, char *err, size_t errn)
{
    ptrt_ncclc *c = impl;
    rank_state *s = &c->r[me];
    if (token < 0 || token > s->issued)
        token = s->issued;
    if (token == 0)
        return 0;
    if (s->nitems && token >= s->items[0].token && send_bucket(c, me, err, errn) < 0)
        return -1;
    int rc = c->d->cuStreamWaitEvent(NULL, s->ev[token - 1], 0);
    if (token == s->issued) { /* (every event waited for: they are free again) */
        s->issued = 0;
        s->turn_ev[0] = s->turn_ev[1] = NULL;
    }
    return rc ? drv_fail(c, me, "cuStreamWaitEvent", rc, err, errn) : 0;
}

/* height rows of width bytes from src (rows pitch spitch apart) to dst (dpitch) on the GPU */
static int copy2d(const ptrt_ncclc *c, void *dst, size_t dpitch, const void *src, size_t spitch,
                  size_t width, size_t height)
{
    if (!width || !height)
        return 0;
    ptrt_cuda_copy2d k = {.src_type = PTRT_CU_MEMORYTYPE_DEVICE,
                          .src = (ptrt_cudev)(uintptr_t)src,
                          .src_pitch = spitch,
                          .dst_type = PTRT_CU_MEMORYTYPE_DEVICE,
                          .dst = (ptrt_cudev)(uintptr_t)dst,
                          .dst_pitch = dpitch,
                          .width = width,
                          .height = height};
    return c->d->cuMemcpy2D(&k);
}

static int n_allreduce(void *impl, int me, const int *members, int n, const void *in, void *out,
                       int64_t count, ptc_dtype dt, ptrt_reduce op, const ptrt_coll_desc *d,
                       char *err, size_t errn)
{
    ptrt_ncclc *c = impl;
    const group *g = group_of(c, me, members, n);
    if (!g)
        return no_group(me, "allreduce", err, errn);
    rank_state *s = &c->r[me];
    size_t bytes = (size_t)count * (size_t)ptc_dtype_size(dt);
    if (d && d->token && s->bucket_bytes && bytes <= ITEM_BYTES && count > 0) {
        /* into the bucket (every member does the same: their calls have the same sizes) */
        size_t at = (s->used + 255) & ~(size_t)255;
        if (s->nitems && (s->bg != g || s->bdt != dt || s->bop != op ||
                          at + bytes > s->bucket_bytes)) {
            if (send_bucket(c, me, err, errn) < 0)
                return -1;
            at = 0;
        }
        void *ev = next_event(c, me, err, errn);
        if (!ev)
            return -1;
        (void)ev;
        PTC_GROW(s->items, s->capitems, s->nitems);
        s->items[s->nitems++] = (struct bitem){in, out, bytes, at, s->issued};
        s->bg = g;
        s->bdt = dt;
        s->bop = op;
        s->used = at + bytes;
        s->bucketed++;
        *d->token = s->issued;
        return 0;
    }
    if (begin(c, me, err, errn) < 0)
        return -1;
    int rc = c->nc->ncclAllReduce(in, out, (size_t)count, nccl_dtype(dt), nccl_op(op), g->comm,
                                  c->r[me].stream);
    if (rc)
        return fail(c, me, "allreduce", d, rc, err, errn);
    return leave(c, me, d, true, err, errn);
}

/* out: outer blocks of n parts of chunk; NCCL gathers [n][outer x chunk], unpacked from scratch */
static int n_allgather(void *impl, int me, const int *members, int n, const void *in, void *out,
                       int64_t outer, int64_t chunk, ptc_dtype dt, const ptrt_coll_desc *d,
                       char *err, size_t errn)
{
    ptrt_ncclc *c = impl;
    const group *g = group_of(c, me, members, n);
    if (!g)
        return no_group(me, "allgather", err, errn);
    size_t es = (size_t)ptc_dtype_size(dt), part = (size_t)(outer * chunk);
    void *dst = outer == 1 ? out : c->r[me].scratch;
    if (begin(c, me, err, errn) < 0)
        return -1;
    int rc = c->nc->ncclAllGather(in, dst, part, nccl_dtype(dt), g->comm, c->r[me].stream);
    if (rc)
        return fail(c, me, "allgather", d, rc, err, errn);
    if (leave(c, me, d, outer == 1, err, errn) < 0) /* (interleaved parts: unpacked here) */
        return -1;
    for (int j = 0; j < n && outer != 1; j++) {
        int crc = copy2d(c, (char *)out + (size_t)j * (size_t)chunk * es, (size_t)(n * chunk) * es,
                         (char *)dst + (size_t)j * part * es, (size_t)chunk * es,
                         (size_t)chunk * es, (size_t)outer);
        if (crc) {
            ptc_fmt(err, errn, "rank %d: allgather: cuMemcpy2D failed (%d)", me, crc);
            return -1;
        }
    }
    return 0;
}

/* in: outer blocks of n parts of chunk, packed [n][outer x chunk] into scratch for NCCL */
static int n_reduce_scatter(void *impl, int me, const int *members, int n, const void *in,
                            void *out, int64_t outer, int64_t chunk, ptc_dtype dt, ptrt_reduce op,
                            const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_ncclc *c = impl;
    const group *g = group_of(c, me, members, n);
    if (!g)
        return no_group(me, "reduce_scatter", err, errn);
    size_t es = (size_t)ptc_dtype_size(dt), part = (size_t)(outer * chunk);
    const void *src = outer == 1 ? in : c->r[me].scratch;
    for (int j = 0; j < n && outer != 1; j++) {
        int crc = copy2d(c, (char *)c->r[me].scratch + (size_t)j * part * es, (size_t)chunk * es,
                         (const char *)in + (size_t)j * (size_t)chunk * es,
                         (size_t)(n * chunk) * es, (size_t)chunk * es, (size_t)outer);
        if (crc) {
            ptc_fmt(err, errn, "rank %d: reduce_scatter: cuMemcpy2D failed (%d)", me, crc);
            return -1;
        }
    }
    if (begin(c, me, err, errn) < 0)
        return -1;
    int rc = c->nc->ncclReduceScatter(src, out, part, nccl_dtype(dt), nccl_op(op), g->comm,
                                      c->r[me].stream);
    if (rc)
        return fail(c, me, "reduce_scatter", d, rc, err, errn);
    return leave(c, me, d, true, err, errn);
}

/* part p of in (outer_in blocks, at p x chunk_in in each) to members[p]; part j of out from
 * members[j]: packed into scratch, exchanged in one group, unpacked */
static int n_all_to_all(void *impl, int me, const int *members, int n, const void *in, void *out,
                        int64_t outer_in, int64_t chunk_in, int64_t outer_out, int64_t chunk_out,
                        ptc_dtype dt, const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_ncclc *c = impl;
    const group *g = group_of(c, me, members, n);
    if (!g)
        return no_group(me, "all_to_all", err, errn);
    size_t es = (size_t)ptc_dtype_size(dt), part = (size_t)(outer_in * chunk_in);
    char *sin = c->r[me].scratch, *sout = sin + (size_t)n * part * es;
    int crc = 0;
    for (int p = 0; p < n && !crc; p++)
        crc = copy2d(c, sin + (size_t)p * part * es, (size_t)chunk_in * es,
                     (const char *)in + (size_t)p * (size_t)chunk_in * es,
                     (size_t)(n * chunk_in) * es, (size_t)chunk_in * es, (size_t)outer_in);
    if (crc) {
        ptc_fmt(err, errn, "rank %d: all_to_all: cuMemcpy2D failed (%d)", me, crc);
        return -1;
    }
    void *st = c->r[me].stream;
    if (begin(c, me, err, errn) < 0)
        return -1;
    int rc = c->nc->ncclGroupStart();
    for (int p = 0; p < n && !rc; p++) {
        rc = c->nc->ncclSend(sin + (size_t)p * part * es, part, nccl_dtype(dt), p, g->comm, st);
        if (!rc)
            rc = c->nc->ncclRecv(sout + (size_t)p * part * es, part, nccl_dtype(dt), p, g->comm,
                                 st);
    }
    int erc = c->nc->ncclGroupEnd();
    rc = rc ? rc : erc;
    if (rc)
        return fail(c, me, "all_to_all", d, rc, err, errn);
    if (leave(c, me, d, false, err, errn) < 0)
        return -1;
    for (int j = 0; j < n && !crc; j++)
        crc = copy2d(c, (char *)out + (size_t)j * (size_t)chunk_out * es,
                     (size_t)(n * chunk_out) * es, sout + (size_t)j * part * es,
                     (size_t)chunk_out * es, (size_t)chunk_out * es, (size_t)outer_out);
    if (crc) {
        ptc_fmt(err, errn, "rank %d: all_to_all: cuMemcpy2D failed (%d)", me, crc);
        return -1;
    }
    return 0;
}

static int n_all_to_all_v(void *impl, int me, const int *members, int n, const void *in,
                          const int64_t *send_count, const int64_t *send_off, int64_t in_len,
                          void *out, const int64_t *recv_count, const int64_t *recv_off,
                          int64_t out_len, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                          size_t errn)
{
    ptrt_ncclc *c = impl;
    const group *g = group_of(c, me, members, n);
    if (!g)
        return no_group(me, "all_to_all_v", err, errn);
    for (int j = 0; j < n; j++)
        if (send_off[j] + send_count[j] > in_len || recv_off[j] + recv_count[j] > out_len) {
            ptc_fmt(err, errn, "rank %d: all_to_all_v: part %d lies outside its buffer", me, j);
            return -1;
        }
    size_t es = (size_t)ptc_dtype_size(dt);
    void *st = c->r[me].stream;
    if (begin(c, me, err, errn) < 0)
        return -1;
    int rc = c->nc->ncclGroupStart();
    for (int p = 0; p < n && !rc; p++) {
        if (send_count[p])
            rc = c->nc->ncclSend((const char *)in + (size_t)send_off[p] * es,
                                 (size_t)send_count[p], nccl_dtype(dt), p, g->comm, st);
        if (!rc && recv_count[p])
            rc = c->nc->ncclRecv((char *)out + (size_t)recv_off[p] * es, (size_t)recv_count[p],
                                 nccl_dtype(dt), p, g->comm, st);
    }
    int erc = c->nc->ncclGroupEnd();
    rc = rc ? rc : erc;
    if (rc)
        return fail(c, me, "all_to_all_v", d, rc, err, errn);
    return leave(c, me, d, false, err, errn);
}

static int n_send(void *impl, int me, int peer, const void *buf, int64_t count, ptc_dtype dt,
                  const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_ncclc *c = impl;
    ptrt_comm *p = ptrt_staged_comm(c->p2p);
    /* (the host waits here: the background calls first, which a GPU finishes on its own) */
    if (n_wait(c, me, -1, err, errn) < 0)
        return -1;
    return p->ops->send(p->impl, me, peer, buf, count, dt, d, err, errn);
}

static int n_recv(void *impl, int me, int peer, void *buf, int64_t count, ptc_dtype dt,
                  const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_ncclc *c = impl;
    ptrt_comm *p = ptrt_staged_comm(c->p2p);
    if (n_wait(c, me, -1, err, errn) < 0)
        return -1;
    return p->ops->recv(p->impl, me, peer, buf, count, dt, d, err, errn);
}

static int n_barrier(void *impl, int me, const int *members, int n, const ptrt_coll_desc *d,
                     char *err, size_t errn)
{
    ptrt_ncclc *c = impl;
    if (n_wait(c, me, -1, err, errn) < 0)
        return -1;
    return c->host->ops->barrier(c->host->impl, me, members, n, d, err, errn);
}

static void n_abort(void *impl, int rank, const char *msg)
{
    ptrt_ncclc *c = impl;
    c->host->ops->abort(c->host->impl, rank, msg);
}

static bool n_failed(void *impl, char *reason, size_t n)
{
    ptrt_ncclc *c = impl;
    return c->host->ops->failed(c->host->impl, reason, n);
}

static const ptrt_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = n_allreduce,
    .allgather = n_allgather,
    .reduce_scatter = n_reduce_scatter,
    .all_to_all = n_all_to_all,
    .all_to_all_v = n_all_to_all_v,
    .send = n_send,
    .recv = n_recv,
    .barrier = n_barrier,
    .abort = n_abort,
    .failed = n_failed,
    .wait = n_wait,
};

/* ---- making it ---- */

/* the axis sets of the plan's collectives (every program), in ascending order */
static int axis_sets(const ptc_plan *p, unsigned *out, int cap)
{
    int n = 0;
    for (int q = 0; q < p->nprograms; q++)
        for (int i = 0; i < p->programs[q].ninstrs; i++) {
            const ptc_instr *in = &p->programs[q].instrs[i];
            if (in->kind != PTC_INSTR_COLL)
                continue;
            bool seen = false;
            for (int k = 0; k < n && !seen; k++)
                seen = out[k] == in->coll.axes;
            if (!seen && n < cap)
                out[n++] = in->coll.axes;
        }
    for (int a = 1; a < n; a++) /* insertion sort: every rank splits in one order */
        for (int b = a; b > 0 && out[b] < out[b - 1]; b--) {
            unsigned t = out[b];
            out[b] = out[b - 1];
            out[b - 1] = t;
        }
    return n;
}

/* a rank's bucket: the bytes of its small allreduces (aligned as packed), at most BUCKET_BYTES;
 * 0 where fewer than two would share it */
static size_t bucket_of(const ptc_plan *p, int rank)
{
    const ptc_program *pg = &p->programs[p->rank_program[rank]];
    size_t sum = 0;
    int n = 0;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_COLL || in->coll.kind != PTC_COLL_ALLREDUCE)
            continue;
        size_t b = (size_t)pg->bufs[in->in[0]].bytes;
        if (b > ITEM_BYTES)
            continue;
        sum += (b + 255) & ~(size_t)255;
        n++;
    }
    return n < 2 ? 0 : sum < BUCKET_BYTES ? sum : BUCKET_BYTES;
}

/* the bytes a rank's collectives pack: in and out of its largest */
static size_t scratch_of(const ptc_plan *p, int rank)
{
    const ptc_program *pg = &p->programs[p->rank_program[rank]];
    size_t most = 0;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_COLL)
            continue;
        size_t b = (size_t)(pg->bufs[in->in[0]].bytes + pg->bufs[in->out[0]].bytes);
        most = b > most ? b : most;
    }
    return most;
}

/* Making the communicators. Every rank of this process gets a thread of its own (NCCL's
 * one-device-per-thread way: ncclCommInitRank waits for the other members), in which it:
 *   1. binds to its GPU;
 *   2. gathers, over the host communicator, every rank's host name, GPU bus id and whether its
 *      process has NCCL, and decides with every other rank (on the same data) whether NCCL can
 *      serve: one rank per GPU, NCCL everywhere. If not, nothing has failed: the caller falls
 *      back, the same way in every process;
 *   3. for each set of mesh axes the plan's collectives use (in one order everywhere), gets its
 *      group's ncclUniqueId from the group's first member, through the host communicator (the
 *      launcher's channel: in-process, or MPI under mpirun and srun), and joins the group's
 *      communicator with ncclCommInitRank;
 *   4. allocates its packing scratch on its GPU.
 * A failure after the decision fails the start, and aborts the host communicator so that no
 * other rank waits for this one. */

#define ID_WORDS PTRT_NCCL_ID_WORDS /* a rank's identity record: 64 bytes */

typedef struct init_arg {
    ptrt_ncclc *c;
    const ptc_plan *plan;
    int rank;
    const unsigned *sets;
    int nsets;
    bool nccl_ok;     /* this process has NCCL */
    char nccl_why[256];
    int usable;       /* out: 1 NCCL serves, 0 it cannot (why), -1 failed (why) */
    char why[768];
} init_arg;

void ptrt_nccl_identity(int32_t *rec, bool ok, const char *host, const char *bus)
{
    /* (all of the text is compared: the bytes after its string are zeros, written here, not
     * what the stack held, which made ranks sharing a GPU look apart under ASan and chose NCCL
     * for them) */
    memset(rec, 0, ID_WORDS * 4);
    rec[0] = ok;
    ptc_fmt((char *)(rec + 1), ID_WORDS * 4 - 4, "%s|%s", host, bus);
}

static void identity(int32_t *rec, bool ok)
{
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    ptrt_nccl_identity(rec, ok, host, ptrt_cuda_bus_id());
}

static int init_fail(init_arg *a, const char *fmt, const char *what)
{
    ptc_fmt(a->why, sizeof a->why, fmt, a->rank, what);
    a->usable = -1;
    a->c->host->ops->abort(a->c->host->impl, a->rank, a->why);
    return -1;
}

/* step 2: 1 when NCCL serves every rank, else 0 with why (the same verdict on every rank) */
static int decide(init_arg *a, int32_t *all, int n)
{
    for (int r = 0; r < n; r++)
        if (!all[r * ID_WORDS]) {
            if (r == a->rank)
                ptc_fmt(a->why, sizeof a->why, "%s", a->nccl_why);
            else
                ptc_fmt(a->why, sizeof a->why, "rank %d's process has no NCCL", r);
            return 0;
        }
    for (int r = 0; r < n; r++)
        for (int q = r + 1; q < n; q++)
            if (!memcmp(all + r * ID_WORDS + 1, all + q * ID_WORDS + 1, (ID_WORDS - 1) * 4)) {
                char id[ID_WORDS * 4];
                memcpy(id, all + r * ID_WORDS + 1, (ID_WORDS - 1) * 4);
                id[(ID_WORDS - 1) * 4] = '\0';
                char *bar = strchr(id, '|');
                if (bar)
                    *bar = '\0';
                ptc_fmt(a->why, sizeof a->why,
                        "ranks %d and %d share GPU %s on %s: NCCL takes one rank per GPU", r, q,
                        bar ? bar + 1 : "?", id);
                return 0;
            }
    return 1;
}

static void *init_rank(void *p)
{
    init_arg *a = p;
    ptrt_ncclc *c = a->c;
    const ptc_plan *plan = a->plan;
    int me = a->rank, n = plan->nranks;
    char err[512];
    ptrt_comm *h = c->host;
    if (c->be->bind(me, err, sizeof err) < 0) {
        init_fail(a, "rank %d: %s", err);
        return NULL;
    }
    int32_t mine[ID_WORDS], *all = ptc_xmalloc(sizeof(int32_t) * ID_WORDS * (size_t)n);
    int *world = ptc_xmalloc(sizeof(int) * (size_t)n);
    for (int r = 0; r < n; r++)
        world[r] = r;
    identity(mine, a->nccl_ok);
    ptrt_coll_desc d = {.group_name = "nccl start", .step = -1, .index = -1};
    if (h->ops->allgather(h->impl, me, world, n, mine, all, 1, ID_WORDS, PTC_I32, &d, err,
                          sizeof err) < 0) {
        init_fail(a, "rank %d: %s", err);
        goto out;
    }
    if ((a->usable = decide(a, all, n)) == 0)
        goto out;
    rank_state *rs = &c->r[me];
    int src;
    if ((src = c->d->cuStreamCreate(&rs->stream, PTRT_CU_STREAM_NON_BLOCKING)) ||
        (src = c->d->cuEventCreate(&rs->ev_in, PTRT_CU_EVENT_DISABLE_TIMING))) {
        char what[64];
        ptc_fmt(what, sizeof what, "%d", src);
        init_fail(a, "rank %d: cannot make the collectives' stream and events (%s)", what);
        goto out;
    }
    rs->groups = ptc_xcalloc((size_t)(a->nsets ? a->nsets : 1), sizeof(group));
    int *buf = ptc_xmalloc(sizeof(int) * (size_t)n);
    int32_t *ids = ptc_xmalloc(sizeof(ptrt_nccl_id) * (size_t)n);
    for (int k = 0; k < a->nsets && a->usable > 0; k++) {
        group *g = &rs->groups[k];
        g->axes = a->sets[k];
        g->n = ptc_plan_group(&plan->mesh, me, a->sets[k], buf);
        g->members = ptc_xmalloc(sizeof(int) * (size_t)g->n);
        memcpy(g->members, buf, sizeof(int) * (size_t)g->n);
        rs->ngroups = k + 1;
        int pos = 0;
        while (pos < g->n && g->members[pos] != me)
            pos++;
        ptrt_nccl_id id;
        memset(&id, 0, sizeof id);
        int rc = pos == 0 ? c->nc->ncclGetUniqueId(&id) : 0;
        if (rc) {
            init_fail(a, "rank %d: ncclGetUniqueId: %s", c->nc->ncclGetErrorString(rc));
            break;
        }
        /* the first member's id to every member (an allgather: the host communicators have no
         * broadcast) */
        if (h->ops->allgather(h->impl, me, g->members, g->n, &id, ids, 1,
                              (int64_t)(sizeof id / 4), PTC_I32, &d, err, sizeof err) < 0) {
            init_fail(a, "rank %d: %s", err);
            break;
        }
        memcpy(&id, ids, sizeof id);
        if ((rc = c->nc->ncclCommInitRank(&g->comm, g->n, id, pos))) {
            g->comm = NULL;
            init_fail(a, "rank %d: ncclCommInitRank: %s", c->nc->ncclGetErrorString(rc));
        }
    }
    free(ids);
    free(buf);
    size_t bb = a->usable > 0 ? bucket_of(plan, me) : 0;
    for (int k = 0; k < 2 && bb; k++)
        if (!(rs->bucket[k] = c->be->alloc(bb))) {
            char what[64];
            ptc_fmt(what, sizeof what, "%zu", bb);
            init_fail(a, "rank %d: cannot allocate %s bytes for a bucket of gradients", what);
            bb = 0;
        }
    rs->bucket_bytes = rs->bucket[1] ? bb : 0;
    size_t b = a->usable > 0 ? scratch_of(plan, me) : 0;
    if (b && !(rs->scratch = c->be->alloc(b))) {
        char what[64];
        ptc_fmt(what, sizeof what, "%zu", b);
        init_fail(a, "rank %d: cannot allocate %s bytes for packing collectives", what);
    } else if (b) {
        rs->scratch_bytes = b;
    }
out:
    free(all);
    free(world);
    return NULL;
}

ptrt_ncclc *ptrt_nccl_new(const ptc_plan *plan, const ptrt_backend *be, ptrt_comm *host,
                          int first, int nlocal, bool *failed, char *err, size_t errn)
{
    int n = plan->nranks;
    *failed = false;
    if (!be->bind || be->bind(first, err, errn) < 0) { /* (the backend started) */
        *failed = true;
        return NULL;
    }
    char why[256] = "";
    const ptrt_nccl *nc = ptrt_cuda_nccl_now(why, sizeof why);
    ptrt_cuda_nccl_transport(host);
    ptrt_ncclc *c = ptc_xcalloc(1, sizeof *c);
    c->host = host;
    c->be = be;
    c->nc = nc;
    c->d = ptrt_cuda_driver_now();
    c->nranks = n;
    c->r = ptc_xcalloc((size_t)n, sizeof(rank_state));
    unsigned sets[32];
    int nsets = axis_sets(plan, sets, 32);
    init_arg *args = ptc_xcalloc((size_t)nlocal, sizeof *args);
    pthread_t *th = ptc_xcalloc((size_t)nlocal, sizeof *th);
    for (int k = 0; k < nlocal; k++) {
        args[k] = (init_arg){.c = c, .plan = plan, .rank = first + k, .sets = sets,
                             .nsets = nsets, .nccl_ok = nc != NULL};
        ptc_fmt(args[k].nccl_why, sizeof args[k].nccl_why, "%s", why);
        if (pthread_create(&th[k], NULL, init_rank, &args[k]) != 0) {
            args[k].usable = -1;
            ptc_fmt(args[k].why, sizeof args[k].why, "rank %d: cannot start a thread",
                    first + k);
            host->ops->abort(host->impl, first + k, args[k].why);
            th[k] = 0;
        }
    }
    int verdict = 1;
    for (int k = 0; k < nlocal; k++) {
        if (th[k])
            pthread_join(th[k], NULL);
        if (args[k].usable < verdict) {
            verdict = args[k].usable;
            ptc_fmt(err, errn, "%s", args[k].why);
        }
    }
    free(args);
    free(th);
    *failed = verdict < 0;
    if (verdict <= 0) {
        ptrt_nccl_free(c);
        return NULL;
    }
    c->p2p = ptrt_staged_new(host, be, n);
    c->comm = (ptrt_comm){.ops = &nccl_ops, .impl = c, .nranks = n, .device = true};
    return c;
}

void ptrt_nccl_free(ptrt_ncclc *c)
{
    if (!c)
        return;
    char e[256];
    for (int r = 0; r < c->nranks; r++) {
        rank_state *s = &c->r[r];
        for (int g = 0; g < s->ngroups; g++) {
            if (s->groups[g].comm)
                c->nc->ncclCommDestroy(s->groups[g].comm);
            free(s->groups[g].members);
        }
        free(s->groups);
        if (s->scratch || s->stream || s->bucket[0])
            c->be->bind(r, e, sizeof e);
        if (s->scratch)
            c->be->free(s->scratch, s->scratch_bytes);
        for (int k = 0; k < 2; k++)
            if (s->bucket[k])
                c->be->free(s->bucket[k], s->bucket_bytes);
        free(s->items);
        for (int k = 0; k < s->nev; k++)
            if (s->ev[k])
                c->d->cuEventDestroy(s->ev[k]);
        free(s->ev);
        if (s->ev_in)
            c->d->cuEventDestroy(s->ev_in);
        if (s->stream)
            c->d->cuStreamDestroy(s->stream);
    }
    ptrt_staged_free(c->p2p);
    free(c->r);
    free(c);
}

void ptrt_nccl_buckets(const ptrt_ncclc *c, int rank, int64_t *bucketed, int64_t *calls)
{
    *bucketed = c->r[rank].bucketed;
    *calls = c->r[rank].sends;
}

ptrt_comm *ptrt_nccl_comm(ptrt_ncclc *c)
{
    return &c->comm;
}
