/*
 * `kvfence bench handoff --transport tcp --page-bytes N [--pages P] [--runs R] [--rtt-iters K]
 * [--no-reference]`: the page handoff over the real transport (src/transport/tcp.c: the
 * authenticated fabric, every write sealed) between two
 * processes.
 *
 * The bench forks before either side opens its transport. The parent is the target: it registers a
 * region laid out like the decode pool (P pages at a stride of round64(N) + 64: N data bytes,
 * then the 64-byte trailer) and listens on 127.0.0.1. The child is the writer: it connects,
 * holds P source pages, and answers each GRANT the way the prefill worker does — for every page
 * it stamps the data (so every run's bytes differ), takes the XXH3-64 of the data, puts the data,
 * orders (kvf_conn_order), puts the trailer; after the last page it flushes, and when the flush
 * is acked (the drain proof) sends DONE with the checksums. On DONE the target checks every
 * page as decode's commit check does: each trailer field against what it granted, the trailer's
 * checksum against DONE's, and the XXH3 of the data it received against both.
 *
 *   gbps    P × N data bytes / (GRANT sent → last page verified), 1e9 bytes per GB; the median
 *           of --runs runs (default 11, after one warm-up run). P defaults to 32 MiB of data.
 *   rtt_us  one page: GRANT sent → writer stamps, hashes, puts, orders, puts the trailer,
 *           flushes, sends DONE on the ack → target verifies; the median of --rtt-iters
 *           (default 201).
 *
 * Both sides run the engine's loop shape (progress; arm; poll the worker's fd), not a spin.
 *
 * The reference: `ucx_perftest -t ucp_put_bw` over the same transport (UCX_TLS=tcp, loopback,
 * message size N), run before and after the handoff runs; the better of the two is the
 * reference the ratio is taken against: a well-kept transport's bandwidth over the same
 * loopback, unencrypted. For context, `ucx_perftest -t ucp_am_bw` (UCX's active messages) is
 * run once after and printed too. ucx_perftest prints MB/s of 2^20 bytes; the line here
 * gives GB/s of 1e9 bytes. Without ucx_perftest on the PATH the line says so.
 *
 * Bounds: memory ≈ 2 × P × (N + 128) bytes; every wait is bounded (10 s per GRANT, 60 s per
 * reference run); the child is killed (by its pid) if it does not exit 5 s after QUIT.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench.h"
#include "kvfence/pool.h"
#include "kvfence/transport.h"

#define HB_MAX_RUNS  101
#define HB_MAX_RTT   10001
#define HB_MAX_PAGES 65536u
#define HB_WAIT_MS   10000u

enum hb_kind { HB_GRANT = 1, HB_DONE = 2, HB_QUIT = 3 };

/* A control frame of the bench (not the protocol's codec: this bench measures the transport). */
struct hb_frame {
    uint32_t kind;
    uint32_t n_pages; /* GRANT: pages to write, from page 0; DONE: checksums that follow */
    uint64_t run;     /* names the grant: the trailer's req and the stamp in the data */
    uint64_t nonce;   /* the trailer's epoch_nonce */
    uint64_t sums[];  /* DONE: [n_pages] XXH3-64 of each page's data */
};

struct hb_opts {
    size_t page_bytes; /* N: data bytes of one page */
    uint32_t pages;    /* P */
    uint32_t runs;
    uint32_t rtt_iters;
    bool reference;
};

static size_t stride_of(size_t n)
{
    return ((n + 63) & ~(size_t)63) + sizeof(struct kvf_page_trailer);
}

/* The tag the target grants page i of run `run` with (any function both sides compute). */
static uint64_t tag_of(uint64_t run, uint32_t i)
{
    return (run * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)i << 1 | 1);
}

/* One turn of the engine's loop: progress; when nothing ran, arm and sleep on the fd. */
static void loop_turn(kvf_xport_t *x, int timeout_ms)
{
    if (kvf_xport_progress(x) > 0) return;
    if (kvf_xport_arm(x) < 0) return;
    struct pollfd p = {kvf_xport_fd(x), POLLIN, 0};
    poll(&p, 1, timeout_ms);
}

/* --- The writer (child process). ------------------------------------------------------------ */

struct writer {
    kvf_xport_t *x;
    kvf_conn_t *c;
    const struct hb_opts *o;
    uint8_t *src;                      /* [pages][page_bytes], 64-aligned */
    struct kvf_page_trailer *trailers; /* [pages] */
    struct hb_frame *done;             /* the DONE being built */
    uint32_t puts_out;
    bool flush_out, failed, quit, ready;
    int err;
};

static void w_put_done(void *arg, int status)
{
    struct writer *w = arg;
    w->puts_out--;
    if (status != 0 && !w->err) w->err = status;
}

static void w_flush_done(void *arg, int status)
{
    struct writer *w = arg;
    w->flush_out = false;
    if (status != 0) {
        if (!w->err) w->err = status;
        return;
    }
    /* The drain proof: every page and trailer landed; now the DONE may claim them. */
    size_t len = sizeof(*w->done) + (size_t)w->done->n_pages * sizeof(uint64_t);
    int rc = kvf_conn_send(w->c, w->done, len);
    if (rc < 0 && !w->err) w->err = rc;
}

static void w_grant(struct writer *w, const struct hb_frame *g)
{
    size_t n = w->o->page_bytes, stride = stride_of(n);
    if (g->n_pages > w->o->pages) {
        w->err = -EINVAL;
        return;
    }
    /* The sources of the last grant are reused: wait for their local completions. */
    for (int spins = 0; w->puts_out && !w->failed && spins < 1000000; spins++)
        loop_turn(w->x, 1);
    w->done->kind = HB_DONE;
    w->done->n_pages = g->n_pages;
    w->done->run = g->run;
    w->done->nonce = g->nonce;
    for (uint32_t i = 0; i < g->n_pages; i++) {
        uint8_t *page = w->src + (size_t)i * n;
        uint64_t stamp[2] = {g->run, i};
        memcpy(page, stamp, sizeof(stamp) <= n ? sizeof(stamp) : n);
        uint64_t sum = XXH3_64bits(page, n);
        w->done->sums[i] = sum;
        struct kvf_page_trailer *t = &w->trailers[i];
        memset(t, 0, sizeof(*t));
        t->tag = tag_of(g->run, i);
        t->req = (kvf_req_id_t){g->run, 0};
        t->tenant = 1;
        t->slots = i;
        t->checksum = sum;
        t->epoch_nonce = g->nonce;
        uint64_t off = (uint64_t)i * stride;
        w->puts_out += 2;
        int rc = kvf_conn_put(w->c, page, n, off, w_put_done, w);
        if (rc < 0) w_put_done(w, rc);
        kvf_conn_order(w->c);
        rc = kvf_conn_put(w->c, t, sizeof(*t), off + stride - sizeof(*t), w_put_done, w);
        if (rc < 0) w_put_done(w, rc);
    }
    w->flush_out = true;
    if (kvf_conn_flush(w->c, w_flush_done, w) < 0) w_flush_done(w, KVF_E_TRANSPORT);
}

static void w_on_frame(void *ctx, kvf_conn_t *c, const uint8_t *buf, size_t len)
{
    struct writer *w = ctx;
    (void)c;
    struct hb_frame f;
    if (len < sizeof(f)) return;
    memcpy(&f, buf, sizeof(f));
    if (f.kind == HB_QUIT)
        w->quit = true;
    else if (f.kind == HB_GRANT)
        w_grant(w, &f);
}

static void w_on_ready(void *ctx, kvf_conn_t *c)
{
    (void)c;
    ((struct writer *)ctx)->ready = true;
}

static void w_on_error(void *ctx, kvf_conn_t *c, int err)
{
    (void)c;
    (void)err;
    ((struct writer *)ctx)->failed = true;
}

static int writer_main(const struct hb_opts *o, int port_fd)
{
    uint16_t port = 0;
    if (read(port_fd, &port, sizeof(port)) != (ssize_t)sizeof(port) || !port) return 3;
    struct writer w;
    memset(&w, 0, sizeof(w));
    w.o = o;
    w.src = aligned_alloc(64, (size_t)o->pages * o->page_bytes);
    w.trailers = aligned_alloc(64, (size_t)o->pages * sizeof(*w.trailers));
    w.done = malloc(sizeof(*w.done) + (size_t)o->pages * sizeof(uint64_t));
    if (!w.src || !w.trailers || !w.done) return 4;
    /* Bytes that are not all zero, so the checksums hash something. */
    uint64_t s = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i + 8 <= (size_t)o->pages * o->page_bytes; i += 8) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        memcpy(w.src + i, &s, 8);
    }
    struct kvf_xport_config cfg = {0};
    struct kvf_xport_events ev = {
        .ctx = &w, .on_frame = w_on_frame, .on_remote_ready = w_on_ready, .on_error = w_on_error};
    char err[256] = "";
    if (kvf_xport_create(&cfg, &ev, &w.x, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence bench handoff (writer): %s\n", err);
        return 5;
    }
    int rc = kvf_xport_connect(w.x, "127.0.0.1", port, &w.c, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "kvfence bench handoff (writer): %s\n", err);
        kvf_xport_destroy(w.x);
        return 5;
    }
    while (!w.quit && !w.failed && !w.err)
        loop_turn(w.x, 100);
    int status = w.err ? 6 : 0;
    if (w.err) fprintf(stderr, "kvfence bench handoff (writer): %s\n", kvf_strerror(w.err));
    kvf_xport_destroy(w.x); /* closes the connection */
    free(w.src);
    free(w.trailers);
    free(w.done);
    return status;
}

/* --- The target (parent process). ----------------------------------------------------------- */

struct target {
    kvf_xport_t *x;
    kvf_conn_t *c;
    const struct hb_opts *o;
    uint8_t *region; /* [pages][stride], the registered "decode pool" */
    uint64_t run, nonce;
    uint32_t granted;
    bool done, failed, ready;
    int verify_err; /* 0, or the first page that failed + 1 */
};

/* Decode's commit check for the pages of the current grant: trailer fields, then the checksum
 * the trailer carries against DONE's, then the data's own XXH3. */
static int t_verify(struct target *t, const struct hb_frame *d)
{
    size_t n = t->o->page_bytes, stride = stride_of(n);
    if (d->run != t->run || d->nonce != t->nonce || d->n_pages != t->granted) return -EPROTO;
    for (uint32_t i = 0; i < d->n_pages; i++) {
        const uint8_t *page = t->region + (size_t)i * stride;
        struct kvf_page_trailer tr;
        memcpy(&tr, page + stride - sizeof(tr), sizeof(tr));
        if (tr.tag != tag_of(t->run, i) || tr.req.lo != t->run || tr.req.hi != 0 ||
            tr.tenant != 1 || tr.slots != i || tr.epoch_nonce != t->nonce ||
            tr.checksum != d->sums[i])
            return (int)i + 1;
        if (XXH3_64bits(page, n) != d->sums[i]) return (int)i + 1;
    }
    return 0;
}

static void t_on_frame(void *ctx, kvf_conn_t *c, const uint8_t *buf, size_t len)
{
    struct target *t = ctx;
    (void)c;
    if (len < sizeof(struct hb_frame)) return;
    /* The frame is borrowed and may be unaligned: copy it out whole. */
    struct hb_frame *d = malloc(len);
    if (!d) return;
    memcpy(d, buf, len);
    if (d->kind == HB_DONE && len == sizeof(*d) + (size_t)d->n_pages * sizeof(uint64_t)) {
        t->verify_err = t_verify(t, d);
        t->done = true;
    }
    free(d);
}

static void t_on_accept(void *ctx, kvf_conn_t *c)
{
    struct target *t = ctx;
    if (t->c) {
        kvf_conn_close(c); /* one writer only */
        return;
    }
    t->c = c;
}

static void t_on_ready(void *ctx, kvf_conn_t *c)
{
    struct target *t = ctx;
    if (c == t->c) t->ready = true;
}

static void t_on_error(void *ctx, kvf_conn_t *c, int err)
{
    struct target *t = ctx;
    (void)err;
    if (c == t->c) t->failed = true;
}

/* One handoff of n pages: clears their trailers (as kvf_pool_grant does), sends GRANT, waits
 * for the verified DONE. Returns elapsed ns, or 0 on failure. */
static uint64_t t_handoff(struct target *t, uint32_t n)
{
    size_t stride = stride_of(t->o->page_bytes);
    for (uint32_t i = 0; i < n; i++)
        memset(t->region + (size_t)i * stride + stride - sizeof(struct kvf_page_trailer), 0,
               sizeof(struct kvf_page_trailer));
    t->run++;
    t->nonce = (uint64_t)7 << 32 | (uint32_t)(t->run * 2654435761u);
    t->granted = n;
    t->done = false;
    struct hb_frame g = {HB_GRANT, n, t->run, t->nonce};
    uint64_t t0 = kvf_bench_now_ns();
    if (kvf_conn_send(t->c, &g, sizeof(g)) < 0) return 0;
    uint64_t give_up = t0 + (uint64_t)HB_WAIT_MS * 1000000u;
    while (!t->done && !t->failed && kvf_bench_now_ns() < give_up)
        loop_turn(t->x, 10);
    uint64_t t1 = kvf_bench_now_ns();
    if (!t->done) {
        fprintf(stderr, "kvfence bench handoff: no DONE for run %llu (%s)\n",
                (unsigned long long)t->run, t->failed ? kvf_conn_error(t->c) : "timed out");
        return 0;
    }
    if (t->verify_err) {
        fprintf(stderr, "kvfence bench handoff: page %d of run %llu failed verification\n",
                t->verify_err - 1, (unsigned long long)t->run);
        return 0;
    }
    return t1 > t0 ? t1 - t0 : 1;
}

/* --- The reference: ucx_perftest -t ucp_put_bw. --------------------------------------------- */

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    uint16_t port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void wait_child(pid_t pid, int timeout_ms)
{
    for (int i = 0; i < timeout_ms / 10; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* One ucx_perftest pair (server child, client here) of `test` at message size n: GB/s (1e9),
 * or a negative value when it could not run. */
static double reference_gbps(const char *test, size_t n)
{
    uint16_t port = free_port();
    if (!port) return -1;
    unsigned long iters = (128ul << 20) / n;
    if (iters < 200) iters = 200;
    char size_s[32], iters_s[32], warm_s[32], port_s[16];
    snprintf(size_s, sizeof(size_s), "%zu", n);
    snprintf(iters_s, sizeof(iters_s), "%lu", iters);
    snprintf(warm_s, sizeof(warm_s), "%lu", iters / 10 + 1);
    snprintf(port_s, sizeof(port_s), "%u", port);
    pid_t srv = fork();
    if (srv < 0) return -1;
    if (srv == 0) {
        int dn = open("/dev/null", 0);
        if (dn >= 0) dup2(dn, 1), dup2(dn, 2);
        setenv("UCX_TLS", "tcp", 1);
        execlp("ucx_perftest", "ucx_perftest", "-t", test, "-s", size_s, "-n", iters_s, "-w",
               warm_s, "-p", port_s, "-f", (char *)NULL);
        _exit(127);
    }
    double gbps = -1;
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "UCX_TLS=tcp timeout 60 ucx_perftest 127.0.0.1 -t %s -s %s -n %s -w %s "
             "-p %s -f 2>/dev/null",
             test, size_s, iters_s, warm_s, port_s);
    /* The server needs a moment to listen; the client fails at once if it is not there yet. */
    for (int attempt = 0; attempt < 20 && gbps < 0; attempt++) {
        usleep(attempt ? 200000 : 300000);
        if (waitpid(srv, NULL, WNOHANG) == srv) {
            srv = 0;
            break;
        }
        FILE *p = popen(cmd, "r");
        if (!p) break;
        char line[512];
        while (fgets(line, sizeof(line), p)) {
            /* The final line: iterations, 3 overheads, 2 bandwidths (MB/s of 2^20), 2 rates. */
            double v[8];
            if (sscanf(line, "%lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4],
                       &v[5], &v[6], &v[7]) == 8)
                gbps = v[5] * 1048576.0 / 1e9;
        }
        pclose(p);
    }
    if (srv > 0) wait_child(srv, 5000);
    return gbps;
}

/* --- The command. --------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: kvfence bench handoff --transport tcp --page-bytes N [--pages P] [--runs R]\n"
        "                             [--rtt-iters K] [--no-reference]\n"
        "  Two processes over the fabric (TCP, sealed): page-handoff bandwidth (puts of data and\n"
        "  trailer, XXH3 per page checked by the target) and the one-page GRANT -> verified\n"
        "  commit round trip; compared with ucx_perftest -t ucp_put_bw (UCX_TLS=tcp).\n"
        "  N: data bytes per page (a multiple of 64, 4096..64 MiB); P: pages per run\n"
        "  (default 32 MiB of data, at least 8); R: runs (11); K: round trips (201).\n");
}

static int parse(int argc, char **argv, struct hb_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->runs = 11;
    o->rtt_iters = 201;
    o->reference = true;
    unsigned long v;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-reference") == 0) {
            o->reference = false;
            continue;
        }
        const char *opt, *val;
        int rc = kvf_bench_opt(argc, argv, &i, usage, &opt, &val);
        if (rc != 1) return rc == 0 ? -1 : rc;
        if (strcmp(opt, "--transport") == 0) {
            if (strcmp(val, "tcp") != 0) {
                fprintf(stderr,
                        "kvfence bench handoff: --transport tcp is the one measured here "
                        "(not '%s')\n",
                        val);
                return 2;
            }
        } else if (strcmp(opt, "--page-bytes") == 0) {
            if ((rc = kvf_bench_ulong_arg("handoff", opt, val, 64ul << 20, &v))) return rc;
            if (v < 4096 || v % 64) {
                fprintf(stderr, "kvfence bench handoff: --page-bytes is a multiple of 64, at "
                                "least 4096\n");
                return 2;
            }
            o->page_bytes = v;
        } else if (strcmp(opt, "--pages") == 0) {
            if ((rc = kvf_bench_ulong_arg("handoff", opt, val, HB_MAX_PAGES, &v))) return rc;
            o->pages = (uint32_t)v;
        } else if (strcmp(opt, "--runs") == 0) {
            if ((rc = kvf_bench_ulong_arg("handoff", opt, val, HB_MAX_RUNS, &v))) return rc;
            o->runs = (uint32_t)v;
        } else if (strcmp(opt, "--rtt-iters") == 0) {
            if ((rc = kvf_bench_ulong_arg("handoff", opt, val, HB_MAX_RTT, &v))) return rc;
            o->rtt_iters = (uint32_t)v;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!o->page_bytes) {
        usage(stderr);
        return 2;
    }
    if (!o->pages) {
        size_t p = (32ul << 20) / o->page_bytes;
        o->pages = p < 8 ? 8 : (uint32_t)p;
    }
    return 0;
}

int kvf_bench_handoff(int argc, char **argv)
{
    struct hb_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    size_t stride = stride_of(o.page_bytes);

    double ref_before = o.reference ? reference_gbps("ucp_put_bw", o.page_bytes) : -1;

    int port_pipe[2];
    if (pipe(port_pipe) < 0) return 1;
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
        close(port_pipe[1]);
        _exit(writer_main(&o, port_pipe[0]));
    }
    close(port_pipe[0]);

    int status = 1;
    struct target t;
    memset(&t, 0, sizeof(t));
    t.o = &o;
    double *bw = calloc(o.runs, sizeof(double)), *rtt = calloc(o.rtt_iters, sizeof(double));
    t.region = aligned_alloc(4096, ((size_t)o.pages * stride + 4095) & ~(size_t)4095);
    if (!bw || !rtt || !t.region) goto out_child;
    memset(t.region, 0, (size_t)o.pages * stride);
    struct kvf_xport_config cfg = {
        .listen_host = "127.0.0.1", .rma_base = t.region, .rma_bytes = (size_t)o.pages * stride};
    struct kvf_xport_events ev = {.ctx = &t,
                                  .on_accept = t_on_accept,
                                  .on_frame = t_on_frame,
                                  .on_remote_ready = t_on_ready,
                                  .on_error = t_on_error};
    char err[256] = "";
    if (kvf_xport_create(&cfg, &ev, &t.x, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence bench handoff: %s\n", err);
        goto out_child;
    }
    uint16_t port = kvf_xport_port(t.x);
    if (write(port_pipe[1], &port, sizeof(port)) != (ssize_t)sizeof(port)) goto out_xport;
    /* The writer is ready once its connection is accepted and it holds our key: the first
     * handoff (a warm-up) proves both. */
    uint64_t give_up = kvf_bench_now_ns() + (uint64_t)HB_WAIT_MS * 1000000u;
    while (!t.c && kvf_bench_now_ns() < give_up)
        loop_turn(t.x, 10);
    if (!t.c) {
        fprintf(stderr, "kvfence bench handoff: the writer did not connect\n");
        goto out_xport;
    }
    if (!t_handoff(&t, o.pages)) goto out_xport;
    for (uint32_t r = 0; r < o.runs; r++) {
        uint64_t ns = t_handoff(&t, o.pages);
        if (!ns) goto out_xport;
        bw[r] = (double)o.pages * (double)o.page_bytes / (double)ns;
    }
    for (uint32_t r = 0; r < o.rtt_iters; r++) {
        uint64_t ns = t_handoff(&t, 1);
        if (!ns) goto out_xport;
        rtt[r] = (double)ns / 1e3;
    }
    struct hb_frame q = {HB_QUIT, 0, 0, 0};
    kvf_conn_send(t.c, &q, sizeof(q));
    for (int i = 0; i < 20; i++)
        loop_turn(t.x, 1);
    status = 0;
out_xport:
    kvf_xport_destroy(t.x);
out_child:
    close(port_pipe[1]);
    wait_child(child, 5000);
    if (status != 0) {
        free(bw), free(rtt), free(t.region);
        return status;
    }

    double ref_after = o.reference ? reference_gbps("ucp_put_bw", o.page_bytes) : -1;
    double am_ref = o.reference ? reference_gbps("ucp_am_bw", o.page_bytes) : -1;
    double bw_min = bw[0], bw_max = bw[0];
    for (uint32_t r = 1; r < o.runs; r++) {
        if (bw[r] < bw_min) bw_min = bw[r];
        if (bw[r] > bw_max) bw_max = bw[r];
    }
    double gbps = kvf_bench_median(bw, (int)o.runs);
    double rtt_us = kvf_bench_median(rtt, (int)o.rtt_iters);
    double rtt_p90 = rtt[(size_t)(o.rtt_iters - 1) * 9 / 10];
    printf("handoff  page_bytes=%zu (+64 trailer, stride %zu)  pages=%u  runs=%u\n", o.page_bytes,
           stride, o.pages, o.runs);
    printf("bandwidth  median %.3f GB/s  (min %.3f, max %.3f; data bytes, checksummed and "
           "verified)\n",
           gbps, bw_min, bw_max);
    printf("round trip  median %.1f us  p90 %.1f us  (%u one-page GRANT -> verified commit)\n",
           rtt_us, rtt_p90, o.rtt_iters);
    if (o.reference && am_ref > 0)
        printf("context ucx_perftest ucp_am_bw UCX_TLS=tcp size=%zu gbps=%.3f ratio=%.2f (the "
               "primitive tcp page writes use)\n",
               o.page_bytes, am_ref, gbps / am_ref);
    if (o.reference) {
        double ref = ref_before > ref_after ? ref_before : ref_after;
        if (ref > 0)
            printf("reference ucx_perftest ucp_put_bw UCX_TLS=tcp size=%zu gbps=%.3f "
                   "(before %.3f, after %.3f) ratio=%.2f\n",
                   o.page_bytes, ref, ref_before, ref_after, gbps / ref);
        else
            printf("reference ucx_perftest ucp_put_bw UCX_TLS=tcp size=%zu unavailable "
                   "(ucx_perftest not found or failed) ratio=nan\n",
                   o.page_bytes);
    }
    printf("result bench=handoff transport=tcp page_bytes=%zu gbps=%.3f rtt_us=%.1f\n",
           o.page_bytes, gbps, rtt_us);
    free(bw), free(rtt), free(t.region);
    return 0;
}
