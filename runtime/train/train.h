/* train.h - the training loop that a compiled executable runs: data, learning-rate schedule,
 * the plan's rank programs on a CPU backend, checkpoints, resume, logging and progress.
 *
 * The plan is a training step: its programs run forward, backward, gradient clipping and the
 * optimizer update (written in place), with inputs of the roles lr, step and max_norm, and give
 * the loss and the squared global gradient norm. Token models are fed from llm.c token files: the
 * input of role tokens (it feeds an embedding) gets the tokens, the one of role targets (it feeds
 * cross-entropy) gets the next tokens.
 */
#ifndef PTRT_TRAIN_H
#define PTRT_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "program.h"

typedef enum { PTRT_SCHED_CONSTANT, PTRT_SCHED_COSINE } ptrt_schedule;
typedef enum { PTRT_BACKEND_REF, PTRT_BACKEND_CPU, PTRT_BACKEND_JIT } ptrt_backend_kind;

typedef struct ptrt_train_opts {
    int64_t steps;
    const char *data, *val_data; /* llm.c token files; data NULL = random batches */
    bool shuffle;
    bool eval; /* --eval: the validation loss of the loaded weights only: no update, no file */
    uint64_t seed;
    double lr;      /* peak learning rate; < 0 = the model's optimizer line */
    double min_lr;  /* cosine floor; < 0 = lr / 10 */
    int64_t warmup; /* linear warm-up steps */
    ptrt_schedule schedule;
    double max_norm; /* gradient clipping by global norm; 0 = off */
    const char *ckpt_dir;
    int64_t ckpt_every; /* 0 = only at the end (when ckpt_dir is set) */
    int keep;           /* checkpoints kept; 0 = all */
    bool resume;
    const char *init_from;
    const char *save;          /* final weights as safetensors, or NULL */
    const char *log;           /* JSON lines, or NULL */
    const char *trace;         /* the measured timeline (Chrome trace events), or NULL */
    const char *dump_grads;    /* directory: grads_step_NNNNNNNN.safetensors per step, or NULL */
    int drop_rank, drop_index; /* test hook: rank drop_rank skips its drop_index-th collective */
    bool no_check;             /* test hook: skip the pre-launch plan check */
    int64_t val_every, val_batches;
    ptrt_backend_kind backend;
    int threads;
    double peak_flops; /* --peak-flops: the hardware's FLOP/s for MFU; 0: measure a GEMM */
    double timeout_s; /* longest wait in one collective before the run fails (multi-rank) */
    bool profile;     /* print the time per op kind after the run (the first step left out) */
    bool quiet;
    bool check_memory; /* compare every arena's measured high-water mark with the plan */
    FILE *out;         /* progress lines (stdout when NULL) */
} ptrt_train_opts;

void ptrt_train_opts_default(ptrt_train_opts *o);

/* Learning rate for step t (1-based) of a run of `steps` steps. */
double ptrt_lr_at(const ptrt_train_opts *o, double peak, int64_t t);

/* Trains the plan (a training step) as o says. Returns 0, 1 with a message in err for a failure in the run
 * (bad data, diverged loss, failed checkpoint), or 2 for a bad option or file the user gave. */
int ptrt_train(const ptc_plan *plan, const ptrt_train_opts *o, char *err, size_t errn);

#endif
