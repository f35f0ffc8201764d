/* The page pool's life: create, destroy, and the read-only accessors. */
#include <string.h>

#include "pool_internal.h"

#define DEFAULT_HOLD_TIMEOUT_MS 30000u
/* Page memory is aligned to a page of the host's virtual memory, so that a transport can register
 * it and a page's trailer never shares a cache line with the next page's data. */
#define PAGE_DATA_ALIGN 4096u

static bool geometry_ok(const struct kvf_pool_geometry *g)
{
    if (g->n_layers == 0 || g->n_kv_heads == 0 || g->head_dim == 0 || g->page_tokens == 0)
        return false;
    if (g->elem_bytes != 2 && g->elem_bytes != 4) return false;
    /* Bound the data size (1 TiB per page is far beyond any real model) with a step-wise
     * check, so the size_t arithmetic in the geometry helpers cannot wrap. */
    const uint64_t limit = (uint64_t)1 << 40;
    const uint32_t factors[] = {g->n_kv_heads, g->head_dim, g->elem_bytes, g->n_layers, 2u};
    uint64_t b = g->page_tokens;
    for (size_t i = 0; i < KVF_ARRAY_LEN(factors); i++) {
        if (b > limit / factors[i]) return false;
        b *= factors[i];
    }
    return true;
}

/* Frees whatever create allocated so far; every pointer not yet allocated is NULL. */
static void free_parts(struct kvf_pool *p)
{
    const struct kvf_alloc_ops *m = &p->meta_alloc;
    size_t n = p->n_pages;
    if (p->data) p->page_alloc.free(p->page_alloc.ctx, p->data, n * p->page_bytes);
    if (p->peers) m->free(m->ctx, p->peers, sizeof(*p->peers) * (p->max_peers ? p->max_peers : 1u));
    if (p->check_scratch)
        m->free(m->ctx, p->check_scratch,
                sizeof(*p->check_scratch) * 2u * (p->max_peers ? p->max_peers : 1u));
    if (p->ring) m->free(m->ctx, p->ring, sizeof(*p->ring) * n);
    if (p->cold) m->free(m->ctx, p->cold, sizeof(*p->cold) * n);
    if (p->hot) m->free(m->ctx, p->hot, sizeof(*p->hot) * n);
}

int kvf_pool_create(const struct kvf_pool_config *cfg, kvf_pool_t **out)
{
    if (!cfg || !out) return -EINVAL;
    if (cfg->n_pages == 0 || cfg->n_pages == KVF__POOL_NIL || !geometry_ok(&cfg->geo))
        return -EINVAL;
#ifndef KVF_TEST_BUILD
    if (cfg->poison_on_free) return -ENOTSUP;
#endif
    size_t page_bytes = kvf_geo_page_bytes(&cfg->geo);
    if (page_bytes > SIZE_MAX / cfg->n_pages) return -EINVAL;

    const struct kvf_alloc_ops *meta = cfg->meta_alloc ? cfg->meta_alloc : &kvf_default_alloc;
    const struct kvf_alloc_ops *pages = cfg->page_alloc ? cfg->page_alloc : &kvf_default_alloc;
    struct kvf_pool *p = meta->alloc(meta->ctx, sizeof(*p), 64);
    if (!p) return -ENOMEM;
    memset(p, 0, sizeof(*p));
    p->geo = cfg->geo;
    p->n_pages = cfg->n_pages;
    p->max_peers = cfg->max_peers;
    p->scrub_on_free = cfg->scrub_on_free;
    p->poison_on_free = cfg->poison_on_free;
    p->hold_timeout_ms = cfg->hold_timeout_ms ? cfg->hold_timeout_ms : DEFAULT_HOLD_TIMEOUT_MS;
    p->page_bytes = page_bytes;
    p->trailer_offset = kvf_geo_trailer_offset(&cfg->geo);
    p->meta_alloc = *meta;
    p->page_alloc = *pages;
    p->last_tag = cfg->tag_seed;

    size_t n = cfg->n_pages;
    uint32_t np = cfg->max_peers ? cfg->max_peers : 1u;
    p->hot = meta->alloc(meta->ctx, sizeof(*p->hot) * n, 64);
    if (!p->hot) goto fail_parts;
    p->cold = meta->alloc(meta->ctx, sizeof(*p->cold) * n, 64);
    if (!p->cold) goto fail_parts;
    p->ring = meta->alloc(meta->ctx, sizeof(*p->ring) * n, 64);
    if (!p->ring) goto fail_parts;
    p->peers = meta->alloc(meta->ctx, sizeof(*p->peers) * np, 64);
    if (!p->peers) goto fail_parts;
    p->check_scratch = meta->alloc(meta->ctx, sizeof(*p->check_scratch) * 2u * np, 64);
    if (!p->check_scratch) goto fail_parts;
    p->data = pages->alloc(pages->ctx, n * page_bytes, PAGE_DATA_ALIGN);
    if (!p->data) goto fail_parts;

    /* Fresh memory from the backend may hold bytes of an earlier user of the process: zero it
     * once, so no page ever starts with someone else's data. O(n_pages * page_bytes). */
    memset(p->data, 0, n * page_bytes);
    memset(p->hot, 0, sizeof(*p->hot) * n);
    memset(p->cold, 0, sizeof(*p->cold) * n);
    for (uint32_t i = 0; i < cfg->n_pages; i++) {
        p->hot[i].state = KVF_PAGE_FREE;
        p->cold[i].ring_pos = i;
        p->cold[i].prev = p->cold[i].next = KVF__POOL_NIL;
        p->ring[i] = i;
    }
    for (uint32_t i = 0; i < np; i++)
        p->peers[i] = (struct kvf__peer){.epoch = 1};
    p->free_head = 0;
    p->free_count = cfg->n_pages;
    p->held_head = p->held_tail = KVF__POOL_NIL;
    p->stats.n_pages = cfg->n_pages;
    p->stats.by_state[KVF_PAGE_FREE] = cfg->n_pages;
    *out = p;
    return 0;

fail_parts:
    free_parts(p);
    meta->free(meta->ctx, p, sizeof(*p));
    return -ENOMEM;
}

void kvf_pool_destroy(kvf_pool_t *pool)
{
    if (!pool) return;
    struct kvf_alloc_ops meta = pool->meta_alloc;
    free_parts(pool);
    meta.free(meta.ctx, pool, sizeof(*pool));
}

const struct kvf_pool_geometry *kvf_pool_geometry(const kvf_pool_t *pool)
{
    return &pool->geo;
}

uint32_t kvf_pool_n_pages(const kvf_pool_t *pool)
{
    return pool->n_pages;
}

size_t kvf_pool_page_bytes(const kvf_pool_t *pool)
{
    return pool->page_bytes;
}

void *kvf_pool_data(const kvf_pool_t *pool, size_t *bytes)
{
    if (bytes) *bytes = (size_t)pool->n_pages * pool->page_bytes;
    return pool->data;
}

void *kvf_pool_page_data(const kvf_pool_t *pool, uint32_t page)
{
    return page < pool->n_pages ? kvf__pool_page_ptr(pool, page) : NULL;
}

int kvf_pool_peer_epoch(const kvf_pool_t *pool, uint16_t peer, uint32_t *epoch)
{
    if (peer >= pool->max_peers || !epoch) return -EINVAL;
    *epoch = pool->peers[peer].epoch;
    return 0;
}

int kvf_pool_page_info(const kvf_pool_t *pool, uint32_t page, struct kvf_page_info *out)
{
    if (page >= pool->n_pages || !out) return KVF_E_POOL_BAD_PAGE;
    const struct kvf_pool_read_entry *h = &pool->hot[page];
    const struct kvf__page_cold *c = &pool->cold[page];
    memset(out, 0, sizeof(*out));
    out->state = (enum kvf_page_state)h->state;
    out->sealed = h->sealed != 0;
    out->tag = h->tag;
    out->owner = c->owner;
    memcpy(out->holders, c->holders, sizeof(out->holders));
    out->granted = c->granted != 0;
    if (c->granted) out->grant = (struct kvf_peer_epoch){c->grant_peer, c->grant_epoch};
    out->fill = h->fill;
    if (h->state == KVF_PAGE_HELD || h->state == KVF_PAGE_QUARANTINED)
        out->deadline_ms = c->deadline_ms;
    return 0;
}

void kvf_pool_stats(const kvf_pool_t *pool, struct kvf_pool_stats *out)
{
    *out = pool->stats;
}

const char *kvf_page_state_name(enum kvf_page_state s)
{
    switch (s) {
    case KVF_PAGE_FREE:
        return "KVF_PAGE_FREE";
    case KVF_PAGE_OWNED:
        return "KVF_PAGE_OWNED";
    case KVF_PAGE_GRANTED:
        return "KVF_PAGE_GRANTED";
    case KVF_PAGE_HELD:
        return "KVF_PAGE_HELD";
    case KVF_PAGE_QUARANTINED:
        return "KVF_PAGE_QUARANTINED";
    default:
        return "KVF_PAGE_?";
    }
}
