/*
 * test_server_hardening.c — BAD_INPUTS rows 19–23 and 25 against the server over the fake
 * engine, with a raw-socket client: bodies over the bound, slow headers, slow bodies and slow
 * readers, the per-address connection cap, oversized and too many headers, a long request line,
 * chunked-encoding abuse, conflicting body headers, unknown paths and wrong methods.
 *
 * Every case ends in expect_serving: a normal request from another connection succeeds, and the
 * server comes back to idle — no request in flight (/health in_flight, the engine's running
 * count, every engine handle released) and no connection left open but the one asking.
 * Where a bound is timed, the figure is printed as a TAP comment ("# ... ms").
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>

#include "server_test_util.h"

/* --- Client helpers. ------------------------------------------------------------------------- */

/* A TCP connection to 127.0.0.1:port from the local address src ("127.0.0.2": another client
 * address on the loopback network, for the per-address cap). */
static int connect_from(uint16_t port, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in b = {.sin_family = AF_INET};
    ASSERT_EQ_INT(inet_pton(AF_INET, src, &b.sin_addr), 1);
    ASSERT_EQ_INT(bind(fd, (struct sockaddr *)&b, sizeof b), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ_INT(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Waits up to timeout_ms for the server to close fd (end of file or reset), reading and
 * keeping what arrives (NUL-terminated, at most cap - 1 bytes). The time until the close in ms,
 * or -1 if it stayed open. */
static int64_t wait_closed(int fd, char *got, size_t cap, int timeout_ms)
{
    size_t n = 0;
    int64_t t0 = fake_now_ms();
    for (;;) {
        int64_t left = t0 + timeout_ms - fake_now_ms();
        if (left <= 0) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0) continue;
        char tmp[4096];
        ssize_t k = recv(fd, tmp, sizeof tmp, 0);
        if (k <= 0) {
            if (got) got[n] = 0;
            return fake_now_ms() - t0;
        }
        size_t room = cap ? cap - 1 - n : 0;
        size_t take = (size_t)k < room ? (size_t)k : room;
        if (got) memcpy(got + n, tmp, take);
        n += take;
    }
    if (got) got[n] = 0;
    return -1;
}

static int status_of(const char *raw)
{
    int st = 0;
    return sscanf(raw, "HTTP/1.%*d %d", &st) == 1 ? st : 0;
}

/* GET /health, parsed. */
static json_t *health(uint16_t port)
{
    struct http_resp r;
    http_do(port, "GET", "/health", NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    ASSERT_NOT_NULL(j);
    http_resp_free(&r);
    return j;
}

static long long hget(json_t *h, const char *obj, const char *key)
{
    json_t *o = obj ? json_object_get(h, obj) : h;
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) KVF_FAIL("/health has no integer %s.%s", obj ? obj : "", key);
    return (long long)json_integer_value(v);
}

static void send_str(int fd, const char *str)
{
    http_send_all(fd, str, strlen(str));
}

/* Whether fd has something to read (or was closed) within ms. */
static bool readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) > 0;
}

/* The server still serves: a completion from a fresh connection from `src`. */
static void expect_served_from(struct srv *s, const char *src)
{
    int fd = connect_from(s->port, src);
    const char *body = "{\"prompt\":\"hello world\",\"max_tokens\":2}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    http_send_all(fd, req, (size_t)n);
    size_t len;
    char *raw = http_read_all(fd, &len, 10000);
    close(fd);
    struct http_resp r;
    http_parse(raw, len, &r);
    free(raw);
    if (r.status != 200) KVF_FAIL("a normal request got %d: %.300s", r.status, r.body);
    ASSERT_TRUE(strstr(r.body, "\"text_completion\"") != NULL);
    http_resp_free(&r);
}

/* The server comes back to idle within 3 s: /health shows nothing in flight or running and no
 * connection but its own, and the engine holds no handle. */
static void expect_idle(struct srv *s)
{
    int64_t until = fake_now_ms() + 3000;
    for (;;) {
        json_t *h = health(s->port);
        long long in_flight = hget(h, NULL, "in_flight"), running = hget(h, NULL, "running"),
                  conns = hget(h, "http", "connections");
        json_decref(h);
        if (in_flight == 0 && running == 0 && conns == 1 && fake_live(&s->f) == 0) break;
        if (fake_now_ms() > until)
            KVF_FAIL("not idle: in_flight %lld, running %lld, connections %lld, engine live %u",
                     in_flight, running, conns, fake_live(&s->f));
        usleep(20 * 1000);
    }
    pthread_mutex_lock(&s->f.mu);
    ASSERT_EQ_INT(s->f.releases, s->f.submits);
    pthread_mutex_unlock(&s->f.mu);
}

static void expect_serving(struct srv *s)
{
    expect_served_from(s, "127.0.0.1");
    expect_idle(s);
}

/* Sends req on a fresh connection and returns the status of the reply (0: closed without
 * one). */
static int raw_status(uint16_t port, const char *req, size_t len)
{
    int fd = http_connect(port);
    http_send_all(fd, req, len);
    static char got[8192];
    int64_t dt = wait_closed(fd, got, sizeof got, 10000);
    close(fd);
    ASSERT_TRUE(dt >= 0);
    return status_of(got);
}

/* --- Row 19: a body over the bound. ---------------------------------------------------------- */

struct pusher {
    int fd;
    size_t total, sent;
    const char *chunk; /* sent again and again */
    size_t chunk_len;
};

static void *push(void *arg)
{
    struct pusher *p = arg;
    while (p->sent < p->total) {
        ssize_t k = send(p->fd, p->chunk, p->chunk_len, MSG_NOSIGNAL);
        if (k <= 0) break; /* the server closed after its answer */
        p->sent += (size_t)k;
    }
    return NULL;
}

static void test_row19_body_limit(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.max_body_bytes = 4096;
    srv_start(&s);
    /* A declared length over the bound: 413 at once, no byte of the body sent. */
    int fd = http_connect(s.port);
    const char *big = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n"
                      "Content-Type: application/json\r\n\r\n";
    int64_t t0 = fake_now_ms();
    http_send_all(fd, big, strlen(big));
    char got[4096];
    int64_t dt = wait_closed(fd, got, sizeof got, 5000);
    close(fd);
    ASSERT_EQ_INT(status_of(got), 413);
    ASSERT_TRUE(strstr(got, "\"body_too_large\"") != NULL);
    printf("# 413 for Content-Length 1e9: %lld ms, no body sent\n",
           (long long)(fake_now_ms() - t0));
    ASSERT_TRUE(dt >= 0 && dt < 2000);
    /* A chunked body of 64 MiB (declaring no length): 413 once the bound is passed, while the
     * client is still sending; the server reads no more of it. */
    fd = http_connect(s.port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                       "Content-Type: application/json\r\n\r\n";
    http_send_all(fd, head, strlen(head));
    static char chunk[8 + 2 + 4096 + 2];
    int hl = snprintf(chunk, sizeof chunk, "1000\r\n");
    memset(chunk + hl, ' ', 4096);
    memcpy(chunk + hl + 4096, "\r\n", 2);
    struct pusher p = {
        .fd = fd, .total = 64u << 20, .chunk = chunk, .chunk_len = (size_t)hl + 4096 + 2};
    pthread_t th;
    ASSERT_EQ_INT(pthread_create(&th, NULL, push, &p), 0);
    dt = wait_closed(fd, got, sizeof got, 10000);
    shutdown(fd, SHUT_RDWR);
    pthread_join(th, NULL);
    close(fd);
    ASSERT_TRUE(dt >= 0);
    ASSERT_EQ_INT(status_of(got), 413);
    printf("# chunked 64 MiB body: 413 after the client had sent %zu bytes (bound 4096)\n", p.sent);
    ASSERT_TRUE(p.sent < p.total);
    expect_serving(&s);
    srv_stop(&s);
}

/* --- Row 20: slow clients. ------------------------------------------------------------------- */

/* Sends the request line, then one header line every step_ms (each byte restarts MHD's idle
 * timer), until the server closes; returns the time to the close and what was received. */
static int64_t slowloris(uint16_t port, int step_ms, char *got, size_t cap)
{
    int fd = http_connect(port);
    int64_t t0 = fake_now_ms();
    send_str(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 200; i++) {
        char line[32];
        int n = snprintf(line, sizeof line, "X-%d: a\r\n", i);
        if (send(fd, line, (size_t)n, MSG_NOSIGNAL) <= 0 || readable(fd, step_ms)) break;
    }
    int64_t dt = wait_closed(fd, got, cap, 2000);
    close(fd);
    return dt < 0 ? -1 : fake_now_ms() - t0;
}

static void test_row20_slow_headers(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.header_timeout_ms = 1000;
    s.cfg.idle_timeout_s = 2;
    srv_start(&s);
    char got[4096];
    int64_t dt = slowloris(s.port, 100, got, sizeof got);
    printf("# slow headers (a line every 100 ms): closed after %lld ms (bound 1000)\n",
           (long long)dt);
    ASSERT_TRUE(dt >= 900 && dt <= 2000);
    ASSERT_EQ_INT(status_of(got), 408);
    ASSERT_TRUE(strstr(got, "\"request_timeout\"") != NULL);
    /* A connection that sends nothing at all: the same bound. */
    int fd = http_connect(s.port);
    dt = wait_closed(fd, got, sizeof got, 5000);
    close(fd);
    printf("# silent connection: closed after %lld ms\n", (long long)dt);
    ASSERT_TRUE(dt >= 900 && dt <= 2000);
    /* Ten slow clients at once while others are served. */
    int fds[10];
    for (int i = 0; i < 10; i++) {
        fds[i] = http_connect(s.port);
        send_str(fds[i], "POST /v1/completions HTTP/1.1\r\n");
    }
    /* The ten and this one (/health's own); a connection the earlier checks closed may still be
     * counted until the server's next turn reaps it, so the count is read until it settles (a
     * loaded machine can delay that turn), and must settle at 11. */
    long long conns = -1;
    for (int i = 0; i < 40 && conns != 11; i++) {
        if (i) usleep(50 * 1000);
        json_t *h = health(s.port);
        conns = hget(h, "http", "connections");
        json_decref(h);
    }
    ASSERT_EQ_INT(conns, 11);
    expect_served_from(&s, "127.0.0.1"); /* during the attack */
    for (int i = 0; i < 10; i++) {
        ASSERT_TRUE(wait_closed(fds[i], NULL, 0, 3000) >= 0);
        close(fds[i]);
    }
    expect_idle(&s);
    /* A kept-alive connection (after a POST: MHD closes after every GET, answered before the
     * request is read to its end): its next request's headers get idle_timeout_s, and no 408
     * (the client may be sending its next request as it would go out). */
    fd = http_connect(s.port);
    send_str(fd, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n"
                 "{\"prompt\":\"ab\"}");
    char buf[4096];
    ASSERT_TRUE(readable(fd, 5000));
    ASSERT_TRUE(recv(fd, buf, sizeof buf, 0) > 0);
    send_str(fd, "GET /health HTTP/1.1\r\n");
    dt = wait_closed(fd, got, sizeof got, 6000);
    close(fd);
    printf("# slow second request on a kept-alive connection: closed after %lld ms (bound 2000)\n",
           (long long)dt);
    ASSERT_TRUE(dt >= 1500 && dt <= 3500);
    ASSERT_EQ_INT(got[0], 0); /* nothing after the first answer */
    json_t *h = health(s.port);
    ASSERT_TRUE(hget(h, "http", "closed_slow_headers") >= 12);
    json_decref(h);
    expect_serving(&s);
    srv_stop(&s);
}

static void test_row20_slow_body(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.body_timeout_ms = 800;
    srv_start(&s);
    /* Content-Length 100, a byte every 100 ms. */
    int fd = http_connect(s.port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n";
    http_send_all(fd, head, strlen(head));
    int64_t t0 = fake_now_ms(), dt;
    char got[4096];
    for (int i = 0; i < 100; i++)
        if (send(fd, " ", 1, MSG_NOSIGNAL) <= 0 || readable(fd, 100)) break;
    dt = wait_closed(fd, got, sizeof got, 2000);
    close(fd);
    ASSERT_TRUE(dt >= 0);
    dt = fake_now_ms() - t0;
    printf("# slow body (a byte every 100 ms): closed after %lld ms (bound 800)\n", (long long)dt);
    ASSERT_TRUE(dt >= 700 && dt <= 2000);
    ASSERT_EQ_INT(status_of(got), 408);
    /* Chunked without an end (row 22): a 1-byte chunk every 100 ms. */
    fd = http_connect(s.port);
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    http_send_all(fd, head, strlen(head));
    t0 = fake_now_ms();
    for (int i = 0; i < 100; i++)
        if (send(fd, "1\r\n \r\n", 6, MSG_NOSIGNAL) <= 0 || readable(fd, 100)) break;
    dt = wait_closed(fd, got, sizeof got, 2000);
    close(fd);
    ASSERT_TRUE(dt >= 0);
    dt = fake_now_ms() - t0;
    printf("# endless chunks (one every 100 ms): closed after %lld ms (bound 800)\n",
           (long long)dt);
    ASSERT_TRUE(dt >= 700 && dt <= 2000);
    ASSERT_EQ_INT(status_of(got), 408);
    json_t *h = health(s.port);
    ASSERT_EQ_INT(hget(h, "http", "closed_slow_body"), 2);
    json_decref(h);
    expect_serving(&s);
    srv_stop(&s);
}

/* A long stream whose client reads nothing (reads == 0) or `reads` bytes every 100 ms. The
 * server closes it send_timeout_ms after its bytes stop going out, and the request is
 * cancelled. Returns the time from the request to the engine's cancel. */
static int64_t slow_reader(struct srv *s, size_t reads)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ_INT(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *body = "{\"prompt\":\"hello world\",\"max_tokens\":60000,\"stream\":true,"
                       "\"logprobs\":5}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    uint32_t cancels0 = fake_cancels(&s->f);
    int64_t t0 = fake_now_ms();
    http_send_all(fd, req, (size_t)n);
    int64_t tc = -1;
    while (fake_now_ms() - t0 < 10000) {
        tc = fake_wait_cancels(&s->f, cancels0 + 1, 100);
        if (tc >= 0) break;
        if (reads) {
            char buf[64];
            (void)!recv(fd, buf, reads < sizeof buf ? reads : sizeof buf, MSG_DONTWAIT);
        }
    }
    close(fd);
    return tc < 0 ? -1 : tc - t0;
}

static void test_row20_slow_reader(void)
{
    struct srv s;
    srv_init(&s);
    s.f.served_limit = 65536; /* room for a stream far longer than the socket buffers */
    s.cfg.send_timeout_ms = 800;
    srv_start(&s);
    int64_t dt = slow_reader(&s, 0);
    printf("# a stream never read: cancelled %lld ms after the request (send bound 800)\n",
           (long long)dt);
    ASSERT_TRUE(dt >= 700 && dt <= 3000);
    expect_serving(&s);
    dt = slow_reader(&s, 16);
    printf("# a stream read 16 bytes per 100 ms: cancelled %lld ms after the request\n",
           (long long)dt);
    ASSERT_TRUE(dt >= 700 && dt <= 3000);
    json_t *h = health(s.port);
    ASSERT_EQ_INT(hget(h, "http", "closed_slow_reader"), 2);
    json_decref(h);
    expect_serving(&s);
    /* A reader that keeps up is never cut, however long its stream: 2.5 s of tokens. */
    pthread_mutex_lock(&s.f.mu);
    s.f.token_delay_ms = 5;
    pthread_mutex_unlock(&s.f.mu);
    struct http_resp r;
    http_do(s.port, "POST", "/v1/completions",
            "{\"prompt\":\"hello\",\"max_tokens\":500,\"stream\":true}", &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(strstr(r.body, "[DONE]") != NULL);
    http_resp_free(&r);
    srv_stop(&s);
}

/* The per-address cap: the connection past it is closed unanswered, other addresses are
 * served, and the address is served again once its connections close. */
/* Reads one whole answer on fd until the server closes it (timeout_ms in all): a reset, or a
 * close before a complete answer, fails the test. Returns the bytes (malloc'd). */
static char *read_reply(int fd, int timeout_ms, const char *what)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    ASSERT_NOT_NULL(buf);
    int64_t until = fake_now_ms() + timeout_ms;
    for (;;) {
        int64_t left = until - fake_now_ms();
        if (left <= 0) KVF_FAIL("%s: no answer within %d ms (%zu bytes)", what, timeout_ms, n);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0) continue;
        ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
        if (k < 0 && errno == ECONNRESET)
            KVF_FAIL("%s: the connection was reset (%zu bytes in)", what, n);
        if (k <= 0) break;
        n += (size_t)k;
        if (n + 1 >= cap) KVF_FAIL("%s: answer too long", what);
    }
    buf[n] = 0;
    if (!strstr(buf, "\r\n\r\n")) KVF_FAIL("%s: closed after %zu bytes, no whole answer", what, n);
    return buf;
}

/* A 503 past a connection cap: Retry-After, Connection: close, the JSON error's code. */
static void expect_cap_503(const char *raw, const char *what)
{
    struct http_resp r;
    http_parse(raw, strlen(raw), &r);
    if (r.status != 503) KVF_FAIL("%s: status %d (%.200s), wanted 503", what, r.status, r.body);
    ASSERT_TRUE(strcasestr(r.head, "\r\nretry-after: 1") != NULL);
    ASSERT_TRUE(strcasestr(r.head, "\r\nconnection: close") != NULL);
    ASSERT_NOT_NULL(strstr(r.body, "\"too_many_connections\""));
    http_resp_free(&r);
}

static const char *const post_req =
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "Content-Length: 37\r\n\r\n{\"prompt\":\"hello\",\"max_tokens\":2}\r\n\r\n";

/* max_conn_per_ip: past it a request is answered 503 with Retry-After and its connection closed
 * after the answer (a GET at once, a POST once its body is in) — never reset, never dropped;
 * other addresses are served meanwhile. The default cap, 64, the same. */
static void test_row20_per_ip_cap(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.max_conn_per_ip = 4;
    srv_start(&s);
    int fds[4];
    for (int i = 0; i < 4; i++)
        fds[i] = http_connect(s.port);
    usleep(100 * 1000);
    for (int k = 0; k < 2; k++) {
        int extra = http_connect(s.port);
        send_str(extra, k ? post_req : "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
        char *raw = read_reply(extra, 3000, k ? "POST past the cap" : "GET past the cap");
        close(extra);
        expect_cap_503(raw, "past max_conn_per_ip");
        free(raw);
    }
    expect_served_from(&s, "127.0.0.2");
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    usleep(100 * 1000);
    json_t *h = health(s.port);
    ASSERT_EQ_INT(hget(h, "http", "refused_over_cap"), 2);
    json_decref(h);
    expect_serving(&s);
    srv_stop(&s);
    /* The default cap, 64. */
    srv_init(&s);
    srv_start(&s);
    int many[64];
    for (int i = 0; i < 64; i++)
        many[i] = http_connect(s.port);
    usleep(200 * 1000);
    int extra = http_connect(s.port);
    send_str(extra, post_req);
    char *raw = read_reply(extra, 3000, "the 65th connection");
    close(extra);
    expect_cap_503(raw, "past the default cap");
    free(raw);
    expect_served_from(&s, "127.0.0.2");
    for (int i = 0; i < 64; i++)
        close(many[i]);
    usleep(100 * 1000);
    expect_serving(&s);
    srv_stop(&s);
}

/* max_connections without keys: idle connections from several addresses fill it; the next
 * request gets 503 with Retry-After, not a wait in the backlog and not a reset. */
static void test_row20_global_cap(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.max_connections = 8;
    srv_start(&s);
    int idle[8];
    char src[32];
    for (int i = 0; i < 8; i++) {
        snprintf(src, sizeof src, "127.0.0.%d", 2 + i % 4);
        idle[i] = connect_from(s.port, src);
    }
    usleep(100 * 1000);
    int extra = connect_from(s.port, "127.0.0.9");
    send_str(extra, post_req);
    char *raw = read_reply(extra, 3000, "past max_connections");
    close(extra);
    expect_cap_503(raw, "past max_connections");
    free(raw);
    for (int i = 0; i < 8; i++)
        close(idle[i]);
    usleep(100 * 1000);
    expect_serving(&s);
    srv_stop(&s);
}

/* With keys and the default caps (256 connections, 64 per address): 4 addresses × 64 idle
 * keyless connections fill max_connections, yet a keyed tenant's request is served at once (the
 * room kept for keys), a keyless one gets 503, and the idle ones are closed after
 * keyless_timeout_ms. */
static void test_row20_keyless_cannot_lock_out(void)
{
    enum { IDLE = 256 };
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *k;
    char err[256];
    static const char keys[] = "sk-hardening-key-1 alpha\n";
    ASSERT_OK(kvf_server_keys_parse(keys, sizeof keys - 1, &k, err, sizeof err));
    s.cfg.keys = k;
    s.cfg.keyless_timeout_ms = 1500;
    srv_start(&s);
    static int idle[IDLE];
    char src[32];
    for (int i = 0; i < IDLE; i++) {
        snprintf(src, sizeof src, "127.0.0.%d", 2 + i % 4);
        idle[i] = connect_from(s.port, src);
    }
    usleep(100 * 1000);
    const char *body = "{\"prompt\":\"hello\",\"max_tokens\":2}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Authorization: Bearer sk-hardening-key-1\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    int64_t t0 = fake_now_ms();
    int fd = connect_from(s.port, "127.0.0.9");
    http_send_all(fd, req, (size_t)n);
    char *raw = read_reply(fd, 1000, "the keyed request");
    close(fd);
    ASSERT_EQ_INT(status_of(raw), 200);
    ASSERT_LT_INT(fake_now_ms() - t0, 1000);
    free(raw);
    fd = connect_from(s.port, "127.0.0.10");
    send_str(fd, post_req); /* no key */
    raw = read_reply(fd, 1000, "a keyless request");
    close(fd);
    expect_cap_503(raw, "keyless past its room");
    free(raw);
    /* The idle keyless connections go after their short bound, answered 408 (they sent nothing). */
    for (int i = 0; i < IDLE; i++) {
        int64_t dt = wait_closed(idle[i], NULL, 0, 3000);
        if (dt < 0) KVF_FAIL("idle keyless connection %d still open 3 s later", i);
        close(idle[i]);
    }
    ASSERT_LT_INT(fake_now_ms() - t0, 3000);
    srv_stop(&s);
    kvf_server_keys_free(k);
}

/* A POST without a valid key whose large body is sent at once is answered 401 whole: the body
 * is read and dropped first, so the close leaves nothing unread to turn into a reset. */
static void test_row20_keyless_post_answered_401(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *k;
    char err[256];
    static const char keys[] = "sk-hardening-key-1 alpha\n";
    ASSERT_OK(kvf_server_keys_parse(keys, sizeof keys - 1, &k, err, sizeof err));
    s.cfg.keys = k;
    s.cfg.max_body_bytes = 1 << 20;
    srv_start(&s);
    enum { BODY = 400 * 1024 };
    static char req[BODY + 512];
    int h =
        snprintf(req, sizeof req,
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Authorization: Bearer not-a-key\r\nContent-Length: %d\r\n\r\n{\"prompt\":\"",
                 BODY);
    size_t n = (size_t)h;
    size_t fill = BODY - 12 - 3; /* {"prompt":" is 12 bytes, "} and the newline 3 */
    memset(req + n, 'a', fill);
    n += fill;
    memcpy(req + n, "\"}\n", 3);
    n += 3;
    for (int round = 0; round < 3; round++) {
        int fd = connect_from(s.port, "127.0.0.2");
        http_send_all(fd, req, n);
        char *raw = read_reply(fd, 5000, "a keyless POST with a large body");
        close(fd);
        if (status_of(raw) != 401) KVF_FAIL("status %d, wanted 401: %.200s", status_of(raw), raw);
        ASSERT_TRUE(strcasestr(raw, "\r\nwww-authenticate: bearer") != NULL);
        free(raw);
    }
    srv_stop(&s);
    kvf_server_keys_free(k);
}

/* --trusted-proxy: 256 requests at once through one proxy address, each from its own client
 * (X-Forwarded-For), are all served; the cap then counts the forwarded client (65 requests of
 * one client: one 503); a peer that is not trusted is counted as itself, whatever it forwards. */
static void test_row20_trusted_proxy(void)
{
    enum { N = 256 };
    struct srv s;
    srv_init(&s);
    s.cfg.trusted_proxies = "10.9.9.9, 127.0.0.1/32 ,::1";
    s.f.first_delay_ms = 400; /* every request is in flight at once */
    srv_start(&s);
    static int fd[N];
    const char *body = "{\"prompt\":\"hello\",\"max_tokens\":1}";
    for (int i = 0; i < N; i++) {
        fd[i] = http_connect(s.port);
        char req[512];
        int n = snprintf(req, sizeof req,
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         "X-Forwarded-For: 198.51.100.1, 10.20.%d.%d, 10.9.9.9\r\n"
                         "Content-Length: %zu\r\n\r\n%s",
                         i / 200, i % 200 + 1, strlen(body), body);
        http_send_all(fd[i], req, (size_t)n);
    }
    for (int i = 0; i < N; i++) {
        char what[64];
        snprintf(what, sizeof what, "proxied request %d", i);
        char *raw = read_reply(fd[i], 15000, what);
        close(fd[i]);
        if (status_of(raw) != 200) KVF_FAIL("%s: %.300s", what, raw);
        free(raw);
    }
    ASSERT_EQ_INT(s.f.submits, N);
    /* One forwarded client, 65 requests at once: the 65th is its cap's 503. */
    int refused = 0;
    for (int i = 0; i < 65; i++) {
        fd[i] = http_connect(s.port);
        char req[512];
        int n = snprintf(req, sizeof req,
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         "Forwarded: for=\"[2001:db8::7]:4711\";proto=http\r\n"
                         "Content-Length: %zu\r\n\r\n%s",
                         strlen(body), body);
        http_send_all(fd[i], req, (size_t)n);
        usleep(2000);
    }
    for (int i = 0; i < 65; i++) {
        char *raw = read_reply(fd[i], 15000, "one client's request");
        close(fd[i]);
        if (status_of(raw) == 503) {
            expect_cap_503(raw, "one forwarded client past its cap");
            refused++;
        } else if (status_of(raw) != 200) {
            KVF_FAIL("one client's request: %.300s", raw);
        }
        free(raw);
    }
    ASSERT_EQ_INT(refused, 1);
    srv_stop(&s);
    /* Not trusted: 127.0.0.2's X-Forwarded-For is ignored, its own cap applies. */
    srv_init(&s);
    s.cfg.trusted_proxies = "127.0.0.1";
    s.cfg.max_conn_per_ip = 2;
    srv_start(&s);
    int a = connect_from(s.port, "127.0.0.2"), b = connect_from(s.port, "127.0.0.2");
    usleep(100 * 1000);
    int c = connect_from(s.port, "127.0.0.2");
    send_str(c, "GET /health HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.5\r\n\r\n");
    char *raw = read_reply(c, 3000, "a spoofed X-Forwarded-For");
    close(c);
    expect_cap_503(raw, "an untrusted peer's forwarded address");
    free(raw);
    close(a);
    close(b);
    usleep(100 * 1000);
    expect_serving(&s);
    srv_stop(&s);
}

/* --- Row 21: headers and the request line. --------------------------------------------------- */

static char *many_headers(int n, size_t *len)
{
    size_t cap = 64 + (size_t)n * 32;
    char *b = malloc(cap);
    ASSERT_NOT_NULL(b);
    size_t o = (size_t)snprintf(b, cap, "GET /health HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(b + o, cap - o, "X-%d: v\r\n", i);
    o += (size_t)snprintf(b + o, cap - o, "Connection: close\r\n\r\n");
    *len = o;
    return b;
}

static void test_row21_headers(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    size_t hn = 64 * 1024, len;
    char *huge = malloc(hn + 256);
    int o = snprintf(huge, 256, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(huge + o, 'a', hn);
    o += (int)hn;
    o += snprintf(huge + o, 64, "\r\nConnection: close\r\n\r\n");
    ASSERT_EQ_INT(raw_status(s.port, huge, (size_t)o), 431);
    /* One 20 KiB header fits the connection's memory: served. */
    o = snprintf(huge, 256, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(huge + o, 'a', 20 * 1024);
    o += 20 * 1024;
    o += snprintf(huge + o, 64, "\r\nConnection: close\r\n\r\n");
    ASSERT_EQ_INT(raw_status(s.port, huge, (size_t)o), 200);
    /* Request line. */
    o = snprintf(huge, 64, "GET /");
    memset(huge + o, 'a', hn);
    o += (int)hn;
    o += snprintf(huge + o, 64, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ASSERT_EQ_INT(raw_status(s.port, huge, (size_t)o), 414);
    free(huge);
    /* Count: 98 + Host + Connection = 100 fields are served, 101 are not; thousands overflow
     * the connection's memory. */
    char *m = many_headers(98, &len);
    ASSERT_EQ_INT(raw_status(s.port, m, len), 200);
    free(m);
    m = many_headers(99, &len);
    ASSERT_EQ_INT(raw_status(s.port, m, len), 431);
    free(m);
    m = many_headers(5000, &len);
    ASSERT_EQ_INT(raw_status(s.port, m, len), 431);
    free(m);
    expect_serving(&s);
    srv_stop(&s);
}

/* --- Row 22: chunked encoding. ---------------------------------------------------------------- */

static int chunked_status(uint16_t port, const char *chunks, size_t len)
{
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    int fd = http_connect(port);
    send_str(fd, head);
    http_send_all(fd, chunks, len);
    static char got[8192];
    int64_t dt = wait_closed(fd, got, sizeof got, 10000);
    close(fd);
    ASSERT_TRUE(dt >= 0);
    return status_of(got);
}

#define CHUNKS(lit) chunked_status(s.port, lit, sizeof lit - 1)

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

static void test_row22_chunked(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.max_body_bytes = 64 * 1024;
    srv_start(&s);
    /* Sizes: overflowing 64 bits, beyond the bound, negative, not hex, no size at all. */
    ASSERT_EQ_INT(CHUNKS("FFFFFFFFFFFFFFFFFFFFFFFF\r\nabc\r\n0\r\n\r\n"), 413);
    ASSERT_EQ_INT(CHUNKS("-5\r\nabcde\r\n0\r\n\r\n"), 400);
    ASSERT_EQ_INT(CHUNKS("zz\r\nabcde\r\n0\r\n\r\n"), 400);
    ASSERT_EQ_INT(CHUNKS("\r\nabcde\r\n0\r\n\r\n"), 400);
    /* A chunk longer than it said. */
    ASSERT_EQ_INT(CHUNKS("2\r\nabcde\r\n0\r\n\r\n"), 400);
    /* Many trailer fields overflow the connection's memory. */
    {
        size_t cap = 200000, o = 0;
        char *b = malloc(cap);
        o += (size_t)snprintf(b, cap, "2\r\n{}\r\n0\r\n");
        for (int i = 0; i < 5000; i++)
            o += (size_t)snprintf(b + o, cap - o, "T%d: v\r\n", i);
        o += (size_t)snprintf(b + o, cap - o, "\r\n");
        ASSERT_EQ_INT(chunked_status(s.port, b, o), 431);
        free(b);
    }
    /* A chunk line beyond the connection's memory (a 40 KiB extension): refused by MHD, which
     * 0.9.75 answers with 500; never read further. */
    {
        size_t cap = 48 * 1024, o = 0;
        char *b = malloc(cap);
        o += (size_t)snprintf(b, cap, "2;");
        memset(b + o, 'x', 40 * 1024);
        o += 40 * 1024;
        o += (size_t)snprintf(b + o, cap - o, "\r\n{}\r\n0\r\n\r\n");
        int st = chunked_status(s.port, b, o);
        printf("# a 40 KiB chunk line: %d\n", st);
        ASSERT_TRUE(st == 400 || st == 413 || st == 431 || st == 500);
        free(b);
    }
    /* A valid body in 1-byte chunks is served; past the bound in 1-byte chunks, 413. */
    {
        const char *body = "{\"prompt\":\"hello world\",\"max_tokens\":2}";
        size_t cap = 64 + strlen(body) * 8, o = 0;
        char *b = malloc(cap);
        for (const char *p = body; *p; p++)
            o += (size_t)snprintf(b + o, cap - o, "1\r\n%c\r\n", *p);
        o += (size_t)snprintf(b + o, cap - o, "0\r\n\r\n");
        ASSERT_EQ_INT(chunked_status(s.port, b, o), 200);
        free(b);
    }
    /* 2,000,000 one-byte chunks (12 MB on the wire for a 2 MB body, the bound 64 KiB): 413.
     * After two rounds (the first connection threads' one-time costs), four more leave the
     * process (server and client) no bigger by what a body kept whole would take (2 MB
     * each). */
    size_t nc = 2000 * 1000, cap = nc * 6 + 16, o = 0;
    char *b = malloc(cap);
    ASSERT_NOT_NULL(b);
    for (size_t i = 0; i < nc; i++)
        memcpy(b + o, "1\r\n \r\n", 6), o += 6;
    o += (size_t)snprintf(b + o, cap - o, "0\r\n\r\n");
    for (int round = 0; round < 2; round++)
        ASSERT_EQ_INT(chunked_status(s.port, b, o), 413);
    long rss0 = rss_kib();
    for (int round = 0; round < 4; round++)
        ASSERT_EQ_INT(chunked_status(s.port, b, o), 413);
    long grown = rss_kib() - rss0;
    free(b);
    printf("# 4 x 2,000,000 one-byte chunks: 413 each, resident memory grew %ld KiB\n", grown);
    ASSERT_TRUE(grown < 2 * 1024);
    expect_serving(&s);
    srv_stop(&s);
}

/* --- Row 23: conflicting body headers. ---------------------------------------------------------
 */

#define RAW(lit) raw_status(s.port, lit, sizeof lit - 1)

static void test_row23_body_headers(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}"),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{} "),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: 2, 2\r\n\r\n{}"),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: abc\r\n\r\n{}"),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: -1\r\n\r\n{}"),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: 99999999999999999999999\r\n\r\n{}"),
                  413);
    /* Transfer-Encoding other than one "chunked". */
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Transfer-Encoding: gzip\r\n\r\nabc"),
                  400);
    ASSERT_EQ_INT(RAW("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
                  400);
    expect_serving(&s);
    srv_stop(&s);
}

/* --- Row 25: paths and methods. --------------------------------------------------------------- */

static void test_row25_routes(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    struct http_resp r;
    const char *unknown[] = {"/", "/v2/completions", "/v1/completions/x", "/health/", "/v1/model"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        http_do(s.port, "GET", unknown[i], NULL, &r);
        ASSERT_EQ_INT(r.status, 404);
        ASSERT_TRUE(strstr(r.body, "\"not_found\"") != NULL);
        http_resp_free(&r);
    }
    struct {
        const char *method, *path, *allow;
    } wrong[] = {
        {"GET", "/v1/completions", "POST"}, {"PUT", "/v1/chat/completions", "POST"},
        {"POST", "/health", "GET"},         {"DELETE", "/v1/models", "GET"},
        {"POST", "/v1/models/x", "GET"},    {"GET", "/tokenize", "POST"},
    };
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        http_do(s.port, wrong[i].method, wrong[i].path, NULL, &r);
        ASSERT_EQ_INT(r.status, 405);
        char allow[32];
        snprintf(allow, sizeof allow, "allow: %s", wrong[i].allow);
        ASSERT_TRUE(strcasestr(r.head, allow) != NULL);
        ASSERT_TRUE(strstr(r.body, "\"method_not_allowed\"") != NULL);
        http_resp_free(&r);
    }
    expect_serving(&s);
    srv_stop(&s);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_row19_body_limit),
    KVF_CASE(test_row20_slow_headers),
    KVF_CASE(test_row20_slow_body),
    KVF_CASE(test_row20_slow_reader),
    KVF_CASE(test_row20_per_ip_cap),
    KVF_CASE(test_row20_global_cap),
    KVF_CASE(test_row20_keyless_cannot_lock_out),
    KVF_CASE(test_row20_keyless_post_answered_401),
    KVF_CASE(test_row20_trusted_proxy),
    KVF_CASE(test_row21_headers),
    KVF_CASE(test_row22_chunked),
    KVF_CASE(test_row23_body_headers),
    KVF_CASE(test_row25_routes),
};

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    return KVF_TEST_MAIN(argc, argv, cases);
}
