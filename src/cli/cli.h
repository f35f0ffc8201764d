/* cli.h — the kvfence binary's subcommands. Each lives in its own cmd_<name>.c and takes the
 * arguments after its name (argv[0] is the subcommand's name). It returns the process exit
 * status: 0 on success, 1 on failure, 2 on a usage error. Only the CLI prints and exits. */
#ifndef KVF_CLI_H
#define KVF_CLI_H

#include <stdbool.h>
#include <signal.h>
#include <stdint.h>

#include "kvfence/engine.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/server.h"
#include "kvfence/text.h"

struct kvf_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
};

int kvf_cmd_bench(int argc, char **argv);
int kvf_cmd_serve(int argc, char **argv);
int kvf_cmd_router(int argc, char **argv);
int kvf_cmd_prefill(int argc, char **argv);
int kvf_cmd_decode(int argc, char **argv);
int kvf_cmd_mkmodel(int argc, char **argv);
int kvf_cmd_run(int argc, char **argv);

/* "512M", "2G", "1.5GiB", "4096": bytes. 0, or -1 for a bad value. */
int kvf_cli_parse_size(const char *v, uint64_t *out);
/* A decimal in [lo, hi]. 0, or -1. */
int kvf_cli_parse_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *out);
/* The model's fingerprint: XXH3 of the whole file, so workers agree only on the same bytes. */
int kvf_cli_file_fp(const char *path, uint64_t *fp);

/* Blocks SIGINT and SIGTERM (the caller takes them with sigwait, so every thread it starts
 * afterwards inherits them blocked) and ignores SIGPIPE. */
void kvf_cli_block_stop_signals(sigset_t *sigs);
/* Opens path's GGUF, loads the model, the tokenizer when tok is not NULL, and the fingerprint.
 * 0, or -1 after printing "kvfence <cmd>: ..." (what was opened is left for the caller to
 * free: every output is NULL or valid). */
int kvf_cli_open_model(const char *cmd, const char *path, kvf_gguf_t **g, kvf_model_t **m,
                       kvf_tokenizer_t **tok, uint64_t *fp);

/* The HTTP front of `serve` and `router` (cli_http.c). */
struct kvf_cli_http {
    const char *host;              /* NULL = 127.0.0.1 */
    uint32_t port, max_queue, tenant_running, tenant_queued, tenant_kv_tokens;
    uint32_t max_conn_per_ip, header_timeout_ms, body_timeout_ms, send_timeout_ms; /* 0: defaults */
    uint32_t max_connections, keyless_timeout_ms;                                   /* 0: defaults */
    char trusted_proxies[1024]; /* every --trusted-proxy, joined with ',' */
    const char *keys_path;
    bool no_auth;
    /* Set by prepare and start. */
    bool loopback, chat_model;
    kvf_server_keys_t *keys;
    const char *model_name;
};
/* An HTTP option with its value: 1 taken, 0 not an HTTP option, -1 a bad value (printed). */
int kvf_cli_http_option(const char *cmd, struct kvf_cli_http *h, const char *a, const char *v);
/* After the options: the keys-or-loopback rule, and the key file loaded. 0, or 2 (printed). */
int kvf_cli_http_prepare(const char *cmd, struct kvf_cli_http *h);
/* Starts the server over ops/engine with the model's chat template when the interpreter takes
 * it. 0, or -1 (printed). */
int kvf_cli_http_start(const char *cmd, struct kvf_cli_http *h, const char *model_path,
                       kvf_gguf_t *g, const kvf_tokenizer_t *tok, const struct kvf_gen_ops *ops,
                       void *engine, kvf_server_t **srv);
/* The startup line about API keys. */
void kvf_cli_http_say_auth(const char *cmd, const struct kvf_cli_http *h);
void kvf_cli_http_free(struct kvf_cli_http *h);

/* A comma-separated list of HOST:PORT. */
#define KVF_CLI_MAX_ADDRS 16
struct kvf_cli_addrs {
    uint32_t n;
    char host[KVF_CLI_MAX_ADDRS][64];
    uint16_t port[KVF_CLI_MAX_ADDRS];
};
/* 0, or -1 after printing "kvfence <cmd>: <opt> ...". */
int kvf_cli_parse_addrs(const char *cmd, const char *opt, const char *v, struct kvf_cli_addrs *out);

/* The KV pool of kv_bytes for m with pages of page_tokens, and the served limit: ctx_len, or the
 * model's context when 0, lowered to what the pool holds when not given. 0, or -1 (printed:
 * beyond the model's context, or a pool that cannot hold one request at the limit). */
int kvf_cli_pool_limit(const char *cmd, const kvf_model_t *m, uint32_t page_tokens, uint64_t kv_bytes,
                       uint32_t ctx_len, uint32_t *limit, uint32_t *n_pages);

/* "HOST:PORT" into host (cap bytes) and port; port 0 allowed only when allow_zero. 0, or -1. */
int kvf_cli_parse_addr(const char *v, char *host, size_t cap, uint16_t *port, bool allow_zero);

/*
 * Every option also from the environment, as container deployments expect: KVFENCE_<FLAG> (upper
 * case, '-' as '_'; KVFENCE_KV_MEMORY=2G is --kv-memory 2G). Each set variable of the command's
 * table becomes that option, placed before the command line's, so the command line wins. A
 * boolean option is on with 1/true/yes and off with 0/false/no (anything else: -1, printed).
 * The new argv (argv[0] kept; the strings borrowed) is *out_argv, freed with free().
 */
struct kvf_cli_flag {
    const char *name; /* "--kv-memory" */
    bool boolean;
};
int kvf_cli_env_args(int argc, char **argv, const struct kvf_cli_flag *flags, size_t n_flags,
                     int *out_argc, char ***out_argv);

/* --compute-lock FILE: opens (creating) the file whose flock the worker processes on the same
 * cores take turns with. 0 with cfg set, or -1 (printed). */
int kvf_cli_compute_lock(const char *cmd, const char *path, struct kvf_worker_config *cfg);

/* Checks the mode of a file that holds secrets (API keys, a cluster key) before it is read:
 * writable by group or others is refused, readable by them is allowed with a warning. `what`
 * names the file in the messages ("--api-keys"). Returns 0 with warn filled (one line naming
 * the file and the fix, `chmod 600`) or empty; or a negative errno (-EPERM: writable by group or
 * others; -EINVAL: not a regular file; stat's errno) with err filled. Reads nothing of the file;
 * prints nothing. */
int kvf_cli_check_secret_file(const char *path, const char *what, char *warn, size_t warn_len,
                              char *err, size_t err_len);

/* The fabric's trust for router, prefill and decode (cli_fabric.c): --cluster-key FILE (also
 * KVFENCE_CLUSTER_KEY_FILE) and --insecure-fabric. */
struct kvf_cli_fabric {
    const char *key_path;
    bool insecure, have_key;
    uint8_t key[32];
};
#define KVF_CLI_FABRIC_HELP                                                                        \
    "  --cluster-key FILE    the cluster key every router, prefill and decode of the service\n"   \
    "                        shares (also KVFENCE_CLUSTER_KEY_FILE; `kvfence keygen FILE`\n"       \
    "                        writes one): peers prove it to each other before anything else\n"   \
    "                        is said, and every message after is sealed under a session key\n"    \
    "  --insecure-fabric     listen beyond loopback without a cluster key (any peer that\n"       \
    "                        reaches the port can join; refused otherwise)\n"
/* --insecure-fabric (no value): true if a was it. */
bool kvf_cli_fabric_flag(struct kvf_cli_fabric *f, const char *a);
/* --cluster-key FILE: true if a was it. */
bool kvf_cli_fabric_option(struct kvf_cli_fabric *f, const char *a, const char *v);
/* After the options: loads the key, or applies the rule that a listener beyond loopback needs a
 * key or --insecure-fabric (listen_host NULL: no listener). 0, or 2 (printed). */
int kvf_cli_fabric_prepare(const char *cmd, struct kvf_cli_fabric *f, const char *listen_host);
/* The key for the engine's configs, or NULL when none was given. */
const uint8_t *kvf_cli_fabric_key(const struct kvf_cli_fabric *f);
int kvf_cmd_keygen(int argc, char **argv);

/* True when argv (after the subcommand) asks for help. */
bool kvf_cli_wants_help(int argc, char **argv);

#endif
