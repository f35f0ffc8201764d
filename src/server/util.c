/*
 * util.c — the byte buffer, error records and the mapping of engine codes to HTTP errors.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/common.h"
#include <errno.h>
#include <sys/random.h>

#include "server_internal.h"

void kvf__sbuf_put(struct kvf__sbuf *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2 + 64;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
    b->p[b->n] = 0;
}

void kvf__sbuf_puts(struct kvf__sbuf *b, const char *s)
{
    kvf__sbuf_put(b, s, strlen(s));
}

void kvf__sbuf_free(struct kvf__sbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int kvf__srv_fail(struct kvf__srv_err *e, int status, const char *param, const char *code,
                  const char *fmt, ...)
{
    e->status = status;
    e->param = param;
    e->code = code;
    if (status == 429)
        e->type = "rate_limit_error";
    else if (status >= 500)
        e->type = "server_error";
    else if (status == 404)
        e->type = "not_found_error";
    else
        e->type = "invalid_request_error";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

json_t *kvf__srv_err_json(const struct kvf__srv_err *e)
{
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type",
                     e->type, "param", e->param, "code", e->code);
}

void kvf__srv_engine_error(int err, struct kvf__srv_err *e)
{
    switch (err) {
    case -EAGAIN:
        kvf__srv_fail(e, 429, NULL, "queue_full", "the server is at capacity; retry later");
        break;
    case -EINVAL:
        kvf__srv_fail(e, 400, NULL, "invalid_request", "the engine refused the request");
        break;
    case KVF_E_PROTO_REJECTED:
        kvf__srv_fail(e, 400, NULL, "context_length_exceeded",
                      "the request does not fit the served context limit");
        break;
    case -ESHUTDOWN:
    case KVF_E_PROTO_CANCELLED:
        kvf__srv_fail(e, 503, NULL, "shutting_down", "the server is shutting down");
        break;
    case -EBUSY: /* waited the bounded admission time for pages (BAD_INPUTS row 27) */
        kvf__srv_fail(e, 503, NULL, "pool_exhausted",
                      "no KV pages became free in time for this request; retry later");
        break;
    case KVF_E_PROTO_TIMEOUT:
        kvf__srv_fail(e, 503, NULL, "unavailable",
                      "no capacity became free in time; retry later");
        break;
    case KVF_E_PROTO_PEER_DOWN:
    case KVF_E_PROTO_FAILED:
        kvf__srv_fail(e, 502, NULL, "worker_failed", "a worker failed while serving the request");
        break;
    case -ENOMEM:
        kvf__srv_fail(e, 503, NULL, "out_of_memory", "the server is out of memory");
        break;
    case KVF_E_PROTO_COUNT:
    case KVF_E_PROTO_TRAILER:
    case KVF_E_PROTO_CHECKSUM:
        /* The prompt's pages failed the handoff's check (H6, H9, H10): a writer's fault, not the
         * client's, and none of those bytes was read. Retrying is safe. */
        kvf__srv_fail(e, 502, NULL, "kv_verification_failed",
                      "the prompt's KV pages failed verification (%s); none of them was used",
                      kvf_strerror(err));
        break;
    default:
        kvf__srv_fail(e, 500, NULL, "internal_error", "the request failed (%s)",
                      kvf_strerror(err));
        break;
    }
}

int kvf__srv_random(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}
