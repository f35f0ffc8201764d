/*
 * fuzz_rpc.c — the router ↔ decode frame decoder (src/engine/rpc.c) against arbitrary bytes.
 *
 * Both sides of that connection parse what the other sends: a decode worker reads a router's
 * SUBMIT (a prompt the size the frame claims), a router reads a decode worker's STATUS (strings
 * and counts) and PROV (a string, a page list bounded by KVF_GEN_PROV_PAGES). Every input is
 * decoded with small rooms (a prompt room of 8 tokens, so the "count beyond the room" path is
 * reached); whatever decodes must re-encode to exactly the bytes it came from, and whatever is
 * refused is refused by the bounds checks, never by a crash, a read past the input or undefined
 * behaviour.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rpc.h"

static long encode(const struct kvf_rpc_msg *m, uint8_t *buf, size_t cap)
{
    switch (m->type) {
    case KVF_RPC_HELLO_R:
    case KVF_RPC_HELLO_D:
        return kvf_rpc_put_hello(buf, cap, m->type, m->hello);
    case KVF_RPC_SUBMIT:
        return kvf_rpc_put_submit(buf, cap, m->rid, &m->params);
    case KVF_RPC_CANCEL:
        return kvf_rpc_put_cancel(buf, cap, m->rid);
    case KVF_RPC_TOKEN:
    case KVF_RPC_END:
        return kvf_rpc_put_event(buf, cap, m->rid, &m->ev);
    case KVF_RPC_STATUS:
        return kvf_rpc_put_status(buf, cap, m->status);
    case KVF_RPC_PROV:
        return kvf_rpc_put_prov(buf, cap, m->rid, &m->prov);
    }
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct kvf_rpc_hello hello;
    static struct kvf_rpc_status status;
    int32_t prompt[8];
    struct kvf_rpc_msg m;
    if (kvf_rpc_decode(data, size, &m, prompt, 8, &hello, &status) < 0) return 0;
    uint8_t *out = malloc(size + 1);
    if (!out) abort();
    long n = encode(&m, out, size + 1);
    /* A HELLO_D that decodes with status 0 carries an empty reason; re-encoding writes the same. */
    if (n != (long)size || memcmp(out, data, size) != 0) abort();
    free(out);
    return 0;
}
