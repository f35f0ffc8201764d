/*
 * kernels_f32g_x86.c — tiles over packed F32 weights (kernels.h: 16 rows per group, stored
 * column by column) for the "avx2" and "avx2+vnni" variants.
 *
 * A column of a group is one 64-byte line, one row per lane, so a tile multiplies it by a
 * token's activation broadcast to every lane and adds it into that token's accumulator: one
 * fused multiply-add per 16 (row, token) pairs per column, with no shuffles, no horizontal sum
 * at the end, and every accumulator its own chain in column order — the recipe of kernels.h,
 * which the scalar variant runs pair by pair with fmaf. Every tile shape, and both variants,
 * therefore give each pair the same bits.
 *
 * Prefill tiles are R groups × T tokens; the first token tile over a run of groups prefetches
 * the next run's lines into L2, the later ones find the run in L2 (the lines of 3 groups × 1536
 * columns are 288 KiB). A single token streams 8 groups at a time with 8 independent chains,
 * each group's line prefetched F32G_PF_AHEAD floats (64 columns, 4 KiB) further on in its own
 * stream.
 */
#include <math.h>
#include <string.h>

#include "kernels_x86.h"

#ifdef KVF_HAVE_X86_KERNELS

/* How far ahead a single token's tiles prefetch, in floats: 64 columns of the same group. The
 * next tile's groups (295 KiB further at 576 columns) was as good as no prefetch at all, since
 * a decode step's chunk of a layer matrix is often shorter than that; 4 KiB ahead in each
 * stream was 2-7% faster per step on smol135m F32, 16 KiB no better (alternating step by step
 * in one process). */
#define F32G_PF_AHEAD ((size_t)64 * KVF_F32G_ROWS)

/* Lanes of group g (rows 16g..16g+15) that fall in [r0, r1), as a bit mask. */
static inline uint32_t f32g_mask(uint32_t g, uint32_t r0, uint32_t r1)
{
    uint32_t base = g * KVF_F32G_ROWS;
    uint32_t lo = r0 > base ? r0 - base : 0;
    uint32_t hi = r1 - base < KVF_F32G_ROWS ? r1 - base : KVF_F32G_ROWS;
    return ((1u << hi) - 1) & ~((1u << lo) - 1);
}

/* Stores 16 rows of one token, only the lanes in mask (partial groups at a range's ends). */
static inline void store_masked(float *y, const float v[KVF_F32G_ROWS], uint32_t mask)
{
    if (mask == 0xffffu) {
        memcpy(y, v, KVF_F32G_ROWS * sizeof(float));
        return;
    }
    for (int r = 0; r < KVF_F32G_ROWS; r++)
        if (mask >> r & 1) y[r] = v[r];
}

/* --- AVX2: a group is two 256-bit halves (rows 0-7, 8-15). ------------------------------ */

/* R groups × T tokens; R · T ≤ 6 (2 · R · T accumulators of the 16 registers). */
AVX2 INLINE void f32g_tile(const float *w, uint32_t n, const float *x, size_t ldx, float *y,
                           size_t ldy, const int R, const int T, size_t pf, const uint32_t *mask)
{
    __m256 acc[4][6][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    for (uint32_t c = 0; c < n; c++) {
        __m256 xv[6];
        for (int t = 0; t < T; t++)
            xv[t] = _mm256_broadcast_ss(x + t * ldx + c);
        for (int r = 0; r < R; r++) {
            const float *wc = w + ((size_t)r * n + c) * KVF_F32G_ROWS;
            if (pf) _mm_prefetch((const char *)(wc + pf), _MM_HINT_T1);
            __m256 lo = _mm256_loadu_ps(wc), hi = _mm256_loadu_ps(wc + 8);
            for (int t = 0; t < T; t++) {
                acc[r][t][0] = _mm256_fmadd_ps(lo, xv[t], acc[r][t][0]);
                acc[r][t][1] = _mm256_fmadd_ps(hi, xv[t], acc[r][t][1]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float v[KVF_F32G_ROWS];
            _mm256_storeu_ps(v, acc[r][t][0]);
            _mm256_storeu_ps(v + 8, acc[r][t][1]);
            store_masked(y + t * ldy + r * KVF_F32G_ROWS, v, mask[r]);
        }
}

AVX2 void kvf__f32g_rows_avx2(const float *w, uint32_t n, const float *x, size_t ldx, uint32_t nt,
                              float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t g = r0 / KVF_F32G_ROWS, g1 = (r1 + KVF_F32G_ROWS - 1) / KVF_F32G_ROWS;
    size_t gs = (size_t)KVF_F32G_ROWS * n; /* floats per group */
    uint32_t m[4];
    if (nt == 1) {
        for (; g + 3 <= g1; g += 3) {
            for (int r = 0; r < 3; r++)
                m[r] = f32g_mask(g + r, r0, r1);
            f32g_tile(w + g * gs, n, x, 0, y + g * KVF_F32G_ROWS, 0, 3, 1, F32G_PF_AHEAD, m);
        }
        for (; g < g1; g++) {
            m[0] = f32g_mask(g, r0, r1);
            f32g_tile(w + g * gs, n, x, 0, y + g * KVF_F32G_ROWS, 0, 1, 1, F32G_PF_AHEAD, m);
        }
        return;
    }
    for (; g < g1; g++) {
        m[0] = f32g_mask(g, r0, r1);
        const float *wg = w + g * gs;
        float *yg = y + g * KVF_F32G_ROWS;
        size_t pf = gs;
        uint32_t t = 0;
        for (; t + 6 <= nt; t += 6, pf = 0)
            f32g_tile(wg, n, x + t * ldx, ldx, yg + t * ldy, ldy, 1, 6, pf, m);
        const float *xt = x + t * ldx;
        float *yt = yg + t * ldy;
        switch (nt - t) {
        case 5:
            f32g_tile(wg, n, xt, ldx, yt, ldy, 1, 5, pf, m);
            break;
        case 4:
            f32g_tile(wg, n, xt, ldx, yt, ldy, 1, 4, pf, m);
            break;
        case 3:
            f32g_tile(wg, n, xt, ldx, yt, ldy, 1, 3, pf, m);
            break;
        case 2:
            f32g_tile(wg, n, xt, ldx, yt, ldy, 1, 2, pf, m);
            break;
        case 1:
            f32g_tile(wg, n, xt, ldx, yt, ldy, 1, 1, pf, m);
            break;
        default:
            break;
        }
    }
}

/* --- AVX-512: a group is one 512-bit register. ---------------------------------------- */

/* R groups × T tokens: up to 3 × 8 (24 accumulators and 3 weight registers of the 32), or
 * 8 × 1 for a single token. Activations are broadcast straight from memory into each FMA. */
VNNI INLINE void f32gz_tile(const float *w, uint32_t n, const float *x, size_t ldx, float *y,
                            size_t ldy, const int R, const int T, size_t pf, const uint32_t *mask)
{
    __m512 acc[8][8];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (uint32_t c = 0; c < n; c++) {
        __m512 wv[8];
        for (int r = 0; r < R; r++) {
            const float *wc = w + ((size_t)r * n + c) * KVF_F32G_ROWS;
            if (pf) _mm_prefetch((const char *)(wc + pf), _MM_HINT_T1);
            wv[r] = _mm512_loadu_ps(wc);
        }
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_set1_ps(x[t * ldx + c]);
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + t * ldy + r * KVF_F32G_ROWS, (__mmask16)mask[r], acc[r][t]);
}

/* Groups [g, g + R) against every token: 8 at a time, then the rest in one tile. */
#define F32GZ_TOKENS(R)                                                                            \
    do {                                                                                           \
        const float *wg = w + g * gs;                                                              \
        float *yg = y + g * KVF_F32G_ROWS;                                                         \
        size_t pf = (R)*gs;                                                                        \
        uint32_t t = 0;                                                                            \
        for (; t + 8 <= nt; t += 8, pf = 0)                                                        \
            f32gz_tile(wg, n, x + t * ldx, ldx, yg + t * ldy, ldy, R, 8, pf, m);                   \
        const float *xt = x + t * ldx;                                                             \
        float *yt = yg + t * ldy;                                                                  \
        switch (nt - t) {                                                                          \
        case 7:                                                                                    \
            f32gz_tile(wg, n, xt, ldx, yt, ldy, R, 7, pf, m);                                      \
            break;                                                                                 \
        case 6:                                                                                    \
            f32gz_tile(wg, n, xt, ldx, yt, ldy, R, 6, pf, m);                                      \
            break;                                                                                 \
        case 5:                                                                                    \
            f32gz_tile(wg, n, xt, ldx, yt, ldy, R, 5, pf, m);                                      \
            break;                                                                                 \
        case 4:                                                                                    \
            f32gz_tile(wg, n, xt, ldx, yt, ldy, R, 4, pf, m);                                      \
            break;                                                                                 \
        case 3:                                                                                    \
            f32gz_tile(wg, n, xt, ldx, yt, ldy, R, 3, pf, m);                                      \
            break;                                                                                 \
        case 2:                                                                                    \
            f32gz_tile(wg, n, xt, ldx, yt, ldy, R, 2, pf, m);                                      \
            break;                                                                                 \
        case 1:                                                                                    \
            f32gz_tile(wg, n, xt, ldx, yt, ldy, R, 1, pf, m);                                      \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

VNNI void kvf__f32g_rows_vnni(const float *w, uint32_t n, const float *x, size_t ldx, uint32_t nt,
                              float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t g = r0 / KVF_F32G_ROWS, g1 = (r1 + KVF_F32G_ROWS - 1) / KVF_F32G_ROWS;
    size_t gs = (size_t)KVF_F32G_ROWS * n;
    uint32_t m[8];
    if (nt == 1) {
        for (; g + 8 <= g1; g += 8) {
            for (int r = 0; r < 8; r++)
                m[r] = f32g_mask(g + r, r0, r1);
            f32gz_tile(w + g * gs, n, x, 0, y + g * KVF_F32G_ROWS, 0, 8, 1, F32G_PF_AHEAD, m);
        }
        for (; g + 2 <= g1; g += 2) {
            for (int r = 0; r < 2; r++)
                m[r] = f32g_mask(g + r, r0, r1);
            f32gz_tile(w + g * gs, n, x, 0, y + g * KVF_F32G_ROWS, 0, 2, 1, F32G_PF_AHEAD, m);
        }
        if (g < g1) {
            m[0] = f32g_mask(g, r0, r1);
            f32gz_tile(w + g * gs, n, x, 0, y + g * KVF_F32G_ROWS, 0, 1, 1, F32G_PF_AHEAD, m);
        }
        return;
    }
    for (; g + 3 <= g1; g += 3) {
        for (int r = 0; r < 3; r++)
            m[r] = f32g_mask(g + r, r0, r1);
        F32GZ_TOKENS(3);
    }
    for (; g < g1; g++) {
        m[0] = f32g_mask(g, r0, r1);
        F32GZ_TOKENS(1);
    }
}

/* kvf__rmsnorm_scalar eight elements at a time: the same 8 interleaved double accumulators
 * (lanes 0-3 and 4-7 of two registers), each product exact in double so an FMA, if the compiler
 * fuses one, rounds the same; the same tree, and the same two float roundings per output. */
AVX2 void kvf__rmsnorm_avx2(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_add_pd(s0, _mm256_mul_pd(lo, lo));
        s1 = _mm256_add_pd(s1, _mm256_mul_pd(hi, hi));
    }
    double s[8];
    _mm256_storeu_pd(s, s0);
    _mm256_storeu_pd(s + 4, s1);
    for (; i < n; i++)
        s[i % 8] += (double)x[i] * x[i];
    double ss = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    __m256 sc = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sc),
                                                _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

#endif
