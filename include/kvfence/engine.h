/*
 * kvfence/engine.h — the worker loops (prefill, decode) and the generation seam the router uses.
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
#ifndef KVFENCE_ENGINE_H
#define KVFENCE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/common.h"
#include "kvfence/model.h"

#define KVF_GEN_MAX_LOGPROBS 20 /* top logprobs per token at most (the OpenAI API's bound) */
#define KVF_GEN_MAX_STOP_IDS 8  /* end-of-generation token ids per request */

/* What one request asks of the engine. Arrays are borrowed for the submit call only. */
struct kvf_gen_params {
    uint32_t tenant;
    const int32_t *prompt;   /* [n_prompt] token ids, each < n_vocab; BOS included if wanted */
    uint32_t n_prompt;       /* ≥ 1 */
    uint32_t max_tokens;     /* ≥ 1 output tokens at most */
    struct kvf_sample_params sample;
    uint32_t n_logprobs;     /* 0 = none; else that many top logprobs per token (≤ 20), plus the
                                sampled token's own logprob */
    bool want_logprob;       /* the sampled token's logprob, even with n_logprobs 0 */
    int32_t stop_ids[KVF_GEN_MAX_STOP_IDS]; /* generation ends after emitting one of these */
    uint32_t n_stop_ids;     /* ignored (treated as 0) when ignore_eos */
    bool ignore_eos;
};

enum kvf_gen_event_kind {
    KVF_GEN_TOKEN = 1, /* one generated token */
    KVF_GEN_END = 2,   /* the request ended: err 0 = finished (a stop id or max_tokens) */
};

struct kvf_gen_event {
    enum kvf_gen_event_kind kind;
    int32_t token;          /* TOKEN */
    float logprob;          /* TOKEN: natural log probability of `token` (temperature 1) */
    uint32_t n_top;         /* TOKEN: entries in top_ids / top_logprobs */
    int32_t top_ids[KVF_GEN_MAX_LOGPROBS];
    float top_logprobs[KVF_GEN_MAX_LOGPROBS];
    int err;                /* END: 0, or a negative kvfence code saying why it failed (the
                               HTTP answer of each: kvf__srv_engine_error, docs/SERVER.md) */
    bool stopped;           /* END with err 0: true if a stop id ended it, false if max_tokens */
};

/* Figures the router serves from (read from the running workers). */
struct kvf_engine_info {
    uint32_t n_vocab;
    uint32_t served_limit;     /* tokens: prompt + max_tokens must not exceed it */
    uint32_t page_tokens;
    uint32_t decode_pages, decode_free, decode_reserved; /* the decode pool */
    uint32_t decode_by_state[5];                         /* pages by enum kvf_page_state */
    uint32_t prefill_pages, prefill_free;                /* the prefill pool */
    uint32_t queued, running;  /* requests waiting for a decode slot, and admitted ones */
    bool prefill_up;           /* a decode worker holds a live connection to a prefill */
    uint32_t prefills, prefills_up; /* prefill workers known to the decode worker(s), and live */
    uint32_t decodes, decodes_up;   /* router: decode workers configured, and live (else 0) */
    uint64_t fences, verify_failed, stale_msgs, rejected_before_handoff; /* counters */
    uint64_t holds, quarantines, committed, failed;                      /* counters */
    uint64_t foreign_tails; /* counter: prompts whose last page carried bytes they did not write */
    uint64_t hash_slices;   /* counter: slices of long prompts' pages hashed between loop turns */
    uint64_t bad_frames;    /* counter: control frames from the prefill that did not decode */
    uint64_t decoded_tokens; /* counter: tokens the decode steps produced, every sequence (a
                                cancelled request's stop here: the cancellation tests read it) */
};

#define KVF_PREFILL_HOST_MAX 64
#define KVF_PREFILL_WHY_MAX 200

/* One worker as a router or decode worker sees it (for /health and the logs). */
struct kvf_worker_status {
    char role[8];                    /* "prefill" or "decode" */
    char host[KVF_PREFILL_HOST_MAX];
    uint16_t port;
    bool up;                         /* connected, and its HELLO agreed */
    char why[KVF_PREFILL_WHY_MAX];   /* when not up: why ("connecting", "refused: ...") */
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
};

/* --- The workers. ---------------------------------------------------------------------------
 *
 * Each worker is one event-loop thread that owns its page pool, its protocol machine and its
 * UCX worker, plus the model's compute threads (kvf_fwd_t). The prefill worker listens; the
 * decode worker connects to it, sends HELLO, and after the prefill's HELLO agrees (model
 * fingerprint, page geometry, context limit) grants it pages. A decode worker that loses the
 * connection fences it (forced close), bumps the epoch and connects again.
 */
#include <pthread.h>

struct kvf_transport_ops;
struct kvf_worker_config {
    const kvf_model_t *model;     /* borrowed; outlives the worker */
    uint64_t model_fp;            /* the model's fingerprint, compared at connect */
    uint32_t page_tokens;         /* token slots per page (16) */
    uint32_t n_pages;             /* the worker's pool */
    uint32_t n_threads;           /* compute threads, the loop thread included */
    uint32_t max_context;         /* the served limit: prompt + output tokens of one request */
    uint32_t max_batch;           /* decode: sequences per step; prefill: ignored */
    uint32_t prefill_chunk;       /* prefill: prompt tokens per chunk (0 = 256) */
    uint32_t max_queue;           /* decode: requests waiting for a slot before -EAGAIN */
    uint32_t max_reqs;            /* live requests (decode slots; prefill records) */
    const char *listen_host;      /* prefill: where to listen */
    uint16_t listen_port;         /* prefill: 0 = ephemeral */
    const char *prefill_host;     /* decode: the prefill worker's address */
    uint16_t prefill_port;
    uint64_t grant_timeout_ms;    /* decode: the no-progress bound: a prompt whose prefill reports
                                     no progress for this long fails and that prefill is fenced
                                     (0 = 5000) */
    uint64_t hold_timeout_ms;     /* decode: 0 = 30000 */
    uint64_t admit_timeout_ms;    /* decode: how long a request may wait for pages or a prefill
                                     before it fails: -EBUSY, or KVF_E_ENGINE_NO_PREFILL when no
                                     prefill is connected then (0 = 30000) */
    uint32_t keepalive_ms;        /* transport keepalive (0 = 100) */
    uint32_t hash_slice_bytes;    /* decode: a DONE over more page bytes than this is hashed in
                                     slices of this size, one per loop turn (0 = 8 MiB) */
    pthread_mutex_t *compute_lock;/* shared by workers in one process; NULL = none */
    int compute_flock_fd;         /* with use_compute_flock: a file every worker process on the
                                     same cores opened; flock()ed around each forward call, so
                                     processes take turns as the workers of one process do */
    bool use_compute_flock;
    bool poison_free;             /* test builds: poison freed pages */
    const uint8_t *fabric_key;    /* the cluster key (KVF_FABRIC_KEY_BYTES, borrowed until start
                                     returns); NULL: none (kvfence/transport.h) */
    const struct kvf_transport_ops *transport; /* the transport (kvfence/transport.h, the seam);
                                                  NULL: the fabric */
    void *transport_ctx;          /* given to transport->create */
    bool manual;                  /* no threads: the caller runs the loop a turn at a time and each
                                     compute step when it chooses (the simulator, tests/sim) */
    uint64_t seed;                /* tags and ids; 0: from the clock and the process id */
};

typedef struct kvf_prefill_worker kvf_prefill_worker_t;
typedef struct kvf_decode_worker kvf_decode_worker_t;

/* Starts the worker's loop thread. On failure nothing is left running and err explains. */
int kvf_prefill_worker_start(const struct kvf_worker_config *cfg, kvf_prefill_worker_t **out,
                             char *err, size_t err_len);
uint16_t kvf_prefill_worker_port(const kvf_prefill_worker_t *w);
/* The prefill pool's size and free pages, as the loop last published them (any thread). */
void kvf_prefill_worker_pool(kvf_prefill_worker_t *w, uint32_t *pages, uint32_t *free_pages);
/* Stops the loop (puts in flight end with the connection's forced close) and frees all. */
void kvf_prefill_worker_stop(kvf_prefill_worker_t *w);

/*
 * Manual mode (cfg.manual): the worker starts no thread. turn runs one turn of the loop — the
 * transport's progress and everything ready — without waiting, and returns 1 once the worker
 * stopped and holds nothing (0 before); compute runs the pending compute step (a prefill chunk,
 * a decode step) and returns 1, or 0 when none is pending; computing says whether one is. Stop
 * frees the worker at once. The deterministic simulator runs the production loops this way on a
 * simulated transport and clock (tests/sim/simnet.c). -EINVAL on a worker not in manual mode.
 */
int kvf_prefill_worker_turn(kvf_prefill_worker_t *w);
int kvf_prefill_worker_compute(kvf_prefill_worker_t *w);
bool kvf_prefill_worker_computing(kvf_prefill_worker_t *w);

int kvf_decode_worker_start(const struct kvf_worker_config *cfg, kvf_decode_worker_t **out,
                            char *err, size_t err_len);
/* Stops admitting (submit: -ESHUTDOWN), cancels what is queued, lets running requests finish
 * for up to grace_ms, then cancels the rest, waits for their protocol endings (bounded by the
 * timeouts) and frees all. */
void kvf_decode_worker_stop(kvf_decode_worker_t *w, uint64_t grace_ms);
/* Manual mode, as for the prefill worker above. */
int kvf_decode_worker_turn(kvf_decode_worker_t *w);
int kvf_decode_worker_compute(kvf_decode_worker_t *w);
bool kvf_decode_worker_computing(kvf_decode_worker_t *w);
/* The generation seam over a decode worker: pass the worker as `e`. */
extern const struct kvf_gen_ops kvf_decode_gen_ops;

/* Prefill workers per decode worker, at most. */
#define KVF_DECODE_MAX_PREFILLS 16
struct kvf_prefill_status {
    char host[KVF_PREFILL_HOST_MAX];
    uint16_t port;
    bool up;
    char why[KVF_PREFILL_WHY_MAX];
    uint64_t granted; /* prompts granted to it so far */
};
/* Adds a prefill worker the decode worker connects to and grants prompts to (any thread; the
 * same address twice is one worker). Prompts go to the live prefill with the fewest prompts
 * granted and not yet delivered. -ENOSPC beyond KVF_DECODE_MAX_PREFILLS. */
int kvf_decode_worker_add_prefill(kvf_decode_worker_t *w, const char *host, uint16_t port);
/* The prefill workers that the live routers name, as a whole (any thread; each call replaces the
 * last). One added by kvf_decode_worker_add_prefill (the decode's own configuration) is kept
 * whatever routers name; one named only by routers and no longer named by any is retired: its
 * requests fail as on a lost connection, its connection is fenced, it is never dialled again,
 * and its slot goes to the next one named. Names beyond KVF_DECODE_MAX_PREFILLS are dropped
 * (counted in the return: 0, or how many did not fit). */
struct kvf_prefill_addr {
    char host[KVF_PREFILL_HOST_MAX];
    uint16_t port;
};
int kvf_decode_worker_set_router_prefills(kvf_decode_worker_t *w, const struct kvf_prefill_addr *named, uint32_t n);
/* The prefill workers as the loop last published them (retired ones left out); returns how many
 * (≤ max filled). */
size_t kvf_decode_worker_prefills(kvf_decode_worker_t *w, struct kvf_prefill_status *out, size_t max);
/* The worker's notify eventfd (the worker owns it): from this call on, every event pushed to a
 * handle submitted afterwards also writes it, so a thread serving many handles can sleep on it
 * until one has something. */
int kvf_decode_worker_notify_fd(kvf_decode_worker_t *w);

/* --- Split roles: the router and the decode worker in separate processes. --------------------
 *
 * A decode service listens for routers (UCX over TCP) and serves a decode worker's generation
 * seam to them: the router's HELLO names the model fingerprint, the context limit, the page
 * size and the prefill workers to use; the service checks the first three against its own and
 * refuses a router that differs (its reply names the mismatch), then adds the prefill workers
 * to the decode worker. A router submits, cancels and receives each request's tokens and its
 * end over that connection; a lost connection cancels the router's requests on the decode side
 * (through the protocol) and ends them on the router side with KVF_E_PROTO_PEER_DOWN.
 */
typedef struct kvf_decode_service kvf_decode_service_t;
struct kvf_decode_service_config {
    const char *listen_host;
    uint16_t listen_port;  /* 0 = ephemeral */
    uint64_t model_fp;
    uint32_t max_context, page_tokens, n_vocab;
    uint32_t keepalive_ms; /* 0 = 100 */
    const uint8_t *fabric_key; /* as in kvf_worker_config */
};
int kvf_decode_service_start(kvf_decode_worker_t *dw, const struct kvf_decode_service_config *cfg,
                             kvf_decode_service_t **out, char *err, size_t err_len);
uint16_t kvf_decode_service_port(const kvf_decode_service_t *s);
/* Routers connected and past HELLO, now. */
uint32_t kvf_decode_service_routers(kvf_decode_service_t *s);
/* Closes every router connection (their requests are cancelled through the decode worker) and
 * frees all. Call before stopping the decode worker. */
void kvf_decode_service_stop(kvf_decode_service_t *s);

typedef struct kvf_router kvf_router_t;
struct kvf_router_config {
    const char *const *decode_hosts;  /* [n_decodes] */
    const uint16_t *decode_ports;
    uint32_t n_decodes;               /* 1..KVF_ROUTER_MAX_DECODES */
    const char *const *prefill_hosts; /* [n_prefills]: sent to every decode worker */
    const uint16_t *prefill_ports;
    uint32_t n_prefills;              /* 1..KVF_DECODE_MAX_PREFILLS */
    uint64_t model_fp;
    uint32_t max_context, page_tokens, n_vocab;
    uint32_t max_queue;               /* requests not yet ended, at most (0 = 256): else -EAGAIN */
    uint64_t admit_timeout_ms;        /* a request waiting for a live decode worker longer than
                                         this ends with KVF_E_ENGINE_NO_DECODE, or
                                         KVF_E_ENGINE_NO_PREFILL when decode workers are up but
                                         none has a prefill (0 = 30000) */
    uint32_t keepalive_ms;            /* 0 = 100 */
    const uint8_t *fabric_key;        /* as in kvf_worker_config */
};
#define KVF_ROUTER_MAX_DECODES 16
int kvf_router_start(const struct kvf_router_config *cfg, kvf_router_t **out, char *err, size_t err_len);
/* Stops taking requests (-ESHUTDOWN), lets those in flight finish for up to grace_ms, cancels
 * the rest, closes the connections and frees all. */
void kvf_router_stop(kvf_router_t *r, uint64_t grace_ms);
/* The generation seam over the router: pass the router as `e`. Requests go to the live decode
 * worker with the fewest of this router's requests in flight, then the most free pages. */
extern const struct kvf_gen_ops kvf_router_gen_ops;

#endif /* KVFENCE_ENGINE_H */
