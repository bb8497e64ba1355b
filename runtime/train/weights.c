/* weights.c - the training run's persistent tensors (train_internal.h).
 *
 * Checkpoints always hold full (logical) tensors: rank 0 (with several processes, each process
 * for its part of a sharded checkpoint) gathers every rank's local parts by their full-tensor
 * indices, so a checkpoint does not depend on the mesh that wrote it; a load scatters them back.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "half.h"
#include "safetensors.h"
#include "train_internal.h"

static int prog_find(const ptc_program *pg, int kind, const char *name)
{
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->view < 0 && bf->kind == kind && bf->name && strcmp(bf->name, name) == 0)
            return b;
    }
    return -1;
}

/* Every parameter, then every optimizer state, of every program, once by name. */
void ptrt_train_find_entries(shared *sh)
{
    int cap = 0;
    for (int kind = PTC_BUF_PARAM; kind <= PTC_BUF_STATE; kind++)
        for (int k = 0; k < sh->plan->nprograms; k++) {
            const ptc_program *pg = &sh->plan->programs[k];
            for (int b = 0; b < pg->nbufs; b++) {
                const ptc_buffer *bf = &pg->bufs[b];
                if (bf->view >= 0 || bf->kind != kind)
                    continue;
                if (kind == PTC_BUF_STATE &&
                    strncmp(bf->name, PTC_MASTER_PREFIX, strlen(PTC_MASTER_PREFIX)) == 0)
                    continue; /* part of its parameter's entry */
                int e = 0;
                while (e < sh->nents && strcmp(sh->ents[e].name, bf->name))
                    e++;
                if (e < sh->nents)
                    continue;
                PTC_GROW(sh->ents, cap, sh->nents);
                entry *en = &sh->ents[sh->nents++];
                en->name = bf->name;
                en->full = ptc_buffer_full_type(&sh->plan->mesh, bf);
                en->buf = ptc_xmalloc(sizeof(int) * (size_t)sh->nranks);
                for (int r = 0; r < sh->nranks; r++)
                    en->buf[r] = prog_find(ptrt_train_program(sh, r), kind, bf->name);
                sh->nparams += kind == PTC_BUF_PARAM;
                en->master = NULL;
                if (kind == PTC_BUF_PARAM && bf->type.dtype != PTC_F32) {
                    char mname[600];
                    ptc_fmt(mname, sizeof mname, "%s%s", PTC_MASTER_PREFIX, bf->name);
                    en->master = ptc_xmalloc(sizeof(int) * (size_t)sh->nranks);
                    for (int r = 0; r < sh->nranks; r++)
                        en->master[r] = prog_find(ptrt_train_program(sh, r), PTC_BUF_STATE, mname);
                }
            }
        }
    sh->full = ptc_xcalloc((size_t)(sh->nents ? sh->nents : 1), sizeof *sh->full);
    for (int i = 0; i < sh->nents; i++) {
        ptrt_ckpt_param *c = &sh->full[i];
        c->name = sh->ents[i].name;
        c->ndim = sh->ents[i].full.rank;
        memcpy(c->shape, sh->ents[i].full.dims, sizeof(int64_t) * (size_t)c->ndim);
    }
}

/* Full tensors for checkpoints, allocated on first use. */
static void alloc_full(shared *sh)
{
    for (int i = 0; i < sh->nents; i++)
        if (!sh->full[i].value)
            sh->full[i].value =
                ptc_xmalloc(sizeof(float) * (size_t)ptc_type_numel(&sh->ents[i].full));
}

/* full <- every rank's local parts (replicated parts are written by each holder, identically).
 * With several processes each holds its own ranks' parts: the full tensors are summed across the
 * processes in doubles with a count of the holders of every element, and divided by it, which
 * is exact (every holder has the same float), at the process `to` says (TO_ALL, TO_PART: tensor
 * i at process i mod P, which writes part i mod P of a checkpoint, or a process); the others'
 * copies of it are then stale. A collective of the processes: one thread of each calls it at
 * the same point. 0, or -1 (the run has failed). */
int ptrt_train_gather_full(shared *sh, int first, int count, int to)
{
    alloc_full(sh);
    for (int i = first; i < first + count; i++) {
        int64_t numel = ptc_type_numel(&sh->ents[i].full);
        double *sum = NULL, *cnt = NULL;
        if (sh->mpi) {
            sum = ptc_xcalloc((size_t)(2 * numel + 1), sizeof(double));
            cnt = sum + numel;
        }
        for (int r = sh->first_local; r < sh->first_local + sh->nlocal; r++) {
            const entry *en = &sh->ents[i];
            int b = en->master ? en->master[r] : en->buf[r];
            if (b < 0)
                continue;
            ptrt_exec *x = sh->runs[r].x;
            int64_t n = ptc_type_numel(&ptrt_exec_program(x)->bufs[b].type);
            float *vals = ptrt_exec_floats(x, b);
            for (int64_t k = 0; k < n; k++) {
                int64_t g = ptrt_exec_global_index(x, b, k);
                float v = vals[k];
                if (sum)
                    sum[g] += v, cnt[g] += 1;
                else
                    sh->full[i].value[g] = v;
            }
            free(vals);
        }
        if (sum) {
            char err[512];
            int root = to == TO_PART ? i % ptrt_mpi_nprocesses(sh->mpi) : to;
            if (ptrt_mpi_sum(sh->mpi, sum, 2 * numel, root, err, sizeof err) < 0) {
                ptrt_train_fail(sh, sh->first_local, 1, err);
                free(sum);
                return -1;
            }
            for (int64_t g = 0; g < numel; g++)
                sh->full[i].value[g] = cnt[g] > 0 ? (float)(sum[g] / cnt[g]) : 0.0f;
            free(sum);
        }
    }
    return 0;
}

/* This rank's parts <- full. */
void ptrt_train_scatter_full(run *r, int first, int count)
{
    shared *sh = r->sh;
    for (int i = first; i < first + count; i++) {
        const entry *en = &sh->ents[i];
        for (int copy = 0; copy < 2; copy++) { /* the buffer, and a 16-bit one's master */
            int b = copy == 0 ? en->buf[r->rank] : en->master ? en->master[r->rank] : -1;
            if (b < 0)
                continue;
            int64_t n = ptc_type_numel(&ptrt_exec_program(r->x)->bufs[b].type);
            float *v = ptc_xmalloc(sizeof(float) * (size_t)(n ? n : 1));
            for (int64_t k = 0; k < n; k++)
                v[k] = sh->full[i].value[ptrt_exec_global_index(r->x, b, k)];
            ptrt_exec_store(r->x, b, v);
            free(v);
        }
    }
}

/* What must match for a resume to continue the same run: the batch shape, the optimizer, the
 * data order (seed, shuffle) and the data file's size. */
void ptrt_train_set_config_hash(shared *sh, size_t ntokens)
{
    char extra[512];
    ptc_fmt(extra, sizeof extra, "B=%lld T=%lld optim=%d seed=%llu shuffle=%d data=%zu",
            (long long)sh->B, (long long)sh->T, (int)sh->plan->optim.kind,
            (unsigned long long)sh->o->seed, (int)sh->o->shuffle, ntokens);
    sh->config_hash = ptrt_ckpt_config_hash(sh->full, sh->nents, extra);
}

/* What a checkpoint of step t records besides the tensors. */
static ptrt_ckpt_state ckpt_state(const run *r, int64_t t)
{
    const shared *sh = r->sh;
    return (ptrt_ckpt_state){.step = t,
                             .data_position = r->data ? ptrt_data_position(r->data) : 0,
                             .seed = sh->o->seed,
                             .config_hash = sh->config_hash,
                             .total_steps = sh->o->steps,
                             .loss_scale = sh->scaling ? r->scale : 0,
                             .scale_clean = r->scale_clean,
                             .skipped_steps = r->skipped};
}

/* Rank 0: writes a checkpoint of every rank's state (after sync and gather_full). */
int ptrt_train_save_checkpoint(run *r, int64_t t)
{
    shared *sh = r->sh;
    char err[2048], path[1024];
    ptrt_ckpt_state st = ckpt_state(r, t);
    int nparts = sh->mpi ? ptrt_mpi_nprocesses(sh->mpi) : 1;
    if (ptrt_ckpt_save_sharded(sh->o->ckpt_dir, sh->full, sh->nents, &st, nparts, sh->o->keep, path,
                               sizeof path, err, sizeof err) < 0) {
        ptrt_train_fail(sh, r->rank, 1, err);
        return -1;
    }
    if (!sh->o->quiet)
        fprintf(sh->o->out ? sh->o->out : stdout, "checkpoint: %s\n", path);
    return 0;
}

/* The first rank of process q > 0: part q of the checkpoint of step t (after gather_full). */
int ptrt_train_save_part(run *r, int64_t t)
{
    shared *sh = r->sh;
    char err[2048];
    ptrt_ckpt_state st = ckpt_state(r, t);
    if (ptrt_ckpt_save_part(sh->o->ckpt_dir, sh->full, sh->nents, &st, ptrt_mpi_process(sh->mpi),
                            ptrt_mpi_nprocesses(sh->mpi), err, sizeof err) < 0) {
        ptrt_train_fail(sh, r->rank, 1, err);
        return -1;
    }
    return 0;
}

/* Rank 0: --init-from / --resume into the full tensors; 0 fresh, 1 loaded, -1 failed. */
int ptrt_train_load_initial(run *r)
{
    shared *sh = r->sh;
    const ptrt_train_opts *o = sh->o;
    FILE *out = o->out ? o->out : stdout;
    char err[2048];
    int loaded = 0;
    if (o->init_from) {
        alloc_full(sh);
        ptrt_train_gather_full(sh, 0, sh->nents, TO_ALL); /* states keep their initial values */
        if (ptrt_ckpt_init_from(o->init_from, sh->full, sh->nparams, err, sizeof err) < 0) {
            ptrt_train_fail(sh, r->rank, 2, err);
            return -1;
        }
        loaded = 1;
    }
    if (!o->resume)
        return loaded;
    ptrt_ckpt_state st;
    char path[1024];
    alloc_full(sh);
    /* (--eval and --sample read the weights alone: the data and schedule the run had do not
     * matter) */
    bool reads = o->eval || o->sample_only;
    int got = ptrt_ckpt_resume(o->ckpt_dir, sh->full, sh->nents, reads ? 0 : sh->config_hash, &st,
                               path, sizeof path, err, sizeof err);
    if (got < 0) {
        ptrt_train_fail(sh, r->rank, 2, err);
        return -1;
    }
    if (got == 0) {
        if (!o->quiet)
            fprintf(out, "resume: no checkpoint in %s, starting from step 1\n", o->ckpt_dir);
        return loaded;
    }
    sh->first = st.step + 1;
    for (int k = 0; k < sh->nranks; k++) {
        if (sh->runs[k].data)
            ptrt_data_seek(sh->runs[k].data, st.data_position);
        if (st.loss_scale > 0) { /* (a checkpoint without scaling keeps the initial scale) */
            sh->runs[k].scale = st.loss_scale;
            sh->runs[k].scale_clean = st.scale_clean;
        }
        sh->runs[k].skipped = st.skipped_steps;
    }
    /* (printed under --quiet too: which checkpoint a run continues from is not progress) */
    fprintf(out, "resumed from %s (step %lld)\n", path, (long long)st.step);
    if (!reads && st.total_steps > 0 && st.total_steps != o->steps &&
        o->schedule == PTRT_SCHED_COSINE && st.step < o->steps) {
        double peak = o->lr >= 0 ? o->lr : sh->plan->optim.lr;
        ptrt_train_opts was = *o;
        was.steps = st.total_steps;
        fprintf(out,
                "note: the checkpoint's run was to train %lld steps, this one %lld: the cosine "
                "schedule stretches to the new end (the learning rate of step %lld is %.3e, "
                "%.3e in the run that wrote it)\n",
                (long long)st.total_steps, (long long)o->steps, (long long)st.step + 1,
                ptrt_lr_at(o, peak, st.step + 1), ptrt_lr_at(&was, peak, st.step + 1));
    }
    if (!reads &&
        st.step >= o->steps) /* not an error (a finished run resumed again), but not silent */
        fprintf(out,
                "nothing to train: the checkpoint is at step %lld and --steps is %lld (give a "
                "larger --steps to train on; the cosine schedule then stretches to it)\n",
                (long long)st.step, (long long)o->steps);
    return 1;
}

void ptrt_train_whose_weights(const shared *sh, int64_t step, char *buf, size_t n)
{
    if (step > 0)
        ptc_fmt(buf, n, "the weights of step %lld", (long long)step);
    else if (sh->o->init_from)
        ptc_fmt(buf, n, "the weights of %s", sh->o->init_from);
    else
        ptc_fmt(buf, n, "the initial weights of seed %llu", (unsigned long long)sh->o->seed);
}

int ptrt_train_save_weights(shared *sh, char *err, size_t errn)
{
    if (ptrt_train_gather_full(sh, 0, sh->nparams, 0) < 0) {
        ptc_fmt(err, errn, "%s", sh->err);
        return 1;
    }
    if (sh->mpi && ptrt_mpi_process(sh->mpi) != 0)
        return 0; /* (process 0 writes) */
    ptrt_st_writer *w = ptrt_st_writer_new();
    uint16_t **half = ptc_xcalloc((size_t)(sh->nparams ? sh->nparams : 1), sizeof(uint16_t *));
    for (int i = 0; i < sh->nparams; i++) {
        if (!sh->o->save_bf16) {
            ptrt_st_add(w, sh->full[i].name, PTRT_ST_F32, sh->full[i].ndim, sh->full[i].shape,
                        sh->full[i].value);
            continue;
        }
        /* --save-dtype bf16: the (master) weights rounded to nearest even, for inference */
        int64_t n = ptc_type_numel(&sh->ents[i].full);
        half[i] = ptc_xmalloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
        for (int64_t k = 0; k < n; k++)
            half[i][k] = ptc_bf16_bits(sh->full[i].value[k]);
        ptrt_st_add(w, sh->full[i].name, PTRT_ST_BF16, sh->full[i].ndim, sh->full[i].shape,
                    half[i]);
    }
    int rc = ptrt_st_save(w, sh->o->save, err, errn) < 0 ? 1 : 0;
    ptrt_st_writer_free(w);
    for (int i = 0; i < sh->nparams; i++)
        free(half[i]);
    free(half);
    return rc;
}

int ptrt_train_lock_ckpt_dir(const ptrt_train_opts *o, char *err, size_t errn)
{
    if (!o->ckpt_dir || o->eval || o->sample_only)
        return -1;
    char path[4200];
    ptc_fmt(path, sizeof path, "%s/.lock", o->ckpt_dir);
    mkdir(o->ckpt_dir, 0777);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1; /* (the checkpoint writes report an unusable directory themselves) */
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &lk) < 0) {
        char pid[32] = "", who[48] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        if (*pid)
            ptc_fmt(who, sizeof who, " (pid %s)", pid);
        ptc_fmt(err, errn,
                "--checkpoint-dir %s: another run%s is writing it; two runs in one directory "
                "would overwrite each other's checkpoints",
                o->ckpt_dir, who);
        close(fd);
        return -2;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)n, 0) < 0) {
        /* the pid is only for the message */
    }
    return fd;
}
