/* cuda_attention.c - attention forward and backward as CUDA C in the flash-attention manner: keys
 * and values (queries, in the key-side backward) stream through shared memory in tiles, the
 * softmax is online (a running maximum and sum per query, the output rescaled as the maximum
 * grows), causal and grouped-query attention are handled in the index arithmetic, and no
 * s x s matrix is ever stored.
 *
 * The kernels, for one attention shape (q [B,S,H*dh], k and v [B,S2,G*dh], G kv heads):
 *   fwd     o = softmax(q k^T / sqrt(dh)) v; a thread per query row, a block per tile of
 *           blockDim.x queries of one (batch, head); the keys of a tile go in chunks of
 *           @_C, each chunk's scores first, then one rescale for the chunk's maximum;
 *   stats   the same pass, keeping per query row lse = max + log(sum) and D = dy . o (the two
 *           numbers the backward needs; the plan's attention keeps no softmax statistics, so the
 *           backward recomputes them: FlashAttention-2's backward with its forward's outputs
 *           recomputed);
 *   bwd_kv  dk and dv: two threads per key row, each holding half of the row's k, v and their
 *           gradients (their dot products meet through a warp shuffle), a block per tile of
 *           blockDim.x / 2 keys of one (batch, kv head), over the query heads that share the kv
 *           head and the query tiles (causal: from the key tile's first position on); no
 *           atomics, each dk/dv element has one writer;
 *   bwd_q   dq: a thread per query row over the key tiles.
 * Sums are f32. Tiles: the key (or query) tile in shared memory holds BK rows of k and v
 * (of q and dy); BK is 32 rows for sm_80 and 64 for sm_90, at most 48 KiB of static shared
 * memory; the threads of a block are 64 on sm_80 and 128 on sm_90. Rows of a head size that
 * divides by 4 are read from shared memory 4 floats at a time (PTC_LD4).
 * On an H200 (bench/results/gpu_2026-11-26.md, GPT-2 124M bf16, launches blocking), these
 * kernels took the backward from 122 to 95 ms a step, and the whole step from 227 to 200 ms. The
 * forward stayed at 21 ms: 310 GFLOP at about 22% of the f32 peak, bound by its multiply-adds,
 * as the backward is. The sizes are untuned. A 16-bit plan's attention runs on tensor cores
 * instead (cuda_attention_mma.c: 95 -> 30 ms backward, 21 -> 6 ms forward on the H200).
 */
#include "cuda_emit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "program.h"

static int rows_of(const ptc_cuda_arch *arch)
{
    return arch->sm >= 90 ? 128 : 64;
}

static int64_t tile_of(int sm, int64_t dh)
{
    int64_t bk = sm >= 90 ? 64 : 32, most = 48 * 1024 / (2 * 4 * dh + 8);
    return bk < most ? bk : most < 1 ? 1 : most;
}

void ptc_cuda_attention_launch(const ptc_cuda_attn *a, ptc_cuda_attn_kernel which,
                               const ptc_cuda_arch *arch, int *grid, int *block)
{
    if (a->mma) { /* warps of 16 rows, 4 a block (2 for bwd_kv above head size 64, its k and v
                   * rows in shared memory); every tile a block, the heaviest first */
        int b = which == PTC_CUDA_ATTN_BWD_KV && a->head_dim > 64 ? 64 : 128, rows = b / 2;
        int64_t n = which == PTC_CUDA_ATTN_BWD_KV
                        ? a->batch * a->kv_heads * ((a->kv_seq + rows - 1) / rows)
                        : a->batch * a->heads * ((a->seq + rows - 1) / rows);
        *block = b;
        *grid = (int)(n < 1 ? 1 : n > (1 << 24) ? 1 << 24 : n);
        return;
    }
    int64_t rows = rows_of(arch);
    int64_t keys = rows / 2; /* bwd_kv: two threads per key */
    int64_t n = which == PTC_CUDA_ATTN_BWD_KV
                    ? a->batch * a->kv_heads * ((a->kv_seq + keys - 1) / keys)
                    : a->batch * a->heads * ((a->seq + rows - 1) / rows);
    int64_t wave = (int64_t)arch->sms * (2048 / rows);
    *block = (int)rows;
    *grid = (int)(n < 1 ? 1 : n > wave ? wave : n);
}

const char *const ptc_cuda_attn_names[PTC_CUDA_ATTN_NKERNELS] = {"fwd", "stats", "bwd_kv",
                                                                 "bwd_q"};

void ptc_cuda_put_named(FILE *f, const char *text, const char *n)
{
    for (const char *c = text; *c; c++)
        if (*c == '@')
            fputs(n, f);
        else
            fputc(*c, f);
}

/* Row arithmetic over shared memory, four helpers from one template: @_dot (r . sh[row]) and
 * @_axpy (acc += p sh[row]) over a whole row of dh, and @_hdot and @_haxpy over half a row
 * (bwd_kv's lane: the dims at .. at + nd). Rows whose size divides by 4 (by 8 for halves) load 4
 * floats at a time; the sums keep the order of the one-at-a-time loop. */
static void emit_row_op(FILE *f, const char *n, bool axpy, bool half)
{
    char *text = NULL;
    size_t len = 0;
    FILE *t = open_memstream(&text, &len);
    const char *at = half ? "at + d" : "row * @_DH + d", *dims = half ? "@_HD" : "@_DH";
    fprintf(t, "PTC_DEVICE %s @_%s%s(%s, const float *sh, long long %s)\n{\n",
            axpy ? "void" : "float", half ? "h" : "", axpy ? "axpy" : "dot",
            axpy ? "float *acc, float p" : "const float *r", half ? "at, int nd" : "row");
    if (!axpy)
        fputs("    float s = 0.0f;\n", t);
    fprintf(t, "#if @_DH %% %d == 0\n%s", half ? 8 : 4, half ? "    (void)nd;\n" : "");
    fprintf(t, "    for (int d = 0; d < %s; d += 4) {\n", dims);
    fprintf(t, "        const float4 x = PTC_LD4(sh, (%s) / 4);\n", at);
    for (int i = 0; i < 4; i++) {
        char d[8];
        snprintf(d, sizeof d, i ? "d + %d" : "d", i);
        if (axpy)
            fprintf(t, "        acc[%s] += p * x.%c;\n", d, "xyzw"[i]);
        else
            fprintf(t, "        s += r[%s] * x.%c;\n", d, "xyzw"[i]);
    }
    fprintf(t, "    }\n#else\n    for (int d = 0; d < %s; d++)\n%s", dims,
            half ? "        if (d < nd)\n" : "");
    const char *pad = half ? "            " : "        ";
    if (axpy)
        fprintf(t, "%sacc[d] += p * PTC_LD(sh, %s);\n#endif\n}\n", pad, at);
    else
        fprintf(t, "%ss += r[d] * PTC_LD(sh, %s);\n#endif\n    return s;\n}\n", pad, at);
    fclose(t);
    ptc_cuda_put_named(f, text, n);
    free(text);
}

/* the constants of one shape, and the tile per architecture */
static void emit_defs(const ptc_cuda_attn *a, const char *n, FILE *f)
{
    fprintf(f,
            "/* attention %s: q [%lld, %lld, %lld x %lld], k and v [%lld, %lld, %lld x %lld]%s */\n"
            "#define %s_B %lldLL\n#define %s_S %lldLL\n#define %s_S2 %lldLL\n#define %s_H %lldLL\n"
            "#define %s_G %lldLL\n#define %s_DH %lld\n#define %s_CAUSAL %d\n"
            "#define %s_H0 %lldLL\n#define %s_R %lldLL\n"
            "#define %s_SCALE %.9ef\n"
            "#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900) || "
            "(defined(PTC_CUDA_EMU_ARCH) && PTC_CUDA_EMU_ARCH >= 900)\n"
            "#define %s_BK %lld\n#else\n#define %s_BK %lld\n#endif\n"
            "#define %s_C 8\n#define %s_HD ((%s_DH + 1) / 2)\n",
            n, (long long)a->batch, (long long)a->seq, (long long)a->heads, (long long)a->head_dim,
            (long long)a->batch, (long long)a->kv_seq, (long long)a->kv_heads,
            (long long)a->head_dim, a->causal ? ", causal" : "", n, (long long)a->batch, n,
            (long long)a->seq, n, (long long)a->kv_seq, n, (long long)a->heads, n,
            (long long)a->kv_heads, n, (long long)a->head_dim, n, a->causal ? 1 : 0, n,
            (long long)a->h0, n, (long long)(a->ratio ? a->ratio : a->heads / a->kv_heads), n,
            (double)(float)(1.0 / sqrt((double)a->head_dim)), n,
            (long long)tile_of(90, a->head_dim), n, (long long)tile_of(80, a->head_dim), n, n, n);
    /* q, k, v, dy and the results: f32, or 16-bit storage widened as loaded, rounded as stored */
    const char *cv = a->io == PTC_BF16 ? "bf16" : "f16";
    if (a->io)
        fprintf(f,
                "#define %s_IO16 1\n#define %s_T unsigned short\n"
                "#define %s_LDX(p, i) ptc_%s_f(PTC_LD(p, i))\n"
                "#define %s_STX(p, i, x) PTC_ST(p, i, ptc_f_%s(x))\n",
                n, n, n, cv, n, cv);
    else
        fprintf(f,
                "#define %s_IO16 0\n#define %s_T float\n#define %s_LDX(p, i) PTC_LD(p, i)\n"
                "#define %s_STX(p, i, x) PTC_ST(p, i, x)\n",
                n, n, n, n);
    if (a->mma) {
        ptc_cuda_emit_attn_mma_defs(a, n, f);
        return;
    }
    for (int h = 0; h < 4; h++)
        emit_row_op(f, n, h & 1, h >> 1);
}

/* The loop over the key tiles of fwd, stats and bwd_q: k and v rows j0.. in shared memory, and
 * jn, how many of them query i sees; the kernels' texts around it follow. */
static const char kv_tiles[] =
    "        /* the keys any query of the tile sees (causal: up to its last query) */\n"
    "        long long kend = @_S2;\n"
    "        if (@_CAUSAL && i0 + rows < kend)\n"
    "            kend = i0 + rows;\n"
    "        for (long long j0 = 0; j0 < kend; j0 += @_BK) {\n"
    "            __syncthreads(); /* the last tile's readers are done */\n"
    "            for (long long x = threadIdx.x; x < @_BK * @_DH; x += rows) {\n"
    "                const long long j = j0 + x / @_DH, at = (b * @_S2 + j) * (@_G * @_DH) + kh * @_DH + x % @_DH;\n"
    "                PTC_ST(ks, x, j < @_S2 ? @_LDX(k, at) : 0.0f);\n"
    "                PTC_ST(vs, x, j < @_S2 ? @_LDX(v, at) : 0.0f);\n"
    "            }\n"
    "            __syncthreads();\n"
    "            long long jn = @_S2 - j0 < @_BK ? @_S2 - j0 : @_BK;\n"
    "            if (@_CAUSAL && i + 1 - j0 < jn)\n"
    "                jn = i + 1 - j0;\n";

/* fwd and stats: one query row per thread, key/value tiles in shared memory, online softmax */
static const char fwd_body[] =
    "{\n"
    "    __shared__ __align__(16) float ks[@_BK * @_DH], vs[@_BK * @_DH];\n"
    "    const long long rows = blockDim.x, nqb = (@_S + rows - 1) / rows;\n"
    "    for (long long t = blockIdx.x; t < @_B * @_H * nqb; t += gridDim.x) {\n"
    "        const long long b = t / (@_H * nqb), h = t / nqb % @_H, i0 = t % nqb * rows;\n"
    "        const long long kh = (h + @_H0) / @_R, i = i0 + threadIdx.x;\n"
    "        const int live = i < @_S;\n"
    "        float qr[@_DH], acc[@_DH], m = -PTC_INF, l = 0.0f;\n"
    "        for (int d = 0; d < @_DH; d++) {\n"
    "            qr[d] = live ? @_LDX(q, (b * @_S + i) * (@_H * @_DH) + h * @_DH + d) * @_SCALE : 0.0f;\n"
    "            acc[d] = 0.0f;\n"
    "        }\n";

static const char fwd_loop[] =
    "            for (long long jc = 0; live && jc < jn; jc += @_C) {\n"
    "                /* the chunk's scores, then one rescale for its maximum */\n"
    "                float sc[@_C], mx = m;\n"
    "                for (int c = 0; c < @_C; c++) {\n"
    "                    sc[c] = jc + c < jn ? @_dot(qr, ks, jc + c) : -PTC_INF;\n"
    "                    mx = sc[c] > mx ? sc[c] : mx;\n"
    "                }\n"
    "                if (mx > m) {\n"
    "                    const float r = expf(m - mx);\n"
    "                    l *= r;\n"
    "                    for (int d = 0; d < @_DH; d++)\n"
    "                        acc[d] *= r;\n"
    "                    m = mx;\n"
    "                }\n"
    "                for (int c = 0; c < @_C; c++)\n"
    "                    if (jc + c < jn) {\n"
    "                        const float p = expf(sc[c] - m);\n"
    "                        l += p;\n"
    "                        @_axpy(acc, p, vs, jc + c);\n"
    "                    }\n"
    "            }\n"
    "        }\n"
    "        if (!live)\n"
    "            continue;\n";

static const char fwd_tail[] =
    "        for (int d = 0; d < @_DH; d++)\n"
    "            @_STX(o, (b * @_S + i) * (@_H * @_DH) + h * @_DH + d, acc[d] / l);\n"
    "    }\n"
    "}\n";

static const char stats_tail[] =
    "        float dd = 0.0f;\n"
    "        for (int d = 0; d < @_DH; d++)\n"
    "            dd += @_LDX(dy, (b * @_S + i) * (@_H * @_DH) + h * @_DH + d) * (acc[d] / l);\n"
    "        PTC_ST(lse, (b * @_H + h) * @_S + i, m + logf(l));\n"
    "        PTC_ST(dsum, (b * @_H + h) * @_S + i, dd);\n"
    "    }\n"
    "}\n";

/* dk, dv: two threads per key row (lanes 2k and 2k + 1 of a warp: dims 0 .. HD and HD .. dh)
 * over the query tiles of every query head of its kv head. Every lane runs every query of a
 * tile (the shuffle needs the whole warp); causality and rows past the end weigh zero. */
static const char bwd_kv[] =
    "{\n"
    "    __shared__ __align__(16) float qs[@_BK * @_DH], ds[@_BK * @_DH];\n"
    "    __shared__ float ls[@_BK], dd[@_BK];\n"
    "    const long long rows = blockDim.x, keys = rows / 2, nkb = (@_S2 + keys - 1) / keys;\n"
    "    const int half = threadIdx.x & 1, d0 = half ? @_HD : 0, nd = half ? @_DH - @_HD : @_HD;\n"
    "    for (long long t = blockIdx.x; t < @_B * @_G * nkb; t += gridDim.x) {\n"
    "        const long long b = t / (@_G * nkb), kh = t / nkb % @_G, j0 = t % nkb * keys;\n"
    "        const long long j = j0 + threadIdx.x / 2;\n"
    "        const int live = j < @_S2;\n"
    "        float kr[@_HD], vr[@_HD], gk[@_HD], gv[@_HD];\n"
    "        for (int d = 0; d < @_HD; d++) {\n"
    "            const long long at = (b * @_S2 + j) * (@_G * @_DH) + kh * @_DH + d0 + d;\n"
    "            kr[d] = live && d < nd ? @_LDX(k, at) : 0.0f;\n"
    "            vr[d] = live && d < nd ? @_LDX(v, at) : 0.0f;\n"
    "            gk[d] = gv[d] = 0.0f;\n"
    "        }\n"
    "        for (long long h = PTC_IMAX(kh * @_R - @_H0, 0); h < PTC_IMIN((kh + 1) * @_R - @_H0, @_H); h++) {\n"
    "            /* causal: queries before the tile's first key see none of its keys */\n"
    "            for (long long i0 = @_CAUSAL ? j0 : 0; i0 < @_S; i0 += @_BK) {\n"
    "                __syncthreads();\n"
    "                for (long long x = threadIdx.x; x < @_BK * @_DH; x += rows) {\n"
    "                    const long long i = i0 + x / @_DH, at = (b * @_S + i) * (@_H * @_DH) + h * @_DH + x % @_DH;\n"
    "                    PTC_ST(qs, x, i < @_S ? @_LDX(q, at) : 0.0f);\n"
    "                    PTC_ST(ds, x, i < @_S ? @_LDX(dy, at) : 0.0f);\n"
    "                }\n"
    "                for (long long x = threadIdx.x; x < @_BK; x += rows) {\n"
    "                    const long long i = i0 + x;\n"
    "                    PTC_ST(ls, x, i < @_S ? PTC_LD(lse, (b * @_H + h) * @_S + i) : 0.0f);\n"
    "                    PTC_ST(dd, x, i < @_S ? PTC_LD(dsum, (b * @_H + h) * @_S + i) : 0.0f);\n"
    "                }\n"
    "                __syncthreads();\n"
    "                const long long in = @_S - i0 < @_BK ? @_S - i0 : @_BK;\n"
    "                for (long long ii = 0; ii < in; ii++) {\n"
    "                    const long long at = ii * @_DH + d0;\n"
    "                    float s = @_hdot(kr, qs, at, nd), dp = @_hdot(vr, ds, at, nd);\n"
    "                    s += __shfl_xor_sync(0xffffffffu, s, 1);\n"
    "                    dp += __shfl_xor_sync(0xffffffffu, dp, 1);\n"
    "                    if (!live || (@_CAUSAL && i0 + ii < j))\n"
    "                        continue;\n"
    "                    const float p = expf(s * @_SCALE - PTC_LD(ls, ii)), g = p * (dp - PTC_LD(dd, ii)) * @_SCALE;\n"
    "                    @_haxpy(gv, p, ds, at, nd);\n"
    "                    @_haxpy(gk, g, qs, at, nd);\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "        for (int d = 0; live && d < nd; d++) {\n"
    "            const long long at = (b * @_S2 + j) * (@_G * @_DH) + kh * @_DH + d0 + d;\n"
    "            @_STX(dk, at, gk[d]);\n"
    "            @_STX(dv, at, gv[d]);\n"
    "        }\n"
    "    }\n"
    "}\n";

/* dq: one query row per thread over the key tiles */
static const char bwd_q[] =
    "{\n"
    "    __shared__ __align__(16) float ks[@_BK * @_DH], vs[@_BK * @_DH];\n"
    "    const long long rows = blockDim.x, nqb = (@_S + rows - 1) / rows;\n"
    "    for (long long t = blockIdx.x; t < @_B * @_H * nqb; t += gridDim.x) {\n"
    "        const long long b = t / (@_H * nqb), h = t / nqb % @_H, i0 = t % nqb * rows;\n"
    "        const long long kh = (h + @_H0) / @_R, i = i0 + threadIdx.x;\n"
    "        const int live = i < @_S;\n"
    "        const long long qo = (b * @_S + i) * (@_H * @_DH) + h * @_DH;\n"
    "        float qr[@_DH], dr[@_DH], gq[@_DH];\n"
    "        for (int d = 0; d < @_DH; d++) {\n"
    "            qr[d] = live ? @_LDX(q, qo + d) : 0.0f;\n"
    "            dr[d] = live ? @_LDX(dy, qo + d) : 0.0f;\n"
    "            gq[d] = 0.0f;\n"
    "        }\n"
    "        const float l = live ? PTC_LD(lse, (b * @_H + h) * @_S + i) : 0.0f;\n"
    "        const float D = live ? PTC_LD(dsum, (b * @_H + h) * @_S + i) : 0.0f;\n";

static const char bwd_q_loop[] =
    "            for (long long jj = 0; live && jj < jn; jj++) {\n"
    "                const float s = @_dot(qr, ks, jj), dp = @_dot(dr, vs, jj);\n"
    "                const float g = expf(s * @_SCALE - l) * (dp - D) * @_SCALE;\n"
    "                @_axpy(gq, g, ks, jj);\n"
    "            }\n"
    "        }\n"
    "        for (int d = 0; live && d < @_DH; d++)\n"
    "            @_STX(dq, qo + d, gq[d]);\n"
    "    }\n"
    "}\n";

static const char *const params[PTC_CUDA_ATTN_NKERNELS] = {
    "const @_T *PTC_RESTRICT q, const @_T *PTC_RESTRICT k, const @_T *PTC_RESTRICT v, "
    "@_T *PTC_RESTRICT o",
    "const @_T *PTC_RESTRICT q, const @_T *PTC_RESTRICT k, const @_T *PTC_RESTRICT v, "
    "const @_T *PTC_RESTRICT dy, float *PTC_RESTRICT lse, float *PTC_RESTRICT dsum",
    "const @_T *PTC_RESTRICT q, const @_T *PTC_RESTRICT k, const @_T *PTC_RESTRICT v, "
    "const @_T *PTC_RESTRICT dy, const float *PTC_RESTRICT lse, const float *PTC_RESTRICT dsum, "
    "@_T *PTC_RESTRICT dk, @_T *PTC_RESTRICT dv",
    "const @_T *PTC_RESTRICT q, const @_T *PTC_RESTRICT k, const @_T *PTC_RESTRICT v, "
    "const @_T *PTC_RESTRICT dy, const float *PTC_RESTRICT lse, const float *PTC_RESTRICT dsum, "
    "@_T *PTC_RESTRICT dq",
};
static const int nparams[PTC_CUDA_ATTN_NKERNELS] = {4, 6, 8, 7};
static const int nouts[PTC_CUDA_ATTN_NKERNELS] = {1, 2, 2, 1};

void ptc_cuda_emit_attention(const ptc_cuda_attn *a, const char *name, FILE *f)
{
    emit_defs(a, name, f);
    for (int w = 0; w < PTC_CUDA_ATTN_NKERNELS; w++) {
        fputs("/* launch:", f);
        for (int r = 0; r < ptc_cuda_narchs; r++) {
            int g, b;
            ptc_cuda_attention_launch(a, (ptc_cuda_attn_kernel)w, &ptc_cuda_archs[r], &g, &b);
            fprintf(f, "%s sm_%d: grid %d, block %d", r ? "," : "", ptc_cuda_archs[r].sm, g, b);
        }
        fprintf(f, " */\nPTC_KERNEL __launch_bounds__(128) k_%s_%s(", name,
                ptc_cuda_attn_names[w]);
        ptc_cuda_put_named(f, params[w], name);
        fputs(")\n", f);
        switch (a->mma ? -1 : w) {
        case -1: ptc_cuda_emit_attn_mma_body((ptc_cuda_attn_kernel)w, name, f); break;
        case PTC_CUDA_ATTN_FWD:
            ptc_cuda_put_named(f, fwd_body, name);
            ptc_cuda_put_named(f, kv_tiles, name);
            ptc_cuda_put_named(f, fwd_loop, name);
            ptc_cuda_put_named(f, fwd_tail, name);
            break;
        case PTC_CUDA_ATTN_STATS:
            ptc_cuda_put_named(f, fwd_body, name);
            ptc_cuda_put_named(f, kv_tiles, name);
            ptc_cuda_put_named(f, fwd_loop, name);
            ptc_cuda_put_named(f, stats_tail, name);
            break;
        case PTC_CUDA_ATTN_BWD_KV: ptc_cuda_put_named(f, bwd_kv, name); break;
        default:
            ptc_cuda_put_named(f, bwd_q, name);
            ptc_cuda_put_named(f, kv_tiles, name);
            ptc_cuda_put_named(f, bwd_q_loop, name);
            break;
        }
        fprintf(f, "#ifdef PTC_CUDA_EMULATE\nvoid k_%s_%s__emu(void *const *a)\n{\n    k_%s_%s(",
                name, ptc_cuda_attn_names[w], name, ptc_cuda_attn_names[w]);
        for (int i = 0; i < nparams[w]; i++) { /* (lse and dsum are f32 scratch) */
            bool stat = w != PTC_CUDA_ATTN_FWD && i >= 4 && i < 6;
            fprintf(f, "%s(%s%s%s *)a[%d]", i ? ", " : "",
                    i < nparams[w] - nouts[w] ? "const " : "", stat ? "float" : name,
                    stat ? "" : "_T", i);
        }
        fputs(");\n}\n#endif\n", f);
    }
}

bool ptc_cuda_attn_same(const ptc_cuda_attn *a, const ptc_cuda_attn *b)
{
    return a->batch == b->batch && a->seq == b->seq && a->kv_seq == b->kv_seq &&
           a->heads == b->heads && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
           a->h0 == b->h0 && a->ratio == b->ratio && a->causal == b->causal && a->mma == b->mma &&
           a->io == b->io;
}

/* The 16-bit type buffer b of pg is an f32 copy of (the result of a cast from it), or 0. */
static int widened_from(const ptc_program *pg, int b)
{
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        for (int k = 0; k < in->nout; k++)
            if (in->out[k] == b) {
                int dt = in->kind == PTC_INSTR_KERNEL && in->op == PTC_OP_CAST && in->nin == 1
                             ? pg->bufs[in->in[0]].type.dtype
                             : 0;
                return dt == PTC_BF16 || dt == PTC_F16 ? dt : 0;
            }
    }
    return 0;
}

bool ptc_cuda_attn_of(const ptc_program *pg, const ptc_instr *in, int coord, ptc_cuda_attn *a)
{
    bool shard = in->op == PTC_OP_ATTENTION_SHARD || in->op == PTC_OP_ATTENTION_SHARD_GRAD;
    if (in->op != PTC_OP_ATTENTION && in->op != PTC_OP_ATTENTION_GRAD && !shard)
        return false;
    const ptc_type *tq = &pg->bufs[in->in[0]].type, *tk = &pg->bufs[in->in[1]].type;
    int64_t heads = in->attrs.heads, kv = in->attrs.kv_heads ? in->attrs.kv_heads : heads;
    *a = (ptc_cuda_attn){.batch = tq->dims[0], .seq = tq->dims[1], .kv_seq = tk->dims[1],
                         .heads = heads, .kv_heads = kv, .head_dim = tq->dims[2] / heads,
                         .causal = in->attrs.causal};
    if (shard) {
        a->h0 = (int64_t)coord * heads;
        a->ratio = in->attrs.n / kv;
    }
    /* 16-bit storage (the verifier holds every operand and result to q's type), or f32 */
    int dt = tq->dtype;
    a->io = dt == PTC_BF16 || dt == PTC_F16 ? dt : 0;
    /* tensor cores when every operand (q, k, v, and dy of the gradient) is, or was widened
     * from, one 16-bit type */
    int mma = !ptc_cuda_attn_mma_fits(a->head_dim) ? 0 : a->io ? a->io : widened_from(pg, in->in[0]);
    for (int k = 1; k < in->nin && mma && !a->io; k++)
        if (widened_from(pg, in->in[k]) != mma)
            mma = 0;
    a->mma = mma;
    return true;
}

int ptc_cuda_plan_attentions(const ptc_plan *p, ptc_cuda_attn *out, int cap)
{
    int n = 0;
    for (int g = 0; g < p->nprograms; g++) {
        const ptc_program *pg = &p->programs[g];
        for (int i = 0; i < pg->ninstrs; i++) {
            const ptc_instr *in = &pg->instrs[i];
            bool shard = in->op == PTC_OP_ATTENTION_SHARD || in->op == PTC_OP_ATTENTION_SHARD_GRAD;
            /* a shard's every coordinate on its axis */
            int ncoords = shard && p->mesh.naxes ? p->mesh.sizes[in->attrs.mesh_axis] : 1;
            for (int c = 0; c < ncoords; c++) {
                ptc_cuda_attn a;
                if (in->kind != PTC_INSTR_KERNEL || !ptc_cuda_attn_of(pg, in, c, &a))
                    break;
                bool seen = false;
                for (int j = 0; j < n && j < cap && !seen; j++)
                    seen = ptc_cuda_attn_same(&out[j], &a);
                if (!seen) {
                    if (n < cap)
                        out[n] = a;
                    n++;
                }
            }
        }
    }
    return n;
}

void ptc_cuda_emit_plan(const ptc_plan *p, FILE *f)
{
    ptc_cuda_emit_unit(p->kernels, p->nkernels, f);
    ptc_cuda_attn at[64];
    int n = ptc_cuda_plan_attentions(p, at, 64);
    for (int i = 0; i < n && i < 64; i++) {
        char name[32];
        snprintf(name, sizeof name, "attn%d", i);
        fputc('\n', f);
        ptc_cuda_emit_attention(&at[i], name, f);
    }
    ptc_cuda_emit_plan_moes(p, f);
}
