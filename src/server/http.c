/*
 * http.c — libmicrohttpd: the listening socket, routing, request bodies, responses, streaming,
 * hang-up polling, start and stop. Threading and ownership: see server.h.
 *
 * A request's life on its connection thread:
 *
 *   headers ──▶ on_request(first call): header count (431), route (404/405), the connection
 *               caps (503: "Connection caps"), the key (401), body headers (400, 413)
 *   body    ──▶ on_request(upload data): appended up to the route's bound, max_body_bytes or
 *               tokenize_max_bytes (past it: 413 at once)
 *   end     ──▶ dispatch: GET answers at once; POST parses, validates, submits, then
 *                 non-streaming: waits here (polling the socket) and answers with one body
 *                 streaming:     queues a callback response; stream_read waits per chunk
 *   done    ──▶ on_completed frees the per-request state; a stream's run is freed with its
 *               response (stream_free), cancelling what is unfinished.
 *
 * Before the body: with API keys, the key is checked on the first call (401 without reading
 * the body). Before submit: the tenant's share (tenant.c) — the sequences and KV the request
 * takes, at once, after a bounded wait (polling the socket and stop like a running request), or
 * 429; 400 if it could never fit. /tokenize and /detokenize take one sequence of it too. Every
 * generation request ends in request_end: its outcome counted for its tenant, its latencies
 * observed, one log line.
 *
 * Slow clients: a watchdog thread bounds the time to a request's headers, to its body, and
 * that a response may wait for a client that does not read it ("Connection deadlines").
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <linux/sockios.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvfence/common.h"
#include "kvfence/pool.h"
#include "server_internal.h"

/* One connection as the watchdog sees it (see "Connection deadlines"). An entry is in use from
 * MHD's NOTIFY_STARTED to its NOTIFY_CLOSED, which MHD calls before it closes the socket, so
 * fd is the connection's own for as long as the entry is in use. Fields under guard.mu. */
enum guard_phase {
    G_HEAD, /* waiting for a request line and headers: until deadline_ms */
    G_BODY, /* reading a request body: until deadline_ms */
    G_WORK, /* answering: no deadline (generation takes its time; peer_gone finds a gone client) */
};
struct guard_conn {
    bool in_use;
    bool closed; /* the watchdog shut it down; nothing more is done to it */
    enum guard_phase phase;
    int fd;
    int64_t deadline_ms;     /* G_HEAD, G_BODY: monotonic ms by which the phase must end */
    int64_t unsent_since_ms; /* the first check of the current run of checks that all found
                                response bytes unsent; 0: the last check found none */
    uint32_t n_answered;     /* requests completed on this connection */
    /* Connection caps ("Connection caps" below). */
    struct kvf__srv_addr peer; /* the socket's peer */
    bool trusted_peer;         /* peer is a trusted proxy: the client comes from its headers */
    bool keyed;                /* a request on it showed a valid API key */
    bool over_at_accept;       /* its peer had max_conn_per_ip connections already at accept */
    int32_t ac;                /* its entry in the per-address counts, or -1 */
};
/* Connections per client address: one entry per address with connections, at most one entry
 * per connection, so the table of guard.n entries never fills. */
struct addr_count {
    struct kvf__srv_addr a;
    uint32_t n; /* 0: the entry is free */
};

/* The watchdog: one thread, a table of guard.n entries allocated at start (nothing is
 * allocated per connection), a scan every tick_ms. Work per tick: one pass over the table, one
 * ioctl per connection in use. */
struct guard {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled by stop */
    pthread_t thread;
    bool stop;
    struct guard_conn *c;  /* [n] */
    struct addr_count *ac; /* [n] */
    uint32_t n;            /* libmicrohttpd's limit: max_connections + the room for refusals */
    uint32_t tick_ms;
    uint32_t header_ms, body_ms, send_ms, idle_ms;
    uint32_t keyless_ms; /* with keys: header and idle bound before a valid key is shown */
    bool keys;
    uint32_t max_conns, keyless_conns, per_addr; /* the caps */
    const struct kvf__srv_cidr *trusted;         /* the server's, [n_trusted] */
    size_t n_trusted;
    uint32_t n_keyed; /* connections in use that showed a valid key */
    /* Figures for /health ("http"). */
    atomic_uint open;            /* connections in the table */
    atomic_ullong untracked;     /* connections accepted with the table full (no deadlines) */
    atomic_ullong closed_head;   /* headers not in within their bound */
    atomic_ullong closed_body;   /* a body not in within its bound */
    atomic_ullong closed_send;   /* a client that did not read its response */
    atomic_ullong refused_conns; /* 503 to a request past a connection cap */
};

/* Row 21's bounds. A connection's memory (MHD's pool: the request line, the headers, the read
 * buffer, a chunk line) is at most KVF__SRV_CONN_MEMORY bytes: beyond it MHD answers 414 to a
 * request line and 431 to headers. Headers that fit but number more than KVF__SRV_MAX_HEADERS
 * get 431 here. */
#define KVF__SRV_CONN_MEMORY (32u * 1024u)
#define KVF__SRV_MAX_HEADERS 100

struct kvf_server {
    struct kvf_server_config cfg;       /* defaults filled in; strings point at host/model below */
    char *host, *model, *chat_template; /* chat_template NULL: the default rendering */
    char *names_buf;      /* served_model_names, each ',' made a NUL; NULL without them */
    const char **names;   /* [n_names] into names_buf: names[0] is model */
    size_t n_names;       /* 0: the model field of a request is not checked */
    char fingerprint[24]; /* system_fingerprint: "fp_" and 16 hex digits */
    char *cors_buf;       /* cors_origins, each ',' made a NUL; NULL without them */
    const char **cors;    /* [n_cors] into cors_buf */
    size_t n_cors;        /* 0: no CORS headers, OPTIONS is 405 */
    bool cors_any;        /* cors_origins is "*" */
    const struct kvf_gen_ops *ops;
    void *engine;
    const kvf_tokenizer_t *tok;
    struct MHD_Daemon *d;
    int listen_fd; /* ours: closed after the daemon stops */
    uint16_t port;
    int64_t created;       /* unix seconds at start (/v1/models) */
    atomic_bool stopping;  /* requests in flight cancel and end */
    atomic_uint in_flight; /* requests holding a run */
    struct kvf__srv_tenants tenants;
    struct kvf__srv_metrics metrics;
    struct guard guard;
    struct kvf__srv_cidr *trusted; /* --trusted-proxy, [n_trusted] */
    size_t n_trusted;
    struct kvf__srv_admin admin;    /* the operator address (cfg.admin_listen), admin.c */
    struct kvf__srv_prov_ring prov; /* the responses' provenance records (prov.c) */
    struct kvf__srv_canary *canary; /* cfg.canary_interval_ms (canary.c); NULL: none */
};

enum route {
    R_COMPLETIONS = 1,
    R_CHAT,
    R_MODELS,
    R_MODEL_ONE,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_HEALTH,
    R_METRICS,
    R_PROV,
};

/* Per-request state (MHD's *con_cls), owned by the connection thread. */
struct conn_req {
    enum route route;
    const char *model_id; /* R_MODEL_ONE: the id in the path (points into MHD's url) */
    struct kvf__sbuf body;
    size_t max_body; /* this route's bound on the body: max_body_bytes, or
                        tokenize_max_bytes for /tokenize and /detokenize */
    bool too_big;    /* the body passed max_body and was answered with 413 */
    bool over_cap;   /* past a connection cap: the body is read and dropped, then 503 */
    struct kvf__srv_err cap_err;
    char id[24];                 /* "req-<16 random hex>": names the request in the logs */
    size_t ti;                   /* the tenant (index into the server's table) */
    struct kvf__srv_share share; /* what it takes of the tenant's share once admitted */
    bool holds_flight;           /* a non-streaming answer: in_flight counts it until completed */
};

/* A streaming response's state, owned by the response (freed in stream_free). */
struct stream {
    struct kvf_server *s;
    struct kvf__srv_run *run;
    struct MHD_Connection *conn; /* the connection the stream is the response of */
    int fd;                      /* the connection's socket, polled for hang-up */
    struct kvf__sbuf out;        /* SSE bytes not yet handed to MHD, from off */
    size_t off;
    bool finished; /* nothing more after out */
    char id[24];   /* the request's (conn_req's) */
    size_t ti;
    struct kvf__srv_share share;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The client closed or reset its side. A client that half-closes after sending its request
 * counts as gone too (no HTTP client does that and waits for the answer). */
static bool peer_gone(int fd)
{
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* Restarts the connection's idle timer. The idle timeout is for connections that do nothing;
 * time spent waiting for tokens is not idleness (a dead client is found by peer_gone). MHD
 * restarts the timer when the timeout goes from 0 to a value. Called on the connection's
 * thread. */
static void touch(struct kvf_server *s, struct MHD_Connection *c)
{
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->cfg.idle_timeout_s);
}

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* --- Connection deadlines (rows 20, 21). ------------------------------------------------------
 *
 * libmicrohttpd's timeout (idle_timeout_s) restarts on every byte, so a client that sends a
 * header line every few seconds, its body a byte at a time, or reads its response a few bytes
 * at a time, could hold a connection and its thread for as long as it liked. A watchdog thread
 * bounds each phase of a request from outside MHD:
 *
 *   accept ─▶ G_HEAD ──headers in, POST──▶ G_BODY ──body in──▶ G_WORK ──answered──▶ G_HEAD ...
 *               │    ──headers in, other─────────────────────▶ G_WORK   (kept alive)
 *               └ header_timeout_ms     └ body_timeout_ms       no bound
 *   A kept-alive connection's G_HEAD lasts idle_timeout_s from the end of the previous answer.
 *   In every phase: response bytes found unsent by every check for send_timeout_ms (the client
 *   reads nothing, or only a trickle) → closed.
 *
 * A G_HEAD or G_BODY past its deadline gets a 408 written straight to the socket — MHD writes
 * nothing there before the request is whole (but a 100 Continue, long before any deadline) —
 * except between requests on a kept-alive connection, where the client may be sending its
 * next request as the 408 goes out and would take it for that request's answer. The
 * connection is then shut down (SHUT_RDWR): its thread reads end of file and MHD closes it, or,
 * in a request that is running, peer_gone sees the hang-up and cancels the request.
 *
 * Transitions: on_connection (accept: G_HEAD; close: the entry is freed), on_request (headers
 * in: G_WORK, then G_BODY if the body is to be read; body in: G_WORK), on_completed (answered:
 * G_HEAD), guard_main (any deadline: closed).
 */
static struct guard_conn *guard_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Moves a connection to phase p, its deadline bound_ms from now (G_WORK: none). gc may be NULL
 * (a connection accepted with the table full). */
static void guard_enter(struct guard *g, struct guard_conn *gc, enum guard_phase p,
                        uint32_t bound_ms)
{
    if (!gc) return;
    pthread_mutex_lock(&g->mu);
    /* Before a valid key, the next request's headers get the keyless bound. */
    if (p == G_HEAD && g->keys && !gc->keyed && g->keyless_ms < bound_ms) bound_ms = g->keyless_ms;
    gc->phase = p;
    gc->deadline_ms = p == G_WORK ? INT64_MAX : now_ms() + bound_ms;
    if (p == G_HEAD) gc->n_answered++;
    pthread_mutex_unlock(&g->mu);
}

/* --- Connection caps. ------------------------------------------------------------------------
 *
 * Every cap answers the request that passes it with 503 and Retry-After, and closes the
 * connection after the answer — never a reset, never a connection dropped unanswered:
 *
 *   max_conn_per_ip   connections of one client address. The client is the peer, or, when the
 *                     peer is a trusted proxy (--trusted-proxy), the last hop of its Forwarded /
 *                     X-Forwarded-For that is not one (netaddr.c); a proxy's connections are
 *                     counted under the client of their latest request.
 *   max_connections   connections served at once. With API keys, connections that have not shown
 *                     a valid key are served only up to max_connections − keyed_reserve, so
 *                     keyless clients cannot take the room of keyed tenants; they also get
 *                     keyless_timeout_ms (not header_timeout_ms, not idle_timeout_s) for their
 *                     next request's headers.
 *
 * The decision is made when a request's headers are in (its address and key known). A request
 * with a body past a cap has its body read and dropped first (within body_timeout_ms), so that
 * the connection closes with nothing unread and the client reads the 503 instead of a reset.
 * libmicrohttpd itself accepts up to guard.n = max_connections + keyed_reserve + spare
 * connections, and past that leaves new ones in the listen backlog (MHD_USE_ITC), which the
 * watchdog's bounds drain. All of it under guard.mu; each decision is O(guard.n).
 */

/* The count entry of address a (taken when new); its count after adding gc, which leaves the
 * entry it had. */
static uint32_t addr_assign(struct guard *g, struct guard_conn *gc, const struct kvf__srv_addr *a)
{
    if (gc->ac >= 0 && memcmp(&g->ac[gc->ac].a, a, sizeof *a) == 0) return g->ac[gc->ac].n;
    if (gc->ac >= 0) g->ac[gc->ac].n--;
    int32_t found = -1, free_e = -1;
    for (uint32_t i = 0; i < g->n && found < 0; i++) {
        if (g->ac[i].n && memcmp(&g->ac[i].a, a, sizeof *a) == 0)
            found = (int32_t)i;
        else if (!g->ac[i].n && free_e < 0)
            free_e = (int32_t)i;
    }
    if (found < 0) {
        found = free_e; /* one entry per connection at most: there is always a free one */
        g->ac[found].a = *a;
        g->ac[found].n = 0;
    }
    g->ac[found].n++;
    gc->ac = found;
    return g->ac[found].n;
}

static void addr_release(struct guard *g, struct guard_conn *gc)
{
    if (gc->ac >= 0) g->ac[gc->ac].n--;
    gc->ac = -1;
}

/* MHD's connection notifier: accepted (a table entry in G_HEAD) and closed (the entry freed,
 * before MHD closes the socket). Called on MHD's threads. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct guard *g = &((struct kvf_server *)cls)->guard;
    pthread_mutex_lock(&g->mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct guard_conn *gc = NULL;
        for (uint32_t i = 0; i < g->n && !gc; i++)
            if (!g->c[i].in_use) gc = &g->c[i];
        if (gc) {
            memset(gc, 0, sizeof *gc);
            gc->in_use = true;
            gc->phase = G_HEAD;
            gc->fd = conn_fd(c);
            gc->ac = -1;
            const union MHD_ConnectionInfo *ci =
                MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
            kvf__srv_addr_from_sockaddr(ci ? ci->client_addr : NULL, &gc->peer);
            gc->trusted_peer = kvf__srv_trusted(g->trusted, g->n_trusted, &gc->peer);
            /* A trusted proxy's connections are counted under their clients, once a request
             * names them; any other peer's under its own address from the accept. */
            if (!gc->trusted_peer && addr_assign(g, gc, &gc->peer) > g->per_addr)
                gc->over_at_accept = true;
            uint32_t head_ms = g->header_ms;
            if ((g->keys || gc->over_at_accept) && g->keyless_ms < head_ms) head_ms = g->keyless_ms;
            gc->deadline_ms = now_ms() + head_ms;
            atomic_fetch_add(&g->open, 1);
        } else {
            atomic_fetch_add(&g->untracked, 1);
        }
        *socket_context = gc;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct guard_conn *gc = *socket_context;
        if (gc) {
            addr_release(g, gc);
            if (gc->keyed) g->n_keyed--;
            gc->in_use = false;
            atomic_fetch_sub(&g->open, 1);
        }
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&g->mu);
}

/* Writes a whole "Connection: close" answer straight to the socket, past MHD, as far as the
 * socket takes it without blocking; for where MHD has written nothing and cannot queue an
 * answer (a request not yet whole). */
static void send_raw(int fd, const char *status_line, const char *json)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     status_line, strlen(json), json);
    if (fd >= 0 && n > 0 && (size_t)n < sizeof buf)
        (void)!send(fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Shuts the connection down, with a 408 first when with_408. Under g->mu. Never blocks. */
static void guard_close(struct guard_conn *gc, bool with_408)
{
    if (with_408)
        send_raw(gc->fd, "408 Request Timeout",
                 "{\"error\":{\"message\":\"the request did not arrive within the server's time "
                 "bound\",\"type\":\"invalid_request_error\",\"param\":null,"
                 "\"code\":\"request_timeout\"}}");
    shutdown(gc->fd, SHUT_RDWR);
    gc->closed = true;
}

static void *guard_main(void *arg)
{
    struct guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        int64_t t = now_ms();
        for (uint32_t i = 0; i < g->n; i++) {
            struct guard_conn *gc = &g->c[i];
            if (!gc->in_use || gc->closed) continue;
            if (gc->phase != G_WORK && t >= gc->deadline_ms) {
                atomic_fetch_add(gc->phase == G_HEAD ? &g->closed_head : &g->closed_body, 1);
                guard_close(gc, gc->phase == G_BODY || gc->n_answered == 0);
                continue;
            }
            /* Bytes the kernel has not sent yet (not counting those sent and not yet acked):
             * nonzero at a check means the client's window is shut — it is not reading. */
            int unsent = 0;
            if (ioctl(gc->fd, SIOCOUTQNSD, &unsent) < 0 || unsent <= 0) {
                gc->unsent_since_ms = 0;
            } else if (!gc->unsent_since_ms) {
                gc->unsent_since_ms = t;
            } else if (t - gc->unsent_since_ms >= g->send_ms) {
                atomic_fetch_add(&g->closed_send, 1);
                guard_close(gc, false);
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)g->tick_ms * 1000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Allocates the tables (an entry for every connection libmicrohttpd may accept) and starts the
 * watchdog. 0, or -ENOMEM / -errno
 * with nothing left allocated or running. */
static int guard_start(struct guard *g, const struct kvf_server_config *cfg,
                       const struct kvf__srv_cidr *trusted, size_t n_trusted)
{
    memset(g, 0, sizeof *g);
    g->keys = cfg->keys != NULL;
    g->max_conns = cfg->max_connections;
    uint32_t reserve = g->keys ? cfg->keyed_reserve : 0;
    g->keyless_conns = g->max_conns - reserve;
    g->per_addr = cfg->max_conn_per_ip;
    g->keyless_ms = cfg->keyless_timeout_ms;
    g->trusted = trusted;
    g->n_trusted = n_trusted;
    /* Room beyond max_connections for the connections that are answered 503. */
    uint32_t spare = cfg->max_connections / 8 < 16 ? 16 : cfg->max_connections / 8;
    g->n = cfg->max_connections + reserve + spare;
    g->header_ms = cfg->header_timeout_ms;
    g->body_ms = cfg->body_timeout_ms;
    g->send_ms = cfg->send_timeout_ms;
    g->idle_ms = cfg->idle_timeout_s * 1000u;
    uint32_t least = g->header_ms < g->body_ms ? g->header_ms : g->body_ms;
    least = least < g->send_ms ? least : g->send_ms;
    /* Eight checks per bound: a connection is closed at most an eighth of its bound late. */
    g->tick_ms = least / 8 < 5 ? 5 : least / 8 > 250 ? 250 : least / 8;
    if (!(g->c = calloc(g->n, sizeof *g->c))) return -ENOMEM;
    if (!(g->ac = calloc(g->n, sizeof *g->ac))) {
        free(g->c);
        return -ENOMEM;
    }
    int rc;
    pthread_condattr_t ca;
    if ((rc = pthread_condattr_init(&ca)) != 0) goto free_table;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) goto free_table;
    if ((rc = pthread_mutex_init(&g->mu, NULL)) != 0) goto destroy_cv;
    if ((rc = pthread_create(&g->thread, NULL, guard_main, g)) != 0) goto destroy_mu;
    return 0;
destroy_mu:
    pthread_mutex_destroy(&g->mu);
destroy_cv:
    pthread_cond_destroy(&g->cv);
free_table:
    free(g->c);
    free(g->ac);
    g->c = NULL;
    g->ac = NULL;
    return -rc;
}

/* Stops the watchdog and frees the table; after MHD_stop_daemon (every connection closed). */
static void guard_stop(struct guard *g)
{
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->c);
    free(g->ac);
}

/* --- Responses. ------------------------------------------------------------------------------ */

/* --- CORS. ------------------------------------------------------------------------------------
 *
 * Without cors_origins nothing here adds a header and OPTIONS is 405, as before. With it, a
 * request whose Origin is listed gets Access-Control-Allow-Origin echoing it (with Vary: Origin),
 * or "*" when the list is "*"; Access-Control-Allow-Credentials is never sent (an API key travels
 * in Authorization, which a browser sends without credentials mode), so "*" can never expose a
 * cookie-authenticated answer. A preflight (OPTIONS on a known path) from a listed origin gets
 * 204 with the methods and headers a request may use; from another origin, 403.
 */

/* The Access-Control-Allow-Origin this request gets, or NULL (borrowed: static or MHD's). */
static const char *cors_allow(const struct kvf_server *s, struct MHD_Connection *c)
{
    if (!s->n_cors) return NULL;
    const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!o) return NULL;
    if (s->cors_any) return "*";
    for (size_t i = 0; i < s->n_cors; i++)
        if (strcmp(o, s->cors[i]) == 0) return o;
    return NULL;
}

/* Every answer goes out here: the CORS headers (if any), then MHD. */
static enum MHD_Result queue(struct kvf_server *s, struct MHD_Connection *c, unsigned status,
                             struct MHD_Response *r)
{
    const char *allow = cors_allow(s, c);
    if (allow) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
        if (!s->cors_any) MHD_add_response_header(r, "Vary", "Origin");
    }
    return MHD_queue_response(c, status, r);
}

/* Access-Control-Request-Headers, echoed when it is a plain list of header names (at most 1 KiB
 * of letters, digits, '-', '_', ',' and blanks), else the headers the API reads. */
static const char *cors_request_headers(struct MHD_Connection *c)
{
    static const char def[] = "Authorization, Content-Type";
    const char *h =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    if (!h || !*h || strlen(h) > 1024) return def;
    for (const char *p = h; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == ',' || *p == ' '))
            return def;
    return h;
}

static enum MHD_Result send_preflight(struct kvf_server *s, struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", cors_request_headers(c));
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ok = queue(s, c, 204, r);
    MHD_destroy_response(r);
    return ok;
}

/* "A,B,..." into a NUL-separated copy and a table of its n entries, each non-empty. 0, or
 * -ENOMEM / -EINVAL with err naming what; on failure what was made is freed with the server. */
static int split_list(const char *list, const char *what, char **buf, const char ***items,
                      size_t *n_items, char *err, size_t err_len)
{
    size_t n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    if (!(*buf = strdup(list)) || !(*items = calloc(n, sizeof **items))) {
        snprintf(err, err_len, "server: out of memory");
        return -ENOMEM;
    }
    char *tok = *buf;
    for (size_t i = 0; i < n; i++) {
        char *end = strchr(tok, ',');
        if (end) *end = 0;
        if (!*tok) {
            snprintf(err, err_len, "%s: an empty entry in '%.200s'", what, list);
            return -EINVAL;
        }
        (*items)[(*n_items)++] = tok;
        tok = end ? end + 1 : tok;
    }
    return 0;
}

/* Sends body (malloc'd JSON, taken), or a fixed out-of-memory error when body is NULL; with
 * hname, one more header (hname: hval). */
static enum MHD_Result send_body_hdr(struct kvf_server *s, struct MHD_Connection *c,
                                     unsigned status, char *body, const char *hname,
                                     const char *hval)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":\"out_of_memory\"}}";
    struct MHD_Response *r;
    if (body) {
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    } else {
        status = 503;
        r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (hname && body) {
        MHD_add_response_header(r, hname, hval);
        /* A browser page of an allowed origin may read it (--cors-origins). */
        if (s->n_cors) MHD_add_response_header(r, "Access-Control-Expose-Headers", hname);
    }
    enum MHD_Result ok = queue(s, c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_body(struct kvf_server *s, struct MHD_Connection *c, unsigned status,
                                 char *body)
{
    return send_body_hdr(s, c, status, body, NULL, NULL);
}

static enum MHD_Result send_json(struct kvf_server *s, struct MHD_Connection *c, unsigned status,
                                 json_t *j)
{
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return send_body(s, c, status, body);
}

/* A generation's 200 answer j with its provenance in the X-Kvfence-Provenance header (compact
 * JSON; past KVF__SRV_PROV_HEADER_MAX bytes, without the page lists: the digests still pin every
 * page, and /admin/provenance has the lists). */
static enum MHD_Result send_json_prov(struct kvf_server *s, struct MHD_Connection *c, json_t *j,
                                      const struct kvf__srv_run *run)
{
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    json_t *pj = kvf__srv_run_prov(run, true);
    char *hv = pj ? json_dumps(pj, JSON_COMPACT) : NULL;
    json_decref(pj);
    if (hv && strlen(hv) > KVF__SRV_PROV_HEADER_MAX) {
        free(hv);
        pj = kvf__srv_run_prov(run, false);
        hv = pj ? json_dumps(pj, JSON_COMPACT) : NULL;
        json_decref(pj);
    }
    enum MHD_Result ok = send_body_hdr(s, c, 200, body, "X-Kvfence-Provenance", hv ? hv : "{}");
    free(hv);
    return ok;
}

static enum MHD_Result send_error_ex(struct kvf_server *s, struct MHD_Connection *c,
                                     const struct kvf__srv_err *e, const char *allow, bool close)
{
    json_t *j = kvf__srv_err_json(e);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    struct MHD_Response *r =
        body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!r) {
        free(body);
        return send_body(s, c, 503, NULL);
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    /* Retry-After: the error's own (an engine reason's), else the server's on a 429 or 503. */
    unsigned retry = 0;
    if (e->retry_after_s > 0)
        retry = (unsigned)e->retry_after_s;
    else if (e->retry_after_s == KVF__SRV_RETRY_DEFAULT && (e->status == 429 || e->status == 503))
        retry = s->cfg.retry_after_s;
    if (retry) {
        char ra[16];
        snprintf(ra, sizeof ra, "%u", retry);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (e->status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (close) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = queue(s, c, (unsigned)e->status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_error(struct kvf_server *s, struct MHD_Connection *c,
                                  const struct kvf__srv_err *e, const char *allow)
{
    return send_error_ex(s, c, e, allow, false);
}

/* --- Routing. -------------------------------------------------------------------------------- */

struct route_def {
    const char *path;
    const char *method;
    enum route route;
};
static const struct route_def routes[] = {
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/v1/models", "GET", R_MODELS},
    {"/tokenize", "POST", R_TOKENIZE},
    {"/detokenize", "POST", R_DETOKENIZE},
    {"/health", "GET", R_HEALTH},
    {"/metrics", "GET", R_METRICS},
};

/* 0 with the route, or -1 with e (404, or 405 with *allow). */
static int route_of(const char *url, const char *method, enum route *out, const char **model_id,
                    const char **allow, struct kvf__srv_err *e)
{
    *allow = NULL;
    *model_id = NULL;
    static const char models_prefix[] = "/v1/models/";
    static const char prov_prefix[] = "/admin/provenance/";
    if (strncmp(url, prov_prefix, sizeof prov_prefix - 1) == 0) {
        if (strcmp(method, "GET") != 0) {
            *allow = "GET";
            return kvf__srv_fail(e, 405, NULL, "method_not_allowed", "use GET for %s",
                                 "/admin/provenance/{id}");
        }
        *out = R_PROV;
        *model_id = url + sizeof prov_prefix - 1; /* the response id */
        return 0;
    }
    if (strncmp(url, models_prefix, sizeof models_prefix - 1) == 0 &&
        url[sizeof models_prefix - 1]) {
        if (strcmp(method, "GET") != 0) {
            *allow = "GET";
            return kvf__srv_fail(e, 405, NULL, "method_not_allowed", "use GET for %s",
                                 "/v1/models/{id}");
        }
        *out = R_MODEL_ONE;
        *model_id = url + sizeof models_prefix - 1;
        return 0;
    }
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path) != 0) continue;
        if (strcmp(method, routes[i].method) != 0) {
            *allow = routes[i].method;
            return kvf__srv_fail(e, 405, NULL, "method_not_allowed", "use %s for %s",
                                 routes[i].method, routes[i].path);
        }
        *out = routes[i].route;
        return 0;
    }
    return kvf__srv_fail(e, 404, NULL, "not_found", "no such endpoint");
}

struct header_count {
    unsigned content_length;
    unsigned transfer_encoding;
    bool te_chunked; /* the (last) Transfer-Encoding is exactly "chunked" */
};
static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    struct header_count *h = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) h->content_length++;
    if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        h->transfer_encoding++;
        h->te_chunked = value && strcasecmp(value, "chunked") == 0; /* MHD trims the blanks */
    }
    return MHD_YES;
}

/* The body headers of a POST: one Content-Length or one Transfer-Encoding: chunked, not both
 * (row 23; MHD would take "gzip" or "chunked, chunked" for no body and wait), and a declared
 * length within the bound (row 19: refused before the body is read). MHD has already answered
 * 400 to a Content-Length that is not a number and 413 to one beyond 64 bits. */
static int check_body_headers(struct MHD_Connection *c, size_t max_body, struct kvf__srv_err *e)
{
    struct header_count h = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &h);
    if (h.content_length > 1)
        return kvf__srv_fail(e, 400, NULL, "bad_request", "more than one Content-Length header");
    if (h.content_length && h.transfer_encoding)
        return kvf__srv_fail(e, 400, NULL, "bad_request",
                             "both Content-Length and Transfer-Encoding were sent");
    if (h.transfer_encoding > 1 || (h.transfer_encoding && !h.te_chunked))
        return kvf__srv_fail(e, 400, NULL, "bad_request",
                             "the only Transfer-Encoding accepted is one 'chunked'");
    /* A compressed body is refused, not guessed at: the server reads JSON as sent. */
    const char *ce =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    if (ce && strcasecmp(ce, "identity") != 0)
        return kvf__srv_fail(e, 415, NULL, "unsupported_content_encoding",
                             "Content-Encoding '%.40s' is not accepted; send the body uncompressed",
                             ce);
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (end == cl || *end)
            return kvf__srv_fail(e, 400, NULL, "bad_request", "Content-Length is not a number");
        if (errno || n > max_body)
            return kvf__srv_fail(e, 413, NULL, "body_too_large",
                                 "request body exceeds the limit of %zu bytes", max_body);
    }
    return 0;
}

/* --- GET endpoints, tokenize, detokenize. ------------------------------------------------------
 */

static json_t *model_json(struct kvf_server *s, const char *id, uint32_t limit)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", id, "object", "model", "created",
                     (json_int_t)s->created, "owned_by", "kvfence", "max_model_len", (int)limit);
}

/* Whether id is a name this server answers to (the model's, or one of served_model_names). */
static bool model_known(const struct kvf_server *s, const char *id)
{
    if (!s->n_names) return strcmp(id, s->model) == 0;
    for (size_t i = 0; i < s->n_names; i++)
        if (strcmp(id, s->names[i]) == 0) return true;
    return false;
}

/* --served-model-name's list into s->names (s->model becomes the first). 0, or a negative
 * code with err set; on failure what was made is freed with s. */
static int served_names(struct kvf_server *s, const char *list, char *err, size_t err_len)
{
    int rc =
        split_list(list, "served model names", &s->names_buf, &s->names, &s->n_names, err, err_len);
    if (rc < 0) return rc;
    free(s->model);
    if (!(s->model = strdup(s->names[0]))) {
        snprintf(err, err_len, "server: out of memory");
        return -ENOMEM;
    }
    return 0;
}

/* system_fingerprint: the model's fingerprint and the build's version, mixed (splitmix64), so
 * that it changes when either does. */
static void fingerprint(char *out, size_t cap, uint64_t model_fp)
{
    uint64_t h = model_fp;
    for (const char *v = KVF_VERSION; *v; v++) {
        h ^= (unsigned char)*v;
        h += 0x9E3779B97F4A7C15ull;
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
        h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
        h ^= h >> 31;
    }
    snprintf(out, cap, "fp_%016llx", (unsigned long long)h);
}

static enum MHD_Result do_health(struct kvf_server *s, struct MHD_Connection *c)
{
    struct kvf_engine_info in;
    memset(&in, 0, sizeof in);
    s->ops->info(s->engine, &in);
    json_t *by_state = json_object();
    for (int i = 0; by_state && i < KVF_PAGE__NSTATES; i++)
        json_object_set_new(by_state, kvf_page_state_name((enum kvf_page_state)i),
                            json_integer(in.decode_by_state[i]));
    json_t *j = json_pack(
        "{s:s, s:s, s:I, s:I, s:I, s:b,"
        " s:{s:I, s:I, s:I, s:I, s:o},"
        " s:{s:I, s:I, s:I},"
        " s:s, s:I, s:I, s:I,"
        " s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
        " s:{s:I, s:I, s:I, s:I, s:I, s:I}}",
        "status", in.prefill_up ? "ok" : "unavailable", "model", s->model, "served_limit",
        (json_int_t)in.served_limit, "n_vocab", (json_int_t)in.n_vocab, "page_tokens",
        (json_int_t)in.page_tokens, "prefill_up", in.prefill_up, "decode", "pages",
        (json_int_t)in.decode_pages, "free", (json_int_t)in.decode_free, "reserved",
        (json_int_t)in.decode_reserved, "capacity_tokens",
        (json_int_t)in.decode_pages * in.page_tokens, "by_state",
        by_state ? by_state : json_object(), "prefill", "pages", (json_int_t)in.prefill_pages,
        "free", (json_int_t)in.prefill_free, "capacity_tokens",
        (json_int_t)in.prefill_pages * in.page_tokens, "chat_template",
        s->chat_template ? "model" : "default", "queued", (json_int_t)in.queued, "running",
        (json_int_t)in.running, "in_flight", (json_int_t)atomic_load(&s->in_flight), "counters",
        "fences", (json_int_t)in.fences, "verify_failed", (json_int_t)in.verify_failed,
        "stale_msgs", (json_int_t)in.stale_msgs, "rejected_before_handoff",
        (json_int_t)in.rejected_before_handoff, "quarantines", (json_int_t)in.quarantines,
        "foreign_tails", (json_int_t)in.foreign_tails, "bad_frames", (json_int_t)in.bad_frames,
        "hash_slices", (json_int_t)in.hash_slices, "decoded_tokens", (json_int_t)in.decoded_tokens,
        "http", "connections", (json_int_t)atomic_load(&s->guard.open), "closed_slow_headers",
        (json_int_t)atomic_load(&s->guard.closed_head), "closed_slow_body",
        (json_int_t)atomic_load(&s->guard.closed_body), "closed_slow_reader",
        (json_int_t)atomic_load(&s->guard.closed_send), "untracked",
        (json_int_t)atomic_load(&s->guard.untracked), "refused_over_cap",
        (json_int_t)atomic_load(&s->guard.refused_conns));
    char cwhy[256] = "";
    bool degraded = s->canary && kvf__srv_canary_degraded(s->canary, cwhy, sizeof cwhy);
    if (j && s->canary)
        json_object_set_new(j, "canary",
                            json_pack("{s:s, s:I, s:I, s:I, s:i}", "status",
                                      degraded ? "degraded" : "ok", "runs",
                                      (json_int_t)atomic_load(&s->metrics.canary_runs), "failures",
                                      (json_int_t)atomic_load(&s->metrics.canary_failures),
                                      "errors", (json_int_t)atomic_load(&s->metrics.canary_errors),
                                      "references", (int)kvf__srv_canary_ready(s->canary)));
    if (j && degraded && in.prefill_up) {
        /* A canary's output differed from its reference: the server answers, but what it
         * answers cannot be trusted; a load balancer takes it out (503) until it is restarted
         * and looked at. */
        json_object_set_new(j, "status", json_string("degraded"));
        json_object_set_new(j, "reason", json_string(cwhy));
        return send_json(s, c, 503, j);
    }
    if (j && !in.prefill_up)
        json_object_set_new(j, "reason",
                            json_string(in.decodes && !in.decodes_up
                                            ? "no decode worker is reachable"
                                            : "no prefill worker is reachable"));
    if (j && s->ops->workers) {
        /* Split roles: every worker the router was given, and whether it can reach it. */
        struct kvf_worker_status *ws = calloc(64, sizeof(*ws));
        size_t nw = ws ? s->ops->workers(s->engine, ws, 64) : 0;
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < nw && i < 64; i++) {
            json_t *o = json_pack("{s:s, s:s, s:i, s:b}", "role", ws[i].role, "host", ws[i].host,
                                  "port", (int)ws[i].port, "up", ws[i].up);
            if (!o) continue;
            if (!ws[i].up) json_object_set_new(o, "reason", json_string(ws[i].why));
            if (ws[i].via[0]) json_object_set_new(o, "via", json_string(ws[i].via));
            if (strcmp(ws[i].role, "prefill") == 0)
                json_object_set_new(o, "granted", json_integer((json_int_t)ws[i].granted));
            if (ws[i].up && strcmp(ws[i].role, "decode") == 0) {
                json_object_set_new(o, "pages", json_integer(ws[i].pages));
                json_object_set_new(o, "free", json_integer(ws[i].free_pages));
                json_object_set_new(o, "running", json_integer(ws[i].running));
                json_object_set_new(o, "queued", json_integer(ws[i].queued));
                json_object_set_new(o, "committed", json_integer((json_int_t)ws[i].committed));
            }
            json_array_append_new(arr, o);
        }
        free(ws);
        if (arr) json_object_set_new(j, "workers", arr);
    }
    return send_json(s, c, in.prefill_up ? 200 : 503, j);
}

static enum MHD_Result do_metrics(struct kvf_server *s, struct MHD_Connection *c)
{
    struct kvf_engine_info in;
    memset(&in, 0, sizeof in);
    s->ops->info(s->engine, &in);
    struct kvf__sbuf b = {0};
    kvf__srv_metrics_render(&s->metrics, &s->tenants, &in, atomic_load(&s->in_flight), &b);
    if (s->ops->workers) {
        struct kvf_worker_status *ws = calloc(64, sizeof(*ws));
        size_t nw = ws ? s->ops->workers(s->engine, ws, 64) : 0;
        kvf__srv_metrics_render_workers(ws, nw < 64 ? nw : 64, &b);
        free(ws);
    }
    if (b.oom || !b.p) {
        kvf__sbuf_free(&b);
        return send_body(s, c, 503, NULL);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(b.n, b.p, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        kvf__sbuf_free(&b);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ok = queue(s, c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static uint32_t n_vocab_of(struct kvf_server *s, const struct kvf_engine_info *in)
{
    uint32_t t = kvf_tokenizer_n_vocab(s->tok);
    return in->n_vocab && in->n_vocab < t ? in->n_vocab : t;
}

static enum MHD_Result do_get(struct kvf_server *s, struct MHD_Connection *c, struct conn_req *q)
{
    if (q->route == R_HEALTH) return do_health(s, c);
    if (q->route == R_METRICS) return do_metrics(s, c);
    struct kvf_engine_info in;
    memset(&in, 0, sizeof in);
    s->ops->info(s->engine, &in);
    if (q->route == R_MODEL_ONE) {
        if (!model_known(s, q->model_id)) {
            struct kvf__srv_err e;
            kvf__srv_fail(&e, 404, "model", "model_not_found", "no such model");
            return send_error(s, c, &e, NULL);
        }
        return send_json(s, c, 200, model_json(s, q->model_id, in.served_limit));
    }
    json_t *data = json_array();
    if (!s->n_names) json_array_append_new(data, model_json(s, s->model, in.served_limit));
    for (size_t i = 0; data && i < s->n_names; i++)
        json_array_append_new(data, model_json(s, s->names[i], in.served_limit));
    return send_json(s, c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static const char *route_path(enum route r);

/* /health and /metrics: in full, plainly, or refused, as the request's address and key allow
 * (admin.c). */
static enum MHD_Result do_operator(struct kvf_server *s, struct MHD_Connection *c,
                                   struct conn_req *q)
{
    struct kvf__srv_err e;
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *detail = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "detail");
    bool want_detail = detail && strcmp(detail, "0") != 0 && strcmp(detail, "false") != 0;
    int view = kvf__srv_admin_view(&s->cfg, kvf__srv_admin_conn(&s->admin, c),
                                   q->route == R_METRICS, auth, want_detail, &e);
    if (view < 0) {
        if (e.status == 401 || e.status == 403)
            kvf__srv_log(&s->cfg, "event=unauthorized id=%s path=%s status=%d", q->id,
                         route_path(q->route), e.status);
        return send_error(s, c, &e, NULL);
    }
    if (view == KVF__SRV_VIEW_FULL) return do_get(s, c, q);
    struct kvf_engine_info in;
    memset(&in, 0, sizeof in);
    s->ops->info(s->engine, &in);
    if (in.prefill_up && s->canary && kvf__srv_canary_degraded(s->canary, NULL, 0))
        return send_json(s, c, 503, json_pack("{s:s}", "status", "degraded"));
    return send_json(s, c, in.prefill_up ? 200 : 503,
                     json_pack("{s:s}", "status", in.prefill_up ? "ok" : "unavailable"));
}

/* GET /admin/provenance/{id}: a response's provenance records, to an operator (admin.c's rules,
 * as /metrics). 400 for what is not a response id, 404 for one no record is kept of (never
 * made, or overwritten: the ring keeps the last KVF__SRV_PROV_RING choices). */
static enum MHD_Result do_prov(struct kvf_server *s, struct MHD_Connection *c, struct conn_req *q)
{
    struct kvf__srv_err e;
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (kvf__srv_admin_only(&s->cfg, kvf__srv_admin_conn(&s->admin, c), "/admin/provenance", auth,
                            &e) < 0) {
        if (e.status == 401 || e.status == 403)
            kvf__srv_log(&s->cfg, "event=unauthorized id=%s path=/admin/provenance status=%d",
                         q->id, e.status);
        return send_error(s, c, &e, NULL);
    }
    /* Per-request records of every tenant: with tenant keys and no operator rule (no admin keys,
     * no operator address) nobody is an operator, so nobody reads them — unlike /metrics'
     * aggregates, which stay open there. */
    if (s->cfg.keys && !s->cfg.admin_keys && !s->cfg.admin_listen) {
        kvf__srv_fail(&e, 404, NULL, "not_found",
                      "/admin/provenance needs --admin-keys or --admin-listen when API keys are "
                      "set");
        return send_error(s, c, &e, NULL);
    }
    const char *id = q->model_id ? q->model_id : "";
    size_t len = strnlen(id, 64);
    if (!kvf__srv_prov_id_ok(id, len)) {
        kvf__srv_fail(&e, 400, "id", "invalid_id",
                      "a response id is 'cmpl-' or 'chatcmpl-' and 16 lowercase hex digits");
        return send_error(s, c, &e, NULL);
    }
    struct kvf__srv_prov_slot *v = calloc(KVF__SRV_MAX_N_PROV, sizeof *v);
    if (!v) return send_body(s, c, 503, NULL);
    size_t n = kvf__srv_prov_get(&s->prov, id, v, KVF__SRV_MAX_N_PROV);
    if (!n) {
        free(v);
        kvf__srv_fail(&e, 404, "id", "provenance_not_found",
                      "no provenance is kept for this response id (never served here, or "
                      "overwritten: the last %u are kept)",
                      (unsigned)KVF__SRV_PROV_RING);
        return send_error(s, c, &e, NULL);
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *o = kvf__srv_prov_json(&v[i].pv, true);
        if (o) json_object_set_new(o, "index", json_integer(v[i].choice));
        json_array_append_new(arr, o);
    }
    free(v);
    return send_json(s, c, 200, json_pack("{s:s, s:o}", "id", id, "choices", arr));
}

/* {"tokens":[...],"count":n,"max_model_len":limit}, written straight into one buffer (a JSON
 * array of n integers as jansson values would take some 40 bytes per token); frees ids. */
static enum MHD_Result send_tokens(struct kvf_server *s, struct MHD_Connection *c, int32_t *ids,
                                   uint32_t n, uint32_t limit)
{
    struct kvf__sbuf b = {0};
    char num[16];
    kvf__sbuf_puts(&b, "{\"tokens\":[");
    for (uint32_t i = 0; i < n && !b.oom; i++) {
        int k = snprintf(num, sizeof num, i ? ",%d" : "%d", (int)ids[i]);
        kvf__sbuf_put(&b, num, (size_t)k);
    }
    int k = snprintf(num, sizeof num, "],\"count\":");
    kvf__sbuf_put(&b, num, (size_t)k);
    char tail[64];
    k = snprintf(tail, sizeof tail, "%u,\"max_model_len\":%u}", n, limit);
    kvf__sbuf_put(&b, tail, (size_t)k);
    free(ids);
    if (b.oom) {
        kvf__sbuf_free(&b);
        return send_body(s, c, 503, NULL);
    }
    return send_body(s, c, 200, b.p); /* taken */
}

static enum MHD_Result do_tokenize(struct kvf_server *s, struct MHD_Connection *c,
                                   struct conn_req *q)
{
    struct kvf__srv_err e;
    json_t *root = kvf__srv_parse_object(q->body.p ? q->body.p : "", q->body.n, &e);
    if (!root) return send_error(s, c, &e, NULL);
    json_t *p = json_object_get(root, "prompt"), *sp = json_object_get(root, "add_special_tokens");
    int32_t *ids = NULL;
    struct kvf_engine_info in;
    memset(&in, 0, sizeof in);
    s->ops->info(s->engine, &in);
    if (json_object_get(root, "messages") && !p) {
        /* vLLM's form: the prompt a chat completion of these messages would send. */
        struct kvf__srv_limits lim = {.n_vocab = n_vocab_of(s, &in),
                                      .chat_template = s->chat_template};
        /* The default rendering is at most the body's bytes plus a few per message, and a
         * token covers at least one byte: nothing is cut at this cap. */
        uint32_t cap = (uint32_t)(2 * q->max_body + 64), n = 0;
        if (kvf__srv_chat_tokens(root, &lim, s->tok, cap, &ids, &n, &e) < 0) goto fail;
        json_decref(root);
        return send_tokens(s, c, ids, n, in.served_limit);
    }
    if (!json_is_string(p)) {
        kvf__srv_fail(&e, 400, "prompt", "invalid_type", "'prompt' must be a string");
        goto fail;
    }
    if (sp && !json_is_null(sp) && !json_is_boolean(sp)) {
        kvf__srv_fail(&e, 400, "add_special_tokens", "invalid_type",
                      "'add_special_tokens' must be a boolean");
        goto fail;
    }
    bool bos = (!sp || json_is_null(sp) || json_is_true(sp)) && kvf_tokenizer_wants_bos(s->tok);
    const char *text = json_string_value(p);
    size_t len = json_string_length(p);
    int n = kvf_tokenizer_encode(s->tok, text, len, bos, NULL, 0);
    if (n >= 0 && !(ids = malloc(((size_t)n + 1) * sizeof *ids))) n = -ENOMEM;
    if (n >= 0) n = kvf_tokenizer_encode(s->tok, text, len, bos, ids, (size_t)n);
    if (n < 0) {
        if (n == -EILSEQ)
            kvf__srv_fail(&e, 400, "prompt", "invalid_utf8", "'prompt' is not valid UTF-8");
        else
            kvf__srv_fail(&e, 503, NULL, "out_of_memory", "out of memory");
        goto fail;
    }
    json_decref(root);
    return send_tokens(s, c, ids, (uint32_t)n, in.served_limit);
fail:
    free(ids);
    json_decref(root);
    return send_error(s, c, &e, NULL);
}

static enum MHD_Result do_detokenize(struct kvf_server *s, struct MHD_Connection *c,
                                     struct conn_req *q)
{
    struct kvf__srv_err e;
    json_t *root = kvf__srv_parse_object(q->body.p ? q->body.p : "", q->body.n, &e);
    if (!root) return send_error(s, c, &e, NULL);
    json_t *arr = json_object_get(root, "tokens");
    struct kvf__sbuf text = {0};
    if (!json_is_array(arr)) {
        kvf__srv_fail(&e, 400, "tokens", "invalid_type", "'tokens' must be an array of token ids");
        goto fail;
    }
    struct kvf_engine_info in;
    memset(&in, 0, sizeof in);
    s->ops->info(s->engine, &in);
    uint32_t n_vocab = n_vocab_of(s, &in);
    struct kvf_detok d;
    kvf_detok_init(&d);
    d.strip_space = true; /* a whole prompt: its first piece carries the space prefix */
    char buf[KVF_DETOK_MAX_OUT];
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= (json_int_t)n_vocab) {
            kvf__srv_fail(&e, 400, "tokens", "invalid_token",
                          "'tokens' element %zu is not a token id (the vocabulary has %u)", i,
                          n_vocab);
            goto fail;
        }
        size_t k = kvf_detok_push(&d, s->tok, (int32_t)json_integer_value(v), buf, sizeof buf);
        kvf__sbuf_put(&text, buf, k);
    }
    size_t k = kvf_detok_finish(&d, buf, sizeof buf);
    kvf__sbuf_put(&text, buf, k);
    json_decref(root);
    json_t *out =
        text.oom ? NULL
                 : json_pack("{s:o}", "prompt", kvf__srv_json_text(text.p ? text.p : "", text.n));
    kvf__sbuf_free(&text);
    return send_json(s, c, 200, out);
fail:
    kvf__sbuf_free(&text);
    json_decref(root);
    return send_error(s, c, &e, NULL);
}

/* --- Generation endpoints. ------------------------------------------------------------------- */

static enum kvf__srv_outcome outcome_of_status(int status)
{
    if (status == 401) return KVF__SRV_UNAUTHORIZED;
    if (status == 429) return KVF__SRV_RATE_LIMITED;
    if (status >= 500) return KVF__SRV_ERROR;
    return status >= 400 ? KVF__SRV_INVALID : KVF__SRV_OK;
}

/* The end of a generation request (run NULL: refused before submit, with status and code):
 * counted for its tenant, its latencies observed when answered, and one log line. The line
 * carries ids, the tenant's name, figures and static codes only. */
static void request_end(struct kvf_server *s, const char *id, size_t ti, struct kvf__srv_run *run,
                        enum kvf__srv_outcome o, int status, const char *code)
{
    struct kvf__srv_tenant *t = &s->tenants.t[ti];
    atomic_fetch_add(&t->outcomes[o], 1);
    kvf__srv_metrics_error(&s->metrics, code);
    if (!run) {
        kvf__srv_log(&s->cfg, "event=rejected id=%s tenant=%s outcome=%s status=%d code=%s", id,
                     t->name, kvf__srv_outcome_name[o], status, code ? code : "-");
        return;
    }
    int64_t end = kvf__srv_now_us();
    uint64_t gen = 0;
    for (uint32_t i = 0; i < run->n; i++)
        gen += run->ch[i].n_tokens;
    atomic_fetch_add(&t->prompt_tokens, run->req.n_prompt);
    atomic_fetch_add(&t->generated_tokens, gen);
    if (o == KVF__SRV_OK) kvf__srv_metrics_observe(&s->metrics, run, end);
    long long ttft = run->t_first_us ? (run->t_first_us - run->t_start_us) / 1000 : -1;
    /* Each choice's provenance: kept for /admin/provenance, and its brief form logged (the
     * pages' tags are in the decode worker's commit line for the same request, --log-commits). */
    char prov[420] = "-";
    size_t pn = 0;
    for (uint32_t i = 0; i < run->n; i++) {
        if (!run->ch[i].prov) continue;
        kvf__srv_prov_put(&s->prov, run->id, i, run->ch[i].prov);
        atomic_fetch_add(&s->metrics.prov_records, 1);
        char one[200];
        size_t k = kvf__srv_prov_brief(run->ch[i].prov, one, sizeof one);
        if (pn + k + 2 < sizeof prov)
            pn += (size_t)snprintf(prov + pn, sizeof prov - pn, "%s%s", pn ? "," : "", one);
    }
    kvf__srv_log(&s->cfg,
                 "event=%s id=%s tenant=%s completion_id=%s outcome=%s status=%d n=%u "
                 "prompt_tokens=%u completion_tokens=%llu ttft_ms=%lld duration_ms=%lld code=%s "
                 "prov=%s",
                 o == KVF__SRV_OK          ? "finished"
                 : o == KVF__SRV_CANCELLED ? "cancelled"
                                           : "error",
                 id, t->name, run->id, kvf__srv_outcome_name[o], status, run->n, run->req.n_prompt,
                 (unsigned long long)gen, ttft, (long long)(end - run->t_start_us) / 1000,
                 code ? code : "-", prov);
}

/* How a run that is being freed ended, and the status its client saw (streams: 200 sent). */
static enum kvf__srv_outcome run_outcome(const struct kvf__srv_run *r, int *status,
                                         const char **code)
{
    *code = NULL;
    if (r->failed) {
        struct kvf__srv_err e;
        kvf__srv_run_error(r, &e);
        if (!r->req.stream) *status = e.status;
        *code = e.code;
        return r->failed == KVF_E_PROTO_CANCELLED ? KVF__SRV_CANCELLED : KVF__SRV_ERROR;
    }
    if (r->cancelled || !kvf__srv_run_done(r)) return KVF__SRV_CANCELLED;
    return KVF__SRV_OK;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *st = cls;
    int64_t last_check = now_ms();
    for (;;) {
        if (st->off < st->out.n) {
            size_t k = st->out.n - st->off < max ? st->out.n - st->off : max;
            memcpy(buf, st->out.p + st->off, k);
            st->off += k;
            if (st->off == st->out.n) st->off = st->out.n = 0;
            touch(st->s, st->conn);
            return (ssize_t)k;
        }
        if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->finished) {
            touch(st->s, st->conn);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (atomic_load(&st->s->stopping)) {
            kvf__srv_run_cancel(st->run);
            struct kvf__srv_err e;
            kvf__srv_engine_error(-ESHUTDOWN, &e);
            kvf__srv_sse_put(&st->out, kvf__srv_err_json(&e));
            st->finished = true;
            continue;
        }
        if (kvf__srv_run_sse(st->run, &st->out)) {
            st->finished = true;
            continue;
        }
        if (st->out.n) continue;
        int progress = kvf__srv_run_step(st->run, KVF_SERVER_POLL_MS);
        int64_t t = now_ms();
        if (!progress || t - last_check >= KVF_SERVER_POLL_MS) {
            last_check = t;
            if (peer_gone(st->fd)) {
                kvf__srv_run_cancel(st->run);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
    }
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    struct kvf_server *s = st->s;
    int status = 200;
    const char *code;
    enum kvf__srv_outcome o = run_outcome(st->run, &status, &code);
    if (o == KVF__SRV_OK && !st->finished) o = KVF__SRV_CANCELLED; /* not all of it went out */
    request_end(s, st->id, st->ti, st->run, o, status, code);
    kvf__srv_tenant_exit(&s->tenants, st->ti, &st->share);
    kvf__srv_run_free(st->run);
    kvf__sbuf_free(&st->out);
    free(st);
    atomic_fetch_sub(&s->in_flight, 1);
}

static enum MHD_Result start_stream(struct kvf_server *s, struct MHD_Connection *c,
                                    struct conn_req *q, struct kvf__srv_run *run)
{
    struct stream *st = calloc(1, sizeof *st);
    if (!st) {
        request_end(s, q->id, q->ti, run, KVF__SRV_ERROR, 503, "out_of_memory");
        kvf__srv_tenant_exit(&s->tenants, q->ti, &q->share);
        kvf__srv_run_free(run);
        atomic_fetch_sub(&s->in_flight, 1);
        return send_body(s, c, 503, NULL);
    }
    memcpy(st->id, q->id, sizeof st->id);
    st->ti = q->ti;
    st->share = q->share;
    st->s = s;
    st->run = run;
    st->conn = c;
    st->fd = conn_fd(c);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    /* Asked for: the provenance comes as an SSE comment before [DONE] (run.c). */
    if (run->want_prov) {
        MHD_add_response_header(r, "X-Kvfence-Provenance", "sse-comment");
        if (s->n_cors)
            MHD_add_response_header(r, "Access-Control-Expose-Headers", "X-Kvfence-Provenance");
    }
    enum MHD_Result ok = queue(s, c, 200, r);
    MHD_destroy_response(r); /* the response (and st) now live as long as MHD needs them */
    return ok;
}

/* Waits for every choice here, on the connection's thread, watching the socket. */
static enum MHD_Result finish_blocking(struct kvf_server *s, struct MHD_Connection *c,
                                       struct conn_req *q, struct kvf__srv_run *run)
{
    int status = 200;
    enum kvf__srv_outcome o = KVF__SRV_CANCELLED;
    const char *code = NULL;
    int fd = conn_fd(c);
    int64_t last_check = now_ms();
    struct kvf__srv_err e;
    enum MHD_Result ok;
    while (!kvf__srv_run_done(run)) {
        if (atomic_load(&s->stopping)) {
            kvf__srv_engine_error(-ESHUTDOWN, &e);
            status = 503;
            code = e.code;
            ok = send_error(s, c, &e, NULL);
            goto out;
        }
        int progress = kvf__srv_run_step(run, KVF_SERVER_POLL_MS);
        int64_t t = now_ms();
        if (!progress || t - last_check >= KVF_SERVER_POLL_MS) {
            last_check = t;
            if (peer_gone(fd)) {
                ok = MHD_NO; /* closes the connection; the run is cancelled below */
                status = 0;
                goto out;
            }
        }
    }
    touch(s, c);
    o = run_outcome(run, &status, &code);
    if (run->failed) {
        kvf__srv_run_error(run, &e);
        ok = send_error(s, c, &e, NULL);
    } else if (run->want_prov) {
        ok = send_json_prov(s, c, kvf__srv_run_response(run), run);
    } else {
        ok = send_json(s, c, 200, kvf__srv_run_response(run));
    }
out:
    request_end(s, q->id, q->ti, run, o, status, code);
    kvf__srv_tenant_exit(&s->tenants, q->ti, &q->share);
    kvf__srv_run_free(run);
    /* In flight until the answer is out (on_completed), so that stop's drain does not close
     * the connection under a queued answer. */
    q->holds_flight = true;
    return ok;
}

/* Answers a generation request refused before submit, counting and logging it. */
static enum MHD_Result refuse(struct kvf_server *s, struct MHD_Connection *c, struct conn_req *q,
                              const struct kvf__srv_err *e)
{
    request_end(s, q->id, q->ti, NULL, outcome_of_status(e->status), e->status, e->code);
    return send_error(s, c, e, NULL);
}

/* Refuses (400, naming the bound) a request that could never fit its tenant's share, however
 * long it waited: more choices than --tenant-max-running, or more KV than the tenant's cap.
 * 0, or -1 with e. */
static int share_possible(struct kvf_server *s, const struct kvf__srv_share *w, uint64_t kv_cap,
                          const char *kv_param, struct kvf__srv_err *e)
{
    const struct kvf__srv_tenants *T = &s->tenants;
    if (T->max_running && w->seqs > T->max_running)
        return kvf__srv_fail(e, 400, "n", "tenant_share_exceeded",
                             "this request runs %u sequences (n) and a tenant may run at most %u "
                             "at once (--tenant-max-running); ask for fewer choices",
                             w->seqs, T->max_running);
    if (kv_cap && w->kv_tokens > kv_cap)
        return kvf__srv_fail(e, 400, kv_param, "tenant_share_exceeded",
                             "this request reserves %llu KV tokens (n x (prompt + max_tokens), in "
                             "whole pages) and a tenant may reserve at most %llu at once "
                             "(--tenant-max-kv-tokens%s); ask for fewer tokens or choices",
                             (unsigned long long)w->kv_tokens, (unsigned long long)kv_cap,
                             s->tenants.max_kv_tokens ? ""
                                                      : ", by default the pool shared among "
                                                        "the tenants");
    return 0;
}

/* Takes what the request takes of its tenant's share (q->share), waiting for it if the share
 * allows (polling the socket and stop as a running request does, for at most tenants.wait_ms).
 * 0: taken; -1 with e (429 over the share or after the wait, 503 stopping); 1: the client went
 * away. */
static int tenant_slot(struct kvf_server *s, struct MHD_Connection *c, struct conn_req *q,
                       uint64_t kv_cap, struct kvf__srv_err *e)
{
    struct kvf__srv_tenants *T = &s->tenants;
    int rc = kvf__srv_tenant_enter(T, q->ti, &q->share, kv_cap);
    if (rc == 0) return 0;
    if (rc < 0)
        return kvf__srv_fail(e, 429, NULL, "tenant_limit",
                             "this tenant runs all the sequences its share allows (%u) and has %u "
                             "requests waiting; retry later",
                             T->max_running, T->max_queued);
    int fd = conn_fd(c);
    int64_t until = now_ms() + T->wait_ms;
    for (;;) {
        if (kvf__srv_tenant_wait(T, q->ti, &q->share, kv_cap, KVF_SERVER_POLL_MS) == 0) return 0;
        if (atomic_load(&s->stopping)) {
            kvf__srv_tenant_leave_queue(T, q->ti);
            kvf__srv_engine_error(-ESHUTDOWN, e);
            return -1;
        }
        if (peer_gone(fd)) {
            kvf__srv_tenant_leave_queue(T, q->ti);
            return 1;
        }
        if (now_ms() >= until) {
            kvf__srv_tenant_leave_queue(T, q->ti);
            return kvf__srv_fail(e, 429, NULL, "tenant_limit",
                                 "this tenant's request waited %u ms for its share (sequences "
                                 "and KV tokens of its running requests); retry later",
                                 T->wait_ms);
        }
    }
}

/* /tokenize and /detokenize run as one sequence of the tenant's share (no KV): their work and
 * memory (bounded by tokenize_max_bytes: some 20 times the body at most) count as the tenant's,
 * so a tenant at its share waits or gets 429 for them as for a completion. */
static enum MHD_Result do_tokenizer_route(struct kvf_server *s, struct MHD_Connection *c,
                                          struct conn_req *q)
{
    struct kvf__srv_err e;
    q->share = (struct kvf__srv_share){.seqs = 1, .kv_tokens = 0};
    if (share_possible(s, &q->share, 0, NULL, &e) < 0) return send_error(s, c, &e, NULL);
    int wait = tenant_slot(s, c, q, 0, &e);
    if (wait > 0) return MHD_NO;
    if (wait < 0) return send_error(s, c, &e, NULL);
    enum MHD_Result ok = q->route == R_TOKENIZE ? do_tokenize(s, c, q) : do_detokenize(s, c, q);
    kvf__srv_tenant_exit(&s->tenants, q->ti, &q->share);
    return ok;
}

static enum MHD_Result do_generate(struct kvf_server *s, struct MHD_Connection *c,
                                   struct conn_req *q)
{
    struct kvf__srv_err e;
    struct kvf_engine_info in;
    memset(&in, 0, sizeof in);
    s->ops->info(s->engine, &in);
    struct kvf__srv_limits lim = {
        .n_vocab = n_vocab_of(s, &in),
        .served_limit = in.served_limit,
        .max_n = s->cfg.max_n,
        .default_max_tokens = s->cfg.default_max_tokens,
        .chat_template = s->chat_template,
        .model_names = s->names,
        .n_model_names = s->n_names,
    };
    struct kvf__srv_req req;
    enum kvf__srv_kind kind = q->route == R_CHAT ? KVF__SRV_CHAT : KVF__SRV_COMPLETION;
    if (kvf__srv_req_parse(kind, q->body.p ? q->body.p : "", q->body.n, &lim, s->tok, &req, &e) < 0)
        return refuse(s, c, q, &e);
    if (atomic_load(&s->stopping)) {
        kvf__srv_req_free(&req);
        kvf__srv_engine_error(-ESHUTDOWN, &e);
        return refuse(s, c, q, &e);
    }
    /* The broken server broken_503 (test builds; docs/MUTANTS.md, "Broken servers"): every
     * generation request answered 503 pool_exhausted, an error the suites allow under pressure,
     * to show that each suite fails a server that serves nothing. */
    if (KVF_MUTANT(BROKEN_503)) {
        kvf__srv_req_free(&req);
        kvf__srv_engine_error(-EBUSY, &e);
        return refuse(s, c, q, &e);
    }
    /* What it takes of its tenant's share: each choice is a sequence, each reserves its prompt
     * and its max_tokens in whole pages. */
    uint64_t kv_cap = kvf__srv_tenant_kv_cap(&s->tenants, &in);
    q->share.seqs = req.n;
    q->share.kv_tokens =
        (uint64_t)req.n *
        kvf__srv_round_tokens((uint64_t)req.n_prompt + req.max_tokens, in.page_tokens);
    if (share_possible(s, &q->share, kv_cap, "max_tokens", &e) < 0) {
        kvf__srv_req_free(&req);
        return refuse(s, c, q, &e);
    }
    int wait = tenant_slot(s, c, q, kv_cap, &e);
    if (wait != 0) {
        kvf__srv_req_free(&req);
        if (wait > 0) {
            request_end(s, q->id, q->ti, NULL, KVF__SRV_CANCELLED, 0, "client_gone");
            return MHD_NO;
        }
        return refuse(s, c, q, &e);
    }
    if (atomic_fetch_add(&s->in_flight, 1) >= s->cfg.max_queue) {
        atomic_fetch_sub(&s->in_flight, 1);
        kvf__srv_tenant_exit(&s->tenants, q->ti, &q->share);
        kvf__srv_req_free(&req);
        kvf__srv_engine_error(-EAGAIN, &e);
        return refuse(s, c, q, &e);
    }
    struct kvf__srv_run *run;
    int rc =
        kvf__srv_run_start(s->ops, s->engine, s->tok, &req, s->model, s->tenants.t[q->ti].id, &run);
    if (rc == 0) {
        run->fingerprint = s->fingerprint;
        const char *w = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Kvfence-Provenance");
        run->want_prov = w && strcmp(w, "1") == 0;
    }
    if (rc < 0) {
        atomic_fetch_sub(&s->in_flight, 1);
        kvf__srv_tenant_exit(&s->tenants, q->ti, &q->share);
        kvf__srv_req_free(&req);
        kvf__srv_engine_error(rc, &e);
        return refuse(s, c, q, &e);
    }
    if (run->req.stream) return start_stream(s, c, q, run);
    return finish_blocking(s, c, q, run);
}

/* --- MHD callbacks. -------------------------------------------------------------------------- */

static const char *route_path(enum route r)
{
    if (r == R_MODEL_ONE) return "/v1/models/{id}";
    if (r == R_PROV) return "/admin/provenance/{id}";
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (routes[i].route == r) return routes[i].path;
    return "-";
}

/* The tenant of the request's key (its index in the tenant table), or 0: no key, a malformed
 * header, or no such key. The key is never copied out of MHD's buffer nor printed. */
static uint32_t authorize(struct kvf_server *s, struct MHD_Connection *c)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    size_t n = 0;
    const char *key = kvf__srv_bearer(h, &n);
    return key ? kvf_server_keys_lookup(s->cfg.keys, key, n) : 0;
}

struct header_join {
    const char *name;
    struct kvf__sbuf b;
};
static enum MHD_Result join_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    struct header_join *hj = cls;
    if (strcasecmp(key, hj->name) != 0) return MHD_YES;
    if (hj->b.n) kvf__sbuf_put(&hj->b, ",", 1);
    kvf__sbuf_puts(&hj->b, value ? value : "");
    return MHD_YES;
}

/* Every value of header `name`, joined with ',' in the sender's order (malloc'd), or NULL when
 * there is none. Bounded by the connection's memory (KVF__SRV_CONN_MEMORY). */
static char *header_values(struct MHD_Connection *c, const char *name)
{
    struct header_join hj = {name, {0}};
    MHD_get_connection_values(c, MHD_HEADER_KIND, join_header, &hj);
    if (hj.b.oom || !hj.b.p) {
        kvf__sbuf_free(&hj.b);
        return NULL;
    }
    return hj.b.p;
}

/* The connection caps for the request whose headers are in (see "Connection caps"): 0, or -1
 * with e (503) when it passes one. keyed: it carries a valid API key. Also moves the
 * connection's count to the request's client address. */
static int conn_caps(struct kvf_server *s, struct MHD_Connection *c, struct guard_conn *gc,
                     bool keyed, struct kvf__srv_err *e)
{
    struct guard *g = &s->guard;
    if (!gc) return 0;
    struct kvf__srv_addr client = gc->peer;
    if (gc->trusted_peer) {
        char *fwd = header_values(c, "Forwarded"), *xff = header_values(c, "X-Forwarded-For");
        kvf__srv_forwarded_client(s->trusted, s->n_trusted, fwd, xff, &client);
        free(fwd);
        free(xff);
    }
    int rc = 0;
    pthread_mutex_lock(&g->mu);
    uint32_t n_addr = addr_assign(g, gc, &client);
    if (keyed && !gc->keyed) {
        gc->keyed = true;
        g->n_keyed++;
    }
    uint32_t open = atomic_load(&g->open), keyless = open - g->n_keyed;
    if (n_addr > g->per_addr)
        rc = kvf__srv_fail(e, 503, NULL, "too_many_connections",
                           "this client address has %u connections open, more than its limit "
                           "of %u; retry later",
                           n_addr, g->per_addr);
    else if (gc->keyed && g->n_keyed > g->max_conns)
        rc = kvf__srv_fail(e, 503, NULL, "too_many_connections",
                           "the server has its %u connections open; retry later", g->max_conns);
    else if (!gc->keyed && keyless > g->keyless_conns)
        rc = kvf__srv_fail(e, 503, NULL, "too_many_connections",
                           "the server has %u connections open without a valid API key, its "
                           "limit for them; retry later",
                           keyless);
    pthread_mutex_unlock(&g->mu);
    if (rc < 0) atomic_fetch_add(&g->refused_conns, 1);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct kvf_server *s = cls;
    struct conn_req *q = *con_cls;
    struct kvf__srv_err e;
    if (!q) {
        /* Headers in: no deadline while answering (G_BODY below when a body is to be read). */
        struct guard_conn *gc = guard_of(c);
        guard_enter(&s->guard, gc, G_WORK, 0);
        enum route route = (enum route)0;
        const char *allow, *model_id;
        /* Row 21: MHD answers 431 to headers beyond its buffer, 414 to a request line beyond it;
         * many small headers that fit are refused here. */
        int n_headers = MHD_get_connection_values(c, MHD_HEADER_KIND, NULL, NULL);
        if (n_headers > KVF__SRV_MAX_HEADERS) {
            kvf__srv_fail(&e, 431, NULL, "too_many_headers", "more than %d header fields",
                          KVF__SRV_MAX_HEADERS);
            return send_error(s, c, &e, NULL);
        }
        if (route_of(url, method, &route, &model_id, &allow, &e) < 0) {
            /* A CORS preflight: OPTIONS on a path that exists, before any key (a browser sends
             * none with it). */
            if (e.status == 405 && s->n_cors && strcmp(method, "OPTIONS") == 0) {
                if (cors_allow(s, c)) return send_preflight(s, c);
                kvf__srv_fail(&e, 403, NULL, "origin_not_allowed",
                              "this origin may not call the API (see --cors-origins)");
                return send_error(s, c, &e, NULL);
            }
            return send_error(s, c, &e, allow);
        }
        if (kvf__srv_admin_conn(&s->admin, c) && route != R_HEALTH && route != R_METRICS &&
            route != R_PROV) {
            kvf__srv_fail(&e, 404, NULL, "not_found",
                          "the operator address serves /health, /metrics and /admin/provenance "
                          "only");
            return send_error(s, c, &e, NULL);
        }
        if (!(q = calloc(1, sizeof *q))) return send_body(s, c, 503, NULL);
        q->route = route;
        q->model_id = model_id;
        q->max_body = route == R_TOKENIZE || route == R_DETOKENIZE ? s->cfg.tokenize_max_bytes
                                                                   : s->cfg.max_body_bytes;
        *con_cls = q;
        uint64_t rid;
        if (kvf__srv_random(&rid, sizeof rid) < 0) {
            kvf__srv_fail(&e, 503, NULL, "no_entropy", "the server cannot draw a request id");
            return send_error(s, c, &e, NULL);
        }
        snprintf(q->id, sizeof q->id, "req-%016llx", (unsigned long long)rid);
        q->ti = 1; /* without keys: the one tenant */
        uint32_t t = s->cfg.keys ? authorize(s, c) : 0;
        if (conn_caps(s, c, gc, t != 0, &e) < 0) {
            kvf__srv_log(&s->cfg, "event=refused id=%s path=%s status=503 code=%s", q->id,
                         route_path(route), e.code);
            /* A body is read (and dropped) first, so that the close leaves nothing unread;
             * one whose headers are refused (too large, ambiguous) is not read at all. */
            struct kvf__srv_err be;
            if (strcmp(method, "POST") == 0 && check_body_headers(c, q->max_body, &be) == 0) {
                q->over_cap = true;
                q->cap_err = e;
                guard_enter(&s->guard, gc, G_BODY, s->guard.body_ms);
                return MHD_YES;
            }
            return send_error_ex(s, c, &e, NULL, true);
        }
        /* A GET is answered on MHD's next call, once the request is wholly in: MHD 0.9.75 closes
         * a connection whose answer was queued with the headers (it cannot tell that no body
         * follows), and a GET's connection can stay open for the client's next request. /health
         * and /metrics are then answered as the operator view allows (do_operator). */
        if (route == R_HEALTH || route == R_METRICS || route == R_PROV) return MHD_YES;
        bool gen = route == R_COMPLETIONS || route == R_CHAT;
        if (s->cfg.keys) {
            if (!t) {
                q->ti = 0;
                kvf__srv_fail(&e, 401, NULL, "invalid_api_key",
                              "a valid API key is needed: send 'Authorization: Bearer KEY'");
                kvf__srv_log(&s->cfg, "event=unauthorized id=%s path=%s", q->id, route_path(route));
                atomic_fetch_add(&s->tenants.t[0].outcomes[KVF__SRV_UNAUTHORIZED], 1);
                return send_error(s, c, &e, NULL);
            }
            q->ti = t;
        }
        kvf__srv_log(&s->cfg, "event=request id=%s tenant=%s path=%s", q->id,
                     s->tenants.t[q->ti].name, route_path(route));
        if (strcmp(method, "POST") == 0 && check_body_headers(c, q->max_body, &e) < 0)
            return gen ? refuse(s, c, q, &e) : send_error(s, c, &e, NULL);
        if (strcmp(method, "GET") == 0) return MHD_YES; /* answered on the next call, as above */
        guard_enter(&s->guard, gc, G_BODY, s->guard.body_ms);
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (q->too_big) return MHD_YES; /* after an answer MHD took: dropped */
        if (q->body.n + n > q->max_body) {
            /* A chunked body, which declares no length, answered as soon as it passes the
             * bound, none of the rest read. MHD 0.9.75 takes no answer before the whole body
             * is in; the 413 is then written past it and the connection closed. */
            q->too_big = true;
            kvf__sbuf_free(&q->body);
            guard_enter(&s->guard, guard_of(c), G_WORK, 0);
            kvf__srv_fail(&e, 413, NULL, "body_too_large",
                          "request body exceeds the limit of %zu bytes", q->max_body);
            if (send_error(s, c, &e, NULL) == MHD_YES) return MHD_YES;
            json_t *j = kvf__srv_err_json(&e);
            char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
            json_decref(j);
            int fd = conn_fd(c);
            send_raw(fd, "413 Content Too Large", body ? body : "{}");
            free(body);
            if (fd >= 0) shutdown(fd, SHUT_WR);
            return MHD_NO;
        }
        kvf__sbuf_put(&q->body, upload_data, n);
        return MHD_YES;
    }
    guard_enter(&s->guard, guard_of(c), G_WORK, 0); /* body in */
    if (q->too_big) return MHD_YES;                 /* answered when the body passed the bound */
    if (q->over_cap) return send_error_ex(s, c, &q->cap_err, NULL, true);
    if (q->body.oom) return send_body(s, c, 503, NULL);
    switch (q->route) {
    case R_COMPLETIONS:
    case R_CHAT:
        return do_generate(s, c, q);
    case R_TOKENIZE:
    case R_DETOKENIZE:
        return do_tokenizer_route(s, c, q);
    case R_HEALTH:
    case R_METRICS:
        return do_operator(s, c, q);
    case R_PROV:
        return do_prov(s, c, q);
    default:
        return do_get(s, c, q);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct kvf_server *s = cls;
    /* Answered (or given up): the next request on a kept-alive connection has idle_timeout_s. */
    guard_enter(&s->guard, guard_of(c), G_HEAD, s->guard.idle_ms);
    struct conn_req *q = *con_cls;
    if (!q) return;
    if (q->holds_flight) atomic_fetch_sub(&s->in_flight, 1);
    kvf__sbuf_free(&q->body);
    free(q);
    *con_cls = NULL;
}

static void discard_log(void *cls, const char *fmt, va_list ap)
{
    /* Library code never prints (STYLE.md); MHD's messages are dropped. */
}

/* --- Start and stop. ------------------------------------------------------------------------- */

int kvf__srv_open_listener(const char *host, uint16_t port, int *fd_out, bool *v6, char *err,
                           size_t err_len)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0 || !ai) {
        snprintf(err, err_len, "server: cannot resolve host '%s': %s", host, gai_strerror(g));
        return -EADDRNOTAVAIL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = 0;
    if (fd < 0) {
        rc = -errno;
        snprintf(err, err_len, "server: socket: %s", strerror(errno));
        goto free_ai;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
        rc = -errno;
        snprintf(err, err_len, "server: cannot listen on %s:%u: %s", host, port, strerror(errno));
        close(fd);
        goto free_ai;
    }
    *v6 = ai->ai_family == AF_INET6;
    *fd_out = fd;
free_ai:
    freeaddrinfo(ai);
    return rc;
}

uint16_t kvf__srv_bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) return 0;
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

int kvf_server_start(const struct kvf_server_config *cfg, const struct kvf_gen_ops *ops,
                     void *engine, const kvf_tokenizer_t *tok, kvf_server_t **out, char *err,
                     size_t err_len)
{
    if (!cfg || !ops || !tok || !out || !ops->submit || !ops->next || !ops->cancel ||
        !ops->release || !ops->info) {
        snprintf(err, err_len, "server: missing config, ops or tokenizer");
        return -EINVAL;
    }
    struct kvf_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "server: out of memory");
        return -ENOMEM;
    }
    s->cfg = *cfg;
    s->host = strdup(cfg->host ? cfg->host : "127.0.0.1");
    s->model = strdup(cfg->model_name ? cfg->model_name : "kvfence");
    int rc = -ENOMEM;
    if (cfg->served_model_names &&
        (rc = served_names(s, cfg->served_model_names, err, err_len)) < 0)
        goto free_s;
    if (cfg->cors_origins && (rc = split_list(cfg->cors_origins, "CORS origins", &s->cors_buf,
                                              &s->cors, &s->n_cors, err, err_len)) < 0)
        goto free_s;
    s->cors_any = s->n_cors == 1 && strcmp(s->cors[0], "*") == 0;
    for (size_t i = 0; i < s->n_cors; i++)
        if (strcmp(s->cors[i], "*") == 0 && !s->cors_any) {
            snprintf(err, err_len, "CORS origins: '*' stands alone, not in a list");
            rc = -EINVAL;
            goto free_s;
        }
    rc = -ENOMEM;
    fingerprint(s->fingerprint, sizeof s->fingerprint, cfg->model_fp);
    if (cfg->chat_template && !(s->chat_template = strdup(cfg->chat_template))) {
        snprintf(err, err_len, "server: out of memory");
        goto free_s;
    }
    if (!s->host || !s->model) {
        snprintf(err, err_len, "server: out of memory");
        goto free_s;
    }
    s->cfg.host = s->host;
    s->cfg.model_name = s->model;
    s->cfg.chat_template = s->chat_template;
    if (!s->cfg.max_body_bytes) s->cfg.max_body_bytes = 1u << 20;
    if (!s->cfg.tokenize_max_bytes) s->cfg.tokenize_max_bytes = 256u << 10;
    if (s->cfg.tokenize_max_bytes > s->cfg.max_body_bytes)
        s->cfg.tokenize_max_bytes = s->cfg.max_body_bytes;
    if (!s->cfg.max_n) s->cfg.max_n = 8;
    if (!s->cfg.max_queue) s->cfg.max_queue = 256;
    if (!s->cfg.default_max_tokens) s->cfg.default_max_tokens = 256;
    if (!s->cfg.max_connections) s->cfg.max_connections = 256;
    if (!s->cfg.idle_timeout_s) s->cfg.idle_timeout_s = 30;
    if (!s->cfg.max_conn_per_ip) s->cfg.max_conn_per_ip = 64;
    if (!s->cfg.keyless_timeout_ms) s->cfg.keyless_timeout_ms = 2000;
    if (!s->cfg.keyed_reserve) s->cfg.keyed_reserve = s->cfg.max_connections / 4;
    if (s->cfg.keyed_reserve >= s->cfg.max_connections) {
        snprintf(err, err_len, "server: keyed_reserve (%u) must be below max_connections (%u)",
                 s->cfg.keyed_reserve, s->cfg.max_connections);
        rc = -EINVAL;
        goto free_s;
    }
    char terr[160];
    if ((rc = kvf__srv_cidrs_parse(cfg->trusted_proxies, &s->trusted, &s->n_trusted, terr,
                                   sizeof terr)) < 0) {
        snprintf(err, err_len, "server: trusted proxies: %s", terr);
        goto free_s;
    }
    s->cfg.trusted_proxies = NULL; /* parsed into s->trusted; the text is the caller's */
    rc = -ENOMEM;
    if (!s->cfg.header_timeout_ms) s->cfg.header_timeout_ms = 10000;
    if (!s->cfg.body_timeout_ms) s->cfg.body_timeout_ms = 30000;
    if (!s->cfg.send_timeout_ms) s->cfg.send_timeout_ms = 30000;
    if (!s->cfg.retry_after_s) s->cfg.retry_after_s = 1;
    s->ops = ops;
    s->engine = engine;
    s->tok = tok;
    if (kvf__srv_tenants_init(&s->tenants, cfg->keys, cfg->tenant, cfg->tenant_max_running,
                              cfg->tenant_max_queued, cfg->tenant_max_kv_tokens,
                              cfg->tenant_wait_ms) < 0) {
        snprintf(err, err_len, "server: out of memory");
        goto free_s;
    }
    kvf__srv_metrics_init(&s->metrics);
    if (kvf__srv_prov_init(&s->prov, KVF__SRV_PROV_RING) < 0) {
        snprintf(err, err_len, "server: out of memory");
        rc = -ENOMEM;
        goto free_obs;
    }
    s->created = (int64_t)time(NULL);
    atomic_init(&s->stopping, false);
    atomic_init(&s->in_flight, 0);

    /* The canary before any daemon: their threads read s->canary, set once here. */
    s->metrics.canary_on = cfg->canary_interval_ms > 0;
    if (cfg->canary_interval_ms &&
        kvf__srv_canary_start(&s->canary, &s->cfg, ops, engine, &s->metrics,
                              cfg->canary_interval_ms) < 0) {
        snprintf(err, err_len, "server: cannot start the canary");
        rc = KVF_E_SERVER;
        goto free_obs;
    }
    rc = guard_start(&s->guard, &s->cfg, s->trusted, s->n_trusted);
    if (rc < 0) {
        snprintf(err, err_len, "server: cannot start the connection watchdog: %s", strerror(-rc));
        goto free_obs;
    }
    bool v6 = false;
    if (cfg->admin_listen &&
        (rc = kvf__srv_admin_start(&s->admin, cfg->admin_host, cfg->admin_port, on_request,
                                   on_completed, s, err, err_len)) < 0)
        goto stop_guard;
    rc = kvf__srv_open_listener(s->host, cfg->port, &s->listen_fd, &v6, err, err_len);
    if (rc < 0) goto stop_admin;
    s->port = kvf__srv_bound_port(s->listen_fd);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    if (v6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET,
                            s->listen_fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)KVF__SRV_CONN_MEMORY,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.idle_timeout_s,
                            /* Past the caps libmicrohttpd leaves connections in the
                             * backlog; the caps themselves answer 503 ("Connection caps"). */
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->guard.n,
                            MHD_OPTION_EXTERNAL_LOGGER, discard_log, s, MHD_OPTION_END);
    if (!s->d) {
        snprintf(err, err_len, "server: libmicrohttpd did not start on %s:%u", s->host, s->port);
        rc = KVF_E_SERVER;
        goto close_fd;
    }
    *out = s;
    return 0;
close_fd:
    close(s->listen_fd);
stop_admin:
    kvf__srv_admin_stop(&s->admin);
stop_guard:
    guard_stop(&s->guard);
free_obs:
    kvf__srv_canary_free(s->canary);
    s->canary = NULL;
    kvf__srv_prov_destroy(&s->prov);
    kvf__srv_metrics_destroy(&s->metrics);
    kvf__srv_tenants_destroy(&s->tenants);
free_s:
    free(s->trusted);
    free(s->host);
    free(s->model);
    free(s->names);
    free(s->names_buf);
    free(s->cors);
    free(s->cors_buf);
    free(s->chat_template);
    free(s);
    return rc;
}

uint16_t kvf_server_port(const kvf_server_t *s)
{
    return s->port;
}

uint16_t kvf_server_admin_port(const kvf_server_t *s)
{
    return s->admin.port;
}

void kvf_server_stop(kvf_server_t *s)
{
    if (!s) return;
    /* No new connection from here; the listening socket is ours to close. MHD's listening
     * thread may still hold it until MHD_stop_daemon, so it is closed only then; shutting it
     * down now makes the kernel stop listening at once, so a client connecting during the
     * drain is refused instead of waiting in the backlog for an accept that never comes. */
    kvf__srv_canary_halt(s->canary); /* its request, if one is out, is cancelled and ended */
    MHD_socket lfd = MHD_quiesce_daemon(s->d);
    if (lfd != MHD_INVALID_SOCKET) shutdown(lfd, SHUT_RDWR);
    int64_t until = now_ms() + s->cfg.drain_ms;
    while (atomic_load(&s->in_flight) > 0 && now_ms() < until) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* Requests still running see this within KVF_SERVER_POLL_MS, cancel and end; MHD then
     * closes every connection and joins every thread. */
    atomic_store(&s->stopping, true);
    MHD_stop_daemon(s->d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    kvf__srv_admin_stop(&s->admin);
    /* No daemon thread reads the canary now (/health did until here). */
    kvf__srv_canary_free(s->canary);
    s->canary = NULL;
    guard_stop(&s->guard);
    kvf__srv_prov_destroy(&s->prov);
    kvf__srv_metrics_destroy(&s->metrics);
    kvf__srv_tenants_destroy(&s->tenants);
    free(s->trusted);
    free(s->host);
    free(s->model);
    free(s->names);
    free(s->names_buf);
    free(s->cors);
    free(s->cors_buf);
    free(s->chat_template);
    free(s);
}
