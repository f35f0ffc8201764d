/*
 * forward_pool.h — a small pthread pool for the forward pass (internal).
 *
 * kvf__tpool_run(p, fn, ctx, n_chunks) calls fn(ctx, c, n_chunks, thread) once for every chunk
 * c in [0, n_chunks), on the calling thread and the workers together, and returns when all
 * have returned. `thread` (< kvf__tpool_size) names the thread running the call, for per-thread
 * scratch. Chunks are claimed from a shared counter, so a thread the OS has descheduled delays
 * only the chunk it holds, not a fixed share of the work — on a machine shared with other
 * processes that is most of the difference. Which thread runs which chunk varies from run to
 * run; what a chunk computes does not (each chunk covers a fixed range of rows, and the kernels'
 * per-pair rule makes every value independent of who computes it).
 *
 * Workers spin briefly for the next job (a decode step issues a few hundred short jobs), then
 * sleep on a condition variable.
 */
#ifndef KVF_MODEL_FORWARD_POOL_H
#define KVF_MODEL_FORWARD_POOL_H

#include <stdint.h>

struct kvf_tpool;
typedef void (*kvf_tpool_fn)(void *ctx, uint32_t chunk, uint32_t n_chunks, uint32_t thread);

/* n_threads ≥ 1, including the caller. 0, -EINVAL, -ENOMEM or a negated pthread error (nothing
 * left running). */
struct kvf_alloc_ops;
/* The pool's memory comes from alloc (NULL = kvf_default_alloc). */
int kvf__tpool_create(uint32_t n_threads, const struct kvf_alloc_ops *alloc,
                      struct kvf_tpool **out);
void kvf__tpool_destroy(struct kvf_tpool *p);
void kvf__tpool_run(struct kvf_tpool *p, kvf_tpool_fn fn, void *ctx, uint32_t n_chunks);
uint32_t kvf__tpool_size(const struct kvf_tpool *p);

/* The part [lo, hi) of n items that chunk i of k covers. */
static inline void kvf__split(uint32_t n, uint32_t i, uint32_t k, uint32_t *lo, uint32_t *hi)
{
    *lo = (uint32_t)((uint64_t)n * i / k);
    *hi = (uint32_t)((uint64_t)n * (i + 1) / k);
}

/* kvf__split for the output rows of a matmul: the bounds fall on multiples of 16 (but the
 * last, n), so a chunk holds whole 16-row groups of a packed weight (kernels.h) and no group is
 * computed by two chunks. */
static inline void kvf__split_rows(uint32_t n, uint32_t i, uint32_t k, uint32_t *lo, uint32_t *hi)
{
    uint32_t groups = n / 16 + (n % 16 != 0), glo, ghi;
    kvf__split(groups, i, k, &glo, &ghi);
    *lo = glo * 16 < n ? glo * 16 : n;
    *hi = ghi * 16 < n ? ghi * 16 : n;
}

#endif
