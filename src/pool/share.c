/* Sharing within a tenant: sealed pages, held only by readers of their owner's tenant (the prefix
 * cache's pages; pool.h, "Sharing within a tenant"). */
#include "pool_internal.h"

int kvf_pool_seal(kvf_pool_t *pool, struct kvf_page_ref ref)
{
    if (ref.page >= pool->n_pages) return kvf__pool_fail(pool, KVF_E_POOL_BAD_PAGE);
    struct kvf_pool_read_entry *h = &pool->hot[ref.page];
    if (h->tag != ref.tag) return kvf__pool_fail(pool, KVF_E_POOL_STALE_TAG);
    /* OWNED has no grant (pool.h's invariants), so nothing can still write a sealed page. */
    if (h->state != KVF_PAGE_OWNED || h->sealed) return kvf__pool_fail(pool, KVF_E_POOL_BAD_STATE);
    if (h->fill != pool->geo.page_tokens) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    h->sealed = 1;
    pool->stats.sealed++;
    pool->stats.seals++;
    KVF__POOL_DEBUG_PAGE(pool, ref.page);
    return 0;
}

int kvf_pool_share(kvf_pool_t *pool, struct kvf_page_ref ref, uint32_t tenant,
                   enum kvf_holder holder)
{
    if ((unsigned)holder >= KVF_HOLDER__NKINDS) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    if (ref.page >= pool->n_pages) return kvf__pool_fail(pool, KVF_E_POOL_BAD_PAGE);
    struct kvf_pool_read_entry *h = &pool->hot[ref.page];
    struct kvf__page_cold *c = &pool->cold[ref.page];
    if (h->tag != ref.tag) return kvf__pool_fail(pool, KVF_E_POOL_STALE_TAG);
    if (h->state != KVF_PAGE_OWNED || !h->sealed) return kvf__pool_fail(pool, KVF_E_POOL_BAD_STATE);
    if (c->owner.tenant != tenant) return kvf__pool_fail(pool, KVF_E_POOL_FOREIGN);
    if (c->holders[holder] == UINT16_MAX) return kvf__pool_fail(pool, KVF_E_POOL_BAD_ARG);
    c->holders[holder]++;
    pool->stats.shares++;
    return 0;
}

int kvf_pool_read_check_tenant(const kvf_pool_t *pool, uint32_t page, uint64_t tag, uint32_t tenant,
                               uint32_t slot)
{
    int rc = kvf_pool_read_check(pool, page, tag, slot);
    if (rc < 0) return rc;
    return pool->cold[page].owner.tenant == tenant ? 0 : KVF_E_POOL_FOREIGN;
}
