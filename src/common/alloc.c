/* The default allocation seam: aligned host memory from the C library. */
#include <stdlib.h>

#include "kvfence/common.h"

static void *host_alloc(void *ctx, size_t bytes, size_t align)
{
    (void)ctx;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (bytes == 0) bytes = 1;
    void *p = NULL;
    return posix_memalign(&p, align, bytes) == 0 ? p : NULL;
}

static void host_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free(p);
}

const struct kvf_alloc_ops kvf_default_alloc = {host_alloc, host_free, NULL};
