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
/* where the ranks run: the CPU, or NVIDIA GPUs (the CUDA executor is not there yet: a run asked
 * for it fails at start, naming what the machine lacks or that the executor is missing) */
typedef enum { PTRT_DEVICE_CPU, PTRT_DEVICE_CUDA, PTRT_DEVICE_CUDA_EMULATED } ptrt_device_kind;

typedef struct ptrt_train_opts {
    int64_t steps;
    const char *data, *val_data; /* llm.c token files; data NULL = random batches */
    bool shuffle;
    bool eval; /* --eval: the validation loss of the loaded weights only: no update, no file */
    /* --sample N: generate N bytes after the run (from its final weights), or instead of it
     * (sample_only: --steps not given) from the loaded or initial weights, writing nothing */
    int64_t sample;
    bool sample_only, steps_given;
    const char *prompt;  /* the text the sample continues (default a newline) */
    double temperature;  /* logits / temperature before the softmax; 0: always the likeliest */
    int64_t top_k;       /* sample among the k likeliest bytes; 0: all */
    uint64_t seed;
    double lr;      /* peak learning rate; < 0 = the model's optimizer line */
    double min_lr;  /* cosine floor; < 0 = lr / 10 */
    int64_t warmup; /* linear warm-up steps */
    ptrt_schedule schedule;
    double max_norm; /* gradient clipping by global norm; 0 = off */
    /* dynamic loss scaling, for a plan with a loss-scale input (--precision fp16): the initial
     * scale, the factor it shrinks by on an overflow (the step is skipped) and grows by after
     * scale_window clean steps in a row */
    double loss_scale, scale_growth;
    int64_t scale_window;
    const char *scale_flag; /* the first --loss-scale* flag given, for the error without one */
    const char *ckpt_dir;
    int64_t ckpt_every; /* 0 = only at the end (when ckpt_dir is set) */
    int keep;           /* checkpoints kept; 0 = all */
    bool resume;
    bool ckpt_on_signal; /* SIGTERM/SIGINT: checkpoint the step in progress, then stop */
    const char *init_from;
    const char *save;          /* final weights as safetensors, or NULL */
    bool save_bf16;            /* --save-dtype bf16: the weights rounded to BF16 tensors */
    const char *log;           /* JSON lines, or NULL */
    const char *trace;         /* the measured timeline (Chrome trace events), or NULL */
    const char *dump_grads;    /* directory: grads_step_NNNNNNNN.safetensors per step, or NULL */
    int drop_rank, drop_index; /* test hook: rank drop_rank skips its drop_index-th collective */
    bool no_check;             /* test hook: skip the pre-launch plan check */
    int64_t val_every, val_batches;
    ptrt_backend_kind backend;
    ptrt_device_kind device;
    int threads;
    int matmul_precision; /* ptrt_matmul_precision (backend.h): --matmul-precision */
    double peak_flops; /* --peak-flops: the hardware's FLOP/s for MFU; 0: measure a GEMM */
    double timeout_s; /* longest wait in one collective before the run fails (multi-rank) */
    int ranks_per_process; /* under an MPI launcher: ranks (threads) per process; 0 = 1 */
    bool profile;     /* print the time per op kind after the run (the first step left out) */
    bool quiet;
    bool check_memory; /* compare every arena's measured high-water mark with the plan */
    bool no_overlap;   /* --no-overlap: no collective finishes in the background */
    FILE *out;         /* progress lines (stdout when NULL) */
} ptrt_train_opts;

void ptrt_train_opts_default(ptrt_train_opts *o);

/* The backend of a kind (the jit one is NULL in a build without LLVM). */
const struct ptrt_backend *ptrt_backend_of(ptrt_backend_kind k);
/* The backend a run uses: the device's (cuda, cuda-emulated), else the kind's. */
const struct ptrt_backend *ptrt_train_backend(const ptrt_train_opts *o);

/* Learning rate for step t (1-based) of a run of `steps` steps. */
double ptrt_lr_at(const ptrt_train_opts *o, double peak, int64_t t);

/* Trains the plan (a training step) as o says. Returns 0, 1 with a message in err for a failure in the run
 * (bad data, diverged loss, failed checkpoint), or 2 for a bad option or file the user gave. */
int ptrt_train(const ptc_plan *plan, const ptrt_train_opts *o, char *err, size_t errn);

/* --sample: o->sample bytes generated by the sampling plan sp (plan/sample.c) from the weights
 * w (full tensors by name), continuing o->prompt, printed on out as they come. Returns 0, or 1
 * (2 for a prompt the model cannot read) with a message in err. */
struct ptrt_ckpt_param;
int ptrt_sample(const ptc_plan *sp, const struct ptrt_ckpt_param *w, int nw,
                const ptrt_train_opts *o, const char *whose, FILE *out, char *err, size_t errn);

#endif
