/*
 * fuzz_tokenizer.c — the tokenizers (src/text/tokenizer.c, bpe.c, bpe_pre.c) and the streaming
 * detokenizer against arbitrary text, the one input every client controls.
 *
 * Five small vocabularies are built once, in memory, the way converted GGUF files carry them:
 * SentencePiece (byte fallback) and byte-level BPE with each pre-tokenizer kvfence reads
 * (gpt2, llama-bpe, qwen2, smollm), with merges, control tokens and a user-defined token.
 * Input: byte 0 picks the vocabulary (its low 7 bits modulo 5: SentencePiece, gpt2, llama-bpe,
 * qwen2, smollm) and whether special tokens are parsed (its top bit); the rest is
 * the text. Every encode must
 *   - return -EILSEQ exactly when the text is not valid UTF-8, else the same count whatever
 *     room it is given, every id in the vocabulary;
 *   - decode, token by token through kvf_detok, to valid UTF-8;
 *   - and decode back to the text itself where the tokenizer is lossless: byte-level BPE other
 *     than qwen2 (which NFC-normalizes), SentencePiece for text without U+2581, in both cases
 *     when no control token was parsed.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz/fuzz_utf8.h"
#include "kvfence/gguf.h"
#include "kvfence/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { V_SPM, V_GPT2, V_LLAMA3, V_QWEN2, V_SMOLLM, N_VOCABS };
static kvf_tokenizer_t *toks[N_VOCABS];

/* GPT-2's byte alphabet: byte b as the UTF-8 of its code point. */
static size_t byte_char(unsigned b, char *out)
{
    unsigned cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        unsigned k = 0; /* the rank of b among the bytes that are not themselves */
        for (unsigned x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

#define MAX_V 400
struct vocab {
    char *text[MAX_V];
    int32_t type[MAX_V];
    float score[MAX_V];
    size_t n;
};

static void push(struct vocab *v, const char *s, int32_t type, float score)
{
    if (v->n == MAX_V || !(v->text[v->n] = strdup(s))) abort();
    v->type[v->n] = type;
    v->score[v->n] = score;
    v->n++;
}

/* Writes the vocabulary into a GGUF file, reads it back and builds its tokenizer. */
static kvf_tokenizer_t *build(struct vocab *v, const char *pre, const char *const *merges,
                              size_t n_merges)
{
    char path[] = "/tmp/kvf-fuzz-tokenizer-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) abort();
    close(fd);
    kvf_gguf_writer_t *w;
    char err[256] = "";
    int rc = kvf_gguf_writer_create(0, &w);
    bool spm = pre == NULL;
    if (rc == 0)
        rc =
            kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2", spm ? 5 : 4);
    if (rc == 0 && !spm) rc = kvf_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre, strlen(pre));
    if (rc == 0)
        rc = kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->text,
                                         NULL, v->n);
    if (rc == 0) rc = kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", v->type, v->n);
    if (rc == 0 && spm)
        rc = kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", v->score, v->n);
    if (rc == 0 && !spm)
        rc = kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL, n_merges);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", spm ? 1 : 0);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", spm ? 2 : 1);
    if (rc == 0 && spm) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (rc == 0) rc = kvf_gguf_writer_write(w, path, err, sizeof err);
    kvf_gguf_writer_destroy(w);
    kvf_gguf_t *g = NULL;
    kvf_tokenizer_t *t = NULL;
    if (rc == 0) rc = kvf_gguf_open(path, &g, err, sizeof err);
    if (rc == 0) rc = kvf_tokenizer_create(g, &t, err, sizeof err);
    if (g) kvf_gguf_close(g);
    unlink(path);
    if (rc != 0) {
        fprintf(stderr, "fuzz_tokenizer: building the %s vocabulary: %s\n",
                spm ? "SentencePiece" : pre, err);
        abort();
    }
    for (size_t i = 0; i < v->n; i++)
        free(v->text[i]);
    v->n = 0;
    return t;
}

static void init(void)
{
    static struct vocab v;
    /* SentencePiece: unk, bos, eos, the 256 byte tokens, then pieces with scores. */
    push(&v, "<unk>", KVF_TOKEN_UNKNOWN, 0);
    push(&v, "<s>", KVF_TOKEN_CONTROL, 0);
    push(&v, "</s>", KVF_TOKEN_CONTROL, 0);
    for (unsigned b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        push(&v, s, KVF_TOKEN_BYTE, 0);
    }
    static const char *const spm_pieces[] = {"\xe2\x96\x81",
                                             "\xe2\x96\x81t",
                                             "\xe2\x96\x81the",
                                             "he",
                                             "th",
                                             "e",
                                             "t",
                                             "h",
                                             "a",
                                             "n",
                                             "an",
                                             "\xe2\x96\x81\x61",
                                             "1",
                                             "2",
                                             "12",
                                             "\xe2\x96\x81\xe2\x96\x81",
                                             "\xc3\xa9",
                                             "\xe6\xbc\xa2",
                                             "in",
                                             "ing",
                                             "\xe2\x96\x81in",
                                             "r",
                                             "er",
                                             "o",
                                             "on",
                                             "\n",
                                             "\xf0\x9f\x98\x80"};
    for (size_t i = 0; i < sizeof spm_pieces / sizeof *spm_pieces; i++)
        push(&v, spm_pieces[i], KVF_TOKEN_NORMAL, -(float)i);
    toks[V_SPM] = build(&v, NULL, NULL, 0);

    /* Byte-level BPE: control tokens, the 256 byte characters, merged pieces, added tokens. */
    static const char *const merges[] = {"\xc4\xa0 t",
                                         "h e",
                                         "\xc4\xa0t he",
                                         "i n",
                                         "in g",
                                         "e r",
                                         "1 2",
                                         "\xc4\xa0 \xc4\xa0",
                                         "\xc4\xa0 a",
                                         "a n",
                                         "\xc4\x8a \xc4\x8a",
                                         "\xc3\x83 \xc2\xa9",
                                         "' s",
                                         "o n",
                                         "\xc4\xa0 1"};
    static const char *const merged[] = {"\xc4\xa0t",
                                         "he",
                                         "\xc4\xa0the",
                                         "in",
                                         "ing",
                                         "er",
                                         "12",
                                         "\xc4\xa0\xc4\xa0",
                                         "\xc4\xa0\x61",
                                         "an",
                                         "\xc4\x8a\xc4\x8a",
                                         "\xc3\x83\xc2\xa9",
                                         "'s",
                                         "on",
                                         "\xc4\xa0\x31"};
    static const char *const pres[] = {"gpt2", "llama-bpe", "qwen2", "smollm"};
    for (int k = 0; k < 4; k++) {
        push(&v, "<|endoftext|>", KVF_TOKEN_CONTROL, 0);
        push(&v, "<|im_end|>", KVF_TOKEN_CONTROL, 0);
        for (unsigned b = 0; b < 256; b++) {
            char s[4] = {0};
            byte_char(b, s);
            push(&v, s, KVF_TOKEN_NORMAL, 0);
        }
        for (size_t i = 0; i < sizeof merged / sizeof *merged; i++)
            push(&v, merged[i], KVF_TOKEN_NORMAL, 0);
        push(&v, "<tool>", KVF_TOKEN_USER_DEFINED, 0);
        toks[V_GPT2 + k] = build(&v, pres[k], merges, sizeof merges / sizeof *merges);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!toks[0]) init();
    if (size < 1 || size > 4096) return 0;
    unsigned which = (data[0] & 0x7f) % N_VOCABS;
    bool special = data[0] & 0x80;
    const kvf_tokenizer_t *t = toks[which];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    unsigned flags = special ? KVF_TOKENIZE_PARSE_SPECIAL : 0;
    int n = kvf_tokenizer_encode_ex(t, text, len, flags, NULL, 0);
    if (!fuzz_utf8_valid(data + 1, len, true)) {
        if (n != -EILSEQ) abort();
        return 0;
    }
    if (n < 0) abort();
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) return 0;
    /* Less room gives the same count and the same first ids. */
    if (n > 1) {
        int m = kvf_tokenizer_encode_ex(t, text, len, flags, ids, (size_t)n / 2);
        if (m != n) abort();
    }
    int32_t *half = n > 1 ? malloc((size_t)n / 2 * sizeof *half) : NULL;
    if (half) memcpy(half, ids, (size_t)n / 2 * sizeof *half);
    if (kvf_tokenizer_encode_ex(t, text, len, flags, ids, (size_t)n) != n) abort();
    if (half && memcmp(half, ids, (size_t)n / 2 * sizeof *half) != 0) abort();
    free(half);
    uint32_t n_vocab = kvf_tokenizer_n_vocab(t);
    bool control = false;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= n_vocab) abort();
        int type = kvf_tokenizer_type(t, ids[i]);
        if (type == KVF_TOKEN_CONTROL || type == KVF_TOKEN_UNKNOWN) control = true;
    }
    /* Every byte has a token, and user text never becomes a control token. */
    if (control && !special) abort();
    /* Decode token by token. */
    char *out = malloc((size_t)n * KVF_DETOK_MAX_OUT + 4);
    if (!out) {
        free(ids);
        return 0;
    }
    size_t o = 0;
    struct kvf_detok d;
    kvf_detok_init(&d);
    d.strip_space = which == V_SPM;
    for (int i = 0; i < n; i++)
        o += kvf_detok_push(&d, t, ids[i], out + o, KVF_DETOK_MAX_OUT);
    o += kvf_detok_finish(&d, out + o, 3);
    if (!fuzz_utf8_valid((const uint8_t *)out, o, true)) abort();
    bool lossless =
        !control && which != V_QWEN2 && !(which == V_SPM && memmem(text, len, "\xe2\x96\x81", 3));
    if (lossless && (o != len || memcmp(out, text, len) != 0)) abort();
    free(out);
    free(ids);
    return 0;
}
