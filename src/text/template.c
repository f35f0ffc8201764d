/* The chat-template interpreter: a Jinja subset (see include/kvfence/text.h).
 *
 * The template is preprocessed as the reference does it (one trailing newline dropped;
 * lstrip_blocks: blanks before "{%" / "{#" at a line start removed; trim_blocks: the newline
 * after "%}" / "#}" removed), parsed by recursive descent into a tree, and the tree evaluated.
 *
 * Every allocation of a render comes from one arena freed at the end, and every error unwinds
 * with longjmp to kvf_template_render: nothing needs freeing on the way, so the many error exits
 * of a parser and evaluator stay one line each. Depth (parse nesting, expression nesting,
 * evaluation recursion) is counted against KVF_TEMPLATE_MAX_DEPTH, steps against
 * KVF_TEMPLATE_MAX_STEPS, output against KVF_TEMPLATE_MAX_OUT, the arena against
 * KVF_TEMPLATE_MAX_MEM. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/text.h"
#include "unicode.h"

/* memcmp for strings that may be empty and then have no bytes at all (a NULL pointer, which
 * memcmp must not be given even with a length of 0). */
static int bytes_cmp(const void *a, const void *b, size_t n)
{
    return n ? memcmp(a, b, n) : 0;
}

/* ---- arena and errors ---- */

struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

struct ctx {
    jmp_buf fail;
    int rc;
    char *err;
    size_t err_len;
    struct chunk *chunks;
    size_t mem;
    unsigned depth;
    unsigned long steps;
    char *out; /* the output, malloc'd (not arena): it is handed to the caller */
    size_t out_n, out_cap;
};

/* An explanation quotes template text and, through raise_exception, message content, and may
 * be cut anywhere by the caller's buffer: make it one line of valid UTF-8 (control characters,
 * bytes of an invalid or cut sequence: '?'), so that it travels as a JSON string as it is. */
static void one_line(char *s)
{
    uint8_t *p = (uint8_t *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = kvf_utf8_decode(p + i, n - i, &cp);
        if (k == 0 || cp < 0x20 || cp == 0x7f) {
            p[i++] = '?';
            continue;
        }
        i += k;
    }
}

__attribute__((noreturn, format(printf, 3, 4))) static void die(struct ctx *c, int rc,
                                                                const char *fmt, ...)
{
    if (c->err && c->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_len, fmt, ap);
        va_end(ap);
        one_line(c->err);
    }
    c->rc = rc;
    longjmp(c->fail, 1);
}

static void *alloc(struct ctx *c, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct chunk *k = c->chunks;
    if (!k || k->cap - k->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (c->mem + cap > KVF_TEMPLATE_MAX_MEM)
            die(c, -E2BIG, "template needs more than %u bytes of memory", KVF_TEMPLATE_MAX_MEM);
        k = malloc(sizeof *k + cap);
        if (!k) die(c, -ENOMEM, "out of memory");
        k->next = c->chunks, k->used = 0, k->cap = cap;
        c->chunks = k;
        c->mem += cap;
    }
    void *p = k->data + k->used;
    k->used += n;
    return memset(p, 0, n);
}

static void enter(struct ctx *c)
{
    if (++c->depth > KVF_TEMPLATE_MAX_DEPTH)
        die(c, -E2BIG, "template nests deeper than %u", KVF_TEMPLATE_MAX_DEPTH);
}

static void step(struct ctx *c)
{
    if (++c->steps > KVF_TEMPLATE_MAX_STEPS)
        die(c, -E2BIG, "template takes more than %u steps", KVF_TEMPLATE_MAX_STEPS);
}

/* ---- values ---- */

enum vt { V_UNDEF, V_NONE, V_BOOL, V_INT, V_STR, V_LIST, V_DICT };
static const char *const VT_NAMES[] = {"undefined", "none", "boolean", "integer",
                                       "string",    "list", "mapping"};

struct list;
struct dict;
struct val {
    enum vt t;
    bool b;
    int64_t i;
    const char *s; /* V_STR: s[0..n), not NUL-terminated */
    size_t n;
    struct list *l;
    struct dict *d;
};
struct list {
    struct val *v;
    size_t n;
};
struct dict {
    struct val *keys; /* V_STR */
    struct val *vals;
    size_t n, cap;
};

static struct val v_str(const char *s, size_t n)
{
    return (struct val){.t = V_STR, .s = s, .n = n};
}
static struct val v_bool(bool b)
{
    return (struct val){.t = V_BOOL, .b = b};
}
static struct val v_int(int64_t i)
{
    return (struct val){.t = V_INT, .i = i};
}

static bool str_eq(struct val a, const char *s, size_t n)
{
    return a.t == V_STR && a.n == n && bytes_cmp(a.s, s, n) == 0;
}

static struct val *dict_get(struct dict *d, const char *k, size_t n)
{
    for (size_t i = 0; d && i < d->n; i++)
        if (str_eq(d->keys[i], k, n)) return &d->vals[i];
    return NULL;
}

static void dict_set(struct ctx *c, struct dict *d, const char *k, size_t n, struct val v)
{
    struct val *p = dict_get(d, k, n);
    if (p) {
        *p = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        struct val *nk = alloc(c, cap * sizeof *nk), *nv = alloc(c, cap * sizeof *nv);
        if (d->n) memcpy(nk, d->keys, d->n * sizeof *nk), memcpy(nv, d->vals, d->n * sizeof *nv);
        d->keys = nk, d->vals = nv, d->cap = cap;
    }
    d->keys[d->n] = v_str(k, n);
    d->vals[d->n++] = v;
}

static bool truthy(struct val v)
{
    switch (v.t) {
    case V_BOOL:
        return v.b;
    case V_INT:
        return v.i != 0;
    case V_STR:
        return v.n > 0;
    case V_LIST:
        return v.l->n > 0;
    case V_DICT:
        return v.d->n > 0;
    default:
        return false;
    }
}

/* A growable string in the arena. */
struct sb {
    char *p;
    size_t n, cap;
};

static void sb_put(struct ctx *c, struct sb *b, const char *s, size_t n)
{
    if (n == 0) return; /* b->p may still be NULL: no offset may be applied to it */
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n)
            cap *= 2;
        if (cap > KVF_TEMPLATE_MAX_OUT + (size_t)64)
            die(c, -E2BIG, "a string grows past %u bytes", KVF_TEMPLATE_MAX_OUT);
        char *p = alloc(c, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void to_json(struct ctx *c, struct sb *b, struct val v);

/* The text {{ v }} writes. */
static void to_text(struct ctx *c, struct sb *b, struct val v)
{
    char num[32];
    switch (v.t) {
    case V_UNDEF:
        return;
    case V_NONE:
        sb_put(c, b, "None", 4);
        return;
    case V_BOOL:
        sb_put(c, b, v.b ? "true" : "false", v.b ? 4 : 5);
        return;
    case V_INT:
        sb_put(c, b, num, (size_t)snprintf(num, sizeof num, "%" PRId64, v.i));
        return;
    case V_STR:
        sb_put(c, b, v.s, v.n);
        return;
    default:
        to_json(c, b, v);
    }
}

/* JSON as the reference's tojson writes it: ", " and ": " separators, non-ASCII kept. */
static void to_json(struct ctx *c, struct sb *b, struct val v)
{
    enter(c);
    switch (v.t) {
    case V_UNDEF:
    case V_NONE:
        sb_put(c, b, "null", 4);
        break;
    case V_STR:
        sb_put(c, b, "\"", 1);
        for (size_t i = 0; i < v.n; i++) {
            unsigned char ch = (unsigned char)v.s[i];
            char e[8];
            if (ch == '"' || ch == '\\')
                e[0] = '\\', e[1] = (char)ch, sb_put(c, b, e, 2);
            else if (ch == '\n')
                sb_put(c, b, "\\n", 2);
            else if (ch == '\r')
                sb_put(c, b, "\\r", 2);
            else if (ch == '\t')
                sb_put(c, b, "\\t", 2);
            else if (ch == '\b')
                sb_put(c, b, "\\b", 2);
            else if (ch == '\f')
                sb_put(c, b, "\\f", 2);
            else if (ch < 0x20)
                sb_put(c, b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", ch));
            else
                sb_put(c, b, (const char *)&ch, 1);
        }
        sb_put(c, b, "\"", 1);
        break;
    case V_LIST:
        sb_put(c, b, "[", 1);
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) sb_put(c, b, ", ", 2);
            to_json(c, b, v.l->v[i]);
        }
        sb_put(c, b, "]", 1);
        break;
    case V_DICT:
        sb_put(c, b, "{", 1);
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) sb_put(c, b, ", ", 2);
            to_json(c, b, v.d->keys[i]);
            sb_put(c, b, ": ", 2);
            to_json(c, b, v.d->vals[i]);
        }
        sb_put(c, b, "}", 1);
        break;
    default:
        to_text(c, b, v);
    }
    c->depth--;
}

/* ---- the tree ---- */

enum nk {
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    E_LIT,
    E_VAR,
    E_ATTR,
    E_INDEX,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_BIN,
    E_NOT,
    E_NEG,
    E_LIST,
    E_COND,
};

enum op {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_MOD,
    OP_CAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOTIN,
    OP_AND,
    OP_OR
};

struct node {
    enum nk k;
    int op;           /* E_BIN: enum op; E_TEST: negated */
    const char *name; /* variable, attribute, filter, test, method; N_SET/N_FOR target */
    size_t name_n;
    const char *attr; /* N_SET of ns.attr: the attribute */
    size_t attr_n;
    struct val lit;         /* E_LIT, N_TEXT */
    struct node *a, *b, *c; /* operands; N_IF: cond/then/else; N_FOR: iter/body/else */
    struct node **args;     /* E_CALL, E_FILTER, E_LIST */
    struct val *kw;         /* E_CALL: keyword names (V_STR), or V_UNDEF for positional */
    size_t n_args;
    struct node *next; /* the next statement */
};

/* ---- lexing inside tags ---- */

enum tk { T_END, T_NAME, T_STR, T_INT, T_OP, T_CLOSE_EXPR, T_CLOSE_STMT };

struct tok {
    enum tk k;
    const char *s; /* T_NAME, T_OP: the text; T_STR: the decoded string */
    size_t n;
    int64_t i;
    bool strip; /* a closer written "-}}" / "-%}" */
};

struct parser {
    struct ctx *c;
    const char *src;
    size_t n, pos;
    struct tok t; /* the current token */
    bool skip_ws; /* the last tag ended with "-": skip whitespace before the next text */
};

static bool is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static bool is_ident(char ch, bool first)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
           (!first && ch >= '0' && ch <= '9');
}

static void lex(struct parser *p)
{
    struct ctx *c = p->c;
    const char *s = p->src;
    while (p->pos < p->n && is_space(s[p->pos]))
        p->pos++;
    struct tok t = {.k = T_END};
    size_t at = p->pos, rest = p->n - at;
    if (rest == 0) die(c, -EINVAL, "template ends inside a tag");
    char ch = s[at];
    if (rest >= 3 && (memcmp(s + at, "-}}", 3) == 0 || memcmp(s + at, "-%}", 3) == 0)) {
        t.k = s[at + 1] == '}' ? T_CLOSE_EXPR : T_CLOSE_STMT, t.strip = true;
        p->pos += 3;
    } else if (rest >= 2 && (memcmp(s + at, "}}", 2) == 0 || memcmp(s + at, "%}", 2) == 0)) {
        t.k = ch == '}' ? T_CLOSE_EXPR : T_CLOSE_STMT;
        p->pos += 2;
    } else if (is_ident(ch, true)) {
        size_t e = at;
        while (e < p->n && is_ident(s[e], false))
            e++;
        t = (struct tok){.k = T_NAME, .s = s + at, .n = e - at};
        p->pos = e;
    } else if (ch >= '0' && ch <= '9') {
        int64_t v = 0;
        size_t e = at;
        for (; e < p->n && s[e] >= '0' && s[e] <= '9'; e++) {
            if (v > (INT64_MAX - 9) / 10) die(c, -EINVAL, "integer literal too large");
            v = v * 10 + (s[e] - '0');
        }
        if (e + 1 < p->n && s[e] == '.' && s[e + 1] >= '0' && s[e + 1] <= '9')
            die(c, -EINVAL, "floating-point literals are not supported");
        t = (struct tok){.k = T_INT, .i = v};
        p->pos = e;
    } else if (ch == '\'' || ch == '"') {
        struct sb b = {0};
        size_t e = at + 1;
        for (;; e++) {
            if (e >= p->n) die(c, -EINVAL, "unterminated string literal");
            if (s[e] == ch) break;
            char out = s[e];
            if (s[e] == '\\') {
                if (++e >= p->n) die(c, -EINVAL, "unterminated string literal");
                switch (s[e]) {
                case 'n':
                    out = '\n';
                    break;
                case 't':
                    out = '\t';
                    break;
                case 'r':
                    out = '\r';
                    break;
                case 'b':
                    out = '\b';
                    break;
                case 'f':
                    out = '\f';
                    break;
                case 'v':
                    out = '\v';
                    break;
                case '\\':
                case '\'':
                case '"':
                    out = s[e];
                    break;
                default:
                    die(c, -EINVAL, "escape '\\%c' in a string literal is not supported", s[e]);
                }
            }
            sb_put(c, &b, &out, 1);
        }
        t = (struct tok){.k = T_STR, .s = b.p ? b.p : "", .n = b.n};
        p->pos = e + 1;
    } else {
        static const char *const OPS[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*",
                                          "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                          "{",  "}",  ",",  ".",  ":",  "|",  "="};
        for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++) {
            size_t k = strlen(OPS[i]);
            if (rest >= k && memcmp(s + at, OPS[i], k) == 0) {
                t = (struct tok){.k = T_OP, .s = OPS[i], .n = k};
                p->pos += k;
                break;
            }
        }
        if (t.k == T_END) die(c, -EINVAL, "unexpected character '%c' in a tag", ch);
    }
    p->t = t;
}

static bool is_op(const struct parser *p, const char *op)
{
    return p->t.k == T_OP && p->t.n == strlen(op) && memcmp(p->t.s, op, p->t.n) == 0;
}

static bool is_name(const struct parser *p, const char *name)
{
    return p->t.k == T_NAME && p->t.n == strlen(name) && memcmp(p->t.s, name, p->t.n) == 0;
}

static void expect_op(struct parser *p, const char *op)
{
    if (!is_op(p, op)) die(p->c, -EINVAL, "expected '%s' in a tag", op);
    lex(p);
}

static struct node *new_node(struct parser *p, enum nk k)
{
    struct node *n = alloc(p->c, sizeof *n);
    n->k = k;
    return n;
}

/* ---- expressions ---- */

static struct node *parse_expr(struct parser *p);

/* Comma-separated expressions up to `close`; keyword arguments (name=expr) when kw. */
static void parse_args(struct parser *p, struct node *n, const char *close, bool kw)
{
    struct node *items[256];
    struct val names[256];
    size_t k = 0;
    while (!is_op(p, close)) {
        if (k == 256) die(p->c, -E2BIG, "more than 256 arguments or items");
        names[k] = (struct val){0};
        if (kw && p->t.k == T_NAME) {
            /* name=expr: look one character past the name for a lone '='. */
            size_t q = p->pos;
            while (q < p->n && is_space(p->src[q]))
                q++;
            if (q + 1 < p->n && p->src[q] == '=' && p->src[q + 1] != '=') {
                names[k] = v_str(p->t.s, p->t.n);
                lex(p);
                expect_op(p, "=");
            }
        }
        items[k++] = parse_expr(p);
        if (!is_op(p, ",")) break;
        lex(p);
    }
    expect_op(p, close);
    n->n_args = k;
    n->args = alloc(p->c, (k ? k : 1) * sizeof *n->args);
    n->kw = alloc(p->c, (k ? k : 1) * sizeof *n->kw);
    memcpy(n->args, items, k * sizeof *items);
    memcpy(n->kw, names, k * sizeof *names);
}

static struct node *parse_primary(struct parser *p)
{
    struct node *n;
    if (p->t.k == T_STR) {
        n = new_node(p, E_LIT);
        n->lit = v_str(p->t.s, p->t.n);
        lex(p);
        /* Adjacent string literals join, as in Python. */
        while (p->t.k == T_STR) {
            struct sb b = {0};
            sb_put(p->c, &b, n->lit.s, n->lit.n);
            sb_put(p->c, &b, p->t.s, p->t.n);
            n->lit = v_str(b.p, b.n);
            lex(p);
        }
    } else if (p->t.k == T_INT) {
        n = new_node(p, E_LIT);
        n->lit = v_int(p->t.i);
        lex(p);
    } else if (p->t.k == T_NAME) {
        n = new_node(p, E_LIT);
        if (is_name(p, "true") || is_name(p, "True"))
            n->lit = v_bool(true);
        else if (is_name(p, "false") || is_name(p, "False"))
            n->lit = v_bool(false);
        else if (is_name(p, "none") || is_name(p, "None"))
            n->lit = (struct val){.t = V_NONE};
        else
            n->k = E_VAR, n->name = p->t.s, n->name_n = p->t.n;
        lex(p);
    } else if (is_op(p, "(")) {
        lex(p);
        n = parse_expr(p);
        expect_op(p, ")");
    } else if (is_op(p, "[")) {
        lex(p);
        n = new_node(p, E_LIST);
        parse_args(p, n, "]", false);
    } else {
        die(p->c, -EINVAL, "unexpected %s in an expression",
            p->t.k == T_OP    ? "operator"
            : p->t.k == T_END ? "end"
                              : "tag end");
    }
    return n;
}

static struct node *parse_postfix(struct parser *p)
{
    struct node *n = parse_primary(p);
    for (;;) {
        if (is_op(p, ".")) {
            lex(p);
            if (p->t.k != T_NAME) die(p->c, -EINVAL, "expected a name after '.'");
            struct node *m = new_node(p, E_ATTR);
            m->a = n, m->name = p->t.s, m->name_n = p->t.n;
            lex(p);
            n = m;
        } else if (is_op(p, "[")) {
            lex(p);
            struct node *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            while (!is_op(p, "]")) {
                if (is_op(p, ":")) {
                    if (++k > 2) die(p->c, -EINVAL, "a slice has at most three parts");
                    slice = true;
                    lex(p);
                    continue;
                }
                parts[k] = parse_expr(p);
                if (!is_op(p, ":") && !is_op(p, "]")) die(p->c, -EINVAL, "expected ']'");
            }
            lex(p);
            struct node *m = new_node(p, slice ? E_SLICE : E_INDEX);
            if (!slice && !parts[0]) die(p->c, -EINVAL, "empty subscript");
            m->args = alloc(p->c, 3 * sizeof *m->args);
            memcpy(m->args, parts, sizeof parts);
            m->a = n, m->b = parts[0];
            n = m;
        } else if (is_op(p, "(")) {
            lex(p);
            struct node *m = new_node(p, E_CALL);
            m->a = n;
            parse_args(p, m, ")", true);
            n = m;
        } else {
            return n;
        }
    }
}

/* Filters (x | f, x | f(args)) and tests (x is [not] t), which bind tighter than operators. */
static struct node *parse_filtered(struct parser *p)
{
    struct node *n = parse_postfix(p);
    for (;;) {
        if (is_op(p, "|")) {
            lex(p);
            if (p->t.k != T_NAME) die(p->c, -EINVAL, "expected a filter name after '|'");
            struct node *m = new_node(p, E_FILTER);
            m->a = n, m->name = p->t.s, m->name_n = p->t.n;
            lex(p);
            if (is_op(p, "(")) {
                lex(p);
                parse_args(p, m, ")", true);
            }
            n = m;
        } else if (is_name(p, "is")) {
            lex(p);
            struct node *m = new_node(p, E_TEST);
            if (is_name(p, "not")) m->op = 1, lex(p);
            if (p->t.k != T_NAME) die(p->c, -EINVAL, "expected a test name after 'is'");
            m->a = n, m->name = p->t.s, m->name_n = p->t.n;
            lex(p);
            n = m;
        } else {
            return n;
        }
    }
}

static struct node *parse_unary(struct parser *p)
{
    if (is_op(p, "-") || is_op(p, "+")) {
        bool neg = is_op(p, "-");
        lex(p);
        enter(p->c);
        struct node *a = parse_unary(p);
        p->c->depth--;
        if (!neg) return a;
        struct node *n = new_node(p, E_NEG);
        n->a = a;
        return n;
    }
    return parse_filtered(p);
}

static struct node *bin(struct parser *p, int op, struct node *a, struct node *b)
{
    struct node *n = new_node(p, E_BIN);
    n->op = op, n->a = a, n->b = b;
    return n;
}

static struct node *parse_mul(struct parser *p)
{
    struct node *n = parse_unary(p);
    for (;;) {
        int op = is_op(p, "*") ? OP_MUL : is_op(p, "/") ? OP_DIV : is_op(p, "%") ? OP_MOD : -1;
        if (is_op(p, "//") || is_op(p, "**"))
            die(p->c, -EINVAL, "operator '%.*s' is not supported", (int)p->t.n, p->t.s);
        if (op < 0) return n;
        lex(p);
        n = bin(p, op, n, parse_unary(p));
    }
}

static struct node *parse_add(struct parser *p)
{
    struct node *n = parse_mul(p);
    for (;;) {
        int op = is_op(p, "+") ? OP_ADD : is_op(p, "-") ? OP_SUB : is_op(p, "~") ? OP_CAT : -1;
        if (op < 0) return n;
        lex(p);
        n = bin(p, op, n, parse_mul(p));
    }
}

static struct node *parse_cmp(struct parser *p)
{
    struct node *n = parse_add(p);
    for (;;) {
        int op = is_op(p, "==")     ? OP_EQ
                 : is_op(p, "!=")   ? OP_NE
                 : is_op(p, "<=")   ? OP_LE
                 : is_op(p, ">=")   ? OP_GE
                 : is_op(p, "<")    ? OP_LT
                 : is_op(p, ">")    ? OP_GT
                 : is_name(p, "in") ? OP_IN
                                    : -1;
        if (op < 0 && is_name(p, "not")) {
            /* "not in" (a lone "not" here would be a syntax error anyway) */
            lex(p);
            if (!is_name(p, "in")) die(p->c, -EINVAL, "expected 'in' after 'not'");
            op = OP_NOTIN;
        }
        if (op < 0) return n;
        lex(p);
        n = bin(p, op, n, parse_add(p));
    }
}

static struct node *parse_not(struct parser *p)
{
    if (is_name(p, "not")) {
        lex(p);
        enter(p->c);
        struct node *n = new_node(p, E_NOT);
        n->a = parse_not(p);
        p->c->depth--;
        return n;
    }
    return parse_cmp(p);
}

static struct node *parse_and(struct parser *p)
{
    struct node *n = parse_not(p);
    while (is_name(p, "and")) {
        lex(p);
        n = bin(p, OP_AND, n, parse_not(p));
    }
    return n;
}

static struct node *parse_or(struct parser *p)
{
    struct node *n = parse_and(p);
    while (is_name(p, "or")) {
        lex(p);
        n = bin(p, OP_OR, n, parse_and(p));
    }
    return n;
}

static struct node *parse_expr(struct parser *p)
{
    enter(p->c);
    struct node *n = parse_or(p);
    if (is_name(p, "if")) {
        lex(p);
        struct node *m = new_node(p, E_COND);
        m->b = n;
        m->a = parse_or(p);
        if (is_name(p, "else")) {
            lex(p);
            m->c = parse_expr(p);
        }
        n = m;
    }
    p->c->depth--;
    return n;
}

/* ---- statements ---- */

/* Appends text src[a, e) as a text node, honouring a pending "-" strip. */
static void add_text(struct parser *p, struct node ***tail, size_t a, size_t e)
{
    if (p->skip_ws)
        while (a < e && is_space(p->src[a]))
            a++;
    p->skip_ws = false;
    if (a == e) return;
    struct node *n = new_node(p, N_TEXT);
    n->lit = v_str(p->src + a, e - a);
    **tail = n;
    *tail = &n->next;
}

/* "{%-", "{{-", "{#-": trims the whitespace ending the text node before the tag. */
static void strip_before(struct node **head, struct node **last)
{
    (void)head;
    if (!*last || (*last)->k != N_TEXT) return;
    struct val *v = &(*last)->lit;
    while (v->n > 0 && is_space(v->s[v->n - 1]))
        v->n--;
}

static void end_tag(struct parser *p, enum tk want)
{
    if (p->t.k != want) die(p->c, -EINVAL, "expected '%s'", want == T_CLOSE_STMT ? "%}" : "}}");
    p->skip_ws = p->t.strip;
}

static struct node *parse_body(struct parser *p, const char *const *stops, size_t n_stops,
                               size_t *which);

static struct node *parse_if(struct parser *p)
{
    static const char *const STOPS[] = {"elif", "else", "endif"};
    struct node *n = new_node(p, N_IF);
    n->a = parse_expr(p);
    end_tag(p, T_CLOSE_STMT);
    size_t which;
    n->b = parse_body(p, STOPS, 3, &which);
    if (which == 0) {
        lex(p);
        n->c = parse_if(p); /* elif: an if in the else branch, ending at the same endif */
        return n;
    }
    if (which == 1) {
        lex(p);
        end_tag(p, T_CLOSE_STMT);
        n->c = parse_body(p, STOPS + 2, 1, &which);
    }
    lex(p);
    end_tag(p, T_CLOSE_STMT);
    return n;
}

static struct node *parse_for(struct parser *p)
{
    static const char *const STOPS[] = {"else", "endfor"};
    struct node *n = new_node(p, N_FOR);
    if (p->t.k != T_NAME) die(p->c, -EINVAL, "expected a loop variable after 'for'");
    n->name = p->t.s, n->name_n = p->t.n;
    lex(p);
    if (is_op(p, ",")) die(p->c, -EINVAL, "for with several loop variables is not supported");
    if (!is_name(p, "in")) die(p->c, -EINVAL, "expected 'in' in a for tag");
    lex(p);
    n->a = parse_or(p);
    if (is_name(p, "if")) die(p->c, -EINVAL, "for ... if filters are not supported");
    if (is_name(p, "recursive")) die(p->c, -EINVAL, "recursive loops are not supported");
    end_tag(p, T_CLOSE_STMT);
    size_t which;
    n->b = parse_body(p, STOPS, 2, &which);
    if (which == 0) {
        lex(p);
        end_tag(p, T_CLOSE_STMT);
        n->c = parse_body(p, STOPS + 1, 1, &which);
    }
    lex(p);
    end_tag(p, T_CLOSE_STMT);
    return n;
}

static struct node *parse_set(struct parser *p)
{
    struct node *n = new_node(p, N_SET);
    if (p->t.k != T_NAME) die(p->c, -EINVAL, "expected a name after 'set'");
    n->name = p->t.s, n->name_n = p->t.n;
    lex(p);
    if (is_op(p, ".")) {
        lex(p);
        if (p->t.k != T_NAME) die(p->c, -EINVAL, "expected a name after '.'");
        n->attr = p->t.s, n->attr_n = p->t.n;
        lex(p);
    }
    if (is_op(p, ",")) die(p->c, -EINVAL, "set with several targets is not supported");
    if (!is_op(p, "=")) die(p->c, -EINVAL, "block set (set without '=') is not supported");
    lex(p);
    n->a = parse_expr(p);
    end_tag(p, T_CLOSE_STMT);
    return n;
}

/* Parses text and tags until a {% stop %} tag (its keyword then current; *which its index) or,
 * with no stops, the end of the template. */
static struct node *parse_body(struct parser *p, const char *const *stops, size_t n_stops,
                               size_t *which)
{
    struct ctx *c = p->c;
    enter(c);
    struct node *head = NULL, **tail = &head, *last = NULL;
    const char *s = p->src;
    for (;;) {
        size_t a = p->pos, e = a;
        while (e < p->n && !(s[e] == '{' && e + 1 < p->n &&
                             (s[e + 1] == '{' || s[e + 1] == '%' || s[e + 1] == '#')))
            e++;
        struct node **before = tail;
        add_text(p, &tail, a, e);
        if (tail != before) last = (struct node *)((char *)before[0]);
        p->pos = e;
        if (e >= p->n) {
            if (n_stops) die(c, -EINVAL, "template ends without {%% %s %%}", stops[n_stops - 1]);
            break;
        }
        char kind = s[e + 1];
        p->pos = e + 2;
        bool strip = p->pos < p->n && s[p->pos] == '-';
        if (strip) {
            p->pos++;
            strip_before(&head, &last);
        }
        if (kind == '#') {
            const char *end = NULL;
            for (size_t q = p->pos; q + 1 < p->n; q++)
                if (s[q] == '#' && s[q + 1] == '}') {
                    end = s + q;
                    break;
                }
            if (!end) die(c, -EINVAL, "comment without '#}'");
            p->skip_ws = end > s + p->pos && end[-1] == '-';
            p->pos = (size_t)(end - s) + 2;
            continue;
        }
        lex(p);
        if (kind == '{') {
            struct node *n = new_node(p, N_OUT);
            n->a = parse_expr(p);
            end_tag(p, T_CLOSE_EXPR);
            *tail = n, tail = &n->next, last = n;
            continue;
        }
        if (p->t.k != T_NAME) die(c, -EINVAL, "expected a statement name after '{%%'");
        for (size_t i = 0; i < n_stops; i++) {
            if (is_name(p, stops[i])) {
                *which = i;
                c->depth--;
                return head;
            }
        }
        struct node *n;
        if (is_name(p, "if"))
            lex(p), n = parse_if(p);
        else if (is_name(p, "for"))
            lex(p), n = parse_for(p);
        else if (is_name(p, "set"))
            lex(p), n = parse_set(p);
        else
            die(c, -EINVAL, "statement '%.*s' is not supported here", (int)p->t.n, p->t.s);
        *tail = n, tail = &n->next, last = n;
    }
    c->depth--;
    return head;
}

/* ---- evaluation ---- */

struct scope {
    struct dict vars;
    struct scope *up;
};

struct ev {
    struct ctx *c;
    struct scope *sc;
    struct sb *out;
};

static struct val eval(struct ev *e, const struct node *n);

static struct val lookup(struct ev *e, const char *name, size_t n)
{
    for (struct scope *s = e->sc; s; s = s->up) {
        struct val *v = dict_get(&s->vars, name, n);
        if (v) return *v;
    }
    return (struct val){.t = V_UNDEF};
}

static struct val need_str(struct ev *e, struct val v, const char *what)
{
    if (v.t != V_STR) die(e->c, -EINVAL, "%s needs a string, not %s", what, VT_NAMES[v.t]);
    return v;
}

static bool has_char(struct val set, char ch)
{
    return memchr(set.s, ch, set.n) != NULL;
}

/* strip / lstrip / rstrip: whitespace, or the given characters. */
static struct val strip(struct val s, const struct val *chars, bool left, bool right)
{
    size_t a = 0, b = s.n;
    while (left && a < b && (chars ? has_char(*chars, s.s[a]) : is_space(s.s[a])))
        a++;
    while (right && b > a && (chars ? has_char(*chars, s.s[b - 1]) : is_space(s.s[b - 1])))
        b--;
    return v_str(s.s + a, b - a);
}

static struct val new_list(struct ev *e, size_t n)
{
    struct list *l = alloc(e->c, sizeof *l);
    l->v = alloc(e->c, (n ? n : 1) * sizeof *l->v);
    l->n = n;
    return (struct val){.t = V_LIST, .l = l};
}

static struct val case_map(struct ev *e, struct val s, bool upper)
{
    char *p = alloc(e->c, s.n + 1);
    for (size_t i = 0; i < s.n; i++) {
        char ch = s.s[i];
        p[i] = upper && ch >= 'a' && ch <= 'z'    ? (char)(ch - 32)
               : !upper && ch >= 'A' && ch <= 'Z' ? (char)(ch + 32)
                                                  : ch;
    }
    return v_str(p, s.n);
}

static struct val call_method(struct ev *e, struct val self, const struct node *m, struct val *args,
                              size_t n_args)
{
    const char *name = m->name;
    size_t nn = m->name_n;
#define IS(lit) (nn == sizeof lit - 1 && memcmp(name, lit, nn) == 0)
    if (self.t == V_STR) {
        if (IS("startswith") || IS("endswith")) {
            if (n_args != 1) die(e->c, -EINVAL, "%.*s takes one argument", (int)nn, name);
            struct val x = need_str(e, args[0], "startswith/endswith");
            if (x.n > self.n) return v_bool(false);
            const char *at = IS("startswith") ? self.s : self.s + self.n - x.n;
            return v_bool(bytes_cmp(at, x.s, x.n) == 0);
        }
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            if (n_args > 1) die(e->c, -EINVAL, "%.*s takes at most one argument", (int)nn, name);
            struct val chars =
                n_args && args[0].t != V_NONE ? need_str(e, args[0], "strip") : (struct val){0};
            return strip(self, n_args && args[0].t != V_NONE ? &chars : NULL, !IS("rstrip"),
                         !IS("lstrip"));
        }
        if (IS("upper") || IS("lower")) return case_map(e, self, IS("upper"));
        if (IS("split")) {
            if (n_args != 1) die(e->c, -EINVAL, "split is supported with one separator only");
            struct val sep = need_str(e, args[0], "split");
            if (sep.n == 0) die(e->c, -EINVAL, "split with an empty separator");
            size_t count = 1;
            for (size_t i = 0; i + sep.n <= self.n;)
                if (memcmp(self.s + i, sep.s, sep.n) == 0)
                    count++, i += sep.n;
                else
                    i++;
            struct val l = new_list(e, count);
            size_t k = 0, from = 0;
            for (size_t i = 0; i + sep.n <= self.n;) {
                if (memcmp(self.s + i, sep.s, sep.n) == 0) {
                    l.l->v[k++] = v_str(self.s + from, i - from);
                    i += sep.n;
                    from = i;
                } else {
                    i++;
                }
            }
            l.l->v[k] = v_str(self.s + from, self.n - from);
            return l;
        }
        if (IS("replace")) {
            if (n_args != 2) die(e->c, -EINVAL, "replace takes two arguments");
            struct val a = need_str(e, args[0], "replace"), b = need_str(e, args[1], "replace");
            if (a.n == 0) die(e->c, -EINVAL, "replace of an empty string");
            struct sb out = {0};
            for (size_t i = 0; i < self.n;) {
                if (i + a.n <= self.n && bytes_cmp(self.s + i, a.s, a.n) == 0) {
                    sb_put(e->c, &out, b.s, b.n);
                    i += a.n;
                } else {
                    sb_put(e->c, &out, self.s + i++, 1);
                }
            }
            return v_str(out.p ? out.p : "", out.n);
        }
    }
    if (self.t == V_DICT && IS("get")) {
        if (n_args < 1 || n_args > 2) die(e->c, -EINVAL, "get takes one or two arguments");
        struct val k = need_str(e, args[0], "get");
        struct val *v = dict_get(self.d, k.s, k.n);
        return v ? *v : n_args == 2 ? args[1] : (struct val){.t = V_NONE};
    }
    die(e->c, -EINVAL, "method '%.*s' of a %s is not supported", (int)nn, name, VT_NAMES[self.t]);
#undef IS
}

static struct val apply_filter(struct ev *e, const struct node *n, struct val x)
{
    const char *name = n->name;
    size_t nn = n->name_n;
    struct val args[4];
    if (n->n_args > 4) die(e->c, -EINVAL, "too many filter arguments");
    for (size_t i = 0; i < n->n_args; i++)
        args[i] = eval(e, n->args[i]);
#define IS(lit) (nn == sizeof lit - 1 && memcmp(name, lit, nn) == 0)
    if (IS("trim")) return strip(need_str(e, x, "trim"), NULL, true, true);
    if (IS("upper") || IS("lower")) return case_map(e, need_str(e, x, "upper/lower"), IS("upper"));
    if (IS("length") || IS("count")) {
        if (x.t == V_STR) {
            int64_t k = 0; /* characters, not bytes */
            for (size_t i = 0; i < x.n; i++)
                k += ((unsigned char)x.s[i] & 0xc0) != 0x80;
            return v_int(k);
        }
        if (x.t == V_LIST) return v_int((int64_t)x.l->n);
        if (x.t == V_DICT) return v_int((int64_t)x.d->n);
        die(e->c, -EINVAL, "length of a %s", VT_NAMES[x.t]);
    }
    if (IS("tojson")) {
        if (n->n_args) die(e->c, -EINVAL, "tojson with arguments is not supported");
        struct sb b = {0};
        to_json(e->c, &b, x);
        return v_str(b.p, b.n);
    }
    if (IS("string")) {
        struct sb b = {0};
        to_text(e->c, &b, x);
        return v_str(b.p ? b.p : "", b.n);
    }
    if (IS("first") || IS("last")) {
        if (x.t != V_LIST) die(e->c, -EINVAL, "first/last of a %s", VT_NAMES[x.t]);
        if (x.l->n == 0) return (struct val){.t = V_UNDEF};
        return x.l->v[IS("first") ? 0 : x.l->n - 1];
    }
    if (IS("join")) {
        if (x.t != V_LIST) die(e->c, -EINVAL, "join of a %s", VT_NAMES[x.t]);
        struct val sep = n->n_args ? need_str(e, args[0], "join") : v_str("", 0);
        struct sb b = {0};
        for (size_t i = 0; i < x.l->n; i++) {
            if (i) sb_put(e->c, &b, sep.s, sep.n);
            to_text(e->c, &b, x.l->v[i]);
        }
        return v_str(b.p ? b.p : "", b.n);
    }
    die(e->c, -EINVAL, "filter '%.*s' is not supported", (int)nn, name);
#undef IS
}

static bool apply_test(struct ev *e, const struct node *n, struct val x)
{
    const char *name = n->name;
    size_t nn = n->name_n;
#define IS(lit) (nn == sizeof lit - 1 && memcmp(name, lit, nn) == 0)
    if (IS("defined")) return x.t != V_UNDEF;
    if (IS("undefined")) return x.t == V_UNDEF;
    if (IS("none")) return x.t == V_NONE;
    if (IS("string")) return x.t == V_STR;
    if (IS("number") || IS("integer")) return x.t == V_INT;
    if (IS("boolean")) return x.t == V_BOOL;
    if (IS("true")) return x.t == V_BOOL && x.b;
    if (IS("false")) return x.t == V_BOOL && !x.b;
    if (IS("mapping")) return x.t == V_DICT;
    if (IS("sequence") || IS("iterable")) return x.t == V_LIST || x.t == V_STR || x.t == V_DICT;
    die(e->c, -EINVAL, "test '%.*s' is not supported", (int)nn, name);
#undef IS
}

static bool equal(struct val a, struct val b)
{
    if (a.t == V_STR && b.t == V_STR) return a.n == b.n && bytes_cmp(a.s, b.s, a.n) == 0;
    if (a.t == V_INT && b.t == V_INT) return a.i == b.i;
    if (a.t == V_BOOL && b.t == V_BOOL) return a.b == b.b;
    if (a.t == V_NONE && b.t == V_NONE) return true;
    if (a.t == V_UNDEF && b.t == V_UNDEF) return true;
    if (a.t == V_LIST && b.t == V_LIST) {
        if (a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!equal(a.l->v[i], b.l->v[i])) return false;
        return true;
    }
    return false;
}

static bool contains(struct ev *e, struct val hay, struct val x)
{
    if (hay.t == V_STR) {
        struct val s = need_str(e, x, "'in' over a string");
        if (s.n == 0) return true;
        for (size_t i = 0; i + s.n <= hay.n; i++)
            if (memcmp(hay.s + i, s.s, s.n) == 0) return true;
        return false;
    }
    if (hay.t == V_LIST) {
        for (size_t i = 0; i < hay.l->n; i++)
            if (equal(hay.l->v[i], x)) return true;
        return false;
    }
    if (hay.t == V_DICT) return x.t == V_STR && dict_get(hay.d, x.s, x.n) != NULL;
    die(e->c, -EINVAL, "'in' over a %s", VT_NAMES[hay.t]);
}

static struct val binary(struct ev *e, const struct node *n)
{
    struct ctx *c = e->c;
    struct val a = eval(e, n->a);
    if (n->op == OP_AND) return truthy(a) ? eval(e, n->b) : a;
    if (n->op == OP_OR) return truthy(a) ? a : eval(e, n->b);
    struct val b = eval(e, n->b);
    switch (n->op) {
    case OP_CAT: {
        struct sb s = {0};
        to_text(c, &s, a);
        to_text(c, &s, b);
        return v_str(s.p ? s.p : "", s.n);
    }
    case OP_ADD:
        if (a.t == V_STR && b.t == V_STR) {
            struct sb s = {0};
            sb_put(c, &s, a.s, a.n);
            sb_put(c, &s, b.s, b.n);
            return v_str(s.p ? s.p : "", s.n);
        }
        if (a.t == V_LIST && b.t == V_LIST) {
            struct val l = new_list(e, a.l->n + b.l->n);
            memcpy(l.l->v, a.l->v, a.l->n * sizeof *a.l->v);
            memcpy(l.l->v + a.l->n, b.l->v, b.l->n * sizeof *b.l->v);
            return l;
        }
        __attribute__((fallthrough)); /* numbers */
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
    case OP_MOD:
        if (a.t != V_INT || b.t != V_INT)
            die(c, -EINVAL, "arithmetic on a %s and a %s", VT_NAMES[a.t], VT_NAMES[b.t]);
        if ((n->op == OP_DIV || n->op == OP_MOD) && b.i == 0) die(c, -EINVAL, "division by zero");
        if (n->op == OP_DIV && a.i % b.i != 0)
            die(c, -EINVAL, "division with a fraction is not supported");
        if (a.i > INT32_MAX || a.i < INT32_MIN || b.i > INT32_MAX || b.i < INT32_MIN)
            die(c, -EINVAL, "integer out of range");
        switch (n->op) {
        case OP_ADD:
            return v_int(a.i + b.i);
        case OP_SUB:
            return v_int(a.i - b.i);
        case OP_MUL:
            return v_int(a.i * b.i);
        case OP_DIV:
            return v_int(a.i / b.i);
        default:
            return v_int(((a.i % b.i) + b.i) % b.i); /* Python's sign rule */
        }
    case OP_EQ:
        return v_bool(equal(a, b));
    case OP_NE:
        return v_bool(!equal(a, b));
    case OP_LT:
    case OP_GT:
    case OP_LE:
    case OP_GE: {
        int cmp;
        if (a.t == V_INT && b.t == V_INT) {
            cmp = (a.i > b.i) - (a.i < b.i);
        } else if (a.t == V_STR && b.t == V_STR) {
            size_t k = a.n < b.n ? a.n : b.n;
            cmp = bytes_cmp(a.s, b.s, k);
            if (cmp == 0) cmp = (a.n > b.n) - (a.n < b.n);
        } else {
            die(c, -EINVAL, "comparing a %s with a %s", VT_NAMES[a.t], VT_NAMES[b.t]);
        }
        return v_bool(n->op == OP_LT   ? cmp < 0
                      : n->op == OP_GT ? cmp > 0
                      : n->op == OP_LE ? cmp <= 0
                                       : cmp >= 0);
    }
    case OP_IN:
        return v_bool(contains(e, b, a));
    case OP_NOTIN:
        return v_bool(!contains(e, b, a));
    }
    die(c, -EINVAL, "bad operator");
}

static struct val index_of(struct ev *e, struct val x, struct val k)
{
    if (x.t == V_DICT) {
        if (k.t != V_STR) die(e->c, -EINVAL, "mapping key must be a string");
        struct val *v = dict_get(x.d, k.s, k.n);
        return v ? *v : (struct val){.t = V_UNDEF};
    }
    if (x.t == V_LIST || x.t == V_STR) {
        if (k.t != V_INT) die(e->c, -EINVAL, "index must be an integer");
        int64_t n = x.t == V_LIST ? (int64_t)x.l->n : (int64_t)x.n, i = k.i < 0 ? k.i + n : k.i;
        if (i < 0 || i >= n) return (struct val){.t = V_UNDEF};
        if (x.t == V_LIST) return x.l->v[i];
        return v_str(x.s + i, 1); /* a byte: templates index ASCII text only */
    }
    if (x.t == V_UNDEF) die(e->c, -EINVAL, "subscript of an undefined value");
    die(e->c, -EINVAL, "subscript of a %s", VT_NAMES[x.t]);
}

static struct val slice(struct ev *e, const struct node *n)
{
    struct val x = eval(e, n->a);
    int64_t part[3];
    bool given[3];
    for (int i = 0; i < 3; i++) {
        given[i] = n->args[i] != NULL;
        if (given[i]) {
            struct val v = eval(e, n->args[i]);
            if (v.t != V_INT) die(e->c, -EINVAL, "slice bounds must be integers");
            part[i] = v.i;
        }
    }
    int64_t len = x.t == V_LIST ? (int64_t)x.l->n : x.t == V_STR ? (int64_t)x.n : -1;
    if (len < 0) die(e->c, -EINVAL, "slice of a %s", VT_NAMES[x.t]);
    int64_t st = given[2] ? part[2] : 1;
    if (st == 0) die(e->c, -EINVAL, "slice step 0");
    /* Python's rules: negative bounds count from the end, then clamp. */
    int64_t lo = st > 0 ? 0 : -1, hi = st > 0 ? len : len - 1;
    int64_t a = given[0] ? (part[0] < 0 ? part[0] + len : part[0]) : (st > 0 ? 0 : len - 1);
    int64_t b = given[1] ? (part[1] < 0 ? part[1] + len : part[1]) : (st > 0 ? len : -1);
    a = a < lo ? lo : a > hi ? hi : a;
    b = b < lo ? lo : b > hi ? hi : b;
    size_t count = 0;
    for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
        count++;
    if (x.t == V_LIST) {
        struct val l = new_list(e, count);
        size_t k = 0;
        for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
            l.l->v[k++] = x.l->v[i];
        return l;
    }
    char *p = alloc(e->c, count + 1);
    size_t k = 0;
    for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
        p[k++] = x.s[i];
    return v_str(p, count);
}

static struct val call(struct ev *e, const struct node *n)
{
    struct val args[256];
    for (size_t i = 0; i < n->n_args; i++)
        args[i] = eval(e, n->args[i]);
    const struct node *f = n->a;
    if (f->k == E_VAR) {
#define IS(lit) (f->name_n == sizeof lit - 1 && memcmp(f->name, lit, f->name_n) == 0)
        if (IS("namespace")) {
            struct dict *d = alloc(e->c, sizeof *d);
            for (size_t i = 0; i < n->n_args; i++) {
                if (n->kw[i].t != V_STR)
                    die(e->c, -EINVAL, "namespace() takes keyword arguments only");
                dict_set(e->c, d, n->kw[i].s, n->kw[i].n, args[i]);
            }
            return (struct val){.t = V_DICT, .d = d};
        }
        if (IS("raise_exception")) {
            struct val m = n->n_args ? args[0] : v_str("", 0);
            if (m.t != V_STR) m = v_str("(no message)", 12);
            die(e->c, -EINVAL, "template raised: %.*s", (int)(m.n > 200 ? 200 : m.n), m.s);
        }
        die(e->c, -EINVAL, "function '%.*s' is not supported", (int)f->name_n, f->name);
#undef IS
    }
    if (f->k == E_ATTR) {
        for (size_t i = 0; i < n->n_args; i++)
            if (n->kw[i].t == V_STR)
                die(e->c, -EINVAL, "keyword arguments to methods are not supported");
        return call_method(e, eval(e, f->a), f, args, n->n_args);
    }
    die(e->c, -EINVAL, "call of something that is not a function");
}

static struct val eval(struct ev *e, const struct node *n)
{
    struct ctx *c = e->c;
    step(c);
    enter(c);
    struct val r;
    switch (n->k) {
    case E_LIT:
        r = n->lit;
        break;
    case E_VAR:
        r = lookup(e, n->name, n->name_n);
        break;
    case E_ATTR: {
        struct val x = eval(e, n->a);
        if (x.t == V_DICT) {
            struct val *v = dict_get(x.d, n->name, n->name_n);
            r = v ? *v : (struct val){.t = V_UNDEF};
        } else if (x.t == V_UNDEF || x.t == V_NONE) {
            die(c, -EINVAL, "attribute '%.*s' of a%s %s value", (int)n->name_n, n->name,
                x.t == V_UNDEF ? "n" : "", VT_NAMES[x.t]);
        } else {
            r = (struct val){.t = V_UNDEF};
        }
        break;
    }
    case E_INDEX:
        r = index_of(e, eval(e, n->a), eval(e, n->b));
        break;
    case E_SLICE:
        r = slice(e, n);
        break;
    case E_CALL:
        r = call(e, n);
        break;
    case E_FILTER:
        r = apply_filter(e, n, eval(e, n->a));
        break;
    case E_TEST:
        r = v_bool(apply_test(e, n, eval(e, n->a)) != (n->op != 0));
        break;
    case E_BIN:
        r = binary(e, n);
        break;
    case E_NOT:
        r = v_bool(!truthy(eval(e, n->a)));
        break;
    case E_NEG: {
        struct val x = eval(e, n->a);
        if (x.t != V_INT) die(c, -EINVAL, "negation of a %s", VT_NAMES[x.t]);
        r = v_int(-x.i);
        break;
    }
    case E_LIST: {
        r = new_list(e, n->n_args);
        for (size_t i = 0; i < n->n_args; i++)
            r.l->v[i] = eval(e, n->args[i]);
        break;
    }
    case E_COND:
        r = truthy(eval(e, n->a)) ? eval(e, n->b)
            : n->c                ? eval(e, n->c)
                                  : (struct val){.t = V_UNDEF};
        break;
    default:
        die(c, -EINVAL, "bad expression");
    }
    c->depth--;
    return r;
}

static void out_put(struct ctx *c, const char *s, size_t n)
{
    if (n > KVF_TEMPLATE_MAX_OUT - c->out_n)
        die(c, -E2BIG, "template output exceeds %u bytes", KVF_TEMPLATE_MAX_OUT);
    if (c->out_cap - c->out_n < n + 1) {
        size_t cap = c->out_cap ? c->out_cap : 1024;
        while (cap - c->out_n < n + 1)
            cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p) die(c, -ENOMEM, "out of memory");
        c->out = p, c->out_cap = cap;
    }
    memcpy(c->out + c->out_n, s, n);
    c->out_n += n;
    c->out[c->out_n] = '\0';
}

static void exec(struct ev *e, const struct node *n);

static void run_for(struct ev *e, const struct node *n)
{
    struct ctx *c = e->c;
    struct val it = eval(e, n->a);
    struct val items;
    if (it.t == V_LIST) {
        items = it;
    } else if (it.t == V_DICT) { /* iterating a mapping gives its keys */
        items = new_list(e, it.d->n);
        memcpy(items.l->v, it.d->keys, it.d->n * sizeof *it.d->keys);
    } else if (it.t == V_UNDEF || it.t == V_NONE) {
        items = new_list(e, 0);
    } else {
        die(c, -EINVAL, "for over a %s", VT_NAMES[it.t]);
    }
    size_t len = items.l->n;
    if (len == 0) {
        if (n->c) exec(e, n->c);
        return;
    }
    struct scope sc = {.up = e->sc};
    e->sc = &sc;
    struct dict *loop = alloc(c, sizeof *loop);
    struct val loopv = {.t = V_DICT, .d = loop};
    for (size_t i = 0; i < len; i++) {
        step(c);
        sc.vars.n = 0; /* each iteration starts from a fresh scope */
        dict_set(c, loop, "index0", 6, v_int((int64_t)i));
        dict_set(c, loop, "index", 5, v_int((int64_t)i + 1));
        dict_set(c, loop, "revindex", 8, v_int((int64_t)(len - i)));
        dict_set(c, loop, "revindex0", 9, v_int((int64_t)(len - i - 1)));
        dict_set(c, loop, "first", 5, v_bool(i == 0));
        dict_set(c, loop, "last", 4, v_bool(i + 1 == len));
        dict_set(c, loop, "length", 6, v_int((int64_t)len));
        dict_set(c, loop, "previtem", 8, i ? items.l->v[i - 1] : (struct val){.t = V_UNDEF});
        dict_set(c, loop, "nextitem", 8,
                 i + 1 < len ? items.l->v[i + 1] : (struct val){.t = V_UNDEF});
        dict_set(c, &sc.vars, "loop", 4, loopv);
        dict_set(c, &sc.vars, n->name, n->name_n, items.l->v[i]);
        exec(e, n->b);
    }
    e->sc = sc.up;
}

static void exec(struct ev *e, const struct node *n)
{
    struct ctx *c = e->c;
    enter(c);
    for (; n; n = n->next) {
        step(c);
        switch (n->k) {
        case N_TEXT:
            out_put(c, n->lit.s, n->lit.n);
            break;
        case N_OUT: {
            struct sb b = {0};
            to_text(c, &b, eval(e, n->a));
            out_put(c, b.p ? b.p : "", b.n);
            break;
        }
        case N_IF:
            if (truthy(eval(e, n->a)))
                exec(e, n->b);
            else if (n->c)
                exec(e, n->c);
            break;
        case N_FOR:
            run_for(e, n);
            break;
        case N_SET: {
            struct val v = eval(e, n->a);
            if (n->attr) {
                struct val ns = lookup(e, n->name, n->name_n);
                if (ns.t != V_DICT)
                    die(c, -EINVAL, "set %.*s.%.*s: '%.*s' is not a namespace", (int)n->name_n,
                        n->name, (int)n->attr_n, n->attr, (int)n->name_n, n->name);
                dict_set(c, ns.d, n->attr, n->attr_n, v);
            } else {
                dict_set(c, &e->sc->vars, n->name, n->name_n, v);
            }
            break;
        }
        default:
            die(c, -EINVAL, "bad statement");
        }
    }
    c->depth--;
}

/* ---- entry ---- */

/* The reference's preprocessing (see the file comment), into the arena. */
static char *preprocess(struct ctx *c, const char *t, size_t *len)
{
    size_t n = strlen(t);
    if (n > 0 && t[n - 1] == '\n') n--;
    char *a = alloc(c, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        /* lstrip_blocks: at a line start, blanks followed by "{#", "{%" or "{-" go. */
        if (i == 0 || t[i - 1] == '\n') {
            size_t j = i;
            while (j < n && (t[j] == ' ' || t[j] == '\t'))
                j++;
            if (j + 1 < n && t[j] == '{' && (t[j + 1] == '#' || t[j + 1] == '%' || t[j + 1] == '-'))
                i = j;
        }
        /* trim_blocks: the newline right after "#}", "%}" or "-}" goes. */
        if (t[i] == '\n' && i >= 2 && t[i - 1] == '}' &&
            (t[i - 2] == '#' || t[i - 2] == '%' || t[i - 2] == '-')) {
            i++;
            continue;
        }
        a[k++] = t[i++];
    }
    a[k] = '\0';
    *len = k;
    return a;
}

int kvf_template_render(const char *tmpl, const struct kvf_chat_msg *msgs, size_t n,
                        bool add_generation_prompt, const char *bos, const char *eos, char **out,
                        char *err, size_t err_len)
{
    if (err && err_len) err[0] = '\0';
    if (out) *out = NULL;
    if (!tmpl || (!msgs && n) || !out) {
        if (err && err_len) snprintf(err, err_len, "invalid argument");
        return -EINVAL;
    }
    struct ctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (err && err_len) snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    c->err = err, c->err_len = err_len;
    int rc;
    if (setjmp(c->fail) == 0) {
        struct parser p = {.c = c};
        p.src = preprocess(c, tmpl, &p.n);
        size_t which;
        struct node *root = parse_body(&p, NULL, 0, &which);
        struct scope global = {0};
        struct val list = {.t = V_LIST, .l = alloc(c, sizeof(struct list))};
        list.l->v = alloc(c, (n ? n : 1) * sizeof *list.l->v);
        list.l->n = n;
        for (size_t i = 0; i < n; i++) {
            struct dict *d = alloc(c, sizeof *d);
            if (!msgs[i].role || !msgs[i].content)
                die(c, -EINVAL, "message %zu lacks a role or content", i);
            dict_set(c, d, "role", 4, v_str(msgs[i].role, strlen(msgs[i].role)));
            dict_set(c, d, "content", 7, v_str(msgs[i].content, strlen(msgs[i].content)));
            list.l->v[i] = (struct val){.t = V_DICT, .d = d};
        }
        dict_set(c, &global.vars, "messages", 8, list);
        dict_set(c, &global.vars, "add_generation_prompt", 21, v_bool(add_generation_prompt));
        dict_set(c, &global.vars, "bos_token", 9, v_str(bos ? bos : "", bos ? strlen(bos) : 0));
        dict_set(c, &global.vars, "eos_token", 9, v_str(eos ? eos : "", eos ? strlen(eos) : 0));
        struct ev e = {c, &global, NULL};
        c->out = malloc(1);
        if (!c->out) die(c, -ENOMEM, "out of memory");
        c->out[0] = '\0', c->out_cap = 1;
        exec(&e, root);
        *out = c->out;
        rc = (int)c->out_n;
    } else {
        free(c->out);
        rc = c->rc;
    }
    while (c->chunks) {
        struct chunk *k = c->chunks;
        c->chunks = k->next;
        free(k);
    }
    free(c);
    return rc;
}
