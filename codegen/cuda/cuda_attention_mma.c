/* cuda_attention_mma.c - the attention kernels on tensor cores (mma.sync, sm_80 on), for the
 * attention of a 16-bit plan: its q, k, v and dy are f32 copies of bf16 (or f16) tensors (the
 * lowering widens a 16-bit kernel's operands), so rounding them back to 16 bits for the
 * multiplier loses nothing, and the products q k^T and dy v^T are the f32 kernels' up to the
 * order of the sums. What does round is what FlashAttention-2 rounds in 16-bit training: the
 * probabilities p before p v and dp = p (dp - D) before its products. Sums, the softmax and the
 * statistics stay f32, and the results are f32 as before (the plan narrows them).
 *
 * The same four kernels as cuda_attention.c, with the same parameters; the work is split by warps:
 *   fwd, stats  a warp owns 16 query rows (a block: blockDim.x / 2 rows of one (batch, head)), its
 *               q in registers as A fragments; key and value tiles of KT rows go through shared
 *               memory as 16-bit; per tile, s = q k^T (16 x KT in f32 fragments), the online
 *               softmax on them (a row's maximum and sum meet across the 4 lanes of a quad by
 *               shuffles), and o += p v with p's fragments repacked as A operands in registers
 *               (the m16n8k16 accumulator layout is the A layout);
 *   bwd_kv      a warp owns 16 key rows (k and v as A fragments), over the query tiles of KT of
 *               every query head of its kv head: s^T = k q^T, dp^T = v dy^T, p^T and
 *               ds^T = p^T (dp^T - D), then dv += p^T dy and dk += ds^T q; one writer per element;
 *   bwd_q       a warp owns 16 query rows (q and dy as A fragments), over the key tiles:
 *               s = q k^T, dp = dy v^T, ds = p (dp - D), dq += ds k.
 * Shared rows are head_dim + 8 16-bit elements long, so that the fragment loads of a warp fall
 * in distinct banks. Causal attention orders the tiles heaviest first (the last query tiles for
 * fwd, stats, bwd_q; the first key tiles for bwd_kv), so that the short tiles fill the tail.
 * Head sizes: multiples of 16 up to 128; others take cuda_attention.c's kernels. KT is 64 rows,
 * 32 above head size 64 (the registers of the score fragments); there bwd_kv, in blocks of 64
 * threads, keeps its 32 key rows in shared memory and loads their fragments for each product,
 * since k, v, dk and dv of 16 rows in registers would spill.
 */
#include "cuda_emit.h"

#include <math.h>

bool ptc_cuda_attn_mma_fits(int64_t head_dim)
{
    return head_dim > 0 && head_dim % 16 == 0 && head_dim <= 128;
}

/* The multiply-add and the 16-bit packing, once per translation unit. */
static const char helpers[] = /* (the GPU's; helpers_emu the emulation's) */
    "#ifndef PTC_MMA_HELPERS\n"
    "#define PTC_MMA_HELPERS\n"
    "/* Tensor cores: a warp's d += a b over 16 x 16 x 8 (m16n8k16: 16-bit a and b, f32 d), in\n"
    " * mma.sync's fragments: lane 4g + c holds A's rows g and g + 8 at columns 2c, 2c + 1 and\n"
    " * 8 more, B's column g at rows 2c, 2c + 1 and 8 more, D's rows g and g + 8 at columns 2c,\n"
    " * 2c + 1; two 16-bit elements a word, the lower column (row of B) in the low half. */\n"
    "#ifndef PTC_CUDA_EMULATE\n"
    "#define PTC_UNROLL _Pragma(\"unroll\")\n"
    "#define PTC_LD2(p, i) (*reinterpret_cast<const unsigned *>((p) + (i)))\n"
    "#define PTC_ST2(p, i, u) (*reinterpret_cast<unsigned *>((p) + (i)) = (u))\n"
    "/* 16 bytes from global x + at to shared sh + i without the registers (zeros unless ok),\n"
    " * in flight until the thread's group is waited for (cp.async, sm_80 on) */\n"
    "PTC_DEVICE void ptc_cp16(unsigned short *sh, const unsigned short *x, int ok)\n"
    "{\n"
    "    asm volatile(\"{ .reg .u64 s; .reg .u32 t; cvta.to.shared.u64 s, %0; cvt.u32.u64 t, s; \"\n"
    "                 \"cp.async.cg.shared.global [t], [%1], 16, %2; }\"\n"
    "                 :: \"l\"(sh), \"l\"(x), \"r\"(ok ? 16 : 0) : \"memory\");\n"
    "}\n"
    "#define PTC_CP16(sh, i, x, at, ok) ptc_cp16((sh) + (i), (x) + (at), ok)\n"
    "/* ldmatrix.m8n8, 16-bit: lane 8m + i names row i of matrix m; lane 4g + c gets word m:\n"
    " * elements 2c, 2c + 1 of row g (trans: rows 2c, 2c + 1 of column g) */\n"
    "PTC_DEVICE void ptc_ldsm2(unsigned *r, const unsigned short *p)\n"
    "{\n"
    "    asm volatile(\"{ .reg .u64 s; .reg .u32 t; cvta.to.shared.u64 s, %2; cvt.u32.u64 t, s; \"\n"
    "                 \"ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [t]; }\"\n"
    "                 : \"=r\"(r[0]), \"=r\"(r[1]) : \"l\"(p) : \"memory\");\n"
    "}\n"
    "PTC_DEVICE void ptc_ldsm4t(unsigned *r, const unsigned short *p)\n"
    "{\n"
    "    asm volatile(\"{ .reg .u64 s; .reg .u32 t; cvta.to.shared.u64 s, %4; cvt.u32.u64 t, s; \"\n"
    "                 \"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [t]; }\"\n"
    "                 : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"l\"(p) : \"memory\");\n"
    "}\n"
    "#define PTC_CP_COMMIT() asm volatile(\"cp.async.commit_group;\" ::: \"memory\")\n"
    "#define PTC_CP_WAIT(n) asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(n) : \"memory\")\n"
    "PTC_DEVICE void ptc_mma_bf16(float *d, const unsigned *a, const unsigned *b)\n"
    "{\n"
    "    asm(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, \"\n"
    "        \"{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\"\n"
    "        : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n"
    "        : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n"
    "}\n"
    "PTC_DEVICE void ptc_mma_f16(float *d, const unsigned *a, const unsigned *b)\n"
    "{\n"
    "    asm(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, \"\n"
    "        \"{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\"\n"
    "        : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n"
    "        : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n"
    "}\n"
    "PTC_DEVICE unsigned ptc_pk_bf16(float lo, float hi)\n"
    "{\n"
    "    unsigned u;\n"
    "    asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(u) : \"f\"(hi), \"f\"(lo));\n"
    "    return u;\n"
    "}\n"
    "PTC_DEVICE unsigned ptc_pk_f16(float lo, float hi)\n"
    "{\n"
    "    unsigned u;\n"
    "    asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(u) : \"f\"(hi), \"f\"(lo));\n"
    "    return u;\n"
    "}\n"
    "#else\n";
static const char helpers_emu[] =
    "#define PTC_UNROLL\n"
    "#define PTC_LD2(p, i) ((unsigned)PTC_LD(p, i) | (unsigned)PTC_LD(p, (i) + 1) << 16)\n"
    "#define PTC_CP16(sh, i, x, at, ok)                                         \\\n"
    "    do {                                                                   \\\n"
    "        for (int ptc_e = 0; ptc_e < 8; ptc_e++)                            \\\n"
    "            PTC_ST(sh, (i) + ptc_e, (ok) ? PTC_LD(x, (at) + ptc_e) : 0);   \\\n"
    "    } while (0)\n"
    "#define PTC_CP_COMMIT() ((void)0)\n"
    "#define PTC_CP_WAIT(n) ((void)0)\n"
    "#define PTC_ST2(p, i, u)                                                   \\\n"
    "    do {                                                                   \\\n"
    "        const unsigned ptc_u2 = (u);                                       \\\n"
    "        PTC_ST(p, i, (unsigned short)ptc_u2);                              \\\n"
    "        PTC_ST(p, (i) + 1, (unsigned short)(ptc_u2 >> 16));                \\\n"
    "    } while (0)\n"
    "/* the warp's fragments from ptc_emu_mma_share; each product exact in f32, summed in k\n"
    " * order */\n"
    "static void ptc_mma_emu(float *d, const unsigned *a, const unsigned *b, int f16)\n"
    "{\n"
    "    const unsigned (*s)[6] = ptc_emu_mma_share(a, b);\n"
    "    const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, c = lane & 3;\n"
    "    for (int e = 0; e < 4; e++) {\n"
    "        const int row = g + 8 * (e >> 1), col = 2 * c + (e & 1);\n"
    "        float acc = d[e];\n"
    "        for (int k = 0; k < 16; k++) {\n"
    "            const unsigned wa = s[(row & 7) * 4 + (k & 7) / 2][(row >> 3) + 2 * (k >> 3)];\n"
    "            const unsigned wb = s[col * 4 + (k & 7) / 2][4 + (k >> 3)];\n"
    "            const unsigned short ha = (unsigned short)(wa >> 16 * (k & 1));\n"
    "            const unsigned short hb = (unsigned short)(wb >> 16 * (k & 1));\n"
    "            acc += f16 ? ptc_f16_f(ha) * ptc_f16_f(hb) : ptc_bf16_f(ha) * ptc_bf16_f(hb);\n"
    "        }\n"
    "        d[e] = acc;\n"
    "    }\n"
    "    ptc_emu_mma_done();\n"
    "}\n"
    "PTC_DEVICE void ptc_mma_bf16(float *d, const unsigned *a, const unsigned *b)\n"
    "{\n"
    "    ptc_mma_emu(d, a, b, 0);\n"
    "}\n"
    "static void ptc_ldsm_emu(unsigned *r, int n, int trans, const unsigned short *p)\n"
    "{\n"
    "    const unsigned short *const *rows = ptc_emu_rows_share(p);\n"
    "    const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, c = lane & 3;\n"
    "    for (int m = 0; m < n; m++) {\n"
    "        const unsigned short *const *mr = rows + 8 * m;\n"
    "        const unsigned lo = trans ? PTC_LD(mr[2 * c], g) : PTC_LD(mr[g], 2 * c);\n"
    "        const unsigned hi = trans ? PTC_LD(mr[2 * c + 1], g) : PTC_LD(mr[g], 2 * c + 1);\n"
    "        r[m] = lo | hi << 16;\n"
    "    }\n"
    "    ptc_emu_mma_done();\n"
    "}\n"
    "PTC_DEVICE void ptc_ldsm2(unsigned *r, const unsigned short *p)\n"
    "{\n"
    "    ptc_ldsm_emu(r, 2, 0, p);\n"
    "}\n"
    "PTC_DEVICE void ptc_ldsm4t(unsigned *r, const unsigned short *p)\n"
    "{\n"
    "    ptc_ldsm_emu(r, 4, 1, p);\n"
    "}\n"
    "PTC_DEVICE void ptc_mma_f16(float *d, const unsigned *a, const unsigned *b)\n"
    "{\n"
    "    ptc_mma_emu(d, a, b, 1);\n"
    "}\n"
    "PTC_DEVICE unsigned ptc_pk_bf16(float lo, float hi)\n"
    "{\n"
    "    return (unsigned)ptc_f_bf16(lo) | (unsigned)ptc_f_bf16(hi) << 16;\n"
    "}\n"
    "PTC_DEVICE unsigned ptc_pk_f16(float lo, float hi)\n"
    "{\n"
    "    return (unsigned)ptc_f_f16(lo) | (unsigned)ptc_f_f16(hi) << 16;\n"
    "}\n"
    "#endif\n"
    "#endif\n";

/* Per shape: the row loader (nr rows of one head of x [.., rows, F] from row r0, zeros past n,
 * rounded to 16 bits; x 16-byte aligned, as every buffer of the memory plan is; @_tile loads a
 * tile of KT), A fragments from global or shared rows, the products of a tile, and the quad's sum
 * and maximum. @ is the attention's name; KT, the tile's rows, comes with the shape's constants. */
static const char shape_helpers[] =
    "#define @_LDS (@_DH + 8)\n"
    "PTC_DEVICE void @_rows_to(unsigned short *sh, int nr, const @_T *PTC_RESTRICT x,\n"
    "                          long long base, long long F, long long r0, long long n)\n"
    "{\n"
    "    for (int e = (int)threadIdx.x; e < nr * @_DH / 4; e += (int)blockDim.x) {\n"
    "        const int r = e / (@_DH / 4), d = e % (@_DH / 4) * 4;\n"
    "        unsigned u0 = 0u, u1 = 0u;\n"
    "        if (r0 + r < n) { /* base, F and d are multiples of 4: 8 or 16 bytes at once */\n"
    "#if @_IO16\n"
    "            u0 = PTC_LD2(x, base + (r0 + r) * F + d);\n"
    "            u1 = PTC_LD2(x, base + (r0 + r) * F + d + 2);\n"
    "#else\n"
    "            const float4 f = PTC_LD4(x, (base + (r0 + r) * F + d) / 4);\n"
    "            u0 = @_PK(f.x, f.y);\n"
    "            u1 = @_PK(f.z, f.w);\n"
    "#endif\n"
    "        }\n"
    "        PTC_ST2(sh, r * @_LDS + d, u0);\n"
    "        PTC_ST2(sh, r * @_LDS + d + 2, u1);\n"
    "    }\n"
    "}\n"
    "#define @_tile(sh, x, base, F, r0, n) @_rows_to(sh, @_KT, x, base, F, r0, n)\n";

/* Per shape over 16-bit storage: tiles issued asynchronously into shared memory. */
static const char async_helpers[] =
    "#if @_DBQ || @_DBK\n"
    "/* the same over 16-bit storage, issued (cp.async) rather than done: straight copies of 16\n"
    " * bytes, base, F and d multiples of 8 */\n"
    "PTC_DEVICE void @_rows_async(unsigned short *sh, int nr, const @_T *PTC_RESTRICT x,\n"
    "                             long long base, long long F, long long r0, long long n)\n"
    "{\n"
    "    for (int e = (int)threadIdx.x; e < nr * @_DH / 8; e += (int)blockDim.x) {\n"
    "        const int r = e / (@_DH / 8), d = e % (@_DH / 8) * 8, ok = r0 + r < n;\n"
    "        PTC_CP16(sh, r * @_LDS + d, x, ok ? base + (r0 + r) * F + d : 0, ok);\n"
    "    }\n"
    "}\n"
    "#endif\n"
    "#if @_DBQ\n"
    "/* fwd, stats, bwd_q: key and value tile j0 of (b, kv head kh) issued into kt and vt */\n"
    "PTC_DEVICE void @_kv_issue(unsigned short *kt, unsigned short *vt, const @_T *PTC_RESTRICT k,\n"
    "                           const @_T *PTC_RESTRICT v, long long b, long long kh, long long j0)\n"
    "{\n"
    "    @_rows_async(kt, @_KT, k, b * @_S2 * (@_G * @_DH) + kh * @_DH, @_G * @_DH, j0, @_S2);\n"
    "    @_rows_async(vt, @_KT, v, b * @_S2 * (@_G * @_DH) + kh * @_DH, @_G * @_DH, j0, @_S2);\n"
    "    PTC_CP_COMMIT();\n"
    "}\n"
    "#endif\n"
    "#if @_DBK\n"
    "/* bwd_kv: query and dy tile i0 of (b, head h) issued into qt and dt, its lse (base 2) and D\n"
    " * stored into lt and dt2 */\n"
    "PTC_DEVICE void @_q_issue(unsigned short *qt, unsigned short *dt, float *lt, float *dt2,\n"
    "                          const @_T *PTC_RESTRICT q, const @_T *PTC_RESTRICT dy,\n"
    "                          const float *PTC_RESTRICT lse, const float *PTC_RESTRICT dsum,\n"
    "                          long long b, long long h, long long i0)\n"
    "{\n"
    "    @_rows_async(qt, @_KT, q, b * @_S * (@_H * @_DH) + h * @_DH, @_H * @_DH, i0, @_S);\n"
    "    @_rows_async(dt, @_KT, dy, b * @_S * (@_H * @_DH) + h * @_DH, @_H * @_DH, i0, @_S);\n"
    "    PTC_CP_COMMIT();\n"
    "    for (int x = (int)threadIdx.x; x < @_KT; x += (int)blockDim.x) {\n"
    "        const long long i = i0 + x;\n"
    "        PTC_ST(lt, x, i < @_S ? PTC_LD(lse, (b * @_H + h) * @_S + i) * 1.442695041f : 0.0f);\n"
    "        PTC_ST(dt2, x, i < @_S ? PTC_LD(dsum, (b * @_H + h) * @_S + i) : 0.0f);\n"
    "    }\n"
    "}\n"
    "#endif\n";

static const char shape_helpers2[] =
    "PTC_DEVICE unsigned @_pair(const @_T *PTC_RESTRICT x, long long at, int d)\n"
    "{\n"
    "#if @_IO16\n"
    "    return at < 0 ? 0u : PTC_LD2(x, at + d);\n"
    "#else\n"
    "    return at < 0 ? 0u : @_PK(PTC_LD(x, at + d), PTC_LD(x, at + d + 1));\n"
    "#endif\n"
    "}\n"
    "/* A fragments of a warp's 16 rows (row offsets a0, a1: -1 past the end) over dh */\n"
    "PTC_DEVICE void @_rows(unsigned (*fa)[4], const @_T *PTC_RESTRICT x, long long a0,\n"
    "                       long long a1, int c)\n"
    "{\n"
    "    PTC_UNROLL\n"
    "    for (int s = 0; s < @_DH / 16; s++) {\n"
    "        fa[s][0] = @_pair(x, a0, s * 16 + 2 * c);\n"
    "        fa[s][1] = @_pair(x, a1, s * 16 + 2 * c);\n"
    "        fa[s][2] = @_pair(x, a0, s * 16 + 2 * c + 8);\n"
    "        fa[s][3] = @_pair(x, a1, s * 16 + 2 * c + 8);\n"
    "    }\n"
    "}\n"
    "/* A fragments of a warp's 16 rows over dh from shared rows r0 .. r0 + 15 */\n"
    "PTC_DEVICE void @_afrags(unsigned (*fa)[4], const unsigned short *sh, int r0, int g, int c)\n"
    "{\n"
    "    PTC_UNROLL\n"
    "    for (int s = 0; s < @_DH / 16; s++) {\n"
    "        const int at = (r0 + g) * @_LDS + s * 16 + 2 * c;\n"
    "        fa[s][0] = PTC_LD2(sh, at);\n"
    "        fa[s][1] = PTC_LD2(sh, at + 8 * @_LDS);\n"
    "        fa[s][2] = PTC_LD2(sh, at + 8);\n"
    "        fa[s][3] = PTC_LD2(sh, at + 8 * @_LDS + 8);\n"
    "    }\n"
    "}\n"
    "/* acc[KT / 8][4] = a b^T over dh: a the warp's A fragments, b a shared tile's KT rows (B\n"
    " * fragments by ldmatrix: lane i of 8 names row n * 8 + i, at column s * 16, and 8 more for\n"
    " * lanes 8 to 15) */\n"
    "PTC_DEVICE void @_abt(float (*acc)[4], unsigned (*fa)[4], const unsigned short *sh)\n"
    "{\n"
    "    const int lane = (int)(threadIdx.x & 31u), i = lane & 7, h8 = (lane >> 3 & 1) * 8;\n"
    "    PTC_UNROLL\n"
    "    for (int n = 0; n < @_KT / 8; n++) {\n"
    "        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;\n"
    "        PTC_UNROLL\n"
    "        for (int s = 0; s < @_DH / 16; s++) {\n"
    "            unsigned fb[2];\n"
    "            ptc_ldsm2(fb, sh + (n * 8 + i) * @_LDS + s * 16 + h8);\n"
    "            @_MMA(acc[n], fa[s], fb);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "/* acc[dh / 8][4] += p b: p 16 x KT as A fragments, b a shared tile's KT rows (B fragments of\n"
    " * two column blocks n, n + 1 by one transposing ldmatrix: lanes 8m + i name row s * 16 + i,\n"
    " * 8 more for odd m, at column (n + m / 2) * 8) */\n"
    "PTC_DEVICE void @_pb(float (*acc)[4], unsigned (*pa)[4], const unsigned short *sh)\n"
    "{\n"
    "    const int lane = (int)(threadIdx.x & 31u), i = lane & 7, m = lane >> 3;\n"
    "    PTC_UNROLL\n"
    "    for (int s = 0; s < @_KT / 16; s++) {\n"
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n += 2) {\n"
    "            unsigned fb[4];\n"
    "            ptc_ldsm4t(fb, sh + (s * 16 + (m & 1) * 8 + i) * @_LDS + (n + (m >> 1)) * 8);\n"
    "            @_MMA(acc[n], pa[s], fb);\n"
    "            @_MMA(acc[n + 1], pa[s], fb + 2);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "/* a 16 x KT tile of f32 fragments as A fragments of 16 bits */\n"
    "PTC_DEVICE void @_pack(unsigned (*pa)[4], float (*x)[4])\n"
    "{\n"
    "    PTC_UNROLL\n"
    "    for (int n = 0; n < @_KT / 8; n++) {\n"
    "        pa[n / 2][(n & 1) * 2] = @_PK(x[n][0], x[n][1]);\n"
    "        pa[n / 2][(n & 1) * 2 + 1] = @_PK(x[n][2], x[n][3]);\n"
    "    }\n"
    "}\n"
    "PTC_DEVICE float @_qsum(float x)\n"
    "{\n"
    "    x += __shfl_xor_sync(0xffffffffu, x, 1);\n"
    "    return x + __shfl_xor_sync(0xffffffffu, x, 2);\n"
    "}\n"
    "PTC_DEVICE float @_qmax(float x)\n"
    "{\n"
    "    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));\n"
    "    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));\n"
    "}\n";

/* fwd, stats and bwd_q: a block takes tiles of blockDim.x / 2 query rows of one (batch, head),
 * its warp rows r0 and r1 of them, at offsets a0 and a1 of q (-1 past the end); key and value
 * tiles go through ks and vs */
static const char query_tiles[] =
    "{\n"
    "    __shared__ __align__(16) unsigned short ks[(1 + @_DBQ) * @_KT * @_LDS],\n"
    "        vs[(1 + @_DBQ) * @_KT * @_LDS];\n"
    "    const int lane = (int)(threadIdx.x & 31u), w = (int)(threadIdx.x >> 5);\n"
    "    const int g = lane >> 2, c = lane & 3;\n"
    "    const long long rows = blockDim.x / 2, nqb = (@_S + rows - 1) / rows;\n"
    "    for (long long t = blockIdx.x; t < @_B * @_H * nqb; t += gridDim.x) {\n"
    "        const long long bh = t % (@_B * @_H), b = bh / @_H, h = bh % @_H;\n"
    "        const long long i0 = (@_CAUSAL ? nqb - 1 - t / (@_B * @_H) : t / (@_B * @_H)) * rows;\n"
    "        const long long kh = (h + @_H0) / @_R, r0 = i0 + w * 16 + g, r1 = r0 + 8;\n"
    "        const long long a0 = r0 < @_S ? (b * @_S + r0) * (@_H * @_DH) + h * @_DH : -1;\n"
    "        const long long a1 = r1 < @_S ? (b * @_S + r1) * (@_H * @_DH) + h * @_DH : -1;\n";

/* fwd and stats: the text before the key tiles */
static const char fwd_body[] =
    "        unsigned qa[@_DH / 16][4];\n"
    "        @_rows(qa, q, a0, a1, c);\n"
    "        float acc[@_DH / 8][4], m0 = -PTC_INF, m1 = -PTC_INF, l0 = 0.0f, l1 = 0.0f;\n"
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n++)\n"
    "            acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;\n";

/* fwd, stats and bwd_q: the key tiles a query tile sees (causal: up to its last query) and the
 * loop over them, each tile in ks and vs (over 16-bit storage: kt and vt, one of two buffers,
 * the next tile issued while this one is computed); their texts around it */
static const char key_tiles[] =
    "        long long kend = @_S2;\n"
    "        if (@_CAUSAL && i0 + rows < kend)\n"
    "            kend = i0 + rows;\n"
    "#if @_DBQ\n"
    "        __syncthreads(); /* the last tiles' readers are done */\n"
    "        if (kend > 0)\n"
    "            @_kv_issue(ks, vs, k, v, b, kh, 0);\n"
    "#endif\n"
    "        for (long long j0 = 0, kb = 0; j0 < kend; j0 += @_KT, kb ^= @_DBQ) {\n"
    "            __syncthreads(); /* the last tile's readers are done */\n"
    "#if @_DBQ\n"
    "            /* the next tile goes into the other buffers while this one is computed */\n"
    "            if (j0 + @_KT < kend) {\n"
    "                @_kv_issue(ks + (kb ^ 1) * (@_KT * @_LDS), vs + (kb ^ 1) * (@_KT * @_LDS), k, v, b, kh,\n"
    "                           j0 + @_KT);\n"
    "                PTC_CP_WAIT(1);\n"
    "            } else {\n"
    "                PTC_CP_WAIT(0);\n"
    "            }\n"
    "#else\n"
    "            @_tile(ks, k, b * @_S2 * (@_G * @_DH) + kh * @_DH, @_G * @_DH, j0, @_S2);\n"
    "            @_tile(vs, v, b * @_S2 * (@_G * @_DH) + kh * @_DH, @_G * @_DH, j0, @_S2);\n"
    "#endif\n"
    "            __syncthreads();\n"
    "            const unsigned short *kt = ks + kb * (@_KT * @_LDS), *vt = vs + kb * (@_KT * @_LDS);\n";

/* fwd and stats, continued: a key tile's products and the online softmax */
static const char fwd_loop[] =
    "            float s[@_KT / 8][4];\n"
    "            @_abt(s, qa, kt);\n"
    "            /* scaled (by log2(e) too: exp2 below), masked (keys past the end; causal: keys\n"
    "             * after the row: only tiles that cross the end or the warp's diagonal), the maxima */\n"
    "            const int edge = j0 + @_KT > @_S2 || (@_CAUSAL && j0 + @_KT - 1 > i0 + w * 16);\n"
    "            float x0 = m0, x1 = m1;\n"
    "            PTC_UNROLL\n"
    "            for (int n = 0; n < @_KT / 8; n++)\n"
    "                PTC_UNROLL\n"
    "                for (int e = 0; e < 4; e++) {\n"
    "                    const long long j = j0 + n * 8 + 2 * c + (e & 1), i = e < 2 ? r0 : r1;\n"
    "                    const float y = edge && (j >= @_S2 || (@_CAUSAL && j > i)) ? -PTC_INF\n"
    "                                                                               : s[n][e] * @_SL2;\n"
    "                    s[n][e] = y;\n"
    "                    if (e < 2)\n"
    "                        x0 = fmaxf(x0, y);\n"
    "                    else\n"
    "                        x1 = fmaxf(x1, y);\n"
    "                }\n"
    "            x0 = @_qmax(x0);\n"
    "            x1 = @_qmax(x1);\n"
    "            /* a row that has seen no key yet keeps m = -inf: its p are 0, not NaN */\n"
    "            const float u0 = x0 == -PTC_INF ? 0.0f : x0, u1 = x1 == -PTC_INF ? 0.0f : x1;\n"
    "            const float f0 = exp2f(m0 - u0), f1 = exp2f(m1 - u1);\n"
    "            m0 = x0;\n"
    "            m1 = x1;\n"
    "            l0 *= f0;\n"
    "            l1 *= f1;\n"
    "            PTC_UNROLL\n"
    "            for (int n = 0; n < @_DH / 8; n++) {\n"
    "                acc[n][0] *= f0;\n"
    "                acc[n][1] *= f0;\n"
    "                acc[n][2] *= f1;\n"
    "                acc[n][3] *= f1;\n"
    "            }\n"
    "            PTC_UNROLL\n"
    "            for (int n = 0; n < @_KT / 8; n++) {\n"
    "                s[n][0] = exp2f(s[n][0] - u0);\n"
    "                s[n][1] = exp2f(s[n][1] - u0);\n"
    "                s[n][2] = exp2f(s[n][2] - u1);\n"
    "                s[n][3] = exp2f(s[n][3] - u1);\n"
    "                l0 += s[n][0] + s[n][1]; /* this lane's columns; the quad's at the end */\n"
    "                l1 += s[n][2] + s[n][3];\n"
    "            }\n"
    "            unsigned pa[@_KT / 16][4];\n"
    "            @_pack(pa, s);\n"
    "            @_pb(acc, pa, vt);\n"
    "        }\n"
    "        l0 = @_qsum(l0);\n"
    "        l1 = @_qsum(l1);\n"
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n++) {\n"
    "            acc[n][0] /= l0;\n"
    "            acc[n][1] /= l0;\n"
    "            acc[n][2] /= l1;\n"
    "            acc[n][3] /= l1;\n"
    "        }\n";

static const char fwd_tail[] =
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n++) {\n"
    "            const int d = n * 8 + 2 * c;\n"
    "            if (a0 >= 0) {\n"
    "                @_STX(o, a0 + d, acc[n][0]);\n"
    "                @_STX(o, a0 + d + 1, acc[n][1]);\n"
    "            }\n"
    "            if (a1 >= 0) {\n"
    "                @_STX(o, a1 + d, acc[n][2]);\n"
    "                @_STX(o, a1 + d + 1, acc[n][3]);\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "}\n";

/* lse = m + log(l) and D = dy . o per row, written by the quad's first lane */
static const char stats_tail[] =
    "        float d0 = 0.0f, d1 = 0.0f;\n"
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n++) {\n"
    "            const int d = n * 8 + 2 * c;\n"
    "            if (a0 >= 0)\n"
    "                d0 += @_LDX(dy, a0 + d) * acc[n][0] + @_LDX(dy, a0 + d + 1) * acc[n][1];\n"
    "            if (a1 >= 0)\n"
    "                d1 += @_LDX(dy, a1 + d) * acc[n][2] + @_LDX(dy, a1 + d + 1) * acc[n][3];\n"
    "        }\n"
    "        d0 = @_qsum(d0);\n"
    "        d1 = @_qsum(d1);\n"
    "        if (c == 0 && a0 >= 0) {\n"
    "            PTC_ST(lse, (b * @_H + h) * @_S + r0, m0 * 0.693147181f + logf(l0));\n"
    "            PTC_ST(dsum, (b * @_H + h) * @_S + r0, d0);\n"
    "        }\n"
    "        if (c == 0 && a1 >= 0) {\n"
    "            PTC_ST(lse, (b * @_H + h) * @_S + r1, m1 * 0.693147181f + logf(l1));\n"
    "            PTC_ST(dsum, (b * @_H + h) * @_S + r1, d1);\n"
    "        }\n"
    "    }\n"
    "}\n";

/* dk, dv: a warp's 16 key rows over the query tiles of the query heads of its kv head */
static const char bwd_kv[] =
    "{\n"
    "    __shared__ __align__(16) unsigned short qs[(1 + @_DBK) * @_KT * @_LDS],\n"
    "        ds[(1 + @_DBK) * @_KT * @_LDS];\n"
    "    __shared__ float ls[(1 + @_DBK) * @_KT], dd[(1 + @_DBK) * @_KT];\n"
    "#if @_KVS\n"
    "    __shared__ __align__(16) unsigned short kvs[2 * @_KR * @_LDS]; /* the block's k, then v rows */\n"
    "#endif\n"
    "    const int lane = (int)(threadIdx.x & 31u), w = (int)(threadIdx.x >> 5);\n"
    "    const int g = lane >> 2, c = lane & 3;\n"
    "    const long long keys = blockDim.x / 2, nkb = (@_S2 + keys - 1) / keys;\n"
    "    for (long long t = blockIdx.x; t < @_B * @_G * nkb; t += gridDim.x) {\n"
    "        const long long bg = t % (@_B * @_G), b = bg / @_G, kh = bg % @_G;\n"
    "        const long long j0 = t / (@_B * @_G) * keys, r0 = j0 + w * 16 + g, r1 = r0 + 8;\n"
    "        const long long a0 = r0 < @_S2 ? (b * @_S2 + r0) * (@_G * @_DH) + kh * @_DH : -1;\n"
    "        const long long a1 = r1 < @_S2 ? (b * @_S2 + r1) * (@_G * @_DH) + kh * @_DH : -1;\n"
    "#if @_KVS\n"
    "        __syncthreads(); /* the last tile's readers are done */\n"
    "        @_rows_to(kvs, (int)keys, k, b * @_S2 * (@_G * @_DH) + kh * @_DH, @_G * @_DH, j0, @_S2);\n"
    "        @_rows_to(kvs + @_KR * @_LDS, (int)keys, v, b * @_S2 * (@_G * @_DH) + kh * @_DH,\n"
    "                  @_G * @_DH, j0, @_S2);\n"
    "#else\n"
    "        unsigned ka[@_DH / 16][4], va[@_DH / 16][4];\n"
    "        @_rows(ka, k, a0, a1, c);\n"
    "        @_rows(va, v, a0, a1, c);\n"
    "#endif\n"
    "        float gk[@_DH / 8][4], gv[@_DH / 8][4];\n"
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n++)\n"
    "            gk[n][0] = gk[n][1] = gk[n][2] = gk[n][3] = gv[n][0] = gv[n][1] = gv[n][2] = gv[n][3] = 0.0f;\n";

/* bwd_kv, continued: the query tiles of every query head of the kv head, then dk and dv */
static const char bwd_kv_loop[] =
    "        /* the query tiles of every query head of the kv head, one sequence of (h, i0); causal:\n"
    "         * queries before the tile's first key see none of its keys */\n"
    "        const long long h_lo = PTC_IMAX(kh * @_R - @_H0, 0), h_hi = PTC_IMIN((kh + 1) * @_R - @_H0, @_H);\n"
    "        const long long i_lo = @_CAUSAL ? j0 : 0, nit = i_lo < @_S ? (@_S - i_lo + @_KT - 1) / @_KT : 0;\n"
    "        const long long ntl = h_hi > h_lo ? (h_hi - h_lo) * nit : 0;\n"
    "#if @_DBK\n"
    "        __syncthreads(); /* the last tiles' readers are done */\n"
    "        if (ntl > 0)\n"
    "            @_q_issue(qs, ds, ls, dd, q, dy, lse, dsum, b, h_lo, i_lo);\n"
    "#endif\n"
    "        for (long long tl = 0, qb = 0; tl < ntl; tl++, qb ^= @_DBK) {\n"
    "            {\n"
    "                const long long h = h_lo + tl / nit, i0 = i_lo + tl % nit * @_KT;\n"
    "                __syncthreads(); /* the last tile's readers are done */\n"
    "#if @_DBK\n"
    "                /* the next tile goes into the other buffers while this one is computed */\n"
    "                if (tl + 1 < ntl) {\n"
    "                    const long long o = (qb ^ 1) * (@_KT * @_LDS);\n"
    "                    @_q_issue(qs + o, ds + o, ls + (qb ^ 1) * @_KT, dd + (qb ^ 1) * @_KT, q, dy, lse, dsum, b,\n"
    "                              h_lo + (tl + 1) / nit, i_lo + (tl + 1) % nit * @_KT);\n"
    "                    PTC_CP_WAIT(1);\n"
    "                } else {\n"
    "                    PTC_CP_WAIT(0);\n"
    "                }\n"
    "#else\n"
    "                @_tile(qs, q, b * @_S * (@_H * @_DH) + h * @_DH, @_H * @_DH, i0, @_S);\n"
    "                @_tile(ds, dy, b * @_S * (@_H * @_DH) + h * @_DH, @_H * @_DH, i0, @_S);\n"
    "                for (int x = (int)threadIdx.x; x < @_KT; x += (int)blockDim.x) {\n"
    "                    const long long i = i0 + x;\n"
    "                    PTC_ST(ls, x, i < @_S ? PTC_LD(lse, (b * @_H + h) * @_S + i) * 1.442695041f : 0.0f);\n"
    "                    PTC_ST(dd, x, i < @_S ? PTC_LD(dsum, (b * @_H + h) * @_S + i) : 0.0f);\n"
    "                }\n"
    "#endif\n"
    "                __syncthreads();\n"
    "                const unsigned short *qt = qs + qb * (@_KT * @_LDS), *dt = ds + qb * (@_KT * @_LDS);\n"
    "                const float *lt = ls + qb * @_KT, *dt2 = dd + qb * @_KT;\n";

/* bwd_kv, continued: one query tile's products, then dk and dv */
static const char bwd_kv_tile[] =
    "                /* masks only where the tile crosses an end or the warp's keys' diagonal */\n"
    "                const int edge = i0 + @_KT > @_S || j0 + w * 16 + 16 > @_S2 ||\n"
    "                                 (@_CAUSAL && j0 + w * 16 + 15 > i0);\n"
    "                float st[@_KT / 8][4], dp[@_KT / 8][4];\n"
    "#if @_KVS\n"
    "                { /* k's and v's fragments live only through their product */\n"
    "                    unsigned fa[@_DH / 16][4];\n"
    "                    @_afrags(fa, kvs, w * 16, g, c);\n"
    "                    @_abt(st, fa, qt);\n"
    "                    @_afrags(fa, kvs + @_KR * @_LDS, w * 16, g, c);\n"
    "                    @_abt(dp, fa, dt);\n"
    "                }\n"
    "#else\n"
    "                @_abt(st, ka, qt);\n"
    "                @_abt(dp, va, dt);\n"
    "#endif\n"
    "                PTC_UNROLL\n"
    "                for (int n = 0; n < @_KT / 8; n++)\n"
    "                    PTC_UNROLL\n"
    "                    for (int e = 0; e < 4; e++) {\n"
    "                        const int x = n * 8 + 2 * c + (e & 1);\n"
    "                        const long long i = i0 + x, j = e < 2 ? r0 : r1;\n"
    "                        const float p = edge && (i >= @_S || j >= @_S2 || (@_CAUSAL && j > i))\n"
    "                                            ? 0.0f\n"
    "                                            : exp2f(st[n][e] * @_SL2 - PTC_LD(lt, x));\n"
    "                        st[n][e] = p;\n"
    "                        dp[n][e] = p * (dp[n][e] - PTC_LD(dt2, x));\n"
    "                    }\n"
    "                unsigned pa[@_KT / 16][4], sa[@_KT / 16][4];\n"
    "                @_pack(pa, st);\n"
    "                @_pack(sa, dp);\n"
    "                @_pb(gv, pa, dt);\n"
    "                @_pb(gk, sa, qt);\n"
    "            }\n"
    "        }\n"
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n++) {\n"
    "            const int d = n * 8 + 2 * c;\n"
    "            if (a0 >= 0) {\n"
    "                @_STX(dk, a0 + d, gk[n][0] * @_SCALE);\n"
    "                @_STX(dk, a0 + d + 1, gk[n][1] * @_SCALE);\n"
    "                @_STX(dv, a0 + d, gv[n][0]);\n"
    "                @_STX(dv, a0 + d + 1, gv[n][1]);\n"
    "            }\n"
    "            if (a1 >= 0) {\n"
    "                @_STX(dk, a1 + d, gk[n][2] * @_SCALE);\n"
    "                @_STX(dk, a1 + d + 1, gk[n][3] * @_SCALE);\n"
    "                @_STX(dv, a1 + d, gv[n][2]);\n"
    "                @_STX(dv, a1 + d + 1, gv[n][3]);\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "}\n";

/* dq: a warp's 16 query rows over the key tiles */
static const char bwd_q[] =
    "        unsigned qa[@_DH / 16][4], da[@_DH / 16][4];\n"
    "        @_rows(qa, q, a0, a1, c);\n"
    "        @_rows(da, dy, a0, a1, c);\n"
    "        /* lse in base 2 (exp2 below) */\n"
    "        const float l0 = a0 >= 0 ? PTC_LD(lse, (b * @_H + h) * @_S + r0) * 1.442695041f : 0.0f;\n"
    "        const float l1 = a1 >= 0 ? PTC_LD(lse, (b * @_H + h) * @_S + r1) * 1.442695041f : 0.0f;\n"
    "        const float D0 = a0 >= 0 ? PTC_LD(dsum, (b * @_H + h) * @_S + r0) : 0.0f;\n"
    "        const float D1 = a1 >= 0 ? PTC_LD(dsum, (b * @_H + h) * @_S + r1) : 0.0f;\n"
    "        float gq[@_DH / 8][4];\n"
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n++)\n"
    "            gq[n][0] = gq[n][1] = gq[n][2] = gq[n][3] = 0.0f;\n";

/* bwd_q, continued: a key tile's products */
static const char bwd_q_loop[] =
    "            const int edge = i0 + w * 16 + 16 > @_S || j0 + @_KT > @_S2 ||\n"
    "                             (@_CAUSAL && j0 + @_KT - 1 > i0 + w * 16);\n"
    "            float s[@_KT / 8][4], dp[@_KT / 8][4];\n"
    "            @_abt(s, qa, kt);\n"
    "            @_abt(dp, da, vt);\n"
    "            PTC_UNROLL\n"
    "            for (int n = 0; n < @_KT / 8; n++)\n"
    "                PTC_UNROLL\n"
    "                for (int e = 0; e < 4; e++) {\n"
    "                    const long long j = j0 + n * 8 + 2 * c + (e & 1), i = e < 2 ? r0 : r1;\n"
    "                    const float p = edge && (i >= @_S || j >= @_S2 || (@_CAUSAL && j > i))\n"
    "                                        ? 0.0f\n"
    "                                        : exp2f(s[n][e] * @_SL2 - (e < 2 ? l0 : l1));\n"
    "                    s[n][e] = p * (dp[n][e] - (e < 2 ? D0 : D1));\n"
    "                }\n"
    "            unsigned sa[@_KT / 16][4];\n"
    "            @_pack(sa, s);\n"
    "            @_pb(gq, sa, kt);\n"
    "        }\n"
    "        PTC_UNROLL\n"
    "        for (int n = 0; n < @_DH / 8; n++) {\n"
    "            const int d = n * 8 + 2 * c;\n"
    "            if (a0 >= 0) {\n"
    "                @_STX(dq, a0 + d, gq[n][0] * @_SCALE);\n"
    "                @_STX(dq, a0 + d + 1, gq[n][1] * @_SCALE);\n"
    "            }\n"
    "            if (a1 >= 0) {\n"
    "                @_STX(dq, a1 + d, gq[n][2] * @_SCALE);\n"
    "                @_STX(dq, a1 + d + 1, gq[n][3] * @_SCALE);\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "}\n";

void ptc_cuda_emit_attn_mma_defs(const ptc_cuda_attn *a, const char *name, FILE *f)
{
    fputs(helpers, f);
    fputs(helpers_emu, f);
    bool f16 = a->mma == PTC_F16;
    fprintf(f, "#define %s_MMA ptc_mma_%s\n#define %s_PK ptc_pk_%s\n", name, f16 ? "f16" : "bf16",
            name, f16 ? "f16" : "bf16");
    /* tiles of 64 rows (32 above head size 64, for the registers); above 64, bwd_kv keeps its
     * k and v rows in shared memory (KR of them: its blocks have 64 threads) */
    bool wide = a->head_dim > 64;
    fprintf(f, "#define %s_KT %d\n#define %s_KVS %d\n#define %s_KR %d\n", name, wide ? 32 : 64,
            name, wide ? 1 : 0, name, wide ? 32 : 64);
    /* over 16-bit storage the tiles are straight copies: issued asynchronously (cp.async), the
     * next one while this one is computed, in a second buffer (what fits 48 KB of shared memory:
     * bwd_kv's with its k and v rows in shared memory does not) */
    fprintf(f, "#define %s_DBQ %d\n#define %s_DBK %d\n", name, a->io ? 1 : 0, name,
            a->io && !wide ? 1 : 0);
    /* the scale times log2(e): the softmax in powers of 2 (exp2f, one instruction on the GPU) */
    fprintf(f, "#define %s_SL2 %.9ef\n", name,
            (double)(float)((double)(float)(1.0 / sqrt((double)a->head_dim)) * 1.4426950408889634));
    ptc_cuda_put_named(f, shape_helpers, name);
    ptc_cuda_put_named(f, async_helpers, name);
    ptc_cuda_put_named(f, shape_helpers2, name);
}

void ptc_cuda_emit_attn_mma_body(ptc_cuda_attn_kernel w, const char *name, FILE *f)
{
    if (w == PTC_CUDA_ATTN_BWD_KV) {
        ptc_cuda_put_named(f, bwd_kv, name);
        ptc_cuda_put_named(f, bwd_kv_loop, name);
        ptc_cuda_put_named(f, bwd_kv_tile, name);
        return;
    }
    ptc_cuda_put_named(f, query_tiles, name);
    if (w == PTC_CUDA_ATTN_BWD_Q) {
        ptc_cuda_put_named(f, bwd_q, name);
        ptc_cuda_put_named(f, key_tiles, name);
        ptc_cuda_put_named(f, bwd_q_loop, name);
        return;
    }
    ptc_cuda_put_named(f, fwd_body, name);
    ptc_cuda_put_named(f, key_tiles, name);
    ptc_cuda_put_named(f, fwd_loop, name);
    ptc_cuda_put_named(f, w == PTC_CUDA_ATTN_FWD ? fwd_tail : stats_tail, name);
}
