/*
 * server_test_util.h — what the server tests share: a small vocabulary (specials, the 256 byte
 * tokens, a few word pieces) built with the GGUF writer, a server over the fake engine, and a
 * raw-socket HTTP/1.1 client (so malformed requests can be sent too) with a timeout on every
 * read.
 */
#ifndef KVF_SERVER_TEST_UTIL_H
#define KVF_SERVER_TEST_UTIL_H

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fake_engine.h"
#include "kvf_test.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/server.h"
#include "kvfence/text.h"

#define SP "\xe2\x96\x81"

/* <unk>=0, <s>=1, </s>=2, <0x00>..<0xFF> = 3..258, then these pieces. */
static const char *const test_pieces[] = {SP "hello", SP "world", SP "the", "ab", "lo", SP};

static inline kvf_tokenizer_t *test_tokenizer(void)
{
    size_t n_pieces = sizeof test_pieces / sizeof test_pieces[0];
    size_t n = 3 + 256 + n_pieces;
    const char **toks = calloc(n, sizeof *toks);
    char(*bytes)[8] = calloc(256, 8);
    float *scores = calloc(n, sizeof *scores);
    int32_t *types = calloc(n, sizeof *types);
    ASSERT_TRUE(toks && bytes && scores && types);
    size_t i = 0;
    toks[i] = "<unk>", types[i++] = KVF_TOKEN_UNKNOWN;
    toks[i] = "<s>", types[i++] = KVF_TOKEN_CONTROL;
    toks[i] = "</s>", types[i++] = KVF_TOKEN_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], 8, "<0x%02X>", b);
        toks[i] = bytes[b], types[i++] = KVF_TOKEN_BYTE;
    }
    for (size_t k = 0; k < n_pieces; k++) {
        scores[i] = (float)strlen(test_pieces[k]);
        toks[i] = test_pieces[k], types[i++] = KVF_TOKEN_NORMAL;
    }
    kvf_gguf_writer_t *w;
    ASSERT_OK(kvf_gguf_writer_create(0, &w));
    ASSERT_OK(kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", 5));
    ASSERT_OK(kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, n));
    ASSERT_OK(kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, n));
    ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, n));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    char path[256], err[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvf_srv_vocab_%d.gguf", tmp && tmp[0] ? tmp : "/tmp",
             (int)getpid());
    ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
    kvf_gguf_writer_destroy(w);
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    kvf_tokenizer_t *t;
    ASSERT_OK(kvf_tokenizer_create(g, &t, err, sizeof err));
    kvf_gguf_close(g);
    unlink(path);
    free(toks);
    free(bytes);
    free(scores);
    free(types);
    return t;
}

/* The byte token of b. */
static inline int32_t byte_tok(unsigned char b)
{
    return 3 + b;
}

/* An independent strict UTF-8 check (not the server's). */
static inline bool utf8_ok(const char *p, size_t n)
{
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], len = c < 0x80         ? 1
                                 : (c >> 5) == 6  ? 2
                                 : (c >> 4) == 14 ? 3
                                 : (c >> 3) == 30 ? 4
                                                  : 0;
        if (!len || i + len > n) return false;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (unsigned k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

/* --- A server over the fake engine. --------------------------------------------------------- */
struct srv {
    struct fake_engine f;
    kvf_tokenizer_t *tok;
    kvf_server_t *s;
    uint16_t port;
    struct kvf_server_config cfg;
};

/* Fills defaults; the test may change s->f and s->cfg before srv_start. */
static inline void srv_init(struct srv *s)
{
    memset(s, 0, sizeof *s);
    s->tok = test_tokenizer();
    fake_init(&s->f, kvf_tokenizer_n_vocab(s->tok), 512);
    s->cfg.host = "127.0.0.1";
    s->cfg.model_name = "test-model";
    s->cfg.max_body_bytes = 64 * 1024;
    s->cfg.max_n = 4;
}

static inline void srv_start(struct srv *s)
{
    char err[256];
    int rc = kvf_server_start(&s->cfg, &fake_ops, &s->f, s->tok, &s->s, err, sizeof err);
    if (rc < 0) KVF_FAIL("kvf_server_start: %d %s", rc, err);
    s->port = kvf_server_port(s->s);
    ASSERT_TRUE(s->port != 0);
}

/* Stops the server and checks the clean shutdown: every handle released. */
static inline void srv_stop(struct srv *s)
{
    kvf_server_stop(s->s);
    s->s = NULL;
    ASSERT_EQ_INT(fake_live(&s->f), 0);
    ASSERT_EQ_INT(s->f.releases, s->f.submits);
    kvf_tokenizer_destroy(s->tok);
    fake_destroy(&s->f);
}

/* --- The HTTP client. ------------------------------------------------------------------------ */
struct http_resp {
    int status;
    char head[16384]; /* status line and headers */
    char *body;       /* de-chunked, NUL-terminated */
    size_t body_len;
};

static inline void http_resp_free(struct http_resp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

static inline int http_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ_INT(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static inline void http_send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0) return; /* the server may close early (413, 400): the test reads the reply */
        c += k;
        n -= (size_t)k;
    }
}

/* Reads until the server closes (every test request says Connection: close), at most
 * timeout_ms in all. Returns the bytes read (malloc'd, NUL-terminated). */
static inline char *http_read_all(int fd, size_t *len, int timeout_ms)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    ASSERT_NOT_NULL(buf);
    int64_t deadline = fake_now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - fake_now_ms();
        if (left <= 0) KVF_FAIL("HTTP read timed out after %d ms (%zu bytes)", timeout_ms, n);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0) continue;
        if (n + 4096 + 1 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            ASSERT_NOT_NULL(buf);
        }
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Parses a whole response (raw[0..n)): status, headers, body (de-chunked). */
static inline void http_parse(const char *raw, size_t n, struct http_resp *r)
{
    memset(r, 0, sizeof *r);
    const char *eoh = strstr(raw, "\r\n\r\n");
    if (!eoh) KVF_FAIL("no complete response header in %zu bytes: %.200s", n, raw);
    size_t hl = (size_t)(eoh - raw);
    if (hl >= sizeof r->head) hl = sizeof r->head - 1;
    memcpy(r->head, raw, hl);
    r->head[hl] = 0;
    ASSERT_EQ_INT(sscanf(raw, "HTTP/1.%*d %d", &r->status), 1);
    const char *b = eoh + 4;
    size_t bl = n - (size_t)(b - raw);
    r->body = malloc(bl + 1);
    ASSERT_NOT_NULL(r->body);
    if (strcasestr(r->head, "transfer-encoding: chunked")) {
        size_t o = 0;
        for (;;) {
            char *end;
            unsigned long sz = strtoul(b, &end, 16);
            if (end == b) break;
            const char *data = strstr(end, "\r\n");
            if (!data || sz == 0) break;
            data += 2;
            if ((size_t)(data - raw) + sz > n) KVF_FAIL("truncated chunk");
            memcpy(r->body + o, data, sz);
            o += sz;
            b = data + sz + 2;
        }
        r->body_len = o;
    } else {
        memcpy(r->body, b, bl);
        r->body_len = bl;
    }
    r->body[r->body_len] = 0;
}

/* One request with Connection: close; body may be NULL. */
static inline void http_do(uint16_t port, const char *method, const char *path, const char *body,
                           struct http_resp *r)
{
    int fd = http_connect(port);
    char head[1024];
    size_t bl = body ? strlen(body) : 0;
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, bl);
    http_send_all(fd, head, (size_t)hn);
    if (bl) http_send_all(fd, body, bl);
    size_t n;
    char *raw = http_read_all(fd, &n, 10000);
    close(fd);
    http_parse(raw, n, r);
    free(raw);
}

/* Sends raw bytes as they are and parses the reply. */
static inline void http_raw(uint16_t port, const char *req, size_t len, struct http_resp *r)
{
    int fd = http_connect(port);
    http_send_all(fd, req, len);
    size_t n;
    char *raw = http_read_all(fd, &n, 10000);
    close(fd);
    http_parse(raw, n, r);
    free(raw);
}

/* POST path body, expecting `status`; returns the parsed JSON body. */
static inline json_t *post_json(uint16_t port, const char *path, const char *body, int status)
{
    struct http_resp r;
    http_do(port, "POST", path, body, &r);
    if (r.status != status)
        KVF_FAIL("POST %s: status %d, wanted %d; body %.300s", path, r.status, status, r.body);
    json_error_t je;
    json_t *j = json_loadb(r.body, r.body_len, 0, &je);
    if (!j) KVF_FAIL("POST %s: body is not JSON (%s): %.300s", path, je.text, r.body);
    http_resp_free(&r);
    return j;
}

/* The "data: " payloads of an SSE body, in order (a JSON array of strings). */
static inline json_t *sse_events(const char *body)
{
    json_t *a = json_array();
    const char *p = body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) KVF_FAIL("SSE event without its blank line");
        json_array_append_new(a, json_stringn(p, (size_t)(e - p)));
        p = e + 2;
    }
    return a;
}

#endif
