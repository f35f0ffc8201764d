/* cli_http.c — the HTTP front shared by `serve` and `router`: its options, the API-key rule for
 * the listening address, the model's chat template, starting the server and saying so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int kvf_cli_http_option(const char *cmd, struct kvf_cli_http *h, const char *a, const char *v)
{
    int bad = 0;
    if (strcmp(a, "--host") == 0) h->host = v;
    else if (strcmp(a, "--port") == 0) bad = kvf_cli_parse_u32(v, 0, 65535, &h->port);
    else if (strcmp(a, "--max-queue") == 0) bad = kvf_cli_parse_u32(v, 1, 1u << 20, &h->max_queue);
    else if (strcmp(a, "--api-keys") == 0) h->keys_path = v;
    else if (strcmp(a, "--tenant-max-running") == 0) bad = kvf_cli_parse_u32(v, 1, 1u << 20, &h->tenant_running);
    else if (strcmp(a, "--tenant-max-queued") == 0) bad = kvf_cli_parse_u32(v, 0, 1u << 20, &h->tenant_queued);
    else if (strcmp(a, "--tenant-max-kv-tokens") == 0) bad = kvf_cli_parse_u32(v, 1, UINT32_MAX, &h->tenant_kv_tokens);
    else if (strcmp(a, "--max-conn-per-ip") == 0) bad = kvf_cli_parse_u32(v, 1, 1u << 20, &h->max_conn_per_ip);
    else if (strcmp(a, "--max-connections") == 0) bad = kvf_cli_parse_u32(v, 2, 1u << 16, &h->max_connections);
    else if (strcmp(a, "--keyless-timeout") == 0) bad = kvf_cli_parse_u32(v, 1, 3600000, &h->keyless_timeout_ms);
    else if (strcmp(a, "--trusted-proxy") == 0) {
        /* Repeatable: the lists are joined, checked by the server at start. */
        size_t used = strlen(h->trusted_proxies), add = strlen(v);
        bad = !add || used + add + 2 > sizeof h->trusted_proxies;
        if (!bad) snprintf(h->trusted_proxies + used, sizeof h->trusted_proxies - used, "%s%s",
                           used ? "," : "", v);
    }
    else if (strcmp(a, "--header-timeout") == 0) bad = kvf_cli_parse_u32(v, 1, 3600000, &h->header_timeout_ms);
    else if (strcmp(a, "--body-timeout") == 0) bad = kvf_cli_parse_u32(v, 1, 3600000, &h->body_timeout_ms);
    else if (strcmp(a, "--send-timeout") == 0) bad = kvf_cli_parse_u32(v, 1, 3600000, &h->send_timeout_ms);
    else return 0;
    if (bad) {
        fprintf(stderr, "kvfence %s: bad value '%s' for %s\n", cmd, v, a);
        return -1;
    }
    return 1;
}

int kvf_cli_http_prepare(const char *cmd, struct kvf_cli_http *h)
{
    if (!h->host) h->host = "127.0.0.1";
    h->loopback = strcmp(h->host, "127.0.0.1") == 0 || strcmp(h->host, "localhost") == 0 ||
                  strcmp(h->host, "::1") == 0;
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
        char kerr[320], kwarn[320];
        if (kvf_cli_check_secret_file(h->keys_path, "--api-keys", kwarn, sizeof kwarn, kerr,
                                      sizeof kerr) < 0) {
            fprintf(stderr, "kvfence %s: %s\n", cmd, kerr);
            return 2;
        }
        if (kwarn[0]) fprintf(stderr, "kvfence %s: %s\n", cmd, kwarn);
        if (kvf_server_keys_load(h->keys_path, &h->keys, kerr, sizeof kerr) < 0) {
            fprintf(stderr, "kvfence %s: --api-keys %s\n", cmd, kerr);
            return 2;
        }
    }
    return 0;
}

int kvf_cli_http_start(const char *cmd, struct kvf_cli_http *h, const char *model_path,
                       kvf_gguf_t *g, const kvf_tokenizer_t *tok, const struct kvf_gen_ops *ops,
                       void *engine, kvf_server_t **srv)
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
    struct kvf_server_config sc = {.host = h->host, .port = (uint16_t)h->port,
                                   .model_name = h->model_name, .drain_ms = 10000,
                                   .max_queue = h->max_queue, .chat_template = tmpl, .keys = h->keys,
                                   .tenant_max_running = h->tenant_running,
                                   .tenant_max_queued = h->tenant_queued,
                                   .tenant_max_kv_tokens = h->tenant_kv_tokens, .log = kvf_log_line,
                                   .max_conn_per_ip = h->max_conn_per_ip,
                                   .max_connections = h->max_connections,
                                   .keyless_timeout_ms = h->keyless_timeout_ms,
                                   .trusted_proxies = h->trusted_proxies[0] ? h->trusted_proxies
                                                                            : NULL,
                                   .header_timeout_ms = h->header_timeout_ms,
                                   .body_timeout_ms = h->body_timeout_ms,
                                   .send_timeout_ms = h->send_timeout_ms};
    char err[256] = "";
    int rc = kvf_server_start(&sc, ops, engine, tok, srv, err, sizeof(err));
    free(tmpl); /* copied by the server */
    if (rc < 0) {
        fprintf(stderr, "kvfence %s: cannot serve HTTP on %s:%u: %s\n", cmd, h->host, h->port, err);
        return -1;
    }
    return 0;
}

void kvf_cli_http_say_auth(const char *cmd, const struct kvf_cli_http *h)
{
    if (h->keys)
        fprintf(stderr, "kvfence %s: API keys: %zu keys of %zu tenants from %s\n", cmd,
                kvf_server_keys_count(h->keys), kvf_server_keys_n_tenants(h->keys), h->keys_path);
    else if (h->loopback)
        fprintf(stderr, "kvfence %s: no API keys: any local process may use this server\n", cmd);
    else
        fprintf(stderr, "kvfence %s: warning: --no-auth: anyone who can reach %s may use this "
                        "server\n", cmd, h->host);
}

void kvf_cli_http_free(struct kvf_cli_http *h)
{
    kvf_server_keys_free(h->keys);
    h->keys = NULL;
}
