/* Byte-level BPE (tokenizer.ggml.model "gpt2"): the merge table, and encoding one text segment.
 *
 * A segment is normalized (NFC for Qwen2), split by the pre-tokenizer's regex, and each piece
 * encoded alone: its bytes are written in the byte-level alphabet (one character per byte,
 * GPT-2's bytes_to_unicode), each character starts as one symbol, and the adjacent pair with
 * the lowest merge rank (leftmost on ties) is merged until no adjacent pair has a merge rule.
 * The pairs wait in a min-heap keyed (rank, position); a pair goes stale when either side is
 * merged into something else first, which is seen on popping it (the sides' ids or adjacency
 * no longer match) and it is skipped. Each merge removes a symbol and queues at most two pairs,
 * so a piece of m bytes costs O(m log m).
 *
 * Every byte's character is a token (checked at create), so every symbol left is a token. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf_internal.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/heap.h"
#include "tokenizer_internal.h"
#include "unicode.h"

/* Printable Latin-1 bytes stand for themselves; the other 68 take U+0100.. in byte order. */
static bool byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t kvf__bpe_byte_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        n += !byte_is_printable(c);
    return 0x100 + n;
}

int kvf__bpe_cp_byte(uint32_t cp)
{
    if (cp < 0x100) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    uint32_t n = cp - 0x100;
    for (unsigned c = 0; c < 256; c++)
        if (!byte_is_printable(c) && n-- == 0) return (int)c;
    return -1;
}

static uint64_t merge_key(int32_t left, int32_t right)
{
    uint64_t k = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    return k ? k : UINT64_MAX;
}

static size_t merge_slot(uint64_t key, size_t cap)
{
    return (size_t)kvf__gguf_hash(&key, sizeof key) & (cap - 1);
}

static const struct kvf__merge *merge_find(const kvf_tokenizer_t *t, int32_t left, int32_t right)
{
    uint64_t key = merge_key(left, right);
    for (size_t i = merge_slot(key, t->merges_cap);; i = (i + 1) & (t->merges_cap - 1)) {
        const struct kvf__merge *m = &t->merges[i];
        if (m->key == 0) return NULL;
        if (m->key == key) return m;
    }
}

static const struct {
    const char *name;
    enum kvf__bpe_pre pre;
} PRE_NAMES[] = {
    {"llama-bpe", KVF__PRE_LLAMA3}, {"llama3", KVF__PRE_LLAMA3}, {"qwen2", KVF__PRE_QWEN2},
    {"smollm", KVF__PRE_SMOLLM},    {"gpt-2", KVF__PRE_GPT2},    {"gpt2", KVF__PRE_GPT2},
};

static int read_pre(kvf_tokenizer_t *t, const kvf_gguf_t *g, char *err, size_t err_len)
{
    const char *s;
    size_t n;
    int rc = kvf_gguf_get_str(g, "tokenizer.ggml.pre", &s, &n);
    if (rc < 0)
        return kvf__gguf_fail(err, err_len,
                              rc == KVF_E_MODEL_MISSING ? KVF_E_MODEL_UNSUPPORTED : rc,
                              "tokenizer.ggml.pre: %s (byte-level BPE needs one of llama-bpe, "
                              "qwen2, smollm, gpt-2)",
                              kvf_strerror(rc));
    for (size_t i = 0; i < sizeof PRE_NAMES / sizeof PRE_NAMES[0]; i++) {
        if (strlen(PRE_NAMES[i].name) == n && memcmp(PRE_NAMES[i].name, s, n) == 0) {
            t->pre = PRE_NAMES[i].pre;
            t->nfc = t->pre == KVF__PRE_QWEN2;
            t->ignore_merges = t->pre == KVF__PRE_LLAMA3;
            return 0;
        }
    }
    return kvf__gguf_fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                          "pre-tokenizer '%.*s' is not supported (llama-bpe, qwen2, smollm, gpt-2 "
                          "are)",
                          n > 64 ? 64 : (int)n, s);
}

/* Reads tokenizer.ggml.merges ("left right", in rank order) into the merge table. */
static int read_merges(kvf_tokenizer_t *t, const kvf_gguf_t *g, char *err, size_t err_len)
{
    uint32_t et;
    uint64_t n;
    int rc = kvf_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n);
    if (rc < 0)
        return kvf__gguf_fail(err, err_len, rc, "tokenizer.ggml.merges: %s", kvf_strerror(rc));
    if (et != KVF_GGUF_STRING || n > UINT32_MAX / 2)
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                              "tokenizer.ggml.merges is not an array of strings");
    t->merges_cap = kvf__gguf_table_cap(n);
    t->merges = t->merges_cap ? calloc(t->merges_cap, sizeof *t->merges) : NULL;
    if (!t->merges) return kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
    char buf[2 * KVF_TOKENIZER_MAX_PIECE];
    for (uint64_t r = 0; r < n; r++) {
        const char *s;
        size_t len;
        kvf_gguf_get_arr_str(g, "tokenizer.ggml.merges", r, &s, &len);
        /* The separator is the first space after the first byte (no byte-level piece holds a
         * space; a left side is never empty). */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp || (size_t)(sp - s) + 1 >= len || len - 1 > sizeof buf)
            return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                                  "merge %llu '%.*s' is not 'left right'", (unsigned long long)r,
                                  len > 64 ? 64 : (int)len, s);
        size_t nl = (size_t)(sp - s), nr = len - nl - 1;
        int32_t left = kvf__tokenizer_lookup(t, s, nl);
        int32_t right = kvf__tokenizer_lookup(t, sp + 1, nr);
        memcpy(buf, s, nl);
        memcpy(buf + nl, sp + 1, nr);
        int32_t id = kvf__tokenizer_lookup(t, buf, nl + nr);
        if (left < 0 || right < 0 || id < 0)
            return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                                  "merge %llu '%.*s': %s is not a token", (unsigned long long)r,
                                  len > 64 ? 64 : (int)len, s,
                                  left < 0    ? "its left side"
                                  : right < 0 ? "its right side"
                                              : "the merged piece");
        uint64_t key = merge_key(left, right);
        for (size_t i = merge_slot(key, t->merges_cap);; i = (i + 1) & (t->merges_cap - 1)) {
            struct kvf__merge *m = &t->merges[i];
            if (m->key == key) break; /* a repeated rule: the first (lowest rank) stays */
            if (m->key == 0) {
                *m = (struct kvf__merge){key, (uint32_t)r, id};
                break;
            }
        }
    }
    return 0;
}

int kvf__bpe_create(kvf_tokenizer_t *t, const kvf_gguf_t *g, char *err, size_t err_len)
{
    int rc;
    if ((rc = read_pre(t, g, err, err_len)) < 0) return rc;
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        size_t k = kvf__utf8_encode(kvf__bpe_byte_cp((uint8_t)b), u);
        t->byte_char_tok[b] = kvf__tokenizer_lookup(t, (const char *)u, k);
        if (t->byte_char_tok[b] < 0)
            return kvf__gguf_fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                                  "byte-level vocabulary lacks the token of byte 0x%02X", b);
    }
    return read_merges(t, g, err, err_len);
}

/* ---- encoding ---- */

struct sym {
    int32_t prev, next; /* neighbours in the live list, -1 at the ends */
    int32_t id;         /* token, or -1 once merged into its left neighbour */
};

struct pair {
    uint32_t rank;
    int32_t left, right;       /* symbol indexes; left is also the position */
    int32_t left_id, right_id; /* the sides' tokens when queued */
};

/* The heap's order (kvf_heap_before_fn on struct pair): lower rank, then leftmost. */
static bool before(const void *pa, const void *pb)
{
    const struct pair *a = pa, *b = pb;
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void try_pair(const kvf_tokenizer_t *t, const struct sym *sy, kvf_heap_t *h, int32_t l,
                     int32_t r)
{
    if (l < 0 || r < 0) return;
    const struct kvf__merge *m = merge_find(t, sy[l].id, sy[r].id);
    /* Never full: kvf__bpe_encode gives the heap room for 3 pairs per symbol. */
    if (m) (void)kvf_heap_push(h, &(struct pair){m->rank, l, r, sy[l].id, sy[r].id});
}

static void emit(int32_t *out, size_t max_out, size_t *count, int32_t id)
{
    if (*count < max_out) out[*count] = id;
    (*count)++;
}

struct enc {
    const kvf_tokenizer_t *t;
    int32_t *out;
    size_t max_out, *count;
    /* Scratch sized for the longest piece of the segment (the segment itself). */
    struct sym *sy;
    kvf_heap_t h; /* of struct pair */
    char *mapped;
};

/* Encodes one pre-tokenized piece. */
static int encode_piece(void *ctx, const char *piece, size_t len)
{
    struct enc *e = ctx;
    const kvf_tokenizer_t *t = e->t;
    const uint8_t *p = (const uint8_t *)piece;
    if (t->ignore_merges && len <= KVF_TOKENIZER_MAX_PIECE / 2) {
        size_t m = 0;
        for (size_t i = 0; i < len; i++)
            m += kvf__utf8_encode(kvf__bpe_byte_cp(p[i]), (uint8_t *)e->mapped + m);
        int32_t id = kvf__tokenizer_lookup(t, e->mapped, m);
        if (id >= 0) {
            emit(e->out, e->max_out, e->count, id);
            return 0;
        }
    }
    struct sym *sy = e->sy;
    for (size_t i = 0; i < len; i++)
        sy[i] =
            (struct sym){(int32_t)i - 1, i + 1 < len ? (int32_t)i + 1 : -1, t->byte_char_tok[p[i]]};
    kvf_heap_clear(&e->h);
    for (size_t i = 0; i + 1 < len; i++)
        try_pair(t, sy, &e->h, (int32_t)i, (int32_t)i + 1);
    struct pair b;
    while (kvf_heap_pop(&e->h, &b) == 0) {
        struct sym *l = &sy[b.left], *r = &sy[b.right];
        if (l->id != b.left_id || r->id != b.right_id || l->next != b.right) continue;
        l->id = merge_find(t, b.left_id, b.right_id)->id;
        r->id = -1;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        try_pair(t, sy, &e->h, l->prev, b.left);
        try_pair(t, sy, &e->h, b.left, l->next);
    }
    for (int32_t i = len ? 0 : -1; i >= 0; i = sy[i].next)
        emit(e->out, e->max_out, e->count, sy[i].id);
    return 0;
}

int kvf__bpe_encode(const kvf_tokenizer_t *t, const char *text, size_t len, int32_t *out,
                    size_t max_out, size_t *count)
{
    char *norm = NULL;
    size_t norm_len = 0;
    int rc;
    if (t->nfc) {
        if ((rc = kvf__uni_nfc(text, len, &norm, &norm_len)) < 0) return rc;
        if (norm) text = norm, len = norm_len;
    }
    /* A piece is at most the whole segment; the heap holds at most 3 pairs per symbol. */
    struct enc e = {t,
                    out,
                    max_out,
                    count,
                    malloc((len + 1) * sizeof *e.sy),
                    {0},
                    malloc(KVF_TOKENIZER_MAX_PIECE)};
    kvf_heap_init(&e.h, malloc((3 * len + 1) * sizeof(struct pair)), 3 * len + 1,
                  sizeof(struct pair), before);
    if (!e.sy || !e.h.v || !e.mapped)
        rc = -ENOMEM;
    else
        rc = kvf__bpe_pre_split(t->pre, text, len, encode_piece, &e);
    free(e.sy);
    free(e.h.v);
    free(e.mapped);
    free(norm);
    return rc;
}
