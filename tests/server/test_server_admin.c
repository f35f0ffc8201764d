/*
 * The operator endpoints over the fake engine (src/server/admin.c): with admin keys, /metrics
 * and /health's figures refuse no key and a wrong one (401) and every tenant's key (403), and
 * open with an admin key; a plain /health says only ok or unavailable, naming no tenant; with an
 * operator address, the public port serves /metrics nowhere and /health plainly while the
 * operator address serves both and nothing else. Also the key files' overlap check.
 * GET /admin/provenance/{id} follows /metrics' rules (and answers 400 for what is not an id, 404
 * for an id it keeps nothing of). The canary over the fake engine: references, runs counted, no
 * failure; the engine's output changed under it → a failure counted, /health 503 degraded with
 * the reason, in full and plain.
 */
#include "server/server_internal.h"
#include "server_test_util.h"

#define KEY_T1  "sk-tenant-alpha-01234"
#define KEY_T2  "sk-tenant-bravo-56789"
#define KEY_ADM "sk-admin-ops-0a1b2c3d"

static kvf_server_keys_t *keys_of(const char *text)
{
    kvf_server_keys_t *k;
    char err[256];
    ASSERT_OK(kvf_server_keys_parse(text, strlen(text), &k, err, sizeof err));
    return k;
}

/* One GET with an optional Authorization value; the response in r. */
static void get(uint16_t port, const char *path, const char *auth, struct http_resp *r)
{
    int fd = http_connect(port);
    char head[1024], ah[256] = "";
    if (auth) snprintf(ah, sizeof ah, "Authorization: %s\r\n", auth);
    int hn =
        snprintf(head, sizeof head,
                 "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s\r\n", path, ah);
    http_send_all(fd, head, (size_t)hn);
    size_t n;
    char *raw = http_read_all(fd, &n, 10000);
    close(fd);
    http_parse(raw, n, r);
    free(raw);
}

/* GET path wants status and, when code is not NULL, that error code. */
static void expect(uint16_t port, const char *path, const char *auth, int status, const char *code)
{
    struct http_resp r;
    get(port, path, auth, &r);
    if (r.status != status)
        KVF_FAIL("GET %s (%s): status %d, wanted %d: %.300s", path, auth ? auth : "no key",
                 r.status, status, r.body);
    if (code) {
        char want[96];
        snprintf(want, sizeof want, "\"code\":\"%s\"", code);
        if (!strstr(r.body, want)) KVF_FAIL("GET %s: no %s in %.300s", path, want, r.body);
        /* The refusal names no tenant and echoes no key. */
        ASSERT_TRUE(strstr(r.body, "alpha") == NULL && strstr(r.body, "sk-") == NULL);
    }
    http_resp_free(&r);
}

/* The plain /health: {"status": want} and nothing else. */
static void expect_plain_health(uint16_t port, const char *path, const char *auth, int status,
                                const char *want)
{
    struct http_resp r;
    get(port, path, auth, &r);
    ASSERT_EQ_INT(r.status, status);
    json_error_t je;
    json_t *j = json_loadb(r.body, r.body_len, 0, &je);
    if (!j) KVF_FAIL("plain /health is not JSON: %.200s", r.body);
    ASSERT_EQ_INT(json_object_size(j), 1);
    ASSERT_STREQ(json_string_value(json_object_get(j, "status")), want);
    json_decref(j);
    http_resp_free(&r);
}

/* The full /health: its figures are there. */
static void expect_full_health(uint16_t port, const char *path, const char *auth)
{
    struct http_resp r;
    get(port, path, auth, &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(strstr(r.body, "\"served_limit\"") != NULL);
    ASSERT_TRUE(strstr(r.body, "\"counters\"") != NULL);
    http_resp_free(&r);
}

static void expect_metrics(uint16_t port, const char *auth)
{
    struct http_resp r;
    get(port, "/metrics", auth, &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(strstr(r.body, "kvfence_requests_total{tenant=\"alpha\"") != NULL);
    http_resp_free(&r);
}

static void test_keys_overlap(void)
{
    kvf_server_keys_t *t = keys_of(KEY_T1 " alpha\n" KEY_T2 " bravo\n");
    kvf_server_keys_t *a = keys_of(KEY_ADM " ops\n");
    kvf_server_keys_t *both = keys_of(KEY_ADM " ops\n" KEY_T2 " ops\n");
    ASSERT_FALSE(kvf_server_keys_overlap(a, t));
    ASSERT_FALSE(kvf_server_keys_overlap(t, a));
    ASSERT_TRUE(kvf_server_keys_overlap(both, t));
    ASSERT_TRUE(kvf_server_keys_overlap(t, both));
    ASSERT_FALSE(kvf_server_keys_overlap(a, NULL));
    kvf_server_keys_free(t);
    kvf_server_keys_free(a);
    kvf_server_keys_free(both);
}

/* Admin keys on the public address. */
static void test_admin_keys(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *t = keys_of(KEY_T1 " alpha\n" KEY_T2 " bravo\n");
    kvf_server_keys_t *a = keys_of(KEY_ADM " ops\n");
    s.cfg.keys = t;
    s.cfg.admin_keys = a;
    srv_start(&s);
    static const char *const tenant[] = {"Bearer " KEY_T1, "Bearer " KEY_T2};
    static const char *const nokey[] = {NULL, "Bearer", "Bearer sk-wrong-0000000000",
                                        "Basic " KEY_ADM, "Bearer " KEY_ADM "x"};
    for (size_t i = 0; i < sizeof nokey / sizeof nokey[0]; i++) {
        expect(s.port, "/metrics", nokey[i], 401, "admin_key_required");
        expect(s.port, "/health?detail=1", nokey[i], 401, "admin_key_required");
        expect_plain_health(s.port, "/health", nokey[i], 200, "ok");
    }
    for (size_t i = 0; i < 2; i++) {
        expect(s.port, "/metrics", tenant[i], 403, "admin_only");
        expect(s.port, "/health?detail=1", tenant[i], 403, "admin_only");
        expect_plain_health(s.port, "/health", tenant[i], 200, "ok");
        /* The tenant key still serves its own API. */
        expect(s.port, "/v1/models", tenant[i], 200, NULL);
    }
    /* Provenance: /metrics' rules; then the id's own checks. */
    static const char *const pv = "/admin/provenance/cmpl-0123456789abcdef";
    expect(s.port, pv, NULL, 401, "admin_key_required");
    expect(s.port, pv, "Bearer " KEY_T1, 403, "admin_only");
    expect(s.port, pv, "Bearer " KEY_ADM, 404, "provenance_not_found");
    expect(s.port, "/admin/provenance/chatcmpl-0123456789abcdef", "Bearer " KEY_ADM, 404,
           "provenance_not_found");
    static const char *const bad[] = {"/admin/provenance/", "/admin/provenance/cmpl-12",
                                      "/admin/provenance/cmpl-0123456789ABCDEF",
                                      "/admin/provenance/cmpl-0123456789abcdeg",
                                      "/admin/provenance/x/cmpl-0123456789abcdef"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect(s.port, bad[i], "Bearer " KEY_ADM, 400, "invalid_id");
    /* An admin key opens both, and is no tenant's key. */
    expect_metrics(s.port, "Bearer " KEY_ADM);
    expect_full_health(s.port, "/health", "Bearer " KEY_ADM);
    expect_full_health(s.port, "/health?detail=1", "bearer  " KEY_ADM " ");
    expect(s.port, "/v1/models", "Bearer " KEY_ADM, 401, "invalid_api_key");
    /* Down: the plain /health says so, with 503, and nothing more. */
    s.f.prefill_up = false;
    expect_plain_health(s.port, "/health", NULL, 503, "unavailable");
    s.f.prefill_up = true;
    srv_stop(&s);
    kvf_server_keys_free(t);
    kvf_server_keys_free(a);
}

/* An operator address: it alone serves /metrics and the full /health. */
static void test_admin_listen(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *t = keys_of(KEY_T1 " alpha\n");
    s.cfg.keys = t;
    s.cfg.admin_listen = true;
    s.cfg.admin_host = "127.0.0.1";
    srv_start(&s);
    uint16_t ap = kvf_server_admin_port(s.s);
    ASSERT_TRUE(ap != 0 && ap != s.port);
    /* Public: no /metrics for anyone, /health plain even when figures are asked for. */
    expect(s.port, "/metrics", NULL, 404, "not_found");
    expect(s.port, "/metrics", "Bearer " KEY_T1, 404, "not_found");
    expect(s.port, "/health?detail=1", "Bearer " KEY_T1, 404, "not_found");
    expect_plain_health(s.port, "/health", NULL, 200, "ok");
    expect_plain_health(s.port, "/health", "Bearer " KEY_T1, 200, "ok");
    expect(s.port, "/v1/models", "Bearer " KEY_T1, 200, NULL);
    /* Operator address: both in full; the tenants' API is not there. */
    expect_metrics(ap, NULL);
    expect_full_health(ap, "/health", NULL);
    expect(ap, "/v1/models", "Bearer " KEY_T1, 404, "not_found");
    expect(s.port, "/admin/provenance/cmpl-0123456789abcdef", NULL, 404, "not_found");
    expect(ap, "/admin/provenance/cmpl-0123456789abcdef", NULL, 404, "provenance_not_found");
    struct http_resp r;
    http_do(ap, "POST", "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":2}", &r);
    ASSERT_EQ_INT(r.status, 404);
    http_resp_free(&r);
    ASSERT_EQ_INT(s.f.submits, 0);
    srv_stop(&s);
    /* Stopped: the operator address is closed too. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(ap)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_TRUE(connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0);
    close(fd);
    kvf_server_keys_free(t);
}

/* Both: the operator address still wants an admin key. */
static void test_admin_listen_with_keys(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *t = keys_of(KEY_T1 " alpha\n");
    kvf_server_keys_t *a = keys_of(KEY_ADM " ops\n");
    s.cfg.keys = t;
    s.cfg.admin_keys = a;
    s.cfg.admin_listen = true;
    srv_start(&s);
    uint16_t ap = kvf_server_admin_port(s.s);
    expect(ap, "/metrics", NULL, 401, "admin_key_required");
    expect(ap, "/metrics", "Bearer " KEY_T1, 403, "admin_only");
    expect_metrics(ap, "Bearer " KEY_ADM);
    expect(s.port, "/metrics", "Bearer " KEY_ADM, 404, "not_found");
    srv_stop(&s);
    kvf_server_keys_free(t);
    kvf_server_keys_free(a);
}

/* Nothing configured: both stay open, as the public API (the behaviour without operators). */
static void test_no_admin(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *t = keys_of(KEY_T1 " alpha\n");
    s.cfg.keys = t;
    srv_start(&s);
    ASSERT_EQ_INT(kvf_server_admin_port(s.s), 0);
    expect_metrics(s.port, NULL);
    expect_full_health(s.port, "/health", NULL);
    /* Per-request records are nobody's to read when nobody is an operator: 404 with or
     * without a tenant key (unlike /metrics' aggregates). */
    expect(s.port, "/admin/provenance/cmpl-0123456789abcdef", NULL, 404, "not_found");
    expect(s.port, "/admin/provenance/cmpl-0123456789abcdef", "Bearer " KEY_T1, 404, "not_found");
    srv_stop(&s);
    kvf_server_keys_free(t);
}

/* POST a completion with the tenant's key and, when prov, X-Kvfence-Provenance: 1. */
static void post_prov(uint16_t port, bool prov, bool stream, struct http_resp *r)
{
    char body[160], req[1024];
    int bn = snprintf(body, sizeof body,
                      "{\"prompt\":\"hello there, a prompt of some tokens\",\"max_tokens\":3%s}",
                      stream ? ",\"stream\":true" : "");
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Authorization: Bearer " KEY_T1 "\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %d\r\n\r\n%s",
                     prov ? "X-Kvfence-Provenance: 1\r\n" : "", bn, body);
    http_raw(port, req, (size_t)n, r);
}

/* The header's value (NULL when absent), copied into out. */
static const char *header_of(const struct http_resp *r, const char *name, char *out, size_t cap)
{
    const char *h = strcasestr(r->head, name);
    if (!h) return NULL;
    h += strlen(name);
    while (*h == ':' || *h == ' ')
        h++;
    size_t n = strcspn(h, "\r\n");
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), h);
    return out;
}

/* A record from an engine that keeps them: in the header when asked (not otherwise), at
 * /admin/provenance with an admin key, and the stream's comment before [DONE]. */
static void test_provenance(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *t = keys_of(KEY_T1 " alpha\n");
    kvf_server_keys_t *a = keys_of(KEY_ADM " ops\n");
    s.cfg.keys = t;
    s.cfg.admin_keys = a;
    s.f.prov = true;
    srv_start(&s);
    struct http_resp r;
    static char hv[8192];
    post_prov(s.port, false, false, &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(header_of(&r, "X-Kvfence-Provenance", hv, sizeof hv) == NULL);
    http_resp_free(&r);
    post_prov(s.port, true, false, &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_TRUE(header_of(&r, "X-Kvfence-Provenance", hv, sizeof hv) != NULL);
    json_t *h = json_loads(hv, 0, NULL);
    if (!h) KVF_FAIL("the header is not JSON: %s", hv);
    json_t *body = json_loadb(r.body, r.body_len, 0, NULL);
    const char *id = json_string_value(json_object_get(body, "id"));
    ASSERT_STREQ(json_string_value(json_object_get(h, "id")), id);
    json_t *rec = json_array_get(json_object_get(h, "choices"), 0);
    ASSERT_STREQ(json_string_value(json_object_get(json_object_get(rec, "decode"), "id")),
                 "000000000000feed");
    ASSERT_STREQ(json_string_value(json_object_get(json_object_get(rec, "grant"), "nonce")),
                 "0000000000000abd"); /* the second submit */
    ASSERT_EQ_INT(json_integer_value(json_object_get(json_object_get(rec, "grant"), "tenant")), 1);
    json_t *pg = json_array_get(json_object_get(rec, "pages"), 0);
    ASSERT_EQ_INT(json_integer_value(json_object_get(pg, "page")), 10);
    ASSERT_STREQ(json_string_value(json_object_get(pg, "tag")), "0000000000001000");
    ASSERT_STREQ(json_string_value(json_object_get(pg, "checksum")), "0000000000002000");
    char path[96];
    snprintf(path, sizeof path, "/admin/provenance/%s", id);
    http_resp_free(&r);
    /* The operator's copy: the same record. */
    get(s.port, path, "Bearer " KEY_ADM, &r);
    ASSERT_EQ_INT(r.status, 200);
    json_t *op = json_loadb(r.body, r.body_len, 0, NULL);
    ASSERT_TRUE(op && json_equal(json_object_get(op, "choices"), json_object_get(h, "choices")));
    json_decref(op);
    http_resp_free(&r);
    expect(s.port, path, "Bearer " KEY_T1, 403, "admin_only");
    json_decref(h);
    json_decref(body);
    /* A stream: the record as a comment before [DONE]. */
    post_prov(s.port, true, true, &r);
    ASSERT_EQ_INT(r.status, 200);
    ASSERT_STREQ(header_of(&r, "X-Kvfence-Provenance", hv, sizeof hv), "sse-comment");
    const char *c = strstr(r.body, "\n: kvfence-provenance {");
    ASSERT_TRUE(c != NULL);
    ASSERT_TRUE(strstr(c, "\n\ndata: [DONE]\n\n") != NULL);
    http_resp_free(&r);
    srv_stop(&s);
    kvf_server_keys_free(t);
    kvf_server_keys_free(a);
}

/* The ring keeps the last KVF__SRV_PROV_RING records: the oldest is overwritten. */
static void test_prov_ring(void)
{
    struct kvf__srv_prov_ring ring;
    ASSERT_OK(kvf__srv_prov_init(&ring, 4));
    struct kvf_gen_prov pv;
    memset(&pv, 0, sizeof pv);
    char id[48];
    for (uint32_t i = 0; i < 6; i++) {
        snprintf(id, sizeof id, "cmpl-%016x", i);
        pv.grant_nonce = i;
        kvf__srv_prov_put(&ring, id, 0, &pv);
    }
    struct kvf__srv_prov_slot out[2];
    ASSERT_EQ_INT(kvf__srv_prov_get(&ring, "cmpl-0000000000000000", out, 2), 0);
    ASSERT_EQ_INT(kvf__srv_prov_get(&ring, "cmpl-0000000000000001", out, 2), 0);
    ASSERT_EQ_INT(kvf__srv_prov_get(&ring, "cmpl-0000000000000005", out, 2), 1);
    ASSERT_TRUE(out[0].pv.grant_nonce == 5);
    /* Two choices of one response, in choice order. */
    kvf__srv_prov_put(&ring, "cmpl-00000000000000aa", 1, &pv);
    kvf__srv_prov_put(&ring, "cmpl-00000000000000aa", 0, &pv);
    ASSERT_EQ_INT(kvf__srv_prov_get(&ring, "cmpl-00000000000000aa", out, 2), 2);
    ASSERT_TRUE(out[0].choice == 0 && out[1].choice == 1);
    ASSERT_TRUE(kvf__srv_prov_id_ok("chatcmpl-0123456789abcdef", 25));
    ASSERT_FALSE(kvf__srv_prov_id_ok("chatcmpl-0123456789abcdef", 24));
    ASSERT_FALSE(kvf__srv_prov_id_ok("cmpl-0123456789abcdeF", 21));
    kvf__srv_prov_destroy(&ring);
}

/* /health?detail=1's canary figure `name` (-1 while there is none). */
static long canary_figure(uint16_t port, const char *name)
{
    struct http_resp r;
    get(port, "/health?detail=1", "Bearer " KEY_ADM, &r);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    json_t *v = j ? json_object_get(json_object_get(j, "canary"), name) : NULL;
    long out = v ? (long)json_integer_value(v) : -1;
    json_decref(j);
    http_resp_free(&r);
    return out;
}

static void test_canary(void)
{
    struct srv s;
    srv_init(&s);
    kvf_server_keys_t *a = keys_of(KEY_ADM " ops\n");
    s.cfg.admin_keys = a; /* /health without a key: the plain one */
    s.cfg.canary_interval_ms = 20;
    srv_start(&s);
    for (int i = 0; canary_figure(s.port, "runs") < 6; i++) {
        ASSERT_TRUE(i < 500);
        usleep(10000);
    }
    ASSERT_EQ_INT(canary_figure(s.port, "references"), 3);
    ASSERT_EQ_INT(canary_figure(s.port, "failures"), 0);
    expect_plain_health(s.port, "/health", NULL, 200, "ok");
    struct http_resp r;
    get(s.port, "/metrics", "Bearer " KEY_ADM, &r);
    ASSERT_TRUE(strstr(r.body, "\nkvfence_canary_failures_total 0\n") != NULL);
    ASSERT_TRUE(strstr(r.body, "# TYPE kvfence_canary_runs_total counter") != NULL);
    http_resp_free(&r);
    /* The engine's output changes under the canary: a failure, and the server degraded. */
    static const int32_t other[] = {5, 6, 7};
    pthread_mutex_lock(&s.f.mu);
    s.f.script = other;
    s.f.n_script = 3;
    pthread_mutex_unlock(&s.f.mu);
    for (int i = 0; canary_figure(s.port, "failures") < 1; i++) {
        ASSERT_TRUE(i < 500);
        usleep(10000);
    }
    expect_plain_health(s.port, "/health", NULL, 503, "degraded");
    get(s.port, "/health?detail=1", "Bearer " KEY_ADM, &r);
    ASSERT_EQ_INT(r.status, 503);
    ASSERT_TRUE(strstr(r.body, "\"status\":\"degraded\"") != NULL);
    ASSERT_TRUE(strstr(r.body, "\"reason\":\"canary prompt ") != NULL);
    http_resp_free(&r);
    get(s.port, "/metrics", "Bearer " KEY_ADM, &r);
    ASSERT_TRUE(strstr(r.body, "\nkvfence_canary_failures_total 0\n") == NULL);
    http_resp_free(&r);
    srv_stop(&s);
    kvf_server_keys_free(a);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_keys_overlap), KVF_CASE(test_admin_keys),
    KVF_CASE(test_admin_listen), KVF_CASE(test_admin_listen_with_keys),
    KVF_CASE(test_no_admin),     KVF_CASE(test_canary),
    KVF_CASE(test_provenance),   KVF_CASE(test_prov_ring),
};

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    return KVF_TEST_MAIN(argc, argv, cases);
}
