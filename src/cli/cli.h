/* cli.h — the kvfence binary's subcommands. Each lives in its own cmd_<name>.c and takes the
 * arguments after its name (argv[0] is the subcommand's name), which it reads through its option
 * table (struct kvf_cli_spec, below; docs/CLI.md). It returns the process exit status: 0 on
 * success, 1 on failure, 2 on a usage error. Only the CLI prints and exits. */
#ifndef KVF_CLI_H
#define KVF_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <signal.h>
#include <stdint.h>

#include "kvfence/engine.h"
#include "kvfence/grammar.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/server.h"
#include "kvfence/text.h"

struct kvf_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
};

/*
 * The option table (cli_opt.c). A command declares its options once, as an array of struct
 * kvf_cli_opt over the fields of its own options struct; kvf_cli_parse reads the command line
 * and the environment from it, and kvf_cli_help writes `--help` from it. No command has an
 * option loop of its own.
 *
 * Where a value comes from, lowest first: the row's def, then its environment variables
 * (env_alt, then env; skipped entirely when the command line holds --help or -h, so a bad
 * variable never hides the help), then the command line in its order. A later value replaces an
 * earlier one, except for KVF_CLI_FN rows, which may accumulate (--trusted-proxy joins every
 * value). So the command line wins over the environment.
 *
 * Messages, all "kvfence <cmd>: ..." on stderr with exit status 2: "unknown option 'X'" and the
 * help, "X needs a value", "bad value 'V' for X" (X as it was written, alias or not; an
 * environment value names its option), "A, B and C are required" and the help; KVF_CLI_ADDR and
 * KVF_CLI_ADDRS say what they want, and a row's bad replaces the "bad value" line.
 */
enum kvf_cli_kind {
    KVF_CLI_FLAG,  /* bool: no value; from the environment 1/true/yes or 0/false/no */
    KVF_CLI_STR,   /* const char *: borrowed from argv or the environment */
    KVF_CLI_U32,   /* uint32_t, decimal, in [lo, hi] */
    KVF_CLI_U64,   /* uint64_t, decimal, in [lo, hi] */
    KVF_CLI_FLOAT, /* float in [flo, fhi] */
    KVF_CLI_SIZE,  /* uint64_t bytes: "512M", "2G", "1.5GiB", "4096" */
    KVF_CLI_ADDR,  /* struct kvf_cli_addr: HOST:PORT ([::1]:PORT too), port 0 allowed */
    KVF_CLI_ADDRS, /* struct kvf_cli_addrs: HOST:PORT[,...], ports 1-65535 */
    KVF_CLI_FN,    /* fn(v, dst): 0, or -1 for a bad value */
};

#define KVF_CLI_REQUIRED 1u /* the command refuses to run without it */

struct kvf_cli_opt {
    const char *name;    /* "--kv-memory" */
    const char *alias;   /* another name taking the same value ("--grant-timeout"), or NULL */
    const char *metavar; /* "SIZE" in the help; NULL for a flag */
    enum kvf_cli_kind kind;
    size_t off;          /* offsetof the destination in the command's options struct */
    uint64_t lo, hi;     /* bounds of KVF_CLI_U32 and KVF_CLI_U64, inclusive */
    float flo, fhi;      /* bounds of KVF_CLI_FLOAT, inclusive */
    const char *def;     /* the value before any other, parsed as one; NULL: the struct's zero */
    const char *env;     /* "KVFENCE_KV_MEMORY": KVFENCE_ + the name upper-cased, '-' as '_';
                            NULL: not read from the environment */
    const char *env_alt; /* an older variable, read before env and only when not empty */
    unsigned flags;      /* KVF_CLI_REQUIRED */
    int (*fn)(const char *v, void *dst);
    const char *bad;  /* the message for a bad value instead of "bad value 'V' for X" */
    const char *help; /* one paragraph, wrapped by kvf_cli_help */
};

struct kvf_cli_spec {
    const char *name;  /* "serve" */
    const char *about; /* paragraphs between the usage line and the options */
    const char *after; /* paragraphs after the options, or NULL */
    const struct kvf_cli_opt *opts;
    size_t n_opts;
    size_t opts_size;       /* sizeof the command's options struct */
    const char *positional; /* the one word that is not an option ("OUT.gguf"), or NULL */
    size_t positional_off;  /* offsetof its const char * */
    bool positional_required;
};

/* HOST:PORT as given (text borrowed) and split. */
struct kvf_cli_addr {
    const char *text;
    char host[256];
    uint16_t port;
};

/* Parses argv (argv[0] the command's name) and the environment into opts, as the spec says.
 * Returns 0 to go on, or -1 with *exit_status set: 0 after printing the help to stdout, 2 after
 * printing a usage error. Strings in opts are borrowed from argv and the environment. */
int kvf_cli_parse(const struct kvf_cli_spec *s, int argc, char **argv, void *opts,
                  int *exit_status);
/* The usage line, the about text, every option with its metavar, help, default, aliases and
 * environment variable, and the after text. */
void kvf_cli_help(const struct kvf_cli_spec *s, FILE *f);
/* True when every row of the spec is well formed: a name and help, env spelled from the name,
 * a def that parses, each field inside opts_size, no name twice. Otherwise false with why
 * filled. Test builds check each spec on every parse (and abort on a bad one). */
bool kvf_cli_spec_check(const struct kvf_cli_spec *s, char *why, size_t why_len);

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
int kvf_cli_parse_u64(const char *v, uint64_t lo, uint64_t hi, uint64_t *out);
/* A float in [lo, hi] (strtof; NaN is refused). 0, or -1. */
int kvf_cli_parse_float(const char *v, float lo, float hi, float *out);
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

/* The HTTP front of `serve` and `router` (cli_http.c): its options (KVF_CLI_HTTP_OPTS), the
 * rules between them, and the server. */
#define KVF_CLI_PROXIES_LEN 1024
struct kvf_cli_http {
    const char *host;
    uint32_t port, max_queue, tenant_running, tenant_queued, tenant_kv_tokens;
    uint32_t max_conn_per_ip, header_timeout_ms, body_timeout_ms, send_timeout_ms; /* 0: defaults */
    uint32_t max_connections, keyless_timeout_ms;                                  /* 0: defaults */
    uint32_t canary_s;                         /* --canary-interval; 0: no canary */
    char trusted_proxies[KVF_CLI_PROXIES_LEN]; /* every --trusted-proxy, joined with ',' */
    const char *keys_path;
    const char *served_names; /* --served-model-name NAME[,ALIAS...], or NULL */
    const char *cors_origins; /* --cors-origins LIST, or NULL */
    bool no_auth;
    const char *admin_keys_path;      /* --admin-keys */
    struct kvf_cli_addr admin_listen; /* --admin-listen; text NULL: not given */
    /* Set by prepare and start. */
    bool loopback, chat_model;
    kvf_server_keys_t *keys, *admin_keys;
    const char *model_name;
};
/* Rows the serving commands share, each in one place: T is the command's options struct, f its
 * field, and where the commands say it differently, text is the row's help. */
/* clang-format off */
#define KVF_CLI_OPT_MODEL(T, f, flags_, text) \
    {.name = "--model", .metavar = "F.gguf", .kind = KVF_CLI_STR, .off = offsetof(T, f), \
     .env = "KVFENCE_MODEL", .flags = (flags_), .help = (text)}
#define KVF_CLI_OPT_THREADS(T, f) \
    {.name = "--threads", .metavar = "N", .kind = KVF_CLI_U32, .off = offsetof(T, f), .lo = 1, \
     .hi = 256, .env = "KVFENCE_THREADS", .help = "compute threads (default: every core)"}
#define KVF_CLI_OPT_KV_MEMORY(T, f, def_, text) \
    {.name = "--kv-memory", .metavar = "SIZE", .kind = KVF_CLI_SIZE, .off = offsetof(T, f), \
     .def = (def_), .env = "KVFENCE_KV_MEMORY", .help = (text)}
#define KVF_CLI_OPT_CONTEXT(T, f, text) \
    {.name = "--context-length", .metavar = "N", .kind = KVF_CLI_U32, .off = offsetof(T, f), \
     .lo = 2, .hi = 1u << 20, .env = "KVFENCE_CONTEXT_LENGTH", .help = (text)}
#define KVF_CLI_OPT_ADMIT_TIMEOUT(T, f, text) \
    {.name = "--admit-timeout", .metavar = "MS", .kind = KVF_CLI_U32, .off = offsetof(T, f), \
     .lo = 1, .hi = 3600000, .env = "KVFENCE_ADMIT_TIMEOUT", .help = (text)}
#define KVF_CLI_OPT_PROGRESS_TIMEOUT(T, f, text) \
    {.name = "--progress-timeout", .alias = "--grant-timeout", .metavar = "MS", \
     .kind = KVF_CLI_U32, .off = offsetof(T, f), .lo = 100, .hi = 3600000, \
     .env = "KVFENCE_PROGRESS_TIMEOUT", .help = (text)}
#define KVF_CLI_OPT_HOLD_TIMEOUT(T, f, text) \
    {.name = "--hold-timeout", .metavar = "MS", .kind = KVF_CLI_U32, .off = offsetof(T, f), \
     .lo = 100, .hi = 3600000, .env = "KVFENCE_HOLD_TIMEOUT", .help = (text)}
#define KVF_CLI_OPT_PREFILL_CHUNK(T, f, text) \
    {.name = "--prefill-chunk", .metavar = "N", .kind = KVF_CLI_U32, .off = offsetof(T, f), \
     .lo = 16, .hi = 4096, .env = "KVFENCE_PREFILL_CHUNK", .help = (text)}
#define KVF_CLI_OPT_PREFIX_CACHE(T, f) \
    {.name = "--prefix-cache-memory", .metavar = "SIZE", .kind = KVF_CLI_SIZE, \
     .off = offsetof(T, f), .env = "KVFENCE_PREFIX_CACHE_MEMORY", \
     .help = "memory added to the prefill pool for the tenant-scoped prefix cache: a prompt's " \
             "first whole pages already computed for the same tenant are reused, never " \
             "another tenant's (default 0: off; docs/PREFIX_CACHE.md)"}
#define KVF_CLI_OPT_LOG_COMMITS(T, f) \
    {.name = "--log-commits", .kind = KVF_CLI_FLAG, .off = offsetof(T, f), \
     .env = "KVFENCE_LOG_COMMITS", \
     .help = "log one line per verified handoff: the request, the prefill worker, its epoch, " \
             "the grant's nonce, the token counts and every page's tag and checksum (ids and " \
             "numbers only; the provenance records' source, docs/SERVER.md)"}
#define KVF_CLI_OPT_COMPUTE_LOCK(T, f, text) \
    {.name = "--compute-lock", .metavar = "FILE", .kind = KVF_CLI_STR, .off = offsetof(T, f), \
     .env = "KVFENCE_COMPUTE_LOCK", .help = (text)}
/* clang-format on */

/* --trusted-proxy: each value joined to the list with ','. 0, or -1 (empty, or the list full). */
int kvf_cli_http_add_proxy(const char *v, void *trusted_proxies);
/* The HTTP front's rows of an option table whose struct T holds a struct kvf_cli_http as m. */
#define KVF_CLI_HTTP_OPTS(T, m)                                                                    \
    {.name = "--host",                                                                             \
     .metavar = "HOST",                                                                            \
     .kind = KVF_CLI_STR,                                                                          \
     .off = offsetof(T, m.host),                                                                   \
     .def = "127.0.0.1",                                                                           \
     .env = "KVFENCE_HOST",                                                                        \
     .help = "the address to listen on for HTTP"},                                                 \
        {.name = "--port",                                                                         \
         .metavar = "PORT",                                                                        \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.port),                                                               \
         .lo = 0,                                                                                  \
         .hi = 65535,                                                                              \
         .def = "8080",                                                                            \
         .env = "KVFENCE_PORT",                                                                    \
         .help = "the HTTP port (0: any free port)"},                                              \
        {.name = "--max-queue",                                                                    \
         .metavar = "N",                                                                           \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.max_queue),                                                          \
         .lo = 1,                                                                                  \
         .hi = 1u << 20,                                                                           \
         .env = "KVFENCE_MAX_QUEUE",                                                               \
         .help =                                                                                   \
             "requests in flight (running or waiting) before new ones get 429 with Retry-After "   \
             "(default 256)"},                                                                     \
        {.name = "--api-keys",                                                                     \
         .metavar = "FILE",                                                                        \
         .kind = KVF_CLI_STR,                                                                      \
         .off = offsetof(T, m.keys_path),                                                          \
         .env = "KVFENCE_API_KEYS",                                                                \
         .help =                                                                                   \
             "one 'KEY TENANT' per line ('#' comments and blank lines allowed); requests then "    \
             "need 'Authorization: Bearer KEY' (401 otherwise) and run as the key's tenant. "      \
             "/health and /metrics take no tenant key (see --admin-keys). FILE writable by group " \
             "or others is refused; readable by them, a warning (fix: chmod 600 FILE)"},           \
        {.name = "--admin-keys",                                                                   \
         .metavar = "FILE",                                                                        \
         .kind = KVF_CLI_STR,                                                                      \
         .off = offsetof(T, m.admin_keys_path),                                                    \
         .env = "KVFENCE_ADMIN_KEYS",                                                              \
         .help =                                                                                   \
             "the operators' keys, as --api-keys (no key in both files): /metrics and /health's "  \
             "figures (/health?detail=1) then need one (401 without a valid key, 403 with a "      \
             "tenant's), and /health without one says only ok or unavailable"},                    \
        {.name = "--admin-listen",                                                                 \
         .metavar = "HOST:PORT",                                                                   \
         .kind = KVF_CLI_ADDR,                                                                     \
         .off = offsetof(T, m.admin_listen),                                                       \
         .env = "KVFENCE_ADMIN_LISTEN",                                                            \
         .help =                                                                                   \
             "serve /metrics and the full /health on this address alone (port 0: any free "        \
             "port); the public port then answers /metrics 404 and /health with its status only. " \
             "Beyond loopback it needs --admin-keys or --no-auth"},                                \
        {.name = "--no-auth",                                                                      \
         .kind = KVF_CLI_FLAG,                                                                     \
         .off = offsetof(T, m.no_auth),                                                            \
         .env = "KVFENCE_NO_AUTH",                                                                 \
         .help =                                                                                   \
             "serve without keys on an address beyond loopback (without keys, only 127.0.0.1, "    \
             "localhost or ::1 is served)"},                                                       \
        {.name = "--tenant-max-running",                                                           \
         .metavar = "N",                                                                           \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.tenant_running),                                                     \
         .lo = 1,                                                                                  \
         .hi = 1u << 20,                                                                           \
         .env = "KVFENCE_TENANT_MAX_RUNNING",                                                      \
         .help =                                                                                   \
             "sequences one tenant may run at once: a request with n choices runs n, /tokenize "   \
             "and /detokenize one (default: no bound)"},                                           \
        {.name = "--tenant-max-queued",                                                            \
         .metavar = "N",                                                                           \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.tenant_queued),                                                      \
         .lo = 0,                                                                                  \
         .hi = 1u << 20,                                                                           \
         .env = "KVFENCE_TENANT_MAX_QUEUED",                                                       \
         .help = "requests of one tenant that wait for its share before 429 with Retry-After "     \
                 "(default 0; needs --tenant-max-running; without it, a request waits for its KV " \
                 "share up to 30 s). A request that can never fit its tenant's share gets 400 at " \
                 "once, naming the bound"},                                                        \
        {.name = "--tenant-max-kv-tokens",                                                         \
         .metavar = "N",                                                                           \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.tenant_kv_tokens),                                                   \
         .lo = 1,                                                                                  \
         .hi = UINT32_MAX,                                                                         \
         .env = "KVFENCE_TENANT_MAX_KV_TOKENS",                                                    \
         .help =                                                                                   \
             "KV tokens one tenant's running requests may reserve at once: a request reserves "    \
             "n x (prompt + max_tokens), in whole pages. Default, with two or more tenants: the "  \
             "larger of the pool / tenants and the pool less one request at the context length "   \
             "for each other tenant, and at least one such request; with one tenant, no bound"},   \
        {.name = "--max-connections",                                                              \
         .metavar = "N",                                                                           \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.max_connections),                                                    \
         .lo = 2,                                                                                  \
         .hi = 1u << 16,                                                                           \
         .env = "KVFENCE_MAX_CONNECTIONS",                                                         \
         .help =                                                                                   \
             "connections served at once (default 256); with --api-keys, a quarter of them are "   \
             "kept for requests with a valid key. Past any connection cap a request gets 503 "     \
             "with Retry-After and the connection is closed after it"},                            \
        {.name = "--max-conn-per-ip",                                                              \
         .metavar = "N",                                                                           \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.max_conn_per_ip),                                                    \
         .lo = 1,                                                                                  \
         .hi = 1u << 20,                                                                           \
         .env = "KVFENCE_MAX_CONN_PER_IP",                                                         \
         .help = "connections of one client address at once (default 64)"},                        \
        {.name = "--served-model-name",                                                            \
         .metavar = "NAME[,ALIAS...]",                                                             \
         .kind = KVF_CLI_STR,                                                                      \
         .off = offsetof(T, m.served_names),                                                       \
         .env = "KVFENCE_SERVED_MODEL_NAME",                                                       \
         .help = "the model's names in the API: responses name the first, /v1/models lists "       \
                 "each, a request naming another model gets 404 (default: the file's name, and "   \
                 "any model named is served)"},                                                    \
        {.name = "--cors-origins",                                                                 \
         .metavar = "ORIGIN[,...]|*",                                                              \
         .kind = KVF_CLI_STR,                                                                      \
         .off = offsetof(T, m.cors_origins),                                                       \
         .env = "KVFENCE_CORS_ORIGINS",                                                            \
         .help = "browser origins (scheme://host[:port]) that may call the API, or * for any; "    \
                 "preflights answered, credentials never allowed (default: none, no CORS)"},       \
        {.name = "--trusted-proxy",                                                                \
         .metavar = "ADDR[/PREFIX][,...]",                                                         \
         .kind = KVF_CLI_FN,                                                                       \
         .off = offsetof(T, m.trusted_proxies),                                                    \
         .fn = kvf_cli_http_add_proxy,                                                             \
         .env = "KVFENCE_TRUSTED_PROXY",                                                           \
         .help =                                                                                   \
             "peers (repeatable; the environment's list and the command line's are joined) "       \
             "whose Forwarded or X-Forwarded-For names the client: the last hop that is not a "    \
             "trusted proxy; other peers are their own client"},                                   \
        {.name = "--keyless-timeout",                                                              \
         .metavar = "MS",                                                                          \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.keyless_timeout_ms),                                                 \
         .lo = 1,                                                                                  \
         .hi = 3600000,                                                                            \
         .env = "KVFENCE_KEYLESS_TIMEOUT",                                                         \
         .help =                                                                                   \
             "with --api-keys: a connection that has not shown a valid key sends its request's "   \
             "headers within MS (default 2000)"},                                                  \
        {.name = "--header-timeout",                                                               \
         .metavar = "MS",                                                                          \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.header_timeout_ms),                                                  \
         .lo = 1,                                                                                  \
         .hi = 3600000,                                                                            \
         .env = "KVFENCE_HEADER_TIMEOUT",                                                          \
         .help = "a request's headers within MS of the accept (default 10000); past a bound the "  \
                 "connection is closed (docs/SERVER.md)"},                                         \
        {.name = "--body-timeout",                                                                 \
         .metavar = "MS",                                                                          \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.body_timeout_ms),                                                    \
         .lo = 1,                                                                                  \
         .hi = 3600000,                                                                            \
         .env = "KVFENCE_BODY_TIMEOUT",                                                            \
         .help = "a request's body within MS of its headers (default 30000)"},                     \
        {.name = "--canary-interval",                                                              \
         .metavar = "S",                                                                           \
         .kind = KVF_CLI_U32,                                                                      \
         .off = offsetof(T, m.canary_s),                                                           \
         .lo = 1,                                                                                  \
         .hi = 86400,                                                                              \
         .env = "KVFENCE_CANARY_INTERVAL",                                                         \
         .help = "every S seconds, one of a fixed set of prompts goes through the whole path as "  \
                 "a reserved tenant, and every token and logprob is compared with the reference "  \
                 "computed at start; a mismatch counts kvfence_canary_failures_total, marks "      \
                 "/health degraded and logs the response's provenance (default: no canary)"},      \
    {                                                                                              \
        .name = "--send-timeout", .metavar = "MS", .kind = KVF_CLI_U32,                            \
        .off = offsetof(T, m.send_timeout_ms), .lo = 1, .hi = 3600000,                             \
        .env = "KVFENCE_SEND_TIMEOUT", .help = "a response left unread at most MS (default 30000)" \
    }
/* After the options: the keys-or-loopback rule, the operator endpoints' rules, and the key files
 * loaded. 0, or 2 (printed; nothing left loaded). */
int kvf_cli_http_prepare(const char *cmd, struct kvf_cli_http *h);
/* Starts the server over ops/engine with the model's chat template when the interpreter takes
 * it. 0, or -1 (printed). */
int kvf_cli_http_start(const char *cmd, struct kvf_cli_http *h, const char *model_path,
                       uint64_t model_fp, kvf_gguf_t *g, const kvf_tokenizer_t *tok,
                       const struct kvf_gen_ops *ops, void *engine, kvf_server_t **srv);
/* The startup lines about API keys and the operator endpoints. */
void kvf_cli_http_say_auth(const char *cmd, const struct kvf_cli_http *h, const kvf_server_t *srv);
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
int kvf_cli_pool_limit(const char *cmd, const kvf_model_t *m, uint32_t page_tokens,
                       uint64_t kv_bytes, uint32_t ctx_len, uint32_t *limit, uint32_t *n_pages);

/* "HOST:PORT" into host (cap bytes) and port; port 0 allowed only when allow_zero. 0, or -1. */
int kvf_cli_parse_addr(const char *v, char *host, size_t cap, uint16_t *port, bool allow_zero);

/* --compute-lock FILE: opens (creating) the file whose flock the worker processes on the same
 * cores take turns with. 0 with cfg set, or -1 (printed). */
/* The vocabulary as grammar masks read it (kvfence/grammar.h), from tok or, when NULL, a
 * tokenizer made from g for the call; NULL when the vocabulary cannot be read (then requests
 * with a grammar fail and nothing else changes). The caller frees it after the workers. */
kvf_grammar_vocab_t *kvf_cli_grammar_vocab(const kvf_gguf_t *g, const kvf_tokenizer_t *tok);

int kvf_cli_compute_lock(const char *cmd, const char *path, struct kvf_worker_config *cfg);

/* Checks the mode of a file that holds secrets (API keys, a cluster key) before it is read:
 * writable by group or others is refused, readable by them is allowed with a warning. `what`
 * names the file in the messages ("--api-keys"). Returns 0 with warn filled (one line naming
 * the file and the fix, `chmod 600`) or empty; or a negative errno (-EPERM: writable by group or
 * others; -EINVAL: not a regular file; stat's errno) with err filled. Reads nothing of the file;
 * prints nothing. */
int kvf_cli_check_secret_file(const char *path, const char *what, char *warn, size_t warn_len,
                              char *err, size_t err_len);

/* The fabric's trust for router, prefill and decode (cli_fabric.c): --cluster-key FILE and
 * --insecure-fabric (KVF_CLI_FABRIC_OPTS). */
struct kvf_cli_fabric {
    const char *key_path;
    bool insecure, have_key;
    uint8_t key[32];
};
/* The fabric's rows of an option table whose struct T holds a struct kvf_cli_fabric as m. */
#define KVF_CLI_FABRIC_OPTS(T, m)                                                                  \
    {.name = "--cluster-key",                                                                      \
     .metavar = "FILE",                                                                            \
     .kind = KVF_CLI_STR,                                                                          \
     .off = offsetof(T, m.key_path),                                                               \
     .env = "KVFENCE_CLUSTER_KEY",                                                                 \
     .env_alt = "KVFENCE_CLUSTER_KEY_FILE",                                                        \
     .help = "the cluster key every router, prefill and decode of the service shares (`kvfence "   \
             "keygen FILE` writes one): peers prove it to each other before anything else is "     \
             "said, and every message after is sealed under a session key"},                       \
    {                                                                                              \
        .name = "--insecure-fabric", .kind = KVF_CLI_FLAG, .off = offsetof(T, m.insecure),         \
        .env = "KVFENCE_INSECURE_FABRIC",                                                          \
        .help =                                                                                    \
            "listen beyond loopback without a cluster key (any peer that reaches the port can "    \
            "join; refused otherwise)"                                                             \
    }
/* After the options: loads the key, or applies the rule that a listener beyond loopback needs a
 * key or --insecure-fabric (listen_host NULL: no listener). 0, or 2 (printed). */
int kvf_cli_fabric_prepare(const char *cmd, struct kvf_cli_fabric *f, const char *listen_host);
/* The key for the engine's configs, or NULL when none was given. */
const uint8_t *kvf_cli_fabric_key(const struct kvf_cli_fabric *f);
int kvf_cmd_keygen(int argc, char **argv);

#endif
