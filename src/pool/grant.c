/* Write grants and how they end: by proof (grant_end), or by fencing the writer's epoch. Also
 * time (tick), which moves expired HELD pages to QUARANTINED and never frees anything. */
#include <string.h>

#include "pool_internal.h"

void kvf__pool_held_unlink(struct kvf_pool *pool, uint32_t page)
{
    struct kvf__page_cold *c = &pool->cold[page];
    if (c->prev == KVF__POOL_NIL)
        pool->held_head = c->next;
    else
        pool->cold[c->prev].next = c->next;
    if (c->next == KVF__POOL_NIL)
        pool->held_tail = c->prev;
    else
        pool->cold[c->next].prev = c->prev;
    c->prev = c->next = KVF__POOL_NIL;
    pool->held_count--;
}

/* Drops the grant record of `page` from the accounting; the caller moves the page on. */
static void drop_grant(struct kvf_pool *pool, uint32_t page)
{
    struct kvf__page_cold *c = &pool->cold[page];
    pool->peers[c->grant_peer].grants--;
    pool->stats.grants--;
    c->granted = 0;
    c->grant_peer = 0;
    c->grant_epoch = 0;
}

int kvf_pool_grant(kvf_pool_t *pool, struct kvf_page_ref ref, struct kvf_peer_epoch writer)
{
    if (ref.page >= pool->n_pages) return kvf__pool_fail(pool, KVF_E_POOL_BAD_PAGE);
    struct kvf_pool_read_entry *h = &pool->hot[ref.page];
    struct kvf__page_cold *c = &pool->cold[ref.page];
    if (h->tag != ref.tag) return kvf__pool_fail(pool, KVF_E_POOL_STALE_TAG);
    if (h->state != KVF_PAGE_OWNED) return kvf__pool_fail(pool, KVF_E_POOL_NOT_OWNED);
    if (h->sealed) return kvf__pool_fail(pool, KVF_E_POOL_BAD_STATE); /* never written again */
    if (writer.peer >= pool->max_peers) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    if (writer.epoch != pool->peers[writer.peer].epoch)
        return kvf__pool_fail(pool, KVF_E_POOL_BAD_EPOCH);

    /* The writer fills the page from slot 0 and the reader verifies its trailer, so neither the
     * old fill nor an old trailer may survive into the grant. */
    memset(kvf__pool_page_ptr(pool, ref.page) + pool->trailer_offset, 0,
           sizeof(struct kvf_page_trailer));
    h->fill = 0;
    h->state = KVF_PAGE_GRANTED;
    c->granted = 1;
    c->grant_peer = writer.peer;
    c->grant_epoch = writer.epoch;
    pool->peers[writer.peer].grants++;
    pool->stats.grants++;
    pool->stats.grants_issued++;
    pool->stats.by_state[KVF_PAGE_OWNED]--;
    pool->stats.by_state[KVF_PAGE_GRANTED]++;
    KVF__POOL_DEBUG_PAGE(pool, ref.page);
    return 0;
}

int kvf_pool_grant_end(kvf_pool_t *pool, struct kvf_page_ref ref, struct kvf_peer_epoch writer,
                       uint32_t verified_fill)
{
    if (ref.page >= pool->n_pages) return kvf__pool_fail(pool, KVF_E_POOL_BAD_PAGE);
    struct kvf_pool_read_entry *h = &pool->hot[ref.page];
    struct kvf__page_cold *c = &pool->cold[ref.page];
    if (h->tag != ref.tag) return kvf__pool_fail(pool, KVF_E_POOL_STALE_TAG);
    /* A quarantined page's writer was not shown to have stopped in time; the engine was told to
     * fence it, and only that fence frees the page (see pool.h). */
    if (h->state == KVF_PAGE_QUARANTINED) return kvf__pool_fail(pool, KVF_E_POOL_BAD_STATE);
    if (!c->granted || c->grant_peer != writer.peer || c->grant_epoch != writer.epoch)
        return kvf__pool_fail(pool, KVF_E_POOL_NO_GRANT);
    if (verified_fill > pool->geo.page_tokens) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);

    pool->stats.grants_proved++;
    if (h->state == KVF_PAGE_GRANTED) {
        drop_grant(pool, ref.page);
        h->fill = verified_fill;
        h->state = KVF_PAGE_OWNED;
        pool->stats.by_state[KVF_PAGE_GRANTED]--;
        pool->stats.by_state[KVF_PAGE_OWNED]++;
        KVF__POOL_DEBUG_PAGE(pool, ref.page);
        return 0;
    }
    /* HELD: nobody holds the page any more, and the writer has now proved it is done. */
    kvf__pool_held_unlink(pool, ref.page);
    drop_grant(pool, ref.page);
    kvf__pool_make_free(pool, ref.page);
    return 0;
}

int kvf_pool_tick(kvf_pool_t *pool, uint64_t now_ms, struct kvf_peer_epoch *fence_out,
                  uint32_t max_out)
{
    if (!fence_out && max_out) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    /* A `now` behind the clock is treated as the clock: time never runs backwards here, so a
     * clock step on the caller's side can neither expire nor un-expire anything early. */
    if (now_ms > pool->clock_ms) pool->clock_ms = now_ms;
    /* The held list is in deadline order: stop at the first page not yet due. O(expired). */
    while (pool->held_head != KVF__POOL_NIL &&
           pool->cold[pool->held_head].deadline_ms <= pool->clock_ms) {
        uint32_t page = pool->held_head;
        kvf__pool_held_unlink(pool, page);
        pool->hot[page].state = KVF_PAGE_QUARANTINED;
        pool->peers[pool->cold[page].grant_peer].quarantined++;
        pool->stats.by_state[KVF_PAGE_HELD]--;
        pool->stats.by_state[KVF_PAGE_QUARANTINED]++;
        pool->stats.quarantines++;
        KVF__POOL_DEBUG_PAGE(pool, page);
    }
    /* Every grant is of its peer's current epoch, so the peers with quarantined pages name the
     * (peer, epoch) pairs to fence. O(max_peers). */
    uint32_t n = 0;
    for (uint32_t p = 0; p < pool->max_peers; p++) {
        if (pool->peers[p].quarantined == 0) continue;
        if (n < max_out) fence_out[n] = (struct kvf_peer_epoch){(uint16_t)p, pool->peers[p].epoch};
        n++;
    }
    return (int)n;
}

int kvf_pool_fence(kvf_pool_t *pool, struct kvf_peer_epoch writer)
{
    if (writer.peer >= pool->max_peers) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    struct kvf__peer *peer = &pool->peers[writer.peer];
    if (writer.epoch != peer->epoch) return kvf__pool_fail(pool, KVF_E_POOL_BAD_EPOCH);

    /* The epoch moves first: from here on no grant can be issued to, or proved by, the fenced
     * epoch. Epoch 0 is skipped on wrap-around (after 2^32 fences of one peer). */
    peer->epoch = peer->epoch + 1 ? peer->epoch + 1 : 1;
    pool->stats.fences++;
    uint32_t revoked = 0;
    /* O(n_pages), skipped when the epoch held no grant; fences are rare. Pages freed here join
     * the free ring in page order. */
    for (uint32_t page = 0; page < pool->n_pages && peer->grants > 0; page++) {
        struct kvf_pool_read_entry *h = &pool->hot[page];
        struct kvf__page_cold *c = &pool->cold[page];
        if (!c->granted || c->grant_peer != writer.peer) continue;
        revoked++;
        switch ((enum kvf_page_state)h->state) {
        case KVF_PAGE_GRANTED:
            /* Some writes may have been dropped by the fence: nothing of this page is verified. */
            drop_grant(pool, page);
            h->fill = 0;
            h->state = KVF_PAGE_OWNED;
            pool->stats.by_state[KVF_PAGE_GRANTED]--;
            pool->stats.by_state[KVF_PAGE_OWNED]++;
            KVF__POOL_DEBUG_PAGE(pool, page);
            break;
        case KVF_PAGE_HELD:
            kvf__pool_held_unlink(pool, page);
            drop_grant(pool, page);
            kvf__pool_make_free(pool, page);
            break;
        case KVF_PAGE_QUARANTINED:
            peer->quarantined--;
            drop_grant(pool, page);
            kvf__pool_make_free(pool, page);
            break;
        default:
            /* A grant on a FREE or OWNED page would break the invariants; the checker reports
             * it. Nothing here can repair it safely, so it is left as it is. */
            revoked--;
            break;
        }
    }
    pool->stats.fence_revoked += revoked;
    return (int)revoked;
}
