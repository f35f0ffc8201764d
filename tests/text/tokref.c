/* tokref: the C side of the tokenizer reference check (check_tokenizers.mjs runs it).
 *
 *   tokref mkvocab DIR PRE OUT.gguf
 *       Builds a GGUF file from DIR/tokenizer.json and DIR/tokenizer_config.json (a Hugging Face
 *       tokenizer): its vocabulary, merges, added tokens and chat template, written the way
 *       llama.cpp's converter writes them (model tokens NORMAL, added special tokens CONTROL,
 *       other added tokens USER_DEFINED; a SentencePiece vocabulary's byte pieces BYTE and its
 *       scores minus the id), with tokenizer.ggml.pre = PRE ("-" for a SentencePiece
 *       vocabulary), and a one-layer Llama of width 64 with small random weights.
 *   tokref encode FILE.gguf CORPUS.json [special]
 *       Encodes each string of the JSON array CORPUS (no BOS; control tokens parsed when
 *       "special" is given) and prints one line per string: its ids, space-separated, then a
 *       tab and the streaming detokenizer's text of those ids as a JSON string.
 *   tokref render TEMPLATE.txt CONVS.json BOS EOS
 *       Renders the chat template over each conversation of CONVS (an array of {"messages":
 *       [{"role", "content"}...], "add_generation_prompt": bool}) and prints one line each: the
 *       output as a JSON string, or "error: " and the explanation.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/text.h"

static int fail(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "tokref: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 1;
}

static json_t *load(const char *dir, const char *name, size_t flags)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t e;
    json_t *j = json_load_file(path, flags, &e);
    if (!j) fprintf(stderr, "tokref: %s: %s (line %d)\n", path, e.text, e.line);
    return j;
}

/* A special-token field of tokenizer_config.json: a string, {"content": ...}, or null. */
static const char *token_text(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

struct vocab {
    size_t n;
    const char **text; /* [n] */
    int32_t *type;     /* [n] */
    float *score;      /* [n] */
};

static int32_t find_id(const struct vocab *v, const char *s)
{
    for (size_t i = 0; s && i < v->n; i++)
        if (v->text[i] && strcmp(v->text[i], s) == 0) return (int32_t)i;
    return -1;
}

/* Tiny deterministic weights: each value uniform in ±amp. */
static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float rnd(float amp)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return amp * ((float)(rng_state >> 40) / 8388608.0f - 1.0f);
}

static int gen_row(void *ctx, uint64_t row, void *dst, size_t row_bytes)
{
    float amp = *(const float *)ctx;
    float *x = dst;
    (void)row;
    for (size_t i = 0; i < row_bytes / sizeof *x; i++)
        x[i] = amp == 0.0f ? 1.0f : rnd(amp);
    return 0;
}

static int add_weights(kvf_gguf_writer_t *w, uint32_t n_vocab)
{
    enum { DIM = 64, HEADS = 4, KV_HEADS = 2, FFN = 172 };
    static const float one = 0.0f, small = 0.05f, embd = 0.5f;
    const uint32_t kv = DIM / HEADS * KV_HEADS;
    int rc = kvf_gguf_writer_add_str(w, "general.architecture", "llama", 5);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.vocab_size", n_vocab);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.context_length", 2048);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.embedding_length", DIM);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.block_count", 1);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.feed_forward_length", FFN);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.attention.head_count", HEADS);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.attention.head_count_kv", KV_HEADS);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.rope.dimension_count", DIM / HEADS);
    if (rc == 0) rc = kvf_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f);
    if (rc == 0) rc = kvf_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    struct {
        const char *name;
        uint64_t ne0, ne1;
        const float *amp;
    } t[] = {
        {"token_embd.weight", DIM, n_vocab, &embd},     {"output_norm.weight", DIM, 0, &one},
        {"blk.0.attn_norm.weight", DIM, 0, &one},       {"blk.0.attn_q.weight", DIM, DIM, &small},
        {"blk.0.attn_k.weight", DIM, kv, &small},       {"blk.0.attn_v.weight", DIM, kv, &small},
        {"blk.0.attn_output.weight", DIM, DIM, &small}, {"blk.0.ffn_norm.weight", DIM, 0, &one},
        {"blk.0.ffn_gate.weight", DIM, FFN, &small},    {"blk.0.ffn_up.weight", DIM, FFN, &small},
        {"blk.0.ffn_down.weight", FFN, DIM, &small},
    };
    for (size_t i = 0; rc == 0 && i < sizeof t / sizeof t[0]; i++) {
        uint64_t ne[2] = {t[i].ne0, t[i].ne1};
        rc = kvf_gguf_writer_add_tensor(w, t[i].name, KVF_GGML_F32, t[i].ne1 ? 2 : 1, ne, NULL,
                                        gen_row, (void *)t[i].amp);
    }
    return rc;
}

static int mkvocab(const char *dir, const char *pre, const char *out)
{
    /* model_max_length may be 1e30 written as an integer: the config's numbers are read as reals.
     */
    json_t *tj = load(dir, "tokenizer.json", 0);
    json_t *cfg = load(dir, "tokenizer_config.json", JSON_DECODE_INT_AS_REAL);
    if (!tj || !cfg) return 1;
    json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges"), *added = json_object_get(tj, "added_tokens");
    if (!json_is_object(vocab) || !json_is_array(merges) || !json_is_array(added))
        return fail("%s: no model.vocab, model.merges or added_tokens%s", dir, "");
    bool spm = strcmp(pre, "-") == 0;
    /* The vocabulary's size: one past the highest id. */
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) if ((size_t)json_integer_value(val) + 1 > n) n =
        (size_t)json_integer_value(val) + 1;
    size_t i;
    json_array_foreach(added, i, val)
    {
        size_t id = (size_t)json_integer_value(json_object_get(val, "id"));
        if (id + 1 > n) n = id + 1;
    }
    struct vocab v = {n, calloc(n, sizeof(char *)), calloc(n, sizeof(int32_t)),
                      calloc(n, sizeof(float))};
    char **pads = calloc(n, sizeof(char *));
    if (!v.text || !v.type || !v.score || !pads) return fail("out of memory%s%s", "", "");
    json_object_foreach(vocab, key, val)
    {
        size_t id = (size_t)json_integer_value(val);
        v.text[id] = key;
        v.type[id] = KVF_TOKEN_NORMAL;
        v.score[id] = spm ? -1e9f : 0.0f; /* pieces no merge makes; merged ones below */
        if (spm && strlen(key) == 6 && strncmp(key, "<0x", 3) == 0 && key[5] == '>')
            v.type[id] = KVF_TOKEN_BYTE;
    }
    json_array_foreach(added, i, val)
    {
        size_t id = (size_t)json_integer_value(json_object_get(val, "id"));
        v.text[id] = json_string_value(json_object_get(val, "content"));
        v.type[id] = json_is_true(json_object_get(val, "special")) ? KVF_TOKEN_CONTROL
                                                                   : KVF_TOKEN_USER_DEFINED;
        v.score[id] = 0.0f;
    }
    /* A SentencePiece vocabulary's scores are not in tokenizer.json, but its merges were listed
     * best score first: a piece's score is minus the rank of the first merge that makes it. */
    json_array_foreach(merges, i, val)
    {
        if (!spm) break;
        char buf[1024];
        const char *m = json_string_value(val);
        const char *sp = m ? strchr(m + (m[0] != 0), ' ') : NULL;
        if (!sp || strlen(m) >= sizeof buf) return fail("bad merge '%s'%s", m ? m : "?", "");
        memcpy(buf, m, (size_t)(sp - m));
        strcpy(buf + (sp - m), sp + 1);
        json_t *id = json_object_get(vocab, buf);
        if (id && v.score[json_integer_value(id)] == -1e9f)
            v.score[json_integer_value(id)] = -(float)i;
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    int32_t unk_id = find_id(&v, unk);
    if (unk_id >= 0) v.type[unk_id] = KVF_TOKEN_UNKNOWN;
    for (i = 0; i < n; i++) {
        if (v.text[i]) continue;
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%zu]", i);
        v.text[i] = pads[i] = strdup(buf);
        v.type[i] = KVF_TOKEN_UNUSED;
        if (!pads[i]) return fail("out of memory%s%s", "", "");
    }
    kvf_gguf_writer_t *w;
    int rc = kvf_gguf_writer_create(0, &w);
    if (rc == 0) rc = add_weights(w, (uint32_t)n);
    if (rc == 0)
        rc =
            kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2", spm ? 5 : 4);
    if (rc == 0 && !spm) rc = kvf_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre, strlen(pre));
    if (rc == 0) rc = kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", v.text, NULL, n);
    if (rc == 0) rc = kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", v.type, n);
    if (rc == 0 && spm) rc = kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", v.score, n);
    if (rc == 0 && !spm) {
        size_t nm = json_array_size(merges);
        char **ms = calloc(nm ? nm : 1, sizeof *ms);
        if (!ms) return fail("out of memory%s%s", "", "");
        json_array_foreach(merges, i, val)
        {
            if (json_is_string(val)) {
                ms[i] = strdup(json_string_value(val));
            } else {
                const char *a = json_string_value(json_array_get(val, 0));
                const char *b = json_string_value(json_array_get(val, 1));
                size_t la = a ? strlen(a) : 0, lb = b ? strlen(b) : 0;
                if (!a || !b || !(ms[i] = malloc(la + lb + 2)))
                    return fail("bad merge%s%s", "", "");
                memcpy(ms[i], a, la);
                ms[i][la] = ' ';
                memcpy(ms[i] + la + 1, b, lb + 1);
            }
            if (!ms[i]) return fail("out of memory%s%s", "", "");
        }
        rc = kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)ms, NULL,
                                         nm);
        for (i = 0; i < nm; i++)
            free(ms[i]);
        free(ms);
    }
    int32_t bos = find_id(&v, token_text(cfg, "bos_token"));
    int32_t eos = find_id(&v, token_text(cfg, "eos_token"));
    int32_t pad = find_id(&v, token_text(cfg, "pad_token"));
    if (rc == 0 && bos >= 0)
        rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (rc == 0 && eos >= 0)
        rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (rc == 0 && unk_id >= 0)
        rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk_id);
    if (rc == 0 && pad >= 0)
        rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    if (rc == 0)
        rc = kvf_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token",
                                      json_is_true(json_object_get(cfg, "add_bos_token")));
    const char *tmpl = json_string_value(json_object_get(cfg, "chat_template"));
    if (rc == 0 && tmpl)
        rc = kvf_gguf_writer_add_str(w, "tokenizer.chat_template", tmpl, strlen(tmpl));
    char err[256] = "";
    if (rc == 0) rc = kvf_gguf_writer_write(w, out, err, sizeof err);
    kvf_gguf_writer_destroy(w);
    for (i = 0; i < n; i++)
        free(pads[i]);
    free(pads);
    free(v.text);
    free(v.type);
    free(v.score);
    json_decref(tj);
    json_decref(cfg);
    if (rc < 0) return fail("writing %s: %s", out, err[0] ? err : kvf_strerror(rc));
    return 0;
}

static int encode(const char *path, const char *corpus_path, bool special)
{
    char err[256];
    kvf_gguf_t *g;
    kvf_tokenizer_t *t;
    int rc = kvf_gguf_open(path, &g, err, sizeof err);
    if (rc < 0) return fail("%s: %s", path, err);
    rc = kvf_tokenizer_create(g, &t, err, sizeof err);
    kvf_gguf_close(g);
    if (rc < 0) return fail("%s: %s", path, err);
    json_error_t je;
    json_t *corpus = json_load_file(corpus_path, JSON_ALLOW_NUL, &je);
    if (!json_is_array(corpus)) {
        kvf_tokenizer_destroy(t);
        return fail("%s: %s", corpus_path, je.text);
    }
    size_t i;
    json_t *val;
    json_array_foreach(corpus, i, val)
    {
        const char *s = json_string_value(val);
        size_t len = json_string_length(val);
        unsigned flags = special ? KVF_TOKENIZE_PARSE_SPECIAL : 0;
        int n = kvf_tokenizer_encode_ex(t, s, len, flags, NULL, 0);
        int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
        if (n < 0 || (n > 0 && !ids) ||
            (n > 0 && kvf_tokenizer_encode_ex(t, s, len, flags, ids, (size_t)n) != n)) {
            printf("error %s\t\"\"\n", kvf_strerror(n < 0 ? n : -ENOMEM));
            free(ids); /* the line's "error" cannot match the reference's ids */
            continue;
        }
        char *text = malloc((size_t)n * KVF_DETOK_MAX_OUT + 4);
        if (!text) return fail("out of memory%s%s", "", "");
        struct kvf_detok d;
        kvf_detok_init(&d);
        size_t m = 0;
        for (int k = 0; k < n; k++) {
            printf(k ? " %d" : "%d", ids[k]);
            m += kvf_detok_push(&d, t, ids[k], text + m, KVF_DETOK_MAX_OUT);
        }
        m += kvf_detok_finish(&d, text + m, 4);
        json_t *js = json_stringn(text, m);
        char *dump = json_dumps(js, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
        printf("\t%s\n", dump ? dump : "null");
        free(dump);
        json_decref(js);
        free(text);
        free(ids);
    }
    json_decref(corpus);
    kvf_tokenizer_destroy(t);
    return 0;
}

static int render(const char *tmpl_path, const char *convs_path, const char *bos, const char *eos)
{
    FILE *f = fopen(tmpl_path, "rb");
    if (!f) return fail("%s: %s", tmpl_path, strerror(errno));
    static char tmpl[1 << 20];
    size_t n = fread(tmpl, 1, sizeof tmpl - 1, f);
    fclose(f);
    tmpl[n] = '\0';
    json_error_t je;
    json_t *convs = json_load_file(convs_path, 0, &je);
    if (!json_is_array(convs)) return fail("%s: %s", convs_path, je.text);
    size_t i;
    json_t *conv;
    json_array_foreach(convs, i, conv)
    {
        json_t *msgs = json_object_get(conv, "messages");
        size_t k, m = json_array_size(msgs);
        struct kvf_chat_msg *cm = calloc(m ? m : 1, sizeof *cm);
        if (!cm) return fail("out of memory%s%s", "", "");
        json_t *msg;
        json_array_foreach(msgs, k, msg)
        {
            cm[k].role = json_string_value(json_object_get(msg, "role"));
            cm[k].content = json_string_value(json_object_get(msg, "content"));
        }
        char *out = NULL, err[256];
        int rc = kvf_template_render(tmpl, cm, m,
                                     json_is_true(json_object_get(conv, "add_generation_prompt")),
                                     bos, eos, &out, err, sizeof err);
        if (rc < 0) {
            printf("error: %s\n", err);
        } else {
            json_t *js = json_stringn(out, (size_t)rc);
            char *dump = json_dumps(js, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
            printf("%s\n", dump ? dump : "null");
            free(dump);
            json_decref(js);
        }
        free(out);
        free(cm);
    }
    json_decref(convs);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "render") == 0)
        return render(argv[2], argv[3], argv[4], argv[5]);
    if (argc == 5 && strcmp(argv[1], "mkvocab") == 0) return mkvocab(argv[2], argv[3], argv[4]);
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "encode") == 0)
        return encode(argv[2], argv[3], argc == 5 && strcmp(argv[4], "special") == 0);
    fprintf(stderr, "usage: tokref mkvocab DIR PRE OUT.gguf | tokref encode FILE.gguf CORPUS.json "
                    "[special]\n");
    return 2;
}
