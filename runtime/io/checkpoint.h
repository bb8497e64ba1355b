/* checkpoint.h - the trainer's checkpoints: parameters, Adam moments and run state in one
 * safetensors file, saved atomically into a checkpoint directory, and loaded back for a resume or
 * for --init-from.
 *
 * A checkpoint is DIR/step_00000100.safetensors (the step, zero-padded to 8 digits) holding
 *   NAME            every parameter, F32, under its dotted name (e.g. "h.0.attn.w_qkv"), so that
 *                   safetensors.torch.load_file gives a state dict keyed like the .ptm model;
 *   optim.m.NAME    Adam's first and second moments, F32, same shapes (when kept);
 *   optim.v.NAME
 * and, in __metadata__ (strings, so any safetensors tool shows them):
 *   "ptc.format": "1", "ptc.step": "<decimal>", "ptc.data_position": "<decimal>",
 *   "ptc.seed": "<decimal>", "ptc.config_hash": "<16 hex digits>",
 *   with fp16 loss scaling "ptc.loss_scale" (%.17g), "ptc.scale_clean", "ptc.skipped_steps",
 *   plus "ptc.checksum" over the data (see safetensors.h).
 * DIR/latest holds the file name of the newest checkpoint (written atomically after the checkpoint
 * itself), so a crash at any moment leaves a complete checkpoint behind. Older step_* files beyond
 * the newest `keep` are deleted after a save.
 *
 * Messages: every load reports all problems at once, one per line ("FILE: missing tensor 'x'
 * (expected [64,256])"), up to the size of the caller's buffer, then "... and N more".
 */
#ifndef PTRT_CHECKPOINT_H
#define PTRT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

/* One parameter as the trainer holds it: full (logical, unsharded) row-major float arrays. */
typedef struct ptrt_ckpt_param {
    const char *name; /* dotted name from the model, e.g. "h.0.attn.w_qkv" */
    int ndim;
    int64_t shape[PTRT_ST_MAXDIM];
    float *value; /* numel floats: saved, or filled by a load */
    float *m, *v; /* Adam moments (numel floats each), or NULL when the optimizer keeps none */
} ptrt_ckpt_param;

/* The largest step a checkpoint may record, and so the most steps a run may ask for: 2^62 leaves
 * room for the step arithmetic of a run (step + 1, step + warm-up) never to overflow int64, even
 * with a forged checkpoint. */
#define PTRT_CKPT_MAX_STEP ((int64_t)1 << 62)

/* The scalar state of a run. */
typedef struct ptrt_ckpt_state {
    int64_t step;           /* optimizer steps completed, 0..PTRT_CKPT_MAX_STEP */
    uint64_t data_position; /* ptrt_data_position of the training loader */
    uint64_t seed;          /* the run's seed */
    uint64_t config_hash;   /* ptrt_ckpt_config_hash of the model and training setup */
    int64_t total_steps;    /* the run's --steps when it was written (0: not recorded) */
    /* fp16 loss scaling (0: the run has none): the scale of the next step, the clean steps in a
     * row since it last changed, and the steps skipped for an overflow (their updates never
     * ran, so the optimizer's own step count is step - skipped_steps) */
    double loss_scale;
    int64_t scale_clean, skipped_steps;
} ptrt_ckpt_state;

/* A hash of the parameters' names and shapes plus `extra` (anything else that must match for a
 * resume to continue the same run: batch size, sequence length, data file, optimizer settings;
 * NULL for none). Never 0. */
uint64_t ptrt_ckpt_config_hash(const ptrt_ckpt_param *p, int n, const char *extra);

/* Saves p[0..n) (values, and moments where m/v are set) and st as DIR/step_<st->step>.safetensors,
 * creating DIR if needed, then points DIR/latest at it and deletes all but the newest `keep`
 * step files (keep <= 0 keeps all). If path is not NULL it receives the file's path. Returns 0, or
 * -1 with a message (an existing checkpoint is never damaged by a failed save). */
int ptrt_ckpt_save(const char *dir, const ptrt_ckpt_param *p, int n, const ptrt_ckpt_state *st,
                   int keep, char *path, size_t pathn, char *err, size_t errn);

/* Sharded checkpoints, as processes write them (issue 13): tensor i (of p) goes to part i % nparts;
 * part 0 is the step file DIR/step_N.safetensors, which also holds the run's state and
 * "ptc.parts", the others DIR/step_N.part_P-of-K.safetensors. Every process q > 0 writes its part
 * (ptrt_ckpt_save_part, atomically), and once all are written process 0 writes the step file
 * and moves DIR/latest (ptrt_ckpt_save_sharded): a checkpoint is whole before latest names it.
 * Loading (ptrt_ckpt_load) reads the parts the step file names, checks that they are parts of the
 * same step and run, and takes each tensor from its part; pruning removes a step's parts with
 * it. ptrt_ckpt_save is ptrt_ckpt_save_sharded with one part. */
#define PTRT_CKPT_MAX_PARTS 1024
int ptrt_ckpt_save_part(const char *dir, const ptrt_ckpt_param *p, int n,
                        const ptrt_ckpt_state *st, int part, int nparts, char *err, size_t errn);
int ptrt_ckpt_save_sharded(const char *dir, const ptrt_ckpt_param *p, int n,
                           const ptrt_ckpt_state *st, int nparts, int keep, char *path,
                           size_t pathn, char *err, size_t errn);

/* The newest checkpoint of DIR: DIR/latest if it exists, else the step file with the highest
 * step. Returns 1 with its path in path[pathn], 0 when DIR has none (or does not exist), -1 with
 * a message when DIR/latest is unreadable or names a missing file. */
int ptrt_ckpt_latest(const char *dir, char *path, size_t pathn, char *err, size_t errn);

/* Resumes from the checkpoint at path: checks that it is a ptc checkpoint whose config hash equals
 * config_hash (0 skips that check), that every parameter (and its moments where m/v are set) is
 * present with the right shape and nothing else is, then fills value/m/v and *st. On failure
 * nothing is modified and the message lists every problem. */
int ptrt_ckpt_load(const char *path, const ptrt_ckpt_param *p, int n, uint64_t config_hash,
                   ptrt_ckpt_state *st, char *err, size_t errn);

/* ptrt_ckpt_latest + ptrt_ckpt_load: returns 1 when resumed (path gets the file, if not NULL), 0
 * when DIR has no checkpoint (nothing touched), -1 with a message. */
int ptrt_ckpt_resume(const char *dir, const ptrt_ckpt_param *p, int n, uint64_t config_hash,
                     ptrt_ckpt_state *st, char *path, size_t pathn, char *err, size_t errn);

/* --init-from: fills every p[i].value from the tensor of the same name in any safetensors file (a
 * ptc checkpoint or one saved by PyTorch; F32, F64, F16 or BF16). Moments and optim.* tensors are
 * ignored. Fails, touching nothing, when a parameter is missing, shaped differently or not
 * floating point, or when the file has tensors the model lacks; the message lists them all. */
int ptrt_ckpt_init_from(const char *path, const ptrt_ckpt_param *p, int n, char *err, size_t errn);

#endif
