/*
 * Tenants and observability over the fake engine: the key file's parser and constant-time
 * lookup, 401 without a valid key (nothing of the key echoed), the key's tenant reaching the
 * engine, per-tenant limits (two tenants: one over its share gets 429 with Retry-After while
 * the other is served), the log lines (events present; no canary of a prompt, an output or a
 * key anywhere — BAD_INPUTS row 8) and GET /metrics checked by `promtool check metrics` (the
 * test fails without promtool: scripts/install-deps.sh installs it).
 */
#include <math.h>
#include <sys/wait.h>

#include "server_test_util.h"

/* --- Captured logs. ------------------------------------------------------------------------ */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *p;
    size_t n, cap;
} logbuf;

static void capture_log(void *arg, const char *line)
{
    (void)arg;
    pthread_mutex_lock(&log_mu);
    size_t k = strlen(line);
    if (logbuf.n + k + 2 > logbuf.cap) {
        logbuf.cap = (logbuf.n + k + 2) * 2;
        logbuf.p = realloc(logbuf.p, logbuf.cap);
    }
    memcpy(logbuf.p + logbuf.n, line, k);
    logbuf.n += k;
    logbuf.p[logbuf.n++] = '\n';
    logbuf.p[logbuf.n] = 0;
    pthread_mutex_unlock(&log_mu);
}

static void log_reset(void)
{
    pthread_mutex_lock(&log_mu);
    free(logbuf.p);
    memset(&logbuf, 0, sizeof logbuf);
    pthread_mutex_unlock(&log_mu);
}

/* --- Requests with a key. ------------------------------------------------------------------ */
static void http_auth(uint16_t port, const char *method, const char *path, const char *auth,
                      const char *body, struct http_resp *r)
{
    int fd = http_connect(port);
    char head[1024], ah[512] = "";
    if (auth) snprintf(ah, sizeof ah, "Authorization: %s\r\n", auth);
    size_t bl = body ? strlen(body) : 0;
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, ah, bl);
    http_send_all(fd, head, (size_t)hn);
    if (bl) http_send_all(fd, body, bl);
    size_t n;
    char *raw = http_read_all(fd, &n, 10000);
    close(fd);
    http_parse(raw, n, r);
    free(raw);
}

static int open_stream_auth(uint16_t port, const char *auth, const char *body)
{
    int fd = http_connect(port);
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      auth, strlen(body));
    http_send_all(fd, head, (size_t)hn);
    http_send_all(fd, body, strlen(body));
    return fd;
}

#define KEY_A "sk-alpha-0123456789"
#define KEY_B "sk-bravo-9876543210"
static const char keyfile[] = "# tenants\n"
                              "\n" KEY_A " alpha\r\n"
                              "  " KEY_B "\tbravo   \n"
                              "sk-alpha-second-key alpha\n";

static kvf_server_keys_t *test_keys(void)
{
    kvf_server_keys_t *k;
    char err[256];
    ASSERT_OK(kvf_server_keys_parse(keyfile, sizeof keyfile - 1, &k, err, sizeof err));
    return k;
}

static void test_keys_parse(void)
{
    kvf_server_keys_t *k = test_keys();
    ASSERT_EQ_INT(kvf_server_keys_count(k), 3);
    ASSERT_EQ_INT(kvf_server_keys_n_tenants(k), 2);
    ASSERT_STREQ(kvf_server_keys_tenant_name(k, 1), "alpha");
    ASSERT_STREQ(kvf_server_keys_tenant_name(k, 2), "bravo");
    ASSERT_EQ_INT(kvf_server_keys_lookup(k, KEY_A, strlen(KEY_A)), 1);
    ASSERT_EQ_INT(kvf_server_keys_lookup(k, KEY_B, strlen(KEY_B)), 2);
    ASSERT_EQ_INT(kvf_server_keys_lookup(k, "sk-alpha-second-key", 19), 1);
    ASSERT_EQ_INT(kvf_server_keys_lookup(k, KEY_A, strlen(KEY_A) - 1), 0); /* a prefix */
    ASSERT_EQ_INT(kvf_server_keys_lookup(k, KEY_A "x", strlen(KEY_A) + 1), 0);
    ASSERT_EQ_INT(kvf_server_keys_lookup(k, "", 0), 0);
    char big[600];
    memset(big, 'a', sizeof big);
    ASSERT_EQ_INT(kvf_server_keys_lookup(k, big, sizeof big), 0);
    kvf_server_keys_free(k);

    static const struct {
        const char *text, *line;
    } bad[] = {
        {"sk-secret-canary-1\n", "line 1"},
        {"# c\nsk-secret-canary-1 a b\n", "line 2"},
        {"short a\n", "line 1"},
        {"sk-secret-canary-1 _reserved\n", "line 1"},
        {"sk-secret-canary-1 bad/name\n", "line 1"},
        {"sk-secret-canary-1 a\n\nsk-secret-canary-1 b\n", "line 3"},
        {"sk-secret-canary-\x01 a\n", "line 1"},
        {"# only comments\n\n", "no keys"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        kvf_server_keys_t *o = NULL;
        ASSERT_EQ_INT(kvf_server_keys_parse(bad[i].text, strlen(bad[i].text), &o, err, sizeof err),
                      -EINVAL);
        ASSERT_TRUE(o == NULL);
        if (!strstr(err, bad[i].line))
            KVF_FAIL("case %zu: '%s' does not name %s", i, err, bad[i].line);
        if (strstr(err, "canary")) KVF_FAIL("case %zu: the error echoes the key: %s", i, err);
    }
    /* From a file; a missing file names itself. */
    char path[256], err[256];
    snprintf(path, sizeof path, "/tmp/kvf_keys_%d", (int)getpid());
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fputs(keyfile, f);
    fclose(f);
    ASSERT_OK(kvf_server_keys_load(path, &k, err, sizeof err));
    ASSERT_EQ_INT(kvf_server_keys_count(k), 3);
    kvf_server_keys_free(k);
    unlink(path);
    ASSERT_TRUE(kvf_server_keys_load(path, &k, err, sizeof err) == -ENOENT);
    ASSERT_TRUE(strstr(err, path) != NULL);
}

static void test_auth(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *k = test_keys();
    s.cfg.keys = k;
    srv_start(&s);
    const char *body = "{\"prompt\":\"hello\",\"max_tokens\":2}";
    static const char *const refused[] = {NULL,           "Bearer",
                                          "Bearer ",      "Bearer sk-wrong-key-canary",
                                          "Basic " KEY_A, "Bearer " KEY_A "x"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        struct http_resp r;
        http_auth(s.port, "POST", "/v1/completions", refused[i], body, &r);
        if (r.status != 401) KVF_FAIL("case %zu: status %d, wanted 401", i, r.status);
        ASSERT_TRUE(strcasestr(r.head, "www-authenticate: bearer") != NULL);
        ASSERT_TRUE(strstr(r.body, "\"invalid_api_key\"") != NULL);
        ASSERT_TRUE(strstr(r.body, "canary") == NULL && strstr(r.body, "sk-alpha") == NULL);
        ASSERT_TRUE(strstr(r.head, "canary") == NULL);
        http_resp_free(&r);
    }
    ASSERT_EQ_INT(s.f.submits, 0);
    struct http_resp r;
    http_auth(s.port, "GET", "/v1/models", NULL, NULL, &r);
    ASSERT_EQ_INT(r.status, 401);
    http_resp_free(&r);
    http_auth(s.port, "GET", "/health", NULL, NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    http_auth(s.port, "GET", "/metrics", NULL, NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(
        strstr(r.body, "kvfence_requests_total{tenant=\"_none\",outcome=\"unauthorized\"} 7") !=
        NULL);
    http_resp_free(&r);
    /* Each key's tenant reaches the engine; the scheme's case does not matter. */
    http_auth(s.port, "POST", "/v1/completions", "Bearer " KEY_A, body, &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    http_auth(s.port, "POST", "/v1/completions", "bearer   " KEY_B "  ", body, &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    http_auth(s.port, "GET", "/v1/models", "Bearer sk-alpha-second-key", NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    ASSERT_EQ_INT(s.f.submits, 2);
    ASSERT_EQ_INT(s.f.params[0].tenant, 1);
    ASSERT_EQ_INT(s.f.params[1].tenant, 2);
    srv_stop(&s);
    kvf_server_keys_free(k);
}

/* The value of the series `name` (with its labels, exactly) in a /metrics body, or -1. */
static long long metric(const char *body, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = body; (p = strstr(p, series)); p += n)
        if ((p == body || p[-1] == '\n') && p[n] == ' ') return atoll(p + n + 1);
    return -1;
}

static char *get_metrics(uint16_t port)
{
    struct http_resp r;
    http_auth(port, "GET", "/metrics", NULL, NULL, &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(strcasestr(r.head, "content-type: text/plain; version=0.0.4") != NULL);
    char *b = r.body;
    r.body = NULL;
    http_resp_free(&r);
    return b;
}

/* --- Shares count what a request takes. ---------------------------------------------------------
 */

/* The 400 of a request that can never fit its tenant's share: at once, naming the bound. */
static void expect_share_400(uint16_t port, const char *auth, const char *body, const char *param,
                             const char *bound)
{
    struct http_resp r;
    int64_t t0 = fake_now_ms();
    http_auth(port, "POST", "/v1/completions", auth, body, &r);
    if (r.status != 400) KVF_FAIL("%s: status %d (%s), wanted 400", body, r.status, r.body);
    ASSERT_LT_INT(fake_now_ms() - t0, 2000);
    ASSERT_NOT_NULL(strstr(r.body, "\"tenant_share_exceeded\""));
    char p[64];
    snprintf(p, sizeof p, "\"param\":\"%s\"", param);
    if (!strstr(r.body, p)) KVF_FAIL("%s: %s does not name %s", body, r.body, param);
    if (!strstr(r.body, bound)) KVF_FAIL("%s: %s does not name %s", body, r.body, bound);
    http_resp_free(&r);
}

/* Two tenants over a pool of 64 pages (1024 tokens): the default KV share is 512 tokens each.
 * alpha's n = 8 request takes all of its share (8 × 64 tokens); a second one waits and gets 429,
 * never reaching the engine, and bravo's n = 8 request is served meanwhile from the half of the
 * pool alpha cannot take. */
static void test_share_counts_choices_and_kv(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *k = test_keys();
    s.cfg.keys = k;
    s.cfg.max_n = 8;
    s.cfg.tenant_wait_ms = 300;
    s.cfg.retry_after_s = 2;
    s.f.pool_pages = 64;
    s.f.first_delay_ms = 60000;
    s.f.slow_tenant = 1; /* alpha's requests hold their pages */
    srv_start(&s);
    const char *A = "Bearer " KEY_A, *B = "Bearer " KEY_B;
    const char *n8 = "{\"prompt\":[5,6],\"max_tokens\":62,\"n\":8}";
    int a1 =
        open_stream_auth(s.port, A, "{\"prompt\":[5,6],\"max_tokens\":62,\"n\":8,\"stream\":true}");
    ASSERT_TRUE(fake_wait_live(&s.f, 8, 5000));
    /* alpha's second n = 8: over its share now, so it waits, then 429 — it never reaches the
     * engine (where it would hold the rest of the pool until its client went away). */
    int a2 =
        open_stream_auth(s.port, A, "{\"prompt\":[5,6],\"max_tokens\":62,\"n\":8,\"stream\":true}");
    char head[4096];
    size_t hn = 0;
    for (int64_t until = fake_now_ms() + 3000; hn < sizeof head - 1 && !strstr(head, "\r\n\r\n");) {
        struct pollfd pf = {.fd = a2, .events = POLLIN};
        if (fake_now_ms() >= until)
            KVF_FAIL("alpha's second n=8 got no answer: admitted past its share");
        if (poll(&pf, 1, 50) <= 0) continue;
        ssize_t got = recv(a2, head + hn, sizeof head - 1 - hn, 0);
        if (got <= 0) break;
        hn += (size_t)got;
        head[hn] = 0;
    }
    head[hn] = 0;
    struct http_resp r;
    http_parse(head, hn, &r);
    close(a2);
    if (r.status != 429)
        KVF_FAIL("alpha's second n=8: status %d (%s), wanted 429", r.status, r.body);
    ASSERT_TRUE(strcasestr(r.head, "retry-after: 2") != NULL);
    ASSERT_NOT_NULL(strstr(r.body, "\"tenant_limit\""));
    http_resp_free(&r);
    ASSERT_EQ_INT(s.f.submits, 8);
    /* bravo is served in full, twice, from the other half of the pool. */
    for (int i = 0; i < 2; i++) {
        http_auth(s.port, "POST", "/v1/completions", B, n8, &r);
        if (r.status != 200) KVF_FAIL("bravo's n=8: status %d (%s)", r.status, r.body);
        json_t *j = json_loads(r.body, 0, NULL);
        ASSERT_EQ_INT(json_array_size(json_object_get(j, "choices")), 8);
        json_decref(j);
        http_resp_free(&r);
    }
    char *m = get_metrics(s.port);
    ASSERT_EQ_INT(metric(m, "kvfence_tenant_sequences{tenant=\"alpha\"}"), 8);
    ASSERT_EQ_INT(metric(m, "kvfence_tenant_kv_tokens{tenant=\"alpha\"}"), 512);
    ASSERT_EQ_INT(metric(m, "kvfence_tenant_requests{tenant=\"alpha\",state=\"running\"}"), 1);
    free(m);
    /* More than alpha's share in one request: 400 at once, naming the bound. */
    expect_share_400(s.port, A, "{\"prompt\":[5,6],\"max_tokens\":300,\"n\":2}", "max_tokens",
                     "--tenant-max-kv-tokens");
    expect_share_400(s.port, B, "{\"prompt\":[5,6],\"max_tokens\":100,\"n\":8}", "max_tokens",
                     "at most 512");
    ASSERT_EQ_INT(s.f.submits, 24);
    close(a1);
    ASSERT_TRUE(fake_wait_live(&s.f, 0, 5000));
    for (int i = 0; i < 250; i++) {
        m = get_metrics(s.port);
        if (metric(m, "kvfence_tenant_kv_tokens{tenant=\"alpha\"}") == 0) break;
        free(m);
        m = NULL;
        usleep(20000);
    }
    ASSERT_NOT_NULL(m);
    ASSERT_EQ_INT(metric(m, "kvfence_tenant_sequences{tenant=\"alpha\"}"), 0);
    free(m);
    srv_stop(&s);
    kvf_server_keys_free(k);
}

/* tenant_max_running counts sequences: n = 8 within a share of 4 is 400 naming the bound; n = 4
 * takes all of it; one more choice waits its turn (429 here: no queue). An explicit KV share
 * bounds a lone tenant too. */
static void test_share_running_counts_sequences(void)
{
    struct srv s;
    srv_init(&s);
    s.cfg.max_n = 8;
    s.cfg.tenant_max_running = 4;
    s.cfg.tenant_max_kv_tokens = 256;
    s.f.first_delay_ms = 60000;
    srv_start(&s);
    expect_share_400(s.port, NULL, "{\"prompt\":[5,6],\"max_tokens\":4,\"n\":8}", "n",
                     "--tenant-max-running");
    expect_share_400(s.port, NULL, "{\"prompt\":[5,6],\"max_tokens\":300}", "max_tokens",
                     "--tenant-max-kv-tokens");
    int a = open_stream_auth(s.port, "Bearer x",
                             "{\"prompt\":[5,6],\"max_tokens\":4,\"n\":4,\"stream\":true}");
    ASSERT_TRUE(fake_wait_live(&s.f, 4, 5000));
    struct http_resp r;
    http_auth(s.port, "POST", "/v1/completions", NULL, "{\"prompt\":[5,6],\"max_tokens\":4}", &r);
    ASSERT_EQ_INT(r.status, 429);
    ASSERT_TRUE(strcasestr(r.head, "retry-after:") != NULL);
    http_resp_free(&r);
    ASSERT_EQ_INT(s.f.submits, 4);
    close(a);
    ASSERT_TRUE(fake_wait_live(&s.f, 0, 5000));
    srv_stop(&s);
}

/* /tokenize and /detokenize: a key is needed when keys are configured; each runs as one sequence
 * of the tenant's share (alpha, at its share, gets 429 while bravo is answered); the body is
 * bounded by tokenize_max_bytes (413 beyond it, while a completion of that size is served). */
static void test_tokenize_in_share(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *k = test_keys();
    s.cfg.keys = k;
    s.cfg.tenant_max_running = 1;
    s.cfg.tokenize_max_bytes = 2048;
    s.f.first_delay_ms = 60000;
    s.f.slow_tenant = 1;
    srv_start(&s);
    const char *A = "Bearer " KEY_A, *B = "Bearer " KEY_B;
    struct http_resp r;
    http_auth(s.port, "POST", "/tokenize", NULL, "{\"prompt\":\"hello\"}", &r);
    ASSERT_EQ_INT(r.status, 401);
    http_resp_free(&r);
    http_auth(s.port, "POST", "/detokenize", "Bearer sk-wrong-key-000", "{\"tokens\":[5]}", &r);
    ASSERT_EQ_INT(r.status, 401);
    http_resp_free(&r);
    http_auth(s.port, "POST", "/tokenize", A, "{\"prompt\":\"hello world\"}", &r);
    ASSERT_EQ_INT(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    ASSERT_NOT_NULL(j);
    ASSERT_EQ_INT(json_integer_value(json_object_get(j, "count")),
                  kvf_tokenizer_encode(s.tok, "hello world", 11, true, NULL, 0));
    ASSERT_EQ_INT(json_array_size(json_object_get(j, "tokens")),
                  json_integer_value(json_object_get(j, "count")));
    ASSERT_EQ_INT(json_integer_value(json_object_get(j, "max_model_len")), 512);
    json_decref(j);
    http_resp_free(&r);
    /* alpha at its share: its tokenizer requests wait, then 429; bravo's are answered. */
    int a = open_stream_auth(s.port, A, "{\"prompt\":\"a\",\"stream\":true}");
    ASSERT_TRUE(fake_wait_live(&s.f, 1, 5000));
    http_auth(s.port, "POST", "/tokenize", A, "{\"prompt\":\"hello\"}", &r);
    if (r.status != 429) KVF_FAIL("alpha's /tokenize at its share: %d %s", r.status, r.body);
    ASSERT_TRUE(strcasestr(r.head, "retry-after:") != NULL);
    http_resp_free(&r);
    http_auth(s.port, "POST", "/detokenize", A, "{\"tokens\":[5]}", &r);
    ASSERT_EQ_INT(r.status, 429);
    http_resp_free(&r);
    http_auth(s.port, "POST", "/tokenize", B, "{\"prompt\":\"hello\"}", &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    http_auth(s.port, "POST", "/detokenize", B, "{\"tokens\":[259,260]}", &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_NOT_NULL(strstr(r.body, "\"prompt\":\"hello world\""));
    http_resp_free(&r);
    close(a);
    ASSERT_TRUE(fake_wait_live(&s.f, 0, 5000));
    /* The bound on the body: 2048 bytes for the tokenizer routes, 64 KiB for completions. */
    static char big[4096];
    memset(big, 0, sizeof big);
    strcpy(big, "{\"prompt\":\"hello\",\"max_tokens\":1,\"pad\":\""); /* an ignored field */
    size_t o = strlen(big);
    memset(big + o, 'x', 2100);
    strcpy(big + o + 2100, "\"}");
    http_auth(s.port, "POST", "/tokenize", B, big, &r);
    ASSERT_EQ_INT(r.status, 413);
    ASSERT_NOT_NULL(strstr(r.body, "2048"));
    http_resp_free(&r);
    http_auth(s.port, "POST", "/detokenize", B, big, &r);
    ASSERT_EQ_INT(r.status, 413);
    http_resp_free(&r);
    http_auth(s.port, "POST", "/v1/completions", B, big, &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    strcpy(big + o + 1900, "\"}"); /* within the bound */
    http_auth(s.port, "POST", "/tokenize", B, big, &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    srv_stop(&s);
    kvf_server_keys_free(k);
}

static void test_tenant_limits(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *k = test_keys();
    s.cfg.keys = k;
    s.cfg.tenant_max_running = 1;
    s.cfg.tenant_max_queued = 1;
    s.cfg.retry_after_s = 3;
    s.f.first_delay_ms = 60000; /* alpha's requests stay queued in the engine */
    s.f.slow_tenant = 1;
    srv_start(&s);
    const char *sbody = "{\"prompt\":\"a\",\"stream\":true}";
    int a1 = open_stream_auth(s.port, "Bearer " KEY_A, sbody);
    ASSERT_TRUE(fake_wait_live(&s.f, 1, 5000));
    int a2 = open_stream_auth(s.port, "Bearer " KEY_A, sbody); /* waits in the server */
    char *m = NULL;
    for (int i = 0; i < 250; i++) {
        free(m);
        m = get_metrics(s.port);
        if (metric(m, "kvfence_tenant_requests{tenant=\"alpha\",state=\"waiting\"}") == 1) break;
        usleep(20000);
    }
    ASSERT_EQ_INT(metric(m, "kvfence_tenant_requests{tenant=\"alpha\",state=\"waiting\"}"), 1);
    ASSERT_EQ_INT(metric(m, "kvfence_tenant_requests{tenant=\"alpha\",state=\"running\"}"), 1);
    free(m);
    struct http_resp r;
    http_auth(s.port, "POST", "/v1/completions", "Bearer sk-alpha-second-key", "{\"prompt\":\"a\"}",
              &r);
    ASSERT_EQ_INT(r.status, 429);
    ASSERT_TRUE(strcasestr(r.head, "retry-after: 3") != NULL);
    ASSERT_TRUE(strstr(r.body, "\"tenant_limit\"") != NULL);
    http_resp_free(&r);
    /* The other tenant is served in full meanwhile, twice in a row. */
    for (int i = 0; i < 2; i++) {
        http_auth(s.port, "POST", "/v1/completions", "Bearer " KEY_B,
                  "{\"prompt\":\"hello world\",\"max_tokens\":3}", &r);
        ASSERT_EQ_INT(r.status, 200);
        ASSERT_TRUE(strstr(r.body, "\"finish_reason\":\"length\"") != NULL);
        http_resp_free(&r);
    }
    ASSERT_EQ_INT(s.f.submits, 3); /* a1 and bravo's two: a2 never reached the engine */
    /* a1 gone: a2 takes its slot. */
    close(a1);
    for (int i = 0; i < 250 && s.f.submits < 4; i++)
        usleep(20000);
    ASSERT_EQ_INT(s.f.submits, 4);
    ASSERT_EQ_INT(s.f.params[3].tenant, 1);
    close(a2);
    ASSERT_TRUE(fake_wait_live(&s.f, 0, 5000));
    for (int i = 0; i < 250; i++) {
        m = get_metrics(s.port);
        if (metric(m, "kvfence_tenant_requests{tenant=\"alpha\",state=\"running\"}") == 0) break;
        free(m);
        m = NULL;
        usleep(20000);
    }
    ASSERT_NOT_NULL(m);
    ASSERT_EQ_INT(metric(m, "kvfence_requests_total{tenant=\"alpha\",outcome=\"rate_limited\"}"),
                  1);
    ASSERT_EQ_INT(metric(m, "kvfence_requests_total{tenant=\"alpha\",outcome=\"cancelled\"}"), 2);
    ASSERT_EQ_INT(metric(m, "kvfence_requests_total{tenant=\"bravo\",outcome=\"ok\"}"), 2);
    ASSERT_EQ_INT(metric(m, "kvfence_generation_tokens_total{tenant=\"bravo\"}"), 6);
    ASSERT_EQ_INT(metric(m, "kvfence_tenant_requests{tenant=\"alpha\",state=\"waiting\"}"), 0);
    free(m);
    srv_stop(&s);
    kvf_server_keys_free(k);
}

#define CANARY_PROMPT "zqxCANARYprompt7"
#define CANARY_KEY    "sk-CANARYkey-wrong-42"

static void test_logs_no_canary(void)
{
    log_reset();
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *k = test_keys();
    s.cfg.keys = k;
    s.cfg.log = capture_log;
    srv_start(&s);
    const char *auth = "Bearer " KEY_A;
    const char *bodies[] = {
        "{\"prompt\":\"" CANARY_PROMPT "\",\"max_tokens\":20}",
        "{\"prompt\":\"" CANARY_PROMPT "\",\"max_tokens\":20,\"stream\":true}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"" CANARY_PROMPT "\"}],\"max_tokens\":20}",
        "{\"prompt\":\"" CANARY_PROMPT "\",\"max_tokens\":20,\"stop\":[\"" CANARY_PROMPT "\"]}",
        "{\"prompt\":\"" CANARY_PROMPT "\",\"max_tokens\":\"" CANARY_PROMPT "\"}",
        "{\"prompt\":\"" CANARY_PROMPT "\",\"" CANARY_PROMPT "\":[1,2,3]}",
        "{\"prompt\":["
        "1,2,3"
        "],\"max_tokens\":-1}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        struct http_resp r;
        http_auth(s.port, "POST", i == 2 ? "/v1/chat/completions" : "/v1/completions", auth,
                  bodies[i], &r);
        http_resp_free(&r);
    }
    struct http_resp r;
    http_auth(s.port, "POST", "/tokenize", auth, "{\"prompt\":\"" CANARY_PROMPT "\"}", &r);
    http_resp_free(&r);
    http_auth(s.port, "POST", "/v1/completions", "Bearer " CANARY_KEY, bodies[0], &r);
    ASSERT_EQ_INT(r.status, 401);
    http_resp_free(&r);
    http_auth(s.port, "GET", "/v1/" CANARY_PROMPT, auth, NULL, &r);
    http_resp_free(&r);
    srv_stop(&s);
    kvf_server_keys_free(k);
    pthread_mutex_lock(&log_mu);
    const char *L = logbuf.p ? logbuf.p : "";
    fprintf(stderr, "# captured log:\n%s", L);
    ASSERT_TRUE(strstr(L, "event=request id=req-") != NULL);
    ASSERT_TRUE(strstr(L, "event=finished id=req-") != NULL);
    ASSERT_TRUE(strstr(L, "tenant=alpha") != NULL);
    ASSERT_TRUE(strstr(L, "outcome=ok status=200") != NULL);
    ASSERT_TRUE(strstr(L, "prompt_tokens=") != NULL && strstr(L, "completion_tokens=20") != NULL);
    ASSERT_TRUE(strstr(L, "event=rejected") != NULL &&
                strstr(L, "outcome=invalid status=400") != NULL);
    ASSERT_TRUE(strstr(L, "event=unauthorized") != NULL);
    /* Nothing of a prompt, an output, a key: the canaries (and the prompt's own pieces, which
     * the fake engine echoes as output) appear nowhere. */
    static const char *const canaries[] = {"CANARY", "canary", "zqx", "sk-", KEY_A, "alpha-0123"};
    for (size_t i = 0; i < sizeof canaries / sizeof canaries[0]; i++)
        if (strstr(L, canaries[i])) KVF_FAIL("the log contains '%s'", canaries[i]);
    pthread_mutex_unlock(&log_mu);
    log_reset();
}

/* Runs promtool check metrics on body; fails (not skips) without promtool. */
static void promtool_check(const char *body)
{
    char path[256];
    snprintf(path, sizeof path, "/tmp/kvf_metrics_%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fputs(body, f);
    fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    ASSERT_NOT_NULL(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    unlink(path);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        KVF_FAIL("promtool check metrics failed (exit %d; promtool is Debian's 'prometheus' "
                 "package, installed by scripts/install-deps.sh): %s",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
}

static void test_metrics(void)
{
    struct srv s;
    srv_init(&s);
    srv_start(&s);
    char *m = get_metrics(s.port);
    promtool_check(m); /* before any request, too */
    free(m);
    json_t *j =
        post_json(s.port, "/v1/completions", "{\"prompt\":\"hello world\",\"max_tokens\":4}", 200);
    json_decref(j);
    struct http_resp r;
    http_do(s.port, "POST", "/v1/completions",
            "{\"prompt\":\"hello world\",\"max_tokens\":4,\"stream\":true}", &r);
    ASSERT_EQ_INT(r.status, 200);
    http_resp_free(&r);
    http_do(s.port, "POST", "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":0}", &r);
    ASSERT_EQ_INT(r.status, 400);
    http_resp_free(&r);
    for (int i = 0; i < 250 && fake_live(&s.f); i++)
        usleep(20000);
    m = get_metrics(s.port);
    promtool_check(m);
    ASSERT_EQ_INT(metric(m, "kvfence_requests_total{tenant=\"default\",outcome=\"ok\"}"), 2);
    ASSERT_EQ_INT(metric(m, "kvfence_requests_total{tenant=\"default\",outcome=\"invalid\"}"), 1);
    ASSERT_EQ_INT(metric(m, "kvfence_generation_tokens_total{tenant=\"default\"}"), 8);
    ASSERT_EQ_INT(metric(m, "kvfence_prompt_tokens_total{tenant=\"default\"}"),
                  2 * kvf_tokenizer_encode(s.tok, "hello world", 11, true, NULL, 0));
    ASSERT_EQ_INT(metric(m, "kvfence_e2e_request_latency_seconds_count"), 2);
    ASSERT_EQ_INT(metric(m, "kvfence_time_to_first_token_seconds_count"), 2);
    ASSERT_EQ_INT(metric(m, "kvfence_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 2);
    ASSERT_EQ_INT(metric(m, "kvfence_time_per_output_token_seconds_count"), 2);
    /* The engine's figures, as the fake engine gives them (and /health shows them). */
    ASSERT_EQ_INT(metric(m, "kvfence_pool_pages{pool=\"decode\"}"), 64);
    ASSERT_EQ_INT(metric(m, "kvfence_pool_pages{pool=\"prefill\"}"), 32);
    ASSERT_EQ_INT(metric(m, "kvfence_pool_free_pages{pool=\"decode\"}"), 60);
    ASSERT_EQ_INT(metric(m, "kvfence_reserved_pages{pool=\"decode\"}"), 4);
    ASSERT_EQ_INT(metric(m, "kvfence_pool_capacity_tokens{pool=\"decode\"}"), 64 * 16);
    ASSERT_EQ_INT(metric(m, "kvfence_pages{pool=\"decode\",state=\"KVF_PAGE_FREE\"}"), 60);
    ASSERT_EQ_INT(metric(m, "kvfence_served_limit_tokens"), 512);
    ASSERT_EQ_INT(metric(m, "kvfence_prefill_up"), 1);
    static const char *const counters[] = {"kvfence_fences_total",
                                           "kvfence_verify_failures_total{reason=\"count\"}",
                                           "kvfence_verify_failures_total{reason=\"trailer\"}",
                                           "kvfence_verify_failures_total{reason=\"checksum\"}",
                                           "kvfence_verify_failures_total{reason=\"tail\"}",
                                           "kvfence_stale_messages_total",
                                           "kvfence_bad_frames_total",
                                           "kvfence_foreign_tails_total",
                                           "kvfence_rejected_before_handoff_total",
                                           "kvfence_quarantines_total",
                                           "kvfence_engine_queued_requests"};
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        if (metric(m, counters[i]) != 0) KVF_FAIL("%s missing or not 0", counters[i]);
    free(m);
    srv_stop(&s);
}

/* Verify failures by reason: the engine's three counts of the commit's checks and its foreign
 * tails, each under its own label, promtool-clean. */
static void test_metrics_verify_reasons(void)
{
    struct srv s;
    srv_init(&s);
    s.f.verify[0] = 3, s.f.verify[1] = 5, s.f.verify[2] = 7, s.f.verify[3] = 11;
    srv_start(&s);
    char *m = get_metrics(s.port);
    promtool_check(m);
    ASSERT_EQ_INT(metric(m, "kvfence_verify_failures_total{reason=\"count\"}"), 3);
    ASSERT_EQ_INT(metric(m, "kvfence_verify_failures_total{reason=\"trailer\"}"), 5);
    ASSERT_EQ_INT(metric(m, "kvfence_verify_failures_total{reason=\"checksum\"}"), 7);
    ASSERT_EQ_INT(metric(m, "kvfence_verify_failures_total{reason=\"tail\"}"), 11);
    ASSERT_EQ_INT(metric(m, "kvfence_verify_failures_total"), -1); /* no unlabelled series */
    ASSERT_EQ_INT(metric(m, "kvfence_foreign_tails_total"), 11);
    free(m);
    srv_stop(&s);
}

/* --- Ids and default seeds (nothing guessable). ----------------------------------------------- */

/* splitmix64's finalizer and its inverse: a counter passed through the first is recovered by the
 * second, so the ids are checked after it as well as before. */
static uint64_t unmix64(uint64_t z)
{
    z = (z ^ (z >> 31) ^ (z >> 62)) * 0x319642b2d24d8ec3ull;
    z = (z ^ (z >> 27) ^ (z >> 54)) * 0x96de1b173f119089ull;
    return z ^ (z >> 30) ^ (z >> 60);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* v[0..n) look like independent random draws: all distinct, and each of the 64 bits of every
 * value, of the XOR of neighbours and of their difference is one in n/2 ± 6σ of the cases (a
 * counter, even multiplied by a constant and XORed with a boot value, fixes the low bit of the
 * XOR of neighbours; random draws miss this band with odds below 1e-7 for the whole test). */
static void check_unrelated(const uint64_t *v, size_t n, const char *what)
{
    uint64_t *c = malloc(n * sizeof *c);
    ASSERT_NOT_NULL(c);
    memcpy(c, v, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_u64);
    for (size_t i = 1; i < n; i++)
        if (c[i] == c[i - 1]) KVF_FAIL("%s: %016llx appears twice", what, (unsigned long long)c[i]);
    free(c);
    size_t m = n - 1;
    double sd = sqrt((double)m) / 2, lo = m / 2.0 - 6 * sd, hi = m / 2.0 + 6 * sd;
    for (int b = 0; b < 64; b++) {
        size_t ones[3] = {0, 0, 0};
        for (size_t i = 0; i < m; i++) {
            ones[0] += (v[i] >> b) & 1;
            ones[1] += ((v[i] ^ v[i + 1]) >> b) & 1;
            ones[2] += ((v[i + 1] - v[i]) >> b) & 1;
        }
        static const char *const form[3] = {"the value", "the XOR of neighbours",
                                            "the difference of neighbours"};
        for (int k = 0; k < 3; k++)
            if (ones[k] < lo || ones[k] > hi)
                KVF_FAIL("%s: bit %d of %s is 1 in %zu of %zu (a relation between them)", what, b,
                         form[k], ones[k], m);
    }
}

static void test_ids_unguessable(void)
{
    enum { N = 1000 };
    log_reset();
    struct srv s;
    srv_init(&s);
    s.cfg.log = capture_log;
    srv_start(&s);
    uint64_t *cmpl = calloc(N, sizeof *cmpl), *cmpl_un = calloc(N, sizeof *cmpl_un);
    ASSERT_TRUE(cmpl && cmpl_un);
    for (int i = 0; i < N; i++) {
        bool chat = i % 2;
        json_t *j = post_json(s.port, chat ? "/v1/chat/completions" : "/v1/completions",
                              chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                     "\"max_tokens\":1}"
                                   : "{\"prompt\":\"hello\",\"max_tokens\":1}",
                              200);
        const char *id = json_string_value(json_object_get(j, "id"));
        ASSERT_NOT_NULL(id);
        const char *pre = chat ? "chatcmpl-" : "cmpl-";
        ASSERT_TRUE(strncmp(id, pre, strlen(pre)) == 0);
        ASSERT_EQ_INT(strlen(id), strlen(pre) + 16);
        cmpl[i] = strtoull(id + strlen(pre), NULL, 16);
        cmpl_un[i] = unmix64(cmpl[i]);
        json_decref(j);
    }
    /* One request with n = 4 and no seed: its choices' seeds are the request's seed + 0..3. */
    json_t *j = post_json(s.port, "/v1/completions",
                          "{\"prompt\":\"hello\",\"max_tokens\":1,\"n\":4}", 200);
    json_decref(j);
    ASSERT_EQ_INT(s.f.submits, N + 4);
    for (int i = 1; i < 4; i++)
        ASSERT_EQ_U64(s.f.seeds[N + i], s.f.seeds[N] + (uint64_t)i);
    srv_stop(&s);
    check_unrelated(cmpl, N, "completion ids");
    check_unrelated(cmpl_un, N, "completion ids, unmixed");
    check_unrelated(s.f.seeds, N, "default seeds");
    /* Request ids, from the log lines. */
    uint64_t *req = calloc(N + 1, sizeof *req);
    ASSERT_NOT_NULL(req);
    size_t n_req = 0;
    pthread_mutex_lock(&log_mu);
    for (const char *p = logbuf.p; p && (p = strstr(p, "event=request id=req-")) && n_req <= N;
         p += 21)
        req[n_req++] = strtoull(p + 21, NULL, 16);
    pthread_mutex_unlock(&log_mu);
    ASSERT_EQ_INT(n_req, N + 1);
    check_unrelated(req, N, "request ids");
    free(req);
    free(cmpl);
    free(cmpl_un);
    log_reset();
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_keys_parse),
    KVF_CASE(test_auth),
    KVF_CASE(test_tenant_limits),
    KVF_CASE(test_share_counts_choices_and_kv),
    KVF_CASE(test_share_running_counts_sequences),
    KVF_CASE(test_tokenize_in_share),
    KVF_CASE(test_logs_no_canary),
    KVF_CASE(test_metrics),
    KVF_CASE(test_metrics_verify_reasons),
    KVF_CASE(test_ids_unguessable),
};

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    return KVF_TEST_MAIN(argc, argv, cases);
}
