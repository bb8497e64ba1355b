/* kir_text.c - the text form of the kernel IR (see kir.h): printer, parser and the hash that keys
 * compiled code.
 *
 *   kernel NAME(PARAM, ...) { STATEMENT ... }
 *   PARAM     NAME: [out | local] f32|bf16|f16|i32[NUMEL] [= IN_PARAM]
 *   STATEMENT let NAME = EXPR | NAME[EXPR] = EXPR | for NAME < EXPR [parallel] { STATEMENT ... }
 *   EXPR      comparison of sums of products of unary expressions (C precedence, left to right);
 *             primary: NUMBER (with '.' or 'e': f32, else i64), NAME, NAME[EXPR], (EXPR),
 *             FUNC(EXPR, ...), sum(NAME < EXPR: EXPR), maxr(NAME < EXPR: EXPR)
 *
 * Names are bound once; the printer writes exactly what the parser reads (print, parse, print
 * gives the same text).
 */
#include <stdlib.h>
#include <string.h>

#include "file.h"
#include "kir.h"

/* ---- printing ---- */

static int prec(ptc_kx_kind k)
{
    switch (k) {
    case PTC_KX_LT:
    case PTC_KX_LE:
    case PTC_KX_EQ:
    case PTC_KX_NE: return 1;
    case PTC_KX_ADD:
    case PTC_KX_SUB: return 2;
    case PTC_KX_MUL:
    case PTC_KX_DIV:
    case PTC_KX_REM: return 3;
    case PTC_KX_NEG: return 4;
    default: return 5;
    }
}

static const char *op_text(ptc_kx_kind k)
{
    switch (k) {
    case PTC_KX_LT: return " < ";
    case PTC_KX_LE: return " <= ";
    case PTC_KX_EQ: return " == ";
    case PTC_KX_NE: return " != ";
    case PTC_KX_ADD: return " + ";
    case PTC_KX_SUB: return " - ";
    case PTC_KX_MUL: return " * ";
    case PTC_KX_DIV: return " / ";
    default: return " % ";
    }
}

static void put_float(FILE *f, double x)
{
    char buf[64];
    for (int p = 6; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    if (!strpbrk(buf, ".e"))
        strcat(buf, ".0");
    fputs(buf, f);
}

static void put_x(FILE *f, const ptc_kir *k, int e, int min_prec)
{
    const ptc_kx *x = &k->x[e];
    int p = prec((ptc_kx_kind)x->kind);
    bool paren = p < min_prec || (x->kind == PTC_KX_FCONST && x->f < 0 && min_prec > 2) ||
                 (x->kind == PTC_KX_ICONST && x->i < 0 && min_prec > 2);
    if (paren)
        fputc('(', f);
    switch ((ptc_kx_kind)x->kind) {
    case PTC_KX_FCONST: put_float(f, x->f); break;
    case PTC_KX_ICONST: fprintf(f, "%lld", (long long)x->i); break;
    case PTC_KX_VAR: fputs(k->vars[x->var].name, f); break;
    case PTC_KX_LOAD:
        fprintf(f, "%s[", k->params[x->param].name);
        put_x(f, k, x->a, 0);
        fputc(']', f);
        break;
    case PTC_KX_NEG:
        fputc('-', f);
        put_x(f, k, x->a, 5);
        break;
    case PTC_KX_MIN:
    case PTC_KX_MAX:
    case PTC_KX_SELECT:
    case PTC_KX_EXP:
    case PTC_KX_LOG:
    case PTC_KX_SQRT:
    case PTC_KX_TANH:
    case PTC_KX_SIN:
    case PTC_KX_COS:
    case PTC_KX_FLOAT:
    case PTC_KX_RBF16:
    case PTC_KX_RF16:
        fprintf(f, "%s(", ptc_kx_names[x->kind]);
        put_x(f, k, x->a, 0);
        if (x->b >= 0) {
            fputs(", ", f);
            put_x(f, k, x->b, 0);
        }
        if (x->c >= 0) {
            fputs(", ", f);
            put_x(f, k, x->c, 0);
        }
        fputc(')', f);
        break;
    case PTC_KX_SUM:
    case PTC_KX_RMAX:
        fprintf(f, "%s(%s < ", ptc_kx_names[x->kind], k->vars[x->var].name);
        put_x(f, k, x->a, 0);
        fputs(": ", f);
        put_x(f, k, x->b, 0);
        fputc(')', f);
        break;
    default: /* binary operators, left-associative */
        put_x(f, k, x->a, p);
        fputs(op_text((ptc_kx_kind)x->kind), f);
        put_x(f, k, x->b, p + 1);
    }
    if (paren)
        fputc(')', f);
}

static void put_list(FILE *f, const ptc_kir *k, int s, int depth)
{
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        fprintf(f, "%*s", 4 * depth, "");
        switch (st->kind) {
        case PTC_KS_LET:
            fprintf(f, "let %s = ", k->vars[st->var].name);
            put_x(f, k, st->value, 0);
            break;
        case PTC_KS_STORE:
            fprintf(f, "%s[", k->params[st->param].name);
            put_x(f, k, st->index, 0);
            fputs("] = ", f);
            put_x(f, k, st->value, 0);
            break;
        default:
            fprintf(f, "for %s < ", k->vars[st->var].name);
            put_x(f, k, st->extent, 0);
            fputs(st->parallel ? " parallel {\n" : " {\n", f);
            put_list(f, k, st->body, depth + 1);
            fprintf(f, "%*s}", 4 * depth, "");
        }
        fputc('\n', f);
    }
}

void ptc_kir_print(const ptc_kir *k, FILE *f)
{
    fprintf(f, "kernel %s(", k->name);
    for (int p = 0; p < k->nparams; p++) {
        const ptc_kparam *pp = &k->params[p];
        fprintf(f, "%s%s: %s%s[%lld]", p ? ", " : "", pp->name,
                pp->local ? "local "
                : pp->out ? "out "
                          : "",
                ptc_dtype_name(pp->dtype), (long long)pp->numel);
        if (pp->alias >= 0)
            fprintf(f, " = %s", k->params[pp->alias].name);
    }
    fputs(") {\n", f);
    put_list(f, k, k->body, 1);
    fputs("}\n", f);
}

uint64_t ptc_kir_hash(const ptc_kir *k)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    PTC_ASSERT(f);
    ptc_kir_print(k, f);
    fclose(f);
    /* leave the name out: the same code under another name is the same kernel */
    const char *body = strchr(text, '(');
    uint64_t h = ptc_hash64(body, strlen(body), 0x6b6972);
    free(text);
    return h;
}

/* ---- parsing ---- */

typedef struct parser {
    ptc_lexer *lx;
    ptc_kir *k;
    int *scope; /* names in scope, innermost last */
    int nscope, capscope;
} parser;

static int lookup_var(parser *ps, const char *name)
{
    for (int i = ps->nscope - 1; i >= 0; i--)
        if (strcmp(ps->k->vars[ps->scope[i]].name, name) == 0)
            return ps->scope[i];
    return -1;
}

static int lookup_param(parser *ps, const char *name)
{
    for (int p = 0; p < ps->k->nparams; p++)
        if (strcmp(ps->k->params[p].name, name) == 0)
            return p;
    return -1;
}

static void push_scope(parser *ps, int var)
{
    PTC_GROW(ps->scope, ps->capscope, ps->nscope);
    ps->scope[ps->nscope++] = var;
}

static int parse_x(parser *ps);

/* The identifier at the lexer, copied into name[n] (the lexer stays on it); not an identifier:
 * the lexer fails with "expected WHAT, got '...'". */
static void name_at(ptc_lexer *lx, char *name, size_t n, const char *what)
{
    ptc_fmt(name, n, "%s", lx->text);
    if (lx->kind != PTC_T_IDENT) {
        char fmt[96];
        ptc_fmt(fmt, sizeof fmt, "expected %s, got '%%s'", what);
        ptc_lex_fail(lx, fmt, lx->text);
    }
}

static int new_name(parser *ps, ptc_kt type)
{
    ptc_lexer *lx = ps->lx;
    if (lx->kind != PTC_T_IDENT) {
        ptc_lex_fail(lx, "expected a name, got '%s'", lx->text);
        return -1;
    }
    int v = ptc_kir_var(ps->k, lx->text, type);
    ptc_lex_next(lx);
    return v;
}

static int parse_reduce(parser *ps, ptc_kx_kind kind)
{
    ptc_lexer *lx = ps->lx;
    ptc_lex_expect(lx, '(');
    int var = new_name(ps, PTC_KT_I64);
    ptc_lex_expect(lx, '<');
    int extent = parse_x(ps);
    ptc_lex_expect(lx, ':');
    if (lx->failed)
        return -1;
    push_scope(ps, var);
    int body = parse_x(ps);
    ps->nscope--;
    ptc_lex_expect(lx, ')');
    return lx->failed ? -1 : ptc_kx_reduce(ps->k, kind, var, extent, body);
}

static int parse_call(parser *ps, int kind)
{
    ptc_lexer *lx = ps->lx;
    int args[3] = {-1, -1, -1}, n = 0;
    ptc_lex_expect(lx, '(');
    while (!lx->failed && n < 3) {
        args[n++] = parse_x(ps);
        if (!ptc_lex_punct(lx, ','))
            break;
        ptc_lex_next(lx);
    }
    ptc_lex_expect(lx, ')');
    int want = kind == PTC_KX_SELECT ? 3 : kind == PTC_KX_MIN || kind == PTC_KX_MAX ? 2 : 1;
    if (!lx->failed && n != want)
        ptc_lex_fail(lx, "wrong number of arguments to %s", ptc_kx_names[kind]);
    if (lx->failed)
        return -1;
    if (kind == PTC_KX_SELECT)
        return ptc_kx_select(ps->k, args[0], args[1], args[2]);
    return want == 2 ? ptc_kx_bin(ps->k, (ptc_kx_kind)kind, args[0], args[1])
                     : ptc_kx_un(ps->k, (ptc_kx_kind)kind, args[0]);
}

static int parse_primary(parser *ps)
{
    ptc_lexer *lx = ps->lx;
    if (lx->failed)
        return -1;
    if (lx->kind == PTC_T_NUM) {
        bool f = strpbrk(lx->text, ".eEni") != NULL;
        if (f)
            return ptc_kx_f(ps->k, ptc_lex_number(lx));
        return ptc_kx_i(ps->k, ptc_lex_int(lx));
    }
    if (ptc_lex_punct(lx, '(')) {
        ptc_lex_next(lx);
        int e = parse_x(ps);
        ptc_lex_expect(lx, ')');
        return e;
    }
    if (lx->kind != PTC_T_IDENT) {
        ptc_lex_fail(lx, "expected an expression, got '%s'", lx->text);
        return -1;
    }
    char name[256];
    ptc_fmt(name, sizeof name, "%s", lx->text);
    ptc_lex_next(lx);
    if (ptc_lex_punct(lx, '(')) {
        for (int kind = 0; kind < PTC_NKX; kind++)
            if (ptc_kx_names[kind] && kind != PTC_KX_NEG && strcmp(ptc_kx_names[kind], name) == 0)
                return kind == PTC_KX_SUM || kind == PTC_KX_RMAX
                           ? parse_reduce(ps, (ptc_kx_kind)kind)
                           : parse_call(ps, kind);
        ptc_lex_fail(lx, "unknown function '%s'", name);
        return -1;
    }
    if (ptc_lex_punct(lx, '[')) {
        int p = lookup_param(ps, name);
        if (p < 0) {
            ptc_lex_fail(lx, "unknown parameter '%s'", name);
            return -1;
        }
        ptc_lex_next(lx);
        int index = parse_x(ps);
        ptc_lex_expect(lx, ']');
        return lx->failed ? -1 : ptc_kx_load(ps->k, p, index);
    }
    int v = lookup_var(ps, name);
    if (v < 0) {
        ptc_lex_fail(lx, "'%s' is not bound here", name);
        return -1;
    }
    return ptc_kx_v(ps->k, v);
}

static int parse_unary(parser *ps)
{
    if (ptc_lex_punct(ps->lx, '-')) {
        ptc_lex_next(ps->lx);
        int a = parse_unary(ps);
        return a < 0 ? -1 : ptc_kx_un(ps->k, PTC_KX_NEG, a);
    }
    return parse_primary(ps);
}

static int parse_level(parser *ps, int level)
{
    ptc_lexer *lx = ps->lx;
    if (level == 3)
        return parse_unary(ps);
    int a = parse_level(ps, level + 1);
    /* the lexer reads '%' as the start of a %N value reference: a lone '%' is the operator */
    while (!lx->failed && a >= 0 &&
           (lx->kind == PTC_T_PUNCT || (lx->kind == PTC_T_VALUE && strcmp(lx->text, "%") == 0))) {
        char c = lx->text[0];
        ptc_kx_kind kind;
        if (level == 2 && (c == '*' || c == '/' || c == '%'))
            kind = c == '*' ? PTC_KX_MUL : c == '/' ? PTC_KX_DIV : PTC_KX_REM;
        else if (level == 1 && (c == '+' || c == '-'))
            kind = c == '+' ? PTC_KX_ADD : PTC_KX_SUB;
        else if (level == 0 && (c == '<' || c == '=' || c == '!'))
            kind = c == '<' ? PTC_KX_LT : c == '=' ? PTC_KX_EQ : PTC_KX_NE;
        else
            break;
        if (level == 0) { /* <, <=, ==, != (the lexer gives one character at a time) */
            const char *p = lx->p;
            bool eq = *p == '=';
            if (c != '<' && !eq)
                break; /* a lone '=' ends the expression */
            ptc_lex_next(lx);
            if (eq) {
                ptc_lex_next(lx);
                if (kind == PTC_KX_LT)
                    kind = PTC_KX_LE;
            }
        } else {
            ptc_lex_next(lx);
        }
        int b = parse_level(ps, level + 1);
        if (b < 0)
            return -1;
        a = ptc_kx_bin(ps->k, kind, a, b);
        if (level == 0)
            break;
    }
    return a;
}

static int parse_x(parser *ps)
{
    return parse_level(ps, 0);
}

static void parse_block(parser *ps);

static void parse_statement(parser *ps)
{
    ptc_lexer *lx = ps->lx;
    ptc_kir *k = ps->k;
    if (ptc_lex_ident(lx, "let")) {
        ptc_lex_next(lx);
        char name[256];
        name_at(lx, name, sizeof name, "a name");
        if (lookup_var(ps, name) >= 0)
            ptc_lex_fail(lx, "'%s' is already bound", name);
        ptc_lex_next(lx);
        ptc_lex_expect(lx, '=');
        int value = parse_x(ps);
        if (lx->failed)
            return;
        int v = ptc_kir_var(k, name, (ptc_kt)k->x[value].type);
        ptc_kir_let(k, v, value);
        push_scope(ps, v);
    } else if (ptc_lex_ident(lx, "for")) {
        ptc_lex_next(lx);
        char name[256];
        name_at(lx, name, sizeof name, "a name");
        ptc_lex_next(lx);
        ptc_lex_expect(lx, '<');
        int extent = parse_x(ps);
        bool parallel = ptc_lex_ident(lx, "parallel");
        if (parallel)
            ptc_lex_next(lx);
        if (lx->failed)
            return;
        if (k->depth + 2 >= (int)(sizeof k->open_first / sizeof k->open_first[0])) {
            ptc_lex_fail(lx, "loops nested too deep%s", "");
            return;
        }
        int iv = ptc_kir_for(k, name, extent, parallel);
        int depth = ps->nscope;
        push_scope(ps, k->x[iv].var);
        parse_block(ps);
        ps->nscope = depth;
        ptc_kir_end(k);
    } else {
        int p = lx->kind == PTC_T_IDENT ? lookup_param(ps, lx->text) : -1;
        if (p < 0) {
            ptc_lex_fail(lx, "expected a statement, got '%s'", lx->text);
            return;
        }
        ptc_lex_next(lx);
        ptc_lex_expect(lx, '[');
        int index = parse_x(ps);
        ptc_lex_expect(lx, ']');
        ptc_lex_expect(lx, '=');
        int value = parse_x(ps);
        if (!lx->failed)
            ptc_kir_store(k, p, index, value);
    }
}

static void parse_block(parser *ps)
{
    ptc_lexer *lx = ps->lx;
    int depth = ps->nscope;
    ptc_lex_expect(lx, '{');
    while (!lx->failed && !ptc_lex_punct(lx, '}')) {
        if (lx->kind == PTC_T_EOF) {
            ptc_lex_fail(lx, "expected '}', got '%s'", lx->text);
            break;
        }
        parse_statement(ps);
    }
    ptc_lex_expect(lx, '}');
    ps->nscope = depth;
}

static void parse_param(parser *ps)
{
    ptc_lexer *lx = ps->lx;
    char name[256];
    name_at(lx, name, sizeof name, "a parameter name");
    ptc_lex_next(lx);
    ptc_lex_expect(lx, ':');
    bool local = ptc_lex_ident(lx, "local"), out = local || ptc_lex_ident(lx, "out");
    if (out)
        ptc_lex_next(lx);
    ptc_dtype dt = ptc_lex_ident(lx, "f32")    ? PTC_F32
                   : ptc_lex_ident(lx, "bf16") ? PTC_BF16
                   : ptc_lex_ident(lx, "f16")  ? PTC_F16
                   : ptc_lex_ident(lx, "i32")  ? PTC_I32
                                               : PTC_NDTYPES;
    if (dt == PTC_NDTYPES)
        ptc_lex_fail(lx, "expected f32, bf16, f16 or i32, got '%s'", lx->text);
    ptc_lex_next(lx);
    ptc_lex_expect(lx, '[');
    int64_t n = ptc_lex_int(lx);
    ptc_lex_expect(lx, ']');
    int alias = -1;
    if (ptc_lex_punct(lx, '=')) {
        ptc_lex_next(lx);
        alias = lx->kind == PTC_T_IDENT ? lookup_param(ps, lx->text) : -1;
        if (alias < 0)
            ptc_lex_fail(lx, "unknown parameter '%s'", lx->text);
        ptc_lex_next(lx);
    }
    if (!lx->failed) {
        int p = ptc_kir_param(ps->k, name, dt, n, out, alias); /* (may move the array) */
        ps->k->params[p].local = local;
    }
}

ptc_kir *ptc_kir_parse(ptc_lexer *lx)
{
    ptc_lex_keyword(lx, "kernel");
    if (lx->kind != PTC_T_IDENT) {
        ptc_lex_fail(lx, "expected a kernel name, got '%s'", lx->text);
        return NULL;
    }
    parser ps = {.lx = lx, .k = ptc_kir_new(lx->text)};
    ptc_lex_next(lx);
    ptc_lex_expect(lx, '(');
    while (!lx->failed && !ptc_lex_punct(lx, ')')) {
        parse_param(&ps);
        if (!ptc_lex_punct(lx, ')'))
            ptc_lex_expect(lx, ',');
    }
    ptc_lex_expect(lx, ')');
    parse_block(&ps);
    free(ps.scope);
    char msg[512];
    if (!lx->failed && ptc_kir_verify(ps.k, msg, sizeof msg) < 0)
        ptc_lex_fail(lx, "%s", msg);
    if (lx->failed) {
        ptc_kir_free(ps.k);
        return NULL;
    }
    return ps.k;
}

ptc_kir *ptc_kir_parse_text(const char *text, char *err, size_t errn)
{
    ptc_lexer lx;
    ptc_lex_init(&lx, text, err, errn);
    ptc_kir *k = ptc_kir_parse(&lx);
    if (k && lx.kind != PTC_T_EOF) {
        ptc_lex_fail(&lx, "unexpected '%s' after the kernel", lx.text);
        ptc_kir_free(k);
        return NULL;
    }
    return k;
}
