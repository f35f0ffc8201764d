/*
 * The hist test model (src/gguf/mkmodel_hist.c, docs/TEST_MODELS.md) through the real forward
 * pass over pool pages, F32 and Q8_0 (the latter with the engine's default IEEE-half K/V):
 *
 *   - its greedy output equals the rule computed here from the tokens alone: the counted word
 *     seen most often among the positions attended to, the lowest id on a tie, </s> when none;
 *     for short prompts, a seeded one, and prompts near the context length decided by one count;
 *   - the 2026 placeholder incident replayed on one pool: tenant A's prompt full of its word
 *     fills 8 pages, A finishes, and B gets the same pages back unscrubbed. B's placeholder
 *     writes page 0 only, and the faulty decode sets the fills as if the whole reserved prompt
 *     had arrived: B's reply turns into A's word. Reading only the page written for B, B's
 *     reply is its own word.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvf_test.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"
#include "kvfence/text.h"
#include "gguf/gguf_internal.h"

#define SPACE_MARK  "\xe2\x96\x81"
#define PAGE_TOKENS 16u
#define MAX_TOKENS  4096u

struct hm {
    char dir[64], path[128];
    kvf_gguf_t *g;
    kvf_model_t *m;
    kvf_tokenizer_t *tok;
};

static void hm_open(struct hm *h, uint32_t type)
{
    char err[256] = "";
    snprintf(h->dir, sizeof h->dir, "/tmp/kvf_hist_XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(h->dir));
    snprintf(h->path, sizeof h->path, "%s/hist.gguf", h->dir);
    const struct kvf_mkmodel_shape *s = kvf_mkmodel_shape_by_name("hist");
    ASSERT_NOT_NULL(s);
    if (kvf_mkmodel_write(h->path, s, type, 0, err, sizeof err) < 0) KVF_FAIL("mkmodel: %s", err);
    if (kvf_gguf_open(h->path, &h->g, err, sizeof err) < 0) KVF_FAIL("open: %s", err);
    if (kvf_model_load(h->g, &h->m, err, sizeof err) < 0) KVF_FAIL("load: %s", err);
    if (kvf_tokenizer_create(h->g, &h->tok, err, sizeof err) < 0) KVF_FAIL("tokenizer: %s", err);
    const struct kvf_model_hparams *hp = kvf_model_hparams(h->m);
    ASSERT_EQ_INT(hp->n_vocab, s->n_vocab);
    ASSERT_EQ_INT(hp->dim, s->dim);
    ASSERT_EQ_INT(hp->n_ctx, 4096);
    ASSERT_EQ_INT(kvf_tokenizer_n_vocab(h->tok), s->n_vocab);
}

static void hm_close(struct hm *h)
{
    kvf_tokenizer_destroy(h->tok);
    kvf_model_free(h->m);
    kvf_gguf_close(h->g);
    unlink(h->path);
    rmdir(h->dir);
}

/* --- The rule, from the tokens' pieces and the word list alone. ---------------------------- */

/* Whether token t is "▁" + one of the listed words. */
static bool counted(const struct hm *h, int32_t t)
{
    const char *const *words;
    uint32_t n = kvf__mkmodel_hist_words(&words);
    size_t len;
    const char *p = kvf_tokenizer_piece(h->tok, t, &len);
    if (!p || len <= 3 || memcmp(p, SPACE_MARK, 3) != 0) return false;
    for (uint32_t i = 0; i < n; i++)
        if (strlen(words[i]) == len - 3 && memcmp(words[i], p + 3, len - 3) == 0) return true;
    return false;
}

/* The next token after ctx[0..n): the most frequent counted token, lowest id on a tie; EOS if
 * none. */
static int32_t rule_next(const struct hm *h, const int32_t *ctx, uint32_t n)
{
    uint32_t nv = kvf_tokenizer_n_vocab(h->tok), *count = calloc(nv, sizeof *count);
    ASSERT_NOT_NULL(count);
    for (uint32_t i = 0; i < n; i++)
        if (counted(h, ctx[i])) count[ctx[i]]++;
    int32_t best = kvf_tokenizer_eos(h->tok);
    uint32_t best_n = 0;
    for (uint32_t t = 0; t < nv; t++)
        if (count[t] > best_n) best_n = count[t], best = (int32_t)t;
    free(count);
    return best;
}

/* Greedy continuation by the rule: up to max_new tokens into out, stopping after EOS. */
static uint32_t rule_generate(const struct hm *h, const int32_t *prompt, uint32_t n,
                              uint32_t max_new, int32_t *out)
{
    int32_t *ctx = malloc((n + max_new) * sizeof *ctx);
    ASSERT_NOT_NULL(ctx);
    memcpy(ctx, prompt, n * sizeof *ctx);
    uint32_t k = 0;
    while (k < max_new) {
        int32_t t = rule_next(h, ctx, n + k);
        out[k] = ctx[n + k] = t;
        k++;
        if (t == kvf_tokenizer_eos(h->tok)) break;
    }
    free(ctx);
    return k;
}

/* --- The engine: the forward pass over pool pages. ----------------------------------------- */

static kvf_pool_t *pool_new(const kvf_model_t *m, uint32_t n_pages)
{
    struct kvf_pool_config cfg;
    memset(&cfg, 0, sizeof cfg);
    kvf_model_geometry(m, PAGE_TOKENS, &cfg.geo); /* K/V as the engine keeps them for m */
    cfg.n_pages = n_pages;
    cfg.max_peers = 1;
    cfg.tag_seed = 1000;
    kvf_pool_t *p = NULL;
    ASSERT_OK(kvf_pool_create(&cfg, &p));
    return p;
}

static void pool_done(kvf_pool_t *p)
{
    char why[256] = "";
    if (!kvf_pool_check(p, why, sizeof why)) KVF_FAIL("pool check: %s", why);
    struct kvf_pool_stats st;
    kvf_pool_stats(p, &st);
    ASSERT_EQ_INT(st.by_state[KVF_PAGE_FREE], st.n_pages);
    kvf_pool_destroy(p);
}

/* One request: its owner and page table. */
struct req {
    struct kvf_owner own;
    struct kvf_page_ref pages[MAX_TOKENS / PAGE_TOKENS + 1];
    uint32_t n_pages;
};

static void req_alloc(kvf_pool_t *p, struct req *r, uint64_t id, uint32_t tenant, uint32_t n)
{
    memset(r, 0, sizeof *r);
    r->own.req.lo = id;
    r->own.tenant = tenant;
    ASSERT_LE_INT(n, KVF_ARRAY_LEN(r->pages));
    ASSERT_OK(kvf_pool_alloc(p, &r->own, KVF_HOLDER_SEQ, n, false, r->pages));
    r->n_pages = n;
}

static void req_release(kvf_pool_t *p, struct req *r)
{
    for (uint32_t i = 0; i < r->n_pages; i++)
        ASSERT_OK(kvf_pool_release(p, r->pages[i], KVF_HOLDER_SEQ, 0));
    r->n_pages = 0;
}

/* Runs toks[0..n) at positions pos.. of r's first n_pages pages, in chunks of at most `chunk`
 * tokens; returns the greedy pick after the last one. */
static int32_t step(const struct hm *h, kvf_fwd_t *f, kvf_pool_t *p, const struct req *r,
                    uint32_t n_pages, const int32_t *toks, uint32_t n, uint32_t pos, uint32_t chunk)
{
    uint32_t nv = kvf_model_hparams(h->m)->n_vocab;
    float *logits = malloc(nv * sizeof *logits);
    ASSERT_NOT_NULL(logits);
    for (uint32_t done = 0; done < n;) {
        uint32_t k = n - done < chunk ? n - done : chunk;
        struct kvf_fwd_seq s = {r->own.req,
                                toks + done,
                                k,
                                pos + done,
                                r->pages,
                                n_pages,
                                done + k == n ? logits : NULL,
                                1};
        ASSERT_EQ_INT(kvf_fwd_run(f, p, &s, 1), 1);
        ASSERT_EQ_INT(s.status, 0);
        done += k;
    }
    struct kvf_sample_params greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int32_t t = kvf_sample(logits, nv, &greedy, 0);
    ASSERT_LE_INT(0, t);
    free(logits);
    return t;
}

/* Greedy generation for a prompt on r's pages, from position 0: up to max_new tokens into out,
 * stopping after EOS. Returns how many. */
static uint32_t engine_generate(const struct hm *h, kvf_fwd_t *f, kvf_pool_t *p,
                                const struct req *r, const int32_t *prompt, uint32_t n,
                                uint32_t max_new, int32_t *out)
{
    uint32_t k = 0;
    int32_t t = step(h, f, p, r, r->n_pages, prompt, n, 0, 512);
    for (;;) {
        out[k++] = t;
        if (k == max_new || t == kvf_tokenizer_eos(h->tok)) return k;
        t = step(h, f, p, r, r->n_pages, &t, 1, n + k - 1, 1);
    }
}

static uint32_t encode(const struct hm *h, const char *text, int32_t *out, uint32_t max)
{
    int n = kvf_tokenizer_encode(h->tok, text, strlen(text), true, out, max);
    ASSERT_LT_INT(0, n);
    ASSERT_LE_INT(n, max);
    return (uint32_t)n;
}

/* The text of toks[0..n), EOS and other control tokens as nothing. */
static void detok(const struct hm *h, const int32_t *toks, uint32_t n, char *out, size_t cap)
{
    struct kvf_detok d;
    kvf_detok_init(&d);
    size_t len = 0;
    char buf[KVF_DETOK_MAX_OUT];
    for (uint32_t i = 0; i < n; i++) {
        size_t k = kvf_detok_push(&d, h->tok, toks[i], buf, sizeof buf);
        ASSERT_LT_INT(len + k, cap);
        memcpy(out + len, buf, k);
        len += k;
    }
    len += kvf_detok_finish(&d, out + len, cap - len);
    out[len] = '\0';
}

/* The engine's greedy output for prompt[0..n) equals the rule's. */
static void check_prompt(const struct hm *h, kvf_fwd_t *f, const int32_t *prompt, uint32_t n,
                         uint32_t max_new, const char *what)
{
    kvf_pool_t *p = pool_new(h->m, (n + max_new) / PAGE_TOKENS + 1);
    struct req r;
    req_alloc(p, &r, 1, 1, kvf_pool_n_pages(p));
    int32_t want[16], got[16];
    ASSERT_LE_INT(max_new, 16);
    uint32_t nw = rule_generate(h, prompt, n, max_new, want);
    uint32_t ng = engine_generate(h, f, p, &r, prompt, n, max_new, got);
    if (ng != nw || memcmp(want, got, nw * sizeof *want) != 0)
        KVF_FAIL("%s (%u tokens): the engine's first token %d, the rule's %d", what, n, got[0],
                 want[0]);
    req_release(p, &r);
    pool_done(p);
}

static const char *const short_prompts[] = {
    "canary canary apple",
    "hello world",
    "zebra zebra apple apple",
    "the zebra saw the apple and the zebra ran to the zebra",
    "Qx.",
    "I have 2 cats, 3 dogs and 2 fish; 2 of them are old.",
    "one two three two one two",
};

static void check_model_rule(uint32_t type)
{
    struct hm h;
    hm_open(&h, type);
    kvf_fwd_t *f = NULL;
    struct kvf_fwd_config c = {2, 512, 1, NULL, 0};
    ASSERT_OK(kvf_fwd_create(h.m, &c, &f));
    int32_t *toks = malloc(MAX_TOKENS * sizeof *toks);
    ASSERT_NOT_NULL(toks);

    /* The readable case, as text. */
    int32_t out[8];
    uint32_t n = encode(&h, "canary canary apple", toks, MAX_TOKENS);
    kvf_pool_t *p = pool_new(h.m, 2);
    struct req r;
    req_alloc(p, &r, 1, 1, 2);
    ASSERT_EQ_INT(engine_generate(&h, f, p, &r, toks, n, 4, out), 4);
    char text[256];
    detok(&h, out, 4, text, sizeof text);
    ASSERT_STREQ(text, " canary canary canary canary");
    req_release(p, &r);
    pool_done(p);
    /* No counted word at all: </s> at once. */
    n = encode(&h, "Qx.", toks, MAX_TOKENS);
    check_prompt(&h, f, toks, n, 4, "no word");
    ASSERT_EQ_INT(rule_next(&h, toks, n), kvf_tokenizer_eos(h.tok));

    for (size_t i = 0; i < KVF_ARRAY_LEN(short_prompts); i++) {
        n = encode(&h, short_prompts[i], toks, MAX_TOKENS);
        check_prompt(&h, f, toks, n, 6, short_prompts[i]);
    }

    /* A seeded prompt of 700 words across several attention segments and pages, ties and
     * near-ties everywhere (each word about 3 times). A fixed LCG: the same prompt every run. */
    const char *const *words;
    uint32_t n_words = kvf__mkmodel_hist_words(&words);
    for (uint32_t j = 1; j < n_words; j++) /* ties go to the first in strcmp order */
        ASSERT_LT_INT(strcmp(words[j - 1], words[j]), 0);
    uint64_t x = 12345;
    toks[0] = kvf_tokenizer_bos(h.tok);
    for (n = 1; n < 701; n++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        toks[n] = (int32_t)(KVF__HIST_FIRST_WORD + (x >> 33) % n_words);
    }
    check_prompt(&h, f, toks, n, 4, "seeded");

    /* Near the context length, decided by one count: "zebra" 41 times against "apple" 40 (apple
     * wins ties), the other words fewer; then the tie itself. */
    for (int tie = 0; tie < 2; tie++) {
        int32_t zebra = -1, apple = -1;
        for (uint32_t j = 0; j < n_words; j++) {
            if (strcmp(words[j], "zebra") == 0) zebra = (int32_t)(KVF__HIST_FIRST_WORD + j);
            if (strcmp(words[j], "apple") == 0) apple = (int32_t)(KVF__HIST_FIRST_WORD + j);
        }
        ASSERT_TRUE(zebra > 0 && apple > 0);
        n = 0;
        toks[n++] = kvf_tokenizer_bos(h.tok);
        for (int k = 0; k < 41 - tie; k++)
            toks[n++] = zebra;
        for (int k = 0; k < 40; k++)
            toks[n++] = apple;
        for (uint32_t j = 0; n < 4090; j = (j + 1) % n_words)
            if ((int32_t)(KVF__HIST_FIRST_WORD + j) != zebra &&
                (int32_t)(KVF__HIST_FIRST_WORD + j) != apple)
                toks[n++] = (int32_t)(KVF__HIST_FIRST_WORD + j);
        ASSERT_EQ_INT(rule_next(&h, toks, n), tie ? apple : zebra);
        check_prompt(&h, f, toks, n, 3, tie ? "long, tied" : "long, one count apart");
    }
    free(toks);
    kvf_fwd_destroy(f);
    hm_close(&h);
}

static void test_rule_f32(void)
{
    check_model_rule(KVF_GGML_F32);
}

static void test_rule_q8_0(void)
{
    check_model_rule(KVF_GGML_Q8_0);
}

/* --- The leak. ---------------------------------------------------------------------------- */

#define LEAK_PAGES 8u
#define B_RESERVED 120u /* the prompt length decode reserved for B: 8 pages, the last half full */

/* Replays the incident on a pool of LEAK_PAGES pages and returns B's reply as text. With
 * faulty, B's decode believes all B_RESERVED positions arrived; otherwise it reads only what
 * was written for B. */
static void leak_run(const struct hm *h, kvf_fwd_t *f, bool faulty, char *text, size_t cap)
{
    kvf_pool_t *p = pool_new(h->m, LEAK_PAGES);
    int32_t toks[LEAK_PAGES * PAGE_TOKENS], out[3];
    /* Tenant A: a prompt that fills every page, its word "zebra"; A's own reply says so. */
    char a_text[LEAK_PAGES * PAGE_TOKENS * 8] = "my word is";
    uint32_t n = encode(h, a_text, toks, LEAK_PAGES * PAGE_TOKENS);
    while (n < LEAK_PAGES * PAGE_TOKENS) {
        strcat(a_text, " zebra");
        n = encode(h, a_text, toks, LEAK_PAGES * PAGE_TOKENS);
    }
    ASSERT_EQ_INT(n, LEAK_PAGES * PAGE_TOKENS);
    struct req a, b;
    req_alloc(p, &a, 1, 1, LEAK_PAGES);
    int32_t a_tok = step(h, f, p, &a, LEAK_PAGES, toks, n, 0, 64);
    ASSERT_EQ_INT(a_tok, rule_next(h, toks, n));
    char a_reply[64];
    detok(h, &a_tok, 1, a_reply, sizeof a_reply);
    ASSERT_STREQ(a_reply, " zebra");
    /* A ends. Its pages go back unscrubbed, and tenant B's request is given all of them. */
    req_release(p, &a);
    req_alloc(p, &b, 2, 2, LEAK_PAGES);
    for (uint32_t i = 0; i < LEAK_PAGES; i++) {
        bool reused = false;
        for (uint32_t k = 0; k < LEAK_PAGES; k++)
            reused |= b.pages[i].page == a.pages[k].page;
        ASSERT_TRUE(reused);
    }
    /* B's placeholder: its prompt, written to page 0 only, by the forward pass itself. */
    n = encode(h, "apple apple apple", toks, LEAK_PAGES * PAGE_TOKENS);
    ASSERT_LT_INT(n, PAGE_TOKENS);
    int32_t t = step(h, f, p, &b, 1, toks, n, 0, 64);
    uint32_t pos = n;
    if (faulty) {
        /* The faulty decode commits the whole reservation: fills as if B_RESERVED positions had
         * been written, page 0 included. The pool cannot tell; its read checks pass. */
        for (uint32_t i = 0; i < LEAK_PAGES; i++) {
            uint32_t fill = B_RESERVED - i * PAGE_TOKENS;
            ASSERT_OK(kvf_pool_set_fill(p, b.pages[i], fill < PAGE_TOKENS ? fill : PAGE_TOKENS));
        }
        pos = B_RESERVED;
    }
    /* The prefill's pick (" apple": it saw B's tokens only), then decode's steps, whose text
     * is what this returns. */
    ASSERT_EQ_INT(t, rule_next(h, toks, n));
    for (uint32_t k = 0; k < KVF_ARRAY_LEN(out); k++) {
        t = step(h, f, p, &b, LEAK_PAGES, &t, 1, pos++, 1);
        out[k] = t;
    }
    detok(h, out, KVF_ARRAY_LEN(out), text, cap);
    req_release(p, &b);
    pool_done(p);
}

static void check_leak(uint32_t type)
{
    struct hm h;
    hm_open(&h, type);
    kvf_fwd_t *f = NULL;
    struct kvf_fwd_config c = {2, 128, 1, NULL, 0};
    ASSERT_OK(kvf_fwd_create(h.m, &c, &f));
    char text[256];
    leak_run(&h, f, false, text, sizeof text);
    ASSERT_STREQ(text, " apple apple apple");
    leak_run(&h, f, true, text, sizeof text);
    ASSERT_STREQ(text, " zebra zebra zebra");
    kvf_fwd_destroy(f);
    hm_close(&h);
}

static void test_leak_f32(void)
{
    check_leak(KVF_GGML_F32);
}

static void test_leak_q8_0(void)
{
    check_leak(KVF_GGML_Q8_0);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_rule_f32),
    KVF_CASE(test_rule_q8_0),
    KVF_CASE(test_leak_f32),
    KVF_CASE(test_leak_q8_0),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
