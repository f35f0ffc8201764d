/* Element formats of GGUF tensors: half conversions, row sizes, dequantization, quantization.
 * The bit layouts are GGML's so that files kvfence writes are read the same way elsewhere. */
#include "kvfence/quant.h"

#include <math.h>
#include <string.h>

#include "kvfence/common.h"

_Static_assert(sizeof(struct kvf_block_q8_0) == 34, "Q8_0 block must be 34 bytes, no padding");
_Static_assert(sizeof(struct kvf_block_q4_0) == 18, "Q4_0 block must be 18 bytes, no padding");
_Static_assert(sizeof(float) == 4, "float must be IEEE single");

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float kvf_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* Zero or subnormal: mant * 2^-24 is exact in float. */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t kvf_f32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN */
    /* 65520 is halfway between the largest half (65504) and 2^16; ties go to even, which is
     * upwards here, so everything from 65520 on becomes infinity. */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        /* Below the smallest normal half (2^-14): a subnormal result, m * 2^(e-126) units of
         * 2^-24, rounded to nearest even. Under 2^-25 everything rounds to zero. */
        uint32_t e = ax >> 23;
        if (e < 102) return sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax - 0x38000000u) >> 13; /* rebias the exponent by 127 - 15 */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++; /* a carry moves into the exponent */
    return (uint16_t)(sign | r);
}

float kvf_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

uint16_t kvf_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static const char *const type_names[] = {
    [0] = "F32",     [1] = "F16",      [2] = "Q4_0",   [3] = "Q4_1",    [6] = "Q5_0",
    [7] = "Q5_1",    [8] = "Q8_0",     [9] = "Q8_1",   [10] = "Q2_K",   [11] = "Q3_K",
    [12] = "Q4_K",   [13] = "Q5_K",    [14] = "Q6_K",  [15] = "Q8_K",   [16] = "IQ2_XXS",
    [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S",
    [22] = "IQ2_S",  [23] = "IQ4_XS",  [24] = "I8",    [25] = "I16",    [26] = "I32",
    [27] = "I64",    [28] = "F64",     [29] = "IQ1_M", [30] = "BF16",   [34] = "TQ1_0",
    [35] = "TQ2_0",
};

const char *kvf_ggml_type_name(uint32_t type)
{
    if (type < KVF_ARRAY_LEN(type_names) && type_names[type]) return type_names[type];
    return "unknown";
}

int kvf_ggml_type_supported(uint32_t type)
{
    return type == KVF_GGML_F32 || type == KVF_GGML_F16 || type == KVF_GGML_BF16 ||
           type == KVF_GGML_Q8_0 || type == KVF_GGML_Q4_0;
}

int kvf_quant_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes)
{
    uint64_t block, block_bytes;
    switch (type) {
    case KVF_GGML_F32:
        block = 1, block_bytes = 4;
        break;
    case KVF_GGML_F16:
    case KVF_GGML_BF16:
        block = 1, block_bytes = 2;
        break;
    case KVF_GGML_Q8_0:
        block = KVF_QK, block_bytes = sizeof(struct kvf_block_q8_0);
        break;
    case KVF_GGML_Q4_0:
        block = KVF_QK, block_bytes = sizeof(struct kvf_block_q4_0);
        break;
    default:
        return KVF_E_MODEL_UNSUPPORTED;
    }
    if (n % block != 0) return -EINVAL;
    if (n / block > UINT64_MAX / block_bytes) return -EOVERFLOW;
    *bytes = n / block * block_bytes;
    return 0;
}

int kvf_dequant_row(uint32_t type, const void *src, float *dst, uint64_t n)
{
    uint64_t bytes;
    int rc = kvf_quant_row_bytes(type, n, &bytes);
    if (rc < 0) return rc;
    switch (type) {
    case KVF_GGML_F32:
        memmove(dst, src, (size_t)bytes);
        break;
    case KVF_GGML_F16: {
        const uint16_t *s = src;
        for (uint64_t i = 0; i < n; i++)
            dst[i] = kvf_fp16_to_f32(s[i]);
        break;
    }
    case KVF_GGML_BF16: {
        const uint16_t *s = src;
        for (uint64_t i = 0; i < n; i++)
            dst[i] = kvf_bf16_to_f32(s[i]);
        break;
    }
    case KVF_GGML_Q8_0: {
        const struct kvf_block_q8_0 *b = src;
        for (uint64_t k = 0; k < n / KVF_QK; k++) {
            float d = kvf_fp16_to_f32(b[k].d);
            for (int j = 0; j < KVF_QK; j++)
                dst[k * KVF_QK + j] = (float)b[k].qs[j] * d;
        }
        break;
    }
    case KVF_GGML_Q4_0: {
        const struct kvf_block_q4_0 *b = src;
        for (uint64_t k = 0; k < n / KVF_QK; k++) {
            float d = kvf_fp16_to_f32(b[k].d);
            for (int j = 0; j < KVF_QK / 2; j++) {
                dst[k * KVF_QK + j] = (float)((int)(b[k].qs[j] & 15u) - 8) * d;
                dst[k * KVF_QK + j + KVF_QK / 2] = (float)((int)(b[k].qs[j] >> 4) - 8) * d;
            }
        }
        break;
    }
    default:
        return KVF_E_MODEL_UNSUPPORTED; /* unreachable: row_bytes refused it */
    }
    return 0;
}

void kvf_quantize_row_q8_0(const float *src, struct kvf_block_q8_0 *dst, uint64_t n)
{
    for (uint64_t k = 0; k < n / KVF_QK; k++) {
        const float *x = src + k * KVF_QK;
        float amax = 0.0f;
        for (int j = 0; j < KVF_QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        dst[k].d = kvf_f32_to_fp16(d);
        for (int j = 0; j < KVF_QK; j++)
            dst[k].qs[j] = (int8_t)lrintf(x[j] * id);
    }
}

void kvf_quantize_row_q4_0(const float *src, struct kvf_block_q4_0 *dst, uint64_t n)
{
    for (uint64_t k = 0; k < n / KVF_QK; k++) {
        const float *x = src + k * KVF_QK;
        /* The scale maps the value of largest magnitude to -8, the one end of the nibble range
         * that has no positive twin, as GGML does. */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < KVF_QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        dst[k].d = kvf_f32_to_fp16(d);
        for (int j = 0; j < KVF_QK / 2; j++) {
            int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + KVF_QK / 2] * id + 8.5f);
            q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
            q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
            dst[k].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}
