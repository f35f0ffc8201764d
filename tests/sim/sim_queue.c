/* sim_queue.c — the simulator's virtual clock: the event heap, its PRNG helpers and the trace. */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sim_internal.h"

void trace(struct world *W, const char *fmt, ...)
{
    if (!W->trace) return;
    va_list ap;
    fprintf(W->trace, "t=%6" PRIu64 "  ", W->now);
    va_start(ap, fmt);
    vfprintf(W->trace, fmt, ap);
    va_end(ap);
    fputc('\n', W->trace);
}

void violate(struct world *W, const char *fmt, ...)
{
    if (W->failed) return;
    W->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(W->why, sizeof(W->why), fmt, ap);
    va_end(ap);
    trace(W, "VIOLATION: %s", W->why);
}

uint32_t rnd(struct world *W, uint32_t lo, uint32_t hi) /* uniform in [lo, hi] */
{
    return lo + kvf_rng_below(&W->rng, hi - lo + 1);
}
bool chance(struct world *W, double p)
{
    return (double)(kvf_rng_next(&W->rng) >> 11) * 0x1p-53 < p;
}

/* --- The event queue: a binary heap on (time, sequence), so equal times keep their order. --- */

bool ev_less(const struct ev *a, const struct ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

struct ev *ev_new(struct world *W, uint64_t delay, enum evk kind)
{
    if (W->n_ev == W->cap_ev) {
        W->cap_ev = W->cap_ev ? 2 * W->cap_ev : 256;
        W->heap = realloc(W->heap, W->cap_ev * sizeof(*W->heap));
        if (!W->heap) abort();
    }
    struct ev *e = &W->heap[W->n_ev];
    memset(e, 0, offsetof(struct ev, bytes));
    e->t = W->now + delay;
    e->seq = ++W->seq;
    e->kind = kind;
    e->peer = e->ridx = e->w = -1;
    return e;
}

/* Pushes the event written by ev_new into the heap. */
void ev_push(struct world *W)
{
    size_t i = W->n_ev++;
    struct ev tmp = W->heap[i];
    if (tmp.kind != EV_TICK && tmp.kind != EV_HB) W->n_nonperiodic++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_less(&tmp, &W->heap[p])) break;
        W->heap[i] = W->heap[p];
        i = p;
    }
    W->heap[i] = tmp;
}

void ev_pop(struct world *W, struct ev *out)
{
    *out = W->heap[0];
    if (out->kind != EV_TICK && out->kind != EV_HB) W->n_nonperiodic--;
    struct ev last = W->heap[--W->n_ev];
    size_t i = 0, n = W->n_ev;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && ev_less(&W->heap[c + 1], &W->heap[c])) c++;
        if (!ev_less(&W->heap[c], &last)) break;
        W->heap[i] = W->heap[c];
        i = c;
    }
    if (n) W->heap[i] = last;
}

/* Re-queues an event for a peer that is hung: it runs when the peer resumes. */
void defer(struct world *W, const struct ev *e, uint64_t until)
{
    struct ev *n = ev_new(W, 0, e->kind);
    uint64_t seq = n->seq;
    memcpy(n, e, sizeof(*e));
    n->seq = seq;
    n->t = until + rnd(W, 1, 20);
    ev_push(W);
}

/* --- Requests and stamps. ------------------------------------------------------------------ */
