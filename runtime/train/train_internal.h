/* train_internal.h - what the training loop's files share (private to runtime/train/).
 *
 * train.c runs the ranks (set-up, the step loop, progress, the end of the run); weights.c keeps
 * the run's persistent tensors as full (logical) tensors: the entries of the plan's parameters
 * and optimizer states, gathering and scattering them across ranks and processes, checkpoints,
 * --init-from, --resume and --save.
 */
#ifndef PTRT_TRAIN_INTERNAL_H
#define PTRT_TRAIN_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "checkpoint.h"
#include "comm.h"
#include "data.h"
#include "exec.h"
#include "inproc.h"
#include "mpicomm.h"
#include "nccl_comm.h"
#include "plan.h"
#include "staged.h"
#include "train.h"

/* A persistent tensor (parameter or optimizer state) of the plan: its full (logical) type, and
 * per rank the buffer that holds that rank's part, or -1. A 16-bit parameter (--precision) is
 * the working copy of its fp32 master weight (optimizer state optim.master.NAME): checkpoints,
 * --save and --init-from see the master under the parameter's name, and a load writes both. */
typedef struct entry {
    const char *name;
    ptc_type full;
    int *buf;    /* [nranks] */
    int *master; /* [nranks], the master weight's buffers; NULL when the parameter is f32 */
} entry;

typedef struct shared shared;

/* One rank. */
typedef struct run {
    shared *sh;
    int rank;
    ptrt_exec *x;
    int tokens, targets, lr, step, max_norm, scale_in; /* input buffers, -1 if absent */
    /* fp16 loss scaling (every rank keeps the same: all see the same gradient norm): the scale
     * of the next step, clean steps in a row, steps skipped for an overflow so far, and whether
     * the last step was one */
    double scale, step_scale; /* (step_scale: the last step's) */
    int64_t scale_clean, skipped;
    bool overflow;
    ptrt_data *data, *val;
    int32_t *gtok, *gtgt; /* the global batch (rows [row0, row1) of it: this rank's) */
    int row0, row1;
    int64_t a2a_step, a2a_plan; /* bytes its all_to_all_v sent in the last training step, and
                                   the plan's figure for a step */
    /* rank 0, over every rank's last step (gather_a2a): the bytes sent and the plan's figures
     * summed, and the rank that sent the most against its plan */
    int64_t a2a_sum, a2a_plan_sum;
    double a2a_worst;
    int a2a_worst_rank;
} run;

struct shared {
    const ptc_plan *plan;
    const ptrt_train_opts *o;
    int nranks;
    run *runs;
    ptrt_inproc *inproc;
    /* the executors' communicator on a device backend: NCCL where every rank has its own GPU,
     * in the GPU's memory where all share one, else host-staged */
    ptrt_ncclc *nccl;
    ptrt_inproc *devcomm;
    ptrt_staged *staged;
    ptrt_comm *xcomm; /* the executors' (sh->comm, or one of the above) */
    ptrt_mpi *mpi;    /* ranks in several processes (mpirun, srun); NULL: all ranks are threads */
    ptrt_comm *comm;
    int first_local, nlocal; /* this process runs ranks [first_local, first_local + nlocal) */
    int *all;                /* 0..nranks-1, the group of barriers */
    int64_t B, T, vocab;     /* global batch shape; ids a data file may hold */
    int64_t classes;         /* the cross-entropy's classes when fewer than the embedding's rows */
    double peak_flops;       /* for MFU: --peak-flops, or a GEMM measured at start (or the rate
                                of a step that beat it); 0: none */
    bool peak_bf16;          /* that GEMM's operands were bf16 (the plan's GEMMs are) */
    entry *ents;
    int nparams, nents;
    ptrt_ckpt_param *full; /* full tensors, rank 0's, for checkpoints */
    uint64_t config_hash;
    FILE *log;
    pthread_mutex_t lock;
    double t_base;                /* CLOCK_MONOTONIC at the start: the origin of --trace's times */
    bool has_tokens, has_targets; /* some rank's program has a token (target) input */
    bool scaling;                 /* fp16 loss scaling: some rank's program has its input */
    bool a2a;                     /* some rank's program runs an all_to_all_v */
    int rc;
    char err[2048];
    int64_t first; /* first step to run */
    bool loaded;   /* full holds weights loaded by --init-from or --resume */
};

/* Records the run's first failure (its exit code and message) and aborts the communicators, so
 * that every rank waiting in a collective returns. */
void ptrt_train_fail(shared *sh, int rank, int rc, const char *msg);
/* The run's exit code once it has failed, else 0. */
int ptrt_train_failed(shared *sh);
/* The program rank runs. */
const ptc_program *ptrt_train_program(const shared *sh, int rank);

/* weights.c */

/* Every parameter, then every optimizer state, of every program, once by name: sh->ents, and
 * sh->full named and shaped (their values are allocated on first use). */
void ptrt_train_find_entries(shared *sh);
/* Which process a tensor of gather_full is for: every one, process 0, or its checkpoint part's. */
enum { TO_ALL = -1, TO_PART = -2 };
/* full <- every rank's local parts, at the process `to` says; 0, or -1 (the run has failed). A
 * collective of the processes: one thread of each calls it at the same point. */
int ptrt_train_gather_full(shared *sh, int first, int count, int to);
/* This rank's parts <- full. */
void ptrt_train_scatter_full(run *r, int first, int count);
/* What must match for a resume to continue the same run. */
void ptrt_train_set_config_hash(shared *sh, size_t ntokens);
/* Rank 0: writes a checkpoint of every rank's state (after sync and gather_full). */
int ptrt_train_save_checkpoint(run *r, int64_t t);
/* The first rank of process q > 0: part q of the checkpoint of step t (after gather_full). */
int ptrt_train_save_part(run *r, int64_t t);
/* Rank 0: --init-from / --resume into the full tensors; 0 fresh, 1 loaded, -1 failed. */
int ptrt_train_load_initial(run *r);
/* "the weights of step 12", "the weights of FILE" or "the initial weights of seed 1". */
void ptrt_train_whose_weights(const shared *sh, int64_t step, char *buf, size_t n);
/* --save: the (master) weights as safetensors, written by process 0; 0, or 1 with err. */
int ptrt_train_save_weights(shared *sh, char *err, size_t errn);
/* Locks --checkpoint-dir for this run: the descriptor that holds the lock, -1 when there is
 * nothing to lock, -2 with err when another run holds it. */
int ptrt_train_lock_ckpt_dir(const ptrt_train_opts *o, char *err, size_t errn);

#endif
