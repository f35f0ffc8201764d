/*
 * test_pool — the page pool's transitions, one by one: every legal edge of the lifecycle, every
 * illegal call (its own error, counted, the pool unchanged: a full snapshot compared), the reader
 * check, reservations, time, fences, scrub and poison, and creation under allocation failure by
 * countdown. The full checker runs after every step.
 */
#include "pool_snap.h"

#include "pool/pool_internal.h"

static const struct kvf_owner OWNER_A = {{0xA1, 0xA2}, 7};
static const struct kvf_owner OWNER_B = {{0xB1, 0xB2}, 9};

static kvf_pool_t *make_pool(uint32_t n_pages, uint16_t max_peers)
{
    struct kvf_pool_config c = small_config(n_pages, max_peers);
    kvf_pool_t *pool = NULL;
    ASSERT_OK(kvf_pool_create(&c, &pool));
    ASSERT_NOT_NULL(pool);
    ASSERT_POOL_OK(pool);
    return pool;
}

static struct kvf_peer_epoch writer(const kvf_pool_t *pool, uint16_t peer)
{
    uint32_t e = 0;
    ASSERT_OK(kvf_pool_peer_epoch(pool, peer, &e));
    return (struct kvf_peer_epoch){peer, e};
}

static struct kvf_page_info info(const kvf_pool_t *pool, uint32_t page)
{
    struct kvf_page_info i;
    ASSERT_OK(kvf_pool_page_info(pool, page, &i));
    return i;
}

static struct kvf_page_ref alloc1(kvf_pool_t *pool, const struct kvf_owner *o)
{
    struct kvf_page_ref r;
    ASSERT_OK(kvf_pool_alloc(pool, o, KVF_HOLDER_SEQ, 1, false, &r));
    ASSERT_POOL_OK(pool);
    return r;
}

/* Ends a test: the pool must be back to all free (quiescence), check, and be destroyed. */
static void drain_and_destroy(kvf_pool_t *pool)
{
    struct kvf_pool_stats st;
    kvf_pool_stats(pool, &st);
    ASSERT_POOL_OK(pool);
    ASSERT_EQ_INT(st.by_state[KVF_PAGE_FREE], kvf_pool_n_pages(pool));
    ASSERT_EQ_INT(st.grants, 0);
    ASSERT_EQ_INT(st.reserved, 0);
    kvf_pool_destroy(pool);
}

static void test_create_rejects_bad_config(void)
{
    kvf_pool_t *pool = (kvf_pool_t *)(uintptr_t)0x1; /* must stay untouched on failure */
    struct kvf_pool_config c = small_config(0, 1);
    ASSERT_ERR(kvf_pool_create(&c, &pool), -EINVAL);
    c = small_config(4, 1);
    c.geo.elem_bytes = 3;
    ASSERT_ERR(kvf_pool_create(&c, &pool), -EINVAL);
    c = small_config(4, 1);
    c.geo.page_tokens = 0;
    ASSERT_ERR(kvf_pool_create(&c, &pool), -EINVAL);
    c = small_config(4, 1);
    c.geo.n_layers = UINT32_MAX;
    c.geo.head_dim = UINT32_MAX;
    ASSERT_ERR(kvf_pool_create(&c, &pool), -EINVAL);
    ASSERT_ERR(kvf_pool_create(NULL, &pool), -EINVAL);
    ASSERT_EQ_PTR(pool, (kvf_pool_t *)(uintptr_t)0x1);
    kvf_pool_destroy(NULL);
}

static void test_geometry_and_data(void)
{
    kvf_pool_t *pool = make_pool(4, 1);
    const struct kvf_pool_geometry *g = kvf_pool_geometry(pool);
    ASSERT_EQ_INT(kvf_geo_block_bytes(g), 4 * 1 * 4 * 4);
    ASSERT_EQ_INT(kvf_geo_data_bytes(g), 2 * 2 * 64);
    ASSERT_EQ_INT(kvf_pool_page_bytes(pool), 256 + 64);
    size_t bytes = 0;
    unsigned char *d = kvf_pool_data(pool, &bytes);
    ASSERT_EQ_INT(bytes, 4 * 320);
    ASSERT_EQ_PTR(kvf_pool_page_data(pool, 2), d + 2 * 320);
    ASSERT_NULL(kvf_pool_page_data(pool, 4));
    for (size_t i = 0; i < bytes; i++)
        ASSERT_EQ_INT(d[i], 0); /* zeroed at creation */
    ASSERT_EQ_INT(kvf_pool_n_pages(pool), 4);
    ASSERT_STREQ(kvf_page_state_name(KVF_PAGE_QUARANTINED), "KVF_PAGE_QUARANTINED");
    drain_and_destroy(pool);
}

static void test_alloc_release_fifo_and_tags(void)
{
    kvf_pool_t *pool = make_pool(8, 1);
    struct kvf_page_ref r[8];
    ASSERT_OK(kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 8, false, r));
    ASSERT_POOL_OK(pool);
    for (int i = 0; i < 8; i++) {
        ASSERT_EQ_INT(r[i].page, i); /* a fresh pool hands pages out in index order */
        ASSERT_EQ_U64(r[i].tag, 0x1000 + 1 + (uint64_t)i);
        struct kvf_page_info in = info(pool, r[i].page);
        ASSERT_EQ_INT(in.state, KVF_PAGE_OWNED);
        ASSERT_EQ_INT(in.holders[KVF_HOLDER_SEQ], 1);
        ASSERT_EQ_INT(in.owner.tenant, 7);
        ASSERT_EQ_INT(in.fill, 0);
    }
    /* Free in a scrambled order; the next allocations come back in exactly that order. */
    const int order[8] = {5, 1, 7, 0, 3, 6, 2, 4};
    for (int i = 0; i < 8; i++) {
        ASSERT_OK(kvf_pool_release(pool, r[order[i]], KVF_HOLDER_SEQ, 0));
        ASSERT_POOL_OK(pool);
        ASSERT_EQ_INT(info(pool, r[order[i]].page).state, KVF_PAGE_FREE);
    }
    for (int i = 0; i < 8; i++) {
        struct kvf_page_ref x = alloc1(pool, &OWNER_B);
        ASSERT_EQ_INT(x.page, order[i]);
        ASSERT_NE_U64(x.tag, r[order[i]].tag); /* a new tag on every reassignment */
        ASSERT_EQ_U64(x.tag, 0x1000 + 9 + (uint64_t)i);
        ASSERT_OK(kvf_pool_release(pool, x, KVF_HOLDER_SEQ, 0));
    }
    struct kvf_pool_stats st;
    kvf_pool_stats(pool, &st);
    ASSERT_EQ_U64(st.allocs, 16);
    ASSERT_EQ_U64(st.releases, 16);
    ASSERT_EQ_INT(st.by_state[KVF_PAGE_FREE], 8);
    drain_and_destroy(pool);
}

static void test_tag_never_zero(void)
{
    struct kvf_pool_config c = small_config(2, 1);
    c.tag_seed = UINT64_MAX - 1;
    kvf_pool_t *pool = NULL;
    ASSERT_OK(kvf_pool_create(&c, &pool));
    struct kvf_page_ref a = alloc1(pool, &OWNER_A), b = alloc1(pool, &OWNER_A);
    ASSERT_EQ_U64(a.tag, UINT64_MAX);
    ASSERT_EQ_U64(b.tag, 1); /* 0 skipped */
    ASSERT_OK(kvf_pool_release(pool, a, KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_release(pool, b, KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

static void test_holders_by_kind(void)
{
    kvf_pool_t *pool = make_pool(2, 1);
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    ASSERT_OK(kvf_pool_hold(pool, r, KVF_HOLDER_XFER_SRC));
    ASSERT_OK(kvf_pool_hold(pool, r, KVF_HOLDER_XFER_SRC));
    ASSERT_POOL_OK(pool);
    ASSERT_EQ_INT(info(pool, r.page).holders[KVF_HOLDER_XFER_SRC], 2);
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    ASSERT_EQ_INT(info(pool, r.page).state, KVF_PAGE_OWNED); /* the transfer still reads it */
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_XFER_SRC, 0));
    ASSERT_EQ_INT(info(pool, r.page).state, KVF_PAGE_OWNED);
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_XFER_SRC, 0));
    ASSERT_EQ_INT(info(pool, r.page).state, KVF_PAGE_FREE);
    ASSERT_POOL_OK(pool);
    drain_and_destroy(pool);
}

/* The prefix cache's pages: sealed only whole, never written again, shared within the owner's
 * tenant only (refused by the pool itself, whatever a cache's key said), FREE only when the last
 * reader goes — the cache's eviction never pulls a page from under a reader or a transfer — and
 * a new tag when reused, so a reference to the evicted page is stale. */
static void test_seal_and_share(void)
{
    kvf_pool_t *pool = make_pool(2, 1);
    uint32_t pt = kvf_pool_geometry(pool)->page_tokens;
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    EXPECT_ILLEGAL(pool, kvf_pool_seal(pool, r), KVF_E_POOL_BAD_ARG); /* nothing verified */
    ASSERT_OK(kvf_pool_set_fill(pool, r, pt - 1));
    EXPECT_ILLEGAL(pool, kvf_pool_seal(pool, r), KVF_E_POOL_BAD_ARG); /* partly filled */
    EXPECT_ILLEGAL(pool, kvf_pool_share(pool, r, OWNER_A.tenant, KVF_HOLDER_SEQ),
                   KVF_E_POOL_BAD_STATE); /* not sealed */
    ASSERT_OK(kvf_pool_set_fill(pool, r, pt));
    ASSERT_OK(kvf_pool_seal(pool, r));
    ASSERT_POOL_OK(pool);
    ASSERT_TRUE(info(pool, r.page).sealed);
    /* Never written again; held only through share. */
    EXPECT_ILLEGAL(pool, kvf_pool_seal(pool, r), KVF_E_POOL_BAD_STATE);
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, r, writer(pool, 0)), KVF_E_POOL_BAD_STATE);
    EXPECT_ILLEGAL(pool, kvf_pool_set_fill(pool, r, pt), KVF_E_POOL_BAD_STATE);
    EXPECT_ILLEGAL(pool, kvf_pool_hold(pool, r, KVF_HOLDER_PREFIX), KVF_E_POOL_BAD_STATE);
    EXPECT_ILLEGAL(pool, kvf_pool_share(pool, r, OWNER_A.tenant, (enum kvf_holder)5),
                   KVF_E_POOL_BAD_ARG);
    /* Another tenant is refused by the pool. */
    EXPECT_ILLEGAL(pool, kvf_pool_share(pool, r, OWNER_B.tenant, KVF_HOLDER_SEQ),
                   KVF_E_POOL_FOREIGN);
    ASSERT_ERR(kvf_pool_read_check_tenant(pool, r.page, r.tag, OWNER_B.tenant, 0),
               KVF_E_POOL_FOREIGN);
    ASSERT_OK(kvf_pool_read_check_tenant(pool, r.page, r.tag, OWNER_A.tenant, pt - 1));
    ASSERT_ERR(kvf_pool_read_check_tenant(pool, r.page, r.tag, OWNER_A.tenant, pt),
               KVF_E_POOL_BAD_SLOT);
    /* The cache takes it; the request that computed it goes; a reader and its transfer come. */
    ASSERT_OK(kvf_pool_share(pool, r, OWNER_A.tenant, KVF_HOLDER_PREFIX));
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_share(pool, r, OWNER_A.tenant, KVF_HOLDER_SEQ));
    ASSERT_OK(kvf_pool_share(pool, r, OWNER_A.tenant, KVF_HOLDER_XFER_SRC));
    ASSERT_POOL_OK(pool);
    /* Evicted (the cache lets go) while they read: the page stays, sealed and readable. */
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_PREFIX, 0));
    ASSERT_EQ_INT(info(pool, r.page).state, KVF_PAGE_OWNED);
    ASSERT_TRUE(info(pool, r.page).sealed);
    ASSERT_OK(kvf_pool_read_check(pool, r.page, r.tag, 0));
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_XFER_SRC, 0));
    ASSERT_EQ_INT(info(pool, r.page).state, KVF_PAGE_OWNED);
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    /* The last reader gone: FREE and unsealed. */
    struct kvf_page_info in = info(pool, r.page);
    ASSERT_EQ_INT(in.state, KVF_PAGE_FREE);
    ASSERT_FALSE(in.sealed);
    ASSERT_POOL_OK(pool);
    struct kvf_pool_stats st;
    kvf_pool_stats(pool, &st);
    ASSERT_EQ_INT(st.sealed, 0);
    ASSERT_EQ_U64(st.seals, 1);
    ASSERT_EQ_U64(st.shares, 3);
    /* Reused: a new tag, and the evicted page's reference is stale. */
    struct kvf_page_ref a = alloc1(pool, &OWNER_B), b = alloc1(pool, &OWNER_B);
    struct kvf_page_ref again = a.page == r.page ? a : b;
    ASSERT_EQ_INT(again.page, r.page);
    ASSERT_TRUE(again.tag != r.tag);
    EXPECT_ILLEGAL(pool, kvf_pool_share(pool, r, OWNER_A.tenant, KVF_HOLDER_SEQ),
                   KVF_E_POOL_STALE_TAG);
    ASSERT_ERR(kvf_pool_read_check_tenant(pool, r.page, r.tag, OWNER_A.tenant, 0),
               KVF_E_POOL_STALE_TAG);
    ASSERT_OK(kvf_pool_release(pool, a, KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_release(pool, b, KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

static void test_grant_then_proof(void)
{
    kvf_pool_t *pool = make_pool(4, 2);
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    ASSERT_OK(kvf_pool_set_fill(pool, r, 2));
    unsigned char *page = kvf_pool_page_data(pool, r.page);
    memset(page + 256, 0xEE, 64); /* an old trailer */
    struct kvf_peer_epoch w = writer(pool, 1);
    ASSERT_EQ_INT(w.epoch, 1);
    ASSERT_OK(kvf_pool_grant(pool, r, w));
    ASSERT_POOL_OK(pool);
    struct kvf_page_info in = info(pool, r.page);
    ASSERT_EQ_INT(in.state, KVF_PAGE_GRANTED);
    ASSERT_TRUE(in.granted);
    ASSERT_EQ_INT(in.grant.peer, 1);
    ASSERT_EQ_INT(in.fill, 0); /* reset: nothing the writer will write is verified yet */
    for (int i = 0; i < 64; i++)
        ASSERT_EQ_INT(page[256 + i], 0); /* trailer cleared */
    ASSERT_ERR(kvf_pool_read_check(pool, r.page, r.tag, 0), KVF_E_POOL_BAD_STATE);
    /* GRANTED → GRANTED: a holder comes and goes; the page stays granted while one remains. */
    ASSERT_OK(kvf_pool_hold(pool, r, KVF_HOLDER_XFER_SRC));
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_XFER_SRC, 0));
    ASSERT_POOL_OK(pool);
    ASSERT_EQ_INT(info(pool, r.page).state, KVF_PAGE_GRANTED);
    ASSERT_EQ_INT(info(pool, r.page).holders[KVF_HOLDER_SEQ], 1);
    ASSERT_OK(kvf_pool_grant_end(pool, r, w, 3));
    ASSERT_POOL_OK(pool);
    in = info(pool, r.page);
    ASSERT_EQ_INT(in.state, KVF_PAGE_OWNED);
    ASSERT_FALSE(in.granted);
    ASSERT_EQ_INT(in.fill, 3);
    ASSERT_OK(kvf_pool_read_check(pool, r.page, r.tag, 2));
    ASSERT_ERR(kvf_pool_read_check(pool, r.page, r.tag, 3), KVF_E_POOL_BAD_SLOT);
    struct kvf_pool_stats st;
    kvf_pool_stats(pool, &st);
    ASSERT_EQ_U64(st.grants_issued, 1);
    ASSERT_EQ_U64(st.grants_proved, 1);
    ASSERT_EQ_INT(st.grants, 0);
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

/* H1: a release while a write is in flight holds the page; only proof frees it. */
static void test_release_while_granted_holds(void)
{
    kvf_pool_t *pool = make_pool(2, 1);
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    struct kvf_peer_epoch w = writer(pool, 0);
    ASSERT_OK(kvf_pool_grant(pool, r, w));
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 5000));
    ASSERT_POOL_OK(pool);
    struct kvf_page_info in = info(pool, r.page);
    ASSERT_EQ_INT(in.state, KVF_PAGE_HELD);
    ASSERT_EQ_U64(in.deadline_ms, 6000);
    ASSERT_EQ_INT(kvf_pool_available(pool), 1); /* not free: only the other page is */
    struct kvf_page_ref b = alloc1(pool, &OWNER_B);
    ASSERT_NE_INT(b.page, r.page);
    struct kvf_page_ref c;
    EXPECT_ILLEGAL(pool, kvf_pool_alloc(pool, &OWNER_B, KVF_HOLDER_SEQ, 1, false, &c),
                   KVF_E_POOL_FULL);
    /* Late proof (the drain ack) frees it. */
    ASSERT_OK(kvf_pool_grant_end(pool, r, w, 0));
    ASSERT_POOL_OK(pool);
    ASSERT_EQ_INT(info(pool, r.page).state, KVF_PAGE_FREE);
    ASSERT_OK(kvf_pool_release(pool, b, KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

static void test_hold_timeout_quarantine_then_fence(void)
{
    kvf_pool_t *pool = make_pool(4, 3);
    struct kvf_page_ref r[3];
    ASSERT_OK(kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 3, false, r));
    struct kvf_peer_epoch w1 = writer(pool, 1), w2 = writer(pool, 2);
    ASSERT_OK(kvf_pool_grant(pool, r[0], w1));
    ASSERT_OK(kvf_pool_grant(pool, r[1], w2));
    ASSERT_OK(kvf_pool_grant(pool, r[2], w1));
    ASSERT_OK(kvf_pool_release(pool, r[0], KVF_HOLDER_SEQ, 100));
    ASSERT_OK(kvf_pool_release(pool, r[1], KVF_HOLDER_SEQ, 600));
    ASSERT_POOL_OK(pool);
    struct kvf_peer_epoch f[4];
    ASSERT_EQ_INT(kvf_pool_tick(pool, 1099, f, 4), 0); /* not yet due */
    ASSERT_EQ_INT(info(pool, r[0].page).state, KVF_PAGE_HELD);
    ASSERT_EQ_INT(kvf_pool_tick(pool, 1100, f, 4), 1);
    ASSERT_POOL_OK(pool);
    ASSERT_EQ_INT(f[0].peer, 1);
    ASSERT_EQ_INT(f[0].epoch, 1);
    ASSERT_EQ_INT(info(pool, r[0].page).state, KVF_PAGE_QUARANTINED);
    ASSERT_EQ_INT(info(pool, r[1].page).state, KVF_PAGE_HELD);
    /* Time alone frees nothing, and a quarantined page refuses a late proof. */
    ASSERT_EQ_INT(kvf_pool_tick(pool, 1000000, f, 4), 2);
    ASSERT_EQ_INT(info(pool, r[0].page).state, KVF_PAGE_QUARANTINED);
    ASSERT_EQ_INT(info(pool, r[1].page).state, KVF_PAGE_QUARANTINED);
    ASSERT_EQ_INT(kvf_pool_tick(pool, 1000000, f, 1), 2); /* the count even when room is short */
    ASSERT_EQ_INT(kvf_pool_tick(pool, 1000000, NULL, 0), 2);
    EXPECT_ILLEGAL(pool, kvf_pool_grant_end(pool, r[0], w1, 0), KVF_E_POOL_BAD_STATE);
    /* Fence peer 1: its quarantined page is freed, its live grant is revoked (fill 0). */
    ASSERT_EQ_INT(kvf_pool_fence(pool, w1), 2);
    ASSERT_POOL_OK(pool);
    ASSERT_EQ_INT(info(pool, r[0].page).state, KVF_PAGE_FREE);
    struct kvf_page_info in = info(pool, r[2].page);
    ASSERT_EQ_INT(in.state, KVF_PAGE_OWNED);
    ASSERT_FALSE(in.granted);
    ASSERT_EQ_INT(writer(pool, 1).epoch, 2);
    /* The old epoch is gone: its proof and a new grant to it are refused. */
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, r[2], w1), KVF_E_POOL_BAD_EPOCH);
    EXPECT_ILLEGAL(pool, kvf_pool_fence(pool, w1), KVF_E_POOL_BAD_EPOCH);
    ASSERT_EQ_INT(kvf_pool_tick(pool, 1000000, f, 4), 1);
    ASSERT_EQ_INT(f[0].peer, 2);
    ASSERT_EQ_INT(kvf_pool_fence(pool, w2), 1);
    ASSERT_EQ_INT(kvf_pool_tick(pool, 1000000, f, 4), 0);
    ASSERT_OK(kvf_pool_release(pool, r[2], KVF_HOLDER_SEQ, 0));
    struct kvf_pool_stats st;
    kvf_pool_stats(pool, &st);
    ASSERT_EQ_INT(st.by_state[KVF_PAGE_FREE], 4); /* quiescence */
    ASSERT_EQ_U64(st.quarantines, 2);
    ASSERT_EQ_U64(st.fences, 2);
    ASSERT_EQ_U64(st.fence_revoked, 3);
    drain_and_destroy(pool);
}

static void test_fence_frees_held_pages(void)
{
    kvf_pool_t *pool = make_pool(3, 1);
    struct kvf_page_ref r[3];
    ASSERT_OK(kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 3, false, r));
    struct kvf_peer_epoch w = writer(pool, 0);
    for (int i = 0; i < 3; i++)
        ASSERT_OK(kvf_pool_grant(pool, r[i], w));
    ASSERT_OK(kvf_pool_release(pool, r[1], KVF_HOLDER_SEQ, 10));
    ASSERT_OK(kvf_pool_release(pool, r[0], KVF_HOLDER_SEQ, 20));
    ASSERT_EQ_INT(kvf_pool_fence(pool, w), 3);
    ASSERT_POOL_OK(pool);
    ASSERT_EQ_INT(info(pool, r[0].page).state, KVF_PAGE_FREE);
    ASSERT_EQ_INT(info(pool, r[1].page).state, KVF_PAGE_FREE);
    ASSERT_EQ_INT(info(pool, r[2].page).state, KVF_PAGE_OWNED);
    /* A fence with nothing granted still bumps the epoch. */
    ASSERT_EQ_INT(kvf_pool_fence(pool, writer(pool, 0)), 0);
    ASSERT_EQ_INT(writer(pool, 0).epoch, 3);
    ASSERT_OK(kvf_pool_release(pool, r[2], KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

/* `now` may go backwards; the pool's clock does not, so held-list order and deadlines hold. */
static void test_time_going_backwards(void)
{
    kvf_pool_t *pool = make_pool(3, 1);
    struct kvf_page_ref r[3];
    ASSERT_OK(kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 3, false, r));
    struct kvf_peer_epoch w = writer(pool, 0), f[1];
    for (int i = 0; i < 3; i++)
        ASSERT_OK(kvf_pool_grant(pool, r[i], w));
    ASSERT_OK(kvf_pool_release(pool, r[0], KVF_HOLDER_SEQ, 5000));
    ASSERT_OK(kvf_pool_release(pool, r[1], KVF_HOLDER_SEQ, 100)); /* behind the clock */
    ASSERT_EQ_U64(info(pool, r[1].page).deadline_ms, 6000);
    ASSERT_EQ_INT(kvf_pool_tick(pool, 10, f, 1), 0);
    ASSERT_OK(kvf_pool_release(pool, r[2], KVF_HOLDER_SEQ, 20));
    ASSERT_EQ_U64(info(pool, r[2].page).deadline_ms, 6000);
    ASSERT_POOL_OK(pool);
    ASSERT_EQ_INT(kvf_pool_tick(pool, 5999, f, 1), 0);
    ASSERT_EQ_INT(kvf_pool_tick(pool, 6000, f, 1), 1);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ_INT(info(pool, r[i].page).state, KVF_PAGE_QUARANTINED);
    ASSERT_EQ_INT(kvf_pool_fence(pool, w), 3);
    drain_and_destroy(pool);
}

static void test_reservations(void)
{
    kvf_pool_t *pool = make_pool(8, 1);
    ASSERT_OK(kvf_pool_reserve(pool, 5));
    ASSERT_EQ_INT(kvf_pool_available(pool), 3);
    struct kvf_page_ref r[8];
    EXPECT_ILLEGAL(pool, kvf_pool_alloc(pool, &OWNER_B, KVF_HOLDER_SEQ, 4, false, r),
                   KVF_E_POOL_FULL);
    EXPECT_ILLEGAL(pool, kvf_pool_reserve(pool, 4), KVF_E_POOL_RESERVE);
    ASSERT_OK(kvf_pool_alloc(pool, &OWNER_B, KVF_HOLDER_SEQ, 3, false, r));
    ASSERT_EQ_INT(kvf_pool_available(pool), 0);
    ASSERT_OK(kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 2, true, r + 3));
    ASSERT_POOL_OK(pool);
    EXPECT_ILLEGAL(pool, kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 4, true, r + 5),
                   KVF_E_POOL_RESERVE);
    EXPECT_ILLEGAL(pool, kvf_pool_unreserve(pool, 4), KVF_E_POOL_RESERVE);
    ASSERT_OK(kvf_pool_unreserve(pool, 1));
    ASSERT_EQ_INT(kvf_pool_available(pool), 1);
    ASSERT_OK(kvf_pool_reserve(pool, 0));
    struct kvf_pool_stats st;
    kvf_pool_stats(pool, &st);
    ASSERT_EQ_INT(st.reserved, 2);
    ASSERT_OK(kvf_pool_unreserve(pool, 2));
    for (int i = 0; i < 5; i++)
        ASSERT_OK(kvf_pool_release(pool, r[i], KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

/* Every illegal call: its own error, counted, and the pool exactly as it was. */
static void test_illegal_calls_change_nothing(void)
{
    kvf_pool_t *pool = make_pool(4, 2);
    struct kvf_page_ref own = alloc1(pool, &OWNER_A);
    struct kvf_page_ref gr = alloc1(pool, &OWNER_A);
    struct kvf_page_ref held = alloc1(pool, &OWNER_B);
    struct kvf_page_ref gone = alloc1(pool, &OWNER_B);
    struct kvf_peer_epoch w = writer(pool, 0), w1 = writer(pool, 1);
    ASSERT_OK(kvf_pool_grant(pool, gr, w));
    ASSERT_OK(kvf_pool_grant(pool, held, w));
    ASSERT_OK(kvf_pool_release(pool, held, KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_release(pool, gone, KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_set_fill(pool, own, 2));
    ASSERT_POOL_OK(pool);
    struct kvf_page_ref stale_own = {own.page, own.tag + 100};
    struct kvf_page_ref bad = {4, own.tag};
    struct kvf_page_ref out[8];

    /* release */
    EXPECT_ILLEGAL(pool, kvf_pool_release(pool, gone, KVF_HOLDER_SEQ, 0), KVF_E_POOL_DOUBLE_FREE);
    EXPECT_ILLEGAL(pool, kvf_pool_release(pool, stale_own, KVF_HOLDER_SEQ, 0),
                   KVF_E_POOL_STALE_TAG);
    EXPECT_ILLEGAL(pool, kvf_pool_release(pool, own, KVF_HOLDER_XFER_SRC, 0),
                   KVF_E_POOL_NOT_HOLDER);
    EXPECT_ILLEGAL(pool, kvf_pool_release(pool, held, KVF_HOLDER_SEQ, 0), KVF_E_POOL_NOT_HOLDER);
    EXPECT_ILLEGAL(pool, kvf_pool_release(pool, bad, KVF_HOLDER_SEQ, 0), KVF_E_POOL_BAD_PAGE);
    EXPECT_ILLEGAL(pool, kvf_pool_release(pool, own, (enum kvf_holder)3, 0), KVF_E_POOL_BAD_ARG);
    /* hold */
    EXPECT_ILLEGAL(pool, kvf_pool_hold(pool, held, KVF_HOLDER_SEQ), KVF_E_POOL_BAD_STATE);
    EXPECT_ILLEGAL(pool, kvf_pool_hold(pool, gone, KVF_HOLDER_SEQ), KVF_E_POOL_BAD_STATE);
    EXPECT_ILLEGAL(pool, kvf_pool_hold(pool, stale_own, KVF_HOLDER_SEQ), KVF_E_POOL_STALE_TAG);
    EXPECT_ILLEGAL(pool, kvf_pool_hold(pool, bad, KVF_HOLDER_SEQ), KVF_E_POOL_BAD_PAGE);
    EXPECT_ILLEGAL(pool, kvf_pool_hold(pool, own, (enum kvf_holder)7), KVF_E_POOL_BAD_ARG);
    /* grant */
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, gone, w), KVF_E_POOL_NOT_OWNED);
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, gr, w1), KVF_E_POOL_NOT_OWNED);
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, held, w), KVF_E_POOL_NOT_OWNED);
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, stale_own, w), KVF_E_POOL_STALE_TAG);
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, own, ((struct kvf_peer_epoch){0, 2})),
                   KVF_E_POOL_BAD_EPOCH);
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, own, ((struct kvf_peer_epoch){2, 1})),
                   KVF_E_POOL_BAD_ARG);
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, bad, w), KVF_E_POOL_BAD_PAGE);
    /* grant_end */
    EXPECT_ILLEGAL(pool, kvf_pool_grant_end(pool, own, w, 0), KVF_E_POOL_NO_GRANT);
    EXPECT_ILLEGAL(pool, kvf_pool_grant_end(pool, gone, w, 0), KVF_E_POOL_NO_GRANT);
    EXPECT_ILLEGAL(pool, kvf_pool_grant_end(pool, gr, w1, 0), KVF_E_POOL_NO_GRANT);
    EXPECT_ILLEGAL(pool, kvf_pool_grant_end(pool, held, ((struct kvf_peer_epoch){0, 9}), 0),
                   KVF_E_POOL_NO_GRANT);
    EXPECT_ILLEGAL(pool, kvf_pool_grant_end(pool, gr, w, 5), KVF_E_POOL_BAD_ARG);
    EXPECT_ILLEGAL(pool, kvf_pool_grant_end(pool, (struct kvf_page_ref){gr.page, 1}, w, 0),
                   KVF_E_POOL_STALE_TAG);
    EXPECT_ILLEGAL(pool, kvf_pool_grant_end(pool, bad, w, 0), KVF_E_POOL_BAD_PAGE);
    /* set_fill */
    EXPECT_ILLEGAL(pool, kvf_pool_set_fill(pool, own, 1), KVF_E_POOL_BAD_ARG);
    EXPECT_ILLEGAL(pool, kvf_pool_set_fill(pool, own, 5), KVF_E_POOL_BAD_ARG);
    EXPECT_ILLEGAL(pool, kvf_pool_set_fill(pool, gr, 1), KVF_E_POOL_BAD_STATE);
    EXPECT_ILLEGAL(pool, kvf_pool_set_fill(pool, stale_own, 3), KVF_E_POOL_STALE_TAG);
    EXPECT_ILLEGAL(pool, kvf_pool_set_fill(pool, bad, 3), KVF_E_POOL_BAD_PAGE);
    /* alloc */
    EXPECT_ILLEGAL(pool, kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 2, false, out),
                   KVF_E_POOL_FULL);
    EXPECT_ILLEGAL(pool, kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 1000, false, out),
                   KVF_E_POOL_FULL);
    EXPECT_ILLEGAL(pool, kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 0, false, out),
                   KVF_E_POOL_BAD_ARG);
    EXPECT_ILLEGAL(pool, kvf_pool_alloc(pool, NULL, KVF_HOLDER_SEQ, 1, false, out),
                   KVF_E_POOL_BAD_ARG);
    EXPECT_ILLEGAL(pool, kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 1, true, out),
                   KVF_E_POOL_RESERVE);
    /* reservations, fence, tick */
    EXPECT_ILLEGAL(pool, kvf_pool_reserve(pool, 2), KVF_E_POOL_RESERVE);
    EXPECT_ILLEGAL(pool, kvf_pool_unreserve(pool, 1), KVF_E_POOL_RESERVE);
    EXPECT_ILLEGAL(pool, kvf_pool_fence(pool, ((struct kvf_peer_epoch){0, 2})),
                   KVF_E_POOL_BAD_EPOCH);
    EXPECT_ILLEGAL(pool, kvf_pool_fence(pool, ((struct kvf_peer_epoch){5, 1})), KVF_E_POOL_BAD_ARG);
    EXPECT_ILLEGAL(pool, kvf_pool_tick(pool, 10, NULL, 3), KVF_E_POOL_BAD_ARG);

    /* Every error counted once per call above. */
    struct kvf_pool_stats st;
    kvf_pool_stats(pool, &st);
    static const int expect[KVF_POOL_N_ERRORS] = {
        [-KVF_E_POOL_FULL - 1001] = 2,        [-KVF_E_POOL_BAD_PAGE - 1001] = 5,
        [-KVF_E_POOL_STALE_TAG - 1001] = 5,   [-KVF_E_POOL_NOT_HOLDER - 1001] = 2,
        [-KVF_E_POOL_DOUBLE_FREE - 1001] = 1, [-KVF_E_POOL_NOT_OWNED - 1001] = 3,
        [-KVF_E_POOL_NO_GRANT - 1001] = 4,    [-KVF_E_POOL_BAD_EPOCH - 1001] = 2,
        [-KVF_E_POOL_BAD_SLOT - 1001] = 0,    [-KVF_E_POOL_RESERVE - 1001] = 3,
        [-KVF_E_POOL_BAD_STATE - 1001] = 3,   [-KVF_E_POOL_BAD_ARG - 1001] = 10,
    };
    for (int i = 0; i < KVF_POOL_N_ERRORS; i++)
        ASSERT_EQ_U64(st.errors[i], expect[i]);

    ASSERT_EQ_INT(kvf_pool_fence(pool, w), 2);
    ASSERT_OK(kvf_pool_release(pool, own, KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_release(pool, gr, KVF_HOLDER_SEQ, 0));
    kvf_pool_stats(pool, &st);
    ASSERT_EQ_INT(st.by_state[KVF_PAGE_FREE], 4);
    drain_and_destroy(pool);
}

static void test_read_check(void)
{
    kvf_pool_t *pool = make_pool(2, 1);
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    ASSERT_ERR(kvf_pool_read_check(pool, r.page, r.tag, 0), KVF_E_POOL_BAD_SLOT);
    ASSERT_OK(kvf_pool_set_fill(pool, r, 4));
    for (uint32_t s = 0; s < 4; s++)
        ASSERT_OK(kvf_pool_read_check(pool, r.page, r.tag, s));
    ASSERT_ERR(kvf_pool_read_check(pool, r.page, r.tag, 4), KVF_E_POOL_BAD_SLOT);
    ASSERT_ERR(kvf_pool_read_check(pool, r.page, r.tag ^ 1, 0), KVF_E_POOL_STALE_TAG);
    ASSERT_ERR(kvf_pool_read_check(pool, 2, r.tag, 0), KVF_E_POOL_BAD_PAGE);
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    ASSERT_ERR(kvf_pool_read_check(pool, r.page, r.tag, 0), KVF_E_POOL_BAD_STATE);
    struct kvf_page_ref x = alloc1(pool, &OWNER_B), y = alloc1(pool, &OWNER_B);
    ASSERT_TRUE(x.page == r.page || y.page == r.page);
    /* The page's new owner: the old reference is stale. */
    ASSERT_ERR(kvf_pool_read_check(pool, r.page, r.tag, 0), KVF_E_POOL_STALE_TAG);
    struct kvf_pool_stats st;
    kvf_pool_stats(pool, &st);
    for (int i = 0; i < KVF_POOL_N_ERRORS; i++)
        ASSERT_EQ_U64(st.errors[i], 0); /* a query */
    /* The inline read view gives the same answers, and follows the pages' current state. */
    struct kvf_pool_read_view v;
    kvf_pool_read_view(pool, &v);
    ASSERT_EQ_INT(v.n_pages, 2);
    ASSERT_ERR(kvf_pool_read_check_view(&v, r.page, r.tag, 0), KVF_E_POOL_STALE_TAG);
    ASSERT_ERR(kvf_pool_read_check_view(&v, 2, x.tag, 0), KVF_E_POOL_BAD_PAGE);
    ASSERT_ERR(kvf_pool_read_check_view(&v, x.page, x.tag, 0), KVF_E_POOL_BAD_SLOT);
    ASSERT_OK(kvf_pool_set_fill(pool, x, 1));
    ASSERT_OK(kvf_pool_read_check_view(&v, x.page, x.tag, 0));
    ASSERT_ERR(kvf_pool_read_check_view(&v, x.page, x.tag, 1), KVF_E_POOL_BAD_SLOT);
    ASSERT_OK(kvf_pool_grant(pool, x, writer(pool, 0)));
    ASSERT_ERR(kvf_pool_read_check_view(&v, x.page, x.tag, 0), KVF_E_POOL_BAD_STATE);
    ASSERT_OK(kvf_pool_grant_end(pool, x, writer(pool, 0), 0));
    ASSERT_OK(kvf_pool_release(pool, x, KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_release(pool, y, KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

static void test_scrub_on_free(void)
{
    struct kvf_pool_config c = small_config(2, 1);
    c.scrub_on_free = true;
    kvf_pool_t *pool = NULL;
    ASSERT_OK(kvf_pool_create(&c, &pool));
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    unsigned char *d = kvf_pool_page_data(pool, r.page);
    memset(d, 0x5A, kvf_pool_page_bytes(pool));
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    for (size_t i = 0; i < kvf_pool_page_bytes(pool); i++)
        ASSERT_EQ_INT(d[i], 0);
    drain_and_destroy(pool);
}

static void test_poison_on_free(void)
{
    struct kvf_pool_config c = small_config(2, 1);
    c.poison_on_free = true;
    kvf_pool_t *pool = NULL;
#ifndef KVF_TEST_BUILD
    /* Poison is a test-build feature: a release build refuses it. */
    ASSERT_ERR(kvf_pool_create(&c, &pool), -ENOTSUP);
    ASSERT_NULL(pool);
    return;
#endif
    ASSERT_OK(kvf_pool_create(&c, &pool));
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    unsigned char *d = kvf_pool_page_data(pool, r.page);
    memset(d, 0x5A, kvf_pool_page_bytes(pool));
    /* Freed through HELD and a late proof: the same poison. */
    struct kvf_peer_epoch w = writer(pool, 0);
    ASSERT_OK(kvf_pool_grant(pool, r, w));
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_grant_end(pool, r, w, 0));
    uint32_t expect = KVF_POOL_POISON_HI | (uint32_t)((r.tag ^ OWNER_A.req.lo ^ 7u) & 0xFFFFFu);
    for (size_t off = 0; off < 256; off += 4) {
        uint32_t word;
        memcpy(&word, d + off, 4);
        ASSERT_EQ_U64(word, expect);
        float f;
        memcpy(&f, &word, 4);
        ASSERT_TRUE(isnan(f)); /* a stale read turns the output to NaN */
    }
    struct kvf_page_trailer t;
    memcpy(&t, d + 256, sizeof(t));
    ASSERT_EQ_U64(t.tag, r.tag);
    ASSERT_TRUE(kvf_req_id_eq(t.req, OWNER_A.req));
    ASSERT_EQ_INT(t.tenant, 7);
    ASSERT_EQ_INT(t.slots, 0);
    ASSERT_EQ_U64(t.checksum, KVF_POOL_POISON_MARK);
    drain_and_destroy(pool);
}

/* A pool without writer peers (a prefill worker's own pool): grants are refused, all else works. */
static void test_no_peers(void)
{
    kvf_pool_t *pool = make_pool(2, 0);
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    uint32_t e;
    ASSERT_ERR(kvf_pool_peer_epoch(pool, 0, &e), -EINVAL);
    EXPECT_ILLEGAL(pool, kvf_pool_grant(pool, r, ((struct kvf_peer_epoch){0, 1})),
                   KVF_E_POOL_BAD_ARG);
    EXPECT_ILLEGAL(pool, kvf_pool_fence(pool, ((struct kvf_peer_epoch){0, 1})), KVF_E_POOL_BAD_ARG);
    struct kvf_peer_epoch f[1];
    ASSERT_EQ_INT(kvf_pool_tick(pool, 100000, f, 1), 0);
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

/* Holder counts are 16-bit: the 65536th holder of a kind is refused, and nothing changes. */
static void test_holder_count_bound(void)
{
    kvf_pool_t *pool = make_pool(1, 1);
    struct kvf_page_ref r = alloc1(pool, &OWNER_A);
    for (int i = 1; i < UINT16_MAX; i++)
        ASSERT_OK(kvf_pool_hold(pool, r, KVF_HOLDER_PREFIX));
    ASSERT_EQ_INT(info(pool, r.page).holders[KVF_HOLDER_PREFIX], UINT16_MAX - 1);
    ASSERT_OK(kvf_pool_hold(pool, r, KVF_HOLDER_PREFIX));
    EXPECT_ILLEGAL(pool, kvf_pool_hold(pool, r, KVF_HOLDER_PREFIX), KVF_E_POOL_BAD_ARG);
    for (int i = 0; i < UINT16_MAX; i++)
        ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_PREFIX, 0));
    ASSERT_EQ_INT(info(pool, r.page).state, KVF_PAGE_OWNED);
    ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

/* The checker is a check that can fail: corrupt one field at a time and it must say so. */
static void test_checker_catches_corruption(void)
{
    kvf_pool_t *pool = make_pool(4, 2);
    struct kvf_page_ref r[3];
    ASSERT_OK(kvf_pool_alloc(pool, &OWNER_A, KVF_HOLDER_SEQ, 3, false, r));
    struct kvf_peer_epoch w = writer(pool, 1);
    ASSERT_OK(kvf_pool_grant(pool, r[1], w));
    ASSERT_OK(kvf_pool_grant(pool, r[2], w));
    ASSERT_OK(kvf_pool_release(pool, r[2], KVF_HOLDER_SEQ, 0));
    ASSERT_POOL_OK(pool);
    char why[160];
#define CORRUPT(field, value)                                                                      \
    do {                                                                                           \
        __typeof__(field) saved_ = (field);                                                        \
        (field) = (value);                                                                         \
        ASSERT_FALSE(kvf_pool_check(pool, why, sizeof(why)));                                      \
        ASSERT_TRUE(why[0] != '\0');                                                               \
        (field) = saved_;                                                                          \
        ASSERT_POOL_OK(pool);                                                                      \
    } while (0)
    CORRUPT(pool->hot[3].state, KVF_PAGE_OWNED);               /* free page off the free list */
    CORRUPT(pool->cold[3].holders[0], 1);                      /* free page with a holder */
    CORRUPT(pool->cold[r[0].page].granted, 1);                 /* owned page with a grant */
    CORRUPT(pool->cold[r[1].page].grant_epoch, 7);             /* grant of an unknown epoch */
    CORRUPT(pool->cold[r[1].page].holders[0], 0);              /* granted page without holders */
    CORRUPT(pool->hot[r[1].page].fill, 2);                     /* granted page with a fill */
    CORRUPT(pool->hot[r[0].page].fill, 9);                     /* fill past page_tokens */
    CORRUPT(pool->hot[r[0].page].tag, 0);                      /* allocated without a tag */
    CORRUPT(pool->stats.reserved, 2);                          /* reserved > free */
    CORRUPT(pool->stats.by_state[KVF_PAGE_OWNED], 9);          /* gauge off */
    CORRUPT(pool->ring[pool->free_head], r[0].page);           /* ring names a live page */
    CORRUPT(pool->held_count, 0);                              /* held list length */
    CORRUPT(pool->peers[1].grants, 1);                         /* per-peer grant count */
    CORRUPT(pool->hot[r[2].page].state, KVF_PAGE_QUARANTINED); /* before its deadline */
    CORRUPT(pool->cold[r[0].page].next, 3);  /* owned page linked on the held list */
    CORRUPT(pool->stats.allocs, 99);         /* counters disagree */
    CORRUPT(pool->hot[3].sealed, 1);         /* a FREE page sealed */
    CORRUPT(pool->hot[r[1].page].sealed, 1); /* a GRANTED page sealed */
    CORRUPT(pool->stats.sealed, 1);          /* the sealed gauge off */
#undef CORRUPT
    ASSERT_EQ_INT(kvf_pool_fence(pool, w), 2);
    ASSERT_OK(kvf_pool_release(pool, r[0], KVF_HOLDER_SEQ, 0));
    ASSERT_OK(kvf_pool_release(pool, r[1], KVF_HOLDER_SEQ, 0));
    drain_and_destroy(pool);
}

/* --- Allocation failure by countdown. -------------------------------------------------------- */

struct countdown {
    int fail_at;     /* the allocation number (1-based) that fails; 0 = none */
    int count;       /* allocations attempted */
    long long live;  /* allocations not yet freed */
    long long bytes; /* bytes not yet freed */
};

static void *cd_alloc(void *ctx, size_t bytes, size_t align)
{
    struct countdown *cd = ctx;
    if (++cd->count == cd->fail_at) return NULL;
    void *p = kvf_default_alloc.alloc(kvf_default_alloc.ctx, bytes, align);
    if (p) {
        cd->live++;
        cd->bytes += (long long)bytes;
    }
    return p;
}

static void cd_free(void *ctx, void *p, size_t bytes)
{
    struct countdown *cd = ctx;
    cd->live--;
    cd->bytes -= (long long)bytes;
    kvf_default_alloc.free(kvf_default_alloc.ctx, p, bytes);
}

static void test_create_alloc_failure_countdown(void)
{
    struct countdown cd = {0};
    struct kvf_alloc_ops ops = {cd_alloc, cd_free, &cd};
    int n;
    for (n = 1; n < 100; n++) {
        cd = (struct countdown){.fail_at = n};
        struct kvf_pool_config c = small_config(16, 3);
        c.meta_alloc = &ops;
        c.page_alloc = &ops;
        kvf_pool_t *pool = NULL;
        int rc = kvf_pool_create(&c, &pool);
        if (rc == 0) {
            ASSERT_NOT_NULL(pool);
            ASSERT_POOL_OK(pool);
            struct kvf_page_ref r = alloc1(pool, &OWNER_A);
            ASSERT_OK(kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0));
            kvf_pool_destroy(pool);
            ASSERT_EQ_INT(cd.live, 0);
            ASSERT_EQ_INT(cd.bytes, 0);
            break;
        }
        ASSERT_ERR(rc, -ENOMEM);
        ASSERT_NULL(pool);
        ASSERT_EQ_INT(cd.live, 0); /* nothing leaked, sizes matched */
        ASSERT_EQ_INT(cd.bytes, 0);
    }
    printf("# pool creation succeeded at allocation countdown %d\n", n);
    ASSERT_EQ_INT(n, 8); /* pool, hot, cold, ring, peers, scratch, page data: 7 can fail */
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_create_rejects_bad_config),
    KVF_CASE(test_geometry_and_data),
    KVF_CASE(test_alloc_release_fifo_and_tags),
    KVF_CASE(test_tag_never_zero),
    KVF_CASE(test_holders_by_kind),
    KVF_CASE(test_seal_and_share),
    KVF_CASE(test_grant_then_proof),
    KVF_CASE(test_release_while_granted_holds),
    KVF_CASE(test_hold_timeout_quarantine_then_fence),
    KVF_CASE(test_fence_frees_held_pages),
    KVF_CASE(test_time_going_backwards),
    KVF_CASE(test_reservations),
    KVF_CASE(test_illegal_calls_change_nothing),
    KVF_CASE(test_read_check),
    KVF_CASE(test_scrub_on_free),
    KVF_CASE(test_poison_on_free),
    KVF_CASE(test_no_peers),
    KVF_CASE(test_holder_count_bound),
    KVF_CASE(test_checker_catches_corruption),
    KVF_CASE(test_create_alloc_failure_countdown),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
