/*
 * test_pool_random — the pool against a deliberately simple reference model, under at least
 * 1,000,000 seeded random operations (legal and illegal), with the full checker after every one.
 *
 * The model keeps the same facts as the pool in the plainest form: an array of pages, the free
 * list as an array shifted on every pop, a scan of all pages wherever the pool uses a list. After
 * every operation the test compares the return code, every page's info, the stats (errors
 * included), what is available, the peers' epochs, the pages an allocation returned and the
 * peers a tick asks to fence.
 *
 * Writes: a grant lets its writer post writes that land later, at any time, also after the page
 * was released (late writes). A write lands unless its writer's epoch was fenced (the fence's
 * guarantee). A correct writer proves it is done (grant_end) only after its writes landed. When a
 * write lands, the page it lands in must still carry the tag it was granted with, and the grant
 * must still be that writer's: a late write never lands in a page that was given to anyone else.
 *
 * Options: --seed N (replay), --ops N (default 1,000,000; 10,000,000 with KVF_SOAK=1),
 * --pages N (default 32).
 */
#include "pool_snap.h"

#define N_PEERS      3
#define PT           4 /* page_tokens of small_config */
#define HOLD_MS      1000
#define MAX_INFLIGHT 64
#define MAX_PAGES    64

/* --- The reference model. -------------------------------------------------------------------- */

struct mpage {
    enum kvf_page_state state;
    uint64_t tag;
    struct kvf_owner owner;
    uint16_t holders[KVF_HOLDER__NKINDS];
    bool granted;
    struct kvf_peer_epoch grant;
    uint32_t fill;
    uint64_t deadline;
    bool sealed;
};

struct model {
    uint32_t n;
    struct mpage page[MAX_PAGES];
    uint32_t freeq[MAX_PAGES]; /* FIFO: [0] leaves first */
    uint32_t nfree;
    uint32_t reserved;
    uint32_t epoch[N_PEERS];
    uint64_t clock, last_tag;
    struct kvf_pool_stats st; /* counters only; gauges are computed */
};

static void m_free(struct model *m, uint32_t p)
{
    struct mpage *pg = &m->page[p];
    uint64_t tag = pg->tag;
    memset(pg, 0, sizeof(*pg));
    pg->tag = tag;
    pg->state = KVF_PAGE_FREE;
    m->freeq[m->nfree++] = p;
    m->st.releases++;
}

static int m_err(struct model *m, int code)
{
    m->st.errors[-code - 1001]++;
    return code;
}

static int m_alloc(struct model *m, const struct kvf_owner *o, int holder, uint32_t n, bool rsv,
                   struct kvf_page_ref *out)
{
    if (n == 0 || holder < 0 || holder >= KVF_HOLDER__NKINDS) return m_err(m, KVF_E_POOL_BAD_ARG);
    if (rsv && n > m->reserved) return m_err(m, KVF_E_POOL_RESERVE);
    if (!rsv && n > m->nfree - m->reserved) return m_err(m, KVF_E_POOL_FULL);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = m->freeq[0];
        memmove(m->freeq, m->freeq + 1, sizeof(m->freeq[0]) * (m->nfree - 1));
        m->nfree--;
        struct mpage *pg = &m->page[p];
        pg->tag = ++m->last_tag ? m->last_tag : ++m->last_tag;
        pg->state = KVF_PAGE_OWNED;
        pg->owner = *o;
        pg->holders[holder] = 1;
        pg->fill = 0;
        out[i] = (struct kvf_page_ref){p, pg->tag};
    }
    if (rsv) m->reserved -= n;
    m->st.allocs += n;
    return 0;
}

static int m_hold(struct model *m, struct kvf_page_ref r, int kind)
{
    if (kind < 0 || kind >= KVF_HOLDER__NKINDS) return m_err(m, KVF_E_POOL_BAD_ARG);
    if (r.page >= m->n) return m_err(m, KVF_E_POOL_BAD_PAGE);
    struct mpage *pg = &m->page[r.page];
    if (pg->tag != r.tag) return m_err(m, KVF_E_POOL_STALE_TAG);
    if ((pg->state != KVF_PAGE_OWNED && pg->state != KVF_PAGE_GRANTED) || pg->sealed)
        return m_err(m, KVF_E_POOL_BAD_STATE);
    if (pg->holders[kind] == UINT16_MAX) return m_err(m, KVF_E_POOL_BAD_ARG);
    pg->holders[kind]++;
    return 0;
}

static int m_seal(struct model *m, struct kvf_page_ref r)
{
    if (r.page >= m->n) return m_err(m, KVF_E_POOL_BAD_PAGE);
    struct mpage *pg = &m->page[r.page];
    if (pg->tag != r.tag) return m_err(m, KVF_E_POOL_STALE_TAG);
    if (pg->state != KVF_PAGE_OWNED || pg->sealed) return m_err(m, KVF_E_POOL_BAD_STATE);
    if (pg->fill != PT) return m_err(m, KVF_E_POOL_BAD_ARG);
    pg->sealed = true;
    m->st.seals++;
    return 0;
}

static int m_share(struct model *m, struct kvf_page_ref r, uint32_t tenant, int kind)
{
    if (kind < 0 || kind >= KVF_HOLDER__NKINDS) return m_err(m, KVF_E_POOL_BAD_ARG);
    if (r.page >= m->n) return m_err(m, KVF_E_POOL_BAD_PAGE);
    struct mpage *pg = &m->page[r.page];
    if (pg->tag != r.tag) return m_err(m, KVF_E_POOL_STALE_TAG);
    if (pg->state != KVF_PAGE_OWNED || !pg->sealed) return m_err(m, KVF_E_POOL_BAD_STATE);
    if (pg->owner.tenant != tenant) return m_err(m, KVF_E_POOL_FOREIGN);
    if (pg->holders[kind] == UINT16_MAX) return m_err(m, KVF_E_POOL_BAD_ARG);
    pg->holders[kind]++;
    m->st.shares++;
    return 0;
}

static int m_release(struct model *m, struct kvf_page_ref r, int kind, uint64_t now)
{
    if (kind < 0 || kind >= KVF_HOLDER__NKINDS) return m_err(m, KVF_E_POOL_BAD_ARG);
    if (r.page >= m->n) return m_err(m, KVF_E_POOL_BAD_PAGE);
    struct mpage *pg = &m->page[r.page];
    if (pg->state == KVF_PAGE_FREE && pg->tag == r.tag) return m_err(m, KVF_E_POOL_DOUBLE_FREE);
    if (pg->tag != r.tag) return m_err(m, KVF_E_POOL_STALE_TAG);
    if (pg->holders[kind] == 0) return m_err(m, KVF_E_POOL_NOT_HOLDER);
    pg->holders[kind]--;
    if (pg->holders[0] + pg->holders[1] + pg->holders[2]) return 0;
    if (pg->state == KVF_PAGE_OWNED) {
        m_free(m, r.page);
        return 0;
    }
    if (now > m->clock) m->clock = now;
    pg->deadline = m->clock + HOLD_MS;
    pg->state = KVF_PAGE_HELD;
    m->st.holds++;
    return 0;
}

static int m_set_fill(struct model *m, struct kvf_page_ref r, uint32_t fill)
{
    if (r.page >= m->n) return m_err(m, KVF_E_POOL_BAD_PAGE);
    struct mpage *pg = &m->page[r.page];
    if (pg->tag != r.tag) return m_err(m, KVF_E_POOL_STALE_TAG);
    if (pg->state != KVF_PAGE_OWNED || pg->sealed) return m_err(m, KVF_E_POOL_BAD_STATE);
    if (fill < pg->fill || fill > PT) return m_err(m, KVF_E_POOL_BAD_ARG);
    pg->fill = fill;
    return 0;
}

static int m_grant(struct model *m, struct kvf_page_ref r, struct kvf_peer_epoch w)
{
    if (r.page >= m->n) return m_err(m, KVF_E_POOL_BAD_PAGE);
    struct mpage *pg = &m->page[r.page];
    if (pg->tag != r.tag) return m_err(m, KVF_E_POOL_STALE_TAG);
    if (pg->state != KVF_PAGE_OWNED) return m_err(m, KVF_E_POOL_NOT_OWNED);
    if (pg->sealed) return m_err(m, KVF_E_POOL_BAD_STATE);
    if (w.peer >= N_PEERS) return m_err(m, KVF_E_POOL_BAD_ARG);
    if (w.epoch != m->epoch[w.peer]) return m_err(m, KVF_E_POOL_BAD_EPOCH);
    pg->state = KVF_PAGE_GRANTED;
    pg->fill = 0;
    pg->granted = true;
    pg->grant = w;
    m->st.grants_issued++;
    return 0;
}

/* Would grant_end succeed? (The test lands a writer's writes before it proves it is done.) */
static bool m_grant_end_ok(const struct model *m, struct kvf_page_ref r, struct kvf_peer_epoch w,
                           uint32_t fill)
{
    if (r.page >= m->n) return false;
    const struct mpage *pg = &m->page[r.page];
    return pg->tag == r.tag && pg->state != KVF_PAGE_QUARANTINED && pg->granted &&
           pg->grant.peer == w.peer && pg->grant.epoch == w.epoch && fill <= PT;
}

static int m_grant_end(struct model *m, struct kvf_page_ref r, struct kvf_peer_epoch w,
                       uint32_t fill)
{
    if (r.page >= m->n) return m_err(m, KVF_E_POOL_BAD_PAGE);
    struct mpage *pg = &m->page[r.page];
    if (pg->tag != r.tag) return m_err(m, KVF_E_POOL_STALE_TAG);
    if (pg->state == KVF_PAGE_QUARANTINED) return m_err(m, KVF_E_POOL_BAD_STATE);
    if (!pg->granted || pg->grant.peer != w.peer || pg->grant.epoch != w.epoch)
        return m_err(m, KVF_E_POOL_NO_GRANT);
    if (fill > PT) return m_err(m, KVF_E_POOL_BAD_ARG);
    m->st.grants_proved++;
    if (pg->state == KVF_PAGE_GRANTED) {
        pg->state = KVF_PAGE_OWNED;
        pg->granted = false;
        pg->grant = (struct kvf_peer_epoch){0, 0};
        pg->fill = fill;
    } else {
        m_free(m, r.page);
    }
    return 0;
}

static int m_tick(struct model *m, uint64_t now, struct kvf_peer_epoch *out, uint32_t max_out)
{
    if (now > m->clock) m->clock = now;
    for (uint32_t p = 0; p < m->n; p++) {
        struct mpage *pg = &m->page[p];
        if (pg->state == KVF_PAGE_HELD && pg->deadline <= m->clock) {
            pg->state = KVF_PAGE_QUARANTINED;
            m->st.quarantines++;
        }
    }
    uint32_t k = 0;
    for (uint16_t peer = 0; peer < N_PEERS; peer++) {
        bool any = false;
        for (uint32_t p = 0; p < m->n; p++)
            any |= m->page[p].state == KVF_PAGE_QUARANTINED && m->page[p].grant.peer == peer;
        if (!any) continue;
        if (k < max_out) out[k] = (struct kvf_peer_epoch){peer, m->epoch[peer]};
        k++;
    }
    return (int)k;
}

static int m_fence(struct model *m, struct kvf_peer_epoch w)
{
    if (w.peer >= N_PEERS) return m_err(m, KVF_E_POOL_BAD_ARG);
    if (w.epoch != m->epoch[w.peer]) return m_err(m, KVF_E_POOL_BAD_EPOCH);
    m->epoch[w.peer]++;
    m->st.fences++;
    int revoked = 0;
    for (uint32_t p = 0; p < m->n; p++) {
        struct mpage *pg = &m->page[p];
        if (!pg->granted || pg->grant.peer != w.peer) continue;
        revoked++;
        if (pg->state == KVF_PAGE_GRANTED) {
            pg->state = KVF_PAGE_OWNED;
            pg->granted = false;
            pg->grant = (struct kvf_peer_epoch){0, 0};
            pg->fill = 0;
        } else {
            m_free(m, p);
        }
    }
    m->st.fence_revoked += (uint64_t)revoked;
    return revoked;
}

static int m_read_check(const struct model *m, uint32_t page, uint64_t tag, uint32_t slot)
{
    if (page >= m->n) return KVF_E_POOL_BAD_PAGE;
    const struct mpage *pg = &m->page[page];
    if (pg->tag != tag) return KVF_E_POOL_STALE_TAG;
    if (pg->state != KVF_PAGE_OWNED) return KVF_E_POOL_BAD_STATE;
    if (slot >= pg->fill) return KVF_E_POOL_BAD_SLOT;
    return 0;
}

/* --- Comparing the pool with the model. --------------------------------------------------------
 */

static void compare(const kvf_pool_t *pool, const struct model *m, uint64_t op)
{
    struct kvf_pool_stats st, want = m->st;
    kvf_pool_stats(pool, &st);
    want.n_pages = m->n;
    for (uint32_t p = 0; p < m->n; p++) {
        const struct mpage *pg = &m->page[p];
        struct kvf_page_info in;
        ASSERT_OK(kvf_pool_page_info(pool, p, &in));
        if (in.state != pg->state || in.tag != pg->tag || in.fill != pg->fill ||
            in.granted != pg->granted || in.grant.peer != pg->grant.peer ||
            in.grant.epoch != pg->grant.epoch || !kvf_req_id_eq(in.owner.req, pg->owner.req) ||
            in.owner.tenant != pg->owner.tenant || in.sealed != pg->sealed ||
            memcmp(in.holders, pg->holders, sizeof(in.holders)) != 0 ||
            in.deadline_ms != ((pg->state == KVF_PAGE_HELD || pg->state == KVF_PAGE_QUARANTINED)
                                   ? pg->deadline
                                   : 0))
            KVF_FAIL("op %" PRIu64 ": page %u differs: pool %s tag %" PRIx64 " fill %u, model %s "
                     "tag %" PRIx64 " fill %u",
                     op, p, kvf_page_state_name(in.state), in.tag, in.fill,
                     kvf_page_state_name(pg->state), pg->tag, pg->fill);
        want.by_state[pg->state]++;
        want.grants += pg->granted;
        want.sealed += pg->sealed;
    }
    want.reserved = m->reserved;
    if (memcmp(&st, &want, sizeof(st)) != 0) KVF_FAIL("op %" PRIu64 ": stats differ", op);
    ASSERT_EQ_INT(kvf_pool_available(pool), m->nfree - m->reserved);
    for (uint16_t p = 0; p < N_PEERS; p++) {
        uint32_t e;
        ASSERT_OK(kvf_pool_peer_epoch(pool, p, &e));
        ASSERT_EQ_INT(e, m->epoch[p]);
    }
    char why[160];
    if (!kvf_pool_check(pool, why, sizeof(why))) KVF_FAIL("op %" PRIu64 ": check: %s", op, why);
}

/* --- Writes in flight. ----------------------------------------------------------------------- */

struct write {
    struct kvf_page_ref ref;
    struct kvf_peer_epoch w;
};

struct world {
    kvf_pool_t *pool;
    struct model m;
    struct kvf_rng rng;
    struct write inflight[MAX_INFLIGHT];
    uint32_t n_inflight;
    struct kvf_page_ref hist[64]; /* refs once issued, many now stale */
    uint32_t n_hist;
    uint64_t landed, dropped, landed_late; /* late: in a page released while granted */
    uint64_t wall_ms;                      /* the caller's clock */
};

/* Lands (or, if its writer was fenced, drops) write i, then forgets it. */
static void land(struct world *wd, uint32_t i)
{
    struct write x = wd->inflight[i];
    wd->inflight[i] = wd->inflight[--wd->n_inflight];
    if (wd->m.epoch[x.w.peer] != x.w.epoch) {
        wd->dropped++; /* the fence guarantees it never lands */
        return;
    }
    struct kvf_page_info in;
    ASSERT_OK(kvf_pool_page_info(wd->pool, x.ref.page, &in));
    /* The isolation property: a write lands only in the page it was granted, under that tag. */
    if (in.tag != x.ref.tag || !in.granted || in.grant.peer != x.w.peer ||
        in.grant.epoch != x.w.epoch || in.state == KVF_PAGE_FREE || in.state == KVF_PAGE_OWNED)
        KVF_FAIL("a write for page %u tag %" PRIx64 " landed in %s tag %" PRIx64, x.ref.page,
                 x.ref.tag, kvf_page_state_name(in.state), in.tag);
    memcpy(kvf_pool_page_data(wd->pool, x.ref.page), &x.ref.tag, sizeof(x.ref.tag));
    wd->landed++;
    wd->landed_late += in.state != KVF_PAGE_GRANTED;
}

/* A correct writer drains before it proves: land every write of (ref, w). */
static void drain(struct world *wd, struct kvf_page_ref ref, struct kvf_peer_epoch w)
{
    for (uint32_t i = 0; i < wd->n_inflight;) {
        struct write *x = &wd->inflight[i];
        if (x->ref.page == ref.page && x->ref.tag == ref.tag && x->w.peer == w.peer &&
            x->w.epoch == w.epoch)
            land(wd, i);
        else
            i++;
    }
}

/* --- Random arguments. --------------------------------------------------------------------- */

static uint32_t below(struct world *wd, uint32_t n)
{
    return kvf_rng_below(&wd->rng, n);
}

static struct kvf_page_ref pick_ref(struct world *wd)
{
    uint32_t r = below(wd, 100);
    if (r < 75) { /* a live page, by its current tag */
        for (int tries = 0; tries < 8; tries++) {
            uint32_t p = below(wd, wd->m.n);
            if (wd->m.page[p].state != KVF_PAGE_FREE || tries == 7)
                return (struct kvf_page_ref){p, wd->m.page[p].tag};
        }
    }
    if (r < 90 && wd->n_hist) return wd->hist[below(wd, wd->n_hist)]; /* often stale */
    if (r < 97) return (struct kvf_page_ref){below(wd, wd->m.n), kvf_rng_next(&wd->rng)};
    return (struct kvf_page_ref){wd->m.n + below(wd, 3), 1};
}

static struct kvf_peer_epoch pick_writer(struct world *wd)
{
    uint16_t peer = (uint16_t)below(wd, N_PEERS + 1); /* sometimes out of range */
    uint32_t e = peer < N_PEERS ? wd->m.epoch[peer] : 1;
    uint32_t r = below(wd, 10);
    if (r == 0)
        e = e > 1 ? e - 1 : e + 1; /* a fenced or unknown epoch */
    else if (r == 1)
        e++;
    return (struct kvf_peer_epoch){peer, e};
}

/* The writer of a granted page, if `ref` names one; otherwise a random one. */
static struct kvf_peer_epoch writer_of(struct world *wd, struct kvf_page_ref ref)
{
    if (ref.page < wd->m.n && wd->m.page[ref.page].granted && below(wd, 10) < 8)
        return wd->m.page[ref.page].grant;
    return pick_writer(wd);
}

static int pick_kind(struct world *wd)
{
    uint32_t r = below(wd, 40);
    if (r == 0) return KVF_HOLDER__NKINDS; /* invalid */
    return r < 30 ? KVF_HOLDER_SEQ : (int)(r % KVF_HOLDER__NKINDS);
}

/* A holder kind for releasing `ref`: mostly one that holds it, so pages do come back. */
static int kind_for(struct world *wd, struct kvf_page_ref ref)
{
    if (ref.page < wd->m.n && below(wd, 10) < 8) {
        const struct mpage *pg = &wd->m.page[ref.page];
        for (int k = 0; k < KVF_HOLDER__NKINDS; k++)
            if (pg->holders[k]) return k;
    }
    return pick_kind(wd);
}

static void remember(struct world *wd, struct kvf_page_ref r)
{
    if (wd->n_hist < KVF_ARRAY_LEN(wd->hist))
        wd->hist[wd->n_hist++] = r;
    else
        wd->hist[below(wd, KVF_ARRAY_LEN(wd->hist))] = r;
}

/* --- One random operation. ------------------------------------------------------------------- */

enum op {
    OP_ALLOC,
    OP_HOLD,
    OP_RELEASE,
    OP_SET_FILL,
    OP_GRANT,
    OP_GRANT_END,
    OP_TICK,
    OP_FENCE,
    OP_RESERVE,
    OP_UNRESERVE,
    OP_READ,
    OP_POST,
    OP_LAND,
    OP_SEAL,
    OP_SHARE,
    OP__N
};
static const char *const op_name[OP__N] = {"alloc",     "hold", "release", "set_fill", "grant",
                                           "grant_end", "tick", "fence",   "reserve",  "unreserve",
                                           "read",      "post", "land",    "seal",     "share"};
/* Weights out of 100. */
static const uint8_t op_weight[OP__N] = {14, 5, 14, 5, 12, 9, 5, 1, 4, 4, 5, 9, 7, 3, 3};

static uint64_t n_ok[OP__N], n_err[OP__N];

static enum op pick_op(struct world *wd)
{
    uint32_t r = below(wd, 100);
    for (int i = 0; i < OP__N; i++) {
        if (r < op_weight[i]) return (enum op)i;
        r -= op_weight[i];
    }
    return OP_READ;
}

static uint64_t pick_now(struct world *wd)
{
    /* The caller's time mostly advances a little; sometimes its `now` is behind what it passed
     * before (a clock step), which the pool must take safely. */
    wd->wall_ms += below(wd, 40);
    return below(wd, 20) == 0 && wd->wall_ms > 500 ? wd->wall_ms - below(wd, 500) : wd->wall_ms;
}

static void step(struct world *wd, uint64_t op_no)
{
    kvf_pool_t *pool = wd->pool;
    struct model *m = &wd->m;
    enum op op = pick_op(wd);
    int got = 0, want = 0;
    switch (op) {
    case OP_ALLOC: {
        static const struct kvf_owner owners[3] = {{{1, 1}, 1}, {{2, 2}, 2}, {{3, 3}, 1}};
        const struct kvf_owner *o = &owners[below(wd, 3)];
        uint32_t n = below(wd, 10) == 0 ? 0 : 1 + below(wd, 4);
        bool rsv = below(wd, 3) == 0;
        int kind = pick_kind(wd);
        struct kvf_page_ref a[8], b[8];
        want = m_alloc(m, o, kind, n, rsv, a);
        got = kvf_pool_alloc(pool, o, (enum kvf_holder)kind, n, rsv, b);
        if (want == 0 && got == 0) {
            for (uint32_t i = 0; i < n; i++) {
                if (a[i].page != b[i].page || a[i].tag != b[i].tag)
                    KVF_FAIL("op %" PRIu64 ": alloc returned page %u tag %" PRIx64
                             ", model page %u tag %" PRIx64,
                             op_no, b[i].page, b[i].tag, a[i].page, a[i].tag);
                remember(wd, b[i]);
            }
        }
        break;
    }
    case OP_HOLD: {
        struct kvf_page_ref r = pick_ref(wd);
        int kind = pick_kind(wd);
        want = m_hold(m, r, kind);
        got = kvf_pool_hold(pool, r, (enum kvf_holder)kind);
        break;
    }
    case OP_RELEASE: {
        struct kvf_page_ref r = pick_ref(wd);
        int kind = kind_for(wd, r);
        uint64_t now = pick_now(wd);
        want = m_release(m, r, kind, now);
        got = kvf_pool_release(pool, r, (enum kvf_holder)kind, now);
        break;
    }
    case OP_SET_FILL: {
        struct kvf_page_ref r = pick_ref(wd);
        uint32_t fill = below(wd, PT + 2);
        want = m_set_fill(m, r, fill);
        got = kvf_pool_set_fill(pool, r, fill);
        break;
    }
    case OP_GRANT: {
        struct kvf_page_ref r = pick_ref(wd);
        struct kvf_peer_epoch w = pick_writer(wd);
        want = m_grant(m, r, w);
        got = kvf_pool_grant(pool, r, w);
        break;
    }
    case OP_GRANT_END: {
        struct kvf_page_ref r = pick_ref(wd);
        struct kvf_peer_epoch w = writer_of(wd, r);
        uint32_t fill = below(wd, 12) == 0 ? PT + 1 : below(wd, PT + 1);
        if (m_grant_end_ok(m, r, w, fill)) drain(wd, r, w);
        want = m_grant_end(m, r, w, fill);
        got = kvf_pool_grant_end(pool, r, w, fill);
        break;
    }
    case OP_TICK: {
        uint64_t now = pick_now(wd);
        uint32_t room = below(wd, N_PEERS + 1);
        struct kvf_peer_epoch a[N_PEERS] = {{0, 0}}, b[N_PEERS] = {{0, 0}};
        want = m_tick(m, now, a, room);
        got = kvf_pool_tick(pool, now, b, room);
        if (memcmp(a, b, sizeof(a)) != 0) KVF_FAIL("op %" PRIu64 ": tick's fence list", op_no);
        if (below(wd, 2) == 0) /* the engine fences what tick asked for, sometimes at once */
            for (uint32_t i = 0; i < room && (int)i < got; i++)
                ASSERT_EQ_INT(kvf_pool_fence(pool, b[i]), m_fence(m, b[i]));
        break;
    }
    case OP_FENCE: {
        struct kvf_peer_epoch w = pick_writer(wd);
        want = m_fence(m, w);
        got = kvf_pool_fence(pool, w);
        break;
    }
    case OP_RESERVE:
    case OP_UNRESERVE: {
        uint32_t n = below(wd, 6);
        if (op == OP_RESERVE) {
            want = n > m->nfree - m->reserved ? m_err(m, KVF_E_POOL_RESERVE) : 0;
            if (want == 0) m->reserved += n;
            got = kvf_pool_reserve(pool, n);
        } else {
            want = n > m->reserved ? m_err(m, KVF_E_POOL_RESERVE) : 0;
            if (want == 0) m->reserved -= n;
            got = kvf_pool_unreserve(pool, n);
        }
        break;
    }
    case OP_READ: {
        struct kvf_page_ref r = pick_ref(wd);
        uint32_t slot = below(wd, PT + 1);
        want = m_read_check(m, r.page, r.tag, slot);
        got = kvf_pool_read_check(pool, r.page, r.tag, slot);
        struct kvf_pool_read_view v;
        kvf_pool_read_view(pool, &v);
        ASSERT_EQ_INT(kvf_pool_read_check_view(&v, r.page, r.tag, slot), got);
        break;
    }
    case OP_POST: {
        /* The writer of a granted (or already released: it does not know) page posts a write. */
        uint32_t p = below(wd, m->n);
        const struct mpage *pg = &m->page[p];
        if (!pg->granted || wd->n_inflight == MAX_INFLIGHT) {
            want = got = -1;
            break;
        }
        wd->inflight[wd->n_inflight++] = (struct write){{p, pg->tag}, pg->grant};
        break;
    }
    case OP_SEAL: {
        struct kvf_page_ref r = pick_ref(wd);
        want = m_seal(m, r);
        got = kvf_pool_seal(pool, r);
        break;
    }
    case OP_SHARE: {
        /* Readers of the owners' tenants (1 and 2) and of one that owns nothing (3). */
        struct kvf_page_ref r = pick_ref(wd);
        uint32_t tenant = 1 + below(wd, 3);
        int kind = pick_kind(wd);
        want = m_share(m, r, tenant, kind);
        got = kvf_pool_share(pool, r, tenant, (enum kvf_holder)kind);
        int rc = kvf_pool_read_check_tenant(pool, r.page, r.tag, tenant, 0);
        int mrc = m_read_check(m, r.page, r.tag, 0);
        if (mrc == 0 && m->page[r.page].owner.tenant != tenant) mrc = KVF_E_POOL_FOREIGN;
        ASSERT_EQ_INT(rc, mrc);
        break;
    }
    case OP_LAND:
        if (wd->n_inflight == 0) {
            want = got = -1;
            break;
        }
        land(wd, below(wd, wd->n_inflight));
        break;
    default:
        break;
    }
    if (got != want)
        KVF_FAIL("op %" PRIu64 " (%s): pool returned %d (%s), model %d (%s)", op_no, op_name[op],
                 got, kvf_strerror(got), want, kvf_strerror(want));
    if (got >= 0)
        n_ok[op]++;
    else
        n_err[op]++;
    /* Writes of fenced epochs can never land: forget them as the fence's guarantee says. */
    for (uint32_t i = 0; i < wd->n_inflight;) {
        if (m->epoch[wd->inflight[i].w.peer] != wd->inflight[i].w.epoch)
            land(wd, i);
        else
            i++;
    }
    compare(pool, m, op_no);
}

static void test_pool_model_random(void)
{
    const char *s = kvf_test_arg("--ops");
    /* make soak (KVF_SOAK=1) runs ten times longer (within the harness's 300 s per case). */
    uint64_t n_ops = s ? strtoull(s, NULL, 0) : getenv("KVF_SOAK") ? 10000000 : 1000000;
    s = kvf_test_arg("--pages");
    uint32_t n_pages = s ? (uint32_t)strtoul(s, NULL, 0) : 32;
    ASSERT_TRUE(n_pages >= 1 && n_pages <= MAX_PAGES);
    uint64_t seed = kvf_test_seed();
    printf("# seed %" PRIu64 " ops %" PRIu64 " pages %u (replay: --seed %" PRIu64 ")\n", seed,
           n_ops, n_pages, seed);

    static struct world wd;
    memset(&wd, 0, sizeof(wd));
    struct kvf_pool_config c = small_config(n_pages, N_PEERS);
    c.hold_timeout_ms = HOLD_MS;
    c.tag_seed = seed << 20; /* tags differ from run to run, as they may in production */
    ASSERT_OK(kvf_pool_create(&c, &wd.pool));
    kvf_rng_seed(&wd.rng, seed);
    wd.m.n = n_pages;
    wd.m.last_tag = c.tag_seed;
    for (uint32_t p = 0; p < n_pages; p++) {
        wd.m.page[p].state = KVF_PAGE_FREE;
        wd.m.freeq[p] = p;
    }
    wd.m.nfree = n_pages;
    for (int p = 0; p < N_PEERS; p++)
        wd.m.epoch[p] = 1;

    for (uint64_t i = 0; i < n_ops; i++)
        step(&wd, i);

    for (int i = 0; i < OP__N; i++)
        printf("# %-9s ok %8" PRIu64 "  refused %8" PRIu64 "\n", op_name[i], n_ok[i], n_err[i]);
    struct kvf_pool_stats st;
    kvf_pool_stats(wd.pool, &st);
    printf("# writes landed %" PRIu64 " (late %" PRIu64 "), dropped by fences %" PRIu64
           "; holds %" PRIu64 ", quarantines %" PRIu64 ", fences %" PRIu64
           ", grants revoked %" PRIu64 "\n",
           wd.landed, wd.landed_late, wd.dropped, st.holds, st.quarantines, st.fences,
           st.fence_revoked);
    /* The run must have exercised what it claims to: both outcomes of every call, late writes
     * (landing in HELD pages), quarantines and fences. */
    if (n_ops >= 100000 && n_pages >= 16) { /* tiny pools rarely reach quarantine */
        for (int i = 0; i < OP__N; i++) {
            if (i == OP_POST || i == OP_LAND) continue;
            ASSERT_TRUE(n_ok[i] > 0);
            ASSERT_TRUE(n_err[i] > 0 || i == OP_TICK);
        }
        ASSERT_TRUE(wd.landed > 0 && wd.landed_late > 0 && wd.dropped > 0);
        ASSERT_TRUE(st.holds > 0 && st.quarantines > 0 && st.fence_revoked > 0);
    }

    /* Quiescence: drop every holder, fence every peer; the pool returns to all free. */
    for (uint16_t p = 0; p < N_PEERS; p++)
        ASSERT_OK(kvf_pool_fence(wd.pool, (struct kvf_peer_epoch){p, wd.m.epoch[p]}));
    for (uint32_t p = 0; p < n_pages; p++) {
        struct kvf_page_info in;
        ASSERT_OK(kvf_pool_page_info(wd.pool, p, &in));
        for (int k = 0; k < KVF_HOLDER__NKINDS; k++)
            while (in.holders[k]--)
                ASSERT_OK(kvf_pool_release(wd.pool, (struct kvf_page_ref){p, in.tag},
                                           (enum kvf_holder)k, 0));
    }
    ASSERT_OK(kvf_pool_unreserve(wd.pool, wd.m.reserved));
    kvf_pool_stats(wd.pool, &st);
    ASSERT_EQ_INT(st.by_state[KVF_PAGE_FREE], n_pages);
    ASSERT_EQ_INT(st.grants, 0);
    ASSERT_POOL_OK(wd.pool);
    kvf_pool_destroy(wd.pool);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_pool_model_random),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
