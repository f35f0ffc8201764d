/*
 * The server over HTTP, with the fake engine behind it: every endpoint, streaming and not,
 * stop strings, n, logprobs, the BAD_INPUTS rows the router answers (9–19, 21, 23, 25, 26),
 * disconnects becoming cancels (streaming, queued, non-streaming), and stop with requests in
 * flight. Every case ends with kvf_server_stop and every engine handle released.
 */
#include <math.h>

#include "kvfence/limits.h"
#include "kvfence/proto.h"
#include "server_test_util.h"

/* The text the fake engine's echo of `prompt` gives after max_tokens tokens. */
static char *echo_text(const kvf_tokenizer_t *t, const char *prompt, uint32_t max_tokens)
{
    int32_t ids[1024];
    int n = kvf_tokenizer_encode(t, prompt, strlen(prompt), true, ids, 1024);
    ASSERT_TRUE(n > 1 && ids[0] == 1);
    struct kvf_detok d;
    kvf_detok_init(&d);
    char *out = malloc((size_t)max_tokens * KVF_DETOK_MAX_OUT + 8);
    size_t k = 0;
    for (uint32_t i = 0; i < max_tokens; i++)
        k += kvf_detok_push(&d, t, ids[1 + i % (uint32_t)(n - 1)], out + k, KVF_DETOK_MAX_OUT);
    k += kvf_detok_finish(&d, out + k, 8);
    out[k] = 0;
    return out;
}

static int prompt_len(const kvf_tokenizer_t *t, const char *prompt)
{
    return kvf_tokenizer_encode(t, prompt, strlen(prompt), true, NULL, 0);
}

static const char *jstr(json_t *j, const char *path0, const char *path1)
{
    json_t *v = json_object_get(j, path0);
    if (path1) v = json_object_get(v, path1);
    if (!json_is_string(v)) KVF_FAIL("%s.%s is not a string", path0, path1 ? path1 : "");
    return json_string_value(v);
}

static json_t *choice(json_t *j, size_t i)
{
    json_t *c = json_array_get(json_object_get(j, "choices"), i);
    ASSERT_NOT_NULL(c);
    return c;
}

/* --- Endpoints. --------------------------------------------------------------------------------
 */

static void test_health(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    struct http_resp r;
    http_do(s.port, "GET", "/health", NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    ASSERT_NOT_NULL(j);
    ASSERT_STREQ(jstr(j, "status", NULL), "ok");
    ASSERT_EQ_INT(json_integer_value(json_object_get(j, "served_limit")), 512);
    ASSERT_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "decode"), "pages")), 64);
    ASSERT_TRUE(json_is_object(json_object_get(json_object_get(j, "decode"), "by_state")));
    json_decref(j);
    http_resp_free(&r);
    /* No prefill connected: 503, still JSON. */
    pthread_mutex_lock(&s.f.mu);
    s.f.prefill_up = false;
    pthread_mutex_unlock(&s.f.mu);
    http_do(s.port, "GET", "/health", NULL, &r);
    ASSERT_EQ_INT(r.status, 503);
    ASSERT_TRUE(strstr(r.body, "\"unavailable\"") != NULL);
    http_resp_free(&r);
    srv_stop(&s);
}

static void test_models(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    struct http_resp r;
    http_do(s.port, "GET", "/v1/models", NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    ASSERT_STREQ(jstr(j, "object", NULL), "list");
    ASSERT_STREQ(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "test-model");
    json_decref(j);
    http_resp_free(&r);
    http_do(s.port, "GET", "/v1/models/test-model", NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    http_do(s.port, "GET", "/v1/models/other", NULL, &r);
    ASSERT_EQ_INT(r.status, 404);
    http_resp_free(&r);
    srv_stop(&s);
}

static void test_completion(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    json_t *j = post_json(s.port, "/v1/completions",
                          "{\"model\":\"x\",\"prompt\":\"hello world\",\"max_tokens\":5,"
                          "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,\"seed\":42,"
                          "\"unknown_field\":{\"a\":[1,2]}}",
                          200);
    char *want = echo_text(s.tok, "hello world", 5);
    ASSERT_STREQ(jstr(choice(j, 0), "text", NULL), want);
    ASSERT_STREQ(jstr(choice(j, 0), "finish_reason", NULL), "length");
    ASSERT_STREQ(jstr(j, "object", NULL), "text_completion");
    ASSERT_STREQ(jstr(j, "model", NULL), "test-model");
    ASSERT_TRUE(strncmp(jstr(j, "id", NULL), "cmpl-", 5) == 0);
    json_t *u = json_object_get(j, "usage");
    ASSERT_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")),
                  prompt_len(s.tok, "hello world"));
    ASSERT_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), 5);
    ASSERT_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")),
                  prompt_len(s.tok, "hello world") + 5);
    /* The sampling settings reached the engine, BOS first, EOS as the stop id. */
    ASSERT_NEAR(s.f.params[0].sample.temperature, 0.5, 1e-6);
    ASSERT_NEAR(s.f.params[0].sample.top_p, 0.9, 1e-6);
    ASSERT_EQ_INT(s.f.params[0].sample.top_k, 7);
    ASSERT_EQ_U64(s.f.params[0].sample.seed, 42);
    ASSERT_EQ_INT(s.f.params[0].max_tokens, 5);
    ASSERT_EQ_INT(s.f.params[0].n_stop_ids, 1);
    ASSERT_EQ_INT(s.f.params[0].stop_ids[0], 2);
    ASSERT_EQ_INT(s.f.last_prompt[0], 1);
    free(want);
    json_decref(j);
    srv_stop(&s);
}

static void test_completion_token_ids(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    char body[256];
    /* "hi" as byte tokens, no BOS added. */
    snprintf(body, sizeof body, "{\"prompt\":[%d,%d],\"max_tokens\":4}", byte_tok('h'),
             byte_tok('i'));
    json_t *j = post_json(s.port, "/v1/completions", body, 200);
    ASSERT_STREQ(jstr(choice(j, 0), "text", NULL), "hihi");
    ASSERT_EQ_INT(s.f.n_last_prompt, 2);
    ASSERT_EQ_INT(s.f.last_prompt[0], byte_tok('h'));
    json_decref(j);
    /* EOS in the echo ends it as "stop"; with ignore_eos it runs to max_tokens. */
    snprintf(body, sizeof body, "{\"prompt\":[%d,%d,2],\"max_tokens\":10}", byte_tok('a'),
             byte_tok('b'));
    j = post_json(s.port, "/v1/completions", body, 200);
    ASSERT_STREQ(jstr(choice(j, 0), "text", NULL), "ab");
    ASSERT_STREQ(jstr(choice(j, 0), "finish_reason", NULL), "stop");
    ASSERT_EQ_INT(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 3);
    json_decref(j);
    snprintf(body, sizeof body, "{\"prompt\":[%d,%d,2],\"max_tokens\":7,\"ignore_eos\":true}",
             byte_tok('a'), byte_tok('b'));
    j = post_json(s.port, "/v1/completions", body, 200);
    ASSERT_STREQ(jstr(choice(j, 0), "text", NULL), "ababa"); /* EOS decodes to nothing */
    ASSERT_STREQ(jstr(choice(j, 0), "finish_reason", NULL), "length");
    ASSERT_TRUE(s.f.params[2].ignore_eos);
    json_decref(j);
    srv_stop(&s);
}

/* Concatenates the text of a completions or chat stream; checks its shape and [DONE]. */
static char *stream_text(const char *body, bool chat, const char **finish, json_t **usage)
{
    json_t *ev = sse_events(body);
    size_t n = json_array_size(ev);
    ASSERT_TRUE(n >= 2);
    ASSERT_STREQ(json_string_value(json_array_get(ev, n - 1)), "[DONE]");
    struct {
        char *p;
        size_t n;
    } acc = {calloc(1, 1 << 16), 0};
    *finish = NULL;
    if (usage) *usage = NULL;
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *c = json_loads(json_string_value(json_array_get(ev, i)), 0, NULL);
        ASSERT_NOT_NULL(c);
        ASSERT_STREQ(jstr(c, "object", NULL), chat ? "chat.completion.chunk" : "text_completion");
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        if (!ch) {
            ASSERT_NOT_NULL(usage);
            *usage = json_incref(json_object_get(c, "usage"));
            json_decref(c);
            continue;
        }
        json_t *t = chat ? json_object_get(json_object_get(ch, "delta"), "content")
                         : json_object_get(ch, "text");
        if (json_is_string(t)) {
            memcpy(acc.p + acc.n, json_string_value(t), json_string_length(t));
            acc.n += json_string_length(t);
        }
        json_t *f = json_object_get(ch, "finish_reason");
        if (json_is_string(f)) *finish = json_string_value(f)[0] == 's' ? "stop" : "length";
        json_decref(c);
    }
    json_decref(ev);
    return acc.p;
}

static void test_completion_stream(void)
{
    struct srv s;
    srv_init(&s);
    s.f.token_delay_ms = 2;
    srv_start(&s);
    struct http_resp r;
    http_do(s.port, "POST", "/v1/completions",
            "{\"prompt\":\"hello world\",\"max_tokens\":9,\"stream\":true,"
            "\"stream_options\":{\"include_usage\":true}}",
            &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(strcasestr(r.head, "content-type: text/event-stream") != NULL);
    const char *finish;
    json_t *usage;
    char *text = stream_text(r.body, false, &finish, &usage);
    char *want = echo_text(s.tok, "hello world", 9);
    ASSERT_STREQ(text, want);
    ASSERT_STREQ(finish, "length");
    ASSERT_NOT_NULL(usage);
    ASSERT_EQ_INT(json_integer_value(json_object_get(usage, "completion_tokens")), 9);
    json_decref(usage);
    free(text);
    free(want);
    http_resp_free(&r);
    srv_stop(&s);
}

static void test_chat(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    json_t *j = post_json(s.port, "/v1/chat/completions",
                          "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be "
                          "brief.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                          "\"text\":\"Hi\"}]}],\"max_completion_tokens\":3}",
                          200);
    ASSERT_STREQ(jstr(j, "object", NULL), "chat.completion");
    ASSERT_STREQ(jstr(choice(j, 0), "message", "role"), "assistant");
    ASSERT_STREQ(jstr(choice(j, 0), "finish_reason", NULL), "length");
    /* The prompt the engine got is the default rendering, BOS first. */
    const char *want = "system: Be brief.\nuser: Hi\nassistant:";
    int32_t ids[256];
    int n = kvf_tokenizer_encode(s.tok, want, strlen(want), true, ids, 256);
    ASSERT_EQ_INT(s.f.n_last_prompt, n);
    ASSERT_MEMEQ(s.f.last_prompt, ids, (size_t)n * sizeof ids[0]);
    char *echo = echo_text(s.tok, want, 3);
    ASSERT_STREQ(jstr(choice(j, 0), "message", "content"), echo);
    free(echo);
    json_decref(j);

    struct http_resp r;
    http_do(
        s.port, "POST", "/v1/chat/completions",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":6,\"stream\":true}",
        &r);
    ASSERT_EQ_INT(r.status, 200);
    json_t *ev = sse_events(r.body);
    json_t *first = json_loads(json_string_value(json_array_get(ev, 0)), 0, NULL);
    ASSERT_STREQ(jstr(choice(first, 0), "delta", "role"), "assistant");
    json_decref(first);
    json_decref(ev);
    const char *finish;
    char *text = stream_text(r.body, true, &finish, NULL);
    echo = echo_text(s.tok, "user: Hi\nassistant:", 6);
    ASSERT_STREQ(text, echo);
    ASSERT_STREQ(finish, "length");
    free(echo);
    free(text);
    http_resp_free(&r);
    srv_stop(&s);
}

static void test_tokenize_detokenize(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    json_t *j = post_json(s.port, "/tokenize", "{\"prompt\":\"hello world\"}", 200);
    json_t *toks = json_object_get(j, "tokens");
    int32_t ids[64];
    int n = kvf_tokenizer_encode(s.tok, "hello world", 11, true, ids, 64);
    ASSERT_EQ_INT(json_integer_value(json_object_get(j, "count")), n);
    ASSERT_EQ_INT(json_array_size(toks), n);
    for (int i = 0; i < n; i++)
        ASSERT_EQ_INT(json_integer_value(json_array_get(toks, (size_t)i)), ids[i]);
    char body[512];
    char *list = json_dumps(toks, JSON_COMPACT);
    snprintf(body, sizeof body, "{\"tokens\":%s}", list);
    free(list);
    json_decref(j);
    j = post_json(s.port, "/detokenize", body, 200);
    ASSERT_STREQ(jstr(j, "prompt", NULL), "hello world");
    json_decref(j);
    j = post_json(s.port, "/tokenize", "{\"prompt\":\"hi\",\"add_special_tokens\":false}", 200);
    ASSERT_EQ_INT(json_integer_value(json_object_get(j, "count")), 3); /* ▁ h i */
    json_decref(j);
    json_decref(post_json(s.port, "/tokenize", "{\"prompt\":5}", 400));
    json_decref(post_json(s.port, "/detokenize", "{\"tokens\":[1,-1]}", 400));
    json_decref(post_json(s.port, "/detokenize", "{\"tokens\":[1,999999]}", 400));
    srv_stop(&s);
}

/* --- Stop strings, n, logprobs. ----------------------------------------------------------------
 */

static void test_stop_strings(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    char body[512];
    /* Echo of byte tokens a b c d: "abcdabcd..."; "da" spans two tokens and a cycle. */
    snprintf(body, sizeof body,
             "{\"prompt\":[%d,%d,%d,%d],\"max_tokens\":20,\"stop\":[\"zz\",\"da\"]}", byte_tok('a'),
             byte_tok('b'), byte_tok('c'), byte_tok('d'));
    json_t *j = post_json(s.port, "/v1/completions", body, 200);
    ASSERT_STREQ(jstr(choice(j, 0), "text", NULL), "abc");
    ASSERT_STREQ(jstr(choice(j, 0), "finish_reason", NULL), "stop");
    ASSERT_EQ_INT(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 5);
    ASSERT_EQ_INT(fake_cancels(&s.f), 1); /* the stop string cancelled the generation */
    json_decref(j);
    /* A held-back prefix that never completes is released at the end. */
    snprintf(body, sizeof body, "{\"prompt\":[%d,%d],\"max_tokens\":3,\"stop\":\"bax\"}",
             byte_tok('a'), byte_tok('b'));
    j = post_json(s.port, "/v1/completions", body, 200);
    ASSERT_STREQ(jstr(choice(j, 0), "text", NULL), "aba");
    ASSERT_STREQ(jstr(choice(j, 0), "finish_reason", NULL), "length");
    json_decref(j);
    /* Streaming: nothing of the stop string or after it is sent. */
    struct http_resp r;
    snprintf(body, sizeof body,
             "{\"prompt\":[%d,%d,%d,%d],\"max_tokens\":20,\"stop\":\"cda\",\"stream\":true}",
             byte_tok('a'), byte_tok('b'), byte_tok('c'), byte_tok('d'));
    http_do(s.port, "POST", "/v1/completions", body, &r);
    const char *finish;
    char *text = stream_text(r.body, false, &finish, NULL);
    ASSERT_STREQ(text, "ab");
    ASSERT_STREQ(finish, "stop");
    free(text);
    http_resp_free(&r);
    srv_stop(&s);
}

static void test_n_choices(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    json_t *j = post_json(s.port, "/v1/completions",
                          "{\"prompt\":\"hello\",\"max_tokens\":2,\"n\":3,\"seed\":100}", 200);
    ASSERT_EQ_INT(json_array_size(json_object_get(j, "choices")), 3);
    for (size_t i = 0; i < 3; i++) {
        ASSERT_EQ_INT(json_integer_value(json_object_get(choice(j, i), "index")), i);
        ASSERT_EQ_U64(s.f.params[i].sample.seed, 100 + i);
    }
    ASSERT_EQ_INT(s.f.submits, 3);
    ASSERT_EQ_INT(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 6);
    json_decref(j);
    struct http_resp r;
    http_do(s.port, "POST", "/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,\"n\":2,"
            "\"stream\":true}",
            &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(strstr(r.body, "\"index\":1") != NULL);
    ASSERT_TRUE(strstr(r.body, "data: [DONE]") != NULL);
    http_resp_free(&r);
    srv_stop(&s);
}

static void test_logprobs(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    json_t *j = post_json(s.port, "/v1/completions",
                          "{\"prompt\":\"hello\",\"max_tokens\":3,\"logprobs\":2}", 200);
    json_t *lp = json_object_get(choice(j, 0), "logprobs");
    ASSERT_EQ_INT(json_array_size(json_object_get(lp, "tokens")), 3);
    ASSERT_EQ_INT(json_array_size(json_object_get(lp, "token_logprobs")), 3);
    ASSERT_NEAR(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 1)),
                -2.0 / 16, 1e-6);
    ASSERT_EQ_INT(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)), 2);
    ASSERT_EQ_INT(json_array_size(json_object_get(lp, "text_offset")), 3);
    ASSERT_EQ_INT(s.f.params[0].n_logprobs, 2);
    ASSERT_TRUE(s.f.params[0].want_logprob);
    json_decref(j);
    j = post_json(s.port, "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,"
                  "\"logprobs\":true,\"top_logprobs\":3}",
                  200);
    json_t *content = json_object_get(json_object_get(choice(j, 0), "logprobs"), "content");
    ASSERT_EQ_INT(json_array_size(content), 2);
    json_t *e0 = json_array_get(content, 0);
    ASSERT_TRUE(json_is_string(json_object_get(e0, "token")));
    ASSERT_TRUE(json_is_array(json_object_get(e0, "bytes")));
    ASSERT_EQ_INT(json_array_size(json_object_get(e0, "top_logprobs")), 3);
    json_decref(j);
    /* No logprobs asked: null, and nothing asked of the engine. */
    j = post_json(s.port, "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":1}", 200);
    ASSERT_TRUE(json_is_null(json_object_get(choice(j, 0), "logprobs")));
    ASSERT_FALSE(s.f.params[2].want_logprob);
    json_decref(j);
    srv_stop(&s);
}

/* Row 17: output ending inside a multibyte character; every chunk valid UTF-8. */
static void test_stream_utf8(void)
{
    struct srv s;
    srv_init(&s);
    /* "é" (C3 A9) split over two tokens, then a lone lead byte E2 and "x" (E2 cannot complete). */
    static int32_t script[4];
    script[0] = byte_tok(0xC3), script[1] = byte_tok(0xA9), script[2] = byte_tok(0xE2);
    script[3] = byte_tok('x');
    s.f.script = script;
    s.f.n_script = 4;
    srv_start(&s);
    struct http_resp r;
    http_do(s.port, "POST", "/v1/completions",
            "{\"prompt\":\"a\",\"max_tokens\":3,\"stream\":true}", &r);
    ASSERT_TRUE(utf8_ok(r.body, r.body_len));
    const char *finish;
    char *text = stream_text(r.body, false, &finish, NULL);
    ASSERT_STREQ(text, "\xc3\xa9\xef\xbf\xbd"); /* é then U+FFFD for the cut E2 */
    free(text);
    http_resp_free(&r);
    json_t *j = post_json(s.port, "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":4}", 200);
    ASSERT_STREQ(jstr(choice(j, 0), "text", NULL), "\xc3\xa9\xef\xbf\xbdx");
    json_decref(j);
    srv_stop(&s);
}

/* --- Errors (BAD_INPUTS rows 9–18): status, OpenAI shape, the field named. ---------------------
 */

struct bad_case {
    const char *path, *body;
    int status;
    const char *param; /* expected error.param, or NULL for any */
    const char *msg;   /* a substring of error.message, or NULL */
};

static void expect_error(uint16_t port, const struct bad_case *c)
{
    struct http_resp r;
    http_do(port, "POST", c->path, c->body, &r);
    if (r.status != c->status)
        KVF_FAIL("%s %.80s: status %d, wanted %d (%s)", c->path, c->body, r.status, c->status,
                 r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    if (!j) KVF_FAIL("error body is not JSON: %s", r.body);
    json_t *e = json_object_get(j, "error");
    ASSERT_TRUE(json_is_string(json_object_get(e, "message")));
    ASSERT_TRUE(json_is_string(json_object_get(e, "type")));
    ASSERT_TRUE(json_object_get(e, "param") != NULL && json_object_get(e, "code") != NULL);
    if (c->param && (!json_is_string(json_object_get(e, "param")) ||
                     strcmp(json_string_value(json_object_get(e, "param")), c->param) != 0))
        KVF_FAIL("%.80s: param %s, wanted %s", c->body, r.body, c->param);
    if (c->msg && !strstr(json_string_value(json_object_get(e, "message")), c->msg))
        KVF_FAIL("%.80s: message %s lacks \"%s\"", c->body, r.body, c->msg);
    json_decref(j);
    http_resp_free(&r);
}

static void test_bad_bodies(void)
{
    struct srv s;
    srv_init(&s);
    s.f.served_limit = 64;
    srv_start(&s);
    static char deep[400], deep_ignored[400];
    memset(deep, 0, sizeof deep);
    strcpy(deep, "{\"prompt\":\"a\",\"x\":");
    for (int i = 0; i < 70; i++)
        strcat(deep, "[");
    for (int i = 0; i < 70; i++)
        strcat(deep, "]");
    strcat(deep, "}");
    strcpy(deep_ignored, "{\"prompt\":\"a\",\"x\":");
    for (int i = 0; i < 63; i++)
        strcat(deep_ignored, "[");
    for (int i = 0; i < 63; i++)
        strcat(deep_ignored, "]");
    strcat(deep_ignored, ",\"max_tokens\":1}");
    const char *C = "/v1/completions", *H = "/v1/chat/completions";
    const struct bad_case cases[] = {
        /* row 9: token ids */
        {C, "{\"prompt\":[5,-1]}", 400, "prompt", NULL},
        {C, "{\"prompt\":[5,265]}", 400, "prompt", NULL},
        {C, "{\"prompt\":[5,1.5]}", 400, "prompt", NULL},
        {C, "{\"prompt\":[5,true]}", 400, "prompt", NULL},
        {C, "{\"prompt\":[5,null]}", 400, "prompt", NULL},
        {C, "{\"prompt\":[5,\"a\"]}", 400, "prompt", NULL},
        /* row 10: max_tokens */
        {C, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", NULL},
        {C, "{\"prompt\":\"a\",\"max_tokens\":-3}", 400, "max_tokens", NULL},
        {C, "{\"prompt\":\"a\",\"max_tokens\":2.5}", 400, "max_tokens", NULL},
        {C, "{\"prompt\":\"a\",\"max_tokens\":\"9\"}", 400, "max_tokens", NULL},
        {C, "{\"prompt\":\"a\",\"max_tokens\":99999999999999999999999}", 400, NULL, NULL},
        {C, "{\"prompt\":\"a\",\"max_tokens\":62}", 400, "max_tokens",
         "maximum context length is 64 tokens; you requested 65 tokens (3 in the prompt, 62 to "
         "generate)"},
        {C, "{\"prompt\":\"a\",\"max_tokens\":9223372036854775807}", 400, "max_tokens",
         "(3 in the prompt, 9223372036854775807 to generate)"},
        /* row 11: n, best_of, logprobs */
        {C, "{\"prompt\":\"a\",\"n\":0}", 400, "n", NULL},
        {C, "{\"prompt\":\"a\",\"n\":5}", 400, "n", NULL},
        {C, "{\"prompt\":\"a\",\"best_of\":9}", 400, "best_of", NULL},
        {C, "{\"prompt\":\"a\",\"n\":2,\"best_of\":3}", 400, "best_of", NULL},
        {C, "{\"prompt\":\"a\",\"logprobs\":21}", 400, "logprobs", NULL},
        {C, "{\"prompt\":\"a\",\"logprobs\":-1}", 400, "logprobs", NULL},
        {C, "{\"prompt\":\"a\",\"logprobs\":true}", 400, "logprobs", NULL},
        {H,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,\"top_logprobs\":"
         "21}",
         400, "top_logprobs", NULL},
        {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}", 400,
         "top_logprobs", NULL},
        /* row 12: empty prompt, messages */
        {C, "{\"prompt\":\"\"}", 400, "prompt", NULL},
        {C, "{\"prompt\":[]}", 400, "prompt", NULL},
        {C, "{}", 400, "prompt", NULL},
        {H, "{\"messages\":[]}", 400, "messages", NULL},
        {H, "{}", 400, "messages", NULL},
        {H, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages", NULL},
        {H, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", 400, "messages", NULL},
        {H, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"a\"}]}", 400, "messages", NULL},
        {H, "{\"messages\":[{\"content\":\"a\"}]}", 400, "messages", NULL},
        {H, "{\"messages\":{\"role\":\"user\"}}", 400, "messages", NULL},
        /* row 13: stop */
        {C, "{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", NULL},
        {C, "{\"prompt\":\"a\",\"stop\":[\"a\",3]}", 400, "stop", NULL},
        {C, "{\"prompt\":\"a\",\"stop\":\"\"}", 400, "stop", NULL},
        /* row 14: sampling */
        {C, "{\"prompt\":\"a\",\"temperature\":-0.1}", 400, "temperature", NULL},
        {C, "{\"prompt\":\"a\",\"temperature\":NaN}", 400, NULL, NULL},
        {C, "{\"prompt\":\"a\",\"temperature\":\"hot\"}", 400, "temperature", NULL},
        {C, "{\"prompt\":\"a\",\"top_p\":0}", 400, "top_p", NULL},
        {C, "{\"prompt\":\"a\",\"top_p\":1.01}", 400, "top_p", NULL},
        {C, "{\"prompt\":\"a\",\"top_k\":-2}", 400, "top_k", NULL},
        {C, "{\"prompt\":\"a\",\"min_p\":1.5}", 400, "min_p", NULL},
        {C, "{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", 400, "logit_bias", NULL},
        {C, "{\"prompt\":\"a\",\"logit_bias\":{\"1\":101}}", 400, "logit_bias", NULL},
        {C, "{\"prompt\":\"a\",\"echo\":true}", 400, "echo", "not supported"},
        {C, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"bogus\"}}", 400, "response_format",
         NULL},
        {C, "{\"prompt\":\"a\",\"seed\":1.5}", 400, "seed", NULL},
        {C, "{\"prompt\":\"a\",\"seed\":\"7\"}", 400, "seed", NULL},
        /* row 15: nesting, also inside an ignored field */
        {C, deep, 400, NULL, "nested deeper than 64"},
        /* row 16: UTF-8 */
        {C, "{\"prompt\":\"\xff\"}", 400, NULL, "UTF-8"},
        {C, "{\"prompt\":\"\xc0\xaf\"}", 400, NULL, "UTF-8"},     /* overlong '/' */
        {C, "{\"prompt\":\"\xed\xa0\x80\"}", 400, NULL, "UTF-8"}, /* encoded surrogate */
        {C, "{\"prompt\":\"\\ud800x\"}", 400, NULL, NULL},        /* lone escaped surrogate */
        /* row 18: wrong types */
        {C, "{\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "stream", NULL},
        {C, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":1}}", 400, "stream_options",
         NULL},
        {C, "{\"prompt\":\"a\",\"ignore_eos\":1}", 400, "ignore_eos", NULL},
        {C, "{\"prompt\":7}", 400, "prompt", NULL},
        {C, "[1,2]", 400, NULL, NULL},
        {C, "{\"prompt\":\"a\", secret words}", 400, NULL, NULL},
        {C, "not json", 400, NULL, NULL},
        {C, "", 400, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(s.port, &cases[i]);
    /* Row 8: no part of the body comes back in an error. */
    struct http_resp r;
    http_do(s.port, "POST", C, "{\"prompt\":\"a\", secret words}", &r);
    ASSERT_EQ_INT(r.status, 400);
    ASSERT_TRUE(strstr(r.body, "secret") == NULL);
    http_resp_free(&r);
    http_do(s.port, "POST", C, "{\"prompt\":\"my secret\",\"max_tokens\":100}", &r);
    ASSERT_EQ_INT(r.status, 400);
    ASSERT_TRUE(strstr(r.body, "secret") == NULL);
    http_resp_free(&r);
    ASSERT_EQ_INT(s.f.submits, 0); /* nothing reached the engine */
    /* The limit exactly is served; 63 levels of nesting in an ignored field are fine. */
    json_decref(post_json(s.port, C, "{\"prompt\":\"a\",\"max_tokens\":61}", 200));
    json_decref(post_json(s.port, C, deep_ignored, 200));
    /* Default max_tokens: the rest of the limit, capped (here the rest: 61). */
    json_t *j = post_json(s.port, C, "{\"prompt\":\"a\"}", 200);
    ASSERT_EQ_INT(s.f.params[2].max_tokens, 61);
    json_decref(j);
    srv_stop(&s);
}

/* --- HTTP rows 19, 21, 23, 25. -----------------------------------------------------------------
 */

/* --- One table of limits: what the API accepts, the codec carries. ---------------------------- */

/* The NEW a decode worker would send for the last submit (sampling mapped as decode_worker.c
 * maps kvf_gen_params), encoded and decoded: the codec must take it and give back the same
 * fields, bit for bit. */
static void check_roundtrip(struct srv *s, const char *what)
{
    pthread_mutex_lock(&s->f.mu);
    uint32_t k = s->f.submits - 1 < FAKE_MAX_RECORDS ? s->f.submits - 1 : FAKE_MAX_RECORDS - 1;
    struct kvf_gen_params p = s->f.params[k];
    uint32_t tokens[4096];
    for (uint32_t i = 0; i < s->f.n_last_prompt; i++)
        tokens[i] = (uint32_t)s->f.last_prompt[i];
    pthread_mutex_unlock(&s->f.mu);
    struct kvf_msg m, d;
    memset(&m, 0, sizeof m);
    m.type = KVF_MSG_NEW;
    m.u.nreq.tenant = p.tenant;
    m.u.nreq.prompt_len = p.n_prompt;
    m.u.nreq.max_tokens = p.max_tokens;
    m.u.nreq.n_tokens = p.n_prompt;
    m.u.nreq.tokens = tokens;
    m.u.nreq.sampling =
        (struct kvf_msg_sampling){.temperature = p.sample.temperature,
                                  .top_p = p.sample.top_p,
                                  .top_k = p.sample.top_k,
                                  .n_logprobs = p.n_logprobs,
                                  .seed = p.sample.seed,
                                  .want_logprob = p.want_logprob || p.n_logprobs > 0};
    m.u.nreq.sampling.min_p = p.sample.min_p;
    m.u.nreq.sampling.presence_penalty = p.sample.presence_penalty;
    m.u.nreq.sampling.frequency_penalty = p.sample.frequency_penalty;
    m.u.nreq.sampling.repetition_penalty = p.sample.repetition_penalty;
    m.u.nreq.sampling.n_logit_bias = p.sample.n_logit_bias;
    memcpy(m.u.nreq.sampling.logit_bias, p.sample.logit_bias, sizeof p.sample.logit_bias);
    static uint8_t buf[KVF_PROTO_HEADER_BYTES + 16 + KVF_PROTO_SAMPLING_BYTES + 4 * 4096];
    long n = kvf_msg_encode(&m, buf, sizeof buf);
    if (n < 0) KVF_FAIL("%s: accepted by the API, refused by the encoder (%ld)", what, n);
    static uint32_t scratch_tokens[4096];
    struct kvf_msg_scratch sc = {.tokens = scratch_tokens, .tokens_cap = 4096};
    long got = kvf_msg_decode(buf, (size_t)n, &d, &sc);
    if (got != n) KVF_FAIL("%s: accepted by the API, refused by the decoder (%ld)", what, got);
    const struct kvf_msg_sampling *a = &m.u.nreq.sampling, *b = &d.u.nreq.sampling;
    ASSERT_MEMEQ(&a->temperature, &b->temperature, sizeof a->temperature);
    ASSERT_MEMEQ(&a->top_p, &b->top_p, sizeof a->top_p);
    ASSERT_EQ_INT(a->top_k, b->top_k);
    ASSERT_EQ_INT(a->n_logprobs, b->n_logprobs);
    ASSERT_EQ_U64(a->seed, b->seed);
    ASSERT_EQ_INT(a->want_logprob, b->want_logprob);
    ASSERT_MEMEQ(&a->min_p, &b->min_p, sizeof a->min_p);
    ASSERT_MEMEQ(&a->presence_penalty, &b->presence_penalty, sizeof a->presence_penalty);
    ASSERT_MEMEQ(&a->frequency_penalty, &b->frequency_penalty, sizeof a->frequency_penalty);
    ASSERT_MEMEQ(&a->repetition_penalty, &b->repetition_penalty, sizeof a->repetition_penalty);
    ASSERT_EQ_INT(a->n_logit_bias, b->n_logit_bias);
    ASSERT_MEMEQ(a->logit_bias, b->logit_bias, a->n_logit_bias * sizeof a->logit_bias[0]);
    ASSERT_EQ_INT(d.u.nreq.max_tokens, p.max_tokens);
    ASSERT_EQ_INT(d.u.nreq.prompt_len, p.n_prompt);
}

/* Sends `"field": value` (value as JSON text) on path; an accepted value must round-trip the
 * codec, a refused one must be a 400 naming param. Returns whether it was accepted. */
static bool probe(struct srv *s, const char *path, const char *field, const char *param,
                  const char *value)
{
    char body[512];
    bool chat = strstr(path, "chat") != NULL;
    snprintf(body, sizeof body, "{%s,\"max_tokens\":1,%s\"%s\":%s}",
             chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
                  : "\"prompt\":\"hello\"",
             chat && strcmp(field, "top_logprobs") == 0 ? "\"logprobs\":true," : "", field, value);
    struct http_resp r;
    uint32_t before = s->f.submits;
    http_do(s->port, "POST", path, body, &r);
    char what[600];
    snprintf(what, sizeof what, "%s %s", path, body);
    bool ok = r.status == 200;
    if (ok) {
        ASSERT_TRUE(s->f.submits > before);
        check_roundtrip(s, what);
    } else {
        if (r.status != 400) KVF_FAIL("%s: status %d (%s)", what, r.status, r.body);
        json_t *j = json_loads(r.body, 0, NULL);
        const char *pr = json_string_value(json_object_get(json_object_get(j, "error"), "param"));
        if (!pr || strcmp(pr, param) != 0)
            KVF_FAIL("%s: the 400 names %s, not %s", what, pr, param);
        json_decref(j);
        ASSERT_EQ_INT(s->f.submits, before);
    }
    http_resp_free(&r);
    return ok;
}

static void test_limits_roundtrip(void)
{
    struct srv s;
    srv_init(&s);
    s.f.served_limit = 64;
    srv_start(&s);
    const char *C = "/v1/completions", *H = "/v1/chat/completions";
    for (int f = 0; f < KVF_FIELD__COUNT; f++) {
        const struct kvf_field_limit *l = &kvf_field_limits[f];
        char v[64];
        if (!l->integer) {
            /* The extremes, their neighbours on both sides, and far beyond (past f32 too). */
            double vals[] = {l->lo,
                             nextafter(l->lo, INFINITY),
                             nextafter(l->lo, -INFINITY),
                             l->hi,
                             nextafter(l->hi, -INFINITY),
                             nextafter(l->hi, INFINITY),
                             (l->lo + l->hi) / 2,
                             l->hi * 2,
                             l->hi + 1,
                             1e7,
                             3.4028234663852886e38,
                             1e39,
                             1e300,
                             -1,
                             -1e300,
                             5e-324,
                             1.1754943508222875e-38,
                             1e-45};
            for (size_t i = 0; i < KVF_ARRAY_LEN(vals); i++) {
                snprintf(v, sizeof v, "%.17g", vals[i]);
                bool in = vals[i] <= l->hi && (l->lo_open ? vals[i] > l->lo : vals[i] >= l->lo);
                bool ok = probe(&s, C, l->name, l->name, v);
                if (ok != in)
                    KVF_FAIL("%s = %s: accepted %d, the table says %d", l->name, v, ok, in);
            }
        } else {
            long long hi = l->ihi > INT64_MAX ? INT64_MAX : (long long)l->ihi;
            long long vals[] = {l->ilo,
                                l->ilo + 1,
                                hi,
                                hi - 1,
                                hi / 2,
                                0,
                                1,
                                l->ilo > INT64_MIN ? l->ilo - 1 : l->ilo,
                                hi < INT64_MAX ? hi + 1 : hi,
                                -1,
                                INT64_MIN,
                                INT64_MAX};
            for (size_t i = 0; i < KVF_ARRAY_LEN(vals); i++) {
                snprintf(v, sizeof v, "%lld", vals[i]);
                bool in = vals[i] >= l->ilo && (vals[i] < 0 || (uint64_t)vals[i] <= l->ihi);
                bool ok = probe(&s, C, l->name, l->name, v);
                if (ok != in)
                    KVF_FAIL("%s = %s: accepted %d, the table says %d", l->name, v, ok, in);
                if (f == KVF_FIELD_LOGPROBS) { /* chat's name for the same field */
                    ok = probe(&s, H, "top_logprobs", "top_logprobs", v);
                    if (ok != in)
                        KVF_FAIL("top_logprobs = %s: accepted %d, the table says %d", v, ok, in);
                }
            }
        }
    }
    /* The numeric fields that do not travel keep the property too: accepted, the request
     * round-trips; refused, a 400 names the field. */
    static const char *const counts[] = {"-1",  "0",  "1", "2", "4", "5", "9223372036854775807",
                                         "1.5", "1e3"};
    for (size_t i = 0; i < KVF_ARRAY_LEN(counts); i++) {
        bool in = strcmp(counts[i], "1") == 0 || strcmp(counts[i], "2") == 0 ||
                  strcmp(counts[i], "4") == 0; /* srv_init's max_n is 4 */
        if (probe(&s, C, "n", "n", counts[i]) != in) KVF_FAIL("n = %s", counts[i]);
        if (probe(&s, C, "best_of", "best_of", counts[i]) != (strcmp(counts[i], "1") == 0))
            KVF_FAIL("best_of = %s (n is 1)", counts[i]);
    }
    /* max_tokens travels too: 1 and the most that fits the served limit round-trip. */
    ASSERT_TRUE(probe(&s, C, "n", "n", "1")); /* max_tokens 1 (probe's own) */
    json_t *tk = post_json(s.port, "/tokenize", "{\"prompt\":\"hello\"}", 200);
    long long n_prompt = json_integer_value(json_object_get(tk, "count"));
    json_decref(tk);
    char body[128];
    snprintf(body, sizeof body, "{\"prompt\":\"hello\",\"max_tokens\":%lld}", 64 - n_prompt);
    json_decref(post_json(s.port, C, body, 200));
    check_roundtrip(&s, body);
    static const char *const beyond[] = {"0",     "-1",         "1.0",
                                         "\"8\"", "4294967297", "9223372036854775807"};
    for (size_t i = 0; i < KVF_ARRAY_LEN(beyond); i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"hello\",\"max_tokens\":%s}", beyond[i]);
        json_t *j = post_json(s.port, C, body, 400);
        ASSERT_STREQ(json_string_value(json_object_get(json_object_get(j, "error"), "param")),
                     "max_tokens");
        json_decref(j);
    }
    snprintf(body, sizeof body, "{\"prompt\":\"hello\",\"max_tokens\":%lld}", 64 - n_prompt + 1);
    json_t *j = post_json(s.port, C, body, 400);
    ASSERT_STREQ(json_string_value(json_object_get(json_object_get(j, "error"), "param")),
                 "max_tokens");
    json_decref(j);
    srv_stop(&s);
}

static void test_http_limits(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.max_body_bytes = 1024;
    srv_start(&s);
    struct http_resp r;
    /* Row 19: a declared length over the bound is refused before the body is sent. */
    const char *big = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n"
                      "Content-Type: application/json\r\n\r\n";
    http_raw(s.port, big, strlen(big), &r);
    ASSERT_EQ_INT(r.status, 413);
    ASSERT_TRUE(strstr(r.body, "\"error\"") != NULL);
    http_resp_free(&r);
    /* A chunked body that grows past it: 413 (or the connection closed, never 200). */
    char chunked[4096];
    int k = snprintf(chunked, sizeof chunked,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; i++) {
        k += snprintf(chunked + k, sizeof chunked - (size_t)k, "200\r\n");
        memset(chunked + k, ' ', 0x200);
        k += 0x200;
        k += snprintf(chunked + k, sizeof chunked - (size_t)k, "\r\n");
    }
    k += snprintf(chunked + k, sizeof chunked - (size_t)k, "0\r\n\r\n");
    http_raw(s.port, chunked, (size_t)k, &r);
    ASSERT_EQ_INT(r.status, 413);
    http_resp_free(&r);
    /* Row 23: Content-Length with Transfer-Encoding, and two Content-Lengths. */
    const char *both = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                       "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n";
    http_raw(s.port, both, strlen(both), &r);
    ASSERT_EQ_INT(r.status, 400);
    http_resp_free(&r);
    const char *two = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                      "Content-Length: 2\r\nConnection: close\r\n\r\n{}";
    http_raw(s.port, two, strlen(two), &r);
    ASSERT_EQ_INT(r.status, 400);
    http_resp_free(&r);
    /* Row 21: a huge header, a long request line. */
    size_t hn = 64 * 1024;
    char *huge = malloc(hn + 256);
    int o = snprintf(huge, 256, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(huge + o, 'a', hn);
    o += (int)hn;
    o += snprintf(huge + o, 64, "\r\nConnection: close\r\n\r\n");
    http_raw(s.port, huge, (size_t)o, &r);
    ASSERT_EQ_INT(r.status, 431);
    http_resp_free(&r);
    o = snprintf(huge, 64, "GET /");
    memset(huge + o, 'a', hn);
    o += (int)hn;
    o += snprintf(huge + o, 64, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    http_raw(s.port, huge, (size_t)o, &r);
    ASSERT_EQ_INT(r.status, 414);
    http_resp_free(&r);
    free(huge);
    /* Row 25: unknown path 404, wrong method 405 with Allow. */
    http_do(s.port, "GET", "/v2/nothing", NULL, &r);
    ASSERT_EQ_INT(r.status, 404);
    ASSERT_TRUE(strstr(r.body, "\"error\"") != NULL);
    http_resp_free(&r);
    http_do(s.port, "GET", "/v1/completions", NULL, &r);
    ASSERT_EQ_INT(r.status, 405);
    ASSERT_TRUE(strcasestr(r.head, "allow: POST") != NULL);
    http_resp_free(&r);
    http_do(s.port, "DELETE", "/health", NULL, &r);
    ASSERT_EQ_INT(r.status, 405);
    http_resp_free(&r);
    srv_stop(&s);
}

/* --- Capacity and engine failures. ---------------------------------------------------------------
 */

/* Starts a streaming request and waits until its headers arrive; returns the socket. */
static int open_stream(uint16_t port, const char *body)
{
    int fd = http_connect(port);
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n",
                      strlen(body));
    http_send_all(fd, head, (size_t)hn);
    http_send_all(fd, body, strlen(body));
    return fd;
}

/* The value of the series `series` (name and labels, as written) in GET /metrics, or -1 if it
 * is not there. */
static long long metric_value(uint16_t port, const char *series)
{
    struct http_resp r;
    http_do(port, "GET", "/metrics", NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    long long v = -1;
    size_t n = strlen(series);
    for (const char *p = r.body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            v = strtoll(p + n + 1, NULL, 10);
            break;
        }
    http_resp_free(&r);
    return v;
}

static long long errors_of(uint16_t port, const char *reason)
{
    char series[128];
    snprintf(series, sizeof series, "kvfence_request_errors_total{reason=\"%s\"}", reason);
    return metric_value(port, series);
}

/* errors_of, waited for up to 2 s to reach want: a stream is counted when the server lets go of
 * it, just after its last bytes went out. */
static long long errors_reach(uint16_t port, const char *reason, long long want)
{
    long long v = errors_of(port, reason);
    for (int i = 0; i < 200 && v != want; i++) {
        usleep(10000);
        v = errors_of(port, reason);
    }
    return v;
}

/* The Retry-After header of a response's head, or -1 without one. */
static int retry_after(const struct http_resp *r)
{
    const char *h = strcasestr(r->head, "\r\nretry-after:");
    return h ? atoi(h + 14) : -1;
}

static void test_queue_full(void)
{
    struct srv s;
    srv_init(&s);
    s.f.max_live = 1;
    s.f.first_delay_ms = 60000; /* the first request stays queued */
    srv_start(&s);
    int fd = open_stream(s.port, "{\"prompt\":\"a\",\"stream\":true}");
    ASSERT_TRUE(fake_wait_live(&s.f, 1, 5000));
    struct http_resp r;
    http_do(s.port, "POST", "/v1/completions", "{\"prompt\":\"a\"}", &r);
    ASSERT_EQ_INT(r.status, 429);
    ASSERT_TRUE(strcasestr(r.head, "retry-after: 1") != NULL);
    ASSERT_TRUE(strstr(r.body, "rate_limit_error") != NULL);
    ASSERT_TRUE(strstr(r.body, "\"code\":\"queue_full\"") != NULL);
    http_resp_free(&r);
    ASSERT_EQ_INT(errors_of(s.port, "queue_full"), 1);
    ASSERT_EQ_INT(fake_live(&s.f), 1); /* the running request is unaffected */
    close(fd);
    ASSERT_TRUE(fake_wait_live(&s.f, 0, 5000));
    srv_stop(&s);
    /* The server's own bound on requests in flight. */
    srv_init(&s);
    s.cfg.max_queue = 1;
    s.f.first_delay_ms = 60000;
    srv_start(&s);
    fd = open_stream(s.port, "{\"prompt\":\"a\",\"stream\":true}");
    ASSERT_TRUE(fake_wait_live(&s.f, 1, 5000));
    http_do(s.port, "POST", "/v1/completions", "{\"prompt\":\"a\"}", &r);
    ASSERT_EQ_INT(r.status, 429);
    http_resp_free(&r);
    close(fd);
    ASSERT_TRUE(fake_wait_live(&s.f, 0, 5000));
    srv_stop(&s);
}

static void test_engine_errors(void)
{
    struct srv s;
    srv_init(&s);
    s.f.end_err = KVF_E_PROTO_PEER_DOWN;
    s.f.end_after = 2;
    srv_start(&s);
    /* Every reason's series is there before anything failed, at 0; the client's own 400s are
     * not reasons of this counter. */
    static const char *const reasons[] = {
        "queue_full",      "pool_exhausted", "no_prefill",    "no_decode",
        "prefill_stalled", "worker_down",    "worker_failed", "kv_verification_failed",
        "out_of_memory",   "shutting_down",  "internal_error"};
    for (size_t i = 0; i < KVF_ARRAY_LEN(reasons); i++)
        if (errors_of(s.port, reasons[i]) != 0) KVF_FAIL("%s: not 0 at the start", reasons[i]);
    ASSERT_EQ_INT(errors_of(s.port, "context_length_exceeded"), -1);
    struct http_resp r;
    http_do(s.port, "POST", "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":5}", &r);
    ASSERT_EQ_INT(r.status, 502);
    ASSERT_TRUE(strstr(r.body, "\"server_error\"") != NULL);
    ASSERT_TRUE(strstr(r.body, "\"code\":\"worker_down\"") != NULL);
    ASSERT_TRUE(strstr(r.body, "went down") != NULL);
    ASSERT_EQ_INT(retry_after(&r), 2);
    http_resp_free(&r);
    ASSERT_EQ_INT(errors_of(s.port, "worker_down"), 1);
    /* Streaming: the tokens so far, then an error event with the same code, no [DONE]. */
    http_do(s.port, "POST", "/v1/completions",
            "{\"prompt\":\"hello\",\"max_tokens\":5,\"stream\":true}", &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(strstr(r.body, "data: {\"error\"") != NULL);
    ASSERT_TRUE(strstr(r.body, "\"code\":\"worker_down\"") != NULL);
    ASSERT_TRUE(strstr(r.body, "[DONE]") == NULL);
    http_resp_free(&r);
    ASSERT_EQ_INT(errors_reach(s.port, "worker_down", 2), 2);
    /* Each reason the engine gives after submit: status, code, Retry-After, one count. */
    static const struct {
        int err, status;
        const char *code;
        int retry;
    } ends[] = {
        {-EBUSY, 503, "pool_exhausted", 2},
        {KVF_E_ENGINE_NO_PREFILL, 503, "no_prefill", 5},
        {KVF_E_ENGINE_NO_DECODE, 503, "no_decode", 5},
        {KVF_E_PROTO_TIMEOUT, 503, "prefill_stalled", 2},
        {KVF_E_PROTO_FAILED, 502, "worker_failed", 1},
        {-EIO, 500, "internal_error", -1},
    };
    for (size_t i = 0; i < KVF_ARRAY_LEN(ends); i++) {
        pthread_mutex_lock(&s.f.mu);
        s.f.end_err = ends[i].err;
        s.f.end_after = 0;
        pthread_mutex_unlock(&s.f.mu);
        http_do(s.port, "POST", "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":5}", &r);
        printf("# %s: %d, Retry-After %d, %s\n", ends[i].code, r.status, retry_after(&r), r.body);
        ASSERT_EQ_INT(r.status, ends[i].status);
        char want[64];
        snprintf(want, sizeof want, "\"code\":\"%s\"", ends[i].code);
        ASSERT_TRUE(strstr(r.body, want) != NULL);
        ASSERT_EQ_INT(retry_after(&r), ends[i].retry);
        http_resp_free(&r);
        ASSERT_EQ_INT(errors_of(s.port, ends[i].code), 1);
    }
    /* Refused at submit: shutting down is no reason to retry here, so no Retry-After. */
    pthread_mutex_lock(&s.f.mu);
    s.f.submit_err = -ESHUTDOWN;
    pthread_mutex_unlock(&s.f.mu);
    http_do(s.port, "POST", "/v1/completions", "{\"prompt\":\"hello\"}", &r);
    ASSERT_EQ_INT(r.status, 503);
    ASSERT_TRUE(strstr(r.body, "\"code\":\"shutting_down\"") != NULL);
    ASSERT_EQ_INT(retry_after(&r), -1);
    http_resp_free(&r);
    ASSERT_EQ_INT(errors_of(s.port, "shutting_down"), 1);
    ASSERT_EQ_INT(errors_of(s.port, "worker_down"), 2);
    ASSERT_EQ_INT(errors_of(s.port, "queue_full"), 0);
    srv_stop(&s);
    /* A handoff that failed its check is the writer's fault, named as such: 502, never a 500. */
    static const int verify_errs[] = {KVF_E_PROTO_COUNT, KVF_E_PROTO_TRAILER, KVF_E_PROTO_CHECKSUM};
    for (size_t i = 0; i < sizeof verify_errs / sizeof verify_errs[0]; i++) {
        srv_init(&s);
        s.f.end_err = verify_errs[i];
        s.f.end_after = 0;
        srv_start(&s);
        http_do(s.port, "POST", "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":5}", &r);
        ASSERT_EQ_INT(r.status, 502);
        ASSERT_TRUE(strstr(r.body, "\"kv_verification_failed\"") != NULL);
        ASSERT_TRUE(strstr(r.body, kvf_strerror(verify_errs[i])) != NULL);
        http_resp_free(&r);
        srv_stop(&s);
    }
}

/* --- Disconnects become cancels, within about one poll interval. ---------------------------- */

static void expect_cancel_after_close(struct srv *s, int fd, const char *what)
{
    int64_t t0 = fake_now_ms();
    close(fd);
    int64_t tc = fake_wait_cancels(&s->f, 1, 3000);
    if (tc < 0) KVF_FAIL("%s: no cancel after the client closed", what);
    int64_t dt = tc - t0;
    printf("# %s: cancel %lld ms after the client closed\n", what, (long long)dt);
    ASSERT_TRUE(dt <= 150); /* KVF_SERVER_POLL_MS plus scheduling, with sanitizers */
    ASSERT_TRUE(fake_wait_live(&s->f, 0, 3000));
}

static void test_disconnect_streaming(void)
{
    struct srv s;
    srv_init(&s);
    s.f.token_delay_ms = 30;
    srv_start(&s);
    int fd = open_stream(s.port, "{\"prompt\":\"hello\",\"max_tokens\":400,\"stream\":true}");
    /* Read a few chunks, so the stream is running. */
    char buf[4096];
    size_t got = 0;
    int64_t until = fake_now_ms() + 5000;
    while (got < 600 && fake_now_ms() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) {
            ssize_t k = recv(fd, buf, sizeof buf, 0);
            ASSERT_TRUE(k > 0);
            got += (size_t)k;
        }
    }
    ASSERT_TRUE(got >= 600);
    expect_cancel_after_close(&s, fd, "streaming");
    srv_stop(&s);
}

static void test_disconnect_queued(void)
{
    struct srv s;
    srv_init(&s);
    s.f.first_delay_ms = 60000;
    srv_start(&s);
    int fd = open_stream(s.port, "{\"prompt\":\"hello\",\"stream\":true}");
    ASSERT_TRUE(fake_wait_live(&s.f, 1, 5000));
    usleep(100 * 1000);
    expect_cancel_after_close(&s, fd, "queued, streaming");
    srv_stop(&s);
}

static void test_disconnect_blocking(void)
{
    struct srv s;
    srv_init(&s);
    s.f.token_delay_ms = 50;
    srv_start(&s);
    int fd = open_stream(s.port, "{\"prompt\":\"hello\",\"max_tokens\":400}");
    ASSERT_TRUE(fake_wait_live(&s.f, 1, 5000));
    usleep(200 * 1000); /* tokens are being produced; nothing is sent yet */
    expect_cancel_after_close(&s, fd, "non-streaming");
    srv_stop(&s);
    /* Queued, non-streaming, n = 2: both choices cancelled. */
    srv_init(&s);
    s.f.first_delay_ms = 60000;
    srv_start(&s);
    fd = open_stream(s.port, "{\"prompt\":\"hello\",\"n\":2}");
    ASSERT_TRUE(fake_wait_live(&s.f, 2, 5000));
    usleep(100 * 1000);
    int64_t t0 = fake_now_ms();
    close(fd);
    int64_t tc = fake_wait_cancels(&s.f, 2, 3000);
    ASSERT_TRUE(tc >= 0);
    printf("# queued, non-streaming, n=2: both cancelled %lld ms after the close\n",
           (long long)(tc - t0));
    ASSERT_TRUE(tc - t0 <= 150);
    ASSERT_TRUE(fake_wait_live(&s.f, 0, 3000));
    srv_stop(&s);
}

/* Stop with requests in flight: they are cancelled, every thread joined, every handle
 * released (srv_stop checks), quickly. */
static void test_stop_in_flight(void)
{
    struct srv s;
    srv_init(&s);
    s.f.first_delay_ms = 60000;
    srv_start(&s);
    int a = open_stream(s.port, "{\"prompt\":\"hello\",\"stream\":true}");
    int b = open_stream(s.port, "{\"prompt\":\"hello\"}");
    int c = http_connect(s.port); /* an idle connection */
    ASSERT_TRUE(fake_wait_live(&s.f, 2, 5000));
    int64_t t0 = fake_now_ms();
    srv_stop(&s);
    printf("# stop with 2 requests in flight took %lld ms\n", (long long)(fake_now_ms() - t0));
    ASSERT_TRUE(fake_now_ms() - t0 < 2000);
    close(a);
    close(b);
    close(c);
}

/* Stop with drain: a request in flight finishes (200, whole text) before the server goes. */
static void *finish_one(void *arg)
{
    struct srv *s = arg;
    struct http_resp *r = calloc(1, sizeof *r);
    http_do(s->port, "POST", "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":20}", r);
    return r;
}

static void test_stop_drains(void)
{
    struct srv s;
    srv_init(&s);
    s.f.token_delay_ms = 10;
    s.cfg.drain_ms = 5000;
    srv_start(&s);
    pthread_t th;
    ASSERT_EQ_INT(pthread_create(&th, NULL, finish_one, &s), 0);
    ASSERT_TRUE(fake_wait_live(&s.f, 1, 5000));
    kvf_server_t *srv = s.s;
    s.s = NULL;
    kvf_server_stop(srv); /* returns once the request finished */
    void *res;
    pthread_join(th, &res);
    struct http_resp *r = res;
    ASSERT_EQ_INT(r->status, 200);
    char *want = echo_text(s.tok, "hello", 20);
    json_t *j = json_loads(r->body, 0, NULL);
    ASSERT_STREQ(jstr(choice(j, 0), "text", NULL), want);
    ASSERT_EQ_INT(fake_cancels(&s.f), 0);
    json_decref(j);
    free(want);
    http_resp_free(r);
    free(r);
    s.s = NULL;
    ASSERT_EQ_INT(fake_live(&s.f), 0);
    kvf_tokenizer_destroy(s.tok);
    fake_destroy(&s.f);
}

/* 16 streams at once, each with its own text, each complete. */
struct conc_arg {
    struct srv *s;
    int i;
    bool ok;
};
static void *conc_one(void *arg)
{
    struct conc_arg *a = arg;
    char body[256], prompt[32];
    snprintf(prompt, sizeof prompt, "req %d says hello", a->i);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":30,\"stream\":true}", prompt);
    struct http_resp r;
    http_do(a->s->port, "POST", "/v1/completions", body, &r);
    const char *finish;
    char *text = stream_text(r.body, false, &finish, NULL);
    char *want = echo_text(a->s->tok, prompt, 30);
    a->ok = r.status == 200 && strcmp(text, want) == 0;
    free(text);
    free(want);
    http_resp_free(&r);
    return NULL;
}

static void test_concurrent_streams(void)
{
    struct srv s;
    srv_init(&s);
    s.f.token_delay_ms = 2;
    srv_start(&s);
    pthread_t th[16];
    struct conc_arg a[16];
    for (int i = 0; i < 16; i++) {
        a[i] = (struct conc_arg){&s, i, false};
        ASSERT_EQ_INT(pthread_create(&th[i], NULL, conc_one, &a[i]), 0);
    }
    for (int i = 0; i < 16; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 16; i++)
        if (!a[i].ok) KVF_FAIL("stream %d wrong", i);
    ASSERT_EQ_INT(s.f.submits, 16);
    srv_stop(&s);
}

/* A request that takes longer than the idle timeout is still answered: the timeout is for
 * idle connections, not for generation time. */
static void test_slow_generation_not_idle(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.idle_timeout_s = 1;
    s.f.first_delay_ms = 1500;
    srv_start(&s);
    json_t *j =
        post_json(s.port, "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":2}", 200);
    json_decref(j);
    struct http_resp r;
    http_do(s.port, "POST", "/v1/completions",
            "{\"prompt\":\"hello\",\"max_tokens\":2,\"stream\":true}", &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(strstr(r.body, "[DONE]") != NULL);
    http_resp_free(&r);
    srv_stop(&s);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_health),
    KVF_CASE(test_models),
    KVF_CASE(test_completion),
    KVF_CASE(test_completion_token_ids),
    KVF_CASE(test_completion_stream),
    KVF_CASE(test_chat),
    KVF_CASE(test_tokenize_detokenize),
    KVF_CASE(test_stop_strings),
    KVF_CASE(test_n_choices),
    KVF_CASE(test_logprobs),
    KVF_CASE(test_stream_utf8),
    KVF_CASE(test_bad_bodies),
    KVF_CASE(test_limits_roundtrip),
    KVF_CASE(test_http_limits),
    KVF_CASE(test_queue_full),
    KVF_CASE(test_engine_errors),
    KVF_CASE(test_disconnect_streaming),
    KVF_CASE(test_disconnect_queued),
    KVF_CASE(test_disconnect_blocking),
    KVF_CASE(test_stop_in_flight),
    KVF_CASE(test_stop_drains),
    KVF_CASE(test_concurrent_streams),
    KVF_CASE(test_slow_generation_not_idle),
};

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    return KVF_TEST_MAIN(argc, argv, cases);
}
