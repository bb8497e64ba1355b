/* text.c - the plan's text form: what `ptc --emit program` prints and executables carry.
 *
 *   plan "gpt2_tiny"
 *   ranks 4
 *   mesh dp=2,tp=2
 *   source "examples/gpt2_tiny.ptm"
 *   optimizer adamw(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.1)
 *   zero 1
 *   seq_parallel false
 *   parameters 1234567
 *   program 0 ranks [0,1,2,3]
 *   regions param=4096 grad=4096 optim=8192 act=65536 comm=0
 *   b0 = param f32[64,32]<R,S0> param:0 {name="wte", init=normal(0.02)}
 *   b1 = input i32[4,16]<S0> act:0 {name="tokens", role=tokens, bound=64}
 *   b2 = temp f32[4,16,32]<S0> act:256
 *   b3 = view b2 f32[64,32]<S0>
 *   i0 = kernel embedding_shard b0, b1 -> b2 {mesh_axis=1, group=2} forward @12:9 "h.0"
 *   i1 = gemm b3, b4 -> b5 {ta=false, tb=true, m=64, n=32, k=32, ...} forward @14:5
 *   i2 = allreduce b5 -> b6 {group=tp, reduce=sum, count=2048} forward @14:5
 *   i3 = copy b7 -> b0 {bytes=8192} update
 *   i4 = fused f0_add_gelu b5, b8 -> b5, b9 forward @20:5 "h.0.mlp"
 *   loss b9
 *   grad_norm b10
 *   outputs b11, b12
 *   eval 0:7, 9
 *   end
 *
 * The kernels of fused instructions come before the first program, in the kernel IR's text form
 * (codegen/kir.h), in the order of the plan's table. Buffers and instructions are numbered densely, in order; the loader checks the numbers, reads
 * everything back through the same pieces (ir/text.c) and verifies the plan.
 */
#include <stdlib.h>
#include <string.h>

#include "kir.h"
#include "program.h"
#include "schedule.h"
#include "text.h"

static const char *const kind_names[] = {"temp", "input", "param", "state"};
static const char *const instr_names[PTC_NINSTR_KINDS] = {"kernel", "gemm", "",     "send",
                                                          "recv",   "copy", "fused"};

/* ---- printing ---- */

static void put_buffer(FILE *f, const ptc_plan *p, const ptc_program *pg, int b)
{
    const ptc_buffer *bf = &pg->bufs[b];
    fprintf(f, "b%d = ", b);
    if (bf->view >= 0) {
        fprintf(f, "view b%d ", bf->view);
        if (bf->view_axis >= 0)
            fprintf(f, "+%s*%lld ", p->mesh.names[bf->view_axis], (long long)bf->view_step);
        if (bf->view_offset)
            fprintf(f, "at %lld ", (long long)bf->view_offset);
        ptc_put_type(f, &bf->type, bf->place);
        fputc('\n', f);
        return;
    }
    fprintf(f, "%s ", kind_names[bf->kind]);
    ptc_put_type(f, &bf->type, bf->place);
    fprintf(f, " %s:%lld", ptc_region_name(bf->region), (long long)bf->offset);
    int k = 0;
    if (bf->name) {
        fputs(" {name=", f);
        ptc_put_string(f, bf->name);
        k++;
    }
    if (bf->kind == PTC_BUF_PARAM || bf->kind == PTC_BUF_STATE) {
        ptc_attrs a = {.init = bf->init};
        fputs(k++ ? ", " : " {", f);
        ptc_put_attr(f, &a, PTC_A_INIT);
    }
    if (bf->kind == PTC_BUF_INPUT)
        fprintf(f, "%srole=%s", k++ ? ", " : " {", ptc_role_name(bf->role));
    if (bf->bound)
        fprintf(f, "%sbound=%lld", k++ ? ", " : " {", (long long)bf->bound);
    fputs(k ? "}\n" : "\n", f);
}

static void put_operands(FILE *f, const int *ids, int n)
{
    for (int i = 0; i < n; i++)
        fprintf(f, "%sb%d", i ? ", " : " ", ids[i]);
}

static void put_gemm(FILE *f, const ptc_gemm *g)
{
    fprintf(f,
            " {ta=%s, tb=%s, m=%lld, n=%lld, k=%lld, batch=%lld, lda=%lld, ldb=%lld, ldc=%lld, "
            "sa=%lld, sb=%lld, sc=%lld, alpha=",
            g->ta ? "true" : "false", g->tb ? "true" : "false", (long long)g->m, (long long)g->n,
            (long long)g->k, (long long)g->batch, (long long)g->lda, (long long)g->ldb,
            (long long)g->ldc, (long long)g->sa, (long long)g->sb, (long long)g->sc);
    ptc_put_double(f, g->alpha);
    fputs(", beta=", f);
    ptc_put_double(f, g->beta);
    if (g->ab != PTC_F32)
        fprintf(f, ", ab=%s", ptc_dtype_name((ptc_dtype)g->ab));
    if (g->cd != PTC_F32)
        fprintf(f, ", c=%s", ptc_dtype_name((ptc_dtype)g->cd));
    fputc('}', f);
}

static void put_coll(FILE *f, const ptc_mesh *m, const ptc_coll *c)
{
    char group[64];
    ptc_plan_group_name(m, c->axes, group, sizeof group);
    fprintf(f, " {group=%s", group);
    if (c->kind == PTC_COLL_ALLREDUCE || c->kind == PTC_COLL_REDUCE_SCATTER)
        fprintf(f, ", reduce=%s", c->reduce ? "max" : "sum");
    if (c->kind == PTC_COLL_ALLREDUCE)
        fprintf(f, ", count=%lld}", (long long)c->count);
    else if (c->kind == PTC_COLL_ALL_TO_ALL_V)
        fprintf(f, ", experts=%lld, row=%lld, back=%lld", (long long)c->count, (long long)c->chunk,
                (long long)c->outer);
    else
        fprintf(f, ", outer=%lld, chunk=%lld", (long long)c->outer, (long long)c->chunk);
    if (c->kind == PTC_COLL_ALL_TO_ALL)
        fprintf(f, ", outer2=%lld, chunk2=%lld", (long long)c->outer2, (long long)c->chunk2);
    if (c->kind != PTC_COLL_ALLREDUCE)
        fputc('}', f);
}

static void put_instr(FILE *f, const ptc_plan *p, const ptc_instr *in, int i)
{
    fprintf(f, "i%d = ", i);
    if (in->kind == PTC_INSTR_COLL)
        fputs(ptc_coll_name(in->coll.kind), f);
    else
        fputs(instr_names[in->kind], f);
    if (in->kind == PTC_INSTR_KERNEL)
        fprintf(f, " %s", ptc_ops[in->op].name);
    if (in->kind == PTC_INSTR_FUSED)
        fprintf(f, " %s", p->kernels[in->kernel]->name);
    put_operands(f, in->in, in->nin);
    if (in->nout) {
        fputs(" ->", f);
        put_operands(f, in->out, in->nout);
    }
    switch (in->kind) {
    case PTC_INSTR_KERNEL:
        if (ptc_put_attrs(f, in->op, &in->attrs))
            fputc('}', f);
        break;
    case PTC_INSTR_GEMM: put_gemm(f, &in->gemm); break;
    case PTC_INSTR_COLL: put_coll(f, &p->mesh, &in->coll); break;
    case PTC_INSTR_COPY: fprintf(f, " {bytes=%lld}", (long long)in->bytes); break;
    case PTC_INSTR_FUSED: break;
    default: /* send, recv */
        fprintf(f, " {peer=%s%+d}", p->mesh.names[in->peer_axis], in->peer_delta);
    }
    fprintf(f, " %s", ptc_phase_name(in->phase));
    /* [F mb=2 vs=1 rc coord=3 tag=12]: what pipeline work it belongs to */
    int w = 0;
    if (in->work != PTC_WORK_STEP) {
        fprintf(f, " [%s mb=%d", ptc_work_name(in->work), in->mb);
        w++;
        if (in->vstage)
            fprintf(f, " vs=%d", in->vstage);
    }
    if (in->recompute)
        fprintf(f, "%src", w++ ? " " : " [");
    if (in->has_coord)
        fprintf(f, "%scoord=%d", w++ ? " " : " [", in->coord);
    if (in->kind == PTC_INSTR_SEND || in->kind == PTC_INSTR_RECV)
        fprintf(f, "%stag=%d", w++ ? " " : " [", in->tag);
    if (w)
        fputc(']', f);
    if (in->loc.line)
        fprintf(f, " @%d:%d", in->loc.line, in->loc.col);
    if (in->loc.scope && *in->loc.scope) {
        fputc(' ', f);
        ptc_put_string(f, in->loc.scope);
    }
    fputc('\n', f);
}

/* 0:7, 9, 12:13 (inclusive ranges) */
static void put_ranges(FILE *f, const int *v, int n)
{
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1)
            j++;
        fprintf(f, "%s%d", i ? ", " : " ", v[i]);
        if (j > i)
            fprintf(f, ":%d", v[j]);
        i = j + 1;
    }
}

void ptc_plan_print_program(const ptc_plan *p, int k, FILE *f)
{
    const ptc_program *pg = &p->programs[k];
    fprintf(f, "program %d ranks ", k);
    fputc('[', f);
    for (int r = 0; r < pg->nranks; r++)
        fprintf(f, "%s%d", r ? "," : "", pg->ranks[r]);
    fputs("]\n", f);
    if (pg->stage)
        fprintf(f, "stage %d\n", pg->stage);
    fputs("regions", f);
    for (int r = 0; r < PTC_NREGIONS; r++)
        fprintf(f, " %s=%lld", ptc_region_name(r), (long long)pg->region_bytes[r]);
    fputc('\n', f);
    for (int b = 0; b < pg->nbufs; b++)
        put_buffer(f, p, pg, b);
    for (int i = 0; i < pg->ninstrs; i++)
        put_instr(f, p, &pg->instrs[i], i);
    if (pg->loss >= 0)
        fprintf(f, "loss b%d\n", pg->loss);
    if (pg->grad_norm >= 0)
        fprintf(f, "grad_norm b%d\n", pg->grad_norm);
    if (pg->nstats) {
        fputs("stats", f);
        put_operands(f, pg->stats, pg->nstats);
        fputc('\n', f);
    }
    if (pg->noutputs) {
        fputs("outputs", f);
        put_operands(f, pg->outputs, pg->noutputs);
        fputc('\n', f);
    }
    if (pg->neval) {
        fputs("eval", f);
        put_ranges(f, pg->eval, pg->neval);
        fputc('\n', f);
    }
    fputs("end\n", f);
}

void ptc_plan_print(const ptc_plan *p, FILE *f)
{
    fputs("plan ", f);
    ptc_put_string(f, p->model);
    fprintf(f, "\nranks %d\n", p->nranks);
    if (p->mesh.naxes) {
        fputs("mesh ", f);
        ptc_put_mesh(f, &p->mesh);
        fputc('\n', f);
    }
    const char *src = NULL;
    for (int k = 0; k < p->nprograms && !src; k++)
        for (int i = 0; i < p->programs[k].ninstrs && !src; i++)
            src = p->programs[k].instrs[i].loc.file;
    if (src) {
        fputs("source ", f);
        ptc_put_string(f, src);
        fputc('\n', f);
    }
    fputs("optimizer ", f);
    ptc_put_optim(f, &p->optim);
    fprintf(f, "\nzero %d\nseq_parallel %s\nparameters %lld\n", p->zero,
            p->seq_parallel ? "true" : "false", (long long)p->logical_params);
    if (p->model_flops > 0)
        fprintf(f, "model_flops %.17g\n", p->model_flops);
    bool pipelined = p->microbatches > 1;
    for (int a = 0; a < p->mesh.naxes; a++)
        pipelined |= strcmp(p->mesh.names[a], "pp") == 0;
    if (pipelined)
        fprintf(f, "schedule \"%s\" microbatches %d virtual_stages %d\n",
                ptc_pp_schedule_name(p->pp_schedule), p->microbatches, p->virtual_stages);
    if (p->notes && *p->notes) {
        fputs("notes ", f);
        ptc_put_string(f, p->notes);
        fputc('\n', f);
    }
    for (int k = 0; k < p->nkernels; k++)
        ptc_kir_print(p->kernels[k], f);
    for (int k = 0; k < p->nprograms; k++)
        ptc_plan_print_program(p, k, f);
    if (p->sample) {
        fputs("sample\n", f);
        ptc_plan_print(p->sample, f);
    } else if (p->no_sample) {
        fputs("no_sample ", f);
        ptc_put_string(f, p->no_sample);
        fputc('\n', f);
    }
}

/* ---- loading ---- */

typedef struct loader {
    ptc_lexer lx;
    ptc_plan *p;
    ptc_program *pg;
    const char *file;
} loader;

static int64_t lex_count(loader *ld, int64_t lo, int64_t hi, const char *what)
{
    int64_t v = ptc_lex_int(&ld->lx);
    if (!ld->lx.failed && (v < lo || v > hi))
        ptc_lex_fail(&ld->lx, "%s out of range", what);
    return v;
}

/* b12 (a buffer of the program) or i12 (an instruction): the number. */
static int lex_ref(loader *ld, char prefix, int limit)
{
    ptc_lexer *lx = &ld->lx;
    char *end;
    long v = -1;
    if (lx->kind == PTC_T_IDENT && lx->text[0] == prefix)
        v = strtol(lx->text + 1, &end, 10);
    if (v < 0 || v >= limit || lx->text[1] == 0 || *end) {
        char msg[64];
        snprintf(msg, sizeof msg, "expected %c<number> below %d, got '%%s'", prefix, limit);
        ptc_lex_fail(lx, msg, lx->text);
        return -1;
    }
    ptc_lex_next(lx);
    return (int)v;
}

static int lex_word(loader *ld, const char *const *names, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (names[i] && names[i][0] && ptc_lex_ident(&ld->lx, names[i])) {
            ptc_lex_next(&ld->lx);
            return i;
        }
    ptc_lex_fail(&ld->lx, what, ld->lx.text);
    return 0;
}

static bool buffer_attr(void *ctx, ptc_lexer *lx, const char *key)
{
    loader *ld = ctx;
    ptc_buffer *bf = &ld->pg->bufs[ld->pg->nbufs - 1];
    if (strcmp(key, "name") == 0) {
        bf->name = ptc_lex_string(lx, ld->p->arena);
    } else if (strcmp(key, "init") == 0) {
        ptc_attrs a = {0};
        ptc_lex_attr_value(lx, PTC_A_INIT, &a, ld->p->arena);
        bf->init = a.init;
    } else if (strcmp(key, "role") == 0) {
        static const char *const roles[PTC_NROLES] = {"none", "tokens",   "targets", "lr",
                                                      "step", "max_norm", "loss_scale", "data"};
        bf->role = (uint8_t)lex_word(ld, roles, PTC_NROLES, "unknown input role '%s'");
    } else if (strcmp(key, "bound") == 0) {
        bf->bound = lex_count(ld, 0, INT32_MAX, "bound");
    } else {
        return false;
    }
    return true;
}

/* A mesh axis by name: its index, or -1 after an error. */
static int lex_axis(ptc_lexer *lx, const ptc_mesh *m)
{
    for (int a = 0; a < m->naxes; a++)
        if (ptc_lex_ident(lx, m->names[a])) {
            ptc_lex_next(lx);
            return a;
        }
    ptc_lex_fail(lx, "no mesh axis named '%.200s'", lx->text);
    return -1;
}

static void load_buffer(loader *ld)
{
    ptc_lexer *lx = &ld->lx;
    ptc_program *pg = ld->pg;
    int id = lex_ref(ld, 'b', pg->nbufs + 1);
    if (!lx->failed && id != pg->nbufs)
        ptc_lex_fail(lx, "buffers must be numbered in order (b%s expected)", "next");
    ptc_lex_expect(lx, '=');
    ptc_buffer b;
    memset(&b, 0, sizeof b);
    b.view = b.view_axis = -1;
    if (ptc_lex_ident(lx, "view")) {
        ptc_lex_next(lx);
        b.view = lex_ref(ld, 'b', pg->nbufs);
        if (ptc_lex_punct(lx, '+')) { /* a rank's shard: +AXIS*STEP bytes into the root */
            ptc_lex_next(lx);
            b.view_axis = lex_axis(lx, &ld->p->mesh);
            ptc_lex_expect(lx, '*');
            b.view_step = lex_count(ld, 0, INT64_MAX / 2, "view step");
        }
        if (ptc_lex_ident(lx, "at")) { /* at BYTES into the root */
            ptc_lex_next(lx);
            b.view_offset = lex_count(ld, 1, INT64_MAX / 2, "view offset");
        }
        ptc_lex_type(lx, &b.type, b.place);
    } else {
        b.kind = (uint8_t)lex_word(ld, kind_names, 4, "unknown buffer kind '%s'");
        ptc_lex_type(lx, &b.type, b.place);
        static const char *const regions[PTC_NREGIONS] = {"param", "grad", "optim", "act",
                                                          "comm"};
        b.region = (uint8_t)lex_word(ld, regions, PTC_NREGIONS, "unknown region '%s'");
        ptc_lex_expect(lx, ':');
        b.offset = lex_count(ld, 0, INT64_MAX / 2, "offset");
    }
    if (lx->failed)
        return;
    if (b.view >= 0) {
        b.region = pg->bufs[b.view].region;
        b.offset = pg->bufs[b.view].offset;
    }
    int64_t numel = 1;
    for (int d = 0; d < b.type.rank && numel >= 0; d++)
        if (b.type.dims[d] < 0 || !ptc_mul_ok(numel, b.type.dims[d], &numel))
            numel = -1;
    if (numel < 0 || !ptc_mul_ok(numel, ptc_dtype_size(b.type.dtype), &b.bytes)) {
        ptc_lex_fail(lx, "buffer size out of range%s", "");
        return;
    }
    ptc_prog_add_buffer(ld->p, pg, &b);
    if (ptc_lex_punct(lx, '{'))
        ptc_lex_attrs(lx, PTC_OP_ADD, &(ptc_attrs){0}, ld->p->arena, buffer_attr, ld);
}

typedef struct instr_ctx {
    loader *ld;
    ptc_instr *in;
} instr_ctx;

/* key=integer for one of n named int64 fields: true when key is one of them. */
static bool int_field(ptc_lexer *lx, const char *key, const char *const *names,
                      int64_t *const *slots, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(key, names[i]) == 0) {
            *slots[i] = ptc_lex_int(lx);
            return true;
        }
    return false;
}

static bool gemm_attr(void *ctx, ptc_lexer *lx, const char *key)
{
    ptc_gemm *g = &((instr_ctx *)ctx)->in->gemm;
    if (strcmp(key, "ta") == 0 || strcmp(key, "tb") == 0) {
        bool v = ptc_lex_ident(lx, "true");
        if (!v && !ptc_lex_ident(lx, "false"))
            ptc_lex_fail(lx, "expected true or false, got '%.200s'", lx->text);
        ptc_lex_next(lx);
        *(key[1] == 'a' ? &g->ta : &g->tb) = v;
        return true;
    }
    if (strcmp(key, "alpha") == 0 || strcmp(key, "beta") == 0) {
        *(key[0] == 'a' ? &g->alpha : &g->beta) = ptc_lex_number(lx);
        return true;
    }
    if (strcmp(key, "ab") == 0 || strcmp(key, "c") == 0) {
        if (!ptc_lex_ident(lx, "bf16") && !ptc_lex_ident(lx, "f16") && !ptc_lex_ident(lx, "f32"))
            ptc_lex_fail(lx, "expected f32, bf16 or f16, got '%.200s'", lx->text);
        *(key[0] == 'a' ? &g->ab : &g->cd) = ptc_lex_ident(lx, "bf16")  ? PTC_BF16
                                             : ptc_lex_ident(lx, "f16") ? PTC_F16
                                                                        : PTC_F32;
        ptc_lex_next(lx);
        return true;
    }
    static const char *const names[] = {"m", "n", "k", "batch", "lda", "ldb", "ldc", "sa", "sb",
                                        "sc"};
    int64_t *const slots[] = {&g->m,   &g->n,   &g->k,  &g->batch, &g->lda,
                              &g->ldb, &g->ldc, &g->sa, &g->sb,    &g->sc};
    return int_field(lx, key, names, slots, 10);
}

static bool coll_attr(void *ctx, ptc_lexer *lx, const char *key)
{
    instr_ctx *ic = ctx;
    ptc_coll *c = &ic->in->coll;
    const ptc_mesh *m = &ic->ld->p->mesh;
    if (strcmp(key, "group") == 0) {
        c->axes = 0;
        for (;;) {
            int a = lex_axis(lx, m);
            if (a < 0)
                return true;
            c->axes |= 1u << a;
            if (!ptc_lex_punct(lx, '+'))
                return true;
            ptc_lex_next(lx);
        }
    }
    if (strcmp(key, "reduce") == 0) {
        c->reduce = ptc_lex_ident(lx, "max");
        if (!c->reduce && !ptc_lex_ident(lx, "sum"))
            ptc_lex_fail(lx, "expected sum or max, got '%.200s'", lx->text);
        ptc_lex_next(lx);
        return true;
    }
    static const char *const names[] = {"count",  "outer",   "chunk", "outer2",
                                        "chunk2", "experts", "row",   "back"};
    int64_t *const slots[] = {&c->count,  &c->outer, &c->chunk, &c->outer2,
                              &c->chunk2, &c->count, &c->chunk, &c->outer};
    return int_field(lx, key, names, slots, 8);
}

static bool misc_attr(void *ctx, ptc_lexer *lx, const char *key)
{
    instr_ctx *ic = ctx;
    ptc_instr *in = ic->in;
    const ptc_mesh *m = &ic->ld->p->mesh;
    if (strcmp(key, "bytes") == 0 && in->kind == PTC_INSTR_COPY) {
        in->bytes = ptc_lex_int(lx);
        return true;
    }
    if (strcmp(key, "peer") == 0 && in->kind != PTC_INSTR_COPY) {
        int a = lex_axis(lx, m);
        if (a >= 0) {
            in->peer_axis = a;
            in->peer_delta = (int)ptc_lex_int(lx);
        }
        return true;
    }
    return false;
}

static int lex_operands(loader *ld, int *ids, int cap)
{
    int n = 0;
    while (!ld->lx.failed && ld->lx.kind == PTC_T_IDENT && ld->lx.text[0] == 'b') {
        if (n == cap) {
            ptc_lex_fail(&ld->lx, "too many operands%s", "");
            return n;
        }
        ids[n++] = lex_ref(ld, 'b', ld->pg->nbufs);
        if (!ptc_lex_punct(&ld->lx, ','))
            break;
        ptc_lex_next(&ld->lx);
    }
    return n;
}

/* The instruction's kind, and for kernels its op and attributes. */
static void lex_instr_head(loader *ld, ptc_instr *in)
{
    ptc_lexer *lx = &ld->lx;
    for (int k = 0; k < PTC_NCOLLS; k++)
        if (ptc_lex_ident(lx, ptc_coll_name(k))) {
            in->kind = PTC_INSTR_COLL;
            in->coll.kind = (uint8_t)k;
            static const ptc_op ops[PTC_NCOLLS] = {PTC_OP_ALLREDUCE, PTC_OP_ALLGATHER,
                                                   PTC_OP_REDUCE_SCATTER, PTC_OP_ALL_TO_ALL,
                                                   PTC_OP_ALL_TO_ALL_V};
            in->op = ops[k];
            ptc_lex_next(lx);
            return;
        }
    in->kind = (uint8_t)lex_word(ld, instr_names, PTC_NINSTR_KINDS, "unknown instruction '%s'");
    in->op = in->kind == PTC_INSTR_GEMM ? PTC_OP_MATMUL : PTC_OP_RESHAPE;
    if (in->kind == PTC_INSTR_FUSED) {
        in->kernel = -1;
        for (int k = 0; k < ld->p->nkernels && in->kernel < 0; k++)
            if (lx->kind == PTC_T_IDENT && strcmp(ld->p->kernels[k]->name, lx->text) == 0)
                in->kernel = k;
        if (in->kernel < 0)
            ptc_lex_fail(lx, "unknown kernel '%s'", lx->text);
        ptc_lex_next(lx);
        return;
    }
    if (in->kind != PTC_INSTR_KERNEL)
        return;
    in->op = lx->kind == PTC_T_IDENT ? ptc_op_lookup(lx->text) : PTC_NOPS;
    if (in->op == PTC_NOPS) {
        ptc_lex_fail(lx, "unknown op '%.200s'", lx->text);
        return;
    }
    in->attrs = ptc_attrs_default(in->op);
    ptc_lex_next(lx);
}

/* [F mb=2 vs=1 rc coord=3 tag=12] */
static void load_work(loader *ld, ptc_instr *in)
{
    ptc_lexer *lx = &ld->lx;
    ptc_lex_next(lx);
    while (!lx->failed && !ptc_lex_punct(lx, ']')) {
        if (lx->kind != PTC_T_IDENT) {
            ptc_lex_fail(lx, "expected ']' or a work annotation, got '%.200s'", lx->text);
            return;
        }
        bool done = false;
        for (int w = PTC_WORK_F; w < PTC_NWORK && !done; w++)
            if (ptc_lex_ident(lx, ptc_work_name(w))) {
                in->work = (uint8_t)w;
                ptc_lex_next(lx);
                done = true;
            }
        if (done)
            continue;
        if (ptc_lex_ident(lx, "rc")) {
            in->recompute = true;
            ptc_lex_next(lx);
            continue;
        }
        static const char *const keys[] = {"mb", "vs", "coord", "tag"};
        int k = 0;
        while (k < 4 && !ptc_lex_ident(lx, keys[k]))
            k++;
        if (k == 4) {
            ptc_lex_fail(lx, "unknown work annotation '%.200s'", lx->text);
            return;
        }
        ptc_lex_next(lx);
        ptc_lex_expect(lx, '=');
        int64_t v = lex_count(ld, 0, k == 3 ? INT32_MAX : INT16_MAX, keys[k]);
        if (k == 0)
            in->mb = (int16_t)v;
        else if (k == 1)
            in->vstage = (int16_t)v;
        else if (k == 2) {
            in->coord = (int)v;
            in->has_coord = true;
        }
        else
            in->tag = (int)v;
    }
    ptc_lex_expect(lx, ']');
}

static void load_instr(loader *ld)
{
    ptc_lexer *lx = &ld->lx;
    ptc_program *pg = ld->pg;
    int id = lex_ref(ld, 'i', pg->ninstrs + 1);
    if (!lx->failed && id != pg->ninstrs)
        ptc_lex_fail(lx, "instructions must be numbered in order (i%s expected)", "next");
    ptc_lex_expect(lx, '=');
    ptc_instr in;
    memset(&in, 0, sizeof in);
    /* a fused instruction may have many operands (a multi-tensor optimizer update) */
    int *ins = ptc_xmalloc(sizeof(int) * PTC_MAX_FUSED_OPERANDS);
    int *outs = ptc_xmalloc(sizeof(int) * PTC_MAX_FUSED_OPERANDS);
    lex_instr_head(ld, &in);
    int cap = in.kind == PTC_INSTR_FUSED ? PTC_MAX_FUSED_OPERANDS : PTC_MAX_RESULTS;
    in.nin = lex_operands(ld, ins, in.kind == PTC_INSTR_FUSED ? cap : 2 * cap);
    if (ptc_lex_punct(lx, '-')) {
        ptc_lex_next(lx);
        ptc_lex_expect(lx, '>');
        in.nout = lex_operands(ld, outs, cap);
    }
    in.in = ins;
    in.out = outs;
    instr_ctx ic = {ld, &in};
    if (ptc_lex_punct(lx, '{')) {
        bool (*other)(void *, ptc_lexer *, const char *) =
            in.kind == PTC_INSTR_GEMM   ? gemm_attr
            : in.kind == PTC_INSTR_COLL ? coll_attr
            : in.kind == PTC_INSTR_KERNEL ? NULL
                                          : misc_attr;
        ptc_lex_attrs(lx, in.kind == PTC_INSTR_KERNEL ? in.op : PTC_OP_ADD, &in.attrs,
                      ld->p->arena, other, &ic);
    }
    static const char *const phases[] = {"forward", "backward", "update"};
    in.phase = (uint8_t)lex_word(ld, phases, 3, "expected a phase, got '%s'");
    if (ptc_lex_punct(lx, '['))
        load_work(ld, &in);
    if (ptc_lex_punct(lx, '@')) {
        ptc_lex_next(lx);
        in.loc.line = (int)lex_count(ld, 0, INT32_MAX, "line");
        ptc_lex_expect(lx, ':');
        in.loc.col = (int)lex_count(ld, 0, INT32_MAX, "column");
        in.loc.file = ld->file;
    }
    if (lx->kind == PTC_T_STR)
        in.loc.scope = ptc_lex_string(lx, ld->p->arena);
    if (!lx->failed)
        ptc_prog_add_instr(ld->p, pg, &in);
    free(ins);
    free(outs);
}

static void load_eval(loader *ld)
{
    ptc_lexer *lx = &ld->lx;
    ptc_program *pg = ld->pg;
    int cap = pg->ninstrs ? pg->ninstrs : 1;
    pg->eval = ptc_arena_alloc(ld->p->arena, sizeof(int) * (size_t)cap);
    while (!lx->failed && lx->kind == PTC_T_NUM) {
        int64_t a = lex_count(ld, 0, pg->ninstrs - 1, "eval instruction"), b = a;
        if (ptc_lex_punct(lx, ':')) {
            ptc_lex_next(lx);
            b = lex_count(ld, a, pg->ninstrs - 1, "eval instruction");
        }
        for (int64_t i = a; i <= b && !lx->failed; i++) {
            if (pg->neval == cap || (pg->neval && pg->eval[pg->neval - 1] >= i)) {
                ptc_lex_fail(lx, "eval instructions must ascend%s", "");
                return;
            }
            pg->eval[pg->neval++] = (int)i;
        }
        if (!ptc_lex_punct(lx, ','))
            break;
        ptc_lex_next(lx);
    }
}

static void load_tail(loader *ld)
{
    ptc_lexer *lx = &ld->lx;
    ptc_program *pg = ld->pg;
    if (ptc_lex_ident(lx, "loss")) {
        ptc_lex_next(lx);
        pg->loss = lex_ref(ld, 'b', pg->nbufs);
    }
    if (ptc_lex_ident(lx, "grad_norm")) {
        ptc_lex_next(lx);
        pg->grad_norm = lex_ref(ld, 'b', pg->nbufs);
    }
    if (ptc_lex_ident(lx, "stats")) {
        ptc_lex_next(lx);
        int cap = pg->nbufs ? pg->nbufs : 1;
        pg->stats = ptc_arena_alloc(ld->p->arena, sizeof(int) * (size_t)cap);
        while (!lx->failed && pg->nstats < cap) {
            pg->stats[pg->nstats++] = lex_ref(ld, 'b', pg->nbufs);
            if (!ptc_lex_punct(lx, ','))
                break;
            ptc_lex_next(lx);
        }
    }
    if (ptc_lex_ident(lx, "outputs")) {
        ptc_lex_next(lx);
        int cap = pg->nbufs ? pg->nbufs : 1;
        pg->outputs = ptc_arena_alloc(ld->p->arena, sizeof(int) * (size_t)cap);
        while (!lx->failed && pg->noutputs < cap) {
            pg->outputs[pg->noutputs++] = lex_ref(ld, 'b', pg->nbufs);
            if (!ptc_lex_punct(lx, ','))
                break;
            ptc_lex_next(lx);
        }
    }
    if (ptc_lex_ident(lx, "eval")) {
        ptc_lex_next(lx);
        load_eval(ld);
    }
    ptc_lex_keyword(lx, "end");
}

static void load_program(loader *ld, int k)
{
    ptc_lexer *lx = &ld->lx;
    ptc_plan *p = ld->p;
    ptc_lex_keyword(lx, "program");
    if (lex_count(ld, k, k, "program number") != k || lx->failed)
        return;
    ptc_program *pg = ld->pg = ptc_plan_add_program(p);
    ptc_lex_keyword(lx, "ranks");
    pg->ranks = ptc_arena_alloc(p->arena, sizeof(int) * (size_t)p->nranks);
    ptc_lex_expect(lx, '[');
    while (!lx->failed && !ptc_lex_punct(lx, ']')) {
        if (pg->nranks == p->nranks) {
            ptc_lex_fail(lx, "more ranks than the plan has%s", "");
            return;
        }
        pg->ranks[pg->nranks++] = (int)lex_count(ld, 0, p->nranks - 1, "rank");
        if (!ptc_lex_punct(lx, ']'))
            ptc_lex_expect(lx, ',');
    }
    ptc_lex_expect(lx, ']');
    if (ptc_lex_ident(lx, "stage")) {
        ptc_lex_next(lx);
        pg->stage = (int)lex_count(ld, 1, 1 << 20, "stage");
    }
    ptc_lex_keyword(lx, "regions");
    for (int r = 0; r < PTC_NREGIONS && !lx->failed; r++) {
        ptc_lex_keyword(lx, ptc_region_name(r));
        ptc_lex_expect(lx, '=');
        pg->region_bytes[r] = lex_count(ld, 0, INT64_MAX / 2, "region size");
    }
    while (!lx->failed && lx->kind == PTC_T_IDENT && lx->text[0] == 'b' &&
           strcmp(lx->text, "b") != 0)
        load_buffer(ld);
    while (!lx->failed && lx->kind == PTC_T_IDENT && lx->text[0] == 'i')
        load_instr(ld);
    load_tail(ld);
}

static void load_header(loader *ld)
{
    ptc_lexer *lx = &ld->lx;
    ptc_plan *p = ld->p;
    ptc_lex_keyword(lx, "plan");
    p->model = ptc_lex_string(lx, p->arena);
    ptc_lex_keyword(lx, "ranks");
    p->nranks = (int)lex_count(ld, 1, 1 << 20, "rank count");
    if (ptc_lex_ident(lx, "mesh")) {
        ptc_lex_next(lx);
        ptc_lex_mesh(lx, &p->mesh);
        if (!lx->failed && ptc_mesh_nranks(&p->mesh) != p->nranks)
            ptc_lex_fail(lx, "the mesh does not have %s ranks", "the plan's");
    } else if (!lx->failed && p->nranks != 1) {
        ptc_lex_fail(lx, "a plan of several ranks needs a mesh%s", "");
    }
    if (ptc_lex_ident(lx, "source")) {
        ptc_lex_next(lx);
        ld->file = ptc_lex_string(lx, p->arena);
    }
    ptc_lex_keyword(lx, "optimizer");
    ptc_lex_optim(lx, &p->optim);
    ptc_lex_keyword(lx, "zero");
    p->zero = (int)lex_count(ld, 0, 3, "zero stage");
    ptc_lex_keyword(lx, "seq_parallel");
    p->seq_parallel = ptc_lex_ident(lx, "true");
    ptc_lex_next(lx);
    ptc_lex_keyword(lx, "parameters");
    p->logical_params = lex_count(ld, 0, INT64_MAX, "parameter count");
    if (ptc_lex_ident(lx, "model_flops")) {
        ptc_lex_next(lx);
        double v = ptc_lex_number(lx);
        if (!(v >= 0 && v < 1e30) && !lx->failed)
            ptc_lex_fail(lx, "%s", "model_flops out of range");
        p->model_flops = v > 0 && v < 1e30 ? v : 0;
    }
    if (ptc_lex_ident(lx, "schedule")) {
        ptc_lex_next(lx);
        const char *name = lx->kind == PTC_T_STR ? ptc_lex_string(lx, p->arena) : NULL;
        int k = name ? ptc_pp_schedule_parse(name) : -1;
        if (k < 0 && !lx->failed)
            ptc_lex_fail(lx, "unknown pipeline schedule%s", name ? "" : " (a string expected)");
        p->pp_schedule = k < 0 ? 0 : k;
        ptc_lex_keyword(lx, "microbatches");
        p->microbatches = (int)lex_count(ld, 1, 1 << 16, "microbatches");
        ptc_lex_keyword(lx, "virtual_stages");
        p->virtual_stages = (int)lex_count(ld, 1, 64, "virtual stages");
    }
    if (ptc_lex_ident(lx, "notes")) {
        ptc_lex_next(lx);
        p->notes = ptc_lex_string(lx, p->arena);
    }
    while (!lx->failed && ptc_lex_ident(lx, "kernel")) {
        ptc_kir *k = ptc_kir_parse(lx);
        if (k)
            ptc_plan_add_kernel(p, k);
    }
}

/* A plan from the lexer's position: its header and programs, then what the executable samples
 * with: "sample" and the sampling plan (which may be followed by the next, of a shorter window),
 * or "no_sample" and the reason. */
static ptc_plan *load_plan(ptc_lexer *lx, bool nested)
{
    loader ld = {.lx = *lx};
    ld.p = ptc_plan_new();
    load_header(&ld);
    if (!ld.lx.failed)
        ld.p->rank_program = ptc_arena_alloc(ld.p->arena, sizeof(int) * (size_t)ld.p->nranks);
    for (int r = 0; !ld.lx.failed && r < ld.p->nranks; r++)
        ld.p->rank_program[r] = -1;
    for (int k = 0; !ld.lx.failed && ld.lx.kind != PTC_T_EOF && !ptc_lex_ident(&ld.lx, "sample") &&
                    !ptc_lex_ident(&ld.lx, "no_sample");
         k++) {
        load_program(&ld, k);
        for (int i = 0; !ld.lx.failed && i < ld.pg->nranks; i++) {
            int r = ld.pg->ranks[i];
            if (ld.p->rank_program[r] >= 0)
                ptc_lex_fail(&ld.lx, "a rank is in two programs%s", "");
            ld.p->rank_program[r] = k;
        }
    }
    for (int r = 0; !ld.lx.failed && r < ld.p->nranks; r++)
        if (ld.p->rank_program[r] < 0)
            ptc_lex_fail(&ld.lx, "a rank has no program%s", "");
    if (!ld.lx.failed && ptc_lex_ident(&ld.lx, "sample")) { /* (nested: a shorter window) */
        ptc_lex_next(&ld.lx);
        ld.p->sample = load_plan(&ld.lx, true);
        if (ld.p->sample && ld.p->sample->nranks != 1)
            ptc_lex_fail(&ld.lx, "the sampling plan must have one rank%s", "");
    } else if (!ld.lx.failed && !nested && ptc_lex_ident(&ld.lx, "no_sample")) {
        ptc_lex_next(&ld.lx);
        ld.p->no_sample = ptc_lex_string(&ld.lx, ld.p->arena);
    }
    if (!ld.lx.failed && !nested && ld.lx.kind != PTC_T_EOF)
        ptc_lex_fail(&ld.lx, "unexpected text after the plan%s", "");
    char msg[1024];
    if (!ld.lx.failed && ptc_plan_verify(ld.p, msg, sizeof msg) < 0) {
        ptc_fmt(ld.lx.err, ld.lx.errn, "the %splan does not verify: %s", nested ? "sampling " : "",
                msg);
        ld.lx.failed = true;
    }
    *lx = ld.lx;
    if (!ld.lx.failed)
        return ld.p;
    ptc_plan_free(ld.p);
    return NULL;
}

ptc_plan *ptc_plan_load(const char *text, char *err, size_t errn)
{
    ptc_lexer lx;
    ptc_lex_init(&lx, text, err, errn);
    return load_plan(&lx, false);
}
