/* mkmodel_hist: the "hist" test model, a constructed Llama whose greedy output a person can read
 * and predict, so that a request attending over pages it does not own shows it in its text.
 *
 * What it computes. Greedy decoding continues with the vocabulary word seen most often among
 * every position the new token attends to (the prompt, what was generated, and — through a
 * faulty page table — anything else), the alphabetically first on a tie, and with </s> when
 * no word is visible at all. Only the whole-word pieces of the list below count; <unk>, <s>,
 * </s>, byte tokens and the pieces that only exist as merge steps ("▁ca" on the way to
 * "▁canary") are never counted. So "canary canary apple" continues " canary canary canary ...",
 * and a request whose attention reads another tenant's pages full of "zebra" says " zebra".
 *
 * Vocabulary (SentencePiece "llama", N_VOCAB ids):
 *   0 <unk>, 1 <s>, 2 </s>; 3..258 <0x00>..<0xFF>; then the N_WORDS words of `words` as "▁word"
 *   in the list's (strcmp) order, word j at id FIRST_WORD + j; then every proper prefix "▁w..."
 *   of a word that is not itself a word (the tokenizer only merges pairs whose concatenation is
 *   a piece, so "▁canary" is reached through "▁c", "▁ca", ...); then <extra_N> (unused) up to
 *   N_VOCAB. Scores are the piece's length in bytes. Words are lower case ASCII; anything else
 *   is spelled with byte tokens and counts for nothing.
 *
 * Shape: dim 512, 1 layer, 8 heads = 8 K/V heads of 64, ffn 64, context 4096. The residual
 * stream has two halves of HALF = 256 coordinates:
 *
 *   coordinate       meaning
 *   j  (< N_WORDS)   the current token is word j                        (embedding)
 *   SLOT_OTHER       the current token is not a word                    (embedding)
 *   SLOT_CONST       every token                                        (embedding)
 *   HALF + j         how often word j occurs in the visible context     (attention)
 *   HALF + N_WORDS   a constant, read as the logit of </s>              (embedding)
 *
 * Weights (every one not listed is 0; the norms are all 1):
 *   token_embd[t] = S at the token's slot (j or SLOT_OTHER) and at SLOT_CONST, B at HALF+N_WORDS
 *   attn_q = attn_k = 0       every score is 0: causal attention is the plain mean over 0..pos
 *   attn_v[HALF+j][j] = G     the value of word j is G·16 at coordinate HALF + j, others 0
 *   attn_output = O · I on the second half
 *   ffn_gate = ffn_up = ffn_down = 0
 *   output[FIRST_WORD+j][HALF+j] = P, output[</s>][HALF+N_WORDS] = P
 * so after the layer x = embedding + O·G·16·count/n in the second half (n = visible positions),
 * and logit(word j) = c·count_j/n, logit(</s>) = c'·B, every other logit 0, with c, c' > 0 the
 * final norm's common scale. The current token's own slot sits in the first half, which the
 * output never reads: it gets no bonus beyond its count.
 *
 * The scales, and why ties are exact. S = 512 with the constant slot makes mean(x²) = 2·S²/512
 * = 1024 (B² is far below what moves it), so the attention norm's scale 1/√(1024 + ε) rounds to
 * exactly 1/32 and the normed slot is exactly 16. G = 127/2048 then gives every word the same
 * value V = 127/128, a number of 7 significant bits: the attention sums count·V exactly in any
 * order and any segmenting (the weights exp(0) are exactly 1), so equal counts give equal bits
 * and the greedy pick of the lowest id decides ties. G, O and P are 127·2^-k, which Q8_0 stores
 * exactly (scale 2^-k, quant 127). With Q8_0 weights the engine keeps K/V as IEEE halves, and
 * storing V rounds away the activation quantization's error (far below half a unit of the
 * half's last place), so ties stay exact there too; with Q8_0 weights and f32 K/V they are
 * exact only up to rounding. O = 1016 keeps one count at the longest context (0.25 at n =
 * 4096) above B = 1/16 and over fifteen steps of the 16-bit activation quantization before the
 * output projection, so </s> wins only when no word is visible.
 *
 * Work: building is O(N_VOCAB · dim); memory is a few rows plus the vocabulary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_internal.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"

#define DIM        512u
#define HALF       (DIM / 2)
#define FFN        64u
#define N_VOCAB    KVF__HIST_N_VOCAB
#define FIRST_WORD KVF__HIST_FIRST_WORD
#define EOS_ID     2u

#define S_EMB 512.0f
#define B_EOS (1.0f / 16)
#define G_V   (127.0f / 2048)
#define O_OUT (127.0f * 8)
#define P_OUT (127.0f / 32)

static const char *const words[] = {
    "0",      "1",      "2",      "3",      "4",      "5",       "6",      "7",      "8",
    "9",      "a",      "about",  "after",  "again",  "all",     "also",   "an",     "and",
    "animal", "answer", "any",    "apple",  "are",    "as",      "ask",    "at",     "away",
    "back",   "bad",    "banana", "be",     "bear",   "because", "bed",    "been",   "before",
    "best",   "big",    "bird",   "black",  "blue",   "book",    "box",    "boy",    "bread",
    "but",    "by",     "call",   "came",   "can",    "canary",  "car",    "cat",    "city",
    "cold",   "come",   "could",  "cow",    "day",    "did",     "do",     "dog",    "door",
    "down",   "duck",   "each",   "earth",  "eat",    "egg",     "eight",  "end",    "even",
    "eye",    "falcon", "far",    "fast",   "find",   "fire",    "first",  "fish",   "five",
    "fly",    "food",   "for",    "four",   "fox",    "friend",  "from",   "garden", "gave",
    "get",    "girl",   "give",   "go",     "gold",   "good",    "great",  "green",  "hand",
    "happy",  "has",    "have",   "he",     "hello",  "her",     "here",   "him",    "his",
    "home",   "horse",  "hot",    "house",  "how",    "i",       "if",     "in",     "into",
    "is",     "it",     "just",   "key",    "king",   "know",    "lamp",   "last",   "left",
    "lemon",  "let",    "light",  "like",   "lion",   "little",  "long",   "look",   "love",
    "make",   "man",    "many",   "me",     "moon",   "more",    "most",   "mouse",  "my",
    "name",   "new",    "night",  "nine",   "no",     "not",     "now",    "number", "of",
    "off",    "old",    "on",     "one",    "only",   "or",      "orange", "other",  "our",
    "out",    "over",   "owl",    "paper",  "people", "pig",     "place",  "play",   "queen",
    "rabbit", "rain",   "read",   "red",    "right",  "river",   "road",   "run",    "said",
    "same",   "say",    "sea",    "see",    "seven",  "she",     "ship",   "six",    "small",
    "snow",   "so",     "some",   "song",   "star",   "stone",   "sun",    "table",  "take",
    "tell",   "ten",    "than",   "that",   "the",    "their",   "them",   "then",   "there",
    "they",   "thing",  "think",  "this",   "three",  "tiger",   "time",   "to",     "tree",
    "two",    "under",  "up",     "us",     "use",    "very",    "wall",   "want",   "was",
    "water",  "way",    "we",     "well",   "went",   "what",    "when",   "where",  "which",
    "white",  "who",    "why",    "will",   "wind",   "with",    "word",   "work",   "world",
    "would",  "write",  "year",   "yellow", "yes",    "you",     "your",   "zebra",  "zero",
};

#define N_WORDS    ((uint32_t)KVF_ARRAY_LEN(words))
#define SLOT_OTHER N_WORDS
#define SLOT_CONST (N_WORDS + 1)
_Static_assert(KVF_ARRAY_LEN(words) + 2 <= HALF, "the first half holds every word's slot");

const struct kvf_mkmodel_shape kvf__mkmodel_hist_shape = {
    "hist", DIM, 1, DIM / 64, DIM / 64, FFN, N_VOCAB, 4096, false, NULL, 0, 10000.0f, NULL, 0.0f,
};

uint32_t kvf__mkmodel_hist_words(const char *const **out)
{
    if (out) *out = words;
    return N_WORDS;
}

#define SPACE_MARK "\xe2\x96\x81" /* U+2581 */

/* The vocabulary's pieces, scores and types, built once per write. */
struct vocab {
    char *toks[N_VOCAB]; /* owned */
    float scores[N_VOCAB];
    int32_t types[N_VOCAB];
    uint32_t n; /* pieces set so far */
};

static int vocab_add(struct vocab *v, const char *piece, size_t len, float score, int32_t type)
{
    if (v->n == N_VOCAB) return -ENOSPC;
    char *s = malloc(len + 1);
    if (!s) return -ENOMEM;
    memcpy(s, piece, len);
    s[len] = '\0';
    v->toks[v->n] = s;
    v->scores[v->n] = score;
    v->types[v->n++] = type;
    return 0;
}

/* Whether "▁" + w[0..len) is already a piece (a word, or a prefix added before). O(pieces). */
static bool vocab_has(const struct vocab *v, const char *w, size_t len)
{
    for (uint32_t i = FIRST_WORD; i < v->n; i++)
        if (strlen(v->toks[i]) == 3 + len && memcmp(v->toks[i] + 3, w, len) == 0) return true;
    return false;
}

/* Fills v as the header describes. -ENOSPC if the words and their prefixes exceed N_VOCAB.
 * O(N_VOCAB²) string compares for the prefixes, a few million at most. */
static int vocab_build(struct vocab *v)
{
    char buf[64];
    int rc = 0;
    for (uint32_t i = 0; i < 3 + 256 && rc == 0; i++) {
        if (i < 3) {
            static const char *const special[] = {"<unk>", "<s>", "</s>"};
            rc = vocab_add(v, special[i], strlen(special[i]), 0.0f,
                           i == 0 ? KVF_TOKEN_UNKNOWN : KVF_TOKEN_CONTROL);
        } else {
            snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
            rc = vocab_add(v, buf, strlen(buf), 0.0f, KVF_TOKEN_BYTE);
        }
    }
    for (uint32_t j = 0; j < N_WORDS && rc == 0; j++) {
        size_t len = strlen(words[j]);
        if (!ALWAYS(len + 3 < sizeof buf)) return -EINVAL;
        memcpy(buf, SPACE_MARK, 3);
        memcpy(buf + 3, words[j], len);
        rc = vocab_add(v, buf, 3 + len, (float)(3 + len), KVF_TOKEN_NORMAL);
    }
    for (uint32_t j = 0; j < N_WORDS && rc == 0; j++)
        for (size_t len = 1; len < strlen(words[j]) && rc == 0; len++) {
            if (vocab_has(v, words[j], len)) continue;
            memcpy(buf, SPACE_MARK, 3);
            memcpy(buf + 3, words[j], len);
            rc = vocab_add(v, buf, 3 + len, (float)(3 + len), KVF_TOKEN_NORMAL);
        }
    while (v->n < N_VOCAB && rc == 0) {
        snprintf(buf, sizeof buf, "<extra_%u>", v->n);
        rc = vocab_add(v, buf, strlen(buf), 0.0f, KVF_TOKEN_UNUSED);
    }
    return rc;
}

static void vocab_free(struct vocab *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        free(v->toks[i]);
}

static int add_vocab(kvf_gguf_writer_t *w, const struct vocab *v)
{
    int rc = kvf_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", 5);
    if (rc == 0)
        rc = kvf_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->toks,
                                         NULL, N_VOCAB);
    if (rc == 0) rc = kvf_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", v->scores, N_VOCAB);
    if (rc == 0)
        rc = kvf_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", v->types, N_VOCAB);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", EOS_ID);
    if (rc == 0) rc = kvf_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
    if (rc == 0) rc = kvf_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", false);
    return rc;
}

static int add_hparams(kvf_gguf_writer_t *w, uint32_t type)
{
    const struct kvf_mkmodel_shape *s = &kvf__mkmodel_hist_shape;
    int rc = kvf_gguf_writer_add_str(w, "general.architecture", "llama", 5);
    if (rc == 0) rc = kvf_gguf_writer_add_str(w, "general.name", "hist", 4);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "general.file_type", type == KVF_GGML_F32 ? 0 : 7);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.vocab_size", s->n_vocab);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.context_length", s->n_ctx);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.embedding_length", s->dim);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.block_count", s->n_layers);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.feed_forward_length", s->ffn_dim);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.attention.head_count", s->n_heads);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.attention.head_count_kv", s->n_kv_heads);
    if (rc == 0) rc = kvf_gguf_writer_add_u32(w, "llama.rope.dimension_count", s->dim / s->n_heads);
    if (rc == 0) rc = kvf_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f);
    if (rc == 0) rc = kvf_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    return rc;
}

/* Which weight a row generator produces. */
enum kind { K_ZERO, K_ONES, K_EMBD, K_WV, K_WO, K_OUT };

/* One tensor's row generator: rows of n values, mostly zero, quantized when type asks. */
struct hgen {
    enum kind kind;
    uint32_t type;
    uint32_t n;         /* values per row */
    float scratch[DIM]; /* one row before quantization (n ≤ DIM) */
};

static int hgen_row(void *ctx, uint64_t row, void *dst, size_t row_bytes)
{
    struct hgen *g = ctx;
    (void)row_bytes;
    float *x = g->type == KVF_GGML_F32 ? dst : g->scratch;
    uint32_t r = (uint32_t)row;
    memset(x, 0, g->n * sizeof(float));
    bool word = r >= FIRST_WORD && r < FIRST_WORD + N_WORDS;
    switch (g->kind) {
    case K_ZERO:
        break;
    case K_ONES:
        for (uint32_t i = 0; i < g->n; i++)
            x[i] = 1.0f;
        break;
    case K_EMBD: /* row r: token r */
        x[word ? r - FIRST_WORD : SLOT_OTHER] = S_EMB;
        x[SLOT_CONST] = S_EMB;
        x[HALF + N_WORDS] = B_EOS;
        break;
    case K_WV: /* row r: value coordinate r */
        if (r >= HALF && r < HALF + N_WORDS) x[r - HALF] = G_V;
        break;
    case K_WO: /* row r: residual coordinate r */
        if (r >= HALF) x[r] = O_OUT;
        break;
    case K_OUT: /* row r: the logit of token r */
        if (word) x[HALF + (r - FIRST_WORD)] = P_OUT;
        if (r == EOS_ID) x[HALF + N_WORDS] = P_OUT;
        break;
    }
    if (g->type == KVF_GGML_Q8_0) kvf_quantize_row_q8_0(x, dst, g->n);
    return 0;
}

#define N_TENSORS 12

struct build {
    kvf_gguf_writer_t *w;
    struct hgen gens[N_TENSORS];
    uint32_t n_gens;
    uint32_t type;
    int rc;
};

/* Adds tensor `name` of ne0 × ne1 (ne1 == 0: 1-D, always F32). Errors stick in b->rc. */
static void add(struct build *b, const char *name, uint32_t ne0, uint32_t ne1, enum kind kind)
{
    if (b->rc < 0) return;
    if (!ALWAYS(b->n_gens < N_TENSORS && ne0 <= DIM)) {
        b->rc = -EINVAL;
        return;
    }
    struct hgen *g = &b->gens[b->n_gens++];
    g->kind = kind;
    g->n = ne0;
    g->type = ne1 && b->type == KVF_GGML_Q8_0 ? KVF_GGML_Q8_0 : KVF_GGML_F32;
    uint64_t ne[2] = {ne0, ne1};
    b->rc = kvf_gguf_writer_add_tensor(b->w, name, g->type, ne1 ? 2 : 1, ne, NULL, hgen_row, g);
}

int kvf__mkmodel_hist_write(const char *path, uint32_t type, char *err, size_t err_len)
{
    if (err && err_len) err[0] = '\0';
    if (!path || (type != KVF_GGML_F32 && type != KVF_GGML_Q8_0))
        return kvf__gguf_fail(err, err_len, -EINVAL, "invalid path or type");
    struct vocab *v = calloc(1, sizeof *v);
    struct build *b = calloc(1, sizeof *b);
    int rc = -ENOMEM;
    if (!v || !b) {
        kvf__gguf_fail(err, err_len, rc, "out of memory");
        goto free_all;
    }
    if ((rc = vocab_build(v)) < 0) {
        kvf__gguf_fail(err, err_len, rc, "the hist vocabulary does not fit %u ids", N_VOCAB);
        goto free_all;
    }
    b->type = type;
    b->rc = kvf_gguf_writer_create(0, &b->w);
    if (b->rc == 0) b->rc = add_hparams(b->w, type);
    if (b->rc == 0) b->rc = add_vocab(b->w, v);
    add(b, "token_embd.weight", DIM, N_VOCAB, K_EMBD);
    add(b, "output_norm.weight", DIM, 0, K_ONES);
    add(b, "output.weight", DIM, N_VOCAB, K_OUT);
    add(b, "blk.0.attn_norm.weight", DIM, 0, K_ONES);
    add(b, "blk.0.attn_q.weight", DIM, DIM, K_ZERO);
    add(b, "blk.0.attn_k.weight", DIM, DIM, K_ZERO);
    add(b, "blk.0.attn_v.weight", DIM, DIM, K_WV);
    add(b, "blk.0.attn_output.weight", DIM, DIM, K_WO);
    add(b, "blk.0.ffn_norm.weight", DIM, 0, K_ONES);
    add(b, "blk.0.ffn_gate.weight", DIM, FFN, K_ZERO);
    add(b, "blk.0.ffn_up.weight", DIM, FFN, K_ZERO);
    add(b, "blk.0.ffn_down.weight", FFN, DIM, K_ZERO);
    rc = b->rc;
    if (rc < 0)
        kvf__gguf_fail(err, err_len, rc, "building the model description: %s", kvf_strerror(rc));
    else
        rc = kvf_gguf_writer_write(b->w, path, err, err_len);
free_all:
    if (b) kvf_gguf_writer_destroy(b->w);
    if (v) vocab_free(v);
    free(v);
    free(b);
    return rc;
}
