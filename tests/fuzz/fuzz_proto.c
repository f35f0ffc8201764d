/*
 * fuzz_proto.c — the handoff message decoder against arbitrary bytes.
 *
 * Every input is decoded as a stream of frames (as a transport would read them); whatever decodes
 * must re-encode to exactly the bytes it came from, and a frame the decoder refuses must be
 * refused by framing or by the body check, never by a crash, a leak or undefined behaviour.
 * The scratch room is small on purpose, so the "count beyond the caller's room" path is reached.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvfence/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct kvf_page_ref pages[64];
    static uint64_t sums[64];
    static uint32_t tokens[256];
    const struct kvf_msg_scratch scratch = {pages, 64, sums, 64, tokens, 256};
    static uint8_t again[64 + 16 + 64 * 12 + 256 * 4];

    size_t off = 0;
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
        off += (size_t)n;
    }
    return 0;
}
