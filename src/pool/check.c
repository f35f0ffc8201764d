/* The reader check, and the consistency checker that walks every invariant of pool.h. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pool_internal.h"

int kvf_pool_read_check(const kvf_pool_t *pool, uint32_t page, uint64_t tag, uint32_t slot)
{
    if (page >= pool->n_pages) return KVF_E_POOL_BAD_PAGE;
    /* One 16-byte record: tag, fill and state share a cache line. */
    const struct kvf_pool_read_entry *h = &pool->hot[page];
    if (h->tag != tag) return KVF_E_POOL_STALE_TAG;
    if (h->state != KVF_PAGE_OWNED) return KVF_E_POOL_BAD_STATE;
    if (slot >= h->fill) return KVF_E_POOL_BAD_SLOT;
    return 0;
}

void kvf_pool_read_view(const kvf_pool_t *pool, struct kvf_pool_read_view *out)
{
    out->pages = pool->hot;
    out->n_pages = pool->n_pages;
}

/* Writes a description of the violation (if the caller wants one) and returns false, so a check
 * reads `if (bad) return why_fail(...)`. */
__attribute__((format(printf, 3, 4))) static bool why_fail(char *why, size_t len, const char *fmt,
                                                           ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool owner_is_zero(const struct kvf_owner *o)
{
    return o->req.lo == 0 && o->req.hi == 0 && o->tenant == 0;
}

bool kvf__pool_page_ok(const struct kvf_pool *pool, uint32_t page, char *why, size_t len)
{
    const struct kvf_pool_read_entry *h = &pool->hot[page];
    const struct kvf__page_cold *c = &pool->cold[page];
    uint32_t holders = kvf__pool_holders(c);
    const char *name = kvf_page_state_name((enum kvf_page_state)h->state);
    if (h->state >= KVF_PAGE__NSTATES)
        return why_fail(why, len, "page %u: bad state %u", page, h->state);
    if (h->fill > pool->geo.page_tokens)
        return why_fail(why, len, "page %u: fill %u > page_tokens", page, h->fill);

    /* Only HELD pages carry held-list links; the list walk checks those. */
    /* Only an OWNED page may be sealed, and only whole: no grant can write it, every slot is
     * verified (pool.h, kvf_pool_seal). */
    if (h->sealed && (h->state != KVF_PAGE_OWNED || h->fill != pool->geo.page_tokens))
        return why_fail(why, len, "page %u: sealed while %s with fill %u", page, name, h->fill);
    if (h->state != KVF_PAGE_HELD && (c->prev != KVF__POOL_NIL || c->next != KVF__POOL_NIL))
        return why_fail(why, len, "page %u: %s linked on the held list", page, name);
    if (h->state == KVF_PAGE_FREE) {
        if (!owner_is_zero(&c->owner) || holders || c->granted || h->fill)
            return why_fail(why, len, "page %u: FREE with owner, holders, grant or fill", page);
        if (c->ring_pos >= pool->n_pages || pool->ring[c->ring_pos] != page)
            return why_fail(why, len, "page %u: FREE but not at its ring slot", page);
        return true;
    }
    /* Every other state belongs to an allocation, hence to a tag. */
    if (h->tag == 0) return why_fail(why, len, "page %u: %s without a tag", page, name);
    if (h->state == KVF_PAGE_OWNED || h->state == KVF_PAGE_GRANTED) {
        if (holders == 0) return why_fail(why, len, "page %u: %s without holders", page, name);
    } else if (holders != 0) {
        return why_fail(why, len, "page %u: %s with holders", page, name);
    }
    if (h->state == KVF_PAGE_OWNED) {
        if (c->granted) return why_fail(why, len, "page %u: OWNED with a grant", page);
        return true;
    }
    /* GRANTED, HELD, QUARANTINED: one grant of the writer's current epoch, nothing verified. */
    if (!c->granted) return why_fail(why, len, "page %u: %s without a grant", page, name);
    if (c->grant_peer >= pool->max_peers)
        return why_fail(why, len, "page %u: grant to unknown peer %u", page, c->grant_peer);
    if (c->grant_epoch != pool->peers[c->grant_peer].epoch)
        return why_fail(why, len, "page %u: grant of peer %u epoch %u, current %u", page,
                        c->grant_peer, c->grant_epoch, pool->peers[c->grant_peer].epoch);
    if (h->fill != 0) return why_fail(why, len, "page %u: %s with fill %u", page, name, h->fill);
    if (h->state == KVF_PAGE_QUARANTINED && c->deadline_ms > pool->clock_ms)
        return why_fail(why, len, "page %u: QUARANTINED before its deadline", page);
    return true;
}

#if defined(KVF_TEST_BUILD) || !defined(NDEBUG)
void kvf__pool_debug_page(const struct kvf_pool *pool, uint32_t page, const char *file, int line)
{
    char why[192], msg[256];
    if (kvf__pool_page_ok(pool, page, why, sizeof(why))) return;
    snprintf(msg, sizeof(msg), "KVF__POOL_DEBUG_PAGE (%s)", why);
    kvf__check_failed(msg, file, line);
}
#endif

bool kvf_pool_check(const kvf_pool_t *pool, char *why, size_t len)
{
    const struct kvf_pool_stats *st = &pool->stats;
    uint32_t by_state[KVF_PAGE__NSTATES] = {0}, sealed = 0;
    uint32_t n = pool->n_pages;

    /* Every page on its own: O(n_pages). */
    for (uint32_t page = 0; page < n; page++) {
        if (!kvf__pool_page_ok(pool, page, why, len)) return false;
        by_state[pool->hot[page].state]++;
        sealed += pool->hot[page].sealed != 0;
    }
    if (sealed != st->sealed)
        return why_fail(why, len, "%u pages sealed, gauge says %u", sealed, st->sealed);
    uint32_t sum = 0;
    for (int s = 0; s < KVF_PAGE__NSTATES; s++) {
        if (by_state[s] != st->by_state[s])
            return why_fail(why, len, "%s: %u pages, gauge says %u",
                            kvf_page_state_name((enum kvf_page_state)s), by_state[s],
                            st->by_state[s]);
        sum += by_state[s];
    }
    if (sum != n || st->n_pages != n) return why_fail(why, len, "states sum to %u, not %u", sum, n);

    /* The free ring: free_count slots from free_head, each a FREE page sitting at the slot it
     * records. With free_count == FREE pages, and each FREE page at the slot it records (checked
     * above), this is a one-to-one match: every FREE page on the ring exactly once. */
    if (pool->free_count != by_state[KVF_PAGE_FREE] || pool->free_head >= n)
        return why_fail(why, len, "free ring holds %u, FREE pages %u", pool->free_count,
                        by_state[KVF_PAGE_FREE]);
    for (uint32_t i = 0; i < pool->free_count; i++) {
        uint32_t slot = (uint32_t)(((uint64_t)pool->free_head + i) % n);
        uint32_t page = pool->ring[slot];
        if (page >= n || pool->hot[page].state != KVF_PAGE_FREE ||
            pool->cold[page].ring_pos != slot)
            return why_fail(why, len, "free ring slot %u names page %u, not a FREE page there",
                            slot, page);
    }
    if (st->reserved > pool->free_count)
        return why_fail(why, len, "reserved %u > free %u", st->reserved, pool->free_count);

    /* The held list: consistent links from the head, HELD pages only, deadlines in order, as
     * long as the HELD count. Consistent back-links rule out a cycle. O(held). A HELD page may be
     * past its deadline here: release can move the clock, and only tick quarantines. */
    uint32_t walked = 0, prev = KVF__POOL_NIL;
    uint64_t last_deadline = 0;
    for (uint32_t page = pool->held_head; page != KVF__POOL_NIL; page = pool->cold[page].next) {
        if (page >= n || walked >= n)
            return why_fail(why, len, "held list runs away at page %u", page);
        const struct kvf__page_cold *c = &pool->cold[page];
        if (pool->hot[page].state != KVF_PAGE_HELD || c->prev != prev)
            return why_fail(why, len, "held list: page %u is not HELD or badly linked", page);
        if (c->deadline_ms < last_deadline)
            return why_fail(why, len, "held list: page %u out of deadline order", page);
        last_deadline = c->deadline_ms;
        prev = page;
        walked++;
    }
    if (prev != pool->held_tail || walked != pool->held_count || walked != by_state[KVF_PAGE_HELD])
        return why_fail(why, len, "held list length %u, HELD pages %u", walked,
                        by_state[KVF_PAGE_HELD]);

    /* Grants, per peer and in total. O(n_pages + max_peers). */
    uint32_t grants =
        by_state[KVF_PAGE_GRANTED] + by_state[KVF_PAGE_HELD] + by_state[KVF_PAGE_QUARANTINED];
    if (st->grants != grants)
        return why_fail(why, len, "grants gauge %u, granted pages %u", st->grants, grants);
    /* Count each peer's grants in one pass into the scratch the pool keeps for this walk (the
     * pool is single-owner, so the checker may use it although the pool is const here). */
    uint32_t *g = pool->check_scratch, *q = pool->check_scratch + pool->max_peers;
    memset(pool->check_scratch, 0, sizeof(*g) * 2u * pool->max_peers);
    for (uint32_t page = 0; page < n; page++) {
        const struct kvf__page_cold *c = &pool->cold[page];
        if (!c->granted || c->grant_peer >= pool->max_peers) continue;
        g[c->grant_peer]++;
        q[c->grant_peer] += pool->hot[page].state == KVF_PAGE_QUARANTINED;
    }
    uint64_t peer_grants = 0, peer_quarantined = 0;
    for (uint32_t p = 0; p < pool->max_peers; p++) {
        if (g[p] != pool->peers[p].grants || q[p] != pool->peers[p].quarantined)
            return why_fail(why, len, "peer %u: %u grants (%u quarantined), counted %u (%u)", p,
                            g[p], q[p], pool->peers[p].grants, pool->peers[p].quarantined);
        if (pool->peers[p].epoch == 0) return why_fail(why, len, "peer %u: epoch 0", p);
        peer_grants += g[p];
        peer_quarantined += q[p];
    }
    if (peer_grants != grants || peer_quarantined != by_state[KVF_PAGE_QUARANTINED])
        return why_fail(why, len, "grants held by unknown peers");

    /* Counters agree with the gauges: every page allocated was either freed or is still out. */
    if (st->allocs - st->releases != (uint64_t)(n - by_state[KVF_PAGE_FREE]))
        return why_fail(why, len, "allocs %" PRIu64 " - releases %" PRIu64 " != pages out %u",
                        st->allocs, st->releases, n - by_state[KVF_PAGE_FREE]);
    if (why && len) why[0] = '\0';
    return true;
}
