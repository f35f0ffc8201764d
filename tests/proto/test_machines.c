/*
 * test_machines.c — the decode-side and prefill-side machines over a real page pool, one test per
 * rule of the handoff protocol (the H-numbers are the hazards of HAZARDS.md they close).
 */
#include "kvf_test.h"

#include <xxhash.h>

#include "kvfence/pool.h"
#include "kvfence/proto.h"

enum { PT = 4, N_PAGES = 16, PEER = 1, HOLD_MS = 1000, GRANT_MS = 500 };

struct rig {
    kvf_pool_t *pool;
    kvf_decode_t *d;
    kvf_prefill_t *p;
    struct kvf_action buf[64];
    struct kvf_actions a;
    size_t data_bytes, trailer_off;
    uint8_t src[8][64]; /* the prefill's source pages, by page index of the grant */
};

static void rig_init(struct rig *r)
{
    memset(r, 0, sizeof(*r));
    struct kvf_pool_config pc = {.geo = {1, 1, 2, PT, 4},
                                 .n_pages = N_PAGES,
                                 .max_peers = 2,
                                 .hold_timeout_ms = HOLD_MS,
                                 .tag_seed = 100};
    ASSERT_OK(kvf_pool_create(&pc, &r->pool));
    r->data_bytes = kvf_geo_data_bytes(&pc.geo);
    r->trailer_off = kvf_geo_trailer_offset(&pc.geo);
    struct kvf_decode_config dc = {.pool = r->pool,
                                   .max_reqs = 4,
                                   .max_context = 32,
                                   .max_grant_pages = 8,
                                   .max_peers = 2,
                                   .grant_timeout_ms = GRANT_MS,
                                   .hold_timeout_ms = HOLD_MS};
    ASSERT_OK(kvf_decode_create(&dc, &r->d));
    struct kvf_prefill_config fc = {.decode_peer = 0,
                                    .max_reqs = 8,
                                    .max_grant_pages = 8,
                                    .max_context = 32,
                                    .page_tokens = PT};
    ASSERT_OK(kvf_prefill_create(&fc, &r->p));
    r->a = (struct kvf_actions){r->buf, 0, KVF_ARRAY_LEN(r->buf)};
    ASSERT_OK(kvf_decode_peer_up(r->d, PEER, 1));
    ASSERT_OK(kvf_prefill_connect(r->p, 1, &r->a));
    ASSERT_EQ_INT(r->a.n, 0);
}

static void rig_free(struct rig *r)
{
    char why[256];
    ASSERT_TRUE(kvf_pool_check(r->pool, why, sizeof(why)));
    ASSERT_TRUE(kvf_decode_check(r->d, why, sizeof(why)));
    ASSERT_TRUE(kvf_prefill_check(r->p, why, sizeof(why)));
    kvf_prefill_destroy(r->p);
    kvf_decode_destroy(r->d);
    kvf_pool_destroy(r->pool);
}

/* The first action of `kind` (and message type, for SEND) in the list, or NULL. */
static const struct kvf_action *act(const struct rig *r, enum kvf_action_kind kind, int type)
{
    for (uint32_t i = 0; i < r->a.n; i++)
        if (r->a.v[i].kind == kind && (kind != KVF_ACT_SEND || (int)r->a.v[i].msg.type == type))
            return &r->a.v[i];
    return NULL;
}
static uint32_t count(const struct rig *r, enum kvf_action_kind kind, int type)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->a.n; i++)
        n += r->a.v[i].kind == kind && (kind != KVF_ACT_SEND || (int)r->a.v[i].msg.type == type);
    return n;
}

/* Sends a message across the wire: encode, then decode into `out` (scratch in the rig's heap). */
static struct kvf_page_ref g_pages[8];
static uint64_t g_sums[8];
static uint32_t g_toks[32];
static struct kvf_msg wire(const struct kvf_msg *m)
{
    static uint8_t bytes[KVF_PROTO_HEADER_BYTES + 16 + KVF_PROTO_SAMPLING_BYTES + 8 * 12 + 32 * 4];
    struct kvf_msg_scratch s = {g_pages, 8, g_sums, 8, g_toks, 32};
    long n = kvf_msg_encode(m, bytes, sizeof(bytes));
    ASSERT_OK(n);
    struct kvf_msg out;
    ASSERT_EQ_INT(kvf_msg_decode(bytes, (size_t)n, &out, &s), n);
    return out;
}

static const kvf_req_id_t R1 = {0x11, 0x1}, R2 = {0x22, 0x2};

static void submit(struct rig *r, kvf_req_id_t id, uint32_t prompt, struct kvf_msg *grant)
{
    struct kvf_msg_new n = {.tenant = 5, .prompt_len = prompt, .max_tokens = 4};
    r->a.n = 0;
    ASSERT_OK(kvf_decode_submit(r->d, 0, id, &n, PEER, &r->a));
    const struct kvf_action *g = act(r, KVF_ACT_SEND, KVF_MSG_GRANT);
    ASSERT_NOT_NULL(g);
    ASSERT_EQ_INT(g->peer, PEER);
    *grant = wire(&g->msg);
    ASSERT_EQ_INT(kvf_decode_req_state(r->d, id), KVF_DREQ_GRANTED);
}

static uint32_t slots_of(uint32_t prompt, uint32_t i)
{
    uint32_t left = prompt > i * PT ? prompt - i * PT : 0;
    return left < PT ? left : PT;
}

/* The engine's put: the source's data, then the trailer, into the decode pool's page. */
static void land(struct rig *r, const struct kvf_action *pw, kvf_req_id_t id)
{
    uint8_t *page = kvf_pool_page_data(r->pool, pw->dst.page);
    memcpy(page, r->src[pw->index], r->data_bytes);
    struct kvf_page_trailer t = {.tag = pw->dst.tag,
                                 .req = id,
                                 .tenant = pw->tenant,
                                 .slots = pw->slots,
                                 .checksum = pw->checksum,
                                 .epoch_nonce = kvf_trailer_epoch_nonce(pw->epoch, pw->nonce)};
    memcpy(page + r->trailer_off, &t, sizeof(t));
}

/* Prefill takes the GRANT and computes and posts every page; the puts land (unless `no_land`).
 * Leaves the prefill FLUSHING with r->a holding the last call's actions. */
static void prefill_writes(struct rig *r, const struct kvf_msg *grant, bool no_land)
{
    r->a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r->p, 0, grant, &r->a));
    ASSERT_NOT_NULL(act(r, KVF_ACT_COMPUTE, 0));
    for (uint32_t i = 0; i < grant->u.grant.n_pages; i++) {
        memset(r->src[i], (int)(0x40 + i), sizeof(r->src[i]));
        uint64_t sum = XXH3_64bits(r->src[i], r->data_bytes);
        r->a.n = 0;
        ASSERT_OK(kvf_prefill_page_ready(r->p, 0, grant->req, grant->nonce, i, sum, 777, &r->a));
        const struct kvf_action *pw = act(r, KVF_ACT_POST_WRITE, 0);
        ASSERT_NOT_NULL(pw);
        ASSERT_EQ_INT(pw->slots, slots_of(grant->u.grant.expected_tokens, i));
        ASSERT_EQ_U64(pw->dst.tag, grant->u.grant.pages[i].tag);
        /* H5: the source is not released when the put is posted. */
        ASSERT_NULL(act(r, KVF_ACT_RELEASE_SRC, 0));
        if (!no_land) land(r, pw, grant->req);
    }
    ASSERT_NOT_NULL(act(r, KVF_ACT_FLUSH, 0));
    ASSERT_EQ_INT(kvf_prefill_req_state(r->p, grant->req, grant->nonce), KVF_PREQ_FLUSHING);
}

/* Prefill's flush completes: returns the DONE it sends, across the wire. */
static struct kvf_msg prefill_done(struct rig *r, const struct kvf_msg *grant)
{
    r->a.n = 0;
    ASSERT_OK(kvf_prefill_flushed(r->p, 0, grant->req, grant->nonce, &r->a));
    const struct kvf_action *d = act(r, KVF_ACT_SEND, KVF_MSG_DONE);
    ASSERT_NOT_NULL(d);
    return wire(&d->msg);
}

static void expect_pages(struct rig *r, const struct kvf_msg *grant, enum kvf_page_state s)
{
    for (uint32_t i = 0; i < grant->u.grant.n_pages; i++) {
        struct kvf_page_info pi;
        ASSERT_OK(kvf_pool_page_info(r->pool, grant->u.grant.pages[i].page, &pi));
        if (pi.state != s)
            KVF_FAIL("page %u is %s, expected %s", grant->u.grant.pages[i].page,
                     kvf_page_state_name(pi.state), kvf_page_state_name(s));
    }
}

static void expect_quiescent(struct rig *r)
{
    struct kvf_pool_stats st;
    kvf_pool_stats(r->pool, &st);
    ASSERT_EQ_INT(st.by_state[KVF_PAGE_FREE], N_PAGES);
    ASSERT_EQ_INT(st.reserved, 0);
    ASSERT_EQ_INT(st.grants, 0);
    struct kvf_decode_stats ds;
    kvf_decode_stats(r->d, &ds);
    ASSERT_EQ_INT(ds.live, 0);
}

/* The whole handoff, and quiescence after it (H12). */
static void test_success_commits_and_quiesces(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 10, &g);
    ASSERT_EQ_INT(g.u.grant.n_pages, 3);
    ASSERT_EQ_INT(g.u.grant.expected_tokens, 10);
    prefill_writes(&r, &g, false);
    struct kvf_msg done = prefill_done(&r, &g);
    ASSERT_EQ_INT(done.u.done.tokens_written, 10);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 1, PEER, &done, &r.a));
    const struct kvf_action *first = act(&r, KVF_ACT_DELIVER_FIRST, 0);
    ASSERT_NOT_NULL(first);
    ASSERT_EQ_INT(first->first_token, 777);
    ASSERT_EQ_INT(kvf_decode_req_state(r.d, R1), KVF_DREQ_RUNNING);
    expect_pages(&r, &g, KVF_PAGE_OWNED);
    /* The fill is the verified slots: slot 1 of the last page reads, slot 2 does not. */
    ASSERT_OK(kvf_pool_read_check(r.pool, g.u.grant.pages[2].page, g.u.grant.pages[2].tag, 1));
    ASSERT_ERR(kvf_pool_read_check(r.pool, g.u.grant.pages[2].page, g.u.grant.pages[2].tag, 2),
               KVF_E_POOL_BAD_SLOT);
    /* A duplicate DONE is ignored and counted. */
    r.a.n = 0;
    ASSERT_ERR(kvf_decode_on_msg(r.d, 2, PEER, &done, &r.a), KVF_E_PROTO_STALE);
    ASSERT_EQ_INT(r.a.n, 0);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_finish(r.d, 3, R1, &r.a));
    expect_quiescent(&r);
    rig_free(&r);
}

/* H6/H7: a request beyond the limits is refused before any reservation, allocation or grant. */
static void test_reject_before_anything_moves(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg_new n = {.tenant = 1, .prompt_len = 30, .max_tokens = 10}; /* 40 > 32 */
    ASSERT_OK(kvf_decode_submit(r.d, 0, R1, &n, PEER, &r.a));
    ASSERT_EQ_INT(r.a.n, 1);
    ASSERT_EQ_INT(r.a.v[0].kind, KVF_ACT_FAIL_REQ);
    ASSERT_EQ_INT(r.a.v[0].err, KVF_E_PROTO_REJECTED);
    /* A writer that has not completed its handshake gets nothing either. */
    r.a.n = 0;
    n.prompt_len = 4;
    ASSERT_OK(kvf_decode_submit(r.d, 0, R2, &n, 0, &r.a));
    ASSERT_EQ_INT(r.a.v[0].err, KVF_E_PROTO_PEER_DOWN);
    struct kvf_pool_stats st;
    kvf_pool_stats(r.pool, &st);
    ASSERT_EQ_INT(st.allocs, 0);
    ASSERT_EQ_INT(st.grants_issued, 0);
    ASSERT_EQ_INT(st.reserved, 0);
    /* A HELLO at a stale epoch does not bring a peer up. */
    ASSERT_ERR(kvf_decode_peer_up(r.d, 0, 7), KVF_E_PROTO_STALE);
    expect_quiescent(&r);
    rig_free(&r);
}

/* Decode's commit check fails the request and keeps the pages HELD until the drain ACK. */
static void run_refused_done(void (*spoil)(struct rig *, struct kvf_msg *, struct kvf_msg *),
                             int want_err)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 10, &g);
    prefill_writes(&r, &g, false);
    struct kvf_msg done = prefill_done(&r, &g);
    spoil(&r, &g, &done);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 1, PEER, &done, &r.a));
    ASSERT_NULL(act(&r, KVF_ACT_DELIVER_FIRST, 0));
    const struct kvf_action *f = act(&r, KVF_ACT_FAIL_REQ, 0);
    ASSERT_NOT_NULL(f);
    ASSERT_EQ_INT(f->err, want_err);
    /* Counted once, under the check that refused it. */
    struct kvf_decode_stats st;
    kvf_decode_stats(r.d, &st);
    ASSERT_EQ_U64(st.verify_failed, 1);
    ASSERT_EQ_U64(st.verify_count, want_err == KVF_E_PROTO_COUNT);
    ASSERT_EQ_U64(st.verify_trailer, want_err == KVF_E_PROTO_TRAILER);
    ASSERT_EQ_U64(st.verify_checksum, want_err == KVF_E_PROTO_CHECKSUM);
    const struct kvf_action *c = act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL);
    ASSERT_NOT_NULL(c);
    struct kvf_msg cancel = wire(&c->msg);
    expect_pages(&r, &g, KVF_PAGE_HELD);
    /* prefill flushed before DONE: it acknowledges at once. */
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 2, &cancel, &r.a));
    const struct kvf_action *ack = act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK);
    ASSERT_NOT_NULL(ack);
    struct kvf_msg m = wire(&ack->msg);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 3, PEER, &m, &r.a));
    expect_quiescent(&r);
    rig_free(&r);
}
static void spoil_count(struct rig *r, struct kvf_msg *g, struct kvf_msg *done)
{
    done->u.done.tokens_written = 1; /* the placeholder's count */
}
static void spoil_nothing_written(struct rig *r, struct kvf_msg *g, struct kvf_msg *done)
{
    /* The transport said success, but the last page was never written. */
    memset(kvf_pool_page_data(r->pool, g->u.grant.pages[2].page), 0, kvf_pool_page_bytes(r->pool));
}
static void spoil_byte(struct rig *r, struct kvf_msg *g, struct kvf_msg *done)
{
    ((uint8_t *)kvf_pool_page_data(r->pool, g->u.grant.pages[1].page))[5] ^= 1;
}
static void spoil_request_id(struct rig *r, struct kvf_msg *g, struct kvf_msg *done)
{
    struct kvf_page_trailer t;
    uint8_t *page = kvf_pool_page_data(r->pool, g->u.grant.pages[0].page);
    memcpy(&t, page + r->trailer_off, sizeof(t));
    t.req = R2;
    memcpy(page + r->trailer_off, &t, sizeof(t));
}
/* The trailer names another tenant: the writer's word for whose data it is must match the
 * grant's, carried by POST_WRITE from the GRANT itself. */
static void spoil_tenant(struct rig *r, struct kvf_msg *g, struct kvf_msg *done)
{
    struct kvf_page_trailer t;
    uint8_t *page = kvf_pool_page_data(r->pool, g->u.grant.pages[1].page);
    memcpy(&t, page + r->trailer_off, sizeof(t));
    t.tenant ^= 1;
    memcpy(page + r->trailer_off, &t, sizeof(t));
}
/* The trailer was written under another grant nonce (an earlier attempt of the same request). */
static void spoil_nonce(struct rig *r, struct kvf_msg *g, struct kvf_msg *done)
{
    struct kvf_page_trailer t;
    uint8_t *page = kvf_pool_page_data(r->pool, g->u.grant.pages[0].page);
    memcpy(&t, page + r->trailer_off, sizeof(t));
    t.epoch_nonce = kvf_trailer_epoch_nonce(1, g->nonce - 1);
    memcpy(page + r->trailer_off, &t, sizeof(t));
}
/* ... or by the same writer at an earlier epoch. */
static void spoil_epoch(struct rig *r, struct kvf_msg *g, struct kvf_msg *done)
{
    struct kvf_page_trailer t;
    uint8_t *page = kvf_pool_page_data(r->pool, g->u.grant.pages[0].page);
    memcpy(&t, page + r->trailer_off, sizeof(t));
    t.epoch_nonce = kvf_trailer_epoch_nonce(0, g->nonce);
    memcpy(page + r->trailer_off, &t, sizeof(t));
}
static void test_commit_refuses_other_tenant_or_attempt_trailer(void)
{
    run_refused_done(spoil_tenant, KVF_E_PROTO_TRAILER);
    run_refused_done(spoil_nonce, KVF_E_PROTO_TRAILER);
    run_refused_done(spoil_epoch, KVF_E_PROTO_TRAILER);
}

/* A running request's page table grows from its own reservation, and only from it: prompt 10 +
 * max_tokens 4 at 4 slots a page reserves 4 pages, the prompt takes 3, one more can grow; the
 * checker holds the reservation identity at every step, and the end gives back what is left. */
static void test_grow_from_reservation(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 10, &g);
    struct kvf_page_ref ref;
    ASSERT_ERR(kvf_decode_grow(r.d, R1, &ref), KVF_E_POOL_RESERVE); /* not RUNNING yet */
    prefill_writes(&r, &g, false);
    struct kvf_msg done = prefill_done(&r, &g);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 1, PEER, &done, &r.a));
    ASSERT_NOT_NULL(act(&r, KVF_ACT_DELIVER_FIRST, 0));
    struct kvf_pool_stats st;
    kvf_pool_stats(r.pool, &st);
    ASSERT_EQ_INT(st.reserved, 1);
    char why[160];
    ASSERT_TRUE(kvf_decode_check(r.d, why, sizeof(why)));
    ASSERT_OK(kvf_decode_grow(r.d, R1, &ref));
    const struct kvf_page_ref *pages;
    uint32_t n;
    ASSERT_OK(kvf_decode_pages(r.d, R1, &pages, &n));
    ASSERT_EQ_INT(n, 4);
    ASSERT_EQ_INT(pages[3].page, ref.page);
    struct kvf_page_info pi;
    ASSERT_OK(kvf_pool_page_info(r.pool, ref.page, &pi));
    ASSERT_EQ_INT(pi.state, KVF_PAGE_OWNED);
    ASSERT_TRUE(kvf_req_id_eq(pi.owner.req, R1));
    ASSERT_EQ_INT(pi.owner.tenant, 5);
    kvf_pool_stats(r.pool, &st);
    ASSERT_EQ_INT(st.reserved, 0);
    ASSERT_TRUE(kvf_decode_check(r.d, why, sizeof(why)));
    /* Spent: a request never takes pages promised to others. */
    uint32_t free_before = st.by_state[KVF_PAGE_FREE];
    ASSERT_ERR(kvf_decode_grow(r.d, R1, &ref), KVF_E_POOL_RESERVE);
    kvf_pool_stats(r.pool, &st);
    ASSERT_EQ_INT(st.by_state[KVF_PAGE_FREE], free_before);
    ASSERT_ERR(kvf_decode_grow(r.d, R2, &ref), KVF_E_PROTO_UNKNOWN_REQ);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_finish(r.d, 2, R1, &r.a));
    expect_quiescent(&r);
    rig_free(&r);
}

/* The engine's hashes stand in for the machine's own (long prompts are hashed in slices): a
 * hash that does not match DONE's fails the commit exactly as a flipped byte does, and right
 * hashes commit. */
static void test_done_with_engine_hashes(void)
{
    for (int bad = 0; bad < 2; bad++) {
        struct rig r;
        rig_init(&r);
        struct kvf_msg g;
        submit(&r, R1, 10, &g);
        prefill_writes(&r, &g, false);
        struct kvf_msg done = prefill_done(&r, &g);
        const struct kvf_page_ref *pages;
        uint32_t n;
        ASSERT_OK(kvf_decode_done_pages(r.d, PEER, &done, &pages, &n));
        ASSERT_EQ_INT(n, g.u.grant.n_pages);
        uint64_t h[8];
        for (uint32_t i = 0; i < n; i++)
            h[i] = XXH3_64bits(kvf_pool_page_data(r.pool, pages[i].page), r.data_bytes);
        if (bad) h[1] ^= 1;
        r.a.n = 0;
        ASSERT_ERR(kvf_decode_on_done_hashed(r.d, 1, PEER, &done, NULL, &r.a), -EINVAL);
        ASSERT_OK(kvf_decode_on_done_hashed(r.d, 1, PEER, &done, h, &r.a));
        if (!bad) {
            ASSERT_NOT_NULL(act(&r, KVF_ACT_DELIVER_FIRST, 0));
            r.a.n = 0;
            ASSERT_OK(kvf_decode_finish(r.d, 2, R1, &r.a));
        } else {
            ASSERT_NULL(act(&r, KVF_ACT_DELIVER_FIRST, 0));
            ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_CHECKSUM);
            struct kvf_msg cancel = wire(&act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL)->msg);
            r.a.n = 0;
            ASSERT_OK(kvf_prefill_on_msg(r.p, 2, &cancel, &r.a));
            struct kvf_msg m = wire(&act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK)->msg);
            r.a.n = 0;
            ASSERT_OK(kvf_decode_on_msg(r.d, 3, PEER, &m, &r.a));
        }
        /* A DONE for a request no longer GRANTED names no pages. */
        ASSERT_ERR(kvf_decode_done_pages(r.d, PEER, &done, &pages, &n), KVF_E_PROTO_STALE);
        rig_free(&r);
    }
}

/* A fence named for a peer beyond the machine's table is refused before the pool (which has
 * room for more peers than this machine) changes anything. */
static void test_fence_of_unknown_peer_refused(void)
{
    struct kvf_pool_config pc = {
        .geo = {1, 1, 2, PT, 4}, .n_pages = N_PAGES, .max_peers = 4, .tag_seed = 1};
    kvf_pool_t *pool;
    ASSERT_OK(kvf_pool_create(&pc, &pool));
    struct kvf_decode_config dc = {
        .pool = pool, .max_reqs = 2, .max_context = 32, .max_grant_pages = 8, .max_peers = 1};
    kvf_decode_t *d;
    ASSERT_OK(kvf_decode_create(&dc, &d));
    struct kvf_action buf[16];
    struct kvf_actions a = {buf, 0, KVF_ARRAY_LEN(buf)};
    ASSERT_ERR(kvf_decode_peer_fenced(d, 0, (struct kvf_peer_epoch){3, 1}, &a), -EINVAL);
    ASSERT_ERR(kvf_decode_peer_fenced(d, 0, (struct kvf_peer_epoch){1, 1}, &a), -EINVAL);
    uint32_t epoch = 0;
    ASSERT_OK(kvf_pool_peer_epoch(pool, 3, &epoch));
    ASSERT_EQ_INT(epoch, 1); /* the pool was not touched */
    ASSERT_EQ_INT(a.n, 0);
    char why[128];
    ASSERT_TRUE(kvf_decode_check(d, why, sizeof(why)));
    kvf_decode_destroy(d);
    kvf_pool_destroy(pool);
}

static void test_commit_refuses_wrong_count(void)
{
    run_refused_done(spoil_count, KVF_E_PROTO_COUNT);
}
static void test_commit_refuses_unwritten_page(void)
{
    run_refused_done(spoil_nothing_written, KVF_E_PROTO_TRAILER);
}
static void test_commit_refuses_bad_checksum(void)
{
    run_refused_done(spoil_byte, KVF_E_PROTO_CHECKSUM);
}
static void test_commit_refuses_other_request_trailer(void)
{
    run_refused_done(spoil_request_id, KVF_E_PROTO_TRAILER);
}

/* H1, H2: a cancel mid-write holds the pages; prefill acks only after its posted writes completed
 * remotely; the ack ends the grants. */
static void test_cancel_mid_write_holds_until_drained(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 10, &g);
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 0, &g, &r.a));
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_page_ready(r.p, 0, R1, g.nonce, 0, 1, 0, &r.a)); /* one put posted */
    ASSERT_NOT_NULL(act(&r, KVF_ACT_POST_WRITE, 0));
    r.a.n = 0;
    ASSERT_OK(kvf_decode_cancel(r.d, 1, R1, KVF_E_PROTO_CANCELLED, &r.a));
    ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_CANCELLED);
    struct kvf_msg cancel = wire(&act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL)->msg);
    expect_pages(&r, &g, KVF_PAGE_HELD);
    ASSERT_EQ_INT(kvf_decode_req_state(r.d, R1), KVF_DREQ_DRAINING);
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 2, &cancel, &r.a));
    ASSERT_NULL(act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK)); /* not before the drain */
    ASSERT_NOT_NULL(act(&r, KVF_ACT_FLUSH, 0));
    ASSERT_NOT_NULL(act(&r, KVF_ACT_ABORT_COMPUTE, 0));
    ASSERT_EQ_INT(kvf_prefill_req_state(r.p, R1, g.nonce), KVF_PREQ_DRAINING);
    /* Late computes post nothing. */
    r.a.n = 0;
    ASSERT_ERR(kvf_prefill_page_ready(r.p, 3, R1, g.nonce, 1, 1, 0, &r.a), KVF_E_PROTO_STALE);
    ASSERT_EQ_INT(r.a.n, 0);
    /* A duplicate CANCEL while draining is ignored. */
    ASSERT_ERR(kvf_prefill_on_msg(r.p, 3, &cancel, &r.a), KVF_E_PROTO_STALE);
    /* H5: the put's local completion releases its source, whatever the request's state. */
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_write_local_done(r.p, R1, g.nonce, 0, &r.a));
    ASSERT_NOT_NULL(act(&r, KVF_ACT_RELEASE_SRC, 0));
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_flushed(r.p, 4, R1, g.nonce, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK), 1);
    struct kvf_msg ack = wire(&r.a.v[0].msg);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 5, PEER, &ack, &r.a));
    expect_quiescent(&r);
    /* Another copy of the CANCEL after the ack: no second ack. */
    r.a.n = 0;
    ASSERT_ERR(kvf_prefill_on_msg(r.p, 6, &cancel, &r.a), KVF_E_PROTO_STALE);
    ASSERT_EQ_INT(r.a.n, 0);
    rig_free(&r);
}

/* H2: a cancel for a request prefill cleared, or never saw, is acknowledged at once; a GRANT
 * that arrives after its CANCEL is ignored. */
static void test_ack_for_cleared_and_unknown(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 4, &g);
    prefill_writes(&r, &g, false);
    (void)prefill_done(&r, &g);
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_clear(r.p, 1, R1, g.nonce, &r.a));
    ASSERT_EQ_INT(kvf_prefill_req_state(r.p, R1, g.nonce), KVF_PREQ_CLEARED);
    struct kvf_msg c = {.type = KVF_MSG_CANCEL, .req = R1, .nonce = g.nonce, .epoch = 1};
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 2, &c, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK), 1);

    /* Never seen: the CANCEL overtook its GRANT. */
    struct kvf_msg c2 = {.type = KVF_MSG_CANCEL, .req = R2, .nonce = 99, .epoch = 1};
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 3, &c2, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK), 1);
    ASSERT_EQ_U64(r.a.v[0].msg.nonce, 99);
    struct kvf_page_ref pg = {3, 3};
    struct kvf_msg late = {.type = KVF_MSG_GRANT, .req = R2, .nonce = 99, .epoch = 1};
    late.u.grant =
        (struct kvf_msg_grant){.tenant = 1, .expected_tokens = 2, .n_pages = 1, .pages = &pg};
    r.a.n = 0;
    ASSERT_ERR(kvf_prefill_on_msg(r.p, 4, &late, &r.a), KVF_E_PROTO_STALE);
    ASSERT_EQ_INT(r.a.n, 0);
    rig_free(&r);
}

/* H3: one ack per (request, nonce): two receivers cancelling one request get one ack each. */
static void test_one_ack_per_nonce(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg c = {.type = KVF_MSG_CANCEL, .req = R1, .nonce = 1, .epoch = 1};
    ASSERT_OK(kvf_prefill_on_msg(r.p, 0, &c, &r.a));
    c.nonce = 2;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 0, &c, &r.a));
    c.nonce = 1;
    ASSERT_ERR(kvf_prefill_on_msg(r.p, 0, &c, &r.a), KVF_E_PROTO_STALE);
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK), 2);
    ASSERT_EQ_U64(r.a.v[0].msg.nonce, 1);
    ASSERT_EQ_U64(r.a.v[1].msg.nonce, 2);
    rig_free(&r);
}

/* H6: prefill REJECTs only when it posted nothing; after a post it drains and FAILs. */
static void test_reject_only_without_writes(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 10, &g);
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 0, &g, &r.a));
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_compute_failed(r.p, 1, R1, g.nonce, -ENOMEM, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_REJECT), 1);
    ASSERT_EQ_INT(count(&r, KVF_ACT_POST_WRITE, 0), 0);
    struct kvf_msg rej = wire(&r.a.v[r.a.n - 1].msg);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 2, PEER, &rej, &r.a));
    ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_REJECTED);
    expect_quiescent(&r);

    submit(&r, R2, 10, &g);
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 3, &g, &r.a));
    ASSERT_OK(kvf_prefill_page_ready(r.p, 3, R2, g.nonce, 0, 1, 0, &r.a));
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_compute_failed(r.p, 4, R2, g.nonce, -ENOMEM, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_REJECT) + count(&r, KVF_ACT_SEND, KVF_MSG_FAIL),
                  0);
    ASSERT_NOT_NULL(act(&r, KVF_ACT_FLUSH, 0));
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_flushed(r.p, 5, R2, g.nonce, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_FAIL), 1);
    struct kvf_msg fail = wire(&r.a.v[0].msg);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 6, PEER, &fail, &r.a));
    ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_FAILED);
    expect_quiescent(&r);
    rig_free(&r);
}

/* H15: stale epoch, wrong nonce, unknown request: ignored and counted; a late drain proof still
 * ends grants. */
static void test_stale_ignored_late_proof_counts(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 10, &g);
    prefill_writes(&r, &g, false);
    struct kvf_msg done = prefill_done(&r, &g);
    struct kvf_msg bad = done;
    bad.epoch = 0;
    r.a.n = 0;
    ASSERT_ERR(kvf_decode_on_msg(r.d, 1, PEER, &bad, &r.a), KVF_E_PROTO_STALE);
    bad = done;
    bad.nonce++;
    ASSERT_ERR(kvf_decode_on_msg(r.d, 1, PEER, &bad, &r.a), KVF_E_PROTO_STALE);
    ASSERT_ERR(kvf_decode_on_msg(r.d, 1, 0, &done, &r.a), KVF_E_PROTO_STALE); /* wrong peer */
    bad = done;
    bad.req = R2;
    ASSERT_ERR(kvf_decode_on_msg(r.d, 1, PEER, &bad, &r.a), KVF_E_PROTO_UNKNOWN_REQ);
    ASSERT_EQ_INT(r.a.n, 0);
    struct kvf_decode_stats ds;
    kvf_decode_stats(r.d, &ds);
    ASSERT_EQ_INT(ds.stale, 4);
    expect_pages(&r, &g, KVF_PAGE_GRANTED);
    /* The client leaves; the DONE arrives after the CANCEL went out: it is a drain proof. */
    ASSERT_OK(kvf_decode_cancel(r.d, 2, R1, KVF_E_PROTO_CANCELLED, &r.a));
    expect_pages(&r, &g, KVF_PAGE_HELD);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 3, PEER, &done, &r.a));
    ASSERT_NULL(act(&r, KVF_ACT_DELIVER_FIRST, 0));
    expect_quiescent(&r);
    /* prefill ignores a message from another epoch. */
    struct kvf_msg c = {.type = KVF_MSG_CANCEL, .req = R1, .nonce = g.nonce, .epoch = 2};
    r.a.n = 0;
    ASSERT_ERR(kvf_prefill_on_msg(r.p, 4, &c, &r.a), KVF_E_PROTO_STALE);
    ASSERT_EQ_INT(r.a.n, 0);
    rig_free(&r);
}

/* H2, H14: without proof, the hold timeout quarantines and asks for a fence; time never frees;
 * a proof after the quarantine is refused; the fence frees. */
static void test_hold_timeout_quarantines_then_fence_frees(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 6, &g);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_cancel(r.d, 0, R1, KVF_E_PROTO_CANCELLED, &r.a)); /* the client left */
    ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_CANCELLED);
    ASSERT_NOT_NULL(act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL));
    ASSERT_NULL(act(&r, KVF_ACT_FENCE_PEER, 0));
    expect_pages(&r, &g, KVF_PAGE_HELD);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_tick(r.d, HOLD_MS - 1, &r.a));
    ASSERT_EQ_INT(r.a.n, 0);
    ASSERT_OK(kvf_decode_tick(r.d, HOLD_MS, &r.a));
    const struct kvf_action *f = act(&r, KVF_ACT_FENCE_PEER, 0);
    ASSERT_NOT_NULL(f);
    ASSERT_EQ_INT(f->peer, PEER);
    ASSERT_EQ_INT(f->epoch, 1);
    expect_pages(&r, &g, KVF_PAGE_QUARANTINED);
    /* Asked once, not on every tick. */
    r.a.n = 0;
    ASSERT_OK(kvf_decode_tick(r.d, HOLD_MS + 10000, &r.a));
    ASSERT_EQ_INT(r.a.n, 0);
    expect_pages(&r, &g, KVF_PAGE_QUARANTINED);
    /* A late ack does not free a quarantined page. */
    struct kvf_msg ack = {.type = KVF_MSG_CANCEL_ACK, .req = R1, .nonce = g.nonce, .epoch = 1};
    ASSERT_OK(kvf_decode_on_msg(r.d, 20000, PEER, &ack, &r.a));
    expect_pages(&r, &g, KVF_PAGE_QUARANTINED);
    ASSERT_EQ_INT(kvf_decode_req_state(r.d, R1), KVF_DREQ_DRAINING);
    ASSERT_OK(kvf_decode_peer_fenced(r.d, 20001, (struct kvf_peer_epoch){PEER, 1}, &r.a));
    expect_quiescent(&r);
    rig_free(&r);
}

/* Liveness by progress: a PROGRESS of the grant renews its deadline however long the prompt
 * takes; one of another nonce or epoch, or with counts that fall or exceed the grant's, does
 * not; PROGRESS never commits, proves or frees. Silence for the whole bound fails the request;
 * its pages are held for a proof or, past the hold timeout, the fence. */
static void test_progress_renews_silence_fences(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 10, &g); /* three pages of 4 slots */
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 0, &g, &r.a));
    /* The prefill machine reports progress while computing, with counts that never fall. */
    uint64_t now = 0;
    for (uint32_t k = 1; k <= 8; k++) {
        now += GRANT_MS - 1;
        r.a.n = 0;
        ASSERT_OK(kvf_prefill_progress(r.p, now, g.req, g.nonce, k, &r.a));
        const struct kvf_action *pa = act(&r, KVF_ACT_SEND, KVF_MSG_PROGRESS);
        ASSERT_NOT_NULL(pa);
        struct kvf_msg pm = wire(&pa->msg);
        ASSERT_EQ_INT(pm.u.progress.tokens_done, k);
        r.a.n = 0;
        ASSERT_OK(kvf_decode_on_msg(r.d, now, PEER, &pm, &r.a));
        ASSERT_EQ_INT(r.a.n, 0); /* nothing but the deadline changes */
        ASSERT_OK(kvf_decode_tick(r.d, now + GRANT_MS - 1, &r.a));
        ASSERT_EQ_INT(r.a.n, 0);
        ASSERT_EQ_INT(kvf_decode_req_state(r.d, R1), KVF_DREQ_GRANTED);
    }
    /* 8 × (GRANT_MS − 1) ms in: far past one bound, still granted. Messages that do not renew: */
    struct kvf_msg bad[] = {
        {.type = KVF_MSG_PROGRESS,
         .req = R1,
         .nonce = g.nonce + 1,
         .epoch = 1,
         .u.progress = {9, 0}},
        {.type = KVF_MSG_PROGRESS, .req = R1, .nonce = g.nonce, .epoch = 2, .u.progress = {9, 0}},
        {.type = KVF_MSG_PROGRESS, .req = R1, .nonce = g.nonce, .epoch = 1, .u.progress = {7, 0}},
        {.type = KVF_MSG_PROGRESS, .req = R1, .nonce = g.nonce, .epoch = 1, .u.progress = {11, 0}},
        {.type = KVF_MSG_PROGRESS, .req = R1, .nonce = g.nonce, .epoch = 1, .u.progress = {9, 4}},
    };
    struct kvf_decode_stats ds;
    kvf_decode_stats(r.d, &ds);
    uint64_t stale0 = ds.stale;
    for (size_t i = 0; i < KVF_ARRAY_LEN(bad); i++) {
        r.a.n = 0;
        ASSERT_ERR(kvf_decode_on_msg(r.d, now + 1, PEER, &bad[i], &r.a), KVF_E_PROTO_STALE);
        ASSERT_EQ_INT(r.a.n, 0);
    }
    kvf_decode_stats(r.d, &ds);
    ASSERT_EQ_U64(ds.stale, stale0 + KVF_ARRAY_LEN(bad));
    ASSERT_EQ_U64(ds.progress, 8);
    /* Silence: at the bound after the last good PROGRESS the request fails; its pages are
     * held (not freed: time proves nothing), and after the hold timeout quarantined and the
     * writer's fence asked for. */
    r.a.n = 0;
    ASSERT_OK(kvf_decode_tick(r.d, now + GRANT_MS - 1, &r.a));
    ASSERT_EQ_INT(r.a.n, 0);
    ASSERT_OK(kvf_decode_tick(r.d, now + GRANT_MS, &r.a));
    ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_TIMEOUT);
    ASSERT_NOT_NULL(act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL));
    expect_pages(&r, &g, KVF_PAGE_HELD);
    kvf_decode_stats(r.d, &ds);
    ASSERT_EQ_U64(ds.expired, 1);
    /* A PROGRESS after the expiry changes nothing: no renewal, no proof. */
    struct kvf_msg late = {
        .type = KVF_MSG_PROGRESS, .req = R1, .nonce = g.nonce, .epoch = 1, .u.progress = {10, 0}};
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, now + GRANT_MS + 1, PEER, &late, &r.a));
    ASSERT_EQ_INT(r.a.n, 0);
    expect_pages(&r, &g, KVF_PAGE_HELD);
    ASSERT_OK(kvf_decode_tick(r.d, now + GRANT_MS + HOLD_MS, &r.a));
    const struct kvf_action *f = act(&r, KVF_ACT_FENCE_PEER, 0);
    ASSERT_NOT_NULL(f);
    ASSERT_EQ_INT(f->epoch, 1);
    expect_pages(&r, &g, KVF_PAGE_QUARANTINED);
    ASSERT_OK(kvf_decode_peer_fenced(r.d, now + GRANT_MS + HOLD_MS + 1,
                                     (struct kvf_peer_epoch){PEER, 1}, &r.a));
    expect_quiescent(&r);
    /* The prefill machine sends no PROGRESS for a request past its compute and writes. */
    r.a.n = 0;
    ASSERT_ERR(kvf_prefill_progress(r.p, now, (kvf_req_id_t){7, 7}, 1, 1, &r.a), KVF_E_PROTO_STALE);
    ASSERT_EQ_INT(r.a.n, 0);
    rig_free(&r);
}

/* H13: peer down fails its requests at once, asks for a fence, and frees only after it. A fence
 * fails every request that held a grant of that epoch, and a DONE of the fenced epoch never
 * commits. */
static void test_peer_down_fails_fast_fence_frees(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g1, g2;
    submit(&r, R1, 6, &g1);
    submit(&r, R2, 6, &g2);
    prefill_writes(&r, &g2, false);
    struct kvf_msg done2 = prefill_done(&r, &g2);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_peer_down(r.d, 5, PEER, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_FAIL_REQ, 0), 2);
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_CANCEL), 0); /* nobody to send it to */
    ASSERT_EQ_INT(count(&r, KVF_ACT_FENCE_PEER, 0), 1);
    expect_pages(&r, &g1, KVF_PAGE_HELD);
    /* A new request cannot go to the down peer. */
    r.a.n = 0;
    struct kvf_msg_new n = {.tenant = 1, .prompt_len = 2};
    ASSERT_OK(kvf_decode_submit(r.d, 6, (kvf_req_id_t){9, 9}, &n, PEER, &r.a));
    ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_PEER_DOWN);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_peer_fenced(r.d, 7, (struct kvf_peer_epoch){PEER, 1}, &r.a));
    expect_quiescent(&r);
    /* The fenced epoch's DONE arrives late: nothing to commit. */
    ASSERT_ERR(kvf_decode_on_msg(r.d, 8, PEER, &done2, &r.a), KVF_E_PROTO_UNKNOWN_REQ);
    /* The peer reconnects at the next epoch. */
    ASSERT_OK(kvf_decode_peer_up(r.d, PEER, 2));
    rig_free(&r);
}

static void test_fence_fails_every_grant_of_the_epoch(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g1, g2;
    submit(&r, R1, 6, &g1);
    submit(&r, R2, 6, &g2);
    prefill_writes(&r, &g2, false);
    struct kvf_msg done2 = prefill_done(&r, &g2);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_cancel(r.d, 1, R1, KVF_E_PROTO_CANCELLED, &r.a));
    ASSERT_OK(kvf_decode_peer_fenced(r.d, 2, (struct kvf_peer_epoch){PEER, 1}, &r.a));
    ASSERT_EQ_INT(kvf_decode_req_state(r.d, R2), KVF_DREQ_NONE);
    ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_CANCELLED);
    ASSERT_EQ_INT(count(&r, KVF_ACT_FAIL_REQ, 0), 2); /* R2 fails too */
    r.a.n = 0;
    ASSERT_ERR(kvf_decode_on_msg(r.d, 3, PEER, &done2, &r.a), KVF_E_PROTO_UNKNOWN_REQ);
    ASSERT_NULL(act(&r, KVF_ACT_DELIVER_FIRST, 0));
    expect_quiescent(&r);
    rig_free(&r);
}

/* A call without room for its actions refuses and changes nothing. */
static void test_no_room_changes_nothing(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_action few[2];
    struct kvf_actions small = {few, 0, 2};
    struct kvf_msg_new n = {.tenant = 1, .prompt_len = 4};
    ASSERT_ERR(kvf_decode_submit(r.d, 0, R1, &n, PEER, &small), -ENOBUFS);
    ASSERT_EQ_INT(kvf_decode_req_state(r.d, R1), KVF_DREQ_NONE);
    struct kvf_msg c = {.type = KVF_MSG_CANCEL, .req = R1, .nonce = 1, .epoch = 1};
    ASSERT_ERR(kvf_prefill_on_msg(r.p, 0, &c, &small), -ENOBUFS);
    ASSERT_EQ_INT(small.n, 0);
    expect_quiescent(&r);
    rig_free(&r);
}

/* H1: abort A at every step boundary of its handoff; B takes every page that is free; A's late
 * puts then land; B's canary must survive, and A's pages come back only after the drain ack. */
static void test_abort_at_every_step_boundary(void)
{
    for (int k = 0; k <= 6; k++) {
        struct rig r;
        rig_init(&r);
        struct kvf_msg g;
        submit(&r, R1, 10, &g); /* 3 pages */
        struct kvf_action posted[3];
        uint32_t n_posted = 0;
        bool prefill_has_it = false;
        for (int step = 1; step <= k; step++) {
            r.a.n = 0;
            if (step == 1) {
                ASSERT_OK(kvf_prefill_on_msg(r.p, 0, &g, &r.a));
                prefill_has_it = true;
            } else if (step <= 4) {
                uint32_t i = (uint32_t)step - 2;
                memset(r.src[i], (int)(0x40 + i), sizeof(r.src[i]));
                ASSERT_OK(kvf_prefill_page_ready(r.p, 0, R1, g.nonce, i,
                                                 XXH3_64bits(r.src[i], r.data_bytes), 7, &r.a));
                posted[n_posted++] = *act(&r, KVF_ACT_POST_WRITE, 0);
            } else if (step == 5) {
                for (uint32_t i = 0; i < n_posted; i++)
                    land(&r, &posted[i], R1);
                n_posted = 0;
            } else {
                ASSERT_OK(kvf_prefill_flushed(r.p, 0, R1, g.nonce, &r.a)); /* DONE sent, lost */
            }
        }
        r.a.n = 0;
        ASSERT_OK(kvf_decode_cancel(r.d, 10, R1, KVF_E_PROTO_CANCELLED, &r.a));
        struct kvf_msg cancel = wire(&act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL)->msg);
        expect_pages(&r, &g, KVF_PAGE_HELD);

        /* B takes every free page: none of A's. */
        uint32_t n_free = kvf_pool_available(r.pool);
        struct kvf_page_ref b[N_PAGES];
        struct kvf_owner ob = {.req = R2, .tenant = 6};
        ASSERT_OK(kvf_pool_alloc(r.pool, &ob, KVF_HOLDER_SEQ, n_free, false, b));
        for (uint32_t i = 0; i < n_free; i++) {
            for (uint32_t j = 0; j < 3; j++)
                ASSERT_NE_INT(b[i].page, g.u.grant.pages[j].page);
            memset(kvf_pool_page_data(r.pool, b[i].page), 0xCB, kvf_pool_page_bytes(r.pool));
        }
        /* A's late puts land; then the cancel reaches prefill and drains. */
        for (uint32_t i = 0; i < n_posted; i++)
            land(&r, &posted[i], R1);
        r.a.n = 0;
        if (prefill_has_it) {
            ASSERT_OK(kvf_prefill_on_msg(r.p, 11, &cancel, &r.a));
        } else {
            ASSERT_OK(kvf_prefill_on_msg(r.p, 11, &cancel, &r.a)); /* never seen: ack at once */
            ASSERT_ERR(kvf_prefill_on_msg(r.p, 11, &g, &r.a),
                       KVF_E_PROTO_STALE); /* GRANT after it */
        }
        if (!act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK)) {
            /* Writes were posted: no ack until a flush (asked now, or already outstanding). */
            ASSERT_EQ_INT(kvf_prefill_req_state(r.p, R1, g.nonce), KVF_PREQ_DRAINING);
            expect_pages(&r, &g, KVF_PAGE_HELD);
            r.a.n = 0;
            ASSERT_OK(kvf_prefill_flushed(r.p, 12, R1, g.nonce, &r.a));
        }
        ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK), 1);
        struct kvf_msg ack = wire(&act(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK)->msg);
        r.a.n = 0;
        ASSERT_OK(kvf_decode_on_msg(r.d, 13, PEER, &ack, &r.a));
        expect_pages(&r, &g, KVF_PAGE_FREE);
        for (uint32_t i = 0; i < n_free; i++) {
            const uint8_t *d = kvf_pool_page_data(r.pool, b[i].page);
            for (size_t x = 0; x < kvf_pool_page_bytes(r.pool); x++)
                if (d[x] != 0xCB)
                    KVF_FAIL("abort at step %d: B's page %u changed at byte %zu", k, b[i].page, x);
            ASSERT_OK(kvf_pool_release(r.pool, b[i], KVF_HOLDER_SEQ, 14));
        }
        expect_quiescent(&r);
        rig_free(&r);
    }
}

/* H2: the prefill engine gives up on a request mid-write (clear): it drains, then tells decode
 * FAIL, and a later CANCEL for it is still acknowledged once. */
static void test_clear_mid_write_drains_then_fails(void)
{
    struct rig r;
    rig_init(&r);
    struct kvf_msg g;
    submit(&r, R1, 10, &g);
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 0, &g, &r.a));
    ASSERT_OK(kvf_prefill_page_ready(r.p, 0, R1, g.nonce, 0, 1, 0, &r.a));
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_clear(r.p, 1, R1, g.nonce, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_FAIL), 0);
    ASSERT_NOT_NULL(act(&r, KVF_ACT_FLUSH, 0));
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_flushed(r.p, 2, R1, g.nonce, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_FAIL), 1);
    struct kvf_msg fail = wire(&r.a.v[0].msg);
    struct kvf_msg c = {.type = KVF_MSG_CANCEL, .req = R1, .nonce = g.nonce, .epoch = 1};
    r.a.n = 0;
    ASSERT_OK(kvf_prefill_on_msg(r.p, 3, &c, &r.a));
    ASSERT_EQ_INT(count(&r, KVF_ACT_SEND, KVF_MSG_CANCEL_ACK), 1);
    r.a.n = 0;
    ASSERT_OK(kvf_decode_on_msg(r.d, 4, PEER, &fail, &r.a));
    ASSERT_EQ_INT(act(&r, KVF_ACT_FAIL_REQ, 0)->err, KVF_E_PROTO_FAILED);
    expect_quiescent(&r);
    rig_free(&r);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_success_commits_and_quiesces),
    KVF_CASE(test_reject_before_anything_moves),
    KVF_CASE(test_commit_refuses_wrong_count),
    KVF_CASE(test_commit_refuses_unwritten_page),
    KVF_CASE(test_commit_refuses_bad_checksum),
    KVF_CASE(test_commit_refuses_other_request_trailer),
    KVF_CASE(test_commit_refuses_other_tenant_or_attempt_trailer),
    KVF_CASE(test_fence_of_unknown_peer_refused),
    KVF_CASE(test_done_with_engine_hashes),
    KVF_CASE(test_grow_from_reservation),
    KVF_CASE(test_cancel_mid_write_holds_until_drained),
    KVF_CASE(test_ack_for_cleared_and_unknown),
    KVF_CASE(test_one_ack_per_nonce),
    KVF_CASE(test_reject_only_without_writes),
    KVF_CASE(test_stale_ignored_late_proof_counts),
    KVF_CASE(test_hold_timeout_quarantines_then_fence_frees),
    KVF_CASE(test_progress_renews_silence_fences),
    KVF_CASE(test_peer_down_fails_fast_fence_frees),
    KVF_CASE(test_fence_fails_every_grant_of_the_epoch),
    KVF_CASE(test_no_room_changes_nothing),
    KVF_CASE(test_abort_at_every_step_boundary),
    KVF_CASE(test_clear_mid_write_drains_then_fails),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
