/*
 * kvfence/quant.h — element formats of GGUF tensors: half-precision conversions, the size of a
 * row of each type, dequantization of a row to f32, and quantization of a row to Q8_0 / Q4_0.
 *
 * Block formats (GGML's, bit for bit), each covering KVF_QK = 32 consecutive values of a row:
 *   Q8_0: { fp16 d; int8 q[32]; }      34 bytes; value[j] = q[j] * d
 *   Q4_0: { fp16 d; uint8 q[16]; }     18 bytes; value[j] = ((q[j] & 15) - 8) * d for j < 16,
 *                                                  value[j+16] = ((q[j] >> 4) - 8) * d
 * A row of a quantized type holds a whole number of blocks (its length is a multiple of 32).
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

struct kvf_block_q8_0 {
    uint16_t d;        /* scale, IEEE half */
    int8_t qs[KVF_QK]; /* quantized values */
};

struct kvf_block_q4_0 {
    uint16_t d;             /* scale, IEEE half */
    uint8_t qs[KVF_QK / 2]; /* element j in the low nibble of qs[j], j+16 in the high one */
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

/* True for the types kvfence reads: F32, F16, BF16, Q8_0, Q4_0. */
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

#endif /* KVFENCE_QUANT_H */
