/*
 * sim_loops.c — the deterministic simulator on the production worker loops.
 *
 * One decode worker and two prefill workers — src/engine's own loops, in manual mode — run on
 * simnet (simnet.h: simulated links and clock behind the transport seam) with the tiny model's
 * real forward pass, single-threaded: a seed replays a run exactly. Faults by seed: delays and
 * late deliveries, lost flush acks, slow local completions, link resets, prefill compute stalls
 * past the no-progress bound, prefill processes killed (their in-flight writes still land) and
 * restarted, client cancels, a decode pool small enough that pages are reused at once, and
 * slow but live prefills (long prompts that outlast the no-progress bound while each chunk ends
 * within it: they must complete).
 *
 * Checks, on content:
 *   L1 every token a request receives, ended well or not, equals — token id and logprob, bit for
 *      bit — the same position of the same request run alone in a world without faults;
 *   L2 every request ends (nothing hangs), and in a seed without link or process faults every
 *      request not cancelled completes whole;
 *   L3 once all ended and the hold timeout passed: no decode page OWNED, GRANTED or HELD, every
 *      page FREE or QUARANTINED; every live prefill pool all free;
 *   L4 (over the run) a floor: at least half the requests not cancelled complete whole (a quarter
 *      pressured or forged);
 *   L5 decode's test audit of each committed prompt's last page (KVF_TEST_AUDIT_TAIL): the slots
 *      beyond the prompt hold zeros, never another request's bytes.
 * and on the pages' lifetimes:
 *   L6 a write lands only on a page that is GRANTED, HELD or QUARANTINED — never FREE or OWNED
 *      (a page freed or committed while a write to it was in flight) — and a page's trailer
 *      lands only with the tag the page has now (never a write meant for the page's previous
 *      grant, landing under its next one);
 *   L7 after every turn, the consistency walks of every protocol machine and pool in the world
 *      (kvf_decode_check, kvf_prefill_check, kvf_pool_check);
 *   L8 a put reads its source page only while its job still holds it, checked at the put's post
 *      and when simnet reads its bytes (its local completion);
 *   L9 no write lands on a page of a grant whose prompt the prefill engine refused (the
 *      placeholder incident's prefill half: a refused request gets no write at all);
 *   L10 in a seed where every message arrived in time and no writer failed or stalled, no
 *      decode page is quarantined: every grant ends by its writer's proof;
 *   L11 every commit rests on its writer's current epoch in decode's pool, never on one a fence
 *      ended.
 * L9 and L11 read the workers' test events in process (kvf__test_event_listen): the refused
 * grants' pages (the forgeries' refuse=N) and each commit's writer and epoch. These are the
 * invariants I1..I9 of the simulator of the protocol machines this one replaced (docs/MUTANTS.md,
 * "The checks of the simulator").
 * With --content-only, L1 alone.
 *
 * --unverified: decode commits what arrives unread (no count, trailer, checksum or tail check: the
 * test build's KVF_TEST_UNVERIFIED), so that L1 sees what the page lifetime rules alone let
 * through; --forge then may not make short handoffs or stale writes (what only those checks see).
 *
 * --pressured: pools so small that a freed page goes to the next request at once, late and slow
 * puts, many cancels. --forge SPEC: the fault world's prefills forge what an honest one never
 * sends (the test build's KVF_TEST_FORGE, src/engine/prefill_worker.c: fenced epochs' DONEs
 * replayed, stale bytes written into another request's page, short handoffs, refusals); decode
 * must refuse each, and L1 sees any that it takes.
 *
 * --content-only: L1 alone (what content shows by itself; L2 and the liveness of a world where
 * L2 would have failed still end the run at LIMIT_MS).
 *
 * --late-writes: one put in ten lands up to twice the hold timeout late (after the hold of a page
 * whose writer went silent has ended: a page freed, not quarantined, then receives it).
 *
 * --router: the fault world's requests go through the router and a decode service (the split
 * roles' loops, src/engine/router.c and decode_service.c, in manual mode too) over simnet.
 *
 * Usage: test_sim_loops [--seeds N] [--first S] [--unverified] [--pressured] [--forge SPEC]
 *                       [--content-only] [--router] [--late-writes] [--verbose]
 * (KVF_SIM_LOOPS_SEEDS overrides N)
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvfence/engine.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"
#include "simnet.h"

#define N_PF       2
#define MAX_RQ     12
#define PT         16
#define CTX        256
#define MAX_PROMPT 150
#define MAX_OUT    24
#define GRANT_MS   400
#define HOLD_MS    1500
#define LIMIT_MS   60000
/* After the last request ended, the world runs this long (in 5 ms steps) before L3: past the
 * hold timeout, and past the slowest bounded ending seen (a prefill whose decode fenced it can
 * keep a job's source pages for a few seconds, until its session ends). */
#define DRAIN_MS (HOLD_MS + 8000)

struct req {
    int32_t prompt[MAX_PROMPT];
    uint32_t n_prompt, max_tokens;
    uint32_t tenant; /* two tenants: the forgeries write one's bytes into the other's pages */
    struct kvf_sample_params sp;
    uint64_t submit_at, cancel_at; /* cancel_at 0: never */
    kvf_gen_t *g;
    bool submitted, ended;
    int err;
    uint32_t n_out;
    int32_t toks[MAX_OUT];
    float lps[MAX_OUT];
    /* The reference: the same request alone, without faults. */
    uint32_t rn;
    int32_t rtoks[MAX_OUT];
    float rlps[MAX_OUT];
};

enum fkind { F_KILL = 1, F_RESTART, F_RESET };
struct fault {
    uint64_t at;
    enum fkind kind;
    int pf;
    bool done;
};

/* The run's options (main's flags). */
struct opts {
    bool verbose;
    bool pressured;    /* small pools, late puts, many cancels: freed pages reused under writes */
    const char *forge; /* KVF_TEST_FORGE for the prefills of the fault world (their forgeries) */
    bool content_only; /* L1 alone: what content shows by itself */
    bool router;       /* requests through the router and a decode service (the split roles) */
    bool late_writes;  /* one put in ten lands up to twice the hold timeout late */
};
static struct opts O;

struct world {
    uint64_t seed;
    bool faults;
    struct simnet *net;
    const kvf_model_t *m;
    uint32_t n_vocab;
    kvf_pworker_t *pw[N_PF];
    uint16_t port[N_PF];
    uint64_t pw_due[N_PF];
    kvf_dworker_t *dw;
    uint64_t dw_due;
    kvf_decode_service_t *ds; /* --router: the decode worker's service, and the router */
    kvf_router_t *rt;
    const struct kvf_gen_ops *gops; /* where requests go: the router's seam, or decode's */
    void *ge;
    struct req *rq;
    uint32_t n_rq;
    struct fault fl[4];
    uint32_t n_fl;
    uint32_t stall_pct;
    bool link_faults; /* a kill or a reset happened */
    bool quick;       /* the reference: the run ends when its request does */
    bool slow;        /* a slow but live prefill: each chunk takes 80-200 ms (under the
                         no-progress bound, while a long prompt's chunks together outlast it) */
    char why[512];
    bool verbose;
    /* L9: the pages (and tags) of the grants whose prompts the prefill engine refused. */
    struct kvf_page_ref refused[512];
    uint32_t n_refused;
};

static int violate(struct world *W, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static const char *state_name(enum kvf_page_state st)
{
    switch (st) {
    case KVF_PAGE_FREE:
        return "FREE";
    case KVF_PAGE_OWNED:
        return "OWNED";
    case KVF_PAGE_GRANTED:
        return "GRANTED";
    case KVF_PAGE_HELD:
        return "HELD";
    case KVF_PAGE_QUARANTINED:
        return "QUARANTINED";
    default:
        return "?";
    }
}

/* L8, at every put's post and at its local completion: the source page's tag while a job holds
 * it; a value no holder gives once it is let go; 0 for a source outside the prefill pools (the
 * trailers, which the job keeps apart). */
static uint64_t src_id(void *ctx, const void *src, size_t len)
{
    (void)len;
    const struct world *W = ctx;
    for (int i = 0; i < N_PF; i++) {
        const kvf_pool_t *pool = W->pw[i] ? kvf_pworker_page_pool(W->pw[i]) : NULL;
        if (!pool) continue;
        size_t bytes = 0;
        const uint8_t *base = kvf_pool_data(pool, &bytes);
        const uint8_t *p = src;
        if (!base || p < base || p >= base + bytes) continue;
        struct kvf_page_info in;
        if (kvf_pool_page_info(pool, (uint32_t)((size_t)(p - base) / kvf_pool_page_bytes(pool)),
                               &in) < 0)
            return UINT64_MAX;
        return in.state == KVF_PAGE_OWNED ? in.tag : 0xF000000000000000ull | (uint64_t)in.state;
    }
    return 0;
}

/* L6, at every write simnet applies to the decode pool (its region). */
static int land_check(void *ctx, kvf_xport_t *x, uint64_t off, const void *bytes, size_t len,
                      bool sender_dead, char *why, size_t why_len)
{
    (void)x;
    const struct world *W = ctx;
    const kvf_pool_t *pool = W->dw ? kvf_dworker_pool(W->dw) : NULL;
    if (!pool) return 0;
    size_t pb = kvf_pool_page_bytes(pool);
    uint32_t page = (uint32_t)(off / pb);
    struct kvf_page_info in;
    if (kvf_pool_page_info(pool, page, &in) < 0) {
        snprintf(why, why_len, "L6: a write to page %u, outside the pool", page);
        return 1;
    }
    if (in.state != KVF_PAGE_GRANTED && in.state != KVF_PAGE_HELD &&
        in.state != KVF_PAGE_QUARANTINED) {
        snprintf(why, why_len,
                 "L6: a write of %zu bytes%s lands on page %u, which is %s (tag %" PRIu64
                 "): it was freed or committed while the write was in flight",
                 len, sender_dead ? " from a killed writer" : "", page, state_name(in.state),
                 in.tag);
        return 1;
    }
    for (uint32_t i = 0; i < W->n_refused; i++)
        if (W->refused[i].page == page && W->refused[i].tag == in.tag) {
            snprintf(why, why_len,
                     "L9: a write of %zu bytes lands on page %u (tag %" PRIu64 ", %s) of a grant "
                     "whose prompt the prefill engine refused: a refused request gets no write",
                     len, page, in.tag, state_name(in.state));
            return 1;
        }
    size_t toff = kvf_geo_trailer_offset(kvf_pool_geometry(pool));
    if (off % pb == toff && len == sizeof(struct kvf_page_trailer)) {
        struct kvf_page_trailer t;
        memcpy(&t, bytes, sizeof t);
        if (t.tag != in.tag) {
            snprintf(why, why_len,
                     "L6: a trailer written for tag %" PRIu64 " lands on page %u, now %s with tag "
                     "%" PRIu64 ": a write meant for the page's earlier grant",
                     t.tag, page, state_name(in.state), in.tag);
            return 1;
        }
    }
    return 0;
}
static int violate(struct world *W, const char *fmt, ...)
{
    if (W->why[0]) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(W->why, sizeof W->why, fmt, ap);
    va_end(ap);
    return -1;
}

/* The workers' test events, as they happen (kvf__test_event_listen):
 *   forge_refused — the prefill engine refused a granted prompt: its pages join L9's list;
 *   commit — decode committed a request on a DONE of writer (peer, epoch): L11, that epoch is
 *            the writer's current one in decode's pool, never one a fence has ended. */
static uint64_t json_u64(const char *json, const char *key)
{
    const char *p = strstr(json, key);
    return p ? strtoull(p + strlen(key), NULL, 10) : UINT64_MAX;
}

static void on_event(void *ctx, const char *kind, const char *json)
{
    struct world *W = ctx;
    if (!strcmp(kind, "forge_refused")) {
        const char *p = strstr(json, "\"dst\":\"");
        if (!p) return;
        p += 7;
        while (*p && *p != '"' && W->n_refused < sizeof W->refused / sizeof W->refused[0]) {
            char *e;
            unsigned long pg = strtoul(p, &e, 10);
            if (*e != ':') break;
            uint64_t tag = strtoull(e + 1, &e, 10);
            W->refused[W->n_refused++] = (struct kvf_page_ref){(uint32_t)pg, tag};
            p = *e == ',' ? e + 1 : e;
        }
    } else if (!strcmp(kind, "commit") && W->dw) {
        uint64_t peer = json_u64(json, "\"peer\":"), epoch = json_u64(json, "\"epoch\":");
        uint32_t cur = 0;
        if (peer > UINT16_MAX ||
            kvf_pool_peer_epoch(kvf_dworker_pool(W->dw), (uint16_t)peer, &cur) < 0 || cur != epoch)
            violate(W,
                    "L11: decode committed a request on writer %" PRIu64 "'s epoch %" PRIu64
                    ", which a fence ended (the writer's epoch is now %u)",
                    peer, epoch, cur);
    }
}

static struct kvf_worker_config base_config(struct world *W)
{
    struct kvf_worker_config c = {.model = W->m,
                                  .model_fp = 42,
                                  .page_tokens = PT,
                                  .n_threads = 1,
                                  .max_context = CTX,
                                  .max_batch = 4,
                                  .prefill_chunk = 32,
                                  .max_queue = 64,
                                  .max_reqs = 16,
                                  .grant_timeout_ms = GRANT_MS,
                                  .hold_timeout_ms = HOLD_MS,
                                  .admit_timeout_ms = 20000,
                                  .transport = &simnet_transport,
                                  .transport_ctx = W->net,
                                  .manual = true,
                                  .seed = W->seed * 2654435761u + 17};
    return c;
}

static int start_prefill(struct world *W, int i, uint16_t port)
{
    char err[256] = "";
    struct kvf_worker_config c = base_config(W);
    c.n_pages = O.pressured && W->faults ? 16 : 40;
    c.listen_host = "sim";
    c.listen_port = port;
    if (kvf_pworker_start(&c, &W->pw[i], err, sizeof err) < 0)
        return violate(W, "prefill %d would not start: %s", i, err);
    W->port[i] = kvf_pworker_port(W->pw[i]);
    W->pw_due[i] = 0;
    return 0;
}

static int world_start(struct world *W, uint64_t seed, bool faults)
{
    struct simnet_faults f = {.delay_max_ms = 8};
    if (faults) {
        f.late_pct = 2;
        f.late_max_ms = 900;
        f.lost_ack_pct = 3;
        f.put_slow_pct = O.pressured ? 20 : 5;
        f.put_late_pct = O.pressured ? 10 : 0;
        if (O.late_writes) { /* a put now and then lands after its page's hold timed out */
            f.put_late_pct = 10;
            f.put_late_max_ms = 2 * HOLD_MS;
        }
        f.delay_max_ms = 20;
    }
    /* The test build's switches the workers read at start: forgeries for the fault world's
     * prefills only (the reference is an honest run), and decode's audit of each committed
     * prompt's last page (L5). */
    if (faults && O.forge)
        setenv("KVF_TEST_FORGE", O.forge, 1);
    else
        unsetenv("KVF_TEST_FORGE");
    setenv("KVF_TEST_AUDIT_TAIL", "1", 1);
    W->seed = seed;
    W->faults = faults;
    W->net = simnet_new(seed, &f);
    if (!O.content_only) {
        simnet_set_land_check(W->net, land_check, W);
        simnet_set_src_check(W->net, src_id, W);
        kvf__test_event_listen(on_event, W);
    }
    for (int i = 0; i < N_PF; i++)
        if (start_prefill(W, i, 0) < 0) return -1;
    char err[256] = "";
    struct kvf_worker_config c = base_config(W);
    /* Small: a freed page is handed to the next request at once. */
    c.n_pages = !faults ? 64 : O.pressured ? 24 : 36;
    c.prefill_host = "sim";
    c.prefill_port = W->port[0];
    if (kvf_dworker_start(&c, &W->dw, err, sizeof err) < 0)
        return violate(W, "decode would not start: %s", err);
    for (int i = 1; i < N_PF; i++)
        if (kvf_dworker_add_prefill(W->dw, "sim", W->port[i]) < 0)
            return violate(W, "add_prefill failed");
    W->gops = &kvf_dworker_gen_ops;
    W->ge = W->dw;
    if (O.router && faults) {
        uint32_t n_vocab = W->n_vocab;
        struct kvf_decode_service_config sc = {.listen_host = "sim",
                                               .model_fp = 42,
                                               .max_context = CTX,
                                               .page_tokens = PT,
                                               .n_vocab = n_vocab,
                                               .transport = &simnet_transport,
                                               .transport_ctx = W->net,
                                               .manual = true};
        if (kvf_decode_service_start(W->dw, &sc, &W->ds, err, sizeof err) < 0)
            return violate(W, "the decode service would not start: %s", err);
        const char *dh[1] = {"sim"}, *ph[N_PF];
        uint16_t dp[1] = {kvf_decode_service_port(W->ds)}, pp[N_PF];
        for (int i = 0; i < N_PF; i++) {
            ph[i] = "sim";
            pp[i] = W->port[i];
        }
        struct kvf_router_config rc = {.decode_hosts = dh,
                                       .decode_ports = dp,
                                       .n_decodes = 1,
                                       .prefill_hosts = ph,
                                       .prefill_ports = pp,
                                       .n_prefills = N_PF,
                                       .model_fp = 42,
                                       .max_context = CTX,
                                       .page_tokens = PT,
                                       .n_vocab = n_vocab,
                                       .max_queue = 64,
                                       .admit_timeout_ms = 20000,
                                       .transport = &simnet_transport,
                                       .transport_ctx = W->net,
                                       .manual = true};
        if (kvf_router_start(&rc, &W->rt, err, sizeof err) < 0)
            return violate(W, "the router would not start: %s", err);
        W->gops = &kvf_router_gen_ops;
        W->ge = W->rt;
    }
    return 0;
}

static void world_stop(struct world *W)
{
    for (uint32_t i = 0; i < W->n_rq; i++)
        if (W->rq[i].g) {
            W->gops->release(W->ge, W->rq[i].g);
            W->rq[i].g = NULL;
        }
    if (W->rt) kvf_router_stop(W->rt, 0);
    if (W->ds) kvf_decode_service_stop(W->ds);
    W->rt = NULL;
    W->ds = NULL;
    if (W->dw) kvf_dworker_stop(W->dw, 0);
    W->dw = NULL;
    for (int i = 0; i < N_PF; i++)
        if (W->pw[i]) kvf_pworker_stop(W->pw[i]);
    memset(W->pw, 0, sizeof W->pw);
    simnet_free(W->net);
    W->net = NULL;
    kvf__test_event_listen(NULL, NULL);
}

static void submit(struct world *W, struct req *r)
{
    struct kvf_gen_params p = {.tenant = r->tenant,
                               .prompt = r->prompt,
                               .n_prompt = r->n_prompt,
                               .max_tokens = r->max_tokens,
                               .sample = r->sp,
                               .want_logprob = true,
                               .ignore_eos = true};
    r->submitted = true;
    int rc = W->gops->submit(W->ge, &p, &r->g);
    if (rc < 0) {
        r->ended = true;
        r->err = rc;
        r->g = NULL;
    }
}

static void poll_req(struct world *W, struct req *r)
{
    struct kvf_gen_event ev;
    while (r->g && !r->ended && W->gops->next(W->ge, r->g, &ev, 0) == 1) {
        if (ev.kind == KVF_GEN_TOKEN) {
            if (r->n_out >= MAX_OUT) {
                violate(W, "request got more tokens than it asked for");
                return;
            }
            r->toks[r->n_out] = ev.token;
            r->lps[r->n_out] = ev.logprob;
            r->n_out++;
        } else {
            r->ended = true;
            r->err = ev.err;
        }
    }
}

static void apply_fault(struct world *W, struct fault *f)
{
    f->done = true;
    int i = f->pf;
    switch (f->kind) {
    case F_KILL:
        if (!W->pw[i]) return;
        if (W->verbose) printf("  %" PRIu64 " ms: prefill %d killed\n", simnet_now(W->net), i);
        simnet_kill(simnet_listener(W->net, W->port[i]));
        kvf_pworker_stop(W->pw[i]);
        W->pw[i] = NULL;
        W->link_faults = true;
        break;
    case F_RESTART:
        if (W->pw[i]) return;
        if (W->verbose) printf("  %" PRIu64 " ms: prefill %d restarted\n", simnet_now(W->net), i);
        start_prefill(W, i, W->port[i]);
        break;
    case F_RESET: {
        kvf_xport_t *x = W->pw[i] ? simnet_listener(W->net, W->port[i]) : NULL;
        if (!x) return;
        if (W->verbose)
            printf("  %" PRIu64 " ms: prefill %d's links reset\n", simnet_now(W->net), i);
        simnet_reset(x);
        W->link_faults = true;
        break;
    }
    }
}

static bool all_ended(const struct world *W)
{
    for (uint32_t i = 0; i < W->n_rq; i++)
        if (!W->rq[i].ended) return false;
    return true;
}

/* Runs the world until every request ended and the hold timeout passed, or the limit. */
static int world_run(struct world *W)
{
    uint64_t t0 = simnet_now(W->net), end_at = 0;
    for (uint64_t t = t0; t < t0 + LIMIT_MS; t += end_at ? 5 : 1) {
        simnet_set_now(W->net, t);
        uint64_t rel = t - t0;
        for (uint32_t i = 0; i < W->n_fl; i++)
            if (!W->fl[i].done && rel >= W->fl[i].at) apply_fault(W, &W->fl[i]);
        for (uint32_t i = 0; i < W->n_rq; i++) {
            struct req *r = &W->rq[i];
            if (!r->submitted && rel >= r->submit_at) submit(W, r);
            if (r->g && !r->ended && r->cancel_at && rel >= r->cancel_at) {
                W->gops->cancel(W->ge, r->g);
                r->cancel_at = 0;
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < N_PF; i++) {
                if (!W->pw[i]) continue;
                kvf_pworker_turn(W->pw[i]);
                if (kvf_pworker_computing(W->pw[i])) {
                    if (!W->pw_due[i]) {
                        bool stall = W->faults && simnet_rand(W->net, 0, 99) < W->stall_pct;
                        uint64_t cost =
                            W->slow ? simnet_rand(W->net, 80, 200) : simnet_rand(W->net, 1, 15);
                        W->pw_due[i] = t + (stall ? simnet_rand(W->net, 300, 2500) : cost);
                        if (stall) W->link_faults = true;
                    }
                    if (t >= W->pw_due[i]) {
                        if (getenv("KVF_SIMNET_TRACE"))
                            printf("    %" PRIu64 " ms: prefill %d computes a chunk\n", t, i);
                        kvf_pworker_compute(W->pw[i]);
                        W->pw_due[i] = 0;
                    }
                }
            }
            if (W->rt) kvf_router_turn(W->rt);
            if (W->ds) kvf_decode_service_turn(W->ds);
            kvf_dworker_turn(W->dw);
            if (W->ds) kvf_decode_service_turn(W->ds);
            if (W->rt) kvf_router_turn(W->rt);
            if (kvf_dworker_computing(W->dw)) {
                if (!W->dw_due) W->dw_due = t + simnet_rand(W->net, 1, 4);
                if (t >= W->dw_due) {
                    kvf_dworker_compute(W->dw);
                    W->dw_due = 0;
                }
            }
        }
        for (uint32_t i = 0; i < W->n_rq; i++)
            poll_req(W, &W->rq[i]);
        if (!O.content_only) {
            char pwhy[256];
            if (simnet_violation(W->net)) return violate(W, "%s", simnet_violation(W->net));
            if (!kvf_dworker_check(W->dw, pwhy, sizeof pwhy))
                return violate(W, "L7: decode's consistency walk: %s", pwhy);
            for (int i = 0; i < N_PF; i++)
                if (W->pw[i] && !kvf_pworker_check(W->pw[i], pwhy, sizeof pwhy))
                    return violate(W, "L7: prefill %d's consistency walk: %s", i, pwhy);
        }
        if (W->why[0]) return -1;
        bool faults_left = false;
        for (uint32_t i = 0; i < W->n_fl; i++)
            faults_left |= !W->fl[i].done;
        if (!end_at && all_ended(W) && !faults_left) end_at = t + (W->quick ? 0 : DRAIN_MS);
        if (end_at && t >= end_at) return 0;
    }
    for (uint32_t i = 0; i < W->n_rq; i++)
        if (!W->rq[i].ended)
            if (!O.content_only)
                return violate(W,
                               "L2: request %u (%u prompt tokens) never ended (%u tokens so far)",
                               i, W->rq[i].n_prompt, W->rq[i].n_out);
    return 0;
}

static int check_end(struct world *W)
{
    struct kvf_engine_info in;
    kvf_dworker_gen_ops.info(W->dw, &in);
    uint32_t *s = in.decode_by_state;
    if (s[KVF_PAGE_OWNED] || s[KVF_PAGE_GRANTED] || s[KVF_PAGE_HELD] ||
        s[KVF_PAGE_FREE] + s[KVF_PAGE_QUARANTINED] != in.decode_pages)
        return violate(W,
                       "L3: decode pool after the run: %u free, %u owned, %u granted, %u held, %u "
                       "quarantined of %u",
                       s[KVF_PAGE_FREE], s[KVF_PAGE_OWNED], s[KVF_PAGE_GRANTED], s[KVF_PAGE_HELD],
                       s[KVF_PAGE_QUARANTINED], in.decode_pages);
    for (int i = 0; i < N_PF; i++) {
        if (!W->pw[i]) continue;
        uint32_t pages = 0, free_pages = 0;
        kvf_pworker_pool(W->pw[i], &pages, &free_pages);
        if (pages != free_pages)
            return violate(W, "L3: prefill %d's pool after the run: %u of %u free", i, free_pages,
                           pages);
    }
    /* L10: where no message was lost or late and no writer
     * failed or stalled, every grant ends by its writer's proof (DONE, or a cancel's drain
     * acknowledged), never by a fence or a hold timeout: no page is quarantined. */
    struct kvf_pool_stats ps;
    kvf_pool_stats(kvf_dworker_pool(W->dw), &ps);
    if (!W->link_faults && ps.quarantines)
        return violate(W,
                       "L10: %llu decode pages were quarantined in a seed where every message "
                       "arrived in time and no writer failed",
                       (unsigned long long)ps.quarantines);
    if (in.foreign_tails)
        return violate(W,
                       "L5: %llu committed last pages held another request's bytes past the prompt",
                       (unsigned long long)in.foreign_tails);
    return 0;
}

/* The reference of one request: alone, in a world without faults. */
static int reference(const kvf_model_t *m, uint32_t n_vocab, uint64_t seed, struct req *r,
                     char *why, size_t why_len)
{
    struct world W = {.m = m, .n_vocab = n_vocab, .quick = true};
    struct req one = *r;
    one.submit_at = 0;
    one.cancel_at = 0;
    W.rq = &one;
    W.n_rq = 1;
    int rc = world_start(&W, seed ^ 0x5eed, false);
    if (rc == 0) rc = world_run(&W);
    if (rc == 0 && (one.err || one.n_out != one.max_tokens))
        rc = violate(&W, "the reference run failed: %s, %u of %u tokens", kvf_strerror(one.err),
                     one.n_out, one.max_tokens);
    world_stop(&W);
    if (rc < 0) {
        snprintf(why, why_len, "%s", W.why);
        return -1;
    }
    r->rn = one.n_out;
    memcpy(r->rtoks, one.toks, sizeof r->rtoks);
    memcpy(r->rlps, one.lps, sizeof r->rlps);
    return 0;
}

struct totals {
    uint64_t reqs, cancelled, ok, failed, tokens, kills, resets;
};

static int run_seed(const kvf_model_t *m, uint32_t n_vocab, uint64_t seed, bool verbose,
                    struct totals *T, char *why, size_t why_len)
{
    struct world W = {.m = m, .n_vocab = n_vocab, .verbose = verbose, .stall_pct = 4};
    struct req rq[MAX_RQ];
    memset(rq, 0, sizeof rq);
    /* The plan comes from its own generator, so it does not depend on the run. */
    struct simnet *plan =
        simnet_new(seed ^ 0xA5A5A5A5ull, &(struct simnet_faults){.delay_max_ms = 1});
    uint32_t n = (uint32_t)simnet_rand(plan, 3, MAX_RQ);
    for (uint32_t i = 0; i < n; i++) {
        struct req *r = &rq[i];
        r->n_prompt = (uint32_t)(simnet_rand(plan, 0, 3) == 0 ? simnet_rand(plan, 60, MAX_PROMPT)
                                                              : simnet_rand(plan, 1, 40));
        if (simnet_rand(plan, 0, 3) == 0) /* whole pages: a last page filled to its end */
            r->n_prompt = PT * (uint32_t)simnet_rand(plan, 1, MAX_PROMPT / PT);
        for (uint32_t k = 0; k < r->n_prompt; k++)
            r->prompt[k] = (int32_t)simnet_rand(plan, 0, n_vocab - 1);
        r->max_tokens = (uint32_t)simnet_rand(plan, 1, MAX_OUT);
        r->tenant = 1 + i % 2;
        r->sp = (struct kvf_sample_params){.temperature = simnet_rand(plan, 0, 1) ? 0.0f : 0.9f,
                                           .top_p = 1.0f,
                                           .seed = simnet_rand(plan, 1, 1000)};
        r->submit_at = simnet_rand(plan, 0, 800);
        if (simnet_rand(plan, 0, 99) < (O.pressured ? 35 : 15))
            r->cancel_at = r->submit_at + simnet_rand(plan, 0, 300);
    }
    for (uint32_t i = 0; i < n; i++)
        if (reference(m, n_vocab, seed * 131 + i, &rq[i], why, why_len) < 0) {
            simnet_free(plan);
            return -1;
        }
    W.rq = rq;
    W.n_rq = n;
    if (simnet_rand(plan, 0, 99) < 35) { /* a prefill killed, later restarted */
        int pf = (int)simnet_rand(plan, 0, N_PF - 1);
        uint64_t at = simnet_rand(plan, 20, 1200);
        W.fl[W.n_fl++] = (struct fault){at, F_KILL, pf, false};
        W.fl[W.n_fl++] = (struct fault){at + simnet_rand(plan, 100, 900), F_RESTART, pf, false};
        T->kills++;
    }
    if (simnet_rand(plan, 0, 99) < 25) { /* a prefill's links reset */
        W.fl[W.n_fl++] = (struct fault){simnet_rand(plan, 20, 1200), F_RESET,
                                        (int)simnet_rand(plan, 0, N_PF - 1), false};
        T->resets++;
    }
    if (simnet_rand(plan, 0, 99) < 20) {
        W.slow = true;
        W.stall_pct = 0;
    }
    simnet_free(plan);
    int rc = world_start(&W, seed, true);
    if (rc == 0) rc = world_run(&W);
    /* L1 first: a mutant that breaks content and leaks pages is reported on content. */
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        struct req *r = &rq[i];
        for (uint32_t k = 0; k < r->n_out && rc == 0; k++)
            if (k >= r->rn || r->toks[k] != r->rtoks[k] ||
                memcmp(&r->lps[k], &r->rlps[k], sizeof(float)) != 0)
                rc = violate(&W,
                             "L1: request %u (%u prompt tokens) token %u: %d (logprob %.9g), alone "
                             "it is %d (%.9g)",
                             i, r->n_prompt, k, r->toks[k], (double)r->lps[k],
                             k < r->rn ? r->rtoks[k] : -1, k < r->rn ? (double)r->rlps[k] : 0.0);
        bool whole = r->err == 0 && r->n_out == r->max_tokens;
        if (rc == 0 && r->err == 0 && r->n_out != r->max_tokens && !r->cancel_at)
            rc = violate(&W, "L1: request %u ended well with %u of %u tokens", i, r->n_out,
                         r->max_tokens);
        T->reqs++;
        T->tokens += r->n_out;
        if (whole)
            T->ok++;
        else
            T->failed++;
        if (verbose && !whole)
            printf("  request %u: %u prompt tokens, %u of %u tokens, %s\n", i, r->n_prompt,
                   r->n_out, r->max_tokens, r->err ? kvf_strerror(r->err) : "ended early");
    }
    /* A late delivery or a lost ack counts as a link fault (either can outlast the no-progress
     * bound), and a forgery as a writer's failure. */
    struct simnet_stats st0;
    simnet_stats(W.net, &st0);
    if (st0.late || st0.acks_lost || O.forge) W.link_faults = true;
    if (rc == 0 && !O.content_only) rc = check_end(&W);
    /* L2's second half: without link or process faults every request not cancelled ends whole. */
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        struct req *r = &rq[i];
        bool was_cancelled = r->err == KVF_E_PROTO_CANCELLED || r->err == -ECANCELED;
        if (was_cancelled) T->cancelled++;
        if (!W.link_faults && !O.content_only && !was_cancelled &&
            (r->err || r->n_out != r->max_tokens))
            rc = violate(
                &W, "L2: request %u failed (%s) in a seed without link, process or compute faults",
                i, kvf_strerror(r->err));
    }
    if (verbose) {
        struct simnet_stats st;
        simnet_stats(W.net, &st);
        printf("seed %" PRIu64 ": %u requests, %" PRIu64 " frames, %" PRIu64 " puts, %" PRIu64
               " flushes, %" PRIu64 " acks lost, %" PRIu64 " late, %" PRIu64 " resets, %" PRIu64
               " writes applied after a kill\n",
               seed, n, st.frames, st.puts, st.flushes, st.acks_lost, st.late, st.resets,
               st.applied_after_kill);
    }
    if (rc < 0) snprintf(why, why_len, "%s", W.why);
    world_stop(&W);
    return rc;
}

int main(int argc, char **argv)
{
    uint64_t seeds = 40, first = 1;
    bool verbose = false;
    if (getenv("KVF_SIM_LOOPS_SEEDS")) seeds = strtoull(getenv("KVF_SIM_LOOPS_SEEDS"), NULL, 10);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seeds") && i + 1 < argc)
            seeds = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--first") && i + 1 < argc)
            first = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--verbose"))
            verbose = true;
        else if (!strcmp(argv[i], "--unverified"))
            setenv("KVF_TEST_UNVERIFIED", "1", 1);
        else if (!strcmp(argv[i], "--pressured"))
            O.pressured = true;
        else if (!strcmp(argv[i], "--content-only"))
            O.content_only = true;
        else if (!strcmp(argv[i], "--router"))
            O.router = true;
        else if (!strcmp(argv[i], "--late-writes"))
            O.late_writes = true;
        else if (!strcmp(argv[i], "--forge") && i + 1 < argc)
            O.forge = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--seeds N] [--first S] [--unverified] [--pressured] [--forge SPEC] "
                    "[--content-only] [--router] [--late-writes] [--verbose]\n",
                    argv[0]);
            return 2;
        }
    }
    /* Unverified, decode checks no count and no bytes: a short handoff or a stale write would be
     * committed by design, not by a bug. Such a run makes neither. */
    if (getenv("KVF_TEST_UNVERIFIED") && O.forge &&
        (strstr(O.forge, "short=") || (strstr(O.forge, "every=") && !strstr(O.forge, "every=0")))) {
        fprintf(stderr, "--unverified: --forge may not make short handoffs or stale writes "
                        "(short=, every=N): the unverified run does not check them\n");
        return 2;
    }
    char dir[] = "/tmp/kvf_simloops_XXXXXX", path[64], err[256] = "";
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    kvf_gguf_t *g = NULL;
    kvf_model_t *m = NULL;
    if (kvf_mkmodel_write(path, kvf_mkmodel_shape_by_name("tiny"), KVF_GGML_F32, 7, err,
                          sizeof err) < 0 ||
        kvf_gguf_open(path, &g, err, sizeof err) < 0 ||
        kvf_model_load(g, &m, err, sizeof err) < 0) {
        fprintf(stderr, "model: %s\n", err);
        return 1;
    }
    unlink(path);
    rmdir(dir);
    uint32_t n_vocab = kvf_model_hparams(m)->n_vocab;
    struct totals T = {0};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int bad = 0;
    for (uint64_t s = first; s < first + seeds; s++) {
        char why[600] = "";
        if (run_seed(m, n_vocab, s, verbose, &T, why, sizeof why) < 0) {
            printf("VIOLATION at seed %" PRIu64 ": %s\n(replay: %s --first %" PRIu64
                   " --seeds 1 --verbose)\n",
                   s, why, argv[0], s);
            bad = 1;
            break;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    uint64_t not_cancelled = T.reqs - T.cancelled;
    printf("sim_loops: %" PRIu64 " seeds in %.1f s (%.2f seeds/s) on the production loops: %" PRIu64
           " requests, %" PRIu64 " whole, %" PRIu64 " cancelled, %" PRIu64 " failed, %" PRIu64
           " tokens checked; %" PRIu64 " kills, %" PRIu64 " resets\n",
           seeds, secs, (double)seeds / secs, T.reqs, T.ok, T.cancelled, T.failed - T.cancelled,
           T.tokens, T.kills, T.resets);
    /* Pressured, one put in ten arrives late past the no-progress bound and fails its prefill's
     * requests, and forged, the refusals and short handoffs fail theirs on purpose: the floor is
     * a quarter there. */
    uint64_t floor_div = O.pressured || O.forge ? 4 : 2;
    if (!bad && !O.content_only && not_cancelled && T.ok * floor_div < not_cancelled) {
        printf("VIOLATION L4: %" PRIu64 " of %" PRIu64
               " requests not cancelled completed whole (floor: 1/%" PRIu64 ")\n",
               T.ok, not_cancelled, floor_div);
        bad = 1;
    }
    kvf_model_free(m);
    kvf_gguf_close(g);
    return bad;
}
