/* cuda_emit.c - kernels of the kernel IR as CUDA C (see cuda_emit.h for the mapping). */
#include "cuda_emit.h"
#include "cuda_loops.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

const ptc_cuda_arch ptc_cuda_archs[] = {{80, 108}, {90, 132}};
const int ptc_cuda_narchs = (int)(sizeof ptc_cuda_archs / sizeof ptc_cuda_archs[0]);

/* where a statement runs */
typedef enum {
    CX_TOP,    /* the kernel's top level: every thread */
    CX_FLAT,   /* one iteration of a flat loop: one thread */
    CX_BLOCK,  /* the top level of a row: every thread of the block, in step */
    CX_THREAD, /* inside a loop of a row, or sequential: one thread */
} ctx;

typedef struct em {
    const ptc_kir *k;
    FILE *f;
    int indent;
    /* CX_BLOCK: the storages (parameters, an output over an input counting as the input) read
     * and written by the block since its last barrier */
    uint8_t *rd, *wr;
    /* a group of flat loops emitted as one (see emit_group): the slot that stands for a
     * parameter (-1: its own name), and the table that stands for a float constant */
    int *slot, *ftab;
    /* inside a packed loop: its packet (loads and stores of its streams are pk_<i>[pk_u]) */
    const struct ptc_cuda_packet *pk;
} em;

static void ind(em *e)
{
    fprintf(e->f, "%*s", 4 * e->indent, "");
}

/* ---- expressions ---- */

static const char *ctype(uint8_t t)
{
    return t == PTC_KT_F32 ? "float" : t == PTC_KT_I64 ? "long long" : "int";
}

static void put_f(em *e, double v)
{
    float f = (float)v;
    if (isnan(f)) {
        fputs("PTC_NAN", e->f);
        return;
    }
    if (isinf(f)) {
        fputs(f > 0 ? "PTC_INF" : "(-PTC_INF)", e->f);
        return;
    }
    char buf[64];
    snprintf(buf, sizeof buf, "%.9g", (double)f);
    bool point = strpbrk(buf, ".e") != NULL;
    fprintf(e->f, "%s%s%sf%s", f < 0 ? "(" : "", buf, point ? "" : ".0", f < 0 ? ")" : "");
}

/* the C type of a parameter's elements */
static const char *elem_ctype(ptc_dtype dt)
{
    return dt == PTC_F32 ? "float" : dt == PTC_BF16 || dt == PTC_F16 ? "unsigned short" : "int";
}

static void put_param(em *e, int param)
{
    if (e->slot && e->slot[param] >= 0)
        fprintf(e->f, "s%d", e->slot[param]);
    else
        fprintf(e->f, "p_%s", e->k->params[param].name);
}

static void put_x(em *e, int x)
{
    const ptc_kir *k = e->k;
    const ptc_kx *p = &k->x[x];
    FILE *f = e->f;
    bool fl = p->a >= 0 && k->x[p->a].type == PTC_KT_F32;
    static const char *const op[PTC_NKX] = {
        [PTC_KX_ADD] = " + ", [PTC_KX_SUB] = " - ",  [PTC_KX_MUL] = " * ",  [PTC_KX_DIV] = " / ",
        [PTC_KX_REM] = " % ", [PTC_KX_LT] = " < ",   [PTC_KX_LE] = " <= ",  [PTC_KX_EQ] = " == ",
        [PTC_KX_NE] = " != ",
    };
    static const char *const fn[PTC_NKX] = {
        [PTC_KX_EXP] = "expf", [PTC_KX_LOG] = "logf", [PTC_KX_SQRT] = "sqrtf",
        [PTC_KX_TANH] = "tanhf", [PTC_KX_SIN] = "sinf", [PTC_KX_COS] = "cosf",
    };
    switch ((ptc_kx_kind)p->kind) {
    case PTC_KX_FCONST:
        if (e->ftab && e->ftab[x] >= 0)
            fprintf(f, "c%d", e->ftab[x]);
        else
            put_f(e, p->f);
        return;
    case PTC_KX_ICONST: fprintf(f, "%lldLL", (long long)p->i); return;
    case PTC_KX_VAR: fprintf(f, "v_%s", k->vars[p->var].name); return;
    case PTC_KX_LOAD: {
        ptc_dtype dt = k->params[p->param].dtype;
        fputs(dt == PTC_F32    ? ""
              : dt == PTC_BF16 ? "ptc_bf16_f("
              : dt == PTC_F16  ? "ptc_f16_f("
                               : "(long long)",
              f);
        int i = e->pk ? ptc_cuda_stream_of(k, e->pk, p->param, p->a, false) : -1;
        if (i >= 0) {
            fprintf(f, "pk_%d[pk_u]%s", i, dt == PTC_BF16 || dt == PTC_F16 ? ")" : "");
            return;
        }
        fputs("PTC_LD(", f);
        put_param(e, p->param);
        fputs(", ", f);
        put_x(e, p->a);
        fputs(dt == PTC_BF16 || dt == PTC_F16 ? "))" : ")", f);
        return;
    }
    case PTC_KX_SUM:
    case PTC_KX_RMAX: fprintf(f, "r%d", x); return;
    case PTC_KX_SELECT:
    case PTC_KX_MIN:
    case PTC_KX_MAX:
        if (p->kind == PTC_KX_SELECT) {
            fputc('(', f);
            put_x(e, p->a);
            fputs(" ? ", f);
            put_x(e, p->b);
            fputs(" : ", f);
            put_x(e, p->c);
            fputc(')', f);
            return;
        }
        if (fl) {
            fputs(p->kind == PTC_KX_MIN ? "fminf(" : "fmaxf(", f);
            put_x(e, p->a);
            fputs(", ", f);
            put_x(e, p->b);
            fputc(')', f);
            return;
        }
        fputs(p->kind == PTC_KX_MIN ? "PTC_IMIN(" : "PTC_IMAX(", f);
        put_x(e, p->a);
        fputs(", ", f);
        put_x(e, p->b);
        fputc(')', f);
        return;
    case PTC_KX_NEG: fputs("(-", f); put_x(e, p->a); fputc(')', f); return;
    case PTC_KX_FLOAT: fputs("(float)(", f); put_x(e, p->a); fputc(')', f); return;
    case PTC_KX_RBF16: fputs("ptc_round_bf16(", f); put_x(e, p->a); fputc(')', f); return;
    case PTC_KX_RF16: fputs("ptc_round_f16(", f); put_x(e, p->a); fputc(')', f); return;
    case PTC_KX_EXP:
    case PTC_KX_LOG:
    case PTC_KX_SQRT:
    case PTC_KX_TANH:
    case PTC_KX_SIN:
    case PTC_KX_COS:
        fprintf(f, "%s(", fn[p->kind]);
        put_x(e, p->a);
        fputc(')', f);
        return;
    default:
        fputc('(', f);
        put_x(e, p->a);
        fputs(op[p->kind], f);
        put_x(e, p->b);
        fputc(')', f);
        return;
    }
}

/* the loads (or stores) of packet pk's streams, with the loop's variable at pk_v */
static void stream_moves(em *e, const ptc_cuda_packet *pk, int var, bool store)
{
    const ptc_kir *k = e->k;
    bool any = false;
    for (int i = 0; i < pk->n; i++)
        any = any || pk->store[i] == store;
    if (!any)
        return;
    ind(e);
    fputs("{\n", e->f);
    e->indent++;
    ind(e);
    fprintf(e->f, "const long long v_%s = pk_v;\n", k->vars[var].name);
    for (int i = 0; i < pk->n; i++) {
        if (pk->store[i] != store)
            continue;
        ind(e);
        if (store) {
            fputs("PTC_STV(", e->f);
            put_param(e, pk->param[i]);
            fputs(", ", e->f);
            put_x(e, pk->index[i]);
            fprintf(e->f, ", pk_%d, %d);\n", i, pk->vec);
        } else {
            fprintf(e->f, "PTC_LDV(pk_%d, ", i);
            put_param(e, pk->param[i]);
            fputs(", ", e->f);
            put_x(e, pk->index[i]);
            fprintf(e->f, ", %d);\n", pk->vec);
        }
    }
    e->indent--;
    ind(e);
    fputs("}\n", e->f);
}

/* "if (<pk's arrays at 16-byte boundaries>) {" before a packed loop (open_packet) */
static void packet_if(em *e, const ptc_cuda_packet *pk)
{
    ind(e);
    fputs("if (((", e->f);
    for (int i = 0; i < pk->n; i++) {
        int first = 0;
        while (pk->param[first] != pk->param[i])
            first++;
        if (first < i)
            continue;
        fputs(i ? " | PTC_ADDR(" : "PTC_ADDR(", e->f);
        put_param(e, pk->param[i]);
        fputc(')', e->f);
    }
    fputs(") & 15) == 0) {\n", e->f);
    e->indent++;
}

/* "} else {" after a packed loop (close_packet), before the loop an element a thread; "}" (end)
 * after that */
static void packet_else(em *e, bool end)
{
    e->indent--;
    ind(e);
    fputs(end ? "}\n" : "} else {\n", e->f);
    e->indent += !end;
}

/* Opens packed loop pk over var < extent, a thread's first packet at element vec * from, the next
 * vec * step further, where its arrays are aligned: its streams loaded, then the unrolled loop
 * over the packet's elements, var bound to each. close_packet stores the streams, closes both
 * loops and opens the else branch, for the loop an element a thread; packet_else(e, true) closes
 * that. */
static void open_packet(em *e, const ptc_cuda_packet *pk, int var, int extent, const char *from,
                        const char *step)
{
    const ptc_kir *k = e->k;
    packet_if(e, pk);
    ind(e);
    fprintf(e->f, "for (long long pk_v = (long long)%s * %d; pk_v < ", from, pk->vec);
    put_x(e, extent);
    fprintf(e->f, "; pk_v += (long long)%s * %d) {\n", step, pk->vec);
    e->indent++;
    for (int i = 0; i < pk->n; i++) {
        ind(e);
        fprintf(e->f, "__align__(16) %s pk_%d[%d];\n", elem_ctype(k->params[pk->param[i]].dtype),
                i, pk->vec);
    }
    stream_moves(e, pk, var, false);
    ind(e);
    fprintf(e->f, "PTC_UNROLL for (int pk_u = 0; pk_u < %d; pk_u++) {\n", pk->vec);
    e->indent++;
    ind(e);
    fprintf(e->f, "PTC_UNUSED const long long v_%s = pk_v + pk_u;\n", k->vars[var].name);
    e->pk = pk;
}

static void close_packet(em *e, const ptc_cuda_packet *pk, int var)
{
    e->pk = NULL;
    e->indent--;
    ind(e);
    fputs("}\n", e->f);
    stream_moves(e, pk, var, true);
    e->indent--;
    ind(e);
    fputs("}\n", e->f);
    packet_else(e, false);
}

/* a step of reduction x: y, its operand at this iteration, into r<x> */
static void reduce_step(em *e, int x)
{
    const ptc_kx *p = &e->k->x[x];
    ind(e);
    fprintf(e->f, "float y = ");
    put_x(e, p->b);
    fputs(";\n", e->f);
    ind(e);
    fprintf(e->f, p->kind == PTC_KX_SUM ? "r%d += y;\n" : "r%d = y > r%d ? y : r%d;\n", x, x, x);
}

static void before(em *e, const uint8_t *rd, const uint8_t *wr);

/* Emits the reductions of expression x (outside those nested in another reduction, which are
 * emitted inside its loop) as statements binding r<id>. At the top level of a row (cx
 * CX_BLOCK) they are block reductions that every thread of the block must reach. */
static void emit_reductions(em *e, int x, ctx cx)
{
    if (x < 0)
        return;
    const ptc_kx *p = &e->k->x[x];
    if (!ptc_cuda_is_reduce(p)) {
        emit_reductions(e, p->a, cx);
        emit_reductions(e, p->b, cx);
        emit_reductions(e, p->c, cx);
        return;
    }
    bool sum = p->kind == PTC_KX_SUM, block = cx == CX_BLOCK;
    const char *v = e->k->vars[p->var].name;
    emit_reductions(e, p->a, cx);
    if (block) {
        int n = e->k->nparams;
        uint8_t *rd = ptc_xcalloc((size_t)n + 1, 2);
        ptc_cuda_x_reads(e->k, x, false, rd);
        before(e, rd, rd + n);
        free(rd);
    }
    ind(e);
    fprintf(e->f, "float r%d = %s;\n", x, sum ? "0.0f" : "PTC_LOWEST");
    ptc_cuda_packet pk = {0};
    if (block)
        ptc_cuda_packet_of_reduce(e->k, x, &pk);
    if (pk.vec) {
        open_packet(e, &pk, p->var, p->a, "threadIdx.x", "blockDim.x");
        reduce_step(e, x);
        close_packet(e, &pk, p->var);
    }
    ind(e);
    fprintf(e->f, "for (long long v_%s = %s; v_%s < ", v, block ? "threadIdx.x" : "0", v);
    put_x(e, p->a);
    fprintf(e->f, "; v_%s += %s) {\n", v, block ? "blockDim.x" : "1");
    e->indent++;
    emit_reductions(e, p->b, CX_THREAD);
    reduce_step(e, x);
    e->indent--;
    ind(e);
    fputs("}\n", e->f);
    if (pk.vec)
        packet_else(e, true);
    if (block) {
        ind(e);
        fprintf(e->f, "r%d = %s(r%d, ptc_smem);\n", x, sum ? "ptc_block_sum" : "ptc_block_max", x);
        /* its barriers come after every thread's part of the loop above */
        memset(e->rd, 0, (size_t)e->k->nparams);
        memset(e->wr, 0, (size_t)e->k->nparams);
    }
}

/* ---- statements ---- */

static void emit_list(em *e, int s, ctx cx);

static void sync(em *e)
{
    ind(e);
    fputs("__syncthreads();\n", e->f);
    memset(e->rd, 0, (size_t)e->k->nparams);
    memset(e->wr, 0, (size_t)e->k->nparams);
}

/* A statement of a row about to read rd and write wr: a barrier first if another thread of the
 * block may still read what it writes or have written what it reads or writes. */
static void before(em *e, const uint8_t *rd, const uint8_t *wr)
{
    int n = e->k->nparams;
    bool hazard = false;
    for (int i = 0; i < n && !hazard; i++)
        hazard = (wr[i] && (e->rd[i] || e->wr[i])) || (rd[i] && e->wr[i]);
    if (hazard)
        sync(e);
    for (int i = 0; i < n; i++) {
        e->rd[i] |= rd[i];
        e->wr[i] |= wr[i];
    }
}

/* before() for what statement st of a row reads (all of it, or outside its reductions) and
 * writes */
static void before_stmt(em *e, const ptc_ks *st, bool skip_reduce)
{
    int n = e->k->nparams;
    uint8_t *rd = ptc_xcalloc((size_t)n + 1, 2), *wr = rd + n;
    if (st->kind == PTC_KS_FOR) {
        ptc_cuda_x_reads(e->k, st->extent, false, rd);
        ptc_cuda_list_access(e->k, st->body, rd, wr);
    } else {
        ptc_cuda_x_reads(e->k, st->value, skip_reduce, rd);
        if (st->kind == PTC_KS_STORE) {
            ptc_cuda_x_reads(e->k, st->index, skip_reduce, rd);
            wr[ptc_cuda_storage(e->k, st->param)] = 1;
        }
    }
    before(e, rd, wr);
    free(rd);
}

static void open_loop(em *e, const ptc_ks *st, const char *from, const char *step)
{
    const char *v = e->k->vars[st->var].name;
    ind(e);
    fprintf(e->f, "for (long long v_%s = %s; v_%s < ", v, from, v);
    put_x(e, st->extent);
    fprintf(e->f, "; v_%s += %s) {\n", v, step);
    e->indent++;
}

static void close_loop(em *e)
{
    e->indent--;
    ind(e);
    fputs("}\n", e->f);
}

static bool aliased(const ptc_kir *k, int param);
static void close_loop(em *e);

/* ---- groups of flat loops of one shape (the multi-tensor AdamW) ----
 *
 * A kernel of the fusion pass may hold a run of flat loops whose bodies differ only in the
 * arrays they touch, their extents and some float constants (AdamW over every parameter: one loop
 * per tensor, weight decay 0 for some). Emitted one by one, gpt2's AdamW is a function of 150
 * loops that ptxas takes half a minute over; emitted as one body inside a loop over the members,
 * whose arrays, extent and constants a switch picks, it is small. Same order of the loops, same
 * arithmetic. */

typedef struct iso {
    const ptc_kir *k;
    int *pmap, *vmap, *xmap; /* the first loop's parameter/var/expression -> the member's; -1 */
} iso;

static bool iso_param(iso *m, int a, int b)
{
    const ptc_kir *k = m->k;
    if (m->pmap[a] >= 0)
        return m->pmap[a] == b;
    const ptc_kparam *p = &k->params[a], *q = &k->params[b];
    if (p->dtype != q->dtype || p->out != q->out || aliased(k, a) != aliased(k, b))
        return false;
    for (int i = 0; i < k->nparams; i++)
        if (m->pmap[i] == b)
            return false;
    m->pmap[a] = b;
    return true;
}

static bool iso_x(iso *m, int a, int b)
{
    if (a < 0 || b < 0)
        return a == b;
    const ptc_kx *x = &m->k->x[a], *y = &m->k->x[b];
    if (x->kind != y->kind || x->type != y->type)
        return false;
    m->xmap[a] = b;
    switch ((ptc_kx_kind)x->kind) {
    case PTC_KX_FCONST: return true; /* may differ: the switch sets it */
    case PTC_KX_ICONST: return x->i == y->i;
    case PTC_KX_VAR: return m->vmap[x->var] >= 0 ? m->vmap[x->var] == y->var : x->var == y->var;
    case PTC_KX_SUM:
    case PTC_KX_RMAX: return false;
    case PTC_KX_LOAD:
        if (!iso_param(m, x->param, y->param))
            return false;
        break;
    default: break;
    }
    return iso_x(m, x->a, y->a) && iso_x(m, x->b, y->b) && iso_x(m, x->c, y->c);
}

static bool iso_list(iso *m, int a, int b)
{
    const ptc_kir *k = m->k;
    for (; a >= 0 && b >= 0; a = k->s[a].next, b = k->s[b].next) {
        const ptc_ks *p = &k->s[a], *q = &k->s[b];
        if (p->kind != q->kind || p->kind == PTC_KS_FOR)
            return false;
        if (p->kind == PTC_KS_LET) {
            if (k->vars[p->var].type != k->vars[q->var].type || !iso_x(m, p->value, q->value))
                return false;
            m->vmap[p->var] = q->var;
        } else if (!iso_param(m, p->param, q->param) || !iso_x(m, p->index, q->index) ||
                   !iso_x(m, p->value, q->value)) {
            return false;
        }
    }
    return a < 0 && b < 0;
}

static bool is_flat(const ptc_kir *k, int s)
{
    const ptc_ks *st = &k->s[s];
    return st->kind == PTC_KS_FOR && st->parallel && !ptc_cuda_has_loop(k, st->body) &&
           k->x[st->extent].kind == PTC_KX_ICONST;
}

/* whether flat loop b has flat loop a's shape; m's maps are filled */
static bool same_shape(iso *m, int a, int b)
{
    const ptc_kir *k = m->k;
    memset(m->pmap, 0xff, sizeof(int) * (size_t)k->nparams);
    memset(m->vmap, 0xff, sizeof(int) * (size_t)k->nvars);
    memset(m->xmap, 0xff, sizeof(int) * (size_t)k->nx);
    m->vmap[k->s[a].var] = k->s[b].var;
    if (!iso_list(m, k->s[a].body, k->s[b].body))
        return false;
    for (int i = 0; i < k->nparams; i++) { /* an output over an input stays over it */
        int al = k->params[i].alias;
        if (m->pmap[i] >= 0 && al >= 0 && m->pmap[al] >= 0 && k->params[m->pmap[i]].alias != m->pmap[al])
            return false;
    }
    return true;
}

/* Emits the run of flat loops of one shape that starts at statement s, if it has 2 or more;
 * returns its last statement, or -1 (nothing emitted). */
static int emit_group(em *e, int s)
{
    const ptc_kir *k = e->k;
    int np = k->nparams, nx = k->nx;
    iso m = {.k = k, .pmap = ptc_xmalloc(sizeof(int) * ((size_t)np + 1)),
             .vmap = ptc_xmalloc(sizeof(int) * ((size_t)k->nvars + 1)),
             .xmap = ptc_xmalloc(sizeof(int) * ((size_t)nx + 1))};
    int n = 0, cap = 0, last = s, *members = NULL, *pm = NULL, *xm = NULL;
    for (int t = s; t >= 0 && is_flat(k, t) && same_shape(&m, s, t); t = k->s[t].next) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            members = ptc_xrealloc(members, sizeof(int) * (size_t)cap);
            pm = ptc_xrealloc(pm, sizeof(int) * (size_t)cap * (size_t)np);
            xm = ptc_xrealloc(xm, sizeof(int) * (size_t)cap * (size_t)nx);
        }
        members[n] = t;
        memcpy(pm + (size_t)n * np, m.pmap, sizeof(int) * (size_t)np);
        memcpy(xm + (size_t)n * nx, m.xmap, sizeof(int) * (size_t)nx);
        n++;
        last = t;
    }
    if (n < 2) {
        last = -1;
        goto done;
    }
    /* slots: the first loop's parameters; tables: its float constants some member changes */
    int nslots = 0, ntabs = 0;
    e->slot = ptc_xmalloc(sizeof(int) * ((size_t)np + 1));
    e->ftab = ptc_xmalloc(sizeof(int) * ((size_t)nx + 1));
    for (int i = 0; i < np; i++)
        e->slot[i] = pm[i] >= 0 ? nslots++ : -1;
    for (int x = 0; x < nx; x++) {
        e->ftab[x] = -1;
        for (int g = 1; g < n && xm[x] >= 0 && k->x[x].kind == PTC_KX_FCONST; g++)
            if ((float)k->x[xm[(size_t)g * nx + x]].f != (float)k->x[x].f) {
                e->ftab[x] = ntabs++;
                break;
            }
    }
    FILE *f = e->f;
    ind(e);
    fprintf(f, "for (int g = 0; g < %d; g++) { /* %d loops of one shape */\n", n, n);
    e->indent++;
    for (int i = 0; i < np; i++)
        if (e->slot[i] >= 0) {
            bool ro = !k->params[i].out && !aliased(k, i);
            ind(e);
            fprintf(f, "%s%s *%ss%d = 0;\n", ro ? "const " : "", elem_ctype(k->params[i].dtype),
                    aliased(k, i) ? "" : "PTC_RESTRICT ", e->slot[i]);
        }
    ind(e);
    fputs("long long n = 0;\n", f);
    for (int x = 0; x < nx; x++)
        if (e->ftab[x] >= 0) {
            ind(e);
            fprintf(f, "float c%d = 0.0f;\n", e->ftab[x]);
        }
    ind(e);
    fputs("switch (g) {\n", f);
    for (int g = 0; g < n; g++) {
        ind(e);
        fprintf(f, "case %d:", g);
        for (int i = 0; i < np; i++)
            if (e->slot[i] >= 0)
                fprintf(f, " s%d = p_%s;", e->slot[i], k->params[pm[(size_t)g * np + i]].name);
        fprintf(f, " n = %lldLL;", (long long)k->x[k->s[members[g]].extent].i);
        for (int x = 0; x < nx; x++)
            if (e->ftab[x] >= 0) {
                fprintf(f, " c%d = ", e->ftab[x]);
                put_f(e, k->x[xm[(size_t)g * nx + x]].f);
                fputc(';', f);
            }
        fputs(" break;\n", f);
    }
    ind(e);
    fputs("}\n", f);
    const char *v = k->vars[k->s[s].var].name;
    ind(e);
    fprintf(f, "for (long long v_%s = (long long)blockIdx.x * blockDim.x + threadIdx.x; v_%s < n; "
               "v_%s += (long long)gridDim.x * blockDim.x) {\n", v, v, v);
    e->indent++;
    emit_list(e, k->s[s].body, CX_FLAT);
    close_loop(e);
    close_loop(e);
    free(e->slot);
    free(e->ftab);
    e->slot = e->ftab = NULL;
done:
    free(members);
    free(pm);
    free(xm);
    free(m.pmap);
    free(m.vmap);
    free(m.xmap);
    return last;
}

static void emit_for(em *e, const ptc_ks *st, ctx cx)
{
    const ptc_kir *k = e->k;
    if (cx == CX_TOP && st->parallel) {
        if (ptc_cuda_row_loop(k, st)) { /* a row loop: a block per iteration */
            /* rows are independent (a parallel loop), so a row needs no barrier against the
             * row before; the reductions' own barriers keep their shared words apart */
            open_loop(e, st, "blockIdx.x", "gridDim.x");
            memset(e->rd, 0, (size_t)k->nparams);
            memset(e->wr, 0, (size_t)k->nparams);
            emit_list(e, st->body, CX_BLOCK);
            close_loop(e);
        } else { /* a thread per iteration (or per packet of them) */
            ptc_cuda_packet pk;
            ptc_cuda_packet_of(k, st->var, st->extent, st->body, -1, &pk);
            if (pk.vec) {
                open_packet(e, &pk, st->var, st->extent,
                            "((long long)blockIdx.x * blockDim.x + threadIdx.x)",
                            "((long long)gridDim.x * blockDim.x)");
                emit_list(e, st->body, CX_FLAT);
                close_packet(e, &pk, st->var);
            }
            open_loop(e, st, "(long long)blockIdx.x * blockDim.x + threadIdx.x",
                      "(long long)gridDim.x * blockDim.x");
            emit_list(e, st->body, CX_FLAT);
            close_loop(e);
            if (pk.vec)
                packet_else(e, true);
        }
        return;
    }
    if (cx == CX_BLOCK) {
        before_stmt(e, st, false);
        if (!ptc_cuda_iterations_independent(k, st)) { /* iterations in order, on one thread */
            ind(e);
            fputs("if (threadIdx.x == 0) {\n", e->f);
            e->indent++;
            open_loop(e, st, "0", "1");
            emit_list(e, st->body, CX_THREAD);
            close_loop(e);
            close_loop(e);
        } else {
            ptc_cuda_packet pk;
            ptc_cuda_packet_of_for(k, st, &pk);
            if (pk.vec) {
                open_packet(e, &pk, st->var, st->extent, "threadIdx.x", "blockDim.x");
                emit_list(e, st->body, CX_THREAD);
                close_packet(e, &pk, st->var);
            }
            open_loop(e, st, "threadIdx.x", "blockDim.x");
            emit_list(e, st->body, CX_THREAD);
            close_loop(e);
            if (pk.vec)
                packet_else(e, true);
        }
        return;
    }
    open_loop(e, st, "0", "1");
    emit_list(e, st->body, cx == CX_TOP ? CX_TOP : CX_THREAD);
    close_loop(e);
}

static void emit_store(em *e, const ptc_ks *st, ctx cx)
{
    const ptc_kparam *p = &e->k->params[st->param];
    emit_reductions(e, st->index, cx);
    emit_reductions(e, st->value, cx);
    if (cx == CX_BLOCK) {
        before_stmt(e, st, true);
        ind(e);
        fputs("if (threadIdx.x == 0)\n", e->f);
        e->indent++;
    }
    int i = e->pk ? ptc_cuda_stream_of(e->k, e->pk, st->param, st->index, true) : -1;
    ind(e);
    if (i >= 0) { /* into the packet's registers (close_packet stores them) */
        fprintf(e->f, "pk_%d[pk_u] = %s", i,
                p->dtype == PTC_F32    ? "("
                : p->dtype == PTC_BF16 ? "ptc_f_bf16("
                : p->dtype == PTC_F16  ? "ptc_f_f16("
                                       : "(int)(");
        put_x(e, st->value);
        fputs(");\n", e->f);
        return;
    }
    fputs("PTC_ST(", e->f);
    put_param(e, st->param);
    fputs(", ", e->f);
    put_x(e, st->index);
    fputs(p->dtype == PTC_F32    ? ", "
          : p->dtype == PTC_BF16 ? ", ptc_f_bf16("
          : p->dtype == PTC_F16  ? ", ptc_f_f16("
                                 : ", (int)(",
          e->f);
    put_x(e, st->value);
    fputs(p->dtype == PTC_F32 ? ");\n" : "));\n", e->f);
    if (cx == CX_BLOCK)
        e->indent--;
}

static void emit_list(em *e, int s, ctx cx)
{
    const ptc_kir *k = e->k;
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        switch (st->kind) {
        case PTC_KS_LET:
            emit_reductions(e, st->value, cx);
            if (cx == CX_BLOCK)
                before_stmt(e, st, true);
            ind(e);
            fprintf(e->f, "const %s v_%s = ", ctype(k->vars[st->var].type), k->vars[st->var].name);
            put_x(e, st->value);
            fputs(";\n", e->f);
            break;
        case PTC_KS_STORE: emit_store(e, st, cx); break;
        default: {
            int last = cx == CX_TOP && is_flat(k, s) ? emit_group(e, s) : -1;
            if (last >= 0)
                s = last;
            else
                emit_for(e, st, cx);
            break;
        }
        }
    }
}

/* ---- kernels ---- */

static bool aliased(const ptc_kir *k, int param)
{
    for (int i = 0; i < k->nparams; i++)
        if (k->params[i].alias == param || (i == param && k->params[i].alias >= 0))
            return true;
    return false;
}

/* whether a row of k reduces over the block (then it needs the shared words) */
static bool has_block_reduction(const ptc_kir *k)
{
    for (int s = k->body; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind != PTC_KS_FOR || !st->parallel || !ptc_cuda_row_loop(k, st))
            continue;
        for (int r = st->body; r >= 0; r = k->s[r].next)
            if (k->s[r].kind != PTC_KS_FOR &&
                (ptc_cuda_has_reduce(k, k->s[r].value) ||
                 (k->s[r].kind == PTC_KS_STORE && ptc_cuda_has_reduce(k, k->s[r].index))))
                return true;
    }
    return false;
}

void ptc_cuda_emit_kernel(const ptc_kir *k, FILE *f)
{
    for (int i = 0; i < k->nparams; i++)
        if (k->params[i].local) { /* (no kernel of a plan has them: the attention kernels do) */
            fprintf(f, "#error \"kernel %s: local arrays are not emitted as CUDA yet\"\n", k->name);
            return;
        }
    int block = 32;
    for (int a = 0; a < ptc_cuda_narchs; a++) {
        int g, b;
        ptc_cuda_launch(k, &ptc_cuda_archs[a], &g, &b);
        fprintf(f, "%s sm_%d: grid %d, block %d", a ? "," : "/* launch:", ptc_cuda_archs[a].sm, g, b);
        block = b > block ? b : block;
    }
    fputs(" */\n", f);
    fprintf(f, "PTC_KERNEL __launch_bounds__(%d) k_%s(", block, k->name);
    for (int i = 0; i < k->nparams; i++) {
        const ptc_kparam *p = &k->params[i];
        bool ro = !p->out && !aliased(k, i);
        fprintf(f, "%s%s%s *%sp_%s", i ? ", " : "", ro ? "const " : "", elem_ctype(p->dtype),
                aliased(k, i) ? "" : "PTC_RESTRICT ", p->name);
    }
    fputs(")\n{\n", f);
    em e = {.k = k, .f = f, .indent = 1};
    e.rd = ptc_xcalloc((size_t)k->nparams + 1, 2);
    e.wr = e.rd + k->nparams;
    if (has_block_reduction(k)) {
        ind(&e);
        fputs("__shared__ float ptc_smem[32];\n", f);
    }
    emit_list(&e, k->body, CX_TOP);
    free(e.rd);
    fputs("}\n", f);
    fprintf(f, "#ifdef PTC_CUDA_EMULATE\nvoid k_%s__emu(void *const *a)\n{\n    k_%s(", k->name,
            k->name);
    for (int i = 0; i < k->nparams; i++) {
        const ptc_kparam *p = &k->params[i];
        bool ro = !p->out && !aliased(k, i);
        fprintf(f, "%s(%s%s *)a[%d]", i ? ", " : "", ro ? "const " : "", elem_ctype(p->dtype), i);
    }
    fputs(");\n}\n#endif\n", f);
}

void ptc_cuda_emit_prelude(FILE *f)
{
    fputs("/* Generated by ptc: kernels of the kernel IR as CUDA C (codegen/cuda/cuda_emit.h).\n"
          " * Compiled by NVRTC at run time; `nvcc --ptx` takes it too; with cuda_emu.h included\n"
          " * first (PTC_CUDA_EMULATE) a host C compiler builds it for the emulation tests. */\n"
          "#ifndef PTC_CUDA_EMULATE\n"
          "#define PTC_KERNEL extern \"C\" __global__ void\n"
          "#define PTC_DEVICE __device__ __forceinline__\n"
          "#define PTC_RESTRICT __restrict__\n"
          "#define PTC_INF __int_as_float(0x7f800000)\n"
          "#define PTC_NAN __int_as_float(0x7fffffff)\n"
          "#define PTC_F2U(x) __float_as_uint(x)\n"
          "#define PTC_U2F(x) __uint_as_float(x)\n"
          "/* loads and stores (the emulation checks each one for a race) */\n"
          "#define PTC_LD(p, i) (p)[i]\n"
          "#define PTC_ST(p, i, v) ((p)[i] = (v))\n"
          "/* p[4i .. 4i + 3] in one 16-byte load (p 16-byte aligned) */\n"
          "#define PTC_LD4(p, i) (reinterpret_cast<const float4 *>(p)[i])\n",
          f);
    fputs("/* PTC_LDV(d, p, i, n): p[i .. i + n - 1] into the array d, 16 bytes a load (p + i\n"
          " * 16-byte aligned, d n elements of 16 bytes or 32); PTC_STV(p, i, d, n) the other "
          "way */\n"
          "#define PTC_LDV(d, p, i, n) \\\n"
          "    do { \\\n"
          "        for (int ptc_q = 0; ptc_q < (int)(sizeof(d) / 16); ptc_q++) \\\n"
          "            reinterpret_cast<uint4 *>(d)[ptc_q] = \\\n"
          "                reinterpret_cast<const uint4 *>((p) + (i))[ptc_q]; \\\n"
          "    } while (0)\n"
          "#define PTC_STV(p, i, d, n) \\\n"
          "    do { \\\n"
          "        for (int ptc_q = 0; ptc_q < (int)(sizeof(d) / 16); ptc_q++) \\\n"
          "            reinterpret_cast<uint4 *>((p) + (i))[ptc_q] = \\\n"
          "                reinterpret_cast<const uint4 *>(d)[ptc_q]; \\\n"
          "    } while (0)\n"
          "#define PTC_ADDR(p) ((unsigned long long)(p))\n"
          "#define PTC_UNROLL _Pragma(\"unroll\")\n"
          "#define PTC_UNUSED [[maybe_unused]] /* a packed loop's variable where only streams "
          "use it */\n"
          "#endif\n"
          "/* bf16 storage (2 bytes, the high half of an f32): loads widen, stores round to nearest\n"
          " * even, NaN to the quiet NaN of its sign (as common/half.c) */\n"
          "PTC_DEVICE float ptc_bf16_f(unsigned short h)\n"
          "{\n"
          "    return PTC_U2F((unsigned int)h << 16);\n"
          "}\n"
          "PTC_DEVICE unsigned short ptc_f_bf16(float v)\n"
          "{\n"
          "    unsigned int u = PTC_F2U(v);\n"
          "    if ((u & 0x7fffffffu) > 0x7f800000u)\n"
          "        return (unsigned short)(0x7fc0u | ((u >> 16) & 0x8000u));\n"
          "    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
          "}\n"
          "PTC_DEVICE float ptc_round_bf16(float v)\n"
          "{\n"
          "    return ptc_bf16_f(ptc_f_bf16(v));\n"
          "}\n"
          "/* f16 storage (IEEE half) in integer arithmetic, the same rounding (NaN: 0x7e00) */\n"
          "PTC_DEVICE float ptc_f16_f(unsigned short h)\n"
          "{\n"
          "    unsigned int o = (unsigned int)(h & 0x7fffu) << 13, e = o & 0x0f800000u;\n"
          "    o += 0x38000000u;\n"
          "    if (e == 0x0f800000u)\n"
          "        o += 0x38000000u;\n"
          "    else if (e == 0)\n"
          "        o = PTC_F2U(PTC_U2F(o + 0x00800000u) - PTC_U2F(0x38800000u));\n"
          "    return PTC_U2F(o | (unsigned int)(h & 0x8000u) << 16);\n"
          "}\n"
          "PTC_DEVICE unsigned short ptc_f_f16(float v)\n"
          "{\n"
          "    unsigned int u = PTC_F2U(v), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;\n"
          "    if (a > 0x7f800000u)\n"
          "        return 0x7e00;\n"
          "    if (a >= 0x477ff000u)\n"
          "        return (unsigned short)(sign | 0x7c00u);\n"
          "    if (a >= 0x38800000u)\n"
          "        return (unsigned short)(sign | ((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13));\n"
          "    return (unsigned short)(sign | (PTC_F2U(PTC_U2F(a) + 0.5f) - 0x3f000000u));\n"
          "}\n"
          "PTC_DEVICE float ptc_round_f16(float v)\n"
          "{\n"
          "    return ptc_f16_f(ptc_f_f16(v));\n"
          "}\n"
          "#define PTC_LOWEST (-3.40282347e+38f)\n"
          "#define PTC_IMIN(a, b) ((a) < (b) ? (a) : (b))\n"
          "#define PTC_IMAX(a, b) ((a) > (b) ? (a) : (b))\n"
          "\n"
          "/* Block reductions: a warp's lanes combine by shuffles, each warp's lane 0 leaves its\n"
          " * value in shared memory, and every thread adds the warps' values in warp order, so\n"
          " * all threads return the same bits. The first barrier lets an earlier reduction's\n"
          " * readers finish with the shared words. blockDim.x: a multiple of 32, at most 1024. */\n"
          "PTC_DEVICE float ptc_block_sum(float v, float *sm)\n"
          "{\n"
          "    for (int o = 16; o > 0; o >>= 1)\n"
          "        v += __shfl_xor_sync(0xffffffffu, v, o);\n"
          "    __syncthreads();\n"
          "    if ((threadIdx.x & 31) == 0)\n"
          "        PTC_ST(sm, threadIdx.x >> 5, v);\n"
          "    __syncthreads();\n"
          "    float s = 0.0f;\n"
          "    for (unsigned w = 0; w < blockDim.x >> 5; w++)\n"
          "        s += PTC_LD(sm, w);\n"
          "    return s;\n"
          "}\n"
          "\n"
          "PTC_DEVICE float ptc_block_max(float v, float *sm)\n"
          "{\n"
          "    for (int o = 16; o > 0; o >>= 1) {\n"
          "        float u = __shfl_xor_sync(0xffffffffu, v, o);\n"
          "        v = u > v ? u : v;\n"
          "    }\n"
          "    __syncthreads();\n"
          "    if ((threadIdx.x & 31) == 0)\n"
          "        PTC_ST(sm, threadIdx.x >> 5, v);\n"
          "    __syncthreads();\n"
          "    float m = PTC_LOWEST;\n"
          "    for (unsigned w = 0; w < blockDim.x >> 5; w++) {\n"
          "        const float u = PTC_LD(sm, w);\n"
          "        m = u > m ? u : m;\n"
          "    }\n"
          "    return m;\n"
          "}\n",
          f);
}

void ptc_cuda_emit_comm(FILE *f)
{
    ptc_cuda_emit_prelude(f);
    fprintf(f,
            "\n/* The device communicator's reduction (runtime/comm/inproc.h, ptrt_inproc_new_on),\n"
            " * its arguments a block of device memory: a[0] the destination, a[1] the length, a[2]\n"
            " * the number n of sources, a[3] op (0 sum, 1 max) | dtype << 8, a[4 .. 4 + n) the\n"
            " * sources. Element i is src0[i] op src1[i] op ... in float, left to right, rounded once\n"
            " * to the dtype: the in-process communicator's reduction, bit for bit. An address kept\n"
            " * in memory goes through PTC_DEVPTR (the host emulation's addresses carry a tag). */\n"
            "#ifndef PTC_CUDA_EMULATE\n"
            "#define PTC_DEVPTR(u) ((void *)(u))\n"
            "#endif\n"
            "PTC_DEVICE float ptc_comm_load(unsigned long long p, int dt, long long i)\n"
            "{\n"
            "    if (dt == %d)\n"
            "        return PTC_LD((const float *)PTC_DEVPTR(p), i);\n"
            "    unsigned short h = PTC_LD((const unsigned short *)PTC_DEVPTR(p), i);\n"
            "    return dt == %d ? ptc_bf16_f(h) : ptc_f16_f(h);\n"
            "}\n"
            "PTC_KERNEL __launch_bounds__(256) k_ptc_comm_reduce(const unsigned long long *PTC_RESTRICT a)\n"
            "{\n"
            "    long long len = (long long)a[1];\n"
            "    int n = (int)a[2], op = (int)(a[3] & 255u), dt = (int)(a[3] >> 8);\n"
            "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < len;\n"
            "         i += (long long)gridDim.x * blockDim.x) {\n"
            "        float acc = ptc_comm_load(a[4], dt, i);\n"
            "        for (int j = 1; j < n; j++) {\n"
            "            float v = ptc_comm_load(a[4 + j], dt, i);\n"
            "            acc = op ? (acc > v || acc != acc ? acc : v) : acc + v;\n"
            "        }\n"
            "        if (dt == %d)\n"
            "            PTC_ST((float *)PTC_DEVPTR(a[0]), i, acc);\n"
            "        else\n"
            "            PTC_ST((unsigned short *)PTC_DEVPTR(a[0]), i,\n"
            "                   dt == %d ? ptc_f_bf16(acc) : ptc_f_f16(acc));\n"
            "    }\n"
            "}\n"
            "#ifdef PTC_CUDA_EMULATE\n"
            "void k_ptc_comm_reduce__emu(void *const *a)\n"
            "{\n"
            "    k_ptc_comm_reduce((const unsigned long long *)a[0]);\n"
            "}\n"
            "#endif\n",
            (int)PTC_F32, (int)PTC_BF16, (int)PTC_F32, (int)PTC_BF16);
}

void ptc_cuda_emit_unit(ptc_kir *const *ks, int n, FILE *f)
{
    ptc_cuda_emit_prelude(f);
    for (int i = 0; i < n; i++) {
        fputc('\n', f);
        ptc_cuda_emit_kernel(ks[i], f);
    }
}
