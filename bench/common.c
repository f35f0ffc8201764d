#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kvfence/parse.h"

uint64_t kvf_bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kvf_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

int kvf_bench_ulong_arg(const char *bench, const char *opt, const char *v, unsigned long most,
                        unsigned long *dst)
{
    uint64_t x;
    if (kvf_parse_u64(v, 1, most, &x) < 0) {
        fprintf(stderr, "kvfence bench %s: bad value '%s' for %s (1 to %lu)\n", bench, v, opt,
                most);
        return 2;
    }
    *dst = (unsigned long)x;
    return 0;
}

int kvf_bench_kv_type_arg(const char *bench, const char *v, uint32_t *elem_bytes)
{
    if (strcmp(v, "f32") == 0)
        *elem_bytes = 4;
    else if (strcmp(v, "f16") == 0)
        *elem_bytes = 2;
    else {
        fprintf(stderr, "kvfence bench %s: --kv-type is f32 or f16, not '%s'\n", bench, v);
        return 2;
    }
    return 0;
}

int kvf_bench_opt(int argc, char **argv, int *i, void (*usage)(FILE *), const char **opt,
                  const char **val)
{
    const char *a = argv[*i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (*i + 1 >= argc) {
        usage(stderr);
        return 2;
    }
    *opt = a;
    *val = argv[++*i];
    return 1;
}
