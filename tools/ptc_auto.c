/* ptc_auto.c - the automatic planner and the device-memory check (see ptc_auto.h). */
#define _GNU_SOURCE /* sched_getaffinity: the cores this process may run on */
#include "ptc_auto.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "diag.h"
#include "plan.h"
#include "schedule.h"

enum { FITS, OVER, REFUSED };

typedef struct cand {
    int pp, dp, ep, tp, zero, sched, micro;
    bool sp; /* sequence parallelism (tp > 1) */
    ptc_recompute rec;
    int64_t bytes;  /* the fullest rank's, allocated at start */
    double seconds; /* the simulated step */
    int status;
    int order;     /* its place in the search: ties go to the first */
    char why[200]; /* REFUSED: the compiler's message, its first line */
} cand;

typedef struct search {
    const ptc_options *base;
    const char *src;
    size_t len;
    int64_t logical_params;
    cand *c; /* evaluated */
    int n, cap;
    int chain_start; /* the first of the chain being run */
} search;

int64_t ptc_plan_fullest(const ptc_plan *p, int *program)
{
    int64_t most = -1;
    for (int k = 0; k < p->nprograms; k++) {
        int64_t b = 0;
        for (int r = 0; r < PTC_NREGIONS; r++)
            b += p->programs[k].region_bytes[r];
        if (b > most)
            most = b, *program = k;
    }
    return most;
}

/* the mesh axes in ptc's order, and c's size on each */
static const char *const axis_names[4] = {"pp", "dp", "ep", "tp"};
#define CAND_SIZES(c)                                                                              \
    {                                                                                              \
        (c)->pp, (c)->dp, (c)->ep, (c)->tp                                                         \
    }

static void mesh_str(const cand *c, char *buf, size_t n)
{
    const int sizes[4] = CAND_SIZES(c);
    size_t used = 0;
    buf[0] = 0;
    for (int a = 0; a < 4; a++)
        if (sizes[a] > 1 && used < n)
            used += (size_t)snprintf(buf + used, n - used, "%s%s=%d", used ? "," : "",
                                     axis_names[a], sizes[a]);
    if (!used)
        ptc_fmt(buf, n, "1 device");
}

/* The options of candidate c: the user's, with c's plan flags. */
static ptc_options cand_options(const ptc_options *base, const cand *c)
{
    ptc_options o = *base;
    o.mesh = (ptc_mesh){0};
    const int sizes[4] = CAND_SIZES(c);
    for (int a = 0; a < 4; a++)
        if (sizes[a] > 1) {
            ptc_fmt(o.mesh.names[o.mesh.naxes], sizeof o.mesh.names[0], "%s", axis_names[a]);
            o.mesh.sizes[o.mesh.naxes++] = sizes[a];
        }
    o.zero = c->zero;
    o.seq_parallel = c->sp;
    o.microbatches = c->micro;
    o.pp_schedule = c->sched;
    o.virtual_stages = 0;
    o.recompute = c->rec;
    o.auto_devices = 0;
    return o;
}

/* The first line of a compiler message, from its "error: " on. */
static void first_line(const char *msgs, char *buf, size_t n)
{
    const char *s = msgs ? msgs : "";
    const char *e = strstr(s, "error: ");
    if (e && e < s + strcspn(s, "\n"))
        s = e + 7;
    ptc_fmt(buf, n, "%.*s", (int)strcspn(s, "\n"), s);
}

/* Compiles candidate c as the command line would, to its memory plan, and simulates its step. */
static void evaluate(search *S, cand *c)
{
    ptc_options o = cand_options(S->base, c);
    char *msgs = NULL, err[2048];
    size_t nmsgs = 0;
    FILE *quiet = open_memstream(&msgs, &nmsgs);
    ptc_diag diag;
    ptc_diag_init(&diag, quiet, o.file, S->src, S->len);
    ptc_frontend_opts fo = ptc_flags_frontend_opts(&o);
    ptc_graph *g = ptc_frontend_compile(o.file, S->src, S->len, &fo, &diag);
    ptc_plan *p = NULL;
    if (g && ptc_flags_apply(&o, g, quiet) == 0) {
        ptc_compile_opts co = ptc_flags_compile_opts(&o);
        ptc_pass_ctx ctx = {.g = g, .opts = &co, .err = err, .errn = sizeof err};
        if (ptc_run_passes(&ctx) < 0) {
            fprintf(quiet, "%s\n", err);
        } else {
            ptc_lower_opts lo = ptc_flags_lower_opts(&o, ctx.g);
            lo.logical_params = S->logical_params;
            if (!(p = ptc_lower(ctx.g, &lo, err, sizeof err)))
                fprintf(quiet, "%s\n", err);
        }
        g = ctx.g;
        ptc_pass_ctx_free(&ctx);
    }
    ptc_graph_free(g);
    int n, program;
    ptc_trace_event *ev = NULL;
    if (p && !(ev = ptc_plan_simulate(p, &S->base->cost, &n, &c->seconds, err, sizeof err)))
        fprintf(quiet, "error: the step does not simulate: %s\n", err);
    fclose(quiet);
    if (ev) {
        c->bytes = ptc_plan_fullest(p, &program);
        c->status = S->base->device_memory && c->bytes > S->base->device_memory ? OVER : FITS;
    } else {
        c->status = REFUSED;
        first_line(msgs, c->why, sizeof c->why);
    }
    free(ev);
    free(msgs);
    ptc_plan_free(p);
}

static int add(search *S, cand c)
{
    if (S->n == S->cap)
        S->c = ptc_xrealloc(S->c, sizeof *S->c * (size_t)(S->cap = S->cap ? 2 * S->cap : 64));
    c.order = c.order * 4096 + (S->n - S->chain_start); /* (a chain is at most 3 x 11 long) */
    S->c[S->n] = c;
    evaluate(S, &S->c[S->n]);
    return S->c[S->n++].status;
}

/* c with no recompute, then selective, then full while the one before is over the memory. */
static int recompute_ladder(search *S, cand c)
{
    int st = REFUSED;
    for (int r = PTC_RECOMPUTE_NONE; r <= PTC_RECOMPUTE_FULL; r++) {
        c.rec = (ptc_recompute)r;
        if ((st = add(S, c)) != OVER)
            break;
    }
    return st;
}

/* The candidates of one mesh, ZeRO stage and SP (c), in the order that each one's result
 * decides whether the next is worth compiling. */
static void run_chain(search *S, cand c)
{
    S->chain_start = S->n;
    if (c.pp > 1) {
        static const int scheds[] = {PTC_PP_1F1B, PTC_PP_INTERLEAVED, PTC_PP_ZB_H1};
        for (int k = 0; k < 3; k++)
            for (int m = 1; m <= 4; m *= 2) { /* (a batch m cannot split, 2m neither) */
                c.sched = scheds[k];
                c.micro = m * c.pp;
                if (recompute_ladder(S, c) == REFUSED)
                    break;
            }
        return;
    }
    /* more microbatches while the fewer need recompute to fit: accumulation may be faster */
    c.sched = PTC_PP_1F1B;
    for (c.micro = 1; c.micro <= 1024; c.micro *= 2) {
        int st = recompute_ladder(S, c);
        if (st == REFUSED || (st == FITS && S->c[S->n - 1].rec == PTC_RECOMPUTE_NONE))
            break;
    }
}

/* Runs the chains on up to the machine's cores: each worker a forked process (the compiler is
 * not thread-safe, nor need it be) that sends its candidates back through a pipe. */
static void run_chains(search *S, const cand *chains, int nchains)
{
    cpu_set_t set;
    long cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                             : sysconf(_SC_NPROCESSORS_ONLN);
    int nw = cores < 1 ? 1 : cores > 64 ? 64 : (int)cores;
    nw = nw < nchains ? nw : nchains;
    int fds[64], started = 0;
    pid_t pids[64];
    fflush(NULL);
    for (int w = 0; w < nw && nw > 1; w++, started++) {
        int pfd[2];
        if (pipe(pfd) < 0)
            break;
        if ((pids[w] = fork()) < 0) {
            close(pfd[0]);
            close(pfd[1]);
            break;
        }
        if (pids[w] == 0) {
            close(pfd[0]);
            for (int k = w; k < nchains; k += nw)
                run_chain(S, chains[k]);
            bool ok = true;
            for (size_t off = 0, n = sizeof *S->c * (size_t)S->n; ok && off < n;) {
                ssize_t wr = write(pfd[1], (const char *)S->c + off, n - off);
                ok = wr > 0;
                off += ok ? (size_t)wr : 0;
            }
            _exit(ok ? 0 : 1);
        }
        close(pfd[1]);
        fds[w] = pfd[0];
    }
    bool lost = started < nw; /* a worker could not start: its chains were never run */
    for (int w = 0; w < started; w++) {
        cand c;
        size_t got = 0;
        ssize_t r;
        while ((r = read(fds[w], (char *)&c + got, sizeof c - got)) > 0)
            if ((got += (size_t)r) == sizeof c) {
                if (S->n == S->cap)
                    S->c = ptc_xrealloc(S->c,
                                        sizeof *S->c * (size_t)(S->cap = S->cap ? 2 * S->cap : 64));
                S->c[S->n++] = c;
                got = 0;
            }
        close(fds[w]);
        int st;
        lost |= waitpid(pids[w], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    if (lost || nw <= 1) { /* a worker died or never started (or none were): all here, again */
        S->n = 0;
        for (int k = 0; k < nchains; k++)
            run_chain(S, chains[k]);
    }
}

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->status != y->status)
        return x->status - y->status;
    if (x->status == FITS && x->seconds != y->seconds)
        return (x->seconds > y->seconds) - (x->seconds < y->seconds);
    if (x->bytes != y->bytes)
        return (x->bytes > y->bytes) - (x->bytes < y->bytes);
    return x->order - y->order;
}

static void print_cand(FILE *f, const cand *c, const char *tail)
{
    char mesh[64], b[32];
    mesh_str(c, mesh, sizeof mesh);
    ptc_human_bytes(c->bytes, b, sizeof b);
    fprintf(f, "  %12.3f  %12s  %-20s %4d  %-3s  %-11s %5d  %s%s\n", c->seconds * 1e3, b, mesh,
            c->zero, c->sp ? "on" : "off", c->pp > 1 ? ptc_pp_schedule_name(c->sched) : "-",
            c->micro, ptc_recompute_name(c->rec), tail);
}

/* The model has moe layers (ep is worth searching). */
static bool has_moe(const ptc_graph *g)
{
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == PTC_OP_MOE)
            return true;
    return false;
}

static void print_flags(FILE *f, const cand *c)
{
    char mesh[64];
    mesh_str(c, mesh, sizeof mesh);
    if (c->pp * c->dp * c->ep * c->tp > 1)
        fprintf(f, " --mesh %s", mesh);
    if (c->zero)
        fprintf(f, " --zero %d", c->zero);
    if (c->sp)
        fputs(" --seq-parallel", f);
    if (c->pp > 1)
        fprintf(f, " --pp-schedule %s", ptc_pp_schedule_name(c->sched));
    if (c->micro > 1)
        fprintf(f, " --microbatches %d", c->micro);
    if (c->rec != PTC_RECOMPUTE_NONE)
        fprintf(f, " --recompute %s", ptc_recompute_name(c->rec));
}

/* The chains of N devices: every mesh (ep only for a model with moe layers) within --mesh's
 * limit of ranks an axis; ZeRO 0-3 where dp or ep > 1; with tp > 1 SP on and off (the gathers
 * it adds can cost more than it saves). */
static cand *make_chains(int N, bool moe, int *nchains)
{
    cand *chains = NULL;
    *nchains = 0;
    for (int pp = 1; pp <= N; pp++)
        for (int tp = 1; N % pp == 0 && tp <= N / pp; tp++)
            for (int ep = 1; (N / pp) % tp == 0 && ep <= N / pp / tp; ep++) {
                int dp = N / pp / tp / ep;
                if ((N / pp / tp) % ep || (!moe && ep > 1) || pp > PTC_FLAGS_MAX_AXIS ||
                    tp > PTC_FLAGS_MAX_AXIS || ep > PTC_FLAGS_MAX_AXIS || dp > PTC_FLAGS_MAX_AXIS)
                    continue;
                for (int z = 0; z <= (dp * ep > 1 ? 3 : 0) * 2 + 1; z++) {
                    if (z % 2 && tp == 1)
                        continue;
                    chains = ptc_xrealloc(chains, sizeof *chains * (size_t)(*nchains + 1));
                    chains[*nchains] = (cand){.pp = pp,
                                              .tp = tp,
                                              .ep = ep,
                                              .dp = dp,
                                              .zero = z / 2,
                                              .sp = z % 2,
                                              .order = *nchains};
                    (*nchains)++;
                }
            }
    return chains;
}

/* The report of the sorted candidates on out; with none that fits, the error on errf and 1. */
static int report(const search *S, int N, FILE *out, FILE *errf)
{
    char reasons[4][200]; /* the first distinct reasons candidates were refused */
    int nreasons = 0, nfit = 0, nover = 0;
    for (int k = 0; k < S->n; k++) {
        bool seen = S->c[k].status != REFUSED;
        for (int j = 0; j < nreasons && !seen; j++)
            seen = strcmp(reasons[j], S->c[k].why) == 0;
        if (!seen && nreasons < 4)
            ptc_fmt(reasons[nreasons++], sizeof reasons[0], "%s", S->c[k].why);
        nfit += S->c[k].status == FITS, nover += S->c[k].status == OVER;
    }
    char cm[160], lim[32] = "no limit", b[32];
    ptc_cost_model_str(&S->base->cost, cm, sizeof cm);
    if (S->base->device_memory)
        ptc_human_bytes(S->base->device_memory, lim, sizeof lim);
    fprintf(out,
            "auto plan of %d device%s (--cost-model: %s; --device-memory: %s): %d candidate%s, "
            "%d fit, %d over the memory, %d refused by the compiler\n",
            N, N == 1 ? "" : "s", cm, lim, S->n, S->n == 1 ? "" : "s", nfit, nover,
            S->n - nfit - nover);
    if (nreasons)
        fputs("  refused, for example:\n", out);
    for (int k = 0; k < nreasons; k++)
        fprintf(out, "    %s\n", reasons[k]);
    if (nfit + nover)
        fputs("     step (ms)  fullest rank  mesh                 zero  sp   schedule    "
              "micro  recompute\n",
              out);
    for (int k = 0; k < nfit && k < 10; k++)
        print_cand(out, &S->c[k], k == 0 ? "  <- chosen" : "");
    if (nfit > 10)
        fprintf(out, "  ... %d more that fit\n", nfit - 10);
    if (nover)
        print_cand(out, &S->c[nfit], "  (the least memory over the limit)");
    if (nfit)
        return 0;
    if (nover) {
        ptc_human_bytes(S->c[nfit].bytes, b, sizeof b);
        fprintf(errf,
                "ptc: error: --auto %d: no plan fits --device-memory %s: the least any candidate "
                "plans on its fullest rank is %s; give more devices or memory, or a smaller "
                "batch\n",
                N, lim, b);
    } else if (S->n) {
        fprintf(errf, "ptc: error: --auto %d: the compiler refused every candidate (%s)\n", N,
                reasons[0]);
    } else {
        fprintf(errf,
                "ptc: error: --auto %d: no mesh of %d ranks keeps every axis at most %d "
                "ranks\n",
                N, N, PTC_FLAGS_MAX_AXIS);
    }
    return 1;
}

int ptc_auto_choose(ptc_options *o, const ptc_graph *forward, const char *src, size_t len,
                    int64_t logical_params, FILE *out, FILE *errf, char *note, size_t noten)
{
    search S = {.base = o, .src = src, .len = len, .logical_params = logical_params};
    int N = o->auto_devices, nchains;
    cand *chains = make_chains(N, has_moe(forward), &nchains);
    run_chains(&S, chains, nchains);
    free(chains);
    qsort(S.c, (size_t)S.n, sizeof *S.c, cmp_cand);
    int rc = report(&S, N, out, errf);
    if (!rc) {
        fputs("chosen:", out);
        print_flags(out, &S.c[0]);
        fputs(N == 1 ? " (one device: no flags)\n" : "\n", out);
        int nfit = 0;
        for (int k = 0; k < S.n; k++)
            nfit += S.c[k].status == FITS;
        char *flags = NULL, cm[160];
        size_t nflags = 0;
        FILE *f = open_memstream(&flags, &nflags);
        print_flags(f, &S.c[0]);
        fclose(f);
        ptc_cost_model_str(&o->cost, cm, sizeof cm);
        ptc_fmt(note, noten,
                "auto: --auto %d chose%s, the fastest simulated step (%.3f ms on %s) of the %d "
                "candidates that fit, of %d",
                N, *flags ? flags : " one device", S.c[0].seconds * 1e3, cm, nfit, S.n);
        free(flags);
        ptc_options chosen = cand_options(o, &S.c[0]);
        *o = chosen;
    }
    free(S.c);
    return rc;
}

int ptc_check_device_memory(const ptc_plan *p, const ptc_options *o, FILE *errf)
{
    int k = 0;
    int64_t most = ptc_plan_fullest(p, &k);
    if (!o->device_memory || most <= o->device_memory)
        return 0;
    const ptc_program *pg = &p->programs[k];
    char lim[32], b[32];
    ptc_human_bytes(o->device_memory, lim, sizeof lim);
    ptc_human_bytes(most, b, sizeof b);
    fprintf(errf, "ptc: error: --device-memory %s: rank %d", lim, pg->ranks[0]);
    if (pg->nranks > 1)
        fprintf(errf, " (and %d more like it)", pg->nranks - 1);
    fprintf(errf, " plans %s:", b);
    static const char *const what[PTC_NREGIONS] = {[PTC_REGION_PARAM] = "parameters",
                                                   [PTC_REGION_GRAD] = "gradients",
                                                   [PTC_REGION_OPTIM] = "optimizer state",
                                                   [PTC_REGION_ACT] = "activations",
                                                   [PTC_REGION_COMM] = "messages in flight"};
    for (int r = 0, first = 1; r < PTC_NREGIONS; r++) {
        if (!pg->region_bytes[r])
            continue;
        ptc_human_bytes(pg->region_bytes[r], b, sizeof b);
        fprintf(errf, "%s %s %s", first ? "" : ",", what[r] ? what[r] : ptc_region_name(r), b);
        first = 0;
    }
    fprintf(errf,
            "\n  (ptc --emit memory shows where; --auto %d --device-memory %s looks for a plan "
            "that fits)\n",
            p->nranks, lim);
    return 1;
}
