/*
 * pool_internal.h — the page pool's private layout, shared by the files of src/pool only.
 *
 * Metadata is split in two arrays indexed by page:
 *
 *   hot[page]   16 bytes (struct kvf_pool_read_entry of pool.h): what the reader check needs
 *               (tag, fill, state). Four pages share a cache line, so one check touches one
 *               line and a scan of a request's page table stays in few lines. A read view
 *               (kvf_pool_read_view) is this array, read-only.
 *   cold[page]  everything else: owner, holders, grant, deadline, free-ring position, held-list
 *               links. Touched only by the owner's transitions and the checker.
 *
 * Free list: a ring of page indices of capacity n_pages. Pages leave at free_head and return at
 * the tail, so it is FIFO and a freed page is reused as late as possible. Each FREE page records
 * its slot in the ring (cold.ring_pos), which lets the checker prove that the ring holds exactly
 * the FREE pages, each once, without scratch memory.
 *
 * Held list: an intrusive doubly linked list (cold.prev/next, KVF__POOL_NIL at the ends) of the
 * HELD pages ordered by deadline. A page is appended when it goes HELD with deadline
 * clock + hold_timeout, where clock never decreases (see `clock_ms`) and hold_timeout is
 * constant, so append order is deadline order and tick only looks at the head.
 *
 * Accounting identities (checked by kvf_pool_check):
 *   by_state[FREE] == free_count == pages on the ring
 *   by_state[...] sum to n_pages
 *   reserved <= free_count
 *   grants == by_state[GRANTED] + by_state[HELD] + by_state[QUARANTINED] == sum of peer.grants
 *   by_state[QUARANTINED] == sum of peer.quarantined
 *   held_count == by_state[HELD] == length of the held list
 */
#ifndef KVF_POOL_INTERNAL_H
#define KVF_POOL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/pool.h"

#define KVF__POOL_NIL UINT32_MAX

/* The reader check's fields, one small record per page: the public read-view entry, so a read
 * view is the hot array itself. */
_Static_assert(sizeof(struct kvf_pool_read_entry) == 16, "four hot records per cache line");

struct kvf__page_cold {
    struct kvf_owner owner;               /* zero when FREE */
    uint64_t deadline_ms;                 /* HELD, QUARANTINED: when the hold expires(d) */
    uint16_t holders[KVF_HOLDER__NKINDS]; /* holder count per kind */
    uint16_t grant_peer;                  /* valid when granted */
    uint32_t grant_epoch;                 /* valid when granted */
    uint32_t ring_pos;                    /* FREE: its slot in the free ring */
    uint32_t prev, next;                  /* HELD: held-list links */
    uint8_t granted;                      /* 1 while a write grant is outstanding */
};

/* One writer peer. */
struct kvf__peer {
    uint32_t epoch;       /* current connection epoch; starts at 1, +1 per fence */
    uint32_t grants;      /* grants of this peer outstanding (all are of the current epoch) */
    uint32_t quarantined; /* QUARANTINED pages whose grant is this peer's */
};

struct kvf_pool {
    /* Read-mostly configuration. */
    struct kvf_pool_geometry geo;
    uint32_t n_pages;
    uint16_t max_peers;
    bool scrub_on_free;
    bool poison_on_free;
    uint64_t hold_timeout_ms;
    size_t page_bytes;     /* stride */
    size_t trailer_offset; /* inside a page */
    struct kvf_alloc_ops meta_alloc;
    struct kvf_alloc_ops page_alloc;

    /* Page data, apart from the metadata. */
    unsigned char *data; /* n_pages * page_bytes */

    /* Metadata. */
    struct kvf_pool_read_entry *hot; /* [n_pages] */
    struct kvf__page_cold *cold;     /* [n_pages] */
    uint32_t *ring;                  /* [n_pages] free ring */
    uint32_t free_head;              /* ring slot of the oldest free page */
    uint32_t free_count;
    uint32_t held_head, held_tail; /* held list, KVF__POOL_NIL when empty */
    uint32_t held_count;
    struct kvf__peer *peers; /* [max(max_peers, 1)] */
    uint32_t *check_scratch; /* [2 * max(max_peers, 1)]: per-peer counts for kvf_pool_check */

    uint64_t last_tag; /* the last tag issued (tag_seed before the first); 0 is skipped */
    uint64_t clock_ms; /* the largest `now` seen: never decreases */

    struct kvf_pool_stats stats; /* gauges kept current; counters */
};

/* Counts an illegal call and returns its code. The only state it touches is the error counter. */
static inline int kvf__pool_fail(struct kvf_pool *pool, int code)
{
    int i = -code - 1001;
    if (i >= 0 && i < KVF_POOL_N_ERRORS) pool->stats.errors[i]++;
    return code;
}

static inline unsigned char *kvf__pool_page_ptr(const struct kvf_pool *pool, uint32_t page)
{
    return pool->data + (size_t)page * pool->page_bytes;
}

static inline uint32_t kvf__pool_holders(const struct kvf__page_cold *c)
{
    uint32_t n = 0;
    for (int k = 0; k < KVF_HOLDER__NKINDS; k++)
        n += c->holders[k];
    return n;
}

/* Moves `page` (OWNED, HELD or QUARANTINED, already off the held list, grant already dropped)
 * to FREE: scrub or poison, clear owner and holders, append to the free ring. O(1), plus
 * O(page_bytes) when scrubbing or poisoning. Cannot fail. */
void kvf__pool_make_free(struct kvf_pool *pool, uint32_t page);

/* Takes `page` off the held list. O(1). */
void kvf__pool_held_unlink(struct kvf_pool *pool, uint32_t page);

/* Validates one page's per-state invariants (not its list membership). */
bool kvf__pool_page_ok(const struct kvf_pool *pool, uint32_t page, char *why, size_t why_len);

/* Every transition checks the page it just changed: O(1). On in debug builds and in test builds
 * whatever NDEBUG says (the test builds are optimised and define it), like ALWAYS(): a violation
 * names the page and the invariant, then aborts. Release builds compile it out. */
#if defined(KVF_TEST_BUILD) || !defined(NDEBUG)
void kvf__pool_debug_page(const struct kvf_pool *pool, uint32_t page, const char *file, int line);
#define KVF__POOL_DEBUG_PAGE(pool, page) kvf__pool_debug_page((pool), (page), __FILE__, __LINE__)
#else
#define KVF__POOL_DEBUG_PAGE(pool, page) ((void)0)
#endif

#endif /* KVF_POOL_INTERNAL_H */
