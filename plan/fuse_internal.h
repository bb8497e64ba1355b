/* fuse_internal.h - what the fusion pass's files share (fuse.c, the pass; fuse_head.c, the
 * language-model head over chunks of rows): the groups it finds, its state over one program,
 * the kernel builder, the recomputations, and the steps a group's rebuild takes. */
#ifndef PTC_FUSE_INTERNAL_H
#define PTC_FUSE_INTERNAL_H

#include "kir.h"
#include "planner.h"

#define MAX_MEMBERS 32

typedef struct group {
    int first, n;    /* instructions [first, first + n) */
    int kind;        /* G_CHAIN, G_CE, G_ADAMW, G_HEAD */
    uint64_t seed;   /* G_CE: bit m set when member m computes the gradient's seed (ce_seed);
                      * G_HEAD: the same of its cross-entropy group */
    uint64_t inner;  /* G_CE over 16-bit logits: the members the kernel replaces besides the ends
                      * (the loss, the gradient's widening, the gradient) */
    /* G_HEAD (the logits' GEMM at first, its cross-entropy group of ce_n from first + 1, the
     * head's backward GEMMs at dx and dw, the last member): rows a chunk */
    int ce_n, dx, dw;
    int64_t rows;
} group;

enum { G_CHAIN, G_CE, G_ADAMW, G_HEAD };

typedef struct fz {
    ptc_plan *p;
    ptc_program *pg;        /* its buffers, and the instructions being rebuilt */
    const ptc_instr *old;   /* the instructions before fusion */
    int nold;
    int *last_read; /* root -> last instruction reading it (any view); ninstrs: live at exit */
    bool *keep;     /* root -> observable after the program (param, state, loss, outputs) */
    int head_chunks; /* ptc_lower_opts.head_chunks */
    struct khashes {
        uint64_t *h; /* ptc_kir_hash of the plan's kernels [0, n): each printed once */
        int n, cap;
    } *kh;
} fz;

#define CE_SPAN 64 /* the most instructions from a cross-entropy to its gradient */

static inline bool is_f32(const fz *z, int b)
{
    return z->pg->bufs[b].type.dtype == PTC_F32;
}

static inline int64_t numel(const fz *z, int b)
{
    return ptc_type_numel(&z->pg->bufs[b].type);
}

static inline int64_t last_dim(const fz *z, int b)
{
    const ptc_type *t = &z->pg->bufs[b].type;
    return t->rank ? t->dims[t->rank - 1] : 1;
}

static inline int root(const fz *z, int b)
{
    return ptc_prog_root(z->pg, b);
}

static inline const ptc_instr *ins(const fz *z, int i)
{
    return &z->old[i];
}

/* a buffer, or a view at a fixed place in its root (not one placed by a mesh coordinate) */
static inline bool unsharded(const fz *z, int b)
{
    return z->pg->bufs[b].view < 0 || z->pg->bufs[b].view_axis < 0;
}

/* where b starts in its root's bytes */
static inline int64_t start(const fz *z, int b)
{
    return z->pg->bufs[b].view < 0 ? 0 : z->pg->bufs[b].view_offset;
}

/* ---- building kernels ---- */

typedef struct kb {
    fz *z;
    ptc_kir *k;
    int first, n;
    int nin, *in;               /* kernel inputs (buffer ids): parameters 0..nin-1 */
    int nout, *out, *out_param; /* stored results and their parameters */
    int64_t R, C;
    int r;          /* the row index expression */
    int memo[MAX_MEMBERS];
} kb;

/* ---- recomputing activations for the backward ---- */

/* An activation y = f(h) that a fused chain stores for the backward (gelu's output for the weight
 * gradient of the next matmul) is computed again from h just before its first backward reader,
 * where h is kept anyway (for f's gradient): y then lives only through the forward, not across the
 * whole step. */
typedef struct remat {
    int y, h;  /* buffers: the stored activation, its operand */
    ptc_op op; /* f */
    int at;    /* the first backward reader (old index) */
    int y2;    /* the recomputed buffer (made while rebuilding), -1 before */
    int grad;  /* f's gradient f'(h) dy (old index), computed in the same kernel; -1: none */
} remat;

/* ---- shared by the groups' rebuilds (fuse.c) ---- */

/* A cross-entropy with its gradient at instruction i, f32 or over 16-bit logits: the group's
 * length, else 0 (seedmask, inner: see group). */
int fz_ce_at(const fz *z, int i, uint64_t *seedmask);
int fz_ce16_at(const fz *z, int i, uint64_t *seedmask, uint64_t *inner);
/* Whether instruction a writes bytes that b reads or writes, or reads bytes b writes. */
bool fz_shares_bytes(const fz *z, const ptc_instr *a, const ptc_instr *b);
/* The kernel of one pass over rows of logits (the loss per row and the gradient over the
 * logits), its mean over `rows` rows. */
ptc_kir *fz_build_ce(kb *b, int rowloss, int targets, int seed, int logits, int dlogits,
                     int64_t rows);
void fz_clear_memo(kb *b);
/* b's kernel (added to the plan's table, or an equal one reused) as an instruction like `like` */
void fz_emit_fused(fz *z, kb *b, ptc_phase phase, const ptc_instr *like);
int fz_new_temp(fz *z, const ptc_type *t, int region);
/* the mean of a cross-entropy's row losses into its loss (the instruction it came from) */
void fz_emit_mean(fz *z, const ptc_instr *ce, int rowloss);
void fz_emit_remat(fz *z, remat *r, const ptc_instr *like, int kernel_no);
void fz_add_rewritten(fz *z, const ptc_instr *old, const remat *rs, int nr);
bool fz_merged_grad(const remat *rs, int nr, int i);

/* ---- the language-model head over chunks of rows (fuse_head.c) ---- */

/* A head at instruction i (its logits' GEMM) to run in chunks: the group's length, else 0. */
int fz_head_at(const fz *z, int i, group *out);
/* Whether a recomputation touches head group g (its GEMMs would read what the rebuild renames). */
bool fz_head_remat(const fz *z, const group *g, const remat *rs, int nr);
/* The rebuild of head group g appended to the program; its eval-entry instructions noted in
 * new_eval. */
void fz_emit_head(fz *z, const group *g, const ptc_instr *old, const bool *in_eval,
                  int *new_eval, int *neval, remat *rs, int nr);

#endif
