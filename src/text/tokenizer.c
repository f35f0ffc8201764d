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

#include "gguf/gguf_internal.h"
#include "kvfence/common.h"
#include "kvfence/heap.h"
#include "kvfence/text.h"
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
    free(t->added);
    free(t->added_lens);
    free(t->eog);
    free(t->merges);
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
        if (t->types[i] != KVF_TOKEN_NORMAL &&
            (t->types[i] != KVF_TOKEN_USER_DEFINED || t->kind == KVF__TOK_BPE))
            continue;
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

static bool is_added(const kvf_tokenizer_t *t, uint32_t i)
{
    uint8_t ty = t->types[i];
    if (t->len[i] == 0) return false;
    return ty == KVF_TOKEN_CONTROL || ty == KVF_TOKEN_UNKNOWN ||
           (ty == KVF_TOKEN_USER_DEFINED && t->kind == KVF__TOK_BPE);
}

static int32_t added_lookup(const kvf_tokenizer_t *t, const char *s, size_t n)
{
    size_t i = (size_t)kvf__gguf_hash(s, n) & (t->added_cap - 1);
    for (;; i = (i + 1) & (t->added_cap - 1)) {
        uint32_t e = t->added[i];
        if (e == 0) return -1;
        if (t->len[e - 1] == n && memcmp(t->blob + t->off[e - 1], s, n) == 0)
            return (int32_t)(e - 1);
    }
}

/* Indexes the added tokens (see struct kvf_tokenizer). A piece listed twice keeps its first
 * id. */
static int index_added(kvf_tokenizer_t *t, char *err, size_t err_len)
{
    size_t n = 0;
    bool has_len[KVF_TOKENIZER_MAX_PIECE + 1] = {false};
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if (!is_added(t, i)) continue;
        n++;
        has_len[t->len[i]] = true;
    }
    if (n == 0) return 0;
    size_t n_lens = 0;
    for (size_t k = 0; k <= KVF_TOKENIZER_MAX_PIECE; k++)
        n_lens += has_len[k];
    t->added_cap = kvf__gguf_table_cap(n);
    t->added = t->added_cap ? calloc(t->added_cap, sizeof *t->added) : NULL;
    t->added_lens = malloc(n_lens * sizeof *t->added_lens);
    if (!t->added || !t->added_lens) return kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
    for (size_t k = KVF_TOKENIZER_MAX_PIECE + 1; k-- > 0;)
        if (has_len[k]) t->added_lens[t->n_added_lens++] = (uint16_t)k;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if (!is_added(t, i)) continue;
        const char *s = t->blob + t->off[i];
        uint8_t b = (uint8_t)s[0];
        t->added_first[b >> 3] |= (uint8_t)(1u << (b & 7));
        size_t slot = (size_t)kvf__gguf_hash(s, t->len[i]) & (t->added_cap - 1);
        for (;; slot = (slot + 1) & (t->added_cap - 1)) {
            uint32_t e = t->added[slot];
            if (e == 0) {
                t->added[slot] = i + 1;
                break;
            }
            if (t->len[e - 1] == t->len[i] && memcmp(t->blob + t->off[e - 1], s, t->len[i]) == 0)
                break;
        }
    }
    return 0;
}

/* Control tokens that end a turn or a text in the model families' chat formats. */
static const char *const EOG_PIECES[] = {
    "<|eot_id|>",    "<|eom_id|>",      "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<|end_of_text|>", "<EOT>",      "</s>",
};

static void add_eog(kvf_tokenizer_t *t, int32_t id)
{
    if (id < 0) return;
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    t->eog[t->n_eog++] = id;
}

/* Collects the end-of-generation tokens: eos, eot and eom from their keys, then every control
 * token named in EOG_PIECES. */
static int find_eog(kvf_tokenizer_t *t, const kvf_gguf_t *g, char *err, size_t err_len)
{
    const size_t n_names = sizeof EOG_PIECES / sizeof EOG_PIECES[0];
    t->eog = malloc((3 + n_names) * sizeof *t->eog);
    if (!t->eog) return kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
    int32_t eot = -1, eom = -1;
    int rc;
    if ((rc = special_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &eot, err, err_len)) < 0 ||
        (rc = special_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &eom, err, err_len)) < 0)
        return rc;
    add_eog(t, t->eos);
    add_eog(t, eot);
    add_eog(t, eom);
    for (size_t k = 0; k < n_names && t->added_cap; k++) {
        int32_t id = added_lookup(t, EOG_PIECES[k], strlen(EOG_PIECES[k]));
        if (id >= 0 && t->types[id] == KVF_TOKEN_CONTROL) add_eog(t, id);
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
    enum kvf__tok_kind kind;
    if (model_len == 5 && memcmp(model, "llama", 5) == 0)
        kind = KVF__TOK_SPM;
    else if (model_len == 4 && memcmp(model, "gpt2", 4) == 0)
        kind = KVF__TOK_BPE;
    else
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                              "tokenizer model '%.*s' is not supported ('llama', SentencePiece, "
                              "and 'gpt2', byte-level BPE, are)",
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
    t->kind = kind;
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
    t->add_space_prefix = kind == KVF__TOK_SPM;
    t->add_bos = kind == KVF__TOK_SPM;
    bool b;
    if (kvf_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == 0) t->add_space_prefix = b;
    if (kvf_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0) t->add_bos = b;
    if ((rc = index_added(t, err, err_len)) < 0 || (rc = find_eog(t, g, err, err_len)) < 0)
        goto free_t;
    if (kind == KVF__TOK_BPE) {
        if ((rc = kvf__bpe_create(t, g, err, err_len)) < 0) goto free_t;
        *out = t;
        return 0;
    }
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

bool kvf_tokenizer_wants_bos(const kvf_tokenizer_t *t)
{
    return t->add_bos && t->bos >= 0;
}

size_t kvf_tokenizer_eog(const kvf_tokenizer_t *t, const int32_t **ids)
{
    if (ids) *ids = t->eog;
    return t->n_eog;
}

bool kvf_tokenizer_is_eog(const kvf_tokenizer_t *t, int32_t tok)
{
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == tok) return true;
    return false;
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
static bool better(const void *pa, const void *pb)
{
    const struct pair *a = pa, *b = pb;
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

/* Queues the pair (l, r) if their concatenation is a piece. */
static void try_pair(const kvf_tokenizer_t *t, const char *text, const struct sym *sy,
                     kvf_heap_t *h, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return;
    uint32_t n = sy[l].n + sy[r].n;
    if (n > KVF_TOKENIZER_MAX_PIECE) return; /* no piece is that long: skip hashing it */
    int32_t id = kvf__tokenizer_lookup(t, text + sy[l].start, n);
    if (id < 0) return;
    (void)kvf_heap_push(h, &(struct pair){l, r, n, t->scores[id]}); /* never full: spm_encode */
}

/* Appends token id to out if it fits; always counts it. */
static void emit(int32_t *out, size_t max_out, size_t *count, int32_t id)
{
    if (*count < max_out) out[*count] = id;
    (*count)++;
}

/* Appends the SentencePiece tokens of one segment (valid UTF-8, no added tokens inside). */
static int spm_encode(const kvf_tokenizer_t *t, const char *text, size_t len, int32_t *out,
                      size_t max_out, size_t *count)
{
    size_t n_spaces = 0;
    for (size_t i = 0; i < len; i++)
        n_spaces += text[i] == ' ';
    bool prefix = len > 0 && t->add_space_prefix;
    /* Each space grows by two bytes; the prefix adds three. Keep offsets within int32. */
    if (len > (size_t)INT32_MAX / 3 - 3) return -EOVERFLOW;
    size_t norm_len = len + 2 * n_spaces + (prefix ? 3 : 0);
    char *norm = malloc(norm_len ? norm_len : 1);
    struct sym *sy = malloc((norm_len ? norm_len : 1) * sizeof *sy);
    kvf_heap_t h; /* of struct pair, in the order of better() */
    kvf_heap_init(&h, malloc((3 * norm_len + 1) * sizeof(struct pair)), 3 * norm_len + 1,
                  sizeof(struct pair), better);
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
        size_t k = kvf_utf8_seq_len((const uint8_t *)norm + i, norm_len - i);
        sy[n_sym] = (struct sym){n_sym - 1, n_sym + 1, (uint32_t)i, (uint32_t)k};
        n_sym++;
        i += k;
    }
    if (n_sym > 0) sy[n_sym - 1].next = -1;
    for (int32_t i = 0; i + 1 < n_sym; i++)
        try_pair(t, norm, sy, &h, i, i + 1);
    /* Merge the best pair until none is left. Each merge removes a symbol and queues at most
     * two pairs, so the heap never exceeds 3 * n_sym entries. */
    struct pair b;
    while (kvf_heap_pop(&h, &b) == 0) {
        struct sym *l = &sy[b.left], *r = &sy[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.n || l->next != b.right) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        try_pair(t, norm, sy, &h, l->prev, b.left);
        try_pair(t, norm, sy, &h, b.left, l->next);
    }
    for (int32_t i = n_sym > 0 ? 0 : -1; i >= 0; i = sy[i].next) {
        int32_t id = kvf__tokenizer_lookup(t, norm + sy[i].start, sy[i].n);
        if (id >= 0) {
            emit(out, max_out, count, id);
            continue;
        }
        for (uint32_t k = 0; k < sy[i].n; k++) {
            uint8_t byte = (uint8_t)norm[sy[i].start + k];
            emit(out, max_out, count, t->byte_tok[byte] >= 0 ? t->byte_tok[byte] : t->unk);
        }
    }
free_all:
    free(norm);
    free(sy);
    free(h.v);
    return rc;
}

/* The length of the added token at s (n bytes available; leftmost-longest), with its id in
 * *id, or 0 if none starts there. Control and unknown tokens count only when parse_special. */
static size_t match_added(const kvf_tokenizer_t *t, const char *s, size_t n, bool parse_special,
                          int32_t *id)
{
    uint8_t b = (uint8_t)s[0];
    if (!(t->added_first[b >> 3] & (1u << (b & 7)))) return 0;
    for (size_t k = 0; k < t->n_added_lens; k++) {
        size_t len = t->added_lens[k];
        if (len > n) continue;
        int32_t i = added_lookup(t, s, len);
        if (i < 0) continue;
        if (!parse_special && t->types[i] != KVF_TOKEN_USER_DEFINED) continue;
        *id = i;
        return len;
    }
    return 0;
}

static int encode_segment(const kvf_tokenizer_t *t, const char *text, size_t len, int32_t *out,
                          size_t max_out, size_t *count)
{
    if (len == 0) return 0;
    return t->kind == KVF__TOK_BPE ? kvf__bpe_encode(t, text, len, out, max_out, count)
                                   : spm_encode(t, text, len, out, max_out, count);
}

int kvf_tokenizer_encode_ex(const kvf_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                            int32_t *out, size_t max_out)
{
    if (!t || (!text && len) || (!out && max_out)) return -EINVAL;
    if (len > (size_t)INT32_MAX) return -EOVERFLOW;
    for (size_t i = 0; i < len;) {
        size_t k = kvf_utf8_seq_len((const uint8_t *)text + i, len - i);
        if (k == 0) return -EILSEQ;
        i += k;
    }
    bool parse_special = (flags & KVF_TOKENIZE_PARSE_SPECIAL) != 0;
    size_t count = 0;
    int rc = 0;
    if ((flags & KVF_TOKENIZE_ADD_BOS) && t->bos >= 0) emit(out, max_out, &count, t->bos);
    /* Added tokens cut the text into segments, each encoded alone. They are looked for at
     * character boundaries only. */
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        int32_t id;
        size_t k = t->added_cap ? match_added(t, text + i, len - i, parse_special, &id) : 0;
        if (k == 0) {
            i += kvf_utf8_seq_len((const uint8_t *)text + i, len - i);
            continue;
        }
        if ((rc = encode_segment(t, text + seg, i - seg, out, max_out, &count)) < 0) return rc;
        emit(out, max_out, &count, id);
        i += k;
        seg = i;
    }
    if ((rc = encode_segment(t, text + seg, len - seg, out, max_out, &count)) < 0) return rc;
    return count > INT32_MAX ? -EOVERFLOW : (int)count;
}

int kvf_tokenizer_encode(const kvf_tokenizer_t *t, const char *text, size_t len, bool add_bos,
                         int32_t *out, size_t max_out)
{
    return kvf_tokenizer_encode_ex(t, text, len, add_bos ? KVF_TOKENIZE_ADD_BOS : 0, out, max_out);
}
