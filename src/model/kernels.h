/*
 * kernels.h — the compute kernels of the forward pass (internal to src/model).
 *
 * The hot path is the matrix-vector product over a batch: y[t][r] = Σ_i W[r][i] · x[t][i].
 * Batch invariance rests on one rule, which every variant keeps: the value computed for a
 * (row, token) pair is produced by the same sequence of floating-point operations whichever
 * tile shape computed it (1 row × 1 token, 4 rows × 1 token or 1 row × 4 tokens) and whichever
 * thread ran it. Tiles exist only so that a weight row loaded once serves several tokens, or
 * so that several independent rows keep the FMA units busy; they never share or split a sum.
 *
 * A variant ("avx2+vnni", "avx2", "scalar") is chosen once per process by kvf__kernels_init()
 * from the CPU (KVF_KERNELS=avx2 or =scalar asks for a lesser one); the scalar variant rounds
 * differently from the others, so invariance is promised within one variant.
 */
#ifndef KVF_MODEL_KERNELS_H
#define KVF_MODEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kvfence/quant.h"

struct kvf_weight;
struct kvf_attn_batch;

/*
 * A variant computes y[t * ldy + r] = W[r] · x[t] for rows r0 ≤ r < r1 and tokens t < nt, tiling
 * as it likes, under the per-pair rule above.
 */
struct kvf_kern {
    const char *name;
    /* W: rows of n floats at stride ws floats; x: nt rows of n floats at stride ldx. */
    void (*f32_rows)(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                     uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1);
    /* W: rows of nb Q8_0 blocks at stride ws blocks; x likewise at stride ldx blocks. */
    void (*q8_rows)(const struct kvf_block_q8_0 *w, size_t ws, const struct kvf_block_q8_0 *x,
                    size_t ldx, uint32_t nt, uint32_t nb, float *y, size_t ldy, uint32_t r0,
                    uint32_t r1);
    /* Quantizes n floats (n a multiple of 32) to Q8_0 blocks; every variant gives exactly the
     * bytes kvf_quantize_row_q8_0 gives (tested). */
    void (*quant_q8)(const float *x, struct kvf_block_q8_0 *out, uint32_t n);
    /* Attention partials of segment seg of token t of the batch for the query heads [h0, h1),
     * all of one K/V group (attention.h): head h's at part + (h - h0) · part_stride. scores:
     * (h1 - h0) · KVF_ATTN_SCORE_STRIDE floats of this thread's own. */
    void (*attn_seg)(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                     uint32_t seg, float *part, size_t part_stride, float *scores);
    /* g[i] = silu(g[i]) · u[i] for i < n, each element by the same operations wherever the
     * range starts. */
    void (*swiglu)(float *g, const float *u, uint32_t n);
};

/* The chosen variant; valid after kvf__kernels_init(). */
extern const struct kvf_kern *kvf__kern;
void kvf__kernels_init(void);

/* The variants (kernels_scalar.c, kernels_avx2.c); the x86 ones are NULL when the compiler
 * cannot build them. "avx2+vnni" computes Q8_0 with AVX-512 VNNI and gives the same values as
 * "avx2" (its integer sums are exact in both); F32 is the same code in both. */
extern const struct kvf_kern kvf__kern_scalar;
extern const struct kvf_kern *const kvf__kern_avx2;
extern const struct kvf_kern *const kvf__kern_vnni;

/*
 * y[t * ldy + r] = W[r] · x[t] for rows r0 ≤ r < r1 and tokens t < nt. x holds nt rows of
 * W->cols floats at stride ldx; xq (needed when W is Q8_0, else may be NULL) the same rows
 * quantized to Q8_0 at stride ldxq blocks. scratch holds W->cols floats (used for types that
 * are dequantized row by row). Work: (r1 - r0) × nt × cols multiply-adds; W streamed once.
 */
void kvf__matmul(const struct kvf_weight *W, const float *x, size_t ldx,
                 const struct kvf_block_q8_0 *xq, size_t ldxq, uint32_t nt, float *y, size_t ldy,
                 uint32_t r0, uint32_t r1, float *scratch);

/* out = x / rms(x) * w, n elements (sum of squares in double, in index order). */
void kvf__rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);

#endif
