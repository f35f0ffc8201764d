/*
 * prefill_forge.c — test builds only (src/engine/CMakeLists.txt leaves it out of every other):
 * the prefill worker's forgeries (H18) for the isolation suite and the simulator on the real
 * loops. The worker calls the kvf__forge_* hooks (prefill_internal.h), which are empty inline
 * functions outside test builds, so the production path carries no test code.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prefill_internal.h"

#if !defined(KVF_TEST_BUILD)
#error "prefill_forge.c is compiled in test builds only"
#endif

/*
 * KVF_TEST_FORGE="every=N,token=T" makes this worker misbehave on purpose, so that the suite can
 * show the decode side refusing what an honest prefill never sends (tests/isolation,
 * docs/ISOLATION.md). Release builds have none of it. Counting DONEs this worker sends:
 *   - every Nth DONE is preceded by two forged copies whose first token is T: one at the
 *     previous connection epoch (a fenced epoch's DONE) and one with a nonce no grant has. Decode
 *     must ignore both and count them as stale; accepted, T would head the reply.
 *   - before the flush of every Nth job (offset by N/2), the data bytes of a page this worker
 *     wrote earlier for another tenant's request are written over the job's first granted page
 *     (stale bytes in a page now granted to another request). The DONE's checksum no longer
 *     matches the page: decode must refuse the commit and fail the request.
 * every=0 turns those two off. With ",refuse=R" (R >= 2) the engine also refuses every Rth
 * granted prompt of two pages or more before computing it, as when it cannot get memory: the
 * machine must answer REJECT and the request fail with an error (the path of the 2026
 * placeholder bug, H6). With ",short=S" (S >= 2) every Sth granted prompt of two pages or more
 * that fills its last page is computed whole but handed off short: only its first page is put, and
 * its DONE says it wrote that page's tokens — a writer that stopped early and says so. Decode must
 * compare the count with the prompt and fail the request; a decode that does not reads the pages
 * nobody wrote. With ",fenced=1", the grants of a session that failed (its endpoint closed: decode
 * fenced this writer, or the connection broke) get DONEs on the next session that says HELLO: each
 * at the failed session's epoch, with the grant's own request and nonce and page count, first token
 * T and zero checksums — a writer replaying its fenced epoch's answers. Decode must ignore them
 * (counted as stale): the fence ended those grants; accepted, T would head the reply.
 * Each forgery logs one "test forge:" line (kvf_log; the CLI writes it to stderr), which the
 * suite counts. */
#define PF_FORGE_REPLAYS 32
struct pforge {
    uint32_t every, token, refuse, shorts, fenced;
    struct {
        kvf_req_id_t req;
        uint64_t nonce;
        uint32_t epoch, n_pages, n_tokens;
    } replay[PF_FORGE_REPLAYS]; /* fenced=1: the failed session's grants, replayed next session */
    uint32_t n_replay;
    uint64_t *zero_sums; /* [seq pages]: the replayed DONEs' checksums */
    uint64_t dones, flushes, computes, short_computes;
    struct {
        uint8_t *bytes;  /* [data_bytes]: a copy of a first page written for an earlier request */
        uint32_t tenant; /* whose request it was */
        bool have;
    } stale[2];        /* two tenants' copies, so one is always another tenant's */
    uint32_t replace;  /* the copy a third tenant's page replaces next */
    uint32_t puts_out; /* forged puts not complete locally: no copy is refreshed meanwhile */
};

void kvf__forge_init(struct kvf_pworker *w)
{
    const char *e = getenv("KVF_TEST_FORGE");
    unsigned every = 0, token = 0;
    unsigned refuse = 0, shorts = 0, fenced = 0;
    if (!e) return;
    /* every=N,token=T[,refuse=R][,short=S]; every=0 leaves the DONEs and writes alone. */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", e);
    bool bad = false;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        unsigned v = 0;
        if (sscanf(t, "every=%u", &v) == 1)
            every = v;
        else if (sscanf(t, "token=%u", &v) == 1)
            token = v;
        else if (sscanf(t, "refuse=%u", &v) == 1)
            refuse = v;
        else if (sscanf(t, "short=%u", &v) == 1)
            shorts = v;
        else if (sscanf(t, "fenced=%u", &v) == 1)
            fenced = v;
        else
            bad = true;
    }
    if (bad || every == 1 || refuse == 1 || shorts == 1 || fenced > 1 ||
        (!every && !refuse && !shorts && !fenced)) {
        kvf_log(KVF_LOG_WARN,
                "kvfence prefill: test build: KVF_TEST_FORGE='%s' ignored "
                "(every=N,token=T,refuse=R,short=S,fenced=0|1; N, R, S >= 2)\n",
                e);
        return;
    }
    uint32_t seq_pages =
        (uint32_t)((w->cfg.max_context + w->geo.page_tokens - 1) / w->geo.page_tokens);
    struct pforge *f = calloc(1, sizeof(*f));
    if (!f || !(f->stale[0].bytes = malloc(w->data_bytes)) ||
        !(f->stale[1].bytes = malloc(w->data_bytes)) ||
        !(f->zero_sums = calloc(seq_pages, sizeof(uint64_t)))) {
        if (f) free(f->stale[0].bytes);
        if (f) free(f->stale[1].bytes);
        free(f);
        return;
    }
    f->fenced = fenced;
    f->every = every;
    f->token = token;
    f->refuse = refuse;
    f->shorts = shorts;
    w->forge = f;
    kvf_log(KVF_LOG_INFO,
            "kvfence prefill: test build: KVF_TEST_FORGE every %u, token %u, refuse %u, short %u, "
            "fenced %u\n",
            every, token, f->refuse, f->shorts, f->fenced);
    kvf__test_event("forge_on",
                    ",\"every\":%u,\"token\":%u,\"refuse\":%u,\"short\":%u,\"fenced\":%u", every,
                    token, f->refuse, f->shorts, f->fenced);
}

/* Before computing a job: whether the engine refuses it (every Rth of two pages or more). */
bool kvf__forge_refuse(struct kvf_pworker *w, const struct pjob *j)
{
    struct pforge *f = w->forge;
    if (!f || !f->refuse || j->n_pages < 2) return false;
    if (KVF_MUTANT(PLACEHOLDER_AFTER_REJECT) && j->placeholder) return false;
    if (++f->computes % f->refuse != 0) return false;
    kvf_log(KVF_LOG_INFO,
            "kvfence prefill: test forge: a granted prompt of %u pages refused by the engine\n",
            j->n_pages);
    /* The granted pages, "page:tag,...": the loops simulator checks that none of them receives
     * a write of this grant from now on (its L9). */
    char dst[640];
    size_t len = 0;
    dst[0] = '\0';
    for (uint32_t i = 0; i < j->n_pages; i++) {
        int k = snprintf(dst + len, sizeof dst - len, "%s%u:%" PRIu64, i ? "," : "", j->dst[i].page,
                         j->dst[i].tag);
        if (k < 0 || (size_t)k >= sizeof dst - len) {
            dst[len] = '\0'; /* the pages that fit */
            break;
        }
        len += (size_t)k;
    }
    kvf__test_event("forge_refused", ",\"pages\":%u,\"dst\":\"%s\"", j->n_pages, dst);
    return true;
}

/* Before computing a job the engine took: whether it is handed off short (every Sth of two pages
 * or more that fills its last page). */
void kvf__forge_short(struct kvf_pworker *w, struct pjob *j)
{
    struct pforge *f = w->forge;
    /* Prompts that fill their last page only: with a partial last page, decode's check that the
     * unwritten slots arrived zero (decode_worker.c, tail_is_clean) fails the request before
     * anything reads it, so there the count check is not the only guard. */
    if (!f || !f->shorts || j->n_pages < 2 || j->n_tokens % w->geo.page_tokens != 0) return;
    if (KVF_MUTANT(PLACEHOLDER_AFTER_REJECT) && j->placeholder) return;
    if (++f->short_computes % f->shorts != 0) return;
    j->forged_short = true;
    kvf_log(KVF_LOG_INFO,
            "kvfence prefill: test forge: a prompt of %u tokens handed off short (%u of %u pages "
            "put)\n",
            j->n_tokens, 1u, j->n_pages);
    kvf__test_event("forge_short", ",\"tokens\":%u,\"pages\":%u", j->n_tokens, j->n_pages);
}

static void forge_put_done(void *arg, int status)
{
    (void)status;
    ((struct pforge *)arg)->puts_out--;
}

/* At a put of page 0: keep a copy of its bytes for a later forged write. */
void kvf__forge_keep(struct kvf_pworker *w, const struct pjob *j, const uint8_t *src)
{
    struct pforge *f = w->forge;
    if (!f || f->puts_out) return;
    uint32_t i = f->stale[0].have && f->stale[0].tenant == j->tenant   ? 0
                 : f->stale[1].have && f->stale[1].tenant == j->tenant ? 1
                                                                       : (f->replace ^= 1);
    memcpy(f->stale[i].bytes, src, w->data_bytes);
    f->stale[i].tenant = j->tenant;
    f->stale[i].have = true;
}

/* Before a job's flush: stale bytes of another tenant over its first granted page. */
void kvf__forge_write(struct kvf_pworker *w, struct psess *s, struct pjob *j)
{
    struct pforge *f = w->forge;
    if (!f || !j->computed || j->aborted || !s->conn || s->failed) return;
    if (!f->every || ++f->flushes % f->every != f->every / 2) return;
    uint32_t i = f->stale[0].have && f->stale[0].tenant != j->tenant ? 0 : 1;
    if (!f->stale[i].have || f->stale[i].tenant == j->tenant) return;
    f->puts_out++;
    uint64_t off = (uint64_t)j->dst[0].page * w->page_bytes;
    if (kvf_conn_put(s->conn, f->stale[i].bytes, w->data_bytes, off, forge_put_done, f) < 0) {
        f->puts_out--; /* never posted: no completion comes */
        return;
    }
    kvf_log(KVF_LOG_INFO, "kvfence prefill: test forge: stale bytes written into a page granted to "
                          "another request\n");
    kvf__test_event("forge_write", NULL);
}

/* Before a DONE: a short handoff's count; and the same DONE at the previous epoch and with an
 * unknown nonce, first token T. */
void kvf__forge_done(struct kvf_pworker *w, struct psess *s, const struct pjob *j,
                     struct kvf_msg *done)
{
    if (j->forged_short) /* the DONE says only page 0 was written */
        done->u.done.tokens_written =
            j->n_tokens < w->geo.page_tokens ? j->n_tokens : w->geo.page_tokens;
    struct pforge *f = w->forge;
    if (!f || !f->every || !s->conn || s->failed || ++f->dones % f->every != 0) return;
    struct kvf_msg m = *done;
    m.u.done.first_token = f->token;
    m.epoch = done->epoch - 1;
    kvf__send_msg(s->conn, &m, w->frame, PF_FRAME_CAP);
    m.epoch = done->epoch;
    m.nonce = done->nonce ^ 0x8000000000000000ull;
    kvf__send_msg(s->conn, &m, w->frame, PF_FRAME_CAP);
    kvf_log(
        KVF_LOG_INFO,
        "kvfence prefill: test forge: DONE replayed at a stale epoch and with an unknown nonce\n");
    kvf__test_event("forge_done", NULL);
}

/* A session failed (before its machine forgets its grants): keep what its DONEs would name. */
void kvf__forge_keep_fenced(struct kvf_pworker *w, struct psess *s)
{
    struct pforge *f = w->forge;
    if (!f || !f->fenced || !s->hello_ok) return;
    for (uint32_t i = 0; i < w->cfg.max_reqs && f->n_replay < PF_FORGE_REPLAYS; i++) {
        const struct pjob *j = &w->jobs[i];
        if (!j->used || j->s != s) continue;
        f->replay[f->n_replay].req = j->req;
        f->replay[f->n_replay].nonce = j->nonce;
        f->replay[f->n_replay].epoch = s->epoch;
        f->replay[f->n_replay].n_pages = j->n_pages;
        f->replay[f->n_replay].n_tokens = j->n_tokens;
        f->n_replay++;
    }
}

/* A new session said HELLO: the failed session's grants get their DONEs on it, at their epoch. */
void kvf__forge_replay_fenced(struct kvf_pworker *w, struct psess *s)
{
    struct pforge *f = w->forge;
    if (!f || !f->n_replay || !s->conn || s->failed) return;
    for (uint32_t i = 0; i < f->n_replay; i++) {
        if (f->replay[i].epoch == s->epoch) continue;
        struct kvf_msg m = {.type = KVF_MSG_DONE,
                            .req = f->replay[i].req,
                            .nonce = f->replay[i].nonce,
                            .epoch = f->replay[i].epoch};
        m.u.done.tokens_written = f->replay[i].n_tokens;
        m.u.done.first_token = f->token;
        m.u.done.n_pages = f->replay[i].n_pages;
        m.u.done.checksums = f->zero_sums;
        kvf__send_msg(s->conn, &m, w->frame, PF_FRAME_CAP);
        kvf_log(KVF_LOG_INFO, "kvfence prefill: test forge: DONE of a fenced epoch replayed on the "
                              "next connection\n");
        kvf__test_event("forge_fenced_done", NULL);
    }
    f->n_replay = 0;
}

void kvf__forge_free(struct kvf_pworker *w)
{
    if (!w->forge) return;
    free(w->forge->stale[0].bytes);
    free(w->forge->stale[1].bytes);
    free(w->forge->zero_sums);
    free(w->forge);
    w->forge = NULL;
}
