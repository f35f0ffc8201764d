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
    char why[512];   /* the first invariant that failed */
    uint64_t steps;  /* events processed */
    uint64_t end_ms; /* virtual time at quiescence */
    uint32_t committed, failed, fences, quarantines;
    uint32_t stale;    /* messages the decode machine ignored as stale, duplicate or unknown */
    uint32_t outlived; /* requests committed later than the no-progress bound after their
                          submission: their grants lived by PROGRESS */
};

/*
 * A world's shape. Two are run by the tests:
 *
 * - sim_standard: 24 pages, requests that finish within 100 ms of their first token — every
 *   fault, message and timing path, many seeds.
 * - sim_pressured: 12 pages, requests that run for up to 8 s after their first token, arrivals
 *   spread over 8 s, and puts that often land late: a freed page is reused while a late write to
 *   it is still pending, so a write-after-free overwrites another request's KV while that request
 *   still reads it — the stamp check (I1) sees it (H1: "B's canary survives A's late write").
 *
 * `checks` chooses what can fail a run: every check (the tests run both configurations so);
 * the invariants I1..I8 without the pool's and both machines' own checkers; or I1 alone, the
 * content check — a run then fails only when a request reads a slot that was not written for
 * it, which measures what the content check catches by itself (scripts/mutants.sh's content
 * column).
 */
enum sim_checks { SIM_CHECK_ALL, SIM_CHECK_INVARIANTS, SIM_CHECK_CONTENT };
struct sim_config {
    const char *name;
    uint32_t n_pages;          /* pool size */
    uint32_t max_prompt;       /* prompt tokens drawn in [1, max_prompt] */
    uint32_t submit_window_ms; /* arrivals drawn in [0, submit_window_ms] */
    uint32_t finish_max_ms;    /* a committed request finishes 1..finish_max_ms after commit */
    double p_late_msg;         /* in lossy weather: chance a message arrives 100..1500 ms late */
    double p_late_put;         /* chance a put lands 100..late_put_max_ms after it is posted */
    uint32_t late_put_max_ms;
    enum sim_checks checks;
    /* Decode commits what arrives unread (the decode machine's test_unverified: no count,
     * trailer or checksum check), no landed byte is flipped and no count is forged (only those
     * checks would see them): what then reaches a committed request is what the page lifetime
     * rules alone let through. The mutants' content column runs the mutants those checks would
     * otherwise stop (scripts/mutants.sh). Test builds only. */
    bool unverified;
};
extern const struct sim_config sim_standard, sim_pressured;

/* Runs one seed of `cfg`. trace, when non-NULL, receives a readable line per event. */
void sim_run(const struct sim_config *cfg, uint64_t seed, FILE *trace, struct sim_result *out);

#endif
