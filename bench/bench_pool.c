/* Placeholder until the pool benchmark lands. */
#include <stdio.h>

#include "bench.h"

int kvf_bench_pool(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvfence bench pool: not available in this build yet\n");
    return 1;
}
