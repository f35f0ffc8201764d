/*
 * tcp.c — the fabric: kvfence's own authenticated, encrypted message stream over kernel TCP.
 * See kvfence/transport.h for the contract and docs/SECURITY.md for the threat model.
 *
 * One connection is one TCP socket. Before anything else is said, both sides prove they hold the
 * cluster key (a challenge–response over fresh nonces from both sides); a peer that cannot prove
 * it gets only the listener's greeting (a magic string and a random nonce) and is closed, and it
 * never becomes a connection the engine sees. Everything after the proofs travels as sealed
 * messages (AES-256-GCM or ChaCha20-Poly1305, a key per direction derived from the two
 * greetings, the message's sequence number as the nonce), so a message that was forged, altered,
 * replayed, reordered or dropped fails its tag and fails the connection.
 *
 * The handshake (K: the cluster key; Nc, Ns: 32 random bytes each; MAC: HMAC-SHA-256 under K):
 *
 *   client                                                   server (listener)
 *     ── Gc = MAGIC ‖ cc ‖ Nc ────────────────────────────▶   S_WAIT_HELLO
 *   C_WAIT_HELLO  ◀────────────────────────── Gs = MAGIC ‖ cs ‖ Ns ──
 *     ── MAC("client" ‖ Gc ‖ Gs) ─────────────────────────▶   S_WAIT_PROOF: wrong → closed, silent
 *   C_WAIT_PROOF  ◀────────────────────── MAC("server" ‖ Gc ‖ Gs) ──  OPEN (on_accept)
 *   OPEN (a wrong proof: the connection fails, "authentication")
 *
 * The client proves first, so a stranger that connects learns nothing but the server's greeting
 * (the magic, a cipher byte, a random nonce); a stranger that listens (a client dialled the
 * wrong address) learns the client's proof for nonces it cannot reuse. The proofs cover both
 * greetings whole, so the cipher bytes cannot be altered unseen. Both sides then derive k_c2s and
 * k_s2c = MAC(label ‖ Gc ‖ Gs). The cipher: AES-256-GCM when both greetings say CIPHER_AES
 * (1.2 GB/s against ChaCha20-Poly1305's 0.67 on the 2-core machine), else ChaCha20-Poly1305.
 *
 * A sealed message on the wire: a 16-byte header (kind, length, argument; authenticated, not
 * encrypted), the payload encrypted, and a 16-byte tag:
 *
 *   kind u8 | 0 u8 ×3 | len u32 | arg u64 | payload[len] | tag[16]        (little-endian)
 *
 * Kinds: FRAME (a control frame for the engine), WRITE (page bytes for the receiver's registered
 * region at offset arg), FLUSH_REQ / FLUSH_ACK (arg: the flush's id), REGION (arg: the size of
 * the sender's registered region; sent first by a side that registered one). A receiver applies
 * WRITEs in arrival order, which is sending order, and answers a FLUSH_REQ after every earlier
 * message was applied: the ack is the drain proof. A WRITE is applied whole, after its tag
 * verified, into the registered region only.
 *
 * The fence is close(2): once a connection is closed nothing more is read from its socket, so
 * nothing of that peer is applied, whatever it still sends (docs/PROTOCOL.md, "Fences").
 *
 * Work bounds: progress handles at most 64 ready sockets and reads at most RX_BUDGET bytes per
 * socket per call; connection lookup is a list walk (a worker has a handful); listener-side
 * handshakes are bounded (MAX_PENDING; the oldest is dropped to admit a new one) and each must
 * finish within HS_TIMEOUT_MS.
 */
#include "kvfence/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAGIC         "KVFFAB1" /* and one byte: the ciphers the sender can run (CIPHER_*) */
#define MAGIC_LEN     8u
#define CIPHER_AES    'A' /* AES-256-GCM (the CPU has AES-NI and CLMUL) and ChaCha20-Poly1305 */
#define CIPHER_CHACHA 'C' /* ChaCha20-Poly1305 only */
#define NONCE_LEN     32u
#define HELLO_LEN     (MAGIC_LEN + NONCE_LEN)
#define PROOF_LEN     32u
#define HDR_LEN       16u
#define TAG_LEN       16u
#define MAX_PENDING   64u        /* listener-side handshakes at once */
#define HS_TIMEOUT_MS 5000u      /* a handshake not finished by then is dropped */
#define RX_BUDGET     (8u << 20) /* bytes read from one socket per progress call */
#define RX_INITIAL    (256u << 10)

enum msg_kind {
    MSG_FRAME = 1,
    MSG_WRITE = 2,
    MSG_FLUSH_REQ = 3,
    MSG_FLUSH_ACK = 4,
    MSG_REGION = 5
};

/* A connection's lifecycle. The engine sees a connection from tcp_connect (client) or
 * from on_accept (server, once authenticated); a listener-side connection that fails before
 * OPEN is freed without the engine hearing of it. */
enum conn_state {
    C_CONNECTING,
    C_WAIT_HELLO,
    C_WAIT_PROOF,
    S_WAIT_HELLO,
    S_WAIT_PROOF,
    OPEN,
    DEAD
};

/* One outbound message, queued in sending order. Its payload is sealed into `wire` only when it
 * reaches the head of the queue of an OPEN connection, so sequence numbers follow wire order. */
struct msg {
    uint8_t kind;
    uint64_t arg;
    const uint8_t *src; /* the payload: the caller's (WRITE, until done) or `own` */
    size_t len;
    uint8_t *own;
    uint8_t *wire; /* header ‖ ciphertext ‖ tag, once sealed */
    size_t wire_len, wire_off;
    kvf_xport_done_fn done; /* WRITE: local completion (handed to the kernel) */
    void *done_arg;
    kvf_conn_t *c;     /* delayed messages (fault hooks): whose */
    uint64_t due_ms;   /* delayed messages */
    uint64_t flush_id; /* a delayed flush: posted as a FLUSH_REQ with this record */
    bool is_flush;     /* a delayed or parked flush record (not sent itself) */
    struct msg *next;
};

struct kvf_conn {
    struct kvf_conn_head head; /* the seam's: ops, user */
    kvf_xport_t *x;
    int fd;
    enum conn_state state;
    bool visible; /* the engine knows c (connect, or on_accept ran) */
    bool failed, closing, zombie;
    int holds; /* callbacks running with c on the stack: free is deferred */
    char error[160];
    uint64_t deadline_ms;                 /* the handshake's */
    uint8_t gc[HELLO_LEN], gs[HELLO_LEN]; /* the two greetings: magic, cipher byte, nonce */
    bool aes;                             /* the session's cipher: AES-256-GCM, else ChaCha */
    uint8_t k_tx[32], k_rx[32];
    uint64_t seq_tx, seq_rx;
    uint8_t hs_out[HELLO_LEN + PROOF_LEN]; /* handshake bytes still to send */
    size_t hs_len, hs_off;
    struct msg *q_head, *q_tail; /* outbound, in order */
    uint8_t *tb;                 /* the head message's sealed bytes (only the head is sealed) */
    size_t tb_cap;
    bool want_out; /* EPOLLOUT registered */
    uint8_t *rb;   /* inbound bytes: [rb_off, rb_len) not yet consumed */
    size_t rb_cap, rb_len, rb_off;
    size_t remote_bytes; /* the peer's region, from its REGION message */
    struct msg *flushes; /* flush records awaiting their FLUSH_ACK */
    uint64_t next_flush_id;
    kvf_conn_t *prev, *next;
};

struct kvf_xport {
    struct kvf_xport_head head; /* the seam's: ops */
    int ep;                     /* epoll: the listener and every socket */
    int lfd;                    /* the listener, or -1 */
    uint16_t port;
    uint8_t key[32];
    char cipher; /* CIPHER_AES or CIPHER_CHACHA: what this process offers */
    uint32_t keepalive_ms;
    void *rma_base;
    size_t rma_bytes;
    struct kvf_xport_events ev;
    kvf_conn_t *conns;
    uint32_t pending; /* listener-side connections not yet OPEN */
    struct msg *delayed;
    struct kvf_xport_faults faults;
    uint64_t rng;
    bool destroying;
};

static void tcp_destroy(kvf_xport_t *x);
static void tcp_conn_close(kvf_conn_t *c);
static int tcp_conn_flush(kvf_conn_t *c, kvf_xport_done_fn done, void *arg);

static const uint8_t public_key[32]; /* no cluster key: everyone can prove this one */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_le32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* MAC(label ‖ Gc ‖ Gs) under the cluster key: a proof, or a direction's session key. */
static void derive(const kvf_xport_t *x, const char *label, const kvf_conn_t *c, uint8_t out[32])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, x->key, sizeof(x->key));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)"kvfence fabric v1 ", 18);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, strlen(label));
    crypto_auth_hmacsha256_update(&st, c->gc, HELLO_LEN);
    crypto_auth_hmacsha256_update(&st, c->gs, HELLO_LEN);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof(st));
}

/* Both ciphers take a 96-bit nonce: the message's number, unique per direction's key. */
static void aead_nonce(uint64_t seq, uint8_t n[crypto_aead_aes256gcm_NPUBBYTES])
{
    memset(n, 0, crypto_aead_aes256gcm_NPUBBYTES);
    put_le64(n + 4, seq);
}

/* --- Connections: hold, fail, free. -------------------------------------------------------- */

static void conn_free(kvf_conn_t *c);
static void conn_arm(kvf_conn_t *c);
static void finish_queued(kvf_conn_t *c, int status);

static void conn_hold(kvf_conn_t *c)
{
    c->holds++;
}

/* Drops a hold; frees c if it was closed while held. Returns false if c is gone. */
static bool conn_release(kvf_conn_t *c)
{
    c->holds--;
    if (c->zombie && c->holds == 0) {
        conn_free(c);
        return false;
    }
    return !c->zombie;
}

static void conn_unlink(kvf_conn_t *c)
{
    kvf_xport_t *x = c->x;
    if (c->prev)
        c->prev->next = c->next;
    else if (x->conns == c)
        x->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static void close_fd(kvf_conn_t *c)
{
    if (c->fd < 0) return;
    epoll_ctl(c->x->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->state != OPEN && !c->visible && c->x->pending) c->x->pending--;
    c->state = DEAD;
}

/* The connection failed (peer gone, a bad proof or tag, a protocol violation): its socket
 * closes at once (the fence), its queued operations end with an error, and the engine hears of
 * it once. A listener-side connection the engine never saw is simply freed. */
static void conn_fail(kvf_conn_t *c, const char *fmt, const char *detail)
{
    if (c->failed || c->zombie) return;
    c->failed = true;
    snprintf(c->error, sizeof(c->error), fmt, detail ? detail : "");
    close_fd(c);
    conn_hold(c);
    finish_queued(c, -ENOTCONN);
    if (c->visible && !c->closing && c->x->ev.on_error)
        c->x->ev.on_error(c->x->ev.ctx, c, KVF_E_TRANSPORT);
    c->holds--;
    if (!c->visible) c->zombie = true; /* the engine never saw it: nobody else will free it */
    if (c->zombie && c->holds == 0) conn_free(c);
}

static void msg_free(struct msg *m)
{
    free(m->own); /* m->wire is the connection's buffer */
    free(m);
}

/* Ends every queued message (puts get status), every delayed one of c, every flush awaiting
 * an ack. Callbacks may touch c (the caller holds it). */
static void finish_queued(kvf_conn_t *c, int status)
{
    kvf_xport_t *x = c->x;
    struct msg *done = NULL, **tail = &done;
    for (struct msg **pp = &x->delayed; *pp;) {
        struct msg *m = *pp;
        if (m->c == c) {
            *pp = m->next;
            m->next = NULL;
            *tail = m;
            tail = &m->next;
        } else {
            pp = &m->next;
        }
    }
    *tail = c->q_head;
    c->q_head = c->q_tail = NULL;
    while (*tail)
        tail = &(*tail)->next;
    *tail = c->flushes;
    c->flushes = NULL;
    while (done) {
        struct msg *m = done;
        done = m->next;
        if (m->done) m->done(m->done_arg, status);
        msg_free(m);
    }
}

static void conn_free(kvf_conn_t *c)
{
    close_fd(c);
    conn_unlink(c);
    free(c->rb);
    free(c->tb);
    sodium_memzero(c->k_tx, sizeof(c->k_tx));
    sodium_memzero(c->k_rx, sizeof(c->k_rx));
    free(c);
}

static kvf_conn_t *conn_new(kvf_xport_t *x, int fd, enum conn_state st)
{
    kvf_conn_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->head.ops = &kvf_tcp_transport;
    c->x = x;
    c->fd = fd;
    c->state = st;
    c->deadline_ms = now_ms() + HS_TIMEOUT_MS;
    c->next = x->conns;
    if (x->conns) x->conns->prev = c;
    x->conns = c;
    struct epoll_event e = {.events = EPOLLIN | (st == C_CONNECTING ? EPOLLOUT : 0), .data.ptr = c};
    c->want_out = st == C_CONNECTING;
    if (epoll_ctl(x->ep, EPOLL_CTL_ADD, fd, &e) < 0) {
        conn_unlink(c);
        free(c);
        return NULL;
    }
    return c;
}

static void tune_socket(int fd, uint32_t keepalive_ms)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* A peer that vanished without a reset (host down, cable cut) is noticed by keepalive within
     * about three intervals; a live peer that merely stops reading is not failed by it. */
    int secs = (int)((keepalive_ms + 999) / 1000);
    if (secs < 1) secs = 1;
    int cnt = 3, user_ms = 5000 > 30 * (int)keepalive_ms ? 5000 : 30 * (int)keepalive_ms;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &secs, sizeof(secs));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &secs, sizeof(secs));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms));
}

/* --- Output. ------------------------------------------------------------------------------- */

static void conn_arm(kvf_conn_t *c)
{
    if (c->fd < 0) return;
    bool want =
        c->state == C_CONNECTING || c->hs_off < c->hs_len || (c->q_head && c->state == OPEN);
    if (want == c->want_out) return;
    struct epoll_event e = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(c->x->ep, EPOLL_CTL_MOD, c->fd, &e) == 0) c->want_out = want;
}

static int seal(kvf_conn_t *c, struct msg *m)
{
    size_t need = HDR_LEN + m->len + TAG_LEN;
    if (need > c->tb_cap) {
        uint8_t *nb = realloc(c->tb, need);
        if (!nb) return -ENOMEM;
        c->tb = nb;
        c->tb_cap = need;
    }
    m->wire = c->tb;
    m->wire_len = need;
    uint8_t *h = m->wire;
    memset(h, 0, HDR_LEN);
    h[0] = m->kind;
    put_le32(h + 4, (uint32_t)m->len);
    put_le64(h + 8, m->arg);
    uint8_t n[crypto_aead_aes256gcm_NPUBBYTES];
    aead_nonce(c->seq_tx++, n);
    if (c->aes)
        crypto_aead_aes256gcm_encrypt_detached(h + HDR_LEN, h + HDR_LEN + m->len, NULL, m->src,
                                               m->len, h, HDR_LEN, NULL, n, c->k_tx);
    else
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(
            h + HDR_LEN, h + HDR_LEN + m->len, NULL, m->src, m->len, h, HDR_LEN, NULL, n, c->k_tx);
    free(m->own); /* the plaintext is no longer needed */
    m->own = NULL;
    m->src = NULL;
    return 0;
}

/* Writes what the socket takes: handshake bytes first, then queued messages (sealed as they
 * reach the head). A put's callback runs once its bytes are in the kernel. */
static void conn_write(kvf_conn_t *c)
{
    if (c->state == C_CONNECTING) return; /* the socket is not connected yet */
    while (c->fd >= 0 && c->hs_off < c->hs_len) {
        ssize_t n = send(c->fd, c->hs_out + c->hs_off, c->hs_len - c->hs_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) break;
            conn_fail(c, "connection failed: %s", strerror(errno));
            return;
        }
        c->hs_off += (size_t)n;
    }
    while (c->fd >= 0 && c->state == OPEN && c->hs_off == c->hs_len && c->q_head) {
        struct msg *m = c->q_head;
        if (!m->wire && seal(c, m) < 0) {
            conn_fail(c, "connection failed: %s", "out of memory sealing a message");
            return;
        }
        ssize_t n = send(c->fd, m->wire + m->wire_off, m->wire_len - m->wire_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) break;
            conn_fail(c, "connection failed: %s", strerror(errno));
            return;
        }
        m->wire_off += (size_t)n;
        if (m->wire_off < m->wire_len) break;
        c->q_head = m->next;
        if (!c->q_head) c->q_tail = NULL;
        if (m->kind == MSG_WRITE) {
            int status = 0;
#if defined(KVF_TEST_BUILD)
            status = c->x->faults.fail_put_status;
#endif
            if (m->done) {
                conn_hold(c);
                m->done(m->done_arg, status);
                msg_free(m);
                if (!conn_release(c)) return;
                continue;
            }
        }
        msg_free(m);
    }
    conn_arm(c);
}

static void enqueue(kvf_conn_t *c, struct msg *m)
{
    m->next = NULL;
    if (c->q_tail)
        c->q_tail->next = m;
    else
        c->q_head = m;
    c->q_tail = m;
}

/* A message for c: copied payload (copy) or the caller's (WRITE). Written at once if it can. */
static struct msg *msg_new(kvf_conn_t *c, uint8_t kind, uint64_t arg, const void *buf, size_t len,
                           bool copy)
{
    struct msg *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    m->kind = kind;
    m->arg = arg;
    m->len = len;
    m->c = c;
    if (copy && len) {
        if (!(m->own = malloc(len))) {
            free(m);
            return NULL;
        }
        memcpy(m->own, buf, len);
        m->src = m->own;
    } else {
        m->src = buf;
    }
    return m;
}

static int send_ctl(kvf_conn_t *c, uint8_t kind, uint64_t arg)
{
    struct msg *m = msg_new(c, kind, arg, NULL, 0, false);
    if (!m) return -ENOMEM;
    enqueue(c, m);
    return 0;
}

/* --- Input. -------------------------------------------------------------------------------- */

static void dispatch(kvf_conn_t *c, uint8_t kind, uint64_t arg, uint8_t *p, size_t len);

/* The connection authenticated: keys derived, REGION queued, the engine told (listener side). */
static void conn_open(kvf_conn_t *c, bool server)
{
    kvf_xport_t *x = c->x;
    derive(x, server ? "s2c" : "c2s", c, c->k_tx);
    derive(x, server ? "c2s" : "s2c", c, c->k_rx);
    c->aes = c->gc[MAGIC_LEN - 1] == CIPHER_AES && c->gs[MAGIC_LEN - 1] == CIPHER_AES;
    if (server && x->pending) x->pending--;
    c->state = OPEN;
    if (x->rma_bytes) {
        struct msg *m = msg_new(c, MSG_REGION, x->rma_bytes, NULL, 0, false);
        if (m) {
            /* First on the wire, ahead of anything the engine queued while connecting. */
            m->next = c->q_head;
            c->q_head = m;
            if (!c->q_tail) c->q_tail = m;
        }
    }
    if (server) {
        c->visible = true;
        if (x->ev.on_accept) x->ev.on_accept(x->ev.ctx, c);
    }
}

static bool greeting_ok(const uint8_t *g)
{
    return memcmp(g, MAGIC, MAGIC_LEN - 1) == 0 &&
           (g[MAGIC_LEN - 1] == CIPHER_AES || g[MAGIC_LEN - 1] == CIPHER_CHACHA);
}

static void make_greeting(const kvf_xport_t *x, uint8_t g[HELLO_LEN])
{
    memcpy(g, MAGIC, MAGIC_LEN - 1);
    g[MAGIC_LEN - 1] = (uint8_t)x->cipher;
    randombytes_buf(g + MAGIC_LEN, NONCE_LEN);
}

/* Consumes complete units from c's input. Returns false if c is gone or failed. */
static bool process_rx(kvf_conn_t *c)
{
    kvf_xport_t *x = c->x;
    for (;;) {
        size_t avail = c->rb_len - c->rb_off;
        uint8_t *p = c->rb + c->rb_off;
        size_t need;
        switch (c->state) {
        case S_WAIT_HELLO:
        case C_WAIT_HELLO:
            need = HELLO_LEN;
            break;
        case S_WAIT_PROOF:
        case C_WAIT_PROOF:
            need = PROOF_LEN;
            break;
        case OPEN:
            need = HDR_LEN;
            if (avail >= HDR_LEN) {
                uint8_t kind = p[0];
                uint32_t len = get_le32(p + 4);
                uint64_t arg = get_le64(p + 8);
                bool ok = p[1] == 0 && p[2] == 0 && p[3] == 0;
                switch (kind) {
                case MSG_FRAME:
                    ok = ok && len <= KVF_XPORT_MAX_FRAME;
                    break;
                case MSG_WRITE:
                    ok = ok && x->rma_base && arg <= x->rma_bytes && len <= x->rma_bytes - arg;
                    break;
                case MSG_FLUSH_REQ:
                case MSG_FLUSH_ACK:
                case MSG_REGION:
                    ok = ok && len == 0;
                    break;
                default:
                    ok = false;
                }
                if (!ok) {
                    conn_fail(c, "connection failed: %s", "a malformed message header");
                    return false;
                }
                need = HDR_LEN + (size_t)len + TAG_LEN;
            }
            break;
        default:
            return false;
        }
        if (avail < need) {
            if (c->rb_off) { /* keep the unconsumed bytes at the front */
                memmove(c->rb, c->rb + c->rb_off, avail);
                c->rb_len = avail;
                c->rb_off = 0;
            }
            /* Before authentication a peer gets room for the unit it owes and no more. */
            size_t want = c->state == OPEN && need < RX_INITIAL ? RX_INITIAL : need;
            if (want > c->rb_cap) {
                uint8_t *nb = realloc(c->rb, want);
                if (!nb) {
                    conn_fail(c, "connection failed: %s", "out of memory for a message");
                    return false;
                }
                c->rb = nb;
                c->rb_cap = want;
            }
            return true;
        }
        c->rb_off += need;
        switch (c->state) {
        case S_WAIT_HELLO:
            if (!greeting_ok(p)) {
                conn_fail(c, "%s", "not a kvfence fabric peer");
                return false;
            }
            memcpy(c->gc, p, HELLO_LEN);
            make_greeting(x, c->gs);
            memcpy(c->hs_out, c->gs, HELLO_LEN);
            c->hs_len = HELLO_LEN;
            c->hs_off = 0;
            c->state = S_WAIT_PROOF;
            conn_write(c);
            if (c->zombie || c->failed) return false;
            break;
        case S_WAIT_PROOF: {
            uint8_t want[PROOF_LEN];
            derive(x, "client", c, want);
            if (crypto_verify_32(want, p) != 0) {
                /* Refused without a word: the peer learns nothing it did not send. */
                conn_fail(c, "%s", "fabric authentication failed");
                return false;
            }
            derive(x, "server", c, c->hs_out);
            c->hs_len = PROOF_LEN;
            c->hs_off = 0;
            conn_hold(c);
            conn_open(c, true);
            if (!conn_release(c)) return false;
            if (c->failed) return false;
            conn_write(c);
            if (c->zombie || c->failed) return false;
            break;
        }
        case C_WAIT_HELLO:
            if (!greeting_ok(p)) {
                conn_fail(c, "fabric authentication failed: %s",
                          "the peer is not a kvfence fabric listener");
                return false;
            }
            memcpy(c->gs, p, HELLO_LEN);
            derive(x, "client", c, c->hs_out);
            c->hs_len = PROOF_LEN;
            c->hs_off = 0;
            c->state = C_WAIT_PROOF;
            conn_write(c);
            if (c->zombie || c->failed) return false;
            break;
        case C_WAIT_PROOF: {
            uint8_t want[PROOF_LEN];
            derive(x, "server", c, want);
            if (crypto_verify_32(want, p) != 0) {
                conn_fail(c, "fabric authentication failed: %s",
                          "the peer did not prove the cluster key");
                return false;
            }
            conn_open(c, false);
            conn_write(c);
            if (c->zombie || c->failed) return false;
            break;
        }
        case OPEN: {
            uint8_t kind = p[0];
            uint32_t len = get_le32(p + 4);
            uint64_t arg = get_le64(p + 8);
            uint8_t n[crypto_aead_aes256gcm_NPUBBYTES];
            aead_nonce(c->seq_rx, n);
            int bad_tag = c->aes ? crypto_aead_aes256gcm_decrypt_detached(
                                       p + HDR_LEN, NULL, p + HDR_LEN, len, p + HDR_LEN + len, p,
                                       HDR_LEN, n, c->k_rx)
                                 : crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                                       p + HDR_LEN, NULL, p + HDR_LEN, len, p + HDR_LEN + len, p,
                                       HDR_LEN, n, c->k_rx);
            if (bad_tag) {
                conn_fail(c, "connection failed: %s", "a message failed authentication");
                return false;
            }
            c->seq_rx++;
            conn_hold(c);
            dispatch(c, kind, arg, p + HDR_LEN, len);
            if (!conn_release(c) || c->failed || c->closing) return false;
            break;
        }
        default:
            return false;
        }
    }
}

static void dispatch(kvf_conn_t *c, uint8_t kind, uint64_t arg, uint8_t *p, size_t len)
{
    kvf_xport_t *x = c->x;
    switch (kind) {
    case MSG_FRAME:
        if (x->ev.on_frame) x->ev.on_frame(x->ev.ctx, c, p, len);
        break;
    case MSG_WRITE:
        memcpy((uint8_t *)x->rma_base + arg, p, len);
        break;
    case MSG_FLUSH_REQ:
        if (send_ctl(c, MSG_FLUSH_ACK, arg) < 0)
            conn_fail(c, "connection failed: %s", "out of memory");
        else
            conn_write(c);
        break;
    case MSG_FLUSH_ACK:
        for (struct msg **pp = &c->flushes; *pp; pp = &(*pp)->next) {
            struct msg *f = *pp;
            if (f->flush_id == arg) {
                *pp = f->next;
                if (f->done) f->done(f->done_arg, 0);
                msg_free(f);
                break;
            }
        }
        break;
    case MSG_REGION:
        if (!c->remote_bytes && arg) {
            c->remote_bytes = (size_t)arg;
            if (x->ev.on_remote_ready) x->ev.on_remote_ready(x->ev.ctx, c);
        }
        break;
    default:
        break;
    }
}

static void conn_read(kvf_conn_t *c)
{
    size_t budget = RX_BUDGET;
    conn_hold(c);
    /* process_rx first: it consumes what is buffered and sizes the buffer for the next unit. */
    while (process_rx(c) && budget && c->fd >= 0) {
        if (c->rb_off == c->rb_len) c->rb_off = c->rb_len = 0;
        ssize_t n = recv(c->fd, c->rb + c->rb_len, c->rb_cap - c->rb_len, 0);
        if (n == 0) {
            if (c->state == C_WAIT_PROOF) /* the listener refused our proof */
                conn_fail(c, "fabric authentication failed: %s",
                          "the listener closed the connection after our proof (not the same "
                          "cluster key?)");
            else
                conn_fail(c, "connection failed: %s", "the peer closed the connection");
            break;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN) conn_fail(c, "connection failed: %s", strerror(errno));
            break;
        }
        c->rb_len += (size_t)n;
        budget = (size_t)n >= budget ? 0 : budget - (size_t)n;
    }
    conn_release(c);
}

/* --- The listener. ------------------------------------------------------------------------- */

static void accept_ready(kvf_xport_t *x)
{
    for (int i = 0; i < 16; i++) {
        int fd = accept4(x->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (x->pending >= MAX_PENDING) {
            /* Full of handshakes: the oldest goes. A real peer finishes in a round trip, so a
             * flood of strangers delays it by their count, never locks it out. */
            kvf_conn_t *oldest = NULL;
            for (kvf_conn_t *c = x->conns; c; c = c->next)
                if (!c->visible && c->state != OPEN && c->fd >= 0 &&
                    (!oldest || c->deadline_ms <= oldest->deadline_ms))
                    oldest = c;
            if (oldest) conn_fail(oldest, "%s", "handshake dropped: too many at once");
        }
        tune_socket(fd, x->keepalive_ms);
        kvf_conn_t *c = conn_new(x, fd, S_WAIT_HELLO);
        if (!c) {
            close(fd);
            continue;
        }
        x->pending++;
    }
}

/* --- Create and destroy. ------------------------------------------------------------------- */

static int resolve(const char *host, uint16_t port, struct sockaddr_storage *ss, socklen_t *len)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai) return -EINVAL;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

static int tcp_create(void *ctx, const struct kvf_xport_config *cfg,
                      const struct kvf_xport_events *ev, kvf_xport_t **out, char *err,
                      size_t err_len)
{
    (void)ctx;
    if (!cfg || !ev || !out) return -EINVAL;
    if (sodium_init() < 0) {
        if (err && err_len) snprintf(err, err_len, "libsodium failed to initialise");
        return KVF_E_TRANSPORT;
    }
    kvf_xport_t *x = calloc(1, sizeof(*x));
    if (!x) return -ENOMEM;
    x->head.ops = &kvf_tcp_transport;
    x->ev = *ev;
    x->lfd = -1;
    x->rma_base = cfg->rma_base;
    x->rma_bytes = cfg->rma_base ? cfg->rma_bytes : 0;
    x->keepalive_ms = cfg->keepalive_ms ? cfg->keepalive_ms : 100u;
    memcpy(x->key, cfg->fabric_key ? cfg->fabric_key : public_key, sizeof(x->key));
    x->cipher = crypto_aead_aes256gcm_is_available() ? CIPHER_AES : CIPHER_CHACHA;
#if defined(KVF_TEST_BUILD)
    /* Test builds: KVF_TEST_FABRIC_CHACHA=1 offers ChaCha20-Poly1305 only (both ciphers tested). */
    if (getenv("KVF_TEST_FABRIC_CHACHA") && atoi(getenv("KVF_TEST_FABRIC_CHACHA")))
        x->cipher = CIPHER_CHACHA;
#endif
    x->rng = 0x9e3779b97f4a7c15ull;
    int rc = 0;
    if ((x->ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        rc = -errno;
        if (err && err_len) snprintf(err, err_len, "epoll_create1: %s", strerror(errno));
        goto fail;
    }
    if (cfg->listen_host) {
        struct sockaddr_storage ss;
        socklen_t sl;
        if (resolve(cfg->listen_host, cfg->listen_port, &ss, &sl) < 0) {
            if (err && err_len) snprintf(err, err_len, "cannot resolve '%s'", cfg->listen_host);
            rc = -EINVAL;
            goto fail;
        }
        x->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        /* A worker restarted on its address binds again at once, without waiting out the old
         * connections' TIME_WAIT. */
        if (x->lfd >= 0) setsockopt(x->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (x->lfd < 0 || bind(x->lfd, (struct sockaddr *)&ss, sl) < 0 || listen(x->lfd, 128) < 0) {
            if (err && err_len)
                snprintf(err, err_len, "cannot listen on %s:%u: %s", cfg->listen_host,
                         cfg->listen_port, strerror(errno));
            rc = KVF_E_TRANSPORT;
            goto fail;
        }
        struct sockaddr_storage la;
        socklen_t ll = sizeof(la);
        if (getsockname(x->lfd, (struct sockaddr *)&la, &ll) == 0) {
            if (la.ss_family == AF_INET)
                x->port = ntohs(((struct sockaddr_in *)&la)->sin_port);
            else if (la.ss_family == AF_INET6)
                x->port = ntohs(((struct sockaddr_in6 *)&la)->sin6_port);
        }
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
        if (epoll_ctl(x->ep, EPOLL_CTL_ADD, x->lfd, &e) < 0) {
            rc = -errno;
            if (err && err_len) snprintf(err, err_len, "epoll_ctl: %s", strerror(errno));
            goto fail;
        }
    }
    *out = x;
    return 0;
fail:
    tcp_destroy(x);
    return rc;
}

static void tcp_destroy(kvf_xport_t *x)
{
    if (!x) return;
    x->destroying = true;
    /* Every connection is closed before the region can go: after this no peer writes it. */
    while (x->conns) {
        kvf_conn_t *c = x->conns;
        if (c->visible) {
            tcp_conn_close(c);
        } else {
            c->zombie = true;
            conn_hold(c);
            finish_queued(c, -ENOTCONN);
            c->holds--;
            conn_free(c);
        }
    }
    while (x->delayed) {
        struct msg *m = x->delayed;
        x->delayed = m->next;
        if (m->done) m->done(m->done_arg, -ENOTCONN);
        msg_free(m);
    }
    if (x->lfd >= 0) close(x->lfd);
    if (x->ep >= 0) close(x->ep);
    sodium_memzero(x->key, sizeof(x->key));
    free(x);
}

static uint16_t tcp_port(const kvf_xport_t *x)
{
    return x->port;
}

static int tcp_fd(const kvf_xport_t *x)
{
    return x->ep;
}

static void run_delayed(kvf_xport_t *x);
static int post_flush(kvf_conn_t *c, struct msg *f);

/* Handshakes past their deadline are dropped (a stranger holding a socket open holds nothing). */
static void expire_handshakes(kvf_xport_t *x, uint64_t now)
{
    for (kvf_conn_t *c = x->conns, *next; c; c = next) {
        next = c->next;
        if (c->state != OPEN && !c->failed && c->fd >= 0 && now >= c->deadline_ms)
            conn_fail(c, "connection failed: %s", "the fabric handshake timed out");
    }
}

static int tcp_progress(kvf_xport_t *x)
{
    int n = 0;
    uint64_t now = now_ms();
    if (x->delayed) run_delayed(x);
    expire_handshakes(x, now);
    struct epoll_event evs[64];
    int k = epoll_wait(x->ep, evs, 64, 0);
    for (int i = 0; i < k; i++) {
        kvf_conn_t *c = evs[i].data.ptr;
        n++;
        if (!c) {
            accept_ready(x);
            continue;
        }
        /* An earlier event of this batch may have freed c: look it up first. */
        kvf_conn_t *live = x->conns;
        while (live && live != c)
            live = live->next;
        if (!live || c->fd < 0) continue;
        uint32_t e = evs[i].events;
        if (c->state == C_CONNECTING && (e & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr) {
                conn_fail(c, "connection failed: %s", strerror(soerr));
                continue;
            }
            c->state = C_WAIT_HELLO;
            conn_write(c);
            continue;
        }
        conn_hold(c);
        if (e & (EPOLLIN | EPOLLERR | EPOLLHUP)) conn_read(c);
        if (!c->zombie && !c->failed && (e & EPOLLOUT)) conn_write(c);
        conn_release(c);
    }
    return n;
}

static int tcp_arm(kvf_xport_t *x)
{
    uint64_t now = now_ms();
    for (const struct msg *m = x->delayed; m; m = m->next)
        if (m->due_ms <= now) return -EAGAIN;
    return 0;
}

static int tcp_next_ms(const kvf_xport_t *x)
{
    uint64_t now = now_ms(), best = UINT64_MAX;
    for (const struct msg *m = x->delayed; m; m = m->next)
        if (m->due_ms < best) best = m->due_ms;
    for (const kvf_conn_t *c = x->conns; c; c = c->next)
        if (c->state != OPEN && c->fd >= 0 && c->deadline_ms < best) best = c->deadline_ms;
    if (best == UINT64_MAX) return -1;
    return best <= now ? 0 : (int)(best - now > 60000 ? 60000 : best - now);
}

static int tcp_connect(kvf_xport_t *x, const char *host, uint16_t port, kvf_conn_t **out, char *err,
                       size_t err_len)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, &ss, &sl) < 0) {
        if (err && err_len) snprintf(err, err_len, "cannot resolve '%s'", host);
        return -EINVAL;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        if (err && err_len)
            snprintf(err, err_len, "cannot connect to %s:%u: %s", host, port, strerror(errno));
        return KVF_E_TRANSPORT;
    }
    tune_socket(fd, x->keepalive_ms);
    if (connect(fd, (struct sockaddr *)&ss, sl) < 0 && errno != EINPROGRESS) {
        if (err && err_len)
            snprintf(err, err_len, "cannot connect to %s:%u: %s", host, port, strerror(errno));
        close(fd);
        return KVF_E_TRANSPORT;
    }
    kvf_conn_t *c = conn_new(x, fd, C_CONNECTING);
    if (!c) {
        close(fd);
        return -ENOMEM;
    }
    c->visible = true;
    /* The connection is closed before the handshake deadline only by its owner or a failure;
     * a listener that never answers fails it at the deadline. */
    make_greeting(x, c->gc);
    memcpy(c->hs_out, c->gc, HELLO_LEN);
    c->hs_len = HELLO_LEN;
    *out = c;
    return 0;
}

static bool tcp_conn_failed(const kvf_conn_t *c)
{
    return c->failed;
}
static const char *tcp_conn_error(const kvf_conn_t *c)
{
    return c->failed ? c->error : "";
}
static size_t tcp_conn_remote_bytes(const kvf_conn_t *c)
{
    return c->remote_bytes;
}

/* --- Sends, puts, flushes. ----------------------------------------------------------------- */

#if defined(KVF_TEST_BUILD)
static bool chance(kvf_xport_t *x, uint32_t pct)
{
    if (!pct) return false;
    x->rng ^= x->rng << 13;
    x->rng ^= x->rng >> 7;
    x->rng ^= x->rng << 17;
    return x->rng % 100 < pct;
}
#endif

static void delay(kvf_xport_t *x, struct msg *m, uint64_t due_ms)
{
    m->due_ms = due_ms;
    m->next = x->delayed;
    x->delayed = m;
}

static int tcp_conn_send(kvf_conn_t *c, const void *buf, size_t len)
{
    if (c->failed || c->closing) return -ENOTCONN;
    if (len > KVF_XPORT_MAX_FRAME) return -EMSGSIZE;
    kvf_xport_t *x = c->x;
    int copies = 1;
    uint32_t delay_ms = 0;
#if defined(KVF_TEST_BUILD)
    if (chance(x, x->faults.frame_drop_pct)) return 0;
    if (chance(x, x->faults.frame_dup_pct)) copies = 2;
    delay_ms = x->faults.frame_delay_ms;
#endif
    for (int i = 0; i < copies; i++) {
        struct msg *m = msg_new(c, MSG_FRAME, 0, buf, len, true);
        if (!m) return -ENOMEM;
        if (delay_ms) {
            delay(x, m, now_ms() + delay_ms);
            continue;
        }
        enqueue(c, m);
    }
    conn_write(c);
    return 0;
}

static int tcp_conn_put(kvf_conn_t *c, const void *src, size_t len, uint64_t remote_off,
                        kvf_xport_done_fn done, void *arg)
{
    if (c->failed || c->closing) return -ENOTCONN;
    if (c->remote_bytes == 0) return -EAGAIN;
    if (remote_off > c->remote_bytes || len > c->remote_bytes - remote_off) return -ERANGE;
    if (len > UINT32_MAX) return -EMSGSIZE;
    struct msg *m = msg_new(c, MSG_WRITE, remote_off, src, len, false);
    if (!m) return -ENOMEM;
    m->done = done;
    m->done_arg = arg;
#if defined(KVF_TEST_BUILD)
    if (c->x->faults.put_delay_ms) {
        delay(c->x, m, now_ms() + c->x->faults.put_delay_ms);
        return 0;
    }
#endif
    enqueue(c, m);
    conn_write(c);
    return 0;
}

static int tcp_conn_order(kvf_conn_t *c)
{
    /* One stream, applied in order: every put is already ordered behind the ones before it. */
    return c->failed || c->closing ? -ENOTCONN : 0;
}

/* A flush: a FLUSH_REQ behind every write queued so far; its ack, sent by the peer after it
 * applied them, completes the record. */
static int post_flush(kvf_conn_t *c, struct msg *f)
{
    f->flush_id = ++c->next_flush_id;
    f->next = c->flushes;
    c->flushes = f;
    if (send_ctl(c, MSG_FLUSH_REQ, f->flush_id) < 0) {
        c->flushes = f->next;
        if (f->done) f->done(f->done_arg, -ENOMEM);
        msg_free(f);
        return 0;
    }
    conn_write(c);
    return 0;
}

static int tcp_conn_flush(kvf_conn_t *c, kvf_xport_done_fn done, void *arg)
{
    if (c->failed || c->closing) return -ENOTCONN;
    struct msg *f = calloc(1, sizeof(*f));
    if (!f) return -ENOMEM;
    f->is_flush = true;
    f->c = c;
    f->done = done;
    f->done_arg = arg;
#if defined(KVF_TEST_BUILD)
    if (c->x->faults.flush_never) {
        c->x->faults.flush_never--;
        /* Parked: never sent, so never acked; it ends with an error when the connection does. */
        f->flush_id = UINT64_MAX;
        f->next = c->flushes;
        c->flushes = f;
        return 0;
    }
    if (c->x->faults.put_delay_ms) {
        /* Behind the delayed puts, so the flush still covers them. */
        delay(c->x, f, now_ms() + c->x->faults.put_delay_ms + 1);
        return 0;
    }
#endif
    return post_flush(c, f);
}

/* Queues delayed messages whose time has come, in due order (ties in posting order). */
static void run_delayed(kvf_xport_t *x)
{
    uint64_t now = now_ms();
    for (;;) {
        struct msg **best = NULL;
        for (struct msg **pp = &x->delayed; *pp; pp = &(*pp)->next)
            if ((*pp)->due_ms <= now && (!best || (*pp)->due_ms <= (*best)->due_ms)) best = pp;
        if (!best) return;
        struct msg *m = *best;
        *best = m->next;
        m->next = NULL;
        kvf_conn_t *c = m->c;
        if (m->is_flush) {
            post_flush(c, m);
            continue;
        }
        enqueue(c, m);
        conn_write(c);
    }
}

static void tcp_conn_close(kvf_conn_t *c)
{
    kvf_xport_t *x = c->x;
    /* Mutant: the "fence" only forgets the connection — the socket stays open and the peer's
     * writes keep landing, as when a target drops its bookkeeping instead of closing
     * (UCX_FENCES.md). */
    if (KVF_MUTANT(FENCE_WITHOUT_CLOSE) && !x->destroying) {
        c->head.user = NULL;
        return;
    }
    if (c->zombie) return;
    c->closing = true;
    close_fd(c); /* the fence: nothing more is read from this peer */
    conn_hold(c);
    finish_queued(c, -ENOTCONN);
    c->holds--;
    c->zombie = true;
    if (c->holds == 0) conn_free(c);
}

/* --- Keys. -------------------------------------------------------------------------------- */

int kvf_fabric_key_derive(const void *secret, size_t len, uint8_t out[KVF_FABRIC_KEY_BYTES])
{
    static const uint8_t label[32] = "kvfence cluster key v1";
    if (!secret || len < KVF_FABRIC_KEY_MIN_SECRET) return -EINVAL;
    if (sodium_init() < 0) return KVF_E_TRANSPORT;
    crypto_generichash(out, KVF_FABRIC_KEY_BYTES, secret, len, label, sizeof(label));
    return 0;
}

int kvf_fabric_random(void *buf, size_t len)
{
    if (sodium_init() < 0) return KVF_E_TRANSPORT;
    randombytes_buf(buf, len);
    return 0;
}

int kvf_fabric_key_random(uint8_t out[KVF_FABRIC_KEY_BYTES])
{
    return kvf_fabric_random(out, KVF_FABRIC_KEY_BYTES);
}

/* --- Fault hooks. -------------------------------------------------------------------------- */

int kvf_xport_faults_from_env(struct kvf_xport_faults *out)
{
#if defined(KVF_TEST_BUILD)
    memset(out, 0, sizeof(*out));
    const char *s = getenv("KVF_FAULTS");
    if (!s || !*s) return 0;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) return -EINVAL;
        *eq = 0;
        char *end = NULL;
        long long v = strtoll(eq + 1, &end, 10);
        if (!end || *end) return -EINVAL;
        if (strcmp(t, "put_delay_ms") == 0)
            out->put_delay_ms = (uint32_t)v;
        else if (strcmp(t, "frame_delay_ms") == 0)
            out->frame_delay_ms = (uint32_t)v;
        else if (strcmp(t, "frame_drop_pct") == 0)
            out->frame_drop_pct = (uint32_t)v;
        else if (strcmp(t, "frame_dup_pct") == 0)
            out->frame_dup_pct = (uint32_t)v;
        else if (strcmp(t, "flush_never") == 0)
            out->flush_never = (uint32_t)v;
        else if (strcmp(t, "fail_put") == 0)
            out->fail_put_status = (int)v;
        else if (strcmp(t, "seed") == 0)
            out->seed = (uint64_t)v;
        else
            return -EINVAL;
    }
    return 0;
#else
    (void)out;
    return -ENOTSUP;
#endif
}

static int tcp_set_faults(kvf_xport_t *x, const struct kvf_xport_faults *f)
{
#if defined(KVF_TEST_BUILD)
    x->faults = *f;
    if (f->seed) x->rng = f->seed;
    return 0;
#else
    (void)x;
    (void)f;
    return -ENOTSUP;
#endif
}

static uint64_t tcp_now_ms(const kvf_xport_t *x)
{
    (void)x;
    return now_ms();
}

const struct kvf_transport_ops kvf_tcp_transport = {
    .name = "tcp",
    .create = tcp_create,
    .destroy = tcp_destroy,
    .port = tcp_port,
    .fd = tcp_fd,
    .progress = tcp_progress,
    .arm = tcp_arm,
    .next_ms = tcp_next_ms,
    .now_ms = tcp_now_ms,
    .connect = tcp_connect,
    .failed = tcp_conn_failed,
    .error = tcp_conn_error,
    .remote_bytes = tcp_conn_remote_bytes,
    .send = tcp_conn_send,
    .put = tcp_conn_put,
    .order = tcp_conn_order,
    .flush = tcp_conn_flush,
    .close = tcp_conn_close,
    .set_faults = tcp_set_faults,
};
