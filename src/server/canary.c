/*
 * canary.c — a canary in production: a fixed set of prompts sent through the whole path (the
 * seam: router → prefill → transport → decode) as a reserved tenant, every token and logprob
 * compared with the reference made at start.
 *
 * The engine's output does not depend on batching or on what else runs (docs/ENGINE.md), so the
 * comparison is exact: the same token ids, the same float bits of every logprob and top
 * logprob. At start, once the engine is up, each prompt runs once and its output is its
 * reference; then one prompt every interval (round robin), one at a time: at most one canary
 * request is ever in flight, so its cost is bounded by the interval. A run that ends with an
 * error (the engine refused or failed it) is counted apart (canary_errors) and compared with
 * nothing. A mismatch counts kvfence_canary_failures_total, marks the server degraded (sticky:
 * /health answers 503 "degraded" with the reason until a restart) and logs the failing
 * response's provenance (ids and numbers only, the prompts are the canary's own).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server_internal.h"

#define CANARY_N          3u
#define CANARY_MAX_PROMPT 70u
#define CANARY_TOKENS     8u
#define CANARY_TOP        3u
#define CANARY_RUN_MS     120000 /* one run at most; then cancelled, counted as an error */

struct canary_out {
    uint32_t n;
    struct kvf_gen_event ev[CANARY_TOKENS];
    bool have_prov;
    struct kvf_gen_prov prov;
};

struct kvf__srv_canary {
    const struct kvf_server_config *cfg;
    const struct kvf_gen_ops *ops;
    void *engine;
    struct kvf__srv_metrics *m;
    uint32_t interval_ms;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;         /* under mu */
    bool joined;       /* under mu: its thread was joined (halt) */
    bool degraded;     /* under mu: sticky */
    char why[256];     /* under mu */
    atomic_uint ready; /* references made */
    int32_t prompt[CANARY_N][CANARY_MAX_PROMPT];
    uint32_t n_prompt[CANARY_N];
    struct canary_out ref[CANARY_N];
    struct canary_out got; /* the thread's */
};

static bool stopping(struct kvf__srv_canary *c)
{
    pthread_mutex_lock(&c->mu);
    bool s = c->stop;
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* Sleeps ms or until stop; whether to go on. */
static bool nap(struct kvf__srv_canary *c, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    while (!c->stop && pthread_cond_timedwait(&c->cv, &c->mu, &ts) != ETIMEDOUT) {
    }
    bool go = !c->stop;
    pthread_mutex_unlock(&c->mu);
    return go;
}

static void params_of(const struct kvf__srv_canary *c, uint32_t k, struct kvf_gen_params *p)
{
    memset(p, 0, sizeof *p);
    p->tenant = KVF__SRV_CANARY_TENANT;
    p->prompt = c->prompt[k];
    p->n_prompt = c->n_prompt[k];
    p->max_tokens = CANARY_TOKENS;
    p->n_logprobs = CANARY_TOP;
    p->want_logprob = true;
    p->ignore_eos = true;
    p->sample.top_p = 1.0f;
    /* Greedy, then two sampled ones (the draws are fixed by the seed and the step). */
    if (k == 1) {
        p->sample.temperature = 1.0f;
        p->sample.seed = 0x5eedULL;
    } else if (k == 2) {
        p->sample.temperature = 0.8f;
        p->sample.top_k = 40;
        p->sample.seed = 42;
    }
}

/* One run of prompt k into out: 0, or a negative code (the engine's, -ETIMEDOUT, -ESHUTDOWN). */
static int run_one(struct kvf__srv_canary *c, uint32_t k, struct canary_out *out)
{
    struct kvf_gen_params p;
    params_of(c, k, &p);
    memset(out, 0, sizeof *out);
    kvf_gen_t *g = NULL;
    int rc = c->ops->submit(c->engine, &p, &g);
    if (rc < 0) return rc;
    int64_t until = kvf__srv_now_us() + (int64_t)CANARY_RUN_MS * 1000;
    rc = -ETIMEDOUT;
    for (;;) {
        if (stopping(c)) {
            rc = -ESHUTDOWN;
            break;
        }
        if (kvf__srv_now_us() > until) break;
        struct kvf_gen_event ev;
        int r = c->ops->next(c->engine, g, &ev, 100);
        if (r < 0) {
            rc = r;
            break;
        }
        if (r == 0) continue;
        if (ev.kind == KVF_GEN_TOKEN) {
            if (out->n == 0 && c->ops->prov)
                out->have_prov = c->ops->prov(c->engine, g, &out->prov) == 1;
            if (out->n < CANARY_TOKENS) out->ev[out->n] = ev;
            out->n++;
            continue;
        }
        rc = ev.err;
        break;
    }
    if (rc != 0 || out->n > CANARY_TOKENS) c->ops->cancel(c->engine, g);
    c->ops->release(c->engine, g);
    return rc;
}

static bool same_f(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* "" when got equals ref exactly, else what differs first. */
static void compare(const struct canary_out *ref, const struct canary_out *got, char *why,
                    size_t cap)
{
    why[0] = 0;
    if (got->n != ref->n) {
        snprintf(why, cap, "%u tokens, the reference has %u", got->n, ref->n);
        return;
    }
    for (uint32_t i = 0; i < ref->n && i < CANARY_TOKENS; i++) {
        const struct kvf_gen_event *a = &ref->ev[i], *b = &got->ev[i];
        if (a->token != b->token) {
            snprintf(why, cap, "token %u of %u differs from the reference", i, ref->n);
            return;
        }
        bool same = same_f(a->logprob, b->logprob) && a->n_top == b->n_top;
        for (uint32_t t = 0; same && t < a->n_top && t < KVF_GEN_MAX_LOGPROBS; t++)
            same = a->top_ids[t] == b->top_ids[t] && same_f(a->top_logprobs[t], b->top_logprobs[t]);
        if (!same) {
            snprintf(why, cap, "the logprobs of token %u of %u differ from the reference", i,
                     ref->n);
            return;
        }
    }
}

static void fail(struct kvf__srv_canary *c, uint32_t k, const char *what)
{
    atomic_fetch_add(&c->m->canary_failures, 1);
    pthread_mutex_lock(&c->mu);
    if (!c->degraded) {
        c->degraded = true;
        snprintf(c->why, sizeof c->why, "canary prompt %u: %s", k, what);
    }
    pthread_mutex_unlock(&c->mu);
    char brief[200] = "-", pages[600] = "";
    const struct kvf_gen_prov *pv = &c->got.prov;
    if (c->got.have_prov) {
        kvf__srv_prov_brief(pv, brief, sizeof brief);
        size_t n = 0;
        uint32_t listed = pv->n_pages < KVF_GEN_PROV_PAGES ? pv->n_pages : KVF_GEN_PROV_PAGES;
        for (uint32_t i = 0; i < listed && n + 56 < sizeof pages; i++)
            n += (size_t)snprintf(pages + n, sizeof pages - n, "%s%u:%016llx:%016llx", i ? "," : "",
                                  pv->pages[i].page, (unsigned long long)pv->pages[i].tag,
                                  (unsigned long long)pv->pages[i].checksum);
    }
    kvf__srv_log(c->cfg, "event=canary_failure prompt=%u reason=\"%s\" prov=%s decode=%s pages=%s",
                 k, what, brief, c->got.have_prov && pv->decode_addr[0] ? pv->decode_addr : "-",
                 pages[0] ? pages : "-");
}

static void *canary_main(void *arg)
{
    struct kvf__srv_canary *c = arg;
    /* The engine's vocabulary and limit, once it is up. */
    struct kvf_engine_info in;
    for (;;) {
        memset(&in, 0, sizeof in);
        c->ops->info(c->engine, &in);
        if (in.prefill_up && in.n_vocab && in.served_limit > CANARY_TOKENS + 1) break;
        if (!nap(c, 200)) return NULL;
    }
    static const uint32_t lens[CANARY_N] = {5, 21, CANARY_MAX_PROMPT};
    for (uint32_t k = 0; k < CANARY_N; k++) {
        uint32_t n = lens[k];
        if (n + CANARY_TOKENS > in.served_limit) n = in.served_limit - CANARY_TOKENS;
        c->n_prompt[k] = n;
        for (uint32_t i = 0; i < n; i++)
            c->prompt[k][i] = (int32_t)((k * 131u + i * 31u + 7u) % in.n_vocab);
    }
    /* The references: each prompt once, retried until it runs. */
    for (uint32_t k = 0; k < CANARY_N;) {
        int rc = run_one(c, k, &c->ref[k]);
        if (rc == -ESHUTDOWN) return NULL;
        if (rc == 0) {
            atomic_store(&c->ready, ++k);
            continue;
        }
        if (!nap(c, 500)) return NULL;
    }
    kvf__srv_log(c->cfg, "event=canary_ready references=%u interval_ms=%u", CANARY_N,
                 c->interval_ms);
    for (uint32_t k = 0; nap(c, c->interval_ms); k = (k + 1) % CANARY_N) {
        int rc = run_one(c, k, &c->got);
        if (rc == -ESHUTDOWN) break;
        if (rc < 0) {
            atomic_fetch_add(&c->m->canary_errors, 1);
            continue;
        }
        atomic_fetch_add(&c->m->canary_runs, 1);
        char why[160];
        compare(&c->ref[k], &c->got, why, sizeof why);
        if (why[0]) fail(c, k, why);
    }
    return NULL;
}

int kvf__srv_canary_start(struct kvf__srv_canary **out, const struct kvf_server_config *cfg,
                          const struct kvf_gen_ops *ops, void *engine,
                          struct kvf__srv_metrics *metrics, uint32_t interval_ms)
{
    struct kvf__srv_canary *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->cfg = cfg;
    c->ops = ops;
    c->engine = engine;
    c->m = metrics;
    c->interval_ms = interval_ms;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->th, NULL, canary_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void kvf__srv_canary_halt(struct kvf__srv_canary *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    bool joined = c->joined;
    c->stop = true;
    c->joined = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (!joined) pthread_join(c->th, NULL);
}

void kvf__srv_canary_free(struct kvf__srv_canary *c)
{
    if (!c) return;
    kvf__srv_canary_halt(c);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

bool kvf__srv_canary_degraded(struct kvf__srv_canary *c, char *why, size_t why_len)
{
    pthread_mutex_lock(&c->mu);
    bool d = c->degraded;
    if (d && why && why_len) snprintf(why, why_len, "%s", c->why);
    pthread_mutex_unlock(&c->mu);
    return d;
}

uint32_t kvf__srv_canary_ready(struct kvf__srv_canary *c)
{
    return atomic_load(&c->ready);
}
