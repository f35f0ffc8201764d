/*
 * The option table (src/cli/cli_opt.c) on a table of its own with a row of every kind: where a
 * value comes from (def < env_alt < env < command line, a repeatable row accumulating), aliases,
 * bounds, flags from the environment, the environment skipped under --help, the required rule,
 * the positional, every usage error's exit status, the help naming every row's facts, and
 * kvf_cli_spec_check refusing malformed rows. Cases run forked (kvf_test.h), so setenv in one
 * never reaches another.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kvfence/common.h"
#include "kvf_test.h"

struct toy {
    const char *name, *word;
    bool loud;
    uint32_t n;
    uint64_t big, bytes;
    float f;
    struct kvf_cli_addr at;
    struct kvf_cli_addrs peers;
    char list[64];
};

static int add_item(const char *v, void *dst)
{
    char *l = dst;
    size_t used = strlen(l);
    if (!*v || used + strlen(v) + 2 > 64) return -1;
    snprintf(l + used, 64 - used, "%s%s", used ? "," : "", v);
    return 0;
}

#define O(f) offsetof(struct toy, f)
static const struct kvf_cli_opt toy_opts[] = {
    {.name = "--name",
     .metavar = "S",
     .kind = KVF_CLI_STR,
     .off = O(name),
     .def = "dflt",
     .env = "KVFENCE_NAME",
     .env_alt = "KVFENCE_NAME_OLD",
     .help = "a string"},
    {.name = "--loud",
     .kind = KVF_CLI_FLAG,
     .off = O(loud),
     .env = "KVFENCE_LOUD",
     .help = "a flag"},
    {.name = "--n",
     .alias = "--count",
     .metavar = "N",
     .kind = KVF_CLI_U32,
     .off = O(n),
     .lo = 2,
     .hi = 10,
     .def = "5",
     .env = "KVFENCE_N",
     .flags = KVF_CLI_REQUIRED,
     .help = "a number"},
    {.name = "--big",
     .metavar = "N",
     .kind = KVF_CLI_U64,
     .off = O(big),
     .lo = 0,
     .hi = UINT64_MAX,
     .help = "a big number"},
    {.name = "--bytes",
     .metavar = "SIZE",
     .kind = KVF_CLI_SIZE,
     .off = O(bytes),
     .def = "1G",
     .help = "a size"},
    {.name = "--f",
     .metavar = "F",
     .kind = KVF_CLI_FLOAT,
     .off = O(f),
     .flo = 0.5f,
     .fhi = 1.0f,
     .help = "a float"},
    {.name = "--at",
     .metavar = "HOST:PORT",
     .kind = KVF_CLI_ADDR,
     .off = O(at),
     .help = "an address"},
    {.name = "--peers",
     .metavar = "LIST",
     .kind = KVF_CLI_ADDRS,
     .off = O(peers),
     .help = "addresses"},
    {.name = "--item",
     .metavar = "X",
     .kind = KVF_CLI_FN,
     .off = O(list),
     .fn = add_item,
     .env = "KVFENCE_ITEM",
     .help = "repeatable"},
};
#undef O

static const struct kvf_cli_spec toy = {
    .name = "toy",
    .about = "A toy.\n",
    .opts = toy_opts,
    .n_opts = KVF_ARRAY_LEN(toy_opts),
    .opts_size = sizeof(struct toy),
    .positional = "WORD",
    .positional_off = offsetof(struct toy, word),
};

/* Parses the NULL-terminated words after "toy": the parser's result, *st its exit status. */
static int parse(struct toy *t, int *st, const char *const *words)
{
    char *argv[32] = {"toy"};
    int argc = 1;
    while (*words)
        argv[argc++] = (char *)*words++;
    memset(t, 0, sizeof *t);
    *st = -1;
    return kvf_cli_parse(&toy, argc, argv, t, st);
}
#define PARSE(t, st, ...) parse(t, st, (const char *const[]){__VA_ARGS__, NULL})

static void test_defaults_and_kinds(void)
{
    struct toy t;
    int st;
    ASSERT_OK(PARSE(&t, &st, "--n", "3"));
    ASSERT_STREQ(t.name, "dflt");
    ASSERT_EQ_U64(t.bytes, 1ull << 30);
    ASSERT_FALSE(t.loud);
    ASSERT_OK(PARSE(&t, &st, "w", "--count", "10", "--loud", "--big", "18446744073709551615",
                    "--bytes", "512M", "--f", "0.75", "--at", "[::1]:0", "--peers", "a:1,b:2",
                    "--item", "x", "--item", "y"));
    ASSERT_STREQ(t.word, "w");
    ASSERT_EQ_INT((int)t.n, 10);
    ASSERT_TRUE(t.loud);
    ASSERT_EQ_U64(t.big, UINT64_MAX);
    ASSERT_EQ_U64(t.bytes, 512ull << 20);
    ASSERT_NEAR(t.f, 0.75, 1e-6);
    ASSERT_STREQ(t.at.host, "::1");
    ASSERT_EQ_INT(t.at.port, 0);
    ASSERT_STREQ(t.at.text, "[::1]:0");
    ASSERT_EQ_INT((int)t.peers.n, 2);
    ASSERT_STREQ(t.peers.host[1], "b");
    ASSERT_EQ_INT(t.peers.port[1], 2);
    ASSERT_STREQ(t.list, "x,y");
}

static void test_usage_errors(void)
{
    struct toy t;
    int st;
    /* Each: -1 with exit status 2, and nothing of the command run. */
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "1"), -1); /* below lo */
    ASSERT_EQ_INT(st, 2);
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "11"), -1);
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "4x"), -1);
    ASSERT_EQ_INT(PARSE(&t, &st, "--n"), -1); /* needs a value */
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3", "--bogus", "1"), -1);
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3", "a", "b"), -1); /* one positional only */
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3", "--f", "0.25"), -1);
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3", "--at", "nocolon"), -1);
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3", "--peers", "a:0"), -1);
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3", "--item", ""), -1); /* the fn refuses */
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3", "--bytes", "-1G"), -1);
    ASSERT_EQ_INT(st, 2);
    /* --n is required: a def does not count as given. */
    ASSERT_EQ_INT(PARSE(&t, &st, "--loud"), -1);
    ASSERT_EQ_INT(st, 2);
}

static void test_environment(void)
{
    struct toy t;
    int st;
    setenv("KVFENCE_NAME_OLD", "old", 1);
    ASSERT_OK(PARSE(&t, &st, "--n", "3"));
    ASSERT_STREQ(t.name, "old"); /* env_alt over def */
    setenv("KVFENCE_NAME", "env", 1);
    ASSERT_OK(PARSE(&t, &st, "--n", "3"));
    ASSERT_STREQ(t.name, "env"); /* env over env_alt */
    ASSERT_OK(PARSE(&t, &st, "--n", "3", "--name", "cli"));
    ASSERT_STREQ(t.name, "cli"); /* the command line over both */
    setenv("KVFENCE_NAME_OLD", "", 1);
    unsetenv("KVFENCE_NAME");
    ASSERT_OK(PARSE(&t, &st, "--n", "3"));
    ASSERT_STREQ(t.name, "dflt"); /* an empty env_alt is not set */

    setenv("KVFENCE_N", "7", 1); /* a required option given by the environment */
    ASSERT_OK(PARSE(&t, &st, "--loud"));
    ASSERT_EQ_INT((int)t.n, 7);
    ASSERT_OK(PARSE(&t, &st, "--count", "9"));
    ASSERT_EQ_INT((int)t.n, 9);
    setenv("KVFENCE_N", "70", 1); /* out of bounds: refused even when the command line gives one */
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3"), -1);
    ASSERT_EQ_INT(st, 2);
    ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3", "--help"), -1); /* but never hides the help */
    ASSERT_EQ_INT(st, 0);
    unsetenv("KVFENCE_N");

    static const struct {
        const char *v;
        int rc;
        bool on;
    } flags[] = {{"1", 0, true},   {"true", 0, true},   {"YES", 0, true},     {"0", 0, false},
                 {"no", 0, false}, {"False", 0, false}, {"maybe", -1, false}, {"", -1, false}};
    for (size_t i = 0; i < KVF_ARRAY_LEN(flags); i++) {
        setenv("KVFENCE_LOUD", flags[i].v, 1);
        ASSERT_EQ_INT(PARSE(&t, &st, "--n", "3"), flags[i].rc);
        if (flags[i].rc == 0)
            ASSERT_EQ_INT(t.loud, flags[i].on);
        else
            ASSERT_EQ_INT(st, 2);
    }
    unsetenv("KVFENCE_LOUD");

    setenv("KVFENCE_ITEM", "e",
           1); /* a repeatable row: the environment's, then the command line's */
    ASSERT_OK(PARSE(&t, &st, "--n", "3", "--item", "c"));
    ASSERT_STREQ(t.list, "e,c");
}

static void test_help(void)
{
    struct toy t;
    int st;
    ASSERT_EQ_INT(PARSE(&t, &st, "-h"), -1);
    ASSERT_EQ_INT(st, 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ASSERT_NOT_NULL(f);
    kvf_cli_help(&toy, f);
    fclose(f);
    /* Wrapped: no line wider than 80 columns. */
    for (char *l = buf, *nl; *l; l = nl + 1) {
        nl = strchr(l, '\n');
        ASSERT_NOT_NULL(nl);
        ASSERT_LE_INT((int)(nl - l), 80);
    }
    /* The facts, read with the wrapping undone. */
    size_t k = 0;
    for (size_t i = 0; buf[i]; i++)
        if (!(buf[i] == ' ' || buf[i] == '\n') || (k && buf[k - 1] != ' '))
            buf[k++] = buf[i] == '\n' ? ' ' : buf[i];
    buf[k] = 0;
    ASSERT_NOT_NULL(strstr(buf, "usage: kvfence toy [WORD] --n N [options]"));
    ASSERT_NOT_NULL(strstr(buf, "[default dflt; env KVFENCE_NAME or KVFENCE_NAME_OLD]"));
    ASSERT_NOT_NULL(strstr(buf, "[default 5; also --count; env KVFENCE_N; required]"));
    for (size_t i = 0; i < toy.n_opts; i++)
        ASSERT_NOT_NULL(strstr(buf, toy.opts[i].name));
    free(buf);
}

static void test_spec_check(void)
{
    char why[256];
    ASSERT_TRUE(kvf_cli_spec_check(&toy, why, sizeof why));
    struct kvf_cli_opt bad[2] = {toy_opts[0], toy_opts[2]};
    struct kvf_cli_spec s = toy;
    s.opts = bad;
    s.n_opts = 2;
    ASSERT_TRUE(kvf_cli_spec_check(&s, why, sizeof why));
    bad[1].env = "KVFENCE_COUNT"; /* not spelled from the name */
    ASSERT_FALSE(kvf_cli_spec_check(&s, why, sizeof why));
    bad[1] = toy_opts[2];
    bad[1].def = "11"; /* a default beyond the bounds */
    ASSERT_FALSE(kvf_cli_spec_check(&s, why, sizeof why));
    bad[1] = toy_opts[2];
    bad[1].alias = "--name"; /* named twice */
    ASSERT_FALSE(kvf_cli_spec_check(&s, why, sizeof why));
    bad[1] = toy_opts[2];
    bad[1].off = sizeof(struct toy); /* beyond the struct */
    ASSERT_FALSE(kvf_cli_spec_check(&s, why, sizeof why));
    bad[1] = toy_opts[2];
    bad[1].metavar = NULL; /* a value without a metavar */
    ASSERT_FALSE(kvf_cli_spec_check(&s, why, sizeof why));
}

int main(int argc, char **argv)
{
    static const struct kvf_test_case cases[] = {
        KVF_CASE(test_defaults_and_kinds), KVF_CASE(test_usage_errors), KVF_CASE(test_environment),
        KVF_CASE(test_help), KVF_CASE(test_spec_check)};
    return KVF_TEST_MAIN(argc, argv, cases);
}
