/* cuda_moe.c - the row kernels of a mixture of experts on the GPU, one set per expert shape of a
 * plan (see cuda_emit.h). The CUDA backend runs moe_ffn(_grad) and moe_ep_ffn(_grad) in f32 as
 * cpu_moe.c does on the CPU: an expert's rows a block at a time, each product one cuBLASLt GEMM,
 * and around the GEMMs these kernels:
 *
 *   gather    X[i] = x[src[r]]                         the block's rows of x
 *   act       A = act(H)                               (swiglu: silu(H[:, :f]) * H[:, f:])
 *   out       y[token] += gate O (moe_ffn), y[r] = O (moe_ep_ffn)
 *   out_grad  dgate = O . dy[token], dO = gate dy[token] (moe_ffn); dO = dy[r] (moe_ep_ffn)
 *   act_grad  dH = act'(H) dA
 *   scatter   dx[token] += dX (moe_ffn), dx[r] = dX (moe_ep_ffn)
 *
 * The block is rows at[0] .. at[1] of the call's rows in expert order (at: two int64 in device
 * memory, so that one compiled kernel takes every block), row r reading src[r] and, for moe_ffn,
 * being choice[r] = t K + j. Every loop strides over the grid, one element (out_grad of moe_ffn:
 * one row) a thread. An expert takes a token at most once, so a block's rows write distinct
 * tokens: no two threads store one element, and the experts run one after another on the
 * stream, so sums over a token's experts are in expert order, as on the CPU. The activations are
 * the kernel IR's formulas (GPT-2's tanh GELU, x sigmoid(x)); dgate sums in double, as the CPU's.
 *
 * Also here: expert parallelism's row ops (moe_pack, moe_unpack, moe_combine(_grad)), one kernel
 * each per row shape, and the routing ops (moe_topk and its gradient, moe_count, moe_prefix,
 * moe_route, moe_frac, moe_stats, moe_ep_count), one kernel per routing shape, each the
 * reference's loops (ref_moe.c) in its order, so that their results are the reference's bit for
 * bit.
 */
#include <string.h>

#include "cuda_emit.h"
#include "plan.h"
#include "util.h"

const char *const ptc_cuda_moe_names[PTC_CUDA_MOE_NKERNELS] = {"gather",   "act",      "out",
                                                               "out_grad", "act_grad", "scatter"};

bool ptc_cuda_moe_of(const ptc_program *pg, const ptc_instr *in, ptc_cuda_moe *m)
{
    bool ep = in->op == PTC_OP_MOE_EP_FFN || in->op == PTC_OP_MOE_EP_FFN_GRAD;
    if (in->kind != PTC_INSTR_KERNEL ||
        (!ep && in->op != PTC_OP_MOE_FFN && in->op != PTC_OP_MOE_FFN_GRAD) ||
        (!ep && in->attrs.group > 1))
        return false;
    for (int k = 0; k < in->nin; k++) /* (the route and counts are i32) */
        if (k != 1 && pg->bufs[in->in[k]].type.dtype != PTC_F32)
            return false;
    const ptc_type *tu = &pg->bufs[in->in[ep ? 2 : 3]].type;
    const ptc_type *td = &pg->bufs[in->in[ep ? 3 : 4]].type, *tr = &pg->bufs[in->in[1]].type;
    if (tu->rank != 3 || td->rank != 3 || tu->dims[1] <= 0 || td->dims[1] <= 0)
        return false;
    *m = (ptc_cuda_moe){.d = tu->dims[1],
                        .f = td->dims[1],
                        .F = tu->dims[2],
                        .K = ep ? 1 : tr->dims[tr->rank - 1],
                        .act = in->attrs.act,
                        .ep = ep};
    return m->F == (m->act == PTC_ACT_SWIGLU ? 2 : 1) * m->f && td->dims[2] == m->d;
}

bool ptc_cuda_moe_same(const ptc_cuda_moe *a, const ptc_cuda_moe *b)
{
    return a->d == b->d && a->f == b->f && a->F == b->F && a->K == b->K && a->act == b->act &&
           a->ep == b->ep;
}

typedef enum { FAM_EXPERTS, FAM_ROWS, FAM_ROUTES } family;

/* a shape of family fm of instruction in */
static bool shape_of(family fm, const ptc_program *pg, const ptc_instr *in, void *m)
{
    return fm == FAM_ROWS     ? ptc_cuda_moe_rows_of(pg, in, m)
           : fm == FAM_ROUTES ? ptc_cuda_moe_route_of(pg, in, m)
                              : ptc_cuda_moe_of(pg, in, m);
}

static bool shape_same(family fm, const void *a, const void *b)
{
    return fm == FAM_ROWS     ? ptc_cuda_moe_rows_same(a, b)
           : fm == FAM_ROUTES ? ptc_cuda_moe_route_same(a, b)
                              : ptc_cuda_moe_same(a, b);
}

/* The distinct shapes of family fm of the plan's instructions, of size bytes each; returns
 * their number, filling at most cap of out. */
static int plan_shapes(const ptc_plan *p, family fm, void *out, size_t size, int cap)
{
    int n = 0;
    int64_t m[12]; /* (one shape, aligned as its int64 fields) */
    PTC_ASSERT(size <= sizeof m);
    for (int g = 0; g < p->nprograms; g++)
        for (int i = 0; i < p->programs[g].ninstrs; i++) {
            if (!shape_of(fm, &p->programs[g], &p->programs[g].instrs[i], m))
                continue;
            bool seen = false;
            for (int j = 0; j < n && j < cap && !seen; j++)
                seen = shape_same(fm, (char *)out + (size_t)j * size, m);
            if (!seen && n < cap)
                memcpy((char *)out + (size_t)n * size, m, size);
            n += !seen;
        }
    return n;
}

int ptc_cuda_plan_moes(const ptc_plan *p, ptc_cuda_moe *out, int cap)
{
    return plan_shapes(p, FAM_EXPERTS, out, sizeof *out, cap);
}

void ptc_cuda_moe_launch(const ptc_cuda_arch *arch, int64_t work, int *grid, int *block)
{
    int64_t b = 256, g = (work + b - 1) / b, wave = (int64_t)arch->sms * (2048 / b);
    *block = (int)b;
    *grid = (int)(g < 1 ? 1 : g > wave ? wave : g);
}

/* the kernels' parameters (@: the shape's name), and their types for the emulation's entries: f
 * float, L an index array (src, or choice), l the block's rows (at), i int (ids, counts); the
 * results come last (the number in nouts: one; out_grad's two) */
static const char *const params[PTC_CUDA_MOE_NKERNELS] = {
    "const float *PTC_RESTRICT x, const long long *PTC_RESTRICT src, const long long *at, "
    "float *PTC_RESTRICT X",
    "const float *PTC_RESTRICT H, const long long *at, float *PTC_RESTRICT A",
    "const float *PTC_RESTRICT O, const long long *PTC_RESTRICT idx, "
    "const float *PTC_RESTRICT gate, const long long *at, float *PTC_RESTRICT y",
    "const float *PTC_RESTRICT O, const float *PTC_RESTRICT dy, "
    "const long long *PTC_RESTRICT idx, const float *PTC_RESTRICT gate, const long long *at, "
    "float *PTC_RESTRICT dO, float *PTC_RESTRICT dgate",
    "const float *PTC_RESTRICT H, const float *PTC_RESTRICT dA, const long long *at, "
    "float *PTC_RESTRICT dH",
    "const float *PTC_RESTRICT dX, const long long *PTC_RESTRICT idx, const long long *at, "
    "float *PTC_RESTRICT dx",
};
static const char *const types[PTC_CUDA_MOE_NKERNELS] = {"fLlf",    "flf",  "fLflf",
                                                         "ffLflff", "fflf", "fLlf"};
static const int nouts[PTC_CUDA_MOE_NKERNELS] = {1, 1, 1, 2, 1, 1};

#define LOOP(n)                                                                                    \
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < " n              \
    ";\n         i += (long long)gridDim.x * blockDim.x) {\n"
#define ROWS "    long long r0 = PTC_LD(at, 0), c = PTC_LD(at, 1) - r0;\n"

/* clang-format off */
static const char *const bodies[PTC_CUDA_MOE_NKERNELS] = {
    /* gather */
    ROWS LOOP("c * @_D") "        long long r = i / @_D, k = i % @_D;\n"
                         "        PTC_ST(X, i, PTC_LD(x, PTC_LD(src, r0 + r) * @_D + k));\n"
                         "    }\n",
    /* act */
    ROWS LOOP("c * @_f") "        long long r = i / @_f, j = i % @_f;\n"
                         "        float h = PTC_LD(H, r * @_F + j);\n"
                         "#if @_ACT == 3\n"
                         "        PTC_ST(A, i, @_act(h) * PTC_LD(H, r * @_F + @_f + j));\n"
                         "#else\n"
                         "        PTC_ST(A, i, @_act(h));\n"
                         "#endif\n"
                         "    }\n",
    /* out */
    ROWS LOOP("c * @_D") "        long long r = i / @_D, k = i % @_D, q = PTC_LD(idx, r0 + r);\n"
                         "#if @_EP\n"
                         "        PTC_ST(y, q * @_D + k, PTC_LD(O, i));\n"
                         "#else\n"
                         "        long long t = q / @_K;\n"
                         "        PTC_ST(y, t * @_D + k, PTC_LD(y, t * @_D + k) + "
                         "PTC_LD(gate, q) * PTC_LD(O, i));\n"
                         "#endif\n"
                         "    }\n",
    /* out_grad */
    ROWS "#if @_EP\n"
    LOOP("c * @_D") "        long long r = i / @_D, k = i % @_D;\n"
                    "        PTC_ST(dO, i, PTC_LD(dy, PTC_LD(idx, r0 + r) * @_D + k));\n"
                    "    }\n"
    "#else\n"
    LOOP("c") "        long long q = PTC_LD(idx, r0 + i), t = q / @_K;\n"
              "        float g = PTC_LD(gate, q);\n"
              "        double s = 0;\n"
              "        for (long long k = 0; k < @_D; k++) {\n"
              "            float e = PTC_LD(dy, t * @_D + k);\n"
              "            s += (double)PTC_LD(O, i * @_D + k) * e;\n"
              "            PTC_ST(dO, i * @_D + k, g * e);\n"
              "        }\n"
              "        PTC_ST(dgate, q, (float)s);\n"
              "    }\n"
    "#endif\n",
    /* act_grad */
    ROWS LOOP("c * @_f") "        long long r = i / @_f, j = i % @_f;\n"
                         "        float h = PTC_LD(H, r * @_F + j), da = PTC_LD(dA, i);\n"
                         "#if @_ACT == 3\n"
                         "        float h2 = PTC_LD(H, r * @_F + @_f + j);\n"
                         "        PTC_ST(dH, r * @_F + @_f + j, da * @_act(h));\n"
                         "        PTC_ST(dH, r * @_F + j, @_grad(h, da * h2));\n"
                         "#else\n"
                         "        PTC_ST(dH, r * @_F + j, @_grad(h, da));\n"
                         "#endif\n"
                         "    }\n",
    /* scatter */
    ROWS LOOP("c * @_D") "        long long r = i / @_D, k = i % @_D, q = PTC_LD(idx, r0 + r);\n"
                         "#if @_EP\n"
                         "        PTC_ST(dx, q * @_D + k, PTC_LD(dX, i));\n"
                         "#else\n"
                         "        long long t = q / @_K;\n"
                         "        PTC_ST(dx, t * @_D + k, PTC_LD(dx, t * @_D + k) + "
                         "PTC_LD(dX, i));\n"
                         "#endif\n"
                         "    }\n",
};
/* clang-format on */

/* the activation and its gradient (act'(h) dy) of the shape, as the kernel IR computes them */
static const char *const acts =
    "PTC_DEVICE float @_sig(float x)\n{\n    return 1.0f / (1.0f + expf(-x));\n}\n"
    "PTC_DEVICE float @_gelu_t(float x)\n{\n"
    "    return tanhf(0.7978845608028654f * (x + 0.044715f * (x * x * x)));\n}\n"
    "PTC_DEVICE float @_act(float x)\n{\n"
    "#if @_ACT == 0\n    return 0.5f * x * (1.0f + @_gelu_t(x));\n"
    "#elif @_ACT == 1\n    return x < 0.0f ? 0.0f : x;\n"
    "#else\n    return x * @_sig(x);\n#endif\n}\n"
    "PTC_DEVICE float @_grad(float x, float dy)\n{\n"
    "#if @_ACT == 0\n"
    "    float t = @_gelu_t(x), a = 0.5f * (1.0f + t);\n"
    "    float d = 0.5f * x * (1.0f - t * t) * (0.7978845608028654f * (1.0f + 0.134145f * (x * "
    "x)));\n"
    "    return (a + d) * dy;\n"
    "#elif @_ACT == 1\n    return 0.0f < x ? dy : 0.0f;\n"
    "#else\n    float s = @_sig(x);\n    return s * (1.0f + x * (1.0f - s)) * dy;\n#endif\n}\n";

/* nk kernels of one shape: k_<name>_<names[w]>(params[w]) { bodies[w] } (k_<name> where names
 * is NULL), @ standing for name, and their emulation entries, whose operands have types[w] (the
 * last nouts[w] of them results) */
static void emit_kernels(FILE *f, const char *name, int nk, const char *const *names,
                         const char *const *params, const char *const *bodies,
                         const char *const *types, const int *nouts)
{
    for (int w = 0; w < nk; w++) {
        char fn[96];
        snprintf(fn, sizeof fn, "k_%s%s%s", name, names ? "_" : "", names ? names[w] : "");
        fprintf(f, "PTC_KERNEL __launch_bounds__(256) %s(", fn);
        ptc_cuda_put_named(f, params[w], name);
        fputs(")\n{\n", f);
        ptc_cuda_put_named(f, bodies[w], name);
        fprintf(f, "}\n#ifdef PTC_CUDA_EMULATE\nvoid %s__emu(void *const *a)\n{\n    %s(", fn, fn);
        int n = (int)strlen(types[w]);
        for (int i = 0; i < n; i++)
            fprintf(f, "%s(%s%s *)a[%d]", i ? ", " : "", i < n - nouts[w] ? "const " : "",
                    types[w][i] == 'f'   ? "float"
                    : types[w][i] == 'i' ? "int"
                                         : "long long",
                    i);
        fputs(");\n}\n#endif\n", f);
    }
}

void ptc_cuda_emit_moe(const ptc_cuda_moe *m, const char *name, FILE *f)
{
    static const char *const act_names[] = {"gelu", "relu", "silu", "swiglu"};
    fprintf(f,
            "/* experts %s: %s, d %lld, %s %lld%s (the rows around the GEMMs; cuda_moe.c) */\n"
            "#define %s_D %lldLL\n#define %s_f %lldLL\n#define %s_F %lldLL\n#define %s_K %lldLL\n"
            "#define %s_ACT %d\n#define %s_EP %d\n",
            name, m->ep ? "moe_ep_ffn" : "moe_ffn", (long long)m->d,
            m->act >= 0 && m->act < 4 ? act_names[m->act] : "?", (long long)m->f,
            m->ep ? "" : ", top_k rows a token", name, (long long)m->d, name, (long long)m->f, name,
            (long long)m->F, name, (long long)m->K, name, m->act, name, m->ep ? 1 : 0);
    ptc_cuda_put_named(f, acts, name);
    emit_kernels(f, name, PTC_CUDA_MOE_NKERNELS, ptc_cuda_moe_names, params, bodies, types, nouts);
}

/* ---- expert parallelism's row ops ---- */

const char *const ptc_cuda_moe_rows_names[PTC_CUDA_MOE_ROWS_NKERNELS] = {"pack", "unpack",
                                                                         "combine", "combine_grad"};

bool ptc_cuda_moe_rows_of(const ptc_program *pg, const ptc_instr *in, ptc_cuda_moe_rows *m)
{
    if (in->kind != PTC_INSTR_KERNEL ||
        (in->op != PTC_OP_MOE_PACK && in->op != PTC_OP_MOE_UNPACK && in->op != PTC_OP_MOE_COMBINE &&
         in->op != PTC_OP_MOE_COMBINE_GRAD))
        return false;
    for (int k = 0; k < in->nin; k++) /* (the route is i32) */
        if (k != 1 && pg->bufs[in->in[k]].type.dtype != PTC_F32)
            return false;
    const ptc_type *tx = &pg->bufs[in->in[0]].type, *tr = &pg->bufs[in->in[1]].type;
    if (tr->rank < 1 || tx->rank < 1)
        return false;
    *m = (ptc_cuda_moe_rows){
        .d = tx->dims[tx->rank - 1], .K = tr->dims[tr->rank - 1], .n = ptc_type_numel(tr)};
    return m->d > 0 && m->K > 0 && m->n > 0;
}

bool ptc_cuda_moe_rows_same(const ptc_cuda_moe_rows *a, const ptc_cuda_moe_rows *b)
{
    return a->d == b->d && a->K == b->K && a->n == b->n;
}

int ptc_cuda_plan_moe_rows(const ptc_plan *p, ptc_cuda_moe_rows *out, int cap)
{
    return plan_shapes(p, FAM_ROWS, out, sizeof *out, cap);
}

static const char *const row_params[PTC_CUDA_MOE_ROWS_NKERNELS] = {
    "const float *PTC_RESTRICT x, const long long *PTC_RESTRICT pos, float *PTC_RESTRICT rows",
    "const float *PTC_RESTRICT rows, const long long *PTC_RESTRICT pos, float *PTC_RESTRICT y",
    "const float *PTC_RESTRICT rows, const long long *PTC_RESTRICT pos, "
    "const float *PTC_RESTRICT gate, float *PTC_RESTRICT y",
    "const float *PTC_RESTRICT rows, const long long *PTC_RESTRICT pos, "
    "const float *PTC_RESTRICT gate, const float *PTC_RESTRICT dy, float *PTC_RESTRICT drows, "
    "float *PTC_RESTRICT dgate",
};
static const char *const row_types[PTC_CUDA_MOE_ROWS_NKERNELS] = {"fLf", "fLf", "fLff", "fLffff"};
static const int row_nouts[PTC_CUDA_MOE_ROWS_NKERNELS] = {1, 1, 1, 2};

/* clang-format off */
/* y[t] = the sum over t's kept choices j of factor row, in double, choices in order */
#define SUM_ROWS(factor) \
    LOOP("@_N / @_K * @_D") "        long long t = i / @_D, k = i % @_D;\n" \
                            "        double s = 0;\n" \
                            "        for (long long j = 0; j < @_K; j++) {\n" \
                            "            long long p = PTC_LD(pos, t * @_K + j);\n" \
                            "            if (p >= 0)\n" \
                            "                s += " factor "PTC_LD(rows, p * @_D + k);\n" \
                            "        }\n" \
                            "        PTC_ST(y, i, (float)s);\n" \
                            "    }\n"
static const char *const row_bodies[PTC_CUDA_MOE_ROWS_NKERNELS] = {
    /* pack: rows[pos[c]] = x[token of c] */
    LOOP("@_N * @_D") "        long long c = i / @_D, k = i % @_D, p = PTC_LD(pos, c);\n"
                      "        if (p >= 0)\n"
                      "            PTC_ST(rows, p * @_D + k, PTC_LD(x, (c / @_K) * @_D + k));\n"
                      "    }\n",
    /* unpack: y[t] = the sum of t's rows, its choices in order */
    SUM_ROWS(""),
    /* combine: y[t] = the sum of gate * row over t's choices */
    SUM_ROWS("(double)PTC_LD(gate, t * @_K + j) * "),
    /* combine_grad: drows[pos[c]] = gate dy[t], dgate[c] = row . dy[t] (0 where dropped) */
    LOOP("@_N") "        long long p = PTC_LD(pos, i), t = i / @_K;\n"
                "        double s = 0, g = PTC_LD(gate, i);\n"
                "        for (long long k = 0; k < @_D && p >= 0; k++) {\n"
                "            float e = PTC_LD(dy, t * @_D + k);\n"
                "            s += (double)PTC_LD(rows, p * @_D + k) * e;\n"
                "            PTC_ST(drows, p * @_D + k, (float)(g * e));\n"
                "        }\n"
                "        PTC_ST(dgate, i, (float)s);\n"
                "    }\n",
};
/* clang-format on */

void ptc_cuda_emit_moe_rows(const ptc_cuda_moe_rows *m, const char *name, FILE *f)
{
    fprintf(f,
            "/* expert parallelism's rows %s: %lld choices, %lld a token, rows of %lld "
            "(cuda_moe.c) */\n#define %s_D %lldLL\n#define %s_K %lldLL\n#define %s_N %lldLL\n",
            name, (long long)m->n, (long long)m->K, (long long)m->d, name, (long long)m->d, name,
            (long long)m->K, name, (long long)m->n);
    emit_kernels(f, name, PTC_CUDA_MOE_ROWS_NKERNELS, ptc_cuda_moe_rows_names, row_params,
                 row_bodies, row_types, row_nouts);
}

/* ---- the routing ops ---- */

/* the dims of buffer b, or NULL where it is not of dtype dt and rank r */
static const int64_t *dims_of(const ptc_program *pg, int b, ptc_dtype dt, int r)
{
    const ptc_type *t = &pg->bufs[b].type;
    return t->dtype == dt && (r < 0 || t->rank == r) && ptc_type_numel(t) > 0 ? t->dims : NULL;
}

bool ptc_cuda_moe_route_of(const ptc_program *pg, const ptc_instr *in, ptc_cuda_moe_route *m)
{
    if (in->kind != PTC_INSTR_KERNEL)
        return false;
    const ptc_type *t0 = &pg->bufs[in->in[0]].type;
    const int64_t *a = t0->dims, *c;
    int64_t last = t0->rank ? a[t0->rank - 1] : 0;
    double capacity = -1;
    *m = (ptc_cuda_moe_route){.op = in->op, .normalize = in->attrs.normalize};
    switch (in->op) {
    case PTC_OP_MOE_TOPK:
        if (!dims_of(pg, in->in[0], PTC_F32, -1) || !dims_of(pg, in->out[0], PTC_I32, -1) ||
            !dims_of(pg, in->out[1], PTC_F32, -1) || last <= 0)
            return false;
        m->R = ptc_type_numel(t0) / last, m->E = last, m->K = in->attrs.top_k;
        break;
    case PTC_OP_MOE_TOPK_GRAD:
        if (!dims_of(pg, in->in[0], PTC_F32, -1) || !(c = dims_of(pg, in->in[1], PTC_I32, -1)) ||
            !dims_of(pg, in->in[2], PTC_F32, -1) || !dims_of(pg, in->out[0], PTC_F32, -1) ||
            last <= 0)
            return false;
        m->R = ptc_type_numel(t0) / last, m->E = last;
        m->K = c[pg->bufs[in->in[1]].type.rank - 1];
        break;
    case PTC_OP_MOE_COUNT:
        if (!dims_of(pg, in->in[0], PTC_I32, 3) || !dims_of(pg, in->out[0], PTC_I32, 3))
            return false;
        m->B = a[0], m->S = a[1], m->K = a[2], m->E = in->attrs.n;
        break;
    case PTC_OP_MOE_PREFIX:
        if (!dims_of(pg, in->in[0], PTC_I32, 3) || !dims_of(pg, in->out[0], PTC_I32, 3) ||
            !dims_of(pg, in->out[1], PTC_I32, 2))
            return false;
        m->B = a[0], m->K = a[1], m->E = a[2];
        break;
    case PTC_OP_MOE_ROUTE:
        if (!dims_of(pg, in->in[0], PTC_I32, 3) || !dims_of(pg, in->in[1], PTC_I32, 3) ||
            !(c = dims_of(pg, in->in[2], PTC_I32, 2)) || !dims_of(pg, in->out[0], PTC_I32, 3))
            return false;
        m->B = a[0], m->S = a[1], m->K = a[2], m->E = c[1];
        capacity = in->attrs.capacity;
        break;
    case PTC_OP_MOE_FRAC:
    case PTC_OP_MOE_STATS:
        if (!dims_of(pg, in->in[0], PTC_I32, 2) || !dims_of(pg, in->out[0], PTC_F32, 1))
            return false;
        m->K = a[0], m->E = a[1];
        capacity = in->op == PTC_OP_MOE_STATS ? in->attrs.capacity : -1;
        break;
    case PTC_OP_MOE_EP_COUNT:
        if (!dims_of(pg, in->in[0], PTC_I32, -1) || !dims_of(pg, in->out[0], PTC_I32, -1))
            return false;
        m->R = ptc_type_numel(t0), m->E = in->attrs.n;
        break;
    default: return false;
    }
    m->normalize = m->normalize && (in->op == PTC_OP_MOE_TOPK || in->op == PTC_OP_MOE_TOPK_GRAD);
    int e10 = 0;
    if (capacity >= 0 && ptc_moe_capacity_decimal(capacity, m->K, m->E, &m->digits, &e10))
        m->cap = true, m->e10 = e10;
    return m->E > 0 && m->K >= 0;
}

bool ptc_cuda_moe_route_same(const ptc_cuda_moe_route *a, const ptc_cuda_moe_route *b)
{
    return a->op == b->op && a->R == b->R && a->E == b->E && a->K == b->K && a->B == b->B &&
           a->S == b->S && a->digits == b->digits && a->e10 == b->e10 && a->cap == b->cap &&
           a->normalize == b->normalize;
}

int ptc_cuda_plan_moe_routes(const ptc_plan *p, ptc_cuda_moe_route *out, int cap)
{
    return plan_shapes(p, FAM_ROUTES, out, sizeof *out, cap);
}

int64_t ptc_cuda_moe_route_work(const ptc_cuda_moe_route *m)
{
    switch (m->op) {
    case PTC_OP_MOE_TOPK:
    case PTC_OP_MOE_TOPK_GRAD: return m->R;
    case PTC_OP_MOE_COUNT: return m->B * m->K * m->E;
    case PTC_OP_MOE_PREFIX: return m->K * m->E;
    case PTC_OP_MOE_ROUTE: return m->B * m->E;
    case PTC_OP_MOE_STATS: return 1;
    default: return m->E; /* frac, ep_count */
    }
}

/* the capacity of an expert when n tokens are routed: ptc_moe_capacity's exact decimal */
static const char *const route_cap =
    "PTC_DEVICE long long @_cap(long long n)\n{\n"
    "#if @_CAP\n"
    "    unsigned __int128 num = (unsigned __int128)@_DIGITS * @_K * (unsigned long long)n, "
    "den = @_E;\n"
    "    for (int i = 0; i < @_E10; i++)\n        num *= 10;\n"
    "    for (int i = 0; i < -(@_E10); i++) {\n"
    "        if (den > ((unsigned __int128)1 << 120) / 10)\n            return 1;\n"
    "        den *= 10;\n    }\n"
    "    unsigned __int128 q = (num + den - 1) / den;\n"
    "    return q > (unsigned __int128)n ? n : (long long)q;\n"
    "#else\n    return n;\n#endif\n}\n";

/* clang-format off */
/* by op: parameters, emulation types, results, body (each as the reference's loop, in its order;
 * an id outside 0..E-1, which moe_topk never makes, is counted nowhere and passed on by route,
 * whose consumers' row check names it) */
static const struct route_kernel {
    ptc_op op;
    const char *params, *types;
    int nout;
    const char *body;
} route_kernels[] = {
    {PTC_OP_MOE_TOPK,
     "const float *PTC_RESTRICT p, int *PTC_RESTRICT ids, float *PTC_RESTRICT gate", "fif", 2,
     LOOP("@_R") "        int id[@_K];\n"
                 "        double sum = 0;\n"
                 "        for (int j = 0; j < @_K; j++) {\n"
                 "            int best = -1;\n"
                 "            for (int e = 0; e < @_E; e++) {\n"
                 "                int taken = 0;\n"
                 "                for (int q = 0; q < j && !taken; q++)\n"
                 "                    taken = id[q] == e;\n"
                 "                if (!taken && (best < 0 || PTC_LD(p, i * @_E + e) > "
                 "PTC_LD(p, i * @_E + best)))\n"
                 "                    best = e;\n"
                 "            }\n"
                 "            id[j] = best;\n"
                 "            sum += PTC_LD(p, i * @_E + best);\n"
                 "        }\n"
                 "        for (int j = 0; j < @_K; j++) {\n"
                 "            float v = PTC_LD(p, i * @_E + id[j]);\n"
                 "            PTC_ST(ids, i * @_K + j, id[j]);\n"
                 "            PTC_ST(gate, i * @_K + j, @_NORM ? (float)(v / sum) : v);\n"
                 "        }\n"
                 "    }\n"},
    {PTC_OP_MOE_TOPK_GRAD,
     "const float *PTC_RESTRICT p, const int *PTC_RESTRICT ids, const float *PTC_RESTRICT dg, "
     "float *PTC_RESTRICT dp", "fiff", 1,
     LOOP("@_R") "        double s = 0, dot = 0;\n"
                 "        for (int e = 0; e < @_E; e++)\n"
                 "            PTC_ST(dp, i * @_E + e, 0.0f);\n"
                 "        for (int j = 0; j < @_K; j++) {\n"
                 "            int e = PTC_LD(ids, i * @_K + j);\n"
                 "            s += 0 <= e && e < @_E ? PTC_LD(p, i * @_E + e) : 0.0f;\n"
                 "        }\n"
                 "        for (int j = 0; j < @_K; j++) {\n"
                 "            int e = PTC_LD(ids, i * @_K + j);\n"
                 "            if (0 <= e && e < @_E)\n"
                 "                dot += (double)PTC_LD(dg, i * @_K + j) * "
                 "(PTC_LD(p, i * @_E + e) / s);\n"
                 "        }\n"
                 "        for (int j = 0; j < @_K; j++) {\n"
                 "            int e = PTC_LD(ids, i * @_K + j);\n"
                 "            float d = PTC_LD(dg, i * @_K + j);\n"
                 "            if (0 <= e && e < @_E)\n"
                 "                PTC_ST(dp, i * @_E + e, @_NORM ? (float)((d - dot) / s) : d);\n"
                 "        }\n"
                 "    }\n"},
    {PTC_OP_MOE_COUNT, "const int *PTC_RESTRICT ids, int *PTC_RESTRICT cnt", "ii", 1,
     LOOP("@_B * @_K * @_E") "        long long b = i / (@_K * @_E), j = i / @_E % @_K, "
                             "e = i % @_E;\n"
                             "        int c = 0;\n"
                             "        for (long long s = 0; s < @_S; s++)\n"
                             "            c += PTC_LD(ids, (b * @_S + s) * @_K + j) == e;\n"
                             "        PTC_ST(cnt, i, c);\n"
                             "    }\n"},
    {PTC_OP_MOE_PREFIX,
     "const int *PTC_RESTRICT cnt, int *PTC_RESTRICT pre, int *PTC_RESTRICT tot", "iii", 2,
     LOOP("@_K * @_E") "        int t = 0;\n"
                       "        for (long long b = 0; b < @_B; b++) {\n"
                       "            PTC_ST(pre, b * @_K * @_E + i, t);\n"
                       "            t += PTC_LD(cnt, b * @_K * @_E + i);\n"
                       "        }\n"
                       "        PTC_ST(tot, i, t);\n"
                       "    }\n"},
    {PTC_OP_MOE_ROUTE,
     "const int *PTC_RESTRICT ids, const int *PTC_RESTRICT pre, const int *PTC_RESTRICT tot, "
     "int *PTC_RESTRICT out", "iiii", 1,
     LOOP("@_B * @_E") "        long long b = i / @_E, e = i % @_E, n = 0, before = 0, "
                       "pos[@_K];\n"
                       "        for (long long q = 0; q < @_E; q++) /* every token's first "
                       "choice */\n"
                       "            n += PTC_LD(tot, q);\n"
                       "        long long C = @_cap(n);\n"
                       "        for (long long j = 0; j < @_K; j++) {\n"
                       "            pos[j] = before + PTC_LD(pre, (b * @_K + j) * @_E + e);\n"
                       "            before += PTC_LD(tot, j * @_E + e);\n"
                       "        }\n"
                       "        for (long long s = 0; s < @_S; s++)\n"
                       "            for (long long j = 0; j < @_K; j++) {\n"
                       "                long long x = (b * @_S + s) * @_K + j;\n"
                       "                int id = PTC_LD(ids, x);\n"
                       "                if (id == e)\n"
                       "                    PTC_ST(out, x, pos[j]++ < C ? id : -1);\n"
                       "                else if (e == 0 && (id < 0 || id >= @_E))\n"
                       "                    PTC_ST(out, x, id);\n"
                       "            }\n"
                       "    }\n"},
    {PTC_OP_MOE_FRAC, "const int *PTC_RESTRICT tot, float *PTC_RESTRICT f", "if", 1,
     LOOP("@_E") "        double all = 0, n = 0;\n"
                 "        for (long long q = 0; q < @_K * @_E; q++)\n"
                 "            all += PTC_LD(tot, q);\n"
                 "        for (long long j = 0; j < @_K; j++)\n"
                 "            n += PTC_LD(tot, j * @_E + i);\n"
                 "        PTC_ST(f, i, (float)(all > 0 ? n / all : 0));\n"
                 "    }\n"},
    {PTC_OP_MOE_STATS, "const int *PTC_RESTRICT tot, float *PTC_RESTRICT o", "if", 1,
     LOOP("1") "        long long N = 0, kept = 0, mx = 0;\n"
               "        for (long long e = 0; e < @_E; e++)\n"
               "            N += PTC_LD(tot, e);\n"
               "        long long C = @_cap(N);\n"
               "        for (long long e = 0; e < @_E; e++) {\n"
               "            long long load = 0;\n"
               "            for (long long j = 0; j < @_K; j++) {\n"
               "                long long t = PTC_LD(tot, j * @_E + e), room = C - load;\n"
               "                kept += t < room ? t : room > 0 ? room : 0;\n"
               "                load += t;\n"
               "            }\n"
               "            mx = load > mx ? load : mx;\n"
               "        }\n"
               "        PTC_ST(o, 0, (float)(mx * @_E));\n"
               "        PTC_ST(o, 1, (float)(N * @_K - kept));\n"
               "        PTC_ST(o, 2, (float)(N * @_K));\n"
               "    }\n"},
    {PTC_OP_MOE_EP_COUNT, "const int *PTC_RESTRICT r, int *PTC_RESTRICT cnt", "ii", 1,
     LOOP("@_E") "        int c = 0;\n"
                 "        for (long long q = 0; q < @_R; q++)\n"
                 "            c += PTC_LD(r, q) == i;\n"
                 "        PTC_ST(cnt, i, c);\n"
                 "    }\n"},
};
/* clang-format on */

void ptc_cuda_emit_moe_route(const ptc_cuda_moe_route *m, const char *name, FILE *f)
{
    const struct route_kernel *rk = NULL;
    for (size_t i = 0; i < sizeof route_kernels / sizeof route_kernels[0]; i++)
        rk = route_kernels[i].op == (ptc_op)m->op ? &route_kernels[i] : rk;
    PTC_ASSERT(rk);
    fprintf(f,
            "/* routing %s: %s (cuda_moe.c) */\n#define %s_R %lldLL\n#define %s_E %lldLL\n"
            "#define %s_K %lldLL\n#define %s_B %lldLL\n#define %s_S %lldLL\n#define %s_NORM %d\n"
            "#define %s_CAP %d\n#define %s_DIGITS %lluULL\n#define %s_E10 %lld\n",
            name, ptc_ops[m->op].name, name, (long long)m->R, name, (long long)m->E, name,
            (long long)m->K, name, (long long)m->B, name, (long long)m->S, name,
            m->normalize ? 1 : 0, name, m->cap ? 1 : 0, name, (unsigned long long)m->digits, name,
            (long long)m->e10);
    if (m->op == PTC_OP_MOE_ROUTE || m->op == PTC_OP_MOE_STATS)
        ptc_cuda_put_named(f, route_cap, name);
    emit_kernels(f, name, 1, NULL, &rk->params, &rk->body, &rk->types, &rk->nout);
}

void ptc_cuda_emit_plan_moes(const ptc_plan *p, FILE *f)
{
    ptc_cuda_moe moe[64];
    ptc_cuda_moe_rows rows[64];
    ptc_cuda_moe_route routes[64];
    int nm = ptc_cuda_plan_moes(p, moe, 64), nr = ptc_cuda_plan_moe_rows(p, rows, 64),
        nt = ptc_cuda_plan_moe_routes(p, routes, 64);
    nm = nm < 64 ? nm : 64;
    nr = nr < 64 ? nr : 64;
    nt = nt < 64 ? nt : 64;
    for (int i = 0; i < nm + nr + nt; i++) {
        char name[32];
        fputc('\n', f);
        if (i < nm) {
            snprintf(name, sizeof name, "moe%d", i);
            ptc_cuda_emit_moe(&moe[i], name, f);
        } else if (i < nm + nr) {
            snprintf(name, sizeof name, "moerows%d", i - nm);
            ptc_cuda_emit_moe_rows(&rows[i - nm], name, f);
        } else {
            snprintf(name, sizeof name, "moeroute%d", i - nm - nr);
            ptc_cuda_emit_moe_route(&routes[i - nm - nr], name, f);
        }
    }
}
