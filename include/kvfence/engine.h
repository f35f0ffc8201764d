/*
 * kvfence/engine.h — the worker loops (prefill, decode), the decode service and the router,
 * each serving the generation seam of kvfence/gen.h to the router's HTTP face (src/server).
 *
 * Names: the workers are kvf_pworker_* (prefill) and kvf_dworker_* (decode), apart from the
 * protocol machines they drive, kvf_prefill_* and kvf_decode_* (kvfence/proto.h).
 */
#ifndef KVFENCE_ENGINE_H
#define KVFENCE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/common.h"
#include "kvfence/gen.h"

/* The model a worker runs (kvfence/model.h): only pointed to here. */
typedef struct kvf_model kvf_model_t;

/* --- The workers. ---------------------------------------------------------------------------
 *
 * Each worker is one event-loop thread that owns its page pool, its protocol machine and its
 * transport (kvfence/transport.h), plus a compute thread and the model's helper threads
 * (kvf_fwd_t); in manual mode (below) it has no thread of its own. The prefill worker listens; the
 * decode worker connects to it, sends HELLO, and after the prefill's HELLO agrees (model
 * fingerprint, page geometry, context limit) grants it pages. A decode worker that loses the
 * connection fences it (forced close), bumps the epoch and connects again.
 */
#include <pthread.h>

struct kvf_transport_ops;
struct kvf_worker_config {
    const kvf_model_t *model;    /* borrowed; outlives the worker */
    uint64_t model_fp;           /* the model's fingerprint, compared at connect */
    uint32_t page_tokens;        /* token slots per page (16) */
    uint32_t n_pages;            /* the worker's pool */
    uint32_t n_threads;          /* compute threads, the loop thread included */
    uint32_t max_context;        /* the served limit: prompt + output tokens of one request */
    uint32_t max_batch;          /* decode: sequences per step; prefill: ignored */
    uint32_t prefill_chunk;      /* prefill: prompt tokens per chunk (0 = 256) */
    uint32_t prefix_cache_pages; /* prefill: pages added to its pool for the tenant-scoped prefix
                                    cache, which holds at most that many (0 = no cache;
                                    docs/PREFIX_CACHE.md) */
    uint32_t max_queue;          /* decode: requests waiting for a slot before -EAGAIN */
    uint32_t max_reqs;           /* live requests (decode slots; prefill records) */
    const char *listen_host;     /* prefill: where to listen */
    uint16_t listen_port;        /* prefill: 0 = ephemeral */
    const char *prefill_host;    /* decode: the prefill worker's address */
    uint16_t prefill_port;
    uint64_t grant_timeout_ms;     /* decode: the no-progress bound: a prompt whose prefill reports
                                      no progress for this long fails and that prefill is fenced
                                      (0 = 5000) */
    uint64_t hold_timeout_ms;      /* decode: 0 = 30000 */
    uint64_t admit_timeout_ms;     /* decode: how long a request may wait for pages or a prefill
                                      before it fails: -EBUSY, or KVF_E_ENGINE_NO_PREFILL when no
                                      prefill is connected then (0 = 30000) */
    uint32_t keepalive_ms;         /* transport keepalive (0 = 100) */
    uint32_t hash_slice_bytes;     /* decode: a DONE over more page bytes than this is hashed in
                                      slices of this size, one per loop turn (0 = 8 MiB) */
    pthread_mutex_t *compute_lock; /* shared by workers in one process; NULL = none */
    int compute_flock_fd;          /* with use_compute_flock: a file every worker process on the
                                      same cores opened; flock()ed around each forward call, so
                                      processes take turns as the workers of one process do */
    bool use_compute_flock;
    bool poison_free;          /* test builds: poison freed pages */
    const uint8_t *fabric_key; /* the cluster key (KVF_FABRIC_KEY_BYTES, borrowed until start
                                  returns); NULL: none (kvfence/transport.h) */
    const struct kvf_transport_ops *transport; /* the transport (kvfence/transport.h, the seam);
                                                  NULL: the fabric */
    void *transport_ctx;                       /* given to transport->create */
    bool manual;      /* no threads: the caller runs the loop a turn at a time and each
                         compute step when it chooses (the simulator, tests/sim) */
    uint64_t seed;    /* tags and ids; 0: from the clock and the process id */
    bool log_commits; /* decode: one "kvfence decode: commit ..." line per verified handoff
                         (request, writer, grant, every page's tag and checksum), and one line
                         per canary (docs/SERVER.md, "Provenance") */
    /* Constrained decoding (kvfence/grammar.h): the model's vocabulary as the grammar masks
     * read it (borrowed; outlives the worker). NULL: a request with a grammar fails
     * (KVF_E_MODEL_UNSUPPORTED). */
    const struct kvf_grammar_vocab *grammar_vocab;
};

typedef struct kvf_pworker kvf_pworker_t;
typedef struct kvf_dworker kvf_dworker_t;

/* Starts the worker's loop thread. On failure nothing is left running and err explains. */
int kvf_pworker_start(const struct kvf_worker_config *cfg, kvf_pworker_t **out, char *err,
                      size_t err_len);
uint16_t kvf_pworker_port(const kvf_pworker_t *w);
/* The prefill pool's size and free pages, as the loop last published them (any thread). */
void kvf_pworker_pool(kvf_pworker_t *w, uint32_t *pages, uint32_t *free_pages);
/* The prefix cache's figures (docs/PREFIX_CACHE.md), as the loop last published them (any
 * thread); all zero without a cache. */
struct kvf_prefix_cache_stats {
    uint64_t hits;      /* jobs that took at least one cached page */
    uint64_t hit_pages; /* pages taken from the cache (times page_tokens: prompt tokens) */
    uint64_t misses;    /* jobs that took none */
    uint64_t inserts, evictions;
    uint32_t pages; /* pages cached now */
};
void kvf_pworker_cache(kvf_pworker_t *w, struct kvf_prefix_cache_stats *out);
/* Stops the loop (puts in flight end with the connection's forced close) and frees all. */
void kvf_pworker_stop(kvf_pworker_t *w);

/*
 * Manual mode (cfg.manual): the worker starts no thread. turn runs one turn of the loop — the
 * transport's progress and everything ready — without waiting, and returns 1 once the worker
 * stopped and holds nothing (0 before); compute runs the pending compute step (a prefill chunk,
 * a decode step) and returns 1, or 0 when none is pending; computing says whether one is. Stop
 * frees the worker at once. The deterministic simulator runs the production loops this way on a
 * simulated transport and clock (tests/sim/simnet.c). -EINVAL on a worker not in manual mode.
 */
int kvf_pworker_turn(kvf_pworker_t *w);
int kvf_pworker_compute(kvf_pworker_t *w);
bool kvf_pworker_computing(kvf_pworker_t *w);

int kvf_dworker_start(const struct kvf_worker_config *cfg, kvf_dworker_t **out, char *err,
                      size_t err_len);
/* Stops admitting (submit: -ESHUTDOWN), cancels what is queued, lets running requests finish
 * for up to grace_ms, then cancels the rest, waits for their protocol endings (bounded by the
 * timeouts) and frees all. */
void kvf_dworker_stop(kvf_dworker_t *w, uint64_t grace_ms);
/* Manual mode, as for the prefill worker above. */
int kvf_dworker_turn(kvf_dworker_t *w);
int kvf_dworker_compute(kvf_dworker_t *w);
bool kvf_dworker_computing(kvf_dworker_t *w);
/* The decode worker's page pool, for a simulator's checks between turns in manual mode (page
 * states and tags, kvf_pool_check); read-only, and only while no turn runs. */
struct kvf_pool;
const struct kvf_pool *kvf_dworker_pool(const kvf_dworker_t *w);
/* The consistency walks, for a simulator between turns in manual mode: the decode machine's
 * (kvf_decode_check) and its pool's (kvf_pool_check); each prefill session machine's
 * (kvf_prefill_check) and the prefill pool's. True if all hold; otherwise false with the first
 * violation in why. */
bool kvf_dworker_check(const kvf_dworker_t *w, char *why, size_t why_len);
/* The prefill worker's page pool (its jobs' source pages), as kvf_dworker_pool. */
const struct kvf_pool *kvf_pworker_page_pool(const kvf_pworker_t *w);
bool kvf_pworker_check(const kvf_pworker_t *w, char *why, size_t why_len);
/* The generation seam over a decode worker: pass the worker as `e`. */
extern const struct kvf_gen_ops kvf_dworker_gen_ops;

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
int kvf_dworker_add_prefill(kvf_dworker_t *w, const char *host, uint16_t port);
/* The prefill workers that the live routers name, as a whole (any thread; each call replaces the
 * last). One added by kvf_dworker_add_prefill (the decode's own configuration) is kept
 * whatever routers name; one named only by routers and no longer named by any is retired: its
 * requests fail as on a lost connection, its connection is fenced, it is never dialled again,
 * and its slot goes to the next one named. Names beyond KVF_DECODE_MAX_PREFILLS are dropped
 * (counted in the return: 0, or how many did not fit). */
struct kvf_prefill_addr {
    char host[KVF_PREFILL_HOST_MAX];
    uint16_t port;
};
int kvf_dworker_set_router_prefills(kvf_dworker_t *w, const struct kvf_prefill_addr *named,
                                    uint32_t n);
/* The prefill workers as the loop last published them (retired ones left out); returns how many
 * (≤ max filled). */
size_t kvf_dworker_prefills(kvf_dworker_t *w, struct kvf_prefill_status *out, size_t max);
/* The worker's notify eventfd (the worker owns it): from this call on, every event pushed to a
 * handle submitted afterwards also writes it, so a thread serving many handles can sleep on it
 * until one has something. */
int kvf_dworker_notify_fd(kvf_dworker_t *w);

/* --- Split roles: the router and the decode worker in separate processes. --------------------
 *
 * A decode service listens for routers (over the fabric) and serves a decode worker's generation
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
    uint16_t listen_port; /* 0 = ephemeral */
    uint64_t model_fp;
    uint32_t max_context, page_tokens, n_vocab;
    uint32_t keepalive_ms;                     /* 0 = 100 */
    const uint8_t *fabric_key;                 /* as in kvf_worker_config */
    const struct kvf_transport_ops *transport; /* as in kvf_worker_config */
    void *transport_ctx;
    bool manual; /* as in kvf_worker_config: kvf_decode_service_turn runs it */
};
int kvf_decode_service_start(kvf_dworker_t *dw, const struct kvf_decode_service_config *cfg,
                             kvf_decode_service_t **out, char *err, size_t err_len);
uint16_t kvf_decode_service_port(const kvf_decode_service_t *s);
/* Routers connected and past HELLO, now. */
uint32_t kvf_decode_service_routers(kvf_decode_service_t *s);
/* Closes every router connection (their requests are cancelled through the decode worker) and
 * frees all. Call before stopping the decode worker. */
void kvf_decode_service_stop(kvf_decode_service_t *s);
/* Manual mode: one turn of the service's loop, without waiting (-EINVAL otherwise). */
int kvf_decode_service_turn(kvf_decode_service_t *s);

typedef struct kvf_router kvf_router_t;
struct kvf_router_config {
    const char *const *decode_hosts; /* [n_decodes] */
    const uint16_t *decode_ports;
    uint32_t n_decodes;               /* 1..KVF_ROUTER_MAX_DECODES */
    const char *const *prefill_hosts; /* [n_prefills]: sent to every decode worker */
    const uint16_t *prefill_ports;
    uint32_t n_prefills; /* 1..KVF_DECODE_MAX_PREFILLS */
    uint64_t model_fp;
    uint32_t max_context, page_tokens, n_vocab;
    uint32_t max_queue;        /* requests not yet ended, at most (0 = 256): else -EAGAIN */
    uint64_t admit_timeout_ms; /* a request waiting for a live decode worker longer than
                                  this ends with KVF_E_ENGINE_NO_DECODE, or
                                  KVF_E_ENGINE_NO_PREFILL when decode workers are up but
                                  none has a prefill (0 = 30000) */
    uint32_t keepalive_ms;     /* 0 = 100 */
    const uint8_t *fabric_key; /* as in kvf_worker_config */
    const struct kvf_transport_ops *transport; /* as in kvf_worker_config */
    void *transport_ctx;
    bool manual; /* as in kvf_worker_config: kvf_router_turn runs it */
};
#define KVF_ROUTER_MAX_DECODES 16
int kvf_router_start(const struct kvf_router_config *cfg, kvf_router_t **out, char *err,
                     size_t err_len);
/* Stops taking requests (-ESHUTDOWN), lets those in flight finish for up to grace_ms, cancels
 * the rest, closes the connections and frees all. */
void kvf_router_stop(kvf_router_t *r, uint64_t grace_ms);
/* Manual mode: one turn of the router's loop, without waiting; 1 once it stopped (-EINVAL
 * otherwise). */
int kvf_router_turn(kvf_router_t *r);
/* The generation seam over the router: pass the router as `e`. Requests go to the live decode
 * worker with the fewest of this router's requests in flight, then the most free pages. */
extern const struct kvf_gen_ops kvf_router_gen_ops;

#endif /* KVFENCE_ENGINE_H */
