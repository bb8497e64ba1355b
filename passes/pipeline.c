/* pipeline.c - pipeline stages and activation recompute, as annotations of the step graph.
 *
 * Assumes: the partitioned step graph (forward, backward, optimizer; placements and collectives
 *          over dp/tp/mb). Nodes carry their source location and block instance scope.
 * Guarantees: with S = pp x virtual-stages > 1, every node the lowering runs on one stage has
 *          node.stage in [0, S) (the virtual stage: model chunk c of pp rank r is c * pp + r); a
 *          node whose operands are all sources (or such nodes) may run anywhere and keeps stage
 *          0. Forward nodes marked recompute are rebuilt by the lowering before the backward that
 *          reads them, instead of kept. ctx->notes tells what was chosen and why.
 *
 * Layers are the natural cut points: the forward nodes of one iteration of a `repeat` (scope
 * "h.3..." is layer h.3). Forward nodes of the model body before the first layer (embedding) form
 * the unit "pre", those after the last layer (final norm, head, loss) "post"; body nodes between
 * layers go with the layer before them. Backward nodes carry the location of the forward node they
 * differentiate, and take its stage; optimizer nodes follow their largest operand. Stages are
 * contiguous runs of units: the first holds pre, the last post. Without --stages the cut
 * minimises the largest stage's compute (forward + backward flops and bytes, from ir/cost.c), and
 * among cuts within 2% of that spreads compute and memory evenly: model states (parameters,
 * gradients and Adam moments: 16 bytes a parameter), with microbatches the gradient accumulators
 * of weights read on more than one stage (split_tied_sums), and the activations each stage keeps
 * times the microbatches its schedule keeps in flight - so the embedding and the head weigh in
 * with their compute and their memory, and 1F1B's first stages with their activations.
 *
 * Recompute (Korthikanti et al. 2022): full marks every forward node of a layer except those whose
 * result leaves the layer (the next layer's input is kept); selective marks the attention core.
 * Our attention op never stores its s x s scores (its backward recomputes them), so what selective
 * saves here is the attention output (s b h per layer), rebuilt from the kept q, k, v.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

const char *ptc_recompute_name(int r)
{
    static const char *const names[] = {"none", "selective", "full"};
    return r >= 0 && r <= PTC_RECOMPUTE_FULL ? names[r] : "?";
}

int ptc_recompute_parse(const char *s)
{
    for (int r = 0; r <= PTC_RECOMPUTE_FULL; r++)
        if (strcmp(s, ptc_recompute_name(r)) == 0)
            return r;
    return -1;
}

/* The layer a scope belongs to: the length of its prefix through the first all-digit component
 * ("h.3.attn" -> 3, "h.3"), or 0 when it has none. */
static size_t layer_prefix(const char *scope)
{
    if (!scope)
        return 0;
    const char *c = scope;
    while (*c) {
        const char *e = c;
        bool digits = true;
        while (*e && *e != '.')
            digits &= *e >= '0' && *e <= '9', e++;
        if (digits && e > c)
            return (size_t)(e - scope);
        c = *e ? e + 1 : e;
    }
    return 0;
}

typedef struct unit {
    const char *scope; /* a scope of the layer (its first node's), NULL for pre and post */
    size_t len;        /* the layer prefix's length */
    double cost;       /* forward + backward work (flops + bytes / 4) */
    double mem;        /* model state bytes */
    double act;        /* forward results the backward reads (not recomputed): one microbatch's */
} unit;

typedef struct pl {
    ptc_graph *g;
    const ptc_compile_opts *o;
    bool *fwd;     /* node is in the loss's forward cone */
    bool *free_;   /* node runs anywhere: no operand other than parameters, states, the
                      optimizer's inputs and free nodes (not the data) */
    int *unit;     /* node -> unit, -1 none */
    unit *units;
    int nunits;
    /* weights read by more than one unit: with microbatches each stage that reads one, other
     * than the stage of its first reader, holds an accumulator of its gradient (split_tied_sums
     * below) */
    struct shared_w {
        int home;     /* the unit of its first forward reader, where its states count */
        double bytes; /* its gradient's */
        int first, n; /* its readers' units: readers[first .. first + n) */
    } *shared;
    int nshared;
    int *readers;
} pl;

static bool is_source(const ptc_node *n)
{
    return n->op == PTC_OP_INPUT || n->op == PTC_OP_PARAM || n->op == PTC_OP_STATE;
}

static void find_forward(pl *P)
{
    ptc_graph *g = P->g;
    if (g->loss < 0)
        return;
    int *stack = ptc_xmalloc(sizeof(int) * (size_t)(g->nnodes + 1) * 8);
    int cap = (g->nnodes + 1) * 8, sp = 0;
    stack[sp++] = g->values[g->loss].def;
    while (sp) {
        int ni = stack[--sp];
        if (P->fwd[ni])
            continue;
        P->fwd[ni] = true;
        for (int k = 0; k < g->nodes[ni].nin; k++) {
            if (sp == cap)
                stack = ptc_xrealloc(stack, sizeof(int) * (size_t)(cap *= 2));
            stack[sp++] = g->values[g->nodes[ni].in[k]].def;
        }
    }
    free(stack);
}

static bool same_scope(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* The unit of forward node scope s (a layer), adding it when new. */
static int layer_unit(pl *P, const char *scope)
{
    size_t len = layer_prefix(scope);
    for (int u = P->nunits - 1; u >= 1; u--)
        if (P->units[u].len == len && strncmp(P->units[u].scope, scope, len) == 0)
            return u;
    P->units = ptc_xrealloc(P->units, sizeof(unit) * (size_t)(P->nunits + 1));
    P->units[P->nunits] = (unit){.scope = scope, .len = len};
    return P->nunits++;
}

/* Location key of a node, for finding the forward node a backward node differentiates. */
static uint64_t loc_hash(const ptc_loc *l)
{
    uint64_t h = (uint64_t)l->line * 1000003u ^ (uint64_t)l->col * 7919u;
    for (const char *c = l->scope; c && *c; c++)
        h = h * 31u + (unsigned char)*c;
    return h;
}

static void find_units(pl *P)
{
    ptc_graph *g = P->g;
    P->units = ptc_xmalloc(sizeof(unit));
    P->units[0] = (unit){0}; /* pre */
    P->nunits = 1;
    int last_layer_node = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (P->fwd[i] && !is_source(&g->nodes[i]) && layer_prefix(g->nodes[i].loc.scope))
            last_layer_node = i;
    int cur = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        P->unit[i] = -1;
        if (!P->fwd[i] || is_source(n) || P->free_[i])
            continue;
        if (layer_prefix(n->loc.scope))
            cur = layer_unit(P, n->loc.scope);
        P->unit[i] = cur;
    }
    int post = P->nunits;
    P->units = ptc_xrealloc(P->units, sizeof(unit) * (size_t)(post + 1));
    P->units[post] = (unit){0};
    P->nunits++;
    for (int i = last_layer_node + 1; i < g->nnodes; i++)
        if (P->unit[i] >= 0 && !layer_prefix(g->nodes[i].loc.scope))
            P->unit[i] = post;
    if (last_layer_node < 0) { /* no layers: everything is pre, nothing to cut */
        for (int i = 0; i < g->nnodes; i++)
            if (P->unit[i] == post)
                P->unit[i] = 0;
        P->nunits = 1;
    }

    /* the other nodes: the unit of the forward node at their location, else of their largest
     * operand that has one */
    int nh = 1;
    while (nh < 2 * g->nnodes + 2)
        nh *= 2;
    int *table = ptc_xmalloc(sizeof(int) * (size_t)nh);
    for (int h = 0; h < nh; h++)
        table[h] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        if (P->unit[i] < 0 || !P->fwd[i])
            continue;
        uint64_t h = loc_hash(&g->nodes[i].loc) & (uint64_t)(nh - 1);
        while (table[h] >= 0) {
            const ptc_loc *a = &g->nodes[table[h]].loc, *b = &g->nodes[i].loc;
            if (a->line == b->line && a->col == b->col && same_scope(a->scope, b->scope))
                break;
            h = (h + 1) & (uint64_t)(nh - 1);
        }
        if (table[h] < 0)
            table[h] = i;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (P->fwd[i] || is_source(n) || P->free_[i])
            continue;
        int found = -1;
        if (n->loc.line) {
            uint64_t h = loc_hash(&n->loc) & (uint64_t)(nh - 1);
            for (; table[h] >= 0; h = (h + 1) & (uint64_t)(nh - 1)) {
                const ptc_loc *a = &g->nodes[table[h]].loc;
                if (a->line == n->loc.line && a->col == n->loc.col &&
                    same_scope(a->scope, n->loc.scope)) {
                    found = P->unit[table[h]];
                    break;
                }
            }
        }
        if (found < 0) {
            int64_t best = -1;
            for (int k = 0; k < n->nin; k++) {
                int d = g->values[n->in[k]].def;
                const ptc_type *t = &g->values[n->in[k]].type;
                int64_t bytes = ptc_type_numel(t) * ptc_dtype_size(t->dtype);
                if (P->unit[d] >= 0 && bytes >= best) { /* ties: the last (a sum's new term) */
                    best = bytes;
                    found = P->unit[d];
                }
            }
        }
        P->unit[i] = found;
    }
    free(table);
}

static void find_free(pl *P)
{
    ptc_graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        bool f = !is_source(n);
        for (int k = 0; k < n->nin && f; k++) {
            const ptc_node *d = &g->nodes[g->values[n->in[k]].def];
            bool data = d->op == PTC_OP_INPUT && strncmp(d->attrs.name, "opt.", 4) != 0;
            f = (is_source(d) && !data) || P->free_[g->values[n->in[k]].def];
        }
        P->free_[i] = f;
    }
}

static int cmp_read(const void *a, const void *b)
{
    const int *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

static void unit_costs(pl *P)
{
    ptc_graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        int u = P->unit[i];
        if (u < 0)
            continue;
        ptc_type it[PTC_MAX_RESULTS * 2], ot[PTC_MAX_RESULTS];
        for (int k = 0; k < n->nin; k++)
            it[k] = g->values[n->in[k]].type;
        for (int k = 0; k < n->nout; k++)
            ot[k] = g->values[n->out[k]].type;
        P->units[u].cost += ptc_op_flops(n->op, &n->attrs, it, n->nin, ot, n->nout) +
                            ptc_op_bytes(it, n->nin, ot, n->nout) / 4;
    }
    /* The units reading each parameter, in node order. Its states (16 bytes a parameter: the
     * parameter, its gradient and Adam's moments) sit with its first forward reader (a free
     * node reading it - a cast, a slice - counts with its own first reader: free nodes have no
     * unit). Note the weights more than one unit reads. */
    int (*rd)[3] = NULL; /* (value, node, unit) of each forward read of a parameter */
    int nrd = 0, caprd = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (!P->fwd[i] || P->unit[i] < 0)
            continue;
        for (int k = 0; k < n->nin; k++) {
            int v = n->in[k];
            while (P->free_[g->values[v].def] && g->nodes[g->values[v].def].nin > 0)
                v = g->nodes[g->values[v].def].in[0];
            if (g->nodes[g->values[v].def].op != PTC_OP_PARAM)
                continue;
            if (nrd == caprd)
                rd = ptc_xrealloc(rd, sizeof *rd * (size_t)(caprd = caprd ? 2 * caprd : 64));
            rd[nrd][0] = v, rd[nrd][1] = i, rd[nrd][2] = P->unit[i];
            nrd++;
        }
    }
    if (nrd)
        qsort(rd, (size_t)nrd, sizeof *rd, cmp_read);
    P->readers = ptc_xmalloc(sizeof(int) * (size_t)(nrd ? nrd : 1));
    int nreaders = 0;
    for (int a = 0, b; a < nrd; a = b) {
        int n = 0;
        for (b = a; b < nrd && rd[b][0] == rd[a][0]; b++) {
            bool seen = false;
            for (int j = 0; j < n && !seen; j++)
                seen = P->readers[nreaders + j] == rd[b][2];
            if (!seen)
                P->readers[nreaders + n++] = rd[b][2];
        }
        const ptc_type *t = &g->values[rd[a][0]].type;
        P->units[P->readers[nreaders]].mem += (double)ptc_type_numel(t) * 16;
        if (n < 2)
            continue;
        P->shared = ptc_xrealloc(P->shared, sizeof *P->shared * (size_t)(P->nshared + 1));
        P->shared[P->nshared++] = (struct shared_w){
            .home = P->readers[nreaders],
            .bytes = (double)ptc_type_numel(t) * ptc_dtype_size(t->dtype),
            .first = nreaders,
            .n = n,
        };
        nreaders += n;
    }
    free(rd);
}

/* The activations each unit keeps for the backward, one microbatch's: forward results a node
 * outside the forward reads, unless recomputed (mark_recompute runs first). A value's type is the
 * whole step's (the partitioner places it over the axis mb), so a microbatch keeps a share. */
static void unit_activations(pl *P)
{
    ptc_graph *g = P->g;
    bool *kept = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), 1);
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (P->fwd[i])
            continue;
        for (int k = 0; k < n->nin; k++) {
            int d = g->values[n->in[k]].def;
            if (P->fwd[d] && P->unit[d] >= 0 && !g->nodes[d].recompute)
                kept[n->in[k]] = true;
        }
    }
    int m = P->o->microbatches > 1 ? P->o->microbatches : 1;
    for (int v = 0; v < g->nvalues; v++)
        if (kept[v]) {
            const ptc_type *t = &g->values[v].type;
            P->units[P->unit[g->values[v].def]].act +=
                (double)ptc_type_numel(t) * ptc_dtype_size(t->dtype) / m;
        }
    free(kept);
}

/* The microbatches whose activations stage s of S (pp ranks, S / pp chunks each) keeps at once:
 * every one under GPipe; at most pp - r on rank r = s mod pp under 1F1B (Narayanan et al. 2021);
 * pp on every rank under zero bubble's H1 (a microbatch's weight gradients wait for the bubbles);
 * under the interleaved schedule the rank's warm-up, (pp - r - 1) * 2 + (V - 1) * pp
 * chunk-forwards, and one more, over its V chunks. plan/schedule.c's simulation finds the same
 * counts (test_schedule holds them together). */
double ptc_pp_stage_inflight(ptc_pp_inflight rule, int microbatches, int pp, int S, int s)
{
    int m = microbatches > 1 ? microbatches : 1, r = s % pp, V = S / pp;
    int k = rule == PTC_INFLIGHT_ALL ? m : rule == PTC_INFLIGHT_PP ? pp : pp - r;
    if (V <= 1 || rule != PTC_INFLIGHT_1F1B)
        return k < m ? k : m;
    int n = (pp - r - 1) * 2 + (V - 1) * pp + 1;
    return (double)(n < V * m ? n : V * m) / V;
}

static double stage_inflight(const pl *P, int pp, int S, int s)
{
    return ptc_pp_stage_inflight(P->o->pp_inflight, P->o->microbatches, pp, S, s);
}

/* The accumulators a stage of units [v, u) holds for the weights it reads but does not hold
 * (none without microbatches: the one gradient is sent as it is made). */
static double shared_bytes(const pl *P, int v, int u)
{
    if (P->o->microbatches <= 1)
        return 0;
    double b = 0;
    for (int k = 0; k < P->nshared; k++) {
        const struct shared_w *w = &P->shared[k];
        if (w->home >= v && w->home < u)
            continue;
        for (int j = 0; j < w->n; j++)
            if (P->readers[w->first + j] >= v && P->readers[w->first + j] < u) {
                b += w->bytes;
                break;
            }
    }
    return b;
}

/* Contiguous cut of the units into S stages: first[s] is stage s's first unit. Minimises the
 * largest stage cost (the pipeline's throughput), then, among cuts whose stages all cost at most
 * 2% more than that, spreads compute and memory evenly: the least sum over stages of
 * (cost share + memory share)^2, a stage's memory its model states, the accumulators of the
 * gradients of the shared weights it reads but does not hold, and its activations times the
 * microbatches it keeps in flight (1F1B's first stage keeps pp of them, its last one). Every stage
 * gets at least one unit. Both are exact dynamic programs over (stages, units). */
static void balance(const pl *P, int pp, int S, int *first)
{
    int U = P->nunits;
    double *pc = ptc_xcalloc((size_t)U + 1, sizeof(double)),
           *pm = ptc_xcalloc((size_t)U + 1, sizeof(double)),
           *pa = ptc_xcalloc((size_t)U + 1, sizeof(double));
    for (int u = 0; u < U; u++) {
        pc[u + 1] = pc[u] + P->units[u].cost;
        pm[u + 1] = pm[u] + P->units[u].mem;
        pa[u + 1] = pa[u] + P->units[u].act;
    }
    double inflight = 0; /* the stages' mean: the activations' weight in the memory share */
    for (int s = 0; s < S; s++)
        inflight += stage_inflight(P, pp, S, s) / S;
    double tc = pc[U] > 0 ? pc[U] : 1, tm = pm[U] + pa[U] * inflight;
    tm = tm > 0 ? tm : 1;
    /* best[s][u]: the smallest largest-cost of cutting units [0, u) into s stages */
    size_t W = (size_t)U + 1;
    double *best = ptc_xmalloc(sizeof(double) * W * (size_t)(S + 1));
    for (size_t i = 0; i < W * (size_t)(S + 1); i++)
        best[i] = 1e300;
    best[0] = 0;
    for (int s = 1; s <= S; s++)
        for (int u = s; u <= U; u++)
            for (int v = s - 1; v < u; v++) {
                double c = best[(size_t)(s - 1) * W + (size_t)v], here = pc[u] - pc[v];
                double m = c > here ? c : here;
                if (m < best[(size_t)s * W + (size_t)u])
                    best[(size_t)s * W + (size_t)u] = m;
            }
    double bound = best[(size_t)S * W + (size_t)U] * 1.02 + 1e-9;
    /* the memory of a stage of units [v, u): its model states and its shared weights'
     * accumulators */
    double *mem = ptc_xmalloc(sizeof(double) * W * W);
    for (int v = 0; v < U; v++)
        for (int u = v + 1; u <= U; u++)
            mem[(size_t)v * W + (size_t)u] = pm[u] - pm[v] + shared_bytes(P, v, u);
    double *sq = ptc_xmalloc(sizeof(double) * W * (size_t)(S + 1));
    int *from = ptc_xmalloc(sizeof(int) * W * (size_t)(S + 1));
    for (size_t i = 0; i < W * (size_t)(S + 1); i++)
        sq[i] = 1e300, from[i] = -1;
    sq[0] = 0;
    for (int s = 1; s <= S; s++) {
        double inflight_s = stage_inflight(P, pp, S, s - 1);
        for (int u = s; u <= U; u++)
            for (int v = s - 1; v < u; v++) {
                double c = sq[(size_t)(s - 1) * W + (size_t)v];
                if (c >= 1e300 || pc[u] - pc[v] > bound)
                    continue;
                double mm = mem[(size_t)v * W + (size_t)u] + inflight_s * (pa[u] - pa[v]);
                double w = (pc[u] - pc[v]) / tc + mm / tm;
                if (c + w * w < sq[(size_t)s * W + (size_t)u]) {
                    sq[(size_t)s * W + (size_t)u] = c + w * w;
                    from[(size_t)s * W + (size_t)u] = v;
                }
            }
    }
    int u = U;
    for (int s = S; s >= 1; s--) {
        int v = from[(size_t)s * W + (size_t)u];
        PTC_ASSERT(v >= 0);
        first[s - 1] = v;
        u = v;
    }
    free(pc);
    free(pm);
    free(pa);
    free(mem);
    free(best);
    free(sq);
    free(from);
}

/* "h.3" of a unit, or "pre"/"post". */
static void unit_name(const pl *P, int u, char *buf, size_t n)
{
    if (u == 0)
        ptc_fmt(buf, n, "pre");
    else if (u == P->nunits - 1)
        ptc_fmt(buf, n, "post");
    else
        ptc_fmt(buf, n, "%.*s", (int)P->units[u].len, P->units[u].scope);
}

static void note(ptc_pass_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(ptc_pass_ctx *ctx, const char *fmt, ...)
{
    size_t len = strlen(ctx->notes);
    if (len + 2 >= sizeof ctx->notes)
        return;
    if (len)
        ctx->notes[len++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->notes + len, sizeof ctx->notes - len, fmt, ap);
    va_end(ap);
}

static int cut_stages(pl *P, ptc_pass_ctx *ctx, int pp, int S)
{
    const ptc_compile_opts *o = P->o;
    int nlayers = P->nunits > 2 ? P->nunits - 2 : 0;
    int *first = ptc_xmalloc(sizeof(int) * (size_t)(S + 1));
    if (o->nstage_layers) {
        if (o->nstage_layers != S) {
            ptc_fmt(ctx->err, ctx->errn,
                    "error: --stages gives %d stages; the plan has %d (pp x virtual stages)",
                    o->nstage_layers, S);
            free(first);
            return -1;
        }
        int sum = 0;
        for (int s = 0; s < S; s++) {
            if (o->stage_layers[s] == 0 && s > 0 && s < S - 1) {
                ptc_fmt(ctx->err, ctx->errn,
                        "error: --stages: stage %d has no layers (only the first and the last "
                        "stage may have none: they hold the embedding and the head)",
                        s);
                free(first);
                return -1;
            }
            first[s] = s == 0 ? 0 : 1 + sum;
            sum += o->stage_layers[s];
        }
        if (sum != nlayers) {
            ptc_fmt(ctx->err, ctx->errn,
                    "error: --stages gives %d layers; the model has %d (one per iteration of its "
                    "repeat)",
                    sum, nlayers);
            free(first);
            return -1;
        }
    } else {
        if (nlayers < 1) {
            ptc_fmt(ctx->err, ctx->errn,
                    "error: %d pipeline stages need layers to cut between: the model has no "
                    "repeat",
                    S);
            free(first);
            return -1;
        }
        if (P->nunits < S) {
            ptc_fmt(ctx->err, ctx->errn,
                    "error: %d pipeline stages need at least %d layers (the model has %d, plus "
                    "what comes before and after them)",
                    S, S - 2 > 0 ? S - 2 : 0, nlayers);
            free(first);
            return -1;
        }
        balance(P, pp, S, first);
    }
    first[S] = P->nunits;
    int *stage_of = ptc_xmalloc(sizeof(int) * (size_t)P->nunits);
    for (int s = 0; s < S; s++)
        for (int u = first[s]; u < first[s + 1]; u++)
            stage_of[u] = s;
    for (int i = 0; i < P->g->nnodes; i++)
        P->g->nodes[i].stage = P->unit[i] >= 0 ? stage_of[P->unit[i]] : 0;

    double total = 0;
    for (int u = 0; u < P->nunits; u++)
        total += P->units[u].cost;
    char line[1024];
    size_t len = 0;
    len += (size_t)snprintf(line, sizeof line, "pipeline: %d %sstages %s:", S,
                            o->virtual_stages > 1 ? "virtual " : "",
                            o->nstage_layers ? "as --stages asks" : "cut to balance compute, then memory");
    for (int s = 0; s < S; s++) {
        double c = 0;
        for (int u = first[s]; u < first[s + 1]; u++)
            c += P->units[u].cost;
        char a[64], b[64];
        int lo = first[s], hi = first[s + 1] - 1;
        unit_name(P, lo, a, sizeof a);
        unit_name(P, hi, b, sizeof b);
        if (len >= sizeof line)
            break;
        len += (size_t)snprintf(line + len, sizeof line - len, " %d [%s%s%s] %.0f%%%s", s, a,
                                lo == hi ? "" : "..", lo == hi ? "" : b,
                                100.0 * c / (total > 0 ? total : 1), s + 1 < S ? "," : "");
    }
    free(first);
    free(stage_of);
    note(ctx, "%s", line);
    return 0;
}

/* The recompute policy of layer unit u: the global one, then the last --recompute-layer pin
 * matching its name. */
static int policy_of(const pl *P, int u)
{
    int pol = P->o->recompute;
    char name[256];
    unit_name(P, u, name, sizeof name);
    for (int i = 0; i < P->o->nrecompute_pins; i++)
        if (ptc_glob_match(P->o->recompute_pins[i].pattern, name))
            pol = P->o->recompute_pins[i].policy;
    return pol;
}

static void mark_recompute(pl *P, ptc_pass_ctx *ctx)
{
    ptc_graph *g = P->g;
    int *pol = ptc_xmalloc(sizeof(int) * (size_t)P->nunits);
    int counts[3] = {0, 0, 0};
    for (int u = 0; u < P->nunits; u++) {
        pol[u] = u == 0 || u == P->nunits - 1 ? PTC_RECOMPUTE_NONE : policy_of(P, u);
        if (u > 0 && u < P->nunits - 1)
            counts[pol[u]]++;
    }
    /* a forward result read outside its layer (or the loss) is kept */
    bool *leaves = ptc_xcalloc((size_t)(g->nvalues ? g->nvalues : 1), 1);
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int d = g->values[n->in[k]].def;
            if (P->fwd[d] && P->unit[d] >= 0 && P->fwd[i] && P->unit[i] != P->unit[d])
                leaves[n->in[k]] = true;
        }
    }
    if (g->loss >= 0)
        leaves[g->loss] = true;
    for (int i = 0; i < g->nnodes; i++) {
        ptc_node *n = &g->nodes[i];
        if (!P->fwd[i] || P->unit[i] < 0 || P->free_[i])
            continue;
        int p = pol[P->unit[i]];
        bool leaving = false;
        for (int k = 0; k < n->nout; k++)
            leaving |= leaves[n->out[k]];
        if (p == PTC_RECOMPUTE_FULL && !leaving)
            n->recompute = true;
        else if (p == PTC_RECOMPUTE_SELECTIVE &&
                 (n->op == PTC_OP_ATTENTION || n->op == PTC_OP_ATTENTION_SHARD) && !leaving)
            n->recompute = true;
    }
    if (counts[PTC_RECOMPUTE_FULL] || counts[PTC_RECOMPUTE_SELECTIVE])
        note(ctx,
             "recompute: %d layer%s full (only the layer input kept), %d selective (the "
             "attention output rebuilt from q, k, v), %d none",
             counts[2], counts[2] == 1 ? "" : "s", counts[1], counts[0]);
    free(leaves);
    free(pol);
}

/* ---- gradients of weights used on more than one stage ----
 *
 * The gradient of a weight used on several stages (GPT-2's embedding, tied to the head on the
 * last stage) is a sum of the stages' contributions. With microbatches the partitioner makes it
 * allreduce_mb(c_1 + c_2 + ...), every c_k made each microbatch on its own stage, so the stage of
 * the sum would receive the other stages' contributions once a microbatch. Instead each stage sums
 * its own contributions over the microbatches (an allreduce over mb on that stage, which the
 * lowering runs as accumulation), and the totals meet once a step: the sum over the microbatches
 * of a sum is the sum of the sums over the microbatches. What is sent between the stages drops
 * m-fold; the cost is an accumulator of the weight's size on each other stage that contributes
 * (Megatron-LM's choice too: each stage's copy of the embedding has its own gradient, all-reduced
 * once a step). The totals round differently: each stage's microbatches first, then the stages. */

typedef struct tied {
    ptc_graph *g;
    int *uses;  /* value -> uses (operands, the loss, outputs, updates) */
    int *terms; /* the terms of every rewritten sum, in order */
    int nterms, capterms;
    int *adds; /* the inner adds of the sum being read */
    int nadds, capadds;
} tied;

static bool same_place(const ptc_graph *g, int a, int b)
{
    return memcmp(g->values[a].place, g->values[b].place,
                  sizeof(ptc_placement) * (size_t)g->mesh.naxes) == 0;
}

/* The terms of the sum v (an add tree whose inner adds have no other use), in order, appended to
 * T->terms, its adds to T->adds; false when a term is placed unlike the sum. */
static bool sum_terms(tied *T, int root, int v, int depth)
{
    const ptc_graph *g = T->g;
    int d = g->values[v].def;
    if (!same_place(g, v, root))
        return false;
    if (g->nodes[d].op == PTC_OP_ADD && depth < 256 && (v == root || T->uses[v] == 1)) {
        PTC_GROW(T->adds, T->capadds, T->nadds);
        T->adds[T->nadds++] = d;
        return sum_terms(T, root, g->nodes[d].in[0], depth + 1) &&
               sum_terms(T, root, g->nodes[d].in[1], depth + 1);
    }
    PTC_GROW(T->terms, T->capterms, T->nterms);
    T->terms[T->nterms++] = v;
    return true;
}

static void mib(char *buf, size_t n, double bytes)
{
    if (bytes >= 1 << 30)
        snprintf(buf, n, "%.2f GiB", bytes / (1 << 30));
    else if (bytes >= 1 << 20)
        snprintf(buf, n, "%.2f MiB", bytes / (1 << 20));
    else
        snprintf(buf, n, "%.2f KiB", bytes / (1 << 10));
}

/* The name of the parameter declared at loc (a gradient's collectives carry its location). */
static const char *param_at(const ptc_graph *g, ptc_loc loc)
{
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        if (n->op == PTC_OP_PARAM && n->loc.line == loc.line && n->loc.col == loc.col)
            return n->attrs.name;
    }
    return NULL;
}

/* b = op(in...) in out at stage s, placed as value `like` of g. */
static int build_at(ptc_graph *out, const ptc_graph *g, ptc_op op, const int *in, int nin,
                    const ptc_attrs *at, const ptc_node *n, int s, int like, bool *failed,
                    ptc_pass_ctx *ctx)
{
    int r[PTC_MAX_RESULTS];
    ptc_pass_build(out, "the pipeline pass", op, in, nin, at, n->loc, r, failed, ctx->err,
                   ctx->errn);
    if (*failed)
        return -1;
    out->nodes[out->nnodes - 1].stage = s;
    memcpy(out->values[r[0]].place, g->values[like].place, sizeof out->values[r[0]].place);
    return r[0];
}

/* The rewritten sum of allreduce node n over its terms: per stage, in the order the stages first
 * appear, the stage's terms added in order and reduced over mb there; then the stages' totals
 * added in that order on n's stage. */
static int emit_tied(ptc_graph *out, const ptc_graph *g, const ptc_node *n, const int *terms,
                     int nterms, const int *vmap, bool *failed, ptc_pass_ctx *ctx)
{
    int v = n->in[0], total = -1;
    uint8_t *done = ptc_xcalloc((size_t)nterms, 1);
    for (int k = 0; k < nterms; k++) {
        if (done[k])
            continue;
        int s = g->nodes[g->values[terms[k]].def].stage, sum = vmap[terms[k]];
        for (int j = k + 1; j < nterms; j++)
            if (!done[j] && g->nodes[g->values[terms[j]].def].stage == s) {
                done[j] = 1;
                sum = build_at(out, g, PTC_OP_ADD, (int[]){sum, vmap[terms[j]]}, 2, NULL, n, s, v,
                               failed, ctx);
            }
        int red =
            build_at(out, g, PTC_OP_ALLREDUCE, &sum, 1, &n->attrs, n, s, n->out[0], failed, ctx);
        total = total < 0 ? red
                          : build_at(out, g, PTC_OP_ADD, (int[]){total, red}, 2, NULL, n, n->stage,
                                     n->out[0], failed, ctx);
    }
    free(done);
    return total;
}

static int split_tied_sums(ptc_pass_ctx *ctx, int pp)
{
    ptc_graph *g = ctx->g;
    int mb = -1;
    for (int a = 0; a < g->mesh.naxes; a++)
        if (strcmp(g->mesh.names[a], "mb") == 0 && g->mesh.sizes[a] > 1)
            mb = a;
    if (mb < 0)
        return 0;
    tied T = {.g = g};
    size_t nv = (size_t)(g->nvalues ? g->nvalues : 1), nn = (size_t)(g->nnodes ? g->nnodes : 1);
    T.uses = ptc_xcalloc(nv, sizeof(int));
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            T.uses[g->nodes[i].in[k]]++;
    if (g->loss >= 0)
        T.uses[g->loss]++;
    for (int i = 0; i < g->noutputs; i++)
        T.uses[g->outputs[i]]++;
    for (int i = 0; i < g->nupdates; i++)
        T.uses[g->updates[i].to]++;

    /* first[i] >= 0: allreduce node i is rewritten over terms [first[i], first[i] + count[i]) */
    int *first = ptc_xmalloc(sizeof(int) * nn), *count = ptc_xcalloc(nn, sizeof(int));
    uint8_t *gone = ptc_xcalloc(nn, 1);
    int nsums = 0, M = g->mesh.sizes[mb];
    double saved = 0;
    char names[256] = "";
    size_t nlen = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *n = &g->nodes[i];
        first[i] = -1;
        if (n->op != PTC_OP_ALLREDUCE || n->attrs.reduce != 0 || n->attrs.mesh_axis != mb ||
            n->attrs.mesh_axis2 >= 0 || g->nodes[g->values[n->in[0]].def].op != PTC_OP_ADD ||
            T.uses[n->in[0]] != 1)
            continue;
        int t0 = T.nterms, rank = n->stage % pp;
        T.nadds = 0;
        bool ok = sum_terms(&T, n->in[0], n->in[0], 0) &&
                  g->nodes[g->values[n->in[0]].def].stage % pp == rank;
        /* sent a step: each operand of the sum's adds made on another rank than its add, once
         * a microbatch; after the rewrite, once each stage's total on another rank than n */
        const ptc_type *tv = &g->values[n->in[0]].type;
        double bytes = (double)ptc_type_numel(tv) * ptc_dtype_size(tv->dtype), before = 0,
               after = 0;
        for (int k = 0; ok && k < T.nadds; k++) {
            const ptc_node *d = &g->nodes[T.adds[k]];
            for (int j = 0; j < 2; j++)
                before += g->nodes[g->values[d->in[j]].def].stage % pp != d->stage % pp
                              ? bytes * M
                              : 0;
        }
        for (int k = t0; ok && k < T.nterms; k++) {
            int s = g->nodes[g->values[T.terms[k]].def].stage, seen = 0;
            for (int j = t0; j < k; j++)
                seen |= g->nodes[g->values[T.terms[j]].def].stage == s;
            after += s % pp != rank && !seen ? bytes : 0;
        }
        if (!ok || after >= before) {
            T.nterms = t0;
            continue;
        }
        first[i] = t0;
        count[i] = T.nterms - t0;
        for (int k = 0; k < T.nadds; k++)
            gone[T.adds[k]] = 1;
        saved += before - after;
        const char *name = param_at(g, n->loc);
        char size[32];
        mib(size, sizeof size, bytes);
        if (nlen < sizeof names)
            nlen += (size_t)snprintf(names + nlen, sizeof names - nlen, "%s%s (%s)",
                                     nsums ? ", " : "", name ? name : "?", size);
        nsums++;
    }
    int rc = 0;
    if (nsums) {
        ptc_graph *out = ptc_pass_graph_like(g);
        int *vmap = ptc_xmalloc(sizeof(int) * nv);
        bool failed = false;
        for (int i = 0; i < g->nnodes && !failed; i++) {
            const ptc_node *n = &g->nodes[i];
            if (gone[i])
                continue;
            if (first[i] >= 0) {
                vmap[n->out[0]] =
                    emit_tied(out, g, n, T.terms + first[i], count[i], vmap, &failed, ctx);
                continue;
            }
            ptc_pass_copy_mapped(out, g, "the pipeline pass", n, vmap, &failed, ctx->err,
                                 ctx->errn);
        }
        if (!failed) {
            ptc_pass_map_ends(out, g, vmap);
            ptc_graph_free(g);
            ctx->g = out;
            char less[32];
            mib(less, sizeof less, saved);
            note(ctx,
                 "pipeline: the gradient%s of %s, used on more than one stage, summed over the "
                 "%d microbatches on each stage and sent once a step: %s less sent a step, for "
                 "an accumulator of %s on each stage that sends it",
                 nsums > 1 ? "s" : "", names, M, less, nsums > 1 ? "each's size" : "its size");
        } else {
            ptc_graph_free(out);
            rc = -1;
        }
        free(vmap);
    }
    free(first);
    free(count);
    free(gone);
    free(T.uses);
    free(T.terms);
    free(T.adds);
    return rc;
}

int ptc_pass_pipeline(ptc_pass_ctx *ctx)
{
    const ptc_compile_opts *o = ctx->opts;
    int pp = 1;
    for (int a = 0; a < o->mesh.naxes; a++)
        if (strcmp(o->mesh.names[a], "pp") == 0)
            pp = o->mesh.sizes[a];
    int V = o->virtual_stages > 1 ? o->virtual_stages : 1;
    int S = pp * V;
    bool recompute = o->recompute != PTC_RECOMPUTE_NONE || o->nrecompute_pins;
    if (S <= 1 && !recompute && !o->nstage_layers)
        return 0;
    if (o->nstage_layers && S <= 1) {
        ptc_fmt(ctx->err, ctx->errn, "error: --stages needs a pipeline (--mesh pp=N)");
        return -1;
    }
    ptc_graph *g = ctx->g;
    size_t nn = (size_t)(g->nnodes ? g->nnodes : 1);
    pl P = {.g = g, .o = o};
    P.fwd = ptc_xcalloc(nn, 1);
    P.free_ = ptc_xcalloc(nn, 1);
    P.unit = ptc_xmalloc(sizeof(int) * nn);
    find_forward(&P);
    find_free(&P);
    find_units(&P);
    unit_costs(&P);
    int rc = 0;
    if (recompute) /* first: what is recomputed is not kept, which the cut weighs */
        mark_recompute(&P, ctx);
    if (S > 1) {
        unit_activations(&P);
        rc = cut_stages(&P, ctx, pp, S);
    }
    free(P.fwd);
    free(P.free_);
    free(P.unit);
    free(P.units);
    free(P.shared);
    free(P.readers);
    if (rc == 0 && S > 1)
        rc = split_tied_sums(ctx, pp);
    return rc;
}
