/*
 * sim.h — the deterministic handoff simulator: one decode worker with a real page pool and the
 * real decode machine, prefill workers running the real prefill machine, a network that drops,
 * delays, reorders, duplicates and partitions, peers that crash, restart, hang and resume, and
 * one-sided writes that land at any later time until their writer is fenced. One thread, a
 * seeded PRNG and a virtual clock: a seed replays exactly.
 */
#ifndef KVF_SIM_H
#define KVF_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct sim_result {
    bool ok;
    char why[512];        /* the first invariant that failed */
    uint64_t steps;       /* events processed */
    uint64_t end_ms;      /* virtual time at quiescence */
    uint32_t committed, failed, fences, quarantines;
    uint32_t stale;       /* messages the decode machine ignored as stale, duplicate or unknown */
};

/* Runs one seed. trace, when non-NULL, receives a readable line per event. */
void sim_run(uint64_t seed, FILE *trace, struct sim_result *out);

#endif
