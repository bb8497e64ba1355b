/* passes.h - the one ordered list of passes and the signature every pass shares.
 *
 * A pass takes the graph in a pass context and transforms it in place; it states at its top what
 * it assumes and what it guarantees. ptc_run_passes runs the list in order, runs the IR verifier
 * after each pass when asked (tests and debug builds always ask), and prints the IR after the pass
 * named by --dump-after.
 */
#ifndef PTC_PASSES_H
#define PTC_PASSES_H

#include <stdbool.h>
#include <stdio.h>

#include "ir.h"

/* A placement pinned by the user: parameter NAME (a glob: * matches any run of characters) gets
 * placement pl on mesh axis `axis` (--place NAME=AXIS:PL, e.g. 'h.*.mlp.w_fc=tp:S1'). */
typedef struct ptc_pin {
    const char *pattern;
    char axis[PTC_MAX_AXIS_NAME];
    ptc_placement pl;
} ptc_pin;

/* What sequence parallelism keeps, for the weight gradients, of a layer input it all-gathered
 * (a norm's output, sharded over the sequence, gathered for a column-parallel matmul): the
 * gathered full-sequence tensor (no extra traffic), or only the 1/t shard, all-gathered again in
 * backward (Megatron-LM's choice: the memory saved equals the bytes added). AUTO picks by the
 * memory/traffic trade-off (passes/partition/partition.c, sp_choose). */
typedef enum { PTC_SP_STASH_AUTO, PTC_SP_STASH_GATHERED, PTC_SP_STASH_SHARD } ptc_sp_stash;

/* Activation recompute of a layer (passes/pipeline.c). */
typedef enum { PTC_RECOMPUTE_NONE, PTC_RECOMPUTE_SELECTIVE, PTC_RECOMPUTE_FULL } ptc_recompute;
const char *ptc_recompute_name(int r);
int ptc_recompute_parse(const char *s); /* -1: unknown */

/* --recompute-layer GLOB=POLICY: the layers (h.3) the glob matches get the policy. */
typedef struct ptc_recompute_pin {
    const char *pattern;
    ptc_recompute policy;
} ptc_recompute_pin;

/* How many microbatches a pipeline schedule keeps in flight on rank r of pp, M microbatches:
 * 1F1B's min(pp - r, M) (also the interleaved schedule's, per chunk-microbatch: see
 * ptc_pp_stage_inflight), GPipe's M, zero bubble H1's min(pp, M) (its weight gradients wait) */
typedef enum { PTC_INFLIGHT_1F1B, PTC_INFLIGHT_ALL, PTC_INFLIGHT_PP } ptc_pp_inflight;

typedef struct ptc_compile_opts {
    bool train;        /* build the whole training step (autodiff + optimizer), not just forward */
    ptc_mesh mesh;     /* naxes 0: single device */
    bool seq_parallel; /* Megatron sequence parallelism on the tp axis */
    ptc_sp_stash sp_stash;
    int zero; /* ZeRO stage 0..3 on the dp axis */
    /* the mixed-precision policy (precision.c): PTC_F32 (none), PTC_BF16 or PTC_F16 */
    ptc_dtype precision;
    /* with a 16-bit precision: gradients cast to f32 before they are accumulated and reduced
     * (--grad-dtype fp32); otherwise they stay in the precision's dtype */
    bool grad_f32;
    /* dynamic loss scaling (fp16): the backward starts from the input opt.loss_scale, the
     * optimizer unscales (the runtime chooses the scale and skips steps that overflow) */
    bool loss_scaling;
    /* the step's batch in this many microbatches (1: none): partitioned as a data-parallel axis
     * "mb" (placed right inside dp) that the lowering runs in time, one microbatch after the
     * other, accumulating the gradients; a "pp" axis of the mesh is left to the lowering too */
    int microbatches;
    /* pipeline: the mesh's "pp" axis cut into pp x virtual_stages stages (virtual stages > 1:
     * the interleaved schedule's model chunks); --stages: layers per (virtual) stage */
    int virtual_stages;
    /* the microbatches each pipeline rank keeps in flight under the schedule, which the stage
     * cut weighs (pipeline.c) */
    ptc_pp_inflight pp_inflight;
    const int *stage_layers;
    int nstage_layers;
    ptc_recompute recompute;
    const ptc_recompute_pin *recompute_pins;
    int nrecompute_pins;
    const ptc_pin *pins;
    int npins;
    bool verify_each;       /* run the verifier after every pass */
    const char *dump_after; /* pass name, or NULL */
    FILE *dump;             /* where --dump-after prints (stdout when NULL) */
} ptc_compile_opts;

typedef struct ptc_pass_ctx {
    ptc_graph *g;
    const ptc_compile_opts *opts;
    /* set by autodiff: grads[i] is the gradient value of the i-th PARAM node in graph order */
    int *grads;
    int nparams;
    char *err;
    size_t errn;
    /* set by partition: decisions a plan should show, one line each ("" when none) */
    char notes[2048];
} ptc_pass_ctx;

typedef struct ptc_pass {
    const char *name;
    const char *what;
    int (*run)(ptc_pass_ctx *ctx); /* 0, or -1 with a message in ctx->err */
    bool train_only;
} ptc_pass;

extern const ptc_pass ptc_passes[];
extern const int ptc_npasses;

int ptc_pass_moe(ptc_pass_ctx *ctx);
int ptc_pass_precision(ptc_pass_ctx *ctx);
int ptc_pass_autodiff(ptc_pass_ctx *ctx);
int ptc_pass_optimizer(ptc_pass_ctx *ctx);
int ptc_pass_partition(ptc_pass_ctx *ctx);
int ptc_pass_moe_ep(ptc_pass_ctx *ctx);
int ptc_pass_pipeline(ptc_pass_ctx *ctx);
/* The microbatches whose activations pipeline stage s of S (pp ranks of S / pp chunks) keeps at
 * once under rule (the interleaved schedule's with S > pp), as the stage cut weighs them */
double ptc_pp_stage_inflight(ptc_pp_inflight rule, int microbatches, int pp, int S, int s);

/* The graph builder as passes use it: ptc_build, except that a failure (a bug in the pass: its
 * nodes must be valid) becomes the pass's internal error in err, *failed is set, and every later
 * call returns -1 results without building. out[0] is -1 after a failure. */
void ptc_pass_build(ptc_graph *g, const char *pass, ptc_op op, const int *in, int nin,
                    const ptc_attrs *at, ptc_loc loc, int *out, bool *failed, char *err,
                    size_t errn);

/* v cast to dt with ptc_pass_build (v itself when it has that dtype already). */
int ptc_pass_cast(ptc_graph *g, const char *pass, int v, ptc_dtype dt, ptc_loc loc, bool *failed,
                  char *err, size_t errn);
/* A pass that rebuilds the graph: node n of g built again in `out` over operands `in` (values of
 * out) with attributes `at`, keeping n's stage, recompute mark and result placements; vmap[old
 * result] is set to the new one. */
void ptc_pass_copy_node(ptc_graph *out, const ptc_graph *g, const char *pass, const ptc_node *n,
                        const int *in, const ptc_attrs *at, int *vmap, bool *failed, char *err,
                        size_t errn);

/* ptc_pass_copy_node of n as it is, its operands the values vmap gives for n's. */
void ptc_pass_copy_mapped(ptc_graph *out, const ptc_graph *g, const char *pass, const ptc_node *n,
                          int *vmap, bool *failed, char *err, size_t errn);
/* A new, empty graph for a pass that rebuilds g: g's name, optimizer, mesh and node ceiling. */
ptc_graph *ptc_pass_graph_like(const ptc_graph *g);
/* The end of such a rebuild: out's loss, outputs and state updates are g's, through vmap. */
void ptc_pass_map_ends(ptc_graph *out, const ptc_graph *g, const int *vmap);

/* Runs the pass list on ctx->g; 0, or -1 with ctx->err naming the pass. */
int ptc_run_passes(ptc_pass_ctx *ctx);
void ptc_pass_ctx_free(ptc_pass_ctx *ctx);

#endif
