/* simnet.c — the deterministic transport (simnet.h). */
#include "simnet.h"

#include <inttypes.h>
#include "kvfence/proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SN_MAX_X 16

enum item_kind { IT_ACCEPT = 1, IT_REGION, IT_FRAME, IT_PUT, IT_FLUSH_REQ, IT_FLUSH_ACK, IT_EOF };

struct sconn;

/* One thing travelling towards a connection's endpoint. */
struct item {
    enum item_kind kind;
    uint64_t arrive_ms;
    uint8_t *bytes; /* FRAME: the frame; PUT: the bytes, once captured */
    size_t len;
    uint64_t off;  /* PUT: where in the receiver's region */
    uint64_t id;   /* FLUSH_REQ / FLUSH_ACK */
    uint64_t size; /* REGION */
    /* PUT, until its local completion: the source, and the sender's completion. */
    const void *src;
    uint64_t src_id; /* what the source check named it at the post (0: not watched) */
    bool captured;
    bool orphan;      /* its sender completed it with an error: never applied, dropped here */
    bool sender_dead; /* sent by a process since killed (counted when applied) */
    uint64_t local_ms;
    kvf_xport_done_fn done;
    void *done_arg;
    struct sconn *from;
    struct item *next;       /* in the receiver's queue */
    struct item *next_local; /* in the sender's list of puts awaiting local completion */
};

struct flushrec {
    uint64_t id;
    kvf_xport_done_fn done;
    void *arg;
    struct flushrec *next;
};

struct sxport;

struct sconn {
    struct kvf_conn_head head;
    struct sxport *x;
    struct sconn *peer; /* NULL once the peer is gone */
    bool visible;       /* the engine knows it (connect, or accepted) */
    bool failed, reported, closed;
    uint64_t fail_at; /* failure noticed at this time (UINT64_MAX: none) */
    char error[96];
    size_t remote_bytes;
    struct item *rx_head, *rx_tail; /* arriving here, in order */
    uint64_t last_arrive;           /* the latest arrival queued towards this endpoint */
    struct item *local;             /* puts sent from here awaiting local completion */
    struct flushrec *flushes;
    uint64_t next_flush;
    struct sconn *next_in_x;
};

struct sxport {
    struct kvf_xport_head head;
    struct simnet *net;
    struct kvf_xport_events ev;
    uint16_t port;
    bool listening, dead;
    uint8_t *rma;
    size_t rma_bytes;
    struct sconn *conns;
    struct sconn *zombies; /* closed: freed at the next progress (never inside a callback) */
    int in_progress;
};

struct simnet {
    uint64_t now, rng;
    struct simnet_faults f;
    struct sxport *xs[SN_MAX_X];
    uint32_t n_xs;
    uint16_t next_port;
    struct simnet_stats st;
    bool trace; /* KVF_SIMNET_TRACE: every frame as it arrives, decoded */
    simnet_land_fn *land_check;
    void *land_ctx;
    simnet_src_fn *src_check;
    void *src_ctx;
    char violation[512]; /* the first land check that failed; "" while none has */
};

/* --- The world. ----------------------------------------------------------------------------- */

struct simnet *simnet_new(uint64_t seed, const struct simnet_faults *f)
{
    struct simnet *n = calloc(1, sizeof(*n));
    if (!n) return NULL;
    n->rng = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    n->f = *f;
    if (!n->f.delay_max_ms) n->f.delay_max_ms = 1;
    n->next_port = 40000;
    n->now = 1000;
    n->trace = getenv("KVF_SIMNET_TRACE") != NULL;
    return n;
}

void simnet_set_land_check(struct simnet *n, simnet_land_fn *fn, void *ctx)
{
    n->land_check = fn;
    n->land_ctx = ctx;
}

void simnet_set_src_check(struct simnet *n, simnet_src_fn *fn, void *ctx)
{
    n->src_check = fn;
    n->src_ctx = ctx;
}

const char *simnet_violation(const struct simnet *n)
{
    return n->violation[0] ? n->violation : NULL;
}

void simnet_free(struct simnet *n)
{
    free(n);
}

uint64_t simnet_now(const struct simnet *n)
{
    return n->now;
}

void simnet_set_now(struct simnet *n, uint64_t now_ms)
{
    if (now_ms > n->now) n->now = now_ms;
}

uint64_t simnet_rand(struct simnet *n, uint64_t lo, uint64_t hi)
{
    n->rng ^= n->rng << 13;
    n->rng ^= n->rng >> 7;
    n->rng ^= n->rng << 17;
    return hi <= lo ? lo : lo + n->rng % (hi - lo + 1);
}

static bool chance(struct simnet *n, uint32_t pct)
{
    return pct && simnet_rand(n, 0, 99) < pct;
}

void simnet_stats(const struct simnet *n, struct simnet_stats *out)
{
    *out = n->st;
}

static uint64_t delay(struct simnet *n)
{
    if (chance(n, n->f.late_pct)) {
        n->st.late++;
        return simnet_rand(n, 100, n->f.late_max_ms > 100 ? n->f.late_max_ms : 100);
    }
    return simnet_rand(n, 1, n->f.delay_max_ms);
}

/* Queues it towards c's endpoint, no earlier than anything queued before it (one stream). */
static void enqueue(struct sconn *c, struct item *it, uint64_t earliest)
{
    if (it->arrive_ms < earliest) it->arrive_ms = earliest;
    if (it->arrive_ms <= c->last_arrive) it->arrive_ms = c->last_arrive + 1;
    c->last_arrive = it->arrive_ms;
    it->next = NULL;
    if (c->rx_tail)
        c->rx_tail->next = it;
    else
        c->rx_head = it;
    c->rx_tail = it;
}

static struct item *item_new(enum item_kind k)
{
    struct item *it = calloc(1, sizeof(*it));
    if (!it) abort();
    it->kind = k;
    return it;
}

static void item_free(struct item *it)
{
    free(it->bytes);
    free(it);
}

/* Drops what had not arrived at c by `until` (a reset or a close). A put not yet complete
 * locally is completed by its sender, not here. */
static void drop_rx_after(struct sconn *c, uint64_t until)
{
    struct item **pp = &c->rx_head;
    c->rx_tail = NULL;
    while (*pp) {
        struct item *it = *pp;
        if (it->arrive_ms > until || (it->kind == IT_PUT && !it->captured)) {
            *pp = it->next;
            if (it->kind == IT_PUT && !it->captured && !it->orphan) { /* the sender's, still */
                it->next = NULL;
                it->arrive_ms = UINT64_MAX; /* marks it dropped for the sender */
                continue;
            }
            item_free(it);
            continue;
        }
        c->rx_tail = it;
        pp = &it->next;
    }
}

static void fail_at(struct sconn *c, uint64_t when, const char *why)
{
    if (c->failed || c->closed) return;
    c->failed = true;
    c->fail_at = when;
    snprintf(c->error, sizeof c->error, "connection failed: %s", why);
}

/* --- Objects. ------------------------------------------------------------------------------- */

static int sn_create(void *ctx, const struct kvf_xport_config *cfg,
                     const struct kvf_xport_events *ev, kvf_xport_t **out, char *err,
                     size_t err_len)
{
    struct simnet *n = ctx;
    if (!n || n->n_xs >= SN_MAX_X) {
        if (err && err_len) snprintf(err, err_len, "simnet: no room");
        return -ENOMEM;
    }
    struct sxport *x = calloc(1, sizeof(*x));
    if (!x) return -ENOMEM;
    x->head.ops = &simnet_transport;
    x->net = n;
    x->ev = *ev;
    x->rma = cfg->rma_base;
    x->rma_bytes = cfg->rma_base ? cfg->rma_bytes : 0;
    if (cfg->listen_host) {
        x->listening = true;
        x->port = cfg->listen_port ? cfg->listen_port : n->next_port++;
        for (uint32_t i = 0; i < n->n_xs; i++)
            if (n->xs[i] && n->xs[i]->listening && !n->xs[i]->dead && n->xs[i]->port == x->port) {
                if (err && err_len) snprintf(err, err_len, "simnet: port %u in use", x->port);
                free(x);
                return KVF_E_TRANSPORT;
            }
    }
    uint32_t slot = 0;
    while (slot < n->n_xs && n->xs[slot])
        slot++;
    if (slot == n->n_xs) n->n_xs++;
    n->xs[slot] = x;
    *out = (kvf_xport_t *)(void *)x;
    return 0;
}

static struct sxport *X(kvf_xport_t *x)
{
    return (struct sxport *)(void *)x;
}
static const struct sxport *XC(const kvf_xport_t *x)
{
    return (const struct sxport *)(const void *)x;
}
static struct sconn *C(kvf_conn_t *c)
{
    return (struct sconn *)(void *)c;
}
static const struct sconn *CC(const kvf_conn_t *c)
{
    return (const struct sconn *)(const void *)c;
}

static struct sconn *conn_new(struct sxport *x)
{
    struct sconn *c = calloc(1, sizeof(*c));
    if (!c) abort();
    c->head.ops = &simnet_transport;
    c->x = x;
    c->fail_at = UINT64_MAX;
    c->next_in_x = x->conns;
    x->conns = c;
    return c;
}

/* Every operation outstanding on c ends with status (a close, a failure noticed). */
static void finish_outstanding(struct sconn *c, int status)
{
    while (c->local) {
        struct item *it = c->local;
        c->local = it->next_local;
        kvf_xport_done_fn d = it->done;
        void *arg = it->done_arg;
        it->done = NULL;
        if (it->arrive_ms == UINT64_MAX) {
            item_free(it); /* in no queue: ours to free */
        } else {
            it->src = NULL;
            it->orphan = true; /* the receiver's queue owns it and drops it unapplied */
        }
        if (d) d(arg, status);
    }
    while (c->flushes) {
        struct flushrec *f = c->flushes;
        c->flushes = f->next;
        if (f->done) f->done(f->arg, status);
        free(f);
    }
}

static void unlink_conn(struct sconn *c)
{
    for (struct sconn **pp = &c->x->conns; *pp; pp = &(*pp)->next_in_x)
        if (*pp == c) {
            *pp = c->next_in_x;
            break;
        }
}

static void conn_free(struct sconn *c)
{
    drop_rx_after(c, 0);
    while (c->rx_head) { /* uncaptured puts left by drop_rx_after are the sender's */
        struct item *it = c->rx_head;
        c->rx_head = it->next;
        item_free(it);
    }
    free(c);
}

static void sn_close(kvf_conn_t *cc)
{
    struct sconn *c = C(cc);
    struct simnet *n = c->x->net;
    if (c->closed) return;
    c->closed = true;
    /* From here nothing more is applied from the peer: what is queued here goes. */
    drop_rx_after(c, 0);
    struct sconn *p = c->peer;
    if (p) {
        p->peer = NULL;
        /* The peer learns of it after a delay; what we had sent before still arrives. */
        if (!p->failed)
            fail_at(p, n->now + simnet_rand(n, 1, n->f.delay_max_ms),
                    "the peer closed the connection");
        c->peer = NULL;
    }
    finish_outstanding(c, -ENOTCONN);
    unlink_conn(c);
    c->next_in_x = c->x->zombies;
    c->x->zombies = c;
}

static void sn_destroy(kvf_xport_t *xx)
{
    struct sxport *x = X(xx);
    while (x->conns)
        sn_close((kvf_conn_t *)(void *)x->conns);
    while (x->zombies) {
        struct sconn *c = x->zombies;
        x->zombies = c->next_in_x;
        conn_free(c);
    }
    for (uint32_t i = 0; i < x->net->n_xs; i++)
        if (x->net->xs[i] == x) x->net->xs[i] = NULL;
    free(x);
}

static uint16_t sn_port(const kvf_xport_t *x)
{
    return XC(x)->port;
}
static int sn_fd(const kvf_xport_t *x)
{
    (void)x;
    return -1;
}
static int sn_arm(kvf_xport_t *x)
{
    (void)x;
    return 0;
}
static int sn_next_ms(const kvf_xport_t *x)
{
    (void)x;
    return -1;
}
static uint64_t sn_now_ms(const kvf_xport_t *x)
{
    return XC(x)->net->now;
}

static int sn_connect(kvf_xport_t *xx, const char *host, uint16_t port, kvf_conn_t **out, char *err,
                      size_t err_len)
{
    (void)host;
    (void)err;
    (void)err_len;
    struct sxport *x = X(xx);
    struct simnet *n = x->net;
    struct sconn *c = conn_new(x);
    c->visible = true;
    struct sxport *l = NULL;
    for (uint32_t i = 0; i < n->n_xs; i++)
        if (n->xs[i] && n->xs[i]->listening && !n->xs[i]->dead && n->xs[i]->port == port)
            l = n->xs[i];
    if (!l) {
        fail_at(c, n->now + simnet_rand(n, 1, n->f.delay_max_ms), "connection refused");
    } else {
        struct sconn *s = conn_new(l);
        c->peer = s;
        s->peer = c;
        struct item *a = item_new(IT_ACCEPT);
        a->arrive_ms = n->now + delay(n);
        enqueue(s, a, 0);
        struct item *r = item_new(IT_REGION); /* the client's region, to the listener */
        r->size = x->rma_bytes;
        r->arrive_ms = n->now + delay(n);
        enqueue(s, r, 0);
        struct item *r2 = item_new(IT_REGION); /* the listener's, back to the client */
        r2->size = l->rma_bytes;
        r2->arrive_ms = a->arrive_ms + delay(n);
        enqueue(c, r2, 0);
    }
    *out = (kvf_conn_t *)(void *)c;
    return 0;
}

static bool sn_failed(const kvf_conn_t *c)
{
    return CC(c)->reported;
}
static const char *sn_error(const kvf_conn_t *c)
{
    return CC(c)->reported ? CC(c)->error : "";
}
static size_t sn_remote_bytes(const kvf_conn_t *c)
{
    return CC(c)->remote_bytes;
}

static bool usable(const struct sconn *c)
{
    return !c->closed && !c->reported && !c->x->dead;
}

static int sn_send(kvf_conn_t *cc, const void *buf, size_t len)
{
    struct sconn *c = C(cc);
    if (!usable(c)) return -ENOTCONN;
    if (len > KVF_XPORT_MAX_FRAME) return -EMSGSIZE;
    struct simnet *n = c->x->net;
    n->st.frames++;
    if (!c->peer || c->failed) return 0; /* lost with the connection */
    struct item *it = item_new(IT_FRAME);
    it->bytes = malloc(len ? len : 1);
    if (!it->bytes) abort();
    memcpy(it->bytes, buf, len);
    it->len = len;
    it->from = c;
    it->arrive_ms = n->now + delay(n);
    enqueue(c->peer, it, 0);
    return 0;
}

static int sn_put(kvf_conn_t *cc, const void *src, size_t len, uint64_t off, kvf_xport_done_fn done,
                  void *arg)
{
    struct sconn *c = C(cc);
    if (!usable(c)) return -ENOTCONN;
    if (!c->remote_bytes) return -EAGAIN;
    if (off > c->remote_bytes || len > c->remote_bytes - off) return -ERANGE;
    struct simnet *n = c->x->net;
    n->st.puts++;
    n->st.put_bytes += len;
    struct item *it = item_new(IT_PUT);
    it->src = src;
    it->src_id = n->src_check ? n->src_check(n->src_ctx, src, len) : 0;
    it->len = len;
    it->off = off;
    it->done = done;
    it->done_arg = arg;
    it->from = c;
    it->local_ms =
        n->now + (chance(n, n->f.put_slow_pct) ? simnet_rand(n, 20, 120) : simnet_rand(n, 0, 3));
    it->arrive_ms = it->local_ms + delay(n);
    if (chance(n, n->f.put_late_pct)) {
        n->st.late++;
        uint32_t bound = n->f.put_late_max_ms ? n->f.put_late_max_ms : n->f.late_max_ms;
        it->arrive_ms = it->local_ms + simnet_rand(n, 100, bound > 100 ? bound : 100);
    }
    it->next_local = NULL;
    struct item **pp = &c->local; /* local completions in posting order */
    while (*pp)
        pp = &(*pp)->next_local;
    *pp = it;
    if (c->peer && !c->failed)
        enqueue(c->peer, it, 0);
    else
        it->arrive_ms = UINT64_MAX; /* never arrives; completes locally with an error */
    return 0;
}

static int sn_order(kvf_conn_t *c)
{
    return usable(C(c)) ? 0 : -ENOTCONN;
}

static int sn_flush(kvf_conn_t *cc, kvf_xport_done_fn done, void *arg)
{
    struct sconn *c = C(cc);
    if (!usable(c)) return -ENOTCONN;
    struct simnet *n = c->x->net;
    n->st.flushes++;
    struct flushrec *f = calloc(1, sizeof(*f));
    if (!f) abort();
    f->id = ++c->next_flush;
    f->done = done;
    f->arg = arg;
    f->next = c->flushes;
    c->flushes = f;
    if (c->peer && !c->failed) {
        struct item *it = item_new(IT_FLUSH_REQ);
        it->id = f->id;
        it->from = c;
        it->arrive_ms = n->now + delay(n);
        enqueue(c->peer, it, 0);
    }
    return 0;
}

/* --- Progress: everything due at this endpoint, in order. ---------------------------------- */

static void local_completions(struct sconn *c, uint64_t now)
{
    struct simnet *n = c->x->net;
    while (c->local && c->local->local_ms <= now && !c->closed) {
        struct item *it = c->local;
        c->local = it->next_local;
        kvf_xport_done_fn d = it->done;
        void *arg = it->done_arg;
        it->done = NULL;
        if (it->arrive_ms == UINT64_MAX) { /* the connection went before it left */
            item_free(it);
            if (d) d(arg, -ENOTCONN);
            continue;
        }
        /* Handed to the kernel: the bytes are read from the source now, not before. */
        if (it->src_id && n->src_check && !n->violation[0]) {
            uint64_t now_id = n->src_check(n->src_ctx, it->src, it->len);
            if (now_id != it->src_id)
                snprintf(n->violation, sizeof n->violation,
                         "at %" PRIu64 " ms: L8: a put reads its source page after its job let it "
                         "go (the page was %" PRIx64 " when the put was posted, %" PRIx64 " now)",
                         now, it->src_id, now_id);
        }
        it->bytes = malloc(it->len ? it->len : 1);
        if (!it->bytes) abort();
        memcpy(it->bytes, it->src, it->len);
        it->src = NULL;
        it->captured = true;
        if (d) d(arg, 0);
    }
}

static void deliver(struct sxport *x, struct sconn *c, uint64_t now)
{
    struct simnet *n = x->net;
    while (c->rx_head && c->rx_head->arrive_ms <= now && !c->closed && !c->reported) {
        struct item *it = c->rx_head;
        if (it->kind == IT_PUT && !it->captured && !it->orphan) break; /* not handed over yet */
        c->rx_head = it->next;
        if (!c->rx_head) c->rx_tail = NULL;
        if (it->kind == IT_PUT && it->orphan) {
            item_free(it);
            continue;
        }
        switch (it->kind) {
        case IT_ACCEPT:
            c->visible = true;
            if (x->ev.on_accept) x->ev.on_accept(x->ev.ctx, (kvf_conn_t *)(void *)c);
            break;
        case IT_REGION:
            c->remote_bytes = it->size;
            if (x->ev.on_remote_ready && c->visible && it->size)
                x->ev.on_remote_ready(x->ev.ctx, (kvf_conn_t *)(void *)c);
            break;
        case IT_FRAME:
            if (n->trace) {
                static struct kvf_page_ref pg[64];
                static uint64_t sums[64];
                static uint32_t toks[4096];
                struct kvf_msg_scratch sc = {pg, 64, sums, 64, toks, 4096};
                struct kvf_msg m;
                if (kvf_msg_decode(it->bytes, it->len, &m, &sc) == (long)it->len)
                    printf("    %" PRIu64 " ms: %s arrives at %s %u (req %" PRIu64 ")\n", now,
                           kvf_msg_type_name(m.type), x->listening ? "prefill" : "decode",
                           x->listening ? x->port
                           : c->peer    ? c->peer->x->port
                                        : 0,
                           m.req.lo % 100000);
            }
            if (c->visible) x->ev.on_frame(x->ev.ctx, (kvf_conn_t *)(void *)c, it->bytes, it->len);
            break;
        case IT_PUT:
            if (!x->rma || it->off + it->len > x->rma_bytes) {
                fail_at(c, now, "a write outside the region");
                break;
            }
            if (n->land_check && !n->violation[0]) {
                char why[sizeof n->violation - 32];
                if (n->land_check(n->land_ctx, (kvf_xport_t *)(void *)x, it->off, it->bytes,
                                  it->len, it->sender_dead, why, sizeof why))
                    snprintf(n->violation, sizeof n->violation, "at %" PRIu64 " ms: %s", now, why);
            }
            memcpy(x->rma + it->off, it->bytes, it->len);
            if (it->sender_dead) n->st.applied_after_kill++;
            break;
        case IT_FLUSH_REQ: /* every put before it is applied: the ack goes back */
            if (c->peer && !c->failed) {
                if (chance(n, n->f.lost_ack_pct)) {
                    n->st.acks_lost++;
                } else {
                    struct item *a = item_new(IT_FLUSH_ACK);
                    a->id = it->id;
                    a->arrive_ms = now + delay(n);
                    enqueue(c->peer, a, 0);
                }
            }
            break;
        case IT_FLUSH_ACK:
            for (struct flushrec **pp = &c->flushes; *pp; pp = &(*pp)->next)
                if ((*pp)->id == it->id) {
                    struct flushrec *f = *pp;
                    *pp = f->next;
                    if (f->done) f->done(f->arg, 0);
                    free(f);
                    break;
                }
            break;
        case IT_EOF:
            fail_at(c, now, "the peer closed the connection");
            break;
        }
        item_free(it);
    }
}

static int sn_progress(kvf_xport_t *xx)
{
    struct sxport *x = X(xx);
    struct simnet *n = x->net;
    uint64_t now = n->now;
    int k = 0;
    x->in_progress++;
    while (x->zombies && x->in_progress == 1) {
        struct sconn *c = x->zombies;
        x->zombies = c->next_in_x;
        conn_free(c);
    }
    for (struct sconn *c = x->conns; c; c = c->next_in_x)
        local_completions(c, now);
    for (struct sconn *c = x->conns, *next; c; c = next) {
        next = c->next_in_x;
        deliver(x, c, now);
        k++;
    }
    for (struct sconn *c = x->conns, *next; c; c = next) {
        next = c->next_in_x;
        if (c->failed && !c->reported && now >= c->fail_at) {
            c->reported = true;
            struct sconn *p = c->peer;
            if (p) { /* the peer's side of a reset goes too */
                p->peer = NULL;
                c->peer = NULL;
                fail_at(p, now + simnet_rand(n, 1, n->f.delay_max_ms), "connection reset by peer");
            }
            finish_outstanding(c, -ENOTCONN);
            if (c->visible && x->ev.on_error)
                x->ev.on_error(x->ev.ctx, (kvf_conn_t *)(void *)c, KVF_E_TRANSPORT);
        }
    }
    x->in_progress--;
    return k;
}

/* --- Faults. -------------------------------------------------------------------------------- */

void simnet_reset(kvf_xport_t *xx)
{
    struct sxport *x = X(xx);
    struct simnet *n = x->net;
    for (struct sconn *c = x->conns; c; c = c->next_in_x) {
        if (c->failed || c->closed) continue;
        n->st.resets++;
        struct sconn *p = c->peer;
        uint64_t t = n->now;
        drop_rx_after(c, t);
        fail_at(c, t + simnet_rand(n, 1, n->f.delay_max_ms), "connection reset");
        if (p) {
            drop_rx_after(p, t);
            fail_at(p, t + simnet_rand(n, 1, n->f.delay_max_ms), "connection reset by peer");
        }
    }
}

kvf_xport_t *simnet_listener(struct simnet *n, uint16_t port)
{
    for (uint32_t i = 0; i < n->n_xs; i++)
        if (n->xs[i] && n->xs[i]->listening && !n->xs[i]->dead && n->xs[i]->port == port)
            return (kvf_xport_t *)(void *)n->xs[i];
    return NULL;
}

void simnet_kill(kvf_xport_t *xx)
{
    struct sxport *x = X(xx);
    struct simnet *n = x->net;
    x->dead = true;
    x->listening = false;
    for (struct sconn *c = x->conns; c; c = c->next_in_x) {
        struct sconn *p = c->peer;
        if (!p) continue;
        /* What it had handed over still arrives; then the end of the stream. */
        struct item *eof = item_new(IT_EOF);
        eof->arrive_ms = n->now + delay(n);
        /* Puts not handed over never will be: they leave the receiver's queue (the dead
         * sender's list still holds them, freed when its transport is destroyed). */
        struct item **pp = &p->rx_head;
        p->rx_tail = NULL;
        while (*pp) {
            struct item *it = *pp;
            if (it->kind == IT_PUT && !it->captured && !it->orphan && it->from == c) {
                *pp = it->next;
                it->next = NULL;
                it->arrive_ms = UINT64_MAX;
                continue;
            }
            if (it->from == c) it->sender_dead = true;
            p->rx_tail = it;
            pp = &it->next;
        }
        enqueue(p, eof, 0);
        p->peer = NULL;
        c->peer = NULL;
    }
}

const struct kvf_transport_ops simnet_transport = {
    .name = "simnet",
    .create = sn_create,
    .destroy = sn_destroy,
    .port = sn_port,
    .fd = sn_fd,
    .progress = sn_progress,
    .arm = sn_arm,
    .next_ms = sn_next_ms,
    .now_ms = sn_now_ms,
    .connect = sn_connect,
    .failed = sn_failed,
    .error = sn_error,
    .remote_bytes = sn_remote_bytes,
    .send = sn_send,
    .put = sn_put,
    .order = sn_order,
    .flush = sn_flush,
    .close = sn_close,
    .set_faults = NULL,
};
