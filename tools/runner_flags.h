/* runner_flags.h - the command line of the executables ptc writes (ptc-runner): every flag parsed
 * and checked before the run starts, apart from main() so that a fuzzer (tests/fuzz/fuzz_flags.c)
 * can drive it with any arguments.
 *
 * A bad flag is refused with a message that names it and exit status 2, before any step is run:
 * values out of range (--lr must be positive, as in the model's optimizer line), an empty path, a
 * checkpoint directory that cannot be made, a --save that cannot be written or that names a file
 * the run reads (--data, --val-data, --init-from, the executable itself) or --log. Nothing here
 * writes a file.
 */
#ifndef PTRT_RUNNER_FLAGS_H
#define PTRT_RUNNER_FLAGS_H

#include <stdbool.h>
#include <stdio.h>

#include "train.h"

/* The usage text: printf it with the program, the model's name, its parameter count and a
 * description of the mesh (see ptc-runner.c). */
extern const char ptrt_runner_usage[];
extern const char ptrt_runner_usage_backend[]; /* printed after it */
extern const char ptrt_runner_usage_device[];  /* and then this */

/* Parses argv (argv[0] is the program) into o, which ptrt_train_opts_default filled. model_lr is
 * the learning rate of the plan's optimizer line (the peak when --lr is not given). Returns 0 to
 * go on, or 2 after a message on errf. */
int ptrt_runner_parse(int argc, char **argv, double model_lr, ptrt_train_opts *o, bool *print_plan,
                      bool *help, FILE *errf);

#endif
