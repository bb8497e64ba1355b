/* fold_casts.c - ops over 16-bit storage: under --precision the lowering widens every bf16 or
 * f16 operand of an op to an f32 copy and rounds its results back, a cast each. The kernels of the
 * ops of ptc_op_storage16 (attention and its gradient, concat, sum_to, sumsq, the norms'
 * gradients) read and write the 16-bit storage themselves (runtime/kernels/kernel.h). Where every
 * operand of such an op is a
 * copy of one 16-bit type that the op alone reads, and every result is rounded to that type by a
 * cast that alone reads it (sumsq's f32 sum stays f32), the casts fold into the op: it reads and
 * writes the 16-bit tensors, neither the f32 copies nor the f32 results are stored, and a step
 * makes none of those passes over memory.
 *
 * All or nothing per op: one cast that cannot fold (its copy read by another op too, its source
 * written between) leaves the op as it was.
 *
 * Assumes: a lowered program before fusion and memory planning (ptc_plan_fuse runs it first).
 * Guarantees: the same values (widening is exact; each result is rounded once, as its cast
 * rounded it), the eval entry renumbered over the instructions that remain.
 */
#include <stdlib.h>

#include "planner.h"

static bool is16(ptc_dtype t)
{
    return t == PTC_BF16 || t == PTC_F16;
}

typedef struct fa {
    ptc_program *pg;
    int *readers, *writers;  /* by root: how many instructions read (write) it */
    int *read_at, *written_at; /* by root: the last instruction that reads (writes) it */
    bool *keep;             /* by root: observable after the program */
} fa;

static int root(const fa *z, int b)
{
    return ptc_prog_root(z->pg, b);
}

static bool same_unit(const ptc_instr *a, const ptc_instr *b)
{
    return a->phase == b->phase && a->work == b->work && a->mb == b->mb &&
           a->vstage == b->vstage && a->recompute == b->recompute;
}

/* a plain temporary: its own bytes, contiguous, nothing after the program sees it */
static bool plain_temp(const fa *z, int b)
{
    const ptc_buffer *x = &z->pg->bufs[b];
    return x->view < 0 && x->view_axis < 0 && x->kind == PTC_BUF_TEMP && !z->keep[b];
}

static bool cast_of(const ptc_program *pg, const ptc_instr *c, ptc_dtype from, ptc_dtype to)
{
    return c->kind == PTC_INSTR_KERNEL && c->op == PTC_OP_CAST && c->nin == 1 && c->nout == 1 &&
           pg->bufs[c->in[0]].type.dtype == from && pg->bufs[c->out[0]].type.dtype == to;
}

/* Whether an instruction in (a, b) writes root r (or reads it, with `reads`). */
static bool touched_between(const fa *z, int a, int b, int r, bool reads)
{
    for (int i = a + 1; i < b; i++) {
        const ptc_instr *in = &z->pg->instrs[i];
        for (int k = 0; k < in->nout; k++)
            if (root(z, in->out[k]) == r)
                return true;
        for (int k = 0; k < in->nin && reads; k++)
            if (root(z, in->in[k]) == r)
                return true;
    }
    return false;
}

/* The one instruction that writes b itself (no view of it), before `before`, or -1. */
static int writer_of(const fa *z, int b, int before)
{
    int w = z->written_at[root(z, b)];
    const ptc_instr *in = w >= 0 ? &z->pg->instrs[w] : NULL;
    return z->writers[root(z, b)] == 1 && w < before && in->nout == 1 && in->out[0] == b ? w : -1;
}

/* The one instruction that reads b itself, after `after`, or -1. */
static int reader_of(const fa *z, int b, int after)
{
    int r = z->read_at[root(z, b)];
    const ptc_instr *in = r >= 0 ? &z->pg->instrs[r] : NULL;
    return z->readers[root(z, b)] == 1 && r > after && in->nin == 1 && in->in[0] == b ? r : -1;
}

/* Folds the casts around instruction i when it can, marking them in dead. */
static void fold(fa *z, int i, bool *dead)
{
    ptc_program *pg = z->pg;
    ptc_instr *at = &pg->instrs[i];
    int wid[8], nar[8];
    ptc_dtype t = 0;
    if (at->nin > 8 || at->nout > 8)
        return;
    for (int k = 0; k < at->nin; k++) {
        int b = at->in[k], c = plain_temp(z, b) && pg->bufs[b].type.dtype == PTC_F32 &&
                                       z->readers[b] == 1
                                   ? writer_of(z, b, i)
                                   : -1;
        if (c < 0 || dead[c])
            return;
        const ptc_instr *w = &pg->instrs[c];
        ptc_dtype src = pg->bufs[w->in[0]].type.dtype;
        if (!is16(src) || (t && src != t) || !cast_of(pg, w, src, PTC_F32) || !same_unit(w, at) ||
            touched_between(z, c, i, root(z, w->in[0]), false))
            return;
        for (int q = 0; q < k; q++) /* (one copy per operand) */
            if (wid[q] == c)
                return;
        t = src;
        wid[k] = c;
    }
    int nout = at->op == PTC_OP_SUMSQ ? 0 : at->nout; /* (an f32 sum) */
    if (!t)
        return;
    for (int k = 0; k < nout; k++) {
        int b = at->out[k], c = plain_temp(z, b) && pg->bufs[b].type.dtype == PTC_F32 &&
                                       z->writers[b] == 1
                                   ? reader_of(z, b, i)
                                   : -1;
        if (c < 0 || dead[c])
            return;
        const ptc_instr *n = &pg->instrs[c];
        int y = n->out[0];
        if (!cast_of(pg, n, PTC_F32, t) || !same_unit(n, at) || pg->bufs[y].view_axis >= 0 ||
            z->writers[root(z, y)] != 1 || touched_between(z, i, c, root(z, y), true))
            return;
        nar[k] = c;
    }
    for (int k = 0; k < at->nin; k++) {
        at->in[k] = pg->instrs[wid[k]].in[0];
        dead[wid[k]] = true;
    }
    for (int k = 0; k < nout; k++) {
        at->out[k] = pg->instrs[nar[k]].out[0];
        dead[nar[k]] = true;
    }
}

static void fold_program(ptc_program *pg)
{
    int n = pg->ninstrs, nb = pg->nbufs ? pg->nbufs : 1;
    fa z = {.pg = pg,
            .readers = calloc((size_t)nb, sizeof(int)),
            .writers = calloc((size_t)nb, sizeof(int)),
            .read_at = malloc(sizeof(int) * (size_t)nb),
            .written_at = malloc(sizeof(int) * (size_t)nb),
            .keep = calloc((size_t)nb, sizeof(bool))};
    bool *dead = calloc((size_t)(n ? n : 1), sizeof(bool));
    PTC_ASSERT(z.readers && z.writers && z.read_at && z.written_at && z.keep && dead);
    for (int b = 0; b < nb; b++)
        z.read_at[b] = z.written_at[b] = -1;
    for (int i = 0; i < n; i++) {
        const ptc_instr *in = &pg->instrs[i];
        for (int k = 0; k < in->nin; k++) {
            z.readers[root(&z, in->in[k])]++;
            z.read_at[root(&z, in->in[k])] = i;
        }
        for (int k = 0; k < in->nout; k++) {
            z.writers[root(&z, in->out[k])]++;
            z.written_at[root(&z, in->out[k])] = i;
        }
    }
    int ends[2] = {pg->loss, pg->grad_norm};
    for (int k = 0; k < 2; k++)
        if (ends[k] >= 0)
            z.keep[root(&z, ends[k])] = true;
    for (int k = 0; k < pg->noutputs; k++)
        z.keep[root(&z, pg->outputs[k])] = true;
    for (int k = 0; k < pg->nstats; k++)
        z.keep[root(&z, pg->stats[k])] = true;
    for (int i = 0; i < n; i++)
        if (pg->instrs[i].kind == PTC_INSTR_KERNEL && ptc_op_storage16(pg->instrs[i].op))
            fold(&z, i, dead);
    bool any = false;
    for (int i = 0; i < n; i++)
        any |= dead[i];
    if (any) {
        int *map = malloc(sizeof(int) * (size_t)(n ? n : 1)), m = 0;
        PTC_ASSERT(map);
        for (int i = 0; i < n; i++) {
            map[i] = dead[i] ? -1 : m;
            if (!dead[i])
                pg->instrs[m++] = pg->instrs[i];
        }
        pg->ninstrs = m;
        int ne = 0;
        for (int k = 0; k < pg->neval; k++)
            if (map[pg->eval[k]] >= 0)
                pg->eval[ne++] = map[pg->eval[k]];
        pg->neval = ne;
        free(map);
    }
    free(dead);
    free(z.readers);
    free(z.writers);
    free(z.read_at);
    free(z.written_at);
    free(z.keep);
}

void ptc_plan_fold_casts(ptc_program *pg)
{
    fold_program(pg);
}
