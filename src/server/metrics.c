/*
 * metrics.c — the latency histograms and GET /metrics in the Prometheus text format (0.0.4).
 *
 * Series (every name prefixed kvfence_; tenant labels are key-file names, "default" without
 * keys, "_none" for requests refused before they had a tenant):
 *   requests_total{tenant,outcome}         generation requests by how they ended (401s of any
 *                                          endpoint under tenant "_none", outcome unauthorized)
 *   request_errors_total{reason}           generation requests that failed though well formed
 *                                          (429, 5xx), by reason (the error's code:
 *                                          kvf__srv_reasons); every reason's series from the
 *                                          start, 0 until it happens
 *   prompt_tokens_total{tenant}, generation_tokens_total{tenant}
 *   tenant_requests{tenant,state}          running / waiting for the tenant's share
 *   tenant_sequences{tenant}, tenant_kv_tokens{tenant}
 *                                          what the running requests take of the share
 *   time_to_first_token_seconds, time_per_output_token_seconds, e2e_request_latency_seconds
 *                                          histograms, one observation per answered request
 *   engine_queued_requests, engine_running_requests, server_in_flight_requests
 *   pages{pool,state}, pool_pages{pool}, pool_free_pages{pool}, pool_capacity_tokens{pool},
 *   reserved_pages{pool}, served_limit_tokens, prefill_up
 *   fences_total, verify_failures_total{reason} (count, trailer, checksum, tail: each there from
 *   the start), stale_messages_total,
 *   bad_frames_total, foreign_tails_total, rejected_before_handoff_total, quarantines_total,
 *   holds_total, handoffs_committed_total, handoffs_failed_total, hash_slices_total,
 *   provenance_records_total; with --canary-interval: canary_runs_total, canary_failures_total,
 *   canary_errors_total
 * Engine figures are read from one ops->info call per scrape. Work: O(tenants × outcomes +
 * reasons + buckets) lines per scrape.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/pool.h"
#include "server_internal.h"

const char *const kvf__srv_outcome_name[KVF__SRV_N_OUTCOMES] = {
    "ok", "error", "cancelled", "invalid", "rate_limited", "unauthorized",
};

static const double ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double tpot_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
static const double e2e_le[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

void kvf__srv_metrics_init(struct kvf__srv_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft.le = ttft_le, m->ttft.n = NELEM(ttft_le);
    m->tpot.le = tpot_le, m->tpot.n = NELEM(tpot_le);
    m->e2e.le = e2e_le, m->e2e.n = NELEM(e2e_le);
    for (int k = 0; k < KVF__SRV_N_REASONS; k++)
        atomic_init(&m->errors[k], 0);
}

/* request_errors_total counts the failures of requests that were fine as sent (429 and 5xx);
 * the 400 reasons are the client's, counted as outcome "invalid" in requests_total. */
static bool counted(int k)
{
    return kvf__srv_reasons[k].status >= 429;
}

void kvf__srv_metrics_error(struct kvf__srv_metrics *m, const char *code)
{
    int k = kvf__srv_reason_by_code(code);
    if (k >= 0 && counted(k)) atomic_fetch_add(&m->errors[k], 1);
}

void kvf__srv_metrics_destroy(struct kvf__srv_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

static void hist_add(struct kvf__srv_hist *h, double v)
{
    uint32_t i = 0;
    while (i < h->n && v > h->le[i])
        i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

void kvf__srv_metrics_observe(struct kvf__srv_metrics *m, const struct kvf__srv_run *r,
                              int64_t end_us)
{
    uint64_t tokens = 0;
    for (uint32_t i = 0; i < r->n; i++)
        tokens += r->ch[i].n_tokens;
    pthread_mutex_lock(&m->mu);
    hist_add(&m->e2e, (double)(end_us - r->t_start_us) / 1e6);
    if (r->t_first_us) {
        hist_add(&m->ttft, (double)(r->t_first_us - r->t_start_us) / 1e6);
        /* The mean gap between tokens after the first, over all choices. */
        if (tokens > r->n)
            hist_add(&m->tpot, (double)(end_us - r->t_first_us) / 1e6 / (double)(tokens - r->n));
    }
    pthread_mutex_unlock(&m->mu);
}

static void put(struct kvf__sbuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct kvf__sbuf *o, const char *fmt, ...)
{
    char line[320];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k > 0) kvf__sbuf_put(o, line, (size_t)k < sizeof line ? (size_t)k : sizeof line - 1);
}

static void head(struct kvf__sbuf *o, const char *name, const char *type, const char *help)
{
    put(o, "# HELP kvfence_%s %s\n# TYPE kvfence_%s %s\n", name, help, name, type);
}

static void scalar(struct kvf__sbuf *o, const char *name, const char *type, const char *help,
                   unsigned long long v)
{
    head(o, name, type, help);
    put(o, "kvfence_%s %llu\n", name, v);
}

/* Handoffs decode refused, by the check that refused them: the three of the commit (proto.h,
 * their sum is kvf_engine_info.verify_failed) and the decode worker's own look at the last
 * page's tail after it (foreign_tails). */
/* (head() writes one line of at most 320 bytes: the help stays short.) */
#define VERIFY_HELP                                                                                \
    "Handoffs decode refused, by the check: count (tokens, pages), trailer (tag, request, "        \
    "tenant, epoch), checksum (page bytes), tail (bytes past the prompt on its last page)."
static const struct {
    const char *name;
    size_t off; /* of its uint64_t counter in struct kvf_engine_info */
} verify_reasons[] = {
    {"count", offsetof(struct kvf_engine_info, verify_count)},
    {"trailer", offsetof(struct kvf_engine_info, verify_trailer)},
    {"checksum", offsetof(struct kvf_engine_info, verify_checksum)},
    {"tail", offsetof(struct kvf_engine_info, foreign_tails)},
};
static uint64_t verify_reason_count(const struct kvf_engine_info *in, size_t k)
{
    uint64_t v;
    memcpy(&v, (const char *)in + verify_reasons[k].off, sizeof v);
    return v;
}

static void hist_put(struct kvf__sbuf *o, const char *name, const char *help,
                     const struct kvf__srv_hist *h)
{
    head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (uint32_t i = 0; i < h->n; i++) {
        cum += h->counts[i];
        put(o, "kvfence_%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    put(o, "kvfence_%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    put(o, "kvfence_%s_sum %.9g\nkvfence_%s_count %llu\n", name, h->sum, name,
        (unsigned long long)h->count);
}

void kvf__srv_metrics_render(struct kvf__srv_metrics *m, struct kvf__srv_tenants *T,
                             const struct kvf_engine_info *in, uint32_t in_flight,
                             struct kvf__sbuf *o)
{
    head(o, "requests_total", "counter", "Generation requests by tenant and outcome.");
    for (size_t t = 0; t < T->n; t++)
        for (int k = 0; k < KVF__SRV_N_OUTCOMES; k++)
            put(o, "kvfence_requests_total{tenant=\"%s\",outcome=\"%s\"} %llu\n", T->t[t].name,
                kvf__srv_outcome_name[k], atomic_load(&T->t[t].outcomes[k]));
    head(o, "request_errors_total", "counter",
         "Generation requests that failed though well formed (429, 5xx), by reason: the "
         "error's code.");
    for (int k = 0; k < KVF__SRV_N_REASONS; k++)
        if (counted(k))
            put(o, "kvfence_request_errors_total{reason=\"%s\"} %llu\n", kvf__srv_reasons[k].code,
                atomic_load(&m->errors[k]));
    head(o, "prompt_tokens_total", "counter", "Prompt tokens of submitted requests.");
    for (size_t t = 1; t < T->n; t++)
        put(o, "kvfence_prompt_tokens_total{tenant=\"%s\"} %llu\n", T->t[t].name,
            atomic_load(&T->t[t].prompt_tokens));
    head(o, "generation_tokens_total", "counter", "Tokens generated, all choices.");
    for (size_t t = 1; t < T->n; t++)
        put(o, "kvfence_generation_tokens_total{tenant=\"%s\"} %llu\n", T->t[t].name,
            atomic_load(&T->t[t].generated_tokens));
    struct kvf__srv_tenant_load *ld = calloc(T->n, sizeof *ld);
    for (size_t t = 1; ld && t < T->n; t++)
        kvf__srv_tenant_load(T, t, &ld[t]);
    head(o, "tenant_requests", "gauge",
         "A tenant's requests submitted (running) and waiting in the server for its share.");
    for (size_t t = 1; ld && t < T->n; t++) {
        put(o, "kvfence_tenant_requests{tenant=\"%s\",state=\"running\"} %u\n", T->t[t].name,
            ld[t].running);
        put(o, "kvfence_tenant_requests{tenant=\"%s\",state=\"waiting\"} %u\n", T->t[t].name,
            ld[t].waiting);
    }
    head(o, "tenant_sequences", "gauge",
         "Sequences (choices) of a tenant's running requests, counted against its share.");
    for (size_t t = 1; ld && t < T->n; t++)
        put(o, "kvfence_tenant_sequences{tenant=\"%s\"} %u\n", T->t[t].name, ld[t].seqs);
    head(o, "tenant_kv_tokens", "gauge",
         "KV tokens a tenant's running requests reserve, counted against its share.");
    for (size_t t = 1; ld && t < T->n; t++)
        put(o, "kvfence_tenant_kv_tokens{tenant=\"%s\"} %llu\n", T->t[t].name,
            (unsigned long long)ld[t].kv_tokens);
    free(ld);
    struct kvf__srv_metrics snap;
    pthread_mutex_lock(&m->mu);
    snap.ttft = m->ttft, snap.tpot = m->tpot, snap.e2e = m->e2e;
    pthread_mutex_unlock(&m->mu);
    hist_put(o, "time_to_first_token_seconds", "Submit to the first token, per request.",
             &snap.ttft);
    hist_put(o, "time_per_output_token_seconds",
             "Mean time between tokens after the first, per request.", &snap.tpot);
    hist_put(o, "e2e_request_latency_seconds", "Submit to the end, per request.", &snap.e2e);

    scalar(o, "engine_queued_requests", "gauge",
           "Requests waiting in the engine for a decode slot.", in->queued);
    scalar(o, "engine_running_requests", "gauge", "Requests admitted by the decode worker.",
           in->running);
    scalar(o, "server_in_flight_requests", "gauge", "Requests holding a generation in the server.",
           in_flight);
    head(o, "pages", "gauge", "Decode pool pages by state.");
    for (int i = 0; i < KVF_PAGE__NSTATES; i++)
        put(o, "kvfence_pages{pool=\"decode\",state=\"%s\"} %u\n",
            kvf_page_state_name((enum kvf_page_state)i), in->decode_by_state[i]);
    head(o, "pool_pages", "gauge", "Pages of each pool (its capacity).");
    put(o, "kvfence_pool_pages{pool=\"decode\"} %u\nkvfence_pool_pages{pool=\"prefill\"} %u\n",
        in->decode_pages, in->prefill_pages);
    head(o, "pool_free_pages", "gauge", "Free pages of each pool.");
    put(o,
        "kvfence_pool_free_pages{pool=\"decode\"} %u\nkvfence_pool_free_pages{pool=\"prefill\"} "
        "%u\n",
        in->decode_free, in->prefill_free);
    head(o, "pool_capacity_tokens", "gauge", "Token slots of each pool.");
    put(o,
        "kvfence_pool_capacity_tokens{pool=\"decode\"} %llu\n"
        "kvfence_pool_capacity_tokens{pool=\"prefill\"} %llu\n",
        (unsigned long long)in->decode_pages * in->page_tokens,
        (unsigned long long)in->prefill_pages * in->page_tokens);
    head(o, "reserved_pages", "gauge", "Pages reserved for admitted requests' growth.");
    put(o, "kvfence_reserved_pages{pool=\"decode\"} %u\n", in->decode_reserved);
    scalar(o, "served_limit_tokens", "gauge", "The most prompt plus output tokens of one request.",
           in->served_limit);
    scalar(o, "page_tokens", "gauge", "Token slots per page.", in->page_tokens);
    scalar(o, "prefill_up", "gauge", "1 while the decode worker holds a live prefill connection.",
           in->prefill_up);
    scalar(o, "fences_total", "counter", "Connections fenced (forced close, epoch bumped).",
           (unsigned long long)in->fences);
    head(o, "verify_failures_total", "counter", VERIFY_HELP);
    for (size_t k = 0; k < KVF_ARRAY_LEN(verify_reasons); k++)
        put(o, "kvfence_verify_failures_total{reason=\"%s\"} %llu\n", verify_reasons[k].name,
            (unsigned long long)verify_reason_count(in, k));
    scalar(o, "stale_messages_total", "counter", "Messages of an old epoch or session dropped.",
           (unsigned long long)in->stale_msgs);
    scalar(o, "bad_frames_total", "counter", "Control frames from the prefill that did not decode.",
           (unsigned long long)in->bad_frames);
    scalar(o, "foreign_tails_total", "counter",
           "Prompts whose last page carried bytes they did not write.",
           (unsigned long long)in->foreign_tails);
    scalar(o, "rejected_before_handoff_total", "counter",
           "Requests refused before any page was handed off.",
           (unsigned long long)in->rejected_before_handoff);
    scalar(o, "quarantines_total", "counter",
           "Pages that went QUARANTINED (freed only by a fence).",
           (unsigned long long)in->quarantines);
    scalar(o, "holds_total", "counter", "Pages that went HELD.", (unsigned long long)in->holds);
    scalar(o, "handoffs_committed_total", "counter",
           "Requests whose handoff was verified and committed.", (unsigned long long)in->committed);
    scalar(o, "handoffs_failed_total", "counter", "Requests that failed in the decode protocol.",
           (unsigned long long)in->failed);
    scalar(o, "hash_slices_total", "counter", "Slices of long prompts' pages hashed between turns.",
           (unsigned long long)in->hash_slices);
    scalar(o, "decode_tokens_total", "counter", "Tokens the decode steps produced, every sequence.",
           (unsigned long long)in->decoded_tokens);
    scalar(o, "provenance_records_total", "counter",
           "Responses' provenance records kept (one per choice whose handoff was verified).",
           (unsigned long long)atomic_load(&m->prov_records));
    if (!m->canary_on) return;
    scalar(o, "canary_runs_total", "counter",
           "Canary runs compared with their reference (--canary-interval).",
           (unsigned long long)atomic_load(&m->canary_runs));
    scalar(o, "canary_failures_total", "counter",
           "Canary runs whose tokens or logprobs differed from the reference.",
           (unsigned long long)atomic_load(&m->canary_failures));
    scalar(o, "canary_errors_total", "counter",
           "Canary runs that ended with an error and were compared with nothing.",
           (unsigned long long)atomic_load(&m->canary_errors));
}

/* Split roles: one series per worker the router was given, labelled role and worker (HOST:PORT),
 * and the decode workers' own figures — pages by state, reservations, holds, quarantines, fences,
 * verify failures (tag, count or checksum), stale messages, rejections before handoff — so a
 * fault is seen on the worker it happened on. */
void kvf__srv_metrics_render_workers(const struct kvf_worker_status *ws, size_t n,
                                     struct kvf__sbuf *o)
{
    head(o, "worker_up", "gauge", "1 while the router reaches the worker and its HELLO agreed.");
    for (size_t i = 0; i < n; i++)
        put(o, "kvfence_worker_up{role=\"%s\",worker=\"%s:%u\"} %d\n", ws[i].role, ws[i].host,
            ws[i].port, ws[i].up ? 1 : 0);
    head(o, "worker_prompts_granted_total", "counter", "Prompts granted to a prefill worker.");
    for (size_t i = 0; i < n; i++)
        if (strcmp(ws[i].role, "prefill") == 0)
            put(o, "kvfence_worker_prompts_granted_total{worker=\"%s:%u\"} %llu\n", ws[i].host,
                ws[i].port, (unsigned long long)ws[i].granted);
    head(o, "worker_pages", "gauge", "A decode worker's pages by state.");
    for (size_t i = 0; i < n; i++) {
        if (!ws[i].up || strcmp(ws[i].role, "decode") != 0) continue;
        for (int s = 0; s < KVF_PAGE__NSTATES; s++)
            put(o, "kvfence_worker_pages{worker=\"%s:%u\",state=\"%s\"} %u\n", ws[i].host,
                ws[i].port, kvf_page_state_name((enum kvf_page_state)s),
                ws[i].info.decode_by_state[s]);
    }
    static const struct {
        const char *name, *type, *help;
        size_t off;
        bool wide;
    } f[] = {
        {"worker_pool_pages", "gauge", "A decode worker's pool (its capacity).",
         offsetof(struct kvf_engine_info, decode_pages), false},
        {"worker_reserved_pages", "gauge", "A decode worker's pages reserved for growth.",
         offsetof(struct kvf_engine_info, decode_reserved), false},
        {"worker_running_requests", "gauge", "A decode worker's admitted requests.",
         offsetof(struct kvf_engine_info, running), false},
        {"worker_queued_requests", "gauge", "A decode worker's requests waiting for pages.",
         offsetof(struct kvf_engine_info, queued), false},
        {"worker_fences_total", "counter", "A decode worker's fences.",
         offsetof(struct kvf_engine_info, fences), true},
        {"worker_stale_messages_total", "counter", "A decode worker's stale messages dropped.",
         offsetof(struct kvf_engine_info, stale_msgs), true},
        {"worker_holds_total", "counter", "A decode worker's pages that went HELD.",
         offsetof(struct kvf_engine_info, holds), true},
        {"worker_quarantines_total", "counter", "A decode worker's pages that went QUARANTINED.",
         offsetof(struct kvf_engine_info, quarantines), true},
        {"worker_rejected_before_handoff_total", "counter",
         "A decode worker's requests refused before any page moved.",
         offsetof(struct kvf_engine_info, rejected_before_handoff), true},
        {"worker_foreign_tails_total", "counter",
         "A decode worker's prompts whose last page carried bytes they did not write.",
         offsetof(struct kvf_engine_info, foreign_tails), true},
        {"worker_handoffs_committed_total", "counter", "A decode worker's verified handoffs.",
         offsetof(struct kvf_engine_info, committed), true},
    };
    for (size_t k = 0; k < KVF_ARRAY_LEN(f); k++) {
        head(o, f[k].name, f[k].type, f[k].help);
        for (size_t i = 0; i < n; i++) {
            if (!ws[i].up || strcmp(ws[i].role, "decode") != 0) continue;
            const char *p = (const char *)&ws[i].info + f[k].off;
            unsigned long long v;
            if (f[k].wide) {
                uint64_t x;
                memcpy(&x, p, sizeof x);
                v = x;
            } else {
                uint32_t x;
                memcpy(&x, p, sizeof x);
                v = x;
            }
            put(o, "kvfence_%s{worker=\"%s:%u\"} %llu\n", f[k].name, ws[i].host, ws[i].port, v);
        }
    }
    head(o, "worker_verify_failures_total", "counter",
         "A decode worker's handoffs refused by its checks, by reason (as "
         "kvfence_verify_failures_total).");
    for (size_t i = 0; i < n; i++) {
        if (!ws[i].up || strcmp(ws[i].role, "decode") != 0) continue;
        for (size_t k = 0; k < KVF_ARRAY_LEN(verify_reasons); k++)
            put(o, "kvfence_worker_verify_failures_total{worker=\"%s:%u\",reason=\"%s\"} %llu\n",
                ws[i].host, ws[i].port, verify_reasons[k].name,
                (unsigned long long)verify_reason_count(&ws[i].info, k));
    }
}
