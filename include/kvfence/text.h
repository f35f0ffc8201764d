/*
 * kvfence/text.h — a model's text: the tokenizers (text <-> tokens for the vocabulary stored in a
 * GGUF file) and the chat-template interpreter. The module (src/text) depends on kvfence/gguf.h
 * and kvfence/common.h alone; the HTTP server (kvfence/server.h) and the CLI use it.
 *
 * Tokenizers. Two models are read (tokenizer.ggml.model); any other is refused by name with
 * KVF_E_MODEL_UNSUPPORTED:
 *
 *   "llama"  SentencePiece: pieces with scores and token types, byte fallback through the
 *            <0xXX> tokens.
 *   "gpt2"   byte-level BPE: pieces written in GPT-2's byte alphabet, merge rules in rank order
 *            (tokenizer.ggml.merges), and a pre-tokenizer (tokenizer.ggml.pre) whose split regex
 *            cuts the text before merging: "llama-bpe" (Llama 3), "qwen2" (Qwen2/2.5/3, which
 *            also NFC-normalizes the text), "smollm", "gpt-2". Unicode classes (\p{L}, \p{N},
 *            White_Space) and NFC come from generated tables, no regex library.
 *
 * Encoding: the text must be valid UTF-8 (else -EILSEQ). Added tokens are found first, leftmost
 * and longest: control and unknown tokens ("<s>", "<|eot_id|>", "<|im_end|>", ...) only when
 * the caller asks (KVF_TOKENIZE_PARSE_SPECIAL: for a rendered chat template, never for user
 * text), and, in BPE vocabularies, user-defined tokens always (as the reference tokenizers do).
 * Each stretch of text between them is encoded alone:
 *   - SentencePiece: spaces become U+2581 ("▁") and one is prepended to each stretch (unless
 *     tokenizer.ggml.add_space_prefix is false); the stretch is split into characters, and
 *     adjacent symbols are merged greedily, always the pair whose merged piece has the highest
 *     score (leftmost on ties); a symbol left that is not a piece is spelled as byte tokens (or
 *     <unk> if the vocabulary lacks that byte).
 *   - byte-level BPE: the stretch is split by the pre-tokenizer's regex, and each piece merged
 *     by rank from its bytes (lowest rank first, leftmost on ties); with "llama-bpe", a piece
 *     that is a token as a whole is that token.
 * Without KVF_TOKENIZE_PARSE_SPECIAL, "<s>" in a prompt is three characters, not BOS.
 *
 * Decoding (struct kvf_detok): byte tokens become their byte, other pieces their text (in BPE
 * vocabularies, normal pieces are mapped back from the byte alphabet to bytes), control and
 * unused tokens nothing, <unk> U+FFFD; in SentencePiece vocabularies every "▁" then becomes a
 * space, also one spelled with byte tokens (so a literal U+2581 in a prompt decodes as a space,
 * as in SentencePiece).
 * Output is always valid UTF-8: a sequence split across tokens is held back until it completes, and
 * an invalid byte or an unfinished tail becomes U+FFFD.
 *
 * Ownership: a kvf_tokenizer_t copies what it needs from the GGUF file; the file may be closed
 * afterwards. It is immutable after create, so any number of threads may use it at once; a
 * kvf_detok belongs to one stream.
 *
 * Work bounds: create is O(n_vocab + n_merges) time and memory. encode of n bytes is
 * O(n log n) time plus O(n * distinct added-token lengths) to find added tokens, and O(n)
 * memory (allocated per call). detok_push is O(piece length).
 */
#ifndef KVFENCE_TEXT_H
#define KVFENCE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/gguf.h"

typedef struct kvf_tokenizer kvf_tokenizer_t;

/* Pieces longer than this are refused at create (no real vocabulary comes close). */
#define KVF_TOKENIZER_MAX_PIECE 512
/* The most bytes one kvf_detok_push or kvf_detok_finish can produce. */
#define KVF_DETOK_MAX_OUT (3 * (KVF_TOKENIZER_MAX_PIECE + 4))

/* Builds the tokenizer from g's tokenizer.ggml.* keys (g is borrowed for the call only).
 * Errors: KVF_E_MODEL_UNSUPPORTED (model other than "llama", oversized piece),
 * KVF_E_MODEL_MISSING, KVF_E_MODEL_FORMAT (array lengths disagree, ids out of range, a token
 * type out of range), -ENOMEM. On failure *out is untouched and `err` explains. */
int kvf_tokenizer_create(const kvf_gguf_t *g, kvf_tokenizer_t **out, char *err, size_t err_len);
void kvf_tokenizer_destroy(kvf_tokenizer_t *t);

uint32_t kvf_tokenizer_n_vocab(const kvf_tokenizer_t *t);
/* Special ids, or -1 when the vocabulary has none. */
int32_t kvf_tokenizer_bos(const kvf_tokenizer_t *t);
int32_t kvf_tokenizer_eos(const kvf_tokenizer_t *t);
int32_t kvf_tokenizer_unk(const kvf_tokenizer_t *t);
/* Whether the vocabulary asks for BOS at the start of a prompt (tokenizer.ggml.add_bos_token;
 * by default yes for SentencePiece, no for BPE) and has one. */
bool kvf_tokenizer_wants_bos(const kvf_tokenizer_t *t);

/* The end-of-generation tokens, each once: eos, tokenizer.ggml.eot_token_id,
 * tokenizer.ggml.eom_token_id, and every control token whose piece is an end-of-turn marker of
 * a known chat format ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
 * "<|endoftext|>", "<|end_of_text|>", "<EOT>", "</s>"). Returns their number and points *ids
 * (if ids is not NULL) at them (a view owned by t). Generation stops at any of them. */
size_t kvf_tokenizer_eog(const kvf_tokenizer_t *t, const int32_t **ids);
bool kvf_tokenizer_is_eog(const kvf_tokenizer_t *t, int32_t tok);

/* The type of token `tok` (enum kvf_token_type), or 0 if tok is out of range. */
int kvf_tokenizer_type(const kvf_tokenizer_t *t, int32_t tok);

/* Encodes len bytes of text (need not be NUL-terminated), with BOS first if add_bos. Returns
 * the number of tokens the text encodes to; if that is more than max_out, only the first
 * max_out are written (out may be NULL when max_out is 0). Negative on error: -EILSEQ for
 * invalid UTF-8, -ENOMEM, -EOVERFLOW; then out is untouched. */
int kvf_tokenizer_encode(const kvf_tokenizer_t *t, const char *text, size_t len, bool add_bos,
                         int32_t *out, size_t max_out);

/* Flags of kvf_tokenizer_encode_ex. */
#define KVF_TOKENIZE_ADD_BOS 1u /* BOS first (when the vocabulary has one) */
#define KVF_TOKENIZE_PARSE_SPECIAL                                                                 \
    2u /* control and unknown tokens' text in `text` is that token                                 \
        */

/* kvf_tokenizer_encode with flags (KVF_TOKENIZE_*); same results and errors. */
int kvf_tokenizer_encode_ex(const kvf_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                            int32_t *out, size_t max_out);

/* The raw piece of `tok` as stored in the vocabulary (a view owned by t, NUL-terminated, *len
 * bytes), or NULL if tok is out of range. */
const char *kvf_tokenizer_piece(const kvf_tokenizer_t *t, int32_t tok, size_t *len);

/* Streaming detokenizer state: bytes of a UTF-8 sequence that has not completed yet. */
struct kvf_detok {
    uint8_t pend[4];  /* the held-back prefix of one sequence */
    uint8_t n_pend;   /* 0..3 */
    uint8_t need;     /* total length of the held-back sequence, 0 if none */
    bool strip_space; /* drop one leading space from the next output (set by the caller to
                         decode a whole prompt whose first piece carries the space prefix) */
};

void kvf_detok_init(struct kvf_detok *d);

/* Appends the text of token `tok` to out (never NUL-terminated) and returns the bytes written.
 * Only complete, valid UTF-8 is emitted; a partial sequence at the end is held in d. Give
 * cap ≥ KVF_DETOK_MAX_OUT: with less, output is cut at a character boundary and the rest lost.
 * An out-of-range token emits U+FFFD. */
size_t kvf_detok_push(struct kvf_detok *d, const kvf_tokenizer_t *t, int32_t tok, char *out,
                      size_t cap);

/* Ends the stream: a held-back unfinished sequence becomes U+FFFD (3 bytes; cap ≥ 3). Returns
 * the bytes written and resets d. */
size_t kvf_detok_finish(struct kvf_detok *d, char *out, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Chat templates: renders a model's chat template (tokenizer.chat_template, a Jinja
 * template) over a conversation.
 *
 * The interpreter takes the subset of Jinja that chat templates use: text, {{ expr }},
 * {% if/elif/else %}, {% for x in xs %} (with loop.index0, index, first, last, length,
 * revindex), {% set x = ... %} and {% set ns.attr = ... %}, comments, whitespace control
 * ({%- -%}) and the lstrip_blocks / trim_blocks behaviour of the reference (@huggingface/jinja);
 * expressions with literals, lists, attribute and index access, slices, + - * / % ~, comparisons,
 * and/or/not, in / not in, x if c else y, tests (defined, none, string, number, boolean, true,
 * false, mapping, sequence), filters (trim, length, tojson, upper, lower, string, join, first,
 * last), string methods (startswith, endswith, split, strip, lstrip, rstrip, upper, lower,
 * replace), namespace() and raise_exception(). Anything else is refused by name.
 *
 * Safety: there is no file, network or environment access. Work is bounded: output at most
 * KVF_TEMPLATE_MAX_OUT bytes, at most KVF_TEMPLATE_MAX_STEPS loop iterations and expression
 * evaluations, nesting at most KVF_TEMPLATE_MAX_DEPTH deep (so no deep recursion), and memory
 * within KVF_TEMPLATE_MAX_MEM; past any bound rendering stops with an error.
 *
 * Variables the template sees: messages (a list of {role, content}), add_generation_prompt,
 * bos_token and eos_token (empty strings when NULL). Anything else (tools, ...) is undefined.
 * ------------------------------------------------------------------------------------------- */
#define KVF_TEMPLATE_MAX_OUT   (4u << 20)
#define KVF_TEMPLATE_MAX_STEPS 1000000u
#define KVF_TEMPLATE_MAX_DEPTH 64u
#define KVF_TEMPLATE_MAX_MEM   (64u << 20)

/* One message of a conversation; both strings borrowed, NUL-terminated, UTF-8. */
struct kvf_chat_msg {
    const char *role;
    const char *content;
};

/* Renders tmpl over msgs[0..n). On success returns the output's length and sets *out to a
 * malloc'd NUL-terminated string (the caller frees it). On failure returns -EINVAL (a syntax
 * error, something unsupported, raise_exception, a type error), -E2BIG (a work or output bound
 * reached) or -ENOMEM, leaves *out NULL, and writes a one-line explanation to err. */
int kvf_template_render(const char *tmpl, const struct kvf_chat_msg *msgs, size_t n,
                        bool add_generation_prompt, const char *bos, const char *eos, char **out,
                        char *err, size_t err_len);

#endif /* KVFENCE_TEXT_H */
