/* `kvfence prefill`: a prefill worker as its own process. It listens for decode workers (UCX over
 * TCP), computes each granted prompt's KV in its own pool and writes it into the granted decode
 * pages. Decode workers connect to it; the context limit must equal theirs (checked at connect). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvfence/engine.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvfence prefill --model F.gguf --listen HOST:PORT [--context-length N]\n"
               "                       [--threads N] [--kv-memory SIZE] [--compute-lock FILE]\n"
               "                       [--prefill-chunk N]\n"
               "                       [--cluster-key FILE | --insecure-fabric]\n\n"
               "Runs a prefill worker: decode workers connect to HOST:PORT (TCP; they prove the\n"
               "cluster key, and it proves it to them) and grant\n"
               "it pages to write. --context-length (default: the model's) must equal the decode\n"
               "workers'. --kv-memory sizes its own pool (default: one prompt at the context\n"
               "length). Prints \"listening HOST PORT\" on stdout once it accepts connections.\n"
               "--compute-lock FILE: workers on the same cores given the same file take turns\n"
               "computing, one forward call at a time, instead of halving each other.\n"
               "--prefill-chunk N: prompt tokens computed per turn (default 256); each chunk's\n"
               "pages go to decode while the next is computed, and prompts take turns by chunks,\n"
               "the shortest first, so a short prompt does not wait for a long one.\n"
               "Every option can also be set as KVFENCE_<OPTION> in the environment; the command\n"
               "line wins. SIGINT or SIGTERM stops it (its connections close; decode fences them).\n\n"
               KVF_CLI_FABRIC_HELP);
}

int kvf_cmd_prefill(int argc, char **argv)
{
    const char *model_path = NULL, *listen = NULL, *lock_path = NULL;
    uint32_t threads = 0, ctx_len = 0, chunk = 0;
    uint64_t kv_bytes = 0;
    struct kvf_cli_fabric fab = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (kvf_cli_fabric_flag(&fab, a)) continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "kvfence prefill: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (kvf_cli_fabric_option(&fab, a, v)) continue;
        if (strcmp(a, "--model") == 0) model_path = v;
        else if (strcmp(a, "--listen") == 0) listen = v;
        else if (strcmp(a, "--compute-lock") == 0) lock_path = v;
        else if (strcmp(a, "--threads") == 0) bad = kvf_cli_parse_u32(v, 1, 256, &threads);
        else if (strcmp(a, "--context-length") == 0) bad = kvf_cli_parse_u32(v, 2, 1u << 20, &ctx_len);
        else if (strcmp(a, "--kv-memory") == 0) bad = kvf_cli_parse_size(v, &kv_bytes);
        else if (strcmp(a, "--prefill-chunk") == 0) bad = kvf_cli_parse_u32(v, 16, 4096, &chunk);
        else {
            fprintf(stderr, "kvfence prefill: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvfence prefill: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (!model_path || !listen) {
        usage(stderr);
        return 2;
    }
    char host[256];
    uint32_t port = 0;
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof(host) ||
        kvf_cli_parse_u32(colon + 1, 0, 65535, &port) < 0) {
        fprintf(stderr, "kvfence prefill: --listen wants HOST:PORT, not '%s'\n", listen);
        return 2;
    }
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    int frc = kvf_cli_fabric_prepare("prefill", &fab, host);
    if (frc) return frc;
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
    kvf_prefill_worker_t *pw = NULL;
    uint64_t fp = 0;
    if (kvf_cli_open_model("prefill", model_path, &g, &m, NULL, &fp) < 0) goto out;
    const struct kvf_model_hparams *hp = kvf_model_hparams(m);
    if (ctx_len == 0) ctx_len = hp->n_ctx;
    if (ctx_len > hp->n_ctx) {
        fprintf(stderr, "kvfence prefill: --context-length %u is beyond the model's context (%u)\n",
                ctx_len, hp->n_ctx);
        goto out;
    }
    struct kvf_pool_geometry geo;
    kvf_model_geometry(m, 16, &geo);
    uint32_t need = (ctx_len + 15) / 16 + 1;
    uint32_t n_pages = kv_bytes ? (uint32_t)(kv_bytes / kvf_geo_page_bytes(&geo)) : need;
    if (n_pages < need) {
        fprintf(stderr, "kvfence prefill: --kv-memory holds %u pages, less than one prompt at the "
                        "context length %u (%u pages); raise --kv-memory or lower --context-length\n",
                n_pages, ctx_len, need);
        goto out;
    }
    struct kvf_worker_config wc = {.model = m, .model_fp = fp, .page_tokens = 16, .n_pages = n_pages,
                                   .n_threads = threads, .max_context = ctx_len, .listen_host = host,
                                   .listen_port = (uint16_t)port, .max_reqs = 64, .prefill_chunk = chunk,
                                   .fabric_key = kvf_cli_fabric_key(&fab)};
    if (lock_path && kvf_cli_compute_lock("prefill", lock_path, &wc) < 0) goto out;
#if defined(KVF_TEST_BUILD)
    wc.poison_free = getenv("KVF_POISON") && atoi(getenv("KVF_POISON"));
#endif
    if (kvf_prefill_worker_start(&wc, &pw, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence prefill: %s\n", err);
        goto out;
    }
    printf("listening %s %u\n", host, kvf_prefill_worker_port(pw));
    fflush(stdout);
    fprintf(stderr, "kvfence prefill: listening on %s:%u (context limit %u, pool %u pages)\n", host,
            kvf_prefill_worker_port(pw), ctx_len, n_pages);
    int sig = 0;
    sigwait(&sigs, &sig);
    status = 0;
out:
    kvf_prefill_worker_stop(pw);
    kvf_model_free(m);
    kvf_gguf_close(g);
    return status;
}
