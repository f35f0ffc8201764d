/*
 * fake_engine.h — a kvf_gen_ops engine for the server's tests: no model, no workers.
 *
 * A generation echoes its prompt (without a leading BOS) token by token, cycling, or plays a
 * script; the first token comes first_delay_ms after submit (the request "queued" until then)
 * and each next one token_delay_ms later. It ends like the real engine: after a stop id
 * (stopped), at max_tokens (length), with end_err after end_after tokens, or with
 * KVF_E_PROTO_CANCELLED once cancelled. Every submit, cancel (with its time) and release is
 * recorded so tests can check that each handle was released exactly once and how soon a
 * disconnect became a cancel.
 */
#ifndef KVF_FAKE_ENGINE_H
#define KVF_FAKE_ENGINE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvfence/gen.h"

#define FAKE_MAX_RECORDS 64
#define FAKE_MAX_SEEDS   4096

struct fake_engine {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Settings (set before use). */
    uint32_t n_vocab, served_limit;
    int first_delay_ms, token_delay_ms;
    uint32_t slow_tenant; /* nonzero: first_delay_ms applies to this tenant's requests only */
    uint32_t max_live;    /* submit answers -EAGAIN at this many live handles (0: no cap) */
    int submit_err;       /* submit answers this (0: accept) */
    uint32_t pool_pages;  /* nonzero: a decode pool of this many 16-token pages; a submit holds
                             ceil((n_prompt + max_tokens) / 16) of them until release, and one that
                             finds too few free gets -EBUSY (503 pool_exhausted), as the real
                             engine does after its admission wait; info reports it */
    uint32_t pool_used;   /* pages held (records) */
    int end_err;          /* END with this error after end_after tokens (0: never) */
    uint32_t end_after;
    bool prefill_up;
    uint64_t verify[4];    /* info's verify_count, _trailer, _checksum and foreign_tails */
    bool prov;             /* the seam's prov answers a record (fake_prov); else none */
    const int32_t *script; /* tokens to emit instead of the echo, cycling */
    uint32_t n_script;
    /* Records. */
    uint32_t live, submits, cancels, releases;
    int64_t cancel_ms[FAKE_MAX_RECORDS]; /* monotonic time of each handle's first cancel */
    struct kvf_gen_params params[FAKE_MAX_RECORDS]; /* each submit's params (prompt: NULL) */
    uint64_t seeds[FAKE_MAX_SEEDS];                 /* each submit's sample.seed, in submit order */
    int32_t last_prompt[4096];
    uint32_t n_last_prompt;
};

void fake_init(struct fake_engine *f, uint32_t n_vocab, uint32_t served_limit);
void fake_destroy(struct fake_engine *f);
/* Reads a record under the lock. */
uint32_t fake_live(struct fake_engine *f);
uint32_t fake_cancels(struct fake_engine *f);
/* Waits up to timeout_ms for at least n cancels; returns the time of the n-th, or -1. */
int64_t fake_wait_cancels(struct fake_engine *f, uint32_t n, int timeout_ms);
/* Waits up to timeout_ms for live == n; true if reached. */
bool fake_wait_live(struct fake_engine *f, uint32_t n, int timeout_ms);
int64_t fake_now_ms(void);

extern const struct kvf_gen_ops fake_ops;

#endif
