/* fuzz_compile.c - libFuzzer harness for the whole compiler on models.
 *
 * The input is a .ptm model. It is compiled for training as ptc compiles it, under one of the
 * command lines below (the input's size picks it, as fuzz_frontend picks its options), through
 * the pass list (autodiff, the optimizer, mixed precision, moe, partitioning over dp, tp, ep and
 * sequence parallelism, pipeline stages and recompute; the IR verified after every pass) to a
 * lowered, fused, memory-planned plan that ptc_plan_check simulates (fuzz_plan.h). Any model
 * must give a plan or a message; never a crash, undefined behaviour or a leak. fuzz_frontend
 * fuzzes the front end alone, faster; fuzz_flags the command lines on one model.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ptc's arguments before the file, one set per line (split at spaces) */
static const char *const lines[] = {
    "",
    "--mesh dp=2 --zero 1",
    "--mesh tp=2 --seq-parallel",
    "--mesh dp=2 --zero 3",
    "--mesh pp=2 --microbatches 2",
    "--mesh ep=2",
    "--mesh dp=2,tp=2 --precision bf16",
    "--mesh pp=2 --microbatches 4 --pp-schedule interleaved --recompute full",
    "--precision fp16 --recompute selective",
    "--mesh pp=2,dp=2 --microbatches 2 --zero 2 --pp-schedule zb-h1",
    "--mesh dp=2,ep=2,tp=2 --zero 1",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (!devnull)
        devnull = fopen("/dev/null", "w");
    char line[128], *argv[24];
    int argc = 0;
    snprintf(line, sizeof line, "%s", lines[size % (sizeof lines / sizeof *lines)]);
    argv[argc++] = "ptc";
    for (char *s = line; *s;) {
        argv[argc++] = s;
        while (*s && *s != ' ')
            s++;
        if (*s)
            *s++ = 0;
    }
    argv[argc++] = "fuzz.ptm";
    argv[argc] = NULL;
    ptc_options o;
    if (ptc_flags_parse(argc, argv, &o, devnull, devnull) != 0) {
        fprintf(stderr, "fuzz_compile: ptc refuses its own command line %d\n",
                (int)(size % (sizeof lines / sizeof *lines)));
        abort();
    }
    fuzz_plan(&o, "fuzz.ptm", (const char *)data, size, 16, devnull);
    return 0;
}
