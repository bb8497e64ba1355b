/* verify.c - the IR checker that runs after every pass in tests and debug builds.
 *
 * It checks what every pass must preserve: nodes in execution order (operands defined before use),
 * consistent def/use bookkeeping, arity from the op table, result types equal to what shape
 * inference gives, placements that name real dimensions, and a scalar loss.
 */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        ptc_fmt(err, errn, __VA_ARGS__);                                                           \
        goto out;                                                                                  \
    } while (0)

static int check_node(const ptc_graph *g, int i, const bool *defined, char *err, size_t errn)
{
    const ptc_node *n = &g->nodes[i];
    const char *name = (unsigned)n->op < PTC_NOPS ? ptc_ops[n->op].name : "?";
    if ((unsigned)n->op >= PTC_NOPS) {
        ptc_fmt(err, errn, "node %d: invalid op %d", i, (int)n->op);
        return -1;
    }
    if (n->nout < 1 || n->nout > PTC_MAX_RESULTS || n->nin < 0) {
        ptc_fmt(err, errn, "node %d (%s): bad result count %d", i, name, n->nout);
        return -1;
    }
    ptc_type it[n->nin ? n->nin : 1];
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        if (v < 0 || v >= g->nvalues || !defined[v]) {
            ptc_fmt(err, errn, "node %d (%s): operand %d (value %d) is not defined before use", i,
                    name, k, v);
            return -1;
        }
        it[k] = g->values[v].type;
    }
    ptc_attrs a = n->attrs;
    ptc_type ot[PTC_MAX_RESULTS];
    char msg[400];
    int nout = ptc_infer(n->op, it, n->nin, &a, ot, msg, sizeof msg);
    if (nout < 0) {
        ptc_fmt(err, errn, "node %d (%s): %s", i, name, msg);
        return -1;
    }
    if (nout != n->nout) {
        ptc_fmt(err, errn, "node %d (%s): %d results, inference gives %d", i, name, n->nout, nout);
        return -1;
    }
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k];
        if (v < 0 || v >= g->nvalues || defined[v] || g->values[v].def != i ||
            g->values[v].index != k) {
            ptc_fmt(err, errn, "node %d (%s): result %d (value %d) has broken def bookkeeping", i,
                    name, k, v);
            return -1;
        }
        const ptc_value *val = &g->values[v];
        if (!ptc_type_eq(&val->type, &ot[k])) {
            char s1[160], s2[160];
            ptc_fmt(err, errn, "node %d (%s): result %d has type %s, inference gives %s", i, name,
                    k, ptc_type_str(&val->type, s1, sizeof s1),
                    ptc_type_str(&ot[k], s2, sizeof s2));
            return -1;
        }
        for (int m = 0; m < PTC_MAX_MESH_AXES; m++)
            if (val->place[m].kind == PTC_PLACE_SHARD &&
                (val->place[m].dim < 0 || val->place[m].dim >= val->type.rank)) {
                ptc_fmt(err, errn,
                        "node %d (%s): result %d sharded on dim %d of a rank-%d value (mesh axis "
                        "%d)",
                        i, name, k, val->place[m].dim, val->type.rank, m);
                return -1;
            } else if (val->place[m].kind == PTC_PLACE_SHARD && val->place[m].rem &&
                       (val->place[m].groups > 1 || m >= g->mesh.naxes ||
                        val->place[m].rem >= g->mesh.sizes[m] ||
                        val->place[m].rem > val->type.dims[val->place[m].dim])) {
                /* the remainder is what T ranks cannot divide: fewer than T slices, all local */
                ptc_fmt(err, errn, "node %d (%s): result %d has a shard remainder of %d on %s", i,
                        name, k, val->place[m].rem,
                        m < g->mesh.naxes ? "an axis of fewer ranks" : "no mesh axis");
                return -1;
            }
    }
    return 0;
}

int ptc_verify(const ptc_graph *g, char *err, size_t errn)
{
    int rc = -1;
    bool *defined = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(bool));
    for (int i = 0; i < g->nnodes; i++) {
        if (check_node(g, i, defined, err, errn) < 0)
            goto out;
        for (int k = 0; k < g->nodes[i].nout; k++)
            defined[g->nodes[i].out[k]] = true;
    }
    if (g->loss >= 0) {
        if (g->loss >= g->nvalues || !defined[g->loss])
            FAIL("loss value %d is not defined", g->loss);
        if (g->values[g->loss].type.rank != 0)
            FAIL("loss value %d is not a scalar", g->loss);
    }
    for (int i = 0; i < g->noutputs; i++)
        if (g->outputs[i] < 0 || g->outputs[i] >= g->nvalues || !defined[g->outputs[i]])
            FAIL("output %d (value %d) is not defined", i, g->outputs[i]);
    for (int i = 0; i < g->nupdates; i++) {
        int st = g->updates[i].state, to = g->updates[i].to;
        if (st < 0 || st >= g->nvalues || to < 0 || to >= g->nvalues || !defined[to])
            FAIL("update %d names undefined values", i);
        ptc_op op = g->nodes[g->values[st].def].op;
        if (op != PTC_OP_PARAM && op != PTC_OP_STATE)
            FAIL("update %d stores into value %d, which is not a param or state", i, st);
        if (!ptc_type_eq(&g->values[st].type, &g->values[to].type))
            FAIL("update %d: new value's type differs from the state's", i);
    }
    rc = 0;
out:
    free(defined);
    return rc;
}
