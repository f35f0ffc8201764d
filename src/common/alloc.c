/* The default allocation seam: aligned host memory from the C library. */
#include <stdlib.h>
#include <sys/mman.h>

#include "kvfence/common.h"

/* Allocations this large (a pool's page data, a model's packed weights) start on a 2 MiB
 * boundary and ask the kernel for transparent huge pages. Attention reads a few hundred bytes
 * from each of many pool pages, spread over hundreds of MiB: with 4 KiB pages nearly every
 * row is a TLB miss and a page walk. The request is advice (madvise), so a kernel without THP,
 * or with it off, just gives 4 KiB pages. */
#define HUGE_MIN   (4u << 20)
#define HUGE_ALIGN (2u << 20)

void *kvf_alloc_large(size_t bytes, size_t align)
{
    if (align < sizeof(void *)) align = sizeof(void *);
    if (bytes == 0) bytes = 1;
    if (bytes >= HUGE_MIN && align < HUGE_ALIGN) align = HUGE_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_MIN) (void)madvise(p, bytes / HUGE_ALIGN * HUGE_ALIGN, MADV_HUGEPAGE);
#endif
    return p;
}

static void *host_alloc(void *ctx, size_t bytes, size_t align)
{
    (void)ctx;
    return kvf_alloc_large(bytes, align);
}

static void host_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free(p);
}

const struct kvf_alloc_ops kvf_default_alloc = {host_alloc, host_free, NULL};
