/*
 * The server's pure parts, without HTTP: the body scan (UTF-8, nesting), request validation
 * and defaults, the default chat rendering, stop-string matching across token boundaries (a
 * run driven directly over the fake engine), and the answer to each engine error code.
 */
#include "server/server_internal.h"
#include "server_test_util.h"

static const struct kvf__srv_limits lim = {
    .n_vocab = 265, .served_limit = 300, .max_n = 4, .default_max_tokens = 256};

static int scan(const char *s)
{
    struct kvf__srv_err e;
    return kvf__srv_scan_body(s, strlen(s), KVF_SERVER_MAX_JSON_DEPTH, &e);
}

static void test_scan_utf8(void)
{
    ASSERT_EQ_INT(scan("{\"a\":\"h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}"), 0);
    const char *bad[] = {
        "\"\xff\"",
        "\"\xc0\xaf\"",
        "\"\xc1\xbf\"", /* overlong 2-byte */
        "\"\xe0\x80\xaf\"",
        "\"\xf0\x80\x80\xaf\"", /* overlong 3, 4 */
        "\"\xed\xa0\x80\"",
        "\"\xed\xbf\xbf\"", /* surrogates */
        "\"\xf4\x90\x80\x80\"",
        "\"\xf5\x80\x80\x80\"", /* beyond U+10FFFF */
        "\"\xc3\"",
        "\"\xe2\x82\"",
        "\"\x80\"", /* truncated, stray */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (scan(bad[i]) != -1) KVF_FAIL("bad UTF-8 case %zu accepted", i);
    struct kvf__srv_err e;
    ASSERT_EQ_INT(kvf__srv_scan_body("{\"a\":\"\0\"}", 9, 64, &e), -1); /* a raw NUL */
    ASSERT_EQ_INT(e.status, 400);
}

static void test_scan_depth(void)
{
    char buf[300];
    for (int depth = 63; depth <= 65; depth++) {
        int k = 0;
        for (int i = 0; i < depth; i++)
            buf[k++] = '[';
        for (int i = 0; i < depth; i++)
            buf[k++] = ']';
        buf[k] = 0;
        ASSERT_EQ_INT(scan(buf), depth <= 64 ? 0 : -1);
    }
    /* Brackets inside strings, and escaped quotes, do not count. */
    char s[400];
    strcpy(s, "{\"a\":\"");
    for (int i = 0; i < 100; i++)
        strcat(s, "[{");
    strcat(s, "\\\"[[\"}");
    ASSERT_EQ_INT(scan(s), 0);
    /* A million '[' is refused in one pass (no recursion, no allocation). */
    size_t n = 1000000;
    char *deep = malloc(n + 1);
    memset(deep, '[', n);
    deep[n] = 0;
    struct kvf__srv_err e;
    ASSERT_EQ_INT(kvf__srv_scan_body(deep, n, 64, &e), -1);
    ASSERT_TRUE(strstr(e.message, "deeper than 64") != NULL);
    free(deep);
}

static void test_req_defaults(void)
{
    kvf_tokenizer_t *tok = test_tokenizer();
    struct kvf__srv_req r;
    struct kvf__srv_err e;
    const char *body = "{\"prompt\":[5,6,7]}";
    ASSERT_OK(kvf__srv_req_parse(KVF__SRV_COMPLETION, body, strlen(body), &lim, tok, &r, &e));
    ASSERT_EQ_INT(r.n_prompt, 3);
    ASSERT_EQ_INT(r.max_tokens, 256); /* the cap */
    ASSERT_NEAR(r.sample.temperature, 1.0, 0);
    ASSERT_NEAR(r.sample.top_p, 1.0, 0);
    ASSERT_EQ_INT(r.sample.top_k, 0);
    ASSERT_FALSE(r.seed_given);
    ASSERT_EQ_INT(r.n, 1);
    ASSERT_FALSE(r.stream || r.logprobs || r.ignore_eos);
    kvf__srv_req_free(&r);
    /* Near the limit the default is the rest. */
    char big[2048];
    int k = snprintf(big, sizeof big, "{\"prompt\":[");
    for (int i = 0; i < 100; i++)
        k += snprintf(big + k, sizeof big - (size_t)k, "%s5", i ? "," : "");
    snprintf(big + k, sizeof big - (size_t)k,
             "],\"stop\":[\"ab\",\"\xc3\xa9\"],\"n\":2,\"stream\":true}");
    ASSERT_OK(kvf__srv_req_parse(KVF__SRV_COMPLETION, big, strlen(big), &lim, tok, &r, &e));
    ASSERT_EQ_INT(r.max_tokens, 200);
    ASSERT_EQ_INT(r.n_stop, 2);
    ASSERT_STREQ(r.stop[1], "\xc3\xa9");
    ASSERT_EQ_INT(r.n, 2);
    ASSERT_TRUE(r.stream);
    kvf__srv_req_free(&r);
    /* The prompt alone at the limit: refused with the numbers. */
    struct kvf__srv_limits small = lim;
    small.served_limit = 100;
    ASSERT_EQ_INT(kvf__srv_req_parse(KVF__SRV_COMPLETION, big, strlen(big), &small, tok, &r, &e),
                  -1);
    ASSERT_STREQ(e.message, "This model's maximum context length is 100 tokens; you requested 101 "
                            "tokens (100 in the prompt, 1 to generate)");
    ASSERT_STREQ(e.param, "prompt");
    kvf_tokenizer_destroy(tok);
}

static void test_chat_render(void)
{
    struct kvf_server_chat_msg m[] = {
        {"system", "Be brief.", 9}, {"user", "Hi", 2}, {"assistant", "Hello", 5}, {"user", "", 0}};
    char *out;
    size_t len;
    ASSERT_OK(kvf_server_chat_render(m, 4, &out, &len));
    ASSERT_STREQ(out, "system: Be brief.\nuser: Hi\nassistant: Hello\nuser: \nassistant:");
    ASSERT_EQ_INT(len, strlen(out));
    free(out);
    ASSERT_ERR(kvf_server_chat_render(m, 0, &out, &len), -EINVAL);
}

/* Runs a completion over a scripted fake engine and returns the text (malloc'd). */
static char *run_script(const int32_t *script, uint32_t n_script, uint32_t max_tokens,
                        const char *const *stops, uint32_t n_stops, const char **finish,
                        uint32_t *cancels)
{
    kvf_tokenizer_t *tok = test_tokenizer();
    struct fake_engine f;
    fake_init(&f, kvf_tokenizer_n_vocab(tok), 512);
    f.script = script;
    f.n_script = n_script;
    struct kvf__srv_req req;
    memset(&req, 0, sizeof req);
    req.prompt = malloc(sizeof(int32_t));
    req.prompt[0] = 5;
    req.n_prompt = 1;
    req.max_tokens = max_tokens;
    req.n = 1;
    for (uint32_t i = 0; i < n_stops; i++) {
        req.stop[i] = strdup(stops[i]);
        req.stop_len[i] = strlen(stops[i]);
    }
    req.n_stop = n_stops;
    struct kvf__srv_run *run;
    ASSERT_OK(kvf__srv_run_start(&fake_ops, &f, tok, &req, "m", 0, &run));
    int64_t until = fake_now_ms() + 5000;
    while (!kvf__srv_run_done(run) && fake_now_ms() < until)
        kvf__srv_run_step(run, 20);
    ASSERT_TRUE(kvf__srv_run_done(run));
    ASSERT_EQ_INT(run->failed, 0);
    char *text = strdup(run->ch[0].text.p ? run->ch[0].text.p : "");
    ASSERT_TRUE(utf8_ok(text, strlen(text)));
    *finish = run->ch[0].finish;
    kvf__srv_run_free(run);
    *cancels = f.cancels;
    ASSERT_EQ_INT(f.live, 0);
    fake_destroy(&f);
    kvf_tokenizer_destroy(tok);
    return text;
}

static void test_stop_matching(void)
{
    int32_t abc[6];
    const char *w = "abcdef";
    for (int i = 0; i < 6; i++)
        abc[i] = byte_tok((unsigned char)w[i]);
    const char *finish;
    uint32_t cancels;
    struct {
        const char *stops[4];
        uint32_t n_stops, max_tokens;
        const char *want, *finish;
    } cases[] = {
        {{"cde"}, 1, 20, "ab", "stop"},                    /* across three tokens */
        {{"a"}, 1, 20, "", "stop"},                        /* at the very start */
        {{"fab"}, 1, 20, "abcde", "stop"},                 /* across the cycle */
        {{"ef", "bc"}, 2, 20, "a", "stop"},                /* the earliest match wins */
        {{"xyz", "dex"}, 2, 20, "abcdefabcdef", "length"}, /* prefixes held, then released */
        {{"cdx"}, 1, 4, "abcd", "length"}, /* a held prefix released at max_tokens */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t mt = cases[i].max_tokens == 20 && strcmp(cases[i].finish, "length") == 0
                          ? 12
                          : cases[i].max_tokens;
        char *t = run_script(abc, 6, mt, cases[i].stops, cases[i].n_stops, &finish, &cancels);
        if (strcmp(t, cases[i].want) != 0)
            KVF_FAIL("case %zu: \"%s\" != \"%s\"", i, t, cases[i].want);
        ASSERT_STREQ(finish, cases[i].finish);
        ASSERT_EQ_INT(cancels, strcmp(cases[i].finish, "stop") == 0 ? 1 : 0);
        free(t);
    }
    /* A multibyte stop string split over byte tokens: "é" = C3 A9. */
    int32_t s2[4] = {byte_tok('x'), byte_tok(0xC3), byte_tok(0xA9), byte_tok('y')};
    const char *stop_e[] = {"\xc3\xa9"};
    char *t = run_script(s2, 4, 20, stop_e, 1, &finish, &cancels);
    ASSERT_STREQ(t, "x");
    free(t);
    /* A stop string that begins with a character split over byte tokens. */
    int32_t s3[3] = {byte_tok(0xC3), byte_tok(0xA9), byte_tok('z')};
    const char *stop_z[] = {"\xc3\xa9z"};
    t = run_script(s3, 3, 20, stop_z, 1, &finish, &cancels);
    ASSERT_STREQ(t, "");
    free(t);
}

/* --- Client addresses: the trusted-proxy list and the forwarded client. ------------------------
 */

static struct kvf__srv_addr A(const char *s) {
    struct kvf__srv_addr a;
    if (!kvf__srv_addr_parse(s, strlen(s), true, &a)) KVF_FAIL("'%s' did not parse", s);
    return a;
}

static void
expect_client(const struct kvf__srv_cidr *l, size_t n, const char *fwd, const char *xff,
              const char *peer, const char *want)
{
    struct kvf__srv_addr c = A(peer), w = A(want);
    kvf__srv_forwarded_client(l, n, fwd, xff, &c);
    char got[64];
    kvf__srv_addr_format(&c, got, sizeof got);
    if (memcmp(&c, &w, sizeof c) != 0)
        KVF_FAIL("Forwarded %s / X-Forwarded-For %s from %s: client %s, wanted %s", fwd ? fwd : "-",
                 xff ? xff : "-", peer, got, want);
}

static void test_forwarded_client(void)
{
    struct kvf__srv_cidr *l;
    size_t n;
    char err[200];
    ASSERT_OK(
        kvf__srv_cidrs_parse(" 10.0.0.0/8, 192.168.1.7 ,2001:db8::/32", &l, &n, err, sizeof err));
    ASSERT_EQ_INT(n, 3);
    struct kvf__srv_addr a = A("10.200.3.4");
    ASSERT_TRUE(kvf__srv_trusted(l, n, &a));
    a = A("11.0.0.1");
    ASSERT_FALSE(kvf__srv_trusted(l, n, &a));
    a = A("192.168.1.8");
    ASSERT_FALSE(kvf__srv_trusted(l, n, &a));
    a = A("[2001:db8:1::5]:80");
    ASSERT_TRUE(kvf__srv_trusted(l, n, &a));
    a = A("::ffff:10.1.1.1"); /* the IPv4-mapped form is the same address */
    ASSERT_TRUE(kvf__srv_trusted(l, n, &a));
    /* X-Forwarded-For: the last hop that is not trusted. */
    expect_client(l, n, NULL, "203.0.113.9", "10.0.0.1", "203.0.113.9");
    expect_client(l, n, NULL, "1.1.1.1, 203.0.113.9, 10.3.3.3", "10.0.0.1", "203.0.113.9");
    expect_client(l, n, NULL, "1.1.1.1,203.0.113.9:5555", "192.168.1.7", "203.0.113.9");
    expect_client(l, n, NULL, "10.1.1.1, 10.2.2.2", "10.0.0.1", "10.1.1.1"); /* all trusted */
    expect_client(l, n, NULL, "garbage, unknown", "10.0.0.1", "10.0.0.1");   /* no address */
    expect_client(l, n, NULL, "203.0.113.9, unknown", "10.0.0.1", "10.0.0.1");
    expect_client(l, n, NULL, "", "10.0.0.1", "10.0.0.1");
    /* Forwarded wins over X-Forwarded-For; its for= may be quoted, bracketed, with a port. */
    expect_client(l, n, "for=198.51.100.2;proto=https, for=\"[2001:db8::1]:4711\"", "9.9.9.9",
                  "10.0.0.1", "198.51.100.2");
    expect_client(l, n, "For=\"[2001:db9::1]:4711\";by=x", NULL, "10.0.0.1", "2001:db9::1");
    expect_client(l, n, "proto=http;for=203.0.113.1", NULL, "10.0.0.1", "203.0.113.1");
    expect_client(l, n, "for=_hidden", NULL, "10.0.0.1", "10.0.0.1");
    free(l);
    static const char *const bad[] = {"10.0.0.0/33",  "fe80::/129",         "10.0.0.1/",
                                      "host.example", "10.0.0.1,,10.0.0.2", "1.2.3.4/8x"};
    for (size_t i = 0; i < KVF_ARRAY_LEN(bad); i++) {
        if (kvf__srv_cidrs_parse(bad[i], &l, &n, err, sizeof err) != -EINVAL)
            KVF_FAIL("'%s' was taken", bad[i]);
        ASSERT_NULL(l);
    }
    ASSERT_OK(kvf__srv_cidrs_parse(NULL, &l, &n, err, sizeof err));
    ASSERT_EQ_INT(n, 0);
}

/* Every engine code's answer, written out here rather than read from kvf__srv_reasons: a
 * change to the mapping (a status, a code, a Retry-After, a message that no longer says what
 * ran out or stopped) fails this table. retry: seconds, 0 the server's own value (a 429's), -1
 * none. */
static void test_engine_error_map(void)
{
    static const struct {
        int err, status;
        const char *code, *type;
        int retry;
        const char *says; /* the message names the cause */
    } want[] = {
        {-EAGAIN, 429, "queue_full", "rate_limit_error", 0, "queue"},
        {-EBUSY, 503, "pool_exhausted", "server_error", 2, "KV pool pages"},
        {KVF_E_ENGINE_NO_PREFILL, 503, "no_prefill", "server_error", 5,
         "no prefill worker is connected"},
        {KVF_E_ENGINE_NO_DECODE, 503, "no_decode", "server_error", 5,
         "no decode worker is connected"},
        {KVF_E_PROTO_TIMEOUT, 503, "prefill_stalled", "server_error", 2,
         "the prefill worker stopped making progress on this prompt"},
        {KVF_E_PROTO_PEER_DOWN, 502, "worker_down", "server_error", 2, "went down"},
        {KVF_E_PROTO_FAILED, 502, "worker_failed", "server_error", 1,
         "the prefill worker reported a failure"},
        {KVF_E_PROTO_COUNT, 502, "kv_verification_failed", "server_error", 1,
         "tokens written differ from tokens reserved"},
        {KVF_E_PROTO_TRAILER, 502, "kv_verification_failed", "server_error", 1,
         "trailer does not match"},
        {KVF_E_PROTO_CHECKSUM, 502, "kv_verification_failed", "server_error", 1,
         "checksum mismatch"},
        {-ENOMEM, 503, "out_of_memory", "server_error", 2, "out of memory"},
        {-ESHUTDOWN, 503, "shutting_down", "server_error", -1, "shutting down"},
        {KVF_E_PROTO_CANCELLED, 503, "shutting_down", "server_error", -1, "shutting down"},
        {KVF_E_PROTO_REJECTED, 400, "context_length_exceeded", "invalid_request_error", -1,
         "context limit"},
        {-EINVAL, 400, "invalid_request", "invalid_request_error", -1, "refused"},
        {KVF_E_POOL_FULL, 500, "internal_error", "server_error", -1, "pool: "},
        {-EIO, 500, "internal_error", "server_error", -1, "(Input/output error)"},
    };
    bool reached[KVF__SRV_N_REASONS] = {false};
    for (size_t i = 0; i < KVF_ARRAY_LEN(want); i++) {
        struct kvf__srv_err e;
        memset(&e, 0x5a, sizeof e);
        kvf__srv_engine_error(want[i].err, &e);
        printf("# %d: %d %s Retry-After %d: %s\n", want[i].err, e.status, e.code, e.retry_after_s,
               e.message);
        ASSERT_EQ_INT(e.status, want[i].status);
        ASSERT_STREQ(e.code, want[i].code);
        ASSERT_STREQ(e.type, want[i].type);
        ASSERT_NULL(e.param);
        ASSERT_EQ_INT(e.retry_after_s, want[i].retry == 0  ? KVF__SRV_RETRY_DEFAULT
                                       : want[i].retry < 0 ? KVF__SRV_RETRY_NONE
                                                           : want[i].retry);
        if (!strstr(e.message, want[i].says))
            KVF_FAIL("%s: message \"%s\" does not say \"%s\"", e.code, e.message, want[i].says);
        ASSERT_TRUE(strstr(e.message, "no capacity") == NULL);
        /* The reason the metric counts is the one the client was told. */
        int k = kvf__srv_reason_by_code(e.code);
        ASSERT_EQ_INT(k, kvf__srv_reason_of(want[i].err));
        reached[k] = true;
        /* The OpenAI shape: {"error": {"message", "type", "param": null, "code"}}. */
        json_t *j = kvf__srv_err_json(&e);
        json_t *o = json_object_get(j, "error");
        ASSERT_STREQ(json_string_value(json_object_get(o, "message")), e.message);
        ASSERT_STREQ(json_string_value(json_object_get(o, "type")), want[i].type);
        ASSERT_STREQ(json_string_value(json_object_get(o, "code")), want[i].code);
        ASSERT_TRUE(json_is_null(json_object_get(o, "param")));
        json_decref(j);
    }
    /* Every reason is some code's, and no two reasons share a code (the metric's label). */
    for (int k = 0; k < KVF__SRV_N_REASONS; k++) {
        if (!reached[k]) KVF_FAIL("reason %s is no code's", kvf__srv_reasons[k].code);
        ASSERT_EQ_INT(kvf__srv_reason_by_code(kvf__srv_reasons[k].code), k);
    }
    ASSERT_EQ_INT(kvf__srv_reason_by_code("tenant_limit"), -1);
    ASSERT_EQ_INT(kvf__srv_reason_by_code(NULL), -1);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_scan_utf8),        KVF_CASE(test_scan_depth),    KVF_CASE(test_req_defaults),
    KVF_CASE(test_chat_render),      KVF_CASE(test_stop_matching), KVF_CASE(test_forwarded_client),
    KVF_CASE(test_engine_error_map),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
