/*
 * test_rpc.c — the router ↔ decode frames (src/engine/rpc.c): each type round-trips exactly;
 * every strict prefix and every frame with a byte more is refused; counts beyond their bound
 * (stop ids, top logprobs, prefills, a prompt beyond the reader's room) and malformed strings are
 * refused; a frame of another version or type is refused.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/rpc.h"
#include "kvf_test.h"

static uint8_t buf[1 << 16];
static int32_t room[64];
static struct kvf_rpc_hello hroom;
static struct kvf_rpc_status sroom;

/* Every prefix of frame[0..n) is refused; so is the frame with one byte more. */
static void only_whole(size_t n)
{
    struct kvf_rpc_msg m;
    for (size_t k = 0; k < n; k++)
        ASSERT_EQ_INT(kvf_rpc_decode(buf, k, &m, room, 64, &hroom, &sroom), -EBADMSG);
    buf[n] = 0;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, n + 1, &m, room, 64, &hroom, &sroom), -EBADMSG);
    ASSERT_EQ_INT(kvf_rpc_decode(buf, n, &m, room, 64, &hroom, &sroom), 0);
}

static void test_submit_round_trip(void)
{
    int32_t prompt[5] = {1, 2, 3, 40000, 7};
    struct kvf_gen_params p = {.tenant = 9,
                               .prompt = prompt,
                               .n_prompt = 5,
                               .max_tokens = 33,
                               .sample = {.temperature = 0.7f,
                                          .top_k = 40,
                                          .top_p = 0.9f,
                                          .seed = 12345,
                                          .min_p = 0.1f,
                                          .presence_penalty = -0.5f,
                                          .frequency_penalty = 1.5f,
                                          .repetition_penalty = 1.2f,
                                          .n_logit_bias = 2,
                                          .logit_bias = {{3, -100.0f}, {40000, 2.5f}}},
                               .n_logprobs = 3,
                               .want_logprob = true,
                               .stop_ids = {2, 5},
                               .n_stop_ids = 2,
                               .grammar = "root ::= \"a\"",
                               .n_grammar = 12};
    long n = kvf_rpc_put_submit(buf, sizeof buf, 77, &p);
    ASSERT_TRUE(n > 0 && (size_t)n <= kvf_rpc_submit_bytes(5));
    struct kvf_rpc_msg m;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), 0);
    ASSERT_EQ_INT(m.type, KVF_RPC_SUBMIT);
    ASSERT_TRUE(m.rid == 77 && m.params.tenant == 9 && m.params.n_prompt == 5 &&
                m.params.max_tokens == 33);
    ASSERT_TRUE(memcmp(m.params.prompt, prompt, sizeof prompt) == 0);
    ASSERT_TRUE(m.params.sample.temperature == 0.7f && m.params.sample.top_k == 40 &&
                m.params.sample.top_p == 0.9f && m.params.sample.seed == 12345);
    ASSERT_TRUE(m.params.sample.min_p == 0.1f && m.params.sample.presence_penalty == -0.5f &&
                m.params.sample.frequency_penalty == 1.5f &&
                m.params.sample.repetition_penalty == 1.2f);
    ASSERT_EQ_INT(m.params.sample.n_logit_bias, 2);
    ASSERT_TRUE(m.params.sample.logit_bias[1].id == 40000 &&
                m.params.sample.logit_bias[1].bias == 2.5f);
    ASSERT_TRUE(m.params.n_logprobs == 3 && m.params.want_logprob && !m.params.ignore_eos);
    ASSERT_TRUE(m.params.n_stop_ids == 2 && m.params.stop_ids[0] == 2 && m.params.stop_ids[1] == 5);
    ASSERT_TRUE(m.params.n_grammar == 12 && memcmp(m.params.grammar, "root ::= \"a\"", 12) == 0);
    only_whole((size_t)n);
    /* A prompt beyond the reader's room is refused, not truncated. */
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 4, NULL, NULL), -EBADMSG);
    /* Another version, another type. */
    buf[1] = KVF_RPC_VERSION + 1;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), -EBADMSG);
    buf[1] = KVF_RPC_VERSION;
    buf[0] = 99;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), -EBADMSG);
}

static void test_events_round_trip(void)
{
    struct kvf_gen_event ev = {.kind = KVF_GEN_TOKEN,
                               .token = 4242,
                               .logprob = -1.25f,
                               .n_top = 2,
                               .top_ids = {4242, 7},
                               .top_logprobs = {-1.25f, -2.5f}};
    long n = kvf_rpc_put_event(buf, sizeof buf, 5, &ev);
    struct kvf_rpc_msg m;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), 0);
    ASSERT_TRUE(m.type == KVF_RPC_TOKEN && m.rid == 5 && m.ev.token == 4242 &&
                m.ev.logprob == -1.25f);
    ASSERT_TRUE(m.ev.n_top == 2 && m.ev.top_ids[1] == 7 && m.ev.top_logprobs[1] == -2.5f);
    only_whole((size_t)n);
    /* More top logprobs than the API's bound: refused. */
    buf[2 + 8 + 4 + 4] = KVF_GEN_MAX_LOGPROBS + 1;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), -EBADMSG);
    struct kvf_gen_event end = {.kind = KVF_GEN_END, .err = -EAGAIN, .stopped = true};
    n = kvf_rpc_put_event(buf, sizeof buf, 6, &end);
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), 0);
    ASSERT_TRUE(m.type == KVF_RPC_END && m.rid == 6 && m.ev.err == -EAGAIN && m.ev.stopped);
    only_whole((size_t)n);
    buf[n - 1] = 2; /* stopped is 0 or 1 */
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), -EBADMSG);
    n = kvf_rpc_put_cancel(buf, sizeof buf, 8);
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), 0);
    ASSERT_TRUE(m.type == KVF_RPC_CANCEL && m.rid == 8);
    only_whole((size_t)n);
}

/* PROV: every field back; the listed pages are min(n_pages, KVF_GEN_PROV_PAGES); a verified flag
 * other than 0 or 1, or fewer listed pages than n_pages says, is refused. */
static void test_prov_round_trip(void)
{
    static struct kvf_gen_prov pv, back;
    memset(&pv, 0, sizeof pv);
    pv.decode_id = 0x1122334455667789ULL;
    pv.req_lo = 5;
    pv.req_hi = 0x1122334455667789ULL;
    snprintf(pv.prefill_addr, sizeof pv.prefill_addr, "127.0.0.1:4000");
    pv.prefill_peer = 2;
    pv.writer_epoch = 7;
    pv.grant_nonce = 0xabcdef;
    pv.tenant = 3;
    pv.tokens_granted = pv.tokens_verified = 40;
    pv.verified = true;
    pv.n_pages = 3;
    pv.pages_digest = 99;
    for (uint32_t i = 0; i < 3; i++)
        pv.pages[i] = (struct kvf_gen_prov_page){10 + i, 0x100u + i, 0x2000u + i};
    long n = kvf_rpc_put_prov(buf, sizeof buf, 42, &pv);
    ASSERT_TRUE(n > 0);
    struct kvf_rpc_msg m;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), 0);
    ASSERT_EQ_INT(m.type, KVF_RPC_PROV);
    ASSERT_TRUE(m.rid == 42);
    back = m.prov;
    ASSERT_TRUE(memcmp(&back, &pv, sizeof pv) == 0);
    only_whole((size_t)n);
    buf[2 + 8 * 4 + 2 + strlen(pv.prefill_addr) + 2 + 4 + 8 + 4 * 3] = 2; /* verified */
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), -EBADMSG);
    /* More pages than listed: the list is bounded by KVF_GEN_PROV_PAGES, the count is not. */
    pv.n_pages = 1000;
    for (uint32_t i = 0; i < KVF_GEN_PROV_PAGES; i++)
        pv.pages[i] = (struct kvf_gen_prov_page){i, i, i};
    n = kvf_rpc_put_prov(buf, sizeof buf, 43, &pv);
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, NULL), 0);
    ASSERT_TRUE(m.prov.n_pages == 1000 &&
                m.prov.pages[KVF_GEN_PROV_PAGES - 1].page == KVF_GEN_PROV_PAGES - 1);
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n - 20, &m, room, 64, NULL, NULL), -EBADMSG);
}

static void test_hello_and_status_round_trip(void)
{
    struct kvf_rpc_hello h = {
        .model_fp = 0x1122334455667788ull, .max_context = 2048, .page_tokens = 16, .n_prefills = 2};
    strcpy(h.prefills[0].host, "10.0.0.1");
    h.prefills[0].port = 7001;
    strcpy(h.prefills[1].host, "prefill-2.example");
    h.prefills[1].port = 7002;
    long n = kvf_rpc_put_hello(buf, sizeof buf, KVF_RPC_HELLO_R, &h);
    struct kvf_rpc_msg m;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, &hroom, &sroom), 0);
    ASSERT_TRUE(m.hello->model_fp == h.model_fp && m.hello->max_context == 2048 &&
                m.hello->n_prefills == 2);
    ASSERT_TRUE(strcmp(m.hello->prefills[1].host, "prefill-2.example") == 0 &&
                m.hello->prefills[1].port == 7002);
    only_whole((size_t)n);
    /* A host with a NUL inside is refused. */
    size_t at = 2 + 8 + 4 + 4 + 2 + 2 + 3;
    buf[at] = 0;
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, &hroom, &sroom), -EBADMSG);
    /* No room given for a HELLO: refused. */
    n = kvf_rpc_put_hello(buf, sizeof buf, KVF_RPC_HELLO_R, &h);
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, NULL, &sroom), -EBADMSG);
    struct kvf_rpc_hello d = {.model_fp = 1,
                              .max_context = 2,
                              .page_tokens = 16,
                              .n_vocab = 512,
                              .status = -5,
                              .why = "context limit 2 there, 4 here"};
    n = kvf_rpc_put_hello(buf, sizeof buf, KVF_RPC_HELLO_D, &d);
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, &hroom, &sroom), 0);
    ASSERT_TRUE(m.hello->status == -5 && strcmp(m.hello->why, d.why) == 0 &&
                m.hello->n_vocab == 512);
    only_whole((size_t)n);
    /* An "ok" with a reason is not a frame the writer makes: refused (found by fuzz_rpc). */
    d.status = 0;
    n = kvf_rpc_put_hello(buf, sizeof buf, KVF_RPC_HELLO_D, &d);
    buf[2 + 8 + 4 + 4 + 4] = 0xfb; /* a non-zero status on the wire, why "": a refusal */
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, &hroom, &sroom), 0);
    d.status = -5;
    n = kvf_rpc_put_hello(buf, sizeof buf, KVF_RPC_HELLO_D, &d);
    memset(buf + 2 + 8 + 4 + 4 + 4, 0, 4); /* status 0, the reason kept */
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, &hroom, &sroom), -EBADMSG);

    struct kvf_rpc_status st;
    memset(&st, 0, sizeof st);
    st.info.decode_pages = 100;
    st.info.decode_free = 60;
    st.info.decode_by_state[3] = 4;
    st.info.fences = 3;
    st.info.bad_frames = 9;
    st.info.prefill_up = true;
    st.n_prefills = 1;
    strcpy(st.prefills[0].host, "127.0.0.1");
    st.prefills[0].port = 9;
    st.prefills[0].granted = 41;
    strcpy(st.prefills[0].why, "");
    n = kvf_rpc_put_status(buf, sizeof buf, &st);
    ASSERT_EQ_INT(kvf_rpc_decode(buf, (size_t)n, &m, room, 64, &hroom, &sroom), 0);
    ASSERT_TRUE(m.status->info.decode_pages == 100 && m.status->info.decode_free == 60 &&
                m.status->info.decode_by_state[3] == 4 && m.status->info.fences == 3 &&
                m.status->info.bad_frames == 9 && m.status->info.prefill_up);
    ASSERT_TRUE(m.status->n_prefills == 1 && m.status->prefills[0].port == 9 &&
                m.status->prefills[0].granted == 41);
    only_whole((size_t)n);
}

static void test_bounds_on_write(void)
{
    int32_t prompt[3] = {1, 2, 3};
    struct kvf_gen_params p = {.prompt = prompt,
                               .n_prompt = 3,
                               .max_tokens = 1,
                               .sample = {.top_p = 1},
                               .n_stop_ids = KVF_GEN_MAX_STOP_IDS + 1};
    ASSERT_EQ_INT(kvf_rpc_put_submit(buf, sizeof buf, 1, &p), -EINVAL);
    p.n_stop_ids = 0;
    p.n_grammar = KVF_GEN_MAX_GRAMMAR + 1; /* a grammar beyond the bound */
    p.grammar = "x";
    ASSERT_EQ_INT(kvf_rpc_put_submit(buf, sizeof buf, 1, &p), -EINVAL);
    p.n_grammar = 0;
    ASSERT_EQ_INT(kvf_rpc_put_submit(buf, 10, 1, &p), -EMSGSIZE);
    struct kvf_rpc_hello h = {.n_prefills = KVF_RPC_MAX_PREFILLS + 1};
    ASSERT_EQ_INT(kvf_rpc_put_hello(buf, sizeof buf, KVF_RPC_HELLO_R, &h), -EINVAL);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_submit_round_trip),
    KVF_CASE(test_events_round_trip),
    KVF_CASE(test_hello_and_status_round_trip),
    KVF_CASE(test_prov_round_trip),
    KVF_CASE(test_bounds_on_write),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
