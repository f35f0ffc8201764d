/* engine_internal.h — what the two worker loops share (internal to src/engine). */
#ifndef KVF_ENGINE_INTERNAL_H
#define KVF_ENGINE_INTERNAL_H

#include <math.h>
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

/* Runs f over the fwd with the process's compute lock held (when there is one), so that two
 * workers in one process never run their thread pools at once on the same cores. */
int kvf__fwd_run_locked(pthread_mutex_t *lock, kvf_fwd_t *f, kvf_pool_t *pool,
                        struct kvf_fwd_seq *seqs, uint32_t n_seqs);

/* Encodes m and sends it on c; returns 0 or a negative code. */
int kvf__send_msg(kvf_conn_t *c, const struct kvf_msg *m, uint8_t *buf, size_t cap);

#endif
