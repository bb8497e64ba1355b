/* print.c - plans for people: --emit plan (a one-screen summary per program, then the detail),
 * --emit plan-json (docs/plan-json.md) and --emit memory (the timeline of live bytes). */
#include <stdlib.h>
#include <string.h>

#include "kir.h"
#include "plan.h"
#include "schedule.h"
#include "text.h"

/* ---- numbers ---- */

static void put_count(FILE *f, int64_t n)
{
    char d[32];
    int len = snprintf(d, sizeof d, "%lld", (long long)n);
    for (int i = 0; i < len; i++) {
        if (i && (len - i) % 3 == 0 && d[i - 1] != '-')
            fputc(',', f);
        fputc(d[i], f);
    }
}

void ptc_human_bytes(int64_t b, char *buf, size_t n)
{
    double x = (double)b;
    const char *u = "B";
    if (x >= 1 << 30)
        x /= 1 << 30, u = "GiB";
    else if (x >= 1 << 20)
        x /= 1 << 20, u = "MiB";
    else if (x >= 1 << 10)
        x /= 1 << 10, u = "KiB";
    if (b < 1024)
        snprintf(buf, n, "%lld B", (long long)b);
    else
        snprintf(buf, n, "%.2f %s", x, u);
}

/* "1,929,379 (1.84 MiB)" */
static void put_bytes(FILE *f, int64_t b)
{
    put_count(f, b);
    if (b >= 1024) {
        char h[32];
        ptc_human_bytes(b, h, sizeof h);
        fprintf(f, " (%s)", h);
    }
}

/* The groups a plan's sent bytes are told by, in order: every mesh axis alone, then the sets of
 * several axes some collective spans (dp+ep); their bytes add up to the total. */
static int groups_in_order(const ptc_plan *p, const ptc_plan_stats *s, unsigned *order)
{
    int n = 0;
    for (int a = 0; a < p->mesh.naxes; a++)
        order[n++] = 1u << a;
    for (unsigned m = 1; m < 1u << p->mesh.naxes; m++)
        if ((m & (m - 1)) != 0 && s->group_bytes[m])
            order[n++] = m;
    return n;
}

static void put_ranks(FILE *f, const ptc_program *pg)
{
    for (int i = 0; i < pg->nranks;) {
        int j = i;
        while (j + 1 < pg->nranks && pg->ranks[j + 1] == pg->ranks[j] + 1)
            j++;
        fprintf(f, "%s%d", i ? "," : "", pg->ranks[i]);
        if (j > i)
            fprintf(f, "-%d", pg->ranks[j]);
        i = j + 1;
    }
}

/* what an instruction runs: its collective, generated kernel or op */
static const char *what(const ptc_plan *p, const ptc_instr *in)
{
    if (in->kind == PTC_INSTR_COLL)
        return ptc_coll_name(in->coll.kind);
    if (in->kind == PTC_INSTR_FUSED)
        return p->kernels[in->kernel]->name;
    return ptc_ops[in->op].name;
}

/* instruction i, or with j > i instructions i to j that run the same op */
static void describe_instrs(FILE *f, const ptc_plan *p, const ptc_program *pg, int i, int j)
{
    if (i < 0 || i >= pg->ninstrs) {
        fputs("(start)", f);
        return;
    }
    const ptc_instr *in = &pg->instrs[i];
    if (j > i)
        fprintf(f, "instructions %d to %d, %s", i, j, what(p, in));
    else
        fprintf(f, "instruction %d, %s", i, what(p, in));
    if (in->loc.scope && *in->loc.scope)
        fprintf(f, " in %s", in->loc.scope);
    if (in->loc.line)
        fprintf(f, " (line %d)", in->loc.line);
    fprintf(f, ", %s", ptc_phase_name(in->phase));
}

static void describe_instr(FILE *f, const ptc_plan *p, const ptc_program *pg, int i)
{
    describe_instrs(f, p, pg, i, i);
}

/* ---- the summary ---- */

static int by_bytes_desc(const void *a, const void *b, void *ctx);
static const ptc_program *sort_pg;
static int cmp_bytes(const void *a, const void *b)
{
    return by_bytes_desc(a, b, NULL);
}
static int by_bytes_desc(const void *a, const void *b, void *ctx)
{
    (void)ctx;
    int64_t x = sort_pg->bufs[*(const int *)a].bytes, y = sort_pg->bufs[*(const int *)b].bytes;
    return x != y ? (x > y ? -1 : 1) : (*(const int *)a - *(const int *)b);
}

static void largest_tensors(FILE *f, const ptc_plan *p, const ptc_program *pg, int top)
{
    int *ids = ptc_xmalloc(sizeof(int) * (size_t)(pg->nbufs ? pg->nbufs : 1)), n = 0;
    for (int b = 0; b < pg->nbufs; b++)
        if (pg->bufs[b].view < 0)
            ids[n++] = b;
    sort_pg = pg;
    qsort(ids, (size_t)n, sizeof *ids, cmp_bytes);
    fputs("  largest tensors (bytes):\n", f);
    /* temporaries of one size and type written by the same op of the model, at the same line
     * of the same layer (a head's chunks of logits, a microbatch's copies), print as one line
     * with their count, which says whether no two of them are live together */
    int *first = ptc_xmalloc(sizeof(int) * (size_t)(pg->nbufs ? pg->nbufs : 1));
    int *last = ptc_xmalloc(sizeof(int) * (size_t)(pg->nbufs ? pg->nbufs : 1));
    ptc_prog_lifetimes(pg, first, last);
    int *writer = ptc_xmalloc(sizeof(int) * (size_t)(pg->nbufs ? pg->nbufs : 1));
    for (int b = 0; b < pg->nbufs; b++)
        writer[b] = -1;
    for (int i = pg->ninstrs - 1; i >= 0; i--) /* (each root's first writer, itself or a view) */
        for (int k = 0; k < pg->instrs[i].nout; k++)
            writer[ptc_prog_root(pg, pg->instrs[i].out[k])] = i;
    for (int i = 0, shown = 0; i < n && shown < top; shown++) {
        const ptc_buffer *bf = &pg->bufs[ids[i]];
        int w = writer[ids[i]], same = 1, wlast = w;
        bool apart = true;
        char ty[200], ty2[200];
        ptc_type_str(&bf->type, ty, sizeof ty);
        while (!bf->name && w >= 0 && i + same < n) {
            const ptc_buffer *o = &pg->bufs[ids[i + same]];
            int w2 = writer[ids[i + same]];
            if (o->name || o->bytes != bf->bytes || o->region != bf->region || w2 < 0 ||
                strcmp(ty, ptc_type_str(&o->type, ty2, sizeof ty2)) ||
                strcmp(what(p, &pg->instrs[w]), what(p, &pg->instrs[w2])) ||
                pg->instrs[w].loc.line != pg->instrs[w2].loc.line ||
                strcmp(pg->instrs[w].loc.scope ? pg->instrs[w].loc.scope : "",
                       pg->instrs[w2].loc.scope ? pg->instrs[w2].loc.scope : ""))
                break;
            for (int q = i; q < i + same; q++)
                apart &= first[ids[q]] > last[ids[i + same]] || first[ids[i + same]] > last[ids[q]];
            wlast = w2 > wlast ? w2 : wlast;
            w = w2 < w ? w2 : w;
            same++;
        }
        fputs("    ", f);
        put_bytes(f, bf->bytes);
        fprintf(f, "  %s %s", ptc_region_name(bf->region), ty);
        if (bf->name) {
            fprintf(f, "  %s\n", bf->name);
            i++;
            continue;
        }
        if (same > 1)
            fprintf(f, " x%d%s", same, apart ? " (one live at a time)" : "");
        fputs("  written by ", f);
        describe_instrs(f, p, pg, w, wlast);
        fputc('\n', f);
        i += same;
    }
    free(first);
    free(last);
    free(writer);
    free(ids);
}

static int mesh_axis(const ptc_plan *p, const char *name)
{
    for (int a = 0; a < p->mesh.naxes; a++)
        if (strcmp(p->mesh.names[a], name) == 0 && p->mesh.sizes[a] > 1)
            return a;
    return -1;
}

/* Plans that are right but wasteful: say so. */
static int warnings(FILE *f, const ptc_plan *p, const ptc_program *pg, const ptc_plan_stats *s)
{
    int n = 0, axes[2] = {mesh_axis(p, "dp"), mesh_axis(p, "ep")}; /* the axes ZeRO shards over */
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->view >= 0 || !((bf->kind == PTC_BUF_PARAM && p->zero >= 3) ||
                               (bf->kind == PTC_BUF_STATE && p->zero >= 1)))
            continue;
        for (int k = 0; k < 2; k++)
            if (axes[k] >= 0 && bf->place[axes[k]].kind == PTC_PLACE_REPLICATE) {
                fprintf(f, "    - %s '%s' (", bf->kind == PTC_BUF_PARAM ? "parameter" : "state",
                        bf->name);
                put_bytes(f, bf->bytes);
                fprintf(f, ") is replicated over %s under ZeRO %d\n", k ? "ep" : "dp", p->zero);
                n++;
            }
    }
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind == PTC_INSTR_COLL && in->coll.kind == PTC_COLL_ALLGATHER &&
            pg->bufs[in->out[0]].bytes * 4 > s->peak_act_bytes && s->peak_act_bytes > (1 << 20)) {
            fputs("    - large gather: ", f);
            put_bytes(f, pg->bufs[in->out[0]].bytes);
            fputs(" (over a quarter of the peak activations) at ", f);
            describe_instr(f, p, pg, i);
            fputc('\n', f);
            n++;
        }
        /* (ZeRO keeps its part of a reduced gradient: over dp, and over ep with ZeRO) */
        bool zero_slice = (axes[0] >= 0 && in->attrs.mesh_axis == axes[0]) ||
                          (axes[1] >= 0 && in->attrs.mesh_axis == axes[1] && p->zero >= 1);
        if (in->kind == PTC_INSTR_KERNEL && in->op == PTC_OP_SHARD_SLICE &&
            in->phase != PTC_PHASE_FORWARD && !zero_slice) {
            fputs("    - a full-size gradient of ", f);
            put_bytes(f, pg->bufs[in->in[0]].bytes);
            fputs(" is computed and then sliced at ", f);
            describe_instr(f, p, pg, i);
            fputc('\n', f);
            n++;
        }
    }
    return n;
}

static void summary(FILE *f, const ptc_plan *p, int k, int64_t device_memory)
{
    const ptc_program *pg = &p->programs[k];
    ptc_plan_stats s;
    ptc_plan_stats_of(p, k, &s);
    fputs("== summary of ranks ", f);
    put_ranks(f, pg);
    fputs(" ==\n  memory per rank (bytes):\n    model states      ", f);
    put_bytes(f, s.param_bytes + s.grad_bytes + s.optim_bytes);
    fputs("\n      parameters      ", f);
    put_bytes(f, s.param_bytes);
    fputs("\n      gradients       ", f);
    put_bytes(f, s.grad_bytes);
    fputs("\n      optimizer state ", f);
    put_bytes(f, s.optim_bytes);
    fputs("\n    peak activations  ", f);
    put_bytes(f, s.peak_act_bytes);
    fputs(" at ", f);
    describe_instr(f, p, pg, s.peak_instr);
    fputs("\n    arenas            ", f);
    int64_t total = 0;
    for (int r = 0; r < PTC_NREGIONS; r++) {
        fprintf(f, "%s%s ", r ? ", " : "", ptc_region_name(r));
        put_count(f, s.region_bytes[r]);
        total += s.region_bytes[r];
    }
    fputs("\n    total             ", f);
    put_bytes(f, total);
    fputs(" allocated at start", f);
    if (device_memory > 0) {
        char lim[32];
        ptc_human_bytes(device_memory, lim, sizeof lim);
        fprintf(f, ", %.1f%% of --device-memory %s", 100.0 * (double)total / (double)device_memory,
                lim);
    }
    fputs("\n  sent per step per rank (bytes):\n    total             ", f);
    put_bytes(f, s.comm_bytes);
    fprintf(f, " in %d collectives\n", s.ncollectives);
    /* by group: every axis alone, then the groups of several axes that send anything (so the
     * lines add up to the total) */
    unsigned order[1 << PTC_MAX_MESH_AXES];
    int ng = groups_in_order(p, &s, order);
    for (int i = 0; i < ng; i++) {
        unsigned m = order[i];
        char group[64], label[72];
        ptc_plan_group_name(&p->mesh, m, group, sizeof group);
        snprintf(label, sizeof label, "over %s", group);
        fprintf(f, "    %-17s ", label);
        put_bytes(f, s.group_bytes[m]);
        fputc('\n', f);
    }
    for (int c = 0; c <= PTC_NCOLLS; c++)
        if (s.kind_count[c]) {
            fprintf(f, "    %-17s ", c < PTC_NCOLLS ? ptc_coll_name(c) : "send");
            put_bytes(f, s.kind_bytes[c]);
            fprintf(f, " in %d\n", s.kind_count[c]);
        }
    for (int ph = 0; ph < 3; ph++)
        if (s.phase_bytes[ph]) {
            char label[32];
            snprintf(label, sizeof label, "in the %s", ptc_phase_name(ph));
            fprintf(f, "    %-17s ", label);
            put_bytes(f, s.phase_bytes[ph]);
            fputc('\n', f);
        }
    ptc_print_moe(f, p, k);
    largest_tensors(f, p, pg, 5);
    if (p->notes && *p->notes) {
        fputs("  choices:\n", f);
        for (const char *s = p->notes; *s;) {
            size_t len = strcspn(s, "\n");
            fprintf(f, "    - %.*s\n", (int)len, s);
            s += len + (s[len] == '\n');
        }
    }
    fputs("  warnings:\n", f);
    if (!warnings(f, p, pg, &s))
        fputs("    none\n", f);
}

/* ---- the detail ---- */

typedef struct layer_sum {
    char name[64];
    int64_t bytes;
    int count;
} layer_sum;

static int layers_of(const ptc_plan *p, const ptc_program *pg, layer_sum *ls, int cap)
{
    int n = 0;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_COLL && in->kind != PTC_INSTR_SEND)
            continue;
        char name[64];
        ptc_plan_layer(in->loc.scope, name, sizeof name);
        int k = 0;
        while (k < n && strcmp(ls[k].name, name))
            k++;
        if (k == n) {
            if (n == cap)
                continue;
            snprintf(ls[n].name, sizeof ls[n].name, "%s", name);
            ls[n].bytes = 0;
            ls[n].count = 0;
            n++;
        }
        ls[k].bytes += ptc_plan_comm_bytes(p, pg, in);
        ls[k].count++;
    }
    return n;
}

static void parameters(FILE *f, const ptc_plan *p, const ptc_program *pg)
{
    fputs("parameters (placement per mesh axis; shape on every rank):\n", f);
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->kind != PTC_BUF_PARAM)
            continue;
        char full[160], loc[160];
        ptc_type ft = ptc_buffer_full_type(&p->mesh, bf);
        ptc_type_str(&ft, full, sizeof full);
        ptc_type_str(&bf->type, loc, sizeof loc);
        fprintf(f, "  %-28s %-20s ", bf->name, full + 3);
        for (int a = 0; a < p->mesh.naxes; a++) {
            fprintf(f, "%s%s:", a ? " " : "", p->mesh.names[a]);
            ptc_put_placement(f, bf->place[a]);
        }
        fprintf(f, "  -> %s\n", loc + 3);
    }
}

static void put_header(FILE *f, const ptc_plan *p)
{
    fprintf(f, "plan: model '%s' on mesh ", p->model);
    if (p->mesh.naxes)
        ptc_put_mesh(f, &p->mesh);
    else
        fputs("single device", f);
    fprintf(f, " (%d rank%s), ZeRO %d, sequence parallel %s; ", p->nranks,
            p->nranks > 1 ? "s" : "", p->zero, p->seq_parallel ? "on" : "off");
    put_count(f, p->logical_params);
    fprintf(f, " parameters; %d distinct rank program%s\n\n", p->nprograms,
            p->nprograms > 1 ? "s" : "");
}

/* The schedule: stages, the bubble, what each stage holds and runs, in what order. */
static void pipeline_section(FILE *f, const ptc_plan *p)
{
    ptc_pipeline_info pi;
    if (ptc_plan_pipeline(p, &pi) < 0)
        return;
    fprintf(f, "pipeline: %d stage%s", pi.P, pi.P == 1 ? "" : "s");
    if (pi.V > 1)
        fprintf(f, " x %d model chunks", pi.V);
    fprintf(f, ", %s schedule, %d microbatch%s", ptc_pp_schedule_name(pi.schedule), pi.M,
            pi.M == 1 ? "" : "es");
    if (pi.P > 1)
        fprintf(f, ": bubble %d/%d = %.1f%% (the schedule simulated with equal stages: %.1f%%)",
                pi.bubble_num, pi.bubble_den, 100.0 * pi.bubble_num / pi.bubble_den,
                100.0 * pi.bubble_simulated);
    fputs("\n  stage  ranks          in flight  model states  peak activations  layers\n", f);
    for (int s = 0; s < pi.P; s++) {
        const ptc_stage_info *si = &pi.stages[s];
        const ptc_program *pg = &p->programs[si->program];
        ptc_plan_stats st;
        ptc_plan_stats_of(p, si->program, &st);
        char ranks[64]; /* "0-63", "0,2,4-7" */
        int n = 0;
        for (int r = 0; r < pg->nranks && n < (int)sizeof ranks - 24;) {
            int e = r;
            while (e + 1 < pg->nranks && pg->ranks[e + 1] == pg->ranks[e] + 1)
                e++;
            n += snprintf(ranks + n, sizeof ranks - (size_t)n, "%s%d", r ? "," : "", pg->ranks[r]);
            if (e > r)
                n += snprintf(ranks + n, sizeof ranks - (size_t)n, "-%d", pg->ranks[e]);
            r = e + 1;
        }
        char inflight[32];
        snprintf(inflight, sizeof inflight, "%d (%d)", si->inflight, pi.inflight_schedule[s]);
        fprintf(f, "  %-6d %-14s %-10s ", s, ranks, inflight);
        char b1[32], b2[32];
        ptc_human_bytes(st.param_bytes + st.grad_bytes + st.optim_bytes, b1, sizeof b1);
        ptc_human_bytes(st.peak_act_bytes, b2, sizeof b2);
        fprintf(f, "%13s %17s  %s\n", b1, b2, si->layers);
    }
    fputs("  (in flight: microbatches whose forward has begun and whose backward has not ended, in"
          "\n   the program and, in parentheses, in the schedule; bytes per rank)\n",
          f);
    fputs("  work order per stage (F forward, B backward, W weight gradient; microbatch"
          "[.chunk]):\n",
          f);
    for (int s = 0; s < pi.P; s++)
        fprintf(f, "    %d: %s\n", s, pi.stages[s].order);
    fputc('\n', f);
    ptc_pipeline_info_free(&pi);
}

void ptc_print_plan(const ptc_plan *p, const ptc_plan_print_opts *o, FILE *f)
{
    put_header(f, p);
    pipeline_section(f, p);
    for (int k = 0; k < p->nprograms; k++)
        summary(f, p, k, o->device_memory);
    if (o && o->summary_only)
        return;
    for (int k = 0; k < p->nprograms; k++) {
        const ptc_program *pg = &p->programs[k];
        fputs("\n== detail of ranks ", f);
        put_ranks(f, pg);
        fputs(" ==\n", f);
        parameters(f, p, pg);
        ptc_layer_act la[512];
        int na = ptc_plan_layer_activations(p, k, la, 512);
        if (na)
            fputs("activations kept for the backward by layer (microbatch 0; bytes per rank):\n",
                  f);
        for (int i = 0; i < na; i++) {
            fprintf(f, "  %-20s ", la[i].layer);
            put_bytes(f, la[i].bytes);
            fputc('\n', f);
        }
        layer_sum ls[512];
        int nl = layers_of(p, pg, ls, 512);
        if (nl)
            fputs("communication by layer (forward and backward; bytes sent per rank):\n", f);
        for (int i = 0; i < nl; i++) {
            fprintf(f, "  %-20s %3d collectives  ", ls[i].name, ls[i].count);
            put_bytes(f, ls[i].bytes);
            fputc('\n', f);
        }
    }
    fputs("(bytes: parameters and optimizer state are their storage on a rank; gradients the\n"
          " reduced gradient of every parameter; peak activations the most bytes of every other\n"
          " buffer live at once; communication the bytes a rank sends in a ring: allreduce\n"
          " 2N(t-1)/t, allgather/reduce-scatter N(t-1)/t of the full tensor)\n\n",
          f);
    ptc_plan_print(p, f);
}

/* ---- JSON ---- */

static void put_file(void *f, const char *p, size_t n)
{
    fwrite(p, 1, n, f);
}

static void json_string(FILE *f, const char *s)
{
    ptc_json_quote(s, put_file, f);
}

static void json_dims(FILE *f, const ptc_type *t)
{
    fputc('[', f);
    for (int i = 0; i < t->rank; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    fputc(']', f);
}

static void json_placement(FILE *f, const ptc_plan *p, const ptc_buffer *bf)
{
    fputc('{', f);
    for (int a = 0; a < p->mesh.naxes; a++) {
        fprintf(f, "%s\"%s\": \"", a ? ", " : "", p->mesh.names[a]);
        ptc_put_placement(f, bf->place[a]);
        fputc('"', f);
    }
    fputc('}', f);
}

static void json_parameters(FILE *f, const ptc_plan *p)
{
    const ptc_program *pg = &p->programs[0];
    bool first = true;
    fputs("  \"parameters\": [", f);
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->kind != PTC_BUF_PARAM)
            continue;
        ptc_type ft = ptc_buffer_full_type(&p->mesh, bf);
        fputs(first ? "\n    {\"name\": " : ",\n    {\"name\": ", f);
        first = false;
        json_string(f, bf->name);
        fputs(", \"shape\": ", f);
        json_dims(f, &ft);
        fputs(", \"placement\": ", f);
        json_placement(f, p, bf);
        fputs(", \"local_shape\": ", f);
        json_dims(f, &bf->type);
        fputc('}', f);
    }
    fputs("\n  ],\n", f);
}

static void json_memory(FILE *f, const ptc_plan *p, const ptc_program *pg,
                        const ptc_plan_stats *s)
{
    fprintf(f,
            "      \"memory_bytes\": {\"parameters\": %lld, \"gradients\": %lld, "
            "\"optimizer_state\": %lld, \"peak_activations\": %lld, \"peak_instruction\": %d, "
            "\"peak_op\": ",
            (long long)s->param_bytes, (long long)s->grad_bytes, (long long)s->optim_bytes,
            (long long)s->peak_act_bytes, s->peak_instr);
    const ptc_instr *pk = s->peak_instr >= 0 ? &pg->instrs[s->peak_instr] : NULL;
    json_string(f, pk ? what(p, pk) : "");
    fputs(", \"arenas\": {", f);
    for (int r = 0; r < PTC_NREGIONS; r++)
        fprintf(f, "%s\"%s\": %lld", r ? ", " : "", ptc_region_name(r),
                (long long)s->region_bytes[r]);
    fputs("}},\n", f);
}

static void json_communication(FILE *f, const ptc_plan *p, const ptc_program *pg,
                               const ptc_plan_stats *s)
{
    fprintf(f, "      \"communication\": {\"bytes\": %lld, \"collectives\": %d, \"by_kind\": {",
            (long long)s->comm_bytes, s->ncollectives);
    bool first = true;
    for (int k = 0; k <= PTC_NCOLLS; k++)
        if (s->kind_count[k]) {
            fprintf(f, "%s\"%s\": {\"count\": %d, \"bytes\": %lld}", first ? "" : ", ",
                    k < PTC_NCOLLS ? ptc_coll_name(k) : "send", s->kind_count[k],
                    (long long)s->kind_bytes[k]);
            first = false;
        }
    fputs("}, \"by_axis\": {", f);
    for (int a = 0; a < p->mesh.naxes; a++)
        fprintf(f, "%s\"%s\": %lld", a ? ", " : "", p->mesh.names[a], (long long)s->axis_bytes[a]);
    fputs("}, \"by_group\": {", f);
    unsigned order[1 << PTC_MAX_MESH_AXES];
    int ng = groups_in_order(p, s, order);
    for (int i = 0; i < ng; i++) {
        char group[64];
        ptc_plan_group_name(&p->mesh, order[i], group, sizeof group);
        fprintf(f, "%s\"%s\": %lld", i ? ", " : "", group, (long long)s->group_bytes[order[i]]);
    }
    fputs("}, \"by_phase\": {", f);
    for (int ph = 0; ph < 3; ph++)
        fprintf(f, "%s\"%s\": %lld", ph ? ", " : "", ptc_phase_name(ph),
                (long long)s->phase_bytes[ph]);
    fputs("}, \"by_layer\": {", f);
    layer_sum ls[512];
    int nl = layers_of(p, pg, ls, 512);
    for (int i = 0; i < nl; i++) {
        fputs(i ? ", " : "", f);
        json_string(f, ls[i].name);
        fprintf(f, ": {\"count\": %d, \"bytes\": %lld}", ls[i].count, (long long)ls[i].bytes);
    }
    fputs("}},\n", f);
}

static void json_collectives(FILE *f, const ptc_plan *p, const ptc_program *pg)
{
    fputs("      \"collectives\": [", f);
    bool first = true;
    for (int i = 0, idx = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_COLL)
            continue;
        char group[64];
        ptc_plan_group_name(&p->mesh, in->coll.axes, group, sizeof group);
        fprintf(f,
                "%s\n        {\"index\": %d, \"instruction\": %d, \"kind\": \"%s\", "
                "\"axis\": \"%s\", \"shape\": ",
                first ? "" : ",", idx++, i, ptc_coll_name(in->coll.kind), group);
        first = false;
        json_dims(f, &pg->bufs[in->in[0]].type);
        fprintf(f, ", \"bytes\": %lld, \"scope\": ", (long long)ptc_plan_comm_bytes(p, pg, in));
        json_string(f, in->loc.scope ? in->loc.scope : "");
        fprintf(f, ", \"line\": %d, \"phase\": \"%s\"}", in->loc.line, ptc_phase_name(in->phase));
    }
    fputs("\n      ],\n", f);
}

static void json_timeline(FILE *f, const ptc_program *pg)
{
    ptc_mem_timeline t;
    ptc_prog_timeline(pg, PTC_REGION_ACT, &t);
    fputs("      \"activation_timeline\": [", f);
    for (int i = 0; i < pg->ninstrs; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)t.live[i]);
    fputs("],\n", f);
    free(t.live);
}

static void json_pipeline(FILE *f, const ptc_plan *p)
{
    ptc_pipeline_info pi;
    if (ptc_plan_pipeline(p, &pi) < 0)
        return;
    fprintf(f,
            "  \"pipeline\": {\"stages\": %d, \"schedule\": \"%s\", \"microbatches\": %d, "
            "\"virtual_stages\": %d,\n    \"bubble\": {\"formula\": \"%d/%d\", \"value\": %.6f, "
            "\"simulated\": %.6f},\n    \"per_stage\": [",
            pi.P, ptc_pp_schedule_name(pi.schedule), pi.M, pi.V, pi.bubble_num, pi.bubble_den,
            (double)pi.bubble_num / pi.bubble_den, pi.bubble_simulated);
    for (int s = 0; s < pi.P; s++) {
        const ptc_stage_info *si = &pi.stages[s];
        ptc_plan_stats st;
        ptc_plan_stats_of(p, si->program, &st);
        fprintf(f,
                "%s\n      {\"stage\": %d, \"program\": %d, \"in_flight\": %d, "
                "\"in_flight_schedule\": %d, \"model_state_bytes\": %lld, "
                "\"peak_activation_bytes\": %lld, \"layers\": ",
                s ? "," : "", s, si->program, si->inflight, pi.inflight_schedule[s],
                (long long)(st.param_bytes + st.grad_bytes + st.optim_bytes),
                (long long)st.peak_act_bytes);
        json_string(f, si->layers);
        fputs(", \"order\": ", f);
        json_string(f, si->order);
        fputc('}', f);
    }
    fputs("]},\n", f);
    ptc_pipeline_info_free(&pi);
}

static void json_layer_activations(FILE *f, const ptc_plan *p, int k)
{
    ptc_layer_act la[512];
    int n = ptc_plan_layer_activations(p, k, la, 512);
    fputs("      \"activations_by_layer\": {", f);
    for (int i = 0; i < n; i++) {
        fputs(i ? ", " : "", f);
        json_string(f, la[i].layer);
        fprintf(f, ": %lld", (long long)la[i].bytes);
    }
    fputs("},\n", f);
}

void ptc_print_plan_json(const ptc_plan *p, FILE *f)
{
    fputs("{\n  \"schema\": \"ptc-plan/2\",\n  \"model\": ", f);
    json_string(f, p->model);
    fputs(",\n  \"mesh\": {", f);
    for (int a = 0; a < p->mesh.naxes; a++)
        fprintf(f, "%s\"%s\": %d", a ? ", " : "", p->mesh.names[a], p->mesh.sizes[a]);
    fprintf(f, "},\n  \"ranks\": %d,\n  \"zero\": %d,\n  \"seq_parallel\": %s,\n", p->nranks,
            p->zero, p->seq_parallel ? "true" : "false");
    fprintf(f, "  \"parameter_count\": %lld,\n  \"notes\": ", (long long)p->logical_params);
    json_string(f, p->notes);
    fputs(",\n", f);
    json_parameters(f, p);
    json_pipeline(f, p);
    fputs("  \"programs\": [", f);
    for (int k = 0; k < p->nprograms; k++) {
        const ptc_program *pg = &p->programs[k];
        ptc_plan_stats s;
        ptc_plan_stats_of(p, k, &s);
        fprintf(f, "%s\n    {\n      \"ranks\": [", k ? "," : "");
        for (int r = 0; r < pg->nranks; r++)
            fprintf(f, "%s%d", r ? ", " : "", pg->ranks[r]);
        fprintf(f, "],\n      \"stage\": %d,\n      \"instructions\": %d,\n", pg->stage,
                pg->ninstrs);
        json_memory(f, p, pg, &s);
        json_communication(f, p, pg, &s);
        json_collectives(f, p, pg);
        json_timeline(f, pg);
        json_layer_activations(f, p, k);
        fputs("      \"program\": ", f);
        char *text = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&text, &len);
        ptc_plan_print_program(p, k, m);
        fclose(m);
        json_string(f, text);
        free(text);
        fputs("\n    }", f);
    }
    fputs("\n  ]\n}\n", f);
}

/* ---- memory timeline ---- */

void ptc_print_memory(const ptc_plan *p, FILE *f)
{
    put_header(f, p);
    for (int k = 0; k < p->nprograms; k++) {
        const ptc_program *pg = &p->programs[k];
        ptc_mem_timeline t;
        ptc_prog_timeline(pg, PTC_REGION_ACT, &t);
        fputs("== memory of ranks ", f);
        put_ranks(f, pg);
        fputs(" ==\narenas (bytes, allocated once at start):\n", f);
        for (int r = 0; r < PTC_NREGIONS; r++) {
            fprintf(f, "  %-6s ", ptc_region_name(r));
            put_bytes(f, pg->region_bytes[r]);
            fputc('\n', f);
        }
        fputs("peak of live activations: ", f);
        put_bytes(f, t.peak);
        fputs(" at ", f);
        describe_instr(f, p, pg, t.peak_instr);
        fputs("\nlive activation bytes after each instruction:\n", f);
        for (int i = 0; i < pg->ninstrs; i++) {
            const ptc_instr *in = &pg->instrs[i];
            fprintf(f, "  %6d %-9s %-20s %14lld %s", i, ptc_phase_name(in->phase),
                    what(p, in),
                    (long long)t.live[i], i == t.peak_instr ? "<- peak" : "");
            if (in->loc.scope && *in->loc.scope)
                fprintf(f, " %s", in->loc.scope);
            fputc('\n', f);
        }
        free(t.live);
    }
}
