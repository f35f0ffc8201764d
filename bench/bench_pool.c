/*
 * `kvfence bench pool [--runs N] [--pairs N] [--checks N]`: the page pool's two hot paths.
 *
 *   ns_per_pair   one kvf_pool_alloc of one page followed by its kvf_pool_release (the decode
 *                 loop's append path), on a pool kept mostly full so the free ring wraps;
 *   ns_per_check  one reader check (the attention kernel's per-page guard), cycling over every
 *                 page of the pool with varying slots, through the inline read view
 *                 (kvf_pool_read_check_view), which is what kernels use; the out-of-line
 *                 kvf_pool_read_check is measured and printed too;
 *   ns_per_page_batch  per page of kvf_pool_alloc/release of 16 pages at once (a prompt).
 *
 * Each figure is the median of --runs runs (default 31, at least 5). A run is short (a few
 * milliseconds: --pairs 200,000 pairs, --checks 2,000,000 checks) so that on a shared machine
 * most runs fit between two preemptions and the median measures the pool, not the scheduler.
 * A warm-up run of each kind comes first and is not counted. The pool has no scrub and no
 * poison: those cost O(page bytes) by design and are measured by nothing here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kvfence/pool.h"

#define N_PAGES  1024u
#define BATCH    16u
#define MAX_RUNS 101

static unsigned long arg_ul(int argc, char **argv, const char *name, unsigned long dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return strtoul(argv[i + 1], NULL, 0);
    return dflt;
}

static kvf_pool_t *make_pool(void)
{
    struct kvf_pool_config c;
    memset(&c, 0, sizeof(c));
    c.geo = (struct kvf_pool_geometry){
        .n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .page_tokens = 16, .elem_bytes = 2};
    c.n_pages = N_PAGES;
    c.max_peers = 4;
    c.tag_seed = 1;
    kvf_pool_t *pool = NULL;
    return kvf_pool_create(&c, &pool) == 0 ? pool : NULL;
}

/* One run of alloc+release pairs; returns ns per pair, or a negative value on a pool error. */
static double run_pairs(kvf_pool_t *pool, unsigned long pairs)
{
    static const struct kvf_owner owner = {{42, 0}, 1};
    struct kvf_page_ref r;
    int bad = 0;
    uint64_t t0 = kvf_bench_now_ns();
    for (unsigned long i = 0; i < pairs; i++) {
        bad |= kvf_pool_alloc(pool, &owner, KVF_HOLDER_SEQ, 1, false, &r);
        bad |= kvf_pool_release(pool, r, KVF_HOLDER_SEQ, 0);
    }
    uint64_t t1 = kvf_bench_now_ns();
    return bad ? -1.0 : (double)(t1 - t0) / (double)pairs;
}

static double run_batches(kvf_pool_t *pool, unsigned long pages)
{
    static const struct kvf_owner owner = {{43, 0}, 1};
    struct kvf_page_ref r[BATCH];
    unsigned long batches = pages / BATCH;
    int bad = 0;
    uint64_t t0 = kvf_bench_now_ns();
    for (unsigned long i = 0; i < batches; i++) {
        bad |= kvf_pool_alloc(pool, &owner, KVF_HOLDER_SEQ, BATCH, false, r);
        for (unsigned j = 0; j < BATCH; j++)
            bad |= kvf_pool_release(pool, r[j], KVF_HOLDER_SEQ, 0);
    }
    uint64_t t1 = kvf_bench_now_ns();
    return bad ? -1.0 : (double)(t1 - t0) / (double)(batches * BATCH);
}

/* One run of reader checks over refs[0..N_PAGES); returns ns per check, negative on a refusal. */
static double run_checks(const kvf_pool_t *pool, const struct kvf_page_ref *refs,
                         unsigned long checks)
{
    int bad = 0;
    uint64_t t0 = kvf_bench_now_ns();
    for (unsigned long i = 0; i < checks; i++) {
        const struct kvf_page_ref *r = &refs[i & (N_PAGES - 1)];
        bad |= kvf_pool_read_check(pool, r->page, r->tag, (uint32_t)(i >> 10) & 15u);
    }
    uint64_t t1 = kvf_bench_now_ns();
    return bad ? -1.0 : (double)(t1 - t0) / (double)checks;
}

static double run_view_checks(const kvf_pool_t *pool, const struct kvf_page_ref *refs,
                              unsigned long checks)
{
    struct kvf_pool_read_view v;
    kvf_pool_read_view(pool, &v);
    int bad = 0;
    uint64_t t0 = kvf_bench_now_ns();
    for (unsigned long i = 0; i < checks; i++) {
        const struct kvf_page_ref *r = &refs[i & (N_PAGES - 1)];
        bad |= kvf_pool_read_check_view(&v, r->page, r->tag, (uint32_t)(i >> 10) & 15u);
    }
    uint64_t t1 = kvf_bench_now_ns();
    return bad ? -1.0 : (double)(t1 - t0) / (double)checks;
}

int kvf_bench_pool(int argc, char **argv)
{
    int runs = (int)arg_ul(argc, argv, "--runs", 31);
    unsigned long pairs = arg_ul(argc, argv, "--pairs", 200000);
    unsigned long checks = arg_ul(argc, argv, "--checks", 2000000);
    if (runs < 5) runs = 5;
    if (runs > MAX_RUNS) runs = MAX_RUNS;
    if (pairs == 0 || checks == 0) {
        fprintf(stderr, "kvfence bench pool: --pairs and --checks must be positive\n");
        return 2;
    }
    kvf_pool_t *pool = make_pool();
    if (!pool) {
        fprintf(stderr, "kvfence bench pool: cannot create the pool\n");
        return 1;
    }
    static struct kvf_page_ref refs[N_PAGES];
    static const struct kvf_owner owner = {{7, 0}, 1};

    /* Pairs on a pool with 3/4 of its pages out, as in a busy worker. */
    if (kvf_pool_alloc(pool, &owner, KVF_HOLDER_SEQ, N_PAGES * 3 / 4, false, refs) != 0) goto fail;
    double pair_ns[MAX_RUNS], batch_ns[MAX_RUNS], call_ns[MAX_RUNS], check_ns[MAX_RUNS];
    if (run_pairs(pool, pairs) < 0 || run_batches(pool, pairs) < 0) goto fail; /* warm-up */
    for (int i = 0; i < runs; i++) {
        if ((pair_ns[i] = run_pairs(pool, pairs)) < 0) goto fail;
        if ((batch_ns[i] = run_batches(pool, pairs)) < 0) goto fail;
    }
    for (uint32_t i = 0; i < N_PAGES * 3 / 4; i++)
        if (kvf_pool_release(pool, refs[i], KVF_HOLDER_SEQ, 0) != 0) goto fail;

    /* Checks on a full pool of verified pages. */
    if (kvf_pool_alloc(pool, &owner, KVF_HOLDER_SEQ, N_PAGES, false, refs) != 0) goto fail;
    for (uint32_t i = 0; i < N_PAGES; i++)
        if (kvf_pool_set_fill(pool, refs[i], 16) != 0) goto fail;
    if (run_checks(pool, refs, checks) < 0 || run_view_checks(pool, refs, checks) < 0) goto fail;
    for (int i = 0; i < runs; i++) {
        if ((call_ns[i] = run_checks(pool, refs, checks)) < 0) goto fail;
        if ((check_ns[i] = run_view_checks(pool, refs, checks)) < 0) goto fail;
    }
    if (!kvf_pool_check(pool, NULL, 0)) goto fail;

    double pair = kvf_bench_median(pair_ns, runs);
    double batch = kvf_bench_median(batch_ns, runs);
    double call = kvf_bench_median(call_ns, runs);
    double check = kvf_bench_median(check_ns, runs);
    printf("pool: %u pages, %d runs (median), %lu pairs and %lu checks per run\n", N_PAGES, runs,
           pairs, checks);
    printf("alloc+release of 1 page:        %7.2f ns per pair (min %.2f, max %.2f)\n", pair,
           pair_ns[0], pair_ns[runs - 1]);
    printf("alloc+release of %u pages:      %7.2f ns per page\n", BATCH, batch);
    printf("reader check, out-of-line call: %7.2f ns per check (min %.2f, max %.2f)\n", call,
           call_ns[0], call_ns[runs - 1]);
    printf("reader check, inline read view: %7.2f ns per check (min %.2f, max %.2f)\n", check,
           check_ns[0], check_ns[runs - 1]);
    printf("result bench=pool ns_per_pair=%.2f ns_per_check=%.2f\n", pair, check);
    kvf_pool_destroy(pool);
    return 0;

fail:
    fprintf(stderr, "kvfence bench pool: a pool call failed during the benchmark\n");
    kvf_pool_destroy(pool);
    return 1;
}
