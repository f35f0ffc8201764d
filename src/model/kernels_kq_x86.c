/*
 * kernels_kq_x86.c — Q4_0 / Q4_K (struct kvf_q4g) and Q6_K (struct kvf_q6g) tiles for the
 * "avx2+vnni" variant, on the recipes of kernels.h.
 *
 * They are kernels_q8_x86.c's tiles with other loads. Q4: one 32-byte load widened to int16
 * holds pairs p and p + 8 of all 16 rows as nibbles; masked with 15 it is pair p, shifted right
 * by 4 (and masked) pair p + 8, and vpdpwssd adds each against the token's pair of activations
 * into the row's lane. Each block ends with two fmas: the integer sum times the row's scale a,
 * and the token's sum of activations over the block (an exact integer, the same for every row)
 * times the row's offset b. Q6: Q8_0's loads and pair order exactly, the sums of columns 0-15
 * and 16-31 kept apart and each multiplied by its own scale. Integer sums are exact whatever
 * their order; the float operations are the recipe's in block order for every tile shape, so
 * every tile gives each (row, token) pair the scalar variant's value.
 */
#include <string.h>

#include "kernels_x86.h"

#ifdef KVF_HAVE_X86_KERNELS

static inline int32_t act_pair(const int16_t *x)
{
    int32_t v;
    memcpy(&v, x, sizeof(v));
    return v;
}

static inline uint32_t group_mask(uint32_t g, uint32_t r0, uint32_t r1)
{
    uint32_t base = g * KVF_Q8G_ROWS;
    uint32_t lo = r0 > base ? r0 - base : 0;
    uint32_t hi = r1 - base < KVF_Q8G_ROWS ? r1 - base : KVF_Q8G_ROWS;
    return ((1u << hi) - 1) & ~((1u << lo) - 1);
}

/* Σ of the 32 activations at x, exactly. */
VNNI INLINE int32_t act_sum32(const int16_t *x)
{
    __m512i v = _mm512_madd_epi16(_mm512_loadu_si512((const void *)x), _mm512_set1_epi16(1));
    return _mm512_reduce_add_epi32(v);
}

/* R groups × T tokens of Q4 (R · T ≤ 8). pf: blocks ahead to prefetch each group's data (0:
 * none). */
VNNI INLINE void q4z_tile(const struct kvf_q4g *w, uint32_t nb, const int16_t *x, const float *xd,
                          size_t ldx, float *y, size_t ldy, const int R, const int T, size_t pf,
                          const uint32_t *mask)
{
    const __m512i m15 = _mm512_set1_epi16(15);
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m512i s[2][4][4];
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++) s[h][r][t] = _mm512_setzero_si512();
        const int16_t *xb = x + (size_t)b * KVF_QK;
        _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) {
            __m512i lo[4], hi[4];
            for (int r = 0; r < R; r++) {
                const struct kvf_q4g *wb = w + (size_t)r * nb + b;
                if (pf && (p & 1) == 0)
                    _mm_prefetch((const char *)(wb + pf) + 32 * p, _MM_HINT_T1);
                __m512i v = _mm512_cvtepu8_epi16(
                    _mm256_loadu_si256((const __m256i *)(wb->qs + 32 * p)));
                lo[r] = _mm512_and_si512(v, m15);
                hi[r] = _mm512_srli_epi16(v, 4);
            }
            for (int t = 0; t < T; t++) {
                const int16_t *xt = xb + t * ldx;
                __m512i xl = _mm512_set1_epi32(act_pair(xt + 2 * p));
                __m512i xh = _mm512_set1_epi32(act_pair(xt + 16 + 2 * p));
                for (int r = 0; r < R; r++) {
                    s[0][r][t] = _mm512_dpwssd_epi32(s[0][r][t], lo[r], xl);
                    s[1][r][t] = _mm512_dpwssd_epi32(s[1][r][t], hi[r], xh);
                }
            }
        }
        __m512 sx[4];
        for (int t = 0; t < T; t++) sx[t] = _mm512_set1_ps((float)act_sum32(xb + t * ldx));
        for (int r = 0; r < R; r++) {
            const struct kvf_q4g *wb = w + (size_t)r * nb + b;
            if (pf) _mm_prefetch((const char *)(wb + pf), _MM_HINT_T1);
            __m512 a = _mm512_loadu_ps(wb->a), off = _mm512_loadu_ps(wb->b);
            for (int t = 0; t < T; t++) {
                __m512i st = _mm512_add_epi32(s[0][r][t], s[1][r][t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), a, acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(sx[t], off, acc[r][t]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        __m512 xs = _mm512_set1_ps(xd[t]);
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + t * ldy + r * KVF_Q8G_ROWS, (__mmask16)mask[r],
                                  _mm512_mul_ps(acc[r][t], xs));
    }
}

/* R groups × T tokens of Q6 (R · T ≤ 8). */
VNNI INLINE void q6z_tile(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                          size_t ldx, float *y, size_t ldy, const int R, const int T, size_t pf,
                          const uint32_t *mask)
{
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m512i s[2][4][4];
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++) s[h][r][t] = _mm512_setzero_si512();
        const int16_t *xb = x + (size_t)b * KVF_QK;
        _Pragma("GCC unroll 16") for (int p = 0; p < KVF_QK / 2; p++) {
            const int h = p / 8;
            __m512i wv[4];
            for (int r = 0; r < R; r++) {
                const struct kvf_q6g *wb = w + (size_t)r * nb + b;
                if (pf && (p & 1) == 0)
                    _mm_prefetch((const char *)(wb + pf) + 32 * p, _MM_HINT_T1);
                wv[r] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wb->qs + 32 * p)));
            }
            for (int t = 0; t < T; t++) {
                __m512i xv = _mm512_set1_epi32(act_pair(xb + t * ldx + 2 * p));
                for (int r = 0; r < R; r++) s[h][r][t] = _mm512_dpwssd_epi32(s[h][r][t], wv[r], xv);
            }
        }
        for (int r = 0; r < R; r++) {
            const struct kvf_q6g *wb = w + (size_t)r * nb + b;
            if (pf) _mm_prefetch((const char *)(wb + pf) + 576, _MM_HINT_T1);
            __m512 a0 = _mm512_loadu_ps(wb->a[0]), a1 = _mm512_loadu_ps(wb->a[1]);
            for (int t = 0; t < T; t++) {
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0][r][t]), a0, acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[1][r][t]), a1, acc[r][t]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        __m512 xs = _mm512_set1_ps(xd[t]);
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + t * ldy + r * KVF_Q8G_ROWS, (__mmask16)mask[r],
                                  _mm512_mul_ps(acc[r][t], xs));
    }
}

/* Rows [r0, r1) against every token: a single token in tiles of 4 groups, each prefetching the
 * next 4; a batch in tiles of 2 groups × 4 tokens (the first token tile prefetching the next
 * groups, the others finding them in cache), then the rest of the tokens in one tile. */
#define KQ_ROWS(TILE, TYPE)                                                                       \
    do {                                                                                         \
        uint32_t g = r0 / KVF_Q8G_ROWS, g1 = (r1 + KVF_Q8G_ROWS - 1) / KVF_Q8G_ROWS;             \
        uint32_t m[4];                                                                           \
        if (nt == 1) {                                                                           \
            for (; g + 4 <= g1; g += 4) {                                                        \
                for (int r = 0; r < 4; r++) m[r] = group_mask(g + r, r0, r1);                    \
                TILE(w + (size_t)g * nb, nb, x, xd, 0, y + (size_t)g * KVF_Q8G_ROWS, 0, 4, 1,    \
                     4 * (size_t)nb, m);                                                         \
            }                                                                                    \
            for (; g < g1; g++) {                                                                \
                m[0] = group_mask(g, r0, r1);                                                    \
                TILE(w + (size_t)g * nb, nb, x, xd, 0, y + (size_t)g * KVF_Q8G_ROWS, 0, 1, 1,    \
                     nb, m);                                                                     \
            }                                                                                    \
            break;                                                                               \
        }                                                                                        \
        for (; g < g1; g += 2) {                                                                 \
            int R = g + 2 <= g1 ? 2 : 1;                                                         \
            m[0] = group_mask(g, r0, r1);                                                        \
            m[1] = R == 2 ? group_mask(g + 1, r0, r1) : 0;                                       \
            const TYPE *wg = w + (size_t)g * nb;                                                 \
            float *yg = y + (size_t)g * KVF_Q8G_ROWS;                                            \
            size_t pf = 2 * (size_t)nb;                                                          \
            uint32_t t = 0;                                                                      \
            for (; t + 4 <= nt; t += 4, pf = 0) {                                                \
                if (R == 2) TILE(wg, nb, x + t * ldx, xd + t, ldx, yg + t * ldy, ldy, 2, 4, pf, m); \
                else TILE(wg, nb, x + t * ldx, xd + t, ldx, yg + t * ldy, ldy, 1, 4, pf, m);     \
            }                                                                                    \
            const int16_t *xt = x + t * ldx;                                                     \
            float *yt = yg + t * ldy;                                                            \
            switch ((nt - t) * 2 + (uint32_t)(R - 1)) {                                          \
            case 2: TILE(wg, nb, xt, xd + t, ldx, yt, ldy, 1, 1, pf, m); break;                  \
            case 3: TILE(wg, nb, xt, xd + t, ldx, yt, ldy, 2, 1, pf, m); break;                  \
            case 4: TILE(wg, nb, xt, xd + t, ldx, yt, ldy, 1, 2, pf, m); break;                  \
            case 5: TILE(wg, nb, xt, xd + t, ldx, yt, ldy, 2, 2, pf, m); break;                  \
            case 6: TILE(wg, nb, xt, xd + t, ldx, yt, ldy, 1, 3, pf, m); break;                  \
            case 7: TILE(wg, nb, xt, xd + t, ldx, yt, ldy, 2, 3, pf, m); break;                  \
            default: break;                                                                      \
            }                                                                                    \
        }                                                                                        \
    } while (0)

VNNI void kvf__q4_rows_vnni(const struct kvf_q4g *w, uint32_t nb, const int16_t *x,
                            const float *xd, size_t ldx, uint32_t nt, float *y, size_t ldy,
                            uint32_t r0, uint32_t r1)
{
    KQ_ROWS(q4z_tile, struct kvf_q4g);
}

VNNI void kvf__q6_rows_vnni(const struct kvf_q6g *w, uint32_t nb, const int16_t *x,
                            const float *xd, size_t ldx, uint32_t nt, float *y, size_t ldy,
                            uint32_t r0, uint32_t r1)
{
    KQ_ROWS(q6z_tile, struct kvf_q6g);
}

#endif
