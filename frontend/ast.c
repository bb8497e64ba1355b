/* ast.c - constructors for the syntax tree (see ast.h). They exist so that the grammar actions
 * stay one line each and the depth of every expression is known when it is built, which is what
 * lets the parser refuse pathologically nested input before lowering recurses on it.
 */
#include "ast.h"

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
