/* bench.h — benchmarks run by `kvfence bench <name>`. Each takes the arguments after
 * `bench` (argv[0] is its name), prints its figures, ends with a `result bench=<name> ...`
 * line, and returns an exit status. */
#ifndef KVF_BENCH_H
#define KVF_BENCH_H

#include <stdint.h>
#include <stdio.h>

int kvf_bench_pool(int argc, char **argv);
int kvf_bench_model(int argc, char **argv);
int kvf_bench_attention(int argc, char **argv);
int kvf_bench_handoff(int argc, char **argv);
int kvf_bench_serve(int argc, char **argv);

/* Monotonic time in nanoseconds. */
uint64_t kvf_bench_now_ns(void);
/* Sorts v[0..n) and returns its median. */
double kvf_bench_median(double *v, int n);
/* The option at argv[*i] and its value, for a benchmark's parser: 1 with *opt and *val set and
 * *i moved to the value; 0 after printing usage to stdout for --help or -h; 2 (the exit status)
 * after printing it to stderr when the value is missing. */
int kvf_bench_opt(int argc, char **argv, int *i, void (*usage)(FILE *), const char **opt,
                  const char **val);
/* *dst = v, a decimal in [1, most], for option opt of benchmark bench: 0, or 2 (the exit
 * status) after saying on stderr what is wrong. */
int kvf_bench_ulong_arg(const char *bench, const char *opt, const char *v, unsigned long most,
                        unsigned long *dst);
/* *elem_bytes = 4 for "f32", 2 for "f16" (--kv-type): 0, or 2 after saying what is wrong. */
int kvf_bench_kv_type_arg(const char *bench, const char *v, uint32_t *elem_bytes);

#endif
