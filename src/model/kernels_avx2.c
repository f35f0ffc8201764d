/*
 * kernels_avx2.c — AVX2 + FMA + F16C kernels, compiled with target attributes so the rest of
 * the library stays baseline x86-64 and the choice is made at run time.
 *
 * The per-pair recipe, shared by every tile shape:
 *   F32:  one 8-lane accumulator; step i adds w·x of floats [8i, 8i + 8) by FMA; then hsum8 in a
 *         fixed lane order; then the last n % 8 products, in index order, in scalar arithmetic.
 *   Q8_0: one 8-lane accumulator; block b adds ((its 8 int32 partial dot products, as floats)
 *         × d_w) × d_x, the last step by FMA; then hsum8. (Scaling by d_w then d_x, rather than
 *         by the product d_w·d_x, costs one multiply per pair instead of a scalar multiply and a
 *         broadcast per pair.)
 * A tile of R rows × T tokens runs R × T such recipes side by side (independent chains keep the
 * FMA units busy; a weight row loaded once serves T tokens). Nothing is shared between pairs, so
 * every tile shape gives each pair the value the 1 × 1 tile gives, bit for bit.
 *
 * Tiling: rows in blocks of 4 (8 for a single token, where more independent chains are the only
 * way to hide FMA latency); within a block, tokens in groups of 3 (F32) or 2 (Q8_0), which is
 * as many accumulators as the 16 ymm registers hold next to the operands.
 */
#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* How many tiles ahead a tile (of either x86 variant) prefetches its rows, into L2 (hint T1).
 * A decode step streams all weights once and is bound by memory; prefetching far ahead into
 * L2, rather than near into L1, keeps enough lines in flight to reach the read bandwidth of
 * one core (measured: smol135m Q8_0 decode on 1 thread, ~60 -> ~135 tokens/s). A prefetch
 * past the end of the weights is harmless: prefetches never fault. */
#define PF_TILES 16



AVX2 INLINE float hsum8(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);                 /* lanes (0+4, 1+5, 2+6, 3+7) */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));        /* (0+4+2+6, 1+5+3+7, ..) */
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55)); /* all */
    return _mm_cvtss_f32(s);
}

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

AVX2 static void f32_rows(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
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

AVX2 INLINE float h2f(uint16_t h)
{
    return _cvtsh_ss(h);
}

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

AVX2 static void q8_rows(const struct kvf_block_q8_0 *w, size_t ws,
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

AVX2 static float dot(const float *a, const float *b, uint32_t n)
{
    float y;
    f32_tile(a, 0, b, 0, n, &y, 0, 1, 1);
    return y;
}

/* Element i always takes the same path (vector for i < n rounded down to 8, scalar after), so
 * the result for each element does not depend on anything but its inputs. */
AVX2 static void axpy(float *y, float a, const float *x, uint32_t n)
{
    __m256 av = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/*
 * kvf_quantize_row_q8_0 in vector form, with the same IEEE operations in the same roles: the
 * block's largest |x| (max is exact, so its order does not matter), d = amax / 127 and
 * id = 1 / d in scalar, then x × id rounded to nearest-even (the default rounding mode, as
 * lrintf uses) — so the bytes are the scalar function's, for every input without NaN.
 */
AVX2 static void quant_q8(const float *x, struct kvf_block_q8_0 *out, uint32_t n)
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

static const struct kvf_kern kern_avx2 = {"avx2", f32_rows, q8_rows, dot, axpy, quant_q8};
const struct kvf_kern *const kvf__kern_avx2 = &kern_avx2;

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
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

VNNI INLINE __m256 bcast_h(const uint16_t *h)
{
    return _mm256_cvtph_ps(_mm_set1_epi16((short)*h));
}

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

VNNI static void q8v_rows(const struct kvf_block_q8_0 *w, size_t ws,
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

VNNI static void f32v_rows(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
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

static const struct kvf_kern kern_vnni = {"avx2+vnni", f32v_rows, q8v_rows, dot, axpy, quant_q8};
const struct kvf_kern *const kvf__kern_vnni = &kern_vnni;
#else
const struct kvf_kern *const kvf__kern_avx2 = NULL;
const struct kvf_kern *const kvf__kern_vnni = NULL;
#endif
