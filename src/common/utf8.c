/* utf8.c — the UTF-8 validator of kvfence/utf8.h: the table there, as code. */
#include "kvfence/utf8.h"

size_t kvf_utf8_lead_len(uint8_t b)
{
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) return 2;
    if (b >= 0xe0 && b <= 0xef) return 3;
    if (b >= 0xf0 && b <= 0xf4) return 4;
    return 0;
}

bool kvf_utf8_second_ok(uint8_t lead, uint8_t b)
{
    switch (lead) {
    case 0xe0:
        return b >= 0xa0 && b <= 0xbf; /* below: an overlong 3-byte form */
    case 0xed:
        return b >= 0x80 && b <= 0x9f; /* above: a surrogate */
    case 0xf0:
        return b >= 0x90 && b <= 0xbf; /* below: an overlong 4-byte form */
    case 0xf4:
        return b >= 0x80 && b <= 0x8f; /* above: past U+10FFFF */
    default:
        return b >= 0x80 && b <= 0xbf;
    }
}

size_t kvf_utf8_seq_len(const uint8_t *s, size_t n)
{
    if (n == 0) return 0;
    size_t k = kvf_utf8_lead_len(s[0]);
    if (k == 0 || k > n) return 0;
    for (size_t i = 1; i < k; i++) {
        bool ok = i == 1 ? kvf_utf8_second_ok(s[0], s[1]) : (s[i] >= 0x80 && s[i] <= 0xbf);
        if (!ok) return 0;
    }
    return k;
}

size_t kvf_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    size_t k = kvf_utf8_seq_len(s, n);
    if (k == 0) return 0;
    static const uint8_t lead_bits[5] = {0, 0x7f, 0x1f, 0x0f, 0x07};
    uint32_t c = s[0] & lead_bits[k];
    for (size_t i = 1; i < k; i++)
        c = c << 6 | (s[i] & 0x3f);
    *cp = c;
    return k;
}

bool kvf_utf8_valid(const char *s, size_t n)
{
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        size_t k = kvf_utf8_seq_len(p + i, n - i);
        if (k == 0) return false;
        i += k;
    }
    return true;
}
