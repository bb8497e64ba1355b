/* program.c - building blocks of execution plans: construction, groups and peers on the mesh,
 * the local-to-full index map, lifetimes and the memory timeline (see program.h). */
#include "program.h"

#include "kir.h"

#include <stdlib.h>
#include <string.h>

static const char *const region_names[PTC_NREGIONS] = {"param", "grad", "optim", "act", "comm"};
static const char *const role_names[PTC_NROLES] = {"none", "tokens",   "targets", "lr",
                                                   "step", "max_norm", "loss_scale", "data"};
static const char *const phase_names[] = {"forward", "backward", "update"};
static const char *const coll_names[PTC_NCOLLS] = {"allreduce", "allgather", "reduce_scatter",
                                                   "all_to_all", "all_to_all_v"};

const char *ptc_region_name(int r)
{
    return r >= 0 && r < PTC_NREGIONS ? region_names[r] : "?";
}

const char *ptc_role_name(int r)
{
    return r >= 0 && r < PTC_NROLES ? role_names[r] : "?";
}

const char *ptc_phase_name(int p)
{
    return p >= 0 && p <= PTC_PHASE_UPDATE ? phase_names[p] : "?";
}

static const char *const work_names[PTC_NWORK] = {"step", "F", "B", "W"};

const char *ptc_work_name(int w)
{
    return w >= 0 && w < PTC_NWORK ? work_names[w] : "?";
}

const char *ptc_coll_name(int k)
{
    return k >= 0 && k < PTC_NCOLLS ? coll_names[k] : "?";
}

ptc_plan *ptc_plan_new(void)
{
    ptc_arena *a = ptc_arena_new();
    ptc_plan *p = ptc_arena_alloc(a, sizeof *p);
    p->arena = a;
    p->model = "";
    p->notes = "";
    p->nranks = 1;
    p->microbatches = 1;
    p->pp_schedule = 1; /* 1f1b */
    p->virtual_stages = 1;
    return p;
}

void ptc_plan_free(ptc_plan *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->nprograms; i++) {
        free(p->programs[i].bufs);
        free(p->programs[i].instrs);
    }
    free(p->programs);
    for (int k = 0; k < p->nkernels; k++)
        ptc_kir_free(p->kernels[k]);
    free(p->kernels);
    ptc_plan_free(p->sample);
    ptc_arena_free(p->arena);
}

int64_t ptc_plan_sample_window(const ptc_plan *p)
{
    const ptc_program *pg = p->nprograms ? &p->programs[0] : NULL;
    for (int b = 0; pg && b < pg->nbufs; b++)
        if (pg->bufs[b].kind == PTC_BUF_INPUT && pg->bufs[b].role == PTC_ROLE_TOKENS &&
            pg->bufs[b].type.rank == 2)
            return pg->bufs[b].type.dims[1];
    return 0;
}

int ptc_plan_add_kernel(ptc_plan *p, ptc_kir *k)
{
    p->kernels = ptc_xrealloc(p->kernels, sizeof *p->kernels * (size_t)(p->nkernels + 1));
    p->kernels[p->nkernels] = k;
    return p->nkernels++;
}

ptc_program *ptc_plan_add_program(ptc_plan *p)
{
    p->programs = ptc_xrealloc(p->programs, sizeof *p->programs * (size_t)(p->nprograms + 1));
    ptc_program *pg = &p->programs[p->nprograms++];
    memset(pg, 0, sizeof *pg);
    pg->loss = pg->grad_norm = -1;
    return pg;
}

int ptc_prog_add_buffer(ptc_plan *p, ptc_program *pg, const ptc_buffer *b)
{
    (void)p;
    PTC_GROW(pg->bufs, pg->capbufs, pg->nbufs);
    pg->bufs[pg->nbufs] = *b;
    return pg->nbufs++;
}

int ptc_prog_add_instr(ptc_plan *p, ptc_program *pg, const ptc_instr *in)
{
    PTC_GROW(pg->instrs, pg->capinstrs, pg->ninstrs);
    ptc_instr *d = &pg->instrs[pg->ninstrs];
    *d = *in;
    d->in = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)(in->nin ? in->nin : 1));
    d->out = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)(in->nout ? in->nout : 1));
    if (in->nin)
        memcpy(d->in, in->in, sizeof(int) * (size_t)in->nin);
    if (in->nout)
        memcpy(d->out, in->out, sizeof(int) * (size_t)in->nout);
    return pg->ninstrs++;
}

/* ---- groups and peers ---- */

int ptc_plan_group(const ptc_mesh *m, int rank, unsigned axes, int *members)
{
    if (!m->naxes) {
        members[0] = 0;
        return 1;
    }
    int coords[PTC_MAX_MESH_AXES], stride[PTC_MAX_MESH_AXES], n = 1, base = 0;
    ptc_mesh_coords(m, rank, coords);
    for (int a = m->naxes - 1, s = 1; a >= 0; s *= m->sizes[a], a--)
        stride[a] = s;
    for (int a = 0; a < m->naxes; a++)
        if (!(axes & (1u << a)))
            base += coords[a] * stride[a];
    members[0] = base;
    /* innermost axis first: each member of the list so far is followed by its variations on
     * the next axis out, so the innermost axis's coordinate is the major one. That is the
     * layout of a tensor the partitioner split over several axes (innermost axis first: its
     * parts are the outer blocks), so one allgather or reduce-scatter over the group moves
     * what one per axis would. (One axis: ascending.) */
    for (int a = m->naxes - 1; a >= 0; a--) {
        if (!(axes & (1u << a)))
            continue;
        int size = m->sizes[a];
        for (int k = n - 1; k >= 0; k--)
            for (int c = size - 1; c >= 0; c--)
                members[k * size + c] = members[k] + c * stride[a];
        n *= size;
    }
    return n;
}

int ptc_plan_peer(const ptc_mesh *m, int rank, int axis, int delta)
{
    int coords[PTC_MAX_MESH_AXES];
    ptc_mesh_coords(m, rank, coords);
    int size = m->sizes[axis];
    coords[axis] = ((coords[axis] + delta) % size + size) % size;
    int r = 0;
    for (int a = 0; a < m->naxes; a++)
        r = r * m->sizes[a] + coords[a];
    return r;
}

void ptc_plan_group_name(const ptc_mesh *m, unsigned axes, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = 0;
    for (int a = 0; a < m->naxes; a++)
        if (axes & (1u << a)) {
            int w = snprintf(buf + used, n - used, "%s%s", used ? "+" : "", m->names[a]);
            if (w < 0 || (size_t)w >= n - used)
                return;
            used += (size_t)w;
        }
}

/* ---- local part <-> full tensor ---- */

/* Full size of a dim of local size `local` under placement p on an axis of T ranks: T times it,
 * or for a shard with a remainder (local = q + rem) T*q + rem. */
static int64_t full_dim(ptc_placement p, int64_t T, int64_t local)
{
    return p.rem ? (local - p.rem) * T + p.rem : local * T;
}

ptc_type ptc_buffer_full_type(const ptc_mesh *m, const ptc_buffer *b)
{
    ptc_type t = b->type;
    for (int a = 0; a < m->naxes; a++)
        if (b->place[a].kind == PTC_PLACE_SHARD)
            t.dims[b->place[a].dim] = full_dim(b->place[a], m->sizes[a], t.dims[b->place[a].dim]);
    return t;
}

int64_t ptc_global_index(const ptc_type *t, const ptc_placement *pl, const ptc_mesh *m,
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

/* ---- lifetimes ---- */

void ptc_prog_lifetimes(const ptc_program *pg, int *first, int *last)
{
    int end = pg->ninstrs;
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        bool persistent = bf->kind == PTC_BUF_PARAM || bf->kind == PTC_BUF_STATE ||
                          bf->region == PTC_REGION_GRAD;
        first[b] = persistent || bf->kind == PTC_BUF_INPUT ? -1 : end;
        last[b] = persistent ? end : -1;
    }
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        for (int k = 0; k < in->nout; k++) {
            int r = ptc_prog_root(pg, in->out[k]);
            if (first[r] > i)
                first[r] = i;
            if (last[r] < i) /* written but never read: it still occupies its bytes */
                last[r] = i;
        }
        for (int k = 0; k < in->nin; k++) {
            int r = ptc_prog_root(pg, in->in[k]);
            if (last[r] < i)
                last[r] = i;
        }
    }
    for (int k = 0; k < pg->nstats; k++)
        last[ptc_prog_root(pg, pg->stats[k])] = end;
    int live_out[2] = {pg->loss, pg->grad_norm};
    for (int k = 0; k < 2; k++)
        if (live_out[k] >= 0)
            last[ptc_prog_root(pg, live_out[k])] = end;
    for (int k = 0; k < pg->noutputs; k++)
        last[ptc_prog_root(pg, pg->outputs[k])] = end;
    for (int b = 0; b < pg->nbufs; b++)
        if (pg->bufs[b].view >= 0) {
            first[b] = first[pg->bufs[b].view];
            last[b] = last[pg->bufs[b].view];
        }
}

void ptc_prog_timeline(const ptc_program *pg, int region, ptc_mem_timeline *t)
{
    int n = pg->nbufs ? pg->nbufs : 1, ni = pg->ninstrs;
    int *first = ptc_xmalloc(sizeof(int) * (size_t)n), *last = ptc_xmalloc(sizeof(int) * (size_t)n);
    ptc_prog_lifetimes(pg, first, last);
    /* delta[i + 1]: bytes that become live at instruction i; freed after their last one */
    int64_t *delta = ptc_xcalloc((size_t)ni + 2, sizeof(int64_t));
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->view >= 0 || bf->region != region || first[b] > last[b])
            continue;
        int f = first[b] < 0 ? 0 : first[b], l = last[b] >= ni ? ni : last[b] + 1;
        delta[f] += bf->bytes;
        delta[l] -= bf->bytes;
    }
    t->live = ptc_xcalloc((size_t)(ni ? ni : 1), sizeof(int64_t));
    t->peak = 0;
    t->peak_instr = -1;
    int64_t live = 0;
    for (int i = 0; i < ni; i++) {
        live += delta[i];
        t->live[i] = live;
        if (live > t->peak) {
            t->peak = live;
            t->peak_instr = i;
        }
    }
    if (!ni)
        t->peak = delta[0];
    free(delta);
    free(first);
    free(last);
}
