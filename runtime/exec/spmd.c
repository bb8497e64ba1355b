/* spmd.c - collectives and rank-dependent ops of one rank (see spmd.h). */
#include "spmd.h"

#include <string.h>

void ptrt_spmd_ctx_init(ptrt_spmd_ctx *c, ptrt_comm *comm, const ptc_mesh *mesh, int rank)
{
    memset(c, 0, sizeof *c);
    c->comm = comm;
    c->mesh = mesh;
    c->rank = rank;
    c->drop = -1;
    ptc_mesh_coords(mesh, rank, c->coords);
}

/* outer/chunk of a tensor of type t split on dim d into `parts` blocks, with `groups` strided
 * groups: the dim is viewed as [groups, size/groups] and each group is split. */
static void split_layout(const ptc_type *t, int d, int groups, int parts, int64_t *outer,
                         int64_t *chunk)
{
    int64_t o = groups, inner = 1;
    for (int i = 0; i < d; i++)
        o *= t->dims[i];
    for (int i = d + 1; i < t->rank; i++)
        inner *= t->dims[i];
    *outer = o;
    *chunk = t->dims[d] / groups / parts * inner;
}

static int collective(ptrt_spmd_ctx *c, const ptc_node *n, const ptc_type *it, void *const *in,
                      const ptc_type *ot, void *const *out, char *err, size_t errn)
{
    const ptc_attrs *a = &n->attrs;
    int members[1024];
    int g = ptc_mesh_group(c->mesh, c->rank, a->mesh_axis, members);
    ptrt_coll_desc d = {
        .group_name = c->mesh->names[a->mesh_axis], .step = c->step, .index = c->index++};
    if (d.index == c->drop) { /* the test hook: behave as if the collective were not there */
        int64_t n = ptc_type_numel(&ot[0]);
        if (n == ptc_type_numel(&it[0]))
            memmove(out[0], in[0], sizeof(float) * (size_t)n);
        else
            memset(out[0], 0, sizeof(float) * (size_t)n);
        return 0;
    }
    int64_t outer, chunk, outer2, chunk2;
    switch (n->op) {
    case PTC_OP_ALLREDUCE:
        return ptrt_comm_allreduce(c->comm, c->rank, members, g, in[0], out[0],
                                   ptc_type_numel(&it[0]), a->reduce ? PTRT_RED_MAX : PTRT_RED_SUM,
                                   &d, err, errn);
    case PTC_OP_ALLGATHER:
        split_layout(&ot[0], (int)a->axis, (int)a->n, g, &outer, &chunk);
        return ptrt_comm_allgather(c->comm, c->rank, members, g, in[0], out[0], outer, chunk, &d,
                                   err, errn);
    case PTC_OP_REDUCE_SCATTER:
        split_layout(&it[0], (int)a->axis, (int)a->n, g, &outer, &chunk);
        return ptrt_comm_reduce_scatter(c->comm, c->rank, members, g, in[0], out[0], outer, chunk,
                                        PTRT_RED_SUM, &d, err, errn);
    case PTC_OP_ALL_TO_ALL:
        split_layout(&it[0], a->to, 1, g, &outer, &chunk);
        split_layout(&ot[0], (int)a->axis, 1, g, &outer2, &chunk2);
        return ptrt_comm_all_to_all(c->comm, c->rank, members, g, in[0], out[0], outer, chunk,
                                    outer2, chunk2, &d, err, errn);
    default: ptc_fmt(err, errn, "%s is not a collective", ptc_ops[n->op].name); return -1;
    }
}

int ptrt_spmd_run(ptrt_spmd_ctx *c, const ptc_node *n, const ptc_type *it, void *const *in,
                  const ptc_type *ot, void *const *out, char *err, size_t errn)
{
    if (ptc_ops[n->op].flags & PTC_F_COMM)
        return collective(c, n, it, in, ot, out, err, errn);
    int coord = ptc_ops[n->op].kw & PTC_A_MESH_AXIS ? c->coords[n->attrs.mesh_axis] : 0;
    return ptrt_spmd_kernel(n, coord, it, in, ot, out, err, errn);
}

/* ---- index mapping between local parts and full tensors ---- */

/* Full size of a dim of local size `local` under placement p on an axis of T ranks: T times it,
 * or for a shard with a remainder (local = q + rem) T*q + rem. */
static int64_t full_dim(ptc_placement p, int64_t T, int64_t local)
{
    return p.rem ? (local - p.rem) * T + p.rem : local * T;
}

ptc_type ptrt_spmd_global_type(const ptc_type *t, const ptc_placement *pl, const ptc_mesh *m)
{
    ptc_type g = *t;
    for (int a = 0; a < m->naxes; a++)
        if (pl[a].kind == PTC_PLACE_SHARD && pl[a].dim < g.rank)
            g.dims[pl[a].dim] = full_dim(pl[a], m->sizes[a], g.dims[pl[a].dim]);
    return g;
}

int64_t ptrt_spmd_global_index(const ptc_type *t, const ptc_placement *pl, const ptc_mesh *m,
                               const int *coords, int64_t i)
{
    int64_t idx[PTC_MAX_RANK];
    ptc_type cur = *t;
    for (int d = cur.rank - 1; d >= 0; d--) {
        idx[d] = i % cur.dims[d];
        i /= cur.dims[d];
    }
    /* undo the outermost axis first: it was partitioned last */
    for (int a = 0; a < m->naxes; a++) {
        ptc_placement p = pl[a];
        if (p.kind != PTC_PLACE_SHARD || m->sizes[a] == 1)
            continue;
        int d = p.dim;
        int64_t groups = p.groups > 1 ? p.groups : 1, T = m->sizes[a];
        int64_t local = cur.dims[d], per = (local - p.rem) / groups; /* per group on this rank */
        int64_t gi = idx[d] / per, off = idx[d] % per;
        if (p.rem && idx[d] >= per) /* the remainder, held whole after the rank's own part */
            idx[d] = per * T + idx[d] - per;
        else
            idx[d] = gi * per * T + coords[a] * per + off;
        cur.dims[d] = full_dim(p, T, local);
    }
    int64_t flat = 0;
    for (int d = 0; d < cur.rank; d++)
        flat = flat * cur.dims[d] + idx[d];
    return flat;
}
