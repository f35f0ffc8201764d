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
#include "kvfence/common.h"

#define ROUTER_PAGE_TOKENS 16u

struct router_opts {
    const char *model;
    struct kvf_cli_addrs prefills, decodes;
    uint32_t ctx_len, admit_ms; /* 0: the default */
    struct kvf_cli_http http;
    struct kvf_cli_fabric fab;
};

#define O(f) offsetof(struct router_opts, f)
static const struct kvf_cli_opt router_opts[] = {
    KVF_CLI_OPT_MODEL(
        struct router_opts, model, KVF_CLI_REQUIRED,
        "the same model file the workers serve (its fingerprint, context and page geometry "
        "must agree: a worker that differs is refused with the reason, in the log and in "
        "/health)"),
    {.name = "--prefill",
     .metavar = "HOST:PORT[,...]",
     .kind = KVF_CLI_ADDRS,
     .off = O(prefills),
     .env = "KVFENCE_PREFILL",
     .flags = KVF_CLI_REQUIRED,
     .help = "the prefill workers, separated by commas; every decode worker connects to each and "
             "grants it prompts"},
    {.name = "--decode",
     .metavar = "HOST:PORT[,...]",
     .kind = KVF_CLI_ADDRS,
     .off = O(decodes),
     .env = "KVFENCE_DECODE",
     .flags = KVF_CLI_REQUIRED,
     .help = "the decode workers; a request goes to the live one with the fewest of this "
             "router's requests in flight, then the most free pages"},
    KVF_CLI_OPT_CONTEXT(struct router_opts, ctx_len,
                        "the served limit (default: the model's); must equal the workers'"),
    KVF_CLI_HTTP_OPTS(struct router_opts, http),
    KVF_CLI_OPT_ADMIT_TIMEOUT(
        struct router_opts, admit_ms,
        "how long a request may wait for a live decode worker with a prefill before it "
        "fails with 503 no_decode or no_prefill (default 30000)"),
    KVF_CLI_FABRIC_OPTS(struct router_opts, fab),
};
#undef O

static const struct kvf_cli_spec router_spec = {
    .name = "router",
    .opts = router_opts,
    .n_opts = KVF_ARRAY_LEN(router_opts),
    .opts_size = sizeof(struct router_opts),
    .about =
        "Runs the HTTP router (the same API as `kvfence serve`) over prefill and decode workers\n"
        "in their own processes (`kvfence prefill`, `kvfence decode`), on this host or others.\n",
    .after =
        "Every option can also be set from the environment, as the variable in its brackets\n"
        "(KVFENCE_DECODE for --decode); the command line wins. GET /health lists every worker\n"
        "and whether it is reachable; it answers 200 only when a decode worker with a live\n"
        "prefill worker is up. SIGINT or SIGTERM stops accepting, lets requests in flight finish\n"
        "(up to 10 s), cancels the rest, and exits 0.\n",
};

int kvf_cmd_router(int argc, char **argv)
{
    struct router_opts o = {0};
    int exit_status = 0;
    if (kvf_cli_parse(&router_spec, argc, argv, &o, &exit_status) < 0) return exit_status;
    const struct kvf_cli_addrs *pf = &o.prefills, *dc = &o.decodes;
    int prc = kvf_cli_fabric_prepare("router", &o.fab, NULL);
    if (prc) return prc;
    prc = kvf_cli_http_prepare("router", &o.http);
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
    if (kvf_cli_open_model("router", o.model, &g, &m, &tok, &fp) < 0) goto out;
    const struct kvf_model_hparams *hp = kvf_model_hparams(m);
    uint32_t limit = o.ctx_len ? o.ctx_len : hp->n_ctx;
    if (limit > hp->n_ctx) {
        fprintf(stderr, "kvfence router: --context-length %u is beyond the model's context (%u)\n",
                limit, hp->n_ctx);
        goto out;
    }
    const char *ph[KVF_CLI_MAX_ADDRS], *dh[KVF_CLI_MAX_ADDRS];
    for (uint32_t i = 0; i < pf->n; i++)
        ph[i] = pf->host[i];
    for (uint32_t i = 0; i < dc->n; i++)
        dh[i] = dc->host[i];
    struct kvf_router_config rc = {.decode_hosts = dh,
                                   .decode_ports = dc->port,
                                   .n_decodes = dc->n,
                                   .prefill_hosts = ph,
                                   .prefill_ports = pf->port,
                                   .n_prefills = pf->n,
                                   .model_fp = fp,
                                   .max_context = limit,
                                   .page_tokens = ROUTER_PAGE_TOKENS,
                                   .n_vocab = hp->n_vocab,
                                   .max_queue = o.http.max_queue,
                                   .admit_timeout_ms = o.admit_ms,
                                   .fabric_key = kvf_cli_fabric_key(&o.fab)};
    if (kvf_router_start(&rc, &r, err, sizeof err) < 0) {
        fprintf(stderr, "kvfence router: %s\n", err);
        goto out;
    }
    if (kvf_cli_http_start("router", &o.http, o.model, fp, g, tok, &kvf_router_gen_ops, r, &srv) <
        0)
        goto out;
    fprintf(stderr,
            "kvfence router: listening on http://%s:%u — model %s (%s), context limit %u tokens, "
            "%u prefill and %u decode workers, chat: %s\n",
            o.http.host, kvf_server_port(srv), o.http.model_name, kvf_model_type_name(m), limit,
            pf->n, dc->n, o.http.chat_model ? "the model's template" : "default rendering");
    kvf_cli_http_say_auth("router", &o.http, srv);
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
    kvf_cli_http_free(&o.http);
    if (status == 0) fprintf(stderr, "kvfence router: stopped\n");
    return status;
}
