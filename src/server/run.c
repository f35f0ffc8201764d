/*
 * run.c — one request's generations: n submits, events turned into text and logprobs, and the
 * response (one JSON body, or SSE chunks).
 *
 * Text of one choice flows  token ─▶ kvf_detok (complete UTF-8 only) ─▶ hold ─▶ text.
 * `hold` keeps the shortest tail that could still be the start of a stop string; everything
 * before it is released to `text`. When a stop string appears in hold, the text before it is
 * released, the rest is dropped, and the generation is cancelled (ops->cancel, then release:
 * the engine ends it through its protocol). A stop string is valid UTF-8, so any tail equal to
 * a prefix of one begins on a character boundary: released text is always valid UTF-8.
 * Bounds: hold < KVF_SERVER_MAX_STOP_BYTES + KVF_DETOK_MAX_OUT bytes; matching a token is
 * O(n_stop × hold) work.
 *
 * Logprobs cover every token received, including the one that completed a stop string.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvfence/common.h"
#include "server_internal.h"

/* --- Logprobs. ------------------------------------------------------------------------------ */

/* The text of token `id` alone, as a fresh detokenizer gives it (a byte token that is part of
 * a longer character shows as U+FFFD). Works for every vocabulary type the tokenizer reads. */
static size_t token_bytes(const kvf_tokenizer_t *t, int32_t id, char *out, size_t cap)
{
    struct kvf_detok d;
    kvf_detok_init(&d);
    size_t k = kvf_detok_push(&d, t, id, out, cap);
    return k + kvf_detok_finish(&d, out + k, cap - k);
}

/* The name logprobs give token `id`: its text, or "token_id:<id>" when the request asked for
 * return_tokens_as_token_ids (as vLLM spells it; the text of a byte token that is part of a
 * longer character cannot be told apart otherwise). */
static size_t token_name(const struct kvf__srv_run *r, int32_t id, char *out, size_t cap)
{
    if (r->req.tokens_as_ids) {
        int k = snprintf(out, cap, "token_id:%d", (int)id);
        return k < 0 ? 0 : (size_t)k < cap ? (size_t)k : cap - 1;
    }
    return token_bytes(r->tok, id, out, cap);
}

static json_t *bytes_array(const char *b, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

static json_t *new_lp(enum kvf__srv_kind kind)
{
    if (kind == KVF__SRV_CHAT) return json_pack("{s:[]}", "content");
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

static size_t lp_count(const struct kvf__srv_run *r, const struct kvf__srv_choice *c)
{
    if (!c->lp) return 0;
    return json_array_size(
        json_object_get(c->lp, r->req.kind == KVF__SRV_CHAT ? "content" : "tokens"));
}

static void add_logprob(struct kvf__srv_run *r, struct kvf__srv_choice *c,
                        const struct kvf_gen_event *ev, uint64_t offset)
{
    if (!c->lp && !(c->lp = new_lp(r->req.kind))) return;
    char b[KVF_DETOK_MAX_OUT + 4];
    size_t n = token_name(r, ev->token, b, sizeof b);
    uint32_t n_top = ev->n_top < r->req.top_logprobs ? ev->n_top : r->req.top_logprobs;
    if (r->req.kind == KVF__SRV_CHAT) {
        json_t *top = json_array();
        for (uint32_t k = 0; top && k < n_top; k++) {
            char tb[KVF_DETOK_MAX_OUT + 4];
            size_t tn = token_name(r, ev->top_ids[k], tb, sizeof tb);
            json_array_append_new(
                top, json_pack("{s:o, s:f, s:o}", "token", kvf__srv_json_text(tb, tn), "logprob",
                               (double)ev->top_logprobs[k], "bytes", bytes_array(tb, tn)));
        }
        json_array_append_new(json_object_get(c->lp, "content"),
                              json_pack("{s:o, s:f, s:o, s:o}", "token", kvf__srv_json_text(b, n),
                                        "logprob", (double)ev->logprob, "bytes", bytes_array(b, n),
                                        "top_logprobs", top ? top : json_array()));
        return;
    }
    json_t *top = json_object();
    for (uint32_t k = 0; top && k < n_top; k++) {
        char tb[KVF_DETOK_MAX_OUT + 4];
        size_t tn = token_name(r, ev->top_ids[k], tb, sizeof tb);
        json_t *key = kvf__srv_json_text(tb, tn);
        if (key) json_object_set_new(top, json_string_value(key), json_real(ev->top_logprobs[k]));
        json_decref(key);
    }
    json_array_append_new(json_object_get(c->lp, "tokens"), kvf__srv_json_text(b, n));
    json_array_append_new(json_object_get(c->lp, "token_logprobs"), json_real(ev->logprob));
    json_array_append_new(json_object_get(c->lp, "top_logprobs"), top ? top : json_object());
    json_array_append_new(json_object_get(c->lp, "text_offset"), json_integer((json_int_t)offset));
}

/* --- Text and stop strings. ----------------------------------------------------------------- */

static void release_handle(struct kvf__srv_run *r, struct kvf__srv_choice *c, bool cancel)
{
    if (!c->g) return;
    if (cancel) r->ops->cancel(r->engine, c->g);
    r->ops->release(r->engine, c->g);
    c->g = NULL;
}

static void release_text(struct kvf__srv_choice *c, size_t m)
{
    kvf__sbuf_put(&c->text, c->hold, m);
    c->text_bytes += m;
    memmove(c->hold, c->hold + m, c->n_hold - m);
    c->n_hold -= m;
}

static void hold_append(struct kvf__srv_run *r, struct kvf__srv_choice *c, const char *s, size_t n)
{
    if (c->done) return;
    memcpy(c->hold + c->n_hold, s, n);
    c->n_hold += n;
    const struct kvf__srv_req *q = &r->req;
    size_t best = SIZE_MAX;
    for (uint32_t i = 0; i < q->n_stop; i++) {
        const char *p = memmem(c->hold, c->n_hold, q->stop[i], q->stop_len[i]);
        if (p && (size_t)(p - c->hold) < best) best = (size_t)(p - c->hold);
    }
    if (best != SIZE_MAX) {
        release_text(c, best);
        c->n_hold = 0;
        c->done = true;
        c->finish = "stop";
        release_handle(r, c, true);
        return;
    }
    size_t keep = 0;
    for (uint32_t i = 0; i < q->n_stop; i++) {
        size_t l = q->stop_len[i] - 1 < c->n_hold ? q->stop_len[i] - 1 : c->n_hold;
        for (; l > keep; l--)
            if (memcmp(c->hold + c->n_hold - l, q->stop[i], l) == 0) {
                keep = l;
                break;
            }
    }
    release_text(c, c->n_hold - keep);
}

static void handle_event(struct kvf__srv_run *r, struct kvf__srv_choice *c,
                         const struct kvf_gen_event *ev)
{
    char buf[KVF_DETOK_MAX_OUT];
    if (ev->kind == KVF_GEN_TOKEN) {
        if (c->n_tokens == 0 && !c->prov && r->ops->prov && c->g) {
            /* The decode worker recorded it before it pushed this first token. */
            c->prov = malloc(sizeof *c->prov);
            if (c->prov && r->ops->prov(r->engine, c->g, c->prov) != 1) {
                free(c->prov);
                c->prov = NULL;
            }
        }
        c->n_tokens++;
        if (!r->t_first_us) r->t_first_us = kvf__srv_now_us();
        uint64_t offset = c->text_bytes + c->n_hold;
        size_t k = kvf_detok_push(&c->detok, r->tok, ev->token, buf, sizeof buf);
        if (r->req.logprobs) add_logprob(r, c, ev, offset);
        hold_append(r, c, buf, k);
        return;
    }
    if (ev->err == 0) {
        size_t k = kvf_detok_finish(&c->detok, buf, sizeof buf);
        hold_append(r, c, buf, k);
        if (!c->done) {
            release_text(c, c->n_hold);
            c->done = true;
            c->finish = ev->stopped ? "stop" : "length";
        }
    } else if (!c->done) {
        c->done = true;
        c->err = ev->err;
        if (!r->failed) r->failed = ev->err;
    }
    release_handle(r, c, false);
}

/* --- The run. ------------------------------------------------------------------------------ */

int kvf__srv_run_start(const struct kvf_gen_ops *ops, void *engine, const kvf_tokenizer_t *tok,
                       struct kvf__srv_req *req, const char *model, uint32_t tenant,
                       struct kvf__srv_run **out)
{
    uint64_t rnd[2]; /* [0]: the completion id, [1]: the default seed */
    int rc = kvf__srv_random(rnd, sizeof rnd);
    if (rc < 0) return rc;
    struct kvf__srv_run *r = calloc(1, sizeof *r + req->n * sizeof r->ch[0]);
    if (!r) return -ENOMEM;
    r->ops = ops;
    r->engine = engine;
    r->tok = tok;
    r->model = model;
    r->n = req->n;
    r->created = (int64_t)time(NULL);
    r->t_start_us = kvf__srv_now_us();
    snprintf(r->id, sizeof r->id, "%s%016llx", req->kind == KVF__SRV_CHAT ? "chatcmpl-" : "cmpl-",
             (unsigned long long)rnd[0]);

    struct kvf_gen_params p;
    memset(&p, 0, sizeof p);
    p.tenant = tenant;
    p.prompt = req->prompt;
    p.n_prompt = req->n_prompt;
    p.max_tokens = req->max_tokens;
    p.sample = req->sample;
    p.n_logprobs = req->logprobs ? req->top_logprobs : 0;
    p.want_logprob = req->logprobs;
    p.ignore_eos = req->ignore_eos;
    p.grammar = req->grammar;
    p.n_grammar = req->n_grammar;
    /* Every end-of-generation token of the vocabulary ends a choice (as many as the seam
     * carries), unless ignore_eos. */
    const int32_t *eog;
    size_t n_eog = kvf_tokenizer_eog(tok, &eog);
    for (size_t i = 0; !req->ignore_eos && i < n_eog && i < KVF_GEN_MAX_STOP_IDS; i++)
        p.stop_ids[p.n_stop_ids++] = eog[i];
    uint64_t seed = req->seed_given ? req->sample.seed : rnd[1];
    for (uint32_t i = 0; i < r->n; i++) {
        kvf_detok_init(&r->ch[i].detok);
        p.sample.seed = seed + i;
        rc = ops->submit(engine, &p, &r->ch[i].g);
        if (rc < 0) {
            r->ch[i].g = NULL;
            for (uint32_t k = 0; k < i; k++)
                release_handle(r, &r->ch[k], true);
            free(r);
            return rc;
        }
    }
    r->req = *req;
    memset(req, 0, sizeof *req);
    *out = r;
    return 0;
}

bool kvf__srv_run_done(const struct kvf__srv_run *r)
{
    for (uint32_t i = 0; i < r->n; i++)
        if (!r->ch[i].done) return false;
    return true;
}

static void fail_choice(struct kvf__srv_run *r, struct kvf__srv_choice *c, int err)
{
    c->done = true;
    c->err = err;
    if (!r->failed) r->failed = err;
    release_handle(r, c, true);
}

int kvf__srv_run_step(struct kvf__srv_run *r, int timeout_ms)
{
    int progress = 0;
    uint32_t n_active = 0;
    struct kvf__srv_choice *first = NULL;
    struct kvf_gen_event ev;
    /* Everything ready now, bounded per choice so one fast choice cannot starve the others. */
    for (uint32_t i = 0; i < r->n; i++) {
        struct kvf__srv_choice *c = &r->ch[i];
        for (int k = 0; k < 64 && c->g && !c->done; k++) {
            int rc = r->ops->next(r->engine, c->g, &ev, 0);
            if (rc == 0) break;
            if (rc < 0)
                fail_choice(r, c, rc);
            else
                handle_event(r, c, &ev);
            progress = 1;
        }
        if (c->g && !c->done && !first) first = c;
        n_active += c->g && !c->done;
    }
    if (progress || !first || timeout_ms == 0) return progress;
    /* Nothing ready: wait on one choice; with several, briefly, so the others are seen soon. */
    int t = n_active == 1 || timeout_ms < 2 ? timeout_ms : 2;
    int rc = r->ops->next(r->engine, first->g, &ev, t);
    if (rc == 0) return 0;
    if (rc < 0)
        fail_choice(r, first, rc);
    else
        handle_event(r, first, &ev);
    return 1;
}

void kvf__srv_run_cancel(struct kvf__srv_run *r)
{
    r->cancelled = true;
    for (uint32_t i = 0; i < r->n; i++)
        release_handle(r, &r->ch[i], true);
}

void kvf__srv_run_free(struct kvf__srv_run *r)
{
    if (!r) return;
    kvf__srv_run_cancel(r);
    for (uint32_t i = 0; i < r->n; i++) {
        kvf__sbuf_free(&r->ch[i].text);
        json_decref(r->ch[i].lp);
        free(r->ch[i].prov);
    }
    kvf__srv_req_free(&r->req);
    free(r);
}

void kvf__srv_run_error(const struct kvf__srv_run *r, struct kvf__srv_err *e)
{
    kvf__srv_engine_error(r->failed, e);
}

/* --- Output. --------------------------------------------------------------------------------- */

static json_t *usage(const struct kvf__srv_run *r)
{
    uint64_t gen = 0;
    for (uint32_t i = 0; i < r->n; i++)
        gen += r->ch[i].n_tokens;
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)r->req.n_prompt,
                     "completion_tokens", (json_int_t)gen, "total_tokens",
                     (json_int_t)(r->req.n_prompt + gen));
}

static json_t *text_of(const struct kvf__srv_choice *c)
{
    return kvf__srv_json_text(c->text.p ? c->text.p : "", c->text.n);
}

static json_t *lp_of(struct kvf__srv_run *r, struct kvf__srv_choice *c)
{
    if (!r->req.logprobs) return json_null();
    if (!c->lp) c->lp = new_lp(r->req.kind);
    return json_incref(c->lp);
}

json_t *kvf__srv_run_response(struct kvf__srv_run *r)
{
    bool chat = r->req.kind == KVF__SRV_CHAT;
    json_t *choices = json_array();
    for (uint32_t i = 0; choices && i < r->n; i++) {
        struct kvf__srv_choice *c = &r->ch[i];
        json_t *ch;
        if (chat)
            ch = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s?}", "index", (int)i, "message", "role",
                           "assistant", "content", text_of(c), "logprobs", lp_of(r, c),
                           "finish_reason", c->finish);
        else
            ch = json_pack("{s:i, s:o, s:o, s:s?}", "index", (int)i, "text", text_of(c), "logprobs",
                           lp_of(r, c), "finish_reason", c->finish);
        if (!ch || json_array_append_new(choices, ch) < 0) {
            json_decref(choices);
            return NULL;
        }
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:s?, s:o, s:o}", "id", r->id, "object",
                     chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)r->created, "model", r->model, "system_fingerprint",
                     r->fingerprint, "choices", choices, "usage", usage(r));
}

void kvf__srv_sse_put(struct kvf__sbuf *out, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        out->oom = true;
        return;
    }
    kvf__sbuf_puts(out, "data: ");
    kvf__sbuf_puts(out, s);
    kvf__sbuf_puts(out, "\n\n");
    free(s);
}

static json_t *chunk(const struct kvf__srv_run *r, json_t *choices)
{
    bool chat = r->req.kind == KVF__SRV_CHAT;
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:s?, s:o}", "id", r->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)r->created, "model", r->model, "system_fingerprint",
                          r->fingerprint, "choices", choices);
    if (j && r->req.include_usage) json_object_set_new(j, "usage", json_null());
    return j;
}

bool kvf__srv_run_sse(struct kvf__srv_run *r, struct kvf__sbuf *out)
{
    if (r->sse_done) return true;
    if (r->failed) {
        struct kvf__srv_err e;
        kvf__srv_run_error(r, &e);
        kvf__srv_sse_put(out, kvf__srv_err_json(&e));
        r->sse_done = true;
        return true;
    }
    bool chat = r->req.kind == KVF__SRV_CHAT;
    bool all_sent = true;
    for (uint32_t i = 0; i < r->n; i++) {
        struct kvf__srv_choice *c = &r->ch[i];
        bool fin = c->done && !c->finish_sent;
        if (c->text.n == 0 && lp_count(r, c) == 0 && !fin && (!chat || c->role_sent)) {
            all_sent &= c->finish_sent;
            continue;
        }
        json_t *ch;
        if (chat) {
            json_t *delta = json_object();
            if (delta && !c->role_sent)
                json_object_set_new(delta, "role", json_string("assistant"));
            if (delta && (c->text.n || !c->role_sent))
                json_object_set_new(delta, "content", text_of(c));
            ch = json_pack("{s:i, s:o, s:o, s:s?}", "index", (int)i, "delta", delta, "logprobs",
                           r->req.logprobs && lp_count(r, c) ? json_incref(c->lp) : json_null(),
                           "finish_reason", fin ? c->finish : NULL);
            c->role_sent = true;
        } else {
            ch = json_pack("{s:i, s:o, s:o, s:s?}", "index", (int)i, "text", text_of(c), "logprobs",
                           r->req.logprobs && lp_count(r, c) ? json_incref(c->lp) : json_null(),
                           "finish_reason", fin ? c->finish : NULL);
        }
        kvf__srv_sse_put(out, chunk(r, json_pack("[o]", ch)));
        c->text.n = 0;
        json_decref(c->lp);
        c->lp = NULL;
        if (fin) c->finish_sent = true;
        all_sent &= c->finish_sent;
    }
    if (!all_sent) return false;
    if (r->req.include_usage) {
        json_t *j = chunk(r, json_array());
        if (j) json_object_set_new(j, "usage", usage(r));
        kvf__srv_sse_put(out, j);
    }
    if (r->want_prov) {
        /* An SSE comment: clients that do not look for it skip it (docs/SERVER.md). */
        json_t *j = kvf__srv_run_prov(r, true);
        char *p = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        kvf__sbuf_puts(out, ": kvfence-provenance ");
        kvf__sbuf_puts(out, p ? p : "null");
        kvf__sbuf_puts(out, "\n\n");
        free(p);
    }
    kvf__sbuf_puts(out, "data: [DONE]\n\n");
    r->sse_done = true;
    return true;
}

json_t *kvf__srv_run_prov(const struct kvf__srv_run *r, bool with_pages)
{
    json_t *arr = json_array();
    for (uint32_t i = 0; arr && i < r->n; i++) {
        const struct kvf__srv_choice *c = &r->ch[i];
        json_t *o = c->prov ? kvf__srv_prov_json(c->prov, with_pages) : json_object();
        if (o) json_object_set_new(o, "index", json_integer(i));
        json_array_append_new(arr, o);
    }
    return json_pack("{s:s, s:o}", "id", r->id, "choices", arr ? arr : json_array());
}
