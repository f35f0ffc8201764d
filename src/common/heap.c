/*
 * heap.c — the binary heap of kvfence/heap.h, stored as an implicit tree: the children of
 * element i are 2i+1 and 2i+2. Both operations move a hole rather than swap, so each level
 * costs one comparison (push) or two (pop) and one copy.
 */
#include "kvfence/heap.h"

#include <errno.h>
#include <string.h>

#define AT(h, i) ((char *)(h)->v + (i) * (h)->size)

void kvf_heap_init(kvf_heap_t *h, void *v, size_t cap, size_t size, kvf_heap_before_fn before)
{
    *h = (kvf_heap_t){.v = v, .n = 0, .cap = v ? cap : 0, .size = size, .before = before};
}

int kvf_heap_push(kvf_heap_t *h, const void *e)
{
    if (h->n == h->cap) return -ENOSPC;
    /* The hole starts at the new last slot and rises while e comes before its parent. */
    size_t i = h->n++;
    while (i > 0 && h->before(e, AT(h, (i - 1) / 2))) {
        memcpy(AT(h, i), AT(h, (i - 1) / 2), h->size);
        i = (i - 1) / 2;
    }
    memcpy(AT(h, i), e, h->size);
    return 0;
}

int kvf_heap_pop(kvf_heap_t *h, void *out)
{
    if (h->n == 0) return -ENOENT;
    memcpy(out, AT(h, 0), h->size);
    /* The last element fills the hole at the root, sinking while a child comes before it. It
     * stays readable in its old slot, h->n, which the hole (always below h->n) never reaches. */
    const void *last = AT(h, --h->n);
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->before(AT(h, c + 1), AT(h, c))) c++;
        if (!h->before(AT(h, c), last)) break;
        memcpy(AT(h, i), AT(h, c), h->size);
        i = c;
    }
    if (h->n > 0) memcpy(AT(h, i), last, h->size);
    return 0;
}

bool kvf_heap_check(const kvf_heap_t *h)
{
    if (h->n > h->cap) return false;
    for (size_t i = 1; i < h->n; i++)
        if (h->before(AT(h, i), AT(h, (i - 1) / 2))) return false;
    return true;
}
