/*
 * decode_worker.c — the decode worker loop: admit → NEW (submit to the machine: reserve, grant,
 * GRANT) → verified DONE → continuous batching, one token for every running sequence per step,
 * pages grown from each request's reservation, tokens streamed to the router's handles.
 *
 * Threads: one loop thread owns the pool, the decode machine, the transport and every request's
 * loop-side state; a compute thread runs each step's math (kvf_fwd_compute) between the loop's
 * prepare and commit (in manual mode the caller runs it: kvf_dworker_compute).
 * Router threads touch only a handle's event queue (under the handle's mutex) and the inbox of
 * submitted handles (under the worker's mutex), and wake the loop through an eventfd. Transport
 * callbacks run inside kvf_xport_progress and only record what happened; the loop acts on it
 * afterwards, so nothing re-enters the transport from a callback.
 *
 * A handle's life on the loop:
 *   inbox ──▶ pending (waits for a slot, free pages and a prefill; bounded by admit_timeout_ms)
 *         ──▶ submitted (GRANTED in the machine) ──DELIVER_FIRST──▶ running (in the batch)
 *         ──▶ ended: END pushed, the loop's reference dropped.
 * A cancel at any point ends it through the machine (kvf_decode_cancel), never by freeing pages
 * here: a GRANTED request's pages stay HELD until proof or fence.
 *
 * Connection to the prefill worker: connect, HELLO at the pool's current epoch for the peer,
 * HELLO back (checked) → kvf_decode_peer_up. A failed connection → kvf_decode_peer_down, whose
 * FENCE_PEER closes the endpoint (forced: the fence) and records it (kvf_decode_peer_fenced,
 * which bumps the epoch); then connect again.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "engine_internal.h"
#include "kvfence/gguf.h"

#define DW_TICK_MS      20u /* machine timers */
#define DW_RECONNECT_MS 100u
#define DW_HELLO_MS     2000u /* connect → the prefill's HELLO, at most */
/* A DONE whose pages hold more than this is hashed in slices of this many bytes, one slice per
 * loop turn, so a long prompt's verification never stalls the loop (XXH3 runs at ≥ 10 GB/s a
 * core: a slice is about a millisecond). */
#define DW_HASH_SLICE_BYTES (8u << 20)

enum gstate { G_INBOX = 0, G_PENDING = 1, G_SUBMITTED = 2, G_RUNNING = 3, G_ENDED = 4 };

struct kvf_gen {
    KVF__GEN_FIELDS /* the handle (gen.c) */
        /* The loop's (req and sampling set by gen_admit, under mu). */
        enum gstate state;
    kvf_req_id_t req;
    uint16_t peer; /* the prefill worker it was granted to (submitted or running) */
    uint32_t n_out;
    int32_t last;
    struct kvf_msg_sampling sampling;
    bool in_step; /* in the batch of the step being computed: no cancel or finish now */
    /* Constrained decoding (p.grammar): the compiled grammar (a reference in the loop's
     * registry, taken at admission) and the output's state, advanced by each token — by the
     * compute thread while in_step, else by the loop. NULL without a grammar. */
    kvf_grammar_t *gram;
    struct kvf_grammar_state *gst;
};

enum { STEP_IDLE = 0, STEP_GO = 1, STEP_DONE = 2 };

/* One prefill worker this decode worker writes grants to: peer id = its index. */
struct dpeer {
    char host[KVF_PREFILL_HOST_MAX];
    uint16_t port;
    kvf_conn_t *conn;
    bool failed, hello_ok;
    bool configured; /* added by the decode's own configuration: kept */
    bool named;      /* named by a live router (set_router_prefills) */
    bool retired;    /* neither: fenced, never dialled, its slot free once closed */
    uint32_t epoch;  /* the pool epoch the connection was opened at */
    uint64_t next_connect_ms;
    uint64_t hello_deadline_ms;    /* a connection without the prefill's HELLO by then is dropped */
    uint32_t failures;             /* attempts since the last HELLO: the retry backs off */
    uint64_t granted;              /* prompts granted to it so far */
    char why[KVF_PREFILL_WHY_MAX]; /* why it is not in use ("" when it is, or unknown yet) */
};

/* One sequence's result of a step, written by the compute thread. */
struct step_out {
    int tok; /* the token, or a negative code */
    float lp;
    uint32_t n_top;
    int32_t ids[KVF_GEN_MAX_LOGPROBS];
    float lps[KVF_GEN_MAX_LOGPROBS];
};

struct kvf_dworker {
    struct kvf_worker_config cfg;
    pthread_t thread;
    bool started;
    bool done; /* manual mode: the last turn found the worker stopped and empty */
    volatile int stop;
    int wake_fd;
    kvf_pool_t *pool;
    kvf_decode_t *d;
    kvf_fwd_t *fwd;
    kvf_xport_t *x;
    uint32_t n_vocab, seq_pages;
    struct kvf_pool_geometry geo;
    /* Router side, under mu. */
    pthread_mutex_t mu;
    struct kvf_gen *inbox_head, *inbox_tail;
    uint32_t n_waiting; /* inbox + pending, for the queue bound */
    bool closing;       /* no more submits */
    struct kvf_engine_info info;
    uint64_t req_hi, next_req;
    struct {
        char host[KVF_PREFILL_HOST_MAX];
        uint16_t port;
    } adds[KVF_DECODE_MAX_PREFILLS];
    uint32_t n_adds; /* prefill workers to add (kvf_dworker_add_prefill) */
    struct kvf_prefill_addr named[KVF_DECODE_MAX_PREFILLS]; /* the live routers' names */
    uint32_t n_named;
    bool named_dirty; /* set_router_prefills since the loop last took them */
    struct kvf_prefill_status status[KVF_DECODE_MAX_PREFILLS]; /* published by the loop */
    uint32_t n_status;
    int notify_fd; /* eventfd written on every event pushed to a handle, once notify_on */
    bool notify_on;
    /* Loop side. */
    struct kvf_gen *pending_head, *pending_tail;
    struct kvf_gen **live; /* [max_reqs]: submitted or running */
    struct dpeer peers[KVF_DECODE_MAX_PREFILLS];
    uint32_t n_peers;
    uint64_t next_tick_ms;
    uint64_t rejected_before_handoff;
    uint64_t foreign_tails;  /* committed prompts whose last page carried bytes it did not write */
    uint64_t decoded_tokens; /* tokens the decode steps produced */
    struct kvf_actions acts;
    bool in_actions; /* run_actions is executing the list (a nested call only appends) */
    struct kvf_msg_scratch scratch;
    uint8_t *frame;
    struct pframe {
        uint8_t *buf;
        size_t len;
        uint16_t peer;
        struct pframe *next;
    } * frames_head, *frames_tail;
    /* DONEs being hashed in slices, oldest first: the frame, and the hashes so far. */
    struct pverify {
        uint16_t peer;
        uint8_t *frame;
        size_t len;
        uint64_t *hashes;
        uint32_t done, n;
        struct pverify *next;
    } * verify_head, *verify_tail;
    uint64_t hash_slices; /* counter: slices hashed off the message path */
    uint64_t bad_frames;  /* counter: control frames that did not decode */
    struct kvf_fwd_seq *seqs;
    struct kvf_gen **batch;
    float *logits;             /* [max_batch][n_vocab] */
    struct step_out *step_out; /* [max_batch] */
    /* The compute thread, and the step it is lent (under cmu). */
    pthread_t compute;
    bool compute_started, compute_quit, stepping;
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    int step_state;
    uint32_t step_n;
    void *sample_scratch;      /* kvf_sample_scratch_bytes(n_vocab): sampling allocates nothing */
    struct kvf__gram_reg greg; /* the loop's: the grammars of live requests */
    float *gbuf;               /* [n_vocab]: the compute thread's masked logits */
#if defined(KVF_TEST_BUILD)
    /* KVF_TEST_STEP_MS=N (test builds): each decode step lasts at least N ms more, as on a busy
     * machine, so that requests keep running while the isolation suite's late writes land. */
    uint32_t test_step_ms;
    bool test_audit_tail;    /* KVF_TEST_AUDIT_TAIL: audit_tail at each commit */
    uint16_t test_done_peer; /* the peer the DONE run_actions is given came from */
#endif
    struct kvf_gen_prov prov_scratch; /* record_prov's room (the loop's) */
    bool test_unverified; /* KVF_TEST_UNVERIFIED: no tail check on arrival (set in test builds only)
                           */
};

/* The loop's clock is the transport's: real time on the fabric, simulated time in the simulator
 * (before the transport exists and after it is gone — start and teardown — the process's). */
static uint64_t now_ms(const struct kvf_dworker *w)
{
    return w->x ? kvf_xport_now_ms(w->x) : kvf__now_ms();
}

/* --- Handles (any thread; the handle itself is gen.c's). ------------------------------------ */

static void gen_push(struct kvf_gen *g, const struct kvf_gen_event *ev)
{
    kvf__evq_push(&g->q, ev);
}

/* Puts g in the inbox (kvf__gen_admit_fn), unless the worker is closing or its queue is full. */
static int gen_admit(void *e, struct kvf_gen *g)
{
    struct kvf_dworker *w = e;
    const struct kvf_gen_params *p = &g->p;
    if (g->p.ignore_eos) g->p.n_stop_ids = 0;
    kvf__msg_sampling_of(p, &g->sampling);
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    if (w->closing)
        rc = -ESHUTDOWN;
    else if (w->n_waiting >= w->cfg.max_queue)
        rc = -EAGAIN;
    if (rc == 0) {
        g->q.notify_fd = w->notify_on ? w->notify_fd : -1;
        g->req = (kvf_req_id_t){++w->next_req, w->req_hi};
        kvf__gen_enqueue(&w->inbox_head, &w->inbox_tail, g, now_ms(w));
        w->n_waiting++;
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static int gen_submit(void *e, const struct kvf_gen_params *p, kvf_gen_t **out)
{
    struct kvf_dworker *w = e;
    return kvf__gen_submit(p, w->n_vocab, w->cfg.max_context, sizeof(struct kvf_gen), gen_admit, w,
                           w->wake_fd, out);
}

static void gen_info(void *e, struct kvf_engine_info *out)
{
    struct kvf_dworker *w = e;
    pthread_mutex_lock(&w->mu);
    *out = w->info;
    pthread_mutex_unlock(&w->mu);
}

const struct kvf_gen_ops kvf_dworker_gen_ops = {
    gen_submit, kvf__gen_next, kvf__gen_cancel, kvf__gen_release, gen_info, NULL, kvf__gen_prov};

/* --- Loop side: ending requests. ------------------------------------------------------------- */

static int live_index(struct kvf_dworker *w, kvf_req_id_t req)
{
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++)
        if (w->live[i] && kvf_req_id_eq(w->live[i]->req, req)) return (int)i;
    return -1;
}

/* END for g, and the loop lets go of it. */
static void end_gen(struct kvf_dworker *w, struct kvf_gen *g, int err, bool stopped)
{
    struct kvf_gen_event ev = {.kind = KVF_GEN_END, .err = err, .stopped = stopped};
    gen_push(g, &ev);
    if (g->gram) kvf__gram_put(&w->greg, g->gram);
    free(g->gst);
    g->gram = NULL;
    g->gst = NULL;
    int i = live_index(w, g->req);
    if (i >= 0) w->live[i] = NULL;
    g->state = G_ENDED;
    kvf__gen_unref(g);
}

/* Compiles (or finds) g's grammar and sets its start state: 0, or a negative code (-EINVAL: the
 * grammar does not compile — the router compiled it before submitting, so only a peer that
 * skipped that sends one; KVF_E_MODEL_UNSUPPORTED: this worker has no vocabulary for grammars). */
static int start_grammar(struct kvf_dworker *w, struct kvf_gen *g)
{
    if (!w->cfg.grammar_vocab) return KVF_E_MODEL_UNSUPPORTED;
    g->gst = malloc(sizeof *g->gst);
    if (!g->gst) return -ENOMEM;
    int rc = kvf__gram_get(&w->greg, g->p.grammar, g->p.n_grammar, &g->gram);
    if (rc < 0) {
        free(g->gst);
        g->gst = NULL;
        g->gram = NULL;
        return rc == -EBUSY ? -EAGAIN : rc;
    }
    kvf_grammar_state_init(g->gram, g->gst);
    return 0;
}

/* Feeds token tok to g's grammar state (nothing for a stop id, which ends the output): 0, or
 * -EINVAL when tok leaves the grammar (a prefill that drew the first token without it). */
static int grammar_feed(const struct kvf_dworker *w, struct kvf_gen *g, int32_t tok)
{
    if (!g->gram) return 0;
    for (uint32_t k = 0; k < g->p.n_stop_ids; k++)
        if (g->p.stop_ids[k] == tok) return 0;
    return kvf_grammar_state_advance(g->gram, w->cfg.grammar_vocab, g->gst, tok);
}

static void push_token(struct kvf_gen *g, int32_t tok, float lp, uint32_t n_top, const int32_t *ids,
                       const float *lps)
{
    struct kvf_gen_event ev = {.kind = KVF_GEN_TOKEN, .token = tok, .logprob = lp, .n_top = n_top};
    for (uint32_t k = 0; k < n_top && k < KVF_GEN_MAX_LOGPROBS; k++) {
        ev.top_ids[k] = ids[k];
        ev.top_logprobs[k] = lps[k];
    }
    gen_push(g, &ev);
}

static bool is_stop(const struct kvf_gen *g, int32_t tok)
{
    for (uint32_t i = 0; i < g->p.n_stop_ids; i++)
        if (g->p.stop_ids[i] == tok) return true;
    return false;
}

static void run_actions(struct kvf_dworker *w, const struct kvf_msg *done);

/* After a token: a stop id or max_tokens ends the request (pages released by the machine). */
static void after_token(struct kvf_dworker *w, struct kvf_gen *g, int32_t tok)
{
    bool stop = is_stop(g, tok);
    if (!stop && g->n_out < g->p.max_tokens) return;
    kvf_decode_finish(w->d, now_ms(w), g->req, &w->acts);
    run_actions(w, NULL);
    end_gen(w, g, 0, stop);
}

/* --- Loop side: the machine's actions. ------------------------------------------------------- */

static void fence(struct kvf_dworker *w, struct kvf_peer_epoch pe)
{
    uint32_t cur = 0;
    if (kvf_pool_peer_epoch(w->pool, pe.peer, &cur) < 0 || cur != pe.epoch)
        return; /* done already */
    struct dpeer *p = pe.peer < w->n_peers ? &w->peers[pe.peer] : NULL;
    if (p && p->conn && p->epoch == pe.epoch) {
        /* The fence: a forced close in peer-error mode; after it returns the peer can no longer
         * write the pool through this endpoint (docs/PROTOCOL.md, "Fences"). */
        kvf_conn_close(p->conn);
        p->conn = NULL;
        p->hello_ok = false;
        p->failed = false;
        p->next_connect_ms = now_ms(w) + DW_RECONNECT_MS;
    }
    kvf_decode_peer_fenced(w->d, now_ms(w), pe, &w->acts);
}

/*
 * No byte of another request travels (ARCHITECTURE.md): the prefill zeroes the slots of a
 * prompt's last page that the prompt did not fill before it writes the page whole. Checked here
 * on arrival, after the commit verified the page's checksum: every byte of those slots is zero.
 * O(unfilled slots of one page).
 */
static bool tail_is_clean(struct kvf_dworker *w, const struct kvf_gen *g)
{
    uint32_t pt = w->geo.page_tokens, last = (g->p.n_prompt - 1) / pt;
    uint32_t fill = g->p.n_prompt - last * pt;
    if (fill == pt) return true;
    const struct kvf_page_ref *pages;
    uint32_t n_pages;
    if (kvf_decode_pages(w->d, g->req, &pages, &n_pages) < 0 || last >= n_pages) return false;
    const uint8_t *page = kvf_pool_page_data(w->pool, pages[last].page);
    size_t row = kvf_geo_block_bytes(&w->geo) / pt;
    for (uint32_t l = 0; l < w->geo.n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *p = page + kvf_geo_kv_offset(&w->geo, l, kv) + (size_t)fill * row;
            for (size_t i = 0; i < (size_t)(pt - fill) * row; i++)
                if (p[i]) return false;
        }
    return true;
}

#if defined(KVF_TEST_BUILD)
/*
 * KVF_TEST_AUDIT_TAIL=1 (test builds): what the unwritten slots of a committed prompt's last page
 * hold, read before the tail check as layer 0's V rows — for each slot whose largest V coordinate
 * is above 1/4, that coordinate — logged as one "test audit:" line (kvf_log). The readable
 * 'hist' model keeps word j's value at coordinate 256 + j and nothing elsewhere, so the isolation
 * suite reads there the words of whatever request's bytes travelled with the prompt
 * (docs/ISOLATION.md). Zeroed slots, and poison (negative halves), print nothing.
 * O(unfilled slots × K/V width).
 */
static void audit_tail(struct kvf_dworker *w, const struct kvf_gen *g)
{
    uint32_t pt = w->geo.page_tokens, last = (g->p.n_prompt - 1) / pt;
    uint32_t fill = g->p.n_prompt - last * pt;
    const struct kvf_page_ref *pages;
    uint32_t n_pages;
    if (fill == pt || kvf_decode_pages(w->d, g->req, &pages, &n_pages) < 0 || last >= n_pages)
        return;
    const uint8_t *v0 =
        kvf_pool_page_data(w->pool, pages[last].page) + kvf_geo_kv_offset(&w->geo, 0, 1);
    size_t row = kvf_geo_block_bytes(&w->geo) / pt;
    uint32_t width = w->geo.n_kv_heads * w->geo.head_dim, found = 0;
    char at[256] = "", coords[512] = "";
    size_t len = 0, clen = 0;
    for (uint32_t slot = fill; slot < pt; slot++) {
        const uint8_t *r = v0 + (size_t)slot * row;
        float best = 0.25f;
        int64_t where = -1;
        for (uint32_t e = 0; e < width; e++) {
            float x = w->geo.elem_bytes == 2
                          ? kvf_fp16_to_f32(((const uint16_t *)(const void *)r)[e])
                          : ((const float *)(const void *)r)[e];
            if (x > best) { /* NaN never is */
                best = x;
                where = e;
            }
        }
        if (where < 0) continue;
        found++;
        int k =
            len < sizeof at ? snprintf(at + len, sizeof at - len, " %lld", (long long)where) : 0;
        if (k > 0) len += (size_t)k;
        /* The event's list: whole numbers only, the first that does not fit ends it. */
        if (clen < sizeof coords) {
            k = snprintf(coords + clen, sizeof coords - clen, "%s%lld", clen ? "," : "",
                         (long long)where);
            if (k > 0 && clen + (size_t)k < sizeof coords)
                clen += (size_t)k;
            else {
                coords[clen] = '\0';
                clen = sizeof coords;
            }
        }
    }
    if (found)
        kvf_log(KVF_LOG_WARN,
                "kvfence decode: test audit: %u of %u unwritten slots of a committed prompt's last "
                "page hold values, largest at coordinates%s\n",
                found, pt - fill, at);
    if (found)
        kvf__test_event("audit_tail", ",\"found\":%u,\"unwritten\":%u,\"coords\":[%s]", found,
                        pt - fill, coords);
}
#endif

/*
 * The provenance of g, whose handoff was just verified and committed (done: the DONE that was
 * verified; NULL for a test build's unverified commit): kept on the handle for the seam's prov,
 * and logged when cfg.log_commits (one line per 12 pages, each line whole). O(prompt pages).
 */
static void record_prov(struct kvf_dworker *w, struct kvf_gen *g, const struct kvf_msg *done)
{
    struct kvf_gen_prov *pv = &w->prov_scratch;
    memset(pv, 0, sizeof *pv);
    if (done && (done->type != KVF_MSG_DONE || !kvf_req_id_eq(done->req, g->req)))
        done = NULL; /* not this request's DONE: nothing of it is claimed */
    const struct dpeer *p = g->peer < w->n_peers ? &w->peers[g->peer] : NULL;
    pv->decode_id = w->req_hi;
    pv->req_lo = g->req.lo;
    pv->req_hi = g->req.hi;
    if (p) snprintf(pv->prefill_addr, sizeof pv->prefill_addr, "%s:%u", p->host, p->port);
    pv->prefill_peer = g->peer;
    /* The DONE's epoch: the machine commits only at the grant's writer epoch. */
    pv->writer_epoch = done ? done->epoch : p ? p->epoch : 0;
    pv->grant_nonce = done ? done->nonce : 0;
    pv->tenant = g->p.tenant;
    pv->tokens_granted = g->p.n_prompt;
    pv->tokens_verified = done ? done->u.done.tokens_written : 0;
    pv->verified = done && !w->test_unverified;
    const struct kvf_page_ref *pages = NULL;
    uint32_t n = 0;
    if (kvf_decode_pages(w->d, g->req, &pages, &n) < 0) n = 0;
    if (done && done->u.done.n_pages < n) n = done->u.done.n_pages; /* the prompt's pages */
    kvf__prov_pages(pv, pages, done ? done->u.done.checksums : NULL, n);
    kvf__gen_set_prov(g, pv);
    if (!w->cfg.log_commits) return;
    for (uint32_t i = 0; i == 0 || i < n; i += 12) {
        char list[12 * 64] = "";
        size_t used = 0;
        for (uint32_t k = i; k < n && k < i + 12 && used < sizeof list; k++)
            used += (size_t)snprintf(list + used, sizeof list - used, " %u:%016llx:%016llx",
                                     pages[k].page, (unsigned long long)pages[k].tag,
                                     (unsigned long long)(done ? done->u.done.checksums[k] : 0));
        kvf_log(KVF_LOG_INFO,
                "kvfence decode: commit decode=%016llx req=%016llx%016llx prefill=%s peer=%u "
                "epoch=%u nonce=%016llx tenant=%u tokens=%u/%u verified=%d pages=%u digest=%016llx "
                "from=%u page:tag:checksum%s",
                (unsigned long long)pv->decode_id, (unsigned long long)pv->req_hi,
                (unsigned long long)pv->req_lo, pv->prefill_addr, pv->prefill_peer,
                pv->writer_epoch, (unsigned long long)pv->grant_nonce, pv->tenant,
                pv->tokens_verified, pv->tokens_granted, pv->verified, n,
                (unsigned long long)pv->pages_digest, i, list);
    }
}

static void run_actions(struct kvf_dworker *w, const struct kvf_msg *done)
{
    if (w->in_actions) return; /* the running loop below picks up what a nested call appended */
    w->in_actions = true;
    for (uint32_t i = 0; i < w->acts.n; i++) {
        struct kvf_action a = w->acts.v[i];
        switch (a.kind) {
        case KVF_ACT_SEND: {
            struct dpeer *p = a.peer < w->n_peers ? &w->peers[a.peer] : NULL;
            if (p && p->conn && !p->failed)
                kvf__send_msg(p->conn, &a.msg, w->frame, KVF_PROTO_MAX_MSG_BYTES);
            break;
        }
        case KVF_ACT_FENCE_PEER:
            fence(w, (struct kvf_peer_epoch){a.peer, a.epoch});
            break;
        case KVF_ACT_DELIVER_FIRST: {
            int li = live_index(w, a.req);
            if (li < 0) break;
            struct kvf_gen *g = w->live[li];
#if defined(KVF_TEST_BUILD)
            if (w->test_audit_tail) audit_tail(w, g);
            /* The writer epoch the commit rests on: the loops simulator checks it was not fenced
             * (its L11). */
            if (done)
                kvf__test_event("commit", ",\"peer\":%u,\"epoch\":%u", w->test_done_peer,
                                done->epoch);
#endif
            if (!w->test_unverified && !tail_is_clean(w, g)) {
                /* Bytes beyond what the prompt wrote travelled with it: they belong to no one
                 * this request may see. Fail it (its pages are freed, scrubbed or poisoned). */
                w->foreign_tails++;
                kvf_decode_cancel(w->d, now_ms(w), g->req, KVF_E_PROTO_TRAILER, &w->acts);
                break;
            }
            record_prov(w, g, done);
            if (grammar_feed(w, g, (int32_t)a.first_token) < 0) {
                kvf_decode_cancel(w->d, now_ms(w), g->req, KVF_E_ENGINE, &w->acts);
                break;
            }
            g->state = G_RUNNING;
            g->n_out = 1;
            g->last = (int32_t)a.first_token;
            if (g->out) g->out[0] = g->last;
            int32_t ids[KVF_GEN_MAX_LOGPROBS];
            uint32_t n_top = 0;
            float lp = 0.0f;
            const float *lps = NULL;
            if (done) {
                lp = done->u.done.first_logprob;
                n_top = done->u.done.n_top;
                for (uint32_t k = 0; k < n_top; k++)
                    ids[k] = (int32_t)done->u.done.top_ids[k];
                lps = done->u.done.top_logprobs;
            }
            push_token(g, g->last, lp, n_top, ids, lps);
            after_token(w, g, g->last);
            break;
        }
        case KVF_ACT_FAIL_REQ: {
            int li = live_index(w, a.req);
            /* A prefill's REJECT of a granted prompt: the prompt was within the limit (checked
             * at submit, the same limit on every worker), so the worker could not take it (its
             * engine or memory failed): a worker's failure, never the client's 400. */
            if (li >= 0)
                end_gen(w, w->live[li], a.err == KVF_E_PROTO_REJECTED ? KVF_E_PROTO_FAILED : a.err,
                        false);
            break;
        }
        default:
            break;
        }
    }
    w->acts.n = 0;
    w->in_actions = false;
}

/* --- Loop side: the connections to the prefill workers. ------------------------------------- */

static int peer_of(const struct kvf_dworker *w, const kvf_conn_t *c)
{
    for (uint32_t i = 0; i < w->n_peers; i++)
        if (w->peers[i].conn == c) return (int)i;
    return -1;
}

static void on_frame(void *ctx, kvf_conn_t *c, const uint8_t *buf, size_t len)
{
    struct kvf_dworker *w = ctx;
    int peer = peer_of(w, c);
    if (peer < 0) return;
    struct pframe *f = malloc(sizeof(*f));
    if (!f || !(f->buf = malloc(len ? len : 1))) {
        free(f);
        return; /* lost, as on a lossy network: the protocol's timers cover it */
    }
    memcpy(f->buf, buf, len);
    f->len = len;
    f->peer = (uint16_t)peer;
    f->next = NULL;
    if (w->frames_tail)
        w->frames_tail->next = f;
    else
        w->frames_head = f;
    w->frames_tail = f;
}

static void on_error(void *ctx, kvf_conn_t *c, int err)
{
    struct kvf_dworker *w = ctx;
    (void)err;
    int peer = peer_of(w, c);
    if (peer >= 0) w->peers[peer].failed = true;
}

static void hello(struct kvf_dworker *w, struct kvf_msg_hello *h)
{
    *h = (struct kvf_msg_hello){w->cfg.model_fp, w->geo, w->cfg.max_context,
                                w->seq_pages,    0,      KVF_ROLE_DECODE};
}

static void handle_frame(struct kvf_dworker *w, uint16_t peer, const uint8_t *buf, size_t len)
{
    struct dpeer *p = &w->peers[peer];
    struct kvf_msg m;
    long n = kvf_msg_decode(buf, len, &m, &w->scratch);
    if (n != (long)len) {
        w->bad_frames++; /* does not decode: counted and dropped, never trusted */
        return;
    }
    uint64_t now = now_ms(w);
    if (m.type == KVF_MSG_HELLO) {
        struct kvf_msg_hello mine;
        hello(w, &mine);
        char why[KVF_PREFILL_WHY_MAX - 64];
        if (m.u.hello.role != KVF_ROLE_PREFILL)
            snprintf(why, sizeof why, "not a prefill worker (role %u)", (unsigned)m.u.hello.role);
        else if (kvf__hello_mismatch(&mine, &m.u.hello, why, sizeof why) == 0 &&
                 m.epoch != p->epoch)
            snprintf(why, sizeof why, "answered for epoch %u, not %u", m.epoch, p->epoch);
        if (why[0]) {
            char full[KVF_PREFILL_WHY_MAX + 16];
            snprintf(full, sizeof full, "refused: %s", why);
            if (strcmp(full, p->why) != 0)
                kvf_log(KVF_LOG_WARN, "kvfence decode: refusing the prefill worker at %s:%u: %s\n",
                        p->host, p->port, why);
            kvf__strlcpy(p->why, full, sizeof p->why);
            p->failed = true; /* closed, and tried again later (it may be restarted right) */
            return;
        }
        if (kvf_decode_peer_up(w->d, peer, m.epoch) == 0) {
            p->hello_ok = true;
            p->failures = 0;
            p->why[0] = 0;
        }
        return;
    }
    if (!p->hello_ok) return;
    const struct kvf_page_ref *pages;
    uint32_t n_pages;
    if (m.type == KVF_MSG_DONE && kvf_decode_done_pages(w->d, peer, &m, &pages, &n_pages) == 0 &&
        (uint64_t)n_pages * kvf_geo_data_bytes(&w->geo) > w->cfg.hash_slice_bytes) {
        /* A long prompt: hash its pages in slices across loop turns (verify_step), then hand
         * the DONE to the machine with the hashes. */
        struct pverify *v = calloc(1, sizeof(*v));
        if (v && (v->frame = malloc(len)) && (v->hashes = malloc(n_pages * sizeof(uint64_t)))) {
            memcpy(v->frame, buf, len);
            v->len = len;
            v->n = n_pages;
            v->peer = peer;
            if (w->verify_tail)
                w->verify_tail->next = v;
            else
                w->verify_head = v;
            w->verify_tail = v;
            return;
        }
        if (v) free(v->frame);
        free(v); /* out of memory: verified in one call below */
    }
    kvf_decode_on_msg(w->d, now, peer, &m, &w->acts);
#if defined(KVF_TEST_BUILD)
    w->test_done_peer = peer;
#endif
    run_actions(w, m.type == KVF_MSG_DONE ? &m : NULL);
}

/* One slice of the oldest DONE being hashed; when its last page is hashed the machine checks it
 * (against the grant as it is now: a cancel meanwhile makes it a drain proof, or stale). */
static void verify_step(struct kvf_dworker *w)
{
    struct pverify *v = w->verify_head;
    if (!v) return;
    struct kvf_msg m;
    if (kvf_msg_decode(v->frame, v->len, &m, &w->scratch) != (long)v->len) goto drop;
    const struct kvf_page_ref *pages;
    uint32_t n_pages;
    if (kvf_decode_done_pages(w->d, v->peer, &m, &pages, &n_pages) < 0 || n_pages != v->n) {
        /* No longer checked against pages (cancelled, fenced): the machine decides. */
        kvf_decode_on_msg(w->d, now_ms(w), v->peer, &m, &w->acts);
        run_actions(w, NULL);
        goto drop;
    }
    size_t bytes = kvf_geo_data_bytes(&w->geo), budget = 0;
    for (; v->done < v->n && budget < w->cfg.hash_slice_bytes; v->done++, budget += bytes)
        v->hashes[v->done] = XXH3_64bits(kvf_pool_page_data(w->pool, pages[v->done].page), bytes);
    w->hash_slices++;
    if (v->done < v->n) return;
    kvf_decode_on_done_hashed(w->d, now_ms(w), v->peer, &m, v->hashes, &w->acts);
#if defined(KVF_TEST_BUILD)
    w->test_done_peer = v->peer;
#endif
    run_actions(w, &m);
drop:
    w->verify_head = v->next;
    if (!w->verify_head) w->verify_tail = NULL;
    free(v->frame);
    free(v->hashes);
    free(v);
}

static void connect_prefill(struct kvf_dworker *w, uint16_t peer)
{
    struct dpeer *p = &w->peers[peer];
    char err[256] = "";
    uint32_t epoch = 0;
    kvf_pool_peer_epoch(w->pool, peer, &epoch);
    if (kvf_xport_connect(w->x, p->host, p->port, &p->conn, err, sizeof(err)) < 0) {
        p->conn = NULL;
        if (!p->why[0] || strncmp(p->why, "refused", 7) != 0)
            snprintf(p->why, sizeof p->why, "cannot connect: %s", err);
        p->next_connect_ms = now_ms(w) + DW_RECONNECT_MS * 5;
        return;
    }
    p->epoch = epoch;
    p->failed = false;
    p->hello_ok = false;
    p->hello_deadline_ms = now_ms(w) + DW_HELLO_MS;
    struct kvf_msg m = {.type = KVF_MSG_HELLO, .epoch = epoch};
    hello(w, &m.u.hello);
    kvf__send_msg(p->conn, &m, w->frame, KVF_PROTO_MAX_MSG_BYTES);
}

static void conn_lost(struct kvf_dworker *w, uint16_t peer)
{
    struct dpeer *p = &w->peers[peer];
    if (p->hello_ok) {
        snprintf(p->why, sizeof p->why, "connection lost");
    } else if (p->conn && kvf_conn_failed(p->conn) &&
               strstr(kvf_conn_error(p->conn), "authentication")) {
        /* Said once per change: the connection is tried again every few seconds. */
        if (strcmp(p->why, kvf_conn_error(p->conn)) != 0)
            kvf_log(KVF_LOG_WARN, "kvfence decode: not using the prefill worker at %s:%u: %s\n",
                    p->host, p->port, kvf_conn_error(p->conn));
        kvf__strlcpy(p->why, kvf_conn_error(p->conn), sizeof p->why);
    } else if (!p->why[0]) {
        snprintf(p->why, sizeof p->why, "no answer to HELLO within %u ms", DW_HELLO_MS);
    }
    /* Every request granted to the peer fails now (H13); its pages wait for the fence, which
     * this asks for and which run_actions performs: the forced close. */
    kvf_decode_peer_down(w->d, now_ms(w), peer, &w->acts);
    run_actions(w, NULL);
    if (p->conn) {
        /* peer_down asked to fence the current epoch; if it had been fenced already the close
         * still must happen before a new connection. */
        kvf_conn_close(p->conn);
        p->conn = NULL;
        p->hello_ok = false;
    }
    /* Retry with backoff (100 ms doubling to 2 s): a stopped or restarting prefill is not
     * flooded with attempts that would queue up in its listener. */
    uint32_t f = p->failures < 5 ? p->failures : 5;
    p->failures++;
    uint64_t wait = (uint64_t)DW_RECONNECT_MS << f;
    p->next_connect_ms = now_ms(w) + (wait < 2000 ? wait : 2000);
    p->failed = false;
}

/* The slot for host:port: its own if known, else a new one, else a retired one that is closed
 * (its epoch in the pool carries on: the old writer's grants were ended by its fence). NULL when
 * the table is full. */
static struct dpeer *peer_slot(struct kvf_dworker *w, const char *host, uint16_t port)
{
    for (uint32_t k = 0; k < w->n_peers; k++)
        if (w->peers[k].port == port && strcmp(w->peers[k].host, host) == 0) return &w->peers[k];
    struct dpeer *p = NULL;
    if (w->n_peers < KVF_DECODE_MAX_PREFILLS) {
        p = &w->peers[w->n_peers++];
    } else {
        for (uint32_t k = 0; k < w->n_peers && !p; k++)
            if (w->peers[k].retired && !w->peers[k].conn) p = &w->peers[k];
        if (!p) return NULL;
    }
    memset(p, 0, sizeof(*p));
    kvf__strlcpy(p->host, host, sizeof p->host);
    p->port = port;
    p->retired = true; /* until the caller says why it is kept */
    return p;
}

/* Prefill workers added from other threads join the table: the configured ones
 * (kvf_dworker_add_prefill) and the live routers' names (set_router_prefills); a peer that
 * is neither any more is retired — failed now (conn_lost fences it, its requests fail) and never
 * dialled again. */
static void take_adds(struct kvf_dworker *w)
{
    pthread_mutex_lock(&w->mu);
    for (uint32_t i = 0; i < w->n_adds; i++) {
        struct dpeer *p = peer_slot(w, w->adds[i].host, w->adds[i].port);
        if (!p) continue;
        p->configured = true;
        p->retired = false;
    }
    w->n_adds = 0;
    if (w->named_dirty) {
        w->named_dirty = false;
        /* Which known peers are still named; those neither named nor configured retire. */
        for (uint32_t k = 0; k < w->n_peers; k++) {
            struct dpeer *p = &w->peers[k];
            p->named = false;
            for (uint32_t i = 0; i < w->n_named && !p->named; i++)
                p->named = w->named[i].port == p->port && strcmp(w->named[i].host, p->host) == 0;
            if (p->named || p->configured) {
                p->retired = false;
            } else if (!p->retired) {
                p->retired = true;
                if (p->conn) p->failed = true; /* the loop's conn_lost fences it */
                snprintf(p->why, sizeof p->why, "retired: no live router names it");
            }
        }
        /* New names take free slots, or retired ones once their connections are closed. */
        bool closing = false;
        for (uint32_t k = 0; k < w->n_peers; k++)
            closing |= w->peers[k].retired && w->peers[k].conn;
        for (uint32_t i = 0; i < w->n_named; i++) {
            bool known = false;
            for (uint32_t k = 0; k < w->n_peers && !known; k++)
                known = w->peers[k].port == w->named[i].port &&
                        strcmp(w->peers[k].host, w->named[i].host) == 0;
            if (known) continue;
            struct dpeer *p = peer_slot(w, w->named[i].host, w->named[i].port);
            if (!p) {
                if (closing)
                    w->named_dirty = true; /* tried again once the retired slots are closed */
                else
                    kvf_log(KVF_LOG_WARN,
                            "kvfence decode: cannot add the prefill worker %s:%u (at most %d)\n",
                            w->named[i].host, w->named[i].port, KVF_DECODE_MAX_PREFILLS);
                continue;
            }
            p->named = true;
            p->retired = false;
        }
    }
    pthread_mutex_unlock(&w->mu);
}

int kvf_dworker_set_router_prefills(kvf_dworker_t *w, const struct kvf_prefill_addr *named,
                                    uint32_t n)
{
    uint32_t kept = n < KVF_DECODE_MAX_PREFILLS ? n : KVF_DECODE_MAX_PREFILLS;
    pthread_mutex_lock(&w->mu);
    memcpy(w->named, named, kept * sizeof(*named));
    for (uint32_t i = 0; i < kept; i++)
        w->named[i].host[KVF_PREFILL_HOST_MAX - 1] = 0;
    w->n_named = kept;
    w->named_dirty = true;
    pthread_mutex_unlock(&w->mu);
    kvf__wake(w->wake_fd);
    return (int)(n - kept);
}

int kvf_dworker_add_prefill(kvf_dworker_t *w, const char *host, uint16_t port)
{
    if (!host || !*host || strlen(host) >= KVF_PREFILL_HOST_MAX || port == 0) return -EINVAL;
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    uint32_t known = 0;
    for (uint32_t i = 0; i < w->n_status; i++)
        if (w->status[i].port == port && strcmp(w->status[i].host, host) == 0) known = 1;
    if (!known) {
        if (w->n_status + w->n_adds >= KVF_DECODE_MAX_PREFILLS) {
            rc = -ENOSPC;
        } else {
            kvf__strlcpy(w->adds[w->n_adds].host, host, KVF_PREFILL_HOST_MAX);
            w->adds[w->n_adds].port = port;
            w->n_adds++;
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (rc == 0) kvf__wake(w->wake_fd);
    return rc;
}

size_t kvf_dworker_prefills(kvf_dworker_t *w, struct kvf_prefill_status *out, size_t max)
{
    pthread_mutex_lock(&w->mu);
    size_t n = w->n_status < max ? w->n_status : max;
    memcpy(out, w->status, n * sizeof(*out));
    pthread_mutex_unlock(&w->mu);
    return n;
}

int kvf_dworker_notify_fd(kvf_dworker_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->notify_on = true;
    pthread_mutex_unlock(&w->mu);
    return w->notify_fd;
}

/* --- Loop side: admission and the decode step. ----------------------------------------------- */

static void take_inbox(struct kvf_dworker *w)
{
    pthread_mutex_lock(&w->mu);
    struct kvf_gen *g = w->inbox_head;
    w->inbox_head = w->inbox_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (g) {
        struct kvf_gen *next = g->next;
        g->next = NULL;
        g->state = G_PENDING;
        if (w->pending_tail)
            w->pending_tail->next = g;
        else
            w->pending_head = g;
        w->pending_tail = g;
        g = next;
    }
}

static uint32_t pages_for(const struct kvf_dworker *w, uint64_t tokens)
{
    return (uint32_t)((tokens + w->geo.page_tokens - 1) / w->geo.page_tokens);
}

/* Moves pending requests into the machine, oldest first, while a slot, the pages for prompt +
 * max_tokens and a live prefill are there. A request that waits past admit_timeout_ms fails,
 * saying what it waited for: -EBUSY (a prefill was connected: the pages or a slot never came
 * free) or KVF_E_ENGINE_NO_PREFILL (no prefill worker connected then); a cancelled one ends at
 * once — nothing of it moved yet. */
static void admit(struct kvf_dworker *w)
{
    uint64_t now = now_ms(w);
    /* The prefill for the next request: of the live ones, the one with the fewest prompts
     * granted and not yet delivered (its queue). */
    uint32_t granted[KVF_DECODE_MAX_PREFILLS] = {0};
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++)
        if (w->live[i] && w->live[i]->state == G_SUBMITTED && w->live[i]->peer < w->n_peers)
            granted[w->live[i]->peer]++;
    int best = -1;
    bool any_up = false;
    for (uint32_t i = 0; i < w->n_peers; i++) {
        if (!w->peers[i].hello_ok) continue;
        any_up = true;
        if (best < 0 || granted[i] < granted[best]) best = (int)i;
    }
    struct kvf_gen **pp = &w->pending_head, *prev = NULL;
    while (*pp) {
        struct kvf_gen *g = *pp;
        int end_err = 0;
        bool go = false;
        if (kvf__gen_cancelled(g))
            end_err = KVF_E_PROTO_CANCELLED;
        else if (w->stop)
            end_err = -ESHUTDOWN;
        else if (now - g->since_ms > w->cfg.admit_timeout_ms)
            end_err = any_up ? -EBUSY : KVF_E_ENGINE_NO_PREFILL;
        else if (best >= 0 && kvf_pool_available(w->pool) >=
                                  pages_for(w, (uint64_t)g->p.n_prompt + g->p.max_tokens))
            go = true;
        if (!end_err && !go) {
            /* FIFO: a request that cannot go holds back those behind it (no starvation). */
            break;
        }
        *pp = g->next;
        if (w->pending_tail == g) w->pending_tail = prev;
        g->next = NULL;
        pthread_mutex_lock(&w->mu);
        w->n_waiting--;
        pthread_mutex_unlock(&w->mu);
        if (end_err) {
            w->rejected_before_handoff++;
            end_gen(w, g, end_err, false);
            continue;
        }
        if (g->p.n_grammar && !g->gram) {
            int grc = start_grammar(w, g);
            if (grc < 0) {
                w->rejected_before_handoff++;
                end_gen(w, g, grc, false);
                continue;
            }
        }
        int slot = -1;
        for (uint32_t i = 0; i < w->cfg.max_reqs && slot < 0; i++)
            if (!w->live[i]) slot = (int)i;
        if (slot < 0) {
            /* No slot: back to the head of the queue. */
            g->next = w->pending_head;
            w->pending_head = g;
            if (!w->pending_tail) w->pending_tail = g;
            pthread_mutex_lock(&w->mu);
            w->n_waiting++;
            pthread_mutex_unlock(&w->mu);
            break;
        }
        w->live[slot] = g;
        g->state = G_SUBMITTED;
        struct kvf_msg_new nreq = {
            g->p.tenant, g->p.n_prompt, g->p.max_tokens, g->p.n_prompt, (const uint32_t *)g->prompt,
            g->sampling};
        g->peer = (uint16_t)best;
        int rc = kvf_decode_submit(w->d, now, g->req, &nreq, g->peer, &w->acts);
        if (rc < 0) {
            w->live[slot] = NULL;
            end_gen(w, g, rc, false);
        } else {
            run_actions(w, NULL);
            w->peers[best].granted++;
            granted[best]++;
            for (uint32_t i = 0; i < w->n_peers; i++)
                if (w->peers[i].hello_ok && granted[i] < granted[best]) best = (int)i;
        }
    }
}

static void handle_cancels(struct kvf_dworker *w)
{
    /* The broken server ignore_cancel (test builds; docs/MUTANTS.md, "Broken servers"): a client's
     * cancel is never acted on, so its request prefills and decodes to the end (the worker's stop
     * still ends it), to show which suites a server that ignores disconnects cannot pass. */
    const bool ignore = KVF_MUTANT(IGNORE_CANCEL);
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++) {
        struct kvf_gen *g = w->live[i];
        if (!g || g->in_step || ((ignore || !kvf__gen_cancelled(g)) && !w->stop)) continue;
        kvf_decode_cancel(w->d, now_ms(w), g->req, KVF_E_PROTO_CANCELLED, &w->acts);
        run_actions(w, NULL);
    }
}

/*
 * One decode step: every running sequence advances one token, in three parts. The loop thread
 * checks the batch and grows page tables (start_step, kvf_fwd_prepare), the compute thread runs
 * the math and draws the tokens (compute_main, kvf_fwd_compute) while the loop goes on handling
 * messages — a cancel or a finish of a sequence in the batch waits for the step's end (in_step),
 * so no page is freed while the step reads or writes it — and the loop raises the fills and
 * streams the tokens (finish_step, kvf_fwd_commit).
 */
static bool start_step(struct kvf_dworker *w)
{
    uint32_t n = 0, pt = w->geo.page_tokens;
    for (uint32_t i = 0; i < w->cfg.max_reqs && n < w->cfg.max_batch; i++) {
        struct kvf_gen *g = w->live[i];
        if (!g || g->state != G_RUNNING) continue;
        uint32_t pos = g->p.n_prompt + g->n_out - 1;
        const struct kvf_page_ref *pages;
        uint32_t n_pages;
        kvf_decode_pages(w->d, g->req, &pages, &n_pages);
        if (pos / pt >= n_pages) {
            int rc = kvf_decode_grow(w->d, g->req, NULL);
            if (rc < 0) {
                kvf_decode_cancel(w->d, now_ms(w), g->req, rc, &w->acts);
                run_actions(w, NULL);
                continue;
            }
            kvf_decode_pages(w->d, g->req, &pages, &n_pages);
        }
        w->batch[n] = g;
        w->seqs[n] = (struct kvf_fwd_seq){
            g->req, &g->last, 1, pos, pages, n_pages, w->logits + (size_t)n * w->n_vocab, 0};
        n++;
    }
    if (n == 0) return false;
    int rc = kvf_fwd_prepare(w->fwd, w->pool, w->seqs, n);
    if (rc < 0) {
        for (uint32_t i = 0; i < n; i++) {
            kvf_decode_cancel(w->d, now_ms(w), w->batch[i]->req, rc, &w->acts);
            run_actions(w, NULL);
        }
        return false;
    }
    for (uint32_t i = 0; i < n; i++)
        w->batch[i]->in_step = true;
    pthread_mutex_lock(&w->cmu);
    w->step_n = n;
    w->step_state = STEP_GO;
    pthread_cond_broadcast(&w->ccv);
    pthread_mutex_unlock(&w->cmu);
    w->stepping = true;
    return true;
}

/* The step's math and its tokens (the compute thread's part; in manual mode the caller's). */
static void compute_step(struct kvf_dworker *w, uint32_t n)
{
    kvf__compute_enter(&w->cfg);
    kvf_fwd_compute(w->fwd);
    kvf__compute_leave(&w->cfg);
#if defined(KVF_TEST_BUILD)
    if (w->test_step_ms) usleep(w->test_step_ms * 1000u);
#endif
    /* Draw the tokens here too: sampling reads only the logits and the request's fixed
     * parameters and output index, which the loop leaves alone for the batch's requests. */
    for (uint32_t i = 0; i < n; i++) {
        struct step_out *o = &w->step_out[i];
        struct kvf_gen *g = w->batch[i];
        struct kvf_sample_hist h = {g->prompt, g->p.n_prompt, g->out, g->out ? g->n_out : 0};
        struct kvf__constraint c = {g->gram,       w->cfg.grammar_vocab, g->gst,
                                    g->p.stop_ids, g->p.n_stop_ids,      w->gbuf};
        o->tok = w->seqs[i].status != 0
                     ? w->seqs[i].status
                     : kvf__sample_token(w->seqs[i].logits, w->n_vocab, &g->sampling,
                                         g->gram ? &c : NULL, &h, g->n_out, w->sample_scratch,
                                         &o->lp, &o->n_top, o->ids, o->lps);
        if (o->tok >= 0 && grammar_feed(w, g, o->tok) < 0) o->tok = KVF_E_ENGINE;
    }
    pthread_mutex_lock(&w->cmu);
    w->step_state = STEP_DONE;
    pthread_mutex_unlock(&w->cmu);
}

static void *compute_main(void *arg)
{
    struct kvf_dworker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->cmu);
        while (w->step_state != STEP_GO && !w->compute_quit)
            pthread_cond_wait(&w->ccv, &w->cmu);
        bool quit = w->compute_quit && w->step_state != STEP_GO;
        uint32_t n = w->step_n;
        pthread_mutex_unlock(&w->cmu);
        if (quit) return NULL;
        compute_step(w, n);
        kvf__wake(w->wake_fd);
    }
}

/* The step's end, when the compute thread finished: fills, then every sequence's token. */
static void finish_step(struct kvf_dworker *w)
{
    pthread_mutex_lock(&w->cmu);
    bool done = w->step_state == STEP_DONE;
    pthread_mutex_unlock(&w->cmu);
    if (!done) return;
    kvf_fwd_commit(w->fwd, w->pool);
    uint32_t n = w->step_n;
    pthread_mutex_lock(&w->cmu);
    w->step_state = STEP_IDLE;
    pthread_mutex_unlock(&w->cmu);
    w->stepping = false;
    for (uint32_t i = 0; i < n; i++) {
        struct kvf_gen *g = w->batch[i];
        struct step_out *o = &w->step_out[i];
        g->in_step = false;
        if (o->tok < 0) {
            kvf_decode_cancel(w->d, now_ms(w), g->req, o->tok, &w->acts);
            run_actions(w, NULL);
            continue;
        }
        g->last = o->tok;
        if (g->out && g->n_out < g->p.max_tokens) g->out[g->n_out] = o->tok;
        g->n_out++;
        w->decoded_tokens++;
        push_token(g, o->tok, o->lp, o->n_top, o->ids, o->lps);
        after_token(w, g, o->tok);
    }
}

static void publish_info(struct kvf_dworker *w)
{
    struct kvf_pool_stats ps;
    struct kvf_decode_stats ds;
    kvf_pool_stats(w->pool, &ps);
    kvf_decode_stats(w->d, &ds);
    uint32_t running = 0;
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++)
        if (w->live[i]) running++;
    pthread_mutex_lock(&w->mu);
    struct kvf_engine_info *in = &w->info;
    in->decode_pages = ps.n_pages;
    in->decode_free = ps.by_state[KVF_PAGE_FREE];
    in->decode_reserved = ps.reserved;
    for (int s = 0; s < KVF_PAGE__NSTATES; s++)
        in->decode_by_state[s] = ps.by_state[s];
    in->queued = w->n_waiting;
    in->running = running;
    in->prefills = 0;
    in->prefills_up = 0;
    w->n_status = 0;
    for (uint32_t i = 0; i < w->n_peers; i++) {
        const struct dpeer *p = &w->peers[i];
        if (p->retired) continue;
        in->prefills++;
        in->prefills_up += p->hello_ok;
        struct kvf_prefill_status *st = &w->status[w->n_status++];
        kvf__strlcpy(st->host, p->host, sizeof st->host);
        st->port = p->port;
        st->up = p->hello_ok;
        st->granted = p->granted;
        kvf__strlcpy(st->why, p->hello_ok ? "" : p->why[0] ? p->why : "connecting", sizeof st->why);
    }
    in->prefill_up = in->prefills_up > 0;
    in->fences = ps.fences;
    in->holds = ps.holds;
    in->quarantines = ps.quarantines;
    in->committed = ds.committed;
    in->failed = ds.failed;
    in->verify_failed = ds.verify_failed;
    in->verify_count = ds.verify_count;
    in->verify_trailer = ds.verify_trailer;
    in->verify_checksum = ds.verify_checksum;
    in->stale_msgs = ds.stale;
    in->rejected_before_handoff = ds.rejected + w->rejected_before_handoff;
    in->foreign_tails = w->foreign_tails;
    in->decoded_tokens = w->decoded_tokens;
    in->hash_slices = w->hash_slices;
    in->bad_frames = w->bad_frames;
    pthread_mutex_unlock(&w->mu);
}

static bool any_live(const struct kvf_dworker *w)
{
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++)
        if (w->live[i]) return true;
    return false;
}

/* One turn of the loop: everything ready now, without waiting. Returns true once the worker
 * stopped and nothing is left; *may_sleep says whether the loop may sleep on the transport. */
static bool turn(struct kvf_dworker *w, bool *may_sleep)
{
    uint64_t now = now_ms(w);
    take_adds(w);
    for (uint16_t i = 0; i < w->n_peers; i++)
        if (!w->peers[i].conn && !w->peers[i].retired && now >= w->peers[i].next_connect_ms &&
            !w->stop)
            connect_prefill(w, i);
    kvf_xport_progress(w->x);
    while (w->frames_head) {
        struct pframe *f = w->frames_head;
        w->frames_head = f->next;
        if (!w->frames_head) w->frames_tail = NULL;
        handle_frame(w, f->peer, f->buf, f->len);
        free(f->buf);
        free(f);
    }
    for (uint16_t i = 0; i < w->n_peers; i++) {
        struct dpeer *p = &w->peers[i];
        if (p->conn && !p->hello_ok && now >= p->hello_deadline_ms) p->failed = true;
        if (p->failed) conn_lost(w, i);
    }
    if (now >= w->next_tick_ms) {
        kvf_decode_tick(w->d, now, &w->acts);
        run_actions(w, NULL);
        w->next_tick_ms = now + DW_TICK_MS;
    }
    verify_step(w);
    take_inbox(w);
    if (w->stepping) finish_step(w);
    handle_cancels(w);
    admit(w);
    bool stepped = w->stepping || start_step(w);
    publish_info(w);
    if (w->stop && !w->stepping && !w->pending_head && !any_live(w)) {
        struct kvf_decode_stats ds;
        kvf_decode_stats(w->d, &ds);
        if (ds.live == 0) return true;
    }
    /* While the compute thread runs a step the loop sleeps on the transport and the wake fd
     * (the compute thread writes it when the step is done). */
    *may_sleep = (!stepped || w->stepping) && !w->verify_head;
    return false;
}

static void *loop(void *arg)
{
    struct kvf_dworker *w = arg;
    for (;;) {
        bool may_sleep = false;
        if (turn(w, &may_sleep)) break;
        if (may_sleep) kvf__loop_wait(w->x, w->wake_fd, DW_TICK_MS);
    }
    return NULL;
}

int kvf_dworker_turn(kvf_dworker_t *w)
{
    bool may_sleep = false;
    if (!w->cfg.manual || w->done) return w->cfg.manual ? 1 : -EINVAL;
    w->done = turn(w, &may_sleep);
    return w->done;
}

int kvf_dworker_compute(kvf_dworker_t *w)
{
    if (!w->cfg.manual) return -EINVAL;
    pthread_mutex_lock(&w->cmu);
    bool go = w->step_state == STEP_GO;
    uint32_t n = w->step_n;
    pthread_mutex_unlock(&w->cmu);
    if (!go) return 0;
    compute_step(w, n);
    return 1;
}

const struct kvf_pool *kvf_dworker_pool(const kvf_dworker_t *w)
{
    return w ? w->pool : NULL;
}

bool kvf_dworker_check(const kvf_dworker_t *w, char *why, size_t why_len)
{
    return kvf_decode_check(w->d, why, why_len) && kvf_pool_check(w->pool, why, why_len);
}

bool kvf_dworker_computing(kvf_dworker_t *w)
{
    pthread_mutex_lock(&w->cmu);
    bool go = w->step_state == STEP_GO;
    pthread_mutex_unlock(&w->cmu);
    return go;
}

/* --- Start and stop. ------------------------------------------------------------------------- */

static void destroy(struct kvf_dworker *w)
{
    if (w->compute_started) {
        pthread_mutex_lock(&w->cmu);
        w->compute_quit = true;
        pthread_cond_broadcast(&w->ccv);
        pthread_mutex_unlock(&w->cmu);
        pthread_join(w->compute, NULL);
    }
    /* Endpoints are closed (forced) inside kvf_xport_destroy before the pool memory it
     * registered is unmapped and freed: no peer can write it afterwards. */
    if (w->x) kvf_xport_destroy(w->x);
    while (w->frames_head) {
        struct pframe *f = w->frames_head;
        w->frames_head = f->next;
        free(f->buf);
        free(f);
    }
    while (w->verify_head) {
        struct pverify *v = w->verify_head;
        w->verify_head = v->next;
        free(v->frame);
        free(v->hashes);
        free(v);
    }
    if (w->live)
        for (uint32_t i = 0; i < w->cfg.max_reqs; i++)
            if (w->live[i]) end_gen(w, w->live[i], -ESHUTDOWN, false);
    take_inbox(w);
    while (w->pending_head) {
        struct kvf_gen *g = w->pending_head;
        w->pending_head = g->next;
        end_gen(w, g, -ESHUTDOWN, false);
    }
    kvf_decode_destroy(w->d);
    kvf_fwd_destroy(w->fwd);
    kvf_pool_destroy(w->pool);
    free(w->live);
    free(w->acts.v);
    free(w->scratch.pages);
    free(w->scratch.checksums);
    free(w->scratch.tokens);
    free(w->frame);
    free(w->seqs);
    free(w->batch);
    free(w->logits);
    free(w->sample_scratch);
    free(w->gbuf);
    kvf__gram_reg_free(&w->greg);
    free(w->step_out);
    pthread_mutex_destroy(&w->cmu);
    pthread_cond_destroy(&w->ccv);
    if (w->wake_fd >= 0) close(w->wake_fd);
    if (w->notify_fd >= 0) close(w->notify_fd);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

int kvf_dworker_start(const struct kvf_worker_config *cfg, kvf_dworker_t **out, char *err,
                      size_t err_len)
{
    struct kvf_dworker *w = calloc(1, sizeof(*w));
    if (!w) return -ENOMEM;
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->cmu, NULL);
    pthread_cond_init(&w->ccv, NULL);
    w->cfg = *cfg;
    w->notify_fd = kvf__wake_open();
    if (!w->cfg.max_reqs) w->cfg.max_reqs = 64;
    if (!w->cfg.max_batch) w->cfg.max_batch = 16;
    if (!w->cfg.max_queue) w->cfg.max_queue = 256;
    if (!w->cfg.admit_timeout_ms) w->cfg.admit_timeout_ms = 30000;
    if (!w->cfg.hash_slice_bytes) w->cfg.hash_slice_bytes = DW_HASH_SLICE_BYTES;
    w->wake_fd = kvf__wake_open();
    int rc = w->wake_fd < 0 ? w->wake_fd : w->notify_fd < 0 ? w->notify_fd : 0;
    const struct kvf_model_hparams *hp = kvf_model_hparams(cfg->model);
    w->n_vocab = hp->n_vocab;
    kvf_model_geometry(cfg->model, cfg->page_tokens, &w->geo);
    w->seq_pages = pages_for(w, cfg->max_context);
    uint64_t seed = cfg->seed
                        ? cfg->seed
                        : (uint64_t)kvf__now_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
    w->req_hi = seed | 1;
    struct kvf_pool_config pc = {.geo = w->geo,
                                 .n_pages = cfg->n_pages,
                                 .max_peers = KVF_DECODE_MAX_PREFILLS,
                                 .hold_timeout_ms = cfg->hold_timeout_ms,
                                 .tag_seed = seed >> 16,
                                 .poison_on_free = cfg->poison_free};
    if (rc == 0 && (rc = kvf_pool_create(&pc, &w->pool)) < 0)
        snprintf(err, err_len, "cannot create the decode pool of %u pages: %s", cfg->n_pages,
                 kvf_strerror(rc));
    struct kvf_decode_config dc = {w->pool,
                                   w->cfg.max_reqs,
                                   cfg->max_context,
                                   w->seq_pages,
                                   KVF_DECODE_MAX_PREFILLS,
                                   cfg->grant_timeout_ms,
                                   cfg->hold_timeout_ms,
                                   seed,
                                   NULL,
                                   false};
#if defined(KVF_TEST_BUILD)
    /* The isolation suite's unverified runs: what arrives is committed unread (no trailer,
     * checksum or tail check), so that what the page lifetime rules alone let through reaches
     * the replies (docs/ISOLATION.md). Test builds only. */
    if (getenv("KVF_TEST_UNVERIFIED") && atoi(getenv("KVF_TEST_UNVERIFIED"))) {
        dc.test_unverified = true;
        w->test_unverified = true;
        kvf_log(KVF_LOG_INFO, "kvfence decode: test build: KVF_TEST_UNVERIFIED: arriving pages are "
                              "committed unread\n");
    }
#endif
    if (rc == 0 && (rc = kvf_decode_create(&dc, &w->d)) < 0)
        snprintf(err, err_len, "cannot create the decode machine: %s", kvf_strerror(rc));
    struct kvf_fwd_config fc = {cfg->n_threads ? cfg->n_threads : 1, w->cfg.max_batch,
                                w->cfg.max_batch, NULL, cfg->max_context};
    if (rc == 0 && (rc = kvf_fwd_create(cfg->model, &fc, &w->fwd)) < 0)
        snprintf(err, err_len, "cannot start the compute threads: %s", kvf_strerror(rc));
    if (rc == 0) {
        w->live = calloc(w->cfg.max_reqs, sizeof(*w->live));
        w->acts.cap = kvf_decode_max_actions(w->d) * 4;
        w->acts.v = calloc(w->acts.cap, sizeof(*w->acts.v));
        w->scratch.pages = calloc(w->seq_pages, sizeof(*w->scratch.pages));
        w->scratch.pages_cap = w->seq_pages;
        w->scratch.checksums = calloc(w->seq_pages, sizeof(uint64_t));
        w->scratch.checksums_cap = w->seq_pages;
        w->scratch.tokens = calloc(1, sizeof(uint32_t));
        w->scratch.tokens_cap = 0; /* nothing sent to decode carries tokens */
        w->frame = malloc(KVF_PROTO_MAX_MSG_BYTES);
        w->seqs = calloc(w->cfg.max_batch, sizeof(*w->seqs));
        w->batch = calloc(w->cfg.max_batch, sizeof(*w->batch));
        w->logits = malloc((size_t)w->cfg.max_batch * hp->n_vocab * sizeof(float));
        w->sample_scratch = calloc(1, kvf_sample_scratch_bytes(hp->n_vocab));
        w->gbuf = malloc((size_t)hp->n_vocab * sizeof(float));
        kvf__gram_reg_init(&w->greg, w->cfg.max_reqs + w->cfg.max_queue + 16);
        w->step_out = calloc(w->cfg.max_batch, sizeof(*w->step_out));
        if (!w->sample_scratch || !w->gbuf || !w->step_out || !w->live || !w->acts.v ||
            !w->scratch.pages || !w->scratch.checksums || !w->frame || !w->seqs || !w->batch ||
            !w->logits) {
            rc = -ENOMEM;
            snprintf(err, err_len, "out of memory");
        }
    }
    if (rc == 0) {
        size_t bytes = 0;
        void *base = kvf_pool_data(w->pool, &bytes);
        struct kvf_xport_config xc = {NULL,
                                      0,
                                      cfg->keepalive_ms,
                                      base,
                                      bytes,
                                      cfg->fabric_key,
                                      cfg->transport,
                                      cfg->transport_ctx};
        struct kvf_xport_events ev = {w, NULL, on_frame, NULL, on_error};
        rc = kvf_xport_create(&xc, &ev, &w->x, err, err_len);
    }
#if defined(KVF_TEST_BUILD)
    if (rc == 0) {
        struct kvf_xport_faults f;
        if (kvf_xport_faults_from_env(&f) == 0) kvf_xport_set_faults(w->x, &f);
        w->test_audit_tail = getenv("KVF_TEST_AUDIT_TAIL") && atoi(getenv("KVF_TEST_AUDIT_TAIL"));
        const char *e = getenv("KVF_TEST_STEP_MS");
        if (e && atoi(e) > 0 && atoi(e) <= 10000) {
            w->test_step_ms = (uint32_t)atoi(e);
            kvf_log(KVF_LOG_INFO,
                    "kvfence decode: test build: every decode step lasts %u ms more\n",
                    w->test_step_ms);
        }
    }
#endif
    if (rc == 0 && cfg->prefill_host &&
        (rc = kvf_dworker_add_prefill(w, cfg->prefill_host, cfg->prefill_port)) < 0)
        snprintf(err, err_len, "bad prefill address %s:%u", cfg->prefill_host, cfg->prefill_port);
    if (rc == 0) {
        w->info.n_vocab = hp->n_vocab;
        w->info.served_limit = cfg->max_context;
        w->info.page_tokens = cfg->page_tokens;
        w->info.prefill_pages = 0; /* another worker's: filled in by whoever knows it */
    }
    if (rc == 0 && !cfg->manual) {
        if ((rc = -pthread_create(&w->compute, NULL, compute_main, w)) < 0)
            snprintf(err, err_len, "cannot start the decode compute thread");
        else
            w->compute_started = true;
    }
    if (rc == 0 && !cfg->manual && (rc = -pthread_create(&w->thread, NULL, loop, w)) < 0)
        snprintf(err, err_len, "cannot start the decode loop thread");
    if (rc < 0) {
        destroy(w);
        return rc;
    }
    w->started = !cfg->manual;
    *out = w;
    return 0;
}

void kvf_dworker_stop(kvf_dworker_t *w, uint64_t grace_ms)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->closing = true;
    pthread_mutex_unlock(&w->mu);
    if (w->cfg.manual) { /* the caller ran the turns it wanted: what is left ends here */
        w->stop = 1;
        destroy(w);
        return;
    }
    /* Running requests get grace_ms to finish; then every live one is cancelled through the
     * machine, and the loop exits once the machine holds no request (drains and fences are
     * bounded by the grant and hold timeouts). */
    uint64_t until = kvf__now_ms() + grace_ms;
    for (;;) {
        struct kvf_engine_info in;
        gen_info(w, &in);
        if ((in.running == 0 && in.queued == 0) || kvf__now_ms() >= until) break;
        usleep(10000);
    }
    w->stop = 1;
    kvf__wake(w->wake_fd);
    if (w->started) pthread_join(w->thread, NULL);
    destroy(w);
}
