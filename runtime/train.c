/* train.c - the training loop of compiled executables (see train.h). */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "checkpoint.h"
#include "cpu.h"
#include "data.h"
#include "interp.h"
#include "ref.h"

void ptrt_train_opts_default(ptrt_train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 20;
    o->seed = 1;
    o->lr = -1;
    o->min_lr = -1;
    o->schedule = PTRT_SCHED_COSINE;
    o->max_norm = 1.0;
    o->keep = 3;
    o->val_batches = 4;
    o->backend = PTRT_BACKEND_CPU;
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

/* What the loop needs to know about the step graph. */
typedef struct run {
    const ptc_graph *g;
    const ptrt_train_opts *o;
    ptrt_interp *it;
    int tokens, targets, lr, step, max_norm; /* input value ids, -1 if absent */
    int64_t B, T, vocab;
    ptrt_ckpt_param *ckpt; /* params, then optimizer states */
    int nparams, nckpt;
    uint64_t config_hash;
    ptrt_data *data, *val;
    FILE *log;
} run;

static int consumer_role(const ptc_graph *g, int v)
{
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op == PTC_OP_EMBEDDING && n->in[1] == v)
            return 1;
        if (n->op == PTC_OP_CROSS_ENTROPY && n->in[1] == v)
            return 2;
    }
    return 0;
}

static int find_roles(run *r, char *err, size_t errn)
{
    const ptc_graph *g = r->g;
    r->tokens = r->targets = -1;
    r->lr = ptrt_graph_find(g, PTC_OP_INPUT, PTC_IN_LR);
    r->step = ptrt_graph_find(g, PTC_OP_INPUT, PTC_IN_STEP);
    r->max_norm = ptrt_graph_find(g, PTC_OP_INPUT, PTC_IN_MAX_NORM);
    if (r->lr < 0 || r->step < 0 || r->max_norm < 0 || g->loss < 0 || g->noutputs < 1) {
        ptc_fmt(err, errn, "the embedded plan is not a training step");
        return -1;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_INPUT || g->values[n->out[0]].type.dtype != PTC_I32)
            continue;
        int role = consumer_role(g, n->out[0]);
        if (role == 1)
            r->tokens = n->out[0];
        else if (role == 2)
            r->targets = n->out[0];
    }
    if (r->tokens >= 0) {
        const ptc_type *t = &g->values[r->tokens].type;
        if (t->rank != 2) {
            ptc_fmt(err, errn, "token input must have shape [batch, seq] to read token files");
            return -1;
        }
        r->B = t->dims[0];
        r->T = t->dims[1];
        for (int i = 0; i < g->nnodes; i++)
            if (g->nodes[i].op == PTC_OP_EMBEDDING && g->nodes[i].in[1] == r->tokens)
                r->vocab = g->values[g->nodes[i].in[0]].type.dims[0];
    }
    return 0;
}

static void setup_ckpt(run *r)
{
    const ptc_graph *g = r->g;
    r->ckpt = ptc_xcalloc((size_t)g->nnodes, sizeof *r->ckpt);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->nnodes; i++) {
            const ptc_node *n = &g->nodes[i];
            if (n->op != (pass == 0 ? PTC_OP_PARAM : PTC_OP_STATE))
                continue;
            ptrt_ckpt_param *c = &r->ckpt[r->nckpt++];
            const ptc_type *t = &g->values[n->out[0]].type;
            c->name = n->attrs.name;
            c->ndim = t->rank;
            memcpy(c->shape, t->dims, sizeof(int64_t) * (size_t)t->rank);
            c->value = ptrt_interp_buffer(r->it, n->out[0]);
            if (pass == 0)
                r->nparams++;
        }
}

/* What must match for a resume to continue the same run: the batch shape, the optimizer, the
 * data order (seed, shuffle) and the data file's size. */
static void set_config_hash(run *r)
{
    char extra[512];
    ptc_fmt(extra, sizeof extra, "B=%lld T=%lld optim=%d seed=%llu shuffle=%d data=%zu",
            (long long)r->B, (long long)r->T, (int)r->g->optim.kind,
            (unsigned long long)r->o->seed, (int)r->o->shuffle,
            r->data ? ptrt_data_ntokens(r->data) : 0);
    r->config_hash = ptrt_ckpt_config_hash(r->ckpt, r->nckpt, extra);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Random ids (or normal floats) for every input the data does not feed, fixed by (seed, step). */
static void random_batch(run *r, int64_t t)
{
    const ptc_graph *g = r->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        int v = n->out[0];
        if (n->op != PTC_OP_INPUT || v == r->lr || v == r->step || v == r->max_norm ||
            (r->data && (v == r->tokens || v == r->targets)))
            continue;
        char name[300];
        ptc_fmt(name, sizeof name, "data.%s.%lld", n->attrs.name, (long long)t);
        int64_t numel = ptc_type_numel(&g->values[v].type);
        if (g->values[v].type.dtype != PTC_I32) {
            ptc_init init = {.kind = PTC_INIT_NORMAL, .a = 1.0};
            ptrt_init_param(&init, name, r->o->seed, ptrt_interp_buffer(r->it, v), 0, numel);
            continue;
        }
        ptrt_interp_mark_given(r->it, v);
        float *u = ptc_xmalloc((size_t)numel * sizeof(float));
        ptc_init init = {.kind = PTC_INIT_UNIFORM, .a = 0.0, .b = 1.0};
        ptrt_init_param(&init, name, r->o->seed, u, 0, numel);
        int64_t bound = r->vocab > 0 ? r->vocab : 2;
        if (v == r->targets)
            for (int k = 0; k < g->nnodes; k++)
                if (g->nodes[k].op == PTC_OP_CROSS_ENTROPY && g->nodes[k].in[1] == v) {
                    const ptc_type *lt = &g->values[g->nodes[k].in[0]].type;
                    bound = lt->dims[lt->rank - 1];
                }
        int32_t *ids = ptrt_interp_buffer(r->it, v);
        for (int64_t k = 0; k < numel; k++) {
            int64_t id = (int64_t)(u[k] * (double)bound);
            ids[k] = (int32_t)(id < bound ? id : bound - 1);
        }
        free(u);
    }
}

static void set_scalar(run *r, int v, double x)
{
    *(float *)ptrt_interp_buffer(r->it, v) = (float)x;
}

static double evaluate(run *r, char *err, size_t errn, int *rc)
{
    double total = 0;
    uint64_t pos = ptrt_data_position(r->val);
    ptrt_data_seek(r->val, 0);
    for (int64_t b = 0; b < r->o->val_batches; b++) {
        ptrt_data_next_batch(r->val, ptrt_interp_buffer(r->it, r->tokens),
                             ptrt_interp_buffer(r->it, r->targets));
        if (ptrt_interp_run_for(r->it, r->g->loss, err, errn) < 0) {
            *rc = 1;
            return NAN;
        }
        total += *(float *)ptrt_interp_buffer(r->it, r->g->loss);
    }
    ptrt_data_seek(r->val, pos);
    return total / (double)r->o->val_batches;
}

static void fmt_eta(char *buf, size_t n, double s)
{
    long t = (long)(s + 0.5);
    ptc_fmt(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

static int open_inputs(run *r, char *err, size_t errn)
{
    const ptrt_train_opts *o = r->o;
    if ((o->data || o->val_data) && (r->tokens < 0 || r->targets < 0)) {
        ptc_fmt(err, errn, "--data needs a model with a token input (feeding an embedding) and a "
                           "target input (feeding cross_entropy)");
        return 2;
    }
    const char *paths[2] = {o->data, o->val_data};
    ptrt_data **dst[2] = {&r->data, &r->val};
    for (int i = 0; i < 2; i++) {
        if (!paths[i])
            continue;
        *dst[i] = ptrt_data_open(paths[i], (int)r->vocab, err, errn);
        if (!*dst[i] || ptrt_data_configure(*dst[i], (int)r->B, (int)r->T, i == 0 && o->shuffle,
                                            o->seed, err, errn) < 0)
            return 2;
    }
    return 0;
}

static int save_checkpoint(run *r, int64_t t, char *err, size_t errn)
{
    ptrt_ckpt_state st = {.step = t,
                          .data_position = r->data ? ptrt_data_position(r->data) : 0,
                          .seed = r->o->seed,
                          .config_hash = r->config_hash};
    char path[1024];
    if (ptrt_ckpt_save(r->o->ckpt_dir, r->ckpt, r->nckpt, &st, r->o->keep, path, sizeof path, err,
                       errn) < 0)
        return 1;
    if (!r->o->quiet)
        fprintf(r->o->out ? r->o->out : stdout, "checkpoint: %s\n", path);
    return 0;
}

/* Initial state: fresh, from --init-from, or resumed. Returns the first step to run. */
static int64_t initial_state(run *r, int *rc, char *err, size_t errn)
{
    const ptrt_train_opts *o = r->o;
    FILE *out = o->out ? o->out : stdout;
    ptrt_interp_init_params(r->it, o->seed);
    if (o->init_from && ptrt_ckpt_init_from(o->init_from, r->ckpt, r->nparams, err, errn) < 0) {
        *rc = 2;
        return -1;
    }
    if (!o->resume)
        return 1;
    if (!o->ckpt_dir) {
        ptc_fmt(err, errn, "--resume needs --checkpoint-dir");
        *rc = 2;
        return -1;
    }
    ptrt_ckpt_state st;
    char path[1024];
    int got = ptrt_ckpt_resume(o->ckpt_dir, r->ckpt, r->nckpt, r->config_hash, &st, path,
                               sizeof path, err, errn);
    if (got < 0) {
        *rc = 2;
        return -1;
    }
    if (got == 0) {
        if (!o->quiet)
            fprintf(out, "resume: no checkpoint in %s, starting from step 1\n", o->ckpt_dir);
        return 1;
    }
    if (r->data)
        ptrt_data_seek(r->data, st.data_position);
    if (!o->quiet)
        fprintf(out, "resumed from %s (step %lld)\n", path, (long long)st.step);
    return st.step + 1;
}

static void progress(run *r, int64_t t, double loss, double lr, double norm, double dt,
                     double elapsed, int64_t done)
{
    const ptrt_train_opts *o = r->o;
    double tokps = r->B * r->T > 0 ? (double)(r->B * r->T) / dt : 1.0 / dt;
    char eta[32];
    fmt_eta(eta, sizeof eta, elapsed / (double)done * (double)(o->steps - t));
    if (!o->quiet)
        fprintf(o->out ? o->out : stdout,
                "step %*lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.0f tok/s | %.1f ms | "
                "eta %s\n",
                (int)(o->steps >= 1000 ? 5 : 3), (long long)t, (long long)o->steps, loss, lr, norm,
                tokps, dt * 1e3, eta);
    if (r->log) {
        fprintf(r->log,
                "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                "\"tokens_per_s\": %.6g, \"step_ms\": %.6g}\n",
                (long long)t, loss, lr, norm, tokps, dt * 1e3);
        fflush(r->log);
    }
}

/* Writes every parameter's gradient of this step (outputs 1.. of the step graph). */
static int dump_grads(run *r, int64_t t, char *err, size_t errn)
{
    char path[1200];
    if (mkdir(r->o->dump_grads, 0777) < 0 && errno != EEXIST) {
        ptc_fmt(err, errn, "--dump-grads: cannot create '%s': %s", r->o->dump_grads,
                strerror(errno));
        return 2;
    }
    ptc_fmt(path, sizeof path, "%s/grads_step_%08lld.safetensors", r->o->dump_grads, (long long)t);
    ptrt_st_writer *w = ptrt_st_writer_new();
    for (int i = 0; i < r->nparams && 1 + i < r->g->noutputs; i++)
        ptrt_st_add(w, r->ckpt[i].name, PTRT_ST_F32, r->ckpt[i].ndim, r->ckpt[i].shape,
                    ptrt_interp_buffer(r->it, r->g->outputs[1 + i]));
    int rc = ptrt_st_save(w, path, err, errn) < 0 ? 1 : 0;
    ptrt_st_writer_free(w);
    return rc;
}

static int loop(run *r, int64_t first, char *err, size_t errn)
{
    const ptrt_train_opts *o = r->o;
    FILE *out = o->out ? o->out : stdout;
    double peak = o->lr >= 0 ? o->lr : r->g->optim.lr;
    double t0 = now(), first_loss = NAN, last_loss = NAN;
    int64_t done = 0;
    int rc = 0;
    for (int64_t t = first; t <= o->steps; t++) {
        double ts = now();
        if (r->data)
            ptrt_data_next_batch(r->data, ptrt_interp_buffer(r->it, r->tokens),
                                 ptrt_interp_buffer(r->it, r->targets));
        random_batch(r, t);
        double lr = ptrt_lr_at(o, peak, t);
        set_scalar(r, r->lr, lr);
        set_scalar(r, r->step, (double)t);
        set_scalar(r, r->max_norm, o->max_norm > 0 ? o->max_norm : INFINITY);
        if (ptrt_interp_run(r->it, err, errn) < 0)
            return 1;
        double loss = *(float *)ptrt_interp_buffer(r->it, r->g->loss);
        double norm = sqrt(*(float *)ptrt_interp_buffer(r->it, r->g->outputs[0]));
        if (!isfinite(loss)) {
            ptc_fmt(err, errn, "loss is %g at step %lld: training diverged (try a lower --lr or "
                               "--grad-clip)", loss, (long long)t);
            return 1;
        }
        if (o->dump_grads && dump_grads(r, t, err, errn))
            return 1;
        ptrt_interp_apply_updates(r->it);
        done++;
        if (isnan(first_loss))
            first_loss = loss;
        last_loss = loss;
        progress(r, t, loss, lr, norm, now() - ts, now() - t0, done);
        if (r->val && o->val_every > 0 && (t % o->val_every == 0 || t == o->steps)) {
            double vl = evaluate(r, err, errn, &rc);
            if (rc)
                return rc;
            if (!o->quiet)
                fprintf(out, "val loss %.6f\n", vl);
            if (r->log)
                fprintf(r->log, "{\"step\": %lld, \"val_loss\": %.9g}\n", (long long)t, vl);
        }
        if (o->ckpt_dir && ((o->ckpt_every > 0 && t % o->ckpt_every == 0) || t == o->steps) &&
            save_checkpoint(r, t, err, errn))
            return 1;
    }
    double el = now() - t0;
    if (!o->quiet && done)
        fprintf(out, "done: %lld steps in %.2f s, loss %.6f -> %.6f, %.0f tok/s\n",
                (long long)done, el, first_loss, last_loss,
                (double)(r->B * r->T * done) / (el > 0 ? el : 1));
    return 0;
}

static int save_weights(run *r, char *err, size_t errn)
{
    ptrt_st_writer *w = ptrt_st_writer_new();
    for (int i = 0; i < r->nparams; i++)
        ptrt_st_add(w, r->ckpt[i].name, PTRT_ST_F32, r->ckpt[i].ndim, r->ckpt[i].shape,
                    r->ckpt[i].value);
    int rc = ptrt_st_save(w, r->o->save, err, errn) < 0 ? 1 : 0;
    ptrt_st_writer_free(w);
    return rc;
}

int ptrt_train(const ptc_graph *g, const ptrt_train_opts *o, char *err, size_t errn)
{
    run r = {.g = g, .o = o};
    int rc = 0;
    if (find_roles(&r, err, errn) < 0)
        return 2;
    r.it = ptrt_interp_new(g);
    if (o->backend == PTRT_BACKEND_CPU)
        ptrt_interp_set_kernels(r.it, ptrt_cpu_run);
    ptrt_cpu_set_threads(o->threads);
    setup_ckpt(&r);
    rc = open_inputs(&r, err, errn);
    set_config_hash(&r);
    int64_t first = rc ? -1 : initial_state(&r, &rc, err, errn);
    if (!rc && o->log) {
        r.log = fopen(o->log, first > 1 ? "a" : "w");
        if (!r.log) {
            ptc_fmt(err, errn, "--log: cannot open '%s': %s", o->log, strerror(errno));
            rc = 2;
        }
    }
    if (!rc)
        rc = loop(&r, first, err, errn);
    if (!rc && o->save)
        rc = save_weights(&r, err, errn);
    if (r.log)
        fclose(r.log);
    ptrt_data_close(r.data);
    ptrt_data_close(r.val);
    ptrt_interp_free(r.it);
    free(r.ckpt);
    return rc;
}
