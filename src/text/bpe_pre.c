/* The split regexes of the byte-level BPE pre-tokenizers, matched by hand.
 *
 * Each regex is an alternation tried in order at the current position; the first alternative
 * that matches gives the piece, and the search resumes after it. Text that no alternative
 * matches (none of these regexes leaves any, but the loop does not rely on it) becomes a piece
 * of its own, as the "Isolated" split behaviour keeps it. The alternatives below say which
 * part of the regex they are and how its backtracking resolves:
 *
 *   L letter (\p{L}), N number (\p{N}), S White_Space (\s), O anything else, CRLF '\r' or '\n'
 *
 * The text is decoded once into code points and their classes; matching then walks that array,
 * so a piece costs time linear in its length and the whole split O(n). */
#include <errno.h>
#include <stdlib.h>

#include "tokenizer_internal.h"
#include "unicode.h"

struct text {
    const uint32_t *cp;
    const uint8_t *cls; /* enum kvf__uni_class of each code point */
    size_t n;
};

static bool is_cls(const struct text *t, size_t i, enum kvf__uni_class c)
{
    return i < t->n && t->cls[i] == c;
}

static bool is_crlf(const struct text *t, size_t i)
{
    return i < t->n && (t->cp[i] == '\r' || t->cp[i] == '\n');
}

static size_t run_of(const struct text *t, size_t i, enum kvf__uni_class c)
{
    while (is_cls(t, i, c))
        i++;
    return i;
}

/* 's|'t|'re|'ve|'m|'ll|'d, case-insensitively (ASCII only) when fold. Returns the end, or 0. */
static size_t contraction(const struct text *t, size_t i, bool fold)
{
    if (t->cp[i] != '\'' || i + 1 >= t->n) return 0;
    uint32_t a = t->cp[i + 1], b = i + 2 < t->n ? t->cp[i + 2] : 0;
    if (fold) {
        if (a >= 'A' && a <= 'Z') a |= 0x20;
        if (b >= 'A' && b <= 'Z') b |= 0x20;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

/* \s+(?!\S) then \s+: a whitespace run, less its last character when a non-space follows and
 * the run is longer than one (the backtracked \s+ leaves that character to precede the next
 * piece). Returns the end, or 0. */
static size_t spaces(const struct text *t, size_t i)
{
    if (!is_cls(t, i, KVF_UNI_SPACE)) return 0;
    size_t e = run_of(t, i, KVF_UNI_SPACE);
    if (e == t->n || e - 1 == i) return e; /* \s+(?!\S) at the end, or \s+ of one */
    return e - 1;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const struct text *t, size_t i)
{
    size_t e = contraction(t, i, false);
    if (e) return e;
    /* " ?X+" for X = L, N, O: the optional space is taken when an X follows it. */
    size_t k = t->cp[i] == ' ' ? i + 1 : i;
    static const enum kvf__uni_class xs[3] = {KVF_UNI_LETTER, KVF_UNI_NUMBER, KVF_UNI_OTHER};
    for (int x = 0; x < 3; x++) {
        if (is_cls(t, k, xs[x])) return run_of(t, k, xs[x]);
        if (is_cls(t, i, xs[x])) return run_of(t, i, xs[x]);
    }
    return spaces(t, i);
}

/* Llama 3 (digits 3) and Qwen2 (digits 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(const struct text *t, size_t i, size_t digits)
{
    size_t e = contraction(t, i, true);
    if (e) return e;
    /* [^\r\n\p{L}\p{N}]?\p{L}+: one leading character of class S or O (not CR/LF), taken
     * when a letter follows it; without it the run must start here. */
    if (is_cls(t, i, KVF_UNI_LETTER)) return run_of(t, i, KVF_UNI_LETTER);
    if (!is_crlf(t, i) && !is_cls(t, i, KVF_UNI_NUMBER) && is_cls(t, i + 1, KVF_UNI_LETTER))
        return run_of(t, i + 1, KVF_UNI_LETTER);
    /* \p{N}{1,digits} */
    if (is_cls(t, i, KVF_UNI_NUMBER)) {
        e = i + 1;
        while (e - i < digits && is_cls(t, e, KVF_UNI_NUMBER))
            e++;
        return e;
    }
    /* ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t k = t->cp[i] == ' ' && is_cls(t, i + 1, KVF_UNI_OTHER) ? i + 1 : i;
    if (is_cls(t, k, KVF_UNI_OTHER)) {
        e = run_of(t, k, KVF_UNI_OTHER);
        while (is_crlf(t, e))
            e++;
        return e;
    }
    if (!is_cls(t, i, KVF_UNI_SPACE)) return 0;
    /* \s*[\r\n]+: the greedy \s* backs off to the last CR/LF of the whitespace run, and
     * [\r\n]+ takes that one only (what follows it in the run is not CR/LF). */
    size_t run = run_of(t, i, KVF_UNI_SPACE), last = SIZE_MAX;
    for (size_t p = i; p < run; p++)
        if (is_crlf(t, p)) last = p;
    if (last != SIZE_MAX) return last + 1;
    return spaces(t, i);
}

static size_t match(enum kvf__bpe_pre pre, const struct text *t, size_t i)
{
    switch (pre) {
    case KVF__PRE_LLAMA3:
        return match_llama3(t, i, 3);
    case KVF__PRE_QWEN2:
        return match_llama3(t, i, 1);
    case KVF__PRE_GPT2:
    case KVF__PRE_SMOLLM:
        return match_gpt2(t, i);
    }
    return 0;
}

/* Runs the regex over code points [from, to) of t, calling fn with byte spans. */
static int split_range(enum kvf__bpe_pre pre, const struct text *t, const size_t *off,
                       const char *s, size_t from, size_t to, kvf__bpe_piece_fn fn, void *ctx)
{
    struct text sub = {t->cp + from, t->cls + from, to - from};
    size_t gap = 0; /* start of unmatched text */
    for (size_t i = 0; i < sub.n;) {
        size_t e = match(pre, &sub, i);
        if (e == 0) {
            i++;
            continue;
        }
        int rc;
        if (gap < i && (rc = fn(ctx, s + off[from + gap], off[from + i] - off[from + gap])) != 0)
            return rc;
        if ((rc = fn(ctx, s + off[from + i], off[from + e] - off[from + i])) != 0) return rc;
        i = gap = e;
    }
    if (gap < sub.n) return fn(ctx, s + off[from + gap], off[from + sub.n] - off[from + gap]);
    return 0;
}

int kvf__bpe_pre_split(enum kvf__bpe_pre pre, const char *text, size_t len, kvf__bpe_piece_fn fn,
                       void *ctx)
{
    if (len == 0) return 0;
    uint32_t *cp = malloc(len * sizeof *cp);
    uint8_t *cls = malloc(len);
    size_t *off = malloc((len + 1) * sizeof *off);
    int rc = 0;
    if (!cp || !cls || !off) {
        rc = -ENOMEM;
        goto free_all;
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t k = kvf_utf8_decode((const uint8_t *)text + i, len - i, &cp[n]);
        if (k == 0) k = 1, cp[n] = 0xfffd; /* the caller checked; never split a byte twice */
        cls[n] = (uint8_t)kvf__uni_class(cp[n]);
        off[n++] = i;
        i += k;
    }
    off[n] = len;
    struct text t = {cp, cls, n};
    if (pre != KVF__PRE_SMOLLM) {
        rc = split_range(pre, &t, off, text, 0, n, fn, ctx);
        goto free_all;
    }
    /* SmolLM: each number character is a piece alone (the Digits pre-tokenizer, individual
     * digits), and the GPT-2 regex splits the text between them. */
    size_t from = 0;
    for (size_t i = 0; i <= n && rc == 0; i++) {
        if (i < n && cls[i] != KVF_UNI_NUMBER) continue;
        if (from < i) rc = split_range(pre, &t, off, text, from, i, fn, ctx);
        if (rc == 0 && i < n) rc = fn(ctx, text + off[i], off[i + 1] - off[i]);
        from = i + 1;
    }
free_all:
    free(cp);
    free(cls);
    free(off);
    return rc;
}
