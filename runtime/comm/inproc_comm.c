/* inproc_comm.c - the communicator interface (comm.h) over the in-process communicator: each
 * operation the inproc.h call of the same name (ptrt_inproc_comm pairs them with their
 * communicator). */
#include "inproc.h"

static int if_allreduce(void *impl, int me, const int *members, int n, const void *in, void *out,
                        int64_t count, ptc_dtype dt, ptrt_reduce op, const ptrt_coll_desc *d,
                        char *err, size_t errn)
{
    return ptrt_inproc_allreduce_dt(impl, me, members, n, in, out, count, dt, op, d, err, errn);
}

static int if_allgather(void *impl, int me, const int *members, int n, const void *in, void *out,
                        int64_t outer, int64_t chunk, ptc_dtype dt, const ptrt_coll_desc *d,
                        char *err, size_t errn)
{
    return ptrt_inproc_allgather_dt(impl, me, members, n, in, out, outer, chunk, dt, d, err,
                                    errn);
}

static int if_reduce_scatter(void *impl, int me, const int *members, int n, const void *in,
                             void *out, int64_t outer, int64_t chunk, ptc_dtype dt, ptrt_reduce op,
                             const ptrt_coll_desc *d, char *err, size_t errn)
{
    return ptrt_inproc_reduce_scatter_dt(impl, me, members, n, in, out, outer, chunk, dt, op, d,
                                         err, errn);
}

static int if_all_to_all(void *impl, int me, const int *members, int n, const void *in, void *out,
                         int64_t outer_in, int64_t chunk_in, int64_t outer_out, int64_t chunk_out,
                         ptc_dtype dt, const ptrt_coll_desc *d, char *err, size_t errn)
{
    return ptrt_inproc_all_to_all_dt(impl, me, members, n, in, out, outer_in, chunk_in, outer_out,
                                     chunk_out, dt, d, err, errn);
}

static int if_all_to_all_v(void *impl, int me, const int *members, int n, const void *in,
                           const int64_t *send_count, const int64_t *send_off, int64_t in_len,
                           void *out, const int64_t *recv_count, const int64_t *recv_off,
                           int64_t out_len, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                           size_t errn)
{
    return ptrt_inproc_all_to_all_v_dt(impl, me, members, n, in, send_count, send_off, in_len, out,
                                       recv_count, recv_off, out_len, dt, d, err, errn);
}

static int if_send(void *impl, int me, int peer, const void *buf, int64_t count, ptc_dtype dt,
                   const ptrt_coll_desc *d, char *err, size_t errn)
{
    return ptrt_inproc_send_dt(impl, me, peer, buf, count, dt, d, err, errn);
}

static int if_recv(void *impl, int me, int peer, void *buf, int64_t count, ptc_dtype dt,
                   const ptrt_coll_desc *d, char *err, size_t errn)
{
    return ptrt_inproc_recv_dt(impl, me, peer, buf, count, dt, d, err, errn);
}

static int if_barrier(void *impl, int me, const int *members, int n, const ptrt_coll_desc *d,
                      char *err, size_t errn)
{
    return ptrt_inproc_barrier(impl, me, members, n, d, err, errn);
}

static void if_abort(void *impl, int rank, const char *msg)
{
    ptrt_inproc_abort(impl, rank, msg);
}

static bool if_failed(void *impl, char *reason, size_t n)
{
    return ptrt_inproc_failed(impl, reason, n);
}

const ptrt_comm_ops ptrt_inproc_ops = {
    .name = "in-process",
    .allreduce = if_allreduce,
    .allgather = if_allgather,
    .reduce_scatter = if_reduce_scatter,
    .all_to_all = if_all_to_all,
    .all_to_all_v = if_all_to_all_v,
    .send = if_send,
    .recv = if_recv,
    .barrier = if_barrier,
    .abort = if_abort,
    .failed = if_failed,
};
