/*
 * kernels_kq_x86.c — Q4_0 / Q4_K (struct kvf_q4g), Q5_0 / Q5_K (struct kvf_q5g) and Q6_K
 * (struct kvf_q6g) tiles for the "avx2" and "avx2+vnni" variants, on the recipes of kernels.h.
 *
 * They are kernels_q8_x86.c's tiles with other loads. 4 and 5 bits: one 32-byte load widened
 * to int16 holds pairs p and p + 8 of all 16 rows as nibbles; masked with 15 it is pair p,
 * shifted right by 4 pair p + 8, and for 5-bit weights the words of fifth bits are the lane
 * masks of the lanes that take 16 more (AVX-512: a masked add; AVX2: a compare against each
 * lane's bit). Each block ends with two fmas: the integer sum times the row's scale a, and the
 * activations' block sum (struct kvf_act16: computed once per token by the quantizer, not per
 * tile) times the row's offset b. Q6: Q8_0's loads and pair order exactly; a block's columns
 * 0-15 are summed and multiplied by their scale before columns 16-31 are begun, which is the
 * recipe's order, so one set of integer accumulators serves both halves. Integer sums are
 * exact whatever their order; the float operations are the recipe's in block order for every
 * tile shape, so every tile gives each (row, token) pair the scalar variant's value.
 *
 * Tile shapes (AVX-512): a batch goes 2 groups × 6 tokens at a time, as Q8_0's, each broadcast
 * activation pair serving both groups and each unpacked pair all 6 tokens (1 group × 8 or 12
 * tokens, with a broadcast per vpdpwssd, and 3 × 4 or 4 × 3 ran 7-30% slower on smol135m's
 * shapes). A single token goes 4 groups at a time, with even and odd pairs (S = 2) summed apart
 * to halve the chain of dependent vpdpwssd. The model packs Q5_0 as Q8_0 (kernels.h), so these
 * 5-bit tiles run Q5_K.
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

/* Tokens a batch tile takes (AVX-512 and AVX2). */
#define ZR 2
#define ZT 6
#define YT 2

/* The 4- and 5-bit blocks through one pointer type: struct kvf_q5g begins as struct kvf_q4g
 * (kernels.c checks it), and a tile reads qh only when FIVE, so only of a kvf_q5g. Block b of a
 * group of blocks of BB bytes is at w + b · BB. */
#define Q45_BLOCK(w, BB, b) ((const struct kvf_q5g *)((const uint8_t *)(w) + (size_t)(b) * (BB)))

static inline uint32_t qh_word(const struct kvf_q5g *blk, int i)
{
    uint32_t v;
    memcpy(&v, &blk->qh[i], sizeof(v));
    return v;
}

/* ---- AVX2 ------------------------------------------------------------------------------- */

/* The rows of a group whose lanes are set in mask, from two vectors of 8 rows each. */
AVX2 INLINE void store16_y(float *y, __m256 lo, __m256 hi, uint32_t mask)
{
    if (mask == 0xffffu) {
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    float v[KVF_Q8G_ROWS];
    _mm256_storeu_ps(v, lo);
    _mm256_storeu_ps(v + 8, hi);
    for (int r = 0; r < KVF_Q8G_ROWS; r++)
        if (mask >> r & 1) y[r] = v[r];
}

/* 16 in each int16 lane whose bit is set in the 16-bit word `bits` (lane i: bit i), else 0. */
AVX2 INLINE __m256i fifth_y(uint32_t bits, __m256i lane_bit, __m256i k16)
{
    __m256i v = _mm256_and_si256(_mm256_set1_epi16((short)(uint16_t)bits), lane_bit);
    return _mm256_and_si256(_mm256_cmpeq_epi16(v, lane_bit), k16);
}

/* One group × T tokens (T ≤ YT) of 4- or 5-bit weights: rows 0-7 and 8-15 in two vectors,
 * each pair of 8 rows one 16-byte load widened (the pair's 16 int16 lanes) and vpmaddwd
 * against the token's pair. */
AVX2 INLINE void q45y_tile(const void *w, const size_t BB, const int FIVE, uint32_t nb,
                           const int16_t *x, const float *xd, const float *xs, size_t ldx, float *y,
                           size_t ldy, const int T, uint32_t mask)
{
    const __m256i m15 = _mm256_set1_epi16(15), k16 = _mm256_set1_epi16(16);
    const __m256i lane_bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                               4096, 8192, 16384, (short)0x8000);
    const size_t lds = ldx / KVF_QK;
    __m256 acc[YT][2];
    for (int t = 0; t < T; t++)
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const struct kvf_q5g *blk = Q45_BLOCK(w, BB, b);
        const int16_t *xb = x + (size_t)b * KVF_QK;
        __m256i s[YT][2];
        for (int t = 0; t < T; t++)
            s[t][0] = s[t][1] = _mm256_setzero_si256();
        for (int p = 0; p < 8; p++)
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)(blk->qs + 32 * p + 16 * h)));
                __m256i lo = _mm256_and_si256(v, m15), hi = _mm256_srli_epi16(v, 4);
                if (FIVE) {
                    lo = _mm256_or_si256(lo, fifth_y(qh_word(blk, 2 * p) >> 16 * h, lane_bit, k16));
                    hi = _mm256_or_si256(hi,
                                         fifth_y(qh_word(blk, 2 * p + 1) >> 16 * h, lane_bit, k16));
                }
                for (int t = 0; t < T; t++) {
                    const int16_t *xt = xb + t * ldx;
                    __m256i xl = _mm256_set1_epi32(act_pair(xt + 2 * p));
                    __m256i xh = _mm256_set1_epi32(act_pair(xt + 16 + 2 * p));
                    s[t][h] = _mm256_add_epi32(s[t][h], _mm256_madd_epi16(lo, xl));
                    s[t][h] = _mm256_add_epi32(s[t][h], _mm256_madd_epi16(hi, xh));
                }
            }
        for (int h = 0; h < 2; h++) {
            __m256 a = _mm256_loadu_ps(blk->a + 8 * h), off = _mm256_loadu_ps(blk->b + 8 * h);
            for (int t = 0; t < T; t++) {
                acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][h]), a, acc[t][h]);
                acc[t][h] = _mm256_fmadd_ps(_mm256_set1_ps(xs[t * lds + b]), off, acc[t][h]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        __m256 xv = _mm256_set1_ps(xd[t]);
        store16_y(y + t * ldy, _mm256_mul_ps(acc[t][0], xv), _mm256_mul_ps(acc[t][1], xv), mask);
    }
}

/* One group × T tokens (T ≤ 3) of Q6: Q8_0's AVX2 tile, columns 0-15 and 16-31 of a block
 * summed and scaled one after the other. */
AVX2 INLINE void q6y_tile(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                          size_t ldx, float *y, size_t ldy, const int T, uint32_t mask)
{
    __m256 acc[3][2];
    for (int t = 0; t < T; t++)
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const struct kvf_q6g *wb = w + b;
        const int16_t *xb = x + (size_t)b * KVF_QK;
        for (int half = 0; half < 2; half++) {
            __m256i s[3][2];
            for (int t = 0; t < T; t++)
                s[t][0] = s[t][1] = _mm256_setzero_si256();
            for (int p = 8 * half; p < 8 * half + 8; p++) {
                __m256i lo =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb->qs + 32 * p)));
                __m256i hi =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb->qs + 32 * p + 16)));
                for (int t = 0; t < T; t++) {
                    __m256i xv = _mm256_set1_epi32(act_pair(xb + t * ldx + 2 * p));
                    s[t][0] = _mm256_add_epi32(s[t][0], _mm256_madd_epi16(lo, xv));
                    s[t][1] = _mm256_add_epi32(s[t][1], _mm256_madd_epi16(hi, xv));
                }
            }
            __m256 alo = _mm256_loadu_ps(wb->a[half]), ahi = _mm256_loadu_ps(wb->a[half] + 8);
            for (int t = 0; t < T; t++) {
                acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][0]), alo, acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][1]), ahi, acc[t][1]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        __m256 xv = _mm256_set1_ps(xd[t]);
        store16_y(y + t * ldy, _mm256_mul_ps(acc[t][0], xv), _mm256_mul_ps(acc[t][1], xv), mask);
    }
}

AVX2 void kvf__q4_rows_avx2(const struct kvf_q4g *w, uint32_t nb, const int16_t *x, const float *xd,
                            const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy,
                            uint32_t r0, uint32_t r1)
{
    const size_t lds = ldx / KVF_QK;
    for (uint32_t g = r0 / KVF_Q8G_ROWS; g * KVF_Q8G_ROWS < r1; g++) {
        const struct kvf_q4g *wg = w + (size_t)g * nb;
        float *yg = y + (size_t)g * KVF_Q8G_ROWS;
        uint32_t mask = group_mask(g, r0, r1), t = 0;
        for (; t + YT <= nt; t += YT)
            q45y_tile(wg, sizeof(*w), 0, nb, x + t * ldx, xd + t, xs + t * lds, ldx, yg + t * ldy,
                      ldy, YT, mask);
        if (t < nt)
            q45y_tile(wg, sizeof(*w), 0, nb, x + t * ldx, xd + t, xs + t * lds, ldx, yg + t * ldy,
                      ldy, 1, mask);
    }
}

AVX2 void kvf__q5_rows_avx2(const struct kvf_q5g *w, uint32_t nb, const int16_t *x, const float *xd,
                            const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy,
                            uint32_t r0, uint32_t r1)
{
    const size_t lds = ldx / KVF_QK;
    for (uint32_t g = r0 / KVF_Q8G_ROWS; g * KVF_Q8G_ROWS < r1; g++) {
        const struct kvf_q5g *wg = w + (size_t)g * nb;
        float *yg = y + (size_t)g * KVF_Q8G_ROWS;
        uint32_t mask = group_mask(g, r0, r1), t = 0;
        for (; t + YT <= nt; t += YT)
            q45y_tile(wg, sizeof(*w), 1, nb, x + t * ldx, xd + t, xs + t * lds, ldx, yg + t * ldy,
                      ldy, YT, mask);
        if (t < nt)
            q45y_tile(wg, sizeof(*w), 1, nb, x + t * ldx, xd + t, xs + t * lds, ldx, yg + t * ldy,
                      ldy, 1, mask);
    }
}

AVX2 void kvf__q6_rows_avx2(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                            size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    for (uint32_t g = r0 / KVF_Q8G_ROWS; g * KVF_Q8G_ROWS < r1; g++) {
        const struct kvf_q6g *wg = w + (size_t)g * nb;
        float *yg = y + (size_t)g * KVF_Q8G_ROWS;
        uint32_t mask = group_mask(g, r0, r1), t = 0;
        for (; t + 3 <= nt; t += 3)
            q6y_tile(wg, nb, x + t * ldx, xd + t, ldx, yg + t * ldy, ldy, 3, mask);
        if (nt - t == 2) q6y_tile(wg, nb, x + t * ldx, xd + t, ldx, yg + t * ldy, ldy, 2, mask);
        if (nt - t == 1) q6y_tile(wg, nb, x + t * ldx, xd + t, ldx, yg + t * ldy, ldy, 1, mask);
    }
}

/* ---- AVX-512 VNNI ----------------------------------------------------------------------- */

/* R groups × T tokens of 4- or 5-bit weights (BB: the block's bytes, FIVE: whether it holds
 * fifth bits). S = 2 sums each pair p and p + 8 apart. pf: blocks ahead to prefetch each group's
 * data into L2 (0: none). */
VNNI INLINE void q45z_tile(const void *w, const size_t BB, const int FIVE, uint32_t nb,
                           const int16_t *x, const float *xd, const float *xs, size_t ldx, float *y,
                           size_t ldy, const int R, const int T, const int S, size_t pf,
                           const uint32_t *mask)
{
    const __m512i m15 = _mm512_set1_epi16(15), k16 = _mm512_set1_epi16(16);
    const size_t gb = (size_t)nb * BB;
    __m512 acc[4][8];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    const size_t lds = ldx / KVF_QK;
    for (uint32_t b = 0; b < nb; b++) {
        __m512i s[2][4][8];
        for (int h = 0; h < S; h++)
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++)
                    s[h][r][t] = _mm512_setzero_si512();
        const int16_t *xb = x + (size_t)b * KVF_QK;
        const size_t ldb = T == 1 ? 0 : ldx;
        _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)
        {
            __m512i v[4], u[4];
            for (int r = 0; r < R; r++) {
                const struct kvf_q5g *blk = Q45_BLOCK((const uint8_t *)w + r * gb, BB, b);
                if (pf && p < (int)(BB / 64))
                    _mm_prefetch((const char *)blk + pf * BB + 64 * p, _MM_HINT_T1);
                v[r] =
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk->qs + 32 * p)));
                u[r] = _mm512_and_si512(v[r], m15);
                if (FIVE)
                    u[r] =
                        _mm512_mask_add_epi16(u[r], _cvtu32_mask32(qh_word(blk, 2 * p)), u[r], k16);
            }
            for (int t = 0; t < T; t++) {
                __m512i xv = _mm512_set1_epi32(act_pair(xb + t * ldb + 2 * p));
                for (int r = 0; r < R; r++)
                    s[0][r][t] = _mm512_dpwssd_epi32(s[0][r][t], u[r], xv);
            }
            for (int r = 0; r < R; r++) {
                const struct kvf_q5g *blk = Q45_BLOCK((const uint8_t *)w + r * gb, BB, b);
                u[r] = _mm512_srli_epi16(v[r], 4);
                if (FIVE)
                    u[r] = _mm512_mask_add_epi16(u[r], _cvtu32_mask32(qh_word(blk, 2 * p + 1)),
                                                 u[r], k16);
            }
            for (int t = 0; t < T; t++) {
                __m512i xv = _mm512_set1_epi32(act_pair(xb + t * ldb + 16 + 2 * p));
                for (int r = 0; r < R; r++)
                    s[S - 1][r][t] = _mm512_dpwssd_epi32(s[S - 1][r][t], u[r], xv);
            }
        }
        for (int r = 0; r < R; r++) {
            const struct kvf_q5g *blk = Q45_BLOCK((const uint8_t *)w + r * gb, BB, b);
            __m512 a = _mm512_loadu_ps(blk->a), off = _mm512_loadu_ps(blk->b);
            for (int t = 0; t < T; t++) {
                __m512i st = S == 2 ? _mm512_add_epi32(s[0][r][t], s[1][r][t]) : s[0][r][t];
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), a, acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_set1_ps(xs[t * lds + b]), off, acc[r][t]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        __m512 xv = _mm512_set1_ps(xd[t]);
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + t * ldy + r * KVF_Q8G_ROWS, (__mmask16)mask[r],
                                  _mm512_mul_ps(acc[r][t], xv));
    }
}

/* R groups × T tokens of Q6. Columns 0-15 of a block, then 16-31, each half's sum multiplied
 * by its scale as it ends; S = 2 sums even and odd pairs apart. */
VNNI INLINE void q6z_tile(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                          size_t ldx, float *y, size_t ldy, const int R, const int T, const int S,
                          size_t pf, const uint32_t *mask)
{
    __m512 acc[4][8];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const int16_t *xb = x + (size_t)b * KVF_QK;
        const size_t ldb = T == 1 ? 0 : ldx;
        for (int half = 0; half < 2; half++) {
            __m512i s[2][4][8];
            for (int h = 0; h < S; h++)
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++)
                        s[h][r][t] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
            {
                const int p = 8 * half + i;
                __m512i wv[4];
                for (int r = 0; r < R; r++) {
                    const struct kvf_q6g *wb = w + (size_t)r * nb + b;
                    if (pf && (p & 1) == 0 && p / 2 < (int)(sizeof(*wb) / 64))
                        _mm_prefetch((const char *)(wb + pf) + 64 * (p / 2), _MM_HINT_T1);
                    wv[r] = _mm512_cvtepi8_epi16(
                        _mm256_loadu_si256((const __m256i *)(wb->qs + 32 * p)));
                }
                for (int t = 0; t < T; t++) {
                    __m512i xv = _mm512_set1_epi32(act_pair(xb + t * ldb + 2 * p));
                    for (int r = 0; r < R; r++)
                        s[i % S][r][t] = _mm512_dpwssd_epi32(s[i % S][r][t], wv[r], xv);
                }
            }
            for (int r = 0; r < R; r++) {
                const struct kvf_q6g *wb = w + (size_t)r * nb + b;
                if (pf) /* lines 8 and 9 (the loop above asked for 0-7) */
                    _mm_prefetch((const char *)(wb + pf) + 64 * (8 + half), _MM_HINT_T1);
                __m512 a = _mm512_loadu_ps(wb->a[half]);
                for (int t = 0; t < T; t++) {
                    __m512i st = S == 2 ? _mm512_add_epi32(s[0][r][t], s[1][r][t]) : s[0][r][t];
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), a, acc[r][t]);
                }
            }
        }
    }
    for (int t = 0; t < T; t++) {
        __m512 xv = _mm512_set1_ps(xd[t]);
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + t * ldy + r * KVF_Q8G_ROWS, (__mmask16)mask[r],
                                  _mm512_mul_ps(acc[r][t], xv));
    }
}

/* Blocking of a batch (ZT tokens or more), so that what a tile reads again comes from L2: the
 * rows in blocks of about 256 KiB of packed weights (an even number of groups), each block
 * against the tokens in chunks of about 96 KiB of activations (a multiple of ZT). Unblocked,
 * a prefill of 2048 tokens streamed all of their activations (2-6 MB) from L3 once per pair
 * of groups. Neither changes a (row, token) pair's operations. */
static inline uint32_t row_block_groups(uint32_t nb, size_t block_bytes)
{
    size_t g = ((size_t)256 << 10) / ((size_t)nb * block_bytes) & ~(size_t)1;
    return g < 2 ? 2 : (uint32_t)g;
}

static inline uint32_t token_chunk(uint32_t nb)
{
    uint32_t t = (uint32_t)(((size_t)96 << 10) / ((size_t)nb * KVF_QK * sizeof(int16_t)));
    return t < ZT ? ZT : t / ZT * ZT;
}

/*
 * Rows [r0, r1) against every token. A single token: tiles of 4 groups, each prefetching the
 * next 4. A batch: blocked as above, and within a block each pair of groups against ZT tokens
 * at a time (KQZ_TOKENS).
 * TILE(g, t, R, T, S, pf) runs the tile of groups g.. and tokens t.. with the masks in m.
 */
#define KQZ_ROWS(TILE)                                                                             \
    do {                                                                                           \
        uint32_t g = r0 / KVF_Q8G_ROWS, g1 = (r1 + KVF_Q8G_ROWS - 1) / KVF_Q8G_ROWS;               \
        uint32_t m[4];                                                                             \
        if (nt == 1) {                                                                             \
            for (; g + 4 <= g1; g += 4) {                                                          \
                for (int r = 0; r < 4; r++)                                                        \
                    m[r] = group_mask(g + r, r0, r1);                                              \
                TILE(g, 0, 4, 1, 2, 4 * (size_t)nb);                                               \
            }                                                                                      \
            for (; g < g1; g++) {                                                                  \
                m[0] = group_mask(g, r0, r1);                                                      \
                TILE(g, 0, 1, 1, 2, nb);                                                           \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
        const uint32_t gblk = row_block_groups(nb, sizeof(*w)), tc = token_chunk(nb);              \
        for (uint32_t gb = g; gb < g1; gb += gblk) {                                               \
            uint32_t ge = g1 - gb < gblk ? g1 : gb + gblk;                                         \
            for (uint32_t t0 = 0; t0 < nt; t0 += tc) {                                             \
                uint32_t te = nt - t0 < tc ? nt : t0 + tc;                                         \
                for (g = gb; g + 2 <= ge; g += 2) {                                                \
                    m[0] = group_mask(g, r0, r1);                                                  \
                    m[1] = group_mask(g + 1, r0, r1);                                              \
                    KQZ_TOKENS(TILE, 2, t0, te);                                                   \
                }                                                                                  \
                for (; g < ge; g++) {                                                              \
                    m[0] = group_mask(g, r0, r1);                                                  \
                    KQZ_TOKENS(TILE, 1, t0, te);                                                   \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Groups g.. (R of them) against tokens [t0, te): ZT at a time, then the rest in one tile. The
 * first tile prefetches the next R groups; the others find these in cache. */
#define KQZ_TOKENS(TILE, R, t0, te)                                                                \
    do {                                                                                           \
        size_t pf = (R) * (size_t)nb;                                                              \
        uint32_t t = t0;                                                                           \
        if (te - t >= ZT) {                                                                        \
            TILE(g, t, R, ZT, 1, pf);                                                              \
            t += ZT;                                                                               \
            pf = 0;                                                                                \
        }                                                                                          \
        for (; t + ZT <= te; t += ZT)                                                              \
            TILE(g, t, R, ZT, 1, 0);                                                               \
        switch (te - t) {                                                                          \
        case 5:                                                                                    \
            TILE(g, t, R, 5, 1, pf);                                                               \
            break;                                                                                 \
        case 4:                                                                                    \
            TILE(g, t, R, 4, 1, pf);                                                               \
            break;                                                                                 \
        case 3:                                                                                    \
            TILE(g, t, R, 3, 2, pf);                                                               \
            break;                                                                                 \
        case 2:                                                                                    \
            TILE(g, t, R, 2, 2, pf);                                                               \
            break;                                                                                 \
        case 1:                                                                                    \
            TILE(g, t, R, 1, 2, pf);                                                               \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

#define Q45Z_TILE(FIVE, g, t, R, T, S, pf)                                                         \
    q45z_tile(w + (size_t)(g)*nb, sizeof(*w), FIVE, nb, x + (t)*ldx, xd + (t),                     \
              xs + (t) * (ldx / KVF_QK), ldx, y + (size_t)(g)*KVF_Q8G_ROWS + (t)*ldy, ldy, R, T,   \
              S, pf, m)
#define Q4Z_TILE(...) Q45Z_TILE(0, __VA_ARGS__)
#define Q5Z_TILE(...) Q45Z_TILE(1, __VA_ARGS__)
#define Q6Z_TILE(g, t, R, T, S, pf)                                                                \
    q6z_tile(w + (size_t)(g)*nb, nb, x + (t)*ldx, xd + (t), ldx,                                   \
             y + (size_t)(g)*KVF_Q8G_ROWS + (t)*ldy, ldy, R, T, S, pf, m)

VNNI void kvf__q4_rows_vnni(const struct kvf_q4g *w, uint32_t nb, const int16_t *x, const float *xd,
                            const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy,
                            uint32_t r0, uint32_t r1)
{
    KQZ_ROWS(Q4Z_TILE);
}

VNNI void kvf__q5_rows_vnni(const struct kvf_q5g *w, uint32_t nb, const int16_t *x, const float *xd,
                            const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy,
                            uint32_t r0, uint32_t r1)
{
    KQZ_ROWS(Q5Z_TILE);
}

VNNI void kvf__q6_rows_vnni(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                            size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    KQZ_ROWS(Q6Z_TILE);
}

#endif
