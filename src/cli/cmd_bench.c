/* `kvfence bench <name> [options]`: runs one benchmark. Each prints its figures and, as its
 * last line, `result bench=<name> key=value ...` so scripts can read it. */
#include <stdio.h>
#include <string.h>

#include "../../bench/bench.h"
#include "cli.h"
#include "kvfence/common.h"

static const struct kvf_cmd benches[] = {
    {"pool", "page pool: ns per alloc+release pair, ns per reader tag check", kvf_bench_pool},
    {"model", "forward pass: prefill and decode tokens/s, decode vs the bandwidth roofline",
     kvf_bench_model},
    {"attention", "a decode step's attention alone over K/V in pool pages: ms, GB/s, GMAC/s",
     kvf_bench_attention},
    {"handoff",
     "two processes over the fabric: page-handoff GB/s and the one-page round trip, "
     "beside ucx_perftest",
     kvf_bench_handoff},
    {"serve", "closed-loop HTTP load on a running server: tok/s, TTFT and TPOT percentiles",
     kvf_bench_serve},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvfence bench <name> [options]\n\nbenchmarks:\n");
    for (size_t i = 0; i < KVF_ARRAY_LEN(benches); i++)
        fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].summary);
    fprintf(f, "\nEach prints a median over repeated runs; the last line is `result bench=...`.\n");
}

int kvf_cmd_bench(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < KVF_ARRAY_LEN(benches); i++)
        if (strcmp(argv[1], benches[i].name) == 0) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvfence bench: unknown benchmark '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
