/* train.c - the training loop of compiled executables (see train.h).
 *
 * A plan over a mesh runs as one thread per rank, each with its own executor over its rank
 * program (arenas allocated once, at start) and its own view of the data; collectives go through
 * one in-process communicator. Rank 0 prints, logs and writes checkpoints, which always hold full
 * (logical) tensors (weights.c). A single-device plan is the same loop with one rank.
 */
#include "train_internal.h"
#include "cuda.h"
#include "cudalib.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cpu.h"
#include "data.h"
#include "exec.h"
#include "file.h"
#include "inproc.h"
#include "mpicomm.h"
#include "nccl_comm.h"
#include "peak.h"
#include "plan.h"
#include "ref.h"
#include "staged.h"
#include "trace.h"

void ptrt_train_opts_default(ptrt_train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 20;
    o->seed = 1;
    o->lr = -1;
    o->min_lr = -1;
    o->schedule = PTRT_SCHED_COSINE;
    o->max_norm = 1.0;
    o->loss_scale = 65536;
    o->scale_growth = 2;
    o->scale_window = 2000;
    o->keep = 3;
    o->val_batches = 4;
    /* the fast CPU backend with the plan's fused kernels compiled; interpreted without LLVM */
    o->backend = ptrt_backend_jit ? PTRT_BACKEND_JIT : PTRT_BACKEND_CPU;
    o->timeout_s = 60;
    o->drop_rank = o->drop_index = -1;
    o->temperature = 1;
}

const ptrt_backend *ptrt_backend_of(ptrt_backend_kind k)
{
    return k == PTRT_BACKEND_JIT ? ptrt_backend_jit
           : k == PTRT_BACKEND_CPU ? &ptrt_backend_cpu
                                   : &ptrt_backend_ref;
}

const ptrt_backend *ptrt_train_backend(const ptrt_train_opts *o)
{
    return o->device == PTRT_DEVICE_CUDA            ? &ptrt_backend_cuda
           : o->device == PTRT_DEVICE_CUDA_EMULATED ? &ptrt_backend_cuda_emulated
                                                    : ptrt_backend_of(o->backend);
}

double ptrt_lr_at(const ptrt_train_opts *o, double peak, int64_t t)
{
    if (o->warmup > 0 && t <= o->warmup)
        return peak * (double)t / (double)o->warmup;
    if (o->schedule == PTRT_SCHED_CONSTANT || o->steps <= o->warmup)
        return peak;
    double floor = o->min_lr >= 0 ? o->min_lr : peak / 10;
    double frac = (double)(t - o->warmup) / (double)(o->steps - o->warmup);
    if (frac > 1)
        frac = 1;
    return floor + 0.5 * (1 + cos(3.14159265358979323846 * frac)) * (peak - floor);
}

void ptrt_train_fail(shared *sh, int rank, int rc, const char *msg)
{
    pthread_mutex_lock(&sh->lock);
    if (!sh->rc) {
        sh->rc = rc;
        snprintf(sh->err, sizeof sh->err, "%.2000s", msg);
    }
    pthread_mutex_unlock(&sh->lock);
    if (sh->comm)
        sh->comm->ops->abort(sh->comm->impl, rank, msg);
    if (sh->xcomm && sh->xcomm != sh->comm)
        sh->xcomm->ops->abort(sh->xcomm->impl, rank, msg);
}

int ptrt_train_failed(shared *sh)
{
    pthread_mutex_lock(&sh->lock);
    int rc = sh->rc;
    pthread_mutex_unlock(&sh->lock);
    return rc;
}

const ptc_program *ptrt_train_program(const shared *sh, int rank)
{
    return &sh->plan->programs[sh->plan->rank_program[rank]];
}

/* Waits for every rank; false if the run has failed (on any rank). */
static bool sync_all(run *r, const char *what)
{
    shared *sh = r->sh;
    if (sh->nranks > 1) {
        char err[1024];
        ptrt_coll_desc d = {.group_name = what, .step = 0, .index = 0};
        if (sh->comm->ops->barrier(sh->comm->impl, r->rank, sh->all, sh->nranks, &d, err,
                                   sizeof err) < 0)
            ptrt_train_fail(sh, r->rank, 1, err);
    }
    return !ptrt_train_failed(sh);
}

/* The input buffer of a rank's program with role, or -1. */
static int input_of(const ptc_program *pg, int role)
{
    for (int b = 0; b < pg->nbufs; b++)
        if (pg->bufs[b].kind == PTC_BUF_INPUT && pg->bufs[b].role == role)
            return b;
    return -1;
}

static int find_roles(shared *sh, char *err, size_t errn)
{
    for (int k = 0; k < sh->nranks; k++) {
        run *r = &sh->runs[k];
        const ptc_program *pg = ptrt_train_program(sh, k);
        r->tokens = input_of(pg, PTC_ROLE_TOKENS);
        r->targets = input_of(pg, PTC_ROLE_TARGETS);
        r->lr = input_of(pg, PTC_ROLE_LR);
        r->step = input_of(pg, PTC_ROLE_STEP);
        r->max_norm = input_of(pg, PTC_ROLE_MAX_NORM);
        r->scale_in = input_of(pg, PTC_ROLE_LOSS_SCALE);
        sh->scaling |= r->scale_in >= 0;
        for (int i = 0; i < pg->ninstrs; i++)
            sh->a2a |= pg->instrs[i].kind == PTC_INSTR_COLL &&
                       pg->instrs[i].coll.kind == PTC_COLL_ALL_TO_ALL_V;
        r->scale = sh->o->loss_scale;
        /* (a pipeline stage reads only the optimizer inputs its own work needs: the step's
         * loss and gradient norm reach every stage) */
        bool some = r->lr >= 0 || r->step >= 0 || r->max_norm >= 0 || sh->plan->nprograms > 1;
        if (!some || pg->loss < 0 || pg->grad_norm < 0) {
            ptc_fmt(err, errn, "the embedded plan is not a training step");
            return -1;
        }
    }
    if (sh->o->scale_flag && !sh->scaling) {
        ptc_fmt(err, errn,
                "%s: this executable has no loss scaling (compile the model with --precision "
                "fp16; bf16 and fp32 need none)",
                sh->o->scale_flag);
        return -1;
    }
    /* the batch shape from a rank that holds the tokens (a pipeline's first stage) */
    int holder = 0;
    while (holder + 1 < sh->nranks && sh->runs[holder].tokens < 0)
        holder++;
    const ptc_program *pg = ptrt_train_program(sh, holder);
    int tok = sh->runs[holder].tokens;
    for (int k = 0; k < sh->nranks; k++) {
        sh->has_tokens |= sh->runs[k].tokens >= 0;
        sh->has_targets |= sh->runs[k].targets >= 0;
    }
    if (tok >= 0) {
        ptc_type t = ptc_buffer_full_type(&sh->plan->mesh, &pg->bufs[tok]);
        if (t.rank != 2) {
            ptc_fmt(err, errn, "token input must have shape [batch, seq] to read token files");
            return -1;
        }
        sh->B = t.dims[0];
        sh->T = t.dims[1];
        sh->vocab = pg->bufs[tok].bound;
    }
    /* every token of a file but the first is also a target: below the cross-entropy's classes
     * as well as the embedding's rows */
    for (int k = 0; k < sh->nranks; k++) {
        const run *r = &sh->runs[k];
        int64_t classes = r->targets >= 0 ? ptrt_train_program(sh, k)->bufs[r->targets].bound : 0;
        if (classes > 0 && (sh->vocab <= 0 || classes < sh->vocab)) {
            sh->classes = classes;
            sh->vocab = classes;
        }
    }
    return 0;
}

/* The buffer of kind named name in a program (not a view), or -1: ptrt_exec_find without the
 * executor, which exists only for this process's ranks. */
static bool local(const shared *sh, int rank)
{
    return rank >= sh->first_local && rank < sh->first_local + sh->nlocal;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Copies this rank's part of a global [B, T] batch into input b. */
static void feed(run *r, int b, const int32_t *global)
{
    if (b < 0)
        return;
    int64_t n = ptc_type_numel(&ptrt_exec_program(r->x)->bufs[b].type);
    int32_t *loc = ptc_xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int64_t k = 0; k < n; k++)
        loc[k] = global[ptrt_exec_global_index(r->x, b, k)];
    ptrt_exec_write(r->x, b, 0, loc, 4 * n);
    free(loc);
}

/* Random ids (or normal floats) for every input the data does not feed, fixed by (seed, step)
 * and by full-tensor index, so every plan sees the same batch. */
static int random_batch(run *r, int64_t t)
{
    const ptc_program *pg = ptrt_exec_program(r->x);
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        bool fed = r->data && (b == r->tokens || b == r->targets);
        if (bf->kind != PTC_BUF_INPUT || fed ||
            (bf->role != PTC_ROLE_DATA && bf->role != PTC_ROLE_TOKENS &&
             bf->role != PTC_ROLE_TARGETS))
            continue;
        char key[300], err[512];
        ptc_fmt(key, sizeof key, "data.%s.%lld", bf->name, (long long)t);
        if (ptrt_exec_random_input(r->x, b, key, r->sh->o->seed, err, sizeof err) < 0) {
            ptrt_train_fail(r->sh, r->rank, 2, err);
            return -1;
        }
    }
    return 0;
}

static void next_batch(run *r, ptrt_data *d)
{
    ptrt_data_next_rows(d, r->row0, r->row1, r->gtok, r->gtgt);
    feed(r, r->tokens, r->gtok);
    feed(r, r->targets, r->gtgt);
}

static void set_scalar(run *r, int b, double x)
{
    if (b < 0)
        return;
    float v = (float)x;
    ptrt_exec_write(r->x, b, 0, &v, 4);
}

static int run_step_graph(run *r, int64_t t, ptrt_entry e)
{
    char err[2048];
    if (ptrt_exec_run(r->x, e, t, err, sizeof err) < 0) {
        char msg[2100];
        if (r->sh->nranks > 1)
            ptc_fmt(msg, sizeof msg, "rank %d: %s", r->rank, err);
        else
            ptc_fmt(msg, sizeof msg, "%s", err);
        ptrt_train_fail(r->sh, r->rank, 1, msg);
        return -1;
    }
    return 0;
}

static float loss_of(run *r)
{
    float v;
    ptrt_exec_read(r->x, ptrt_exec_program(r->x)->loss, 0, &v, 4);
    return v;
}

static double evaluate(run *r, int64_t t)
{
    shared *sh = r->sh;
    double total = 0;
    uint64_t pos = ptrt_data_position(r->val);
    ptrt_data_seek(r->val, 0);
    for (int64_t b = 0; b < sh->o->val_batches; b++) {
        /* the plan reuses an input's bytes after its last use: feed every input again */
        if (random_batch(r, t) < 0)
            return NAN;
        next_batch(r, r->val);
        if (run_step_graph(r, t, PTRT_ENTRY_EVAL) < 0)
            return NAN;
        total += loss_of(r);
    }
    ptrt_data_seek(r->val, pos);
    return total / (double)sh->o->val_batches;
}

static void fmt_eta(char *buf, size_t n, double s)
{
    long t = (long)(s + 0.5);
    ptc_fmt(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

static int open_data(run *r, char *err, size_t errn)
{
    shared *sh = r->sh;
    const ptrt_train_opts *o = sh->o;
    /* every rank reads the same batches (each feeds the inputs it holds: with pipeline stages,
     * the first the tokens, the last the targets) */
    if ((o->data || o->val_data) && (!sh->has_tokens || !sh->has_targets)) {
        ptc_fmt(err, errn,
                "--data needs a model with a token input (feeding an embedding) and a "
                "target input (feeding cross_entropy)");
        return 2;
    }
    const char *paths[2] = {o->data, o->val_data};
    ptrt_data **dst[2] = {&r->data, &r->val};
    for (int i = 0; i < 2; i++) {
        if (!paths[i])
            continue;
        *dst[i] = ptrt_data_open(paths[i], (int)sh->vocab, err, errn);
        if (!*dst[i] && sh->classes && strstr(err, "vocabulary size")) {
            size_t n = strlen(err);
            ptc_fmt(err + n, errn - n,
                    " (the model's cross_entropy has %lld classes, fewer than its embedding's "
                    "rows: every token after the first is also a target)",
                    (long long)sh->classes);
        }
        if (!*dst[i] || ptrt_data_configure(*dst[i], (int)sh->B, (int)sh->T, i == 0 && o->shuffle,
                                            o->seed, err, errn) < 0)
            return 2;
    }
    if (r->data || r->val) {
        r->gtok = ptc_xcalloc((size_t)(sh->B * sh->T), sizeof(int32_t));
        r->gtgt = ptc_xcalloc((size_t)(sh->B * sh->T), sizeof(int32_t));
        /* the rows of the batch this rank's token and target inputs hold: a data-parallel rank
         * reads only its own sequences */
        int64_t lo = sh->B, hi = 0;
        int bufs[2] = {r->tokens, r->targets};
        for (int i = 0; i < 2; i++) {
            if (bufs[i] < 0)
                continue;
            int64_t n = ptc_type_numel(&ptrt_exec_program(r->x)->bufs[bufs[i]].type);
            for (int64_t k = 0; k < n; k++) {
                int64_t row = ptrt_exec_global_index(r->x, bufs[i], k) / sh->T;
                lo = row < lo ? row : lo;
                hi = row + 1 > hi ? row + 1 : hi;
            }
        }
        r->row0 = (int)(lo < hi ? lo : 0);
        r->row1 = (int)(lo < hi ? hi : 0);
    }
    return 0;
}

/* Expert parallelism's all-to-all over every rank's last step (r->a2a_step): each rank's bytes
 * and plan figure, gathered (as pairs of int32 halves) to every rank; rank 0 keeps their sums
 * and the rank that sent the most against its plan. A collective of all ranks, after a step
 * of a plan with all_to_all_v; 0, or -1 (the run has failed). */
static int gather_a2a(run *r, int64_t t)
{
    shared *sh = r->sh;
    int64_t mine[2] = {r->a2a_step, r->a2a_plan};
    int64_t *all = ptc_xmalloc(sizeof(int64_t) * 2 * (size_t)sh->nranks);
    if (sh->nranks > 1) {
        char err[1024];
        ptrt_coll_desc d = {.group_name = "all-to-all bytes", .step = t, .index = -1};
        if (sh->comm->ops->allgather(sh->comm->impl, r->rank, sh->all, sh->nranks, mine, all, 1,
                                     4, PTC_I32, &d, err, sizeof err) < 0) {
            ptrt_train_fail(sh, r->rank, 1, err);
            free(all);
            return -1;
        }
    } else {
        memcpy(all, mine, sizeof mine);
    }
    if (r->rank == 0) {
        r->a2a_sum = r->a2a_plan_sum = 0;
        r->a2a_worst = 0;
        r->a2a_worst_rank = -1;
        for (int k = 0; k < sh->nranks; k++) {
            r->a2a_sum += all[2 * k];
            r->a2a_plan_sum += all[2 * k + 1];
            double x = all[2 * k + 1] > 0 ? (double)all[2 * k] / (double)all[2 * k + 1] : 0;
            if (all[2 * k + 1] > 0 && x > r->a2a_worst)
                r->a2a_worst = x, r->a2a_worst_rank = k;
        }
    }
    free(all);
    return 0;
}

/* Mixture-of-experts load balance of the step just run (program.h: stats), for the step line
 * and the log: the worst layer's tokens per expert max / mean, and the fraction of all choices
 * dropped. Empty without moe layers. With pipeline stages: the first stage's layers. */
static void moe_balance(const run *r, char *line, size_t n, char *json, size_t jn)
{
    const ptc_program *pg = ptrt_exec_program(r->x);
    line[0] = json[0] = 0;
    if (!pg->nstats)
        return;
    double worst = 0, dropped = 0, all = 0;
    for (int l = 0; l < pg->nstats; l++) {
        float s[3];
        ptrt_exec_read(r->x, pg->stats[l], 0, s, sizeof s);
        worst = s[2] > 0 && s[0] / s[2] > worst ? s[0] / s[2] : worst;
        dropped += s[1];
        all += s[2];
    }
    double frac = all > 0 ? dropped / all : 0;
    char a2a[80] = "", a2a_json[256] = "";
    if (r->a2a_plan_sum > 0) { /* (what a balanced routing sends is the plan's) */
        ptc_fmt(a2a, sizeof a2a, " all-to-all %.2fx plan (most: rank %d, %.2fx)",
                (double)r->a2a_sum / (double)r->a2a_plan_sum, r->a2a_worst_rank, r->a2a_worst);
        ptc_fmt(a2a_json, sizeof a2a_json,
                ", \"a2a_bytes\": %lld, \"a2a_planned_bytes\": %lld, \"a2a_bytes_all\": %lld, "
                "\"a2a_planned_bytes_all\": %lld, \"a2a_most_rank\": %d, \"a2a_most\": %.9g",
                (long long)r->a2a_step, (long long)r->a2a_plan, (long long)r->a2a_sum,
                (long long)r->a2a_plan_sum, r->a2a_worst_rank, r->a2a_worst);
    }
    ptc_fmt(line, n, " | experts max/mean %.2f dropped %.1f%%%s", worst, 100 * frac, a2a);
    ptc_fmt(json, jn, ", \"expert_load_max_mean\": %.6g, \"dropped\": %.6g%s", worst, frac,
            a2a_json);
}

static void progress(run *r, int64_t t, double loss, double lr, double norm, double dt,
                     double elapsed, int64_t done)
{
    shared *sh = r->sh;
    const ptrt_train_opts *o = sh->o;
    double tokps = sh->B * sh->T > 0 ? (double)(sh->B * sh->T) / dt : 1.0 / dt;
    char eta[32], moe[192], moe_json[448];
    fmt_eta(eta, sizeof eta, elapsed / (double)done * (double)(o->steps - t));
    moe_balance(r, moe, sizeof moe, moe_json, sizeof moe_json);
    char mfu[48] = "", mfu_json[96] = "";
    if (sh->plan->model_flops > 0 && sh->peak_flops > 0 && dt > 0) {
        /* a measured peak that a step beats was measured low: the step's rate is the peak now */
        if (o->peak_flops <= 0 && sh->plan->model_flops / dt > sh->peak_flops) {
            sh->peak_flops = sh->plan->model_flops / dt;
            ptrt_peak_flops_seen(o->threads, sh->peak_bf16, sh->peak_flops);
        }
        double m = sh->plan->model_flops / dt / sh->peak_flops;
        ptc_fmt(mfu, sizeof mfu, " | MFU %.1f%%", 100 * m);
        ptc_fmt(mfu_json, sizeof mfu_json, ", \"model_flops_per_s\": %.6g, \"mfu\": %.6g",
                sh->plan->model_flops / dt, m);
    }
    char scale[80] = "", scale_json[96] = "", norm_json[32] = "null"; /* (JSON has no inf) */
    if (isfinite(norm))
        ptc_fmt(norm_json, sizeof norm_json, "%.9g", norm);
    if (sh->scaling) {
        ptc_fmt(scale, sizeof scale, " | scale %g%s", r->step_scale,
                r->overflow ? " (overflow: step skipped)" : "");
        ptc_fmt(scale_json, sizeof scale_json, ", \"loss_scale\": %.17g, \"skipped\": %s",
                r->step_scale, r->overflow ? "true" : "false");
    }
    if (!o->quiet)
        fprintf(o->out ? o->out : stdout,
                "step %*lld/%lld | loss %.6f | lr %.3e | norm %.4f%s | %.0f tok/s%s | %.1f ms | "
                "eta %s%s\n",
                (int)(o->steps >= 1000 ? 5 : 3), (long long)t, (long long)o->steps, loss, lr, norm,
                scale, tokps, mfu, dt * 1e3, eta, moe);
    if (sh->log) {
        fprintf(sh->log,
                "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %s, "
                "\"tokens_per_s\": %.6g, \"step_ms\": %.6g%s%s%s}\n",
                (long long)t, loss, lr, norm_json, tokps, dt * 1e3, mfu_json, moe_json,
                scale_json);
        fflush(sh->log);
    }
}

/* Writes every parameter's gradient of this step (outputs 1.. of the step graph). */
static int dump_grads(run *r, int64_t t)
{
    shared *sh = r->sh;
    char path[1200], err[2048];
    if (mkdir(sh->o->dump_grads, 0777) < 0 && errno != EEXIST) {
        ptc_fmt(err, sizeof err, "--dump-grads: cannot create '%s': %s", sh->o->dump_grads,
                strerror(errno));
        ptrt_train_fail(sh, r->rank, 2, err);
        return -1;
    }
    ptc_fmt(path, sizeof path, "%s/grads_step_%08lld.safetensors", sh->o->dump_grads, (long long)t);
    ptrt_st_writer *w = ptrt_st_writer_new();
    const ptc_program *pg = ptrt_exec_program(r->x);
    float **wide = ptc_xcalloc((size_t)(sh->nparams ? sh->nparams : 1), sizeof(float *));
    for (int i = 0; i < sh->nparams && i < pg->noutputs; i++) {
        int b = pg->outputs[i];
        /* a 16-bit gradient (--precision) widened; with fp16 loss scaling, the true gradient */
        wide[i] = ptrt_exec_floats(r->x, b);
        if (sh->scaling) {
            int64_t n = ptc_type_numel(&pg->bufs[b].type);
            double inv = 1.0 / r->step_scale;
            for (int64_t k = 0; k < n; k++)
                wide[i][k] = (float)(wide[i][k] * inv);
        }
        ptrt_st_add(w, sh->full[i].name, PTRT_ST_F32, sh->full[i].ndim, sh->full[i].shape,
                    wide[i]);
    }
    int rc = ptrt_st_save(w, path, err, sizeof err);
    ptrt_st_writer_free(w);
    for (int i = 0; i < sh->nparams; i++)
        free(wide[i]);
    free(wide);
    if (rc < 0)
        ptrt_train_fail(sh, r->rank, 1, err);
    return rc;
}

static int one_step(run *r, int64_t t, double lr, double *loss, double *norm)
{
    shared *sh = r->sh;
    if (r->data)
        next_batch(r, r->data);
    if (random_batch(r, t) < 0)
        return -1;
    set_scalar(r, r->lr, lr);
    /* the optimizer's own count (Adam's bias correction): the updates that ran */
    set_scalar(r, r->step, (double)(t - r->skipped));
    set_scalar(r, r->max_norm, sh->o->max_norm > 0 ? sh->o->max_norm : INFINITY);
    set_scalar(r, r->scale_in, r->scale);
    r->step_scale = r->scale;
    if (run_step_graph(r, t, PTRT_ENTRY_STEP) < 0)
        return -1;
    *loss = loss_of(r);
    float sumsq;
    ptrt_exec_read(r->x, ptrt_exec_program(r->x)->grad_norm, 0, &sumsq, 4);
    *norm = sqrt(sumsq);
    r->overflow = false;
    if (sh->scaling && isfinite(*loss) && ptrt_exec_skipped_update(r->x)) {
        /* the scaled gradients overflowed fp16: the executor skipped the update (weights and
         * optimizer state untouched); the next step tries a smaller scale */
        r->overflow = true;
        r->skipped++;
        r->scale_clean = 0;
        r->scale /= sh->o->scale_growth;
        if (!(r->scale >= 0x1p-24)) {
            char msg[512];
            ptc_fmt(msg, sizeof msg,
                    "training diverged at step %lld: the gradients overflow fp16 even with the "
                    "loss scale below 2^-24 (the loss %g)",
                    (long long)t, *loss);
            ptrt_train_fail(sh, r->rank, 1, msg);
            return -1;
        }
    } else if (sh->scaling && ++r->scale_clean >= sh->o->scale_window) {
        r->scale *= sh->o->scale_growth;
        r->scale_clean = 0;
    }
    if (!sh->scaling && isfinite(*loss) && ptrt_exec_skipped_update(r->x)) {
        char msg[512];
        ptc_fmt(msg, sizeof msg,
                "training diverged at step %lld: the gradient norm is not finite (%g), the loss "
                "%g: stopped before the update, so nothing of step %lld reached the weights, the "
                "optimizer state or a file (try a lower --lr or --grad-clip)",
                (long long)t, fabs(*norm), *loss, (long long)t);
        ptrt_train_fail(sh, r->rank, 1, msg);
        return -1;
    }
    if (!isfinite(*loss)) {
        char msg[256];
        ptc_fmt(msg, sizeof msg,
                "loss is %g at step %lld: training diverged (try a lower --lr or --grad-clip)",
                *loss, (long long)t);
        ptrt_train_fail(sh, r->rank, 1, msg);
        return -1;
    }
    if (sh->o->dump_grads && r->rank == 0 && sh->nranks == 1 && dump_grads(r, t) < 0)
        return -1;
    return 0;
}

/* --checkpoint-on-signal: SIGTERM and SIGINT (a scheduler's preemption, a launcher ending the
 * job) are blocked in every thread from the start (block_stop_signals, before MPI or any thread
 * starts), so no system call anywhere is interrupted; a signal sent stays pending, and after
 * every step the ranks look at the pending set and agree (a launcher signals the processes at
 * different moments), then write a checkpoint of that step and stop. A handler instead
 * interrupted MPI's transport mid-call and, under load, corrupted a process's heap. */
static void block_stop_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static int pending_stop_signal(void)
{
    sigset_t set;
    sigemptyset(&set);
    if (sigpending(&set) != 0)
        return 0;
    return sigismember(&set, SIGTERM) ? SIGTERM : sigismember(&set, SIGINT) ? SIGINT : 0;
}

/* The signal every rank has seen by the end of step t (an allreduce of the largest), or 0; -1
 * when the run has failed. */
static int signalled(run *r, int64_t t)
{
    shared *sh = r->sh;
    float mine = (float)pending_stop_signal(), any = mine;
    if (sh->nranks > 1) {
        char err[1024];
        ptrt_coll_desc d = {.group_name = "signal", .step = t, .index = -1};
        if (sh->comm->ops->allreduce(sh->comm->impl, r->rank, sh->all, sh->nranks, &mine, &any, 1,
                                     PTC_F32, PTRT_RED_MAX, &d, err, sizeof err) < 0) {
            ptrt_train_fail(sh, r->rank, 1, err);
            return -1;
        }
    }
    return (int)any;
}

static void loop(run *r)
{
    shared *sh = r->sh;
    const ptrt_train_opts *o = sh->o;
    FILE *out = o->out ? o->out : stdout;
    double peak = o->lr >= 0 ? o->lr : sh->plan->optim.lr;
    double t0 = now(), first_loss = NAN, last_loss = NAN;
    int64_t done = 0;
    bool lead = r->rank == 0;
    /* --profile and --trace leave out the warm-up: the first steps allocate, fault pages in and
     * fill the libraries' caches, and on gpt2 config (a) steps 2 and 3 still ran 3-15% slower
     * than the rest (the first three steps where the run has six or more, else the first) */
    int64_t warm = o->steps - sh->first + 1 >= 6 ? 3 : 1;
    for (int64_t t = sh->first; t <= o->steps; t++) {
        double ts = now(), loss, norm, lr = ptrt_lr_at(o, peak, t);
        int64_t sent0, sent1;
        ptrt_exec_all_to_all(r->x, &sent0, &r->a2a_plan);
        if (one_step(r, t, lr, &loss, &norm) < 0)
            return;
        ptrt_exec_all_to_all(r->x, &sent1, &r->a2a_plan);
        r->a2a_step = sent1 - sent0;
        if (sh->a2a && gather_a2a(r, t) < 0)
            return;
        done++;
        if (lead && o->profile && done == warm)
            ptrt_exec_set_profile(r->x, true);
        if (o->trace && (done == warm || done == warm + 3)) /* the 3 steps after the warm-up */
            ptrt_exec_set_trace(r->x, done == warm, sh->t_base, 4 << 20);
        if (isnan(first_loss))
            first_loss = loss;
        last_loss = loss;
        if (lead)
            progress(r, t, loss, lr, norm, now() - ts, now() - t0, done);
        if (r->val && o->val_every > 0 && (t % o->val_every == 0 || t == o->steps)) {
            double vl = evaluate(r, t);
            if (ptrt_train_failed(sh))
                return;
            if (lead && !o->quiet)
                fprintf(out, "step %*lld/%lld | val loss %.6f\n",
                        (int)(o->steps >= 1000 ? 5 : 3), (long long)t, (long long)o->steps, vl);
            if (lead && sh->log)
                fprintf(sh->log, "{\"step\": %lld, \"val_loss\": %.9g}\n", (long long)t, vl);
        }
        int stop = o->ckpt_on_signal ? signalled(r, t) : 0;
        if (stop < 0)
            return;
        if (o->ckpt_dir && (stop || (o->ckpt_every > 0 && t % o->ckpt_every == 0) || t == o->steps)) {
            /* (with several processes each writes its part of the tensors, in parallel; then
             * process 0 the step file, which names them, and latest) */
            bool part = r->rank == sh->first_local;
            if (!sync_all(r, "checkpoint") ||
                (part && ptrt_train_gather_full(sh, 0, sh->nents, TO_PART) < 0) ||
                (part && r->rank != 0 && ptrt_train_save_part(r, t) < 0) ||
                !sync_all(r, "checkpoint") || (lead && ptrt_train_save_checkpoint(r, t) < 0) ||
                !sync_all(r, "checkpoint"))
                return;
        }
        if (stop) {
            char msg[512];
            ptc_fmt(msg, sizeof msg,
                    "stopped by a signal (%s) after step %lld, with a checkpoint of it in %s: "
                    "continue with --resume",
                    stop == SIGINT ? "SIGINT" : "SIGTERM", (long long)t, o->ckpt_dir);
            ptrt_train_fail(sh, r->rank, 1, msg);
            return;
        }
    }
    double el = now() - t0;
    if (lead && done) { /* the run's summary, under --quiet too */
        fprintf(out, "done: %lld steps in %.2f s, loss %.6f -> %.6f, %.0f tok/s", (long long)done,
                el, first_loss, last_loss, (double)(sh->B * sh->T * done) / (el > 0 ? el : 1));
        if (sh->plan->model_flops > 0 && sh->peak_flops > 0 && el > 0)
            fprintf(out, ", %.3g GFLOP/s of model FLOPs, MFU %.1f%% of %.3g GFLOP/s (%s%s%s)",
                    sh->plan->model_flops * (double)done / el * 1e-9,
                    100 * sh->plan->model_flops * (double)done / el / sh->peak_flops,
                    sh->peak_flops * 1e-9, o->peak_flops > 0 ? "--peak-flops" : "measured ",
                    o->peak_flops > 0 ? "" : ptrt_cpu_blas_name(),
                    o->peak_flops > 0 ? ""
                    : sh->peak_bf16   ? " bf16 GEMM"
                                      : " GEMM");
        if (o->matmul_precision != PTRT_MATMUL_HIGHEST) {
            ptrt_matmul_precision asked = (ptrt_matmul_precision)o->matmul_precision;
            /* (the ref backend's GEMM is the reference: always f32) */
            bool ref = o->device == PTRT_DEVICE_CPU && o->backend == PTRT_BACKEND_REF;
            ptrt_matmul_precision ran = ref                            ? PTRT_MATMUL_HIGHEST
                                        : o->device == PTRT_DEVICE_CPU ? ptrt_cpu_matmul_precision()
                                                                       : asked;
            fprintf(out, "; f32 matmul precision %s%s", ptrt_matmul_precision_name(ran),
                    ran == asked ? ""
                    : ref        ? " (the ref backend keeps f32)"
                                 : " (this CPU lacks the units for the one asked)");
        }
        fputc('\n', out);
        int64_t bg, beside;
        ptrt_exec_overlap(r->x, &bg, &beside);
        if (bg > 0 && !o->quiet) /* (counted over the steps run, the first included) */
            fprintf(out, "overlap: %.1f collectives a step ran in the background (rank %d), "
                         "beside %.1f instructions each on average (--no-overlap: none)\n",
                    (double)bg / (double)done, r->rank, (double)beside / (double)bg);
        int64_t bucketed = 0, calls = 0;
        if (sh->nccl)
            ptrt_nccl_buckets(sh->nccl, r->rank, &bucketed, &calls);
        if (bucketed > 0 && !o->quiet)
            fprintf(out, "buckets: %.1f small allreduces a step went to NCCL in %.1f calls "
                         "(rank %d)\n",
                    (double)bucketed / (double)done, (double)calls / (double)done, r->rank);
    }
    if (lead && o->profile && done > warm)
        ptrt_exec_print_profile(r->x, out, done - warm);
}

/* What weights the run holds after step `step` (0: none run), for messages. */
static void *rank_main(void *arg)
{
    run *r = arg;
    shared *sh = r->sh;
    ptrt_exec_init_state(r->x, sh->o->seed);
    if (!sync_all(r, "start"))
        return NULL;
    if (r->rank == sh->first_local && (sh->o->init_from || sh->o->resume))
        sh->loaded = ptrt_train_load_initial(r) > 0; /* (every process reads the file) */
    if (r->rank == 0 && !ptrt_train_failed(sh) && sh->o->log) {
        sh->log = fopen(sh->o->log, sh->first > 1 ? "a" : "w");
        if (!sh->log) {
            char msg[1024];
            ptc_fmt(msg, sizeof msg, "--log: cannot open '%s': %s", sh->o->log, strerror(errno));
            ptrt_train_fail(sh, 0, 2, msg);
        }
    }
    if (!sync_all(r, "start"))
        return NULL;
    if (sh->loaded)
        ptrt_train_scatter_full(r, 0, sh->nents);
    if (!sync_all(r, "start"))
        return NULL;
    if (sh->o->sample_only)
        return NULL;
    if (sh->o->eval) {
        double vl = evaluate(r, sh->first - 1);
        if (r->rank == 0 && !ptrt_train_failed(sh)) {
            FILE *out = sh->o->out ? sh->o->out : stdout;
            char whose[1100];
            ptrt_train_whose_weights(sh, sh->first - 1, whose, sizeof whose);
            fprintf(out, "val loss %.6f (%lld batches of %lld x %lld tokens, %s)\n", vl,
                    (long long)sh->o->val_batches, (long long)sh->B, (long long)sh->T, whose);
            if (sh->log)
                fprintf(sh->log, "{\"step\": %lld, \"val_loss\": %.9g}\n",
                        (long long)(sh->first - 1), vl);
        }
        return NULL;
    }
    loop(r);
    return NULL;
}

/* This process's ranks' recorded instructions (*n of them); under a launcher every process's, at
 * process 0 (NULL elsewhere; *rc -1 with sh->err after a failed exchange), as 5 doubles an event
 * (exact: small integers and times). */
static ptc_trace_event *gather_trace(shared *sh, int *n, int *rc)
{
    int mine = 0, m;
    for (int k = sh->first_local; k < sh->first_local + sh->nlocal; k++) {
        ptrt_exec_trace(sh->runs[k].x, &m);
        mine += m;
    }
    ptc_trace_event *ev = ptc_xmalloc(sizeof *ev * (size_t)(mine ? mine : 1));
    *n = 0, *rc = 0;
    for (int k = sh->first_local; k < sh->first_local + sh->nlocal; k++) {
        const ptc_trace_event *e = ptrt_exec_trace(sh->runs[k].x, &m);
        memcpy(ev + *n, e, sizeof *ev * (size_t)m);
        *n += m;
    }
    if (!sh->mpi || ptrt_mpi_nprocesses(sh->mpi) == 1)
        return ev;
    double *v = ptc_xmalloc(sizeof(double) * (size_t)(5 * mine + 1)), *all;
    for (int i = 0; i < mine; i++) {
        double *o = v + 5 * i;
        o[0] = ev[i].rank, o[1] = ev[i].instr, o[2] = ev[i].start, o[3] = ev[i].dur;
        o[4] = (double)ev[i].step;
    }
    free(ev);
    ev = NULL;
    char err[512];
    if (!(all = ptrt_mpi_gather(sh->mpi, v, 5 * mine, 0, n, err, sizeof err))) {
        ptrt_train_fail(sh, sh->first_local, 1, err);
        *rc = -1;
    } else if (ptrt_mpi_process(sh->mpi) == 0) {
        *n /= 5;
        ev = ptc_xmalloc(sizeof *ev * (size_t)(*n ? *n : 1));
        for (int i = 0; i < *n; i++)
            ev[i] = (ptc_trace_event){.rank = (int)all[5 * i], .instr = (int)all[5 * i + 1],
                                      .start = all[5 * i + 2], .dur = all[5 * i + 3],
                                      .step = (long long)all[5 * i + 4]};
    }
    free(all);
    free(v);
    return ev;
}

/* --trace: every rank's recorded instructions, as trace events beside the planned ones, written
 * by process 0 under a launcher. */
static int write_trace(shared *sh, char *err, size_t errn)
{
    int n, rc;
    ptc_trace_event *ev = gather_trace(sh, &n, &rc);
    if (rc < 0) {
        ptc_fmt(err, errn, "%s", sh->err);
        return 1;
    }
    if (!ev)
        return 0;
    char title[256];
    ptc_fmt(title, sizeof title, "measured steps of '%s' (%d ranks, backend %s)", sh->plan->model,
            sh->nranks, ptrt_train_backend(sh->o)->name);
    FILE *f = fopen(sh->o->trace, "w");
    if (!f) {
        ptc_fmt(err, errn, "--trace: cannot write '%s': %s", sh->o->trace, strerror(errno));
        rc = 2;
    } else {
        ptc_trace_write(f, sh->plan, ev, n, false, title);
        if (ferror(f) | (fclose(f) != 0)) {
            ptc_fmt(err, errn, "--trace: writing '%s' failed: %s", sh->o->trace,
                    strerror(errno));
            rc = 2;
        }
    }
    free(ev);
    return rc;
}

static int setup(shared *sh, char *err, size_t errn)
{
    const ptrt_train_opts *o = sh->o;
    sh->nranks = sh->plan->nranks;
    if (sh->nranks > 1 && o->dump_grads) {
        ptc_fmt(err, errn, "--dump-grads works on single-device plans only");
        return 2;
    }
    /* before launch: the ranks' communication must match up, or the run would hang */
    if (!o->no_check && ptc_plan_check(sh->plan, o->drop_rank, o->drop_index, err, errn) < 0)
        return 1;
    sh->runs = ptc_xcalloc((size_t)sh->nranks, sizeof *sh->runs);
    sh->all = ptc_xmalloc(sizeof(int) * (size_t)sh->nranks);
    sh->first_local = 0;
    sh->nlocal = sh->nranks;
    if (sh->mpi) {
        if (o->trace) { /* every process's times on process 0's start, through the wall clock
                         * (exact on one machine; across machines as close as NTP or PTP keeps
                         * their clocks) */
            struct timespec wall;
            clock_gettime(CLOCK_REALTIME, &wall);
            double mono = now(), real = (double)wall.tv_sec + 1e-9 * (double)wall.tv_nsec;
            double real0 = ptrt_mpi_process(sh->mpi) == 0 ? real : 0;
            if (ptrt_mpi_sum(sh->mpi, &real0, 1, -1, err, errn) < 0)
                return 1;
            sh->t_base = mono - (real - real0);
        }
        sh->comm = ptrt_mpi_comm(sh->mpi);
        sh->first_local = ptrt_mpi_first_rank(sh->mpi);
        sh->nlocal = sh->nranks / ptrt_mpi_nprocesses(sh->mpi);
    } else if (sh->nranks > 1) {
        if (!(sh->inproc = ptrt_inproc_new(sh->nranks, o->timeout_s, err, errn)))
            return 1;
        sh->comm = ptrt_inproc_comm(sh->inproc);
    }
    ptrt_cpu_set_threads(o->threads);
    ptrt_set_matmul_precision((ptrt_matmul_precision)o->matmul_precision);
    if (sh->nlocal > 1 || (sh->mpi && ptrt_mpi_nprocesses(sh->mpi) > 1))
        ptrt_cpu_share_cores();
    /* (a GPU's peak is not the CPU's GEMM: on a device, MFU only with --peak-flops) */
    sh->peak_bf16 = ptrt_peak_bf16(sh->plan);
    sh->peak_flops =
        o->peak_flops > 0 ? o->peak_flops
        : sh->plan->model_flops > 0 && !o->eval && !o->sample_only && o->device == PTRT_DEVICE_CPU
            ? ptrt_peak_flops(o->threads, sh->peak_bf16)
            : 0;
    sh->first = 1;
    ptrt_exec_opts xo = {.backend = ptrt_train_backend(o),
                         .comm = sh->comm,
                         .canary = o->check_memory,
                         .no_overlap = o->no_overlap};
    if (sh->comm && !xo.backend->host) {
        /* tensors in device memory: NCCL where every rank has its own GPU (threads or MPI
         * processes), the device communicator where all ranks are threads on one GPU, else
         * collectives through host memory */
        char why[768];
        bool nccl_failed = false;
        if ((sh->nccl = ptrt_nccl_new(sh->plan, xo.backend, sh->comm, sh->first_local,
                                      sh->nlocal, &nccl_failed, why, sizeof why))) {
            xo.comm = ptrt_nccl_comm(sh->nccl);
            if (!o->quiet && sh->first_local == 0)
                fprintf(stderr, "collectives: NCCL, one GPU per rank%s\n",
                        sh->mpi ? ", across processes" : "");
        } else if (nccl_failed) {
            ptc_fmt(err, errn, "%s", why);
            return 1;
        } else if (!sh->mpi && ptrt_cuda_gpu_count() == 1) {
            /* (ptrt_nccl_new bound every rank, so the GPUs are counted) */
            if (!(sh->devcomm = ptrt_inproc_new_on(sh->nranks, o->timeout_s, xo.backend, err,
                                                   errn)))
                return 1;
            xo.comm = ptrt_inproc_comm(sh->devcomm);
            if (!o->quiet)
                fprintf(stderr, "collectives: in GPU memory, %d ranks on one GPU\n",
                        sh->nranks);
        } else {
            sh->staged = ptrt_staged_new(sh->comm, xo.backend, sh->nranks);
            xo.comm = ptrt_staged_comm(sh->staged);
            if (!o->quiet && sh->first_local == 0)
                fprintf(stderr, "collectives: through host memory (%s)\n", why);
        }
    }
    sh->xcomm = xo.comm;
    for (int k = 0; k < sh->nranks; k++) {
        run *r = &sh->runs[k];
        sh->all[k] = k;
        r->sh = sh;
        r->rank = k;
        xo.drop = k == o->drop_rank ? o->drop_index : -1;
        if (local(sh, k) && !(r->x = ptrt_exec_new(sh->plan, k, &xo, err, errn)))
            return 1;
    }
    if (find_roles(sh, err, errn) < 0)
        return 2;
    ptrt_train_find_entries(sh);
    for (int k = sh->first_local; k < sh->first_local + sh->nlocal; k++) {
        int rc = open_data(&sh->runs[k], err, errn);
        if (rc)
            return rc;
    }
    const run *r0 = &sh->runs[sh->first_local];
    ptrt_train_set_config_hash(sh, r0->data ? ptrt_data_ntokens(r0->data) : 0);
    return 0;
}

/* --check-memory: every arena's measured high-water mark against the plan, per rank. */
static int check_memory(shared *sh, char *err, size_t errn)
{
    FILE *out = sh->o->out ? sh->o->out : stdout;
    int rc = 0;
    for (int k = sh->first_local; k < sh->first_local + sh->nlocal; k++) {
        const ptc_program *pg = ptrt_exec_program(sh->runs[k].x);
        for (int reg = 0; reg < PTC_NREGIONS; reg++) {
            int64_t planned = pg->region_bytes[reg];
            int64_t measured = ptrt_exec_high_water(sh->runs[k].x, reg);
            if (!sh->o->quiet)
                fprintf(out, "memory: rank %d %-5s planned %lld, measured %lld%s\n", k,
                        ptc_region_name(reg), (long long)planned, (long long)measured,
                        planned == measured ? "" : "  MISMATCH");
            if (sh->log)
                fprintf(sh->log,
                        "{\"memory\": {\"rank\": %d, \"region\": \"%s\", \"planned\": %lld, "
                        "\"measured\": %lld}}\n",
                        k, ptc_region_name(reg), (long long)planned, (long long)measured);
            if (planned != measured && !rc) {
                ptc_fmt(err, errn,
                        "rank %d: the %s arena's high-water mark is %lld bytes, the plan says %lld",
                        k, ptc_region_name(reg), (long long)measured, (long long)planned);
                rc = 1;
            }
        }
    }
    /* the CPU's f32 copies of 16-bit operands for kernels that read f32 (bounded: a few rows
     * of attention, a tile of a GEMM), which the plan does not hold */
    int64_t widened = ptrt_widened_high_water();
    if (widened && !sh->o->quiet)
        fprintf(out, "memory: f32 copies of 16-bit operands, outside the plan: high-water %lld\n",
                (long long)widened);
    if (widened && sh->log)
        fprintf(sh->log, "{\"memory_widened\": {\"high_water\": %lld}}\n", (long long)widened);
    return rc;
}

static void teardown(shared *sh)
{
    for (int k = 0; sh->runs && k < sh->nranks; k++) {
        run *r = &sh->runs[k];
        if (!r->x)
            continue; /* (another process's rank) */
        ptrt_data_close(r->data);
        ptrt_data_close(r->val);
        ptrt_exec_free(r->x);
        free(r->gtok);
        free(r->gtgt);
    }
    for (int i = 0; sh->full && i < sh->nents; i++)
        free(sh->full[i].value);
    for (int i = 0; i < sh->nents; i++) {
        free(sh->ents[i].buf);
        free(sh->ents[i].master);
    }
    free(sh->full);
    free(sh->runs);
    free(sh->all);
    free(sh->ents);
    ptrt_nccl_free(sh->nccl);
    ptrt_inproc_free(sh->inproc);
    ptrt_inproc_free(sh->devcomm);
    ptrt_staged_free(sh->staged);
    ptrt_mpi_free(sh->mpi);
    if (sh->log)
        fclose(sh->log);
    pthread_mutex_destroy(&sh->lock);
}

/* One run writes a checkpoint directory at a time: an exclusive lock on DIR/.lock (a POSIX record
 * lock: the system drops it when the process ends, however it ends) held for the whole run; the lock file
 * holds the pid, for the message. Returns the descriptor, -1 without a directory or under
 * --eval (it only reads), or -2 with a message when another run holds it. */
int ptrt_train(const ptc_plan *plan, const ptrt_train_opts *o_user, char *err, size_t errn)
{
    /* under an MPI launcher (mpirun, srun) this process runs its share of the ranks; the other
     * processes' output would repeat process 0's, so it goes to /dev/null */
    ptrt_train_opts opts = *o_user;
    const ptrt_train_opts *o = &opts;
    if (o->device == PTRT_DEVICE_CUDA && ptrt_cuda_probe(err, errn) < 0)
        return 1;
    if (o->ckpt_on_signal)
        block_stop_signals(); /* (before MPI and every thread start: they inherit the mask) */
    ptrt_mpi *mpi = NULL;
    FILE *devnull = NULL;
    if (ptrt_mpi_launched() || o->ranks_per_process > 1) {
        if (!ptrt_mpi_launched()) {
            ptc_fmt(err, errn, "--ranks-per-process needs an MPI launcher: mpirun -np N %s ...",
                    "./EXE");
            return 2;
        }
        int k = o->ranks_per_process > 0 ? o->ranks_per_process : 1;
        if (!(mpi = ptrt_mpi_new(plan->nranks, k, o->timeout_s, err, errn)))
            return 2;
        if (ptrt_mpi_process(mpi) != 0) {
            devnull = fopen("/dev/null", "w");
            opts.out = devnull;
            opts.log = NULL;
        }
    }
    shared sh = {.plan = plan, .o = o, .t_base = now(), .mpi = mpi};
    pthread_mutex_init(&sh.lock, NULL);
    if (o->sample && !plan->sample) {
        ptc_fmt(err, errn, "--sample: this model cannot generate text: %s",
                plan->no_sample ? plan->no_sample
                                : "the executable carries no sampling program (compile it again)");
        pthread_mutex_destroy(&sh.lock);
        ptrt_mpi_free(mpi);
        return 2;
    }
    /* (one process holds the checkpoint directory's lock for the job) */
    int lock = mpi && ptrt_mpi_process(mpi) != 0 ? -1 : ptrt_train_lock_ckpt_dir(o, err, errn);
    if (lock == -2) {
        pthread_mutex_destroy(&sh.lock);
        return 2;
    }
    int rc = setup(&sh, err, errn);
    if (!rc && o->resume && !o->ckpt_dir) {
        ptc_fmt(err, errn, "--resume needs --checkpoint-dir");
        rc = 2;
    }
    if (!rc) {
        int started = sh.nlocal, first = sh.first_local;
        if (sh.nlocal == 1) {
            rank_main(&sh.runs[first]);
        } else {
            pthread_t *th = ptc_xcalloc((size_t)sh.nlocal, sizeof *th);
            for (int k = 0; k < sh.nlocal; k++)
                if (pthread_create(&th[k], NULL, rank_main, &sh.runs[first + k]) != 0) {
                    ptrt_train_fail(&sh, first + k, 1, "cannot start a rank thread");
                    started = k; /* join those started */
                    break;
                }
            for (int k = 0; k < started; k++)
                pthread_join(th[k], NULL);
            free(th);
        }
        rc = sh.rc;
        if (rc)
            ptc_fmt(err, errn, "%s", sh.err);
    }
    if (!rc && o->check_memory)
        rc = check_memory(&sh, err, errn);
    if (!rc && o->save)
        rc = ptrt_train_save_weights(&sh, err, errn);
    if (!rc && o->trace)
        rc = write_trace(&sh, err, errn);
    if (!rc && o->sample && ptrt_train_gather_full(&sh, 0, sh.nparams, 0) < 0) {
        ptc_fmt(err, errn, "%s", sh.err);
        rc = 1;
    }
    if (!rc && o->sample && (!mpi || ptrt_mpi_process(mpi) == 0)) {
        char whose[1100];
        int64_t at = o->sample_only || sh.first > o->steps ? sh.first - 1 : o->steps;
        ptrt_train_whose_weights(&sh, at, whose, sizeof whose);
        rc = ptrt_sample(plan->sample, sh.full, sh.nparams, o, whose, o->out ? o->out : stdout,
                         err, errn);
    }
    teardown(&sh);
    if (devnull)
        fclose(devnull);
    if (lock >= 0)
        close(lock);
    return rc;
}
