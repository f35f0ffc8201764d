/*
 * test_codec.c — the handoff codec: round trips of every message type, and a strict decoder that
 * refuses truncation, trailing bytes, unknown versions and types, oversized counts and counts
 * beyond the caller's room.
 */
#include "kvf_test.h"

#include "kvfence/proto.h"

#define CAP 64

static struct kvf_page_ref s_pages[CAP];
static uint64_t s_sums[CAP];
static uint32_t s_tokens[CAP];
static const struct kvf_msg_scratch scratch = {s_pages, CAP, s_sums, CAP, s_tokens, CAP};

static struct kvf_msg header(enum kvf_msg_type t)
{
    struct kvf_msg m;
    memset(&m, 0, sizeof(m));
    m.type = t;
    m.req = (kvf_req_id_t){0x1122334455667788ull, 0x99aabbccddeeff00ull};
    m.nonce = 0xfeedfacecafebeefull;
    m.epoch = 7;
    return m;
}

static long roundtrip(const struct kvf_msg *m, uint8_t *buf, size_t cap, struct kvf_msg *out)
{
    long n = kvf_msg_encode(m, buf, cap);
    ASSERT_OK(n);
    ASSERT_EQ_INT(n, kvf_msg_encoded_size(m));
    long k = kvf_msg_decode(buf, (size_t)n, out, &scratch);
    ASSERT_EQ_INT(k, n);
    ASSERT_EQ_INT(out->type, m->type);
    ASSERT_TRUE(kvf_req_id_eq(out->req, m->req));
    ASSERT_EQ_U64(out->nonce, m->nonce);
    ASSERT_EQ_INT(out->epoch, m->epoch);
    /* Re-encoding what decoded gives the same bytes. */
    uint8_t again[8192];
    ASSERT_EQ_INT(kvf_msg_encode(out, again, sizeof(again)), n);
    ASSERT_MEMEQ(again, buf, (size_t)n);
    return n;
}

static void test_roundtrip_every_type(void)
{
    uint8_t buf[8192];
    struct kvf_msg out;

    struct kvf_msg h = header(KVF_MSG_HELLO);
    h.u.hello = (struct kvf_msg_hello){.model_fp = 42,
                                       .geo = {2, 2, 8, 16, 4},
                                       .max_context = 4096,
                                       .max_grant_pages = 256,
                                       .peer = 3,
                                       .role = KVF_ROLE_PREFILL};
    roundtrip(&h, buf, sizeof(buf), &out);
    ASSERT_EQ_U64(out.u.hello.model_fp, 42);
    ASSERT_EQ_INT(out.u.hello.geo.page_tokens, 16);
    ASSERT_EQ_INT(out.u.hello.peer, 3);
    ASSERT_EQ_INT(out.u.hello.role, KVF_ROLE_PREFILL);

    uint32_t toks[5] = {1, 2, 3, 0xffffffffu, 5};
    struct kvf_msg n = header(KVF_MSG_NEW);
    n.u.nreq = (struct kvf_msg_new){
        .tenant = 9, .prompt_len = 5, .max_tokens = 100, .n_tokens = 5, .tokens = toks};
    roundtrip(&n, buf, sizeof(buf), &out);
    ASSERT_EQ_INT(out.u.nreq.n_tokens, 5);
    ASSERT_EQ_INT(out.u.nreq.tokens[3], 0xffffffffu);

    struct kvf_page_ref pages[3] = {{1, 100}, {7, 0xffffffffffffffffull}, {0xffffffffu, 1}};
    struct kvf_msg g = header(KVF_MSG_GRANT);
    g.u.grant = (struct kvf_msg_grant){.tenant = 1,
                                       .expected_tokens = 40,
                                       .n_pages = 3,
                                       .pages = pages,
                                       .n_tokens = 5,
                                       .tokens = toks};
    roundtrip(&g, buf, sizeof(buf), &out);
    ASSERT_EQ_INT(out.u.grant.n_pages, 3);
    ASSERT_EQ_U64(out.u.grant.pages[1].tag, 0xffffffffffffffffull);
    ASSERT_EQ_INT(out.u.grant.pages[2].page, 0xffffffffu);
    /* The grammar travels as its bytes, between the bias pairs and the pages. */
    g.u.grant.sampling.grammar = "root ::= [a-z]+";
    g.u.grant.sampling.n_grammar = 15;
    g.u.grant.sampling.n_logit_bias = 1;
    g.u.grant.sampling.logit_bias[0] = (struct kvf_logit_bias){9, 1.5f};
    roundtrip(&g, buf, sizeof(buf), &out);
    ASSERT_EQ_INT(out.u.grant.sampling.n_grammar, 15);
    ASSERT_TRUE(memcmp(out.u.grant.sampling.grammar, "root ::= [a-z]+", 15) == 0);
    ASSERT_EQ_U64(out.u.grant.pages[1].tag, 0xffffffffffffffffull);
    ASSERT_EQ_INT(out.u.grant.tokens[4], toks[4]);
    g.u.grant.sampling.n_grammar = KVF_GEN_MAX_GRAMMAR + 1; /* beyond the bound: not encoded */
    ASSERT_TRUE(kvf_msg_encode(&g, buf, sizeof(buf)) < 0);
    g.u.grant.sampling = (struct kvf_msg_sampling){0};

    uint64_t sums[3] = {1, 2, 0x8000000000000000ull};
    struct kvf_msg d = header(KVF_MSG_DONE);
    d.u.done = (struct kvf_msg_done){
        .tokens_written = 40, .first_token = 77, .n_pages = 3, .checksums = sums};
    roundtrip(&d, buf, sizeof(buf), &out);
    ASSERT_EQ_U64(out.u.done.checksums[2], 0x8000000000000000ull);
    ASSERT_EQ_INT(out.u.done.first_token, 77);

    enum kvf_msg_type rt[] = {KVF_MSG_CANCEL, KVF_MSG_CANCEL_ACK, KVF_MSG_REJECT, KVF_MSG_FAIL};
    for (size_t i = 0; i < KVF_ARRAY_LEN(rt); i++) {
        struct kvf_msg r = header(rt[i]);
        r.u.reason = rt[i] == KVF_MSG_CANCEL_ACK ? 0 : KVF_E_PROTO_CANCELLED;
        ASSERT_EQ_INT(roundtrip(&r, buf, sizeof(buf), &out), KVF_PROTO_HEADER_BYTES + 4);
        ASSERT_EQ_INT(out.u.reason, r.u.reason);
    }
}

/* The wire is little-endian whatever the host: the header's first bytes are fixed. */
static void test_wire_layout(void)
{
    uint8_t buf[128];
    struct kvf_msg m = header(KVF_MSG_CANCEL);
    m.u.reason = -1;
    ASSERT_EQ_INT(kvf_msg_encode(&m, buf, sizeof(buf)), 44);
    const uint8_t want[12] = {
        KVF_PROTO_VERSION, 0, KVF_MSG_CANCEL, 0, 44, 0, 0, 0, 0x88, 0x77, 0x66, 0x55};
    ASSERT_MEMEQ(buf, want, sizeof(want));
    uint32_t len = 0;
    ASSERT_OK(kvf_msg_frame_len(buf, 44, &len));
    ASSERT_EQ_INT(len, 44);
}

static void test_truncated_and_trailing(void)
{
    uint8_t buf[512];
    uint64_t sums[4] = {1, 2, 3, 4};
    struct kvf_msg d = header(KVF_MSG_DONE);
    d.u.done = (struct kvf_msg_done){.tokens_written = 4, .n_pages = 4, .checksums = sums};
    long n = kvf_msg_encode(&d, buf, sizeof(buf));
    struct kvf_msg out;
    /* Every strict prefix is refused. */
    for (long k = 0; k < n; k++)
        ASSERT_ERR(kvf_msg_decode(buf, (size_t)k, &out, &scratch), KVF_E_PROTO_SHORT);
    /* A declared length one longer than the body (trailing garbage inside the frame) is refused. */
    buf[n] = 0;
    buf[4]++;
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n + 1, &out, &scratch), KVF_E_PROTO_BOUNDS);
    buf[4]--;
    /* Bytes after the frame belong to the next frame: not consumed, not an error. */
    ASSERT_EQ_INT(kvf_msg_decode(buf, (size_t)n + 1, &out, &scratch), n);
}

static void test_refuses_bad_header(void)
{
    uint8_t buf[128];
    struct kvf_msg m = header(KVF_MSG_CANCEL_ACK);
    long n = kvf_msg_encode(&m, buf, sizeof(buf));
    struct kvf_msg out;
    buf[0] = KVF_PROTO_VERSION + 1; /* a version from the future */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_VERSION);
    buf[0] = KVF_PROTO_VERSION - 1; /* the version before logit_bias, min_p and the penalties */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_VERSION);
    buf[0] = KVF_PROTO_VERSION;
    buf[2] = 0; /* type 0 */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_TYPE);
    buf[2] = KVF_MSG__END;
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_TYPE);
    buf[2] = KVF_MSG_CANCEL_ACK;
    buf[3] = 1; /* flags */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_BOUNDS);
    buf[3] = 0;
    buf[36] = 1; /* reserved */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_BOUNDS);
    buf[36] = 0;
    buf[40] = 1; /* a positive reason */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_BOUNDS);
    buf[40] = 0;
    ASSERT_EQ_INT(kvf_msg_decode(buf, (size_t)n, &out, NULL), n);
    /* A declared length below the header or above the maximum. */
    buf[4] = 39;
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_BOUNDS);
    buf[4] = 0xff, buf[5] = 0xff, buf[6] = 0xff, buf[7] = 0x7f;
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_BOUNDS);
}

/* A count is checked against the protocol bound and the caller's room before anything is read,
 * so a peer cannot make the reader allocate or overrun: a GRANT claiming 2^32-1 pages in a
 * 60-byte frame is refused. */
static void test_counts_bounded(void)
{
    uint8_t buf[8192];
    struct kvf_page_ref pages[CAP + 1];
    for (uint32_t i = 0; i <= CAP; i++)
        pages[i] = (struct kvf_page_ref){i, i + 1};
    struct kvf_msg g = header(KVF_MSG_GRANT);
    g.u.grant = (struct kvf_msg_grant){.expected_tokens = 1, .n_pages = CAP + 1, .pages = pages};
    long n = kvf_msg_encode(&g, buf, sizeof(buf));
    ASSERT_OK(n);
    struct kvf_msg out;
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, &scratch), KVF_E_PROTO_BOUNDS); /* room */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, NULL), KVF_E_PROTO_BOUNDS);

    g.u.grant.n_pages = 1;
    n = kvf_msg_encode(&g, buf, sizeof(buf));
    buf[48] = 0xff, buf[49] = 0xff, buf[50] = 0xff, buf[51] = 0xff; /* n_pages = 2^32-1 */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)n, &out, &scratch), KVF_E_PROTO_BOUNDS);

    /* The encoder refuses what the decoder would refuse. */
    g.u.grant.n_pages = KVF_PROTO_MAX_PAGES + 1;
    ASSERT_ERR(kvf_msg_encoded_size(&g), KVF_E_PROTO_BOUNDS);
    g.u.grant.n_pages = 2;
    g.u.grant.pages = NULL;
    ASSERT_ERR(kvf_msg_encoded_size(&g), KVF_E_PROTO_BOUNDS);
    struct kvf_msg bad = header((enum kvf_msg_type)99);
    ASSERT_ERR(kvf_msg_encoded_size(&bad), KVF_E_PROTO_TYPE);
}

static void test_encode_no_room_changes_nothing(void)
{
    uint8_t buf[64];
    memset(buf, 0xab, sizeof(buf));
    struct kvf_msg m = header(KVF_MSG_CANCEL);
    ASSERT_ERR(kvf_msg_encode(&m, buf, 43), -ENOSPC);
    for (size_t i = 0; i < sizeof(buf); i++)
        ASSERT_EQ_INT(buf[i], 0xab);
}

/* H7: a connection forms only when fingerprint, geometry and context limit agree. */
static void test_hello_check(void)
{
    struct kvf_msg_hello a = {.model_fp = 1,
                              .geo = {2, 2, 8, 16, 4},
                              .max_context = 4096,
                              .max_grant_pages = 256,
                              .peer = 0,
                              .role = KVF_ROLE_DECODE};
    struct kvf_msg_hello b = a;
    b.peer = 5;
    b.role = KVF_ROLE_PREFILL;
    ASSERT_OK(kvf_proto_hello_check(&a, &b));
    b.model_fp = 2;
    ASSERT_ERR(kvf_proto_hello_check(&a, &b), KVF_E_PROTO_MISMATCH);
    b = a;
    b.geo.page_tokens = 32;
    ASSERT_ERR(kvf_proto_hello_check(&a, &b), KVF_E_PROTO_MISMATCH);
    b = a;
    b.max_context = 8192;
    ASSERT_ERR(kvf_proto_hello_check(&a, &b), KVF_E_PROTO_MISMATCH);
}

/* Random bytes and random single-byte mutations of valid frames never crash the decoder, and
 * whatever decodes re-encodes to the same bytes. */
static void test_random_mutations(void)
{
    struct kvf_rng rng;
    kvf_rng_seed(&rng, kvf_test_seed());
    uint8_t buf[8192], again[8192];
    uint64_t sums[8] = {0};
    struct kvf_page_ref pages[8] = {{0, 1}};
    for (int iter = 0; iter < 20000; iter++) {
        struct kvf_msg m = header((enum kvf_msg_type)(1 + kvf_rng_below(&rng, KVF_MSG__END - 1)));
        m.u.grant.n_pages = 0;
        if (m.type == KVF_MSG_GRANT) {
            m.u.grant.n_pages = kvf_rng_below(&rng, 8);
            m.u.grant.pages = pages;
        } else if (m.type == KVF_MSG_DONE) {
            m.u.done.n_pages = kvf_rng_below(&rng, 8);
            m.u.done.checksums = sums;
        } else if (m.type == KVF_MSG_HELLO) {
            m.u.hello.role = KVF_ROLE_DECODE;
        } else if (m.type == KVF_MSG_NEW) {
            m.u.nreq.n_tokens = 0;
        } else {
            m.u.reason = 0;
        }
        long n = kvf_msg_encode(&m, buf, sizeof(buf));
        ASSERT_OK(n);
        int flips = 1 + (int)kvf_rng_below(&rng, 3);
        for (int f = 0; f < flips; f++)
            buf[kvf_rng_below(&rng, (uint32_t)n)] ^= (uint8_t)(1u << kvf_rng_below(&rng, 8));
        size_t len = (size_t)n - kvf_rng_below(&rng, 2);
        struct kvf_msg out;
        long k = kvf_msg_decode(buf, len, &out, &scratch);
        if (k > 0) {
            ASSERT_EQ_INT(kvf_msg_encode(&out, again, sizeof(again)), k);
            ASSERT_MEMEQ(again, buf, (size_t)k);
        }
    }
}

/* The logit_bias pairs and the shaping fields: carried bit for bit; pairs out of order, a bias
 * beyond ±100, a penalty out of range or a count past the bound are refused. */
static void test_sampling_shaping(void)
{
    uint8_t buf[8192];
    uint32_t toks[2] = {5, 6};
    struct kvf_msg n = header(KVF_MSG_NEW), out;
    n.u.nreq =
        (struct kvf_msg_new){.prompt_len = 2, .max_tokens = 3, .n_tokens = 2, .tokens = toks};
    struct kvf_msg_sampling *s = &n.u.nreq.sampling;
    *s = (struct kvf_msg_sampling){.top_p = 1.0f,
                                   .min_p = 0.25f,
                                   .presence_penalty = -2.0f,
                                   .frequency_penalty = 1.5f,
                                   .repetition_penalty = 1.1f,
                                   .n_logit_bias = 2,
                                   .logit_bias = {{3, -100.0f}, {70000, 2.5f}}};
    long len = roundtrip(&n, buf, sizeof buf, &out);
    ASSERT_EQ_INT(len,
                  KVF_PROTO_HEADER_BYTES + 16 + KVF_PROTO_SAMPLING_FIXED_BYTES + 2 * 8 + 2 * 4);
    ASSERT_MEMEQ(&out.u.nreq.sampling.min_p, &s->min_p, 4 * sizeof(float));
    ASSERT_EQ_INT(out.u.nreq.sampling.n_logit_bias, 2);
    ASSERT_MEMEQ(out.u.nreq.sampling.logit_bias, s->logit_bias, 2 * sizeof s->logit_bias[0]);
    ASSERT_EQ_INT(out.u.nreq.tokens[1], 6);
    /* Each refusal, made by hand in the bytes: the pairs start right after the fixed part. */
    uint8_t *pairs = buf + KVF_PROTO_HEADER_BYTES + 16 + KVF_PROTO_SAMPLING_FIXED_BYTES;
    memcpy(pairs + 8, pairs, 4); /* the second id equals the first */
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)len, &out, &scratch), KVF_E_PROTO_BOUNDS);
    roundtrip(&n, buf, sizeof buf, &out);
    s->logit_bias[1].bias = 100.5f;
    ASSERT_OK(kvf_msg_encode(&n, buf, sizeof buf));
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)len, &out, &scratch), KVF_E_PROTO_BOUNDS);
    s->logit_bias[1].bias = 2.5f;
    s->presence_penalty = -2.5f;
    ASSERT_OK(kvf_msg_encode(&n, buf, sizeof buf));
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)len, &out, &scratch), KVF_E_PROTO_BOUNDS);
    s->presence_penalty = 0.0f;
    s->min_p = 1.5f;
    ASSERT_OK(kvf_msg_encode(&n, buf, sizeof buf));
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)len, &out, &scratch), KVF_E_PROTO_BOUNDS);
    s->min_p = 0.0f;
    /* A count the frame does not hold, and one past the bound. */
    ASSERT_OK(kvf_msg_encode(&n, buf, sizeof buf));
    buf[KVF_PROTO_HEADER_BYTES + 16 + 40] = 3;
    ASSERT_ERR(kvf_msg_decode(buf, (size_t)len, &out, &scratch), KVF_E_PROTO_BOUNDS);
    s->n_logit_bias = KVF_GEN_MAX_LOGIT_BIAS + 1;
    ASSERT_ERR(kvf_msg_encoded_size(&n), KVF_E_PROTO_BOUNDS);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_roundtrip_every_type),
    KVF_CASE(test_sampling_shaping),
    KVF_CASE(test_wire_layout),
    KVF_CASE(test_truncated_and_trailing),
    KVF_CASE(test_refuses_bad_header),
    KVF_CASE(test_counts_bounded),
    KVF_CASE(test_encode_no_room_changes_nothing),
    KVF_CASE(test_hello_check),
    KVF_CASE(test_random_mutations),
};

/* `test_codec --write-corpus DIR` writes the fuzz seed corpus (tests/fuzz/corpus/proto): one
 * valid frame of every type, a stream of two frames, and a few refusals near each bound. */
static void write_file(const char *dir, const char *name, const uint8_t *b, size_t n)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) KVF_FAIL("cannot write %s", path);
    fclose(f);
}

static int write_corpus(const char *dir)
{
    uint8_t buf[8192];
    uint32_t toks[3] = {11, 12, 13};
    struct kvf_page_ref pages[2] = {{3, 0x100}, {4, 0x101}};
    uint64_t sums[2] = {0xabcdef, 0x123456};
    struct kvf_msg m[8];
    for (int i = 0; i < 8; i++)
        m[i] = header((enum kvf_msg_type)(i + 1));
    m[0].u.hello = (struct kvf_msg_hello){7, {1, 1, 2, 4, 4}, 64, 8, 1, KVF_ROLE_PREFILL};
    m[1].u.nreq = (struct kvf_msg_new){1,
                                       3,
                                       5,
                                       3,
                                       toks,
                                       {.temperature = 0.5f,
                                        .top_p = 0.9f,
                                        .top_k = 40,
                                        .n_logprobs = 2,
                                        .seed = 7,
                                        .want_logprob = true,
                                        .min_p = 0.05f,
                                        .presence_penalty = 0.5f,
                                        .repetition_penalty = 1.2f,
                                        .n_logit_bias = 1,
                                        .logit_bias = {{3, -100.0f}}}};
    m[2].u.grant = (struct kvf_msg_grant){1,
                                          7,
                                          2,
                                          pages,
                                          3,
                                          toks,
                                          {.temperature = 0.5f,
                                           .top_p = 0.9f,
                                           .top_k = 40,
                                           .n_logprobs = 2,
                                           .seed = 7,
                                           .want_logprob = true,
                                           .min_p = 0.05f,
                                           .presence_penalty = 0.5f,
                                           .repetition_penalty = 1.2f,
                                           .n_logit_bias = 1,
                                           .logit_bias = {{3, -100.0f}}}};
    m[3].u.done = (struct kvf_msg_done){7, 99, 2, sums, -0.25f, 1, {99}, {-0.25f}};
    m[4].u.reason = KVF_E_PROTO_CANCELLED;
    m[5].u.reason = 0;
    m[6].u.reason = KVF_E_PROTO_REJECTED;
    m[7].u.reason = KVF_E_PROTO_FAILED;
    size_t stream = 0;
    uint8_t two[16384];
    for (int i = 0; i < 8; i++) {
        long n = kvf_msg_encode(&m[i], buf, sizeof(buf));
        if (n < 0) return 1;
        char name[64];
        snprintf(name, sizeof(name), "%s", kvf_msg_type_name(m[i].type) + 8);
        write_file(dir, name, buf, (size_t)n);
        if (i == 2 || i == 3) {
            memcpy(two + stream, buf, (size_t)n);
            stream += (size_t)n;
        }
        if (i == 2) {
            buf[48] = 0xff; /* n_pages beyond the frame */
            write_file(dir, "GRANT_bad_count", buf, (size_t)n);
            write_file(dir, "GRANT_truncated", buf, (size_t)n - 5);
        }
    }
    write_file(dir, "GRANT_DONE_stream", two, stream);

    /* Frames aimed at the machines fuzz_proto.c drives: its decode machine has request {1, 0}
     * granted to peer 1 with nonce 1 at epoch 1 (two pages); its prefill is at epoch 1. */
    struct kvf_msg aim[3];
    for (int i = 0; i < 3; i++) {
        memset(&aim[i], 0, sizeof(aim[i]));
        aim[i].req = (kvf_req_id_t){1, 0};
        aim[i].nonce = 1;
        aim[i].epoch = 1;
    }
    aim[0].type = KVF_MSG_DONE;
    aim[0].u.done = (struct kvf_msg_done){6, 5, 2, sums, 0.0f, 0, {0}, {0.0f}};
    aim[1].type = KVF_MSG_CANCEL_ACK;
    aim[2].type = KVF_MSG_GRANT;
    aim[2].u.grant = (struct kvf_msg_grant){1, 6, 2, pages, 0, NULL, {.top_p = 1.0f}};
    static const char *const aim_names[] = {"aim_DONE", "aim_CANCEL_ACK", "aim_GRANT"};
    size_t all = 0;
    for (int i = 0; i < 3; i++) {
        long n = kvf_msg_encode(&aim[i], buf, sizeof(buf));
        if (n < 0) return 1;
        write_file(dir, aim_names[i], buf, (size_t)n);
        memcpy(two + all, buf, (size_t)n);
        all += (size_t)n;
    }
    write_file(dir, "aim_stream", two, all);
    return 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--write-corpus") == 0) return write_corpus(argv[i + 1]);
    return KVF_TEST_MAIN(argc, argv, cases);
}
