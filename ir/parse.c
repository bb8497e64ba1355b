/* parse.c - reads the text form printed by print.c back into a graph, so passes can be tested
 * text-to-text. Every node goes through the builder, so shape inference re-checks it; a printed
 * type that disagrees with inference is an error.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

typedef enum { T_EOF, T_IDENT, T_VALUE, T_NUM, T_STR, T_PUNCT } tok_kind;

typedef struct parser {
    const char *s, *p;
    int line, col;   /* start of the current token */
    int pline, pcol; /* position of p */
    tok_kind kind;
    char text[256]; /* ident / number text / string contents / punctuation */
    char *err;
    size_t errn;
    bool failed;
    ptc_graph *g;
    int *map; /* printed value number -> value id */
    int mapcap;
    const char *file;
} parser;

static void fail(parser *ps, const char *fmt, const char *arg)
{
    if (ps->failed)
        return;
    ps->failed = true;
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, arg);
    ptc_fmt(ps->err, ps->errn, "%d:%d: %s", ps->line, ps->col, msg);
}

static void advance_pos(parser *ps, const char *to)
{
    for (; ps->p < to; ps->p++) {
        if (*ps->p == '\n') {
            ps->pline++;
            ps->pcol = 1;
        } else {
            ps->pcol++;
        }
    }
}

static void next(parser *ps)
{
    for (;;) {
        while (*ps->p && isspace((unsigned char)*ps->p))
            advance_pos(ps, ps->p + 1);
        if (*ps->p != '#')
            break;
        const char *e = strchr(ps->p, '\n');
        advance_pos(ps, e ? e : ps->p + strlen(ps->p));
    }
    const char *p = ps->p, *e = p;
    size_t n = 0;
    ps->line = ps->pline;
    ps->col = ps->pcol;
    if (!*p) {
        ps->kind = T_EOF;
        strcpy(ps->text, "end of input");
        return;
    }
    if (isalpha((unsigned char)*p) || *p == '_') {
        while (isalnum((unsigned char)*e) || *e == '_')
            e++;
        ps->kind = T_IDENT;
    } else if (*p == '%') {
        e = p + 1;
        while (isdigit((unsigned char)*e))
            e++;
        ps->kind = T_VALUE;
    } else if (isdigit((unsigned char)*p) ||
               ((*p == '-' || *p == '+') &&
                (isdigit((unsigned char)p[1]) || p[1] == 'i' || p[1] == 'n'))) {
        char *end;
        strtod(p, &end);
        e = end > p ? end : p + 1;
        ps->kind = T_NUM;
    } else if (*p == '"') {
        ps->kind = T_STR;
        e = p + 1;
        while (*e && *e != '"' && n + 1 < sizeof ps->text) {
            if (*e == '\\' && e[1] == 'x' && isxdigit((unsigned char)e[2]) &&
                isxdigit((unsigned char)e[3])) {
                char hex[3] = {e[2], e[3], 0};
                ps->text[n++] = (char)strtol(hex, NULL, 16);
                e += 4;
            } else {
                if (*e == '\\' && e[1])
                    e++;
                ps->text[n++] = *e++;
            }
        }
        ps->text[n] = 0;
        if (*e != '"') {
            fail(ps, "unterminated string%s", "");
            ps->kind = T_EOF;
            return;
        }
        advance_pos(ps, e + 1);
        return;
    } else {
        e = p + 1;
        ps->kind = T_PUNCT;
    }
    n = (size_t)(e - p) < sizeof ps->text - 1 ? (size_t)(e - p) : sizeof ps->text - 1;
    memcpy(ps->text, p, n);
    ps->text[n] = 0;
    advance_pos(ps, e);
}

static void lex(parser *ps)
{
    next(ps);
}

static bool is_punct(parser *ps, char c)
{
    return ps->kind == T_PUNCT && ps->text[0] == c;
}

static bool is_ident(parser *ps, const char *w)
{
    return ps->kind == T_IDENT && strcmp(ps->text, w) == 0;
}

static void expect_punct(parser *ps, char c)
{
    if (!is_punct(ps, c)) {
        char want[2] = {c, 0};
        char msg[64];
        snprintf(msg, sizeof msg, "expected '%s'", want);
        fail(ps, "%s", msg);
        return;
    }
    lex(ps);
}

static double parse_number(parser *ps)
{
    if (ps->kind == T_IDENT && (strcmp(ps->text, "inf") == 0 || strcmp(ps->text, "nan") == 0)) {
        double v = strtod(ps->text, NULL);
        lex(ps);
        return v;
    }
    if (ps->kind != T_NUM) {
        fail(ps, "expected a number, got '%s'", ps->text);
        return 0;
    }
    double v = strtod(ps->text, NULL);
    lex(ps);
    return v;
}

static int64_t parse_int(parser *ps)
{
    double v = parse_number(ps);
    if (v != (double)(int64_t)v)
        fail(ps, "expected an integer%s", "");
    return (int64_t)v;
}

static int parse_list(parser *ps, int64_t *out)
{
    int n = 0;
    expect_punct(ps, '[');
    while (!ps->failed && !is_punct(ps, ']')) {
        if (n == PTC_MAX_RANK) {
            fail(ps, "more than %s entries in a list", "8");
            return 0;
        }
        out[n++] = parse_int(ps);
        if (!is_punct(ps, ']'))
            expect_punct(ps, ',');
    }
    expect_punct(ps, ']');
    return n;
}

static void parse_init(parser *ps, ptc_init *in)
{
    static const char *const names[] = {"zeros", "ones", "constant", "normal", "uniform"};
    int k = -1;
    for (int i = 0; i < 5; i++)
        if (is_ident(ps, names[i]))
            k = i;
    if (k < 0) {
        fail(ps, "unknown init '%s'", ps->text);
        return;
    }
    in->kind = (ptc_init_kind)k;
    lex(ps);
    if (k == PTC_INIT_CONSTANT || k == PTC_INIT_NORMAL || k == PTC_INIT_UNIFORM) {
        expect_punct(ps, '(');
        in->a = parse_number(ps);
        if (k == PTC_INIT_UNIFORM) {
            expect_punct(ps, ',');
            in->b = parse_number(ps);
        }
        expect_punct(ps, ')');
    }
}

static void parse_attr(parser *ps, ptc_op op, ptc_attrs *a, ptc_node *annot)
{
    char key[sizeof ps->text];
    snprintf(key, sizeof key, "%s", ps->text);
    if (ps->kind != T_IDENT) {
        fail(ps, "expected an attribute name, got '%s'", ps->text);
        return;
    }
    lex(ps);
    expect_punct(ps, '=');
    if (strcmp(key, "stage") == 0) {
        annot->stage = (int)parse_int(ps);
        return;
    }
    if (strcmp(key, "recompute") == 0) {
        annot->recompute = is_ident(ps, "true");
        lex(ps);
        return;
    }
    unsigned bit = 0;
    for (unsigned b = 1; b < (1u << PTC_A_COUNT); b <<= 1)
        if (strcmp(ptc_attr_name(b), key) == 0)
            bit = b;
    if (!(ptc_ops[op].kw & bit)) {
        fail(ps, "op has no attribute '%s'", key);
        return;
    }
    switch (bit) {
    case PTC_A_AXIS: a->axis = parse_int(ps); break;
    case PTC_A_N: a->n = parse_int(ps); break;
    case PTC_A_START: a->start = parse_int(ps); break;
    case PTC_A_LEN: a->len = parse_int(ps); break;
    case PTC_A_HEADS: a->heads = parse_int(ps); break;
    case PTC_A_KV_HEADS: a->kv_heads = parse_int(ps); break;
    case PTC_A_EPS: a->eps = parse_number(ps); break;
    case PTC_A_BASE: a->base = parse_number(ps); break;
    case PTC_A_VALUE: a->value = parse_number(ps); break;
    case PTC_A_BETA1: a->beta1 = parse_number(ps); break;
    case PTC_A_BETA2: a->beta2 = parse_number(ps); break;
    case PTC_A_WD: a->wd = parse_number(ps); break;
    case PTC_A_MOMENTUM: a->momentum = parse_number(ps); break;
    case PTC_A_MESH_AXIS: a->mesh_axis = (int)parse_int(ps); break;
    case PTC_A_TO: a->to = (int)parse_int(ps); break;
    case PTC_A_GROUP: a->group = (int)parse_int(ps); break;
    case PTC_A_REDUCE:
        a->reduce = is_ident(ps, "max");
        if (!a->reduce && !is_ident(ps, "sum"))
            fail(ps, "expected sum or max, got '%s'", ps->text);
        lex(ps);
        break;
    case PTC_A_CAUSAL:
        a->causal = is_ident(ps, "true");
        if (!a->causal && !is_ident(ps, "false"))
            fail(ps, "expected true or false, got '%s'", ps->text);
        lex(ps);
        break;
    case PTC_A_DTYPE:
        if (ps->kind != T_IDENT || ptc_dtype_parse(ps->text, &a->dtype) < 0)
            fail(ps, "unknown dtype '%s'", ps->text);
        lex(ps);
        break;
    case PTC_A_SHAPE:
    case PTC_A_PERM: a->nshape = parse_list(ps, a->shape); break;
    case PTC_A_NAME:
        if (ps->kind != T_STR)
            fail(ps, "expected a string, got '%s'", ps->text);
        a->name = ptc_arena_strdup(ps->g->arena, ps->text);
        lex(ps);
        break;
    case PTC_A_INIT: parse_init(ps, &a->init); break;
    default: PTC_UNREACHABLE("unknown attribute");
    }
}

/* Parses a type with an optional placement suffix into t and place[]. */
static void parse_type(parser *ps, ptc_type *t, ptc_placement *place)
{
    memset(t, 0, sizeof *t);
    if (ps->kind != T_IDENT || ptc_dtype_parse(ps->text, &t->dtype) < 0) {
        fail(ps, "expected a type, got '%s'", ps->text);
        return;
    }
    lex(ps);
    t->rank = parse_list(ps, t->dims);
    memset(place, 0, sizeof(ptc_placement) * PTC_MAX_MESH_AXES);
    if (!is_punct(ps, '<'))
        return;
    lex(ps);
    for (int i = 0; !ps->failed && !is_punct(ps, '>'); i++) {
        if (i == PTC_MAX_MESH_AXES) {
            fail(ps, "too many placements%s", "");
            return;
        }
        if (is_ident(ps, "R")) {
            place[i].kind = PTC_PLACE_REPLICATE;
        } else if (is_ident(ps, "P")) {
            place[i].kind = PTC_PLACE_PARTIAL;
        } else if (ps->kind == T_IDENT && ps->text[0] == 'S' &&
                   isdigit((unsigned char)ps->text[1])) {
            place[i].kind = PTC_PLACE_SHARD;
            place[i].dim = (int8_t)atoi(ps->text + 1);
            const char *x = strchr(ps->text, 'x');
            place[i].groups = x ? (uint8_t)atoi(x + 1) : 0;
        } else {
            fail(ps, "bad placement '%s'", ps->text);
            return;
        }
        lex(ps);
        if (!is_punct(ps, '>'))
            expect_punct(ps, ',');
    }
    expect_punct(ps, '>');
}

static int value_ref(parser *ps, bool define)
{
    if (ps->kind != T_VALUE || !ps->text[1]) {
        fail(ps, "expected a value like %%3, got '%s'", ps->text);
        return -1;
    }
    long k = strtol(ps->text + 1, NULL, 10);
    if (k < 0 || k > 100000000) {
        fail(ps, "value number out of range: %s", ps->text);
        return -1;
    }
    if (define) {
        int old = ps->mapcap;
        PTC_GROW(ps->map, ps->mapcap, (int)k);
        for (int i = old; i < ps->mapcap; i++)
            ps->map[i] = -1;
        if (ps->map[k] >= 0) {
            fail(ps, "value %s defined twice", ps->text);
            return -1;
        }
        lex(ps);
        return (int)k;
    }
    if (k >= ps->mapcap || ps->map[k] < 0) {
        fail(ps, "value %s used before it is defined", ps->text);
        return -1;
    }
    lex(ps);
    return ps->map[k];
}

static void parse_mesh(parser *ps)
{
    ptc_mesh *m = &ps->g->mesh;
    lex(ps);
    while (!ps->failed && ps->kind == T_IDENT) {
        if (m->naxes == PTC_MAX_MESH_AXES || strlen(ps->text) >= PTC_MAX_AXIS_NAME) {
            fail(ps, "bad mesh axis '%s'", ps->text);
            return;
        }
        memcpy(m->names[m->naxes], ps->text, strlen(ps->text) + 1);
        lex(ps);
        expect_punct(ps, '=');
        int64_t size = parse_int(ps);
        if (size < 1 || size > 4096)
            fail(ps, "bad mesh axis size%s", "");
        m->sizes[m->naxes++] = (int)size;
        if (!is_punct(ps, ','))
            break;
        lex(ps);
    }
}

static void parse_optimizer(parser *ps)
{
    ptc_optim o;
    if (is_ident(ps, "sgd"))
        o = ptc_optim_default(PTC_OPTIM_SGD);
    else if (is_ident(ps, "adamw"))
        o = ptc_optim_default(PTC_OPTIM_ADAMW);
    else {
        fail(ps, "unknown optimizer '%s'", ps->text);
        return;
    }
    lex(ps);
    expect_punct(ps, '(');
    while (!ps->failed && !is_punct(ps, ')')) {
        char key[sizeof ps->text];
        snprintf(key, sizeof key, "%s", ps->text);
        lex(ps);
        expect_punct(ps, '=');
        double v = parse_number(ps);
        double *slot = strcmp(key, "lr") == 0             ? &o.lr
                       : strcmp(key, "beta1") == 0        ? &o.beta1
                       : strcmp(key, "beta2") == 0        ? &o.beta2
                       : strcmp(key, "eps") == 0          ? &o.eps
                       : strcmp(key, "weight_decay") == 0 ? &o.weight_decay
                       : strcmp(key, "momentum") == 0     ? &o.momentum
                                                          : NULL;
        if (!slot)
            fail(ps, "unknown optimizer setting '%s'", key);
        else
            *slot = v;
        if (!is_punct(ps, ')'))
            expect_punct(ps, ',');
    }
    expect_punct(ps, ')');
    ps->g->optim = o;
}

static void parse_node(parser *ps)
{
    int res[PTC_MAX_RESULTS], nres = 0, ins[PTC_MAX_RESULTS * 4], nins = 0;
    int line = ps->line, col = ps->col;
    for (;;) {
        if (nres == PTC_MAX_RESULTS) {
            fail(ps, "too many results%s", "");
            return;
        }
        res[nres++] = value_ref(ps, true);
        if (ps->failed || !is_punct(ps, ','))
            break;
        lex(ps);
    }
    expect_punct(ps, '=');
    if (ps->failed)
        return;
    ptc_op op = ps->kind == T_IDENT ? ptc_op_lookup(ps->text) : PTC_NOPS;
    if (op == PTC_NOPS) {
        fail(ps, "unknown op '%s'", ps->text);
        return;
    }
    lex(ps);
    while (!ps->failed && ps->kind == T_VALUE) {
        if (nins == (int)(sizeof ins / sizeof ins[0])) {
            fail(ps, "too many operands%s", "");
            return;
        }
        ins[nins++] = value_ref(ps, false);
        if (!is_punct(ps, ','))
            break;
        lex(ps);
    }
    ptc_attrs a = ptc_attrs_default(op);
    ptc_node annot = {0};
    if (is_punct(ps, '{')) {
        lex(ps);
        while (!ps->failed && !is_punct(ps, '}')) {
            parse_attr(ps, op, &a, &annot);
            if (!is_punct(ps, '}'))
                expect_punct(ps, ',');
        }
        expect_punct(ps, '}');
    }
    expect_punct(ps, ':');
    ptc_type types[PTC_MAX_RESULTS];
    ptc_placement place[PTC_MAX_RESULTS][PTC_MAX_MESH_AXES];
    for (int i = 0; i < nres && !ps->failed; i++) {
        if (i)
            expect_punct(ps, ',');
        parse_type(ps, &types[i], place[i]);
    }
    ptc_loc loc = {0};
    if (!ps->failed && is_punct(ps, '@')) {
        lex(ps);
        loc.line = (int)parse_int(ps);
        expect_punct(ps, ':');
        loc.col = (int)parse_int(ps);
        loc.file = ps->file;
    }
    if (ps->failed)
        return;
    int out[PTC_MAX_RESULTS];
    char msg[400];
    int save_line = ps->line, save_col = ps->col;
    ps->line = line; /* report build errors at the start of the node */
    ps->col = col;
    if (ptc_build(ps->g, op, ins, nins, &a, loc, out, msg, sizeof msg) < 0) {
        fail(ps, "%s", msg);
        return;
    }
    ptc_node *n = &ps->g->nodes[ps->g->nnodes - 1];
    if (n->nout != nres) {
        fail(ps, "%s gives a different number of results", ptc_ops[op].name);
        return;
    }
    n->stage = annot.stage;
    n->recompute = annot.recompute;
    for (int i = 0; i < nres; i++) {
        ptc_value *v = &ps->g->values[out[i]];
        if (!ptc_type_eq(&v->type, &types[i])) {
            char want[160], got[160];
            snprintf(msg, sizeof msg, "printed type %s disagrees with inferred %s",
                     ptc_type_str(&types[i], want, sizeof want),
                     ptc_type_str(&v->type, got, sizeof got));
            fail(ps, "%s", msg);
            return;
        }
        memcpy(v->place, place[i], sizeof v->place);
        ps->map[res[i]] = out[i];
    }
    ps->line = save_line;
    ps->col = save_col;
}

ptc_graph *ptc_parse_ir(const char *text, char *err, size_t errn)
{
    parser ps = {.s = text, .p = text, .pline = 1, .pcol = 1, .err = err, .errn = errn};
    if (errn)
        err[0] = 0;
    lex(&ps);
    if (!is_ident(&ps, "model")) {
        fail(&ps, "expected 'model NAME' at the start%s", "");
        return NULL;
    }
    lex(&ps);
    ps.g = ptc_graph_new(ps.kind == T_IDENT ? ps.text : "main");
    lex(&ps);
    if (is_ident(&ps, "mesh"))
        parse_mesh(&ps);
    if (is_ident(&ps, "source")) {
        lex(&ps);
        if (ps.kind != T_STR)
            fail(&ps, "expected a file name string%s", "");
        ps.file = ptc_arena_strdup(ps.g->arena, ps.text);
        lex(&ps);
    }
    if (is_ident(&ps, "optimizer")) {
        lex(&ps);
        parse_optimizer(&ps);
    }
    while (!ps.failed && ps.kind != T_EOF) {
        if (ps.kind == T_VALUE) {
            parse_node(&ps);
        } else if (is_ident(&ps, "loss") || is_ident(&ps, "output")) {
            bool is_loss = ps.text[0] == 'l';
            lex(&ps);
            int v = value_ref(&ps, false);
            if (v >= 0 && is_loss)
                ps.g->loss = v;
            else if (v >= 0)
                ptc_graph_add_output(ps.g, v);
        } else if (is_ident(&ps, "update")) {
            lex(&ps);
            int st = value_ref(&ps, false);
            expect_punct(&ps, '=');
            int to = value_ref(&ps, false);
            if (!ps.failed)
                ptc_graph_add_update(ps.g, st, to);
        } else {
            fail(&ps, "expected a node, 'loss', 'output' or 'update', got '%s'", ps.text);
        }
    }
    free(ps.map);
    if (ps.failed) {
        ptc_graph_free(ps.g);
        return NULL;
    }
    return ps.g;
}
