/* common.c — sampling, wakeups, waiting and sending, shared by the prefill and decode loops. */
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "engine_internal.h"

int kvf__sample_token(const float *logits, uint32_t n_vocab, const struct kvf_msg_sampling *s,
                      uint64_t step, void *scratch, float *logprob, uint32_t *n_top,
                      int32_t *top_ids, float *top_logprobs)
{
    struct kvf_sample_params p = kvf__sample_params(s);
    int tok = kvf_sample_with(logits, n_vocab, &p, step, scratch);
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

int kvf__fwd_run_locked(pthread_mutex_t *lock, kvf_fwd_t *f, kvf_pool_t *pool,
                        struct kvf_fwd_seq *seqs, uint32_t n_seqs)
{
    if (lock) pthread_mutex_lock(lock);
    int rc = kvf_fwd_run(f, pool, seqs, n_seqs);
    if (lock) pthread_mutex_unlock(lock);
    return rc;
}

int kvf__send_msg(kvf_conn_t *c, const struct kvf_msg *m, uint8_t *buf, size_t cap)
{
    long n = kvf_msg_encode(m, buf, cap);
    if (n < 0) return (int)n;
    return kvf_conn_send(c, buf, (size_t)n);
}
