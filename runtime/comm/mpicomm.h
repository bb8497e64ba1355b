/* mpicomm.h - ranks in several processes: the communicator over MPI (comm.h) and what the training
 * loop needs of the processes (which ranks are mine, sums across processes, the end of the job).
 *
 * A job launched by mpirun or srun runs one process per MPI rank; each process runs K ranks of the
 * plan as threads (--ranks-per-process K, default 1): process p runs ranks [p K, (p + 1) K). Every
 * message between two ranks, in one process or two, goes through MPI (MPI_THREAD_MULTIPLE), so
 * there is one path to test.
 *
 * The communicator keeps the in-process one's contract (comm.h): collectives are exchanges of
 * nonblocking point-to-point messages between the members, and a reduction adds the members'
 * contributions in group order in float at every member, so a run gives the same bits as the
 * same plan on threads. Each message carries a header (what call it is, its dtype, step and
 * element count), checked on arrival: a mismatch names both ranks. Messages of one pair of ranks
 * on one group keep their order (an MPI tag per group and pair). Every wait has a deadline (the
 * --comm-timeout): a member that does not deliver in time becomes an error naming it, its
 * process, the call, the group and the step. A failed process reports its error and ends the job
 * with MPI_Abort (ptrt_mpi_finish), so the others never wait past their timeout.
 */
#ifndef PTRT_MPICOMM_H
#define PTRT_MPICOMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"

typedef struct ptrt_mpi ptrt_mpi;

/* Whether this process was started by an MPI launcher (Open MPI's mpirun, MPICH's hydra, Slurm's
 * srun), from their environment variables; without one a run uses threads only. */
bool ptrt_mpi_launched(void);
/* Whether this build has MPI. */
bool ptrt_mpi_available(void);

/* Initialises MPI (once per process) for a plan of nranks ranks, K per process; NULL with a
 * message when the process count times K is not nranks, or MPI cannot start. */
ptrt_mpi *ptrt_mpi_new(int nranks, int per_process, double timeout_s, char *err, size_t errn);
void ptrt_mpi_free(ptrt_mpi *m);
ptrt_comm *ptrt_mpi_comm(ptrt_mpi *m);
int ptrt_mpi_process(const ptrt_mpi *m);    /* this process's MPI rank */
int ptrt_mpi_nprocesses(const ptrt_mpi *m); /* the job's processes */
int ptrt_mpi_first_rank(const ptrt_mpi *m); /* the first plan rank this process runs */
/* v[i] = the sum over processes of v[i] (doubles: exact for the counts and replicated values the
 * training loop merges), at process `root`, or at every process when root < 0; called by one
 * thread of every process at the same point. 0, or -1 with a message. */
int ptrt_mpi_sum(ptrt_mpi *m, double *v, int64_t n, int root, char *err, size_t errn);
/* Every process's n doubles, in process order, at process root: a malloc'd array of *total (the
 * others get one to free, with nothing in it); called by one thread of every process at the same
 * point. NULL with a message on failure. */
double *ptrt_mpi_gather(ptrt_mpi *m, const double *v, int n, int root, int *total, char *err,
                        size_t errn);
/* Ends MPI for the process: MPI_Finalize after success, MPI_Abort(rc) after a failure (so the
 * other processes end at once, rather than at their timeout). Does nothing without MPI. */
void ptrt_mpi_finish(int rc);

#endif
