/* trace.c - planned and measured timelines as Chrome trace events (see trace.h). */
#include "trace.h"

#include <stdlib.h>
#include <string.h>

#include "kir.h"
#include "plan.h"

ptc_cost_model ptc_cost_model_default(void)
{
    return (ptc_cost_model){.flops_per_s = 50e9,
                            .bytes_per_s = 20e9,
                            .link_bytes_per_s = 10e9,
                            .latency_s = 10e-6};
}

int ptc_cost_model_parse(const char *spec, bool f32, ptc_cost_model *m, char *err, size_t errn)
{
    *m = ptc_cost_model_default();
    /* H100 and H200 SXM data sheets: 989 TFLOP/s dense BF16/FP16 with tensor cores, 67 FP32;
     * HBM3 3.35 TB/s, HBM3e 4.8 TB/s; NVLink 4 900 GB/s both ways together */
    bool h100 = strcmp(spec, "h100") == 0, h200 = strcmp(spec, "h200") == 0;
    if (strcmp(spec, "cpu") == 0)
        return 0;
    if (h100 || h200) {
        *m = (ptc_cost_model){.flops_per_s = f32 ? 67e12 : 989e12,
                              .bytes_per_s = h100 ? 3.35e12 : 4.8e12,
                              .link_bytes_per_s = 450e9,
                              .latency_s = 10e-6};
        return 0;
    }
    static const char *const keys[] = {"flops", "mem", "link", "latency"};
    double *fields[] = {&m->flops_per_s, &m->bytes_per_s, &m->link_bytes_per_s, &m->latency_s};
    for (const char *s = spec; *s;) {
        size_t len = strcspn(s, ","), klen = strcspn(s, "=");
        int k = 0;
        while (k < 4 && !(klen < len && strlen(keys[k]) == klen && !strncmp(s, keys[k], klen)))
            k++;
        char num[64], *end;
        size_t nlen = klen < len ? len - klen - 1 : 0;
        if (k == 4 || nlen == 0 || nlen >= sizeof num) {
            ptc_fmt(err, errn,
                    "'%.*s' is not KEY=VALUE with KEY flops, mem, link or latency (or use a "
                    "preset: cpu, h100, h200)",
                    (int)len, s);
            return -1;
        }
        memcpy(num, s + klen + 1, nlen);
        num[nlen] = 0;
        double v = strtod(num, &end);
        if (*end || !(v > 0) || v > 1e18 || (k == 3 && v > 10)) {
            ptc_fmt(err, errn, "%s=%s: expected a positive number%s", keys[k], num,
                    k == 3 ? " of seconds, at most 10" : " per second");
            return -1;
        }
        *fields[k] = v;
        s += len + (s[len] == ',');
    }
    return 0;
}

void ptc_cost_model_str(const ptc_cost_model *m, char *buf, size_t n)
{
    bool tf = m->flops_per_s >= 1e12, tb = m->bytes_per_s >= 1e12;
    ptc_fmt(buf, n, "%.4g %cFLOP/s, %.4g %cB/s memory, %.4g GB/s links, %.4g us latency",
            m->flops_per_s / (tf ? 1e12 : 1e9), tf ? 'T' : 'G', m->bytes_per_s / (tb ? 1e12 : 1e9),
            tb ? 'T' : 'G', m->link_bytes_per_s / 1e9, m->latency_s * 1e6);
}

static double bytes_of(const ptc_program *pg, const int *ids, int n)
{
    double b = 0;
    for (int k = 0; k < n; k++)
        b += (double)pg->bufs[ids[k]].bytes;
    return b;
}

double ptc_instr_seconds(const ptc_plan *p, const ptc_program *pg, int i, const ptc_cost_model *m)
{
    const ptc_instr *in = &pg->instrs[i];
    double flops = 0, bytes = bytes_of(pg, in->in, in->nin) + bytes_of(pg, in->out, in->nout);
    switch (in->kind) {
    case PTC_INSTR_KERNEL: {
        ptc_type it[PTC_MAX_RESULTS * 2], ot[PTC_MAX_RESULTS];
        int nin = in->nin < PTC_MAX_RESULTS * 2 ? in->nin : PTC_MAX_RESULTS * 2;
        int nout = in->nout < PTC_MAX_RESULTS ? in->nout : PTC_MAX_RESULTS;
        for (int k = 0; k < nin; k++)
            it[k] = pg->bufs[in->in[k]].type;
        for (int k = 0; k < nout; k++)
            ot[k] = pg->bufs[in->out[k]].type;
        flops = ptc_op_flops(in->op, &in->attrs, it, nin, ot, nout);
        break;
    }
    case PTC_INSTR_GEMM:
        flops = 2.0 * (double)in->gemm.m * (double)in->gemm.n * (double)in->gemm.k *
                (double)in->gemm.batch;
        break;
    case PTC_INSTR_COLL:
    case PTC_INSTR_SEND:
        return m->latency_s + (double)ptc_plan_comm_bytes(p, pg, in) / m->link_bytes_per_s;
    case PTC_INSTR_RECV: return 0; /* the wait is the simulation's; the bytes, the send's */
    default: break;
    }
    double tf = flops / m->flops_per_s, tb = bytes / m->bytes_per_s;
    return tf > tb ? tf : tb;
}

/* ---- simulation ---- */

ptc_trace_event *ptc_plan_simulate(const ptc_plan *p, const ptc_cost_model *m, int *n,
                                   double *makespan, char *err, size_t errn)
{
    int np = p->nprograms, ntags = 0, total = 0;
    for (int k = 0; k < np; k++) {
        total += p->programs[k].ninstrs;
        for (int i = 0; i < p->programs[k].ninstrs; i++) {
            const ptc_instr *in = &p->programs[k].instrs[i];
            if ((in->kind == PTC_INSTR_SEND || in->kind == PTC_INSTR_RECV) && in->tag >= ntags)
                ntags = in->tag + 1;
        }
    }
    double *sent = ptc_xmalloc(sizeof(double) * (size_t)(ntags + 1)); /* message ready at */
    for (int t = 0; t <= ntags; t++)
        sent[t] = -1;
    int *pos = ptc_xcalloc((size_t)(np ? np : 1), sizeof(int));
    double *clock = ptc_xcalloc((size_t)(np ? np : 1), sizeof(double));
    ptc_trace_event *ev = ptc_xmalloc(sizeof *ev * (size_t)(total ? total : 1));
    int ne = 0;
    for (bool progress = true; progress;) {
        progress = false;
        for (int k = 0; k < np; k++) {
            const ptc_program *pg = &p->programs[k];
            while (pos[k] < pg->ninstrs) {
                int i = pos[k];
                const ptc_instr *in = &pg->instrs[i];
                double start = clock[k];
                if (in->kind == PTC_INSTR_RECV) {
                    if (sent[in->tag] < 0)
                        break; /* not sent yet */
                    if (sent[in->tag] > start)
                        start = sent[in->tag];
                }
                double dur = ptc_instr_seconds(p, pg, i, m);
                if (in->kind == PTC_INSTR_SEND)
                    sent[in->tag] = start + dur;
                ev[ne++] = (ptc_trace_event){.rank = k, .instr = i, .start = start, .dur = dur};
                clock[k] = start + dur;
                pos[k]++;
                progress = true;
            }
        }
    }
    int stuck = -1;
    double end = 0;
    for (int k = 0; k < np; k++) {
        if (pos[k] < p->programs[k].ninstrs && stuck < 0)
            stuck = k;
        if (clock[k] > end)
            end = clock[k];
    }
    free(sent);
    free(pos);
    free(clock);
    if (stuck >= 0) {
        ptc_fmt(err, errn, "the programs would wait on each other forever (program %d stops)",
                stuck);
        free(ev);
        return NULL;
    }
    *n = ne;
    *makespan = end;
    return ev;
}

/* ---- writing ---- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static const char *instr_name(const ptc_plan *p, const ptc_instr *in)
{
    switch (in->kind) {
    case PTC_INSTR_GEMM: return "gemm";
    case PTC_INSTR_COLL: return ptc_coll_name(in->coll.kind);
    case PTC_INSTR_SEND: return "send";
    case PTC_INSTR_RECV: return "recv";
    case PTC_INSTR_COPY: return "copy";
    case PTC_INSTR_KERNEL: return ptc_ops[in->op].name;
    case PTC_INSTR_FUSED: return p->kernels[in->kernel]->name;
    default: return "?";
    }
}

/* The unit of work of an instruction, as a group slice's name: "F3", "B3.1", "update". */
static void work_name(const ptc_plan *p, const ptc_instr *in, char *buf, size_t n)
{
    if (in->work == PTC_WORK_STEP) {
        ptc_fmt(buf, n, "%s", ptc_phase_name(in->phase));
        return;
    }
    int P = 1;
    for (int a = 0; a < p->mesh.naxes; a++)
        if (strcmp(p->mesh.names[a], "pp") == 0)
            P = p->mesh.sizes[a];
    if (p->virtual_stages > 1)
        ptc_fmt(buf, n, "%s%d.%d", ptc_work_name(in->work), in->mb, in->vstage / P);
    else
        ptc_fmt(buf, n, "%s%d", ptc_work_name(in->work), in->mb);
}

static bool same_work(const ptc_instr *a, const ptc_instr *b)
{
    if (a->work != b->work)
        return false;
    if (a->work == PTC_WORK_STEP)
        return a->phase == b->phase;
    return a->mb == b->mb && a->vstage == b->vstage;
}

static void put_event(FILE *f, bool *first, const char *name, const char *cat, int tid,
                      double start, double dur)
{
    fprintf(f, "%s\n{\"name\":", *first ? "" : ",");
    *first = false;
    json_str(f, name);
    fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", cat,
            tid, start * 1e6, dur * 1e6);
}

/* The events of one row: group slices of back-to-back work, the instructions inside. */
static void write_row(FILE *f, bool *first, const ptc_plan *p, const ptc_program *pg,
                      const ptc_trace_event *ev, int n, int tid)
{
    for (int a = 0; a < n;) {
        const ptc_instr *ia = &pg->instrs[ev[a].instr];
        int b = a;
        while (b + 1 < n && ev[b + 1].step == ev[a].step &&
               same_work(&pg->instrs[ev[b + 1].instr], ia))
            b++;
        char name[64], layer[64];
        work_name(p, ia, name, sizeof name);
        put_event(f, first, name, "work", tid, ev[a].start, ev[b].start + ev[b].dur - ev[a].start);
        fprintf(f, ",\"args\":{\"step\":%lld,\"phase\":\"%s\"", ev[a].step,
                ptc_phase_name(ia->phase));
        if (ia->work != PTC_WORK_STEP)
            fprintf(f, ",\"microbatch\":%d,\"stage\":%d", ia->mb, ia->vstage);
        fputs("}}", f);
        for (int e = a; e <= b; e++) {
            const ptc_instr *in = &pg->instrs[ev[e].instr];
            put_event(f, first, instr_name(p, in), ptc_phase_name(in->phase), tid, ev[e].start,
                      ev[e].dur);
            ptc_plan_layer(in->loc.scope, layer, sizeof layer);
            fprintf(f, ",\"args\":{\"instr\":%d,\"layer\":", ev[e].instr);
            json_str(f, layer);
            if (in->work != PTC_WORK_STEP)
                fprintf(f, ",\"microbatch\":%d,\"stage\":%d", in->mb, in->vstage);
            if (in->recompute)
                fputs(",\"recompute\":true", f);
            int64_t sent = ptc_plan_comm_bytes(p, pg, in);
            if (sent)
                fprintf(f, ",\"bytes_sent\":%lld", (long long)sent);
            if (in->loc.line)
                fprintf(f, ",\"line\":%d", in->loc.line);
            fputs("}}", f);
        }
        a = b + 1;
    }
}

static int cmp_event(const void *x, const void *y)
{
    const ptc_trace_event *a = x, *b = y;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    return a->start < b->start ? -1 : a->start > b->start ? 1 : (a->instr > b->instr) - (a->instr < b->instr);
}

void ptc_trace_write(FILE *f, const ptc_plan *p, const ptc_trace_event *ev, int n, bool by_program,
                     const char *title)
{
    ptc_trace_event *s = ptc_xmalloc(sizeof *s * (size_t)(n ? n : 1));
    memcpy(s, ev, sizeof *s * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_event);
    bool rows_per_program = by_program && p->nranks > 64;
    int nrows = rows_per_program ? p->nprograms : p->nranks;
    fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"title\":", f);
    json_str(f, title);
    fputs(",\"model\":", f);
    json_str(f, p->model);
    fputs("},\n\"traceEvents\":[", f);
    bool first = true;
    for (int row = 0; row < nrows; row++) {
        int prog = rows_per_program ? row : p->rank_program[row];
        const ptc_program *pg = &p->programs[prog];
        char label[96];
        if (rows_per_program)
            ptc_fmt(label, sizeof label, "program %d (%d ranks, stage %d)", row, pg->nranks,
                    pg->stage);
        else
            ptc_fmt(label, sizeof label, "rank %d (stage %d)", row, pg->stage);
        fprintf(f, "%s\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{"
                   "\"name\":",
                first ? "" : ",", row);
        first = false;
        json_str(f, label);
        fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                   "\"args\":{\"sort_index\":%d}}",
                row, row);
        int key = by_program ? prog : row, a = 0;
        while (a < n && s[a].rank != key)
            a++;
        int b = a;
        while (b < n && s[b].rank == key)
            b++;
        write_row(f, &first, p, pg, s + a, b - a, row);
    }
    fputs("\n]}\n", f);
    free(s);
}
