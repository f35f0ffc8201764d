/*
 * simnet.h — a deterministic transport behind kvfence's transport seam (kvfence/transport.h):
 * simulated links and a simulated clock, single-threaded, replayable by seed. The real worker
 * loops run on it in manual mode (kvfence/engine.h) — tests/sim/sim_loops.c drives them.
 *
 * What it keeps of the fabric's promises, and how it breaks the rest (what TCP lets happen):
 *   - one ordered stream per direction: frames, page writes and flush requests arrive in the
 *     order they were posted, each after a random delay (sometimes a long one);
 *   - a put's bytes are read from its source at its local completion (a random time after it is
 *     posted), never before: a source freed early is read freed;
 *   - a flush's success comes back only after every earlier put was applied; an ack may be lost
 *     (the flush then ends with an error only when the connection does: H17);
 *   - a reset drops what had not arrived and each side learns of it after a delay;
 *   - a process killed: what it had handed to the kernel still arrives (late writes), then the
 *     peer sees the end of the stream;
 *   - kvf_conn_close (the fence): from its return nothing more is applied from that peer.
 */
#ifndef KVF_SIMNET_H
#define KVF_SIMNET_H

#include <stdbool.h>
#include <stdint.h>

#include "kvfence/transport.h"

struct simnet_faults {
    uint32_t delay_max_ms; /* each item's delay: 1..this */
    uint32_t late_pct;     /* share of items delayed 100..late_max_ms instead */
    uint32_t late_max_ms;
    uint32_t lost_ack_pct;    /* share of flush acks never sent */
    uint32_t put_slow_pct;    /* share of puts whose local completion takes 20..120 ms */
    uint32_t put_late_pct;    /* share of puts (besides late_pct) delivered 100..late_max_ms late */
    uint32_t put_late_max_ms; /* those puts' bound instead, when not 0 (late past a hold) */
};

struct simnet;
struct simnet *simnet_new(uint64_t seed, const struct simnet_faults *f);
void simnet_free(struct simnet *n);
extern const struct kvf_transport_ops simnet_transport;

uint64_t simnet_now(const struct simnet *n);
void simnet_set_now(struct simnet *n, uint64_t now_ms);
/* A random number in [lo, hi] from the world's generator. */
uint64_t simnet_rand(struct simnet *n, uint64_t lo, uint64_t hi);

/* Resets every connection of x's (a link fault; both sides fail after a delay). */
void simnet_reset(kvf_xport_t *x);
/* The process owning x dies: its unsent bytes are lost, what it had handed to the kernel still
 * arrives, then its peers see the end of the stream. x itself stays until destroyed. */
void simnet_kill(kvf_xport_t *x);
/* The live transport listening on port, or NULL. */
kvf_xport_t *simnet_listener(struct simnet *n, uint16_t port);
/* A check of every page write as it is applied to a region (before its bytes are copied): x is
 * the transport that owns the region, off and len where the write goes, bytes what it carries,
 * sender_dead whether its writer was killed meanwhile. A non-zero return is a violation: the
 * write is still applied (the world goes on as the real one would), and the first message is
 * kept for simnet_violation. */
typedef int simnet_land_fn(void *ctx, kvf_xport_t *x, uint64_t off, const void *bytes, size_t len,
                           bool sender_dead, char *why, size_t why_len);
void simnet_set_land_check(struct simnet *n, simnet_land_fn *fn, void *ctx);
/* A check of every put's source (sim_loops.c's L8): fn names what src is at that
 * moment — an identity such as the tag of the source page while its job holds it, 0 for a source
 * it does not watch, or a value no holder gives (a freed page) — and is called when the put is
 * posted and again when its bytes are read from the source (its local completion). A watched
 * source whose identity changed between the two is a violation (kept for simnet_violation): the
 * put read a source page its job had let go. */
typedef uint64_t simnet_src_fn(void *ctx, const void *src, size_t len);
void simnet_set_src_check(struct simnet *n, simnet_src_fn *fn, void *ctx);
/* The first violation a land or source check reported, or NULL. */
const char *simnet_violation(const struct simnet *n);
/* Counters, for the report. */
struct simnet_stats {
    uint64_t frames, puts, put_bytes, flushes, acks_lost, resets, late, applied_after_kill;
};
void simnet_stats(const struct simnet *n, struct simnet_stats *out);

#endif
