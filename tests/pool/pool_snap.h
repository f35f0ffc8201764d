/*
 * pool_snap.h — helpers shared by the pool tests: a small pool configuration, and a full
 * snapshot of a pool (every page's info, the stats, the reservation, every peer's epoch) so a
 * test can show that an illegal call changed nothing but its error counter.
 */
#ifndef KVF_TEST_POOL_SNAP_H
#define KVF_TEST_POOL_SNAP_H

#include <stdlib.h>
#include <string.h>

#include "kvf_test.h"
#include "kvfence/pool.h"

#define SNAP_MAX_PAGES 256
#define SNAP_MAX_PEERS 8

struct pool_snap {
    uint32_t n_pages;
    struct kvf_page_info info[SNAP_MAX_PAGES];
    struct kvf_pool_stats stats;
    uint32_t available;
    uint32_t epochs[SNAP_MAX_PEERS];
};

/* A small geometry: 2 layers, 1 head of 4 f32, 4 slots per page (256 data bytes). */
static inline struct kvf_pool_config small_config(uint32_t n_pages, uint16_t max_peers)
{
    struct kvf_pool_config c;
    memset(&c, 0, sizeof(c));
    c.geo = (struct kvf_pool_geometry){
        .n_layers = 2, .n_kv_heads = 1, .head_dim = 4, .page_tokens = 4, .elem_bytes = 4};
    c.n_pages = n_pages;
    c.max_peers = max_peers;
    c.hold_timeout_ms = 1000;
    c.tag_seed = 0x1000;
    return c;
}

static inline void snap_take(const kvf_pool_t *pool, struct pool_snap *s)
{
    memset(s, 0, sizeof(*s));
    s->n_pages = kvf_pool_n_pages(pool);
    ASSERT_LE_INT(s->n_pages, SNAP_MAX_PAGES);
    for (uint32_t p = 0; p < s->n_pages; p++)
        ASSERT_OK(kvf_pool_page_info(pool, p, &s->info[p]));
    kvf_pool_stats(pool, &s->stats);
    s->available = kvf_pool_available(pool);
    for (uint16_t p = 0; p < SNAP_MAX_PEERS; p++)
        if (kvf_pool_peer_epoch(pool, p, &s->epochs[p]) != 0) s->epochs[p] = 0;
}

/* Asserts that `after` equals `before` except that the error counter of `code` grew by one. */
static inline void snap_expect_one_error(const struct pool_snap *before,
                                         const struct pool_snap *after, int code)
{
    struct pool_snap b = *before, a = *after;
    int i = -code - 1001;
    ASSERT_TRUE(i >= 0 && i < KVF_POOL_N_ERRORS);
    ASSERT_EQ_U64(a.stats.errors[i], b.stats.errors[i] + 1);
    memset(a.stats.errors, 0, sizeof(a.stats.errors));
    memset(b.stats.errors, 0, sizeof(b.stats.errors));
    for (uint32_t p = 0; p < b.n_pages; p++) {
        const struct kvf_page_info *x = &b.info[p], *y = &a.info[p];
        ASSERT_EQ_INT(x->state, y->state);
        ASSERT_EQ_U64(x->tag, y->tag);
        ASSERT_TRUE(kvf_req_id_eq(x->owner.req, y->owner.req));
        ASSERT_EQ_INT(x->owner.tenant, y->owner.tenant);
        ASSERT_MEMEQ(x->holders, y->holders, sizeof(x->holders));
        ASSERT_EQ_INT(x->granted, y->granted);
        ASSERT_EQ_INT(x->grant.peer, y->grant.peer);
        ASSERT_EQ_INT(x->grant.epoch, y->grant.epoch);
        ASSERT_EQ_INT(x->fill, y->fill);
        ASSERT_EQ_U64(x->deadline_ms, y->deadline_ms);
    }
    ASSERT_MEMEQ(&a.stats, &b.stats, sizeof(a.stats));
    ASSERT_EQ_INT(a.available, b.available);
    ASSERT_MEMEQ(a.epochs, b.epochs, sizeof(a.epochs));
}

/* The full checker must pass; print why when it does not. */
#define ASSERT_POOL_OK(pool)                                                                       \
    do {                                                                                           \
        char why_[160];                                                                            \
        if (!kvf_pool_check((pool), why_, sizeof(why_))) KVF_FAIL("pool check: %s", why_);         \
    } while (0)

/* Runs `call`, which must fail with `code` and leave the pool as it was but for that counter. */
#define EXPECT_ILLEGAL(pool, call, code)                                                           \
    do {                                                                                           \
        static struct pool_snap before_, after_;                                                   \
        snap_take((pool), &before_);                                                               \
        ASSERT_ERR((call), (code));                                                                \
        snap_take((pool), &after_);                                                                \
        snap_expect_one_error(&before_, &after_, (code));                                          \
        ASSERT_POOL_OK(pool);                                                                      \
    } while (0)

#endif /* KVF_TEST_POOL_SNAP_H */
