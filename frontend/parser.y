/* parser.y - the grammar of .ptm (bison, pure, with locations) building the AST of ast.h.
 *
 * Newlines are whitespace: statements need no separator because no expression can be followed by
 * a name or a keyword. Precedence is Python's: unary minus binds tightest, then `* / @` (left
 * associative, one level), then `+ -`; `as NAME` is a postfix on a call that binds tighter still.
 * The parser stops at the first error and reports it once, in words ("expected ')' before 'x'").
 */
%define api.pure full
%define api.prefix {ptc_yy}
%define parse.error custom
%define parse.lac full
%locations
%expect 0
%param {yyscan_t scanner}
%parse-param {ptc_pctx *ctx}

%code requires {
#include <stdbool.h>
#include <stddef.h>

#include "ast.h"

/* State shared by the scanner and the parser of one compilation. */
typedef struct ptc_pctx {
    ptc_arena *arena;
    ptc_interner names;
    ptc_diag *diag;
    const char *file;
    int line, col;           /* position of the next byte */
    size_t off;              /* its byte offset */
    size_t tok_off, tok_len; /* the last token scanned */
    const char *src;
    ptc_loc end;             /* just after the last token */
    bool failed;
    ptc_ast_file *out;
} ptc_pctx;

#ifndef YY_TYPEDEF_YY_SCANNER_T
#define YY_TYPEDEF_YY_SCANNER_T
typedef void *yyscan_t;
#endif

/* Reports the first error of the parse (later ones are dropped: one error per file). */
void ptc_pctx_error(ptc_pctx *c, ptc_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int ptc_lex_run(ptc_pctx *ctx, const char *src, size_t len);

/* A list under construction: head for the result, tail for O(1) appends. */
typedef struct ptc_arglist {
    ptc_arg *head, *tail;
    int n;
} ptc_arglist;
typedef struct ptc_stmtlist {
    ptc_stmt *head, *tail;
} ptc_stmtlist;
typedef struct ptc_formallist {
    ptc_formal *head, *tail;
    int n;
} ptc_formallist;
typedef struct ptc_identlist {
    ptc_ident *head, *tail;
    int n;
} ptc_identlist;
}

%code provides {
int ptc_yylex(PTC_YYSTYPE *yylval, PTC_YYLTYPE *yylloc, yyscan_t scanner);
}

%code {
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void ptc_yyerror(PTC_YYLTYPE *loc, yyscan_t scanner, ptc_pctx *ctx, const char *msg);

#define LOC(l) ((ptc_loc){.file = ctx->file, .line = (l).first_line, .col = (l).first_column})
#define A (ctx->arena)

/* Rejects an expression nested deeper than lowering may recurse. */
#define CHECK_DEPTH(e, l)                                                                          \
    do {                                                                                           \
        if ((e)->depth > PTC_AST_MAX_DEPTH) {                                                      \
            ptc_pctx_error(ctx, LOC(l), "expression nested too deeply (more than %d levels)",     \
                           PTC_AST_MAX_DEPTH);                                                     \
            YYABORT;                                                                               \
        }                                                                                          \
    } while (0)

#define BINARY(out, op, lhs, rhs, at)                                                              \
    do {                                                                                           \
        (out) = ptc_ast_binary(A, op, LOC(at), lhs, rhs);                                          \
        CHECK_DEPTH(out, at);                                                                      \
    } while (0)

static void args_append(ptc_arglist *l, ptc_arg *g)
{
    if (l->tail)
        l->tail->next = g;
    else
        l->head = g;
    l->tail = g;
    l->n++;
}

static void stmts_append(ptc_stmtlist *l, ptc_stmt *s)
{
    if (l->tail)
        l->tail->next = s;
    else
        l->head = s;
    l->tail = s;
}

static void formals_append(ptc_formallist *l, ptc_formal *f)
{
    if (l->tail)
        l->tail->next = f;
    else
        l->head = f;
    l->tail = f;
    l->n++;
}

static void idents_append(ptc_identlist *l, ptc_ident *i)
{
    if (l->tail)
        l->tail->next = i;
    else
        l->head = i;
    l->tail = i;
    l->n++;
}

static ptc_ident *ident(ptc_pctx *ctx, const char *name, PTC_YYLTYPE at)
{
    ptc_ident *i = ptc_arena_alloc(ctx->arena, sizeof *i);
    i->name = name;
    i->loc = LOC(at);
    return i;
}

static ptc_arg *positional(ptc_pctx *ctx, ptc_expr *e)
{
    return ptc_ast_arg(ctx->arena, NULL, e->loc, e);
}

static ptc_type_ast *type_ast(ptc_pctx *ctx, const char *dtype, ptc_loc loc, ptc_arglist dims)
{
    ptc_type_ast *t = ptc_arena_alloc(ctx->arena, sizeof *t);
    t->dtype = dtype;
    t->loc = loc;
    t->dims = dims.head;
    t->ndims = dims.n;
    return t;
}

/* `repeat COUNT as NAME {`: the grammar reads `COUNT as NAME` as an expression whose last
 * postfix is `as NAME` (the postfix binds tightest, so it sits at the end of the right spine).
 * Takes that postfix off and returns its name, or NULL if there is none. */
static const char *take_repeat_name(ptc_expr **count, ptc_loc *nameloc)
{
    ptc_expr **p = count;
    while (!(*p)->paren && ((*p)->kind == PTC_E_BIN || (*p)->kind == PTC_E_NEG))
        p = (*p)->kind == PTC_E_BIN ? &(*p)->rhs : &(*p)->lhs;
    if ((*p)->paren || (*p)->kind != PTC_E_AS)
        return NULL;
    const char *name = (*p)->name;
    *nameloc = (*p)->nameloc;
    *p = (*p)->lhs;
    return name;
}
}

%union {
    double num;
    const char *str;
    ptc_expr *expr;
    ptc_arg *arg;
    ptc_stmt *stmt;
    ptc_decl *decl;
    ptc_type_ast *type;
    ptc_formal *formal;
    ptc_arglist args;
    ptc_stmtlist stmts;
    ptc_formallist formals;
    ptc_identlist idents;
}

%token KW_CONST "'const'" KW_BLOCK "'block'" KW_MODEL "'model'" KW_PARAM "'param'"
%token KW_INIT "'init'" KW_AS "'as'" KW_REPEAT "'repeat'" KW_RETURN "'return'"
%token KW_OPTIMIZER "'optimizer'" KW_TRUE "'true'" KW_FALSE "'false'" ARROW "'->'"
%token <str> IDENT "a name"
%token <num> NUMBER "a number"
%token LEXERROR "an invalid token"

%left '+' '-'
%left '*' '/' '@'
%precedence UMINUS

%type <expr> expr postfix primary
%type <arg> arg
%type <args> args args_opt exprs exprs_opt
%type <stmt> stmt
%type <stmts> stmts
%type <decl> decl decls
%type <type> type ptype
%type <formal> formal
%type <formals> formals formals_opt
%type <idents> targets

%%

file:
    %empty                          { ctx->out->decls = NULL; }
  | decls
  ;

decls:
    decl                            { ctx->out->decls = $1; $$ = $1; }
  | decls decl                      { $1->next = $2; $$ = $2; }
  ;

/* const NAME = EXPR | block NAME(ARGS) -> TYPE { BODY } | model NAME(ARGS) { BODY }
 * | optimizer KIND(KEY=VALUE, ...) */
decl:
    KW_CONST IDENT '=' expr         {
                                        $$ = ptc_ast_decl(A, PTC_D_CONST, $2, LOC(@2));
                                        $$->value = $4;
                                    }
  | KW_BLOCK IDENT '(' formals_opt ')' ARROW type '{' stmts '}' {
                                        $$ = ptc_ast_decl(A, PTC_D_BLOCK, $2, LOC(@2));
                                        $$->formals = $4.head;
                                        $$->nformals = $4.n;
                                        $$->ret = $7;
                                        $$->body = $9.head;
                                        $$->endloc = LOC(@10);
                                    }
  | KW_MODEL IDENT '(' formals_opt ')' '{' stmts '}' {
                                        $$ = ptc_ast_decl(A, PTC_D_MODEL, $2, LOC(@2));
                                        $$->formals = $4.head;
                                        $$->nformals = $4.n;
                                        $$->body = $7.head;
                                        $$->endloc = LOC(@8);
                                    }
  | KW_OPTIMIZER IDENT '(' args_opt ')' {
                                        $$ = ptc_ast_decl(A, PTC_D_OPTIMIZER, $2, LOC(@2));
                                        $$->args = $4.head;
                                        $$->nargs = $4.n;
                                    }
  ;

formals_opt:
    %empty                          { $$ = (ptc_formallist){0}; }
  | formals
  | formals ','
  ;

formals:
    formal                          { $$ = (ptc_formallist){0}; formals_append(&$$, $1); }
  | formals ',' formal              { $$ = $1; formals_append(&$$, $3); }
  ;

/* ARG: DTYPE[DIMS] */
formal:
    IDENT ':' type                  {
                                        $$ = ptc_arena_alloc(A, sizeof *$$);
                                        $$->name = $1;
                                        $$->loc = LOC(@1);
                                        $$->type = $3;
                                    }
  ;

type:
    IDENT '[' exprs_opt ']'         { $$ = type_ast(ctx, $1, LOC(@1), $3); }
  ;

/* A param's type has no dtype; one written anyway is reported by lowering, in words. */
ptype:
    '[' exprs_opt ']'               { $$ = type_ast(ctx, NULL, LOC(@1), $2); }
  | type
  ;

stmts:
    %empty                          { $$ = (ptc_stmtlist){0}; }
  | stmts stmt                      { $$ = $1; stmts_append(&$$, $2); }
  ;

stmt:
    /* param NAME : [DIMS] init INIT */
    KW_PARAM IDENT ':' ptype KW_INIT IDENT {
                                        $$ = ptc_ast_stmt(A, PTC_S_PARAM, LOC(@2));
                                        $$->name = $2;
                                        $$->type = $4;
                                        $$->init = $6;
                                        $$->initloc = LOC(@6);
                                    }
  | KW_PARAM IDENT ':' ptype KW_INIT IDENT '(' args_opt ')' {
                                        $$ = ptc_ast_stmt(A, PTC_S_PARAM, LOC(@2));
                                        $$->name = $2;
                                        $$->type = $4;
                                        $$->init = $6;
                                        $$->initloc = LOC(@6);
                                        $$->initargs = $8.head;
                                        $$->ninitargs = $8.n;
                                    }
    /* NAME, NAME, ... = EXPR */
  | targets '=' expr                {
                                        $$ = ptc_ast_stmt(A, PTC_S_ASSIGN, $1.head->loc);
                                        $$->names = $1.head;
                                        $$->nnames = $1.n;
                                        $$->value = $3;
                                    }
    /* repeat COUNT as NAME { BODY } */
  | KW_REPEAT expr '{' stmts '}'    {
                                        $$ = ptc_ast_stmt(A, PTC_S_REPEAT, LOC(@1));
                                        $$->value = $2;
                                        $$->name = take_repeat_name(&$$->value, &$$->nameloc);
                                        if (!$$->name) {
                                            ptc_pctx_error(ctx, LOC(@3), "expected 'as NAME' "
                                                           "after the repeat count");
                                            YYABORT;
                                        }
                                        $$->body = $4.head;
                                    }
    /* return EXPR */
  | KW_RETURN expr                  {
                                        $$ = ptc_ast_stmt(A, PTC_S_RETURN, LOC(@1));
                                        $$->value = $2;
                                    }
  ;

targets:
    IDENT                           {
                                        $$ = (ptc_identlist){0};
                                        idents_append(&$$, ident(ctx, $1, @1));
                                    }
  | targets ',' IDENT               { $$ = $1; idents_append(&$$, ident(ctx, $3, @3)); }
  ;

expr:
    expr '+' expr                   { BINARY($$, '+', $1, $3, @2); }
  | expr '-' expr                   { BINARY($$, '-', $1, $3, @2); }
  | expr '*' expr                   { BINARY($$, '*', $1, $3, @2); }
  | expr '/' expr                   { BINARY($$, '/', $1, $3, @2); }
  | expr '@' expr                   { BINARY($$, '@', $1, $3, @2); }
  | '-' expr %prec UMINUS           {
                                        $$ = ptc_ast_unary(A, PTC_E_NEG, LOC(@1), $2);
                                        CHECK_DEPTH($$, @1);
                                    }
  | postfix
  ;

/* CALL as NAME */
postfix:
    primary
  | postfix KW_AS IDENT             {
                                        $$ = ptc_ast_unary(A, PTC_E_AS, LOC(@2), $1);
                                        $$->name = $3;
                                        $$->nameloc = LOC(@3);
                                        CHECK_DEPTH($$, @2);
                                    }
  ;

primary:
    NUMBER                          { $$ = ptc_ast_expr(A, PTC_E_NUM, LOC(@1)); $$->num = $1; }
  | KW_TRUE                         { $$ = ptc_ast_expr(A, PTC_E_BOOL, LOC(@1)); $$->truth = true; }
  | KW_FALSE                        { $$ = ptc_ast_expr(A, PTC_E_BOOL, LOC(@1)); }
  | IDENT                           { $$ = ptc_ast_expr(A, PTC_E_NAME, LOC(@1)); $$->name = $1; }
  | IDENT '(' args_opt ')'          {
                                        $$ = ptc_ast_call(A, $1, LOC(@1), $3.head, $3.n);
                                        CHECK_DEPTH($$, @1);
                                    }
  | '(' expr ')'                    { $$ = $2; $$->paren = true; }
  | '[' exprs_opt ']'               {
                                        $$ = ptc_ast_call(A, NULL, LOC(@1), $2.head, $2.n);
                                        $$->kind = PTC_E_LIST;
                                        CHECK_DEPTH($$, @1);
                                    }
  ;

args_opt:
    %empty                          { $$ = (ptc_arglist){0}; }
  | args
  | args ','
  ;

args:
    arg                             { $$ = (ptc_arglist){0}; args_append(&$$, $1); }
  | args ',' arg                    { $$ = $1; args_append(&$$, $3); }
  ;

/* EXPR | KEY=EXPR */
arg:
    expr                            { $$ = positional(ctx, $1); }
  | IDENT '=' expr                  { $$ = ptc_ast_arg(A, $1, LOC(@1), $3); }
  ;

exprs_opt:
    %empty                          { $$ = (ptc_arglist){0}; }
  | exprs
  | exprs ','
  ;

exprs:
    expr                            {
                                        $$ = (ptc_arglist){0};
                                        args_append(&$$, positional(ctx, $1));
                                    }
  | exprs ',' expr                  { $$ = $1; args_append(&$$, positional(ctx, $3)); }
  ;

%%

void ptc_pctx_error(ptc_pctx *c, ptc_loc loc, const char *fmt, ...)
{
    if (c->failed)
        return;
    c->failed = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ptc_diag_error(c->diag, loc, "%s", msg);
}

static void ptc_yyerror(PTC_YYLTYPE *loc, yyscan_t scanner, ptc_pctx *ctx, const char *msg)
{
    (void)scanner;
    if (strcmp(msg, "memory exhausted") == 0)
        msg = "input nested too deeply";
    ptc_pctx_error(ctx, LOC(*loc), "%s", msg);
}

/* Whether symbol s is spelt as one of the names in list (space separated, e.g. "'+' '-'"). */
static bool sym_in(yysymbol_kind_t s, const char *list)
{
    const char *name = yysymbol_name(s);
    size_t n = strlen(name);
    for (const char *p = strstr(list, name); p; p = strstr(p + 1, name))
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0))
            return true;
    return false;
}

/* What a syntax error says was expected: a few tokens in words. Operators and `as` that could
 * continue an expression are left out when something else was possible, and the tokens that
 * start an expression or a statement are said as "an expression" / "a statement". */
static int expected_words(const yypcontext_t *yyctx, const char **words, int cap)
{
    static const char ops[] = "'as' '+' '-' '*' '/' '@' end of file";
    static const char stmt_start[] = "a name 'param' 'repeat' 'return'";
    static const char expr_start[] = "a number a name 'true' 'false' '(' '[' '-'";
    yysymbol_kind_t exp[YYNTOKENS];
    int n = yypcontext_expected_tokens(yyctx, exp, YYNTOKENS);
    bool stmt = false, expr = false;
    for (int i = 0; i < n; i++) {
        stmt |= exp[i] == YYSYMBOL_KW_PARAM;
        expr |= exp[i] == YYSYMBOL_NUMBER;
    }
    /* after a name inside brackets, "(" and "=" (a call, a keyword) are rarely what was meant */
    bool closer = false;
    for (int i = 0; i < n; i++)
        closer |= sym_in(exp[i], "')' ']'");
    int k = 0;
    if (stmt)
        words[k++] = "a statement";
    if (expr)
        words[k++] = "an expression";
    for (int i = 0; i < n; i++) {
        yysymbol_kind_t s = exp[i];
        if ((stmt && sym_in(s, stmt_start)) || (expr && sym_in(s, expr_start)) || sym_in(s, ops) ||
            (closer && sym_in(s, "'(' '='")))
            continue;
        if (k < cap)
            words[k++] = yysymbol_name(s);
    }
    if (k == 0) /* only operators were possible */
        for (int i = 0; i < n && k < cap; i++)
            words[k++] = yysymbol_name(exp[i]);
    return k;
}

static int yyreport_syntax_error(const yypcontext_t *yyctx, yyscan_t scanner, ptc_pctx *ctx)
{
    (void)scanner;
    if (ctx->failed)
        return 0;
    yysymbol_kind_t got = yypcontext_token(yyctx);
    if (got == YYSYMBOL_LEXERROR)
        return 0; /* the scanner has said what is wrong */
    char where[80];
    int toklen = (int)(ctx->tok_len > 40 ? 40 : ctx->tok_len);
    const char *tok = ctx->src + ctx->tok_off, *more = ctx->tok_len > 40 ? "..." : "";
    if (got == YYSYMBOL_YYEOF)
        snprintf(where, sizeof where, "at end of input");
    else
        snprintf(where, sizeof where, "before '%.*s%s'", toklen, tok, more);
    const char *words[5];
    int k = expected_words(yyctx, words, 5);
    char msg[400];
    if (k == 0 || k > 4) {
        if (got == YYSYMBOL_YYEOF)
            snprintf(msg, sizeof msg, "unexpected end of input");
        else
            snprintf(msg, sizeof msg, "unexpected '%.*s%s'", toklen, tok, more);
    } else {
        size_t m = (size_t)snprintf(msg, sizeof msg, "expected ");
        for (int i = 0; i < k && m < sizeof msg; i++)
            m += (size_t)snprintf(msg + m, sizeof msg - m, "%s%s",
                                  i == 0 ? "" : i == k - 1 ? " or " : ", ", words[i]);
        if (m < sizeof msg)
            snprintf(msg + m, sizeof msg - m, " %s", where);
    }
    ptc_pctx_error(ctx, LOC(*yypcontext_location(yyctx)), "%s", msg);
    return 0;
}

int ptc_parse(ptc_arena *a, const char *path, const char *src, size_t len, ptc_diag *diag,
              ptc_ast_file *out)
{
    ptc_pctx ctx = {.arena = a, .names = {.arena = a}, .diag = diag, .file = path, .line = 1,
                    .col = 1, .src = src, .out = out};
    ctx.end = (ptc_loc){.file = path, .line = 1, .col = 1};
    memset(out, 0, sizeof *out);
    if (len > (size_t)1 << 30) {
        ptc_pctx_error(&ctx, (ptc_loc){.file = path}, "input is too large (more than 1 GiB)");
        return -1;
    }
    int rc = ptc_lex_run(&ctx, src, len);
    ptc_interner_free(&ctx.names);
    out->endloc = ctx.end;
    if (rc != 0 && !ctx.failed)
        ptc_pctx_error(&ctx, ctx.end, "syntax error");
    return rc == 0 && !ctx.failed ? 0 : -1;
}
