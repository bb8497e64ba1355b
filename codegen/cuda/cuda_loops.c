/* cuda_loops.c - how the kernel IR's loops map onto a GPU's threads (cuda_loops.h): which loops
 * are rows, which iterations may run on different threads, which loops take 16 bytes of an array
 * a thread, and the launch that follows. cuda_emit.c writes the CUDA C from these answers. */
#include "cuda_loops.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---- loops and reductions ---- */

bool ptc_cuda_is_reduce(const ptc_kx *x)
{
    return x->kind == PTC_KX_SUM || x->kind == PTC_KX_RMAX;
}

bool ptc_cuda_has_reduce(const ptc_kir *k, int x)
{
    if (x < 0)
        return false;
    const ptc_kx *e = &k->x[x];
    return ptc_cuda_is_reduce(e) || ptc_cuda_has_reduce(k, e->a) || ptc_cuda_has_reduce(k, e->b) ||
           ptc_cuda_has_reduce(k, e->c);
}

bool ptc_cuda_has_loop(const ptc_kir *k, int s)
{
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind == PTC_KS_FOR || ptc_cuda_has_reduce(k, st->value) ||
            (st->kind == PTC_KS_STORE && ptc_cuda_has_reduce(k, st->index)))
            return true;
    }
    return false;
}

static int64_t const_extent(const ptc_kir *k, int x, int64_t otherwise);

/* the reductions in x all run over at most n iterations, known when the kernel is built */
static bool reductions_within(const ptc_kir *k, int x, int64_t n)
{
    if (x < 0)
        return true;
    const ptc_kx *e = &k->x[x];
    if (ptc_cuda_is_reduce(e) && const_extent(k, e->a, n + 1) > n)
        return false;
    return reductions_within(k, e->a, n) && reductions_within(k, e->b, n) &&
           reductions_within(k, e->c, n);
}

#define THREAD_REDUCTION 32 /* the longest reduction a parallel iteration runs on one thread */

/* A parallel loop whose body reduces (or loops) runs a block per iteration, the block's threads
 * sharing each reduction and each inner loop, except where no statement of its body could use
 * them: no inner loop whose iterations are independent, no reduction over more than
 * THREAD_REDUCTION iterations. Then a thread per iteration, each reduction and loop in order on
 * its thread. kir_ops.c builds its column sums so (a thread per (chunk of rows, column), then a
 * thread per column over the chunks): a block per column has a warp read 32 rows of one column,
 * one 32-byte sector a float, and on an H200 sum_to and layernorm_grad took 3 to 15 times the
 * time of reading their operands once (docs/cuda.md). A loop whose iterations must run in order
 * (the embedding's gradient adding token after token) ran on thread 0 of each block, 1 thread in
 * 256. */
bool ptc_cuda_row_loop(const ptc_kir *k, const ptc_ks *st)
{
    if (!ptc_cuda_has_loop(k, st->body))
        return false;
    for (int s = st->body; s >= 0; s = k->s[s].next) {
        const ptc_ks *b = &k->s[s];
        if ((b->kind == PTC_KS_FOR && ptc_cuda_iterations_independent(k, b)) ||
            !reductions_within(k, b->value, THREAD_REDUCTION) ||
            (b->kind == PTC_KS_STORE && !reductions_within(k, b->index, THREAD_REDUCTION)))
            return true;
    }
    return false;
}

static bool x_eq(const ptc_kir *k, int a, int b)
{
    if (a == b)
        return true;
    if (a < 0 || b < 0)
        return false;
    const ptc_kx *p = &k->x[a], *q = &k->x[b];
    if (p->kind != q->kind || p->var != q->var || p->param != q->param)
        return false;
    if (p->kind == PTC_KX_FCONST)
        return p->f == q->f;
    if (p->kind == PTC_KX_ICONST)
        return p->i == q->i;
    return x_eq(k, p->a, q->a) && x_eq(k, p->b, q->b) && x_eq(k, p->c, q->c);
}

/* the parameter whose bytes param's are (itself, or the input an output is written over) */
int ptc_cuda_storage(const ptc_kir *k, int param)
{
    return k->params[param].alias >= 0 ? k->params[param].alias : param;
}

static bool store_matches(const ptc_kir *k, int list, int param, int index, bool *any)
{
    for (int s = list; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind == PTC_KS_FOR) {
            if (!store_matches(k, st->body, param, index, any))
                return false;
            continue;
        }
        if (st->kind == PTC_KS_STORE &&
            ptc_cuda_storage(k, st->param) == ptc_cuda_storage(k, param)) {
            *any = true;
            if (!x_eq(k, st->index, index))
                return false;
        }
    }
    return true;
}

/* whether expression x loads the storage of a store of list s at an index other than the
 * store's own */
static bool loads_other(const ptc_kir *k, int x, int list)
{
    if (x < 0)
        return false;
    const ptc_kx *e = &k->x[x];
    if (e->kind == PTC_KX_LOAD) {
        bool any = false;
        if (!store_matches(k, list, e->param, e->a, &any))
            return true;
    }
    return loads_other(k, e->a, list) || loads_other(k, e->b, list) || loads_other(k, e->c, list);
}

/* ---- whether the iterations of a loop may run on different threads ---- */

/* An index expression in the body of a loop over v, as c v + R: R (the rest) takes values at
 * most w apart within one iteration (over the loops nested in it). ok false: not of that form
 * as far as this can tell (a load of data, a division, a product of two varying terms, ...). */
typedef struct lin {
    bool ok;
    int64_t c, w;
} lin;

typedef struct lin_ctx {
    const ptc_kir *k;
    int v;        /* the loop's variable */
    int *let_of;  /* var -> the value its let binds (a let inside the loop), -1 */
    int64_t *ext; /* var -> a loop inside the loop: its extent if constant, else -1 */
    uint8_t *in;  /* var -> bound inside the loop (a let or a loop in its body) */
    uint8_t *wr;  /* storage -> stored inside the loop */
} lin_ctx;

#define LIN_NONE ((lin){false, 0, 0})
#define LIN_BIG ((int64_t)1 << 40) /* beyond this, nothing is claimed (no overflow) */

static bool invariant(lin l)
{
    return l.ok && l.c == 0 && l.w == 0;
}

static lin lin_checked(int64_t c, int64_t w)
{
    return c > -LIN_BIG && c < LIN_BIG && w < LIN_BIG ? (lin){true, c, w} : LIN_NONE;
}

static lin lin_of(const lin_ctx *lc, int x)
{
    if (x < 0)
        return (lin){true, 0, 0};
    const ptc_kx *e = &lc->k->x[x];
    switch (e->kind) {
    case PTC_KX_ICONST:
    case PTC_KX_FCONST: return (lin){true, 0, 0};
    case PTC_KX_VAR:
        if (e->var == lc->v)
            return (lin){true, 1, 0};
        if (!lc->in[e->var])
            return (lin){true, 0, 0}; /* bound outside: the same in every iteration */
        if (lc->let_of[e->var] >= 0)
            return lin_of(lc, lc->let_of[e->var]);
        return lc->ext[e->var] > 0 ? (lin){true, 0, lc->ext[e->var] - 1} : LIN_NONE;
    case PTC_KX_ADD:
    case PTC_KX_SUB: {
        lin a = lin_of(lc, e->a), b = lin_of(lc, e->b);
        if (!a.ok || !b.ok)
            return LIN_NONE;
        return lin_checked(e->kind == PTC_KX_ADD ? a.c + b.c : a.c - b.c, a.w + b.w);
    }
    case PTC_KX_MUL: {
        lin a = lin_of(lc, e->a), b = lin_of(lc, e->b);
        if (!a.ok || !b.ok)
            return LIN_NONE;
        if (invariant(a) && invariant(b))
            return a;
        /* a varying term times a constant m scales; times anything else, nothing is known */
        const ptc_kx *ka = &lc->k->x[e->a], *kb = &lc->k->x[e->b];
        if (ka->kind != PTC_KX_ICONST && kb->kind != PTC_KX_ICONST)
            return LIN_NONE;
        int64_t m = ka->kind == PTC_KX_ICONST ? ka->i : kb->i;
        lin o = ka->kind == PTC_KX_ICONST ? b : a;
        if (m == 0)
            return (lin){true, 0, 0};
        if (m <= -LIN_BIG || m >= LIN_BIG)
            return LIN_NONE;
        int64_t am = m < 0 ? -m : m;
        if (o.c > LIN_BIG / am || o.c < -LIN_BIG / am || o.w > LIN_BIG / am)
            return LIN_NONE;
        return lin_checked(o.c * m, o.w * am);
    }
    case PTC_KX_LOAD: /* data: the same in every iteration only at an invariant index of an
                         array the loop does not store */
        return invariant(lin_of(lc, e->a)) && !lc->wr[ptc_cuda_storage(lc->k, e->param)]
                   ? (lin){true, 0, 0}
                   : LIN_NONE;
    case PTC_KX_SUM:
    case PTC_KX_RMAX: return LIN_NONE;
    default: /* anything else of invariant operands is invariant */
        return invariant(lin_of(lc, e->a)) && invariant(lin_of(lc, e->b)) &&
                       invariant(lin_of(lc, e->c))
                   ? (lin){true, 0, 0}
                   : LIN_NONE;
    }
}

static void lin_scan(lin_ctx *lc, int s)
{
    const ptc_kir *k = lc->k;
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind == PTC_KS_LET) {
            lc->in[st->var] = 1;
            lc->let_of[st->var] = st->value;
        } else if (st->kind == PTC_KS_FOR) {
            lc->in[st->var] = 1;
            lc->ext[st->var] = const_extent(k, st->extent, -1);
            lin_scan(lc, st->body);
        } else {
            lc->wr[ptc_cuda_storage(k, st->param)] = 1;
        }
    }
}

/* every store of list s writes, over the loop, elements no other iteration writes: its index
 * c v + R with |c| past R's spread (so c v1 + R1 = c v2 + R2 gives v1 = v2), and one index
 * for all the stores of an array (all of body) */
static bool stores_disjoint(const lin_ctx *lc, int s, int body)
{
    const ptc_kir *k = lc->k;
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind == PTC_KS_FOR && !stores_disjoint(lc, st->body, body))
            return false;
        if (st->kind != PTC_KS_STORE)
            continue;
        lin l = lin_of(lc, st->index);
        bool any = false;
        if (!l.ok || l.c == 0 || l.w >= (l.c < 0 ? -l.c : l.c) ||
            !store_matches(k, body, st->param, st->index, &any))
            return false;
    }
    return true;
}

/* the loads of statements s (values, indices, lets, extents) read a stored array only where
 * their own iteration stores it */
static bool loads_own(const ptc_kir *k, int s, int body)
{
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind == PTC_KS_FOR) {
            if (loads_other(k, st->extent, body) || !loads_own(k, st->body, body))
                return false;
            continue;
        }
        if (loads_other(k, st->value, body) ||
            (st->kind == PTC_KS_STORE && loads_other(k, st->index, body)))
            return false;
    }
    return true;
}

/* Whether the iterations of loop st are independent: no element is stored by two of them, and
 * none reads an element another stores. An index that is data (an embedding's token row) or
 * that repeats across iterations is not independent, even where each iteration reads only what
 * it writes: two iterations would add into one element at once. */
bool ptc_cuda_iterations_independent(const ptc_kir *k, const ptc_ks *st)
{
    size_t nv = (size_t)(k->nvars > 0 ? k->nvars : 1),
           np = (size_t)(k->nparams > 0 ? k->nparams : 1);
    lin_ctx lc = {.k = k, .v = st->var};
    lc.let_of = malloc(nv * sizeof(int));
    lc.ext = malloc(nv * sizeof(int64_t));
    lc.in = calloc(nv, 1);
    lc.wr = calloc(np, 1);
    if (!lc.let_of || !lc.ext || !lc.in || !lc.wr)
        abort();
    for (size_t i = 0; i < nv; i++)
        lc.let_of[i] = -1, lc.ext[i] = -1;
    lin_scan(&lc, st->body);
    bool ok = stores_disjoint(&lc, st->body, st->body) && loads_own(k, st->body, st->body);
    free(lc.let_of);
    free(lc.ext);
    free(lc.in);
    free(lc.wr);
    return ok;
}

/* the storages expression x loads (inside its reductions too, unless skip_reduce) */
void ptc_cuda_x_reads(const ptc_kir *k, int x, bool skip_reduce, uint8_t *rd)
{
    if (x < 0)
        return;
    const ptc_kx *e = &k->x[x];
    if (skip_reduce && ptc_cuda_is_reduce(e))
        return;
    if (e->kind == PTC_KX_LOAD)
        rd[ptc_cuda_storage(k, e->param)] = 1;
    ptc_cuda_x_reads(k, e->a, skip_reduce, rd);
    ptc_cuda_x_reads(k, e->b, skip_reduce, rd);
    ptc_cuda_x_reads(k, e->c, skip_reduce, rd);
}

void ptc_cuda_list_access(const ptc_kir *k, int s, uint8_t *rd, uint8_t *wr)
{
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind == PTC_KS_FOR) {
            ptc_cuda_x_reads(k, st->extent, false, rd);
            ptc_cuda_list_access(k, st->body, rd, wr);
            continue;
        }
        ptc_cuda_x_reads(k, st->value, false, rd);
        if (st->kind == PTC_KS_STORE) {
            ptc_cuda_x_reads(k, st->index, false, rd);
            wr[ptc_cuda_storage(k, st->param)] = 1;
        }
    }
}

static int64_t const_extent(const ptc_kir *k, int x, int64_t otherwise)
{
    return k->x[x].kind == PTC_KX_ICONST ? k->x[x].i : otherwise;
}

/* ---- packets: 16 bytes of an array a thread ----
 *
 * A loop over a row's elements (a block's threads in step, or a block reduction) whose body
 * touches its arrays at base + v, v the loop's variable, takes vec consecutive elements a thread:
 * each such array's elements are loaded 16 bytes at a time into registers, the body runs vec
 * times over them (unrolled), and its stores leave 16 bytes at a time. Loaded 2 bytes a thread,
 * GPT-2's bf16 rows kept an H200 at a fifth of its memory bandwidth
 * (bench/results/gpu_profile_kinds_9959d00.txt). Every element is computed by the same
 * expressions as before; only the thread that takes it, and a sum's order, change. A loop over
 * all of a kernel's iterations (a thread each) is packed the same way. Each packed loop looks at
 * its arrays' addresses first: where one is not 16-byte aligned, it runs an element a thread as
 * before. */

static int elem_bytes(ptc_dtype dt)
{
    return dt == PTC_BF16 || dt == PTC_F16 ? 2 : 4;
}

static bool uses_var(const ptc_kir *k, int x, int v)
{
    if (x < 0)
        return false;
    const ptc_kx *e = &k->x[x];
    return (e->kind == PTC_KX_VAR && e->var == v) || uses_var(k, e->a, v) || uses_var(k, e->b, v) ||
           uses_var(k, e->c, v);
}

/* every value of x (integer) is a multiple of m */
static bool multiple_of(const ptc_kir *k, int x, int64_t m)
{
    const ptc_kx *e = &k->x[x];
    switch (e->kind) {
    case PTC_KX_ICONST: return e->i % m == 0;
    case PTC_KX_ADD:
    case PTC_KX_SUB:
    case PTC_KX_REM: return multiple_of(k, e->a, m) && multiple_of(k, e->b, m);
    case PTC_KX_MUL: return multiple_of(k, e->a, m) || multiple_of(k, e->b, m);
    default: return false;
    }
}

/* x is v + B, v once, B a sum of terms that do not use v nor a var bound by the loop's body
 * (inner) and a multiple of m */
static bool unit_stride(const ptc_kir *k, int x, int v, const uint8_t *inner, int64_t m)
{
    const ptc_kx *e = &k->x[x];
    if (e->kind == PTC_KX_VAR)
        return e->var == v;
    if (e->kind != PTC_KX_ADD)
        return false;
    bool ia = uses_var(k, e->a, v);
    if (ia == uses_var(k, e->b, v))
        return false;
    int rest = ia ? e->b : e->a;
    for (int i = 0; i < k->nvars; i++)
        if (inner[i] && uses_var(k, rest, i))
            return false;
    return unit_stride(k, ia ? e->a : e->b, v, inner, m) && multiple_of(k, rest, m);
}

int ptc_cuda_stream_of(const ptc_kir *k, const ptc_cuda_packet *pk, int param, int index,
                       bool store)
{
    for (int i = 0; i < pk->n; i++)
        if (pk->param[i] == param && pk->store[i] == store && x_eq(k, pk->index[i], index))
            return i;
    return -1;
}

/* collects x's loads at base + v (aligned to m elements) as streams; false: x cannot be packed
 * (a reduction in it, too many streams, or a load of an array the body has stored by then) */
static bool packet_loads(const ptc_kir *k, int x, int v, const uint8_t *inner,
                         const uint8_t *stored, int64_t m, ptc_cuda_packet *pk)
{
    if (x < 0)
        return true;
    const ptc_kx *e = &k->x[x];
    if (ptc_cuda_is_reduce(e))
        return false;
    if (e->kind == PTC_KX_LOAD) {
        if (stored[ptc_cuda_storage(k, e->param)])
            return false;
        if (unit_stride(k, e->a, v, inner, m) &&
            ptc_cuda_stream_of(k, pk, e->param, e->a, false) < 0) {
            if (pk->n == PACKET_STREAMS)
                return false;
            pk->param[pk->n] = e->param, pk->index[pk->n] = e->a, pk->store[pk->n++] = false;
        }
    }
    return packet_loads(k, e->a, v, inner, stored, m, pk) &&
           packet_loads(k, e->b, v, inner, stored, m, pk) &&
           packet_loads(k, e->c, v, inner, stored, m, pk);
}

/* The packet of a loop over v of extent x (statements body, or the reduced expression value if
 * body < 0) with m elements a thread: every store at base + v with its base a multiple of m,
 * no inner loop or reduction, no load of an array after a store to it. */
static bool packet_with(const ptc_kir *k, int v, int body, int value, int64_t m,
                        ptc_cuda_packet *pk)
{
    uint8_t *inner = ptc_xcalloc((size_t)k->nvars + (size_t)k->nparams + 1, 1);
    uint8_t *stored = inner + k->nvars;
    bool ok = true;
    pk->n = 0;
    if (body < 0)
        ok = packet_loads(k, value, v, inner, stored, m, pk);
    for (int s = body; s >= 0 && ok; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind == PTC_KS_FOR) {
            ok = false;
            break;
        }
        ok = packet_loads(k, st->value, v, inner, stored, m, pk);
        if (st->kind == PTC_KS_LET) {
            inner[st->var] = 1;
            continue;
        }
        ok = ok && packet_loads(k, st->index, v, inner, stored, m, pk) &&
             unit_stride(k, st->index, v, inner, m);
        if (ok && ptc_cuda_stream_of(k, pk, st->param, st->index, true) < 0) {
            ok = pk->n < PACKET_STREAMS;
            if (ok)
                pk->param[pk->n] = st->param, pk->index[pk->n] = st->index,
                pk->store[pk->n++] = true;
        }
        stored[ptc_cuda_storage(k, st->param)] = 1;
    }
    free(inner);
    return ok && pk->n > 0;
}

/* the packet of a loop over v of extent x (body, or value; see packet_with): 8 elements a thread
 * where an array is 16-bit, else 4; pk->vec 0 where the loop cannot be packed */
void ptc_cuda_packet_of(const ptc_kir *k, int v, int extent, int body, int value,
                        ptc_cuda_packet *pk)
{
    pk->vec = 0;
    int64_t w = const_extent(k, extent, -1);
    if (w <= 0 || !packet_with(k, v, body, value, 4, pk))
        return;
    int m = 4;
    for (int i = 0; i < pk->n; i++)
        if (elem_bytes(k->params[pk->param[i]].dtype) == 2)
            m = 8;
    if (m == 8 && !packet_with(k, v, body, value, 8, pk))
        return;
    if (w % m == 0)
        pk->vec = m;
}

/* the packet of a row's loop st (the threads of a block in step over independent iterations) */
void ptc_cuda_packet_of_for(const ptc_kir *k, const ptc_ks *st, ptc_cuda_packet *pk)
{
    pk->vec = 0;
    if (ptc_cuda_iterations_independent(k, st))
        ptc_cuda_packet_of(k, st->var, st->extent, st->body, -1, pk);
}

/* the packet of reduction x at a row's top level */
void ptc_cuda_packet_of_reduce(const ptc_kir *k, int x, ptc_cuda_packet *pk)
{
    const ptc_kx *e = &k->x[x];
    ptc_cuda_packet_of(k, e->var, e->a, -1, e->b, pk);
}

/* the widest loop or reduction at the top level of a row's body */
static int64_t row_width(const ptc_kir *k, int s);

static int64_t x_width(const ptc_kir *k, int x)
{
    if (x < 0)
        return 1;
    const ptc_kx *e = &k->x[x];
    int64_t w = 1;
    if (ptc_cuda_is_reduce(e)) {
        ptc_cuda_packet pk;
        ptc_cuda_packet_of_reduce(k, x, &pk);
        w = const_extent(k, e->a, 256) / (pk.vec ? pk.vec : 1);
    } else {
        int64_t a = x_width(k, e->a), b = x_width(k, e->b), c = x_width(k, e->c);
        w = a > b ? a : b;
        w = w > c ? w : c;
    }
    return w;
}

static int64_t row_width(const ptc_kir *k, int s)
{
    int64_t w = 1;
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        int64_t v;
        if (st->kind == PTC_KS_FOR) {
            ptc_cuda_packet pk;
            ptc_cuda_packet_of_for(k, st, &pk);
            v = const_extent(k, st->extent, 256) / (pk.vec ? pk.vec : 1);
        } else {
            v = x_width(k, st->value);
        }
        if (st->kind == PTC_KS_STORE) {
            int64_t i = x_width(k, st->index);
            v = v > i ? v : i;
        }
        w = w > v ? w : v;
    }
    return w;
}

void ptc_cuda_launch(const ptc_kir *k, const ptc_cuda_arch *arch, int *grid, int *block)
{
    bool flat = false;
    int64_t width = 1, blocks = 1;
    for (int s = k->body; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind != PTC_KS_FOR || !st->parallel)
            continue;
        if (ptc_cuda_row_loop(k, st)) {
            int64_t w = row_width(k, st->body);
            width = w > width ? w : width;
        } else {
            flat = true;
        }
    }
    int b = 256;
    if (!flat) {
        int64_t w = (width + 31) / 32 * 32;
        b = (int)(w < 32 ? 32 : w > 256 ? 256 : w);
    }
    for (int s = k->body; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind != PTC_KS_FOR || !st->parallel)
            continue;
        int64_t n = const_extent(k, st->extent, INT32_MAX);
        ptc_cuda_packet pk = {0};
        if (!ptc_cuda_row_loop(k, st))
            ptc_cuda_packet_of(k, st->var, st->extent, st->body, -1, &pk);
        int64_t g = ptc_cuda_row_loop(k, st) ? n : (n / (pk.vec ? pk.vec : 1) + b - 1) / b;
        blocks = g > blocks ? g : blocks;
    }
    int64_t wave = (int64_t)arch->sms * (2048 / b);
    *block = b;
    *grid = (int)(blocks < 1 ? 1 : blocks > wave ? wave : blocks);
}
