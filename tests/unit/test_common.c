/* Tests of the shared pieces: error names, version, the default allocator, the log sink, the
 * harness's PRNG. */
#include "kvf_test.h"
#include "kvfence/common.h"

static void test_strerror_names_every_code(void)
{
    /* Every project code has its own name, distinct from the fallback. */
    static const int codes[] = {
        KVF_E_POOL_FULL,        KVF_E_POOL_BAD_PAGE,  KVF_E_POOL_STALE_TAG, KVF_E_POOL_NOT_HOLDER,
        KVF_E_POOL_DOUBLE_FREE, KVF_E_POOL_NOT_OWNED, KVF_E_POOL_NO_GRANT,  KVF_E_POOL_BAD_EPOCH,
        KVF_E_POOL_BAD_SLOT,    KVF_E_POOL_RESERVE,   KVF_E_POOL_BAD_STATE, KVF_E_POOL_BAD_ARG,
        KVF_E_POOL_FOREIGN,
    };
    for (size_t i = 0; i < KVF_ARRAY_LEN(codes); i++) {
        const char *s = kvf_strerror(codes[i]);
        ASSERT_NOT_NULL(s);
        ASSERT_TRUE(strcmp(s, "unknown error") != 0);
        for (size_t j = 0; j < i; j++)
            ASSERT_TRUE(strcmp(s, kvf_strerror(codes[j])) != 0);
    }
    ASSERT_STREQ(kvf_strerror(0), "success");
    ASSERT_STREQ(kvf_strerror(-ENOMEM), strerror(ENOMEM));
    ASSERT_STREQ(kvf_strerror(-99999), "unknown error");
    ASSERT_STREQ(kvf_strerror(5), "unknown error");
}

static void test_version(void)
{
    ASSERT_STREQ(kvf_version(), KVF_VERSION);
    ASSERT_TRUE(strchr(kvf_version(), '.') != NULL);
}

static void test_default_alloc_aligns(void)
{
    for (size_t align = 8; align <= 4096; align *= 2) {
        void *p = kvf_default_alloc.alloc(kvf_default_alloc.ctx, 100, align);
        ASSERT_NOT_NULL(p);
        ASSERT_EQ_INT((uintptr_t)p % align, 0);
        kvf_default_alloc.free(kvf_default_alloc.ctx, p, 100);
    }
}

struct log_seen {
    int n;
    enum kvf_log_level level;
    char line[2048];
};

static void log_capture(void *arg, enum kvf_log_level level, const char *line)
{
    struct log_seen *seen = arg;
    seen->n++;
    seen->level = level;
    snprintf(seen->line, sizeof seen->line, "%s", line);
}

static void test_log_goes_to_the_sink_set(void)
{
    struct log_seen seen = {0};
    kvf_log_set(log_capture, &seen);
    /* The line keeps its text, loses its trailing newline, and carries its level. */
    kvf_log(KVF_LOG_WARN, "kvfence decode: refusing a router: %s\n", "model fingerprint");
    ASSERT_EQ_INT(seen.n, 1);
    ASSERT_EQ_INT(seen.level, KVF_LOG_WARN);
    ASSERT_STREQ(seen.line, "kvfence decode: refusing a router: model fingerprint");
    /* The server's sink signature goes through the same sink. */
    kvf_log_line(NULL, "ts=x event=y");
    ASSERT_EQ_INT(seen.n, 2);
    ASSERT_EQ_INT(seen.level, KVF_LOG_INFO);
    ASSERT_STREQ(seen.line, "ts=x event=y");
    /* A long line is cut at 1023 bytes, not overrun. */
    char big[1500];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kvf_log(KVF_LOG_INFO, "%s", big);
    ASSERT_EQ_INT(seen.n, 3);
    ASSERT_EQ_INT((int)strlen(seen.line), 1023);
    /* NULL restores the default (stderr): the capture sees nothing more. */
    kvf_log_set(NULL, NULL);
    kvf_log(KVF_LOG_INFO, "test_common: this line goes to stderr");
    ASSERT_EQ_INT(seen.n, 3);
}

static void test_rng_replays(void)
{
    struct kvf_rng a, b;
    kvf_rng_seed(&a, 42);
    kvf_rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++)
        ASSERT_EQ_U64(kvf_rng_next(&a), kvf_rng_next(&b));
    kvf_rng_seed(&b, 43);
    ASSERT_NE_U64(kvf_rng_next(&a), kvf_rng_next(&b));
    for (int i = 0; i < 1000; i++)
        ASSERT_LT_INT(kvf_rng_below(&a, 7), 7);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_strerror_names_every_code),
    KVF_CASE(test_version),
    KVF_CASE(test_default_alloc_aligns),
    KVF_CASE(test_log_goes_to_the_sink_set),
    KVF_CASE(test_rng_replays),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
