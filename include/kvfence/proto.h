/*
 * kvfence/proto.h — the prefill→decode handoff protocol: message codec and the decode-side and
 * prefill-side state machines.
 *
 * The state and message names below are used verbatim by the Promela model (spin/handoff.pml),
 * so a trail from the model reads in the same words as a trace from the simulator. Append new
 * values at the end of each enum; never renumber (the numbers are on the wire and in traces).
 */
#ifndef KVFENCE_PROTO_H
#define KVFENCE_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/common.h"
#include "kvfence/gen.h"
#include "kvfence/pool.h"

/* Decode-side request states. */
enum kvf_dreq_state {
    KVF_DREQ_NONE = 0,     /* no such request (slot unused) */
    KVF_DREQ_GRANTED = 1,  /* pages allocated, GRANT sent, awaiting DONE / REJECT / FAIL */
    KVF_DREQ_RUNNING = 2,  /* verified and committed: decoding */
    KVF_DREQ_DRAINING = 3, /* ended without success while grants are outstanding: CANCEL sent,
                              pages HELD, awaiting drain proof or a fence */
    KVF_DREQ_DONE = 4,     /* finished successfully; pages released */
    KVF_DREQ_FAILED = 5,   /* finished with an error; no grant outstanding */
    KVF_DREQ__NSTATES = 6,
};

/* Prefill-side request states. */
enum kvf_preq_state {
    KVF_PREQ_NONE = 0,      /* never seen */
    KVF_PREQ_COMPUTING = 1, /* GRANT accepted, prompt KV being computed */
    KVF_PREQ_WRITING = 2,   /* puts posted towards the granted pages */
    KVF_PREQ_FLUSHING = 3,  /* every put posted; awaiting remote completion before DONE */
    KVF_PREQ_DRAINING = 4,  /* cancelled or failed after posting: awaiting remote completion of
                               every posted write before CANCEL_ACK / FAIL */
    KVF_PREQ_DONE = 5,      /* DONE sent */
    KVF_PREQ_CLEARED = 6,   /* finished and forgotten except for its (request, nonce) record */
    KVF_PREQ__NSTATES = 7,
};

/* Message types (the wire value is the enum value). */
enum kvf_msg_type {
    KVF_MSG_HELLO = 1,  /* connect: model fingerprint, page geometry, limits, epoch */
    KVF_MSG_NEW = 2,    /* router → decode: an admitted request */
    KVF_MSG_GRANT = 3,  /* decode → prefill: (page, tag) list and expected tokens */
    KVF_MSG_DONE = 4,   /* prefill → decode: tokens written, per-page checksums, first token */
    KVF_MSG_CANCEL = 5, /* decode → prefill (or router → decode): stop and drain */
    KVF_MSG_CANCEL_ACK = 6, /* prefill → decode: every posted write completed remotely */
    KVF_MSG_REJECT = 7,     /* prefill → decode: refused before posting any write */
    KVF_MSG_FAIL = 8,       /* prefill → decode: failed after posting; writes drained */
    KVF_MSG_PROGRESS = 9, /* prefill → decode: the prompt's compute is advancing (liveness only) */
    KVF_MSG__END = 10,
};

/* --- Wire format. ---------------------------------------------------------------------------
 *
 * Every message is one frame, little-endian, length-prefixed:
 *
 *   offset  size  field
 *        0     2  version   (KVF_PROTO_VERSION; any other value is refused)
 *        2     1  type      (enum kvf_msg_type; any other value is refused)
 *        3     1  flags     (0; anything else is refused)
 *        4     4  length    (bytes of the whole frame, header included)
 *        8    16  request id (lo, hi)
 *       24     8  nonce     (the grant's nonce: one per (request, decode attempt))
 *       32     4  epoch     (the writer connection's epoch)
 *       36     4  reserved  (0)
 *       40     …  body, by type (see docs/PROTOCOL.md for the table)
 *
 * The body of each type has a fixed part and its counted arrays (NEW: logit_bias pairs, tokens;
 * GRANT: logit_bias pairs, pages, tokens; DONE: checksums), each count in the fixed part; the
 * declared length must equal exactly the fixed part plus the arrays, so a frame with trailing or
 * missing bytes is refused. No count is trusted before it has been checked against its bound and
 * against the bytes actually present.
 */
#define KVF_PROTO_VERSION      4u /* 4: NEW and GRANT carry the grammar */
#define KVF_PROTO_HEADER_BYTES 40u
#define KVF_PROTO_MAX_PAGES    65536u     /* pages in one GRANT or DONE */
#define KVF_PROTO_MAX_TOKENS   (1u << 20) /* prompt tokens carried in one NEW or GRANT */
#define KVF_PROTO_MAX_LOGPROBS 20u        /* top logprobs of the first token in one DONE */
/* The sampling block of NEW and GRANT: a fixed part (temperature, top_p, top_k, n_logprobs, seed;
 * min_p, the three penalties, n_logit_bias, n_grammar), then n_logit_bias (id, bias) pairs, then
 * n_grammar bytes of grammar text. _BYTES is the most it takes. */
#define KVF_PROTO_SAMPLING_FIXED_BYTES 48u
#define KVF_PROTO_SAMPLING_BYTES                                                                   \
    (KVF_PROTO_SAMPLING_FIXED_BYTES + 8u * KVF_GEN_MAX_LOGIT_BIAS + KVF_GEN_MAX_GRAMMAR)
/* The largest frame the codec produces or accepts (a GRANT with the most pages and tokens). */
#define KVF_PROTO_MAX_MSG_BYTES                                                                    \
    (KVF_PROTO_HEADER_BYTES + 16u + KVF_PROTO_SAMPLING_BYTES + 12u * KVF_PROTO_MAX_PAGES +         \
     4u * KVF_PROTO_MAX_TOKENS)

/* Worker roles named in HELLO. */
enum kvf_role {
    KVF_ROLE_ROUTER = 1,
    KVF_ROLE_PREFILL = 2,
    KVF_ROLE_DECODE = 3,
};

/* HELLO: what each side of a connection states at connect. Two sides may talk only if the model
 * fingerprint, the page geometry and the context limit agree (kvf_proto_hello_check). */
struct kvf_msg_hello {
    uint64_t model_fp;            /* fingerprint of the model's weights and tokenizer */
    struct kvf_pool_geometry geo; /* page geometry */
    uint32_t max_context;         /* tokens: the most prompt + output one request may use */
    uint32_t max_grant_pages;     /* pages the sender accepts in one GRANT */
    uint16_t peer;                /* sender's peer id */
    uint8_t role;                 /* enum kvf_role */
};

/* How a request's tokens are drawn, carried by NEW and GRANT so that whichever worker samples a
 * token (prefill the first, decode the rest) draws it the same way (kvf_sample_params, plus how
 * many top logprobs to return per token). */
struct kvf_msg_sampling {
    float temperature;   /* ≥ 0, finite; 0 = greedy */
    float top_p;         /* [0, 1]; 0 and 1 = no nucleus cut */
    uint32_t top_k;      /* 0 = no cut */
    uint32_t n_logprobs; /* 0..KVF_PROTO_MAX_LOGPROBS; the first token's come back in DONE */
    uint64_t seed;
    bool want_logprob; /* the sampled token's own logprob (implied by n_logprobs > 0); without
                          it no worker computes a softmax for the request */
    /* As in struct kvf_sample_params (kvfence/gen.h), with their ranges in kvfence/limits.h. */
    float min_p, presence_penalty, frequency_penalty, repetition_penalty;
    uint32_t n_logit_bias;
    struct kvf_logit_bias logit_bias[KVF_GEN_MAX_LOGIT_BIAS]; /* distinct ids, ascending */
    /* Constrained decoding: GBNF text (kvfence/grammar.h), n_grammar ≤ KVF_GEN_MAX_GRAMMAR
     * bytes, borrowed (the encoder's input; the decoder's frame) — a holder copies it. */
    const char *grammar;
    uint32_t n_grammar;
};

/* NEW (router → decode): an admitted request. tokens[0..n_tokens) is the prompt. */
struct kvf_msg_new {
    uint32_t tenant;
    uint32_t prompt_len; /* tokens in the prompt; equals n_tokens when the prompt is carried */
    uint32_t max_tokens; /* output tokens at most */
    uint32_t n_tokens;
    const uint32_t *tokens; /* borrowed: the encoder's input, or the decoder's scratch */
    struct kvf_msg_sampling sampling;
};

/* GRANT (decode → prefill): write these pages, with this many tokens in all. */
struct kvf_msg_grant {
    uint32_t tenant;
    uint32_t expected_tokens;
    uint32_t n_pages;
    const struct kvf_page_ref *pages; /* borrowed, [n_pages] */
    uint32_t n_tokens;
    const uint32_t *tokens; /* borrowed, [n_tokens]: the prompt */
    struct kvf_msg_sampling sampling;
};

/* DONE (prefill → decode): every write completed remotely (flushed). */
struct kvf_msg_done {
    uint32_t tokens_written;
    uint32_t first_token;
    uint32_t n_pages;
    const uint64_t *checksums; /* borrowed, [n_pages]: XXH3-64 of each page's data bytes */
    float first_logprob;       /* natural log probability of first_token (temperature 1) */
    uint32_t n_top;            /* ≤ KVF_PROTO_MAX_LOGPROBS: the grant's n_logprobs */
    uint32_t top_ids[KVF_PROTO_MAX_LOGPROBS];
    float top_logprobs[KVF_PROTO_MAX_LOGPROBS];
};

/* PROGRESS (prefill → decode): the writer is computing this prompt and advancing. It proves
 * nothing about pages and commits nothing: it only renews the grant's no-progress deadline.
 * Both counts never decrease over one grant and never exceed the grant's. */
struct kvf_msg_progress {
    uint32_t tokens_done;  /* prompt tokens whose K/V is computed (posted or about to be) */
    uint32_t pages_posted; /* pages whose write has been posted */
};

/* One message, decoded or to be encoded. Arrays are borrowed (see each body). */
struct kvf_msg {
    enum kvf_msg_type type;
    kvf_req_id_t req;
    uint64_t nonce;
    uint32_t epoch;
    union {
        struct kvf_msg_hello hello;       /* HELLO */
        struct kvf_msg_new nreq;          /* NEW */
        struct kvf_msg_grant grant;       /* GRANT */
        struct kvf_msg_done done;         /* DONE */
        struct kvf_msg_progress progress; /* PROGRESS */
        int32_t reason; /* CANCEL, REJECT, FAIL: a negative kvfence code; CANCEL_ACK: 0 */
    } u;
};

/* Caller-owned room for the arrays of a decoded message. The decoder copies arrays here (the
 * wire is little-endian and unaligned, so it cannot hand out typed views) and refuses any count
 * above the room given (KVF_E_PROTO_BOUNDS) — so the caller, not the peer, bounds memory. */
struct kvf_msg_scratch {
    struct kvf_page_ref *pages;
    uint32_t pages_cap;
    uint64_t *checksums;
    uint32_t checksums_cap;
    uint32_t *tokens;
    uint32_t tokens_cap;
};

/* The name of a type, state or role ("KVF_MSG_GRANT", ...); "?" for an unknown value. */
const char *kvf_msg_type_name(int type);
const char *kvf_dreq_state_name(enum kvf_dreq_state s);
const char *kvf_preq_state_name(enum kvf_preq_state s);

/*
 * Bytes the encoding of m takes, or a negative code: KVF_E_PROTO_TYPE for an unknown type,
 * KVF_E_PROTO_BOUNDS for a count beyond its bound or a NULL array with a non-zero count.
 */
long kvf_msg_encoded_size(const struct kvf_msg *m);

/*
 * Encodes m into buf[0..cap). Returns the bytes written, or a negative code (those of
 * kvf_msg_encoded_size, or -ENOSPC when cap is too small). On failure buf is untouched.
 */
long kvf_msg_encode(const struct kvf_msg *m, uint8_t *buf, size_t cap);

/*
 * Framing: reads the header at buf[0..len) and stores the frame's declared length in *frame_len.
 * Returns 0, KVF_E_PROTO_SHORT (fewer than a header's bytes), KVF_E_PROTO_VERSION,
 * KVF_E_PROTO_TYPE or KVF_E_PROTO_BOUNDS (a length below the header or above
 * KVF_PROTO_MAX_MSG_BYTES). A stream reader waits for *frame_len bytes, then decodes.
 */
int kvf_msg_frame_len(const uint8_t *buf, size_t len, uint32_t *frame_len);

/*
 * Decodes exactly one frame from buf[0..len) into *out (arrays into *scratch; scratch may be NULL
 * for messages without arrays). Returns the frame's length (bytes consumed; len may hold more),
 * or a negative code: KVF_E_PROTO_SHORT, KVF_E_PROTO_VERSION, KVF_E_PROTO_TYPE,
 * KVF_E_PROTO_BOUNDS (a count beyond its bound or the scratch room, a length that disagrees with
 * the body, a non-zero reserved field or flag, an out-of-range value). On failure *out and
 * *scratch may have been partly written but nothing else changed. O(frame length).
 */
long kvf_msg_decode(const uint8_t *buf, size_t len, struct kvf_msg *out,
                    const struct kvf_msg_scratch *scratch);

/*
 * The connect check (H7): 0 when two HELLOs may form a connection — same model fingerprint,
 * same page geometry, same context limit — else KVF_E_PROTO_MISMATCH.
 */
int kvf_proto_hello_check(const struct kvf_msg_hello *local, const struct kvf_msg_hello *remote);

/* --- Actions: what a machine asks its engine to do. ------------------------------------------
 *
 * The machines below take no clock, lock or socket. Each event function takes the time as an
 * argument and appends what must happen to an action list; the engine (or the simulator) then
 * executes the actions in order. A SEND's message borrows the machine's memory: encode it before
 * the next call into the same machine.
 */
enum kvf_action_kind {
    KVF_ACT_SEND = 1,          /* send msg to peer */
    KVF_ACT_FENCE_PEER = 2,    /* close the endpoint of (peer, epoch) in a mode that stops its
                                  writes, then call kvf_decode_peer_fenced */
    KVF_ACT_DELIVER_FIRST = 3, /* decode: request committed; stream first_token */
    KVF_ACT_FAIL_REQ = 4,      /* decode: tell the client the request ended with err */
    KVF_ACT_COMPUTE = 5,       /* prefill: compute the prompt's KV, then report each page with
                                  kvf_prefill_page_ready in index order */
    KVF_ACT_ABORT_COMPUTE = 6, /* prefill: stop computing req; pages never posted may be freed */
    KVF_ACT_POST_WRITE = 7,    /* prefill: put page `index`'s data to dst, ordering fence, then
                                  its trailer (slots, checksum); keep the source until the put
                                  completes locally */
    KVF_ACT_FLUSH = 8,         /* prefill: flush the connection; report kvf_prefill_flushed(req) */
    KVF_ACT_RELEASE_SRC = 9,   /* prefill: source page `index` of req may be freed or reused */
};

struct kvf_action {
    enum kvf_action_kind kind;
    kvf_req_id_t req;
    uint16_t peer;           /* SEND: destination; FENCE_PEER: the writer */
    uint32_t epoch;          /* FENCE_PEER: the writer's epoch; POST_WRITE: the writer's epoch */
    int err;                 /* FAIL_REQ */
    uint32_t first_token;    /* DELIVER_FIRST */
    uint32_t index;          /* POST_WRITE, RELEASE_SRC: page index within the grant */
    struct kvf_page_ref dst; /* POST_WRITE: destination page */
    uint32_t slots;          /* POST_WRITE: token slots written to the page */
    uint64_t checksum;       /* POST_WRITE: XXH3-64 of the page's data bytes */
    uint64_t nonce;          /* POST_WRITE, COMPUTE: the grant's nonce */
    uint32_t tenant;         /* POST_WRITE: the grant's tenant, for the trailer */
    struct kvf_msg msg;      /* SEND */
};

/* A caller-owned action list. Event functions append; the caller resets n to 0 between calls
 * (or not, to batch). A call that would not fit refuses up front with -ENOBUFS and changes
 * nothing: give cap ≥ the machine's kvf_*_max_actions(). */
struct kvf_actions {
    struct kvf_action *v;
    uint32_t n, cap;
};

/* --- The decode-side machine. -------------------------------------------------------------- */

typedef struct kvf_decode kvf_decode_t;

struct kvf_decode_config {
    kvf_pool_t *pool;          /* borrowed: the decode worker's page pool; outlives the machine */
    uint32_t max_reqs;         /* live request slots (≥ 1) */
    uint32_t max_context;      /* tokens: prompt_len + max_tokens must not exceed it (H7) */
    uint32_t max_grant_pages;  /* pages in one grant (≤ KVF_PROTO_MAX_PAGES) */
    uint16_t max_peers;        /* writer peers 0..max_peers-1 (the pool's max_peers) */
    uint64_t grant_timeout_ms; /* the no-progress bound: a GRANTED request with no PROGRESS (or
                                  DONE) from its writer for this long fails (cancel, hold, proof
                                  or fence, as any failure) (0 = 5000) */
    uint64_t hold_timeout_ms;  /* the pool's hold timeout (only mutants read it; 0 = 30000) */
    uint64_t nonce_seed;       /* nonces are nonce_seed + 1, + 2, ... */
    const struct kvf_alloc_ops *alloc; /* NULL = kvf_default_alloc */
    /* Test builds only (ignored elsewhere): commit what a DONE covers without reading its pages —
     * no trailer, no checksum; the counts are still compared. The isolation suite's unverified
     * runs switch it on to see what the page lifetime rules alone let through (docs/ISOLATION.md).
     */
    bool test_unverified;
};

struct kvf_decode_stats {
    uint32_t live;                        /* gauge: requests in GRANTED, RUNNING or DRAINING */
    uint32_t by_state[KVF_DREQ__NSTATES]; /* gauge */
    uint64_t submitted, rejected, committed, failed, finished; /* counters */
    uint64_t stale;            /* counter: stale, duplicate or unknown messages ignored */
    uint64_t verify_failed;    /* counter: DONEs that failed a count, trailer or checksum check;
                                  verify_failed == verify_count + verify_trailer + verify_checksum */
    uint64_t verify_count;     /* counter: ... the count (KVF_E_PROTO_COUNT: tokens or pages that
                                  are not the grant's, a page's slots not its share) */
    uint64_t verify_trailer;   /* counter: ... a trailer (KVF_E_PROTO_TRAILER: a page's tag,
                                  request, tenant or writer epoch and nonce not the grant's) */
    uint64_t verify_checksum;  /* counter: ... a checksum (KVF_E_PROTO_CHECKSUM: a page's bytes not
                                  those the writer hashed) */
    uint64_t fences_requested; /* counter */
    uint64_t progress;         /* counter: PROGRESS messages that renewed a grant */
    uint64_t expired;          /* counter: grants that saw no progress within the bound */
};

int kvf_decode_create(const struct kvf_decode_config *cfg, kvf_decode_t **out);
void kvf_decode_destroy(kvf_decode_t *d);
/* The action room every event call needs. */
uint32_t kvf_decode_max_actions(const kvf_decode_t *d);
void kvf_decode_stats(const kvf_decode_t *d, struct kvf_decode_stats *out);
/* The state of req (KVF_DREQ_NONE when unknown or ended). */
enum kvf_dreq_state kvf_decode_req_state(const kvf_decode_t *d, kvf_req_id_t req);

/* A writer peer completed its handshake at `epoch` (its current pool epoch): grants may go to it.
 */
int kvf_decode_peer_up(kvf_decode_t *d, uint16_t peer, uint32_t epoch);

/*
 * NEW from the router: reserve pages for prompt + output (all or nothing), allocate the prompt's
 * pages, grant them to writer `peer`, send GRANT. Returns 0 with the request GRANTED, or 0 with a
 * FAIL_REQ action and nothing reserved when the request is refused (limits, pool, peer not up):
 * rejection is terminal before any grant or allocation (H6, H7). -EBUSY (no free slot) and
 * -EEXIST (the request id is live) change nothing.
 */
int kvf_decode_submit(kvf_decode_t *d, uint64_t now_ms, kvf_req_id_t req,
                      const struct kvf_msg_new *nreq, uint16_t peer, struct kvf_actions *acts);
/* A message from writer `peer` (DONE, REJECT, FAIL, CANCEL_ACK). Stale, duplicate and unknown
 * messages are counted and ignored (KVF_E_PROTO_STALE / KVF_E_PROTO_UNKNOWN_REQ returned). */
int kvf_decode_on_msg(kvf_decode_t *d, uint64_t now_ms, uint16_t peer, const struct kvf_msg *m,
                      struct kvf_actions *acts);
/*
 * kvf_decode_on_msg for a DONE whose pages the engine has hashed already (hashed[i]: XXH3-64 of
 * the data bytes of page i of the grant, in grant order), so that a long prompt's hashing need
 * not run inside one call: the engine hashes in bounded slices between other work and then
 * calls this. Everything else is checked here as in kvf_decode_on_msg, against the grant as it
 * is now. -EINVAL for a non-DONE message or a NULL hashed.
 */
int kvf_decode_on_done_hashed(kvf_decode_t *d, uint64_t now_ms, uint16_t peer,
                              const struct kvf_msg *m, const uint64_t *hashed,
                              struct kvf_actions *acts);
/* The pages a DONE from `peer` would be checked against (borrowed, valid until the next call
 * that changes the machine), or KVF_E_PROTO_STALE when it would not be checked at all (unknown,
 * not GRANTED, another writer or nonce, another page count). */
int kvf_decode_done_pages(const kvf_decode_t *d, uint16_t peer, const struct kvf_msg *m,
                          const struct kvf_page_ref **pages, uint32_t *n_pages);
/* The client or the router cancelled req (reason: a negative code, e.g. KVF_E_PROTO_CANCELLED). */
int kvf_decode_cancel(kvf_decode_t *d, uint64_t now_ms, kvf_req_id_t req, int reason,
                      struct kvf_actions *acts);
/* The engine finished decoding a RUNNING request: its pages are released. */
int kvf_decode_finish(kvf_decode_t *d, uint64_t now_ms, kvf_req_id_t req, struct kvf_actions *acts);
/*
 * A RUNNING request's sequence grows by one page: allocated from the request's own reservation
 * (made at submit for prompt + max_tokens), appended to its page table, tagged and owned like the
 * prompt's pages; *out (may be NULL) names it. At finish, cancel or failure only what is left of
 * the reservation goes back. KVF_E_PROTO_UNKNOWN_REQ; KVF_E_POOL_RESERVE when the request is not
 * RUNNING or its reservation is spent (it asked for more than prompt + max_tokens). Failure
 * changes nothing. O(1).
 */
int kvf_decode_grow(kvf_decode_t *d, kvf_req_id_t req, struct kvf_page_ref *out);
/* The request's page table (borrowed; valid until the next call that changes the machine):
 * the prompt's pages, then the grown ones. KVF_E_PROTO_UNKNOWN_REQ. */
int kvf_decode_pages(const kvf_decode_t *d, kvf_req_id_t req, const struct kvf_page_ref **pages,
                     uint32_t *n_pages);
/* Timers: no-progress deadlines (fail, hold), hold timeouts (quarantine → FENCE_PEER). */
int kvf_decode_tick(kvf_decode_t *d, uint64_t now_ms, struct kvf_actions *acts);
/* Heartbeat lost: every request granted to `peer` fails now; its pages wait for the fence that
 * this asks for (H13). */
int kvf_decode_peer_down(kvf_decode_t *d, uint64_t now_ms, uint16_t peer, struct kvf_actions *acts);
/* The engine fenced `writer` (after a FENCE_PEER): every grant of that epoch ends; every request
 * that held one fails. Calls kvf_pool_fence. */
int kvf_decode_peer_fenced(kvf_decode_t *d, uint64_t now_ms, struct kvf_peer_epoch writer,
                           struct kvf_actions *acts);
/* The consistency walk of the machine against its pool. */
bool kvf_decode_check(const kvf_decode_t *d, char *why, size_t why_len);

/* --- The prefill-side machine: one per connection to a decode worker. ---------------------- */

typedef struct kvf_prefill kvf_prefill_t;

struct kvf_prefill_config {
    uint16_t decode_peer;     /* where replies go */
    uint32_t max_reqs;        /* live requests plus remembered cleared ones (≥ 1) */
    uint32_t max_grant_pages; /* pages in one grant */
    uint32_t max_context;     /* tokens in one prompt at most */
    uint32_t page_tokens;     /* slots per page (the shared geometry) */
    const struct kvf_alloc_ops *alloc;
};

struct kvf_prefill_stats {
    uint32_t live;                                 /* gauge: COMPUTING .. DRAINING and DONE */
    uint32_t by_state[KVF_PREQ__NSTATES];          /* gauge */
    uint64_t granted, rejected, done, acks, fails; /* counters */
    uint64_t progress;                             /* counter: PROGRESS messages sent */
    uint64_t stale; /* counter: stale or duplicate messages ignored */
};

int kvf_prefill_create(const struct kvf_prefill_config *cfg, kvf_prefill_t **out);
void kvf_prefill_destroy(kvf_prefill_t *p);
uint32_t kvf_prefill_max_actions(const kvf_prefill_t *p);
void kvf_prefill_stats(const kvf_prefill_t *p, struct kvf_prefill_stats *out);
enum kvf_preq_state kvf_prefill_req_state(const kvf_prefill_t *p, kvf_req_id_t req, uint64_t nonce);

/* The connection (re)formed at `epoch`: everything of the earlier connection is forgotten and
 * every live request aborted (ABORT_COMPUTE); their posted puts still release their sources at
 * local completion. */
int kvf_prefill_connect(kvf_prefill_t *p, uint32_t epoch, struct kvf_actions *acts);
/* The connection is gone (closed, fenced): as connect, with no epoch accepted until the next. */
int kvf_prefill_peer_down(kvf_prefill_t *p, struct kvf_actions *acts);
/* A message from the decode worker (GRANT, CANCEL). */
int kvf_prefill_on_msg(kvf_prefill_t *p, uint64_t now_ms, const struct kvf_msg *m,
                       struct kvf_actions *acts);
/* Page `index` of (req, nonce) is computed into its source page; checksum is the XXH3-64 of its
 * data bytes; first_token is read with the last page. Pages are reported in index order. */
int kvf_prefill_page_ready(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                           uint32_t index, uint64_t checksum, uint32_t first_token,
                           struct kvf_actions *acts);
/* The engine's compute of (req, nonce) advanced: tokens_done prompt tokens have their K/V (a
 * chunk, or a layer of one, finished — or, for a request still queued, the engine is computing
 * others ahead of it). Sends PROGRESS (the counts never fall) while the request is COMPUTING or
 * WRITING; KVF_E_PROTO_STALE, nothing sent, in any other state. The engine calls it on real
 * progress of its compute only: it is what keeps decode from fencing a writer. */
int kvf_prefill_progress(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                         uint32_t tokens_done, struct kvf_actions *acts);
/* The compute of (req, nonce) failed or was refused (err < 0): REJECT when nothing was posted,
 * else drain and FAIL. */
int kvf_prefill_compute_failed(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                               int err, struct kvf_actions *acts);
/* The put of page `index` of req completed locally (also with an error): RELEASE_SRC. */
int kvf_prefill_write_local_done(kvf_prefill_t *p, kvf_req_id_t req, uint64_t nonce, uint32_t index,
                                 struct kvf_actions *acts);
/* Every put of (req, nonce) posted before its FLUSH completed remotely. */
int kvf_prefill_flushed(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                        struct kvf_actions *acts);
/* The engine is done with (req, nonce) (its first token went out, or it gave up on it). A request
 * with writes in flight drains first and then tells decode FAIL; the record of (req, nonce) is
 * kept so a later CANCEL is still acknowledged (H2). */
int kvf_prefill_clear(kvf_prefill_t *p, uint64_t now_ms, kvf_req_id_t req, uint64_t nonce,
                      struct kvf_actions *acts);
bool kvf_prefill_check(const kvf_prefill_t *p, char *why, size_t why_len);

#endif /* KVFENCE_PROTO_H */
