/*
 * prefill.c — the prefill-side handoff machine, one per connection to a decode worker: compute,
 * post writes, flush, report; on a cancel or a failure, stop posting, drain, and only then say so.
 *
 * One (request, nonce), prefill side:
 *
 *          GRANT            page_ready (first)         page_ready (last): FLUSH
 *   NONE ─────────▶ COMPUTING ─────────────▶ WRITING ───────────────────────▶ FLUSHING
 *    │               │  │                     │                                │   │
 *    │ CANCEL:       │  │ compute_failed:     │ CANCEL, compute_failed, clear: │   │ flushed:
 *    │ ACK at once   │  │ REJECT              │ FLUSH, wait                    │   │ send DONE
 *    │               │  │ (nothing posted)    ▼                                │   ▼
 *    │    CANCEL:    │  │                  DRAINING ◀─────────────────────────┘  DONE
 *    │    ACK, abort │  │                     │ flushed: send the ACK / FAIL owed    │ CANCEL: ACK
 *    ▼               ▼  ▼                     ▼                                      ▼ clear
 *   CLEARED ◀─────────────────────────────────────────────────────────────────────────┘
 *
 * CLEARED keeps the record of (request, nonce): a CANCEL that arrives later — also one that
 * overtook its GRANT on the network — is acknowledged exactly once, and a GRANT that arrives
 * after its CANCEL is ignored, so nothing is ever written after an ACK (H2, H3). The record is
 * dropped only to make room for a new request, oldest first; the table holds max_reqs entries,
 * so a GRANT must not trail its CANCEL by more than max_reqs later requests on this connection
 * (beyond that, decode's hold timeout and fence are what stop a write).
 *
 * Rules kept here: a REJECT only when nothing was posted (H6); an ACK or a FAIL only after every
 * posted write completed remotely (H2); a source page released only at the local completion of
 * the put that reads it (H5); messages from another epoch ignored and counted (H15).
 *
 * Work bounds: every event is O(max_reqs) to find its entry, plus O(pages) for a DONE.
 */
#include "kvfence/proto.h"
#include "actions.h"

#include <stdio.h> /* snprintf for the checker's description; nothing is printed */
#include <string.h>

enum owed { OWE_NONE = 0, OWE_ACK = 1, OWE_FAIL = 2 };

struct preq {
    enum kvf_preq_state state;
    kvf_req_id_t req;
    uint64_t nonce;
    uint64_t age; /* order of creation, for evicting the oldest CLEARED record */
    uint32_t tenant, expected;
    uint32_t n_pages;
    struct kvf_page_ref *pages; /* [max_grant_pages] */
    uint64_t *checksums;        /* [max_grant_pages] */
    uint32_t computed, posted;
    uint32_t progress_tokens; /* the tokens_done of the last PROGRESS sent */
    uint32_t first_token;
    bool flush_out; /* a FLUSH is outstanding */
    bool acked;     /* the CANCEL of this (req, nonce) was answered */
    unsigned owed;  /* OWE_ACK | OWE_FAIL: what to send once drained */
    int fail_err;
    bool placeholder; /* mutant placeholder_after_reject only */
};

struct kvf_prefill {
    struct kvf_prefill_config cfg;
    const struct kvf_alloc_ops *alloc;
    bool connected;
    uint32_t epoch;
    uint64_t age;
    struct preq *reqs;
    struct kvf_prefill_stats st;
};

const char *kvf_preq_state_name(enum kvf_preq_state s)
{
    static const char *const names[] = {
        "KVF_PREQ_NONE",     "KVF_PREQ_COMPUTING", "KVF_PREQ_WRITING", "KVF_PREQ_FLUSHING",
        "KVF_PREQ_DRAINING", "KVF_PREQ_DONE",      "KVF_PREQ_CLEARED"};
    return (unsigned)s < KVF_ARRAY_LEN(names) ? names[s] : "?";
}

static size_t arrays_bytes(const struct kvf_prefill_config *c)
{
    return (size_t)c->max_reqs * c->max_grant_pages *
           (sizeof(struct kvf_page_ref) + sizeof(uint64_t));
}

int kvf_prefill_create(const struct kvf_prefill_config *cfg, kvf_prefill_t **out)
{
    if (!cfg || cfg->max_reqs == 0 || cfg->max_grant_pages == 0 ||
        cfg->max_grant_pages > KVF_PROTO_MAX_PAGES || cfg->page_tokens == 0 ||
        cfg->max_context == 0)
        return -EINVAL;
    const struct kvf_alloc_ops *a = cfg->alloc ? cfg->alloc : &kvf_default_alloc;
    kvf_prefill_t *p = a->alloc(a->ctx, sizeof(*p), 16);
    if (!p) return -ENOMEM;
    memset(p, 0, sizeof(*p));
    p->cfg = *cfg;
    p->alloc = a;
    p->reqs = a->alloc(a->ctx, cfg->max_reqs * sizeof(struct preq), 16);
    if (!p->reqs) goto free_p;
    uint8_t *arr = a->alloc(a->ctx, arrays_bytes(cfg), 16);
    if (!arr) goto free_reqs;
    memset(p->reqs, 0, cfg->max_reqs * sizeof(struct preq));
    memset(arr, 0, arrays_bytes(cfg));
    uint64_t *sums = (uint64_t *)arr;
    struct kvf_page_ref *refs =
        (struct kvf_page_ref *)(sums + (size_t)cfg->max_reqs * cfg->max_grant_pages);
    for (uint32_t i = 0; i < cfg->max_reqs; i++) {
        p->reqs[i].checksums = sums + (size_t)i * cfg->max_grant_pages;
        p->reqs[i].pages = refs + (size_t)i * cfg->max_grant_pages;
    }
    *out = p;
    return 0;
free_reqs:
    a->free(a->ctx, p->reqs, cfg->max_reqs * sizeof(struct preq));
free_p:
    a->free(a->ctx, p, sizeof(*p));
    return -ENOMEM;
}

void kvf_prefill_destroy(kvf_prefill_t *p)
{
    if (!p) return;
    const struct kvf_alloc_ops *a = p->alloc;
    a->free(a->ctx, p->reqs[0].checksums, arrays_bytes(&p->cfg));
    a->free(a->ctx, p->reqs, p->cfg.max_reqs * sizeof(struct preq));
    a->free(a->ctx, p, sizeof(*p));
}

uint32_t kvf_prefill_max_actions(const kvf_prefill_t *p)
{
    /* connect and peer_down abort every live request; every other call appends at most four. */
    return p->cfg.max_reqs + 4;
}

void kvf_prefill_stats(const kvf_prefill_t *p, struct kvf_prefill_stats *out)
{
    *out = p->st;
    out->live = 0;
    memset(out->by_state, 0, sizeof(out->by_state));
    for (uint32_t i = 0; i < p->cfg.max_reqs; i++) {
        enum kvf_preq_state s = p->reqs[i].state;
        out->by_state[s]++;
        if (s != KVF_PREQ_NONE && s != KVF_PREQ_CLEARED) out->live++;
    }
}

static struct preq *find(const kvf_prefill_t *p, kvf_req_id_t req, uint64_t nonce)
{
    for (uint32_t i = 0; i < p->cfg.max_reqs; i++) {
        struct preq *e = &p->reqs[i];
        if (e->state != KVF_PREQ_NONE && e->nonce == nonce && kvf_req_id_eq(e->req, req)) return e;
    }
    return NULL;
}

enum kvf_preq_state kvf_prefill_req_state(const kvf_prefill_t *p, kvf_req_id_t req, uint64_t nonce)
{
    const struct preq *e = find(p, req, nonce);
    return e ? e->state : KVF_PREQ_NONE;
}

/* A free entry, or else the oldest CLEARED record (nothing can be owed for it), or NULL. */
static struct preq *make_room(kvf_prefill_t *p)
{
    struct preq *oldest = NULL;
    for (uint32_t i = 0; i < p->cfg.max_reqs; i++) {
        struct preq *e = &p->reqs[i];
        if (e->state == KVF_PREQ_NONE) return e;
        if (e->state == KVF_PREQ_CLEARED && (!oldest || e->age < oldest->age)) oldest = e;
    }
    return oldest;
}

static struct preq *new_entry(kvf_prefill_t *p, kvf_req_id_t req, uint64_t nonce,
                              enum kvf_preq_state state)
{
    struct preq *e = make_room(p);
    if (!e) return NULL;
    struct kvf_page_ref *pages = e->pages;
    uint64_t *sums = e->checksums;
    memset(e, 0, sizeof(*e));
    e->pages = pages;
    e->checksums = sums;
    e->state = state;
    e->req = req;
    e->nonce = nonce;
    e->age = ++p->age;
    return e;
}

static int room(const kvf_prefill_t *p, const struct kvf_actions *acts)
{
    return kvf__actions_room(acts, kvf_prefill_max_actions(p));
}

static struct kvf_action *push(struct kvf_actions *acts, enum kvf_action_kind kind,
                               kvf_req_id_t req)
{
    return kvf__actions_push(acts, kind, req);
}

static struct kvf_action *send(kvf_prefill_t *p, struct kvf_actions *acts, kvf_req_id_t req,
                               uint64_t nonce, enum kvf_msg_type type, int reason)
{
    struct kvf_action *a = push(acts, KVF_ACT_SEND, req);
    a->peer = p->cfg.decode_peer;
    a->msg.type = type;
    a->msg.req = req;
    a->msg.nonce = nonce;
    a->msg.epoch = p->epoch;
    a->msg.u.reason = reason;
    if (type == KVF_MSG_CANCEL_ACK) p->st.acks++;
    if (type == KVF_MSG_FAIL) p->st.fails++;
    if (type == KVF_MSG_REJECT) p->st.rejected++;
    return a;
}

static void abort_compute(struct kvf_actions *acts, const struct preq *e)
{
    push(acts, KVF_ACT_ABORT_COMPUTE, e->req)->nonce = e->nonce;
}

static void flush(struct kvf_actions *acts, struct preq *e)
{
    if (e->flush_out) return;
    e->flush_out = true;
    push(acts, KVF_ACT_FLUSH, e->req)->nonce = e->nonce;
}

/* Stop posting; answer `what` once every posted write completed remotely (at once if none). */
static void drain(kvf_prefill_t *p, struct preq *e, unsigned what, int err,
                  struct kvf_actions *acts)
{
    if (e->state == KVF_PREQ_COMPUTING || e->state == KVF_PREQ_WRITING) abort_compute(acts, e);
    e->owed |= what;
    if (what & OWE_FAIL) e->fail_err = err;
    e->state = KVF_PREQ_DRAINING;
    if (e->posted > 0 || e->flush_out) {
        flush(acts, e);
        return;
    }
    /* Nothing was posted: nothing can be in flight. */
    if (e->owed & OWE_ACK) {
        send(p, acts, e->req, e->nonce, KVF_MSG_CANCEL_ACK, 0);
        e->acked = true;
    }
    if (e->owed & OWE_FAIL) send(p, acts, e->req, e->nonce, KVF_MSG_REJECT, e->fail_err);
    e->owed = OWE_NONE;
    e->state = KVF_PREQ_CLEARED;
}

static void reset(kvf_prefill_t *p, struct kvf_actions *acts)
{
    for (uint32_t i = 0; i < p->cfg.max_reqs; i++) {
        struct preq *e = &p->reqs[i];
        if (e->state >= KVF_PREQ_COMPUTING && e->state <= KVF_PREQ_DRAINING) abort_compute(acts, e);
        e->state = KVF_PREQ_NONE;
    }
}

int kvf_prefill_connect(kvf_prefill_t *p, uint32_t epoch, struct kvf_actions *acts)
{
    int rc = room(p, acts);
    if (rc < 0) return rc;
    reset(p, acts);
    p->connected = true;
    p->epoch = epoch;
    return 0;
}

int kvf_prefill_peer_down(kvf_prefill_t *p, struct kvf_actions *acts)
{
    int rc = room(p, acts);
    if (rc < 0) return rc;
    reset(p, acts);
    p->connected = false;
    return 0;
}

static int on_grant(kvf_prefill_t *p, const struct kvf_msg *m, struct kvf_actions *acts)
{
    const struct kvf_msg_grant *g = &m->u.grant;
    if (find(p, m->req, m->nonce)) {
        /* A duplicate, or a GRANT that arrived after its CANCEL was acknowledged: never act. */
        p->st.stale++;
        return KVF_E_PROTO_STALE;
    }
    uint32_t pt = p->cfg.page_tokens;
    bool ok = g->n_pages >= 1 && g->n_pages <= p->cfg.max_grant_pages && g->expected_tokens >= 1 &&
              g->expected_tokens <= p->cfg.max_context &&
              ((uint64_t)g->expected_tokens + pt - 1) / pt == g->n_pages && g->pages;
    struct preq *e = new_entry(p, m->req, m->nonce, ok ? KVF_PREQ_COMPUTING : KVF_PREQ_CLEARED);
    if (!ok || !e) {
        /* Refused before anything was posted: REJECT is the proof decode needs (H6). Without a
         * free entry nothing is recorded, which is safe: nothing will ever be posted for it. */
        send(p, acts, m->req, m->nonce, KVF_MSG_REJECT, ok ? -EBUSY : KVF_E_PROTO_BOUNDS);
        return 0;
    }
    e->tenant = g->tenant;
    e->expected = g->expected_tokens;
    e->n_pages = g->n_pages;
    memcpy(e->pages, g->pages, g->n_pages * sizeof(*g->pages));
    p->st.granted++;
    push(acts, KVF_ACT_COMPUTE, m->req)->nonce = m->nonce;
    return 0;
}

static int on_cancel(kvf_prefill_t *p, const struct kvf_msg *m, struct kvf_actions *acts)
{
    struct preq *e = find(p, m->req, m->nonce);
    if (!e) {
        if (KVF_MUTANT(ACK_LOST_WHEN_CLEARED)) { /* Mutant: a cancel for no record is ignored. */
            p->st.stale++;
            return KVF_E_PROTO_UNKNOWN_REQ;
        }
        /* Never seen (or forgotten): nothing was posted for it by this connection. Acknowledge at
         * once and remember, so its GRANT, if it is still on the way, is ignored. */
        e = new_entry(p, m->req, m->nonce, KVF_PREQ_CLEARED);
        send(p, acts, m->req, m->nonce, KVF_MSG_CANCEL_ACK, 0);
        if (e) e->acked = true;
        return 0;
    }
    switch (e->state) {
    case KVF_PREQ_COMPUTING:
    case KVF_PREQ_WRITING:
    case KVF_PREQ_FLUSHING:
        if (KVF_MUTANT(ACK_BEFORE_DRAIN)) { /* Mutant: acknowledged before the writes landed. */
            send(p, acts, e->req, e->nonce, KVF_MSG_CANCEL_ACK, 0);
            e->acked = true;
            drain(p, e, OWE_NONE, 0, acts);
            return 0;
        }
        drain(p, e, OWE_ACK, 0, acts);
        return 0;
    case KVF_PREQ_DRAINING:
        if (e->acked || (e->owed & OWE_ACK)) break;
        e->owed |= OWE_ACK;
        return 0;
    case KVF_PREQ_DONE:
    case KVF_PREQ_CLEARED:
        if (e->acked) break;
        /* Mutant: a cancel for a cleared request is ignored. */
        if (KVF_MUTANT(ACK_LOST_WHEN_CLEARED) && e->state == KVF_PREQ_CLEARED) break;
        /* Every write was flushed before DONE (or nothing was posted): acknowledge now. */
        send(p, acts, e->req, e->nonce, KVF_MSG_CANCEL_ACK, 0);
        e->acked = true;
        e->state = KVF_PREQ_CLEARED;
        return 0;
    default:
        break;
    }
    p->st.stale++;
    return KVF_E_PROTO_STALE;
}

int kvf_prefill_on_msg(kvf_prefill_t *p, uint64_t now_ms, const struct kvf_msg *m,
                       struct kvf_actions *acts)
{
    int rc = room(p, acts);
    if (rc < 0) return rc;
    bool fresh = p->connected;
    /* A message of an earlier connection — a GRANT delayed past a fence above all — names pages
     * that may belong to someone else by now. */
    if (!KVF_MUTANT(STALE_EPOCH_ACCEPTED)) fresh = fresh && m->epoch == p->epoch;
    if (!fresh) {
        p->st.stale++;
        return KVF_E_PROTO_STALE;
    }
    switch (m->type) {
    case KVF_MSG_GRANT:
        return on_grant(p, m, acts);
    case KVF_MSG_CANCEL:
        return on_cancel(p, m, acts);
    default:
        p->st.stale++;
        return KVF_E_PROTO_TYPE;
    }
}

static uint32_t page_slots(uint32_t tokens, uint32_t i, uint32_t pt)
{
    uint64_t start = (uint64_t)i * pt;
    uint64_t left = tokens > start ? tokens - start : 0;
    return (uint32_t)(left < pt ? left : pt);
}

static void post(kvf_prefill_t *p, struct preq *e, uint32_t index, uint32_t slots,
                 struct kvf_actions *acts)
{
    struct kvf_action *a = push(acts, KVF_ACT_POST_WRITE, e->req);
    a->nonce = e->nonce;
    a->epoch = p->epoch;
    a->index = index;
    a->dst = e->pages[index];
    a->slots = slots;
    a->checksum = e->checksums[index];
    a->tenant = e->tenant;
    e->posted++;
    if (KVF_MUTANT(SRC_FREED_AT_POST)) {
        /* Mutant: the source page is let go as soon as the put is posted, not when it completes. */
        struct kvf_action *r = push(acts, KVF_ACT_RELEASE_SRC, e->req);
        r->index = index;
        r->nonce = e->nonce;
    }
}

int kvf_prefill_page_ready(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                           uint32_t index, uint64_t checksum, uint32_t first_token,
                           struct kvf_actions *acts)
{
    int rc = room(p, acts);
    if (rc < 0) return rc;
    struct preq *e = find(p, req, nonce);
    if (!e || (e->state != KVF_PREQ_COMPUTING && e->state != KVF_PREQ_WRITING) ||
        index != e->computed || index >= e->n_pages)
        return KVF_E_PROTO_STALE; /* aborted meanwhile: the engine frees this source itself */
    e->checksums[index] = checksum;
    e->computed++;
    /* The page's compute has completed (H8): only now is it put. */
    post(p, e, index, page_slots(e->expected, index, p->cfg.page_tokens), acts);
    e->state = KVF_PREQ_WRITING;
    if (KVF_MUTANT(PLACEHOLDER_AFTER_REJECT) && e->placeholder)
        e->computed = e->n_pages; /* Mutant: one page stands for them all. */
    if (e->computed == e->n_pages) {
        e->first_token = first_token;
        e->state = KVF_PREQ_FLUSHING;
        flush(acts, e);
    }
    return 0;
}

int kvf_prefill_progress(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                         uint32_t tokens_done, struct kvf_actions *acts)
{
    (void)now_ms;
    int rc = room(p, acts);
    if (rc < 0) return rc;
    struct preq *e = find(p, req, nonce);
    /* Only a request still being computed, written or flushed: its last pages' writes may take
     * long on a slow link after the flush is posted (the DONE waits for the flush), and the
     * writer's local completions of them are progress. A cancelled, failed or cleared one owes
     * nothing but its proof. */
    if (!p->connected || !e ||
        (e->state != KVF_PREQ_COMPUTING && e->state != KVF_PREQ_WRITING &&
         e->state != KVF_PREQ_FLUSHING))
        return KVF_E_PROTO_STALE;
    if (tokens_done > e->expected) tokens_done = e->expected;
    if (tokens_done < e->progress_tokens) tokens_done = e->progress_tokens; /* counts never fall */
    e->progress_tokens = tokens_done;
    struct kvf_action *a = send(p, acts, req, nonce, KVF_MSG_PROGRESS, 0);
    a->msg.u.progress.tokens_done = tokens_done;
    a->msg.u.progress.pages_posted = e->posted;
    p->st.progress++;
    return 0;
}

int kvf_prefill_compute_failed(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                               int err, struct kvf_actions *acts)
{
    int rc = room(p, acts);
    if (rc < 0) return rc;
    struct preq *e = find(p, req, nonce);
    if (!e) return KVF_E_PROTO_UNKNOWN_REQ;
    if (err >= 0) err = KVF_E_PROTO_FAILED;
    switch (e->state) {
    case KVF_PREQ_COMPUTING:
        /* Mutant: the refused request is swapped for a one-token placeholder that still goes
         * through the handoff: the engine computes one token into page 0, which is put, flushed
         * and reported DONE with tokens_written 1 (see kvf_prefill_page_ready); the request's
         * other pages are never written. */
        if (KVF_MUTANT(PLACEHOLDER_AFTER_REJECT) && !e->placeholder) {
            e->placeholder = true;
            e->expected = 1;
            push(acts, KVF_ACT_COMPUTE, e->req)->nonce = e->nonce;
            return 0;
        }
        drain(p, e, OWE_FAIL, err, acts); /* nothing posted: a REJECT, now */
        return 0;
    case KVF_PREQ_WRITING:
        drain(p, e, OWE_FAIL, err, acts);
        return 0;
    default:
        return KVF_E_PROTO_STALE;
    }
}

int kvf_prefill_write_local_done(kvf_prefill_t *p, kvf_req_id_t req, uint64_t nonce, uint32_t index,
                                 struct kvf_actions *acts)
{
    int rc = room(p, acts);
    if (rc < 0) return rc;
    if (KVF_MUTANT(SRC_FREED_AT_POST)) return 0; /* Mutant: released at the post already. */
    /* Released whatever became of the request: the put no longer reads the page (H5). */
    struct kvf_action *a = push(acts, KVF_ACT_RELEASE_SRC, req);
    a->index = index;
    a->nonce = nonce;
    return 0;
}

int kvf_prefill_flushed(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                        struct kvf_actions *acts)
{
    int rc = room(p, acts);
    if (rc < 0) return rc;
    struct preq *e = find(p, req, nonce);
    if (!e || !e->flush_out) return KVF_E_PROTO_STALE;
    e->flush_out = false;
    if (e->state == KVF_PREQ_FLUSHING) {
        struct kvf_action *a = send(p, acts, req, nonce, KVF_MSG_DONE, 0);
        a->msg.u.done.tokens_written = e->expected;
        a->msg.u.done.first_token = e->first_token;
        a->msg.u.done.n_pages = e->n_pages;
        a->msg.u.done.checksums = e->checksums;
        e->state = KVF_PREQ_DONE;
        p->st.done++;
        return 0;
    }
    if (e->state == KVF_PREQ_DRAINING) {
        /* Every posted write completed remotely: now, and only now, the answers owed. */
        if (e->owed & OWE_ACK) {
            send(p, acts, req, nonce, KVF_MSG_CANCEL_ACK, 0);
            e->acked = true;
        }
        if (e->owed & OWE_FAIL) send(p, acts, req, nonce, KVF_MSG_FAIL, e->fail_err);
        e->owed = OWE_NONE;
        e->state = KVF_PREQ_CLEARED;
        return 0;
    }
    return KVF_E_PROTO_STALE;
}

int kvf_prefill_clear(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                      struct kvf_actions *acts)
{
    int rc = room(p, acts);
    if (rc < 0) return rc;
    struct preq *e = find(p, req, nonce);
    if (!e) return KVF_E_PROTO_UNKNOWN_REQ;
    switch (e->state) {
    case KVF_PREQ_COMPUTING:
    case KVF_PREQ_WRITING:
    case KVF_PREQ_FLUSHING:
        if (KVF_MUTANT(ACK_LOST_WHEN_CLEARED)) {
            /* Mutant: the record — the ack's return address — goes with the request, writes in
             * flight or not. */
            abort_compute(acts, e);
            e->state = KVF_PREQ_NONE;
            return 0;
        }
        drain(p, e, OWE_FAIL, KVF_E_PROTO_CANCELLED, acts);
        return 0;
    case KVF_PREQ_DONE:
        e->state = KVF_PREQ_CLEARED;
        return 0;
    default:
        return 0;
    }
}

bool kvf_prefill_check(const kvf_prefill_t *p, char *why, size_t why_len)
{
#define FAIL_CHECK(...)                                                                            \
    do {                                                                                           \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                                   \
        return false;                                                                              \
    } while (0)
    for (uint32_t i = 0; i < p->cfg.max_reqs; i++) {
        const struct preq *e = &p->reqs[i];
        if (e->state == KVF_PREQ_NONE || e->state == KVF_PREQ_CLEARED) continue;
        if (e->posted > e->computed || e->computed > e->n_pages)
            FAIL_CHECK("entry %u: posted %u computed %u pages %u", i, e->posted, e->computed,
                       e->n_pages);
        if (e->state == KVF_PREQ_COMPUTING && e->posted != 0)
            FAIL_CHECK("entry %u: COMPUTING with writes posted", i);
        if (e->state == KVF_PREQ_FLUSHING && (!e->flush_out || e->computed != e->n_pages))
            FAIL_CHECK("entry %u: FLUSHING without a flush", i);
        if (e->state == KVF_PREQ_DRAINING && !e->flush_out)
            FAIL_CHECK("entry %u: DRAINING without a flush", i);
        if (e->state == KVF_PREQ_DONE && e->flush_out)
            FAIL_CHECK("entry %u: DONE with a flush outstanding", i);
    }
    return true;
#undef FAIL_CHECK
}
