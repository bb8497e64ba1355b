/* staged.c - device ranks' collectives through host memory (see staged.h). */
#include "staged.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct slot {
    void *in, *out;
    size_t cap_in, cap_out;
} slot;

struct ptrt_staged {
    ptrt_comm comm;
    ptrt_comm *host;
    const ptrt_backend *be;
    slot *slots; /* by rank */
};

static void *grow(void **p, size_t *cap, size_t n)
{
    if (n > *cap) {
        free(*p);
        *p = ptc_xmalloc(n ? n : 1);
        *cap = n;
    }
    return *p;
}

/* rank me's host copies of in (n_in elements of dt, downloaded) and out (n_out) */
static void stage(ptrt_staged *s, int me, const void *in, int64_t n_in, int64_t n_out,
                  ptc_dtype dt, void **hin, void **hout)
{
    size_t es = (size_t)ptc_dtype_size(dt);
    slot *sl = &s->slots[me];
    *hin = grow(&sl->in, &sl->cap_in, (size_t)n_in * es);
    *hout = grow(&sl->out, &sl->cap_out, (size_t)n_out * es);
    if (n_in > 0)
        s->be->download(*hin, in, (size_t)n_in * es);
}

static int done(ptrt_staged *s, int rc, void *out, const void *hout, int64_t n_out, ptc_dtype dt)
{
    if (rc == 0 && n_out > 0)
        s->be->upload(out, hout, (size_t)n_out * (size_t)ptc_dtype_size(dt));
    return rc;
}

static int s_allreduce(void *impl, int me, const int *members, int n, const void *in, void *out,
                       int64_t count, ptc_dtype dt, ptrt_reduce op, const ptrt_coll_desc *d,
                       char *err, size_t errn)
{
    ptrt_staged *s = impl;
    void *hi, *ho;
    stage(s, me, in, count, count, dt, &hi, &ho);
    int rc = s->host->ops->allreduce(s->host->impl, me, members, n, hi, ho, count, dt, op, d, err,
                                     errn);
    return done(s, rc, out, ho, count, dt);
}

static int s_allgather(void *impl, int me, const int *members, int n, const void *in, void *out,
                       int64_t outer, int64_t chunk, ptc_dtype dt, const ptrt_coll_desc *d,
                       char *err, size_t errn)
{
    ptrt_staged *s = impl;
    void *hi, *ho;
    stage(s, me, in, outer * chunk, n * outer * chunk, dt, &hi, &ho);
    int rc = s->host->ops->allgather(s->host->impl, me, members, n, hi, ho, outer, chunk, dt, d,
                                     err, errn);
    return done(s, rc, out, ho, n * outer * chunk, dt);
}

static int s_reduce_scatter(void *impl, int me, const int *members, int n, const void *in,
                            void *out, int64_t outer, int64_t chunk, ptc_dtype dt, ptrt_reduce op,
                            const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_staged *s = impl;
    void *hi, *ho;
    stage(s, me, in, n * outer * chunk, outer * chunk, dt, &hi, &ho);
    int rc = s->host->ops->reduce_scatter(s->host->impl, me, members, n, hi, ho, outer, chunk, dt,
                                          op, d, err, errn);
    return done(s, rc, out, ho, outer * chunk, dt);
}

static int s_all_to_all(void *impl, int me, const int *members, int n, const void *in, void *out,
                        int64_t outer_in, int64_t chunk_in, int64_t outer_out, int64_t chunk_out,
                        ptc_dtype dt, const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_staged *s = impl;
    void *hi, *ho;
    int64_t nin = n * outer_in * chunk_in, nout = n * outer_out * chunk_out;
    stage(s, me, in, nin, nout, dt, &hi, &ho);
    int rc = s->host->ops->all_to_all(s->host->impl, me, members, n, hi, ho, outer_in, chunk_in,
                                      outer_out, chunk_out, dt, d, err, errn);
    return done(s, rc, out, ho, nout, dt);
}

static int s_all_to_all_v(void *impl, int me, const int *members, int n, const void *in,
                          const int64_t *send_count, const int64_t *send_off, int64_t in_len,
                          void *out, const int64_t *recv_count, const int64_t *recv_off,
                          int64_t out_len, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                          size_t errn)
{
    ptrt_staged *s = impl;
    void *hi, *ho;
    stage(s, me, in, in_len, out_len, dt, &hi, &ho);
    /* the parts not received keep what out held (the host call writes only what arrives) */
    s->be->download(ho, out, (size_t)out_len * (size_t)ptc_dtype_size(dt));
    int rc = s->host->ops->all_to_all_v(s->host->impl, me, members, n, hi, send_count, send_off,
                                        in_len, ho, recv_count, recv_off, out_len, dt, d, err,
                                        errn);
    return done(s, rc, out, ho, out_len, dt);
}

static int s_send(void *impl, int me, int peer, const void *buf, int64_t count, ptc_dtype dt,
                  const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_staged *s = impl;
    void *hi, *ho;
    stage(s, me, buf, count, 0, dt, &hi, &ho);
    return s->host->ops->send(s->host->impl, me, peer, hi, count, dt, d, err, errn);
}

static int s_recv(void *impl, int me, int peer, void *buf, int64_t count, ptc_dtype dt,
                  const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_staged *s = impl;
    void *hi, *ho;
    stage(s, me, NULL, 0, count, dt, &hi, &ho);
    int rc = s->host->ops->recv(s->host->impl, me, peer, ho, count, dt, d, err, errn);
    return done(s, rc, buf, ho, count, dt);
}

static int s_barrier(void *impl, int me, const int *members, int n, const ptrt_coll_desc *d,
                     char *err, size_t errn)
{
    ptrt_staged *s = impl;
    return s->host->ops->barrier(s->host->impl, me, members, n, d, err, errn);
}

static void s_abort(void *impl, int rank, const char *msg)
{
    ptrt_staged *s = impl;
    s->host->ops->abort(s->host->impl, rank, msg);
}

static bool s_failed(void *impl, char *reason, size_t n)
{
    ptrt_staged *s = impl;
    return s->host->ops->failed(s->host->impl, reason, n);
}

static const ptrt_comm_ops staged_ops = {
    .name = "host-staged",
    .allreduce = s_allreduce,
    .allgather = s_allgather,
    .reduce_scatter = s_reduce_scatter,
    .all_to_all = s_all_to_all,
    .all_to_all_v = s_all_to_all_v,
    .send = s_send,
    .recv = s_recv,
    .barrier = s_barrier,
    .abort = s_abort,
    .failed = s_failed,
};

ptrt_staged *ptrt_staged_new(ptrt_comm *host, const ptrt_backend *be, int nranks)
{
    ptrt_staged *s = ptc_xcalloc(1, sizeof *s);
    s->host = host;
    s->be = be;
    s->slots = ptc_xcalloc((size_t)(nranks > 0 ? nranks : 1), sizeof(slot));
    s->comm = (ptrt_comm){.ops = &staged_ops, .impl = s, .nranks = host->nranks, .device = true};
    return s;
}

void ptrt_staged_free(ptrt_staged *s)
{
    if (!s)
        return;
    for (int r = 0; r < s->comm.nranks; r++) {
        free(s->slots[r].in);
        free(s->slots[r].out);
    }
    free(s->slots);
    free(s);
}

ptrt_comm *ptrt_staged_comm(ptrt_staged *s)
{
    return &s->comm;
}
