/* partition.h - SPMD partitioning of a step graph over a device mesh (internal to passes/).
 *
 * The partitioner rewrites the logical graph one mesh axis at a time, innermost axis first
 * (tensor parallel, then data parallel), so the data-parallel pass partitions the tensor-parallel
 * rank program. For one axis of T ranks it walks the nodes in order and, for each node:
 *   1. looks up the op's sharding rule (shard_rules.c, one table for every op kind), which reads
 *      the placements of the operands (Replicate, Shard(dim) or Partial(sum) on this axis) and
 *      decides the placement each operand must have and the placements of the results;
 *   2. inserts the redistributions the operands need (allreduce, allgather, reduce_scatter,
 *      all_to_all, a local shard slice, partialize), reusing one already made for that operand;
 *   3. emits the op with rank-local shapes and attributes (heads per rank, local reshape shapes).
 * Parameters, optimizer state and fills are emitted at their first use, with the placement that
 * use prefers (column- or row-parallel for a matmul weight, vocabulary-parallel for an embedding
 * table, Shard(0) over dp for ZeRO), or as pinned by the user.
 */
#ifndef PTC_PARTITION_H
#define PTC_PARTITION_H

#include "passes.h"

/* tensor parallel (tp), data parallel (dp), expert parallel (ep: data parallel outside the
 * experts of moe layers, whose experts it splits) */
typedef enum { PART_TENSOR, PART_DATA, PART_EXPERT } part_kind;

#define PLACE_UNDECIDED 255 /* operand placement kind: a source not emitted yet */
#define PL_UNDECIDED ((ptc_placement){.kind = PLACE_UNDECIDED})

typedef struct part part;

/* What a rule decides for one node. */
typedef struct rule_out {
    ptc_placement req[PTC_MAX_RESULTS * 2]; /* placement each operand must have */
    ptc_placement out[PTC_MAX_RESULTS];     /* placement of each result */
    enum { EMIT_PLAIN, EMIT_CUSTOM } emit;  /* custom: the rule emits the node itself */
} rule_out;

/* The rule of node ni: fills ro (req for every operand, out for every result). Returns 0, or -1
 * after reporting (a mesh that cannot divide a dimension). */
int ptc_shard_rule(part *p, int ni, const ptc_placement *in, rule_out *ro);
/* Node n of the ep pass's graph, with its operand placed x on this (dp) axis, becomes one
 * collective over ep and dp (shard_rules.c), its result placed *out. */
bool ptc_shard_merges_with_ep(const part *p, const ptc_node *n, ptc_placement x,
                              ptc_placement *out);
/* Custom emission for ops whose rank program is more than one local op (vocabulary-parallel
 * cross-entropy, reductions over a sharded axis, ...). */
int ptc_shard_emit_custom(part *p, int ni, const ptc_placement *in, rule_out *ro);

/* moe's pieces (shard_moe.c): their rules, and the emission of experts split over an ep axis. */
int ptc_shard_rule_moe(part *p, int ni, const ptc_placement *in, rule_out *ro);
int ptc_shard_emit_moe(part *p, int ni, const rule_out *ro);

/* ---- what rules may use from the walker (partition.c) ---- */
const ptc_graph *part_graph(const part *p);
part_kind part_axis_kind(const part *p);
int part_size(const part *p); /* T: ranks on this axis */
int part_axis(const part *p); /* index of the axis in the mesh */
bool part_seq_parallel(const part *p);
int part_zero(const part *p);
/* The pinned placement of a parameter on this axis, if any. */
bool part_pinned(const part *p, int old_value, ptc_placement *pl);
/* Where ZeRO shards a value of (rank-local) type t on this data-parallel axis. */
ptc_placement part_zero_placement(const part *p, const ptc_type *t);
/* The new value of old value v in placement pl (emitting a deferred source first); -1 after an
 * error. */
int part_obtain(part *p, int v, ptc_placement pl);
/* Whether old value v is at hand in placement pl without communication (its placement, or a
 * redistribution made before that the walker would reuse here). */
bool part_available(const part *p, int v, ptc_placement pl);
/* Redistributes old value v to placement pl; returns the new value id or -1 after an error. */
int part_redist(part *p, int v, ptc_placement pl);
/* Emits an op into the rank program with new-value operands; returns the first result. */
int part_emit(part *p, ptc_op op, const int *in, int nin, const ptc_attrs *at, ptc_loc loc,
              int *outs);
/* A replicated f32 scalar constant in the rank program. */
int part_const(part *p, double value, ptc_dtype dt, ptc_loc loc);
/* Sets the placement on this axis of new value nv, an intermediate of a custom emission; its
 * placements on the other axes are those of old value `like` (-1: keep those of nv's first
 * operand, which part_emit gave it). */
void part_set_place(part *p, int nv, int like, ptc_placement pl);
/* Records that old value v is now new value nv with placement pl. */
void part_bind(part *p, int v, int nv, ptc_placement pl);
/* Reports an error at a node's location (mesh cannot divide, unsupported combination). */
int part_error(part *p, int ni, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The rank program emitted so far (read-only: rules may look up what was emitted). */
const ptc_graph *part_out(const part *p);

/* Placement helpers */
static inline ptc_placement pl_r(void)
{
    return (ptc_placement){.kind = PTC_PLACE_REPLICATE};
}
static inline ptc_placement pl_s(int dim, int groups)
{
    return (ptc_placement){
        .kind = PTC_PLACE_SHARD, .dim = (int8_t)dim, .groups = (uint8_t)(groups > 1 ? groups : 0)};
}
/* Shard(dim) of a dim that the axis does not divide: rem = size % T slices on every rank. */
static inline ptc_placement pl_rem(int dim, int rem)
{
    return (ptc_placement){.kind = PTC_PLACE_SHARD, .dim = (int8_t)dim, .rem = (uint16_t)rem};
}
static inline ptc_placement pl_p(void)
{
    return (ptc_placement){.kind = PTC_PLACE_PARTIAL};
}
static inline bool pl_ragged(ptc_placement a)
{
    return a.kind == PTC_PLACE_SHARD && a.rem;
}
static inline bool pl_eq(ptc_placement a, ptc_placement b)
{
    if (a.kind != b.kind)
        return false;
    if (a.kind != PTC_PLACE_SHARD)
        return true;
    return a.dim == b.dim && (a.groups > 1 ? a.groups : 1) == (b.groups > 1 ? b.groups : 1) &&
           a.rem == b.rem;
}
static inline int pl_groups(ptc_placement a)
{
    return a.groups > 1 ? a.groups : 1;
}

#endif
