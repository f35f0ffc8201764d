/*
 * kernels_q8_x86.c — Q8_0 tiles for the "avx2" and "avx2+vnni" variants, and the quantizer of
 * their 16-bit activations (struct kvf_act16 in kernels.h). The same tiles run Q5_1 packed with
 * its minima (struct kvf_q8mg, MIN): one more fma per block, the token's block sum times the
 * rows' minima, after the scale's.
 *
 * Both read the packed weights of kernels.h (struct kvf_q8g: 16 rows per group, a column pair
 * of all 16 rows in 32 bytes) and keep its per-pair recipe: per block, the exact integer sum of
 * the row's 32 products with the token's int16 activations, then one fma with the row's block
 * scale into a float accumulator, and the token's scale applied at the end. Widened to int16, a
 * column pair of the group is one operand whose 32-bit lane r is row r's pair; vpmaddwd (AVX2)
 * or vpdpwssd (VNNI) against the token's pair broadcast to every lane adds
 * w[r][2p]·x[2p] + w[r][2p+1]·x[2p+1] to lane r. So a vector lane is a row from start to end:
 * no horizontal sums, and a conversion and an fma per block serve 16 rows.
 *
 * A tile of R groups × T tokens widens each pair once for its T tokens. Integer sums may be
 * split over several accumulators and added later (integer adds are exact, so the order does
 * not matter); the float operations are the recipe's, in block order, for every tile shape, so
 * every tile gives each (row, token) pair the value the scalar variant gives it.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "kernels_x86.h"

#ifdef KVF_HAVE_X86_KERNELS

/* Token x's activations 2p and 2p + 1 as one 32-bit word, to broadcast to every lane. */
static inline int32_t act_pair(const int16_t *x)
{
    int32_t v;
    memcpy(&v, x, sizeof(v));
    return v;
}

/* Lanes of group g (rows 16g..16g+15) that fall in [r0, r1), as a bit mask. */
static inline uint32_t group_mask(uint32_t g, uint32_t r0, uint32_t r1)
{
    uint32_t base = g * KVF_Q8G_ROWS;
    uint32_t lo = r0 > base ? r0 - base : 0;
    uint32_t hi = r1 - base < KVF_Q8G_ROWS ? r1 - base : KVF_Q8G_ROWS;
    return ((1u << hi) - 1) & ~((1u << lo) - 1);
}

/* Block b of a group of blocks of BB bytes: struct kvf_q8g (Q8_0, Q5_0) or, when MIN,
 * struct kvf_q8mg (Q5_1: a minimum per row after the scales, the weights after it). The two
 * begin with the same 16 scales. */
#define Q8_BLOCK(w, BB, b) ((const uint8_t *)(w) + (size_t)(b) * (BB))
#define Q8_QS(MIN)         ((MIN) ? offsetof(struct kvf_q8mg, qs) : offsetof(struct kvf_q8g, qs))
_Static_assert(offsetof(struct kvf_q8g, d) == 0 && offsetof(struct kvf_q8mg, d) == 0,
               "both packed Q8 layouts begin with the scales");

/* One group × T tokens (T ≤ 3), AVX2: 16 registers hold 2 × T integer and 2 × T float
 * accumulators (rows 0-7 and 8-15), the two widened halves of a pair and a token's pair. With
 * MIN, each block ends with a second fma, the token's block sum (xs, stride ldx / 32) times the
 * rows' minima. */
AVX2 INLINE void q8g_tile(const void *w, const size_t BB, const int MIN, uint32_t nb,
                          const int16_t *x, const float *xd, const float *xs, size_t ldx, float *y,
                          size_t ldy, const int T, uint32_t mask)
{
    const size_t lds = ldx / KVF_QK;
    __m256 acc[3][2];
    for (int t = 0; t < T; t++)
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const uint8_t *wb = Q8_BLOCK(w, BB, b);
        const int8_t *qs = (const int8_t *)(wb + Q8_QS(MIN));
        __m256i s[3][2];
        for (int t = 0; t < T; t++)
            s[t][0] = s[t][1] = _mm256_setzero_si256();
        for (int p = 0; p < KVF_QK / 2; p++) {
            __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 32 * p)));
            __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 32 * p + 16)));
            for (int t = 0; t < T; t++) {
                __m256i xv = _mm256_set1_epi32(act_pair(x + t * ldx + (size_t)b * KVF_QK + 2 * p));
                s[t][0] = _mm256_add_epi32(s[t][0], _mm256_madd_epi16(lo, xv));
                s[t][1] = _mm256_add_epi32(s[t][1], _mm256_madd_epi16(hi, xv));
            }
        }
        __m256 dlo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wb));
        __m256 dhi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 16)));
        for (int t = 0; t < T; t++) {
            acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][0]), dlo, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][1]), dhi, acc[t][1]);
        }
        if (MIN) {
            const uint8_t *m = wb + offsetof(struct kvf_q8mg, m);
            __m256 mlo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)m));
            __m256 mhi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + 16)));
            for (int t = 0; t < T; t++) {
                __m256 sx = _mm256_set1_ps(xs[t * lds + b]);
                acc[t][0] = _mm256_fmadd_ps(sx, mlo, acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(sx, mhi, acc[t][1]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        __m256 xdv = _mm256_set1_ps(xd[t]);
        float v[KVF_Q8G_ROWS];
        _mm256_storeu_ps(v, _mm256_mul_ps(acc[t][0], xdv));
        _mm256_storeu_ps(v + 8, _mm256_mul_ps(acc[t][1], xdv));
        float *yt = y + t * ldy;
        if (mask == 0xffffu)
            memcpy(yt, v, sizeof(v));
        else
            for (int r = 0; r < KVF_Q8G_ROWS; r++)
                if (mask >> r & 1) yt[r] = v[r];
    }
}

/* Rows [r0, r1) of a packed Q8 weight against every token, 3 tokens at a time. */
AVX2 INLINE void q8g_rows(const void *w, const size_t BB, const int MIN, uint32_t nb,
                          const int16_t *x, const float *xd, const float *xs, size_t ldx,
                          uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    const size_t lds = ldx / KVF_QK;
    for (uint32_t g = r0 / KVF_Q8G_ROWS; g * KVF_Q8G_ROWS < r1; g++) {
        const uint8_t *wg = Q8_BLOCK(w, BB, (size_t)g * nb);
        float *yg = y + (size_t)g * KVF_Q8G_ROWS;
        uint32_t mask = group_mask(g, r0, r1), t = 0;
        /* Each tile's block sums from its first token on (Q8_0: xs is NULL and never read). */
#define XS_AT(t) (MIN ? xs + (t)*lds : xs)
        for (; t + 3 <= nt; t += 3)
            q8g_tile(wg, BB, MIN, nb, x + t * ldx, xd + t, XS_AT(t), ldx, yg + t * ldy, ldy, 3,
                     mask);
        if (nt - t == 2)
            q8g_tile(wg, BB, MIN, nb, x + t * ldx, xd + t, XS_AT(t), ldx, yg + t * ldy, ldy, 2,
                     mask);
        if (nt - t == 1)
            q8g_tile(wg, BB, MIN, nb, x + t * ldx, xd + t, XS_AT(t), 0, yg + t * ldy, 0, 1, mask);
#undef XS_AT
    }
}

AVX2 void kvf__q8_rows_avx2(const struct kvf_q8g *w, uint32_t nb, const int16_t *x, const float *xd,
                            size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    q8g_rows(w, sizeof(*w), 0, nb, x, xd, NULL, ldx, nt, y, ldy, r0, r1);
}

AVX2 void kvf__q8m_rows_avx2(const struct kvf_q8mg *w, uint32_t nb, const int16_t *x,
                             const float *xd, const float *xs, size_t ldx, uint32_t nt, float *y,
                             size_t ldy, uint32_t r0, uint32_t r1)
{
    q8g_rows(w, sizeof(*w), 1, nb, x, xd, xs, ldx, nt, y, ldy, r0, r1);
}

/* kvf_f32_to_fp16 eight at a time with F16C: vcvtps2ph rounds to nearest-even, makes
 * subnormal halves and infinities the same way, and quiets a NaN keeping the top 10 bits of
 * its payload, as the scalar form does (tested on all of these). */
AVX2 void kvf__f16_row_avx2(const float *x, uint16_t *h, uint32_t n)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        h[i] = kvf_f32_to_fp16(x[i]);
}

/*
 * The activation quantizer of kernels_scalar.c in vector form, with the same IEEE operations in
 * the same roles: the row's largest |x| (max is exact, so its order does not matter),
 * d = amax / 32767 and id = 1 / d in scalar, then x × id rounded to nearest-even (the default
 * rounding mode, as lrintf uses) — so the bytes are the scalar function's. vmaxps drops NaN
 * operands, so non-finite values are found apart: x × 0 is NaN exactly for Inf and NaN, and
 * a NaN anywhere makes the sum NaN.
 */
AVX2 void kvf__quant_a16_avx2(const float *x, int16_t *q, float *d, float *s, uint32_t n)
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
        memset(s, 0, n / KVF_QK * sizeof(float));
        return;
    }
    *d = dd;
    __m256 vid = _mm256_set1_ps(1.0f / dd);
    const __m256i ones = _mm256_set1_epi16(1);
    for (uint32_t i = 0; i < n; i += KVF_QK) {
        __m256i sum = _mm256_setzero_si256();
        for (uint32_t k = 0; k < KVF_QK; k += 16) {
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + k), vid));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + k + 8), vid));
            /* packs works within 128-bit lanes (0-3, 8-11, 4-7, 12-15); the permute restores
             * order. The block sum is of the saturated values, as stored. */
            __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xd8);
            _mm256_storeu_si256((__m256i *)(q + i + k), p);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
        }
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        s[i / KVF_QK] = (float)_mm_cvtsi128_si32(t);
    }
}

/*
 * The same recipe on 512-bit registers with AVX-512 VNNI: a pair of all 16 rows widens to one
 * register (vpmovsxbw) and vpdpwssd adds a token's pair products to 16 row sums at once, its
 * activations broadcast from memory. A tile is R groups × T tokens: 2 × 6 for batches (12
 * integer and 12 float accumulators, 2 widened pairs: 26 of the 32 registers), 4 × 1 for a
 * single token. Where R × T is small the integer sums of even and odd pairs go to separate
 * accumulators (S = 2), so the chain of dependent vpdpwssd is half as long.
 *
 * pf, when set, is how many blocks ahead each group's loads are prefetched into L2: one tile's
 * worth (R groups further on), the next tile's weights, fetched while this one computes.
 */
VNNI INLINE void q8z_tile(const void *w, const size_t BB, const int MIN, uint32_t nb,
                          const int16_t *x, const float *xd, const float *xs, size_t ldx, float *y,
                          size_t ldy, const int R, const int T, const int S, size_t pf,
                          const uint32_t *mask)
{
    const size_t lds = ldx / KVF_QK;
    __m512 acc[4][6];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m512i s[2][4][6];
        for (int h = 0; h < S; h++)
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++)
                    s[h][r][t] = _mm512_setzero_si512();
        const int16_t *xb = x + (size_t)b * KVF_QK;
        /* Unrolled, every accumulator stays in its register across the block: left as a loop,
         * the compiler copied all of them in and out of spare registers on every pair (two
         * moves per vpdpwssd; the 2 × 6 tile ran at 66% of vpdpwssd throughput, now 89%). */
        _Pragma("GCC unroll 16") for (int p = 0; p < KVF_QK / 2; p += S)
        {
            for (int h = 0; h < S; h++) {
                __m512i wv[4];
                for (int r = 0; r < R; r++) {
                    const uint8_t *wb = Q8_BLOCK(w, BB, (size_t)r * nb + b);
                    if (pf && ((p + h) & 1) == 0)
                        _mm_prefetch((const char *)wb + pf * BB + 32 * (p + h), _MM_HINT_T1);
                    wv[r] = _mm512_cvtepi8_epi16(
                        _mm256_loadu_si256((const __m256i *)(wb + Q8_QS(MIN) + 32 * (p + h))));
                }
                for (int t = 0; t < T; t++) {
                    const int16_t *xt = xb + t * ldx;
                    __m512i xv = _mm512_set1_epi32(act_pair(xt + 2 * (p + h)));
                    for (int r = 0; r < R; r++)
                        s[h][r][t] = _mm512_dpwssd_epi32(s[h][r][t], wv[r], xv);
                }
            }
        }
        for (int r = 0; r < R; r++) {
            const uint8_t *wb = Q8_BLOCK(w, BB, (size_t)r * nb + b);
            if (pf) _mm_prefetch((const char *)wb + pf * BB + 512, _MM_HINT_T1);
            __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
            for (int t = 0; t < T; t++) {
                __m512i st = S == 2 ? _mm512_add_epi32(s[0][r][t], s[1][r][t]) : s[0][r][t];
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), dw, acc[r][t]);
            }
            if (MIN) {
                __m512 mw = _mm512_cvtph_ps(
                    _mm256_loadu_si256((const __m256i *)(wb + offsetof(struct kvf_q8mg, m))));
                for (int t = 0; t < T; t++)
                    acc[r][t] = _mm512_fmadd_ps(_mm512_set1_ps(xs[t * lds + b]), mw, acc[r][t]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        __m512 xdv = _mm512_set1_ps(xd[t]);
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + t * ldy + r * KVF_Q8G_ROWS, (__mmask16)mask[r],
                                  _mm512_mul_ps(acc[r][t], xdv));
    }
}

/* Groups [g, g + R) against every token: 6 at a time, then the rest in one tile. Only the
 * first tile prefetches (the next R groups); the others find the groups in L1, and are called
 * with a literal 0 so that their code holds no prefetch and no test for one. */
#define Q8Z_TOKENS(R)                                                                              \
    do {                                                                                           \
        const uint8_t *wg = Q8_BLOCK(w, BB, (size_t)g * nb);                                       \
        float *yg = y + (size_t)g * KVF_Q8G_ROWS;                                                  \
        size_t pf = (size_t)(R)*nb;                                                                \
        uint32_t t = 0;                                                                            \
        if (nt >= 6) {                                                                             \
            q8z_tile(wg, BB, MIN, nb, x, xd, xs, ldx, yg, ldy, R, 6, 1, pf, m);                    \
            t = 6;                                                                                 \
            pf = 0;                                                                                \
        }                                                                                          \
        for (; t + 6 <= nt; t += 6)                                                                \
            q8z_tile(wg, BB, MIN, nb, x + t * ldx, xd + t, MIN ? xs + t * lds : xs, ldx,           \
                     yg + t * ldy, ldy, R, 6, 1, 0, m);                                            \
        const int16_t *xt = x + t * ldx;                                                           \
        const float *st = MIN ? xs + t * lds : xs; /* Q8_0: NULL, never read */                    \
        float *yt = yg + t * ldy;                                                                  \
        switch (nt - t) {                                                                          \
        case 5:                                                                                    \
            q8z_tile(wg, BB, MIN, nb, xt, xd + t, st, ldx, yt, ldy, R, 5, 1, pf, m);               \
            break;                                                                                 \
        case 4:                                                                                    \
            q8z_tile(wg, BB, MIN, nb, xt, xd + t, st, ldx, yt, ldy, R, 4, 1, pf, m);               \
            break;                                                                                 \
        case 3:                                                                                    \
            q8z_tile(wg, BB, MIN, nb, xt, xd + t, st, ldx, yt, ldy, R, 3, 2, pf, m);               \
            break;                                                                                 \
        case 2:                                                                                    \
            q8z_tile(wg, BB, MIN, nb, xt, xd + t, st, ldx, yt, ldy, R, 2, 2, pf, m);               \
            break;                                                                                 \
        case 1:                                                                                    \
            q8z_tile(wg, BB, MIN, nb, xt, xd + t, st, ldx, yt, ldy, R, 1, 2, pf, m);               \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* Rows [r0, r1) of a packed Q8 weight (BB, MIN: as q8g_tile) against every token. */
VNNI INLINE void q8z_rows(const void *w, const size_t BB, const int MIN, uint32_t nb,
                          const int16_t *x, const float *xd, const float *xs, size_t ldx,
                          uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    const size_t lds = ldx / KVF_QK;
    uint32_t g = r0 / KVF_Q8G_ROWS, g1 = (r1 + KVF_Q8G_ROWS - 1) / KVF_Q8G_ROWS;
    uint32_t m[4];
    if (nt == 1) {
        for (; g + 4 <= g1; g += 4) {
            for (int r = 0; r < 4; r++)
                m[r] = group_mask(g + r, r0, r1);
            q8z_tile(Q8_BLOCK(w, BB, (size_t)g * nb), BB, MIN, nb, x, xd, xs, 0,
                     y + (size_t)g * KVF_Q8G_ROWS, 0, 4, 1, 2, 4 * (size_t)nb, m);
        }
        for (; g < g1; g++) {
            m[0] = group_mask(g, r0, r1);
            q8z_tile(Q8_BLOCK(w, BB, (size_t)g * nb), BB, MIN, nb, x, xd, xs, 0,
                     y + (size_t)g * KVF_Q8G_ROWS, 0, 1, 1, 2, nb, m);
        }
        return;
    }
    for (; g + 2 <= g1; g += 2) {
        m[0] = group_mask(g, r0, r1);
        m[1] = group_mask(g + 1, r0, r1);
        Q8Z_TOKENS(2);
    }
    if (g < g1) {
        m[0] = group_mask(g, r0, r1);
        Q8Z_TOKENS(1);
    }
}

VNNI void kvf__q8_rows_vnni(const struct kvf_q8g *w, uint32_t nb, const int16_t *x, const float *xd,
                            size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    q8z_rows(w, sizeof(*w), 0, nb, x, xd, NULL, ldx, nt, y, ldy, r0, r1);
}

VNNI void kvf__q8m_rows_vnni(const struct kvf_q8mg *w, uint32_t nb, const int16_t *x,
                             const float *xd, const float *xs, size_t ldx, uint32_t nt, float *y,
                             size_t ldy, uint32_t r0, uint32_t r1)
{
    q8z_rows(w, sizeof(*w), 1, nb, x, xd, xs, ldx, nt, y, ldy, r0, r1);
}

#endif
