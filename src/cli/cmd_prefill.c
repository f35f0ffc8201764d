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
#include "kvfence/common.h"
#include "kvfence/engine.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"

struct prefill_opts {
    const char *model, *lock_path;
    struct kvf_cli_addr listen;
    uint32_t threads, ctx_len, chunk; /* 0: the default */
    uint64_t kv_bytes;                /* 0: one prompt at the context length */
    uint64_t cache_bytes;             /* the prefix cache's pages (0: none) */
    struct kvf_cli_fabric fab;
};

#define O(f) offsetof(struct prefill_opts, f)
static const struct kvf_cli_opt prefill_opts[] = {
    KVF_CLI_OPT_MODEL(struct prefill_opts, model, KVF_CLI_REQUIRED,
                      "the model, the same file as the decode workers' and the router's"),
    {.name = "--listen",
     .metavar = "HOST:PORT",
     .kind = KVF_CLI_ADDR,
     .off = O(listen),
     .env = "KVFENCE_LISTEN",
     .flags = KVF_CLI_REQUIRED,
     .help = "where decode workers connect (port 0: any free port)"},
    KVF_CLI_OPT_CONTEXT(
        struct prefill_opts, ctx_len,
        "the most prompt + output tokens of one request (default: the model's); must equal "
        "the decode workers' (checked at connect)"),
    KVF_CLI_OPT_THREADS(struct prefill_opts, threads),
    KVF_CLI_OPT_KV_MEMORY(struct prefill_opts, kv_bytes, NULL,
                          "its own pool, e.g. 512M (default: one prompt at the context length)"),
    KVF_CLI_OPT_PREFIX_CACHE(struct prefill_opts, cache_bytes),
    KVF_CLI_OPT_COMPUTE_LOCK(
        struct prefill_opts, lock_path,
        "workers on the same cores given the same file take turns computing, one forward "
        "call at a time, instead of halving each other"),
    KVF_CLI_OPT_PREFILL_CHUNK(
        struct prefill_opts, chunk,
        "prompt tokens computed per turn (default 256); each chunk's pages go to decode "
        "while the next is computed, and prompts take turns by chunks, the shortest first, "
        "so a short prompt does not wait for a long one"),
    KVF_CLI_FABRIC_OPTS(struct prefill_opts, fab),
};
#undef O

static const struct kvf_cli_spec prefill_spec = {
    .name = "prefill",
    .opts = prefill_opts,
    .n_opts = KVF_ARRAY_LEN(prefill_opts),
    .opts_size = sizeof(struct prefill_opts),
    .about =
        "Runs a prefill worker: decode workers connect to HOST:PORT (TCP; they prove the cluster\n"
        "key, and it proves it to them) and grant it pages to write. Prints \"listening HOST\n"
        "PORT\" on stdout once it accepts connections.\n",
    .after = "Every option can also be set from the environment, as the variable in its brackets;\n"
             "the command line wins. SIGINT or SIGTERM stops it (its connections close; decode\n"
             "fences them).\n",
};

int kvf_cmd_prefill(int argc, char **argv)
{
    struct prefill_opts o = {0};
    int exit_status = 0;
    if (kvf_cli_parse(&prefill_spec, argc, argv, &o, &exit_status) < 0) return exit_status;
    const char *host = o.listen.host;
    int frc = kvf_cli_fabric_prepare("prefill", &o.fab, host);
    if (frc) return frc;
    uint32_t threads = o.threads, ctx_len = o.ctx_len;
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
    kvf_pworker_t *pw = NULL;
    uint64_t fp = 0;
    if (kvf_cli_open_model("prefill", o.model, &g, &m, NULL, &fp) < 0) goto out;
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
    uint32_t n_pages = o.kv_bytes ? (uint32_t)(o.kv_bytes / kvf_geo_page_bytes(&geo)) : need;
    if (n_pages < need) {
        fprintf(stderr,
                "kvfence prefill: --kv-memory holds %u pages, less than one prompt at the "
                "context length %u (%u pages); raise --kv-memory or lower --context-length\n",
                n_pages, ctx_len, need);
        goto out;
    }
    gv = kvf_cli_grammar_vocab(g, NULL);
    struct kvf_worker_config wc = {.model = m,
                                   .grammar_vocab = gv,
                                   .model_fp = fp,
                                   .page_tokens = 16,
                                   .n_pages = n_pages,
                                   .n_threads = threads,
                                   .max_context = ctx_len,
                                   .listen_host = host,
                                   .listen_port = o.listen.port,
                                   .max_reqs = 64,
                                   .prefill_chunk = o.chunk,
                                   .prefix_cache_pages =
                                       (uint32_t)(o.cache_bytes / kvf_geo_page_bytes(&geo)),
                                   .fabric_key = kvf_cli_fabric_key(&o.fab)};
    if (o.lock_path && kvf_cli_compute_lock("prefill", o.lock_path, &wc) < 0) goto out;
#if defined(KVF_TEST_BUILD)
    wc.poison_free = getenv("KVF_POISON") && atoi(getenv("KVF_POISON"));
#endif
    if (kvf_pworker_start(&wc, &pw, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence prefill: %s\n", err);
        goto out;
    }
    printf("listening %s %u\n", host, kvf_pworker_port(pw));
    fflush(stdout);
    fprintf(stderr, "kvfence prefill: listening on %s:%u (context limit %u, pool %u pages)\n", host,
            kvf_pworker_port(pw), ctx_len, n_pages);
    int sig = 0;
    sigwait(&sigs, &sig);
    status = 0;
out:
    kvf_pworker_stop(pw);
    kvf_model_free(m);
    kvf_grammar_vocab_free(gv);
    kvf_gguf_close(g);
    return status;
}
