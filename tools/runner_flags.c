/* runner_flags.c - the command line of the executables ptc writes (see runner_flags.h). */
#include "runner_flags.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "checkpoint.h"
#include "file.h"
#include "util.h"

const char ptrt_runner_usage[] =
    "usage: %s [options]\n"
    "\n"
    "Trains the model compiled into this executable (model '%s', %s parameters%s).\n"
    "\n"
    "run:\n"
    "  --steps N              optimizer steps to run (default 20)\n"
    "  --seed N               seed for initial weights, shuffling and random data (default 1)\n"
    "data:\n"
    "  --data FILE.bin        training tokens, llm.c format (256 x int32 header, magic 20240520,\n"
    "                         then uint16 tokens); without it every batch is random tokens\n"
    "  --shuffle              visit the training windows in a seeded random order per epoch\n"
    "                         (default: in order, as llm.c)\n"
    "  --val-data FILE.bin    validation tokens; with --val-every N, the mean loss over\n"
    "  --val-every N          --val-batches N (default 4) batches is printed every N steps\n"
    "  --val-batches N\n"
    "  --eval                 only the validation loss of the weights (--init-from FILE or\n"
    "                         --resume --checkpoint-dir DIR; else the initial ones) over\n"
    "                         --val-batches batches of --val-data: no update, nothing written\n"
    "optimizer (the model's optimizer line gives the kind and its other settings):\n"
    "  --lr X                 peak learning rate, > 0 (default: the model's)\n"
    "  --schedule KIND        cosine (default) or constant, after the warm-up\n"
    "  --warmup N             linear warm-up over N steps (default 0)\n"
    "  --min-lr X             floor of the cosine decay, at most the peak (default lr/10)\n"
    "  --grad-clip X          clip gradients to global norm X; 0 turns it off (default 1.0)\n"
    "fp16 loss scaling (executables compiled with --precision fp16):\n"
    "  --loss-scale S         the initial scale, > 0 (default 65536): a step whose gradients\n"
    "                         overflow is skipped (weights and optimizer state untouched) and\n"
    "                         the scale divided by the growth factor\n"
    "  --loss-scale-growth F  the factor, > 1 (default 2)\n"
    "  --loss-scale-window N  multiply the scale by F after N steps in a row without an\n"
    "                         overflow (default 2000)\n"
    "checkpoints:\n"
    "  --checkpoint-dir DIR   write DIR/step_NNNNNNNN.safetensors (atomically) at the end and\n"
    "  --checkpoint-every N   every N steps; DIR/latest names the newest\n"
    "  --keep N               keep the newest N checkpoints (default 3; 0 keeps all)\n"
    "  --resume               continue from the newest checkpoint in --checkpoint-dir:\n"
    "                         weights, optimizer state, step and data position\n"
    "  --checkpoint-on-signal on SIGTERM or SIGINT, finish the step, write its checkpoint\n"
    "                         and stop (exit 1); the ranks agree on the step\n"
    "  --init-from FILE       start from weights in a safetensors file (e.g. saved from PyTorch)\n"
    "  --save FILE            write the final weights to FILE (safetensors); a device such as\n"
    "                         /dev/null is written in place, a file the run reads is refused\n"
    "  --save-dtype DT        f32 (default: the fp32 master weights) or bf16 (rounded, half the\n"
    "                         size, for inference; --init-from reads it back)\n"
    "output:\n"
    "  --log FILE             one JSON object per step (step, loss, lr, grad_norm,\n"
    "                         tokens_per_s, step_ms; val_loss lines too); appended on --resume\n"
    "  --quiet                no step lines (the summary and \"resumed from\" stay)\n"
    "  --dump-grads DIR       write every parameter's gradient (before clipping) of each step\n"
    "                         to DIR/grads_step_NNNNNNNN.safetensors, for checking\n"
    "  --print-plan           print the embedded plan (every rank program: buffers with their\n"
    "                         arena offsets, instructions) and exit\n";
/* the second half (one string literal may hold 4095 characters in ISO C) */
const char ptrt_runner_usage_backend[] =
    "sampling (byte-level tokens, as ptc-tokenize writes them):\n"
    "  --sample N             generate N bytes with the final weights and print them; without\n"
    "                         --steps, instead of training: from --init-from FILE, --resume\n"
    "                         --checkpoint-dir DIR or the initial weights, writing nothing\n"
    "  --prompt TEXT          the text to continue (default: a newline)\n"
    "  --temperature T        divide the logits by T >= 0; 0 takes the likeliest byte\n"
    "                         (default 1)\n"
    "  --top-k K              draw among the K likeliest bytes; 0: all (default 0)\n";
/* the third: backend and devices */
const char ptrt_runner_usage_device[] =
    "backend:\n"
    "  --backend KIND         jit (default where built with LLVM: the cpu backend with the\n"
    "                         plan's fused kernels compiled by LLVM at start, cached on disk\n"
    "                         in $XDG_CACHE_HOME/ptc/kernels), cpu (oneDNN/OpenBLAS GEMMs, fast\n"
    "                         kernels; fused kernels interpreted, slowly) or ref (plain\n"
    "                         reference kernels, fused kernels interpreted)\n"
    "  --device KIND          cpu (default), cuda (rank r on GPU r mod the GPUs; the CUDA\n"
    "                         driver, NVRTC and cuBLASLt are opened when asked for, so a\n"
    "                         machine without them runs the CPU; moe's routing ops run\n"
    "                         on the host) or cuda-emulated (the CUDA backend on a host\n"
    "                         emulation of the GPU: the generated CUDA C compiled by cc;\n"
    "                         slow; for testing without a GPU)\n"
    "  --threads N            CPU threads for GEMMs and kernels (default: every core)\n"
    "  --matmul-precision P   the float32 GEMMs' precision, as PyTorch's\n"
    "                         set_float32_matmul_precision: highest (default: f32), high (on a\n"
    "                         CPU with AMX-BF16 each operand as two bf16, three bf16 products,\n"
    "                         about 2^-17; TF32 tensor cores on a GPU, about 2^-11) or medium\n"
    "                         (bf16 operands, about 2^-8: AVX-512-BF16 or AMX; bf16 tensor\n"
    "                         cores). Where the units are missing, f32 (the summary says)\n"
    "  --comm-timeout S       longest wait of one collective, in seconds, > 0 (default 60)\n"
    "  --ranks-per-process K  under mpirun or srun (one process per MPI rank), run K ranks of\n"
    "                         the plan as threads in each process (default 1); without a\n"
    "                         launcher every rank is a thread of this process\n"
    "  --trace FILE           write the measured timeline of up to 3 steps after the\n"
    "                         warm-up (the first 3 steps of a run of 6 or more, else the first)\n"
    "                         (Chrome trace-event JSON, one row per rank: open it in\n"
    "                         Perfetto beside ptc --emit trace of the same plan)\n"
    "  --peak-flops X         the hardware's FLOP/s, > 0, for the MFU of the step lines and\n"
    "                         the summary (model FLOPs as PaLM counts them, over X); default:\n"
    "                         the best of three 1024^3 f32 GEMMs measured on the CPU (once\n"
    "                         per machine, kept in the cache, raised by a step faster than\n"
    "                         it); on a GPU (--device cuda), no MFU without it\n"
    "  --profile              after the run, print the time spent per op kind (per step, the\n"
    "                         warm-up left out as for --trace), the fused kernels also by\n"
    "                         kind (their names without the number); on a GPU, --profile and\n"
    "                         --trace wait for each instruction to finish, so their times\n"
    "                         are the GPU's and the steps they time run slower\n"
    "  --no-overlap           every collective completes before the next instruction starts\n"
    "                         (by default, on GPUs with NCCL, allreduce, allgather and\n"
    "                         reduce_scatter run on a stream of their own beside the kernels\n"
    "                         until one needs their buffers)\n"
    "  --check-memory         fill every arena with a canary at start and, after the run,\n"
    "                         compare each rank's measured high-water mark per arena with the\n"
    "                         plan (printed, and in --log); a difference fails the run\n"
    "  -h, --help             this help\n"
    "test hooks:\n"
    "  --debug-drop-collective R:K  rank R leaves out its K-th collective of every step\n"
    "  --debug-no-check       skip the pre-launch check that the ranks' collectives match\n"
    "\n"
    "Exit status: 0 success; 1 a failure during the run (diverged loss, a checkpoint that cannot\n"
    "be written, a collective that times out, standard output that cannot be written); 2 a bad\n"
    "flag or a bad file, found before the first step.\n";

__attribute__((format(printf, 3, 4))) static int bad(FILE *errf, const char *prog, const char *fmt,
                                                     ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(errf, "%s: error: ", prog);
    vfprintf(errf, fmt, ap);
    fprintf(errf, "\n(see %s --help)\n", prog);
    va_end(ap);
    return 2;
}

static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* A finite number >= 0, or > 0 when positive. */
static int parse_num(const char *s, bool positive, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0 || (positive && v == 0))
        return -1;
    *out = v;
    return 0;
}

/* A directory the run will create (with its parents when `parents`): it exists as a directory
 * this process may write, or its nearest existing ancestor is one (the parent itself when not
 * `parents`). */
static int check_dir(FILE *errf, const char *prog, const char *flag, const char *dir, bool parents)
{
    char *p = ptc_xstrdup(dir);
    for (size_t n = strlen(p); n > 1 && p[n - 1] == '/'; n--) /* "a/b/" -> "a/b" */
        p[n - 1] = 0;
    int rc = 0;
    struct stat st;
    bool self = true;
    for (;;) {
        if (stat(p, &st) == 0)
            break;
        if (errno != ENOENT && errno != ENOTDIR) {
            rc = bad(errf, prog, "%s %s: cannot use %s: %s", flag, dir, p, strerror(errno));
            break;
        }
        if (!self && !parents && errno == ENOENT) {
            rc = bad(errf, prog, "%s %s: directory %s does not exist", flag, dir, p);
            break;
        }
        char *slash = strrchr(p, '/');
        if (!slash)
            strcpy(p, "."); /* p has at least 2 bytes: dir is not empty */
        else
            slash[slash == p] = 0; /* "a/b" -> "a", "/x" -> "/" */
        self = false;
    }
    if (rc == 0 && !S_ISDIR(st.st_mode))
        rc = self ? bad(errf, prog, "%s %s: is %s, not a directory", flag, dir,
                        ptc_file_kind(st.st_mode))
                  : bad(errf, prog, "%s %s: cannot be created: %s is %s, not a directory", flag,
                        dir, p, ptc_file_kind(st.st_mode));
    else if (rc == 0 && access(p, W_OK | X_OK) != 0)
        rc = bad(errf, prog, "%s %s: cannot write in %s: %s", flag, dir, p, strerror(errno));
    free(p);
    return rc;
}

/* An output (--save, --log) must not be a file the run reads, nor the other output. */
static int check_not_input(FILE *errf, const char *prog, const char *flag, const char *path,
                           const ptrt_train_opts *o)
{
    const struct {
        const char *path, *what;
    } inputs[] = {
        {o->data, "the --data file"},
        {o->val_data, "the --val-data file"},
        {o->init_from, "the --init-from file"},
        {"/proc/self/exe", "this executable"},
        {strcmp(flag, "--save") == 0 ? o->log : o->save,
         strcmp(flag, "--save") == 0 ? "the --log file" : "the --save file"},
    };
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
        if (ptc_file_same(path, inputs[i].path))
            return bad(errf, prog, "%s %s: is %s; refusing to write over it", flag, path,
                       inputs[i].what);
    return 0;
}

/* Paths and combinations, once every flag is read. */
static int check_all(FILE *errf, const char *prog, double model_lr, ptrt_train_opts *o)
{
    char err[1024];
    if (o->val_every && !o->val_data)
        return bad(errf, prog, "--val-every needs --val-data");
    if (o->eval && !o->val_data)
        return bad(errf, prog, "--eval needs --val-data (the tokens to evaluate on)");
    if (o->eval && (o->save || o->dump_grads || o->ckpt_every || (o->ckpt_dir && !o->resume)))
        return bad(errf, prog, "--eval writes nothing: %s",
                   o->save         ? "leave out --save"
                   : o->dump_grads ? "leave out --dump-grads"
                                   : "--checkpoint-dir only with --resume (to read from)");
    if (o->resume && !o->ckpt_dir)
        return bad(errf, prog, "--resume needs --checkpoint-dir");
    if (o->ckpt_on_signal && !o->ckpt_dir)
        return bad(errf, prog, "--checkpoint-on-signal needs --checkpoint-dir");
    if (!o->sample && (o->prompt || o->temperature != 1 || o->top_k))
        return bad(errf, prog, "%s needs --sample N (the bytes to generate)",
                   o->prompt ? "--prompt" : o->top_k ? "--top-k" : "--temperature");
    if (o->sample && o->eval)
        return bad(errf, prog, "--sample and --eval: give one of them");
    o->sample_only = o->sample && !o->steps_given;
    if (o->sample_only &&
        (o->save || o->dump_grads || o->ckpt_every || o->log || o->trace ||
         (o->ckpt_dir && !o->resume)))
        return bad(errf, prog, "--sample without --steps trains nothing and writes nothing: %s",
                   o->save         ? "leave out --save (or give --steps to train first)"
                   : o->dump_grads ? "leave out --dump-grads"
                   : o->log        ? "leave out --log"
                   : o->trace      ? "leave out --trace"
                                   : "--checkpoint-dir only with --resume (to read from)");
    double peak = o->lr >= 0 ? o->lr : model_lr;
    if (o->min_lr > peak)
        return bad(errf, prog, "--min-lr %g is above the peak learning rate %g (%s)", o->min_lr,
                   peak, o->lr >= 0 ? "--lr" : "the model's optimizer line");
    if (o->ckpt_dir && check_dir(errf, prog, "--checkpoint-dir", o->ckpt_dir, true))
        return 2;
    if (o->dump_grads && check_dir(errf, prog, "--dump-grads", o->dump_grads, false))
        return 2;
    if (o->save && ptc_file_check_output(o->save, err, sizeof err) < 0)
        return bad(errf, prog, "--save %s", err);
    if (o->save && check_not_input(errf, prog, "--save", o->save, o))
        return 2;
    if (o->log && check_not_input(errf, prog, "--log", o->log, o))
        return 2;
    if (o->trace && ptc_file_check_output(o->trace, err, sizeof err) < 0)
        return bad(errf, prog, "--trace %s", err);
    if (o->trace && check_not_input(errf, prog, "--trace", o->trace, o))
        return 2;
    if (o->trace && (ptc_file_same(o->trace, o->save) || ptc_file_same(o->trace, o->log)))
        return bad(errf, prog, "--trace %s: is the %s file too", o->trace,
                   ptc_file_same(o->trace, o->save) ? "--save" : "--log");
    return 0;
}

static bool takes_value(const char *a)
{
    static const char *const with_value[] = {"--steps",
                                             "--seed",
                                             "--data",
                                             "--val-data",
                                             "--val-every",
                                             "--val-batches",
                                             "--lr",
                                             "--schedule",
                                             "--warmup",
                                             "--min-lr",
                                             "--grad-clip",
                                             "--checkpoint-dir",
                                             "--checkpoint-every",
                                             "--keep",
                                             "--init-from",
                                             "--save",
                                             "--log",
                                             "--trace",
                                             "--backend",
                                             "--device",
                                             "--dump-grads",
                                             "--comm-timeout",
                                             "--debug-drop-collective",
                                             "--threads",
                                             "--matmul-precision",
                                             "--peak-flops",
                                             "--sample",
                                             "--prompt",
                                             "--temperature",
                                             "--top-k",
                                             "--ranks-per-process",
                                             "--loss-scale",
                                             "--save-dtype",
                                             "--loss-scale-growth",
                                             "--loss-scale-window",
                                             NULL};
    for (int k = 0; with_value[k]; k++)
        if (strcmp(a, with_value[k]) == 0)
            return true;
    return false;
}

/* The flags that take a number: the field each sets and its range. */
typedef struct int_flag {
    const char *flag;
    int64_t lo, hi;
} int_flag;

static int parse_value(FILE *errf, const char *prog, const char *a, const char *v,
                       ptrt_train_opts *o)
{
    if (strncmp(a, "--loss-scale", 12) == 0 && !o->scale_flag)
        o->scale_flag = a;
    static const int_flag ints[] = {
        {"--steps", 1, PTRT_CKPT_MAX_STEP},
        {"--seed", 0, INT64_MAX},
        {"--val-every", 0, INT64_MAX},
        {"--val-batches", 1, 1000000},
        {"--warmup", 0, INT64_MAX},
        {"--checkpoint-every", 0, INT64_MAX},
        {"--keep", 0, INT_MAX},
        {"--threads", 0, 1024},
        {"--sample", 1, 1 << 24},
        {"--top-k", 0, INT64_MAX},
        {"--ranks-per-process", 1, 64},
        {"--loss-scale-window", 1, INT64_MAX},
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        if (strcmp(a, ints[k].flag) != 0)
            continue;
        int64_t n;
        if (parse_int(v, ints[k].lo, ints[k].hi, &n) < 0)
            return bad(errf, prog, "%s expects an integer from %lld to %lld, got '%s'", a,
                       (long long)ints[k].lo, (long long)ints[k].hi, v);
        switch (k) {
        case 0: o->steps = n, o->steps_given = true; break;
        case 1: o->seed = (uint64_t)n; break;
        case 2: o->val_every = n; break;
        case 3: o->val_batches = n; break;
        case 4: o->warmup = n; break;
        case 5: o->ckpt_every = n; break;
        case 6: o->keep = (int)n; break;
        case 7: o->threads = (int)n; break;
        case 8: o->sample = n; break;
        case 9: o->top_k = n; break;
        case 10: o->ranks_per_process = (int)n; break;
        default: o->scale_window = n; break;
        }
        return 0;
    }
    if (strcmp(a, "--save-dtype") == 0) {
        if (strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0)
            return bad(errf, prog, "--save-dtype expects f32 or bf16, got '%s'", v);
        o->save_bf16 = v[0] == 'b';
        return 0;
    }
    if (strcmp(a, "--loss-scale-growth") == 0) {
        if (parse_num(v, true, &o->scale_growth) < 0 || !(o->scale_growth > 1))
            return bad(errf, prog, "--loss-scale-growth expects a number above 1, got '%s'", v);
        return 0;
    }
    bool positive = strcmp(a, "--lr") == 0 || strcmp(a, "--comm-timeout") == 0 ||
                    strcmp(a, "--peak-flops") == 0 || strcmp(a, "--loss-scale") == 0;
    double *num = strcmp(a, "--lr") == 0             ? &o->lr
                  : strcmp(a, "--peak-flops") == 0   ? &o->peak_flops
                  : strcmp(a, "--min-lr") == 0       ? &o->min_lr
                  : strcmp(a, "--grad-clip") == 0    ? &o->max_norm
                  : strcmp(a, "--comm-timeout") == 0 ? &o->timeout_s
                  : strcmp(a, "--temperature") == 0  ? &o->temperature
                  : strcmp(a, "--loss-scale") == 0   ? &o->loss_scale
                                                     : NULL;
    if (num) {
        if (parse_num(v, positive, num) < 0)
            return bad(errf, prog, "%s expects a %s number, got '%s'", a,
                       positive ? "positive" : "non-negative", v);
        return 0;
    }
    const char **str = strcmp(a, "--data") == 0             ? &o->data
                       : strcmp(a, "--val-data") == 0       ? &o->val_data
                       : strcmp(a, "--checkpoint-dir") == 0 ? &o->ckpt_dir
                       : strcmp(a, "--init-from") == 0      ? &o->init_from
                       : strcmp(a, "--save") == 0           ? &o->save
                       : strcmp(a, "--log") == 0            ? &o->log
                       : strcmp(a, "--trace") == 0          ? &o->trace
                       : strcmp(a, "--dump-grads") == 0     ? &o->dump_grads
                                                            : NULL;
    if (strcmp(a, "--prompt") == 0) {
        if (!*v)
            return bad(errf, prog, "--prompt expects some text to continue, got ''");
        o->prompt = v;
        return 0;
    }
    if (str) {
        if (!*v)
            return bad(errf, prog, "%s expects a %s name, got ''", a,
                       strcmp(a, "--checkpoint-dir") == 0 || strcmp(a, "--dump-grads") == 0
                           ? "directory"
                           : "file");
        *str = v;
        return 0;
    }
    if (strcmp(a, "--matmul-precision") == 0) {
        int p = -1;
        for (int k = PTRT_MATMUL_HIGHEST; k <= PTRT_MATMUL_MEDIUM; k++)
            if (strcmp(v, ptrt_matmul_precision_name((ptrt_matmul_precision)k)) == 0)
                p = k;
        if (p < 0)
            return bad(errf, prog, "--matmul-precision expects highest, high or medium, got '%s'",
                       v);
        o->matmul_precision = p;
        return 0;
    }
    if (strcmp(a, "--schedule") == 0) {
        if (strcmp(v, "cosine") == 0)
            o->schedule = PTRT_SCHED_COSINE;
        else if (strcmp(v, "constant") == 0)
            o->schedule = PTRT_SCHED_CONSTANT;
        else
            return bad(errf, prog, "--schedule expects cosine or constant, got '%s'", v);
    } else if (strcmp(a, "--backend") == 0) {
        if (strcmp(v, "cpu") == 0)
            o->backend = PTRT_BACKEND_CPU;
        else if (strcmp(v, "ref") == 0)
            o->backend = PTRT_BACKEND_REF;
        else if (strcmp(v, "jit") == 0 && ptrt_backend_jit)
            o->backend = PTRT_BACKEND_JIT;
        else
            return bad(errf, prog, "--backend expects cpu, ref or jit, got '%s'%s", v,
                       ptrt_backend_jit ? "" : " (jit: this build has no LLVM)");
    } else if (strcmp(a, "--device") == 0) {
        if (strcmp(v, "cpu") == 0)
            o->device = PTRT_DEVICE_CPU;
        else if (strcmp(v, "cuda") == 0)
            o->device = PTRT_DEVICE_CUDA;
        else if (strcmp(v, "cuda-emulated") == 0)
            o->device = PTRT_DEVICE_CUDA_EMULATED;
        else
            return bad(errf, prog, "--device expects cpu, cuda or cuda-emulated, got '%s'", v);
    } else { /* --debug-drop-collective */
        char tail;
        if (sscanf(v, "%d:%d%c", &o->drop_rank, &o->drop_index, &tail) != 2 || o->drop_rank < 0 ||
            o->drop_index < 0)
            return bad(errf, prog, "--debug-drop-collective expects RANK:INDEX, got '%s'", v);
    }
    return 0;
}

int ptrt_runner_parse(int argc, char **argv, double model_lr, ptrt_train_opts *o, bool *print_plan,
                      bool *help, FILE *errf)
{
    const char *prog = argc > 0 && argv[0] ? argv[0] : "ptc-runner";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (takes_value(a)) {
            if (i + 1 >= argc)
                return bad(errf, prog, "option '%s' needs a value", a);
            int rc = parse_value(errf, prog, a, argv[++i], o);
            if (rc)
                return rc;
        } else if (strcmp(a, "--debug-no-check") == 0) {
            o->no_check = true;
        } else if (strcmp(a, "--shuffle") == 0) {
            o->shuffle = true;
        } else if (strcmp(a, "--eval") == 0) {
            o->eval = true;
        } else if (strcmp(a, "--resume") == 0) {
            o->resume = true;
        } else if (strcmp(a, "--checkpoint-on-signal") == 0) {
            o->ckpt_on_signal = true;
        } else if (strcmp(a, "--profile") == 0) {
            o->profile = true;
        } else if (strcmp(a, "--check-memory") == 0) {
            o->check_memory = true;
        } else if (strcmp(a, "--no-overlap") == 0) {
            o->no_overlap = true;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = true;
        } else if (strcmp(a, "--print-plan") == 0) {
            *print_plan = true;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *help = true;
        } else {
            return bad(errf, prog, "unknown option '%s'", a);
        }
    }
    if (*help || *print_plan)
        return 0;
    return check_all(errf, prog, model_lr, o);
}
