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
    e->retry_after_s = KVF__SRV_RETRY_DEFAULT;
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
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type", e->type,
                     "param", e->param, "code", e->code);
}

/*
 * Why a request failed, as its client and /metrics see it: one row per reason, its code the
 * error's `code` and the label of kvfence_request_errors_total. A row's message names what ran
 * out or stopped, never a request's text. Retry-After: a retry can help where the row gives
 * seconds (KVF__SRV_RETRY_DEFAULT: the server's retry_after_s, as for its own 429s); where it
 * cannot (the client's request is wrong, the server is going away), none is sent.
 */
const struct kvf__srv_reason_info kvf__srv_reasons[KVF__SRV_N_REASONS] = {
    [KVF__SRV_R_QUEUE_FULL] = {429, "queue_full", KVF__SRV_RETRY_DEFAULT,
                               "the server's queue of requests is full; retry later"},
    /* -EBUSY: the decode worker's bounded admission wait ended with no room for the prompt
     * and max_tokens (BAD_INPUTS row 27). Pages come free as running requests finish. */
    [KVF__SRV_R_POOL_EXHAUSTED] = {503, "pool_exhausted", 2,
                                   "no KV pool pages became free for this request (its prompt and "
                                   "max_tokens) within the admission wait; retry later"},
    /* No prefill worker connected for the whole admission wait: one starting or reconnecting
     * takes seconds. */
    [KVF__SRV_R_NO_PREFILL] = {503, "no_prefill", 5,
                               "no prefill worker is connected, so the prompt cannot be "
                               "prefilled; retry later"},
    [KVF__SRV_R_NO_DECODE] = {503, "no_decode", 5,
                              "no decode worker is connected to the router; retry later"},
    /* KVF_E_PROTO_TIMEOUT: the grant expired, the prefill having sent no progress on the
     * prompt within its bound. */
    [KVF__SRV_R_PREFILL_STALLED] = {503, "prefill_stalled", 2,
                                    "the prefill worker stopped making progress on this prompt; "
                                    "retry later"},
    /* KVF_E_PROTO_PEER_DOWN: the worker's connection was lost or fenced while it held the
     * request; the others serve, and it is connected again within a couple of seconds. */
    [KVF__SRV_R_WORKER_DOWN] = {502, "worker_down", 2,
                                "the worker serving this request went down (its connection was "
                                "lost or fenced); retry later"},
    [KVF__SRV_R_WORKER_FAILED] = {502, "worker_failed", 1,
                                  "the prefill worker reported a failure on this prompt; retry "
                                  "later"},
    /* The prompt's pages failed the handoff's check (H6, H9, H10): a writer's fault, not the
     * client's, and none of those bytes was read. Retrying is safe. */
    [KVF__SRV_R_KV_VERIFICATION_FAILED] = {502, "kv_verification_failed", 1,
                                           "the prompt's KV pages failed verification; none of "
                                           "them was used"},
    [KVF__SRV_R_OUT_OF_MEMORY] = {503, "out_of_memory", 2,
                                  "the server is out of memory; retry later"},
    [KVF__SRV_R_SHUTTING_DOWN] = {503, "shutting_down", KVF__SRV_RETRY_NONE,
                                  "the server is shutting down"},
    [KVF__SRV_R_CONTEXT_LENGTH_EXCEEDED] = {400, "context_length_exceeded", KVF__SRV_RETRY_NONE,
                                            "the request does not fit the served context limit"},
    [KVF__SRV_R_INVALID_REQUEST] = {400, "invalid_request", KVF__SRV_RETRY_NONE,
                                    "the engine refused the request"},
    [KVF__SRV_R_INTERNAL_ERROR] = {500, "internal_error", KVF__SRV_RETRY_NONE,
                                   "the request failed"},
};

enum kvf__srv_reason kvf__srv_reason_of(int err)
{
    switch (err) {
    case -EAGAIN:
        return KVF__SRV_R_QUEUE_FULL;
    case -EBUSY:
        return KVF__SRV_R_POOL_EXHAUSTED;
    case KVF_E_ENGINE_NO_PREFILL:
        return KVF__SRV_R_NO_PREFILL;
    case KVF_E_ENGINE_NO_DECODE:
        return KVF__SRV_R_NO_DECODE;
    case KVF_E_PROTO_TIMEOUT:
        return KVF__SRV_R_PREFILL_STALLED;
    case KVF_E_PROTO_PEER_DOWN:
        return KVF__SRV_R_WORKER_DOWN;
    case KVF_E_PROTO_FAILED:
        return KVF__SRV_R_WORKER_FAILED;
    case KVF_E_PROTO_COUNT:
    case KVF_E_PROTO_TRAILER:
    case KVF_E_PROTO_CHECKSUM:
        return KVF__SRV_R_KV_VERIFICATION_FAILED;
    case -ENOMEM:
        return KVF__SRV_R_OUT_OF_MEMORY;
    /* The engine cancels what is left when it stops. */
    case -ESHUTDOWN:
    case KVF_E_PROTO_CANCELLED:
        return KVF__SRV_R_SHUTTING_DOWN;
    case KVF_E_PROTO_REJECTED:
        return KVF__SRV_R_CONTEXT_LENGTH_EXCEEDED;
    case -EINVAL:
        return KVF__SRV_R_INVALID_REQUEST;
    default:
        return KVF__SRV_R_INTERNAL_ERROR;
    }
}

int kvf__srv_reason_by_code(const char *code)
{
    for (int k = 0; code && k < KVF__SRV_N_REASONS; k++)
        if (strcmp(kvf__srv_reasons[k].code, code) == 0) return k;
    return -1;
}

void kvf__srv_engine_error(int err, struct kvf__srv_err *e)
{
    enum kvf__srv_reason k = kvf__srv_reason_of(err);
    const struct kvf__srv_reason_info *ri = &kvf__srv_reasons[k];
    /* The engine's reason, where the row alone does not say which check or which failure. */
    if (k == KVF__SRV_R_KV_VERIFICATION_FAILED || k == KVF__SRV_R_INTERNAL_ERROR)
        kvf__srv_fail(e, ri->status, NULL, ri->code, "%s (%s)", ri->message, kvf_strerror(err));
    else
        kvf__srv_fail(e, ri->status, NULL, ri->code, "%s", ri->message);
    e->retry_after_s = ri->retry_after_s;
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
