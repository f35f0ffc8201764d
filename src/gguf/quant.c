/* Element formats of GGUF tensors: half conversions, row sizes, dequantization, quantization.
 * The bit layouts are GGML's so that files kvfence writes are read the same way elsewhere. */
#include "kvfence/gguf.h"

#include <math.h>
#include <string.h>

#include "kvfence/common.h"

_Static_assert(sizeof(struct kvf_block_q8_0) == 34, "Q8_0 block must be 34 bytes, no padding");
_Static_assert(sizeof(struct kvf_block_q4_0) == 18, "Q4_0 block must be 18 bytes, no padding");
_Static_assert(sizeof(struct kvf_block_q5_0) == 22, "Q5_0 block must be 22 bytes, no padding");
_Static_assert(sizeof(struct kvf_block_q4_1) == 20, "Q4_1 block must be 20 bytes, no padding");
_Static_assert(sizeof(struct kvf_block_q5_1) == 24, "Q5_1 block must be 24 bytes, no padding");
_Static_assert(sizeof(struct kvf_block_q4_k) == 144, "Q4_K block must be 144 bytes, no padding");
_Static_assert(sizeof(struct kvf_block_q5_k) == 176, "Q5_K block must be 176 bytes, no padding");
_Static_assert(sizeof(struct kvf_block_q6_k) == 210, "Q6_K block must be 210 bytes, no padding");
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
           type == KVF_GGML_Q8_0 || type == KVF_GGML_Q4_0 || type == KVF_GGML_Q4_1 ||
           type == KVF_GGML_Q5_0 || type == KVF_GGML_Q5_1 || type == KVF_GGML_Q4_K ||
           type == KVF_GGML_Q5_K || type == KVF_GGML_Q6_K;
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
    case KVF_GGML_Q5_0:
        block = KVF_QK, block_bytes = sizeof(struct kvf_block_q5_0);
        break;
    case KVF_GGML_Q4_1:
        block = KVF_QK, block_bytes = sizeof(struct kvf_block_q4_1);
        break;
    case KVF_GGML_Q5_1:
        block = KVF_QK, block_bytes = sizeof(struct kvf_block_q5_1);
        break;
    case KVF_GGML_Q4_K:
        block = KVF_QK_K, block_bytes = sizeof(struct kvf_block_q4_k);
        break;
    case KVF_GGML_Q5_K:
        block = KVF_QK_K, block_bytes = sizeof(struct kvf_block_q5_k);
        break;
    case KVF_GGML_Q6_K:
        block = KVF_QK_K, block_bytes = sizeof(struct kvf_block_q6_k);
        break;
    default:
        return KVF_E_MODEL_UNSUPPORTED;
    }
    if (n % block != 0) return -EINVAL;
    if (n / block > UINT64_MAX / block_bytes) return -EOVERFLOW;
    *bytes = n / block * block_bytes;
    return 0;
}

void kvf_kquant_scale_min(const uint8_t scales[12], int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4);
        *m = (uint8_t)((scales[j + 4] >> 4) | (scales[j] >> 6) << 4);
    }
}

/* A Q5_0 or Q5_1 block's fifth bits as one word, bit j element j's (the bytes are
 * little-endian whatever the host's order). */
static uint32_t q5_high(const uint8_t qh[4])
{
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

/* The K-quant dequantizers: GGML's float operations in GGML's order. For Q4_K and Q5_K,
 * (d · sc) is exact (11 × 6 bits) and so is its product with q (≤ 24 bits); the one rounding is
 * the subtraction of (dmin · m). For Q6_K, (d · sc) is exact and its product with (q − 32)
 * rounds once. */
static void dequant_q4_k(const struct kvf_block_q4_k *b, float *y, uint64_t nb)
{
    for (uint64_t k = 0; k < nb; k++, b++) {
        float d = kvf_fp16_to_f32(b->d), dmin = kvf_fp16_to_f32(b->dmin);
        for (int c = 0; c < 4; c++) {
            uint8_t sc0, m0, sc1, m1;
            kvf_kquant_scale_min(b->scales, 2 * c, &sc0, &m0);
            kvf_kquant_scale_min(b->scales, 2 * c + 1, &sc1, &m1);
            float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
            const uint8_t *q = b->qs + 32 * c;
            for (int l = 0; l < 32; l++)
                *y++ = d0 * (float)(q[l] & 15) - mm0;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)(q[l] >> 4) - mm1;
        }
    }
}

static void dequant_q5_k(const struct kvf_block_q5_k *b, float *y, uint64_t nb)
{
    for (uint64_t k = 0; k < nb; k++, b++) {
        float d = kvf_fp16_to_f32(b->d), dmin = kvf_fp16_to_f32(b->dmin);
        for (int c = 0; c < 4; c++) {
            uint8_t sc0, m0, sc1, m1;
            kvf_kquant_scale_min(b->scales, 2 * c, &sc0, &m0);
            kvf_kquant_scale_min(b->scales, 2 * c + 1, &sc1, &m1);
            float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
            const uint8_t *q = b->qs + 32 * c;
            for (int l = 0; l < 32; l++)
                *y++ = d0 * (float)((q[l] & 15) | ((b->qh[l] >> (2 * c)) & 1) << 4) - mm0;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((q[l] >> 4) | ((b->qh[l] >> (2 * c + 1)) & 1) << 4) - mm1;
        }
    }
}

/* Q6_K's quant of value i (0..255) of a block, 0..63. */
static int q6_k_quant(const struct kvf_block_q6_k *b, int i)
{
    int h = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
    uint8_t lo = b->ql[64 * h + 32 * (quarter & 1) + l];
    lo = quarter < 2 ? lo & 15 : lo >> 4;
    return lo | ((b->qh[32 * h + l] >> (2 * quarter)) & 3) << 4;
}

static void dequant_q6_k(const struct kvf_block_q6_k *b, float *y, uint64_t nb)
{
    for (uint64_t k = 0; k < nb; k++, b++) {
        float d = kvf_fp16_to_f32(b->d);
        for (int i = 0; i < KVF_QK_K; i++)
            *y++ = d * (float)b->scales[i / 16] * (float)(q6_k_quant(b, i) - 32);
    }
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
    case KVF_GGML_Q5_0: {
        /* GGML's operations: the integer (q − 16) converted, times d (exact: 5 × 11 bits). */
        const struct kvf_block_q5_0 *b = src;
        for (uint64_t k = 0; k < n / KVF_QK; k++) {
            float d = kvf_fp16_to_f32(b[k].d);
            uint32_t h = q5_high(b[k].qh);
            for (int j = 0; j < KVF_QK / 2; j++) {
                int q0 = (int)((b[k].qs[j] & 15u) | (h >> j & 1u) << 4) - 16;
                int q1 = (int)((b[k].qs[j] >> 4) | (h >> (j + 16) & 1u) << 4) - 16;
                dst[k * KVF_QK + j] = (float)q0 * d;
                dst[k * KVF_QK + j + KVF_QK / 2] = (float)q1 * d;
            }
        }
        break;
    }
    case KVF_GGML_Q4_1: {
        /* q · d is exact (4 × 11 bits); the add of m is the one rounding, as GGML's. */
        const struct kvf_block_q4_1 *b = src;
        for (uint64_t k = 0; k < n / KVF_QK; k++) {
            float d = kvf_fp16_to_f32(b[k].d), m = kvf_fp16_to_f32(b[k].m);
            for (int j = 0; j < KVF_QK / 2; j++) {
                dst[k * KVF_QK + j] = (float)(b[k].qs[j] & 15u) * d + m;
                dst[k * KVF_QK + j + KVF_QK / 2] = (float)(b[k].qs[j] >> 4) * d + m;
            }
        }
        break;
    }
    case KVF_GGML_Q5_1: {
        const struct kvf_block_q5_1 *b = src;
        for (uint64_t k = 0; k < n / KVF_QK; k++) {
            float d = kvf_fp16_to_f32(b[k].d), m = kvf_fp16_to_f32(b[k].m);
            uint32_t h = q5_high(b[k].qh);
            for (int j = 0; j < KVF_QK / 2; j++) {
                uint32_t q0 = (b[k].qs[j] & 15u) | (h >> j & 1u) << 4;
                uint32_t q1 = (b[k].qs[j] >> 4) | (h >> (j + 16) & 1u) << 4;
                dst[k * KVF_QK + j] = (float)q0 * d + m;
                dst[k * KVF_QK + j + KVF_QK / 2] = (float)q1 * d + m;
            }
        }
        break;
    }
    case KVF_GGML_Q4_K:
        dequant_q4_k(src, dst, n / KVF_QK_K);
        break;
    case KVF_GGML_Q5_K:
        dequant_q5_k(src, dst, n / KVF_QK_K);
        break;
    case KVF_GGML_Q6_K:
        dequant_q6_k(src, dst, n / KVF_QK_K);
        break;
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

void kvf_quantize_row_q5_0(const float *src, struct kvf_block_q5_0 *dst, uint64_t n)
{
    for (uint64_t k = 0; k < n / KVF_QK; k++) {
        const float *x = src + k * KVF_QK;
        /* As Q4_0: the value of largest magnitude maps to -16, the end without a twin. */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < KVF_QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t h = 0;
        dst[k].d = kvf_f32_to_fp16(d);
        for (int j = 0; j < KVF_QK / 2; j++) {
            int q0 = (int)(x[j] * id + 16.5f), q1 = (int)(x[j + KVF_QK / 2] * id + 16.5f);
            q0 = q0 < 0 ? 0 : q0 > 31 ? 31 : q0;
            q1 = q1 < 0 ? 0 : q1 > 31 ? 31 : q1;
            dst[k].qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            h |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        for (int i = 0; i < 4; i++)
            dst[k].qh[i] = (uint8_t)(h >> (8 * i));
    }
}

/* One affine block of 32 values onto 0..levels: d = (max - min) / levels and m = min as halves,
 * each value's quant rounded against the halves and clamped (the rounding of d and m can push
 * an end one step out). q[32] receives the quants. */
static void quantize_affine_block(const float *x, int levels, uint16_t *d_out, uint16_t *m_out,
                                  uint8_t q[KVF_QK])
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < KVF_QK; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    *d_out = kvf_f32_to_fp16((hi - lo) / (float)levels);
    *m_out = kvf_f32_to_fp16(lo);
    float d = kvf_fp16_to_f32(*d_out), m = kvf_fp16_to_f32(*m_out);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < KVF_QK; j++) {
        long v = lrintf((x[j] - m) * id);
        q[j] = (uint8_t)(v < 0 ? 0 : v > levels ? levels : v);
    }
}

void kvf_quantize_row_q4_1(const float *src, struct kvf_block_q4_1 *dst, uint64_t n)
{
    uint8_t q[KVF_QK];
    for (uint64_t k = 0; k < n / KVF_QK; k++) {
        quantize_affine_block(src + k * KVF_QK, 15, &dst[k].d, &dst[k].m, q);
        for (int j = 0; j < KVF_QK / 2; j++)
            dst[k].qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
    }
}

void kvf_quantize_row_q5_1(const float *src, struct kvf_block_q5_1 *dst, uint64_t n)
{
    uint8_t q[KVF_QK];
    for (uint64_t k = 0; k < n / KVF_QK; k++) {
        quantize_affine_block(src + k * KVF_QK, 31, &dst[k].d, &dst[k].m, q);
        uint32_t h = 0;
        for (int j = 0; j < KVF_QK / 2; j++) {
            dst[k].qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
            h |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
        }
        for (int i = 0; i < 4; i++)
            dst[k].qh[i] = (uint8_t)(h >> (8 * i));
    }
}

/* --- K-quant quantizers. ----------------------------------------------------------------- */

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Packs sub-block j's 6-bit scale and min into the 12 bytes (the inverse of
 * kvf_kquant_scale_min). */
static void put_scale_min(uint8_t s[12], int j, int sc, int m)
{
    if (j < 4) {
        s[j] = (uint8_t)((s[j] & 0xc0) | sc);
        s[j + 4] = (uint8_t)((s[j + 4] & 0xc0) | m);
    } else {
        s[j + 4] = (uint8_t)((sc & 15) | (m & 15) << 4);
        s[j - 4] = (uint8_t)((s[j - 4] & 63) | (sc >> 4) << 6);
        s[j] = (uint8_t)((s[j] & 63) | (m >> 4) << 6);
    }
}

/* The smallest half of magnitude ≥ |v|, with v's sign: a super-block scale rounded this way
 * keeps every sub-block's integer scale within its bits even where the half is subnormal and
 * coarse (rounding to nearest there could need a scale of 66 or 136). */
static uint16_t half_at_least(float v)
{
    float a = fabsf(v);
    uint16_t h = kvf_f32_to_fp16(a);
    if (kvf_fp16_to_f32(h) < a && h < 0x7bff) h++;
    return v < 0.0f ? (uint16_t)(h | 0x8000u) : h;
}

/* One super-block of Q4_K or Q5_K (levels 15 or 31): each sub-block of 32 gets the affine map
 * of its own [min(0, lo), hi] onto 0..levels; the 8 step sizes and 8 mins are then quantized
 * to 6 bits against the largest of each (d, dmin), and the values against the quantized map.
 * q[256] receives the quants. */
static void quantize_kq_block(const float *x, int levels, uint16_t *d_out, uint16_t *dmin_out,
                              uint8_t scales[12], uint8_t q[KVF_QK_K])
{
    float step[8], mins[8], max_step = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = 0.0f;
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        step[j] = (hi - lo) / (float)levels;
        mins[j] = -lo;
        max_step = fmaxf(max_step, step[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    uint16_t dh = half_at_least(max_step / 63.0f), mh = half_at_least(max_min / 63.0f);
    float d = kvf_fp16_to_f32(dh), dmin = kvf_fp16_to_f32(mh);
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        /* The step rounds up, so that the top of the range stays inside 0..levels. */
        int sc = d > 0.0f ? clampi((int)ceilf(step[j] / d), 0, 63) : 0;
        int m = dmin > 0.0f ? clampi((int)lrintf(mins[j] / dmin), 0, 63) : 0;
        put_scale_min(scales, j, sc, m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        float id = d1 > 0.0f ? 1.0f / d1 : 0.0f;
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)clampi((int)lrintf((x[32 * j + l] + m1) * id), 0, levels);
    }
    *d_out = dh;
    *dmin_out = mh;
}

void kvf_quantize_row_q4_k(const float *src, struct kvf_block_q4_k *dst, uint64_t n)
{
    uint8_t q[KVF_QK_K];
    for (uint64_t k = 0; k < n / KVF_QK_K; k++, dst++) {
        quantize_kq_block(src + k * KVF_QK_K, 15, &dst->d, &dst->dmin, dst->scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                dst->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
}

void kvf_quantize_row_q5_k(const float *src, struct kvf_block_q5_k *dst, uint64_t n)
{
    uint8_t q[KVF_QK_K];
    for (uint64_t k = 0; k < n / KVF_QK_K; k++, dst++) {
        quantize_kq_block(src + k * KVF_QK_K, 31, &dst->d, &dst->dmin, dst->scales, q);
        memset(dst->qh, 0, sizeof dst->qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                uint8_t a = q[64 * c + l], b = q[64 * c + 32 + l];
                dst->qs[32 * c + l] = (uint8_t)((a & 15) | (b & 15) << 4);
                dst->qh[l] |= (uint8_t)((a >> 4) << (2 * c) | (b >> 4) << (2 * c + 1));
            }
    }
}

/* Q6_K: each sub-block of 16 gets the symmetric scale that maps its largest |x| to 31 (or -32
 * for a negative one, as Q4_0 uses the end without a positive twin); the 16 scales are then
 * quantized to signed 8 bits against the largest, and the values against the quantized
 * scales. */
void kvf_quantize_row_q6_k(const float *src, struct kvf_block_q6_k *dst, uint64_t n)
{
    for (uint64_t k = 0; k < n / KVF_QK_K; k++, dst++) {
        const float *x = src + k * KVF_QK_K;
        float sub[16], amax_sub = 0.0f, max_sub = 0.0f;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f, max = 0.0f;
            for (int l = 0; l < 16; l++)
                if (fabsf(x[16 * j + l]) > amax) amax = fabsf(x[16 * j + l]), max = x[16 * j + l];
            sub[j] = max / -32.0f;
            if (fabsf(sub[j]) > amax_sub) amax_sub = fabsf(sub[j]), max_sub = sub[j];
        }
        uint16_t dh = half_at_least(max_sub / -128.0f);
        float d = kvf_fp16_to_f32(dh);
        dst->d = dh;
        memset(dst->ql, 0, sizeof dst->ql);
        memset(dst->qh, 0, sizeof dst->qh);
        for (int j = 0; j < 16; j++) {
            int sc = d != 0.0f ? clampi((int)lrintf(sub[j] / d), -128, 127) : 0;
            dst->scales[j] = (int8_t)sc;
            float s = d * (float)sc, is = s != 0.0f ? 1.0f / s : 0.0f;
            for (int l = 0; l < 16; l++) {
                int i = 16 * j + l, qv = clampi((int)lrintf(x[i] * is), -32, 31) + 32;
                int h = i / 128, r = i % 128, quarter = r / 32, ll = r % 32;
                uint8_t *lo = &dst->ql[64 * h + 32 * (quarter & 1) + ll];
                *lo |= (uint8_t)(quarter < 2 ? (qv & 15) : (qv & 15) << 4);
                dst->qh[32 * h + ll] |= (uint8_t)((qv >> 4) << (2 * quarter));
            }
        }
    }
}
