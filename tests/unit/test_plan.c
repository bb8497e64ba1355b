/* test_plan.c - the execution-plan layer (plan/): lowering, the static memory planner, the text
 * form and its loader, the verifier and the pre-launch check.
 *
 * Plans come from real models (the examples, compiled through the front end and the passes) and
 * from small hand-made programs for the cases a real model does not reach (a send without its
 * receive, a damaged offset).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "exec.h"
#include "frontend.h"
#include "inproc.h"
#include "passes.h"
#include "plan.h"
#include "planner.h"

/* ---- making plans ---- */

static ptc_dtype precision = PTC_F32; /* --precision of the plans made (a test sets it back) */

static ptc_graph *compile_file(const char *rel, const char *mesh_dp_tp, int zero, bool sp)
{
    char path[512], err[2048];
    snprintf(path, sizeof path, "%s/%s", PTC_SOURCE_DIR, rel);
    size_t len;
    char *src = ptc_read_file(path, &len);
    cr_assert_not_null(src, "cannot read %s", path);
    ptc_diag d;
    ptc_diag_init(&d, stderr, path, src, len);
    ptc_frontend_opts fo = {0};
    ptc_graph *g = ptc_frontend_compile(path, src, len, &fo, &d);
    cr_assert_not_null(g);
    ptc_compile_opts co = {.train = true,
                           .verify_each = true,
                           .zero = zero,
                           .seq_parallel = sp,
                           .precision = precision};
    if (mesh_dp_tp) { /* "dp,tp" or "dp,ep,tp" */
        int n[3];
        int k = sscanf(mesh_dp_tp, "%d,%d,%d", &n[0], &n[1], &n[2]);
        cr_assert(k == 2 || k == 3);
        const char *names[3] = {"dp", k == 3 ? "ep" : "tp", "tp"};
        co.mesh.naxes = k;
        for (int a = 0; a < k; a++) {
            strcpy(co.mesh.names[a], names[a]);
            co.mesh.sizes[a] = n[a];
        }
    }
    ptc_pass_ctx ctx = {.g = g, .opts = &co, .err = err, .errn = sizeof err};
    cr_assert_eq(ptc_run_passes(&ctx), 0, "%s: %s", rel, err);
    ptc_pass_ctx_free(&ctx);
    free(src);
    return ctx.g;
}

static ptc_plan *plan_of(const char *rel, const char *mesh, int zero, bool sp)
{
    ptc_graph *g = compile_file(rel, mesh, zero, sp);
    char err[2048];
    ptc_lower_opts lo = {.zero = zero, .seq_parallel = sp, .keep_grad_outputs = !mesh};
    ptc_plan *p = ptc_lower(g, &lo, err, sizeof err);
    cr_assert_not_null(p, "%s: %s", rel, err);
    ptc_graph_free(g);
    return p;
}

static char *text_of(const ptc_plan *p)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ptc_plan_print(p, f);
    fclose(f);
    return buf;
}

typedef struct config {
    const char *model, *mesh;
    int zero;
    bool sp;
} config;

static const config configs[] = {
    {"examples/mlp.ptm", NULL, 0, false},
    {"examples/mlp.ptm", "2,2", 0, false},
    {"examples/gpt2_tiny.ptm", NULL, 0, false},
    {"examples/gpt2_tiny.ptm", "2,2", 3, true},
    {"examples/gpt2_tiny.ptm", "4,2", 2, false},
    {"examples/llama_tiny.ptm", "2,2", 1, true},
    {"tests/golden/ir/every_op.ptm", NULL, 0, false},
    {"tests/golden/ir/every_op.ptm", "2,2", 3, false},
    {"examples/moe_tiny.ptm", NULL, 0, false},
    {"examples/moe_tiny.ptm", "2,2,2", 1, true}, /* all_to_all_v, a dp+ep group, stats */
};
#define NCONFIGS (int)(sizeof configs / sizeof configs[0])

/* ---- text form ---- */

Test(plan_text, print_load_print_is_the_identity)
{
    for (int i = 0; i < NCONFIGS; i++) {
        const config *c = &configs[i];
        ptc_plan *p = plan_of(c->model, c->mesh, c->zero, c->sp);
        char *a = text_of(p), err[1024];
        ptc_plan *q = ptc_plan_load(a, err, sizeof err);
        cr_assert_not_null(q, "%s %s: %s", c->model, c->mesh ? c->mesh : "", err);
        char *b = text_of(q);
        cr_expect_str_eq(a, b, "%s: the loaded plan prints differently", c->model);
        free(a);
        free(b);
        ptc_plan_free(p);
        ptc_plan_free(q);
    }
}

/* Replaces the first occurrence of from in text by to (a fresh string). */
static char *edit(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    cr_assert_not_null(at, "'%s' is not in the plan", from);
    size_t n = strlen(text) + strlen(to) + 1;
    char *s = malloc(n);
    cr_assert_not_null(s);
    snprintf(s, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return s;
}

static void expect_load_error(const char *text, const char *want)
{
    char err[1024] = "";
    ptc_plan *p = ptc_plan_load(text, err, sizeof err);
    cr_expect_null(p, "a damaged plan loaded (want an error with '%s')", want);
    cr_expect(strstr(err, want) != NULL, "message '%s' lacks '%s'", err, want);
    ptc_plan_free(p);
}

/* Under --precision the GEMMs of 16-bit matmuls write their 16-bit results themselves (c=bf16,
 * c=f16): no f32 result and no cast after it; the text form carries c= through a load, and the
 * verifier holds c to f32 or the operands' dtype, the latter with beta 0 only. */
Test(plan_text, sixteen_bit_gemm_results)
{
    ptc_dtype precs[2] = {PTC_BF16, PTC_F16};
    for (int q = 0; q < 2; q++) {
        precision = precs[q];
        ptc_plan *p = plan_of("examples/gpt2_tiny.ptm", "2,2", 1, true);
        precision = PTC_F32;
        const ptc_program *pg = &p->programs[0];
        int gemms = 0, direct = 0;
        for (int i = 0; i < pg->ninstrs; i++) {
            const ptc_instr *in = &pg->instrs[i];
            if (in->kind != PTC_INSTR_GEMM)
                continue;
            gemms++;
            cr_expect_eq(pg->bufs[in->out[0]].type.dtype, (ptc_dtype)in->gemm.cd);
            direct += in->gemm.cd == precs[q];
            for (int j = i + 1; j < pg->ninstrs; j++) /* no f32 result rounded after it */
                cr_expect(!(pg->instrs[j].op == PTC_OP_CAST && pg->instrs[j].in[0] == in->out[0] &&
                            pg->bufs[pg->instrs[j].out[0]].type.dtype == precs[q]),
                          "i%d rounds the result of gemm i%d", j, i);
        }
        cr_expect_gt(direct, 0, "no gemm writes 16 bits (%d gemms)", gemms);
        char *a = text_of(p), err[1024];
        const char *c16 = q ? ", c=f16}" : ", c=bf16}";
        cr_expect_not_null(strstr(a, c16), "the text lacks '%s'", c16);
        ptc_plan *l = ptc_plan_load(a, err, sizeof err);
        cr_assert_not_null(l, "%s", err);
        char *b = text_of(l);
        cr_expect_str_eq(a, b, "the loaded plan prints differently");
        const char *ab = q ? "ab=f16, c=f16}" : "ab=bf16, c=bf16}";
        char *s = edit(a, ab, q ? "ab=bf16, c=f16}" : "ab=f16, c=bf16}");
        expect_load_error(s, "a gemm result of a bad dtype");
        free(s);
        s = edit(a, "beta=0, ab=", "beta=1, ab=");
        expect_load_error(s, "does not verify");
        free(s);
        free(a);
        free(b);
        ptc_plan_free(l);
        ptc_plan_free(p);
    }
}

Test(plan_text, the_loader_rejects_damaged_plans)
{
    ptc_plan *p = plan_of("examples/mlp.ptm", NULL, 0, false);
    char *t = text_of(p), *s;
    s = edit(t, "i0 = gemm", "i0 = gemmm");
    expect_load_error(s, "unknown instruction 'gemmm'");
    free(s);
    s = edit(t, "i1 = kernel add", "i1 = kernel frobnicate");
    expect_load_error(s, "unknown op 'frobnicate'");
    free(s);
    s = edit(t, "regions param=", "regions parm=");
    expect_load_error(s, "expected 'param'");
    free(s);
    s = edit(t, "b3 = param", "b4 = param");
    expect_load_error(s, "expected b<number> below 4");
    free(s);
    s = edit(t, "end\n", "");
    expect_load_error(s, "expected 'end'");
    free(s);
    /* loads, but does not verify: an input the sizes of which disagree with its type */
    s = edit(t, "i32[64]", "i32[65]");
    expect_load_error(s, "does not verify");
    free(s);
    expect_load_error("", "expected 'plan'");
    expect_load_error("plan \"x\" ranks 0", "rank count out of range");
    free(t);
    ptc_plan_free(p);
    /* expert parallelism: an all_to_all_v whose counts do not fit its experts, moe statistics
     * that are not f32[3] */
    p = plan_of("examples/moe_tiny.ptm", "1,2,1", 0, false);
    t = text_of(p);
    s = edit(t, "experts=4,", "experts=3,");
    expect_load_error(s, "all_to_all_v layout disagrees with its buffers");
    free(s);
    cr_assert_eq(p->programs[0].nstats, 2); /* one per layer */
    char stats[64];
    snprintf(stats, sizeof stats, "\nstats b%d,", p->programs[0].stats[0]);
    s = edit(t, stats, "\nstats b0,");
    expect_load_error(s, "moe statistics 0 are not an f32[3] buffer");
    free(s);
    free(t);
    ptc_plan_free(p);
}

/* ---- the verifier ---- */

static int first_instr_of(const ptc_program *pg, int kind, ptc_op op)
{
    for (int i = 0; i < pg->ninstrs; i++)
        if (pg->instrs[i].kind == kind && (kind != PTC_INSTR_KERNEL || pg->instrs[i].op == op))
            return i;
    return -1;
}

Test(plan_verify, catches_overlap_reads_before_writes_and_bad_sizes)
{
    char err[1024];
    ptc_plan *p = plan_of("examples/gpt2_tiny.ptm", NULL, 0, false);
    ptc_program *pg = &p->programs[0];
    cr_assert_eq(ptc_plan_verify(p, err, sizeof err), 0, "%s", err);

    /* two inputs (live at once, from the start) on the same bytes */
    int a = 0, b;
    while (pg->bufs[a].kind != PTC_BUF_INPUT)
        a++;
    for (b = a + 1; pg->bufs[b].kind != PTC_BUF_INPUT;)
        b++;
    int64_t saved = pg->bufs[b].offset;
    pg->bufs[b].offset = pg->bufs[a].offset;
    cr_expect_eq(ptc_plan_verify(p, err, sizeof err), -1);
    cr_expect(strstr(err, "share bytes") != NULL, "%s", err);
    pg->bufs[b].offset = saved;
    int g = first_instr_of(pg, PTC_INSTR_GEMM, PTC_OP_MATMUL);
    cr_assert_geq(g, 0);

    /* an instruction moved before the one that writes its operand */
    ptc_instr tmp = pg->instrs[g];
    pg->instrs[g] = pg->instrs[g + 1];
    pg->instrs[g + 1] = tmp;
    cr_expect_eq(ptc_plan_verify(p, err, sizeof err), -1);
    cr_expect(strstr(err, "before anything writes it") != NULL, "%s", err);
    pg->instrs[g + 1] = pg->instrs[g];
    pg->instrs[g] = tmp;

    /* bytes that disagree with the dtype (an input: no view shares its bytes) */
    int in = 0;
    while (pg->bufs[in].kind != PTC_BUF_INPUT)
        in++;
    pg->bufs[in].bytes += 4;
    cr_expect_eq(ptc_plan_verify(p, err, sizeof err), -1);
    cr_expect(strstr(err, "its type needs") != NULL, "%s", err);
    pg->bufs[in].bytes -= 4;

    /* a buffer past the end of its arena */
    pg->region_bytes[PTC_REGION_PARAM] -= 64;
    cr_expect_eq(ptc_plan_verify(p, err, sizeof err), -1);
    cr_expect(strstr(err, "outside its param arena") != NULL, "%s", err);
    pg->region_bytes[PTC_REGION_PARAM] += 64;

    cr_expect_eq(ptc_plan_verify(p, err, sizeof err), 0, "%s", err);
    ptc_plan_free(p);
}

/* ---- the memory planner ---- */

/* The arena of activations is at least the most bytes live at once, every buffer sits in its
 * arena, and best fit keeps the excess small on these models. */
Test(plan_memory, arenas_hold_the_peak_with_little_waste)
{
    for (int i = 0; i < NCONFIGS; i++) {
        const config *c = &configs[i];
        ptc_plan *p = plan_of(c->model, c->mesh, c->zero, c->sp);
        const ptc_program *pg = &p->programs[0];
        ptc_mem_timeline t;
        ptc_prog_timeline(pg, PTC_REGION_ACT, &t);
        int64_t arena = pg->region_bytes[PTC_REGION_ACT];
        cr_expect_geq(arena, t.peak, "%s: arena %lld below the peak %lld", c->model,
                      (long long)arena, (long long)t.peak);
        /* alignment costs up to 63 bytes a buffer; beyond that, fragmentation under 10% */
        cr_expect_leq((double)arena, 1.10 * (double)t.peak + 64.0 * pg->nbufs,
                      "%s %s: arena %lld for a peak of %lld", c->model, c->mesh ? c->mesh : "",
                      (long long)arena, (long long)t.peak);
        free(t.live);
        ptc_plan_free(p);
    }
}

/* A program made by hand: three activations, the first two live at once, the third after the
 * first died: best fit puts the third into the first one's bytes. */
Test(plan_memory, best_fit_reuses_freed_bytes)
{
    ptc_plan *p = ptc_plan_new();
    p->rank_program = ptc_arena_alloc(p->arena, sizeof(int));
    ptc_program *pg = ptc_plan_add_program(p);
    pg->ranks = ptc_arena_alloc(p->arena, sizeof(int));
    pg->nranks = 1;
    ptc_buffer b = {.kind = PTC_BUF_TEMP, .region = PTC_REGION_ACT, .view = -1};
    b.type = (ptc_type){.dtype = PTC_F32, .rank = 1, .dims = {256}};
    b.bytes = 1024;
    int x = ptc_prog_add_buffer(p, pg, &b), y = ptc_prog_add_buffer(p, pg, &b);
    b.type.dims[0] = 128;
    b.bytes = 512;
    int z = ptc_prog_add_buffer(p, pg, &b);
    ptc_instr in = {.kind = PTC_INSTR_KERNEL, .op = PTC_OP_FILL, .nout = 1};
    in.attrs = ptc_attrs_default(PTC_OP_FILL);
    in.attrs.nshape = 1;
    in.attrs.shape[0] = 256;
    in.out = &x;
    ptc_prog_add_instr(p, pg, &in); /* 0: x */
    ptc_instr neg = {.kind = PTC_INSTR_KERNEL, .op = PTC_OP_NEG, .nin = 1, .nout = 1};
    neg.attrs = ptc_attrs_default(PTC_OP_NEG);
    neg.in = &x;
    neg.out = &y;
    ptc_prog_add_instr(p, pg, &neg); /* 1: y = -x, x's last use */
    in.attrs.shape[0] = 128;
    in.out = &z;
    ptc_prog_add_instr(p, pg, &in); /* 2: z */
    pg->loss = -1;
    ptc_plan_memory(p);
    char err[512];
    cr_assert_eq(ptc_plan_verify(p, err, sizeof err), 0, "%s", err);
    cr_expect_eq(pg->bufs[z].offset, pg->bufs[x].offset, "z should reuse x's bytes");
    cr_expect_eq(pg->region_bytes[PTC_REGION_ACT], 2048);
    (void)y;
    ptc_plan_free(p);
}

/* ---- lowering ---- */

static int count_kernels(const ptc_program *pg, ptc_op op)
{
    int n = 0;
    for (int i = 0; i < pg->ninstrs; i++)
        n += pg->instrs[i].kind == PTC_INSTR_KERNEL && pg->instrs[i].op == op;
    return n;
}

Test(plan_lower, views_folds_and_in_place_updates)
{
    ptc_plan *p = plan_of("examples/gpt2_tiny.ptm", NULL, 0, false);
    const ptc_program *pg = &p->programs[0];
    /* reshapes are views, matmul transposes fold into the GEMMs (gpt2 has none left), and
     * every AdamW update writes over its parameter and moments: no copies at the end */
    cr_expect_eq(count_kernels(pg, PTC_OP_RESHAPE), 0);
    cr_expect_eq(count_kernels(pg, PTC_OP_TRANSPOSE), 0);
    int copies = 0, updates = 0;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        copies += in->kind == PTC_INSTR_COPY;
        if (in->kind == PTC_INSTR_KERNEL && in->op == PTC_OP_ADAMW_UPDATE) {
            updates++;
            for (int k = 0; k < 3; k++)
                cr_expect_eq(ptc_prog_root(pg, in->out[k]),
                             ptc_prog_root(pg, in->in[k == 0 ? 0 : k + 1]),
                             "update %d result %d is not in place", i, k);
        }
    }
    cr_expect_eq(copies, 0);
    cr_expect_gt(updates, 0);
    /* the eval entry computes the loss and nothing of the backward */
    cr_assert_gt(pg->neval, 0);
    for (int k = 0; k < pg->neval; k++)
        cr_expect_eq(pg->instrs[pg->eval[k]].phase, PTC_PHASE_FORWARD);
    ptc_plan_free(p);
}

Test(plan_lower, sixteen_bit_values_are_stored_in_two_bytes)
{
    ptc_plan *p = plan_of("tests/golden/ir/every_op.ptm", NULL, 0, false);
    const ptc_program *pg = &p->programs[0];
    int n16 = 0;
    for (int b = 0; b < pg->nbufs; b++)
        if (pg->bufs[b].type.dtype == PTC_BF16) {
            n16++;
            cr_expect_eq(pg->bufs[b].bytes, 2 * ptc_type_numel(&pg->bufs[b].type));
        }
    cr_expect_gt(n16, 0, "every_op casts to bf16");
    /* every kernel but a cast computes on f32 or i32 */
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_KERNEL || in->op == PTC_OP_CAST)
            continue;
        for (int k = 0; k < in->nin; k++)
            cr_expect_neq(pg->bufs[in->in[k]].type.dtype, PTC_BF16, "i%d reads bf16", i);
    }
    ptc_plan_free(p);
}

/* ---- the pre-launch check ---- */

/* Two ranks on a pp axis: rank 0 sends, rank 1 receives (or not). */
static ptc_plan *p2p_plan(bool with_recv, int64_t recv_count)
{
    ptc_plan *p = ptc_plan_new();
    p->nranks = 2;
    p->mesh.naxes = 1;
    strcpy(p->mesh.names[0], "pp");
    p->mesh.sizes[0] = 2;
    p->rank_program = ptc_arena_alloc(p->arena, 2 * sizeof(int));
    for (int r = 0; r < 2; r++) {
        ptc_program *pg = ptc_plan_add_program(p);
        pg->ranks = ptc_arena_alloc(p->arena, sizeof(int));
        pg->ranks[pg->nranks++] = r;
        p->rank_program[r] = r;
        ptc_buffer b = {.kind = PTC_BUF_TEMP, .region = PTC_REGION_ACT, .view = -1};
        b.type = (ptc_type){.dtype = PTC_F32, .rank = 1, .dims = {r ? recv_count : 16}};
        b.bytes = 4 * b.type.dims[0];
        int x = ptc_prog_add_buffer(p, pg, &b);
        ptc_instr in = {.nin = r == 0, .nout = r == 1, .peer_axis = 0};
        in.in = in.out = &x;
        if (r == 0) {
            ptc_instr f = {.kind = PTC_INSTR_KERNEL, .op = PTC_OP_FILL, .nout = 1, .out = &x};
            f.attrs = ptc_attrs_default(PTC_OP_FILL);
            f.attrs.nshape = 1;
            f.attrs.shape[0] = 16;
            ptc_prog_add_instr(p, pg, &f);
            in.kind = PTC_INSTR_SEND;
            in.peer_delta = 1;
            ptc_prog_add_instr(p, pg, &in);
        } else if (with_recv) {
            in.kind = PTC_INSTR_RECV;
            in.peer_delta = -1;
            ptc_prog_add_instr(p, pg, &in);
        }
    }
    ptc_plan_memory(p);
    return p;
}

Test(plan_check, sends_meet_their_receives)
{
    char err[1024];
    ptc_plan *p = p2p_plan(true, 16);
    cr_assert_eq(ptc_plan_verify(p, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ptc_plan_check(p, -1, -1, err, sizeof err), 0, "%s", err);
    ptc_plan_free(p);

    p = p2p_plan(true, 8);
    cr_expect_eq(ptc_plan_check(p, -1, -1, err, sizeof err), -1);
    cr_expect(strstr(err, "rank 1 receives from rank 0 in recv of 8 elements") != NULL &&
                  strstr(err, "rank 0's send of 16 elements") != NULL,
              "%s", err);
    ptc_plan_free(p);
}

Test(plan_check, a_receive_of_another_message_of_the_same_size_is_caught)
{
    char err[1024];
    ptc_plan *p = p2p_plan(true, 16);
    p->programs[1].instrs[0].tag = 7; /* rank 0 sends message 0 */
    cr_expect_eq(ptc_plan_check(p, -1, -1, err, sizeof err), -1);
    cr_expect(strstr(err, "(message 7)") != NULL && strstr(err, "(message 0)") != NULL, "%s",
              err);
    ptc_plan_free(p);
}

Test(plan_check, a_send_without_its_receive_is_caught)
{
    char err[1024];
    ptc_plan *p = p2p_plan(false, 16);
    cr_expect_eq(ptc_plan_check(p, -1, -1, err, sizeof err), -1);
    cr_expect(strstr(err, "rank 0's send of 16 elements") != NULL &&
                  strstr(err, "rank 1 has no receive left") != NULL,
              "%s", err);
    ptc_plan_free(p);
}

Test(plan_check, a_receive_without_its_send_would_hang)
{
    char err[1024];
    /* rank 1 receives from rank 0, which sends nothing: swap the roles of p2p_plan */
    ptc_plan *p = p2p_plan(true, 16);
    ptc_program *pg0 = &p->programs[0];
    pg0->ninstrs = 1; /* rank 0 only fills its buffer */
    cr_expect_eq(ptc_plan_check(p, -1, -1, err, sizeof err), -1);
    cr_expect(strstr(err, "rank 1 waits in recv") != NULL && strstr(err, "rank 0 never sends") != NULL,
              "%s", err);
    ptc_plan_free(p);
}

Test(plan_check, a_dropped_collective_is_caught)
{
    char err[1024];
    ptc_plan *p = plan_of("examples/gpt2_tiny.ptm", "2,2", 0, false);
    cr_expect_eq(ptc_plan_check(p, -1, -1, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ptc_plan_check(p, 3, 5, err, sizeof err), -1);
    cr_expect(strstr(err, "plan check") != NULL && strstr(err, "rank 3") != NULL, "%s", err);
    ptc_plan_free(p);
}

/* ---- running a plan ---- */

/* rank 0 of p on options o, its state initialised and its inputs random (seed 1) */
static ptrt_exec *ready_exec(const ptc_plan *p, const ptrt_exec_opts *o)
{
    char err[1024];
    ptrt_exec *x = ptrt_exec_new(p, 0, o, err, sizeof err);
    cr_assert_not_null(x, "%s", err);
    ptrt_exec_init_state(x, 1);
    const ptc_program *pg = ptrt_exec_program(x);
    for (int b = 0; b < pg->nbufs; b++)
        if (pg->bufs[b].kind == PTC_BUF_INPUT)
            cr_assert_eq(ptrt_exec_random_input(x, b, pg->bufs[b].name, 1, err, sizeof err), 0,
                         "%s", err);
    return x;
}

/* The executor's measured high-water marks equal the plan's arenas. */
Test(plan_exec, measured_high_water_marks_equal_the_plan)
{
    ptc_plan *p = plan_of("examples/gpt2_tiny.ptm", NULL, 0, false);
    char err[1024];
    ptrt_exec_opts o = {.canary = true, .drop = -1};
    ptrt_exec *x = ready_exec(p, &o);
    const ptc_program *pg = ptrt_exec_program(x);
    cr_assert_eq(ptrt_exec_run(x, PTRT_ENTRY_STEP, 1, err, sizeof err), 0, "%s", err);
    for (int r = 0; r < PTC_NREGIONS; r++)
        cr_expect_eq(ptrt_exec_high_water(x, r), pg->region_bytes[r], "region %s",
                     ptc_region_name(r));
    ptrt_exec_free(x);
    ptc_plan_free(p);
}

/* A device backend for the test: the CPU backend's kernels over host memory it claims is a
 * device's (so the executor moves bytes through upload, download, move and zero), counting syncs. */
static int syncs;
static void dev_upload(void *dev, const void *host, size_t n)
{
    memcpy(dev, host, n);
}
static void dev_move(void *dst, const void *src, size_t n)
{
    memmove(dst, src, n);
}
static void dev_zero(void *dst, size_t n)
{
    memset(dst, 0, n);
}
static int dev_sync(char *err, size_t errn)
{
    (void)err, (void)errn;
    syncs++;
    return 0;
}

static int device_step_syncs(const ptc_plan *p, bool profile, int *ninstrs)
{
    ptrt_backend be = ptrt_backend_cpu;
    be.name = "counting device";
    be.host = false;
    be.upload = dev_upload;
    be.download = dev_upload;
    be.move = dev_move;
    be.zero = dev_zero;
    be.sync = dev_sync;
    char err[1024];
    ptrt_exec_opts o = {.backend = &be, .drop = -1};
    ptrt_exec *x = ready_exec(p, &o);
    ptrt_exec_set_profile(x, profile);
    syncs = 0;
    cr_assert_eq(ptrt_exec_run(x, PTRT_ENTRY_STEP, 1, err, sizeof err), 0, "%s", err);
    *ninstrs = ptrt_exec_program(x)->ninstrs;
    ptrt_exec_free(x);
    return syncs;
}

/* On a device the work is queued: a profile (or trace) must wait for each instruction's own
 * work before its clock stops, or it times the queueing (on an H200, an unsynchronised profile
 * of GPT-2 gave casts 35% of the step and sumsq 16%; synchronised, 11% and 1%). */
Test(plan_exec, a_device_profile_times_each_instruction_to_its_end)
{
    ptc_plan *p = plan_of("examples/mlp.ptm", NULL, 0, false);
    int n = 0;
    int plain = device_step_syncs(p, false, &n), profiled = device_step_syncs(p, true, &n);
    cr_expect_eq(plain, 1, "a step without a profile syncs once, at its end (%d)", plain);
    cr_expect_geq(profiled, n, "a profiled step syncs after each of its %d instructions (%d)", n,
                  profiled);
    ptc_plan_free(p);
}

/* Two ranks with different programs (rank 0 fills and sends, rank 1 receives) run as threads
 * over the in-process communicator: the runtime's send/recv path and per-rank programs. */
typedef struct p2p_rank {
    ptc_plan *p;
    ptrt_comm *comm;
    int rank, rc;
    float got[16];
    char err[512];
} p2p_rank;

static void *p2p_main(void *arg)
{
    p2p_rank *r = arg;
    ptrt_exec_opts o = {.comm = r->comm, .drop = -1, .canary = true};
    ptrt_exec *x = ptrt_exec_new(r->p, r->rank, &o, r->err, sizeof r->err);
    if (!x) {
        r->rc = -1;
        return NULL;
    }
    r->rc = ptrt_exec_run(x, PTRT_ENTRY_STEP, 1, r->err, sizeof r->err);
    if (r->rank == 1 && r->rc == 0)
        memcpy(r->got, ptrt_exec_data(x, 0), sizeof r->got);
    ptrt_exec_free(x);
    return NULL;
}

Test(plan_exec, ranks_with_different_programs_send_and_receive)
{
    ptc_plan *p = p2p_plan(true, 16);
    /* rank 0 fills its buffer with 2.5 */
    p->programs[0].instrs[0].attrs.value = 2.5;
    char err[512];
    ptrt_inproc *ip = ptrt_inproc_new(2, 10, err, sizeof err);
    cr_assert_not_null(ip, "%s", err);
    p2p_rank ranks[2] = {{.p = p, .comm = ptrt_inproc_comm(ip), .rank = 0},
                         {.p = p, .comm = ptrt_inproc_comm(ip), .rank = 1}};
    pthread_t th[2];
    for (int r = 0; r < 2; r++)
        cr_assert_eq(pthread_create(&th[r], NULL, p2p_main, &ranks[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        cr_expect_eq(ranks[r].rc, 0, "rank %d: %s", r, ranks[r].err);
    for (int i = 0; i < 16; i++)
        cr_expect_eq(ranks[1].got[i], 2.5f, "element %d: %g", i, (double)ranks[1].got[i]);
    ptrt_inproc_free(ip);
    ptc_plan_free(p);
}
