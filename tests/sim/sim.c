/*
 * sim.c — one simulated world per seed (see sim.h), and the invariants checked after every step:
 *
 *   I1  a request reads only slots written for it: at commit and at finish every slot of its
 *       prompt passes the pool's read check and carries its own (request, tag, slot) stamp.
 *   I2  no page is free or reassigned while an unfenced writer has a write in flight to it: every
 *       in-flight write's page is still granted to that writer with that tag (checked at post,
 *       after every step, and when the write lands).
 *   I3  every request ends for its client (first token or a clear error) within a bound of its
 *       submission or of its writer's last progress.
 *   I4  quiescence: every page free, nothing reserved or granted, no live request on either side,
 *       every source page back; and the pool's and both machines' checkers hold after every step.
 *   I5  a put reads its source page only while the request still holds it (H5).
 *   I6  a request the prefill engine refused before posting anything gets no write at all (H6).
 *   I7  a commit never rests on a writer epoch that has been fenced.
 *   I8  a request whose messages all arrived and whose writer never failed ends its grants by
 *       proof: its pages are never quarantined (a drain proof was not lost, H2).
 *   I9  a request whose messages all arrived and whose writer never failed never fails for want
 *       of progress, however long its prompt takes (a slow but live writer is never failed).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sim_internal.h"

const struct sim_config sim_standard = {
    .name = "standard",
    .n_pages = 24,
    .max_prompt = MAX_PROMPT,
    .submit_window_ms = 1500,
    .finish_max_ms = 100,
    .p_late_msg = 0.03,
};
const struct sim_config sim_pressured = {
    .name = "pressured",
    .n_pages = 12,
    .max_prompt = 12,
    .submit_window_ms = 8000,
    .finish_max_ms = 8000,
    .p_late_msg = 0.1,
    .p_late_put = 0.15,
    .late_put_max_ms = 1500,
};

static const char *const ev_names[] = {
    "tick",        "heartbeat",     "submit",        "client-cancel",  "finish",
    "msg->decode", "msg->prefill",  "page-ready",    "put-local-done", "put-lands",
    "flush-done",  "prefill-clear", "crash",         "restart",        "hang",
    "partition",   "fence",         "prefill-reset", "connect",        "progress",
};

void start_fault(struct world *W, int p)
{
    struct speer *P = &W->peer[p];
    P->fault_since = W->now;
    fault_peer_requests(W, p);
}

void connect_peer(struct world *W, int p)
{
    struct speer *P = &W->peer[p];
    uint32_t epoch = 0;
    kvf_pool_peer_epoch(W->pool, (uint16_t)p, &epoch);
    if (P->decode_up) {
        /* A HELLO from a peer decode still believes connected: the old process is gone, and its
         * endpoint is fenced before the new one is accepted. */
        trace(W, "peer %d says HELLO again: its old connection goes down first", p);
        P->decode_up = false;
        kvf_decode_peer_down(W->dec, W->now, (uint16_t)p, &W->acts);
        decode_actions(W);
    }
    if (P->epoch && epoch <= P->epoch) {
        /* The old connection has not been fenced yet: the decode engine fences it first. */
        struct ev *e = ev_new(W, 100, EV_CONNECT);
        e->peer = p;
        ev_push(W);
        return;
    }
    struct kvf_msg_hello mine = {.model_fp = 0x5eed,
                                 .geo = *kvf_pool_geometry(W->pool),
                                 .max_context = MAX_CONTEXT,
                                 .max_grant_pages = MAX_GRANT,
                                 .peer = (uint16_t)p,
                                 .role = KVF_ROLE_PREFILL};
    struct kvf_msg_hello theirs = mine;
    theirs.role = KVF_ROLE_DECODE;
    if (kvf_proto_hello_check(&theirs, &mine) != 0)
        violate(W, "HELLO of identical workers refused");
    trace(W, "peer %d connects at epoch %u", p, epoch);
    P->epoch = epoch;
    P->connected = true;
    P->decode_up = true;
    P->faulty = false;
    if (kvf_decode_peer_up(W->dec, (uint16_t)p, epoch) < 0)
        violate(W, "kvf_decode_peer_up refused");
    kvf_prefill_connect(P->sm, epoch, &W->acts);
    prefill_actions(W, p);
}

bool peer_busy(struct world *W, const struct ev *e, int p)
{
    /* A hung or partitioned-and-unreachable peer handles nothing: the event waits. */
    struct speer *P = &W->peer[p];
    if (W->now < P->hung_until) {
        defer(W, e, P->hung_until);
        return true;
    }
    return false;
}

void step(struct world *W, struct ev *e)
{
    W->steps++;
    if (W->trace && e->kind != EV_TICK && e->kind != EV_HB)
        trace(W, "%s peer %d req %d", ev_names[e->kind], e->peer, e->ridx);
    struct kvf_msg m;
    static struct kvf_page_ref s_pages[MAX_GRANT];
    static uint64_t s_sums[MAX_GRANT];
    static uint32_t s_tok[MAX_CONTEXT];
    struct kvf_msg_scratch sc = {s_pages, MAX_GRANT, s_sums, MAX_GRANT, s_tok, MAX_CONTEXT};
    struct speer *P = e->peer >= 0 ? &W->peer[e->peer] : NULL;
    switch (e->kind) {
    case EV_TICK:
        kvf_decode_tick(W->dec, W->now, &W->acts);
        decode_actions(W);
        break;
    case EV_HB:
        for (int p = 0; p < N_PEERS; p++) {
            struct speer *Q = &W->peer[p];
            bool silent =
                !Q->alive || W->now < Q->part_until || (W->now < Q->hung_until && !Q->hang_hb);
            if (Q->decode_up && silent && W->now - Q->fault_since >= HB_MS) {
                trace(W, "heartbeat lost: peer %d down", p);
                Q->decode_up = false;
                kvf_decode_peer_down(W->dec, W->now, (uint16_t)p, &W->acts);
                decode_actions(W);
            }
        }
        break;
    case EV_SUBMIT:
        on_submit(W, e->ridx);
        break;
    case EV_CANCEL: {
        struct sreq *r = &W->req[e->ridx];
        if (!r->submitted) {
            r->dropped_by_client = true;
            break;
        }
        kvf_decode_cancel(W->dec, W->now, r->id, KVF_E_PROTO_CANCELLED, &W->acts);
        decode_actions(W);
        break;
    }
    case EV_FINISH: {
        struct sreq *r = &W->req[e->ridx];
        if (kvf_decode_req_state(W->dec, r->id) != KVF_DREQ_RUNNING) break;
        read_all(W, e->ridx, "finish");
        kvf_decode_finish(W->dec, W->now, r->id, &W->acts);
        r->finished = true;
        decode_actions(W);
        break;
    }
    case EV_TO_DECODE:
        if (W->now < P->part_until) {
            trace(W, "  (lost in partition)");
            if (decode_msg(W, e, &m, &sc) && find_req(W, m.req) >= 0)
                W->req[find_req(W, m.req)].faulted = true;
            break;
        }
        if (!decode_msg(W, e, &m, &sc)) break;
        trace(W, "  decode receives %s from peer %d epoch %u", kvf_msg_type_name(m.type), e->peer,
              m.epoch);
        if (kvf_decode_on_msg(W->dec, W->now, (uint16_t)e->peer, &m, &W->acts) == 0 &&
            m.type == KVF_MSG_PROGRESS && find_req(W, m.req) >= 0)
            W->req[find_req(W, m.req)].progress_t = W->now;
        decode_actions(W);
        break;
    case EV_TO_PREFILL:
        if (!decode_msg(W, e, &m, &sc)) break;
        if (!P->alive || !P->connected || W->now < P->part_until) {
            trace(W, "  (lost: peer %d unreachable)", e->peer);
            if (find_req(W, m.req) >= 0) W->req[find_req(W, m.req)].faulted = true;
            break;
        }
        if (peer_busy(W, e, e->peer)) break;
        trace(W, "  prefill %d receives %s epoch %u", e->peer, kvf_msg_type_name(m.type), m.epoch);
        kvf_prefill_on_msg(P->sm, W->now, &m, &W->acts);
        prefill_actions(W, e->peer);
        break;
    case EV_PAGE_READY:
        if (e->gen != P->gen) break;
        if (peer_busy(W, e, e->peer)) break;
        on_page_ready(W, e);
        break;
    case EV_PROGRESS:
        if (e->gen != P->gen) break;
        if (peer_busy(W, e, e->peer)) break;
        on_progress(W, e);
        break;
    case EV_LOCAL: {
        struct swrite *w = &W->w[e->w];
        if (w->gen == W->peer[w->peer].gen && peer_busy(W, e, w->peer)) break;
        on_local(W, e);
        break;
    }
    case EV_LAND: {
        struct swrite *w = &W->w[e->w];
        if (!w->dropped && w->gen == W->peer[w->peer].gen && W->now < W->peer[w->peer].hung_until) {
            /* The writer's queued puts resume only when it does. */
            w->land_t = W->peer[w->peer].hung_until + rnd(W, 1, 50);
            defer(W, e, w->land_t - 10);
            break;
        }
        if (!w->captured && !w->dropped) {
            struct ev *n = ev_new(W, 5, EV_LAND);
            n->w = e->w;
            ev_push(W);
            w->land_t = W->now + 5;
            break;
        }
        on_land(W, e);
        break;
    }
    case EV_FLUSH:
        if (e->gen != P->gen) break;
        if (peer_busy(W, e, e->peer)) break;
        on_flush(W, e);
        break;
    case EV_CLEAR:
        if (e->gen != P->gen) break;
        if (peer_busy(W, e, e->peer)) break;
        kvf_prefill_clear(P->sm, W->now, W->req[e->ridx].id, e->nonce, &W->acts);
        prefill_actions(W, e->peer);
        break;
    case EV_CRASH:
        if (!P->alive) break;
        trace(W, "peer %d crashes", e->peer);
        P->alive = false;
        P->connected = false;
        P->gen++;
        P->faulty = true;
        P->hung_until = 0;
        start_fault(W, e->peer);
        break;
    case EV_RESTART: {
        if (P->alive) break;
        kvf_prefill_destroy(P->sm);
        struct kvf_prefill_config pc = {.decode_peer = 0,
                                        .max_reqs = 16,
                                        .max_grant_pages = MAX_GRANT,
                                        .max_context = MAX_CONTEXT,
                                        .page_tokens = PT};
        if (kvf_prefill_create(&pc, &P->sm) < 0) abort();
        memset(P->src, 0, sizeof(P->src));
        P->alive = true;
        P->gen++;
        trace(W, "peer %d restarts", e->peer);
        struct ev *n = ev_new(W, rnd(W, 1, 20), EV_CONNECT);
        n->peer = e->peer;
        ev_push(W);
        break;
    }
    case EV_HANG:
        if (!P->alive) break;
        P->hung_until = W->now + e->epoch; /* duration travels in .epoch */
        P->hang_hb = e->index != 0;
        trace(W, "peer %d hangs for %u ms (%s heartbeats)", e->peer, e->epoch,
              P->hang_hb ? "with" : "without");
        start_fault(W, e->peer);
        break;
    case EV_PARTITION:
        P->part_until = W->now + e->epoch;
        trace(W, "peer %d partitioned for %u ms", e->peer, e->epoch);
        start_fault(W, e->peer);
        break;
    case EV_FENCE: {
        uint32_t cur = 0;
        kvf_pool_peer_epoch(W->pool, (uint16_t)e->peer, &cur);
        if (cur != e->epoch) break; /* fenced already */
        trace(W, "fence peer %d epoch %u: its writes in flight are dropped", e->peer, e->epoch);
        for (int i = 0; i < MAX_WRITES; i++)
            if (in_flight(&W->w[i]) && W->w[i].peer == e->peer && W->w[i].epoch == e->epoch)
                W->w[i].dropped = true;
        fault_peer_requests(W, e->peer);
        P->decode_up = false;
        int rc = kvf_decode_peer_fenced(
            W->dec, W->now, (struct kvf_peer_epoch){(uint16_t)e->peer, e->epoch}, &W->acts);
        if (rc < 0) violate(W, "kvf_decode_peer_fenced: %s", kvf_strerror(rc));
        decode_actions(W);
        if (P->alive) {
            struct ev *n = ev_new(W, rnd(W, 1, 20), EV_RESET);
            n->peer = e->peer;
            n->gen = P->gen;
            ev_push(W);
        }
        break;
    }
    case EV_RESET:
        if (e->gen != P->gen || !P->alive) break;
        if (peer_busy(W, e, e->peer)) break;
        trace(W, "prefill %d learns its connection was closed", e->peer);
        P->connected = false;
        kvf_prefill_peer_down(P->sm, &W->acts);
        prefill_actions(W, e->peer);
        {
            struct ev *n = ev_new(W, rnd(W, 10, 200), EV_CONNECT);
            n->peer = e->peer;
            ev_push(W);
        }
        break;
    case EV_CONNECT:
        if (!P->alive || P->connected) break;
        if (peer_busy(W, e, e->peer)) break;
        connect_peer(W, e->peer);
        break;
    }
}

/* I2 over every write in flight, I8 over every page newly quarantined, and the checkers. */

void setup(struct world *W, uint64_t seed)
{
    kvf_rng_seed(&W->rng, seed);
    struct kvf_pool_config pc = {.geo = {1, 1, 2, PT, 4},
                                 .n_pages = W->cfg->n_pages,
                                 .max_peers = N_PEERS,
                                 .hold_timeout_ms = HOLD_TIMEOUT_MS,
                                 .tag_seed = seed << 16};
#if defined(KVF_TEST_BUILD)
    pc.poison_on_free = true; /* freed pages name their previous owner: a stale read shows */
#endif
    if (kvf_pool_create(&pc, &W->pool) < 0) abort();
    W->data_bytes = kvf_geo_data_bytes(&pc.geo);
    W->trailer_off = kvf_geo_trailer_offset(&pc.geo);
    struct kvf_decode_config dc = {.pool = W->pool,
                                   .max_reqs = MAX_REQS,
                                   .max_context = MAX_CONTEXT,
                                   .max_grant_pages = MAX_GRANT,
                                   .max_peers = N_PEERS,
                                   .grant_timeout_ms = GRANT_TIMEOUT_MS,
                                   .hold_timeout_ms = HOLD_TIMEOUT_MS,
                                   .nonce_seed = seed * 1000,
                                   .test_unverified = W->cfg->unverified};
    if (kvf_decode_create(&dc, &W->dec) < 0) abort();
    W->acts = (struct kvf_actions){W->abuf, 0, KVF_ARRAY_LEN(W->abuf)};

    /* The weather of this seed: a clean network half the time. */
    bool lossy = chance(W, 0.5);
    W->p_drop = lossy ? 0.01 * rnd(W, 1, 8) : 0;
    W->p_dup = lossy ? 0.05 : 0.01;
    W->p_late = lossy ? W->cfg->p_late_msg : 0;

    for (int p = 0; p < N_PEERS; p++) {
        struct speer *P = &W->peer[p];
        struct kvf_prefill_config c = {.decode_peer = 0,
                                       .max_reqs = 16,
                                       .max_grant_pages = MAX_GRANT,
                                       .max_context = MAX_CONTEXT,
                                       .page_tokens = PT};
        if (kvf_prefill_create(&c, &P->sm) < 0) abort();
        P->alive = true;
        P->n_src = rnd(W, 2, N_SRC);
        connect_peer(W, p);
        /* At most one fault per peer, somewhere in the first seconds. */
        uint32_t f = rnd(W, 0, 5);
        struct ev *e = NULL;
        if (f == 1) {
            e = ev_new(W, rnd(W, 0, 2500), EV_CRASH);
            e->peer = p;
            ev_push(W);
            e = ev_new(W, rnd(W, 2600, 6000), EV_RESTART);
        } else if (f == 2 || f == 3) {
            e = ev_new(W, rnd(W, 0, 2500), EV_HANG);
            e->epoch = rnd(W, 50, 2 * HOLD_TIMEOUT_MS + 2000);
            e->index = f == 3;
        } else if (f == 4) {
            e = ev_new(W, rnd(W, 0, 2500), EV_PARTITION);
            e->epoch = rnd(W, 20, 2500);
        }
        if (e) {
            e->peer = p;
            ev_push(W);
        }
    }
    W->n_req = (int)rnd(W, 1, MAX_REQS);
    for (int i = 0; i < W->n_req; i++) {
        struct sreq *r = &W->req[i];
        memset(r, 0, sizeof(*r));
        r->id = (kvf_req_id_t){seed * 64 + (uint64_t)i + 1, 0xabc0000000000000ull | seed};
        r->tenant = rnd(W, 1, 3);
        r->prompt = rnd(W, 1, W->cfg->max_prompt);
        r->max_tokens = rnd(W, 0, 8);
        r->writer = -1;
        r->fail_at = chance(W, 0.05) ? (int)rnd(W, 1, 4) : -1;
        r->refuse = chance(W, 0.05);
        /* A short count and a corrupt byte are what the unverified run does not check: neither is
         * made there (each drawn either way: the same schedule). */
        r->forge = chance(W, 0.04) && !W->cfg->unverified;
        r->corrupt = chance(W, 0.04) && !W->cfg->unverified;
        r->early_clear = chance(W, 0.05);
        if (r->forge || r->corrupt) r->faulted = true;
        if (chance(W, 0.03)) r->prompt = MAX_CONTEXT + 1; /* over the limit: refused at once */
        r->slow = chance(W, 0.15) && r->prompt > PT;
        struct ev *e = ev_new(W, rnd(W, 0, W->cfg->submit_window_ms), EV_SUBMIT);
        e->ridx = i;
        uint64_t at = e->t;
        ev_push(W);
        if (chance(W, 0.3)) {
            e = ev_new(W, at - W->now + rnd(W, 0, 600), EV_CANCEL);
            e->ridx = i;
            ev_push(W);
        }
    }
    ev_new(W, TICK_MS, EV_TICK);
    ev_push(W);
    ev_new(W, HB_MS, EV_HB);
    ev_push(W);
}

void teardown(struct world *W)
{
    for (int p = 0; p < N_PEERS; p++)
        kvf_prefill_destroy(W->peer[p].sm);
    kvf_decode_destroy(W->dec);
    kvf_pool_destroy(W->pool);
    free(W->heap);
}

void sim_run(const struct sim_config *cfg, uint64_t seed, FILE *tr, struct sim_result *out)
{
    static struct world W;
    memset(&W, 0, sizeof(W));
    memset(out, 0, sizeof(*out));
    W.cfg = cfg;
    W.res = out;
    W.trace = tr;
    setup(&W, seed);
    check_all(&W);
    struct ev e;
    while (!W.failed && W.n_ev) {
        ev_pop(&W, &e);
        W.now = e.t;
        if (W.steps > 2000000) {
            if (!all_checks(&W)) break;
            violate(&W, "runaway: %" PRIu64 " steps without quiescence", W.steps);
            break;
        }
        if (W.now > END_MS) {
            if (!all_checks(&W)) break;
            violate(&W, "I4: no quiescence after %d ms of virtual time", END_MS);
            break;
        }
        step(&W, &e);
        if (e.kind == EV_TICK || e.kind == EV_HB) {
            ev_new(&W, e.kind == EV_TICK ? TICK_MS : HB_MS, e.kind);
            ev_push(&W);
        }
        check_all(&W);
        if (!W.failed && quiescent(&W)) {
            trace(&W, "quiescent");
            final_checks(&W);
            break;
        }
    }
    out->ok = !W.failed;
    snprintf(out->why, sizeof(out->why), "%s", W.why);
    out->steps = W.steps;
    out->end_ms = W.now;
    for (int i = 0; i < W.n_req; i++) {
        if (W.req[i].outcome && W.req[i].ok)
            out->committed++;
        else if (W.req[i].outcome)
            out->failed++;
        if (W.req[i].outcome && W.req[i].ok &&
            W.req[i].outcome_t > W.req[i].submit_t + GRANT_TIMEOUT_MS)
            out->outlived++; /* alive past the no-progress bound by PROGRESS alone */
    }
    teardown(&W);
}
