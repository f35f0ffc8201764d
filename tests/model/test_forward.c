/*
 * test_forward.c — the forward pass against a double-precision reference, batch invariance,
 * page checks, and poisoned free pages.
 *
 * Seeds: every case draws prompts from kvf_test_seed() (printed; replay with --seed N).
 */
#include "model_test_util.h"

/* --- Correctness against the reference. ---------------------------------------------------- */

/* Prefills the first n_prefill tokens in one call, then feeds the rest one at a time (teacher
 * forcing), comparing the logits of every position that produced some against the reference. */
static void check_reference(const char *shape, uint32_t type, uint32_t n_prefill, uint32_t n,
                            double tol)
{
    struct tmodel tm;
    tmodel_open(&tm, shape, type, 7);
    const struct kvf_model_hparams *hp = kvf_model_hparams(tm.m);
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    int32_t toks[64];
    rand_tokens(&r, toks, n, hp->n_vocab);
    double *ref = malloc((size_t)n * hp->n_vocab * sizeof(double));
    ref_forward(tm.m, toks, n, ref);

    kvf_pool_t *pool = tpool_create(tm.m, 16, 8, false);
    kvf_fwd_t *f = tfwd_create(tm.m, 2, 64, 4);
    struct tseq s;
    tseq_alloc(pool, &s, (n + 15) / 16, 1);
    float *logits = malloc(hp->n_vocab * sizeof(float));
    double worst = 0.0, worst_max = 0.0;
    for (uint32_t at = 0; at < n;) {
        uint32_t len = at == 0 ? n_prefill : 1;
        struct kvf_fwd_seq fs = tseq_step(&s, toks + at, len, logits);
        ASSERT_EQ_INT(kvf_fwd_run(f, pool, &fs, 1), 1);
        ASSERT_EQ_INT(fs.status, 0);
        s.pos += len;
        at += len;
        double em = 0.0;
        double e = rel_err(logits, ref + (size_t)(at - 1) * hp->n_vocab, hp->n_vocab, &em);
        if (e > worst) worst = e;
        if (em > worst_max) worst_max = em;
        if (!(e <= tol))
            KVF_FAIL("%s %s position %u: relative error %.3g > %.3g", shape,
                     kvf_model_type_name(tm.m), at - 1, e, tol);
    }
    printf("# %s %s (%s kernels): worst relative error %.3g (norm-wise; tolerance %.0e), "
           "%.3g element-wise, over %u positions\n",
           shape, kvf_model_type_name(tm.m), kvf_kernels_name(), worst, tol, worst_max,
           n - n_prefill + 1);
    tseq_release(pool, &s);
    char why[128];
    ASSERT_TRUE(kvf_pool_check(pool, why, sizeof(why)));
    free(logits);
    free(ref);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    tmodel_close(&tm);
}

static void test_reference_tiny_f32(void)
{
    check_reference("tiny", KVF_GGML_F32, 20, 40, 1e-4);
}

/* Q8_0 runs quantize each activation row to 16 bits (one scale per row) before the integer dot
 * products; that rounding is the only difference from the reference, which multiplies the same
 * dequantized weights by exact activations. */
static void test_reference_tiny_q8_0(void)
{
    check_reference("tiny", KVF_GGML_Q8_0, 20, 40, 1e-2);
}

static void test_reference_s15m_f32(void)
{
    check_reference("s15m", KVF_GGML_F32, 5, 8, 1e-4);
}

static void test_reference_s15m_q8_0(void)
{
    check_reference("s15m", KVF_GGML_Q8_0, 5, 8, 1e-2);
}

/* K-quant models (mkmodel --type q4_k_m: Q4_K and Q6_K, all rows whole super-blocks in these
 * shapes) and the qwen architectures. The reference multiplies the dequantized weights by exact
 * activations; the kernels quantize activations to 16 bits as for Q8_0 (kernels.h), the one
 * difference, so the tolerance is Q8_0's. */
static void test_reference_ktiny_q4_k_m(void)
{
    check_reference("ktiny", KVF_MKMODEL_Q4_K_M, 20, 40, 1e-2);
}

/* The Q4_K_M mix on rows that are not whole super-blocks, as llama.cpp writes it: s15m's rows
 * of 288 take Q5_0 (and Q8_0 for the more-bits attn_v and the tied embedding) with Q4_K and
 * Q6_K in ffn_down; tiny's take Q5_0 and Q8_0, with F16 in ffn_down (rows of 172). */
static void test_reference_q4_k_m_fallbacks(void)
{
    check_reference("s15m", KVF_MKMODEL_Q4_K_M, 5, 8, 1e-2);
    check_reference("tiny", KVF_MKMODEL_Q4_K_M, 20, 40, 1e-2);
}

/* The Q5_K_M mix: ktiny's rows are whole super-blocks (Q5_K and Q6_K); s15m's rows of 288 take
 * Q5_1 for Q5_K (and Q8_0 for the more-bits attn_v and the tied embedding) with Q5_K and Q6_K in
 * ffn_down; tiny's take Q5_1 and Q8_0, with F16 in ffn_down. */
static void test_reference_q5_k_m(void)
{
    check_reference("ktiny", KVF_MKMODEL_Q5_K_M, 20, 40, 1e-2);
    check_reference("s15m", KVF_MKMODEL_Q5_K_M, 5, 8, 1e-2);
    check_reference("tiny", KVF_MKMODEL_Q5_K_M, 20, 40, 1e-2);
}

static void test_reference_qwen2(void)
{
    check_reference("qwen2-tiny", KVF_GGML_F32, 20, 40, 1e-4);
    check_reference("qwen2-tiny", KVF_GGML_Q8_0, 20, 40, 1e-2);
    check_reference("qwen2-tiny", KVF_MKMODEL_Q4_K_M, 20, 40, 1e-2);
}

static void test_reference_qwen3(void)
{
    check_reference("qwen3-tiny", KVF_GGML_F32, 20, 40, 1e-4);
    check_reference("qwen3-tiny", KVF_GGML_Q8_0, 20, 40, 1e-2);
    check_reference("qwen3-tiny", KVF_MKMODEL_Q4_K_M, 20, 40, 1e-2);
}

/* The loaded hyper-parameters and weights of each architecture, and the Q4_K_M mix mkmodel
 * documents (including its fallbacks where rows are not whole super-blocks). */
static void test_arch_and_mix_loaded(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "qwen3-tiny", KVF_MKMODEL_Q4_K_M, 7);
    const struct kvf_model_hparams *hp = kvf_model_hparams(tm.m);
    ASSERT_EQ_INT(hp->arch, KVF_ARCH_QWEN3);
    ASSERT_TRUE(hp->qk_norm && hp->rope_halves && !hp->qkv_bias);
    ASSERT_EQ_INT(hp->head_dim, 128);
    ASSERT_EQ_INT(hp->n_heads * hp->head_dim, 512);
    const struct kvf_layer *L0 = &tm.m->layers[0], *L1 = &tm.m->layers[1];
    /* 2 layers: use_more_bits picks layer 1 (≥ 7 · 2 / 8). */
    ASSERT_EQ_INT(L0->wq.type, KVF_GGML_Q4_K);
    ASSERT_EQ_INT(L0->wv.type, KVF_GGML_Q4_K);
    ASSERT_EQ_INT(L1->wv.type, KVF_GGML_Q6_K);
    ASSERT_EQ_INT(L0->w_down.type, KVF_GGML_Q4_K);
    ASSERT_EQ_INT(L1->w_down.type, KVF_GGML_Q6_K);
    ASSERT_EQ_INT(tm.m->output.type, KVF_GGML_Q6_K);
    ASSERT_EQ_INT(tm.m->tok_embd.type, KVF_GGML_Q4_K);
    ASSERT_NOT_NULL(L0->q_norm);
    ASSERT_TRUE(L0->bq == NULL);
    struct kvf_pool_geometry geo;
    kvf_model_geometry(tm.m, 16, &geo);
    ASSERT_EQ_INT(geo.elem_bytes, 2);
    tmodel_close(&tm);
    tmodel_open(&tm, "qwen2-tiny", KVF_MKMODEL_Q4_K_M, 7);
    hp = kvf_model_hparams(tm.m);
    ASSERT_TRUE(hp->arch == KVF_ARCH_QWEN2 && hp->qkv_bias && hp->rope_halves && !hp->qk_norm);
    ASSERT_TRUE(tm.m->output.data == tm.m->tok_embd.data); /* tied */
    ASSERT_EQ_INT(tm.m->tok_embd.type, KVF_GGML_Q6_K);     /* tied: the output's type */
    ASSERT_NOT_NULL(tm.m->layers[1].bv);
    tmodel_close(&tm);
    /* smol135m's rows of 576 are not whole super-blocks: Q5_0 and Q8_0 stand in, as in a
     * downloaded SmolLM2-135M Q4_K_M; ffn_down's rows of 1536 are. */
    tmodel_open(&tm, "smol135m", KVF_MKMODEL_Q4_K_M, 7);
    ASSERT_EQ_INT(tm.m->layers[0].wq.type, KVF_GGML_Q5_0);
    ASSERT_EQ_INT(tm.m->layers[0].wk.type, KVF_GGML_Q5_0);
    ASSERT_EQ_INT(tm.m->layers[0].wo.type, KVF_GGML_Q5_0);
    ASSERT_EQ_INT(tm.m->layers[0].w_gate.type, KVF_GGML_Q5_0);
    ASSERT_EQ_INT(tm.m->layers[0].w_up.type, KVF_GGML_Q5_0);
    ASSERT_EQ_INT(tm.m->layers[3].wv.type, KVF_GGML_Q5_0);
    ASSERT_EQ_INT(tm.m->layers[0].wv.type, KVF_GGML_Q8_0);
    ASSERT_EQ_INT(tm.m->layers[0].w_down.type, KVF_GGML_Q6_K);
    ASSERT_EQ_INT(tm.m->layers[3].w_down.type, KVF_GGML_Q4_K);
    ASSERT_EQ_INT(tm.m->tok_embd.type, KVF_GGML_Q8_0);
    tmodel_close(&tm);
    /* tiny's ffn_down rows of 172 are not whole 32-value blocks either: F16. */
    tmodel_open(&tm, "tiny", KVF_MKMODEL_Q4_K_M, 7);
    ASSERT_EQ_INT(tm.m->layers[0].wq.type, KVF_GGML_Q5_0);
    ASSERT_EQ_INT(tm.m->layers[0].w_down.type, KVF_GGML_F16);
    ASSERT_EQ_INT(tm.m->layers[1].w_down.type, KVF_GGML_F16);
    ASSERT_EQ_INT(tm.m->output.type, KVF_GGML_Q8_0);
    tmodel_close(&tm);
    /* Q5_K_M: smol135m mostly Q5_1, as a downloaded SmolLM2-135M Q5_K_M is; ffn_down Q5_K or
     * Q6_K; ktiny Q5_K and Q6_K. */
    tmodel_open(&tm, "smol135m", KVF_MKMODEL_Q5_K_M, 7);
    ASSERT_EQ_INT(tm.m->layers[0].wq.type, KVF_GGML_Q5_1);
    ASSERT_EQ_INT(tm.m->layers[0].wk.type, KVF_GGML_Q5_1);
    ASSERT_EQ_INT(tm.m->layers[0].wo.type, KVF_GGML_Q5_1);
    ASSERT_EQ_INT(tm.m->layers[0].w_gate.type, KVF_GGML_Q5_1);
    ASSERT_EQ_INT(tm.m->layers[0].w_up.type, KVF_GGML_Q5_1);
    ASSERT_EQ_INT(tm.m->layers[3].wv.type, KVF_GGML_Q5_1);
    ASSERT_EQ_INT(tm.m->layers[0].wv.type, KVF_GGML_Q8_0);
    ASSERT_EQ_INT(tm.m->layers[0].w_down.type, KVF_GGML_Q6_K);
    ASSERT_EQ_INT(tm.m->layers[3].w_down.type, KVF_GGML_Q5_K);
    ASSERT_EQ_INT(tm.m->tok_embd.type, KVF_GGML_Q8_0);
    tmodel_close(&tm);
    tmodel_open(&tm, "ktiny", KVF_MKMODEL_Q5_K_M, 7);
    ASSERT_EQ_INT(tm.m->layers[0].wq.type, KVF_GGML_Q5_K);
    ASSERT_EQ_INT(tm.m->layers[0].w_down.type, KVF_GGML_Q5_K);
    ASSERT_EQ_INT(tm.m->layers[1].w_down.type, KVF_GGML_Q6_K);
    ASSERT_EQ_INT(tm.m->output.type, KVF_GGML_Q6_K);
    tmodel_close(&tm);
    tmodel_open(&tm, "tiny", KVF_MKMODEL_Q5_K_M, 7);
    ASSERT_EQ_INT(tm.m->layers[0].wq.type, KVF_GGML_Q5_1);
    ASSERT_EQ_INT(tm.m->layers[0].w_down.type, KVF_GGML_F16);
    tmodel_close(&tm);
}

/* An architecture kvfence does not read is refused by name; a qwen2 file without its biases
 * is refused naming the first missing one; nothing is loaded either way. */
static void test_arch_refused(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "tiny", KVF_GGML_F32, 3);
    kvf_model_free(tm.m);
    kvf_gguf_close(tm.g);
    char err[256] = "";
    kvf_model_t *m = NULL;
    patch_file(tm.path, "llama", "gemma");
    ASSERT_OK(kvf_gguf_open(tm.path, &tm.g, err, sizeof err));
    ASSERT_ERR(kvf_model_load(tm.g, &m, err, sizeof err), KVF_E_MODEL_UNSUPPORTED);
    ASSERT_TRUE(m == NULL);
    ASSERT_TRUE(strstr(err, "'gemma'") != NULL);
    printf("# %s\n", err);
    kvf_gguf_close(tm.g);
    patch_file(tm.path, "gemma", "qwen2");
    ASSERT_OK(kvf_gguf_open(tm.path, &tm.g, err, sizeof err));
    ASSERT_ERR(kvf_model_load(tm.g, &m, err, sizeof err), KVF_E_MODEL_MISSING);
    ASSERT_TRUE(strstr(err, "blk.0.attn_q.bias") != NULL);
    printf("# %s\n", err);
    kvf_gguf_close(tm.g);
    /* A llama file read as qwen3 lacks the per-head norms. */
    patch_file(tm.path, "qwen2", "qwen3");
    ASSERT_OK(kvf_gguf_open(tm.path, &tm.g, err, sizeof err));
    ASSERT_ERR(kvf_model_load(tm.g, &m, err, sizeof err), KVF_E_MODEL_MISSING);
    ASSERT_TRUE(strstr(err, "blk.0.attn_q_norm.weight") != NULL);
    kvf_gguf_close(tm.g);
    tm.g = NULL;
    tm.m = NULL;
    tmodel_close(&tm);
}

/* --- Batch invariance. --------------------------------------------------------------------- */

#define INV_SEQS    9
#define INV_MAX_LEN 40

struct inv_seq {
    int32_t toks[INV_MAX_LEN];
    uint32_t n;
    float *alone; /* (n, n_vocab): logits of every position, computed alone one token a step */
};

/* Every position's logits, alone: one thread, one token per call, 16-slot pages. */
static void run_alone(const kvf_model_t *m, struct inv_seq *q)
{
    uint32_t V = kvf_model_hparams(m)->n_vocab;
    kvf_pool_t *pool = tpool_create(m, 16, 4, false);
    kvf_fwd_t *f = tfwd_create(m, 1, 1, 1);
    struct tseq s;
    tseq_alloc(pool, &s, (q->n + 15) / 16, 1);
    for (uint32_t i = 0; i < q->n; i++) {
        struct kvf_fwd_seq fs = tseq_step(&s, q->toks + i, 1, q->alone + (size_t)i * V);
        ASSERT_EQ_INT(kvf_fwd_run(f, pool, &fs, 1), 1);
        ASSERT_EQ_INT(fs.status, 0);
        s.pos++;
    }
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
}

/* K and V kept as IEEE halves: the one extra rounding is each K/V element's, to 11 bits
 * (measured 2.5-4.3e-4 on these models, against about 1e-6 with floats). */
static void test_reference_kv_f16(void)
{
    tpool_kv_bytes = 2;
    printf("# K/V as IEEE halves:\n");
    check_reference("tiny", KVF_GGML_F32, 20, 40, 2e-3);
    check_reference("s15m", KVF_GGML_F32, 5, 8, 2e-3);
    check_reference("s15m", KVF_GGML_Q8_0, 5, 8, 2e-3);
    tpool_kv_bytes = 4;
}

/* The model's own page geometry: K/V as halves for a quantized model (whose logits are within
 * test_reference_kv_f16's bound with them), as floats for a full-precision one. */
static void test_geometry_kv_type(void)
{
    static const uint32_t types[2] = {KVF_GGML_F32, KVF_GGML_Q8_0};
    for (int i = 0; i < 2; i++) {
        struct tmodel tm;
        tmodel_open(&tm, "tiny", types[i], 3);
        struct kvf_pool_geometry geo;
        kvf_model_geometry(tm.m, 16, &geo);
        ASSERT_EQ_INT(geo.elem_bytes, types[i] == KVF_GGML_F32 ? 4 : 2);
        ASSERT_EQ_INT(geo.page_tokens, 16);
        ASSERT_EQ_INT(geo.n_layers, kvf_model_hparams(tm.m)->n_layers);
        tmodel_close(&tm);
    }
}

/* Runs n_seqs sequences together in rounds; in each round every unfinished sequence sends a
 * chunk of 1..max_chunk tokens (drawn), and the logits of each chunk's last token must equal,
 * bit for bit, what that position gave alone. */
static void run_batched(const kvf_model_t *m, struct inv_seq *qs, uint32_t n_seqs, uint32_t threads,
                        uint32_t page_tokens, uint32_t max_chunk, struct kvf_rng *r)
{
    uint32_t V = kvf_model_hparams(m)->n_vocab;
    uint32_t per = (INV_MAX_LEN + page_tokens - 1) / page_tokens;
    kvf_pool_t *pool = tpool_create(m, page_tokens, per * n_seqs, false);
    kvf_fwd_t *f = tfwd_create(m, threads, n_seqs * max_chunk, n_seqs);
    struct tseq *s = calloc(n_seqs, sizeof(*s));
    float *logits = malloc((size_t)n_seqs * V * sizeof(float));
    struct kvf_fwd_seq fs[INV_SEQS];
    uint32_t idx[INV_SEQS];
    for (uint32_t i = 0; i < n_seqs; i++)
        tseq_alloc(pool, &s[i], per, 100 + i);
    for (;;) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < n_seqs; i++) {
            if (s[i].pos == qs[i].n) continue;
            uint32_t len = 1 + kvf_rng_below(r, max_chunk);
            if (len > qs[i].n - s[i].pos) len = qs[i].n - s[i].pos;
            fs[k] = tseq_step(&s[i], qs[i].toks + s[i].pos, len, logits + (size_t)k * V);
            idx[k++] = i;
        }
        if (k == 0) break;
        ASSERT_EQ_INT(kvf_fwd_run(f, pool, fs, k), k);
        for (uint32_t j = 0; j < k; j++) {
            uint32_t i = idx[j];
            ASSERT_EQ_INT(fs[j].status, 0);
            s[i].pos += fs[j].n_tokens;
            const float *want = qs[i].alone + (size_t)(s[i].pos - 1) * V;
            if (memcmp(logits + (size_t)j * V, want, V * sizeof(float)) != 0)
                KVF_FAIL("seq %u position %u differs from alone (batch %u, threads %u, page %u, "
                         "chunk ≤ %u)",
                         i, s[i].pos - 1, n_seqs, threads, page_tokens, max_chunk);
        }
    }
    for (uint32_t i = 0; i < n_seqs; i++)
        tseq_release(pool, &s[i]);
    char why[128];
    ASSERT_TRUE(kvf_pool_check(pool, why, sizeof(why)));
    free(logits);
    free(s);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
}

static void check_invariance_shape(const char *shape, uint32_t type)
{
    struct tmodel tm;
    tmodel_open(&tm, shape, type, 11);
    uint32_t V = kvf_model_hparams(tm.m)->n_vocab;
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    struct inv_seq qs[INV_SEQS];
    for (uint32_t i = 0; i < INV_SEQS; i++) {
        qs[i].n = 8 + kvf_rng_below(&r, INV_MAX_LEN - 8 + 1);
        rand_tokens(&r, qs[i].toks, qs[i].n, V);
        /* Two sequences share a prefix so their K/V is identical where it overlaps. */
        if (i == 1) memcpy(qs[1].toks, qs[0].toks, 8 * sizeof(int32_t));
        qs[i].alone = malloc((size_t)qs[i].n * V * sizeof(float));
        run_alone(tm.m, &qs[i]);
    }
    static const uint32_t batches[] = {1, 2, 5, 9};
    static const uint32_t threads[] = {1, 2, 3};
    static const uint32_t pages[] = {16, 5};
    static const uint32_t chunks[] = {1, 4, 13};
    uint32_t runs = 0;
    for (size_t b = 0; b < KVF_ARRAY_LEN(batches); b++)
        for (size_t t = 0; t < KVF_ARRAY_LEN(threads); t++)
            for (size_t c = 0; c < KVF_ARRAY_LEN(chunks); c++) {
                run_batched(tm.m, qs, batches[b], threads[t], pages[(b + t + c) % 2], chunks[c],
                            &r);
                runs++;
            }
    printf("# %s %s: %u batched runs bit-identical to alone (%s kernels)\n", shape,
           kvf_model_type_name(tm.m), runs, kvf_kernels_name());
    for (uint32_t i = 0; i < INV_SEQS; i++)
        free(qs[i].alone);
    tmodel_close(&tm);
}

static void check_invariance(uint32_t type)
{
    check_invariance_shape("tiny", type);
}

/* The qwen blocks (bias, per-head norms, halves RoPE) over K-quant weights: K/V as halves, as
 * the model's own geometry asks. */
static void test_invariance_qwen_kquant(void)
{
    tpool_kv_bytes = 2;
    check_invariance_shape("qwen2-tiny", KVF_MKMODEL_Q4_K_M);
    check_invariance_shape("qwen3-tiny", KVF_MKMODEL_Q4_K_M);
    tpool_kv_bytes = 4;
    /* And the fallbacks (Q5_0, Q8_0, F16 rows) of tiny's Q4_K_M file, and (Q5_1, Q8_0, F16) of
     * its Q5_K_M file; ktiny's Q5_K_M (Q5_K, Q6_K). */
    check_invariance_shape("tiny", KVF_MKMODEL_Q4_K_M);
    check_invariance_shape("tiny", KVF_MKMODEL_Q5_K_M);
    check_invariance_shape("ktiny", KVF_MKMODEL_Q5_K_M);
}

static void test_invariance_f32(void)
{
    check_invariance(KVF_GGML_F32);
}

static void test_invariance_q8_0(void)
{
    check_invariance(KVF_GGML_Q8_0);
}

/* The same with K/V as halves: the rounding happens once, when a row is stored, so a position
 * reads the same halves however it was batched. */
static void test_invariance_kv_f16(void)
{
    tpool_kv_bytes = 2;
    check_invariance(KVF_GGML_Q8_0);
    tpool_kv_bytes = 4;
}

/* --- Page checks. -------------------------------------------------------------------------- */

/* A decode step that fails its page check: status KVF_E_MODEL_PAGE, its logits untouched, its
 * pages byte-for-byte unchanged, and the sequence next to it unaffected. */
static void check_refused(kvf_fwd_t *f, kvf_pool_t *pool, struct kvf_fwd_seq bad,
                          struct tseq *other, const int32_t *other_tok, const float *other_want,
                          uint32_t V)
{
    size_t pb = kvf_pool_page_bytes(pool);
    uint32_t np = kvf_pool_n_pages(pool);
    uint8_t *before = malloc(pb * np);
    for (uint32_t p = 0; p < np; p++)
        memcpy(before + p * pb, kvf_pool_page_data(pool, p), pb);
    float *lb = malloc(V * sizeof(float)), *lo = malloc(V * sizeof(float));
    for (uint32_t i = 0; i < V; i++)
        lb[i] = -12345.0f;
    bad.logits = lb;
    struct kvf_fwd_seq b[2] = {bad, tseq_step(other, other_tok, 1, lo)};
    ASSERT_EQ_INT(kvf_fwd_run(f, pool, b, 2), 1);
    ASSERT_ERR(b[0].status, KVF_E_MODEL_PAGE);
    ASSERT_EQ_INT(b[1].status, 0);
    other->pos++;
    for (uint32_t i = 0; i < V; i++)
        ASSERT_TRUE(lb[i] == -12345.0f);
    ASSERT_MEMEQ(lo, other_want, V * sizeof(float));
    /* Only the other sequence's page may have changed: every page of the refused one is as it
     * was. */
    for (uint32_t i = 0; i < bad.n_pages; i++) {
        uint32_t p = bad.pages[i].page;
        if (p >= np) continue;
        bool others = false;
        for (uint32_t k = 0; k < other->n_pages; k++)
            if (other->pages[k].page == p) others = true;
        if (!others) ASSERT_MEMEQ(kvf_pool_page_data(pool, p), before + p * pb, pb);
    }
    free(before);
    free(lb);
    free(lo);
}

static void test_page_checks(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "tiny", KVF_GGML_F32, 3);
    uint32_t V = kvf_model_hparams(tm.m)->n_vocab;
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    /* B's expected logits for each of its decode steps, alone. */
    struct inv_seq qb;
    qb.n = 30;
    rand_tokens(&r, qb.toks, qb.n, V);
    qb.alone = malloc((size_t)qb.n * V * sizeof(float));
    run_alone(tm.m, &qb);

    int32_t ta[30];
    rand_tokens(&r, ta, 30, V);
    kvf_pool_t *pool = tpool_create(tm.m, 16, 8, false);
    kvf_fwd_t *f = tfwd_create(tm.m, 2, 64, 4);
    struct tseq a, b;
    tseq_alloc(pool, &a, 2, 1);
    tseq_alloc(pool, &b, 2, 2);
    struct kvf_fwd_seq p[2] = {tseq_step(&a, ta, 20, NULL), tseq_step(&b, qb.toks, 20, NULL)};
    ASSERT_EQ_INT(kvf_fwd_run(f, pool, p, 2), 2);
    a.pos = b.pos = 20;
    uint32_t bi = 20;

    /* 1. A stale tag on a past page. */
    struct kvf_fwd_seq bad = tseq_step(&a, ta + 20, 1, NULL);
    struct kvf_page_ref stale[2] = {{a.pages[0].page, a.pages[0].tag + 1}, a.pages[1]};
    bad.pages = stale;
    check_refused(f, pool, bad, &b, qb.toks + bi, qb.alone + (size_t)bi * V, V);
    bi++;
    /* 2. A position past the verified fill (would read slot 20, which holds NaN). */
    bad = tseq_step(&a, ta + 20, 1, NULL);
    bad.pos = 21;
    check_refused(f, pool, bad, &b, qb.toks + bi, qb.alone + (size_t)bi * V, V);
    bi++;
    /* 3. A position below the fill: the write would overwrite verified slot 19. */
    bad.pos = 19;
    check_refused(f, pool, bad, &b, qb.toks + bi, qb.alone + (size_t)bi * V, V);
    bi++;
    /* 4. Another request's page, with its correct tag, in A's table. */
    bad = tseq_step(&a, ta + 20, 1, NULL);
    struct kvf_page_ref foreign[2] = {b.pages[0], a.pages[1]};
    bad.pages = foreign;
    check_refused(f, pool, bad, &b, qb.toks + bi, qb.alone + (size_t)bi * V, V);
    bi++;
    /* 5. A page index out of the pool. */
    bad = tseq_step(&a, ta + 20, 1, NULL);
    struct kvf_page_ref outside[2] = {{kvf_pool_n_pages(pool) + 3, 1}, a.pages[1]};
    bad.pages = outside;
    check_refused(f, pool, bad, &b, qb.toks + bi, qb.alone + (size_t)bi * V, V);
    bi++;
    /* 6. A released page (FREE now, scrubbed or not): refused, nothing read. */
    ASSERT_OK(kvf_pool_release(pool, a.pages[1], KVF_HOLDER_SEQ, 0));
    bad = tseq_step(&a, ta + 20, 1, NULL);
    check_refused(f, pool, bad, &b, qb.toks + bi, qb.alone + (size_t)bi * V, V);
    bi++;
    ASSERT_OK(kvf_pool_release(pool, a.pages[0], KVF_HOLDER_SEQ, 0));
    a.n_pages = 0;
    tseq_release(pool, &b);
    char why[128];
    ASSERT_TRUE(kvf_pool_check(pool, why, sizeof(why)));
    free(qb.alone);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    tmodel_close(&tm);
}

/* Malformed batches are refused whole, and malformed sequences alone. */
static void test_bad_batches(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "tiny", KVF_GGML_F32, 3);
    kvf_pool_t *pool = tpool_create(tm.m, 16, 4, false);
    kvf_fwd_t *f = tfwd_create(tm.m, 1, 8, 2);
    struct tseq a;
    tseq_alloc(pool, &a, 1, 1);
    int32_t toks[20] = {5, 6, 7};
    struct kvf_fwd_seq s = tseq_step(&a, toks, 9, NULL);
    ASSERT_ERR(kvf_fwd_run(f, pool, &s, 1), -EINVAL); /* more tokens than max_tokens */
    s = tseq_step(&a, toks, 17, NULL);
    struct kvf_fwd_config c = {1, 32, 2, NULL, 0};
    kvf_fwd_t *f2 = NULL;
    ASSERT_OK(kvf_fwd_create(tm.m, &c, &f2));
    ASSERT_EQ_INT(kvf_fwd_run(f2, pool, &s, 1), 0); /* needs 2 pages, table has 1 */
    ASSERT_ERR(s.status, -EINVAL);
    toks[1] = (int32_t)kvf_model_hparams(tm.m)->n_vocab; /* token out of range */
    s = tseq_step(&a, toks, 3, NULL);
    ASSERT_EQ_INT(kvf_fwd_run(f2, pool, &s, 1), 0);
    ASSERT_ERR(s.status, -EINVAL);
    struct kvf_page_info info;
    ASSERT_OK(kvf_pool_page_info(pool, a.pages[0].page, &info));
    ASSERT_EQ_INT(info.fill, 0);
    /* The same request twice in one batch: the second entry is refused, the first runs. */
    toks[1] = 9;
    struct kvf_fwd_seq two[2] = {tseq_step(&a, toks, 3, NULL), tseq_step(&a, toks, 3, NULL)};
    ASSERT_EQ_INT(kvf_fwd_run(f2, pool, two, 2), 1);
    ASSERT_EQ_INT(two[0].status, 0);
    ASSERT_ERR(two[1].status, -EINVAL);
    ASSERT_OK(kvf_pool_page_info(pool, a.pages[0].page, &info));
    ASSERT_EQ_INT(info.fill, 3);
    tseq_release(pool, &a);
    kvf_fwd_destroy(f2);
    /* A context made for a served limit of 20 positions (its attention scratch sized for them)
     * refuses a sequence that would pass it, and runs one that ends at it. */
    struct kvf_fwd_config c20 = {1, 32, 1, NULL, 20};
    kvf_fwd_t *f3 = NULL;
    ASSERT_OK(kvf_fwd_create(tm.m, &c20, &f3));
    struct tseq b;
    tseq_alloc(pool, &b, 2, 2);
    int32_t t21[21] = {0};
    for (int i = 0; i < 21; i++)
        t21[i] = 5 + i;
    s = tseq_step(&b, t21, 21, NULL);
    ASSERT_EQ_INT(kvf_fwd_run(f3, pool, &s, 1), 0);
    ASSERT_ERR(s.status, -EINVAL);
    s = tseq_step(&b, t21, 20, NULL);
    ASSERT_EQ_INT(kvf_fwd_run(f3, pool, &s, 1), 1);
    ASSERT_EQ_INT(s.status, 0);
    tseq_release(pool, &b);
    kvf_fwd_destroy(f3);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    tmodel_close(&tm);
}

/* --- Poisoned free pages. ------------------------------------------------------------------ */

/* An earlier request fills pages and releases them (the pool poisons them); a new request gets
 * those same pages and must produce exactly what it produces in a fresh pool — and no NaN: no
 * slot past the fill was read. */
static void test_poisoned_free_pages(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "tiny", KVF_GGML_Q8_0, 5);
    uint32_t V = kvf_model_hparams(tm.m)->n_vocab;
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    struct inv_seq q;
    q.n = 37; /* 3 pages of 16, the last partly filled */
    rand_tokens(&r, q.toks, q.n, V);
    q.alone = malloc((size_t)q.n * V * sizeof(float));
    run_alone(tm.m, &q);

    struct kvf_pool_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    kvf_model_geometry(tm.m, 16, &cfg.geo);
    cfg.geo.elem_bytes = tpool_kv_bytes; /* as run_alone's pools */
    cfg.n_pages = 3;
    cfg.max_peers = 1;
    cfg.tag_seed = 1;
    cfg.poison_on_free = true;
    kvf_pool_t *pool = NULL;
    int rc = kvf_pool_create(&cfg, &pool);
    bool poisoned = rc == 0;
    if (rc == -ENOTSUP) { /* not a test build: poison by hand below */
        cfg.poison_on_free = false;
        ASSERT_OK(kvf_pool_create(&cfg, &pool));
    }
    ASSERT_NOT_NULL(pool);
    kvf_fwd_t *f = tfwd_create(tm.m, 2, 64, 2);
    /* The earlier tenant: fills all 48 slots of all three pages, then leaves. */
    struct tseq prev;
    tseq_alloc(pool, &prev, 3, 77);
    int32_t pt[48];
    rand_tokens(&r, pt, 48, V);
    struct kvf_fwd_seq ps = tseq_step(&prev, pt, 48, NULL);
    ASSERT_EQ_INT(kvf_fwd_run(f, pool, &ps, 1), 1);
    tseq_release(pool, &prev);

    struct kvf_owner own = {{1, 0}, 1};
    struct tseq s;
    memset(&s, 0, sizeof(s));
    s.req = own.req;
    ASSERT_OK(kvf_pool_alloc(pool, &own, KVF_HOLDER_SEQ, 3, false, s.pages));
    s.n_pages = 3;
    size_t data = kvf_geo_data_bytes(&cfg.geo);
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t *w = kvf_pool_page_data(pool, s.pages[i].page);
        if (poisoned)
            ASSERT_EQ_U64(w[0] & 0xFFF00000u, KVF_POOL_POISON_HI);
        else
            for (size_t k = 0; k < data / 4; k++)
                w[k] = KVF_POOL_POISON_HI | 0x77;
    }
    float *logits = malloc(V * sizeof(float));
    /* Prefill 30 (crossing into page 1), then decode the rest one by one. */
    for (uint32_t at = 0; at < q.n;) {
        uint32_t len = at == 0 ? 30 : 1;
        struct kvf_fwd_seq fs = tseq_step(&s, q.toks + at, len, logits);
        ASSERT_EQ_INT(kvf_fwd_run(f, pool, &fs, 1), 1);
        s.pos += len;
        at += len;
        for (uint32_t i = 0; i < V; i++)
            ASSERT_FALSE(isnan(logits[i]));
        ASSERT_MEMEQ(logits, q.alone + (size_t)(at - 1) * V, V * sizeof(float));
    }
    /* The unfilled tail of the last page still holds the poison: it was never overwritten. */
    const uint32_t *last = kvf_pool_page_data(pool, s.pages[2].page);
    const struct kvf_pool_geometry *g = kvf_pool_geometry(pool);
    size_t slot_words = (size_t)g->n_kv_heads * g->head_dim;
    ASSERT_EQ_U64(last[(37 - 32) * slot_words] & 0xFFF00000u, KVF_POOL_POISON_HI);
    printf("# poisoned free pages (%s): output unchanged over %u positions\n",
           poisoned ? "pool poison_on_free" : "poisoned by hand", q.n - 29);
    tseq_release(pool, &s);
    free(logits);
    free(q.alone);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    tmodel_close(&tm);
}

/* The AVX2 and AVX-512 VNNI variants compute Q8_0 with the same exact integer sums, so they
 * must agree bit for bit (a machine without VNNI runs only the AVX2 half). */
static void test_variants_agree(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "tiny", KVF_GGML_Q8_0, 21);
    uint32_t V = kvf_model_hparams(tm.m)->n_vocab;
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    struct inv_seq a, b;
    a.n = b.n = 33;
    rand_tokens(&r, a.toks, a.n, V);
    memcpy(b.toks, a.toks, sizeof(a.toks));
    a.alone = malloc((size_t)a.n * V * sizeof(float));
    b.alone = malloc((size_t)b.n * V * sizeof(float));
    const struct kvf_kern *saved = kvf__kern;
    bool have_avx2 = kvf__kern_avx2 && __builtin_cpu_supports("avx2") &&
                     __builtin_cpu_supports("fma") && test_cpu_f16c();
    bool have_vnni = have_avx2 && kvf__kern_vnni && __builtin_cpu_supports("avx512vl") &&
                     __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    if (have_avx2) {
        kvf__kern = kvf__kern_avx2;
        run_alone(tm.m, &a);
        kvf__kern = have_vnni ? kvf__kern_vnni : kvf__kern_avx2;
        run_alone(tm.m, &b);
        ASSERT_MEMEQ(a.alone, b.alone, (size_t)a.n * V * sizeof(float));
    }
    kvf__kern = saved;
    printf("# Q8_0 variants compared: avx2%s\n",
           have_vnni ? " = avx2+vnni" : " only (no VNNI here)");
    free(a.alone);
    free(b.alone);
    tmodel_close(&tm);
}

/* The AVX2 and VNNI variants run the same F32 recipe through different tiles (4-row strips of
 * 256-bit accumulators against 8-row strips of paired ones), so they too must agree bit for bit:
 * every position computed alone, one token a call, by one variant must equal what the other
 * gives for it in batches of three sequences sent in chunks of up to 13 tokens — both ways. */
static void test_variants_agree_f32(void)
{
    bool have_vnni = kvf__kern_avx2 && kvf__kern_vnni && __builtin_cpu_supports("avx2") &&
                     __builtin_cpu_supports("fma") && test_cpu_f16c() &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    if (!have_vnni) {
        printf("# F32 variants not compared (no VNNI here)\n");
        return;
    }
    struct tmodel tm;
    tmodel_open(&tm, "tiny", KVF_GGML_F32, 23);
    uint32_t V = kvf_model_hparams(tm.m)->n_vocab;
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    const struct kvf_kern *saved = kvf__kern;
    const struct kvf_kern *alone[2] = {kvf__kern_vnni, kvf__kern_avx2};
    const struct kvf_kern *batched[2] = {kvf__kern_avx2, kvf__kern_vnni};
    struct inv_seq qs[3];
    for (uint32_t i = 0; i < 3; i++) {
        qs[i].n = 8 + kvf_rng_below(&r, INV_MAX_LEN - 8 + 1);
        rand_tokens(&r, qs[i].toks, qs[i].n, V);
        qs[i].alone = malloc((size_t)qs[i].n * V * sizeof(float));
    }
    for (int way = 0; way < 2; way++) {
        kvf__kern = alone[way];
        for (uint32_t i = 0; i < 3; i++)
            run_alone(tm.m, &qs[i]);
        kvf__kern = batched[way];
        run_batched(tm.m, qs, 3, 2, 16, 13, &r);
    }
    kvf__kern = saved;
    printf("# F32 variants compared: avx2 = avx2+vnni, each batched against the other alone\n");
    for (uint32_t i = 0; i < 3; i++)
        free(qs[i].alone);
    tmodel_close(&tm);
}

/* Every vector variant's activation quantizer writes exactly the scalar one's values and scale:
 * seeded rows over 40 binary orders of magnitude, rows with zeros, ±0 and an all-zero stretch,
 * all-zero rows, rows too small to scale (d = 0), and rows holding Inf or NaN (d = NaN). */
static void test_quant_matches(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    const struct kvf_kern *vars[2] = {NULL, NULL};
    if (kvf__kern_avx2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        test_cpu_f16c())
        vars[0] = kvf__kern_avx2;
    if (vars[0] && kvf__kern_vnni && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni"))
        vars[1] = kvf__kern_vnni;
    enum { N = 288 };
    float x[N], want_d, got_d, want_s[N / 32], got_s[N / 32];
    int16_t want[N], got[N];
    int n_nan = 0, n_zero = 0;
    for (int rep = 0; rep < 3000; rep++) {
        double scale = ldexp(1.0, (int)kvf_rng_below(&r, 40) - 20);
        if (rep % 50 == 1) scale = 1e-36; /* amax / 32767 below FLT_MIN */
        for (int i = 0; i < N; i++) {
            x[i] = (float)(((double)kvf_rng_below(&r, 2000001) - 1000000.0) / 1e6 * scale);
            if (kvf_rng_below(&r, 50) == 0) x[i] = 0.0f;
            if (kvf_rng_below(&r, 80) == 0) x[i] = -0.0f;
        }
        if (rep % 7 == 0) memset(x + 32, 0, 32 * sizeof(float));
        if (rep % 50 == 2) memset(x, 0, sizeof(x));
        if (rep % 50 == 3) x[kvf_rng_below(&r, N)] = NAN;
        if (rep % 50 == 4) x[kvf_rng_below(&r, N)] = -INFINITY;
        if (rep % 50 == 5) x[N - 1] = INFINITY;
        uint32_t n = rep % 3 == 0 ? 32 * (1 + kvf_rng_below(&r, N / 32)) : N;
        kvf__kern_scalar.quant_a16(x, want, &want_d, want_s, n);
        for (uint32_t b = 0; b < n / 32; b++) {
            int32_t sum = 0;
            for (uint32_t i = 0; i < 32; i++)
                sum += want[32 * b + i];
            if (want_s[b] != (float)sum)
                KVF_FAIL("row %d: block %u's sum is %g, its values add to %d", rep, b,
                         (double)want_s[b], sum);
        }
        n_nan += isnan(want_d) != 0;
        n_zero += want_d == 0.0f;
        if (rep % 50 >= 3 && rep % 50 <= 5 && n == N && !isnan(want_d))
            KVF_FAIL("row %d holds Inf or NaN but its scale is %g", rep, want_d);
        for (int v = 0; v < 2; v++) {
            if (!vars[v]) continue;
            memset(got, 0x55, sizeof(got));
            memset(got_s, 0x55, sizeof(got_s));
            vars[v]->quant_a16(x, got, &got_d, got_s, n);
            if (memcmp(got, want, n * sizeof(int16_t)) != 0 ||
                memcmp(&got_d, &want_d, sizeof(float)) != 0 ||
                memcmp(got_s, want_s, n / 32 * sizeof(float)) != 0)
                KVF_FAIL("variant %s quantizes row %d differently", vars[v]->name, rep);
        }
    }
    ASSERT_TRUE(n_nan > 0 && n_zero > 0);
    printf("# activation quantizers compared with scalar: %s%s (%d rows with d = NaN, %d with "
           "d = 0)\n",
           vars[0] ? "avx2" : "none here", vars[1] ? ", avx2+vnni" : "", n_nan, n_zero);
}

/* Countdown fault injection (SQLite-style): the Nth allocation fails, N = 1, 2, ... until
 * create succeeds. Each failure is -ENOMEM with every byte given back; the context that finally
 * comes out runs, and a step allocates nothing. */
struct countdown {
    int left; /* allocations before the failing one; -1 = never fail */
    long calls;
    long long live; /* bytes outstanding */
};
static void *cd_alloc(void *ctx, size_t bytes, size_t align)
{
    struct countdown *c = ctx;
    c->calls++;
    if (c->left == 0) return NULL;
    if (c->left > 0) c->left--;
    void *p = kvf_alloc_large(bytes, align < 64 ? 64 : align);
    if (p) c->live += (long long)bytes;
    return p;
}
static void cd_free(void *ctx, void *p, size_t bytes)
{
    struct countdown *c = ctx;
    if (!p) return;
    c->live -= (long long)bytes;
    free(p);
}

static void test_create_fails_cleanly_at_every_allocation(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "tiny", KVF_GGML_F32, 5);
    struct countdown cd = {0};
    struct kvf_alloc_ops ops = {cd_alloc, cd_free, &cd};
    struct kvf_fwd_config c = {2, 32, 2, &ops, 0};
    kvf_fwd_t *f = NULL;
    int n;
    for (n = 0; n < 32; n++) {
        cd = (struct countdown){.left = n};
        int rc = kvf_fwd_create(tm.m, &c, &f);
        if (rc == 0) break;
        ASSERT_ERR(rc, -ENOMEM);
        ASSERT_NULL(f);
        ASSERT_EQ_U64((uint64_t)cd.live, 0);
    }
    ASSERT_TRUE(n >= 2 && n < 32); /* at least the context and its arena failed in turn */
    kvf_pool_t *pool = tpool_create(tm.m, 4, 8, false);
    struct tseq a;
    tseq_alloc(pool, &a, 1, 2);
    int32_t toks[3] = {1, 5, 6};
    struct kvf_fwd_seq s = tseq_step(&a, toks, 3, NULL);
    long calls = cd.calls;
    ASSERT_EQ_INT(kvf_fwd_run(f, pool, &s, 1), 1);
    ASSERT_OK(s.status);
    ASSERT_EQ_INT(cd.calls, calls); /* the step allocated nothing */
    kvf_fwd_destroy(f);
    ASSERT_EQ_U64((uint64_t)cd.live, 0);
    kvf_pool_destroy(pool);
    tmodel_close(&tm);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_create_fails_cleanly_at_every_allocation),
    KVF_CASE(test_reference_tiny_f32),
    KVF_CASE(test_reference_tiny_q8_0),
    KVF_CASE(test_reference_s15m_f32),
    KVF_CASE(test_reference_s15m_q8_0),
    KVF_CASE(test_invariance_f32),
    KVF_CASE(test_invariance_q8_0),
    KVF_CASE(test_reference_kv_f16),
    KVF_CASE(test_invariance_kv_f16),
    KVF_CASE(test_geometry_kv_type),
    KVF_CASE(test_page_checks),
    KVF_CASE(test_bad_batches),
    KVF_CASE(test_poisoned_free_pages),
    KVF_CASE(test_variants_agree),
    KVF_CASE(test_variants_agree_f32),
    KVF_CASE(test_quant_matches),
    KVF_CASE(test_reference_ktiny_q4_k_m),
    KVF_CASE(test_reference_q4_k_m_fallbacks),
    KVF_CASE(test_reference_q5_k_m),
    KVF_CASE(test_reference_qwen2),
    KVF_CASE(test_reference_qwen3),
    KVF_CASE(test_arch_and_mix_loaded),
    KVF_CASE(test_arch_refused),
    KVF_CASE(test_invariance_qwen_kquant),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
