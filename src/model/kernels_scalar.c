/*
 * kernels_scalar.c — the portable fallback. Each (row, token) pair is one sequential sum in
 * index order, so it is invariant by construction.
 */
#include "attention.h"
#include "kernels.h"

static float dot_f32(const float *w, const float *x, uint32_t n)
{
    float s = 0.0f;
    for (uint32_t i = 0; i < n; i++) s += w[i] * x[i];
    return s;
}

static void f32_rows(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                     uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t t = 0; t < nt; t++) y[t * ldy + r] = dot_f32(w + r * ws, x + t * ldx, n);
}

static float dot_q8(const struct kvf_block_q8_0 *w, const struct kvf_block_q8_0 *x, uint32_t nb)
{
    float s = 0.0f;
    for (uint32_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        for (int j = 0; j < KVF_QK; j++) sumi += (int32_t)w[b].qs[j] * x[b].qs[j];
        s += (float)sumi * (kvf_fp16_to_f32(w[b].d) * kvf_fp16_to_f32(x[b].d));
    }
    return s;
}

static void q8_rows(const struct kvf_block_q8_0 *w, size_t ws, const struct kvf_block_q8_0 *x,
                    size_t ldx, uint32_t nt, uint32_t nb, float *y, size_t ldy, uint32_t r0,
                    uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t t = 0; t < nt; t++) y[t * ldy + r] = dot_q8(w + r * ws, x + t * ldx, nb);
}

static void quant_q8(const float *x, struct kvf_block_q8_0 *out, uint32_t n)
{
    kvf_quantize_row_q8_0(x, out, n);
}

const struct kvf_kern kvf__kern_scalar = {"scalar", f32_rows, q8_rows, quant_q8,
                                          kvf__attn_seg_scalar, kvf__swiglu_scalar};
