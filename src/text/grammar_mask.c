/*
 * grammar_mask.c — the vocabulary side of constrained decoding (kvfence/grammar.h): each
 * token's bytes, sorted so that tokens sharing a prefix are walked once, and the per-state
 * mask with its cache.
 *
 * The walk: tokens in byte order, lcp[i] the prefix token i shares with token i-1. levels[d]
 * is the state after the first d bytes of the current token; the next token reuses levels up
 * to their common prefix, and a prefix that left the grammar rejects every later token sharing
 * it without walking it. So a miss costs the bytes of the vocabulary's trie that stay inside
 * the grammar (each byte a step of every live stack), and a hit — the same state seen before
 * by any request of this grammar — a copy-free lookup.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "kvfence/utf8.h"
#include "tokenizer_internal.h"

#define KVF_GEN_MAX_STOP_IDS_GRAMMAR 16 /* stop ids kvf_grammar_apply reads at most */

struct kvf_grammar_vocab {
    uint32_t n_vocab;
    uint32_t *off; /* [n_vocab + 1]: token i's bytes are bytes[off[i] .. off[i + 1]) */
    uint8_t *bytes;
    uint32_t n_sorted; /* tokens with 1..KVF_GRAMMAR_MAX_TOKEN bytes */
    uint32_t *sorted;  /* [n_sorted] their ids in byte order */
    uint8_t *lcp;      /* [n_sorted] bytes shared with the previous one */
};

static unsigned hexd(uint8_t c)
{
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

/* Token tok's output bytes into out (room KVF_TOKENIZER_MAX_PIECE); returns their number. */
static size_t token_bytes(const kvf_tokenizer_t *t, int32_t tok, uint8_t *out)
{
    const uint8_t *p = (const uint8_t *)t->blob + t->off[tok];
    size_t n = t->len[tok], k = 0;
    switch (t->types[tok]) {
    case KVF_TOKEN_NORMAL:
    case KVF_TOKEN_USER_DEFINED:
        break;
    case KVF_TOKEN_BYTE:
        out[0] = (uint8_t)(hexd(p[3]) << 4 | hexd(p[4]));
        return 1;
    default:
        return 0; /* control, unused, unknown: no bytes of their own */
    }
    for (size_t i = 0; i < n && k < KVF_TOKENIZER_MAX_PIECE;) {
        uint32_t cp;
        size_t m = kvf_utf8_decode(p + i, n - i, &cp);
        if (m == 0) {
            out[k++] = p[i++];
            continue;
        }
        int b = t->kind == KVF__TOK_BPE && t->types[tok] == KVF_TOKEN_NORMAL ? kvf__bpe_cp_byte(cp)
                                                                             : -1;
        if (b >= 0) {
            out[k++] = (uint8_t)b;
        } else if (t->kind == KVF__TOK_SPM && cp == 0x2581) {
            out[k++] = ' ';
        } else {
            for (size_t j = 0; j < m && k < KVF_TOKENIZER_MAX_PIECE; j++)
                out[k++] = p[i + j];
        }
        i += m;
    }
    return k;
}

static const struct kvf_grammar_vocab *sort_v;
static int by_bytes(const void *a, const void *b)
{
    const struct kvf_grammar_vocab *v = sort_v;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    uint32_t nx = v->off[x + 1] - v->off[x], ny = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], nx < ny ? nx : ny);
    if (c) return c;
    if (nx != ny) return nx < ny ? -1 : 1;
    return (x > y) - (x < y);
}

int kvf_grammar_vocab_create(const kvf_tokenizer_t *t, kvf_grammar_vocab_t **out)
{
    struct kvf_grammar_vocab *v = calloc(1, sizeof *v);
    uint8_t *buf = malloc(KVF_TOKENIZER_MAX_PIECE * 4);
    if (!v || !buf) goto nomem;
    v->n_vocab = t->n_vocab;
    v->off = malloc(((size_t)t->n_vocab + 1) * sizeof *v->off);
    size_t total = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        total += token_bytes(t, (int32_t)i, buf);
    v->bytes = malloc(total ? total : 1);
    v->sorted = malloc(((size_t)t->n_vocab + 1) * sizeof *v->sorted);
    v->lcp = malloc((size_t)t->n_vocab + 1);
    if (!v->off || !v->bytes || !v->sorted || !v->lcp) goto nomem;
    size_t at = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        v->off[i] = (uint32_t)at;
        size_t n = token_bytes(t, (int32_t)i, buf);
        memcpy(v->bytes + at, buf, n);
        at += n;
        if (n >= 1 && n <= KVF_GRAMMAR_MAX_TOKEN) v->sorted[v->n_sorted++] = i;
    }
    v->off[t->n_vocab] = (uint32_t)at;
    /* One vocabulary is sorted at a time (the comparator reads sort_v); creation runs at
     * startup, before any worker thread. */
    sort_v = v;
    qsort(v->sorted, v->n_sorted, sizeof *v->sorted, by_bytes);
    sort_v = NULL;
    for (uint32_t i = 0; i < v->n_sorted; i++) {
        uint32_t l = 0;
        if (i > 0) {
            uint32_t a = v->sorted[i - 1], b = v->sorted[i];
            uint32_t na = v->off[a + 1] - v->off[a], nb = v->off[b + 1] - v->off[b];
            while (l < na && l < nb && v->bytes[v->off[a] + l] == v->bytes[v->off[b] + l])
                l++;
        }
        v->lcp[i] = (uint8_t)l;
    }
    free(buf);
    *out = v;
    return 0;
nomem:
    free(buf);
    kvf_grammar_vocab_free(v);
    return -ENOMEM;
}

void kvf_grammar_vocab_free(kvf_grammar_vocab_t *v)
{
    if (!v) return;
    free(v->off);
    free(v->bytes);
    free(v->sorted);
    free(v->lcp);
    free(v);
}

uint32_t kvf_grammar_vocab_n(const kvf_grammar_vocab_t *v)
{
    return v->n_vocab;
}

int kvf_grammar_state_advance(const kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                              struct kvf_grammar_state *s, int32_t tok)
{
    if (tok < 0 || (uint32_t)tok >= v->n_vocab) return -EINVAL;
    uint32_t n = v->off[tok + 1] - v->off[tok];
    if (n == 0) return -EINVAL;
    return kvf_grammar_state_feed(g, s, v->bytes + v->off[tok], n);
}

/* --- The cache. ------------------------------------------------------------------------------ */

void kvf__grammar_cache_clear(kvf_grammar_t *g)
{
    if (!g->cache) return;
    for (uint32_t i = 0; i < KVF__GCACHE_SLOTS; i++) {
        struct kvf__gcache *e = g->cache[i];
        while (e) {
            struct kvf__gcache *next = e->next;
            free(e);
            e = next;
        }
        g->cache[i] = NULL;
    }
    g->cache_bytes = 0;
}

static uint64_t hash_words(const uint32_t *w, uint32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

/* The walk (see the header comment): sets the bits of every token allowed from s. */
static int walk(const kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                const struct kvf_grammar_state *s, uint64_t *bits)
{
    struct kvf_grammar_state *lv = malloc((KVF_GRAMMAR_MAX_TOKEN + 1) * sizeof *lv);
    if (!lv) return -ENOMEM;
    memcpy(&lv[0], s, offsetof(struct kvf_grammar_state, w) + s->n * sizeof(uint32_t));
    uint32_t valid = 0, dead = UINT32_MAX;
    for (uint32_t i = 0; i < v->n_sorted; i++) {
        uint32_t tok = v->sorted[i], l = v->lcp[i];
        if (dead <= l) continue;
        dead = UINT32_MAX;
        const uint8_t *b = v->bytes + v->off[tok];
        uint32_t n = v->off[tok + 1] - v->off[tok];
        uint32_t d = l < valid ? l : valid;
        while (d < n) {
            kvf__grammar_step(g, &lv[d], b[d], &lv[d + 1]);
            if (lv[d + 1].n == 0) {
                dead = d + 1;
                break;
            }
            d++;
        }
        valid = d;
        if (d == n) bits[tok >> 6] |= 1ull << (tok & 63);
    }
    free(lv);
    return 0;
}

const uint64_t *kvf_grammar_mask(kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                                 const struct kvf_grammar_state *s)
{
    size_t words = ((size_t)v->n_vocab + 63) / 64;
    if (g->cache_vocab != v->n_vocab) {
        kvf__grammar_cache_clear(g);
        free(g->work);
        g->work = NULL;
        g->cache_vocab = v->n_vocab;
    }
    if (!g->cache && !(g->cache = calloc(KVF__GCACHE_SLOTS, sizeof *g->cache))) return NULL;
    uint64_t h = hash_words(s->w, s->n);
    struct kvf__gcache **slot = &g->cache[h % KVF__GCACHE_SLOTS];
    for (struct kvf__gcache *e = *slot; e; e = e->next)
        if (e->hash == h && e->n_key == s->n && memcmp(e->key, s->w, s->n * 4) == 0) return e->bits;
    size_t bytes = sizeof(struct kvf__gcache) + words * 8 + (size_t)s->n * 4;
    if (g->cache_bytes + bytes > KVF_GRAMMAR_CACHE_BYTES) kvf__grammar_cache_clear(g);
    struct kvf__gcache *e = calloc(1, bytes);
    if (!e) return NULL;
    e->bits = (uint64_t *)(e + 1);
    e->key = (uint32_t *)(e->bits + words);
    e->hash = h;
    e->n_key = s->n;
    memcpy(e->key, s->w, (size_t)s->n * 4);
    if (walk(g, v, s, e->bits) < 0) {
        free(e);
        return NULL;
    }
    e->next = *slot;
    *slot = e;
    g->cache_bytes += bytes;
    return e->bits;
}

int kvf_grammar_apply(kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                      const struct kvf_grammar_state *s, float *logits, uint32_t n_vocab,
                      const int32_t *stop_ids, uint32_t n_stop_ids)
{
    return kvf_grammar_apply_to(g, v, s, logits, logits, n_vocab, stop_ids, n_stop_ids);
}

int kvf_grammar_apply_to(kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                         const struct kvf_grammar_state *s, const float *src, float *dst,
                         uint32_t n_vocab, const int32_t *stop_ids, uint32_t n_stop_ids)
{
    const uint64_t *bits = kvf_grammar_mask(g, v, s);
    if (!bits) return -ENOMEM;
    bool done = kvf_grammar_state_done(s);
    uint32_t nv = n_vocab < v->n_vocab ? n_vocab : v->n_vocab;
    float keep[KVF_GEN_MAX_STOP_IDS_GRAMMAR];
    uint32_t ns =
        n_stop_ids < KVF_GEN_MAX_STOP_IDS_GRAMMAR ? n_stop_ids : KVF_GEN_MAX_STOP_IDS_GRAMMAR;
    for (uint32_t k = 0; k < ns; k++)
        keep[k] = stop_ids[k] >= 0 && (uint32_t)stop_ids[k] < n_vocab ? src[stop_ids[k]] : 0.0f;
    /* One pass, a word of the mask at a time: most words are all clear (or all set). */
    int allowed = 0;
    uint32_t full = nv & ~63u;
    for (uint32_t i = 0; i < full; i += 64) {
        uint64_t w = bits[i >> 6];
        if (w == 0) {
            for (uint32_t k = 0; k < 64; k++)
                dst[i + k] = -INFINITY;
        } else if (w == ~0ull) {
            if (dst != src) memcpy(dst + i, src + i, 64 * sizeof *dst);
            allowed += 64;
        } else {
            for (uint32_t k = 0; k < 64; k++) {
                bool on = w >> k & 1;
                dst[i + k] = on ? src[i + k] : -INFINITY;
                allowed += on;
            }
        }
    }
    for (uint32_t i = full; i < n_vocab; i++) {
        bool on = i < nv && (bits[i >> 6] >> (i & 63) & 1);
        dst[i] = on ? src[i] : -INFINITY;
        allowed += on;
    }
    for (uint32_t k = 0; k < ns; k++) {
        int32_t t = stop_ids[k];
        if (t < 0 || (uint32_t)t >= n_vocab) continue;
        bool was = dst[t] != -INFINITY;
        if (done && !was) {
            dst[t] = keep[k];
            allowed++;
        } else if (!done && was) {
            dst[t] = -INFINITY;
            allowed--;
        }
    }
    return allowed;
}
