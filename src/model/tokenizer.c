/* The SentencePiece ("llama") tokenizer: building it from a GGUF vocabulary, and encoding.
 *
 * Encoding merges adjacent symbols by score, the way SentencePiece's BPE model does: start from
 * one symbol per character, keep every adjacent pair whose concatenation is a piece in a max-heap
 * keyed by that piece's score (leftmost first on ties), and repeatedly merge the best pair. A
 * pair in the heap goes stale when either side has since been merged; it is recognized by its
 * recorded length no longer matching and skipped. Symbols that end up not being pieces are
 * spelled with byte tokens. */
#include <stdlib.h>
#include <string.h>

#include "gguf_internal.h"
#include "kvfence/common.h"
#include "kvfence/tokenizer.h"
#include "tokenizer_internal.h"

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, which SentencePiece writes for a space */

static void free_parts(kvf_tokenizer_t *t)
{
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t->scores);
    free(t->types);
    free(t->table);
    free(t);
}

void kvf_tokenizer_destroy(kvf_tokenizer_t *t)
{
    if (t) free_parts(t);
}

int32_t kvf__tokenizer_lookup(const kvf_tokenizer_t *t, const char *s, size_t n)
{
    size_t i = (size_t)kvf__gguf_hash(s, n) & (t->table_cap - 1);
    for (;; i = (i + 1) & (t->table_cap - 1)) {
        uint32_t e = t->table[i];
        if (e == 0) return -1;
        if (t->len[e - 1] == n && memcmp(t->blob + t->off[e - 1], s, n) == 0)
            return (int32_t)(e - 1);
    }
}

/* Reads an optional special-token id: absent gives -1, present must name a token. */
static int special_id(const kvf_gguf_t *g, const char *key, uint32_t n_vocab, int32_t *out,
                      char *err, size_t err_len)
{
    uint32_t id;
    int rc = kvf_gguf_get_u32(g, key, &id);
    if (rc == KVF_E_MODEL_MISSING) {
        *out = -1;
        return 0;
    }
    if (rc < 0 || id >= n_vocab)
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT, "%s is not a token id", key);
    *out = (int32_t)id;
    return 0;
}

/* Checks that key, if present, is an array of n elements of the named kind. */
static int optional_array(const kvf_gguf_t *g, const char *key, uint64_t n, bool *present,
                          char *err, size_t err_len)
{
    uint32_t et;
    uint64_t len;
    int rc = kvf_gguf_get_arr(g, key, &et, &len);
    *present = rc == 0;
    if (rc == KVF_E_MODEL_MISSING) return 0;
    if (rc < 0 || len != n)
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                              "%s is not an array of %llu elements", key, (unsigned long long)n);
    return 0;
}

/* Parses "<0xXX>" (upper- or lower-case hex) into *b. */
static bool parse_byte_piece(const char *s, size_t n, uint8_t *b)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                            : 16u;
        if (d > 15) return false;
        v = v * 16 + d;
    }
    *b = (uint8_t)v;
    return true;
}

/* Copies the pieces, scores and types out of g. */
static int load_vocab(kvf_tokenizer_t *t, const kvf_gguf_t *g, char *err, size_t err_len)
{
    const char *s;
    size_t n;
    bool has_scores = false, has_types = false;
    int rc = optional_array(g, "tokenizer.ggml.scores", t->n_vocab, &has_scores, err, err_len);
    if (rc == 0)
        rc = optional_array(g, "tokenizer.ggml.token_type", t->n_vocab, &has_types, err, err_len);
    if (rc < 0) return rc;
    /* First pass: piece lengths, so the blob is allocated once. */
    uint64_t total = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if ((rc = kvf_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &s, &n)) < 0)
            return kvf__gguf_fail(err, err_len, rc, "token %u: %s", i, kvf_strerror(rc));
        if (n > KVF_TOKENIZER_MAX_PIECE)
            return kvf__gguf_fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                                  "token %u is %zu bytes long (at most %d supported)", i, n,
                                  KVF_TOKENIZER_MAX_PIECE);
        total += n + 1;
    }
    if (total > UINT32_MAX)
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_UNSUPPORTED, "vocabulary text over 4 GiB");
    t->blob = malloc((size_t)total);
    if (!t->blob) return kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
    uint32_t pos = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        kvf_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &s, &n);
        memcpy(t->blob + pos, s, n);
        t->blob[pos + n] = '\0';
        t->off[i] = pos;
        t->len[i] = (uint16_t)n;
        pos += (uint32_t)n + 1;
        float score = 0.0f;
        if (has_scores && kvf_gguf_get_arr_f32(g, "tokenizer.ggml.scores", i, &score) < 0)
            return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                                  "tokenizer.ggml.scores is not an array of f32");
        int32_t type = KVF_TOKEN_NORMAL;
        if (has_types && kvf_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", i, &type) < 0)
            return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                                  "tokenizer.ggml.token_type is not an array of integers");
        if (type < KVF_TOKEN_NORMAL || type > KVF_TOKEN_BYTE)
            return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                                  "token %u has type %d (1..6 allowed)", i, (int)type);
        t->scores[i] = score;
        t->types[i] = (uint8_t)type;
    }
    return 0;
}

/* Indexes the mergeable pieces and the byte tokens. A piece that appears twice keeps its
 * first id, as SentencePiece does. */
static int index_vocab(kvf_tokenizer_t *t, char *err, size_t err_len)
{
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = -1;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        const char *s = t->blob + t->off[i];
        if (t->types[i] == KVF_TOKEN_BYTE) {
            uint8_t b;
            if (!parse_byte_piece(s, t->len[i], &b))
                return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                                      "byte token %u is '%.*s', not <0xXX>", i, (int)t->len[i], s);
            if (t->byte_tok[b] < 0) t->byte_tok[b] = (int32_t)i;
            continue;
        }
        if (t->types[i] != KVF_TOKEN_NORMAL && t->types[i] != KVF_TOKEN_USER_DEFINED) continue;
        if (t->len[i] == 0) continue;
        size_t slot = (size_t)kvf__gguf_hash(s, t->len[i]) & (t->table_cap - 1);
        for (;; slot = (slot + 1) & (t->table_cap - 1)) {
            uint32_t e = t->table[slot];
            if (e == 0) {
                t->table[slot] = i + 1;
                break;
            }
            if (t->len[e - 1] == t->len[i] && memcmp(t->blob + t->off[e - 1], s, t->len[i]) == 0)
                break;
        }
    }
    return 0;
}

int kvf_tokenizer_create(const kvf_gguf_t *g, kvf_tokenizer_t **out, char *err, size_t err_len)
{
    if (err && err_len) err[0] = '\0';
    if (!g || !out) return kvf__gguf_fail(err, err_len, -EINVAL, "invalid argument");
    const char *model;
    size_t model_len;
    int rc = kvf_gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len);
    if (rc < 0)
        return kvf__gguf_fail(err, err_len, rc, "tokenizer.ggml.model: %s", kvf_strerror(rc));
    if (model_len != 5 || memcmp(model, "llama", 5) != 0)
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                              "tokenizer model '%.*s' is not supported (only 'llama', "
                              "SentencePiece)",
                              model_len > 64 ? 64 : (int)model_len, model);
    uint32_t et;
    uint64_t n;
    rc = kvf_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n);
    if (rc < 0)
        return kvf__gguf_fail(err, err_len, rc, "tokenizer.ggml.tokens: %s", kvf_strerror(rc));
    if (et != KVF_GGUF_STRING || n == 0 || n > INT32_MAX - 1)
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT,
                              "tokenizer.ggml.tokens is not a non-empty array of strings");
    kvf_tokenizer_t *t = calloc(1, sizeof *t);
    if (!t) return kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
    t->n_vocab = (uint32_t)n;
    t->table_cap = kvf__gguf_table_cap(n);
    t->off = malloc(n * sizeof *t->off);
    t->len = malloc(n * sizeof *t->len);
    t->scores = malloc(n * sizeof *t->scores);
    t->types = malloc(n);
    t->table = t->table_cap ? calloc(t->table_cap, sizeof *t->table) : NULL;
    if (!t->off || !t->len || !t->scores || !t->types || !t->table) {
        rc = kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
        goto free_t;
    }
    if ((rc = load_vocab(t, g, err, err_len)) < 0) goto free_t;
    if ((rc = index_vocab(t, err, err_len)) < 0) goto free_t;
    if ((rc = special_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err, err_len)) <
            0 ||
        (rc = special_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err, err_len)) <
            0 ||
        (rc = special_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err, err_len)) <
            0)
        goto free_t;
    t->add_space_prefix = true;
    bool b;
    if (kvf_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == 0) t->add_space_prefix = b;
    /* Every text must encode: any byte without its own token needs <unk> to stand in. */
    for (int i = 0; i < 256; i++) {
        if (t->byte_tok[i] < 0 && t->unk < 0) {
            rc = kvf__gguf_fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                                "the vocabulary has no token for byte 0x%02X and no <unk>", i);
            goto free_t;
        }
    }
    *out = t;
    return 0;
free_t:
    free_parts(t);
    return rc;
}

uint32_t kvf_tokenizer_n_vocab(const kvf_tokenizer_t *t)
{
    return t->n_vocab;
}

int32_t kvf_tokenizer_bos(const kvf_tokenizer_t *t)
{
    return t->bos;
}

int32_t kvf_tokenizer_eos(const kvf_tokenizer_t *t)
{
    return t->eos;
}

int32_t kvf_tokenizer_unk(const kvf_tokenizer_t *t)
{
    return t->unk;
}

int kvf_tokenizer_type(const kvf_tokenizer_t *t, int32_t tok)
{
    return tok >= 0 && (uint32_t)tok < t->n_vocab ? t->types[tok] : 0;
}

const char *kvf_tokenizer_piece(const kvf_tokenizer_t *t, int32_t tok, size_t *len)
{
    if (tok < 0 || (uint32_t)tok >= t->n_vocab) return NULL;
    if (len) *len = t->len[tok];
    return t->blob + t->off[tok];
}

/* ---- encoding ---- */

struct sym {
    int32_t prev, next; /* neighbours in the live list, -1 at the ends */
    uint32_t start, n;  /* bytes of the normalized text; n == 0 once merged away */
};

struct pair {
    int32_t left, right;
    uint32_t n; /* the merged length when queued; stale if the sides changed since */
    float score;
};

/* True if a should pop before b: higher score, then leftmost. */
static bool better(const struct pair *a, const struct pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

struct heap {
    struct pair *v;
    size_t n;
};

static void heap_push(struct heap *h, struct pair p)
{
    size_t i = h->n++;
    while (i > 0 && better(&p, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = p;
}

static struct pair heap_pop(struct heap *h)
{
    struct pair top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && better(&h->v[c + 1], &h->v[c])) c++;
        if (!better(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

/* Queues the pair (l, r) if their concatenation is a piece. */
static void try_pair(const kvf_tokenizer_t *t, const char *text, const struct sym *sy,
                     struct heap *h, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return;
    uint32_t n = sy[l].n + sy[r].n;
    if (n > KVF_TOKENIZER_MAX_PIECE) return; /* no piece is that long: skip hashing it */
    int32_t id = kvf__tokenizer_lookup(t, text + sy[l].start, n);
    if (id < 0) return;
    heap_push(h, (struct pair){l, r, n, t->scores[id]});
}

/* Appends token id to out if it fits; always counts it. */
static void emit(int32_t *out, size_t max_out, size_t *count, int32_t id)
{
    if (*count < max_out) out[*count] = id;
    (*count)++;
}

int kvf_tokenizer_encode(const kvf_tokenizer_t *t, const char *text, size_t len, bool add_bos,
                         int32_t *out, size_t max_out)
{
    if (!t || (!text && len) || (!out && max_out)) return -EINVAL;
    /* The text must be valid UTF-8; count its spaces to size the normalized copy. */
    size_t n_spaces = 0;
    for (size_t i = 0; i < len;) {
        size_t k = kvf__utf8_seq_len((const uint8_t *)text + i, len - i);
        if (k == 0) return -EILSEQ;
        n_spaces += text[i] == ' ';
        i += k;
    }
    bool prefix = len > 0 && t->add_space_prefix;
    /* Each space grows by two bytes; the prefix adds three. Keep offsets within int32. */
    if (len > (size_t)INT32_MAX / 3 - 3) return -EOVERFLOW;
    size_t norm_len = len + 2 * n_spaces + (prefix ? 3 : 0);
    char *norm = malloc(norm_len ? norm_len : 1);
    struct sym *sy = malloc((norm_len ? norm_len : 1) * sizeof *sy);
    struct heap h = {malloc((3 * norm_len + 1) * sizeof *h.v), 0};
    int rc = 0;
    if (!norm || !sy || !h.v) {
        rc = -ENOMEM;
        goto free_all;
    }
    size_t p = 0;
    if (prefix) memcpy(norm, SPACE_MARK, 3), p = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ')
            memcpy(norm + p, SPACE_MARK, 3), p += 3;
        else
            norm[p++] = text[i];
    }
    /* One symbol per character. */
    int32_t n_sym = 0;
    for (size_t i = 0; i < norm_len;) {
        size_t k = kvf__utf8_seq_len((const uint8_t *)norm + i, norm_len - i);
        sy[n_sym] = (struct sym){n_sym - 1, n_sym + 1, (uint32_t)i, (uint32_t)k};
        n_sym++;
        i += k;
    }
    if (n_sym > 0) sy[n_sym - 1].next = -1;
    for (int32_t i = 0; i + 1 < n_sym; i++)
        try_pair(t, norm, sy, &h, i, i + 1);
    /* Merge the best pair until none is left. Each merge removes a symbol and queues at most
     * two pairs, so the heap never exceeds 3 * n_sym entries. */
    while (h.n > 0) {
        struct pair b = heap_pop(&h);
        struct sym *l = &sy[b.left], *r = &sy[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.n || l->next != b.right) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        try_pair(t, norm, sy, &h, l->prev, b.left);
        try_pair(t, norm, sy, &h, b.left, l->next);
    }
    size_t count = 0;
    if (add_bos && t->bos >= 0) emit(out, max_out, &count, t->bos);
    for (int32_t i = n_sym > 0 ? 0 : -1; i >= 0; i = sy[i].next) {
        int32_t id = kvf__tokenizer_lookup(t, norm + sy[i].start, sy[i].n);
        if (id >= 0) {
            emit(out, max_out, &count, id);
            continue;
        }
        for (uint32_t k = 0; k < sy[i].n; k++) {
            uint8_t byte = (uint8_t)norm[sy[i].start + k];
            emit(out, max_out, &count, t->byte_tok[byte] >= 0 ? t->byte_tok[byte] : t->unk);
        }
    }
    rc = count > INT32_MAX ? -EOVERFLOW : (int)count;
free_all:
    free(norm);
    free(sy);
    free(h.v);
    return rc;
}
