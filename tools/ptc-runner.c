/* ptc-runner.c - the program inside every executable that `ptc MODEL.ptm -o NAME` writes. It reads
 * the plan embedded at the end of its own file and trains it (runtime/train.c).
 *
 * Exit status: 0 success, 1 a failure during the run (diverged loss, failed checkpoint write),
 * 2 a bad flag or a bad file given by the user.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "embed.h"
#include "program.h"
#include "train.h"

static const char usage[] =
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
    "optimizer (the model's optimizer line gives the kind and its other settings):\n"
    "  --lr X                 peak learning rate (default: the model's)\n"
    "  --schedule KIND        cosine (default) or constant, after the warm-up\n"
    "  --warmup N             linear warm-up over N steps (default 0)\n"
    "  --min-lr X             floor of the cosine decay (default lr/10)\n"
    "  --grad-clip X          clip gradients to global norm X; 0 turns it off (default 1.0)\n"
    "checkpoints:\n"
    "  --checkpoint-dir DIR   write DIR/step_NNNNNNNN.safetensors (atomically) at the end and\n"
    "  --checkpoint-every N   every N steps; DIR/latest names the newest\n"
    "  --keep N               keep the newest N checkpoints (default 3; 0 keeps all)\n"
    "  --resume               continue from the newest checkpoint in --checkpoint-dir:\n"
    "                         weights, optimizer state, step and data position\n"
    "  --init-from FILE       start from weights in a safetensors file (e.g. saved from PyTorch)\n"
    "  --save FILE            write the final weights to FILE (safetensors)\n"
    "output:\n"
    "  --log FILE             one JSON object per step (step, loss, lr, grad_norm,\n"
    "                         tokens_per_s, step_ms; val_loss lines too); appended on --resume\n"
    "  --quiet                no progress lines\n"
    "  --dump-grads DIR       write every parameter's gradient (before clipping) of each step\n"
    "                         to DIR/grads_step_NNNNNNNN.safetensors, for checking\n"
    "  --print-plan           print the embedded plan (every rank program: buffers with their\n"
    "                         arena offsets, instructions) and exit\n"
    "backend:\n"
    "  --backend KIND         cpu (OpenBLAS GEMMs, default) or ref (plain reference kernels)\n"
    "  --threads N            CPU threads for GEMMs and kernels (default: every core)\n"
    "  --profile              after the run, print the time spent per op kind (per step, the\n"
    "                         first step left out: it warms up)\n"
    "  --check-memory         fill every arena with a canary at start and, after the run,\n"
    "                         compare each rank's measured high-water mark per arena with the\n"
    "                         plan (printed, and in --log); a difference fails the run\n"
    "  -h, --help             this help\n"
    "test hooks:\n"
    "  --debug-drop-collective R:K  rank R leaves out its K-th collective of every step\n"
    "  --debug-no-check       skip the pre-launch check that the ranks' collectives match\n";

static int bad(const char *prog, const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "%s: error: ", prog);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(see %s --help)\n", prog);
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

static int parse_num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0)
        return -1;
    *out = v;
    return 0;
}

static int parse_flags(int argc, char **argv, ptrt_train_opts *o, bool *print_plan, bool *help)
{
    const char *prog = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
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
                                                 "--backend",
                                                 "--dump-grads",
                                                 "--comm-timeout",
                                                 "--debug-drop-collective",
                                                 "--threads",
                                                 NULL};
        const char *v = NULL;
        for (int k = 0; with_value[k]; k++)
            if (strcmp(a, with_value[k]) == 0) {
                if (i + 1 >= argc)
                    return bad(prog, "option '%s' needs a value%s", a, "");
                v = argv[++i];
            }
        int64_t n = 0;
        double x = 0;
#define INT_FLAG(flag, lo, hi, field)                                                              \
    if (strcmp(a, flag) == 0) {                                                                    \
        if (parse_int(v, lo, hi, &n) < 0) {                                                        \
            char what[96];                                                                         \
            snprintf(what, sizeof what, "%s expects an integer from %lld to %lld", a,              \
                     (long long)(lo), (long long)(hi));                                            \
            return bad(prog, "%s, got '%s'", what, v);                                             \
        }                                                                                          \
        o->field = n;                                                                              \
        continue;                                                                                  \
    }
#define NUM_FLAG(flag, field)                                                                      \
    if (strcmp(a, flag) == 0) {                                                                    \
        if (parse_num(v, &x) < 0)                                                                  \
            return bad(prog, "%s expects a non-negative number, got '%s'", a, v);                  \
        o->field = x;                                                                              \
        continue;                                                                                  \
    }
#define STR_FLAG(flag, field)                                                                      \
    if (strcmp(a, flag) == 0) {                                                                    \
        o->field = v;                                                                              \
        continue;                                                                                  \
    }
        INT_FLAG("--steps", 1, INT64_MAX, steps)
        INT_FLAG("--seed", 0, INT64_MAX, seed)
        INT_FLAG("--val-every", 0, INT64_MAX, val_every)
        INT_FLAG("--val-batches", 1, 1000000, val_batches)
        INT_FLAG("--warmup", 0, INT64_MAX, warmup)
        INT_FLAG("--checkpoint-every", 0, INT64_MAX, ckpt_every)
        INT_FLAG("--keep", 0, INT_MAX, keep)
        INT_FLAG("--threads", 0, 1024, threads)
        NUM_FLAG("--lr", lr)
        NUM_FLAG("--min-lr", min_lr)
        NUM_FLAG("--grad-clip", max_norm)
        NUM_FLAG("--comm-timeout", timeout_s)
        STR_FLAG("--data", data)
        STR_FLAG("--val-data", val_data)
        STR_FLAG("--checkpoint-dir", ckpt_dir)
        STR_FLAG("--init-from", init_from)
        STR_FLAG("--save", save)
        STR_FLAG("--log", log)
        STR_FLAG("--dump-grads", dump_grads)
        if (strcmp(a, "--schedule") == 0) {
            if (strcmp(v, "cosine") == 0)
                o->schedule = PTRT_SCHED_COSINE;
            else if (strcmp(v, "constant") == 0)
                o->schedule = PTRT_SCHED_CONSTANT;
            else
                return bad(prog, "--schedule expects cosine or constant, got '%s'%s", v, "");
        } else if (strcmp(a, "--backend") == 0) {
            if (strcmp(v, "cpu") == 0)
                o->backend = PTRT_BACKEND_CPU;
            else if (strcmp(v, "ref") == 0)
                o->backend = PTRT_BACKEND_REF;
            else
                return bad(prog, "--backend expects cpu or ref, got '%s'%s", v, "");
        } else if (strcmp(a, "--debug-drop-collective") == 0) {
            if (sscanf(v, "%d:%d", &o->drop_rank, &o->drop_index) != 2 || o->drop_rank < 0 ||
                o->drop_index < 0)
                return bad(prog, "--debug-drop-collective expects RANK:INDEX, got '%s'%s", v, "");
        } else if (strcmp(a, "--debug-no-check") == 0) {
            o->no_check = true;
        } else if (strcmp(a, "--shuffle") == 0) {
            o->shuffle = true;
        } else if (strcmp(a, "--resume") == 0) {
            o->resume = true;
        } else if (strcmp(a, "--profile") == 0) {
            o->profile = true;
        } else if (strcmp(a, "--check-memory") == 0) {
            o->check_memory = true;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = true;
        } else if (strcmp(a, "--print-plan") == 0) {
            *print_plan = true;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *help = true;
        } else {
            return bad(prog, "unknown option '%s'%s", a, "");
        }
    }
    if (o->val_every && !o->val_data)
        return bad(prog, "--val-every needs --val-data%s%s", "", "");
    if (o->resume && !o->ckpt_dir)
        return bad(prog, "--resume needs --checkpoint-dir%s%s", "", "");
    return 0;
}

int main(int argc, char **argv)
{
    char err[4096];
    char *text = ptrt_plan_read_exe("/proc/self/exe", err, sizeof err);
    if (!text) {
        fprintf(stderr, "%s: error: %s\n", argv[0], err);
        return 2;
    }
    ptc_plan *plan = ptc_plan_load(text, err, sizeof err);
    if (!plan) {
        fprintf(stderr, "%s: error: the embedded plan does not load: %s\n", argv[0], err);
        free(text);
        return 2;
    }
    ptrt_train_opts o;
    ptrt_train_opts_default(&o);
    bool print_plan = false, help = false;
    int rc = parse_flags(argc, argv, &o, &print_plan, &help);
    if (!rc && help) {
        char count[32];
        snprintf(count, sizeof count, "%lld", (long long)plan->logical_params);
        char mesh[128] = "";
        if (plan->mesh.naxes) {
            int k = snprintf(mesh, sizeof mesh, "; mesh ");
            for (int a = 0; a < plan->mesh.naxes; a++)
                k += snprintf(mesh + k, sizeof mesh - (size_t)k, "%s%s=%d", a ? "," : "",
                              plan->mesh.names[a], plan->mesh.sizes[a]);
            snprintf(mesh + k, sizeof mesh - (size_t)k, ": %d ranks as threads", plan->nranks);
        }
        printf(usage, argv[0], plan->model, count, mesh);
    } else if (!rc && print_plan) {
        fputs(text, stdout);
    } else if (!rc) {
        rc = ptrt_train(plan, &o, err, sizeof err);
        if (rc)
            fprintf(stderr, "%s: error: %s\n", argv[0], err);
    }
    ptc_plan_free(plan);
    free(text);
    return rc;
}
