/*
 * forward_pool.h — a small fixed pthread pool for the forward pass (internal).
 *
 * kvf__tpool_run(p, fn, ctx) calls fn(ctx, i, n) once for every i in [0, n) — i = 0 on the
 * calling thread, the others on the workers — and returns when all have returned. Work is split
 * by the callee with a static partition of i, never by stealing, so which thread computes what
 * is a pure function of (i, n); with the kernels' per-pair rule, results do not even depend on
 * that. Workers spin briefly for the next job (a decode step issues a few hundred short jobs),
 * then sleep on a condition variable.
 */
#ifndef KVF_MODEL_FORWARD_POOL_H
#define KVF_MODEL_FORWARD_POOL_H

#include <stdint.h>

struct kvf_tpool;
typedef void (*kvf_tpool_fn)(void *ctx, uint32_t i, uint32_t n);

/* n_threads ≥ 1, including the caller. 0, -ENOMEM or a negated pthread error (nothing left
 * running). */
int kvf__tpool_create(uint32_t n_threads, struct kvf_tpool **out);
void kvf__tpool_destroy(struct kvf_tpool *p);
void kvf__tpool_run(struct kvf_tpool *p, kvf_tpool_fn fn, void *ctx);
uint32_t kvf__tpool_size(const struct kvf_tpool *p);

/* The part [lo, hi) of n items that worker i of k takes. */
static inline void kvf__split(uint32_t n, uint32_t i, uint32_t k, uint32_t *lo, uint32_t *hi)
{
    *lo = (uint32_t)((uint64_t)n * i / k);
    *hi = (uint32_t)((uint64_t)n * (i + 1) / k);
}

#endif
