/* text.c - the lexer, readers and printers the text forms share (see text.h). */
#include "text.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* ---- lexer ---- */

void ptc_lex_fail(ptc_lexer *lx, const char *fmt, const char *arg)
{
    if (lx->failed)
        return;
    lx->failed = true;
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, arg);
    ptc_fmt(lx->err, lx->errn, "%d:%d: %s", lx->line, lx->col, msg);
}

static void advance_to(ptc_lexer *lx, const char *to)
{
    for (; lx->p < to; lx->p++) {
        if (*lx->p == '\n') {
            lx->pline++;
            lx->pcol = 1;
        } else {
            lx->pcol++;
        }
    }
}

static void skip_space(ptc_lexer *lx)
{
    for (;;) {
        while (*lx->p && isspace((unsigned char)*lx->p))
            advance_to(lx, lx->p + 1);
        if (*lx->p != '#')
            return;
        const char *e = strchr(lx->p, '\n');
        advance_to(lx, e ? e : lx->p + strlen(lx->p));
    }
}

static void lex_string(ptc_lexer *lx)
{
    const char *e = lx->p + 1;
    size_t n = 0;
    lx->kind = PTC_T_STR;
    while (*e && *e != '"' && n + 1 < sizeof lx->text) {
        if (*e == '\\' && e[1] == 'x' && isxdigit((unsigned char)e[2]) &&
            isxdigit((unsigned char)e[3])) {
            char hex[3] = {e[2], e[3], 0};
            lx->text[n++] = (char)strtol(hex, NULL, 16);
            e += 4;
        } else {
            if (*e == '\\' && e[1])
                e++;
            lx->text[n++] = *e++;
        }
    }
    lx->text[n] = 0;
    if (*e != '"') {
        ptc_lex_fail(lx, "unterminated or too long string%s", "");
        lx->kind = PTC_T_EOF;
        return;
    }
    advance_to(lx, e + 1);
}

void ptc_lex_next(ptc_lexer *lx)
{
    if (lx->failed) {
        lx->kind = PTC_T_EOF;
        return;
    }
    skip_space(lx);
    const char *p = lx->p, *e = p;
    lx->line = lx->pline;
    lx->col = lx->pcol;
    if (!*p) {
        lx->kind = PTC_T_EOF;
        strcpy(lx->text, "end of input");
        return;
    }
    if (*p == '"') {
        lex_string(lx);
        return;
    }
    if (isalpha((unsigned char)*p) || *p == '_') {
        while (isalnum((unsigned char)*e) || *e == '_')
            e++;
        lx->kind = PTC_T_IDENT;
    } else if (*p == '%') {
        e = p + 1;
        while (isdigit((unsigned char)*e))
            e++;
        lx->kind = PTC_T_VALUE;
    } else if (isdigit((unsigned char)*p) ||
               ((*p == '-' || *p == '+') &&
                (isdigit((unsigned char)p[1]) || p[1] == 'i' || p[1] == 'n'))) {
        char *end;
        strtod(p, &end);
        e = end > p ? end : p + 1;
        lx->kind = PTC_T_NUM;
    } else {
        e = p + 1;
        lx->kind = PTC_T_PUNCT;
    }
    size_t n = (size_t)(e - p) < sizeof lx->text - 1 ? (size_t)(e - p) : sizeof lx->text - 1;
    memcpy(lx->text, p, n);
    lx->text[n] = 0;
    advance_to(lx, e);
}

void ptc_lex_init(ptc_lexer *lx, const char *text, char *err, size_t errn)
{
    memset(lx, 0, sizeof *lx);
    lx->p = text;
    lx->pline = lx->pcol = 1;
    lx->err = err;
    lx->errn = errn;
    if (errn)
        err[0] = 0;
    ptc_lex_next(lx);
}

bool ptc_lex_punct(const ptc_lexer *lx, char c)
{
    return lx->kind == PTC_T_PUNCT && lx->text[0] == c;
}

bool ptc_lex_ident(const ptc_lexer *lx, const char *word)
{
    return lx->kind == PTC_T_IDENT && strcmp(lx->text, word) == 0;
}

void ptc_lex_expect(ptc_lexer *lx, char c)
{
    if (!ptc_lex_punct(lx, c)) {
        char msg[64];
        snprintf(msg, sizeof msg, "expected '%c'", c);
        ptc_lex_fail(lx, "%s", msg);
        return;
    }
    ptc_lex_next(lx);
}

void ptc_lex_keyword(ptc_lexer *lx, const char *word)
{
    if (!ptc_lex_ident(lx, word)) {
        char msg[128];
        snprintf(msg, sizeof msg, "expected '%s', got '%%s'", word);
        ptc_lex_fail(lx, msg, lx->text);
        return;
    }
    ptc_lex_next(lx);
}

double ptc_lex_number(ptc_lexer *lx)
{
    bool special = lx->kind == PTC_T_IDENT &&
                   (strcmp(lx->text, "inf") == 0 || strcmp(lx->text, "nan") == 0);
    if (lx->kind != PTC_T_NUM && !special) {
        ptc_lex_fail(lx, "expected a number, got '%.200s'", lx->text);
        return 0;
    }
    double v = strtod(lx->text, NULL);
    ptc_lex_next(lx);
    return v;
}

int64_t ptc_lex_int(ptc_lexer *lx)
{
    double v = ptc_lex_number(lx);
    if (!(v >= -9.2e18 && v <= 9.2e18) || v != (double)(int64_t)v)
        ptc_lex_fail(lx, "expected an integer%s", "");
    return lx->failed ? 0 : (int64_t)v;
}

int ptc_lex_list(ptc_lexer *lx, int64_t *out)
{
    int n = 0;
    ptc_lex_expect(lx, '[');
    while (!lx->failed && !ptc_lex_punct(lx, ']')) {
        if (n == PTC_MAX_RANK) {
            ptc_lex_fail(lx, "more than %s entries in a list", "8");
            return 0;
        }
        out[n++] = ptc_lex_int(lx);
        if (!ptc_lex_punct(lx, ']'))
            ptc_lex_expect(lx, ',');
    }
    ptc_lex_expect(lx, ']');
    return n;
}

const char *ptc_lex_string(ptc_lexer *lx, ptc_arena *a)
{
    if (lx->kind != PTC_T_STR) {
        ptc_lex_fail(lx, "expected a string, got '%.200s'", lx->text);
        return "";
    }
    const char *s = ptc_arena_strdup(a, lx->text);
    ptc_lex_next(lx);
    return s;
}

static void lex_placement(ptc_lexer *lx, ptc_placement *pl)
{
    if (ptc_lex_ident(lx, "R")) {
        pl->kind = PTC_PLACE_REPLICATE;
    } else if (ptc_lex_ident(lx, "P")) {
        pl->kind = PTC_PLACE_PARTIAL;
    } else if (lx->kind == PTC_T_IDENT && lx->text[0] == 'S' &&
               isdigit((unsigned char)lx->text[1])) {
        pl->kind = PTC_PLACE_SHARD;
        pl->dim = (int8_t)atoi(lx->text + 1);
        const char *x = strchr(lx->text, 'x'), *r = strchr(lx->text, 'r');
        pl->groups = x ? (uint8_t)atoi(x + 1) : 0;
        pl->rem = r ? (uint16_t)atoi(r + 1) : 0;
    } else {
        ptc_lex_fail(lx, "bad placement '%.200s'", lx->text);
        return;
    }
    ptc_lex_next(lx);
}

void ptc_lex_type(ptc_lexer *lx, ptc_type *t, ptc_placement *place)
{
    memset(t, 0, sizeof *t);
    memset(place, 0, sizeof(ptc_placement) * PTC_MAX_MESH_AXES);
    if (lx->kind != PTC_T_IDENT || ptc_dtype_parse(lx->text, &t->dtype) < 0) {
        ptc_lex_fail(lx, "expected a type, got '%.200s'", lx->text);
        return;
    }
    ptc_lex_next(lx);
    t->rank = ptc_lex_list(lx, t->dims);
    if (!ptc_lex_punct(lx, '<'))
        return;
    ptc_lex_next(lx);
    for (int i = 0; !lx->failed && !ptc_lex_punct(lx, '>'); i++) {
        if (i == PTC_MAX_MESH_AXES) {
            ptc_lex_fail(lx, "too many placements%s", "");
            return;
        }
        lex_placement(lx, &place[i]);
        if (!ptc_lex_punct(lx, '>'))
            ptc_lex_expect(lx, ',');
    }
    ptc_lex_expect(lx, '>');
}

static const char *const init_names[] = {"zeros", "ones", "constant", "normal", "uniform"};

static void lex_init(ptc_lexer *lx, ptc_init *in)
{
    int k = -1;
    for (int i = 0; i < 5; i++)
        if (ptc_lex_ident(lx, init_names[i]))
            k = i;
    if (k < 0) {
        ptc_lex_fail(lx, "unknown init '%.200s'", lx->text);
        return;
    }
    in->kind = (ptc_init_kind)k;
    ptc_lex_next(lx);
    if (k == PTC_INIT_CONSTANT || k == PTC_INIT_NORMAL || k == PTC_INIT_UNIFORM) {
        ptc_lex_expect(lx, '(');
        in->a = ptc_lex_number(lx);
        if (k == PTC_INIT_UNIFORM) {
            ptc_lex_expect(lx, ',');
            in->b = ptc_lex_number(lx);
        }
        ptc_lex_expect(lx, ')');
    }
}

/* true / false (or sum / max for a reduction) */
static int lex_choice(ptc_lexer *lx, const char *no, const char *yes)
{
    int v = ptc_lex_ident(lx, yes);
    if (!v && !ptc_lex_ident(lx, no)) {
        char msg[128];
        snprintf(msg, sizeof msg, "expected %s or %s, got '%%s'", no, yes);
        ptc_lex_fail(lx, msg, lx->text);
    }
    ptc_lex_next(lx);
    return v;
}

void ptc_lex_attr_value(ptc_lexer *lx, unsigned bit, ptc_attrs *attrs, ptc_arena *a)
{
    void *f = ptc_attr_field(attrs, bit);
    switch (ptc_attr_kind_of(bit)) {
    case PTC_AK_INT64: *(int64_t *)f = ptc_lex_int(lx); break;
    case PTC_AK_DOUBLE: *(double *)f = ptc_lex_number(lx); break;
    case PTC_AK_INT: *(int *)f = (int)ptc_lex_int(lx); break;
    case PTC_AK_BOOL: *(bool *)f = lex_choice(lx, "false", "true"); break;
    case PTC_AK_REDUCE: *(int *)f = lex_choice(lx, "sum", "max"); break;
    case PTC_AK_DTYPE:
        if (lx->kind != PTC_T_IDENT || ptc_dtype_parse(lx->text, (ptc_dtype *)f) < 0)
            ptc_lex_fail(lx, "unknown dtype '%.200s'", lx->text);
        ptc_lex_next(lx);
        break;
    case PTC_AK_LIST: attrs->nshape = ptc_lex_list(lx, attrs->shape); break;
    case PTC_AK_STRING: *(const char **)f = ptc_lex_string(lx, a); break;
    case PTC_AK_INIT: lex_init(lx, (ptc_init *)f); break;
    case PTC_AK_ACT:
        if (lx->kind != PTC_T_IDENT || ptc_act_parse(lx->text, (ptc_act *)f) < 0)
            ptc_lex_fail(lx, "unknown activation '%s' (gelu, relu, silu or swiglu)", lx->text);
        ptc_lex_next(lx);
        break;
    }
}

void ptc_lex_attrs(ptc_lexer *lx, ptc_op op, ptc_attrs *attrs, ptc_arena *a,
                   bool (*other)(void *ctx, ptc_lexer *lx, const char *key), void *ctx)
{
    ptc_lex_expect(lx, '{');
    while (!lx->failed && !ptc_lex_punct(lx, '}')) {
        char key[sizeof lx->text];
        snprintf(key, sizeof key, "%s", lx->text);
        if (lx->kind != PTC_T_IDENT) {
            ptc_lex_fail(lx, "expected an attribute name, got '%.200s'", lx->text);
            return;
        }
        ptc_lex_next(lx);
        ptc_lex_expect(lx, '=');
        unsigned bit = ptc_attr_lookup(key);
        if (bit && (ptc_ops[op].kw & bit))
            ptc_lex_attr_value(lx, bit, attrs, a);
        else if (!other || !other(ctx, lx, key))
            ptc_lex_fail(lx, "op has no attribute '%.200s'", key);
        if (!ptc_lex_punct(lx, '}'))
            ptc_lex_expect(lx, ',');
    }
    ptc_lex_expect(lx, '}');
}

void ptc_lex_mesh(ptc_lexer *lx, ptc_mesh *m)
{
    memset(m, 0, sizeof *m);
    while (!lx->failed && lx->kind == PTC_T_IDENT) {
        if (m->naxes == PTC_MAX_MESH_AXES || strlen(lx->text) >= PTC_MAX_AXIS_NAME) {
            ptc_lex_fail(lx, "bad mesh axis '%.200s'", lx->text);
            return;
        }
        memcpy(m->names[m->naxes], lx->text, strlen(lx->text) + 1);
        ptc_lex_next(lx);
        ptc_lex_expect(lx, '=');
        int64_t size = ptc_lex_int(lx);
        if (size < 1 || size > 4096)
            ptc_lex_fail(lx, "bad mesh axis size%s", "");
        m->sizes[m->naxes++] = (int)size;
        if (!ptc_lex_punct(lx, ','))
            break;
        ptc_lex_next(lx);
    }
}

void ptc_lex_optim(ptc_lexer *lx, ptc_optim *out)
{
    ptc_optim o;
    if (ptc_lex_ident(lx, "sgd"))
        o = ptc_optim_default(PTC_OPTIM_SGD);
    else if (ptc_lex_ident(lx, "adamw"))
        o = ptc_optim_default(PTC_OPTIM_ADAMW);
    else {
        ptc_lex_fail(lx, "unknown optimizer '%.200s'", lx->text);
        return;
    }
    ptc_lex_next(lx);
    ptc_lex_expect(lx, '(');
    while (!lx->failed && !ptc_lex_punct(lx, ')')) {
        char key[sizeof lx->text];
        snprintf(key, sizeof key, "%s", lx->text);
        ptc_lex_next(lx);
        ptc_lex_expect(lx, '=');
        double v = ptc_lex_number(lx);
        double *slot = strcmp(key, "lr") == 0             ? &o.lr
                       : strcmp(key, "beta1") == 0        ? &o.beta1
                       : strcmp(key, "beta2") == 0        ? &o.beta2
                       : strcmp(key, "eps") == 0          ? &o.eps
                       : strcmp(key, "weight_decay") == 0 ? &o.weight_decay
                       : strcmp(key, "momentum") == 0     ? &o.momentum
                                                          : NULL;
        if (!slot)
            ptc_lex_fail(lx, "unknown optimizer setting '%.200s'", key);
        else
            *slot = v;
        if (!ptc_lex_punct(lx, ')'))
            ptc_lex_expect(lx, ',');
    }
    ptc_lex_expect(lx, ')');
    *out = o;
}

/* ---- printers ---- */

void ptc_put_double(FILE *f, double x)
{
    char buf[64];
    for (int p = 6; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    fputs(buf, f);
}

void ptc_put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 32)
            fprintf(f, "\\x%02x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

void ptc_put_list(FILE *f, const int64_t *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%lld", i ? "," : "", (long long)v[i]);
    fputc(']', f);
}

void ptc_put_placement(FILE *f, ptc_placement p)
{
    if (p.kind == PTC_PLACE_SHARD && p.groups > 1)
        fprintf(f, "S%dx%d", p.dim, p.groups);
    else if (p.kind == PTC_PLACE_SHARD && p.rem)
        fprintf(f, "S%dr%d", p.dim, p.rem);
    else if (p.kind == PTC_PLACE_SHARD)
        fprintf(f, "S%d", p.dim);
    else
        fputc(p.kind == PTC_PLACE_PARTIAL ? 'P' : 'R', f);
}

void ptc_put_type(FILE *f, const ptc_type *t, const ptc_placement *place)
{
    char buf[256];
    fputs(ptc_type_str(t, buf, sizeof buf), f);
    int last = -1;
    for (int i = 0; place && i < PTC_MAX_MESH_AXES; i++)
        if (place[i].kind != PTC_PLACE_REPLICATE)
            last = i;
    if (last < 0)
        return;
    fputc('<', f);
    for (int i = 0; i <= last; i++) {
        if (i)
            fputc(',', f);
        ptc_put_placement(f, place[i]);
    }
    fputc('>', f);
}

static void put_init(FILE *f, const ptc_init *in)
{
    fputs(init_names[in->kind], f);
    if (in->kind == PTC_INIT_CONSTANT || in->kind == PTC_INIT_NORMAL) {
        fputc('(', f);
        ptc_put_double(f, in->a);
        fputc(')', f);
    } else if (in->kind == PTC_INIT_UNIFORM) {
        fputc('(', f);
        ptc_put_double(f, in->a);
        fputs(", ", f);
        ptc_put_double(f, in->b);
        fputc(')', f);
    }
}

void ptc_put_attr(FILE *f, const ptc_attrs *a, unsigned bit)
{
    const void *v = ptc_attr_field((ptc_attrs *)a, bit);
    fprintf(f, "%s=", ptc_attr_name(bit));
    switch (ptc_attr_kind_of(bit)) {
    case PTC_AK_INT64: fprintf(f, "%lld", (long long)*(const int64_t *)v); break;
    case PTC_AK_DOUBLE: ptc_put_double(f, *(const double *)v); break;
    case PTC_AK_INT: fprintf(f, "%d", *(const int *)v); break;
    case PTC_AK_BOOL: fputs(*(const bool *)v ? "true" : "false", f); break;
    case PTC_AK_REDUCE: fputs(*(const int *)v ? "max" : "sum", f); break;
    case PTC_AK_DTYPE: fputs(ptc_dtype_name(*(const ptc_dtype *)v), f); break;
    case PTC_AK_LIST: ptc_put_list(f, a->shape, a->nshape); break;
    case PTC_AK_STRING: ptc_put_string(f, *(const char *const *)v ? *(const char *const *)v : "");
        break;
    case PTC_AK_INIT: put_init(f, (const ptc_init *)v); break;
    case PTC_AK_ACT: fputs(ptc_act_name(*(const int *)v), f); break;
    }
}

int ptc_put_attrs(FILE *f, ptc_op op, const ptc_attrs *a)
{
    int k = 0;
    for (unsigned bit = 1; bit < (1u << PTC_A_COUNT); bit <<= 1)
        if ((ptc_ops[op].kw & bit) && !(bit == PTC_A_MESH_AXIS2 && a->mesh_axis2 < 0)) {
            fputs(k++ ? ", " : " {", f);
            ptc_put_attr(f, a, bit);
        }
    return k;
}

void ptc_put_mesh(FILE *f, const ptc_mesh *m)
{
    for (int i = 0; i < m->naxes; i++)
        fprintf(f, "%s%s=%d", i ? "," : "", m->names[i], m->sizes[i]);
}

void ptc_put_optim(FILE *f, const ptc_optim *o)
{
    if (o->kind == PTC_OPTIM_SGD) {
        fputs("sgd(lr=", f);
        ptc_put_double(f, o->lr);
        fputs(", momentum=", f);
        ptc_put_double(f, o->momentum);
    } else {
        fputs("adamw(lr=", f);
        ptc_put_double(f, o->lr);
        fputs(", beta1=", f);
        ptc_put_double(f, o->beta1);
        fputs(", beta2=", f);
        ptc_put_double(f, o->beta2);
        fputs(", eps=", f);
        ptc_put_double(f, o->eps);
    }
    fputs(", weight_decay=", f);
    ptc_put_double(f, o->weight_decay);
    fputc(')', f);
}
