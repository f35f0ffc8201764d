/*
 * test_rope.c — RoPE as the files scale it: Llama 3.1/3.2's per-pair factors (rope_freqs.weight)
 * and linear scaling, read from the file, applied by the forward pass as the double reference
 * applies them; scalings kvfence does not implement, and tensors it does not read, refused by
 * name at load.
 *
 * Seeds: prompts from kvf_test_seed() (printed; replay with --seed N).
 */
#include "model_test_util.h"

/* rope-tiny (mkmodel) carries base 500000, Llama 3's factors (8, low 1, high 4) over an original
 * context of 64 tokens, and linear scaling 2: what the loader reads must be the file's. */
static void test_rope_loaded(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "rope-tiny", KVF_GGML_F32, 7);
    const struct kvf_model_hparams *hp = kvf_model_hparams(tm.m);
    ASSERT_TRUE(hp->rope_freq_factors);
    ASSERT_TRUE(hp->rope_pos_scale == 0.5f);
    ASSERT_TRUE(hp->rope_base == 500000.0f);
    const struct kvf_gguf_tensor *t = kvf_gguf_find_tensor(tm.g, "rope_freqs.weight");
    ASSERT_NOT_NULL(t);
    ASSERT_EQ_U64(t->ne[0], hp->head_dim / 2);
    ASSERT_TRUE(tm.m->rope_factors == (const float *)t->data);
    /* Llama 3's shape: 1 for the fast pairs, 8 for the slow ones, a blend between. */
    const float *f = tm.m->rope_factors;
    uint32_t ones = 0, eights = 0, blends = 0;
    for (uint32_t i = 0; i < hp->head_dim / 2; i++) {
        if (i > 0) ASSERT_TRUE(f[i] >= f[i - 1]);
        if (f[i] == 1.0f)
            ones++;
        else if (f[i] == 8.0f)
            eights++;
        else if (f[i] > 1.0f && f[i] < 8.0f)
            blends++;
    }
    printf("# rope-tiny: %u pairs, factors 1 ×%u, blended ×%u, 8 ×%u\n", hp->head_dim / 2, ones,
           blends, eights);
    ASSERT_TRUE(ones > 0 && eights > 0 && blends > 0);
    tmodel_close(&tm);
    /* A file without scaling reads as scale 1, no factors. */
    tmodel_open(&tm, "ktiny", KVF_GGML_F32, 7);
    ASSERT_TRUE(!kvf_model_hparams(tm.m)->rope_freq_factors);
    ASSERT_TRUE(kvf_model_hparams(tm.m)->rope_pos_scale == 1.0f);
    ASSERT_TRUE(tm.m->rope_factors == NULL);
    tmodel_close(&tm);
}

/* Worst relative error (norm-wise) of the forward pass against the reference over n positions:
 * n_prefill tokens in one call, then one at a time. */
static double worst_vs_reference(const kvf_model_t *m, const int32_t *toks, uint32_t n_prefill,
                                 uint32_t n, const double *ref)
{
    uint32_t V = kvf_model_hparams(m)->n_vocab;
    kvf_pool_t *pool = tpool_create(m, 16, 8, false);
    kvf_fwd_t *f = tfwd_create(m, 2, 64, 4);
    struct tseq s;
    tseq_alloc(pool, &s, (n + 15) / 16, 1);
    float *logits = malloc(V * sizeof(float));
    ASSERT_NOT_NULL(logits);
    double worst = 0.0;
    for (uint32_t at = 0; at < n;) {
        uint32_t len = at == 0 ? n_prefill : 1;
        struct kvf_fwd_seq fs = tseq_step(&s, toks + at, len, logits);
        ASSERT_EQ_INT(kvf_fwd_run(f, pool, &fs, 1), 1);
        ASSERT_EQ_INT(fs.status, 0);
        s.pos += len;
        at += len;
        double em = 0.0, e = rel_err(logits, ref + (size_t)(at - 1) * V, V, &em);
        if (!(e <= worst)) worst = e;
    }
    tseq_release(pool, &s);
    free(logits);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    return worst;
}

/* The forward pass against the double reference on rope-tiny; and, so that the comparison has
 * teeth, the same pass with the scaling dropped (as a loader that ignored it would run) is far
 * off the reference. */
static void check_scaled(uint32_t type, double tol)
{
    struct tmodel tm;
    tmodel_open(&tm, "rope-tiny", type, 7);
    const uint32_t n_prefill = 24, n = 48;
    uint32_t V = kvf_model_hparams(tm.m)->n_vocab;
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    int32_t toks[64];
    rand_tokens(&r, toks, n, V);
    double *ref = malloc((size_t)n * V * sizeof(double));
    ASSERT_NOT_NULL(ref);
    ref_forward(tm.m, toks, n, ref);
    double e = worst_vs_reference(tm.m, toks, n_prefill, n, ref);
    /* Unscaled: the file's factors and linear scaling ignored. */
    const float *factors = tm.m->rope_factors;
    tm.m->rope_factors = NULL;
    double e_no_factors = worst_vs_reference(tm.m, toks, n_prefill, n, ref);
    tm.m->rope_factors = factors;
    tm.m->hp.rope_pos_scale = 1.0f;
    double e_no_linear = worst_vs_reference(tm.m, toks, n_prefill, n, ref);
    tm.m->hp.rope_pos_scale = 0.5f;
    printf("# rope-tiny %s: worst relative error %.3g (tolerance %.0e); without the factors "
           "%.3g, without the linear scaling %.3g\n",
           kvf_model_type_name(tm.m), e, tol, e_no_factors, e_no_linear);
    ASSERT_TRUE(e <= tol);
    ASSERT_TRUE(e_no_factors > 10 * tol);
    ASSERT_TRUE(e_no_linear > 10 * tol);
    free(ref);
    tmodel_close(&tm);
}

static void test_rope_reference_f32(void)
{
    check_scaled(KVF_GGML_F32, 1e-4);
}

static void test_rope_reference_q8_0(void)
{
    check_scaled(KVF_GGML_Q8_0, 1e-2);
}

/* A scaling kvfence does not implement (YaRN, LongRoPE, …) and a tensor it would not read are
 * refused by name; nothing is loaded. */
static void test_rope_refused(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "rope-tiny", KVF_GGML_F32, 3);
    kvf_model_free(tm.m);
    kvf_gguf_close(tm.g);
    tm.m = NULL;
    char err[256] = "";
    patch_file(tm.path, "linear", "yarn\0\0");
    ASSERT_OK(kvf_gguf_open(tm.path, &tm.g, err, sizeof err));
    /* The string keeps its length: "yarn" and two NULs, refused as written. */
    ASSERT_ERR(kvf_model_load(tm.g, &tm.m, err, sizeof err), KVF_E_MODEL_UNSUPPORTED);
    ASSERT_TRUE(tm.m == NULL);
    ASSERT_TRUE(strstr(err, "RoPE scaling 'yarn") != NULL);
    printf("# %s\n", err);
    kvf_gguf_close(tm.g);
    tm.g = NULL;
    tmodel_close(&tm);
    /* A bias that no llama block reads, in place of the factor table. */
    tmodel_open(&tm, "rope-tiny", KVF_GGML_F32, 3);
    kvf_model_free(tm.m);
    kvf_gguf_close(tm.g);
    tm.m = NULL;
    patch_file(tm.path, "rope_freqs.weight", "blk.0.attn_v.bias");
    ASSERT_OK(kvf_gguf_open(tm.path, &tm.g, err, sizeof err));
    ASSERT_ERR(kvf_model_load(tm.g, &tm.m, err, sizeof err), KVF_E_MODEL_UNSUPPORTED);
    ASSERT_TRUE(tm.m == NULL);
    ASSERT_TRUE(strstr(err, "blk.0.attn_v.bias") != NULL);
    printf("# %s\n", err);
    kvf_gguf_close(tm.g);
    tm.g = NULL;
    tmodel_close(&tm);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_rope_loaded),
    KVF_CASE(test_rope_reference_f32),
    KVF_CASE(test_rope_reference_q8_0),
    KVF_CASE(test_rope_refused),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
