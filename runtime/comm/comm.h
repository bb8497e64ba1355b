/* comm.h - the communicator interface: what a rank's program needs to talk to the other ranks.
 *
 * Collectives over a group and point-to-point messages, with dtypes. Implementations: in-process
 * (ranks are threads of one process: inproc.h), and later MPI (one rank per process) and NCCL (one
 * per GPU). Every implementation keeps the in-process one's contract:
 *
 *   Groups   a group is a set of ranks named in every call by its member list in ascending order,
 *            the same array on every member (a mesh axis's slice, or several axes at once); the
 *            k-th collective a rank calls on a group matches the k-th of every other member.
 *   Order    reductions add the members' contributions in group order, so every member gets the
 *            same bits and runs repeat bit for bit.
 *   Layouts  a buffer holding n parts of a tensor split along a dimension d is `outer` blocks of
 *            n * chunk elements; part j is at offset j * chunk in every block (outer = product of
 *            the dims before d, chunk = (dim d / n) * product of the dims after d;
 *            ptrt_comm_split computes them). allgather: in is one part (outer * chunk), out
 *            receives member j's part as part j. reduce_scatter: in holds n parts, out receives
 *            part `me` of the reduction. all_to_all: in is viewed as n parts along the new dim
 *            (outer_in, chunk_in), part p going to members[p]; out as n parts along the old dim
 *            (outer_out, chunk_out), part j coming from members[j]. all_to_all_v (uneven
 *            counts, as MPI_Alltoallv): send_count[j] elements of in from send_off[j] go to
 *            members[j], recv_count[j] from members[j] arrive at recv_off[j] of out; member i's
 *            send_count[j] equals member j's recv_count[i] (a difference is a mismatch).
 *   Messages sends are buffered (a send returns without waiting for its receive); messages from
 *            one sender to one receiver arrive in order and must agree in size and step.
 *   Failure  no call waits longer than the communicator's timeout; a failure (timeout, mismatch,
 *            abort) names the rank, the call, the group and the step, and every later call fails
 *            fast with the first reason.
 * Every call taking (err, errn) returns 0, or -1 with a message in err starting "rank R: ".
 */
#ifndef PTRT_COMM_H
#define PTRT_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir.h"

typedef enum { PTRT_RED_SUM, PTRT_RED_MAX } ptrt_reduce;

/* What a call is, for messages and for matching. NULL is allowed (no name, step -1, index -1). */
typedef struct ptrt_coll_desc {
    const char *group_name; /* the mesh axes, e.g. "tp", "dp" (may be NULL) */
    int64_t step;           /* training step: must agree between the members of a collective */
    int index;              /* position of this call in the rank's program: messages only */
    /* Non-NULL: the caller lets allreduce, allgather or reduce_scatter finish in the background.
     * A communicator that does (one with `wait`: NCCL on a stream of its own) sets *token > 0
     * and the call returns once it is queued; its buffers must then stay untouched (in unwritten,
     * out neither read nor written) until wait(token). Otherwise *token = 0 and the call is
     * complete on return, as always. */
    int64_t *token;
} ptrt_coll_desc;

typedef struct ptrt_comm_ops {
    const char *name;
    int (*allreduce)(void *impl, int me, const int *members, int n, const void *in, void *out,
                     int64_t count, ptc_dtype dt, ptrt_reduce op, const ptrt_coll_desc *d,
                     char *err, size_t errn);
    int (*allgather)(void *impl, int me, const int *members, int n, const void *in, void *out,
                     int64_t outer, int64_t chunk, ptc_dtype dt, const ptrt_coll_desc *d,
                     char *err, size_t errn);
    int (*reduce_scatter)(void *impl, int me, const int *members, int n, const void *in,
                          void *out, int64_t outer, int64_t chunk, ptc_dtype dt, ptrt_reduce op,
                          const ptrt_coll_desc *d, char *err, size_t errn);
    int (*all_to_all)(void *impl, int me, const int *members, int n, const void *in, void *out,
                      int64_t outer_in, int64_t chunk_in, int64_t outer_out, int64_t chunk_out,
                      ptc_dtype dt, const ptrt_coll_desc *d, char *err, size_t errn);
    /* in holds in_len elements, out out_len: every part lies inside */
    int (*all_to_all_v)(void *impl, int me, const int *members, int n, const void *in,
                        const int64_t *send_count, const int64_t *send_off, int64_t in_len,
                        void *out, const int64_t *recv_count, const int64_t *recv_off,
                        int64_t out_len, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                        size_t errn);
    int (*send)(void *impl, int me, int peer, const void *buf, int64_t count, ptc_dtype dt,
                const ptrt_coll_desc *d, char *err, size_t errn);
    int (*recv)(void *impl, int me, int peer, void *buf, int64_t count, ptc_dtype dt,
                const ptrt_coll_desc *d, char *err, size_t errn);
    int (*barrier)(void *impl, int me, const int *members, int n, const ptrt_coll_desc *d,
                   char *err, size_t errn);
    /* a failing rank calls this so the others stop waiting at once */
    void (*abort)(void *impl, int rank, const char *msg);
    /* true once the communicator has failed, with the first reason */
    bool (*failed)(void *impl, char *reason, size_t n);
    /* Optional (NULL: no call finishes in the background). Everything after this returns (the
     * device's later work, or the host's reads) sees the background calls of rank me up to
     * token (tokens finish in order), or all of them with token < 0. 0, or -1 with why. */
    int (*wait)(void *impl, int me, int64_t token, char *err, size_t errn);
} ptrt_comm_ops;

typedef struct ptrt_comm {
    const ptrt_comm_ops *ops;
    void *impl;
    int nranks;
    /* whether its calls take a device backend's memory (NCCL, a device communicator); the host
     * communicators (in-process, MPI) read and write host memory only */
    bool device;
} ptrt_comm;

/* (outer, chunk) for a buffer of shape[ndim] viewed as `parts` parts along dim: outer = product of
 * shape[0 .. dim), chunk = shape[dim] / parts * product of shape(dim .. ndim). Returns -1 when dim
 * is out of range, parts < 1, shape[dim] is not a multiple of parts, or a size overflows. */
int ptrt_comm_split(const int64_t *shape, int ndim, int dim, int parts, int64_t *outer,
                    int64_t *chunk);

#endif
