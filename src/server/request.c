/*
 * request.c — a completions or chat body, from bytes to a validated, tokenized request.
 *
 * Order: scan (UTF-8, depth) → jansson → each known field by name, each with its type and range
 * → the prompt (tokenized, or token ids checked against the vocabulary) → max_tokens against
 * the served limit. Unknown fields are ignored; a known field of the wrong type is refused
 * with 400 naming it (BAD_INPUTS rows 9–18). A field the OpenAI API or vLLM defines that
 * kvfence does not implement is refused with 400 naming it (code "unsupported_field") unless
 * it holds the value that asks for nothing (refused_fields below; docs/API_FIELDS.md lists
 * every field). Every check happens before anything is submitted.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/limits.h"
#include "kvfence/grammar.h"
#include "server_internal.h"

_Static_assert(KVF_LIMIT_LOGPROBS_MAX <= KVF_GEN_MAX_LOGPROBS,
               "the engine returns every top logprob the API may ask for");

json_t *kvf__srv_parse_object(const char *body, size_t len, struct kvf__srv_err *e)
{
    if (kvf__srv_scan_body(body, len, KVF_SERVER_MAX_JSON_DEPTH, e) < 0) return NULL;
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root) {
        /* jansson's text ends with "near '<the input there>'": cut it, so no part of a body
         * comes back in an error (BAD_INPUTS row 8). */
        char *near = strstr(je.text, " near ");
        if (near) *near = 0;
        kvf__srv_fail(e, 400, NULL, "invalid_json",
                      "request body is not valid JSON: %s (byte offset %d)", je.text, je.position);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        kvf__srv_fail(e, 400, NULL, "invalid_json", "request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* --- Typed field readers: absent or null leaves *out as it is and returns 0. ---------------- */

static int get_bool(json_t *o, const char *key, bool *out, struct kvf__srv_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return kvf__srv_fail(e, 400, key, "invalid_type", "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* An integer in [lo, hi]; a real (even 5.0), a boolean or a string is a wrong type. Returns 1
 * when present. */
static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out,
                   struct kvf__srv_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v))
        return kvf__srv_fail(e, 400, key, "invalid_type", "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return kvf__srv_fail(e, 400, key, "invalid_value", "'%s' must be between %lld and %lld",
                             key, lo, hi);
    *out = x;
    return 1;
}

/* A real field of kvfence/limits.h's table, within its range (the codec's too). */
static int get_real_field(json_t *o, enum kvf_field f, double *out, struct kvf__srv_err *e)
{
    const struct kvf_field_limit *l = &kvf_field_limits[f];
    json_t *v = json_object_get(o, l->name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return kvf__srv_fail(e, 400, l->name, "invalid_type", "'%s' must be a number", l->name);
    *out = json_number_value(v);
    if (!kvf_field_real_ok(f, *out, false))
        return kvf__srv_fail(e, 400, l->name, "invalid_value", "'%s' must be in %c%g, %g]", l->name,
                             l->lo_open ? '(' : '[', l->lo, l->hi);
    return 1;
}

/* An integer field of the table, under the API name key (logprobs: also top_logprobs). */
static int get_int_field(json_t *o, const char *key, enum kvf_field f, long long *out,
                         struct kvf__srv_err *e)
{
    const struct kvf_field_limit *l = &kvf_field_limits[f];
    long long hi = l->ihi > (uint64_t)INT64_MAX ? INT64_MAX : (long long)l->ihi;
    return get_int(o, key, l->ilo, hi, out, e);
}

/* --- Fields kvfence does not implement. ------------------------------------------------------ */

#define K_CMPL (1u << KVF__SRV_COMPLETION)
#define K_CHAT (1u << KVF__SRV_CHAT)
#define K_BOTH (K_CMPL | K_CHAT)

/* Each field the OpenAI API or vLLM defines on completions or chat that kvfence does not
 * implement, on the endpoints that define it, with the JSON value that asks for nothing (the
 * API's default; NULL: none but null). Present with any other value, the request is refused:
 * answering it without doing what it asks would be a silent lie. docs/API_FIELDS.md is the same
 * list, and test_api_fields checks the server against it. */
static const struct refused_field {
    const char *name;
    unsigned kinds;
    const char *neutral;
} refused_fields[] = {
    {"echo", K_BOTH, "false"},
    {"suffix", K_CMPL, "\"\""},
    {"tools", K_CHAT, "[]"},
    {"tool_choice", K_CHAT, "\"none\""},
    {"parallel_tool_calls", K_CHAT, NULL},
    {"functions", K_CHAT, "[]"},
    {"function_call", K_CHAT, "\"none\""},
    {"audio", K_CHAT, NULL},
    {"modalities", K_CHAT, "[\"text\"]"},
    {"prediction", K_CHAT, NULL},
    {"reasoning_effort", K_CHAT, NULL},
    {"verbosity", K_CHAT, NULL},
    {"web_search_options", K_CHAT, NULL},
    {"store", K_CHAT, "false"},
    {"guided_json", K_BOTH, NULL},
    {"guided_regex", K_BOTH, NULL},
    {"guided_choice", K_BOTH, NULL},
    {"guided_grammar", K_BOTH, NULL},
    {"guided_decoding_backend", K_BOTH, NULL},
    {"guided_whitespace_pattern", K_BOTH, NULL},
    {"structured_outputs", K_BOTH, NULL},
    {"use_beam_search", K_BOTH, "false"},
    {"length_penalty", K_BOTH, "1"},
    {"stop_token_ids", K_BOTH, "[]"},
    {"include_stop_str_in_output", K_BOTH, "false"},
    {"min_tokens", K_BOTH, "0"},
    {"skip_special_tokens", K_BOTH, "true"},
    {"spaces_between_special_tokens", K_BOTH, "true"},
    {"truncate_prompt_tokens", K_BOTH, NULL},
    {"allowed_token_ids", K_BOTH, NULL},
    {"bad_words", K_BOTH, "[]"},
    {"prompt_logprobs", K_BOTH, NULL},
    {"logits_processors", K_BOTH, NULL},
    {"return_token_ids", K_BOTH, "false"},
    {"prompt_embeds", K_CMPL, NULL},
    {"add_special_tokens", K_CMPL, "true"},
    {"add_special_tokens", K_CHAT, "false"},
    {"add_generation_prompt", K_CHAT, "true"},
    {"continue_final_message", K_CHAT, "false"},
    {"documents", K_CHAT, NULL},
    {"chat_template", K_CHAT, NULL},
    {"chat_template_kwargs", K_CHAT, NULL},
    {"mm_processor_kwargs", K_BOTH, NULL},
    {"priority", K_BOTH, "0"},
    {"cache_salt", K_BOTH, NULL},
    {"kv_transfer_params", K_BOTH, NULL},
    {"vllm_xargs", K_BOTH, NULL},
};

/* Work: one lookup per table row (about 50). */
static int check_refused(enum kvf__srv_kind kind, json_t *root, struct kvf__srv_err *e)
{
    for (size_t i = 0; i < sizeof refused_fields / sizeof refused_fields[0]; i++) {
        const struct refused_field *f = &refused_fields[i];
        if (!(f->kinds & (1u << kind))) continue;
        json_t *v = json_object_get(root, f->name);
        if (!v || json_is_null(v)) continue;
        if (f->neutral) {
            json_t *n = json_loads(f->neutral, JSON_DECODE_ANY, NULL);
            /* A number compares by value: 1 and 1.0 ask for the same. */
            bool same = n && (json_equal(v, n) || (json_is_number(v) && json_is_number(n) &&
                                                   json_number_value(v) == json_number_value(n)));
            json_decref(n);
            if (same) continue;
        }
        return kvf__srv_fail(e, 400, f->name, "unsupported_field",
                             "'%s' is not supported by this server%s%s", f->name,
                             f->neutral ? "; the only value accepted is " : "",
                             f->neutral ? f->neutral : "");
    }
    return 0;
}

/* "model": a string; with served model names, one of them (404 model_not_found, as OpenAI
 * answers a model it does not serve). */
static int check_model(json_t *root, const struct kvf__srv_limits *lim, struct kvf__srv_err *e)
{
    json_t *m = json_object_get(root, "model");
    if (!m || json_is_null(m)) return 0;
    if (!json_is_string(m))
        return kvf__srv_fail(e, 400, "model", "invalid_type", "'model' must be a string");
    for (size_t i = 0; i < lim->n_model_names; i++)
        if (strcmp(json_string_value(m), lim->model_names[i]) == 0) return 0;
    if (!lim->n_model_names) return 0;
    return kvf__srv_fail(e, 404, "model", "model_not_found",
                         "The model '%.100s' does not exist; this server serves '%.100s'",
                         json_string_value(m), lim->model_names[0]);
}

/* logit_bias: {"<token id>": bias, ...}, ids in canonical decimal below n_vocab, biases in
 * [-100, 100], at most KVF_GEN_MAX_LOGIT_BIAS; kept sorted by id. Work: O(n log n). */
static int bias_cmp(const void *a, const void *b)
{
    const struct kvf_logit_bias *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int parse_logit_bias(json_t *root, const struct kvf__srv_limits *lim,
                            struct kvf_sample_params *sp, struct kvf__srv_err *e)
{
    json_t *o = json_object_get(root, "logit_bias");
    if (!o || json_is_null(o)) return 0;
    if (!json_is_object(o))
        return kvf__srv_fail(e, 400, "logit_bias", "invalid_type",
                             "'logit_bias' must be an object mapping token ids to biases");
    if (json_object_size(o) > KVF_GEN_MAX_LOGIT_BIAS)
        return kvf__srv_fail(e, 400, "logit_bias", "invalid_value",
                             "'logit_bias' has %zu entries; at most %d are allowed",
                             json_object_size(o), KVF_GEN_MAX_LOGIT_BIAS);
    const char *key;
    json_t *v;
    uint32_t n = 0;
    json_object_foreach(o, key, v)
    {
        size_t kl = strlen(key);
        bool digits = kl > 0 && kl <= 10 && (key[0] != '0' || kl == 1);
        for (size_t i = 0; digits && i < kl; i++)
            digits = key[i] >= '0' && key[i] <= '9';
        unsigned long long id = digits ? strtoull(key, NULL, 10) : 0;
        if (!digits || id >= lim->n_vocab)
            return kvf__srv_fail(e, 400, "logit_bias", "invalid_value",
                                 "'logit_bias' keys must be token ids (the vocabulary has %u)",
                                 lim->n_vocab);
        if (!json_is_number(v))
            return kvf__srv_fail(e, 400, "logit_bias", "invalid_type",
                                 "'logit_bias' values must be numbers");
        double b = json_number_value(v);
        if (!(b >= -KVF_LIMIT_LOGIT_BIAS_MAX && b <= KVF_LIMIT_LOGIT_BIAS_MAX))
            return kvf__srv_fail(e, 400, "logit_bias", "invalid_value",
                                 "'logit_bias' values must be in [-100, 100]");
        sp->logit_bias[n++] = (struct kvf_logit_bias){(int32_t)id, (float)b};
    }
    qsort(sp->logit_bias, n, sizeof sp->logit_bias[0], bias_cmp);
    sp->n_logit_bias = n;
    return 0;
}

/* --- The prompt. ------------------------------------------------------------------------- */

/* Tokenizes text (BOS first when the vocabulary asks for it). At most cap tokens are kept; the
 * full count is returned in *n_total so the caller can state it. */
static int tokenize(const kvf_tokenizer_t *tok, const char *text, size_t len, const char *param,
                    uint32_t cap, int32_t **out, uint32_t *n_total, struct kvf__srv_err *e)
{
    bool bos = kvf_tokenizer_wants_bos(tok);
    int32_t *ids = malloc(((size_t)cap + 1) * sizeof *ids);
    if (!ids) return kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
    int n = kvf_tokenizer_encode(tok, text, len, bos, ids, cap);
    if (n < 0) {
        free(ids);
        if (n == -EILSEQ)
            return kvf__srv_fail(e, 400, param, "invalid_utf8", "'%s' is not valid UTF-8", param);
        if (n == -ENOMEM) return kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
        return kvf__srv_fail(e, 400, param, "invalid_value", "'%s' cannot be tokenized", param);
    }
    *out = ids;
    *n_total = (uint32_t)n;
    return 0;
}

static int parse_token_ids(json_t *arr, const char *param, const struct kvf__srv_limits *lim,
                           int32_t **out, uint32_t *n_out, struct kvf__srv_err *e)
{
    size_t n = json_array_size(arr);
    if (n == 0)
        return kvf__srv_fail(e, 400, param, "invalid_value", "'%s' must not be empty", param);
    if (n > UINT32_MAX / 2)
        return kvf__srv_fail(e, 400, param, "invalid_value", "'%s' is too long", param);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v)) {
            free(ids);
            return kvf__srv_fail(e, 400, param, "invalid_type",
                                 "'%s' must be a string or an array of integer token ids "
                                 "(element %zu is not an integer)",
                                 param, i);
        }
        long long t = json_integer_value(v);
        if (t < 0 || t >= (long long)lim->n_vocab) {
            free(ids);
            return kvf__srv_fail(e, 400, param, "invalid_token",
                                 "'%s' element %zu is not a token id (the vocabulary has %u)",
                                 param, i, lim->n_vocab);
        }
        ids[i] = (int32_t)t;
    }
    *out = ids;
    *n_out = (uint32_t)n;
    return 0;
}

static bool role_known(const char *r)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(r, roles[i]) == 0) return true;
    return false;
}

/* A message's content: a string, or an array of {"type":"text","text":...} parts joined.
 * *owned is set when the text had to be joined (the caller frees it). */
static int message_content(json_t *c, size_t i, const char **text, size_t *len, char **owned,
                           struct kvf__srv_err *e)
{
    *owned = NULL;
    if (json_is_string(c)) {
        *text = json_string_value(c);
        *len = json_string_length(c);
        return 0;
    }
    if (!c || json_is_null(c))
        return kvf__srv_fail(e, 400, "messages", "invalid_value", "messages[%zu] has no content",
                             i);
    if (!json_is_array(c))
        return kvf__srv_fail(e, 400, "messages", "invalid_type",
                             "messages[%zu].content must be a string or an array of text parts", i);
    struct kvf__sbuf b = {0};
    size_t k;
    json_t *part;
    json_array_foreach(c, k, part)
    {
        json_t *type = json_object_get(part, "type"), *t = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(t)) {
            kvf__sbuf_free(&b);
            return kvf__srv_fail(e, 400, "messages", "invalid_value",
                                 "messages[%zu].content[%zu] must be a text part", i, k);
        }
        kvf__sbuf_put(&b, json_string_value(t), json_string_length(t));
    }
    if (b.oom) {
        kvf__sbuf_free(&b);
        return kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
    }
    *owned = b.p;
    *text = b.p ? b.p : "";
    *len = b.n;
    return 0;
}

/* The messages, validated, then rendered: with the model's chat template (lim->chat_template:
 * straight to tokens in *ids) or the default rendering (text in *out, tokenized by the caller). */
static int render_messages(json_t *root, const struct kvf__srv_limits *lim,
                           const kvf_tokenizer_t *tok, char **out, size_t *out_len, int32_t **ids,
                           uint32_t *n_ids, struct kvf__srv_err *e)
{
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs || json_is_null(msgs))
        return kvf__srv_fail(e, 400, "messages", "missing", "'messages' is required");
    if (!json_is_array(msgs))
        return kvf__srv_fail(e, 400, "messages", "invalid_type", "'messages' must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return kvf__srv_fail(e, 400, "messages", "invalid_value", "'messages' is empty");
    struct kvf_server_chat_msg *m = calloc(n, sizeof *m);
    struct kvf_chat_msg *tm = calloc(n, sizeof *tm);
    char **owned = calloc(n, sizeof *owned);
    int rc = -1;
    if (!m || !tm || !owned) {
        kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
        goto free_all;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(msgs, i);
        if (!json_is_object(msg)) {
            kvf__srv_fail(e, 400, "messages", "invalid_type", "messages[%zu] must be an object", i);
            goto free_all;
        }
        json_t *role = json_object_get(msg, "role");
        if (!json_is_string(role)) {
            kvf__srv_fail(e, 400, "messages", "invalid_value", "messages[%zu] has no role", i);
            goto free_all;
        }
        if (!role_known(json_string_value(role))) {
            kvf__srv_fail(e, 400, "messages", "invalid_value",
                          "messages[%zu].role is not one of system, developer, user, "
                          "assistant, tool",
                          i);
            goto free_all;
        }
        m[i].role = json_string_value(role);
        if (message_content(json_object_get(msg, "content"), i, &m[i].content, &m[i].content_len,
                            &owned[i], e) < 0)
            goto free_all;
    }
    if (lim->chat_template) {
        for (size_t i = 0; i < n; i++)
            tm[i] = (struct kvf_chat_msg){m[i].role, m[i].content};
        rc = kvf__srv_chat_template_encode(lim->chat_template, tok, tm, n, ids, n_ids, e);
        goto free_all;
    }
    if (kvf_server_chat_render(m, n, out, out_len) < 0) {
        kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
        goto free_all;
    }
    rc = 0;
free_all:
    if (owned)
        for (size_t i = 0; i < n; i++)
            free(owned[i]);
    free(owned);
    free(tm);
    free(m);
    return rc;
}

int kvf__srv_chat_tokens(json_t *root, const struct kvf__srv_limits *lim,
                         const kvf_tokenizer_t *tok, uint32_t cap, int32_t **ids, uint32_t *n,
                         struct kvf__srv_err *e)
{
    char *text = NULL;
    size_t len = 0;
    if (render_messages(root, lim, tok, &text, &len, ids, n, e) < 0) return -1;
    if (!text) return 0; /* the chat template gave the tokens */
    int rc = tokenize(tok, text, len, "messages", cap, ids, n, e);
    free(text);
    return rc;
}

static int parse_prompt(enum kvf__srv_kind kind, json_t *root, const struct kvf__srv_limits *lim,
                        const kvf_tokenizer_t *tok, struct kvf__srv_req *r, uint32_t *n_total,
                        struct kvf__srv_err *e)
{
    uint32_t cap = lim->served_limit; /* more tokens than this is refused anyway */
    if (kind == KVF__SRV_CHAT)
        return kvf__srv_chat_tokens(root, lim, tok, cap, &r->prompt, n_total, e);
    json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p))
        return kvf__srv_fail(e, 400, "prompt", "missing", "'prompt' is required");
    if (json_is_string(p)) {
        if (json_string_length(p) == 0)
            return kvf__srv_fail(e, 400, "prompt", "invalid_value", "'prompt' is empty");
        return tokenize(tok, json_string_value(p), json_string_length(p), "prompt", cap, &r->prompt,
                        n_total, e);
    }
    if (json_is_array(p)) {
        if (parse_token_ids(p, "prompt", lim, &r->prompt, n_total, e) < 0) return -1;
        return 0;
    }
    return kvf__srv_fail(e, 400, "prompt", "invalid_type",
                         "'prompt' must be a string or an array of integer token ids");
}

static int parse_stop(json_t *root, struct kvf__srv_req *r, struct kvf__srv_err *e)
{
    json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s)) return 0;
    json_t *one[1] = {s};
    json_t **items = one;
    size_t n = 1;
    json_t *arr_items[KVF_SERVER_MAX_STOP];
    if (json_is_array(s)) {
        n = json_array_size(s);
        if (n > KVF_SERVER_MAX_STOP)
            return kvf__srv_fail(e, 400, "stop", "invalid_value",
                                 "'stop' has %zu strings; at most %d are allowed", n,
                                 KVF_SERVER_MAX_STOP);
        for (size_t i = 0; i < n; i++)
            arr_items[i] = json_array_get(s, i);
        items = arr_items;
    }
    for (size_t i = 0; i < n; i++) {
        if (!json_is_string(items[i]))
            return kvf__srv_fail(e, 400, "stop", "invalid_type",
                                 "'stop' must be a string or an array of strings");
        size_t len = json_string_length(items[i]);
        if (len == 0)
            return kvf__srv_fail(e, 400, "stop", "invalid_value",
                                 "'stop' strings must not be empty");
        if (len > KVF_SERVER_MAX_STOP_BYTES)
            return kvf__srv_fail(e, 400, "stop", "invalid_value",
                                 "'stop' strings must be at most %d bytes (one has %zu)",
                                 KVF_SERVER_MAX_STOP_BYTES, len);
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = json_string_length(items[i]);
        char *c = malloc(len + 1);
        if (!c) return kvf__srv_fail(e, 503, NULL, "out_of_memory", "out of memory");
        memcpy(c, json_string_value(items[i]), len + 1);
        r->stop[r->n_stop] = c;
        r->stop_len[r->n_stop++] = len;
    }
    return 0;
}

static int parse_options(enum kvf__srv_kind kind, json_t *root, const struct kvf__srv_limits *lim,
                         struct kvf__srv_req *r, struct kvf__srv_err *e)
{
    long long x;
    double d = 0;
    if (get_bool(root, "stream", &r->stream, e) < 0) return -1;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return kvf__srv_fail(e, 400, "stream_options", "invalid_type",
                                 "'stream_options' must be an object");
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu) && !json_is_boolean(iu))
            return kvf__srv_fail(e, 400, "stream_options", "invalid_type",
                                 "'stream_options.include_usage' must be a boolean");
        r->include_usage = json_is_true(iu);
    }
    /* The sampling fields, each within its range in kvfence/limits.h, carried as the codec
     * carries them (f32; see there for the rounding). */
    r->sample.temperature = 1.0f;
    int have = get_real_field(root, KVF_FIELD_TEMPERATURE, &d, e);
    if (have < 0) return -1;
    if (have) r->sample.temperature = (float)d;
    r->sample.top_p = 1.0f;
    have = get_real_field(root, KVF_FIELD_TOP_P, &d, e);
    if (have < 0) return -1;
    if (have) r->sample.top_p = (float)d > FLT_MIN ? (float)d : FLT_MIN;
    if ((have = get_int_field(root, "top_k", KVF_FIELD_TOP_K, &x, e)) < 0) return -1;
    if (have) r->sample.top_k = x < 0 ? 0 : (uint32_t)x; /* -1: off, as vLLM reads it */
    if ((have = get_real_field(root, KVF_FIELD_MIN_P, &d, e)) < 0) return -1;
    if (have) r->sample.min_p = (float)d;
    if ((have = get_real_field(root, KVF_FIELD_PRESENCE_PENALTY, &d, e)) < 0) return -1;
    if (have) r->sample.presence_penalty = (float)d;
    if ((have = get_real_field(root, KVF_FIELD_FREQUENCY_PENALTY, &d, e)) < 0) return -1;
    if (have) r->sample.frequency_penalty = (float)d;
    /* A positive repetition_penalty below the smallest normal f32 is carried as that, never as
     * 0 (which the wire reads as off). */
    if ((have = get_real_field(root, KVF_FIELD_REPETITION_PENALTY, &d, e)) < 0) return -1;
    if (have) r->sample.repetition_penalty = (float)d > FLT_MIN ? (float)d : FLT_MIN;
    if (parse_logit_bias(root, lim, &r->sample, e) < 0) return -1;
    if ((have = get_int_field(root, "seed", KVF_FIELD_SEED, &x, e)) < 0) return -1;
    if (have) {
        r->sample.seed = (uint64_t)x;
        r->seed_given = true;
    }
    r->n = 1;
    if ((have = get_int(root, "n", 1, lim->max_n, &x, e)) < 0) return -1;
    if (have) r->n = (uint32_t)x;
    if ((have = get_int(root, "best_of", 1, lim->max_n, &x, e)) < 0) return -1;
    if (have && (uint32_t)x != r->n)
        return kvf__srv_fail(e, 400, "best_of", "invalid_value",
                             "'best_of' must equal 'n' (choices are not ranked)");
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) < 0) return -1;
    if (get_bool(root, "return_tokens_as_token_ids", &r->tokens_as_ids, e) < 0) return -1;
    if (parse_stop(root, r, e) < 0) return -1;
    if (kind == KVF__SRV_COMPLETION) {
        if ((have = get_int_field(root, "logprobs", KVF_FIELD_LOGPROBS, &x, e)) < 0) return -1;
        if (have) {
            r->logprobs = true;
            r->top_logprobs = (uint32_t)x;
        }
    } else {
        if (get_bool(root, "logprobs", &r->logprobs, e) < 0) return -1;
        if ((have = get_int_field(root, "top_logprobs", KVF_FIELD_LOGPROBS, &x, e)) < 0) return -1;
        if (have) {
            if (!r->logprobs && x > 0)
                return kvf__srv_fail(e, 400, "top_logprobs", "invalid_value",
                                     "'top_logprobs' needs 'logprobs' set to true");
            r->top_logprobs = (uint32_t)x;
        }
    }
    return 0;
}

/* max_tokens (chat: max_completion_tokens first), against the served limit. */
/* response_format and grammar: the GBNF text the output must match (r->grammar, owned), checked
 * by compiling it here, so that a request the engine would refuse is a 400 naming the field. */
static int parse_structured(json_t *root, struct kvf__srv_req *r, struct kvf__srv_err *e)
{
    json_t *rf = json_object_get(root, "response_format");
    json_t *gr = json_object_get(root, "grammar");
    if (rf && json_is_null(rf)) rf = NULL;
    if (gr && json_is_null(gr)) gr = NULL;
    const char *param = NULL;
    char err[256] = "";
    int n = 0;
    if (!rf && !gr) return 0;
    char *text = malloc(KVF_GRAMMAR_MAX_BYTES + 1);
    if (!text) return kvf__srv_fail(e, 500, NULL, "internal_error", "out of memory");
    if (rf) {
        param = "response_format";
        json_t *ty = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        const char *t = json_is_string(ty) ? json_string_value(ty) : NULL;
        if (!t) {
            free(text);
            return kvf__srv_fail(e, 400, param, "invalid_type",
                                 "'response_format' must be an object with a string 'type'");
        }
        if (strcmp(t, "text") == 0) {
            rf = NULL;
        } else if (strcmp(t, "json_object") == 0) {
            n = kvf__srv_json_grammar(NULL, text, KVF_GRAMMAR_MAX_BYTES + 1, err, sizeof err);
        } else if (strcmp(t, "json_schema") == 0) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *sc = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            json_t *st = json_is_object(js) ? json_object_get(js, "strict") : NULL;
            if (!sc || (st && !json_is_null(st) && !json_is_boolean(st))) {
                free(text);
                return kvf__srv_fail(e, 400, param, "invalid_value",
                                     "'response_format' json_schema needs 'json_schema': "
                                     "{\"name\", \"schema\": {...}, \"strict\": bool}");
            }
            n = kvf__srv_json_grammar(sc, text, KVF_GRAMMAR_MAX_BYTES + 1, err, sizeof err);
        } else {
            free(text);
            return kvf__srv_fail(e, 400, param, "invalid_value",
                                 "'response_format' type '%.40s' is not one of text, json_object, "
                                 "json_schema",
                                 t);
        }
    }
    if (gr) {
        if (rf) {
            free(text);
            return kvf__srv_fail(e, 400, "grammar", "invalid_value",
                                 "'grammar' and a JSON 'response_format' cannot be combined");
        }
        if (!json_is_string(gr)) {
            free(text);
            return kvf__srv_fail(e, 400, "grammar", "invalid_type",
                                 "'grammar' must be a string (GBNF)");
        }
        param = "grammar";
        size_t len = json_string_length(gr);
        if (len > KVF_GRAMMAR_MAX_BYTES) {
            free(text);
            return kvf__srv_fail(e, 400, param, "invalid_value",
                                 "'grammar' has %zu bytes; at most %d are allowed", len,
                                 KVF_GRAMMAR_MAX_BYTES);
        }
        memcpy(text, json_string_value(gr), len);
        text[len] = 0;
        n = (int)len;
    }
    if (!rf && !gr) {
        free(text);
        return 0;
    }
    if (n < 0) {
        free(text);
        if (n == -ENOMEM) return kvf__srv_fail(e, 500, NULL, "internal_error", "out of memory");
        return kvf__srv_fail(e, 400, param, "invalid_value", "%s", err);
    }
    kvf_grammar_t *g = NULL;
    int rc = kvf_grammar_compile(text, (size_t)n, &g, err, sizeof err);
    bool empty_only = false;
    if (rc == 0) {
        /* The first token is drawn before any stop may come: a grammar whose only sentence
         * is empty cannot be served. */
        struct kvf_grammar_state *st = malloc(sizeof *st);
        if (st) {
            kvf_grammar_state_init(g, st);
            empty_only = st->n == 1;
            free(st);
        }
    }
    kvf_grammar_free(g);
    if (rc == 0 && empty_only)
        snprintf(err, sizeof err, "the grammar matches the empty output only");
    if (rc < 0 || empty_only) {
        free(text);
        return kvf__srv_fail(e, 400, param, "invalid_value", "'%s': %s", param, err);
    }
    if (r->ignore_eos) {
        free(text);
        return kvf__srv_fail(e, 400, "ignore_eos", "invalid_value",
                             "'ignore_eos' cannot be combined with '%s': the output ends where "
                             "it is complete",
                             param);
    }
    r->grammar = text;
    r->n_grammar = (uint32_t)n;
    return 0;
}

static int parse_max_tokens(enum kvf__srv_kind kind, json_t *root,
                            const struct kvf__srv_limits *lim, struct kvf__srv_req *r,
                            uint32_t n_total, struct kvf__srv_err *e)
{
    const char *key = "max_tokens";
    if (kind == KVF__SRV_CHAT) {
        json_t *v = json_object_get(root, "max_completion_tokens");
        if (v && !json_is_null(v)) key = "max_completion_tokens";
    }
    long long x = 0;
    json_t *v = json_object_get(root, key);
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v))
            return kvf__srv_fail(e, 400, key, "invalid_type", "'%s' must be an integer", key);
        x = json_integer_value(v);
        if (x < 1)
            return kvf__srv_fail(e, 400, key, "invalid_value", "'%s' must be at least 1", key);
    }
    const char *pparam = kind == KVF__SRV_CHAT ? "messages" : "prompt";
    unsigned long long want = x ? (unsigned long long)x : 1;
    if (n_total + want > lim->served_limit)
        return kvf__srv_fail(e, 400, x ? key : pparam, "context_length_exceeded",
                             "This model's maximum context length is %u tokens; you requested "
                             "%llu tokens (%u in the prompt, %llu to generate)",
                             lim->served_limit, n_total + want, n_total, want);
    if (x) {
        r->max_tokens = (uint32_t)x;
    } else {
        uint32_t rest = lim->served_limit - n_total;
        r->max_tokens = rest < lim->default_max_tokens ? rest : lim->default_max_tokens;
    }
    return 0;
}

int kvf__srv_req_parse(enum kvf__srv_kind kind, const char *body, size_t len,
                       const struct kvf__srv_limits *lim, const kvf_tokenizer_t *tok,
                       struct kvf__srv_req *out, struct kvf__srv_err *e)
{
    struct kvf__srv_req r;
    memset(&r, 0, sizeof r);
    r.kind = kind;
    json_t *root = kvf__srv_parse_object(body, len, e);
    if (!root) return -1;
    uint32_t n_total = 0;
    if (check_model(root, lim, e) < 0) goto fail;
    if (check_refused(kind, root, e) < 0) goto fail;
    if (parse_options(kind, root, lim, &r, e) < 0) goto fail;
    if (parse_structured(root, &r, e) < 0) goto fail;
    if (parse_prompt(kind, root, lim, tok, &r, &n_total, e) < 0) goto fail;
    if (parse_max_tokens(kind, root, lim, &r, n_total, e) < 0) goto fail;
    r.n_prompt = n_total;
    json_decref(root);
    *out = r;
    return 0;
fail:
    json_decref(root);
    kvf__srv_req_free(&r);
    return -1;
}

void kvf__srv_req_free(struct kvf__srv_req *r)
{
    free(r->prompt);
    free(r->grammar);
    for (uint32_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    memset(r, 0, sizeof *r);
}
