/* Fuzz target: a GGUF file from arbitrary bytes. Whatever the input, opening it either fails
 * with an error or yields a file whose every key, tensor and vocabulary can be read without a
 * crash, an over-read or undefined behaviour. On success the target reads every key through the
 * typed getters, dequantizes the first and last row of every tensor, and, if the file has a
 * vocabulary, builds the tokenizer, encodes a fixed text and detokenizes a range of ids. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/gguf.h"
#include "kvfence/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Volatile sink so the reads are not optimized away. */
static volatile uint64_t sink;

static void walk_keys(const kvf_gguf_t *g)
{
    for (uint64_t i = 0; i < kvf_gguf_n_kv(g); i++) {
        const char *k;
        size_t kl;
        uint32_t type;
        if (kvf_gguf_kv_at(g, i, &k, &kl, &type) != 0) abort();
        char key[256];
        if (kl >= sizeof key) continue;
        memcpy(key, k, kl);
        key[kl] = '\0';
        uint32_t u32, et;
        uint64_t u64, n;
        int32_t i32;
        float f;
        bool b;
        const char *s;
        size_t len;
        if (kvf_gguf_get_type(g, key, &et) != 0 || et != type) abort();
        if (kvf_gguf_get_u32(g, key, &u32) == 0) sink += u32;
        if (kvf_gguf_get_u64(g, key, &u64) == 0) sink += u64;
        if (kvf_gguf_get_i32(g, key, &i32) == 0) sink += (uint64_t)i32;
        if (kvf_gguf_get_f32(g, key, &f) == 0) sink += (uint64_t)(f == f);
        if (kvf_gguf_get_bool(g, key, &b) == 0) sink += b;
        if (kvf_gguf_get_str(g, key, &s, &len) == 0 && len) sink += (uint8_t)s[len - 1];
        if (kvf_gguf_get_arr(g, key, &et, &n) == 0 && n > 0) {
            uint64_t idx[2] = {0, n - 1};
            for (int j = 0; j < 2; j++) {
                if (kvf_gguf_get_arr_str(g, key, idx[j], &s, &len) == 0 && len)
                    sink += (uint8_t)s[len - 1];
                if (kvf_gguf_get_arr_f32(g, key, idx[j], &f) == 0) sink += (uint64_t)(f == f);
                if (kvf_gguf_get_arr_i32(g, key, idx[j], &i32) == 0) sink += (uint64_t)i32;
            }
            if (kvf_gguf_get_arr_i32(g, key, n, &i32) != -ERANGE) abort();
        }
    }
}

static void walk_tensors(const kvf_gguf_t *g)
{
    for (uint64_t i = 0; i < kvf_gguf_n_tensors(g); i++) {
        const struct kvf_gguf_tensor *t = kvf_gguf_tensor_at(g, i);
        if (kvf_gguf_find_tensor(g, t->name) != t) abort();
        uint64_t row_bytes, rows = t->ne[1] * t->ne[2] * t->ne[3];
        if (kvf_quant_row_bytes(t->type, t->ne[0], &row_bytes) != 0) abort();
        if (row_bytes * rows != t->n_bytes) abort();
        if (t->ne[0] > (1u << 16)) continue; /* bound the scratch row */
        float *row = malloc(t->ne[0] * sizeof *row);
        if (!row) continue;
        const uint8_t *p = t->data;
        if (kvf_dequant_row(t->type, p, row, t->ne[0]) != 0) abort();
        if (kvf_dequant_row(t->type, p + (rows - 1) * row_bytes, row, t->ne[0]) != 0) abort();
        sink += (uint64_t)(row[0] == row[0]);
        free(row);
    }
}

static void walk_tokenizer(const kvf_gguf_t *g)
{
    kvf_tokenizer_t *t;
    char err[128];
    if (kvf_tokenizer_create(g, &t, err, sizeof err) != 0) return;
    static const char text[] = "Hello w\xc3\xb6rld \xe2\x9c\x93 \xf0\x9f\x98\x80 <s> 42";
    int32_t ids[256];
    int n = kvf_tokenizer_encode(t, text, sizeof text - 1, true, ids, 256);
    if (n < 0 || n > 256) abort();
    static char out[KVF_DETOK_MAX_OUT];
    struct kvf_detok d;
    kvf_detok_init(&d);
    for (int i = 0; i < n; i++)
        sink += kvf_detok_push(&d, t, ids[i], out, sizeof out);
    uint32_t nv = kvf_tokenizer_n_vocab(t);
    for (uint32_t i = 0; i < nv && i < 512; i++) {
        sink += kvf_detok_push(&d, t, (int32_t)i, out, sizeof out);
        size_t len;
        if (!kvf_tokenizer_piece(t, (int32_t)i, &len)) abort();
    }
    sink += kvf_detok_finish(&d, out, sizeof out);
    kvf_tokenizer_destroy(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_gguf_t *g;
    char err[256];
    if (kvf_gguf_open_mem(data, size, &g, err, sizeof err) != 0) return 0;
    walk_keys(g);
    walk_tensors(g);
    walk_tokenizer(g);
    kvf_gguf_close(g);
    return 0;
}
