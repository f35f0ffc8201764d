/* Tests of kvfence/parse.h: the one number parser, with the cases each parser it replaced
 * handled (the CLI's u32 options, `run`'s options up to 2^64-1, the benchmarks' 1..most). */
#include "kvf_test.h"
#include "kvfence/parse.h"

#include <errno.h>

/* Parses s in [lo, hi] and checks the result code; on success the value, on failure that *out
 * is untouched. */
static void expect(const char *s, uint64_t lo, uint64_t hi, int rc, uint64_t want)
{
    uint64_t out = 0xdeadbeef;
    int got = kvf_parse_u64(s, lo, hi, &out);
    if (got != rc)
        KVF_FAIL("'%s' in [%" PRIu64 ", %" PRIu64 "]: rc %d, expected %d", s, lo, hi, got, rc);
    ASSERT_EQ_U64(out, rc == 0 ? want : 0xdeadbeef);
}

static void test_parse_takes_decimals_in_range(void)
{
    expect("0", 0, 10, 0, 0);
    expect("10", 0, 10, 0, 10);
    expect("007", 0, 10, 0, 7); /* decimal, never octal */
    expect("65535", 0, 65535, 0, 65535);
    expect("4294967295", 1, UINT32_MAX, 0, UINT32_MAX);
    expect("18446744073709551615", 0, UINT64_MAX, 0, UINT64_MAX);
}

static void test_parse_refuses_empty_and_junk(void)
{
    expect("", 0, 10, -EINVAL, 0);
    expect(" ", 0, 10, -EINVAL, 0);
    expect("+", 0, 10, -EINVAL, 0);
    expect("-", 0, 10, -EINVAL, 0);
    expect("x", 0, 10, -EINVAL, 0);
    expect("12x", 0, 100, -EINVAL, 0);
    expect("5 ", 0, 10, -EINVAL, 0); /* trailing white space is junk */
    expect("1.5", 0, 10, -EINVAL, 0);
    expect("0x10", 0, 100, -EINVAL, 0); /* base 10 only */
    expect("1e3", 0, 10000, -EINVAL, 0);
    expect("512M", 0, UINT64_MAX, -EINVAL, 0);
}

static void test_parse_refuses_overflow_and_range(void)
{
    expect("18446744073709551616", 0, UINT64_MAX, -ERANGE, 0); /* 2^64 */
    expect("99999999999999999999999", 0, UINT64_MAX, -ERANGE, 0);
    expect("4294967296", 0, UINT32_MAX, -ERANGE, 0);
    expect("11", 0, 10, -ERANGE, 0);
    expect("0", 1, 10, -ERANGE, 0); /* the benchmarks' lower bound of 1 */
    expect("99", 100, 3600000, -ERANGE, 0);
    expect("3600001", 100, 3600000, -ERANGE, 0);
    expect("3600000", 100, 3600000, 0, 3600000);
    expect("100", 100, 3600000, 0, 100);
}

/* What strtoull takes before the digits, every replaced parser took too (header comment). */
static void test_parse_keeps_strtoull_prefix(void)
{
    expect(" 5", 0, 10, 0, 5);
    expect("\t5", 0, 10, 0, 5);
    expect("+5", 0, 10, 0, 5);
    expect("-0", 0, 10, 0, 0);
    expect("-1", 0, UINT32_MAX, -ERANGE, 0); /* 2^64-1, beyond any bounded range */
    expect("-1", 0, UINT64_MAX, 0, UINT64_MAX);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_parse_takes_decimals_in_range),
    KVF_CASE(test_parse_refuses_empty_and_junk),
    KVF_CASE(test_parse_refuses_overflow_and_range),
    KVF_CASE(test_parse_keeps_strtoull_prefix),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
