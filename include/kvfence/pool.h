/*
 * kvfence/pool.h — the KV page pool: pages that are free only when nothing can still write them.
 *
 * A pool holds n_pages pages. A page holds page_tokens token slots of K and V for every layer of
 * the model plus a trailer (see "Page layout" below). The pool hands pages out, tags them,
 * counts who holds them, records which remote writer may write them (write grants), and never
 * lets a page go back to the free list while a grant on it is outstanding. Page metadata lives
 * in host memory apart from the page data, so no remote write can touch it.
 *
 * Lifecycle of one page:
 *
 *              alloc(owner, holder)                      grant(peer, epoch)
 *     FREE ───────────────────────────▶ OWNED ─────────────────────────────────▶ GRANTED
 *      ▲                                 │  ▲                                       │
 *      │ release of the last holder,     │  │ grant_end (proof: verified            │ release of
 * the │ no grant                        │  │ completion or drain ack), or fence    │ last holder
 *      ├─────────────────────────────────┘  └───────────────────────────────────────┤ (abort,
 * failure) │                                                                            ▼ │
 * grant_end (late proof)                                               HELD
 *      ├──────────────────────────────────────────────────────────────────────────── │
 *      │                                                                  tick: now ≥ deadline
 *      │                                                                            ▼
 *      └──────────────── fence(peer, epoch) ──────────────────────────────── QUARANTINED
 *                        (also from HELD)
 *
 * Transition table (function → edge):
 *
 *   kvf_pool_alloc      FREE → OWNED            n pages, all or nothing; new tag each; one holder
 *   kvf_pool_hold       OWNED|GRANTED → same    one more holder of a kind
 *   kvf_pool_release    OWNED → OWNED | FREE    FREE when the last holder goes
 *                       GRANTED → GRANTED|HELD  HELD when the last holder goes; deadline set
 *   kvf_pool_grant      OWNED → GRANTED         to one (peer, epoch); fill reset to 0
 *   kvf_pool_grant_end  GRANTED → OWNED         proof; fill set to the verified slot count
 *                       HELD → FREE             late proof
 *   kvf_pool_tick       HELD → QUARANTINED      deadline passed; the peer is returned to fence
 *   kvf_pool_fence      GRANTED → OWNED         every grant of (peer, epoch) revoked, fill 0
 *                       HELD|QUARANTINED → FREE
 *   kvf_pool_seal       OWNED → OWNED (sealed)  every slot verified; never written again
 *   kvf_pool_share      OWNED (sealed) → same   one more holder, a reader of the owner's tenant
 *
 * Sealed pages (the prefix cache, shared within a tenant): a flag of OWNED, not a state of its
 * own — a sealed page is OWNED in every count and every reader check — that forbids every write
 * (grant, set_fill) and every hold but share's, which checks the reader's tenant against the
 * owner's. Its holders are its readers: the cache (PREFIX), the requests reading it (SEQ) and
 * the transfers reading it (XFER_SRC). Eviction is the cache's release; the page goes FREE (and
 * unsealed) only when its last reader releases it, and the next allocation gives it a new tag.
 *
 * Invariants of each state (kvf_pool_check() walks them all):
 *
 *   FREE         no owner, no holders, no grant, fill 0; on the free list exactly once. It keeps
 *                its last tag (0 if never allocated), so a second release is told apart.
 *   OWNED        an owner, ≥ 1 holder, no grant; 0 ≤ fill ≤ page_tokens; sealed only with
 *                fill == page_tokens. Every other state is never sealed.
 *   GRANTED      an owner, ≥ 1 holder, one grant whose epoch is the peer's current epoch; fill 0.
 *   HELD         an owner (the last one), no holders, one current-epoch grant, a deadline; fill 0;
 *                on the held list exactly once, the list ordered by deadline.
 *   QUARANTINED  like HELD but past its deadline and off the held list; it leaves only by fence.
 *
 * Pool-wide identities: free + owned + granted + held + quarantined == n_pages;
 * reserved ≤ free; grants_outstanding == granted + held + quarantined; sealed (gauge) == the
 * sealed pages; the free list holds
 * exactly the FREE pages, in the order they were freed (FIFO: a freed page is reused as late as
 * possible). Quiescence: when no request is live and every fence has resolved, free == n_pages.
 *
 * Why QUARANTINED ends only by fence: a page goes there because its writer neither proved it was
 * done nor could be shown to have stopped within the hold timeout. Time proves nothing; the
 * engine has been told to fence the peer, and only that fence frees the page. A drain proof that
 * arrives after the quarantine is refused (KVF_E_POOL_BAD_STATE) and the page waits for the fence.
 *
 * Time: the pool keeps a clock, the largest now_ms it was given (by release or tick). A now_ms
 * behind it is taken as the clock itself, so a caller's clock step backwards neither shortens a
 * hold nor reorders the held list; deadlines are clock + hold_timeout_ms at the release.
 *
 * Tags: a 64-bit value that changes every time a page is allocated and is never reused by this
 * pool (tag_seed + a counter; 0 is never a tag). Callers name pages by (page, tag); a call with a
 * stale tag is refused.
 *
 * Errors: every call that can fail returns 0 (or a count) or a negative KVF_E_POOL_* code. Each
 * illegal call returns its own code, is counted in kvf_pool_stats.errors, and leaves the pool
 * exactly as it was. Checks run in this order, the first that fails decides the code: argument
 * shape (BAD_ARG: holder kind, zero count, NULL) → page index (BAD_PAGE) → tag (STALE_TAG;
 * release first reports DOUBLE_FREE for a FREE page named by its last tag) → state (NOT_HOLDER,
 * NOT_OWNED, NO_GRANT, BAD_STATE) → writer (BAD_ARG for a peer ≥ max_peers, BAD_EPOCH) → value
 * (BAD_ARG for a fill out of range) → capacity (FULL, RESERVE). Queries (read checks,
 * page_info, peer_epoch) count nothing.
 * Debug builds (no NDEBUG) also assert each changed page's invariants after every transition.
 *
 * Threading: a pool has one owner — the worker loop that created it. No function here locks;
 * none may be called from two threads at once. The page data may be read by compute threads
 * the owner dispatches, and written by a remote peer holding a grant; the metadata never is.
 *
 * Work bounds: alloc and release are O(1) per page (plus O(page bytes) when a page is scrubbed
 * or poisoned on free); grant (which clears the 64-byte trailer), grant_end, hold, set_fill
 * and read checks are O(1); tick is O(pages that expire + max_peers); fence is O(n_pages),
 * skipped when the epoch holds no grant (fences are rare); kvf_pool_check is
 * O(n_pages + max_peers); create zeroes all page memory once, O(n_pages * page bytes).
 *
 * Memory: page data comes from cfg->page_alloc (a method table; aligned host memory by default,
 * a device backend later) in one region of n_pages * page_bytes; metadata from cfg->meta_alloc,
 * in host memory apart from it. Scrub, poison and the trailer clear at grant write the page
 * memory from the host, so a backend must hand out host-addressable memory until a device
 * backend brings its own way to clear.
 */
#ifndef KVFENCE_POOL_H
#define KVFENCE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/common.h"

typedef struct kvf_pool kvf_pool_t;

/* Page states. The Promela model (spin/handoff.pml) uses these names verbatim. */
enum kvf_page_state {
    KVF_PAGE_FREE = 0,
    KVF_PAGE_OWNED = 1,
    KVF_PAGE_GRANTED = 2,
    KVF_PAGE_HELD = 3,
    KVF_PAGE_QUARANTINED = 4,
    KVF_PAGE__NSTATES = 5,
};

/* Typed holders: who keeps an OWNED or GRANTED page alive. A page may have several holders of
 * several kinds (counted per kind); it leaves OWNED/GRANTED when the last one is released. */
enum kvf_holder {
    KVF_HOLDER_SEQ = 0, /* the sequence (request) the page belongs to */
    KVF_HOLDER_XFER_SRC =
        1, /* an outgoing put that reads the page (prefill side), until local completion */
    KVF_HOLDER_PREFIX = 2, /* the prefix cache (reserved; per tenant) */
    KVF_HOLDER__NKINDS = 3,
};

/* Who a page belongs to. */
struct kvf_owner {
    kvf_req_id_t req;
    uint32_t tenant;
};

/* (page, tag): how callers name a page. */
struct kvf_page_ref {
    uint32_t page;
    uint64_t tag;
};

/* A writer connection: peer id and its connection epoch. */
struct kvf_peer_epoch {
    uint16_t peer;
    uint32_t epoch;
};

/*
 * Page geometry. Page layout (page-major: a page holds every layer's slots):
 *
 *   [ layer 0: K (slot, kv_head, dim) | V (slot, kv_head, dim) ] ... [ layer L-1: K | V ]
 *   [ padding to 64 bytes ][ trailer: struct kvf_page_trailer, 64 bytes ]
 *
 * The pool keeps pages at a stride of page_bytes (a multiple of 64).
 */
struct kvf_pool_geometry {
    uint32_t n_layers;    /* model layers */
    uint32_t n_kv_heads;  /* K/V heads per layer */
    uint32_t head_dim;    /* elements per head */
    uint32_t page_tokens; /* token slots per page (default 16) */
    uint32_t elem_bytes;  /* bytes per K/V element: 4 (f32) or 2 (f16/bf16) */
};

/* The page trailer, written by the writer after the data (with an ordering fence between), and
 * checked by the reader before it commits the page. Cleared by kvf_pool_grant. */
struct kvf_page_trailer {
    uint64_t tag;         /* the tag of the grant the data was written for */
    kvf_req_id_t req;     /* the request it was written for */
    uint32_t tenant;      /* that request's tenant */
    uint32_t slots;       /* token slots written */
    uint64_t checksum;    /* XXH3-64 of the page's data bytes [0, data_bytes) */
    uint64_t epoch_nonce; /* writer's (epoch << 32 | nonce) */
    uint8_t reserved[16];
};
_Static_assert(sizeof(struct kvf_page_trailer) == 64, "trailer is one cache line");

/* The trailer's epoch_nonce for a write under grant nonce `nonce` from a writer at `epoch`. */
static inline uint64_t kvf_trailer_epoch_nonce(uint32_t epoch, uint64_t nonce)
{
    return (uint64_t)epoch << 32 | (uint32_t)nonce;
}

/* Bytes of one K (or V) block for one layer: page_tokens × n_kv_heads × head_dim × elem_bytes. */
static inline size_t kvf_geo_block_bytes(const struct kvf_pool_geometry *g)
{
    return (size_t)g->page_tokens * g->n_kv_heads * g->head_dim * g->elem_bytes;
}
/* Bytes of K and V for every layer, before the trailer's padding. */
static inline size_t kvf_geo_data_bytes(const struct kvf_pool_geometry *g)
{
    return (size_t)g->n_layers * 2 * kvf_geo_block_bytes(g);
}
/* Offset of the trailer inside a page: data rounded up to 64. */
static inline size_t kvf_geo_trailer_offset(const struct kvf_pool_geometry *g)
{
    return (kvf_geo_data_bytes(g) + 63) & ~(size_t)63;
}
/* The page stride. */
static inline size_t kvf_geo_page_bytes(const struct kvf_pool_geometry *g)
{
    return kvf_geo_trailer_offset(g) + sizeof(struct kvf_page_trailer);
}
/* Offset of layer `l`'s K block (kv = 0) or V block (kv = 1) inside a page. */
static inline size_t kvf_geo_kv_offset(const struct kvf_pool_geometry *g, uint32_t l, int kv)
{
    return ((size_t)l * 2 + (size_t)kv) * kvf_geo_block_bytes(g);
}

struct kvf_pool_config {
    struct kvf_pool_geometry geo;
    uint32_t n_pages;                       /* ≥ 1 */
    uint16_t max_peers;                     /* writer peers 0..max_peers-1 that may hold grants */
    uint64_t hold_timeout_ms;               /* HELD → QUARANTINED after this long; 0 = 30000 */
    uint64_t tag_seed;                      /* tags are tag_seed + 1, + 2, ...; never 0 */
    bool scrub_on_free;                     /* zero a page's data when it becomes FREE */
    bool poison_on_free;                    /* test builds only: fill freed pages with a pattern
                                               naming the previous owner and tag (see below) */
    const struct kvf_alloc_ops *meta_alloc; /* metadata (host); NULL = kvf_default_alloc */
    const struct kvf_alloc_ops *page_alloc; /* page data; NULL = aligned host memory */
};

/* The poison pattern: every 32-bit word of a poisoned page's data is
 * KVF_POOL_POISON_HI | (low 20 bits of (prev tag ^ prev req.lo ^ prev tenant)), a quiet NaN as
 * f32, and the trailer holds the previous owner and tag with slots = 0 and checksum =
 * KVF_POOL_POISON_MARK. A stale read therefore turns the output to NaN: visible, not silent. */
#define KVF_POOL_POISON_HI   0x7FC00000u
#define KVF_POOL_POISON_MARK 0x504f49534f4e4544ull /* "POISONED" */

/*
 * Creates a pool. On success *out owns it and 0 is returned. On failure (-EINVAL for a bad
 * config, -ENOMEM when an allocation fails, -ENOTSUP for poison_on_free outside a test build)
 * nothing is allocated and *out is untouched.
 */
int kvf_pool_create(const struct kvf_pool_config *cfg, kvf_pool_t **out);

/* Frees the pool and its page memory. The caller guarantees that no peer can still write the
 * pages (every endpoint that could was closed with a fence). NULL is a no-op. */
void kvf_pool_destroy(kvf_pool_t *pool);

/* Geometry, size and data of the pool. */
const struct kvf_pool_geometry *kvf_pool_geometry(const kvf_pool_t *pool);
uint32_t kvf_pool_n_pages(const kvf_pool_t *pool);
size_t kvf_pool_page_bytes(const kvf_pool_t *pool);
/* The whole data region (for registering it with a transport once). */
void *kvf_pool_data(const kvf_pool_t *pool, size_t *bytes);
/* Page `page`'s data (NULL if out of range). Reading it is only meaningful after a read check. */
void *kvf_pool_page_data(const kvf_pool_t *pool, uint32_t page);

/* --- Reservations: pages promised to admitted requests but not yet allocated. ---------------- */

/* Promises n more pages. Fails with KVF_E_POOL_RESERVE (nothing changed) unless
 * reserved + n ≤ free pages. */
int kvf_pool_reserve(kvf_pool_t *pool, uint32_t n);
/* Gives back n promised pages. KVF_E_POOL_RESERVE if n > reserved. */
int kvf_pool_unreserve(kvf_pool_t *pool, uint32_t n);
/* Pages that are free and not promised: what admission may still promise. */
uint32_t kvf_pool_available(const kvf_pool_t *pool);

/* --- Allocation and holders. ---------------------------------------------------------------- */

/*
 * Allocates n pages for `owner`, each OWNED with one holder of kind `holder`, fill 0, and a new
 * tag; writes (page, tag) to out[0..n). With from_reserve, the pages come out of the reservation
 * (n ≤ reserved); otherwise out of the unpromised free pages (n ≤ free − reserved).
 * All or nothing: on failure (KVF_E_POOL_FULL, KVF_E_POOL_RESERVE, KVF_E_POOL_BAD_ARG) nothing
 * changed. O(n).
 */
int kvf_pool_alloc(kvf_pool_t *pool, const struct kvf_owner *owner, enum kvf_holder holder,
                   uint32_t n, bool from_reserve, struct kvf_page_ref *out);

/* Adds one holder of kind `holder` to an OWNED or GRANTED page. Errors: KVF_E_POOL_BAD_ARG (bad
 * kind, or 65535 holders of it already), KVF_E_POOL_BAD_PAGE, KVF_E_POOL_STALE_TAG,
 * KVF_E_POOL_BAD_STATE (any other state). */
int kvf_pool_hold(kvf_pool_t *pool, struct kvf_page_ref ref, enum kvf_holder holder);

/*
 * Releases one holder of kind `holder`. When it was the last holder: an OWNED page becomes FREE
 * (scrubbed or poisoned if configured, appended to the free list); a GRANTED page becomes HELD
 * with deadline now_ms + hold_timeout_ms — it is not free, and will not be, until proof or fence.
 * Errors: KVF_E_POOL_BAD_ARG (bad kind), KVF_E_POOL_BAD_PAGE, KVF_E_POOL_DOUBLE_FREE (page is
 * FREE and ref names its last tag), KVF_E_POOL_STALE_TAG, KVF_E_POOL_NOT_HOLDER (no holder of
 * that kind, including HELD/QUARANTINED pages). now_ms behind the pool's clock counts as the
 * clock (see Time).
 */
int kvf_pool_release(kvf_pool_t *pool, struct kvf_page_ref ref, enum kvf_holder holder,
                     uint64_t now_ms);

/* Sets an OWNED page's verified fill (the decode side's own appends). Fill never decreases and
 * never exceeds page_tokens (KVF_E_POOL_BAD_ARG). Also KVF_E_POOL_BAD_PAGE,
 * KVF_E_POOL_STALE_TAG, KVF_E_POOL_BAD_STATE (not OWNED). */
int kvf_pool_set_fill(kvf_pool_t *pool, struct kvf_page_ref ref, uint32_t fill);

/* --- Sharing within a tenant (the prefix cache). --------------------------------------------- */

/*
 * Seals an OWNED page whose every slot is verified (fill == page_tokens) and that no grant can
 * write: from now until it is FREE again it is never written — no grant (kvf_pool_grant refuses
 * it), no fill change — and it is held only through kvf_pool_share, by its owner's tenant. Its
 * holders are its readers: the cache (KVF_HOLDER_PREFIX), each request reading it
 * (KVF_HOLDER_SEQ) and each transfer reading it (KVF_HOLDER_XFER_SRC); it goes FREE only when
 * the last of them releases it, so eviction is the cache's release and can never pull a page
 * from under a forward pass or a put. The next allocation gives it a new tag, so a reference
 * to the evicted page is stale. A partly filled page is never sealed (KVF_E_POOL_BAD_ARG):
 * sharing one would let the next owner's appends land in another request's prefix.
 * Errors: KVF_E_POOL_BAD_PAGE, KVF_E_POOL_STALE_TAG, KVF_E_POOL_BAD_STATE (not OWNED, or sealed
 * already), KVF_E_POOL_BAD_ARG (fill < page_tokens). O(1).
 */
int kvf_pool_seal(kvf_pool_t *pool, struct kvf_page_ref ref);

/*
 * Adds one holder of kind `holder` to a sealed page for a reader of `tenant`: the page's owner
 * must be that tenant (KVF_E_POOL_FOREIGN otherwise, whatever the caller's cache key said).
 * Also KVF_E_POOL_BAD_ARG (bad kind, or 65535 holders of it), KVF_E_POOL_BAD_PAGE,
 * KVF_E_POOL_STALE_TAG, KVF_E_POOL_BAD_STATE (not a sealed OWNED page). O(1).
 */
int kvf_pool_share(kvf_pool_t *pool, struct kvf_page_ref ref, uint32_t tenant,
                   enum kvf_holder holder);

/* --- Write grants. ------------------------------------------------------------------------- */

/*
 * Grants (peer, epoch) the right to write an OWNED page: GRANTED, fill 0, trailer cleared.
 * epoch must be the peer's current epoch (KVF_E_POOL_BAD_EPOCH) and peer < max_peers
 * (KVF_E_POOL_BAD_ARG); the page must be OWNED (KVF_E_POOL_NOT_OWNED). Also
 * KVF_E_POOL_BAD_PAGE, KVF_E_POOL_STALE_TAG.
 */
int kvf_pool_grant(kvf_pool_t *pool, struct kvf_page_ref ref, struct kvf_peer_epoch writer);

/*
 * Ends a grant by proof: a completion that verified (verified_fill = the slots verified) or a
 * drain acknowledgement from the writer (verified_fill = 0). GRANTED → OWNED with that fill;
 * HELD → FREE. The grant must be exactly (ref, writer) (KVF_E_POOL_NO_GRANT); a QUARANTINED
 * page refuses proof (KVF_E_POOL_BAD_STATE) and waits for its fence. verified_fill above
 * page_tokens is KVF_E_POOL_BAD_ARG. Also KVF_E_POOL_BAD_PAGE, KVF_E_POOL_STALE_TAG.
 */
int kvf_pool_grant_end(kvf_pool_t *pool, struct kvf_page_ref ref, struct kvf_peer_epoch writer,
                       uint32_t verified_fill);

/* The peer's current epoch (starts at 1; every fence adds 1). -EINVAL if peer ≥ max_peers. */
int kvf_pool_peer_epoch(const kvf_pool_t *pool, uint16_t peer, uint32_t *epoch);

/*
 * Advances time: every HELD page whose deadline ≤ now_ms becomes QUARANTINED. The distinct
 * (peer, epoch) pairs that now need a fence — every writer holding a grant on a QUARANTINED
 * page, including pages quarantined by earlier ticks and not yet fenced — are written to
 * fence_out[0..max_out); returns how many there are (which may exceed max_out: call again with
 * more room). Time alone never frees a page. now_ms behind the pool's clock counts as the clock.
 * fence_out may be NULL only with max_out 0 (else KVF_E_POOL_BAD_ARG). O(expired pages + peers).
 */
int kvf_pool_tick(kvf_pool_t *pool, uint64_t now_ms, struct kvf_peer_epoch *fence_out,
                  uint32_t max_out);

/*
 * Records that the engine has fenced `writer` — closed its endpoint in the mode where the
 * transport guarantees it can no longer write local memory. Bumps the peer's epoch, then
 * revokes every grant of (peer, epoch): GRANTED → OWNED with fill 0 (the request must fail:
 * some of its writes may have been dropped); HELD and QUARANTINED → FREE. writer.epoch must be
 * the peer's current epoch (KVF_E_POOL_BAD_EPOCH); peer ≥ max_peers is KVF_E_POOL_BAD_ARG.
 * Returns the number of grants revoked. Pages it frees join the free list in page order.
 * O(n_pages).
 */
int kvf_pool_fence(kvf_pool_t *pool, struct kvf_peer_epoch writer);

/* --- Reading. ------------------------------------------------------------------------------ */

/*
 * The reader check: 0 if slot `slot` of page `page` may be read by the holder of `tag` — the tag
 * is the page's current tag, the page is OWNED, and slot < verified fill. Otherwise
 * KVF_E_POOL_BAD_PAGE, KVF_E_POOL_STALE_TAG, KVF_E_POOL_BAD_STATE or KVF_E_POOL_BAD_SLOT.
 * Does not count errors (it is a query, and must be cheap: one cache line).
 */
int kvf_pool_read_check(const kvf_pool_t *pool, uint32_t page, uint64_t tag, uint32_t slot);

/* The reader check of a reader of `tenant`: kvf_pool_read_check, and the page's owner must be
 * that tenant (KVF_E_POOL_FOREIGN, checked after the state) — for pages that may be shared. */
int kvf_pool_read_check_tenant(const kvf_pool_t *pool, uint32_t page, uint64_t tag, uint32_t tenant,
                               uint32_t slot);

/*
 * The same check, inline, for loops that check many pages (attention over a page table): a
 * call out of line costs about as much as the check itself. A read view is a read-only window
 * on the pool's per-page reader fields (16 bytes a page, four to a cache line); it stays valid,
 * and always shows the pages' current state, until kvf_pool_destroy. Like every pool function
 * it may only be used while no other call changes the pool (see Threading). Cannot fail.
 */
struct kvf_pool_read_entry {
    uint64_t tag;   /* current tag (a FREE page keeps its last one; 0 if never allocated) */
    uint32_t fill;  /* verified slots */
    uint8_t state;  /* enum kvf_page_state */
    uint8_t sealed; /* an OWNED page sealed for sharing (kvf_pool_seal): never written again */
    uint8_t pad_[2];
};
struct kvf_pool_read_view {
    const struct kvf_pool_read_entry *pages; /* [n_pages], borrowed from the pool */
    uint32_t n_pages;
};
void kvf_pool_read_view(const kvf_pool_t *pool, struct kvf_pool_read_view *out);

/* kvf_pool_read_check over a read view: the same result, same codes, not counted. */
static inline int kvf_pool_read_check_view(const struct kvf_pool_read_view *v, uint32_t page,
                                           uint64_t tag, uint32_t slot)
{
    if (page >= v->n_pages) return KVF_E_POOL_BAD_PAGE;
    const struct kvf_pool_read_entry *e = &v->pages[page];
    if (e->tag != tag) return KVF_E_POOL_STALE_TAG;
    if (e->state != KVF_PAGE_OWNED) return KVF_E_POOL_BAD_STATE;
    if (slot >= e->fill) return KVF_E_POOL_BAD_SLOT;
    return 0;
}

/* --- Inspection. --------------------------------------------------------------------------- */

struct kvf_page_info {
    enum kvf_page_state state;
    bool sealed; /* OWNED and sealed: shared read-only within its owner's tenant */
    uint64_t tag;
    struct kvf_owner owner;
    uint16_t holders[KVF_HOLDER__NKINDS];
    bool granted;
    struct kvf_peer_epoch grant;
    uint32_t fill;
    uint64_t deadline_ms; /* HELD and QUARANTINED: when the hold expires(d) */
};
int kvf_pool_page_info(const kvf_pool_t *pool, uint32_t page, struct kvf_page_info *out);

#define KVF_POOL_N_ERRORS 13 /* KVF_E_POOL_FULL .. KVF_E_POOL_FOREIGN */

struct kvf_pool_stats {
    uint32_t n_pages;
    uint32_t by_state[KVF_PAGE__NSTATES];  /* gauges: pages in each state */
    uint32_t reserved;                     /* gauge: pages promised, not yet allocated */
    uint32_t grants;                       /* gauge: grants outstanding */
    uint64_t allocs, releases;             /* counters: pages allocated, pages freed */
    uint64_t grants_issued, grants_proved; /* counters */
    uint64_t holds;                        /* counter: pages that went HELD */
    uint64_t quarantines;                  /* counter: pages that went QUARANTINED */
    uint64_t fences;                       /* counter: fences recorded */
    uint64_t fence_revoked;                /* counter: grants revoked by fences */
    uint32_t sealed;                       /* gauge: OWNED pages sealed for sharing */
    uint64_t seals, shares;                /* counters: pages sealed; holds taken by share */
    uint64_t errors[KVF_POOL_N_ERRORS];    /* counters: illegal calls, by -(code) - 1001 */
};
void kvf_pool_stats(const kvf_pool_t *pool, struct kvf_pool_stats *out);

/*
 * The full consistency walk: every per-state invariant and pool-wide identity above. Returns
 * true if all hold; otherwise false, with the first violation described in why[0..why_len)
 * (why may be NULL). O(n_pages + free list + held list).
 */
bool kvf_pool_check(const kvf_pool_t *pool, char *why, size_t why_len);

/* The name of a state ("KVF_PAGE_FREE", ...). */
const char *kvf_page_state_name(enum kvf_page_state s);

#endif /* KVFENCE_POOL_H */
