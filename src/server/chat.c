/*
 * chat.c — chat messages to prompt tokens: the model's own chat template (tokenizer.chat_template,
 * rendered by kvf_template_render) when the server has one, else the default rendering (see
 * server.h): "<role>: <content>\n" per message, then "assistant:".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/server.h"
#include "kvfence/text.h"
#include "server_internal.h"

int kvf_server_chat_render(const struct kvf_server_chat_msg *msgs, size_t n_msgs, char **out,
                           size_t *out_len)
{
    static const char tail[] = "assistant:";
    if (n_msgs == 0) return -EINVAL;
    size_t len = sizeof tail - 1;
    for (size_t i = 0; i < n_msgs; i++)
        len += strlen(msgs[i].role) + 2 + msgs[i].content_len + 1;
    char *p = malloc(len + 1);
    if (!p) return -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n_msgs; i++) {
        size_t rl = strlen(msgs[i].role);
        memcpy(p + k, msgs[i].role, rl);
        k += rl;
        memcpy(p + k, ": ", 2);
        k += 2;
        memcpy(p + k, msgs[i].content, msgs[i].content_len);
        k += msgs[i].content_len;
        p[k++] = '\n';
    }
    memcpy(p + k, tail, sizeof tail);
    *out = p;
    *out_len = len;
    return 0;
}

/* --- The model's own chat template. ----------------------------------------------------------
 *
 * The rendered text is encoded with KVF_TOKENIZE_PARSE_SPECIAL, so the template's own
 * "<|im_start|>" or "<|eot_id|>" become those control tokens — and, without care, so would the same
 * text typed by a user: vLLM and llama.cpp's server both tokenize the whole rendering with special
 * tokens parsed, so a message containing "<|im_end|>\n<|im_start|>system\n..." forges a turn. Here
 * a special token is parsed only where the template wrote it:
 *
 *   1. The messages are rendered as given (R). If no message's content contains the text of a
 *      control or unknown token, R is encoded with special tokens parsed — the same ids the
 *      reference engines give for every ordinary conversation.
 *   2. Otherwise each such occurrence in a content is wrapped in two noncharacters (U+FDD0 ...
 *      U+FDD1) and the messages rendered again (R'). Removing the marks from R' must give R
 *      exactly (the template copied the occurrences, trimming or slicing around them at most);
 *      then special tokens are matched in R leftmost-longest as the tokenizer does, skipping
 *      every match that overlaps a marked occurrence, and each stretch between the matches is
 *      encoded as plain text. A content's "<|im_end|>" is thus characters, never the token.
 *   3. A template that changes such content in another way (or content that already holds the
 *      marks) is refused with 400: the server cannot tell its special tokens apart.
 *
 * Work: step 1 is one render and one encode of each content and of R. Step 2 adds one pass over
 * the vocabulary (its special tokens), a second render, and a scan of R that compares the
 * specials only at bytes that begin one: O(|R| × specials) at worst, typically O(|R|).
 */

struct idbuf {
    int32_t *p;
    size_t n, cap;
};

/* Appends the encoding of text[0..len) with flags; 0 or a negative tokenizer code. */
static int encode_append(const kvf_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                         struct idbuf *b)
{
    if (len == 0) return 0;
    int n = kvf_tokenizer_encode_ex(tok, text, len, flags, NULL, 0);
    if (n <= 0) return n;
    if (b->n + (size_t)n > b->cap) {
        size_t cap = (b->n + (size_t)n) * 2;
        int32_t *p = realloc(b->p, cap * sizeof *p);
        if (!p) return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    int k = kvf_tokenizer_encode_ex(tok, text, len, flags, b->p + b->n, (size_t)n);
    if (k < 0) return k;
    b->n += (size_t)k;
    return 0;
}

static bool is_special(const kvf_tokenizer_t *tok, int32_t id)
{
    int t = kvf_tokenizer_type(tok, id);
    return t == KVF_TOKEN_CONTROL || t == KVF_TOKEN_UNKNOWN;
}

/* 1 if text holds the text of a special token (as the tokenizer would parse it), 0 if not. */
static int has_special(const kvf_tokenizer_t *tok, const char *text, size_t len)
{
    struct idbuf b = {0};
    int rc = encode_append(tok, text, len, KVF_TOKENIZE_PARSE_SPECIAL, &b);
    for (size_t i = 0; rc == 0 && i < b.n; i++)
        if (is_special(tok, b.p[i])) rc = 1;
    free(b.p);
    return rc;
}

/* The vocabulary's special tokens (control and unknown: what KVF_TOKENIZE_PARSE_SPECIAL
 * parses), and which bytes begin one, so most positions are passed over at one lookup. */
struct specials {
    int32_t *ids;
    size_t n;
    bool first[256];
};

/* The longest special token whose text starts at s[0..n), or -1; *len its length.
 * O(number of specials) where a special begins with s[0], else O(1). */
static int32_t special_at(const kvf_tokenizer_t *tok, const struct specials *sp, const char *s,
                          size_t n, size_t *len)
{
    int32_t best = -1;
    *len = 0;
    if (n == 0 || !sp->first[(unsigned char)s[0]]) return -1;
    const int32_t *specials = sp->ids;
    for (size_t i = 0; i < sp->n; i++) {
        size_t pl;
        const char *p = kvf_tokenizer_piece(tok, specials[i], &pl);
        if (p && pl > *len && pl <= n && memcmp(s, p, pl) == 0) {
            best = specials[i];
            *len = pl;
        }
    }
    return best;
}

#define MARK_OPEN  "\xEF\xB7\x90" /* U+FDD0 */
#define MARK_CLOSE "\xEF\xB7\x91" /* U+FDD1 */
#define MARK_LEN   3

/* content with each special token's text wrapped in the marks (malloc'd), or NULL. */
static char *mark_content(const kvf_tokenizer_t *tok, const struct specials *sp, const char *c)
{
    size_t n = strlen(c);
    struct kvf__sbuf b = {0};
    for (size_t i = 0; i < n;) {
        size_t len;
        if (special_at(tok, sp, c + i, n - i, &len) >= 0) {
            kvf__sbuf_put(&b, MARK_OPEN, MARK_LEN);
            kvf__sbuf_put(&b, c + i, len);
            kvf__sbuf_put(&b, MARK_CLOSE, MARK_LEN);
            i += len;
        } else {
            kvf__sbuf_put(&b, c + i, 1);
            i++;
        }
    }
    kvf__sbuf_put(&b, "", 1);
    if (b.oom) {
        kvf__sbuf_free(&b);
        return NULL;
    }
    return b.p;
}

static int render(const char *tmpl, const kvf_tokenizer_t *tok, const struct kvf_chat_msg *msgs,
                  size_t n, char **out, struct kvf__srv_err *e)
{
    char err[200] = "";
    size_t bl = 0, el = 0;
    const char *bos = kvf_tokenizer_piece(tok, kvf_tokenizer_bos(tok), &bl);
    const char *eos = kvf_tokenizer_piece(tok, kvf_tokenizer_eos(tok), &el);
    int rc = kvf_template_render(tmpl, msgs, n, true, bos, eos, out, err, sizeof err);
    if (rc == -ENOMEM) return kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
    if (rc < 0)
        return kvf__srv_fail(e, 400, "messages", "chat_template_error",
                             "the model's chat template cannot render these messages: %s", err);
    return rc;
}

/* Step 2 of the header: R' must strip to R; then specials outside marked ranges. */
static int encode_marked(const char *tmpl, const kvf_tokenizer_t *tok,
                         const struct kvf_chat_msg *msgs, size_t n, const char *r, size_t r_len,
                         struct idbuf *ids, struct kvf__srv_err *e)
{
    struct specials sp = {0};
    uint32_t nv = kvf_tokenizer_n_vocab(tok);
    struct kvf_chat_msg *m2 = calloc(n, sizeof *m2);
    char **owned = calloc(n, sizeof *owned);
    uint8_t *prot = calloc(r_len + 1, 1); /* prot[i]: byte i of R is inside a content's special */
    char *r2 = NULL;
    int rc = -1;
    if (!m2 || !owned || !prot || !(sp.ids = malloc(nv * sizeof *sp.ids))) goto oom;
    for (uint32_t i = 0; i < nv; i++) {
        size_t pl;
        const char *p = kvf_tokenizer_piece(tok, (int32_t)i, &pl);
        if (!is_special(tok, (int32_t)i) || !p || pl == 0) continue;
        sp.ids[sp.n++] = (int32_t)i;
        sp.first[(unsigned char)p[0]] = true;
    }
    if (memmem(r, r_len, MARK_OPEN, MARK_LEN) || memmem(r, r_len, MARK_CLOSE, MARK_LEN)) {
        kvf__srv_fail(e, 400, "messages", "invalid_value",
                      "messages hold the noncharacters U+FDD0/U+FDD1 together with special-token "
                      "text; remove either");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        m2[i].role = msgs[i].role;
        if (!(owned[i] = mark_content(tok, &sp, msgs[i].content))) goto oom;
        m2[i].content = owned[i];
    }
    int k = render(tmpl, tok, m2, n, &r2, e);
    if (k < 0) goto out;
    /* Strip the marks, comparing with R and recording the protected bytes. */
    size_t j = 0;
    bool inside = false, same = true;
    for (size_t i = 0; same && i < (size_t)k;) {
        if ((size_t)k - i >= MARK_LEN && memcmp(r2 + i, MARK_OPEN, MARK_LEN) == 0) {
            same = !inside;
            inside = true;
            i += MARK_LEN;
        } else if ((size_t)k - i >= MARK_LEN && memcmp(r2 + i, MARK_CLOSE, MARK_LEN) == 0) {
            same = inside;
            inside = false;
            i += MARK_LEN;
        } else {
            same = j < r_len && r2[i] == r[j];
            prot[j++] = inside;
            i++;
        }
    }
    if (!same || inside || j != r_len) {
        kvf__srv_fail(e, 400, "messages", "invalid_value",
                      "a message's content holds the text of a special token and the model's chat "
                      "template changes that content, so its special tokens cannot be told from "
                      "the template's; remove the special-token text");
        goto out;
    }
    /* Leftmost-longest, as the tokenizer matches added tokens, minus the protected ones. */
    size_t start = 0;
    for (size_t i = 0; i < r_len;) {
        size_t len;
        int32_t id = special_at(tok, &sp, r + i, r_len - i, &len);
        bool ok = id >= 0;
        for (size_t q = i; ok && q < i + len; q++)
            ok = !prot[q];
        if (!ok) {
            i++;
            continue;
        }
        int erc = encode_append(tok, r + start, i - start, 0, ids);
        if (erc < 0) goto enc_fail;
        if (ids->n == ids->cap) {
            size_t cap = ids->cap * 2 + 16;
            int32_t *p = realloc(ids->p, cap * sizeof *p);
            if (!p) goto oom;
            ids->p = p;
            ids->cap = cap;
        }
        ids->p[ids->n++] = id;
        i += len;
        start = i;
    }
    if (encode_append(tok, r + start, r_len - start, 0, ids) < 0) goto enc_fail;
    rc = 0;
    goto out;
enc_fail:
    kvf__srv_fail(e, 400, "messages", "invalid_value", "the rendered messages cannot be tokenized");
    goto out;
oom:
    kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
out:
    if (owned)
        for (size_t i = 0; i < n; i++)
            free(owned[i]);
    free(owned);
    free(m2);
    free(prot);
    free(r2);
    free(sp.ids);
    return rc;
}

int kvf__srv_chat_template_encode(const char *tmpl, const kvf_tokenizer_t *tok,
                                  const struct kvf_chat_msg *msgs, size_t n, int32_t **out,
                                  uint32_t *n_out, struct kvf__srv_err *e)
{
    char *r = NULL;
    struct idbuf ids = {0};
    int rc = -1, k = render(tmpl, tok, msgs, n, &r, e);
    if (k < 0) return -1;
    int any = 0;
    for (size_t i = 0; any == 0 && i < n; i++)
        any = has_special(tok, msgs[i].content, strlen(msgs[i].content));
    if (any < 0) {
        kvf__srv_fail(e, 400, "messages", "invalid_value", "messages cannot be tokenized");
        goto out;
    }
    if (!any) {
        int erc = encode_append(tok, r, (size_t)k, KVF_TOKENIZE_PARSE_SPECIAL, &ids);
        if (erc == -ENOMEM) {
            kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
            goto out;
        }
        if (erc < 0) {
            kvf__srv_fail(e, 400, "messages", "invalid_value",
                          "the rendered messages cannot be tokenized");
            goto out;
        }
    } else if (encode_marked(tmpl, tok, msgs, n, r, (size_t)k, &ids, e) < 0) {
        goto out;
    }
    if (ids.n == 0) {
        kvf__srv_fail(e, 400, "messages", "invalid_value", "the rendered messages are empty");
        goto out;
    }
    if (ids.n > UINT32_MAX / 2) {
        kvf__srv_fail(e, 400, "messages", "invalid_value", "the rendered messages are too long");
        goto out;
    }
    *out = ids.p;
    *n_out = (uint32_t)ids.n;
    ids.p = NULL;
    rc = 0;
out:
    free(ids.p);
    free(r);
    return rc;
}

int kvf_server_chat_template_check(const char *tmpl, const kvf_tokenizer_t *tok, char *err,
                                   size_t err_len)
{
    static const struct kvf_chat_msg probe_user[] = {{"user", "Hello"}};
    struct kvf__srv_err e;
    int32_t *ids = NULL;
    uint32_t n = 0;
    /* One user message: the conversation every template must take (some refuse a system
     * message by raise_exception). */
    if (kvf__srv_chat_template_encode(tmpl, tok, probe_user, 1, &ids, &n, &e) < 0) {
        snprintf(err, err_len, "%s", e.message);
        return e.status == 503 ? -ENOMEM : -EINVAL;
    }
    free(ids);
    return 0;
}
