/*
 * admin.c — the operator endpoints, apart from the tenants': who may see /metrics and /health's
 * figures, and the operator address that serves them alone.
 *
 * /metrics names every tenant and counts what each asked for; /health's figures show the pools,
 * the queues and the workers. Both are the operator's, not a tenant's:
 *
 *   configured            public address                       operator address
 *   ---------------------  -----------------------------------  ------------------------------
 *   nothing               /metrics, /health in full to anyone  (none)
 *   admin keys            an admin key: in full; none or a     (none)
 *                         wrong one: 401; a tenant's key: 403;
 *                         plain /health to anyone who does not
 *                         ask for the figures (?detail=1)
 *   admin listen          /metrics 404; /health plain, its     /metrics, /health in full (with
 *                         figures (?detail=1) 404              admin keys: as the row above)
 *
 * GET /admin/provenance/{id} (prov.c) follows /metrics' row: an operator's (kvf__srv_admin_only).
 *
 * The plain /health is what a load balancer needs, its status alone ({"status":"ok"} with 200, or
 * {"status":"unavailable"} with 503): no tenant, no figure. A tenant's key never opens an
 * operator endpoint: the two key files may not share a key (the CLI refuses them at start), and
 * the key is looked up among the admin keys only. Work: one constant-time lookup over each key
 * file per request.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kvfence/common.h"
#include "server_internal.h"

const char *kvf__srv_bearer(const char *h, size_t *len)
{
    if (!h || strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t')) return NULL;
    h += 7;
    while (*h == ' ' || *h == '\t')
        h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    if (!n) return NULL;
    *len = n;
    return h;
}

int kvf__srv_admin_view(const struct kvf_server_config *cfg, bool on_admin, bool metrics,
                        const char *authorization, bool want_detail, struct kvf__srv_err *e)
{
    const char *what = metrics ? "/metrics" : "/health's figures (?detail=1)";
    if (cfg->admin_listen && !on_admin) {
        if (metrics || want_detail)
            return kvf__srv_fail(e, 404, NULL, "not_found",
                                 "%s is served on the operator address (--admin-listen)", what);
        return KVF__SRV_VIEW_PLAIN;
    }
    if (!cfg->admin_keys) return KVF__SRV_VIEW_FULL;
    size_t n = 0;
    const char *key = kvf__srv_bearer(authorization, &n);
    if (key && kvf_server_keys_lookup(cfg->admin_keys, key, n)) return KVF__SRV_VIEW_FULL;
    if (!metrics && !want_detail) return KVF__SRV_VIEW_PLAIN;
    if (key && cfg->keys && kvf_server_keys_lookup(cfg->keys, key, n))
        return kvf__srv_fail(e, 403, NULL, "admin_only",
                             "%s is an operator endpoint: a tenant's API key never opens it; "
                             "send an admin key (--admin-keys)",
                             what);
    return kvf__srv_fail(e, 401, NULL, "admin_key_required",
                         "%s needs an admin key: send 'Authorization: Bearer KEY' with a key of "
                         "--admin-keys",
                         what);
}

int kvf__srv_admin_only(const struct kvf_server_config *cfg, bool on_admin, const char *what,
                        const char *authorization, struct kvf__srv_err *e)
{
    if (cfg->admin_listen && !on_admin)
        return kvf__srv_fail(e, 404, NULL, "not_found",
                             "%s is served on the operator address (--admin-listen)", what);
    if (!cfg->admin_keys) return 0;
    size_t n = 0;
    const char *key = kvf__srv_bearer(authorization, &n);
    if (key && kvf_server_keys_lookup(cfg->admin_keys, key, n)) return 0;
    if (key && cfg->keys && kvf_server_keys_lookup(cfg->keys, key, n))
        return kvf__srv_fail(e, 403, NULL, "admin_only",
                             "%s is an operator endpoint: a tenant's API key never opens it; "
                             "send an admin key (--admin-keys)",
                             what);
    return kvf__srv_fail(e, 401, NULL, "admin_key_required",
                         "%s needs an admin key: send 'Authorization: Bearer KEY' with a key of "
                         "--admin-keys",
                         what);
}

static void discard_log(void *cls, const char *fmt, va_list ap)
{
    /* Library code never prints (STYLE.md); MHD's messages are dropped. */
}

int kvf__srv_admin_start(struct kvf__srv_admin *a, const char *host, uint16_t port,
                         MHD_AccessHandlerCallback on_request,
                         MHD_RequestCompletedCallback on_completed, void *cls, char *err,
                         size_t err_len)
{
    bool v6 = false;
    int fd = -1;
    int rc = kvf__srv_open_listener(host ? host : "127.0.0.1", port, &fd, &v6, err, err_len);
    if (rc < 0) return rc;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    if (v6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d =
        MHD_start_daemon(flags, 0, NULL, NULL, on_request, cls, MHD_OPTION_LISTEN_SOCKET, fd,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, cls,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)KVF__SRV_ADMIN_CONNS,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KVF__SRV_ADMIN_IDLE_S,
                         MHD_OPTION_EXTERNAL_LOGGER, discard_log, NULL, MHD_OPTION_END);
    if (!d) {
        snprintf(err, err_len, "server: libmicrohttpd did not start on the operator address %s:%u",
                 host ? host : "127.0.0.1", port);
        close(fd);
        return KVF_E_SERVER;
    }
    a->d = d;
    a->fd = fd;
    a->port = kvf__srv_bound_port(fd);
    return 0;
}

bool kvf__srv_admin_conn(const struct kvf__srv_admin *a, struct MHD_Connection *c)
{
    if (!a->d) return false;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_DAEMON);
    return ci && ci->daemon == a->d;
}

void kvf__srv_admin_stop(struct kvf__srv_admin *a)
{
    if (!a->d) return;
    MHD_stop_daemon(a->d); /* closes the listening socket it was given */
    a->d = NULL;
    a->fd = -1;
}
