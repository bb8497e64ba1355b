/* fuse_head.c - the fusion pass's language-model head over chunks of rows (--head-chunks; the
 * pass itself: fuse.c). */
#include <stdlib.h>
#include <string.h>

#include "fuse_internal.h"

/* ---- the language-model head over chunks of rows ----
 *
 * A language model's head: the logits L = X op(W) (a GEMM), cross-entropy with its gradient over
 * them (a G_CE group), and the two GEMMs that read the gradient: dX = dL op(W) and the weight's
 * dW = dL^T X (or X^T dL). Row r of L depends on row r of X alone, row r of dX on row r of dL
 * alone, and dW is a sum over the rows, so the four run a chunk of rows at a time: a chunk's
 * logits are made, turned into their gradient and consumed before the next chunk's exist, and
 * dW accumulates from the second chunk on (beta 1). So one chunk's logits are stored, not all
 * of them: on gpt2 at b=8, s=1024 those are 1.65 GB of f32. The cross-entropy's mean stays over
 * every row (each chunk's kernel divides by all of them), and the mean of the row losses runs
 * once after the chunks. What lay between the loss and the backward GEMMs (the loss scaled and
 * reduced over dp, a ZeRO-3 gather of the weight) runs before the chunks when it does not
 * depend on the loss, after them when it does; a reordering that would change what any of
 * them reads or writes is not made. */

#define HEAD_SPAN 16 /* the most instructions from the cross-entropy's gradient to the GEMMs */
#define HEAD_MAX (CE_SPAN + HEAD_SPAN + 3)

/* rows a chunk when a head's logits of R rows and `bytes` bytes are split as asked (0: auto,
 * chunks of at most PTC_HEAD_CHUNK_BYTES; else that many chunks); 0: one chunk. A multiple of 8
 * rows where a chunk has more. */
static int64_t head_rows(int asked, int64_t R, int64_t bytes)
{
    int64_t n = asked > 0 ? asked : (bytes + PTC_HEAD_CHUNK_BYTES - 1) / PTC_HEAD_CHUNK_BYTES;
    if (n < 2 || R < 2)
        return 0;
    int64_t rows = (R + n - 1) / n;
    if (rows > 8)
        rows = (rows + 7) / 8 * 8;
    return rows < R ? rows : 0;
}

/* The parts of head group g's cross-entropy: the instructions of the loss and of its gradient,
 * the logits (16-bit ones where the group widened them), the targets, the loss, the gradient's
 * seed and the logits' gradient (over 16-bit logits: the rounded one). */
typedef struct head_parts {
    int ce, gr;
    int L, T, loss, seed, dL;
} head_parts;

static head_parts head_of(const fz *z, const group *g)
{
    bool b16 = g->inner != 0;
    head_parts h = {.ce = g->first + 1 + b16, .gr = g->first + g->ce_n - b16};
    const ptc_instr *ce = ins(z, h.ce);
    h.L = b16 ? ins(z, g->first + 1)->in[0] : ce->in[0];
    h.T = ce->in[1];
    h.loss = ce->out[0];
    h.seed = ins(z, h.gr)->in[2];
    h.dL = ins(z, g->first + g->ce_n)->out[0];
    return h;
}

/* Where member m of head group g goes when the group is rebuilt: 0 the gradient's seed (first),
 * 1 what does not depend on the loss, 2 the chunks' instructions (the GEMMs and what the
 * cross-entropy kernel replaces), 3 what depends on the loss (after the chunks and the mean). */
static int head_rank(const fz *z, const group *g, int m, const int *rank_before)
{
    int q = m - g->first - 1;
    if (m == g->first || m == g->dx || m == g->dw ||
        (q >= 0 && q < g->ce_n && (q == 0 || q == g->ce_n - 1 || (g->inner >> q & 1))))
        return 2;
    if (q > 0 && q < g->ce_n && (g->seed >> q & 1))
        return 0;
    /* depends on the loss: reads it or what an earlier such member wrote */
    const ptc_instr *in = ins(z, m);
    int loss = root(z, head_of(z, g).loss);
    for (int k = 0; k < in->nin; k++) {
        int r = root(z, in->in[k]);
        if (r == loss)
            return 3;
        for (int x = g->first; x < m; x++)
            if (rank_before[x - g->first] == 3)
                for (int o = 0; o < ins(z, x)->nout; o++)
                    if (root(z, ins(z, x)->out[o]) == r)
                        return 3;
    }
    return 1;
}

static void head_ranks(const fz *z, const group *g, int *rank)
{
    for (int m = g->first; m < g->first + g->n; m++)
        rank[m - g->first] = head_rank(z, g, m, rank);
}

/* Whether a backward GEMM is the head's dX = dL op(W): the gradient's rows as its rows. */
static bool head_dx(const fz *z, const ptc_gemm *g, const ptc_instr *in, int dL, int64_t R,
                    int64_t V)
{
    return !g->ta && g->batch == 1 && g->m == R && g->k == V && root(z, in->in[0]) == root(z, dL) &&
           start(z, in->in[0]) == 0 && root(z, in->in[1]) != root(z, dL) &&
           unsharded(z, in->out[0]) && unsharded(z, in->in[1]);
}

/* Whether a backward GEMM is the head's dW, a sum over the rows of the gradient and of the
 * other operand (both stored as rows along k): that other operand's index, else -1. A 16-bit
 * result must have beta 0 (it is summed in f32 and rounded after the chunks). */
static int head_dw_other(const fz *z, const ptc_gemm *g, const ptc_instr *in, int dL, int64_t R)
{
    if (g->batch != 1 || g->k != R || (g->cd != PTC_F32 && g->beta != 0))
        return -1;
    int o = g->ta && !g->tb && root(z, in->in[0]) == root(z, dL) && start(z, in->in[0]) == 0 ? 1
            : g->ta && !g->tb && root(z, in->in[1]) == root(z, dL) && start(z, in->in[1]) == 0
                ? 0
                : -1;
    return o >= 0 && root(z, in->in[o]) != root(z, dL) && unsharded(z, in->in[o]) ? o : -1;
}

/* A head at instruction i (its logits' GEMM) to run in chunks: the group's length, else 0. */
int fz_head_at(const fz *z, int i, group *out)
{
    if (z->head_chunks == 1 || i + 1 >= z->nold || ins(z, i)->kind != PTC_INSTR_GEMM)
        return 0;
    uint64_t seed = 0, inner = 0;
    int len = fz_ce_at(z, i + 1, &seed);
    if (!len && !(len = fz_ce16_at(z, i + 1, &seed, &inner)))
        return 0;
    group g = {.first = i, .kind = G_HEAD, .seed = seed, .inner = inner, .ce_n = len,
               .dx = -1, .dw = -1};
    head_parts h = head_of(z, &g);
    const ptc_instr *fw = ins(z, i), *ce = ins(z, h.ce), *gr = ins(z, h.gr);
    int L = h.L, T = h.T, dL = h.dL;
    int64_t V = last_dim(z, L), R = numel(z, L) / V;
    const ptc_gemm *f = &fw->gemm;
    int64_t rows = head_rows(z->head_chunks, R, z->pg->bufs[L].bytes);
    if (!rows || f->ta || f->batch != 1 || f->m != R || f->n != V || f->beta != 0 ||
        f->cd != z->pg->bufs[L].type.dtype || root(z, fw->out[0]) != root(z, L) ||
        start(z, fw->out[0]) ||
        start(z, L) || !unsharded(z, fw->in[0]) || !unsharded(z, T) || numel(z, T) % R ||
        fw->work != ce->work || fw->mb != ce->mb || fw->vstage != ce->vstage ||
        fw->recompute != ce->recompute || fw->has_coord || z->keep[root(z, dL)])
        return 0;
    /* the two GEMMs after the gradient that read it, next to each other, its last readers */
    int j = i + len + 1;
    while (j < z->nold && j - (i + len) <= HEAD_SPAN) {
        bool reads = false;
        for (int k = 0; k < ins(z, j)->nin; k++)
            reads |= root(z, ins(z, j)->in[k]) == root(z, dL);
        if (reads)
            break;
        j++;
    }
    if (j + 1 >= z->nold || j - (i + len) > HEAD_SPAN || z->last_read[root(z, dL)] != j + 1)
        return 0;
    g.n = j + 2 - i;
    g.rows = rows;
    for (int m = j; m <= j + 1; m++) {
        const ptc_instr *x = ins(z, m);
        if (x->kind != PTC_INSTR_GEMM || x->work != ce->work || x->mb != ce->mb ||
            x->vstage != ce->vstage || x->recompute != ce->recompute || x->has_coord)
            return 0;
        if (g.dx < 0 && head_dx(z, &x->gemm, x, dL, R, V))
            g.dx = m;
        else if (g.dw < 0 && head_dw_other(z, &x->gemm, x, dL, R) >= 0)
            g.dw = m;
        else
            return 0;
    }
    /* what the chunks write is read by none of them */
    const ptc_instr *dx = ins(z, g.dx), *dw = ins(z, g.dw);
    int wrote[2] = {root(z, dx->out[0]), root(z, dw->out[0])};
    int read[6] = {fw->in[0], fw->in[1], T, gr->in[2], dx->in[1],
                   dw->in[head_dw_other(z, &dw->gemm, dw, dL, R)]};
    if (wrote[0] == wrote[1])
        return 0;
    for (int q = 0; q < 6; q++)
        if (root(z, read[q]) == wrote[0] || root(z, read[q]) == wrote[1])
            return 0;
    /* what moves past another shares no bytes with it; nothing else touches the logits, the
     * gradient or the targets */
    int rank[HEAD_MAX];
    if (g.n > HEAD_MAX)
        return 0;
    head_ranks(z, &g, rank);
    for (int a = 0; a < g.n; a++) {
        const ptc_instr *x = ins(z, i + a);
        if (rank[a] == 1 || rank[a] == 3)
            for (int k = 0; k < x->nin + x->nout; k++) {
                int r = root(z, k < x->nin ? x->in[k] : x->out[k - x->nin]);
                if (r == root(z, L) || r == root(z, dL) || r == root(z, T))
                    return 0;
            }
        for (int b = a + 1; b < g.n; b++)
            if (rank[a] > rank[b] && fz_shares_bytes(z, x, ins(z, i + b)))
                return 0;
    }
    *out = g;
    return g.n;
}

/* rows [r0, r0 + rc) of buffer b, rows of `width` elements: a view of its root */
static int row_view(fz *z, int b, int64_t r0, int64_t rc, int64_t width)
{
    const ptc_buffer *s = &z->pg->bufs[b];
    ptc_buffer v;
    memset(&v, 0, sizeof v);
    v.type.dtype = s->type.dtype;
    v.type.rank = width > 1 ? 2 : 1;
    v.type.dims[0] = rc;
    v.type.dims[1] = width > 1 ? width : 0;
    for (int a = 0; a < PTC_MAX_MESH_AXES; a++)
        if (s->place[a].kind != PTC_PLACE_SHARD || s->place[a].dim < v.type.rank)
            v.place[a] = s->place[a];
    v.kind = PTC_BUF_TEMP;
    v.view = root(z, b);
    v.region = z->pg->bufs[v.view].region;
    v.view_axis = -1;
    int64_t es = ptc_dtype_size(s->type.dtype);
    v.view_offset = start(z, b) + r0 * width * es;
    v.bytes = rc * width * es;
    return ptc_prog_add_buffer(z->p, z->pg, &v);
}

/* an extra member of a head group as the rebuild emits any instruction (recomputations first) */
static void emit_member(fz *z, const ptc_instr *old, int m, remat *rs, int nr)
{
    for (int q = 0; q < nr; q++)
        if (rs[q].at == m)
            fz_emit_remat(z, &rs[q], &old[m], z->p->nkernels);
    if (!fz_merged_grad(rs, nr, m))
        fz_add_rewritten(z, &old[m], rs, nr);
}

/* Whether a recomputation touches head group g: its GEMMs would read what the rebuild renames. */
bool fz_head_remat(const fz *z, const group *g, const remat *rs, int nr)
{
    int members[3] = {g->first, g->dx, g->dw};
    for (int q = 0; q < nr; q++) {
        if ((rs[q].at >= g->first && rs[q].at < g->first + g->n) ||
            (rs[q].grad >= g->first && rs[q].grad < g->first + g->n))
            return true;
        for (int w = 0; w < 3; w++)
            for (int k = 0; k < ins(z, members[w])->nin; k++)
                if (root(z, ins(z, members[w])->in[k]) == rs[q].y)
                    return true;
    }
    return false;
}

/* The rebuild of head group g: the seed, what does not depend on the loss, the chunks, the
 * mean of the row losses, what depends on the loss. Instructions of the eval entry are noted in
 * new_eval. */
void fz_emit_head(fz *z, const group *g, const ptc_instr *old, const bool *in_eval,
                      int *new_eval, int *neval, remat *rs, int nr)
{
    ptc_program *pg = z->pg;
    int first = g->first, n = g->n;
    head_parts h = head_of(z, g);
    const ptc_instr *fw = &old[first], *ce = &old[h.ce];
    int L = h.L, T = h.T, dL = h.dL;
    int64_t V = last_dim(z, L), R = numel(z, L) / V, tw = numel(z, T) / R;
    /* a 16-bit weight gradient accumulates over the chunks in f32 and is rounded once after
     * them, as the one GEMM it replaces rounds its f32 sums once */
    const ptc_instr *dwi = &old[g->dw];
    int acc = -1;
    if (dwi->gemm.cd != PTC_F32) {
        ptc_type at = pg->bufs[dwi->out[0]].type;
        at.dtype = PTC_F32;
        acc = fz_new_temp(z, &at, PTC_REGION_ACT);
    }
    int rank[HEAD_MAX];
    head_ranks(z, g, rank);
#define NOTE_EVAL(from, cond)                                                                     \
    for (int k_ = (from); k_ < pg->ninstrs && (cond); k_++)                                       \
        new_eval[(*neval)++] = k_;
    for (int r = 0; r < 2; r++)
        for (int m = first; m < first + n; m++) {
            if (rank[m - first] != r)
                continue;
            int at = pg->ninstrs;
            if (r == 0)
                ptc_prog_add_instr(z->p, pg, &old[m]);
            else
                emit_member(z, old, m, rs, nr);
            NOTE_EVAL(at, r == 0 ? in_eval[h.ce] : in_eval[m]);
        }
    ptc_type rt = {.dtype = PTC_F32, .rank = 1};
    rt.dims[0] = R;
    int rowloss = fz_new_temp(z, &rt, PTC_REGION_ACT);
    for (int64_t r0 = 0; r0 < R; r0 += g->rows) {
        int64_t rc = R - r0 < g->rows ? R - r0 : g->rows;
        ptc_type lt = {.dtype = pg->bufs[L].type.dtype, .rank = 2};
        lt.dims[0] = rc;
        lt.dims[1] = V;
        int Lc = fz_new_temp(z, &lt, pg->bufs[root(z, L)].region);
        int dLc = row_view(z, Lc, 0, rc, V);
        /* the chunk's logits */
        int at = pg->ninstrs, ops[3], res[1];
        ptc_instr x = *fw;
        ops[0] = row_view(z, fw->in[0], r0, rc, fw->gemm.k);
        ops[1] = fw->in[1];
        res[0] = Lc;
        x.in = ops;
        x.out = res;
        x.gemm.m = rc;
        ptc_prog_add_instr(z->p, pg, &x);
        NOTE_EVAL(at, in_eval[first]);
        /* their loss and gradient */
        at = pg->ninstrs;
        char name[64];
        snprintf(name, sizeof name, "f%d_cross_entropy_with_grad", z->p->nkernels);
        kb b = {.z = z, .first = first + 1, .n = g->ce_n};
        b.in = ptc_xmalloc(sizeof(int) * 8);
        b.out = ptc_xmalloc(sizeof(int) * 8);
        b.out_param = ptc_xmalloc(sizeof(int) * 8);
        fz_clear_memo(&b);
        b.k = ptc_kir_new(name);
        fz_build_ce(&b, row_view(z, rowloss, r0, rc, 1), row_view(z, T, r0, rc, tw), h.seed, Lc,
                 dLc, R);
        fz_emit_fused(z, &b, (ptc_phase)ce->phase, ce);
        free(b.in);
        free(b.out);
        free(b.out_param);
        NOTE_EVAL(at, in_eval[h.ce]);
        /* the backward GEMMs over the chunk, in their order */
        for (int w = 0; w < 2; w++) {
            int m = w == 0 ? (g->dx < g->dw ? g->dx : g->dw) : (g->dx < g->dw ? g->dw : g->dx);
            const ptc_instr *o = &old[m];
            x = *o;
            x.in = ops;
            x.out = res;
            if (m == g->dx) {
                res[0] = row_view(z, o->out[0], r0, rc, o->gemm.n);
                ops[0] = dLc;
                ops[1] = o->in[1];
                ops[2] = res[0];
                x.gemm.m = rc;
            } else {
                int other = head_dw_other(z, &o->gemm, o, dL, R);
                res[0] = acc >= 0 ? acc : o->out[0];
                x.gemm.cd = acc >= 0 ? PTC_F32 : o->gemm.cd;
                ops[other] = row_view(z, o->in[other], r0, rc,
                                      other == 0 ? o->gemm.m : o->gemm.n);
                ops[1 - other] = dLc;
                ops[2] = res[0];
                x.gemm.k = rc;
                if (r0 > 0) {
                    x.gemm.beta = 1;
                    x.nin = 3;
                }
            }
            at = pg->ninstrs;
            ptc_prog_add_instr(z->p, pg, &x);
            NOTE_EVAL(at, in_eval[m]);
        }
    }
    int at = pg->ninstrs;
    if (acc >= 0) {
        ptc_instr c = *dwi;
        int res = dwi->out[0];
        c.kind = PTC_INSTR_KERNEL;
        c.op = PTC_OP_CAST;
        c.attrs = ptc_attrs_default(PTC_OP_CAST);
        c.attrs.dtype = pg->bufs[res].type.dtype;
        memset(&c.gemm, 0, sizeof c.gemm);
        c.nin = c.nout = 1;
        c.in = &acc;
        c.out = &res;
        ptc_prog_add_instr(z->p, pg, &c);
        NOTE_EVAL(at, in_eval[g->dw]);
    }
    at = pg->ninstrs;
    fz_emit_mean(z, ce, rowloss);
    NOTE_EVAL(at, in_eval[h.ce]);
    for (int m = first; m < first + n; m++)
        if (rank[m - first] == 3) {
            at = pg->ninstrs;
            emit_member(z, old, m, rs, nr);
            NOTE_EVAL(at, in_eval[m]);
        }
#undef NOTE_EVAL
    const char *was = z->p->notes ? z->p->notes : "";
    char note[256], tail[48] = "";
    int64_t es = ptc_dtype_size(pg->bufs[L].type.dtype);
    if (R % g->rows)
        snprintf(tail, sizeof tail, " (the last %lld)", (long long)(R % g->rows));
    snprintf(note, sizeof note,
             "head: the logits [%lld, %lld] (%.1f MiB) in %lld chunks of %lld row%s%s, %.1f MiB "
             "a chunk (--head-chunks)",
             (long long)R, (long long)V, (double)(R * V * es) / (1 << 20),
             (long long)((R + g->rows - 1) / g->rows), (long long)g->rows, g->rows > 1 ? "s" : "",
             tail, (double)(g->rows * V * es) / (1 << 20));
    if (!strstr(was, note))
        z->p->notes = ptc_arena_printf(z->p->arena, "%s%s%s", was, *was ? "\n" : "", note);
}
