/*
 * attention_x86.c — the AVX2 attention and SwiGLU kernels (both x86 variants use them).
 *
 * The partial of one segment (attention.h) for the query heads [h0, h1) of one K/V group of
 * one token, in three passes over the segment's positions (K/V elements are floats or IEEE
 * halves, as the pool's geometry says; a half is converted to a float, exactly, as it is
 * loaded, so both give the same operations on the same values):
 *
 *   1. scores: positions 8 at a time; the 8 K rows are read once for every head of the group,
 *      and for each head one 8-lane FMA accumulator per position runs over head_dim in steps
 *      of 8, then the 8 accumulators are reduced together into one vector of 8 scores
 *      (hsum8x8: the same add tree for every lane), times 1/√hd.
 *   2. per head: m = the max score (exact, so its order does not matter), e_p = exp(s_p − m) by
 *      the vector exp, l = Σ e_p as one 8-lane sum in position order then hsum8.
 *   3. per head: acc = Σ_p e_p · v_p as head_dim / 8 vector accumulators (at most 8 at a time,
 *      so they stay in registers) taking one FMA per position in position order.
 *
 * Every value belongs to one (head, position) or one (head, element) and is made by the same
 * operations whichever positions share its vector of 8 and whichever heads share the call:
 * lanes past the segment's end hold copies of an earlier row's score, never mixed with real
 * ones (they are dropped from the max and zeroed before the sum). Only head_dim and the
 * segment's length shape the sequence of operations. head_dim not a multiple of 8 goes to the
 * scalar kernel, every time, so that too is fixed per model.
 */
#include "attention.h"
#include "kernels_x86.h"

#ifdef KVF_HAVE_X86_KERNELS

/* Positions per run of the V pass: V_RUN rows of head_dim floats (16 KiB at head_dim 64). */
#define V_RUN 64

/* kvf__expf (attention.h), lane by lane, with the same operations in the same order. */
AVX2 INLINE __m256 exp8(__m256 x)
{
    __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(KVF_EXP_LO)); /* x > LO ? x : LO */
    xc = _mm256_min_ps(xc, _mm256_set1_ps(KVF_EXP_HI));       /* xc < HI ? xc : HI */
    __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(KVF_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-KVF_EXP_LN2_HI), xc);
    r = _mm256_fmadd_ps(k, _mm256_set1_ps(-KVF_EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(KVF_EXP_C7), r, _mm256_set1_ps(KVF_EXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KVF_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KVF_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KVF_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KVF_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i ki = _mm256_cvtps_epi32(k);
    __m256i k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); /* NaN stays NaN */
}

AVX2 void kvf__exp_avx2(float *y, const float *x, uint32_t n)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] = kvf__expf(x[i]);
}

/* Lane j = the sum of a_j's 8 lanes, ((0+1) + (2+3)) + ((4+5) + (6+7)), for every j. */
AVX2 INLINE __m256 hsum8x8(const __m256 a[8])
{
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 h03 = _mm256_hadd_ps(h01, h23), h47 = _mm256_hadd_ps(h45, h67);
    /* h03: (a0 lanes 0-3, a1 0-3, a2 0-3, a3 0-3 | the same of lanes 4-7); h47 likewise. */
    __m256 lo = _mm256_permute2f128_ps(h03, h47, 0x20), hi = _mm256_permute2f128_ps(h03, h47, 0x31);
    return _mm256_add_ps(lo, hi);
}

/* 8 elements of a K/V row from element e: floats, or halves converted (exactly) to floats. */
AVX2 INLINE __m256 load_kv8(const void *row, size_t e, const int F16)
{
    if (F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e)));
    return _mm256_loadu_ps((const float *)row + e);
}

/* q[h] · k[j] for H query heads (h < H, H ≤ 3) and the 8 rows k[0..8) of nc × 8 elements,
 * into d[h]: lane i of row j's accumulator takes q[h][8c+i] · k_j[8c+i] over c in order, then
 * the 8 accumulators are reduced together (hsum8x8), so d[h] does not depend on H. Each K chunk
 * is loaded once for the H heads; with H = 3 the 24 accumulators need the 32 vector registers
 * of AVX-512 (the "avx2+vnni" variant), the AVX2 one takes H = 1. */
AVX2 INLINE void dotH8x8(const float *const *q, const void *const k[8], uint32_t nc, const int H,
                         const int F16, __m256 *d)
{
    __m256 acc[3][8];
    for (int h = 0; h < H; h++)
        for (int j = 0; j < 8; j++)
            acc[h][j] = _mm256_setzero_ps();
    for (uint32_t c = 0; c < nc; c++) {
        __m256 qv[3];
        for (int h = 0; h < H; h++)
            qv[h] = _mm256_loadu_ps(q[h] + 8 * c);
        for (int j = 0; j < 8; j++) {
            __m256 kv = load_kv8(k[j], 8 * c, F16);
            for (int h = 0; h < H; h++)
                acc[h][j] = _mm256_fmadd_ps(qv[h], kv, acc[h][j]);
        }
    }
    for (int h = 0; h < H; h++)
        d[h] = hsum8x8(acc[h]);
}

/* The scores of query heads [h, h + hb) (hb ≤ HB ≤ 3) of one token (its query at q) against the
 * 8 K rows k8: dotH8x8 times scale, head h + x's vector of 8 at sc + x · KVF_ATTN_SCORE_STRIDE;
 * one step of the prefetch queue per head. */
AVX2 INLINE void score_heads(const float *q, const void *const k8[8], uint32_t h, uint32_t hb,
                             uint32_t hd, __m256 scale, float *sc, struct kvf_attn_pf *pf,
                             const int F16, const int HB)
{
    const float *qh[3];
    __m256 d[3];
    uint32_t nc = hd / 8;
    for (uint32_t x = 0; x < hb; x++) {
        kvf__attn_pf_step(pf);
        qh[x] = q + (size_t)(h + x) * hd;
    }
    if (HB >= 3 && hb == 3)
        dotH8x8(qh, k8, nc, 3, F16, d);
    else if (HB >= 2 && hb == 2)
        dotH8x8(qh, k8, nc, 2, F16, d);
    else
        dotH8x8(qh, k8, nc, 1, F16, d);
    for (uint32_t x = 0; x < hb; x++)
        _mm256_storeu_ps(sc + x * KVF_ATTN_SCORE_STRIDE, _mm256_mul_ps(d[x], scale));
}

/* out[0 .. 8·NV) (+)= Σ_j w[j] · rows[j][col .. col + 8·NV) over j < m, in j order; from zero
 * when first is set, else from out. NV is a constant at every call, so the accumulators live
 * in registers. */
AVX2 INLINE void wsum_cols(float *out, const float *w, const void *const *rows, size_t col,
                           uint32_t m, int first, const int NV, const int F16)
{
    __m256 acc[8];
    for (int c = 0; c < NV; c++)
        acc[c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + 8 * c);
    for (uint32_t j = 0; j < m; j++) {
        __m256 wj = _mm256_broadcast_ss(w + j);
        for (int c = 0; c < NV; c++)
            acc[c] = _mm256_fmadd_ps(wj, load_kv8(rows[j], col + 8 * c, F16), acc[c]);
    }
    for (int c = 0; c < NV; c++)
        _mm256_storeu_ps(out + 8 * c, acc[c]);
}

/* wsum_cols over the nc vectors of a row from element e0, 8 vectors (64 elements) at a time. */
AVX2 INLINE void wsum(float *out, const float *w, const void *const *rows, size_t e0, uint32_t m,
                      int first, uint32_t nc, const int F16)
{
    for (uint32_t c0 = 0; c0 < nc; c0 += 8) {
        float *o = out + 8 * (size_t)c0;
        size_t col = e0 + 8 * (size_t)c0;
        switch (nc - c0 < 8 ? nc - c0 : 8) {
        case 1:
            wsum_cols(o, w, rows, col, m, first, 1, F16);
            break;
        case 2:
            wsum_cols(o, w, rows, col, m, first, 2, F16);
            break;
        case 3:
            wsum_cols(o, w, rows, col, m, first, 3, F16);
            break;
        case 4:
            wsum_cols(o, w, rows, col, m, first, 4, F16);
            break;
        case 5:
            wsum_cols(o, w, rows, col, m, first, 5, F16);
            break;
        case 6:
            wsum_cols(o, w, rows, col, m, first, 6, F16);
            break;
        case 7:
            wsum_cols(o, w, rows, col, m, first, 7, F16);
            break;
        default:
            wsum_cols(o, w, rows, col, m, first, 8, F16);
            break;
        }
    }
}

/* *mx = the max of sc[0..n), then sc[p] = exp(sc[p] − max) for p < n rounded up to 8 (lanes
 * past n set to 0); returns Σ e_p. sc holds floats up to n rounded up to 8, NaN or not. */
AVX2 static float softmax_row(float *sc, uint32_t n, float *mx_out)
{
    uint32_t n8 = n & ~7u;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (uint32_t i = 0; i < n8; i += 8)
        mv = _mm256_max_ps(_mm256_loadu_ps(sc + i), mv);
    float lanes[8], mx;
    _mm256_storeu_ps(lanes, mv);
    mx = lanes[0];
    for (int l = 1; l < 8; l++)
        mx = lanes[l] > mx ? lanes[l] : mx;
    for (uint32_t i = n8; i < n; i++)
        mx = sc[i] > mx ? sc[i] : mx;
    /* A NaN score may or may not win the max; either way its own exp, and the sum, are NaN. */
    __m256 mxv = _mm256_set1_ps(mx), sum = _mm256_setzero_ps();
    for (uint32_t i = 0; i < n8; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + i), mxv));
        _mm256_storeu_ps(sc + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (n8 < n) {
        __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - n8)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + n8), mxv));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(live));
        _mm256_storeu_ps(sc + n8, e);
        sum = _mm256_add_ps(sum, e);
    }
    *mx_out = mx;
    return hsum8(sum);
}

/* 16 elements of a K/V row from element e, as floats (halves converted exactly). */
VNNI INLINE __m512 load_kv16(const void *row, size_t e, const int F16)
{
    if (F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + e)));
    return _mm512_loadu_ps((const float *)row + e);
}

/* wsum_cols for H heads at once (out[h], weights w[h]) on 512-bit vectors: NZ pairs of
 * 8-element chunks in 16-lane accumulators, then NY (0 or 1) chunk of 8; each V chunk is loaded
 * (and converted) once for the H heads. A lane is one (head, element) and takes the FMAs
 * wsum_cols gives it, in the same order (w[h][j] · v_j[e] into acc, j ascending), so the sums
 * are wsum_cols's bit for bit, with a sixth of the loads and half the FMAs. H · NZ ≤ 12. */
VNNI INLINE void wsumZ_cols(float *const *out, const float *const *w, const void *const *rows,
                            size_t e0, size_t col, uint32_t m, int first, const int H, const int NZ,
                            const int NY, const int F16)
{
    __m512 acc[3][4];
    __m256 accy[3];
    for (int h = 0; h < H; h++) {
        for (int z = 0; z < NZ; z++)
            acc[h][z] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out[h] + col + 16 * z);
        if (NY) accy[h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out[h] + col + 16 * NZ);
    }
    for (uint32_t j = 0; j < m; j++) {
        __m512 wj[3];
        for (int h = 0; h < H; h++)
            wj[h] = _mm512_set1_ps(w[h][j]);
        for (int z = 0; z < NZ; z++) {
            __m512 vv = load_kv16(rows[j], e0 + col + 16 * z, F16);
            for (int h = 0; h < H; h++)
                acc[h][z] = _mm512_fmadd_ps(wj[h], vv, acc[h][z]);
        }
        if (NY) {
            __m256 vv = load_kv8(rows[j], e0 + col + 16 * NZ, F16);
            for (int h = 0; h < H; h++)
                accy[h] = _mm256_fmadd_ps(_mm512_castps512_ps256(wj[h]), vv, accy[h]);
        }
    }
    for (int h = 0; h < H; h++) {
        for (int z = 0; z < NZ; z++)
            _mm512_storeu_ps(out[h] + col + 16 * z, acc[h][z]);
        if (NY) _mm256_storeu_ps(out[h] + col + 16 * NZ, accy[h]);
    }
}

#define WSUMZ_CASES(H, F16)                                                                        \
    switch (nc - c0 < 8 ? nc - c0 : 8) {                                                           \
    case 1:                                                                                        \
        wsumZ_cols(out, w, rows, e0, col, m, first, H, 0, 1, F16);                                 \
        break;                                                                                     \
    case 2:                                                                                        \
        wsumZ_cols(out, w, rows, e0, col, m, first, H, 1, 0, F16);                                 \
        break;                                                                                     \
    case 3:                                                                                        \
        wsumZ_cols(out, w, rows, e0, col, m, first, H, 1, 1, F16);                                 \
        break;                                                                                     \
    case 4:                                                                                        \
        wsumZ_cols(out, w, rows, e0, col, m, first, H, 2, 0, F16);                                 \
        break;                                                                                     \
    case 5:                                                                                        \
        wsumZ_cols(out, w, rows, e0, col, m, first, H, 2, 1, F16);                                 \
        break;                                                                                     \
    case 6:                                                                                        \
        wsumZ_cols(out, w, rows, e0, col, m, first, H, 3, 0, F16);                                 \
        break;                                                                                     \
    case 7:                                                                                        \
        wsumZ_cols(out, w, rows, e0, col, m, first, H, 3, 1, F16);                                 \
        break;                                                                                     \
    default:                                                                                       \
        wsumZ_cols(out, w, rows, e0, col, m, first, H, 4, 0, F16);                                 \
        break;                                                                                     \
    }

/* The V pass of H (1 to 3) heads over m positions, for the "avx2+vnni" variant: wsum's values
 * for each head. A call, not inlined, so that the AVX2 kernel body (attn_segs) can reach it. */
VNNI static void wsumZ(float *const *out, const float *const *w, const void *const *rows, size_t e0,
                       uint32_t m, int first, uint32_t nc, uint32_t H, int F16)
{
    for (uint32_t c0 = 0; c0 < nc; c0 += 8) {
        size_t col = 8 * (size_t)c0;
        if (F16) {
            if (H == 3)
                WSUMZ_CASES(3, 1)
            else if (H == 2)
                WSUMZ_CASES(2, 1)
            else
                WSUMZ_CASES(1, 1)
        } else {
            if (H == 3)
                WSUMZ_CASES(3, 0)
            else if (H == 2)
                WSUMZ_CASES(2, 0)
            else
                WSUMZ_CASES(1, 0)
        }
    }
}

/* Asks for every line of n rows of row_bytes at once. A segment's rows lie in several pages,
 * one head's part of every slot, so the hardware prefetcher, which follows one stride, finds
 * few of them; asked for together, their misses overlap instead of coming one row at a time. */
AVX2 INLINE void prefetch_rows(const void *const *rows, uint32_t n, size_t row_bytes,
                               const int hint)
{
    for (uint32_t j = 0; j < n; j++)
        for (size_t e = 0; e < row_bytes; e += 64) {
            if (hint == _MM_HINT_T0)
                _mm_prefetch((const char *)rows[j] + e, _MM_HINT_T0);
            else
                _mm_prefetch((const char *)rows[j] + e, _MM_HINT_T1);
        }
}

/*
 * The partials of segment seg for the query heads [h0, h1) of one K/V group, for the nb tokens
 * t0 .. t0 + nb - 1 of one sequence at consecutive positions (a prefill chunk's), or for one
 * token; tokens whose positions do not reach the segment are skipped, their partials left as
 * they were. Token u's head h at part + u · tok_stride + (h - h0) · part_stride, its scores at
 * scores + (u · (h1 - h0) + h - h0) · KVF_ATTN_SCORE_STRIDE. The tokens take turns by blocks
 * of 8 positions in the score pass and by runs of V_RUN in the V pass, so a K or V row read
 * for the first is still in L1 for the others; each (token, head) gets exactly the operations
 * it gets alone (the same rows, clamped at its own segment end, the same sums in the same
 * order). O(nb · (h1 - h0) · KVF_ATTN_SEG · head_dim); the segment's K and V rows (32 KiB
 * each at head_dim 64) are fetched from memory once for all heads and tokens.
 */
AVX2 INLINE void attn_segs(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                           uint32_t h1, uint32_t seg, float *part, size_t part_stride,
                           size_t tok_stride, float *scores, struct kvf_attn_pf *pf, const int F16,
                           const int HB)
{
    uint32_t hd = b->head_dim;
    const void *rows[KVF_ATTN_SEG], *vrows[KVF_ATTN_SEG];
    uint32_t nc = hd / 8, group = b->n_heads / b->n_kv_heads, kvh = h0 / group, nh = h1 - h0;
    const struct kvf_fwd_seq *s = &b->seqs[b->tok_seq[t0]];
    uint32_t p0 = seg * KVF_ATTN_SEG, n = kvf__attn_seg_len(b, t0 + nb - 1, seg);
    __m256 scale = _mm256_set1_ps(1.0f / sqrtf((float)hd));

    kvf__attn_rows(b, s, b->k_off, kvh, p0, n, rows);
    kvf__attn_rows(b, s, b->v_off, kvh, p0, n, vrows);
    /* Only in a decode step: a prefill chunk's tokens find their sequence's rows in cache,
     * where asking again cost a fifth of the attention time (s15m, prompt 128). */
    if (nb == 1 && kvf__attn_tok_alone(b, t0)) {
        prefetch_rows(rows, n, (size_t)hd * b->elem_bytes, _MM_HINT_T0);
        prefetch_rows(vrows, n, (size_t)hd * b->elem_bytes, _MM_HINT_T1);
    }
    for (uint32_t j0 = 0; j0 < n; j0 += 8)
        for (uint32_t u = 0; u < nb; u++) {
            uint32_t nu = kvf__attn_seg_len(b, t0 + u, seg);
            if (j0 >= nu) continue;
            const float *q = b->q + (size_t)(t0 + u) * b->n_heads * hd;
            const void *k8[8];
            for (uint32_t j = 0; j < 8; j++)
                k8[j] = rows[j0 + j < nu ? j0 + j : j0];
            for (uint32_t h = h0; h < h1; h += HB)
                score_heads(q, k8, h, h1 - h < (uint32_t)HB ? h1 - h : (uint32_t)HB, hd, scale,
                            scores + (u * nh + h - h0) * KVF_ATTN_SCORE_STRIDE + j0, pf, F16, HB);
        }
    for (uint32_t u = 0; u < nb; u++) {
        uint32_t nu = kvf__attn_seg_len(b, t0 + u, seg);
        if (nu == 0) continue;
        for (uint32_t h = h0; h < h1; h++) {
            float *sc = scores + (u * nh + h - h0) * KVF_ATTN_SCORE_STRIDE;
            float *acc = part + u * tok_stride + (h - h0) * part_stride;
            acc[hd + 1] = softmax_row(sc, nu, &acc[hd]);
        }
    }
    /* V in runs of V_RUN positions, every head of every token over a run before the next, so
     * that the run's rows are still in L1 for the others. Storing and reloading the
     * accumulators between runs is exact: runs do not change the values. */
    for (uint32_t j0 = 0; j0 < n; j0 += V_RUN)
        for (uint32_t u = 0; u < nb; u++) {
            uint32_t nu = kvf__attn_seg_len(b, t0 + u, seg);
            if (j0 >= nu) continue;
            uint32_t m = nu - j0 < V_RUN ? nu - j0 : V_RUN;
            for (uint32_t h = h0; h < h1; h += HB) {
                uint32_t hb = h1 - h < (uint32_t)HB ? h1 - h : (uint32_t)HB;
                float *out[3];
                const float *w[3];
                for (uint32_t x = 0; x < hb; x++) {
                    out[x] = part + u * tok_stride + (h + x - h0) * part_stride;
                    w[x] = scores + (u * nh + h + x - h0) * KVF_ATTN_SCORE_STRIDE + j0;
                }
                if (HB > 1)
                    wsumZ(out, w, vrows + j0, 0, m, j0 == 0, nc, hb, F16);
                else
                    wsum(out[0], w[0], vrows + j0, 0, m, j0 == 0, nc, F16);
            }
        }
}

/*
 * The partials of segment seg of a decode token t for every query head (head h's at
 * part + h · part_stride, its scores at scores + h · KVF_ATTN_SCORE_STRIDE): attn_segs for one
 * token, each K/V group in turn, with the same operations for every (head, position) — so the
 * same bits — but the segment's row pointers found once for all groups (a head's row is its
 * slot's row plus kvh · head_dim elements), and each block of 8 positions taken for all groups
 * at once, so a slot is read whole while it is in L1.
 */
AVX2 INLINE void attn_tok(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                          size_t part_stride, float *scores, struct kvf_attn_pf *pf, const int F16,
                          const int HB)
{
    uint32_t hd = b->head_dim, nc = hd / 8, n_kv = b->n_kv_heads, group = b->n_heads / n_kv;
    const void *rows[KVF_ATTN_SEG], *vrows[KVF_ATTN_SEG];
    const struct kvf_fwd_seq *s = &b->seqs[b->tok_seq[t]];
    uint32_t p0 = seg * KVF_ATTN_SEG, n = kvf__attn_seg_len(b, t, seg);
    size_t head_bytes = (size_t)hd * b->elem_bytes, slot_bytes = n_kv * head_bytes;
    const float *q = b->q + (size_t)t * b->n_heads * hd;
    __m256 scale = _mm256_set1_ps(1.0f / sqrtf((float)hd));

    kvf__attn_rows(b, s, b->k_off, 0, p0, n, rows);
    kvf__attn_rows(b, s, b->v_off, 0, p0, n, vrows);
    prefetch_rows(rows, n < 16 ? n : 16, slot_bytes, _MM_HINT_T0); /* whole slots */
    for (uint32_t j0 = 0; j0 < n; j0 += 8) {
        if (j0 + 16 < n)
            prefetch_rows(rows + j0 + 16, n - j0 - 16 < 8 ? n - j0 - 16 : 8, slot_bytes,
                          _MM_HINT_T0);
        const uint8_t *k8[8];
        for (uint32_t j = 0; j < 8; j++)
            k8[j] = rows[j0 + j < n ? j0 + j : j0];
        for (uint32_t kvh = 0; kvh < n_kv; kvh++) {
            const void *kk[8];
            for (uint32_t j = 0; j < 8; j++)
                kk[j] = k8[j] + kvh * head_bytes;
            for (uint32_t h = kvh * group, h1 = (kvh + 1) * group; h < h1; h += HB)
                score_heads(q, kk, h, h1 - h < (uint32_t)HB ? h1 - h : (uint32_t)HB, hd, scale,
                            scores + h * KVF_ATTN_SCORE_STRIDE + j0, pf, F16, HB);
        }
    }
    for (uint32_t h = 0; h < b->n_heads; h++) {
        float *acc = part + h * part_stride;
        acc[hd + 1] = softmax_row(scores + h * KVF_ATTN_SCORE_STRIDE, n, &acc[hd]);
    }
    for (uint32_t j0 = 0; j0 < n; j0 += V_RUN) {
        uint32_t m = n - j0 < V_RUN ? n - j0 : V_RUN;
        for (uint32_t kvh = 0; kvh < n_kv; kvh++)
            for (uint32_t h = kvh * group; h < (kvh + 1) * group; h += HB) {
                uint32_t hb =
                    (kvh + 1) * group - h < (uint32_t)HB ? (kvh + 1) * group - h : (uint32_t)HB;
                float *out[3];
                const float *w[3];
                for (uint32_t x = 0; x < hb; x++) {
                    out[x] = part + (h + x) * part_stride;
                    w[x] = scores + (h + x) * KVF_ATTN_SCORE_STRIDE + j0;
                }
                if (HB > 1)
                    wsumZ(out, w, vrows + j0, (size_t)kvh * hd, m, j0 == 0, nc, hb, F16);
                else
                    wsum(out[0], w[0], vrows + j0, (size_t)kvh * hd, m, j0 == 0, nc, F16);
            }
    }
}

/* The entry points' bodies, HB heads at a time: the scalar kernels for a head_dim that is not
 * a multiple of 8, else attn_segs for the pool's element size. */
AVX2 INLINE void seg_entry(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                           uint32_t seg, float *part, size_t part_stride, float *scores,
                           struct kvf_attn_pf *pf, const int HB)
{
    if (b->head_dim % 8 != 0)
        kvf__attn_seg_scalar(b, t, h0, h1, seg, part, part_stride, scores, pf);
    else if (b->elem_bytes == 2)
        attn_segs(b, t, 1, h0, h1, seg, part, part_stride, 0, scores, pf, 1, HB);
    else
        attn_segs(b, t, 1, h0, h1, seg, part, part_stride, 0, scores, pf, 0, HB);
}

AVX2 INLINE void segs_entry(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                            uint32_t h1, uint32_t seg, float *part, size_t part_stride,
                            size_t tok_stride, float *scores, const int HB)
{
    if (NEVER(!kvf__attn_run_ok(b, t0, nb))) return;
    if (b->head_dim % 8 != 0)
        kvf__attn_segs_scalar(b, t0, nb, h0, h1, seg, part, part_stride, tok_stride, scores);
    else if (b->elem_bytes == 2)
        attn_segs(b, t0, nb, h0, h1, seg, part, part_stride, tok_stride, scores, NULL, 1, HB);
    else
        attn_segs(b, t0, nb, h0, h1, seg, part, part_stride, tok_stride, scores, NULL, 0, HB);
}

AVX2 void kvf__attn_seg_avx2(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                             uint32_t seg, float *part, size_t part_stride, float *scores,
                             struct kvf_attn_pf *pf)
{
    seg_entry(b, t, h0, h1, seg, part, part_stride, scores, pf, 1);
}

AVX2 void kvf__attn_segs_avx2(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                              uint32_t h1, uint32_t seg, float *part, size_t part_stride,
                              size_t tok_stride, float *scores)
{
    segs_entry(b, t0, nb, h0, h1, seg, part, part_stride, tok_stride, scores, 1);
}

/* The same kernels with up to three query heads of a group at a time (dotH8x8 with H = 3, wsumZ):
 * one load of each K and V chunk serves them all, where one head at a time loads it once per head,
 * and the V pass runs on 512-bit vectors. The values are the AVX2 kernels' bit for bit (tested);
 * the score pass's 24 accumulators need the 32 registers that AVX-512 (here with VL) gives 256-bit
 * vectors. (Its 512-bit form — two heads in the halves of each accumulator, the same reduction tree
 * per half — was tried: no faster, 4-7% slower with halves.) */
VNNI void kvf__attn_seg_vnni(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                             uint32_t seg, float *part, size_t part_stride, float *scores,
                             struct kvf_attn_pf *pf)
{
    seg_entry(b, t, h0, h1, seg, part, part_stride, scores, pf, 3);
}

AVX2 INLINE void tok_entry(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                           size_t part_stride, float *scores, struct kvf_attn_pf *pf, const int HB)
{
    if (b->head_dim % 8 != 0) {
        uint32_t group = b->n_heads / b->n_kv_heads;
        for (uint32_t h = 0; h < b->n_heads; h += group)
            kvf__attn_seg_scalar(b, t, h, h + group, seg, part + h * part_stride, part_stride,
                                 scores, pf);
    } else if (b->elem_bytes == 2) {
        attn_tok(b, t, seg, part, part_stride, scores, pf, 1, HB);
    } else {
        attn_tok(b, t, seg, part, part_stride, scores, pf, 0, HB);
    }
}

AVX2 void kvf__attn_tok_avx2(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                             size_t part_stride, float *scores, struct kvf_attn_pf *pf)
{
    tok_entry(b, t, seg, part, part_stride, scores, pf, 1);
}

VNNI void kvf__attn_tok_vnni(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                             size_t part_stride, float *scores, struct kvf_attn_pf *pf)
{
    tok_entry(b, t, seg, part, part_stride, scores, pf, 3);
}

VNNI void kvf__attn_segs_vnni(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                              uint32_t h1, uint32_t seg, float *part, size_t part_stride,
                              size_t tok_stride, float *scores)
{
    segs_entry(b, t0, nb, h0, h1, seg, part, part_stride, tok_stride, scores, 3);
}

/* silu(g) · u as kvf__swiglu1 computes it: vectors of 8 from the start of the range, then the
 * scalar form for the rest, which gives what a vector lane would (kvf__expf). */
AVX2 void kvf__swiglu_avx2(float *g, const float *u, uint32_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_xor_ps(gv, sign));
        _mm256_storeu_ps(
            g + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = kvf__swiglu1(g[i], u[i]);
}

/* exp8 on 16 lanes: the same operations lane by lane (vrndscaleps to nearest is vroundps's
 * rounding, the NaN test a mask), so each lane gives kvf__expf's bits. */
VNNI INLINE __m512 exp16(__m512 x)
{
    __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(KVF_EXP_LO));
    xc = _mm512_min_ps(xc, _mm512_set1_ps(KVF_EXP_HI));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(KVF_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-KVF_EXP_LN2_HI), xc);
    r = _mm512_fmadd_ps(k, _mm512_set1_ps(-KVF_EXP_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(KVF_EXP_C7), r, _mm512_set1_ps(KVF_EXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KVF_EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KVF_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KVF_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KVF_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i ki = _mm512_cvtps_epi32(k);
    __m512i k1 = _mm512_srai_epi32(ki, 1), k2 = _mm512_sub_epi32(ki, k1);
    __m512i bias = _mm512_set1_epi32(127);
    __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23));
    __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

/* kvf__swiglu_avx2 16 lanes at a time, then its own 8-lane and scalar steps for the rest: every
 * element the scalar form's value (tested against it from every start offset). */
VNNI void kvf__swiglu_vnni(float *g, const float *u, uint32_t n)
{
    const __m512 sign = _mm512_set1_ps(-0.0f), one = _mm512_set1_ps(1.0f);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = exp16(_mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(gv), _mm512_castps_si512(sign))));
        _mm512_storeu_ps(
            g + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
    kvf__swiglu_avx2(g + i, u + i, n - i);
}

#endif
