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
#include "kvfence/transport.h"
#include "kvfence/engine.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/server.h"
#include "kvfence/text.h"

#define SERVE_PAGE_TOKENS 16u

/* The seam the router serves from: the decode worker's, with /health's prefill figures filled
 * in from the prefill worker of this process. */
static kvf_prefill_worker_t *serve_pw;
static int serve_submit(void *e, const struct kvf_gen_params *p, kvf_gen_t **out)
{
    return kvf_decode_gen_ops.submit(e, p, out);
}
static int serve_next(void *e, kvf_gen_t *g, struct kvf_gen_event *ev, int timeout_ms)
{
    return kvf_decode_gen_ops.next(e, g, ev, timeout_ms);
}
static void serve_cancel(void *e, kvf_gen_t *g)
{
    kvf_decode_gen_ops.cancel(e, g);
}
static void serve_release(void *e, kvf_gen_t *g)
{
    kvf_decode_gen_ops.release(e, g);
}
static void serve_info(void *e, struct kvf_engine_info *out)
{
    kvf_decode_gen_ops.info(e, out);
    if (serve_pw) kvf_prefill_worker_pool(serve_pw, &out->prefill_pages, &out->prefill_free);
}
static const struct kvf_gen_ops serve_ops = {serve_submit, serve_next, serve_cancel, serve_release,
                                             serve_info, NULL};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvfence serve [--model F.gguf] [--host 127.0.0.1] [--port 8080] [--threads N]\n"
            "                     [--kv-memory SIZE] [--context-length N] [--data-dir D]\n"
            "                     [--max-queue N] [--admit-timeout MS] [--api-keys FILE | --no-auth]\n"
            "                     [--tenant-max-running N] [--tenant-max-queued N]\n"
            "                     [--tenant-max-kv-tokens N]\n"
            "                     [--progress-timeout MS] [--hold-timeout MS] [--prefill-chunk N]\n\n"
            "Runs the router (OpenAI-compatible HTTP), one prefill worker and one decode worker in\n"
            "one process, joined by the handoff protocol over loopback TCP (its fabric authenticated by a\n"
            "key drawn at start that never leaves the process).\n\n"
            "  --model F.gguf        the model; without it, kvfence writes (once) and serves its\n"
            "                        readable test model 'hist' in the data directory\n"
            "  --host, --port        where to listen (default 127.0.0.1:8080)\n"
            "  --threads N           compute threads (default: every core)\n"
            "  --kv-memory SIZE      the decode worker's KV pool, e.g. 512M, 2G (default 1G)\n"
            "  --context-length N    the most prompt + output tokens of one request (default: the\n"
            "                        model's, bounded by the pool)\n"
            "  --data-dir D          where the default model lives (default $XDG_DATA_HOME/kvfence\n"
            "                        or ~/.local/share/kvfence)\n"
            "  --max-queue N         requests in flight (running or waiting) before new ones get\n"
            "                        429 with Retry-After (default 256)\n"
            "  --admit-timeout MS    how long a request may wait for KV pages before it gets 503\n"
            "                        pool_exhausted (default 30000)\n"
            "  --progress-timeout MS  a prompt whose prefill reports no progress for MS fails\n"
            "                        with 503 prefill_stalled (default 5000); a prompt that is\n"
            "                        being computed, however long, never fails by time\n"
            "                        (--grant-timeout: the older name)\n"
            "  --prefill-chunk N     prompt tokens computed per turn (default 256): each chunk's\n"
            "                        pages go to decode while the next is computed, and prompts\n"
            "                        take turns by chunks, the shortest first\n"
            "  --hold-timeout MS     its pages, without the writer's proof that it stopped within\n"
            "                        MS more, are quarantined and the writer fenced (default\n"
            "                        30000); a timeout never frees a page by itself\n"
            "  --api-keys FILE       one 'KEY TENANT' per line ('#' comments and blank lines\n"
            "                        allowed); requests then need 'Authorization: Bearer KEY' (401\n"
            "                        otherwise) and run as the key's tenant. /health and /metrics\n"
            "                        need no key. FILE writable by group or others is refused;\n"
            "                        readable by them, a warning (fix: chmod 600 FILE)\n"
            "  --no-auth             serve without keys on an address beyond loopback (without\n"
            "                        keys, serve listens only on 127.0.0.1, localhost or ::1)\n"
            "  --tenant-max-running N  sequences one tenant may run at once: a request with n\n"
            "                        choices runs n, /tokenize and /detokenize one (default: no\n"
            "                        bound)\n"
            "  --tenant-max-kv-tokens N  KV tokens one tenant's running requests may reserve at\n"
            "                        once: a request reserves n x (prompt + max_tokens), in\n"
            "                        whole pages. Default, with two or more tenants: the larger\n"
            "                        of the pool / tenants and the pool less one request at the\n"
            "                        context length for each other tenant, and at least one such\n"
            "                        request; with one tenant, no bound\n"
            "  --tenant-max-queued N   requests of one tenant that wait for its share before 429\n"
            "                        with Retry-After (default 0; without --tenant-max-running,\n"
            "                        a request waits for its KV share up to 30 s). A request that\n"
            "                        can never fit its tenant's share gets 400 at once, naming\n"
            "                        the bound\n"
            "  --max-connections N   connections served at once (default 256); with --api-keys,\n"
            "                        a quarter of them are kept for requests with a valid key\n"
            "  --max-conn-per-ip N   connections of one client address at once (default 64)\n"
            "  --trusted-proxy ADDR[/PREFIX][,...]  peers (repeatable) whose Forwarded or\n"
            "                        X-Forwarded-For names the client: the last hop that is not\n"
            "                        a trusted proxy; other peers are their own client\n"
            "  --keyless-timeout MS  with --api-keys: a connection that has not shown a valid\n"
            "                        key sends its request's headers within MS (default 2000)\n"
            "                        Past any connection cap a request gets 503 with\n"
            "                        Retry-After and the connection is closed after it\n"
            "  --header-timeout MS, --body-timeout MS, --send-timeout MS: a request's headers\n"
            "                        within MS of the accept (10000), its body within MS of the\n"
            "                        headers (30000), a response left unread at most MS (30000);\n"
            "                        past a bound the connection is closed (docs/SERVER.md)\n\n"
            "Every option can also be set as KVFENCE_<OPTION> in the environment (KVFENCE_KV_MEMORY\n"
            "for --kv-memory, KVFENCE_NO_AUTH=1); the command line wins.\n\n"
            "Logs: one line per event on stderr, key=value (request id, tenant, outcome, token\n"
            "counts); never prompt text, output, token ids or keys. GET /metrics: Prometheus.\n\n"
            "Chat requests are rendered with the model's chat template (tokenizer.chat_template)\n"
            "when it has one that kvfence's template interpreter takes; otherwise with the default\n"
            "\"<role>: <content>\" lines (the startup message says which).\n\n"
            "SIGINT or SIGTERM stops accepting, lets requests in flight finish (up to 10 s),\n"
            "cancels the rest through the protocol, and exits 0.\n");
}

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
        snprintf(dir, sizeof(dir), "%s/.local/share/kvfence", getenv("HOME") ? getenv("HOME") : "/tmp");
    int rc = mkdirs(dir);
    if (rc < 0) {
        fprintf(stderr, "kvfence serve: cannot create the data directory %s: %s\n", dir, strerror(-rc));
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
        fprintf(stderr, "kvfence serve: cannot write the test model: %s\n", sh ? err : "no 'hist' shape");
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
    const char *model_path = NULL, *data_dir = NULL;
    uint32_t threads = 0, ctx_len = 0, admit_ms = 0, grant_ms = 0, hold_ms = 0, chunk = 0;
    uint64_t kv_bytes = 1ull << 30;
    bool ctx_given = false;
    struct kvf_cli_http http = {.port = 8080};
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
        if (i + 1 >= argc) {
            fprintf(stderr, "kvfence serve: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0, took = kvf_cli_http_option("serve", &http, a, v);
        if (took < 0) return 2;
        if (took) continue;
        if (strcmp(a, "--model") == 0) model_path = v;
        else if (strcmp(a, "--data-dir") == 0) data_dir = v;
        else if (strcmp(a, "--threads") == 0) bad = kvf_cli_parse_u32(v, 1, 256, &threads);
        else if (strcmp(a, "--context-length") == 0) bad = kvf_cli_parse_u32(v, 2, 1u << 20, &ctx_len), ctx_given = true;
        else if (strcmp(a, "--kv-memory") == 0) bad = kvf_cli_parse_size(v, &kv_bytes);
        else if (strcmp(a, "--admit-timeout") == 0) bad = kvf_cli_parse_u32(v, 1, 3600000, &admit_ms);
        else if (strcmp(a, "--progress-timeout") == 0 || strcmp(a, "--grant-timeout") == 0)
            bad = kvf_cli_parse_u32(v, 100, 3600000, &grant_ms);
        else if (strcmp(a, "--prefill-chunk") == 0) bad = kvf_cli_parse_u32(v, 16, 4096, &chunk);
        else if (strcmp(a, "--hold-timeout") == 0) bad = kvf_cli_parse_u32(v, 100, 3600000, &hold_ms);
        else {
            fprintf(stderr, "kvfence serve: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvfence serve: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    int prc = kvf_cli_http_prepare("serve", &http);
    if (prc) return prc;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint32_t)n : 1;
    }
    char default_path[512];
    if (!model_path) {
        if (default_model(data_dir, default_path, sizeof(default_path)) < 0) {
            kvf_cli_http_free(&http);
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
    kvf_model_t *m = NULL;
    kvf_tokenizer_t *tok = NULL;
    kvf_prefill_worker_t *pw = NULL;
    kvf_decode_worker_t *dw = NULL;
    kvf_server_t *srv = NULL;
    pthread_mutex_t compute = PTHREAD_MUTEX_INITIALIZER;
    uint64_t fp = 0;
    if (kvf_cli_open_model("serve", model_path, &g, &m, &tok, &fp) < 0) goto out;
    uint32_t limit = 0, n_pages = 0;
    if (kvf_cli_pool_limit("serve", m, SERVE_PAGE_TOKENS, kv_bytes, ctx_given ? ctx_len : 0, &limit,
                           &n_pages) < 0)
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
    struct kvf_worker_config wc = {.model = m, .model_fp = fp, .page_tokens = SERVE_PAGE_TOKENS,
                                   .fabric_key = fabric_key, .n_pages = prefill_pages, .n_threads = threads,
                                   .max_context = limit, .listen_host = "127.0.0.1",
                                   .compute_lock = &compute, .max_batch = 16, .max_reqs = 64,
                                   .max_queue = http.max_queue, .admit_timeout_ms = admit_ms,
                                   .grant_timeout_ms = grant_ms, .hold_timeout_ms = hold_ms,
                                   .prefill_chunk = chunk};
    if (kvf_prefill_worker_start(&wc, &pw, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence serve: prefill worker: %s\n", err);
        goto out;
    }
    wc.n_pages = n_pages;
    wc.prefill_host = "127.0.0.1";
    wc.prefill_port = kvf_prefill_worker_port(pw);
#if defined(KVF_TEST_BUILD)
    /* Test builds: KVF_POISON=1 poisons the decode pool's freed pages too (the prefill worker
     * reads it for its own pool). */
    wc.poison_free = getenv("KVF_POISON") && atoi(getenv("KVF_POISON"));
#endif
    if (kvf_decode_worker_start(&wc, &dw, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence serve: decode worker: %s\n", err);
        goto out;
    }
    serve_pw = pw;
    struct kvf_engine_info info;
    for (int i = 0; i < 1000; i++) {
        kvf_decode_gen_ops.info(dw, &info);
        if (info.prefill_up) break;
        usleep(10000);
    }
    if (!info.prefill_up) {
        fprintf(stderr, "kvfence serve: the decode worker could not connect to the prefill worker "
                        "over the fabric on 127.0.0.1 within 10 s\n");
        goto out;
    }
    if (kvf_cli_http_start("serve", &http, model_path, g, tok, &serve_ops, dw, &srv) < 0) goto out;
    fprintf(stderr,
            "kvfence serve: listening on http://%s:%u — model %s (%s), context limit %u tokens, "
            "decode pool %u pages of %u tokens, %u threads, chat: %s\n",
            http.host, kvf_server_port(srv), http.model_name, kvf_model_type_name(m), limit, n_pages,
            SERVE_PAGE_TOKENS, threads, http.chat_model ? "the model's template" : "default rendering");
    kvf_cli_http_say_auth("serve", &http);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvfence serve: %s: stopping (requests in flight get up to 10 s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    status = 0;

out:
    kvf_server_stop(srv);
    kvf_decode_worker_stop(dw, 10000);
    kvf_prefill_worker_stop(pw);
    kvf_tokenizer_destroy(tok);
    kvf_model_free(m);
    kvf_gguf_close(g);
    kvf_cli_http_free(&http);
    if (status == 0) fprintf(stderr, "kvfence serve: stopped\n");
    return status;
}
