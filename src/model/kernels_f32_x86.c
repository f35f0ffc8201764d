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

/* Tokens are taken in blocks whose activations (F32_X_BYTES at most) stay in L2 while every
 * strip of rows of the chunk passes over them: equal blocks, each a whole number of T-token
 * tiles where it can be, so no block is a thin tail. Returns the block's token count. */
#define F32_X_BYTES (256u << 10)

static inline uint32_t f32_token_block(uint32_t nt, uint32_t n, uint32_t T)
{
    size_t x_bytes = (size_t)nt * n * sizeof(float);
    uint32_t n_blocks = (uint32_t)((x_bytes + F32_X_BYTES - 1) / F32_X_BYTES);
    uint32_t tb = (nt + n_blocks - 1) / n_blocks;
    return (tb + T - 1) / T * T;
}

/* How many strips ahead the first tile of a strip prefetches (into L2). The later tiles of the
 * strip — a strip's whole work against a block of tokens — give the lines time to arrive; a
 * prefetch past the chunk, or past the weights, is only wasted, never a fault. */
#define F32_PF_STRIPS 2

/* R rows × T tokens of the F32 recipe. R and T are constants at every call site, so the
 * accumulator array lives in registers. When pf is set, each row r also prefetches row r + pf
 * (in floats) into L2, one prefetch per 64-byte line. */
AVX2 INLINE void f32_tile(const float *w, size_t ws, const float *x, size_t ldx, uint32_t n,
                          float *y, size_t ldy, const int R, const int T, size_t pf)
{
    __m256 acc[8][3];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv[3];
        for (int t = 0; t < T; t++)
            xv[t] = _mm256_loadu_ps(x + t * ldx + i);
        for (int r = 0; r < R; r++) {
            if (pf && (i & 8) == 0) _mm_prefetch((const char *)(w + r * ws + pf + i), _MM_HINT_T1);
            __m256 wv = _mm256_loadu_ps(w + r * ws + i);
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = hsum8(acc[r][t]);
            const float *wr = w + r * ws, *xt = x + t * ldx;
            for (uint32_t k = i; k < n; k++)
                s += wr[k] * xt[k];
            y[t * ldy + r] = s;
        }
}

AVX2 static void f32_1x1(const float *w, const float *x, uint32_t n, float *y)
{
    f32_tile(w, 0, x, 0, n, y, 0, 1, 1, 0);
}
AVX2 static void f32_1x3(const float *w, const float *x, size_t ldx, uint32_t n, float *y,
                         size_t ldy)
{
    f32_tile(w, 0, x, ldx, n, y, ldy, 1, 3, 0);
}
AVX2 static void f32_4x1(const float *w, size_t ws, const float *x, uint32_t n, float *y)
{
    f32_tile(w, ws, x, 0, n, y, 0, 4, 1, 0);
}
AVX2 static void f32_4x3(const float *w, size_t ws, const float *x, size_t ldx, uint32_t n,
                         float *y, size_t ldy, size_t pf)
{
    f32_tile(w, ws, x, ldx, n, y, ldy, 4, 3, pf);
}
AVX2 static void f32_8x1(const float *w, size_t ws, const float *x, uint32_t n, float *y)
{
    f32_tile(w, ws, x, 0, n, y, 0, 8, 1, (size_t)PF_TILES * 8 * ws);
}

/* Rows [r0, r1) against a block of nt tokens: strips of 4 rows, each against all the tokens, 3
 * at a time, so a strip is read from memory once and then served from L1 (see the VNNI
 * variant below, built the same way). */
AVX2 static void f32_rows_block(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                                uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        size_t pf = (size_t)F32_PF_STRIPS * 4 * ws;
        uint32_t t = 0;
        for (; t + 3 <= nt; t += 3, pf = 0)
            f32_4x3(w + r * ws, ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy, pf);
        for (; t < nt; t++)
            f32_4x1(w + r * ws, ws, x + t * ldx, n, y + t * ldy + r);
    }
    for (; r < r1; r++) {
        uint32_t t = 0;
        for (; t + 3 <= nt; t += 3)
            f32_1x3(w + r * ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy);
        for (; t < nt; t++)
            f32_1x1(w + r * ws, x + t * ldx, n, y + t * ldy + r);
    }
}

AVX2 void kvf__f32_rows_avx2(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                             uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    if (nt == 1) {
        for (; r + 8 <= r1; r += 8)
            f32_8x1(w + r * ws, ws, x, n, y + r);
        for (; r < r1; r++)
            f32_1x1(w + r * ws, x, n, y + r);
        return;
    }
    uint32_t tb = f32_token_block(nt, n, 3);
    for (uint32_t t0 = 0; t0 < nt; t0 += tb) {
        uint32_t tn = nt - t0 < tb ? nt - t0 : tb;
        f32_rows_block(w, ws, x + t0 * ldx, ldx, tn, n, y + t0 * ldy, ldy, r0, r1);
    }
}

/* The F32 recipe of f32_tile, pair for pair, in tiles up to 8 rows × 6 tokens (with 32 vector
 * registers, 24 accumulators, 6 token vectors and a weight vector fit without spilling). When
 * pf is set, each weight row r of the tile also prefetches row r + pf into L2, one prefetch per
 * 64-byte line (every other step). */
VNNI INLINE void f32v_tile(const float *w, size_t ws, const float *x, size_t ldx, uint32_t n,
                           float *y, size_t ldy, const int R, const int T, size_t pf)
{
    __m256 acc[8][6];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv[6];
        for (int t = 0; t < T; t++)
            xv[t] = _mm256_loadu_ps(x + t * ldx + i);
        for (int r = 0; r < R; r++) {
            if (pf && (i & 8) == 0) _mm_prefetch((const char *)(w + r * ws + pf + i), _MM_HINT_T1);
            __m256 wv = _mm256_loadu_ps(w + r * ws + i);
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = hsum8(acc[r][t]);
            const float *wr = w + r * ws, *xt = x + t * ldx;
            for (uint32_t k = i; k < n; k++)
                s += wr[k] * xt[k];
            y[t * ldy + r] = s;
        }
}

/* Tokens per tile in the VNNI variant's F32 strips. */
#define F32V_T 6

/* The same recipe with two pairs in each 512-bit register: the low half holds row 2p's 8-lane
 * accumulator, the high half row 2p + 1's, each the value a 256-bit accumulator would hold, lane
 * for lane (a 512-bit FMA is sixteen independent single-lane FMAs). The halves are split before
 * the sum, so each pair still gets hsum8 then its own tail. Up to 4 row pairs × 6 tokens: 24
 * accumulators, 4 weight registers and a broadcast token vector. A core whose FP units are 256
 * bits wide (this project's machine) runs a 512-bit FMA as two, so this does not raise the FMA
 * rate; it halves the instructions per pair (a token's vector is loaded once, as a broadcast,
 * for two rows) and lets hsum8_x8 sum eight rows at once. */
VNNI INLINE __m512 load_2rows(const float *a, const float *b)
{
    __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

VNNI INLINE __m512 bcast8(const float *a)
{
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(a))));
}

/* The sums of eight rows' accumulators for one token, rows 0-7 held in the halves of a, b, c, d
 * in order, then each row's tail from i to n, stored to y[0..8). Each row's sum is hsum8's, add
 * for add with the same operands in the same order — ((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
 * (l3 + l7)) — only computed for eight rows at once by shuffling them into common registers. */
VNNI INLINE void hsum8_x8(__m512 a, __m512 b, __m512 c, __m512 d, const float *w, size_t ws,
                          const float *x, uint32_t i, uint32_t n, float *y)
{
    /* 128-bit lane k of u03 holds row k's (l0 + l4, l1 + l5, l2 + l6, l3 + l7); u47 rows 4-7. */
    __m512 u03 = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 u47 = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 1, 3, 1)));
    /* Lane k: row k's (u0 + u2, u1 + u3), then row k + 4's. */
    __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u03, u47, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u03, u47, _MM_SHUFFLE(3, 2, 3, 2)));
    /* Lane k: (row k, row k + 4) twice, each v0 + v1. */
    __m512 f = _mm512_add_ps(_mm512_shuffle_ps(v, v, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(v, v, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    __m256 s = _mm512_castps512_ps256(_mm512_permutexvar_ps(order, f));
    if (i == n) {
        _mm256_storeu_ps(y, s);
        return;
    }
    float sum[8];
    _mm256_storeu_ps(sum, s);
    for (int r = 0; r < 8; r++) {
        const float *wr = w + r * ws;
        for (uint32_t k = i; k < n; k++)
            sum[r] += wr[k] * x[k];
        y[r] = sum[r];
    }
}

VNNI INLINE void f32z_tile(const float *w, size_t ws, const float *x, size_t ldx, uint32_t n,
                           float *y, size_t ldy, const int RP, const int T, size_t pf)
{
    __m512 acc[4][6];
    for (int p = 0; p < RP; p++)
        for (int t = 0; t < T; t++)
            acc[p][t] = _mm512_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512 wv[4];
        for (int p = 0; p < RP; p++) {
            if (pf && (i & 8) == 0) {
                _mm_prefetch((const char *)(w + 2 * p * ws + pf + i), _MM_HINT_T1);
                _mm_prefetch((const char *)(w + (2 * p + 1) * ws + pf + i), _MM_HINT_T1);
            }
            wv[p] = load_2rows(w + 2 * p * ws + i, w + (2 * p + 1) * ws + i);
        }
        for (int t = 0; t < T; t++) {
            __m512 xv = bcast8(x + t * ldx + i);
            for (int p = 0; p < RP; p++)
                acc[p][t] = _mm512_fmadd_ps(wv[p], xv, acc[p][t]);
        }
    }
    if (RP == 4) {
        for (int t = 0; t < T; t++)
            hsum8_x8(acc[0][t], acc[1][t], acc[2][t], acc[3][t], w, ws, x + t * ldx, i, n,
                     y + t * ldy);
        return;
    }
    for (int p = 0; p < RP; p++)
        for (int t = 0; t < T; t++) {
            __m256 half[2] = {
                _mm512_castps512_ps256(acc[p][t]),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][t]), 1)),
            };
            for (int h = 0; h < 2; h++) {
                float s = hsum8(half[h]);
                const float *wr = w + (2 * p + h) * ws, *xt = x + t * ldx;
                for (uint32_t k = i; k < n; k++)
                    s += wr[k] * xt[k];
                y[t * ldy + 2 * p + h] = s;
            }
        }
}

/* One strip of rows (tile(..., shape, T, pf) covers `rows` rows) against tokens [0, nt): the
 * strip's weights are read from memory once, by the first tile, and stay in L1 for the tiles
 * after it. Only that first tile prefetches, F32_PF_STRIPS strips ahead. */
#define F32V_STRIP(tile, shape, rows)                                                              \
    do {                                                                                           \
        const float *ws_ = w + r * ws;                                                             \
        uint32_t t = 0;                                                                            \
        if (nt >= F32V_T) {                                                                        \
            size_t pf_ = (size_t)F32_PF_STRIPS * (rows)*ws;                                        \
            tile(ws_, ws, x, ldx, n, y + r, ldy, shape, F32V_T, pf_);                              \
            for (t = F32V_T; t + F32V_T <= nt; t += F32V_T)                                        \
                tile(ws_, ws, x + t * ldx, ldx, n, y + t * ldy + r, ldy, shape, F32V_T, 0);        \
        }                                                                                          \
        const float *xt_ = x + t * ldx;                                                            \
        float *yt_ = y + t * ldy + r;                                                              \
        switch (nt - t) {                                                                          \
        case 5:                                                                                    \
            tile(ws_, ws, xt_, ldx, n, yt_, ldy, shape, 5, 0);                                     \
            break;                                                                                 \
        case 4:                                                                                    \
            tile(ws_, ws, xt_, ldx, n, yt_, ldy, shape, 4, 0);                                     \
            break;                                                                                 \
        case 3:                                                                                    \
            tile(ws_, ws, xt_, ldx, n, yt_, ldy, shape, 3, 0);                                     \
            break;                                                                                 \
        case 2:                                                                                    \
            tile(ws_, ws, xt_, ldx, n, yt_, ldy, shape, 2, 0);                                     \
            break;                                                                                 \
        case 1:                                                                                    \
            tile(ws_, ws, xt_, ldx, n, yt_, ldy, shape, 1, 0);                                     \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* Rows [r0, r1) against a block of nt tokens: strips of 8 rows (4 row pairs), then 4, then 1. */
VNNI static void f32v_rows_block(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                                 uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    for (; r + 8 <= r1; r += 8)
        F32V_STRIP(f32z_tile, 4, 8);
    for (; r + 4 <= r1; r += 4)
        F32V_STRIP(f32v_tile, 4, 4);
    for (; r < r1; r++)
        F32V_STRIP(f32v_tile, 1, 1);
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
        for (; r + 8 <= r1; r += 8)
            f32v_tile(w + r * ws, ws, x, 0, n, y + r, 0, 8, 1, pf);
        for (; r < r1; r++)
            f32v_tile(w + r * ws, ws, x, 0, n, y + r, 0, 1, 1, pf);
        return;
    }
    uint32_t tb = f32_token_block(nt, n, F32V_T);
    for (uint32_t t0 = 0; t0 < nt; t0 += tb) {
        uint32_t tn = nt - t0 < tb ? nt - t0 : tb;
        f32v_rows_block(w, ws, x + t0 * ldx, ldx, tn, n, y + t0 * ldy, ldy, r0, r1);
    }
}

#endif
