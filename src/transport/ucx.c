/*
 * ucx.c — the transport over UCX: active messages for control frames, puts for page data,
 * forced endpoint close as the fence. See kvfence/transport.h for the contract.
 *
 * Every connection is one endpoint in peer-error mode (UCP_ERR_HANDLING_MODE_PEER): that is the
 * mode in which a forced close stops a peer's writes (docs/PROTOCOL.md, "Fences"), and in which
 * keepalive reports a dead or fenced peer. Two active-message kinds travel, both eager (the
 * handler always has the whole payload): RKEY (the sender's registered region: base, size,
 * packed remote key), sent first on every connection by a side that registered one; and FRAME
 * (a control frame for the engine).
 *
 * Operations in flight are `struct op`s taken from a free list (no allocation on the hot path
 * once warm); each counts against its connection, so a close waits until UCX has completed every
 * one of them (with an error) before it frees the connection.
 *
 * Work bounds: progress is O(events ready); connection lookup by endpoint is O(connections)
 * (a worker has a handful).
 */
#include "kvfence/transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>

#define AM_ID 7u
enum am_kind { AM_RKEY = 1, AM_FRAME = 2, AM_WRITE = 3, AM_FLUSH_REQ = 4, AM_FLUSH_ACK = 5 };
struct am_hdr {
    uint32_t kind;
    uint32_t pad;
    uint64_t arg; /* WRITE: offset into the target's region; FLUSH_*: the flush's id */
};

enum op_kind { OP_PUT = 1, OP_FLUSH = 2, OP_SEND = 3, OP_CLOSE = 4 };

struct op {
    enum op_kind kind;
    kvf_xport_t *x;
    kvf_conn_t *c;
    kvf_xport_done_fn done;
    void *arg;
    /* Delayed operations (fault hooks) and sends: what to post. */
    const void *src;
    size_t len;
    uint64_t off;
    uint8_t *buf; /* OP_SEND: the owned copy of the frame */
    struct am_hdr hdr; /* OP_SEND: UCX reads the header until the send completes */
    uint64_t due_ms;
    uint64_t flush_id; /* OP_FLUSH over writes-as-messages: the id its ack names */
    bool completed; /* OP_CLOSE */
    ucs_status_t status;
    struct op *next;
};

struct kvf_conn {
    kvf_xport_t *x;
    ucp_ep_h ep;
    void *user;
    bool failed, closing;
    char error[160];
    /* The peer's region, once its RKEY arrived. */
    ucp_rkey_h rkey;
    uint64_t remote_base;
    size_t remote_bytes;
    uint32_t ops; /* operations posted and not yet completed */
    struct op *flushes; /* writes-as-messages: flushes awaiting their FLUSH_ACK */
    uint64_t next_flush_id;
    bool close_started;
    struct op *close_op;   /* the forced close in flight (NULL once done, or if none could start) */
    void *close_req;       /* the close's UCX request when no op could be had for it */
    kvf_conn_t *prev, *next;
};

struct kvf_xport {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    ucp_mem_h memh;
    void *rkey_buf; /* packed, for RKEY messages */
    size_t rkey_len;
    void *rma_base;
    size_t rma_bytes;
    uint16_t port;
    int efd;
    struct kvf_xport_events ev;
    kvf_conn_t *conns;
    struct op *free_ops;
    struct op *delayed; /* fault hooks: operations to post later, unordered */
    struct kvf_xport_faults faults;
    uint64_t rng;
    /* Page writes as ordered active messages (tcp) rather than ucp_put (RDMA verbs): see
     * kvf_xport_create. */
    bool msg_writes;
    bool destroying;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int fail_text(char *err, size_t err_len, int code, const char *what, ucs_status_t st)
{
    if (err && err_len) snprintf(err, err_len, "%s: %s", what, ucs_status_string(st));
    return code;
}

/* --- Operations. --------------------------------------------------------------------------- */

static struct op *op_get(kvf_xport_t *x, kvf_conn_t *c, enum op_kind kind)
{
    struct op *o = x->free_ops;
    if (o)
        x->free_ops = o->next;
    else if (!(o = malloc(sizeof(*o))))
        return NULL;
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->x = x;
    o->c = c;
    if (c) c->ops++;
    return o;
}

static void op_put_back(struct op *o)
{
    kvf_xport_t *x = o->x;
    if (o->c) o->c->ops--;
    free(o->buf);
    o->buf = NULL;
    o->next = x->free_ops;
    x->free_ops = o;
}

static int status_code(ucs_status_t st)
{
    return st == UCS_OK ? 0 : KVF_E_TRANSPORT;
}

/* Finishes an operation: its callback, then the op goes back to the free list. */
static void op_finish(struct op *o, int status)
{
    kvf_xport_done_fn done = o->done;
    void *arg = o->arg;
    op_put_back(o);
    if (done) done(arg, status);
}

static void on_ucx_done(void *request, ucs_status_t st, void *user)
{
    struct op *o = user;
    if (o->kind == OP_CLOSE) {
        o->completed = true;
        o->status = st;
    } else {
        int status = status_code(st);
#if defined(KVF_TEST_BUILD)
        if (o->kind == OP_PUT && o->x->faults.fail_put_status && status == 0)
            status = o->x->faults.fail_put_status;
#endif
        op_finish(o, status);
    }
    if (request) ucp_request_free(request);
}

/* A UCX call returned a status pointer: completed now (NULL), failed, or in flight (the
 * callback will finish the op). */
static int settle(struct op *o, ucs_status_ptr_t sp)
{
    if (sp == NULL) {
        on_ucx_done(NULL, UCS_OK, o);
        return 0;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        op_finish(o, KVF_E_TRANSPORT);
        return 0; /* the callback ran with the error */
    }
    return 0;
}

/* --- Connections. --------------------------------------------------------------------------- */

static void start_close(kvf_conn_t *c);

/*
 * A failed endpoint is closed (forced) at once, from inside the error callback as UCX expects:
 * messages the dead peer had already sent may still be queued on the socket, and UCX 1.13 stops
 * the process ("unexpected error: Endpoint timeout" in its put handler) if one is handled on the
 * failed endpoint; once the endpoint is closed they are dropped.
 */
static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    kvf_conn_t *c = arg;
    (void)ep;
    if (c->failed) return;
    c->failed = true;
    snprintf(c->error, sizeof(c->error), "connection failed: %s", ucs_status_string(st));
    start_close(c);
    if (!c->closing && c->x->ev.on_error) c->x->ev.on_error(c->x->ev.ctx, c, KVF_E_TRANSPORT);
}

static kvf_conn_t *conn_new(kvf_xport_t *x)
{
    kvf_conn_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->x = x;
    c->next = x->conns;
    if (x->conns) x->conns->prev = c;
    x->conns = c;
    return c;
}

static void conn_unlink(kvf_conn_t *c)
{
    kvf_xport_t *x = c->x;
    if (c->prev)
        c->prev->next = c->next;
    else
        x->conns = c->next;
    if (c->next) c->next->prev = c->prev;
}

static kvf_conn_t *conn_by_ep(kvf_xport_t *x, ucp_ep_h ep)
{
    for (kvf_conn_t *c = x->conns; c; c = c->next)
        if (c->ep == ep) return c;
    return NULL;
}

static int send_am(kvf_conn_t *c, uint32_t kind, const void *buf, size_t len);

/* Sends our region's key, when we registered one: the first message on every connection. */
static int send_rkey(kvf_conn_t *c)
{
    kvf_xport_t *x = c->x;
    if (!x->memh) return 0;
    size_t n = 16 + x->rkey_len;
    uint8_t *b = malloc(n);
    if (!b) return -ENOMEM;
    uint64_t base = (uint64_t)(uintptr_t)x->rma_base, bytes = x->rma_bytes;
    memcpy(b, &base, 8);
    memcpy(b + 8, &bytes, 8);
    memcpy(b + 16, x->rkey_buf, x->rkey_len);
    int rc = send_am(c, AM_RKEY, b, n);
    free(b);
    return rc;
}

static void on_conn_request(ucp_conn_request_h req, void *arg)
{
    kvf_xport_t *x = arg;
    kvf_conn_t *c = conn_new(x);
    if (!c) {
        ucp_listener_reject(x->listener, req);
        return;
    }
    ucp_ep_params_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = req;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = on_ep_error;
    p.err_handler.arg = c;
    if (ucp_ep_create(x->worker, &p, &c->ep) != UCS_OK) {
        conn_unlink(c);
        free(c);
        return;
    }
    send_rkey(c);
    if (x->ev.on_accept) x->ev.on_accept(x->ev.ctx, c);
}

static int send_flush_ack(kvf_conn_t *c, uint64_t id);
static void flush_acked(kvf_conn_t *c, uint64_t id);

/*
 * Every message on the worker. A message from an endpoint that is not a live connection — one
 * we closed (the fence), one that failed — is dropped whatever it carries: after a fence,
 * nothing of that peer is applied. WRITE messages are applied in arrival order, which on one
 * endpoint is sending order, so a FLUSH_REQ is answered only after every write sent before it
 * has been copied into the region: the ack is a drain proof.
 */
static ucs_status_t on_am(void *arg, const void *header, size_t header_len, void *data,
                          size_t len, const ucp_am_recv_param_t *param)
{
    kvf_xport_t *x = arg;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || header_len != sizeof(struct am_hdr) ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
        return UCS_OK; /* not ours, or not eager: dropped */
    kvf_conn_t *c = conn_by_ep(x, param->reply_ep);
    if (!c || c->failed || c->closing || c->close_started) return UCS_OK;
    struct am_hdr h;
    memcpy(&h, header, sizeof(h));
    switch (h.kind) {
    case AM_FRAME:
        if (x->ev.on_frame) x->ev.on_frame(x->ev.ctx, c, data, len);
        break;
    case AM_WRITE:
        /* Only into the registered region, whole or not at all. */
        if (x->rma_base && h.arg <= x->rma_bytes && len <= x->rma_bytes - h.arg)
            memcpy((uint8_t *)x->rma_base + h.arg, data, len);
        break;
    case AM_FLUSH_REQ: send_flush_ack(c, h.arg); break;
    case AM_FLUSH_ACK: flush_acked(c, h.arg); break;
    case AM_RKEY:
        if (len > 16 && !c->rkey && !c->remote_bytes) {
            uint64_t base, bytes;
            memcpy(&base, data, 8);
            memcpy(&bytes, (uint8_t *)data + 8, 8);
            if (x->msg_writes || ucp_ep_rkey_unpack(c->ep, (uint8_t *)data + 16, &c->rkey) == UCS_OK) {
                c->remote_base = base;
                c->remote_bytes = (size_t)bytes;
                if (x->ev.on_remote_ready) x->ev.on_remote_ready(x->ev.ctx, c);
            }
        }
        break;
    default: break;
    }
    return UCS_OK;
}

/* --- Create and destroy. ------------------------------------------------------------------- */

/* UCX_TLS, when the user set it, must not name a transport that cannot be fenced per peer. */
static int check_tls(char *err, size_t err_len)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls || !*tls) return 0;
    static const char *const unfenceable[] = {"all", "sm", "shm", "posix", "sysv", "cma", "xpmem", "knem", "mm"};
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == '^' || *t == ' ') t++;
        for (size_t i = 0; i < KVF_ARRAY_LEN(unfenceable); i++) {
            if (strcmp(t, unfenceable[i]) == 0) {
                if (err && err_len)
                    snprintf(err, err_len,
                             "UCX_TLS=%s names '%s', a transport kvfence cannot fence per peer "
                             "(shared memory keeps accepting a closed peer's writes); unset "
                             "UCX_TLS or set it to tcp (or rc/dc/ud for RDMA verbs)",
                             tls, t);
                return -EINVAL;
            }
        }
    }
    return 0;
}

static bool tls_is_rdma(const char *tls)
{
    if (!tls || !*tls) return false;
    return strstr(tls, "tcp") == NULL && (strstr(tls, "rc") || strstr(tls, "dc") || strstr(tls, "ud") || strstr(tls, "ib"));
}

static int resolve(const char *host, uint16_t port, struct sockaddr_storage *ss, socklen_t *len)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai) return -EINVAL;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

int kvf_xport_create(const struct kvf_xport_config *cfg, const struct kvf_xport_events *ev,
                     kvf_xport_t **out, char *err, size_t err_len)
{
    if (!cfg || !ev || !out) return -EINVAL;
    int rc = check_tls(err, err_len);
    if (rc < 0) return rc;
    kvf_xport_t *x = calloc(1, sizeof(*x));
    if (!x) return -ENOMEM;
    x->ev = *ev;
    x->efd = -1;
    x->rma_base = cfg->rma_base;
    x->rma_bytes = cfg->rma_bytes;
    x->rng = 0x9e3779b97f4a7c15ull;

    /* A worker restarted on its address (after a crash, say) binds again at once, without
     * waiting out the old connections' TIME_WAIT. The setting belongs to UCX's tcp connection
     * manager, which reads it only from the environment; a user's own value is kept. */
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    ucp_config_t *conf = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &conf);
    if (st != UCS_OK) {
        rc = fail_text(err, err_len, KVF_E_TRANSPORT, "ucp_config_read", st);
        goto fail;
    }
    char ka[32];
    snprintf(ka, sizeof(ka), "%ums", cfg->keepalive_ms ? cfg->keepalive_ms : 100u);
    ucp_config_modify(conf, "KEEPALIVE_INTERVAL", ka);
    if (!getenv("UCX_TLS")) ucp_config_modify(conf, "TLS", "tcp");
    /* Over tcp, UCX emulates a put with active messages and answers each with an internal ack;
     * if the writer died with puts in flight, UCX 1.13 aborts the target process when that ack
     * cannot be sent ("unexpected error: Endpoint timeout" in ucp_put_handler). So over tcp the
     * page writes are kvfence's own active messages, applied by the target in order, with a
     * flush answered by the target after it applied every earlier write — the same semantics,
     * under our control. Over RDMA verbs (UCX_TLS naming rc, dc or ud) writes are true
     * one-sided puts and the flush is ucp_ep_flush_nbx. */
    x->msg_writes = !tls_is_rdma(getenv("UCX_TLS"));
    ucp_params_t pp;
    memset(&pp, 0, sizeof(pp));
    pp.field_mask = UCP_PARAM_FIELD_FEATURES;
    pp.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    st = ucp_init(&pp, conf, &x->ctx);
    ucp_config_release(conf);
    if (st != UCS_OK) {
        rc = fail_text(err, err_len, KVF_E_TRANSPORT, "ucp_init", st);
        goto fail;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    wp.events = UCP_WAKEUP_AMO | UCP_WAKEUP_RMA | UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TAG_RECV |
                UCP_WAKEUP_TX | UCP_WAKEUP_RX;
    st = ucp_worker_create(x->ctx, &wp, &x->worker);
    if (st != UCS_OK) {
        rc = fail_text(err, err_len, KVF_E_TRANSPORT, "ucp_worker_create", st);
        goto fail;
    }
    st = ucp_worker_get_efd(x->worker, &x->efd);
    if (st != UCS_OK) {
        rc = fail_text(err, err_len, KVF_E_TRANSPORT, "ucp_worker_get_efd", st);
        goto fail;
    }
    ucp_am_handler_param_t ah;
    memset(&ah, 0, sizeof(ah));
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ah.id = AM_ID;
    ah.cb = on_am;
    ah.arg = x;
    st = ucp_worker_set_am_recv_handler(x->worker, &ah);
    if (st != UCS_OK) {
        rc = fail_text(err, err_len, KVF_E_TRANSPORT, "ucp_worker_set_am_recv_handler", st);
        goto fail;
    }
    if (cfg->rma_base && cfg->rma_bytes) {
        ucp_mem_map_params_t mp;
        memset(&mp, 0, sizeof(mp));
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address = cfg->rma_base;
        mp.length = cfg->rma_bytes;
        st = ucp_mem_map(x->ctx, &mp, &x->memh);
        if (st != UCS_OK) {
            x->memh = NULL;
            rc = fail_text(err, err_len, KVF_E_TRANSPORT, "ucp_mem_map of the pool", st);
            goto fail;
        }
        st = ucp_rkey_pack(x->ctx, x->memh, &x->rkey_buf, &x->rkey_len);
        if (st != UCS_OK) {
            rc = fail_text(err, err_len, KVF_E_TRANSPORT, "ucp_rkey_pack", st);
            goto fail;
        }
    }
    if (cfg->listen_host) {
        struct sockaddr_storage ss;
        socklen_t sl;
        if (resolve(cfg->listen_host, cfg->listen_port, &ss, &sl) < 0) {
            if (err && err_len) snprintf(err, err_len, "cannot resolve '%s'", cfg->listen_host);
            rc = -EINVAL;
            goto fail;
        }
        ucp_listener_params_t lp;
        memset(&lp, 0, sizeof(lp));
        lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
        lp.sockaddr.addr = (const struct sockaddr *)&ss;
        lp.sockaddr.addrlen = sl;
        lp.conn_handler.cb = on_conn_request;
        lp.conn_handler.arg = x;
        st = ucp_listener_create(x->worker, &lp, &x->listener);
        if (st != UCS_OK) {
            x->listener = NULL;
            if (err && err_len)
                snprintf(err, err_len, "cannot listen on %s:%u: %s", cfg->listen_host,
                         cfg->listen_port, ucs_status_string(st));
            rc = KVF_E_TRANSPORT;
            goto fail;
        }
        ucp_listener_attr_t la;
        memset(&la, 0, sizeof(la));
        la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        if (ucp_listener_query(x->listener, &la) == UCS_OK) {
            if (la.sockaddr.ss_family == AF_INET)
                x->port = ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port);
            else if (la.sockaddr.ss_family == AF_INET6)
                x->port = ntohs(((struct sockaddr_in6 *)&la.sockaddr)->sin6_port);
        }
    }
    *out = x;
    return 0;
fail:
    kvf_xport_destroy(x);
    return rc;
}

void kvf_xport_destroy(kvf_xport_t *x)
{
    if (!x) return;
    /* Every endpoint that could write the registered region is force-closed before the region
     * is unmapped: unmapping alone is not a fence (UCX_FENCES.md). */
    x->destroying = true;
    while (x->conns) kvf_conn_close(x->conns);
    while (x->delayed) {
        struct op *o = x->delayed;
        x->delayed = o->next;
        op_finish(o, -ENOTCONN);
    }
    if (x->listener) ucp_listener_destroy(x->listener);
    if (x->rkey_buf) ucp_rkey_buffer_release(x->rkey_buf);
    if (x->memh) ucp_mem_unmap(x->ctx, x->memh);
    if (x->worker) ucp_worker_destroy(x->worker);
    if (x->ctx) ucp_cleanup(x->ctx);
    while (x->free_ops) {
        struct op *o = x->free_ops;
        x->free_ops = o->next;
        free(o);
    }
    free(x);
}

uint16_t kvf_xport_port(const kvf_xport_t *x)
{
    return x->port;
}

int kvf_xport_fd(const kvf_xport_t *x)
{
    return x->efd;
}

static void run_delayed(kvf_xport_t *x);

int kvf_xport_progress(kvf_xport_t *x)
{
    int n = 0;
    if (x->delayed) run_delayed(x);
    /* Bounded: a busy worker can report progress on every call, and the loop has other work. */
    for (int i = 0; i < 64 && ucp_worker_progress(x->worker); i++) n++;
    return n;
}

int kvf_xport_arm(kvf_xport_t *x)
{
    ucs_status_t st = ucp_worker_arm(x->worker);
    return st == UCS_OK ? 0 : -EAGAIN;
}

int kvf_xport_next_ms(const kvf_xport_t *x)
{
    if (!x->delayed) return -1;
    uint64_t now = now_ms(), best = UINT64_MAX;
    for (const struct op *o = x->delayed; o; o = o->next)
        if (o->due_ms < best) best = o->due_ms;
    return best <= now ? 0 : (int)(best - now);
}

int kvf_xport_connect(kvf_xport_t *x, const char *host, uint16_t port, kvf_conn_t **out,
                      char *err, size_t err_len)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, &ss, &sl) < 0) {
        if (err && err_len) snprintf(err, err_len, "cannot resolve '%s'", host);
        return -EINVAL;
    }
    kvf_conn_t *c = conn_new(x);
    if (!c) return -ENOMEM;
    ucp_ep_params_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = (const struct sockaddr *)&ss;
    p.sockaddr.addrlen = sl;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = on_ep_error;
    p.err_handler.arg = c;
    ucs_status_t st = ucp_ep_create(x->worker, &p, &c->ep);
    if (st != UCS_OK) {
        conn_unlink(c);
        free(c);
        if (err && err_len)
            snprintf(err, err_len, "cannot connect to %s:%u: %s", host, port, ucs_status_string(st));
        return KVF_E_TRANSPORT;
    }
    int rc = send_rkey(c);
    if (rc < 0) {
        kvf_conn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kvf_conn_set_user(kvf_conn_t *c, void *user)
{
    c->user = user;
}
void *kvf_conn_user(const kvf_conn_t *c)
{
    return c->user;
}
bool kvf_conn_failed(const kvf_conn_t *c)
{
    return c->failed;
}
const char *kvf_conn_error(const kvf_conn_t *c)
{
    return c->failed ? c->error : "";
}
bool kvf_conn_remote_ready(const kvf_conn_t *c)
{
    return c->remote_bytes != 0;
}
size_t kvf_conn_remote_bytes(const kvf_conn_t *c)
{
    return c->remote_bytes;
}

/* --- Sends, puts, flushes. ----------------------------------------------------------------- */

static int post_send(struct op *o)
{
    o->hdr = (struct am_hdr){(uint32_t)o->off, 0, o->flush_id};
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = on_ucx_done;
    rp.user_data = o;
    rp.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    return settle(o, ucp_am_send_nbx(o->c->ep, AM_ID, &o->hdr, sizeof(o->hdr), o->buf, o->len, &rp));
}

#if defined(KVF_TEST_BUILD)
static bool chance(kvf_xport_t *x, uint32_t pct)
{
    if (!pct) return false;
    x->rng ^= x->rng << 13;
    x->rng ^= x->rng >> 7;
    x->rng ^= x->rng << 17;
    return x->rng % 100 < pct;
}
#endif

static int send_am(kvf_conn_t *c, uint32_t kind, const void *buf, size_t len)
{
    kvf_xport_t *x = c->x;
    int copies = 1;
    uint32_t delay = 0;
#if defined(KVF_TEST_BUILD)
    if (kind == AM_FRAME) {
        if (chance(x, x->faults.frame_drop_pct)) return 0;
        if (chance(x, x->faults.frame_dup_pct)) copies = 2;
        delay = x->faults.frame_delay_ms;
    }
#endif
    for (int i = 0; i < copies; i++) {
        struct op *o = op_get(x, c, OP_SEND);
        if (!o) return -ENOMEM;
        o->buf = malloc(len ? len : 1);
        if (!o->buf) {
            op_put_back(o);
            return -ENOMEM;
        }
        memcpy(o->buf, buf, len);
        o->len = len;
        o->off = kind;
        if (delay) {
            o->due_ms = now_ms() + delay;
            o->next = x->delayed;
            x->delayed = o;
            continue;
        }
        post_send(o);
    }
    return 0;
}

int kvf_conn_send(kvf_conn_t *c, const void *buf, size_t len)
{
    if (c->failed || c->closing) return -ENOTCONN;
    if (len > KVF_XPORT_MAX_FRAME) return -EMSGSIZE;
    return send_am(c, AM_FRAME, buf, len);
}

static int post_put(struct op *o)
{
    kvf_conn_t *c = o->c;
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = on_ucx_done;
    rp.user_data = o;
    if (c->x->msg_writes) {
        /* The source is sent from where it lies (not copied): the callback is the local
         * completion, after which the caller may reuse it. */
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        rp.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
        o->hdr = (struct am_hdr){AM_WRITE, 0, o->off};
        return settle(o, ucp_am_send_nbx(c->ep, AM_ID, &o->hdr, sizeof(o->hdr), o->src, o->len, &rp));
    }
    return settle(o, ucp_put_nbx(c->ep, o->src, o->len, c->remote_base + o->off, c->rkey, &rp));
}

int kvf_conn_put(kvf_conn_t *c, const void *src, size_t len, uint64_t remote_off,
                 kvf_xport_done_fn done, void *arg)
{
    if (c->failed || c->closing) return -ENOTCONN;
    if (!kvf_conn_remote_ready(c)) return -EAGAIN;
    if (remote_off > c->remote_bytes || len > c->remote_bytes - remote_off) return -ERANGE;
    struct op *o = op_get(c->x, c, OP_PUT);
    if (!o) return -ENOMEM;
    o->src = src;
    o->len = len;
    o->off = remote_off;
    o->done = done;
    o->arg = arg;
#if defined(KVF_TEST_BUILD)
    if (c->x->faults.put_delay_ms) {
        o->due_ms = now_ms() + c->x->faults.put_delay_ms;
        o->next = c->x->delayed;
        c->x->delayed = o;
        return 0;
    }
#endif
    return post_put(o);
}

int kvf_conn_order(kvf_conn_t *c)
{
    if (c->failed || c->closing) return -ENOTCONN;
    /* With the fault hook delaying puts, the delayed list keeps them in order instead. */
    ucs_status_t st = ucp_worker_fence(c->x->worker);
    return st == UCS_OK ? 0 : KVF_E_TRANSPORT;
}

/* A flush over writes-as-messages: a FLUSH_REQ behind the writes; the target's FLUSH_ACK (sent
 * after it applied them) completes the flush. The FLUSH_REQ's send is an op of its own (it
 * holds the connection until UCX is done with it), so the flush can end — by its ack, or by the
 * connection's close — whatever becomes of the send. A send that fails ends its flush with an
 * error: that flush can never be acked. */
static void on_flush_req_sent(void *request, ucs_status_t st, void *user)
{
    struct op *sop = user;
    if (request) ucp_request_free(request);
    kvf_conn_t *c = sop->c;
    uint64_t id = sop->flush_id;
    op_put_back(sop);
    if (st == UCS_OK) return;
    for (struct op **pp = &c->flushes; *pp; pp = &(*pp)->next)
        if ((*pp)->flush_id == id) {
            struct op *o = *pp;
            *pp = o->next;
            op_finish(o, KVF_E_TRANSPORT);
            return;
        }
}

static void flush_acked(kvf_conn_t *c, uint64_t id)
{
    for (struct op **pp = &c->flushes; *pp; pp = &(*pp)->next) {
        struct op *o = *pp;
        if (o->flush_id == id) {
            *pp = o->next;
            op_finish(o, 0);
            return;
        }
    }
}

static void on_ack_sent(void *request, ucs_status_t st, void *user)
{
    (void)st;
    struct op *o = user;
    if (request) ucp_request_free(request);
    op_put_back(o);
}

static int send_flush_ack(kvf_conn_t *c, uint64_t id)
{
    struct op *o = op_get(c->x, c, OP_SEND);
    if (!o) return -ENOMEM;
    o->hdr = (struct am_hdr){AM_FLUSH_ACK, 0, id};
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = on_ack_sent;
    rp.user_data = o;
    rp.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t sp = ucp_am_send_nbx(c->ep, AM_ID, &o->hdr, sizeof(o->hdr), NULL, 0, &rp);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) op_put_back(o);
    return 0;
}

static int post_flush(struct op *o)
{
    kvf_conn_t *c = o->c;
    if (c->x->msg_writes) {
        struct op *sop = op_get(c->x, c, OP_SEND);
        if (!sop) {
            op_finish(o, -ENOMEM);
            return 0;
        }
        o->flush_id = ++c->next_flush_id;
        o->next = c->flushes;
        c->flushes = o;
        sop->flush_id = o->flush_id;
        sop->hdr = (struct am_hdr){AM_FLUSH_REQ, 0, o->flush_id};
        ucp_request_param_t rp;
        memset(&rp, 0, sizeof(rp));
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
        rp.cb.send = on_flush_req_sent;
        rp.user_data = sop;
        rp.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
        ucs_status_ptr_t sp = ucp_am_send_nbx(c->ep, AM_ID, &sop->hdr, sizeof(sop->hdr), NULL, 0, &rp);
        if (sp == NULL)
            on_flush_req_sent(NULL, UCS_OK, sop);
        else if (UCS_PTR_IS_ERR(sp))
            on_flush_req_sent(NULL, UCS_PTR_STATUS(sp), sop);
        return 0;
    }
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = on_ucx_done;
    rp.user_data = o;
    return settle(o, ucp_ep_flush_nbx(o->c->ep, &rp));
}

int kvf_conn_flush(kvf_conn_t *c, kvf_xport_done_fn done, void *arg)
{
    if (c->failed || c->closing) return -ENOTCONN;
    struct op *o = op_get(c->x, c, OP_FLUSH);
    if (!o) return -ENOMEM;
    o->done = done;
    o->arg = arg;
#if defined(KVF_TEST_BUILD)
    if (c->x->faults.flush_never) {
        c->x->faults.flush_never--;
        /* Parked: completes (with an error) only when the connection closes. */
        o->due_ms = UINT64_MAX;
        o->next = c->x->delayed;
        c->x->delayed = o;
        return 0;
    }
    if (c->x->faults.put_delay_ms) {
        /* Behind the delayed puts, so the flush still covers them. */
        o->due_ms = now_ms() + c->x->faults.put_delay_ms + 1;
        o->next = c->x->delayed;
        c->x->delayed = o;
        return 0;
    }
#endif
    return post_flush(o);
}

/* Posts delayed operations whose time has come, in due order (ties in posting order). */
static void run_delayed(kvf_xport_t *x)
{
    uint64_t now = now_ms();
    for (;;) {
        struct op **best = NULL;
        for (struct op **pp = &x->delayed; *pp; pp = &(*pp)->next)
            if ((*pp)->due_ms <= now && (!best || (*pp)->due_ms <= (*best)->due_ms)) best = pp;
        if (!best) return;
        struct op *o = *best;
        *best = o->next;
        o->next = NULL;
        if (o->c->failed || o->c->closing) {
            op_finish(o, -ENOTCONN);
            continue;
        }
        switch (o->kind) {
        case OP_PUT: post_put(o); break;
        case OP_FLUSH: post_flush(o); break;
        case OP_SEND: post_send(o); break;
        default: op_finish(o, -EINVAL); break;
        }
    }
}

/* Issues the forced close of c's endpoint once: delayed operations of c end first, with an
 * error; UCX completes c's outstanding operations with errors as the close proceeds. */
static void start_close(kvf_conn_t *c)
{
    kvf_xport_t *x = c->x;
    if (c->close_started) return;
    c->close_started = true;
    for (struct op **pp = &x->delayed; *pp;) {
        struct op *o = *pp;
        if (o->c == c) {
            *pp = o->next;
            op_finish(o, -ENOTCONN);
        } else {
            pp = &o->next;
        }
    }
    /* Flushes awaiting an ack will never get one: the connection proves nothing more. */
    while (c->flushes) {
        struct op *f = c->flushes;
        c->flushes = f->next;
        op_finish(f, -ENOTCONN);
    }
    struct op *o = op_get(x, NULL, OP_CLOSE);
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    if (o) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.send = on_ucx_done;
        rp.user_data = o;
    }
    ucs_status_ptr_t sp = ucp_ep_close_nbx(c->ep, &rp);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        if (o) op_put_back(o);
        return;
    }
    c->close_op = o;
    if (!o) c->close_req = sp;
}

void kvf_conn_close(kvf_conn_t *c)
{
    kvf_xport_t *x = c->x;
#if defined(KVF_MUTANT_FENCE_WITHOUT_CLOSE)
    /* Mutant: the "fence" only forgets the connection — the endpoint stays open and its writes
     * keep landing, as when a target unregisters memory or drops its bookkeeping instead of
     * closing the endpoint (UCX_FENCES.md). */
    if (!x->destroying) {
        c->user = NULL;
        return;
    }
#endif
    c->closing = true;
    start_close(c);
    /* A forced close needs no reply from the peer; it completes within local progress. */
    uint64_t give_up = now_ms() + 5000;
    if (c->close_op) {
        while (!c->close_op->completed && now_ms() < give_up) ucp_worker_progress(x->worker);
        op_put_back(c->close_op);
        c->close_op = NULL;
    } else if (c->close_req) {
        while (ucp_request_check_status(c->close_req) == UCS_INPROGRESS && now_ms() < give_up)
            ucp_worker_progress(x->worker);
        ucp_request_free(c->close_req);
        c->close_req = NULL;
    }
    /* Outstanding operations of c completed (with errors) during the close; let the last
     * callbacks run before c goes. */
    give_up = now_ms() + 2000;
    while (c->ops && now_ms() < give_up) ucp_worker_progress(x->worker);
    if (c->rkey) ucp_rkey_destroy(c->rkey);
    conn_unlink(c);
    if (c->ops) {
        /* Cannot happen with UCX's forced close; keep c (leaked) rather than free memory a
         * late callback would touch. */
        return;
    }
    free(c);
}

/* --- Fault hooks. -------------------------------------------------------------------------- */

int kvf_xport_faults_from_env(struct kvf_xport_faults *out)
{
#if defined(KVF_TEST_BUILD)
    memset(out, 0, sizeof(*out));
    const char *s = getenv("KVF_FAULTS");
    if (!s || !*s) return 0;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) return -EINVAL;
        *eq = 0;
        char *end = NULL;
        long long v = strtoll(eq + 1, &end, 10);
        if (!end || *end) return -EINVAL;
        if (strcmp(t, "put_delay_ms") == 0) out->put_delay_ms = (uint32_t)v;
        else if (strcmp(t, "frame_delay_ms") == 0) out->frame_delay_ms = (uint32_t)v;
        else if (strcmp(t, "frame_drop_pct") == 0) out->frame_drop_pct = (uint32_t)v;
        else if (strcmp(t, "frame_dup_pct") == 0) out->frame_dup_pct = (uint32_t)v;
        else if (strcmp(t, "flush_never") == 0) out->flush_never = (uint32_t)v;
        else if (strcmp(t, "fail_put") == 0) out->fail_put_status = (int)v;
        else if (strcmp(t, "seed") == 0) out->seed = (uint64_t)v;
        else return -EINVAL;
    }
    return 0;
#else
    (void)out;
    return -ENOTSUP;
#endif
}

int kvf_xport_set_faults(kvf_xport_t *x, const struct kvf_xport_faults *f)
{
#if defined(KVF_TEST_BUILD)
    x->faults = *f;
    if (f->seed) x->rng = f->seed;
    return 0;
#else
    (void)x;
    (void)f;
    return -ENOTSUP;
#endif
}
