/* inproc.h - the in-process communicator: collectives and point-to-point messages between ranks that
 * run as threads of one process (the CPU backend).
 *
 * It is the reference for every other communicator, so it is deterministic (reductions add the
 * members' contributions in group order, in float, the same way on every member, so replicas end
 * bit-identical and runs repeat bit for bit) and it never hangs: a wait longer than the timeout
 * fails with a message naming the rank, the collective, the group, the step and the ranks that did
 * not arrive.
 *
 * Groups. A group is a set of ranks (a slice of a mesh axis: a tp group, a dp group, ...), named
 * in every call by its member list in group order, the same array on every member. The set
 * identifies the group: a rank belongs to many groups and collectives on different groups may
 * interleave. The k-th collective a rank calls on a group matches the k-th collective of every
 * other member; when the members disagree (kind, sizes, op, step, member order) every member fails
 * with a message naming two of them, e.g.
 *   rank 2: collective mismatch on group tp [0,1,2,3] at step 3: rank 2 called
 *   allgather(outer 1, chunk 4096) but rank 0 called allreduce(count 4096, sum)
 *
 * Failure. The first error of any call (timeout, mismatch, invalid arguments, ptrt_inproc_abort)
 * poisons the communicator: waiting ranks wake at once and every later call fails fast, naming the
 * original reason. A training run is over once its communicator has failed.
 *
 * Threads. Any number of ranks may call concurrently; the calls of one rank must come from one
 * thread at a time (a rank is one sequential program). A member's buffers must stay valid and
 * unchanged until its call returns; the output of one member must not overlap the input of another.
 *
 * Every call taking (err, errn) returns 0, or -1 with a message in err. Messages start with
 * "rank R: " (the calling rank).
 */
#ifndef PTRT_INPROC_H
#define PTRT_INPROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"

typedef struct ptrt_inproc ptrt_inproc;

/* Creates a communicator for ranks 0 .. nranks-1. timeout_s (> 0) bounds every single wait: for the
 * other members to arrive at a collective, or for a message to arrive in ptrt_inproc_recv. Returns
 * NULL with a message when nranks < 1 or the timeout is not a positive finite number. */
ptrt_inproc *ptrt_inproc_new(int nranks, double timeout_s, char *err, size_t errn);
/* A device communicator: the same communicator over buffers in the memory of device backend be
 * (cuda), for ranks that are threads of this process sharing one device (several ranks on one
 * GPU, where NCCL takes one rank per GPU). Every rule above holds, results bit for bit included;
 * the data moves and reductions are queued on the device through be's move, copy2d and reduce
 * hooks (backend.h), on its one stream, so a member reading another's buffer after the phase-A
 * barrier reads what that member's kernels wrote before it called; messages in flight and the
 * temporaries of overlapping calls are device memory. The calling threads must be bound to
 * their ranks' device. be NULL, or a host backend: ptrt_inproc_new. NULL with a message when
 * be lacks the hooks. */
struct ptrt_backend;
ptrt_inproc *ptrt_inproc_new_on(int nranks, double timeout_s, const struct ptrt_backend *be,
                                char *err, size_t errn);
/* Frees the communicator and any messages sent but never received. No rank may be inside a call. */
void ptrt_inproc_free(ptrt_inproc *c);
/* The communicator interface over c (comm.h), with every dtype (see the _dt calls). The interface
 * is c's own and lives as long as c; its operations are ptrt_inproc_ops (inproc_comm.c). */
extern const ptrt_comm_ops ptrt_inproc_ops;
ptrt_comm *ptrt_inproc_comm(ptrt_inproc *c);

/* The calls below in any dtype: f32, i32, bf16 and f16 data move as stored (2 or 4 bytes an
 * element); sums and maxima are taken in float, left to right over the members, and a 16-bit
 * result is rounded once at the end; i32 data cannot be reduced. The float versions below are
 * these with PTC_F32. Every member must pass the same dtype (else a mismatch). */
int ptrt_inproc_allreduce_dt(ptrt_inproc *c, int me, const int *members, int n, const void *in,
                             void *out, int64_t count, ptc_dtype dt, ptrt_reduce op,
                             const ptrt_coll_desc *d, char *err, size_t errn);
int ptrt_inproc_allgather_dt(ptrt_inproc *c, int me, const int *members, int n, const void *in,
                             void *out, int64_t outer, int64_t chunk, ptc_dtype dt,
                             const ptrt_coll_desc *d, char *err, size_t errn);
int ptrt_inproc_reduce_scatter_dt(ptrt_inproc *c, int me, const int *members, int n,
                                  const void *in, void *out, int64_t outer, int64_t chunk,
                                  ptc_dtype dt, ptrt_reduce op, const ptrt_coll_desc *d,
                                  char *err, size_t errn);
int ptrt_inproc_all_to_all_dt(ptrt_inproc *c, int me, const int *members, int n, const void *in,
                              void *out, int64_t outer_in, int64_t chunk_in, int64_t outer_out,
                              int64_t chunk_out, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                              size_t errn);
int ptrt_inproc_send_dt(ptrt_inproc *c, int me, int peer, const void *buf, int64_t count,
                        ptc_dtype dt, const ptrt_coll_desc *d, char *err, size_t errn);
int ptrt_inproc_recv_dt(ptrt_inproc *c, int me, int peer, void *buf, int64_t count, ptc_dtype dt,
                        const ptrt_coll_desc *d, char *err, size_t errn);
int ptrt_inproc_nranks(const ptrt_inproc *c);

/* Sum or max of every member's in (count floats) into every member's out. Element x of the result
 * is in_0[x] op in_1[x] op ... op in_{n-1}[x], evaluated left to right in float, where in_j is the
 * input of members[j]: every member gets the same bits. in == out (in place) is allowed; so is any
 * other overlap of in and out. MAX propagates NaN.
 * members: the n ranks of the group in group order, the same array on every member, me among
 * them. */
int ptrt_inproc_allreduce(ptrt_inproc *c, int me, const int *members, int n, const float *in,
                        float *out, int64_t count, ptrt_reduce op, const ptrt_coll_desc *d,
                        char *err, size_t errn);

/* Layout of the gather-like calls. A buffer holding n parts of a tensor split along a dimension d
 * is `outer` blocks of (n * chunk) floats; part j is at offset j * chunk within every block, where
 * outer = product of the dims before d and chunk = (dim d / n) * product of the dims after d.
 * ptrt_comm_split computes (outer, chunk) from the shape of such a buffer.
 *
 * Allgather (Shard(d) -> Replicate): in is one part (outer * chunk floats, i.e. the local shard
 * laid out contiguously); out (outer * n * chunk) receives member j's in as part j.
 * Example: a [3][4*n][5] tensor sharded on its middle dim: local [3][4][5], outer 3, chunk 20.
 * In place: with outer 1, in may be my own part of out (out + me * chunk): the others' parts
 * arrive around it. */
int ptrt_inproc_allgather(ptrt_inproc *c, int me, const int *members, int n, const float *in,
                        float *out, int64_t outer, int64_t chunk, const ptrt_coll_desc *d,
                        char *err, size_t errn);

/* Reduce-scatter (Partial -> Shard(d)): in holds n parts (outer * n * chunk floats); out (outer *
 * chunk) receives part `me` (my position in members) of the sum or max over the members, reduced in
 * group order as in ptrt_inproc_allreduce. in and out may overlap. */
int ptrt_inproc_reduce_scatter(ptrt_inproc *c, int me, const int *members, int n, const float *in,
                             float *out, int64_t outer, int64_t chunk, ptrt_reduce op,
                             const ptrt_coll_desc *d, char *err, size_t errn);

/* All-to-all (Shard(from) -> Shard(to)). Every member holds the tensor sharded along dim `from`;
 * afterwards it holds it sharded along dim `to`.
 *   in:  my local shard, viewed as n parts split along `to`: outer_in blocks of n * chunk_in
 *        floats. Part p goes to members[p].
 *   out: my new local shard, viewed as n parts split along `from`: outer_out blocks of
 *        n * chunk_out floats. Part j comes from members[j].
 * A part is a sub-tensor (full except for dims from and to); it travels in row-major order, so
 * outer_in * chunk_in == outer_out * chunk_out. With ptrt_comm_split:
 *   ptrt_comm_split(in_shape, ndim, to, n, &outer_in, &chunk_in);
 *   ptrt_comm_split(out_shape, ndim, from, n, &outer_out, &chunk_out);
 * Example: T is [4][6], n = 2, Shard(0) -> Shard(1). Member k holds rows 2k, 2k+1 ([2][6]) and
 * wants columns 3k .. 3k+2 of every row ([4][3]). in: outer_in 2, chunk_in 3 (row r of the shard
 * sends its columns 3p .. 3p+2 to member p); out: outer_out 1, chunk_out 6 (member j's 2 x 3 part
 * becomes rows 2j, 2j+1). in and out may overlap. */
int ptrt_inproc_all_to_all(ptrt_inproc *c, int me, const int *members, int n, const float *in,
                         float *out, int64_t outer_in, int64_t chunk_in, int64_t outer_out,
                         int64_t chunk_out, const ptrt_coll_desc *d, char *err, size_t errn);

/* All-to-all with uneven counts (MPI_Alltoallv; expert parallelism's exchange of the rows of
 * kept choices). send_count[j] elements of in from send_off[j] go to members[j]; recv_count[j]
 * elements from members[j] arrive at recv_off[j] of out (elements, in group order). in holds
 * in_len elements and out out_len; every part must lie inside. Member i's send_count[j] must
 * equal member j's recv_count[i]: every member checks every pair, and a difference fails the
 * call on every member, naming both ranks and both counts. Elements of out outside the parts
 * received keep their bytes. in and out may overlap. */
int ptrt_inproc_all_to_all_v_dt(ptrt_inproc *c, int me, const int *members, int n, const void *in,
                                const int64_t *send_count, const int64_t *send_off, int64_t in_len,
                                void *out, const int64_t *recv_count, const int64_t *recv_off,
                                int64_t out_len, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                                size_t errn);

/* Returns when every member has called it (matched like any collective). */
int ptrt_inproc_barrier(ptrt_inproc *c, int me, const int *members, int n, const ptrt_coll_desc *d,
                      char *err, size_t errn);

/* Point to point. Messages from one sender to one receiver match in order. Sends are buffered
 * (eager): ptrt_inproc_send copies buf and returns without waiting for the receiver, so schedules in
 * which both sides send before they receive (1F1B pipelines) cannot deadlock; the price is a copy
 * and memory for the messages in flight. ptrt_inproc_recv waits up to the timeout for the next
 * message from peer; its count and step must equal the sender's, or both calls' descriptions are
 * reported (and the communicator fails, so the sender learns of it at its next call). */
int ptrt_inproc_send(ptrt_inproc *c, int me, int peer, const float *buf, int64_t count,
                   const ptrt_coll_desc *d, char *err, size_t errn);
int ptrt_inproc_recv(ptrt_inproc *c, int me, int peer, float *buf, int64_t count,
                   const ptrt_coll_desc *d, char *err, size_t errn);

/* A failing rank calls this so the others stop waiting at once; their calls fail with
 * "aborted: rank R failed: MSG". Keeps the first reason if the communicator had already failed. */
void ptrt_inproc_abort(ptrt_inproc *c, int rank, const char *msg);
/* True once the communicator has failed; copies the first reason into reason (may be NULL). */
bool ptrt_inproc_failed(ptrt_inproc *c, char *reason, size_t n);

#endif

