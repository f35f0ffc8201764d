/*
 * test_fabric.c — the fabric's trust boundary on the shipped transport code: who may join, what
 * a stranger learns, and what becomes of bytes an attacker puts on an authenticated stream.
 *
 *   wrong key      a client with another key is refused: the listener never reports it to its
 *                  engine, the client hears "fabric authentication failed"
 *   stranger       a raw socket that says the greeting gets exactly the listener's greeting
 *                  (magic and 32 random bytes, different each time) and, after a wrong proof,
 *                  the end of the stream — not one byte more
 *   junk           the 16-byte packet that aborted UCX's listener, truncated and oversized
 *                  handshakes and 2,000 random packets: the listener stays up and a real peer
 *                  joins and exchanges frames right after
 *   flood          300 silent connections holding handshakes open: a real peer still joins at once
 *   tamper         a proxy between two real peers flips one byte of a sealed frame: the receiver
 *                  fails the connection and delivers no frame from that one on
 *   replay         the proxy sends a sealed frame's bytes twice: the copy is refused (and the
 *                  connection failed), never delivered
 *   forged write   a page write whose ciphertext was altered lands nothing in the region
 *   ciphers        a peer offering ChaCha20-Poly1305 only and one offering AES-256-GCM too agree
 *                  on ChaCha20-Poly1305 and exchange frames (ctest runs the file twice: as built,
 *                  and with KVF_TEST_FABRIC_CHACHA=1, so both ciphers carry every case)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include "kvf_test.h"
#include "kvfence/transport.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* One side: an xport, the frames it got (payloads kept), its connections' fates. */
#define MAX_FRAMES 64
struct side {
    kvf_xport_t *x;
    kvf_conn_t *accepted;
    int accepts, errors, frames;
    char frame[MAX_FRAMES][64];
    size_t frame_len[MAX_FRAMES];
    char last_error[160];
};

static void s_accept(void *ctx, kvf_conn_t *c)
{
    struct side *s = ctx;
    s->accepts++;
    s->accepted = c;
}
static void s_frame(void *ctx, kvf_conn_t *c, const uint8_t *buf, size_t len)
{
    (void)c;
    struct side *s = ctx;
    if (s->frames < MAX_FRAMES) {
        size_t n = len < sizeof(s->frame[0]) ? len : sizeof(s->frame[0]);
        memcpy(s->frame[s->frames], buf, n);
        s->frame_len[s->frames] = len;
    }
    s->frames++;
}
static void s_error(void *ctx, kvf_conn_t *c, int err)
{
    (void)err;
    struct side *s = ctx;
    s->errors++;
    snprintf(s->last_error, sizeof s->last_error, "%s", kvf_conn_error(c));
}

static const uint8_t key_a[KVF_FABRIC_KEY_BYTES] = "kvfence test cluster key alpha!";
static const uint8_t key_b[KVF_FABRIC_KEY_BYTES] = "kvfence test cluster key bravo!";

static void side_open(struct side *s, bool listen, const uint8_t *key, void *rma, size_t rma_bytes)
{
    char err[256] = "";
    memset(s, 0, sizeof(*s));
    struct kvf_xport_config xc = {
        listen ? "127.0.0.1" : NULL, 0, 100, rma, rma_bytes, key, NULL, NULL};
    struct kvf_xport_events ev = {s, s_accept, s_frame, NULL, s_error};
    if (kvf_xport_create(&xc, &ev, &s->x, err, sizeof(err)) < 0) KVF_FAIL("create: %s", err);
}

static void pump(struct side *a, struct side *b, uint64_t ms)
{
    uint64_t until = now_ms() + ms;
    do {
        if (a) kvf_xport_progress(a->x);
        if (b) kvf_xport_progress(b->x);
        usleep(200);
    } while (now_ms() < until);
}

/* Pumps until cond holds or ms pass; returns cond. */
#define PUMP_UNTIL(a, b, ms, cond)                                                                 \
    ({                                                                                             \
        uint64_t until_ = now_ms() + (ms);                                                         \
        while (!(cond) && now_ms() < until_)                                                       \
            pump((a), (b), 2);                                                                     \
        (cond);                                                                                    \
    })

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ASSERT_OK(connect(fd, (struct sockaddr *)&a, sizeof(a)));
    return fd;
}

/* Reads what arrives on fd while pumping s, until EOF or ms pass; returns the count (buf gets
 * up to cap bytes), or -1 if the stream did not end. */
static long raw_read_all(int fd, struct side *s, uint8_t *buf, size_t cap, uint64_t ms)
{
    size_t got = 0;
    uint64_t until = now_ms() + ms;
    while (now_ms() < until) {
        kvf_xport_progress(s->x);
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 2) <= 0) continue;
        uint8_t tmp[256];
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n <= 0) return (long)got;
        for (ssize_t i = 0; i < n && got < cap; i++)
            buf[got++] = tmp[i];
    }
    return -1;
}

/* A real client joins s and sends a frame; true when s got it. */
static bool real_peer_joins(struct side *srv, const uint8_t *key)
{
    struct side cl;
    char err[256] = "";
    side_open(&cl, false, key, NULL, 0);
    kvf_conn_t *c;
    if (kvf_xport_connect(cl.x, "127.0.0.1", kvf_xport_port(srv->x), &c, err, sizeof err) < 0)
        return false;
    int before = srv->frames;
    ASSERT_OK(kvf_conn_send(c, "ping", 4));
    bool ok = PUMP_UNTIL(srv, &cl, 5000, srv->frames > before);
    ok = ok && memcmp(srv->frame[(srv->frames - 1) % MAX_FRAMES], "ping", 4) == 0;
    kvf_conn_close(c);
    kvf_xport_destroy(cl.x);
    if (srv->accepted) {
        pump(srv, NULL, 20);
        kvf_conn_close(srv->accepted);
        srv->accepted = NULL;
    }
    return ok;
}

static void test_wrong_key_refused(void)
{
    struct side srv, cl;
    char err[256] = "";
    side_open(&srv, true, key_a, NULL, 0);
    side_open(&cl, false, key_b, NULL, 0);
    kvf_conn_t *c;
    ASSERT_OK(kvf_xport_connect(cl.x, "127.0.0.1", kvf_xport_port(srv.x), &c, err, sizeof err));
    ASSERT_OK(kvf_conn_send(c, "secret prompt", 13)); /* queued: must never leave */
    ASSERT_TRUE(PUMP_UNTIL(&srv, &cl, 5000, cl.errors > 0));
    pump(&srv, &cl, 100);
    ASSERT_EQ_INT(srv.accepts, 0);
    ASSERT_EQ_INT(srv.frames, 0);
    ASSERT_TRUE(strstr(cl.last_error, "fabric authentication failed") != NULL);
    kvf_conn_close(c);
    kvf_xport_destroy(cl.x);
    /* The same listener takes the right key. */
    ASSERT_TRUE(real_peer_joins(&srv, key_a));
    ASSERT_EQ_INT(srv.accepts, 1);
    kvf_xport_destroy(srv.x);
}

/* A listener with the right key refuses a client without it, and a client refuses a listener
 * without it: the client is told, and sends nothing after its proof. */
static void test_client_refuses_listener_without_key(void)
{
    struct side srv, cl;
    char err[256] = "";
    side_open(&srv, true, key_b, NULL, 0);
    side_open(&cl, false, key_a, NULL, 0);
    kvf_conn_t *c;
    ASSERT_OK(kvf_xport_connect(cl.x, "127.0.0.1", kvf_xport_port(srv.x), &c, err, sizeof err));
    ASSERT_OK(kvf_conn_send(c, "secret prompt", 13));
    ASSERT_TRUE(PUMP_UNTIL(&srv, &cl, 5000, cl.errors > 0));
    ASSERT_EQ_INT(srv.frames, 0);
    kvf_conn_close(c);
    kvf_xport_destroy(cl.x);
    kvf_xport_destroy(srv.x);
}

static void test_stranger_learns_only_the_greeting(void)
{
    struct side srv;
    side_open(&srv, true, key_a, NULL, 0);
    uint8_t first[64], got[256];
    for (int round = 0; round < 2; round++) {
        int fd = raw_connect(kvf_xport_port(srv.x));
        uint8_t hello[40] = "KVFFAB1C";
        for (int i = 8; i < 40; i++)
            hello[i] = (uint8_t)(i * 7 + round);
        ASSERT_TRUE(send(fd, hello, sizeof hello, 0) == (ssize_t)sizeof hello);
        /* The greeting arrives; then a wrong proof ends the stream. */
        uint64_t until = now_ms() + 3000;
        size_t n = 0;
        while (n < 40 && now_ms() < until) {
            kvf_xport_progress(srv.x);
            ssize_t k = recv(fd, got + n, sizeof got - n, MSG_DONTWAIT);
            if (k > 0) n += (size_t)k;
            usleep(500);
        }
        ASSERT_EQ_INT(n, 40);
        ASSERT_MEMEQ(got, "KVFFAB1", 7);
        ASSERT_TRUE(got[7] == 'A' || got[7] == 'C');
        uint8_t proof[32];
        memset(proof, 0x42, sizeof proof);
        ASSERT_TRUE(send(fd, proof, sizeof proof, 0) == (ssize_t)sizeof proof);
        long more = raw_read_all(fd, &srv, got + 40, sizeof got - 40, 3000);
        ASSERT_EQ_INT(more, 0); /* the end of the stream, not one byte more */
        close(fd);
        if (round == 0)
            memcpy(first, got, 40);
        else
            ASSERT_TRUE(memcmp(first + 8, got + 8, 32) != 0); /* a fresh nonce: nothing to learn */
    }
    ASSERT_EQ_INT(srv.accepts, 0);
    ASSERT_TRUE(real_peer_joins(&srv, key_a));
    kvf_xport_destroy(srv.x);
}

static void send_and_close(uint16_t port, const uint8_t *b, size_t n, struct side *s)
{
    int fd = raw_connect(port);
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    (void)w;
    kvf_xport_progress(s->x);
    close(fd);
}

static void test_junk_survived(void)
{
    struct side srv;
    side_open(&srv, true, key_a, NULL, 0);
    uint16_t port = kvf_xport_port(srv.x);
    /* The 16-byte packet: a length of 2^64-1, then zeros. */
    uint8_t p16[16];
    memset(p16, 0xff, 8);
    memset(p16 + 8, 0, 8);
    send_and_close(port, p16, sizeof p16, &srv);
    /* UCX's tcp interface magic with a huge length after it (what aborted UCX's listener). */
    uint8_t ucx[13] = {0x78, 0x56, 0x34, 0x12, 0xbe, 0xba, 0xfe, 0xca, 32, 0xff, 0xff, 0xff, 0x7f};
    send_and_close(port, ucx, sizeof ucx, &srv);
    /* Truncated and oversized handshakes. */
    uint8_t big[70000];
    memcpy(big, "KVFFAB1A", 8);
    for (size_t i = 8; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 131);
    for (size_t n = 1; n < 40; n += 7)
        send_and_close(port, big, n, &srv);
    send_and_close(port, big, 72, &srv);
    send_and_close(port, big, sizeof big, &srv);
    /* Random packets. */
    uint64_t r = 0x1234567;
    for (int i = 0; i < 2000; i++) {
        uint8_t b[512];
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        size_t n = 1 + r % sizeof b;
        for (size_t k = 0; k < n; k++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            b[k] = (uint8_t)r;
        }
        if (i % 3 == 0) memcpy(b, "KVFFAB1C", n < 8 ? n : 8);
        send_and_close(port, b, n, &srv);
    }
    pump(&srv, NULL, 200);
    ASSERT_EQ_INT(srv.accepts, 0);
    ASSERT_EQ_INT(srv.frames, 0);
    ASSERT_TRUE(real_peer_joins(&srv, key_a));
    kvf_xport_destroy(srv.x);
}

static void test_flood_of_silent_joins(void)
{
    struct side srv;
    side_open(&srv, true, key_a, NULL, 0);
    enum { N = 300 };
    static int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect(kvf_xport_port(srv.x));
        if (i % 16 == 0) kvf_xport_progress(srv.x);
    }
    pump(&srv, NULL, 100);
    uint64_t t0 = now_ms();
    ASSERT_TRUE(real_peer_joins(&srv, key_a));
    uint64_t took = now_ms() - t0;
    printf("# a real peer joined in %llu ms beside %d silent connections\n",
           (unsigned long long)took, N);
    ASSERT_TRUE(took < 2000);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    kvf_xport_destroy(srv.x);
}

/* --- A proxy between two real peers that alters the client's stream once. ------------------ */

struct proxy {
    int lfd;
    uint16_t port, target;
    size_t at;                /* client→server byte offset to alter */
    size_t dup_from, dup_len; /* replay: these bytes again, right after them */
    bool flip;
    pthread_t th;
};

static void *proxy_main(void *arg)
{
    struct proxy *p = arg;
    int a = accept(p->lfd, NULL, NULL);
    int b = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in s = {.sin_family = AF_INET,
                            .sin_port = htons(p->target),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (a < 0 || connect(b, (struct sockaddr *)&s, sizeof s) < 0) return NULL;
    static uint8_t seen[1 << 16];
    size_t off = 0;
    for (;;) {
        struct pollfd f[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
        if (poll(f, 2, 3000) <= 0) break;
        uint8_t buf[4096];
        if (f[0].revents) {
            ssize_t n = recv(a, buf, sizeof buf, 0);
            if (n <= 0) break;
            for (ssize_t i = 0; i < n; i++) {
                if (p->flip && off + (size_t)i == p->at) buf[i] ^= 0x01;
                if (off + (size_t)i < sizeof seen) seen[off + (size_t)i] = buf[i];
            }
            size_t end = off + (size_t)n, cut = (size_t)n;
            size_t dup_end = p->dup_from + p->dup_len;
            if (p->dup_len && off < dup_end && end >= dup_end) cut = dup_end - off;
            if (send(b, buf, cut, MSG_NOSIGNAL) < 0) break;
            if (cut < (size_t)n || (p->dup_len && end == dup_end)) {
                /* The replay, right behind the message it copies. */
                if (send(b, seen + p->dup_from, p->dup_len, MSG_NOSIGNAL) < 0) break;
                p->dup_len = 0;
                if (cut < (size_t)n && send(b, buf + cut, (size_t)n - cut, MSG_NOSIGNAL) < 0) break;
            }
            off = end;
        }
        if (f[1].revents) {
            ssize_t n = recv(b, buf, sizeof buf, 0);
            if (n <= 0 || send(a, buf, (size_t)n, MSG_NOSIGNAL) < 0) break;
        }
    }
    close(a);
    close(b);
    return NULL;
}

static void proxy_start(struct proxy *p, uint16_t target)
{
    p->target = target;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in s = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof s;
    ASSERT_OK(bind(p->lfd, (struct sockaddr *)&s, sizeof s));
    ASSERT_OK(listen(p->lfd, 4));
    ASSERT_OK(getsockname(p->lfd, (struct sockaddr *)&s, &l));
    p->port = ntohs(s.sin_port);
    ASSERT_OK(pthread_create(&p->th, NULL, proxy_main, p));
}

/* The client's stream: 40 + 32 handshake bytes, then sealed messages of 16 + len + 16 bytes.
 * Frames of 20 bytes: message k (from 0) starts at 72 + 52k. */
#define HS_BYTES  72u
#define FRAME_MSG 52u

static void run_altered(struct proxy *p, int *frames_out, int *errors_out, char frames[][64])
{
    struct side srv, cl;
    char err[256] = "";
    side_open(&srv, true, key_a, NULL, 0);
    side_open(&cl, false, key_a, NULL, 0);
    proxy_start(p, kvf_xport_port(srv.x));
    kvf_conn_t *c;
    ASSERT_OK(kvf_xport_connect(cl.x, "127.0.0.1", p->port, &c, err, sizeof err));
    for (int i = 0; i < 8; i++) {
        char f[21];
        snprintf(f, sizeof f, "frame %02d of eight..", i);
        ASSERT_OK(kvf_conn_send(c, f, 20));
    }
    PUMP_UNTIL(&srv, &cl, 3000, srv.errors > 0 || srv.frames == 8);
    pump(&srv, &cl, 200);
    *frames_out = srv.frames;
    *errors_out = srv.errors;
    for (int i = 0; i < srv.frames && i < 8; i++)
        memcpy(frames[i], srv.frame[i], 64);
    kvf_conn_close(c);
    if (srv.accepted) kvf_conn_close(srv.accepted);
    kvf_xport_destroy(cl.x);
    kvf_xport_destroy(srv.x);
    shutdown(p->lfd, SHUT_RDWR);
    pthread_join(p->th, NULL);
    close(p->lfd);
}

static void test_clean_proxy_delivers_all(void)
{
    struct proxy p = {0};
    int frames, errors;
    char got[8][64];
    run_altered(&p, &frames, &errors, got);
    ASSERT_EQ_INT(frames, 8); /* the harness alone changes nothing */
    ASSERT_EQ_INT(errors, 0);
    ASSERT_MEMEQ(got[7], "frame 07 of eight..", 19);
}

static void test_tampered_frame_fails_connection(void)
{
    struct proxy p = {.flip = true, .at = HS_BYTES + 3 * FRAME_MSG + 16 + 5}; /* frame 3's text */
    int frames, errors;
    char got[8][64];
    run_altered(&p, &frames, &errors, got);
    ASSERT_EQ_INT(frames, 3); /* frames 0..2 only: the altered one and all after are refused */
    ASSERT_EQ_INT(errors, 1);
    ASSERT_MEMEQ(got[2], "frame 02 of eight..", 19);
}

static void test_replayed_frame_refused(void)
{
    struct proxy p = {.dup_from = HS_BYTES + 2 * FRAME_MSG,
                      .dup_len = FRAME_MSG}; /* frame 2 again */
    int frames, errors;
    char got[8][64];
    run_altered(&p, &frames, &errors, got);
    ASSERT_EQ_INT(frames, 3); /* 0, 1, 2 — the copy is never delivered */
    ASSERT_EQ_INT(errors, 1);
    ASSERT_MEMEQ(got[2], "frame 02 of eight..", 19);
}

/* A page write altered on the wire lands nothing: the region keeps its bytes. */
static void test_altered_write_lands_nothing(void)
{
    static uint8_t region[4096];
    memset(region, 0x5a, sizeof region);
    struct side srv, cl;
    char err[256] = "";
    side_open(&srv, true, key_a, region, sizeof region);
    side_open(&cl, false, key_a, NULL, 0);
    /* The server sends REGION first; the client's first message is the write: byte 72 + 16 + 100
     * is inside its ciphertext. */
    struct proxy p = {.flip = true, .at = HS_BYTES + 16 + 100};
    proxy_start(&p, kvf_xport_port(srv.x));
    kvf_conn_t *c;
    ASSERT_OK(kvf_xport_connect(cl.x, "127.0.0.1", p.port, &c, err, sizeof err));
    ASSERT_TRUE(PUMP_UNTIL(&srv, &cl, 3000, kvf_conn_remote_ready(c)));
    static uint8_t src[1024];
    memset(src, 0xab, sizeof src);
    ASSERT_OK(kvf_conn_put(c, src, sizeof src, 512, NULL, NULL));
    PUMP_UNTIL(&srv, &cl, 3000, srv.errors > 0);
    ASSERT_EQ_INT(srv.errors, 1);
    for (size_t i = 0; i < sizeof region; i++)
        ASSERT_EQ_INT(region[i], 0x5a);
    kvf_conn_close(c);
    if (srv.accepted) kvf_conn_close(srv.accepted);
    kvf_xport_destroy(cl.x);
    kvf_xport_destroy(srv.x);
    shutdown(p.lfd, SHUT_RDWR);
    pthread_join(p.th, NULL);
    close(p.lfd);
}

static void test_mixed_ciphers(void)
{
    const char *was = getenv("KVF_TEST_FABRIC_CHACHA");
    char saved[8] = "";
    if (was) snprintf(saved, sizeof saved, "%s", was);
    unsetenv("KVF_TEST_FABRIC_CHACHA");
    struct side srv;
    side_open(&srv, true, key_a, NULL, 0); /* offers AES-256-GCM where the CPU has it */
    setenv("KVF_TEST_FABRIC_CHACHA", "1", 1);
    ASSERT_TRUE(real_peer_joins(&srv, key_a)); /* the client offers ChaCha20-Poly1305 only */
    if (was)
        setenv("KVF_TEST_FABRIC_CHACHA", saved, 1);
    else
        unsetenv("KVF_TEST_FABRIC_CHACHA");
    ASSERT_TRUE(real_peer_joins(&srv, key_a));
    kvf_xport_destroy(srv.x);
}

static void test_key_derivation(void)
{
    uint8_t k1[KVF_FABRIC_KEY_BYTES], k2[KVF_FABRIC_KEY_BYTES];
    const char *s = "0123456789abcdef0123456789abcdef";
    ASSERT_ERR(kvf_fabric_key_derive(s, 31, k1), -EINVAL);
    ASSERT_OK(kvf_fabric_key_derive(s, 32, k1));
    ASSERT_OK(kvf_fabric_key_derive("0123456789abcdef0123456789abcdeF", 32, k2));
    ASSERT_TRUE(memcmp(k1, k2, sizeof k1) != 0);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_wrong_key_refused),
    KVF_CASE(test_client_refuses_listener_without_key),
    KVF_CASE(test_stranger_learns_only_the_greeting),
    KVF_CASE(test_junk_survived),
    KVF_CASE(test_flood_of_silent_joins),
    KVF_CASE(test_clean_proxy_delivers_all),
    KVF_CASE(test_tampered_frame_fails_connection),
    KVF_CASE(test_replayed_frame_refused),
    KVF_CASE(test_altered_write_lands_nothing),
    KVF_CASE(test_mixed_ciphers),
    KVF_CASE(test_key_derivation),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
