/*
 * sample.c — choosing the next token from logits, and top-N log-probabilities.
 *
 * Determinism: the only randomness is one uniform draw per step, made from (seed, step) by a
 * counter-based generator (splitmix64 of seed ⊕ a step hash), so a request's tokens depend on
 * its seed and logits alone — not on what else ran, nor on how many draws came before. Ordering
 * ties are broken by token id, and the probabilities are accumulated in double in a fixed order.
 *
 * Before the draw, kvf_sample_shape applies logit_bias and the penalties to a copy of the logits,
 * in vLLM's order and float arithmetic (kvfence/gen.h lists it): the penalties read only the
 * request's own history, so they too depend on nothing another request does.
 *
 * The scratch, n = n_vocab:  struct cand [n] | double [n] (probabilities) | float [n] (the shaped
 * logits) | uint32_t [n] (marks: zero between calls).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/common.h"
#include "kvfence/model.h"

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A uniform double in [0, 1) for (seed, step). */
static double uniform(uint64_t seed, uint64_t step)
{
    uint64_t r = splitmix64(seed ^ splitmix64(step + 0x632BE59BD9B4E019ull));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

struct cand {
    float logit;
    int32_t id;
};

/* Higher logit first; lower id first among equals — a total order, so qsort's result is
 * unique whatever its algorithm. */
static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/*
 * The first index of the largest logit: the result of "best = i whenever l[i] > l[best]" over
 * i = 1..n-1, in two passes the compiler can vectorize. The first finds the largest value
 * with 16 running maxima (max is exact, so the order does not matter); "a > m ? a : m"
 * skips a NaN as the comparison does. The second finds that value's first index. If l[0] is
 * NaN, nothing compares above it: the maximum stays NaN, equals nothing, and the answer is 0,
 * as in the one-pass form. (A greedy step over 49152 logits: 33 -> 10 us.)
 */
#define ARGMAX_LANES 16
static int32_t argmax(const float *l, uint32_t n)
{
    float m[ARGMAX_LANES];
    for (int k = 0; k < ARGMAX_LANES; k++)
        m[k] = l[0];
    uint32_t i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int k = 0; k < ARGMAX_LANES; k++)
            m[k] = l[i + k] > m[k] ? l[i + k] : m[k];
    float mx = l[0];
    for (int k = 0; k < ARGMAX_LANES; k++)
        mx = m[k] > mx ? m[k] : mx;
    for (; i < n; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (i = 0; i < n; i++)
        if (l[i] == mx) return (int32_t)i;
    return 0;
}

size_t kvf_sample_scratch_bytes(uint32_t n_vocab)
{
    return (size_t)n_vocab *
           (sizeof(struct cand) + sizeof(double) + sizeof(float) + sizeof(uint32_t));
}

static float *shaped_of(void *scratch, uint32_t n_vocab)
{
    return (float *)((char *)scratch + (size_t)n_vocab * (sizeof(struct cand) + sizeof(double)));
}

static uint32_t *marks_of(void *scratch, uint32_t n_vocab)
{
    return (uint32_t *)(shaped_of(scratch, n_vocab) + n_vocab);
}

static bool repetition_on(const struct kvf_sample_params *p)
{
    return p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f;
}

bool kvf_sample_shapes_logits(const struct kvf_sample_params *p)
{
    return p->n_logit_bias > 0 || repetition_on(p) || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

/* A mark: bit 31 says the token is in the prompt or the output (repetition), the rest count
 * its occurrences in the output (frequency, presence). An output holds < 2^31 tokens. */
#define MARK_SEEN 0x80000000u

/* The penalties of one token t whose mark is m (m != 0). */
static float penalize(const struct kvf_sample_params *p, float x, uint32_t m)
{
    if (repetition_on(p)) x = x > 0.0f ? x / p->repetition_penalty : x * p->repetition_penalty;
    uint32_t count = m & ~MARK_SEEN;
    x -= p->frequency_penalty * (float)count;
    x -= p->presence_penalty * (count ? 1.0f : 0.0f);
    return x;
}

void kvf_sample_shape(const float *logits, uint32_t n_vocab, const struct kvf_sample_params *p,
                      const struct kvf_sample_hist *h, float *dst, uint32_t *marks)
{
    memcpy(dst, logits, (size_t)n_vocab * sizeof *dst);
    uint32_t nb =
        p->n_logit_bias < KVF_GEN_MAX_LOGIT_BIAS ? p->n_logit_bias : KVF_GEN_MAX_LOGIT_BIAS;
    for (uint32_t i = 0; i < nb; i++)
        if (p->logit_bias[i].id >= 0 && (uint32_t)p->logit_bias[i].id < n_vocab)
            dst[p->logit_bias[i].id] += p->logit_bias[i].bias;
    if (!h) return;
    /* Mark every token the penalties see, then penalize each marked token once, clearing its
     * mark: the marks end as they began, all zero, in O(n_prompt + n_out). */
    bool rep = repetition_on(p);
    for (uint32_t i = 0; rep && i < h->n_prompt; i++)
        if (h->prompt[i] >= 0 && (uint32_t)h->prompt[i] < n_vocab) marks[h->prompt[i]] |= MARK_SEEN;
    for (uint32_t i = 0; i < h->n_out; i++)
        if (h->out[i] >= 0 && (uint32_t)h->out[i] < n_vocab)
            marks[h->out[i]] = (marks[h->out[i]] + 1) | MARK_SEEN;
    for (uint32_t k = 0; k < 2; k++) {
        const int32_t *ids = k ? h->out : h->prompt;
        uint32_t n = k ? h->n_out : h->n_prompt;
        for (uint32_t i = 0; i < n; i++) {
            int32_t t = ids[i];
            if (t < 0 || (uint32_t)t >= n_vocab || !marks[t]) continue;
            dst[t] = penalize(p, dst[t], marks[t]);
            marks[t] = 0;
        }
    }
}

int kvf_sample(const float *logits, uint32_t n_vocab, const struct kvf_sample_params *p,
               uint64_t step)
{
    if (!logits || !p || n_vocab == 0 || n_vocab > INT32_MAX) return -EINVAL;
    if ((p->temperature == 0.0f || p->top_k == 1) && !kvf_sample_shapes_logits(p))
        return kvf_sample_with(logits, n_vocab, p, step, NULL);
    void *scratch = calloc(1, kvf_sample_scratch_bytes(n_vocab));
    if (!scratch) return -ENOMEM;
    int tok = kvf_sample_with(logits, n_vocab, p, step, scratch);
    free(scratch);
    return tok;
}

int kvf_sample_with(const float *logits, uint32_t n_vocab, const struct kvf_sample_params *p,
                    uint64_t step, void *scratch)
{
    return kvf_sample_seq(logits, n_vocab, p, NULL, step, scratch);
}

static bool params_ok(const struct kvf_sample_params *p)
{
    return p->temperature >= 0.0f && p->top_p > 0.0f && p->top_p <= 1.0f && p->min_p >= 0.0f &&
           p->min_p <= 1.0f && p->repetition_penalty >= 0.0f && isfinite(p->repetition_penalty) &&
           isfinite(p->presence_penalty) && isfinite(p->frequency_penalty) &&
           p->n_logit_bias <= KVF_GEN_MAX_LOGIT_BIAS;
}

int kvf_sample_seq(const float *logits, uint32_t n_vocab, const struct kvf_sample_params *p,
                   const struct kvf_sample_hist *h, uint64_t step, void *scratch)
{
    if (!logits || !p || n_vocab == 0 || n_vocab > INT32_MAX || !params_ok(p)) return -EINVAL;
    if (kvf_sample_shapes_logits(p)) {
        if (!scratch) return -EINVAL;
        float *shaped = shaped_of(scratch, n_vocab);
        kvf_sample_shape(logits, n_vocab, p, h, shaped, marks_of(scratch, n_vocab));
        logits = shaped;
    }
    if (p->temperature == 0.0f || p->top_k == 1) return argmax(logits, n_vocab);
    if (!scratch) return -EINVAL;
    /* The scratch: candidates, then their probabilities (doubles after 8-byte structs). */
    struct cand *c = scratch;
    double *pr = (double *)(c + n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++) {
        c[i].logit = logits[i];
        c[i].id = (int32_t)i;
    }
    uint32_t n = n_vocab;
    bool sorted = p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0.0f;
    if (sorted) qsort(c, n, sizeof(*c), cand_cmp);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;

    /* Softmax over the candidates at temperature T, in double, in candidate order. */
    float mx = c[0].logit;
    if (!sorted)
        for (uint32_t i = 1; i < n; i++)
            if (c[i].logit > mx) mx = c[i].logit;
    double sum = 0.0, inv_t = 1.0 / p->temperature;
    for (uint32_t i = 0; i < n; i++) {
        pr[i] = exp(((double)c[i].logit - mx) * inv_t);
        sum += pr[i];
    }
    /* min_p: pr[i] is the candidate's probability over the likeliest's (pr[0] = 1, sorted), so
     * the cut keeps the prefix with pr[i] ≥ min_p. (A top_k cut first changes nothing: both
     * keep a prefix of the same order.) */
    if (p->min_p > 0.0f) {
        uint32_t keep = 1;
        while (keep < n && pr[keep] >= p->min_p)
            keep++;
        n = keep;
        sum = 0.0;
        for (uint32_t i = 0; i < n; i++)
            sum += pr[i];
    }
    /* Nucleus: the smallest prefix (most likely first) whose mass reaches top_p. */
    if (p->top_p < 1.0f) {
        double cum = 0.0, want = p->top_p * sum;
        uint32_t keep = 0;
        while (keep < n) {
            cum += pr[keep++];
            if (cum >= want) break;
        }
        n = keep;
        sum = cum;
    }
    double u = uniform(p->seed, step) * sum, cum = 0.0;
    int32_t tok = c[n - 1].id;
    for (uint32_t i = 0; i < n; i++) {
        cum += pr[i];
        if (u < cum) {
            tok = c[i].id;
            break;
        }
    }
    return tok;
}

/* log Σ exp(logits), in double, in index order, around the largest logit. */
static double log_sum_exp(const float *logits, uint32_t n_vocab)
{
    float mx = logits[argmax(logits, n_vocab)];
    double sum = 0.0;
    for (uint32_t i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

float kvf_sample_logprob(const float *logits, uint32_t n_vocab, int32_t tok)
{
    if (!logits || n_vocab == 0 || tok < 0 || (uint32_t)tok >= n_vocab) return NAN;
    return (float)((double)logits[tok] - log_sum_exp(logits, n_vocab));
}

int kvf_sample_top_logprobs(const float *logits, uint32_t n_vocab, uint32_t top_n, int32_t *ids,
                            float *logprobs)
{
    if (!logits || n_vocab == 0 || n_vocab > INT32_MAX || (top_n && (!ids || !logprobs)))
        return -EINVAL;
    double lse = log_sum_exp(logits, n_vocab);
    if (top_n > n_vocab) top_n = n_vocab;
    /* One scan keeping the best top_n so far in order (insertion): O(n_vocab) for most
     * tokens, O(n_vocab × top_n) at worst. Scanning in id order and moving only past strictly
     * smaller logits keeps the lower id first among equals. */
    uint32_t have = 0;
    for (uint32_t i = 0; i < n_vocab && top_n > 0; i++) {
        if (have == top_n && !(logits[i] > logits[ids[have - 1]])) continue;
        uint32_t at = have < top_n ? have++ : top_n - 1;
        while (at > 0 && logits[i] > logits[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = (int32_t)i;
    }
    for (uint32_t k = 0; k < top_n; k++)
        logprobs[k] = (float)((double)logits[ids[k]] - lse);
    return (int)top_n;
}
