/*
 * prefill_worker.c — the prefill worker loop: GRANT → compute the prompt's KV in its own pool →
 * put each finished page into the granted decode page → flush → DONE with the first token.
 *
 * Threads: one loop thread owns everything here — the pool, the protocol machines (one per
 * decode connection), the transport, the jobs. One compute thread runs the math of one chunk at
 * a time (kvf_fwd_compute, with the fwd's own helper threads) while the loop goes on handling
 * messages, posting the pages earlier chunks finished, and reporting progress; the loop prepares
 * each chunk and commits it (kvf_fwd_prepare / kvf_fwd_commit), so the pool is touched by the
 * loop only. Transport callbacks run inside kvf_xport_progress on the loop thread and only queue
 * what happened (frames, flush completions, failures); the loop handles the queue after progress
 * returns, so no handler re-enters the transport from inside a callback.
 *
 * One job (one GRANT):
 *   queued ──pages taken──▶ chunks computed in turns with other jobs' ──▶ each page posted as
 *   soon as a chunk completes it ──▶ last chunk: first token ──▶ flush ──▶ DONE sent
 *
 * Chunk policy (docs/PROTOCOL.md, "Long prompts"): one chunk of `prefill_chunk` tokens per turn;
 * the next turn goes to the job with the fewest prompt tokens left (a short prompt arriving
 * behind long ones gets the next chunk, so its first token does not wait for theirs), except
 * that a job passed over PF_MAX_PASSES turns in a row takes the next one (a long prompt behind a
 * stream of short ones still advances). A job takes its source pages — the whole prompt's — when
 * it starts; one that cannot get them yet waits while the started ones go on.
 *
 * Progress: while the compute advances (a layer or a chunk finished, a put completed), every
 * PF_PROGRESS_MS the loop reports each job it holds to decode (PROGRESS), which renews the grant;
 * a stopped or hung compute reports nothing, and decode fences this worker after its
 * no-progress bound.
 * The job's source pages are held by the job (HOLDER_SEQ) and, while a put reads one, by the put
 * (HOLDER_XFER_SRC, released on the machine's RELEASE_SRC at local completion: H5). A job ends
 * when the machine is done with it and no put of it is outstanding.
 *
 * No byte of another request travels: the prefill pool may hand this job a page last used by
 * another tenant, so the slots of a page beyond what this prompt wrote are zeroed before its
 * checksum is taken and before it is put (the put covers the page's data whole).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine_internal.h"

#include "prefill_internal.h"

/* --- Deferred events (from transport callbacks). ------------------------------------------ */

/* The loop's clock is the transport's: real time on the fabric, simulated time in the simulator
 * (before the transport exists and after it is gone — start and teardown — the process's). */
static uint64_t now_ms(const struct kvf_pworker *w)
{
    return w->x ? kvf_xport_now_ms(w->x) : kvf__now_ms();
}

static void ev_push(struct kvf_pworker *w, struct pev *e)
{
    e->next = NULL;
    if (w->ev_tail)
        w->ev_tail->next = e;
    else
        w->ev_head = e;
    w->ev_tail = e;
}

static void on_accept(void *ctx, kvf_conn_t *c)
{
    struct pev *e = calloc(1, sizeof(*e));
    if (!e) return;
    e->kind = PEV_ACCEPT;
    e->conn = c;
    ev_push(ctx, e);
}

static void on_frame(void *ctx, kvf_conn_t *c, const uint8_t *buf, size_t len)
{
    struct pev *e = calloc(1, sizeof(*e));
    if (!e) return; /* dropped like a lost frame; the protocol's timeouts cover it */
    e->buf = malloc(len ? len : 1);
    if (!e->buf) {
        free(e);
        return;
    }
    memcpy(e->buf, buf, len);
    e->len = len;
    e->kind = PEV_FRAME;
    e->conn = c;
    ev_push(ctx, e);
}

static void on_error(void *ctx, kvf_conn_t *c, int err)
{
    struct pev *e = calloc(1, sizeof(*e));
    if (!e) return;
    e->kind = PEV_CONN_FAILED;
    e->conn = c;
    e->status = err;
    ev_push(ctx, e);
}

static struct psess *sess_of(struct kvf_pworker *w, kvf_conn_t *c)
{
    for (uint32_t i = 0; i < PF_MAX_SESS; i++)
        if (w->sess[i].used && w->sess[i].conn == c) return &w->sess[i];
    return NULL;
}

/* --- Jobs. ---------------------------------------------------------------------------------- */

static struct pjob *job_find(struct kvf_pworker *w, struct psess *s, kvf_req_id_t req,
                             uint64_t nonce)
{
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++) {
        struct pjob *j = &w->jobs[i];
        if (j->used && j->s == s && j->nonce == nonce && kvf_req_id_eq(j->req, req)) return j;
    }
    return NULL;
}

static void job_free(struct kvf_pworker *w, struct pjob *j)
{
    uint64_t now = now_ms(w);
    /* A computed prompt's whole pages enter the prefix cache (sealed: the puts that read them
     * are done, and nothing writes them again) before the job lets its pages go. */
    if (w->cache && j->computed && !j->placeholder &&
        !(KVF_MUTANT(SRC_FREED_AT_POST) && j->src_let_go)) {
        uint32_t full = j->n_tokens / w->geo.page_tokens;
        kvf__pcache_put(w->cache, w->pool, j->tenant, j->tokens, j->src, j->cached,
                        full < j->n_pages ? full : j->n_pages, now);
    }
    if (!(KVF_MUTANT(SRC_FREED_AT_POST) && j->src_let_go))
        for (uint32_t i = 0; i < j->n_pages; i++)
            if (j->src[i].tag) kvf_pool_release(w->pool, j->src[i], KVF_HOLDER_SEQ, now);
    free(j->tokens);
    free(j->dst);
    free(j->src);
    free(j->trailers);
    free(j->puts);
    memset(j, 0, sizeof(*j));
}

/* A job goes when the machine is done with it and no put still reads its pages. */
static void job_maybe_free(struct kvf_pworker *w, struct pjob *j)
{
    if (j->used && j->finished && j->puts_out == 0 && !j->flush_out && !j->in_step) job_free(w, j);
}

static void unqueue(struct kvf_pworker *w, struct pjob *j)
{
    struct pjob **pp = &w->queue_head, *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next_queued;
    }
    if (!*pp) return;
    *pp = j->next_queued;
    if (w->queue_tail == j) w->queue_tail = prev;
    j->next_queued = NULL;
}

static void queue_push(struct kvf_pworker *w, struct pjob *j)
{
    j->next_queued = NULL;
    if (w->queue_tail)
        w->queue_tail->next_queued = j;
    else
        w->queue_head = j;
    w->queue_tail = j;
}

/* --- Actions of a prefill machine. ---------------------------------------------------------- */

static void run_actions(struct kvf_pworker *w, struct psess *s, const struct kvf_msg *grant);

static void on_put_done(void *arg, int status)
{
    struct pput *p = arg;
    (void)status; /* local completion, success or not: the source is no longer read */
    struct kvf_pworker *w = p->w;
    struct pjob *j = p->job;
    if (--p->left > 0) return;
    j->puts_out--;
    w->puts_done++;
    if (j->s && j->s->m) {
        kvf_prefill_write_local_done(j->s->m, j->req, j->nonce, p->index, &w->acts);
        run_actions(w, j->s, NULL);
    } else {
        /* The session is gone: release the put's hold here, as RELEASE_SRC would. */
        if (!KVF_MUTANT(SRC_FREED_AT_POST)) /* the mutant's RELEASE_SRC came at the post */
            kvf_pool_release(w->pool, j->src[p->index], KVF_HOLDER_XFER_SRC, now_ms(w));
    }
    job_maybe_free(w, j);
}

static void on_flush_done(void *arg, int status)
{
    struct pjob *j = arg;
    struct kvf_pworker *w = j->w;
    j->flush_out = false;
    if (status == 0 && j->s && !j->s->failed) {
        /* The drain proof: handled on the loop, outside the transport's callback. */
        struct pev *e = calloc(1, sizeof(*e));
        if (e) {
            e->kind = PEV_FLUSHED;
            e->job = j;
            e->req = j->req;
            e->nonce = j->nonce;
            ev_push(w, e);
            return;
        }
    }
    /* A flush that failed proves nothing: the job waits for its session's end. */
    job_maybe_free(w, j);
}

/* The put's hold on its source page: a page from the prefix cache is sealed and is held only
 * through share, by a reader of its tenant. */
static void hold_src(struct kvf_pworker *w, const struct pjob *j, uint32_t i)
{
    struct kvf_page_info in;
    if (i < j->cached && kvf_pool_page_info(w->pool, j->src[i].page, &in) == 0 && in.sealed)
        kvf_pool_share(w->pool, j->src[i], j->tenant, KVF_HOLDER_XFER_SRC);
    else
        kvf_pool_hold(w->pool, j->src[i], KVF_HOLDER_XFER_SRC);
}

static void post_write(struct kvf_pworker *w, struct psess *s, const struct kvf_action *a)
{
    struct pjob *j = job_find(w, s, a->req, a->nonce);
    if (!j || a->index >= j->n_pages) return;
    struct kvf_page_trailer *t = &j->trailers[a->index];
    memset(t, 0, sizeof(*t));
    t->tag = a->dst.tag;
    t->req = a->req;
    t->tenant = a->tenant;
    t->slots = a->slots;
    t->checksum = a->checksum;
    t->epoch_nonce = kvf_trailer_epoch_nonce(a->epoch, a->nonce);
    struct pput *p = &j->puts[a->index];
    p->w = w;
    p->job = j;
    p->index = a->index;
    p->left = 2;
    hold_src(w, j, a->index);
    j->puts_out++;
    if (kvf__forge_skip_put(j, a->index)) { /* never put: completes locally at once */
        p->left = 1;
        on_put_done(p, 0);
        return;
    }
    const uint8_t *src = kvf_pool_page_data(w->pool, j->src[a->index].page);
    uint64_t off = (uint64_t)a->dst.page * w->page_bytes;
    if (a->index == 0) kvf__forge_keep(w, j, src);
    int rc = kvf_conn_put(s->conn, src, w->data_bytes, off, on_put_done, p);
    if (rc < 0) on_put_done(p, rc);
    kvf_conn_order(s->conn);
    rc = kvf_conn_put(s->conn, t, sizeof(*t), off + w->trailer_off, on_put_done, p);
    if (rc < 0) on_put_done(p, rc);
    /* Mutant, the engine's half (the model's P_LAST_POST): once the last page's put is posted
     * the job lets its source pages go, while those puts may still read them. With the
     * machine's half (RELEASE_SRC at each post) nothing holds them: they are freed (poisoned in
     * test builds) and taken by the next job. */
    if (KVF_MUTANT(SRC_FREED_AT_POST) && a->index == j->n_pages - 1 && !j->src_let_go) {
        for (uint32_t i = 0; i < j->n_pages; i++)
            if (j->src[i].tag) kvf_pool_release(w->pool, j->src[i], KVF_HOLDER_SEQ, now_ms(w));
        j->src_let_go = true;
    }
}

/* The session an action belongs to: SENDs name it (the machine's decode_peer is the session's
 * index); the others through their job. */
static struct psess *action_sess(struct kvf_pworker *w, const struct kvf_action *a)
{
    if (a->kind == KVF_ACT_SEND) return a->peer < PF_MAX_SESS ? &w->sess[a->peer] : NULL;
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++) {
        struct pjob *j = &w->jobs[i];
        if (j->used && j->nonce == a->nonce && kvf_req_id_eq(j->req, a->req)) return j->s;
    }
    return NULL;
}

/*
 * Executes the actions the machines appended. Completions can arrive synchronously inside a
 * put (and append more actions): a nested call returns at once and the running loop picks the
 * new actions up, so actions run once each, in order.
 */
static void run_actions(struct kvf_pworker *w, struct psess *s0, const struct kvf_msg *grant)
{
    if (w->in_actions) return;
    w->in_actions = true;
    for (uint32_t i = 0; i < w->acts.n; i++) {
        struct kvf_action *a = &w->acts.v[i];
        struct psess *s = a->kind == KVF_ACT_COMPUTE ? s0 : action_sess(w, a);
        if (!s || !s->used) continue;
        switch (a->kind) {
        case KVF_ACT_SEND: {
            struct pjob *j = job_find(w, s, a->msg.req, a->msg.nonce);
            if (a->msg.type == KVF_MSG_DONE && j) {
                a->msg.u.done.first_logprob = j->first_logprob;
                a->msg.u.done.n_top = j->n_top;
                for (uint32_t k = 0; k < j->n_top; k++) {
                    a->msg.u.done.top_ids[k] = (uint32_t)j->top_ids[k];
                    a->msg.u.done.top_logprobs[k] = j->top_lps[k];
                }
            }
            if (a->msg.type == KVF_MSG_DONE && j) kvf__forge_done(w, s, j, &a->msg);
            if (s->conn && !s->failed) kvf__send_msg(s->conn, &a->msg, w->frame, PF_FRAME_CAP);
            if (j && (a->msg.type == KVF_MSG_CANCEL_ACK || a->msg.type == KVF_MSG_FAIL ||
                      a->msg.type == KVF_MSG_REJECT)) {
                /* The machine sends these only once the job's writes are drained (or none were
                 * posted): it is done with the job. */
                unqueue(w, j);
                j->finished = true;
                job_maybe_free(w, j);
            }
            if (a->msg.type == KVF_MSG_DONE && j) {
                /* The first token went out: the machine keeps the record; the job may go. */
                kvf_prefill_clear(s->m, now_ms(w), j->req, j->nonce, &w->acts);
                j->finished = true;
                job_maybe_free(w, j);
            }
            break;
        }
        case KVF_ACT_COMPUTE: {
            if (!grant) break;
            const struct kvf_msg_grant *g = &grant->u.grant;
            struct pjob *j = NULL;
            for (uint32_t k = 0; k < w->cfg.max_reqs && !j; k++)
                if (!w->jobs[k].used) j = &w->jobs[k];
            int err = -EBUSY;
            if (j && g->n_tokens == g->expected_tokens) {
                memset(j, 0, sizeof(*j));
                /* The grammar's text (if any) follows the prompt in the same block. */
                j->tokens = malloc(g->n_tokens * sizeof(int32_t) + g->sampling.n_grammar);
                j->dst = malloc(g->n_pages * sizeof(*j->dst));
                j->src = calloc(g->n_pages, sizeof(*j->src));
                j->trailers =
                    aligned_alloc(64, ((g->n_pages * sizeof(*j->trailers)) + 63) & ~(size_t)63);
                j->puts = calloc(g->n_pages, sizeof(*j->puts));
                if (j->tokens && j->dst && j->src && j->trailers && j->puts) {
                    err = 0;
                    for (uint32_t k = 0; k < g->n_tokens; k++) {
                        if (g->tokens[k] >= w->n_vocab) err = KVF_E_PROTO_BOUNDS;
                        j->tokens[k] = (int32_t)g->tokens[k];
                    }
                } else {
                    err = -ENOMEM;
                }
                if (err == 0) {
                    j->used = true;
                    j->w = w;
                    j->s = s;
                    j->req = a->req;
                    j->nonce = a->nonce;
                    j->tenant = g->tenant;
                    j->sampling = g->sampling;
                    if (g->sampling.n_grammar) {
                        char *text = (char *)(j->tokens + g->n_tokens);
                        memcpy(text, g->sampling.grammar, g->sampling.n_grammar);
                        j->sampling.grammar = text;
                    }
                    j->n_tokens = g->n_tokens;
                    j->n_pages = g->n_pages;
                    memcpy(j->dst, g->pages, g->n_pages * sizeof(*j->dst));
                    queue_push(w, j);
                } else {
                    free(j->tokens);
                    free(j->dst);
                    free(j->src);
                    free(j->trailers);
                    free(j->puts);
                    memset(j, 0, sizeof(*j));
                }
            } else if (j) {
                err = KVF_E_PROTO_BOUNDS; /* a GRANT without its prompt */
            }
            if (err < 0) /* refused before anything was posted: the machine answers REJECT */
                kvf_prefill_compute_failed(s->m, now_ms(w), a->req, a->nonce, err, &w->acts);
            break;
        }
        case KVF_ACT_ABORT_COMPUTE: {
            struct pjob *j = job_find(w, s, a->req, a->nonce);
            if (!j) break;
            unqueue(w, j);
            j->aborted = true;
            j->finished = true;
            job_maybe_free(w, j);
            break;
        }
        case KVF_ACT_POST_WRITE:
            post_write(w, s, a);
            break;
        case KVF_ACT_FLUSH: {
            struct pjob *j = job_find(w, s, a->req, a->nonce);
            if (!j) break;
            kvf__forge_write(w, s, j);
            j->flush_out = true;
            int rc = s->conn && !s->failed ? kvf_conn_flush(s->conn, on_flush_done, j) : -ENOTCONN;
            if (rc < 0)
                j->flush_out = false; /* a flush that cannot start never proves anything: the job
                 waits for the connection's end, and decode's timeouts and fence end the grant */
            break;
        }
        case KVF_ACT_RELEASE_SRC: {
            struct pjob *j = job_find(w, s, a->req, a->nonce);
            if (j && a->index < j->n_pages)
                kvf_pool_release(w->pool, j->src[a->index], KVF_HOLDER_XFER_SRC, now_ms(w));
            break;
        }
        default:
            break;
        }
    }
    w->acts.n = 0;
    w->in_actions = false;
}

/* --- Compute. -------------------------------------------------------------------------------- */

/* Zeroes the slots of page `idx` this prompt did not write, takes its checksum, and tells the
 * machine it is ready (which posts its write). */
static void page_ready(struct kvf_pworker *w, struct pjob *j, uint32_t idx, uint32_t first)
{
    uint32_t pt = w->geo.page_tokens;
    uint32_t start = idx * pt, slots = j->n_tokens - start < pt ? j->n_tokens - start : pt;
    uint8_t *page = kvf_pool_page_data(w->pool, j->src[idx].page);
    size_t row = w->block_bytes / pt;
    /* (Mutant stale_tail_sent: the page goes whole with whatever its earlier owner left in the
     * unwritten slots.) */
    if (slots < pt && !KVF_MUTANT(STALE_TAIL_SENT))
        for (uint32_t l = 0; l < w->geo.n_layers; l++)
            for (int kv = 0; kv < 2; kv++)
                memset(page + kvf_geo_kv_offset(&w->geo, l, kv) + slots * row, 0,
                       (pt - slots) * row);
    uint64_t sum = XXH3_64bits(page, w->data_bytes);
    kvf_prefill_page_ready(j->s->m, now_ms(w), j->req, j->nonce, idx, sum, first, &w->acts);
    run_actions(w, j->s, NULL);
}

static void compute_failed(struct kvf_pworker *w, struct pjob *j, int err)
{
    unqueue(w, j);
    kvf_prefill_compute_failed(j->s->m, now_ms(w), j->req, j->nonce, err, &w->acts);
    /* Mutant, the engine's half: the machine asks for the refused request again (its
     * placeholder): one token, computed into the first of its pages, which goes through the
     * handoff as if it were the prompt. */
    for (uint32_t i = 0;
         KVF_MUTANT(PLACEHOLDER_AFTER_REJECT) && i < w->acts.n && !j->placeholder && j->started;
         i++) {
        struct kvf_action *a = &w->acts.v[i];
        if (a->kind != KVF_ACT_COMPUTE || !kvf_req_id_eq(a->req, j->req) || a->nonce != j->nonce)
            continue;
        a->kind = (enum kvf_action_kind)0; /* taken here: run_actions skips it */
        j->placeholder = true;
        j->n_tokens = 1;
        j->pos = j->reported = 0;
        run_actions(w, j->s, NULL);
        queue_push(w, j);
        return;
    }
    run_actions(w, j->s, NULL);
    j->finished = true;
    job_maybe_free(w, j);
}

/* Pages of this pool held by jobs (being computed, or read by puts in flight). */
static bool pages_in_use(const struct kvf_pworker *w)
{
    struct kvf_pool_stats st;
    kvf_pool_stats(w->pool, &st);
    return st.by_state[KVF_PAGE_FREE] < st.n_pages;
}

/* Source pages for j. 1 when it has them; 0 when the pool is short only for now (pages still
 * held by other jobs, or by earlier jobs' puts in flight, come back as those complete): the job
 * waits; a negative code when it can never fit (then it fails: REJECT). */
static int take_pages(struct kvf_pworker *w, struct pjob *j)
{
    struct kvf_owner own = {j->req, j->tenant};
    uint32_t pt = w->geo.page_tokens, k = 0;
    uint64_t now = now_ms(w);
    /* The prompt's first whole pages from the prefix cache, the last prompt token never (its
     * logits draw the first token). */
    if (w->cache && j->n_tokens > pt) {
        uint32_t most = (j->n_tokens - 1) / pt;
        k = kvf__pcache_take(w->cache, w->pool, j->tenant, j->tokens,
                             most < j->n_pages ? most : j->n_pages, j->src);
    }
    int rc = kvf_pool_alloc(w->pool, &own, KVF_HOLDER_SEQ, j->n_pages - k, false, j->src + k);
    /* Under pressure the cache yields before a job waits: least recently used first. */
    while (rc == KVF_E_POOL_FULL && w->cache && kvf__pcache_evict(w->cache, w->pool, 1, now) == 1)
        rc = kvf_pool_alloc(w->pool, &own, KVF_HOLDER_SEQ, j->n_pages - k, false, j->src + k);
    if (rc == 0) {
        j->cached = k;
        j->pos = k * pt; /* computed already: the job computes from the first uncached token */
        return 1;
    }
    for (uint32_t i = 0; i < k; i++)
        kvf_pool_release(w->pool, j->src[i], KVF_HOLDER_SEQ, now);
    memset(j->src, 0, j->n_pages * sizeof(*j->src));
    if (rc == KVF_E_POOL_FULL && j->n_pages <= kvf_pool_n_pages(w->pool) && pages_in_use(w))
        return 0;
    return rc;
}

/*
 * The job whose chunk runs next (the policy in the header): the started job passed over
 * PF_MAX_PASSES turns in a row, if any, else the one with the fewest prompt tokens left; a job
 * not started yet takes its pages first, and one that cannot get them now is skipped for this
 * turn (*waiting: the caller polls again soon). NULL when nothing can run.
 */
static struct pjob *pick_job(struct kvf_pworker *w, bool *waiting)
{
    *waiting = false;
    for (struct pjob *j = w->queue_head, *nx; j; j = nx) {
        nx = j->next_queued;
        if (j->aborted || j->finished || !j->s || j->s->failed) unqueue(w, j);
    }
    for (struct pjob *j = w->queue_head; j; j = j->next_queued)
        j->no_pages = false;
    for (;;) {
        struct pjob *best = NULL, *starved = NULL;
        for (struct pjob *j = w->queue_head; j; j = j->next_queued) {
            if (j->no_pages) continue;
            if (j->started && j->passes >= PF_MAX_PASSES && !starved) starved = j;
            if (!best || j->n_tokens - j->pos < best->n_tokens - best->pos) best = j;
        }
        struct pjob *j = starved ? starved : best;
        if (!j) return NULL;
        if (j->started) return j;
        int got = take_pages(w, j);
        if (got == 0) {
            j->no_pages = true; /* not this turn: the others may run */
            *waiting = true;
            continue;
        }
        if (got < 0) {
            compute_failed(w, j, got);
            continue;
        }
        j->started = true;
        if (kvf__forge_refuse(w, j)) {
            compute_failed(w, j, KVF_E_ENGINE);
            continue;
        }
        kvf__forge_short(w, j);
        return j;
    }
}

/* Starts the next chunk on the compute thread; false when none could start. */
static bool start_chunk(struct kvf_pworker *w, bool *waiting)
{
    struct pjob *j = pick_job(w, waiting);
    if (!j) return false;
    for (struct pjob *q = w->queue_head; q; q = q->next_queued)
        if (q != j && q->started) q->passes++;
    j->passes = 0;
    uint32_t left = j->n_tokens - j->pos, len = left < w->chunk ? left : w->chunk;
    bool last = len == left;
    w->step_seq = (struct kvf_fwd_seq){j->req,     j->tokens + j->pos,      len, j->pos, j->src,
                                       j->n_pages, last ? w->logits : NULL, 0};
    int rc = kvf_fwd_prepare(w->fwd, w->pool, &w->step_seq, 1);
    if (rc != 1) {
        if (rc >= 0) { /* prepared with nothing to run: end the batch before failing the job */
            kvf_fwd_compute(w->fwd);
            kvf_fwd_commit(w->fwd, w->pool);
        }
        compute_failed(w, j,
                       rc < 0 ? rc : (w->step_seq.status ? w->step_seq.status : KVF_E_ENGINE));
        return false;
    }
    j->in_step = true;
    w->step_job = j;
    w->step_len = len;
    w->step_last = last;
    pthread_mutex_lock(&w->cmu);
    w->step_state = STEP_GO;
    pthread_cond_broadcast(&w->ccv);
    pthread_mutex_unlock(&w->cmu);
    return true;
}

/* The chunk's math (the compute thread's part; in manual mode the caller's). */
static void compute_chunk(struct kvf_pworker *w)
{
    kvf__compute_enter(&w->cfg);
    int rc = kvf_fwd_compute(w->fwd);
    kvf__compute_leave(&w->cfg);
#if defined(KVF_TEST_BUILD)
    if (w->test_chunk_ms && !w->cfg.manual) usleep(w->test_chunk_ms * 1000u);
#endif
    pthread_mutex_lock(&w->cmu);
    w->step_rc = rc;
    w->step_state = STEP_DONE;
    pthread_mutex_unlock(&w->cmu);
}

static void *compute_main(void *arg)
{
    struct kvf_pworker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->cmu);
        while (w->step_state != STEP_GO && !w->compute_quit)
            pthread_cond_wait(&w->ccv, &w->cmu);
        bool quit = w->step_state != STEP_GO;
        pthread_mutex_unlock(&w->cmu);
        if (quit) return NULL;
        compute_chunk(w);
        kvf__wake(w->wake_fd);
    }
}

static int step_state(struct kvf_pworker *w)
{
    pthread_mutex_lock(&w->cmu);
    int st = (int)w->step_state;
    pthread_mutex_unlock(&w->cmu);
    return st;
}

/* The chunk's end (the compute thread finished it): the fills go up, the pages it completed
 * are posted, and after the last chunk the first token is drawn and the rest is posted. */
static int first_token(struct kvf_pworker *w, struct pjob *j, const struct kvf_sample_hist *h,
                       float *lp);

static void finish_chunk(struct kvf_pworker *w)
{
    int rc = kvf_fwd_commit(w->fwd, w->pool);
    struct pjob *j = w->step_job;
    w->step_job = NULL;
    j->in_step = false;
    pthread_mutex_lock(&w->cmu);
    if (w->step_rc < 0 && rc >= 0) rc = w->step_rc;
    w->step_state = STEP_IDLE;
    pthread_mutex_unlock(&w->cmu);
    w->chunk_done = true;
    if (j->finished || j->aborted || !j->s || j->s->failed) {
        job_maybe_free(w, j);
        return;
    }
    if (rc != 1 || w->step_seq.status != 0) {
        compute_failed(w, j,
                       rc < 0 ? rc : (w->step_seq.status ? w->step_seq.status : KVF_E_ENGINE));
        return;
    }
    j->pos += w->step_len;
    if (!w->step_last) return; /* its completed pages are posted once the next chunk runs */
    float lp = 0.0f;
    /* The first token: the penalties see the prompt alone. */
    struct kvf_sample_hist h = {j->tokens, j->n_tokens, NULL, 0};
    int tok = first_token(w, j, &h, &lp);
    if (tok < 0) {
        compute_failed(w, j, tok);
        return;
    }
    unqueue(w, j);
    j->first_logprob = lp;
    j->first_token = (uint32_t)tok;
    j->computed = true;
}

/* Draws j's first token, within its grammar when it has one (the grammar's start state; no stop
 * ids: the output cannot end before it begins). */
static int first_token(struct kvf_pworker *w, struct pjob *j, const struct kvf_sample_hist *h,
                       float *lp)
{
    if (!j->sampling.n_grammar)
        return kvf__sample_token(w->logits, w->n_vocab, &j->sampling, NULL, h, 0, w->sample_scratch,
                                 lp, &j->n_top, j->top_ids, j->top_lps);
    if (!w->cfg.grammar_vocab) return KVF_E_MODEL_UNSUPPORTED;
    if (!w->gbuf && !(w->gbuf = malloc((size_t)w->n_vocab * sizeof(float)))) return -ENOMEM;
    struct kvf_grammar_state *st = malloc(sizeof *st);
    if (!st) return -ENOMEM;
    kvf_grammar_t *g;
    int rc = kvf__gram_get(&w->greg, j->sampling.grammar, j->sampling.n_grammar, &g);
    if (rc == 0) {
        kvf_grammar_state_init(g, st);
        struct kvf__constraint c = {g, w->cfg.grammar_vocab, st, NULL, 0, w->gbuf};
        rc = kvf__sample_token(w->logits, w->n_vocab, &j->sampling, &c, h, 0, w->sample_scratch, lp,
                               &j->n_top, j->top_ids, j->top_lps);
        kvf__gram_put(&w->greg, g);
    }
    free(st);
    return rc;
}

/* Posts the pages that finished chunks completed (never a page whose compute is unfinished: H8),
 * and a computed job's last ones with its first token. Called after the next chunk has started,
 * so sealing and sending these pages overlaps that chunk's compute. */
static void post_completed(struct kvf_pworker *w)
{
    uint32_t pt = w->geo.page_tokens;
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++) {
        struct pjob *j = &w->jobs[i];
        if (!j->used || j->finished || j->aborted || !j->s || j->s->failed) continue;
        if (j->computed)
            for (; j->reported < j->n_pages && !j->aborted; j->reported++)
                page_ready(w, j, j->reported, j->first_token);
        else
            for (; (j->reported + 1) * pt <= j->pos && !j->aborted; j->reported++)
                page_ready(w, j, j->reported, 0);
    }
}

/* Every PF_PROGRESS_MS while the compute advances (a layer or a chunk finished, a put
 * completed), each job this worker holds is reported to its decode worker: PROGRESS renews the
 * grant. A stopped or hung compute advances nothing, so nothing is sent for it. */
static void send_progress(struct kvf_pworker *w)
{
    uint64_t now = now_ms(w);
    if (now - w->last_progress_ms < PF_PROGRESS_MS) return;
    uint64_t layers = kvf_fwd_layers_done(w->fwd);
    if (layers == w->seen_layers && w->puts_done == w->seen_puts && !w->chunk_done) return;
    w->seen_layers = layers;
    w->seen_puts = w->puts_done;
    w->chunk_done = false;
    w->last_progress_ms = now;
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++) {
        struct pjob *j = &w->jobs[i];
        if (!j->used || j->finished || !j->s || j->s->failed || !j->s->m) continue;
        if (kvf_prefill_progress(j->s->m, now, j->req, j->nonce, j->pos, &w->acts) == 0)
            run_actions(w, j->s, NULL);
    }
}

/* --- Sessions and frames. -------------------------------------------------------------------- */

static void handle_frame(struct kvf_pworker *w, struct psess *s, const uint8_t *buf, size_t len)
{
    if (s->refused_ms) return;
    struct kvf_msg m;
    long n = kvf_msg_decode(buf, len, &m, &w->scratch);
    if (n != (long)len) {
        w->bad_frames++; /* does not decode: counted and dropped, never trusted */
        kvf_log(KVF_LOG_WARN,
                "kvfence prefill: dropped a control frame that does not decode (%s); %llu so far\n",
                kvf_strerror((int)n), (unsigned long long)w->bad_frames);
        return;
    }
    if (m.type == KVF_MSG_HELLO) {
        struct kvf_msg_hello mine = {
            w->cfg.model_fp,
            w->geo,
            w->cfg.max_context,
            (uint32_t)((w->cfg.max_context + w->geo.page_tokens - 1) / w->geo.page_tokens),
            0,
            KVF_ROLE_PREFILL};
        char why[KVF_PREFILL_WHY_MAX];
        if (m.u.hello.role != KVF_ROLE_DECODE)
            snprintf(why, sizeof why, "not a decode worker (role %u)", (unsigned)m.u.hello.role);
        else
            kvf__hello_mismatch(&mine, &m.u.hello, why, sizeof why);
        if (why[0]) {
            /* Our HELLO goes back so the decode worker can name the mismatch too; nothing else
             * from this connection is read, and it closes shortly. Logged once per reason. */
            if (strcmp(why, w->last_refusal) != 0)
                kvf_log(KVF_LOG_WARN, "kvfence prefill: refusing a decode worker: %s\n", why);
            kvf__strlcpy(w->last_refusal, why, sizeof w->last_refusal);
            struct kvf_msg reply = {.type = KVF_MSG_HELLO, .epoch = m.epoch};
            reply.u.hello = mine;
            kvf__send_msg(s->conn, &reply, w->frame, PF_FRAME_CAP);
            s->refused_ms = now_ms(w) + 500;
            return;
        }
        struct kvf_msg reply = {.type = KVF_MSG_HELLO, .epoch = m.epoch};
        reply.u.hello = mine;
        kvf__send_msg(s->conn, &reply, w->frame, PF_FRAME_CAP);
        s->hello_ok = true;
        s->epoch = m.epoch;
        kvf_prefill_connect(s->m, m.epoch, &w->acts);
        run_actions(w, s, NULL);
        kvf__forge_replay_fenced(w, s);
        return;
    }
    if (!s->hello_ok) return;
    kvf_prefill_on_msg(s->m, now_ms(w), &m, &w->acts);
    run_actions(w, s, &m);
}

static void sess_reap(struct kvf_pworker *w);

static void sess_open(struct kvf_pworker *w, kvf_conn_t *c)
{
    struct psess *s = NULL;
    for (int pass = 0; pass < 2 && !s; pass++) {
        for (uint32_t i = 0; i < PF_MAX_SESS && !s; i++)
            if (!w->sess[i].used) s = &w->sess[i];
        if (s || pass) break;
        /* Full: a connection that never said HELLO is the one to let go (a decode worker that
         * reconnected many times while this process was stopped leaves such attempts queued). */
        for (uint32_t i = 0; i < PF_MAX_SESS; i++)
            if (!w->sess[i].hello_ok && !w->sess[i].failed) {
                w->sess[i].failed = true;
                break;
            }
        sess_reap(w);
    }
    struct kvf_prefill_config pc = {
        s ? (uint16_t)(s - w->sess) : 0,
        w->cfg.max_reqs,
        (uint32_t)((w->cfg.max_context + w->geo.page_tokens - 1) / w->geo.page_tokens),
        w->cfg.max_context,
        w->geo.page_tokens,
        NULL};
    if (!s || kvf_prefill_create(&pc, &s->m) < 0) {
        kvf_conn_close(c);
        return;
    }
    s->used = true;
    s->conn = c;
    s->hello_ok = s->failed = false;
}

static bool sess_has_jobs(struct kvf_pworker *w, struct psess *s)
{
    for (uint32_t i = 0; i < w->cfg.max_reqs; i++)
        if (w->jobs[i].used && w->jobs[i].s == s) return true;
    return false;
}

/* A failed session: its machine forgets everything (aborting live jobs), its endpoint closes
 * (outstanding puts end with errors, releasing their sources), and once no job names it the
 * session goes. */
static void sess_reap(struct kvf_pworker *w)
{
    for (uint32_t i = 0; i < PF_MAX_SESS; i++) {
        struct psess *s = &w->sess[i];
        if (!s->used || !s->failed) continue;
        if (s->conn) {
            kvf__forge_keep_fenced(w, s);
            kvf_prefill_peer_down(s->m, &w->acts);
            run_actions(w, s, NULL);
            kvf_conn_t *c = s->conn;
            s->conn = NULL;
            kvf_conn_close(c);
        }
        if (sess_has_jobs(w, s)) continue;
        kvf_prefill_destroy(s->m);
        memset(s, 0, sizeof(*s));
    }
}

static void handle_events(struct kvf_pworker *w)
{
    while (w->ev_head) {
        struct pev *e = w->ev_head;
        w->ev_head = e->next;
        if (!w->ev_head) w->ev_tail = NULL;
        struct psess *s = e->conn ? sess_of(w, e->conn) : NULL;
        switch (e->kind) {
        case PEV_ACCEPT:
            sess_open(w, e->conn);
            break;
        case PEV_FRAME:
            if (s && !s->failed) handle_frame(w, s, e->buf, e->len);
            break;
        case PEV_CONN_FAILED:
            if (s) s->failed = true;
            break;
        case PEV_FLUSHED: {
            struct pjob *j = e->job;
            if (j->used && j->s && !j->s->failed && j->nonce == e->nonce) {
                kvf_prefill_flushed(j->s->m, now_ms(w), j->req, j->nonce, &w->acts);
                run_actions(w, j->s, NULL);
            }
            job_maybe_free(w, j);
            break;
        }
        }
        free(e->buf);
        free(e);
    }
}

/* One turn of the loop: everything ready now, without waiting. Returns how long the loop may
 * sleep on the transport (ms). */
static int turn(struct kvf_pworker *w)
{
    kvf_xport_progress(w->x);
    handle_events(w);
    uint64_t now = now_ms(w);
    for (uint32_t i = 0; i < PF_MAX_SESS; i++)
        if (w->sess[i].used && w->sess[i].refused_ms && now >= w->sess[i].refused_ms)
            w->sess[i].failed = true;
    sess_reap(w);
    struct kvf_pool_stats ps;
    kvf_pool_stats(w->pool, &ps);
    struct kvf_prefix_cache_stats cs = {0};
    if (w->cache) kvf__pcache_stats(w->cache, &cs);
    pthread_mutex_lock(&w->info_mu);
    w->info_pages = ps.n_pages;
    w->info_free = ps.by_state[KVF_PAGE_FREE];
    w->info_cache = cs;
    pthread_mutex_unlock(&w->info_mu);
    if (step_state(w) == STEP_DONE) finish_chunk(w);
    bool waiting = false, stepping = step_state(w) != STEP_IDLE;
    if (!stepping && w->queue_head) stepping = start_chunk(w, &waiting);
    post_completed(w);
    send_progress(w);
    /* While a chunk runs the compute thread's end wakes us; the progress reports need a turn at
     * least every PF_PROGRESS_MS. A job waiting for pages that puts in flight still read polls
     * soon (their completions come through the transport). */
    return waiting ? 5 : stepping || w->queue_head ? (int)PF_PROGRESS_MS : 200;
}

static void *loop(void *arg)
{
    struct kvf_pworker *w = arg;
    while (!w->stop)
        kvf__loop_wait(w->x, w->wake_fd, turn(w));
    /* A chunk still on the compute thread finishes before anything is torn down. */
    while (step_state(w) == STEP_GO)
        kvf__loop_wait(w->x, w->wake_fd, 50);
    if (step_state(w) == STEP_DONE) finish_chunk(w);
    post_completed(w);
    return NULL;
}

int kvf_pworker_turn(kvf_pworker_t *w)
{
    if (!w->cfg.manual) return -EINVAL;
    (void)turn(w);
    return 0;
}

int kvf_pworker_compute(kvf_pworker_t *w)
{
    if (!w->cfg.manual) return -EINVAL;
    if (step_state(w) != STEP_GO) return 0;
    compute_chunk(w);
    return 1;
}

const struct kvf_pool *kvf_pworker_page_pool(const kvf_pworker_t *w)
{
    return w ? w->pool : NULL;
}

bool kvf_pworker_check(const kvf_pworker_t *w, char *why, size_t why_len)
{
    for (uint32_t i = 0; i < PF_MAX_SESS; i++)
        if (w->sess[i].used && w->sess[i].m && !kvf_prefill_check(w->sess[i].m, why, why_len))
            return false;
    return kvf_pool_check(w->pool, why, why_len);
}

bool kvf_pworker_computing(kvf_pworker_t *w)
{
    return step_state(w) == STEP_GO;
}

/* --- Start and stop. ------------------------------------------------------------------------- */

static void destroy(struct kvf_pworker *w)
{
    if (w->cthread_started) { /* the loop left no chunk running */
        pthread_mutex_lock(&w->cmu);
        w->compute_quit = true;
        pthread_cond_broadcast(&w->ccv);
        pthread_mutex_unlock(&w->cmu);
        pthread_join(w->cthread, NULL);
    }
    /* Endpoints first (forced: the fence), so nothing can still be written or read. */
    for (uint32_t i = 0; i < PF_MAX_SESS; i++)
        if (w->sess[i].used) w->sess[i].failed = true;
    if (w->x) {
        sess_reap(w);
        kvf_xport_destroy(w->x);
        w->x = NULL;
    }
    handle_events(w);
    if (w->jobs) {
        for (uint32_t i = 0; i < w->cfg.max_reqs; i++)
            if (w->jobs[i].used) job_free(w, &w->jobs[i]);
    }
    for (uint32_t i = 0; i < PF_MAX_SESS; i++)
        if (w->sess[i].m) kvf_prefill_destroy(w->sess[i].m);
    if (w->pool) kvf__pcache_free(w->cache, w->pool, now_ms(w));
    kvf_fwd_destroy(w->fwd);
    kvf_pool_destroy(w->pool);
    free(w->jobs);
    free(w->acts.v);
    free(w->scratch.pages);
    free(w->scratch.checksums);
    free(w->scratch.tokens);
    free(w->frame);
    free(w->logits);
    free(w->sample_scratch);
    free(w->gbuf);
    kvf__gram_reg_free(&w->greg);
    kvf__forge_free(w); /* after the transport: no forged put reads them now */
    if (w->wake_fd >= 0) close(w->wake_fd);
    pthread_mutex_destroy(&w->info_mu);
    pthread_mutex_destroy(&w->cmu);
    pthread_cond_destroy(&w->ccv);
    free(w);
}

int kvf_pworker_start(const struct kvf_worker_config *cfg, kvf_pworker_t **out, char *err,
                      size_t err_len)
{
    struct kvf_pworker *w = calloc(1, sizeof(*w));
    if (!w) return -ENOMEM;
    w->cfg = *cfg;
    pthread_mutex_init(&w->info_mu, NULL);
    pthread_mutex_init(&w->cmu, NULL);
    pthread_cond_init(&w->ccv, NULL);
    w->chunk = cfg->prefill_chunk ? cfg->prefill_chunk : PF_CHUNK;
    if (!w->cfg.max_reqs) w->cfg.max_reqs = 64;
    w->wake_fd = kvf__wake_open();
    int rc = w->wake_fd < 0 ? w->wake_fd : 0;
    const struct kvf_model_hparams *hp = kvf_model_hparams(cfg->model);
    w->n_vocab = hp->n_vocab;
    kvf_model_geometry(cfg->model, cfg->page_tokens, &w->geo);
    w->data_bytes = kvf_geo_data_bytes(&w->geo);
    w->trailer_off = kvf_geo_trailer_offset(&w->geo);
    w->page_bytes = kvf_geo_page_bytes(&w->geo);
    w->block_bytes = kvf_geo_block_bytes(&w->geo);
    uint32_t max_pages = (cfg->max_context + cfg->page_tokens - 1) / cfg->page_tokens;
    struct kvf_pool_config pc = {.geo = w->geo,
                                 .n_pages = cfg->n_pages + cfg->prefix_cache_pages,
                                 .max_peers = 1,
                                 .tag_seed = 0x5000000000ull,
                                 .poison_on_free = cfg->poison_free};
#if defined(KVF_TEST_BUILD)
    /* KVF_POISON=1 poisons this pool's freed pages whoever started the worker (serve too). */
    if (getenv("KVF_POISON") && atoi(getenv("KVF_POISON"))) pc.poison_on_free = true;
#endif
    struct kvf_fwd_config fc = {cfg->n_threads ? cfg->n_threads : 1, w->chunk, 1, NULL,
                                cfg->max_context};
    if (rc == 0 && (rc = kvf_pool_create(&pc, &w->pool)) < 0)
        snprintf(err, err_len, "cannot create the prefill pool of %u pages: %s", cfg->n_pages,
                 kvf_strerror(rc));
    if (rc == 0 && (rc = kvf_fwd_create(cfg->model, &fc, &w->fwd)) < 0)
        snprintf(err, err_len, "cannot start the compute threads: %s", kvf_strerror(rc));
    if (rc == 0 && cfg->prefix_cache_pages &&
        !(w->cache = kvf__pcache_new(cfg->prefix_cache_pages, cfg->page_tokens))) {
        rc = -ENOMEM;
        snprintf(err, err_len, "out of memory for the prefix cache");
    }
    if (rc == 0) {
        w->jobs = calloc(w->cfg.max_reqs, sizeof(*w->jobs));
        w->acts.cap = 4 * w->cfg.max_reqs + 64;
        w->acts.v = calloc(w->acts.cap, sizeof(*w->acts.v));
        w->scratch.pages = calloc(max_pages, sizeof(*w->scratch.pages));
        w->scratch.pages_cap = max_pages;
        w->scratch.checksums = calloc(max_pages, sizeof(uint64_t));
        w->scratch.checksums_cap = max_pages;
        w->scratch.tokens = calloc(cfg->max_context, sizeof(uint32_t));
        w->scratch.tokens_cap = cfg->max_context;
        w->frame = malloc(PF_FRAME_CAP);
        w->logits = malloc(hp->n_vocab * sizeof(float));
        w->sample_scratch = calloc(1, kvf_sample_scratch_bytes(hp->n_vocab));
        kvf__gram_reg_init(&w->greg, 16);
        if (!w->sample_scratch || !w->jobs || !w->acts.v || !w->scratch.pages ||
            !w->scratch.checksums || !w->scratch.tokens || !w->frame || !w->logits) {
            rc = -ENOMEM;
            snprintf(err, err_len, "out of memory");
        }
    }
    if (rc == 0) {
        struct kvf_xport_config xc = {cfg->listen_host ? cfg->listen_host : "127.0.0.1",
                                      cfg->listen_port,
                                      cfg->keepalive_ms,
                                      NULL,
                                      0,
                                      cfg->fabric_key,
                                      cfg->transport,
                                      cfg->transport_ctx};
        struct kvf_xport_events ev = {w, on_accept, on_frame, NULL, on_error};
        rc = kvf_xport_create(&xc, &ev, &w->x, err, err_len);
    }
#if defined(KVF_TEST_BUILD)
    if (rc == 0) {
        struct kvf_xport_faults f;
        if (kvf_xport_faults_from_env(&f) == 0) kvf_xport_set_faults(w->x, &f);
        kvf__forge_init(w);
        const char *cm = getenv("KVF_TEST_CHUNK_MS");
        w->test_chunk_ms = cm ? (uint32_t)atoi(cm) : 0;
    }
#endif
    if (rc == 0 && !cfg->manual && (rc = -pthread_create(&w->cthread, NULL, compute_main, w)) < 0)
        snprintf(err, err_len, "cannot start the prefill compute thread");
    if (rc == 0 && !cfg->manual) w->cthread_started = true;
    if (rc == 0 && !cfg->manual && (rc = -pthread_create(&w->thread, NULL, loop, w)) < 0)
        snprintf(err, err_len, "cannot start the prefill loop thread");
    if (rc < 0) {
        destroy(w);
        return rc;
    }
    w->started = !cfg->manual;
    *out = w;
    return 0;
}

void kvf_pworker_pool(kvf_pworker_t *w, uint32_t *pages, uint32_t *free_pages)
{
    pthread_mutex_lock(&w->info_mu);
    *pages = w->info_pages;
    *free_pages = w->info_free;
    pthread_mutex_unlock(&w->info_mu);
}

void kvf_pworker_cache(kvf_pworker_t *w, struct kvf_prefix_cache_stats *out)
{
    pthread_mutex_lock(&w->info_mu);
    *out = w->info_cache;
    pthread_mutex_unlock(&w->info_mu);
}

uint16_t kvf_pworker_port(const kvf_pworker_t *w)
{
    return kvf_xport_port(w->x);
}

void kvf_pworker_stop(kvf_pworker_t *w)
{
    if (!w) return;
    w->stop = 1;
    kvf__wake(w->wake_fd);
    if (w->started) pthread_join(w->thread, NULL);
    destroy(w);
}
