/* ptc.c - the compiler driver: reads a .ptm file, lowers it, and emits what was asked.
 *
 *   ptc [options] FILE.ptm          (the flags: ptc_flags.c)
 *
 * Exit status: 0 on success, 1 for errors in the model (reported as file:line:col), 2 for bad
 * command-line use, unreadable files and outputs that cannot be written (standard output
 * included: a full disk must not pass for success). Only this file decides to exit; the
 * libraries return statuses.
 */
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "embed.h"
#include "file.h"
#include "exec.h"
#include "frontend.h"
#include "ir.h"
#include "passes.h"
#include "plan.h"
#include "schedule.h"
#include "trace.h"
#include "kir.h"
#include "cuda.h"
#include "cuda_emit.h"
#include "planner.h"
#include "ptc_auto.h"
#include "ptc_flags.h"

static void print_count(FILE *f, int64_t n)
{
    char digits[32], out[48];
    int len = snprintf(digits, sizeof digits, "%lld", (long long)n), k = 0;
    for (int i = 0; i < len; i++) {
        if (i && (len - i) % 3 == 0)
            out[k++] = ',';
        out[k++] = digits[i];
    }
    out[k] = 0;
    fputs(out, f);
}

static void emit_params(const ptc_graph *g)
{
    int np = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_PARAM)
            continue;
        char ty[256];
        const ptc_type *t = &g->values[n->out[0]].type;
        printf("%-32s %-20s ", n->attrs.name, ptc_type_str(t, ty, sizeof ty));
        print_count(stdout, ptc_type_numel(t));
        putchar('\n');
        np++;
    }
    printf("total: ");
    print_count(stdout, ptc_graph_param_count(g));
    printf(" parameters in %d tensors\n", np);
}

static int load_input(ptrt_exec *x, const char *spec, bool *given)
{
    char name[256], err[1024];
    const char *eq = strchr(spec, '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - spec), spec);
    int b = ptrt_exec_find(x, PTC_BUF_INPUT, name);
    if (b < 0) {
        fprintf(stderr, "ptc: error: --input: the model has no input named '%s'\n", name);
        return 2;
    }
    const ptc_buffer *bf = &ptrt_exec_program(x)->bufs[b];
    size_t len;
    char *data = ptc_file_read_all(eq + 1, (size_t)bf->bytes, &len, err, sizeof err);
    if (!data) {
        char ty[256];
        fprintf(stderr, "ptc: error: --input %s: %s (input %s needs %lld bytes)\n", name, err,
                ptc_type_str(&bf->type, ty, sizeof ty), (long long)bf->bytes);
        return 2;
    }
    if ((int64_t)len != bf->bytes) {
        char ty[256];
        fprintf(stderr, "ptc: error: --input %s: '%s' has %zu bytes, input %s needs %lld\n", name,
                eq + 1, len, ptc_type_str(&bf->type, ty, sizeof ty), (long long)bf->bytes);
        free(data);
        return 2;
    }
    ptrt_exec_write(x, b, 0, data, (int64_t)len);
    given[b] = true;
    free(data);
    return 0;
}

/* --run: the forward program on the reference backend; prints the loss. */
static int run_forward(const ptc_graph *g, const ptc_options *o, int64_t logical_params)
{
    char err[1024];
    ptc_lower_opts lo = {.logical_params = logical_params};
    ptc_plan *plan = ptc_lower(g, &lo, err, sizeof err);
    if (!plan) {
        fprintf(stderr, "ptc: %s\n", err);
        return 3;
    }
    ptrt_exec *x = ptrt_exec_new(plan, 0, NULL, err, sizeof err);
    if (!x) {
        fprintf(stderr, "ptc: error: %s\n", err);
        ptc_plan_free(plan);
        return 1;
    }
    const ptc_program *pg = ptrt_exec_program(x);
    bool *given = ptc_xcalloc((size_t)(pg->nbufs ? pg->nbufs : 1), sizeof(bool));
    int rc = 0;
    for (int i = 0; i < o->ninputs && !rc; i++)
        rc = load_input(x, o->inputs[i], given);
    ptrt_exec_init_state(x, o->seed);
    for (int b = 0; b < pg->nbufs && !rc; b++)
        if (pg->bufs[b].kind == PTC_BUF_INPUT && !given[b] &&
            ptrt_exec_random_input(x, b, pg->bufs[b].name, o->seed, err, sizeof err) < 0) {
            fprintf(stderr, "ptc: error: %s: give it with --input %s=FILE\n", err,
                    pg->bufs[b].name);
            rc = 2;
        }
    if (!rc && ptrt_exec_run(x, PTRT_ENTRY_STEP, 0, err, sizeof err) < 0) {
        fprintf(stderr, "ptc: error: %s\n", err);
        rc = 1;
    } else if (!rc) {
        float loss;
        ptrt_exec_read(x, pg->loss, 0, &loss, 4);
        printf("loss %.9g\n", loss);
    }
    free(given);
    ptrt_exec_free(x);
    ptc_plan_free(plan);
    return rc;
}

/* Shows a "FILE:L:C: error: MSG" from a pass like the front end's errors: with the source line
 * and a caret. */
static void report(ptc_diag *diag, const char *file, const char *msg)
{
    size_t n = strlen(file);
    int line, col, used = 0;
    if (strncmp(msg, file, n) == 0 && msg[n] == ':' &&
        sscanf(msg + n, ":%d:%d: error: %n", &line, &col, &used) == 2 && used) {
        ptc_diag_error(diag, (ptc_loc){.file = file, .line = line, .col = col}, "%s",
                       msg + n + used);
        return;
    }
    if (strncmp(msg, "error: ", 7) == 0) /* about the model as a whole: name the file */
        fprintf(stderr, "%s: %s\n", file, msg);
    else
        fprintf(stderr, "%s\n", msg);
}

/* Runs the pass list with training on: the step graph replaces the forward graph in *gp; the
 * passes' notes on what they chose go to notes. */
static int compile_step(ptc_graph **gp, const ptc_options *o, ptc_diag *diag, char *notes,
                        size_t notesn)
{
    char err[2048];
    ptc_compile_opts co = ptc_flags_compile_opts(o);
    ptc_pass_ctx ctx = {.g = *gp, .opts = &co, .err = err, .errn = sizeof err};
    int rc = ptc_run_passes(&ctx) < 0 ? 1 : 0;
    *gp = ctx.g;
    if (rc)
        report(diag, o->file, err);
    ptc_fmt(notes, notesn, "%s", ctx.notes);
    ptc_pass_ctx_free(&ctx);
    return rc;
}

/* The runner that -o embeds: --runner, else ptc-runner in the directory of this executable. */
static int find_runner(const ptc_options *o, char *path, size_t n)
{
    if (o->runner) {
        ptc_fmt(path, n, "%s", o->runner);
        return 0;
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return -1;
    self[len] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    ptc_fmt(path, n, "%s/ptc-runner", self);
    return access(path, R_OK) == 0 ? 0 : -1;
}

/* One sampling plan: the model compiled again with defs, run through the passes that run
 * without training, on one device, cut at the logits (plan/sample.c). NULL with the reason. */
static ptc_plan *sample_plan(const ptc_options *o, const char *src, size_t len,
                             const ptc_define *defs, int ndefs, ptc_frontend_info *info, char *why,
                             size_t whyn)
{
    char *msgs = NULL; /* (not shown: a variant that does not compile is left out) */
    size_t nmsgs = 0;
    FILE *quiet = open_memstream(&msgs, &nmsgs);
    ptc_diag diag;
    ptc_diag_init(&diag, quiet, o->file, src, len);
    ptc_frontend_opts fo = {.defines = defs, .ndefines = ndefs, .info = info};
    ptc_graph *g = ptc_frontend_compile(o->file, src, len, &fo, &diag);
    fclose(quiet);
    free(msgs);
    if (!g) {
        ptc_fmt(why, whyn, "the model does not compile with %s", ndefs ? defs[ndefs - 1].name : "");
        return NULL;
    }
    char err[2048];
    ptc_compile_opts co = {.train = false, .verify_each = true};
    ptc_pass_ctx ctx = {.g = g, .opts = &co, .err = err, .errn = sizeof err};
    ptc_plan *p = NULL;
    if (ptc_run_passes(&ctx) < 0)
        ptc_fmt(why, whyn, "the forward passes failed: %s", err);
    else
        p = ptc_lower_sample(ctx.g, !o->no_fuse, why, whyn);
    ptc_pass_ctx_free(&ctx);
    ptc_graph_free(ctx.g);
    return p;
}

/* What the executable samples text with (--sample). The model is compiled again (the step graph
 * has replaced the forward one) with its batch const (the first dimension of its token input,
 * when that is a const's name) set to 1: one sequence is generated, and a window of the whole
 * batch would cost batch times more. When the sequence length is a const too, plans for windows
 * of half, a quarter, ... of it (down to 16) follow in a chain (plan->sample->sample), so that a
 * short text runs a short window; the runner takes the shortest that holds the text. The -D
 * defines of the command line hold, but for those two. A model without a sampling program gets
 * the reason in the plan, for the runner's message. */
static void add_sample_plan(ptc_plan *plan, const ptc_options *o, const char *src, size_t len)
{
    char why[1024] = "";
    int n = o->ndefines;
    ptc_define *defs = ptc_xmalloc(sizeof *defs * (size_t)(n + 2));
    memcpy(defs, o->defines, sizeof *defs * (size_t)n);
    ptc_frontend_info info;
    ptc_plan *full = sample_plan(o, src, len, defs, n, &info, why, sizeof why);
    if (!full) {
        plan->no_sample = ptc_arena_strdup(plan->arena, why);
        free(defs);
        return;
    }
    /* the command line's own values of the batch and seq consts give way */
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(defs[i].name, info.batch_const) != 0 && strcmp(defs[i].name, info.seq_const))
            defs[k++] = defs[i];
    if (*info.batch_const) {
        defs[k++] = (ptc_define){.name = info.batch_const, .value = 1};
        char ignored[1024];
        ptc_frontend_info again;
        ptc_plan *one = sample_plan(o, src, len, defs, k, &again, ignored, sizeof ignored);
        if (one) {
            ptc_plan_free(full);
            full = one;
        } else {
            k--; /* a model that cannot take a batch of 1 samples from whole batches */
        }
    }
    plan->sample = full;
    ptc_plan *last = full;
    int64_t T = ptc_plan_sample_window(full);
    for (int64_t t = T / 2; *info.seq_const && T % 2 == 0 && t >= 16; T = t, t /= 2) {
        char ignored[1024];
        ptc_frontend_info again;
        defs[k] = (ptc_define){.name = info.seq_const, .value = (double)t};
        ptc_plan *shorter = sample_plan(o, src, len, defs, k + 1, &again, ignored, sizeof ignored);
        if (!shorter || ptc_plan_sample_window(shorter) != t) {
            ptc_plan_free(shorter);
            break;
        }
        last->sample = shorter;
        last = shorter;
    }
    free(defs);
}

static int write_executable(ptc_plan *plan, const ptc_options *o, const char *src, size_t len)
{
    char runner[4200], err[1024];
    if (find_runner(o, runner, sizeof runner) < 0) {
        fprintf(stderr, "ptc: error: cannot find ptc-runner beside ptc; give it with --runner\n");
        return 2;
    }
    if (ptc_file_same(o->output, runner)) {
        fprintf(stderr, "ptc: error: -o %s: is the runner %s; refusing to replace it\n", o->output,
                runner);
        return 2;
    }
    add_sample_plan(plan, o, src, len);
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    ptc_plan_print(plan, f);
    fclose(f);
    int rc = 0;
    if (ptrt_plan_write_exe(runner, text, tlen, o->output, err, sizeof err) < 0) {
        fprintf(stderr, "ptc: error: -o %s: %s\n", o->output, err);
        rc = 2;
    } else {
        int64_t total = 0, ninstrs = 0;
        for (int k = 0; k < plan->nprograms; k++) {
            ninstrs += plan->programs[k].ninstrs;
            for (int r = 0; r < PTC_NREGIONS; r++)
                if (plan->programs[k].region_bytes[r] > total)
                    total = plan->programs[k].region_bytes[r];
        }
        printf("wrote %s: model '%s', ", o->output, plan->model);
        print_count(stdout, plan->logical_params);
        printf(" parameters, a training step of %lld instructions (run %s --help)\n",
               (long long)ninstrs, o->output);
    }
    free(text);
    return rc;
}

/* The plan of the compiled step: lowered, memory planned, checked before anything runs. */
static ptc_plan *make_plan(const ptc_graph *g, const ptc_options *o, int64_t logical_params,
                           const char *notes, ptc_diag *diag)
{
    char err[2048];
    ptc_lower_opts lo = ptc_flags_lower_opts(o, g);
    lo.logical_params = logical_params;
    lo.notes = notes;
    ptc_plan *plan = ptc_lower(g, &lo, err, sizeof err);
    if (!plan) {
        fprintf(stderr, "ptc: %s\n", err);
        return NULL;
    }
    if (ptc_plan_check(plan, o->drop_rank, o->drop_index, err, sizeof err) < 0) {
        report(diag, o->file, err);
        ptc_plan_free(plan);
        return NULL;
    }
    if (ptc_check_device_memory(plan, o, stderr)) {
        ptc_plan_free(plan);
        return NULL;
    }
    return plan;
}

/* --emit cuda: the unit the CUDA backend compiles (sm_90's launch tuning; the code is the same
 * for sm_80). Where it has no kernel for an instruction yet, the plan's generated kernels alone,
 * and a warning naming the instruction. */
static int emit_cuda(const ptc_plan *plan)
{
    char err[1024];
    char *unit = ptrt_cuda_unit(plan, 90, err, sizeof err);
    if (unit) {
        fputs(unit, stdout);
        free(unit);
        return 0;
    }
    fprintf(stderr, "ptc: warning: %s; printing the plan's fused and attention kernels only\n", err);
    ptc_cuda_emit_plan(plan, stdout);
    return 0;
}

/* --emit trace: the planned timeline of one step, simulated with --cost-model. */
static int emit_trace(const ptc_plan *plan, const ptc_cost_model *cost)
{
    ptc_cost_model m = *cost;
    int n;
    double makespan;
    char err[512];
    ptc_trace_event *ev = ptc_plan_simulate(plan, &m, &n, &makespan, err, sizeof err);
    if (!ev) {
        fprintf(stderr, "ptc: error: --emit trace: %s\n", err);
        return 1;
    }
    char title[512], cm[160];
    ptc_cost_model_str(&m, cm, sizeof cm);
    ptc_fmt(title, sizeof title, "planned step of '%s' (simulated: %s): %.3f ms", plan->model, cm,
            makespan * 1e3);
    ptc_trace_write(stdout, plan, ev, n, true, title);
    free(ev);
    return 0;
}

/* Prints or writes what the options ask for. */
static int emit(const ptc_graph *g, const ptc_options *o, int64_t logical_params, const char *notes,
                ptc_diag *diag, const char *src, size_t len)
{
    /* a training step is always lowered to its plan and checked before launch, whatever is
     * printed */
    bool needs_plan = o->train;
    if (o->emit && strcmp(o->emit, "ir") == 0) {
        ptc_print(g, stdout);
    } else if (o->emit && strcmp(o->emit, "dot") == 0) {
        ptc_print_dot(g, stdout);
    } else if (o->emit && strcmp(o->emit, "params") == 0) {
        emit_params(g);
    } else if (!o->emit && !o->output && !o->run && !o->dump_after) {
        printf("%s: model '%s', ", o->file, g->name);
        print_count(stdout, logical_params);
        printf(" parameters, %d operations\n", g->nnodes);
    }
    if (!needs_plan)
        return 0;
    ptc_plan *plan = make_plan(g, o, logical_params, notes, diag);
    if (!plan)
        return 1;
    int rc = 0;
    ptc_plan_print_opts po = {.summary_only = o->summary, .device_memory = o->device_memory};
    if (o->emit && strcmp(o->emit, "plan") == 0)
        ptc_print_plan(plan, &po, stdout);
    else if (o->emit && strcmp(o->emit, "plan-json") == 0)
        ptc_print_plan_json(plan, stdout);
    else if (o->emit && strcmp(o->emit, "program") == 0)
        ptc_plan_print(plan, stdout);
    else if (o->emit && strcmp(o->emit, "memory") == 0)
        ptc_print_memory(plan, stdout);
    else if (o->emit && strcmp(o->emit, "trace") == 0)
        rc = emit_trace(plan, &o->cost);
    else if (o->emit && strcmp(o->emit, "kernels") == 0)
        for (int k = 0; k < plan->nkernels; k++)
            ptc_kir_print(plan->kernels[k], stdout);
    else if (o->emit && strcmp(o->emit, "cuda") == 0)
        rc = emit_cuda(plan);
    else if (o->output)
        rc = write_executable(plan, o, src, len);
    ptc_plan_free(plan);
    return rc;
}

/* Standard output must have taken everything printed on it: a full disk or a closed pipe must
 * not pass for success. */
static int check_stdout(void)
{
    char err[256];
    if (ptc_file_check_stdout(err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "ptc: error: writing to standard output failed: %s\n", err);
    return 2;
}

/* The model's source: a regular file or a pipe, at most 64 MiB (40,000 declarations take 1). */
#define PTC_MAX_SOURCE ((size_t)64 << 20)

int main(int argc, char **argv)
{
    ptc_options o;
    int rc = ptc_flags_parse(argc, argv, &o, stdout, stderr);
    if (rc)
        return rc < 0 ? check_stdout() : rc;
    size_t len;
    char err[1024];
    char *src = ptc_file_read_all(o.file, PTC_MAX_SOURCE, &len, err, sizeof err);
    if (!src) {
        fprintf(stderr, "ptc: error: %s\n", err);
        return 2;
    }
    ptc_diag diag;
    ptc_diag_init(&diag, stderr, o.file, src, len);
    ptc_frontend_opts fo = ptc_flags_frontend_opts(&o);
    ptc_graph *g = ptc_frontend_compile(o.file, src, len, &fo, &diag);
    if (!g) {
        free(src);
        return 1;
    }
    int64_t logical_params = ptc_graph_param_count(g);
    o.model_flops = ptc_graph_model_flops(g); /* of the forward, before any pass */
    char notes[4096] = "";
    if (ptc_verify(g, err, sizeof err) < 0) {
        fprintf(stderr, "ptc: internal error: the front end produced invalid IR: %s\n", err);
        rc = 3;
    } else if ((rc = ptc_flags_apply(&o, g, stderr)) == 0 && o.train) {
        /* the plan report goes where nothing else is printed; the plan's choices say so */
        char chose[1024] = "";
        if (o.auto_devices)
            rc = ptc_auto_choose(&o, g, src, len, logical_params, o.emit ? stderr : stdout,
                                 stderr, chose, sizeof chose);
        if (!rc)
            rc = compile_step(&g, &o, &diag, notes, sizeof notes);
        if (!rc && *chose) {
            char passes[sizeof notes];
            ptc_fmt(passes, sizeof passes, "%s", notes);
            ptc_fmt(notes, sizeof notes, "%s%s%s", chose, *passes ? "\n" : "", passes);
        }
    }
    if (!rc)
        rc = emit(g, &o, logical_params, notes, &diag, src, len);
    if (!rc && o.run)
        rc = run_forward(g, &o, logical_params);
    int out = check_stdout();
    ptc_graph_free(g);
    free(src);
    return rc ? rc : out;
}
