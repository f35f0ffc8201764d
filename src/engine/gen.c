/*
 * gen.c — the generation handle (kvf_gen_t) as the decode worker's seam and the router's share
 * it: the checks of submit, the handle's making and freeing, next, cancel and release. Which
 * list a handle joins, and what its loop does with it, stay with each engine (its admit and its
 * loop). The life of a handle is drawn in engine_internal.h.
 *
 * Threads: any thread submits, reads, cancels and releases; the engine's loop pushes events and
 * drops its reference. refs and cancel are under the handle's q.mu. Work: submit copies the
 * prompt (O(n_prompt)); every other call is O(1).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "engine_internal.h"
#include "kvfence/limits.h"

/* The opening of every engine's handle: all this file touches (see engine_internal.h). */
struct kvf_gen {
    KVF__GEN_FIELDS
};

/* 0, or why the seam refuses p: -EINVAL (malformed), KVF_E_PROTO_REJECTED (too long). */
static int check_params(const struct kvf_gen_params *p, uint32_t n_vocab, uint64_t max_context)
{
    if (!p || !p->prompt || p->n_prompt == 0 || p->max_tokens == 0 ||
        p->n_logprobs > KVF_GEN_MAX_LOGPROBS || p->n_stop_ids > KVF_GEN_MAX_STOP_IDS ||
        !(p->sample.temperature >= 0.0f) || !(p->sample.top_p > 0.0f && p->sample.top_p <= 1.0f))
        return -EINVAL;
    for (uint32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || (uint32_t)p->prompt[i] >= n_vocab) return -EINVAL;
    const struct kvf_sample_params *s = &p->sample;
    if (!(s->min_p >= 0.0f && s->min_p <= 1.0f) || !(s->repetition_penalty >= 0.0f) ||
        !isfinite(s->repetition_penalty) || !isfinite(s->presence_penalty) ||
        !isfinite(s->frequency_penalty) || s->n_logit_bias > KVF_GEN_MAX_LOGIT_BIAS)
        return -EINVAL;
    for (uint32_t i = 0; i < s->n_logit_bias; i++)
        if (s->logit_bias[i].id < 0 || (uint32_t)s->logit_bias[i].id >= n_vocab ||
            (i > 0 && s->logit_bias[i].id <= s->logit_bias[i - 1].id) ||
            !(fabsf(s->logit_bias[i].bias) <= KVF_LIMIT_LOGIT_BIAS_MAX))
            return -EINVAL;
    /* A grammar ends the output with a stop id where the output is complete: it needs one. */
    if (p->n_grammar > KVF_GEN_MAX_GRAMMAR || (p->n_grammar && !p->grammar) ||
        (p->n_grammar && (p->ignore_eos || p->n_stop_ids == 0)))
        return -EINVAL;
    if ((uint64_t)p->n_prompt + p->max_tokens > max_context) return KVF_E_PROTO_REJECTED;
    return 0;
}

int kvf__gen_submit(const struct kvf_gen_params *p, uint32_t n_vocab, uint64_t max_context,
                    size_t gen_bytes, kvf__gen_admit_fn admit, void *e, int wake_fd,
                    kvf_gen_t **out)
{
    int rc = check_params(p, n_vocab, max_context);
    if (rc < 0) return rc;
    struct kvf_gen *g = calloc(1, gen_bytes);
    if (!g) return -ENOMEM;
    /* The output's room follows the prompt when the penalties will read it. */
    bool hist = kvf_sample_shapes_logits(&p->sample);
    /* The grammar's text, when there is one, follows in the same block. */
    size_t words = (size_t)p->n_prompt + (hist ? p->max_tokens : 0);
    g->prompt = malloc(words * sizeof(int32_t) + p->n_grammar);
    if (!g->prompt) {
        free(g);
        return -ENOMEM;
    }
    memcpy(g->prompt, p->prompt, p->n_prompt * sizeof(int32_t));
    g->p = *p;
    g->p.prompt = g->prompt;
    if (p->n_grammar) {
        char *text = (char *)(g->prompt + words);
        memcpy(text, p->grammar, p->n_grammar);
        g->p.grammar = text;
    } else {
        g->p.grammar = NULL;
    }
    g->out = hist ? g->prompt + p->n_prompt : NULL;
    g->refs = 2;
    g->wake_fd = wake_fd;
    kvf__evq_init(&g->q, -1);
    rc = admit(e, g);
    if (rc < 0) {
        g->refs = 1; /* never queued: the loop holds no reference */
        kvf__gen_unref(g);
        return rc;
    }
    kvf__wake(wake_fd);
    *out = g;
    return 0;
}

void kvf__gen_enqueue(struct kvf_gen **head, struct kvf_gen **tail, struct kvf_gen *g,
                      uint64_t now_ms)
{
    g->since_ms = now_ms;
    if (*tail)
        (*tail)->next = g;
    else
        *head = g;
    *tail = g;
}

int kvf__gen_next(void *e, kvf_gen_t *g, struct kvf_gen_event *ev, int timeout_ms)
{
    (void)e;
    return kvf__evq_next(&g->q, ev, timeout_ms);
}

void kvf__gen_cancel(void *e, kvf_gen_t *g)
{
    (void)e;
    pthread_mutex_lock(&g->q.mu);
    g->cancel = true;
    pthread_mutex_unlock(&g->q.mu);
    kvf__wake(g->wake_fd);
}

void kvf__gen_release(void *e, kvf_gen_t *g)
{
    kvf__gen_cancel(e, g);
    kvf__gen_unref(g);
}

bool kvf__gen_cancelled(kvf_gen_t *g)
{
    pthread_mutex_lock(&g->q.mu);
    bool c = g->cancel;
    pthread_mutex_unlock(&g->q.mu);
    return c;
}

void kvf__gen_unref(kvf_gen_t *g)
{
    pthread_mutex_lock(&g->q.mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->q.mu);
    if (left) return;
    kvf__evq_destroy(&g->q);
    free(g->prov);
    free(g->prompt);
    free(g);
}

void kvf__gen_set_prov(kvf_gen_t *g, const struct kvf_gen_prov *prov)
{
    struct kvf_gen_prov *c = malloc(sizeof *c);
    if (!c) return;
    *c = *prov;
    pthread_mutex_lock(&g->q.mu);
    if (!g->prov) {
        g->prov = c;
        c = NULL;
    }
    pthread_mutex_unlock(&g->q.mu);
    free(c);
}

int kvf__gen_prov(void *e, kvf_gen_t *g, struct kvf_gen_prov *out)
{
    (void)e;
    pthread_mutex_lock(&g->q.mu);
    int have = g->prov != NULL;
    if (have) *out = *g->prov;
    pthread_mutex_unlock(&g->q.mu);
    return have;
}

void kvf__prov_pages(struct kvf_gen_prov *pv, const struct kvf_page_ref *pages,
                     const uint64_t *checksums, uint32_t n_pages)
{
    uint64_t h = 0;
    pv->n_pages = n_pages;
    for (uint32_t i = 0; i < n_pages; i++) {
        uint64_t sum = checksums ? checksums[i] : 0;
        if (i < KVF_GEN_PROV_PAGES)
            pv->pages[i] = (struct kvf_gen_prov_page){pages[i].page, pages[i].tag, sum};
        uint8_t le[24];
        uint64_t v[3] = {pages[i].page, pages[i].tag, sum};
        for (int k = 0; k < 3; k++)
            for (int b = 0; b < 8; b++)
                le[k * 8 + b] = (uint8_t)(v[k] >> (8 * b));
        h = XXH3_64bits_withSeed(le, sizeof le, h);
    }
    pv->pages_digest = h;
}
