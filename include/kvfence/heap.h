/*
 * kvfence/heap.h — the one binary heap: a priority queue of fixed-size elements in storage the
 * caller owns, ordered by the caller's `before`.
 *
 * The heap never allocates: the caller gives room for cap elements and states why its pushes
 * never exceed it (a push beyond cap is refused, and changes nothing). Elements are copied in
 * and out by value (size bytes each). Among elements that neither comes before the other, the
 * order of popping is unspecified: give `before` a tie-break where that matters.
 *
 * Invariant (kvf_heap_check): no element comes before its parent, so v[0] pops first.
 * Work: push and pop O(log n) comparisons and copies; no other call does any.
 */
#ifndef KVFENCE_HEAP_H
#define KVFENCE_HEAP_H

#include <stdbool.h>
#include <stddef.h>

/* true if a must pop before b: a strict weak order (never both before(a, b) and before(b, a)). */
typedef bool (*kvf_heap_before_fn)(const void *a, const void *b);

struct kvf_heap {
    void *v; /* borrowed: [cap] elements of size bytes; [0, n) in use */
    size_t n, cap, size;
    kvf_heap_before_fn before; /* fixed at init */
};
typedef struct kvf_heap kvf_heap_t;

/* An empty heap over v (room for cap elements of size bytes, borrowed; NULL with cap 0 is an
 * empty heap that refuses every push). This function can't fail. */
void kvf_heap_init(kvf_heap_t *h, void *v, size_t cap, size_t size, kvf_heap_before_fn before);

/* Empties the heap (the storage stays the caller's). */
static inline void kvf_heap_clear(kvf_heap_t *h)
{
    h->n = 0;
}

/* Adds a copy of *e. 0, or -ENOSPC when n == cap (then nothing changed). */
int kvf_heap_push(kvf_heap_t *h, const void *e);

/* Copies the element that comes first into *out and removes it. 0, or -ENOENT when the heap is
 * empty (then nothing changed). */
int kvf_heap_pop(kvf_heap_t *h, void *out);

/* The heap invariant, walked over every element (O(n)): for tests and assertions. */
bool kvf_heap_check(const kvf_heap_t *h);

#endif /* KVFENCE_HEAP_H */
