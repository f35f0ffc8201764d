/*
 * kvfence/quant.h — element formats of GGUF tensors: half-precision conversions, the size of a
 * row of each type, dequantization of a row to f32, and quantization of a row to Q8_0 / Q4_0.
 *
 * Block formats (GGML's, bit for bit), each covering KVF_QK = 32 consecutive values of a row:
 *   Q8_0: { fp16 d; int8 q[32]; }      34 bytes; value[j] = q[j] * d
 *   Q4_0: { fp16 d; uint8 q[16]; }     18 bytes; value[j] = ((q[j] & 15) - 8) * d for j < 16,
 *                                                  value[j+16] = ((q[j] >> 4) - 8) * d
 *   Q5_0: { fp16 d; uint8 qh[4]; uint8 q[16]; }  22 bytes; with h = qh read as a little-endian
 *         uint32, value[j] = (((q[j] & 15) | (h >> j & 1) << 4) - 16) * d for j < 16,
 *         value[j+16] = (((q[j] >> 4) | (h >> (j + 16) & 1) << 4) - 16) * d
 * A row of a quantized type holds a whole number of blocks (its length is a multiple of 32).
 *
 * The K-quants group KVF_QK_K = 256 values into a super-block of sub-blocks, each sub-block
 * with its own integer scale (and min), those integers scaled in turn by the super-block's
 * halves d (and dmin):
 *   Q4_K: { fp16 d, dmin; uint8 scales[12]; uint8 qs[128]; }            144 bytes, 4.5 bits
 *         8 sub-blocks of 32, each a 6-bit scale sc and 6-bit min m (scales[] below);
 *         value = (d · sc) · q − (dmin · m), q the 4-bit quant, 0..15. Values 64c .. 64c+31 are
 *         the low nibbles of qs[32c .. 32c+31] (sub-block 2c), 64c+32 .. 64c+63 their high
 *         nibbles (sub-block 2c+1).
 *   Q5_K: { fp16 d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; } 176 bytes, 5.5 bits
 *         as Q4_K with a fifth bit: value 64c+l (l < 32) takes bit 2c of qh[l] as its 16s bit,
 *         value 64c+32+l bit 2c+1; q is 0..31.
 *   Q6_K: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d; }      210 bytes, 6.5625 bits
 *         16 sub-blocks of 16, each an 8-bit signed scale; value = (d · sc) · (q − 32), q the
 *         6-bit quant. In half h (values 128h .. 128h+127), for l < 32: value 128h+l is
 *         low nibble of ql[64h+l] | bits 0-1 of qh[32h+l] << 4, +32 is the low nibble of
 *         ql[64h+32+l] | bits 2-3, +64 the high nibble of ql[64h+l] | bits 4-5, +96 the high
 *         nibble of ql[64h+32+l] | bits 6-7; value 16j .. 16j+15 has scale scales[j].
 *   The 12 scale bytes of Q4_K and Q5_K (kvf_kquant_scale_min): sub-block j < 4 has
 *   sc = scales[j] & 63, m = scales[j+4] & 63; j ≥ 4 has sc = (scales[j+4] & 15) |
 *   (scales[j-4] >> 6) << 4, m = (scales[j+4] >> 4) | (scales[j] >> 6) << 4.
 * The float operations of dequantization are exactly GGML's, in its order, so the values are
 * bit for bit the same.
 *
 * All functions are pure, thread-safe, and O(n) in the row length. Block structs have no
 * padding (static asserts in quant.c) and need only 2-byte alignment.
 */
#ifndef KVFENCE_QUANT_H
#define KVFENCE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kvfence/gguf.h"

#define KVF_QK 32
#define KVF_QK_K 256

/* GGML's type number of Q5_0, which gguf.h's enum of the types kvfence reads does not list (it
 * has only the others): the type of the matrices a Q4_K_M file keeps at 5 bits where a row is
 * not whole 256-value super-blocks. */
#define KVF_GGML_Q5_0 6u
/* Likewise Q4_1 and Q5_1, the affine 32-value blocks: Q5_1 is what llama.cpp's Q5_K_M puts
 * where a row is not whole super-blocks, Q4_1 what older Q4_1 and some Q4_K_S files hold. */
#define KVF_GGML_Q4_1 3u
#define KVF_GGML_Q5_1 7u

struct kvf_block_q8_0 {
    uint16_t d;        /* scale, IEEE half */
    int8_t qs[KVF_QK]; /* quantized values */
};

struct kvf_block_q4_0 {
    uint16_t d;             /* scale, IEEE half */
    uint8_t qs[KVF_QK / 2]; /* element j in the low nibble of qs[j], j+16 in the high one */
};

struct kvf_block_q5_0 {
    uint16_t d;             /* scale, IEEE half */
    uint8_t qh[4];          /* the fifth bits: bit j of the little-endian word is element j's */
    uint8_t qs[KVF_QK / 2]; /* the low 4 bits, placed as Q4_0's */
};

struct kvf_block_q4_1 {
    uint16_t d, m;          /* scale and minimum, IEEE halves */
    uint8_t qs[KVF_QK / 2]; /* placed as Q4_0's */
};

struct kvf_block_q5_1 {
    uint16_t d, m;          /* scale and minimum, IEEE halves */
    uint8_t qh[4];          /* the fifth bits, as Q5_0's */
    uint8_t qs[KVF_QK / 2]; /* the low 4 bits, as Q5_0's */
};

struct kvf_block_q4_k {
    uint16_t d, dmin;                 /* super-block scales of the scales and of the mins */
    uint8_t scales[12];               /* 8 × (6-bit scale, 6-bit min), packed as above */
    uint8_t qs[KVF_QK_K / 2];         /* 4-bit quants */
};

struct kvf_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[KVF_QK_K / 8];         /* the fifth bit of each quant */
    uint8_t qs[KVF_QK_K / 2];         /* the low 4 bits */
};

struct kvf_block_q6_k {
    uint8_t ql[KVF_QK_K / 2];         /* the low 4 bits */
    uint8_t qh[KVF_QK_K / 4];         /* the high 2 bits */
    int8_t scales[KVF_QK_K / 16];     /* one per 16 values */
    uint16_t d;                       /* super-block scale, IEEE half */
};

/* IEEE half <-> float (round to nearest even; NaN stays NaN, overflow becomes infinity). */
float kvf_fp16_to_f32(uint16_t h);
uint16_t kvf_f32_to_fp16(float f);
/* bfloat16 <-> float (round to nearest even; NaN stays NaN). */
float kvf_bf16_to_f32(uint16_t b);
uint16_t kvf_f32_to_bf16(float f);

/* The name of a tensor type ("F32", "Q8_0", and also the GGML types kvfence does not read,
 * such as "Q4_K"), or "unknown". Never NULL. */
const char *kvf_ggml_type_name(uint32_t type);

/* True for the types kvfence reads: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K. */
int kvf_ggml_type_supported(uint32_t type);

/* Bytes of a row of n elements of `type` into *bytes. Returns 0, KVF_E_MODEL_UNSUPPORTED for
 * a type kvfence does not read, -EINVAL if n is not a multiple of the type's block size, or
 * -EOVERFLOW. */
int kvf_quant_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes);

/* Dequantizes n elements of `type` at src into dst[0..n). src needs the alignment stated in
 * gguf.h (4 for F32, 2 otherwise). Returns 0, or the errors of kvf_quant_row_bytes (then dst
 * is untouched). */
int kvf_dequant_row(uint32_t type, const void *src, float *dst, uint64_t n);

/* Quantizes n values (n a multiple of 32) into n/32 blocks at dst. */
void kvf_quantize_row_q8_0(const float *src, struct kvf_block_q8_0 *dst, uint64_t n);
void kvf_quantize_row_q4_0(const float *src, struct kvf_block_q4_0 *dst, uint64_t n);
void kvf_quantize_row_q5_0(const float *src, struct kvf_block_q5_0 *dst, uint64_t n);
/* Affine: each block's [min, max] mapped onto 0..15 (0..31), m the minimum as a half. */
void kvf_quantize_row_q4_1(const float *src, struct kvf_block_q4_1 *dst, uint64_t n);
void kvf_quantize_row_q5_1(const float *src, struct kvf_block_q5_1 *dst, uint64_t n);

/* Quantizes n values (n a multiple of 256) into n/256 super-blocks at dst. A plain min-max
 * quantizer per sub-block (not GGML's iterative search): good enough for test models, and its
 * error is bounded as tests/gguf/test_quant.c checks. */
void kvf_quantize_row_q4_k(const float *src, struct kvf_block_q4_k *dst, uint64_t n);
void kvf_quantize_row_q5_k(const float *src, struct kvf_block_q5_k *dst, uint64_t n);
void kvf_quantize_row_q6_k(const float *src, struct kvf_block_q6_k *dst, uint64_t n);

/* Sub-block j's (0..7) 6-bit scale and min from the 12 scale bytes of a Q4_K or Q5_K block. */
void kvf_kquant_scale_min(const uint8_t scales[12], int j, uint8_t *sc, uint8_t *m);

#endif /* KVFENCE_QUANT_H */
