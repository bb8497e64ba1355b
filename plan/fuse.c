/* fuse.c - the fusion pass: runs of kernel instructions of a lowered program become one
 * generated kernel (kernel IR, codegen/kir.h) each, so that a step makes fewer passes over memory
 * and keeps fewer intermediates.
 *
 * What it fuses, in program order:
 *   - elementwise chains: consecutive unary, binary (with broadcasting) and activation-gradient
 *     ops over one index space, each reading a result of the one before (bias + gelu, bias +
 *     residual), optionally ended by a consumer along the last axis: layernorm, rmsnorm, softmax,
 *     log_softmax or split (bias + residual + layernorm, qkv bias + split);
 *   - cross-entropy with its gradient: the loss per row and the logits' gradient in one pass over
 *     the logits, the gradient written over them (neither the softmax nor a separate gradient is
 *     stored), then the mean of the row losses;
 *   - the AdamW updates of consecutive parameters, with their gradient-clipping scale, as one
 *     multi-tensor kernel;
 *   - a language-model head (the logits' GEMM, cross-entropy with its gradient, the head's two
 *     gradient GEMMs) over chunks of rows, so one chunk's logits are stored (fuse_head.c).
 * Under --precision the casts the lowering puts around every 16-bit op join these groups: a
 * widening as a load of the 16-bit bytes, a narrowing as a rounding (round_bf16, round_f16), so
 * the kernels read and write 16 bits themselves (and an activation recomputed for the backward
 * is recomputed from and into 16 bits).
 * A result of a fused instruction that nothing reads after the run (and that is not a parameter,
 * optimizer state, the loss, the gradient norm or an output) is not stored: its buffer leaves the
 * program and the memory plan. Results written in place stay in place (the kernel's parameter
 * names the operand it shares bytes with).
 *
 * Assumes: a lowered program before memory planning (ptc_lower calls it when asked).
 * Guarantees: the program computes what it computed (up to float rounding: fused kernels compute
 * in f32 without storing intermediates, like the ops they replace), the eval entry runs the
 * instructions that now compute the loss, and every fused instruction matches its kernel
 * (ptc_plan_verify checks it).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kir.h"
#include "kir_ops.h"
#include "fuse_internal.h"

static bool is_kernel(const fz *z, int i, ptc_op op)
{
    return i < z->nold && ins(z, i)->kind == PTC_INSTR_KERNEL && ins(z, i)->op == op;
}

/* ---- what may join a chain ---- */

/* Instructions fuse only within one unit of pipeline work (the same phase, work, microbatch,
 * virtual stage and recompute mark: a schedule orders those units, and a fused kernel must not
 * straddle two), and never a kernel that computes for another rank's coordinate. */
static bool same_task(const ptc_instr *a, const ptc_instr *b)
{
    return a->phase == b->phase && a->work == b->work && a->mb == b->mb &&
           a->vstage == b->vstage && a->recompute == b->recompute && !a->has_coord &&
           !b->has_coord;
}

static bool pointwise(ptc_op op)
{
    return ptc_kx_op_pointwise(op);
}

static bool row_consumer(const fz *z, const ptc_instr *in)
{
    const ptc_type *t = &z->pg->bufs[in->in[0]].type;
    int64_t axis = in->attrs.axis < 0 ? in->attrs.axis + t->rank : in->attrs.axis;
    switch (in->op) {
    case PTC_OP_LAYERNORM:
    case PTC_OP_RMSNORM: return true;
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX:
    case PTC_OP_SPLIT: return t->rank > 0 && axis == t->rank - 1;
    default: return false;
    }
}

/* Operand x of type a broadcasts to output type o (NumPy, right-aligned dims equal or 1). */
static bool broadcasts(const ptc_type *a, const ptc_type *o)
{
    if (a->rank > o->rank)
        return false;
    for (int d = 1; d <= a->rank; d++) {
        int64_t x = a->dims[a->rank - d];
        if (x != 1 && x != o->dims[o->rank - d])
            return false;
    }
    return true;
}

static bool all_f32(const fz *z, const ptc_instr *in)
{
    for (int k = 0; k < in->nin; k++)
        if (!is_f32(z, in->in[k]))
            return false;
    for (int k = 0; k < in->nout; k++)
        if (!is_f32(z, in->out[k]))
            return false;
    return true;
}

/* A cast between f32 and 16-bit storage, bf16 or f16 (--precision: the lowering widens every
 * 16-bit operand of an op to f32 and rounds its result back): a widening one joins a chain as a
 * load of the 16-bit bytes, a narrowing one as a rounding, so a fused kernel reads and writes
 * 16 bits directly. */
static bool half_cast(const fz *z, const ptc_instr *in, bool widening)
{
    if (in->kind != PTC_INSTR_KERNEL || in->op != PTC_OP_CAST || in->nout != 1)
        return false;
    ptc_dtype a = z->pg->bufs[in->in[0]].type.dtype, b = z->pg->bufs[in->out[0]].type.dtype;
    bool a16 = a == PTC_BF16 || a == PTC_F16, b16 = b == PTC_BF16 || b == PTC_F16;
    return widening ? a16 && b == PTC_F32 : a == PTC_F32 && b16;
}

/* Whether instruction i reads a buffer the members [g->first, i) wrote (by id). */
static bool reads_member(const fz *z, const group *g, int i)
{
    const ptc_instr *in = ins(z, i);
    for (int m = g->first; m < i; m++)
        for (int o = 0; o < ins(z, m)->nout; o++)
            for (int k = 0; k < in->nin; k++)
                if (in->in[k] == ins(z, m)->out[o])
                    return true;
    return false;
}

static bool stored_in(const fz *z, int first, int n, int m);

/* Marks the members a consumer's passes recompute: from member m back through results that are
 * not stored. */
static void mark_recomputed(const fz *z, int first, int n, int m, bool *mark)
{
    if (m < 0 || mark[m] || stored_in(z, first, n, m))
        return;
    mark[m] = true;
    const ptc_instr *in = ins(z, first + m);
    for (int k = 0; k < in->nin; k++)
        for (int q = m - 1; q >= 0; q--)
            if (ins(z, first + q)->out[0] == in->in[k]) {
                mark_recomputed(z, first, n, q, mark);
                break;
            }
}

/* Loads of a root that a stored result overwrites in place happen in pass 1 at the element being
 * written (same index, before the store): safe. A consumer's later passes recompute the results
 * that are not stored, so none of those may read a root a stored result overwrote; and a stored
 * result may share its bytes with one input buffer only (its kernel parameter names one). */
static bool inplace_safe(const fz *z, int first, int n, bool consumer)
{
    bool recomputed[MAX_MEMBERS] = {false};
    if (consumer) {
        const ptc_instr *c = ins(z, first + n - 1);
        for (int q = n - 2; q >= 0; q--)
            if (ins(z, first + q)->out[0] == c->in[0]) {
                mark_recomputed(z, first, n, q, recomputed);
                break;
            }
    }
    for (int s = first; s < first + n; s++) {
        if (!stored_in(z, first, n, s - first))
            continue;
        int r = root(z, ins(z, s)->out[0]), sharing = -1;
        for (int j = first; j < first + n; j++)
            for (int k = 0; k < ins(z, j)->nin; k++) {
                int b = ins(z, j)->in[k];
                bool produced = false;
                for (int q = first; q < j && !produced; q++)
                    produced |= ins(z, q)->out[0] == b;
                if (produced || root(z, b) != r)
                    continue;
                if (sharing >= 0 && sharing != b)
                    return false;
                sharing = b;
                if (recomputed[j - first])
                    return false;
            }
    }
    return true;
}

/* A member computed element by element (not a row consumer) */
static bool chain_member(const fz *z, const ptc_instr *in)
{
    return pointwise(in->op) || half_cast(z, in, true) || half_cast(z, in, false);
}

/* The chain starting at i: its length (0 when it is not one of two or more). */
static int chain_at(const fz *z, int i)
{
    const ptc_instr *a = ins(z, i);
    bool cast = half_cast(z, a, true) || half_cast(z, a, false);
    if (a->kind != PTC_INSTR_KERNEL || !(cast || (pointwise(a->op) && all_f32(z, a))) ||
        a->nout != 1)
        return 0;
    const ptc_type *o = &z->pg->bufs[a->out[0]].type;
    if (o->rank == 0)
        return 0;
    group g = {.first = i, .n = 1};
    for (int k = 0; k < a->nin; k++)
        if (!broadcasts(&z->pg->bufs[a->in[k]].type, o))
            return 0;
    while (g.n < MAX_MEMBERS && i + g.n < z->nold) {
        int j = i + g.n;
        const ptc_instr *b = ins(z, j);
        if (b->kind != PTC_INSTR_KERNEL || !same_task(a, b))
            break;
        if (half_cast(z, b, true) && broadcasts(&z->pg->bufs[b->out[0]].type, o)) {
            g.n++; /* a load of 16-bit bytes for a later member (trimmed below if none reads it) */
            continue;
        }
        bool narrowing = half_cast(z, b, false);
        if ((!all_f32(z, b) && !narrowing) || !reads_member(z, &g, j))
            break;
        if (pointwise(b->op) || narrowing) {
            const ptc_type *t = &z->pg->bufs[b->out[0]].type;
            bool ok = numel(z, b->out[0]) == ptc_type_numel(o) && last_dim(z, b->out[0]) == o->dims[o->rank - 1];
            for (int k = 0; k < b->nin && ok; k++) {
                const ptc_type *x = &z->pg->bufs[b->in[k]].type;
                int64_t nx = ptc_type_numel(x);
                /* full size (the same elements), a scalar, or broadcast like the first result */
                ok = nx == ptc_type_numel(o) || nx == 1 || (broadcasts(x, o) && broadcasts(x, t));
            }
            if (!ok)
                break;
            g.n++;
            continue;
        }
        if (row_consumer(z, b) && numel(z, b->in[0]) == ptc_type_numel(o) &&
            last_dim(z, b->in[0]) == o->dims[o->rank - 1] && reads_member(z, &g, j)) {
            bool x_from_chain = false;
            for (int m = i; m < j; m++)
                x_from_chain |= ins(z, m)->out[0] == b->in[0];
            if (x_from_chain)
                g.n++;
            break;
        }
        break;
    }
    /* a widening cast at the end feeds nothing in the run */
    while (g.n >= 2 && half_cast(z, ins(z, i + g.n - 1), true))
        g.n--;
    while (g.n >= 2 && !inplace_safe(z, i, g.n, !chain_member(z, ins(z, i + g.n - 1))))
        g.n--;
    /* a row consumer's results (one, or a split's every part) each rounded to 16 bits right
     * after it, in order, and read by nothing else: the kernel stores the 16-bit results */
    const ptc_instr *c = ins(z, i + g.n - 1);
    if (g.n >= 2 && !chain_member(z, c) && i + g.n + c->nout <= z->nold) {
        bool all = true;
        for (int q = 0; q < c->nout && all; q++) {
            const ptc_instr *nx = ins(z, i + g.n + q);
            all = half_cast(z, nx, false) && same_task(a, nx) && nx->in[0] == c->out[q] &&
                  !z->keep[root(z, c->out[q])] && z->last_read[root(z, c->out[q])] == i + g.n + q;
        }
        if (all && g.n + c->nout <= MAX_MEMBERS)
            g.n += c->nout;
    }
    return g.n >= 2 ? g.n : 0;
}

/* Of the instructions strictly between a cross-entropy at i and its gradient at j, marks in
 * seed[m - i] those that compute the gradient's seed (the loss scale: constants and their
 * products). False when the seed depends on anything else, so that it cannot be computed first. */
static bool ce_seed(const fz *z, int i, int j, bool *seed)
{
    int need[CE_SPAN * 4], nneed = 0;
    memset(seed, 0, sizeof(bool) * CE_SPAN);
    need[nneed++] = ins(z, j)->in[2];
    for (int m = j - 1; m > i; m--) {
        const ptc_instr *in = ins(z, m);
        bool makes = false;
        for (int k = 0; k < in->nout; k++)
            for (int q = 0; q < nneed; q++)
                makes |= in->out[k] == need[q];
        if (!makes)
            continue;
        if (in->kind != PTC_INSTR_KERNEL || in->nout != 1 || in->has_coord ||
            nneed + in->nin > CE_SPAN * 4)
            return false;
        seed[m - i] = true;
        for (int k = 0; k < in->nin; k++)
            need[nneed++] = in->in[k];
    }
    /* every buffer the seed needs is made by a seed instruction */
    for (int q = 0; q < nneed; q++) {
        bool made = false;
        for (int m = i + 1; m < j && !made; m++)
            made = seed[m - i] && ins(z, m)->out[0] == need[q];
        if (!made)
            return false;
    }
    return true;
}

/* Whether instruction a writes bytes that b reads or writes, or reads bytes b writes. */
bool fz_shares_bytes(const fz *z, const ptc_instr *a, const ptc_instr *b)
{
    for (int k = 0; k < a->nout; k++) {
        int r = root(z, a->out[k]);
        for (int q = 0; q < b->nin; q++)
            if (root(z, b->in[q]) == r)
                return true;
        for (int q = 0; q < b->nout; q++)
            if (root(z, b->out[q]) == r)
                return true;
    }
    for (int k = 0; k < a->nin; k++)
        for (int q = 0; q < b->nout; q++)
            if (root(z, a->in[k]) == root(z, b->out[q]))
                return true;
    return false;
}

/* cross_entropy L, T -> loss; ... ; cross_entropy_grad L, T, dl -> dL with nothing between
 * touching L or T, the seed dl computable first, and nothing reading L after: the instructions
 * from the cross-entropy to its gradient, else 0. (Between them: the loss scaled and reduced over
 * dp, the seed made of constants.) */
int fz_ce_at(const fz *z, int i, uint64_t *seedmask)
{
    if (!is_kernel(z, i, PTC_OP_CROSS_ENTROPY))
        return 0;
    const ptc_instr *ce = ins(z, i);
    int L = ce->in[0], T = ce->in[1], j = i + 1;
    while (j < z->nold && j - i < CE_SPAN &&
           !(is_kernel(z, j, PTC_OP_CROSS_ENTROPY_GRAD) && ins(z, j)->in[0] == L &&
             ins(z, j)->in[1] == T))
        j++;
    if (j >= z->nold || j - i >= CE_SPAN)
        return 0;
    const ptc_instr *gr = ins(z, j);
    int dL = gr->out[0], rl = root(z, L), rt = root(z, T);
    bool seed[CE_SPAN];
    if (!ce_seed(z, i, j, seed))
        return 0;
    /* the seed moves before what lay between: nothing of that may share bytes with it (a
     * multiplication done in place over a constant that something between still reads) */
    for (int m = i + 1; m < j; m++)
        for (int x = i + 1; x < m && seed[m - i]; x++)
            if (!seed[x - i] && fz_shares_bytes(z, ins(z, m), ins(z, x)))
                return 0;
    /* the loss is forward work and its gradient backward: one unit only outside pipelines */
    for (int m = i; m <= j; m++) {
        const ptc_instr *x = ins(z, m);
        if ((m == i || m == j || seed[m - i]) &&
            (x->work != ce->work || x->mb != ce->mb || x->vstage != ce->vstage ||
             x->recompute != ce->recompute || x->has_coord))
            return 0;
        for (int k = 0; k < x->nin && m > i && m < j; k++)
            if (root(z, x->in[k]) == rl || root(z, x->in[k]) == rt)
                return 0;
        for (int k = 0; k < x->nout && m > i && m < j; k++)
            if (root(z, x->out[k]) == rl || root(z, x->out[k]) == rt ||
                root(z, x->out[k]) == root(z, dL))
                return 0;
    }
    if (!is_f32(z, L) || !is_f32(z, gr->in[2]) || z->last_read[rl] != j || z->keep[rl] ||
        z->pg->bufs[dL].view >= 0 || z->pg->bufs[L].view_axis >= 0 ||
        z->pg->bufs[rl].kind != PTC_BUF_TEMP || z->pg->bufs[rl].region != z->pg->bufs[dL].region ||
        z->pg->bufs[rl].bytes < z->pg->bufs[dL].bytes)
        return 0;
    *seedmask = 0;
    for (int m = 1; m < j - i; m++)
        *seedmask |= (uint64_t)seed[m] << m;
    return j - i + 1;
}

/* The same over 16-bit logits (--precision), where the lowering widened the logits for each of
 * the two and rounded the gradient back:
 *   cast L16 -> W1; cross_entropy W1, T; ...; cast L16 -> W2; cross_entropy_grad W2, T, dl -> G;
 *   cast G -> dL16
 * The kernel reads L16 and writes dL16 over it (neither f32 copy nor the f32 gradient is made). */
int fz_ce16_at(const fz *z, int i, uint64_t *seedmask, uint64_t *inner)
{
    if (i + 1 >= z->nold || !half_cast(z, ins(z, i), true) ||
        !is_kernel(z, i + 1, PTC_OP_CROSS_ENTROPY) || ins(z, i + 1)->in[0] != ins(z, i)->out[0])
        return 0;
    const ptc_instr *w1 = ins(z, i), *ce = ins(z, i + 1);
    int L = w1->in[0], T = ce->in[1], j = i + 2;
    while (j + 2 < z->nold && j - i < CE_SPAN - 3 &&
           !(half_cast(z, ins(z, j), true) && ins(z, j)->in[0] == L &&
             is_kernel(z, j + 1, PTC_OP_CROSS_ENTROPY_GRAD) &&
             ins(z, j + 1)->in[0] == ins(z, j)->out[0] && ins(z, j + 1)->in[1] == T))
        j++;
    if (j + 2 >= z->nold || j - i >= CE_SPAN - 3)
        return 0;
    const ptc_instr *w2 = ins(z, j), *gr = ins(z, j + 1), *nr = ins(z, j + 2);
    if (!half_cast(z, nr, false) || nr->in[0] != gr->out[0])
        return 0;
    int dL = nr->out[0], rl = root(z, L), rt = root(z, T);
    bool seed[CE_SPAN];
    if (!ce_seed(z, i + 1, j + 1, seed)) /* (seed[m] for instruction i + 1 + m) */
        return 0;
    for (int m = i + 2; m < j; m++)
        for (int x = i + 2; x < m && seed[m - i - 1]; x++)
            if (!seed[x - i - 1] && fz_shares_bytes(z, ins(z, m), ins(z, x)))
                return 0;
    for (int m = i; m <= j + 2; m++) {
        const ptc_instr *x = ins(z, m);
        bool part = m == i || m == i + 1 || m >= j || (m > i + 1 && seed[m - i - 1]);
        if (part && (x->work != ce->work || x->mb != ce->mb || x->vstage != ce->vstage ||
                     x->recompute != ce->recompute || x->has_coord))
            return 0;
        if (part)
            continue;
        for (int k = 0; k < x->nin; k++)
            if (root(z, x->in[k]) == rl || root(z, x->in[k]) == rt)
                return 0;
        for (int k = 0; k < x->nout; k++)
            if (root(z, x->out[k]) == rl || root(z, x->out[k]) == rt ||
                root(z, x->out[k]) == root(z, dL))
                return 0;
    }
    /* the f32 copies and the f32 gradient are read by their member alone */
    if (z->last_read[root(z, w1->out[0])] != i + 1 || z->last_read[root(z, w2->out[0])] != j + 1 ||
        z->last_read[root(z, gr->out[0])] != j + 2 || z->keep[root(z, gr->out[0])] ||
        !is_f32(z, gr->in[2]) || z->last_read[rl] != j || z->keep[rl] ||
        z->pg->bufs[dL].view >= 0 || z->pg->bufs[L].view_axis >= 0 ||
        z->pg->bufs[rl].kind != PTC_BUF_TEMP || z->pg->bufs[rl].region != z->pg->bufs[dL].region ||
        z->pg->bufs[rl].bytes < z->pg->bufs[dL].bytes)
        return 0;
    *seedmask = 0;
    for (int m = i + 2; m < j; m++)
        *seedmask |= (uint64_t)seed[m - i - 1] << (m - i);
    *inner = (uint64_t)1 << 1 | (uint64_t)1 << (j - i) | (uint64_t)1 << (j + 1 - i);
    return j + 3 - i;
}

/* consecutive [mul G, c -> G';] adamw_update P, G', M, V, lr, step: the number of instructions */
static int adamw_at(const fz *z, int i)
{
    int n = 0, updates = 0, lr = -1, step = -1;
    for (;;) {
        /* per parameter: [cast G16 -> G;] [mul G, c -> G';] adamw_update P, G', M, V, lr, step;
         * [cast P -> P16] (--precision: the 16-bit gradient widened, the working copy rounded
         * from the master) */
        int j = i + n, len = 1, w = 0;
        /* (the widened gradient read by the mul, or by the update where the mul wrote over it) */
        if (j + 1 < z->nold && half_cast(z, ins(z, j), true) && is_kernel(z, j + 1, PTC_OP_MUL) &&
            ins(z, j + 1)->in[0] == ins(z, j)->out[0] &&
            z->last_read[root(z, ins(z, j)->out[0])] <= j + 2 &&
            !z->keep[root(z, ins(z, j)->out[0])])
            w = 1;
        j += w;
        if (is_kernel(z, j, PTC_OP_MUL) && is_kernel(z, j + 1, PTC_OP_ADAMW_UPDATE) &&
            ins(z, j + 1)->in[1] == ins(z, j)->out[0] && numel(z, ins(z, j)->in[1]) == 1 &&
            numel(z, ins(z, j)->in[0]) == numel(z, ins(z, j)->out[0]))
            len = 2;
        else if (w)
            break;
        int u = j + len - 1;
        if (!is_kernel(z, u, PTC_OP_ADAMW_UPDATE) || !all_f32(z, ins(z, u)) ||
            (len == 2 && !all_f32(z, ins(z, j))))
            break;
        const ptc_instr *a = ins(z, u);
        if (n > 0 && !same_task(ins(z, i), a))
            break;
        if ((lr >= 0 && (a->in[4] != lr || a->in[5] != step)) ||
            (updates + 1) * 8 > PTC_MAX_FUSED_OPERANDS || n + w + len + 1 > MAX_MEMBERS * 4)
            break;
        int r = u + 1 < z->nold && half_cast(z, ins(z, u + 1), false) &&
                ins(z, u + 1)->in[0] == a->out[0] && same_task(a, ins(z, u + 1));
        lr = a->in[4];
        step = a->in[5];
        n += w + len + r;
        updates++;
    }
    return updates >= 2 ? n : 0;
}

/* ---- building kernels ---- */

static int input_param(kb *b, int buf)
{
    for (int q = 0; q < b->nin; q++)
        if (b->in[q] == buf)
            return q;
    PTC_ASSERT(b->nin < PTC_MAX_FUSED_OPERANDS);
    b->in[b->nin] = buf;
    char name[32];
    snprintf(name, sizeof name, "x%d", b->nin);
    ptc_kir_param(b->k, name, b->z->pg->bufs[buf].type.dtype, numel(b->z, buf), false, -1);
    return b->nin++;
}

/* the member of the group that wrote buffer buf before member m, or -1 */
static int producer(const kb *b, int m, int buf)
{
    for (int q = m - 1; q >= 0; q--)
        if (ins(b->z, b->first + q)->out[0] == buf)
            return q;
    return -1;
}

/* element (row r, column j) of buffer buf (an input), broadcast to [R, C] */
static int load_at(kb *b, int buf, int j)
{
    ptc_kir *k = b->k;
    int q = input_param(b, buf);
    const ptc_type *a = &b->z->pg->bufs[buf].type;
    int64_t n = ptc_type_numel(a);
    if (n == b->R * b->C)
        return ptc_kx_load(k, q, ptc_kx_bin(k, PTC_KX_ADD, ptc_kx_bin(k, PTC_KX_MUL, b->r, ptc_kx_i(k, b->C)), j));
    if (n == 1)
        return ptc_kx_load(k, q, ptc_kx_i(k, 0));
    /* general broadcast: the output's coordinates from (r, j), the operand's strides (0 where
     * its dim is 1 or missing); the output is viewed as the first member's result type */
    const ptc_type *o = &b->z->pg->bufs[ins(b->z, b->first)->out[0]].type;
    int idx = a->dims[a->rank - 1] == 1 ? ptc_kx_i(k, 0) : j;
    int64_t stride = a->dims[a->rank - 1], inner = 1;
    for (int d = o->rank - 2; d >= 0; d--) {
        int ad = d - (o->rank - a->rank);
        if (ad >= 0 && a->dims[ad] != 1) {
            int coord = ptc_kx_bin(k, PTC_KX_REM, ptc_kx_bin(k, PTC_KX_DIV, b->r, ptc_kx_i(k, inner)),
                                   ptc_kx_i(k, o->dims[d]));
            idx = ptc_kx_bin(k, PTC_KX_ADD, idx, ptc_kx_bin(k, PTC_KX_MUL, coord, ptc_kx_i(k, stride)));
        }
        if (ad >= 0)
            stride *= a->dims[ad];
        inner *= o->dims[d];
    }
    return ptc_kx_load(k, q, idx);
}

static int f(kb *b, double v)
{
    return ptc_kx_f(b->k, v);
}
static int bin(kb *b, ptc_kx_kind kind, int x, int y)
{
    return ptc_kx_bin(b->k, kind, x, y);
}
static int un(kb *b, ptc_kx_kind kind, int x)
{
    return ptc_kx_un(b->k, kind, x);
}

/* the value of op over operand values v (kir_ops.c: one formula for fused and single ops) */
static int op_value(kb *b, ptc_op op, const int *v)
{
    return ptc_kx_op(b->k, op, v);
}

/* Whether member m of the run [first, first + n) has its result stored: it is observable or
 * read after the run, and the run does not overwrite its bytes later. */
static bool stored_in(const fz *z, int first, int n, int m)
{
    int out = ins(z, first + m)->out[0], r = root(z, out), end = first + n - 1;
    for (int q = m + 1; q < n; q++)
        for (int o = 0; o < ins(z, first + q)->nout; o++)
            if (root(z, ins(z, first + q)->out[o]) == r)
                return false;
    return z->keep[r] || z->last_read[r] > end;
}

static bool stored(const kb *b, int m)
{
    return stored_in(b->z, b->first, b->n, m);
}

/* member m's value at column j: from its stored result when `reload`, else computed (memoized
 * per column expression) */
static int member_value(kb *b, int m, int j, bool reload)
{
    const ptc_instr *in = ins(b->z, b->first + m);
    if (reload && stored(b, m)) {
        for (int o = 0; o < b->nout; o++)
            if (b->out[o] == in->out[0])
                return ptc_kx_load(b->k, b->out_param[o],
                                   bin(b, PTC_KX_ADD, bin(b, PTC_KX_MUL, b->r, ptc_kx_i(b->k, b->C)), j));
    }
    if (b->memo[m] >= 0)
        return b->memo[m];
    if (half_cast(b->z, in, true)) { /* the 16-bit bytes, loaded (widened), at j's broadcast */
        int q = producer(b, m, in->in[0]); /* (or a member's rounded value: widening is exact) */
        return b->memo[m] = q >= 0 ? member_value(b, q, j, reload) : load_at(b, in->in[0], j);
    }
    int v[4];
    for (int k = 0; k < in->nin; k++) {
        int q = producer(b, m, in->in[k]);
        v[k] = q >= 0 ? member_value(b, q, j, reload) : load_at(b, in->in[k], j);
    }
    if (in->op == PTC_OP_CAST) /* narrowing: the value rounded as its 16-bit result holds it */
        return b->memo[m] = un(b, b->z->pg->bufs[in->out[0]].type.dtype == PTC_BF16 ? PTC_KX_RBF16
                                                                                  : PTC_KX_RF16,
                               v[0]);
    return b->memo[m] = op_value(b, in->op, v);
}

/* The buffer a consumer's operand is loaded from: the 16-bit source of a widening member. */
static int source_of(kb *b, int buf)
{
    int q = producer(b, b->n - 1, buf);
    return q >= 0 && half_cast(b->z, ins(b->z, b->first + q), true) ? ins(b->z, b->first + q)->in[0]
                                                                    : buf;
}

void fz_clear_memo(kb *b)
{
    for (int m = 0; m < MAX_MEMBERS; m++)
        b->memo[m] = -1;
}

static int rowj(kb *b, int j, int64_t width)
{
    return bin(b, PTC_KX_ADD, bin(b, PTC_KX_MUL, b->r, ptc_kx_i(b->k, width)), j);
}

/* the row consumer at the end of a chain: its x is member `xm` */
static void build_consumer(kb *b, const ptc_instr *c, int xm)
{
    ptc_kir *k = b->k;
    int64_t C = b->C;
    int x;
    int jv;
#define COLUMN_VALUE(J) (fz_clear_memo(b), member_value(b, xm, (J), true))
    if (c->op == PTC_OP_SPLIT) {
        int64_t w = C / c->nout;
        for (int q = 0; q < c->nout; q++) {
            int j = ptc_kir_for(k, NULL, ptc_kx_i(k, w), false);
            int col = bin(b, PTC_KX_ADD, ptc_kx_i(k, q * w), j);
            ptc_kir_store(k, b->out_param[b->nout - c->nout + q], rowj(b, j, w), COLUMN_VALUE(col));
            ptc_kir_end(k);
        }
        return;
    }
    int yp = b->out_param[b->nout - 1];
    if (c->op == PTC_OP_LAYERNORM || c->op == PTC_OP_RMSNORM) {
        int g = input_param(b, source_of(b, c->in[1]));
        int bb = c->op == PTC_OP_LAYERNORM ? input_param(b, source_of(b, c->in[2])) : -1;
        int mean = -1;
        if (c->op == PTC_OP_LAYERNORM) {
            jv = ptc_kir_var(k, NULL, PTC_KT_I64);
            x = COLUMN_VALUE(ptc_kx_v(k, jv));
            mean = ptc_kir_bind(k, bin(b, PTC_KX_DIV, ptc_kx_reduce(k, PTC_KX_SUM, jv, ptc_kx_i(k, C), x), f(b, (double)C)));
        }
        jv = ptc_kir_var(k, NULL, PTC_KT_I64);
        x = COLUMN_VALUE(ptc_kx_v(k, jv));
        int d = mean >= 0 ? bin(b, PTC_KX_SUB, x, mean) : x;
        int var = ptc_kir_bind(k, bin(b, PTC_KX_DIV, ptc_kx_reduce(k, PTC_KX_SUM, jv, ptc_kx_i(k, C), bin(b, PTC_KX_MUL, d, d)), f(b, (double)C)));
        int inv = ptc_kir_bind(k, bin(b, PTC_KX_DIV, f(b, 1.0), un(b, PTC_KX_SQRT, bin(b, PTC_KX_ADD, var, f(b, c->attrs.eps)))));
        int j = ptc_kir_for(k, NULL, ptc_kx_i(k, C), false);
        x = COLUMN_VALUE(j);
        d = mean >= 0 ? bin(b, PTC_KX_SUB, x, mean) : x;
        int y = bin(b, PTC_KX_MUL, bin(b, PTC_KX_MUL, d, inv), ptc_kx_load(k, g, j));
        if (bb >= 0)
            y = bin(b, PTC_KX_ADD, y, ptc_kx_load(k, bb, j));
        ptc_kir_store(k, yp, rowj(b, j, C), y);
        ptc_kir_end(k);
        return;
    }
    /* softmax / log_softmax */
    jv = ptc_kir_var(k, NULL, PTC_KT_I64);
    int mx = ptc_kir_bind(k, ptc_kx_reduce(k, PTC_KX_RMAX, jv, ptc_kx_i(k, C), COLUMN_VALUE(ptc_kx_v(k, jv))));
    jv = ptc_kir_var(k, NULL, PTC_KT_I64);
    int s = ptc_kir_bind(k, ptc_kx_reduce(k, PTC_KX_SUM, jv, ptc_kx_i(k, C),
                                          un(b, PTC_KX_EXP, bin(b, PTC_KX_SUB, COLUMN_VALUE(ptc_kx_v(k, jv)), mx))));
    int j = ptc_kir_for(k, NULL, ptc_kx_i(k, C), false);
    int e = bin(b, PTC_KX_SUB, COLUMN_VALUE(j), mx);
    int y = c->op == PTC_OP_SOFTMAX ? bin(b, PTC_KX_DIV, un(b, PTC_KX_EXP, e), s)
                                    : bin(b, PTC_KX_SUB, e, un(b, PTC_KX_LOG, s));
    ptc_kir_store(k, yp, rowj(b, j, C), y);
    ptc_kir_end(k);
#undef COLUMN_VALUE
}

/* adds a materialized result: an out parameter, over the input with the same root if any */
static int add_out(kb *b, int buf)
{
    int alias = -1;
    for (int q = 0; q < b->nin; q++)
        if (root(b->z, b->in[q]) == root(b->z, buf))
            alias = q;
    char name[32];
    snprintf(name, sizeof name, "y%d", b->nout);
    PTC_ASSERT(b->nout < PTC_MAX_FUSED_OPERANDS);
    b->out[b->nout] = buf;
    b->out_param[b->nout] = ptc_kir_param(b->k, name, b->z->pg->bufs[buf].type.dtype,
                                          numel(b->z, buf), true, alias);
    return b->nout++;
}

/* the inputs of members [0, n) */
static void collect_inputs(kb *b, int n)
{
    for (int m = 0; m < n; m++) {
        const ptc_instr *in = ins(b->z, b->first + m);
        for (int k = 0; k < in->nin; k++)
            if (producer(b, m, in->in[k]) < 0)
                input_param(b, in->in[k]);
    }
}

static ptc_kir *build_chain(kb *b)
{
    fz *z = b->z;
    const ptc_instr *last = ins(z, b->first + b->n - 1);
    /* members through the consumer; the 16-bit roundings of its results after it (chain_at) */
    int cn = b->n, nr = 0;
    while (nr < b->n - 1 && half_cast(z, ins(z, b->first + b->n - 1 - nr), false))
        nr++;
    if (nr && !chain_member(z, ins(z, b->first + b->n - 1 - nr)) &&
        ins(z, b->first + b->n - 1 - nr)->nout == nr) {
        cn = b->n - nr;
        last = ins(z, b->first + cn - 1);
    } else
        nr = 0;
    bool consumer = !chain_member(z, last);
    int npw = consumer ? cn - 1 : cn;
    int o0 = ins(z, b->first)->out[0];
    b->C = last_dim(z, o0);
    b->R = numel(z, o0) / b->C;
    collect_inputs(b, cn);
    for (int m = 0; m < npw; m++)
        if (stored(b, m))
            add_out(b, ins(z, b->first + m)->out[0]);
    if (consumer)
        for (int o = 0; o < last->nout; o++)
            add_out(b, nr ? ins(z, b->first + cn + o)->out[0] : last->out[o]);
    ptc_kir *k = b->k;
    b->r = ptc_kir_for(k, "r", ptc_kx_i(k, b->R), true);
    /* pass 1: the chain's stored results */
    bool any = false;
    for (int o = 0; o < b->nout - (consumer ? last->nout : 0); o++)
        any = true;
    if (any) {
        int j = ptc_kir_for(k, "j", ptc_kx_i(k, b->C), false);
        fz_clear_memo(b);
        for (int m = 0; m < npw; m++) { /* bind every value once (a widened load is a load) */
            int v = member_value(b, m, j, false);
            b->memo[m] = half_cast(z, ins(z, b->first + m), true) ? v : ptc_kir_bind(k, v);
        }
        for (int o = 0; o < b->nout - (consumer ? last->nout : 0); o++)
            for (int m = 0; m < npw; m++)
                if (ins(z, b->first + m)->out[0] == b->out[o])
                    ptc_kir_store(k, b->out_param[o], rowj(b, j, b->C), b->memo[m]);
        ptc_kir_end(k);
    }
    if (consumer) {
        int xm = producer(b, cn - 1, last->in[0]);
        build_consumer(b, last, xm);
    }
    ptc_kir_end(k);
    return k;
}

/* one pass over each row of logits: max, sum of exps, the row's loss and the gradient over the
 * logits; the mean of the row losses is a separate (reference) kernel */
ptc_kir *fz_build_ce(kb *b, int rowloss, int targets, int seed, int logits, int dlogits,
                         int64_t rows)
{
    fz *z = b->z;
    ptc_kir *k = b->k;
    int L = input_param(b, logits), T = input_param(b, targets);
    int dl = input_param(b, seed);
    int64_t C = last_dim(z, logits), R = numel(z, logits) / C;
    b->C = C;
    b->R = R;
    add_out(b, rowloss);
    add_out(b, dlogits);
    int lossp = b->out_param[0], dLp = b->out_param[1];
    /* (the mean is over every row of the logits, of which these may be a chunk) */
    int scale = ptc_kir_bind(k, bin(b, PTC_KX_DIV, ptc_kx_load(k, dl, ptc_kx_i(k, 0)), f(b, (double)rows)));
    b->r = ptc_kir_for(k, "r", ptc_kx_i(k, R), true);
    int t = ptc_kir_bind(k, ptc_kx_load(k, T, b->r));
    /* an id outside the classes gives a NaN loss (the reference reports it; a generated kernel
     * must not read outside the row) */
    int no = bin(b, PTC_KX_LT, ptc_kx_i(k, 1), ptc_kx_i(k, 0));
    int ok = ptc_kir_bind(k, ptc_kx_select(k, bin(b, PTC_KX_LT, t, ptc_kx_i(k, 0)), no,
                                           bin(b, PTC_KX_LT, t, ptc_kx_i(k, C))));
    int tc = ptc_kir_bind(k, ptc_kx_select(k, ok, t, ptc_kx_i(k, 0)));
    int jv = ptc_kir_var(k, NULL, PTC_KT_I64);
    int mx = ptc_kir_bind(k, ptc_kx_reduce(k, PTC_KX_RMAX, jv, ptc_kx_i(k, C), ptc_kx_load(k, L, rowj(b, ptc_kx_v(k, jv), C))));
    int nan = bin(b, PTC_KX_DIV, f(b, 0.0), f(b, 0.0));
    /* an f32 gradient takes the row's exps where it goes (over the logits) and they are summed
     * from there, so each is computed once (the target's logit read first); a 16-bit one would
     * round them, so there they are computed again for the gradient */
    bool stored = z->pg->bufs[dlogits].type.dtype == PTC_F32;
    int xt, s;
    if (stored) {
        xt = ptc_kir_bind(k, ptc_kx_load(k, L, rowj(b, tc, C)));
        int j = ptc_kir_for(k, "j", ptc_kx_i(k, C), false);
        ptc_kir_store(k, dLp, rowj(b, j, C), un(b, PTC_KX_EXP, bin(b, PTC_KX_SUB, ptc_kx_load(k, L, rowj(b, j, C)), mx)));
        ptc_kir_end(k);
        jv = ptc_kir_var(k, NULL, PTC_KT_I64);
        s = ptc_kir_bind(k, ptc_kx_reduce(k, PTC_KX_SUM, jv, ptc_kx_i(k, C), ptc_kx_load(k, dLp, rowj(b, ptc_kx_v(k, jv), C))));
    } else {
        jv = ptc_kir_var(k, NULL, PTC_KT_I64);
        s = ptc_kir_bind(k, ptc_kx_reduce(k, PTC_KX_SUM, jv, ptc_kx_i(k, C),
                                          un(b, PTC_KX_EXP, bin(b, PTC_KX_SUB, ptc_kx_load(k, L, rowj(b, ptc_kx_v(k, jv), C)), mx))));
        xt = ptc_kx_load(k, L, rowj(b, tc, C));
    }
    int loss = bin(b, PTC_KX_SUB, bin(b, PTC_KX_ADD, un(b, PTC_KX_LOG, s), mx), xt);
    ptc_kir_store(k, lossp, b->r, ptc_kx_select(k, ok, loss, nan));
    int inv = ptc_kir_bind(k, bin(b, PTC_KX_DIV, f(b, 1.0), s));
    int j = ptc_kir_for(k, "j", ptc_kx_i(k, C), false);
    int e = stored ? ptc_kx_load(k, dLp, rowj(b, j, C))
                   : un(b, PTC_KX_EXP, bin(b, PTC_KX_SUB, ptc_kx_load(k, L, rowj(b, j, C)), mx));
    int p = bin(b, PTC_KX_SUB, bin(b, PTC_KX_MUL, e, inv),
                ptc_kx_select(k, bin(b, PTC_KX_EQ, j, tc), f(b, 1.0), f(b, 0.0)));
    ptc_kir_store(k, dLp, rowj(b, j, C), bin(b, PTC_KX_MUL, p, scale));
    ptc_kir_end(k);
    ptc_kir_end(k);
    return k;
}

/* the multi-tensor AdamW update of torch/optim/adamw.py over every (p, g, m, v) of the run, the
 * gradient scaled by the clipping coefficient where the run had that multiplication */
static ptc_kir *build_adamw(kb *b)
{
    fz *z = b->z;
    ptc_kir *k = b->k;
    collect_inputs(b, b->n);
    const ptc_instr *a0 = NULL;
    for (int m = 0; m < b->n; m++) {
        const ptc_instr *a = ins(z, b->first + m);
        if (a->op == PTC_OP_ADAMW_UPDATE) {
            a0 = a0 ? a0 : a;
            for (int o = 0; o < 3; o++)
                add_out(b, a->out[o]);
        } else if (half_cast(z, a, false)) { /* the working copy */
            add_out(b, a->out[0]);
        }
    }
    const ptc_attrs *at = &a0->attrs;
    int lr = ptc_kir_bind(k, ptc_kx_load(k, input_param(b, a0->in[4]), ptc_kx_i(k, 0)));
    int step = ptc_kir_bind(k, ptc_kx_load(k, input_param(b, a0->in[5]), ptc_kx_i(k, 0)));
    /* beta^step = exp(step log beta) */
    int bc1 = ptc_kir_bind(k, bin(b, PTC_KX_SUB, f(b, 1.0), un(b, PTC_KX_EXP, bin(b, PTC_KX_MUL, step, f(b, log(at->beta1))))));
    int bc2 = ptc_kir_bind(k, bin(b, PTC_KX_SUB, f(b, 1.0), un(b, PTC_KX_EXP, bin(b, PTC_KX_MUL, step, f(b, log(at->beta2))))));
    int step_size = ptc_kir_bind(k, bin(b, PTC_KX_DIV, lr, bc1));
    int bc2_sqrt = ptc_kir_bind(k, un(b, PTC_KX_SQRT, bc2));
    int o = 0;
    for (int m = 0; m < b->n; m++) {
        const ptc_instr *a = ins(z, b->first + m), *mul = NULL;
        if (a->op != PTC_OP_ADAMW_UPDATE)
            continue;
        if (m > 0 && ins(z, b->first + m - 1)->op == PTC_OP_MUL)
            mul = ins(z, b->first + m - 1);
        /* a widened 16-bit gradient is loaded from its 16-bit bytes */
        int gbuf = mul ? mul->in[0] : a->in[1];
        if (mul && m > 1 && half_cast(z, ins(z, b->first + m - 2), true) &&
            ins(z, b->first + m - 2)->out[0] == gbuf)
            gbuf = ins(z, b->first + m - 2)->in[0];
        bool copy = m + 1 < b->n && half_cast(z, ins(z, b->first + m + 1), false);
        int64_t n = numel(z, a->in[0]);
        int i = ptc_kir_for(k, NULL, ptc_kx_i(k, n), true);
        int g = mul ? bin(b, PTC_KX_MUL, ptc_kx_load(k, input_param(b, gbuf), i),
                          ptc_kx_load(k, input_param(b, mul->in[1]), ptc_kx_i(k, 0)))
                    : ptc_kx_load(k, input_param(b, gbuf), i);
        g = ptc_kir_bind(k, g);
        int p = ptc_kx_load(k, input_param(b, a->in[0]), i);
        int mm = ptc_kir_bind(k, bin(b, PTC_KX_ADD, bin(b, PTC_KX_MUL, f(b, at->beta1), ptc_kx_load(k, input_param(b, a->in[2]), i)),
                                    bin(b, PTC_KX_MUL, f(b, 1 - at->beta1), g)));
        int vv = ptc_kir_bind(k, bin(b, PTC_KX_ADD, bin(b, PTC_KX_MUL, f(b, at->beta2), ptc_kx_load(k, input_param(b, a->in[3]), i)),
                                    bin(b, PTC_KX_MUL, f(b, 1 - at->beta2), bin(b, PTC_KX_MUL, g, g))));
        int denom = bin(b, PTC_KX_ADD, bin(b, PTC_KX_DIV, un(b, PTC_KX_SQRT, vv), bc2_sqrt), f(b, a->attrs.eps));
        int pd = bin(b, PTC_KX_MUL, p, bin(b, PTC_KX_SUB, f(b, 1.0), bin(b, PTC_KX_MUL, lr, f(b, a->attrs.wd))));
        int pn = bin(b, PTC_KX_SUB, pd, bin(b, PTC_KX_DIV, bin(b, PTC_KX_MUL, step_size, mm), denom));
        if (copy) /* (stored twice) */
            pn = ptc_kir_bind(k, pn);
        ptc_kir_store(k, b->out_param[o], i, pn);
        ptc_kir_store(k, b->out_param[o + 1], i, mm);
        ptc_kir_store(k, b->out_param[o + 2], i, vv);
        if (copy) /* the 16-bit working copy: the new master, rounded */
            ptc_kir_store(k, b->out_param[o + 3], i, pn);
        o += 3 + copy;
        ptc_kir_end(k);
    }
    return k;
}

static int add_out(kb *b, int buf);

/* ---- recomputing activations for the backward ---- */

static bool activation(ptc_op op)
{
    return op == PTC_OP_GELU || op == PTC_OP_SILU || op == PTC_OP_RELU || op == PTC_OP_SIGMOID ||
           op == PTC_OP_TANH;
}

static bool find_remat(const fz *z, const group *g, int m, remat *r)
{
    const ptc_instr *a = ins(z, g->first + m);
    int end = g->first + g->n - 1, y = a->out[0], h = a->in[0], ym = m;
    if (!activation(a->op) || a->nin != 1)
        return false;
    /* 16 bits: h16 widened, f, rounded to y16 (the recomputation loads h16 and stores y16, rounding
     * exactly as the chain did) */
    if (m > 0 && m + 1 < g->n && half_cast(z, ins(z, g->first + m - 1), true) &&
        ins(z, g->first + m - 1)->out[0] == h && half_cast(z, ins(z, g->first + m + 1), false) &&
        ins(z, g->first + m + 1)->in[0] == y) {
        h = ins(z, g->first + m - 1)->in[0];
        y = ins(z, g->first + m + 1)->out[0];
        ym = m + 1;
    }
    if (z->pg->bufs[y].view >= 0 || z->keep[y] || !stored_in(z, g->first, g->n, ym))
        return false;
    int last_fwd = end, first_bwd = -1, rh = root(z, h);
    for (int j = end + 1; j < z->nold; j++) {
        const ptc_instr *in = ins(z, j);
        bool reads = false;
        for (int k = 0; k < in->nin; k++)
            reads |= root(z, in->in[k]) == y;
        if (reads && in->phase == PTC_PHASE_FORWARD) {
            if (first_bwd >= 0)
                return false;
            last_fwd = j;
        } else if (reads && first_bwd < 0) {
            first_bwd = j;
        }
        for (int k = 0; k < in->nout; k++)
            if (root(z, in->out[k]) == y || (first_bwd < 0 && root(z, in->out[k]) == rh))
                return false;
    }
    if (first_bwd < 0 || z->last_read[rh] < first_bwd || last_fwd < end)
        return false;
    *r = (remat){.y = y, .h = h, .op = a->op, .at = first_bwd, .y2 = -1, .grad = -1};
    return true;
}

static ptc_op activation_grad(ptc_op op)
{
    return op == PTC_OP_GELU ? PTC_OP_GELU_GRAD
           : op == PTC_OP_SILU ? PTC_OP_SILU_GRAD
           : op == PTC_OP_RELU ? PTC_OP_RELU_GRAD
                               : PTC_NOPS;
}

/* f's gradient dx = f'(h) dy, a kernel of its own after the recomputation whose dy is ready
 * there: it joins the recomputation's kernel, which then reads h once and evaluates f's inner
 * function (gelu's tanh) once for both (the backward of an MLP computes dy = dz W2^T before the
 * recomputed y meets dz in W2's gradient). Only in f32, and only when nothing between the two
 * reads or writes dx or writes h or dy. */
static void find_remat_grad(const fz *z, const bool *grouped, remat *r)
{
    ptc_op gop = activation_grad(r->op);
    if (gop == PTC_NOPS || !is_f32(z, r->y) || !is_f32(z, r->h))
        return;
    int rh = root(z, r->h);
    for (int j = r->at; j < z->nold; j++) {
        const ptc_instr *in = ins(z, j);
        if (j > r->at && in->kind == PTC_INSTR_KERNEL && in->op == gop && in->nin == 2 &&
            in->nout == 1 && in->in[0] == r->h && !grouped[j] && is_f32(z, in->in[1]) &&
            is_f32(z, in->out[0]) && unsharded(z, in->in[1]) && unsharded(z, in->out[0]) &&
            numel(z, in->in[1]) == numel(z, r->h) && numel(z, in->out[0]) == numel(z, r->h)) {
            int rd = root(z, in->in[1]), ro = root(z, in->out[0]);
            if (ro == rh && start(z, in->out[0]) != start(z, r->h))
                return; /* dx over h must be element for element (the kernel reads, then writes) */
            for (int q = r->at; q < j; q++) { /* dy ready at `at`, dx untouched until j */
                const ptc_instr *t = ins(z, q);
                for (int o = 0; o < t->nout; o++)
                    if (root(z, t->out[o]) == rd || root(z, t->out[o]) == ro)
                        return;
                for (int k = 0; k < t->nin; k++)
                    if (root(z, t->in[k]) == ro)
                        return;
            }
            if (rd == ro || rd == rh)
                return;
            if (ro == rh && !unsharded(z, r->h))
                return;
            r->grad = j;
            return;
        }
        for (int o = 0; o < in->nout; o++)
            if (root(z, in->out[o]) == rh)
                return;
    }
}


/* y2 = f(h) before the first backward reader */
void fz_emit_remat(fz *z, remat *r, const ptc_instr *like, int kernel_no)
{
    ptc_type t = z->pg->bufs[r->y].type;
    r->y2 = fz_new_temp(z, &t, z->pg->bufs[r->y].region);
    const ptc_instr *g = r->grad >= 0 ? ins(z, r->grad) : NULL;
    char name[64];
    snprintf(name, sizeof name, "f%d_%s_again%s%s", kernel_no, ptc_ops[r->op].name, g ? "_" : "",
             g ? ptc_ops[g->op].name : "");
    kb b = {.z = z, .k = ptc_kir_new(name)};
    int in[2], out[2], op[2];
    b.in = in;
    b.out = out;
    b.out_param = op;
    b.C = last_dim(z, r->y);
    b.R = numel(z, r->y) / b.C;
    int x = input_param(&b, r->h), dy = g ? input_param(&b, g->in[1]) : -1;
    add_out(&b, r->y2);
    if (g)
        add_out(&b, g->out[0]);
    ptc_kir *k = b.k;
    b.r = ptc_kir_for(k, "r", ptc_kx_i(k, b.R), true);
    int j = ptc_kir_for(k, "j", ptc_kx_i(k, b.C), false);
    int v[2] = {ptc_kir_bind(k, ptc_kx_load(k, x, rowj(&b, j, b.C))), -1};
    ptc_kir_store(k, op[0], rowj(&b, j, b.C), op_value(&b, r->op, v));
    if (g) {
        v[1] = ptc_kx_load(k, dy, rowj(&b, j, b.C));
        ptc_kir_store(k, op[1], rowj(&b, j, b.C), op_value(&b, g->op, v));
    }
    ptc_kir_end(k);
    ptc_kir_end(k);
    fz_emit_fused(z, &b, PTC_PHASE_BACKWARD, like);
}

/* a backward instruction reading y (or views of it) reads y2 (or views of y2) instead */
void fz_add_rewritten(fz *z, const ptc_instr *old, const remat *rs, int nr)
{
    ptc_instr in = *old;
    int ops[PTC_MAX_RESULTS * 2];
    bool changed = false;
    for (int k = 0; k < in.nin && in.nin <= PTC_MAX_RESULTS * 2; k++) {
        ops[k] = in.in[k];
        for (int q = 0; q < nr; q++) {
            if (rs[q].y2 < 0 || in.phase == PTC_PHASE_FORWARD || root(z, in.in[k]) != rs[q].y)
                continue;
            if (in.in[k] == rs[q].y) {
                ops[k] = rs[q].y2;
            } else {
                ptc_buffer v = z->pg->bufs[in.in[k]];
                v.view = rs[q].y2;
                ops[k] = ptc_prog_add_buffer(z->p, z->pg, &v);
            }
            changed = true;
        }
    }
    if (changed)
        in.in = ops;
    ptc_prog_add_instr(z->p, z->pg, &in);
}

/* whether old instruction i is an activation's gradient that a recomputation's kernel computes */
bool fz_merged_grad(const remat *rs, int nr, int i)
{
    for (int q = 0; q < nr; q++)
        if (rs[q].grad == i && rs[q].grad >= 0)
            return true;
    return false;
}

/* ---- the pass ---- */

static void op_names(const fz *z, const group *g, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = 0;
    for (int m = 0; m < g->n && at + 1 < n; m++) {
        const char *name = ptc_ops[ins(z, g->first + m)->op].name;
        int w = snprintf(buf + at, n - at, "%s%s", m ? "_" : "", name);
        if (w < 0 || at + (size_t)w >= n)
            break;
        at += (size_t)w;
    }
}

/* the plan's kernel equal to k (by text, names aside), or k added */
static int add_kernel(fz *z, ptc_kir *k)
{
    ptc_plan *p = z->p;
    struct khashes *kh = z->kh;
    if (kh->cap < p->nkernels + 1)
        kh->h = ptc_xrealloc(kh->h, sizeof *kh->h * (size_t)(kh->cap = 2 * p->nkernels + 16));
    for (; kh->n < p->nkernels; kh->n++)
        kh->h[kh->n] = ptc_kir_hash(p->kernels[kh->n]);
    uint64_t h = ptc_kir_hash(k);
    for (int i = 0; i < p->nkernels; i++)
        if (kh->h[i] == h) {
            ptc_kir_free(k);
            return i;
        }
    kh->h[kh->n++] = h;
    return ptc_plan_add_kernel(p, k);
}

void fz_emit_fused(fz *z, kb *b, ptc_phase phase, const ptc_instr *like)
{
    char msg[512];
    if (ptc_kir_verify(b->k, msg, sizeof msg) < 0)
        ptc_assert_fail(__FILE__, __LINE__, msg);
    ptc_instr in = *like;
    in.kind = PTC_INSTR_FUSED;
    in.kernel = add_kernel(z, b->k);
    in.phase = (uint8_t)phase;
    in.nin = b->nin;
    in.nout = b->nout;
    in.in = b->in;
    in.out = b->out;
    memset(&in.attrs, 0, sizeof in.attrs);
    ptc_prog_add_instr(z->p, z->pg, &in);
}

int fz_new_temp(fz *z, const ptc_type *t, int region)
{
    ptc_buffer bf;
    memset(&bf, 0, sizeof bf);
    bf.type = *t;
    bf.kind = PTC_BUF_TEMP;
    bf.region = (uint8_t)region;
    bf.view = -1;
    bf.bytes = ptc_type_numel(t) * ptc_dtype_size(t->dtype);
    return ptc_prog_add_buffer(z->p, z->pg, &bf);
}

/* the mean of a cross-entropy's row losses into its loss (the instruction it came from) */
void fz_emit_mean(fz *z, const ptc_instr *ce, int rowloss)
{
    ptc_instr mean = *ce;
    mean.op = PTC_OP_MEAN;
    mean.attrs = ptc_attrs_default(PTC_OP_MEAN);
    mean.attrs.axis = 0;
    mean.nin = 1;
    mean.in = &rowloss;
    ptc_prog_add_instr(z->p, z->pg, &mean);
}

/* the replacement of group g (old instructions in `old`) appended to the program */
static void replace(fz *z, const group *g, const ptc_instr *old, int kernel_no)
{
    kb b = {.z = z, .first = g->first, .n = g->n};
    b.in = ptc_xmalloc(sizeof(int) * PTC_MAX_FUSED_OPERANDS);
    b.out = ptc_xmalloc(sizeof(int) * PTC_MAX_FUSED_OPERANDS);
    b.out_param = ptc_xmalloc(sizeof(int) * PTC_MAX_FUSED_OPERANDS);
    fz_clear_memo(&b);
    char name[96], ops[64];
    const ptc_instr *first = &old[g->first];
    if (g->kind == G_CE) {
        /* (over 16-bit logits: the ends are the widening of the logits and the rounding of the
         * gradient; the kernel reads and writes 16 bits) */
        bool b16 = g->inner != 0;
        const ptc_instr *ce = &old[g->first + b16], *gr = &old[g->first + g->n - 1 - b16];
        int L = b16 ? old[g->first].in[0] : ce->in[0];
        int dL = b16 ? old[g->first + g->n - 1].out[0] : gr->out[0], r = root(z, L);
        /* the gradient over the logits: dL takes their bytes (L may be a microbatch's slice of
         * its root), and so do its views */
        int64_t at = z->pg->bufs[L].view >= 0 ? z->pg->bufs[L].view_offset : 0;
        for (int v = 0; v < z->pg->nbufs; v++)
            if (z->pg->bufs[v].view == dL) {
                z->pg->bufs[v].view = r;
                z->pg->bufs[v].view_offset += at;
            }
        z->pg->bufs[dL].view = r;
        z->pg->bufs[dL].view_offset = at;
        z->pg->bufs[dL].region = z->pg->bufs[r].region;
        ptc_type rt = {.dtype = PTC_F32, .rank = 1};
        rt.dims[0] = numel(z, L) / last_dim(z, L);
        int rowloss = fz_new_temp(z, &rt, PTC_REGION_ACT);
        snprintf(name, sizeof name, "f%d_cross_entropy_with_grad", kernel_no);
        b.k = ptc_kir_new(name);
        for (int m = 1; m < g->n - 1; m++) /* the gradient's seed first */
            if (g->seed >> m & 1)
                ptc_prog_add_instr(z->p, z->pg, &old[g->first + m]);
        fz_build_ce(&b, rowloss, ce->in[1], gr->in[2], L, dL, rt.dims[0]);
        fz_emit_fused(z, &b, (ptc_phase)ce->phase, ce);
        fz_emit_mean(z, ce, rowloss);
    } else if (g->kind == G_ADAMW) {
        int updates = 0;
        for (int m = 0; m < g->n; m++)
            updates += old[g->first + m].op == PTC_OP_ADAMW_UPDATE;
        snprintf(name, sizeof name, "f%d_adamw_x%d", kernel_no, updates);
        b.k = ptc_kir_new(name);
        build_adamw(&b);
        fz_emit_fused(z, &b, (ptc_phase)first->phase, &old[g->first + g->n - 1]);
    } else {
        op_names(z, g, ops, sizeof ops);
        snprintf(name, sizeof name, "f%d_%s", kernel_no, ops);
        b.k = ptc_kir_new(name);
        build_chain(&b);
        fz_emit_fused(z, &b, (ptc_phase)first->phase, &old[g->first + g->n - 1]);
    }
    free(b.in);
    free(b.out);
    free(b.out_param);
}

static void analyse(fz *z)
{
    ptc_program *pg = z->pg;
    int nb = pg->nbufs ? pg->nbufs : 1;
    z->last_read = ptc_xmalloc(sizeof(int) * (size_t)nb);
    z->keep = ptc_xcalloc((size_t)nb, sizeof(bool));
    for (int b = 0; b < pg->nbufs; b++) {
        z->last_read[b] = -1;
        int k = pg->bufs[b].kind;
        z->keep[b] = pg->bufs[b].view < 0 && (k == PTC_BUF_PARAM || k == PTC_BUF_STATE);
    }
    for (int i = 0; i < pg->ninstrs; i++)
        for (int k = 0; k < pg->instrs[i].nin; k++)
            z->last_read[root(z, pg->instrs[i].in[k])] = i;
    int ends[2] = {pg->loss, pg->grad_norm};
    for (int k = 0; k < 2; k++)
        if (ends[k] >= 0)
            z->keep[root(z, ends[k])] = true;
    for (int k = 0; k < pg->noutputs; k++)
        z->keep[root(z, pg->outputs[k])] = true;
    for (int k = 0; k < pg->nstats; k++)
        z->keep[root(z, pg->stats[k])] = true;
}

/* Buffers no instruction, view or entry uses are dropped and the rest renumbered. */
static void compact(ptc_plan *p, ptc_program *pg)
{
    int nb = pg->nbufs ? pg->nbufs : 1;
    bool *used = ptc_xcalloc((size_t)nb, sizeof(bool));
    int *map = ptc_xmalloc(sizeof(int) * (size_t)nb);
    for (int i = 0; i < pg->ninstrs; i++) {
        for (int k = 0; k < pg->instrs[i].nin; k++)
            used[pg->instrs[i].in[k]] = true;
        for (int k = 0; k < pg->instrs[i].nout; k++)
            used[pg->instrs[i].out[k]] = true;
    }
    if (pg->loss >= 0)
        used[pg->loss] = true;
    if (pg->grad_norm >= 0)
        used[pg->grad_norm] = true;
    for (int k = 0; k < pg->noutputs; k++)
        used[pg->outputs[k]] = true;
    for (int k = 0; k < pg->nstats; k++)
        used[pg->stats[k]] = true;
    for (int b = 0; b < pg->nbufs; b++) {
        used[b] |= pg->bufs[b].kind != PTC_BUF_TEMP && pg->bufs[b].view < 0;
        if (used[b] && pg->bufs[b].view >= 0)
            used[pg->bufs[b].view] = true;
    }
    int n = 0;
    for (int b = 0; b < pg->nbufs; b++) {
        map[b] = used[b] ? n : -1;
        if (used[b])
            pg->bufs[n++] = pg->bufs[b];
    }
    pg->nbufs = n;
    for (int b = 0; b < n; b++)
        if (pg->bufs[b].view >= 0)
            pg->bufs[b].view = map[pg->bufs[b].view];
    for (int i = 0; i < pg->ninstrs; i++) {
        for (int k = 0; k < pg->instrs[i].nin; k++)
            pg->instrs[i].in[k] = map[pg->instrs[i].in[k]];
        for (int k = 0; k < pg->instrs[i].nout; k++)
            pg->instrs[i].out[k] = map[pg->instrs[i].out[k]];
    }
    if (pg->loss >= 0)
        pg->loss = map[pg->loss];
    if (pg->grad_norm >= 0)
        pg->grad_norm = map[pg->grad_norm];
    for (int k = 0; k < pg->noutputs; k++)
        pg->outputs[k] = map[pg->outputs[k]];
    for (int k = 0; k < pg->nstats; k++)
        pg->stats[k] = map[pg->stats[k]];
    (void)p;
    free(used);
    free(map);
}

static void fuse_program(ptc_plan *p, ptc_program *pg, struct khashes *kh, int head_chunks)
{
    fz z = {.p = p, .pg = pg, .old = pg->instrs, .nold = pg->ninstrs, .kh = kh,
            .head_chunks = head_chunks};
    analyse(&z);
    int n = pg->ninstrs;
    group *groups = ptc_xmalloc(sizeof(group) * (size_t)(n ? n : 1));
    int ng = 0;
    for (int i = 0; i < n;) {
        int len;
        uint64_t seed = 0, inner = 0;
        group hg;
        if ((len = fz_head_at(&z, i, &hg)) > 0)
            groups[ng++] = hg;
        else if ((len = fz_ce_at(&z, i, &seed)) > 0)
            groups[ng++] = (group){.first = i, .n = len, .kind = G_CE, .seed = seed};
        else if ((len = fz_ce16_at(&z, i, &seed, &inner)) > 0)
            groups[ng++] =
                (group){.first = i, .n = len, .kind = G_CE, .seed = seed, .inner = inner};
        else if ((len = adamw_at(&z, i)) > 0)
            groups[ng++] = (group){.first = i, .n = len, .kind = G_ADAMW};
        else if ((len = chain_at(&z, i)) > 0)
            groups[ng++] = (group){.first = i, .n = len, .kind = G_CHAIN};
        i += len > 0 ? len : 1;
    }
    remat *rs = ptc_xmalloc(sizeof(remat) * (size_t)(n ? n : 1));
    int nr = 0;
    bool *grouped = ptc_xcalloc((size_t)(n ? n : 1), sizeof(bool));
    for (int q = 0; q < ng; q++) /* (of a head: its cross-entropy; the rest runs as it was) */
        for (int m = groups[q].kind == G_HEAD; m < groups[q].n; m++)
            grouped[groups[q].first + m] = groups[q].kind != G_HEAD || m <= groups[q].ce_n;
    for (int q = 0; q < ng; q++)
        for (int m = 0; groups[q].kind == G_CHAIN && m < groups[q].n; m++)
            if (find_remat(&z, &groups[q], m, &rs[nr])) {
                find_remat_grad(&z, grouped, &rs[nr]);
                for (int e = 0; e < nr; e++) /* one recomputation takes a gradient */
                    if (rs[e].grad == rs[nr].grad)
                        rs[nr].grad = -1;
                nr++;
            }
    free(grouped);
    /* a head whose GEMMs a recomputation would rename keeps one chunk (its cross-entropy fuses) */
    for (int q = 0; q < ng; q++)
        if (groups[q].kind == G_HEAD && fz_head_remat(&z, &groups[q], rs, nr))
            groups[q] = (group){.first = groups[q].first + 1, .n = groups[q].ce_n, .kind = G_CE,
                                .seed = groups[q].seed};
    if (!ng) {
        free(rs);
        free(groups);
        free(z.last_read);
        free(z.keep);
        compact(p, pg); /* (the buffers of casts ptc_plan_fold_casts folded) */
        return;
    }
    /* rebuild the instruction list; the old one (operand arrays in the arena) stays readable
     * while the groups are built from it */
    ptc_instr *old = pg->instrs;
    bool *in_eval = ptc_xcalloc((size_t)(n ? n : 1), sizeof(bool));
    for (int k = 0; k < pg->neval; k++)
        in_eval[pg->eval[k]] = true;
    int64_t cap = 2 * (int64_t)n + 1; /* (a head's chunks: four instructions each) */
    for (int q = 0; q < ng; q++)
        if (groups[q].kind == G_HEAD) {
            const ptc_instr *fw = ins(&z, groups[q].first);
            cap += 4 * ((fw->gemm.m + groups[q].rows - 1) / groups[q].rows) + 2;
        }
    int *new_eval = ptc_xmalloc(sizeof(int) * (size_t)cap);
    int neval = 0;
    pg->instrs = NULL;
    pg->ninstrs = pg->capinstrs = 0;
    int gi = 0;
    for (int i = 0; i < n;) {
        int before = pg->ninstrs;
        bool eval = false;
        if (gi < ng && groups[gi].first == i && groups[gi].kind == G_HEAD) {
            const group *g = &groups[gi++];
            fz_emit_head(&z, g, old, in_eval, new_eval, &neval, rs, nr);
            i += g->n;
            continue;
        }
        if (gi < ng && groups[gi].first == i && groups[gi].kind == G_CE) {
            /* the seed, the fused kernel and the mean of its row losses, where the loss was;
             * then what lay between the loss and its gradient, each as it was */
            const group *g = &groups[gi++];
            replace(&z, g, old, p->nkernels);
            for (int k = before; k < pg->ninstrs && in_eval[i]; k++)
                new_eval[neval++] = k;
            for (int m = 1; m < g->n - 1; m++) {
                if ((g->seed | g->inner) >> m & 1)
                    continue;
                int at = pg->ninstrs;
                for (int q = 0; q < nr; q++)
                    if (rs[q].at == i + m)
                        fz_emit_remat(&z, &rs[q], &old[i + m], p->nkernels);
                if (!fz_merged_grad(rs, nr, i + m))
                    fz_add_rewritten(&z, &old[i + m], rs, nr);
                for (int k = at; k < pg->ninstrs && in_eval[i + m]; k++)
                    new_eval[neval++] = k;
            }
            i += g->n;
            continue;
        }
        if (gi < ng && groups[gi].first == i) {
            for (int m = 0; m < groups[gi].n; m++)
                eval |= in_eval[i + m];
            replace(&z, &groups[gi], old, p->nkernels);
            i += groups[gi++].n;
        } else {
            eval = in_eval[i];
            for (int q = 0; q < nr; q++)
                if (rs[q].at == i)
                    fz_emit_remat(&z, &rs[q], &old[i], p->nkernels);
            if (!fz_merged_grad(rs, nr, i))
                fz_add_rewritten(&z, &old[i], rs, nr);
            i++;
        }
        for (int k = before; k < pg->ninstrs; k++)
            if (eval)
                new_eval[neval++] = k;
    }
    if (pg->neval) {
        pg->eval = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)(neval ? neval : 1));
        memcpy(pg->eval, new_eval, sizeof(int) * (size_t)neval);
        pg->neval = neval;
    }
    free(old);
    free(rs);
    free(in_eval);
    free(new_eval);
    free(groups);
    free(z.last_read);
    free(z.keep);
    compact(p, pg);
}

void ptc_plan_fuse(ptc_plan *p, int head_chunks)
{
    struct khashes kh = {0};
    for (int k = 0; k < p->nprograms; k++) {
        ptc_plan_fold_casts(&p->programs[k]);
        fuse_program(p, &p->programs[k], &kh, head_chunks);
    }
    if (head_chunks > 1 && !strstr(p->notes ? p->notes : "", "head: the logits"))
        p->notes = ptc_arena_printf(
            p->arena, "%s%shead: --head-chunks %d: no head here runs in chunks (that takes a "
                      "cross-entropy fused with the f32 or bf16 logits of one GEMM and that "
                      "GEMM's two gradients: not over tensor-parallel logits, fp16 ones or "
                      "microbatches)",
            p->notes ? p->notes : "", p->notes && *p->notes ? "\n" : "", head_chunks);
    free(kh.h);
}
