/* kir.c - building and verifying kernels of the kernel IR (see kir.h). */
#include "kir.h"

#include "half.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *const ptc_kx_names[PTC_NKX] = {
    [PTC_KX_MIN] = "min",   [PTC_KX_MAX] = "max",   [PTC_KX_SELECT] = "select",
    [PTC_KX_EXP] = "exp",   [PTC_KX_LOG] = "log",   [PTC_KX_SQRT] = "sqrt",
    [PTC_KX_TANH] = "tanh", [PTC_KX_SIN] = "sin",   [PTC_KX_COS] = "cos",
    [PTC_KX_FLOAT] = "float", [PTC_KX_SUM] = "sum",
    [PTC_KX_RBF16] = "round_bf16", [PTC_KX_RF16] = "round_f16",
    [PTC_KX_RMAX] = "maxr", [PTC_KX_NEG] = "neg",
};

ptc_kir *ptc_kir_new(const char *name)
{
    ptc_kir *k = ptc_xcalloc(1, sizeof *k);
    k->arena = ptc_arena_new();
    k->name = ptc_arena_strdup(k->arena, name);
    k->body = -1;
    k->open_first[0] = k->open_last[0] = -1;
    return k;
}

void ptc_kir_free(ptc_kir *k)
{
    if (!k)
        return;
    free(k->params);
    free(k->vars);
    free(k->x);
    free(k->s);
    ptc_arena_free(k->arena);
    free(k);
}

int ptc_kir_param(ptc_kir *k, const char *name, ptc_dtype dt, int64_t numel, bool out, int alias)
{
    PTC_GROW(k->params, k->capparams, k->nparams);
    ptc_kparam *p = &k->params[k->nparams];
    p->name = ptc_arena_strdup(k->arena, name);
    p->dtype = dt;
    p->numel = numel;
    p->out = out;
    p->alias = alias;
    p->local = false;
    return k->nparams++;
}

int ptc_kir_local(ptc_kir *k, const char *name, int64_t numel)
{
    int p = ptc_kir_param(k, name, PTC_F32, numel, true, -1);
    k->params[p].local = true;
    return p;
}

int ptc_kir_var(ptc_kir *k, const char *name, ptc_kt type)
{
    PTC_GROW(k->vars, k->capvars, k->nvars);
    ptc_kvar *v = &k->vars[k->nvars];
    v->name = name ? ptc_arena_strdup(k->arena, name) : ptc_arena_printf(k->arena, "t%d", k->nvars);
    v->type = (uint8_t)type;
    return k->nvars++;
}

static int new_x(ptc_kir *k, ptc_kx_kind kind, ptc_kt type)
{
    PTC_GROW(k->x, k->capx, k->nx);
    ptc_kx *x = &k->x[k->nx];
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)kind;
    x->type = (uint8_t)type;
    x->a = x->b = x->c = x->var = x->param = -1;
    return k->nx++;
}

int ptc_kx_f(ptc_kir *k, double v)
{
    int e = new_x(k, PTC_KX_FCONST, PTC_KT_F32);
    k->x[e].f = v;
    return e;
}

int ptc_kx_i(ptc_kir *k, int64_t v)
{
    int e = new_x(k, PTC_KX_ICONST, PTC_KT_I64);
    k->x[e].i = v;
    return e;
}

int ptc_kx_v(ptc_kir *k, int var)
{
    int e = new_x(k, PTC_KX_VAR, var >= 0 && var < k->nvars ? k->vars[var].type : PTC_KT_F32);
    k->x[e].var = var;
    return e;
}

int ptc_kx_load(ptc_kir *k, int param, int index)
{
    bool f = param >= 0 && param < k->nparams && k->params[param].dtype != PTC_I32;
    int e = new_x(k, PTC_KX_LOAD, f ? PTC_KT_F32 : PTC_KT_I64);
    k->x[e].param = param;
    k->x[e].a = index;
    return e;
}

static ptc_kt type_of(const ptc_kir *k, int e)
{
    return e >= 0 && e < k->nx ? (ptc_kt)k->x[e].type : PTC_KT_F32;
}

int ptc_kx_bin(ptc_kir *k, ptc_kx_kind kind, int a, int b)
{
    bool cmp = kind >= PTC_KX_LT && kind <= PTC_KX_NE;
    int e = new_x(k, kind, cmp ? PTC_KT_BOOL : type_of(k, a));
    k->x[e].a = a;
    k->x[e].b = b;
    return e;
}

int ptc_kx_un(ptc_kir *k, ptc_kx_kind kind, int a)
{
    int e = new_x(k, kind, kind == PTC_KX_FLOAT ? PTC_KT_F32 : type_of(k, a));
    k->x[e].a = a;
    return e;
}

int ptc_kx_select(ptc_kir *k, int c, int a, int b)
{
    int e = new_x(k, PTC_KX_SELECT, type_of(k, a));
    k->x[e].a = c;
    k->x[e].b = a;
    k->x[e].c = b;
    return e;
}

int ptc_kx_reduce(ptc_kir *k, ptc_kx_kind kind, int var, int extent, int body)
{
    int e = new_x(k, kind, type_of(k, body));
    k->x[e].var = var;
    k->x[e].a = extent;
    k->x[e].b = body;
    return e;
}

static int append(ptc_kir *k, ptc_ks_kind kind)
{
    PTC_GROW(k->s, k->caps, k->ns);
    int id = k->ns++;
    ptc_ks *s = &k->s[id];
    memset(s, 0, sizeof *s);
    s->kind = (uint8_t)kind;
    s->var = s->param = s->index = s->value = s->extent = s->body = s->next = -1;
    int d = k->depth;
    if (k->open_last[d] >= 0)
        k->s[k->open_last[d]].next = id;
    else
        k->open_first[d] = id;
    k->open_last[d] = id;
    if (d == 0)
        k->body = k->open_first[0];
    return id;
}

int ptc_kir_let(ptc_kir *k, int var, int value)
{
    int s = append(k, PTC_KS_LET);
    k->s[s].var = var;
    k->s[s].value = value;
    return s;
}

int ptc_kir_bind(ptc_kir *k, int value)
{
    int v = ptc_kir_var(k, NULL, type_of(k, value));
    ptc_kir_let(k, v, value);
    return ptc_kx_v(k, v);
}

void ptc_kir_store(ptc_kir *k, int param, int index, int value)
{
    int s = append(k, PTC_KS_STORE);
    k->s[s].param = param;
    k->s[s].index = index;
    k->s[s].value = value;
}

int ptc_kir_for(ptc_kir *k, const char *name, int extent, bool parallel)
{
    PTC_ASSERT(k->depth + 1 < (int)(sizeof k->open_first / sizeof k->open_first[0]));
    int v = ptc_kir_var(k, name, PTC_KT_I64);
    int s = append(k, PTC_KS_FOR);
    k->s[s].var = v;
    k->s[s].extent = extent;
    k->s[s].parallel = parallel;
    k->depth++;
    k->open_first[k->depth] = k->open_last[k->depth] = -1;
    return ptc_kx_v(k, v);
}

void ptc_kir_end(ptc_kir *k)
{
    PTC_ASSERT(k->depth > 0);
    int first = k->open_first[k->depth];
    k->depth--;
    k->s[k->open_last[k->depth]].body = first;
}

/* ---- verifier ---- */

typedef struct vk {
    const ptc_kir *k;
    char *defined; /* var -> 1 while in scope, 2 once bound (never again) */
    char *err;
    size_t errn;
} vk;

static int vbad(vk *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int vbad(vk *v, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ptc_fmt(v->err, v->errn, "kernel %s: %s", v->k->name, msg);
    return -1;
}

static int bind(vk *v, int var)
{
    if (var < 0 || var >= v->k->nvars)
        return vbad(v, "a name that is not declared");
    if (v->defined[var])
        return vbad(v, "'%s' is bound twice", v->k->vars[var].name);
    v->defined[var] = 1;
    return 0;
}

static int check_x(vk *v, int e);

static int want(vk *v, int e, ptc_kt t, const char *what)
{
    static const char *const tn[PTC_NKT] = {"f32", "i64", "bool"};
    if (check_x(v, e) < 0)
        return -1;
    if (v->k->x[e].type != t)
        return vbad(v, "%s must be %s, not %s", what, tn[t], tn[v->k->x[e].type]);
    return 0;
}

static int check_x(vk *v, int e)
{
    const ptc_kir *k = v->k;
    if (e < 0 || e >= k->nx)
        return vbad(v, "a missing expression");
    const ptc_kx *x = &k->x[e];
    ptc_kt t = (ptc_kt)x->type;
    switch ((ptc_kx_kind)x->kind) {
    case PTC_KX_FCONST: return t == PTC_KT_F32 ? 0 : vbad(v, "a float constant is not f32");
    case PTC_KX_ICONST: return t == PTC_KT_I64 ? 0 : vbad(v, "an integer constant is not i64");
    case PTC_KX_VAR:
        if (x->var < 0 || x->var >= k->nvars || v->defined[x->var] != 1)
            return vbad(v, "'%s' is used where it is not bound",
                        x->var >= 0 && x->var < k->nvars ? k->vars[x->var].name : "?");
        return t == k->vars[x->var].type ? 0 : vbad(v, "'%s' has the wrong type", k->vars[x->var].name);
    case PTC_KX_LOAD:
        if (x->param < 0 || x->param >= k->nparams)
            return vbad(v, "a load from no parameter");
        if (t != (k->params[x->param].dtype != PTC_I32 ? PTC_KT_F32 : PTC_KT_I64))
            return vbad(v, "a load from '%s' has the wrong type", k->params[x->param].name);
        return want(v, x->a, PTC_KT_I64, "an index");
    case PTC_KX_ADD:
    case PTC_KX_SUB:
    case PTC_KX_MUL:
    case PTC_KX_DIV:
    case PTC_KX_REM:
    case PTC_KX_MIN:
    case PTC_KX_MAX:
    case PTC_KX_LT:
    case PTC_KX_LE:
    case PTC_KX_EQ:
    case PTC_KX_NE: {
        if (check_x(v, x->a) < 0)
            return -1;
        ptc_kt ta = (ptc_kt)k->x[x->a].type;
        if (ta == PTC_KT_BOOL || want(v, x->b, ta, "both operands of an operator") < 0)
            return ta == PTC_KT_BOOL ? vbad(v, "arithmetic on a bool") : -1;
        if (x->kind == PTC_KX_REM && ta != PTC_KT_I64)
            return vbad(v, "%% needs integers");
        bool cmp = x->kind >= PTC_KX_LT;
        return t == (cmp ? PTC_KT_BOOL : ta) ? 0 : vbad(v, "an operator has the wrong type");
    }
    case PTC_KX_SELECT:
        if (want(v, x->a, PTC_KT_BOOL, "a select's condition") < 0 || check_x(v, x->b) < 0 ||
            want(v, x->c, (ptc_kt)k->x[x->b].type, "both values of a select") < 0)
            return -1;
        return t == k->x[x->b].type ? 0 : vbad(v, "a select has the wrong type");
    case PTC_KX_NEG:
        if (check_x(v, x->a) < 0)
            return -1;
        return t == k->x[x->a].type && t != PTC_KT_BOOL ? 0 : vbad(v, "a bad negation");
    case PTC_KX_EXP:
    case PTC_KX_LOG:
    case PTC_KX_SQRT:
    case PTC_KX_TANH:
    case PTC_KX_SIN:
    case PTC_KX_COS:
    case PTC_KX_RBF16:
    case PTC_KX_RF16:
        if (want(v, x->a, PTC_KT_F32, ptc_kx_names[x->kind]) < 0)
            return -1;
        return t == PTC_KT_F32 ? 0 : vbad(v, "%s is not f32", ptc_kx_names[x->kind]);
    case PTC_KX_FLOAT:
        if (want(v, x->a, PTC_KT_I64, "float's operand") < 0)
            return -1;
        return t == PTC_KT_F32 ? 0 : vbad(v, "float is not f32");
    case PTC_KX_SUM:
    case PTC_KX_RMAX: {
        if (want(v, x->a, PTC_KT_I64, "a reduction's extent") < 0 || bind(v, x->var) < 0)
            return -1;
        if (k->vars[x->var].type != PTC_KT_I64)
            return vbad(v, "a reduction index must be i64");
        int rc = want(v, x->b, PTC_KT_F32, "a reduction's value");
        v->defined[x->var] = 2;
        return rc < 0 ? -1 : t == PTC_KT_F32 ? 0 : vbad(v, "a reduction is not f32");
    }
    default: return vbad(v, "an unknown expression kind %d", x->kind);
    }
}

static int check_list(vk *v, int s, int depth)
{
    const ptc_kir *k = v->k;
    int nbound = 0, bound[4096];
    int rc = 0;
    for (int guard = 0; s >= 0 && !rc; s = k->s[s].next, guard++) {
        if (s >= k->ns || guard > k->ns)
            return vbad(v, "a broken statement list");
        const ptc_ks *st = &k->s[s];
        switch (st->kind) {
        case PTC_KS_LET:
            if (check_x(v, st->value) < 0 || bind(v, st->var) < 0)
                return -1;
            if (k->vars[st->var].type != k->x[st->value].type)
                return vbad(v, "'%s' has the wrong type", k->vars[st->var].name);
            if (nbound < (int)(sizeof bound / sizeof bound[0]))
                bound[nbound++] = st->var;
            break;
        case PTC_KS_STORE: {
            if (st->param < 0 || st->param >= k->nparams)
                return vbad(v, "a store to no parameter");
            const ptc_kparam *p = &k->params[st->param];
            if (!p->out)
                return vbad(v, "a store to '%s', which is not an out parameter", p->name);
            if (want(v, st->index, PTC_KT_I64, "an index") < 0 ||
                want(v, st->value, p->dtype != PTC_I32 ? PTC_KT_F32 : PTC_KT_I64,
                     "a stored value") < 0)
                return -1;
            break;
        }
        case PTC_KS_FOR:
            if (st->parallel && depth > 0)
                return vbad(v, "parallel loop '%s' is not at the top level", k->vars[st->var].name);
            if (want(v, st->extent, PTC_KT_I64, "a loop extent") < 0 || bind(v, st->var) < 0)
                return -1;
            if (k->vars[st->var].type != PTC_KT_I64)
                return vbad(v, "a loop index must be i64");
            rc = check_list(v, st->body, depth + 1);
            v->defined[st->var] = 2;
            break;
        default: return vbad(v, "an unknown statement kind %d", st->kind);
        }
    }
    for (int i = 0; i < nbound; i++) /* out of scope: never again */
        v->defined[bound[i]] = 2;
    return rc;
}

int ptc_kir_verify(const ptc_kir *k, char *err, size_t errn)
{
    vk v = {.k = k, .err = err, .errn = errn};
    if (!k->name || !*k->name)
        return vbad(&v, "a kernel without a name");
    for (int p = 0; p < k->nparams; p++) {
        const ptc_kparam *pp = &k->params[p];
        if ((pp->dtype != PTC_F32 && pp->dtype != PTC_BF16 && pp->dtype != PTC_F16 &&
             pp->dtype != PTC_I32) ||
            pp->numel < 0)
            return vbad(&v, "parameter '%s' must be f32, bf16, f16 or i32 with a size", pp->name);
        for (int q = 0; q < p; q++)
            if (strcmp(k->params[q].name, pp->name) == 0)
                return vbad(&v, "two parameters named '%s'", pp->name);
        if (pp->local && (pp->dtype != PTC_F32 || !pp->out || pp->alias >= 0 || pp->numel < 1 ||
                          pp->numel > PTC_KIR_LOCAL_MAX))
            return vbad(&v, "local array '%s' must be f32 with 1 to %d elements", pp->name,
                        PTC_KIR_LOCAL_MAX);
        if (pp->alias >= 0) {
            const ptc_kparam *a = &k->params[pp->alias];
            if (pp->alias >= p || !pp->out || a->out || a->local || a->dtype != pp->dtype ||
                a->numel < pp->numel)
                return vbad(&v, "out parameter '%s' cannot share the bytes of '%s'", pp->name,
                            a->name);
        }
    }
    v.defined = ptc_xcalloc((size_t)(k->nvars ? k->nvars : 1), 1);
    int rc = check_list(&v, k->body, 0);
    free(v.defined);
    return rc;
}

/* ---- interpreter ---- */

typedef union kval {
    double f;
    int64_t i;
} kval;

/* The parallel-loop contract, checked (ptc_kir_run_checked). Each access is tagged with the part
 * of the kernel that makes it: iteration i of a top-level parallel loop over n, which one thread
 * of a target runs (the same thread for iteration i of every loop over n), or the top-level
 * statements, which every thread runs. Per element: the last write (its part and bits) and the
 * parts that read it. */
typedef struct kpart {
    int64_t n, i; /* n < 0: the top-level statements */
    int loop;     /* the loop statement (for the message) */
} kpart;

typedef struct kacc {
    const char *addr;          /* NULL: a free slot */
    kpart w, r;                /* the last write, the first read */
    bool written, read, reads; /* reads: read by two parts or more */
    uint32_t bits;             /* what the last write stored */
} kacc;

typedef struct kcheck {
    kacc *tab;
    size_t cap, used;
    kpart part; /* the part running now */
} kcheck;

typedef struct interp {
    const ptc_kir *k;
    void *const *args; /* (a local's slot: an array of the interpreter's own) */
    kval *vars;
    int tid, nt;
    bool failed;
    char *err;
    size_t errn;
    kcheck *chk; /* ptc_kir_run_checked's */
    bool locals; /* the kernel has local arrays */
} interp;

static bool in_bounds(interp *in, int param, int64_t i)
{
    if (i >= 0 && i < in->k->params[param].numel)
        return true;
    if (!in->failed)
        ptc_fmt(in->err, in->errn, "kernel %s: index %lld out of bounds of '%s' (%lld elements)",
                in->k->name, (long long)i, in->k->params[param].name,
                (long long)in->k->params[param].numel);
    in->failed = true;
    return false;
}

static size_t hash_ptr(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    return (size_t)(x ^ x >> 29);
}

static kacc *kacc_of(kcheck *c, const char *addr)
{
    if (2 * (c->used + 1) > c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 1024;
        kacc *t = ptc_xcalloc(cap, sizeof *t);
        for (size_t i = 0; i < c->cap; i++) {
            if (!c->tab[i].addr)
                continue;
            size_t j = hash_ptr(c->tab[i].addr) & (cap - 1);
            while (t[j].addr)
                j = (j + 1) & (cap - 1);
            t[j] = c->tab[i];
        }
        free(c->tab);
        c->tab = t;
        c->cap = cap;
    }
    for (size_t i = hash_ptr(addr) & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
        if (!c->tab[i].addr) {
            c->tab[i].addr = addr;
            c->used++;
            return &c->tab[i];
        }
        if (c->tab[i].addr == addr)
            return &c->tab[i];
    }
}

static bool same_part(kpart a, kpart b)
{
    return a.n == b.n && a.i == b.i;
}

static void put_part(const ptc_kir *k, kpart p, char *buf, size_t n)
{
    if (p.n < 0)
        ptc_fmt(buf, n, "the top-level statements (every thread)");
    else
        ptc_fmt(buf, n, "iteration %s=%lld of a parallel loop over %lld",
                k->vars[k->s[p.loop].var].name, (long long)p.i, (long long)p.n);
}

static void contract_broken(interp *in, int param, int64_t i, const char *what, kpart a,
                            const char *how, kpart b)
{
    char pa[160], pb[160];
    put_part(in->k, a, pa, sizeof pa);
    put_part(in->k, b, pb, sizeof pb);
    ptc_fmt(in->err, in->errn,
            "kernel %s: the parallel loops' iterations are not independent: '%s'[%lld] is %s by "
            "%s and %s by %s, which a target may run on another thread",
            in->k->name, in->k->params[param].name, (long long)i, what, pa, how, pb);
    in->failed = true;
}

/* an access to element i of param by the running part; for a store, bits are what it stores */
static void check_access(interp *in, int param, int64_t i, bool store, uint32_t bits)
{
    kcheck *c = in->chk;
    if (in->failed) /* (the first message stays) */
        return;
    size_t size = ptc_dtype_size(in->k->params[param].dtype);
    const char *addr = (const char *)in->args[param] + (size_t)i * size;
    kacc *a = kacc_of(c, addr);
    if (in->k->params[param].local) { /* each part's own: read only what the part wrote */
        if (store) {
            a->w = c->part, a->written = true;
        } else if (!a->written || !same_part(a->w, c->part)) {
            char pa[160];
            put_part(in->k, c->part, pa, sizeof pa);
            ptc_fmt(in->err, in->errn,
                    "kernel %s: local '%s'[%lld] is read by %s before it writes it (a local's "
                    "contents do not carry from one part of the kernel to the next)",
                    in->k->name, in->k->params[param].name, (long long)i, pa);
            in->failed = true;
        }
        return;
    }
    if (!store) {
        /* what another thread's part wrote (what every thread wrote, each wrote itself) */
        if (a->written && a->w.n >= 0 && !same_part(a->w, c->part)) {
            contract_broken(in, param, i, "written", a->w, "read", c->part);
            return;
        }
        if (!a->read)
            a->r = c->part, a->read = true;
        else if (!same_part(a->r, c->part))
            a->reads = true;
        return;
    }
    if (a->written && !same_part(a->w, c->part) && a->bits != bits) {
        contract_broken(in, param, i, "written", a->w, "written (another value)", c->part);
        return;
    }
    uint32_t now = 0;
    memcpy(&now, addr, size);
    if (a->read && (a->reads || !same_part(a->r, c->part)) && now != bits) {
        contract_broken(in, param, i, "read", a->r, "changed", c->part);
        return;
    }
    a->w = c->part, a->written = true, a->bits = bits;
}

static kval eval(interp *in, int e)
{
    const ptc_kx *x = &in->k->x[e];
    kval r = {.i = 0}, a, b;
    bool f = x->type == PTC_KT_F32;
    switch ((ptc_kx_kind)x->kind) {
    case PTC_KX_FCONST: r.f = x->f; return r;
    case PTC_KX_ICONST: r.i = x->i; return r;
    case PTC_KX_VAR: return in->vars[x->var];
    case PTC_KX_LOAD: {
        int64_t i = eval(in, x->a).i;
        if (!in_bounds(in, x->param, i))
            return r;
        if (in->chk)
            check_access(in, x->param, i, false, 0);
        if (in->k->params[x->param].dtype == PTC_F32)
            r.f = ((const float *)in->args[x->param])[i];
        else if (in->k->params[x->param].dtype == PTC_BF16)
            r.f = ptc_bf16_value(((const uint16_t *)in->args[x->param])[i]);
        else if (in->k->params[x->param].dtype == PTC_F16)
            r.f = ptc_f16_value(((const uint16_t *)in->args[x->param])[i]);
        else
            r.i = ((const int32_t *)in->args[x->param])[i];
        return r;
    }
    case PTC_KX_SELECT: return eval(in, x->a).i ? eval(in, x->b) : eval(in, x->c);
    case PTC_KX_SUM:
    case PTC_KX_RMAX: {
        int64_t n = eval(in, x->a).i;
        double acc = x->kind == PTC_KX_SUM ? 0.0 : -HUGE_VAL;
        for (int64_t j = 0; j < n && !in->failed; j++) {
            in->vars[x->var].i = j;
            double y = eval(in, x->b).f;
            acc = x->kind == PTC_KX_SUM ? acc + y : (y > acc || y != y ? y : acc);
        }
        r.f = acc;
        return r;
    }
    default: break;
    }
    a = eval(in, x->a);
    bool fa = in->k->x[x->a].type == PTC_KT_F32;
    if (x->kind >= PTC_KX_NEG) {
        switch (x->kind) {
        case PTC_KX_NEG:
            if (f)
                r.f = -a.f;
            else
                r.i = -a.i;
            return r;
        case PTC_KX_EXP: r.f = exp(a.f); return r;
        case PTC_KX_LOG: r.f = log(a.f); return r;
        case PTC_KX_SQRT: r.f = sqrt(a.f); return r;
        case PTC_KX_TANH: r.f = tanh(a.f); return r;
        case PTC_KX_SIN: r.f = sin(a.f); return r;
        case PTC_KX_COS: r.f = cos(a.f); return r;
        case PTC_KX_RBF16: r.f = ptc_round_bf16((float)a.f); return r; /* (as f32, then bf16) */
        case PTC_KX_RF16: r.f = ptc_round_f16((float)a.f); return r;
        default: r.f = (double)a.i; return r; /* float */
        }
    }
    b = eval(in, x->b);
    switch (x->kind) {
    case PTC_KX_ADD: return fa ? (kval){.f = a.f + b.f} : (kval){.i = a.i + b.i};
    case PTC_KX_SUB: return fa ? (kval){.f = a.f - b.f} : (kval){.i = a.i - b.i};
    case PTC_KX_MUL: return fa ? (kval){.f = a.f * b.f} : (kval){.i = a.i * b.i};
    case PTC_KX_DIV:
        if (fa)
            return (kval){.f = a.f / b.f};
        return (kval){.i = b.i ? a.i / b.i : 0};
    case PTC_KX_REM: return (kval){.i = b.i ? a.i % b.i : 0};
    case PTC_KX_MIN: return fa ? (kval){.f = a.f < b.f ? a.f : b.f} : (kval){.i = a.i < b.i ? a.i : b.i};
    case PTC_KX_MAX: return fa ? (kval){.f = a.f > b.f ? a.f : b.f} : (kval){.i = a.i > b.i ? a.i : b.i};
    case PTC_KX_LT: return (kval){.i = fa ? a.f < b.f : a.i < b.i};
    case PTC_KX_LE: return (kval){.i = fa ? a.f <= b.f : a.i <= b.i};
    case PTC_KX_EQ: return (kval){.i = fa ? a.f == b.f : a.i == b.i};
    default: return (kval){.i = fa ? a.f != b.f : a.i != b.i}; /* NE */
    }
}

/* a part of the kernel starts: its locals hold NaN (nothing carries from the last part) */
static void scrub_locals(interp *in)
{
    if (!in->locals) /* (most kernels: no scan of their parameters per part) */
        return;
    for (int p = 0; p < in->k->nparams; p++)
        if (in->k->params[p].local)
            memset(in->args[p], 0xff, 4 * (size_t)in->k->params[p].numel);
}

static void run_list(interp *in, int s, int depth)
{
    const ptc_kir *k = in->k;
    for (; s >= 0 && !in->failed; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        switch (st->kind) {
        case PTC_KS_LET: in->vars[st->var] = eval(in, st->value); break;
        case PTC_KS_STORE: {
            int64_t i = eval(in, st->index).i;
            kval v = eval(in, st->value);
            if (!in_bounds(in, st->param, i))
                return;
            uint32_t bits; /* f32; bf16 as f32, then bf16 */
            ptc_dtype dt = k->params[st->param].dtype;
            if (dt == PTC_F32) {
                float f = (float)v.f;
                memcpy(&bits, &f, 4);
            } else if (dt == PTC_BF16 || dt == PTC_F16) {
                bits = dt == PTC_BF16 ? ptc_bf16_bits((float)v.f) : ptc_f16_bits((float)v.f);
            } else {
                int32_t w = (int32_t)v.i;
                memcpy(&bits, &w, 4);
            }
            if (in->chk) {
                check_access(in, st->param, i, true, bits);
                if (in->failed)
                    return;
            }
            if (dt == PTC_BF16 || dt == PTC_F16)
                ((uint16_t *)in->args[st->param])[i] = (uint16_t)bits;
            else
                memcpy((char *)in->args[st->param] + 4 * (size_t)i, &bits, 4);
            break;
        }
        default: { /* for */
            int64_t n = eval(in, st->extent).i, lo = 0, hi = n;
            if (st->parallel && depth == 0) {
                lo = n * in->tid / in->nt;
                hi = n * (in->tid + 1) / in->nt;
            }
            bool part = st->parallel && depth == 0;
            for (int64_t j = lo; j < hi && !in->failed; j++) {
                in->vars[st->var].i = j;
                if (part)
                    scrub_locals(in);
                if (part && in->chk)
                    in->chk->part = (kpart){n, j, s};
                run_list(in, st->body, depth + 1);
            }
            if (part)
                scrub_locals(in);
            if (part && in->chk)
                in->chk->part = (kpart){-1, -1, -1};
        }
        }
    }
}

static int run(const ptc_kir *k, void *const *args, int tid, int nt, kcheck *chk, char *err,
               size_t errn)
{
    bool locals = false;
    for (int p = 0; p < k->nparams; p++)
        locals |= k->params[p].local;
    /* the locals: the interpreter's own, in place of their (ignored) arguments */
    void **a = NULL;
    if (locals) {
        a = ptc_xmalloc(sizeof(void *) * (size_t)k->nparams);
        for (int p = 0; p < k->nparams; p++)
            a[p] = k->params[p].local ? ptc_xmalloc(4 * (size_t)k->params[p].numel) : args[p];
    }
    interp in = {.k = k,
                 .args = locals ? a : args,
                 .tid = tid,
                 .nt = nt > 0 ? nt : 1,
                 .err = err,
                 .errn = errn,
                 .chk = chk,
                 .locals = locals};
    in.vars = ptc_xcalloc((size_t)(k->nvars ? k->nvars : 1), sizeof(kval));
    scrub_locals(&in);
    run_list(&in, k->body, 0);
    free(in.vars);
    for (int p = 0; locals && p < k->nparams; p++)
        if (k->params[p].local)
            free(a[p]);
    free(a);
    return in.failed ? -1 : 0;
}

int ptc_kir_run(const ptc_kir *k, void *const *args, int tid, int nt, char *err, size_t errn)
{
    return run(k, args, tid, nt, NULL, err, errn);
}

int ptc_kir_run_checked(const ptc_kir *k, void *const *args, char *err, size_t errn)
{
    kcheck c = {.part = {-1, -1, -1}};
    int rc = run(k, args, 0, 1, &c, err, errn);
    free(c.tab);
    return rc;
}
