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

#include "kvfence/gguf.h"

struct kvf_weight;
struct kvf_attn_batch;
struct kvf_attn_pf;

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
    float *s; /* (rows, ld / 32) each 32-value block's Σ q: an exact integer (|Σ| ≤ 2^20), which
               * the 4- and 5-bit products multiply by a row's offset (kernels below) */
    size_t ld; /* int16 per row in q (a multiple of 32) */
};

/*
 * Q8_0 weights as the kernels read them: repacked once at load (kvf__q8g_pack) into groups of
 * KVF_Q8G_ROWS rows, so that one vector lane holds one row. Group g's block b (columns
 * 32b..32b+31 of rows 16g..16g+15) is one struct kvf_q8g: the 16 rows' fp16 scales, then their
 * weights by column pair: qs[32 p + 2 r + k] is row r's weight in column 32b + 2p + k. A
 * 32-byte run qs[32 p .. 32 p + 31] is "pair p of all 16 rows": widened to int16 it is one
 * 512-bit operand whose 32-bit lane r multiplies row r's pair against a token's pair of
 * activations broadcast to every lane (vpdpwssd), so a tile needs no horizontal sum. The
 * groups of a weight follow each other (group g at g · nb blocks), so a chunk of rows is one
 * sequential stream. Rows past the last full group are padded with zero weights and scales.
 */
#define KVF_Q8G_ROWS 16
struct kvf_q8g {
    uint16_t d[KVF_Q8G_ROWS];         /* each row's fp16 block scale */
    int8_t qs[KVF_Q8G_ROWS * KVF_QK]; /* qs[32 p + 2 r + k] = row r, column 2p + k */
};

/* Blocks a packed weight of rows × (nb · 32) takes: ceil(rows / 16) groups of nb blocks. */
static inline size_t kvf__q8g_blocks(uint32_t rows, uint32_t nb)
{
    return (size_t)((rows + KVF_Q8G_ROWS - 1) / KVF_Q8G_ROWS) * nb;
}

/* Repacks rows × nb Q8_0 blocks (row r at src + r · nb) into dst (kvf__q8g_blocks of them). */
void kvf__q8g_pack(const struct kvf_block_q8_0 *src, uint32_t rows, uint32_t nb,
                   struct kvf_q8g *dst);

/* Repacks rows × nb Q5_0 blocks into the Q8_0 layout (kvf__q8g_blocks of them): a Q5_0 value
 * is d · (q − 16) with q in 0..31, so its quant less 16 is an int8 weight and its fp16 d the
 * block scale, and the Q8_0 kernels and recipe run it unchanged. 8.5 bits a weight where
 * struct kvf_q5g takes 7, for the Q8_0 tiles' speed: Q5_0 is what llama.cpp's Q4_K_M puts in
 * most matrices whose rows are not whole super-blocks (SmolLM2-135M's all but ffn_down), and
 * the 5-bit tiles run 13% slower than Q8_0's in a batch (smol135m's shapes, 16 tokens). */
void kvf__q5_0_q8g_pack(const struct kvf_block_q5_0 *src, uint32_t rows, uint32_t nb,
                        struct kvf_q8g *dst);

/*
 * Q5_1 weights as the kernels read them (kvf__q5_1_q8mg_pack): Q8_0's layout with a minimum. A
 * Q5_1 value is d · q + m with q in 0..31, so the quant itself is an int8 weight, and a block's
 * product is the Q8_0 tiles' exact integer Σ q·x times d, plus m times the activations' block
 * sum (struct kvf_act16) — the Q4 recipe below with a = d, b = m, on Q8_0's pair order. Both
 * halves are kept as the file's fp16 bits. 576 bytes (9 cache lines) per 512 weights: 9 bits a
 * weight against the 7 of struct kvf_q5g, for the Q8_0 tiles' speed in a batch (Q5_1 is what
 * llama.cpp's Q5_K_M puts in every matrix whose rows are not whole super-blocks).
 */
struct kvf_q8mg {
    uint16_t d[KVF_Q8G_ROWS];         /* each row's fp16 block scale */
    uint16_t m[KVF_Q8G_ROWS];         /* each row's fp16 block minimum */
    int8_t qs[KVF_Q8G_ROWS * KVF_QK]; /* qs[32 p + 2 r + k] = row r, column 2p + k: q, 0..31 */
};

/* Repacks rows × nb Q5_1 blocks (row r at src + r · nb) into dst (kvf__q8g_blocks of them). */
void kvf__q5_1_q8mg_pack(const struct kvf_block_q5_1 *src, uint32_t rows, uint32_t nb,
                         struct kvf_q8mg *dst);

/*
 * 4-bit weights (Q4_0, Q4_1, Q4_K) as the kernels read them: repacked once at load
 * (kvf__q4g_pack) into groups of 16 rows like Q8_0's, each 32-column block of a group one struct
 * kvf_q4g: every value of row r there is a[r] · q + b[r], q the unsigned 4-bit quant (Q4_0:
 * a = d, b = −8d; Q4_1: a = d, b = m; Q4_K: a = d · sc, b = −(dmin · m); all exact in float).
 * The quants go by column pairs as Q8_0's do, two to a byte: byte qs[32 p + 2 r + k] (p < 8) holds
 * row r's column 2p + k in its low nibble and column 16 + 2p + k in its high one, so one 32-byte
 * load widened to int16 and masked is "pair p of all 16 rows", and shifted right by 4, pair p + 8.
 * 384 bytes per 512 weights: 6 bits a weight, against Q8_0's 8.5.
 *
 * 5-bit weights (Q5_K: as Q4_K; Q5_0 too, a = d, b = −16d, though the model packs Q5_0 as
 * Q8_0, kvf__q5_0_q8g_pack) likewise (struct kvf_q5g): the low four
 * bits of each quant exactly as kvf_q4g holds them, then the fifth bits as one 32-bit word per
 * widened operand: bit 2r + k of qh[2p + h] is the 16s bit of row r's column 16h + 2p + k, so
 * the word is the lane mask of the operand's 32 int16 lanes that take 16 more. 448 bytes per
 * 512 weights: 7 bits a weight.
 *
 * Q6_K weights likewise (kvf__q6g_pack): the quants less 32 as int8 in Q8_0's pair order, and
 * each row's two scales per block (d · sc of columns 0-15 and 16-31, exact in float). 640 bytes
 * per 512 weights.
 */
struct kvf_q4g {
    float a[KVF_Q8G_ROWS]; /* each row's scale */
    float b[KVF_Q8G_ROWS]; /* each row's offset */
    uint8_t qs[KVF_Q8G_ROWS * KVF_QK / 2];
};

struct kvf_q5g {
    float a[KVF_Q8G_ROWS];                 /* each row's scale */
    float b[KVF_Q8G_ROWS];                 /* each row's offset */
    uint8_t qs[KVF_Q8G_ROWS * KVF_QK / 2]; /* the low 4 bits, as kvf_q4g's */
    uint32_t qh[KVF_Q8G_ROWS];             /* the fifth bits, as above */
};

struct kvf_q6g {
    float a[2][KVF_Q8G_ROWS];         /* each row's scale of columns 0-15, and of 16-31 */
    int8_t qs[KVF_Q8G_ROWS * KVF_QK]; /* qs[32 p + 2 r + k] = row r, column 2p + k, q − 32 */
};

/* Whether the kernels have a packed form of `type` read against 16-bit activations (Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K). */
static inline int kvf__packed_act16(uint32_t type)
{
    return type == KVF_GGML_Q8_0 || type == KVF_GGML_Q4_0 || type == KVF_GGML_Q4_1 ||
           type == KVF_GGML_Q5_0 || type == KVF_GGML_Q5_1 || type == KVF_GGML_Q4_K ||
           type == KVF_GGML_Q5_K || type == KVF_GGML_Q6_K;
}

/* Bytes the packed form of a rows × cols weight of `type` takes (0: none). */
size_t kvf__packed_bytes(uint32_t type, uint32_t rows, uint32_t cols);

/* Repacks a Q4_0, Q4_1 or Q4_K weight (rows of row_bytes at src) into dst (kvf__packed_bytes). */
void kvf__q4g_pack(uint32_t type, const void *src, size_t row_bytes, uint32_t rows, uint32_t cols,
                   struct kvf_q4g *dst);
/* Repacks a Q5_0 or Q5_K weight into dst. */
void kvf__q5g_pack(uint32_t type, const void *src, size_t row_bytes, uint32_t rows, uint32_t cols,
                   struct kvf_q5g *dst);
/* Repacks a Q6_K weight into dst. */
void kvf__q6g_pack(const void *src, size_t row_bytes, uint32_t rows, uint32_t cols,
                   struct kvf_q6g *dst);

/*
 * F32 weights as the kernels read them: repacked once at load (kvf__f32g_pack) into groups of
 * 16 rows stored column by column, group g's column c at 16 · (g · n + c): one 64-byte line
 * holds a column of the group, one vector lane per row. Padding rows are zero.
 */
#define KVF_F32G_ROWS 16

/* Floats a packed F32 weight of rows × n takes. */
static inline size_t kvf__f32g_floats(uint32_t rows, uint32_t n)
{
    return (size_t)((rows + KVF_F32G_ROWS - 1) / KVF_F32G_ROWS) * KVF_F32G_ROWS * n;
}

/* Repacks rows × n floats (row r at src + r · ws) into dst (kvf__f32g_floats of them). */
void kvf__f32g_pack(const float *src, size_t ws, uint32_t rows, uint32_t n, float *dst);

/*
 * A variant computes y[t * ldy + r] = W[r] · x[t] for rows r0 ≤ r < r1 and tokens t < nt, tiling
 * as it likes, under the per-pair rule above.
 *
 * The packed F32 recipe (row r, token t), the same in every variant, scalar included: acc = 0;
 * acc = fma(w[c], x[c], acc) for c = 0, 1, ..., n - 1 in order; y = acc. One chain per pair,
 * with no horizontal sum: a vector lane is a row and a tile's pairs are independent chains.
 *
 * The Q8_0 per-pair recipe (row r, token t), the same in every variant and tile: acc = 0; for
 * each block b in order, s = the exact integer Σ_i w[32b + i] · x[32b + i] (int8 × int16, 32
 * products: |s| < 2^28, so int32 holds it and any order of the integer adds gives it), then
 * acc = fma((float)s, d_w[b], acc) (the conversion rounds to nearest-even, as C's does); then
 * y = acc · d_x, the token row's one activation scale.
 *
 * The Q4 recipe (struct kvf_q4g, and struct kvf_q5g with 5-bit q): acc = 0; for each block b
 * in order, s = Σ_i q[32b + i] · x[32b + i] and sx = Σ_i x[32b + i] (exact integers; sx is the
 * activations' block sum, struct kvf_act16), acc = fma((float)s, a, acc), then
 * acc = fma((float)sx, b, acc); y = acc · d_x. The Q6 recipe (struct kvf_q6g): per block,
 * s0 and s1 the exact sums over columns 0-15 and 16-31, acc = fma((float)s0, a0, acc), then
 * acc = fma((float)s1, a1, acc); y = acc · d_x. The Q8m recipe (struct kvf_q8mg) is the Q4
 * recipe with a = d and b = m, on int8 weights in Q8_0's order.
 */
struct kvf_kern {
    const char *name;
    /* W: rows of n floats at stride ws floats; x: nt rows of n floats at stride ldx (the rows
     * of F16, BF16 and Q4_0 weights, dequantized one at a time). */
    void (*f32_rows)(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt, uint32_t n,
                     float *y, size_t ldy, uint32_t r0, uint32_t r1);
    /* W: packed F32 (kvf__f32g_pack) rows of n floats; x: nt rows of n floats at stride ldx.
     * r0 and r1 may fall inside a group: only rows [r0, r1) are written. */
    void (*f32g_rows)(const float *w, uint32_t n, const float *x, size_t ldx, uint32_t nt, float *y,
                      size_t ldy, uint32_t r0, uint32_t r1);
    /* W: packed (struct kvf_q8g) rows of nb blocks; x: nt activation rows of nb × 32 int16 at
     * stride ldx int16 (struct kvf_act16), with one scale per row in xd. r0 and r1 may fall
     * inside a group: only rows [r0, r1) are written. */
    void (*q8_rows)(const struct kvf_q8g *w, uint32_t nb, const int16_t *x, const float *xd,
                    size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1);
    /* The same for packed Q4_0 / Q4_K (struct kvf_q4g), Q5_0 / Q5_K (struct kvf_q5g) and Q6_K
     * (struct kvf_q6g) weights; the 4- and 5-bit ones read the activations' block sums too, at
     * xs (stride ldx / 32 floats). */
    void (*q4_rows)(const struct kvf_q4g *w, uint32_t nb, const int16_t *x, const float *xd,
                    const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                    uint32_t r1);
    void (*q5_rows)(const struct kvf_q5g *w, uint32_t nb, const int16_t *x, const float *xd,
                    const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                    uint32_t r1);
    void (*q6_rows)(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                    size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1);
    /* Packed Q5_1 (struct kvf_q8mg): q8_rows with the block sums at xs, as q4_rows. */
    void (*q8m_rows)(const struct kvf_q8mg *w, uint32_t nb, const int16_t *x, const float *xd,
                     const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                     uint32_t r1);
    /* h[i] = x[i] as an IEEE half, rounded to nearest-even (kvf_f32_to_fp16's bits, NaN
     * included; tested), for i < n: K/V rows stored as halves. */
    void (*f16_row)(const float *x, uint16_t *h, uint32_t n);
    /* Quantizes one activation row of n floats (n a multiple of 32) to n int16, its scale and
     * its n / 32 block sums at s (see struct kvf_act16); every variant gives exactly the scalar
     * variant's bytes (tested). */
    void (*quant_a16)(const float *x, int16_t *q, float *d, float *s, uint32_t n);
    /* Attention partials of segment seg of token t of the batch for the query heads [h0, h1),
     * all of one K/V group (attention.h): head h's at part + (h - h0) · part_stride. scores:
     * (h1 - h0) · KVF_ATTN_SCORE_STRIDE floats of this thread's own. pf: the next item's
     * prefetch queue, stepped as attention.h says (NULL: none). */
    void (*attn_seg)(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                     uint32_t seg, float *part, size_t part_stride, float *scores,
                     struct kvf_attn_pf *pf);
    /* attn_seg for every K/V group of token t, the token its sequence's only one in the batch
     * (a decode step): head h's partial at part + h · part_stride, its scores at
     * scores + h · KVF_ATTN_SCORE_STRIDE (n_heads rows). The same values as attn_seg's. */
    void (*attn_tok)(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                     size_t part_stride, float *scores, struct kvf_attn_pf *pf);
    /* The same for nb ≤ KVF_ATTN_BLOCK tokens t0 .. t0 + nb - 1 of one sequence at consecutive
     * positions, each (token, head) getting exactly what attn_seg gives it, tokens before the
     * segment skipped: token u's partials at part + u · tok_stride, its scores at
     * scores + u · (h1 - h0) · KVF_ATTN_SCORE_STRIDE. */
    void (*attn_segs)(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                      uint32_t h1, uint32_t seg, float *part, size_t part_stride, size_t tok_stride,
                      float *scores);
    /* out = x / rms(x) · w over n elements, the operations of kvf__rmsnorm_scalar (kernels.c)
     * in every variant, so the same bits (tested). */
    void (*rmsnorm)(float *out, const float *x, const float *w, uint32_t n, float eps);
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
 * W->cols floats at stride ldx; xq (needed when W is packed and kvf__packed_act16, else may be
 * NULL) the same rows
 * quantized to 16 bits. scratch holds W->cols floats (used for types that are dequantized row
 * by row). Work: (r1 - r0) × nt × cols multiply-adds; W streamed once.
 */
void kvf__matmul(const struct kvf_weight *W, const float *x, size_t ldx, const struct kvf_act16 *xq,
                 uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1, float *scratch);

/* Asks for the first `groups` packed row groups of W's rows [r0, r1) into cache (nothing for
 * a weight without a packed form): the start of a matrix product the thread will run next,
 * requested before the phases in between. */
void kvf__matmul_warm(const struct kvf_weight *W, uint32_t r0, uint32_t r1, uint32_t groups);

/* out = x / rms(x) * w, n elements (sum of squares in double, in a fixed order: kernels.c),
 * by the chosen variant. */
void kvf__rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);
void kvf__rmsnorm_scalar(float *out, const float *x, const float *w, uint32_t n, float eps);

#endif
