/* The SentencePiece tokenizer: merges by score on hand-made vocabularies, byte fallback,
 * encode/decode round trips of random UTF-8 (multibyte characters split across byte tokens),
 * detokenizer output always valid UTF-8, and vocabularies that must be refused. */
#include "gguf/gguf_test_util.h"
#include "kvf_test.h"

#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/text.h"
#include "text/tokenizer_internal.h"
#include "text/unicode.h"

#define SP "\xe2\x96\x81" /* U+2581 */

/* A vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then `extra` normal pieces. */
struct vocab {
    const char *model;
    const char *pieces[32];
    float scores[32];
    size_t n_pieces;
    int add_space_prefix; /* -1: key absent */
    bool with_bytes;
};

static kvf_gguf_t *build_vocab(const struct vocab *v, void (*extra)(kvf_gguf_writer_t *))
{
    size_t n = 3 + (v->with_bytes ? 256 : 0) + v->n_pieces;
    const char **toks = calloc(n, sizeof *toks);
    char(*bytes)[8] = calloc(256, 8);
    float *scores = calloc(n, sizeof *scores);
    int32_t *types = calloc(n, sizeof *types);
    ASSERT_TRUE(toks && bytes && scores && types);
    size_t i = 0;
    toks[i] = "<unk>", types[i++] = KVF_TOKEN_UNKNOWN;
    toks[i] = "<s>", types[i++] = KVF_TOKEN_CONTROL;
    toks[i] = "</s>", types[i++] = KVF_TOKEN_CONTROL;
    for (int b = 0; v->with_bytes && b < 256; b++) {
        snprintf(bytes[b], 8, "<0x%02X>", b);
        toks[i] = bytes[b], types[i++] = KVF_TOKEN_BYTE;
    }
    for (size_t k = 0; k < v->n_pieces; k++) {
        scores[i] = v->scores[k];
        toks[i] = v->pieces[k], types[i++] = KVF_TOKEN_NORMAL;
    }
    kvf_gguf_writer_t *w;
    ASSERT_OK(kvf_gguf_writer_create(0, &w));
    ASSERT_OK(kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", v->model, strlen(v->model)));
    ASSERT_OK(kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, n));
    ASSERT_OK(kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, n));
    ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, n));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    if (v->add_space_prefix >= 0)
        ASSERT_OK(kvf_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix",
                                           v->add_space_prefix != 0));
    if (extra) extra(w);
    char path[512], err[256];
    scratch_path(path, sizeof path, "vocab.gguf");
    ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
    kvf_gguf_writer_destroy(w);
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    unlink(path);
    free(toks);
    free(bytes);
    free(scores);
    free(types);
    return g;
}

static kvf_tokenizer_t *make_tok(const struct vocab *v)
{
    kvf_gguf_t *g = build_vocab(v, NULL);
    kvf_tokenizer_t *t;
    char err[256];
    ASSERT_OK(kvf_tokenizer_create(g, &t, err, sizeof err));
    kvf_gguf_close(g); /* the tokenizer keeps its own copy */
    return t;
}

/* The id of a normal piece of v (after the specials and byte tokens). */
static int32_t piece_id(const struct vocab *v, const char *piece)
{
    for (size_t k = 0; k < v->n_pieces; k++)
        if (strcmp(v->pieces[k], piece) == 0) return (int32_t)(3 + (v->with_bytes ? 256 : 0) + k);
    KVF_FAIL("no piece %s", piece);
}

static void expect_ids(const kvf_tokenizer_t *t, const char *text, bool bos, const int32_t *want,
                       size_t n_want)
{
    int32_t out[64];
    int n = kvf_tokenizer_encode(t, text, strlen(text), bos, out, 64);
    if (n != (int)n_want) KVF_FAIL("'%s': %d tokens, want %zu", text, n, n_want);
    for (size_t i = 0; i < n_want; i++)
        if (out[i] != want[i]) KVF_FAIL("'%s': token %zu is %d, want %d", text, i, out[i], want[i]);
}

/* Decodes ids through a fresh detokenizer into a NUL-terminated string. */
static size_t detok_all(const kvf_tokenizer_t *t, const int32_t *ids, size_t n, bool strip,
                        char *out, size_t cap)
{
    struct kvf_detok d;
    kvf_detok_init(&d);
    d.strip_space = strip;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        ASSERT_TRUE(cap - len >= KVF_DETOK_MAX_OUT);
        len += kvf_detok_push(&d, t, ids[i], out + len, cap - len);
    }
    len += kvf_detok_finish(&d, out + len, cap - len);
    out[len] = '\0';
    return len;
}

static void test_merge_by_score(void)
{
    struct vocab v = {.model = "llama",
                      .pieces = {"a", "b", "c", "ab", "bc", "abc"},
                      .scores = {0, 0, 0, -1, -2, -5},
                      .n_pieces = 5,
                      .add_space_prefix = 0,
                      .with_bytes = true};
    kvf_tokenizer_t *t = make_tok(&v);
    int32_t a = piece_id(&v, "a"), c = piece_id(&v, "c"), ab = piece_id(&v, "ab"),
            bc = piece_id(&v, "bc");
    expect_ids(t, "abc", false, (int32_t[]){ab, c}, 2); /* ab scores higher than bc */
    expect_ids(t, "abc", true, (int32_t[]){1, ab, c}, 3);
    expect_ids(t, "abcz", false, (int32_t[]){ab, c, 3 + 'z'}, 3); /* z: byte fallback */
    /* "<s>" in text is characters, never the control token. */
    expect_ids(t, "<s>", false, (int32_t[]){3 + '<', 3 + 's', 3 + '>'}, 3);
    expect_ids(t, "", true, (int32_t[]){1}, 1);
    expect_ids(t, "", false, NULL, 0);
    kvf_tokenizer_destroy(t);

    v.scores[4] = 0.5f; /* now bc wins */
    t = make_tok(&v);
    expect_ids(t, "abc", false, (int32_t[]){a, bc}, 2);
    kvf_tokenizer_destroy(t);

    v.scores[4] = -1.0f; /* a tie: the leftmost pair merges first */
    t = make_tok(&v);
    expect_ids(t, "abc", false, (int32_t[]){ab, c}, 2);
    kvf_tokenizer_destroy(t);

    v.n_pieces = 6; /* "abc" is reachable from ab + c */
    t = make_tok(&v);
    expect_ids(t, "abcabc", false, (int32_t[]){piece_id(&v, "abc"), piece_id(&v, "abc")}, 2);
    kvf_tokenizer_destroy(t);
    scratch_done();
}

static void test_space_prefix_and_words(void)
{
    struct vocab v = {.model = "llama",
                      .pieces = {SP, "h", "e", "l", "o", SP "h", "he", "ll", "llo", "hello",
                                 SP "hello", SP "he", SP "w", "or", SP "wor", "ld", SP "world"},
                      .scores = {-9, -9, -9, -9, -9, -3, -4, -2, -1.5f, -1, -0.5f, -2.5f, -3, -2,
                                 -1.5f, -2, -0.5f},
                      .n_pieces = 17,
                      .add_space_prefix = -1,
                      .with_bytes = true};
    kvf_tokenizer_t *t = make_tok(&v);
    int32_t hello = piece_id(&v, SP "hello"), world = piece_id(&v, SP "world");
    expect_ids(t, "hello", false, (int32_t[]){hello}, 1);
    expect_ids(t, "hello world", true, (int32_t[]){1, hello, world}, 3);
    expect_ids(t, "hello!", false, (int32_t[]){hello, 3 + '!'}, 2);
    int32_t ids[8];
    int n = kvf_tokenizer_encode(t, "hello world", 11, false, ids, 8);
    ASSERT_EQ_INT(n, 2);
    char out[4 * KVF_DETOK_MAX_OUT];
    detok_all(t, ids, (size_t)n, false, out, sizeof out);
    ASSERT_STREQ(out, " hello world");
    detok_all(t, ids, (size_t)n, true, out, sizeof out);
    ASSERT_STREQ(out, "hello world");
    kvf_tokenizer_destroy(t);
    scratch_done();
}

/* mkmodel's byte-level vocabulary: every text becomes byte tokens. */
static kvf_tokenizer_t *tiny_tok(void)
{
    char path[512], err[256];
    scratch_path(path, sizeof path, "tiny.gguf");
    ASSERT_OK(kvf_mkmodel_write(path, kvf_mkmodel_shape_by_name("tiny"), KVF_GGML_Q8_0, 1, err,
                                sizeof err));
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    kvf_tokenizer_t *t;
    ASSERT_OK(kvf_tokenizer_create(g, &t, err, sizeof err));
    kvf_gguf_close(g);
    unlink(path);
    return t;
}

static void test_byte_vocab(void)
{
    kvf_tokenizer_t *t = tiny_tok();
    ASSERT_EQ_INT(kvf_tokenizer_n_vocab(t), 512);
    ASSERT_EQ_INT(kvf_tokenizer_bos(t), 1);
    ASSERT_EQ_INT(kvf_tokenizer_eos(t), 2);
    ASSERT_EQ_INT(kvf_tokenizer_unk(t), 0);
    ASSERT_EQ_INT(kvf_tokenizer_type(t, 3), KVF_TOKEN_BYTE);
    ASSERT_EQ_INT(kvf_tokenizer_type(t, 600), 0);
    size_t len;
    ASSERT_STREQ(kvf_tokenizer_piece(t, 3 + 0x41, &len), "<0x41>");
    ASSERT_EQ_INT(len, 6);
    ASSERT_NULL(kvf_tokenizer_piece(t, 512, &len));
    ASSERT_NULL(kvf_tokenizer_piece(t, -1, &len));
    int32_t want[] = {1, 3 + 0xe2, 3 + 0x96, 3 + 0x81, 3 + 'h', 3 + 'i'};
    expect_ids(t, "hi", true, want, 6);
    /* max_out smaller than the count: the full count, only max_out written. */
    int32_t out[8];
    for (int i = 0; i < 8; i++)
        out[i] = -77;
    ASSERT_EQ_INT(kvf_tokenizer_encode(t, "hi", 2, true, out, 3), 6);
    ASSERT_TRUE(out[0] == 1 && out[2] == 3 + 0x96 && out[3] == -77);
    ASSERT_EQ_INT(kvf_tokenizer_encode(t, "hi", 2, true, NULL, 0), 6);
    /* Control and unused tokens decode to nothing, <unk> to U+FFFD, out of range to U+FFFD. */
    struct kvf_detok d;
    kvf_detok_init(&d);
    char buf[KVF_DETOK_MAX_OUT];
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 1, buf, sizeof buf), 0);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 300, buf, sizeof buf), 0);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 0, buf, sizeof buf), 3);
    ASSERT_MEMEQ(buf, "\xef\xbf\xbd", 3);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 9999, buf, sizeof buf), 3);
    ASSERT_MEMEQ(buf, "\xef\xbf\xbd", 3);
    kvf_tokenizer_destroy(t);
    scratch_done();
}

static void test_invalid_utf8_refused(void)
{
    kvf_tokenizer_t *t = tiny_tok();
    static const char *const bad[] = {
        "\xff",
        "a\x80",
        "\xc0\x80", /* overlong NUL */
        "\xe0\x80\xaf",
        "\xed\xa0\x80",     /* surrogate */
        "\xf4\x90\x80\x80", /* past U+10FFFF */
        "\xe2\x96",
        "ok\xf0\x9f\x98", /* truncated sequences */
        "\xf8\x88\x80\x80\x80",
    };
    int32_t out[4] = {-5, -5, -5, -5};
    for (size_t i = 0; i < KVF_ARRAY_LEN(bad); i++) {
        ASSERT_ERR(kvf_tokenizer_encode(t, bad[i], strlen(bad[i]), true, out, 4), -EILSEQ);
        ASSERT_EQ_INT(out[0], -5); /* failure writes nothing */
    }
    /* Embedded NUL is valid UTF-8 and is a byte like any other. */
    ASSERT_EQ_INT(kvf_tokenizer_encode(t, "a\0b", 3, false, out, 4), 6);
    ASSERT_EQ_INT(out[3], 3 + 'a');
    kvf_tokenizer_destroy(t);
    scratch_done();
}

/* ---- the heap-based merge against a naive reference ----
 * The reference rescans every adjacent pair before each merge and merges the best-scoring one
 * (leftmost on ties): quadratic, but obviously what SentencePiece's BPE does. Random small
 * vocabularies with many equal scores make the tie-breaking and the stale-pair logic matter. */

static int32_t ref_lookup(const struct vocab *v, const char *s, size_t n)
{
    for (size_t k = 0; k < v->n_pieces; k++)
        if (strlen(v->pieces[k]) == n && memcmp(v->pieces[k], s, n) == 0)
            return (int32_t)(3 + 256 + k);
    return -1;
}

static size_t ref_encode(const struct vocab *v, const char *text, size_t len, int32_t *out)
{
    size_t start[128], n[128], k = 0;
    for (size_t i = 0; i < len;) {
        size_t c = (text[i] & 0x80) ? 2 : 1; /* the test alphabet: ASCII and 2-byte characters */
        start[k] = i, n[k++] = c;
        i += c;
    }
    for (;;) {
        size_t best = SIZE_MAX;
        float best_score = 0;
        for (size_t i = 0; i + 1 < k; i++) {
            int32_t id = ref_lookup(v, text + start[i], n[i] + n[i + 1]);
            if (id < 0) continue;
            float sc = v->scores[id - 259];
            if (best == SIZE_MAX || sc > best_score) best = i, best_score = sc;
        }
        if (best == SIZE_MAX) break;
        n[best] += n[best + 1];
        memmove(start + best + 1, start + best + 2, (k - best - 2) * sizeof *start);
        memmove(n + best + 1, n + best + 2, (k - best - 2) * sizeof *n);
        k--;
    }
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        int32_t id = ref_lookup(v, text + start[i], n[i]);
        if (id >= 0) {
            out[m++] = id;
            continue;
        }
        for (size_t j = 0; j < n[i]; j++)
            out[m++] = 3 + (uint8_t)text[start[i] + j];
    }
    return m;
}

static void test_merge_matches_reference(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    static const char *const alpha[] = {"a", "b", "c", "\xc3\xa9", "z"}; /* z is never a piece */
    static char store[32][16];
    for (int voc = 0; voc < 60; voc++) {
        struct vocab v = {.model = "llama", .add_space_prefix = 0, .with_bytes = true};
        for (int i = 0; i < 4; i++) {
            v.pieces[v.n_pieces] = alpha[i];
            v.scores[v.n_pieces++] = -(float)kvf_rng_below(&r, 3);
        }
        while (v.n_pieces < 32) {
            size_t len = 0, chars = 2 + kvf_rng_below(&r, 4);
            for (size_t c = 0; c < chars; c++) {
                const char *a = alpha[kvf_rng_below(&r, 4)];
                memcpy(store[v.n_pieces] + len, a, strlen(a));
                len += strlen(a);
            }
            store[v.n_pieces][len] = '\0';
            if (ref_lookup(&v, store[v.n_pieces], len) >= 0) continue; /* no duplicates */
            v.pieces[v.n_pieces] = store[v.n_pieces];
            v.scores[v.n_pieces++] = -(float)kvf_rng_below(&r, 4);
        }
        kvf_tokenizer_t *t = make_tok(&v);
        for (int iter = 0; iter < 100; iter++) {
            char text[128];
            size_t len = 0, chars = kvf_rng_below(&r, 40);
            for (size_t c = 0; c < chars; c++) {
                const char *a = alpha[kvf_rng_below(&r, 5)];
                memcpy(text + len, a, strlen(a));
                len += strlen(a);
            }
            int32_t want[128], got[128];
            size_t nw = ref_encode(&v, text, len, want);
            int ng = kvf_tokenizer_encode(t, text, len, false, got, 128);
            if (ng != (int)nw || memcmp(got, want, nw * sizeof *got) != 0)
                KVF_FAIL("seed %llu vocab %d text '%.*s': %d tokens, reference %zu",
                         (unsigned long long)kvf_test_seed(), voc, (int)len, text, ng, nw);
        }
        kvf_tokenizer_destroy(t);
    }
    scratch_done();
}

/* Appends one random code point (1 to 4 bytes, never a surrogate) as UTF-8. */
static size_t rand_char(struct kvf_rng *r, char *s)
{
    uint32_t cp;
    switch (kvf_rng_below(r, 5)) {
    case 0:
        cp = ' ';
        break;
    case 1:
        cp = 0x20 + kvf_rng_below(r, 0x5f);
        break;
    case 2:
        cp = 0x80 + kvf_rng_below(r, 0x780);
        break;
    case 3:
        /* Not a surrogate, and not U+2581, which decodes as a space by design. */
        do
            cp = 0x800 + kvf_rng_below(r, 0xf800);
        while ((cp >= 0xd800 && cp <= 0xdfff) || cp == 0x2581);
        break;
    default:
        cp = 0x10000 + kvf_rng_below(r, 0x100000);
        break;
    }
    if (cp < 0x80) return s[0] = (char)cp, 1;
    if (cp < 0x800) return s[0] = (char)(0xc0 | cp >> 6), s[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return s[0] = (char)(0xe0 | cp >> 12), s[1] = (char)(0x80 | (cp >> 6 & 63)),
               s[2] = (char)(0x80 | (cp & 63)), 3;
    return s[0] = (char)(0xf0 | cp >> 18), s[1] = (char)(0x80 | (cp >> 12 & 63)),
           s[2] = (char)(0x80 | (cp >> 6 & 63)), s[3] = (char)(0x80 | (cp & 63)), 4;
}

static void test_roundtrip_random_utf8(void)
{
    kvf_tokenizer_t *t = tiny_tok();
    struct vocab v = {.model = "llama",
                      .pieces = {SP, "\xc3\xa9", SP "\xc3\xa9", "\xe2\x9c", "\x93", "ab", SP "a"},
                      .scores = {-1, -1, -0.5f, -2, -2, -1, -1},
                      .n_pieces = 7,
                      .add_space_prefix = -1,
                      .with_bytes = true};
    /* The second vocabulary holds pieces that split a character ("\xe2\x9c" + "\x93" is ✓),
     * so a character can arrive in two normal tokens, not only as byte tokens. */
    kvf_tokenizer_t *t2 = make_tok(&v);
    kvf_tokenizer_t *toks[2] = {t, t2};
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    char text[512], dec[512 * 8];
    int32_t ids[2048];
    for (int iter = 0; iter < 400; iter++) {
        size_t len = 0, n_chars = kvf_rng_below(&r, 40);
        for (size_t i = 0; i < n_chars; i++)
            len += rand_char(&r, text + len);
        if (iter % 7 == 0)
            len += (size_t)snprintf(text + len, 16,
                                    " \xc3\xa9\xe2\x9c\x93"
                                    "ab");
        text[len] = '\0';
        for (int k = 0; k < 2; k++) {
            int n = kvf_tokenizer_encode(toks[k], text, len, true, ids, 2048);
            ASSERT_TRUE(n >= 1 && n <= 2048);
            ASSERT_EQ_INT(ids[0], 1);
            size_t dl = detok_all(toks[k], ids, (size_t)n, true, dec, sizeof dec);
            if (dl != len || memcmp(dec, text, len) != 0)
                KVF_FAIL("'%s' became '%s': "
                         "seed %llu iter %d vocab %d: round trip differs",
                         text, dec, (unsigned long long)kvf_test_seed(), iter, k);
        }
    }
    kvf_tokenizer_destroy(t);
    kvf_tokenizer_destroy(t2);
    scratch_done();
}

static void test_detok_partial_utf8(void)
{
    kvf_tokenizer_t *t = tiny_tok();
    struct kvf_detok d;
    char buf[KVF_DETOK_MAX_OUT];
    /* 😀 = F0 9F 98 80, one byte token each: nothing until the last. */
    kvf_detok_init(&d);
    const uint8_t emoji[4] = {0xf0, 0x9f, 0x98, 0x80};
    for (int i = 0; i < 3; i++)
        ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + emoji[i], buf, sizeof buf), 0);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + emoji[3], buf, sizeof buf), 4);
    ASSERT_MEMEQ(buf, emoji, 4);
    ASSERT_EQ_INT(kvf_detok_finish(&d, buf, sizeof buf), 0);
    /* The stream ends inside a character: U+FFFD. */
    kvf_detok_init(&d);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + 0xf0, buf, sizeof buf), 0);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + 0x9f, buf, sizeof buf), 0);
    ASSERT_EQ_INT(kvf_detok_finish(&d, buf, sizeof buf), 3);
    ASSERT_MEMEQ(buf, "\xef\xbf\xbd", 3);
    ASSERT_EQ_INT(d.n_pend, 0);
    /* A character broken by an ASCII byte: U+FFFD, then the byte. */
    kvf_detok_init(&d);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + 0xe2, buf, sizeof buf), 0);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + 'a', buf, sizeof buf), 4);
    ASSERT_MEMEQ(buf,
                 "\xef\xbf\xbd"
                 "a",
                 4);
    /* A lone continuation byte, and a surrogate's lead: each U+FFFD. */
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + 0x80, buf, sizeof buf), 3);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + 0xed, buf, sizeof buf), 0);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + 0xa0, buf, sizeof buf), 6); /* ED then A0: two */
    /* A cap too small cuts at a character boundary, never inside one. */
    kvf_detok_init(&d);
    for (int i = 0; i < 3; i++)
        kvf_detok_push(&d, t, 3 + emoji[i], buf, sizeof buf);
    ASSERT_EQ_INT(kvf_detok_push(&d, t, 3 + emoji[3], buf, 2), 0);
    kvf_tokenizer_destroy(t);
    scratch_done();
}

/* Random token streams, including ids out of range: the output is always valid UTF-8. */
static void test_detok_always_valid(void)
{
    kvf_tokenizer_t *t = tiny_tok();
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed() ^ 0xabcdef);
    static char out[300 * KVF_DETOK_MAX_OUT];
    for (int iter = 0; iter < 300; iter++) {
        struct kvf_detok d;
        kvf_detok_init(&d);
        size_t len = 0, n = kvf_rng_below(&r, 300);
        for (size_t i = 0; i < n; i++) {
            /* Mostly bytes with high bits set, where UTF-8 goes wrong. */
            int32_t tok = kvf_rng_below(&r, 4) ? (int32_t)(3 + 0x80 + kvf_rng_below(&r, 128))
                                               : (int32_t)kvf_rng_below(&r, 520) - 4;
            len += kvf_detok_push(&d, t, tok, out + len, sizeof out - len);
            ASSERT_TRUE(valid_utf8((const uint8_t *)out, len));
        }
        len += kvf_detok_finish(&d, out + len, sizeof out - len);
        if (!valid_utf8((const uint8_t *)out, len))
            KVF_FAIL("seed %llu iter %d: invalid UTF-8 out", (unsigned long long)kvf_test_seed(),
                     iter);
    }
    kvf_tokenizer_destroy(t);
    scratch_done();
}

/* ---- vocabularies that must be refused ---- */

static int try_create(const struct vocab *v, void (*extra)(kvf_gguf_writer_t *), char *err,
                      size_t err_len)
{
    kvf_gguf_t *g = build_vocab(v, extra);
    kvf_tokenizer_t *t = NULL;
    int rc = kvf_tokenizer_create(g, &t, err, err_len);
    if (rc == 0)
        kvf_tokenizer_destroy(t);
    else
        ASSERT_NULL(t);
    kvf_gguf_close(g);
    return rc;
}

static void test_refused_vocabs(void)
{
    char err[256];
    struct vocab v = {.model = "gpt2",
                      .pieces = {"a"},
                      .n_pieces = 1,
                      .add_space_prefix = -1,
                      .with_bytes = true};
    /* Byte-level BPE without a pre-tokenizer: refused, naming the missing key. */
    ASSERT_ERR(try_create(&v, NULL, err, sizeof err), KVF_E_MODEL_UNSUPPORTED);
    ASSERT_TRUE(strstr(err, "tokenizer.ggml.pre") != NULL);
    v.model = "bert";
    ASSERT_ERR(try_create(&v, NULL, err, sizeof err), KVF_E_MODEL_UNSUPPORTED);
    ASSERT_TRUE(strstr(err, "bert") != NULL); /* refused by name */
    v.model = "llama";
    ASSERT_OK(try_create(&v, NULL, err, sizeof err));
    /* A piece too long to be real. */
    static char longp[KVF_TOKENIZER_MAX_PIECE + 2];
    memset(longp, 'x', sizeof longp - 1);
    v.pieces[0] = longp;
    ASSERT_ERR(try_create(&v, NULL, err, sizeof err), KVF_E_MODEL_UNSUPPORTED);
    v.pieces[0] = "a";
    /* No byte tokens and no <unk> would leave some text unencodable: covered by create. */
    v.with_bytes = false;
    ASSERT_OK(try_create(&v, NULL, err, sizeof err)); /* <unk> present: fine */
    kvf_gguf_writer_t *w;
    char path[512];
    kvf_gguf_t *g;
    kvf_tokenizer_t *t;
    /* Hand-built files for the remaining cases. */
    struct {
        const char *what;
        int want;
        const char *tokens[4];
        size_t n_tokens;
        int32_t types[4];
        size_t n_types;
        size_t n_scores;
        uint32_t bos;
    } cases[] = {
        {"no tokens key", KVF_E_MODEL_MISSING, {NULL}, 0, {0}, 0, 0, 0},
        {"scores too short", KVF_E_MODEL_FORMAT, {"<unk>", "a"}, 2, {2, 1}, 2, 1, 0},
        {"token type 9", KVF_E_MODEL_FORMAT, {"<unk>", "a"}, 2, {2, 9}, 2, 2, 0},
        {"types too long", KVF_E_MODEL_FORMAT, {"<unk>", "a"}, 2, {2, 1, 1}, 3, 2, 0},
        {"bos out of range", KVF_E_MODEL_FORMAT, {"<unk>", "a"}, 2, {2, 1}, 2, 2, 7},
        {"bad byte piece", KVF_E_MODEL_FORMAT, {"<unk>", "<0xZZ>"}, 2, {2, 6}, 2, 2, 0},
        {"no bytes, no unk", KVF_E_MODEL_UNSUPPORTED, {"a", "b"}, 2, {1, 1}, 2, 2, 1},
        {"fine", 0, {"<unk>", "<0x41>", "a"}, 3, {2, 6, 1}, 3, 3, 0},
    };
    scratch_path(path, sizeof path, "bad.gguf");
    for (size_t i = 0; i < KVF_ARRAY_LEN(cases); i++) {
        ASSERT_OK(kvf_gguf_writer_create(0, &w));
        ASSERT_OK(kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", 5));
        if (cases[i].n_tokens)
            ASSERT_OK(kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", cases[i].tokens, NULL,
                                                  cases[i].n_tokens));
        float scores[4] = {0};
        ASSERT_OK(
            kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, cases[i].n_scores));
        ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", cases[i].types,
                                              cases[i].n_types));
        if (cases[i].bos)
            ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", cases[i].bos));
        else
            ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0));
        ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
        kvf_gguf_writer_destroy(w);
        ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
        t = NULL;
        err[0] = '\0';
        int rc = kvf_tokenizer_create(g, &t, err, sizeof err);
        if (rc != cases[i].want) KVF_FAIL("%s: got %d (%s)", cases[i].what, rc, err);
        if (rc == 0) {
            int32_t ids[4];
            ASSERT_EQ_INT(kvf_tokenizer_encode(t, "A", 1, false, ids, 4), 4); /* ▁ as 3 <unk> */
            ASSERT_EQ_INT(ids[3], 1);
            kvf_tokenizer_destroy(t);
        } else {
            ASSERT_TRUE(err[0] != '\0');
        }
        kvf_gguf_close(g);
    }
    /* No tokenizer.ggml.model at all. */
    ASSERT_OK(kvf_gguf_writer_create(0, &w));
    ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
    kvf_gguf_writer_destroy(w);
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    ASSERT_ERR(kvf_tokenizer_create(g, &t, err, sizeof err), KVF_E_MODEL_MISSING);
    kvf_gguf_close(g);
    unlink(path);
    scratch_done();
}

/* ---- byte-level BPE ---- */

static int collect_piece(void *ctx, const char *piece, size_t len)
{
    char *out = ctx;
    if (out[0]) strcat(out, "|");
    strncat(out, piece, len);
    return 0;
}

/* Each pre-tokenizer's split of hand-checked strings ('|' between pieces). */
static void test_pre_split(void)
{
    static const struct {
        enum kvf__bpe_pre pre;
        const char *text, *want;
    } cases[] = {
        {KVF__PRE_GPT2, "Hello world's  end 123abc !!x\n\n y",
         "Hello| world|'s| | end| 123|abc| !!|x|\n\n| y"},
        {KVF__PRE_GPT2, "I'M  ", "I|'|M|  "}, /* case-sensitive contractions; trailing run whole */
        {KVF__PRE_SMOLLM, "a 12b", "a| |1|2|b"},
        {KVF__PRE_SMOLLM, "x\xd9\xa3y", "x|\xd9\xa3|y"}, /* U+0663, an Arabic-Indic digit */
        {KVF__PRE_LLAMA3, "I'M 12345 x\n\n  y...", "I|'M| |123|45| x|\n\n| | y|..."},
        {KVF__PRE_LLAMA3, "a.\n\nb", "a|.\n\n|b"},
        {KVF__PRE_LLAMA3, "\t\"quoted\"", "\t|\"quoted|\""}, /* O then letters: one piece */
        {KVF__PRE_LLAMA3, "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac",
         "caf\xc3\xa9| \xe6\x97\xa5\xe6\x9c\xac"},
        {KVF__PRE_QWEN2, "x 2024", "x| |2|0|2|4"},
        {KVF__PRE_QWEN2, " \r\n \r\n  z", " \r\n \r\n| | z"},
    };
    for (size_t i = 0; i < KVF_ARRAY_LEN(cases); i++) {
        char got[256] = "";
        ASSERT_OK(kvf__bpe_pre_split(cases[i].pre, cases[i].text, strlen(cases[i].text),
                                     collect_piece, got));
        ASSERT_STREQ(got, cases[i].want);
    }
}

/* A byte-level vocabulary: the 256 byte characters, "ab" (merge "a b"), "<|im_end|>" and
 * "<|endoftext|>" (control), "<think>" (user-defined). */
static kvf_tokenizer_t *make_bpe(int32_t *id_ab, int32_t *id_end, int32_t *id_eot,
                                 int32_t *id_think)
{
    const char *toks[260];
    char chars[256][4];
    int32_t types[260];
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        size_t k = kvf__utf8_encode(kvf__bpe_byte_cp((uint8_t)b), u);
        memcpy(chars[b], u, k);
        chars[b][k] = '\0';
        toks[b] = chars[b];
        types[b] = KVF_TOKEN_NORMAL;
    }
    toks[256] = "ab", types[256] = KVF_TOKEN_NORMAL;
    toks[257] = "<|im_end|>", types[257] = KVF_TOKEN_CONTROL;
    toks[258] = "<|endoftext|>", types[258] = KVF_TOKEN_CONTROL;
    toks[259] = "<think>", types[259] = KVF_TOKEN_USER_DEFINED;
    const char *merges[] = {"a b"};
    kvf_gguf_writer_t *w;
    ASSERT_OK(kvf_gguf_writer_create(0, &w));
    ASSERT_OK(kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2", 4));
    ASSERT_OK(kvf_gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2", 5));
    ASSERT_OK(kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 260));
    ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, 260));
    ASSERT_OK(kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 1));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 258));
    char path[512], err[256];
    scratch_path(path, sizeof path, "bpe.gguf");
    ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
    kvf_gguf_writer_destroy(w);
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    unlink(path);
    kvf_tokenizer_t *t;
    ASSERT_OK(kvf_tokenizer_create(g, &t, err, sizeof err));
    kvf_gguf_close(g);
    *id_ab = 256, *id_end = 257, *id_eot = 258, *id_think = 259;
    return t;
}

/* Added tokens, the end-of-generation list, and streaming detokenizing of byte pieces. */
static void test_bpe_added_eog_detok(void)
{
    int32_t ab, end, eot, think;
    kvf_tokenizer_t *t = make_bpe(&ab, &end, &eot, &think);
    const int32_t *eog;
    ASSERT_EQ_U64(kvf_tokenizer_eog(t, &eog), 2);
    ASSERT_EQ_INT(eog[0], eot); /* eos first, then the named end-of-turn tokens */
    ASSERT_EQ_INT(eog[1], end);
    ASSERT_TRUE(kvf_tokenizer_is_eog(t, end));
    ASSERT_FALSE(kvf_tokenizer_is_eog(t, think));
    ASSERT_FALSE(kvf_tokenizer_wants_bos(t));
    /* User-defined tokens always match; control tokens only when asked for. */
    const char *text = "ab<think><|im_end|>";
    int32_t ids[64];
    int n = kvf_tokenizer_encode_ex(t, text, strlen(text), KVF_TOKENIZE_PARSE_SPECIAL, ids, 64);
    ASSERT_EQ_INT(n, 3);
    ASSERT_EQ_INT(ids[0], ab);
    ASSERT_EQ_INT(ids[1], think);
    ASSERT_EQ_INT(ids[2], end);
    n = kvf_tokenizer_encode_ex(t, text, strlen(text), 0, ids, 64);
    ASSERT_EQ_INT(n, 2 + 10); /* "<|im_end|>": ten byte tokens */
    ASSERT_EQ_INT(ids[1], think);
    /* "é" is two byte tokens; the first alone shows nothing. Control tokens show nothing. */
    n = kvf_tokenizer_encode_ex(t, "\xc3\xa9<|im_end|>", 12, KVF_TOKENIZE_PARSE_SPECIAL, ids, 64);
    ASSERT_EQ_INT(n, 3);
    struct kvf_detok d;
    kvf_detok_init(&d);
    char out[KVF_DETOK_MAX_OUT];
    ASSERT_EQ_U64(kvf_detok_push(&d, t, ids[0], out, sizeof out), 0);
    ASSERT_EQ_U64(kvf_detok_push(&d, t, ids[1], out, sizeof out), 2);
    ASSERT_MEMEQ(out, "\xc3\xa9", 2);
    ASSERT_EQ_U64(kvf_detok_push(&d, t, ids[2], out, sizeof out), 0);
    /* A byte-level piece for a space decodes to a space, and U+2581 is not one here. */
    n = kvf_tokenizer_encode_ex(t, " \xe2\x96\x81", 4, 0, ids, 64);
    size_t m = 0;
    for (int i = 0; i < n; i++)
        m += kvf_detok_push(&d, t, ids[i], out + m, sizeof out - m);
    ASSERT_EQ_U64(m, 4);
    ASSERT_MEMEQ(out, " \xe2\x96\x81", 4);
    /* NFC (qwen2): "e" + U+0301 encodes as "é". */
    int32_t a[8], b[8];
    ASSERT_EQ_INT(kvf_tokenizer_encode_ex(t, "e\xcc\x81", 3, 0, a, 8), 2);
    ASSERT_EQ_INT(kvf_tokenizer_encode_ex(t, "\xc3\xa9", 2, 0, b, 8), 2);
    ASSERT_MEMEQ(a, b, 2 * sizeof *a);
    kvf_tokenizer_destroy(t);
    scratch_done();
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_merge_by_score),
    KVF_CASE(test_space_prefix_and_words),
    KVF_CASE(test_byte_vocab),
    KVF_CASE(test_invalid_utf8_refused),
    KVF_CASE(test_roundtrip_random_utf8),
    KVF_CASE(test_detok_partial_utf8),
    KVF_CASE(test_detok_always_valid),
    KVF_CASE(test_refused_vocabs),
    KVF_CASE(test_merge_matches_reference),
    KVF_CASE(test_pre_split),
    KVF_CASE(test_bpe_added_eog_detok),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
