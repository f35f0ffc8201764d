/* Tests of kvfence/utf8.h: the one UTF-8 validator, against the cases the three it replaced
 * each named (the server's body scan, the tokenizer's input check and streaming detokenizer,
 * the NFC decoder), and against the fuzz targets' own check, written apart from it. */
#include "fuzz/fuzz_utf8.h"
#include "kvf_test.h"
#include "kvfence/utf8.h"

/* cp as UTF-8 into out (room for 4): the check that a decoded code point is the bytes'. */
static size_t encode(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) return out[0] = (uint8_t)cp, 1;
    size_t k = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const uint8_t mark[5] = {0, 0, 0xc0, 0xe0, 0xf0};
    for (size_t i = k - 1; i > 0; i--, cp >>= 6)
        out[i] = (uint8_t)(0x80 | (cp & 0x3f));
    out[0] = (uint8_t)(mark[k] | cp);
    return k;
}

/* s[0..n) against the fuzz targets' own check (written apart from this code): the same
 * verdict, and a sequence that is the whole of s decodes to the code point that encodes as s. */
static void against_oracle(const uint8_t *s, size_t n)
{
    bool ok = kvf_utf8_valid((const char *)s, n);
    if (ok != fuzz_utf8_valid(s, n, true))
        KVF_FAIL("%zu bytes %02x %02x %02x %02x: %d", n, s[0], n > 1 ? s[1] : 0, n > 2 ? s[2] : 0,
                 n > 3 ? s[3] : 0, ok);
    uint32_t cp = 0;
    size_t k = kvf_utf8_decode(s, n, &cp);
    if (k == n) {
        uint8_t back[4];
        if (encode(cp, back) != n || memcmp(back, s, n) != 0)
            KVF_FAIL("%zu bytes %02x..: decoded to U+%04X", n, s[0], cp);
    }
}

static void expect(const char *bytes, size_t n, size_t len, uint32_t cp)
{
    uint32_t got = 0xabcdef;
    size_t k = kvf_utf8_decode((const uint8_t *)bytes, n, &got);
    if (k != len)
        KVF_FAIL("sequence of %zu bytes (lead %02x): length %zu, expected %zu", n,
                 n ? (unsigned)(uint8_t)bytes[0] : 0u, k, len);
    ASSERT_EQ_INT(kvf_utf8_seq_len((const uint8_t *)bytes, n), len);
    ASSERT_EQ_U64(got, len ? cp : 0xabcdef); /* untouched when refused */
    ASSERT_TRUE(kvf_utf8_valid(bytes, n) == (len == n));
}

static void test_utf8_boundaries(void)
{
    expect("\x00", 1, 1, 0);
    expect("\x7f", 1, 1, 0x7f);
    expect("\xc2\x80", 2, 2, 0x80);
    expect("\xdf\xbf", 2, 2, 0x7ff);
    expect("\xe0\xa0\x80", 3, 3, 0x800);
    expect("\xed\x9f\xbf", 3, 3, 0xd7ff);
    expect("\xee\x80\x80", 3, 3, 0xe000);
    expect("\xef\xbf\xbf", 3, 3, 0xffff);
    expect("\xf0\x90\x80\x80", 4, 4, 0x10000);
    expect("\xf4\x8f\xbf\xbf", 4, 4, 0x10ffff);
}

static void test_utf8_refuses_ill_formed(void)
{
    expect("", 0, 0, 0);
    expect("\x80", 1, 0, 0); /* stray continuation */
    expect("\xbf", 1, 0, 0);
    expect("\xc0\x80", 2, 0, 0);     /* overlong NUL */
    expect("\xc1\xbf", 2, 0, 0);     /* overlong 2-byte */
    expect("\xe0\x80\x80", 3, 0, 0); /* overlong 3-byte */
    expect("\xe0\x9f\xbf", 3, 0, 0);
    expect("\xf0\x80\x80\x80", 4, 0, 0); /* overlong 4-byte */
    expect("\xf0\x8f\xbf\xbf", 4, 0, 0);
    expect("\xed\xa0\x80", 3, 0, 0);     /* U+D800 */
    expect("\xed\xbf\xbf", 3, 0, 0);     /* U+DFFF */
    expect("\xf4\x90\x80\x80", 4, 0, 0); /* U+110000 */
    expect("\xf5\x80\x80\x80", 4, 0, 0);
    expect("\xff", 1, 0, 0);
    expect("\xe2\x82", 2, 0, 0); /* cut short */
    expect("\xf0\x9f\x98", 3, 0, 0);
    expect("\xc3\x28", 2, 0, 0); /* bad continuation */
    expect("\xe2\x28\xa1", 3, 0, 0);
    expect("\xf0\x90\x28\xbc", 4, 0, 0);
}

static void test_utf8_valid_runs(void)
{
    ASSERT_TRUE(kvf_utf8_valid("", 0));
    ASSERT_TRUE(kvf_utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    ASSERT_TRUE(kvf_utf8_valid("a\0b", 3)); /* NUL is a character here */
    ASSERT_FALSE(kvf_utf8_valid("abc\xe2\x82", 5));
    ASSERT_FALSE(kvf_utf8_valid("\xe2\x82\xac\x80", 4));
    /* The length bounds the read: a valid prefix of a longer buffer. */
    ASSERT_TRUE(kvf_utf8_valid("ab\xe2\x82\xac", 2));
}

/* Every 1-, 2- and 3-byte string, and every 4-byte one with a lead that can start one (the
 * last byte at and either side of 80..BF's ends), agree with the oracle. */
static void test_utf8_matches_oracle_exhaustively(void)
{
    uint8_t s[4];
    for (uint32_t x = 0; x < (1u << 24); x++) {
        s[0] = (uint8_t)(x >> 16), s[1] = (uint8_t)(x >> 8), s[2] = (uint8_t)x;
        against_oracle(s, 3);
        if ((x & 0xff) == 0) against_oracle(s, 2);
        if ((x & 0xffff) == 0) against_oracle(s, 1);
    }
    static const uint8_t last[4] = {0x7f, 0x80, 0xbf, 0xc0}; /* around 80..BF */
    for (uint32_t x = 0; x < (5u << 18); x++) {
        s[0] = (uint8_t)(0xf0 + (x >> 18)), s[1] = (uint8_t)(x >> 10), s[2] = (uint8_t)(x >> 2);
        s[3] = last[x & 3];
        against_oracle(s, 4);
    }
}

/* The byte-at-a-time view agrees with the whole-sequence one. */
static void test_utf8_lead_and_second(void)
{
    for (unsigned lead = 0; lead < 256; lead++) {
        size_t k = kvf_utf8_lead_len((uint8_t)lead);
        ASSERT_TRUE(k <= 4);
        if (k < 2) continue;
        for (unsigned b = 0; b < 256; b++) {
            uint8_t s[4] = {(uint8_t)lead, (uint8_t)b, 0x80, 0x80};
            ASSERT_TRUE(kvf_utf8_second_ok((uint8_t)lead, (uint8_t)b) ==
                        (kvf_utf8_seq_len(s, k) == k));
        }
    }
    ASSERT_EQ_INT(kvf_utf8_lead_len(0x80), 0);
    ASSERT_EQ_INT(kvf_utf8_lead_len(0xc1), 0);
    ASSERT_EQ_INT(kvf_utf8_lead_len(0xc2), 2);
    ASSERT_EQ_INT(kvf_utf8_lead_len(0xf4), 4);
    ASSERT_EQ_INT(kvf_utf8_lead_len(0xf5), 0);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_utf8_boundaries),      KVF_CASE(test_utf8_refuses_ill_formed),
    KVF_CASE(test_utf8_valid_runs),      KVF_CASE(test_utf8_matches_oracle_exhaustively),
    KVF_CASE(test_utf8_lead_and_second),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
