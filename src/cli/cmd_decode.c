/* `kvfence decode`: a decode worker as its own process. It owns the fenced KV pool, grants
 * pages to prefill workers, verifies what they wrote and decodes; routers connect to it (UCX
 * over TCP) and submit tokenized requests. The prefill workers to use come from the routers'
 * HELLO (their --prefill list) and from --prefill here. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvfence/common.h"

#define DECODE_PAGE_TOKENS 16u

struct decode_opts {
    const char *model, *lock_path;
    struct kvf_cli_addr listen;
    struct kvf_cli_addrs prefills;
    uint32_t threads, ctx_len, max_queue, admit_ms, grant_ms, hold_ms; /* 0: the default */
    uint64_t kv_bytes;
    bool log_commits;
    struct kvf_cli_fabric fab;
};

#define O(f) offsetof(struct decode_opts, f)
static const struct kvf_cli_opt decode_opts[] = {
    KVF_CLI_OPT_MODEL(struct decode_opts, model, KVF_CLI_REQUIRED,
                      "the model, the same file as the prefill workers' and the router's"),
    {.name = "--listen",
     .metavar = "HOST:PORT",
     .kind = KVF_CLI_ADDR,
     .off = O(listen),
     .env = "KVFENCE_LISTEN",
     .flags = KVF_CLI_REQUIRED,
     .help = "where routers connect (port 0: any free port)"},
    {.name = "--prefill",
     .metavar = "HOST:PORT[,...]",
     .kind = KVF_CLI_ADDRS,
     .off = O(prefills),
     .env = "KVFENCE_PREFILL",
     .help = "prefill workers to use besides those the routers name"},
    KVF_CLI_OPT_CONTEXT(
        struct decode_opts, ctx_len,
        "the most prompt + output tokens of one request (default: the model's, bounded by "
        "the pool); must equal the router's and the prefill workers' (checked at connect)"),
    KVF_CLI_OPT_KV_MEMORY(struct decode_opts, kv_bytes, "1G", "the KV pool, e.g. 512M, 2G"),
    KVF_CLI_OPT_THREADS(struct decode_opts, threads),
    KVF_CLI_OPT_LOG_COMMITS(struct decode_opts, log_commits),
    {.name = "--max-queue",
     .metavar = "N",
     .kind = KVF_CLI_U32,
     .off = O(max_queue),
     .lo = 1,
     .hi = 1u << 20,
     .env = "KVFENCE_MAX_QUEUE",
     .help = "requests waiting for pages before new ones are refused (default 256)"},
    KVF_CLI_OPT_ADMIT_TIMEOUT(
        struct decode_opts, admit_ms,
        "how long a request may wait for pages and a prefill (default 30000); then 503 "
        "pool_exhausted or no_prefill"),
    KVF_CLI_OPT_COMPUTE_LOCK(
        struct decode_opts, lock_path,
        "workers on the same cores given the same file take turns computing, one forward "
        "call at a time (as the workers of `kvfence serve` do), instead of halving each "
        "other"),
    KVF_CLI_OPT_PROGRESS_TIMEOUT(
        struct decode_opts, grant_ms,
        "a prompt whose prefill worker reports no progress for MS fails (503 "
        "prefill_stalled; default 5000); a prompt that is being computed, however long, "
        "never fails by time"),
    KVF_CLI_OPT_HOLD_TIMEOUT(
        struct decode_opts, hold_ms,
        "pages of a cancelled prompt whose writer did not prove it stopped within this are "
        "quarantined and the writer fenced: its connection closed, a new one at a new epoch "
        "(default 30000). Neither timeout frees a page by itself: only a proof or the fence "
        "does"),
    KVF_CLI_FABRIC_OPTS(struct decode_opts, fab),
};
#undef O

static const struct kvf_cli_spec decode_spec = {
    .name = "decode",
    .opts = decode_opts,
    .n_opts = KVF_ARRAY_LEN(decode_opts),
    .opts_size = sizeof(struct decode_opts),
    .about =
        "Runs a decode worker: routers connect to HOST:PORT (TCP, authenticated by the cluster\n"
        "key) and submit requests; it grants KV pages to prefill workers, verifies what they\n"
        "wrote, and decodes.\n",
    .after =
        "Every option can also be set from the environment, as the variable in its brackets\n"
        "(KVFENCE_KV_MEMORY for --kv-memory); the command line wins. Prints \"listening HOST\n"
        "PORT\" on stdout once it accepts routers. SIGINT or SIGTERM: requests in flight get up\n"
        "to 10 s, then the rest are cancelled through the protocol, and it exits 0.\n",
};

int kvf_cmd_decode(int argc, char **argv)
{
    struct decode_opts o = {0};
    int exit_status = 0;
    if (kvf_cli_parse(&decode_spec, argc, argv, &o, &exit_status) < 0) return exit_status;
    const char *host = o.listen.host;
    uint16_t port = o.listen.port;
    int frc = kvf_cli_fabric_prepare("decode", &o.fab, host);
    if (frc) return frc;
    const struct kvf_cli_addrs *pf = &o.prefills;
    uint32_t threads = o.threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint32_t)n : 1;
    }
    sigset_t sigs;
    kvf_cli_block_stop_signals(&sigs);

    int status = 1;
    char err[256] = "";
    kvf_gguf_t *g = NULL;
    kvf_grammar_vocab_t *gv = NULL;
    kvf_model_t *m = NULL;
    kvf_dworker_t *dw = NULL;
    kvf_decode_service_t *svc = NULL;
    uint64_t fp = 0;
    if (kvf_cli_open_model("decode", o.model, &g, &m, NULL, &fp) < 0) goto out;
    const struct kvf_model_hparams *hp = kvf_model_hparams(m);
    uint32_t limit = 0, n_pages = 0;
    if (kvf_cli_pool_limit("decode", m, DECODE_PAGE_TOKENS, o.kv_bytes, o.ctx_len, &limit,
                           &n_pages) < 0)
        goto out;
    gv = kvf_cli_grammar_vocab(g, NULL);
    struct kvf_worker_config wc = {.model = m,
                                   .grammar_vocab = gv,
                                   .model_fp = fp,
                                   .page_tokens = DECODE_PAGE_TOKENS,
                                   .n_pages = n_pages,
                                   .n_threads = threads,
                                   .max_context = limit,
                                   .max_batch = 16,
                                   .max_reqs = 64,
                                   .max_queue = o.max_queue,
                                   .admit_timeout_ms = o.admit_ms,
                                   .grant_timeout_ms = o.grant_ms,
                                   .hold_timeout_ms = o.hold_ms,
                                   .fabric_key = kvf_cli_fabric_key(&o.fab),
                                   .log_commits = o.log_commits};
    if (o.lock_path && kvf_cli_compute_lock("decode", o.lock_path, &wc) < 0) goto out;
#if defined(KVF_TEST_BUILD)
    wc.poison_free = getenv("KVF_POISON") && atoi(getenv("KVF_POISON"));
#endif
    if (kvf_dworker_start(&wc, &dw, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence decode: %s\n", err);
        goto out;
    }
    for (uint32_t i = 0; i < pf->n; i++)
        kvf_dworker_add_prefill(dw, pf->host[i], pf->port[i]);
    struct kvf_decode_service_config sc = {.listen_host = host,
                                           .listen_port = port,
                                           .model_fp = fp,
                                           .max_context = limit,
                                           .page_tokens = DECODE_PAGE_TOKENS,
                                           .n_vocab = hp->n_vocab,
                                           .fabric_key = kvf_cli_fabric_key(&o.fab)};
    if (kvf_decode_service_start(dw, &sc, &svc, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence decode: cannot listen on %s: %s\n", o.listen.text, err);
        goto out;
    }
    printf("listening %s %u\n", host, kvf_decode_service_port(svc));
    fflush(stdout);
    fprintf(stderr,
            "kvfence decode: listening on %s:%u — model %s (%s), context limit %u tokens, pool %u "
            "pages of %u tokens, %u threads\n",
            host, kvf_decode_service_port(svc), o.model, kvf_model_type_name(m), limit, n_pages,
            DECODE_PAGE_TOKENS, threads);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvfence decode: %s: stopping (requests in flight get up to 10 s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    status = 0;
out:
    /* Requests in flight finish first (the routers still read them), then the routers go. */
    if (dw && svc) {
        for (int i = 0; i < 1000; i++) {
            struct kvf_engine_info in;
            kvf_dworker_gen_ops.info(dw, &in);
            if (in.running == 0 && in.queued == 0) break;
            usleep(10000);
        }
    }
    kvf_decode_service_stop(svc);
    kvf_dworker_stop(dw, 10000);
    kvf_model_free(m);
    kvf_grammar_vocab_free(gv);
    kvf_gguf_close(g);
    if (status == 0) fprintf(stderr, "kvfence decode: stopped\n");
    return status;
}
