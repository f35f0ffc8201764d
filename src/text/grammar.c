/*
 * grammar.c — GBNF text to byte-level rules (kvfence/grammar.h), and the stack matcher.
 *
 * The compiled form (llama.cpp's, on bytes): every rule is a run of elements, its alternatives
 * separated by ALT and ended by END; an element is a byte class (a 256-bit set) or a reference
 * to a rule. Repetition and groups are desugared into new rules as they are parsed:
 *   x*  →  R ::= x R |            x+  →  R ::= x R | x            x?  →  R ::= x |
 * A character class holding non-ASCII code points becomes a rule whose alternatives are the
 * UTF-8 byte sequences of its ranges (utf8_split below), so the matcher only ever sees bytes.
 *
 * A stack holds grammar positions, the top last; the top of every stack in a state is a byte
 * class (expand() resolves references and ends of sequences first), or the stack is empty
 * (the sentence is complete). A continuation that ends a rule is not pushed, so right
 * recursion (x*) keeps stacks flat.
 */
#include "kvfence/grammar.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

/* --- Building rules. ------------------------------------------------------------------------ */

struct rbuf {
    uint32_t *e;
    uint32_t n, cap;
    char *name; /* NULL for generated rules */
    bool defined;
};

struct parser {
    const char *p, *end;
    struct rbuf *rules;
    uint32_t n_rules, cap_rules;
    uint64_t (*cls)[4];
    uint32_t n_cls, cap_cls;
    uint32_t n_elems, nest;
    int err;
    char *msg;
    size_t msg_len;
};

static int fail(struct parser *ps, int code, const char *fmt, ...)
{
    if (ps->err) return ps->err;
    ps->err = code;
    if (ps->msg && ps->msg_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->msg, ps->msg_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int push(struct parser *ps, uint32_t r, uint32_t el)
{
    struct rbuf *b = &ps->rules[r];
    if (++ps->n_elems > KVF_GRAMMAR_MAX_ELEMS)
        return fail(ps, -E2BIG, "grammar: more than %d elements", KVF_GRAMMAR_MAX_ELEMS);
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? 2 * b->cap : 16;
        uint32_t *e = realloc(b->e, cap * sizeof *e);
        if (!e) return fail(ps, -ENOMEM, "grammar: out of memory");
        b->e = e;
        b->cap = cap;
    }
    b->e[b->n++] = el;
    return 0;
}

static int new_rule(struct parser *ps, const char *name, size_t nlen)
{
    if (ps->n_rules >= KVF_GRAMMAR_MAX_RULES)
        return fail(ps, -E2BIG, "grammar: more than %d rules", KVF_GRAMMAR_MAX_RULES);
    if (ps->n_rules == ps->cap_rules) {
        uint32_t cap = ps->cap_rules ? 2 * ps->cap_rules : 32;
        struct rbuf *r = realloc(ps->rules, cap * sizeof *r);
        if (!r) return fail(ps, -ENOMEM, "grammar: out of memory");
        ps->rules = r;
        ps->cap_rules = cap;
    }
    struct rbuf *b = &ps->rules[ps->n_rules];
    memset(b, 0, sizeof *b);
    if (name) {
        b->name = malloc(nlen + 1);
        if (!b->name) return fail(ps, -ENOMEM, "grammar: out of memory");
        memcpy(b->name, name, nlen);
        b->name[nlen] = 0;
    }
    return (int)ps->n_rules++;
}

static int rule_id(struct parser *ps, const char *name, size_t nlen)
{
    for (uint32_t i = 0; i < ps->n_rules; i++)
        if (ps->rules[i].name && strlen(ps->rules[i].name) == nlen &&
            memcmp(ps->rules[i].name, name, nlen) == 0)
            return (int)i;
    return new_rule(ps, name, nlen);
}

/* The id of byte class c (deduplicated). */
static int class_id(struct parser *ps, const uint64_t c[4])
{
    for (uint32_t i = 0; i < ps->n_cls; i++)
        if (memcmp(ps->cls[i], c, 32) == 0) return (int)i;
    if (ps->n_cls >= KVF_GRAMMAR_MAX_ELEMS) return fail(ps, -E2BIG, "grammar: too many classes");
    if (ps->n_cls == ps->cap_cls) {
        uint32_t cap = ps->cap_cls ? 2 * ps->cap_cls : 64;
        uint64_t(*n)[4] = realloc(ps->cls, cap * sizeof *n);
        if (!n) return fail(ps, -ENOMEM, "grammar: out of memory");
        ps->cls = n;
        ps->cap_cls = cap;
    }
    memcpy(ps->cls[ps->n_cls], c, 32);
    return (int)ps->n_cls++;
}

static int push_range(struct parser *ps, uint32_t r, uint8_t lo, uint8_t hi)
{
    uint64_t c[4] = {0};
    for (unsigned b = lo; b <= hi; b++)
        c[b >> 6] |= 1ull << (b & 63);
    int id = class_id(ps, c);
    return id < 0 ? id : push(ps, r, EL(E_CLS, (uint32_t)id));
}

/* --- Code point ranges to UTF-8 byte sequences. --------------------------------------------- */

static int utf8_enc(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xc0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* Appends to rule r one alternative per byte-range sequence spelling [lo, hi] (no surrogates
 * inside), each followed by ALT. Recursion depth ≤ 8 (each split narrows a level). */
static int utf8_split(struct parser *ps, uint32_t r, uint32_t lo, uint32_t hi)
{
    static const uint32_t tops[3] = {0x7f, 0x7ff, 0xffff};
    for (int i = 0; i < 3; i++)
        if (lo <= tops[i] && hi > tops[i]) {
            int rc = utf8_split(ps, r, lo, tops[i]);
            return rc < 0 ? rc : utf8_split(ps, r, tops[i] + 1, hi);
        }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                int rc = utf8_split(ps, r, lo, lo | m);
                return rc < 0 ? rc : utf8_split(ps, r, (lo | m) + 1, hi);
            }
            if ((hi & m) != m) {
                int rc = utf8_split(ps, r, lo, (hi & ~m) - 1);
                return rc < 0 ? rc : utf8_split(ps, r, hi & ~m, hi);
            }
        }
    }
    uint8_t a[4], b[4];
    int n = utf8_enc(lo, a);
    utf8_enc(hi, b);
    for (int i = 0; i < n; i++) {
        int rc = push_range(ps, r, a[i], b[i]);
        if (rc < 0) return rc;
    }
    return push(ps, r, EL(E_ALT, 0));
}

/* --- The parser. ----------------------------------------------------------------------------- */

static void skip_space(struct parser *ps, bool newlines)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            ps->p++;
        } else {
            break;
        }
    }
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static int hexval(struct parser *ps, int digits, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        if (ps->p >= ps->end) return fail(ps, -EINVAL, "grammar: unfinished escape");
        char c = *ps->p++;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail(ps, -EINVAL, "grammar: bad hex digit in an escape");
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* One character of a literal or class (an escape, or a UTF-8 character) as a code point. */
static int read_char(struct parser *ps, uint32_t *cp)
{
    if (ps->p >= ps->end) return fail(ps, -EINVAL, "grammar: unfinished literal or class");
    unsigned char c = (unsigned char)*ps->p++;
    if (c == '\\') {
        if (ps->p >= ps->end) return fail(ps, -EINVAL, "grammar: unfinished escape");
        char e = *ps->p++;
        switch (e) {
        case 'n':
            *cp = '\n';
            return 0;
        case 't':
            *cp = '\t';
            return 0;
        case 'r':
            *cp = '\r';
            return 0;
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
            *cp = (uint32_t)e;
            return 0;
        case 'x':
            return hexval(ps, 2, cp);
        case 'u':
            return hexval(ps, 4, cp);
        case 'U':
            return hexval(ps, 8, cp);
        default:
            return fail(ps, -EINVAL, "grammar: unknown escape \\%c", e);
        }
    }
    if (c < 0x80) {
        *cp = c;
        return 0;
    }
    int n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : -1;
    if (n < 0 || ps->end - ps->p < n) return fail(ps, -EINVAL, "grammar: invalid UTF-8");
    uint32_t v = c & (0x3f >> n);
    for (int i = 0; i < n; i++) {
        unsigned char k = (unsigned char)*ps->p++;
        if ((k & 0xc0) != 0x80) return fail(ps, -EINVAL, "grammar: invalid UTF-8");
        v = v << 6 | (k & 0x3f);
    }
    *cp = v;
    return 0;
}

#define MAX_RANGES 256

/* Emits the class [ranges] (negated if neg) into rule r as one element: a byte class when it
 * is all ASCII, else a reference to a new rule of UTF-8 alternatives. */
static int emit_class(struct parser *ps, uint32_t r, uint32_t (*rg)[2], int n, bool neg)
{
    uint32_t out[MAX_RANGES + 1][2];
    int m = 0;
    /* Sort and merge, then complement if negated; surrogates are never characters. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && rg[j][0] < rg[j - 1][0]; j--) {
            uint32_t t0 = rg[j][0], t1 = rg[j][1];
            rg[j][0] = rg[j - 1][0], rg[j][1] = rg[j - 1][1];
            rg[j - 1][0] = t0, rg[j - 1][1] = t1;
        }
    uint32_t mg[MAX_RANGES][2];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k && rg[i][0] <= mg[k - 1][1] + 1) {
            if (rg[i][1] > mg[k - 1][1]) mg[k - 1][1] = rg[i][1];
        } else {
            mg[k][0] = rg[i][0], mg[k][1] = rg[i][1], k++;
        }
    }
    if (neg) {
        uint32_t next = 0;
        for (int i = 0; i < k; i++) {
            if (mg[i][0] > next) out[m][0] = next, out[m][1] = mg[i][0] - 1, m++;
            next = mg[i][1] + 1;
        }
        if (next <= 0x10ffff) out[m][0] = next, out[m][1] = 0x10ffff, m++;
    } else {
        for (int i = 0; i < k; i++)
            out[m][0] = mg[i][0], out[m][1] = mg[i][1], m++;
    }
    if (m == 0) return fail(ps, -EINVAL, "grammar: an empty character class");
    bool ascii = out[m - 1][1] < 0x80;
    if (ascii) {
        uint64_t c[4] = {0};
        for (int i = 0; i < m; i++)
            for (uint32_t b = out[i][0]; b <= out[i][1]; b++)
                c[b >> 6] |= 1ull << (b & 63);
        int id = class_id(ps, c);
        return id < 0 ? id : push(ps, r, EL(E_CLS, (uint32_t)id));
    }
    int nr = new_rule(ps, NULL, 0);
    if (nr < 0) return nr;
    for (int i = 0; i < m; i++) {
        uint32_t lo = out[i][0], hi = out[i][1];
        int rc = 0;
        if (lo < 0xd800 && hi > 0xdfff) {
            rc = utf8_split(ps, (uint32_t)nr, lo, 0xd7ff);
            if (rc == 0) rc = utf8_split(ps, (uint32_t)nr, 0xe000, hi);
        } else {
            if (lo >= 0xd800 && lo <= 0xdfff) lo = 0xe000;
            if (hi >= 0xd800 && hi <= 0xdfff) hi = 0xd7ff;
            if (lo <= hi) rc = utf8_split(ps, (uint32_t)nr, lo, hi);
        }
        if (rc < 0) return rc;
    }
    /* The last ALT ends the rule. */
    ps->rules[nr].e[ps->rules[nr].n - 1] = EL(E_END, 0);
    ps->rules[nr].defined = true;
    return push(ps, r, EL(E_REF, (uint32_t)nr));
}

static int parse_alternates(struct parser *ps, uint32_t r, bool nested);

/* Moves rule r's elements from `from` on into a new rule; returns its id. */
static int split_off(struct parser *ps, uint32_t r, uint32_t from)
{
    int nr = new_rule(ps, NULL, 0);
    if (nr < 0) return nr;
    struct rbuf *src = &ps->rules[r];
    uint32_t n = src->n - from;
    uint32_t *copy = malloc((n ? n : 1) * sizeof *copy);
    if (!copy) return fail(ps, -ENOMEM, "grammar: out of memory");
    memcpy(copy, src->e + from, n * sizeof *copy);
    ps->rules[r].n = from;
    ps->n_elems -= n;
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++)
        rc = push(ps, (uint32_t)nr, copy[i]);
    if (rc == 0) rc = push(ps, (uint32_t)nr, EL(E_END, 0));
    free(copy);
    ps->rules[nr].defined = true;
    return rc < 0 ? rc : nr;
}

static int parse_sequence(struct parser *ps, uint32_t r, bool nested)
{
    uint32_t last = UINT32_MAX; /* where the last symbol starts in rule r */
    for (;;) {
        skip_space(ps, nested);
        if (ps->p >= ps->end) return 0;
        char c = *ps->p;
        uint32_t start = ps->rules[r].n;
        if (c == '"') {
            ps->p++;
            while (ps->p < ps->end && *ps->p != '"') {
                uint32_t cp;
                uint8_t b[4];
                if (read_char(ps, &cp) < 0) return ps->err;
                if (cp > 0x10ffff) return fail(ps, -EINVAL, "grammar: code point out of range");
                int n = utf8_enc(cp, b);
                for (int i = 0; i < n; i++)
                    if (push_range(ps, r, b[i], b[i]) < 0) return ps->err;
            }
            if (ps->p >= ps->end) return fail(ps, -EINVAL, "grammar: unfinished literal");
            ps->p++;
            /* An empty literal matches nothing: no symbol for a postfix to repeat. */
            last = ps->rules[r].n > start ? start : UINT32_MAX;
            if (last == UINT32_MAX) continue;
        } else if (c == '[') {
            ps->p++;
            bool neg = ps->p < ps->end && *ps->p == '^';
            if (neg) ps->p++;
            uint32_t rg[MAX_RANGES][2];
            int n = 0;
            while (ps->p < ps->end && *ps->p != ']') {
                uint32_t lo, hi;
                if (read_char(ps, &lo) < 0) return ps->err;
                hi = lo;
                if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
                    ps->p++;
                    if (read_char(ps, &hi) < 0) return ps->err;
                }
                if (hi < lo || hi > 0x10ffff)
                    return fail(ps, -EINVAL, "grammar: bad range in a character class");
                if (n == MAX_RANGES)
                    return fail(ps, -E2BIG, "grammar: more than %d ranges in a class", MAX_RANGES);
                rg[n][0] = lo, rg[n][1] = hi, n++;
            }
            if (ps->p >= ps->end) return fail(ps, -EINVAL, "grammar: unfinished class");
            ps->p++;
            if (emit_class(ps, r, rg, n, neg) < 0) return ps->err;
            last = start;
        } else if (c == '.') {
            ps->p++;
            uint32_t rg[1][2] = {{'\n', '\n'}};
            if (emit_class(ps, r, rg, 1, true) < 0) return ps->err;
            last = start;
        } else if (name_char(c)) {
            const char *s = ps->p;
            while (ps->p < ps->end && name_char(*ps->p))
                ps->p++;
            const char *save = ps->p;
            skip_space(ps, true);
            if (ps->end - ps->p >= 3 && memcmp(ps->p, "::=", 3) == 0) {
                ps->p = s; /* the next rule's head: this sequence ends */
                return 0;
            }
            ps->p = save;
            int id = rule_id(ps, s, (size_t)(save - s));
            if (id < 0) return id;
            if (push(ps, r, EL(E_REF, (uint32_t)id)) < 0) return ps->err;
            last = start;
        } else if (c == '(') {
            ps->p++;
            if (++ps->nest > KVF_GRAMMAR_MAX_NEST)
                return fail(ps, -E2BIG, "grammar: groups nested more than %d deep",
                            KVF_GRAMMAR_MAX_NEST);
            int g = new_rule(ps, NULL, 0);
            if (g < 0) return g;
            if (parse_alternates(ps, (uint32_t)g, true) < 0) return ps->err;
            ps->rules[g].defined = true;
            skip_space(ps, true);
            if (ps->p >= ps->end || *ps->p != ')') return fail(ps, -EINVAL, "grammar: missing ')'");
            ps->p++;
            ps->nest--;
            if (push(ps, r, EL(E_REF, (uint32_t)g)) < 0) return ps->err;
            last = start;
        } else if (c == '*' || c == '+' || c == '?') {
            ps->p++;
            if (last == UINT32_MAX)
                return fail(ps, -EINVAL, "grammar: '%c' with nothing before it", c);
            int x = split_off(ps, r, last);
            if (x < 0) return x;
            int rep = new_rule(ps, NULL, 0);
            if (rep < 0) return rep;
            uint32_t R = (uint32_t)rep, X = (uint32_t)x;
            int rc = push(ps, R, EL(E_REF, X));
            if (c != '?' && rc == 0) rc = push(ps, R, EL(E_REF, R));
            if (rc == 0) rc = push(ps, R, EL(E_ALT, 0));
            if (c == '+' && rc == 0) rc = push(ps, R, EL(E_REF, X));
            if (rc == 0) rc = push(ps, R, EL(E_END, 0));
            if (rc < 0) return rc;
            ps->rules[R].defined = true;
            if (push(ps, r, EL(E_REF, R)) < 0) return ps->err;
            last = UINT32_MAX;
        } else {
            return 0; /* '|', ')', a newline: the caller's */
        }
    }
}

static int parse_alternates(struct parser *ps, uint32_t r, bool nested)
{
    for (;;) {
        if (parse_sequence(ps, r, nested) < 0) return ps->err;
        skip_space(ps, nested);
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            if (push(ps, r, EL(E_ALT, 0)) < 0) return ps->err;
            continue;
        }
        return push(ps, r, EL(E_END, 0));
    }
}

static int parse(struct parser *ps)
{
    for (;;) {
        skip_space(ps, true);
        if (ps->p >= ps->end) return 0;
        const char *s = ps->p;
        while (ps->p < ps->end && name_char(*ps->p))
            ps->p++;
        if (ps->p == s)
            return fail(ps, -EINVAL, "grammar: expected a rule name at offset %ld",
                        (long)(s - (ps->end - (ps->end - s))));
        int id = rule_id(ps, s, (size_t)(ps->p - s));
        if (id < 0) return id;
        if (ps->rules[id].defined)
            return fail(ps, -EINVAL, "grammar: rule '%s' defined twice", ps->rules[id].name);
        skip_space(ps, false);
        if (ps->end - ps->p < 3 || memcmp(ps->p, "::=", 3) != 0)
            return fail(ps, -EINVAL, "grammar: expected '::=' after '%s'", ps->rules[id].name);
        ps->p += 3;
        ps->rules[id].defined = true;
        if (parse_alternates(ps, (uint32_t)id, false) < 0) return ps->err;
        skip_space(ps, false);
        if (ps->p < ps->end && *ps->p != '\n')
            return fail(ps, -EINVAL, "grammar: unexpected '%c' in rule '%s'", *ps->p,
                        ps->rules[id].name);
    }
}

int kvf_grammar_compile(const char *text, size_t len, kvf_grammar_t **out, char *err,
                        size_t err_len)
{
    struct parser ps = {.p = text, .end = text + len, .msg = err, .msg_len = err_len};
    int rc;
    if (len > KVF_GRAMMAR_MAX_BYTES) {
        rc = fail(&ps, -E2BIG, "grammar: %zu bytes; at most %d", len, KVF_GRAMMAR_MAX_BYTES);
        goto free_parser;
    }
    if (!text) {
        rc = fail(&ps, -EINVAL, "grammar: none");
        goto free_parser;
    }
    rc = parse(&ps);
    if (rc < 0) goto free_parser;
    int root = -1;
    for (uint32_t i = 0; i < ps.n_rules; i++) {
        if (!ps.rules[i].defined) {
            rc = fail(&ps, -EINVAL, "grammar: rule '%s' is used but not defined",
                      ps.rules[i].name ? ps.rules[i].name : "?");
            goto free_parser;
        }
        if (ps.rules[i].name && strcmp(ps.rules[i].name, "root") == 0) root = (int)i;
    }
    if (root < 0) {
        rc = fail(&ps, -EINVAL, "grammar: no rule named 'root'");
        goto free_parser;
    }
    kvf_grammar_t *g = calloc(1, sizeof *g);
    if (!g) goto nomem;
    g->n_rules = ps.n_rules;
    g->root = (uint32_t)root;
    g->rule_start = malloc(ps.n_rules * sizeof *g->rule_start);
    g->elems = malloc((ps.n_elems + 1) * sizeof *g->elems);
    g->cls = malloc((ps.n_cls ? ps.n_cls : 1) * sizeof *g->cls);
    if (!g->rule_start || !g->elems || !g->cls) {
        kvf_grammar_free(g);
        goto nomem;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < ps.n_rules; i++) {
        g->rule_start[i] = k;
        if (ps.rules[i].n) memcpy(g->elems + k, ps.rules[i].e, ps.rules[i].n * sizeof *g->elems);
        k += ps.rules[i].n;
    }
    g->n_elems = k;
    if (ps.n_cls) memcpy(g->cls, ps.cls, ps.n_cls * sizeof *g->cls);
    g->n_cls = ps.n_cls;
    *out = g;
    rc = 0;
    goto free_parser;
nomem:
    rc = fail(&ps, -ENOMEM, "grammar: out of memory");
free_parser:
    for (uint32_t i = 0; i < ps.n_rules; i++) {
        free(ps.rules[i].e);
        free(ps.rules[i].name);
    }
    free(ps.rules);
    free(ps.cls);
    return rc;
}

void kvf_grammar_free(kvf_grammar_t *g)
{
    if (!g) return;
    kvf__grammar_cache_clear(g);
    free(g->cache);
    free(g->rule_start);
    free(g->elems);
    free(g->cls);
    free(g);
}

/* --- The matcher. ---------------------------------------------------------------------------- */

/* Adds stack st[0..n) to s unless it is there already or s is full. */
static void add_stack(struct kvf_grammar_state *s, const uint32_t *st, uint32_t n)
{
    for (uint32_t i = 0; i < s->n; i += s->w[i] + 1)
        if (s->w[i] == n && memcmp(s->w + i + 1, st, n * sizeof *st) == 0) return;
    if (s->n + n + 1 > KVF_GRAMMAR_STATE_WORDS) return; /* cut: see the header */
    s->w[s->n] = n;
    memcpy(s->w + s->n + 1, st, n * sizeof *st);
    s->n += n + 1;
}

/* Resolves the top of st[0..n) (st has room for KVF_GRAMMAR_MAX_DEPTH) until every stack it
 * gives tops a byte class or is empty, adding those to s. depth bounds the recursion (a
 * grammar that loops without consuming is cut there) and *work the calls of one step
 * (KVF_GRAMMAR_STEP_WORK: a grammar of many ambiguous alternatives is cut, not slow). */
static void expand(const kvf_grammar_t *g, uint32_t *st, uint32_t n, struct kvf_grammar_state *s,
                   int depth, uint32_t *work)
{
    if (depth > 2 * KVF_GRAMMAR_MAX_DEPTH || *work == 0) return;
    --*work;
    while (n > 0 &&
           (EL_TYPE(g->elems[st[n - 1]]) == E_END || EL_TYPE(g->elems[st[n - 1]]) == E_ALT))
        n--;
    if (n == 0 || EL_TYPE(g->elems[st[n - 1]]) == E_CLS) {
        add_stack(s, st, n);
        return;
    }
    /* A reference: replace it by its continuation (unless the sequence ends there), then put
     * each alternative's first position on top. */
    uint32_t pos = st[n - 1];
    uint32_t rule = EL_VAL(g->elems[pos]);
    uint32_t base[KVF_GRAMMAR_MAX_DEPTH], m = n - 1;
    memcpy(base, st, m * sizeof *st);
    uint32_t t = EL_TYPE(g->elems[pos + 1]);
    if (t != E_END && t != E_ALT) base[m++] = pos + 1;
    if (m >= KVF_GRAMMAR_MAX_DEPTH) return;
    for (uint32_t a = g->rule_start[rule];; a++) {
        uint32_t tmp[KVF_GRAMMAR_MAX_DEPTH];
        memcpy(tmp, base, m * sizeof *st);
        tmp[m] = a;
        expand(g, tmp, m + 1, s, depth + 1, work);
        while (EL_TYPE(g->elems[a]) != E_END && EL_TYPE(g->elems[a]) != E_ALT)
            a++;
        if (EL_TYPE(g->elems[a]) == E_END) break;
    }
}

void kvf_grammar_state_init(const kvf_grammar_t *g, struct kvf_grammar_state *s)
{
    s->n = 0;
    uint32_t st[KVF_GRAMMAR_MAX_DEPTH], work = KVF_GRAMMAR_STEP_WORK;
    uint32_t a = g->rule_start[g->root];
    for (;;) {
        st[0] = a;
        expand(g, st, 1, s, 0, &work);
        while (EL_TYPE(g->elems[a]) != E_END && EL_TYPE(g->elems[a]) != E_ALT)
            a++;
        if (EL_TYPE(g->elems[a]) == E_END) break;
        a++;
    }
}

bool kvf_grammar_state_done(const struct kvf_grammar_state *s)
{
    for (uint32_t i = 0; i < s->n; i += s->w[i] + 1)
        if (s->w[i] == 0) return true;
    return false;
}

void kvf__grammar_step(const kvf_grammar_t *g, const struct kvf_grammar_state *in, uint8_t b,
                       struct kvf_grammar_state *out)
{
    out->n = 0;
    uint32_t st[KVF_GRAMMAR_MAX_DEPTH], work = KVF_GRAMMAR_STEP_WORK;
    for (uint32_t i = 0; i < in->n; i += in->w[i] + 1) {
        uint32_t n = in->w[i];
        if (n == 0) continue;
        const uint32_t *x = in->w + i + 1;
        const uint64_t *c = g->cls[EL_VAL(g->elems[x[n - 1]])];
        if (!(c[b >> 6] >> (b & 63) & 1)) continue;
        memcpy(st, x, n * sizeof *st);
        st[n - 1]++;
        expand(g, st, n, out, 0, &work);
    }
}

int kvf_grammar_state_feed(const kvf_grammar_t *g, struct kvf_grammar_state *s,
                           const uint8_t *bytes, size_t n)
{
    struct kvf_grammar_state *a = malloc(2 * sizeof *a);
    if (!a) return -ENOMEM;
    const struct kvf_grammar_state *cur = s;
    for (size_t i = 0; i < n; i++) {
        struct kvf_grammar_state *nx = &a[i & 1];
        kvf__grammar_step(g, cur, bytes[i], nx);
        if (nx->n == 0) {
            free(a);
            return -EINVAL;
        }
        cur = nx;
    }
    if (cur != s) memcpy(s, cur, offsetof(struct kvf_grammar_state, w) + cur->n * sizeof(uint32_t));
    free(a);
    return 0;
}
