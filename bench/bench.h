/* bench.h — benchmarks run by `kvfence bench <name>`. Each takes the arguments after
 * `bench` (argv[0] is its name), prints its figures, ends with a `result bench=<name> ...`
 * line, and returns an exit status. */
#ifndef KVF_BENCH_H
#define KVF_BENCH_H

#include <stdint.h>

int kvf_bench_pool(int argc, char **argv);
int kvf_bench_model(int argc, char **argv);
int kvf_bench_attention(int argc, char **argv);

/* Monotonic time in nanoseconds. */
uint64_t kvf_bench_now_ns(void);
/* Sorts v[0..n) and returns its median. */
double kvf_bench_median(double *v, int n);

#endif
