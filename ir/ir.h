/* ir.h - the logical IR of ptc: typed values with static shapes, nodes from the one op table
 * (ops.def), and the graph that owns them.
 *
 * A graph is a list of nodes in a valid execution order (every operand is defined before use).
 * Values and nodes are addressed by dense integer ids so that passes can keep side tables in plain
 * arrays and the text form (%12) maps one-to-one onto the data. Every value carries room for what
 * the parallel passes annotate later (a placement per mesh axis, a pipeline stage, a recompute
 * mark); the single-device front end leaves them at their defaults and the printer omits defaults.
 */
#ifndef PTC_IR_H
#define PTC_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

#define PTC_MAX_RANK 8
#define PTC_MAX_MESH_AXES 4

typedef enum { PTC_F32, PTC_BF16, PTC_F16, PTC_I32, PTC_NDTYPES } ptc_dtype;

const char *ptc_dtype_name(ptc_dtype t);
int ptc_dtype_size(ptc_dtype t);
/* Returns 0 and sets *out when name is a dtype keyword (f32 bf16 f16 i32). */
int ptc_dtype_parse(const char *name, ptc_dtype *out);

typedef struct ptc_type {
    ptc_dtype dtype;
    int rank; /* 0 = scalar */
    int64_t dims[PTC_MAX_RANK];
} ptc_type;

int64_t ptc_type_numel(const ptc_type *t);
bool ptc_type_eq(const ptc_type *a, const ptc_type *b);
/* Writes "f32[8,1024,768]" into buf (always NUL-terminated); returns buf. */
char *ptc_type_str(const ptc_type *t, char *buf, size_t n);

/* Source location: where a node came from in a .ptm file (line, col from 1; 0 = unknown). */
typedef struct ptc_loc {
    const char *file;
    int line, col;
    const char *scope; /* block instance path, e.g. "h.3.attn" (NULL = the model body) */
} ptc_loc;

/* ---- the op table ---- */
/* Attribute bits, from the attribute table (attrs.def). */
enum {
#define ATTR(id, name, kind, field) PTC_A_BIT_##id,
#include "attrs.def"
#undef ATTR
    PTC_A_COUNT
};
enum {
#define ATTR(id, name, kind, field) PTC_A_##id = 1 << PTC_A_BIT_##id,
#include "attrs.def"
#undef ATTR
};

enum {
    PTC_F_LANG = 1 << 0,    /* callable by name from .ptm */
    PTC_F_UNARY = 1 << 1,   /* elementwise, one operand, same type out */
    PTC_F_BINARY = 1 << 2,  /* elementwise, two operands, broadcast */
    PTC_F_SOURCE = 1 << 3,  /* no operands: input, param, const */
    PTC_F_COMM = 1 << 4,    /* a collective over the ranks of one mesh axis */
    PTC_F_RANKDEP = 1 << 5, /* local compute whose result depends on the rank's mesh coordinate */
    PTC_F_SPMD = 1 << 6, /* other ops that only SPMD programs contain (run by the SPMD runtime) */
    PTC_F_FWD = 1 << 7,  /* an internal op of a forward graph that autodiff differentiates: the
                            pieces a pass expands a language op into (moe) */
};

typedef enum {
#define OP(id, ...) PTC_OP_##id,
#include "ops.def"
#undef OP
    PTC_NOPS
} ptc_op;

typedef enum {
    PTC_INIT_ZEROS,
    PTC_INIT_ONES,
    PTC_INIT_CONSTANT,
    PTC_INIT_NORMAL,
    PTC_INIT_UNIFORM
} ptc_init_kind;

/* The activation of moe's experts (attrs.act). swiglu: silu of the first half of the hidden
 * columns times the second half (Mixtral). */
typedef enum { PTC_ACT_GELU, PTC_ACT_RELU, PTC_ACT_SILU, PTC_ACT_SWIGLU, PTC_NACTS } ptc_act;
const char *ptc_act_name(int act);
/* Returns 0 and sets *out when name is an activation name. */
int ptc_act_parse(const char *name, ptc_act *out);

typedef struct ptc_init {
    ptc_init_kind kind;
    double a, b; /* normal: std; uniform: lo, hi; constant: value */
} ptc_init;

/* Attributes of a node. Which fields mean something is given by the op's KW mask in ops.def. */
typedef struct ptc_attrs {
    int64_t axis; /* normalised to 0..rank-1 of the operand once built */
    int64_t n, start, len, heads, kv_heads;
    double eps, base, value;
    double beta1, beta2, wd, momentum; /* optimizer updates */
    int mesh_axis, reduce, to, group;
    int mesh_axis2; /* a collective's second mesh axis, -1 = none */
    int64_t top_k;
    double capacity;
    bool normalize;
    ptc_act act;
    bool causal;
    ptc_dtype dtype;
    int nshape; /* reshape dims or permute axes */
    int64_t shape[PTC_MAX_RANK];
    ptc_init init;
    const char *name; /* input / param full name (arena-owned) */
} ptc_attrs;

typedef struct ptc_op_info {
    const char *name;
    int nin, nout;
    unsigned langpos, kw, req, flags;
    ptc_attrs defaults;
} ptc_op_info;

extern const ptc_op_info ptc_ops[PTC_NOPS];
const char *ptc_attr_name(unsigned bit);
/* The bit of the attribute named name, or 0. */
unsigned ptc_attr_lookup(const char *name);
/* How an attribute's value is stored (the KIND column of attrs.def). */
typedef enum {
    PTC_AK_INT64,
    PTC_AK_DOUBLE,
    PTC_AK_INT,
    PTC_AK_BOOL,
    PTC_AK_REDUCE,
    PTC_AK_DTYPE,
    PTC_AK_LIST,
    PTC_AK_STRING,
    PTC_AK_INIT,
    PTC_AK_ACT
} ptc_attr_kind;
ptc_attr_kind ptc_attr_kind_of(unsigned bit);
/* The field of attrs that holds attribute bit. */
void *ptc_attr_field(ptc_attrs *attrs, unsigned bit);
/* Looks an op up by its name; returns PTC_NOPS if there is none. */
ptc_op ptc_op_lookup(const char *name);

/* ---- placements (filled by the SPMD partitioner; Replicate everywhere by default) ---- */
typedef enum { PTC_PLACE_REPLICATE, PTC_PLACE_SHARD, PTC_PLACE_PARTIAL } ptc_place_kind;
typedef struct ptc_placement {
    uint8_t kind;   /* ptc_place_kind */
    int8_t dim;     /* for SHARD */
    uint8_t groups; /* for SHARD: the dim is [groups, size/groups] and each group is split (a
                       strided shard, e.g. a fused qkv weight giving every rank whole heads of q,
                       k and v); 0 or 1 = a plain contiguous shard */
    uint16_t rem;   /* for SHARD: a dim of size n that the axis's T ranks do not divide. Rank c
                       holds its part [c*q, (c+1)*q) of the first T*q = n - rem slices, q = n / T,
                       then the last rem slices whole (every rank the same), so a local dim is
                       q + rem: the ZeRO shard of a dim that does not divide, where every local
                       element is an element of the full tensor (no padding); 0 = divides */
} ptc_placement;

/* The device mesh: named axes with sizes. Ranks number the mesh row-major (the last axis fastest),
 * so with dp=2,tp=4 rank 5 is dp 1, tp 1. Axes are partitioned innermost first. */
#define PTC_MAX_AXIS_NAME 8
typedef struct ptc_mesh {
    int naxes;
    char names[PTC_MAX_MESH_AXES][PTC_MAX_AXIS_NAME];
    int sizes[PTC_MAX_MESH_AXES];
} ptc_mesh;
int ptc_mesh_nranks(const ptc_mesh *m);
/* Coordinate of rank on every axis. */
void ptc_mesh_coords(const ptc_mesh *m, int rank, int *coords);
/* The ranks of rank's group on axis (in coordinate order); returns the group size. */
int ptc_mesh_group(const ptc_mesh *m, int rank, int axis, int *members);

typedef struct ptc_value {
    ptc_type type;
    int def;   /* defining node id */
    int index; /* which result of that node */
    ptc_placement place[PTC_MAX_MESH_AXES];
} ptc_value;

typedef struct ptc_node {
    ptc_op op;
    int nin, nout;
    int *in;  /* value ids */
    int *out; /* value ids */
    ptc_attrs attrs;
    ptc_loc loc;
    int stage;      /* pipeline stage, 0 unless cut */
    bool recompute; /* rebuild in backward instead of keeping */
} ptc_node;

/* The model's `optimizer` line (adamw with its defaults when absent). */
typedef enum { PTC_OPTIM_ADAMW, PTC_OPTIM_SGD } ptc_optim_kind;
typedef struct ptc_optim {
    ptc_optim_kind kind;
    double lr, beta1, beta2, eps, weight_decay, momentum;
} ptc_optim;
ptc_optim ptc_optim_default(ptc_optim_kind kind);
/* Sets the setting named key (lr, beta1, beta2, eps, weight_decay, momentum) of o to v, after
 * checking that o's kind has that setting and that v is in its range: lr > 0; beta1, beta2 and
 * momentum in [0, 1); eps and weight_decay >= 0; always finite. Returns the setting's index (0..5,
 * distinct per key), or -1 with a message that names key (and no source location). The model's
 * optimizer line and `ptc --optim` both go through it, so they accept the same values. */
int ptc_optim_set(ptc_optim *o, const char *key, double v, char *err, size_t errn);
/* The index ptc_optim_set gives key for optimizers of this kind, or -1 with its message. */
int ptc_optim_key(ptc_optim_kind kind, const char *key, char *err, size_t errn);

/* Names of the scalar inputs that the optimizer pass adds to a training step. */
#define PTC_IN_LR "opt.lr"
#define PTC_IN_STEP "opt.step"
#define PTC_IN_MAX_NORM "opt.max_norm"
/* fp16 loss scaling (--precision fp16): the loss's gradient is seeded with this input instead of 1,
 * and the optimizer pass divides it out of the gradients' norm and updates */
#define PTC_IN_LOSS_SCALE "opt.loss_scale"
/* The fp32 master weight of a 16-bit parameter NAME (--precision) is the optimizer state
 * PTC_MASTER_PREFIX NAME, initialised as NAME is. */
#define PTC_MASTER_PREFIX "optim.master."

typedef struct ptc_graph {
    ptc_arena *arena;
    char *name;
    ptc_optim optim;
    ptc_mesh mesh; /* naxes 0 for a logical (single-device) graph */
    ptc_node *nodes;
    int nnodes, capnodes;
    ptc_value *values;
    int nvalues, capvalues;
    int loss; /* value id of the scalar loss, -1 if not set */
    /* graph outputs besides the loss (autodiff: gradients, optimizer: updated state) */
    int *outputs;
    int noutputs, capoutputs;
    /* state updates of a training step: after a step, value updates[i].to is stored into the
     * parameter or state updates[i].state (the optimizer pass adds them) */
    struct ptc_update {
        int state, to;
    } * updates;
    int nupdates, capupdates;
    const char *last_scope; /* builder: the last interned scope string */
    /* ceiling on nodes, so a pathological model fails cleanly instead of eating memory */
    int max_nodes;
} ptc_graph;

ptc_graph *ptc_graph_new(const char *name);
void ptc_graph_free(ptc_graph *g);

/* Builder. Adds a node for op with the given operands and attributes, runs shape inference and
 * returns 0 with the result value ids in out[] (at most PTC_MAX_RESULTS of them), or -1 with a
 * message in err (both shapes of a mismatch are named). The attrs are copied. */
#define PTC_MAX_RESULTS 64
int ptc_build(ptc_graph *g, ptc_op op, const int *in, int nin, const ptc_attrs *attrs, ptc_loc loc,
              int *out, char *err, size_t errn);
/* Convenience for single-result ops; returns the value id, or -1 with err set. */
int ptc_build1(ptc_graph *g, ptc_op op, const int *in, int nin, const ptc_attrs *attrs, ptc_loc loc,
               char *err, size_t errn);
void ptc_graph_add_output(ptc_graph *g, int value);
void ptc_graph_add_update(ptc_graph *g, int state, int to);

/* Default attributes of op (from ops.def). */
ptc_attrs ptc_attrs_default(ptc_op op);

/* Shape inference: computes the result types of op applied to operand types in[], normalising
 * axes in *attrs. Returns the number of results, or -1 with a message in err. */
int ptc_infer(ptc_op op, const ptc_type *in, int nin, ptc_attrs *attrs, ptc_type *out, char *err,
              size_t errn);

/* Whether kernels of op, over bf16 or f16 operands, read and write that 2-byte storage
 * themselves (widening as they load, computing in f32, rounding results as they store): the
 * attention ops, concat, sum_to, sumsq, layernorm_grad and rmsnorm_grad, into which the fusion
 * pass folds the casts a 16-bit plan puts around them (runtime/kernels/kernel.h). Every other
 * op's kernels compute on f32 copies that casts make. */
bool ptc_op_storage16(ptc_op op);

/* Whether op is moe or one of its internal pieces (moe.c): what ptc_infer_moe and the reference
 * kernels of ref_moe.c handle. */
bool ptc_op_is_moe(ptc_op op);
/* Shape inference of moe and its internal pieces (moe.c; ptc_infer calls it). */
int ptc_infer_moe(ptc_op op, const ptc_type *in, int nin, ptc_attrs *at, ptc_type *out, char *err,
                  size_t errn);
/* The capacity of an expert of moe: ceil(c * top_k * tokens / experts), computed exactly on the
 * decimal number c is written as (c = 1.1, top_k = 2, 100 tokens, 4 experts: 55), at most tokens
 * (an expert takes at most one choice per token); c = 0 (drop nothing) gives tokens. */
int64_t ptc_moe_capacity(double c, int64_t tokens, int64_t top_k, int64_t experts);
/* Whether capacity c can drop choices for any number of tokens (false: the capacity is always
 * tokens), and then c's shortest decimal, c = digits x 10^e10, which ptc_moe_capacity computes
 * from (so that a GPU kernel can compute the same from the tokens it counts). */
bool ptc_moe_capacity_decimal(double c, int64_t top_k, int64_t experts, uint64_t *digits,
                              int *e10);

/* The load-balance outputs of moe layers (the moe_stats of each layer, summed over the
 * microbatches, that the moe_ep pass adds as outputs of a training step): their count, and the
 * first cap of them in vals (NULL to count). */
int ptc_graph_moe_stats(const ptc_graph *g, int *vals, int cap);

/* Verifier: operands defined before use, arity, types agree with shape inference, loss scalar.
 * Returns 0, or -1 with a message naming the node in err. */
int ptc_verify(const ptc_graph *g, char *err, size_t errn);

/* Text form. The printer is deterministic; ptc_parse_ir reads back exactly what it prints. */
void ptc_print(const ptc_graph *g, FILE *f);
/* Returns the graph, or NULL with a "line:col: message" in err. */
ptc_graph *ptc_parse_ir(const char *text, char *err, size_t errn);
/* Graphviz dot. */
void ptc_print_dot(const ptc_graph *g, FILE *f);

/* Cost of op on operands of types in[] giving results of types out[] (cost.c): floating-point
 * operations (a multiply-add is 2) and bytes read and written. Relative costs for the planned
 * timeline and stage balancing. */
double ptc_op_flops(ptc_op op, const ptc_attrs *a, const ptc_type *in, int nin,
                    const ptc_type *out, int nout);
double ptc_op_bytes(const ptc_type *in, int nin, const ptc_type *out, int nout);
/* Model FLOPs of one training step of the forward graph g (single device, before autodiff), as
 * PaLM counts them for MFU: three times the forward's matrix products (the backward makes two of
 * each) and attention's 4 b s^2 d, masked or not (PaLM's 12 L H Q T a token); recomputation and
 * elementwise work do not count. */
double ptc_graph_model_flops(const ptc_graph *g);

/* Parameters (PARAM nodes) in graph order, and their total element count (INT64_MAX when the
 * sum would be larger: the front end refuses models beyond 2^46 parameters, but a parsed plan
 * could hold 2^19 tensors of 2^46 elements). */
int ptc_graph_params(const ptc_graph *g, int *node_ids, int cap);
int64_t ptc_graph_param_count(const ptc_graph *g);

#endif
