/*
 * test_fence.c — the fence on the shipped transport code, between two real processes: a target
 * that registered memory and a writer that keeps putting into it.
 *
 * The hang case: the writer is SIGSTOPped with puts queued towards the target; the target fences
 * it (kvf_conn_close: the socket closed, nothing more read from it), reassigns its memory (fills it
 * with a canary, as a new owner's data), and the writer is SIGCONTed and keeps trying for 2 s while
 * the target keeps progressing. Not one byte of the writer may land: the canary must be intact.
 * Before the fence the writer's bytes must have landed (or the test would prove nothing).
 *
 * The kill case: SIGKILL the writer; the target hears of it (on_error) within a bound (the
 * kernel ends the dead process's stream), and a new writer process connects and writes.
 *
 * `test_fence writer HOST PORT` is the writer's side (the test runs itself).
 */
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdatomic.h>

#include "kvf_test.h"
#include "kvfence/transport.h"

#define REGION      (8u << 20)
#define CHUNK       (256u << 10)
#define WRITER_BYTE 0xAB
#define CANARY      0x5A

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static const char *target_host(void)
{
    const char *h = getenv("KVF_TEST_TARGET_HOST");
    return h && *h ? h : "127.0.0.1";
}

/* --- The writer process. ------------------------------------------------------------------- */

static int w_outstanding;
static bool w_failed;
static void w_done(void *arg, int status)
{
    (void)arg;
    (void)status;
    w_outstanding--;
}
static void w_error(void *ctx, kvf_conn_t *c, int err)
{
    (void)ctx, (void)c, (void)err;
    w_failed = true;
}

static int writer_main(const char *host, uint16_t port)
{
    char err[256] = "";
    kvf_xport_t *x;
    struct kvf_xport_config xc = {NULL, 0, 100, NULL, 0, NULL, NULL, NULL};
    struct kvf_xport_events ev = {NULL, NULL, NULL, NULL, w_error};
    if (kvf_xport_create(&xc, &ev, &x, err, sizeof(err)) < 0) {
        fprintf(stderr, "writer: %s\n", err);
        return 1;
    }
    kvf_conn_t *c;
    if (kvf_xport_connect(x, host, port, &c, err, sizeof(err)) < 0) {
        fprintf(stderr, "writer: %s\n", err);
        return 1;
    }
    uint8_t *src = malloc(CHUNK);
    memset(src, WRITER_BYTE, CHUNK);
    uint64_t until = now_ms() + 60000;
    uint32_t next = 0;
    /* Put forever (until killed, the connection fails, or a minute passes), at most 16 at once. */
    while (now_ms() < until && !w_failed) {
        kvf_xport_progress(x);
        if (!kvf_conn_remote_ready(c) || w_outstanding >= 16) {
            usleep(100);
            continue;
        }
        uint64_t off = (uint64_t)(next++ % (REGION / CHUNK)) * CHUNK;
        if (kvf_conn_put(c, src, CHUNK, off, w_done, NULL) == 0) w_outstanding++;
    }
    /* The connection failed (the target fenced us): keep the process alive a little, still
     * progressing, so any write it could still deliver would be delivered. */
    uint64_t linger = now_ms() + 3000;
    while (now_ms() < linger)
        kvf_xport_progress(x), usleep(1000);
    kvf_conn_close(c);
    kvf_xport_destroy(x);
    free(src);
    return 0;
}

/* --- The target. --------------------------------------------------------------------------- */

struct target {
    kvf_xport_t *x;
    uint8_t *mem;
    kvf_conn_t *conn;
    atomic_int errors;
};

static void t_accept(void *ctx, kvf_conn_t *c)
{
    ((struct target *)ctx)->conn = c;
}
static void t_error(void *ctx, kvf_conn_t *c, int err)
{
    (void)c, (void)err;
    ((struct target *)ctx)->errors++;
}

static void target_open(struct target *t)
{
    char err[256] = "";
    memset(t, 0, sizeof(*t));
    t->mem = aligned_alloc(4096, REGION);
    ASSERT_NOT_NULL(t->mem);
    memset(t->mem, 0, REGION);
    struct kvf_xport_config xc = {target_host(), 0, 100, t->mem, REGION, NULL, NULL, NULL};
    struct kvf_xport_events ev = {t, t_accept, NULL, NULL, t_error};
    if (kvf_xport_create(&xc, &ev, &t->x, err, sizeof(err)) < 0) KVF_FAIL("target: %s", err);
}

static pid_t spawn_writer(uint16_t port)
{
    char ps[16];
    snprintf(ps, sizeof(ps), "%u", port);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the test */
        /* KVF_TEST_WRITER_NETNS: the writer runs in that network namespace and reaches the
         * target at KVF_TEST_TARGET_HOST (the namespace test: two hosts on one machine). */
        const char *ns = getenv("KVF_TEST_WRITER_NETNS");
        char self[512];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 0] = 0;
        if (ns && *ns)
            execlp("ip", "ip", "netns", "exec", ns, self, "writer", target_host(), ps,
                   (char *)NULL);
        else
            execl(self, "test_fence", "writer", target_host(), ps, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void progress_for(struct target *t, uint64_t ms)
{
    uint64_t until = now_ms() + ms;
    while (now_ms() < until) {
        kvf_xport_progress(t->x);
        usleep(200);
    }
}

static size_t count_byte(const uint8_t *p, size_t n, uint8_t b)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == b;
    return k;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    kill(pid, SIGCONT);
    waitpid(pid, NULL, 0);
}

static void test_stopped_writer_fenced_lands_nothing(void)
{
    struct target t;
    target_open(&t);
    pid_t pid = spawn_writer(kvf_xport_port(t.x));
    /* Writes land while the target progresses. */
    uint64_t give_up = now_ms() + 10000;
    while (count_byte(t.mem, REGION, WRITER_BYTE) < REGION / 2 && now_ms() < give_up)
        progress_for(&t, 10);
    size_t landed = count_byte(t.mem, REGION, WRITER_BYTE);
    if (landed < REGION / 2) {
        reap(pid);
        KVF_FAIL(
            "the writer's puts did not land before the fence (%zu bytes): the test proves nothing",
            landed);
    }
    /* Stop progressing so puts queue at the writer, then stop the writer with them queued. */
    usleep(50000);
    kill(pid, SIGSTOP);
    usleep(20000);
    ASSERT_NOT_NULL(t.conn);
    kvf_conn_close(t.conn); /* the fence */
    t.conn = NULL;
    /* Reassign: a new owner's data fills the memory. */
    memset(t.mem, CANARY, REGION);
    kill(pid, SIGCONT);
    progress_for(&t, 2500);
    size_t intact = count_byte(t.mem, REGION, CANARY);
    reap(pid);
    kvf_xport_destroy(t.x);
    free(t.mem);
    ASSERT_EQ_U64(intact, REGION);
}

static void test_killed_writer_noticed_and_replaced(void)
{
    struct target t;
    target_open(&t);
    pid_t pid = spawn_writer(kvf_xport_port(t.x));
    uint64_t give_up = now_ms() + 10000;
    while (count_byte(t.mem, REGION, WRITER_BYTE) == 0 && now_ms() < give_up)
        progress_for(&t, 10);
    ASSERT_TRUE(count_byte(t.mem, REGION, WRITER_BYTE) > 0);
    kill(pid, SIGKILL);
    uint64_t t0 = now_ms();
    while (atomic_load(&t.errors) == 0 && now_ms() - t0 < 5000)
        progress_for(&t, 5);
    uint64_t noticed_ms = now_ms() - t0;
    waitpid(pid, NULL, 0);
    ASSERT_TRUE(atomic_load(&t.errors) > 0);
    printf("# the killed writer was noticed after %llu ms\n", (unsigned long long)noticed_ms);
    ASSERT_TRUE(noticed_ms < 2000);
    kvf_conn_close(t.conn);
    t.conn = NULL;
    /* A new writer connects and writes. */
    memset(t.mem, 0, REGION);
    pid = spawn_writer(kvf_xport_port(t.x));
    give_up = now_ms() + 10000;
    while (count_byte(t.mem, REGION, WRITER_BYTE) == 0 && now_ms() < give_up)
        progress_for(&t, 10);
    size_t landed = count_byte(t.mem, REGION, WRITER_BYTE);
    reap(pid);
    kvf_xport_destroy(t.x);
    free(t.mem);
    ASSERT_TRUE(landed > 0);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_stopped_writer_fenced_lands_nothing),
    KVF_CASE(test_killed_writer_noticed_and_replaced),
};

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "writer") == 0)
        return writer_main(argv[2], (uint16_t)atoi(argv[3]));
    return KVF_TEST_MAIN(argc, argv, cases);
}
