/* mkmodel: standard llama, qwen2 and qwen3 GGUF files with seeded random weights, for tests and
 * benchmarks.
 *
 * Every tensor draws from its own PRNG stream, seeded from (seed, tensor index), and is
 * produced row by row through the writer's callback, so memory is a few rows whatever the
 * model size and the same (shape, type, seed) always gives the same bytes.
 *
 * Scaling, so that activations stay near unit size: with RMS-normalized inputs, a weight of
 * fan-in n drawn with standard deviation 1/sqrt(n) gives outputs of about unit size. The two
 * projections that write into the residual stream (attn_output, ffn_down) are scaled down by a
 * further sqrt(2 * n_layers), so the stream grows to about unit size over the whole depth
 * instead of per layer. Embeddings and the output projection use 2/sqrt(dim), so logits have a
 * standard deviation near 2: peaked enough that greedy decoding is not a coin toss. Norm weights
 * are 1 ± 0.05, so a forward pass that ignores them gives visibly different numbers; qwen3's
 * per-head Q/K norm weights 1 ± 0.2, and qwen2's Q/K/V biases have standard deviation 0.5, so
 * that each changes the output clearly.
 *
 * --type q4_k_m follows llama.cpp's Q4_K_M (llama_tensor_get_type): Q6_K for the output
 * projection (the embedding when it is tied) and for attn_v and ffn_down of the layers
 * use_more_bits() picks, Q4_K for every other 2-D weight. A weight whose rows are not whole
 * 256-value super-blocks takes llama.cpp's fallback: Q5_0 in place of Q4_K, Q8_0 in place of
 * Q6_K, and F16 where the rows are not whole 32-value blocks either. So smol135m's rows of 576
 * give a file of mostly Q5_0, as a downloaded SmolLM2-135M Q4_K_M is. --type q5_k_m is llama.cpp's
 * Q5_K_M, the same choice with Q5_K in place of Q4_K, and Q5_1 its fallback (a SmolLM2-135M
 * Q5_K_M is mostly Q5_1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_internal.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"

/* rope-tiny's factors: Llama 3's over a context of 64, so that a short test reaches them. */
static const struct kvf_mkmodel_llama3_rope rope_tiny_llama3 = {8.0f, 1.0f, 4.0f, 64};
/* Llama 3.1's and 3.2's rope_scaling as their config.json ships it. */
static const struct kvf_mkmodel_llama3_rope llama32_rope = {32.0f, 1.0f, 4.0f, 8192};

static const struct kvf_mkmodel_shape shapes[] = {
    {"tiny", 64, 2, 4, 2, 172, 512, 2048, false, NULL, 0, 10000.0f, NULL, 0.0f},
    {"s15m", 288, 6, 6, 6, 768, 32000, 2048, true, NULL, 0, 10000.0f, NULL, 0.0f},
    {"smol135m", 576, 30, 9, 3, 1536, 49152, 8192, true, NULL, 0, 10000.0f, NULL, 0.0f},
    {"ktiny", 256, 2, 4, 2, 512, 512, 2048, false, NULL, 0, 10000.0f, NULL, 0.0f},
    /* Qwen's own base, so that the halves RoPE is tested at the base those models use. */
    {"qwen2-tiny", 256, 2, 4, 2, 512, 512, 2048, true, "qwen2", 0, 1e6f, NULL, 0.0f},
    {"qwen3-tiny", 256, 2, 4, 2, 768, 512, 2048, false, "qwen3", 128, 1e6f, NULL, 0.0f},
    {"rope-tiny", 256, 2, 4, 2, 512, 512, 2048, false, NULL, 0, 500000.0f, &rope_tiny_llama3, 2.0f},
    /* Released models' geometry (their config.json), with random weights. */
    {"llama3.2-1b", 2048, 16, 32, 8, 8192, 128256, 131072, true, NULL, 0, 500000.0f, &llama32_rope,
     0.0f},
    {"qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, 32768, true, "qwen2", 0, 1e6f, NULL, 0.0f},
    {"qwen3-0.6b", 1024, 28, 16, 8, 3072, 151936, 40960, true, "qwen3", 128, 1e6f, NULL, 0.0f},
    {"llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, false, NULL, 0, 500000.0f, NULL, 0.0f},
};

const struct kvf_mkmodel_shape *kvf_mkmodel_shape_at(size_t i)
{
    if (i < KVF_ARRAY_LEN(shapes)) return &shapes[i];
    return i == KVF_ARRAY_LEN(shapes) ? &kvf__mkmodel_hist_shape : NULL;
}

const struct kvf_mkmodel_shape *kvf_mkmodel_shape_by_name(const char *name)
{
    const struct kvf_mkmodel_shape *s;
    for (size_t i = 0; name && (s = kvf_mkmodel_shape_at(i)); i++)
        if (strcmp(s->name, name) == 0) return s;
    return NULL;
}

/* xoshiro256** seeded by splitmix64: fast, and the same on every platform. */
struct rng {
    uint64_t s[4];
};

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

/* Uniform in [-1, 1): 24 random bits, exact in float. */
static float rng_unit(struct rng *r)
{
    return (float)(int32_t)((rng_next(r) >> 40) - (1u << 23)) * (1.0f / 8388608.0f);
}

/* One tensor's generator: each value is center + amp * uniform[-1, 1). */
struct gen {
    struct rng rng;
    uint32_t type;
    uint64_t n; /* values per row */
    float center, amp;
    float *scratch; /* [n], for quantized rows */
};

static int gen_row(void *ctx, uint64_t row, void *dst, size_t row_bytes)
{
    struct gen *g = ctx;
    (void)row;
    (void)row_bytes;
    float *x = g->type == KVF_GGML_F32 ? dst : g->scratch;
    for (uint64_t i = 0; i < g->n; i++)
        x[i] = g->center + g->amp * rng_unit(&g->rng);
    switch (g->type) {
    case KVF_GGML_Q8_0:
        kvf_quantize_row_q8_0(x, dst, g->n);
        break;
    case KVF_GGML_Q4_0:
        kvf_quantize_row_q4_0(x, dst, g->n);
        break;
    case KVF_GGML_Q5_0:
        kvf_quantize_row_q5_0(x, dst, g->n);
        break;
    case KVF_GGML_Q5_1:
        kvf_quantize_row_q5_1(x, dst, g->n);
        break;
    case KVF_GGML_Q4_K:
        kvf_quantize_row_q4_k(x, dst, g->n);
        break;
    case KVF_GGML_Q5_K:
        kvf_quantize_row_q5_k(x, dst, g->n);
        break;
    case KVF_GGML_Q6_K:
        kvf_quantize_row_q6_k(x, dst, g->n);
        break;
    case KVF_GGML_F16:
        for (uint64_t i = 0; i < g->n; i++)
            ((uint16_t *)dst)[i] = kvf_f32_to_fp16(x[i]);
        break;
    default:
        break;
    }
    return 0;
}

/* A uniform distribution with standard deviation sd spans ± sd * sqrt(3). */
static float amp_for_sd(double sd)
{
    return (float)(sd * sqrt(3.0));
}

struct build {
    kvf_gguf_writer_t *w;
    struct gen *gens; /* one per tensor, owned */
    size_t n_gens, cap_gens;
    uint32_t type;
    uint64_t seed;
    int rc;
};

/* llama.cpp's choice of the layers whose attn_v and ffn_down get more bits in Q4_K_M and
 * Q5_K_M: the first and last eighth, and every third layer between. */
static bool use_more_bits(uint32_t layer, uint32_t n_layers)
{
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

/* The tensor type of a 2-D weight with rows of ne0 under the file type b->type: `more` asks
 * for Q6_K rather than the file's K-quant (Q4_K in a Q4_K_M file, Q5_K in a Q5_K_M one). Rows
 * that are not whole super-blocks take llama.cpp's fallback for the K-quant type (Q4_K: Q5_0,
 * Q5_K: Q5_1, Q6_K: Q8_0), and F16 when they are not whole 32-value blocks either. */
static uint32_t mat_type(const struct build *b, uint64_t ne0, bool more)
{
    if (b->type == KVF_GGML_Q8_0) return ne0 % KVF_QK == 0 ? KVF_GGML_Q8_0 : KVF_GGML_F32;
    if (b->type != KVF_MKMODEL_Q4_K_M && b->type != KVF_MKMODEL_Q5_K_M) return KVF_GGML_F32;
    const bool q5 = b->type == KVF_MKMODEL_Q5_K_M;
    if (ne0 % KVF_QK_K == 0) return more ? KVF_GGML_Q6_K : q5 ? KVF_GGML_Q5_K : KVF_GGML_Q4_K;
    if (ne0 % KVF_QK == 0) return more ? KVF_GGML_Q8_0 : q5 ? KVF_GGML_Q5_1 : KVF_GGML_Q5_0;
    return KVF_GGML_F16;
}

/* Adds tensor `name` of ne0 × ne1 (ne1 == 0: 1-D) of type `type` (1-D tensors, norms and
 * biases, are always F32). Errors stick in b->rc. */
static void add(struct build *b, const char *name, uint64_t ne0, uint64_t ne1, float center,
                float amp, uint32_t type)
{
    if (b->rc < 0) return;
    if (!ALWAYS(b->n_gens < b->cap_gens)) {
        b->rc = -EINVAL;
        return;
    }
    struct gen *g = &b->gens[b->n_gens];
    uint64_t x = b->seed ^ (0x5851f42d4c957f2dull * (b->n_gens + 1));
    for (int i = 0; i < 4; i++)
        g->rng.s[i] = splitmix(&x);
    g->type = ne1 ? type : KVF_GGML_F32;
    g->n = ne0;
    g->center = center;
    g->amp = amp;
    if (g->type != KVF_GGML_F32 && !(g->scratch = malloc((size_t)ne0 * sizeof(float)))) {
        b->rc = -ENOMEM;
        return;
    }
    b->n_gens++;
    uint64_t ne[2] = {ne0, ne1};
    b->rc = kvf_gguf_writer_add_tensor(b->w, name, g->type, ne1 ? 2 : 1, ne, NULL, gen_row, g);
}

static int add_vocab(kvf_gguf_writer_t *w, uint32_t n_vocab)
{
    char **toks = calloc(n_vocab, sizeof *toks);
    float *scores = calloc(n_vocab, sizeof *scores);
    int32_t *types = calloc(n_vocab, sizeof *types);
    int rc = -ENOMEM;
    if (!toks || !scores || !types) goto free_all;
    for (uint32_t i = 0; i < n_vocab; i++) {
        char buf[32];
        if (i == 0)
            snprintf(buf, sizeof buf, "<unk>"), types[i] = 2;
        else if (i == 1)
            snprintf(buf, sizeof buf, "<s>"), types[i] = 3;
        else if (i == 2)
            snprintf(buf, sizeof buf, "</s>"), types[i] = 3;
        else if (i < 3 + 256)
            snprintf(buf, sizeof buf, "<0x%02X>", i - 3), types[i] = 6;
        else
            snprintf(buf, sizeof buf, "<extra_%u>", i - 259), types[i] = 5;
        if (!(toks[i] = strdup(buf))) goto free_all;
    }
    rc = kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", 5);
    if (rc == 0)
        rc = kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks,
                                         NULL, n_vocab);
    if (rc == 0) rc = kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, n_vocab);
    if (rc == 0) rc = kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, n_vocab);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (rc == 0) rc = kvf_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
    if (rc == 0) rc = kvf_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", false);
free_all:
    if (toks)
        for (uint32_t i = 0; i < n_vocab; i++)
            free(toks[i]);
    free(toks);
    free(scores);
    free(types);
    return rc;
}

static int add_hparams(kvf_gguf_writer_t *w, const struct kvf_mkmodel_shape *s, uint32_t type)
{
    const char *arch = s->arch ? s->arch : "llama";
    uint32_t hd = s->head_dim ? s->head_dim : s->dim / s->n_heads;
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    int rc = kvf_gguf_writer_add_str(w, "general.architecture", arch, strlen(arch));
    if (rc == 0) rc = kvf_gguf_writer_add_str(w, "general.name", s->name, strlen(s->name));
    /* general.file_type: 0 is all F32, 7 mostly Q8_0, 15 Q4_K_M, 17 Q5_K_M (llama.cpp's
     * numbering). */
    uint32_t ftype = type == KVF_GGML_F32         ? 0
                     : type == KVF_MKMODEL_Q4_K_M ? 15
                     : type == KVF_MKMODEL_Q5_K_M ? 17
                                                  : 7;
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "general.file_type", ftype);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, KEY("vocab_size"), s->n_vocab);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, KEY("context_length"), s->n_ctx);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, KEY("embedding_length"), s->dim);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, KEY("block_count"), s->n_layers);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, KEY("feed_forward_length"), s->ffn_dim);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, KEY("attention.head_count"), s->n_heads);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), s->n_kv_heads);
    if (rc == 0 && s->head_dim) rc = kvf_gguf_writer_add_u32(w, KEY("attention.key_length"), hd);
    if (rc == 0 && s->head_dim) rc = kvf_gguf_writer_add_u32(w, KEY("attention.value_length"), hd);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, KEY("rope.dimension_count"), hd);
    if (rc == 0) rc = kvf_gguf_writer_add_f32(w, KEY("rope.freq_base"), s->rope_base);
    if (rc == 0 && s->rope_linear != 0.0f)
        rc = kvf_gguf_writer_add_str(w, KEY("rope.scaling.type"), "linear", 6);
    if (rc == 0 && s->rope_linear != 0.0f)
        rc = kvf_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), s->rope_linear);
    float eps = s->arch ? 1e-6f : 1e-5f;
    if (rc == 0) rc = kvf_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), eps);
#undef KEY
    return rc;
}

/* Llama 3's RoPE factors as its converters compute them from rope_scaling (r): 1 for pairs
 * whose wavelength is under original_ctx / high_freq_factor, `factor` for those over
 * original_ctx / low_freq_factor, and a smooth blend between. out: [hd / 2]. */
static void llama3_rope_factors(float *out, uint32_t hd, double base,
                                const struct kvf_mkmodel_llama3_rope *r)
{
    const double factor = r->factor, low = r->low_freq_factor, high = r->high_freq_factor;
    const double orig = r->original_ctx;
    for (uint32_t i = 0; i < hd / 2; i++) {
        double wavelen = 6.283185307179586 / pow(base, -2.0 * i / hd);
        if (wavelen < orig / high) {
            out[i] = 1.0f;
        } else if (wavelen > orig / low) {
            out[i] = (float)factor;
        } else {
            double smooth = (orig / wavelen - low) / (high - low);
            out[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
}

/* Adds rope_freqs.weight (F32 [hd / 2]) when the shape has Llama 3's factors. factors[cap] is
 * the tensor's storage, borrowed by the writer until it writes. */
static int add_rope_freqs(kvf_gguf_writer_t *w, const struct kvf_mkmodel_shape *s, uint32_t hd,
                          float *factors, size_t cap)
{
    if (!s->rope_llama3) return 0;
    if (hd / 2 > cap) return -EINVAL;
    llama3_rope_factors(factors, hd, s->rope_base, s->rope_llama3);
    const uint64_t ne[1] = {hd / 2};
    return kvf_gguf_writer_add_tensor(w, "rope_freqs.weight", KVF_GGML_F32, 1, ne, factors, NULL,
                                      NULL);
}

/* A shape mkmodel can write (and the loader will take): heads that divide, a known
 * architecture, room for the byte vocab, and RoPE parameters in their ranges. */
static bool shape_ok(const struct kvf_mkmodel_shape *s, uint32_t type)
{
    const struct kvf_mkmodel_llama3_rope *r = s->rope_llama3;
    return (type == KVF_GGML_F32 || type == KVF_GGML_Q8_0 || type == KVF_MKMODEL_Q4_K_M ||
            type == KVF_MKMODEL_Q5_K_M) &&
           s->n_heads != 0 && s->n_kv_heads != 0 && (s->head_dim || s->dim % s->n_heads == 0) &&
           s->n_heads % s->n_kv_heads == 0 &&
           (!s->arch || strcmp(s->arch, "qwen2") == 0 || strcmp(s->arch, "qwen3") == 0) &&
           s->n_vocab >= 259 && s->n_layers != 0 && s->n_layers <= 1000 && s->rope_base > 1.0f &&
           (s->rope_linear == 0.0f || s->rope_linear >= 1.0f) &&
           (!r || (r->factor >= 1.0f && r->low_freq_factor > 0.0f &&
                   r->high_freq_factor > r->low_freq_factor && r->original_ctx > 0));
}

int kvf__mkmodel_write_meta(const char *path, const struct kvf_mkmodel_shape *s, uint32_t type,
                            char *err, size_t err_len)
{
    if (err && err_len) err[0] = '\0';
    if (!path || !s || !shape_ok(s, type))
        return kvf__gguf_fail(err, err_len, -EINVAL, "invalid shape or type");
    kvf_gguf_writer_t *w;
    int rc = kvf_gguf_writer_create(0, &w);
    if (rc < 0) return kvf__gguf_fail(err, err_len, rc, "out of memory");
    float rope_factors[512];
    const uint32_t hd = s->head_dim ? s->head_dim : s->dim / s->n_heads;
    rc = add_hparams(w, s, type);
    if (rc == 0) rc = add_vocab(w, s->n_vocab);
    if (rc == 0) rc = add_rope_freqs(w, s, hd, rope_factors, KVF_ARRAY_LEN(rope_factors));
    if (rc < 0)
        kvf__gguf_fail(err, err_len, rc, "building the model description: %s", kvf_strerror(rc));
    else
        rc = kvf_gguf_writer_write(w, path, err, err_len);
    kvf_gguf_writer_destroy(w);
    return rc;
}

int kvf_mkmodel_write(const char *path, const struct kvf_mkmodel_shape *s, uint32_t type,
                      uint64_t seed, char *err, size_t err_len)
{
    if (err && err_len) err[0] = '\0';
    /* The hist model is constructed, not drawn: its own writer (seed unused). */
    if (s && s->name && strcmp(s->name, kvf__mkmodel_hist_shape.name) == 0)
        return kvf__mkmodel_hist_write(path, type, err, err_len);
    if (!path || !s || !shape_ok(s, type))
        return kvf__gguf_fail(err, err_len, -EINVAL, "invalid shape or type");
    struct build b = {.type = type, .seed = seed};
    b.cap_gens = 3 + 14 * (size_t)s->n_layers;
    b.gens = calloc(b.cap_gens, sizeof *b.gens);
    if (!b.gens) return kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
    b.rc = kvf_gguf_writer_create(0, &b.w);
    if (b.rc == 0) b.rc = add_hparams(b.w, s, type);
    if (b.rc == 0) b.rc = add_vocab(b.w, s->n_vocab);

    const uint64_t dim = s->dim, hd = s->head_dim ? s->head_dim : s->dim / s->n_heads;
    const uint64_t q_dim = hd * s->n_heads, kv_dim = hd * s->n_kv_heads, ffn = s->ffn_dim;
    const double depth = sqrt(2.0 * s->n_layers);
    const bool qwen2 = s->arch && strcmp(s->arch, "qwen2") == 0;
    const bool qwen3 = s->arch && strcmp(s->arch, "qwen3") == 0;
    const float emb_amp = amp_for_sd(2.0 / sqrt((double)dim));
    add(&b, "token_embd.weight", dim, s->n_vocab, 0.0f, emb_amp, mat_type(&b, dim, s->tied_output));
    add(&b, "output_norm.weight", dim, 0, 1.0f, 0.05f, KVF_GGML_F32);
    float rope_factors[512];
    if (b.rc == 0)
        b.rc = add_rope_freqs(b.w, s, (uint32_t)hd, rope_factors, KVF_ARRAY_LEN(rope_factors));
    if (!s->tied_output)
        add(&b, "output.weight", dim, s->n_vocab, 0.0f, emb_amp, mat_type(&b, dim, true));
    for (uint32_t l = 0; l < s->n_layers && b.rc == 0; l++) {
        char name[64];
        const bool more = use_more_bits(l, s->n_layers);
        const float in_amp = amp_for_sd(1.0 / sqrt((double)dim));
#define BLK(suffix) (snprintf(name, sizeof name, "blk.%u." suffix, l), name)
        add(&b, BLK("attn_norm.weight"), dim, 0, 1.0f, 0.05f, KVF_GGML_F32);
        add(&b, BLK("attn_q.weight"), dim, q_dim, 0.0f, in_amp, mat_type(&b, dim, false));
        add(&b, BLK("attn_k.weight"), dim, kv_dim, 0.0f, in_amp, mat_type(&b, dim, false));
        add(&b, BLK("attn_v.weight"), dim, kv_dim, 0.0f, in_amp, mat_type(&b, dim, more));
        if (qwen2) {
            add(&b, BLK("attn_q.bias"), q_dim, 0, 0.0f, amp_for_sd(0.5), KVF_GGML_F32);
            add(&b, BLK("attn_k.bias"), kv_dim, 0, 0.0f, amp_for_sd(0.5), KVF_GGML_F32);
            add(&b, BLK("attn_v.bias"), kv_dim, 0, 0.0f, amp_for_sd(0.5), KVF_GGML_F32);
        }
        if (qwen3) {
            add(&b, BLK("attn_q_norm.weight"), hd, 0, 1.0f, 0.2f, KVF_GGML_F32);
            add(&b, BLK("attn_k_norm.weight"), hd, 0, 1.0f, 0.2f, KVF_GGML_F32);
        }
        add(&b, BLK("attn_output.weight"), q_dim, dim, 0.0f,
            amp_for_sd(1.0 / sqrt((double)q_dim) / depth), mat_type(&b, q_dim, false));
        add(&b, BLK("ffn_norm.weight"), dim, 0, 1.0f, 0.05f, KVF_GGML_F32);
        add(&b, BLK("ffn_gate.weight"), dim, ffn, 0.0f, in_amp, mat_type(&b, dim, false));
        add(&b, BLK("ffn_up.weight"), dim, ffn, 0.0f, in_amp, mat_type(&b, dim, false));
        add(&b, BLK("ffn_down.weight"), ffn, dim, 0.0f, amp_for_sd(1.0 / sqrt((double)ffn) / depth),
            mat_type(&b, ffn, more));
#undef BLK
    }
    int rc = b.rc;
    if (rc < 0)
        kvf__gguf_fail(err, err_len, rc, "building the model description: %s", kvf_strerror(rc));
    else
        rc = kvf_gguf_writer_write(b.w, path, err, err_len);
    kvf_gguf_writer_destroy(b.w);
    for (size_t i = 0; i < b.n_gens; i++)
        free(b.gens[i].scratch);
    free(b.gens);
    return rc;
}
