/* nccl_comm.h - the communicator of ranks on distinct GPUs of this process (threads), over NCCL:
 * collectives stay on the GPUs.
 *
 *   communicators  one per rank made with ncclCommInitAll, then one per set of mesh axes the
 *                  plan's collectives use, split from it (ncclCommSplit in one group, every rank
 *                  at once, at start);
 *   layouts        allreduce, and allgather and reduce_scatter of whole parts (outer 1), go to
 *                  NCCL as they are; parts interleaved in blocks (outer > 1) and all_to_all's
 *                  parts are packed into a scratch buffer of the rank's GPU with strided copies
 *                  (cuMemcpy2D) around the NCCL call; all_to_all_v sends and receives its
 *                  parts in one group;
 *   order          every call on the default stream, after the kernels before it;
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

/* The communicator of plan's ranks on backend be (cuda or cuda-emulated), host being the host
 * communicator of the same ranks (barriers, failures, point to point). NULL with why where NCCL
 * cannot serve the plan. */
ptrt_ncclc *ptrt_nccl_new(const ptc_plan *plan, const ptrt_backend *be, ptrt_comm *host,
                          char *err, size_t errn);
void ptrt_nccl_free(ptrt_ncclc *c);
ptrt_comm *ptrt_nccl_comm(ptrt_ncclc *c);

#endif
