/* test_cuda.c - the CUDA kernels without a GPU.
 *
 *   - emulation: every generated kernel of the example models (and of awkward sizes: 1, odd and
 *     prime dimensions), plus hand-written kernels for the emitter's corners, is emitted as CUDA
 *     C, compiled for the host through codegen/cuda/cuda_emu.h (threads of a block are real
 *     threads, so a missing barrier shows), run at sm_90's block size and at small odd ones (1
 *     and 3 warps), on grids smaller than the loops (the striding), and compared with the
 *     kernel-IR interpreter (double precision): 2e-5 relative to the largest value of each
 *     output (f32 sums in another order), NaN where it is NaN, inputs untouched. Under ASan the
 *     emulated code is built with ASan too, so an access out of bounds fails the test;
 *   - the moe routing kernels (cuda_moe.c: top-k, counts, prefix, route, frac, stats) emulated
 *     on sizes with 1, odd and prime dimensions, ties and awkward capacities, bit for bit the
 *     reference's results;
 *   - NVRTC and ptxas: the kernels of every example (the large ones included) compile for sm_80
 *     and sm_90 with NVRTC, and ptxas accepts the PTX; NVRTC's disk cache returns the same PTX;
 *   - a training step: one step of the example models on a test backend whose fused kernels and
 *     attention (forward, statistics, backward) are the emulated CUDA kernels, against the CPU
 *     backend: the loss, every gradient and AdamW's moments within 1e-5 of the largest value;
 *   - dlopen: each library missing gives a message naming it; the driver's absence (this
 *     machine has none) is what --device cuda reports.
 * The NVRTC and emulation tests skip, saying why, where the CUDA toolkit or a C compiler is
 * missing.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attn_test.h"
#include "cuda.h"
#include "cuda_emit.h"
#include "backend.h"
#include "cpu.h"
#include "cudalib.h"
#include "exec.h"
#include "kernel.h"
#include "ref.h"
#include "frontend.h"
#include "kir.h"
#include "half.h"
#include "inproc.h"
#include "nccl_comm.h"
#include "kir_samples.h"
#include "passes.h"
#include "plan.h"
#include "planner.h"

/* The emulation builds' flags: line tables (-g1) for the sanitizers' reports and a debugger's
 * backtrace; under the sanitizers -O0, which keeps every access for them to check and compiles
 * in 40% of -O1's time (the compiler was 80% of these tests' time there, its variable tracking
 * for -g much of it). */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_CFLAGS "-O0 -g1 -fsanitize=address,undefined -fno-omit-frame-pointer"
#define SANITIZED true
#else
#define EMU_CFLAGS "-O1 -g1"
#define SANITIZED false
#endif

static char tmpdir[] = "/tmp/ptc_cuda_XXXXXX";

static void setup(void)
{
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown(void)
{
    if (getenv("PTC_KEEP_TMP")) { /* the generated units and their builds, to read */
        fprintf(stderr, "test_cuda: kept %s\n", tmpdir);
        return;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    cr_expect_eq(system(cmd), 0);
}

/* ---- plans ---- */

/* a parallel plan's options (mesh axes "dp=2,tp=2" style, one letter pair each) */
typedef struct par_opts {
    const char *axes[4];
    int sizes[4];
    bool sp;
    int zero, microbatches;
    ptc_dtype precision; /* 0 (f32) or PTC_BF16 / PTC_F16 (with loss scaling) */
} par_opts;

static ptc_plan *plan_par(const char *rel, const ptc_define *defs, int ndefs, bool grads,
                          const par_opts *po);

static ptc_plan *plan_with(const char *rel, const ptc_define *defs, int ndefs, bool grads)
{
    return plan_par(rel, defs, ndefs, grads, NULL);
}

static ptc_plan *plan_par(const char *rel, const ptc_define *defs, int ndefs, bool grads,
                          const par_opts *po)
{
    char path[512], err[2048];
    snprintf(path, sizeof path, "%s/%s", PTC_SOURCE_DIR, rel);
    size_t len;
    char *src = ptc_read_file(path, &len);
    cr_assert_not_null(src, "cannot read %s", path);
    ptc_diag d;
    ptc_diag_init(&d, stderr, rel, src, len);
    ptc_frontend_opts fo = {.defines = defs, .ndefines = ndefs};
    ptc_graph *g = ptc_frontend_compile(rel, src, len, &fo, &d);
    cr_assert_not_null(g, "%s", rel);
    ptc_compile_opts co = {.train = true, .microbatches = 1};
    for (int a = 0; po && a < 4 && po->axes[a]; a++) {
        snprintf(co.mesh.names[a], sizeof co.mesh.names[a], "%s", po->axes[a]);
        co.mesh.sizes[a] = po->sizes[a];
        co.mesh.naxes = a + 1;
    }
    if (po) {
        co.seq_parallel = po->sp;
        co.zero = po->zero;
        co.microbatches = po->microbatches > 0 ? po->microbatches : 1;
        if (po->precision == PTC_BF16 || po->precision == PTC_F16) {
            co.precision = po->precision;
            co.loss_scaling = po->precision == PTC_F16;
        }
    }
    ptc_pass_ctx ctx = {.g = g, .opts = &co, .err = err, .errn = sizeof err};
    cr_assert_eq(ptc_run_passes(&ctx), 0, "%s: %s", rel, err);
    ptc_pass_ctx_free(&ctx);
    ptc_lower_opts lo = {.fuse = true, .keep_grad_outputs = grads};
    ptc_plan *p = ptc_lower(ctx.g, &lo, err, sizeof err);
    cr_assert_not_null(p, "%s: %s", rel, err);
    cr_assert_gt(p->nkernels, 0, "%s: nothing fused", rel);
    ptc_graph_free(ctx.g);
    free(src);
    return p;
}

static ptc_plan *plan_of(const char *rel, const ptc_define *defs, int ndefs)
{
    return plan_with(rel, defs, ndefs, false);
}

static char *unit_of(ptc_kir *const *ks, int n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ptc_cuda_emit_unit(ks, n, f);
    fclose(f);
    return buf;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
}

/* ---- the host emulation ---- */

typedef int (*launch_fn)(void (*)(void *const *), void *const *, unsigned, unsigned);

static bool have_cc(void)
{
    return system("cc --version >/dev/null 2>&1") == 0;
}

/* the emulation build of a translation unit (cc flags added): a shared object, dlopen'd */
static void *build_emu_with(const char *unit, const char *name, const char *flags)
{
    char src[512], so[512], cmd[2048];
    snprintf(src, sizeof src, "%s/%s.c", tmpdir, name);
    snprintf(so, sizeof so, "%s/%s.so", tmpdir, name);
    write_text(src, unit);
    snprintf(cmd, sizeof cmd,
             "cc -std=c11 %s -fPIC -shared -Wall -Wno-unused -Wno-div-by-zero %s -include "
             "%s/codegen/cuda/cuda_emu.h -o %s %s -lm",
             EMU_CFLAGS, flags, PTC_SOURCE_DIR, so, src);
    cr_assert_eq(system(cmd), 0, "the emulation build failed: %s", cmd);
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "%s", dlerror());
    return h;
}

static void *build_emu(const char *unit, const char *name)
{
    return build_emu_with(unit, name, "");
}

typedef void (*emu_fn)(void *const *);

/* why the emulation build's last launch failed (a race, a deadlock) */
static const char *emu_error(void *so)
{
    const char *(*error)(void);
    void *p = dlsym(so, "ptc_cuda_emu_error");
    cr_assert_not_null(p, "no ptc_cuda_emu_error in the emulation build");
    memcpy(&error, &p, sizeof error);
    return error();
}

/* the emulation build's launcher (ptc_cuda_emu_launch) */
static launch_fn emu_launcher(void *so)
{
    void *p = dlsym(so, "ptc_cuda_emu_launch");
    cr_assert_not_null(p, "no ptc_cuda_emu_launch in the emulation build");
    launch_fn launch;
    memcpy(&launch, &p, sizeof launch);
    return launch;
}

static emu_fn emu_sym(void *so, const char *sym)
{
    void *p = dlsym(so, sym);
    cr_assert_not_null(p, "no %s in the emulation build", sym);
    emu_fn fn;
    memcpy(&fn, &p, sizeof fn);
    return fn;
}

typedef struct bufs {
    void **args;   /* one per parameter (an alias shares its input's) */
    float **owned; /* one per parameter, NULL for an alias */
} bufs;

/* k's arrays, each starting shift elements past a 16-byte boundary (a packed loop's arrays then
 * are not aligned for its 16-byte loads, and the kernel must take them an element a thread) */
static bufs make_bufs(const ptc_kir *k, unsigned seed, int shift)
{
    bufs b = {calloc((size_t)k->nparams, sizeof(void *)), calloc((size_t)k->nparams, sizeof(float *))};
    srand(seed);
    for (int i = 0; i < k->nparams; i++) {
        const ptc_kparam *p = &k->params[i];
        if (p->alias >= 0) {
            b.args[i] = b.args[p->alias];
            continue;
        }
        b.owned[i] = calloc((size_t)(p->numel ? p->numel : 1) + 4, 4);
        char *at = (char *)b.owned[i] + (size_t)shift * ptc_dtype_size(p->dtype);
        for (int64_t j = 0; j < p->numel; j++) {
            if (p->dtype == PTC_F32)
                ((float *)at)[j] = (float)rand() / RAND_MAX * 4.0f - 2.0f;
            else if (p->dtype == PTC_BF16)
                ((uint16_t *)at)[j] = ptc_bf16_bits((float)rand() / RAND_MAX * 4.0f - 2.0f);
            else if (p->dtype == PTC_F16)
                ((uint16_t *)at)[j] = ptc_f16_bits((float)rand() / RAND_MAX * 4.0f - 2.0f);
            else
                ((int32_t *)at)[j] = rand() % 3;
        }
        b.args[i] = at;
    }
    return b;
}

static void free_bufs(const ptc_kir *k, bufs *b)
{
    for (int i = 0; i < k->nparams; i++)
        free(b->owned[i]);
    free(b->owned);
    free(b->args);
}

/* the emulated kernel at grid x block against the interpreter, on the same inputs, its arrays
 * shift elements past 16-byte boundaries */
static void check_emulated_at(void *so, const ptc_kir *k, unsigned grid, unsigned block, int shift)
{
    char sym[256], err[1024];
    snprintf(sym, sizeof sym, "k_%s__emu", k->name);
    emu_fn fn = emu_sym(so, sym);
    launch_fn launch = emu_launcher(so);

    bufs want = make_bufs(k, 7, 0), got = make_bufs(k, 7, shift);
    cr_assert_eq(ptc_kir_run_checked(k, want.args, err, sizeof err), 0, "%s", err);
    cr_assert_eq(launch(fn, got.args, grid, block), 0, "%s: launch %u x %u: %s", k->name, grid,
                 block, emu_error(so));
    for (int i = 0; i < k->nparams; i++) {
        const ptc_kparam *q = &k->params[i];
        if (!got.owned[i])
            continue;
        const float *a = want.args[i], *b = got.args[i];
        if (q->dtype != PTC_F32) { /* i32, and bf16: rounded alike, bit for bit */
            cr_expect_eq(memcmp(a, b, (size_t)q->numel * ptc_dtype_size(q->dtype)), 0,
                         "%s: %s differs (arrays %d elements off)", k->name, q->name, shift);
            continue;
        }
        double big = 0;
        for (int64_t j = 0; j < q->numel; j++)
            big = isfinite(a[j]) && fabs(a[j]) > big ? fabs(a[j]) : big;
        /* AdamW divides by sqrt(v) + eps: with random v near 0 that amplifies float rounding
         * (a weight of 232 off by 2.1e-5 of itself in one dp2 x tp2 shard), as in the
         * equivalence matrix, which holds weights to 1e-4 for the same reason */
        double tol = (strstr(k->name, "adamw") ? 1e-4 : 2e-5) * big + 1e-6;
        int bad = 0;
        for (int64_t j = 0; j < q->numel && bad < 3; j++) {
            bool ok = isnan(a[j]) ? isnan(b[j]) : isinf(a[j]) ? a[j] == b[j] : fabs(a[j] - b[j]) <= tol;
            if (!ok) {
                cr_expect(ok, "%s (grid %u, block %u, arrays %d elements off): %s[%lld] = %.9g, "
                          "interpreter %.9g", k->name, grid, block, shift, q->name,
                          (long long)j, b[j], a[j]);
                bad++;
            }
        }
    }
    free_bufs(k, &want);
    free_bufs(k, &got);
}

static void check_emulated(void *so, const ptc_kir *k, unsigned grid, unsigned block)
{
    check_emulated_at(so, k, grid, block, 0);
}

static void check_unit(ptc_kir *const *ks, int n, const char *name)
{
    if (!have_cc())
        cr_skip_test("no C compiler (cc) to build the emulation with");
    char *unit = unit_of(ks, n);
    void *so = build_emu(unit, name);
    for (int i = 0; i < n; i++) {
        int grid, block;
        ptc_cuda_launch(ks[i], &ptc_cuda_archs[1], &grid, &block);
        /* sm_90's block; a grid of at most 4 blocks, which the loops stride over (the whole
         * grid would take long for nothing more) */
        check_emulated(so, ks[i], (unsigned)(grid < 4 ? grid : 4), (unsigned)block);
        check_emulated(so, ks[i], 3, 32);
        check_emulated(so, ks[i], 2, 96);
        /* arrays off 16-byte boundaries: packed loops (16-byte loads) run an element a thread */
        check_emulated_at(so, ks[i], 2, 96, 1);
    }
    dlclose(so);
    free(unit);
}

static void check_plan(const char *rel, const ptc_define *defs, int ndefs, const char *name)
{
    ptc_plan *p = plan_of(rel, defs, ndefs);
    check_unit(p->kernels, p->nkernels, name);
    ptc_plan_free(p);
}

static void check_par_plan(const char *rel, const ptc_define *defs, int ndefs, const char *name,
                           par_opts po)
{
    ptc_plan *p = plan_par(rel, defs, ndefs, false, &po);
    check_unit(p->kernels, p->nkernels, name);
    ptc_plan_free(p);
}

/* the emitter's corners: every expression kind, a row with a loop whose iterations read each
 * other's stores (run in order on one thread), a reduction inside a row's loop (per thread), a
 * max reduction, a store of the row, stores at the top level, a loop of one element */
static const char *const corner_kernels[] = {
    kir_every_kind,
    kir_bf16,
    kir_f16,
    "kernel scan(x: f32[200], y: out f32[200], n: out f32[5]) {\n"
    "    for r < 5 parallel {\n"
    "        y[r * 40] = x[r * 40]\n"
    "        for j < 39 {\n"
    "            y[r * 40 + j + 1] = y[r * 40 + j] * 0.5 + x[r * 40 + j + 1]\n"
    "        }\n"
    "        n[r] = sum(j < 40: y[r * 40 + j] * y[r * 40 + j])\n"
    "    }\n"
    "}\n",
    "kernel matvec(a: f32[1189], v: f32[41], y: out f32[29], m: out f32[1]) {\n"
    "    let t = maxr(i < 41: v[i])\n"
    "    m[0] = t\n"
    "    for r < 1 parallel {\n"
    "        for i < 29 {\n"
    "            y[i] = sum(j < 41: a[i * 41 + j] * v[j]) + t\n"
    "        }\n"
    "    }\n"
    "}\n",
    "kernel wide(x: f32[2311], b: f32[1], y: out f32[2311], s: out f32[1]) {\n"
    "    for i < 2311 parallel {\n"
    "        y[i] = x[i] * b[0] + 1.0\n"
    "    }\n"
    "    for r < 1 parallel {\n"
    "        s[0] = sum(i < 2311: max(x[i], -1.0)) + maxr(i < 2311: x[i])\n"
    "    }\n"
    "}\n",
};

TestSuite(cuda, .init = setup, .fini = teardown, .timeout = 600);

Test(cuda, corner_kernels_emulated)
{
    int n = (int)(sizeof corner_kernels / sizeof corner_kernels[0]);
    ptc_kir *ks[8];
    char err[512];
    for (int i = 0; i < n; i++) {
        ks[i] = ptc_kir_parse_text(corner_kernels[i], err, sizeof err);
        cr_assert_not_null(ks[i], "%s", err);
    }
    check_unit(ks, n, "corners");
    for (int i = 0; i < n; i++)
        ptc_kir_free(ks[i]);
}

/* The example models at a batch of 2 sequences of 8 (their widths as they are): the kernels
 * of the full sizes, with fewer rows, since each emulated barrier wakes every thread of a block
 * (the full sizes took 30 s; NVRTC and ptxas below take the full sizes). */
Test(cuda, example_kernels_emulated)
{
    ptc_define small[] = {{"batch", 2}, {"seq", 8}};
    check_plan("examples/gpt2_tiny.ptm", small, 2, "gpt2_tiny");
    check_plan("examples/llama_tiny.ptm", small, 2, "llama_tiny");
    check_plan("examples/bert_tiny.ptm", small, 2, "bert_tiny");
    check_plan("examples/moe_tiny.ptm", small, 2, "moe_tiny");
    check_plan("examples/mlp.ptm", (ptc_define[]){{"batch", 5}}, 1, "mlp");
}

/* The kernels of parallel plans: shards fuse differently (tensor-parallel slices, sequence-
 * parallel rows, ZeRO's flat shards, pipeline stages, experts), and each fused kernel is held to
 * the interpreter, with the parallel-loop contract and the emulation's race check on. */
Test(cuda, parallel_plan_kernels_emulated)
{
    ptc_define small[] = {{"batch", 4}, {"seq", 8}};
    check_par_plan("examples/gpt2_tiny.ptm", small, 2, "gpt2_dp2tp2",
                   (par_opts){{"dp", "tp"}, {2, 2}, .sp = true, .zero = 3});
    check_par_plan("examples/llama_tiny.ptm", small, 2, "llama_tp2",
                   (par_opts){{"tp"}, {2}, .sp = true, .zero = 0});
    check_par_plan("examples/gpt2_tiny.ptm", small, 2, "gpt2_pp2",
                   (par_opts){{"pp", "dp"}, {2, 2}, .zero = 1, .microbatches = 2});
    check_par_plan("examples/moe_tiny.ptm", small, 2, "moe_ep2",
                   (par_opts){{"dp", "ep"}, {2, 2}, .zero = 1});
}

/* Mixed precision's fused kernels (bf16 and f16 storage, the casts and the loss scaling fused
 * in) on a parallel plan: the parallel-loop contract, on random data (the emulation's float
 * sums may round a 16-bit result differently from the interpreter's double ones, so its
 * comparison, bit for bit on 16-bit outputs, is left to the f32 plans above). */
Test(cuda, mixed_precision_kernels_keep_the_contract)
{
    ptc_define small[] = {{"batch", 4}, {"seq", 8}};
    ptc_dtype precisions[2] = {PTC_BF16, PTC_F16};
    for (int i = 0; i < 2; i++) {
        par_opts po = {{"dp", "tp"}, {2, 2}, .sp = true, .zero = 1, .precision = precisions[i]};
        ptc_plan *p = plan_par("examples/gpt2_tiny.ptm", small, 2, false, &po);
        int half = 0; /* kernels with 16-bit operands: the ones this is for */
        for (int j = 0; j < p->nkernels; j++) {
            for (int q = 0; q < p->kernels[j]->nparams; q++)
                if (p->kernels[j]->params[q].dtype == precisions[i]) {
                    half++;
                    break;
                }
            char err[1024];
            bufs b = make_bufs(p->kernels[j], 7, 0);
            cr_expect_eq(ptc_kir_run_checked(p->kernels[j], b.args, err, sizeof err), 0, "%s", err);
            free_bufs(p->kernels[j], &b);
        }
        cr_expect_gt(half, 0, "%s: no fused kernel with 16-bit operands (of %d)",
                     ptc_dtype_name(precisions[i]), p->nkernels);
        ptc_plan_free(p);
    }
}

Test(cuda, odd_sizes_emulated)
{
    ptc_define gpt[] = {{"vocab", 67}, {"d", 10}, {"heads", 5}, {"layers", 1}, {"batch", 2},
                        {"seq", 7},    {"ctx", 7}};
    check_plan("examples/gpt2_tiny.ptm", gpt, 7, "gpt2_odd");
    ptc_define one[] = {{"vocab", 1}, {"d", 1}, {"heads", 1}, {"layers", 1}, {"batch", 1},
                        {"seq", 1},   {"ctx", 1}};
    check_plan("examples/gpt2_tiny.ptm", one, 7, "gpt2_one");
    ptc_define llama[] = {{"vocab", 37}, {"d", 14}, {"heads", 7}, {"kv_heads", 1},
                          {"n_layers", 1}, {"ffn", 29}, {"batch", 3}, {"seq", 5}};
    check_plan("examples/llama_tiny.ptm", llama, 8, "llama_odd");
}

/* ---- attention ---- */

/* The four attention kernels of shape a, emulated with sm's tiles at grid x block, against the
 * reference attention and attention_grad (double precision, the softmax recomputed). */
/* n floats in 16-bit storage of dtype t (exact: they hold values of t), or x itself for 0 */
static void *to_storage(float *x, int64_t n, int t)
{
    if (!t)
        return x;
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        h[i] = t == PTC_BF16 ? ptc_bf16_bits(x[i]) : ptc_f16_bits(x[i]);
    return h;
}

static float *from_storage(void *x, int64_t n, int t)
{
    if (!t)
        return x;
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        f[i] = t == PTC_BF16 ? ptc_bf16_value(((uint16_t *)x)[i]) : ptc_f16_value(((uint16_t *)x)[i]);
    return f;
}

static void check_attention(const ptc_cuda_attn *a, int sm)
{
    char *buf = NULL, flags[64], name[64];
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ptc_cuda_emit_prelude(f);
    ptc_cuda_emit_attention(a, "at", f);
    fclose(f);
    snprintf(flags, sizeof flags, "-DPTC_CUDA_EMU_ARCH=%d", sm * 10);
    snprintf(name, sizeof name, "attn_%lld_%lld_%lld_%lld_%d%s%s", (long long)a->seq,
             (long long)a->head_dim, (long long)a->heads, (long long)a->h0, sm,
             a->mma == PTC_BF16 ? "_bf16" : a->mma == PTC_F16 ? "_f16" : "",
             a->io == PTC_BF16 ? "_io_bf16" : a->io == PTC_F16 ? "_io_f16" : "");
    void *so = build_emu_with(buf, name, flags);
    free(buf);
    launch_fn launch = emu_launcher(so);

    /* 16-bit storage (a->io): the operands rounded to it and stored in 2 bytes, the results read
     * back from 2 bytes */
    attn_ref r = attn_ref_make(a->batch, a->seq, a->kv_seq, a->heads, a->kv_heads, a->head_dim,
                               a->causal, a->ratio, a->h0, a->mma ? a->mma : a->io);
    int64_t nq = r.nq, nk = r.nk, ns = r.ns;
    void *q = to_storage(r.q, nq, a->io), *k = to_storage(r.k, nk, a->io);
    void *v = to_storage(r.v, nk, a->io), *dy = to_storage(r.dy, nq, a->io);
    size_t es = a->io ? 2 : 4;

    const ptc_cuda_arch *arch = &ptc_cuda_archs[sm >= 90 ? 1 : 0];
    unsigned blocks[2] = {0, 32}, grids[2] = {0, 3};
    for (int c = 0; c < 2; c++) {
        void *o = calloc((size_t)nq, es), *dq = calloc((size_t)nq, es), *dk = calloc((size_t)nk, es);
        void *dv = calloc((size_t)nk, es);
        float *lse = calloc((size_t)ns, 4), *ds = calloc((size_t)ns, 4);
        void *args[4][8] = {{q, k, v, o},
                            {q, k, v, dy, lse, ds},
                            {q, k, v, dy, lse, ds, dk, dv},
                            {q, k, v, dy, lse, ds, dq}};
        for (int w = 0; w < PTC_CUDA_ATTN_NKERNELS; w++) {
            int grid, block;
            ptc_cuda_attention_launch(a, (ptc_cuda_attn_kernel)w, arch, &grid, &block);
            if (c == 0 && grid > 4)
                grid = 4; /* the loops stride over the tiles */
            char sym[64];
            snprintf(sym, sizeof sym, "k_at_%s__emu", ptc_cuda_attn_names[w]);
            cr_assert_eq(launch(emu_sym(so, sym), args[w], c ? grids[c] : (unsigned)grid,
                                c ? blocks[c] : (unsigned)block),
                         0, "%s: %s", sym, emu_error(so));
        }
        char what[128];
        snprintf(what, sizeof what, "%s, block %s", name, c ? "32" : "of the architecture");
        float *fo = from_storage(o, nq, a->io), *fdq = from_storage(dq, nq, a->io);
        float *fdk = from_storage(dk, nk, a->io), *fdv = from_storage(dv, nk, a->io);
        attn_ref_expect(&r, fo, fdq, fdk, fdv, what);
        if (a->io)
            free(fo), free(fdq), free(fdk), free(fdv);
        free(o), free(dq), free(dk), free(dv), free(lse), free(ds);
    }
    if (a->io)
        free(q), free(k), free(v), free(dy);
    attn_ref_free(&r);
    dlclose(so);
}

/* Shapes that cross the tiles (33 and 70 rows against tiles of 32 and 64), odd head sizes,
 * grouped-query attention, keys longer than queries, one of everything. */
/* ---- the moe routing kernels (cuda_moe.c) against the reference, emulated ---- */

typedef struct route_case {
    int64_t B, S, K, E;
    double capacity;
} route_case;

/* the routing kernel of shape m on (in, out), emulated, at two launch sizes; every output equal
 * to the reference's bit for bit (the same arithmetic in the same order). The reference's results
 * go to keep (the next op's operands), or are dropped where keep is NULL. */
static void check_route(void *so, const char *name, const ptc_cuda_moe_route *m,
                        const ptrt_kcall *k, const ptc_type *it, void *const *in,
                        const ptc_type *ot, int nout, void *const *keep, const char *what)
{
    void *want[2], *got[2], *args[8];
    char err[256], sym[64];
    int nin = k->nin;
    for (int i = 0; i < nin; i++)
        args[i] = in[i];
    for (int o = 0; o < nout; o++) {
        size_t bytes = 4 * (size_t)ptc_type_numel(&ot[o]);
        want[o] = keep ? keep[o] : malloc(bytes), got[o] = malloc(bytes);
        memset(want[o], 0x7f, bytes);
        args[nin + o] = got[o];
    }
    cr_assert_eq(ptrt_backend_ref.kernel(k, it, in, ot, want, err, sizeof err), 0, "%s: %s", what,
                 err);
    snprintf(sym, sizeof sym, "k_%s__emu", name);
    emu_fn fn = emu_sym(so, sym);
    launch_fn launch = emu_launcher(so);
    unsigned sizes[2][2] = {{1, 32}, {3, 64}};
    for (int l = 0; l < 2; l++) {
        for (int o = 0; o < nout; o++)
            memset(got[o], 0x55, 4 * (size_t)ptc_type_numel(&ot[o]));
        cr_assert_eq(launch(fn, args, sizes[l][0], sizes[l][1]), 0, "%s: %s", what, emu_error(so));
        for (int o = 0; o < nout; o++)
            cr_expect_eq(memcmp(want[o], got[o], 4 * (size_t)ptc_type_numel(&ot[o])), 0,
                         "%s (%s): result %d differs from the reference (grid %u x %u)", what,
                         ptc_ops[m->op].name, o, sizes[l][0], sizes[l][1]);
    }
    for (int o = 0; o < nout; o++) {
        if (!keep)
            free(want[o]);
        free(got[o]);
    }
}

/* Every routing op on sizes with 1, odd and prime dimensions, ties among the probabilities (to
 * the lower expert), capacities that drop nothing, some, and all but one choice an expert (1e-20),
 * and decimals whose double is not exact (0.1, 1.1): the kernels chained as a layer runs them
 * (top-k and its gradient, count, prefix, route, frac, stats, and expert parallelism's kept
 * counts of the route), each on the reference's own operands. */
Test(cuda, moe_routing_kernels_emulated)
{
    if (!have_cc())
        cr_skip_test("no C compiler (cc) to build the emulation with");
    static const route_case cases[] = {{1, 1, 1, 1, 0},    {2, 7, 2, 5, 0},     {3, 13, 3, 4, 1.1},
                                       {1, 31, 2, 8, 0.1}, {2, 5, 1, 3, 1e-20}, {4, 3, 2, 2, 0.75},
                                       {1, 17, 4, 7, 2.5}};
    int nc = (int)(sizeof cases / sizeof cases[0]);
    uint64_t seed = 12345;
    for (int c = 0; c < nc; c++) {
        const route_case *rc = &cases[c];
        int64_t B = rc->B, S = rc->S, K = rc->K, E = rc->E, R = B * S;
        ptc_cuda_moe_route shapes[8] = {
            {.op = PTC_OP_MOE_TOPK, .R = R, .E = E, .K = K, .normalize = c % 2 == 0},
            {.op = PTC_OP_MOE_TOPK_GRAD, .R = R, .E = E, .K = K, .normalize = c % 2 == 0},
            {.op = PTC_OP_MOE_COUNT, .B = B, .S = S, .K = K, .E = E},
            {.op = PTC_OP_MOE_PREFIX, .B = B, .K = K, .E = E},
            {.op = PTC_OP_MOE_ROUTE, .B = B, .S = S, .K = K, .E = E},
            {.op = PTC_OP_MOE_FRAC, .K = K, .E = E},
            {.op = PTC_OP_MOE_STATS, .K = K, .E = E},
            {.op = PTC_OP_MOE_EP_COUNT, .R = R * K, .E = E}};
        for (int s = 4; s <= 6; s += 2) {
            int e10 = 0;
            shapes[s].cap = ptc_moe_capacity_decimal(rc->capacity, K, E, &shapes[s].digits, &e10);
            shapes[s].e10 = e10;
        }
        char *unit = NULL, name[8][32];
        size_t len = 0;
        FILE *f = open_memstream(&unit, &len);
        ptc_cuda_emit_unit(NULL, 0, f); /* (the prelude) */
        for (int s = 0; s < 8; s++) {
            snprintf(name[s], sizeof name[s], "moeroute%d", s);
            ptc_cuda_emit_moe_route(&shapes[s], name[s], f);
        }
        fclose(f);
        char so_name[32];
        snprintf(so_name, sizeof so_name, "routing%d", c);
        void *so = build_emu(unit, so_name);
        free(unit);

        /* probabilities on a few levels (ties), ids from top-k, gate gradients */
        float *pr = malloc(sizeof(float) * (size_t)(R * E)),
              *gate = malloc(sizeof(float) * (size_t)(R * K));
        float *dg = malloc(sizeof(float) * (size_t)(R * K));
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(R * K)),
                *cnt = malloc(sizeof(int32_t) * (size_t)(B * K * E));
        int32_t *pre = malloc(sizeof(int32_t) * (size_t)(B * K * E)),
                *tot = malloc(sizeof(int32_t) * (size_t)(K * E));
        for (int64_t i = 0; i < R * E; i++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            pr[i] = 0.125f * (float)((seed >> 33) % 5) + 0.01f;
        }
        for (int64_t i = 0; i < R * K; i++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            dg[i] = (float)((seed >> 40) % 1000) / 500.0f - 1.0f;
        }
        ptc_type tp = {.dtype = PTC_F32, .rank = 2, .dims = {R, E}};
        ptc_type tk = {.dtype = PTC_I32, .rank = 3, .dims = {B, S, K}};
        ptc_type tkf = {.dtype = PTC_F32, .rank = 3, .dims = {B, S, K}};
        ptc_type tc = {.dtype = PTC_I32, .rank = 3, .dims = {B, K, E}};
        ptc_type tt = {.dtype = PTC_I32, .rank = 2, .dims = {K, E}};
        ptc_type tf = {.dtype = PTC_F32, .rank = 1, .dims = {E}};
        ptc_type t3 = {.dtype = PTC_F32, .rank = 1, .dims = {3}};
        char what[96];
        snprintf(what, sizeof what, "B %lld S %lld K %lld E %lld capacity %g", (long long)B,
                 (long long)S, (long long)K, (long long)E, rc->capacity);
        ptrt_kcall k = {.op = PTC_OP_MOE_TOPK,
                        .nin = 1,
                        .nout = 2,
                        .attrs = ptc_attrs_default(PTC_OP_MOE_TOPK)};
        k.attrs.top_k = K, k.attrs.normalize = shapes[0].normalize, k.attrs.capacity = rc->capacity;
        int32_t *route = malloc(sizeof(int32_t) * (size_t)(R * K)); /* (kept or -1) */
        /* (the reference's results feed the next op) */
        check_route(so, name[0], &shapes[0], &k, &tp, (void *[]){pr}, (ptc_type[]){tk, tkf}, 2,
                    (void *[]){ids, gate}, what);
        k.op = PTC_OP_MOE_TOPK_GRAD, k.nin = 3, k.nout = 1;
        check_route(so, name[1], &shapes[1], &k, (ptc_type[]){tp, tk, tkf}, (void *[]){pr, ids, dg},
                    &tp, 1, NULL, what);
        k.op = PTC_OP_MOE_COUNT, k.nin = 1, k.attrs.n = E;
        check_route(so, name[2], &shapes[2], &k, &tk, (void *[]){ids}, &tc, 1, (void *[]){cnt},
                    what);
        k.op = PTC_OP_MOE_PREFIX, k.nout = 2;
        check_route(so, name[3], &shapes[3], &k, &tc, (void *[]){cnt}, (ptc_type[]){tc, tt}, 2,
                    (void *[]){pre, tot}, what);
        k.op = PTC_OP_MOE_ROUTE, k.nin = 3, k.nout = 1;
        check_route(so, name[4], &shapes[4], &k, (ptc_type[]){tk, tc, tt},
                    (void *[]){ids, pre, tot}, &tk, 1, (void *[]){route}, what);
        k.op = PTC_OP_MOE_FRAC, k.nin = 1;
        check_route(so, name[5], &shapes[5], &k, &tt, (void *[]){tot}, &tf, 1, NULL, what);
        k.op = PTC_OP_MOE_STATS;
        check_route(so, name[6], &shapes[6], &k, &tt, (void *[]){tot}, &t3, 1, NULL, what);
        k.op = PTC_OP_MOE_EP_COUNT;
        ptc_type te = {.dtype = PTC_I32, .rank = 1, .dims = {E}};
        check_route(so, name[7], &shapes[7], &k, &tk, (void *[]){route}, &te, 1, NULL, what);
        free(route);
        free(pr), free(gate), free(dg), free(ids), free(cnt), free(pre), free(tot);
        dlclose(so);
    }
}

Test(cuda, attention_emulated)
{
    if (!have_cc())
        cr_skip_test("no C compiler (cc) to build the emulation with");
    const ptc_cuda_attn shapes[] = {
        {.batch = 2, .seq = 7, .kv_seq = 7, .heads = 4, .kv_heads = 2, .head_dim = 8, .causal = true},
        {.batch = 1, .seq = 33, .kv_seq = 33, .heads = 3, .kv_heads = 1, .head_dim = 5, .causal = true},
        {.batch = 2, .seq = 5, .kv_seq = 9, .heads = 2, .kv_heads = 2, .head_dim = 4, .causal = false},
        {.batch = 1, .seq = 1, .kv_seq = 1, .heads = 1, .kv_heads = 1, .head_dim = 1, .causal = true},
        {.batch = 1, .seq = 70, .kv_seq = 70, .heads = 2, .kv_heads = 1, .head_dim = 64, .causal = true},
        /* attention_shard: ranks 0, 1 and 3 of 4 with 8 query heads over 2 kv heads (ratio 4:
         * rank 1's heads 2, 3 read kv head 0, rank 3's heads 6, 7 kv head 1; a kv head no local
         * head reads gets zero gradients), and rank 1 of 2 with 6 heads over 3 kv heads (ratio
         * 2: its heads 3, 4, 5 read kv heads 1, 2, 2) */
        {.batch = 2, .seq = 9, .kv_seq = 9, .heads = 2, .kv_heads = 2, .head_dim = 4, .h0 = 0, .ratio = 4, .causal = true},
        {.batch = 2, .seq = 9, .kv_seq = 9, .heads = 2, .kv_heads = 2, .head_dim = 4, .h0 = 2, .ratio = 4, .causal = true},
        {.batch = 1, .seq = 33, .kv_seq = 33, .heads = 2, .kv_heads = 2, .head_dim = 8, .h0 = 6, .ratio = 4, .causal = true},
        {.batch = 1, .seq = 5, .kv_seq = 5, .heads = 3, .kv_heads = 3, .head_dim = 4, .h0 = 3, .ratio = 2, .causal = false},
        /* over 16-bit storage (the casts around it folded in), a head size no tensor core takes */
        {.batch = 1, .seq = 33, .kv_seq = 33, .heads = 3, .kv_heads = 1, .head_dim = 5, .causal = true, .io = PTC_BF16},
        {.batch = 2, .seq = 9, .kv_seq = 9, .heads = 2, .kv_heads = 2, .head_dim = 4, .h0 = 2, .ratio = 4, .causal = true, .io = PTC_F16},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_attention(&shapes[i], 90);
        if (!SANITIZED) /* (sm_80: its own grid; the same code, which the sanitizers saw) */
            check_attention(&shapes[i], 80);
    }
}

/* The tensor-core kernels (a 16-bit plan's attention): query and key tiles crossed (70 and 130
 * rows against tiles of 64 or 32, and of 16 rows a warp), head sizes 16 to 128, grouped-query
 * and sharded heads, keys longer than queries, f16 as well as bf16. */
Test(cuda, attention_tensor_cores_emulated)
{
    if (!have_cc())
        cr_skip_test("no C compiler (cc) to build the emulation with");
    const ptc_cuda_attn shapes[] = {
        {.batch = 2, .seq = 7, .kv_seq = 7, .heads = 4, .kv_heads = 2, .head_dim = 16, .causal = true, .mma = PTC_BF16},
        {.batch = 1, .seq = 70, .kv_seq = 70, .heads = 2, .kv_heads = 1, .head_dim = 64, .causal = true, .mma = PTC_BF16},
        {.batch = 1, .seq = 130, .kv_seq = 130, .heads = 1, .kv_heads = 1, .head_dim = 32, .causal = true, .mma = PTC_BF16},
        {.batch = 2, .seq = 5, .kv_seq = 80, .heads = 2, .kv_heads = 2, .head_dim = 48, .causal = false, .mma = PTC_F16},
        {.batch = 1, .seq = 33, .kv_seq = 33, .heads = 2, .kv_heads = 2, .head_dim = 16, .h0 = 6, .ratio = 4, .causal = true, .mma = PTC_BF16},
        {.batch = 1, .seq = 1, .kv_seq = 1, .heads = 1, .kv_heads = 1, .head_dim = 16, .causal = true, .mma = PTC_F16},
        /* above head size 64: tiles of 32, bwd_kv's k and v rows in shared memory */
        {.batch = 1, .seq = 70, .kv_seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 128, .causal = true, .mma = PTC_BF16},
        {.batch = 2, .seq = 9, .kv_seq = 41, .heads = 1, .kv_heads = 1, .head_dim = 80, .causal = false, .mma = PTC_F16},
        /* over 16-bit storage: 8-byte row loads, results rounded as stored */
        {.batch = 1, .seq = 70, .kv_seq = 70, .heads = 2, .kv_heads = 1, .head_dim = 64, .causal = true, .mma = PTC_BF16, .io = PTC_BF16},
        {.batch = 1, .seq = 33, .kv_seq = 33, .heads = 2, .kv_heads = 2, .head_dim = 16, .h0 = 6, .ratio = 4, .causal = true, .mma = PTC_F16, .io = PTC_F16},
        {.batch = 1, .seq = 70, .kv_seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 128, .causal = true, .mma = PTC_BF16, .io = PTC_BF16},
    };
    /* under the sanitizers (a shape's build and run take 2.3 times as long there) the shapes
     * whose paths the others do not take: every tile remainder, head size and storage once */
    const bool sanitized_subset[] = {true, false, true, true, false, true,
                                     false, true, true, true, true};
    _Static_assert(sizeof sanitized_subset / sizeof sanitized_subset[0] ==
                       sizeof shapes / sizeof shapes[0], "a subset flag per shape");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!SANITIZED || sanitized_subset[i])
            check_attention(&shapes[i], 90);
    cr_expect(ptc_cuda_attn_mma_fits(64) && ptc_cuda_attn_mma_fits(16));
    cr_expect(ptc_cuda_attn_mma_fits(128) && ptc_cuda_attn_mma_fits(80));
    cr_expect(!ptc_cuda_attn_mma_fits(8) && !ptc_cuda_attn_mma_fits(24) && !ptc_cuda_attn_mma_fits(144));
}

/* ---- a whole training step on the generated CUDA kernels ----
 *
 * A backend for this test only: host memory and the CPU backend's GEMMs and kernels, but every
 * fused kernel of the plan and every attention (forward and backward) run as the generated CUDA
 * C, in the emulation, at sm_90's block sizes. One step of it against one step of the CPU
 * backend: the plan's kernels in the order, shapes and aliasing the program gives them, the
 * attention's statistics pass included. */

static struct emu_state {
    void *so;
    launch_fn launch;
    ptc_cuda_attn at[16];
    int nat;
} emu;

static int emu_prepare(const ptc_plan *p, void **state, char *err, size_t errn)
{
    (void)err, (void)errn;
    char *unit = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&unit, &len);
    ptc_cuda_emit_plan(p, f);
    fclose(f);
    emu.so = build_emu(unit, "step");
    free(unit);
    emu.launch = emu_launcher(emu.so);
    emu.nat = ptc_cuda_plan_attentions(p, emu.at, 16);
    cr_assert_leq(emu.nat, 16);
    *state = &emu;
    return 0;
}

static void emu_release(void *state)
{
    (void)state;
    dlclose(emu.so);
    emu.so = NULL;
}

static int emu_fused(void *state, const ptc_plan *p, int k, void *const *args, char *err,
                     size_t errn)
{
    (void)state;
    char sym[256];
    snprintf(sym, sizeof sym, "k_%s__emu", p->kernels[k]->name);
    int grid, block;
    ptc_cuda_launch(p->kernels[k], &ptc_cuda_archs[1], &grid, &block);
    int rc =
        emu.launch(emu_sym(emu.so, sym), args, (unsigned)(grid < 4 ? grid : 4), (unsigned)block);
    if (rc)
        snprintf(err, errn, "%s: %s", sym, emu_error(emu.so));
    return rc;
}

static void emu_attention(int id, ptc_cuda_attn_kernel w, void *const *args)
{
    int grid, block;
    ptc_cuda_attention_launch(&emu.at[id], w, &ptc_cuda_archs[1], &grid, &block);
    char sym[64];
    snprintf(sym, sizeof sym, "k_attn%d_%s__emu", id, ptc_cuda_attn_names[w]);
    cr_assert_eq(
        emu.launch(emu_sym(emu.so, sym), args, (unsigned)(grid < 4 ? grid : 4), (unsigned)block), 0,
        "%s: %s", sym, emu_error(emu.so));
}

static int emu_kernel(const ptrt_kcall *n, const ptc_type *it, void *const *in, const ptc_type *ot,
                      void *const *out, char *err, size_t errn)
{
    if (n->op != PTC_OP_ATTENTION && n->op != PTC_OP_ATTENTION_GRAD)
        return ptrt_backend_cpu.kernel(n, it, in, ot, out, err, errn);
    int64_t heads = n->attrs.heads, kv = n->attrs.kv_heads ? n->attrs.kv_heads : heads;
    ptc_cuda_attn a = {.batch = it[0].dims[0], .seq = it[0].dims[1], .kv_seq = it[1].dims[1],
                       .heads = heads, .kv_heads = kv, .head_dim = it[0].dims[2] / heads,
                       .causal = n->attrs.causal};
    int id = -1;
    for (int i = 0; i < emu.nat && id < 0; i++)
        if (ptc_cuda_attn_same(&emu.at[i], &a))
            id = i;
    cr_assert_geq(id, 0, "an attention the plan's unit has no kernels for");
    if (n->op == PTC_OP_ATTENTION) {
        emu_attention(id, PTC_CUDA_ATTN_FWD, (void *[]){in[0], in[1], in[2], out[0]});
        return 0;
    }
    size_t ns = (size_t)(a.batch * a.heads * a.seq);
    float *lse = malloc(ns * 4), *ds = malloc(ns * 4);
    emu_attention(id, PTC_CUDA_ATTN_STATS, (void *[]){in[0], in[1], in[2], in[3], lse, ds});
    emu_attention(id, PTC_CUDA_ATTN_BWD_KV,
                  (void *[]){in[0], in[1], in[2], in[3], lse, ds, out[1], out[2]});
    emu_attention(id, PTC_CUDA_ATTN_BWD_Q, (void *[]){in[0], in[1], in[2], in[3], lse, ds, out[0]});
    free(lse);
    free(ds);
    return 0;
}

/* one training step of plan p on backend be: initial state of seed 3, random inputs of seed 4 */
static ptrt_exec *one_step(const ptc_plan *p, const ptrt_backend *be)
{
    char err[1024];
    ptrt_exec_opts o = {.backend = be, .drop = -1};
    ptrt_exec *x = ptrt_exec_new(p, 0, &o, err, sizeof err);
    cr_assert_not_null(x, "%s", err);
    const ptc_program *pg = ptrt_exec_program(x);
    ptrt_exec_init_state(x, 3);
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->kind != PTC_BUF_INPUT || bf->view >= 0)
            continue;
        float *v = ptrt_exec_data(x, b);
        if (bf->role == PTC_ROLE_LR)
            v[0] = 1e-2f;
        else if (bf->role == PTC_ROLE_STEP || bf->role == PTC_ROLE_MAX_NORM)
            v[0] = 1.0f;
        else
            cr_assert_eq(ptrt_exec_random_input(x, b, bf->name, 4, err, sizeof err), 0, "%s", err);
    }
    cr_assert_eq(ptrt_exec_run(x, PTRT_ENTRY_STEP, 1, err, sizeof err), 0, "%s: %s", be->name, err);
    return x;
}

static void check_step(const char *rel, const ptc_define *defs, int ndefs)
{
    if (!have_cc())
        cr_skip_test("no C compiler (cc) to build the emulation with");
    ptc_plan *p = plan_with(rel, defs, ndefs, true);
    ptrt_backend be = ptrt_backend_cpu;
    be.name = "cuda-emulated";
    be.kernel = emu_kernel;
    be.prepare = emu_prepare;
    be.release = emu_release;
    be.fused = emu_fused;
    ptrt_exec *want = one_step(p, &ptrt_backend_cpu), *got = one_step(p, &be);
    const ptc_program *pg = ptrt_exec_program(want);
    const float *la = ptrt_exec_data(want, pg->loss), *lb = ptrt_exec_data(got, pg->loss);
    cr_expect_leq(fabs(la[0] - lb[0]), 1e-5 * fabs(la[0]) + 1e-7, "%s: loss %.9g, cpu %.9g", rel,
                  lb[0], la[0]);
    /* the gradients, and AdamW's moments (smooth in them; the first step's update itself is
     * lr * sign(g) wherever |g| >> eps, so float noise in a gradient near 0 moves a weight by up
     * to lr: the update is tested in the kernel tests against the interpreter instead) */
    int nparams = 0;
    for (int k = 0; k < pg->noutputs; k++) {
        int b = pg->outputs[k];
        char what[256];
        snprintf(what, sizeof what, "%s: gradient output %d (buffer b%d)", rel, k, b);
        expect_close(ptrt_exec_data(got, b), ptrt_exec_data(want, b),
                     ptc_type_numel(&pg->bufs[b].type), what);
        nparams++;
    }
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        if (bf->kind != PTC_BUF_STATE || bf->view >= 0)
            continue;
        char what[256];
        snprintf(what, sizeof what, "%s: optimizer state %s", rel, bf->name);
        expect_close(ptrt_exec_data(got, b), ptrt_exec_data(want, b), ptc_type_numel(&bf->type),
                     what);
    }
    cr_expect_gt(nparams, 0);
    ptrt_exec_free(want);
    ptrt_exec_free(got);
    ptc_plan_free(p);
}

Test(cuda, training_step_on_emulated_kernels)
{
    ptrt_cpu_set_threads(2);
    ptc_define small[] = {{"batch", 2}, {"seq", 8}};
    check_step("examples/gpt2_tiny.ptm", small, 2);
    check_step("examples/llama_tiny.ptm", small, 2);
    check_step("examples/bert_tiny.ptm", small, 2);
    check_step("examples/moe_tiny.ptm", small, 2);
}

/* ---- NVRTC and ptxas ---- */

static const char *ptxas(void)
{
    static char path[512];
    const char *home = getenv("CUDA_HOME");
    snprintf(path, sizeof path, "%s/bin/ptxas", home && *home ? home : "/usr/local/cuda");
    return access(path, X_OK) == 0 ? path : NULL;
}

/* the n shapes' kernels k_<prefix><i>_<kernels[w]> are entries of ptx */
static void expect_entries(const char *ptx, const char *rel, const char *prefix, int n,
                           const char *const *kernels, int nk)
{
    for (int i = 0; i < n; i++)
        for (int w = 0; w < nk; w++) {
            char entry[256];
            snprintf(entry, sizeof entry, ".entry k_%s%d_%s(", prefix, i, kernels[w]);
            cr_expect_not_null(strstr(ptx, entry), "%s: no %s in the PTX", rel, entry);
        }
}

/* po: the plan's options (NULL: one rank, f32); mma: the type its attention's tensor-core kernels
 * take (0: it has none); defs: the model's constants changed */
static void nvrtc_check_with(const char *rel, const char *name, const par_opts *po, int mma,
                             const ptc_define *defs, int ndefs)
{
    char err[8192];
    if (ptrt_cuda_open(PTRT_CUDA_NVRTC, err, sizeof err))
        cr_skip_test("%s", err);
    if (!ptxas())
        cr_skip_test("no ptxas in $CUDA_HOME/bin or /usr/local/cuda/bin");
    ptc_plan *p = po ? plan_par(rel, defs, ndefs, false, po) : plan_of(rel, defs, ndefs);
    /* the unit the CUDA backend compiles (with a kernel of every other instruction) */
    char *unit = ptrt_cuda_unit(p, 90, err, sizeof err);
    cr_assert_not_null(unit, "%s: %s", rel, err);
    int entries = 0;
    for (const char *u = unit; (u = strstr(u, "\nPTC_KERNEL ")); u++)
        entries++;
    cr_expect_gt(entries, 0, "%s: no kernels in the unit", rel);
    if (SANITIZED) {
        /* the sanitizers check the unit's emission (above); NVRTC and ptxas are the plain
         * build's to run: they give the sanitizers nothing to check, and NVRTC's allocations
         * under ASan's malloc made these two tests 160 s of the sanitizer build's run */
        free(unit);
        ptc_plan_free(p);
        return;
    }
    for (int a = 0; a < ptc_cuda_narchs; a++) {
        int sm = ptc_cuda_archs[a].sm, cached;
        char *ptx = ptrt_nvrtc_compile(unit, name, sm, "", &cached, err, sizeof err);
        cr_assert_not_null(ptx, "%s", err);
        cr_expect_eq(cached, 0);
        for (int k = 0; k < p->nkernels; k++) {
            char entry[256];
            snprintf(entry, sizeof entry, ".entry k_%s(", p->kernels[k]->name);
            cr_expect_not_null(strstr(ptx, entry), "%s: no %s in the PTX for sm_%d", rel, entry, sm);
        }
        ptc_cuda_attn at[16];
        int nat = ptc_cuda_plan_attentions(p, at, 16);
        for (int i = 0; i < nat; i++)
            cr_expect_eq(at[i].mma, mma, "%s: attention %d's tensor-core type", rel, i);
        expect_entries(ptx, rel, "attn", nat, ptc_cuda_attn_names, PTC_CUDA_ATTN_NKERNELS);
        ptc_cuda_moe moe[16]; /* the experts' and expert parallelism's row kernels */
        ptc_cuda_moe_rows rows[16];
        int nmoe = ptc_cuda_plan_moes(p, moe, 16);
        cr_expect_eq(nmoe > 0, strstr(rel, "moe") != NULL, "%s: %d expert shapes", rel, nmoe);
        expect_entries(ptx, rel, "moe", nmoe, ptc_cuda_moe_names, PTC_CUDA_MOE_NKERNELS);
        expect_entries(ptx, rel, "moerows", ptc_cuda_plan_moe_rows(p, rows, 16),
                       ptc_cuda_moe_rows_names, PTC_CUDA_MOE_ROWS_NKERNELS);
        ptc_cuda_moe_route routes[64]; /* a moe layer routes: top-k, counts, ... on the GPU */
        int nroutes = ptc_cuda_plan_moe_routes(p, routes, 64);
        cr_expect_eq(nroutes >= 7, strstr(rel, "moe") != NULL, "%s: %d routing shapes", rel,
                     nroutes);
        for (int i = 0; i < nroutes; i++) {
            char entry[64];
            snprintf(entry, sizeof entry, ".entry k_moeroute%d(", i);
            cr_expect_not_null(strstr(ptx, entry), "%s: no %s in the PTX", rel, entry);
        }
        int got = 0;
        for (const char *u = ptx; (u = strstr(u, ".entry k_")); u++)
            got++;
        cr_expect_eq(got, entries, "%s: %d kernels in the unit, %d in the PTX for sm_%d", rel,
                     entries, got, sm);
        char path[512], cmd[2048];
        snprintf(path, sizeof path, "%s/%s_sm%d.ptx", tmpdir, name, sm);
        write_text(path, ptx);
        snprintf(cmd, sizeof cmd, "%s -arch=sm_%d -o %s/%s_sm%d.cubin %s", ptxas(), sm, tmpdir,
                 name, sm, path);
        cr_expect_eq(system(cmd), 0, "ptxas refused %s's kernels for sm_%d: %s", rel, sm, cmd);
        free(ptx);
    }
    free(unit);
    ptc_plan_free(p);
}

static void nvrtc_check(const char *rel, const char *name, const par_opts *po, int mma)
{
    nvrtc_check_with(rel, name, po, mma, NULL, 0);
}

Test(cuda, nvrtc_and_ptxas_every_example)
{
    /* (under the sanitizers: the units' emission alone, see nvrtc_check_with) */
    static const char *const models[] = {"gpt2_tiny", "gpt2", "llama_tiny", "llama", "bert_tiny",
                                         "moe_tiny", "moe", "mlp"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "examples/%s.ptm", models[i]);
        nvrtc_check(rel, models[i], NULL, 0);
    }
    par_opts ep2 = {.axes = {"ep"}, .sizes = {2}}; /* expert parallelism's row kernels (moe_pack, ...) */
    nvrtc_check("examples/moe_tiny.ptm", "moe_tiny_ep2", &ep2, 0);
    /* a capacity: the routing kernels' exact ceiling in 128-bit integers, which NVRTC takes only
     * with --device-int128 (the emulation's host compiler took it; a GPU found the difference) */
    ptc_define cap[] = {{"capacity_factor", 1.0}};
    nvrtc_check_with("examples/moe_tiny.ptm", "moe_tiny_capacity", NULL, 0, cap, 1);
}

/* 16-bit plans: their attention on tensor cores (mma.sync and the packing conversions are PTX
 * that only ptxas checks): GPT-2 124M's head size 64, tensor-parallel grouped-query heads
 * (attention_shard) in f16, and head size 128 */
Test(cuda, nvrtc_and_ptxas_tensor_core_attention)
{
    par_opts bf = {.precision = PTC_BF16}, f16 = {{"tp"}, {4}, .precision = PTC_F16};
    nvrtc_check("examples/gpt2.ptm", "gpt2_bf16", &bf, PTC_BF16);
    nvrtc_check("examples/llama_tiny.ptm", "llama_tiny_f16_tp4", &f16, PTC_F16);
    /* head size 128: tiles of 32, bwd_kv's k and v rows in shared memory (35 KB of the 48) */
    ptc_define wide[] = {{"d", 256}, {"heads", 2}, {"kv_heads", 1}};
    nvrtc_check_with("examples/llama_tiny.ptm", "llama_tiny_bf16_dh128", &bf, PTC_BF16, wide, 3);
}

Test(cuda, nvrtc_cache)
{
    char err[8192];
    if (ptrt_cuda_open(PTRT_CUDA_NVRTC, err, sizeof err))
        cr_skip_test("%s", err);
    ptc_kir *k = ptc_kir_parse_text(corner_kernels[0], err, sizeof err);
    char *unit = unit_of(&k, 1), dir[512];
    snprintf(dir, sizeof dir, "%s/cache", tmpdir);
    int c1, c2, c3;
    char *a = ptrt_nvrtc_compile(unit, "every", 80, dir, &c1, err, sizeof err);
    char *b = ptrt_nvrtc_compile(unit, "every", 80, dir, &c2, err, sizeof err);
    char *c = ptrt_nvrtc_compile(unit, "every", 90, dir, &c3, err, sizeof err);
    cr_assert(a && b && c, "%s", err);
    cr_expect_eq(c1, 0);
    cr_expect_eq(c2, 1, "the second compile did not come from the cache");
    cr_expect_eq(c3, 0, "another architecture must not share the cache entry");
    cr_expect_str_eq(a, b);
    cr_expect_neq(strcmp(a, c), 0);
    /* a compile error comes back with NVRTC's log */
    char *bad = ptrt_nvrtc_compile("extern \"C\" __global__ void f() { undeclared(); }", "bad", 80,
                                   "", &c1, err, sizeof err);
    cr_expect_null(bad);
    cr_expect_not_null(strstr(err, "undeclared"), "%s", err);
    free(a);
    free(b);
    free(c);
    free(unit);
    ptc_kir_free(k);
}

/* ---- dlopen ---- */

Test(cuda, missing_libraries_are_named)
{
    char err[1024];
    ptrt_cuda_set_search_path(tmpdir); /* an empty directory */
    static const char *const sonames[] = {NULL, "libnvrtc.so", "libcublasLt.so", "libnccl.so"};
    for (int lib = PTRT_CUDA_NVRTC; lib < PTRT_CUDA_NLIBS; lib++) {
        cr_expect_eq(ptrt_cuda_open((ptrt_cuda_lib)lib, err, sizeof err), -1);
        cr_expect_not_null(strstr(err, sonames[lib]), "%s", err);
        cr_expect_not_null(strstr(err, "was not found"), "%s", err);
    }
    ptrt_cuda_set_search_path(NULL);
    if (ptrt_cuda_open(PTRT_CUDA_DRIVER, err, sizeof err) == 0) {
        cr_log_info("this machine has a CUDA driver: its absence is not tested");
    } else {
        cr_expect_not_null(strstr(err, "libcuda.so.1"), "%s", err);
        cr_expect_eq(ptrt_cuda_probe(err, sizeof err), -1);
        cr_expect_not_null(strstr(err, "--device cuda: the CUDA driver (libcuda.so.1) was not found"),
                           "%s", err);
    }
    if (access("/usr/local/cuda/lib64", R_OK) == 0 || getenv("CUDA_HOME")) {
        for (int lib = PTRT_CUDA_NVRTC; lib < PTRT_CUDA_NLIBS; lib++) {
            cr_expect_eq(ptrt_cuda_open((ptrt_cuda_lib)lib, err, sizeof err), 0, "%s", err);
            char v[64];
            ptrt_cuda_lib_version((ptrt_cuda_lib)lib, v, sizeof v);
            cr_log_info("%s", v);
            cr_expect_gt(strlen(v), 6);
        }
    }
}


Test(cuda, nvrtc_and_ptxas_comm_unit)
{
    char err[8192];
    if (ptrt_cuda_open(PTRT_CUDA_NVRTC, err, sizeof err))
        cr_skip_test("%s", err);
    if (!ptxas())
        cr_skip_test("no ptxas in $CUDA_HOME/bin or /usr/local/cuda/bin");
    char *unit = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&unit, &len);
    ptc_cuda_emit_comm(f);
    fclose(f);
    for (int a = 0; a < ptc_cuda_narchs; a++) {
        int sm = ptc_cuda_archs[a].sm, cached;
        char *ptx = ptrt_nvrtc_compile(unit, "comm", sm, "", &cached, err, sizeof err);
        cr_assert_not_null(ptx, "%s", err);
        cr_expect_not_null(strstr(ptx, ".entry k_ptc_comm_reduce("), "sm_%d", sm);
        char path[512], cmd[2048];
        snprintf(path, sizeof path, "%s/comm_sm%d.ptx", tmpdir, sm);
        write_text(path, ptx);
        snprintf(cmd, sizeof cmd, "%s -arch=sm_%d -o %s/comm_sm%d.cubin %s", ptxas(), sm, tmpdir,
                 sm, path);
        cr_expect_eq(system(cmd), 0, "ptxas refused the comm unit for sm_%d: %s", sm, cmd);
        free(ptx);
    }
    free(unit);
}

/* A loop of a row is spread over the block's threads only when its iterations are independent:
 * each stores elements no other iteration stores and reads only those. A store at an index that
 * is data (an embedding gradient's token rows: two tokens of one id add into one element), that
 * does not move with the loop, or that repeats across iterations runs on one thread in order
 * (a thread per row, since nothing else in the row could use a block's threads); it had been
 * spread wherever the load matched the store, which loses updates on a GPU. */
Test(cuda, thread_loops_only_where_iterations_are_independent)
{
    static const struct {
        const char *body; /* inside `for r < 4 parallel { for j < 8 { ... } }` */
        bool spread;
    } cases[] = {
        {"y[r * 8 + j] = y[r * 8 + j] + x[r * 8 + j]", true},
        {"y[r * 8 + 7 - j] = x[r * 8 + j] * 2.0", true},
        {"for u < 4 { y[r * 64 + j * 4 + u + 32] = x[r * 8 + j] } ", true},
        {"let t = ids[j] y[select(t < 4, t * 8 + j, j)] = y[select(t < 4, t * 8 + j, j)] + "
         "x[r * 8 + j]",
         false},
        {"y[r * 8] = y[r * 8] + x[r * 8 + j]", false},
        {"y[r * 8 + j / 2] = y[r * 8 + j / 2] + x[r * 8 + j]", false},
        {"for u < 4 { y[r * 64 + j * 2 + u] = x[r * 8 + j] }", false},
        {"y[r * 8 + j] = x[r * 8 + j] y[r * 8 + (j + 1) % 8] = 0.0", false},
        {"y[r * 8 + j] = y[r * 8 + (j + 1) % 8]", false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char text[1024], err[512];
        snprintf(text, sizeof text,
                 "kernel k(x: f32[32], ids: i32[8], y: out f32[256]) {\n"
                 "for r < 4 parallel {\n for j < 8 {\n  %s\n }\n}\n}\n",
                 cases[c].body);
        ptc_kir *k = ptc_kir_parse_text(text, err, sizeof err);
        cr_assert_not_null(k, "%s\n%s", err, text);
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        ptc_cuda_emit_kernel(k, f);
        fclose(f);
        bool spread = strstr(buf, "v_j = threadIdx.x") != NULL;
        bool alone = strstr(buf, "for (long long v_j = 0; v_j < 8LL; v_j += 1)") != NULL;
        cr_expect(spread == cases[c].spread && alone == !cases[c].spread,
                  "case %zu (%s): the loop over j %s\n%s", c, cases[c].body,
                  spread ? "is spread over threads" : "runs on one thread", buf);
        free(buf);
        ptc_kir_free(k);
    }
}

/* A row's loop (or a kernel's loop, a thread per iteration) takes 16 bytes of each array a thread
 * (cuda_loops.c's packets) where every store and the loads it streams sit at base + j, the base a
 * multiple of the packet; a load elsewhere
 * stays a load of one element; a loop that reads an array after storing it, stores elsewhere or
 * is not a multiple of the packet long is left an element a thread. Each kernel then runs
 * emulated, its arrays at 16-byte boundaries and one element off them, against the
 * interpreter. */
Test(cuda, rows_packed_where_16_byte_loads_fit)
{
    static const struct {
        const char *row; /* inside `for r < 4 parallel { ... }`; "|..." the kernel's body */
        bool packed;
    } cases[] = {
        {"for j < 16 { y[r * 16 + j] = x[r * 16 + j] * 2.0 }", true},
        {"for j < 16 { yb[r * 16 + j] = xb[r * 16 + j] + x[r * 16 + j] }", true},
        {"for j < 16 { y[r * 16 + j] = y[r * 16 + j] + x[r * 16 + j + 1] }", true},
        {"for j < 16 { yb[r * 16 + j] = xb[(r % 2) * 32 + 8 + j] * xb[j] }", true},
        {"n[r] = sum(i < 64: w[r * 64 + i] * w[r * 64 + i]) + maxr(i < 64: wb[r * 64 + i])", true},
        {"for j < 16 { y[r * 16 + j] = x[r * 16 + j] y[r * 16 + j] = y[r * 16 + j] * 2.0 }", false},
        {"for j < 16 { y[r * 16 + 15 - j] = x[r * 16 + j] }", false},
        {"for j < 16 { y[r * 16 + j + 2] = x[r * 16 + j] }", false},
        {"for j < 14 { y[r * 16 + j] = x[r * 16 + j] }", false},
        {"n[r] = sum(i < 62: w[r * 64 + i])", false},
        {"for j < 16 { yb[r * 20 + j] = xb[r * 16 + j] }", false},
        /* a thread per iteration of the kernel's loop */
        {"|for i < 80 parallel { yb[i] = xb[i] * x[i] y[i] = x[i] + xb[(i * 7) % 80] }", true},
        {"|for i < 78 parallel { y[i] = x[i] * 2.0 }", false},
    };
    enum { N = sizeof cases / sizeof cases[0] };
    ptc_kir *ks[N];
    for (int c = 0; c < N; c++) {
        char text[1024], err[512];
        bool flat = cases[c].row[0] == '|';
        snprintf(text, sizeof text,
                 "kernel pk%d(x: f32[80], xb: bf16[80], w: f32[256], wb: bf16[256], "
                 "y: out f32[80], yb: out bf16[80], n: out f32[4]) {\n%s%s%s\n}\n",
                 c, flat ? "" : "for r < 4 parallel {\n", cases[c].row + flat, flat ? "" : "\n}");
        ks[c] = ptc_kir_parse_text(text, err, sizeof err);
        cr_assert_not_null(ks[c], "%s\n%s", err, text);
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        ptc_cuda_emit_kernel(ks[c], f);
        fclose(f);
        bool packed = strstr(buf, "if (((PTC_ADDR(") != NULL;
        cr_expect(packed == cases[c].packed, "case %d (%s): %s\n%s", c, cases[c].row,
                  packed ? "packed" : "not packed", buf);
        free(buf);
    }
    check_unit(ks, N, "packets");
    for (int c = 0; c < N; c++)
        ptc_kir_free(ks[c]);
}

/* The emulation's race check (cuda_emu.h), on hand-written kernels of the patterns it is for:
 * each racy one fails its launch with the race named, each race-free one passes and computes. */
static const char race_unit[] =
    "#define EMU(k) void k##__emu(void *const *a) { k((const int *)a[0], (float *)a[1]); }\n"
    /* threads add into y at their ids: two threads with one id race (the pre-5e9fcd9
     * embedding gradient); distinct ids do not */
    "PTC_KERNEL k_scatter(const int *ids, float *y)\n"
    "{\n"
    "    const int j = PTC_LD(ids, threadIdx.x);\n"
    "    PTC_ST(y, j, PTC_LD(y, j) + 1.0f);\n"
    "}\n"
    "EMU(k_scatter)\n"
    /* a thread reads its neighbour's shared word: with and without the barrier between */
    "PTC_KERNEL k_neighbour(const int *ids, float *y)\n"
    "{\n"
    "    __shared__ float s[64];\n"
    "    const unsigned t = threadIdx.x;\n"
    "    PTC_ST(s, t, (float)(t + 100 * blockIdx.x));\n"
    "    if (PTC_LD(ids, 0))\n"
    "        __syncthreads();\n"
    "    PTC_ST(y, blockIdx.x * blockDim.x + t, PTC_LD(s, (t + 1) % blockDim.x));\n"
    "}\n"
    "EMU(k_neighbour)\n"
    /* every block writes y[0], each its own value */
    "PTC_KERNEL k_blocks(const int *ids, float *y)\n"
    "{\n"
    "    (void)ids;\n"
    "    if (threadIdx.x == 0)\n"
    "        PTC_ST(y, 0, (float)blockIdx.x);\n"
    "}\n"
    "EMU(k_blocks)\n"
    /* block 1 writes what block 0 reads */
    "PTC_KERNEL k_read_write(const int *ids, float *y)\n"
    "{\n"
    "    (void)ids;\n"
    "    if (threadIdx.x == 0 && blockIdx.x == 0)\n"
    "        PTC_ST(y, 1, PTC_LD(y, 0));\n"
    "    if (threadIdx.x == 0 && blockIdx.x == 1)\n"
    "        PTC_ST(y, 0, 5.0f);\n"
    "}\n"
    "EMU(k_read_write)\n"
    /* every thread of every block stores one value and reads it back (the emitter's top-level
     * statements): the same bits in any order, no race; an in-place update by every thread is */
    "PTC_KERNEL k_uniform(const int *ids, float *y)\n"
    "{\n"
    "    if (PTC_LD(ids, 0))\n"
    "        PTC_ST(y, 0, 3.0f);\n"
    "    else\n"
    "        PTC_ST(y, 0, PTC_LD(y, 0) + 1.0f);\n"
    "    PTC_ST(y, 1 + blockIdx.x * blockDim.x + threadIdx.x, PTC_LD(y, 0));\n"
    "}\n"
    "EMU(k_uniform)\n"
    /* the first ids[0] threads wait at a barrier: all of them, or a warp that waits for ever */
    "PTC_KERNEL k_barrier(const int *ids, float *y)\n"
    "{\n"
    "    float v[2];\n" /* (an array in the frame: ASan's redzones around it) */
    "    v[threadIdx.x & 1] = (float)threadIdx.x;\n"
    "    if (threadIdx.x < (unsigned)PTC_LD(ids, 0))\n"
    "        __syncthreads();\n"
    "    PTC_ST(y, 1 + blockIdx.x * blockDim.x + threadIdx.x, v[threadIdx.x & 1]);\n"
    "}\n"
    "EMU(k_barrier)\n"
    /* a wider array where k_barrier's redzones were: a deadlock's frames left poisoned on the
     * fibers' stacks would be reported here under ASan */
    "PTC_KERNEL k_stack(const int *ids, float *y)\n"
    "{\n"
    "    float w[64];\n"
    "    for (int i = 0; i < 64; i++)\n"
    "        w[(i + PTC_LD(ids, 1)) % 64] = (float)i;\n"
    "    PTC_ST(y, 1 + blockIdx.x * blockDim.x + threadIdx.x, w[threadIdx.x % 64]);\n"
    "}\n"
    "EMU(k_stack)\n";

/* the race check, and a deadlock found (on each context switch the emulation has: its own on
 * x86-64, ucontext elsewhere); a launch after a deadlock runs on the stacks it left */
static void races_found(const char *flags)
{
    void *so = build_emu_with(race_unit, *flags ? "races_ucontext" : "races", flags);
    launch_fn launch = emu_launcher(so);
    static const struct {
        const char *kernel;
        int id0; /* ids[0]; ids[i] = i otherwise */
        unsigned grid;
        const char *race; /* how the message starts (fibers run in an order that changes from
                             launch to launch: which two threads meet first changes), or NULL */
        int rc;           /* what a racy launch returns: -2 a race, -1 a deadlock */
    } cases[] = {
        {"k_scatter", 0, 1, NULL, 0},
        {"k_scatter", 5, 1, "a race on y[5]: thread ", -2},
        {"k_neighbour", 1, 2, NULL, 0},
        {"k_neighbour", 0, 2, "a race on s[", -2},
        {"k_blocks", 0, 1, NULL, 0},
        {"k_blocks", 0, 2, "a race on y[0]: blocks 0 and 1 both write it", -2},
        {"k_read_write", 0, 2, "a race on y[0]: block 0 reads it and block 1 writes it", -2},
        {"k_uniform", 1, 3, NULL, 0},
        {"k_uniform", 0, 3, "a race on y[0]: ", -2},
        {"k_barrier", 64, 2, NULL, 0},
        {"k_barrier", 32, 2, "a deadlock in block 0: every thread left waits at a barrier", -1},
        {"k_barrier", 64, 3, NULL, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int ids[64];
        float y[1 + 3 * 64] = {0};
        for (int i = 0; i < 64; i++)
            ids[i] = i;
        ids[0] = cases[c].id0;
        char sym[64];
        snprintf(sym, sizeof sym, "%s__emu", cases[c].kernel);
        int rc = launch(emu_sym(so, sym), (void *const[]){ids, y}, cases[c].grid, 64);
        const char *why = emu_error(so);
        if (!cases[c].race) {
            cr_expect_eq(rc, 0, "case %zu (%s): %s", c, cases[c].kernel, why);
            continue;
        }
        cr_expect_eq(rc, cases[c].rc, "case %zu (%s): %d, not %d (%s)", c, cases[c].kernel, rc,
                     cases[c].rc, why);
        cr_expect(strstr(why, cases[c].race) != NULL, "case %zu (%s): \"%s\", not \"%s...\"", c,
                  cases[c].kernel, why, cases[c].race);
    }
    /* the race-free launches computed what they say */
    int ids[64];
    float y[1 + 3 * 64] = {0};
    for (int i = 0; i < 64; i++)
        ids[i] = i;
    ids[0] = 1;
    cr_assert_eq(launch(emu_sym(so, "k_uniform__emu"), (void *const[]){ids, y}, 3, 64), 0);
    for (int i = 0; i < 1 + 3 * 64; i++)
        cr_expect_eq(y[i], 3.0f, "k_uniform: y[%d] = %g", i, y[i]);
    cr_assert_eq(launch(emu_sym(so, "k_neighbour__emu"), (void *const[]){ids, y}, 2, 64), 0);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 64; t++)
            cr_expect_eq(y[b * 64 + t], (float)((t + 1) % 64 + 100 * b), "k_neighbour: y[%d]",
                         b * 64 + t);
    ids[0] = 64;
    cr_assert_eq(launch(emu_sym(so, "k_barrier__emu"), (void *const[]){ids, y}, 3, 64), 0);
    for (int i = 0; i < 3 * 64; i++)
        cr_expect_eq(y[1 + i], (float)(i % 64), "k_barrier: y[%d] = %g", 1 + i, y[1 + i]);
    ids[0] = 32; /* a deadlock, then the stacks it left */
    cr_expect_eq(launch(emu_sym(so, "k_barrier__emu"), (void *const[]){ids, y}, 1, 64), -1);
    cr_assert_eq(launch(emu_sym(so, "k_stack__emu"), (void *const[]){ids, y}, 2, 64), 0);
    for (int i = 0; i < 2 * 64; i++)
        cr_expect_eq(y[1 + i], (float)((i + 63) % 64), "k_stack: y[%d] = %g", 1 + i, y[1 + i]);
    dlclose(so);
}

Test(cuda, emulation_finds_races)
{
    races_found("");
    races_found("-DPTC_CUDA_EMU_UCONTEXT");
}
