/* lower.h - state shared by the two halves of lowering: lower.c (declarations, statements, blocks,
 * scopes, naming) and expr.c (expressions, constant folding, built-in calls from the op table).
 * Internal to the front end.
 */
#ifndef PTC_LOWER_H
#define PTC_LOWER_H

#include "ast.h"
#include "frontend.h"

/* Limits that keep any input from crashing, hanging or exhausting memory. */
#define PTC_FE_MAX_NODES (1 << 19)  /* operations after unrolling */
#define PTC_FE_MAX_VALUES (1 << 21) /* values after unrolling */
#define PTC_FE_MAX_STEPS (1 << 21)  /* statements and expressions lowered, unrolling included */
#define PTC_FE_MAX_REPEAT 1000000   /* one repeat count */
#define PTC_FE_MAX_NEST 2000        /* recursion of lowering: expressions, repeats, blocks */
#define PTC_FE_MAX_BLOCKS 64        /* block instances inside block instances */
#define PTC_FE_MAX_ARGS 1024        /* arguments of one call */
#define PTC_FE_MAX_NUMEL ((int64_t)1 << 46)
#define PTC_FE_MAX_PARAMS ((int64_t)1 << 46) /* parameters in all (elements of every param) */

/* The value of an expression: a compile-time number or a tensor (a value id of the graph). */
typedef struct ptc_val {
    bool is_num;
    ptc_num num;
    int vid;
} ptc_val;

typedef struct ptc_binding {
    const char *name;
    ptc_val v;
    ptc_loc loc;
    int prev; /* the entry of the same name below this one on its stack, or -1 */
} ptc_binding;

/* A name taken in a scope: a param, a block instance or a repeat. */
typedef struct ptc_scoped {
    const char *name;
    const char *what;
    ptc_loc loc;
    int prev; /* as in ptc_binding */
} ptc_scoped;

/* Interned name -> index of the newest entry of that name on one of the stacks below (-1: none),
 * so that finding a name costs the same in a body of 40,000 names as in one of 4. An entry links
 * to the one it hides (`prev`); popping an entry puts that one back. */
typedef struct ptc_name_index {
    const char **keys;
    int *top;
    size_t cap, n;
} ptc_name_index;

typedef struct ptc_lower {
    ptc_graph *g;
    ptc_diag *diag;
    ptc_arena *arena; /* the AST's */
    const char *file;
    ptc_ast_file *ast;
    /* the declarations by (kind, interned name): an open-addressing table, so that a file of
     * 40,000 consts is not searched once per use */
    ptc_decl **decls;
    size_t capdecls;
    bool failed;
    const char *err_instance; /* the instance an error happened in, for the note */
    bool noted;
    /* variables: a stack; the current block or model frame starts at `frame` */
    ptc_binding *vars;
    int nvars, capvars, frame;
    ptc_name_index varidx;
    /* names taken in scopes: a stack; the current scope starts at `nsbase` */
    ptc_scoped *names;
    int nnames, capnames, nsbase;
    ptc_name_index nameidx;
    /* variables that were local to a repeat body, for the hint of "unknown name" */
    ptc_binding *dead;
    int ndead, capdead, deadbase;
    ptc_name_index deadidx;
    /* dotted path of the current scope ("h.3.attn"), and a buffer for full names */
    char *scope;
    size_t scopelen, scopecap;
    char *full;
    size_t fullcap;
    /* block instances being lowered, outermost first (recursion check and messages) */
    ptc_decl **chain;
    int nchain, capchain;
    int depth;
    long steps;
    int64_t nparams; /* elements of the params so far */
    int numctx;      /* > 0 while evaluating what must be a compile-time number */
} ptc_lower;

/* Reports the first error of the compilation (later ones are dropped) and returns -1. */
int ptc_lower_fail(ptc_lower *L, ptc_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Counts one step of lowering; fails once the budget is spent. */
int ptc_lower_step(ptc_lower *L, ptc_loc loc);

/* Lookups by interned name (pointer equality; see ptc_intern). */
ptc_decl *ptc_lower_find_decl(const ptc_lower *L, ptc_decl_kind kind, const char *name);
/* Index of a variable of the current frame, or -1. */
int ptc_lower_find_var(const ptc_lower *L, const char *name);
/* Index of the newest entry named name on the stack that idx indexes, or -1. */
int ptc_name_index_get(const ptc_name_index *idx, const char *name);
/* Instantiates block b for call (an expression whose args are the block's arguments). */
int ptc_lower_block_call(ptc_lower *L, ptc_decl *b, const ptc_expr *call, const char *inst,
                         ptc_loc instloc, ptc_val *out);

/* expr.c */
int ptc_lower_expr(ptc_lower *L, const ptc_expr *e, ptc_val *out);
/* An expression that must give one tensor (a number becomes a scalar const of dtype dt). */
int ptc_lower_tensor(ptc_lower *L, const ptc_expr *e, ptc_dtype dt, int *vid);
/* A number where a tensor is needed becomes a scalar const of dtype dt. */
int ptc_lower_materialize(ptc_lower *L, ptc_val *v, ptc_dtype dt, ptc_loc loc);
/* The result of an expression written where several may come (`a, b = split(...)`). */
int ptc_lower_multi(ptc_lower *L, const ptc_expr *e, int *vids, int cap, int *n);
/* Compile-time numbers: any number, or an integer (a dim, a count, an axis) named `what`. */
int ptc_lower_num(ptc_lower *L, const ptc_expr *e, const char *what, double *out);
int ptc_lower_int(ptc_lower *L, const ptc_expr *e, const char *what, int64_t *out);
/* DTYPE[DIMS] (or [DIMS] when want_dtype is false) to a type. */
int ptc_lower_type(ptc_lower *L, const ptc_type_ast *t, bool want_dtype, ptc_type *out);
/* Builds a node; fails with the builder's message at loc. */
int ptc_lower_build(ptc_lower *L, ptc_op op, const int *in, int nin, const ptc_attrs *at,
                    ptc_loc loc, int *out, int cap, int *nout);

#endif
