/*
 * kvfence/grammar.h — constrained decoding: a grammar (GBNF, the notation llama.cpp and
 * llama-server take) compiled to a byte-level pushdown matcher, and the per-step token mask it
 * gives over a vocabulary. Part of the text module (src/text/grammar*.c); depends on
 * kvfence/text.h and kvfence/common.h.
 *
 * Why GBNF: it is what llama-server's `grammar` field takes, so a grammar written for it works
 * here unchanged; it is plain EBNF (rules, literals, character classes, groups, * + ?) and JSON
 * Schemas compile to it (kvf_schema_to_grammar, kvfence/server.h), so one matcher serves the
 * `grammar` field, response_format json_object and json_schema alike, and the constraint can
 * travel between processes as its text.
 *
 * The matcher works on bytes: a character class is compiled to byte classes, a non-ASCII range
 * to the UTF-8 byte sequences that spell it (as RE2 does), so a token's bytes are walked one at
 * a time and a token that ends inside a character is judged by the bytes it has. Its state is a
 * set of stacks of grammar positions (llama.cpp's design); an empty stack means the input so
 * far is a complete sentence.
 *
 *   kvf_grammar_compile ──▶ kvf_grammar_t (immutable rules + a mask cache, one thread)
 *   kvf_grammar_vocab_create ──▶ kvf_grammar_vocab_t (each token's bytes, sorted; immutable)
 *   kvf_grammar_state_init ──▶ state ──mask──▶ allowed tokens ──advance(token)──▶ state ...
 *
 * Bounds (bad input gets an error, never unbounded work or memory): grammar text at most
 * KVF_GRAMMAR_MAX_BYTES, at most KVF_GRAMMAR_MAX_RULES rules and KVF_GRAMMAR_MAX_ELEMS
 * elements after desugaring, groups nested at most KVF_GRAMMAR_MAX_NEST deep. At run time a
 * stack deeper than KVF_GRAMMAR_MAX_DEPTH or a set of more than KVF_GRAMMAR_MAX_STACKS stacks is
 * cut, and so is one byte's step past KVF_GRAMMAR_STEP_WORK rule expansions (those continuations
 * are not allowed: the output stays within the grammar, never outside it). A mask costs O(bytes of
 * the vocabulary not pruned × stacks) on a cache miss and O(n_vocab / 64) on a hit; the cache of
 * one grammar holds at most KVF_GRAMMAR_CACHE_BYTES.
 *
 * Threads: a kvf_grammar_vocab_t may be shared; a kvf_grammar_t (its cache) and a state belong
 * to one thread at a time.
 */
#ifndef KVFENCE_GRAMMAR_H
#define KVFENCE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/text.h"

#define KVF_GRAMMAR_MAX_BYTES   8192 /* grammar text; also what a request may carry */
#define KVF_GRAMMAR_MAX_RULES   2048
#define KVF_GRAMMAR_MAX_ELEMS   32768
#define KVF_GRAMMAR_MAX_NEST    32
#define KVF_GRAMMAR_MAX_DEPTH   64   /* positions per stack */
#define KVF_GRAMMAR_MAX_STACKS  32   /* stacks per state */
#define KVF_GRAMMAR_STEP_WORK   1024 /* rule expansions per input byte */
#define KVF_GRAMMAR_MAX_TOKEN   64   /* token bytes walked; a longer token is never allowed */
#define KVF_GRAMMAR_CACHE_BYTES (4u << 20)
#define KVF_GRAMMAR_STATE_WORDS (KVF_GRAMMAR_MAX_STACKS * (KVF_GRAMMAR_MAX_DEPTH + 1))

typedef struct kvf_grammar kvf_grammar_t;
typedef struct kvf_grammar_vocab kvf_grammar_vocab_t;

/* A matcher's state: stacks stored as [len, pos × len] runs; n = words used. */
struct kvf_grammar_state {
    uint32_t n;
    uint32_t w[KVF_GRAMMAR_STATE_WORDS];
};

/* Compiles GBNF text (len bytes; rule "root" is the start). 0 with *out, or -EINVAL (a syntax
 * error, an undefined rule, no root), -E2BIG (a bound above), -ENOMEM; then *out is untouched
 * and err says why in one line. */
int kvf_grammar_compile(const char *text, size_t len, kvf_grammar_t **out, char *err,
                        size_t err_len);
void kvf_grammar_free(kvf_grammar_t *g);

/* Each token's bytes as the detokenizer writes them (byte tokens their byte, ▁ a space in
 * SentencePiece, BPE pieces mapped back to bytes); control, unused and unknown tokens have none
 * and are never allowed by a mask. t is borrowed for the call. 0, or -ENOMEM. */
int kvf_grammar_vocab_create(const kvf_tokenizer_t *t, kvf_grammar_vocab_t **out);
void kvf_grammar_vocab_free(kvf_grammar_vocab_t *v);
uint32_t kvf_grammar_vocab_n(const kvf_grammar_vocab_t *v);

/* The start state. Can't fail. */
void kvf_grammar_state_init(const kvf_grammar_t *g, struct kvf_grammar_state *s);
/* Whether the bytes so far are a complete sentence (the end of generation may come now). */
bool kvf_grammar_state_done(const struct kvf_grammar_state *s);
/* Feeds n bytes. Returns 0, or -EINVAL if they leave the grammar (then *s is unchanged). */
int kvf_grammar_state_feed(const kvf_grammar_t *g, struct kvf_grammar_state *s,
                           const uint8_t *bytes, size_t n);
/* Feeds token tok's bytes (see kvf_grammar_vocab_create); -EINVAL as feed, or for a token
 * without bytes. */
int kvf_grammar_state_advance(const kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                              struct kvf_grammar_state *s, int32_t tok);

/* The tokens that may come next from s: bit i of the returned words (n_vocab bits) is set when
 * token i's bytes keep the output within the grammar. The end-of-generation tokens are not in
 * it: they are allowed exactly when kvf_grammar_state_done. The view is owned by g and valid
 * until the next call on g. NULL on -ENOMEM. */
const uint64_t *kvf_grammar_mask(kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                                 const struct kvf_grammar_state *s);

/* Masks logits in place: every token not allowed from s gets -INFINITY; the stop ids stay as
 * they are when s is done and are masked otherwise. Returns the number of tokens left allowed
 * (0: a dead end — the vocabulary cannot continue), or -ENOMEM. */
int kvf_grammar_apply(kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                      const struct kvf_grammar_state *s, float *logits, uint32_t n_vocab,
                      const int32_t *stop_ids, uint32_t n_stop_ids);

/* kvf_grammar_apply from src[0..n_vocab) (borrowed, unchanged) into dst (may be src): one pass,
 * no copy beforehand. Same results. */
int kvf_grammar_apply_to(kvf_grammar_t *g, const kvf_grammar_vocab_t *v,
                         const struct kvf_grammar_state *s, const float *src, float *dst,
                         uint32_t n_vocab, const int32_t *stop_ids, uint32_t n_stop_ids);

#endif /* KVFENCE_GRAMMAR_H */
