/* parse.c - reads the text form printed by print.c back into a graph, so passes can be tested
 * text-to-text. Every node goes through the builder, so shape inference re-checks it; a printed
 * type that disagrees with inference is an error.
 */
#include <stdlib.h>
#include <string.h>

#include "text.h"

typedef struct parser {
    ptc_lexer lx;
    ptc_graph *g;
    int *map; /* printed value number -> value id */
    int mapcap;
    const char *file;
} parser;

#define failed(ps) ((ps)->lx.failed)

static void fail(parser *ps, const char *fmt, const char *arg)
{
    ptc_lex_fail(&ps->lx, fmt, arg);
}

/* stage= and recompute= sit among a node's attributes */
static bool node_annotation(void *ctx, ptc_lexer *lx, const char *key)
{
    ptc_node *annot = ctx;
    if (strcmp(key, "stage") == 0) {
        annot->stage = (int)ptc_lex_int(lx);
        return true;
    }
    if (strcmp(key, "recompute") == 0) {
        annot->recompute = ptc_lex_ident(lx, "true");
        ptc_lex_next(lx);
        return true;
    }
    return false;
}

static int value_ref(parser *ps, bool define)
{
    if (ps->lx.kind != PTC_T_VALUE || !ps->lx.text[1]) {
        fail(ps, "expected a value like %%3, got '%s'", ps->lx.text);
        return -1;
    }
    long k = strtol(ps->lx.text + 1, NULL, 10);
    if (k < 0 || k > 100000000) {
        fail(ps, "value number out of range: %s", ps->lx.text);
        return -1;
    }
    if (define) {
        int old = ps->mapcap;
        PTC_GROW(ps->map, ps->mapcap, (int)k);
        for (int i = old; i < ps->mapcap; i++)
            ps->map[i] = -1;
        if (ps->map[k] >= 0) {
            fail(ps, "value %s defined twice", ps->lx.text);
            return -1;
        }
        ptc_lex_next(&ps->lx);
        return (int)k;
    }
    if (k >= ps->mapcap || ps->map[k] < 0) {
        fail(ps, "value %s used before it is defined", ps->lx.text);
        return -1;
    }
    ptc_lex_next(&ps->lx);
    return ps->map[k];
}

static void parse_node(parser *ps)
{
    int res[PTC_MAX_RESULTS], nres = 0, ins[PTC_MAX_RESULTS * 4], nins = 0;
    int line = ps->lx.line, col = ps->lx.col;
    for (;;) {
        if (nres == PTC_MAX_RESULTS) {
            fail(ps, "too many results%s", "");
            return;
        }
        res[nres++] = value_ref(ps, true);
        if (failed(ps) || !ptc_lex_punct(&ps->lx, ','))
            break;
        ptc_lex_next(&ps->lx);
    }
    ptc_lex_expect(&ps->lx, '=');
    if (failed(ps))
        return;
    ptc_op op = ps->lx.kind == PTC_T_IDENT ? ptc_op_lookup(ps->lx.text) : PTC_NOPS;
    if (op == PTC_NOPS) {
        fail(ps, "unknown op '%s'", ps->lx.text);
        return;
    }
    ptc_lex_next(&ps->lx);
    while (!failed(ps) && ps->lx.kind == PTC_T_VALUE) {
        if (nins == (int)(sizeof ins / sizeof ins[0])) {
            fail(ps, "too many operands%s", "");
            return;
        }
        ins[nins++] = value_ref(ps, false);
        if (!ptc_lex_punct(&ps->lx, ','))
            break;
        ptc_lex_next(&ps->lx);
    }
    ptc_attrs a = ptc_attrs_default(op);
    ptc_node annot = {0};
    if (ptc_lex_punct(&ps->lx, '{'))
        ptc_lex_attrs(&ps->lx, op, &a, ps->g->arena, node_annotation, &annot);
    ptc_lex_expect(&ps->lx, ':');
    ptc_type types[PTC_MAX_RESULTS];
    ptc_placement place[PTC_MAX_RESULTS][PTC_MAX_MESH_AXES];
    for (int i = 0; i < nres && !failed(ps); i++) {
        if (i)
            ptc_lex_expect(&ps->lx, ',');
        ptc_lex_type(&ps->lx, &types[i], place[i]);
    }
    ptc_loc loc = {0};
    if (!failed(ps) && ptc_lex_punct(&ps->lx, '@')) {
        ptc_lex_next(&ps->lx);
        loc.line = (int)ptc_lex_int(&ps->lx);
        ptc_lex_expect(&ps->lx, ':');
        loc.col = (int)ptc_lex_int(&ps->lx);
        loc.file = ps->file;
    }
    if (failed(ps))
        return;
    int out[PTC_MAX_RESULTS];
    char msg[400];
    int save_line = ps->lx.line, save_col = ps->lx.col;
    ps->lx.line = line; /* report build errors at the start of the node */
    ps->lx.col = col;
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
    ps->lx.line = save_line;
    ps->lx.col = save_col;
}

ptc_graph *ptc_parse_ir(const char *text, char *err, size_t errn)
{
    parser ps = {0};
    ptc_lexer *lx = &ps.lx;
    ptc_lex_init(lx, text, err, errn);
    if (!ptc_lex_ident(lx, "model")) {
        ptc_lex_fail(lx, "expected 'model NAME' at the start%s", "");
        return NULL;
    }
    ptc_lex_next(lx);
    ps.g = ptc_graph_new(lx->kind == PTC_T_IDENT ? lx->text : "main");
    ptc_lex_next(lx);
    if (ptc_lex_ident(lx, "mesh")) {
        ptc_lex_next(lx);
        ptc_lex_mesh(lx, &ps.g->mesh);
    }
    if (ptc_lex_ident(lx, "source")) {
        ptc_lex_next(lx);
        ps.file = ptc_lex_string(lx, ps.g->arena);
    }
    if (ptc_lex_ident(lx, "optimizer")) {
        ptc_lex_next(lx);
        ptc_lex_optim(lx, &ps.g->optim);
    }
    while (!lx->failed && lx->kind != PTC_T_EOF) {
        if (lx->kind == PTC_T_VALUE) {
            parse_node(&ps);
        } else if (ptc_lex_ident(lx, "loss") || ptc_lex_ident(lx, "output")) {
            bool is_loss = lx->text[0] == 'l';
            ptc_lex_next(lx);
            int v = value_ref(&ps, false);
            if (v >= 0 && is_loss)
                ps.g->loss = v;
            else if (v >= 0)
                ptc_graph_add_output(ps.g, v);
        } else if (ptc_lex_ident(lx, "update")) {
            ptc_lex_next(lx);
            int st = value_ref(&ps, false);
            ptc_lex_expect(lx, '=');
            int to = value_ref(&ps, false);
            if (!lx->failed)
                ptc_graph_add_update(ps.g, st, to);
        } else {
            ptc_lex_fail(lx, "expected a node, 'loss', 'output' or 'update', got '%.200s'", lx->text);
        }
    }
    free(ps.map);
    if (lx->failed) {
        ptc_graph_free(ps.g);
        return NULL;
    }
    return ps.g;
}
