/*
 * prefix_cache.c — a prefill worker's cache of its tenants' computed prompt pages
 * (docs/PREFIX_CACHE.md).
 *
 * An entry is one whole page of one prompt: its tenant, the page_tokens token ids it holds, and
 * its parent — the (page, tag) of the cached page before it in the same prompt, none for a first
 * page. A prompt's pages are found in order, each by (tenant, parent, tokens) compared exactly,
 * so a match at page i means every token of pages 0..i is the same as when the page was computed
 * (a hash is only a filter before the comparison: a collision never shares a page). The entry's
 * page is sealed in the pool and held by the cache (KVF_HOLDER_PREFIX); a job that takes it holds
 * it through kvf_pool_share, which refuses another tenant's page by itself.
 *
 * Eviction: least recently used first. A lookup or an insertion touches its pages last to first,
 * so a prompt's first page is always more recent than the pages that follow it, and a parent is
 * evicted after its children. Evicting releases the cache's hold; the pool frees the page when
 * its last reader (a job computing from it, a put reading it) lets go.
 *
 * Work bounds: a lookup or an insertion of one page scans the entries, O(max_pages), with a
 * 64-bit hash compared before the tokens. One prefill worker's loop owns the cache (no locks).
 */
#include <stdlib.h>
#include <string.h>

#include "prefill_internal.h"
#include <xxhash.h>

#define PC_NIL UINT32_MAX

struct pc_entry {
    bool used;
    uint32_t tenant;
    struct kvf_page_ref parent; /* {PC_NIL, 0}: the prompt's first page */
    struct kvf_page_ref ref;
    uint64_t hash;       /* of the tokens: the filter before the comparison */
    uint32_t prev, next; /* LRU list: head is the most recent */
};

struct kvf__pcache {
    uint32_t max, n, pt;
    struct pc_entry *e; /* [max] */
    int32_t *tokens;    /* [max * pt]: entry i's tokens at i * pt */
    uint32_t head, tail;
    uint32_t *scratch; /* [max]: the entries a lookup or an insertion touched, in order */
    struct kvf_prefix_cache_stats st;
};

struct kvf__pcache *kvf__pcache_new(uint32_t max_pages, uint32_t page_tokens)
{
    if (!max_pages || !page_tokens) return NULL;
    struct kvf__pcache *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->max = max_pages;
    c->pt = page_tokens;
    c->e = calloc(max_pages, sizeof(*c->e));
    c->tokens = calloc((size_t)max_pages * page_tokens, sizeof(int32_t));
    c->scratch = calloc(max_pages, sizeof(uint32_t));
    if (!c->e || !c->tokens || !c->scratch) {
        free(c->e);
        free(c->tokens);
        free(c->scratch);
        free(c);
        return NULL;
    }
    c->head = c->tail = PC_NIL;
    return c;
}

static void lru_unlink(struct kvf__pcache *c, uint32_t i)
{
    struct pc_entry *e = &c->e[i];
    if (e->prev != PC_NIL)
        c->e[e->prev].next = e->next;
    else
        c->head = e->next;
    if (e->next != PC_NIL)
        c->e[e->next].prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = PC_NIL;
}

static void lru_front(struct kvf__pcache *c, uint32_t i)
{
    struct pc_entry *e = &c->e[i];
    e->prev = PC_NIL;
    e->next = c->head;
    if (c->head != PC_NIL) c->e[c->head].prev = i;
    c->head = i;
    if (c->tail == PC_NIL) c->tail = i;
}

static void touch(struct kvf__pcache *c, uint32_t i)
{
    lru_unlink(c, i);
    lru_front(c, i);
}

/* Drops entry i: the cache's hold on its page goes (the pool frees the page at its last
 * reader). */
static void drop(struct kvf__pcache *c, kvf_pool_t *pool, uint32_t i, uint64_t now)
{
    lru_unlink(c, i);
    kvf_pool_release(pool, c->e[i].ref, KVF_HOLDER_PREFIX, now);
    memset(&c->e[i], 0, sizeof(c->e[i]));
    c->n--;
}

void kvf__pcache_free(struct kvf__pcache *c, kvf_pool_t *pool, uint64_t now)
{
    if (!c) return;
    while (c->tail != PC_NIL)
        drop(c, pool, c->tail, now);
    free(c->e);
    free(c->tokens);
    free(c->scratch);
    free(c);
}

static uint64_t page_hash(const struct kvf__pcache *c, const int32_t *tokens)
{
    return XXH3_64bits(tokens, (size_t)c->pt * sizeof(int32_t));
}

static bool ref_eq(struct kvf_page_ref a, struct kvf_page_ref b)
{
    return a.page == b.page && a.tag == b.tag;
}

/* The entry of (tenant, parent, tokens), or PC_NIL. */
static uint32_t find(const struct kvf__pcache *c, uint32_t tenant, struct kvf_page_ref parent,
                     const int32_t *tokens, uint64_t h)
{
    for (uint32_t i = 0; i < c->max; i++) {
        const struct pc_entry *e = &c->e[i];
        if (e->used && e->hash == h && e->tenant == tenant && ref_eq(e->parent, parent) &&
            memcmp(c->tokens + (size_t)i * c->pt, tokens, (size_t)c->pt * sizeof(int32_t)) == 0)
            return i;
    }
    return PC_NIL;
}

uint32_t kvf__pcache_take(struct kvf__pcache *c, kvf_pool_t *pool, uint32_t tenant,
                          const int32_t *tokens, uint32_t max_pages, struct kvf_page_ref *out)
{
    struct kvf_page_ref parent = {PC_NIL, 0};
    uint32_t k = 0;
    for (; k < max_pages && k < c->max; k++) {
        const int32_t *t = tokens + (size_t)k * c->pt;
        uint32_t i = find(c, tenant, parent, t, page_hash(c, t));
        /* The pool checks the tenant again: a page of another tenant is never shared. */
        if (i == PC_NIL || kvf_pool_share(pool, c->e[i].ref, tenant, KVF_HOLDER_SEQ) < 0) break;
        out[k] = parent = c->e[i].ref;
        c->scratch[k] = i;
    }
    /* Last to first: the first page ends the most recent. */
    for (uint32_t x = k; x-- > 0;)
        touch(c, c->scratch[x]);
    if (k) {
        c->st.hits++;
        c->st.hit_pages += k;
    } else {
        c->st.misses++;
    }
    return k;
}

uint32_t kvf__pcache_evict(struct kvf__pcache *c, kvf_pool_t *pool, uint32_t n, uint64_t now)
{
    uint32_t done = 0;
    while (done < n && c->tail != PC_NIL) {
        drop(c, pool, c->tail, now);
        done++;
    }
    c->st.evictions += done;
    return done;
}

void kvf__pcache_put(struct kvf__pcache *c, kvf_pool_t *pool, uint32_t tenant,
                     const int32_t *tokens, const struct kvf_page_ref *src, uint32_t from,
                     uint32_t n_full, uint64_t now)
{
    struct kvf_page_ref parent = from ? src[from - 1] : (struct kvf_page_ref){PC_NIL, 0};
    uint32_t n_added = 0;
    /* At most the cache's size: past it, the next eviction would take this prompt's own first
     * pages, which later ones hang off. */
    for (uint32_t k = from; k < n_full && n_added < c->max; k++) {
        const int32_t *t = tokens + (size_t)k * c->pt;
        uint64_t h = page_hash(c, t);
        /* Another job cached the same page meanwhile: this prompt's later pages would hang off
         * a page no lookup reaches, so the insertion stops here. */
        if (find(c, tenant, parent, t, h) != PC_NIL) break;
        if (c->n == c->max) kvf__pcache_evict(c, pool, 1, now);
        /* Sealed whole (fill == page_tokens) and held by the cache; a page the pool refuses
         * (not whole, or not this job's any more) ends the insertion. */
        if (kvf_pool_seal(pool, src[k]) < 0) break;
        if (kvf_pool_share(pool, src[k], tenant, KVF_HOLDER_PREFIX) < 0) break;
        uint32_t i = 0;
        while (c->e[i].used)
            i++;
        c->e[i] = (struct pc_entry){true, tenant, parent, src[k], h, PC_NIL, PC_NIL};
        memcpy(c->tokens + (size_t)i * c->pt, t, (size_t)c->pt * sizeof(int32_t));
        lru_front(c, i);
        c->n++;
        c->st.inserts++;
        c->scratch[n_added++] = i;
        parent = src[k];
    }
    for (uint32_t x = n_added; x-- > 0;)
        touch(c, c->scratch[x]);
}

void kvf__pcache_stats(const struct kvf__pcache *c, struct kvf_prefix_cache_stats *out)
{
    *out = c->st;
    out->pages = c->n;
}
