/*
 * kernels_f32_x86.c — F32 tiles for the "avx2" and "avx2+vnni" variants.
 *
 * The F32 per-pair recipe, shared by every tile shape: one 8-lane accumulator; step i adds w·x
 * of floats [8i, 8i + 8) by FMA; then hsum8 in a fixed lane order; then the last n % 8
 * products, in index order, in scalar arithmetic. A tile of R rows × T tokens runs R × T such
 * recipes side by side; nothing is shared between pairs, so every tile shape gives each pair
 * the value the 1 × 1 tile gives, bit for bit.
 */
#include "kernels_x86.h"

#ifdef KVF_HAVE_X86_KERNELS

/* R rows × T tokens of the F32 recipe. R and T are constants at every call site, so the
 * accumulator array lives in registers. */
AVX2 INLINE void f32_tile(const float *w, size_t ws, const float *x, size_t ldx, uint32_t n,
                          float *y, size_t ldy, const int R, const int T)
{
    __m256 acc[8][3];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv[3];
        for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + i);
        for (int r = 0; r < R; r++) {
            if ((i & 8) == 0)
                _mm_prefetch((const char *)(w + (r + PF_TILES * R) * ws + i), _MM_HINT_T1);
            __m256 wv = _mm256_loadu_ps(w + r * ws + i);
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = hsum8(acc[r][t]);
            const float *wr = w + r * ws, *xt = x + t * ldx;
            for (uint32_t k = i; k < n; k++) s += wr[k] * xt[k];
            y[t * ldy + r] = s;
        }
}

AVX2 static void f32_1x1(const float *w, const float *x, uint32_t n, float *y)
{
    f32_tile(w, 0, x, 0, n, y, 0, 1, 1);
}
AVX2 static void f32_1x3(const float *w, const float *x, size_t ldx, uint32_t n, float *y,
                         size_t ldy)
{
    f32_tile(w, 0, x, ldx, n, y, ldy, 1, 3);
}
AVX2 static void f32_4x1(const float *w, size_t ws, const float *x, uint32_t n, float *y)
{
    f32_tile(w, ws, x, 0, n, y, 0, 4, 1);
}
AVX2 static void f32_4x3(const float *w, size_t ws, const float *x, size_t ldx, uint32_t n,
                         float *y, size_t ldy)
{
    f32_tile(w, ws, x, ldx, n, y, ldy, 4, 3);
}
AVX2 static void f32_8x1(const float *w, size_t ws, const float *x, uint32_t n, float *y)
{
    f32_tile(w, ws, x, 0, n, y, 0, 8, 1);
}

AVX2 void kvf__f32_rows_avx2(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                          uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    if (nt == 1) {
        for (; r + 8 <= r1; r += 8) f32_8x1(w + r * ws, ws, x, n, y + r);
        for (; r < r1; r++) f32_1x1(w + r * ws, x, n, y + r);
        return;
    }
    for (; r + 4 <= r1; r += 4) {
        uint32_t t = 0;
        for (; t + 3 <= nt; t += 3) f32_4x3(w + r * ws, ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy);
        for (; t < nt; t++) f32_4x1(w + r * ws, ws, x + t * ldx, n, y + t * ldy + r);
    }
    for (; r < r1; r++) {
        uint32_t t = 0;
        for (; t + 3 <= nt; t += 3) f32_1x3(w + r * ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy);
        for (; t < nt; t++) f32_1x1(w + r * ws, x + t * ldx, n, y + t * ldy + r);
    }
}

/* The F32 recipe of f32_tile, pair for pair, in tiles up to 8 rows × 5 tokens, with each weight
 * row prefetched PF_TILES tiles ahead (every other step: once per 64-byte line). */
VNNI INLINE void f32v_tile(const float *w, size_t ws, const float *x, size_t ldx, uint32_t n,
                           float *y, size_t ldy, const int R, const int T, size_t pf)
{
    __m256 acc[8][5];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv[5];
        for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + i);
        for (int r = 0; r < R; r++) {
            if ((i & 8) == 0)
                _mm_prefetch((const char *)(w + r * ws + pf + i), _MM_HINT_T1);
            __m256 wv = _mm256_loadu_ps(w + r * ws + i);
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = hsum8(acc[r][t]);
            const float *wr = w + r * ws, *xt = x + t * ldx;
            for (uint32_t k = i; k < n; k++) s += wr[k] * xt[k];
            y[t * ldy + r] = s;
        }
}

#define F32V_TOKENS(R)                                                                           \
    do {                                                                                         \
        uint32_t t = 0;                                                                          \
        size_t pf = (size_t)PF_TILES * (R) * ws;                                                 \
        for (; t + 5 <= nt; t += 5)                                                              \
            f32v_tile(w + r * ws, ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy, R, 5, pf);        \
        switch (nt - t) {                                                                        \
        case 4: f32v_tile(w + r * ws, ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy, R, 4, pf); break; \
        case 3: f32v_tile(w + r * ws, ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy, R, 3, pf); break; \
        case 2: f32v_tile(w + r * ws, ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy, R, 2, pf); break; \
        case 1: f32v_tile(w + r * ws, ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy, R, 1, pf); break; \
        default: break;                                                                          \
        }                                                                                        \
    } while (0)

#define F32V_TOKEN_BLOCK 10

VNNI static void f32v_rows_block(const float *w, size_t ws, const float *x, size_t ldx,
                                 uint32_t nt, uint32_t n, float *y, size_t ldy, uint32_t r0,
                                 uint32_t r1)
{
    uint32_t r = r0;
    for (; r + 4 <= r1; r += 4) F32V_TOKENS(4);
    for (; r < r1; r++) F32V_TOKENS(1);
}

VNNI void kvf__f32_rows_vnni(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                           uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    if (nt == 1) {
        /* Prefetch inside this call's chunk of rows, as q8v_rows does. */
        size_t pf_rows = (r1 - r0) / 3;
        if (pf_rows > (size_t)PF_TILES * 8) pf_rows = (size_t)PF_TILES * 8;
        size_t pf = (pf_rows > 8 ? pf_rows : 8) * ws;
        for (; r + 8 <= r1; r += 8) f32v_tile(w + r * ws, ws, x, 0, n, y + r, 0, 8, 1, pf);
        for (; r < r1; r++) f32v_tile(w + r * ws, ws, x, 0, n, y + r, 0, 1, 1, pf);
        return;
    }
    /* Tokens in blocks of F32V_TOKEN_BLOCK, as q8v_rows does, for the same reason. */
    for (uint32_t t0 = 0; t0 < nt; t0 += F32V_TOKEN_BLOCK) {
        uint32_t tn = nt - t0 < F32V_TOKEN_BLOCK ? nt - t0 : F32V_TOKEN_BLOCK;
        f32v_rows_block(w, ws, x + t0 * ldx, ldx, tn, n, y + t0 * ldy, ldy, r0, r1);
    }
}

#endif
