/* mpicomm.c - the communicator over MPI and the processes of a job (see mpicomm.h). */
#include "mpicomm.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "half.h"
#include "util.h"

bool ptrt_mpi_launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "SLURM_STEP_NUM_TASKS", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

#ifndef PTC_HAVE_MPI

bool ptrt_mpi_available(void)
{
    return false;
}

ptrt_mpi *ptrt_mpi_new(int nranks, int per_process, double timeout_s, char *err, size_t errn)
{
    ptc_fmt(err, errn,
            "this executable was built without MPI: install libopenmpi-dev (or MPICH) "
            "and build ptc again to run ranks as processes");
    return NULL;
}
void ptrt_mpi_free(ptrt_mpi *m)
{
}
ptrt_comm *ptrt_mpi_comm(ptrt_mpi *m)
{
    return NULL;
}
int ptrt_mpi_process(const ptrt_mpi *m)
{
    return 0;
}
int ptrt_mpi_nprocesses(const ptrt_mpi *m)
{
    return 1;
}
int ptrt_mpi_first_rank(const ptrt_mpi *m)
{
    return 0;
}
int ptrt_mpi_sum(ptrt_mpi *m, double *v, int64_t n, int root, char *err, size_t errn)
{
    return 0;
}
double *ptrt_mpi_gather(ptrt_mpi *m, const double *v, int n, int root, int *total, char *err,
                        size_t errn)
{
    ptc_fmt(err, errn, "this executable was built without MPI");
    return NULL;
}
void ptrt_mpi_finish(int rc)
{
}

#else

#include <mpi.h>

enum { MAGIC = 0x7074636d, P2P_GROUP = 0x3fff, MAX_LOCAL = 64 };
enum {
    K_BARRIER,
    K_ALLREDUCE,
    K_ALLGATHER,
    K_REDUCE_SCATTER,
    K_ALL_TO_ALL,
    K_ALL_TO_ALL_V,
    K_SEND
};
static const char *const kind_name[] = {"barrier",    "allreduce",    "allgather", "reduce_scatter",
                                        "all_to_all", "all_to_all_v", "send/recv"};

/* What travels in front of every message, checked on arrival. */
typedef struct hdr {
    uint32_t magic, kind, dtype, pad;
    int64_t step, count;
} hdr;

typedef struct pending {
    MPI_Request rq;
    void *buf;
} pending;

struct ptrt_mpi {
    ptrt_comm comm;
    int nranks, K, proc, nprocs;
    double timeout;
    pthread_mutex_t mu;
    bool failed;
    char reason[1024];
    pending *sends; /* buffered sends of send(), freed once complete */
    int nsends, capsends;
};

static bool initialised; /* MPI_Init_thread was called by this process */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int proc_of(const ptrt_mpi *m, int rank)
{
    return rank / m->K;
}

static int tag_of(int group, int src_rank, int dst_rank, int K)
{
    return (group << 12) | ((src_rank % K) << 6) | (dst_rank % K);
}

/* A group's tag field: a hash of its members (in the order every member names them). */
static int group_tag(const int *members, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int j = 0; j < n; j++)
        h = (h ^ (uint64_t)(uint32_t)members[j]) * 1099511628211ull;
    return (int)(h % P2P_GROUP);
}

/* The first failure of the job in this process: later calls fail with it at once. */
static int fail(ptrt_mpi *m, char *err, size_t errn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(ptrt_mpi *m, char *err, size_t errn, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&m->mu);
    if (!m->failed) {
        m->failed = true;
        snprintf(m->reason, sizeof m->reason, "%s", msg);
    }
    pthread_mutex_unlock(&m->mu);
    ptc_fmt(err, errn, "%s", msg);
    return -1;
}

static bool failed_now(ptrt_mpi *m, int me, char *err, size_t errn)
{
    pthread_mutex_lock(&m->mu);
    bool f = m->failed;
    if (f)
        ptc_fmt(err, errn, "rank %d: the run has failed: %s", me, m->reason);
    pthread_mutex_unlock(&m->mu);
    return f;
}

/* "allreduce on group dp [0,2] at step 3" into buf, for messages; returns buf. */
static const char *describe(char *buf, size_t n, int kind, const int *members, int nm,
                            const ptrt_coll_desc *d)
{
    int k = snprintf(buf, n, "%s on group %s [", kind_name[kind],
                     d && d->group_name ? d->group_name : "");
    for (int j = 0; j < nm && k < (int)n; j++)
        k += snprintf(buf + k, n - (size_t)k, "%s%d", j ? "," : "", members[j]);
    if (k < (int)n)
        snprintf(buf + k, n - (size_t)k, "] at step %lld", d ? (long long)d->step : -1LL);
    return buf;
}

/* Waits for the requests until the deadline, polling (MPI_Test on each, so the ones done are
 * MPI_REQUEST_NULL). Returns -1 when done, else the index of the first one still open. */
static int wait_deadline(ptrt_mpi *m, MPI_Request *rq, int nrq)
{
    double end = now() + m->timeout;
    long nap = 1000; /* ns, doubling to 1 ms */
    for (;;) {
        int open = -1;
        for (int i = 0; i < nrq; i++) {
            if (rq[i] == MPI_REQUEST_NULL)
                continue;
            int done = 0;
            MPI_Test(&rq[i], &done, MPI_STATUS_IGNORE);
            if (!done && open < 0)
                open = i;
        }
        if (open < 0)
            return -1;
        pthread_mutex_lock(&m->mu);
        bool f = m->failed;
        pthread_mutex_unlock(&m->mu);
        if (f || now() > end)
            return open;
        struct timespec ts = {0, nap};
        nanosleep(&ts, NULL);
        nap = nap < 1000000 ? nap * 2 : nap;
    }
}

/* The collective core: member j of the group gets sc[j] elements of sb[j] from me and I get
 * rc[j] elements into rb[j] from member j (my own part is copied). One message each way per
 * pair, with a header that the receiver checks. */
static int exchange(ptrt_mpi *m, int me, const int *members, int n, int kind, ptc_dtype dt,
                    const ptrt_coll_desc *d, const void *const *sb, const int64_t *sc,
                    void *const *rb, const int64_t *rc, char *err, size_t errn)
{
    if (failed_now(m, me, err, errn))
        return -1;
    size_t es = (size_t)ptc_dtype_size(dt);
    int g = group_tag(members, n), q = -1;
    for (int j = 0; j < n; j++)
        if (members[j] == me)
            q = j;
    char what[512]; /* (the call's description, made only for a message) */
    if (q < 0)
        return fail(m, err, errn, "rank %d: %s: not a member of the group", me,
                    describe(what, sizeof what, kind, members, n, d));
    MPI_Request *rq = ptc_xmalloc(sizeof *rq * (size_t)(2 * n));
    char **bufs = ptc_xcalloc((size_t)(2 * n), sizeof *bufs);
    int rc_ = 0;
    for (int j = 0; j < n; j++) {
        rq[2 * j] = rq[2 * j + 1] = MPI_REQUEST_NULL;
        if (j == q)
            continue;
        size_t slen = sizeof(hdr) + (size_t)sc[j] * es, rlen = sizeof(hdr) + (size_t)rc[j] * es;
        if (slen > (size_t)INT32_MAX || rlen > (size_t)INT32_MAX) {
            rc_ = fail(m, err, errn, "rank %d: %s: a message of more than 2 GiB", me,
                       describe(what, sizeof what, kind, members, n, d));
            break;
        }
        hdr h = {.magic = MAGIC,
                 .kind = (uint32_t)kind,
                 .dtype = (uint32_t)dt,
                 .step = d ? d->step : -1,
                 .count = sc[j]};
        bufs[2 * j] = ptc_xmalloc(slen);
        memcpy(bufs[2 * j], &h, sizeof h);
        if (sc[j])
            memcpy(bufs[2 * j] + sizeof h, sb[j], (size_t)sc[j] * es);
        bufs[2 * j + 1] = ptc_xmalloc(rlen);
        int peer = proc_of(m, members[j]);
        MPI_Irecv(bufs[2 * j + 1], (int)rlen, MPI_BYTE, peer, tag_of(g, members[j], me, m->K),
                  MPI_COMM_WORLD, &rq[2 * j + 1]);
        MPI_Isend(bufs[2 * j], (int)slen, MPI_BYTE, peer, tag_of(g, me, members[j], m->K),
                  MPI_COMM_WORLD, &rq[2 * j]);
    }
    if (!rc_ && sc[q] != rc[q])
        rc_ = fail(m, err, errn, "rank %d: %s: sends itself %lld elements but expects %lld", me,
                   describe(what, sizeof what, kind, members, n, d), (long long)sc[q],
                   (long long)rc[q]);
    else if (!rc_ && rc[q])
        memmove(rb[q], sb[q], (size_t)rc[q] * es);
    int open = rc_ ? -1 : wait_deadline(m, rq, 2 * n);
    if (open >= 0) {
        int j = open / 2;
        char reason[1024];
        if (failed_now(m, me, reason, sizeof reason))
            rc_ = fail(m, err, errn, "%s", reason);
        else
            rc_ = fail(m, err, errn,
                       "rank %d: %s: timed out after %g s waiting for rank %d (process %d) to %s",
                       me, describe(what, sizeof what, kind, members, n, d), m->timeout, members[j],
                       proc_of(m, members[j]), open % 2 ? "send its part" : "take mine");
    }
    for (int j = 0; j < n && !rc_; j++) {
        if (j == q)
            continue;
        hdr h;
        memcpy(&h, bufs[2 * j + 1], sizeof h);
        if (h.magic != MAGIC || h.kind != (uint32_t)kind || h.dtype != (uint32_t)dt ||
            h.count != rc[j] || h.step != (d ? d->step : -1)) {
            rc_ = fail(m, err, errn,
                       "rank %d: collective mismatch: %s expects %lld %s elements from rank %d, "
                       "which sent %s of %lld %s elements at step %lld",
                       me, describe(what, sizeof what, kind, members, n, d), (long long)rc[j],
                       ptc_dtype_name(dt), members[j],
                       h.kind < K_SEND + 1 ? kind_name[h.kind] : "?", (long long)h.count,
                       h.dtype < 8 ? ptc_dtype_name((ptc_dtype)h.dtype) : "?", (long long)h.step);
            break;
        }
        if (rc[j])
            memcpy(rb[j], bufs[2 * j + 1] + sizeof h, (size_t)rc[j] * es);
    }
    if (!rc_)
        for (int i = 0; i < 2 * n; i++)
            free(bufs[i]);
    /* (after a failure the requests may still be open: their buffers stay, and the job ends) */
    free(bufs);
    free(rq);
    return rc_;
}

static float value_at(const void *p, ptc_dtype dt, int64_t i)
{
    if (dt == PTC_F32)
        return ((const float *)p)[i];
    uint16_t u = ((const uint16_t *)p)[i];
    return dt == PTC_BF16 ? ptc_bf16_value(u) : ptc_f16_value(u);
}

static void store_at(void *p, ptc_dtype dt, int64_t i, float v)
{
    if (dt == PTC_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = dt == PTC_BF16 ? ptc_bf16_bits(v) : ptc_f16_bits(v);
}

/* dst[i] = src[0][i] op src[1][i] op ... in float, left to right (the in-process order). */
static void reduce(void *dst, void *const *src, int n, int64_t len, ptrt_reduce op, ptc_dtype dt)
{
    for (int64_t i = 0; i < len; i++) {
        float acc = value_at(src[0], dt, i);
        for (int j = 1; j < n; j++) {
            float v = value_at(src[j], dt, i);
            acc = op == PTRT_RED_SUM ? acc + v : (acc > v || isnan(acc)) ? acc : v;
        }
        store_at(dst, dt, i, acc);
    }
}

/* n buffers of len elements each (freed by free_parts). */
static void **parts(int n, int64_t len, size_t es)
{
    void **p = ptc_xmalloc(sizeof *p * (size_t)n);
    for (int j = 0; j < n; j++)
        p[j] = ptc_xmalloc((size_t)len * es + 1);
    return p;
}

static void free_parts(void **p, int n)
{
    for (int j = 0; j < n; j++)
        free(p[j]);
    free(p);
}

/* Part j (of n, chunk elements in each of outer blocks) of a buffer, packed or unpacked. */
static void pack(void *dst, const void *src, int n, int j, int64_t outer, int64_t chunk, size_t es)
{
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)dst + (size_t)(o * chunk) * es,
               (const char *)src + (size_t)((o * n + j) * chunk) * es, (size_t)chunk * es);
}

static void unpack(void *dst, const void *src, int n, int j, int64_t outer, int64_t chunk,
                   size_t es)
{
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)dst + (size_t)((o * n + j) * chunk) * es,
               (const char *)src + (size_t)(o * chunk) * es, (size_t)chunk * es);
}

static int mpi_allreduce(void *impl, int me, const int *members, int n, const void *in, void *out,
                         int64_t count, ptc_dtype dt, ptrt_reduce op, const ptrt_coll_desc *d,
                         char *err, size_t errn)
{
    size_t es = (size_t)ptc_dtype_size(dt);
    void **got = parts(n, count, es);
    const void **sb = ptc_xmalloc(sizeof *sb * (size_t)n);
    int64_t *cnt = ptc_xmalloc(sizeof *cnt * (size_t)n);
    for (int j = 0; j < n; j++)
        sb[j] = in, cnt[j] = count;
    int rc = exchange(impl, me, members, n, K_ALLREDUCE, dt, d, sb, cnt, got, cnt, err, errn);
    if (!rc)
        reduce(out, got, n, count, op, dt);
    free_parts(got, n);
    free(sb);
    free(cnt);
    return rc;
}

static int mpi_allgather(void *impl, int me, const int *members, int n, const void *in, void *out,
                         int64_t outer, int64_t chunk, ptc_dtype dt, const ptrt_coll_desc *d,
                         char *err, size_t errn)
{
    size_t es = (size_t)ptc_dtype_size(dt);
    void **got = parts(n, outer * chunk, es);
    const void **sb = ptc_xmalloc(sizeof *sb * (size_t)n);
    int64_t *cnt = ptc_xmalloc(sizeof *cnt * (size_t)n);
    for (int j = 0; j < n; j++)
        sb[j] = in, cnt[j] = outer * chunk;
    int rc = exchange(impl, me, members, n, K_ALLGATHER, dt, d, sb, cnt, got, cnt, err, errn);
    for (int j = 0; j < n && !rc; j++)
        unpack(out, got[j], n, j, outer, chunk, es);
    free_parts(got, n);
    free(sb);
    free(cnt);
    return rc;
}

static int mpi_reduce_scatter(void *impl, int me, const int *members, int n, const void *in,
                              void *out, int64_t outer, int64_t chunk, ptc_dtype dt, ptrt_reduce op,
                              const ptrt_coll_desc *d, char *err, size_t errn)
{
    size_t es = (size_t)ptc_dtype_size(dt);
    void **mine = parts(n, outer * chunk, es), **got = parts(n, outer * chunk, es);
    int64_t *cnt = ptc_xmalloc(sizeof *cnt * (size_t)n);
    for (int j = 0; j < n; j++) {
        pack(mine[j], in, n, j, outer, chunk, es);
        cnt[j] = outer * chunk;
    }
    int rc = exchange(impl, me, members, n, K_REDUCE_SCATTER, dt, d, (const void *const *)mine, cnt,
                      got, cnt, err, errn);
    if (!rc)
        reduce(out, got, n, outer * chunk, op, dt);
    free_parts(mine, n);
    free_parts(got, n);
    free(cnt);
    return rc;
}

static int mpi_all_to_all(void *impl, int me, const int *members, int n, const void *in, void *out,
                          int64_t outer_in, int64_t chunk_in, int64_t outer_out, int64_t chunk_out,
                          ptc_dtype dt, const ptrt_coll_desc *d, char *err, size_t errn)
{
    size_t es = (size_t)ptc_dtype_size(dt);
    void **mine = parts(n, outer_in * chunk_in, es), **got = parts(n, outer_out * chunk_out, es);
    int64_t *sc = ptc_xmalloc(sizeof *sc * (size_t)n),
            *rcnt = ptc_xmalloc(sizeof *rcnt * (size_t)n);
    for (int j = 0; j < n; j++) {
        pack(mine[j], in, n, j, outer_in, chunk_in, es);
        sc[j] = outer_in * chunk_in;
        rcnt[j] = outer_out * chunk_out;
    }
    int rc = exchange(impl, me, members, n, K_ALL_TO_ALL, dt, d, (const void *const *)mine, sc, got,
                      rcnt, err, errn);
    for (int j = 0; j < n && !rc; j++)
        unpack(out, got[j], n, j, outer_out, chunk_out, es);
    free_parts(mine, n);
    free_parts(got, n);
    free(sc);
    free(rcnt);
    return rc;
}

static int mpi_all_to_all_v(void *impl, int me, const int *members, int n, const void *in,
                            const int64_t *send_count, const int64_t *send_off, int64_t in_len,
                            void *out, const int64_t *recv_count, const int64_t *recv_off,
                            int64_t out_len, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                            size_t errn)
{
    size_t es = (size_t)ptc_dtype_size(dt);
    for (int j = 0; j < n; j++)
        if (send_count[j] < 0 || send_off[j] < 0 || send_off[j] + send_count[j] > in_len ||
            recv_count[j] < 0 || recv_off[j] < 0 || recv_off[j] + recv_count[j] > out_len)
            return fail(impl, err, errn, "rank %d: all_to_all_v: part %d lies outside its buffer",
                        me, j);
    const void **sb = ptc_xmalloc(sizeof *sb * (size_t)n);
    void **got = ptc_xmalloc(sizeof *got * (size_t)n);
    for (int j = 0; j < n; j++) {
        sb[j] = (const char *)in + (size_t)send_off[j] * es;
        got[j] = ptc_xmalloc((size_t)recv_count[j] * es + 1);
    }
    int rc = exchange(impl, me, members, n, K_ALL_TO_ALL_V, dt, d, sb, send_count, got, recv_count,
                      err, errn);
    for (int j = 0; j < n && !rc; j++)
        memcpy((char *)out + (size_t)recv_off[j] * es, got[j], (size_t)recv_count[j] * es);
    free_parts(got, n);
    free(sb);
    return rc;
}

static int mpi_barrier(void *impl, int me, const int *members, int n, const ptrt_coll_desc *d,
                       char *err, size_t errn)
{
    const void **sb = ptc_xcalloc((size_t)n, sizeof *sb);
    void **rb = ptc_xcalloc((size_t)n, sizeof *rb);
    int64_t *cnt = ptc_xcalloc((size_t)n, sizeof *cnt);
    int rc = exchange(impl, me, members, n, K_BARRIER, PTC_F32, d, sb, cnt, rb, cnt, err, errn);
    free(sb);
    free(rb);
    free(cnt);
    return rc;
}

/* Completed buffered sends are freed (mu held). */
static void reap_sends(ptrt_mpi *m)
{
    int k = 0;
    for (int i = 0; i < m->nsends; i++) {
        int done = 0;
        MPI_Test(&m->sends[i].rq, &done, MPI_STATUS_IGNORE);
        if (done)
            free(m->sends[i].buf);
        else
            m->sends[k++] = m->sends[i];
    }
    m->nsends = k;
}

static int mpi_send(void *impl, int me, int peer, const void *buf, int64_t count, ptc_dtype dt,
                    const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_mpi *m = impl;
    if (failed_now(m, me, err, errn))
        return -1;
    size_t es = (size_t)ptc_dtype_size(dt), len = sizeof(hdr) + (size_t)count * es;
    if (len > (size_t)INT32_MAX)
        return fail(m, err, errn, "rank %d: send to rank %d: a message of more than 2 GiB", me,
                    peer);
    hdr h = {.magic = MAGIC,
             .kind = K_SEND,
             .dtype = (uint32_t)dt,
             .step = d ? d->step : -1,
             .count = count};
    char *b = ptc_xmalloc(len);
    memcpy(b, &h, sizeof h);
    memcpy(b + sizeof h, buf, (size_t)count * es);
    pthread_mutex_lock(&m->mu);
    reap_sends(m);
    PTC_GROW(m->sends, m->capsends, m->nsends);
    pending *p = &m->sends[m->nsends++];
    p->buf = b;
    MPI_Isend(b, (int)len, MPI_BYTE, proc_of(m, peer), tag_of(P2P_GROUP, me, peer, m->K),
              MPI_COMM_WORLD, &p->rq);
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static int mpi_recv(void *impl, int me, int peer, void *buf, int64_t count, ptc_dtype dt,
                    const ptrt_coll_desc *d, char *err, size_t errn)
{
    ptrt_mpi *m = impl;
    if (failed_now(m, me, err, errn))
        return -1;
    size_t es = (size_t)ptc_dtype_size(dt), len = sizeof(hdr) + (size_t)count * es;
    char *b = ptc_xmalloc(len);
    MPI_Request rq;
    MPI_Irecv(b, (int)len, MPI_BYTE, proc_of(m, peer), tag_of(P2P_GROUP, peer, me, m->K),
              MPI_COMM_WORLD, &rq);
    int rc = 0;
    if (wait_deadline(m, &rq, 1) >= 0) {
        char reason[1024];
        if (failed_now(m, me, reason, sizeof reason))
            rc = fail(m, err, errn, "%s", reason);
        else
            rc = fail(m, err, errn,
                      "rank %d: recv from rank %d (process %d) at step %lld: nothing arrived in "
                      "%g s",
                      me, peer, proc_of(m, peer), d ? (long long)d->step : -1LL, m->timeout);
        return rc; /* (b stays with the open request) */
    }
    hdr h;
    memcpy(&h, b, sizeof h);
    if (h.magic != MAGIC || h.kind != K_SEND || h.dtype != (uint32_t)dt || h.count != count ||
        h.step != (d ? d->step : -1))
        rc = fail(m, err, errn,
                  "rank %d: message mismatch: recv of %lld elements from rank %d at step %lld, "
                  "which sent %lld at step %lld",
                  me, (long long)count, peer, d ? (long long)d->step : -1LL, (long long)h.count,
                  (long long)h.step);
    else
        memcpy(buf, b + sizeof h, (size_t)count * es);
    free(b);
    return rc;
}

static void mpi_abort(void *impl, int rank, const char *msg)
{
    ptrt_mpi *m = impl;
    pthread_mutex_lock(&m->mu);
    if (!m->failed) {
        m->failed = true;
        snprintf(m->reason, sizeof m->reason, "%s", msg);
    }
    pthread_mutex_unlock(&m->mu);
}

static bool mpi_failed(void *impl, char *reason, size_t n)
{
    ptrt_mpi *m = impl;
    pthread_mutex_lock(&m->mu);
    bool f = m->failed;
    if (f && reason)
        ptc_fmt(reason, n, "%s", m->reason);
    pthread_mutex_unlock(&m->mu);
    return f;
}

static const ptrt_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_to_all = mpi_all_to_all,
    .all_to_all_v = mpi_all_to_all_v,
    .send = mpi_send,
    .recv = mpi_recv,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .failed = mpi_failed,
};

bool ptrt_mpi_available(void)
{
    return true;
}

ptrt_mpi *ptrt_mpi_new(int nranks, int per_process, double timeout_s, char *err, size_t errn)
{
    if (per_process < 1 || per_process > MAX_LOCAL) {
        ptc_fmt(err, errn, "--ranks-per-process must be 1 to %d", MAX_LOCAL);
        return NULL;
    }
    int provided = 0, flag = 0;
    MPI_Initialized(&flag);
    if (!flag && MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        ptc_fmt(err, errn, "MPI_Init_thread failed");
        return NULL;
    }
    initialised = true;
    if (!flag && provided < MPI_THREAD_MULTIPLE) {
        ptc_fmt(err, errn,
                "this MPI does not support MPI_THREAD_MULTIPLE, which ranks as threads "
                "of a process need");
        return NULL;
    }
    int proc, nprocs, *ub = NULL;
    MPI_Comm_rank(MPI_COMM_WORLD, &proc);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (!flag || !ub || *ub < ((P2P_GROUP << 12) | 0xfff)) {
        ptc_fmt(err, errn, "this MPI's largest tag (%d) is too small", flag && ub ? *ub : -1);
        return NULL;
    }
    if ((int64_t)nprocs * per_process != nranks) {
        ptc_fmt(err, errn,
                "the plan has %d ranks, but the launcher started %d process%s x %d rank%s per "
                "process (--ranks-per-process) = %d: start %d process%s%s",
                nranks, nprocs, nprocs == 1 ? "" : "es", per_process, per_process == 1 ? "" : "s",
                nprocs * per_process, nranks % per_process ? 0 : nranks / per_process,
                nranks / per_process == 1 ? "" : "es",
                nranks % per_process ? " (the ranks do not divide by --ranks-per-process)" : "");
        return NULL;
    }
    ptrt_mpi *m = ptc_xcalloc(1, sizeof *m);
    m->nranks = nranks;
    m->K = per_process;
    m->proc = proc;
    m->nprocs = nprocs;
    m->timeout = timeout_s;
    pthread_mutex_init(&m->mu, NULL);
    m->comm = (ptrt_comm){.ops = &mpi_ops, .impl = m, .nranks = nranks};
    return m;
}

void ptrt_mpi_free(ptrt_mpi *m)
{
    if (!m)
        return;
    if (!m->failed) { /* the last messages have been received: the sends are done */
        MPI_Request *rq = ptc_xmalloc(sizeof *rq * (size_t)(m->nsends + 1));
        for (int i = 0; i < m->nsends; i++)
            rq[i] = m->sends[i].rq;
        if (wait_deadline(m, rq, m->nsends) < 0)
            for (int i = 0; i < m->nsends; i++)
                free(m->sends[i].buf);
        free(rq);
    }
    free(m->sends);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

ptrt_comm *ptrt_mpi_comm(ptrt_mpi *m)
{
    return &m->comm;
}

int ptrt_mpi_process(const ptrt_mpi *m)
{
    return m->proc;
}

int ptrt_mpi_nprocesses(const ptrt_mpi *m)
{
    return m->nprocs;
}

int ptrt_mpi_first_rank(const ptrt_mpi *m)
{
    return m->proc * m->K;
}

int ptrt_mpi_sum(ptrt_mpi *m, double *v, int64_t n, int root, char *err, size_t errn)
{
    for (int64_t i = 0; i < n;) { /* in pieces an int counts */
        int k = n - i > (1 << 28) ? 1 << 28 : (int)(n - i), rc;
        if (root < 0)
            rc = MPI_Allreduce(MPI_IN_PLACE, v + i, k, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        else if (root == m->proc)
            rc = MPI_Reduce(MPI_IN_PLACE, v + i, k, MPI_DOUBLE, MPI_SUM, root, MPI_COMM_WORLD);
        else
            rc = MPI_Reduce(v + i, NULL, k, MPI_DOUBLE, MPI_SUM, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) {
            ptc_fmt(err, errn, "process %d: summing the full tensors across processes failed",
                    m->proc);
            return -1;
        }
        i += k;
    }
    return 0;
}

double *ptrt_mpi_gather(ptrt_mpi *m, const double *v, int n, int root, int *total, char *err,
                        size_t errn)
{
    /* every process learns the counts, so all give up together on too many */
    int *count = ptc_xcalloc((size_t)(2 * m->nprocs), sizeof(int)), *at = count + m->nprocs;
    double *all = NULL;
    int rc = MPI_Allgather(&n, 1, MPI_INT, count, 1, MPI_INT, MPI_COMM_WORLD);
    int64_t sum = 0;
    for (int q = 0; q < m->nprocs; q++)
        at[q] = (int)(sum < INT32_MAX ? sum : 0), sum += count[q];
    if (rc == MPI_SUCCESS && sum > INT32_MAX) {
        ptc_fmt(err, errn, "process %d: %lld values to gather at one process, more than %d",
                m->proc, (long long)sum, INT32_MAX);
        free(count);
        return NULL;
    }
    if (rc == MPI_SUCCESS) {
        all = ptc_xmalloc(sizeof(double) * (size_t)(m->proc == root && sum ? sum : 1));
        rc = MPI_Gatherv(v, n, MPI_DOUBLE, all, count, at, MPI_DOUBLE, root, MPI_COMM_WORLD);
    }
    free(count);
    if (rc != MPI_SUCCESS) {
        ptc_fmt(err, errn, "process %d: gathering values at process %d failed", m->proc, root);
        free(all);
        return NULL;
    }
    *total = (int)sum;
    return all;
}

void ptrt_mpi_finish(int rc)
{
    int fin = 0;
    if (!initialised || (MPI_Finalized(&fin), fin))
        return;
    if (rc) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    MPI_Finalize();
}

#endif
