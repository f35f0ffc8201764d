/*
 * netaddr.c — client addresses: numeric IPv4/IPv6 addresses and CIDR blocks, the trusted-proxy
 * list, and the client a request came from when its peer is a trusted proxy (Forwarded, else
 * X-Forwarded-For: the last hop that is not a trusted proxy).
 *
 * Pure functions over caller-owned text and structs; nothing allocates but the list parser.
 * Work: a parse is O(length); a lookup walks the list (O(n_cidr) each hop); a header walk is
 * O(header length × n_cidr).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "server_internal.h"

static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

bool kvf__srv_addr_from_sockaddr(const struct sockaddr *sa, struct kvf__srv_addr *out)
{
    memset(out, 0, sizeof *out);
    if (!sa) return false;
    if (sa->sa_family == AF_INET) {
        memcpy(out->b, v4_mapped, 12);
        memcpy(out->b + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        memcpy(out->b, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return true;
    }
    return false;
}

/* s[0..n) as a bare numeric address (no brackets, no port). */
static bool parse_bare(const char *s, size_t n, struct kvf__srv_addr *out)
{
    char buf[INET6_ADDRSTRLEN + 1];
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    memset(out, 0, sizeof *out);
    struct in_addr a4;
    if (inet_pton(AF_INET, buf, &a4) == 1) {
        memcpy(out->b, v4_mapped, 12);
        memcpy(out->b + 12, &a4, 4);
        return true;
    }
    return inet_pton(AF_INET6, buf, out->b) == 1;
}

bool kvf__srv_addr_parse(const char *s, size_t n, bool allow_port, struct kvf__srv_addr *out)
{
    while (n && (*s == ' ' || *s == '\t'))
        s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (n >= 2 && s[0] == '"' && s[n - 1] == '"') s++, n -= 2; /* Forwarded's quoted form */
    if (n && s[0] == '[') {                                    /* [v6] or [v6]:port */
        const char *close = memchr(s, ']', n);
        if (!close) return false;
        size_t rest = n - (size_t)(close + 1 - s);
        if (rest && !(allow_port && close[1] == ':')) return false;
        return parse_bare(s + 1, (size_t)(close - s - 1), out);
    }
    const char *colon = memchr(s, ':', n);
    if (colon && allow_port && !memchr(colon + 1, ':', n - (size_t)(colon + 1 - s)))
        n = (size_t)(colon - s); /* v4:port */
    return parse_bare(s, n, out);
}

void kvf__srv_addr_format(const struct kvf__srv_addr *a, char *out, size_t cap)
{
    if (memcmp(a->b, v4_mapped, 12) == 0) {
        if (!inet_ntop(AF_INET, a->b + 12, out, (socklen_t)cap)) snprintf(out, cap, "?");
    } else if (!inet_ntop(AF_INET6, a->b, out, (socklen_t)cap)) {
        snprintf(out, cap, "?");
    }
}

bool kvf__srv_cidr_contains(const struct kvf__srv_cidr *c, const struct kvf__srv_addr *a)
{
    unsigned bits = c->prefix;
    for (unsigned i = 0; i < 16 && bits; i++) {
        unsigned take = bits < 8 ? bits : 8;
        uint8_t mask = (uint8_t)(0xff << (8 - take));
        if ((c->a.b[i] ^ a->b[i]) & mask) return false;
        bits -= take;
    }
    return true;
}

bool kvf__srv_trusted(const struct kvf__srv_cidr *list, size_t n, const struct kvf__srv_addr *a)
{
    for (size_t i = 0; i < n; i++)
        if (kvf__srv_cidr_contains(&list[i], a)) return true;
    return false;
}

int kvf__srv_cidrs_parse(const char *text, struct kvf__srv_cidr **out, size_t *n_out, char *err,
                         size_t err_len)
{
    *out = NULL;
    *n_out = 0;
    if (!text || !*text) return 0;
    size_t cap = 1;
    for (const char *p = text; *p; p++)
        cap += *p == ',';
    struct kvf__srv_cidr *list = calloc(cap, sizeof *list);
    if (!list) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    size_t n = 0;
    for (const char *p = text;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (*p == ' ' || *p == '\t'))
            p++, len--;
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        const char *slash = memchr(p, '/', len);
        size_t alen = slash ? (size_t)(slash - p) : len;
        struct kvf__srv_cidr c = {.prefix = 128};
        bool ok = len > 0 && parse_bare(p, alen, &c.a);
        bool v4 = ok && memcmp(c.a.b, v4_mapped, 12) == 0;
        if (ok && slash) {
            char *e;
            unsigned long pl = strtoul(slash + 1, &e, 10);
            ok = e == p + len && e > slash + 1 && pl <= (v4 ? 32u : 128u);
            c.prefix = (uint8_t)(v4 ? 96 + pl : pl);
        }
        if (!ok) {
            snprintf(err, err_len, "'%.*s' is not an address or ADDR/PREFIX",
                     (int)(len < 80 ? len : 80), p);
            free(list);
            return -EINVAL;
        }
        list[n++] = c;
        if (!end) break;
        p = end + 1;
    }
    *out = list;
    *n_out = n;
    return 0;
}

/* The hops of a Forwarded value, nearest last: each element's for= parameter. Calls hop for each
 * (s, n) from the last element to the first, until it returns false. */
static void forwarded_hops(const char *v, bool (*hop)(void *, const char *, size_t), void *arg)
{
    size_t len = strlen(v);
    for (size_t end = len;;) {
        size_t start = end;
        while (start > 0 && v[start - 1] != ',')
            start--;
        /* The element v[start..end): parameters separated by ';'. */
        const char *found = NULL;
        size_t flen = 0;
        for (size_t i = start; i < end;) {
            size_t j = i;
            while (j < end && v[j] != ';')
                j++;
            const char *p = v + i;
            size_t pl = j - i;
            while (pl && (*p == ' ' || *p == '\t'))
                p++, pl--;
            if (pl > 4 && strncasecmp(p, "for=", 4) == 0) found = p + 4, flen = pl - 4;
            i = j + 1;
        }
        if (!hop(arg, found ? found : "", found ? flen : 0)) return;
        if (start == 0) return;
        end = start - 1;
    }
}

static void list_hops(const char *v, bool (*hop)(void *, const char *, size_t), void *arg)
{
    size_t end = strlen(v);
    for (;;) {
        size_t start = end;
        while (start > 0 && v[start - 1] != ',')
            start--;
        if (!hop(arg, v + start, end - start)) return;
        if (start == 0) return;
        end = start - 1;
    }
}

struct hop_walk {
    const struct kvf__srv_cidr *list;
    size_t n;
    struct kvf__srv_addr *client; /* in: the peer; out: the client */
    bool done;
};

/* One hop, nearest first: a trusted proxy passes the walk on to the hop before it; anything
 * else is the client. A hop that is not an address ("unknown", an obfuscated identifier,
 * garbage) ends the walk at the trusted hop that reported it. */
static bool walk_hop(void *arg, const char *s, size_t n)
{
    struct hop_walk *w = arg;
    struct kvf__srv_addr a;
    if (!kvf__srv_addr_parse(s, n, true, &a)) {
        w->done = true;
        return false;
    }
    *w->client = a;
    if (!kvf__srv_trusted(w->list, w->n, &a)) {
        w->done = true;
        return false;
    }
    return true;
}

void kvf__srv_forwarded_client(const struct kvf__srv_cidr *list, size_t n, const char *forwarded,
                               const char *xff, struct kvf__srv_addr *client)
{
    struct hop_walk w = {list, n, client, false};
    if (forwarded && *forwarded)
        forwarded_hops(forwarded, walk_hop, &w);
    else if (xff && *xff)
        list_hops(xff, walk_hop, &w);
}
