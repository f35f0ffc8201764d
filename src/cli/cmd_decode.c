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

#define DECODE_PAGE_TOKENS 16u

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvfence decode --model F.gguf --listen HOST:PORT [--prefill HOST:PORT[,...]]\n"
            "                      [--context-length N] [--kv-memory SIZE] [--threads N]\n"
            "                      [--max-queue N] [--admit-timeout MS] [--compute-lock FILE]\n"
            "                      [--progress-timeout MS] [--hold-timeout MS]\n"
            "                      [--cluster-key FILE | --insecure-fabric]\n\n"
            "Runs a decode worker: routers connect to HOST:PORT (TCP, authenticated by the cluster\n"
            "key) and submit requests;\n"
            "it grants KV pages to prefill workers, verifies what they wrote, and decodes.\n\n"
            "  --listen HOST:PORT    where routers connect (port 0: any free port)\n"
            "  --prefill LIST        prefill workers to use besides those the routers name\n"
            "  --context-length N    the most prompt + output tokens of one request (default: the\n"
            "                        model's, bounded by the pool); must equal the router's and the\n"
            "                        prefill workers' (checked at connect)\n"
            "  --kv-memory SIZE      the KV pool, e.g. 512M, 2G (default 1G)\n"
            "  --threads N           compute threads (default: every core)\n"
            "  --max-queue N         requests waiting for pages before new ones are refused (256)\n"
            "  --admit-timeout MS    how long a request may wait for pages and a prefill (default\n"
            "                        30000); then 503 pool_exhausted or no_prefill\n"
            "  --compute-lock FILE   workers on the same cores given the same file take turns\n"
            "                        computing, one forward call at a time (as the workers of\n"
            "                        `kvfence serve` do), instead of halving each other\n"
            "  --progress-timeout MS  a prompt whose prefill worker reports no progress for MS\n"
            "                        fails (503 prefill_stalled; default 5000); a prompt that is\n"
            "                        being computed, however long, never fails by time\n"
            "                        (--grant-timeout: the older name)\n"
            "  --hold-timeout MS     pages of a cancelled prompt whose writer did not prove it\n"
            "                        stopped within this are\n"
            "                        quarantined and the writer fenced: its connection closed, a\n"
            "                        new one at a new epoch (default 30000). Neither timeout frees\n"
            "                        a page by itself: only a proof or the fence does\n"
            KVF_CLI_FABRIC_HELP "\n"
            "Every option can also be set as KVFENCE_<OPTION> in the environment (KVFENCE_KV_MEMORY\n"
            "for --kv-memory); the command line wins. Prints \"listening HOST PORT\" on stdout once\n"
            "it accepts routers. SIGINT or SIGTERM: requests in flight get up to 10 s, then the\n"
            "rest are cancelled through the protocol, and it exits 0.\n");
}

int kvf_cmd_decode(int argc, char **argv)
{
    const char *model_path = NULL, *listen = NULL, *prefills = NULL, *lock_path = NULL;
    uint32_t threads = 0, ctx_len = 0, max_queue = 0, admit_ms = 0, grant_ms = 0, hold_ms = 0;
    uint64_t kv_bytes = 1ull << 30;
    bool ctx_given = false;
    struct kvf_cli_fabric fab = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (kvf_cli_fabric_flag(&fab, a)) continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "kvfence decode: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (kvf_cli_fabric_option(&fab, a, v)) continue;
        if (strcmp(a, "--model") == 0) model_path = v;
        else if (strcmp(a, "--listen") == 0) listen = v;
        else if (strcmp(a, "--prefill") == 0) prefills = v;
        else if (strcmp(a, "--compute-lock") == 0) lock_path = v;
        else if (strcmp(a, "--threads") == 0) bad = kvf_cli_parse_u32(v, 1, 256, &threads);
        else if (strcmp(a, "--context-length") == 0) bad = kvf_cli_parse_u32(v, 2, 1u << 20, &ctx_len), ctx_given = true;
        else if (strcmp(a, "--kv-memory") == 0) bad = kvf_cli_parse_size(v, &kv_bytes);
        else if (strcmp(a, "--max-queue") == 0) bad = kvf_cli_parse_u32(v, 1, 1u << 20, &max_queue);
        else if (strcmp(a, "--admit-timeout") == 0) bad = kvf_cli_parse_u32(v, 1, 3600000, &admit_ms);
        else if (strcmp(a, "--progress-timeout") == 0 || strcmp(a, "--grant-timeout") == 0)
            bad = kvf_cli_parse_u32(v, 100, 3600000, &grant_ms);
        else if (strcmp(a, "--hold-timeout") == 0) bad = kvf_cli_parse_u32(v, 100, 3600000, &hold_ms);
        else {
            fprintf(stderr, "kvfence decode: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvfence decode: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (!model_path || !listen) {
        fprintf(stderr, "kvfence decode: --model and --listen are required\n");
        usage(stderr);
        return 2;
    }
    char host[256];
    uint16_t port = 0;
    if (kvf_cli_parse_addr(listen, host, sizeof host, &port, true) < 0) {
        fprintf(stderr, "kvfence decode: --listen wants HOST:PORT, not '%s'\n", listen);
        return 2;
    }
    int frc = kvf_cli_fabric_prepare("decode", &fab, host);
    if (frc) return frc;
    struct kvf_cli_addrs pf = {0};
    if (prefills && kvf_cli_parse_addrs("decode", "--prefill", prefills, &pf) < 0) return 2;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint32_t)n : 1;
    }
    sigset_t sigs;
    kvf_cli_block_stop_signals(&sigs);

    int status = 1;
    char err[256] = "";
    kvf_gguf_t *g = NULL;
    kvf_model_t *m = NULL;
    kvf_decode_worker_t *dw = NULL;
    kvf_decode_service_t *svc = NULL;
    uint64_t fp = 0;
    if (kvf_cli_open_model("decode", model_path, &g, &m, NULL, &fp) < 0) goto out;
    const struct kvf_model_hparams *hp = kvf_model_hparams(m);
    uint32_t limit = 0, n_pages = 0;
    if (kvf_cli_pool_limit("decode", m, DECODE_PAGE_TOKENS, kv_bytes, ctx_given ? ctx_len : 0, &limit,
                           &n_pages) < 0)
        goto out;
    struct kvf_worker_config wc = {.model = m, .model_fp = fp, .page_tokens = DECODE_PAGE_TOKENS,
                                   .n_pages = n_pages, .n_threads = threads, .max_context = limit,
                                   .max_batch = 16, .max_reqs = 64, .max_queue = max_queue,
                                   .admit_timeout_ms = admit_ms, .grant_timeout_ms = grant_ms,
                                   .hold_timeout_ms = hold_ms, .fabric_key = kvf_cli_fabric_key(&fab)};
    if (lock_path && kvf_cli_compute_lock("decode", lock_path, &wc) < 0) goto out;
#if defined(KVF_TEST_BUILD)
    wc.poison_free = getenv("KVF_POISON") && atoi(getenv("KVF_POISON"));
#endif
    if (kvf_decode_worker_start(&wc, &dw, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence decode: %s\n", err);
        goto out;
    }
    for (uint32_t i = 0; i < pf.n; i++) kvf_decode_worker_add_prefill(dw, pf.host[i], pf.port[i]);
    struct kvf_decode_service_config sc = {host, port, fp, limit, DECODE_PAGE_TOKENS, hp->n_vocab, 0,
                                           kvf_cli_fabric_key(&fab)};
    if (kvf_decode_service_start(dw, &sc, &svc, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence decode: cannot listen on %s: %s\n", listen, err);
        goto out;
    }
    printf("listening %s %u\n", host, kvf_decode_service_port(svc));
    fflush(stdout);
    fprintf(stderr,
            "kvfence decode: listening on %s:%u — model %s (%s), context limit %u tokens, pool %u "
            "pages of %u tokens, %u threads\n",
            host, kvf_decode_service_port(svc), model_path, kvf_model_type_name(m), limit, n_pages,
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
            kvf_decode_gen_ops.info(dw, &in);
            if (in.running == 0 && in.queued == 0) break;
            usleep(10000);
        }
    }
    kvf_decode_service_stop(svc);
    kvf_decode_worker_stop(dw, 10000);
    kvf_model_free(m);
    kvf_gguf_close(g);
    if (status == 0) fprintf(stderr, "kvfence decode: stopped\n");
    return status;
}
