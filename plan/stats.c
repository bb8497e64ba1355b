/* stats.c - the accounting of a rank program (see plan.h for what each figure counts). */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

int64_t ptc_plan_comm_bytes(const ptc_plan *p, const ptc_program *pg, const ptc_instr *in)
{
    if (in->kind == PTC_INSTR_SEND)
        return pg->bufs[in->in[0]].bytes;
    if (in->kind != PTC_INSTR_COLL)
        return 0;
    int64_t t = 1;
    for (int a = 0; a < p->mesh.naxes; a++)
        if (in->coll.axes & (1u << a))
            t *= p->mesh.sizes[a];
    int64_t x = pg->bufs[in->in[0]].bytes, y = pg->bufs[in->out[0]].bytes;
    switch (in->coll.kind) {
    case PTC_COLL_ALLREDUCE: return 2 * x * (t - 1) / t;
    case PTC_COLL_ALLGATHER: return y * (t - 1) / t;
    default: return x * (t - 1) / t; /* reduce-scatter, all-to-all */
    }
}

void ptc_plan_layer(const char *s, char *buf, size_t bufn)
{
    if (!s || !*s) {
        ptc_fmt(buf, bufn, "(model)");
        return;
    }
    for (const char *p = s;;) {
        size_t len = strcspn(p, ".");
        if (len > 0 && strspn(p, "0123456789") >= len) {
            ptc_fmt(buf, bufn, "%.*s", (int)(p + len - s), s);
            return;
        }
        if (!p[len])
            break;
        p += len + 1;
    }
    ptc_fmt(buf, bufn, "%.*s", (int)strcspn(s, "."), s);
}

void ptc_plan_stats_of(const ptc_plan *p, int program, ptc_plan_stats *s)
{
    const ptc_program *pg = &p->programs[program];
    memset(s, 0, sizeof *s);
    memcpy(s->region_bytes, pg->region_bytes, sizeof s->region_bytes);
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->view >= 0)
            continue;
        if (bf->region == PTC_REGION_PARAM)
            s->param_bytes += bf->bytes;
        else if (bf->region == PTC_REGION_GRAD)
            s->grad_bytes += bf->bytes;
        else if (bf->region == PTC_REGION_OPTIM)
            s->optim_bytes += bf->bytes;
    }
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_COLL && in->kind != PTC_INSTR_SEND)
            continue;
        int64_t b = ptc_plan_comm_bytes(p, pg, in);
        int k = in->kind == PTC_INSTR_SEND ? PTC_NCOLLS : in->coll.kind;
        unsigned axes = in->kind == PTC_INSTR_SEND ? 1u << in->peer_axis : in->coll.axes;
        s->comm_bytes += b;
        s->kind_bytes[k] += b;
        s->kind_count[k]++;
        s->phase_bytes[in->phase] += b;
        s->ncollectives += in->kind == PTC_INSTR_COLL;
        for (int a = 0; a < p->mesh.naxes; a++)
            if (axes & (1u << a))
                s->axis_bytes[a] += b;
    }
    ptc_mem_timeline t;
    ptc_prog_timeline(pg, PTC_REGION_ACT, &t);
    s->peak_act_bytes = t.peak;
    s->peak_instr = t.peak_instr;
    free(t.live);
}
