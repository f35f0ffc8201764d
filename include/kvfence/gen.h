/*
 * kvfence/gen.h — the generation seam: what the router's HTTP face (src/server) sees of an
 * engine. Types only, no code: the engines behind it are in kvfence/engine.h (a decode worker,
 * or the router over decode workers in other processes), and the server's tests plug in a fake.
 * It depends on kvfence/common.h alone, so the server reaches neither the model nor the workers;
 * the sampler (kvf_sample, kvfence/model.h) reads the sampling parameters a request carries.
 *
 * The router (src/server) sees an engine only through struct kvf_gen_ops: it submits a tokenized,
 * validated request and reads the request's events (one per generated token, then one END) until
 * the end. Everything about pages, grants and transfers stays behind the seam; the router never
 * tears a transfer down itself — a cancel is a request to the decode worker, which ends the
 * request through the protocol.
 *
 * One generation, as the router sees it:
 *
 *     submit ──▶ (queued) ──▶ prefill, handoff ──▶ TOKEN, TOKEN, ... ──▶ END(err)
 *        │                                                            ▲
 *        └── cancel (any time): END(KVF_E_PROTO_CANCELLED) comes, ────┘
 *            possibly after TOKEN events already queued
 *
 * The handle stays valid until release, which the router calls exactly once, after it read END
 * or after cancel (release after cancel without reading END is allowed: the engine finishes the
 * request's protocol ending on its own and frees the handle then).
 *
 * Threading: submit, next, cancel and release may be called from any thread, concurrently for
 * different handles; one handle is used by one thread at a time.
 */
#ifndef KVFENCE_GEN_H
#define KVFENCE_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/common.h"

#define KVF_GEN_MAX_LOGIT_BIAS 300 /* logit_bias entries per request at most */

/* One logit_bias entry: bias is added to token id's logit before anything else. */
struct kvf_logit_bias {
    int32_t id; /* < n_vocab */
    float bias; /* [-100, 100] */
};

/*
 * How the next token is drawn (kvf_sample, kvfence/model.h). The logits pass, in this order (as
 * vLLM's sampler does): + logit_bias → repetition penalty (every token of the prompt and of the
 * output so far: a positive logit divided by it, a negative one multiplied) → − frequency_penalty
 * × the token's count in the output − presence_penalty if it is in the output → greedy, or
 * temperature → min_p → top_k → top_p → the draw. The fields after seed are all zero when unused
 * (so a positional initializer of the first four leaves them off).
 */
struct kvf_sample_params {
    float temperature;        /* 0 = greedy (lowest id among equal maxima) */
    uint32_t top_k;           /* 0 = no top-k cut */
    float top_p;              /* in (0, 1]; 1 = no nucleus cut */
    uint64_t seed;            /* with the step number, fixes every draw */
    float min_p;              /* [0, 1]: drop tokens below min_p × the likeliest's probability */
    float presence_penalty;   /* [-2, 2], output tokens only; 0 = off */
    float frequency_penalty;  /* [-2, 2], output tokens only; 0 = off */
    float repetition_penalty; /* > 0, prompt and output tokens; 0 and 1 = off */
    uint32_t n_logit_bias;    /* entries in logit_bias, ≤ KVF_GEN_MAX_LOGIT_BIAS */
    struct kvf_logit_bias logit_bias[KVF_GEN_MAX_LOGIT_BIAS]; /* distinct ids, ascending */
};

#define KVF_GEN_MAX_LOGPROBS 20   /* top logprobs per token at most (the OpenAI API's bound) */
#define KVF_GEN_MAX_GRAMMAR  8192 /* grammar bytes per request (KVF_GRAMMAR_MAX_BYTES) */
#define KVF_GEN_MAX_STOP_IDS 8    /* end-of-generation token ids per request */

/* What one request asks of the engine. Arrays are borrowed for the submit call only. */
struct kvf_gen_params {
    uint32_t tenant;
    const int32_t *prompt; /* [n_prompt] token ids, each < n_vocab; BOS included if wanted */
    uint32_t n_prompt;     /* ≥ 1 */
    uint32_t max_tokens;   /* ≥ 1 output tokens at most */
    struct kvf_sample_params sample;
    uint32_t n_logprobs; /* 0 = none; else that many top logprobs per token (≤ 20), plus the
                            sampled token's own logprob */
    bool want_logprob;   /* the sampled token's logprob, even with n_logprobs 0 */
    int32_t stop_ids[KVF_GEN_MAX_STOP_IDS]; /* generation ends after emitting one of these */
    uint32_t n_stop_ids;                    /* ignored (treated as 0) when ignore_eos */
    bool ignore_eos;
    /* Constrained decoding (kvfence/grammar.h): GBNF text every output must match, or NULL.
     * Each token is drawn from those that keep the output within it, and a stop id only where
     * the output is a complete sentence; needs n_stop_ids ≥ 1 and not ignore_eos. */
    const char *grammar;
    uint32_t n_grammar; /* ≤ KVF_GEN_MAX_GRAMMAR */
};

enum kvf_gen_event_kind {
    KVF_GEN_TOKEN = 1, /* one generated token */
    KVF_GEN_END = 2,   /* the request ended: err 0 = finished (a stop id or max_tokens) */
};

struct kvf_gen_event {
    enum kvf_gen_event_kind kind;
    int32_t token;  /* TOKEN */
    float logprob;  /* TOKEN: natural log probability of `token` (temperature 1) */
    uint32_t n_top; /* TOKEN: entries in top_ids / top_logprobs */
    int32_t top_ids[KVF_GEN_MAX_LOGPROBS];
    float top_logprobs[KVF_GEN_MAX_LOGPROBS];
    int err;      /* END: 0, or a negative kvfence code saying why it failed (the
                     HTTP answer of each: kvf__srv_engine_error, docs/SERVER.md) */
    bool stopped; /* END with err 0: true if a stop id ended it, false if max_tokens */
};

/*
 * Provenance: which pages a generation read and what decode verified of them before it read a
 * byte. The decode worker fills it when the handoff is verified and committed (before the first
 * token is pushed); ids and numbers only, never content. Fixed size: the first
 * KVF_GEN_PROV_PAGES pages are listed, and pages_digest covers every page (a chain in grant
 * order: h = 0, then h = XXH3-64 with seed h of each page's (page, tag, checksum) as three
 * little-endian u64), so a record of a long prompt still pins every page. docs/SERVER.md,
 * "Provenance".
 */
#define KVF_PREFILL_HOST_MAX 64
#define KVF_PREFILL_WHY_MAX  200
#define KVF_GEN_PROV_PAGES   32
#define KVF_GEN_PROV_ADDR    (KVF_PREFILL_HOST_MAX + 8)
struct kvf_gen_prov_page {
    uint32_t page;     /* page index in the decode worker's pool */
    uint64_t tag;      /* the page's tag for this request (changes on every reassignment) */
    uint64_t checksum; /* XXH3-64 of the page's data bytes, as DONE carried it and decode hashed */
};
struct kvf_gen_prov {
    uint64_t decode_id;                   /* the decode worker's instance (its request ids' high
                                             word: random per start) */
    char decode_addr[KVF_GEN_PROV_ADDR];  /* router: the decode worker's host:port; "" in serve */
    uint64_t req_lo, req_hi;              /* the handoff's request id (decode's) */
    char prefill_addr[KVF_GEN_PROV_ADDR]; /* the prefill worker that wrote the prompt's pages */
    uint16_t prefill_peer;                /* its peer id at the decode worker */
    uint32_t writer_epoch;                /* its connection epoch: the grant's writer epoch */
    uint64_t grant_nonce;                 /* the grant's nonce */
    uint32_t tenant;
    uint32_t tokens_granted;  /* prompt tokens the grant asked for */
    uint32_t tokens_verified; /* DONE's token count, checked equal by decode's verify */
    bool verified;            /* count, trailers and checksums checked (false: a test build's
                                 KVF_TEST_UNVERIFIED commit) */
    uint32_t n_pages;         /* the prompt's pages (may exceed KVF_GEN_PROV_PAGES) */
    uint64_t pages_digest;    /* over all n_pages (see above) */
    struct kvf_gen_prov_page pages[KVF_GEN_PROV_PAGES]; /* the first min(n_pages, 32) */
};

/* Figures the router serves from (read from the running workers). */
struct kvf_engine_info {
    uint32_t n_vocab;
    uint32_t served_limit; /* tokens: prompt + max_tokens must not exceed it */
    uint32_t page_tokens;
    uint32_t decode_pages, decode_free, decode_reserved; /* the decode pool */
    uint32_t decode_by_state[5];                         /* pages by enum kvf_page_state */
    uint32_t prefill_pages, prefill_free;                /* the prefill pool */
    uint32_t queued, running;       /* requests waiting for a decode slot, and admitted ones */
    bool prefill_up;                /* a decode worker holds a live connection to a prefill */
    uint32_t prefills, prefills_up; /* prefill workers known to the decode worker(s), and live */
    uint32_t decodes, decodes_up;   /* router: decode workers configured, and live (else 0) */
    uint64_t fences, verify_failed, stale_msgs, rejected_before_handoff; /* counters */
    uint64_t holds, quarantines, committed, failed;                      /* counters */
    uint64_t verify_count, verify_trailer, verify_checksum; /* counters: verify_failed by the check
                                                               that failed (proto.h) */
    uint64_t foreign_tails;  /* counter: prompts whose last page carried bytes they did not write */
    uint64_t hash_slices;    /* counter: slices of long prompts' pages hashed between loop turns */
    uint64_t bad_frames;     /* counter: control frames from the prefill that did not decode */
    uint64_t decoded_tokens; /* counter: tokens the decode steps produced, every sequence (a
                                cancelled request's stop here: the cancellation tests read it) */
};

/* One worker as a router or decode worker sees it (for /health and the logs). */
struct kvf_worker_status {
    char role[8]; /* "prefill" or "decode" */
    char host[KVF_PREFILL_HOST_MAX];
    uint16_t port;
    bool up;                            /* connected, and its HELLO agreed */
    char why[KVF_PREFILL_WHY_MAX];      /* when not up: why ("connecting", "refused: ...") */
    char via[KVF_PREFILL_HOST_MAX + 8]; /* prefill: the decode worker reporting it ("" = self) */
    uint32_t pages, free_pages, running, queued; /* decode: from its last report */
    uint64_t committed;                          /* decode: handoffs verified and committed */
    uint64_t granted;                            /* prefill: prompts granted to it (summed over
                                                    the decode workers reporting it) */
    struct kvf_engine_info info;                 /* decode, up: its figures, as last reported */
};

/* The seam. `e` is the engine the ops belong to. */
struct kvf_gen;
typedef struct kvf_gen kvf_gen_t;
struct kvf_gen_ops {
    /* 0 with *out a new handle; or refused with nothing started: -EINVAL (malformed params),
     * KVF_E_PROTO_REJECTED (prompt + max_tokens beyond the served limit), -EAGAIN (queue full:
     * retry later), -ESHUTDOWN (the engine is stopping), -ENOMEM. */
    int (*submit)(void *e, const struct kvf_gen_params *p, kvf_gen_t **out);
    /* Waits up to timeout_ms (-1 = forever) for the next event. 1 with *ev filled, 0 on timeout.
     * After END, returns END again. */
    int (*next)(void *e, kvf_gen_t *g, struct kvf_gen_event *ev, int timeout_ms);
    /* Asks for the request to end (the client went away, or a stop string matched). Idempotent. */
    void (*cancel)(void *e, kvf_gen_t *g);
    /* Gives the handle back (see the header comment). */
    void (*release)(void *e, kvf_gen_t *g);
    void (*info)(void *e, struct kvf_engine_info *out);
    /* Optional (NULL = one process, nothing to list): the workers behind the seam, as /health
     * shows them. Fills up to max, returns how many there are. */
    size_t (*workers)(void *e, struct kvf_worker_status *out, size_t max);
    /* Optional (NULL: none kept): the handle's provenance (struct kvf_gen_prov), known from the
     * first TOKEN on. 1 with *out filled, 0 when not known (yet, or the request failed before
     * its handoff was verified). */
    int (*prov)(void *e, kvf_gen_t *g, struct kvf_gen_prov *out);
};

#endif /* KVFENCE_GEN_H */
