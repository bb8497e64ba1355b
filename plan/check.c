/* plan_check.c - the pre-launch check: would the ranks' collectives match up?
 *
 * Each rank runs its program in order, so its collectives form a sequence. A collective of the
 * group on mesh axis a completes when every member of that group has it next. The check steps
 * all ranks forward like that; if at some point the next collectives of one group's members
 * differ (kind, axis, size, reduction), the plan would fail at run time with a mismatch; if no
 * group can make progress while ranks still have collectives left, it would hang. Both are
 * reported before anything runs, with the ranks and collectives involved.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct coll {
    ptc_op op;
    int axis, reduce;
    int64_t count;
    int line, index;
} coll;

static int sequence(const ptc_graph *g, int drop, coll **out)
{
    int n = 0, cap = 0, idx = 0;
    coll *c = NULL;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *nd = &g->nodes[i];
        if (!(ptc_ops[nd->op].flags & PTC_F_COMM))
            continue;
        if (idx++ == drop)
            continue;
        PTC_GROW(c, cap, n);
        c[n++] = (coll){nd->op,           nd->attrs.mesh_axis,
                        nd->attrs.reduce, ptc_type_numel(&g->values[nd->in[0]].type),
                        nd->loc.line,     idx - 1};
    }
    *out = c;
    return n;
}

static void describe(const ptc_graph *g, const coll *c, char *buf, size_t n)
{
    ptc_fmt(buf, n, "%s over %s of %lld elements (collective #%d, line %d)", ptc_ops[c->op].name,
            g->mesh.names[c->axis], (long long)c->count, c->index, c->line);
}

int ptc_plan_check(const ptc_graph *g, int drop_rank, int drop_index, char *err, size_t errn)
{
    if (!g->mesh.naxes)
        return 0;
    int R = ptc_mesh_nranks(&g->mesh), rc = 0;
    coll **seq = ptc_xcalloc((size_t)R, sizeof *seq);
    int *len = ptc_xcalloc((size_t)R, sizeof(int)), *pos = ptc_xcalloc((size_t)R, sizeof(int));
    int members[1024];
    for (int r = 0; r < R; r++)
        len[r] = sequence(g, r == drop_rank ? drop_index : -1, &seq[r]);
    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < R && !rc; r++) {
            if (pos[r] >= len[r])
                continue;
            const coll *c = &seq[r][pos[r]];
            int m = ptc_mesh_group(&g->mesh, r, c->axis, members);
            bool ready = true;
            for (int k = 0; k < m && ready; k++) {
                int q = members[k];
                if (pos[q] >= len[q] || seq[q][pos[q]].axis != c->axis) {
                    ready = false;
                    continue;
                }
                const coll *d = &seq[q][pos[q]];
                if (d->op != c->op || d->count != c->count || d->reduce != c->reduce) {
                    char a[256], b[256];
                    describe(g, c, a, sizeof a);
                    describe(g, d, b, sizeof b);
                    ptc_fmt(err, errn,
                            "plan check: collective mismatch on the %s group of ranks %d and %d: "
                            "rank %d issues %s but rank %d issues %s",
                            g->mesh.names[c->axis], r, q, r, a, q, b);
                    rc = -1;
                }
            }
            if (ready && !rc) {
                for (int k = 0; k < m; k++)
                    pos[members[k]]++;
                progress = true;
            }
        }
    }
    for (int r = 0; r < R && !rc; r++) {
        if (pos[r] >= len[r])
            continue;
        char a[256];
        describe(g, &seq[r][pos[r]], a, sizeof a);
        int m = ptc_mesh_group(&g->mesh, r, seq[r][pos[r]].axis, members);
        int q = -1;
        for (int k = 0; k < m && q < 0; k++)
            if (pos[members[k]] >= len[members[k]] ||
                seq[members[k]][pos[members[k]]].axis != seq[r][pos[r]].axis)
                q = members[k];
        ptc_fmt(err, errn,
                "plan check: the plan would hang: rank %d waits in %s, but rank %d of its group "
                "%s",
                r, a, q,
                q >= 0 && pos[q] >= len[q] ? "has no collective left"
                                           : "waits in a collective of another group");
        rc = -1;
    }
    for (int r = 0; r < R; r++)
        free(seq[r]);
    free(seq);
    free(len);
    free(pos);
    return rc;
}
