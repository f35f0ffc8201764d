/* Quantization helpers: exhaustive half-precision round trips, rounding at the edges, block
 * layouts checked against hand-built bytes, and quantization error bounds on random rows. */
#include "kvf_test.h"

#include "kvfence/common.h"
#include "kvfence/quant.h"

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
    ASSERT_ERR(kvf_quant_row_bytes(12, 256, &n), KVF_E_MODEL_UNSUPPORTED);
    ASSERT_ERR(kvf_quant_row_bytes(KVF_GGML_F32, 1ull << 63, &n), -EOVERFLOW);
    ASSERT_STREQ(kvf_ggml_type_name(12), "Q4_K");
    ASSERT_STREQ(kvf_ggml_type_name(30), "BF16");
    ASSERT_STREQ(kvf_ggml_type_name(1000), "unknown");
    ASSERT_STREQ(kvf_ggml_type_name(4), "unknown");
    ASSERT_TRUE(kvf_ggml_type_supported(KVF_GGML_Q4_0));
    ASSERT_FALSE(kvf_ggml_type_supported(12));
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
    ASSERT_ERR(kvf_dequant_row(12, q4, out, 32), KVF_E_MODEL_UNSUPPORTED);
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

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_fp16_exhaustive),     KVF_CASE(test_fp16_nearest),  KVF_CASE(test_bf16),
    KVF_CASE(test_row_bytes_and_names), KVF_CASE(test_block_layouts), KVF_CASE(test_quantize_error),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
