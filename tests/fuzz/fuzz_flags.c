/* fuzz_flags.c - libFuzzer harness for the command lines of ptc (tools/ptc_flags.c) and of the
 * executables it writes (tools/runner_flags.c): any arguments must be taken or refused with a
 * message; never a crash, undefined behaviour or a leak. Nothing is written: the parsers only
 * look at the files they are given.
 *
 * The input is a command line, one argument per line. A first line "ptc" fuzzes ptc: what parses
 * is then applied to examples/gpt2_tiny.ptm as ptc would (its -D, --place and --optim, and the
 * front end's checks for training and the data-parallel split), and with --mesh of at most 16
 * ranks the training step is compiled and lowered to its checked plan too (fuzz_plan.h), so that
 * a flag can never reach an internal error. Any other first line fuzzes the runner's flags.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_plan.h"
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
            fuzz_plan(&o, "gpt2_tiny.ptm", model_src, model_len, 16, devnull);
    } else {
        ptrt_train_opts o;
        ptrt_train_opts_default(&o);
        bool print_plan = false, help = false;
        ptrt_runner_parse(argc, argv, 1e-3, &o, &print_plan, &help, devnull);
    }
    free(text);
    return 0;
}
