/* Quantization helpers: exhaustive half-precision round trips, rounding at the edges, block
 * layouts checked against hand-built bytes, and quantization error bounds on random rows. */
#include "kvf_test.h"

#include "kvfence/common.h"
#include "kvfence/gguf.h"

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_fp16_exhaustive(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvf_fp16_to_f32((uint16_t)h);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan) {
            ASSERT_TRUE(isnan(f));
            ASSERT_TRUE(isnan(kvf_fp16_to_f32(kvf_f32_to_fp16(f))));
            continue;
        }
        if (kvf_f32_to_fp16(f) != h)
            KVF_FAIL("half 0x%04x -> %g -> 0x%04x", h, f, kvf_f32_to_fp16(f));
    }
    ASSERT_EQ_INT(kvf_f32_to_fp16(1.0f), 0x3c00);
    ASSERT_EQ_INT(kvf_f32_to_fp16(-0.0f), 0x8000);
    ASSERT_EQ_INT(kvf_f32_to_fp16(65504.0f), 0x7bff);
    ASSERT_EQ_INT(kvf_f32_to_fp16(65519.0f), 0x7bff);
    ASSERT_EQ_INT(kvf_f32_to_fp16(65520.0f), 0x7c00); /* the tie rounds to even: infinity */
    ASSERT_EQ_INT(kvf_f32_to_fp16(1e30f), 0x7c00);
    ASSERT_EQ_INT(kvf_f32_to_fp16(ldexpf(1.0f, -24)), 0x0001);
    ASSERT_EQ_INT(kvf_f32_to_fp16(ldexpf(1.0f, -25)), 0x0000); /* tie to even: zero */
    ASSERT_EQ_INT(kvf_f32_to_fp16(ldexpf(1.5f, -25)), 0x0001);
    ASSERT_EQ_INT(kvf_f32_to_fp16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 units: tie to even 2 */
    ASSERT_EQ_INT(kvf_f32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    ASSERT_EQ_INT(kvf_f32_to_fp16(1.0f + ldexpf(3.0f, -11)), 0x3c02);
    ASSERT_EQ_INT(kvf_f32_to_fp16(ldexpf(1.0f, -14) * (1.0f - ldexpf(1.0f, -12))), 0x0400);
}

/* Random floats across the half range: the result is a nearest half. */
static void test_fp16_nearest(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)kvf_rng_next(&r);
        float x = bits_f(bits);
        if (!isfinite(x) || fabsf(x) >= 65504.0f) continue;
        uint16_t h = kvf_f32_to_fp16(x);
        double e = fabs((double)kvf_fp16_to_f32(h) - x);
        for (int d = -1; d <= 1; d += 2) {
            uint16_t n = (uint16_t)(h + d);
            if ((n & 0x7c00) == 0x7c00 || ((n ^ h) & 0x8000)) continue;
            double en = fabs((double)kvf_fp16_to_f32(n) - x);
            if (en < e) KVF_FAIL("%.9g -> 0x%04x, but 0x%04x is nearer", x, h, n);
            if (en == e && (h & 1)) KVF_FAIL("%.9g: tie not rounded to even", x);
        }
    }
}

static void test_bf16(void)
{
    for (uint32_t b = 0; b < 65536; b++) {
        float f = kvf_bf16_to_f32((uint16_t)b);
        if (isnan(f)) {
            ASSERT_TRUE(isnan(kvf_bf16_to_f32(kvf_f32_to_bf16(f))));
            continue;
        }
        ASSERT_EQ_INT(kvf_f32_to_bf16(f), b);
    }
    ASSERT_EQ_INT(kvf_f32_to_bf16(1.0f), 0x3f80);
    ASSERT_EQ_INT(kvf_f32_to_bf16(bits_f(0x3f808000u)), 0x3f80); /* tie, even stays */
    ASSERT_EQ_INT(kvf_f32_to_bf16(bits_f(0x3f818000u)), 0x3f82); /* tie, odd rounds up */
    ASSERT_EQ_INT(kvf_f32_to_bf16(bits_f(0x3f808001u)), 0x3f81);
}

static void test_row_bytes_and_names(void)
{
    uint64_t n;
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_F32, 10, &n));
    ASSERT_EQ_U64(n, 40);
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_BF16, 10, &n));
    ASSERT_EQ_U64(n, 20);
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_Q8_0, 64, &n));
    ASSERT_EQ_U64(n, 68);
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_Q4_0, 64, &n));
    ASSERT_EQ_U64(n, 36);
    ASSERT_ERR(kvf_quant_row_bytes(KVF_GGML_Q8_0, 33, &n), -EINVAL);
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_Q4_K, 512, &n));
    ASSERT_EQ_U64(n, 288);
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_Q5_K, 256, &n));
    ASSERT_EQ_U64(n, 176);
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_Q6_K, 768, &n));
    ASSERT_EQ_U64(n, 630);
    ASSERT_ERR(kvf_quant_row_bytes(KVF_GGML_Q4_K, 288, &n), -EINVAL); /* not whole super-blocks */
    ASSERT_ERR(kvf_quant_row_bytes(11, 256, &n), KVF_E_MODEL_UNSUPPORTED); /* Q3_K */
    ASSERT_ERR(kvf_quant_row_bytes(KVF_GGML_F32, 1ull << 63, &n), -EOVERFLOW);
    ASSERT_STREQ(kvf_ggml_type_name(12), "Q4_K");
    ASSERT_STREQ(kvf_ggml_type_name(30), "BF16");
    ASSERT_STREQ(kvf_ggml_type_name(1000), "unknown");
    ASSERT_STREQ(kvf_ggml_type_name(4), "unknown");
    ASSERT_TRUE(kvf_ggml_type_supported(KVF_GGML_Q4_0));
    ASSERT_TRUE(kvf_ggml_type_supported(KVF_GGML_Q4_K) && kvf_ggml_type_supported(KVF_GGML_Q5_K) &&
                kvf_ggml_type_supported(KVF_GGML_Q6_K));
    ASSERT_FALSE(kvf_ggml_type_supported(11));
    ASSERT_FALSE(kvf_ggml_type_supported(15)); /* Q8_K: an intermediate, never in files */
}

/* Block layouts against bytes built by hand from the format's definition. */
static void test_block_layouts(void)
{
    uint8_t q8[34] = {0};
    q8[0] = 0x00, q8[1] = 0x38; /* d = 0.5 */
    q8[2 + 3] = (uint8_t)-4;
    q8[2 + 31] = 127;
    float out[32];
    ASSERT_OK(kvf_dequant_row(KVF_GGML_Q8_0, q8, out, 32));
    ASSERT_TRUE(out[3] == -2.0f && out[31] == 63.5f && out[0] == 0.0f);
    uint8_t q4[18] = {0};
    q4[0] = 0x00, q4[1] = 0x3c; /* d = 1 */
    memset(q4 + 2, 0x88, 16);   /* every nibble 8: zero */
    q4[2] = 0x9f;               /* element 0: 15 - 8 = 7; element 16: 9 - 8 = 1 */
    q4[2 + 15] = 0x01;          /* element 15: 1 - 8 = -7; element 31: 0 - 8 = -8 */
    ASSERT_OK(kvf_dequant_row(KVF_GGML_Q4_0, q4, out, 32));
    ASSERT_TRUE(out[0] == 7.0f && out[16] == 1.0f && out[15] == -7.0f && out[31] == -8.0f);
    ASSERT_TRUE(out[1] == 0.0f && out[17] == 0.0f);
    uint16_t h[2] = {0x3c00, 0xc000};
    ASSERT_OK(kvf_dequant_row(KVF_GGML_F16, h, out, 2));
    ASSERT_TRUE(out[0] == 1.0f && out[1] == -2.0f);
    ASSERT_ERR(kvf_dequant_row(11, q4, out, 32), KVF_E_MODEL_UNSUPPORTED);
}

static void test_quantize_error(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed() + 1);
    enum { N = 256 };
    float x[N], y[N];
    struct kvf_block_q8_0 b8[N / 32];
    struct kvf_block_q4_0 b4[N / 32];
    for (int iter = 0; iter < 200; iter++) {
        float scale = ldexpf(1.0f, (int)kvf_rng_below(&r, 20) - 10);
        for (int i = 0; i < N; i++)
            x[i] = scale * ((float)kvf_rng_below(&r, 2000001) / 1e6f - 1.0f);
        if (iter == 0) memset(x, 0, sizeof x); /* an all-zero block must not divide by zero */
        /* The bound: half a step, plus the scale's own rounding to half precision (which is
         * absolute, 2^-25 at most, once the scale is subnormal), times the largest |q|. */
        kvf_quantize_row_q8_0(x, b8, N);
        ASSERT_OK(kvf_dequant_row(KVF_GGML_Q8_0, b8, y, N));
        for (int k = 0; k < N / 32; k++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[k * 32 + j]));
            for (int j = 0; j < 32; j++)
                ASSERT_NEAR(y[k * 32 + j], x[k * 32 + j], 0.6 * amax / 127 + 127 * ldexp(1, -24));
        }
        kvf_quantize_row_q4_0(x, b4, N);
        ASSERT_OK(kvf_dequant_row(KVF_GGML_Q4_0, b4, y, N));
        for (int k = 0; k < N / 32; k++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[k * 32 + j]));
            for (int j = 0; j < 32; j++)
                ASSERT_NEAR(y[k * 32 + j], x[k * 32 + j], 1.1 * amax / 8 + 8 * ldexp(1, -24));
        }
    }
}

/* --- K-quants. ------------------------------------------------------------------------------
 * The reference dequantizers below are written from the published block layouts, in GGML's own
 * loop shapes (the library indexes differently), with GGML's float operations in its order:
 * kvfence must give their bits exactly. */

static void ref_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

static void ref_q4_k(const uint8_t *blk, float *y)
{
    float d = kvf_fp16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
    float min = kvf_fp16_to_f32((uint16_t)(blk[2] | blk[3] << 8));
    const uint8_t *scales = blk + 4, *q = blk + 16;
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < 256; j += 64) {
        ref_scale_min(is + 0, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        ref_scale_min(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l)
            *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l)
            *y++ = d2 * (q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}

static void ref_q5_k(const uint8_t *blk, float *y)
{
    float d = kvf_fp16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
    float min = kvf_fp16_to_f32((uint16_t)(blk[2] | blk[3] << 8));
    const uint8_t *scales = blk + 4, *qh = blk + 16, *ql = blk + 48;
    int is = 0;
    uint8_t sc, m, u1 = 1, u2 = 2;
    for (int j = 0; j < 256; j += 64) {
        ref_scale_min(is + 0, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        ref_scale_min(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l)
            *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l)
            *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        is += 2;
        u1 <<= 2;
        u2 <<= 2;
    }
}

static void ref_q6_k(const uint8_t *blk, float *y)
{
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = kvf_fp16_to_f32((uint16_t)(blk[208] | blk[209] << 8));
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
            int is = l / 16;
            const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l + 0] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* A random finite half of moderate size (|h| in 2^-20 .. 2^4), the sign random. */
static uint16_t rand_half(struct kvf_rng *r)
{
    return (uint16_t)((kvf_rng_below(r, 2) << 15) | ((5 + kvf_rng_below(r, 19)) << 10) |
                      kvf_rng_below(r, 1024));
}

/* Random bytes in every quant and scale field, finite halves in the d fields: kvfence's values
 * equal the reference's bit for bit (two super-blocks per row, so the stride is checked). */
static void test_kquant_reference(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed() + 2);
    static const struct {
        uint32_t type;
        size_t bytes;
        void (*ref)(const uint8_t *, float *);
    } kinds[] = {{KVF_GGML_Q4_K, 144, ref_q4_k},
                 {KVF_GGML_Q5_K, 176, ref_q5_k},
                 {KVF_GGML_Q6_K, 210, ref_q6_k}};
    uint8_t blk[2 * 210];
    float want[512], got[512];
    for (size_t k = 0; k < KVF_ARRAY_LEN(kinds); k++)
        for (int iter = 0; iter < 2000; iter++) {
            for (size_t i = 0; i < sizeof blk; i++)
                blk[i] = (uint8_t)kvf_rng_next(&r);
            for (int b = 0; b < 2; b++) {
                uint8_t *p = blk + b * kinds[k].bytes;
                uint16_t h0 = rand_half(&r), h1 = rand_half(&r);
                if (kinds[k].type == KVF_GGML_Q6_K) {
                    p[208] = (uint8_t)h0, p[209] = (uint8_t)(h0 >> 8);
                } else {
                    p[0] = (uint8_t)h0, p[1] = (uint8_t)(h0 >> 8);
                    p[2] = (uint8_t)h1, p[3] = (uint8_t)(h1 >> 8);
                }
                kinds[k].ref(p, want + 256 * b);
            }
            memset(got, 0, sizeof got);
            ASSERT_OK(kvf_dequant_row(kinds[k].type, blk, got, 512));
            if (memcmp(got, want, sizeof got) != 0)
                KVF_FAIL("%s block %d differs from the reference",
                         kvf_ggml_type_name(kinds[k].type), iter);
        }
}

/* Blocks built by hand from the layout description, with values worked out on paper. */
static void test_kquant_layouts(void)
{
    float out[256];
    /* Q4_K: d = 1, dmin = 0.5. Sub-block 0: sc 2, m 3; sub-block 1: sc 1, m 0; sub-block 5:
     * sc 37 = 0b100101, m 58 = 0b111010 (their top two bits in bytes 1 and 5). */
    struct kvf_block_q4_k q4;
    memset(&q4, 0, sizeof q4);
    q4.d = 0x3c00, q4.dmin = 0x3800;
    q4.scales[0] = 2, q4.scales[4] = 3; /* j = 0 */
    q4.scales[1] = 1 | 2 << 6;          /* j = 1: sc 1; j = 5: sc's top bits 0b10 */
    q4.scales[5] = 0 | 3 << 6;          /* j = 1: m 0; j = 5: m's top bits 0b11 */
    q4.scales[9] = 5 | 10 << 4;         /* j = 5: sc low 0b0101, m low 0b1010 */
    q4.qs[0] = 0x7f;                    /* value 0: q 15; value 32: q 7 */
    q4.qs[3] = 0x30;                    /* value 3: q 0; value 35: q 3 */
    q4.qs[64 + 1] = 0x90;               /* value 128+32+1 (sub-block 5): q 9 */
    ASSERT_OK(kvf_dequant_row(KVF_GGML_Q4_K, &q4, out, 256));
    ASSERT_TRUE(out[0] == 2 * 15 - 1.5f && out[3] == -1.5f && out[1] == -1.5f);
    ASSERT_TRUE(out[32] == 7.0f && out[35] == 3.0f && out[33] == 0.0f);
    ASSERT_TRUE(out[161] == 37 * 9 - 29.0f && out[160] == -29.0f);
    uint8_t sc, m;
    kvf_kquant_scale_min(q4.scales, 5, &sc, &m);
    ASSERT_TRUE(sc == 37 && m == 58);
    /* Q5_K: the same scales; value 2 gets its 16s bit from bit 0 of qh[2], value 32+2 from
     * bit 1, value 64+2 (sub-block 2) from bit 2. */
    struct kvf_block_q5_k q5;
    memset(&q5, 0, sizeof q5);
    q5.d = 0x3c00, q5.dmin = 0x3800;
    memcpy(q5.scales, q4.scales, 12);
    q5.qs[2] = 0x21;  /* value 2: low 1; value 34: low 2 */
    q5.qh[2] = 1 | 2; /* both get +16 */
    ASSERT_OK(kvf_dequant_row(KVF_GGML_Q5_K, &q5, out, 256));
    ASSERT_TRUE(out[2] == 2 * 17 - 1.5f && out[34] == 18.0f && out[66] == 0.0f);
    /* Q6_K: d = 0.5; scales[0] = 4, scales[2] = -2, scales[15] = 127. */
    struct kvf_block_q6_k q6;
    memset(&q6, 0, sizeof q6);
    q6.d = 0x3800;
    q6.scales[0] = 4, q6.scales[2] = -2, q6.scales[15] = 127;
    q6.ql[0] = 0x0f;            /* value 0: low 15, value 64: low 0 */
    q6.qh[0] = 3 | 0 << 4;      /* value 0: high 3 → q 63 → +31; value 64: q 0 → -32 */
    q6.ql[32 + 5] = 0x01;       /* value 32+5 (sub-block 2): low 1, high 0 → q 1 → -31 */
    q6.ql[64 + 32 + 31] = 0xa0; /* value 128+96+31 (sub-block 15): high nibble 10 */
    q6.qh[32 + 31] = 2 << 6;    /* ... and bits 6-7: 2 → q 42 → +10 */
    ASSERT_OK(kvf_dequant_row(KVF_GGML_Q6_K, &q6, out, 256));
    ASSERT_TRUE(out[0] == 0.5f * 4 * 31 && out[1] == 0.5f * 4 * -32);
    ASSERT_TRUE(out[37] == 0.5f * -2 * -31 && out[255] == 0.5f * 127 * 10);
}

/* Quantize then dequantize seeded rows: the error of every value is within what the format can
 * do — half a step of its sub-block, plus the rounding of the scales (Q4_K, Q5_K: a step and a
 * min are each within half a unit of d or dmin, and the range is covered, so |err| ≤ step/2 +
 * dmin; Q6_K: a whole step, since the scale maps the largest |x| to -32 and a value of the
 * other sign as large clamps to +31, plus 32 times a sub-block scale's distance from its ideal,
 * within a unit of d (half a unit of rounding, or 128 clamped to 127): step + 32 · d). */
static void test_kquant_round_trip(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed() + 3);
    enum { N = 512 };
    float x[N], y[N];
    struct kvf_block_q4_k b4[N / 256];
    struct kvf_block_q5_k b5[N / 256];
    struct kvf_block_q6_k b6[N / 256];
    double worst[3] = {0, 0, 0};
    for (int iter = 0; iter < 300; iter++) {
        float scale = ldexpf(1.0f, (int)kvf_rng_below(&r, 16) - 8);
        float shift = iter % 3 == 0 ? scale * 0.5f : 0.0f; /* rows not centred on zero */
        for (int i = 0; i < N; i++)
            x[i] = shift + scale * ((float)kvf_rng_below(&r, 2000001) / 1e6f - 1.0f);
        if (iter == 1) memset(x, 0, sizeof x);
        if (iter == 2) memset(x + 32, 0, 64 * sizeof(float)); /* all-zero sub-blocks */
        kvf_quantize_row_q4_k(x, b4, N);
        kvf_quantize_row_q5_k(x, b5, N);
        kvf_quantize_row_q6_k(x, b6, N);
        for (int t = 0; t < 3; t++) {
            uint32_t type = t == 0 ? KVF_GGML_Q4_K : t == 1 ? KVF_GGML_Q5_K : KVF_GGML_Q6_K;
            const void *src = t == 0 ? (const void *)b4 : t == 1 ? (const void *)b5 : b6;
            ASSERT_OK(kvf_dequant_row(type, src, y, N));
            for (int sb = 0; sb < N / 256; sb++) {
                /* The per-super-block bound, from its own data. */
                double amax = 0, range_max = 0;
                for (int j = 0; j < 256; j += 32) {
                    double lo = 0, hi = 0;
                    for (int l = 0; l < 32; l++) {
                        double v = x[256 * sb + j + l];
                        lo = fmin(lo, v), hi = fmax(hi, v), amax = fmax(amax, fabs(v));
                    }
                    range_max = fmax(range_max, hi - lo);
                }
                double bound;
                if (t < 2) {
                    double levels = t == 0 ? 15 : 31, d = range_max / levels / 63, dmin = amax / 63;
                    bound = 0.5 * (range_max / levels + d) + dmin + 1e-6 * amax;
                } else {
                    double d = amax / 32 / 128;
                    bound = amax / 32 + 32 * d + 1e-6 * amax;
                }
                for (int i = 256 * sb; i < 256 * (sb + 1); i++) {
                    double e = fabs((double)y[i] - x[i]);
                    if (e > bound)
                        KVF_FAIL("%s row %d value %d: %g for %g, error %.3g > %.3g",
                                 kvf_ggml_type_name(type), iter, i, y[i], x[i], e, bound);
                    if (amax > 0 && e / amax > worst[t]) worst[t] = e / amax;
                }
            }
        }
    }
    printf("# worst |error| / block amax: Q4_K %.4f, Q5_K %.4f, Q6_K %.4f\n", worst[0], worst[1],
           worst[2]);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_kquant_reference),    KVF_CASE(test_kquant_layouts),
    KVF_CASE(test_kquant_round_trip),   KVF_CASE(test_fp16_exhaustive),
    KVF_CASE(test_fp16_nearest),        KVF_CASE(test_bf16),
    KVF_CASE(test_row_bytes_and_names), KVF_CASE(test_block_layouts),
    KVF_CASE(test_quantize_error),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
