/*
 * decode_service.c — a decode worker served to routers in other processes (engine.h, "Split
 * roles"; the frames in rpc.h).
 *
 * One thread owns a listening fabric endpoint of its own (no registered memory: routers never write
 * here) and every router connection. A router's requests are ordinary handles of the decode
 * worker's generation seam: SUBMIT is kvf_dworker_gen_ops.submit, CANCEL its cancel, and the
 * thread forwards each handle's events as TOKEN and END frames. The decode worker writes an
 * eventfd whenever it pushes an event (kvf_dworker_set_notify), so the thread sleeps on
 * that fd and the transport's and wakes as soon as a token exists.
 *
 * A router that goes away (its connection fails or closes) loses its requests: each is
 * released, which cancels it through the handoff protocol; pages are freed only by the decode
 * worker's proof or fence, never here.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "rpc.h"

#define DS_HELLO_MS  2000u /* accept → the router's HELLO, at most */
#define DS_REFUSE_MS 500u  /* a refused router's connection closes this long after the reply */
#define DS_STATUS_MS 100u  /* STATUS to every router this often */
#define DS_FRAME_CAP (64u << 10)

struct sreq {
    uint64_t rid;
    kvf_gen_t *g;
    bool prov_sent; /* PROV went before the first TOKEN (or there was none to send) */
    struct sreq *next;
};

struct rconn {
    kvf_conn_t *c;
    bool hello_ok, failed;
    uint64_t deadline_ms; /* no HELLO by then, or refused: closed then */
    struct sreq *reqs;
    struct kvf_prefill_addr named[KVF_RPC_MAX_PREFILLS]; /* the prefill workers its HELLO named */
    uint32_t n_named;
    struct rconn *next;
};

struct sframe {
    struct rconn *rc;
    uint8_t *buf;
    size_t len;
    struct sframe *next;
};

struct kvf_decode_service {
    struct kvf_decode_service_config cfg;
    kvf_dworker_t *dw;
    kvf_xport_t *x;
    pthread_t thread;
    bool started;
    atomic_int stop;
    atomic_uint routers;
    int wake_fd; /* the decode worker's notify fd (kvf_dworker_notify_fd) */
    struct rconn *conns;
    struct sframe *fhead, *ftail;
    uint8_t *frame;       /* outgoing frames */
    int32_t *prompt_room; /* [max_context] */
    struct kvf_rpc_hello hello;
    uint64_t next_status_ms;
    uint64_t bad_frames;
    char last_refusal[KVF_PREFILL_WHY_MAX];
    bool named_dirty; /* a router came or went: the prefill set is recomputed */
};

/* The loop's clock is the transport's (the simulator's in manual mode). */
static uint64_t now_ms(const struct kvf_decode_service *s)
{
    return s->x ? kvf_xport_now_ms(s->x) : kvf__now_ms();
}

static void on_accept(void *ctx, kvf_conn_t *c)
{
    struct kvf_decode_service *s = ctx;
    struct rconn *rc = calloc(1, sizeof(*rc));
    if (!rc) {
        kvf_conn_close(c);
        return;
    }
    rc->c = c;
    rc->deadline_ms = now_ms(s) + DS_HELLO_MS;
    rc->next = s->conns;
    s->conns = rc;
    kvf_conn_set_user(c, rc);
}

static void on_frame(void *ctx, kvf_conn_t *c, const uint8_t *buf, size_t len)
{
    struct kvf_decode_service *s = ctx;
    struct rconn *rc = kvf_conn_user(c);
    if (!rc) return;
    struct sframe *f = malloc(sizeof(*f));
    if (!f || !(f->buf = malloc(len ? len : 1))) {
        free(f);
        rc->failed = true; /* a lost request frame cannot be told apart: drop the router */
        return;
    }
    memcpy(f->buf, buf, len);
    f->len = len;
    f->rc = rc;
    f->next = NULL;
    if (s->ftail)
        s->ftail->next = f;
    else
        s->fhead = f;
    s->ftail = f;
}

static void on_error(void *ctx, kvf_conn_t *c, int err)
{
    (void)ctx;
    (void)err;
    struct rconn *rc = kvf_conn_user(c);
    if (rc) rc->failed = true;
}

static void send_bytes(struct kvf_decode_service *s, struct rconn *rc, long n)
{
    if (n < 0 || rc->failed) return;
    if (kvf_conn_send(rc->c, s->frame, (size_t)n) < 0) rc->failed = true;
}

static void send_end(struct kvf_decode_service *s, struct rconn *rc, uint64_t rid, int err)
{
    struct kvf_gen_event ev = {.kind = KVF_GEN_END, .err = err};
    send_bytes(s, rc, kvf_rpc_put_event(s->frame, DS_FRAME_CAP, rid, &ev));
}

static void handle_hello(struct kvf_decode_service *s, struct rconn *rc,
                         const struct kvf_rpc_hello *h)
{
    struct kvf_rpc_hello reply = {.model_fp = s->cfg.model_fp,
                                  .max_context = s->cfg.max_context,
                                  .page_tokens = s->cfg.page_tokens,
                                  .n_vocab = s->cfg.n_vocab};
    if (h->model_fp != s->cfg.model_fp)
        snprintf(reply.why, sizeof reply.why,
                 "model fingerprint %016llx at the router, %016llx here (a different model file)",
                 (unsigned long long)h->model_fp, (unsigned long long)s->cfg.model_fp);
    else if (h->max_context != s->cfg.max_context)
        snprintf(reply.why, sizeof reply.why,
                 "context limit %u tokens at the router, %u here (--context-length must agree)",
                 h->max_context, s->cfg.max_context);
    else if (h->page_tokens != s->cfg.page_tokens)
        snprintf(reply.why, sizeof reply.why, "page size %u tokens at the router, %u here",
                 h->page_tokens, s->cfg.page_tokens);
    if (reply.why[0]) {
        reply.status = KVF_E_PROTO_MISMATCH;
        if (strcmp(reply.why, s->last_refusal) != 0) /* each reason once: routers retry */
            kvf_log(KVF_LOG_WARN, "kvfence decode: refusing a router: %s\n", reply.why);
        kvf__strlcpy(s->last_refusal, reply.why, sizeof s->last_refusal);
        send_bytes(s, rc, kvf_rpc_put_hello(s->frame, DS_FRAME_CAP, KVF_RPC_HELLO_D, &reply));
        rc->deadline_ms = now_ms(s) + DS_REFUSE_MS;
        return;
    }
    /* The prefill workers it names are used while it (or another router naming them) is
     * connected: the decode worker retires them when no live router names them any more. */
    rc->n_named = h->n_prefills < KVF_RPC_MAX_PREFILLS ? h->n_prefills : KVF_RPC_MAX_PREFILLS;
    for (uint32_t i = 0; i < rc->n_named; i++) {
        kvf__strlcpy(rc->named[i].host, h->prefills[i].host, sizeof rc->named[i].host);
        rc->named[i].port = h->prefills[i].port;
    }
    s->named_dirty = true;
    send_bytes(s, rc, kvf_rpc_put_hello(s->frame, DS_FRAME_CAP, KVF_RPC_HELLO_D, &reply));
    rc->hello_ok = true;
    rc->deadline_ms = 0;
    atomic_fetch_add(&s->routers, 1);
}

static struct sreq *find_req(struct rconn *rc, uint64_t rid)
{
    for (struct sreq *q = rc->reqs; q; q = q->next)
        if (q->rid == rid) return q;
    return NULL;
}

static void handle_frame(struct kvf_decode_service *s, struct rconn *rc, const uint8_t *buf,
                         size_t len)
{
    struct kvf_rpc_msg m;
    if (rc->failed) return;
    if (kvf_rpc_decode(buf, len, &m, s->prompt_room, s->cfg.max_context, &s->hello, NULL) < 0) {
        s->bad_frames++;
        rc->failed = true; /* a router that sends what does not decode is dropped */
        return;
    }
    if (m.type == KVF_RPC_HELLO_R && !rc->hello_ok) {
        handle_hello(s, rc, m.hello);
        return;
    }
    if (!rc->hello_ok) {
        rc->failed = true;
        return;
    }
    if (m.type == KVF_RPC_SUBMIT) {
        if (find_req(rc, m.rid)) {
            send_end(s, rc, m.rid, -EEXIST);
            return;
        }
        struct sreq *q = calloc(1, sizeof(*q));
        if (!q) {
            send_end(s, rc, m.rid, -ENOMEM);
            return;
        }
        int err = kvf_dworker_gen_ops.submit(s->dw, &m.params, &q->g);
        if (err < 0) {
            free(q);
            send_end(s, rc, m.rid, err);
            return;
        }
        q->rid = m.rid;
        q->next = rc->reqs;
        rc->reqs = q;
    } else if (m.type == KVF_RPC_CANCEL) {
        struct sreq *q = find_req(rc, m.rid);
        if (q) kvf_dworker_gen_ops.cancel(s->dw, q->g);
    } else {
        s->bad_frames++; /* a frame only a decode worker sends */
        rc->failed = true;
    }
}

/* Every handle's events so far, forwarded; ended handles released. */
static void forward_events(struct kvf_decode_service *s, struct rconn *rc)
{
    for (struct sreq **pq = &rc->reqs; *pq;) {
        struct sreq *q = *pq;
        struct kvf_gen_event ev;
        bool ended = false;
        while (!ended && kvf_dworker_gen_ops.next(s->dw, q->g, &ev, 0) == 1) {
            if (ev.kind == KVF_GEN_TOKEN && !q->prov_sent) {
                /* The handoff was verified before its first token: its provenance goes first. */
                struct kvf_gen_prov pv;
                q->prov_sent = true;
                if (kvf_dworker_gen_ops.prov(s->dw, q->g, &pv) == 1)
                    send_bytes(s, rc, kvf_rpc_put_prov(s->frame, DS_FRAME_CAP, q->rid, &pv));
            }
            send_bytes(s, rc, kvf_rpc_put_event(s->frame, DS_FRAME_CAP, q->rid, &ev));
            ended = ev.kind == KVF_GEN_END;
        }
        if (!ended) {
            pq = &q->next;
            continue;
        }
        kvf_dworker_gen_ops.release(s->dw, q->g);
        *pq = q->next;
        free(q);
    }
}

static void send_status(struct kvf_decode_service *s)
{
    struct kvf_rpc_status st;
    memset(&st, 0, sizeof st);
    kvf_dworker_gen_ops.info(s->dw, &st.info);
    st.n_prefills = (uint32_t)kvf_dworker_prefills(s->dw, st.prefills, KVF_RPC_MAX_PREFILLS);
    long n = kvf_rpc_put_status(s->frame, DS_FRAME_CAP, &st);
    for (struct rconn *rc = s->conns; rc; rc = rc->next)
        if (rc->hello_ok) send_bytes(s, rc, n);
}

/* Closes rc: its requests are released (each a cancel through the protocol). */
static void drop_conn(struct kvf_decode_service *s, struct rconn *rc)
{
    while (rc->reqs) {
        struct sreq *q = rc->reqs;
        rc->reqs = q->next;
        kvf_dworker_gen_ops.release(s->dw, q->g);
        free(q);
    }
    if (rc->hello_ok) {
        atomic_fetch_sub(&s->routers, 1);
        s->named_dirty = true;
    }
    kvf_conn_close(rc->c);
    free(rc);
}

/* The union of the live routers' names, handed to the decode worker. O(routers² + names ×
 * table): a decode has a handful of routers. */
static void publish_named(struct kvf_decode_service *s)
{
    struct kvf_prefill_addr all[KVF_DECODE_MAX_PREFILLS];
    uint32_t n = 0, dropped = 0, n_conns = 0;
    for (struct rconn *rc = s->conns; rc; rc = rc->next)
        n_conns++;
    /* Oldest router first (the list is newest first): names already in use keep their slots,
     * and a newer router's names beyond the table are the ones refused. */
    for (uint32_t age = n_conns; age-- > 0;) {
        struct rconn *rc = s->conns;
        for (uint32_t k = 0; k < age; k++)
            rc = rc->next;
        if (!rc->hello_ok) continue;
        for (uint32_t i = 0; i < rc->n_named; i++) {
            bool dup = false;
            for (uint32_t k = 0; k < n && !dup; k++)
                dup =
                    all[k].port == rc->named[i].port && strcmp(all[k].host, rc->named[i].host) == 0;
            if (dup) continue;
            if (n < KVF_ARRAY_LEN(all))
                all[n++] = rc->named[i];
            else
                dropped++;
        }
    }
    dropped += (uint32_t)kvf_dworker_set_router_prefills(s->dw, all, n);
    if (dropped)
        kvf_log(KVF_LOG_WARN,
                "kvfence decode: the routers name %u prefill workers beyond the %d this decode "
                "worker can use\n",
                dropped, KVF_DECODE_MAX_PREFILLS);
    s->named_dirty = false;
}

/* One turn of the loop: everything ready now, without waiting. */
static void turn(struct kvf_decode_service *s)
{
    {
        kvf_xport_progress(s->x);
        while (s->fhead) {
            struct sframe *f = s->fhead;
            s->fhead = f->next;
            if (!s->fhead) s->ftail = NULL;
            handle_frame(s, f->rc, f->buf, f->len);
            free(f->buf);
            free(f);
        }
        uint64_t now = now_ms(s);
        for (struct rconn *rc = s->conns; rc; rc = rc->next) {
            forward_events(s, rc);
            if (rc->deadline_ms && now >= rc->deadline_ms) rc->failed = true;
        }
        if (now >= s->next_status_ms) {
            send_status(s);
            s->next_status_ms = now + DS_STATUS_MS;
        }
        for (struct rconn **pc = &s->conns; *pc;) {
            struct rconn *rc = *pc;
            if (!rc->failed) {
                pc = &rc->next;
                continue;
            }
            *pc = rc->next;
            drop_conn(s, rc);
        }
        if (s->named_dirty) publish_named(s);
    }
}

static void *loop(void *arg)
{
    struct kvf_decode_service *s = arg;
    while (!atomic_load(&s->stop)) {
        turn(s);
        kvf__loop_wait(s->x, s->wake_fd, DS_STATUS_MS);
    }
    return NULL;
}

int kvf_decode_service_turn(kvf_decode_service_t *s)
{
    if (!s->cfg.manual) return -EINVAL;
    turn(s);
    return 0;
}

int kvf_decode_service_start(kvf_dworker_t *dw, const struct kvf_decode_service_config *cfg,
                             kvf_decode_service_t **out, char *err, size_t err_len)
{
    struct kvf_decode_service *s = calloc(1, sizeof(*s));
    if (!s) return -ENOMEM;
    s->cfg = *cfg;
    s->dw = dw;
    s->wake_fd = kvf_dworker_notify_fd(dw);
    s->frame = malloc(DS_FRAME_CAP);
    s->prompt_room = malloc((size_t)(cfg->max_context ? cfg->max_context : 1) * sizeof(int32_t));
    int rc = s->wake_fd < 0 ? s->wake_fd : (!s->frame || !s->prompt_room) ? -ENOMEM : 0;
    if (rc < 0) snprintf(err, err_len, "out of memory");
    if (rc == 0) {
        struct kvf_xport_config xc = {
            cfg->listen_host, cfg->listen_port, cfg->keepalive_ms, NULL, 0,
            cfg->fabric_key,  cfg->transport,   cfg->transport_ctx};
        struct kvf_xport_events ev = {s, on_accept, on_frame, NULL, on_error};
        rc = kvf_xport_create(&xc, &ev, &s->x, err, err_len);
    }
    if (rc == 0 && !cfg->manual) {
        if ((rc = -pthread_create(&s->thread, NULL, loop, s)) < 0)
            snprintf(err, err_len, "cannot start the decode service thread");
        else
            s->started = true;
    }
    if (rc < 0) {
        kvf_decode_service_stop(s);
        return rc;
    }
    *out = s;
    return 0;
}

uint16_t kvf_decode_service_port(const kvf_decode_service_t *s)
{
    return kvf_xport_port(s->x);
}

uint32_t kvf_decode_service_routers(kvf_decode_service_t *s)
{
    return atomic_load(&s->routers);
}

void kvf_decode_service_stop(kvf_decode_service_t *s)
{
    if (!s) return;
    if (s->started) {
        atomic_store(&s->stop, 1);
        kvf__wake(s->wake_fd);
        pthread_join(s->thread, NULL);
    }
    while (s->fhead) {
        struct sframe *f = s->fhead;
        s->fhead = f->next;
        free(f->buf);
        free(f);
    }
    while (s->conns) {
        struct rconn *rc = s->conns;
        s->conns = rc->next;
        drop_conn(s, rc);
    }
    if (s->x) kvf_xport_destroy(s->x);
    free(s->frame);
    free(s->prompt_room);
    free(s);
}
