/* cli_http.c — the HTTP front shared by `serve` and `router`: the rules between its options
 * (KVF_CLI_HTTP_OPTS in cli.h), the API-key rule for the listening address, the model's chat
 * template, starting the server and saying so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Repeatable: the lists are joined, checked by the server at start. */
int kvf_cli_http_add_proxy(const char *v, void *trusted_proxies)
{
    char *list = trusted_proxies;
    size_t used = strlen(list), add = strlen(v);
    if (!add || used + add + 2 > KVF_CLI_PROXIES_LEN) return -1;
    snprintf(list + used, KVF_CLI_PROXIES_LEN - used, "%s%s", used ? "," : "", v);
    return 0;
}

static bool is_loopback(const char *host)
{
    return strcmp(host, "127.0.0.1") == 0 || strcmp(host, "localhost") == 0 ||
           strcmp(host, "::1") == 0;
}

/* Checks the mode of a key file and loads it. 0, or 2 (printed). */
static int load_keys(const char *cmd, const char *opt, const char *path, kvf_server_keys_t **out)
{
    char kerr[320], kwarn[320];
    if (kvf_cli_check_secret_file(path, opt, kwarn, sizeof kwarn, kerr, sizeof kerr) < 0) {
        fprintf(stderr, "kvfence %s: %s\n", cmd, kerr);
        return 2;
    }
    if (kwarn[0]) fprintf(stderr, "kvfence %s: %s\n", cmd, kwarn);
    if (kvf_server_keys_load(path, out, kerr, sizeof kerr) < 0) {
        fprintf(stderr, "kvfence %s: %s %s\n", cmd, opt, kerr);
        return 2;
    }
    return 0;
}

/* The operator endpoints' rules (--admin-keys, --admin-listen), after the tenants' keys are
 * loaded. 0, or 2 (printed). */
static int prepare_admin(const char *cmd, struct kvf_cli_http *h)
{
    if (h->admin_listen.text && !h->admin_keys_path && !h->no_auth &&
        !is_loopback(h->admin_listen.host)) {
        fprintf(stderr,
                "kvfence %s: refusing to serve the operator endpoints on %s without admin keys; "
                "give --admin-keys FILE, or --no-auth to serve them to anyone who can reach it\n",
                cmd, h->admin_listen.host);
        return 2;
    }
    if (!h->admin_keys_path) return 0;
    int rc = load_keys(cmd, "--admin-keys", h->admin_keys_path, &h->admin_keys);
    if (rc) return rc;
    if (kvf_server_keys_overlap(h->admin_keys, h->keys)) {
        fprintf(stderr,
                "kvfence %s: a key of --admin-keys is also a tenant's key in --api-keys: a "
                "tenant's key must never open the operator endpoints; give each its own key\n",
                cmd);
        return 2;
    }
    return 0;
}

int kvf_cli_http_prepare(const char *cmd, struct kvf_cli_http *h)
{
    if (!h->host) h->host = "127.0.0.1";
    h->loopback = is_loopback(h->host);
    if (h->keys_path && h->no_auth) {
        fprintf(stderr, "kvfence %s: --api-keys and --no-auth contradict each other\n", cmd);
        return 2;
    }
    if (!h->keys_path && !h->loopback && !h->no_auth) {
        fprintf(stderr,
                "kvfence %s: refusing to listen on %s without API keys; give --api-keys FILE, "
                "or --no-auth to serve anyone who can reach it\n",
                cmd, h->host);
        return 2;
    }
    if (h->tenant_queued && !h->tenant_running) {
        fprintf(stderr, "kvfence %s: --tenant-max-queued needs --tenant-max-running\n", cmd);
        return 2;
    }
    if (h->keys_path) {
        int rc = load_keys(cmd, "--api-keys", h->keys_path, &h->keys);
        if (rc) return rc;
    }
    int rc = prepare_admin(cmd, h);
    if (rc) kvf_cli_http_free(h); /* refused: nothing is left loaded */
    return rc;
}

int kvf_cli_http_start(const char *cmd, struct kvf_cli_http *h, const char *model_path,
                       uint64_t model_fp, kvf_gguf_t *g, const kvf_tokenizer_t *tok,
                       const struct kvf_gen_ops *ops, void *engine, kvf_server_t **srv)
{
    /* The model's chat template, if the interpreter takes it (else the default rendering). */
    const char *tmpl_s = NULL;
    size_t tmpl_len = 0;
    char *tmpl = NULL;
    if (kvf_gguf_get_str(g, "tokenizer.chat_template", &tmpl_s, &tmpl_len) == 0 && tmpl_len) {
        char terr[256] = "";
        tmpl = strndup(tmpl_s, tmpl_len);
        if (tmpl && kvf_server_chat_template_check(tmpl, tok, terr, sizeof(terr)) < 0) {
            fprintf(stderr,
                    "kvfence %s: not using the model's chat template (%s); chat requests use the "
                    "default rendering\n",
                    cmd, terr);
            free(tmpl);
            tmpl = NULL;
        }
    }
    const char *base = strrchr(model_path, '/');
    h->model_name = base ? base + 1 : model_path;
    h->chat_model = tmpl != NULL;
    struct kvf_server_config sc = {.host = h->host,
                                   .port = (uint16_t)h->port,
                                   .model_name = h->model_name,
                                   .served_model_names = h->served_names,
                                   .model_fp = model_fp,
                                   .cors_origins = h->cors_origins,
                                   .drain_ms = 10000,
                                   .max_queue = h->max_queue,
                                   .chat_template = tmpl,
                                   .keys = h->keys,
                                   .tenant_max_running = h->tenant_running,
                                   .tenant_max_queued = h->tenant_queued,
                                   .tenant_max_kv_tokens = h->tenant_kv_tokens,
                                   .log = kvf_log_line,
                                   .max_conn_per_ip = h->max_conn_per_ip,
                                   .max_connections = h->max_connections,
                                   .keyless_timeout_ms = h->keyless_timeout_ms,
                                   .trusted_proxies =
                                       h->trusted_proxies[0] ? h->trusted_proxies : NULL,
                                   .header_timeout_ms = h->header_timeout_ms,
                                   .body_timeout_ms = h->body_timeout_ms,
                                   .send_timeout_ms = h->send_timeout_ms,
                                   .admin_keys = h->admin_keys,
                                   .admin_listen = h->admin_listen.text != NULL,
                                   .admin_host = h->admin_listen.host,
                                   .admin_port = h->admin_listen.port,
                                   .canary_interval_ms = h->canary_s * 1000u};
    char err[256] = "";
    int rc = kvf_server_start(&sc, ops, engine, tok, srv, err, sizeof(err));
    free(tmpl); /* copied by the server */
    if (rc < 0) {
        fprintf(stderr, "kvfence %s: cannot serve HTTP on %s:%u: %s\n", cmd, h->host, h->port, err);
        return -1;
    }
    return 0;
}

void kvf_cli_http_say_auth(const char *cmd, const struct kvf_cli_http *h, const kvf_server_t *srv)
{
    if (h->keys)
        fprintf(stderr, "kvfence %s: API keys: %zu keys of %zu tenants from %s\n", cmd,
                kvf_server_keys_count(h->keys), kvf_server_keys_n_tenants(h->keys), h->keys_path);
    else if (h->loopback)
        fprintf(stderr, "kvfence %s: no API keys: any local process may use this server\n", cmd);
    else
        fprintf(stderr,
                "kvfence %s: warning: --no-auth: anyone who can reach %s may use this "
                "server\n",
                cmd, h->host);
    if (h->admin_listen.text)
        fprintf(stderr, "kvfence %s: operator endpoints (/metrics, /health in full) on %s:%u%s\n",
                cmd, h->admin_listen.host, kvf_server_admin_port(srv),
                h->admin_keys ? ", with admin keys" : "");
    else if (h->admin_keys)
        fprintf(stderr,
                "kvfence %s: admin keys: %zu keys from %s open /metrics and /health's figures\n",
                cmd, kvf_server_keys_count(h->admin_keys), h->admin_keys_path);
    else if (h->keys)
        fprintf(stderr,
                "kvfence %s: warning: /metrics and /health's figures (which name every tenant) "
                "are open to anyone who reaches %s; give --admin-keys or --admin-listen\n",
                cmd, h->host);
}

void kvf_cli_http_free(struct kvf_cli_http *h)
{
    kvf_server_keys_free(h->keys);
    kvf_server_keys_free(h->admin_keys);
    h->keys = NULL;
    h->admin_keys = NULL;
}
