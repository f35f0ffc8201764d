/*
 * sim_main.c — the simulator's runner.
 *
 *   test_sim                      seeds 1..KVF_SIM_SEEDS (default 200000; KVF_SOAK=1: 2000000)
 *   test_sim --first S --count N  seeds S..S+N-1
 *   test_sim --seed S             seed S alone, with its full event trace
 *   --config standard|pressured   the world's shape (sim.h; default standard)
 *   --checks all|invariants|content  every check (default); I1..I8 without the pool's and the
 *                                 machines' own checkers; or I1 alone (sim.h, checks)
 *   --unverified 1                decode commits pages unread, no byte flipped (sim.h, unverified)
 *
 * The run stops at the first seed that breaks an invariant, prints "FAIL seed S: why" and then
 * replays that seed with its trace, so the failure reads as a sequence of events. It prints the
 * seeds run per second.
 */
#include <time.h>

#include "kvf_test.h"
#include "sim.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The configuration named by --config and --checks; exits on a name it does not know. */
static struct sim_config config(void)
{
    const char *name = kvf_test_arg("--config"), *checks = kvf_test_arg("--checks");
    struct sim_config cfg = sim_standard;
    if (name && strcmp(name, "pressured") == 0)
        cfg = sim_pressured;
    else if (name && strcmp(name, "standard") != 0)
        KVF_FAIL("unknown --config %s (standard, pressured)", name);
    if (checks && strcmp(checks, "content") == 0)
        cfg.checks = SIM_CHECK_CONTENT;
    else if (checks && strcmp(checks, "invariants") == 0)
        cfg.checks = SIM_CHECK_INVARIANTS;
    else if (checks && strcmp(checks, "all") != 0)
        KVF_FAIL("unknown --checks %s (all, invariants, content)", checks);
    const char *unv = kvf_test_arg("--unverified");
    if (unv && strcmp(unv, "1") == 0) {
#if !defined(KVF_TEST_BUILD)
        KVF_FAIL(
            "--unverified 1 needs a test build (KVF_TEST_BUILD): here it would change nothing");
#endif
        cfg.unverified = true;
    } else if (unv && strcmp(unv, "0") != 0) {
        KVF_FAIL("unknown --unverified %s (0, 1)", unv);
    }
    return cfg;
}

static void test_sim_seeds(void)
{
    struct sim_result r;
    struct sim_config cfg = config();
    static const char *const check_names[] = {"all", "invariants", "content"};
    printf("# configuration %s, checks %s%s\n", cfg.name, check_names[cfg.checks],
           cfg.unverified ? ", unverified" : "");
    if (kvf_test_seed_given()) {
        uint64_t seed = kvf_test_seed();
        sim_run(&cfg, seed, stdout, &r);
        printf("# seed %" PRIu64 ": %s%s (%" PRIu64 " steps, %" PRIu64 " ms virtual)\n", seed,
               r.ok ? "ok" : "FAIL: ", r.ok ? "" : r.why, r.steps, r.end_ms);
        ASSERT_TRUE(r.ok);
        return;
    }
    const char *f = kvf_test_arg("--first"), *c = kvf_test_arg("--count");
    const char *env = getenv("KVF_SIM_SEEDS"), *soak = getenv("KVF_SOAK");
    uint64_t first = f ? strtoull(f, NULL, 0) : 1;
    uint64_t count = c      ? strtoull(c, NULL, 0)
                     : env  ? strtoull(env, NULL, 0)
                     : soak ? 2000000
                            : 200000;
    uint64_t steps = 0, committed = 0, failed = 0, fences = 0, quarantines = 0, stale = 0,
             outlived = 0;
    double t0 = now_s();
    for (uint64_t s = first; s < first + count; s++) {
        sim_run(&cfg, s, NULL, &r);
        steps += r.steps;
        committed += r.committed;
        failed += r.failed;
        fences += r.fences;
        quarantines += r.quarantines;
        stale += r.stale;
        outlived += r.outlived;
        if (!r.ok) {
            printf("FAIL seed %" PRIu64
                   ": %s\n# replay: test_sim --config %s --checks %s%s --seed %" PRIu64
                   "\n# trace:\n",
                   s, r.why, cfg.name, check_names[cfg.checks],
                   cfg.unverified ? " --unverified 1" : "", s);
            fflush(stdout);
            sim_run(&cfg, s, stdout, &r);
            fflush(stdout);
            KVF_FAIL("seed %" PRIu64 " broke an invariant", s);
        }
    }
    double dt = now_s() - t0;
    printf("# %" PRIu64 " seeds (%" PRIu64 "..%" PRIu64 ") in %.1f s: %.0f seeds/s, %" PRIu64
           " steps; requests committed %" PRIu64 ", failed cleanly %" PRIu64
           "; quarantines %" PRIu64 ", fences %" PRIu64 "; stale messages ignored %" PRIu64
           "; committed after outliving the "
           "no-progress bound %" PRIu64 "\n",
           count, first, first + count - 1, dt, count / (dt > 0 ? dt : 1), steps, committed, failed,
           quarantines, fences, stale, outlived);
    /* The runs must reach the paths that matter, or the invariants prove little: in every
     * configuration, most seeds commit (a run whose requests all fail reads nothing, and its
     * content check can pass whatever the code does) and prompts outlive the no-progress bound. */
    if (count >= 1000) {
        ASSERT_TRUE(committed >= count / 2);
        ASSERT_TRUE(outlived > 0);
    }
    if (count >= 1000 && cfg.checks == SIM_CHECK_ALL) {
        ASSERT_TRUE(committed > 0);
        ASSERT_TRUE(failed > 0);
        ASSERT_TRUE(quarantines > 0);
        ASSERT_TRUE(fences > 0);
        ASSERT_TRUE(stale > 0);
    }
}

static const struct kvf_test_case cases[] = {KVF_CASE(test_sim_seeds)};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
