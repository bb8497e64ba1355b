/* ptc.c - the compiler driver: reads a .ptm file, lowers it, and emits what was asked.
 *
 *   ptc [options] FILE.ptm
 *
 * Exit status: 0 on success, 1 for errors in the model (reported as file:line:col), 2 for bad
 * command-line use or unreadable files. Only this file decides to exit; the libraries return
 * statuses.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "embed.h"
#include "exec.h"
#include "frontend.h"
#include "ir.h"
#include "planner.h"
#include "passes.h"
#include "plan.h"

#define PTC_VERSION "0.1.0"

static const char usage[] =
    "usage: ptc [options] FILE.ptm\n"
    "\n"
    "Compiles a .ptm model. With -o it writes an executable that trains the model; with --emit\n"
    "it prints what was asked; with neither it checks the model and prints a summary.\n"
    "\n"
    "options:\n"
    "  -o NAME              write an executable that trains the model (see NAME --help)\n"
    "  --train              compile the whole training step (forward, backward, optimizer);\n"
    "                       implied by -o. Without it --emit shows the forward graph\n"
    "  --emit KIND          print KIND to stdout:\n"
    "                         ir      the IR as text (read back by the IR parser)\n"
    "                         dot     the logical IR as a Graphviz graph\n"
    "                         params  every parameter with its shape, and the total count\n"
    "                         plan    the execution plan: per rank program a summary (memory,\n"
    "                                 communication, largest tensors, warnings), then\n"
    "                                 parameter placements, traffic by layer, the program\n"
    "                         plan-json  the same as JSON (schema in docs/plan-json.md)\n"
    "                         program the rank programs alone: buffers with their arena\n"
    "                                 offsets and instructions (what an executable carries)\n"
    "                         memory  per rank program the live bytes after every\n"
    "                                 instruction, the peak and where it happens, the arenas\n"
    "  --summary            with --emit plan: only the summary of every rank program\n"
    "  -D NAME=VALUE        override the const NAME (repeatable)\n"
    "  --run                run the forward pass on the CPU reference kernels, print the loss\n"
    "  --seed N             seed for initial values and random inputs (default 1)\n"
    "  --input NAME=FILE    with --run: take model input NAME from FILE, raw little-endian\n"
    "                       int32 (i32 inputs) or float32 (float inputs), exactly the input's "
    "size;\n"
    "                       inputs not given are random (ids in range for their consumers)\n"
    "  --dump-after PASS    print the IR after pass PASS (autodiff, optimizer, partition)\n"
    "  --optim KEY=VALUE    override a setting of the model's optimizer line (lr, beta1, beta2,\n"
    "                       eps, weight_decay, momentum), e.g. --optim eps=1e-6 (repeatable)\n"
    "\n"
    "parallelism (implies --train):\n"
    "  --mesh AXES          device mesh, e.g. dp=2,tp=4 (axes left out are 1). Ranks number\n"
    "                       the mesh row-major: tp is the fastest-changing axis\n"
    "  --zero N             ZeRO stage on dp: 0 replicate, 1 shard optimizer state, 2 also\n"
    "                       gradients, 3 also parameters (default 0)\n"
    "  --seq-parallel       Megatron sequence parallelism: norms and residuals sharded over the\n"
    "                       sequence on tp, all-gather/reduce-scatter instead of all-reduce\n"
    "  --place NAME=AXIS:PL pin parameter NAME (glob, * matches anything) to placement PL on a\n"
    "                       mesh axis: R (replicate), S0, S1 (shard dim), e.g. "
    "'h.*.attn.w_o=tp:R'\n"
    "  --debug-drop-collective R:K\n"
    "                       test hook: rank R leaves out its K-th collective; the pre-launch\n"
    "                       check must reject the plan\n"
    "  --runner PATH        the runner program -o embeds (default: ptc-runner beside ptc)\n"
    "  -h, --help           show this help\n"
    "  --version            show the version\n";

typedef struct options {
    const char *file;
    const char *emit;
    bool run, train, seq_parallel, summary;
    const char *output, *dump_after, *runner;
    ptc_mesh mesh;
    int zero;
    ptc_pin pins[64];
    int npins;
    const char *optim[16];
    int noptim;
    int drop_rank, drop_index;
    uint64_t seed;
    ptc_define defines[64];
    int ndefines;
    const char *inputs[64];
    int ninputs;
} options;

static int usage_error(const char *fmt, const char *arg)
{
    fputs("ptc: error: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n(see ptc --help)\n", stderr);
    return 2;
}

/* "dp=2,tp=4" -> mesh with axes in the order given (only dp and tp, each at most once). */
static int parse_mesh(const char *spec, ptc_mesh *m)
{
    memset(m, 0, sizeof *m);
    const char *s = spec;
    while (*s) {
        const char *eq = strchr(s, '=');
        if (!eq || eq == s || eq - s >= PTC_MAX_AXIS_NAME || m->naxes == PTC_MAX_MESH_AXES)
            return -1;
        char name[PTC_MAX_AXIS_NAME];
        memcpy(name, s, (size_t)(eq - s));
        name[eq - s] = 0;
        if (strcmp(name, "dp") && strcmp(name, "tp"))
            return -1;
        for (int i = 0; i < m->naxes; i++)
            if (strcmp(m->names[i], name) == 0)
                return -1;
        char *end;
        long n = strtol(eq + 1, &end, 10);
        if (end == eq + 1 || n < 1 || n > 1024 || (*end && *end != ','))
            return -1;
        memcpy(m->names[m->naxes], name, sizeof name);
        m->sizes[m->naxes++] = (int)n;
        s = *end ? end + 1 : end;
    }
    /* canonical order: dp outermost, tp innermost (fastest-changing rank) */
    if (m->naxes == 2 && strcmp(m->names[0], "tp") == 0) {
        ptc_mesh t = *m;
        memcpy(m->names[0], t.names[1], PTC_MAX_AXIS_NAME);
        memcpy(m->names[1], t.names[0], PTC_MAX_AXIS_NAME);
        m->sizes[0] = t.sizes[1];
        m->sizes[1] = t.sizes[0];
    }
    return m->naxes ? 0 : -1;
}

/* "NAME=AXIS:PL" with PL one of R, P is not allowed, S<dim>. */
static int parse_pin(char *spec, ptc_pin *pin)
{
    char *eq = strrchr(spec, '='), *colon = eq ? strchr(eq, ':') : NULL;
    if (!eq || !colon || eq == spec || colon - eq - 1 >= PTC_MAX_AXIS_NAME || colon == eq + 1)
        return -1;
    *eq = 0;
    pin->pattern = spec;
    memcpy(pin->axis, eq + 1, (size_t)(colon - eq - 1));
    pin->axis[colon - eq - 1] = 0;
    const char *pl = colon + 1;
    if (strcmp(pl, "R") == 0)
        pin->pl = (ptc_placement){.kind = PTC_PLACE_REPLICATE};
    else if (pl[0] == 'S' && pl[1] >= '0' && pl[1] <= '7' && !pl[2])
        pin->pl = (ptc_placement){.kind = PTC_PLACE_SHARD, .dim = (int8_t)(pl[1] - '0')};
    else
        return -1;
    return 0;
}

/* Returns 0 to go on, or the exit status to leave with (-1 = exit 0 after --help). */
static int parse_args(int argc, char **argv, options *o)
{
    o->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        bool takes = strcmp(a, "--emit") == 0 || strcmp(a, "-D") == 0 || strcmp(a, "--seed") == 0 ||
                     strcmp(a, "--input") == 0 || strcmp(a, "-o") == 0 ||
                     strcmp(a, "--dump-after") == 0 || strcmp(a, "--runner") == 0 ||
                     strcmp(a, "--mesh") == 0 || strcmp(a, "--zero") == 0 ||
                     strcmp(a, "--place") == 0 || strcmp(a, "--optim") == 0 ||
                     strcmp(a, "--debug-drop-collective") == 0;
        if (takes) {
            if (i + 1 >= argc)
                return usage_error("option '%s' needs a value", a);
            val = argv[++i];
        } else if (strncmp(a, "-D", 2) == 0 && a[2]) {
            val = a + 2;
            a = "-D";
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            return -1;
        } else if (strcmp(a, "--version") == 0) {
            printf("ptc %s\n", PTC_VERSION);
            return -1;
        } else if (strcmp(a, "--emit") == 0) {
            if (strcmp(val, "ir") && strcmp(val, "dot") && strcmp(val, "params") &&
                strcmp(val, "plan") && strcmp(val, "plan-json") && strcmp(val, "program") &&
                strcmp(val, "memory"))
                return usage_error("unknown --emit kind '%s' (ir, dot, params, plan, plan-json, "
                                   "program, memory)",
                                   val);
            o->emit = val;
            if (strcmp(val, "ir") && strcmp(val, "dot") && strcmp(val, "params"))
                o->train = true;
        } else if (strcmp(a, "-D") == 0) {
            if (o->ndefines == 64)
                return usage_error("too many -D options%s", "");
            if (ptc_define_parse((char *)val, &o->defines[o->ndefines]) < 0)
                return usage_error("-D expects NAME=NUMBER, got '%s'", val);
            o->ndefines++;
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(val, &end, 10);
            if (errno || *end || !*val || val[0] == '-')
                return usage_error("--seed expects a non-negative integer, got '%s'", val);
            o->seed = s;
        } else if (strcmp(a, "--input") == 0) {
            if (o->ninputs == 64 || !strchr(val, '='))
                return usage_error("--input expects NAME=FILE, got '%s'", val);
            o->inputs[o->ninputs++] = val;
        } else if (strcmp(a, "--run") == 0) {
            o->run = true;
        } else if (strcmp(a, "--summary") == 0) {
            o->summary = true;
        } else if (strcmp(a, "--train") == 0) {
            o->train = true;
        } else if (strcmp(a, "--debug-drop-collective") == 0) {
            if (sscanf(val, "%d:%d", &o->drop_rank, &o->drop_index) != 2 || o->drop_rank < 0 ||
                o->drop_index < 0)
                return usage_error("--debug-drop-collective expects RANK:INDEX, got '%s'", val);
        } else if (strcmp(a, "--optim") == 0) {
            if (o->noptim == 16 || !strchr(val, '='))
                return usage_error("--optim expects KEY=VALUE, got '%s'", val);
            o->optim[o->noptim++] = val;
        } else if (strcmp(a, "--mesh") == 0) {
            if (parse_mesh(val, &o->mesh) < 0)
                return usage_error("--mesh expects AXIS=N,... with axes dp and tp, got '%s'", val);
            o->train = true;
        } else if (strcmp(a, "--zero") == 0) {
            if (strlen(val) != 1 || val[0] < '0' || val[0] > '3')
                return usage_error("--zero expects 0, 1, 2 or 3, got '%s'", val);
            o->zero = val[0] - '0';
            o->train = true;
        } else if (strcmp(a, "--seq-parallel") == 0) {
            o->seq_parallel = true;
            o->train = true;
        } else if (strcmp(a, "--place") == 0) {
            if (o->npins == 64 || parse_pin((char *)val, &o->pins[o->npins]) < 0)
                return usage_error("--place expects NAME=AXIS:PL (PL is R, S0, S1, ...), got '%s'",
                                   val);
            o->npins++;
            o->train = true;
        } else if (strcmp(a, "-o") == 0) {
            o->output = val;
            o->train = true;
        } else if (strcmp(a, "--runner") == 0) {
            o->runner = val;
        } else if (strcmp(a, "--dump-after") == 0) {
            bool known = false;
            for (int k = 0; k < ptc_npasses; k++)
                known |= strcmp(val, ptc_passes[k].name) == 0;
            if (!known)
                return usage_error("--dump-after: no pass named '%s' (autodiff, optimizer)", val);
            o->dump_after = val;
            o->train = true;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("unknown option '%s'", a);
        } else if (o->file) {
            return usage_error("more than one input file ('%s')", a);
        } else {
            o->file = a;
        }
    }
    if (!o->file)
        return usage_error("no input file%s", "");
    if (o->ninputs && !o->run)
        return usage_error("--input needs --run%s", "");
    if (o->run && o->train)
        return usage_error("--run runs the forward pass; train with the executable -o writes%s",
                           "");
    return 0;
}

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
    char name[256];
    const char *eq = strchr(spec, '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - spec), spec);
    int b = ptrt_exec_find(x, PTC_BUF_INPUT, name);
    if (b < 0) {
        fprintf(stderr, "ptc: error: --input: the model has no input named '%s'\n", name);
        return 2;
    }
    size_t len;
    char *data = ptc_read_file(eq + 1, &len);
    if (!data) {
        fprintf(stderr, "ptc: error: --input %s: cannot read '%s': %s\n", name, eq + 1,
                strerror(errno));
        return 2;
    }
    const ptc_buffer *bf = &ptrt_exec_program(x)->bufs[b];
    if ((int64_t)len != bf->bytes) {
        char ty[256];
        fprintf(stderr, "ptc: error: --input %s: '%s' has %zu bytes, input %s needs %lld\n", name,
                eq + 1, len, ptc_type_str(&bf->type, ty, sizeof ty), (long long)bf->bytes);
        free(data);
        return 2;
    }
    memcpy(ptrt_exec_data(x, b), data, len);
    given[b] = true;
    free(data);
    return 0;
}

/* --run: the forward program on the reference backend; prints the loss. */
static int run_forward(const ptc_graph *g, const options *o, int64_t logical_params)
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
        printf("loss %.9g\n", *(float *)ptrt_exec_data(x, pg->loss));
    }
    free(given);
    ptrt_exec_free(x);
    ptc_plan_free(plan);
    return rc;
}

/* Applies --optim KEY=VALUE overrides to the model's optimizer line. */
static int apply_optim(ptc_graph *g, const options *o)
{
    for (int i = 0; i < o->noptim; i++) {
        const char *kv = o->optim[i], *eq = strchr(kv, '=');
        char *end;
        double v = strtod(eq + 1, &end);
        size_t k = (size_t)(eq - kv);
        double *slot = !strncmp(kv, "lr", k) && k == 2              ? &g->optim.lr
                       : !strncmp(kv, "beta1", k) && k == 5         ? &g->optim.beta1
                       : !strncmp(kv, "beta2", k) && k == 5         ? &g->optim.beta2
                       : !strncmp(kv, "eps", k) && k == 3           ? &g->optim.eps
                       : !strncmp(kv, "weight_decay", k) && k == 12 ? &g->optim.weight_decay
                       : !strncmp(kv, "momentum", k) && k == 8      ? &g->optim.momentum
                                                                    : NULL;
        if (!slot || end == eq + 1 || *end || v < 0)
            return usage_error("--optim: bad setting '%s' (lr, beta1, beta2, eps, weight_decay, "
                               "momentum = a non-negative number)",
                               kv);
        *slot = v;
    }
    return 0;
}

/* Runs the pass list with training on: the step graph replaces the forward graph in g. */
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
    fprintf(stderr, "%s\n", msg);
}

/* Runs the training passes; their notes on what they chose go to notes. */
static int compile_step(ptc_graph **gp, const options *o, ptc_diag *diag, char *notes,
                        size_t notesn)
{
    char err[2048];
    ptc_compile_opts co = {.train = true,
                           .verify_each = true,
                           .dump_after = o->dump_after,
                           .mesh = o->mesh,
                           .zero = o->zero,
                           .seq_parallel = o->seq_parallel,
                           .pins = o->pins,
                           .npins = o->npins};
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
static int find_runner(const options *o, char *path, size_t n)
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

static int write_executable(const ptc_plan *plan, const options *o)
{
    char runner[4200], err[1024];
    if (find_runner(o, runner, sizeof runner) < 0) {
        fprintf(stderr, "ptc: error: cannot find ptc-runner beside ptc; give it with --runner\n");
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ptc_plan_print(plan, f);
    fclose(f);
    int rc = 0;
    if (ptrt_plan_write_exe(runner, text, len, o->output, err, sizeof err) < 0) {
        fprintf(stderr, "ptc: error: %s\n", err);
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
static ptc_plan *make_plan(const ptc_graph *g, const options *o, int64_t logical_params,
                           const char *notes, ptc_diag *diag)
{
    char err[2048];
    ptc_lower_opts lo = {.zero = o->zero,
                         .seq_parallel = o->seq_parallel,
                         .logical_params = logical_params,
                         .keep_grad_outputs = g->mesh.naxes == 0,
                         .notes = notes};
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
    return plan;
}

/* Prints or writes what the options ask for. */
static int emit(const ptc_graph *g, const options *o, int64_t logical_params, const char *notes,
                ptc_diag *diag)
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
    ptc_plan_print_opts po = {.summary_only = o->summary};
    if (o->emit && strcmp(o->emit, "plan") == 0)
        ptc_print_plan(plan, &po, stdout);
    else if (o->emit && strcmp(o->emit, "plan-json") == 0)
        ptc_print_plan_json(plan, stdout);
    else if (o->emit && strcmp(o->emit, "program") == 0)
        ptc_plan_print(plan, stdout);
    else if (o->emit && strcmp(o->emit, "memory") == 0)
        ptc_print_memory(plan, stdout);
    else if (o->output)
        rc = write_executable(plan, o);
    ptc_plan_free(plan);
    return rc;
}

int main(int argc, char **argv)
{
    options o = {.drop_rank = -1, .drop_index = -1};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    size_t len;
    char *src = ptc_read_file(o.file, &len);
    if (!src) {
        fprintf(stderr, "ptc: error: cannot read '%s': %s\n", o.file, strerror(errno));
        return 2;
    }
    ptc_diag diag;
    ptc_diag_init(&diag, stderr, o.file, src, len);
    ptc_frontend_opts fo = {.defines = o.defines, .ndefines = o.ndefines};
    ptc_graph *g = ptc_frontend_compile(o.file, src, len, &fo, &diag);
    if (!g) {
        free(src);
        return 1;
    }
    char err[512], notes[1024] = "";
    int64_t logical_params = ptc_graph_param_count(g);
    if (ptc_verify(g, err, sizeof err) < 0) {
        fprintf(stderr, "ptc: internal error: the front end produced invalid IR: %s\n", err);
        rc = 3;
    } else if (o.train && (rc = apply_optim(g, &o)) == 0) {
        rc = compile_step(&g, &o, &diag, notes, sizeof notes);
    }
    if (!rc)
        rc = emit(g, &o, logical_params, notes, &diag);
    if (!rc && o.run)
        rc = run_forward(g, &o, logical_params);
    ptc_graph_free(g);
    free(src);
    return rc;
}
