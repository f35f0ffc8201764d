/* common.c — sampling, wakeups, waiting and sending, shared by the prefill and decode loops. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <unistd.h>

#include "engine_internal.h"

int kvf__sample_token(const float *logits, uint32_t n_vocab, const struct kvf_msg_sampling *s,
                      const struct kvf__constraint *c, const struct kvf_sample_hist *h,
                      uint64_t step, void *scratch, float *logprob, uint32_t *n_top,
                      int32_t *top_ids, float *top_logprobs)
{
    struct kvf_sample_params p = kvf__sample_params(s);
    int tok = c ? kvf__constrain(c, logits, n_vocab) : INT_MIN;
    if (tok == INT_MIN) tok = kvf_sample_seq(c ? c->buf : logits, n_vocab, &p, h, step, scratch);
    if (tok < 0) return tok;
    /* A softmax over the vocabulary costs as much as the draw itself: only when asked. */
    *logprob = s->want_logprob || s->n_logprobs ? kvf_sample_logprob(logits, n_vocab, tok) : 0.0f;
    *n_top = 0;
    if (s->n_logprobs) {
        int n = kvf_sample_top_logprobs(logits, n_vocab, s->n_logprobs, top_ids, top_logprobs);
        if (n < 0) return n;
        *n_top = (uint32_t)n;
    }
    return tok;
}

int kvf__wake_open(void)
{
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

void kvf__wake(int fd)
{
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof(one));
    (void)n; /* a full counter already wakes the reader */
}

void kvf__wake_drain(int fd)
{
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
}

void kvf__loop_wait(kvf_xport_t *x, int wake_fd, int timeout_ms)
{
    if (kvf_xport_arm(x) < 0) return; /* events pending: progress again */
    int next = kvf_xport_next_ms(x);
    if (next >= 0 && (timeout_ms < 0 || next < timeout_ms)) timeout_ms = next;
    struct pollfd fds[2] = {{kvf_xport_fd(x), POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (poll(fds, 2, timeout_ms) > 0 && (fds[1].revents & POLLIN)) kvf__wake_drain(wake_fd);
}

void kvf__compute_enter(const struct kvf_worker_config *cfg)
{
    if (cfg->compute_lock) pthread_mutex_lock(cfg->compute_lock);
    if (cfg->use_compute_flock)
        while (flock(cfg->compute_flock_fd, LOCK_EX) < 0 && errno == EINTR) {
        }
}

void kvf__compute_leave(const struct kvf_worker_config *cfg)
{
    if (cfg->use_compute_flock) flock(cfg->compute_flock_fd, LOCK_UN);
    if (cfg->compute_lock) pthread_mutex_unlock(cfg->compute_lock);
}

int kvf__fwd_run_locked(const struct kvf_worker_config *cfg, kvf_fwd_t *f, kvf_pool_t *pool,
                        struct kvf_fwd_seq *seqs, uint32_t n_seqs)
{
    kvf__compute_enter(cfg);
    int rc = kvf_fwd_run(f, pool, seqs, n_seqs);
    kvf__compute_leave(cfg);
    return rc;
}

int kvf__send_msg(kvf_conn_t *c, const struct kvf_msg *m, uint8_t *buf, size_t cap)
{
    long n = kvf_msg_encode(m, buf, cap);
    if (n < 0) return (int)n;
    return kvf_conn_send(c, buf, (size_t)n);
}

int kvf__hello_mismatch(const struct kvf_msg_hello *mine, const struct kvf_msg_hello *theirs,
                        char *why, size_t why_len)
{
    int rc = kvf_proto_hello_check(mine, theirs);
    why[0] = 0;
    if (rc == 0) return 0;
    const struct kvf_pool_geometry *a = &mine->geo, *b = &theirs->geo;
    if (mine->model_fp != theirs->model_fp)
        snprintf(why, why_len,
                 "model fingerprint %016llx there, %016llx here (a different model file)",
                 (unsigned long long)theirs->model_fp, (unsigned long long)mine->model_fp);
    else if (mine->max_context != theirs->max_context)
        snprintf(why, why_len,
                 "context limit %u tokens there, %u here (--context-length must agree)",
                 theirs->max_context, mine->max_context);
    else if (a->page_tokens != b->page_tokens)
        snprintf(why, why_len, "page size %u tokens there, %u here", b->page_tokens,
                 a->page_tokens);
    else
        snprintf(why, why_len,
                 "page geometry %u layers × %u KV heads × %u dims × %u bytes there, "
                 "%u × %u × %u × %u here",
                 b->n_layers, b->n_kv_heads, b->head_dim, b->elem_bytes, a->n_layers, a->n_kv_heads,
                 a->head_dim, a->elem_bytes);
    return rc;
}

void kvf__evq_init(struct kvf__evq *q, int notify_fd)
{
    memset(q, 0, sizeof(*q));
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->notify_fd = notify_fd;
}

void kvf__evq_destroy(struct kvf__evq *q)
{
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->ring);
    q->ring = NULL;
}

void kvf__evq_push(struct kvf__evq *q, const struct kvf_gen_event *ev)
{
    pthread_mutex_lock(&q->mu);
    if (q->ended) {
        pthread_mutex_unlock(&q->mu);
        return;
    }
    if (ev->kind == KVF_GEN_END) {
        q->end_ev = *ev;
        q->ended = true;
    } else {
        if (q->n == q->cap) {
            uint32_t cap = q->cap ? 2 * q->cap : 16;
            struct kvf_gen_event *r = malloc(cap * sizeof(*r));
            if (!r) {
                /* Out of memory for the stream: end it rather than lose a token silently. */
                q->end_ev = (struct kvf_gen_event){.kind = KVF_GEN_END, .err = -ENOMEM};
                q->ended = true;
                goto wake;
            }
            for (uint32_t i = 0; i < q->n; i++)
                r[i] = q->ring[(q->head + i) % q->cap];
            free(q->ring);
            q->ring = r;
            q->cap = cap;
            q->head = 0;
        }
        q->ring[(q->head + q->n) % q->cap] = *ev;
        q->n++;
    }
wake:
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (q->notify_fd >= 0) kvf__wake(q->notify_fd);
}

int kvf__evq_next(struct kvf__evq *q, struct kvf_gen_event *ev, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&q->mu);
    while (q->n == 0 && !q->ended && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&q->cv, &q->mu);
        else if (pthread_cond_timedwait(&q->cv, &q->mu, &until) == ETIMEDOUT)
            break;
    }
    int got = 0;
    if (q->n) {
        *ev = q->ring[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
        got = 1;
    } else if (q->ended) {
        *ev = q->end_ev;
        got = 1;
    }
    pthread_mutex_unlock(&q->mu);
    return got;
}
