/* Constrained decoding (kvfence/grammar.h, src/text/grammar*.c, src/server/schema.c): GBNF
 * strings accepted and refused, UTF-8 classes, bad grammars refused with their bound, the token
 * mask equal to feeding each token's bytes (every token, at every state of random walks), stop
 * ids only where the output is complete, and JSON Schemas compiled to grammars whose every
 * complete walk parses and keeps the schema's shape; unsupported keywords named. */
#include <jansson.h>
#include <math.h>
#include <time.h>

#include "gguf/gguf_test_util.h"
#include "kvf_test.h"

#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/grammar.h"
#include "kvfence/server.h"
#include "kvfence/text.h"

#define SP "\xe2\x96\x81" /* U+2581 */

static kvf_grammar_t *compile(const char *text)
{
    kvf_grammar_t *g = NULL;
    char err[200];
    int rc = kvf_grammar_compile(text, strlen(text), &g, err, sizeof err);
    if (rc < 0) kvf_test__fail(__FILE__, __LINE__, "compile %s: %s", text, err);
    return g;
}

/* Whether s is a sentence of g (fed byte by byte, then complete). */
static bool matches(kvf_grammar_t *g, const char *s)
{
    struct kvf_grammar_state *st = malloc(sizeof *st);
    ASSERT_NOT_NULL(st);
    kvf_grammar_state_init(g, st);
    bool ok = kvf_grammar_state_feed(g, st, (const uint8_t *)s, strlen(s)) == 0 &&
              kvf_grammar_state_done(st);
    free(st);
    return ok;
}

static void test_gbnf_sentences(void)
{
    struct {
        const char *grammar, *yes[4], *no[4];
    } cases[] = {
        {"root ::= \"ab\" | [0-9]+ \"!\"", {"ab", "7!", "123!"}, {"a", "!", "ab!", "12"}},
        {"root ::= \"a\" [0-9]? \"!\"", {"a!", "a5!"}, {"a55!", "!", "a"}},
        {"root ::= x (\",\" x)*\nx ::= [a-c]+ # comment\n",
         {"a", "ab,c", "c,c,c"},
         {",", "a,", "d"}},
        {"root ::= ( \"(\" root \")\" )?", {"", "()", "(())"}, {"(", "())", ")("}},
        {"root ::= [^\"\\\\]* \"\\\"\"", {"\"", "ab\"", "\xc3\xa9\""}, {"\\\"", "a", "\xff\""}},
        {"root ::= [\\u03b1-\\u03c9]+",
         {"\xce\xb2", "\xce\xb1\xcf\x89"},
         {"a", "\xce", "\xcf\x8a"}},
        {"root ::= .", {"x", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}, {"\n", "", "\xed\xa0\x80"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvf_grammar_t *g = compile(cases[i].grammar);
        for (int k = 0; k < 4 && cases[i].yes[k]; k++)
            if (!matches(g, cases[i].yes[k]))
                kvf_test__fail(__FILE__, __LINE__, "%s should match %s", cases[i].grammar,
                               cases[i].yes[k]);
        for (int k = 0; k < 4 && cases[i].no[k]; k++)
            if (matches(g, cases[i].no[k]))
                kvf_test__fail(__FILE__, __LINE__, "%s should not match %s", cases[i].grammar,
                               cases[i].no[k]);
        kvf_grammar_free(g);
    }
}

static void test_bad_grammars(void)
{
    const char *bad[] = {"",
                         "root ::= x",
                         "a ::= \"b\"",
                         "root ::= \"a",
                         "root ::= [b-a]",
                         "root ::= \"a\" )",
                         "root ::= *",
                         "root ::= \"\\q\"",
                         "root ::= \"a\"\nroot ::= \"b\"",
                         "root ::= []",
                         "root \"a\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvf_grammar_t *g = NULL;
        char err[200] = "";
        int rc = kvf_grammar_compile(bad[i], strlen(bad[i]), &g, err, sizeof err);
        if (rc >= 0) kvf_test__fail(__FILE__, __LINE__, "accepted: %s", bad[i]);
        ASSERT_NULL(g);
        ASSERT_TRUE(err[0] != 0);
    }
    /* Bounds: text, nesting, elements. */
    char *big = malloc(KVF_GRAMMAR_MAX_BYTES + 64);
    ASSERT_NOT_NULL(big);
    memset(big, ' ', KVF_GRAMMAR_MAX_BYTES + 63);
    memcpy(big, "root ::= \"a\"", 12);
    big[KVF_GRAMMAR_MAX_BYTES + 63] = 0;
    kvf_grammar_t *g = NULL;
    char err[200];
    ASSERT_ERR(kvf_grammar_compile(big, strlen(big), &g, err, sizeof err), -E2BIG);
    size_t n = 0;
    n += (size_t)snprintf(big, 64, "root ::= ");
    for (int i = 0; i < 100; i++)
        big[n++] = '(';
    big[n++] = '"', big[n++] = 'a', big[n++] = '"';
    for (int i = 0; i < 100; i++)
        big[n++] = ')';
    big[n] = 0;
    ASSERT_ERR(kvf_grammar_compile(big, n, &g, err, sizeof err), -E2BIG);
    /* Many elements: a long class-heavy rule within the text bound. */
    n = (size_t)snprintf(big, 64, "root ::= ");
    while (n + 40 < KVF_GRAMMAR_MAX_BYTES)
        n += (size_t)snprintf(big + n, 40, "[^a]");
    big[n] = 0;
    int rc = kvf_grammar_compile(big, n, &g, err, sizeof err);
    ASSERT_TRUE(rc == 0 || rc == -E2BIG);
    kvf_grammar_free(g);
    free(big);
}

/* A vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then these pieces. */
static const char *const pieces[] = {SP "true", "true", "false", "{\"", "\":",      "\",\"",
                                     "}",       "ab",   "null",  "12",  "3.",       SP,
                                     "\"}",     "[1",   ",",     "]",   "\xce\xb1", "<|x|>"};

static kvf_tokenizer_t *make_tok(void)
{
    size_t np = sizeof pieces / sizeof pieces[0], n = 3 + 256 + np;
    const char **toks = calloc(n, sizeof *toks);
    char(*bytes)[8] = calloc(256, 8);
    float *scores = calloc(n, sizeof *scores);
    int32_t *types = calloc(n, sizeof *types);
    ASSERT_TRUE(toks && bytes && scores && types);
    size_t i = 0;
    toks[i] = "<unk>", types[i++] = KVF_TOKEN_UNKNOWN;
    toks[i] = "<s>", types[i++] = KVF_TOKEN_CONTROL;
    toks[i] = "</s>", types[i++] = KVF_TOKEN_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], 8, "<0x%02X>", b);
        toks[i] = bytes[b], types[i++] = KVF_TOKEN_BYTE;
    }
    for (size_t k = 0; k < np; k++) {
        scores[i] = -(float)k;
        toks[i] = pieces[k];
        types[i++] = k + 1 == np ? KVF_TOKEN_CONTROL : KVF_TOKEN_NORMAL;
    }
    kvf_gguf_writer_t *w;
    ASSERT_OK(kvf_gguf_writer_create(0, &w));
    ASSERT_OK(kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", 5));
    ASSERT_OK(kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, n));
    ASSERT_OK(kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, n));
    ASSERT_OK(kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, n));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2));
    ASSERT_OK(kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    char path[512], err[256];
    scratch_path(path, sizeof path, "gvocab.gguf");
    ASSERT_OK(kvf_gguf_writer_write(w, path, err, sizeof err));
    kvf_gguf_writer_destroy(w);
    kvf_gguf_t *g;
    ASSERT_OK(kvf_gguf_open(path, &g, err, sizeof err));
    unlink(path);
    kvf_tokenizer_t *t;
    ASSERT_OK(kvf_tokenizer_create(g, &t, err, sizeof err));
    kvf_gguf_close(g);
    free(toks);
    free(bytes);
    free(scores);
    free(types);
    return t;
}

/* Random walks over g with v: at every state the mask equals, token by token, whether feeding
 * the token's bytes keeps the output in the grammar; the stop id is allowed exactly when done.
 * Returns the number of walks that completed; each complete output is passed to check. */
static int walks(kvf_grammar_t *g, const kvf_grammar_vocab_t *v, const kvf_tokenizer_t *t,
                 int n_walks, int max_steps, void (*check)(const char *, size_t))
{
    uint32_t nv = kvf_grammar_vocab_n(v);
    struct kvf_grammar_state *st = malloc(sizeof *st), *tmp = malloc(sizeof *tmp);
    float *logits = malloc(nv * sizeof(float));
    int32_t *allowed = malloc(nv * sizeof(int32_t));
    char *out = malloc(64 * 1024);
    ASSERT_TRUE(st && tmp && logits && allowed && out);
    struct kvf_rng rng;
    kvf_rng_seed(&rng, kvf_test_seed());
    int done = 0;
    const int32_t stop = 2;
    for (int w = 0; w < n_walks; w++) {
        kvf_grammar_state_init(g, st);
        size_t len = 0;
        for (int step = 0; step < max_steps; step++) {
            for (uint32_t i = 0; i < nv; i++)
                logits[i] = 0.0f;
            int left = kvf_grammar_apply(g, v, st, logits, nv, &stop, 1);
            ASSERT_TRUE(left >= 0);
            uint32_t na = 0;
            for (uint32_t i = 0; i < nv; i++) {
                bool on = logits[i] == 0.0f;
                if (i == (uint32_t)stop) {
                    ASSERT_EQ_INT(on, kvf_grammar_state_done(st));
                } else {
                    memcpy(tmp, st, sizeof *tmp);
                    bool feeds = kvf_grammar_state_advance(g, v, tmp, (int32_t)i) == 0;
                    if (on != feeds)
                        kvf_test__fail(__FILE__, __LINE__, "token %u (%s): mask %d, feed %d", i,
                                       kvf_tokenizer_piece(t, (int32_t)i, NULL), on, feeds);
                }
                if (on) allowed[na++] = (int32_t)i;
            }
            ASSERT_EQ_INT(left, (int)na);
            ASSERT_TRUE(na > 0); /* these grammars never dead-end on a byte vocabulary */
            int32_t tok = allowed[kvf_rng_below(&rng, na)];
            /* Prefer ending when allowed, so walks complete. */
            if (kvf_grammar_state_done(st) && kvf_rng_below(&rng, 2)) tok = stop;
            if (tok == stop) {
                if (check) check(out, len);
                done++;
                break;
            }
            struct kvf_detok d;
            kvf_detok_init(&d);
            char buf[KVF_DETOK_MAX_OUT];
            ASSERT_OK(kvf_grammar_state_advance(g, v, st, tok));
            /* The bytes the grammar saw are the bytes the detokenizer gives (a whole piece). */
            size_t k = kvf_detok_push(&d, t, tok, buf, sizeof buf);
            k += kvf_detok_finish(&d, buf + k, sizeof buf - k);
            if (len + k < 64 * 1024) memcpy(out + len, buf, k), len += k;
        }
    }
    free(st);
    free(tmp);
    free(logits);
    free(allowed);
    free(out);
    return done;
}

static void test_mask_equals_feed(void)
{
    kvf_tokenizer_t *t = make_tok();
    kvf_grammar_vocab_t *v;
    ASSERT_OK(kvf_grammar_vocab_create(t, &v));
    kvf_grammar_t *g = compile("root ::= \"{\\\"\" [a-b]+ \"\\\":\" (\"true\" | \"false\" | "
                               "\"null\" | [0-9]+ | \"[\" ([0-9] (\",\" [0-9])*)? \"]\") \"}\"");
    int n = walks(g, v, t, 40, 60, NULL);
    ASSERT_TRUE(n > 0);
    /* Control, unused and unknown tokens never pass a mask: the last piece is control. */
    struct kvf_grammar_state st;
    kvf_grammar_state_init(g, &st);
    const uint64_t *bits = kvf_grammar_mask(g, v, &st);
    ASSERT_NOT_NULL(bits);
    for (int32_t i = 0; i < 3; i++)
        ASSERT_FALSE(bits[i >> 6] >> (i & 63) & 1);
    int32_t ctl = 3 + 256 + (int32_t)(sizeof pieces / sizeof pieces[0]) - 1;
    ASSERT_FALSE(bits[ctl >> 6] >> (ctl & 63) & 1);
    /* The same state twice: the cached mask. */
    ASSERT_EQ_PTR(kvf_grammar_mask(g, v, &st), bits);
    kvf_grammar_free(g);
    kvf_grammar_vocab_free(v);
    kvf_tokenizer_destroy(t);
}

static json_t *schema_of(const char *s)
{
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    ASSERT_NOT_NULL(j);
    return j;
}

static json_t *want_schema;
static void check_json(const char *s, size_t n)
{
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, &je);
    if (!v) kvf_test__fail(__FILE__, __LINE__, "not JSON: %.*s", (int)n, s);
    ASSERT_TRUE(json_is_object(v));
    json_t *props = json_object_get(want_schema, "properties");
    ASSERT_EQ_INT((int)json_object_size(v), (int)json_object_size(props));
    ASSERT_TRUE(json_is_boolean(json_object_get(v, "ok")));
    ASSERT_TRUE(json_is_integer(json_object_get(v, "n")));
    json_t *xs = json_object_get(v, "xs");
    ASSERT_TRUE(json_is_array(xs) && json_array_size(xs) <= 2);
    json_decref(v);
}

static void test_schema(void)
{
    const char *schema =
        "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"n\":{\"type\":"
        "\"integer\"},\"xs\":{\"type\":\"array\",\"items\":{\"enum\":[1,\"a\",null]},\"maxItems\":"
        "2},\"s\":{\"type\":\"string\",\"maxLength\":2}},\"required\":[\"ok\"],"
        "\"additionalProperties\":false}";
    char *text = malloc(KVF_GRAMMAR_MAX_BYTES + 1), err[256];
    ASSERT_NOT_NULL(text);
    int n = kvf_schema_to_grammar(schema, strlen(schema), text, KVF_GRAMMAR_MAX_BYTES + 1, err,
                                  sizeof err);
    ASSERT_TRUE(n > 0);
    kvf_grammar_t *g = compile(text);
    kvf_tokenizer_t *t = make_tok();
    kvf_grammar_vocab_t *v;
    ASSERT_OK(kvf_grammar_vocab_create(t, &v));
    want_schema = schema_of(schema);
    ASSERT_TRUE(walks(g, v, t, 30, 200, check_json) > 0);
    json_decref(want_schema);
    kvf_grammar_free(g);
    /* json_object: every complete walk is an object. */
    n = kvf_schema_to_grammar(NULL, 0, text, KVF_GRAMMAR_MAX_BYTES + 1, err, sizeof err);
    ASSERT_TRUE(n > 0);
    g = compile(text);
    ASSERT_TRUE(matches(g, "{\"a\":[1,{\"b\":null}],\"c\":\"\\u00e9x\"}"));
    ASSERT_FALSE(matches(g, "{\"a\":01}"));
    ASSERT_FALSE(matches(g, "[1]"));
    kvf_grammar_free(g);
    /* Refused keywords are named; bounds give errors, never a crash. */
    const char *bad[][2] = {{"{\"type\":\"string\",\"pattern\":\"a\"}", "'pattern'"},
                            {"{\"type\":\"integer\",\"minimum\":1}", "'minimum'"},
                            {"{\"$ref\":\"#/x\"}", "'$ref'"},
                            {"{\"type\":\"date\"}", "'date'"},
                            {"{\"type\":\"object\",\"required\":[\"z\"]}", "'required'"},
                            {"{\"type\":\"array\",\"maxItems\":1000}", "'maxItems'"},
                            {"[1]", "object"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        ASSERT_ERR(kvf_schema_to_grammar(bad[i][0], strlen(bad[i][0]), text,
                                         KVF_GRAMMAR_MAX_BYTES + 1, err, sizeof err),
                   -EINVAL);
        if (!strstr(err, bad[i][1]))
            kvf_test__fail(__FILE__, __LINE__, "%s: %s does not name %s", bad[i][0], err,
                           bad[i][1]);
    }
    char deep[2048] = "";
    size_t k = 0;
    for (int i = 0; i < 40; i++)
        k += (size_t)snprintf(deep + k, sizeof deep - k, "{\"type\":\"array\",\"items\":");
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{\"type\":\"null\"}");
    for (int i = 0; i < 40; i++)
        deep[k++] = '}';
    deep[k] = 0;
    ASSERT_TRUE(kvf_schema_to_grammar(deep, k, text, KVF_GRAMMAR_MAX_BYTES + 1, err, sizeof err) <
                0);
    kvf_grammar_vocab_free(v);
    kvf_tokenizer_destroy(t);
    free(text);
}

/* A grammar of many ambiguous alternatives nested several deep: each step's work is cut at
 * KVF_GRAMMAR_STEP_WORK, so a mask over the vocabulary stays quick and what it allows still
 * feeds. */
static void test_ambiguous_bounded(void)
{
    char *text = malloc(KVF_GRAMMAR_MAX_BYTES);
    ASSERT_NOT_NULL(text);
    size_t n = (size_t)snprintf(text, 64, "root ::= x x x x x x x x\nx ::= y | y | y\ny ::= ");
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(text + n, 16, "%s\"a\" x?", i ? " | " : "");
    text[n++] = '\n';
    text[n] = 0;
    kvf_grammar_t *g = compile(text);
    kvf_tokenizer_t *t = make_tok();
    kvf_grammar_vocab_t *v;
    ASSERT_OK(kvf_grammar_vocab_create(t, &v));
    time_t t0 = time(NULL);
    walks(g, v, t, 3, 12, NULL);
    ASSERT_TRUE(time(NULL) - t0 < 60);
    kvf_grammar_free(g);
    kvf_grammar_vocab_free(v);
    kvf_tokenizer_destroy(t);
    free(text);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_ambiguous_bounded), KVF_CASE(test_gbnf_sentences), KVF_CASE(test_bad_grammars),
    KVF_CASE(test_mask_equals_feed),  KVF_CASE(test_schema),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
