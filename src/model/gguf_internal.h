/* Internals shared by the GGUF reader, writer and the tokenizer: a byte-string hash and the
 * error-message helper. Not part of the public API. */
#ifndef KVF_GGUF_INTERNAL_H
#define KVF_GGUF_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

#endif
