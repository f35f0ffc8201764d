/* GGUF reader and writer: round trips of every key type and tensor type, mkmodel files read
 * back and rewritten byte for byte, truncation at every byte offset, and hostile headers. */
#include "gguf_test_util.h"
#include "kvf_test.h"
#include "gguf/gguf_internal.h"

#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/text.h"

/* ---- a small file with every key type and every tensor type ---- */

static const char *const strs[] = {"alpha", "", "g\xc3\xa4mma", "delta with spaces"};
static const float farr[] = {1.5f, -2.25f, 0.0f, 3e-7f};
static const int32_t iarr[] = {-7, 0, 2147483647, -2147483647 - 1};

/* Fills a tensor of n values of `type` from a deterministic pattern; returns its bytes. */
static void *pattern(uint32_t type, uint64_t n, uint64_t *bytes)
{
    ASSERT_OK(kvf_quant_row_bytes(type, n, bytes));
    float *f = malloc(n * sizeof *f);
    uint8_t *out = malloc(*bytes);
    ASSERT_TRUE(f && out);
    for (uint64_t i = 0; i < n; i++)
        f[i] = (float)((int)(i * 37 % 101) - 50) / 16.0f;
    switch (type) {
    case KVF_GGML_F32:
        memcpy(out, f, *bytes);
        break;
    case KVF_GGML_F16:
        for (uint64_t i = 0; i < n; i++)
            ((uint16_t *)out)[i] = kvf_f32_to_fp16(f[i]);
        break;
    case KVF_GGML_BF16:
        for (uint64_t i = 0; i < n; i++)
            ((uint16_t *)out)[i] = kvf_f32_to_bf16(f[i]);
        break;
    case KVF_GGML_Q8_0:
        kvf_quantize_row_q8_0(f, (void *)out, n);
        break;
    case KVF_GGML_Q4_0:
        kvf_quantize_row_q4_0(f, (void *)out, n);
        break;
    default:
        KVF_FAIL("type %u", type);
    }
    free(f);
    return out;
}

struct tspec {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
};
static const struct tspec tspecs[] = {
    {"t.f32", KVF_GGML_F32, 2, {5, 3, 1, 1}},    {"t.f16", KVF_GGML_F16, 1, {7, 1, 1, 1}},
    {"t.bf16", KVF_GGML_BF16, 3, {2, 3, 4, 1}},  {"t.q8_0", KVF_GGML_Q8_0, 2, {64, 2, 1, 1}},
    {"t.q4_0", KVF_GGML_Q4_0, 4, {32, 1, 2, 1}},
};

/* Writes the all-types file to path with the given alignment. */
static void write_all_types(const char *path, uint32_t alignment)
{
    kvf_gguf_writer_t *w;
    ASSERT_OK(kvf_gguf_writer_create(alignment, &w));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "k.u32", 4000000000u));
    ASSERT_OK(kvf_gguf_writer_add_i32(w, "k.i32", -5));
    ASSERT_OK(kvf_gguf_writer_add_u64(w, "k.u64", 1ull << 40));
    ASSERT_OK(kvf_gguf_writer_add_f32(w, "k.f32", 0.125f));
    ASSERT_OK(kvf_gguf_writer_add_bool(w, "k.bool", true));
    ASSERT_OK(kvf_gguf_writer_add_str(w, "k.str", "hello\0world", 11));
    ASSERT_OK(kvf_gguf_writer_add_arr_str(w, "k.astr", strs, NULL, 4));
    ASSERT_OK(kvf_gguf_writer_add_arr_f32(w, "k.af32", farr, 4));
    ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, "k.ai32", iarr, 4));
    ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, "k.empty", NULL, 0));
    ASSERT_ERR(kvf_gguf_writer_add_u32(w, "k.u32", 1), -EEXIST);
    void *bufs[KVF_ARRAY_LEN(tspecs)];
    for (size_t i = 0; i < KVF_ARRAY_LEN(tspecs); i++) {
        const struct tspec *s = &tspecs[i];
        uint64_t bytes;
        bufs[i] = pattern(s->type, s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3], &bytes);
        ASSERT_OK(
            kvf_gguf_writer_add_tensor(w, s->name, s->type, s->n_dims, s->ne, bufs[i], NULL, NULL));
    }
    ASSERT_ERR(
        kvf_gguf_writer_add_tensor(w, "t.f32", KVF_GGML_F32, 1, tspecs[0].ne, bufs[0], NULL, NULL),
        -EEXIST);
    uint64_t bad_ne[1] = {33};
    ASSERT_ERR(
        kvf_gguf_writer_add_tensor(w, "t.bad", KVF_GGML_Q8_0, 1, bad_ne, bufs[0], NULL, NULL),
        -EINVAL);
    ASSERT_ERR(kvf_gguf_writer_add_tensor(w, "t.bad", 11, 1, bad_ne, bufs[0], NULL, NULL),
               KVF_E_MODEL_UNSUPPORTED);
    char err[256];
    ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
    kvf_gguf_writer_destroy(w);
    for (size_t i = 0; i < KVF_ARRAY_LEN(tspecs); i++)
        free(bufs[i]);
}

static void check_all_types(const kvf_gguf_t *g, uint32_t alignment)
{
    uint32_t u32;
    uint64_t u64;
    int32_t i32;
    float f;
    bool b;
    const char *s;
    size_t n;
    uint32_t et;
    uint64_t len;
    ASSERT_EQ_INT(kvf_gguf_version(g), 3);
    ASSERT_OK(kvf_gguf_get_u32(g, "k.u32", &u32));
    ASSERT_EQ_U64(u32, 4000000000u);
    ASSERT_ERR(kvf_gguf_get_i32(g, "k.u32", &i32), KVF_E_MODEL_FORMAT); /* out of int32 range */
    ASSERT_OK(kvf_gguf_get_i32(g, "k.i32", &i32));
    ASSERT_EQ_INT(i32, -5);
    u32 = 77;
    ASSERT_ERR(kvf_gguf_get_u32(g, "k.i32", &u32), KVF_E_MODEL_FORMAT); /* negative */
    ASSERT_EQ_INT(u32, 77);                                             /* untouched */
    ASSERT_OK(kvf_gguf_get_u64(g, "k.u64", &u64));
    ASSERT_EQ_U64(u64, 1ull << 40);
    ASSERT_ERR(kvf_gguf_get_u32(g, "k.u64", &u32), KVF_E_MODEL_FORMAT);
    ASSERT_OK(kvf_gguf_get_f32(g, "k.f32", &f));
    ASSERT_TRUE(f == 0.125f);
    ASSERT_ERR(kvf_gguf_get_f32(g, "k.u32", &f), KVF_E_MODEL_FORMAT);
    ASSERT_OK(kvf_gguf_get_bool(g, "k.bool", &b));
    ASSERT_TRUE(b);
    ASSERT_OK(kvf_gguf_get_str(g, "k.str", &s, &n));
    ASSERT_EQ_INT(n, 11);
    ASSERT_MEMEQ(s, "hello\0world", 11);
    ASSERT_ERR(kvf_gguf_get_str(g, "k.u32", &s, &n), KVF_E_MODEL_FORMAT);
    ASSERT_ERR(kvf_gguf_get_str(g, "nope", &s, &n), KVF_E_MODEL_MISSING);
    ASSERT_ERR(kvf_gguf_get_u32(g, "nope", &u32), KVF_E_MODEL_MISSING);
    ASSERT_OK(kvf_gguf_get_arr(g, "k.astr", &et, &len));
    ASSERT_EQ_INT(et, KVF_GGUF_STRING);
    ASSERT_EQ_INT(len, 4);
    for (uint64_t i = 0; i < 4; i++) {
        ASSERT_OK(kvf_gguf_get_arr_str(g, "k.astr", i, &s, &n));
        ASSERT_EQ_INT(n, strlen(strs[i]));
        ASSERT_MEMEQ(s, strs[i], n);
    }
    ASSERT_ERR(kvf_gguf_get_arr_str(g, "k.astr", 4, &s, &n), -ERANGE);
    ASSERT_ERR(kvf_gguf_get_arr_f32(g, "k.astr", 0, &f), KVF_E_MODEL_FORMAT);
    for (uint64_t i = 0; i < 4; i++) {
        ASSERT_OK(kvf_gguf_get_arr_f32(g, "k.af32", i, &f));
        ASSERT_TRUE(f == farr[i]);
        ASSERT_OK(kvf_gguf_get_arr_i32(g, "k.ai32", i, &i32));
        ASSERT_EQ_INT(i32, iarr[i]);
    }
    ASSERT_ERR(kvf_gguf_get_arr_i32(g, "k.af32", 0, &i32), KVF_E_MODEL_FORMAT);
    ASSERT_ERR(kvf_gguf_get_arr_str(g, "k.ai32", 0, &s, &n), KVF_E_MODEL_FORMAT);
    ASSERT_ERR(kvf_gguf_get_arr(g, "k.u32", &et, &len), KVF_E_MODEL_FORMAT);
    ASSERT_OK(kvf_gguf_get_arr(g, "k.empty", &et, &len));
    ASSERT_EQ_INT(len, 0);
    ASSERT_ERR(kvf_gguf_get_arr_i32(g, "k.empty", 0, &i32), -ERANGE);

    ASSERT_EQ_INT(kvf_gguf_n_tensors(g), KVF_ARRAY_LEN(tspecs));
    ASSERT_NULL(kvf_gguf_find_tensor(g, "t.none"));
    ASSERT_NULL(kvf_gguf_tensor_at(g, KVF_ARRAY_LEN(tspecs)));
    const uint8_t *prev_end = NULL;
    for (size_t i = 0; i < KVF_ARRAY_LEN(tspecs); i++) {
        const struct tspec *sp = &tspecs[i];
        const struct kvf_gguf_tensor *t = kvf_gguf_find_tensor(g, sp->name);
        ASSERT_NOT_NULL(t);
        ASSERT_EQ_PTR(t, kvf_gguf_tensor_at(g, i));
        ASSERT_STREQ(t->name, sp->name);
        ASSERT_EQ_INT(t->type, sp->type);
        ASSERT_EQ_INT(t->n_dims, sp->n_dims);
        for (int d = 0; d < 4; d++)
            ASSERT_EQ_U64(t->ne[d], sp->ne[d]);
        uint64_t bytes;
        void *want = pattern(sp->type, sp->ne[0] * sp->ne[1] * sp->ne[2] * sp->ne[3], &bytes);
        ASSERT_EQ_U64(t->n_bytes, bytes);
        ASSERT_MEMEQ(t->data, want, bytes);
        free(want);
        /* Tensors are laid out in order, each at a multiple of the alignment. */
        ASSERT_TRUE(prev_end == NULL || (const uint8_t *)t->data >= prev_end);
        if (i > 0) {
            const uint8_t *first = kvf_gguf_tensor_at(g, 0)->data;
            ASSERT_EQ_INT(((const uint8_t *)t->data - first) % alignment, 0);
        }
        prev_end = (const uint8_t *)t->data + t->n_bytes;
    }
}

static void test_roundtrip_all_types(void)
{
    static const uint32_t aligns[] = {0, 8, 64, 4096};
    for (size_t a = 0; a < KVF_ARRAY_LEN(aligns); a++) {
        char path[512], err[256];
        scratch_path(path, sizeof path, "all.gguf");
        write_all_types(path, aligns[a]);
        kvf_gguf_t *g;
        ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
        uint32_t want = aligns[a] ? aligns[a] : 32;
        check_all_types(g, want);
        uint32_t al;
        if (aligns[a] && aligns[a] != 32) {
            ASSERT_OK(kvf_gguf_get_u32(g, "general.alignment", &al));
            ASSERT_EQ_INT(al, want);
        } else {
            ASSERT_ERR(kvf_gguf_get_u32(g, "general.alignment", &al), KVF_E_MODEL_MISSING);
        }
        kvf_gguf_close(g);
        /* The same bytes through open_mem. */
        size_t len;
        uint8_t *buf = read_all(path, &len);
        ASSERT_OK(kvf_gguf_open_mem(buf, len, &g, err, sizeof err));
        check_all_types(g, want);
        kvf_gguf_close(g);
        free(buf);
        unlink(path);
    }
    scratch_done();
}

/* ---- re-writing a file from what the reader returns gives the same bytes ---- */

static void copy_kv(const kvf_gguf_t *g, kvf_gguf_writer_t *w, const char *key, uint32_t type)
{
    switch (type) {
    case KVF_GGUF_U32: {
        uint32_t v;
        ASSERT_OK(kvf_gguf_get_u32(g, key, &v));
        ASSERT_OK(kvf_gguf_writer_add_u32(w, key, v));
        break;
    }
    case KVF_GGUF_I32: {
        int32_t v;
        ASSERT_OK(kvf_gguf_get_i32(g, key, &v));
        ASSERT_OK(kvf_gguf_writer_add_i32(w, key, v));
        break;
    }
    case KVF_GGUF_U64: {
        uint64_t v;
        ASSERT_OK(kvf_gguf_get_u64(g, key, &v));
        ASSERT_OK(kvf_gguf_writer_add_u64(w, key, v));
        break;
    }
    case KVF_GGUF_F32: {
        float v;
        ASSERT_OK(kvf_gguf_get_f32(g, key, &v));
        ASSERT_OK(kvf_gguf_writer_add_f32(w, key, v));
        break;
    }
    case KVF_GGUF_BOOL: {
        bool v;
        ASSERT_OK(kvf_gguf_get_bool(g, key, &v));
        ASSERT_OK(kvf_gguf_writer_add_bool(w, key, v));
        break;
    }
    case KVF_GGUF_STRING: {
        const char *s;
        size_t n;
        ASSERT_OK(kvf_gguf_get_str(g, key, &s, &n));
        ASSERT_OK(kvf_gguf_writer_add_str(w, key, s, n));
        break;
    }
    case KVF_GGUF_ARRAY: {
        uint32_t et;
        uint64_t n;
        ASSERT_OK(kvf_gguf_get_arr(g, key, &et, &n));
        if (et == KVF_GGUF_STRING) {
            const char **v = malloc((n + 1) * sizeof *v);
            size_t *lens = malloc((n + 1) * sizeof *lens);
            ASSERT_TRUE(v && lens);
            for (uint64_t i = 0; i < n; i++)
                ASSERT_OK(kvf_gguf_get_arr_str(g, key, i, &v[i], &lens[i]));
            ASSERT_OK(kvf_gguf_writer_add_arr_str(w, key, v, lens, n));
            free(v);
            free(lens);
        } else if (et == KVF_GGUF_F32) {
            float *v = malloc((n + 1) * sizeof *v);
            ASSERT_NOT_NULL(v);
            for (uint64_t i = 0; i < n; i++)
                ASSERT_OK(kvf_gguf_get_arr_f32(g, key, i, &v[i]));
            ASSERT_OK(kvf_gguf_writer_add_arr_f32(w, key, v, n));
            free(v);
        } else if (et == KVF_GGUF_I32) {
            int32_t *v = malloc((n + 1) * sizeof *v);
            ASSERT_NOT_NULL(v);
            for (uint64_t i = 0; i < n; i++)
                ASSERT_OK(kvf_gguf_get_arr_i32(g, key, i, &v[i]));
            ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, key, v, n));
            free(v);
        } else {
            KVF_FAIL("array of type %u in %s", et, key);
        }
        break;
    }
    default:
        KVF_FAIL("key %s of type %u", key, type);
    }
}

/* Reads path, writes every key and tensor back through the writer, and compares bytes. */
static void check_rewrite_identical(const char *path)
{
    char err[256], copy[512];
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    kvf_gguf_writer_t *w;
    uint32_t alignment = 32;
    kvf_gguf_get_u32(g, "general.alignment", &alignment);
    ASSERT_OK(kvf_gguf_writer_create(alignment, &w));
    for (uint64_t i = 0; i < kvf_gguf_n_kv(g); i++) {
        const char *k;
        size_t kl;
        uint32_t type;
        ASSERT_OK(kvf_gguf_kv_at(g, i, &k, &kl, &type));
        char key[256];
        ASSERT_TRUE(kl < sizeof key);
        memcpy(key, k, kl);
        key[kl] = '\0';
        if (strcmp(key, "general.alignment") == 0) continue; /* the writer adds it */
        copy_kv(g, w, key, type);
    }
    ASSERT_ERR(
        kvf_gguf_kv_at(g, kvf_gguf_n_kv(g), &(const char *){0}, &(size_t){0}, &(uint32_t){0}),
        -ERANGE);
    for (uint64_t i = 0; i < kvf_gguf_n_tensors(g); i++) {
        const struct kvf_gguf_tensor *t = kvf_gguf_tensor_at(g, i);
        ASSERT_OK(
            kvf_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL));
    }
    snprintf(copy, sizeof copy, "%s.copy", path);
    ASSERT_OK(kvf_gguf_writer_write(w, copy, err, sizeof err));
    kvf_gguf_writer_destroy(w);
    kvf_gguf_close(g);
    size_t a_len, b_len;
    uint8_t *a = read_all(path, &a_len), *b = read_all(copy, &b_len);
    ASSERT_EQ_INT(a_len, b_len);
    ASSERT_MEMEQ(a, b, a_len);
    free(a);
    free(b);
    unlink(copy);
}

static void test_rewrite_identical(void)
{
    char path[512];
    scratch_path(path, sizeof path, "all.gguf");
    write_all_types(path, 64);
    check_rewrite_identical(path);
    unlink(path);
    scratch_done();
}

/* ---- mkmodel ---- */

static void check_tensor(const kvf_gguf_t *g, const char *name, uint32_t type, uint64_t ne0,
                         uint64_t ne1)
{
    const struct kvf_gguf_tensor *t = kvf_gguf_find_tensor(g, name);
    if (!t) KVF_FAIL("tensor %s missing", name);
    ASSERT_EQ_INT(t->type, type);
    ASSERT_EQ_INT(t->n_dims, ne1 ? 2 : 1);
    ASSERT_EQ_U64(t->ne[0], ne0);
    ASSERT_EQ_U64(t->ne[1], ne1 ? ne1 : 1);
}

/* Root mean square of a tensor's values (dequantized row by row). */
static double tensor_rms(const struct kvf_gguf_tensor *t)
{
    uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3], row_bytes;
    ASSERT_OK(kvf_quant_row_bytes(t->type, t->ne[0], &row_bytes));
    float *row = malloc(t->ne[0] * sizeof *row);
    ASSERT_NOT_NULL(row);
    double sum = 0;
    for (uint64_t r = 0; r < rows; r++) {
        ASSERT_OK(
            kvf_dequant_row(t->type, (const uint8_t *)t->data + r * row_bytes, row, t->ne[0]));
        for (uint64_t i = 0; i < t->ne[0]; i++) {
            ASSERT_TRUE(isfinite(row[i]));
            sum += (double)row[i] * row[i];
        }
    }
    free(row);
    return sqrt(sum / (double)(rows * t->ne[0]));
}

static void check_model(const char *path, const struct kvf_mkmodel_shape *s, uint32_t type)
{
    char err[256];
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    const char *str;
    size_t n;
    uint32_t v;
    float f;
    ASSERT_OK(kvf_gguf_get_str(g, "general.architecture", &str, &n));
    ASSERT_TRUE(n == 5 && memcmp(str, "llama", 5) == 0);
    ASSERT_OK(kvf_gguf_get_str(g, "tokenizer.ggml.model", &str, &n));
    ASSERT_TRUE(n == 5 && memcmp(str, "llama", 5) == 0);
    struct {
        const char *key;
        uint32_t want;
    } u[] = {{"llama.context_length", s->n_ctx},
             {"llama.embedding_length", s->dim},
             {"llama.block_count", s->n_layers},
             {"llama.feed_forward_length", s->ffn_dim},
             {"llama.attention.head_count", s->n_heads},
             {"llama.attention.head_count_kv", s->n_kv_heads},
             {"llama.rope.dimension_count", s->dim / s->n_heads},
             {"tokenizer.ggml.bos_token_id", 1},
             {"tokenizer.ggml.eos_token_id", 2},
             {"tokenizer.ggml.unknown_token_id", 0}};
    for (size_t i = 0; i < KVF_ARRAY_LEN(u); i++) {
        ASSERT_OK(kvf_gguf_get_u32(g, u[i].key, &v));
        ASSERT_EQ_INT(v, u[i].want);
    }
    ASSERT_OK(kvf_gguf_get_f32(g, "llama.rope.freq_base", &f));
    ASSERT_TRUE(f == 10000.0f);
    ASSERT_OK(kvf_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f));
    ASSERT_TRUE(f > 0 && f < 1e-3f);
    uint32_t et;
    uint64_t len;
    ASSERT_OK(kvf_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &len));
    ASSERT_EQ_U64(len, s->n_vocab);
    ASSERT_OK(kvf_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 3 + 0x41, &str, &n));
    ASSERT_TRUE(n == 6 && memcmp(str, "<0x41>", 6) == 0);
    ASSERT_OK(kvf_gguf_get_arr_str(g, "tokenizer.ggml.tokens", s->n_vocab - 1, &str, &n));
    ASSERT_TRUE(n > 7 && memcmp(str, "<extra_", 7) == 0);

    uint64_t dim = s->dim, kv = (uint64_t)s->dim / s->n_heads * s->n_kv_heads, ffn = s->ffn_dim;
#define WT(ne0) (type == KVF_GGML_Q8_0 && (ne0) % 32 == 0 ? KVF_GGML_Q8_0 : KVF_GGML_F32)
    check_tensor(g, "token_embd.weight", WT(dim), dim, s->n_vocab);
    check_tensor(g, "output_norm.weight", KVF_GGML_F32, dim, 0);
    if (s->tied_output)
        ASSERT_NULL(kvf_gguf_find_tensor(g, "output.weight"));
    else
        check_tensor(g, "output.weight", WT(dim), dim, s->n_vocab);
    uint64_t n_tensors = 2 + !s->tied_output + 9ull * s->n_layers;
    ASSERT_EQ_U64(kvf_gguf_n_tensors(g), n_tensors);
    for (uint32_t l = 0; l < s->n_layers; l++) {
        char nm[64];
#define T(suffix, ty, a, b)                                                                        \
    (snprintf(nm, sizeof nm, "blk.%u." suffix, l), check_tensor(g, nm, ty, a, b))
        T("attn_norm.weight", KVF_GGML_F32, dim, 0);
        T("ffn_norm.weight", KVF_GGML_F32, dim, 0);
        T("attn_q.weight", WT(dim), dim, dim);
        T("attn_k.weight", WT(dim), dim, kv);
        T("attn_v.weight", WT(dim), dim, kv);
        T("attn_output.weight", WT(dim), dim, dim);
        T("ffn_gate.weight", WT(dim), dim, ffn);
        T("ffn_up.weight", WT(dim), dim, ffn);
        T("ffn_down.weight", WT(ffn), ffn, dim);
#undef T
    }
#undef WT
    /* Scales: q of fan-in dim has sd 1/sqrt(dim); norms are near 1; down is smaller still. */
    double q = tensor_rms(kvf_gguf_find_tensor(g, "blk.0.attn_q.weight"));
    ASSERT_NEAR(q, 1.0 / sqrt((double)dim), 0.1 / sqrt((double)dim));
    ASSERT_NEAR(tensor_rms(kvf_gguf_find_tensor(g, "blk.0.attn_norm.weight")), 1.0, 0.05);
    ASSERT_TRUE(tensor_rms(kvf_gguf_find_tensor(g, "blk.0.ffn_down.weight")) <
                1.0 / sqrt((double)ffn));
    kvf_tokenizer_t *tok;
    ASSERT_OK(kvf_tokenizer_create(g, &tok, err, sizeof err));
    ASSERT_EQ_INT(kvf_tokenizer_n_vocab(tok), s->n_vocab);
    kvf_tokenizer_destroy(tok);
    kvf_gguf_close(g);
}

static void test_mkmodel_tiny(void)
{
    const struct kvf_mkmodel_shape *s = kvf_mkmodel_shape_by_name("tiny");
    ASSERT_NOT_NULL(s);
    ASSERT_NULL(kvf_mkmodel_shape_by_name("huge"));
    ASSERT_EQ_INT(s->dim, 64);
    ASSERT_EQ_INT(s->ffn_dim, 172);
    char a[512], b[512], c[512], err[256];
    scratch_path(a, sizeof a, "tiny_a.gguf");
    scratch_path(b, sizeof b, "tiny_b.gguf");
    scratch_path(c, sizeof c, "tiny_c.gguf");
    uint32_t types[] = {KVF_GGML_F32, KVF_GGML_Q8_0};
    for (int ti = 0; ti < 2; ti++) {
        ASSERT_OK(kvf_mkmodel_write(a, s, types[ti], 42, err, sizeof err));
        ASSERT_OK(kvf_mkmodel_write(b, s, types[ti], 42, err, sizeof err));
        ASSERT_OK(kvf_mkmodel_write(c, s, types[ti], 43, err, sizeof err));
        check_model(a, s, types[ti]);
        check_rewrite_identical(a);
        size_t la, lb, lc;
        uint8_t *pa = read_all(a, &la), *pb = read_all(b, &lb), *pc = read_all(c, &lc);
        ASSERT_EQ_INT(la, lb);
        ASSERT_MEMEQ(pa, pb, la); /* same seed: same bytes */
        ASSERT_EQ_INT(la, lc);
        ASSERT_TRUE(memcmp(pa, pc, la) != 0); /* another seed: other weights */
        free(pa);
        free(pb);
        free(pc);
    }
    ASSERT_ERR(kvf_mkmodel_write(a, s, KVF_GGML_F16, 1, err, sizeof err), -EINVAL);
    unlink(a);
    unlink(b);
    unlink(c);
    scratch_done();
}

/* The larger shapes are checked for structure with q8_0 (smaller files); smol135m only under
 * KVF_SOAK=1, since it writes ~150 MB even quantized. */
static void test_mkmodel_s15m(void)
{
    const struct kvf_mkmodel_shape *s = kvf_mkmodel_shape_by_name("s15m");
    ASSERT_NOT_NULL(s);
    ASSERT_TRUE(s->dim == 288 && s->n_layers == 6 && s->n_vocab == 32000 && s->tied_output);
    char path[512], err[256];
    scratch_path(path, sizeof path, "s15m.gguf");
    ASSERT_OK(kvf_mkmodel_write(path, s, KVF_GGML_Q8_0, 7, err, sizeof err));
    check_model(path, s, KVF_GGML_Q8_0);
    unlink(path);
    const struct kvf_mkmodel_shape *m = kvf_mkmodel_shape_by_name("smol135m");
    ASSERT_NOT_NULL(m);
    ASSERT_TRUE(m->dim == 576 && m->n_layers == 30 && m->n_heads == 9 && m->n_kv_heads == 3 &&
                m->ffn_dim == 1536 && m->n_vocab == 49152 && m->n_ctx == 8192);
    const char *soak = getenv("KVF_SOAK");
    if (soak && strcmp(soak, "1") == 0) {
        scratch_path(path, sizeof path, "smol.gguf");
        ASSERT_OK(kvf_mkmodel_write(path, m, KVF_GGML_F32, 7, err, sizeof err));
        check_model(path, m, KVF_GGML_F32);
        unlink(path);
    }
    scratch_done();
}

/* The shapes of released models hold their config.json's numbers, and what mkmodel writes for
 * them says so. The files themselves are gigabytes: what is read back here is their metadata
 * and rope_freqs.weight alone (kvf__mkmodel_write_meta, the writer kvf_mkmodel_write uses). */
static void check_released_meta(const struct kvf_mkmodel_shape *s, const char *arch,
                                uint32_t head_dim, float eps)
{
    char path[512], err[256], key[96];
    scratch_path(path, sizeof path, "meta.gguf");
    ASSERT_OK(kvf__mkmodel_write_meta(path, s, KVF_MKMODEL_Q4_K_M, err, sizeof err));
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    const char *str;
    size_t n;
    uint32_t v;
    float f;
    ASSERT_OK(kvf_gguf_get_str(g, "general.architecture", &str, &n));
    ASSERT_TRUE(n == strlen(arch) && memcmp(str, arch, n) == 0);
    ASSERT_OK(kvf_gguf_get_u32(g, "general.file_type", &v));
    ASSERT_EQ_INT(v, 15);
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    const struct {
        const char *suffix;
        uint32_t want;
    } u[] = {{"context_length", s->n_ctx},         {"embedding_length", s->dim},
             {"block_count", s->n_layers},         {"feed_forward_length", s->ffn_dim},
             {"attention.head_count", s->n_heads}, {"attention.head_count_kv", s->n_kv_heads},
             {"rope.dimension_count", head_dim},   {"vocab_size", s->n_vocab}};
    for (size_t i = 0; i < KVF_ARRAY_LEN(u); i++) {
        snprintf(key, sizeof key, "%s.%s", arch, u[i].suffix);
        ASSERT_OK(kvf_gguf_get_u32(g, key, &v));
        ASSERT_EQ_INT(v, u[i].want);
    }
    /* key_length only where heads are not dim / n_heads (qwen3). */
    if (head_dim != s->dim / s->n_heads) {
        ASSERT_OK(kvf_gguf_get_u32(g, KEY("attention.key_length"), &v));
        ASSERT_EQ_INT(v, head_dim);
        ASSERT_OK(kvf_gguf_get_u32(g, KEY("attention.value_length"), &v));
        ASSERT_EQ_INT(v, head_dim);
    } else {
        ASSERT_TRUE(kvf_gguf_get_u32(g, KEY("attention.key_length"), &v) < 0);
    }
    ASSERT_OK(kvf_gguf_get_f32(g, KEY("rope.freq_base"), &f));
    ASSERT_TRUE(f == s->rope_base);
    ASSERT_TRUE(kvf_gguf_get_str(g, KEY("rope.scaling.type"), &str, &n) < 0);
    ASSERT_OK(kvf_gguf_get_f32(g, KEY("attention.layer_norm_rms_epsilon"), &f));
    ASSERT_TRUE(f == eps);
#undef KEY
    /* Llama 3's factors as the converters write them: for heads of 64 at base 500000 over an
     * original context of 8192, pairs 0..14 (wavelength under 8192 / 4) keep 1, pairs 18..31
     * (over 8192 / 1) take 32, and pairs 15..17 blend, rising. */
    const struct kvf_gguf_tensor *rf = kvf_gguf_find_tensor(g, "rope_freqs.weight");
    ASSERT_EQ_U64(kvf_gguf_n_tensors(g), s->rope_llama3 ? 1 : 0);
    if (s->rope_llama3) {
        ASSERT_NOT_NULL(rf);
        ASSERT_EQ_INT(rf->type, KVF_GGML_F32);
        ASSERT_EQ_U64(rf->ne[0], head_dim / 2);
        const float *r = rf->data;
        for (uint32_t i = 0; i < head_dim / 2; i++) {
            bool blend = i >= 15 && i <= 17;
            ASSERT_TRUE(blend ? r[i] > r[i - 1] && r[i] < 32.0f : r[i] == (i <= 14 ? 1.0f : 32.0f));
        }
    }
    /* The generated vocab reads as a tokenizer: text goes to BOS and byte tokens (a leading
     * "▁", U+2581, then 'H' and 'i'), and the last id is an <extra_N>. */
    kvf_tokenizer_t *tok;
    ASSERT_OK(kvf_tokenizer_create(g, &tok, err, sizeof err));
    ASSERT_EQ_INT(kvf_tokenizer_n_vocab(tok), s->n_vocab);
    int32_t ids[8];
    ASSERT_EQ_INT(kvf_tokenizer_encode(tok, "Hi", 2, kvf_tokenizer_wants_bos(tok), ids, 8), 6);
    const int32_t want_ids[] = {1, 3 + 0xe2, 3 + 0x96, 3 + 0x81, 3 + 'H', 3 + 'i'};
    ASSERT_MEMEQ(ids, want_ids, sizeof want_ids);
    kvf_tokenizer_destroy(tok);
    ASSERT_OK(kvf_gguf_get_arr_str(g, "tokenizer.ggml.tokens", s->n_vocab - 1, &str, &n));
    ASSERT_TRUE(n > 7 && memcmp(str, "<extra_", 7) == 0);
    kvf_gguf_close(g);
    unlink(path);
}

static void test_mkmodel_released(void)
{
    static const struct {
        const char *name, *arch; /* arch as written in general.architecture */
        uint32_t dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, n_vocab, n_ctx;
        bool tied;
        float rope_base, eps;
        bool llama3_rope; /* factor 32, low 1, high 4, original context 8192 */
    } want[] = {
        {"llama3.2-1b", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 131072, true, 500000.0f, 1e-5f,
         true},
        {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 32768, true, 1e6f, 1e-6f,
         false},
        {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960, true, 1e6f, 1e-6f,
         false},
        {"llama3-8b", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 8192, false, 500000.0f, 1e-5f,
         false},
    };
    for (size_t i = 0; i < KVF_ARRAY_LEN(want); i++) {
        const struct kvf_mkmodel_shape *s = kvf_mkmodel_shape_by_name(want[i].name);
        ASSERT_NOT_NULL(s);
        const char *arch = s->arch ? s->arch : "llama";
        uint32_t hd = s->head_dim ? s->head_dim : s->dim / s->n_heads;
        ASSERT_TRUE(strcmp(arch, want[i].arch) == 0);
        ASSERT_TRUE(s->dim == want[i].dim && s->n_layers == want[i].n_layers &&
                    s->n_heads == want[i].n_heads && s->n_kv_heads == want[i].n_kv_heads &&
                    hd == want[i].head_dim && s->ffn_dim == want[i].ffn_dim &&
                    s->n_vocab == want[i].n_vocab && s->n_ctx == want[i].n_ctx &&
                    s->tied_output == want[i].tied && s->rope_base == want[i].rope_base &&
                    s->rope_linear == 0.0f);
        ASSERT_TRUE((s->rope_llama3 != NULL) == want[i].llama3_rope);
        if (s->rope_llama3)
            ASSERT_TRUE(
                s->rope_llama3->factor == 32.0f && s->rope_llama3->low_freq_factor == 1.0f &&
                s->rope_llama3->high_freq_factor == 4.0f && s->rope_llama3->original_ctx == 8192);
        check_released_meta(s, want[i].arch, want[i].head_dim, want[i].eps);
    }
    /* Every shape is listed, each once, by the list the CLI prints for an unknown name. */
    size_t n = 0;
    for (const struct kvf_mkmodel_shape *s; (s = kvf_mkmodel_shape_at(n)); n++)
        ASSERT_TRUE(kvf_mkmodel_shape_by_name(s->name) == s);
    ASSERT_EQ_INT(n, 12);
    /* The metadata-only file carries the full file's rope_freqs.weight, byte for byte. */
    const struct kvf_mkmodel_shape *rt = kvf_mkmodel_shape_by_name("rope-tiny");
    char a[512], b[512], err[256];
    scratch_path(a, sizeof a, "rope_full.gguf");
    scratch_path(b, sizeof b, "rope_meta.gguf");
    ASSERT_OK(kvf_mkmodel_write(a, rt, KVF_GGML_Q8_0, 3, err, sizeof err));
    ASSERT_OK(kvf__mkmodel_write_meta(b, rt, KVF_GGML_Q8_0, err, sizeof err));
    kvf_gguf_t *ga, *gb;
    ASSERT_OK(kvf_gguf_open(a, &ga, err, sizeof err));
    ASSERT_OK(kvf_gguf_open(b, &gb, err, sizeof err));
    const struct kvf_gguf_tensor *ta = kvf_gguf_find_tensor(ga, "rope_freqs.weight");
    const struct kvf_gguf_tensor *tb = kvf_gguf_find_tensor(gb, "rope_freqs.weight");
    ASSERT_TRUE(ta && tb && ta->n_bytes == tb->n_bytes);
    ASSERT_MEMEQ(ta->data, tb->data, ta->n_bytes);
    kvf_gguf_close(ga);
    kvf_gguf_close(gb);
    unlink(a);
    unlink(b);
    scratch_done();
}

/* ---- truncation ---- */

/* Opens every prefix of buf, each in its own exact-size allocation so ASan sees any over-read.
 * A prefix that ends before the last tensor's data must fail as truncated; one that holds it
 * all must open. step > 1 samples the offsets after `dense` (every offset before it). */
static void truncate_all(const uint8_t *buf, size_t len, size_t dense, size_t step)
{
    kvf_gguf_t *g;
    char err[256];
    ASSERT_OK(kvf_gguf_open_mem(buf, len, &g, err, sizeof err));
    size_t need = 0;
    for (uint64_t i = 0; i < kvf_gguf_n_tensors(g); i++) {
        const struct kvf_gguf_tensor *t = kvf_gguf_tensor_at(g, i);
        size_t end = (size_t)((const uint8_t *)t->data - buf) + (size_t)t->n_bytes;
        if (end > need) need = end;
    }
    kvf_gguf_close(g);
    ASSERT_TRUE(need > 0 && need <= len);
    for (size_t cut = 0; cut <= len; cut += cut < dense ? 1 : step) {
        uint8_t *p = malloc(cut ? cut : 1);
        ASSERT_NOT_NULL(p);
        memcpy(p, buf, cut);
        err[0] = '\0';
        int rc = kvf_gguf_open_mem(p, cut, &g, err, sizeof err);
        if (cut < need) {
            if (rc != KVF_E_MODEL_TRUNCATED)
                KVF_FAIL("cut at %zu of %zu: got %d (%s), want truncated", cut, len, rc, err);
            ASSERT_TRUE(err[0] != '\0');
        } else {
            if (rc != 0) KVF_FAIL("cut at %zu of %zu (data ends at %zu): %s", cut, len, need, err);
            kvf_gguf_close(g);
        }
        free(p);
    }
}

static void test_truncate_every_offset(void)
{
    char path[512], err[256];
    scratch_path(path, sizeof path, "all.gguf");
    write_all_types(path, 0);
    size_t len;
    uint8_t *buf = read_all(path, &len);
    truncate_all(buf, len, len, 1);
    free(buf);
    /* A tiny model: every offset of the metadata, then samples of the data. */
    ASSERT_OK(kvf_mkmodel_write(path, kvf_mkmodel_shape_by_name("tiny"), KVF_GGML_Q8_0, 1, err,
                                sizeof err));
    buf = read_all(path, &len);
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open_mem(buf, len, &g, err, sizeof err));
    size_t meta = (size_t)((const uint8_t *)kvf_gguf_tensor_at(g, 0)->data - buf);
    kvf_gguf_close(g);
    printf("# tiny q8_0: %zu bytes, metadata %zu\n", len, meta);
    truncate_all(buf, len, meta + 64, 997);
    free(buf);
    unlink(path);
    scratch_done();
}

/* ---- hostile headers ---- */

static int open_bb(const struct bb *b, char *err, size_t err_len)
{
    kvf_gguf_t *g = NULL;
    /* An exact-size copy, so an over-read is an ASan report. */
    uint8_t *p = malloc(b->n ? b->n : 1);
    ASSERT_NOT_NULL(p);
    if (b->n) memcpy(p, b->p, b->n);
    err[0] = '\0';
    int rc = kvf_gguf_open_mem(p, b->n, &g, err, err_len);
    if (rc == 0)
        kvf_gguf_close(g);
    else
        ASSERT_NULL(g);
    free(p);
    return rc;
}

/* A file with one key "k" of the given type followed by raw value bytes. */
static void one_kv(struct bb *b, uint32_t type, const void *val, size_t n)
{
    bb_header(b, 3, 0, 1);
    bb_str(b, "k");
    bb_u32(b, type);
    bb_put(b, val, n);
}

/* A file with one F32 tensor (1-D, 8 values at offset off) and its data. */
static void one_tensor(struct bb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t off, size_t data_bytes)
{
    bb_header(b, 3, 1, 0);
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, off);
    bb_pad(b, 32);
    for (size_t i = 0; i < data_bytes; i++)
        bb_put(b, "\0", 1);
}

#define EXPECT(build, code)                                                                        \
    do {                                                                                           \
        struct bb b_ = {0};                                                                        \
        struct bb *b = &b_;                                                                        \
        build;                                                                                     \
        int rc_ = open_bb(b, err, sizeof err);                                                     \
        if (rc_ != (code)) KVF_FAIL("%s: got %d (%s), want %s", #build, rc_, err, #code);          \
        if ((code) != 0) ASSERT_TRUE(err[0] != '\0');                                              \
        bb_free(b);                                                                                \
    } while (0)

static void test_hostile_headers(void)
{
    char err[256];
    uint64_t ne8[1] = {8};
    uint32_t u = 5;
    /* The header itself. */
    EXPECT((bb_u32(b, 0x46554746u), bb_u32(b, 3), bb_u64(b, 0), bb_u64(b, 0)), KVF_E_MODEL_FORMAT);
    EXPECT(bb_header(b, 1, 0, 0), KVF_E_MODEL_UNSUPPORTED);
    EXPECT(bb_header(b, 4, 0, 0), KVF_E_MODEL_UNSUPPORTED);
    EXPECT(bb_header(b, 2, 0, 0), 0);
    EXPECT(bb_header(b, 3, 0, 0), 0);
    EXPECT(bb_header(b, 3, 0, 1ull << 62), KVF_E_MODEL_TRUNCATED);
    EXPECT(bb_header(b, 3, UINT64_MAX, 0), KVF_E_MODEL_TRUNCATED);
    EXPECT((bb_header(b, 3, 0, UINT64_MAX), bb_pad(b, 4096)), KVF_E_MODEL_TRUNCATED);
    /* Keys. */
    EXPECT((bb_header(b, 3, 0, 1), bb_u64(b, UINT64_MAX), bb_u32(b, 4)), KVF_E_MODEL_TRUNCATED);
    EXPECT((bb_header(b, 3, 0, 1), bb_u64(b, 1ull << 40), bb_u32(b, 4), bb_u32(b, 4), bb_u32(b, 4)),
           KVF_E_MODEL_TRUNCATED);
    EXPECT((bb_header(b, 3, 0, 1), bb_str(b, ""), bb_u32(b, 4), bb_u32(b, 1)), KVF_E_MODEL_FORMAT);
    EXPECT((bb_header(b, 3, 0, 1), bb_u64(b, 3), bb_put(b, "a\0b", 3), bb_u32(b, 4), bb_u32(b, 1)),
           KVF_E_MODEL_FORMAT);
    EXPECT((bb_header(b, 3, 0, 2), bb_str(b, "k"), bb_u32(b, 4), bb_u32(b, 1), bb_str(b, "k"),
            bb_u32(b, 4), bb_u32(b, 2)),
           KVF_E_MODEL_FORMAT); /* duplicate key */
    /* Values. */
    EXPECT(one_kv(b, 99, &u, 4), KVF_E_MODEL_FORMAT); /* unknown type */
    EXPECT(one_kv(b, KVF_GGUF_U32, &u, 3), KVF_E_MODEL_TRUNCATED);
    EXPECT(one_kv(b, KVF_GGUF_U64, &u, 4), KVF_E_MODEL_TRUNCATED);
    EXPECT((one_kv(b, KVF_GGUF_STRING, NULL, 0), bb_u64(b, 100), bb_put(b, "abc", 3)),
           KVF_E_MODEL_TRUNCATED);
    EXPECT((one_kv(b, KVF_GGUF_STRING, NULL, 0), bb_u64(b, UINT64_MAX), bb_put(b, "abc", 3)),
           KVF_E_MODEL_TRUNCATED);
    EXPECT((one_kv(b, KVF_GGUF_ARRAY, NULL, 0), bb_u32(b, KVF_GGUF_U32), bb_u64(b, 1ull << 62),
            bb_u64(b, 0)),
           KVF_E_MODEL_TRUNCATED); /* n * 4 overflows 64 bits */
    EXPECT((one_kv(b, KVF_GGUF_ARRAY, NULL, 0), bb_u32(b, KVF_GGUF_STRING), bb_u64(b, 1ull << 61),
            bb_str(b, "x")),
           KVF_E_MODEL_TRUNCATED);
    EXPECT((one_kv(b, KVF_GGUF_ARRAY, NULL, 0), bb_u32(b, KVF_GGUF_STRING), bb_u64(b, 2),
            bb_str(b, "x"), bb_u64(b, 5), bb_put(b, "ab", 2)),
           KVF_E_MODEL_TRUNCATED);
    EXPECT((one_kv(b, KVF_GGUF_ARRAY, NULL, 0), bb_u32(b, KVF_GGUF_ARRAY), bb_u64(b, 1),
            bb_u32(b, KVF_GGUF_U8), bb_u64(b, 0)),
           KVF_E_MODEL_UNSUPPORTED); /* nested */
    EXPECT((one_kv(b, KVF_GGUF_ARRAY, NULL, 0), bb_u32(b, 77), bb_u64(b, 0)), KVF_E_MODEL_FORMAT);
    EXPECT((one_kv(b, KVF_GGUF_ARRAY, NULL, 0), bb_u32(b, KVF_GGUF_U8), bb_u64(b, 0)), 0);
    /* Alignment. */
    EXPECT((bb_header(b, 3, 0, 1), bb_str(b, "general.alignment"), bb_u32(b, KVF_GGUF_U32),
            bb_u32(b, 0)),
           KVF_E_MODEL_FORMAT);
    EXPECT((bb_header(b, 3, 0, 1), bb_str(b, "general.alignment"), bb_u32(b, KVF_GGUF_U32),
            bb_u32(b, 48)),
           KVF_E_MODEL_FORMAT);
    EXPECT((bb_header(b, 3, 0, 1), bb_str(b, "general.alignment"), bb_u32(b, KVF_GGUF_I32),
            bb_u32(b, 32)),
           KVF_E_MODEL_FORMAT);
    EXPECT((bb_header(b, 3, 0, 1), bb_str(b, "general.alignment"), bb_u32(b, KVF_GGUF_U32),
            bb_u32(b, 1u << 31)),
           0); /* legal, and no tensor needs the data section */
    /* Tensors. */
    EXPECT(one_tensor(b, "w", 1, ne8, KVF_GGML_F32, 0, 32), 0);
    EXPECT(one_tensor(b, "w", 1, ne8, KVF_GGML_F32, 0, 31), KVF_E_MODEL_TRUNCATED);
    EXPECT(one_tensor(b, "w", 1, ne8, KVF_GGML_F32, 32, 32), KVF_E_MODEL_TRUNCATED);
    EXPECT(one_tensor(b, "w", 1, ne8, KVF_GGML_F32, 16, 64), KVF_E_MODEL_FORMAT); /* unaligned */
    EXPECT(one_tensor(b, "w", 1, ne8, KVF_GGML_F32, UINT64_MAX - 31, 32), KVF_E_MODEL_TRUNCATED);
    EXPECT(one_tensor(b, "w", 5, ((uint64_t[]){1, 1, 1, 1, 8}), KVF_GGML_F32, 0, 32),
           KVF_E_MODEL_FORMAT);
    EXPECT(one_tensor(b, "w", 0, ne8, KVF_GGML_F32, 0, 32), KVF_E_MODEL_FORMAT);
    EXPECT(one_tensor(b, "w", 1, ((uint64_t[]){0}), KVF_GGML_F32, 0, 32), KVF_E_MODEL_FORMAT);
    EXPECT(one_tensor(b, "w", 2, ((uint64_t[]){1ull << 40, 1ull << 40}), KVF_GGML_F32, 0, 32),
           KVF_E_MODEL_FORMAT); /* element count overflows */
    EXPECT(one_tensor(b, "w", 2, ((uint64_t[]){1ull << 31, 1ull << 31}), KVF_GGML_F32, 0, 32),
           KVF_E_MODEL_FORMAT); /* byte count overflows */
    EXPECT(one_tensor(b, "w", 2, ((uint64_t[]){1ull << 20, 1ull << 20}), KVF_GGML_F32, 0, 32),
           KVF_E_MODEL_TRUNCATED);
    EXPECT(one_tensor(b, "w", 1, ((uint64_t[]){33}), KVF_GGML_Q8_0, 0, 64), KVF_E_MODEL_FORMAT);
    EXPECT(one_tensor(b, "w", 1, ((uint64_t[]){32}), KVF_GGML_Q8_0, 0, 34), 0);
    EXPECT(one_tensor(b, "w", 1, ((uint64_t[]){256}), 11, 0, 110), KVF_E_MODEL_UNSUPPORTED);
    ASSERT_TRUE(strstr(err, "Q3_K") != NULL); /* refused by name */
    EXPECT(one_tensor(b, "w", 1, ne8, 1000, 0, 32), KVF_E_MODEL_UNSUPPORTED);
    EXPECT(one_tensor(b, "", 1, ne8, KVF_GGML_F32, 0, 32), KVF_E_MODEL_FORMAT);
    EXPECT((bb_header(b, 3, 1, 0), bb_u64(b, 1ull << 50), bb_u32(b, 1), bb_u64(b, 8), bb_u32(b, 0),
            bb_u64(b, 0)),
           KVF_E_MODEL_TRUNCATED); /* name length past the end */
    EXPECT((bb_header(b, 3, 2, 0), bb_str(b, "w"), bb_u32(b, 1), bb_u64(b, 8), bb_u32(b, 0),
            bb_u64(b, 0), bb_str(b, "w"), bb_u32(b, 1), bb_u64(b, 8), bb_u32(b, 0), bb_u64(b, 32),
            bb_pad(b, 32), bb_put(b, (uint8_t[64]){0}, 64)),
           KVF_E_MODEL_FORMAT); /* duplicate tensor */
    /* Not a file at all. */
    EXPECT((void)b, KVF_E_MODEL_TRUNCATED);
    kvf_gguf_t *g = NULL;
    ASSERT_ERR(kvf_gguf_open("/nonexistent/x.gguf", &g, err, sizeof err), -ENOENT);
    ASSERT_NULL(g);
    ASSERT_ERR(kvf_gguf_open("/", &g, err, sizeof err), KVF_E_MODEL_FORMAT);
    ASSERT_ERR(kvf_gguf_open_mem(NULL, 0, &g, err, sizeof err), KVF_E_MODEL_TRUNCATED);
}

/* ---- writer failures leave nothing behind ---- */

static int failing_row(void *ctx, uint64_t row, void *dst, size_t n)
{
    memset(dst, 0, n);
    return row == *(uint64_t *)ctx ? -EIO : 0;
}

static void test_writer_failure(void)
{
    char path[512], tmp[600], err[256];
    scratch_path(path, sizeof path, "keep.gguf");
    write_all(path, "old contents", 12);
    kvf_gguf_writer_t *w;
    ASSERT_OK(kvf_gguf_writer_create(0, &w));
    ASSERT_ERR(kvf_gguf_writer_create(3, &(kvf_gguf_writer_t *){NULL}), -EINVAL);
    uint64_t fail_at = 5, ne[2] = {32, 10};
    ASSERT_OK(kvf_gguf_writer_add_tensor(w, "x", KVF_GGML_F32, 2, ne, NULL, failing_row, &fail_at));
    ASSERT_ERR(kvf_gguf_writer_write(w, path, err, sizeof err), -EIO);
    ASSERT_TRUE(strstr(err, "row 5") != NULL);
    size_t len;
    uint8_t *p = read_all(path, &len);
    ASSERT_TRUE(len == 12 && memcmp(p, "old contents", 12) == 0); /* untouched */
    free(p);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ASSERT_TRUE(access(tmp, F_OK) != 0); /* no temporary left */
    ASSERT_TRUE(kvf_gguf_writer_write(w, "/nonexistent/dir/x.gguf", err, sizeof err) < 0);
    /* The same writer succeeds once the rows do. */
    fail_at = UINT64_MAX;
    ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    ASSERT_EQ_U64(kvf_gguf_find_tensor(g, "x")->n_bytes, 32 * 10 * 4);
    kvf_gguf_close(g);
    kvf_gguf_writer_destroy(w);
    unlink(path);
    scratch_done();
}

/* ---- random mutations: a small in-tree fuzzer that runs in every test build ----
 * Flips bytes and plants extreme integers in the metadata of two valid files, then opens each
 * mutant; an open that succeeds is walked completely (keys, tensor rows, tokenizer). Any
 * over-read or undefined behaviour is a sanitizer failure; any other error code a test failure. */

static void walk_opened(const kvf_gguf_t *g)
{
    for (uint64_t i = 0; i < kvf_gguf_n_kv(g); i++) {
        const char *k;
        size_t kl;
        uint32_t type, et;
        uint64_t n;
        ASSERT_OK(kvf_gguf_kv_at(g, i, &k, &kl, &type));
        char key[300];
        if (kl >= sizeof key) continue;
        memcpy(key, k, kl);
        key[kl] = '\0';
        uint32_t u;
        float f;
        const char *s;
        size_t len;
        (void)kvf_gguf_get_u32(g, key, &u);
        (void)kvf_gguf_get_f32(g, key, &f);
        (void)kvf_gguf_get_str(g, key, &s, &len);
        if (kvf_gguf_get_arr(g, key, &et, &n) == 0 && n > 0) {
            (void)kvf_gguf_get_arr_str(g, key, n - 1, &s, &len);
            (void)kvf_gguf_get_arr_f32(g, key, n - 1, &f);
        }
    }
    for (uint64_t i = 0; i < kvf_gguf_n_tensors(g); i++) {
        const struct kvf_gguf_tensor *t = kvf_gguf_tensor_at(g, i);
        if (t->ne[0] > 4096) continue;
        float row[4096];
        ASSERT_OK(kvf_dequant_row(t->type, t->data, row, t->ne[0]));
    }
    kvf_tokenizer_t *tok;
    char err[128];
    if (kvf_tokenizer_create(g, &tok, err, sizeof err) == 0) {
        int32_t ids[64];
        int n = kvf_tokenizer_encode(tok, "h\xc3\xa9llo \xe2\x9c\x93", 10, true, ids, 64);
        ASSERT_TRUE(n > 0 && n <= 64);
        struct kvf_detok d;
        char out[KVF_DETOK_MAX_OUT];
        kvf_detok_init(&d);
        for (int i = 0; i < n; i++)
            kvf_detok_push(&d, tok, ids[i], out, sizeof out);
        kvf_detok_finish(&d, out, sizeof out);
        kvf_tokenizer_destroy(tok);
    }
}

static void mutate_and_open(const uint8_t *orig, size_t len, size_t meta, struct kvf_rng *r,
                            int iters)
{
    uint8_t *p = malloc(len);
    ASSERT_NOT_NULL(p);
    int opened = 0;
    for (int it = 0; it < iters; it++) {
        memcpy(p, orig, len);
        int n_mut = 1 + (int)kvf_rng_below(r, 4);
        for (int m = 0; m < n_mut; m++) {
            size_t at = kvf_rng_below(r, (uint32_t)meta);
            switch (kvf_rng_below(r, 4)) {
            case 0:
                p[at] ^= (uint8_t)(1u << kvf_rng_below(r, 8));
                break;
            case 1:
                p[at] = (uint8_t)kvf_rng_next(r);
                break;
            default: {
                /* An extreme 64-bit value where a count, length or offset may be. */
                static const uint64_t ex[] = {
                    0,  1, 0x7fffffffffffffffull, UINT64_MAX, 0xffffffffull, 1ull << 32, 1ull << 63,
                    31, 33};
                uint64_t v = ex[kvf_rng_below(r, KVF_ARRAY_LEN(ex))];
                if (at + 8 <= len) memcpy(p + at, &v, 8);
                break;
            }
            }
        }
        /* Sometimes also cut the file short. */
        size_t cut = kvf_rng_below(r, 8) == 0 ? kvf_rng_below(r, (uint32_t)len) : len;
        uint8_t *q = malloc(cut ? cut : 1);
        ASSERT_NOT_NULL(q);
        memcpy(q, p, cut);
        kvf_gguf_t *g;
        char err[256];
        int rc = kvf_gguf_open_mem(q, cut, &g, err, sizeof err);
        if (rc == 0) {
            opened++;
            walk_opened(g);
            kvf_gguf_close(g);
        } else if (rc != KVF_E_MODEL_FORMAT && rc != KVF_E_MODEL_TRUNCATED &&
                   rc != KVF_E_MODEL_UNSUPPORTED) {
            KVF_FAIL("iteration %d: unexpected error %d (%s)", it, rc, err);
        } else {
            ASSERT_TRUE(err[0] != '\0');
        }
        free(q);
    }
    printf("# %d of %d mutants opened\n", opened, iters);
    free(p);
}

static void test_random_mutations(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    const char *soak = getenv("KVF_SOAK");
    int iters = soak && strcmp(soak, "1") == 0 ? 1000000 : 30000;
    char path[512], err[256];
    scratch_path(path, sizeof path, "m.gguf");
    write_all_types(path, 32);
    size_t len;
    uint8_t *buf = read_all(path, &len);
    mutate_and_open(buf, len, len, &r, iters);
    free(buf);
    const struct kvf_mkmodel_shape micro = {"micro", 32,   1,    2, 1,        32,   259,
                                            64,      true, NULL, 0, 10000.0f, NULL, 0.0f};
    ASSERT_OK(kvf_mkmodel_write(path, &micro, KVF_GGML_Q8_0, 1, err, sizeof err));
    buf = read_all(path, &len);
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open_mem(buf, len, &g, err, sizeof err));
    size_t meta = (size_t)((const uint8_t *)kvf_gguf_tensor_at(g, 0)->data - buf);
    kvf_gguf_close(g);
    mutate_and_open(buf, len, meta, &r, iters / 4);
    free(buf);
    unlink(path);
    scratch_done();
}

/* ---- seeds for the fuzz corpus (tests/fuzz/corpus/gguf) ----
 * `test_gguf --write-corpus DIR test_fuzz_seeds` writes them there; without the option they
 * are written to scratch and checked, so the generator itself stays tested. The files carry
 * no .gguf suffix: the repository ignores *.gguf (generated models), not these. */

static void seed_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ASSERT_TRUE(n <= 64 * 1024); /* corpus files stay small */
    write_all(path, p, n);
}

static void test_fuzz_seeds(void)
{
    const char *dir = kvf_test_arg("--write-corpus");
    bool keep = dir != NULL;
    if (!dir) dir = scratch_dir();
    char path[600], err[256];
    /* A micro Llama (dim 32, one layer, 259-token byte vocab) in both weight types. */
    const struct kvf_mkmodel_shape micro = {"micro", 32,   1,    2, 1,        32,   259,
                                            64,      true, NULL, 0, 10000.0f, NULL, 0.0f};
    const struct kvf_mkmodel_shape micro2 = {"micro2", 32,    1,    2, 2,        32,   259,
                                             64,       false, NULL, 0, 10000.0f, NULL, 0.0f};
    static const char *const names[] = {"micro_f32", "micro_q8_0", "micro2_q8_0", "all_types"};
    snprintf(path, sizeof path, "%s/%s", dir, names[0]);
    ASSERT_OK(kvf_mkmodel_write(path, &micro, KVF_GGML_F32, 1, err, sizeof err));
    snprintf(path, sizeof path, "%s/%s", dir, names[1]);
    ASSERT_OK(kvf_mkmodel_write(path, &micro, KVF_GGML_Q8_0, 2, err, sizeof err));
    snprintf(path, sizeof path, "%s/%s", dir, names[2]);
    ASSERT_OK(kvf_mkmodel_write(path, &micro2, KVF_GGML_Q8_0, 3, err, sizeof err));
    snprintf(path, sizeof path, "%s/%s", dir, names[3]);
    write_all_types(path, 64);
    for (size_t i = 0; i < KVF_ARRAY_LEN(names); i++) {
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        uint8_t *p = read_all(path, &len);
        ASSERT_TRUE(len <= 64 * 1024);
        kvf_gguf_t *g;
        ASSERT_OK(kvf_gguf_open_mem(p, len, &g, err, sizeof err));
        kvf_gguf_close(g);
        if (i == 1) seed_file(dir, "micro_q8_0_cut", p, len / 3); /* truncated */
        free(p);
    }
    /* A merge vocabulary, a gpt2 vocabulary, and hostile headers. */
    kvf_gguf_writer_t *w;
    static const char *const toks[] = {"<unk>",
                                       "<s>",
                                       "</s>",
                                       "<0x41>",
                                       "\xe2\x96\x81",
                                       "a",
                                       "b",
                                       "ab",
                                       ("\xe2\x96\x81"
                                        "ab"), /* one token */
                                       "\xc3\xa9"};
    static const float scores[] = {0, 0, 0, 0, -3, -5, -5, -2, -1, -4};
    static const int32_t types[] = {2, 3, 3, 6, 1, 1, 1, 1, 1, 1};
    for (int v = 0; v < 2; v++) {
        ASSERT_OK(kvf_gguf_writer_create(0, &w));
        ASSERT_OK(
            kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", v ? "gpt2" : "llama", v ? 4 : 5));
        ASSERT_OK(kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 10));
        ASSERT_OK(kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, 10));
        ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, 10));
        ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1));
        ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0));
        snprintf(path, sizeof path, "%s/%s", dir, v ? "vocab_gpt2" : "vocab_merge");
        ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
        kvf_gguf_writer_destroy(w);
    }
    struct bb b = {0};
    bb_header(&b, 3, 1, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, KVF_GGUF_U32);
    bb_u32(&b, 16);
    bb_str(&b, "w");
    bb_u32(&b, 2);
    bb_u64(&b, 32);
    bb_u64(&b, 2);
    bb_u32(&b, KVF_GGML_Q4_0);
    bb_u64(&b, 0);
    bb_pad(&b, 16);
    for (int i = 0; i < 36; i++)
        bb_put(&b, "\x88", 1);
    ASSERT_EQ_INT(open_bb(&b, err, sizeof err), 0);
    seed_file(dir, "q4_0_align16", b.p, b.n);
    bb_free(&b);
    bb_header(&b, 3, UINT64_MAX, 1ull << 60);
    seed_file(dir, "huge_counts", b.p, b.n);
    bb_free(&b);
    one_kv(&b, KVF_GGUF_ARRAY, NULL, 0);
    bb_u32(&b, KVF_GGUF_STRING);
    bb_u64(&b, 3);
    bb_str(&b, "x");
    bb_u64(&b, UINT64_MAX - 3);
    seed_file(dir, "string_past_end", b.p, b.n);
    bb_free(&b);
    if (!keep) {
        static const char *const all[] = {
            "micro_f32",   "micro_q8_0", "micro2_q8_0",  "all_types",   "micro_q8_0_cut",
            "vocab_merge", "vocab_gpt2", "q4_0_align16", "huge_counts", "string_past_end"};
        for (size_t i = 0; i < KVF_ARRAY_LEN(all); i++) {
            snprintf(path, sizeof path, "%s/%s", dir, all[i]);
            ASSERT_EQ_INT(unlink(path), 0);
        }
        scratch_done();
    }
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_roundtrip_all_types), KVF_CASE(test_rewrite_identical),
    KVF_CASE(test_mkmodel_tiny),        KVF_CASE(test_mkmodel_s15m),
    KVF_CASE(test_mkmodel_released),    KVF_CASE(test_truncate_every_offset),
    KVF_CASE(test_hostile_headers),     KVF_CASE(test_writer_failure),
    KVF_CASE(test_fuzz_seeds),          KVF_CASE(test_random_mutations),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
