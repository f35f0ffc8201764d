/*
 * kernels_q8_x86.c — Q8_0 tiles for the "avx2" and "avx2+vnni" variants, and activation
 * quantization.
 *
 * The Q8_0 per-pair recipe, shared by every tile shape: one 8-lane accumulator; block b adds
 * ((its 8 int32 partial dot products, as floats) × d_w) × d_x, the last step by FMA; then
 * hsum8. (Scaling by d_w then d_x, rather than by the product d_w·d_x, costs one multiply per
 * pair instead of a scalar multiply and a broadcast per pair.)
 *
 * Tiling: rows in blocks of 4 (8 for a single token), tokens in groups of 2 (AVX2) or 4 (VNNI).
 */
#include "kernels_x86.h"

#ifdef KVF_HAVE_X86_KERNELS

/* R rows × T tokens of the Q8_0 recipe. The sign trick makes the int8 × int8 product an
 * unsigned × signed one that maddubs takes: |w| × (x with w's sign). |w| ≤ 128 and |x| ≤ 127,
 * so a pair sum is at most 32512 and never saturates. */
AVX2 INLINE void q8_tile(const struct kvf_block_q8_0 *w, size_t ws,
                         const struct kvf_block_q8_0 *x, size_t ldx, uint32_t nb, float *y,
                         size_t ldy, const int R, const int T)
{
    __m256 acc[8][2];
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m256i xv[2];
        __m256 dx[2];
        for (int t = 0; t < T; t++) {
            xv[t] = _mm256_loadu_si256((const __m256i *)x[t * ldx + b].qs);
            dx[t] = _mm256_set1_ps(h2f(x[t * ldx + b].d));
        }
        for (int r = 0; r < R; r++) {
            const struct kvf_block_q8_0 *wb = &w[r * ws + b];
            _mm_prefetch((const char *)(wb + (size_t)PF_TILES * R * ws), _MM_HINT_T1);
            __m256i wv = _mm256_loadu_si256((const __m256i *)wb->qs);
            __m256i aw = _mm256_sign_epi8(wv, wv);
            __m256 dw = _mm256_set1_ps(h2f(wb->d));
            for (int t = 0; t < T; t++) {
                __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv));
                __m256 q = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(q, dw), dx[t], acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum8(acc[r][t]);
}

AVX2 static void q8_1x1(const struct kvf_block_q8_0 *w, const struct kvf_block_q8_0 *x,
                        uint32_t nb, float *y)
{
    q8_tile(w, 0, x, 0, nb, y, 0, 1, 1);
}
AVX2 static void q8_1x2(const struct kvf_block_q8_0 *w, const struct kvf_block_q8_0 *x,
                        size_t ldx, uint32_t nb, float *y, size_t ldy)
{
    q8_tile(w, 0, x, ldx, nb, y, ldy, 1, 2);
}
AVX2 static void q8_4x1(const struct kvf_block_q8_0 *w, size_t ws,
                        const struct kvf_block_q8_0 *x, uint32_t nb, float *y)
{
    q8_tile(w, ws, x, 0, nb, y, 0, 4, 1);
}
AVX2 static void q8_4x2(const struct kvf_block_q8_0 *w, size_t ws,
                        const struct kvf_block_q8_0 *x, size_t ldx, uint32_t nb, float *y,
                        size_t ldy)
{
    q8_tile(w, ws, x, ldx, nb, y, ldy, 4, 2);
}
AVX2 static void q8_8x1(const struct kvf_block_q8_0 *w, size_t ws,
                        const struct kvf_block_q8_0 *x, uint32_t nb, float *y)
{
    q8_tile(w, ws, x, 0, nb, y, 0, 8, 1);
}

AVX2 void kvf__q8_rows_avx2(const struct kvf_block_q8_0 *w, size_t ws,
                         const struct kvf_block_q8_0 *x, size_t ldx, uint32_t nt, uint32_t nb,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    if (nt == 1) {
        for (; r + 8 <= r1; r += 8) q8_8x1(w + r * ws, ws, x, nb, y + r);
        for (; r < r1; r++) q8_1x1(w + r * ws, x, nb, y + r);
        return;
    }
    for (; r + 4 <= r1; r += 4) {
        uint32_t t = 0;
        for (; t + 2 <= nt; t += 2) q8_4x2(w + r * ws, ws, x + t * ldx, ldx, nb, y + t * ldy + r, ldy);
        for (; t < nt; t++) q8_4x1(w + r * ws, ws, x + t * ldx, nb, y + t * ldy + r);
    }
    for (; r < r1; r++) {
        uint32_t t = 0;
        for (; t + 2 <= nt; t += 2) q8_1x2(w + r * ws, x + t * ldx, ldx, nb, y + t * ldy + r, ldy);
        for (; t < nt; t++) q8_1x1(w + r * ws, x + t * ldx, nb, y + t * ldy + r);
    }
}

/*
 * kvf_quantize_row_q8_0 in vector form, with the same IEEE operations in the same roles: the
 * block's largest |x| (max is exact, so its order does not matter), d = amax / 127 and
 * id = 1 / d in scalar, then x × id rounded to nearest-even (the default rounding mode, as
 * lrintf uses) — so the bytes are the scalar function's, for every input without NaN.
 */
AVX2 void kvf__quant_q8_avx2(const float *x, struct kvf_block_q8_0 *out, uint32_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (uint32_t b = 0; b < n / KVF_QK; b++) {
        const float *p = x + (size_t)b * KVF_QK;
        __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8), v2 = _mm256_loadu_ps(p + 16),
               v3 = _mm256_loadu_ps(p + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 0x55));
        float amax = _mm_cvtss_f32(h);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = kvf_f32_to_fp16(d);
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        /* The packs work within 128-bit lanes; the permute puts the 8 groups of 4 back in order. */
        __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)out[b].qs, _mm256_permutevar8x32_epi32(q, order));
    }
}

/*
 * The same Q8_0 recipe with AVX-512 VNNI on 256-bit registers: vpdpbusd forms the 8 int32
 * partial sums in one instruction per pair, from w + 128 (unsigned, made once per row and
 * block) and x, starting from −128·Σx (made once per token and block, so shared by every row
 * of a tile), where AVX2 needs sign, maddubs and madd. Both give the exact integer sums (no
 * saturation, see above), so this variant's values are the AVX2 variant's, bit for bit.
 *
 * AVX-512VL gives 32 vector registers, so tiles here are larger: 4 rows × up to 4 tokens
 * (16 accumulators) for batches, 8 rows × 1 token for a single token. Each weight row is
 * prefetched PF_TILES tiles ahead (whole rows further on), since rows are short next to the
 * distance memory latency needs. F32 uses the AVX2 recipe with larger tiles (f32v_rows below).
 */

VNNI INLINE void q8v_tile(const struct kvf_block_q8_0 *w, size_t ws,
                          const struct kvf_block_q8_0 *x, size_t ldx, uint32_t nb, float *y,
                          size_t ldy, const int R, const int T, size_t pf)
{
    __m256 acc[8][4];
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m256i xv[4], base[4];
        __m256 dx[4];
        for (int t = 0; t < T; t++) {
            xv[t] = _mm256_loadu_si256((const __m256i *)x[t * ldx + b].qs);
            /* Σ (w + 128)·x = Σ w·x + 128·Σ x: start each sum at −128·Σ x (per lane group of 4
             * bytes, like the products), so what comes out is exactly Σ w·x. */
            base[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, xv[t]));
            dx[t] = bcast_h(&x[t * ldx + b].d);
        }
        for (int r = 0; r < R; r++) {
            const struct kvf_block_q8_0 *wb = &w[r * ws + b];
            _mm_prefetch((const char *)(wb + pf), _MM_HINT_T1);
            /* w + 128 as unsigned bytes (flipping the top bit), for vpdpbusd's u8 operand. */
            __m256i wu = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)wb->qs), bias);
            __m256 dw = bcast_h(&wb->d);
            for (int t = 0; t < T; t++) {
                __m256 q = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(base[t], wu, xv[t]));
                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(q, dw), dx[t], acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[t * ldy + r] = hsum8(acc[r][t]);
}

/* Rows [r, r + R) of W against every token, in groups of 4 then one group of the rest. */
#define Q8V_TOKENS(R)                                                                            \
    do {                                                                                         \
        uint32_t t = 0;                                                                          \
        size_t pf = (size_t)PF_TILES * (R) * ws;                                                 \
        for (; t + 4 <= nt; t += 4)                                                              \
            q8v_tile(w + r * ws, ws, x + t * ldx, ldx, nb, y + t * ldy + r, ldy, R, 4, pf);        \
        switch (nt - t) {                                                                        \
        case 3: q8v_tile(w + r * ws, ws, x + t * ldx, ldx, nb, y + t * ldy + r, ldy, R, 3, pf); break; \
        case 2: q8v_tile(w + r * ws, ws, x + t * ldx, ldx, nb, y + t * ldy + r, ldy, R, 2, pf); break; \
        case 1: q8v_tile(w + r * ws, ws, x + t * ldx, ldx, nb, y + t * ldy + r, ldy, R, 1, pf); break; \
        default: break;                                                                          \
        }                                                                                        \
    } while (0)

#define Q8V_TOKEN_BLOCK 16

VNNI static void q8v_rows_block(const struct kvf_block_q8_0 *w, size_t ws,
                                const struct kvf_block_q8_0 *x, size_t ldx, uint32_t nt,
                                uint32_t nb, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    for (; r + 4 <= r1; r += 4) Q8V_TOKENS(4);
    for (; r < r1; r++) Q8V_TOKENS(1);
}

VNNI void kvf__q8_rows_vnni(const struct kvf_block_q8_0 *w, size_t ws,
                          const struct kvf_block_q8_0 *x, size_t ldx, uint32_t nt, uint32_t nb,
                          float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    uint32_t r = r0;
    if (nt == 1) {
        /* With several threads a call covers one chunk of rows, and the next chunk is likely
         * another thread's: prefetching PF_TILES tiles ahead would then miss this chunk's own
         * rows. A third of the chunk ahead (at least one tile) keeps the prefetches inside it. */
        size_t pf_rows = (r1 - r0) / 3;
        if (pf_rows > (size_t)PF_TILES * 8) pf_rows = (size_t)PF_TILES * 8;
        size_t pf = (pf_rows > 8 ? pf_rows : 8) * ws;
        for (; r + 8 <= r1; r += 8) q8v_tile(w + r * ws, ws, x, 0, nb, y + r, 0, 8, 1, pf);
        for (; r < r1; r++) q8v_tile(w + r * ws, ws, x, 0, nb, y + r, 0, 1, 1, pf);
        return;
    }
    /* Tokens in blocks of Q8V_TOKEN_BLOCK, so the block's activations stay in L1 while every
     * row of [r0, r1) passes over them (the rows, a chunk's share of W, stay in L2). */
    for (uint32_t t0 = 0; t0 < nt; t0 += Q8V_TOKEN_BLOCK) {
        uint32_t tn = nt - t0 < Q8V_TOKEN_BLOCK ? nt - t0 : Q8V_TOKEN_BLOCK;
        q8v_rows_block(w, ws, x + t0 * ldx, ldx, tn, nb, y + t0 * ldy, ldy, r0, r1);
    }
}

#endif
