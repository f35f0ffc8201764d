/* engine_internal.h — what the two worker loops share (internal to src/engine). */
#ifndef KVF_ENGINE_INTERNAL_H
#define KVF_ENGINE_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "kvfence/engine.h"
#include "kvfence/grammar.h"
#include "kvfence/model.h"
#include "kvfence/proto.h"
#include "kvfence/transport.h"

static inline uint64_t kvf__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Copies src into dst[cap], cut to fit and always NUL-terminated. */
static inline void kvf__strlcpy(char *dst, const char *src, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap && src[n])
        n++;
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i];
    if (cap) dst[n] = 0;
}

/* The sampling parameters of a request as kvf_sample takes them (top_p 0 means no cut). */
static inline struct kvf_sample_params kvf__sample_params(const struct kvf_msg_sampling *s)
{
    struct kvf_sample_params p = {.temperature = s->temperature,
                                  .top_k = s->top_k,
                                  .top_p = s->top_p > 0.0f ? s->top_p : 1.0f,
                                  .seed = s->seed};
    p.min_p = s->min_p;
    p.presence_penalty = s->presence_penalty;
    p.frequency_penalty = s->frequency_penalty;
    p.repetition_penalty = s->repetition_penalty;
    p.n_logit_bias = s->n_logit_bias;
    for (uint32_t i = 0; i < s->n_logit_bias && i < KVF_GEN_MAX_LOGIT_BIAS; i++)
        p.logit_bias[i] = s->logit_bias[i];
    return p;
}

/* What NEW and GRANT carry of a submitted request's parameters. */
static inline void kvf__msg_sampling_of(const struct kvf_gen_params *p, struct kvf_msg_sampling *s)
{
    const struct kvf_sample_params *q = &p->sample;
    *s = (struct kvf_msg_sampling){.temperature = q->temperature,
                                   .top_p = q->top_p,
                                   .top_k = q->top_k,
                                   .n_logprobs = p->n_logprobs,
                                   .seed = q->seed,
                                   .want_logprob = p->want_logprob || p->n_logprobs > 0};
    s->min_p = q->min_p;
    s->presence_penalty = q->presence_penalty;
    s->frequency_penalty = q->frequency_penalty;
    s->repetition_penalty = q->repetition_penalty;
    s->n_logit_bias = q->n_logit_bias;
    for (uint32_t i = 0; i < q->n_logit_bias && i < KVF_GEN_MAX_LOGIT_BIAS; i++)
        s->logit_bias[i] = q->logit_bias[i];
    s->grammar = p->n_grammar ? p->grammar : NULL;
    s->n_grammar = p->n_grammar;
}

/* --- Constrained decoding (constrain.c). ------------------------------------------------------ */

/* The compiled grammars of one worker's live requests, by text (owned by one loop thread). */
struct kvf__gram_ent {
    char *text; /* owned, n bytes */
    uint32_t n;
    kvf_grammar_t *g;
    uint32_t refs; /* live requests using it; 0: may be replaced */
};
struct kvf__gram_reg {
    struct kvf__gram_ent *e;
    uint32_t n, cap; /* cap: distinct grammars at most (the worker's live requests, and some) */
};
void kvf__gram_reg_init(struct kvf__gram_reg *r, uint32_t cap);
void kvf__gram_reg_free(struct kvf__gram_reg *r);
/* The compiled grammar of text[0..n), with a reference: 0, or the compile's error, -EBUSY
 * (every slot held), -ENOMEM. */
int kvf__gram_get(struct kvf__gram_reg *r, const char *text, uint32_t n, kvf_grammar_t **out);
/* Drops a reference; a grammar no request holds stays cached unless KVF__GRAM_IDLE others do. */
void kvf__gram_put(struct kvf__gram_reg *r, kvf_grammar_t *g);
#define KVF__GRAM_IDLE 8

/* One draw's constraint: the request's grammar and state, its stop ids, and the worker's
 * n_vocab-float buffer for the masked logits. */
struct kvf__constraint {
    kvf_grammar_t *g;
    const kvf_grammar_vocab_t *v;
    const struct kvf_grammar_state *s;
    const int32_t *stop_ids;
    uint32_t n_stop_ids;
    float *buf;
};
/* Masks logits into c->buf: INT_MIN when the draw should read c->buf, else the token to take
 * (a stop id at a dead end) or a negative error. */
int kvf__constrain(const struct kvf__constraint *c, const float *logits, uint32_t n_vocab);

/*
 * Samples token `step` of a request from logits and fills its logprob and, when asked, its top
 * logprobs (temperature 1, of the model's logits before logit_bias and the penalties, as vLLM
 * reports them by default). The prefill worker runs this for the first token and the decode
 * worker for the rest, so a request's tokens do not depend on which worker drew which. h: the
 * tokens the penalties see (the prompt; the output so far). c: the request's grammar (NULL:
 * none): the draw is among the tokens it allows. scratch:
 * kvf_sample_scratch_bytes(n_vocab) bytes, zeroed once (kvf_sample_seq), so nothing is
 * allocated per token. Returns the token or a negative code.
 */
int kvf__sample_token(const float *logits, uint32_t n_vocab, const struct kvf_msg_sampling *s,
                      const struct kvf__constraint *c, const struct kvf_sample_hist *h,
                      uint64_t step, void *scratch, float *logprob, uint32_t *n_top,
                      int32_t *top_ids, float *top_logprobs);

/* A wakeup channel: an eventfd another thread writes to get a loop out of poll. */
int kvf__wake_open(void);
void kvf__wake(int fd);
void kvf__wake_drain(int fd);

/*
 * Waits until the transport or the wake fd has input, or timeout_ms passes (-1 = forever). The
 * transport is armed first; when it has work pending already, returns at once.
 */
void kvf__loop_wait(kvf_xport_t *x, int wake_fd, int timeout_ms);

/* Takes and gives back the worker's compute locks (the process's mutex, then the file lock
 * shared with other processes), whichever the config has. */
void kvf__compute_enter(const struct kvf_worker_config *cfg);
void kvf__compute_leave(const struct kvf_worker_config *cfg);

/* Runs f over the fwd with the process's compute lock held (when there is one), so that two
 * workers in one process never run their thread pools at once on the same cores. */
int kvf__fwd_run_locked(const struct kvf_worker_config *cfg, kvf_fwd_t *f, kvf_pool_t *pool,
                        struct kvf_fwd_seq *seqs, uint32_t n_seqs);

/* Encodes m and sends it on c; returns 0 or a negative code. */
int kvf__send_msg(kvf_conn_t *c, const struct kvf_msg *m, uint8_t *buf, size_t cap);

/*
 * Why two HELLOs disagree, in words naming the field ("model fingerprint 0x... here, 0x... there"),
 * or "" when they agree (kvf_proto_hello_check's rule). Returns kvf_proto_hello_check's result.
 */
int kvf__hello_mismatch(const struct kvf_msg_hello *mine, const struct kvf_msg_hello *theirs,
                        char *why, size_t why_len);

/*
 * A generation handle's event queue: TOKEN events in order, then one END. One thread pushes (a
 * loop), any thread reads (kvf__evq_next, the seam's next). Pushing after END does nothing. When
 * notify_fd ≥ 0 every push also writes it (kvf__wake), so a thread serving many handles can
 * sleep until one of them has something.
 */
struct kvf__evq {
    pthread_mutex_t mu; /* also guards the owner's fields it says so of */
    pthread_cond_t cv;
    struct kvf_gen_event *ring; /* [cap] events not yet read */
    uint32_t head, n, cap;
    bool ended; /* END was pushed (after every TOKEN) */
    struct kvf_gen_event end_ev;
    int notify_fd;
};
void kvf__evq_init(struct kvf__evq *q, int notify_fd);
void kvf__evq_destroy(struct kvf__evq *q);
void kvf__evq_push(struct kvf__evq *q, const struct kvf_gen_event *ev);
/* 1 with *ev filled, 0 when nothing came within timeout_ms (-1 = forever); END repeats. */
int kvf__evq_next(struct kvf__evq *q, struct kvf_gen_event *ev, int timeout_ms);

/*
 * A generation handle (kvf_gen_t) as both engines make it: the decode worker's own seam
 * (decode_worker.c) and the router's (router.c). gen.c holds what the seam's calls do to a
 * handle; each engine adds only how it queues one and what its loop keeps.
 *
 * Each engine completes struct kvf_gen in its own file: KVF__GEN_FIELDS first, then its loop's
 * fields, as libuv's handles open with UV_HANDLE_FIELDS. gen.c completes it with the opening
 * alone, which is all it touches (the build has -fno-strict-aliasing; no file sees two
 * completions).
 *
 *   kvf__gen_submit ──▶ queued by the engine's admit (refs 2: the submitter's and the loop's)
 *        ──▶ the loop pushes TOKEN… END and drops its reference (kvf__gen_unref)
 *   the submitter: next…, cancel (sets cancel, wakes the loop), release (cancel, then drops
 *   its reference). The last reference frees the handle, whichever side drops it.
 */
#define KVF__GEN_FIELDS                                                                            \
    struct kvf__evq q;                                                                             \
    int refs;    /* under q.mu: the submitter's and the loop's */                                  \
    bool cancel; /* under q.mu: the submitter asked to end it */                                   \
    /* Fixed at submit. */                                                                         \
    struct kvf_gen_params p; /* p.prompt is prompt */                                              \
    int32_t *prompt;         /* owned: [p.n_prompt], then out's room */                            \
    int32_t *out; /* [p.max_tokens] after prompt when the sampler shapes the logits (penalties     \
                     read the output), else NULL: the decode loop's */                             \
    /* The engine's: set by its admit, under its mutex, then the loop's. */                        \
    uint64_t since_ms;    /* when it was queued */                                                 \
    struct kvf_gen *next; /* the engine's inbox, then its loop's lists */                          \
    int wake_fd;          /* fixed at submit: the engine's loop (which outlives its handles) */    \
    struct kvf_gen_prov *prov; /* under q.mu: the provenance once known (kvf__gen_set_prov) */

/*
 * Queues g on engine e, under e's mutex: 0 when queued (the loop will see it), or a negative
 * code with g on no list (-ESHUTDOWN, -EAGAIN). g's params are set; admit may adjust them.
 */
typedef int (*kvf__gen_admit_fn)(void *e, struct kvf_gen *g);

/*
 * The seam's submit for an engine whose vocabulary has n_vocab tokens and whose requests reach
 * at most max_context tokens: checks p (-EINVAL, KVF_E_PROTO_REJECTED), makes a handle of
 * gen_bytes (the engine's sizeof(struct kvf_gen), zeroed past the opening) with its own copy of
 * the prompt (-ENOMEM), lets admit queue it and wakes wake_fd (the engine's loop; the handle
 * keeps it for cancel and release). 0 with *out the handle; on
 * failure nothing is queued, nothing kept, *out untouched.
 */
int kvf__gen_submit(const struct kvf_gen_params *p, uint32_t n_vocab, uint64_t max_context,
                    size_t gen_bytes, kvf__gen_admit_fn admit, void *e, int wake_fd,
                    kvf_gen_t **out);
/* The seam's next, cancel and release, as both engines' ops tables hold them (e, the engine, is
 * not used: the handle knows its loop's wake fd). next reads the handle's event queue
 * (kvf__evq_next). cancel marks g cancelled and wakes the loop; idempotent. release: a release
 * before END is a cancel (the loop ends it through the protocol); then the submitter's
 * reference goes. */
int kvf__gen_next(void *e, kvf_gen_t *g, struct kvf_gen_event *ev, int timeout_ms);
void kvf__gen_cancel(void *e, kvf_gen_t *g);
void kvf__gen_release(void *e, kvf_gen_t *g);
/* For an admit: stamps g's since_ms with now_ms (the engine's clock: the transport's) and
 * appends it to the inbox *head..*tail (the engine's, under its mutex). */
void kvf__gen_enqueue(struct kvf_gen **head, struct kvf_gen **tail, struct kvf_gen *g,
                      uint64_t now_ms);
/* The loop's side: whether the submitter asked to end g. */
bool kvf__gen_cancelled(kvf_gen_t *g);
/* The loop's side: records g's provenance (copied; the first call wins), before it pushes the
 * first TOKEN, so a reader that saw a TOKEN finds it. No memory: none is kept. */
void kvf__gen_set_prov(kvf_gen_t *g, const struct kvf_gen_prov *prov);
/* The seam's prov (struct kvf_gen_ops): 1 with *out, 0 when none is known. */
int kvf__gen_prov(void *e, kvf_gen_t *g, struct kvf_gen_prov *out);
/* Fills pv's page list and digest from the prompt's pages and the checksums DONE carried
 * (checksums NULL: zeros, an unverified commit). */
void kvf__prov_pages(struct kvf_gen_prov *pv, const struct kvf_page_ref *pages,
                     const uint64_t *checksums, uint32_t n_pages);
/* Drops one reference; the last frees the queue, the prompt and g. */
void kvf__gen_unref(kvf_gen_t *g);

#endif
