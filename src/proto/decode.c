/*
 * decode.c — the decode-side handoff machine: reserve, grant, verify, commit; hold on every
 * non-success ending; end grants only by proof or fence.
 *
 * One request, decode side:
 *
 *              submit: reserve, alloc, grant, send GRANT
 *   NONE ──────────────────────────────────────────────▶ GRANTED
 *     ▲ refused before anything moved (FAIL_REQ)          │  │  │
 *     │                                 DONE verified     │  │  │ REJECT / FAIL (proof):
 *     │                RUNNING ◀──────────────────────────┘  │  │ grants end, pages freed
 *     │                   │ finish: pages released           │  └──────────────▶ FAILED ──▶ NONE
 *     │                   ▼                                  │                     ▲
 *     └──────────────── DONE                                 │ cancel, timeout,    │ proof (ACK,
 * late │ bad DONE, peer down │ DONE, FAIL) or ▼                     │ fence of the epoch DRAINING
 * ────────────────┘
 *
 * Transition table:
 *   kvf_decode_submit        NONE → GRANTED (or refused: FAIL_REQ, nothing reserved)
 *   kvf_decode_on_msg DONE   GRANTED → RUNNING (count, trailers, checksums verify)
 *                            GRANTED → DRAINING (verification failed: CANCEL, pages HELD)
 *                            DRAINING → FAILED (a DONE after a cancel is a drain proof)
 *   ... REJECT / FAIL        GRANTED → FAILED (proof: grants end, pages freed)
 *                            DRAINING → FAILED
 *   ... CANCEL_ACK           DRAINING → FAILED
 *   kvf_decode_cancel        GRANTED → DRAINING; RUNNING → FAILED (no grants: pages freed)
 *   ... PROGRESS             GRANTED: the no-progress deadline renewed (nothing else changes)
 *   kvf_decode_tick          GRANTED → DRAINING (no progress within the bound); quarantine →
 *                            FENCE_PEER
 *   kvf_decode_peer_down     GRANTED → DRAINING (no CANCEL: the peer is gone) + FENCE_PEER
 *   kvf_decode_peer_fenced   GRANTED → FAILED, DRAINING → FAILED (the pool revoked the grants)
 *   kvf_decode_finish        RUNNING → DONE
 * DONE and FAILED are passing states: the slot returns to NONE in the same call.
 *
 * Invariants (kvf_decode_check): a GRANTED request's pages are GRANTED to its writer with its
 * tags; a RUNNING request's pages are OWNED by it with no grant; a DRAINING request's pages whose
 * grant it still counts are HELD or QUARANTINED with its writer's grant. The client hears of
 * every ending (DELIVER_FIRST or FAIL_REQ) at the moment the request stops succeeding, never
 * later than the no-progress bound or a heartbeat; the pages follow only on proof or fence.
 *
 * Work bounds: submit, finish and cancel are O(pages of the request); on_msg is O(requests) to
 * find the request plus O(page data) per page to verify a DONE; tick, peer_down and
 * peer_fenced are O(requests × pages) plus the pool's own bounds.
 */
#include "kvfence/proto.h"
#include "actions.h"

#include <stdio.h> /* snprintf for the checker's description; nothing is printed */
#include <string.h>
#include <xxhash.h>

/* A pool call that cannot fail when this machine's own bookkeeping is right: test and debug
 * builds assert it; release builds carry on (the pool refused and changed nothing). */
#define POOL_MUST(expr)                                                                            \
    do {                                                                                           \
        int must_rc_ = (expr);                                                                     \
        (void)must_rc_;                                                                            \
        (void)ALWAYS(must_rc_ == 0);                                                               \
    } while (0)

struct dreq {
    enum kvf_dreq_state state;
    kvf_req_id_t req;
    uint32_t tenant, prompt_len, max_tokens;
    struct kvf_msg_sampling sampling; /* travels in the GRANT */
    uint64_t nonce;
    struct kvf_peer_epoch writer;
    uint32_t n_pages;
    struct kvf_page_ref *pages; /* [seq_pages]: the prompt's pages, then the output's as it grows */
    bool *granted;              /* [seq_pages]: this page's grant is still outstanding */
    uint32_t n_granted;
    uint32_t reserved;        /* pages still promised for the output */
    uint64_t deadline_ms;     /* GRANTED: the no-progress deadline (renewed by PROGRESS) */
    uint32_t progress_tokens; /* GRANTED: the counts of the last PROGRESS, which never fall */
    uint32_t progress_pages;
    uint64_t drain_since_ms; /* DRAINING: when the request stopped succeeding */
};

struct dpeer {
    bool up;
    uint32_t epoch;       /* the epoch it connected at */
    uint32_t fence_asked; /* epoch + 1 of the last FENCE_PEER emitted; 0 = none */
};

struct kvf_decode {
    struct kvf_decode_config cfg;
    const struct kvf_alloc_ops *alloc;
    uint32_t page_tokens;
    uint32_t seq_pages; /* page-table room per request: max_context in pages, at least a grant */
    size_t data_bytes, trailer_off;
    struct dreq *reqs;   /* [max_reqs] */
    struct dpeer *peers; /* [max_peers] */
    uint64_t next_nonce;
    struct kvf_decode_stats st;
};

const char *kvf_dreq_state_name(enum kvf_dreq_state s)
{
    static const char *const names[] = {"KVF_DREQ_NONE",     "KVF_DREQ_GRANTED", "KVF_DREQ_RUNNING",
                                        "KVF_DREQ_DRAINING", "KVF_DREQ_DONE",    "KVF_DREQ_FAILED"};
    return (unsigned)s < KVF_ARRAY_LEN(names) ? names[s] : "?";
}

static size_t reqs_bytes(const struct kvf_decode_config *c)
{
    return (size_t)c->max_reqs * sizeof(struct dreq);
}
static uint32_t seq_pages_for(const struct kvf_decode_config *c)
{
    const struct kvf_pool_geometry *g = kvf_pool_geometry(c->pool);
    uint32_t n = (uint32_t)(((uint64_t)c->max_context + g->page_tokens - 1) / g->page_tokens);
    return n > c->max_grant_pages ? n : c->max_grant_pages;
}

static size_t pages_bytes(const struct kvf_decode_config *c)
{
    return (size_t)c->max_reqs * seq_pages_for(c) * (sizeof(struct kvf_page_ref) + sizeof(bool));
}

int kvf_decode_create(const struct kvf_decode_config *cfg, kvf_decode_t **out)
{
    if (!cfg || !cfg->pool || cfg->max_reqs == 0 || cfg->max_grant_pages == 0 ||
        cfg->max_grant_pages > KVF_PROTO_MAX_PAGES || cfg->max_peers == 0 || cfg->max_context == 0)
        return -EINVAL;
    const struct kvf_alloc_ops *a = cfg->alloc ? cfg->alloc : &kvf_default_alloc;
    kvf_decode_t *d = a->alloc(a->ctx, sizeof(*d), 16);
    if (!d) return -ENOMEM;
    memset(d, 0, sizeof(*d));
    d->cfg = *cfg;
    d->alloc = a;
    if (!d->cfg.grant_timeout_ms) d->cfg.grant_timeout_ms = 5000;
    if (!d->cfg.hold_timeout_ms) d->cfg.hold_timeout_ms = 30000;
    const struct kvf_pool_geometry *g = kvf_pool_geometry(cfg->pool);
    d->page_tokens = g->page_tokens;
    d->seq_pages = seq_pages_for(cfg);
    d->data_bytes = kvf_geo_data_bytes(g);
    d->trailer_off = kvf_geo_trailer_offset(g);
    d->next_nonce = cfg->nonce_seed;
    d->reqs = a->alloc(a->ctx, reqs_bytes(cfg), 16);
    if (!d->reqs) goto free_d;
    d->peers = a->alloc(a->ctx, cfg->max_peers * sizeof(struct dpeer), 16);
    if (!d->peers) goto free_reqs;
    uint8_t *pg = a->alloc(a->ctx, pages_bytes(cfg), 16);
    if (!pg) goto free_peers;
    memset(d->reqs, 0, reqs_bytes(cfg));
    memset(d->peers, 0, cfg->max_peers * sizeof(struct dpeer));
    memset(pg, 0, pages_bytes(cfg));
    struct kvf_page_ref *refs = (struct kvf_page_ref *)pg;
    bool *flags = (bool *)(refs + (size_t)cfg->max_reqs * d->seq_pages);
    for (uint32_t i = 0; i < cfg->max_reqs; i++) {
        d->reqs[i].pages = refs + (size_t)i * d->seq_pages;
        d->reqs[i].granted = flags + (size_t)i * d->seq_pages;
    }
    *out = d;
    return 0;
free_peers:
    a->free(a->ctx, d->peers, cfg->max_peers * sizeof(struct dpeer));
free_reqs:
    a->free(a->ctx, d->reqs, reqs_bytes(cfg));
free_d:
    a->free(a->ctx, d, sizeof(*d));
    return -ENOMEM;
}

void kvf_decode_destroy(kvf_decode_t *d)
{
    if (!d) return;
    const struct kvf_alloc_ops *a = d->alloc;
    a->free(a->ctx, d->reqs[0].pages, pages_bytes(&d->cfg));
    a->free(a->ctx, d->peers, d->cfg.max_peers * sizeof(struct dpeer));
    a->free(a->ctx, d->reqs, reqs_bytes(&d->cfg));
    a->free(a->ctx, d, sizeof(*d));
}

uint32_t kvf_decode_max_actions(const kvf_decode_t *d)
{
    /* The worst call is a tick or a fence that ends every request (FAIL_REQ + CANCEL each) and
     * asks for a fence of every peer. */
    return 2 * d->cfg.max_reqs + d->cfg.max_peers + 4;
}

void kvf_decode_stats(const kvf_decode_t *d, struct kvf_decode_stats *out)
{
    *out = d->st;
    out->live = 0;
    memset(out->by_state, 0, sizeof(out->by_state));
    for (uint32_t i = 0; i < d->cfg.max_reqs; i++) {
        out->by_state[d->reqs[i].state]++;
        if (d->reqs[i].state != KVF_DREQ_NONE) out->live++;
    }
}

static struct dreq *find(const kvf_decode_t *d, kvf_req_id_t req)
{
    for (uint32_t i = 0; i < d->cfg.max_reqs; i++)
        if (d->reqs[i].state != KVF_DREQ_NONE && kvf_req_id_eq(d->reqs[i].req, req))
            return &d->reqs[i];
    return NULL;
}

enum kvf_dreq_state kvf_decode_req_state(const kvf_decode_t *d, kvf_req_id_t req)
{
    const struct dreq *r = find(d, req);
    return r ? r->state : KVF_DREQ_NONE;
}

static int room(const kvf_decode_t *d, const struct kvf_actions *acts)
{
    return kvf__actions_room(acts, kvf_decode_max_actions(d));
}

static struct kvf_action *push(struct kvf_actions *acts, enum kvf_action_kind kind,
                               kvf_req_id_t req)
{
    return kvf__actions_push(acts, kind, req);
}

static void tell_client(struct kvf_actions *acts, const struct dreq *r, int err)
{
    push(acts, KVF_ACT_FAIL_REQ, r->req)->err = err;
}

static void send_to_writer(struct kvf_actions *acts, const struct dreq *r, enum kvf_msg_type type,
                           int reason)
{
    struct kvf_action *a = push(acts, KVF_ACT_SEND, r->req);
    a->peer = r->writer.peer;
    a->msg.type = type;
    a->msg.req = r->req;
    a->msg.nonce = r->nonce;
    a->msg.epoch = r->writer.epoch;
    a->msg.u.reason = reason;
}

/* The request's slot goes back to NONE; its output reservation goes back to the pool. */
static void end_slot(kvf_decode_t *d, struct dreq *r, bool ok)
{
    if (r->reserved) {
        POOL_MUST(kvf_pool_unreserve(d->cfg.pool, r->reserved));
        r->reserved = 0;
    }
    if (ok)
        d->st.finished++;
    else
        d->st.failed++;
    r->state = KVF_DREQ_NONE;
    r->n_granted = 0;
}

/* Releases the sequence's hold on every page: OWNED pages become FREE, GRANTED ones HELD. */
static void release_pages(kvf_decode_t *d, struct dreq *r, uint64_t now_ms)
{
    for (uint32_t i = 0; i < r->n_pages; i++) {
        POOL_MUST(kvf_pool_release(d->cfg.pool, r->pages[i], KVF_HOLDER_SEQ, now_ms));
    }
}

/* Proof arrived (a drain ack, a late DONE, a FAIL or REJECT): end every grant the request still
 * has. A page already QUARANTINED refuses proof and keeps waiting for its fence; so does the
 * request. */
static void prove(kvf_decode_t *d, struct dreq *r)
{
    for (uint32_t i = 0; i < r->n_pages; i++) {
        if (!r->granted[i]) continue;
        int rc = kvf_pool_grant_end(d->cfg.pool, r->pages[i], r->writer, 0);
        if (KVF_MUTANT(FENCE_KEEPS_OTHER_GRANTS) && rc != 0 && rc != KVF_E_POOL_BAD_STATE)
            rc = 0; /* Mutant: a revoked grant "ends". */
        if (rc == 0) {
            r->granted[i] = false;
            r->n_granted--;
        } else {
            (void)ALWAYS(rc == KVF_E_POOL_BAD_STATE);
        }
    }
}

/*
 * The request stops succeeding while its grants are outstanding: the client hears now; the pages
 * go HELD (never free) until proof or fence. send_cancel is false when the writer is known gone
 * (a fence is on its way) — a CANCEL would go nowhere.
 */
static void start_draining(kvf_decode_t *d, struct dreq *r, uint64_t now_ms, int err,
                           bool send_cancel, struct kvf_actions *acts)
{
    tell_client(acts, r, err);
    if (KVF_MUTANT(FREE_AT_CANCEL)) {
        /* Mutant: the pages are freed at once, as if the writer had proved it stopped. */
        for (uint32_t i = 0; i < r->n_pages; i++)
            if (r->granted[i]) kvf_pool_grant_end(d->cfg.pool, r->pages[i], r->writer, 0);
        release_pages(d, r, now_ms);
        if (send_cancel) send_to_writer(acts, r, KVF_MSG_CANCEL, err);
        end_slot(d, r, false);
        return;
    }
    release_pages(d, r, now_ms);
    if (send_cancel) send_to_writer(acts, r, KVF_MSG_CANCEL, err);
    if (r->reserved) {
        POOL_MUST(kvf_pool_unreserve(d->cfg.pool, r->reserved));
        r->reserved = 0;
    }
    r->state = KVF_DREQ_DRAINING;
    r->drain_since_ms = now_ms;
}

/* A DRAINING request ends when its last grant does. */
static void maybe_drained(kvf_decode_t *d, struct dreq *r)
{
    if (r->state == KVF_DREQ_DRAINING && r->n_granted == 0) {
        r->state = KVF_DREQ_FAILED;
        end_slot(d, r, false);
    }
}

int kvf_decode_peer_up(kvf_decode_t *d, uint16_t peer, uint32_t epoch)
{
    if (peer >= d->cfg.max_peers) return -EINVAL;
    uint32_t cur;
    int rc = kvf_pool_peer_epoch(d->cfg.pool, peer, &cur);
    if (rc < 0) return rc;
    if (epoch != cur) return KVF_E_PROTO_STALE;
    d->peers[peer].up = true;
    d->peers[peer].epoch = epoch;
    return 0;
}

static uint32_t div_up(uint64_t a, uint32_t b)
{
    return (uint32_t)((a + b - 1) / b);
}

/* Slots the grant reserves on page i of a prompt of `tokens`. */
static uint32_t page_slots(uint32_t tokens, uint32_t i, uint32_t pt)
{
    uint64_t start = (uint64_t)i * pt;
    uint64_t left = tokens > start ? tokens - start : 0;
    return (uint32_t)(left < pt ? left : pt);
}

int kvf_decode_submit(kvf_decode_t *d, uint64_t now_ms, kvf_req_id_t req,
                      const struct kvf_msg_new *nreq, uint16_t peer, struct kvf_actions *acts)
{
    int rc = room(d, acts);
    if (rc < 0) return rc;
    if (find(d, req)) return -EEXIST;
    struct dreq *r = NULL;
    for (uint32_t i = 0; i < d->cfg.max_reqs && !r; i++)
        if (d->reqs[i].state == KVF_DREQ_NONE) r = &d->reqs[i];
    if (!r) return -EBUSY;

    d->st.submitted++;
    struct dreq tmp = {.req = req}; /* for refusals: nothing of r is touched */
    uint64_t want = (uint64_t)nreq->prompt_len + nreq->max_tokens;
    uint32_t n_prompt = div_up(nreq->prompt_len, d->page_tokens);
    int refuse = 0;
    if (nreq->prompt_len == 0 || want > d->cfg.max_context || n_prompt > d->cfg.max_grant_pages)
        refuse = KVF_E_PROTO_REJECTED;
    else if (peer >= d->cfg.max_peers || !d->peers[peer].up)
        refuse = KVF_E_PROTO_PEER_DOWN;
    if (refuse) {
        /* Rejection is terminal before any grant, allocation or write (H6). */
        d->st.rejected++;
        tell_client(acts, &tmp, refuse);
        return 0;
    }

    /* Admission reserves capacity for prompt + output; the prompt's pages come out of it now,
     * the output's as the sequence grows. */
    uint32_t n_total = div_up(want, d->page_tokens);
    rc = kvf_pool_reserve(d->cfg.pool, n_total);
    if (rc < 0) {
        d->st.rejected++;
        tell_client(acts, &tmp, rc);
        return 0;
    }
    struct kvf_owner owner = {.req = req, .tenant = nreq->tenant};
    rc = kvf_pool_alloc(d->cfg.pool, &owner, KVF_HOLDER_SEQ, n_prompt, true, r->pages);
    if (rc < 0) {
        kvf_pool_unreserve(d->cfg.pool, n_total);
        d->st.rejected++;
        tell_client(acts, &tmp, rc);
        return 0;
    }
    struct kvf_peer_epoch writer = {.peer = peer, .epoch = d->peers[peer].epoch};
    for (uint32_t i = 0; i < n_prompt; i++) {
        rc = kvf_pool_grant(d->cfg.pool, r->pages[i], writer);
        if (!ALWAYS(rc == 0)) {
            /* Cannot happen: the pages were just allocated and the peer's epoch is current.
             * Undo what was done so the failure changes nothing. */
            for (uint32_t j = 0; j < i; j++)
                kvf_pool_grant_end(d->cfg.pool, r->pages[j], writer, 0);
            for (uint32_t j = 0; j < n_prompt; j++)
                kvf_pool_release(d->cfg.pool, r->pages[j], KVF_HOLDER_SEQ, now_ms);
            kvf_pool_unreserve(d->cfg.pool, n_total - n_prompt);
            d->st.rejected++;
            tell_client(acts, &tmp, rc);
            return 0;
        }
        r->granted[i] = true;
    }
    r->state = KVF_DREQ_GRANTED;
    r->req = req;
    r->tenant = nreq->tenant;
    r->prompt_len = nreq->prompt_len;
    r->max_tokens = nreq->max_tokens;
    r->sampling = nreq->sampling;
    r->nonce = ++d->next_nonce;
    r->writer = writer;
    r->n_pages = n_prompt;
    r->n_granted = n_prompt;
    r->reserved = n_total - n_prompt;
    r->deadline_ms = now_ms + d->cfg.grant_timeout_ms;
    r->progress_tokens = r->progress_pages = 0;

    struct kvf_action *a = push(acts, KVF_ACT_SEND, req);
    a->peer = peer;
    a->msg.type = KVF_MSG_GRANT;
    a->msg.req = req;
    a->msg.nonce = r->nonce;
    a->msg.epoch = writer.epoch;
    a->msg.u.grant.tenant = r->tenant;
    a->msg.u.grant.expected_tokens = r->prompt_len;
    a->msg.u.grant.n_pages = n_prompt;
    a->msg.u.grant.pages = r->pages;
    a->msg.u.grant.n_tokens = nreq->n_tokens == nreq->prompt_len ? nreq->n_tokens : 0;
    a->msg.u.grant.tokens = a->msg.u.grant.n_tokens ? nreq->tokens : NULL;
    a->msg.u.grant.sampling = r->sampling;
    return 0;
}

/*
 * The commit check (H6, H9, H10): the count, then every page's trailer against the grant, then
 * every page's bytes against the checksum. Returns 0 or the first failure's code. Reads page data
 * the writer may still be writing if it misbehaves; that is harmless here because nothing is
 * committed unless every check passes, and a mismatch only fails the request.
 */
static int verify(const kvf_decode_t *d, const struct dreq *r, const struct kvf_msg_done *dn,
                  const uint64_t *hashed)
{
    /* Mutant no_count_check, as in the model (COUNT_OK): the tokens written are not compared with
     * the reservation, only the pages the writer says it wrote are verified, and the rest are
     * committed unread with the reserved fill. */
    const bool count_check = !KVF_MUTANT(NO_COUNT_CHECK);

    if (dn->n_pages != r->n_pages) return KVF_E_PROTO_COUNT;
    /* The content suites' "unverified" runs (docs/MUTANTS.md): commit what arrives unread — no
     * count, trailer or checksum check — so that only the page lifetime rules keep the bytes
     * right. */
    if (KVF_ENABLED(KVF_TEST_BUILD) && d->cfg.test_unverified) return 0;
    if (count_check && dn->tokens_written != r->prompt_len) return KVF_E_PROTO_COUNT;
    /* Off only in `make bench-overhead`'s comparison binary, which measures what these checks
     * cost and is never installed (CMakeLists.txt refuses it with tests and mutants). */
    if (KVF_ENABLED(KVF_NO_SAFETY_CHECKS)) return 0;
    for (uint32_t i = 0; i < r->n_pages; i++) {
        if (!count_check && i >= div_up(dn->tokens_written, d->page_tokens)) break;
        const uint8_t *page = kvf_pool_page_data(d->cfg.pool, r->pages[i].page);
        if (!ALWAYS(page != NULL)) return KVF_E_PROTO_TRAILER;
        struct kvf_page_trailer t;
        memcpy(&t, page + d->trailer_off, sizeof(t));
        if (t.tag != r->pages[i].tag || !kvf_req_id_eq(t.req, r->req) || t.tenant != r->tenant ||
            t.epoch_nonce != kvf_trailer_epoch_nonce(r->writer.epoch, r->nonce))
            return KVF_E_PROTO_TRAILER;
        if (count_check ? t.slots != page_slots(r->prompt_len, i, d->page_tokens)
                        : t.slots > d->page_tokens)
            return KVF_E_PROTO_COUNT;
        if (KVF_MUTANT(NO_CHECKSUM_CHECK)) continue; /* Mutant: the bytes are taken on trust. */
        if (t.checksum != dn->checksums[i]) return KVF_E_PROTO_CHECKSUM;
        uint64_t h = hashed ? hashed[i] : XXH3_64bits(page, d->data_bytes);
        if (h != dn->checksums[i]) return KVF_E_PROTO_CHECKSUM;
    }
    return 0;
}

static void commit(kvf_decode_t *d, struct dreq *r, const struct kvf_msg_done *dn,
                   struct kvf_actions *acts)
{
    for (uint32_t i = 0; i < r->n_pages; i++) {
        uint32_t fill = page_slots(r->prompt_len, i, d->page_tokens);
        if (KVF_MUTANT(FENCE_KEEPS_OTHER_GRANTS)) {
            /* Mutant: a grant the fence revoked (the page is OWNED with fill 0) is not noticed;
             * the fill is set as if the grant had ended by proof. */
            if (kvf_pool_grant_end(d->cfg.pool, r->pages[i], r->writer, fill) != 0)
                POOL_MUST(kvf_pool_set_fill(d->cfg.pool, r->pages[i], fill));
            r->granted[i] = false;
            continue;
        }
        POOL_MUST(kvf_pool_grant_end(d->cfg.pool, r->pages[i], r->writer, fill));
        r->granted[i] = false;
    }
    r->n_granted = 0;
    r->state = KVF_DREQ_RUNNING;
    d->st.committed++;
    push(acts, KVF_ACT_DELIVER_FIRST, r->req)->first_token = dn->first_token;
}

static int on_msg(kvf_decode_t *d, uint64_t now_ms, uint16_t peer, const struct kvf_msg *m,
                  const uint64_t *hashed, struct kvf_actions *acts);

int kvf_decode_on_msg(kvf_decode_t *d, uint64_t now_ms, uint16_t peer, const struct kvf_msg *m,
                      struct kvf_actions *acts)
{
    return on_msg(d, now_ms, peer, m, NULL, acts);
}

int kvf_decode_on_done_hashed(kvf_decode_t *d, uint64_t now_ms, uint16_t peer,
                              const struct kvf_msg *m, const uint64_t *hashed,
                              struct kvf_actions *acts)
{
    if (!hashed || m->type != KVF_MSG_DONE) return -EINVAL;
    return on_msg(d, now_ms, peer, m, hashed, acts);
}

int kvf_decode_done_pages(const kvf_decode_t *d, uint16_t peer, const struct kvf_msg *m,
                          const struct kvf_page_ref **pages, uint32_t *n_pages)
{
    const struct dreq *r = find(d, m->req);
    if (!r || m->type != KVF_MSG_DONE || r->state != KVF_DREQ_GRANTED || r->writer.peer != peer ||
        r->nonce != m->nonce || m->u.done.n_pages != r->n_pages)
        return KVF_E_PROTO_STALE;
    *pages = r->pages;
    *n_pages = r->n_pages;
    return 0;
}

static int on_msg(kvf_decode_t *d, uint64_t now_ms, uint16_t peer, const struct kvf_msg *m,
                  const uint64_t *hashed, struct kvf_actions *acts)
{
    int rc = room(d, acts);
    if (rc < 0) return rc;
    struct dreq *r = find(d, m->req);
    if (!r) {
        d->st.stale++;
        return KVF_E_PROTO_UNKNOWN_REQ;
    }
    bool fresh = r->writer.peer == peer && r->nonce == m->nonce;
    if (!KVF_MUTANT(STALE_EPOCH_ACCEPTED)) {
        /* A message from an earlier connection of the writer — above all a DONE from a fenced
         * epoch — never commits and never proves anything: the fence already ended those
         * grants. */
        uint32_t cur = 0;
        kvf_pool_peer_epoch(d->cfg.pool, peer, &cur);
        fresh = fresh && m->epoch == r->writer.epoch && m->epoch == cur;
    }
    /* Mutant, as in the model: a request the fence kept matches its writer's messages to its own
     * attempt only, so a DONE of the fenced epoch still commits it. */
    if (KVF_MUTANT(FENCE_KEEPS_OTHER_GRANTS) && r->writer.peer == peer && r->nonce == m->nonce &&
        m->epoch == r->writer.epoch)
        fresh = true;
    if (!fresh) {
        d->st.stale++;
        return KVF_E_PROTO_STALE;
    }

    switch (m->type) {
    case KVF_MSG_DONE:
        if (r->state == KVF_DREQ_GRANTED) {
            rc = verify(d, r, &m->u.done, hashed);
            if (rc == 0) {
                commit(d, r, &m->u.done, acts);
                return 0;
            }
            /* verify() fails with these three codes only: each is counted under its own. */
            d->st.verify_failed++;
            if (rc == KVF_E_PROTO_COUNT)
                d->st.verify_count++;
            else if (rc == KVF_E_PROTO_CHECKSUM)
                d->st.verify_checksum++;
            else
                d->st.verify_trailer++;
            start_draining(d, r, now_ms, rc, true, acts);
            return 0;
        }
        if (r->state == KVF_DREQ_DRAINING) {
            /* The writer flushed every write before sending DONE: a late drain proof. */
            prove(d, r);
            maybe_drained(d, r);
            return 0;
        }
        break;
    case KVF_MSG_REJECT:
    case KVF_MSG_FAIL:
        if (r->state == KVF_DREQ_GRANTED) {
            /* Proof: REJECT is sent only when nothing was posted, FAIL only after a drain. */
            tell_client(acts, r,
                        m->type == KVF_MSG_REJECT ? KVF_E_PROTO_REJECTED : KVF_E_PROTO_FAILED);
            prove(d, r);
            release_pages(d, r, now_ms);
            r->state = KVF_DREQ_FAILED;
            end_slot(d, r, false);
            return 0;
        }
        if (r->state == KVF_DREQ_DRAINING) {
            prove(d, r);
            maybe_drained(d, r);
            return 0;
        }
        break;
    case KVF_MSG_CANCEL_ACK:
        if (r->state == KVF_DREQ_DRAINING) {
            prove(d, r);
            maybe_drained(d, r);
            return 0;
        }
        break;
    case KVF_MSG_PROGRESS: {
        /* Liveness only: the writer's compute of this prompt advanced. It renews the deadline and
         * nothing else — it proves no write landed or drained, so it never commits, frees or
         * ends a grant. Counts that fall or exceed the grant's are a peer's error: ignored. */
        const struct kvf_msg_progress *pg = &m->u.progress;
        if (r->state == KVF_DREQ_GRANTED && pg->tokens_done <= r->prompt_len &&
            pg->pages_posted <= r->n_pages && pg->tokens_done >= r->progress_tokens &&
            pg->pages_posted >= r->progress_pages) {
            r->progress_tokens = pg->tokens_done;
            r->progress_pages = pg->pages_posted;
            /* The mutant keeps one clock over the whole prefill, as before PROGRESS renewed it. */
            if (!KVF_MUTANT(PROGRESS_IGNORED)) r->deadline_ms = now_ms + d->cfg.grant_timeout_ms;
            d->st.progress++;
            return 0;
        }
        if (r->state == KVF_DREQ_DRAINING) return 0; /* sent before the writer saw the CANCEL */
        break;
    }
    default:
        break;
    }
    d->st.stale++;
    return KVF_E_PROTO_STALE;
}

int kvf_decode_cancel(kvf_decode_t *d, uint64_t now_ms, kvf_req_id_t req, int reason,
                      struct kvf_actions *acts)
{
    int rc = room(d, acts);
    if (rc < 0) return rc;
    struct dreq *r = find(d, req);
    if (!r) return KVF_E_PROTO_UNKNOWN_REQ;
    if (reason >= 0) reason = KVF_E_PROTO_CANCELLED;
    switch (r->state) {
    case KVF_DREQ_GRANTED:
        start_draining(d, r, now_ms, reason, true, acts);
        return 0;
    case KVF_DREQ_RUNNING:
        tell_client(acts, r, reason);
        release_pages(d, r, now_ms);
        r->state = KVF_DREQ_FAILED;
        end_slot(d, r, false);
        return 0;
    default:
        return 0; /* DRAINING: the client was told already; the pages wait for proof. */
    }
}

int kvf_decode_finish(kvf_decode_t *d, uint64_t now_ms, kvf_req_id_t req, struct kvf_actions *acts)
{
    int rc = room(d, acts);
    if (rc < 0) return rc;
    struct dreq *r = find(d, req);
    if (!r) return KVF_E_PROTO_UNKNOWN_REQ;
    if (r->state != KVF_DREQ_RUNNING) return -EINVAL;
    release_pages(d, r, now_ms);
    r->state = KVF_DREQ_DONE;
    end_slot(d, r, true);
    return 0;
}

int kvf_decode_grow(kvf_decode_t *d, kvf_req_id_t req, struct kvf_page_ref *out)
{
    struct dreq *r = find(d, req);
    if (!r) return KVF_E_PROTO_UNKNOWN_REQ;
    if (r->state != KVF_DREQ_RUNNING || r->reserved == 0 || r->n_pages >= d->seq_pages)
        return KVF_E_POOL_RESERVE;
    struct kvf_owner owner = {.req = r->req, .tenant = r->tenant};
    int rc = kvf_pool_alloc(d->cfg.pool, &owner, KVF_HOLDER_SEQ, 1, true, &r->pages[r->n_pages]);
    if (rc < 0) return rc;
    r->granted[r->n_pages] = false;
    if (out) *out = r->pages[r->n_pages];
    r->n_pages++;
    r->reserved--;
    return 0;
}

int kvf_decode_pages(const kvf_decode_t *d, kvf_req_id_t req, const struct kvf_page_ref **pages,
                     uint32_t *n_pages)
{
    const struct dreq *r = find(d, req);
    if (!r) return KVF_E_PROTO_UNKNOWN_REQ;
    *pages = r->pages;
    *n_pages = r->n_pages;
    return 0;
}

static void ask_fence(kvf_decode_t *d, struct kvf_peer_epoch w, struct kvf_actions *acts)
{
    if (w.peer >= d->cfg.max_peers || d->peers[w.peer].fence_asked == w.epoch + 1) return;
    d->peers[w.peer].fence_asked = w.epoch + 1;
    d->st.fences_requested++;
    struct kvf_action *a = push(acts, KVF_ACT_FENCE_PEER, (kvf_req_id_t){0, 0});
    a->peer = w.peer;
    a->epoch = w.epoch;
}

int kvf_decode_tick(kvf_decode_t *d, uint64_t now_ms, struct kvf_actions *acts)
{
    int rc = room(d, acts);
    if (rc < 0) return rc;
    for (uint32_t i = 0; i < d->cfg.max_reqs; i++) {
        struct dreq *r = &d->reqs[i];
        if (r->state == KVF_DREQ_GRANTED && now_ms >= r->deadline_ms) {
            /* No progress within the bound: the writer is stopped, hung or cut off (a live one
             * reports progress on every grant it holds while its compute advances). The request
             * fails now; its pages wait, HELD, for the writer's proof or, past the hold timeout,
             * the fence — a writer that was only slow to be heard still proves it stopped. */
            d->st.expired++;
            start_draining(d, r, now_ms, KVF_E_PROTO_TIMEOUT, true, acts);
        }
        /* Mutant: time is taken as proof. */
        if (KVF_MUTANT(FREE_AT_HOLD_TIMEOUT) && r->state == KVF_DREQ_DRAINING &&
            now_ms >= r->drain_since_ms + d->cfg.hold_timeout_ms) {
            for (uint32_t j = 0; j < r->n_pages; j++)
                if (r->granted[j]) kvf_pool_grant_end(d->cfg.pool, r->pages[j], r->writer, 0);
            r->n_granted = 0;
            maybe_drained(d, r);
        }
    }
    /* Held pages past their deadline go QUARANTINED; their writers must be fenced. The pool lists
     * every writer still owing a fence on each tick, so a list cut short here is completed on
     * the next one. */
    struct kvf_peer_epoch fence[16];
    int n = kvf_pool_tick(d->cfg.pool, now_ms, fence, KVF_ARRAY_LEN(fence));
    if (n < 0) return n;
    for (int i = 0; i < n && i < (int)KVF_ARRAY_LEN(fence); i++)
        ask_fence(d, fence[i], acts);
    return 0;
}

int kvf_decode_peer_down(kvf_decode_t *d, uint64_t now_ms, uint16_t peer, struct kvf_actions *acts)
{
    int rc = room(d, acts);
    if (rc < 0) return rc;
    if (peer >= d->cfg.max_peers) return -EINVAL;
    d->peers[peer].up = false;
    uint32_t epoch;
    rc = kvf_pool_peer_epoch(d->cfg.pool, peer, &epoch);
    if (rc < 0) return rc;
    for (uint32_t i = 0; i < d->cfg.max_reqs; i++) {
        struct dreq *r = &d->reqs[i];
        if (r->state == KVF_DREQ_GRANTED && r->writer.peer == peer)
            start_draining(d, r, now_ms, KVF_E_PROTO_PEER_DOWN, false, acts);
    }
    /* Whatever the peer had in flight stops only when its endpoint is closed in the fencing
     * mode, so a lost peer is always fenced, with or without grants. */
    ask_fence(d, (struct kvf_peer_epoch){peer, epoch}, acts);
    return 0;
}

int kvf_decode_peer_fenced(kvf_decode_t *d, uint64_t now_ms, struct kvf_peer_epoch writer,
                           struct kvf_actions *acts)
{
    int rc = room(d, acts);
    if (rc < 0) return rc;
    /* The machine may know fewer peers than its pool: check against its own table before the
     * pool (which would accept any peer below its own max_peers) changes anything. */
    if (writer.peer >= d->cfg.max_peers) return -EINVAL;
    rc = kvf_pool_fence(d->cfg.pool, writer);
    if (rc < 0) return rc;
    d->peers[writer.peer].up = false;
    for (uint32_t i = 0; i < d->cfg.max_reqs; i++) {
        struct dreq *r = &d->reqs[i];
        if (r->writer.peer != writer.peer || r->writer.epoch != writer.epoch) continue;
        if (r->state == KVF_DREQ_GRANTED) {
            /* Mutant (the model's): requests that were not the reason for the fence keep
             * their grants of the fenced epoch, and a DONE of that epoch still commits them
             * (on_msg, commit, prove). */
            if (KVF_MUTANT(FENCE_KEEPS_OTHER_GRANTS)) continue;
            /* The pool revoked the grants (pages OWNED, fill 0): some writes may have been
             * dropped, so the request fails and its pages are freed. */
            tell_client(acts, r, KVF_E_PROTO_PEER_DOWN);
            memset(r->granted, 0, r->n_pages * sizeof(bool));
            r->n_granted = 0;
            release_pages(d, r, now_ms);
            r->state = KVF_DREQ_FAILED;
            end_slot(d, r, false);
        } else if (r->state == KVF_DREQ_DRAINING) {
            memset(r->granted, 0, r->n_pages * sizeof(bool));
            r->n_granted = 0;
            maybe_drained(d, r);
        }
    }
    return 0;
}

bool kvf_decode_check(const kvf_decode_t *d, char *why, size_t why_len)
{
#define FAIL_CHECK(...)                                                                            \
    do {                                                                                           \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                                   \
        return false;                                                                              \
    } while (0)
    uint64_t reserved = 0;
    for (uint32_t i = 0; i < d->cfg.max_reqs; i++) {
        const struct dreq *r = &d->reqs[i];
        if (r->state == KVF_DREQ_NONE) continue;
        uint32_t n_granted = 0;
        for (uint32_t j = 0; j < r->n_pages; j++) {
            struct kvf_page_info pi;
            if (kvf_pool_page_info(d->cfg.pool, r->pages[j].page, &pi) < 0)
                FAIL_CHECK("request slot %u: page %u unknown", i, r->pages[j].page);
            if (pi.tag != r->pages[j].tag)
                FAIL_CHECK("request slot %u: page %u was reassigned under it", i, r->pages[j].page);
            bool ours =
                pi.granted && pi.grant.peer == r->writer.peer && pi.grant.epoch == r->writer.epoch;
            n_granted += r->granted[j];
            switch (r->state) {
            case KVF_DREQ_GRANTED:
                if (pi.state != KVF_PAGE_GRANTED || !ours || !r->granted[j])
                    FAIL_CHECK("GRANTED request: page %u is %s", r->pages[j].page,
                               kvf_page_state_name(pi.state));
                break;
            case KVF_DREQ_RUNNING:
                if (pi.state != KVF_PAGE_OWNED || pi.granted)
                    FAIL_CHECK("RUNNING request: page %u is %s", r->pages[j].page,
                               kvf_page_state_name(pi.state));
                break;
            case KVF_DREQ_DRAINING:
                if (r->granted[j] &&
                    ((pi.state != KVF_PAGE_HELD && pi.state != KVF_PAGE_QUARANTINED) || !ours))
                    FAIL_CHECK("DRAINING request: page %u is %s", r->pages[j].page,
                               kvf_page_state_name(pi.state));
                break;
            default:
                FAIL_CHECK("request slot %u in passing state %d", i, (int)r->state);
            }
        }
        if (n_granted != r->n_granted) FAIL_CHECK("request slot %u: grant count off", i);
        reserved += r->reserved;
    }
    /* Every promised page is some live request's unused share: the machine is the pool's only
     * reserver. */
    struct kvf_pool_stats ps;
    kvf_pool_stats(d->cfg.pool, &ps);
    if (ps.reserved != reserved)
        FAIL_CHECK("pool reserves %u pages, live requests' unused shares add to %llu", ps.reserved,
                   (unsigned long long)reserved);
    return true;
#undef FAIL_CHECK
}
