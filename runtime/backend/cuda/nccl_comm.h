/* nccl_comm.h - the communicator of ranks on distinct GPUs, over NCCL: collectives stay on the
 * GPUs. The ranks are threads of one process, or of several processes under an MPI launcher
 * (mpirun, srun: one process per GPU, or several GPUs per process with --ranks-per-process).
 *
 *   communicators  one per set of mesh axes the plan's collectives use, for each group of it:
 *                  the group's first member makes an ncclUniqueId, which travels to the other
 *                  members over the host communicator (the in-process one, or MPI: the
 *                  launcher's channel), and every member joins with ncclCommInitRank from a
 *                  thread of its own, at start;
 *   layouts        allreduce, and allgather and reduce_scatter of whole parts (outer 1), go to
 *                  NCCL as they are; parts interleaved in blocks (outer > 1) and all_to_all's
 *                  parts are packed into a scratch buffer of the rank's GPU with strided copies
 *                  (cuMemcpy2D) around the NCCL call; all_to_all_v sends and receives its
 *                  parts in one group;
 *   order          every call on a stream of the rank's own, after the kernels before it (an
 *                  event of the default stream); allreduce, and allgather and reduce_scatter
 *                  of whole parts, finish in the background when the caller asks (comm.h:
 *                  token): the executor waits for them (wait: the default stream waits for
 *                  the call's event) only before an instruction that needs their buffers;
 *                  the others, and every host-blocking call, wait at once;
 *   buckets        allreduces in the background of at most 256 KiB (biases, norms: most of a
 *                  model's tensors, little of its bytes) wait in a bucket of their group, dtype
 *                  and op, sent as one NCCL call once full (4 MiB), before any other call, or
 *                  when one of them is waited for: packed on the default stream into one of
 *                  two buffers in turn, reduced in place on the collectives' stream, copied
 *                  out there (larger ones go to NCCL as they are);
 *   point to point sends and receives (pipeline stages) go through host memory (staged.h):
 *                  NCCL's sends wait for their receive, where the plans' schedules count on
 *                  buffered sends.
 * Sums are NCCL's (ring or tree order): every member gets the same bits, but not the order of
 * the in-process communicator, so results differ from the CPU's by float rounding. A plan with
 * more ranks than GPUs (NCCL takes one rank per GPU) runs on the device communicator where all
 * share one GPU (inproc.h, ptrt_inproc_new_on), else, like a run without NCCL, on the
 * host-staged one.
 */
#ifndef PTRT_NCCL_COMM_H
#define PTRT_NCCL_COMM_H

#include "backend.h"
#include "comm.h"
#include "program.h"

typedef struct ptrt_ncclc ptrt_ncclc;

/* The communicator of plan's ranks on backend be (cuda or cuda-emulated), this process running
 * ranks [first, first + nlocal) (all of them on threads; a share of them under an MPI launcher),
 * host being the host communicator of all ranks (the ncclUniqueIds travel over it; barriers,
 * failures, point to point). Every process calls it at the same point. NULL with why and
 * *failed false where NCCL cannot serve the plan (a GPU shared by two ranks, a process without
 * NCCL: every process comes to the same verdict, nothing has failed and another communicator
 * may serve); NULL with *failed true where the start failed (the host communicator is then
 * aborted). */
ptrt_ncclc *ptrt_nccl_new(const ptc_plan *plan, const ptrt_backend *be, ptrt_comm *host,
                          int first, int nlocal, bool *failed, char *err, size_t errn);
void ptrt_nccl_free(ptrt_ncclc *c);
/* Rank's allreduces that went into buckets (small ones in the background: at most 256 KiB, in
 * buckets of at most 4 MiB, the members' sizes being equal), and the NCCL calls of those
 * buckets, since it was made. */
void ptrt_nccl_buckets(const ptrt_ncclc *c, int rank, int64_t *bucketed, int64_t *calls);
ptrt_comm *ptrt_nccl_comm(ptrt_ncclc *c);

/* A rank's identity record, which every rank gathers to decide whether NCCL serves (ranks whose
 * records match share a GPU): ok (this process has NCCL), then "host|bus id" zero-padded, so that
 * every one of its 64 bytes is a function of those three (exposed for the test) */
#define PTRT_NCCL_ID_WORDS 16
void ptrt_nccl_identity(int32_t *rec, bool ok, const char *host, const char *bus);

#endif
