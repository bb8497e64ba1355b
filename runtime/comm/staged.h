/* staged.h - a communicator for ranks whose tensors are in device memory (the cuda backend),
 * over a host communicator (in-process or MPI): each call copies its operands to host memory,
 * runs the host communicator's call, and copies the results back. The same results, bit for bit,
 * as the host communicator gives; slow (every byte crosses the bus twice and the reduction runs
 * on the CPU), but it runs any plan's collectives on GPUs: ranks in several processes (MPI), or
 * more ranks than GPUs on several GPUs. (One GPU per rank: NCCL, nccl_comm.h; all ranks on one
 * GPU: the device communicator, inproc.h.)
 *
 * Host buffers: one per rank, grown to the largest call and kept (calls of one rank never
 * overlap: a rank's program runs on one thread).
 */
#ifndef PTRT_STAGED_H
#define PTRT_STAGED_H

#include "backend.h"
#include "comm.h"

typedef struct ptrt_staged ptrt_staged;

/* Over host for ranks on backend be (a device backend). */
ptrt_staged *ptrt_staged_new(ptrt_comm *host, const ptrt_backend *be, int nranks);
void ptrt_staged_free(ptrt_staged *s);
/* The communicator (device true); valid until ptrt_staged_free. */
ptrt_comm *ptrt_staged_comm(ptrt_staged *s);

#endif
