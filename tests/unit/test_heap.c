/* Tests of kvfence/heap.h: the one binary heap, in the two orders the tokenizers use it (the
 * BPE merges' min-heap on (rank, position), SentencePiece's max-heap on (score, position)),
 * with its bounds: an empty pop, a full push, a heap without storage. */
#include "kvf_test.h"
#include "kvfence/heap.h"

#include <errno.h>

/* Shaped like the BPE tokenizer's pair: 20 bytes, not a power of two. */
struct item {
    uint32_t key;
    int32_t pos;
    int32_t a, b, c;
};

static bool min_first(const void *pa, const void *pb)
{
    const struct item *x = pa, *y = pb;
    return x->key < y->key || (x->key == y->key && x->pos < y->pos);
}

static bool max_first(const void *pa, const void *pb)
{
    const struct item *x = pa, *y = pb;
    return x->key > y->key || (x->key == y->key && x->pos < y->pos);
}

static void test_heap_empty_and_full(void)
{
    struct item v[3], out = {7, 7, 7, 7, 7};
    kvf_heap_t h;
    kvf_heap_init(&h, v, 3, sizeof v[0], min_first);
    ASSERT_ERR(kvf_heap_pop(&h, &out), -ENOENT);
    ASSERT_EQ_INT(out.key, 7); /* untouched */
    for (int i = 0; i < 3; i++)
        ASSERT_OK(kvf_heap_push(&h, &(struct item){(uint32_t)(3 - i), i, 0, 0, 0}));
    ASSERT_ERR(kvf_heap_push(&h, &(struct item){0, 9, 0, 0, 0}), -ENOSPC);
    ASSERT_EQ_INT(h.n, 3);
    ASSERT_TRUE(kvf_heap_check(&h));
    for (uint32_t k = 1; k <= 3; k++) {
        ASSERT_OK(kvf_heap_pop(&h, &out));
        ASSERT_EQ_INT(out.key, k);
    }
    ASSERT_ERR(kvf_heap_pop(&h, &out), -ENOENT);
    /* Without storage: every push refused. */
    kvf_heap_init(&h, NULL, 10, sizeof v[0], min_first);
    ASSERT_ERR(kvf_heap_push(&h, &out), -ENOSPC);
    ASSERT_ERR(kvf_heap_pop(&h, &out), -ENOENT);
}

static void test_heap_clear(void)
{
    struct item v[4], out;
    kvf_heap_t h;
    kvf_heap_init(&h, v, 4, sizeof v[0], max_first);
    ASSERT_OK(kvf_heap_push(&h, &(struct item){5, 0, 0, 0, 0}));
    ASSERT_OK(kvf_heap_push(&h, &(struct item){9, 1, 0, 0, 0}));
    kvf_heap_clear(&h);
    ASSERT_ERR(kvf_heap_pop(&h, &out), -ENOENT);
    ASSERT_OK(kvf_heap_push(&h, &(struct item){2, 0, 0, 0, 0}));
    ASSERT_OK(kvf_heap_pop(&h, &out));
    ASSERT_EQ_INT(out.key, 2);
}

/* Random pushes and pops, keys with many ties: every pop is the first of what is in the heap
 * by the order (ties by position), the payload travels with its key, the invariant holds. */
static void random_run(kvf_heap_before_fn before, uint64_t seed)
{
    enum { CAP = 257 };
    struct item v[CAP], ref[CAP], out;
    size_t n_ref = 0;
    int32_t next_pos = 0;
    kvf_heap_t h;
    kvf_heap_init(&h, v, CAP, sizeof v[0], before);
    struct kvf_rng r;
    kvf_rng_seed(&r, seed);
    for (int step = 0; step < 20000; step++) {
        bool push = n_ref == 0 || (n_ref < CAP && kvf_rng_below(&r, 100) < 55);
        if (push) {
            struct item it = {(uint32_t)kvf_rng_below(&r, 16), next_pos, next_pos * 3, -next_pos,
                              42};
            next_pos++;
            ASSERT_OK(kvf_heap_push(&h, &it));
            ref[n_ref++] = it;
        } else {
            size_t best = 0;
            for (size_t i = 1; i < n_ref; i++)
                if (before(&ref[i], &ref[best])) best = i;
            ASSERT_OK(kvf_heap_pop(&h, &out));
            ASSERT_EQ_INT(out.key, ref[best].key);
            ASSERT_EQ_INT(out.pos, ref[best].pos);
            ASSERT_TRUE(out.a == out.pos * 3 && out.b == -out.pos && out.c == 42);
            ref[best] = ref[--n_ref];
        }
        ASSERT_EQ_INT(h.n, n_ref);
        if (step % 64 == 0) ASSERT_TRUE(kvf_heap_check(&h));
    }
    ASSERT_TRUE(kvf_heap_check(&h));
}

static void test_heap_random_min(void)
{
    random_run(min_first, kvf_test_seed());
}

static void test_heap_random_max(void)
{
    random_run(max_first, kvf_test_seed() + 1);
}

/* The checker sees a broken heap. */
static void test_heap_check_catches(void)
{
    struct item v[2] = {{5, 0, 0, 0, 0}, {1, 1, 0, 0, 0}};
    kvf_heap_t h;
    kvf_heap_init(&h, v, 2, sizeof v[0], min_first);
    h.n = 2;
    ASSERT_FALSE(kvf_heap_check(&h));
    h.n = 3;
    ASSERT_FALSE(kvf_heap_check(&h)); /* more than it has room for */
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_heap_empty_and_full), KVF_CASE(test_heap_clear),
    KVF_CASE(test_heap_random_min),     KVF_CASE(test_heap_random_max),
    KVF_CASE(test_heap_check_catches),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
