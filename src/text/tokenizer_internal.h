/* Internals of the tokenizer shared by its files. Not part of the public API. */
#ifndef KVF_TOKENIZER_INTERNAL_H
#define KVF_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/text.h"
#include "kvfence/utf8.h"

/* The two tokenizer models read from tokenizer.ggml.model. */
enum kvf__tok_kind {
    KVF__TOK_SPM, /* "llama": SentencePiece, merges by piece score */
    KVF__TOK_BPE, /* "gpt2": byte-level BPE, merges by rank from tokenizer.ggml.merges */
};

/* Byte-level BPE pre-tokenizers (tokenizer.ggml.pre), each a split regex implemented by hand in
 * bpe_pre.c. */
enum kvf__bpe_pre {
    KVF__PRE_GPT2, /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    KVF__PRE_SMOLLM, /* every \p{N} alone, then GPT2 on what lies between */
    KVF__PRE_LLAMA3, /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                        ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    KVF__PRE_QWEN2,  /* LLAMA3 with \p{N} for \p{N}{1,3}; text is NFC-normalized first */
};

/* One merge rule of a BPE vocabulary: the pair (left, right), both token ids, as key. */
struct kvf__merge {
    uint64_t key;  /* (uint64_t)left << 32 | right; 0 marks an empty slot (pair (0, 0) is kept
                      as key UINT64_MAX instead, no vocabulary has 2^32 - 1 tokens) */
    uint32_t rank; /* its index in tokenizer.ggml.merges: lower merges first */
    int32_t id;    /* the merged token */
};

struct kvf_tokenizer {
    enum kvf__tok_kind kind;
    uint32_t n_vocab;
    char *blob;            /* every piece, NUL-terminated, back to back */
    uint32_t *off;         /* [n_vocab] piece i starts at blob + off[i] */
    uint16_t *len;         /* [n_vocab] its length in bytes (≤ KVF_TOKENIZER_MAX_PIECE) */
    float *scores;         /* [n_vocab] merge priority: higher merges first */
    uint8_t *types;        /* [n_vocab] enum kvf_token_type */
    int32_t byte_tok[256]; /* the <0xXX> token of each byte, or -1 */
    int32_t bos, eos, unk; /* -1 when absent */
    bool add_space_prefix;
    uint32_t *table;  /* piece → id + 1 (0 empty): SPM: NORMAL and USER_DEFINED pieces; BPE:
                         NORMAL pieces only (the model's own vocabulary) */
    size_t table_cap; /* a power of two, at least twice the entries */

    /* Added tokens, matched in the text before the model sees it: the pieces of CONTROL,
     * UNKNOWN and USER_DEFINED tokens (SPM: CONTROL and UNKNOWN only, USER_DEFINED pieces merge
     * like normal ones). Found leftmost-longest: at each position that can start one (first
     * byte in added_first), each distinct length from the longest down is looked up. */
    uint32_t *added;         /* piece → id + 1 (0 empty) */
    size_t added_cap;        /* a power of two, at least twice the entries; 0 when none */
    uint8_t added_first[32]; /* bitmap of the first bytes of added pieces */
    uint16_t *added_lens;    /* distinct lengths of added pieces, longest first */
    size_t n_added_lens;

    /* End-of-generation tokens: eos, eot, eom and the control tokens named like an end of turn. */
    int32_t *eog;
    size_t n_eog;
    bool add_bos; /* tokenizer.ggml.add_bos_token, or the model's default */

    /* Byte-level BPE only. */
    enum kvf__bpe_pre pre;
    bool nfc;           /* NFC-normalize text before splitting (Qwen2) */
    bool ignore_merges; /* a split piece that is a token as a whole is taken as is (Llama 3) */
    struct kvf__merge *merges; /* open-addressing table, merges_cap slots */
    size_t merges_cap;
    int32_t byte_char_tok[256]; /* the token of each byte's own character */
};

/* The byte-level alphabet (GPT-2's bytes_to_unicode): byte b is written as the code point
 * kvf__bpe_byte_cp(b); printable bytes stand for themselves, the others map above U+00FF. */
uint32_t kvf__bpe_byte_cp(uint8_t b);
/* The byte a code point of that alphabet stands for, or -1 for any other code point. */
int kvf__bpe_cp_byte(uint32_t cp);

/* BPE parts of kvf_tokenizer_create: reads tokenizer.ggml.pre and tokenizer.ggml.merges and
 * builds the merge table. On failure err explains; the caller frees t. */
int kvf__bpe_create(kvf_tokenizer_t *t, const kvf_gguf_t *g, char *err, size_t err_len);

/* Appends to out (up to max_out; *count counts all) the tokens of one text segment (no added
 * tokens inside). Returns 0 or -ENOMEM. */
int kvf__bpe_encode(const kvf_tokenizer_t *t, const char *text, size_t len, int32_t *out,
                    size_t max_out, size_t *count);

/* Splits text (valid UTF-8) by the pre-tokenizer's regex and calls fn on each piece in order,
 * stopping at the first non-zero return, which it returns; -ENOMEM if its scratch space cannot
 * be had. O(n) time. */
typedef int (*kvf__bpe_piece_fn)(void *ctx, const char *piece, size_t len);
int kvf__bpe_pre_split(enum kvf__bpe_pre pre, const char *text, size_t len, kvf__bpe_piece_fn fn,
                       void *ctx);

/* The id of the NORMAL or USER_DEFINED piece (s, n), or -1. */
int32_t kvf__tokenizer_lookup(const kvf_tokenizer_t *t, const char *s, size_t n);

#endif
