/*
 * kernels_q8_x86.c — Q8_0 tiles for the "avx2" and "avx2+vnni" variants, and the quantizer of
 * their 16-bit activations (struct kvf_act16 in kernels.h).
 *
 * The Q8_0 per-pair recipe (row r of W, token t), shared by every tile shape and both variants:
 * one 8-lane float accumulator; block b gives 8 int32 lanes, lane l the exact sum
 *   w[2l]·x[2l] + w[2l+1]·x[2l+1] + w[16+2l]·x[16+2l] + w[17+2l]·x[17+2l]
 * (weights sign-extended to int16; |lane| ≤ 4 · 128 · 32767 < 2^24, so the sum and its
 * conversion to float are exact), and acc = fma(float(lanes), d_w[b], acc); then
 * y = hsum8(acc) · d_x, the row's one activation scale applied once at the end. AVX2 forms a
 * block's lanes with two vpmaddwd and a vpaddd, VNNI with vpmaddwd then vpdpwssd; both give
 * the same exact integers, so the two variants' values agree bit for bit.
 *
 * A tile of R rows × T tokens widens each row's block to int16 once (two vpmovsxbw) and uses
 * it for all T tokens; nothing is shared between pairs, so every tile shape gives each pair the
 * value the 1 × 1 tile gives.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels_x86.h"

#ifdef KVF_HAVE_X86_KERNELS

/* Block b of a row, widened to int16: bytes 0-15 in lo, 16-31 in hi. */
#define WIDEN_W(wb, lo, hi)                                                                      \
    do {                                                                                         \
        lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb)->qs));                   \
        hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((wb)->qs + 16)));            \
    } while (0)

/*
 * How far ahead, in rows, a call over rows [r0, r1) prefetches: a third of its rows, between
 * one tile (min) and max. With several threads a call covers one chunk of rows and the next
 * chunk is likely another thread's, so prefetches further on would fetch that thread's rows
 * instead of this call's own; and the first rows, which no earlier tile prefetched, are
 * requested before any work starts (into L2, whole 64-byte lines).
 */
AVX2 static size_t q8_prefetch_rows(const struct kvf_block_q8_0 *w, size_t ws, uint32_t r0,
                                    uint32_t r1, size_t min, size_t max)
{
    size_t rows = (r1 - r0) / 3;
    rows = rows < min ? min : rows > max ? max : rows;
    const char *p = (const char *)(w + r0 * ws);
    size_t bytes = (rows < r1 - r0 ? rows : r1 - r0) * ws * sizeof(*w);
    for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(p + i, _MM_HINT_T1);
    return rows;
}

/* R rows × T tokens of the recipe, AVX2 (16 registers: up to 4 × 2 or 8 × 1). */
AVX2 INLINE void q8_tile(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x,
                         const float *xd, size_t ldx, uint32_t nb, float *y, size_t ldy,
                         const int R, const int T, size_t pf)
{
    __m256 acc[8][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m256i xlo[2], xhi[2];
        for (int t = 0; t < T; t++) {
            xlo[t] = _mm256_loadu_si256((const __m256i *)(x + t * ldx + (size_t)b * KVF_QK));
            xhi[t] = _mm256_loadu_si256((const __m256i *)(x + t * ldx + (size_t)b * KVF_QK + 16));
        }
        for (int r = 0; r < R; r++) {
            const struct kvf_block_q8_0 *wb = &w[r * ws + b];
            _mm_prefetch((const char *)(wb + pf), _MM_HINT_T1);
            __m256i wlo, whi;
            WIDEN_W(wb, wlo, whi);
            __m256 dw = _mm256_set1_ps(h2f(wb->d));
            for (int t = 0; t < T; t++) {
                __m256i s = _mm256_add_epi32(_mm256_madd_epi16(wlo, xlo[t]),
                                             _mm256_madd_epi16(whi, xhi[t]));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dw, acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum8(acc[r][t]) * xd[t];
}

AVX2 static void q8_1x1(const struct kvf_block_q8_0 *w, const int16_t *x, const float *xd,
                        uint32_t nb, float *y, size_t pf)
{
    q8_tile(w, 0, x, xd, 0, nb, y, 0, 1, 1, pf);
}
AVX2 static void q8_1x2(const struct kvf_block_q8_0 *w, const int16_t *x, const float *xd,
                        size_t ldx, uint32_t nb, float *y, size_t ldy, size_t pf)
{
    q8_tile(w, 0, x, xd, ldx, nb, y, ldy, 1, 2, pf);
}
AVX2 static void q8_4x1(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x,
                        const float *xd, uint32_t nb, float *y, size_t pf)
{
    q8_tile(w, ws, x, xd, 0, nb, y, 0, 4, 1, pf);
}
AVX2 static void q8_4x2(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x,
                        const float *xd, size_t ldx, uint32_t nb, float *y, size_t ldy, size_t pf)
{
    q8_tile(w, ws, x, xd, ldx, nb, y, ldy, 4, 2, pf);
}
AVX2 static void q8_8x1(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x,
                        const float *xd, uint32_t nb, float *y, size_t pf)
{
    q8_tile(w, ws, x, xd, 0, nb, y, 0, 8, 1, pf);
}

AVX2 void kvf__q8_rows_avx2(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x,
                            const float *xd, size_t ldx, uint32_t nt, uint32_t nb, float *y,
                            size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    if (nt == 1) {
        size_t pf = q8_prefetch_rows(w, ws, r0, r1, 8, (size_t)PF_TILES * 8) * ws;
        for (; r + 8 <= r1; r += 8) q8_8x1(w + r * ws, ws, x, xd, nb, y + r, pf);
        for (; r < r1; r++) q8_1x1(w + r * ws, x, xd, nb, y + r, pf);
        return;
    }
    size_t pf = q8_prefetch_rows(w, ws, r0, r1, 4, (size_t)PF_TILES * 4 / (nt < 4 ? nt : 4)) * ws;
    for (; r + 4 <= r1; r += 4) {
        uint32_t t = 0;
        for (; t + 2 <= nt; t += 2)
            q8_4x2(w + r * ws, ws, x + t * ldx, xd + t, ldx, nb, y + t * ldy + r, ldy, pf);
        for (; t < nt; t++) q8_4x1(w + r * ws, ws, x + t * ldx, xd + t, nb, y + t * ldy + r, pf);
    }
    for (; r < r1; r++) {
        uint32_t t = 0;
        for (; t + 2 <= nt; t += 2)
            q8_1x2(w + r * ws, x + t * ldx, xd + t, ldx, nb, y + t * ldy + r, ldy, pf);
        for (; t < nt; t++) q8_1x1(w + r * ws, x + t * ldx, xd + t, nb, y + t * ldy + r, pf);
    }
}

/*
 * The activation quantizer of kernels_scalar.c in vector form, with the same IEEE operations in
 * the same roles: the row's largest |x| (max is exact, so its order does not matter),
 * d = amax / 32767 and id = 1 / d in scalar, then x × id rounded to nearest-even (the default
 * rounding mode, as lrintf uses) — so the bytes are the scalar function's. vmaxps drops NaN
 * operands, so non-finite values are found apart: x × 0 is NaN exactly for Inf and NaN, and
 * a NaN anywhere makes the sum NaN.
 */
AVX2 void kvf__quant_a16_avx2(const float *x, int16_t *q, float *d, uint32_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
    __m256 m = zero, z = zero;
    for (uint32_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
        z = _mm256_add_ps(z, _mm256_mul_ps(v, zero));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 0x55));
    bool finite = _mm256_movemask_ps(_mm256_cmp_ps(z, z, _CMP_UNORD_Q)) == 0;
    float dd = _mm_cvtss_f32(h) / 32767.0f;
    if (!finite || dd < FLT_MIN) {
        *d = finite ? 0.0f : NAN;
        memset(q, 0, n * sizeof(int16_t));
        return;
    }
    *d = dd;
    __m256 vid = _mm256_set1_ps(1.0f / dd);
    for (uint32_t i = 0; i < n; i += 16) {
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vid));
        /* packs works within 128-bit lanes (0-3, 8-11, 4-7, 12-15); the permute restores order. */
        __m256i p = _mm256_packs_epi32(i0, i1);
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permute4x64_epi64(p, 0xd8));
    }
}

/*
 * The same recipe with AVX-512 VNNI on 256-bit registers: vpmaddwd forms the first half of a
 * block's lanes and vpdpwssd adds the second half's products to it — the exact integers AVX2
 * forms with two vpmaddwd and a vpaddd, one instruction fewer per pair.
 *
 * AVX-512VL gives 32 vector registers, so tiles here are larger: 4 rows × up to 4 tokens
 * (16 accumulators, 8 activation registers) for batches, 8 rows × 1 token for a single token.
 * Each weight row is prefetched pf blocks ahead (whole rows further on), since rows are short
 * next to the distance memory latency needs.
 */
VNNI INLINE void q8v_tile(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x,
                          const float *xd, size_t ldx, uint32_t nb, float *y, size_t ldy,
                          const int R, const int T, size_t pf)
{
    __m256 acc[8][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m256i xlo[4], xhi[4];
        for (int t = 0; t < T; t++) {
            xlo[t] = _mm256_loadu_si256((const __m256i *)(x + t * ldx + (size_t)b * KVF_QK));
            xhi[t] = _mm256_loadu_si256((const __m256i *)(x + t * ldx + (size_t)b * KVF_QK + 16));
        }
        for (int r = 0; r < R; r++) {
            const struct kvf_block_q8_0 *wb = &w[r * ws + b];
            _mm_prefetch((const char *)(wb + pf), _MM_HINT_T1);
            __m256i wlo, whi;
            WIDEN_W(wb, wlo, whi);
            __m256 dw = bcast_h(&wb->d);
            for (int t = 0; t < T; t++) {
                __m256i s = _mm256_dpwssd_epi32(_mm256_madd_epi16(wlo, xlo[t]), whi, xhi[t]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dw, acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum8(acc[r][t]) * xd[t];
}

/* Rows [r, r + R) of W against every token, in groups of 4 then one group of the rest. */
#define Q8V_TOKENS(R)                                                                            \
    do {                                                                                         \
        uint32_t t = 0;                                                                          \
        const struct kvf_block_q8_0 *wr = w + r * ws;                                            \
        for (; t + 4 <= nt; t += 4)                                                              \
            q8v_tile(wr, ws, x + t * ldx, xd + t, ldx, nb, y + t * ldy + r, ldy, R, 4, pf);      \
        switch (nt - t) {                                                                        \
        case 3: q8v_tile(wr, ws, x + t * ldx, xd + t, ldx, nb, y + t * ldy + r, ldy, R, 3, pf); break; \
        case 2: q8v_tile(wr, ws, x + t * ldx, xd + t, ldx, nb, y + t * ldy + r, ldy, R, 2, pf); break; \
        case 1: q8v_tile(wr, ws, x + t * ldx, xd + t, ldx, nb, y + t * ldy + r, ldy, R, 1, pf); break; \
        default: break;                                                                          \
        }                                                                                        \
    } while (0)

#define Q8V_TOKEN_BLOCK 16

VNNI static void q8v_rows_block(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x,
                                const float *xd, size_t ldx, uint32_t nt, uint32_t nb, float *y,
                                size_t ldy, uint32_t r0, uint32_t r1, size_t pf)
{
    uint32_t r = r0;
    for (; r + 4 <= r1; r += 4) Q8V_TOKENS(4);
    for (; r < r1; r++) Q8V_TOKENS(1);
}

VNNI void kvf__q8_rows_vnni(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x,
                            const float *xd, size_t ldx, uint32_t nt, uint32_t nb, float *y,
                            size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    if (nt == 1) {
        size_t pf = q8_prefetch_rows(w, ws, r0, r1, 8, (size_t)PF_TILES * 8) * ws;
        for (; r + 8 <= r1; r += 8) q8v_tile(w + r * ws, ws, x, xd, 0, nb, y + r, 0, 8, 1, pf);
        for (; r < r1; r++) q8v_tile(w + r * ws, ws, x, xd, 0, nb, y + r, 0, 1, 1, pf);
        return;
    }
    /* A 4-row tile over several tokens takes longer than a single token's, so fewer tiles
     * ahead keep enough lines in flight. */
    size_t pf = q8_prefetch_rows(w, ws, r0, r1, 4, (size_t)PF_TILES * 4 / (nt < 4 ? nt : 4)) * ws;
    /* Tokens in blocks of Q8V_TOKEN_BLOCK, so the block's activations stay in L1 while every
     * row of [r0, r1) passes over them (the rows, a chunk's share of W, stay in L2). */
    for (uint32_t t0 = 0; t0 < nt; t0 += Q8V_TOKEN_BLOCK) {
        uint32_t tn = nt - t0 < Q8V_TOKEN_BLOCK ? nt - t0 : Q8V_TOKEN_BLOCK;
        q8v_rows_block(w, ws, x + t0 * ldx, xd + t0, ldx, tn, nb, y + t0 * ldy, ldy, r0, r1, pf);
    }
}

#endif
