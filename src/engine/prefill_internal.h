/* prefill_internal.h — the prefill worker's structures, shared by its loop (prefill_worker.c) and,
 * in test builds, its forgeries (prefill_forge.c). Internal to src/engine. */
#ifndef KVF_PREFILL_INTERNAL_H
#define KVF_PREFILL_INTERNAL_H

#include "engine_internal.h"

#define PF_CHUNK       256u /* prompt tokens per forward call, unless prefill_chunk says */
#define PF_MAX_PASSES  4u   /* turns a started job may be passed over in a row */
#define PF_PROGRESS_MS 250u /* at most this often, each job's PROGRESS (while compute advances) */
#define PF_MAX_SESS    8u   /* decode connections at once */
#define PF_FRAME_CAP   (KVF_PROTO_MAX_MSG_BYTES)

struct pjob;

/* One put of one page: data then trailer; both must complete locally before RELEASE_SRC. */
struct pput {
    struct kvf_pworker *w;
    struct pjob *job;
    uint32_t index;
    uint32_t left; /* puts of this page not yet complete locally */
};

struct pjob {
    bool used;
    struct kvf_pworker *w;
    bool flush_out; /* a flush of this job is outstanding: its callback still names the job */
    struct psess *s;
    kvf_req_id_t req;
    uint64_t nonce;
    uint32_t tenant;
    struct kvf_msg_sampling sampling;
    uint32_t n_tokens;
    int32_t *tokens; /* [n_tokens] */
    uint32_t n_pages;
    struct kvf_page_ref *dst;          /* [n_pages]: the granted decode pages */
    struct kvf_page_ref *src;          /* [n_pages]: this pool's pages */
    struct kvf_page_trailer *trailers; /* [n_pages]: put after each page's data */
    struct pput *puts;                 /* [n_pages] */
    uint32_t puts_out;                 /* puts posted and not complete locally */
    bool computed, aborted, finished;  /* finished: the machine no longer needs it */
    bool started;                      /* has its source pages; chunks may run */
    bool in_step;                      /* a chunk of it is on the compute thread */
    uint32_t pos;                      /* prompt tokens computed */
    uint32_t reported;                 /* pages reported ready (posted) */
    uint32_t passes;                   /* turns passed over in a row since it started */
    bool no_pages;                     /* not started, and its pages are not free this turn */
    uint32_t first_token;              /* computed: the token drawn after the last chunk */
    uint32_t cached;                   /* its first pages, taken from the prefix cache */
    bool placeholder; /* mutant placeholder_after_reject: recomputed as one token after the
                         engine refused it (false in every other build) */
#if defined(KVF_TEST_BUILD)
    bool forged_short; /* KVF_TEST_FORGE short: only page 0 is put, the DONE counts its tokens */
#endif
    bool src_let_go; /* mutant src_freed_at_post: the job's own hold on its source pages ended
                        at the last post (false in every other build) */
    float first_logprob;
    uint32_t n_top;
    int32_t top_ids[KVF_GEN_MAX_LOGPROBS];
    float top_lps[KVF_GEN_MAX_LOGPROBS];
    struct pjob *next_queued;
};

struct psess {
    bool used;
    kvf_conn_t *conn;
    kvf_prefill_t *m;
    bool hello_ok, failed;
    uint32_t epoch;
    uint64_t refused_ms; /* its HELLO disagreed: our HELLO went back, and it closes at this time */
};

enum pev_kind { PEV_FRAME = 1, PEV_FLUSHED = 2, PEV_CONN_FAILED = 3, PEV_ACCEPT = 4 };
struct pev {
    enum pev_kind kind;
    kvf_conn_t *conn;
    struct pjob *job;
    uint64_t nonce;
    kvf_req_id_t req;
    int status;
    uint8_t *buf;
    size_t len;
    struct pev *next;
};

struct kvf_pworker {
    struct kvf_worker_config cfg;
    char last_refusal[KVF_PREFILL_WHY_MAX]; /* the last mismatch logged (each reason once) */
    pthread_t thread;
    bool started;
    volatile int stop;
    int wake_fd;
    kvf_pool_t *pool;
    kvf_fwd_t *fwd;
    kvf_xport_t *x;
    uint32_t n_vocab;
    size_t data_bytes, trailer_off, page_bytes, block_bytes;
    struct kvf_pool_geometry geo;
    struct psess sess[PF_MAX_SESS];
    struct pjob *jobs; /* [max_reqs] */
    struct pjob *queue_head, *queue_tail;
    struct pev *ev_head, *ev_tail;
    struct kvf_actions acts;
    bool in_actions;
    struct kvf_msg_scratch scratch;
    uint8_t *frame;
    float *logits;
    void *sample_scratch;      /* kvf_sample_scratch_bytes(n_vocab): sampling allocates nothing */
    struct kvf__gram_reg greg; /* the loop's: recently used grammars (it draws first tokens) */
    float *gbuf;               /* [n_vocab] masked logits, made at the first grammar */
    uint64_t bad_frames;       /* counter: control frames that did not decode */
    uint32_t chunk;            /* prompt tokens per chunk */
    /* The compute thread: one chunk at a time. step_state moves IDLE → GO (loop) → DONE
     * (compute) → IDLE (loop, at the commit); the other fields are the loop's, read by the
     * compute thread only between GO and DONE. */
    pthread_t cthread;
    bool cthread_started;
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    enum { STEP_IDLE, STEP_GO, STEP_DONE } step_state;
    bool compute_quit;
    int step_rc;
    struct pjob *step_job;
    struct kvf_fwd_seq step_seq;
    uint32_t step_len;
    bool step_last;
    /* Progress: what the compute had done at the last report, and when that was. */
    uint64_t seen_layers, seen_puts, puts_done, last_progress_ms;
    bool chunk_done;         /* a chunk finished since the last report */
    pthread_mutex_t info_mu; /* guards the figures below, read from other threads */
    uint32_t info_pages, info_free;
    struct kvf_prefix_cache_stats info_cache;
    struct kvf__pcache *cache; /* cfg.prefix_cache_pages > 0: the tenants' computed pages */
#if defined(KVF_TEST_BUILD)
    struct pforge *forge;   /* KVF_TEST_FORGE: see "Test builds: forgeries" below; NULL = off */
    uint32_t test_chunk_ms; /* KVF_TEST_CHUNK_MS: each chunk's compute takes this much longer (a
                               slow but live prefill, for the long-prompt tests) */
#endif
};

/* --- The prefix cache (prefix_cache.c; docs/PREFIX_CACHE.md). ----------------------------------
 */
struct kvf__pcache;
/* A cache of at most max_pages pages of page_tokens tokens; NULL when out of memory. */
struct kvf__pcache *kvf__pcache_new(uint32_t max_pages, uint32_t page_tokens);
/* Drops every entry (the cache's holds released) and frees the cache. NULL is a no-op. */
void kvf__pcache_free(struct kvf__pcache *c, kvf_pool_t *pool, uint64_t now);
/* The longest run of whole pages at the start of tokens (at most max_pages) cached for tenant:
 * each is shared to the caller (a KVF_HOLDER_SEQ hold) and written to out; returns how many. */
uint32_t kvf__pcache_take(struct kvf__pcache *c, kvf_pool_t *pool, uint32_t tenant,
                          const int32_t *tokens, uint32_t max_pages, struct kvf_page_ref *out);
/* A job computed its prompt: its whole pages src[from..n_full) (from: the pages it took from the
 * cache) enter the cache, sealed, each under a KVF_HOLDER_PREFIX hold. */
void kvf__pcache_put(struct kvf__pcache *c, kvf_pool_t *pool, uint32_t tenant,
                     const int32_t *tokens, const struct kvf_page_ref *src, uint32_t from,
                     uint32_t n_full, uint64_t now);
/* Evicts up to n entries, least recently used first; returns how many. */
uint32_t kvf__pcache_evict(struct kvf__pcache *c, kvf_pool_t *pool, uint32_t n, uint64_t now);
void kvf__pcache_stats(const struct kvf__pcache *c, struct kvf_prefix_cache_stats *out);

/* --- The forgeries' hooks (prefill_forge.c, test builds; no-ops in every other build). ------- */
#if defined(KVF_TEST_BUILD)
void kvf__forge_init(struct kvf_pworker *w);
void kvf__forge_free(struct kvf_pworker *w);
/* Before computing a job: whether the engine refuses it; whether it is handed off short. */
bool kvf__forge_refuse(struct kvf_pworker *w, const struct pjob *j);
void kvf__forge_short(struct kvf_pworker *w, struct pjob *j);
/* A short handoff's pages after the first are never put. */
static inline bool kvf__forge_skip_put(const struct pjob *j, uint32_t index)
{
    return j->forged_short && index > 0;
}
/* At a put of page 0: a copy of its bytes for a later forged write. */
void kvf__forge_keep(struct kvf_pworker *w, const struct pjob *j, const uint8_t *src);
/* Before a job's flush; before its DONE is sent (the DONE may be rewritten). */
void kvf__forge_write(struct kvf_pworker *w, struct psess *s, struct pjob *j);
void kvf__forge_done(struct kvf_pworker *w, struct psess *s, const struct pjob *j,
                     struct kvf_msg *done);
/* A session failed; a new one said HELLO. */
void kvf__forge_keep_fenced(struct kvf_pworker *w, struct psess *s);
void kvf__forge_replay_fenced(struct kvf_pworker *w, struct psess *s);
#else
static inline void kvf__forge_init(struct kvf_pworker *w)
{
    (void)w;
}
static inline void kvf__forge_free(struct kvf_pworker *w)
{
    (void)w;
}
static inline bool kvf__forge_refuse(struct kvf_pworker *w, const struct pjob *j)
{
    (void)w;
    (void)j;
    return false;
}
static inline void kvf__forge_short(struct kvf_pworker *w, struct pjob *j)
{
    (void)w;
    (void)j;
}
static inline bool kvf__forge_skip_put(const struct pjob *j, uint32_t index)
{
    (void)j;
    (void)index;
    return false;
}
static inline void kvf__forge_keep(struct kvf_pworker *w, const struct pjob *j, const uint8_t *src)
{
    (void)w;
    (void)j;
    (void)src;
}
static inline void kvf__forge_write(struct kvf_pworker *w, struct psess *s, struct pjob *j)
{
    (void)w;
    (void)s;
    (void)j;
}
static inline void kvf__forge_done(struct kvf_pworker *w, struct psess *s, const struct pjob *j,
                                   struct kvf_msg *done)
{
    (void)w;
    (void)s;
    (void)j;
    (void)done;
}
static inline void kvf__forge_keep_fenced(struct kvf_pworker *w, struct psess *s)
{
    (void)w;
    (void)s;
}
static inline void kvf__forge_replay_fenced(struct kvf_pworker *w, struct psess *s)
{
    (void)w;
    (void)s;
}
#endif

#endif
