/* ptc_flags.h - the command line of ptc: every flag parsed and checked, apart from main() so that
 * a fuzzer (tests/fuzz/fuzz_flags.c) can drive it with any arguments.
 *
 * A bad flag is refused with one line that names the flag and what was wrong with its value, and
 * exit status 2. Checks that need the model (a --place pattern must match a parameter and fit its
 * rank, an --optim setting must belong to the model's optimizer) run once it is compiled
 * (ptc_flags_apply). Nothing here writes a file.
 */
#ifndef PTC_FLAGS_H
#define PTC_FLAGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "frontend.h"
#include "ir.h"
#include "passes.h"
#include "planner.h"
#include "trace.h"

#define PTC_FLAGS_MAX_AXIS 1024 /* ranks on one mesh axis */
#define PTC_FLAGS_MAX_PINS 64
#define PTC_FLAGS_MAX_OPTIM 16
#define PTC_FLAGS_MAX_DEFINES 64
#define PTC_FLAGS_MAX_INPUTS 64
#define PTC_FLAGS_MAX_STAGES 256

typedef struct ptc_options {
    const char *file;
    const char *emit;
    bool run, train, seq_parallel, summary;
    bool no_fuse; /* --no-fuse: every op its own kernel */
    int head_chunks; /* --head-chunks: 0 auto, 1 off, N (plan/fuse.c) */
    double model_flops; /* of a training step of the model (set by the driver), for MFU */
    const char *output, *dump_after, *runner;
    ptc_mesh mesh;
    int zero;
    ptc_dtype precision; /* --precision: PTC_F32 (default), PTC_BF16 or PTC_F16 */
    bool grad_f32;        /* --grad-dtype fp32 */
    bool grad_dtype_set;  /* --grad-dtype given: */
    ptc_dtype grad_dtype; /* what it said */
    ptc_pin pins[PTC_FLAGS_MAX_PINS];
    const char *pin_args[PTC_FLAGS_MAX_PINS]; /* each --place as given, for messages */
    int npins;
    const char *optim[PTC_FLAGS_MAX_OPTIM];
    int noptim;
    int drop_rank, drop_index;
    uint64_t seed;
    ptc_define defines[PTC_FLAGS_MAX_DEFINES];
    int ndefines;
    const char *inputs[PTC_FLAGS_MAX_INPUTS];
    int ninputs;
    int microbatches;   /* 1: none */
    int pp_schedule;    /* ptc_pp_schedule */
    bool pp_schedule_set;
    int virtual_stages; /* 0: not given (interleaved: 2) */
    int stage_layers[PTC_FLAGS_MAX_STAGES];
    int nstage_layers;
    ptc_recompute recompute;
    ptc_recompute_pin recompute_pins[PTC_FLAGS_MAX_PINS];
    int nrecompute_pins;
    int auto_devices;      /* --auto N: the planner chooses the parallel plan of N devices */
    int64_t device_memory; /* --device-memory: the bytes one rank may plan (0: no limit) */
    const char *cost_model_spec; /* --cost-model as given */
    ptc_cost_model cost;   /* --cost-model, resolved for --precision (default: cpu) */
    const char *plan_flag; /* the first flag given of those --auto chooses itself */
} ptc_options;

/* Parses argv (argv[0] is the program) into o. The strings of argv must outlive o; -D and --place
 * values are split in place. Returns 0 to go on, 2 after a message on errf, or -1 after --help or
 * --version was printed on out (the caller exits 0). */
int ptc_flags_parse(int argc, char **argv, ptc_options *o, FILE *out, FILE *errf);

/* What the front end must check for these options (training asked for, the data-parallel split). */
ptc_frontend_opts ptc_flags_frontend_opts(const ptc_options *o);

/* The pass list's options for a training step under these options (ptc_run_passes). */
ptc_compile_opts ptc_flags_compile_opts(const ptc_options *o);

/* The lowering's options for the step graph g that those passes made (ptc_lower); the model's
 * logical parameter count and the passes' notes are the caller's to add. */
ptc_lower_opts ptc_flags_lower_opts(const ptc_options *o, const ptc_graph *g);

/* The checks and overrides that need the compiled model g: every --place pattern matches a
 * parameter whose rank has the dimension it shards; every --optim setting belongs to g's optimizer
 * and is in range, and is applied to g->optim. Returns 0, or 2 after a message on errf. */
int ptc_flags_apply(const ptc_options *o, ptc_graph *g, FILE *errf);

#endif
