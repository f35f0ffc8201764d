/* Unicode for the byte-level BPE tokenizer: code point classes the pre-tokenizer regexes name
 * (\p{L}, \p{N}, White_Space), and NFC normalization. Internal to src/text.
 *
 * The tables in unicode_data.c are generated (tests/text/gen_unicode.mjs) from Node.js's
 * Unicode database, the one the reference tokenizer in the tests uses. */
#ifndef KVF_UNICODE_H
#define KVF_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/utf8.h"

struct kvf__uni_range {
    uint32_t first, last; /* inclusive */
};
struct kvf__uni_rank {
    uint32_t cp;
    uint8_t rank; /* the rank of cp's canonical combining class among classes in use, 1.. */
};
struct kvf__uni_decomp {
    uint32_t cp;
    uint16_t off; /* its full canonical decomposition: kvf__uni_decomp_pool[off .. off+n) */
    uint8_t n;
};
struct kvf__uni_comp {
    uint32_t first, second, composite;
};

extern const struct kvf__uni_range kvf__uni_letters[], kvf__uni_numbers[];
extern const struct kvf__uni_rank kvf__uni_ranks[];
extern const struct kvf__uni_decomp kvf__uni_decomp[];
extern const uint32_t kvf__uni_decomp_pool[];
extern const struct kvf__uni_comp kvf__uni_comp[];
extern const size_t kvf__uni_letters_len, kvf__uni_numbers_len, kvf__uni_ranks_len,
    kvf__uni_decomp_len, kvf__uni_decomp_pool_len, kvf__uni_comp_len;

/* What the pre-tokenizer regexes tell apart. Every code point is exactly one of these. */
enum kvf__uni_class {
    KVF_UNI_OTHER = 0, /* none of the below: punctuation, symbols, marks, controls, ... */
    KVF_UNI_LETTER,    /* \p{L} */
    KVF_UNI_NUMBER,    /* \p{N} */
    KVF_UNI_SPACE,     /* White_Space (the regexes' \s), which no letter or number is */
};

enum kvf__uni_class kvf__uni_class(uint32_t cp);

/* Writes cp (a Unicode scalar value) as UTF-8 into out (room for 4) and returns the length. */
size_t kvf__utf8_encode(uint32_t cp, uint8_t *out);

/* NFC of the valid UTF-8 text s (n bytes). When the text is already NFC, as nearly every text
 * is, returns 0 with *out NULL (use s itself). Otherwise returns 0 with *out a malloc'd buffer
 * of *out_len bytes (the caller frees it), or -ENOMEM with *out NULL. Expects valid UTF-8
 * (checked by the caller); O(n) time and memory, O(k^2) for a run of k combining marks. */
int kvf__uni_nfc(const char *s, size_t n, char **out, size_t *out_len);

#endif
