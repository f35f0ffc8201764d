/* cli_util.c — option parsing and the model fingerprint, shared by the serving commands. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli.h"
#include "kvfence/grammar.h"
#include "kvfence/parse.h"

int kvf_cli_parse_size(const char *v, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || !(x > 0)) return -1;
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1ull << 10, end++;
    else if (*end == 'm' || *end == 'M')
        mul = 1ull << 20, end++;
    else if (*end == 'g' || *end == 'G')
        mul = 1ull << 30, end++;
    if (*end == 'i' || *end == 'B' || *end == 'b') end++;
    if (*end == 'B') end++;
    if (*end) return -1;
    *out = (uint64_t)(x * (double)mul);
    return 0;
}

int kvf_cli_parse_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t x;
    if (kvf_parse_u64(v, lo, hi, &x) < 0) return -1;
    *out = (uint32_t)x;
    return 0;
}

/* `run`'s parsers of --seed (strtoul) and of --temperature and --top-p, moved here beside the
 * others unchanged: every number the CLI reads is parsed in this file. */
int kvf_cli_parse_u64(const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return -1;
    *out = (uint64_t)x;
    return 0;
}

int kvf_cli_parse_float(const char *v, float lo, float hi, float *out)
{
    char *end = NULL;
    float x = strtof(v, &end);
    if (!end || *end || end == v || !(x >= lo && x <= hi)) return -1;
    *out = x;
    return 0;
}

/* The model's fingerprint: XXH3 of the whole file, so two workers agree only on the same bytes. */
int kvf_cli_file_fp(const char *path, uint64_t *fp)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size <= 0) {
        close(fd);
        return -EINVAL;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -errno;
    *fp = XXH3_64bits(p, (size_t)st.st_size);
    munmap(p, (size_t)st.st_size);
    return 0;
}

void kvf_cli_block_stop_signals(sigset_t *sigs)
{
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int kvf_cli_open_model(const char *cmd, const char *path, kvf_gguf_t **g, kvf_model_t **m,
                       kvf_tokenizer_t **tok, uint64_t *fp)
{
    char err[256] = "";
    if (kvf_gguf_open(path, g, err, sizeof(err)) < 0 ||
        kvf_model_load(*g, m, err, sizeof(err)) < 0 ||
        (tok && kvf_tokenizer_create(*g, tok, err, sizeof(err)) < 0)) {
        fprintf(stderr, "kvfence %s: %s: %s\n", cmd, path, err);
        return -1;
    }
    if (kvf_cli_file_fp(path, fp) < 0) {
        fprintf(stderr, "kvfence %s: cannot read %s\n", cmd, path);
        return -1;
    }
    return 0;
}

kvf_grammar_vocab_t *kvf_cli_grammar_vocab(const kvf_gguf_t *g, const kvf_tokenizer_t *tok)
{
    kvf_tokenizer_t *own = NULL;
    char err[256];
    if (!tok) {
        if (kvf_tokenizer_create(g, &own, err, sizeof(err)) < 0) return NULL;
        tok = own;
    }
    kvf_grammar_vocab_t *v = NULL;
    if (kvf_grammar_vocab_create(tok, &v) < 0) v = NULL;
    kvf_tokenizer_destroy(own);
    return v;
}

int kvf_cli_parse_addr(const char *v, char *host, size_t cap, uint16_t *port, bool allow_zero)
{
    const char *colon = strrchr(v, ':');
    uint32_t p = 0;
    if (!colon || colon == v || (size_t)(colon - v) >= cap ||
        kvf_cli_parse_u32(colon + 1, allow_zero ? 0 : 1, 65535, &p) < 0)
        return -1;
    const char *h = v;
    size_t len = (size_t)(colon - v);
    if (len >= 2 && h[0] == '[' && h[len - 1] == ']') { /* [::1]:8000 */
        h++;
        len -= 2;
    }
    memcpy(host, h, len);
    host[len] = 0;
    *port = (uint16_t)p;
    return 0;
}

int kvf_cli_parse_addrs(const char *cmd, const char *opt, const char *v, struct kvf_cli_addrs *out)
{
    memset(out, 0, sizeof(*out));
    const char *p = v;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char one[128];
        if (len == 0 || len >= sizeof one || out->n == KVF_CLI_MAX_ADDRS) {
            fprintf(stderr,
                    "kvfence %s: %s wants 1 to %d HOST:PORT separated by commas, not '%s'\n", cmd,
                    opt, KVF_CLI_MAX_ADDRS, v);
            return -1;
        }
        memcpy(one, p, len);
        one[len] = 0;
        if (kvf_cli_parse_addr(one, out->host[out->n], sizeof out->host[0], &out->port[out->n],
                               false) < 0) {
            fprintf(stderr, "kvfence %s: %s: '%s' is not HOST:PORT\n", cmd, opt, one);
            return -1;
        }
        out->n++;
        p += len;
        if (*p == ',') p++;
    }
    if (out->n == 0) {
        fprintf(stderr, "kvfence %s: %s is empty\n", cmd, opt);
        return -1;
    }
    return 0;
}

int kvf_cli_pool_limit(const char *cmd, const kvf_model_t *m, uint32_t page_tokens,
                       uint64_t kv_bytes, uint32_t ctx_len, uint32_t *limit_out,
                       uint32_t *n_pages_out)
{
    const struct kvf_model_hparams *hp = kvf_model_hparams(m);
    struct kvf_pool_geometry geo;
    kvf_model_geometry(m, page_tokens, &geo);
    uint64_t page_bytes = kvf_geo_page_bytes(&geo);
    uint64_t pages64 = kv_bytes / page_bytes;
    if (pages64 > (1u << 24)) pages64 = 1u << 24;
    uint32_t n_pages = (uint32_t)pages64;
    uint64_t pool_tokens = (uint64_t)n_pages * page_tokens;
    uint32_t limit = ctx_len ? ctx_len : hp->n_ctx;
    if (limit > hp->n_ctx) {
        fprintf(stderr, "kvfence %s: --context-length %u is beyond the model's context (%u)\n", cmd,
                limit, hp->n_ctx);
        return -1;
    }
    if (pool_tokens < limit) {
        if (ctx_len || pool_tokens < 2 * page_tokens) {
            uint64_t need = ((uint64_t)limit + page_tokens - 1) / page_tokens * page_bytes;
            fprintf(
                stderr,
                "kvfence %s: --kv-memory holds %llu tokens of KV for this model (%llu pages of "
                "%llu bytes), less than one request at the context length %u; raise --kv-memory "
                "to at least %lluM or lower --context-length\n",
                cmd, (unsigned long long)pool_tokens, (unsigned long long)n_pages,
                (unsigned long long)page_bytes, limit,
                (unsigned long long)((need + (1u << 20) - 1) >> 20));
            return -1;
        }
        limit = (uint32_t)pool_tokens;
    }
    *limit_out = limit;
    *n_pages_out = n_pages;
    return 0;
}

int kvf_cli_compute_lock(const char *cmd, const char *path, struct kvf_worker_config *cfg)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "kvfence %s: --compute-lock %s: %s\n", cmd, path, strerror(errno));
        return -1;
    }
    cfg->compute_flock_fd = fd; /* held for the process's life */
    cfg->use_compute_flock = true;
    return 0;
}

/* Only the mode bits are judged: who owns the file is the deployment's business (a key file
 * owned by root and read through a group may be deliberate), but bits that let other users
 * change the file would let them add their own key, and bits that let them read it hand them
 * every tenant's key. */
int kvf_cli_check_secret_file(const char *path, const char *what, char *warn, size_t warn_len,
                              char *err, size_t err_len)
{
    if (warn_len) warn[0] = 0;
    if (err_len) err[0] = 0;
    struct stat st;
    if (stat(path, &st) < 0) {
        int rc = -errno;
        snprintf(err, err_len, "%s %s: %s", what, path, strerror(errno));
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s %s: not a regular file", what, path);
        return -EINVAL;
    }
    unsigned mode = (unsigned)st.st_mode & 07777u;
    if (mode & (S_IWGRP | S_IWOTH)) {
        snprintf(err, err_len,
                 "%s %s: writable by group or others (mode %04o), so another user could change "
                 "it; refusing to use it (fix: chmod 600 %s)",
                 what, path, mode, path);
        return -EPERM;
    }
    if (mode & (S_IRGRP | S_IROTH))
        snprintf(warn, warn_len,
                 "warning: %s %s is readable by group or others (mode %04o); fix: chmod 600 %s",
                 what, path, mode, path);
    return 0;
}
