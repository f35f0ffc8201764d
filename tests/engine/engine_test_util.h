/*
 * engine_test_util.h — what the engine tests share: a request run alone through the forward
 * pass, exactly as `kvfence run` does, to compare served tokens with.
 */
#ifndef KVF_ENGINE_TEST_UTIL_H
#define KVF_ENGINE_TEST_UTIL_H

#include "kvf_test.h"
#include "kvfence/engine.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"

/*
 * The request p alone: its own pool of ctx / pt pages, the prompt in one call, then one token
 * at a time, each drawn with p's sampling at its output index; stops after a stop id or
 * max_tokens. Writes the tokens to out[] (and, with top3, each step's three most likely ids)
 * and returns how many; *stopped (may be NULL) says whether a stop id ended it.
 */
static inline uint32_t solo_run(const kvf_model_t *m, uint32_t pt, uint32_t ctx,
                                const struct kvf_gen_params *p, int32_t *out, int32_t (*top3)[3],
                                bool *stopped)
{
    uint32_t n_vocab = kvf_model_hparams(m)->n_vocab, n_pages = ctx / pt, n = 0;
    struct kvf_pool_config pc = {.n_pages = n_pages, .max_peers = 1, .tag_seed = 1};
    kvf_model_geometry(m, pt, &pc.geo);
    kvf_pool_t *pool;
    ASSERT_OK(kvf_pool_create(&pc, &pool));
    struct kvf_page_ref *pages = malloc(n_pages * sizeof(*pages));
    ASSERT_NOT_NULL(pages);
    struct kvf_owner own = {{9, 9}, 1};
    ASSERT_OK(kvf_pool_alloc(pool, &own, KVF_HOLDER_SEQ, n_pages, false, pages));
    struct kvf_fwd_config fc = {1, ctx, 1, NULL, 0};
    kvf_fwd_t *f;
    ASSERT_OK(kvf_fwd_create(m, &fc, &f));
    float *logits = malloc(n_vocab * sizeof(float));
    ASSERT_NOT_NULL(logits);
    int32_t cur = 0;
    uint32_t pos = 0;
    if (stopped) *stopped = false;
    for (uint32_t step = 0; step < p->max_tokens; step++) {
        struct kvf_fwd_seq s = {own.req,
                                step == 0 ? p->prompt : &cur,
                                step == 0 ? p->n_prompt : 1,
                                pos,
                                pages,
                                n_pages,
                                logits,
                                0};
        ASSERT_EQ_INT(kvf_fwd_run(f, pool, &s, 1), 1);
        ASSERT_OK(s.status);
        pos += s.n_tokens;
        cur = kvf_sample(logits, n_vocab, &p->sample, step);
        ASSERT_TRUE(cur >= 0);
        if (top3) {
            float lps[3];
            ASSERT_EQ_INT(kvf_sample_top_logprobs(logits, n_vocab, 3, top3[n], lps), 3);
        }
        out[n++] = cur;
        bool stop = false;
        for (uint32_t k = 0; k < p->n_stop_ids; k++)
            stop |= p->stop_ids[k] == cur;
        if (stop) {
            if (stopped) *stopped = true;
            break;
        }
    }
    free(logits);
    free(pages);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    return n;
}

#endif
