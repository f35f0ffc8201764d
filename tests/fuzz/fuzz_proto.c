/*
 * fuzz_proto.c — the handoff message decoder against arbitrary bytes.
 *
 * Every input is decoded as a stream of frames (as a transport would read them); whatever decodes
 * must re-encode to exactly the bytes it came from, and a frame the decoder refuses must be
 * refused by framing or by the body check, never by a crash, a leak or undefined behaviour.
 * The scratch room is small on purpose, so the "count beyond the caller's room" path is reached.
 *
 * Each frame that decodes is then handed to both protocol machines — a decode machine with one
 * request granted to peer 1 (request id {1, 0}, nonce 1, epoch 1, so inputs can aim at it) and a
 * prefill machine connected at epoch 1 — and the pool's and both machines' checkers must still
 * hold: hostile messages are refused or ignored, never trusted into a broken state.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/pool.h"
#include "kvfence/proto.h"

struct machines {
    kvf_pool_t *pool;
    kvf_decode_t *dec;
    kvf_prefill_t *pre;
    struct kvf_action buf[32];
    struct kvf_actions acts;
};

static int machines_init(struct machines *M)
{
    memset(M, 0, sizeof(*M));
    struct kvf_pool_config pc = {.geo = {1, 1, 2, 4, 4},
                                 .n_pages = 8,
                                 .max_peers = 2,
                                 .hold_timeout_ms = 100,
                                 .tag_seed = 1};
    if (kvf_pool_create(&pc, &M->pool) < 0) return -1;
    struct kvf_decode_config dc = {
        .pool = M->pool, .max_reqs = 2, .max_context = 16, .max_grant_pages = 4, .max_peers = 2};
    struct kvf_prefill_config fc = {
        .max_reqs = 4, .max_grant_pages = 4, .max_context = 16, .page_tokens = 4};
    if (kvf_decode_create(&dc, &M->dec) < 0 || kvf_prefill_create(&fc, &M->pre) < 0) return -1;
    M->acts = (struct kvf_actions){M->buf, 0, 32};
    struct kvf_msg_new n = {.tenant = 1, .prompt_len = 6, .max_tokens = 2};
    if (kvf_decode_peer_up(M->dec, 1, 1) < 0 ||
        kvf_decode_submit(M->dec, 0, (kvf_req_id_t){1, 0}, &n, 1, &M->acts) < 0 ||
        kvf_prefill_connect(M->pre, 1, &M->acts) < 0)
        return -1;
    return 0;
}

static void machines_feed(struct machines *M, const struct kvf_msg *m, uint64_t now)
{
    M->acts.n = 0;
    (void)kvf_decode_on_msg(M->dec, now, 1, m, &M->acts);
    M->acts.n = 0;
    (void)kvf_prefill_on_msg(M->pre, now, m, &M->acts);
    M->acts.n = 0;
    (void)kvf_decode_tick(M->dec, now, &M->acts);
    if (!kvf_pool_check(M->pool, NULL, 0) || !kvf_decode_check(M->dec, NULL, 0) ||
        !kvf_prefill_check(M->pre, NULL, 0))
        abort();
}

static void machines_free(struct machines *M)
{
    kvf_prefill_destroy(M->pre);
    kvf_decode_destroy(M->dec);
    kvf_pool_destroy(M->pool);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct kvf_page_ref pages[64];
    static uint64_t sums[64];
    static uint32_t tokens[256];
    const struct kvf_msg_scratch scratch = {pages, 64, sums, 64, tokens, 256};
    static uint8_t
        again[KVF_PROTO_HEADER_BYTES + 16 + KVF_PROTO_SAMPLING_BYTES + 64 * 12 + 256 * 4];

    struct machines M;
    if (machines_init(&M) < 0) abort();
    size_t off = 0;
    uint64_t now = 1;
    while (off < size) {
        uint32_t frame = 0;
        int rc = kvf_msg_frame_len(data + off, size - off, &frame);
        struct kvf_msg m;
        long n = kvf_msg_decode(data + off, size - off, &m, &scratch);
        if (n < 0) {
            /* The decoder and the framer agree on the header: a frame the framer refuses is
             * refused by the decoder with the same code. */
            if (rc < 0 && n != rc) abort();
            break;
        }
        if (rc < 0 || (long)frame != n || (size_t)n > size - off) abort();
        long k = kvf_msg_encode(&m, again, sizeof(again));
        if (k != n || memcmp(again, data + off, (size_t)n) != 0) abort();
        (void)kvf_msg_type_name(m.type);
        machines_feed(&M, &m, now);
        now += 40;
        off += (size_t)n;
    }
    machines_free(&M);
    return 0;
}
