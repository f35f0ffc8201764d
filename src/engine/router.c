/*
 * router.c — the generation seam over decode workers in other processes (engine.h, "Split
 * roles"; the frames in rpc.h).
 *
 * One loop thread owns a fabric endpoint with no listener and no registered memory, a connection to
 * every decode worker it was given, and every request's loop-side state. Router threads (the
 * HTTP server's) touch only a handle's event queue and the inbox of submitted handles, as with
 * the decode worker's own seam.
 *
 * A request's life here:
 *   inbox ──▶ pending (waits for a live decode worker; bounded by admit_timeout_ms)
 *         ──▶ sent (SUBMIT to one decode worker) ──TOKEN…──▶ END: ended, the loop lets go.
 * A cancel of a sent request is a CANCEL frame; its END comes back from the decode worker,
 * which ends it through the handoff protocol. A decode worker whose connection fails takes its
 * requests with it: each ends with KVF_E_PROTO_PEER_DOWN (502 at the HTTP server), and the
 * router connects again with backoff; nothing else is disturbed.
 *
 * Choosing a decode worker: of the live ones, the one with the fewest of this router's requests
 * in flight, then the most free pages in its last STATUS. The prefill worker for a prompt is
 * chosen by the decode worker (it knows which prefills hold grants not yet delivered).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_internal.h"
#include "rpc.h"

#define RT_HELLO_MS     2000u
#define RT_RECONNECT_MS 100u
#define RT_FRAME_CAP    (64u << 10)
#define RT_STOP_MS      5000u /* stopping: how long cancelled requests' ENDs are waited for */

enum rstate { R_PENDING = 1, R_SENT = 2, R_ENDED = 3 };

struct kvf_gen {
    KVF__GEN_FIELDS /* the handle (gen.c) */
        /* The loop's. */
        enum rstate state;
    bool cancel_sent;
    uint64_t rid;
    int dec; /* the decode worker it was sent to */
};

struct rdec {
    char host[KVF_PREFILL_HOST_MAX];
    uint16_t port;
    kvf_conn_t *c;
    bool failed, hello_ok;
    uint64_t hello_deadline_ms, next_connect_ms;
    uint32_t failures;
    uint32_t inflight; /* this router's requests sent to it and not yet ended */
    bool have_status;
    struct kvf_rpc_status st;
    char why[KVF_PREFILL_WHY_MAX];
};

struct rframe {
    int dec;
    uint8_t *buf;
    size_t len;
    struct rframe *next;
};

struct kvf_router {
    struct kvf_router_config cfg;
    pthread_t thread;
    bool started;
    atomic_int stop;
    int wake_fd;
    kvf_xport_t *x;
    /* Router side, under mu. */
    pthread_mutex_t mu;
    struct kvf_gen *inbox_head, *inbox_tail;
    uint32_t n_open; /* submitted and not yet ended (the queue bound) */
    bool closing;
    struct kvf_engine_info info;
    struct kvf_worker_status *workers; /* [n_workers] published by the loop */
    size_t n_workers, workers_cap;
    /* Loop side. */
    struct kvf_gen *pending_head, *pending_tail;
    struct kvf_gen *sent; /* every sent request (a list: a few hundred at most) */
    struct rdec decs[KVF_ROUTER_MAX_DECODES];
    struct rframe *fhead, *ftail;
    uint64_t next_rid;
    uint64_t stop_until_ms;
    uint8_t *frame;
    struct kvf_rpc_hello hello;    /* ours, sent to every decode worker */
    struct kvf_rpc_hello hello_in; /* room for theirs */
    struct kvf_rpc_status status;
    uint64_t bad_frames;
};

/* The loop's clock is the transport's (the simulator's in manual mode). */
static uint64_t now_ms(const struct kvf_router *r)
{
    return r->x ? kvf_xport_now_ms(r->x) : kvf__now_ms();
}

/* --- Handles (any thread; the handle itself is gen.c's). ------------------------------------ */

/* Puts g in the inbox (kvf__gen_admit_fn), unless the router is closing or its queue is full. */
static int gen_admit(void *e, struct kvf_gen *g)
{
    struct kvf_router *r = e;
    g->dec = -1;
    pthread_mutex_lock(&r->mu);
    int rc = r->closing ? -ESHUTDOWN : r->n_open >= r->cfg.max_queue ? -EAGAIN : 0;
    if (rc == 0) {
        kvf__gen_enqueue(&r->inbox_head, &r->inbox_tail, g, now_ms(r));
        r->n_open++;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static int gen_submit(void *e, const struct kvf_gen_params *p, kvf_gen_t **out)
{
    struct kvf_router *r = e;
    return kvf__gen_submit(p, r->cfg.n_vocab, r->cfg.max_context, sizeof(struct kvf_gen), gen_admit,
                           r, r->wake_fd, out);
}

static void gen_info(void *e, struct kvf_engine_info *out)
{
    struct kvf_router *r = e;
    pthread_mutex_lock(&r->mu);
    *out = r->info;
    pthread_mutex_unlock(&r->mu);
}

static size_t gen_workers(void *e, struct kvf_worker_status *out, size_t max)
{
    struct kvf_router *r = e;
    pthread_mutex_lock(&r->mu);
    size_t n = r->n_workers; /* 0 (workers NULL) until the loop first publishes */
    if (n) memcpy(out, r->workers, (n < max ? n : max) * sizeof(*out));
    pthread_mutex_unlock(&r->mu);
    return n;
}

const struct kvf_gen_ops kvf_router_gen_ops = {gen_submit,       kvf__gen_next, kvf__gen_cancel,
                                               kvf__gen_release, gen_info,      gen_workers,
                                               kvf__gen_prov};

/* --- Loop side. ------------------------------------------------------------------------------ */

/* END for g (if it has none yet), and the loop lets go of it. g is off every list already. */
static void end_gen(struct kvf_router *r, struct kvf_gen *g, int err, bool stopped)
{
    struct kvf_gen_event ev = {.kind = KVF_GEN_END, .err = err, .stopped = stopped};
    kvf__evq_push(&g->q, &ev);
    if (g->dec >= 0 && g->state == R_SENT) r->decs[g->dec].inflight--;
    g->state = R_ENDED;
    pthread_mutex_lock(&r->mu);
    r->n_open--;
    pthread_mutex_unlock(&r->mu);
    kvf__gen_unref(g);
}

static int dec_of(const struct kvf_router *r, const kvf_conn_t *c)
{
    for (uint32_t i = 0; i < r->cfg.n_decodes; i++)
        if (r->decs[i].c == c) return (int)i;
    return -1;
}

static void on_frame(void *ctx, kvf_conn_t *c, const uint8_t *buf, size_t len)
{
    struct kvf_router *r = ctx;
    int d = dec_of(r, c);
    if (d < 0) return;
    struct rframe *f = malloc(sizeof(*f));
    if (!f || !(f->buf = malloc(len ? len : 1))) {
        free(f);
        r->decs[d].failed = true; /* a lost token cannot be told apart: drop the connection */
        return;
    }
    memcpy(f->buf, buf, len);
    f->len = len;
    f->dec = d;
    f->next = NULL;
    if (r->ftail)
        r->ftail->next = f;
    else
        r->fhead = f;
    r->ftail = f;
}

/* host:port, a name or an IPv4/IPv6 address: nothing a log line or a record could be forged
 * with (no space, no '=', no control character). */
static bool addr_chars_ok(const char *a)
{
    for (; *a; a++)
        if (!((*a >= 'a' && *a <= 'z') || (*a >= 'A' && *a <= 'Z') || (*a >= '0' && *a <= '9') ||
              *a == '.' || *a == ':' || *a == '-' || *a == '_' || *a == '[' || *a == ']'))
            return false;
    return true;
}

static void on_error(void *ctx, kvf_conn_t *c, int err)
{
    struct kvf_router *r = ctx;
    (void)err;
    int d = dec_of(r, c);
    if (d >= 0) r->decs[d].failed = true;
}

static void send_bytes(struct kvf_router *r, struct rdec *d, long n)
{
    if (n < 0 || d->failed || !d->c) return;
    if (kvf_conn_send(d->c, r->frame, (size_t)n) < 0) d->failed = true;
}

static struct kvf_gen *take_sent(struct kvf_router *r, int dec, uint64_t rid, bool remove)
{
    for (struct kvf_gen **pg = &r->sent; *pg; pg = &(*pg)->next) {
        struct kvf_gen *g = *pg;
        if (g->rid != rid || g->dec != dec) continue;
        if (remove) *pg = g->next;
        return g;
    }
    return NULL;
}

static void handle_frame(struct kvf_router *r, int di, const uint8_t *buf, size_t len)
{
    struct rdec *d = &r->decs[di];
    struct kvf_rpc_msg m;
    if (d->failed) return;
    if (kvf_rpc_decode(buf, len, &m, NULL, 0, &r->hello_in, &r->status) < 0) {
        r->bad_frames++;
        d->failed = true; /* a decode worker that sends what does not decode is dropped */
        return;
    }
    if (m.type == KVF_RPC_HELLO_D && !d->hello_ok) {
        const struct kvf_rpc_hello *h = m.hello;
        char why[KVF_PREFILL_WHY_MAX - 16] = "";
        if (h->status)
            kvf__strlcpy(why, h->why[0] ? h->why : kvf_strerror(h->status), sizeof why);
        else if (h->model_fp != r->cfg.model_fp)
            snprintf(why, sizeof why, "model fingerprint %016llx there, %016llx here",
                     (unsigned long long)h->model_fp, (unsigned long long)r->cfg.model_fp);
        else if (h->max_context != r->cfg.max_context)
            snprintf(why, sizeof why, "context limit %u there, %u here", h->max_context,
                     r->cfg.max_context);
        else if (h->page_tokens != r->cfg.page_tokens || h->n_vocab != r->cfg.n_vocab)
            snprintf(why, sizeof why, "page size %u / vocabulary %u there, %u / %u here",
                     h->page_tokens, h->n_vocab, r->cfg.page_tokens, r->cfg.n_vocab);
        if (why[0]) {
            char full[KVF_PREFILL_WHY_MAX + 16];
            snprintf(full, sizeof full, "refused: %s", why);
            if (strcmp(full, d->why) != 0)
                kvf_log(KVF_LOG_WARN, "kvfence router: not using the decode worker at %s:%u: %s\n",
                        d->host, d->port, why);
            kvf__strlcpy(d->why, full, sizeof d->why);
            d->failed = true;
            return;
        }
        d->hello_ok = true;
        d->failures = 0;
        d->why[0] = 0;
        kvf_log(KVF_LOG_INFO, "kvfence router: decode worker %s:%u is up\n", d->host, d->port);
        return;
    }
    if (!d->hello_ok) {
        d->failed = true;
        return;
    }
    switch (m.type) {
    case KVF_RPC_STATUS:
        d->st = *m.status;
        d->have_status = true;
        break;
    case KVF_RPC_PROV: {
        /* The decode worker's record of the handoff it verified, kept on the handle; the router
         * adds which decode worker it is. A record that does not describe this request (its
         * tenant, its prompt) or names its prefill in anything but address characters is
         * dropped: it would reach the router's log lines and the operator's records. */
        struct kvf_gen *g = take_sent(r, di, m.rid, false);
        if (!g) break;
        if (m.prov.tenant != g->p.tenant || m.prov.tokens_granted != g->p.n_prompt ||
            !addr_chars_ok(m.prov.prefill_addr)) {
            r->bad_frames++;
            break;
        }
        snprintf(m.prov.decode_addr, sizeof m.prov.decode_addr, "%s:%u", d->host, d->port);
        kvf__gen_set_prov(g, &m.prov);
        break;
    }
    case KVF_RPC_TOKEN: {
        struct kvf_gen *g = take_sent(r, di, m.rid, false);
        if (g) kvf__evq_push(&g->q, &m.ev);
        break;
    }
    case KVF_RPC_END: {
        struct kvf_gen *g = take_sent(r, di, m.rid, true);
        if (g) end_gen(r, g, m.ev.err, m.ev.stopped);
        break;
    }
    default:
        r->bad_frames++;
        d->failed = true;
        break;
    }
}

static void connect_dec(struct kvf_router *r, int di)
{
    struct rdec *d = &r->decs[di];
    char err[256] = "";
    if (kvf_xport_connect(r->x, d->host, d->port, &d->c, err, sizeof err) < 0) {
        d->c = NULL;
        snprintf(d->why, sizeof d->why, "cannot connect: %s", err);
        d->next_connect_ms = now_ms(r) + RT_RECONNECT_MS * 5;
        return;
    }
    d->failed = false;
    d->hello_ok = false;
    d->have_status = false;
    d->hello_deadline_ms = now_ms(r) + RT_HELLO_MS;
    send_bytes(r, d, kvf_rpc_put_hello(r->frame, RT_FRAME_CAP, KVF_RPC_HELLO_R, &r->hello));
}

/* The connection failed or was refused: its requests end (502), and it is tried again. */
static void dec_lost(struct kvf_router *r, int di)
{
    struct rdec *d = &r->decs[di];
    if (d->hello_ok) {
        snprintf(d->why, sizeof d->why, "connection lost");
        kvf_log(KVF_LOG_WARN, "kvfence router: lost the decode worker %s:%u; its requests fail\n",
                d->host, d->port);
    } else if (d->c && kvf_conn_failed(d->c) && strstr(kvf_conn_error(d->c), "authentication")) {
        /* Said once per change: a router with the wrong cluster key retries every few seconds. */
        if (strcmp(d->why, kvf_conn_error(d->c)) != 0)
            kvf_log(KVF_LOG_WARN, "kvfence router: not using the decode worker at %s:%u: %s\n",
                    d->host, d->port, kvf_conn_error(d->c));
        kvf__strlcpy(d->why, kvf_conn_error(d->c), sizeof d->why);
    } else if (!d->why[0] || strncmp(d->why, "refused", 7) != 0) {
        snprintf(d->why, sizeof d->why, "no answer to HELLO within %u ms", RT_HELLO_MS);
    }
    for (struct kvf_gen **pg = &r->sent; *pg;) {
        struct kvf_gen *g = *pg;
        if (g->dec != di) {
            pg = &g->next;
            continue;
        }
        *pg = g->next;
        end_gen(r, g, KVF_E_PROTO_PEER_DOWN, false);
    }
    if (d->c) kvf_conn_close(d->c);
    d->c = NULL;
    d->hello_ok = false;
    d->failed = false;
    d->have_status = false;
    uint32_t f = d->failures < 5 ? d->failures : 5;
    d->failures++;
    uint64_t wait = (uint64_t)RT_RECONNECT_MS << f;
    d->next_connect_ms = now_ms(r) + (wait < 2000 ? wait : 2000);
}

static void take_inbox(struct kvf_router *r)
{
    pthread_mutex_lock(&r->mu);
    struct kvf_gen *g = r->inbox_head;
    r->inbox_head = r->inbox_tail = NULL;
    pthread_mutex_unlock(&r->mu);
    while (g) {
        struct kvf_gen *next = g->next;
        g->next = NULL;
        g->state = R_PENDING;
        if (r->pending_tail)
            r->pending_tail->next = g;
        else
            r->pending_head = g;
        r->pending_tail = g;
        g = next;
    }
}

static int pick_dec(const struct kvf_router *r)
{
    int best = -1;
    for (uint32_t i = 0; i < r->cfg.n_decodes; i++) {
        const struct rdec *d = &r->decs[i];
        if (!d->hello_ok || (d->have_status && !d->st.info.prefill_up)) continue;
        if (best < 0) {
            best = (int)i;
            continue;
        }
        const struct rdec *b = &r->decs[best];
        uint32_t fa = d->st.info.decode_free, fb = b->st.info.decode_free;
        if (d->inflight < b->inflight || (d->inflight == b->inflight && fa > fb)) best = (int)i;
    }
    return best;
}

static bool any_dec_up(const struct kvf_router *r)
{
    for (uint32_t i = 0; i < r->cfg.n_decodes; i++)
        if (r->decs[i].hello_ok) return true;
    return false;
}

/* Pending requests go to decode workers, oldest first; a cancelled one ends at once (nothing
 * of it moved yet), one that waited too long for a live decode worker fails, saying what was
 * missing: KVF_E_ENGINE_NO_DECODE (no decode worker connected) or KVF_E_ENGINE_NO_PREFILL
 * (decode workers connected, none of them with a live prefill). */
static void admit(struct kvf_router *r)
{
    uint64_t now = now_ms(r);
    while (r->pending_head) {
        struct kvf_gen *g = r->pending_head;
        int err = 0, d = -1;
        if (kvf__gen_cancelled(g))
            err = KVF_E_PROTO_CANCELLED;
        else if (atomic_load(&r->stop))
            err = -ESHUTDOWN;
        else if ((d = pick_dec(r)) < 0 && now - g->since_ms > r->cfg.admit_timeout_ms)
            err = any_dec_up(r) ? KVF_E_ENGINE_NO_PREFILL : KVF_E_ENGINE_NO_DECODE;
        if (!err && d < 0) break; /* FIFO: wait for a decode worker */
        r->pending_head = g->next;
        if (!r->pending_head) r->pending_tail = NULL;
        g->next = NULL;
        if (err) {
            end_gen(r, g, err, false);
            continue;
        }
        g->rid = ++r->next_rid;
        g->dec = d;
        g->state = R_SENT;
        r->decs[d].inflight++;
        g->next = r->sent;
        r->sent = g;
        long n = kvf_rpc_put_submit(r->frame, RT_FRAME_CAP, g->rid, &g->p);
        if (n < 0) {
            take_sent(r, d, g->rid, true);
            end_gen(r, g, (int)n, false);
            continue;
        }
        send_bytes(r, &r->decs[d], n);
    }
}

static void handle_cancels(struct kvf_router *r)
{
    for (struct kvf_gen *g = r->sent; g; g = g->next) {
        if (g->cancel_sent || (!kvf__gen_cancelled(g) && !atomic_load(&r->stop))) continue;
        g->cancel_sent = true;
        send_bytes(r, &r->decs[g->dec], kvf_rpc_put_cancel(r->frame, RT_FRAME_CAP, g->rid));
    }
}

static void publish(struct kvf_router *r)
{
    struct kvf_engine_info in;
    memset(&in, 0, sizeof in);
    in.n_vocab = r->cfg.n_vocab;
    in.served_limit = r->cfg.max_context;
    in.page_tokens = r->cfg.page_tokens;
    in.decodes = r->cfg.n_decodes;
    for (uint32_t i = 0; i < r->cfg.n_decodes; i++) {
        const struct rdec *d = &r->decs[i];
        if (!d->hello_ok) continue;
        in.decodes_up++;
        if (!d->have_status) continue;
        const struct kvf_engine_info *s = &d->st.info;
        in.decode_pages += s->decode_pages;
        in.decode_free += s->decode_free;
        in.decode_reserved += s->decode_reserved;
        for (int k = 0; k < 5; k++)
            in.decode_by_state[k] += s->decode_by_state[k];
        in.queued += s->queued;
        in.running += s->running;
        in.prefill_up |= s->prefill_up;
        in.fences += s->fences;
        in.verify_failed += s->verify_failed;
        in.verify_count += s->verify_count;
        in.verify_trailer += s->verify_trailer;
        in.verify_checksum += s->verify_checksum;
        in.stale_msgs += s->stale_msgs;
        in.rejected_before_handoff += s->rejected_before_handoff;
        in.holds += s->holds;
        in.quarantines += s->quarantines;
        in.committed += s->committed;
        in.failed += s->failed;
        in.foreign_tails += s->foreign_tails;
        in.hash_slices += s->hash_slices;
        in.bad_frames += s->bad_frames;
        in.decoded_tokens += s->decoded_tokens;
    }
    in.bad_frames += r->bad_frames;
    /* Prefill workers: each configured one, up when some live decode worker holds it up. */
    in.prefills = r->cfg.n_prefills;
    pthread_mutex_lock(&r->mu);
    if (r->workers_cap < r->cfg.n_decodes + r->cfg.n_prefills) {
        size_t cap = r->cfg.n_decodes + r->cfg.n_prefills;
        struct kvf_worker_status *w = realloc(r->workers, cap * sizeof(*w));
        if (w) {
            r->workers = w;
            r->workers_cap = cap;
        }
    }
    size_t n = 0;
    for (uint32_t i = 0; i < r->cfg.n_decodes && n < r->workers_cap; i++, n++) {
        const struct rdec *d = &r->decs[i];
        struct kvf_worker_status *w = &r->workers[n];
        memset(w, 0, sizeof *w);
        snprintf(w->role, sizeof w->role, "decode");
        kvf__strlcpy(w->host, d->host, sizeof w->host);
        w->port = d->port;
        w->up = d->hello_ok;
        kvf__strlcpy(w->why, d->hello_ok ? "" : d->why[0] ? d->why : "connecting", sizeof w->why);
        if (d->hello_ok && d->have_status) {
            w->pages = d->st.info.decode_pages;
            w->free_pages = d->st.info.decode_free;
            w->running = d->st.info.running;
            w->queued = d->st.info.queued;
            w->committed = d->st.info.committed;
            w->info = d->st.info;
        }
    }
    for (uint32_t k = 0; k < r->cfg.n_prefills && n < r->workers_cap; k++, n++) {
        struct kvf_worker_status *w = &r->workers[n];
        memset(w, 0, sizeof *w);
        snprintf(w->role, sizeof w->role, "prefill");
        kvf__strlcpy(w->host, r->hello.prefills[k].host, sizeof w->host);
        w->port = r->hello.prefills[k].port;
        snprintf(w->why, sizeof w->why, "no live decode worker reports it");
        for (uint32_t i = 0; i < r->cfg.n_decodes; i++) {
            const struct rdec *d = &r->decs[i];
            if (!d->hello_ok || !d->have_status) continue;
            for (uint32_t j = 0; j < d->st.n_prefills; j++) {
                const struct kvf_prefill_status *p = &d->st.prefills[j];
                if (p->port != w->port || strcmp(p->host, w->host) != 0) continue;
                w->granted += p->granted;
                if (p->up && !w->up) {
                    w->up = true;
                    w->why[0] = 0;
                    snprintf(w->via, sizeof w->via, "%s:%u", d->host, d->port);
                } else if (!p->up && !w->up) {
                    snprintf(w->why, sizeof w->why, "%s (from the decode worker %s:%u)", p->why,
                             d->host, d->port);
                }
            }
        }
        in.prefills_up += w->up;
    }
    r->n_workers = n;
    in.prefill_up = in.prefill_up && in.decodes_up > 0;
    r->info = in;
    pthread_mutex_unlock(&r->mu);
}

/* One turn of the loop: everything ready now, without waiting; true once it stopped. */
static bool turn(struct kvf_router *r)
{
    {
        uint64_t now = now_ms(r);
        bool stop = atomic_load(&r->stop);
        for (uint32_t i = 0; i < r->cfg.n_decodes; i++)
            if (!r->decs[i].c && now >= r->decs[i].next_connect_ms && !stop) connect_dec(r, (int)i);
        kvf_xport_progress(r->x);
        while (r->fhead) {
            struct rframe *f = r->fhead;
            r->fhead = f->next;
            if (!r->fhead) r->ftail = NULL;
            handle_frame(r, f->dec, f->buf, f->len);
            free(f->buf);
            free(f);
        }
        for (uint32_t i = 0; i < r->cfg.n_decodes; i++) {
            struct rdec *d = &r->decs[i];
            if (d->c && !d->hello_ok && now >= d->hello_deadline_ms) d->failed = true;
            if (d->c && d->failed) dec_lost(r, (int)i);
        }
        take_inbox(r);
        handle_cancels(r);
        admit(r);
        publish(r);
        /* Stopping: every sent request was cancelled; their ENDs come back, or their decode
         * worker is lost, or (a hung worker) the wait ends and destroy ends them here. */
        if (stop && !r->stop_until_ms) r->stop_until_ms = now + RT_STOP_MS;
        if (stop && ((!r->pending_head && !r->sent) || now >= r->stop_until_ms)) return true;
    }
    return false;
}

static void *loop(void *arg)
{
    struct kvf_router *r = arg;
    while (!turn(r))
        kvf__loop_wait(r->x, r->wake_fd, 50);
    return NULL;
}

int kvf_router_turn(kvf_router_t *r)
{
    if (!r->cfg.manual) return -EINVAL;
    return turn(r) ? 1 : 0;
}

/* --- Start and stop. ------------------------------------------------------------------------- */

static void destroy(struct kvf_router *r)
{
    for (uint32_t i = 0; i < r->cfg.n_decodes; i++)
        if (r->decs[i].c) kvf_conn_close(r->decs[i].c);
    while (r->sent) {
        struct kvf_gen *g = r->sent;
        r->sent = g->next;
        end_gen(r, g, -ESHUTDOWN, false);
    }
    take_inbox(r);
    while (r->pending_head) {
        struct kvf_gen *g = r->pending_head;
        r->pending_head = g->next;
        end_gen(r, g, -ESHUTDOWN, false);
    }
    while (r->fhead) {
        struct rframe *f = r->fhead;
        r->fhead = f->next;
        free(f->buf);
        free(f);
    }
    if (r->x) kvf_xport_destroy(r->x);
    if (r->wake_fd >= 0) close(r->wake_fd);
    free(r->frame);
    free(r->workers);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

int kvf_router_start(const struct kvf_router_config *cfg, kvf_router_t **out, char *err,
                     size_t err_len)
{
    if (cfg->n_decodes == 0 || cfg->n_decodes > KVF_ROUTER_MAX_DECODES || cfg->n_prefills == 0 ||
        cfg->n_prefills > KVF_DECODE_MAX_PREFILLS) {
        snprintf(err, err_len, "a router needs 1 to %d decode and 1 to %d prefill workers",
                 KVF_ROUTER_MAX_DECODES, KVF_DECODE_MAX_PREFILLS);
        return -EINVAL;
    }
    struct kvf_router *r = calloc(1, sizeof(*r));
    if (!r) return -ENOMEM;
    pthread_mutex_init(&r->mu, NULL);
    r->cfg = *cfg;
    if (!r->cfg.max_queue) r->cfg.max_queue = 256;
    if (!r->cfg.admit_timeout_ms) r->cfg.admit_timeout_ms = 30000;
    r->wake_fd = kvf__wake_open();
    r->frame = malloc(RT_FRAME_CAP > kvf_rpc_submit_bytes(cfg->max_context)
                          ? RT_FRAME_CAP
                          : kvf_rpc_submit_bytes(cfg->max_context));
    int rc = r->wake_fd < 0 ? r->wake_fd : r->frame ? 0 : -ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < cfg->n_decodes; i++) {
        if (strlen(cfg->decode_hosts[i]) >= KVF_PREFILL_HOST_MAX) rc = -EINVAL;
        kvf__strlcpy(r->decs[i].host, cfg->decode_hosts[i], sizeof r->decs[i].host);
        r->decs[i].port = cfg->decode_ports[i];
    }
    r->hello = (struct kvf_rpc_hello){.model_fp = cfg->model_fp,
                                      .max_context = cfg->max_context,
                                      .page_tokens = cfg->page_tokens,
                                      .n_prefills = cfg->n_prefills};
    for (uint32_t i = 0; rc == 0 && i < cfg->n_prefills; i++) {
        if (strlen(cfg->prefill_hosts[i]) >= KVF_PREFILL_HOST_MAX) rc = -EINVAL;
        kvf__strlcpy(r->hello.prefills[i].host, cfg->prefill_hosts[i], KVF_PREFILL_HOST_MAX);
        r->hello.prefills[i].port = cfg->prefill_ports[i];
    }
    if (rc < 0)
        snprintf(err, err_len,
                 rc == -EINVAL ? "a worker's host name is too long" : "out of memory");
    /* Host names are copied (decs, the HELLO); the config's arrays are the caller's. */
    r->cfg.decode_hosts = r->cfg.prefill_hosts = NULL;
    r->cfg.decode_ports = r->cfg.prefill_ports = NULL;
    if (rc == 0) {
        struct kvf_xport_config xc = {NULL,
                                      0,
                                      cfg->keepalive_ms,
                                      NULL,
                                      0,
                                      cfg->fabric_key,
                                      cfg->transport,
                                      cfg->transport_ctx};
        struct kvf_xport_events ev = {r, NULL, on_frame, NULL, on_error};
        rc = kvf_xport_create(&xc, &ev, &r->x, err, err_len);
    }
    if (rc == 0 && !cfg->manual && (rc = -pthread_create(&r->thread, NULL, loop, r)) < 0)
        snprintf(err, err_len, "cannot start the router thread");
    if (rc < 0) {
        destroy(r);
        return rc;
    }
    r->started = !cfg->manual;
    *out = r;
    return 0;
}

void kvf_router_stop(kvf_router_t *r, uint64_t grace_ms)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->closing = true;
    pthread_mutex_unlock(&r->mu);
    if (r->cfg.manual) { /* the caller ran the turns it wanted: what is left ends here */
        atomic_store(&r->stop, 1);
        destroy(r);
        return;
    }
    uint64_t until = kvf__now_ms() + grace_ms;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        uint32_t open = r->n_open;
        pthread_mutex_unlock(&r->mu);
        if (open == 0 || kvf__now_ms() >= until) break;
        usleep(10000);
    }
    /* The rest are cancelled (CANCEL to their decode workers); the loop exits once every END
     * came back or its decode worker was lost. */
    atomic_store(&r->stop, 1);
    kvf__wake(r->wake_fd);
    if (r->started) pthread_join(r->thread, NULL);
    destroy(r);
}
