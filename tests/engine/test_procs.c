/*
 * test_procs.c — the handoff between two real processes over the fabric (TCP): a `kvfence prefill`
 * process and a decode worker in this one. Every completed request's tokens must equal the same
 * request run alone (the decode verified count, trailers and checksums of every page it
 * committed); the decode pool must return to all free; faults end requests with clear errors.
 *
 *   soak   1,000 handoffs with random cancels and injected delays (put and frame delays in the
 *          prefill process)
 *   kill   SIGKILL the prefill mid-transfer: its requests fail within a second; the pages are
 *          freed by the fence; a restarted prefill (same address, new epoch) serves again
 *   hang   SIGSTOP the prefill with writes in flight: the grant timeout fails the requests, the
 *          hold timeout quarantines their pages and fences the peer, which frees them; SIGCONT:
 *          the decode reconnects and serves requests that reuse those pages, correctly
 *   key    a decode worker with another cluster key is refused by the prefill process (it never
 *          goes up, no grant is made); the prefill stays up and serves the right decode after
 *
 * The prefill runs with --cluster-key (a file this test writes) and the decode worker with the
 * same key, as a deployment across hosts does (the namespace test runs these on a veth pair).
 *
 * argv: the kvfence binary (CTest passes it).
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "engine_test_util.h"
#include "kvf_test.h"
#include "kvfence/engine.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"
#include "kvfence/transport.h"

#define PT  16u
#define CTX 256u

static const char *kvfence_bin;
static char key_path[64];                         /* the cluster key file the prefill reads */
static uint8_t cluster_key[KVF_FABRIC_KEY_BYTES]; /* the same key, for the decode worker */

/* Writes a fresh key file (0600) once per run. */
static void make_key(void)
{
    if (key_path[0]) return;
    uint8_t raw[32];
    char hex[65];
    ASSERT_OK(kvf_fabric_random(raw, sizeof raw));
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    snprintf(key_path, sizeof key_path, "/tmp/kvf_procs_key.%d", (int)getpid());
    int fd = open(key_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(fd >= 0);
    ASSERT_TRUE(write(fd, hex, 64) == 64);
    close(fd);
    ASSERT_OK(kvf_fabric_key_derive(hex, 64, cluster_key));
}

struct rig {
    char dir[64], path[128];
    kvf_gguf_t *g;
    kvf_model_t *m;
    uint64_t fp;
    uint16_t port;
    pid_t child;
    kvf_dworker_t *dw;
    uint32_t n_vocab;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Where the prefill listens and the decode connects: loopback, or KVF_TEST_PREFILL_HOST. */
static const char *prefill_host(void)
{
    const char *h = getenv("KVF_TEST_PREFILL_HOST");
    return h && *h ? h : "127.0.0.1";
}

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    ASSERT_OK(bind(fd, (struct sockaddr *)&a, sizeof(a)));
    ASSERT_OK(getsockname(fd, (struct sockaddr *)&a, &l));
    close(fd);
    return ntohs(a.sin_port);
}

/* Starts `kvfence prefill` with `faults` in KVF_FAULTS and waits for its "listening" line. */
static pid_t start_prefill(struct rig *r, const char *faults)
{
    int p[2];
    ASSERT_OK(pipe(p));
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        /* Dies with the test, whatever way the test ends. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(p[1], 1);
        close(p[0]);
        if (faults) setenv("KVF_FAULTS", faults, 1);
        setenv("KVF_POISON", "1", 1);
        char listen[96], ctx[16];
        snprintf(listen, sizeof(listen), "%s:%u", prefill_host(), r->port);
        snprintf(ctx, sizeof(ctx), "%u", CTX);
        /* KVF_TEST_PREFILL_NETNS: run the prefill in that network namespace (the namespace
         * test runs this one in another, joined by a veth pair: two hosts on one machine). */
        const char *ns = getenv("KVF_TEST_PREFILL_NETNS");
        if (ns && *ns)
            execlp("ip", "ip", "netns", "exec", ns, kvfence_bin, "prefill", "--model", r->path,
                   "--listen", listen, "--context-length", ctx, "--threads", "1", "--cluster-key",
                   key_path, (char *)NULL);
        else
            execl(kvfence_bin, "kvfence", "prefill", "--model", r->path, "--listen", listen,
                  "--context-length", ctx, "--threads", "1", "--cluster-key", key_path,
                  (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char line[128] = "";
    FILE *f = fdopen(p[0], "r");
    while (fgets(line, sizeof(line), f) && strncmp(line, "listening ", 10) != 0) {
    }
    if (strncmp(line, "listening ", 10) != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        KVF_FAIL("kvfence prefill did not start (said '%s')", line);
    }
    fclose(f);
    return pid;
}

static void stop_child(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGCONT);
    kill(pid, SIGTERM);
    for (int i = 0; i < 300; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void info(struct rig *r, struct kvf_engine_info *in)
{
    kvf_dworker_gen_ops.info(r->dw, in);
}

static bool wait_up(struct rig *r, uint64_t ms)
{
    uint64_t until = now_ms() + ms;
    struct kvf_engine_info in;
    do {
        info(r, &in);
        if (in.prefill_up) return true;
        usleep(5000);
    } while (now_ms() < until);
    return false;
}

/* The decode worker's admission wait (admit_timeout_ms) for the next rig_start. */
static uint64_t rig_admit_ms = 20000;

/* decode_key NULL: the prefill's key, and the decode worker must come up; else that key, and the
 * caller checks what becomes of it. */
static void rig_start_keyed(struct rig *r, const uint8_t *decode_key, const char *faults,
                            uint32_t decode_pages, uint64_t grant_ms, uint64_t hold_ms)
{
    char err[256] = "";
    memset(r, 0, sizeof(*r));
    make_key();
    snprintf(r->dir, sizeof(r->dir), "/tmp/kvf_procs_XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(r->dir));
    snprintf(r->path, sizeof(r->path), "%s/m.gguf", r->dir);
    if (kvf_mkmodel_write(r->path, kvf_mkmodel_shape_by_name("tiny"), KVF_GGML_F32, 3, err,
                          sizeof(err)) < 0)
        KVF_FAIL("mkmodel: %s", err);
    if (kvf_gguf_open(r->path, &r->g, err, sizeof(err)) < 0) KVF_FAIL("open: %s", err);
    if (kvf_model_load(r->g, &r->m, err, sizeof(err)) < 0) KVF_FAIL("load: %s", err);
    r->n_vocab = kvf_model_hparams(r->m)->n_vocab;
    int fd = open(r->path, O_RDONLY);
    struct stat st;
    fstat(fd, &st);
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    r->fp = XXH3_64bits(p, (size_t)st.st_size);
    munmap(p, (size_t)st.st_size);
    close(fd);
    r->port = free_port();
    r->child = start_prefill(r, faults);
    struct kvf_worker_config c = {
        .model = r->m,
        .model_fp = r->fp,
        .page_tokens = PT,
        .n_pages = decode_pages,
        .n_threads = 1,
        .max_context = CTX,
        .prefill_host = prefill_host(),
        .prefill_port = r->port,
        .max_batch = 16,
        .grant_timeout_ms = grant_ms,
        .hold_timeout_ms = hold_ms,
        .admit_timeout_ms = rig_admit_ms,
#if defined(KVF_TEST_BUILD)
        .poison_free = true,
#endif
        .keepalive_ms = 100,
        .fabric_key = decode_key ? decode_key : cluster_key
    };
    if (kvf_dworker_start(&c, &r->dw, err, sizeof(err)) < 0) KVF_FAIL("decode: %s", err);
    if (decode_key) return; /* the caller checks what becomes of it */
    if (!wait_up(r, 10000)) KVF_FAIL("the decode worker never connected to the prefill process");
}

static void rig_start(struct rig *r, const char *faults, uint32_t decode_pages, uint64_t grant_ms,
                      uint64_t hold_ms)
{
    rig_start_keyed(r, NULL, faults, decode_pages, grant_ms, hold_ms);
}

static void wait_pool_free(struct rig *r)
{
    struct kvf_engine_info in = {0};
    uint64_t until = now_ms() + 10000;
    do {
        info(r, &in);
        if (in.decode_free == in.decode_pages && in.running == 0 && in.decode_reserved == 0) break;
        usleep(10000);
    } while (now_ms() < until);
    ASSERT_EQ_INT(in.decode_free, in.decode_pages);
    ASSERT_EQ_INT(in.decode_reserved, 0);
}

static void rig_stop(struct rig *r)
{
    wait_pool_free(r);
    kvf_dworker_stop(r->dw, 1000);
    stop_child(r->child);
    kvf_model_free(r->m);
    kvf_gguf_close(r->g);
    unlink(r->path);
    rmdir(r->dir);
}

/* --- Requests and their solo answers. ------------------------------------------------------ */

struct req {
    int32_t prompt[64];
    struct kvf_gen_params p;
    kvf_gen_t *g;
    int32_t out[CTX];
    uint32_t n_out;
    int err;
    bool cancel_at_start;
    uint32_t cancel_after; /* tokens; 0 = never */
};

static void make_req(struct req *q, uint32_t seed, uint32_t n_vocab)
{
    memset(q, 0, sizeof(*q));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint32_t n = 1 + (uint32_t)(x % 60);
    q->prompt[0] = 1;
    for (uint32_t i = 1; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        q->prompt[i] = (int32_t)(3 + x % (n_vocab - 3));
    }
    q->p = (struct kvf_gen_params){
        .tenant = 1 + seed % 4,
        .prompt = q->prompt,
        .n_prompt = n,
        .max_tokens = 1 + (uint32_t)(x >> 20) % 8,
        .sample = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = seed}};
}

static void solo(struct rig *r, const struct kvf_gen_params *p, int32_t *out, uint32_t *n_out)
{
    *n_out = solo_run(r->m, PT, CTX, p, out, NULL, NULL);
}

/* Reads q's events to its END, cancelling when asked; returns the END's error. */
static void drain(struct rig *r, struct req *q)
{
    for (;;) {
        struct kvf_gen_event ev;
        if (!kvf_dworker_gen_ops.next(r->dw, q->g, &ev, 30000)) KVF_FAIL("no event within 30 s");
        if (ev.kind == KVF_GEN_END) {
            q->err = ev.err;
            break;
        }
        q->out[q->n_out++] = ev.token;
        if (q->cancel_after && q->n_out == q->cancel_after) kvf_dworker_gen_ops.cancel(r->dw, q->g);
    }
    kvf_dworker_gen_ops.release(r->dw, q->g);
}

static void check_against_solo(struct rig *r, const struct req *q)
{
    int32_t want[CTX];
    uint32_t n_want = 0;
    solo(r, &q->p, want, &n_want);
    if (q->err == 0) {
        ASSERT_EQ_INT(q->n_out, n_want);
    } else {
        ASSERT_TRUE(q->n_out <= n_want);
    }
    ASSERT_MEMEQ(q->out, want, q->n_out * sizeof(int32_t));
}

/* --- The cases. ---------------------------------------------------------------------------- */

static void test_soak_thousand_handoffs(void)
{
    struct rig r;
    rig_start(&r, "put_delay_ms=2,frame_delay_ms=1", 64, 10000, 30000);
    enum { TOTAL = 1000, WAVE = 16 };
    static struct req q[WAVE];
    uint64_t rng = kvf_test_seed() | 1;
    uint32_t done = 0, ok = 0, cancelled = 0;
    while (done < TOTAL) {
        for (int i = 0; i < WAVE; i++) {
            make_req(&q[i], done + (uint32_t)i, r.n_vocab);
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            uint32_t roll = (uint32_t)(rng % 10);
            q[i].cancel_at_start = roll == 0;
            q[i].cancel_after = roll == 1 ? 1 : 0;
            ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &q[i].p, &q[i].g));
            if (q[i].cancel_at_start) kvf_dworker_gen_ops.cancel(r.dw, q[i].g);
        }
        for (int i = 0; i < WAVE; i++) {
            drain(&r, &q[i]);
            if (q[i].err == 0) {
                ok++;
            } else {
                ASSERT_EQ_INT(q[i].err, KVF_E_PROTO_CANCELLED);
                ASSERT_TRUE(q[i].cancel_at_start || q[i].cancel_after);
                cancelled++;
            }
            /* Every tenth is checked token for token against the request run alone (the rest
             * passed the same verified handoff; the solo runs would dominate the time). */
            if ((done + (uint32_t)i) % 10 == 0 || q[i].err == 0) check_against_solo(&r, &q[i]);
        }
        done += WAVE;
    }
    struct kvf_engine_info in;
    info(&r, &in);
    printf("# %u handoffs: %u completed, %u cancelled; committed %llu, verify failures %llu\n",
           done, ok, cancelled, (unsigned long long)in.committed,
           (unsigned long long)in.verify_failed);
    ASSERT_EQ_U64(in.verify_failed, 0);
    /* The prefill process poisons freed pages (KVF_POISON): a tail sent unzeroed would carry an
     * earlier request's poison into a decode page. */
    ASSERT_EQ_U64(in.foreign_tails, 0);
    ASSERT_TRUE(ok > TOTAL / 2);
    rig_stop(&r);
}

static void test_kill_prefill_mid_transfer(void)
{
    struct rig r;
    /* Writes stay in flight 300 ms in the prefill process. */
    rig_start(&r, "put_delay_ms=300", 64, 10000, 30000);
    static struct req q[4];
    for (int i = 0; i < 4; i++) {
        make_req(&q[i], 500 + (uint32_t)i, r.n_vocab);
        ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &q[i].p, &q[i].g));
    }
    usleep(100000);
    uint64_t t0 = now_ms();
    kill(r.child, SIGKILL);
    waitpid(r.child, NULL, 0);
    r.child = 0;
    for (int i = 0; i < 4; i++) {
        drain(&r, &q[i]);
        ASSERT_EQ_INT(q[i].err, KVF_E_PROTO_PEER_DOWN);
    }
    uint64_t failed_ms = now_ms() - t0;
    printf("# requests failed %llu ms after the kill\n", (unsigned long long)failed_ms);
    ASSERT_TRUE(failed_ms < 1000);
    wait_pool_free(&r);
    struct kvf_engine_info in;
    info(&r, &in);
    ASSERT_TRUE(in.fences >= 1);
    /* A restarted prefill, same address: the decode reconnects at a new epoch and serves. */
    r.child = start_prefill(&r, NULL);
    ASSERT_TRUE(wait_up(&r, 10000));
    struct req again;
    make_req(&again, 777, r.n_vocab);
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &again.p, &again.g));
    drain(&r, &again);
    ASSERT_OK(again.err);
    check_against_solo(&r, &again);
    rig_stop(&r);
}

/* A request that waits out the admission bound says what it waited for: no prefill connected
 * (KVF_E_ENGINE_NO_PREFILL), or, with one connected, no pages (-EBUSY) — the HTTP server
 * answers them differently (no_prefill, pool_exhausted). */
static void test_admit_timeout_names_cause(void)
{
    struct rig r;
    rig_admit_ms = 500;
    /* 8 pages of PT tokens: one request of prompt + max_tokens = 8 × PT takes them all, and
     * holds them past the bound (its prefill's writes are 1.5 s late). */
    rig_start(&r, "put_delay_ms=1500", 8, 10000, 30000);
    rig_admit_ms = 20000;
    struct req big, small;
    make_req(&big, 41, r.n_vocab);
    big.p.max_tokens = 8 * PT - big.p.n_prompt;
    big.p.ignore_eos = true;
    make_req(&small, 42, r.n_vocab);
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &big.p, &big.g));
    struct kvf_engine_info in;
    uint64_t until = now_ms() + 10000;
    do {
        info(&r, &in);
        if (in.decode_free == in.decode_reserved) break; /* nothing left to admit with */
        usleep(2000);
    } while (now_ms() < until);
    ASSERT_EQ_INT(in.decode_free, in.decode_reserved);
    uint64_t t0 = now_ms();
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &small.p, &small.g));
    drain(&r, &small);
    printf("# pages short: %s after %llu ms\n", kvf_strerror(small.err),
           (unsigned long long)(now_ms() - t0));
    ASSERT_EQ_INT(small.err, -EBUSY);
    drain(&r, &big);
    ASSERT_OK(big.err);
    /* The prefill gone: a request waits the bound for one, then fails naming that. */
    kill(r.child, SIGKILL);
    waitpid(r.child, NULL, 0);
    r.child = 0;
    until = now_ms() + 10000;
    do {
        info(&r, &in);
        if (!in.prefill_up) break;
        usleep(5000);
    } while (now_ms() < until);
    ASSERT_FALSE(in.prefill_up);
    make_req(&small, 43, r.n_vocab);
    t0 = now_ms();
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &small.p, &small.g));
    drain(&r, &small);
    uint64_t waited = now_ms() - t0;
    printf("# no prefill: %s after %llu ms\n", kvf_strerror(small.err), (unsigned long long)waited);
    ASSERT_EQ_INT(small.err, KVF_E_ENGINE_NO_PREFILL);
    ASSERT_TRUE(waited >= 500 && waited < 5000);
    /* Back: served again. */
    r.child = start_prefill(&r, NULL);
    ASSERT_TRUE(wait_up(&r, 10000));
    make_req(&small, 44, r.n_vocab);
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &small.p, &small.g));
    drain(&r, &small);
    ASSERT_OK(small.err);
    check_against_solo(&r, &small);
    rig_stop(&r);
}

static void test_hang_prefill_past_hold_timeout(void)
{
    struct rig r;
    /* A small pool, so the requests after the hang reuse the pages of those it failed. */
    rig_start(&r, "put_delay_ms=200", 24, 3000, 500);
    static struct req q[4];
    for (int i = 0; i < 4; i++) {
        make_req(&q[i], 900 + (uint32_t)i, r.n_vocab);
        q[i].p.max_tokens = 2;
        ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &q[i].p, &q[i].g));
    }
    usleep(60000);
    kill(r.child, SIGSTOP);
    for (int i = 0; i < 4; i++) {
        drain(&r, &q[i]);
        ASSERT_TRUE(q[i].err == KVF_E_PROTO_TIMEOUT || q[i].err == 0);
    }
    /* Held, then quarantined at the hold timeout, then fenced: only the fence frees them. */
    wait_pool_free(&r);
    struct kvf_engine_info in;
    info(&r, &in);
    ASSERT_TRUE(in.quarantines >= 1);
    ASSERT_TRUE(in.fences >= 1);
    kill(r.child, SIGCONT);
    ASSERT_TRUE(wait_up(&r, 10000));
    /* The resumed writer's late puts had nowhere to land; new requests reuse the pages. */
    static struct req n[8];
    for (int i = 0; i < 8; i++) {
        make_req(&n[i], 1200 + (uint32_t)i, r.n_vocab);
        ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &n[i].p, &n[i].g));
    }
    for (int i = 0; i < 8; i++) {
        drain(&r, &n[i]);
        ASSERT_OK(n[i].err);
        check_against_solo(&r, &n[i]);
    }
    info(&r, &in);
    ASSERT_EQ_U64(in.verify_failed, 0);
    rig_stop(&r);
}

/* H17: the writer's flush never completes (its puts may or may not have landed). The request
 * fails with a clear error within the grant timeout; its pages are quarantined and freed only by
 * the fence — never on time alone — and the next request is served. */
static void test_lost_ack_ends_by_fence(void)
{
    struct rig r;
    rig_start(&r, "flush_never=1", 24, 1000, 500);
    struct req q;
    make_req(&q, 4242, r.n_vocab);
    uint64_t t0 = now_ms();
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &q.p, &q.g));
    drain(&r, &q);
    uint64_t failed_ms = now_ms() - t0;
    ASSERT_EQ_INT(q.err, KVF_E_PROTO_TIMEOUT);
    printf("# the request failed %llu ms after submit (grant timeout 1000 ms)\n",
           (unsigned long long)failed_ms);
    ASSERT_TRUE(failed_ms < 3000);
    struct kvf_engine_info in;
    info(&r, &in);
    ASSERT_TRUE(in.decode_free < in.decode_pages); /* held: no proof came */
    wait_pool_free(&r);
    info(&r, &in);
    ASSERT_TRUE(in.quarantines >= 1);
    ASSERT_TRUE(in.fences >= 1);
    ASSERT_TRUE(wait_up(&r, 10000));
    struct req next;
    make_req(&next, 4243, r.n_vocab);
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &next.p, &next.g));
    drain(&r, &next);
    ASSERT_OK(next.err);
    check_against_solo(&r, &next);
    rig_stop(&r);
}

/* A decode worker holding another key never gets past the prefill process's handshake: no
 * HELLO, so no grant and no prompt ever reaches that prefill; the process stays up, and a decode
 * worker with the right key is served by it at once. */
static void test_wrong_key_refused(void)
{
    static uint8_t wrong[KVF_FABRIC_KEY_BYTES];
    make_key();
    memcpy(wrong, cluster_key, sizeof wrong);
    wrong[0] ^= 1; /* one bit off */
    struct rig r;
    rig_start_keyed(&r, wrong, NULL, 24, 0, 0);
    ASSERT_TRUE(!wait_up(&r, 3000));
    struct kvf_engine_info in;
    info(&r, &in);
    ASSERT_EQ_INT(in.prefill_up, 0);
    ASSERT_EQ_INT(kill(r.child, 0), 0); /* the prefill process is still up */
    kvf_dworker_stop(r.dw, 0);
    /* The right key, against the same process. */
    struct kvf_worker_config c = {.model = r.m,
                                  .model_fp = r.fp,
                                  .page_tokens = PT,
                                  .n_pages = 24,
                                  .n_threads = 1,
                                  .max_context = CTX,
                                  .prefill_host = prefill_host(),
                                  .prefill_port = r.port,
                                  .max_batch = 16,
                                  .admit_timeout_ms = 20000,
                                  .keepalive_ms = 100,
                                  .fabric_key = cluster_key};
    char err[256] = "";
    if (kvf_dworker_start(&c, &r.dw, err, sizeof(err)) < 0) KVF_FAIL("decode: %s", err);
    ASSERT_TRUE(wait_up(&r, 10000));
    struct req ok;
    make_req(&ok, 78, r.n_vocab);
    ASSERT_OK(kvf_dworker_gen_ops.submit(r.dw, &ok.p, &ok.g));
    drain(&r, &ok);
    ASSERT_OK(ok.err);
    check_against_solo(&r, &ok);
    rig_stop(&r);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_wrong_key_refused),
    KVF_CASE(test_lost_ack_ends_by_fence),
    KVF_CASE(test_soak_thousand_handoffs),
    KVF_CASE(test_kill_prefill_mid_transfer),
    KVF_CASE(test_hang_prefill_past_hold_timeout),
    KVF_CASE(test_admit_timeout_names_cause),
};

int main(int argc, char **argv)
{
    kvfence_bin = getenv("KVFENCE_BIN");
    if (argc > 1 && argv[1][0] == '/') {
        kvfence_bin = argv[1];
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    if (!kvfence_bin) {
        fprintf(stderr, "usage: test_procs /path/to/kvfence [test options]\n");
        return 2;
    }
    int rc = KVF_TEST_MAIN(argc, argv, cases);
    if (key_path[0]) unlink(key_path);
    return rc;
}
