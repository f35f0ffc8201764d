/*
 * kvfence/transport.h — the fabric between kvfence's processes: authenticated, encrypted
 * control frames, page writes into the decode pool, and fencing by closing the connection.
 *
 * One kvf_xport_t is one epoll set, an optional listener and its connections, owned by one
 * event-loop thread (an engine loop). Every function here is called from that thread, and every
 * callback runs on it, inside kvf_xport_progress. The loop sleeps on kvf_xport_fd() after
 * kvf_xport_arm() returned 0, so an idle worker does not spin.
 *
 * Trust: every connection starts with a mutual challenge-response over the cluster key
 * (fabric_key); a peer that cannot prove it never becomes a connection (the listener side never
 * calls on_accept for it, the connecting side gets on_error "fabric authentication failed"), and
 * learns nothing but a random nonce. After it, every message is sealed (ChaCha20-Poly1305 under
 * a per-session, per-direction key, numbered): a forged, altered, replayed, reordered or dropped
 * message fails the connection. docs/SECURITY.md has the threat model; src/transport/tcp.c the
 * wire format.
 *
 * Connections (kvf_conn_t, one TCP socket each):
 *
 *   connect / accept ──(handshake)──▶ OPEN ──(peer reset or closed, keepalive, bad tag)──▶ FAILED
 *        │ (wrong key, timeout)           │                                 (on_error once)  │
 *        └──────────▶ FAILED              └────── kvf_conn_close (the fence) ◀──────────────────┘
 * ──▶ gone
 *
 * Memory a peer may write (the decode pool) is given at create (rma_base/rma_bytes); its size is
 * sent as the first message on every connection, after which the peer may kvf_conn_put into it.
 * A put names an offset into the peer's region; the sender refuses one that would leave it and
 * the receiver drops the connection of a peer that sends one.
 *
 * What a completion proves (see docs/PROTOCOL.md, "Fences"):
 *   - a put's callback: local completion only — its bytes are sealed and in the kernel, the
 *     source may be reused; nothing about the remote side;
 *   - a flush's callback with status 0: every put posted on the connection before the flush was
 *     applied by the peer (the drain proof);
 *   - kvf_conn_close(c): after it returns, nothing more is read from c's socket, so the peer can
 *     no longer write local memory through c. Outstanding operations on c complete with an
 *     error before it returns.
 *
 * Errors: 0 or a negative code (-EINVAL, -ENOMEM, KVF_E_TRANSPORT with the cause in the err
 * text, -ENOTCONN on a failed or closed connection, -ERANGE for a put outside the remote
 * region).
 */
#ifndef KVFENCE_TRANSPORT_H
#define KVFENCE_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/common.h"

typedef struct kvf_xport kvf_xport_t;
typedef struct kvf_conn kvf_conn_t;
struct kvf_transport_ops;
struct kvf_xport_faults;

/* Completion of a put or a flush: status 0 or a negative code (the connection failed, was
 * closed, or a fault hook failed it). */
typedef void (*kvf_xport_done_fn)(void *arg, int status);

struct kvf_xport_events {
    void *ctx;
    /* A new inbound connection (listener side). The engine may keep c (kvf_conn_set_user). */
    void (*on_accept)(void *ctx, kvf_conn_t *c);
    /* A control frame arrived on c; buf is borrowed for the call. The transport does not
     * interpret it; the engine decodes it (and counts and drops what does not decode). */
    void (*on_frame)(void *ctx, kvf_conn_t *c, const uint8_t *buf, size_t len);
    /* The peer's remote key arrived on c: puts may now be posted. */
    void (*on_remote_ready)(void *ctx, kvf_conn_t *c);
    /* c failed (peer gone, reset, keepalive timeout). Called once; c stays allocated until
     * kvf_conn_close. err is KVF_E_TRANSPORT; the text is in kvf_conn_error(c). */
    void (*on_error)(void *ctx, kvf_conn_t *c, int err);
};

struct kvf_xport_config {
    const char *listen_host; /* NULL = no listener */
    uint16_t listen_port;    /* 0 = an ephemeral port (kvf_xport_port tells which) */
    uint32_t keepalive_ms;   /* how soon a dead or fenced peer is noticed; 0 = 100 */
    void *rma_base;          /* memory peers may write (the decode pool); NULL = none */
    size_t rma_bytes;
    const uint8_t *fabric_key; /* the cluster key, KVF_FABRIC_KEY_BYTES, copied at create; NULL:
                                  an all-zero key every peer knows (no authentication) */
    const struct kvf_transport_ops *ops; /* the implementation (the seam, below); NULL: the
                                            fabric, kvf_tcp_transport */
    void *ops_ctx;                       /* passed to ops->create (the simulator's world) */
};
#define KVF_FABRIC_KEY_BYTES 32

/* The cluster key from a secret (a key file's content): a keyed BLAKE2b of it, so any secret of
 * KVF_FABRIC_KEY_MIN_SECRET bytes or more serves. 0, or -EINVAL for a shorter one. */
#define KVF_FABRIC_KEY_MIN_SECRET 32
int kvf_fabric_key_derive(const void *secret, size_t len, uint8_t out[KVF_FABRIC_KEY_BYTES]);
/* A fresh random key from the kernel's source (one process's private fabric: `serve`). */
int kvf_fabric_key_random(uint8_t out[KVF_FABRIC_KEY_BYTES]);
/* len random bytes from the kernel's source (ids, seeds, key files). 0, or KVF_E_TRANSPORT. */
int kvf_fabric_random(void *buf, size_t len);

/* Creates the transport cfg->ops names (the fabric when NULL): for the fabric, the epoll set and
 * (optionally) the listener, bound to listen_host only. On failure nothing is left and err
 * explains. */
int kvf_xport_create(const struct kvf_xport_config *cfg, const struct kvf_xport_events *ev,
                     kvf_xport_t **out, char *err, size_t err_len);
/* Closes every connection (forced), unregisters memory, destroys the worker and context. After
 * it returns no peer can write rma_base. NULL is a no-op. */
void kvf_xport_destroy(kvf_xport_t *x);

uint16_t kvf_xport_port(const kvf_xport_t *x);
/* The fd to poll for input, valid for the transport's life. */
int kvf_xport_fd(const kvf_xport_t *x);
/* Runs every ready completion and callback. Returns how many events were handled. */
int kvf_xport_progress(kvf_xport_t *x);
/* 0: nothing pending, the loop may sleep on the fd (up to kvf_xport_next_ms); -EAGAIN: there is
 * more work, progress again. */
int kvf_xport_arm(kvf_xport_t *x);
/* Milliseconds until the transport needs progress on its own (delayed operations of the fault
 * hooks), or -1 for none. */
int kvf_xport_next_ms(const kvf_xport_t *x);

/* Opens a connection to host:port (non-blocking: failures arrive through on_error). */
int kvf_xport_connect(kvf_xport_t *x, const char *host, uint16_t port, kvf_conn_t **out, char *err,
                      size_t err_len);

void kvf_conn_set_user(kvf_conn_t *c, void *user);
void *kvf_conn_user(const kvf_conn_t *c);
bool kvf_conn_failed(const kvf_conn_t *c);
const char *kvf_conn_error(const kvf_conn_t *c);
bool kvf_conn_remote_ready(const kvf_conn_t *c);
/* The size of the peer's registered region (0 until remote ready). */
size_t kvf_conn_remote_bytes(const kvf_conn_t *c);

/* Sends one control frame (copied; the call returns at once). -ENOTCONN on a failed or closed
 * connection, -EMSGSIZE above KVF_XPORT_MAX_FRAME. Delivery is reliable and in order while the
 * connection lives. */
#define KVF_XPORT_MAX_FRAME (8u << 20)
int kvf_conn_send(kvf_conn_t *c, const void *buf, size_t len);

/* Posts a put of src[0..len) to the peer's region at remote_off. src must stay valid until
 * done(arg, status) runs (local completion). -ENOTCONN, -ERANGE, -EAGAIN (not remote ready). On
 * an error return done is never called. */
int kvf_conn_put(kvf_conn_t *c, const void *src, size_t len, uint64_t remote_off,
                 kvf_xport_done_fn done, void *arg);
/* Orders the puts on c: every put posted before is applied before any posted after (one
 * ordered stream: always true; kept for the callers' statement of intent). */
int kvf_conn_order(kvf_conn_t *c);
/* Remote completion of every put posted on c so far: done(arg, 0) is the drain proof. */
int kvf_conn_flush(kvf_conn_t *c, kvf_xport_done_fn done, void *arg);

/* Closes c in the mode that fences the peer: forced, in peer-error mode. Outstanding operations
 * complete with an error first; c is freed before return. */
void kvf_conn_close(kvf_conn_t *c);

/* The transport's clock (milliseconds, monotonic): the worker loops read time only here, so a
 * simulated transport runs them on simulated time. */
uint64_t kvf_xport_now_ms(const kvf_xport_t *x);

/* --- The seam. --------------------------------------------------------------------------------
 *
 * Every kvf_xport_* and kvf_conn_* call above dispatches through the ops of the object it is
 * given (src/transport/seam.c); the engine's loops reach the network and the clock only through
 * these calls. The fabric (src/transport/tcp.c) is the production implementation; the
 * deterministic simulator (tests/sim/simnet.c) is the other, and runs the real worker loops on
 * simulated links and time. An implementation's objects begin with the heads below, and it keeps
 * every promise this header makes (callbacks only inside progress; puts in order with frames;
 * a flush's success proves every earlier put applied; nothing applied after close returns).
 */
struct kvf_transport_ops {
    const char *name;
    int (*create)(void *ctx, const struct kvf_xport_config *cfg, const struct kvf_xport_events *ev,
                  kvf_xport_t **out, char *err, size_t err_len);
    void (*destroy)(kvf_xport_t *x);
    uint16_t (*port)(const kvf_xport_t *x);
    int (*fd)(const kvf_xport_t *x);
    int (*progress)(kvf_xport_t *x);
    int (*arm)(kvf_xport_t *x);
    int (*next_ms)(const kvf_xport_t *x);
    uint64_t (*now_ms)(const kvf_xport_t *x);
    int (*connect)(kvf_xport_t *x, const char *host, uint16_t port, kvf_conn_t **out, char *err,
                   size_t err_len);
    bool (*failed)(const kvf_conn_t *c);
    const char *(*error)(const kvf_conn_t *c);
    size_t (*remote_bytes)(const kvf_conn_t *c);
    int (*send)(kvf_conn_t *c, const void *buf, size_t len);
    int (*put)(kvf_conn_t *c, const void *src, size_t len, uint64_t remote_off,
               kvf_xport_done_fn done, void *arg);
    int (*order)(kvf_conn_t *c);
    int (*flush)(kvf_conn_t *c, kvf_xport_done_fn done, void *arg);
    void (*close)(kvf_conn_t *c);
    int (*set_faults)(kvf_xport_t *x, const struct kvf_xport_faults *f); /* NULL: -ENOTSUP */
};
struct kvf_xport_head {
    const struct kvf_transport_ops *ops;
};
struct kvf_conn_head {
    const struct kvf_transport_ops *ops;
    void *user; /* kvf_conn_set_user */
};
/* The fabric: kvfence's authenticated, encrypted TCP stream. */
extern const struct kvf_transport_ops kvf_tcp_transport;

/* --- Test-only fault hooks (compiled out of release builds). ------------------------------- */

struct kvf_xport_faults {
    uint32_t put_delay_ms;   /* post every put this much later */
    uint32_t frame_delay_ms; /* deliver every sent frame this much later */
    uint32_t frame_drop_pct; /* drop this share of sent frames (0..100) */
    uint32_t frame_dup_pct;  /* send this share of frames twice */
    uint32_t flush_never;    /* the next this many flushes never complete (the lost-ack hazard,
                              H17); they end with an error only when the connection does */
    int fail_put_status;     /* nonzero: every put completes locally with this status */
    uint64_t seed;
};
/* Reads KVF_FAULTS="put_delay_ms=20,frame_drop_pct=5,flush_never=1,fail_put=-1301,seed=7" into
 * *out; 0, or -EINVAL naming nothing (a bad spec). Test builds only (-ENOTSUP otherwise). */
int kvf_xport_faults_from_env(struct kvf_xport_faults *out);
int kvf_xport_set_faults(kvf_xport_t *x, const struct kvf_xport_faults *f);

#endif /* KVFENCE_TRANSPORT_H */
