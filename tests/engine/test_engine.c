/*
 * test_engine.c — the prefill and decode workers joined by the real protocol over UCX (TCP on
 * loopback), in one process: a request's tokens and logprobs must equal the same request run
 * alone through the forward pass (what `kvfence run` does), alone and under concurrency; cancels
 * and limits end requests cleanly; the pools return to all free.
 */
#include <pthread.h>

#include "engine_test_util.h"
#include "kvf_test.h"
#include "kvfence/engine.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"

#define PT  16u
#define CTX 512u

struct rig {
    char dir[64], path[128];
    kvf_gguf_t *g;
    kvf_model_t *m;
    pthread_mutex_t compute;
    kvf_pworker_t *pw;
    kvf_dworker_t *dw;
    uint32_t n_vocab;
};

static uint32_t rig_cache_pages; /* the prefill's prefix cache for the next rig (0: none) */

static void rig_start(struct rig *r, const char *shape, uint32_t decode_pages)
{
    char err[256] = "";
    snprintf(r->dir, sizeof(r->dir), "/tmp/kvf_engine_XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(r->dir));
    snprintf(r->path, sizeof(r->path), "%s/m.gguf", r->dir);
    if (kvf_mkmodel_write(r->path, kvf_mkmodel_shape_by_name(shape), KVF_GGML_F32, 7, err,
                          sizeof(err)) < 0)
        KVF_FAIL("mkmodel: %s", err);
    if (kvf_gguf_open(r->path, &r->g, err, sizeof(err)) < 0) KVF_FAIL("open: %s", err);
    if (kvf_model_load(r->g, &r->m, err, sizeof(err)) < 0) KVF_FAIL("load: %s", err);
    r->n_vocab = kvf_model_hparams(r->m)->n_vocab;
    pthread_mutex_init(&r->compute, NULL);
    struct kvf_worker_config c = {
        .model = r->m,
        .model_fp = 42,
        .page_tokens = PT,
        .n_pages = 128,
        .n_threads = 1,
        .max_context = CTX,
        .listen_host = "127.0.0.1",
        .compute_lock = &r->compute,
#if defined(KVF_TEST_BUILD)
        .poison_free = true,
#endif
        .grant_timeout_ms = 5000,
        .hold_timeout_ms = 2000,
        .prefix_cache_pages = rig_cache_pages
    };
    if (kvf_pworker_start(&c, &r->pw, err, sizeof(err)) < 0) KVF_FAIL("prefill: %s", err);
    c.n_pages = decode_pages;
    c.prefill_host = "127.0.0.1";
    c.prefill_port = kvf_pworker_port(r->pw);
    c.max_batch = 16;
    /* Prompts over two pages are hashed in slices across loop turns: the path long prompts
     * take, exercised by every test here. */
    {
        struct kvf_pool_geometry geo;
        kvf_model_geometry(r->m, PT, &geo);
        c.hash_slice_bytes = (uint32_t)(2 * kvf_geo_data_bytes(&geo));
    }
    if (kvf_dworker_start(&c, &r->dw, err, sizeof(err)) < 0) KVF_FAIL("decode: %s", err);
    for (int i = 0; i < 500; i++) {
        struct kvf_engine_info in;
        kvf_dworker_gen_ops.info(r->dw, &in);
        if (in.prefill_up) return;
        usleep(10000);
    }
    KVF_FAIL("the decode worker never connected to the prefill worker");
}

/* Waits until the decode pool is all free again, and stops everything. */
static void rig_stop(struct rig *r)
{
    struct kvf_engine_info in = {0};
    for (int i = 0; i < 500; i++) {
        kvf_dworker_gen_ops.info(r->dw, &in);
        if (in.decode_free == in.decode_pages && in.running == 0 && in.decode_reserved == 0) break;
        usleep(10000);
    }
    ASSERT_EQ_INT(in.decode_free, in.decode_pages);
    ASSERT_EQ_INT(in.decode_reserved, 0);
    kvf_dworker_stop(r->dw, 1000);
    kvf_pworker_stop(r->pw);
    kvf_model_free(r->m);
    kvf_gguf_close(r->g);
    unlink(r->path);
    rmdir(r->dir);
}

struct out {
    int32_t tok[CTX];
    float lp[CTX];
    int32_t top[CTX][3];
    uint32_t n;
    int err;
    bool stopped;
};

/* The request alone, as `kvfence run` does it (engine_test_util.h). */
static void solo(struct rig *r, const struct kvf_gen_params *p, struct out *o)
{
    memset(o, 0, sizeof(*o));
    o->n = solo_run(r->m, PT, CTX, p, o->tok, o->top, &o->stopped);
}

static void collect(struct rig *r, kvf_gen_t *g, struct out *o)
{
    memset(o, 0, sizeof(*o));
    for (;;) {
        struct kvf_gen_event ev;
        int got = kvf_dworker_gen_ops.next(r->dw, g, &ev, 20000);
        if (!got) KVF_FAIL("no event within 20 s");
        if (ev.kind == KVF_GEN_END) {
            o->err = ev.err;
            o->stopped = ev.stopped;
            break;
        }
        ASSERT_TRUE(o->n < CTX);
        o->tok[o->n] = ev.token;
        o->lp[o->n] = ev.logprob;
        if (ev.n_top >= 3) memcpy(o->top[o->n], ev.top_ids, 3 * sizeof(int32_t));
        o->n++;
    }
    kvf_dworker_gen_ops.release(r->dw, g);
}

static void make_prompt(int32_t *p, uint32_t n, uint32_t seed, uint32_t n_vocab)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    p[0] = 1;
    for (uint32_t i = 1; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (int32_t)(3 + x % (n_vocab - 3));
    }
}

static void expect_same(const struct out *got, const struct out *want)
{
    ASSERT_OK(got->err);
    ASSERT_EQ_INT(got->n, want->n);
    ASSERT_MEMEQ(got->tok, want->tok, want->n * sizeof(int32_t));
}

static void test_one_request_equals_solo(void)
{
    struct rig r;
    rig_start(&r, "tiny", 128);
    int32_t prompt[37];
    make_prompt(prompt, 37, 1, r.n_vocab);
    struct kvf_gen_params p = {
        .tenant = 1,
        .prompt = prompt,
        .n_prompt = 37,
        .max_tokens = 40,
        .sample = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1},
        .n_logprobs = 3};
    kvf_gen_t *g;
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &p, &g));
    struct out got, want;
    collect(&r, g, &got);
    solo(&r, &p, &want);
    expect_same(&got, &want);
    for (uint32_t i = 0; i < want.n; i++)
        ASSERT_MEMEQ(got.top[i], want.top[i], sizeof(got.top[i]));
    ASSERT_FALSE(got.stopped);
    struct kvf_engine_info in;
    kvf_dworker_gen_ops.info(r.dw, &in);
    ASSERT_TRUE(in.hash_slices >= 2); /* 37 tokens: 3 pages, hashed two pages a turn */
    rig_stop(&r);
}

static void test_sixteen_concurrent_equal_solo(void)
{
    struct rig r;
    rig_start(&r, "tiny", 256);
    enum { N = 16 };
    static int32_t prompts[N][80];
    struct kvf_gen_params p[N];
    kvf_gen_t *g[N];
    for (int i = 0; i < N; i++) {
        uint32_t n = 5 + 5 * (uint32_t)i;
        make_prompt(prompts[i], n, 100 + (uint32_t)i, r.n_vocab);
        p[i] = (struct kvf_gen_params){.tenant = 1 + (uint32_t)i % 3,
                                       .prompt = prompts[i],
                                       .n_prompt = n,
                                       .max_tokens = 10 + 3 * (uint32_t)i,
                                       .sample = {.temperature = i % 2 ? 0.8f : 0.0f,
                                                  .top_k = i % 4 == 1 ? 20u : 0u,
                                                  .top_p = i % 4 == 3 ? 0.9f : 1.0f,
                                                  .seed = 1000u + (uint64_t)i}};
        ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &p[i], &g[i]));
    }
    for (int i = 0; i < N; i++) {
        struct out got, want;
        collect(&r, g[i], &got);
        solo(&r, &p[i], &want);
        expect_same(&got, &want);
    }
    rig_stop(&r);
}

static void test_cancel_and_limits(void)
{
    struct rig r;
    rig_start(&r, "tiny", 128);
    int32_t prompt[20];
    make_prompt(prompt, 20, 5, r.n_vocab);
    struct kvf_gen_params p = {
        .tenant = 2,
        .prompt = prompt,
        .n_prompt = 20,
        .max_tokens = 400,
        .sample = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1}};
    kvf_gen_t *g;
    /* prompt + max_tokens one over the limit: refused before anything moves. */
    p.max_tokens = CTX - 20 + 1;
    ASSERT_ERR(kvf_dworker_gen_ops.submit(r.dw, &p, &g), KVF_E_PROTO_REJECTED);
    p.max_tokens = CTX - 20; /* exactly the limit: served */
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &p, &g));
    struct kvf_gen_event ev;
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ_INT(kvf_dworker_gen_ops.next(r.dw, g, &ev, 20000), 1);
        ASSERT_EQ_INT(ev.kind, KVF_GEN_TOKEN);
    }
    kvf_dworker_gen_ops.cancel(r.dw, g);
    do {
        ASSERT_EQ_INT(kvf_dworker_gen_ops.next(r.dw, g, &ev, 20000), 1);
    } while (ev.kind != KVF_GEN_END);
    ASSERT_EQ_INT(ev.err, KVF_E_PROTO_CANCELLED);
    kvf_dworker_gen_ops.release(r.dw, g);
    /* A cancel right after submit (queued or during prefill) also ends cleanly, and stops the
     * work: the decode steps make far fewer than the 8 x 50 tokens asked (77-150 here, idle or
     * loaded; an ignored cancel makes all 400). */
    struct kvf_engine_info before, after;
    kvf_dworker_gen_ops.info(r.dw, &before);
    uint32_t ended_ok = 0;
    for (int i = 0; i < 8; i++) {
        p.max_tokens = 50;
        ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &p, &g));
        if (i % 2) usleep(2000 * (unsigned)i);
        kvf_dworker_gen_ops.cancel(r.dw, g);
        do {
            ASSERT_EQ_INT(kvf_dworker_gen_ops.next(r.dw, g, &ev, 20000), 1);
        } while (ev.kind != KVF_GEN_END);
        ASSERT_TRUE(ev.err == KVF_E_PROTO_CANCELLED || ev.err == 0);
        if (ev.err == 0) ended_ok++;
        kvf_dworker_gen_ops.release(r.dw, g);
    }
    kvf_dworker_gen_ops.info(r.dw, &after);
    printf("# 8 requests of 50 tokens cancelled at 0..14 ms: %llu tokens decoded, %u ended whole\n",
           (unsigned long long)(after.decoded_tokens - before.decoded_tokens), ended_ok);
    /* An ignored cancel ends all 8 whole with 400 tokens; a loaded machine lets a few end. */
    ASSERT_TRUE(ended_ok <= 5);
    ASSERT_TRUE(after.decoded_tokens - before.decoded_tokens <= 300);
    rig_stop(&r);
}

/* The prefill's cache figures once the loop has published n inserts (a job's pages enter the
 * cache when its puts are done, after the request has ended). */
static struct kvf_prefix_cache_stats cache_after(struct rig *r, uint64_t inserts)
{
    struct kvf_prefix_cache_stats cs = {0};
    for (int i = 0; i < 500; i++) {
        kvf_pworker_cache(r->pw, &cs);
        if (cs.inserts >= inserts) break;
        usleep(10000);
    }
    return cs;
}

static void run_equal_solo(struct rig *r, const struct kvf_gen_params *p)
{
    kvf_gen_t *g;
    ASSERT_OK(kvf_dworker_gen_ops.submit(r->dw, p, &g));
    struct out got, want;
    collect(r, g, &got);
    solo(r, p, &want);
    expect_same(&got, &want);
    for (uint32_t i = 0; i < want.n; i++)
        ASSERT_MEMEQ(got.top[i], want.top[i], sizeof(got.top[i]));
}

/*
 * The tenant-scoped prefix cache (docs/PREFIX_CACHE.md): a prompt's whole pages computed for a
 * tenant are taken from the cache by that tenant's next prompt with the same beginning — never
 * by another tenant's — the last prompt token is always computed, every answer equals the
 * request run alone token for token (and its top-3 ids), and under pressure the cache
 * evicts (least recently used first) rather than making a job wait.
 */
static void test_prefix_cache_within_tenant(void)
{
    struct rig r;
    rig_cache_pages = 24;
    rig_start(&r, "tiny", 128);
    rig_cache_pages = 0;
    int32_t prompt[120];
    make_prompt(prompt, 120, 3, r.n_vocab);
    struct kvf_gen_params p = {.tenant = 1,
                               .prompt = prompt,
                               .n_prompt = 80, /* 5 whole pages */
                               .max_tokens = 12,
                               .sample = {.temperature = 0.0f, .top_p = 1.0f, .seed = 1},
                               .n_logprobs = 3};
    run_equal_solo(&r, &p);
    struct kvf_prefix_cache_stats cs = cache_after(&r, 5);
    ASSERT_EQ_U64(cs.misses, 1);
    ASSERT_EQ_U64(cs.inserts, 5);
    ASSERT_EQ_INT(cs.pages, 5);
    /* The same prompt again: 4 pages from the cache (the 5th holds the last prompt token). */
    run_equal_solo(&r, &p);
    cs = cache_after(&r, 5);
    ASSERT_EQ_U64(cs.hits, 1);
    ASSERT_EQ_U64(cs.hit_pages, 4);
    /* Another tenant, the same prompt: nothing from the cache; its own pages are cached. */
    p.tenant = 2;
    run_equal_solo(&r, &p);
    cs = cache_after(&r, 10);
    ASSERT_EQ_U64(cs.hits, 1);
    ASSERT_EQ_U64(cs.misses, 2);
    ASSERT_EQ_INT(cs.pages, 10);
    /* The first tenant's conversation goes on: its 5 pages, then 2 computed, sampled. */
    p.tenant = 1;
    p.n_prompt = 120;
    p.sample = (struct kvf_sample_params){.temperature = 0.9f, .top_p = 0.9f, .seed = 77};
    run_equal_solo(&r, &p);
    cs = cache_after(&r, 12);
    ASSERT_EQ_U64(cs.hits, 2);
    ASSERT_EQ_U64(cs.hit_pages, 9);
    /* Pressure: prompts of new beginnings fill the 24 cached pages; the oldest go, every answer
     * still equals its solo run. */
    for (uint32_t s = 10; s < 16; s++) {
        make_prompt(prompt, 80, s, r.n_vocab);
        p.n_prompt = 80;
        run_equal_solo(&r, &p);
    }
    cs = cache_after(&r, 12 + 6 * 5);
    ASSERT_TRUE(cs.evictions >= 12 + 6 * 5 - 24);
    ASSERT_TRUE(cs.pages <= 24);
    /* The pool: what is not free is cached (no job is left). */
    uint32_t pages = 0, free_pages = 0;
    kvf_pworker_pool(r.pw, &pages, &free_pages);
    ASSERT_EQ_INT(pages, 128 + 24);
    ASSERT_EQ_INT(free_pages + cs.pages, pages);
    rig_stop(&r);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_one_request_equals_solo),
    KVF_CASE(test_sixteen_concurrent_equal_solo),
    KVF_CASE(test_cancel_and_limits),
    KVF_CASE(test_prefix_cache_within_tenant),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
