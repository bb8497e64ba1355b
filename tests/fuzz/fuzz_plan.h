/* fuzz_plan.h - what the compiler harnesses share: a model compiled as ptc compiles it under
 * parsed options, up to its checked plan, writing nothing. */
#ifndef PTC_FUZZ_PLAN_H
#define PTC_FUZZ_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "ptc_flags.h"

/* The front end on src (named file in messages), ptc_flags_apply, and with training and a mesh
 * of at most max_ranks ranks the pass list (the IR verified after each pass) and the plan:
 * lowered, fused, memory planned and simulated by ptc_plan_check, then held to --device-memory
 * (the planner, --auto, is not run: it forks). Messages go to out. Any
 * input may end in a message at any step; a crash, undefined behaviour, a leak, or a front end
 * that returns a graph with errors or one the verifier refuses is a finding (abort). */
void fuzz_plan(const ptc_options *o, const char *file, const char *src, size_t len, int max_ranks,
               FILE *out);

#endif
