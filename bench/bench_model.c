/*
 * bench_model.c — `kvfence bench model`: prefill and decode throughput of the forward pass over
 * pool pages, and decode as a fraction of the memory-bandwidth roofline.
 *
 *   kvfence bench model --model F.gguf [--batch B] [--prompt N] [--gen M] [--threads T]
 *                       [--page-tokens P] [--chunk C] [--runs R] [--kv-type f32|f16]
 *
 * Prefill: B sequences of N seeded random tokens, each in chunks of at most C tokens (default
 * 512). Decode: M steps, each one token for every one of the B sequences in one batch, greedy.
 * The whole of it is run R times (default 5) on fresh pages, and the figures reported are the
 * medians over the runs (each run's own are printed too). --kv-type keeps K and V in the pool
 * as floats (f32) or IEEE halves (f16); the default is the model's (kvf_model_geometry:
 * halves for a quantized model, floats otherwise).
 * The roofline: a decode step must stream every weight once, so it cannot beat
 * weight_bytes / bandwidth, where bandwidth is a large memcpy measured in the same run
 * (bytes read + bytes written per second, best of 5).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvfence bench model --model F.gguf [--batch B] [--prompt N] [--gen M]\n"
               "                           [--threads T] [--page-tokens P] [--chunk C] [--runs R]\n"
               "                           [--kv-type f32|f16]\n");
}

/* Copy bandwidth in bytes per second (read + write), best of 5 copies of 128 MiB. */
static double copy_bandwidth(void)
{
    size_t n = (size_t)128 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0.0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0.0;
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = kvf_bench_now_ns();
        memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
        uint64_t t1 = kvf_bench_now_ns();
        double bw = 2.0 * (double)n / ((double)(t1 - t0) * 1e-9);
        if (bw > best) best = bw;
    }
    free(a);
    free(b);
    return best;
}

/* The next token as a server picks it for a greedy request: the library's sampler. */
static int32_t greedy(const float *l, uint32_t n)
{
    static const struct kvf_sample_params greedy_params = {
        .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    return (int32_t)kvf_sample(l, n, &greedy_params, 0);
}

/* One prefill of every sequence then gen decode steps, on freshly allocated pages (released
 * again at the end); the two phases' wall times in seconds. */
static int one_run(kvf_fwd_t *f, kvf_pool_t *pool, const struct kvf_model_hparams *hp,
                   struct kvf_page_ref *pages, uint32_t per_seq, int32_t *toks, float *logits,
                   struct kvf_fwd_seq *seqs, unsigned long batch, unsigned long prompt,
                   unsigned long gen, unsigned long chunk, double *prefill_s, double *decode_s)
{
    int rc;
    for (unsigned long s = 0; s < batch; s++) {
        struct kvf_owner own = {{s + 1, 0}, 1};
        if ((rc = kvf_pool_alloc(pool, &own, KVF_HOLDER_SEQ, per_seq, false, pages + s * per_seq)) <
            0) {
            fprintf(stderr, "kvfence bench model: alloc: %s\n", kvf_strerror(rc));
            return -1;
        }
    }
    uint64_t t0 = kvf_bench_now_ns();
    for (unsigned long s = 0; s < batch; s++)
        for (unsigned long at = 0; at < prompt; at += chunk) {
            uint32_t len = (uint32_t)(prompt - at < chunk ? prompt - at : chunk);
            struct kvf_fwd_seq q = {{s + 1, 0},
                                    toks + s * (prompt + gen) + at,
                                    len,
                                    (uint32_t)at,
                                    pages + s * per_seq,
                                    per_seq,
                                    at + len == prompt ? logits + s * hp->n_vocab : NULL,
                                    0};
            if ((rc = kvf_fwd_run(f, pool, &q, 1)) != 1 || q.status != 0) {
                fprintf(stderr, "kvfence bench model: prefill failed: %s\n",
                        kvf_strerror(rc < 0 ? rc : q.status));
                return -1;
            }
        }
    uint64_t t1 = kvf_bench_now_ns();
    for (unsigned long s = 0; s < batch; s++)
        toks[s * (prompt + gen) + prompt] = greedy(logits + s * hp->n_vocab, hp->n_vocab);
    for (unsigned long step = 0; step < gen; step++) {
        for (unsigned long s = 0; s < batch; s++) {
            struct kvf_fwd_seq q = {{s + 1, 0},
                                    toks + s * (prompt + gen) + prompt + step,
                                    1,
                                    (uint32_t)(prompt + step),
                                    pages + s * per_seq,
                                    per_seq,
                                    logits + s * hp->n_vocab,
                                    0};
            seqs[s] = q;
        }
        if ((rc = kvf_fwd_run(f, pool, seqs, (uint32_t)batch)) != (int)batch) {
            fprintf(stderr, "kvfence bench model: decode failed: %s\n",
                    kvf_strerror(rc < 0 ? rc : seqs[0].status));
            return -1;
        }
        if (step + 1 < gen)
            for (unsigned long s = 0; s < batch; s++)
                toks[s * (prompt + gen) + prompt + step + 1] =
                    greedy(logits + s * hp->n_vocab, hp->n_vocab);
    }
    uint64_t t2 = kvf_bench_now_ns();
    for (unsigned long s = 0; s < batch * per_seq; s++)
        if ((rc = kvf_pool_release(pool, pages[s], KVF_HOLDER_SEQ, 0)) < 0) {
            fprintf(stderr, "kvfence bench model: release: %s\n", kvf_strerror(rc));
            return -1;
        }
    *prefill_s = (double)(t1 - t0) * 1e-9;
    *decode_s = (double)(t2 - t1) * 1e-9;
    return 0;
}

int kvf_bench_model(int argc, char **argv)
{
    const char *path = NULL;
    uint32_t kv_bytes = 0; /* 0: the model's default (kvf_model_geometry) */
    unsigned long batch = 1, prompt = 128, gen = 64, threads = 2, page_tokens = 16, chunk = 512,
                  runs = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = NULL, *v = NULL;
        int st = kvf_bench_opt(argc, argv, &i, usage, &a, &v);
        if (st != 1) return st;
        unsigned long *dst = NULL;
        if (strcmp(a, "--model") == 0)
            path = v;
        else if (strcmp(a, "--kv-type") == 0) {
            if (kvf_bench_kv_type_arg("model", v, &kv_bytes) != 0) return 2;
        } else if (strcmp(a, "--batch") == 0)
            dst = &batch;
        else if (strcmp(a, "--prompt") == 0)
            dst = &prompt;
        else if (strcmp(a, "--gen") == 0)
            dst = &gen;
        else if (strcmp(a, "--threads") == 0)
            dst = &threads;
        else if (strcmp(a, "--page-tokens") == 0)
            dst = &page_tokens;
        else if (strcmp(a, "--chunk") == 0)
            dst = &chunk;
        else if (strcmp(a, "--runs") == 0)
            dst = &runs;
        else {
            usage(stderr);
            return 2;
        }
        if (dst && kvf_bench_ulong_arg("model", a, v, dst == &runs ? 101 : 65536, dst) != 0)
            return 2;
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    char err[256] = "";
    kvf_gguf_t *g = NULL;
    kvf_model_t *m = NULL;
    kvf_pool_t *pool = NULL;
    kvf_fwd_t *f = NULL;
    int rc, status = 1;
    if ((rc = kvf_gguf_open(path, &g, err, sizeof(err))) < 0) {
        fprintf(stderr, "kvfence bench model: %s\n", err); /* err names the file */
        goto out;
    }
    if ((rc = kvf_model_load(g, &m, err, sizeof(err))) < 0) {
        fprintf(stderr, "kvfence bench model: %s: %s\n", path, err);
        goto out;
    }
    const struct kvf_model_hparams *hp = kvf_model_hparams(m);
    if (prompt + gen > hp->n_ctx) {
        fprintf(stderr, "kvfence bench model: prompt + gen exceeds the context (%u)\n", hp->n_ctx);
        goto out;
    }
    uint32_t per_seq = (uint32_t)((prompt + gen + page_tokens - 1) / page_tokens);
    struct kvf_pool_config pc;
    memset(&pc, 0, sizeof(pc));
    kvf_model_geometry(m, (uint32_t)page_tokens, &pc.geo);
    bool kv_default = kv_bytes == 0;
    if (kv_default) kv_bytes = pc.geo.elem_bytes;
    pc.geo.elem_bytes = kv_bytes;
    pc.n_pages = per_seq * (uint32_t)batch + 1; /* + 1 for the warm-up */
    pc.max_peers = 1;
    pc.tag_seed = 1;
    if ((rc = kvf_pool_create(&pc, &pool)) < 0) {
        fprintf(stderr, "kvfence bench model: pool: %s\n", kvf_strerror(rc));
        goto out;
    }
    if (chunk > prompt) chunk = prompt;
    uint32_t max_tokens = (uint32_t)(chunk > batch ? chunk : batch);
    struct kvf_fwd_config fc = {(uint32_t)threads, max_tokens, (uint32_t)batch, NULL, 0};
    if ((rc = kvf_fwd_create(m, &fc, &f)) < 0) {
        fprintf(stderr, "kvfence bench model: forward: %s\n", kvf_strerror(rc));
        goto out;
    }
    struct kvf_page_ref *pages = calloc((size_t)pc.n_pages, sizeof(*pages));
    int32_t *toks = malloc(batch * (prompt + gen) * sizeof(int32_t));
    float *logits = malloc(batch * hp->n_vocab * sizeof(float));
    struct kvf_fwd_seq *seqs = calloc(batch, sizeof(*seqs));
    if (!pages || !toks || !logits || !seqs) {
        fprintf(stderr, "kvfence bench model: out of memory\n");
        goto free_bufs;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (unsigned long i = 0; i < batch * (prompt + gen); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = 3 + (int32_t)(x % (hp->n_vocab - 3));
    }
    /* Touch the pool's memory and every weight first (one warm-up token on a page of its own):
     * page faults are not what this measures. */
    size_t pool_bytes = 0;
    memset(kvf_pool_data(pool, &pool_bytes), 0, pool_bytes);
    {
        struct kvf_owner wo = {{~0ull, 0}, 1};
        struct kvf_page_ref wp;
        if ((rc = kvf_pool_alloc(pool, &wo, KVF_HOLDER_SEQ, 1, false, &wp)) < 0) {
            fprintf(stderr, "kvfence bench model: alloc: %s\n", kvf_strerror(rc));
            goto free_bufs;
        }
        struct kvf_fwd_seq w = {wo.req, toks, 1, 0, &wp, 1, logits, 0};
        if (kvf_fwd_run(f, pool, &w, 1) != 1 || w.status != 0) {
            fprintf(stderr, "kvfence bench model: warm-up failed\n");
            goto free_bufs;
        }
    }
    printf("model %s: %s, dim %u, layers %u, vocab %u, %.1f MB of weights per step; kernels %s\n",
           path, kvf_model_type_name(m), hp->dim, hp->n_layers, hp->n_vocab,
           kvf_model_weight_bytes(m) / 1e6, kvf_kernels_name());

    double *pre_v = calloc(runs, sizeof(double)), *dec_v = calloc(runs, sizeof(double));
    if (!pre_v || !dec_v) {
        fprintf(stderr, "kvfence bench model: out of memory\n");
        free(pre_v);
        free(dec_v);
        goto free_bufs;
    }
    for (unsigned long run = 0; run < runs; run++) {
        double pt, dt;
        if (one_run(f, pool, hp, pages, per_seq, toks, logits, seqs, batch, prompt, gen, chunk, &pt,
                    &dt) != 0) {
            free(pre_v);
            free(dec_v);
            goto free_bufs;
        }
        pre_v[run] = (double)(batch * prompt) / pt;
        dec_v[run] = (double)(batch * gen) / dt;
        printf("run %lu: prefill %.1f tokens/s, decode %.1f tokens/s (%.2f ms per step)\n", run + 1,
               pre_v[run], dec_v[run], dt * 1e3 / gen);
    }
    double prefill_tps = kvf_bench_median(pre_v, (int)runs);
    double decode_tps = kvf_bench_median(dec_v, (int)runs);
    free(pre_v);
    free(dec_v);
    double bw = copy_bandwidth();
    double step_min_s = (double)kvf_model_weight_bytes(m) / bw;
    double roof_tps = (double)batch / step_min_s;
    printf("prefill: %lu x %lu tokens, median of %lu runs: %.1f tokens/s\n", batch, prompt, runs,
           prefill_tps);
    printf("decode: %lu x %lu tokens, median of %lu runs: %.1f tokens/s (%.2f ms per step)\n",
           batch, gen, runs, decode_tps, batch * 1e3 / decode_tps);
    printf("kv: %s (%u bytes per K/V element%s)\n", kv_bytes == 2 ? "f16" : "f32", kv_bytes,
           kv_default ? ", the model's default" : "");
    printf("roofline: copy bandwidth %.2f GB/s; weights %.1f MB per step -> at most %.1f "
           "tokens/s at batch %lu; decode reaches %.1f%% of it\n",
           bw / 1e9, kvf_model_weight_bytes(m) / 1e6, roof_tps, batch,
           100.0 * decode_tps / roof_tps);
    printf("result bench=model prefill_tps=%.1f decode_tps=%.1f batch=%lu threads=%lu\n",
           prefill_tps, decode_tps, batch, threads);
    status = 0;

free_bufs:
    free(seqs);
    free(logits);
    free(toks);
    free(pages);
out:
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    kvf_model_free(m);
    kvf_gguf_close(g);
    return status;
}
