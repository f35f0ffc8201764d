/* Helpers for the GGUF tests and the tokenizer tests (tests/text): a byte builder for hand-made
 * (often hostile) GGUF files, a scratch directory, and file reading. */
#ifndef KVF_GGUF_TEST_UTIL_H
#define KVF_GGUF_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvf_test.h"

/* A growable byte buffer. */
struct bb {
    uint8_t *p;
    size_t n, cap;
};

static inline void bb_put(struct bb *b, const void *src, size_t n)
{
    if (n == 0) return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        ASSERT_NOT_NULL(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static inline void bb_u32(struct bb *b, uint32_t v)
{
    bb_put(b, &v, 4);
}
static inline void bb_u64(struct bb *b, uint64_t v)
{
    bb_put(b, &v, 8);
}
static inline void bb_str(struct bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}
static inline void bb_pad(struct bb *b, size_t align)
{
    static const uint8_t z[64];
    while (b->n % align)
        bb_put(b, z, 1);
}
static inline void bb_free(struct bb *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}
/* The GGUF header: magic, version, counts. */
static inline void bb_header(struct bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bb_u32(b, 0x46554747u);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}

/* A fresh scratch directory (removed by the OS's tmp cleaning; tests remove their files). */
static inline const char *scratch_dir(void)
{
    static char dir[256];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kvf_gguf_XXXXXX", t && t[0] ? t : "/tmp");
        ASSERT_NOT_NULL(mkdtemp(dir));
    }
    return dir;
}

static inline void scratch_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", scratch_dir(), name);
}

/* Removes the scratch directory; every file in it must have been removed (a check that the
 * test cleans up after itself). Each test case runs in its own process, so each has its own. */
static inline void scratch_done(void)
{
    ASSERT_EQ_INT(rmdir(scratch_dir()), 0);
}

/* Reads a whole file into malloc'd memory. */
static inline uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ASSERT_NOT_NULL(f);
    ASSERT_EQ_INT(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ASSERT_TRUE(n >= 0);
    rewind(f);
    uint8_t *p = malloc((size_t)n + 1);
    ASSERT_NOT_NULL(p);
    ASSERT_EQ_INT(fread(p, 1, (size_t)n, f), n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

static inline void write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    ASSERT_NOT_NULL(f);
    ASSERT_EQ_INT(fwrite(p, 1, n, f), n);
    ASSERT_EQ_INT(fclose(f), 0);
}

/* An independent UTF-8 validator (not the library's), for checking detokenizer output. */
static inline bool valid_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        uint32_t cp;
        size_t k;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 2, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            k = 3, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            k = 4, cp = c & 0x07;
        } else {
            return false;
        }
        if (i + k > n) return false;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += k;
    }
    return true;
}

#endif
