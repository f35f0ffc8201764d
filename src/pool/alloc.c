/* Reservations, allocation, holders and release: the FREE ⇄ OWNED side of the lifecycle, and the
 * GRANTED → HELD edge that release takes when a write grant is still outstanding. */
#include <string.h>

#include "pool_internal.h"

/* --- Reservations. ------------------------------------------------------------------------- */

int kvf_pool_reserve(kvf_pool_t *pool, uint32_t n)
{
    /* reserved <= free_count always holds, so the subtraction cannot wrap. */
    if (n > pool->free_count - pool->stats.reserved)
        return kvf__pool_fail(pool, KVF_E_POOL_RESERVE);
    pool->stats.reserved += n;
    return 0;
}

int kvf_pool_unreserve(kvf_pool_t *pool, uint32_t n)
{
    if (n > pool->stats.reserved) return kvf__pool_fail(pool, KVF_E_POOL_RESERVE);
    pool->stats.reserved -= n;
    return 0;
}

uint32_t kvf_pool_available(const kvf_pool_t *pool)
{
    return pool->free_count - pool->stats.reserved;
}

/* --- Allocation. --------------------------------------------------------------------------- */

static uint64_t new_tag(struct kvf_pool *pool)
{
    /* 0 means "never allocated" and is never a tag; a 64-bit counter does not come back round
     * to a tag it issued within any pool's lifetime (2^64 allocations). */
    uint64_t t = pool->last_tag + 1;
    if (t == 0) t = 1;
    pool->last_tag = t;
    return t;
}

int kvf_pool_alloc(kvf_pool_t *pool, const struct kvf_owner *owner, enum kvf_holder holder,
                   uint32_t n, bool from_reserve, struct kvf_page_ref *out)
{
    /* Find first: every check that can fail comes before the first change. */
    if (!owner || !out || n == 0 || (unsigned)holder >= KVF_HOLDER__NKINDS)
        return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    if (from_reserve) {
        if (n > pool->stats.reserved) return kvf__pool_fail(pool, KVF_E_POOL_RESERVE);
    } else if (n > pool->free_count - pool->stats.reserved) {
        return kvf__pool_fail(pool, KVF_E_POOL_FULL);
    }

    /* Then commit: n pages off the head of the ring, which holds at least n. O(n). */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t page = pool->ring[pool->free_head];
        pool->free_head = pool->free_head + 1 == pool->n_pages ? 0 : pool->free_head + 1;
        struct kvf_pool_read_entry *h = &pool->hot[page];
        struct kvf__page_cold *c = &pool->cold[page];
        h->tag = new_tag(pool);
        h->fill = 0;
        h->state = KVF_PAGE_OWNED;
        c->owner = *owner;
        c->holders[holder] = 1;
        out[i] = (struct kvf_page_ref){page, h->tag};
        KVF__POOL_DEBUG_PAGE(pool, page);
    }
    pool->free_count -= n;
    if (from_reserve) pool->stats.reserved -= n;
    pool->stats.by_state[KVF_PAGE_FREE] -= n;
    pool->stats.by_state[KVF_PAGE_OWNED] += n;
    pool->stats.allocs += n;
    return 0;
}

/* --- Holders. ------------------------------------------------------------------------------ */

int kvf_pool_hold(kvf_pool_t *pool, struct kvf_page_ref ref, enum kvf_holder holder)
{
    if ((unsigned)holder >= KVF_HOLDER__NKINDS) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    if (ref.page >= pool->n_pages) return kvf__pool_fail(pool, KVF_E_POOL_BAD_PAGE);
    struct kvf_pool_read_entry *h = &pool->hot[ref.page];
    struct kvf__page_cold *c = &pool->cold[ref.page];
    if (h->tag != ref.tag) return kvf__pool_fail(pool, KVF_E_POOL_STALE_TAG);
    /* A sealed page is held only through kvf_pool_share, which checks the reader's tenant. */
    if ((h->state != KVF_PAGE_OWNED && h->state != KVF_PAGE_GRANTED) || h->sealed)
        return kvf__pool_fail(pool, KVF_E_POOL_BAD_STATE);
    if (c->holders[holder] == UINT16_MAX) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    c->holders[holder]++;
    return 0;
}

/* Appends a page that just went HELD to the held list. Deadlines are clock_ms + the constant
 * hold timeout and clock_ms never decreases, so the tail has the latest deadline. O(1). */
static void held_append(struct kvf_pool *pool, uint32_t page)
{
    struct kvf__page_cold *c = &pool->cold[page];
    c->prev = pool->held_tail;
    c->next = KVF__POOL_NIL;
    if (pool->held_tail == KVF__POOL_NIL)
        pool->held_head = page;
    else
        pool->cold[pool->held_tail].next = page;
    pool->held_tail = page;
    pool->held_count++;
}

int kvf_pool_release(kvf_pool_t *pool, struct kvf_page_ref ref, enum kvf_holder holder,
                     uint64_t now_ms)
{
    if ((unsigned)holder >= KVF_HOLDER__NKINDS) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    if (ref.page >= pool->n_pages) return kvf__pool_fail(pool, KVF_E_POOL_BAD_PAGE);
    struct kvf_pool_read_entry *h = &pool->hot[ref.page];
    struct kvf__page_cold *c = &pool->cold[ref.page];
    /* A FREE page keeps its last tag, so releasing it again with that tag is recognised as the
     * double release it is; with any other tag the caller's reference is simply stale. */
    if (h->state == KVF_PAGE_FREE && h->tag == ref.tag)
        return kvf__pool_fail(pool, KVF_E_POOL_DOUBLE_FREE);
    if (h->tag != ref.tag) return kvf__pool_fail(pool, KVF_E_POOL_STALE_TAG);
    /* HELD and QUARANTINED pages have no holders, so this also refuses them. */
    if (c->holders[holder] == 0) return kvf__pool_fail(pool, KVF_E_POOL_NOT_HOLDER);

    c->holders[holder]--;
    if (kvf__pool_holders(c) != 0) return 0;
    if (h->state == KVF_PAGE_OWNED) {
        kvf__pool_make_free(pool, ref.page);
        return 0;
    }
    /* GRANTED with its last holder gone: a write may still be in flight, so the page is held
     * until proof or fence. The deadline uses the pool's clock, which ignores a `now` that went
     * backwards; that keeps the held list ordered (see held_append). */
    if (now_ms > pool->clock_ms) pool->clock_ms = now_ms;
    uint64_t d = pool->clock_ms + pool->hold_timeout_ms;
    c->deadline_ms = d < pool->clock_ms ? UINT64_MAX : d;
    h->state = KVF_PAGE_HELD;
    held_append(pool, ref.page);
    pool->stats.by_state[KVF_PAGE_GRANTED]--;
    pool->stats.by_state[KVF_PAGE_HELD]++;
    pool->stats.holds++;
    KVF__POOL_DEBUG_PAGE(pool, ref.page);
    return 0;
}

int kvf_pool_set_fill(kvf_pool_t *pool, struct kvf_page_ref ref, uint32_t fill)
{
    if (ref.page >= pool->n_pages) return kvf__pool_fail(pool, KVF_E_POOL_BAD_PAGE);
    struct kvf_pool_read_entry *h = &pool->hot[ref.page];
    if (h->tag != ref.tag) return kvf__pool_fail(pool, KVF_E_POOL_STALE_TAG);
    if (h->state != KVF_PAGE_OWNED || h->sealed) return kvf__pool_fail(pool, KVF_E_POOL_BAD_STATE);
    if (fill < h->fill || fill > pool->geo.page_tokens)
        return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    h->fill = fill;
    return 0;
}

/* --- Freeing. ------------------------------------------------------------------------------ */

/* Fills a freed page with the poison pattern of pool.h, naming its previous owner and tag. */
static void poison_page(struct kvf_pool *pool, uint32_t page)
{
    const struct kvf_pool_read_entry *h = &pool->hot[page];
    const struct kvf__page_cold *c = &pool->cold[page];
    unsigned char *base = kvf__pool_page_ptr(pool, page);
    uint32_t word =
        KVF_POOL_POISON_HI | (uint32_t)((h->tag ^ c->owner.req.lo ^ c->owner.tenant) & 0xFFFFFu);
    /* trailer_offset is a multiple of 64, so whole words cover data and padding. */
    for (size_t off = 0; off < pool->trailer_offset; off += sizeof(word))
        memcpy(base + off, &word, sizeof(word));
    struct kvf_page_trailer t;
    memset(&t, 0, sizeof(t));
    t.tag = h->tag;
    t.req = c->owner.req;
    t.tenant = c->owner.tenant;
    t.slots = 0;
    t.checksum = KVF_POOL_POISON_MARK;
    memcpy(base + pool->trailer_offset, &t, sizeof(t));
}

void kvf__pool_make_free(struct kvf_pool *pool, uint32_t page)
{
    struct kvf_pool_read_entry *h = &pool->hot[page];
    struct kvf__page_cold *c = &pool->cold[page];
    enum kvf_page_state from = (enum kvf_page_state)h->state;
    if (pool->poison_on_free)
        poison_page(pool, page);
    else if (pool->scrub_on_free)
        memset(kvf__pool_page_ptr(pool, page), 0, pool->page_bytes);
    if (h->sealed) pool->stats.sealed--;
    h->state = KVF_PAGE_FREE;
    h->fill = 0;
    h->sealed = 0;
    memset(&c->owner, 0, sizeof(c->owner));
    memset(c->holders, 0, sizeof(c->holders));
    c->granted = 0;
    c->grant_peer = 0;
    c->grant_epoch = 0;
    c->deadline_ms = 0;
    c->prev = c->next = KVF__POOL_NIL;
    /* Append at the tail of the ring: the ring never holds more than n_pages, so the slot is
     * free. */
    uint32_t slot = pool->free_head + pool->free_count;
    if (slot >= pool->n_pages) slot -= pool->n_pages;
    pool->ring[slot] = page;
    c->ring_pos = slot;
    pool->free_count++;
    pool->stats.by_state[from]--;
    pool->stats.by_state[KVF_PAGE_FREE]++;
    pool->stats.releases++;
    KVF__POOL_DEBUG_PAGE(pool, page);
}
