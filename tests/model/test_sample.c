/*
 * test_sample.c — sampling: determinism, greedy ties, top-k and top-p semantics, and top-N
 * log-probabilities.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvf_test.h"
#include "kvfence/common.h"
#include "kvfence/model.h"

static void test_greedy(void)
{
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
    struct kvf_sample_params p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
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
    struct kvf_sample_params p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
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
    struct kvf_sample_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = kvf_test_seed()};
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
    struct kvf_sample_params p = {
        .temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .seed = kvf_test_seed()};
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
    struct kvf_sample_params ps[] = {{.temperature = 0.7f, .top_k = 0, .top_p = 1.0f, .seed = 3},
                                     {.temperature = 1.0f, .top_k = 40, .top_p = 1.0f, .seed = 4},
                                     {.temperature = 1.3f, .top_k = 0, .top_p = 0.8f, .seed = 5},
                                     {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 6}};
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

/* --- logit_bias and the penalties, against a reference written from vLLM's definition. ---- */

/* vLLM's apply_penalties, one token at a time: logit + bias; then, for a token in the prompt or
 * the output, a positive logit divided by the repetition penalty and a non-positive one
 * multiplied; then − frequency × its output count − presence if it is in the output. */
static void shape_ref(const float *l, uint32_t n, const struct kvf_sample_params *p,
                      const struct kvf_sample_hist *h, float *out)
{
    for (uint32_t t = 0; t < n; t++) {
        float x = l[t];
        for (uint32_t i = 0; i < p->n_logit_bias; i++)
            if (p->logit_bias[i].id == (int32_t)t) x += p->logit_bias[i].bias;
        bool in_prompt = false;
        uint32_t count = 0;
        for (uint32_t i = 0; i < h->n_prompt; i++)
            in_prompt |= h->prompt[i] == (int32_t)t;
        for (uint32_t i = 0; i < h->n_out; i++)
            count += h->out[i] == (int32_t)t;
        float rp = p->repetition_penalty > 0.0f ? p->repetition_penalty : 1.0f;
        if (in_prompt || count) x = x > 0.0f ? x / rp : x * rp;
        x -= p->frequency_penalty * (float)count;
        x -= p->presence_penalty * (count ? 1.0f : 0.0f);
        out[t] = x;
    }
}

/* A case worked by hand: logits {2, -2, 1, 0.5}, prompt {0}, output {1, 1}, repetition 2,
 * frequency 0.5, presence 0.25, bias +1 on token 3. */
static void test_penalties_by_hand(void)
{
    float l[4] = {2.0f, -2.0f, 1.0f, 0.5f}, out[4];
    uint32_t marks[4] = {0};
    int32_t prompt[1] = {0}, gen[2] = {1, 1};
    struct kvf_sample_hist h = {prompt, 1, gen, 2};
    struct kvf_sample_params p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.n_logit_bias = 1;
    p.logit_bias[0] = (struct kvf_logit_bias){3, 1.0f};
    kvf_sample_shape(l, 4, &p, &h, out, marks);
    ASSERT_NEAR(out[0], 1.0, 0);   /* in the prompt: 2 / 2 */
    ASSERT_NEAR(out[1], -5.25, 0); /* -2 × 2 − 0.5 × 2 − 0.25 */
    ASSERT_NEAR(out[2], 1.0, 0);   /* seen nowhere */
    ASSERT_NEAR(out[3], 1.5, 0);   /* biased */
    for (int i = 0; i < 4; i++)
        ASSERT_EQ_INT(marks[i], 0);
    /* kvf_sample sees no history: only the bias applies, and token 0 (2) beats token 3 (1.5). */
    ASSERT_EQ_INT(kvf_sample(l, 4, &p, 0), 0);
    void *scratch = calloc(1, kvf_sample_scratch_bytes(4));
    ASSERT_NOT_NULL(scratch);
    ASSERT_EQ_INT(kvf_sample_seq(l, 4, &p, &h, 0, scratch), 3);
    p.n_logit_bias = 0;
    ASSERT_EQ_INT(kvf_sample_seq(l, 4, &p, &h, 0, scratch), 0); /* 1.0 ties 1.0: lower id */
    ASSERT_EQ_INT(kvf_sample_seq(l, 4, &p, NULL, 0, scratch), 0);
    p.repetition_penalty = 4.0f; /* token 0: 0.5 < token 2's 1.0 */
    ASSERT_EQ_INT(kvf_sample_seq(l, 4, &p, &h, 0, scratch), 2);
    ASSERT_EQ_INT(kvf_sample_seq(l, 4, &p, NULL, 0, scratch), 0);
    free(scratch);
}

/* Random logits, histories and parameters: kvf_sample_shape equals the reference bit for bit,
 * leaves the marks zero, and the greedy and sampled tokens are the plain sampler's on the
 * reference's logits. */
static void test_shape_random(void)
{
    enum { V = 64 };
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    float l[V], want[V], got[V];
    uint32_t marks[V] = {0};
    int32_t prompt[40], gen[40];
    void *scratch = calloc(1, kvf_sample_scratch_bytes(V));
    ASSERT_NOT_NULL(scratch);
    static struct kvf_sample_params p;
    for (int round = 0; round < 2000; round++) {
        for (uint32_t i = 0; i < V; i++)
            l[i] = ((float)kvf_rng_below(&r, 2001) - 1000.0f) / 100.0f;
        uint32_t np = 1 + (uint32_t)kvf_rng_below(&r, 40), no = (uint32_t)kvf_rng_below(&r, 40);
        for (uint32_t i = 0; i < np; i++)
            prompt[i] = (int32_t)kvf_rng_below(&r, V / 2); /* repeats, and tokens never seen */
        for (uint32_t i = 0; i < no; i++)
            gen[i] = (int32_t)kvf_rng_below(&r, V / 2) + V / 4;
        memset(&p, 0, sizeof p);
        p.top_p = 1.0f;
        p.seed = kvf_rng_next(&r);
        p.temperature = round % 3 ? 0.9f : 0.0f;
        p.repetition_penalty = round % 4 ? 0.5f + (float)kvf_rng_below(&r, 300) / 100.0f : 0.0f;
        p.frequency_penalty = ((float)kvf_rng_below(&r, 401) - 200.0f) / 100.0f;
        p.presence_penalty = ((float)kvf_rng_below(&r, 401) - 200.0f) / 100.0f;
        p.n_logit_bias = (uint32_t)kvf_rng_below(&r, 5);
        for (uint32_t i = 0; i < p.n_logit_bias; i++)
            p.logit_bias[i] = (struct kvf_logit_bias){(int32_t)(i * 13 + kvf_rng_below(&r, 13)),
                                                      (float)kvf_rng_below(&r, 201) - 100.0f};
        struct kvf_sample_hist h = {prompt, np, gen, no};
        shape_ref(l, V, &p, &h, want);
        kvf_sample_shape(l, V, &p, &h, got, marks);
        ASSERT_MEMEQ(got, want, sizeof want);
        for (uint32_t i = 0; i < V; i++)
            ASSERT_EQ_INT(marks[i], 0);
        /* The draw on the shaped logits is the plain draw on the reference's. */
        struct kvf_sample_params plain = {
            .temperature = p.temperature, .top_k = 0, .top_p = 1.0f, .seed = p.seed};
        ASSERT_EQ_INT(kvf_sample_seq(l, V, &p, &h, (uint64_t)round, scratch),
                      kvf_sample(want, V, &plain, (uint64_t)round));
    }
    free(scratch);
}

/* logit_bias −100 keeps a token from being drawn, +100 makes it the only one drawn. */
static void test_logit_bias_extremes(void)
{
    float l[8] = {3.0f, 1.0f, 0.5f, 0.0f, -1.0f, 2.0f, 2.5f, -3.0f};
    struct kvf_sample_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = kvf_test_seed()};
    p.n_logit_bias = 1;
    p.logit_bias[0] = (struct kvf_logit_bias){0, -100.0f};
    for (uint64_t s = 0; s < 500; s++)
        ASSERT_TRUE(kvf_sample(l, 8, &p, s) != 0);
    p.logit_bias[0] = (struct kvf_logit_bias){7, 100.0f};
    for (uint64_t s = 0; s < 500; s++)
        ASSERT_EQ_INT(kvf_sample(l, 8, &p, s), 7);
    p.temperature = 0.0f;
    ASSERT_EQ_INT(kvf_sample(l, 8, &p, 0), 7);
    ASSERT_ERR(kvf_sample_with(l, 8, &p, 0, NULL), -EINVAL); /* shaping needs the scratch */
}

/* min_p keeps exactly the tokens whose probability is at least min_p × the likeliest's (at the
 * request's temperature), and 0 changes nothing. */
static void test_min_p(void)
{
    /* At T = 1, p_i / p_max = exp(l_i − 3): 1, e^-0.5 ≈ 0.61, e^-1 ≈ 0.37, e^-2 ≈ 0.14, ... */
    float l[6] = {3.0f, 2.5f, 2.0f, 1.0f, 0.0f, -5.0f};
    struct kvf_sample_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = kvf_test_seed()};
    int seen[6] = {0};
    p.min_p = 0.3f;
    for (uint64_t s = 0; s < 3000; s++)
        seen[kvf_sample(l, 6, &p, s)]++;
    ASSERT_TRUE(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
    ASSERT_EQ_INT(seen[3] + seen[4] + seen[5], 0);
    /* At T = 0.5 the ratios square: e^-1 ≈ 0.37 for token 1, e^-2 for token 2 (cut). */
    p.temperature = 0.5f;
    memset(seen, 0, sizeof seen);
    for (uint64_t s = 0; s < 3000; s++)
        seen[kvf_sample(l, 6, &p, s)]++;
    ASSERT_TRUE(seen[0] > 0 && seen[1] > 0);
    ASSERT_EQ_INT(seen[2] + seen[3] + seen[4] + seen[5], 0);
    /* min_p 1 keeps the likeliest alone; 0 draws what the plain sampler draws. */
    p.min_p = 1.0f;
    for (uint64_t s = 0; s < 200; s++)
        ASSERT_EQ_INT(kvf_sample(l, 6, &p, s), 0);
    struct kvf_sample_params off = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 9},
                             zero = off;
    zero.min_p = 0.0f;
    for (uint64_t s = 0; s < 200; s++)
        ASSERT_EQ_INT(kvf_sample(l, 6, &zero, s), kvf_sample(l, 6, &off, s));
    p.min_p = 1.5f;
    ASSERT_ERR(kvf_sample(l, 6, &p, 0), -EINVAL);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_scratch_and_logprob), KVF_CASE(test_greedy),
    KVF_CASE(test_greedy_long),         KVF_CASE(test_deterministic),
    KVF_CASE(test_top_k_top_p),         KVF_CASE(test_top_logprobs),
    KVF_CASE(test_penalties_by_hand),   KVF_CASE(test_shape_random),
    KVF_CASE(test_logit_bias_extremes), KVF_CASE(test_min_p),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
