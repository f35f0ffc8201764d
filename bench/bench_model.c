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
 * With --json-schema FILE each run decodes twice, unconstrained and constrained to the schema
 * (response_format json_schema: each token drawn greedily among those the grammar's mask allows,
 * the masks computed as the decode worker computes them, one grammar and its mask cache shared by
 * the batch; a sequence whose JSON value is complete and draws end-of-generation starts the next
 * value), and prints the constrained decode throughput over the unconstrained one, the median of
 * the runs' ratios (the two passes alternate in order from run to run). The first run fills the
 * grammar's mask cache; later runs find the states there, as a server does once requests with that
 * schema have run. The roofline: a decode step must stream every weight once, so it cannot beat
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
#include "kvfence/grammar.h"
#include "kvfence/model.h"
#include "kvfence/server.h"
#include "kvfence/text.h"
#include "kvfence/pool.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvfence bench model --model F.gguf [--batch B] [--prompt N] [--gen M]\n"
               "                           [--threads T] [--page-tokens P] [--chunk C] [--runs R]\n"
               "                           [--kv-type f32|f16] [--json-schema FILE]\n");
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

/* A constrained decode (--json-schema): the grammar, the vocabulary's bytes, each sequence's
 * state, the masked logits, and the end-of-generation ids. NULL g: unconstrained. */
struct gctx {
    kvf_grammar_t *g;
    kvf_grammar_vocab_t *v;
    struct kvf_grammar_state *st; /* [batch] */
    float *buf;                   /* [n_vocab] */
    const int32_t *stop;
    uint32_t n_stop;
};

/* The next token of sequence s: greedy, within the grammar when there is one. */
static int32_t pick(struct gctx *c, unsigned long s, const float *l, uint32_t n)
{
    if (!c || !c->g) return greedy(l, n);
    int left = kvf_grammar_apply_to(c->g, c->v, &c->st[s], l, c->buf, n, c->stop, c->n_stop);
    int32_t t = left > 0 ? greedy(c->buf, n) : (c->n_stop ? c->stop[0] : 0);
    bool is_stop = false;
    for (uint32_t k = 0; k < c->n_stop; k++)
        is_stop |= c->stop[k] == t;
    if (is_stop || kvf_grammar_state_advance(c->g, c->v, &c->st[s], t) < 0)
        kvf_grammar_state_init(c->g, &c->st[s]); /* the next value */
    return t;
}

/* One prefill of every sequence then gen decode steps, on freshly allocated pages (released
 * again at the end); the two phases' wall times in seconds. */
/* Reads the schema, compiles its grammar and the vocabulary for --json-schema. 0, or -1
 * (printed). */
static int load_schema(const kvf_gguf_t *g, const char *path, uint32_t n_vocab, unsigned long batch,
                       kvf_tokenizer_t **tok, struct gctx *gc)
{
    char err[256] = "", *file = malloc(65536), *text = malloc(KVF_GRAMMAR_MAX_BYTES + 1);
    FILE *fp = fopen(path, "rb");
    size_t n = fp && file ? fread(file, 1, 65536, fp) : 0;
    if (fp) fclose(fp);
    int rc = -1;
    if (!file || !text || n == 0) {
        snprintf(err, sizeof err, "cannot read %s", path);
        goto done;
    }
    int len = kvf_schema_to_grammar(file, n, text, KVF_GRAMMAR_MAX_BYTES + 1, err, sizeof err);
    if (len < 0 || kvf_grammar_compile(text, (size_t)len, &gc->g, err, sizeof err) < 0) goto done;
    if (kvf_tokenizer_create(g, tok, err, sizeof err) < 0) goto done;
    gc->st = calloc(batch, sizeof *gc->st);
    gc->buf = malloc(n_vocab * sizeof(float));
    if (kvf_grammar_vocab_create(*tok, &gc->v) < 0 || !gc->st || !gc->buf) {
        snprintf(err, sizeof err, "out of memory");
        goto done;
    }
    size_t n_eog = kvf_tokenizer_eog(*tok, &gc->stop);
    gc->n_stop = (uint32_t)(n_eog < 8 ? n_eog : 8);
    rc = 0;
done:
    if (rc < 0) fprintf(stderr, "kvfence bench model: --json-schema: %s\n", err);
    free(file);
    free(text);
    return rc;
}

static int one_run(kvf_fwd_t *f, kvf_pool_t *pool, const struct kvf_model_hparams *hp,
                   struct kvf_page_ref *pages, uint32_t per_seq, int32_t *toks, float *logits,
                   struct kvf_fwd_seq *seqs, unsigned long batch, unsigned long prompt,
                   unsigned long gen, unsigned long chunk, struct gctx *gc, double *prefill_s,
                   double *decode_s)
{
    for (unsigned long s = 0; gc && gc->g && s < batch; s++)
        kvf_grammar_state_init(gc->g, &gc->st[s]);
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
        toks[s * (prompt + gen) + prompt] = pick(gc, s, logits + s * hp->n_vocab, hp->n_vocab);
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
        for (unsigned long s = 0; s < batch; s++)
            if (seqs[s].status != 0) {
                fprintf(stderr, "kvfence bench model: decode failed: %s\n",
                        kvf_strerror(seqs[s].status));
                return -1;
            }
        if (step + 1 < gen)
            for (unsigned long s = 0; s < batch; s++)
                toks[s * (prompt + gen) + prompt + step + 1] =
                    pick(gc, s, logits + s * hp->n_vocab, hp->n_vocab);
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
    const char *path = NULL, *schema_path = NULL;
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
        else if (strcmp(a, "--json-schema") == 0)
            schema_path = v;
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
    kvf_tokenizer_t *tok = NULL;
    struct gctx gc = {0};
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
    if (schema_path && load_schema(g, schema_path, hp->n_vocab, batch, &tok, &gc) < 0) goto out;
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
    double *ratio_v = calloc(runs, sizeof(double));
    for (unsigned long run = 0; ratio_v && run < runs; run++) {
        double pt, dt, gpt, gdt;
        /* With a schema the two passes alternate in order, so neither gains from going second. */
        bool schema_first = gc.g && run % 2 == 1;
        if ((schema_first && one_run(f, pool, hp, pages, per_seq, toks, logits, seqs, batch, prompt,
                                     gen, chunk, &gc, &gpt, &gdt) != 0) ||
            one_run(f, pool, hp, pages, per_seq, toks, logits, seqs, batch, prompt, gen, chunk,
                    NULL, &pt, &dt) != 0 ||
            (gc.g && !schema_first &&
             one_run(f, pool, hp, pages, per_seq, toks, logits, seqs, batch, prompt, gen, chunk,
                     &gc, &gpt, &gdt) != 0)) {
            free(pre_v);
            free(dec_v);
            free(ratio_v);
            goto free_bufs;
        }
        pre_v[run] = (double)(batch * prompt) / pt;
        dec_v[run] = (double)(batch * gen) / dt;
        printf("run %lu: prefill %.1f tokens/s, decode %.1f tokens/s (%.2f ms per step)\n", run + 1,
               pre_v[run], dec_v[run], dt * 1e3 / gen);
        if (gc.g) {
            ratio_v[run] = dt / gdt;
            printf("run %lu: with the schema, decode %.1f tokens/s (%.2f ms per step): %.3fx\n",
                   run + 1, (double)(batch * gen) / gdt, gdt * 1e3 / gen, ratio_v[run]);
        }
    }
    double ratio = ratio_v && gc.g ? kvf_bench_median(ratio_v, (int)runs) : 0.0;
    free(ratio_v);
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
    if (gc.g)
        printf("json-schema: constrained decode over unconstrained, median of %lu runs: %.3fx\n",
               runs, ratio);
    printf("result bench=model prefill_tps=%.1f decode_tps=%.1f batch=%lu threads=%lu", prefill_tps,
           decode_tps, batch, threads);
    if (gc.g) printf(" schema_ratio=%.3f", ratio);
    printf("\n");
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
    kvf_grammar_free(gc.g);
    kvf_grammar_vocab_free(gc.v);
    free(gc.st);
    free(gc.buf);
    kvf_tokenizer_destroy(tok);
    kvf_gguf_close(g);
    return status;
}
