/* ast.h - the syntax tree of a .ptm file, as the parser builds it and lowering reads it.
 *
 * Everything lives in one arena that the front end frees in one call after lowering. Lists are
 * singly linked in source order. Every node keeps the location of the token a diagnostic should
 * point at: the operator of a binary expression, the callee of a call, the name of a declaration.
 * A few fields are lowering state (a const's value, a block's evaluated signature) so that lowering
 * needs no side tables keyed by node.
 */
#ifndef PTC_AST_H
#define PTC_AST_H

#include <stdbool.h>

#include "diag.h"
#include "ir.h"

/* Expressions nested deeper than this are rejected by the parser (lowering recurses on them). */
#define PTC_AST_MAX_DEPTH 1000

typedef enum {
    PTC_E_NUM,  /* 0.02 */
    PTC_E_BOOL, /* true, false */
    PTC_E_NAME, /* x */
    PTC_E_CALL, /* f(args, key=value) */
    PTC_E_BIN,  /* a + b, a - b, a * b, a / b, a @ b */
    PTC_E_NEG,  /* -a */
    PTC_E_AS,   /* CALL as NAME */
    PTC_E_LIST, /* [a, b, c] */
} ptc_expr_kind;

typedef struct ptc_expr ptc_expr;

/* One element of an argument list, a list literal or the dims of a type; key is NULL when
 * positional. */
typedef struct ptc_arg {
    const char *key;
    ptc_loc keyloc;
    ptc_expr *value;
    struct ptc_arg *next;
} ptc_arg;

struct ptc_expr {
    ptc_expr_kind kind;
    ptc_loc loc;
    int depth;        /* 1 for a leaf */
    bool paren;       /* written inside ( ) */
    double num;       /* NUM */
    bool truth;       /* BOOL */
    char op;          /* BIN: one of + - * / @ */
    const char *name; /* NAME; CALL: the callee; AS: the instance name */
    ptc_loc nameloc;  /* AS: where the instance name is */
    ptc_expr *lhs;    /* BIN; NEG and AS: the operand */
    ptc_expr *rhs;    /* BIN */
    ptc_arg *args;    /* CALL arguments, LIST elements */
    int nargs;
};

/* DTYPE[DIM, ...]; dtype is NULL where the type has none (a param's). */
typedef struct ptc_type_ast {
    const char *dtype;
    ptc_loc loc;
    ptc_arg *dims;
    int ndims;
} ptc_type_ast;

typedef struct ptc_ident {
    const char *name;
    ptc_loc loc;
    struct ptc_ident *next;
} ptc_ident;

typedef enum {
    PTC_S_PARAM,  /* param NAME : [DIMS] init INIT */
    PTC_S_ASSIGN, /* NAME, ... = EXPR */
    PTC_S_REPEAT, /* repeat COUNT as NAME { BODY } */
    PTC_S_RETURN, /* return EXPR */
} ptc_stmt_kind;

typedef struct ptc_stmt {
    ptc_stmt_kind kind;
    ptc_loc loc;
    const char *name;   /* PARAM: the param; REPEAT: the scope name */
    ptc_loc nameloc;    /* REPEAT: where the scope name is */
    ptc_type_ast *type; /* PARAM */
    const char *init;   /* PARAM: init kind (normal, uniform, ...) */
    ptc_loc initloc;
    ptc_arg *initargs;
    int ninitargs;
    ptc_ident *names; /* ASSIGN targets */
    int nnames;
    ptc_expr *value;       /* ASSIGN, RETURN; REPEAT: the count */
    struct ptc_stmt *body; /* REPEAT */
    struct ptc_stmt *next;
} ptc_stmt;

/* ARG: TYPE in a block or model signature. */
typedef struct ptc_formal {
    const char *name;
    ptc_loc loc;
    ptc_type_ast *type;
    ptc_type val; /* lowering: the evaluated type */
    struct ptc_formal *next;
} ptc_formal;

typedef enum { PTC_D_CONST, PTC_D_BLOCK, PTC_D_MODEL, PTC_D_OPTIMIZER } ptc_decl_kind;

/* A compile-time number. `inexact` records the first non-exact division of two integers that
 * went into it, so that using it where an integer is needed can point at that division. */
typedef struct ptc_num {
    double v;
    bool inexact;
    ptc_loc divloc;
    double diva, divb;
} ptc_num;

typedef struct ptc_decl {
    ptc_decl_kind kind;
    const char *name; /* const, block, model; optimizer: its kind */
    ptc_loc loc;
    ptc_expr *value;     /* CONST */
    ptc_formal *formals; /* BLOCK, MODEL */
    int nformals;
    ptc_type_ast *ret; /* BLOCK */
    ptc_stmt *body;    /* BLOCK, MODEL */
    ptc_loc endloc;    /* BLOCK, MODEL: the closing brace */
    ptc_arg *args;     /* OPTIMIZER */
    int nargs;
    struct ptc_decl *next;
    /* lowering state */
    int state;       /* CONST: 0 not yet evaluated, 1 evaluated; BLOCK: 1 signature evaluated */
    ptc_num num;     /* CONST */
    bool active;     /* BLOCK: being instantiated (recursion check) */
    ptc_type retval; /* BLOCK: the evaluated return type */
} ptc_decl;

typedef struct ptc_ast_file {
    ptc_decl *decls;
    ptc_loc endloc; /* just after the last token */
} ptc_ast_file;

/* Constructors (arena-allocated, zeroed). An expression's depth is computed from its operands. */
ptc_expr *ptc_ast_expr(ptc_arena *a, ptc_expr_kind kind, ptc_loc loc);
ptc_expr *ptc_ast_binary(ptc_arena *a, char op, ptc_loc loc, ptc_expr *lhs, ptc_expr *rhs);
ptc_expr *ptc_ast_unary(ptc_arena *a, ptc_expr_kind kind, ptc_loc loc, ptc_expr *operand);
ptc_expr *ptc_ast_call(ptc_arena *a, const char *name, ptc_loc loc, ptc_arg *args, int nargs);
ptc_arg *ptc_ast_arg(ptc_arena *a, const char *key, ptc_loc keyloc, ptc_expr *value);
ptc_stmt *ptc_ast_stmt(ptc_arena *a, ptc_stmt_kind kind, ptc_loc loc);
ptc_decl *ptc_ast_decl(ptc_arena *a, ptc_decl_kind kind, const char *name, ptc_loc loc);

/* Identifiers are interned while parsing: one spelling, one pointer, so that lowering compares
 * names by pointer. The table is freed after the parse; the strings live in the arena. */
typedef struct ptc_interner {
    ptc_arena *arena;
    const char **slots;
    size_t cap, n;
} ptc_interner;
const char *ptc_intern(ptc_interner *t, const char *s, size_t n);
void ptc_interner_free(ptc_interner *t);

/* Parses src into *out (arena-allocated). Returns 0, or -1 after reporting one error to diag. */
int ptc_parse(ptc_arena *a, const char *path, const char *src, size_t len, ptc_diag *diag,
              ptc_ast_file *out);

#endif
