/* ast.c - constructors for the syntax tree (see ast.h). They exist so that the grammar actions
 * stay one line each and the depth of every expression is known when it is built, which is what
 * lets the parser refuse pathologically nested input before lowering recurses on it.
 */
#include "ast.h"

#include <stdlib.h>
#include <string.h>

static int max_depth(const ptc_expr *a, const ptc_expr *b)
{
    int da = a ? a->depth : 0, db = b ? b->depth : 0;
    return da > db ? da : db;
}

ptc_expr *ptc_ast_expr(ptc_arena *a, ptc_expr_kind kind, ptc_loc loc)
{
    ptc_expr *e = ptc_arena_alloc(a, sizeof *e);
    e->kind = kind;
    e->loc = loc;
    e->depth = 1;
    return e;
}

ptc_expr *ptc_ast_binary(ptc_arena *a, char op, ptc_loc loc, ptc_expr *lhs, ptc_expr *rhs)
{
    ptc_expr *e = ptc_ast_expr(a, PTC_E_BIN, loc);
    e->op = op;
    e->lhs = lhs;
    e->rhs = rhs;
    e->depth = 1 + max_depth(lhs, rhs);
    return e;
}

ptc_expr *ptc_ast_unary(ptc_arena *a, ptc_expr_kind kind, ptc_loc loc, ptc_expr *operand)
{
    ptc_expr *e = ptc_ast_expr(a, kind, loc);
    e->lhs = operand;
    e->depth = 1 + operand->depth;
    return e;
}

/* Also used for list literals (kind set by the caller): the depth covers every element. */
ptc_expr *ptc_ast_call(ptc_arena *a, const char *name, ptc_loc loc, ptc_arg *args, int nargs)
{
    ptc_expr *e = ptc_ast_expr(a, PTC_E_CALL, loc);
    e->name = name;
    e->args = args;
    e->nargs = nargs;
    for (const ptc_arg *g = args; g; g = g->next)
        if (g->value->depth + 1 > e->depth)
            e->depth = g->value->depth + 1;
    return e;
}

ptc_arg *ptc_ast_arg(ptc_arena *a, const char *key, ptc_loc keyloc, ptc_expr *value)
{
    ptc_arg *g = ptc_arena_alloc(a, sizeof *g);
    g->key = key;
    g->keyloc = keyloc;
    g->value = value;
    return g;
}

ptc_stmt *ptc_ast_stmt(ptc_arena *a, ptc_stmt_kind kind, ptc_loc loc)
{
    ptc_stmt *s = ptc_arena_alloc(a, sizeof *s);
    s->kind = kind;
    s->loc = loc;
    return s;
}

ptc_decl *ptc_ast_decl(ptc_arena *a, ptc_decl_kind kind, const char *name, ptc_loc loc)
{
    ptc_decl *d = ptc_arena_alloc(a, sizeof *d);
    d->kind = kind;
    d->name = name;
    d->loc = loc;
    return d;
}

static size_t hash(const char *s, size_t n)
{
    size_t h = 14695981039346656037u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211u;
    return h;
}

static bool same(const char *interned, const char *s, size_t n)
{
    return strncmp(interned, s, n) == 0 && interned[n] == 0;
}

const char *ptc_intern(ptc_interner *t, const char *s, size_t n)
{
    if (2 * (t->n + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        const char **slots = ptc_xcalloc(cap, sizeof *slots);
        for (size_t i = 0; i < t->cap; i++)
            if (t->slots[i]) {
                size_t j = hash(t->slots[i], strlen(t->slots[i])) & (cap - 1);
                while (slots[j])
                    j = (j + 1) & (cap - 1);
                slots[j] = t->slots[i];
            }
        free(t->slots);
        t->slots = slots;
        t->cap = cap;
    }
    size_t j = hash(s, n) & (t->cap - 1);
    while (t->slots[j] && !same(t->slots[j], s, n))
        j = (j + 1) & (t->cap - 1);
    if (!t->slots[j]) {
        t->slots[j] = ptc_arena_strndup(t->arena, s, n);
        t->n++;
    }
    return t->slots[j];
}

void ptc_interner_free(ptc_interner *t)
{
    free(t->slots);
    t->slots = NULL;
    t->cap = t->n = 0;
}
