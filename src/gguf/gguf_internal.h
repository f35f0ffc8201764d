/* Internals shared by the GGUF reader, writer and the tokenizer (src/text includes this as
 * gguf/gguf_internal.h): a byte-string hash and the error-message helper; and the hist test
 * model's entry points (mkmodel_hist.c). Not part of the public API. */
#ifndef KVF_GGUF_INTERNAL_H
#define KVF_GGUF_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvfence/gguf.h"

/* FNV-1a over n bytes, finished with a 64-bit mix so that the low bits (which index the
 * power-of-two tables) depend on every input byte. */
static inline uint64_t kvf__gguf_hash(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* Writes a formatted message into err (when err_len > 0) and returns code. */
__attribute__((format(printf, 4, 5))) static inline int
kvf__gguf_fail(char *err, size_t err_len, int code, const char *fmt, ...)
{
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* The smallest power of two ≥ 2n (≥ 8): the capacity of an open-addressing table holding n
 * entries at most half full. 0 if that does not fit in size_t. */
static inline size_t kvf__gguf_table_cap(uint64_t n)
{
    size_t cap = 8;
    while (cap / 2 < n) {
        if (cap > SIZE_MAX / 2) return 0;
        cap *= 2;
    }
    return cap;
}

/* The hist test model (mkmodel_hist.c's header says what it computes): its shape, which
 * kvf_mkmodel_shape_by_name("hist") returns and kvf_mkmodel_write hands to
 * kvf__mkmodel_hist_write (type F32 or Q8_0; no seed: nothing in it is random). */
#define KVF__HIST_N_VOCAB    1024u
#define KVF__HIST_FIRST_WORD 259u /* word j of the list is token KVF__HIST_FIRST_WORD + j */
extern const struct kvf_mkmodel_shape kvf__mkmodel_hist_shape;
int kvf__mkmodel_hist_write(const char *path, uint32_t type, char *err, size_t err_len);
/* The counted words, without the leading "▁", in token order (a static array); the count. */
uint32_t kvf__mkmodel_hist_words(const char *const **out);

/* Writes what kvf_mkmodel_write puts before the weights, and nothing else: the same metadata
 * keys and values (hyper-parameters, vocab) and the same rope_freqs.weight, so that a test reads
 * a shape's hyper-parameters back without writing gigabytes of weights. Not a model (no
 * weights), and not for hist (its writer is its own). On failure no file is left at `path` and
 * `err` explains. */
int kvf__mkmodel_write_meta(const char *path, const struct kvf_mkmodel_shape *s, uint32_t type,
                            char *err, size_t err_len);

#endif
