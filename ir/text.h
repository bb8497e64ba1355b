/* text.h - the pieces the text forms share: a lexer with positions and a sticky error, and
 * printers and readers for numbers, strings, lists, types with placements, attributes (through
 * the attribute table, attrs.def), initialisers, meshes and the optimizer line.
 *
 * The IR's text form (print.c, parse.c) and the plan's (plan/text.c) are built from them, so a
 * type, a placement or an attribute reads and prints the same way everywhere.
 */
#ifndef PTC_TEXT_H
#define PTC_TEXT_H

#include <stdbool.h>
#include <stdio.h>

#include "ir.h"

typedef enum { PTC_T_EOF, PTC_T_IDENT, PTC_T_VALUE, PTC_T_NUM, PTC_T_STR, PTC_T_PUNCT } ptc_tok;

/* A lexer over NUL-terminated text. Tokens: identifiers, %N value references, numbers, "strings"
 * (with \\, \" and \xHH escapes), single punctuation characters; # starts a comment to the end of
 * the line. The first error sticks ("line:col: message" in err); later calls do nothing. */
typedef struct ptc_lexer {
    const char *p;
    int line, col;   /* start of the current token */
    int pline, pcol; /* position of p */
    ptc_tok kind;
    char text[2048]; /* identifier / number text / string contents / punctuation */
    char *err;
    size_t errn;
    bool failed;
} ptc_lexer;

void ptc_lex_init(ptc_lexer *lx, const char *text, char *err, size_t errn);
void ptc_lex_next(ptc_lexer *lx);
/* Records an error at the current token (fmt has one %s for arg). */
void ptc_lex_fail(ptc_lexer *lx, const char *fmt, const char *arg);
bool ptc_lex_punct(const ptc_lexer *lx, char c);
bool ptc_lex_ident(const ptc_lexer *lx, const char *word);
void ptc_lex_expect(ptc_lexer *lx, char c);
/* Reads a word that must be `word`. */
void ptc_lex_keyword(ptc_lexer *lx, const char *word);
double ptc_lex_number(ptc_lexer *lx);
int64_t ptc_lex_int(ptc_lexer *lx);
/* [a,b,...] into out (at most PTC_MAX_RANK entries); returns the count. */
int ptc_lex_list(ptc_lexer *lx, int64_t *out);
/* A string token, copied into the arena. */
const char *ptc_lex_string(ptc_lexer *lx, ptc_arena *a);
/* A type with an optional placement suffix: f32[8,64]<S0,R,P,S1x3>. */
void ptc_lex_type(ptc_lexer *lx, ptc_type *t, ptc_placement *place);
/* The value of attribute `bit` (after its "name="), into attrs; names go into the arena. */
void ptc_lex_attr_value(ptc_lexer *lx, unsigned bit, ptc_attrs *attrs, ptc_arena *a);
/* {key=value, ...} of op: attributes the op carries; keys that are not attributes are handed to
 * other(ctx, lx, key) when given (it reads the value and returns false to reject the key). */
void ptc_lex_attrs(ptc_lexer *lx, ptc_op op, ptc_attrs *attrs, ptc_arena *a,
                   bool (*other)(void *ctx, ptc_lexer *lx, const char *key), void *ctx);
/* dp=2,tp=4 */
void ptc_lex_mesh(ptc_lexer *lx, ptc_mesh *m);
/* adamw(lr=..., ...) or sgd(...) after the word "optimizer". */
void ptc_lex_optim(ptc_lexer *lx, ptc_optim *o);

/* Printers */
void ptc_put_double(FILE *f, double x); /* shortest form that reads back to the same double */
void ptc_put_string(FILE *f, const char *s);
void ptc_put_list(FILE *f, const int64_t *v, int n);
void ptc_put_placement(FILE *f, ptc_placement p); /* R, P, S1, S1x3, S0r24 (see ptc_placement) */
/* f32[8,64] and, when any axis is not Replicate, <S0,R>. */
void ptc_put_type(FILE *f, const ptc_type *t, const ptc_placement *place);
void ptc_put_attr(FILE *f, const ptc_attrs *a, unsigned bit); /* name=value */
/* " {a=1, b=2" for the attributes op carries, without the closing brace; returns how many. */
int ptc_put_attrs(FILE *f, ptc_op op, const ptc_attrs *a);
void ptc_put_mesh(FILE *f, const ptc_mesh *m); /* dp=2,tp=4 */
void ptc_put_optim(FILE *f, const ptc_optim *o);

#endif
