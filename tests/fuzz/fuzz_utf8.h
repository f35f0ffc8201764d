/*
 * fuzz_utf8.h — the fuzz targets' own UTF-8 check, written apart from the code under test (the
 * tokenizer's and the template interpreter's) so that it can judge them.
 */
#ifndef KVF_FUZZ_UTF8_H
#define KVF_FUZZ_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether s[0..n) is valid UTF-8 (shortest forms, no surrogates, at most U+10FFFF) and, unless
 * controls is true, holds no C0 control character and no DEL. */
static inline bool fuzz_utf8_valid(const uint8_t *s, size_t n, bool controls)
{
    for (size_t i = 0; i < n;) {
        uint32_t b = s[i], cp, min;
        size_t len;
        if (b < 0x80) {
            if (!controls && (b < 0x20 || b == 0x7f)) return false;
            i++;
            continue;
        }
        if ((b & 0xe0) == 0xc0)
            len = 2, cp = b & 0x1f, min = 0x80;
        else if ((b & 0xf0) == 0xe0)
            len = 3, cp = b & 0x0f, min = 0x800;
        else if ((b & 0xf8) == 0xf0)
            len = 4, cp = b & 0x07, min = 0x10000;
        else
            return false;
        if (n - i < len) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += len;
    }
    return true;
}

#endif
