/*
 * sim_internal.h — the simulator's world, shared by its files: sim_queue.c (events, randomness,
 * traces), sim_engine.c (the network and the engines around the two protocol machines),
 * sim_check.c (the invariants) and sim.c (fault events, set-up, the run).
 */
#ifndef KVF_SIM_INTERNAL_H
#define KVF_SIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvf_test.h"
#include "kvfence/pool.h"
#include "kvfence/proto.h"
#include "sim.h"

/* World size and timing (virtual milliseconds). */
enum {
    N_PEERS = 2,
    PT = 4, /* slots per page */
    MAX_REQS = 6,
    MAX_PROMPT = 20, /* ≤ 5 pages; a configuration may draw shorter ones */
    MAX_CONTEXT = 40,
    MAX_GRANT = 8,
    N_SRC = 12,
    MAX_WRITES = 128,
    MSG_MAX = 320,
    HB_MS = 100,
    TICK_MS = 50,
    GRANT_TIMEOUT_MS = 2000, /* decode's no-progress bound */
    PROGRESS_MS = 300,       /* a computing prefill reports progress this often */
    HOLD_TIMEOUT_MS = 3000,
    END_MS = 200000,
    OUTCOME_BOUND_MS = GRANT_TIMEOUT_MS + 2 * HB_MS + 2 * TICK_MS, /* after submit or progress */
};

enum evk {
    EV_TICK,
    EV_HB, /* periodic */
    EV_SUBMIT,
    EV_CANCEL,
    EV_FINISH,
    EV_TO_DECODE,
    EV_TO_PREFILL,
    EV_PAGE_READY,
    EV_LOCAL,
    EV_LAND,
    EV_FLUSH,
    EV_CLEAR,
    EV_CRASH,
    EV_RESTART,
    EV_HANG,
    EV_PARTITION,
    EV_FENCE,
    EV_RESET,
    EV_CONNECT,
    EV_PROGRESS,
};

struct ev {
    uint64_t t, seq;
    enum evk kind;
    int peer, ridx, w;
    uint32_t gen, index, epoch, len;
    uint64_t nonce;
    uint8_t bytes[MSG_MAX];
};

struct sreq {
    kvf_req_id_t id;
    uint32_t tenant, prompt, max_tokens;
    int writer;
    bool submitted, dropped_by_client, outcome, ok, running, finished;
    uint64_t submit_t, outcome_t;
    int err;
    bool faulted;         /* a message of it was lost or late, or its writer failed */
    bool refuse, refused; /* the prefill engine refuses it (by plan / did, before any post) */
    int fail_at;          /* page index at which the prefill engine fails it, or -1 */
    bool forge;           /* the engine writes one token fewer and says so */
    bool corrupt;         /* a landed byte of it is flipped */
    bool early_clear;     /* the prefill engine gives up on it */
    bool job_aborted;
    bool slow;           /* a long prompt: each page takes 400..1,400 ms to compute, so the whole
                            prompt outlasts the no-progress bound and lives by PROGRESS */
    uint32_t pages_done; /* pages the prefill engine computed for the current attempt */
    uint64_t progress_t; /* when decode last accepted a PROGRESS of it */
    uint64_t nonce;
    uint32_t epoch, n_pages;
    struct kvf_page_ref pages[MAX_GRANT];
};

struct src {
    bool used;
    int ridx;
    uint64_t nonce;
    uint32_t index;
    uint8_t data[64];
};

struct speer {
    kvf_prefill_t *sm;
    bool alive, connected, decode_up;
    uint32_t epoch, gen;
    uint64_t hung_until, part_until, fault_since;
    bool hang_hb; /* heartbeats keep flowing while hung */
    bool faulty;  /* crashed, partitioned, or hung without heartbeats */
    uint32_t n_src;
    struct src src[N_SRC];
};

/* A put: `live` while its record is in use (until both its local completion and its landing
 * have been handled); in flight while live, not landed and not dropped. */
struct swrite {
    bool live, captured, landed, dropped, local_done, land_done;
    int peer, ridx, src;
    uint32_t epoch, gen, index, slots, trailer_slots, tenant;
    uint64_t nonce, checksum, land_t;
    struct kvf_page_ref dst;
    uint8_t data[64];
};

struct world {
    const struct sim_config *cfg;
    struct kvf_rng rng;
    FILE *trace;
    uint64_t now, seq, steps;
    struct ev *heap;
    size_t n_ev, cap_ev, n_nonperiodic;
    kvf_pool_t *pool;
    kvf_decode_t *dec;
    size_t data_bytes, trailer_off;
    struct speer peer[N_PEERS];
    struct sreq req[MAX_REQS];
    int n_req;
    struct swrite w[MAX_WRITES];
    struct kvf_action abuf[64];
    struct kvf_actions acts;
    double p_drop, p_dup, p_late;
    uint64_t quarantines_seen;
    bool failed;
    char why[512];
    struct sim_result *res;
};

/* Whether the invariants other than I1 are checked, and whether the pool's and the machines'
 * own checkers are (see sim.h, checks). */
static inline bool all_checks(const struct world *W)
{
    return W->cfg->checks != SIM_CHECK_CONTENT;
}
static inline bool checkers_on(const struct world *W)
{
    return W->cfg->checks == SIM_CHECK_ALL;
}

void trace(struct world *W, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void violate(struct world *W, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint32_t rnd(struct world *W, uint32_t lo, uint32_t hi); /* uniform in [lo, hi] */
bool chance(struct world *W, double p);                  /* true with probability p */
bool ev_less(const struct ev *a, const struct ev *b);
struct ev *ev_new(struct world *W, uint64_t delay, enum evk kind);
void ev_push(struct world *W);
void ev_pop(struct world *W, struct ev *out);
void defer(struct world *W, const struct ev *e, uint64_t until);
int find_req(struct world *W, kvf_req_id_t id);
uint32_t page_slots(uint32_t tokens, uint32_t i);
uint64_t stamp(kvf_req_id_t id, uint64_t tag, uint32_t slot);
void put_stamp(uint8_t *data, uint32_t slot, uint64_t v);
bool ended(const struct sreq *r);
void fault_peer_requests(struct world *W, int p);
void read_all(struct world *W, int ri, const char *when);
void check_write_target(struct world *W, const struct swrite *w, const char *when);
void check_all(struct world *W);
bool quiescent(struct world *W);
void final_checks(struct world *W);
void net_send(struct world *W, int peer, bool to_decode, const struct kvf_msg *m);
bool decode_msg(struct world *W, const struct ev *e, struct kvf_msg *m, struct kvf_msg_scratch *s);
void decode_actions(struct world *W);
struct src *find_src(struct speer *P, int ri, uint64_t nonce, uint32_t index);
void free_src(struct src *s);
void schedule_page(struct world *W, int p, int ri, uint32_t index);
void post_write(struct world *W, int p, const struct kvf_action *a, int ri);
void prefill_actions(struct world *W, int p);
void on_submit(struct world *W, int ri);
void on_page_ready(struct world *W, const struct ev *e);
void schedule_progress(struct world *W, int p, int ri);
void on_progress(struct world *W, const struct ev *e);
void write_event_done(struct swrite *w, bool local);
bool in_flight(const struct swrite *w);
void on_local(struct world *W, const struct ev *e);
void on_land(struct world *W, const struct ev *e);
void on_flush(struct world *W, const struct ev *e);
void start_fault(struct world *W, int p);
void connect_peer(struct world *W, int p);
bool peer_busy(struct world *W, const struct ev *e, int p);
void step(struct world *W, struct ev *e);
void setup(struct world *W, uint64_t seed);
void teardown(struct world *W);

#endif
