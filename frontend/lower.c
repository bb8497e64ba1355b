/* lower.c - the AST of a .ptm file to the logical IR: declarations, statements, blocks, naming.
 *
 * Assumes: a parsed file (ast.h). Guarantees, on success: a graph with one INPUT per model
 * argument, one PARAM per parameter named by the language's rules (`h.3.attn.w_qkv`), every
 * `repeat` unrolled and every block call instantiated, shapes checked by the builder, g->loss set
 * to a scalar f32 and g->optim set. On any error: exactly one diagnostic (plus, for an error inside
 * a block instance, one note naming the instance) and no graph.
 *
 * Order of work: the declarations are checked (one model, at most one optimizer, no duplicates),
 * -D overrides are applied, consts are evaluated in file order, the optimizer and every block's
 * signature are evaluated, and then the model body is lowered, instantiating blocks on demand.
 *
 * Variables live on one stack of bindings. A block or the model opens a frame (callers' variables
 * are invisible); a repeat iteration truncates the stack back to its height when it ends, which is
 * exactly "assignments to outer variables carry, variables first assigned inside are local".
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "lower.h"

int ptc_lower_fail(ptc_lower *L, ptc_loc loc, const char *fmt, ...)
{
    if (L->failed)
        return -1;
    L->failed = true;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ptc_diag_error(L->diag, loc, "%s", msg);
    if (L->nchain > 0)
        L->err_instance = ptc_arena_strndup(L->arena, L->scope, L->scopelen);
    return -1;
}

int ptc_lower_step(ptc_lower *L, ptc_loc loc)
{
    if (++L->steps > PTC_FE_MAX_STEPS)
        return ptc_lower_fail(L, loc,
                              "model too large: more than %d statements and expressions "
                              "to lower after unrolling",
                              PTC_FE_MAX_STEPS);
    return 0;
}

/* The slot of (kind, name) in L->decls: the declaration, or the empty slot where it would go.
 * Names are interned, so the pointer is the key. */
static ptc_decl **decl_slot(const ptc_lower *L, ptc_decl_kind kind, const char *name)
{
    size_t mask = L->capdecls - 1;
    size_t h = (size_t)(((uintptr_t)name >> 3) * 0x9E3779B97F4A7C15ULL) ^ (size_t)kind;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        ptc_decl *d = L->decls[i];
        if (!d || (d->kind == kind && d->name == name))
            return &L->decls[i];
    }
}

ptc_decl *ptc_lower_find_decl(const ptc_lower *L, ptc_decl_kind kind, const char *name)
{
    return L->capdecls ? *decl_slot(L, kind, name) : NULL;
}

static size_t name_hash(const char *name)
{
    return (size_t)(((uintptr_t)name >> 3) * 0x9E3779B97F4A7C15ULL);
}

/* The slot of name in idx (idx->cap > 0): its own, or the empty one where it would go. */
static size_t name_slot(const ptc_name_index *idx, const char *name)
{
    size_t mask = idx->cap - 1, i = name_hash(name) & mask;
    while (idx->keys[i] && idx->keys[i] != name)
        i = (i + 1) & mask;
    return i;
}

int ptc_name_index_get(const ptc_name_index *idx, const char *name)
{
    if (!idx->cap)
        return -1;
    size_t i = name_slot(idx, name);
    return idx->keys[i] ? idx->top[i] : -1;
}

/* Makes entry `top` the newest of its name; returns the one it hides (-1: none). */
static int name_index_push(ptc_name_index *idx, const char *name, int top)
{
    if (2 * (idx->n + 1) > idx->cap) {
        ptc_name_index old = *idx;
        idx->cap = old.cap ? 2 * old.cap : 64;
        idx->keys = ptc_xcalloc(idx->cap, sizeof *idx->keys);
        idx->top = ptc_xmalloc(idx->cap * sizeof *idx->top);
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i]) {
                size_t j = name_slot(idx, old.keys[i]);
                idx->keys[j] = old.keys[i];
                idx->top[j] = old.top[i];
            }
        free(old.keys);
        free(old.top);
    }
    size_t i = name_slot(idx, name);
    int prev = -1;
    if (idx->keys[i])
        prev = idx->top[i];
    else
        idx->n++;
    idx->keys[i] = name;
    idx->top[i] = top;
    return prev;
}

/* Undoes name_index_push of name: prev becomes the newest again. */
static void name_index_pop(ptc_name_index *idx, const char *name, int prev)
{
    idx->top[name_slot(idx, name)] = prev;
}

static void name_index_free(ptc_name_index *idx)
{
    free(idx->keys);
    free(idx->top);
}

int ptc_lower_find_var(const ptc_lower *L, const char *name)
{
    int i = ptc_name_index_get(&L->varidx, name);
    return i >= L->frame ? i : -1;
}

/* Pops the variables above height; likewise the scoped names and the dead variables. */
static void vars_truncate(ptc_lower *L, int height)
{
    for (; L->nvars > height; L->nvars--)
        name_index_pop(&L->varidx, L->vars[L->nvars - 1].name, L->vars[L->nvars - 1].prev);
}

static void names_truncate(ptc_lower *L, int height)
{
    for (; L->nnames > height; L->nnames--)
        name_index_pop(&L->nameidx, L->names[L->nnames - 1].name, L->names[L->nnames - 1].prev);
}

static void dead_truncate(ptc_lower *L, int height)
{
    for (; L->ndead > height; L->ndead--)
        name_index_pop(&L->deadidx, L->dead[L->ndead - 1].name, L->dead[L->ndead - 1].prev);
}

/* ---- scopes and full names ---- */

static void scope_append(ptc_lower *L, const char *s, size_t n)
{
    while (L->scopelen + n + 1 > L->scopecap) {
        L->scopecap = L->scopecap ? L->scopecap * 2 : 256;
        L->scope = ptc_xrealloc(L->scope, L->scopecap);
    }
    memcpy(L->scope + L->scopelen, s, n);
    L->scopelen += n;
    L->scope[L->scopelen] = 0;
}

/* Enters scope NAME (or NAME.INDEX when index >= 0); returns what scope_leave needs. */
static size_t scope_enter(ptc_lower *L, const char *name, int64_t index)
{
    size_t old = L->scopelen;
    if (old)
        scope_append(L, ".", 1);
    scope_append(L, name, strlen(name));
    if (index >= 0) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, ".%lld", (long long)index);
        scope_append(L, buf, (size_t)n);
    }
    return old;
}

static void scope_leave(ptc_lower *L, size_t old)
{
    L->scopelen = old;
    if (L->scope)
        L->scope[old] = 0;
}

/* The full name of NAME in the current scope ("h.3.attn" + "w_qkv"). */
static const char *full_name(ptc_lower *L, const char *name)
{
    size_t n = L->scopelen + strlen(name) + 2;
    if (n > L->fullcap) {
        L->fullcap = n * 2;
        L->full = ptc_xrealloc(L->full, L->fullcap);
    }
    snprintf(L->full, L->fullcap, "%s%s%s", L->scopelen ? L->scope : "", L->scopelen ? "." : "",
             name);
    return L->full;
}

static const char *scope_words(ptc_lower *L, char *buf, size_t n)
{
    if (!L->scopelen)
        return ptc_fmt(buf, n, "the model");
    return ptc_fmt(buf, n, "scope '%.200s'", L->scope);
}

/* Takes NAME in the current scope for a param, a block instance or a repeat. */
static int take_name(ptc_lower *L, const char *name, const char *what, ptc_loc loc)
{
    int i = ptc_name_index_get(&L->nameidx, name);
    if (i >= L->nsbase) {
        const ptc_scoped *s = &L->names[i];
        char sc[256];
        scope_words(L, sc, sizeof sc);
        if (strcmp(what, "instance") == 0 && strcmp(s->what, "instance") == 0)
            return ptc_lower_fail(L, loc,
                                  "two block instances named '%s' in %s; give this one "
                                  "its own name with 'as', e.g. %s(...) as %s_2",
                                  name, sc, name, name);
        return ptc_lower_fail(L, loc, "the name '%s' is already taken in %s by the %s at line %d",
                              name, sc, s->what, s->loc.line);
    }
    PTC_GROW(L->names, L->capnames, L->nnames);
    int prev = name_index_push(&L->nameidx, name, L->nnames);
    L->names[L->nnames++] = (ptc_scoped){name, what, loc, prev};
    return 0;
}

/* ---- variables ---- */

static void bind(ptc_lower *L, const char *name, ptc_val v, ptc_loc loc)
{
    int i = ptc_lower_find_var(L, name);
    if (i >= 0) {
        L->vars[i].v = v;
        return;
    }
    PTC_GROW(L->vars, L->capvars, L->nvars);
    int prev = name_index_push(&L->varidx, name, L->nvars);
    L->vars[L->nvars++] = (ptc_binding){name, v, loc, prev};
}

/* Remembers the variables local to a repeat body (above `height`) for the unknown-name hint. */
static void remember_locals(ptc_lower *L, int height)
{
    for (int i = height; i < L->nvars; i++) {
        if (ptc_name_index_get(&L->deadidx, L->vars[i].name) >= L->deadbase)
            continue;
        PTC_GROW(L->dead, L->capdead, L->ndead);
        L->dead[L->ndead] = L->vars[i];
        L->dead[L->ndead].prev = name_index_push(&L->deadidx, L->vars[i].name, L->ndead);
        L->ndead++;
    }
}

/* ---- statements ---- */

typedef struct body_result {
    bool returned;
    ptc_val v;
    const ptc_expr *expr;
} body_result;

static int lower_body(ptc_lower *L, const ptc_stmt *s, bool in_repeat, body_result *r);

static const struct {
    const char *name;
    ptc_init_kind kind;
    int nargs;
    const char *args;
} inits[] = {
    {"zeros", PTC_INIT_ZEROS, 0, ""},
    {"ones", PTC_INIT_ONES, 0, ""},
    {"constant", PTC_INIT_CONSTANT, 1, " (the value)"},
    {"normal", PTC_INIT_NORMAL, 1, " (the standard deviation)"},
    {"uniform", PTC_INIT_UNIFORM, 2, " (LO, HI)"},
};

/* INIT: normal(STD) | uniform(LO, HI) | zeros | ones | constant(V) */
static int lower_init(ptc_lower *L, const ptc_stmt *s, ptc_init *out)
{
    size_t k = 0;
    while (k < sizeof inits / sizeof inits[0] && strcmp(inits[k].name, s->init) != 0)
        k++;
    if (k == sizeof inits / sizeof inits[0])
        return ptc_lower_fail(L, s->initloc,
                              "unknown init '%s' (expected normal(STD), "
                              "uniform(LO, HI), zeros, ones or constant(V))",
                              s->init);
    if (s->ninitargs != inits[k].nargs)
        return ptc_lower_fail(L, s->initloc, "%s takes %d argument%s%s, got %d", s->init,
                              inits[k].nargs, inits[k].nargs == 1 ? "" : "s", inits[k].args,
                              s->ninitargs);
    double v[2] = {0, 0};
    int i = 0;
    for (const ptc_arg *g = s->initargs; g; g = g->next, i++) {
        if (g->key)
            return ptc_lower_fail(L, g->keyloc, "the arguments of %s are positional", s->init);
        if (ptc_lower_num(L, g->value, "an init argument", &v[i]) < 0)
            return -1;
    }
    *out = (ptc_init){inits[k].kind, v[0], v[1]};
    if (out->kind == PTC_INIT_NORMAL && v[0] < 0)
        return ptc_lower_fail(L, s->initargs->value->loc,
                              "the standard deviation of normal must not be negative, got %.15g",
                              v[0]);
    if (out->kind == PTC_INIT_UNIFORM && v[0] > v[1])
        return ptc_lower_fail(L, s->initloc, "uniform(LO, HI) needs LO <= HI, got %.15g and %.15g",
                              v[0], v[1]);
    return 0;
}

/* param NAME : [DIMS] init INIT */
static int lower_param(ptc_lower *L, const ptc_stmt *s)
{
    int old = ptc_lower_find_var(L, s->name);
    if (old >= 0)
        return ptc_lower_fail(L, s->loc,
                              "'%s' is already a variable (line %d); a param needs a "
                              "name of its own",
                              s->name, L->vars[old].loc.line);
    ptc_type t;
    ptc_attrs at = ptc_attrs_default(PTC_OP_PARAM);
    if (take_name(L, s->name, "param", s->loc) < 0 || ptc_lower_type(L, s->type, false, &t) < 0 ||
        lower_init(L, s, &at.init) < 0)
        return -1;
    at.name = full_name(L, s->name);
    at.nshape = t.rank;
    memcpy(at.shape, t.dims, sizeof at.shape);
    int vid, n;
    if (ptc_lower_build(L, PTC_OP_PARAM, NULL, 0, &at, s->loc, &vid, 1, &n) < 0)
        return -1;
    /* each tensor is below 2^46 elements (the builder checked), so the sum cannot overflow */
    L->nparams += ptc_type_numel(&t);
    if (L->nparams > PTC_FE_MAX_PARAMS)
        return ptc_lower_fail(L, s->loc,
                              "model too large: with parameter '%s' (%lld elements) the model has "
                              "more than 2^46 parameters in all",
                              at.name, (long long)ptc_type_numel(&t));
    bind(L, s->name, (ptc_val){.vid = vid}, s->loc);
    return 0;
}

/* NAME, NAME, ... = EXPR */
static int lower_assign(ptc_lower *L, const ptc_stmt *s)
{
    if (s->nnames == 1) {
        ptc_val v;
        if (ptc_lower_expr(L, s->value, &v) < 0)
            return -1;
        bind(L, s->names->name, v, s->names->loc);
        return 0;
    }
    int vids[PTC_MAX_RESULTS], n;
    if (ptc_lower_multi(L, s->value, vids, PTC_MAX_RESULTS, &n) < 0)
        return -1;
    if (n != s->nnames) {
        if (n == 1)
            return ptc_lower_fail(L, s->value->loc,
                                  "this gives one value, but %d names are assigned", s->nnames);
        return ptc_lower_fail(L, s->value->loc, "%s returns %d values, but %d names are assigned",
                              s->value->name, n, s->nnames);
    }
    int k = 0;
    for (const ptc_ident *i = s->names; i; i = i->next)
        bind(L, i->name, (ptc_val){.vid = vids[k++]}, i->loc);
    return 0;
}

/* repeat COUNT as NAME { BODY } */
static int lower_repeat(ptc_lower *L, const ptc_stmt *s)
{
    int64_t n;
    if (ptc_lower_int(L, s->value, "the repeat count", &n) < 0)
        return -1;
    if (n < 0)
        return ptc_lower_fail(L, s->value->loc, "the repeat count must not be negative, got %lld",
                              (long long)n);
    if (n > PTC_FE_MAX_REPEAT)
        return ptc_lower_fail(L, s->value->loc, "the repeat count %lld is too large (at most %d)",
                              (long long)n, PTC_FE_MAX_REPEAT);
    if (take_name(L, s->name, "repeat", s->nameloc) < 0)
        return -1;
    int height = L->nvars, nsbase = L->nsbase;
    for (int64_t i = 0; i < n; i++) {
        if (ptc_lower_step(L, s->loc) < 0)
            return -1;
        size_t scope = scope_enter(L, s->name, i);
        L->nsbase = L->nnames;
        body_result r = {0};
        int rc = lower_body(L, s->body, true, &r);
        if (rc == 0 && i == n - 1)
            remember_locals(L, height);
        vars_truncate(L, height);
        names_truncate(L, L->nsbase);
        L->nsbase = nsbase;
        scope_leave(L, scope);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int lower_stmt(ptc_lower *L, const ptc_stmt *s, bool in_repeat, body_result *r)
{
    switch (s->kind) {
    case PTC_S_PARAM: return lower_param(L, s);
    case PTC_S_ASSIGN: return lower_assign(L, s);
    case PTC_S_REPEAT: return lower_repeat(L, s);
    case PTC_S_RETURN:
        if (in_repeat)
            return ptc_lower_fail(L, s->loc,
                                  "return inside repeat (a body returns once, after its loops)");
        if (ptc_lower_expr(L, s->value, &r->v) < 0)
            return -1;
        r->returned = true;
        r->expr = s->value;
        return 0;
    }
    PTC_UNREACHABLE("bad statement kind");
}

static int lower_body(ptc_lower *L, const ptc_stmt *s, bool in_repeat, body_result *r)
{
    if (L->depth >= PTC_FE_MAX_NEST)
        return ptc_lower_fail(L, s ? s->loc : (ptc_loc){0},
                              "blocks, repeats and expressions "
                              "nested too deeply (more than %d levels)",
                              PTC_FE_MAX_NEST);
    L->depth++;
    int rc = 0;
    for (; s && rc == 0; s = s->next) {
        if (r->returned)
            rc = ptc_lower_fail(L, s->loc, "statement after return (return ends a body)");
        else if (ptc_lower_step(L, s->loc) == 0)
            rc = lower_stmt(L, s, in_repeat, r);
        else
            rc = -1;
    }
    L->depth--;
    return rc;
}

/* ---- blocks ---- */

static int recursion_error(ptc_lower *L, const ptc_decl *b, const ptc_expr *call)
{
    char path[512];
    size_t k = 0;
    int first = 0;
    while (L->chain[first] != b)
        first++;
    if (first == L->nchain - 1)
        return ptc_lower_fail(L, call->loc, "block %s calls itself (blocks may not be recursive)",
                              b->name);
    for (int i = first; i < L->nchain && k < sizeof path; i++)
        k += (size_t)snprintf(path + k, sizeof path - k, "%s -> ", L->chain[i]->name);
    if (k < sizeof path)
        snprintf(path + k, sizeof path - k, "%s", b->name);
    return ptc_lower_fail(L, call->loc,
                          "block %s calls itself through %s (blocks may not be recursive)", b->name,
                          path);
}

/* Lowers the arguments of a block call in the caller's frame and checks their types. */
static int block_args(ptc_lower *L, const ptc_decl *b, const ptc_expr *call, int *in)
{
    const ptc_formal *f = b->formals;
    int i = 0;
    for (const ptc_arg *g = call->args; g; g = g->next, f = f->next, i++) {
        if (ptc_lower_tensor(L, g->value, f->val.dtype, &in[i]) < 0)
            return -1;
        const ptc_type *t = &L->g->values[in[i]].type;
        if (!ptc_type_eq(t, &f->val)) {
            char want[160], got[160];
            return ptc_lower_fail(L, g->value->loc,
                                  "type mismatch: argument '%s' of block %s is %s, but this is %s",
                                  f->name, b->name, ptc_type_str(&f->val, want, sizeof want),
                                  ptc_type_str(t, got, sizeof got));
        }
    }
    return 0;
}

/* The block's body, in a frame and a scope of its own; *vid gets the checked return value. */
static int block_body(ptc_lower *L, ptc_decl *b, const int *in, int *vid)
{
    int i = 0;
    for (const ptc_formal *f = b->formals; f; f = f->next)
        bind(L, f->name, (ptc_val){.vid = in[i++]}, f->loc);
    body_result r = {0};
    if (lower_body(L, b->body, false, &r) < 0)
        return -1;
    if (!r.returned)
        return ptc_lower_fail(L, b->endloc, "block %s ends without a return", b->name);
    if (ptc_lower_materialize(L, &r.v, b->retval.dtype, r.expr->loc) < 0)
        return -1;
    const ptc_type *t = &L->g->values[r.v.vid].type;
    if (!ptc_type_eq(t, &b->retval)) {
        char want[160], got[160];
        return ptc_lower_fail(L, r.expr->loc, "type mismatch: block %s returns %s, but this is %s",
                              b->name, ptc_type_str(&b->retval, want, sizeof want),
                              ptc_type_str(t, got, sizeof got));
    }
    *vid = r.v.vid;
    return 0;
}

int ptc_lower_block_call(ptc_lower *L, ptc_decl *b, const ptc_expr *call, const char *inst,
                         ptc_loc instloc, ptc_val *out)
{
    for (const ptc_arg *g = call->args; g; g = g->next)
        if (g->key)
            return ptc_lower_fail(L, g->keyloc, "block %s takes positional arguments only",
                                  b->name);
    if (call->nargs != b->nformals)
        return ptc_lower_fail(L, call->loc, "block %s takes %d argument%s, got %d", b->name,
                              b->nformals, b->nformals == 1 ? "" : "s", call->nargs);
    if (b->active)
        return recursion_error(L, b, call);
    if (L->nchain >= PTC_FE_MAX_BLOCKS)
        return ptc_lower_fail(L, call->loc, "block instances nested more than %d deep",
                              PTC_FE_MAX_BLOCKS);
    int inbuf[8], *in = b->nformals <= 8 ? inbuf : ptc_xmalloc(sizeof *in * (size_t)b->nformals);
    int rc = block_args(L, b, call, in);
    if (rc == 0)
        rc = take_name(L, inst, "instance", instloc);
    if (rc == 0) {
        size_t scope = scope_enter(L, inst, -1);
        int frame = L->frame, nvars = L->nvars, nsbase = L->nsbase, deadbase = L->deadbase;
        L->frame = L->nvars;
        L->nsbase = L->nnames;
        L->deadbase = L->ndead;
        PTC_GROW(L->chain, L->capchain, L->nchain);
        L->chain[L->nchain++] = b;
        b->active = true;
        int vid = -1, numctx = L->numctx;
        L->numctx = 0;
        rc = block_body(L, b, in, &vid);
        L->numctx = numctx;
        *out = (ptc_val){.vid = vid};
        b->active = false;
        L->nchain--;
        dead_truncate(L, L->deadbase);
        L->deadbase = deadbase;
        names_truncate(L, L->nsbase);
        L->nsbase = nsbase;
        vars_truncate(L, nvars);
        L->frame = frame;
        scope_leave(L, scope);
    }
    if (in != inbuf)
        free(in);
    if (rc < 0 && L->nchain == 0 && L->err_instance && !L->noted) {
        L->noted = true;
        ptc_diag_note(L->diag, call->loc, "in instance %s", L->err_instance);
    }
    return rc;
}

/* ---- top level ---- */

/* One model, at most one optimizer, no name declared twice. */
static int check_decls(ptc_lower *L, ptc_decl **model)
{
    const ptc_decl *optim = NULL;
    *model = NULL;
    size_t n = 0;
    for (const ptc_decl *d = L->ast->decls; d; d = d->next)
        n++;
    for (L->capdecls = 16; L->capdecls < 2 * n;)
        L->capdecls *= 2;
    L->decls = ptc_xcalloc(L->capdecls, sizeof *L->decls);
    for (ptc_decl *d = L->ast->decls; d; d = d->next) {
        ptc_decl **slot = decl_slot(L, d->kind, d->name), *first = *slot;
        if (!first)
            *slot = d;
        if (first && d->kind != PTC_D_OPTIMIZER)
            return ptc_lower_fail(L, d->loc, "%s '%s' is already defined at line %d",
                                  d->kind == PTC_D_CONST ? "const" : "block", d->name,
                                  first->loc.line);
        ptc_op op = ptc_op_lookup(d->name);
        if (d->kind == PTC_D_BLOCK && op != PTC_NOPS && (ptc_ops[op].flags & PTC_F_LANG))
            return ptc_lower_fail(L, d->loc, "block '%s' has the name of a built-in op", d->name);
        if (d->kind == PTC_D_MODEL && *model)
            return ptc_lower_fail(L, d->loc,
                                  "a second model '%s': a file has exactly one model "
                                  "(the first, '%s', is at line %d)",
                                  d->name, (*model)->name, (*model)->loc.line);
        if (d->kind == PTC_D_OPTIMIZER && optim)
            return ptc_lower_fail(L, d->loc,
                                  "a second optimizer: a file has at most one (the "
                                  "first is at line %d)",
                                  optim->loc.line);
        if (d->kind == PTC_D_MODEL)
            *model = d;
        if (d->kind == PTC_D_OPTIMIZER)
            optim = d;
    }
    if (!*model)
        return ptc_lower_fail(L, (ptc_loc){.file = L->file, .line = 1, .col = 1},
                              "no model in this file (a file has "
                              "exactly one `model NAME(ARGS) { ... }`)");
    return 0;
}

static int unknown_define(ptc_lower *L, const char *name)
{
    const char *cands[64];
    int n = 0;
    for (const ptc_decl *d = L->ast->decls; d && n < 64; d = d->next)
        if (d->kind == PTC_D_CONST)
            cands[n++] = d->name;
    const char *near = ptc_similar(name, cands, n);
    if (near)
        return ptc_lower_fail(L, (ptc_loc){.file = L->file},
                              "-D %s: this file has no const named '%s'; did you mean '%s'?", name,
                              name, near);
    return ptc_lower_fail(L, (ptc_loc){.file = L->file}, "-D %s: this file has no const named '%s'",
                          name, name);
}

/* -D NAME=VALUE replaces the value of const NAME; its expression is then not evaluated. */
static int apply_defines(ptc_lower *L, const ptc_frontend_opts *opts)
{
    for (int i = 0; opts && i < opts->ndefines; i++) {
        const ptc_define *def = &opts->defines[i];
        const char *name = def->name ? def->name : "";
        ptc_decl *c = L->ast->decls;
        while (c && !(c->kind == PTC_D_CONST && strcmp(c->name, name) == 0))
            c = c->next;
        if (!c)
            return unknown_define(L, name);
        if (!isfinite(def->value))
            return ptc_lower_fail(L, (ptc_loc){.file = L->file},
                                  "-D %s: the value must be a finite number", def->name);
        c->num = (ptc_num){.v = def->value};
        c->state = 1;
    }
    return 0;
}

/* const NAME = EXPR, in file order; a const may use the consts before it. */
static int eval_consts(ptc_lower *L)
{
    for (ptc_decl *d = L->ast->decls; d; d = d->next) {
        if (d->kind != PTC_D_CONST || d->state == 1)
            continue;
        d->state = 2;
        ptc_val v;
        if (ptc_lower_expr(L, d->value, &v) < 0)
            return -1;
        if (!v.is_num)
            return ptc_lower_fail(L, d->value->loc,
                                  "a const must be a compile-time number, but this is a tensor");
        d->num = v.num;
        d->state = 1;
    }
    return 0;
}

/* One setting of `optimizer KIND(...)`: the key and range checks are ptc_optim_set's (shared with
 * ptc --optim); a setting given twice is an error here. */
static int optim_setting(ptc_lower *L, const ptc_arg *g, ptc_optim *o, unsigned *given)
{
    const char *key = g->key ? g->key : "lr";
    char msg[256];
    int k = ptc_optim_key(o->kind, key, msg, sizeof msg);
    if (k < 0)
        return ptc_lower_fail(L, g->keyloc, "%s", msg);
    if (*given & (1u << k))
        return ptc_lower_fail(L, g->keyloc, "setting '%s' is given twice", key);
    *given |= 1u << k;
    double v;
    if (ptc_lower_num(L, g->value, key, &v) < 0)
        return -1;
    if (ptc_optim_set(o, key, v, msg, sizeof msg) < 0)
        return ptc_lower_fail(L, g->value->loc, "%s", msg);
    return 0;
}

/* optimizer adamw(lr=..., beta1=..., ...) | optimizer sgd(lr=..., momentum=..., ...); lr may
 * also come first without its key. */
static int lower_optimizer(ptc_lower *L)
{
    for (const ptc_decl *d = L->ast->decls; d; d = d->next) {
        if (d->kind != PTC_D_OPTIMIZER)
            continue;
        ptc_optim_kind kind;
        if (strcmp(d->name, "adamw") == 0)
            kind = PTC_OPTIM_ADAMW;
        else if (strcmp(d->name, "sgd") == 0)
            kind = PTC_OPTIM_SGD;
        else
            return ptc_lower_fail(L, d->loc, "unknown optimizer '%s' (expected adamw or sgd)",
                                  d->name);
        ptc_optim o = ptc_optim_default(kind);
        unsigned given = 0;
        for (const ptc_arg *g = d->args; g; g = g->next) {
            if (!g->key && g != d->args)
                return ptc_lower_fail(L, g->value->loc,
                                      "the settings of %s after lr are "
                                      "keyword arguments (KEY=VALUE)",
                                      d->name);
            if (optim_setting(L, g, &o, &given) < 0)
                return -1;
        }
        L->g->optim = o;
    }
    return 0;
}

/* ARG: TYPE, ... of a block or the model: names distinct, types evaluated. */
static int eval_formals(ptc_lower *L, ptc_decl *d)
{
    ptc_name_index seen = {0};
    int rc = 0, i = 0;
    for (ptc_formal *f = d->formals; f && rc == 0; f = f->next, i++) {
        int first = ptc_name_index_get(&seen, f->name);
        if (first >= 0)
            rc = ptc_lower_fail(L, f->loc, "argument '%s' is declared twice", f->name);
        else
            name_index_push(&seen, f->name, i);
        if (rc == 0)
            rc = ptc_lower_type(L, f->type, true, &f->val);
    }
    name_index_free(&seen);
    return rc;
}

static int eval_signatures(ptc_lower *L)
{
    for (ptc_decl *d = L->ast->decls; d; d = d->next)
        if (d->kind == PTC_D_BLOCK &&
            (eval_formals(L, d) < 0 || ptc_lower_type(L, d->ret, true, &d->retval) < 0))
            return -1;
    return 0;
}

/* With a data-parallel axis of size dp (dp x ep with expert parallelism) and M microbatches,
 * every input's first dimension is split dp x M ways: when it does not divide, name the const to
 * change where the dimension is written. */
static int check_batch_split(ptc_lower *L, const ptc_formal *f, int dp, int mb, const char *axes)
{
    dp = dp > 1 ? dp : 1;
    mb = mb > 1 ? mb : 1;
    int split = dp * mb;
    if (split <= 1 || f->val.rank < 1 || f->val.dims[0] % split == 0)
        return 0;
    int64_t size = f->val.dims[0], fix = (size / split + 1) * split;
    char mesh[64], by[128];
    if (axes && strchr(axes, ' '))
        snprintf(mesh, sizeof mesh, "mesh axes %s = %d", axes, dp);
    else
        snprintf(mesh, sizeof mesh, "mesh axis %s=%d", axes ? axes : "dp", dp);
    if (mb == 1)
        snprintf(by, sizeof by, "%s", mesh);
    else if (dp == 1)
        snprintf(by, sizeof by, "--microbatches %d", mb);
    else
        snprintf(by, sizeof by, "%s x --microbatches %d (%d)", mesh, mb, split);
    const char *what = mb == 1 ? "data parallelism splits" : "the batch split splits";
    const ptc_expr *e = f->type->dims ? f->type->dims->value : NULL;
    ptc_loc loc = e ? e->loc : f->loc;
    if (e && e->kind == PTC_E_NAME && ptc_lower_find_decl(L, PTC_D_CONST, e->name))
        return ptc_lower_fail(L, loc,
                              "%s does not divide the first dimension of input '%s' (%s = %lld), "
                              "which %s: make const '%s' a multiple of %d, e.g. -D %s=%lld",
                              by, f->name, e->name, (long long)size, what, e->name, split,
                              e->name, (long long)fix);
    return ptc_lower_fail(L, loc,
                          "%s does not divide the first dimension of input '%s' (%lld), which "
                          "%s: make it a multiple of %d",
                          by, f->name, (long long)size, what, split);
}

/* The consts the first two dims of the first i32 input are written as (ptc_frontend_info). */
static void input_dim_consts(ptc_lower *L, const ptc_decl *m, ptc_frontend_info *info)
{
    memset(info, 0, sizeof *info);
    const ptc_formal *f = m->formals;
    while (f && f->val.dtype != PTC_I32)
        f = f->next;
    const ptc_arg *d = f && f->type ? f->type->dims : NULL;
    for (int k = 0; k < 2 && d; k++, d = d->next) {
        const ptc_expr *e = d->value;
        if (e && e->kind == PTC_E_NAME && ptc_lower_find_decl(L, PTC_D_CONST, e->name))
            snprintf(k ? info->seq_const : info->batch_const, sizeof info->seq_const, "%s",
                     e->name);
    }
}

/* model NAME(ARGS) { BODY }: one INPUT per argument, the body, and its scalar loss. */
static int lower_model(ptc_lower *L, ptc_decl *m, const ptc_frontend_opts *opts)
{
    if (eval_formals(L, m) < 0)
        return -1;
    int split = opts ? opts->batch_split : 0;
    const char *axes = opts ? opts->batch_axes : NULL;
    for (const ptc_formal *f = m->formals; f; f = f->next)
        if (check_batch_split(L, f, split, opts ? opts->microbatches : 0, axes) < 0)
            return -1;
    if (opts && opts->info)
        input_dim_consts(L, m, opts->info);
    for (const ptc_formal *f = m->formals; f; f = f->next) {
        ptc_attrs at = ptc_attrs_default(PTC_OP_INPUT);
        at.name = f->name;
        at.dtype = f->val.dtype;
        at.nshape = f->val.rank;
        memcpy(at.shape, f->val.dims, sizeof at.shape);
        int vid, n;
        if (ptc_lower_build(L, PTC_OP_INPUT, NULL, 0, &at, f->loc, &vid, 1, &n) < 0)
            return -1;
        bind(L, f->name, (ptc_val){.vid = vid}, f->loc);
    }
    body_result r = {0};
    if (lower_body(L, m->body, false, &r) < 0)
        return -1;
    if (!r.returned)
        return ptc_lower_fail(L, m->endloc,
                              "model %s ends without returning its loss (`return LOSS`)", m->name);
    if (ptc_lower_materialize(L, &r.v, PTC_F32, r.expr->loc) < 0)
        return -1;
    const ptc_type *t = &L->g->values[r.v.vid].type;
    if (t->rank != 0 || t->dtype != PTC_F32) {
        char s[160];
        return ptc_lower_fail(L, r.expr->loc, "the model must return a scalar loss (f32[]), got %s",
                              ptc_type_str(t, s, sizeof s));
    }
    L->g->loss = r.v.vid;
    bool any = false;
    for (int i = 0; i < L->g->nnodes && !any; i++)
        any = L->g->nodes[i].op == PTC_OP_PARAM;
    if (opts && opts->train && !any)
        return ptc_lower_fail(L, m->loc,
                              "model %s has no parameters, so there is nothing to train "
                              "(declare one with `param NAME : [DIMS] init INIT`)",
                              m->name);
    return 0;
}

static ptc_graph *lower_file(ptc_arena *arena, const char *path, ptc_ast_file *ast,
                             const ptc_frontend_opts *opts, ptc_diag *diag)
{
    ptc_lower L = {.diag = diag, .arena = arena, .file = path, .ast = ast};
    ptc_decl *model;
    int rc = check_decls(&L, &model);
    if (rc == 0) {
        L.g = ptc_graph_new(model->name);
        int max_nodes = L.g->max_nodes;
        if (L.g->max_nodes > PTC_FE_MAX_NODES)
            L.g->max_nodes = PTC_FE_MAX_NODES;
        rc = apply_defines(&L, opts);
        if (rc == 0)
            rc = eval_consts(&L);
        if (rc == 0)
            rc = lower_optimizer(&L);
        if (rc == 0)
            rc = eval_signatures(&L);
        if (rc == 0)
            rc = lower_model(&L, model, opts);
        L.g->max_nodes = max_nodes;
    }
    free(L.decls);
    name_index_free(&L.varidx);
    name_index_free(&L.nameidx);
    name_index_free(&L.deadidx);
    free(L.vars);
    free(L.names);
    free(L.dead);
    free(L.scope);
    free(L.full);
    free(L.chain);
    if (rc < 0 || L.failed) {
        ptc_graph_free(L.g);
        return NULL;
    }
    return L.g;
}

ptc_graph *ptc_frontend_compile(const char *path, const char *src, size_t srclen,
                                const ptc_frontend_opts *opts, ptc_diag *diag)
{
    if (!path)
        path = diag->file ? diag->file : "<input>";
    ptc_arena *arena = ptc_arena_new();
    ptc_ast_file ast;
    ptc_graph *g = NULL;
    if (ptc_parse(arena, path, src ? src : "", src ? srclen : 0, diag, &ast) == 0)
        g = lower_file(arena, path, &ast, opts, diag);
    ptc_arena_free(arena);
    return g;
}

int ptc_define_parse(char *arg, ptc_define *out)
{
    char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return -1;
    for (const char *p = arg; p < eq; p++)
        if (!(*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (p > arg && *p >= '0' && *p <= '9')))
            return -1;
    char *end;
    double v = strtod(eq + 1, &end);
    if (end == eq + 1 || *end || !isfinite(v))
        return -1;
    *eq = 0;
    out->name = arg;
    out->value = v;
    return 0;
}
