/* program.h - the execution plan as data: for every distinct rank program, the buffers it works
 * on (with their place in a statically planned arena) and the instructions it runs.
 *
 * This is what an executable carries and runs; nothing is interpreted from the graph at run time.
 *
 *   plan      the model's name, optimizer, mesh and the programs; rank r runs rank_program[r].
 *             Ranks that run the same instructions share one program (an SPMD program: a rank's
 *             mesh coordinate resolves shard offsets and peers when it runs).
 *   buffer    a typed tensor of one rank: dtype, local shape, its placement per mesh axis (how it
 *             maps into the full logical tensor), a region and a byte offset in that region's
 *             arena. Parameters and optimizer state are persistent (they carry their name and
 *             initialiser); inputs are fed before each step; everything else lives from its first
 *             write to its last read. A view shares the bytes of another buffer (a reshape, an
 *             op run in place).
 *   instr     kernel (an op of the op table over buffers), gemm (a batched matrix product with
 *             transposes folded in), collective over a group of the mesh, send/recv with a peer
 *             on a mesh axis, copy (bytes from one buffer to another), fused (a generated
 *             kernel of the plan's kernel table over its operands and results: what the fusion
 *             pass makes of several kernels, plan/fuse.c).
 *   region    one arena per rank and region, allocated once: parameters, gradients, optimizer
 *             state, activations (and workspace), communication. Offsets come from the static
 *             memory planner (memplan.c), so every byte a rank uses is known before launch.
 *   entry     a program can be entered for the whole training step or for the loss alone
 *             (evaluation): the eval entry is the subset of instructions the loss depends on.
 *
 * A group is a set of mesh axes: the ranks that share this rank's coordinate on every other axis
 * (mask 1 << axis). So a program names groups for any axis names (dp, tp, pp, ep, ...), and a
 * collective over several axes at once is one group.
 */
#ifndef PTC_PROGRAM_H
#define PTC_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ir.h"

typedef enum {
    PTC_REGION_PARAM, /* parameters (persistent) */
    PTC_REGION_GRAD,  /* the reduced gradient of every parameter (lives for the whole step) */
    PTC_REGION_OPTIM, /* optimizer state (persistent) */
    PTC_REGION_ACT,   /* activations and workspace: planned by liveness */
    PTC_REGION_COMM,  /* communication staging (messages in flight) */
    PTC_NREGIONS
} ptc_region;
const char *ptc_region_name(int r);

typedef enum {
    PTC_BUF_TEMP,  /* written and read within a step */
    PTC_BUF_INPUT, /* fed by the runtime before a step */
    PTC_BUF_PARAM, /* a parameter: persistent, initialised from (seed, name, init) */
    PTC_BUF_STATE, /* optimizer state: persistent, initialised from its init */
} ptc_buf_kind;

/* What the runtime feeds into an input buffer. */
typedef enum {
    PTC_ROLE_NONE,
    PTC_ROLE_TOKENS,   /* i32 ids feeding an embedding: the tokens of a batch */
    PTC_ROLE_TARGETS,  /* i32 ids feeding cross-entropy: the next tokens */
    PTC_ROLE_LR,       /* opt.lr */
    PTC_ROLE_STEP,     /* opt.step */
    PTC_ROLE_MAX_NORM, /* opt.max_norm */
    PTC_ROLE_LOSS_SCALE, /* opt.loss_scale (fp16 loss scaling) */
    PTC_ROLE_DATA,     /* any other input: random data by (seed, step) */
    PTC_NROLES
} ptc_role;
const char *ptc_role_name(int r);

#define PTC_ALIGN 64 /* every buffer starts at a multiple of this many bytes */

typedef struct ptc_buffer {
    ptc_type type;                          /* dtype and local shape */
    ptc_placement place[PTC_MAX_MESH_AXES]; /* how this rank's part maps into the full tensor */
    uint8_t kind;                           /* ptc_buf_kind */
    uint8_t region;                         /* ptc_region */
    uint8_t role;                           /* ptc_role, for inputs */
    int view;       /* -1, or the buffer whose bytes this one shares (never a view itself) */
    int view_axis;  /* a view of this rank's shard: -1, or the mesh axis whose coordinate c puts
                       the view c * view_step bytes into its root */
    int64_t view_step;
    int64_t view_offset; /* a view: bytes into its root (and its shard) where it starts: a
                            microbatch's slice of a batch input */
    int64_t offset; /* bytes from the start of the region's arena (a view: its root's) */
    int64_t bytes;  /* numel x dtype size */
    int64_t bound;  /* i32 inputs: ids are below this (embedding rows, classes); 0 = none */
    const char *name; /* parameters, optimizer state and inputs */
    ptc_init init;    /* parameters and optimizer state */
} ptc_buffer;

typedef enum {
    PTC_INSTR_KERNEL,
    PTC_INSTR_GEMM,
    PTC_INSTR_COLL,
    PTC_INSTR_SEND,
    PTC_INSTR_RECV,
    PTC_INSTR_COPY,
    PTC_INSTR_FUSED,
    PTC_NINSTR_KINDS
} ptc_instr_kind;

typedef enum { PTC_PHASE_FORWARD, PTC_PHASE_BACKWARD, PTC_PHASE_UPDATE } ptc_phase;
const char *ptc_phase_name(int p);

/* The pipeline work an instruction belongs to (the unit a schedule orders): the forward or
 * backward of one microbatch on one virtual stage, the weight-gradient part of a backward split
 * for zb-h1, or the step's own work (before the microbatches and after them: gradient
 * reductions, the norm, the update). */
typedef enum { PTC_WORK_STEP, PTC_WORK_F, PTC_WORK_B, PTC_WORK_W, PTC_NWORK } ptc_work;
const char *ptc_work_name(int w);

/* C[b] = alpha op(A[b]) op(B[b]) + beta C[b] for b < batch, row-major, accumulated in f32;
 * op = transpose when ta/tb. A[b] starts at b * sa elements (0: the same matrix for every b),
 * likewise B and C. */
typedef struct ptc_gemm {
    bool ta, tb;
    /* the dtype of A and B: f32, bf16 or f16 (--precision: the library's bf16 GEMM where it has
     * one, accumulating in f32; f16 operands widened) */
    uint8_t ab;
    /* the dtype of C: f32, or (beta 0 only) bf16 or f16: every element accumulated in f32, then
     * rounded once to 16 bits as the cast kernel rounds (so no f32 copy of C is stored) */
    uint8_t cd;
    int64_t m, n, k, batch;
    int64_t lda, ldb, ldc;
    int64_t sa, sb, sc;
    double alpha, beta;
} ptc_gemm;

typedef enum {
    PTC_COLL_ALLREDUCE,
    PTC_COLL_ALLGATHER,
    PTC_COLL_REDUCE_SCATTER,
    PTC_COLL_ALL_TO_ALL,
    PTC_COLL_ALL_TO_ALL_V, /* uneven counts: the kept rows of mixture-of-experts layers */
    PTC_NCOLLS
} ptc_coll_kind;
const char *ptc_coll_name(int k);

/* A collective over the group `axes` (a mask of mesh axes) of n = product of their sizes ranks.
 * Layouts as in the communicator: a buffer of n parts along a dimension is `outer` blocks of
 * n * chunk elements (runtime/comm/comm.h). allreduce: count elements; allgather: (outer, chunk)
 * of the output; reduce_scatter: of the input; all_to_all: (outer, chunk) of the input split
 * along the new dim and (outer2, chunk2) of the output split along the old one.
 * all_to_all_v (expert parallelism, two operands: the rows and i32 counts[n * count], every
 * member's kept rows per expert, n members): count is the experts, chunk the elements of a row,
 * outer 0 to send each member the rows of its experts (the rows are in expert order; member q
 * holds experts [q count/n, (q+1) count/n)) and receive mine in member order, 1 the way back; the
 * rows of the output past those received are zeros. Printed experts=, row=, back=. */
typedef struct ptc_coll {
    uint8_t kind;   /* ptc_coll_kind */
    uint8_t reduce; /* 0 sum, 1 max */
    unsigned axes;
    int64_t count, outer, chunk, outer2, chunk2;
} ptc_coll;

typedef struct ptc_instr {
    uint8_t kind;  /* ptc_instr_kind */
    uint8_t phase; /* ptc_phase */
    ptc_op op;     /* the op it runs (kernel) or came from (the others, for profiles) */
    int nin, nout;
    int *in, *out; /* buffer ids */
    ptc_attrs attrs;
    ptc_gemm gemm;
    ptc_coll coll;
    int peer_axis, peer_delta; /* send/recv: the peer is this rank moved by delta on the axis */
    int tag;                   /* send/recv: what the message is (the pre-launch check matches a
                                  send with its receive by order and proves their tags equal) */
    int64_t bytes;             /* copy */
    bool has_coord;            /* a kernel of a rank-dependent op computes for coordinate
                                  `coord` on its mesh axis (a microbatch), not the rank's own */
    int coord;
    uint8_t work;              /* ptc_work; STEP: mb and vstage mean nothing */
    int16_t mb;                /* the microbatch it works on */
    int16_t vstage;            /* the virtual pipeline stage (model chunk x stages + stage) */
    bool recompute;            /* a forward op run again in the backward (activation recompute) */
    int kernel;                /* fused: its kernel in the plan's table */
    ptc_loc loc;               /* where in the model it came from */
} ptc_instr;

typedef struct ptc_program {
    int *ranks; /* the ranks that run it, ascending */
    int nranks;
    ptc_buffer *bufs;
    int nbufs, capbufs;
    ptc_instr *instrs;
    int ninstrs, capinstrs;
    int64_t region_bytes[PTC_NREGIONS]; /* arena size per region */
    int loss;                           /* buffer of the scalar loss; -1 if none */
    int grad_norm;                      /* the squared global gradient norm; -1 if none */
    /* mixture-of-experts load balance after a step: per moe layer of the program, f32[3]: the
     * experts times the most choices one expert got, the choices dropped, all choices (summed
     * over the microbatches); live at the end of the step, like the loss */
    int *stats;
    int nstats;
    int *outputs; /* buffers the runtime may read after a step (gradients, for checks) */
    int noutputs;
    int *eval; /* the instructions that compute the loss alone, ascending */
    int neval;
    int stage; /* its pipeline stage (the pp coordinate of its ranks); 0 without pp */
} ptc_program;

typedef struct ptc_plan {
    ptc_arena *arena;
    const char *model;
    ptc_optim optim;
    ptc_mesh mesh; /* naxes 0: a single device */
    int nranks;
    int zero;
    bool seq_parallel;
    int64_t logical_params;
    double model_flops; /* model FLOPs of a step (PaLM's count, for MFU); 0: unknown */
    const char *notes; /* what the compiler chose and why, one line each (may be empty) */
    int microbatches;   /* the step's batch in this many, run one after the other (1: none) */
    int pp_schedule;    /* ptc_pp_schedule (schedule.h) ordering microbatches and stages */
    int virtual_stages; /* model chunks per pipeline rank (1 unless interleaved) */
    ptc_program *programs;
    int nprograms;
    int *rank_program; /* [nranks] */
    /* the generated kernels fused instructions run (kernel IR, codegen/kir.h); owned */
    struct ptc_kir **kernels;
    int nkernels;
    /* what an executable samples text with (plan/sample.c): the forward pass of one device to
     * the logits, owned; or NULL with the reason in no_sample (NULL too: not asked for) */
    struct ptc_plan *sample;
    const char *no_sample;
} ptc_plan;

/* Operands of a fused instruction: its kernel's parameters, inputs then results. */
#define PTC_MAX_FUSED_OPERANDS 65536

ptc_plan *ptc_plan_new(void);
void ptc_plan_free(ptc_plan *p);
ptc_program *ptc_plan_add_program(ptc_plan *p);
int ptc_prog_add_buffer(ptc_plan *p, ptc_program *pg, const ptc_buffer *b);
/* Appends an instruction (in/out copied into the plan's arena); returns its index. */
int ptc_prog_add_instr(ptc_plan *p, ptc_program *pg, const ptc_instr *in);
/* Adds a kernel to the plan's table (the plan owns it from then on); returns its index. */
int ptc_plan_add_kernel(ptc_plan *p, struct ptc_kir *k);

/* The window of a sampling plan (ptc_plan.sample): the sequence length of its [batch, seq] token
 * input; 0 when it has none. */
int64_t ptc_plan_sample_window(const ptc_plan *p);

/* The buffer whose bytes b uses (b itself unless it is a view). */
static inline int ptc_prog_root(const ptc_program *pg, int b)
{
    return pg->bufs[b].view >= 0 ? pg->bufs[b].view : b;
}

/* Ranks of the group `axes` that contain rank, and their count: in the order of the
 * partitioner's layout, the innermost axis's coordinate major (one axis: ascending). */
int ptc_plan_group(const ptc_mesh *m, int rank, unsigned axes, int *members);
/* The rank moved by delta on axis (wrapping), for send/recv. */
int ptc_plan_peer(const ptc_mesh *m, int rank, int axis, int delta);
/* "dp", "dp+tp": the names of the axes of a group. */
void ptc_plan_group_name(const ptc_mesh *m, unsigned axes, char *buf, size_t n);

/* The full (logical) type of a buffer: local dims times the mesh sizes it is sharded over. */
ptc_type ptc_buffer_full_type(const ptc_mesh *m, const ptc_buffer *b);
/* Element index in the full tensor of element i of the local part that the rank at coords holds
 * of a value of local type t with placements pl. Placements are applied innermost axis first (as
 * the partitioner does), so this undoes them outermost first. */
int64_t ptc_global_index(const ptc_type *t, const ptc_placement *pl, const ptc_mesh *m,
                         const int *coords, int64_t i);

/* ---- text form: printed by ptc_plan_print, read back by ptc_plan_load (what executables
 * carry). Deterministic; load(print(p)) prints the same text. ---- */
void ptc_plan_print(const ptc_plan *p, FILE *f);
/* Program k alone ("program K ranks [...]" to "end"). */
void ptc_plan_print_program(const ptc_plan *p, int k, FILE *f);
/* Returns the plan, or NULL with "line:col: message" in err. The loaded plan is verified. */
ptc_plan *ptc_plan_load(const char *text, char *err, size_t errn);

/* Verifier: operands in range, arity, sizes agree with dtypes, every read buffer written earlier
 * in the program (or live at entry), no two buffers of one region whose lifetimes overlap share a
 * byte, every buffer inside its region, instructions consistent with their buffers. Returns 0, or
 * -1 with a message naming the program, instruction or buffer. */
int ptc_plan_verify(const ptc_plan *p, char *err, size_t errn);

/* Lifetime of every buffer of a program in instruction indices: first[b] the first instruction
 * that writes b or a view of it (-1: live at entry: parameters, state, inputs), last[b] the last
 * that reads it (pg->ninstrs: live at exit: persistent buffers, gradients, outputs). A view's
 * lifetime is folded into its root's. Arrays of pg->nbufs, malloc'd by the caller. */
void ptc_prog_lifetimes(const ptc_program *pg, int *first, int *last);

/* The memory timeline of a program: live bytes of a region after each instruction (live[i], i <
 * ninstrs, malloc'd) and the peak with the instruction where it happens. */
typedef struct ptc_mem_timeline {
    int64_t *live;
    int64_t peak;
    int peak_instr;
} ptc_mem_timeline;
void ptc_prog_timeline(const ptc_program *pg, int region, ptc_mem_timeline *t);

#endif
