/*
 * kvfence/server.h — the router's HTTP face: an OpenAI-compatible API over the generation seam.
 *
 * The server turns HTTP requests into validated, tokenized struct kvf_gen_params, submits them
 * through struct kvf_gen_ops (gen.h), and turns the events back into OpenAI JSON or SSE
 * chunks. It never touches pages or transfers: a client that goes away, a stop string that
 * matched, or a stopping server all become ops->cancel, and the engine ends the request through
 * its protocol.
 *
 * Endpoints (bodies as in OpenAI's API; what is accepted and refused: src/server/request.c):
 *   POST /v1/completions        prompt: string (BOS prepended when the vocabulary asks for it) or
 *                               an array of token ids (sent as given)
 *   POST /v1/chat/completions   messages rendered by the model's chat template when
 *                               cfg->chat_template is set (special tokens parsed only where the
 *                               template wrote them: src/server/chat.c), else by the documented
 *                               default, kvf_server_chat_render
 *   Both take vLLM's return_tokens_as_token_ids: logprobs then name tokens "token_id:<id>".
 *   GET  /v1/models, GET /v1/models/{id}
 *   POST /tokenize   {"prompt": "...", "add_special_tokens": true} → {"tokens": [...], "count": n},
 *                    or {"messages": [...]} → the prompt a chat completion of them would send
 *   POST /detokenize {"tokens": [...]} → {"prompt": "..."}
 *   GET  /health     figures from ops->info; 503 while no prefill worker is connected
 *                    (with admin keys, only {"status"} without one; ?detail=1 asks for the
 *                    figures and is refused without one: src/server/admin.c)
 *   GET  /metrics    the Prometheus text format (src/server/metrics.c names every series);
 *                    an operator endpoint, as /health's figures (cfg->admin_keys, admin_listen)
 *
 * Tenants (src/server/tenant.c): with cfg->keys, every endpoint but /health and /metrics needs
 * `Authorization: Bearer KEY` (401 otherwise; keys compared in constant time, never logged or
 * echoed) and the key's tenant is the request's (kvf_gen_params.tenant: the tenant's index in
 * the key file, from 1). Without keys every request is cfg->tenant's ("default"). A tenant's
 * share counts what its requests take: the sequences they run (n choices: n sequences) against
 * cfg->tenant_max_running, and the KV they reserve (n × (prompt + max_tokens), in whole pages)
 * against cfg->tenant_max_kv_tokens (or its default, below). A request that does not fit beside
 * the tenant's running ones waits in the server (not in the engine) — up to
 * cfg->tenant_max_queued of them, each at most cfg->tenant_wait_ms — and past that gets 429 with
 * Retry-After, so one tenant's burst queues behind itself, not in front of the others. A request
 * that could never fit its tenant's share gets 400 `tenant_share_exceeded` naming the bound, at
 * once. /tokenize and /detokenize count one sequence each (no KV).
 *
 * Ids and seeds: a request id ("req-" + 16 hex digits, in the logs), a completion id ("cmpl-" or
 * "chatcmpl-" + 16 hex digits) and the default seed of a request that gives none are each 64 bits
 * drawn from getrandom(2) for that request alone: no counter, start time or other request can be
 * read from them. A request's n choices use its seed + 0 .. n-1, so they differ from each other
 * and a request that gives the same seed gets the same choices.
 *
 * Logs: with cfg->log, one line per event (key=value: ts, event, id, tenant, and the figures of
 * the event); never prompt text, output, token ids or keys (BAD_INPUTS row 8).
 *
 * Lifecycle:
 *
 *     kvf_server_start ──▶ RUNNING ──kvf_server_stop──▶ (freed)
 *
 *   stop: the listening socket is closed first (no new connection is accepted), requests in
 *   flight get up to cfg->drain_ms to finish, then each is cancelled through ops->cancel (a
 *   stream ends with an error event, a waiting non-streaming request gets 503), every
 *   connection thread is joined, and every handle has been released when stop returns.
 *
 * Threading: libmicrohttpd runs one listening thread and one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION). A connection's thread owns everything of the requests on
 * that connection — the body buffer, the generation handles, the detokenizer and stop-string
 * state — and is the only thread that calls ops->submit, next, cancel and release for them
 * (gen.h allows calls from any thread, one thread per handle). A request waiting for tokens
 * waits in ops->next with a timeout of at most KVF_SERVER_POLL_MS and, between waits, polls its
 * connection's socket for a hang-up (POLLRDHUP/POLLHUP/POLLERR) and the server for stop: a
 * client that disconnects while queued, while streaming or while a non-streaming response is
 * being produced is cancelled within about KVF_SERVER_POLL_MS. ops->info is called from any
 * connection thread.
 *
 * Ownership: cfg and its strings are copied by start. ops, engine and tok are borrowed and must
 * outlive the server (until kvf_server_stop returns).
 *
 * Work bounds: a body is at most cfg->max_body_bytes (413 before it is read past that);
 * UTF-8 validation and the JSON nesting scan are one pass each over the body, with no
 * recursion; jansson then parses at most KVF_SERVER_MAX_JSON_DEPTH levels. A request runs at
 * most cfg->max_n generations at once.
 */
#ifndef KVFENCE_SERVER_H
#define KVFENCE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/gen.h"
#include "kvfence/text.h"

#define KVF_SERVER_MAX_JSON_DEPTH 64  /* deeper bodies are refused with 400 before parsing */
#define KVF_SERVER_MAX_STOP       4   /* stop strings per request */
#define KVF_SERVER_MAX_STOP_BYTES 256 /* bytes per stop string */
#define KVF_SERVER_POLL_MS        20  /* longest wait in ops->next between hang-up checks */

struct kvf_server_config {
    const char *host;               /* numeric address or name to listen on; NULL = "127.0.0.1" */
    uint16_t port;                  /* 0 = ephemeral (read it with kvf_server_port) */
    const char *model_name;         /* the id /v1/models lists; NULL = "kvfence"; requests may name
                                       any model (the field is not checked) */
    const char *served_model_names; /* "NAME[,ALIAS...]" (--served-model-name): responses name
                                       the first, /v1/models lists each, and a completion or chat
                                       request naming another model gets 404 model_not_found
                                       (one that names none is served); NULL = model_name alone,
                                       unchecked */
    uint64_t model_fp;        /* the model's fingerprint: system_fingerprint is a hash of it and the
                                 build's version */
    const char *cors_origins; /* "ORIGIN[,ORIGIN...]" or "*" (--cors-origins): the browser
                                 origins that may call the API (src/server/http.c, "CORS");
                                 NULL = none, and no CORS headers */
    size_t max_body_bytes;    /* 0 = 1 MiB */
    size_t tokenize_max_bytes;   /* the body of /tokenize and /detokenize, at most max_body_bytes;
                                    0 = 256 KiB */
    uint32_t max_n;              /* most choices per request; 0 = 8 */
    uint32_t max_queue;          /* most requests in flight in this server (running or waiting in
                                    the engine) before 429; 0 = 256 */
    uint32_t default_max_tokens; /* max_tokens when the request gives none: the rest of the
                                    served limit after the prompt, capped at this; 0 = 256 */
    /* Connection caps (src/server/http.c, "Connection caps"): a request past one gets 503 with
     * Retry-After and its connection is closed after the answer, never reset. */
    uint32_t max_connections;    /* connections served at once; 0 = 256 */
    uint32_t max_conn_per_ip;    /* connections of one client address; 0 = 64 */
    const char *trusted_proxies; /* "ADDR[/PREFIX],...": peers whose Forwarded or
                                    X-Forwarded-For names the client (the last hop not in this
                                    list); NULL = none, the peer is the client */
    uint32_t keyed_reserve;      /* with keys: connections kept for requests with a valid key
                                    (others are served up to max_connections − this); 0 =
                                    max_connections / 4 */
    uint32_t keyless_timeout_ms; /* with keys: a connection that has not shown a valid key must
                                    send its request's headers within this (of the accept or of
                                    its previous answer); so must, keys or not, one whose address
                                    had max_conn_per_ip connections at its accept; 0 = 2000 */
    uint32_t idle_timeout_s;     /* a connection idle this long is closed; 0 = 30 */
    /* Bounds on slow clients (src/server/http.c, "Connection deadlines"): a request's line and
     * headers must arrive within header_timeout_ms of the accept (a kept-alive connection's next
     * request: within idle_timeout_s of the previous response), its body within body_timeout_ms
     * of its headers (else 408 and closed), and response bytes may wait unsent, the client not
     * reading them, at most send_timeout_ms (then closed). 0 = 10000, 30000, 30000. */
    uint32_t header_timeout_ms;
    uint32_t body_timeout_ms;
    uint32_t send_timeout_ms;
    uint32_t retry_after_s;    /* Retry-After of a 429; 0 = 1 */
    uint32_t drain_ms;         /* stop: how long requests in flight may still finish */
    uint32_t tenant;           /* the tenant every request is submitted as (no API keys yet) */
    const char *chat_template; /* the model's tokenizer.chat_template, checked by
                                  kvf_server_chat_template_check; NULL = the default rendering */
    const struct kvf_server_keys *keys; /* borrowed, outlives the server; NULL = no API keys */
    uint32_t tenant_max_running;        /* sequences of one tenant running at once (a request with n
                                           choices runs n; /tokenize and /detokenize one); 0 = no bound */
    uint32_t tenant_max_queued;         /* requests of one tenant waiting for its share before 429
                                           (with tenant_max_running; without it, waiting is bounded by
                                           tenant_wait_ms only) */
    uint64_t tenant_max_kv_tokens;      /* KV tokens one tenant's running requests may reserve at
                                           once (a request reserves n × (prompt + max_tokens), in whole
                                           pages); 0 = the default: with two or more tenants and a
                                           known pool, the larger of (pool / tenants) and (pool − one
                                           request at the served limit for each other tenant), and at
                                           least one request at the limit; else no bound */
    uint32_t tenant_wait_ms;            /* longest wait for a tenant slot before 429; 0 = 30000 */
    /* Log sink: called with one NUL-terminated line (no newline) from any connection thread,
     * concurrently; NULL = no logs. */
    void (*log)(void *arg, const char *line);
    void *log_arg;
    /* Operator endpoints (src/server/admin.c): /metrics and the detailed /health. With
     * admin_keys, they need one of its keys — 401 without a valid key, 403 for a tenant's key,
     * which never opens them — and /health without an admin key is the plain one, its status
     * alone (up or down, naming no tenant). With admin_listen they are served on
     * admin_host:admin_port, which serves nothing else, and the public address answers /metrics
     * with 404 and /health plainly. Neither: both are served to anyone, as the public API. */
    const struct kvf_server_keys *admin_keys; /* borrowed, outlives the server; NULL = none */
    bool admin_listen;
    const char *admin_host; /* NULL = "127.0.0.1" */
    uint16_t admin_port;    /* 0 = ephemeral (read it with kvf_server_admin_port) */
    /* The canary (src/server/canary.c): every canary_interval_ms one of a fixed set of prompts
     * is submitted through the seam as tenant UINT32_MAX and its tokens and logprobs compared
     * with the reference made at start; 0 = none. */
    uint32_t canary_interval_ms;
};

/* --- API keys. ------------------------------------------------------------------------------
 *
 * A key file has one `KEY TENANT` per line (separated by spaces or tabs); blank lines and lines
 * whose first non-blank character is '#' are ignored. A key is 8..KVF_SERVER_MAX_KEY_BYTES
 * printable ASCII characters without spaces and appears once; a tenant name is 1..64 of
 * [A-Za-z0-9_.-], not starting with '_' (names beginning with '_' are the server's own). Tenants
 * are numbered from 1 in the order they first appear. Work: one pass over the text; a lookup
 * compares the candidate with every key, each over KVF_SERVER_MAX_KEY_BYTES bytes.
 */
#define KVF_SERVER_MAX_KEY_BYTES   256
#define KVF_SERVER_MAX_TENANT_NAME 64
typedef struct kvf_server_keys kvf_server_keys_t;
/* Parses text[0..len). 0 with *out (free with kvf_server_keys_free), or -EINVAL with err naming
 * the line and what is wrong with it (never the key itself), -ENOMEM; nothing allocated then. */
int kvf_server_keys_parse(const char *text, size_t len, kvf_server_keys_t **out, char *err,
                          size_t err_len);
/* Reads and parses the file at path (errors as parse, or the file's errno). */
int kvf_server_keys_load(const char *path, kvf_server_keys_t **out, char *err, size_t err_len);
size_t kvf_server_keys_count(const kvf_server_keys_t *k);
size_t kvf_server_keys_n_tenants(const kvf_server_keys_t *k);
/* The name of tenant id (1..n_tenants), or NULL. */
const char *kvf_server_keys_tenant_name(const kvf_server_keys_t *k, uint32_t id);
/* The tenant whose key is key[0..len), or 0 when none is: constant time in the key's bytes. */
uint32_t kvf_server_keys_lookup(const kvf_server_keys_t *k, const char *key, size_t len);
/* True when some key of a is also a key of b (an operator's key file and the tenants' must not
 * share a key). Constant time in the keys' bytes, as lookup. */
bool kvf_server_keys_overlap(const kvf_server_keys_t *a, const kvf_server_keys_t *b);
/* Wipes the keys and frees. k may be NULL. */
void kvf_server_keys_free(kvf_server_keys_t *k);

typedef struct kvf_server kvf_server_t;

/* Starts listening and serving. 0 with *out the server, or a negative code (-EINVAL bad config,
 * -EADDRINUSE / -EADDRNOTAVAIL / KVF_E_SERVER when the daemon cannot start, -ENOMEM); on
 * failure nothing is left running, *out is untouched and err explains. */
int kvf_server_start(const struct kvf_server_config *cfg, const struct kvf_gen_ops *ops,
                     void *engine, const kvf_tokenizer_t *tok, kvf_server_t **out, char *err,
                     size_t err_len);

/* The port the server listens on (the ephemeral one when cfg->port was 0). */
uint16_t kvf_server_port(const kvf_server_t *s);

/* The operator address's port (cfg->admin_listen), or 0 when there is none. */
uint16_t kvf_server_admin_port(const kvf_server_t *s);

/* Stops as the header comment says and frees the server. Never fails; s may be NULL. */
void kvf_server_stop(kvf_server_t *s);

/* --- The default chat rendering. -----------------------------------------------------------
 *
 * For models without a chat template (or one the interpreter refuses), messages are rendered as
 * one line per message, "<role>: <content>\n", followed by "assistant:" — e.g.
 *     system: Be brief.\nuser: Hi\nassistant:
 * (the content is copied as is; the model continues after "assistant:"). Roles: system,
 * developer, user, assistant, tool. The text is encoded as a string prompt is (BOS when the
 * vocabulary asks for it; special tokens never parsed).
 */
struct kvf_server_chat_msg {
    const char *role;    /* borrowed */
    const char *content; /* borrowed, content_len bytes of valid UTF-8 */
    size_t content_len;
};
/* Writes the rendering into out (malloc'd, NUL-terminated, *out_len bytes; the caller frees).
 * 0, or -EINVAL (no messages) / -ENOMEM with nothing allocated. */
int kvf_server_chat_render(const struct kvf_server_chat_msg *msgs, size_t n_msgs, char **out,
                           size_t *out_len);

/* Whether tmpl (a model's tokenizer.chat_template) can serve chat: it renders a one-message
 * conversation with kvf_template_render and the result encodes. 0, or -EINVAL with err saying
 * what the template needs that the interpreter refuses (-ENOMEM: no memory). A template that
 * fails on a particular request later answers that request with 400 naming the problem. */
int kvf_server_chat_template_check(const char *tmpl, const kvf_tokenizer_t *tok, char *err,
                                   size_t err_len);

/* Structured outputs (src/server/schema.c): the GBNF grammar (kvfence/grammar.h) of a JSON
 * Schema given as len bytes of JSON text, or, with schema NULL, of any JSON object
 * (response_format json_object). Writes it NUL-terminated into out (cap bytes; give
 * KVF_GRAMMAR_MAX_BYTES + 1) and returns its length; or -EINVAL (a keyword not supported, named
 * in err, or a malformed schema), -E2BIG (the grammar would exceed KVF_GRAMMAR_MAX_BYTES, or the
 * schema nests deeper than 16), -ENOMEM. The grammar is compact JSON; schema.c's header lists the
 * keywords. */
int kvf_schema_to_grammar(const char *schema, size_t len, char *out, size_t cap, char *err,
                          size_t err_len);

#endif /* KVFENCE_SERVER_H */
