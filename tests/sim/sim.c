/*
 * sim.c — one simulated world per seed (see sim.h), and the invariants checked after every step:
 *
 *   I1  a request reads only slots written for it: at commit and at finish every slot of its
 *       prompt passes the pool's read check and carries its own (request, tag, slot) stamp.
 *   I2  no page is free or reassigned while an unfenced writer has a write in flight to it: every
 *       in-flight write's page is still granted to that writer with that tag (checked at post,
 *       after every step, and when the write lands).
 *   I3  every request ends for its client (first token or a clear error) within a bound.
 *   I4  quiescence: every page free, nothing reserved or granted, no live request on either side,
 *       every source page back; and the pool's and both machines' checkers hold after every step.
 *   I5  a put reads its source page only while the request still holds it (H5).
 *   I6  a request the prefill engine refused before posting anything gets no write at all (H6).
 *   I7  a commit never rests on a writer epoch that has been fenced.
 *   I8  a request whose messages all arrived and whose writer never failed ends its grants by
 *       proof: its pages are never quarantined (a drain proof was not lost, H2).
 */
#include "sim.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kvf_test.h"
#include "kvfence/pool.h"
#include "kvfence/proto.h"

/* World size and timing (virtual milliseconds). */
enum {
    N_PEERS = 2,
    N_PAGES = 24,
    PT = 4,          /* slots per page */
    MAX_REQS = 6,
    MAX_PROMPT = 20, /* ≤ 5 pages */
    MAX_CONTEXT = 40,
    MAX_GRANT = 8,
    N_SRC = 12,
    MAX_WRITES = 128,
    MSG_MAX = 320,
    HB_MS = 100,
    TICK_MS = 50,
    GRANT_TIMEOUT_MS = 2000,
    HOLD_TIMEOUT_MS = 3000,
    END_MS = 200000,
    OUTCOME_BOUND_MS = GRANT_TIMEOUT_MS + 2 * HB_MS + 2 * TICK_MS,
};

enum evk {
    EV_TICK, EV_HB, /* periodic */
    EV_SUBMIT, EV_CANCEL, EV_FINISH, EV_TO_DECODE, EV_TO_PREFILL, EV_PAGE_READY, EV_LOCAL,
    EV_LAND, EV_FLUSH, EV_CLEAR, EV_CRASH, EV_RESTART, EV_HANG, EV_PARTITION, EV_FENCE, EV_RESET,
    EV_CONNECT,
};
static const char *const ev_names[] = {
    "tick", "heartbeat", "submit", "client-cancel", "finish", "msg->decode", "msg->prefill",
    "page-ready", "put-local-done", "put-lands", "flush-done", "prefill-clear", "crash",
    "restart", "hang", "partition", "fence", "prefill-reset", "connect",
};

struct ev {
    uint64_t t, seq;
    enum evk kind;
    int peer, ridx, w;
    uint32_t gen, index, epoch, len;
    uint64_t nonce;
    uint8_t bytes[MSG_MAX];
};

struct sreq {
    kvf_req_id_t id;
    uint32_t tenant, prompt, max_tokens;
    int writer;
    bool submitted, dropped_by_client, outcome, ok, running, finished;
    uint64_t submit_t, outcome_t;
    int err;
    bool faulted;        /* a message of it was lost or late, or its writer failed */
    bool refuse, refused; /* the prefill engine refuses it (by plan / did, before any post) */
    int fail_at;         /* page index at which the prefill engine fails it, or -1 */
    bool forge;          /* the engine writes one token fewer and says so */
    bool corrupt;        /* a landed byte of it is flipped */
    bool early_clear;    /* the prefill engine gives up on it */
    bool job_aborted;
    uint64_t nonce;
    uint32_t epoch, n_pages;
    struct kvf_page_ref pages[MAX_GRANT];
};

struct src {
    bool used;
    int ridx;
    uint64_t nonce;
    uint32_t index;
    uint8_t data[64];
};

struct speer {
    kvf_prefill_t *sm;
    bool alive, connected, decode_up;
    uint32_t epoch, gen;
    uint64_t hung_until, part_until, fault_since;
    bool hang_hb;        /* heartbeats keep flowing while hung */
    bool faulty;         /* crashed, partitioned, or hung without heartbeats */
    uint32_t n_src;
    struct src src[N_SRC];
};

/* A put: `live` while its record is in use (until both its local completion and its landing
 * have been handled); in flight while live, not landed and not dropped. */
struct swrite {
    bool live, captured, landed, dropped, local_done, land_done;
    int peer, ridx, src;
    uint32_t epoch, gen, index, slots, trailer_slots;
    uint64_t nonce, checksum, land_t;
    struct kvf_page_ref dst;
    uint8_t data[64];
};

struct world {
    struct kvf_rng rng;
    FILE *trace;
    uint64_t now, seq, steps;
    struct ev *heap;
    size_t n_ev, cap_ev, n_nonperiodic;
    kvf_pool_t *pool;
    kvf_decode_t *dec;
    size_t data_bytes, trailer_off;
    struct speer peer[N_PEERS];
    struct sreq req[MAX_REQS];
    int n_req;
    struct swrite w[MAX_WRITES];
    struct kvf_action abuf[64];
    struct kvf_actions acts;
    double p_drop, p_dup, p_late;
    uint64_t quarantines_seen;
    bool failed;
    char why[512];
    struct sim_result *res;
};

static void trace(struct world *W, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(struct world *W, const char *fmt, ...)
{
    if (!W->trace) return;
    va_list ap;
    fprintf(W->trace, "t=%6" PRIu64 "  ", W->now);
    va_start(ap, fmt);
    vfprintf(W->trace, fmt, ap);
    va_end(ap);
    fputc('\n', W->trace);
}

static void violate(struct world *W, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violate(struct world *W, const char *fmt, ...)
{
    if (W->failed) return;
    W->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(W->why, sizeof(W->why), fmt, ap);
    va_end(ap);
    trace(W, "VIOLATION: %s", W->why);
}

static uint32_t rnd(struct world *W, uint32_t lo, uint32_t hi) /* uniform in [lo, hi] */
{
    return lo + kvf_rng_below(&W->rng, hi - lo + 1);
}
static bool chance(struct world *W, double p)
{
    return (double)(kvf_rng_next(&W->rng) >> 11) * 0x1p-53 < p;
}

/* --- The event queue: a binary heap on (time, sequence), so equal times keep their order. --- */

static bool ev_less(const struct ev *a, const struct ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static struct ev *ev_new(struct world *W, uint64_t delay, enum evk kind)
{
    if (W->n_ev == W->cap_ev) {
        W->cap_ev = W->cap_ev ? 2 * W->cap_ev : 256;
        W->heap = realloc(W->heap, W->cap_ev * sizeof(*W->heap));
        if (!W->heap) abort();
    }
    struct ev *e = &W->heap[W->n_ev];
    memset(e, 0, offsetof(struct ev, bytes));
    e->t = W->now + delay;
    e->seq = ++W->seq;
    e->kind = kind;
    e->peer = e->ridx = e->w = -1;
    return e;
}

/* Pushes the event written by ev_new into the heap. */
static void ev_push(struct world *W)
{
    size_t i = W->n_ev++;
    struct ev tmp = W->heap[i];
    if (tmp.kind != EV_TICK && tmp.kind != EV_HB) W->n_nonperiodic++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_less(&tmp, &W->heap[p])) break;
        W->heap[i] = W->heap[p];
        i = p;
    }
    W->heap[i] = tmp;
}

static void ev_pop(struct world *W, struct ev *out)
{
    *out = W->heap[0];
    if (out->kind != EV_TICK && out->kind != EV_HB) W->n_nonperiodic--;
    struct ev last = W->heap[--W->n_ev];
    size_t i = 0, n = W->n_ev;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && ev_less(&W->heap[c + 1], &W->heap[c])) c++;
        if (!ev_less(&W->heap[c], &last)) break;
        W->heap[i] = W->heap[c];
        i = c;
    }
    if (n) W->heap[i] = last;
}

/* Re-queues an event for a peer that is hung: it runs when the peer resumes. */
static void defer(struct world *W, const struct ev *e, uint64_t until)
{
    struct ev *n = ev_new(W, 0, e->kind);
    uint64_t seq = n->seq;
    memcpy(n, e, sizeof(*e));
    n->seq = seq;
    n->t = until + rnd(W, 1, 20);
    ev_push(W);
}

/* --- Requests and stamps. ------------------------------------------------------------------ */

static int find_req(struct world *W, kvf_req_id_t id)
{
    for (int i = 0; i < W->n_req; i++)
        if (kvf_req_id_eq(W->req[i].id, id)) return i;
    return -1;
}

static uint32_t page_slots(uint32_t tokens, uint32_t i)
{
    uint32_t start = i * PT;
    uint32_t left = tokens > start ? tokens - start : 0;
    return left < PT ? left : PT;
}

/* The 8-byte stamp a slot carries when written for (request, tag): in its K and in its V block. */
static uint64_t stamp(kvf_req_id_t id, uint64_t tag, uint32_t slot)
{
    uint64_t x = id.lo ^ (id.hi * 0x9e3779b97f4a7c15ull) ^ (tag << 8) ^ slot;
    return kvf_rng__splitmix(&x);
}
static void put_stamp(uint8_t *data, uint32_t slot, uint64_t v)
{
    memcpy(data + slot * 8, &v, 8);           /* K block: bytes [0, 32) */
    memcpy(data + 32 + slot * 8, &v, 8);      /* V block: bytes [32, 64) */
}

static bool ended(const struct sreq *r)
{
    return r->outcome && (!r->running || r->finished);
}

/* Marks every live request of a failing peer: its grants may now end by fence, not proof. */
static void fault_peer_requests(struct world *W, int p)
{
    for (int i = 0; i < W->n_req; i++)
        if (W->req[i].submitted && W->req[i].writer == p &&
            (!ended(&W->req[i]) || kvf_decode_req_state(W->dec, W->req[i].id) != KVF_DREQ_NONE))
            W->req[i].faulted = true;
}

/* I1: every slot of the prompt reads back as written for this request. */
static void read_all(struct world *W, int ri, const char *when)
{
    struct sreq *r = &W->req[ri];
    for (uint32_t i = 0; i < r->n_pages; i++) {
        const uint8_t *d = kvf_pool_page_data(W->pool, r->pages[i].page);
        for (uint32_t s = 0; s < page_slots(r->prompt, i); s++) {
            int rc = kvf_pool_read_check(W->pool, r->pages[i].page, r->pages[i].tag, s);
            if (rc < 0) {
                violate(W, "I1: request %d at %s cannot read slot %u of page %u (%s): it runs "
                           "without its prompt's KV", ri, when, s, r->pages[i].page, kvf_strerror(rc));
                return;
            }
            uint64_t want = stamp(r->id, r->pages[i].tag, s), k, v;
            memcpy(&k, d + s * 8, 8);
            memcpy(&v, d + 32 + s * 8, 8);
            if (k != want || v != want) {
                violate(W, "I1: request %d at %s reads slot %u of page %u that was not written for it",
                        ri, when, s, r->pages[i].page);
                return;
            }
        }
    }
}

/* I2 for one write: its page is still granted to its writer with its tag. */
static void check_write_target(struct world *W, const struct swrite *w, const char *when)
{
    struct kvf_page_info pi;
    if (kvf_pool_page_info(W->pool, w->dst.page, &pi) < 0) {
        violate(W, "I2: write %s to page %u out of range", when, w->dst.page);
        return;
    }
    if (pi.tag != w->dst.tag || !pi.granted || pi.grant.peer != w->peer || pi.grant.epoch != w->epoch)
        violate(W, "I2: write of request %d (peer %d epoch %u) %s page %u, which is %s with tag %" PRIu64
                   " (write's tag %" PRIu64 "), grant %s to peer %u epoch %u",
                w->ridx, w->peer, w->epoch, when, w->dst.page, kvf_page_state_name(pi.state), pi.tag,
                w->dst.tag, pi.granted ? "held" : "none", pi.grant.peer, pi.grant.epoch);
}

/* --- The network. -------------------------------------------------------------------------- */

static void net_send(struct world *W, int peer, bool to_decode, const struct kvf_msg *m)
{
    uint8_t buf[MSG_MAX];
    long n = kvf_msg_encode(m, buf, sizeof(buf));
    if (n < 0) {
        violate(W, "encode of %s failed: %s", kvf_msg_type_name(m->type), kvf_strerror((int)n));
        return;
    }
    int ri = find_req(W, m->req);
    trace(W, "  send %s %s peer %d req %d nonce %" PRIu64 " epoch %u", kvf_msg_type_name(m->type),
          to_decode ? "->decode from" : "->prefill", peer, ri, m->nonce, m->epoch);
    int copies = chance(W, W->p_dup) ? 2 : 1;
    for (int c = 0; c < copies; c++) {
        if (chance(W, W->p_drop)) {
            trace(W, "  (dropped)");
            if (ri >= 0) W->req[ri].faulted = true;
            continue;
        }
        uint64_t delay = rnd(W, 1, 40);
        if (chance(W, W->p_late)) {
            delay = rnd(W, 100, 1500);
            if (ri >= 0) W->req[ri].faulted = true;
        }
        struct ev *e = ev_new(W, delay, to_decode ? EV_TO_DECODE : EV_TO_PREFILL);
        e->peer = peer;
        e->len = (uint32_t)n;
        memcpy(e->bytes, buf, (size_t)n);
        ev_push(W);
    }
}

static bool decode_msg(struct world *W, const struct ev *e, struct kvf_msg *m,
                       struct kvf_msg_scratch *s)
{
    long n = kvf_msg_decode(e->bytes, e->len, m, s);
    if (n != (long)e->len) {
        violate(W, "a frame the simulator encoded did not decode: %ld", n);
        return false;
    }
    return true;
}

/* --- Actions of the decode machine. ------------------------------------------------------- */

static void decode_actions(struct world *W)
{
    for (uint32_t i = 0; i < W->acts.n && !W->failed; i++) {
        const struct kvf_action *a = &W->acts.v[i];
        int ri = find_req(W, a->req);
        struct sreq *r = ri >= 0 ? &W->req[ri] : NULL;
        switch (a->kind) {
        case KVF_ACT_SEND:
            if (a->msg.type == KVF_MSG_GRANT && r) {
                r->nonce = a->msg.nonce;
                r->epoch = a->msg.epoch;
                r->n_pages = a->msg.u.grant.n_pages;
                memcpy(r->pages, a->msg.u.grant.pages, r->n_pages * sizeof(r->pages[0]));
            }
            net_send(W, a->peer, false, &a->msg);
            break;
        case KVF_ACT_FENCE_PEER: {
            trace(W, "  decode asks to fence peer %u epoch %u", a->peer, a->epoch);
            struct ev *e = ev_new(W, rnd(W, 1, 30), EV_FENCE);
            e->peer = a->peer;
            e->epoch = a->epoch;
            ev_push(W);
            break;
        }
        case KVF_ACT_DELIVER_FIRST: {
            if (!r) break;
            trace(W, "  req %d committed: first token %u", ri, a->first_token);
            uint32_t cur = 0;
            kvf_pool_peer_epoch(W->pool, (uint16_t)r->writer, &cur);
            if (cur != r->epoch)
                violate(W, "I7: request %d committed on writer epoch %u, which was fenced (now %u)", ri,
                        r->epoch, cur);
            if (r->refused) violate(W, "I6: request %d committed although prefill refused it", ri);
            if (!r->outcome) {
                r->outcome = true;
                r->ok = true;
                r->outcome_t = W->now;
            }
            r->running = true;
            read_all(W, ri, "commit");
            struct ev *e = ev_new(W, rnd(W, 1, 100), EV_FINISH);
            e->ridx = ri;
            ev_push(W);
            break;
        }
        case KVF_ACT_FAIL_REQ:
            if (!r) break;
            trace(W, "  req %d fails: %s", ri, kvf_strerror(a->err));
            if (!r->outcome) {
                r->outcome = true;
                r->err = a->err;
                r->outcome_t = W->now;
            }
            if (r->running) r->finished = true;
            break;
        default: violate(W, "decode emitted action kind %d", (int)a->kind);
        }
    }
    W->acts.n = 0;
}

/* --- The prefill engine: sources, compute, puts, flushes. -------------------------------- */

static void prefill_actions(struct world *W, int p);

static struct src *find_src(struct speer *P, int ri, uint64_t nonce, uint32_t index)
{
    for (uint32_t i = 0; i < P->n_src; i++)
        if (P->src[i].used && P->src[i].ridx == ri && P->src[i].nonce == nonce && P->src[i].index == index)
            return &P->src[i];
    return NULL;
}

static void free_src(struct src *s)
{
    s->used = false;
    memset(s->data, 0xEE, sizeof(s->data)); /* a freed source is reused: its bytes change */
}

static void schedule_page(struct world *W, int p, int ri, uint32_t index)
{
    struct ev *e = ev_new(W, rnd(W, 1, 30), EV_PAGE_READY);
    e->peer = p;
    e->gen = W->peer[p].gen;
    e->ridx = ri;
    e->nonce = W->req[ri].nonce;
    e->index = index;
    ev_push(W);
}

static void post_write(struct world *W, int p, const struct kvf_action *a, int ri)
{
    struct speer *P = &W->peer[p];
    struct sreq *r = &W->req[ri];
    if (r->refused)
        violate(W, "I6: a write was posted for request %d after the prefill engine refused it", ri);
    int wi = -1;
    for (int i = 0; i < MAX_WRITES; i++)
        if (!W->w[i].live) {
            wi = i;
            break;
        }
    if (wi < 0) {
        violate(W, "simulator out of write records");
        return;
    }
    struct swrite *w = &W->w[wi];
    memset(w, 0, sizeof(*w));
    w->live = true;
    w->peer = p;
    w->ridx = ri;
    w->epoch = a->epoch;
    w->gen = P->gen;
    w->index = a->index;
    w->nonce = a->nonce;
    w->dst = a->dst;
    w->slots = a->slots;
    w->trailer_slots = a->slots;
    w->checksum = a->checksum;
    if (r->forge && a->index == r->n_pages - 1) w->trailer_slots = a->slots - 1;
    struct src *s = find_src(P, ri, a->nonce, a->index);
    w->src = s ? (int)(s - P->src) : -1;
    trace(W, "  post put: req %d page %u (tag %" PRIu64 ") index %u epoch %u", ri, a->dst.page,
          a->dst.tag, a->index, a->epoch);
    uint32_t cur = 0;
    kvf_pool_peer_epoch(W->pool, (uint16_t)p, &cur);
    if (cur != a->epoch) {
        /* The writer's endpoint was closed by a fence: the transport refuses the put. */
        trace(W, "  (refused: epoch %u is fenced)", a->epoch);
        w->dropped = true;
    } else {
        check_write_target(W, w, "posted to");
    }
    uint64_t local = rnd(W, 1, 15);
    w->land_t = W->now + local + rnd(W, 0, 100);
    if (chance(W, 0.02)) {
        /* A put that stays in progress far beyond the hold timeout (H14). */
        w->land_t = W->now + local + rnd(W, HOLD_TIMEOUT_MS, 2 * HOLD_TIMEOUT_MS);
        r->faulted = true;
    }
    struct ev *e = ev_new(W, local, EV_LOCAL);
    e->w = wi;
    ev_push(W);
    e = ev_new(W, w->land_t - W->now, EV_LAND);
    e->w = wi;
    ev_push(W);
}

static void prefill_actions(struct world *W, int p)
{
    struct speer *P = &W->peer[p];
    for (uint32_t i = 0; i < W->acts.n && !W->failed; i++) {
        const struct kvf_action *a = &W->acts.v[i];
        int ri = find_req(W, a->req);
        struct sreq *r = ri >= 0 ? &W->req[ri] : NULL;
        switch (a->kind) {
        case KVF_ACT_SEND: {
            struct kvf_msg m = a->msg;
            if (m.type == KVF_MSG_DONE && r && r->forge) m.u.done.tokens_written--;
            net_send(W, p, true, &m);
            if (m.type == KVF_MSG_DONE && r) {
                struct ev *e = ev_new(W, rnd(W, 1, 300), EV_CLEAR);
                e->peer = p;
                e->gen = P->gen;
                e->ridx = ri;
                e->nonce = m.nonce;
                ev_push(W);
            }
            break;
        }
        case KVF_ACT_COMPUTE:
            if (!r) break;
            r->job_aborted = false;
            schedule_page(W, p, ri, 0);
            break;
        case KVF_ACT_ABORT_COMPUTE:
            if (r) r->job_aborted = true;
            break;
        case KVF_ACT_POST_WRITE:
            if (r) post_write(W, p, a, ri);
            break;
        case KVF_ACT_FLUSH: {
            struct ev *e = ev_new(W, rnd(W, 1, 10), EV_FLUSH);
            e->peer = p;
            e->gen = P->gen;
            e->ridx = ri;
            e->nonce = a->nonce;
            ev_push(W);
            break;
        }
        case KVF_ACT_RELEASE_SRC: {
            struct src *s = find_src(P, ri, a->nonce, a->index);
            if (!s) {
                violate(W, "prefill released source %u of request %d, which it does not hold", a->index, ri);
                break;
            }
            free_src(s);
            break;
        }
        default: violate(W, "prefill emitted action kind %d", (int)a->kind);
        }
    }
    W->acts.n = 0;
}

/* --- Event handlers. ---------------------------------------------------------------------- */

static void on_submit(struct world *W, int ri)
{
    struct sreq *r = &W->req[ri];
    if (r->dropped_by_client) return;
    int up[N_PEERS], n_up = 0;
    for (int p = 0; p < N_PEERS; p++)
        if (W->peer[p].decode_up) up[n_up++] = p;
    if (n_up == 0) {
        struct ev *e = ev_new(W, 50, EV_SUBMIT);
        e->ridx = ri;
        ev_push(W);
        return;
    }
    int p = up[rnd(W, 0, (uint32_t)n_up - 1)];
    r->writer = p;
    r->submitted = true;
    r->submit_t = W->now;
    struct speer *P = &W->peer[p];
    if (P->faulty || W->now < P->hung_until || W->now < P->part_until) r->faulted = true;
    struct kvf_msg_new n = {.tenant = r->tenant, .prompt_len = r->prompt, .max_tokens = r->max_tokens};
    trace(W, "req %d submitted to peer %d: prompt %u, max_tokens %u", ri, p, r->prompt, r->max_tokens);
    int rc = kvf_decode_submit(W->dec, W->now, r->id, &n, (uint16_t)p, &W->acts);
    if (rc < 0) violate(W, "kvf_decode_submit: %s", kvf_strerror(rc));
    decode_actions(W);
    if (r->early_clear && r->nonce) {
        struct ev *e = ev_new(W, rnd(W, 1, 300), EV_CLEAR);
        e->peer = p;
        e->gen = P->gen;
        e->ridx = ri;
        e->nonce = r->nonce;
        ev_push(W);
    }
}

static void on_page_ready(struct world *W, const struct ev *e)
{
    struct speer *P = &W->peer[e->peer];
    struct sreq *r = &W->req[e->ridx];
    if (r->job_aborted || e->nonce != r->nonce) return;
    int rc;
    struct src *s = NULL;
    for (uint32_t i = 0; i < P->n_src && !s; i++)
        if (!P->src[i].used) s = &P->src[i];
    bool refuse = (r->refuse && e->index == 0) || (int)e->index == r->fail_at || !s;
    if (refuse) {
        /* The engine refuses (its own pool is exhausted) or fails mid-way. */
        if (e->index == 0) r->refused = true;
        trace(W, "prefill %d: compute of req %d fails at page %u", e->peer, e->ridx, e->index);
        rc = kvf_prefill_compute_failed(P->sm, W->now, r->id, e->nonce, -ENOMEM, &W->acts);
        prefill_actions(W, e->peer);
        return;
    }
    s->used = true;
    s->ridx = e->ridx;
    s->nonce = e->nonce;
    s->index = e->index;
    memset(s->data, 0, sizeof(s->data));
    uint32_t slots = page_slots(r->prompt, e->index);
    if (r->forge && e->index == r->n_pages - 1) slots--;
    for (uint32_t k = 0; k < slots; k++) put_stamp(s->data, k, stamp(r->id, r->pages[e->index].tag, k));
    uint64_t sum = XXH3_64bits(s->data, W->data_bytes);
    trace(W, "prefill %d: page %u of req %d computed", e->peer, e->index, e->ridx);
    rc = kvf_prefill_page_ready(P->sm, W->now, r->id, e->nonce, e->index, sum, 1000u + (uint32_t)e->ridx,
                                &W->acts);
    if (rc < 0) {
        free_src(s); /* never posted: the engine frees it */
        W->acts.n = 0;
        return;
    }
    prefill_actions(W, e->peer);
    if (e->index + 1 < r->n_pages && !r->job_aborted) schedule_page(W, e->peer, e->ridx, e->index + 1);
}

static void write_event_done(struct swrite *w, bool local)
{
    if (local)
        w->local_done = true;
    else
        w->land_done = true;
    if (w->local_done && w->land_done) w->live = false;
}

static bool in_flight(const struct swrite *w)
{
    return w->live && !w->landed && !w->dropped;
}

static void on_local(struct world *W, const struct ev *e)
{
    struct swrite *w = &W->w[e->w];
    struct speer *P = &W->peer[w->peer];
    if (w->gen != P->gen) {
        /* The process is gone; its memory stays as it was, and nobody reuses it. */
        if (w->src >= 0) memcpy(w->data, P->src[w->src].data, sizeof(w->data));
        w->captured = true;
        write_event_done(w, true);
        return;
    }
    if (w->src >= 0 && !w->dropped) {
        struct src *s = &P->src[w->src];
        if (!s->used || s->ridx != w->ridx || s->nonce != w->nonce || s->index != w->index)
            violate(W, "I5: the put of request %d page %u read a source page that was already freed",
                    w->ridx, w->index);
        memcpy(w->data, s->data, sizeof(w->data));
    }
    w->captured = true;
    write_event_done(w, true);
    kvf_prefill_write_local_done(P->sm, W->req[w->ridx].id, w->nonce, w->index, &W->acts);
    prefill_actions(W, w->peer);
}

static void on_land(struct world *W, const struct ev *e)
{
    struct swrite *w = &W->w[e->w];
    if (w->dropped) {
        write_event_done(w, false);
        return;
    }
    struct sreq *r = &W->req[w->ridx];
    check_write_target(W, w, "landed in");
    uint8_t *page = kvf_pool_page_data(W->pool, w->dst.page);
    memcpy(page, w->data, W->data_bytes);
    if (r->corrupt && w->slots > 0) page[3] ^= 0x40; /* one byte of slot 0 flipped in transit */
    struct kvf_page_trailer t;
    memset(&t, 0, sizeof(t));
    t.tag = w->dst.tag;
    t.req = r->id;
    t.tenant = r->tenant;
    t.slots = w->trailer_slots;
    t.checksum = w->checksum;
    t.epoch_nonce = (uint64_t)w->epoch << 32 | (uint32_t)w->nonce;
    memcpy(page + W->trailer_off, &t, sizeof(t));
    w->landed = true;
    write_event_done(w, false);
    trace(W, "  put of req %d lands in page %u", w->ridx, w->dst.page);
}

static void on_flush(struct world *W, const struct ev *e)
{
    struct speer *P = &W->peer[e->peer];
    uint64_t last = 0;
    for (int i = 0; i < MAX_WRITES; i++) {
        const struct swrite *w = &W->w[i];
        if (!w->live || w->landed || w->peer != e->peer || w->ridx != e->ridx || w->nonce != e->nonce)
            continue;
        if (w->dropped) return; /* the endpoint is closed: the flush fails, the peer resets */
        if (w->land_t > last) last = w->land_t;
    }
    if (last) {
        struct ev *n = ev_new(W, last > W->now ? last - W->now + 1 : 5, EV_FLUSH);
        n->peer = e->peer;
        n->gen = e->gen;
        n->ridx = e->ridx;
        n->nonce = e->nonce;
        ev_push(W);
        return;
    }
    trace(W, "prefill %d: flush of req %d complete", e->peer, e->ridx);
    kvf_prefill_flushed(P->sm, W->now, W->req[e->ridx].id, e->nonce, &W->acts);
    prefill_actions(W, e->peer);
}

static void start_fault(struct world *W, int p)
{
    struct speer *P = &W->peer[p];
    P->fault_since = W->now;
    fault_peer_requests(W, p);
}

static void connect_peer(struct world *W, int p)
{
    struct speer *P = &W->peer[p];
    uint32_t epoch = 0;
    kvf_pool_peer_epoch(W->pool, (uint16_t)p, &epoch);
    if (P->decode_up) {
        /* A HELLO from a peer decode still believes connected: the old process is gone, and its
         * endpoint is fenced before the new one is accepted. */
        trace(W, "peer %d says HELLO again: its old connection goes down first", p);
        P->decode_up = false;
        kvf_decode_peer_down(W->dec, W->now, (uint16_t)p, &W->acts);
        decode_actions(W);
    }
    if (P->epoch && epoch <= P->epoch) {
        /* The old connection has not been fenced yet: the decode engine fences it first. */
        struct ev *e = ev_new(W, 100, EV_CONNECT);
        e->peer = p;
        ev_push(W);
        return;
    }
    struct kvf_msg_hello mine = {.model_fp = 0x5eed, .geo = *kvf_pool_geometry(W->pool),
                                 .max_context = MAX_CONTEXT, .max_grant_pages = MAX_GRANT,
                                 .peer = (uint16_t)p, .role = KVF_ROLE_PREFILL};
    struct kvf_msg_hello theirs = mine;
    theirs.role = KVF_ROLE_DECODE;
    if (kvf_proto_hello_check(&theirs, &mine) != 0) violate(W, "HELLO of identical workers refused");
    trace(W, "peer %d connects at epoch %u", p, epoch);
    P->epoch = epoch;
    P->connected = true;
    P->decode_up = true;
    P->faulty = false;
    if (kvf_decode_peer_up(W->dec, (uint16_t)p, epoch) < 0) violate(W, "kvf_decode_peer_up refused");
    kvf_prefill_connect(P->sm, epoch, &W->acts);
    prefill_actions(W, p);
}

static bool peer_busy(struct world *W, const struct ev *e, int p)
{
    /* A hung or partitioned-and-unreachable peer handles nothing: the event waits. */
    struct speer *P = &W->peer[p];
    if (W->now < P->hung_until) {
        defer(W, e, P->hung_until);
        return true;
    }
    return false;
}

static void step(struct world *W, struct ev *e)
{
    W->steps++;
    if (W->trace && e->kind != EV_TICK && e->kind != EV_HB)
        trace(W, "%s peer %d req %d", ev_names[e->kind], e->peer, e->ridx);
    struct kvf_msg m;
    static struct kvf_page_ref s_pages[MAX_GRANT];
    static uint64_t s_sums[MAX_GRANT];
    static uint32_t s_tok[MAX_CONTEXT];
    struct kvf_msg_scratch sc = {s_pages, MAX_GRANT, s_sums, MAX_GRANT, s_tok, MAX_CONTEXT};
    struct speer *P = e->peer >= 0 ? &W->peer[e->peer] : NULL;
    switch (e->kind) {
    case EV_TICK:
        kvf_decode_tick(W->dec, W->now, &W->acts);
        decode_actions(W);
        break;
    case EV_HB:
        for (int p = 0; p < N_PEERS; p++) {
            struct speer *Q = &W->peer[p];
            bool silent = !Q->alive || W->now < Q->part_until || (W->now < Q->hung_until && !Q->hang_hb);
            if (Q->decode_up && silent && W->now - Q->fault_since >= HB_MS) {
                trace(W, "heartbeat lost: peer %d down", p);
                Q->decode_up = false;
                kvf_decode_peer_down(W->dec, W->now, (uint16_t)p, &W->acts);
                decode_actions(W);
            }
        }
        break;
    case EV_SUBMIT: on_submit(W, e->ridx); break;
    case EV_CANCEL: {
        struct sreq *r = &W->req[e->ridx];
        if (!r->submitted) {
            r->dropped_by_client = true;
            break;
        }
        kvf_decode_cancel(W->dec, W->now, r->id, KVF_E_PROTO_CANCELLED, &W->acts);
        decode_actions(W);
        break;
    }
    case EV_FINISH: {
        struct sreq *r = &W->req[e->ridx];
        if (kvf_decode_req_state(W->dec, r->id) != KVF_DREQ_RUNNING) break;
        read_all(W, e->ridx, "finish");
        kvf_decode_finish(W->dec, W->now, r->id, &W->acts);
        r->finished = true;
        decode_actions(W);
        break;
    }
    case EV_TO_DECODE:
        if (W->now < P->part_until) {
            trace(W, "  (lost in partition)");
            if (decode_msg(W, e, &m, &sc) && find_req(W, m.req) >= 0) W->req[find_req(W, m.req)].faulted = true;
            break;
        }
        if (!decode_msg(W, e, &m, &sc)) break;
        trace(W, "  decode receives %s from peer %d epoch %u", kvf_msg_type_name(m.type), e->peer, m.epoch);
        kvf_decode_on_msg(W->dec, W->now, (uint16_t)e->peer, &m, &W->acts);
        decode_actions(W);
        break;
    case EV_TO_PREFILL:
        if (!decode_msg(W, e, &m, &sc)) break;
        if (!P->alive || !P->connected || W->now < P->part_until) {
            trace(W, "  (lost: peer %d unreachable)", e->peer);
            if (find_req(W, m.req) >= 0) W->req[find_req(W, m.req)].faulted = true;
            break;
        }
        if (peer_busy(W, e, e->peer)) break;
        trace(W, "  prefill %d receives %s epoch %u", e->peer, kvf_msg_type_name(m.type), m.epoch);
        kvf_prefill_on_msg(P->sm, W->now, &m, &W->acts);
        prefill_actions(W, e->peer);
        break;
    case EV_PAGE_READY:
        if (e->gen != P->gen) break;
        if (peer_busy(W, e, e->peer)) break;
        on_page_ready(W, e);
        break;
    case EV_LOCAL: {
        struct swrite *w = &W->w[e->w];
        if (w->gen == W->peer[w->peer].gen && peer_busy(W, e, w->peer)) break;
        on_local(W, e);
        break;
    }
    case EV_LAND: {
        struct swrite *w = &W->w[e->w];
        if (!w->dropped && w->gen == W->peer[w->peer].gen && W->now < W->peer[w->peer].hung_until) {
            /* The writer's queued puts resume only when it does. */
            w->land_t = W->peer[w->peer].hung_until + rnd(W, 1, 50);
            defer(W, e, w->land_t - 10);
            break;
        }
        if (!w->captured && !w->dropped) {
            struct ev *n = ev_new(W, 5, EV_LAND);
            n->w = e->w;
            ev_push(W);
            w->land_t = W->now + 5;
            break;
        }
        on_land(W, e);
        break;
    }
    case EV_FLUSH:
        if (e->gen != P->gen) break;
        if (peer_busy(W, e, e->peer)) break;
        on_flush(W, e);
        break;
    case EV_CLEAR:
        if (e->gen != P->gen) break;
        if (peer_busy(W, e, e->peer)) break;
        kvf_prefill_clear(P->sm, W->now, W->req[e->ridx].id, e->nonce, &W->acts);
        prefill_actions(W, e->peer);
        break;
    case EV_CRASH:
        if (!P->alive) break;
        trace(W, "peer %d crashes", e->peer);
        P->alive = false;
        P->connected = false;
        P->gen++;
        P->faulty = true;
        P->hung_until = 0;
        start_fault(W, e->peer);
        break;
    case EV_RESTART: {
        if (P->alive) break;
        kvf_prefill_destroy(P->sm);
        struct kvf_prefill_config pc = {.decode_peer = 0, .max_reqs = 16, .max_grant_pages = MAX_GRANT,
                                        .max_context = MAX_CONTEXT, .page_tokens = PT};
        if (kvf_prefill_create(&pc, &P->sm) < 0) abort();
        memset(P->src, 0, sizeof(P->src));
        P->alive = true;
        P->gen++;
        trace(W, "peer %d restarts", e->peer);
        struct ev *n = ev_new(W, rnd(W, 1, 20), EV_CONNECT);
        n->peer = e->peer;
        ev_push(W);
        break;
    }
    case EV_HANG:
        if (!P->alive) break;
        P->hung_until = W->now + e->epoch; /* duration travels in .epoch */
        P->hang_hb = e->index != 0;
        trace(W, "peer %d hangs for %u ms (%s heartbeats)", e->peer, e->epoch, P->hang_hb ? "with" : "without");
        start_fault(W, e->peer);
        break;
    case EV_PARTITION:
        P->part_until = W->now + e->epoch;
        trace(W, "peer %d partitioned for %u ms", e->peer, e->epoch);
        start_fault(W, e->peer);
        break;
    case EV_FENCE: {
        uint32_t cur = 0;
        kvf_pool_peer_epoch(W->pool, (uint16_t)e->peer, &cur);
        if (cur != e->epoch) break; /* fenced already */
        trace(W, "fence peer %d epoch %u: its writes in flight are dropped", e->peer, e->epoch);
        for (int i = 0; i < MAX_WRITES; i++)
            if (in_flight(&W->w[i]) && W->w[i].peer == e->peer && W->w[i].epoch == e->epoch)
                W->w[i].dropped = true;
        fault_peer_requests(W, e->peer);
        P->decode_up = false;
        int rc = kvf_decode_peer_fenced(W->dec, W->now, (struct kvf_peer_epoch){(uint16_t)e->peer, e->epoch},
                                        &W->acts);
        if (rc < 0) violate(W, "kvf_decode_peer_fenced: %s", kvf_strerror(rc));
        decode_actions(W);
        if (P->alive) {
            struct ev *n = ev_new(W, rnd(W, 1, 20), EV_RESET);
            n->peer = e->peer;
            n->gen = P->gen;
            ev_push(W);
        }
        break;
    }
    case EV_RESET:
        if (e->gen != P->gen || !P->alive) break;
        if (peer_busy(W, e, e->peer)) break;
        trace(W, "prefill %d learns its connection was closed", e->peer);
        P->connected = false;
        kvf_prefill_peer_down(P->sm, &W->acts);
        prefill_actions(W, e->peer);
        {
            struct ev *n = ev_new(W, rnd(W, 10, 200), EV_CONNECT);
            n->peer = e->peer;
            ev_push(W);
        }
        break;
    case EV_CONNECT:
        if (!P->alive || P->connected) break;
        if (peer_busy(W, e, e->peer)) break;
        connect_peer(W, e->peer);
        break;
    }
}

/* I2 over every write in flight, I8 over every page newly quarantined, and the checkers. */
static void check_all(struct world *W)
{
    char why[256];
    for (int i = 0; i < MAX_WRITES && !W->failed; i++) {
        const struct swrite *w = &W->w[i];
        if (in_flight(w)) check_write_target(W, w, "in flight to");
    }
    if (!kvf_pool_check(W->pool, why, sizeof(why))) violate(W, "pool checker: %s", why);
    if (!kvf_decode_check(W->dec, why, sizeof(why))) violate(W, "decode checker: %s", why);
    for (int p = 0; p < N_PEERS; p++)
        if (W->peer[p].alive && !kvf_prefill_check(W->peer[p].sm, why, sizeof(why)))
            violate(W, "prefill %d checker: %s", p, why);
    struct kvf_pool_stats st;
    kvf_pool_stats(W->pool, &st);
    if (st.quarantines != W->quarantines_seen) {
        W->quarantines_seen = st.quarantines;
        for (uint32_t pg = 0; pg < N_PAGES; pg++) {
            struct kvf_page_info pi;
            kvf_pool_page_info(W->pool, pg, &pi);
            if (pi.state != KVF_PAGE_QUARANTINED) continue;
            int ri = find_req(W, pi.owner.req);
            if (ri >= 0 && !W->req[ri].faulted)
                violate(W, "I8: page %u of request %d was quarantined although none of its messages was "
                           "lost and its writer never failed: a drain proof went missing", pg, ri);
        }
    }
    for (int i = 0; i < W->n_req; i++) {
        const struct sreq *r = &W->req[i];
        if (r->submitted && !r->outcome && W->now > r->submit_t + OUTCOME_BOUND_MS)
            violate(W, "I3: request %d has had no answer for %" PRIu64 " ms", i, W->now - r->submit_t);
    }
}

static bool quiescent(struct world *W)
{
    if (W->n_nonperiodic) return false;
    struct kvf_decode_stats ds;
    kvf_decode_stats(W->dec, &ds);
    if (ds.live) return false;
    for (int p = 0; p < N_PEERS; p++)
        if (!W->peer[p].alive || !W->peer[p].connected || W->now < W->peer[p].hung_until) return false;
    return true;
}

static void final_checks(struct world *W)
{
    struct kvf_pool_stats st;
    kvf_pool_stats(W->pool, &st);
    if (st.by_state[KVF_PAGE_FREE] != N_PAGES || st.reserved || st.grants)
        violate(W, "I4: at quiescence %u of %u pages free, %u reserved, %u grants", st.by_state[KVF_PAGE_FREE],
                N_PAGES, st.reserved, st.grants);
    for (int i = 0; i < W->n_req; i++)
        if (!W->req[i].dropped_by_client && !W->req[i].outcome)
            violate(W, "I3: request %d never ended", i);
    for (int p = 0; p < N_PEERS; p++) {
        struct kvf_prefill_stats ps;
        kvf_prefill_stats(W->peer[p].sm, &ps);
        if (ps.live) violate(W, "I4: prefill %d still has %u live requests at quiescence", p, ps.live);
        for (int s = 0; s < N_SRC; s++)
            if (W->peer[p].src[s].used) violate(W, "I4: prefill %d leaked source page %d", p, s);
    }
    struct kvf_decode_stats ds;
    kvf_decode_stats(W->dec, &ds);
    W->res->stale = (uint32_t)ds.stale;
    W->res->fences = (uint32_t)st.fences;
    W->res->quarantines = (uint32_t)st.quarantines;
}

static void setup(struct world *W, uint64_t seed)
{
    kvf_rng_seed(&W->rng, seed);
    struct kvf_pool_config pc = {.geo = {1, 1, 2, PT, 4}, .n_pages = N_PAGES, .max_peers = N_PEERS,
                                 .hold_timeout_ms = HOLD_TIMEOUT_MS, .tag_seed = seed << 16};
#if defined(KVF_TEST_BUILD)
    pc.poison_on_free = true; /* freed pages name their previous owner: a stale read shows */
#endif
    if (kvf_pool_create(&pc, &W->pool) < 0) abort();
    W->data_bytes = kvf_geo_data_bytes(&pc.geo);
    W->trailer_off = kvf_geo_trailer_offset(&pc.geo);
    struct kvf_decode_config dc = {.pool = W->pool, .max_reqs = MAX_REQS, .max_context = MAX_CONTEXT,
                                   .max_grant_pages = MAX_GRANT, .max_peers = N_PEERS,
                                   .grant_timeout_ms = GRANT_TIMEOUT_MS, .hold_timeout_ms = HOLD_TIMEOUT_MS,
                                   .nonce_seed = seed * 1000};
    if (kvf_decode_create(&dc, &W->dec) < 0) abort();
    W->acts = (struct kvf_actions){W->abuf, 0, KVF_ARRAY_LEN(W->abuf)};

    /* The weather of this seed: a clean network half the time. */
    bool lossy = chance(W, 0.5);
    W->p_drop = lossy ? 0.01 * rnd(W, 1, 8) : 0;
    W->p_dup = lossy ? 0.05 : 0.01;
    W->p_late = lossy ? 0.03 : 0;

    for (int p = 0; p < N_PEERS; p++) {
        struct speer *P = &W->peer[p];
        struct kvf_prefill_config c = {.decode_peer = 0, .max_reqs = 16, .max_grant_pages = MAX_GRANT,
                                       .max_context = MAX_CONTEXT, .page_tokens = PT};
        if (kvf_prefill_create(&c, &P->sm) < 0) abort();
        P->alive = true;
        P->n_src = rnd(W, 2, N_SRC);
        connect_peer(W, p);
        /* At most one fault per peer, somewhere in the first seconds. */
        uint32_t f = rnd(W, 0, 5);
        struct ev *e = NULL;
        if (f == 1) {
            e = ev_new(W, rnd(W, 0, 2500), EV_CRASH);
            e->peer = p;
            ev_push(W);
            e = ev_new(W, rnd(W, 2600, 6000), EV_RESTART);
        } else if (f == 2 || f == 3) {
            e = ev_new(W, rnd(W, 0, 2500), EV_HANG);
            e->epoch = rnd(W, 50, 2 * HOLD_TIMEOUT_MS + 2000);
            e->index = f == 3;
        } else if (f == 4) {
            e = ev_new(W, rnd(W, 0, 2500), EV_PARTITION);
            e->epoch = rnd(W, 20, 2500);
        }
        if (e) {
            e->peer = p;
            ev_push(W);
        }
    }
    W->n_req = (int)rnd(W, 1, MAX_REQS);
    for (int i = 0; i < W->n_req; i++) {
        struct sreq *r = &W->req[i];
        memset(r, 0, sizeof(*r));
        r->id = (kvf_req_id_t){seed * 64 + (uint64_t)i + 1, 0xabc0000000000000ull | seed};
        r->tenant = rnd(W, 1, 3);
        r->prompt = rnd(W, 1, MAX_PROMPT);
        r->max_tokens = rnd(W, 0, 8);
        r->writer = -1;
        r->fail_at = chance(W, 0.05) ? (int)rnd(W, 1, 4) : -1;
        r->refuse = chance(W, 0.05);
        r->forge = chance(W, 0.04);
        r->corrupt = chance(W, 0.04);
        r->early_clear = chance(W, 0.05);
        if (r->forge || r->corrupt) r->faulted = true;
        if (chance(W, 0.03)) r->prompt = MAX_CONTEXT + 1; /* over the limit: refused at once */
        struct ev *e = ev_new(W, rnd(W, 0, 1500), EV_SUBMIT);
        e->ridx = i;
        uint64_t at = e->t;
        ev_push(W);
        if (chance(W, 0.3)) {
            e = ev_new(W, at - W->now + rnd(W, 0, 600), EV_CANCEL);
            e->ridx = i;
            ev_push(W);
        }
    }
    ev_new(W, TICK_MS, EV_TICK);
    ev_push(W);
    ev_new(W, HB_MS, EV_HB);
    ev_push(W);
}

static void teardown(struct world *W)
{
    for (int p = 0; p < N_PEERS; p++) kvf_prefill_destroy(W->peer[p].sm);
    kvf_decode_destroy(W->dec);
    kvf_pool_destroy(W->pool);
    free(W->heap);
}

void sim_run(uint64_t seed, FILE *tr, struct sim_result *out)
{
    static struct world W;
    memset(&W, 0, sizeof(W));
    memset(out, 0, sizeof(*out));
    W.res = out;
    W.trace = tr;
    setup(&W, seed);
    check_all(&W);
    struct ev e;
    while (!W.failed && W.n_ev) {
        ev_pop(&W, &e);
        W.now = e.t;
        if (W.steps > 2000000) {
            violate(&W, "runaway: %" PRIu64 " steps without quiescence", W.steps);
            break;
        }
        if (W.now > END_MS) {
            violate(&W, "I4: no quiescence after %d ms of virtual time", END_MS);
            break;
        }
        step(&W, &e);
        if (e.kind == EV_TICK || e.kind == EV_HB) {
            ev_new(&W, e.kind == EV_TICK ? TICK_MS : HB_MS, e.kind);
            ev_push(&W);
        }
        check_all(&W);
        if (!W.failed && quiescent(&W)) {
            trace(&W, "quiescent");
            final_checks(&W);
            break;
        }
    }
    out->ok = !W.failed;
    snprintf(out->why, sizeof(out->why), "%s", W.why);
    out->steps = W.steps;
    out->end_ms = W.now;
    for (int i = 0; i < W.n_req; i++) {
        if (W.req[i].outcome && W.req[i].ok) out->committed++;
        else if (W.req[i].outcome) out->failed++;
    }
    teardown(&W);
}
