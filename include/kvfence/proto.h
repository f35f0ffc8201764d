/*
 * kvfence/proto.h — the prefill→decode handoff protocol: message codec and the decode-side and
 * prefill-side state machines.
 *
 * The state and message names below are used verbatim by the Promela model (model/handoff.pml),
 * so a trail from the model reads in the same words as a trace from the simulator. Append new
 * values at the end of each enum; never renumber (the numbers are on the wire and in traces).
 */
#ifndef KVFENCE_PROTO_H
#define KVFENCE_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/common.h"
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
    KVF_MSG_HELLO = 1,      /* connect: model fingerprint, page geometry, limits, epoch */
    KVF_MSG_NEW = 2,        /* router → decode: an admitted request */
    KVF_MSG_GRANT = 3,      /* decode → prefill: (page, tag) list and expected tokens */
    KVF_MSG_DONE = 4,       /* prefill → decode: tokens written, per-page checksums, first token */
    KVF_MSG_CANCEL = 5,     /* decode → prefill (or router → decode): stop and drain */
    KVF_MSG_CANCEL_ACK = 6, /* prefill → decode: every posted write completed remotely */
    KVF_MSG_REJECT = 7,     /* prefill → decode: refused before posting any write */
    KVF_MSG_FAIL = 8,       /* prefill → decode: failed after posting; writes drained */
    KVF_MSG__END = 9,
};

#endif /* KVFENCE_PROTO_H */
