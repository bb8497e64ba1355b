/* fuzz_flags.c - libFuzzer harness for the command lines of ptc (tools/ptc_flags.c) and of the
 * executables it writes (tools/runner_flags.c): any arguments must be taken or refused with a
 * message; never a crash, undefined behaviour or a leak. Nothing is written: the parsers only
 * look at the files they are given.
 *
 * The input is a command line, one argument per line. A first line "ptc" fuzzes ptc: what parses
 * is then applied to examples/gpt2_tiny.ptm as ptc would (its -D, --place and --optim, and the
 * front end's checks for training and the data-parallel split), and with --mesh of at most 16
 * ranks the training step is compiled and partitioned too, so that a flag can never reach an
 * internal error. Any other first line fuzzes the runner's flags.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "passes.h"
#include "plan.h"
#include "ptc_flags.h"
#include "runner_flags.h"
#include "util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *devnull;
static char *model_src;
static size_t model_len;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    devnull = fopen("/dev/null", "w");
    model_src = ptc_read_file(PTC_SOURCE_DIR "/examples/gpt2_tiny.ptm", &model_len);
    if (!devnull || !model_src) {
        fprintf(stderr, "fuzz_flags: cannot open /dev/null or read examples/gpt2_tiny.ptm\n");
        exit(1);
    }
    return 0;
}

/* ptc's path after its flags, short of writing anything. */
static void compile(const ptc_options *o)
{
    ptc_diag diag;
    ptc_diag_init(&diag, devnull, "gpt2_tiny.ptm", model_src, model_len);
    ptc_frontend_opts fo = ptc_flags_frontend_opts(o);
    ptc_graph *g = ptc_frontend_compile("gpt2_tiny.ptm", model_src, model_len, &fo, &diag);
    if (!g)
        return;
    int nranks = o->mesh.naxes ? ptc_mesh_nranks(&o->mesh) : 1;
    if (ptc_flags_apply(o, g, devnull) == 0 && o->train && nranks <= 16) {
        char err[2048];
        ptc_compile_opts co = {.train = true,
                               .verify_each = true,
                               .mesh = o->mesh,
                               .zero = o->zero,
                               .precision = o->precision,
                               .grad_f32 = o->grad_f32,
                               .loss_scaling = o->precision == PTC_F16,
                               .seq_parallel = o->seq_parallel,
                               .pins = o->pins,
                               .npins = o->npins,
                               .dump = devnull};
        ptc_pass_ctx ctx = {.g = g, .opts = &co, .err = err, .errn = sizeof err};
        if (ptc_run_passes(&ctx) == 0)
            ptc_plan_check(ctx.g, -1, -1, err, sizeof err);
        g = ctx.g;
        ptc_pass_ctx_free(&ctx);
    }
    ptc_graph_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *text = malloc(size + 1), *argv[256];
    memcpy(text, data, size);
    text[size] = 0;
    int argc = 0;
    for (char *s = text; argc < 255;) {
        argv[argc++] = s;
        char *nl = strchr(s, '\n');
        if (!nl)
            break;
        *nl = 0;
        s = nl + 1;
    }
    argv[argc] = NULL;
    if (strcmp(argv[0], "ptc") == 0) {
        ptc_options o;
        if (ptc_flags_parse(argc, argv, &o, devnull, devnull) == 0)
            compile(&o);
    } else {
        ptrt_train_opts o;
        ptrt_train_opts_default(&o);
        bool print_plan = false, help = false;
        ptrt_runner_parse(argc, argv, 1e-3, &o, &print_plan, &help, devnull);
    }
    free(text);
    return 0;
}
