/*
 * seam.c — the transport seam: every kvf_xport_* and kvf_conn_* call dispatches through the ops
 * of the object it is given (kvfence/transport.h, "The seam"). The fabric (tcp.c) and the
 * deterministic simulator (tests/sim/simnet.c) implement the ops; the engine calls only these.
 */
#include <errno.h>

#include "kvfence/transport.h"

static const struct kvf_transport_ops *xops(const kvf_xport_t *x)
{
    return ((const struct kvf_xport_head *)(const void *)x)->ops;
}

static const struct kvf_transport_ops *cops(const kvf_conn_t *c)
{
    return ((const struct kvf_conn_head *)(const void *)c)->ops;
}

int kvf_xport_create(const struct kvf_xport_config *cfg, const struct kvf_xport_events *ev,
                     kvf_xport_t **out, char *err, size_t err_len)
{
    if (!cfg || !ev || !out) return -EINVAL;
    const struct kvf_transport_ops *ops = cfg->ops ? cfg->ops : &kvf_tcp_transport;
    return ops->create(cfg->ops_ctx, cfg, ev, out, err, err_len);
}

void kvf_xport_destroy(kvf_xport_t *x)
{
    if (x) xops(x)->destroy(x);
}

uint16_t kvf_xport_port(const kvf_xport_t *x)
{
    return xops(x)->port(x);
}

int kvf_xport_fd(const kvf_xport_t *x)
{
    return xops(x)->fd(x);
}

int kvf_xport_progress(kvf_xport_t *x)
{
    return xops(x)->progress(x);
}

int kvf_xport_arm(kvf_xport_t *x)
{
    return xops(x)->arm(x);
}

int kvf_xport_next_ms(const kvf_xport_t *x)
{
    return xops(x)->next_ms(x);
}

uint64_t kvf_xport_now_ms(const kvf_xport_t *x)
{
    return xops(x)->now_ms(x);
}

int kvf_xport_connect(kvf_xport_t *x, const char *host, uint16_t port, kvf_conn_t **out, char *err,
                      size_t err_len)
{
    return xops(x)->connect(x, host, port, out, err, err_len);
}

int kvf_xport_set_faults(kvf_xport_t *x, const struct kvf_xport_faults *f)
{
    const struct kvf_transport_ops *ops = xops(x);
    return ops->set_faults ? ops->set_faults(x, f) : -ENOTSUP;
}

void kvf_conn_set_user(kvf_conn_t *c, void *user)
{
    ((struct kvf_conn_head *)(void *)c)->user = user;
}

void *kvf_conn_user(const kvf_conn_t *c)
{
    return ((const struct kvf_conn_head *)(const void *)c)->user;
}

bool kvf_conn_failed(const kvf_conn_t *c)
{
    return cops(c)->failed(c);
}

const char *kvf_conn_error(const kvf_conn_t *c)
{
    return cops(c)->error(c);
}

bool kvf_conn_remote_ready(const kvf_conn_t *c)
{
    return cops(c)->remote_bytes(c) != 0;
}

size_t kvf_conn_remote_bytes(const kvf_conn_t *c)
{
    return cops(c)->remote_bytes(c);
}

int kvf_conn_send(kvf_conn_t *c, const void *buf, size_t len)
{
    return cops(c)->send(c, buf, len);
}

int kvf_conn_put(kvf_conn_t *c, const void *src, size_t len, uint64_t remote_off,
                 kvf_xport_done_fn done, void *arg)
{
    return cops(c)->put(c, src, len, remote_off, done, arg);
}

int kvf_conn_order(kvf_conn_t *c)
{
    return cops(c)->order(c);
}

int kvf_conn_flush(kvf_conn_t *c, kvf_xport_done_fn done, void *arg)
{
    return cops(c)->flush(c, done, arg);
}

void kvf_conn_close(kvf_conn_t *c)
{
    cops(c)->close(c);
}
