/* ptc_flags.c - ptc's command line (see ptc_flags.h). */
#include "ptc_flags.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "file.h"
#include "schedule.h"
#include "util.h"

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
    "                         trace   the planned timeline of a step (Chrome trace-event\n"
    "                                 JSON for Perfetto), simulated with a cost model\n"
    "                         kernels the generated (fused) kernels of the plan, in the\n"
    "                                 kernel IR (codegen/kir.h)\n"
    "                         cuda    the same kernels as CUDA C, one translation unit\n"
    "                                 (NVRTC and `nvcc --ptx` take it; launch sizes for\n"
    "                                 sm_80 and sm_90 above each kernel)\n"
    "  --no-fuse            leave every op its own kernel: no fusion pass, no generated\n"
    "                       kernels (the plan every fused plan is tested against)\n"
    "  --head-chunks N|auto the language-model head (the logits' GEMM, the cross-entropy\n"
    "                       with its gradient and the head's two gradient GEMMs) over N\n"
    "                       chunks of rows, so one chunk's logits are stored at a time\n"
    "                       (default auto: chunks of at most 256 MiB of logits; 1: off;\n"
    "                       a part of the fusion pass)\n"
    "  --summary            with --emit plan: only the summary of every rank program\n"
    "  -D NAME=VALUE        override the const NAME (repeatable)\n"
    "  --run                run the forward pass on the CPU reference kernels, print the loss\n"
    "  --seed N             seed for initial values and random inputs (default 1)\n"
    "  --input NAME=FILE    with --run: take model input NAME from FILE, raw little-endian\n"
    "                       int32 (i32 inputs) or float32 (float inputs), exactly the input's "
    "size;\n"
    "                       inputs not given are random (ids in range for their consumers)\n"
    "  --dump-after PASS    print the IR after pass PASS (moe, precision, autodiff,\n"
    "                       optimizer, partition, moe_ep, pipeline)\n"
    "  --optim KEY=VALUE    override a setting of the model's optimizer line (lr, beta1, beta2,\n"
    "                       eps, weight_decay, momentum), e.g. --optim eps=1e-6 (repeatable;\n"
    "                       the same ranges as in the model: lr > 0, betas in [0, 1), ...)\n"
    "\n";

/* (two strings: C limits the length of one) */
static const char usage_parallel[] =
    "parallelism (implies --train):\n"
    "  --mesh AXES          device mesh, e.g. pp=2,dp=2,tp=4 or dp=2,ep=4 (axes left out are 1,\n"
    "                       at most 1024 ranks each). Ranks number the mesh row-major in the\n"
    "                       order pp, dp, ep, tp: tp is the fastest-changing axis. ep splits\n"
    "                       the experts of moe layers and acts as dp everywhere else\n"
    "  --zero N             ZeRO stage on dp (and ep, for all but the experts): 0 replicate,\n"
    "                       1 shard optimizer state, 2 also gradients, 3 also parameters\n"
    "                       (default 0)\n"
    "  --precision P        fp32 (default), bf16 or fp16: the weights' working copy and the\n"
    "                       activations in 16 bits, fp32 master weights and optimizer state,\n"
    "                       kernels accumulating in fp32 (the table in the README)\n"
    "  --grad-dtype G       with bf16/fp16: gradients accumulated and reduced in bf16/fp16\n"
    "                       (default, the precision's dtype) or fp32\n"
    "  --seq-parallel       Megatron sequence parallelism: norms and residuals sharded over the\n"
    "                       sequence on tp, all-gather/reduce-scatter instead of all-reduce\n"
    "  --microbatches M     split the step's batch into M microbatches run one after the\n"
    "                       other, gradients accumulated, one update (default 1)\n"
    "  --pp-schedule KIND   pipeline schedule with pp > 1: gpipe, 1f1b (default), interleaved\n"
    "                       (model chunks: --virtual-stages V, default 2), zb-h1 (zero bubble:\n"
    "                       backward split into input and weight gradients)\n"
    "  --virtual-stages V   model chunks per pipeline rank for the interleaved schedule\n"
    "  --stages L0,L1,...   layers of the model's repeat per (virtual) stage, e.g. 4,4,3,1\n"
    "                       (default: cut to balance compute, then memory); the first stage\n"
    "                       also holds what comes before the layers (embedding), the last what\n"
    "                       comes after (head, loss); only they may have 0 layers\n"
    "  --recompute POLICY   activation recompute of every layer: none (default), selective\n"
    "                       (the attention output), full (keep only the layer input)\n"
    "  --recompute-layer LAYERS=POLICY\n"
    "                       the policy of the layers LAYERS names (glob: 'h.1*', 'h.3'),\n"
    "                       after --recompute (repeatable; the last match wins)\n"
    "  --place NAME=AXIS:PL pin parameter NAME (glob, * matches anything) to placement PL on a\n"
    "                       mesh axis (dp, ep or tp): R (replicate), S0, S1 (shard dim), e.g. "
    "'h.*.attn.w_o=tp:R';\n"
    "                       a pattern must match at least one parameter\n"
    "  --auto N             choose the plan of N devices: every mesh of N ranks (pp, dp, tp; ep\n"
    "                       with moe layers), ZeRO stage, pipeline schedule and microbatches,\n"
    "                       and recompute where memory asks for it; each candidate compiled,\n"
    "                       memory planned and its step simulated (--cost-model). The fastest\n"
    "                       that fits --device-memory wins: the candidates and the flags of\n"
    "                       the one chosen are printed, then the other options act on it\n"
    "  --device-memory SIZE the bytes one rank may allocate, e.g. 80GiB or 24GB: a plan whose\n"
    "                       fullest rank plans more is an error (with --auto: is left out)\n"
    "  --cost-model M       the machine --auto and --emit trace simulate: cpu (default; 50\n"
    "                       GFLOP/s, 20 GB/s memory, 10 GB/s links, 10 us a message), h100,\n"
    "                       h200 (data-sheet rates), or flops=F,mem=B,link=L,latency=S\n"
    "  --debug-drop-collective R:K\n"
    "                       test hook: rank R leaves out its K-th collective; the pre-launch\n"
    "                       check must reject the plan\n"
    "  --runner PATH        the runner program -o embeds (default: ptc-runner beside ptc)\n"
    "  -h, --help           show this help\n"
    "  --version            show the version\n"
    "\n"
    "Exit status: 0 success; 1 an error in the model or the plan (FILE:LINE:COL: error: ...);\n"
    "2 bad command-line use, or a file that cannot be read or written (standard output too).\n";

#define PTC_VERSION "0.1.0"

__attribute__((format(printf, 2, 3))) static int usage_error(FILE *errf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ptc: error: ", errf);
    vfprintf(errf, fmt, ap);
    fputs("\n(see ptc --help)\n", errf);
    va_end(ap);
    return 2;
}

/* The mesh axes, outermost first: the order ranks are numbered in whatever order --mesh gives
 * them. Pipeline stages farthest apart (one send per microbatch and stage), then the gradient
 * reductions of dp (once per step), then expert parallelism's all-to-alls (twice each way per moe
 * layer), and tensor-parallel ranks adjacent: their collectives are the most frequent and the
 * largest per byte of compute (every layer, forward and backward: one node, NVLink). */
static const char *const mesh_axes[] = {"pp", "dp", "ep", "tp"};
#define NMESH_AXES 4

static int axis_rank(const char *name)
{
    for (int i = 0; i < NMESH_AXES; i++)
        if (strcmp(name, mesh_axes[i]) == 0)
            return i;
    return NMESH_AXES;
}

/* One AXIS=N of --mesh: the axis is pp, dp, ep or tp, given once, N in 1..PTC_FLAGS_MAX_AXIS. */
static int mesh_axis(const char *spec, const char *s, size_t len, ptc_mesh *m, FILE *errf)
{
    const char *eq = memchr(s, '=', len);
    if (!eq || eq == s)
        return usage_error(errf,
                           "--mesh: '%.*s' is not AXIS=N (in '%s'; the axes are pp, dp, ep and tp)",
                           (int)len, s, spec);
    size_t nlen = (size_t)(eq - s);
    bool known = false;
    for (int i = 0; i < NMESH_AXES; i++)
        known |= nlen == 2 && strncmp(s, mesh_axes[i], 2) == 0;
    if (!known)
        return usage_error(errf,
                           "--mesh: unknown axis '%.*s' in '%s' (the axes are pp, dp, ep and tp)",
                           (int)nlen, s, spec);
    for (int i = 0; i < m->naxes; i++)
        if (strncmp(m->names[i], s, 2) == 0)
            return usage_error(errf, "--mesh: axis %.2s is given twice in '%s'", s, spec);
    const char *num = eq + 1, *end = s + len;
    bool digits = num < end;
    for (const char *p = num; p < end; p++)
        digits &= *p >= '0' && *p <= '9';
    if (!digits)
        return usage_error(errf, "--mesh: %.2s='%.*s' is not a positive integer (in '%s')", s,
                           (int)(end - num), num, spec);
    long long n = 0;
    for (const char *p = num; p < end && n <= PTC_FLAGS_MAX_AXIS; p++)
        n = n * 10 + (*p - '0');
    if (n < 1)
        return usage_error(errf, "--mesh: %.2s=%.*s: an axis has at least 1 rank", s,
                           (int)(end - num), num);
    if (n > PTC_FLAGS_MAX_AXIS)
        return usage_error(errf,
                           "--mesh: %.2s=%.*s is more than %d, the most ranks one mesh axis may "
                           "have",
                           s, (int)(end - num), num, PTC_FLAGS_MAX_AXIS);
    memcpy(m->names[m->naxes], s, 2);
    m->names[m->naxes][2] = 0;
    m->sizes[m->naxes++] = (int)n;
    return 0;
}

/* "dp=2,tp=4" -> mesh in canonical order: pp outermost, then dp, ep, tp innermost (the
 * fastest-changing rank). */
static int parse_mesh(const char *spec, ptc_mesh *m, FILE *errf)
{
    memset(m, 0, sizeof *m);
    if (!*spec)
        return usage_error(errf, "--mesh expects AXIS=N,... with axes pp, dp, ep and tp, got ''");
    for (const char *s = spec;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        int rc = mesh_axis(spec, s, len, m, errf);
        if (rc)
            return rc;
        if (!comma)
            break;
        s = comma + 1;
    }
    for (int i = 1; i < m->naxes; i++) /* insertion sort into the canonical order */
        for (int j = i; j > 0 && axis_rank(m->names[j - 1]) > axis_rank(m->names[j]); j--) {
            char name[PTC_MAX_AXIS_NAME];
            memcpy(name, m->names[j], PTC_MAX_AXIS_NAME);
            memcpy(m->names[j], m->names[j - 1], PTC_MAX_AXIS_NAME);
            memcpy(m->names[j - 1], name, PTC_MAX_AXIS_NAME);
            int sz = m->sizes[j];
            m->sizes[j] = m->sizes[j - 1];
            m->sizes[j - 1] = sz;
        }
    return 0;
}

/* A pin as the user wrote it, for messages. */
static const char *pin_str(const ptc_pin *pin, char *buf, size_t n)
{
    if (pin->pl.kind == PTC_PLACE_REPLICATE)
        return ptc_fmt(buf, n, "%.200s=%s:R", pin->pattern, pin->axis);
    return ptc_fmt(buf, n, "%.200s=%s:S%d", pin->pattern, pin->axis, pin->pl.dim);
}

/* "NAME=AXIS:PL" with AXIS dp, ep or tp and PL R or S<dim> (dim < PTC_MAX_RANK). spec is split in
 * place: pin->pattern points into it. */
static int parse_pin(char *spec, ptc_pin *pin, FILE *errf)
{
    char *eq = strrchr(spec, '='), *colon = eq ? strchr(eq, ':') : NULL;
    if (!eq || !colon || eq == spec)
        return usage_error(errf, "--place expects NAME=AXIS:PL (PL is R, S0, S1, ...), got '%s'",
                           spec);
    size_t alen = (size_t)(colon - eq - 1);
    bool known = alen == 2 && (strncmp(eq + 1, "dp", 2) == 0 || strncmp(eq + 1, "ep", 2) == 0 ||
                               strncmp(eq + 1, "tp", 2) == 0);
    if (!known)
        return usage_error(errf, "--place '%s': unknown mesh axis '%.*s' (dp, ep or tp)", spec,
                           (int)alen, eq + 1);
    const char *pl = colon + 1;
    char *end = NULL;
    long dim = -1;
    if (pl[0] == 'S' && pl[1] >= '0' && pl[1] <= '9') {
        errno = 0;
        dim = strtol(pl + 1, &end, 10);
        if (errno || *end)
            dim = -1;
    }
    if (strcmp(pl, "R") == 0) {
        pin->pl = (ptc_placement){.kind = PTC_PLACE_REPLICATE};
    } else if (dim >= 0 && dim < PTC_MAX_RANK) {
        pin->pl = (ptc_placement){.kind = PTC_PLACE_SHARD, .dim = (int8_t)dim};
    } else {
        return usage_error(errf,
                           "--place '%s': placement '%s' is neither R nor S<dim> with a dimension "
                           "below %d",
                           spec, pl, PTC_MAX_RANK);
    }
    *eq = 0;
    pin->pattern = spec;
    memcpy(pin->axis, eq + 1, alen);
    pin->axis[alen] = 0;
    return 0;
}

/* An output path given to -o: a new or regular file in a writable directory, not one of ptc's
 * own inputs. A device or FIFO is refused: what -o writes is an executable file. */
static int check_output(const ptc_options *o, FILE *errf)
{
    char err[1024];
    if (ptc_file_check_output(o->output, err, sizeof err) < 0)
        return usage_error(errf, "-o %s", err);
    struct stat st;
    if (stat(o->output, &st) == 0 && !S_ISREG(st.st_mode))
        return usage_error(errf, "-o %s: is %s; -o writes an executable file", o->output,
                           ptc_file_kind(st.st_mode));
    const char *what = NULL;
    if (ptc_file_same(o->output, o->file))
        what = "the model being compiled";
    else if (o->runner && ptc_file_same(o->output, o->runner))
        what = "the runner (--runner)";
    else if (ptc_file_same(o->output, "/proc/self/exe"))
        what = "ptc itself";
    for (int i = 0; i < o->ninputs && !what; i++)
        if (ptc_file_same(o->output, strchr(o->inputs[i], '=') + 1))
            what = "an --input file";
    if (what)
        return usage_error(errf, "-o %s: is %s; refusing to replace it", o->output, what);
    return 0;
}

/* The checks of combinations, once every flag is read. */
static int check_combinations(const ptc_options *o, FILE *errf)
{
    if (!o->file)
        return usage_error(errf, "no input file");
    if (o->ninputs && !o->run)
        return usage_error(errf, "--input needs --run");
    if (o->run && o->train)
        return usage_error(errf,
                           "--run runs the forward pass; train with the executable -o writes");
    if (o->npins && !o->mesh.naxes)
        return usage_error(errf, "--place needs --mesh (it pins a parameter on a mesh axis)");
    for (int i = 0; i < o->npins; i++) {
        bool found = false;
        for (int a = 0; a < o->mesh.naxes; a++)
            found |= strcmp(o->mesh.names[a], o->pins[i].axis) == 0;
        char buf[300];
        if (!found)
            return usage_error(errf, "--place '%s': the mesh has no axis %s",
                               pin_str(&o->pins[i], buf, sizeof buf), o->pins[i].axis);
    }
    int pp = 1;
    for (int a = 0; a < o->mesh.naxes; a++)
        if (strcmp(o->mesh.names[a], "pp") == 0)
            pp = o->mesh.sizes[a];
    if (o->grad_dtype_set && o->grad_dtype != PTC_F32 && o->grad_dtype != o->precision)
        return usage_error(errf,
                           "--grad-dtype %s needs --precision %s (gradients are fp32 or in the "
                           "precision's dtype)",
                           o->grad_dtype == PTC_BF16 ? "bf16" : "fp16",
                           o->grad_dtype == PTC_BF16 ? "bf16" : "fp16");
    if (o->no_fuse && o->head_chunks > 1)
        return usage_error(errf, "--head-chunks is a part of the fusion pass, which --no-fuse "
                                 "leaves out");
    if (o->pp_schedule_set && pp == 1)
        return usage_error(errf, "--pp-schedule needs a pipeline (--mesh pp=N with N > 1)");
    if (o->nstage_layers && pp == 1)
        return usage_error(errf, "--stages needs a pipeline (--mesh pp=N with N > 1)");
    if (o->virtual_stages > 1 && o->pp_schedule != PTC_PP_INTERLEAVED)
        return usage_error(errf, "--virtual-stages needs --pp-schedule interleaved");
    if (o->pp_schedule == PTC_PP_INTERLEAVED && o->microbatches % pp)
        return usage_error(errf,
                           "--pp-schedule interleaved needs --microbatches divisible by the %d "
                           "pipeline stages (got %d)",
                           pp, o->microbatches);
    if (o->auto_devices && o->plan_flag)
        return usage_error(errf,
                           "--auto chooses the mesh, ZeRO stage, sequence parallelism, pipeline "
                           "schedule, microbatches and recompute itself: leave out %s",
                           o->plan_flag);
    return o->output ? check_output(o, errf) : 0;
}

static bool takes_value(const char *a)
{
    static const char *const with_value[] = {
        "--emit",   "-D",     "--seed", "--input", "-o",      "--dump-after",
        "--runner", "--mesh", "--zero", "--precision", "--grad-dtype", "--place", "--optim", "--debug-drop-collective",
        "--microbatches", "--pp-schedule", "--virtual-stages", "--stages", "--recompute",
        "--recompute-layer", "--auto", "--device-memory", "--cost-model", "--head-chunks",
        NULL};
    for (int k = 0; with_value[k]; k++)
        if (strcmp(a, with_value[k]) == 0)
            return true;
    return false;
}

/* A decimal integer in [lo, hi]: 0, or -1. */
static int parse_count(const char *s, int lo, int hi, int *out)
{
    if (!*s || strlen(s) > 9)
        return -1;
    long v = 0;
    for (const char *c = s; *c; c++) {
        if (*c < '0' || *c > '9')
            return -1;
        v = v * 10 + (*c - '0');
    }
    if (v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* A size in bytes: a number with an optional unit, B, KB, MB, GB, TB (powers of 1000) or KiB,
 * MiB, GiB, TiB (of 1024), e.g. 80GiB or 1.5e9: 0, or -1. */
static int parse_bytes(const char *s, int64_t *out)
{
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1},      {"B", 1},         {"KB", 1e3},          {"MB", 1e6},
                 {"GB", 1e9},  {"TB", 1e12},     {"KiB", 1024.0},      {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0) || (!(*s >= '0' && *s <= '9') && *s != '.'))
        return -1;
    while (*end == ' ')
        end++;
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++)
        if (strcmp(end, units[k].unit) == 0) {
            double b = v * units[k].scale;
            if (b < 1 || b > 9e18)
                return -1;
            *out = (int64_t)b;
            return 0;
        }
    return -1;
}

/* The flags that fix what --auto chooses itself. */
static bool is_plan_flag(const char *a)
{
    static const char *const plan_flags[] = {
        "--mesh",   "--zero",      "--microbatches",    "--pp-schedule", "--virtual-stages",
        "--stages", "--recompute", "--recompute-layer", "--place",       "--seq-parallel",
        NULL};
    for (int k = 0; plan_flags[k]; k++)
        if (strcmp(a, plan_flags[k]) == 0)
            return true;
    return false;
}

/* One flag a with its value val (NULL for flags without one). */
static int parse_one(const char *a, char *val, ptc_options *o, FILE *out, FILE *errf)
{
    if (!o->plan_flag && is_plan_flag(a))
        o->plan_flag = a;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
        fputs(usage, out);
        fputs(usage_parallel, out);
        return -1;
    } else if (strcmp(a, "--version") == 0) {
        fprintf(out, "ptc %s\n", PTC_VERSION);
        return -1;
    } else if (strcmp(a, "--emit") == 0) {
        if (strcmp(val, "ir") && strcmp(val, "dot") && strcmp(val, "params") &&
            strcmp(val, "plan") && strcmp(val, "plan-json") && strcmp(val, "program") &&
            strcmp(val, "memory") && strcmp(val, "trace") && strcmp(val, "kernels") &&
            strcmp(val, "cuda"))
            return usage_error(errf,
                               "unknown --emit kind '%s' (ir, dot, params, plan, plan-json, "
                               "program, memory, trace, kernels, cuda)",
                               val);
        o->emit = val;
        /* a plan is of a training step */
        if (strcmp(val, "ir") && strcmp(val, "dot") && strcmp(val, "params"))
            o->train = true;
    } else if (strcmp(a, "-D") == 0) {
        if (o->ndefines == PTC_FLAGS_MAX_DEFINES)
            return usage_error(errf, "more than %d -D options", PTC_FLAGS_MAX_DEFINES);
        if (ptc_define_parse(val, &o->defines[o->ndefines]) < 0)
            return usage_error(errf, "-D expects NAME=NUMBER, got '%s'", val);
        o->ndefines++;
    } else if (strcmp(a, "--seed") == 0) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(val, &end, 10);
        if (errno || *end || !*val || val[0] < '0' || val[0] > '9')
            return usage_error(errf, "--seed expects an integer from 0 to %llu, got '%s'",
                               (unsigned long long)UINT64_MAX, val);
        o->seed = s;
    } else if (strcmp(a, "--input") == 0) {
        const char *eq = strchr(val, '=');
        if (o->ninputs == PTC_FLAGS_MAX_INPUTS || !eq || eq == val || !eq[1])
            return usage_error(errf, "--input expects NAME=FILE, got '%s'", val);
        o->inputs[o->ninputs++] = val;
    } else if (strcmp(a, "--run") == 0) {
        o->run = true;
    } else if (strcmp(a, "--no-fuse") == 0) {
        o->no_fuse = true;
    } else if (strcmp(a, "--head-chunks") == 0) {
        if (strcmp(val, "auto") == 0)
            o->head_chunks = 0;
        else if (parse_count(val, 1, 1 << 16, &o->head_chunks))
            return usage_error(errf,
                               "--head-chunks expects auto or an integer from 1 to %d, got '%s'",
                               1 << 16, val);
    } else if (strcmp(a, "--summary") == 0) {
        o->summary = true;
    } else if (strcmp(a, "--train") == 0) {
        o->train = true;
    } else if (strcmp(a, "--debug-drop-collective") == 0) {
        char tail;
        if (sscanf(val, "%d:%d%c", &o->drop_rank, &o->drop_index, &tail) != 2 || o->drop_rank < 0 ||
            o->drop_index < 0)
            return usage_error(errf, "--debug-drop-collective expects RANK:INDEX, got '%s'", val);
    } else if (strcmp(a, "--optim") == 0) {
        if (o->noptim == PTC_FLAGS_MAX_OPTIM || !strchr(val, '='))
            return usage_error(errf, "--optim expects KEY=VALUE, got '%s'", val);
        o->optim[o->noptim++] = val;
    } else if (strcmp(a, "--mesh") == 0) {
        if (parse_mesh(val, &o->mesh, errf))
            return 2;
        o->train = true;
    } else if (strcmp(a, "--auto") == 0) {
        if (parse_count(val, 1, 1 << 20, &o->auto_devices))
            return usage_error(errf, "--auto expects a number of devices from 1 to %d, got '%s'",
                               1 << 20, val);
        o->train = true;
    } else if (strcmp(a, "--device-memory") == 0) {
        if (parse_bytes(val, &o->device_memory) < 0)
            return usage_error(errf,
                               "--device-memory expects a size such as 80GiB, 24GB or 1e9 "
                               "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got '%s'",
                               val);
        o->train = true;
    } else if (strcmp(a, "--cost-model") == 0) {
        o->cost_model_spec = val;
    } else if (strcmp(a, "--microbatches") == 0) {
        if (parse_count(val, 1, 1 << 16, &o->microbatches))
            return usage_error(errf, "--microbatches expects an integer from 1 to %d, got '%s'",
                               1 << 16, val);
        o->train = true;
    } else if (strcmp(a, "--pp-schedule") == 0) {
        o->pp_schedule = ptc_pp_schedule_parse(val);
        if (o->pp_schedule < 0)
            return usage_error(errf,
                               "unknown --pp-schedule '%s' (gpipe, 1f1b, interleaved, zb-h1)", val);
        o->pp_schedule_set = true;
        o->train = true;
    } else if (strcmp(a, "--virtual-stages") == 0) {
        if (parse_count(val, 2, 64, &o->virtual_stages))
            return usage_error(errf, "--virtual-stages expects an integer from 2 to 64, got '%s'",
                               val);
        o->train = true;
    } else if (strcmp(a, "--stages") == 0) {
        o->nstage_layers = 0;
        for (char *s = val;;) {
            char *comma = strchr(s, ',');
            if (comma)
                *comma = 0;
            if (o->nstage_layers == PTC_FLAGS_MAX_STAGES ||
                parse_count(s, 0, 1 << 20, &o->stage_layers[o->nstage_layers]))
                return usage_error(errf,
                                   "--stages expects the layers of every stage, e.g. 4,4,3,1 (at "
                                   "most %d stages), got '%s'",
                                   PTC_FLAGS_MAX_STAGES, s);
            o->nstage_layers++;
            if (!comma)
                break;
            s = comma + 1;
        }
        o->train = true;
    } else if (strcmp(a, "--recompute") == 0) {
        int r = ptc_recompute_parse(val);
        if (r < 0)
            return usage_error(errf, "unknown --recompute '%s' (none, selective, full)", val);
        o->recompute = (ptc_recompute)r;
        o->train = true;
    } else if (strcmp(a, "--recompute-layer") == 0) {
        char *eq = strrchr(val, '=');
        int r = eq ? ptc_recompute_parse(eq + 1) : -1;
        if (!eq || eq == val || r < 0 || o->nrecompute_pins == PTC_FLAGS_MAX_PINS)
            return usage_error(errf,
                               "--recompute-layer expects LAYERS=POLICY with POLICY none, "
                               "selective or full, e.g. 'h.1*=full', got '%s'",
                               val);
        *eq = 0;
        o->recompute_pins[o->nrecompute_pins++] = (ptc_recompute_pin){val, (ptc_recompute)r};
        o->train = true;
    } else if (strcmp(a, "--zero") == 0) {
        if (strlen(val) != 1 || val[0] < '0' || val[0] > '3')
            return usage_error(errf, "--zero expects 0, 1, 2 or 3, got '%s'", val);
        o->zero = val[0] - '0';
        o->train = true;
    } else if (strcmp(a, "--precision") == 0 || strcmp(a, "--grad-dtype") == 0) {
        bool prec = a[2] == 'p';
        ptc_dtype d = strcmp(val, "fp32") == 0   ? PTC_F32
                      : strcmp(val, "bf16") == 0 ? PTC_BF16
                      : strcmp(val, "fp16") == 0 ? PTC_F16
                                                 : PTC_NDTYPES;
        if (d == PTC_NDTYPES)
            return usage_error(errf, "%s expects fp32, bf16 or fp16, got '%s'", a, val);
        if (prec) {
            o->precision = d;
        } else {
            o->grad_f32 = d == PTC_F32;
            o->grad_dtype_set = true;
            o->grad_dtype = d;
        }
        o->train = true;
    } else if (strcmp(a, "--seq-parallel") == 0) {
        o->seq_parallel = true;
        o->train = true;
    } else if (strcmp(a, "--place") == 0) {
        if (o->npins == PTC_FLAGS_MAX_PINS)
            return usage_error(errf, "more than %d --place options", PTC_FLAGS_MAX_PINS);
        if (parse_pin(val, &o->pins[o->npins], errf))
            return 2;
        o->npins++;
        o->train = true;
    } else if (strcmp(a, "-o") == 0) {
        if (!*val)
            return usage_error(errf, "-o expects a file name, got ''");
        o->output = val;
        o->train = true;
    } else if (strcmp(a, "--runner") == 0) {
        o->runner = val;
    } else if (strcmp(a, "--dump-after") == 0) {
        bool known = false;
        for (int k = 0; k < ptc_npasses; k++)
            known |= strcmp(val, ptc_passes[k].name) == 0;
        if (!known)
            return usage_error(errf, "--dump-after: no pass named '%s' (autodiff, optimizer)", val);
        o->dump_after = val;
        o->train = true;
    } else if (a[0] == '-' && a[1]) {
        return usage_error(errf, "unknown option '%s'", a);
    } else if (o->file) {
        return usage_error(errf, "more than one input file ('%s')", a);
    } else {
        o->file = a;
    }
    return 0;
}

int ptc_flags_parse(int argc, char **argv, ptc_options *o, FILE *out, FILE *errf)
{
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->microbatches = 1;
    o->pp_schedule = PTC_PP_1F1B;
    o->drop_rank = o->drop_index = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *val = NULL;
        if (takes_value(a)) {
            if (i + 1 >= argc)
                return usage_error(errf, "option '%s' needs a value", a);
            val = argv[++i];
        } else if (strncmp(a, "-D", 2) == 0 && a[2]) {
            val = argv[i] + 2;
            a = "-D";
        }
        int rc = parse_one(a, val, o, out, errf);
        if (rc)
            return rc;
    }
    char err[256];
    if (ptc_cost_model_parse(o->cost_model_spec ? o->cost_model_spec : "cpu",
                             o->precision == PTC_F32, &o->cost, err, sizeof err) < 0)
        return usage_error(errf, "--cost-model %s: %s", o->cost_model_spec, err);
    return check_combinations(o, errf);
}

ptc_frontend_opts ptc_flags_frontend_opts(const ptc_options *o)
{
    ptc_frontend_opts fo = {.defines = o->defines, .ndefines = o->ndefines, .train = o->train};
    /* ep splits the batch too: it is data parallelism outside the experts */
    int dp = 1, ep = 1;
    for (int a = 0; a < o->mesh.naxes; a++) {
        if (strcmp(o->mesh.names[a], "dp") == 0)
            dp = o->mesh.sizes[a];
        if (strcmp(o->mesh.names[a], "ep") == 0)
            ep = o->mesh.sizes[a];
    }
    fo.batch_split = dp * ep;
    fo.batch_axes = ep == 1 ? NULL : dp == 1 ? "ep" : "dp x ep";
    fo.microbatches = o->microbatches;
    return fo;
}

/* Model chunks per pipeline rank: --virtual-stages under the interleaved schedule (2 unset). */
static int virtual_stages(const ptc_options *o)
{
    return o->pp_schedule == PTC_PP_INTERLEAVED ? (o->virtual_stages ? o->virtual_stages : 2) : 1;
}

ptc_compile_opts ptc_flags_compile_opts(const ptc_options *o)
{
    return (ptc_compile_opts){
        .train = true,
        .verify_each = true,
        .dump_after = o->dump_after,
        .mesh = o->mesh,
        .zero = o->zero,
        .precision = o->precision,
        .grad_f32 = o->grad_f32,
        .loss_scaling = o->precision == PTC_F16,
        .seq_parallel = o->seq_parallel,
        .pins = o->pins,
        .npins = o->npins,
        .microbatches = o->microbatches,
        .virtual_stages = virtual_stages(o),
        .pp_inflight = o->pp_schedule == PTC_PP_GPIPE   ? PTC_INFLIGHT_ALL
                       : o->pp_schedule == PTC_PP_ZB_H1 ? PTC_INFLIGHT_PP
                                                        : PTC_INFLIGHT_1F1B,
        .stage_layers = o->stage_layers,
        .nstage_layers = o->nstage_layers,
        .recompute = o->recompute,
        .recompute_pins = o->recompute_pins,
        .nrecompute_pins = o->nrecompute_pins,
    };
}

ptc_lower_opts ptc_flags_lower_opts(const ptc_options *o, const ptc_graph *g)
{
    return (ptc_lower_opts){.zero = o->zero,
                            .seq_parallel = o->seq_parallel,
                            .keep_grad_outputs = g->mesh.naxes == 0,
                            .model_flops = o->model_flops,
                            .fuse = !o->no_fuse,
                            .head_chunks = o->head_chunks,
                            .mesh = o->mesh,
                            .pp_schedule = o->pp_schedule,
                            .virtual_stages = virtual_stages(o)};
}

/* Every pin matches a parameter, and a parameter of enough dimensions for the one it shards. */
static int apply_pin(const ptc_pin *pin, const ptc_graph *g, FILE *errf)
{
    char buf[300], ty[160];
    int matched = 0, nparams = 0;
    const char **names = ptc_xmalloc(sizeof *names * (size_t)(g->nnodes + 1));
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op != PTC_OP_PARAM || !n->attrs.name)
            continue;
        names[nparams++] = n->attrs.name;
        if (!ptc_glob_match(pin->pattern, n->attrs.name))
            continue;
        matched++;
        const ptc_type *t = &g->values[n->out[0]].type;
        if (pin->pl.kind == PTC_PLACE_SHARD && pin->pl.dim >= t->rank) {
            free(names);
            if (t->rank == 0)
                return usage_error(errf, "--place '%s': parameter '%s' is a scalar (%s): only R",
                                   pin_str(pin, buf, sizeof buf), n->attrs.name,
                                   ptc_type_str(t, ty, sizeof ty));
            return usage_error(
                errf, "--place '%s': parameter '%s' %s has %d dimension%s (S0 to S%d)",
                pin_str(pin, buf, sizeof buf), n->attrs.name, ptc_type_str(t, ty, sizeof ty),
                t->rank, t->rank == 1 ? "" : "s", t->rank - 1);
        }
    }
    const char *near = matched ? NULL : ptc_similar(pin->pattern, names, nparams);
    free(names);
    if (matched)
        return 0;
    if (near)
        return usage_error(errf, "--place '%s': no parameter matches '%s'; did you mean '%s'?",
                           pin_str(pin, buf, sizeof buf), pin->pattern, near);
    return usage_error(errf, "--place '%s': no parameter matches '%s' (see ptc --emit params FILE)",
                       pin_str(pin, buf, sizeof buf), pin->pattern);
}

/* --optim KEY=VALUE: the model's optimizer has KEY, and VALUE is a number in its range. */
static int apply_optim(const char *kv, ptc_optim *opt, FILE *errf)
{
    const char *eq = strchr(kv, '=');
    char key[32], err[256];
    size_t k = (size_t)(eq - kv);
    if (k == 0 || k >= sizeof key)
        return usage_error(errf,
                           "--optim %s: unknown setting (lr, beta1, beta2, eps, "
                           "weight_decay, momentum)",
                           kv);
    memcpy(key, kv, k);
    key[k] = 0;
    char *end;
    errno = 0;
    double v = strtod(eq + 1, &end);
    if (ptc_optim_key(opt->kind, key, err, sizeof err) < 0)
        return usage_error(errf, "--optim %s: %s", kv, err);
    if (end == eq + 1 || *end || errno == ERANGE)
        return usage_error(errf, "--optim %s: '%s' is not a number", kv, eq + 1);
    if (ptc_optim_set(opt, key, v, err, sizeof err) < 0)
        return usage_error(errf, "--optim %s: %s", kv, err);
    return 0;
}

int ptc_flags_apply(const ptc_options *o, ptc_graph *g, FILE *errf)
{
    for (int i = 0; i < o->npins; i++)
        if (apply_pin(&o->pins[i], g, errf))
            return 2;
    for (int i = 0; i < o->noptim; i++)
        if (apply_optim(o->optim[i], &g->optim, errf))
            return 2;
    return 0;
}
