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
 * Activations for Q8_0 weights: each row of n floats becomes n int16 q and ONE float scale d for
 * the whole row, x ≈ q · d, with d = amax / 32767 and q = x · (1 / d) rounded to nearest-even.
 * 16 bits rather than Q8_0's 8 keep the logits within 1e-4 or so of exact activations (8 bits
 * cost 1-2e-2, linear in the step), and one scale per row, not per block, lets the dot product
 * apply it once at the end. Edge cases, identical in every variant: a row with amax below
 * 32767 · FLT_MIN (where 1 / d would overflow) or all zero has d = 0 and q = 0; a row holding
 * any Inf or NaN has d = NaN and q = 0, so every output it reaches is NaN.
 */
struct kvf_act16 {
    int16_t *q; /* (rows, ld) the quantized values */
    float *d;   /* [rows] the scale of each row */
    size_t ld;  /* int16 per row in q (a multiple of 32) */
};

/*
 * A variant computes y[t * ldy + r] = W[r] · x[t] for rows r0 ≤ r < r1 and tokens t < nt, tiling
 * as it likes, under the per-pair rule above.
 */
struct kvf_kern {
    const char *name;
    /* W: rows of n floats at stride ws floats; x: nt rows of n floats at stride ldx. */
    void (*f32_rows)(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt,
                     uint32_t n, float *y, size_t ldy, uint32_t r0, uint32_t r1);
    /* W: rows of nb Q8_0 blocks at stride ws blocks; x: nt activation rows of nb × 32 int16
     * at stride ldx int16 (struct kvf_act16), with one scale per row in xd. */
    void (*q8_rows)(const struct kvf_block_q8_0 *w, size_t ws, const int16_t *x, const float *xd,
                    size_t ldx, uint32_t nt, uint32_t nb, float *y, size_t ldy, uint32_t r0,
                    uint32_t r1);
    /* Quantizes one activation row of n floats (n a multiple of 32) to n int16 and its scale
     * (see struct kvf_act16); every variant gives exactly the scalar variant's bytes (tested). */
    void (*quant_a16)(const float *x, int16_t *q, float *d, uint32_t n);
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
 * quantized to 16 bits. scratch holds W->cols floats (used for types that are dequantized row
 * by row). Work: (r1 - r0) × nt × cols multiply-adds; W streamed once.
 */
void kvf__matmul(const struct kvf_weight *W, const float *x, size_t ldx,
                 const struct kvf_act16 *xq, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                 uint32_t r1, float *scratch);

/* out = x / rms(x) * w, n elements (sum of squares in double, in index order). */
void kvf__rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);

#endif
