/*
 * kvf_test.h — kvfence's in-tree test harness. Header only; no external framework.
 *
 * A test executable lists its cases and hands them to kvf_test_main():
 *
 *     static void test_alloc(void) { ASSERT_EQ_INT(kvf_pool_alloc(...), 0); }
 *     static const struct kvf_test_case cases[] = { KVF_CASE(test_alloc), ... };
 *     int main(int argc, char **argv) { return KVF_TEST_MAIN(argc, argv, cases); }
 *
 * Each case runs in a forked child with a timeout (KVF_TEST_TIMEOUT_S, default 300 s), so a
 * crash or a hang fails that case alone. Output is TAP ("1..N", "ok 1 - name") and closes with
 * "N passed, N failed". A failing assertion prints "# file:line: what" and ends the child.
 *
 * Command line:  [--no-fork] [--seed N] [--list] [name-substring ...]
 * --seed sets kvf_test_seed() (default: from the time, printed so a failure can be replayed).
 */
#ifndef KVF_TEST_H
#define KVF_TEST_H

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct kvf_test_case {
    const char *name;
    void (*fn)(void);
};

#define KVF_CASE(f)                                                                                \
    {                                                                                              \
#f, f                                                                                      \
    }

static uint64_t kvf_test__seed;
static bool kvf_test__seed_given;
static int kvf_test__argc;
static char **kvf_test__argv;

/* The seed for this run: from --seed, or from the clock (printed at start). */
static inline uint64_t kvf_test_seed(void)
{
    return kvf_test__seed;
}
static inline bool kvf_test_seed_given(void)
{
    return kvf_test__seed_given;
}

/* The value of "--name VALUE" on the command line, or NULL. */
static inline const char *kvf_test_arg(const char *name)
{
    for (int i = 1; i + 1 < kvf_test__argc; i++)
        if (strcmp(kvf_test__argv[i], name) == 0) return kvf_test__argv[i + 1];
    return NULL;
}

__attribute__((noreturn, format(printf, 3, 4))) static inline void
kvf_test__fail(const char *file, int line, const char *fmt, ...);

#include <stdarg.h>
static inline void kvf_test__fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stdout, "# %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fprintf(stdout, "\n");
    fflush(stdout);
    exit(1);
}

#define KVF_FAIL(...) kvf_test__fail(__FILE__, __LINE__, __VA_ARGS__)

#define ASSERT_TRUE(c)                                                                             \
    do {                                                                                           \
        if (!(c)) KVF_FAIL("assertion failed: %s", #c);                                            \
    } while (0)
#define ASSERT_FALSE(c) ASSERT_TRUE(!(c))

#define ASSERT_EQ_INT(a, b)                                                                        \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_) KVF_FAIL("%s == %s: %lld != %lld", #a, #b, a_, b_);                          \
    } while (0)
#define ASSERT_NE_INT(a, b)                                                                        \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ == b_) KVF_FAIL("%s != %s: both %lld", #a, #b, a_);                                 \
    } while (0)
#define ASSERT_LT_INT(a, b)                                                                        \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (!(a_ < b_)) KVF_FAIL("%s < %s: %lld >= %lld", #a, #b, a_, b_);                         \
    } while (0)
#define ASSERT_LE_INT(a, b)                                                                        \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (!(a_ <= b_)) KVF_FAIL("%s <= %s: %lld > %lld", #a, #b, a_, b_);                        \
    } while (0)
#define ASSERT_EQ_U64(a, b)                                                                        \
    do {                                                                                           \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                           \
        if (a_ != b_) KVF_FAIL("%s == %s: 0x%" PRIx64 " != 0x%" PRIx64, #a, #b, a_, b_);           \
    } while (0)
#define ASSERT_NE_U64(a, b)                                                                        \
    do {                                                                                           \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                           \
        if (a_ == b_) KVF_FAIL("%s != %s: both 0x%" PRIx64, #a, #b, a_);                           \
    } while (0)
#define ASSERT_EQ_PTR(a, b)                                                                        \
    do {                                                                                           \
        const void *a_ = (a), *b_ = (b);                                                           \
        if (a_ != b_) KVF_FAIL("%s == %s: %p != %p", #a, #b, a_, b_);                              \
    } while (0)
#define ASSERT_NOT_NULL(p)                                                                         \
    do {                                                                                           \
        if ((p) == NULL) KVF_FAIL("%s is NULL", #p);                                               \
    } while (0)
#define ASSERT_NULL(p)                                                                             \
    do {                                                                                           \
        if ((p) != NULL) KVF_FAIL("%s is not NULL", #p);                                           \
    } while (0)
#define ASSERT_STREQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)                                       \
            KVF_FAIL("%s == %s: \"%s\" != \"%s\"", #a, #b, a_ ? a_ : "(null)",                     \
                     b_ ? b_ : "(null)");                                                          \
    } while (0)
#define ASSERT_MEMEQ(a, b, n)                                                                      \
    do {                                                                                           \
        if (memcmp((a), (b), (n)) != 0)                                                            \
            KVF_FAIL("%s and %s differ in %zu bytes", #a, #b, (size_t)(n));                        \
    } while (0)
#define ASSERT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                             \
        if (!(fabs(a_ - b_) <= t_))                                                                \
            KVF_FAIL("%s ~= %s: %.9g vs %.9g (tol %.3g)", #a, #b, a_, b_, t_);                     \
    } while (0)
/* rc must be 0 (or a non-negative count). */
#define ASSERT_OK(rc)                                                                              \
    do {                                                                                           \
        long long r_ = (long long)(rc);                                                            \
        if (r_ < 0) KVF_FAIL("%s failed: %lld", #rc, r_);                                          \
    } while (0)
/* rc must be exactly the negative code `err`. */
#define ASSERT_ERR(rc, err)                                                                        \
    do {                                                                                           \
        long long r_ = (long long)(rc), e_ = (long long)(err);                                     \
        if (r_ != e_) KVF_FAIL("%s: expected error %s (%lld), got %lld", #rc, #err, e_, r_);       \
    } while (0)

static inline int kvf_test__run_one(const struct kvf_test_case *c, bool fork_it, int timeout_s)
{
    if (!fork_it) {
        c->fn();
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        alarm((unsigned)timeout_s);
        c->fn();
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {
    }
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) {
        printf("# %s: killed by signal %d%s\n", c->name, WTERMSIG(st),
               WTERMSIG(st) == SIGALRM ? " (timeout)" : "");
    }
    return 1;
}

static inline int kvf_test_main(int argc, char **argv, const struct kvf_test_case *cases, size_t n)
{
    bool fork_it = true, list = false;
    const char *filters[64];
    size_t n_filters = 0;
    kvf_test__argc = argc;
    kvf_test__argv = argv;
    kvf_test__seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-fork") == 0) {
            fork_it = false;
        } else if (strcmp(argv[i], "--list") == 0) {
            list = true;
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            kvf_test__seed = strtoull(argv[++i], NULL, 0);
            kvf_test__seed_given = true;
        } else if (strncmp(argv[i], "--", 2) == 0) {
            i++; /* an option of the test itself, read with kvf_test_arg() */
        } else if (n_filters < 64) {
            filters[n_filters++] = argv[i];
        }
    }
    if (list) {
        for (size_t i = 0; i < n; i++)
            printf("%s\n", cases[i].name);
        return 0;
    }
    const char *to = getenv("KVF_TEST_TIMEOUT_S");
    int timeout_s = to ? atoi(to) : 300;
    if (timeout_s <= 0) timeout_s = 300;

    bool run[n ? n : 1];
    size_t planned = 0;
    for (size_t i = 0; i < n; i++) {
        run[i] = n_filters == 0;
        for (size_t f = 0; f < n_filters; f++)
            if (strstr(cases[i].name, filters[f])) run[i] = true;
        planned += run[i];
    }
    printf("1..%zu\n# seed %" PRIu64 "\n", planned, kvf_test__seed);
    size_t passed = 0, failed = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!run[i]) continue;
        k++;
        int rc = kvf_test__run_one(&cases[i], fork_it, timeout_s);
        if (rc == 0) {
            passed++;
            printf("ok %zu - %s\n", k, cases[i].name);
        } else {
            failed++;
            printf("not ok %zu - %s\n", k, cases[i].name);
        }
        fflush(stdout);
    }
    printf("%zu passed, %zu failed\n", passed, failed);
    return failed == 0 && planned > 0 ? 0 : 1;
}

#define KVF_TEST_MAIN(argc, argv, cases)                                                           \
    kvf_test_main((argc), (argv), (cases), KVF_ARRAY_LEN(cases))
#ifndef KVF_ARRAY_LEN
#define KVF_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#endif

/* A small, fast, seedable PRNG for tests (splitmix64 seeding xoshiro256**). */
struct kvf_rng {
    uint64_t s[4];
};
static inline uint64_t kvf_rng__splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline void kvf_rng_seed(struct kvf_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = kvf_rng__splitmix(&seed);
}
static inline uint64_t kvf_rng_next(struct kvf_rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return res;
}
/* Uniform in [0, n), n > 0 (bias negligible for the small n tests use). */
static inline uint32_t kvf_rng_below(struct kvf_rng *r, uint32_t n)
{
    return (uint32_t)(((kvf_rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

#endif /* KVF_TEST_H */
