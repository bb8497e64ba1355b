/* kir.h - the kernel IR: what a generated kernel computes, independent of the target.
 *
 * A kernel is a function of operand pointers (its parameters: typed flat arrays of a fixed size)
 * whose body is a list of statements over scalar values:
 *
 *   kernel f0_add_gelu(x: f32[1024], b: f32[64], h: out f32[1024] = x, y: out f32[1024]) {
 *       for i < 16 parallel {
 *           for j < 64 {
 *               let t0 = x[i * 64 + j] + b[j]
 *               h[i * 64 + j] = t0
 *               y[i * 64 + j] = 0.5 * t0 * (1.0 + tanh(...))
 *           }
 *       }
 *   }
 *
 *   statements  `let NAME = EXPR` (a scalar bound once), `P[INDEX] = EXPR` (a store), `for NAME <
 *               EXTENT [parallel] { ... }` (a loop nest over an index space).
 *   expressions float (f32) and integer (i64) constants, names, loads `P[INDEX]` (i32 elements
 *               load as i64), + - * / % (the last on i64), min max, comparisons < <= == != (to
 *               bool), select(c, a, b), neg exp log sqrt tanh sin cos, float(i64), and reductions
 *               `sum(j < N: EXPR)` and `maxr(j < N: EXPR)` over an index.
 *   parameters  f32, bf16 or f16 (2-byte storage: a load gives its f32 value, a store rounds to
 *               nearest even, as common/half.c) or i32; in or out; an out parameter written over an in parameter names it (`= x`): they
 *               share their bytes (the plan's in-place results), and a target gives both one
 *               pointer, so it knows the accesses alias.
 *
 * A local array (`acc: local f32[64]`) is a parameter no caller passes: scratch private to each
 * part of the kernel (an iteration of a top-level parallel loop, or the top-level statements),
 * whose contents do not carry from one part to the next, for what a loop accumulates (an online
 * softmax's running maximum, sum and weighted rows). Its argument slot is ignored; a target
 * makes its own (the stack on the CPU). At most PTC_KIR_LOCAL_MAX elements each.
 *
 * Loops marked parallel must be at the top level of the kernel and have independent iterations;
 * top-level statements must not depend on another thread's part of an earlier loop. A target runs
 * the kernel on `nt` threads, thread `tid` taking iterations [N*tid/nt, N*(tid+1)/nt) of every
 * parallel loop, so the results do not depend on the number of threads.
 *
 * The CPU backend compiles kernels through LLVM (codegen/llvm/), the CUDA backend will emit CUDA C
 * from the same IR; ptc_kir_run interprets it (the reference, in double precision). The text form
 * prints and parses back (plans carry it).
 */
#ifndef PTC_KIR_H
#define PTC_KIR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ir.h"
#include "text.h"

typedef enum { PTC_KT_F32, PTC_KT_I64, PTC_KT_BOOL, PTC_NKT } ptc_kt;

#define PTC_KIR_LOCAL_MAX 4096

typedef enum {
    PTC_KX_FCONST,
    PTC_KX_ICONST,
    PTC_KX_VAR,
    PTC_KX_LOAD, /* param, a = index */
    /* binary: a, b */
    PTC_KX_ADD,
    PTC_KX_SUB,
    PTC_KX_MUL,
    PTC_KX_DIV,
    PTC_KX_REM,
    PTC_KX_MIN,
    PTC_KX_MAX,
    PTC_KX_LT,
    PTC_KX_LE,
    PTC_KX_EQ,
    PTC_KX_NE,
    PTC_KX_SELECT, /* a ? b : c */
    /* unary: a */
    PTC_KX_NEG,
    PTC_KX_EXP,
    PTC_KX_LOG,
    PTC_KX_SQRT,
    PTC_KX_TANH,
    PTC_KX_SIN,
    PTC_KX_COS,
    PTC_KX_FLOAT,
    PTC_KX_RBF16, /* a (f32) rounded to the nearest bf16, as a store to bf16 rounds */
    PTC_KX_RF16,  /* a (f32) rounded to the nearest f16 (IEEE half), as a store to f16 rounds */
    /* reductions: var < a of b */
    PTC_KX_SUM,
    PTC_KX_RMAX,
    PTC_NKX
} ptc_kx_kind;

typedef struct ptc_kx {
    uint8_t kind, type; /* ptc_kx_kind, ptc_kt */
    int a, b, c;        /* operand expressions */
    int var;            /* VAR, and the index of a reduction */
    int param;          /* LOAD */
    double f;           /* FCONST */
    int64_t i;          /* ICONST */
} ptc_kx;

typedef enum { PTC_KS_LET, PTC_KS_STORE, PTC_KS_FOR } ptc_ks_kind;

typedef struct ptc_ks {
    uint8_t kind;
    bool parallel;          /* FOR */
    int var;                /* LET, FOR */
    int param;              /* STORE */
    int index, value;       /* STORE: index, value; LET: value */
    int extent;             /* FOR */
    int body;               /* FOR: first statement, -1 if none */
    int next;               /* the next statement of its list, -1 at the end */
} ptc_ks;

typedef struct ptc_kparam {
    const char *name;
    ptc_dtype dtype; /* f32, bf16, f16 or i32 */
    int64_t numel;
    bool out;
    int alias;  /* an out parameter over an in parameter: that parameter; else -1 */
    bool local; /* a local array (f32, at most PTC_KIR_LOCAL_MAX): see above */
} ptc_kparam;

typedef struct ptc_kvar {
    const char *name;
    uint8_t type; /* ptc_kt */
} ptc_kvar;

typedef struct ptc_kir {
    const char *name;
    ptc_kparam *params;
    int nparams, capparams;
    ptc_kvar *vars;
    int nvars, capvars;
    ptc_kx *x;
    int nx, capx;
    ptc_ks *s;
    int ns, caps;
    int body; /* first top-level statement, -1 if none */
    /* building: the open blocks (first and last statement of each) */
    int open_first[16], open_last[16], depth;
    ptc_arena *arena; /* names */
} ptc_kir;

ptc_kir *ptc_kir_new(const char *name);
void ptc_kir_free(ptc_kir *k);

/* ---- building (types are inferred as expressions are made; ptc_kir_verify checks them) ---- */
int ptc_kir_param(ptc_kir *k, const char *name, ptc_dtype dt, int64_t numel, bool out, int alias);
/* A local array of numel f32 (see above); loads and stores name it as a parameter. */
int ptc_kir_local(ptc_kir *k, const char *name, int64_t numel);
/* A new scalar name (NULL: t<N>). */
int ptc_kir_var(ptc_kir *k, const char *name, ptc_kt type);
int ptc_kx_f(ptc_kir *k, double v);
int ptc_kx_i(ptc_kir *k, int64_t v);
int ptc_kx_v(ptc_kir *k, int var);
int ptc_kx_load(ptc_kir *k, int param, int index);
int ptc_kx_bin(ptc_kir *k, ptc_kx_kind kind, int a, int b);
int ptc_kx_un(ptc_kir *k, ptc_kx_kind kind, int a);
int ptc_kx_select(ptc_kir *k, int c, int a, int b);
/* sum/maxr(var < extent: body): var must be new; make it with ptc_kir_var before body. */
int ptc_kx_reduce(ptc_kir *k, ptc_kx_kind kind, int var, int extent, int body);
/* Statements are appended to the innermost open loop (or the kernel body). */
int ptc_kir_let(ptc_kir *k, int var, int value);
/* let of a new name bound to value; returns an expression reading it */
int ptc_kir_bind(ptc_kir *k, int value);
void ptc_kir_store(ptc_kir *k, int param, int index, int value);
/* Opens `for var < extent`; returns the loop index as an expression. ptc_kir_end closes it. */
int ptc_kir_for(ptc_kir *k, const char *name, int extent, bool parallel);
void ptc_kir_end(ptc_kir *k);

/* Checks types, names (each bound once, used in scope), parameters, stores (out parameters
 * only), parallel loops (top level only). Returns 0 or -1 with a message naming the kernel. */
int ptc_kir_verify(const ptc_kir *k, char *err, size_t errn);

/* ---- text ---- */
void ptc_kir_print(const ptc_kir *k, FILE *f);
/* One kernel from the lexer's position ("kernel NAME(...) {...}"); NULL after a lexer error.
 * The kernel is verified. */
ptc_kir *ptc_kir_parse(ptc_lexer *lx);
/* A whole text holding one kernel; NULL with "line:col: message". */
ptc_kir *ptc_kir_parse_text(const char *text, char *err, size_t errn);
/* A 64-bit hash of the kernel's text with its name left out (the cache key of compiled code). */
uint64_t ptc_kir_hash(const ptc_kir *k);

/* ---- reference interpreter (double precision; loads and stores checked against the sizes) ----
 * Runs thread tid's part of the kernel over args (one pointer per parameter, aliases included).
 * Returns 0, or -1 with a message for an access out of bounds. */
int ptc_kir_run(const ptc_kir *k, void *const *args, int tid, int nt, char *err, size_t errn);
/* The whole kernel (ptc_kir_run's tid 0 of 1), checking the contract on parallel loops above
 * with the data at hand: -1 with a message naming the element and the two parts of the kernel
 * when a target's threads could race on it. An element written by one iteration of a parallel
 * loop (over n) may be read and written again only by the same iteration of a loop over n
 * (the same thread, for any thread count); one written by the top-level statements (which
 * every thread runs) may be read by any part, and written again only with the same bits; a
 * store that changes an element read by another part is a race too. */
int ptc_kir_run_checked(const ptc_kir *k, void *const *args, char *err, size_t errn);

/* Names of the expression kinds as the text form spells them (functions and reductions). */
extern const char *const ptc_kx_names[PTC_NKX];

#endif
