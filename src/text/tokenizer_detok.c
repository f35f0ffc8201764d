/* Streaming detokenization that only ever emits valid UTF-8 (by the rules of kvfence/utf8.h).
 *
 * A token's text is a run of bytes that need not be whole characters: byte-fallback tokens
 * carry one byte of a multibyte character each, and a vocabulary may hold pieces that split a
 * character. The bytes go through a small decoder that holds back an incomplete sequence until
 * its next byte arrives and replaces every ill-formed subsequence with U+FFFD (one per maximal
 * ill-formed prefix, as Unicode recommends), so the concatenated output is always valid. */
#include <string.h>

#include "kvfence/text.h"
#include "tokenizer_internal.h"
#include "unicode.h"

static const char REPLACEMENT[3] = {'\xef', '\xbf', '\xbd'}; /* U+FFFD */

void kvf_detok_init(struct kvf_detok *d)
{
    memset(d, 0, sizeof *d);
}

/* Output cursor: a character is written whole or not at all. */
struct sink {
    char *out;
    size_t cap, n;
    struct kvf_detok *d;
    bool spm; /* U+2581 is a space */
};

static void put_char(struct sink *s, const char *c, size_t k)
{
    if (s->d->strip_space) {
        s->d->strip_space = false;
        if (k == 1 && c[0] == ' ') return;
    }
    if (k > s->cap - s->n) return; /* cut at a character boundary; the caller gave too little */
    memcpy(s->out + s->n, c, k);
    s->n += k;
}

/* Feeds one byte through the decoder. */
static void feed(struct sink *s, uint8_t b)
{
    struct kvf_detok *d = s->d;
    if (d->n_pend > 0) {
        bool ok = d->n_pend == 1 ? kvf_utf8_second_ok(d->pend[0], b) : (b >= 0x80 && b <= 0xbf);
        if (ok) {
            d->pend[d->n_pend++] = b;
            if (d->n_pend == d->need) {
                /* U+2581 is SentencePiece's space, whether it came in a piece or spelled
                 * with byte tokens (a vocabulary without a "▁" piece spells every space so). */
                if (s->spm && d->need == 3 && memcmp(d->pend, "\xe2\x96\x81", 3) == 0)
                    put_char(s, " ", 1);
                else
                    put_char(s, (const char *)d->pend, d->need);
                d->n_pend = d->need = 0;
            }
            return;
        }
        /* The held prefix can never complete: replace it, then read b afresh. */
        put_char(s, REPLACEMENT, 3);
        d->n_pend = d->need = 0;
    }
    size_t k = kvf_utf8_lead_len(b);
    if (k == 1) {
        char c = (char)b;
        put_char(s, &c, 1);
    } else if (k == 0) {
        put_char(s, REPLACEMENT, 3);
    } else {
        d->pend[0] = b;
        d->n_pend = 1;
        d->need = (uint8_t)k;
    }
}

static unsigned hex(uint8_t c)
{
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

size_t kvf_detok_push(struct kvf_detok *d, const kvf_tokenizer_t *t, int32_t tok, char *out,
                      size_t cap)
{
    struct sink s = {out, out ? cap : 0, 0, d, t->kind == KVF__TOK_SPM};
    if (tok < 0 || (uint32_t)tok >= t->n_vocab) {
        for (size_t i = 0; i < 3; i++)
            feed(&s, (uint8_t)REPLACEMENT[i]);
        return s.n;
    }
    const uint8_t *p = (const uint8_t *)t->blob + t->off[tok];
    size_t n = t->len[tok];
    switch (t->types[tok]) {
    case KVF_TOKEN_CONTROL:
    case KVF_TOKEN_UNUSED:
        return 0;
    case KVF_TOKEN_UNKNOWN:
        for (size_t i = 0; i < 3; i++)
            feed(&s, (uint8_t)REPLACEMENT[i]);
        return s.n;
    case KVF_TOKEN_BYTE:
        /* The piece is "<0xXX>", checked at create; its byte is the one it names. */
        feed(&s, (uint8_t)(hex(p[3]) << 4 | hex(p[4])));
        return s.n;
    case KVF_TOKEN_NORMAL:
        if (t->kind != KVF__TOK_BPE) break;
        /* A byte-level piece: each character of the byte alphabet stands for its byte. A
         * character outside it (no real vocabulary has one) is passed through as text. */
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = kvf_utf8_decode(p + i, n - i, &cp);
            int b = k ? kvf__bpe_cp_byte(cp) : -1;
            if (k == 0) k = 1;
            if (b >= 0) {
                feed(&s, (uint8_t)b);
            } else {
                for (size_t j = 0; j < k; j++)
                    feed(&s, p[i + j]);
            }
            i += k;
        }
        return s.n;
    default:
        break;
    }
    for (size_t i = 0; i < n; i++)
        feed(&s, p[i]);
    return s.n;
}

size_t kvf_detok_finish(struct kvf_detok *d, char *out, size_t cap)
{
    struct sink s = {out, out ? cap : 0, 0, d, false};
    if (d->n_pend > 0) put_char(&s, REPLACEMENT, 3);
    kvf_detok_init(d);
    return s.n;
}
