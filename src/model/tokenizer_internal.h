/* Internals of the tokenizer shared by its files. Not part of the public API. */
#ifndef KVF_TOKENIZER_INTERNAL_H
#define KVF_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/tokenizer.h"

struct kvf_tokenizer {
    uint32_t n_vocab;
    char *blob;            /* every piece, NUL-terminated, back to back */
    uint32_t *off;         /* [n_vocab] piece i starts at blob + off[i] */
    uint16_t *len;         /* [n_vocab] its length in bytes (≤ KVF_TOKENIZER_MAX_PIECE) */
    float *scores;         /* [n_vocab] merge priority: higher merges first */
    uint8_t *types;        /* [n_vocab] enum kvf_token_type */
    int32_t byte_tok[256]; /* the <0xXX> token of each byte, or -1 */
    int32_t bos, eos, unk; /* -1 when absent */
    bool add_space_prefix;
    uint32_t *table;  /* piece → id + 1 (0 empty), NORMAL and USER_DEFINED pieces only */
    size_t table_cap; /* a power of two, at least twice the entries */
};

/* The length (1..4) of the well-formed UTF-8 sequence at s (n bytes available), or 0 if the
 * bytes there are not one (overlong forms, surrogates and code points past U+10FFFF are not). */
size_t kvf__utf8_seq_len(const uint8_t *s, size_t n);

/* The id of the NORMAL or USER_DEFINED piece (s, n), or -1. */
int32_t kvf__tokenizer_lookup(const kvf_tokenizer_t *t, const char *s, size_t n);

#endif
