/*
 * test_sample.c — sampling: determinism, greedy ties, top-k and top-p semantics, and top-N
 * log-probabilities.
 */
#include <math.h>

#include "kvf_test.h"
#include "kvfence/common.h"
#include "kvfence/model.h"

static void test_greedy(void)
{
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
    struct kvf_sample_params p = {0.0f, 0, 1.0f, 1};
    ASSERT_EQ_INT(kvf_sample(l, 6, &p, 0), 1); /* lowest id among equal maxima */
    p.temperature = 0.8f;
    p.top_k = 1; /* top-k of one is greedy too */
    for (uint64_t s = 0; s < 50; s++)
        ASSERT_EQ_INT(kvf_sample(l, 6, &p, s), 1);
    p.top_p = 0.0f;
    ASSERT_ERR(kvf_sample(l, 6, &p, 0), -EINVAL);
    p.top_p = 1.0f;
    p.temperature = -1.0f;
    ASSERT_ERR(kvf_sample(l, 6, &p, 0), -EINVAL);
    ASSERT_ERR(kvf_sample(l, 0, &p, 0), -EINVAL);
}

/* "best = i whenever l[i] > l[best]": the definition the sampler's greedy pick must keep. */
static int32_t argmax_ref(const float *l, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

/* Greedy over long vectors (the two-pass form runs 16 lanes at a time) against the one-pass
 * definition: random lengths, few distinct values (ties across lanes), the maximum in the
 * tail, -0 beside +0, NaN in the middle (skipped) and first (nothing compares above it). */
static void test_greedy_long(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    struct kvf_sample_params p = {0.0f, 0, 1.0f, 1};
    static float l[1000];
    for (int round = 0; round < 400; round++) {
        uint32_t n = 1 + (uint32_t)kvf_rng_below(&r, 1000);
        for (uint32_t i = 0; i < n; i++)
            l[i] = (float)kvf_rng_below(&r, 7) - 3.0f;
        switch (round % 5) {
        case 1:
            l[n - 1] = 100.0f;
            break;
        case 2:
            for (uint32_t i = 0; i < n; i++)
                l[i] = i % 3 ? 0.0f : -0.0f;
            break;
        case 3:
            l[kvf_rng_below(&r, n)] = NAN;
            break;
        case 4:
            l[0] = NAN;
            break;
        default:
            break;
        }
        ASSERT_EQ_INT(kvf_sample(l, n, &p, 0), argmax_ref(l, n));
    }
}

static void test_deterministic(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    float l[100];
    for (int i = 0; i < 100; i++)
        l[i] = (float)(kvf_rng_below(&r, 1000)) / 300.0f;
    struct kvf_sample_params p = {1.0f, 0, 1.0f, kvf_test_seed()};
    int first[64], distinct = 0;
    for (uint64_t s = 0; s < 64; s++) {
        first[s] = kvf_sample(l, 100, &p, s);
        ASSERT_TRUE(first[s] >= 0 && first[s] < 100);
    }
    for (uint64_t s = 0; s < 64; s++)
        ASSERT_EQ_INT(kvf_sample(l, 100, &p, s), first[s]);
    for (uint64_t s = 1; s < 64; s++)
        distinct += first[s] != first[0];
    ASSERT_TRUE(distinct > 0); /* draws differ between steps */
    /* Another seed gives another stream. */
    p.seed ^= 0x5555;
    int same = 0;
    for (uint64_t s = 0; s < 64; s++)
        same += kvf_sample(l, 100, &p, s) == first[s];
    ASSERT_LT_INT(same, 32);
}

/* probabilities 0.5, 0.3, 0.15, 0.05 (logits are their logs, temperature 1). */
static void test_top_k_top_p(void)
{
    float l[4] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)}; /* ids 1 > 3 > 0 > 2 */
    struct kvf_sample_params p = {1.0f, 2, 1.0f, kvf_test_seed()};
    int count[4] = {0};
    for (uint64_t s = 0; s < 4000; s++)
        count[kvf_sample(l, 4, &p, s)]++;
    ASSERT_EQ_INT(count[0] + count[2], 0); /* top-2 keeps ids 1 and 3 only */
    ASSERT_NEAR(count[1] / 4000.0, 0.5 / 0.8, 0.04);
    p.top_k = 0;
    p.top_p = 0.75f; /* 0.5 + 0.3 ≥ 0.75: ids 1 and 3 */
    memset(count, 0, sizeof(count));
    for (uint64_t s = 0; s < 4000; s++)
        count[kvf_sample(l, 4, &p, s)]++;
    ASSERT_EQ_INT(count[0] + count[2], 0);
    ASSERT_TRUE(count[3] > 0);
    p.top_p = 0.5f; /* the first token alone reaches 0.5 */
    for (uint64_t s = 0; s < 200; s++)
        ASSERT_EQ_INT(kvf_sample(l, 4, &p, s), 1);
    p.top_p = 0.9f; /* 0.5 + 0.3 + 0.15 */
    memset(count, 0, sizeof(count));
    for (uint64_t s = 0; s < 4000; s++)
        count[kvf_sample(l, 4, &p, s)]++;
    ASSERT_EQ_INT(count[2], 0);
    ASSERT_TRUE(count[0] > 0);
    /* Plain temperature 1: frequencies follow the probabilities. */
    p.top_p = 1.0f;
    memset(count, 0, sizeof(count));
    for (uint64_t s = 0; s < 8000; s++)
        count[kvf_sample(l, 4, &p, s)]++;
    ASSERT_NEAR(count[1] / 8000.0, 0.5, 0.03);
    ASSERT_NEAR(count[3] / 8000.0, 0.3, 0.03);
    ASSERT_NEAR(count[0] / 8000.0, 0.15, 0.03);
    ASSERT_NEAR(count[2] / 8000.0, 0.05, 0.02);
    /* A low temperature sharpens toward the argmax. */
    p.temperature = 0.1f;
    memset(count, 0, sizeof(count));
    for (uint64_t s = 0; s < 2000; s++)
        count[kvf_sample(l, 4, &p, s)]++;
    ASSERT_TRUE(count[1] > 1950);
}

static void test_top_logprobs(void)
{
    float l[5] = {1.0f, 3.0f, 3.0f, -2.0f, 0.0f};
    int32_t ids[8];
    float lp[8];
    ASSERT_EQ_INT(kvf_sample_top_logprobs(l, 5, 3, ids, lp), 3);
    ASSERT_EQ_INT(ids[0], 1);
    ASSERT_EQ_INT(ids[1], 2);
    ASSERT_EQ_INT(ids[2], 0);
    double z = exp(1.0) + 2 * exp(3.0) + exp(-2.0) + exp(0.0);
    ASSERT_NEAR(lp[0], 3.0 - log(z), 1e-6);
    ASSERT_NEAR(lp[2], 1.0 - log(z), 1e-6);
    ASSERT_EQ_INT(kvf_sample_top_logprobs(l, 5, 8, ids, lp), 5);
    ASSERT_EQ_INT(ids[4], 3);
    double total = 0;
    for (int i = 0; i < 5; i++)
        total += exp(lp[i]);
    ASSERT_NEAR(total, 1.0, 1e-5);
}

/* The caller's scratch gives the same tokens as kvf_sample's own allocation, and the token's
 * logprob equals the one kvf_sample_top_logprobs lists for it. */
static void test_scratch_and_logprob(void)
{
    enum { V = 5000 };
    static float l[V];
    uint64_t x = 12345;
    for (int i = 0; i < V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        l[i] = (float)(x % 20000) / 1000.0f - 10.0f;
    }
    void *scratch = malloc(kvf_sample_scratch_bytes(V));
    ASSERT_NOT_NULL(scratch);
    struct kvf_sample_params ps[] = {
        {0.7f, 0, 1.0f, 3}, {1.0f, 40, 1.0f, 4}, {1.3f, 0, 0.8f, 5}, {0.0f, 0, 1.0f, 6}};
    for (size_t k = 0; k < KVF_ARRAY_LEN(ps); k++)
        for (uint64_t step = 0; step < 50; step++)
            ASSERT_EQ_INT(kvf_sample_with(l, V, &ps[k], step, scratch),
                          kvf_sample(l, V, &ps[k], step));
    ASSERT_ERR(kvf_sample_with(l, V, &ps[0], 0, NULL), -EINVAL);
    int32_t ids[3];
    float lps[3];
    ASSERT_EQ_INT(kvf_sample_top_logprobs(l, V, 3, ids, lps), 3);
    for (int k = 0; k < 3; k++) {
        float a = kvf_sample_logprob(l, V, ids[k]);
        ASSERT_MEMEQ(&a, &lps[k], sizeof(a));
    }
    free(scratch);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_scratch_and_logprob), KVF_CASE(test_greedy),      KVF_CASE(test_greedy_long),
    KVF_CASE(test_deterministic),       KVF_CASE(test_top_k_top_p), KVF_CASE(test_top_logprobs),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
