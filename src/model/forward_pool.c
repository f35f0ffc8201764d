/*
 * forward_pool.c — the forward pass's thread pool (see forward_pool.h).
 *
 * A job is published as (fn, ctx) and then a 64-bit ticket word: the job's number (24 bits),
 * its chunk count (20 bits) and the next unclaimed chunk (20 bits). A thread claims a chunk by a
 * CAS on the whole word, so a claim is always of a real chunk of the job the word names, and a
 * worker that wakes late, after its job ended, finds no chunk and claims nothing. fn and ctx are
 * read after an acquire of a ticket naming the job, and a claimed chunk must finish before the
 * caller can publish the next job, so the fn and ctx a claimer read are its job's. `done` counts
 * finished chunks; the caller returns when it reaches the chunk count. `gen` only wakes
 * sleeping workers.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "forward_pool.h"
#include "kvfence/common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long an idle worker spins before it sleeps: a few hundred microseconds, longer than the
 * serial work between two parallel phases of a decode step (norms, RoPE, copying K/V), so a
 * worker is awake for the next phase rather than woken through the kernel (tens of
 * microseconds) after the caller has done most of the work alone. A PAUSE is only a few cycles
 * on some cores, so the bound is in time, read every SPIN_CHECK iterations. */
#define SPIN_NS    300000ull
#define SPIN_CHECK 128

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct worker {
    struct kvf_tpool *p;
    uint32_t index;
    pthread_t th;
};

struct kvf_tpool {
    uint32_t n;
    struct worker *w; /* [n_alloc]; w[0] is the caller's slot, never started */
    uint32_t n_alloc;
    const struct kvf_alloc_ops *alloc;
    _Atomic uint64_t ticket; /* job << 40 | n_chunks << 20 | next chunk */
    _Atomic uint32_t done;   /* chunks finished in the current job */
    _Atomic uint64_t gen;    /* bumped per job and at stop */
    _Atomic bool stop;
    _Atomic(kvf_tpool_fn) fn;
    _Atomic(void *) ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv_job;
    _Atomic uint32_t sleepers;
};

/* Claims and runs chunks of job `job` until none is left. */
#define TICKET_BITS 20
#define TICKET_MASK ((1u << TICKET_BITS) - 1)

static void work(struct kvf_tpool *p, uint64_t job, uint32_t thread)
{
    kvf_tpool_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
    void *ctx = atomic_load_explicit(&p->ctx, memory_order_acquire);
    uint64_t v = atomic_load_explicit(&p->ticket, memory_order_acquire);
    for (;;) {
        uint32_t n = (uint32_t)(v >> TICKET_BITS) & TICKET_MASK, c = (uint32_t)v & TICKET_MASK;
        if ((v >> (2 * TICKET_BITS)) != job || c >= n) return;
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(ctx, c, n, thread);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        v = atomic_load_explicit(&p->ticket, memory_order_acquire);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kvf_tpool *p = w->p;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        uint32_t spins = 0;
        uint64_t t0 = 0;
        while ((g = atomic_load(&p->gen)) == seen) {
            CPU_RELAX();
            if (++spins % SPIN_CHECK != 0) continue;
            uint64_t now = mono_ns();
            if (t0 == 0) t0 = now;
            if (now - t0 < SPIN_NS) continue;
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen)
                pthread_cond_wait(&p->cv_job, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        /* The job number is read from the ticket itself: if that job is already over, work()
         * finds no chunk and this worker waits for the next gen. */
        uint64_t job = atomic_load_explicit(&p->ticket, memory_order_acquire) >> (2 * TICKET_BITS);
        work(p, job, w->index);
    }
}

int kvf__tpool_create(uint32_t n_threads, const struct kvf_alloc_ops *alloc, struct kvf_tpool **out)
{
    if (n_threads == 0 || n_threads > 256) return -EINVAL;
    const struct kvf_alloc_ops *a = alloc ? alloc : &kvf_default_alloc;
    struct kvf_tpool *p = a->alloc(a->ctx, sizeof(*p), 64);
    if (!p) return -ENOMEM;
    memset(p, 0, sizeof(*p));
    p->alloc = a;
    p->n = n_threads;
    p->w = a->alloc(a->ctx, n_threads * sizeof(*p->w), 64);
    if (!p->w) {
        a->free(a->ctx, p, sizeof(*p));
        return -ENOMEM;
    }
    memset(p->w, 0, n_threads * sizeof(*p->w));
    p->n_alloc = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_job, NULL);
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
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n; i++)
        pthread_join(p->w[i].th, NULL);
    pthread_cond_destroy(&p->cv_job);
    pthread_mutex_destroy(&p->mu);
    const struct kvf_alloc_ops *a = p->alloc;
    a->free(a->ctx, p->w, p->n_alloc * sizeof(*p->w));
    a->free(a->ctx, p, sizeof(*p));
}

uint32_t kvf__tpool_size(const struct kvf_tpool *p)
{
    return p->n;
}

void kvf__tpool_run(struct kvf_tpool *p, kvf_tpool_fn fn, void *ctx, uint32_t n_chunks)
{
    if (n_chunks == 0) return;
    if (p->n == 1 || n_chunks == 1 || n_chunks > TICKET_MASK) {
        for (uint32_t c = 0; c < n_chunks; c++)
            fn(ctx, c, n_chunks, 0);
        return;
    }
    uint64_t job =
        ((atomic_load_explicit(&p->ticket, memory_order_relaxed) >> (2 * TICKET_BITS)) + 1) &
        0xFFFFFFu;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->ticket, job << (2 * TICKET_BITS) | (uint64_t)n_chunks << TICKET_BITS,
                          memory_order_release);
    /* Sequentially consistent, paired with the worker's sleepers increment then gen load:
     * either the worker sees the new gen, or this sees it asleep and wakes it. */
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_job);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, job, 0);
    /* Every chunk is claimed; wait for those still running elsewhere. They are short, so spin,
     * yielding now and then in case their thread is waiting for this core. */
    uint32_t spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) != n_chunks) {
        CPU_RELAX();
        if (++spins % 256 == 0) sched_yield();
    }
}
