/* Code point classes, UTF-8 and NFC for the byte-level BPE tokenizer.
 *
 * NFC follows UAX #15: decompose every code point fully (the table holds full decompositions;
 * Hangul syllables are computed), put each run of non-starters in canonical order (a stable
 * sort by combining class), then compose: each character joins the last starter when nothing
 * between them blocks it (a character in between of class 0, or of a class not lower than its
 * own) and the pair has a primary composite. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

/* Hangul syllable arithmetic (Unicode 3.12). */
#define H_SBASE  0xAC00u
#define H_LBASE  0x1100u
#define H_VBASE  0x1161u
#define H_TBASE  0x11A7u
#define H_LCOUNT 19u
#define H_VCOUNT 21u
#define H_TCOUNT 28u
#define H_NCOUNT (H_VCOUNT * H_TCOUNT)
#define H_SCOUNT (H_LCOUNT * H_NCOUNT)

static bool in_ranges(const struct kvf__uni_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].first)
            hi = mid;
        else if (cp > r[mid].last)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* White_Space, the property the tokenizers' regex engines use for \s. */
static bool is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

enum kvf__uni_class kvf__uni_class(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return KVF_UNI_LETTER;
        if (cp >= '0' && cp <= '9') return KVF_UNI_NUMBER;
        return is_white_space(cp) ? KVF_UNI_SPACE : KVF_UNI_OTHER;
    }
    if (is_white_space(cp)) return KVF_UNI_SPACE;
    if (in_ranges(kvf__uni_letters, kvf__uni_letters_len, cp)) return KVF_UNI_LETTER;
    if (in_ranges(kvf__uni_numbers, kvf__uni_numbers_len, cp)) return KVF_UNI_NUMBER;
    return KVF_UNI_OTHER;
}

size_t kvf__utf8_encode(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* The rank of cp's combining class; 0 for starters. */
static unsigned rank_of(uint32_t cp)
{
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = kvf__uni_ranks_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (kvf__uni_ranks[mid].cp == cp) return kvf__uni_ranks[mid].rank;
        if (kvf__uni_ranks[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

static const struct kvf__uni_decomp *decomp_of(uint32_t cp)
{
    size_t lo = 0, hi = kvf__uni_decomp_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (kvf__uni_decomp[mid].cp == cp) return &kvf__uni_decomp[mid];
        if (kvf__uni_decomp[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The primary composite of (a, b), or 0 if there is none. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= H_LBASE && a < H_LBASE + H_LCOUNT && b >= H_VBASE && b < H_VBASE + H_VCOUNT)
        return H_SBASE + ((a - H_LBASE) * H_VCOUNT + (b - H_VBASE)) * H_TCOUNT;
    if (a >= H_SBASE && a < H_SBASE + H_SCOUNT && (a - H_SBASE) % H_TCOUNT == 0 && b > H_TBASE &&
        b < H_TBASE + H_TCOUNT)
        return a + (b - H_TBASE);
    size_t lo = 0, hi = kvf__uni_comp_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct kvf__uni_comp *c = &kvf__uni_comp[mid];
        if (c->first == a && c->second == b) return c->composite;
        if (c->first < a || (c->first == a && c->second < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* Stable sort of a run of non-starters by rank: insertion for short runs, counting (ranks fit
 * in a byte) for long ones, so a hostile run of k marks costs O(k), not O(k^2). */
static void sort_run(uint32_t *cp, uint8_t *rk, size_t n, uint32_t *tmp_cp, uint8_t *tmp_rk)
{
    if (n <= 16) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cp[i];
            uint8_t r = rk[i];
            size_t j = i;
            for (; j > 0 && rk[j - 1] > r; j--) {
                cp[j] = cp[j - 1];
                rk[j] = rk[j - 1];
            }
            cp[j] = c;
            rk[j] = r;
        }
        return;
    }
    size_t start[257] = {0};
    for (size_t i = 0; i < n; i++)
        start[rk[i] + 1]++;
    for (size_t r = 1; r < 257; r++)
        start[r] += start[r - 1];
    for (size_t i = 0; i < n; i++) {
        size_t at = start[rk[i]]++;
        tmp_cp[at] = cp[i];
        tmp_rk[at] = rk[i];
    }
    memcpy(cp, tmp_cp, n * sizeof *cp);
    memcpy(rk, tmp_rk, n);
}

int kvf__uni_nfc(const char *s, size_t n, char **out, size_t *out_len)
{
    const uint8_t *u = (const uint8_t *)s;
    *out = NULL;
    *out_len = 0;
    /* Below U+0300 nothing decomposes or combines: such text is NFC as it stands. */
    bool simple = true;
    for (size_t i = 0; i < n && simple; i++)
        simple = u[i] < 0xcc; /* lead bytes of U+0300 and up */
    if (simple) return 0;

    /* A full decomposition is at most 4 code points (checked by the generator's pool layout
     * below), and each code point takes at least one byte: 4n code points are enough. */
    size_t cap = 4 * n;
    uint32_t *cp = malloc(cap * sizeof *cp * 2);
    uint8_t *rk = malloc(cap * 2);
    char *res = malloc(4 * cap);
    if (!cp || !rk || !res) {
        free(cp);
        free(rk);
        free(res);
        return -ENOMEM;
    }
    uint32_t *tmp_cp = cp + cap;
    uint8_t *tmp_rk = rk + cap;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k = kvf_utf8_decode(u + i, n - i, &c);
        if (k == 0) k = 1, c = 0xfffd; /* the caller checked validity; be safe anyway */
        i += k;
        const struct kvf__uni_decomp *d;
        if (c >= H_SBASE && c < H_SBASE + H_SCOUNT) {
            uint32_t si = c - H_SBASE;
            cp[m++] = H_LBASE + si / H_NCOUNT;
            cp[m++] = H_VBASE + si % H_NCOUNT / H_TCOUNT;
            if (si % H_TCOUNT) cp[m++] = H_TBASE + si % H_TCOUNT;
        } else if (c >= 0x80 && (d = decomp_of(c)) != NULL && d->n <= 4) {
            for (size_t j = 0; j < d->n; j++)
                cp[m++] = kvf__uni_decomp_pool[d->off + j];
        } else {
            cp[m++] = c;
        }
    }
    for (size_t i = 0; i < m; i++)
        rk[i] = (uint8_t)rank_of(cp[i]);
    for (size_t i = 0; i < m;) {
        if (rk[i] == 0) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < m && rk[j] != 0)
            j++;
        sort_run(cp + i, rk + i, j - i, tmp_cp, tmp_rk);
        i = j;
    }
    /* Compose in place: cp[0..w) is the output so far, starter the index of its last starter. */
    size_t w = 0;
    size_t starter = SIZE_MAX;
    for (size_t i = 0; i < m; i++) {
        uint32_t c = cp[i];
        uint8_t r = rk[i];
        if (starter != SIZE_MAX) {
            bool adjacent = w == starter + 1;
            uint8_t last = adjacent ? 0 : rk[w - 1];
            if (adjacent || (last != 0 && last < r)) {
                uint32_t p = compose(cp[starter], c);
                if (p) {
                    cp[starter] = p;
                    continue;
                }
            }
        }
        if (r == 0) starter = w;
        cp[w] = c;
        rk[w] = r;
        w++;
    }
    size_t len = 0;
    for (size_t i = 0; i < w; i++)
        len += kvf__utf8_encode(cp[i], (uint8_t *)res + len);
    free(cp);
    free(rk);
    if (len == n && memcmp(res, s, n) == 0) {
        free(res);
        return 0;
    }
    *out = res;
    *out_len = len;
    return 0;
}
