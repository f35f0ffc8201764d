/* parse.c — the number parser of kvfence/parse.h. */
#include "kvfence/parse.h"

#include <errno.h>
#include <stdlib.h>

int kvf_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *end) return -EINVAL;
    if (errno == ERANGE || x < lo || x > hi) return -ERANGE;
    *out = (uint64_t)x;
    return 0;
}
