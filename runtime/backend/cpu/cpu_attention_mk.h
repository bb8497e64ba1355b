/* cpu_attention_mk.h - the attention's block-product micro-kernel, one copy per vector width.
 *
 * Included by cpu_attention.c once per instruction set with MK_NAME (the driver's name), MK_VL
 * (floats per vector), MK_NV (vectors per tile row at most) and MK_TARGET (a function attribute,
 * or nothing) defined; it undefines them at its end. Each copy uses vectors of its instruction set's native width: GCC lowers a generic
 * vector wider than the hardware's through memory inside loops (a 16-float vector compiled for
 * AVX2 ran the kernel 14 times slower), so the width is chosen here rather than left to
 * target_clones. Registers: MR x MK_NV accumulators, MK_NV rows of B and a broadcast, within 16
 * (SSE2, AVX2) or 32 (AVX-512) vector registers.
 */
#define MK_CAT2(a, b) a##b
#define MK_CAT(a, b) MK_CAT2(a, b)
#define MK_VT MK_CAT(MK_NAME, _v)
#define MK_TILE MK_CAT(MK_NAME, _tile)

typedef float MK_VT __attribute__((vector_size(MK_VL * sizeof(float)), aligned(sizeof(float))));

/* rows x (nv vectors) of C = alpha sum_p A(r, p) B[p, :] (+ C when acc), A(r, p) = a[r lda + p],
 * or a[p lda + r] when ta; the sum over p in [p0, p1) */
MK_TARGET static inline __attribute__((always_inline)) void
MK_TILE(const int rows, const int nv, int64_t p0, int64_t p1, const bool ta, const float *a,
        int64_t lda, const float *b, int64_t ldb, float alpha, bool acc, float *c, int64_t ldc)
{
    MK_VT s[MR][MK_NV];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++)
            s[r][v] = (MK_VT){0};
    for (int64_t p = p0; p < p1; p++) {
        const MK_VT *bp = (const MK_VT *)(b + p * ldb);
        MK_VT bv[MK_NV];
        for (int v = 0; v < nv; v++)
            bv[v] = bp[v];
        for (int r = 0; r < rows; r++) {
            float x = ta ? a[p * lda + r] : a[r * lda + p];
            for (int v = 0; v < nv; v++)
                s[r][v] += x * bv[v];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++) {
            MK_VT *cp = (MK_VT *)(c + r * ldc + v * MK_VL);
            *cp = acc ? *cp + alpha * s[r][v] : alpha * s[r][v];
        }
}

/* C (m x n) = alpha op(A) B (+ C when acc), op(A) m x k (A^T when ta), B k x n row-major, within
 * the row ranges of l (columns past a row's range are left as they are). */
MK_TARGET static void MK_NAME(int64_t m, int64_t n, int64_t k, bool ta, const float *a, int64_t lda,
                              const float *b, int64_t ldb, float alpha, bool acc, float *c,
                              int64_t ldc, lim l)
{
    for (int64_t i = 0; i < m; i += MR) {
        int rows = m - i < MR ? (int)(m - i) : MR;
        int64_t last = i + rows - 1;
        int64_t nhi = last + l.nd < n ? (last + l.nd + VL - 1) / VL * VL : n;
        nhi = nhi < n ? nhi : n;
        int64_t p0 = i + l.ks > 0 ? i + l.ks : 0, p1 = last + l.kd < k ? last + l.kd : k;
        int64_t nvec = nhi / MK_VL * MK_VL;
        for (int64_t j = 0; j < nvec; j += MK_NV * MK_VL) {
            int nv = nvec - j >= MK_NV * MK_VL ? MK_NV : (int)((nvec - j) / MK_VL);
            const float *ai = a + (ta ? i : i * lda);
            float *ci = c + i * ldc + j;
            /* (rows, vectors and A's layout constant in each copy of the tile, so that the
             * accumulators stay in registers; a block's last rows, fewer than MR, in one tile of
             * their own: a tile of one row a time ran them at a quarter of the rate) */
#define TILE(R, NV, TA) MK_TILE(R, NV, p0, p1, TA, ai, lda, b + j, ldb, alpha, acc, ci, ldc)
#define TILES(R, TA)                                                                              \
    switch (nv) {                                                                                 \
    case 4: TILE(R, MK_NV < 4 ? MK_NV : 4, TA); break;                                            \
    case 3: TILE(R, MK_NV < 3 ? MK_NV : 3, TA); break;                                            \
    case 2: TILE(R, MK_NV < 2 ? MK_NV : 2, TA); break;                                            \
    default: TILE(R, 1, TA); break;                                                               \
    }
    _Static_assert(MR == 6, "ROWS below has a case for each row count up to MR");
#define ROWS(TA)                                                                                  \
    switch (rows) {                                                                               \
    case 6: TILES(6, TA) break;                                                                   \
    case 5: TILES(5, TA) break;                                                                   \
    case 4: TILES(4, TA) break;                                                                   \
    case 3: TILES(3, TA) break;                                                                   \
    case 2: TILES(2, TA) break;                                                                   \
    default: TILES(1, TA) break;                                                                  \
    }
            if (ta)
                ROWS(true)
            else
                ROWS(false)
#undef ROWS
#undef TILES
#undef TILE
        }
        for (int r = 0; r < rows; r++) /* the columns past the last whole vector */
            for (int64_t jj = nvec; jj < nhi; jj++) {
                float sum = 0;
                for (int64_t p = p0; p < p1; p++)
                    sum += (ta ? a[p * lda + i + r] : a[(i + r) * lda + p]) * b[p * ldb + jj];
                float *cp = c + (i + r) * ldc + jj;
                *cp = acc ? *cp + alpha * sum : alpha * sum;
            }
    }
}

#undef MK_TILE
#undef MK_VT
#undef MK_CAT
#undef MK_CAT2
#undef MK_NAME
#undef MK_VL
#undef MK_NV
#undef MK_TARGET
