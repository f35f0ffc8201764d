/*
 * bench_attention.c — `kvfence bench attention`: the attention phase of a decode step alone,
 * over K/V in pool pages, with the engine's own kernels, work items and thread pool.
 *
 *   kvfence bench attention [--seqs S] [--positions P] [--layers L] [--threads T]
 *                           [--kv-type f32|f16] [--runs R]
 *
 * S sequences (default 16) each decode one token at position P - 1 (default 192), attending
 * over P positions of its own pages, in each of L layers (default 30) in turn, as a decode step
 * of the forward pass does; the head shape is smol135m's (9 query heads, 3 K/V heads, head_dim
 * 64; 16-slot pages). With L layers of K/V (S · P · 2 · 768 bytes each, as floats) far larger
 * than the caches, every pass reads its K/V from memory. A run repeats the pass over all
 * layers for about half a second; R runs (default 5), medians reported: milliseconds per pass,
 * K/V bytes read per second, multiply-adds per second. The chunking is forward.c's: one chunk
 * per thread when the batch has at least two tokens per four-per-thread chunk, else four per
 * thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "bench.h"
#include "forward_pool.h"
#include "kernels.h"
#include "kvfence/common.h"
#include "kvfence/pool.h"
#include "kvfence/gguf.h"

enum { N_HEADS = 9, N_KV = 3, HEAD_DIM = 64, PAGE_TOKENS = 16 };

static void usage(FILE *f)
{
    fprintf(f, "usage: kvfence bench attention [--seqs S] [--positions P] [--layers L]\n"
               "                               [--threads T] [--kv-type f32|f16] [--runs R]\n");
}

struct pass {
    struct kvf_attn_batch *layers;
    uint32_t n_layers, chunks;
    struct kvf_tpool *tp;
};

static void job(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    kvf__attn_chunk(ctx, i, n, thread);
}

static void one_pass(const struct pass *p)
{
    for (uint32_t l = 0; l < p->n_layers; l++) {
        kvf__tpool_run(p->tp, job, &p->layers[l], p->chunks);
        kvf__attn_finish(&p->layers[l], p->chunks);
    }
}

/* A value for every K/V element, spread over [-0.5, 0.5): what it is does not matter, only
 * that it is a finite number the kernels read. */
static void fill_kv(uint8_t *base, size_t bytes, uint32_t eb)
{
    for (size_t i = 0; i < bytes / eb; i++) {
        float v = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        if (eb == 2)
            ((uint16_t *)base)[i] = kvf_f32_to_fp16(v);
        else
            ((float *)base)[i] = v;
    }
}

int kvf_bench_attention(int argc, char **argv)
{
    unsigned long seqs = 16, positions = 192, layers = 30, threads = 2, runs = 5;
    uint32_t eb = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = NULL, *v = NULL;
        int st = kvf_bench_opt(argc, argv, &i, usage, &a, &v);
        if (st != 1) return st;
        unsigned long *dst = NULL, most = 4096;
        if (strcmp(a, "--kv-type") == 0) {
            if (kvf_bench_kv_type_arg("attention", v, &eb) != 0) return 2;
        } else if (strcmp(a, "--seqs") == 0)
            dst = &seqs;
        else if (strcmp(a, "--positions") == 0)
            dst = &positions, most = 65536;
        else if (strcmp(a, "--layers") == 0)
            dst = &layers, most = 256;
        else if (strcmp(a, "--threads") == 0)
            dst = &threads, most = 256;
        else if (strcmp(a, "--runs") == 0)
            dst = &runs, most = 101;
        else {
            usage(stderr);
            return 2;
        }
        if (dst && kvf_bench_ulong_arg("attention", a, v, most, dst) != 0) return 2;
    }
    kvf__kernels_init();
    uint32_t S = (uint32_t)seqs, P = (uint32_t)positions, L = (uint32_t)layers;
    uint32_t per_seq = (P + PAGE_TOKENS - 1) / PAGE_TOKENS;
    uint32_t chunks = threads > 1 ? 4 * (uint32_t)threads : 1;
    if (S >= 2u * chunks) chunks = (uint32_t)threads;

    int status = 1, rc;
    uint32_t n_alloc = 0; /* sequences whose pages are allocated */
    kvf_pool_t *pool = NULL;
    struct kvf_tpool *tp = NULL;
    struct kvf_page_ref *pages = calloc((size_t)S * per_seq, sizeof(*pages));
    struct kvf_fwd_seq *fs = calloc(S, sizeof(*fs));
    uint32_t *tok_seq = calloc(S, sizeof(uint32_t)), *tok_pos = calloc(S, sizeof(uint32_t));
    size_t q_floats = (size_t)S * N_HEADS * HEAD_DIM;
    float *q = malloc(q_floats * sizeof(float)), *out = malloc(q_floats * sizeof(float));
    size_t sf = kvf__attn_scratch_floats(P, N_HEADS, HEAD_DIM);
    float *scratch = malloc(threads * sf * sizeof(float));
    float *part = malloc(kvf__attn_part_floats(P, N_HEADS, HEAD_DIM, S, chunks) * sizeof(float));
    struct kvf_attn_batch *lb = calloc(L, sizeof(*lb));
    if (!pages || !fs || !tok_seq || !tok_pos || !q || !out || !scratch || !part || !lb) {
        fprintf(stderr, "kvfence bench attention: out of memory\n");
        goto out;
    }

    struct kvf_pool_config pc;
    memset(&pc, 0, sizeof(pc));
    pc.geo = (struct kvf_pool_geometry){L, N_KV, HEAD_DIM, PAGE_TOKENS, eb};
    pc.n_pages = S * per_seq;
    pc.max_peers = 1;
    pc.tag_seed = 1;
    if ((rc = kvf_pool_create(&pc, &pool)) < 0 ||
        (rc = kvf__tpool_create((uint32_t)threads, NULL, &tp)) < 0) {
        fprintf(stderr, "kvfence bench attention: setup: %s\n", kvf_strerror(rc));
        goto out;
    }
    for (uint32_t s = 0; s < S; s++) {
        struct kvf_owner own = {{s + 1, 0}, 1};
        if ((rc = kvf_pool_alloc(pool, &own, KVF_HOLDER_SEQ, per_seq, false,
                                 pages + (size_t)s * per_seq)) < 0) {
            fprintf(stderr, "kvfence bench attention: alloc: %s\n", kvf_strerror(rc));
            goto out;
        }
        n_alloc++;
        fs[s].pages = pages + (size_t)s * per_seq;
        fs[s].n_pages = per_seq;
        tok_seq[s] = s;
        tok_pos[s] = P - 1;
    }
    size_t page_bytes = kvf_pool_page_bytes(pool), pool_bytes = 0;
    uint8_t *base = kvf_pool_data(pool, &pool_bytes);
    fill_kv(base, (size_t)pc.n_pages * page_bytes, eb);
    for (size_t i = 0; i < q_floats; i++)
        q[i] = 0.01f * (float)(i % 97) - 0.48f;
    for (uint32_t l = 0; l < L; l++)
        lb[l] = (struct kvf_attn_batch){
            .nt = S,
            .n_heads = N_HEADS,
            .n_kv_heads = N_KV,
            .head_dim = HEAD_DIM,
            .q = q,
            .out = out,
            .tok_seq = tok_seq,
            .tok_pos = tok_pos,
            .seqs = fs,
            .pool_base = base,
            .page_bytes = page_bytes,
            .page_tokens = PAGE_TOKENS,
            .k_off = kvf_geo_kv_offset(&pc.geo, l, 0),
            .v_off = kvf_geo_kv_offset(&pc.geo, l, 1),
            .elem_bytes = eb,
            .scratch = scratch,
            .scratch_floats = sf,
            .part = part,
        };
    struct pass p = {lb, L, chunks, tp};
    one_pass(&p); /* warm-up */

    double kv_bytes = 2.0 * S * P * N_KV * HEAD_DIM * eb * L;
    double macs = 2.0 * S * N_HEADS * P * HEAD_DIM * L;
    printf("attention: %lu sequences x %lu positions x %lu layers, %u/%u heads of %u, K/V %s "
           "(%.1f MB per pass), %lu threads, %u chunks, kernels %s\n",
           seqs, positions, layers, N_HEADS, N_KV, HEAD_DIM, eb == 2 ? "f16" : "f32",
           kv_bytes / 1e6, threads, chunks, kvf__kern->name);
    double ms[101];
    for (unsigned long r = 0; r < runs; r++) {
        uint64_t t0 = kvf_bench_now_ns(), t1;
        uint32_t passes = 0;
        do {
            one_pass(&p);
            passes++;
            t1 = kvf_bench_now_ns();
        } while (t1 - t0 < 500000000ull);
        ms[r] = (double)(t1 - t0) * 1e-6 / passes;
        printf("run %lu: %.3f ms per pass, %.2f GB/s of K/V, %.2f GMAC/s\n", r + 1, ms[r],
               kv_bytes / (ms[r] * 1e6), macs / (ms[r] * 1e6));
    }
    double med = kvf_bench_median(ms, (int)runs);
    printf("median of %lu runs: %.3f ms per pass\n", runs, med);
    printf("result bench=attention ms_per_pass=%.3f kv_gbps=%.2f gmacps=%.2f seqs=%lu "
           "positions=%lu threads=%lu\n",
           med, kv_bytes / (med * 1e6), macs / (med * 1e6), seqs, positions, threads);
    status = 0;
out:
    for (size_t i = 0; i < (size_t)n_alloc * per_seq; i++)
        kvf_pool_release(pool, pages[i], KVF_HOLDER_SEQ, 0);
    kvf__tpool_destroy(tp);
    kvf_pool_destroy(pool);
    free(lb);
    free(part);
    free(scratch);
    free(out);
    free(q);
    free(tok_pos);
    free(tok_seq);
    free(fs);
    free(pages);
    return status;
}
