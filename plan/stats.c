/* stats.c - the accounting of a rank program (see plan.h for what each figure counts). */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "schedule.h"

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
    case PTC_COLL_ALL_TO_ALL_V: /* the rows of a balanced routing: every token's kept choices */
        return (in->coll.outer ? y : x) * (t - 1) / t;
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
        s->group_bytes[axes & ((1u << PTC_MAX_MESH_AXES) - 1)] += b;
    }
    ptc_mem_timeline t;
    ptc_prog_timeline(pg, PTC_REGION_ACT, &t);
    s->peak_act_bytes = t.peak;
    s->peak_instr = t.peak_instr;
    free(t.live);
}

/* ---- the pipeline ---- */

static int pp_size(const ptc_plan *p)
{
    for (int a = 0; a < p->mesh.naxes; a++)
        if (strcmp(p->mesh.names[a], "pp") == 0)
            return p->mesh.sizes[a];
    return 1;
}

/* The number ending a layer name ("h.12" -> 12, prefix length 2), or -1. */
static int layer_number(const char *name, size_t *prefix)
{
    const char *dot = strrchr(name, '.');
    if (!dot || !dot[1] || strspn(dot + 1, "0123456789") != strlen(dot + 1))
        return -1;
    *prefix = (size_t)(dot - name);
    return atoi(dot + 1);
}

/* Distinct layer names in order, runs of consecutive numbers folded: "(model) h.0..h.2". */
static void format_layers(char names[][64], int n, char *buf, size_t bufn)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n;) {
        size_t pa = 0, pb = 0; /* (set where layer_number is not -1; -O3 cannot tell) */
        int a = layer_number(names[i], &pa), j = i;
        while (a >= 0 && j + 1 < n && layer_number(names[j + 1], &pb) == a + (j + 1 - i) &&
               pb == pa && strncmp(names[j + 1], names[i], pa) == 0)
            j++;
        if (len < bufn)
            len += (size_t)snprintf(buf + len, bufn - len, "%s%s", i ? " " : "", names[i]);
        if (j > i && len < bufn)
            len += (size_t)snprintf(buf + len, bufn - len, "..%s", names[j]);
        i = j + 1;
    }
}

static void stage_info(const ptc_plan *p, int k, ptc_stage_info *si)
{
    const ptc_program *pg = &p->programs[k];
    si->program = k;
    char (*names)[64] = ptc_xmalloc(64 * 64);
    int nnames = 0;
    int S = p->microbatches * p->virtual_stages * pp_size(p) + 1;
    int *first = ptc_xmalloc(sizeof(int) * (size_t)S), *end = ptc_xmalloc(sizeof(int) * (size_t)S);
    for (int i = 0; i < S; i++)
        first[i] = end[i] = -1;
    size_t cap = 64, len = 0;
    si->order = ptc_xmalloc(cap);
    si->order[0] = 0;
    int pw = -1, pm = -1, pv = -1;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->work == PTC_WORK_STEP)
            continue;
        int slot = (in->vstage * p->microbatches + in->mb) % (S - 1);
        if (in->work == PTC_WORK_F) {
            if (first[slot] < 0)
                first[slot] = i;
            if (in->mb == 0 && in->kind != PTC_INSTR_RECV && in->kind != PTC_INSTR_SEND) {
                char name[64];
                ptc_plan_layer(in->loc.scope, name, sizeof name);
                int j = 0;
                while (j < nnames && strcmp(names[j], name))
                    j++;
                if (j == nnames && nnames < 64)
                    memcpy(names[nnames++], name, 64);
            }
        } else {
            end[slot] = i;
        }
        if (in->work != pw || in->mb != pm || in->vstage != pv) {
            char t[32];
            int chunk = in->vstage / (pp_size(p) > 0 ? pp_size(p) : 1);
            if (p->virtual_stages > 1)
                snprintf(t, sizeof t, "%s%s%d.%d", len ? " " : "", ptc_work_name(in->work), in->mb,
                         chunk);
            else
                snprintf(t, sizeof t, "%s%s%d", len ? " " : "", ptc_work_name(in->work), in->mb);
            size_t tl = strlen(t);
            while (len + tl + 1 > cap)
                si->order = ptc_xrealloc(si->order, cap *= 2);
            memcpy(si->order + len, t, tl + 1);
            len += tl;
            pw = in->work;
            pm = in->mb;
            pv = in->vstage;
        }
    }
    /* in flight: started and not finished, at every instruction */
    int best = 0;
    for (int i = 0; i < pg->ninstrs; i++) {
        int n = 0;
        for (int s = 0; s < S - 1; s++)
            n += first[s] >= 0 && first[s] <= i && end[s] >= i;
        if (n > best)
            best = n;
    }
    si->inflight = best;
    format_layers(names, nnames, si->layers, sizeof si->layers);
    free(names);
    free(first);
    free(end);
}

int ptc_plan_pipeline(const ptc_plan *p, ptc_pipeline_info *pi)
{
    memset(pi, 0, sizeof *pi);
    int P = pp_size(p);
    if (P <= 1 && p->microbatches <= 1)
        return -1;
    pi->P = P;
    pi->M = p->microbatches;
    pi->V = p->virtual_stages;
    pi->schedule = p->pp_schedule;
    int num = P - 1, den = (p->pp_schedule == PTC_PP_INTERLEAVED ? pi->V : 1) * pi->M + P - 1;
    if (p->pp_schedule == PTC_PP_ZB_H1)
        den = 3 * pi->M + P - 1;
    pi->bubble_num = num; /* as the formula reads: 3/27, not 1/9 */
    pi->bubble_den = den;
    ptc_pp_plan pp;
    char err[256];
    pi->inflight_schedule = ptc_xcalloc((size_t)P, sizeof(int));
    if (ptc_pp_plan_build(&pp, (ptc_pp_schedule)p->pp_schedule, P, pi->M, pi->V, err,
                          sizeof err) == 0) {
        pi->bubble_simulated = pp.bubble;
        memcpy(pi->inflight_schedule, pp.max_inflight, sizeof(int) * (size_t)P);
        ptc_pp_plan_free(&pp);
    }
    pi->stages = ptc_xcalloc((size_t)P, sizeof *pi->stages);
    for (int k = 0; k < p->nprograms && k < P; k++)
        stage_info(p, k, &pi->stages[k]);
    return 0;
}

void ptc_pipeline_info_free(ptc_pipeline_info *pi)
{
    for (int s = 0; pi->stages && s < pi->P; s++)
        free(pi->stages[s].order);
    free(pi->stages);
    free(pi->inflight_schedule);
    memset(pi, 0, sizeof *pi);
}

/* ---- activations kept per layer ---- */

int ptc_plan_layer_activations(const ptc_plan *p, int program, ptc_layer_act *out, int cap)
{
    (void)p;
    const ptc_program *pg = &p->programs[program];
    int nb = pg->nbufs ? pg->nbufs : 1, n = 0;
    int *first = ptc_xmalloc(sizeof(int) * (size_t)nb), *last = ptc_xmalloc(sizeof(int) * (size_t)nb);
    ptc_prog_lifetimes(pg, first, last);
    /* where microbatch 0's backward begins */
    int boundary = pg->ninstrs;
    for (int i = 0; i < pg->ninstrs && boundary == pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        bool tasks = in->work != PTC_WORK_STEP;
        if (tasks ? (in->work == PTC_WORK_B || in->work == PTC_WORK_W) && in->mb == 0
                  : in->phase != PTC_PHASE_FORWARD)
            boundary = i;
    }
    /* what the parameters alone determine (a cast or a slice of a weight) is not an activation */
    bool *derived = ptc_xcalloc((size_t)nb, 1);
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        derived[b] = bf->kind == PTC_BUF_PARAM || bf->kind == PTC_BUF_STATE ||
                     (bf->kind == PTC_BUF_INPUT && bf->role >= PTC_ROLE_LR &&
                      bf->role <= PTC_ROLE_LOSS_SCALE);
    }
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        bool d = in->kind == PTC_INSTR_KERNEL || in->kind == PTC_INSTR_GEMM ||
                 in->kind == PTC_INSTR_COPY || in->kind == PTC_INSTR_COLL;
        for (int k = 0; k < in->nin && d; k++)
            d = derived[ptc_prog_root(pg, in->in[k])];
        for (int k = 0; k < in->nout && d; k++)
            derived[ptc_prog_root(pg, in->out[k])] = true;
    }
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->view >= 0 || bf->region != PTC_REGION_ACT || bf->kind != PTC_BUF_TEMP ||
            first[b] < 0 || first[b] >= boundary || last[b] < boundary || derived[b])
            continue;
        const ptc_instr *w = &pg->instrs[first[b]];
        if (w->phase != PTC_PHASE_FORWARD || (w->work != PTC_WORK_STEP && w->mb != 0))
            continue;
        char name[64];
        ptc_plan_layer(w->loc.scope, name, sizeof name);
        int k = 0;
        while (k < n && strcmp(out[k].layer, name))
            k++;
        if (k == n) {
            if (n == cap)
                continue;
            memcpy(out[n].layer, name, sizeof name);
            out[n++].bytes = 0;
        }
        out[k].bytes += bf->bytes;
    }
    free(derived);
    free(first);
    free(last);
    return n;
}
