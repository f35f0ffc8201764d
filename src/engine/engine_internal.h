/* engine_internal.h — what the two worker loops share (internal to src/engine). */
#ifndef KVF_ENGINE_INTERNAL_H
#define KVF_ENGINE_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "kvfence/engine.h"
#include "kvfence/model.h"
#include "kvfence/proto.h"
#include "kvfence/transport.h"

static inline uint64_t kvf__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Copies src into dst[cap], cut to fit and always NUL-terminated. */
static inline void kvf__strlcpy(char *dst, const char *src, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap && src[n]) n++;
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
    if (cap) dst[n] = 0;
}

/* The sampling parameters of a request as kvf_sample takes them (top_p 0 means no cut). */
static inline struct kvf_sample_params kvf__sample_params(const struct kvf_msg_sampling *s)
{
    struct kvf_sample_params p = {s->temperature, s->top_k, s->top_p > 0.0f ? s->top_p : 1.0f, s->seed};
    return p;
}

/*
 * Samples token `step` of a request from logits and fills its logprob and, when asked, its top
 * logprobs (temperature 1, as the API reports them). The prefill worker runs this for the first
 * token and the decode worker for the rest, so a request's tokens do not depend on which worker
 * drew which. scratch: kvf_sample_scratch_bytes(n_vocab) bytes, so nothing is allocated per
 * token. Returns the token or a negative code.
 */
int kvf__sample_token(const float *logits, uint32_t n_vocab, const struct kvf_msg_sampling *s,
                      uint64_t step, void *scratch, float *logprob, uint32_t *n_top,
                      int32_t *top_ids, float *top_logprobs);

/* A wakeup channel: an eventfd another thread writes to get a loop out of poll. */
int kvf__wake_open(void);
void kvf__wake(int fd);
void kvf__wake_drain(int fd);

/*
 * Waits until the transport or the wake fd has input, or timeout_ms passes (-1 = forever). The
 * transport is armed first; when it has work pending already, returns at once.
 */
void kvf__loop_wait(kvf_xport_t *x, int wake_fd, int timeout_ms);

/* Takes and gives back the worker's compute locks (the process's mutex, then the file lock
 * shared with other processes), whichever the config has. */
void kvf__compute_enter(const struct kvf_worker_config *cfg);
void kvf__compute_leave(const struct kvf_worker_config *cfg);

/* Runs f over the fwd with the process's compute lock held (when there is one), so that two
 * workers in one process never run their thread pools at once on the same cores. */
int kvf__fwd_run_locked(const struct kvf_worker_config *cfg, kvf_fwd_t *f, kvf_pool_t *pool,
                        struct kvf_fwd_seq *seqs, uint32_t n_seqs);

/* Encodes m and sends it on c; returns 0 or a negative code. */
int kvf__send_msg(kvf_conn_t *c, const struct kvf_msg *m, uint8_t *buf, size_t cap);

/*
 * Why two HELLOs disagree, in words naming the field ("model fingerprint 0x... here, 0x... there"),
 * or "" when they agree (kvf_proto_hello_check's rule). Returns kvf_proto_hello_check's result.
 */
int kvf__hello_mismatch(const struct kvf_msg_hello *mine, const struct kvf_msg_hello *theirs,
                        char *why, size_t why_len);

/*
 * A generation handle's event queue: TOKEN events in order, then one END. One thread pushes (a
 * loop), any thread reads (kvf__evq_next, the seam's next). Pushing after END does nothing. When
 * notify_fd ≥ 0 every push also writes it (kvf__wake), so a thread serving many handles can
 * sleep until one of them has something.
 */
struct kvf__evq {
    pthread_mutex_t mu;      /* also guards the owner's fields it says so of */
    pthread_cond_t cv;
    struct kvf_gen_event *ring; /* [cap] events not yet read */
    uint32_t head, n, cap;
    bool ended;              /* END was pushed (after every TOKEN) */
    struct kvf_gen_event end_ev;
    int notify_fd;
};
void kvf__evq_init(struct kvf__evq *q, int notify_fd);
void kvf__evq_destroy(struct kvf__evq *q);
void kvf__evq_push(struct kvf__evq *q, const struct kvf_gen_event *ev);
/* 1 with *ev filled, 0 when nothing came within timeout_ms (-1 = forever); END repeats. */
int kvf__evq_next(struct kvf__evq *q, struct kvf_gen_event *ev, int timeout_ms);

#endif
