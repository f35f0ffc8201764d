/* sim_check.c — the simulator's invariants (listed in sim.c), checked after every step. */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sim_internal.h"

int find_req(struct world *W, kvf_req_id_t id)
{
    for (int i = 0; i < W->n_req; i++)
        if (kvf_req_id_eq(W->req[i].id, id)) return i;
    return -1;
}

uint32_t page_slots(uint32_t tokens, uint32_t i)
{
    uint32_t start = i * PT;
    uint32_t left = tokens > start ? tokens - start : 0;
    return left < PT ? left : PT;
}

/* The 8-byte stamp a slot carries when written for (request, tag): in its K and in its V block. */
uint64_t stamp(kvf_req_id_t id, uint64_t tag, uint32_t slot)
{
    uint64_t x = id.lo ^ (id.hi * 0x9e3779b97f4a7c15ull) ^ (tag << 8) ^ slot;
    return kvf_rng__splitmix(&x);
}
void put_stamp(uint8_t *data, uint32_t slot, uint64_t v)
{
    memcpy(data + slot * 8, &v, 8);      /* K block: bytes [0, 32) */
    memcpy(data + 32 + slot * 8, &v, 8); /* V block: bytes [32, 64) */
}

bool ended(const struct sreq *r)
{
    return r->outcome && (!r->running || r->finished);
}

/* Marks every live request of a failing peer: its grants may now end by fence, not proof. */
void fault_peer_requests(struct world *W, int p)
{
    for (int i = 0; i < W->n_req; i++)
        if (W->req[i].submitted && W->req[i].writer == p &&
            (!ended(&W->req[i]) || kvf_decode_req_state(W->dec, W->req[i].id) != KVF_DREQ_NONE))
            W->req[i].faulted = true;
}

/* I1: every slot of the prompt reads back as written for this request. */
void read_all(struct world *W, int ri, const char *when)
{
    struct sreq *r = &W->req[ri];
    for (uint32_t i = 0; i < r->n_pages; i++) {
        const uint8_t *d = kvf_pool_page_data(W->pool, r->pages[i].page);
        for (uint32_t s = 0; s < page_slots(r->prompt, i); s++) {
            int rc = kvf_pool_read_check(W->pool, r->pages[i].page, r->pages[i].tag, s);
            if (rc < 0) {
                violate(W,
                        "I1: request %d at %s cannot read slot %u of page %u (%s): it runs "
                        "without its prompt's KV",
                        ri, when, s, r->pages[i].page, kvf_strerror(rc));
                return;
            }
            uint64_t want = stamp(r->id, r->pages[i].tag, s), k, v;
            memcpy(&k, d + s * 8, 8);
            memcpy(&v, d + 32 + s * 8, 8);
            if (k != want || v != want) {
                violate(W,
                        "I1: request %d at %s reads slot %u of page %u that was not written for it",
                        ri, when, s, r->pages[i].page);
                return;
            }
        }
    }
}

/* I2 for one write: its page is still granted to its writer with its tag. */
void check_write_target(struct world *W, const struct swrite *w, const char *when)
{
    if (!all_checks(W)) return;
    struct kvf_page_info pi;
    if (kvf_pool_page_info(W->pool, w->dst.page, &pi) < 0) {
        violate(W, "I2: write %s to page %u out of range", when, w->dst.page);
        return;
    }
    if (pi.tag != w->dst.tag || !pi.granted || pi.grant.peer != w->peer ||
        pi.grant.epoch != w->epoch)
        violate(
            W,
            "I2: write of request %d (peer %d epoch %u) %s page %u, which is %s with tag %" PRIu64
            " (write's tag %" PRIu64 "), grant %s to peer %u epoch %u",
            w->ridx, w->peer, w->epoch, when, w->dst.page, kvf_page_state_name(pi.state), pi.tag,
            w->dst.tag, pi.granted ? "held" : "none", pi.grant.peer, pi.grant.epoch);
}

/* --- The network. -------------------------------------------------------------------------- */

void check_all(struct world *W)
{
    char why[256];
    if (!all_checks(W)) return;
    for (int i = 0; i < MAX_WRITES && !W->failed; i++) {
        const struct swrite *w = &W->w[i];
        if (in_flight(w)) check_write_target(W, w, "in flight to");
    }
    if (checkers_on(W)) {
        if (!kvf_pool_check(W->pool, why, sizeof(why))) violate(W, "pool checker: %s", why);
        if (!kvf_decode_check(W->dec, why, sizeof(why))) violate(W, "decode checker: %s", why);
        for (int p = 0; p < N_PEERS; p++)
            if (W->peer[p].alive && !kvf_prefill_check(W->peer[p].sm, why, sizeof(why)))
                violate(W, "prefill %d checker: %s", p, why);
    }
    struct kvf_pool_stats st;
    kvf_pool_stats(W->pool, &st);
    if (st.quarantines != W->quarantines_seen) {
        W->quarantines_seen = st.quarantines;
        for (uint32_t pg = 0; pg < W->cfg->n_pages; pg++) {
            struct kvf_page_info pi;
            kvf_pool_page_info(W->pool, pg, &pi);
            if (pi.state != KVF_PAGE_QUARANTINED) continue;
            int ri = find_req(W, pi.owner.req);
            if (ri >= 0 && !W->req[ri].faulted)
                violate(
                    W,
                    "I8: page %u of request %d was quarantined although none of its messages was "
                    "lost and its writer never failed: a drain proof went missing",
                    pg, ri);
        }
    }
    for (int i = 0; i < W->n_req; i++) {
        const struct sreq *r = &W->req[i];
        uint64_t since = r->progress_t > r->submit_t ? r->progress_t : r->submit_t;
        if (r->submitted && !r->outcome && W->now > since + OUTCOME_BOUND_MS)
            violate(W,
                    "I3: request %d has had no answer for %" PRIu64 " ms (%" PRIu64
                    " since its last progress)",
                    i, W->now - r->submit_t, W->now - since);
    }
}

bool quiescent(struct world *W)
{
    if (W->n_nonperiodic) return false;
    struct kvf_decode_stats ds;
    kvf_decode_stats(W->dec, &ds);
    if (ds.live) return false;
    for (int p = 0; p < N_PEERS; p++)
        if (!W->peer[p].alive || !W->peer[p].connected || W->now < W->peer[p].hung_until)
            return false;
    return true;
}

void final_checks(struct world *W)
{
    struct kvf_pool_stats st;
    kvf_pool_stats(W->pool, &st);
    W->res->fences = (uint32_t)st.fences;
    W->res->quarantines = (uint32_t)st.quarantines;
    struct kvf_decode_stats ds;
    kvf_decode_stats(W->dec, &ds);
    W->res->stale = (uint32_t)ds.stale;
    if (!all_checks(W)) return;
    if (st.by_state[KVF_PAGE_FREE] != W->cfg->n_pages || st.reserved || st.grants)
        violate(W, "I4: at quiescence %u of %u pages free, %u reserved, %u grants",
                st.by_state[KVF_PAGE_FREE], W->cfg->n_pages, st.reserved, st.grants);
    for (int i = 0; i < W->n_req; i++)
        if (!W->req[i].dropped_by_client && !W->req[i].outcome)
            violate(W, "I3: request %d never ended", i);
    for (int p = 0; p < N_PEERS; p++) {
        struct kvf_prefill_stats ps;
        kvf_prefill_stats(W->peer[p].sm, &ps);
        if (ps.live)
            violate(W, "I4: prefill %d still has %u live requests at quiescence", p, ps.live);
        for (int s = 0; s < N_SRC; s++)
            if (W->peer[p].src[s].used) violate(W, "I4: prefill %d leaked source page %d", p, s);
    }
}
