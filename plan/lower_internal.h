/* lower_internal.h - what the lowering's files share (private to plan/lower*.c).
 *
 * A program is emitted from a list of items: a graph node to run, for which microbatch (its
 * instance, -1 for work done once per step) and whether it is a recomputed copy (activation
 * recompute); or a message to send or receive (pipeline stages). A graph value therefore has a
 * buffer per (value, instance, version): its key. Lifetimes are positions in the item list, so
 * in-place and memory decisions see the order the program really runs in (microbatches one after
 * the other, or interleaved by a pipeline schedule).
 */
#ifndef PTC_LOWER_INTERNAL_H
#define PTC_LOWER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "planner.h"

/* What a node is run as. */
typedef enum {
    CLS_SOURCE, /* input, parameter, state: a buffer, no instruction */
    CLS_FREE,   /* reads only sources and free nodes: run, once a step, on every stage that
                   needs it, before its first use there */
    CLS_MB,     /* run for every microbatch, in the forward or backward task of its stage */
    CLS_POST,   /* run once, after the microbatches (gradient reductions, norm, update) */
} node_class;

typedef enum { IT_NODE, IT_SEND, IT_RECV } item_kind;

typedef struct item {
    uint8_t kind;  /* item_kind */
    uint8_t ver;   /* 1: the recomputed copy of a forward node */
    uint8_t work;  /* ptc_work */
    int16_t vstage;
    int ni;        /* graph node (IT_NODE) */
    int inst;      /* microbatch, or -1 */
    int v;         /* send/recv: the value (key (v, inst, 0)) */
    int peer;      /* send/recv: the other stage */
    int tag;       /* send/recv: the message */
    int into;      /* recv: the state value whose buffer it lands in (a tied parameter's update),
                      or -1 */
    int label_mb;  /* the microbatch shown for it (a free node: of the work that first needs it) */
} item;

typedef struct lw {
    const ptc_graph *g;
    const ptc_lower_opts *o;
    ptc_plan *p;
    ptc_program *pg;
    char *err;
    size_t errn;
    bool failed;

    /* microbatches (the graph's "mb" axis, run in time) and pipeline stages */
    int M;         /* microbatches (1: none) */
    int mb_axis;   /* its index in the graph's mesh, or -1 */
    int P, V;      /* pipeline stages (1: none) and model chunks per stage */
    bool tasks;    /* items follow a schedule of tasks (microbatches or stages); otherwise
                      graph order */
    int axis_map[PTC_MAX_MESH_AXES]; /* graph mesh axis -> plan mesh axis, -1 for mb */

    /* per node */
    uint8_t *cls;   /* node_class */
    uint8_t *phase; /* forward, backward or update */
    bool *gemm;     /* a matmul lowered to a GEMM */
    bool *mbsum;    /* an allreduce over mb: a sum over the microbatches, made in time */
    int *tout;      /* matmul -> the transpose of its result it writes directly; -2 on that
                       transpose (nothing to run); -1 */
    int *nlast;     /* value -> last node reading it (nnodes: live at exit), for the analyses */
    /* per value */
    bool *val_mb;   /* its buffer is per microbatch */
    int *fold;      /* the value a transpose folded into its GEMMs reads, or -1 */
    int *undo;      /* w when the value is transpose(transpose(w)) (a view of w), or -1 */
    int *updates;   /* the state the value becomes at the end of the step, or -1 */
    int *acc;       /* a per-microbatch gradient only an mb sum reads: that sum's value, or -1 */

    /* per key (value, instance, version) of the current program */
    int *buf;       /* buffer id, -1 none yet */
    int *last_use;  /* last item position reading it (nitems: live at exit), -1 */
    /* per buffer (of the current program) */
    int *root_last; /* last item position reading any key whose bytes the root holds */
    int *src_of;    /* the buffer a view was made from (eval dependencies), -1 */
    int capbuf;

    /* the current program's items */
    item *items;
    int nitems;
    int pos; /* the item being emitted */

    const char *last_file, *last_file_copy, *last_scope, *last_scope_copy;
} lw;

static inline size_t lw_key(const lw *L, int v, int inst, int ver)
{
    return ((size_t)v * (size_t)(L->M + 1) + (size_t)(inst + 1)) * 2 + (size_t)ver;
}

static inline size_t lw_nkeys(const lw *L)
{
    return lw_key(L, L->g->nvalues, -1, 0);
}

/* The instance under which value v is keyed when an item of instance inst touches it. */
static inline int lw_inst(const lw *L, int v, int inst)
{
    return L->val_mb[v] ? (inst < 0 ? 0 : inst) : -1;
}

/* Whether an item of version ver reading value v reads the recomputed copy. */
bool lw_reads_recomputed(const lw *L, const item *it, int v);

/* The key an item reads value v under. */
static inline size_t lw_read_key(const lw *L, const item *it, int v)
{
    return lw_key(L, v, lw_inst(L, v, it->inst), lw_reads_recomputed(L, it, v));
}

/* The key an item's result v gets. */
static inline size_t lw_out_key(const lw *L, const item *it, int v)
{
    return lw_key(L, v, lw_inst(L, v, it->inst), it->ver);
}

static inline int64_t lw_batch_of(const ptc_type *t)
{
    int64_t b = 1;
    for (int i = 0; i + 2 < t->rank; i++)
        b *= t->dims[i];
    return b;
}

/* lower_emit.c */
void lw_emit_item(lw *L, const item *it);
void lw_fail(lw *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The buffer of value v as item it reads it (made on first use for a microbatch's slice of an
 * input). */
int lw_operand(lw *L, const item *it, int v);
int lw_new_buffer(lw *L, const ptc_type *t, const ptc_placement *gplace, int kind);
int lw_key_buffer(lw *L, size_t k, int v, int kind);
void lw_emit_copy(lw *L, const item *it, int from, int to);

#endif
