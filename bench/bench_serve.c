/*
 * `kvfence bench serve --url URL --concurrency C --requests R --prompt-tokens P --gen-tokens G
 * [--stream] [--logprobs] [--warmup W] [--timeout-s T]`: a closed-loop load generator for a
 * running server.
 *
 * C connections (HTTP/1.1, keep-alive, plain sockets, one thread polling them all) each send a
 * POST /v1/completions, wait for the whole answer, and send the next, until R requests were
 * answered. Every request has its own prompt of exactly P token ids (an array, so no tokenizer
 * stands between the figure and the engine), "max_tokens": G, "ignore_eos": true,
 * "temperature": 0. First the bench waits (up to 60 s) for GET /health to say "ok" and reads the
 * vocabulary size from it; then W requests (default: C) run as a warm-up, not counted.
 *
 *   tok_s        completion tokens of the R requests (the usage the server reports) / the wall
 *                time from the first request sent to the last answer received;
 *   ttft_*_ms    --stream: request sent → first SSE chunk carrying a choice; without --stream
 *                there is no first token to see and these print as nan. The server sends a
 *                chunk only for text or logprobs, so on a model whose pieces decode to nothing
 *                (mkmodel's vocabularies) the first chunk is the last: --logprobs asks for the
 *                sampled token's logprob ("logprobs": 0), one chunk per token, at the price of
 *                a log-softmax per token on the server. The bench says so when it sees fewer
 *                chunks than half the tokens;
 *   tpot_p50_ms  per request, (latency − TTFT) / (completion tokens − 1); without --stream,
 *                latency / completion tokens;
 *   latency_p50_ms  per request, request sent → the last byte of its answer;
 *   errors       requests that failed: a connection error, a status other than 200, an error
 *                object in the stream, a timeout (--timeout-s, default 300), or fewer
 *                completion tokens than G.
 *
 * Bounds: one poll per turn over C ≤ 1024 sockets; each answer is buffered whole (an answer
 * above 64 MiB is an error).
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "bench.h"

#define SB_MAX_CONC 1024u
#define SB_MAX_BODY (64u << 20)

struct sb_opts {
    char host[256];
    char port[8];
    unsigned long conc, requests, prompt, gen, warmup, timeout_s;
    bool stream, logprobs;
};

struct sbuf {
    char *p;
    size_t n, cap;
};

static int sbuf_add(struct sbuf *b, const void *src, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static void sbuf_drop(struct sbuf *b, size_t n)
{
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    if (b->p) b->p[b->n] = 0;
}

enum phase {
    PH_IDLE,
    PH_CONNECTING,
    PH_SENDING,
    PH_HEADERS,
    PH_BODY_LEN,
    PH_BODY_CHUNKED,
    PH_BODY_EOF
};

/* One connection and the request on it. */
struct conn {
    int fd;
    enum phase ph;
    struct sbuf out; /* the request, sent from out_off */
    size_t out_off;
    struct sbuf in;   /* bytes received and not yet parsed */
    struct sbuf body; /* the answer's body (de-chunked) */
    size_t sse_off;   /* stream: body bytes already split into events */
    size_t body_left; /* PH_BODY_LEN */
    bool chunk_end;   /* PH_BODY_CHUNKED: the 0-size chunk was seen */
    bool keep_alive;
    int status;
    bool counted; /* a measured request, not a warm-up one */
    uint64_t t_sent, t_first, deadline;
    long completion_tokens;
    unsigned long chunks; /* stream: SSE chunks carrying a choice */
    bool got_first, stream_error, stream_done;
};

struct sb_stats {
    double *ttft, *tpot, *lat;
    unsigned long n_ok, errors, tokens, chunks;
};

static void usage(FILE *f)
{
    fprintf(
        f, "usage: kvfence bench serve --url URL --concurrency C --requests R --prompt-tokens P\n"
           "                           --gen-tokens G [--stream] [--logprobs] [--warmup W]\n"
           "                           [--timeout-s T]\n"
           "  A closed loop of C HTTP/1.1 connections against URL (http://host:port) sending R\n"
           "  /v1/completions requests of P distinct prompt token ids, G tokens each (ignore_eos,\n"
           "  temperature 0). Prints tok/s, TTFT and TPOT percentiles and the error count.\n"
           "  --logprobs asks for each token's logprob, so a model whose pieces are empty text\n"
           "  still streams one chunk per token (TTFT needs it there).\n");
}

static int parse_url(const char *url, struct sb_opts *o)
{
    if (strncmp(url, "http://", 7) != 0) return -EINVAL;
    const char *h = url + 7, *end = h + strcspn(h, "/");
    const char *colon = memchr(h, ':', (size_t)(end - h));
    size_t hl = (size_t)((colon ? colon : end) - h);
    if (!hl || hl >= sizeof(o->host)) return -EINVAL;
    memcpy(o->host, h, hl);
    o->host[hl] = 0;
    if (colon) {
        size_t pl = (size_t)(end - colon - 1);
        if (!pl || pl >= sizeof(o->port)) return -EINVAL;
        memcpy(o->port, colon + 1, pl);
        o->port[pl] = 0;
    } else {
        strcpy(o->port, "80");
    }
    return 0;
}

static int parse(int argc, char **argv, struct sb_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->timeout_s = 300;
    o->warmup = (unsigned long)-1;
    bool have_url = false;
    int rc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stream") == 0) {
            o->stream = true;
            continue;
        }
        if (strcmp(argv[i], "--logprobs") == 0) {
            o->logprobs = true;
            continue;
        }
        const char *opt, *val;
        rc = kvf_bench_opt(argc, argv, &i, usage, &opt, &val);
        if (rc != 1) return rc == 0 ? -1 : rc;
        if (strcmp(opt, "--url") == 0) {
            if (parse_url(val, o) < 0) {
                fprintf(stderr, "kvfence bench serve: --url is http://host[:port], not '%s'\n",
                        val);
                return 2;
            }
            have_url = true;
        } else if (strcmp(opt, "--concurrency") == 0) {
            if ((rc = kvf_bench_ulong_arg("serve", opt, val, SB_MAX_CONC, &o->conc))) return rc;
        } else if (strcmp(opt, "--requests") == 0) {
            if ((rc = kvf_bench_ulong_arg("serve", opt, val, 1000000, &o->requests))) return rc;
        } else if (strcmp(opt, "--prompt-tokens") == 0) {
            if ((rc = kvf_bench_ulong_arg("serve", opt, val, 1000000, &o->prompt))) return rc;
        } else if (strcmp(opt, "--gen-tokens") == 0) {
            if ((rc = kvf_bench_ulong_arg("serve", opt, val, 1000000, &o->gen))) return rc;
        } else if (strcmp(opt, "--warmup") == 0) {
            char *end = NULL;
            o->warmup = strtoul(val, &end, 10);
            if (!end || *end || o->warmup > 100000) {
                fprintf(stderr, "kvfence bench serve: bad value '%s' for --warmup\n", val);
                return 2;
            }
        } else if (strcmp(opt, "--timeout-s") == 0) {
            if ((rc = kvf_bench_ulong_arg("serve", opt, val, 86400, &o->timeout_s))) return rc;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!have_url || !o->conc || !o->requests || !o->prompt || !o->gen) {
        usage(stderr);
        return 2;
    }
    if (o->warmup == (unsigned long)-1) o->warmup = o->conc;
    return 0;
}

/* --- Sockets. -------------------------------------------------------------------------------- */

static int open_socket(const struct sb_opts *o, bool nonblock)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(o->host, o->port, &hints, &ai) != 0 || !ai) return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    return fd;
}

/* A blocking GET with Connection: close, for /health: the body into *body (NUL-terminated);
 * the HTTP status, or -1. */
static int http_get(const struct sb_opts *o, const char *path, struct sbuf *body)
{
    int fd = open_socket(o, false);
    if (fd < 0) return -1;
    char req[512];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                     path, o->host);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    struct sbuf all = {0};
    char b[4096];
    ssize_t r;
    while ((r = read(fd, b, sizeof(b))) > 0 && all.n < (1u << 20))
        sbuf_add(&all, b, (size_t)r);
    close(fd);
    int status = -1;
    char *hdr_end = all.p ? strstr(all.p, "\r\n\r\n") : NULL;
    if (hdr_end && sscanf(all.p, "HTTP/1.%*d %d", &status) == 1)
        sbuf_add(body, hdr_end + 4, all.n - (size_t)(hdr_end + 4 - all.p));
    free(all.p);
    return status;
}

/* --- Requests. ------------------------------------------------------------------------------- */

/* Prompt k: P ids from a per-request generator, in [32, n_vocab), so no two prompts share a
 * prefix page. */
static int build_request(struct conn *c, const struct sb_opts *o, unsigned long k, uint32_t n_vocab)
{
    struct sbuf body = {0};
    char num[64];
    int rc = sbuf_add(&body, "{\"prompt\":[", 11);
    uint64_t s = 0x9e3779b97f4a7c15ull * (k + 1) ^ 0xd1b54a32d192ed03ull;
    uint32_t span = n_vocab > 64 ? n_vocab - 32 : n_vocab;
    uint32_t base = n_vocab > 64 ? 32 : 0;
    for (unsigned long j = 0; j < o->prompt && rc == 0; j++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        int n = snprintf(num, sizeof(num), "%s%u", j ? "," : "", base + (uint32_t)(s % span));
        rc = sbuf_add(&body, num, (size_t)n);
    }
    int n = snprintf(num, sizeof(num), "],\"max_tokens\":%lu,", o->gen);
    if (rc == 0) rc = sbuf_add(&body, num, (size_t)n);
    const char *tail = o->stream ? "\"ignore_eos\":true,\"temperature\":0,\"stream\":true,"
                                   "\"stream_options\":{\"include_usage\":true}}"
                                 : "\"ignore_eos\":true,\"temperature\":0}";
    if (rc == 0 && o->logprobs) rc = sbuf_add(&body, "\"logprobs\":0,", 13);
    if (rc == 0) rc = sbuf_add(&body, tail, strlen(tail));
    c->out.n = 0;
    c->out_off = 0;
    char hdr[512];
    n = snprintf(hdr, sizeof(hdr),
                 "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n",
                 o->host, body.n);
    if (rc == 0) rc = sbuf_add(&c->out, hdr, (size_t)n);
    if (rc == 0) rc = sbuf_add(&c->out, body.p, body.n);
    free(body.p);
    return rc;
}

/* The completion token count in a usage object inside s, or -1. */
static long completion_tokens_in(const char *s)
{
    const char *u = strstr(s, "\"completion_tokens\":");
    return u ? strtol(u + 20, NULL, 10) : -1;
}

/* Splits newly arrived body bytes into SSE events and reads what the figures need. */
static void scan_sse(struct conn *c, uint64_t now)
{
    for (;;) {
        char *start = c->body.p + c->sse_off;
        char *end = strstr(start, "\n\n");
        if (!end) return;
        *end = 0;
        if (strncmp(start, "data: ", 6) == 0) {
            const char *d = start + 6;
            if (strcmp(d, "[DONE]") == 0)
                c->stream_done = true;
            else if (strstr(d, "\"error\":"))
                c->stream_error = true;
            else {
                if (strstr(d, "\"choices\":[{")) {
                    c->chunks++;
                    if (!c->got_first) c->t_first = now;
                    c->got_first = true;
                }
                long ct = completion_tokens_in(d);
                if (ct >= 0 && strstr(d, "\"usage\":{")) c->completion_tokens = ct;
            }
        }
        *end = '\n';
        c->sse_off = (size_t)(end + 2 - c->body.p);
    }
}

/* Parses what arrived; returns 1 when the answer is complete, 0 for more, -1 on a bad answer. */
static int parse_in(struct conn *c, uint64_t now, bool stream)
{
    for (;;) {
        if (c->ph == PH_HEADERS) {
            char *e = c->in.p ? strstr(c->in.p, "\r\n\r\n") : NULL;
            if (!e) return c->in.n > 65536 ? -1 : 0;
            *e = 0;
            if (sscanf(c->in.p, "HTTP/1.%*d %d", &c->status) != 1) return -1;
            c->keep_alive = true;
            bool chunked = false, has_len = false;
            for (char *l = strstr(c->in.p, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
                const char *h = l + 2;
                if (strncasecmp(h, "content-length:", 15) == 0) {
                    c->body_left = strtoul(h + 15, NULL, 10);
                    has_len = true;
                } else if (strncasecmp(h, "transfer-encoding:", 18) == 0 && strstr(h, "chunked")) {
                    chunked = true;
                } else if (strncasecmp(h, "connection:", 11) == 0 && strstr(h, "close")) {
                    c->keep_alive = false;
                }
            }
            sbuf_drop(&c->in, (size_t)(e + 4 - c->in.p));
            c->ph = chunked ? PH_BODY_CHUNKED : has_len ? PH_BODY_LEN : PH_BODY_EOF;
            if (c->ph == PH_BODY_EOF) c->keep_alive = false;
            if (c->ph == PH_BODY_LEN && c->body_left > SB_MAX_BODY) return -1;
            continue;
        }
        if (c->ph == PH_BODY_LEN) {
            size_t take = c->in.n < c->body_left ? c->in.n : c->body_left;
            if (take && sbuf_add(&c->body, c->in.p, take) < 0) return -1;
            sbuf_drop(&c->in, take);
            c->body_left -= take;
            if (stream && take) scan_sse(c, now);
            return c->body_left == 0 ? 1 : 0;
        }
        if (c->ph == PH_BODY_CHUNKED) {
            char *nl = c->in.p ? strstr(c->in.p, "\r\n") : NULL;
            if (!nl) return 0;
            if (c->chunk_end) {
                /* Trailers end with an empty line; the first empty line here ends the body. */
                bool empty = nl == c->in.p;
                sbuf_drop(&c->in, (size_t)(nl + 2 - c->in.p));
                if (empty) return 1;
                continue;
            }
            size_t size = strtoul(c->in.p, NULL, 16);
            size_t line = (size_t)(nl + 2 - c->in.p);
            if (size == 0) {
                c->chunk_end = true;
                sbuf_drop(&c->in, line);
                continue;
            }
            if (size > SB_MAX_BODY || c->body.n + size > SB_MAX_BODY) return -1;
            if (c->in.n < line + size + 2) return 0;
            if (sbuf_add(&c->body, c->in.p + line, size) < 0) return -1;
            sbuf_drop(&c->in, line + size + 2);
            if (stream) scan_sse(c, now);
            continue;
        }
        if (c->ph == PH_BODY_EOF) {
            if (c->in.n && sbuf_add(&c->body, c->in.p, c->in.n) < 0) return -1;
            sbuf_drop(&c->in, c->in.n);
            if (stream) scan_sse(c, now);
            return c->body.n > SB_MAX_BODY ? -1 : 0;
        }
        return 0;
    }
}

struct sb_run {
    const struct sb_opts *o;
    uint32_t n_vocab;
    struct conn *conns;
    unsigned long next_req, total_reqs, answered;
    uint64_t t_start, t_end;
    struct sb_stats st;
};

static void conn_reset(struct conn *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->ph = PH_IDLE;
    c->in.n = 0;
}

/* Starts request k on c (connecting first if needed). */
static int start_request(struct sb_run *r, struct conn *c, unsigned long k)
{
    if (build_request(c, r->o, k, r->n_vocab) < 0) return -ENOMEM;
    c->counted = k >= r->o->warmup;
    c->body.n = 0;
    c->sse_off = 0;
    c->chunk_end = false;
    c->status = 0;
    c->got_first = c->stream_error = c->stream_done = false;
    c->completion_tokens = -1;
    c->chunks = 0;
    c->t_sent = kvf_bench_now_ns();
    c->deadline = c->t_sent + (uint64_t)r->o->timeout_s * 1000000000ull;
    if (c->fd < 0) {
        c->fd = open_socket(r->o, true);
        if (c->fd < 0) return -ECONNREFUSED;
        c->ph = PH_CONNECTING;
    } else {
        c->ph = PH_SENDING;
    }
    return 0;
}

/* Records the request that just ended on c (ok or not). */
static void finish_request(struct sb_run *r, struct conn *c, bool ok)
{
    uint64_t now = kvf_bench_now_ns();
    if (ok && c->status != 200) ok = false;
    if (ok && r->o->stream && (c->stream_error || !c->stream_done || !c->got_first)) ok = false;
    if (ok && !r->o->stream) {
        if (c->body.p && strstr(c->body.p, "\"error\":")) ok = false;
        c->completion_tokens = c->body.p ? completion_tokens_in(c->body.p) : -1;
    }
    if (ok && c->completion_tokens < (long)r->o->gen) ok = false;
    r->answered++;
    if (!c->counted) return;
    if (!ok) {
        r->st.errors++;
        return;
    }
    double lat_ms = (double)(now - c->t_sent) / 1e6;
    unsigned long i = r->st.n_ok++;
    r->st.lat[i] = lat_ms;
    r->st.tokens += (unsigned long)c->completion_tokens;
    r->st.chunks += c->chunks;
    if (r->o->stream) {
        double ttft = (double)(c->t_first - c->t_sent) / 1e6;
        r->st.ttft[i] = ttft;
        r->st.tpot[i] =
            c->completion_tokens > 1 ? (lat_ms - ttft) / (double)(c->completion_tokens - 1) : 0;
    } else {
        r->st.tpot[i] = lat_ms / (double)c->completion_tokens;
    }
}

/* The next request on c, or idle when all were started. */
static void next_on(struct sb_run *r, struct conn *c)
{
    while (r->next_req < r->total_reqs) {
        unsigned long k = r->next_req++;
        if (k == r->o->warmup) r->t_start = kvf_bench_now_ns();
        if (start_request(r, c, k) == 0) return;
        conn_reset(c);
        finish_request(r, c, false);
    }
    c->ph = PH_IDLE;
}

static void on_ready(struct sb_run *r, struct conn *c, short revents)
{
    if (c->ph == PH_CONNECTING) {
        int err = 0;
        socklen_t l = sizeof(err);
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err) goto failed;
        c->ph = PH_SENDING;
    }
    if (c->ph == PH_SENDING) {
        ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.n - c->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) goto failed;
        if (n > 0) c->out_off += (size_t)n;
        if (c->out_off == c->out.n) {
            c->ph = PH_HEADERS;
            c->in.n = 0;
        }
        return;
    }
    if (!(revents & (POLLIN | POLLHUP | POLLERR))) return;
    char b[65536];
    ssize_t n = recv(c->fd, b, sizeof(b), 0);
    if (n < 0 && errno == EAGAIN) return;
    uint64_t now = kvf_bench_now_ns();
    if (n <= 0) {
        if (c->ph == PH_BODY_EOF && n == 0) {
            conn_reset(c);
            finish_request(r, c, true);
            next_on(r, c);
            return;
        }
        goto failed;
    }
    if (sbuf_add(&c->in, b, (size_t)n) < 0) goto failed;
    int rc = parse_in(c, now, r->o->stream);
    if (rc < 0) goto failed;
    if (rc == 1) {
        if (!c->keep_alive) conn_reset(c);
        finish_request(r, c, true);
        next_on(r, c);
    }
    return;
failed:
    conn_reset(c);
    finish_request(r, c, false);
    next_on(r, c);
}

static int run_load(struct sb_run *r)
{
    const struct sb_opts *o = r->o;
    struct pollfd *pf = calloc(o->conc, sizeof(*pf));
    if (!pf) return -ENOMEM;
    r->total_reqs = o->warmup + o->requests;
    if (o->warmup == 0) r->t_start = kvf_bench_now_ns();
    for (unsigned long i = 0; i < o->conc; i++)
        next_on(r, &r->conns[i]);
    while (r->answered < r->total_reqs) {
        uint64_t now = kvf_bench_now_ns();
        for (unsigned long i = 0; i < o->conc; i++) {
            struct conn *c = &r->conns[i];
            pf[i].fd = c->ph == PH_IDLE ? -1 : c->fd;
            pf[i].events = c->ph == PH_CONNECTING || c->ph == PH_SENDING ? POLLOUT : POLLIN;
            pf[i].revents = 0;
            if (c->ph != PH_IDLE && now > c->deadline) {
                conn_reset(c);
                finish_request(r, c, false);
                next_on(r, c);
            }
        }
        if (poll(pf, (nfds_t)o->conc, 100) < 0 && errno != EINTR) break;
        for (unsigned long i = 0; i < o->conc; i++)
            if (pf[i].revents && pf[i].fd >= 0 && r->conns[i].fd == pf[i].fd)
                on_ready(r, &r->conns[i], pf[i].revents);
    }
    r->t_end = kvf_bench_now_ns();
    free(pf);
    return 0;
}

static double pct(double *v, unsigned long n, double p)
{
    if (!n) return NAN;
    kvf_bench_median(v, (int)n); /* sorts */
    double idx = p * (double)(n - 1);
    unsigned long lo = (unsigned long)idx;
    double frac = idx - (double)lo;
    return lo + 1 < n ? v[lo] * (1 - frac) + v[lo + 1] * frac : v[lo];
}

int kvf_bench_serve(int argc, char **argv)
{
    struct sb_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;

    /* The server is up (its prefill connected) and says how many token ids it takes. */
    uint32_t n_vocab = 0;
    for (int tries = 0; tries < 600 && !n_vocab; tries++) {
        struct sbuf h = {0};
        int st = http_get(&o, "/health", &h);
        if (st == 200 && h.p && strstr(h.p, "\"ok\"")) {
            const char *v = strstr(h.p, "\"n_vocab\":");
            if (v) n_vocab = (uint32_t)strtoul(v + 10, NULL, 10);
            if (!v) {
                /* Another server (the C/C++ one, compared side by side) names it in /v1/models. */
                struct sbuf mm = {0};
                if (http_get(&o, "/v1/models", &mm) == 200 && mm.p &&
                    (v = strstr(mm.p, "\"n_vocab\":")))
                    n_vocab = (uint32_t)strtoul(v + 10, NULL, 10);
                free(mm.p);
            }
        }
        free(h.p);
        if (!n_vocab) usleep(100000);
    }
    if (!n_vocab) {
        fprintf(stderr,
                "kvfence bench serve: %s:%s/health did not answer \"ok\" with n_vocab "
                "within 60 s\n",
                o.host, o.port);
        return 1;
    }

    struct sb_run r;
    memset(&r, 0, sizeof(r));
    r.o = &o;
    r.n_vocab = n_vocab;
    r.conns = calloc(o.conc, sizeof(*r.conns));
    r.st.ttft = calloc(o.requests, sizeof(double));
    r.st.tpot = calloc(o.requests, sizeof(double));
    r.st.lat = calloc(o.requests, sizeof(double));
    if (!r.conns || !r.st.ttft || !r.st.tpot || !r.st.lat) return 1;
    for (unsigned long i = 0; i < o.conc; i++)
        r.conns[i].fd = -1;
    run_load(&r);
    for (unsigned long i = 0; i < o.conc; i++) {
        conn_reset(&r.conns[i]);
        free(r.conns[i].out.p), free(r.conns[i].in.p), free(r.conns[i].body.p);
    }
    double wall_s = (double)(r.t_end - r.t_start) / 1e9;
    double tok_s = wall_s > 0 ? (double)r.st.tokens / wall_s : 0;
    double ttft50 = o.stream ? pct(r.st.ttft, r.st.n_ok, 0.5) : NAN;
    double ttft99 = o.stream ? pct(r.st.ttft, r.st.n_ok, 0.99) : NAN;
    double tpot50 = pct(r.st.tpot, r.st.n_ok, 0.5);
    double tpot99 = pct(r.st.tpot, r.st.n_ok, 0.99);
    double lat50 = pct(r.st.lat, r.st.n_ok, 0.5), lat99 = pct(r.st.lat, r.st.n_ok, 0.99);
    printf("serve  %s:%s  concurrency=%lu requests=%lu (+%lu warm-up) prompt=%lu gen=%lu %s\n",
           o.host, o.port, o.conc, o.requests, o.warmup, o.prompt, o.gen,
           o.stream ? "streaming" : "not streaming");
    printf("answered %lu ok, %lu errors, %lu completion tokens in %.2f s\n", r.st.n_ok, r.st.errors,
           r.st.tokens, wall_s);
    printf("ttft ms  p50 %.1f  p99 %.1f   tpot ms  p50 %.2f  p99 %.2f   requests/s %.2f\n", ttft50,
           ttft99, tpot50, tpot99, wall_s > 0 ? (double)r.st.n_ok / wall_s : 0);
    printf("latency ms  p50 %.1f  p99 %.1f (request sent to its last byte)\n", lat50, lat99);
    if (o.stream && r.st.chunks * 2 < r.st.tokens)
        printf("note: %lu chunks for %lu tokens — the model's pieces decode to (almost) nothing, "
               "so the first chunk came with the last token and TTFT is the whole latency; "
               "--logprobs makes every token visible\n",
               r.st.chunks, r.st.tokens);
    printf("result bench=serve tok_s=%.1f ttft_p50_ms=%.1f ttft_p99_ms=%.1f tpot_p50_ms=%.2f "
           "latency_p50_ms=%.1f errors=%lu\n",
           tok_s, ttft50, ttft99, tpot50, lat50, r.st.errors);
    free(r.st.ttft), free(r.st.tpot), free(r.st.lat);
    return r.st.errors ? 1 : 0;
}
