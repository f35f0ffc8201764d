/* `kvfence router`: the OpenAI-compatible HTTP front alone. It tokenizes and renders requests
 * with the model's own tokenizer and template, and hands them to decode workers in other
 * processes (or hosts) over UCX; the decode workers grant pages to the prefill workers it names.
 * Workers may start before or after it: it connects and reconnects on its own, and /health says
 * which it can reach. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define ROUTER_PAGE_TOKENS 16u

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvfence router --model F.gguf --prefill HOST:PORT[,...] --decode HOST:PORT[,...]\n"
            "                      [--host 127.0.0.1] [--port 8080] [--context-length N]\n"
            "                      [--max-queue N] [--admit-timeout MS] [--api-keys FILE | --no-auth]\n"
            "                      [--tenant-max-running N] [--tenant-max-queued N]\n"
            "                      [--tenant-max-kv-tokens N] [--cluster-key FILE]\n\n"
            "Runs the HTTP router (the same API as `kvfence serve`) over prefill and decode workers\n"
            "in their own processes (`kvfence prefill`, `kvfence decode`), on this host or others.\n\n"
            "  --model F.gguf        the same model file the workers serve (its fingerprint, context\n"
            "                        and page geometry must agree: a worker that differs is refused\n"
            "                        with the reason, in the log and in /health)\n"
            "  --prefill LIST        the prefill workers, HOST:PORT separated by commas; every\n"
            "                        decode worker connects to each and grants it prompts\n"
            "  --decode LIST         the decode workers; a request goes to the live one with the\n"
            "                        fewest of this router's requests in flight, then the most free\n"
            "                        pages\n"
            "  --host, --port        where to listen for HTTP (default 127.0.0.1:8080)\n"
            "  --context-length N    the served limit (default: the model's); must equal the\n"
            "                        workers'\n"
            "  --max-queue N         requests in flight before 429 with Retry-After (default 256)\n"
            "  --admit-timeout MS    how long a request may wait for a live decode worker with a\n"
            "                        prefill before it fails with 503 no_decode or no_prefill\n"
            "                        (default 30000)\n"
            "  --api-keys FILE, --no-auth, --tenant-max-running N, --tenant-max-queued N,\n"
            "  --tenant-max-kv-tokens N,\n"
            "  --max-connections N, --max-conn-per-ip N, --trusted-proxy ADDR[/PREFIX][,...],\n"
            "  --keyless-timeout MS, --header-timeout MS, --body-timeout MS, --send-timeout MS:\n"
            "                        as for `kvfence serve`\n"
            "  --cluster-key FILE    the key the workers were given (also KVFENCE_CLUSTER_KEY_FILE)\n\n"
            "Every option can also be set as KVFENCE_<OPTION> in the environment (KVFENCE_DECODE for\n"
            "--decode); the command line wins. GET /health lists every worker and whether it is\n"
            "reachable; it answers 200 only when a decode worker with a live prefill worker is up.\n"
            "SIGINT or SIGTERM stops accepting, lets requests in flight finish (up to 10 s),\n"
            "cancels the rest, and exits 0.\n");
}

int kvf_cmd_router(int argc, char **argv)
{
    const char *model_path = NULL, *prefills = NULL, *decodes = NULL;
    uint32_t ctx_len = 0, admit_ms = 0;
    struct kvf_cli_http http = {.port = 8080};
    struct kvf_cli_fabric fab = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--no-auth") == 0) {
            http.no_auth = true;
            continue;
        }
        if (kvf_cli_fabric_flag(&fab, a)) continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "kvfence router: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0, took = kvf_cli_http_option("router", &http, a, v);
        if (took < 0) return 2;
        if (took) continue;
        if (kvf_cli_fabric_option(&fab, a, v)) continue;
        if (strcmp(a, "--model") == 0) model_path = v;
        else if (strcmp(a, "--prefill") == 0) prefills = v;
        else if (strcmp(a, "--decode") == 0) decodes = v;
        else if (strcmp(a, "--context-length") == 0) bad = kvf_cli_parse_u32(v, 2, 1u << 20, &ctx_len);
        else if (strcmp(a, "--admit-timeout") == 0) bad = kvf_cli_parse_u32(v, 1, 3600000, &admit_ms);
        else {
            fprintf(stderr, "kvfence router: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvfence router: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (!model_path || !prefills || !decodes) {
        fprintf(stderr, "kvfence router: --model, --prefill and --decode are required\n");
        usage(stderr);
        return 2;
    }
    struct kvf_cli_addrs pf, dc;
    if (kvf_cli_parse_addrs("router", "--prefill", prefills, &pf) < 0 ||
        kvf_cli_parse_addrs("router", "--decode", decodes, &dc) < 0)
        return 2;
    int prc = kvf_cli_fabric_prepare("router", &fab, NULL);
    if (prc) return prc;
    prc = kvf_cli_http_prepare("router", &http);
    if (prc) return prc;

    sigset_t sigs;
    kvf_cli_block_stop_signals(&sigs);
    int status = 1;
    char err[256] = "";
    kvf_gguf_t *g = NULL;
    kvf_model_t *m = NULL;
    kvf_tokenizer_t *tok = NULL;
    kvf_router_t *r = NULL;
    kvf_server_t *srv = NULL;
    uint64_t fp = 0;
    if (kvf_cli_open_model("router", model_path, &g, &m, &tok, &fp) < 0) goto out;
    const struct kvf_model_hparams *hp = kvf_model_hparams(m);
    uint32_t limit = ctx_len ? ctx_len : hp->n_ctx;
    if (limit > hp->n_ctx) {
        fprintf(stderr, "kvfence router: --context-length %u is beyond the model's context (%u)\n",
                limit, hp->n_ctx);
        goto out;
    }
    const char *ph[KVF_CLI_MAX_ADDRS], *dh[KVF_CLI_MAX_ADDRS];
    for (uint32_t i = 0; i < pf.n; i++) ph[i] = pf.host[i];
    for (uint32_t i = 0; i < dc.n; i++) dh[i] = dc.host[i];
    struct kvf_router_config rc = {.decode_hosts = dh, .decode_ports = dc.port, .n_decodes = dc.n,
                                   .prefill_hosts = ph, .prefill_ports = pf.port,
                                   .n_prefills = pf.n, .model_fp = fp, .max_context = limit,
                                   .page_tokens = ROUTER_PAGE_TOKENS, .n_vocab = hp->n_vocab,
                                   .max_queue = http.max_queue, .admit_timeout_ms = admit_ms,
                                   .fabric_key = kvf_cli_fabric_key(&fab)};
    if (kvf_router_start(&rc, &r, err, sizeof err) < 0) {
        fprintf(stderr, "kvfence router: %s\n", err);
        goto out;
    }
    if (kvf_cli_http_start("router", &http, model_path, g, tok, &kvf_router_gen_ops, r, &srv) < 0) goto out;
    fprintf(stderr,
            "kvfence router: listening on http://%s:%u — model %s (%s), context limit %u tokens, "
            "%u prefill and %u decode workers, chat: %s\n",
            http.host, kvf_server_port(srv), http.model_name, kvf_model_type_name(m), limit, pf.n,
            dc.n, http.chat_model ? "the model's template" : "default rendering");
    kvf_cli_http_say_auth("router", &http);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvfence router: %s: stopping (requests in flight get up to 10 s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    status = 0;
out:
    kvf_server_stop(srv);
    kvf_router_stop(r, 10000);
    kvf_tokenizer_destroy(tok);
    kvf_model_free(m);
    kvf_gguf_close(g);
    kvf_cli_http_free(&http);
    if (status == 0) fprintf(stderr, "kvfence router: stopped\n");
    return status;
}
