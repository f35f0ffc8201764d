/* `kvfence serve`: router + one prefill worker + one decode worker in one process, joined by the
 * real protocol over the authenticated fabric on loopback (TCP), serving the OpenAI-compatible API.
 *
 * Sharing the cores: both workers run their forward passes with the same number of compute
 * threads, and every forward call takes one process-wide compute lock, so the two thread pools
 * never run at once on the same cores (two spinning pools on two cores halve both). A prefill
 * chunk and a decode step alternate at the granularity of one forward call. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli.h"
#include "kvfence/common.h"
#include "kvfence/transport.h"
#include "kvfence/engine.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/server.h"
#include "kvfence/text.h"

#define SERVE_PAGE_TOKENS 16u

/* The seam the router serves from: the decode worker's, with /health's prefill figures filled
 * in from the prefill worker of this process. */
static kvf_pworker_t *serve_pw;
static int serve_submit(void *e, const struct kvf_gen_params *p, kvf_gen_t **out)
{
    return kvf_dworker_gen_ops.submit(e, p, out);
}
static int serve_next(void *e, kvf_gen_t *g, struct kvf_gen_event *ev, int timeout_ms)
{
    return kvf_dworker_gen_ops.next(e, g, ev, timeout_ms);
}
static void serve_cancel(void *e, kvf_gen_t *g)
{
    kvf_dworker_gen_ops.cancel(e, g);
}
static void serve_release(void *e, kvf_gen_t *g)
{
    kvf_dworker_gen_ops.release(e, g);
}
static void serve_info(void *e, struct kvf_engine_info *out)
{
    kvf_dworker_gen_ops.info(e, out);
    if (serve_pw) kvf_pworker_pool(serve_pw, &out->prefill_pages, &out->prefill_free);
}
static int serve_prov(void *e, kvf_gen_t *g, struct kvf_gen_prov *out)
{
    return kvf_dworker_gen_ops.prov(e, g, out);
}
static const struct kvf_gen_ops serve_ops = {serve_submit, serve_next, serve_cancel, serve_release,
                                             serve_info,   NULL,       serve_prov};

struct serve_opts {
    const char *model, *data_dir;
    uint32_t threads, ctx_len, admit_ms, grant_ms, hold_ms, chunk; /* 0: the default */
    uint64_t kv_bytes, cache_bytes;
    bool log_commits;
    struct kvf_cli_http http;
};

#define O(f) offsetof(struct serve_opts, f)
static const struct kvf_cli_opt serve_opts[] = {
    KVF_CLI_OPT_MODEL(
        struct serve_opts, model, 0,
        "the model; without it, kvfence writes (once) and serves its readable test model "
        "'hist' in the data directory"),
    {.name = "--data-dir",
     .metavar = "D",
     .kind = KVF_CLI_STR,
     .off = O(data_dir),
     .env = "KVFENCE_DATA_DIR",
     .help = "where the default model lives (default $XDG_DATA_HOME/kvfence or "
             "~/.local/share/kvfence)"},
    KVF_CLI_OPT_THREADS(struct serve_opts, threads),
    KVF_CLI_OPT_LOG_COMMITS(struct serve_opts, log_commits),
    KVF_CLI_OPT_KV_MEMORY(struct serve_opts, kv_bytes, "1G",
                          "the decode worker's KV pool, e.g. 512M, 2G"),
    KVF_CLI_OPT_PREFIX_CACHE(struct serve_opts, cache_bytes),
    KVF_CLI_OPT_CONTEXT(
        struct serve_opts, ctx_len,
        "the most prompt + output tokens of one request (default: the model's, bounded by "
        "the pool)"),
    KVF_CLI_HTTP_OPTS(struct serve_opts, http),
    KVF_CLI_OPT_ADMIT_TIMEOUT(
        struct serve_opts, admit_ms,
        "how long a request may wait for KV pages before it gets 503 pool_exhausted "
        "(default 30000)"),
    KVF_CLI_OPT_PROGRESS_TIMEOUT(
        struct serve_opts, grant_ms,
        "a prompt whose prefill reports no progress for MS fails with 503 prefill_stalled "
        "(default 5000); a prompt that is being computed, however long, never fails by time"),
    KVF_CLI_OPT_PREFILL_CHUNK(
        struct serve_opts, chunk,
        "prompt tokens computed per turn (default 256): each chunk's pages go to decode while "
        "the next is computed, and prompts take turns by chunks, the shortest first"),
    KVF_CLI_OPT_HOLD_TIMEOUT(
        struct serve_opts, hold_ms,
        "its pages, without the writer's proof that it stopped within MS more, are "
        "quarantined and the writer fenced (default 30000); a timeout never frees a page by "
        "itself"),
};
#undef O

static const struct kvf_cli_spec serve_spec = {
    .name = "serve",
    .opts = serve_opts,
    .n_opts = KVF_ARRAY_LEN(serve_opts),
    .opts_size = sizeof(struct serve_opts),
    .about =
        "Runs the router (OpenAI-compatible HTTP), one prefill worker and one decode worker in\n"
        "one process, joined by the handoff protocol over loopback TCP (its fabric authenticated\n"
        "by a key drawn at start that never leaves the process).\n",
    .after =
        "Every option can also be set from the environment, as the variable in its brackets\n"
        "(KVFENCE_KV_MEMORY=2G, KVFENCE_NO_AUTH=1); the command line wins.\n\n"
        "Logs: one line per event on stderr, key=value (request id, tenant, outcome, token\n"
        "counts); never prompt text, output, token ids or keys. GET /metrics: Prometheus.\n\n"
        "Chat requests are rendered with the model's chat template (tokenizer.chat_template)\n"
        "when it has one that kvfence's template interpreter takes; otherwise with the default\n"
        "\"<role>: <content>\" lines (the startup message says which).\n\n"
        "SIGINT or SIGTERM stops accepting, lets requests in flight finish (up to 10 s),\n"
        "cancels the rest through the protocol, and exits 0.\n",
};

static int mkdirs(const char *path)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -errno;
    return 0;
}

/* The default model: the readable 'hist' test model, written once into the data directory. */
static int default_model(const char *data_dir, char *path, size_t path_len)
{
    char dir[400];
    if (data_dir)
        snprintf(dir, sizeof(dir), "%s", data_dir);
    else if (getenv("XDG_DATA_HOME") && *getenv("XDG_DATA_HOME"))
        snprintf(dir, sizeof(dir), "%s/kvfence", getenv("XDG_DATA_HOME"));
    else
        snprintf(dir, sizeof(dir), "%s/.local/share/kvfence",
                 getenv("HOME") ? getenv("HOME") : "/tmp");
    int rc = mkdirs(dir);
    if (rc < 0) {
        fprintf(stderr, "kvfence serve: cannot create the data directory %s: %s\n", dir,
                strerror(-rc));
        return rc;
    }
    snprintf(path, path_len, "%s/hist.gguf", dir);
    if (access(path, R_OK) == 0) {
        fprintf(stderr, "kvfence serve: no --model given; serving the test model %s\n", path);
        return 0;
    }
    char tmp[600], err[256] = "";
    snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
    const struct kvf_mkmodel_shape *sh = kvf_mkmodel_shape_by_name("hist");
    if (!sh || (rc = kvf_mkmodel_write(tmp, sh, KVF_GGML_F32, 1, err, sizeof(err))) < 0) {
        fprintf(stderr, "kvfence serve: cannot write the test model: %s\n",
                sh ? err : "no 'hist' shape");
        return -EINVAL;
    }
    if (rename(tmp, path) < 0) {
        rc = -errno;
        unlink(tmp);
        fprintf(stderr, "kvfence serve: cannot write %s: %s\n", path, strerror(-rc));
        return rc;
    }
    fprintf(stderr,
            "kvfence serve: no --model given; wrote the test model 'hist' to %s (it answers with\n"
            "the most frequent word of what it reads: try the prompt \"red red blue\")\n",
            path);
    return 0;
}

int kvf_cmd_serve(int argc, char **argv)
{
    struct serve_opts o = {0};
    int exit_status = 0;
    if (kvf_cli_parse(&serve_spec, argc, argv, &o, &exit_status) < 0) return exit_status;
    const char *model_path = o.model;
    uint32_t threads = o.threads;
    int prc = kvf_cli_http_prepare("serve", &o.http);
    if (prc) return prc;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint32_t)n : 1;
    }
    char default_path[512];
    if (!model_path) {
        if (default_model(o.data_dir, default_path, sizeof(default_path)) < 0) {
            kvf_cli_http_free(&o.http);
            return 1;
        }
        model_path = default_path;
    }

    /* Signals are taken by this thread alone (sigwait below), so every thread started from here
     * on inherits them blocked. */
    sigset_t sigs;
    kvf_cli_block_stop_signals(&sigs);

    int status = 1;
    char err[256] = "";
    kvf_gguf_t *g = NULL;
    kvf_grammar_vocab_t *gv = NULL;
    kvf_model_t *m = NULL;
    kvf_tokenizer_t *tok = NULL;
    kvf_pworker_t *pw = NULL;
    kvf_dworker_t *dw = NULL;
    kvf_server_t *srv = NULL;
    pthread_mutex_t compute = PTHREAD_MUTEX_INITIALIZER;
    uint64_t fp = 0;
    if (kvf_cli_open_model("serve", model_path, &g, &m, &tok, &fp) < 0) goto out;
    uint32_t limit = 0, n_pages = 0;
    if (kvf_cli_pool_limit("serve", m, SERVE_PAGE_TOKENS, o.kv_bytes, o.ctx_len, &limit, &n_pages) <
        0)
        goto out;
    /* The prefill pool holds one prompt at the limit: a prompt that long is computed alone,
     * shorter ones take turns (a prompt takes its pages when it starts). */
    uint32_t prefill_pages = (limit + SERVE_PAGE_TOKENS - 1) / SERVE_PAGE_TOKENS + 1;
    /* The internal fabric (prefill and decode on 127.0.0.1) takes only peers that prove a key
     * drawn now and never leaving the process: another local user who reaches the port is
     * refused before a byte of theirs is parsed beyond the greeting. */
    uint8_t fabric_key[KVF_FABRIC_KEY_BYTES];
    if (kvf_fabric_key_random(fabric_key) < 0) {
        fprintf(stderr, "kvfence serve: no random source for the internal fabric's key\n");
        goto out;
    }
    struct kvf_pool_geometry geo;
    kvf_model_geometry(m, SERVE_PAGE_TOKENS, &geo);
    uint32_t cache_pages = (uint32_t)(o.cache_bytes / kvf_geo_page_bytes(&geo));
    gv = kvf_cli_grammar_vocab(g, tok);
    struct kvf_worker_config wc = {.model = m,
                                   .grammar_vocab = gv,
                                   .model_fp = fp,
                                   .page_tokens = SERVE_PAGE_TOKENS,
                                   .fabric_key = fabric_key,
                                   .n_pages = prefill_pages,
                                   .n_threads = threads,
                                   .max_context = limit,
                                   .listen_host = "127.0.0.1",
                                   .compute_lock = &compute,
                                   .max_batch = 16,
                                   .max_reqs = 64,
                                   .max_queue = o.http.max_queue,
                                   .admit_timeout_ms = o.admit_ms,
                                   .grant_timeout_ms = o.grant_ms,
                                   .hold_timeout_ms = o.hold_ms,
                                   .prefill_chunk = o.chunk,
                                   .prefix_cache_pages = cache_pages,
                                   .log_commits = o.log_commits};
    if (kvf_pworker_start(&wc, &pw, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence serve: prefill worker: %s\n", err);
        goto out;
    }
    wc.n_pages = n_pages;
    wc.prefix_cache_pages = 0;
    wc.prefill_host = "127.0.0.1";
    wc.prefill_port = kvf_pworker_port(pw);
#if defined(KVF_TEST_BUILD)
    /* Test builds: KVF_POISON=1 poisons the decode pool's freed pages too (the prefill worker
     * reads it for its own pool). */
    wc.poison_free = getenv("KVF_POISON") && atoi(getenv("KVF_POISON"));
#endif
    if (kvf_dworker_start(&wc, &dw, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence serve: decode worker: %s\n", err);
        goto out;
    }
    serve_pw = pw;
    struct kvf_engine_info info;
    for (int i = 0; i < 1000; i++) {
        kvf_dworker_gen_ops.info(dw, &info);
        if (info.prefill_up) break;
        usleep(10000);
    }
    if (!info.prefill_up) {
        fprintf(stderr, "kvfence serve: the decode worker could not connect to the prefill worker "
                        "over the fabric on 127.0.0.1 within 10 s\n");
        goto out;
    }
    if (kvf_cli_http_start("serve", &o.http, model_path, fp, g, tok, &serve_ops, dw, &srv) < 0)
        goto out;
    fprintf(stderr,
            "kvfence serve: listening on http://%s:%u — model %s (%s), context limit %u tokens, "
            "decode pool %u pages of %u tokens, %u threads, chat: %s\n",
            o.http.host, kvf_server_port(srv), o.http.model_name, kvf_model_type_name(m), limit,
            n_pages, SERVE_PAGE_TOKENS, threads,
            o.http.chat_model ? "the model's template" : "default rendering");
    kvf_cli_http_say_auth("serve", &o.http, srv);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvfence serve: %s: stopping (requests in flight get up to 10 s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    status = 0;

out:
    kvf_server_stop(srv);
    kvf_dworker_stop(dw, 10000);
    kvf_pworker_stop(pw);
    kvf_tokenizer_destroy(tok);
    kvf_model_free(m);
    kvf_grammar_vocab_free(gv);
    kvf_gguf_close(g);
    kvf_cli_http_free(&o.http);
    if (status == 0) fprintf(stderr, "kvfence serve: stopped\n");
    return status;
}
