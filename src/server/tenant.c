/*
 * tenant.c — API keys (the key file, constant-time lookup) and the tenant table: each tenant's
 * share of the server and its counters.
 *
 * A tenant's share counts what its requests take, not how many there are: the sequences they run
 * (a request's n choices are n sequences; /tokenize and /detokenize one each) against
 * max_running, and the KV they reserve (n × (prompt + max_tokens), in whole pages) against a KV
 * cap. A request, as admission sees it (w: what it takes):
 *
 *     enter(w) ──▶ RUNNING (seqs + w.seqs ≤ max_running, kv + w.kv ≤ cap) ──exit(w)──▶ (gone)
 *       │            ▲
 *       │            └── wait: what it takes was freed ──┐
 *       ├──▶ WAITING (waiting < max_queued) ─────────────┴── leave_queue (client gone, stop,
 *       │                                                                 timeout: 429)
 *       └──▶ refused (-EAGAIN: 429)
 *   A request that could never fit (w.seqs > max_running or w.kv > cap) is refused by the caller
 *   with 400 before enter (kvf__srv_tenant_fits).
 *
 * Invariant (under mu), for every tenant: seqs ≤ max_running when max_running > 0; kv_tokens ≤
 * the cap each of its running requests was admitted under; waiting ≤ max_queued; running == 0
 * iff seqs == 0 and kv_tokens == 0. A newcomer does not pass a waiter (enter takes its share only
 * when no request of the tenant waits), so a burst of one tenant waits behind its own running
 * requests, and what the engine holds of any one tenant is bounded by its share, which is what
 * keeps the others served.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvfence/common.h"
#include "server_internal.h"

struct key_entry {
    unsigned char key[KVF_SERVER_MAX_KEY_BYTES]; /* zero-padded */
    uint32_t len;
    uint32_t tenant; /* 1.. */
};

struct kvf_server_keys {
    struct key_entry *k;
    size_t n, cap;
    char (*names)[KVF_SERVER_MAX_TENANT_NAME + 1]; /* [n_tenants]: tenant id i is names[i-1] */
    size_t n_tenants, cap_tenants;
};

static bool tenant_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

/* The tenant id of name (added when new), or 0 with no memory. */
static uint32_t tenant_id(struct kvf_server_keys *ks, const char *name, size_t n)
{
    for (size_t i = 0; i < ks->n_tenants; i++)
        if (strlen(ks->names[i]) == n && memcmp(ks->names[i], name, n) == 0) return (uint32_t)i + 1;
    if (ks->n_tenants == ks->cap_tenants) {
        size_t cap = ks->cap_tenants ? 2 * ks->cap_tenants : 8;
        void *p = realloc(ks->names, cap * sizeof ks->names[0]);
        if (!p) return 0;
        ks->names = p;
        ks->cap_tenants = cap;
    }
    memcpy(ks->names[ks->n_tenants], name, n);
    ks->names[ks->n_tenants][n] = 0;
    return (uint32_t)++ks->n_tenants;
}

void kvf_server_keys_free(kvf_server_keys_t *k)
{
    if (!k) return;
    if (k->k) explicit_bzero(k->k, k->cap * sizeof k->k[0]);
    free(k->k);
    free(k->names);
    free(k);
}

int kvf_server_keys_parse(const char *text, size_t len, kvf_server_keys_t **out, char *err,
                          size_t err_len)
{
    struct kvf_server_keys *ks = calloc(1, sizeof *ks);
    if (!ks) goto oom;
    size_t line = 0;
    for (size_t pos = 0; pos < len;) {
        line++;
        const char *l = text + pos;
        const char *nl = memchr(l, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - l) : len - pos;
        pos += ll + (nl != NULL);
        if (ll && l[ll - 1] == '\r') ll--;
        /* Up to three fields, so a third is reported. */
        const char *f[3];
        size_t fl[3], nf = 0;
        for (size_t i = 0; i < ll;) {
            while (i < ll && (l[i] == ' ' || l[i] == '\t'))
                i++;
            if (i == ll) break;
            if (nf == 3) break;
            f[nf] = l + i;
            while (i < ll && l[i] != ' ' && l[i] != '\t')
                i++;
            fl[nf] = (size_t)(l + i - f[nf]);
            nf++;
        }
        if (nf == 0 || f[0][0] == '#') continue;
        if (nf != 2) {
            snprintf(err, err_len, "line %zu: expected 'KEY TENANT', found %zu field%s", line, nf,
                     nf == 1 ? "" : "s (or more)");
            goto invalid;
        }
        if (fl[0] < 8 || fl[0] > KVF_SERVER_MAX_KEY_BYTES) {
            snprintf(err, err_len, "line %zu: a key must be 8 to %d characters long", line,
                     KVF_SERVER_MAX_KEY_BYTES);
            goto invalid;
        }
        for (size_t i = 0; i < fl[0]; i++)
            if ((unsigned char)f[0][i] < 0x21 || (unsigned char)f[0][i] > 0x7e) {
                snprintf(err, err_len, "line %zu: a key must be printable ASCII", line);
                goto invalid;
            }
        bool name_ok = fl[1] <= KVF_SERVER_MAX_TENANT_NAME && f[1][0] != '_';
        for (size_t i = 0; name_ok && i < fl[1]; i++)
            name_ok = tenant_char(f[1][i]);
        if (!name_ok) {
            snprintf(err, err_len,
                     "line %zu: a tenant name is 1 to %d of A-Z a-z 0-9 _ . - and does not "
                     "start with '_'",
                     line, KVF_SERVER_MAX_TENANT_NAME);
            goto invalid;
        }
        if (kvf_server_keys_lookup(ks, f[0], fl[0])) {
            snprintf(err, err_len, "line %zu: this key already appears on an earlier line", line);
            goto invalid;
        }
        if (ks->n == ks->cap) {
            size_t cap = ks->cap ? 2 * ks->cap : 8;
            struct key_entry *p = calloc(cap, sizeof *p);
            if (!p) goto oom;
            if (ks->n) memcpy(p, ks->k, ks->n * sizeof *p);
            if (ks->k) explicit_bzero(ks->k, ks->cap * sizeof *p);
            free(ks->k);
            ks->k = p;
            ks->cap = cap;
        }
        uint32_t t = tenant_id(ks, f[1], fl[1]);
        if (!t) goto oom;
        struct key_entry *e = &ks->k[ks->n++];
        memset(e, 0, sizeof *e);
        memcpy(e->key, f[0], fl[0]);
        e->len = (uint32_t)fl[0];
        e->tenant = t;
    }
    if (ks->n == 0) {
        snprintf(err, err_len, "no keys (every line is blank or a comment)");
        goto invalid;
    }
    *out = ks;
    return 0;
invalid:
    kvf_server_keys_free(ks);
    return -EINVAL;
oom:
    kvf_server_keys_free(ks);
    snprintf(err, err_len, "out of memory");
    return -ENOMEM;
}

int kvf_server_keys_load(const char *path, kvf_server_keys_t **out, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int rc = -errno;
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return rc;
    }
    struct kvf__sbuf b = {0};
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0 && b.n < (64u << 20))
        kvf__sbuf_put(&b, buf, k);
    explicit_bzero(buf, sizeof buf);
    bool bad = ferror(f) || b.n >= (64u << 20);
    fclose(f);
    int rc;
    char perr[200] = "";
    if (b.oom) {
        rc = -ENOMEM;
        snprintf(err, err_len, "%s: out of memory", path);
    } else if (bad) {
        rc = -EIO;
        snprintf(err, err_len, "%s: cannot read it (or it is over 64 MiB)", path);
    } else if ((rc = kvf_server_keys_parse(b.p ? b.p : "", b.n, out, perr, sizeof perr)) < 0) {
        snprintf(err, err_len, "%s: %s", path, perr);
    }
    if (b.p) explicit_bzero(b.p, b.cap);
    kvf__sbuf_free(&b);
    return rc;
}

size_t kvf_server_keys_count(const kvf_server_keys_t *k)
{
    return k ? k->n : 0;
}

size_t kvf_server_keys_n_tenants(const kvf_server_keys_t *k)
{
    return k ? k->n_tenants : 0;
}

const char *kvf_server_keys_tenant_name(const kvf_server_keys_t *k, uint32_t id)
{
    return k && id >= 1 && id <= k->n_tenants ? k->names[id - 1] : NULL;
}

/* Every key is compared over all KVF_SERVER_MAX_KEY_BYTES bytes with no branch on the bytes or
 * the lengths, and the loop never stops early: the time depends on the number of keys only. */
uint32_t kvf_server_keys_lookup(const kvf_server_keys_t *k, const char *key, size_t len)
{
    if (!k) return 0;
    unsigned char cand[KVF_SERVER_MAX_KEY_BYTES];
    memset(cand, 0, sizeof cand);
    memcpy(cand, key, len < sizeof cand ? len : sizeof cand);
    /* An over-long candidate matches nothing: its length differs from every key's. */
    uint32_t clen = len <= KVF_SERVER_MAX_KEY_BYTES ? (uint32_t)len : KVF_SERVER_MAX_KEY_BYTES + 1;
    uint32_t found = 0;
    for (size_t i = 0; i < k->n; i++) {
        const struct key_entry *e = &k->k[i];
        uint32_t d = e->len ^ clen; /* both ≤ 257: d < 512 */
        for (size_t b = 0; b < KVF_SERVER_MAX_KEY_BYTES; b++)
            d |= (uint32_t)(e->key[b] ^ cand[b]);
        uint32_t eq = (d - 1) >> 31; /* 1 iff d == 0 (d < 2^31) */
        found |= (0u - eq) & e->tenant;
    }
    explicit_bzero(cand, sizeof cand);
    return found;
}

bool kvf_server_keys_overlap(const kvf_server_keys_t *a, const kvf_server_keys_t *b)
{
    uint32_t any = 0;
    for (size_t i = 0; a && b && i < a->n; i++)
        any |= kvf_server_keys_lookup(b, (const char *)a->k[i].key, a->k[i].len);
    return any != 0;
}

/* --- The tenant table. -------------------------------------------------------------------------
 */

int kvf__srv_tenants_init(struct kvf__srv_tenants *T, const kvf_server_keys_t *keys,
                          uint32_t default_id, uint32_t max_running, uint32_t max_queued,
                          uint64_t max_kv_tokens, uint32_t wait_ms)
{
    memset(T, 0, sizeof *T);
    T->n = keys ? 1 + kvf_server_keys_n_tenants(keys) : 2;
    T->t = calloc(T->n, sizeof T->t[0]);
    if (!T->t) return -ENOMEM;
    snprintf(T->t[0].name, sizeof T->t[0].name, "_none");
    for (size_t i = 1; i < T->n; i++) {
        snprintf(T->t[i].name, sizeof T->t[i].name, "%s",
                 keys ? kvf_server_keys_tenant_name(keys, (uint32_t)i) : "default");
        T->t[i].id = keys ? (uint32_t)i : default_id;
    }
    T->max_running = max_running;
    /* Without a bound on sequences, waiting for the KV share is bounded by time (and by the
     * connections) only. */
    T->max_queued = max_running ? max_queued : UINT32_MAX;
    T->max_kv_tokens = max_kv_tokens;
    T->wait_ms = wait_ms ? wait_ms : 30000;
    pthread_mutex_init(&T->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&T->cv, &ca);
    pthread_condattr_destroy(&ca);
    return 0;
}

void kvf__srv_tenants_destroy(struct kvf__srv_tenants *T)
{
    if (!T->t) return;
    pthread_mutex_destroy(&T->mu);
    pthread_cond_destroy(&T->cv);
    free(T->t);
    T->t = NULL;
}

uint64_t kvf__srv_round_tokens(uint64_t tokens, uint32_t page_tokens)
{
    if (page_tokens <= 1) return tokens;
    return (tokens + page_tokens - 1) / page_tokens * page_tokens;
}

/* The default share: with several tenants and a known pool, the larger of an even split of the
 * pool and what is left after keeping one request at the served limit for each other tenant —
 * but never less than one request at the limit, so every request the server takes fits its
 * tenant's share alone. */
uint64_t kvf__srv_tenant_kv_cap(const struct kvf__srv_tenants *T, const struct kvf_engine_info *in)
{
    if (T->max_kv_tokens) return T->max_kv_tokens;
    uint64_t n = T->n - 1; /* tenants, without "_none" */
    if (n < 2 || !in->decode_pages || !in->served_limit) return 0;
    uint32_t pt = in->page_tokens ? in->page_tokens : 1;
    uint64_t cap_tokens = (uint64_t)in->decode_pages * pt;
    uint64_t limit = kvf__srv_round_tokens(in->served_limit, pt);
    uint64_t even = cap_tokens / n / pt * pt;
    uint64_t rest = cap_tokens > (n - 1) * limit ? cap_tokens - (n - 1) * limit : 0;
    uint64_t share = even > rest ? even : rest;
    return share > limit ? share : limit;
}

/* The invariants of one tenant's accounting (the header's), under mu: O(1), checked by ALWAYS
 * after every transition (test and debug builds stop on a violation). */
static bool tenant_ok(const struct kvf__srv_tenants *T, const struct kvf__srv_tenant *t)
{
    if (t->running == 0) return t->seqs == 0 && t->kv_tokens == 0;
    if (t->seqs < t->running) return false; /* every request runs one sequence at least */
    if (T->max_running && t->seqs > T->max_running) return false;
    return t->waiting <= T->max_queued;
}

/* Whether w fits beside what the tenant runs now (under mu). */
static bool fits_now(const struct kvf__srv_tenants *T, const struct kvf__srv_tenant *t,
                     const struct kvf__srv_share *w, uint64_t kv_cap)
{
    if (T->max_running && (uint64_t)t->seqs + w->seqs > T->max_running) return false;
    return !kv_cap || t->kv_tokens + w->kv_tokens <= kv_cap;
}

static void take(struct kvf__srv_tenant *t, const struct kvf__srv_share *w)
{
    t->running++;
    t->seqs += w->seqs;
    t->kv_tokens += w->kv_tokens;
}

int kvf__srv_tenant_enter(struct kvf__srv_tenants *T, size_t ti, const struct kvf__srv_share *w,
                          uint64_t kv_cap)
{
    struct kvf__srv_tenant *t = &T->t[ti];
    int rc;
    pthread_mutex_lock(&T->mu);
    if (t->waiting == 0 && fits_now(T, t, w, kv_cap)) {
        take(t, w);
        rc = 0;
    } else if (t->waiting < T->max_queued) {
        t->waiting++;
        rc = 1;
    } else {
        rc = -EAGAIN;
    }
    (void)ALWAYS(tenant_ok(T, t));
    pthread_mutex_unlock(&T->mu);
    return rc;
}

int kvf__srv_tenant_wait(struct kvf__srv_tenants *T, size_t ti, const struct kvf__srv_share *w,
                         uint64_t kv_cap, int timeout_ms)
{
    struct kvf__srv_tenant *t = &T->t[ti];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)timeout_ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    int rc = 1;
    pthread_mutex_lock(&T->mu);
    if (!fits_now(T, t, w, kv_cap)) pthread_cond_timedwait(&T->cv, &T->mu, &ts);
    if (fits_now(T, t, w, kv_cap)) {
        t->waiting--;
        take(t, w);
        rc = 0;
    }
    (void)ALWAYS(tenant_ok(T, t));
    pthread_mutex_unlock(&T->mu);
    return rc;
}

void kvf__srv_tenant_leave_queue(struct kvf__srv_tenants *T, size_t ti)
{
    pthread_mutex_lock(&T->mu);
    T->t[ti].waiting--;
    pthread_mutex_unlock(&T->mu);
}

void kvf__srv_tenant_exit(struct kvf__srv_tenants *T, size_t ti, const struct kvf__srv_share *w)
{
    struct kvf__srv_tenant *t = &T->t[ti];
    pthread_mutex_lock(&T->mu);
    if (!NEVER(t->running == 0 || t->seqs < w->seqs || t->kv_tokens < w->kv_tokens)) {
        t->running--;
        t->seqs -= w->seqs;
        t->kv_tokens -= w->kv_tokens;
    }
    (void)ALWAYS(tenant_ok(T, t));
    pthread_cond_broadcast(&T->cv);
    pthread_mutex_unlock(&T->mu);
}

void kvf__srv_tenant_load(struct kvf__srv_tenants *T, size_t ti, struct kvf__srv_tenant_load *out)
{
    pthread_mutex_lock(&T->mu);
    out->running = T->t[ti].running;
    out->waiting = T->t[ti].waiting;
    out->seqs = T->t[ti].seqs;
    out->kv_tokens = T->t[ti].kv_tokens;
    pthread_mutex_unlock(&T->mu);
}
