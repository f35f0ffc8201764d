/*
 * rpc.h — the router ↔ decode messages (internal to src/engine).
 *
 * The router and a decode worker in separate processes talk over one UCX connection of control
 * frames (the transport's active messages: reliable and in order while the connection lives).
 * Unlike the handoff protocol (src/proto) nothing here moves KV data or grants memory: the
 * router hands a decode worker a tokenized request and reads back its tokens. Every frame is
 * little-endian, starts with a type byte and a version byte, and decodes only when its length
 * is exactly what its counts say; counts are bounded by the caller's limits, so a peer cannot
 * make the reader allocate.
 *
 *   router                                      decode
 *     HELLO_R (fp, limit, page size, prefills) ─▶
 *                                           ◀─ HELLO_D (fp, limit, page size, vocab, ok or why)
 *     SUBMIT (rid, params, prompt) ───────────▶
 *                                           ◀─ PROV (rid, provenance), before the first TOKEN
 *                                           ◀─ TOKEN (rid, token, logprobs) …
 *     CANCEL (rid) ───────────────────────────▶
 *                                           ◀─ END (rid, err, stopped)
 *                                           ◀─ STATUS (figures, prefill workers), every 100 ms
 */
#ifndef KVF_ENGINE_RPC_H
#define KVF_ENGINE_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/engine.h"

/* 2: STATUS carries verify failures by reason; 3: SUBMIT the sampling controls; 4: PROV; 5: SUBMIT
 * the grammar. */
#define KVF_RPC_VERSION      5
#define KVF_RPC_MAX_PREFILLS KVF_DECODE_MAX_PREFILLS

enum kvf_rpc_type {
    KVF_RPC_HELLO_R = 1,
    KVF_RPC_HELLO_D = 2,
    KVF_RPC_SUBMIT = 3,
    KVF_RPC_CANCEL = 4,
    KVF_RPC_TOKEN = 5,
    KVF_RPC_END = 6,
    KVF_RPC_STATUS = 7,
    KVF_RPC_PROV = 8,
};

struct kvf_rpc_addr {
    char host[KVF_PREFILL_HOST_MAX];
    uint16_t port;
};

struct kvf_rpc_hello {
    uint64_t model_fp;
    uint32_t max_context, page_tokens, n_vocab; /* n_vocab: HELLO_D only */
    int32_t status;                             /* HELLO_D: 0, or why it refuses */
    char why[KVF_PREFILL_WHY_MAX];              /* HELLO_D with status ≠ 0 */
    uint32_t n_prefills;                        /* HELLO_R */
    struct kvf_rpc_addr prefills[KVF_RPC_MAX_PREFILLS];
};

struct kvf_rpc_status {
    struct kvf_engine_info info; /* the decode worker's figures */
    uint32_t n_prefills;
    struct kvf_prefill_status prefills[KVF_RPC_MAX_PREFILLS];
};

/* A decoded frame; prompt points into the caller's room (kvf_rpc_decode). */
struct kvf_rpc_msg {
    enum kvf_rpc_type type;
    uint64_t rid;                  /* SUBMIT, CANCEL, TOKEN, END: the router's request id */
    struct kvf_gen_params params;  /* SUBMIT (prompt borrowed from the room) */
    struct kvf_gen_event ev;       /* TOKEN, END */
    struct kvf_gen_prov prov;      /* PROV (decode_addr empty: the router names the worker) */
    struct kvf_rpc_hello *hello;   /* HELLO_R, HELLO_D: the caller's room */
    struct kvf_rpc_status *status; /* STATUS: the caller's room */
};

/* Writers: the frame's length, or -EMSGSIZE when cap is too small. */
long kvf_rpc_put_hello(uint8_t *buf, size_t cap, enum kvf_rpc_type type,
                       const struct kvf_rpc_hello *h);
long kvf_rpc_put_submit(uint8_t *buf, size_t cap, uint64_t rid, const struct kvf_gen_params *p);
long kvf_rpc_put_cancel(uint8_t *buf, size_t cap, uint64_t rid);
long kvf_rpc_put_event(uint8_t *buf, size_t cap, uint64_t rid, const struct kvf_gen_event *ev);
long kvf_rpc_put_prov(uint8_t *buf, size_t cap, uint64_t rid, const struct kvf_gen_prov *pv);
long kvf_rpc_put_status(uint8_t *buf, size_t cap, const struct kvf_rpc_status *st);
/* The most bytes a SUBMIT of n_prompt tokens takes. */
size_t kvf_rpc_submit_bytes(uint32_t n_prompt);

/*
 * Decodes one frame into m. prompt_room holds up to prompt_cap token ids (a SUBMIT with more is
 * refused); hello and status rooms are used for those types (NULL = such a frame is refused).
 * 0, or -EBADMSG (malformed, wrong version, unknown type, a count beyond its bound, a length
 * that disagrees with the counts, a string without its end).
 */
int kvf_rpc_decode(const uint8_t *buf, size_t len, struct kvf_rpc_msg *m, int32_t *prompt_room,
                   uint32_t prompt_cap, struct kvf_rpc_hello *hello, struct kvf_rpc_status *status);

#endif
