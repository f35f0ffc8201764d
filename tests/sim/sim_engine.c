/* sim_engine.c — the simulated network and the engines that execute the protocol machines'
 * actions: decode's client side, and prefill's compute, source pages and one-sided puts. */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sim_internal.h"

void net_send(struct world *W, int peer, bool to_decode, const struct kvf_msg *m)
{
    uint8_t buf[MSG_MAX];
    long n = kvf_msg_encode(m, buf, sizeof(buf));
    if (n < 0) {
        violate(W, "encode of %s failed: %s", kvf_msg_type_name(m->type), kvf_strerror((int)n));
        return;
    }
    int ri = find_req(W, m->req);
    trace(W, "  send %s %s peer %d req %d nonce %" PRIu64 " epoch %u", kvf_msg_type_name(m->type),
          to_decode ? "->decode from" : "->prefill", peer, ri, m->nonce, m->epoch);
    int copies = chance(W, W->p_dup) ? 2 : 1;
    for (int c = 0; c < copies; c++) {
        if (chance(W, W->p_drop)) {
            trace(W, "  (dropped)");
            if (ri >= 0) W->req[ri].faulted = true;
            continue;
        }
        uint64_t delay = rnd(W, 1, 40);
        if (chance(W, W->p_late)) {
            delay = rnd(W, 100, 1500);
            if (ri >= 0) W->req[ri].faulted = true;
        }
        struct ev *e = ev_new(W, delay, to_decode ? EV_TO_DECODE : EV_TO_PREFILL);
        e->peer = peer;
        e->len = (uint32_t)n;
        memcpy(e->bytes, buf, (size_t)n);
        ev_push(W);
    }
}

bool decode_msg(struct world *W, const struct ev *e, struct kvf_msg *m, struct kvf_msg_scratch *s)
{
    long n = kvf_msg_decode(e->bytes, e->len, m, s);
    if (n != (long)e->len) {
        violate(W, "a frame the simulator encoded did not decode: %ld", n);
        return false;
    }
    return true;
}

/* --- Actions of the decode machine. ------------------------------------------------------- */

void decode_actions(struct world *W)
{
    for (uint32_t i = 0; i < W->acts.n && !W->failed; i++) {
        const struct kvf_action *a = &W->acts.v[i];
        int ri = find_req(W, a->req);
        struct sreq *r = ri >= 0 ? &W->req[ri] : NULL;
        switch (a->kind) {
        case KVF_ACT_SEND:
            if (a->msg.type == KVF_MSG_GRANT && r) {
                r->nonce = a->msg.nonce;
                r->epoch = a->msg.epoch;
                r->n_pages = a->msg.u.grant.n_pages;
                memcpy(r->pages, a->msg.u.grant.pages, r->n_pages * sizeof(r->pages[0]));
            }
            net_send(W, a->peer, false, &a->msg);
            break;
        case KVF_ACT_FENCE_PEER: {
            trace(W, "  decode asks to fence peer %u epoch %u", a->peer, a->epoch);
            struct ev *e = ev_new(W, rnd(W, 1, 30), EV_FENCE);
            e->peer = a->peer;
            e->epoch = a->epoch;
            ev_push(W);
            break;
        }
        case KVF_ACT_DELIVER_FIRST: {
            if (!r) break;
            trace(W, "  req %d committed: first token %u", ri, a->first_token);
            uint32_t cur = 0;
            kvf_pool_peer_epoch(W->pool, (uint16_t)r->writer, &cur);
            if (all_checks(W) && cur != r->epoch)
                violate(W, "I7: request %d committed on writer epoch %u, which was fenced (now %u)",
                        ri, r->epoch, cur);
            if (all_checks(W) && r->refused)
                violate(W, "I6: request %d committed although prefill refused it", ri);
            if (!r->outcome) {
                r->outcome = true;
                r->ok = true;
                r->outcome_t = W->now;
            }
            r->running = true;
            read_all(W, ri, "commit");
            struct ev *e = ev_new(W, rnd(W, 1, W->cfg->finish_max_ms), EV_FINISH);
            e->ridx = ri;
            ev_push(W);
            break;
        }
        case KVF_ACT_FAIL_REQ:
            if (!r) break;
            trace(W, "  req %d fails: %s", ri, kvf_strerror(a->err));
            if (all_checks(W) && !r->faulted && a->err == KVF_E_PROTO_TIMEOUT)
                violate(W,
                        "I9: request %d failed for want of progress although its writer was live "
                        "and every message of it arrived",
                        ri);
            if (!r->outcome) {
                r->outcome = true;
                r->err = a->err;
                r->outcome_t = W->now;
            }
            if (r->running) r->finished = true;
            break;
        default:
            violate(W, "decode emitted action kind %d", (int)a->kind);
        }
    }
    W->acts.n = 0;
}

/* --- The prefill engine: sources, compute, puts, flushes. -------------------------------- */

void prefill_actions(struct world *W, int p);

struct src *find_src(struct speer *P, int ri, uint64_t nonce, uint32_t index)
{
    for (uint32_t i = 0; i < P->n_src; i++)
        if (P->src[i].used && P->src[i].ridx == ri && P->src[i].nonce == nonce &&
            P->src[i].index == index)
            return &P->src[i];
    return NULL;
}

void free_src(struct src *s)
{
    s->used = false;
    memset(s->data, 0xEE, sizeof(s->data)); /* a freed source is reused: its bytes change */
}

void schedule_page(struct world *W, int p, int ri, uint32_t index)
{
    struct ev *e = ev_new(W, W->req[ri].slow ? rnd(W, 400, 1400) : rnd(W, 1, 30), EV_PAGE_READY);
    e->peer = p;
    e->gen = W->peer[p].gen;
    e->ridx = ri;
    e->nonce = W->req[ri].nonce;
    e->index = index;
    ev_push(W);
}

void post_write(struct world *W, int p, const struct kvf_action *a, int ri)
{
    struct speer *P = &W->peer[p];
    struct sreq *r = &W->req[ri];
    if (all_checks(W) && r->refused)
        violate(W, "I6: a write was posted for request %d after the prefill engine refused it", ri);
    int wi = -1;
    for (int i = 0; i < MAX_WRITES; i++)
        if (!W->w[i].live) {
            wi = i;
            break;
        }
    if (wi < 0) {
        violate(W, "simulator out of write records");
        return;
    }
    struct swrite *w = &W->w[wi];
    memset(w, 0, sizeof(*w));
    w->live = true;
    w->peer = p;
    w->ridx = ri;
    w->epoch = a->epoch;
    w->gen = P->gen;
    w->index = a->index;
    w->nonce = a->nonce;
    w->dst = a->dst;
    w->slots = a->slots;
    w->trailer_slots = a->slots;
    w->tenant = a->tenant; /* the writer's word, from the GRANT it acts on */
    w->checksum = a->checksum;
    if (r->forge && a->index == r->n_pages - 1) w->trailer_slots = a->slots - 1;
    struct src *s = find_src(P, ri, a->nonce, a->index);
    w->src = s ? (int)(s - P->src) : -1;
    trace(W, "  post put: req %d page %u (tag %" PRIu64 ") index %u epoch %u", ri, a->dst.page,
          a->dst.tag, a->index, a->epoch);
    uint32_t cur = 0;
    kvf_pool_peer_epoch(W->pool, (uint16_t)p, &cur);
    if (cur != a->epoch) {
        /* The writer's endpoint was closed by a fence: the transport refuses the put. */
        trace(W, "  (refused: epoch %u is fenced)", a->epoch);
        w->dropped = true;
    } else {
        check_write_target(W, w, "posted to");
    }
    uint64_t local = rnd(W, 1, 15);
    w->land_t = W->now + local + rnd(W, 0, 100);
    if (chance(W, 0.02)) {
        /* A put that stays in progress far beyond the hold timeout (H14). */
        w->land_t = W->now + local + rnd(W, HOLD_TIMEOUT_MS, 2 * HOLD_TIMEOUT_MS);
        r->faulted = true;
    } else if (W->cfg->p_late_put > 0 && chance(W, W->cfg->p_late_put)) {
        /* A put that lands late, while its page may be freed and reused if it was freed early. */
        w->land_t = W->now + local + rnd(W, 100, W->cfg->late_put_max_ms);
        r->faulted = true;
    }
    struct ev *e = ev_new(W, local, EV_LOCAL);
    e->w = wi;
    ev_push(W);
    e = ev_new(W, w->land_t - W->now, EV_LAND);
    e->w = wi;
    ev_push(W);
}

void prefill_actions(struct world *W, int p)
{
    struct speer *P = &W->peer[p];
    for (uint32_t i = 0; i < W->acts.n && !W->failed; i++) {
        const struct kvf_action *a = &W->acts.v[i];
        int ri = find_req(W, a->req);
        struct sreq *r = ri >= 0 ? &W->req[ri] : NULL;
        switch (a->kind) {
        case KVF_ACT_SEND: {
            struct kvf_msg m = a->msg;
            if (m.type == KVF_MSG_DONE && r && r->forge) m.u.done.tokens_written--;
            net_send(W, p, true, &m);
            if (m.type == KVF_MSG_DONE && r) {
                struct ev *e = ev_new(W, rnd(W, 1, 300), EV_CLEAR);
                e->peer = p;
                e->gen = P->gen;
                e->ridx = ri;
                e->nonce = m.nonce;
                ev_push(W);
            }
            break;
        }
        case KVF_ACT_COMPUTE:
            if (!r) break;
            r->job_aborted = false;
            r->pages_done = 0;
            schedule_page(W, p, ri, 0);
            schedule_progress(W, p, ri);
            break;
        case KVF_ACT_ABORT_COMPUTE:
            if (r) r->job_aborted = true;
            break;
        case KVF_ACT_POST_WRITE:
            if (r) post_write(W, p, a, ri);
            break;
        case KVF_ACT_FLUSH: {
            struct ev *e = ev_new(W, rnd(W, 1, 10), EV_FLUSH);
            e->peer = p;
            e->gen = P->gen;
            e->ridx = ri;
            e->nonce = a->nonce;
            ev_push(W);
            break;
        }
        case KVF_ACT_RELEASE_SRC: {
            struct src *s = find_src(P, ri, a->nonce, a->index);
            if (!s) {
                violate(W, "prefill released source %u of request %d, which it does not hold",
                        a->index, ri);
                break;
            }
            free_src(s);
            break;
        }
        default:
            violate(W, "prefill emitted action kind %d", (int)a->kind);
        }
    }
    W->acts.n = 0;
}

/* --- Event handlers. ---------------------------------------------------------------------- */

void on_submit(struct world *W, int ri)
{
    struct sreq *r = &W->req[ri];
    if (r->dropped_by_client) return;
    int up[N_PEERS], n_up = 0;
    for (int p = 0; p < N_PEERS; p++)
        if (W->peer[p].decode_up) up[n_up++] = p;
    if (n_up == 0) {
        struct ev *e = ev_new(W, 50, EV_SUBMIT);
        e->ridx = ri;
        ev_push(W);
        return;
    }
    int p = up[rnd(W, 0, (uint32_t)n_up - 1)];
    r->writer = p;
    r->submitted = true;
    r->submit_t = W->now;
    struct speer *P = &W->peer[p];
    if (P->faulty || W->now < P->hung_until || W->now < P->part_until) r->faulted = true;
    struct kvf_msg_new n = {
        .tenant = r->tenant, .prompt_len = r->prompt, .max_tokens = r->max_tokens};
    trace(W, "req %d submitted to peer %d: prompt %u, max_tokens %u", ri, p, r->prompt,
          r->max_tokens);
    int rc = kvf_decode_submit(W->dec, W->now, r->id, &n, (uint16_t)p, &W->acts);
    if (rc < 0) violate(W, "kvf_decode_submit: %s", kvf_strerror(rc));
    decode_actions(W);
    if (r->early_clear && r->nonce) {
        struct ev *e = ev_new(W, rnd(W, 1, 300), EV_CLEAR);
        e->peer = p;
        e->gen = P->gen;
        e->ridx = ri;
        e->nonce = r->nonce;
        ev_push(W);
    }
}

void on_page_ready(struct world *W, const struct ev *e)
{
    struct speer *P = &W->peer[e->peer];
    struct sreq *r = &W->req[e->ridx];
    if (r->job_aborted || e->nonce != r->nonce) return;
    int rc;
    struct src *s = NULL;
    for (uint32_t i = 0; i < P->n_src && !s; i++)
        if (!P->src[i].used) s = &P->src[i];
    /* A planned refusal happens once: a request computed again after it (the placeholder of
     * mutant placeholder_after_reject) is computed. */
    bool refuse = (r->refuse && e->index == 0 && !r->refused) || (int)e->index == r->fail_at || !s;
    if (refuse) {
        /* The engine refuses (its own pool is exhausted) or fails mid-way. */
        if (e->index == 0) r->refused = true;
        trace(W, "prefill %d: compute of req %d fails at page %u", e->peer, e->ridx, e->index);
        rc = kvf_prefill_compute_failed(P->sm, W->now, r->id, e->nonce, -ENOMEM, &W->acts);
        prefill_actions(W, e->peer);
        return;
    }
    s->used = true;
    s->ridx = e->ridx;
    s->nonce = e->nonce;
    s->index = e->index;
    memset(s->data, 0, sizeof(s->data));
    uint32_t slots = page_slots(r->prompt, e->index);
    if (r->forge && e->index == r->n_pages - 1) slots--;
    for (uint32_t k = 0; k < slots; k++)
        put_stamp(s->data, k, stamp(r->id, r->pages[e->index].tag, k));
    uint64_t sum = XXH3_64bits(s->data, W->data_bytes);
    trace(W, "prefill %d: page %u of req %d computed", e->peer, e->index, e->ridx);
    rc = kvf_prefill_page_ready(P->sm, W->now, r->id, e->nonce, e->index, sum,
                                1000u + (uint32_t)e->ridx, &W->acts);
    if (rc < 0) {
        free_src(s); /* never posted: the engine frees it */
        W->acts.n = 0;
        return;
    }
    r->pages_done = e->index + 1;
    prefill_actions(W, e->peer);
    if (e->index + 1 < r->n_pages && !r->job_aborted)
        schedule_page(W, e->peer, e->ridx, e->index + 1);
}

/* While it computes, the prefill engine reports its progress every PROGRESS_MS (the engine's
 * compute advances in layers; here a page's tokens count once the page is done). */
void schedule_progress(struct world *W, int p, int ri)
{
    struct ev *e = ev_new(W, PROGRESS_MS, EV_PROGRESS);
    e->peer = p;
    e->gen = W->peer[p].gen;
    e->ridx = ri;
    e->nonce = W->req[ri].nonce;
    ev_push(W);
}

void on_progress(struct world *W, const struct ev *e)
{
    struct speer *P = &W->peer[e->peer];
    struct sreq *r = &W->req[e->ridx];
    if (r->job_aborted || e->nonce != r->nonce) return;
    uint32_t done = r->pages_done * PT < r->prompt ? r->pages_done * PT : r->prompt;
    if (kvf_prefill_progress(P->sm, W->now, r->id, e->nonce, done, &W->acts) < 0) {
        W->acts.n = 0;
        return; /* past its writes (or gone): no more reports */
    }
    prefill_actions(W, e->peer);
    schedule_progress(W, e->peer, e->ridx);
}

void write_event_done(struct swrite *w, bool local)
{
    if (local)
        w->local_done = true;
    else
        w->land_done = true;
    if (w->local_done && w->land_done) w->live = false;
}

bool in_flight(const struct swrite *w)
{
    return w->live && !w->landed && !w->dropped;
}

void on_local(struct world *W, const struct ev *e)
{
    struct swrite *w = &W->w[e->w];
    struct speer *P = &W->peer[w->peer];
    if (w->gen != P->gen) {
        /* The process is gone; its memory stays as it was, and nobody reuses it. */
        if (w->src >= 0) memcpy(w->data, P->src[w->src].data, sizeof(w->data));
        w->captured = true;
        write_event_done(w, true);
        return;
    }
    if (w->src >= 0 && !w->dropped) {
        struct src *s = &P->src[w->src];
        if (all_checks(W) &&
            (!s->used || s->ridx != w->ridx || s->nonce != w->nonce || s->index != w->index))
            violate(W,
                    "I5: the put of request %d page %u read a source page that was already freed",
                    w->ridx, w->index);
        memcpy(w->data, s->data, sizeof(w->data));
    }
    w->captured = true;
    write_event_done(w, true);
    kvf_prefill_write_local_done(P->sm, W->req[w->ridx].id, w->nonce, w->index, &W->acts);
    prefill_actions(W, w->peer);
}

void on_land(struct world *W, const struct ev *e)
{
    struct swrite *w = &W->w[e->w];
    if (w->dropped) {
        write_event_done(w, false);
        return;
    }
    struct sreq *r = &W->req[w->ridx];
    check_write_target(W, w, "landed in");
    uint8_t *page = kvf_pool_page_data(W->pool, w->dst.page);
    memcpy(page, w->data, W->data_bytes);
    if (r->corrupt && w->slots > 0) page[3] ^= 0x40; /* one byte of slot 0 flipped in transit */
    struct kvf_page_trailer t;
    memset(&t, 0, sizeof(t));
    t.tag = w->dst.tag;
    t.req = r->id;
    t.tenant = w->tenant;
    t.slots = w->trailer_slots;
    t.checksum = w->checksum;
    t.epoch_nonce = (uint64_t)w->epoch << 32 | (uint32_t)w->nonce;
    memcpy(page + W->trailer_off, &t, sizeof(t));
    w->landed = true;
    write_event_done(w, false);
    trace(W, "  put of req %d lands in page %u", w->ridx, w->dst.page);
}

void on_flush(struct world *W, const struct ev *e)
{
    struct speer *P = &W->peer[e->peer];
    uint64_t last = 0;
    for (int i = 0; i < MAX_WRITES; i++) {
        const struct swrite *w = &W->w[i];
        if (!w->live || w->landed || w->peer != e->peer || w->ridx != e->ridx ||
            w->nonce != e->nonce)
            continue;
        if (w->dropped) return; /* the endpoint is closed: the flush fails, the peer resets */
        if (w->land_t > last) last = w->land_t;
    }
    if (last) {
        struct ev *n = ev_new(W, last > W->now ? last - W->now + 1 : 5, EV_FLUSH);
        n->peer = e->peer;
        n->gen = e->gen;
        n->ridx = e->ridx;
        n->nonce = e->nonce;
        ev_push(W);
        return;
    }
    trace(W, "prefill %d: flush of req %d complete", e->peer, e->ridx);
    kvf_prefill_flushed(P->sm, W->now, W->req[e->ridx].id, e->nonce, &W->acts);
    prefill_actions(W, e->peer);
}
