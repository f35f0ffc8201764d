/*
 * forward_pool.c — the forward pass's thread pool (see forward_pool.h).
 *
 * A job is published by bumping `gen` (release); each worker waits for a new gen (spinning, then
 * sleeping), runs its index, and decrements `pending` (release). The caller runs index 0, then
 * waits for pending == 0 (acquire), which orders every worker's writes before the caller reads
 * them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "forward_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin iterations before sleeping: a few microseconds, enough to catch the next job of a
 * decode step without burning a core that another process on a loaded machine needs. */
#define SPIN_ITERS 2000

struct worker {
    struct kvf_tpool *p;
    uint32_t index;
    pthread_t th;
};

struct kvf_tpool {
    uint32_t n;
    struct worker *w; /* [n - 1] */
    _Atomic uint64_t gen;
    _Atomic uint32_t pending;
    _Atomic bool stop;
    kvf_tpool_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv_job;
    pthread_cond_t cv_done;
    _Atomic uint32_t sleepers; /* workers asleep on cv_job, or the caller on cv_done (+1000) */
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kvf_tpool *p = w->p;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv_job, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        p->fn(p->ctx, w->index, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int kvf__tpool_create(uint32_t n_threads, struct kvf_tpool **out)
{
    if (n_threads == 0 || n_threads > 256) return -EINVAL;
    struct kvf_tpool *p = calloc(1, sizeof(*p));
    if (!p) return -ENOMEM;
    p->n = n_threads;
    p->w = calloc(n_threads, sizeof(*p->w));
    if (!p->w) {
        free(p);
        return -ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_job, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    for (uint32_t i = 1; i < n_threads; i++) {
        p->w[i].p = p;
        p->w[i].index = i;
        int rc = pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]);
        if (rc != 0) {
            p->n = i; /* only workers 1..i-1 exist: stop exactly those */
            kvf__tpool_destroy(p);
            return -rc;
        }
    }
    *out = p;
    return 0;
}

void kvf__tpool_destroy(struct kvf_tpool *p)
{
    if (!p) return;
    atomic_store(&p->stop, true);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n; i++) pthread_join(p->w[i].th, NULL);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_job);
    pthread_mutex_destroy(&p->mu);
    free(p->w);
    free(p);
}

uint32_t kvf__tpool_size(const struct kvf_tpool *p)
{
    return p->n;
}

void kvf__tpool_run(struct kvf_tpool *p, kvf_tpool_fn fn, void *ctx)
{
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    /* Sequentially consistent, paired with the worker's sleepers increment then gen load: either
     * the worker sees the new gen, or this sees it asleep and wakes it. */
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_job);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) {
        if (++spins < SPIN_ITERS) {
            CPU_RELAX();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
