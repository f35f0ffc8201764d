/*
 * kernels_x86.h — what the x86 kernel files share (internal to src/model): the target
 * attributes, small inline helpers, and the functions each file gives the variant tables in
 * kernels_avx2.c. F32 tiles live in kernels_f32_x86.c, Q8_0 tiles and activation quantization
 * in kernels_q8_x86.c; the per-pair recipes they keep are described at the top of each.
 */
#ifndef KVF_MODEL_KERNELS_X86_H
#define KVF_MODEL_KERNELS_X86_H

#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KVF_HAVE_X86_KERNELS 1
#include <immintrin.h>

#define AVX2   __attribute__((target("avx2,fma,f16c")))
#define VNNI   __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define INLINE static inline __attribute__((always_inline))

/* How many tiles ahead a tile (of either x86 variant) prefetches its rows, into L2 (hint T1);
 * Q8_0 tiles take it as the most, and stay inside their chunk (kernels_q8_x86.c).
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

AVX2 INLINE float h2f(uint16_t h)
{
    return _cvtsh_ss(h);
}

VNNI INLINE __m256 bcast_h(const uint16_t *h)
{
    return _mm256_cvtph_ps(_mm_set1_epi16((short)*h));
}

/* kernels_f32_x86.c */
void kvf__f32_rows_avx2(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                        uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1);
void kvf__f32_rows_vnni(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                        uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1);

/* kernels_f32g_x86.c */
void kvf__f32g_rows_avx2(const float *w, uint32_t n, const float *x, size_t ldx, uint32_t nt,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1);
void kvf__f32g_rows_vnni(const float *w, uint32_t n, const float *x, size_t ldx, uint32_t nt,
                         float *y, size_t ldy, uint32_t r0, uint32_t r1);

void kvf__rmsnorm_avx2(float *out, const float *x, const float *w, uint32_t n, float eps);

/* kernels_q8_x86.c */
void kvf__q8_rows_avx2(const struct kvf_q8g *w, uint32_t nb, const int16_t *x, const float *xd,
                       size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1);
void kvf__q8_rows_vnni(const struct kvf_q8g *w, uint32_t nb, const int16_t *x, const float *xd,
                       size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1);
void kvf__q8m_rows_avx2(const struct kvf_q8mg *w, uint32_t nb, const int16_t *x, const float *xd,
                        const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                        uint32_t r1);
void kvf__q8m_rows_vnni(const struct kvf_q8mg *w, uint32_t nb, const int16_t *x, const float *xd,
                        const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                        uint32_t r1);
void kvf__f16_row_avx2(const float *x, uint16_t *h, uint32_t n);
void kvf__quant_a16_avx2(const float *x, int16_t *q, float *d, float *s, uint32_t n);

/* kernels_kq_x86.c */
void kvf__q4_rows_avx2(const struct kvf_q4g *w, uint32_t nb, const int16_t *x, const float *xd,
                       const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                       uint32_t r1);
void kvf__q5_rows_avx2(const struct kvf_q5g *w, uint32_t nb, const int16_t *x, const float *xd,
                       const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                       uint32_t r1);
void kvf__q6_rows_avx2(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                       size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1);
void kvf__q4_rows_vnni(const struct kvf_q4g *w, uint32_t nb, const int16_t *x, const float *xd,
                       const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                       uint32_t r1);
void kvf__q5_rows_vnni(const struct kvf_q5g *w, uint32_t nb, const int16_t *x, const float *xd,
                       const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                       uint32_t r1);
void kvf__q6_rows_vnni(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                       size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1);

#endif
#endif
