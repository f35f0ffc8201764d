/*
 * model.c — loading a llama, qwen2 or qwen3 model from GGUF: hyper-parameters and weight
 * views.
 *
 * Each weight is a view into the mapped file, checked against the shape the hyper-parameters
 * imply before it is accepted, so the forward pass never needs to check a size again. F32 and
 * Q8_0 matrices are also copied once into the kernels' 16-row groups (kernels.h), all into one
 * allocation; the token embedding is read from the file, row by row, as it is looked up.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kernels.h"
#include "model_internal.h"

static int fail(char *err, size_t err_len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t err_len, int rc, const char *fmt, ...)
{
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Finds tensor `name` and checks it is a rows × cols matrix (ne = [cols, rows]) of a type the
 * kernels read. cols == 0 or rows == 0 in the request means "a vector of the other length". */
static int get_weight(const kvf_gguf_t *g, const char *name, uint32_t rows, uint32_t cols,
                      bool optional, struct kvf_weight *w, char *err, size_t err_len)
{
    const struct kvf_gguf_tensor *t = kvf_gguf_find_tensor(g, name);
    if (!t) {
        if (optional) {
            memset(w, 0, sizeof(*w));
            return 0;
        }
        return fail(err, err_len, KVF_E_MODEL_MISSING, "tensor %s is missing", name);
    }
    uint64_t t_rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (t->ne[0] != cols || t_rows != rows)
        return fail(err, err_len, KVF_E_MODEL_SHAPE, "tensor %s is [%llu, %llu], expected [%u, %u]",
                    name, (unsigned long long)t->ne[0], (unsigned long long)t_rows, cols, rows);
    uint64_t row_bytes = 0;
    if (!kvf_ggml_type_supported(t->type) || kvf_quant_row_bytes(t->type, cols, &row_bytes) < 0)
        return fail(err, err_len, KVF_E_MODEL_UNSUPPORTED, "tensor %s has type %s", name,
                    kvf_ggml_type_name(t->type));
    if (row_bytes * rows != t->n_bytes)
        return fail(err, err_len, KVF_E_MODEL_SHAPE, "tensor %s holds %llu bytes, expected %llu",
                    name, (unsigned long long)t->n_bytes, (unsigned long long)(row_bytes * rows));
    w->data = t->data;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = (size_t)row_bytes;
    return 0;
}

/* A norm weight or a bias: an F32 vector of n. */
static int get_norm(const kvf_gguf_t *g, const char *name, uint32_t n, const float **out, char *err,
                    size_t err_len)
{
    struct kvf_weight w = {0};
    int rc = get_weight(g, name, 1, n, false, &w, err, err_len);
    if (rc < 0) return rc;
    if (w.type != KVF_GGML_F32)
        return fail(err, err_len, KVF_E_MODEL_UNSUPPORTED, "norm %s must be F32, is %s", name,
                    kvf_ggml_type_name(w.type));
    *out = w.data;
    return 0;
}

static int get_u32(const kvf_gguf_t *g, const char *key, uint32_t *out, char *err, size_t err_len)
{
    int rc = kvf_gguf_get_u32(g, key, out);
    if (rc < 0) return fail(err, err_len, rc, "key %s: %s", key, kvf_strerror(rc));
    return 0;
}

/* The architectures read, and what each adds to the llama block. */
static const struct {
    const char *name;
    uint32_t arch;
    bool rope_halves, qkv_bias, qk_norm;
} archs[] = {
    {"llama", KVF_ARCH_LLAMA, false, false, false},
    {"qwen2", KVF_ARCH_QWEN2, true, true, false},
    {"qwen3", KVF_ARCH_QWEN3, true, false, true},
};

static int read_hparams(const kvf_gguf_t *g, struct kvf_model_hparams *hp, char *err,
                        size_t err_len)
{
    const char *arch = NULL;
    size_t arch_len = 0;
    int rc = kvf_gguf_get_str(g, "general.architecture", &arch, &arch_len);
    if (rc < 0) return fail(err, err_len, KVF_E_MODEL_MISSING, "general.architecture is missing");
    size_t a = 0;
    while (a < KVF_ARRAY_LEN(archs) &&
           (strlen(archs[a].name) != arch_len || memcmp(arch, archs[a].name, arch_len) != 0))
        a++;
    if (a == KVF_ARRAY_LEN(archs))
        return fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                    "architecture '%.*s' is not supported (llama, qwen2, qwen3 are)",
                    (int)(arch_len > 64 ? 64 : arch_len), arch);
    memset(hp, 0, sizeof(*hp));
    hp->arch = archs[a].arch;
    hp->rope_halves = archs[a].rope_halves;
    hp->qkv_bias = archs[a].qkv_bias;
    hp->qk_norm = archs[a].qk_norm;
    const char *pre = archs[a].name;
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, pre), key)
    if ((rc = get_u32(g, KEY("embedding_length"), &hp->dim, err, err_len)) < 0 ||
        (rc = get_u32(g, KEY("block_count"), &hp->n_layers, err, err_len)) < 0 ||
        (rc = get_u32(g, KEY("attention.head_count"), &hp->n_heads, err, err_len)) < 0 ||
        (rc = get_u32(g, KEY("feed_forward_length"), &hp->ffn_dim, err, err_len)) < 0)
        return rc;
    if (kvf_gguf_get_u32(g, KEY("attention.head_count_kv"), &hp->n_kv_heads) < 0)
        hp->n_kv_heads = hp->n_heads;
    if (kvf_gguf_get_u32(g, KEY("context_length"), &hp->n_ctx) < 0) hp->n_ctx = 2048;
    if (kvf_gguf_get_f32(g, KEY("attention.layer_norm_rms_epsilon"), &hp->rms_eps) < 0)
        hp->rms_eps = 1e-5f;
    if (kvf_gguf_get_f32(g, KEY("rope.freq_base"), &hp->rope_base) < 0) hp->rope_base = 10000.0f;
    /* The head width: key_length where the file gives it (qwen3's heads are wider than
     * dim / n_heads), else dim / n_heads. K and V of different widths are not supported. */
    uint32_t k_len = 0, v_len = 0;
    bool has_k = kvf_gguf_get_u32(g, KEY("attention.key_length"), &k_len) == 0;
    bool has_v = kvf_gguf_get_u32(g, KEY("attention.value_length"), &v_len) == 0;
    if (has_k && has_v && k_len != v_len)
        return fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                    "key_length %u differs from value_length %u", k_len, v_len);
    /* RoPE over part of a head only (rope.dimension_count below head_dim) is not supported. */
    uint32_t rope_dims = 0;
    bool has_rope_dims = kvf_gguf_get_u32(g, KEY("rope.dimension_count"), &rope_dims) == 0;
    /* RoPE scaling: none, or linear (positions divided by the factor); YaRN, LongRoPE and the
     * rest change the angles and the attention's scale in ways not implemented: refused by name
     * rather than run wrong. The older key rope.scale_linear is the linear factor. */
    hp->rope_pos_scale = 1.0f;
    const char *scaling = NULL;
    size_t scaling_len = 0;
    float factor = 0.0f;
    if (kvf_gguf_get_str(g, KEY("rope.scaling.type"), &scaling, &scaling_len) == 0 &&
        !(scaling_len == 4 && memcmp(scaling, "none", 4) == 0)) {
        if (!(scaling_len == 6 && memcmp(scaling, "linear", 6) == 0))
            return fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                        "RoPE scaling '%.*s' is not supported (none and linear are)",
                        (int)(scaling_len > 32 ? 32 : scaling_len), scaling);
        if (kvf_gguf_get_f32(g, KEY("rope.scaling.factor"), &factor) < 0)
            return fail(err, err_len, KVF_E_MODEL_MISSING,
                        "linear RoPE scaling without rope.scaling.factor");
    } else if (kvf_gguf_get_f32(g, KEY("rope.scale_linear"), &factor) < 0) {
        factor = 1.0f;
    }
    if (!(factor >= 1.0f && factor <= 1024.0f))
        return fail(err, err_len, KVF_E_MODEL_SHAPE, "RoPE scaling factor %g is outside [1, 1024]",
                    (double)factor);
    hp->rope_pos_scale = 1.0f / factor;
#undef KEY
    const struct kvf_gguf_tensor *emb = kvf_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return fail(err, err_len, KVF_E_MODEL_MISSING, "tensor token_embd.weight is missing");
    if (emb->ne[1] == 0 || emb->ne[1] > (1u << 24))
        return fail(err, err_len, KVF_E_MODEL_SHAPE, "token_embd.weight has %llu rows",
                    (unsigned long long)emb->ne[1]);
    hp->n_vocab = (uint32_t)emb->ne[1];
    /* Bounds that keep every size product below 2^31 elements and every head well formed. */
    if (hp->dim == 0 || hp->dim > 65536 || hp->n_layers == 0 || hp->n_layers > 1024 ||
        hp->n_heads == 0 || hp->n_heads > 1024 || (!has_k && hp->dim % hp->n_heads != 0) ||
        hp->n_kv_heads == 0 || hp->n_heads % hp->n_kv_heads != 0 || hp->ffn_dim == 0 ||
        hp->ffn_dim > 262144 || hp->n_ctx == 0)
        return fail(err, err_len, KVF_E_MODEL_SHAPE,
                    "bad hyper-parameters: dim %u layers %u heads %u kv_heads %u ffn %u", hp->dim,
                    hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim);
    hp->head_dim = has_k ? k_len : hp->dim / hp->n_heads;
    if (hp->head_dim == 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024 ||
        (uint64_t)hp->head_dim * hp->n_heads > 65536)
        return fail(err, err_len, KVF_E_MODEL_SHAPE,
                    "head_dim %u must be even and ≤ 1024, and n_heads × head_dim ≤ 65536",
                    hp->head_dim);
    if (has_rope_dims && rope_dims != hp->head_dim)
        return fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                    "rope.dimension_count %u is not head_dim %u (partial RoPE)", rope_dims,
                    hp->head_dim);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_base > 1.0f))
        return fail(err, err_len, KVF_E_MODEL_SHAPE, "bad rms epsilon or rope base");
    return 0;
}

/* The weights the matmuls read, n_layers × 7 + the output projection; *n is set to the count. */
static struct kvf_weight **matmul_weights(kvf_model_t *m, size_t *n)
{
    size_t k = 0, cap = (size_t)m->hp.n_layers * 7 + 1;
    struct kvf_weight **ws = malloc(cap * sizeof(*ws));
    if (!ws) return NULL;
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        struct kvf_layer *L = &m->layers[l];
        ws[k++] = &L->wq, ws[k++] = &L->wk, ws[k++] = &L->wv, ws[k++] = &L->wo;
        ws[k++] = &L->w_gate, ws[k++] = &L->w_up, ws[k++] = &L->w_down;
    }
    ws[k++] = &m->output;
    *n = k;
    return ws;
}

/* Gives every F32, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K matmul weight its packed copy
 * (kernels.h), all in one allocation (on huge pages where the kernel gives them: decode streams
 * all of it every step). The file's own bytes stay mapped for the token embedding, looked up row by
 * row. */
static int pack_weights(kvf_model_t *m)
{
    size_t n, bytes = 0;
    struct kvf_weight **ws = matmul_weights(m, &n);
    if (!ws) return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        bytes += kvf__packed_bytes(ws[i]->type, ws[i]->rows, ws[i]->cols);
        bytes = (bytes + 63) / 64 * 64;
    }
    if (bytes > 0) {
        uint8_t *at = m->packed_mem = kvf_alloc_large(bytes, 64);
        if (!at) {
            free(ws);
            return -ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            struct kvf_weight *w = ws[i];
            size_t used = kvf__packed_bytes(w->type, w->rows, w->cols);
            switch (w->type) {
            case KVF_GGML_Q8_0:
                kvf__q8g_pack(w->data, w->rows, w->cols / KVF_QK, (struct kvf_q8g *)at);
                break;
            case KVF_GGML_Q5_1:
                kvf__q5_1_q8mg_pack(w->data, w->rows, w->cols / KVF_QK, (struct kvf_q8mg *)at);
                break;
            case KVF_GGML_Q4_0:
            case KVF_GGML_Q4_1:
            case KVF_GGML_Q4_K:
                kvf__q4g_pack(w->type, w->data, w->row_bytes, w->rows, w->cols,
                              (struct kvf_q4g *)at);
                break;
            case KVF_GGML_Q5_0:
                kvf__q5_0_q8g_pack(w->data, w->rows, w->cols / KVF_QK, (struct kvf_q8g *)at);
                break;
            case KVF_GGML_Q5_K:
                kvf__q5g_pack(w->type, w->data, w->row_bytes, w->rows, w->cols,
                              (struct kvf_q5g *)at);
                break;
            case KVF_GGML_Q6_K:
                kvf__q6g_pack(w->data, w->row_bytes, w->rows, w->cols, (struct kvf_q6g *)at);
                break;
            case KVF_GGML_F32:
                kvf__f32g_pack(w->data, w->row_bytes / sizeof(float), w->rows, w->cols,
                               (float *)at);
                break;
            default:
                continue;
            }
            w->packed = at;
            at += (used + 63) / 64 * 64;
        }
    }
    free(ws);
    return 0;
}

/* Whether the forward pass reads the tensor `name` for a model of hp: a file carrying anything
 * else (a bias, a norm or a RoPE table of another variant) would otherwise run without it, wrong
 * and without a word, so it is refused by name at load. */
static bool tensor_read(const struct kvf_model_hparams *hp, const char *name)
{
    static const char *const top[] = {"token_embd.weight", "output_norm.weight", "output.weight",
                                      "rope_freqs.weight"};
    for (size_t i = 0; i < KVF_ARRAY_LEN(top); i++)
        if (strcmp(name, top[i]) == 0) return true;
    static const struct {
        const char *suffix;
        int needs; /* 0: always; 1: Q/K/V biases (qwen2); 2: Q/K head norms (qwen3) */
    } blk[] = {
        {"attn_norm.weight", 0},   {"attn_q.weight", 0},      {"attn_k.weight", 0},
        {"attn_v.weight", 0},      {"attn_output.weight", 0}, {"ffn_norm.weight", 0},
        {"ffn_gate.weight", 0},    {"ffn_up.weight", 0},      {"ffn_down.weight", 0},
        {"attn_q.bias", 1},        {"attn_k.bias", 1},        {"attn_v.bias", 1},
        {"attn_q_norm.weight", 2}, {"attn_k_norm.weight", 2},
    };
    if (strncmp(name, "blk.", 4) != 0 || name[4] < '0' || name[4] > '9') return false;
    char *end = NULL;
    unsigned long l = strtoul(name + 4, &end, 10);
    if (l >= hp->n_layers || *end != '.') return false;
    for (size_t i = 0; i < KVF_ARRAY_LEN(blk); i++)
        if (strcmp(end + 1, blk[i].suffix) == 0)
            return blk[i].needs == 0 || (blk[i].needs == 1 && hp->qkv_bias) ||
                   (blk[i].needs == 2 && hp->qk_norm);
    return false;
}

int kvf_model_load(const kvf_gguf_t *g, kvf_model_t **out, char *err, size_t err_len)
{
    if (!g || !out) return -EINVAL;
    struct kvf_model_hparams hp;
    int rc = read_hparams(g, &hp, err, err_len);
    if (rc < 0) return rc;
    for (uint64_t i = 0; i < kvf_gguf_n_tensors(g); i++) {
        const char *name = kvf_gguf_tensor_at(g, i)->name;
        if (!tensor_read(&hp, name))
            return fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                        "tensor %.64s is not one kvfence reads for this architecture and depth",
                        name);
    }
    kvf_model_t *m = calloc(1, sizeof(*m));
    struct kvf_layer *layers = calloc(hp.n_layers, sizeof(*layers));
    if (!m || !layers) {
        rc = fail(err, err_len, -ENOMEM, "out of memory");
        goto free_m;
    }
    m->hp = hp;
    m->layers = layers;
    uint32_t q_dim = hp.n_heads * hp.head_dim, kv_dim = hp.n_kv_heads * hp.head_dim;
    if ((rc = get_weight(g, "token_embd.weight", hp.n_vocab, hp.dim, false, &m->tok_embd, err,
                         err_len)) < 0 ||
        (rc = get_norm(g, "output_norm.weight", hp.dim, &m->out_norm, err, err_len)) < 0 ||
        (rc = get_weight(g, "output.weight", hp.n_vocab, hp.dim, true, &m->output, err, err_len)) <
            0)
        goto free_m;
    if (!m->output.data) m->output = m->tok_embd; /* tied output projection */
    /* Llama 3.1 and 3.2 files carry their long-context RoPE as per-pair factors, computed at
     * conversion from the model's rope_scaling; each pair's angle is divided by its factor. */
    const struct kvf_gguf_tensor *rf = kvf_gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) {
        if (rf->type != KVF_GGML_F32 || rf->ne[0] != hp.head_dim / 2 ||
            rf->ne[1] * rf->ne[2] * rf->ne[3] != 1 ||
            rf->n_bytes != hp.head_dim / 2 * sizeof(float)) {
            rc = fail(err, err_len, KVF_E_MODEL_SHAPE,
                      "rope_freqs.weight must be F32 [%u] (head_dim / 2), is %s [%llu, %llu]",
                      hp.head_dim / 2, kvf_ggml_type_name(rf->type), (unsigned long long)rf->ne[0],
                      (unsigned long long)(rf->ne[1] * rf->ne[2] * rf->ne[3]));
            goto free_m;
        }
        const float *f = rf->data;
        for (uint32_t i = 0; i < hp.head_dim / 2; i++)
            if (!(f[i] > 0.0f && f[i] < 1e6f)) {
                rc = fail(err, err_len, KVF_E_MODEL_SHAPE, "rope_freqs.weight[%u] is %g", i,
                          (double)f[i]);
                goto free_m;
            }
        m->rope_factors = f;
        m->hp.rope_freq_factors = true;
    }
    for (uint32_t l = 0; l < hp.n_layers; l++) {
        struct kvf_layer *L = &layers[l];
        char name[64];
#define W(field, tname, rows, cols)                                                                \
    snprintf(name, sizeof(name), "blk.%u." tname ".weight", l);                                    \
    if ((rc = get_weight(g, name, rows, cols, false, &L->field, err, err_len)) < 0) goto free_m
#define N(field, tname, n)                                                                         \
    snprintf(name, sizeof(name), "blk.%u." tname, l);                                              \
    if ((rc = get_norm(g, name, n, &L->field, err, err_len)) < 0) goto free_m
        N(attn_norm, "attn_norm.weight", hp.dim);
        W(wq, "attn_q", q_dim, hp.dim);
        W(wk, "attn_k", kv_dim, hp.dim);
        W(wv, "attn_v", kv_dim, hp.dim);
        if (hp.qkv_bias) {
            N(bq, "attn_q.bias", q_dim);
            N(bk, "attn_k.bias", kv_dim);
            N(bv, "attn_v.bias", kv_dim);
        }
        if (hp.qk_norm) {
            N(q_norm, "attn_q_norm.weight", hp.head_dim);
            N(k_norm, "attn_k_norm.weight", hp.head_dim);
        }
        W(wo, "attn_output", hp.dim, q_dim);
        N(ffn_norm, "ffn_norm.weight", hp.dim);
        W(w_gate, "ffn_gate", hp.ffn_dim, hp.dim);
        W(w_up, "ffn_up", hp.ffn_dim, hp.dim);
        W(w_down, "ffn_down", hp.dim, hp.ffn_dim);
#undef W
#undef N
    }
    if ((rc = pack_weights(m)) < 0) {
        fail(err, err_len, rc, "out of memory for the packed weights");
        goto free_m;
    }
    kvf__kernels_init();
    *out = m;
    return 0;

free_m:
    free(layers);
    free(m);
    return rc;
}

void kvf_model_free(kvf_model_t *m)
{
    if (!m) return;
    free(m->packed_mem);
    free(m->layers);
    free(m);
}

const struct kvf_model_hparams *kvf_model_hparams(const kvf_model_t *m)
{
    return &m->hp;
}

static bool is_quantized(uint32_t t)
{
    return t != KVF_GGML_F32 && t != KVF_GGML_F16 && t != KVF_GGML_BF16;
}

/* Whether any matrix of the model is quantized (Q8_0, Q4_0, a K-quant). O(layers). */
static bool has_quantized(const kvf_model_t *m)
{
    if (is_quantized(m->output.type)) return true;
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        const struct kvf_layer *L = &m->layers[l];
        const struct kvf_weight *w[7] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
                                         &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            if (is_quantized(w[i]->type)) return true;
    }
    return false;
}

void kvf_model_geometry(const kvf_model_t *m, uint32_t page_tokens, struct kvf_pool_geometry *geo)
{
    geo->n_layers = m->hp.n_layers;
    geo->n_kv_heads = m->hp.n_kv_heads;
    geo->head_dim = m->hp.head_dim;
    geo->page_tokens = page_tokens;
    /* K/V as IEEE halves for a quantized model, as floats otherwise (docs/MODEL_ENGINE.md). */
    geo->elem_bytes = has_quantized(m) ? 2 : 4;
}

/* What a product reads of w: its packed copy where it has one (Q4_K packs 4.5 bits a weight
 * into 6, Q5_0 5.5 into 8.5, Q5_1 6 into 9), else the file's rows. */
static uint64_t wbytes(const struct kvf_weight *w)
{
    if (w->packed) return kvf__packed_bytes(w->type, w->rows, w->cols);
    return (uint64_t)w->rows * w->row_bytes;
}

uint64_t kvf_model_weight_bytes(const kvf_model_t *m)
{
    uint64_t b = 0;
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        const struct kvf_layer *L = &m->layers[l];
        b += wbytes(&L->wq) + wbytes(&L->wk) + wbytes(&L->wv) + wbytes(&L->wo) +
             wbytes(&L->w_gate) + wbytes(&L->w_up) + wbytes(&L->w_down) +
             2ull * m->hp.dim * sizeof(float);
    }
    return b + wbytes(&m->output) + m->tok_embd.row_bytes + m->hp.dim * sizeof(float);
}

const char *kvf_model_type_name(const kvf_model_t *m)
{
    return kvf_ggml_type_name(m->hp.n_layers ? m->layers[0].w_gate.type : m->output.type);
}
