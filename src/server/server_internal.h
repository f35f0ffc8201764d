/*
 * server_internal.h — what the server's files share: the error record an invalid request turns
 * into, the validated request, the generation run that drives one request's choices through
 * the seam, and a growable byte buffer.
 *
 * Pieces, in the order a request meets them:
 *   scan.c     kvf__srv_scan_body: UTF-8 and nesting depth, one pass, no recursion
 *   request.c  kvf__srv_req_parse: JSON → struct kvf__srv_req (tokenized, every bound checked)
 *   chat.c     kvf_server_chat_render (the public default rendering)
 *   run.c      struct kvf__srv_run: submit, events → text (detokenizer, stop strings), logprobs,
 *              the response JSON and the SSE chunks
 *   http.c     libmicrohttpd: routing, bodies, streaming, hang-up polling, start and stop
 *   tenant.c   API keys, the tenant table and per-tenant admission
 *   admin.c    who may see /metrics and /health's figures; the operator address
 *   metrics.c  latency histograms and the /metrics text; log.c: the key=value log lines
 *
 * A run is owned by the connection thread that created it (see server.h).
 */
#ifndef KVF_SERVER_INTERNAL_H
#define KVF_SERVER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <microhttpd.h>

#include "kvfence/gen.h"
#include "kvfence/server.h"
#include "kvfence/text.h"

/* --- A growable byte buffer (NUL-terminated when non-empty). ------------------------------- */
struct kvf__sbuf {
    char *p;
    size_t n, cap;
    bool oom; /* an append failed: the content is incomplete */
};
void kvf__sbuf_put(struct kvf__sbuf *b, const void *src, size_t n);
void kvf__sbuf_puts(struct kvf__sbuf *b, const char *s);
void kvf__sbuf_free(struct kvf__sbuf *b);

/* --- Errors as the API reports them. --------------------------------------------------------- */
#define KVF__SRV_RETRY_DEFAULT 0    /* Retry-After: the server's retry_after_s on a 429 or 503 */
#define KVF__SRV_RETRY_NONE    (-1) /* no Retry-After: a retry cannot help */
struct kvf__srv_err {
    int status;        /* HTTP status */
    int retry_after_s; /* Retry-After in seconds (> 0), or KVF__SRV_RETRY_DEFAULT or _NONE */
    const char *type;  /* "invalid_request_error", "server_error", ... (static) */
    const char *param; /* the offending field, or NULL (static) */
    const char *code;  /* a short machine code, or NULL (static) */
    char message[400]; /* never contains prompt text or tokens (BAD_INPUTS row 8) */
};
/* Fills e (printf-style message) and returns -1, so a parser can `return srv_fail(...)`. */
__attribute__((format(printf, 5, 6))) int kvf__srv_fail(struct kvf__srv_err *e, int status,
                                                        const char *param, const char *code,
                                                        const char *fmt, ...);
/* {"error":{"message","type","param","code"}} as a new JSON object (NULL on no memory). */
json_t *kvf__srv_err_json(const struct kvf__srv_err *e);

/* --- The body scan. ------------------------------------------------------------------------ */
/* 0 if body[0..len) is valid UTF-8 (kvfence/utf8.h: no overlong forms, no surrogates, nothing
 * past U+10FFFF), holds no NUL byte and no array/object nests deeper than max_depth; else -1
 * with e filled (400). One pass over the bytes with a depth counter, strings and escapes
 * skipped. */
int kvf__srv_scan_body(const char *body, size_t len, uint32_t max_depth, struct kvf__srv_err *e);
/* A JSON string of s[0..n) with each invalid UTF-8 byte as U+FFFD (NULL on no memory). */
json_t *kvf__srv_json_text(const char *s, size_t n);

/* --- The validated request. ---------------------------------------------------------------- */
enum kvf__srv_kind {
    KVF__SRV_COMPLETION = 0,
    KVF__SRV_CHAT = 1,
};

/* What the parser checks against (read from ops->info and the config per request). */
struct kvf__srv_limits {
    uint32_t n_vocab;      /* token ids must be below it */
    uint32_t served_limit; /* prompt + max_tokens */
    uint32_t max_n;
    uint32_t default_max_tokens;
    const char *chat_template;      /* the model's chat template, or NULL: the default rendering */
    const char *const *model_names; /* [n_model_names]: a request's "model" must be one; */
    size_t n_model_names;           /* 0: any (or none) is taken */
};

struct kvf__srv_req {
    enum kvf__srv_kind kind;
    int32_t *prompt; /* [n_prompt], owned */
    uint32_t n_prompt;
    uint32_t max_tokens; /* ≥ 1; n_prompt + max_tokens ≤ served_limit */
    struct kvf_sample_params sample;
    bool seed_given; /* else run.c picks one */
    uint32_t n;      /* choices, 1..max_n */
    bool stream, include_usage;
    char *stop[KVF_SERVER_MAX_STOP]; /* owned, non-empty, valid UTF-8 */
    size_t stop_len[KVF_SERVER_MAX_STOP];
    uint32_t n_stop;
    bool logprobs;         /* the sampled token's logprob per token */
    uint32_t top_logprobs; /* 0..20 alternatives per token */
    bool tokens_as_ids;    /* return_tokens_as_token_ids (vLLM): logprobs name each token
                              "token_id:<id>" instead of its text */
    bool ignore_eos;
    char *grammar; /* owned, NUL-terminated, n_grammar bytes: GBNF (response_format, grammar),
                      compiled once here to check it; NULL: unconstrained */
    uint32_t n_grammar;
};

/* Parses and validates a completions or chat body (already scanned or not: the scan is done
 * here first). 0 with *out filled (free with kvf__srv_req_free), or -1 with e filled and
 * nothing allocated. */
int kvf__srv_req_parse(enum kvf__srv_kind kind, const char *body, size_t len,
                       const struct kvf__srv_limits *lim, const kvf_tokenizer_t *tok,
                       struct kvf__srv_req *out, struct kvf__srv_err *e);
void kvf__srv_req_free(struct kvf__srv_req *r);

/* Renders msgs[0..n) with the chat template tmpl (bos and eos: the tokenizer's pieces; a
 * generation prompt added) and encodes the text, parsing special tokens only where the
 * template wrote them (chat.c explains how). No BOS is added: the template writes its own.
 * 0 with *out (malloc'd, *n_out ≥ 1 tokens), or -1 with e filled (400 naming the template's
 * complaint, 503 on no memory) and nothing allocated. */
int kvf__srv_chat_template_encode(const char *tmpl, const kvf_tokenizer_t *tok,
                                  const struct kvf_chat_msg *msgs, size_t n, int32_t **out,
                                  uint32_t *n_out, struct kvf__srv_err *e);

/* The prompt of a chat body's "messages" (validated, rendered, tokenized), as a chat completion
 * sends it: 0 with *ids (malloc'd; at most cap kept, *n the full count), or -1 with e filled. */
int kvf__srv_chat_tokens(json_t *root, const struct kvf__srv_limits *lim,
                         const kvf_tokenizer_t *tok, uint32_t cap, int32_t **ids, uint32_t *n,
                         struct kvf__srv_err *e);

/* Parses body as a JSON object after the scan; NULL with e filled. */
json_t *kvf__srv_parse_object(const char *body, size_t len, struct kvf__srv_err *e);

/* --- One request's generations. ------------------------------------------------------------ */
struct kvf__srv_choice {
    kvf_gen_t *g;        /* NULL once released */
    bool done;           /* finished: finish_reason set, or failed with err */
    const char *finish;  /* "stop" / "length" once done without error */
    int err;             /* the END's error when the engine failed the choice */
    uint32_t n_tokens;   /* tokens received (usage) */
    uint64_t text_bytes; /* bytes of text released so far (completions' text_offset) */
    struct kvf_detok detok;
    char hold[KVF_SERVER_MAX_STOP_BYTES + KVF_DETOK_MAX_OUT + 8]; /* text that may begin a stop
                                                                     string: not released yet */
    size_t n_hold;
    struct kvf__sbuf text;     /* released text not yet sent (streaming) / all of it */
    json_t *lp;                /* logprobs of tokens not yet sent (format per kind), or NULL */
    bool role_sent;            /* chat streaming: the first delta carried the role */
    bool finish_sent;          /* streaming: the chunk with finish_reason went out */
    struct kvf_gen_prov *prov; /* owned: the handoff's provenance, read at the first token
                                  (NULL: none known, or the engine keeps none) */
};

struct kvf__srv_run {
    const struct kvf_gen_ops *ops;
    void *engine;
    const kvf_tokenizer_t *tok;
    struct kvf__srv_req req; /* owned (moved in by kvf__srv_run_start) */
    char id[48];             /* "cmpl-..." / "chatcmpl-..." */
    int64_t created;         /* unix seconds */
    const char *model;       /* borrowed from the server */
    const char *fingerprint; /* system_fingerprint, borrowed from the server; NULL: none */
    int failed;              /* the first choice error (negative), or 0 */
    bool cancelled;          /* kvf__srv_run_cancel was called */
    bool sse_done;           /* the stream's last event went out */
    bool want_prov;          /* X-Kvfence-Provenance: 1 (streams: a comment before [DONE]) */
    int64_t t_start_us;      /* monotonic µs at submit */
    int64_t t_first_us;      /* monotonic µs at the first token of any choice; 0 before */
    uint32_t n;
    struct kvf__srv_choice ch[]; /* [n] */
};

/* Submits every choice (n separate submits; choice i uses seed + i, the seed being the
 * request's or, when it gives none, 64 random bits drawn for this request: its choices differ
 * and are reproducible from that one seed). The completion id is 64 more random bits. 0 with
 * *out the run (the request moved into it: *req is zeroed), or the first submit's negative code
 * (or kvf__srv_random's) with every submitted choice cancelled and released, *req untouched. */
int kvf__srv_run_start(const struct kvf_gen_ops *ops, void *engine, const kvf_tokenizer_t *tok,
                       struct kvf__srv_req *req, const char *model, uint32_t tenant,
                       struct kvf__srv_run **out);
/* Waits up to timeout_ms for events and handles every one that is ready. Returns 1 if some
 * choice made progress (text, logprobs, an ending), 0 if none did. */
int kvf__srv_run_step(struct kvf__srv_run *r, int timeout_ms);
bool kvf__srv_run_done(const struct kvf__srv_run *r);
/* Cancels every unfinished choice (ops->cancel, then release). Idempotent. */
void kvf__srv_run_cancel(struct kvf__srv_run *r);
/* Cancels what is left, releases everything, frees. r may be NULL. */
void kvf__srv_run_free(struct kvf__srv_run *r);
/* The status and error of a failed run (r->failed != 0). */
void kvf__srv_run_error(const struct kvf__srv_run *r, struct kvf__srv_err *e);
/* The whole non-streaming response body (NULL on no memory). */
json_t *kvf__srv_run_response(struct kvf__srv_run *r);
/* Appends SSE events for everything not yet sent; after the last choice finished, the usage
 * chunk (if asked) and "data: [DONE]". Returns true once the stream is complete. */
bool kvf__srv_run_sse(struct kvf__srv_run *r, struct kvf__sbuf *out);

/* {"id": the response id, "choices": [each choice's provenance record (kvf__srv_prov_json) with
 * its "index", or {"index": i} when none is known]} (NULL on no memory). */
json_t *kvf__srv_run_prov(const struct kvf__srv_run *r, bool with_pages);

/* Appends "data: <j compact>\n\n" and drops j (a NULL j or no memory sets out->oom). */
void kvf__srv_sse_put(struct kvf__sbuf *out, json_t *j);

/* --- Why a request failed (util.c). -------------------------------------------------------- */
/* Each way a request can fail that is not the client's request itself being malformed: the
 * engine's codes and the server's own queue, memory and shutdown. One error code each, one
 * series of kvfence_request_errors_total each (docs/SERVER.md has the table). */
enum kvf__srv_reason {
    KVF__SRV_R_QUEUE_FULL = 0,          /* -EAGAIN, or the server's max_queue */
    KVF__SRV_R_POOL_EXHAUSTED,          /* -EBUSY */
    KVF__SRV_R_NO_PREFILL,              /* KVF_E_ENGINE_NO_PREFILL */
    KVF__SRV_R_NO_DECODE,               /* KVF_E_ENGINE_NO_DECODE */
    KVF__SRV_R_PREFILL_STALLED,         /* KVF_E_PROTO_TIMEOUT */
    KVF__SRV_R_WORKER_DOWN,             /* KVF_E_PROTO_PEER_DOWN */
    KVF__SRV_R_WORKER_FAILED,           /* KVF_E_PROTO_FAILED */
    KVF__SRV_R_KV_VERIFICATION_FAILED,  /* KVF_E_PROTO_COUNT, _TRAILER, _CHECKSUM */
    KVF__SRV_R_OUT_OF_MEMORY,           /* -ENOMEM */
    KVF__SRV_R_SHUTTING_DOWN,           /* -ESHUTDOWN, KVF_E_PROTO_CANCELLED */
    KVF__SRV_R_CONTEXT_LENGTH_EXCEEDED, /* KVF_E_PROTO_REJECTED */
    KVF__SRV_R_INVALID_REQUEST,         /* -EINVAL */
    KVF__SRV_R_INTERNAL_ERROR,          /* anything else */
    KVF__SRV_N_REASONS
};
struct kvf__srv_reason_info {
    int status;          /* HTTP status */
    const char *code;    /* the error's code, and the metric's reason label */
    int retry_after_s;   /* as in struct kvf__srv_err */
    const char *message; /* what ran out or stopped */
};
extern const struct kvf__srv_reason_info kvf__srv_reasons[KVF__SRV_N_REASONS];
/* The reason of an engine code (KVF__SRV_R_INTERNAL_ERROR for one it does not know). */
enum kvf__srv_reason kvf__srv_reason_of(int err);
/* The reason whose code is code, or -1 (code may be NULL). */
int kvf__srv_reason_by_code(const char *code);
/* Fills e with the answer to an engine code: its reason's status, code, message (with the
 * engine's own text for a failed verification or an unknown code) and Retry-After. */
void kvf__srv_engine_error(int err, struct kvf__srv_err *e);

/* --- Tenants (tenant.c). ------------------------------------------------------------------ */
enum kvf__srv_outcome {
    KVF__SRV_OK = 0,       /* answered in full */
    KVF__SRV_ERROR,        /* the engine failed it, or the server could not (5xx) */
    KVF__SRV_CANCELLED,    /* the client went away, or the server stopped */
    KVF__SRV_INVALID,      /* refused as malformed or beyond the limits (4xx but 401/429) */
    KVF__SRV_RATE_LIMITED, /* 429: the tenant's share, the server's or the engine's queue */
    KVF__SRV_UNAUTHORIZED, /* 401 */
    KVF__SRV_N_OUTCOMES
};
extern const char *const kvf__srv_outcome_name[KVF__SRV_N_OUTCOMES];

struct kvf__srv_tenant {
    char name[KVF_SERVER_MAX_TENANT_NAME + 1]; /* "_none" for [0]: requests without a tenant */
    uint32_t id;                               /* kvf_gen_params.tenant */
    /* Under the table's mu. Accounting: seqs and kv_tokens are the sums of the shares of the
     * `running` requests admitted (0, 0 when running is 0). */
    uint32_t running, waiting; /* requests admitted, and waiting for the share */
    uint32_t seqs;             /* sequences of the running requests */
    uint64_t kv_tokens;        /* KV tokens they reserve */
    atomic_ullong outcomes[KVF__SRV_N_OUTCOMES];
    atomic_ullong prompt_tokens, generated_tokens;
};
struct kvf__srv_tenants {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* some share was freed */
    struct kvf__srv_tenant *t; /* [n]: [0] "_none", then the key file's tenants (or "default") */
    size_t n;
    uint32_t max_running;   /* sequences of one tenant at once; 0: no bound */
    uint32_t max_queued;    /* requests of one tenant waiting; UINT32_MAX without max_running */
    uint64_t max_kv_tokens; /* configured KV share; 0: kvf__srv_tenant_kv_cap's default */
    uint32_t wait_ms;
};
/* What one request takes of its tenant's share. */
struct kvf__srv_share {
    uint32_t seqs;      /* sequences: its choices (1 for /tokenize, /detokenize) */
    uint64_t kv_tokens; /* KV it reserves: seqs × (prompt + max_tokens) in whole pages */
};
struct kvf__srv_tenant_load {
    uint32_t running, waiting, seqs;
    uint64_t kv_tokens;
};
int kvf__srv_tenants_init(struct kvf__srv_tenants *T, const kvf_server_keys_t *keys,
                          uint32_t default_id, uint32_t max_running, uint32_t max_queued,
                          uint64_t max_kv_tokens, uint32_t wait_ms);
void kvf__srv_tenants_destroy(struct kvf__srv_tenants *T);
/* tokens rounded up to whole pages of page_tokens (≤ 1: as they are). */
uint64_t kvf__srv_round_tokens(uint64_t tokens, uint32_t page_tokens);
/* The KV share of one tenant in tokens (0: no cap): the configured one, or the default from the
 * pool in `in` when there are several tenants (server.h states it). */
uint64_t kvf__srv_tenant_kv_cap(const struct kvf__srv_tenants *T, const struct kvf_engine_info *in);
/* 0: w taken; 1: waiting (then kvf__srv_tenant_wait until 0, or leave_queue); -EAGAIN: too many
 * of the tenant's requests wait already, nothing taken. */
int kvf__srv_tenant_enter(struct kvf__srv_tenants *T, size_t ti, const struct kvf__srv_share *w,
                          uint64_t kv_cap);
/* Waits up to timeout_ms for w to fit: 0 taken (no longer waiting), 1 not yet. */
int kvf__srv_tenant_wait(struct kvf__srv_tenants *T, size_t ti, const struct kvf__srv_share *w,
                         uint64_t kv_cap, int timeout_ms);
void kvf__srv_tenant_leave_queue(struct kvf__srv_tenants *T, size_t ti);
/* Gives back w, taken by enter or wait. */
void kvf__srv_tenant_exit(struct kvf__srv_tenants *T, size_t ti, const struct kvf__srv_share *w);
void kvf__srv_tenant_load(struct kvf__srv_tenants *T, size_t ti, struct kvf__srv_tenant_load *out);

/* --- Client addresses (netaddr.c). ----------------------------------------------------------- */
struct sockaddr;
/* An IPv4 or IPv6 address; IPv4 as its IPv4-mapped IPv6 form (::ffff:a.b.c.d). */
struct kvf__srv_addr {
    uint8_t b[16];
};
/* An address block: the first prefix bits of a (of 128; an IPv4 /p is 96 + p). */
struct kvf__srv_cidr {
    struct kvf__srv_addr a;
    uint8_t prefix;
};
bool kvf__srv_addr_from_sockaddr(const struct sockaddr *sa, struct kvf__srv_addr *out);
/* A numeric address in s[0..n) (blanks around it and Forwarded's quotes allowed; with
 * allow_port, also "a.b.c.d:port" and "[v6]:port"). false if it is not one. */
bool kvf__srv_addr_parse(const char *s, size_t n, bool allow_port, struct kvf__srv_addr *out);
void kvf__srv_addr_format(const struct kvf__srv_addr *a, char *out, size_t cap);
bool kvf__srv_cidr_contains(const struct kvf__srv_cidr *c, const struct kvf__srv_addr *a);
bool kvf__srv_trusted(const struct kvf__srv_cidr *list, size_t n, const struct kvf__srv_addr *a);
/* "ADDR[/PREFIX],..." (blanks allowed) into *out (malloc'd, *n_out entries; NULL and 0 for an
 * empty or NULL text). 0, or -EINVAL with err naming the entry, -ENOMEM; nothing allocated then. */
int kvf__srv_cidrs_parse(const char *text, struct kvf__srv_cidr **out, size_t *n_out, char *err,
                         size_t err_len);
/* The client of a request whose peer (*client on entry) is a trusted proxy: the hops of the
 * Forwarded header's for= parameters (or, without Forwarded, of X-Forwarded-For), nearest
 * first; each hop in list passes on to the one before it, and the first that is not is the
 * client. A hop that is no address leaves the last trusted one as the client; a chain of trusted
 * hops only, its first. forwarded and xff: the headers' values, joined with ',' when repeated, or
 * NULL. */
void kvf__srv_forwarded_client(const struct kvf__srv_cidr *list, size_t n, const char *forwarded,
                               const char *xff, struct kvf__srv_addr *client);

/* --- Metrics (metrics.c). -------------------------------------------------------------------- */
#define KVF__SRV_HIST_MAX 16
struct kvf__srv_hist {
    const double *le; /* [n] upper bounds, seconds, increasing (static) */
    uint32_t n;
    uint64_t counts[KVF__SRV_HIST_MAX]; /* not cumulative; [n] is +Inf */
    uint64_t count;
    double sum;
};
struct kvf__srv_metrics {
    pthread_mutex_t mu; /* guards the histograms */
    struct kvf__srv_hist ttft, tpot, e2e;
    atomic_ullong errors[KVF__SRV_N_REASONS]; /* generation requests failed, by reason */
    /* The canary (canary.c): compared runs, mismatches, runs that ended without output. */
    atomic_ullong canary_runs, canary_failures, canary_errors;
    atomic_ullong prov_records; /* provenance records kept (prov.c) */
    bool canary_on;             /* --canary-interval: its series are rendered */
};
void kvf__srv_metrics_init(struct kvf__srv_metrics *m);
void kvf__srv_metrics_destroy(struct kvf__srv_metrics *m);
/* Records a finished run's latencies (µs figures; tokens: all choices'). */
void kvf__srv_metrics_observe(struct kvf__srv_metrics *m, const struct kvf__srv_run *r,
                              int64_t end_us);
/* Counts a generation request that ended with the error code code, if it names a reason
 * (NULL or another code: nothing). */
void kvf__srv_metrics_error(struct kvf__srv_metrics *m, const char *code);
/* The whole /metrics body into out. */
void kvf__srv_metrics_render(struct kvf__srv_metrics *m, struct kvf__srv_tenants *T,
                             const struct kvf_engine_info *in, uint32_t in_flight,
                             struct kvf__sbuf *out);

/* The split roles' per-worker series (a router's engine lists its workers). */
void kvf__srv_metrics_render_workers(const struct kvf_worker_status *ws, size_t n,
                                     struct kvf__sbuf *out);

/* --- Provenance (prov.c). ------------------------------------------------------------------ */
#define KVF__SRV_PROV_RING       1024 /* records kept (the oldest overwritten): about 1 MB */
#define KVF__SRV_MAX_N_PROV      128  /* records one lookup returns at most (a response's n) */
#define KVF__SRV_PROV_HEADER_MAX 6144 /* the response header's bytes before page lists go */
struct kvf__srv_prov_slot {
    char id[48]; /* the response id; "" = empty */
    uint32_t choice;
    struct kvf_gen_prov pv;
};
struct kvf__srv_prov_ring {
    pthread_mutex_t mu;
    struct kvf__srv_prov_slot *v; /* [cap] */
    uint32_t cap, next;
    uint64_t recorded;
};
int kvf__srv_prov_init(struct kvf__srv_prov_ring *r, uint32_t cap);
void kvf__srv_prov_destroy(struct kvf__srv_prov_ring *r);
void kvf__srv_prov_put(struct kvf__srv_prov_ring *r, const char *id, uint32_t choice,
                       const struct kvf_gen_prov *pv);
/* The records of response id, in choice order, up to max; how many. */
size_t kvf__srv_prov_get(struct kvf__srv_prov_ring *r, const char *id,
                         struct kvf__srv_prov_slot *out, size_t max);
/* Whether id[len] is a response id: "cmpl-" or "chatcmpl-" and 16 lowercase hex digits. */
bool kvf__srv_prov_id_ok(const char *id, size_t len);
/* One record as JSON (with_pages false: the page list left empty, the digest still there). */
json_t *kvf__srv_prov_json(const struct kvf_gen_prov *pv, bool with_pages);
/* The record's log form, decode:request:prefill@epoch:nonce:verified/granted tokens:verified:
 * pages:digest (ids and numbers only). Its length. */
size_t kvf__srv_prov_brief(const struct kvf_gen_prov *pv, char *out, size_t cap);

/* --- The canary (canary.c). ---------------------------------------------------------------- */
#define KVF__SRV_CANARY_TENANT UINT32_MAX /* the reserved tenant its requests run as */
struct kvf__srv_canary;
/* Starts the canary's thread: references at start, then one prompt every interval_ms. 0, or -1
 * (no memory, no thread). */
int kvf__srv_canary_start(struct kvf__srv_canary **out, const struct kvf_server_config *cfg,
                          const struct kvf_gen_ops *ops, void *engine,
                          struct kvf__srv_metrics *metrics, uint32_t interval_ms);
/* Stops and joins its thread (its request, if one is out, is cancelled and ended); /health may
 * still read it afterwards. Then, once no request thread can (the daemons stopped), free. */
void kvf__srv_canary_halt(struct kvf__srv_canary *c);
void kvf__srv_canary_free(struct kvf__srv_canary *c);
/* Whether a mismatch was seen (sticky until restart), with its reason into why. */
bool kvf__srv_canary_degraded(struct kvf__srv_canary *c, char *why, size_t why_len);
/* Prompts with a reference so far (0 until the start's references are made). */
uint32_t kvf__srv_canary_ready(struct kvf__srv_canary *c);

/* --- Operator endpoints (admin.c). --------------------------------------------------------- */
/* What a request to /health or /metrics is shown. */
enum kvf__srv_view {
    KVF__SRV_VIEW_PLAIN = 0, /* /health's status alone: {"status": "ok" | "unavailable"} */
    KVF__SRV_VIEW_FULL,      /* the whole /health, /metrics */
};
/* The view of GET /health (metrics false) or /metrics (true) for a request on the operator
 * address (on_admin) or the public one, with its Authorization header (NULL: none) and whether
 * it asked for /health's figures (?detail=1). 0 or 1 (a view), or -1 with e: 401 without a valid
 * admin key, 403 with a tenant's key, 404 on the public address when the operator address serves
 * it. Reads only cfg; the keys are compared in constant time. */
/* An endpoint that is the operator's alone, as /metrics (GET /admin/provenance/{id}): 0 when
 * the request may see it, or -1 with e (404 on the public address with an operator address;
 * with admin keys, 401 without a valid one, 403 for a tenant's key). */
int kvf__srv_admin_only(const struct kvf_server_config *cfg, bool on_admin, const char *what,
                        const char *authorization, struct kvf__srv_err *e);
int kvf__srv_admin_view(const struct kvf_server_config *cfg, bool on_admin, bool metrics,
                        const char *authorization, bool want_detail, struct kvf__srv_err *e);
/* The key of an `Authorization: Bearer KEY` header value (scheme in any case, blanks around the
 * key dropped): a view into h of *len bytes, or NULL when h is NULL, another scheme or empty. */
const char *kvf__srv_bearer(const char *h, size_t *len);

/* The operator address: a second libmicrohttpd daemon over the same callbacks, serving /health
 * and /metrics alone. Its connections have no deadlines of the watchdog; it takes at most
 * KVF__SRV_ADMIN_CONNS at once, each idle at most KVF__SRV_ADMIN_IDLE_S. */
#define KVF__SRV_ADMIN_CONNS  16
#define KVF__SRV_ADMIN_IDLE_S 10
struct kvf__srv_admin {
    struct MHD_Daemon *d; /* NULL: no operator address */
    int fd;               /* its listening socket, the daemon's: closed when it stops */
    uint16_t port;
};
/* Listens on host:port and serves with the callbacks (MHD's access handler and completion
 * notifier, each with cls). 0, or a negative code with err filled and nothing running. */
int kvf__srv_admin_start(struct kvf__srv_admin *a, const char *host, uint16_t port,
                         MHD_AccessHandlerCallback on_request,
                         MHD_RequestCompletedCallback on_completed, void *cls, char *err,
                         size_t err_len);
/* True when connection c came in on the operator address. */
bool kvf__srv_admin_conn(const struct kvf__srv_admin *a, struct MHD_Connection *c);
/* Stops the daemon (every connection closed, every thread joined). a->d may be NULL. */
void kvf__srv_admin_stop(struct kvf__srv_admin *a);

/* --- Listening sockets (http.c). ------------------------------------------------------------- */
/* A listening TCP socket on host:port (0: ephemeral). 0 with *fd_out and *v6, or a negative
 * errno with err filled. */
int kvf__srv_open_listener(const char *host, uint16_t port, int *fd_out, bool *v6, char *err,
                           size_t err_len);
/* The port fd is bound to, or 0. */
uint16_t kvf__srv_bound_port(int fd);

/* --- Logs (log.c). ------------------------------------------------------------------------- */
/* Formats "ts=<UTC ISO 8601 ms> " + fmt and hands the line to cfg->log (nothing if NULL). The
 * caller's values must be safe to print as they are: ids, tenant names, numbers, static codes —
 * never request text. */
__attribute__((format(printf, 2, 3))) void kvf__srv_log(const struct kvf_server_config *cfg,
                                                        const char *fmt, ...);

int64_t kvf__srv_now_us(void);

/* Fills buf[0..n) from the kernel's random source (getrandom(2), blocking only until the pool
 * is first initialised, as at boot). 0, or a negative errno with buf's contents unspecified.
 * Request ids, completion ids and default seeds are drawn here, each on its own: none is derived
 * from a counter or from another, so nothing about the server's other requests (how many came
 * before, when it started) can be read from them. */
int kvf__srv_random(void *buf, size_t n);

/* kvf_schema_to_grammar on a parsed schema (NULL: json_object). */
int kvf__srv_json_grammar(json_t *schema, char *out, size_t cap, char *err, size_t err_len);

#endif /* KVF_SERVER_INTERNAL_H */
