/*
 * kvfence/parse.h — the one number parser: a decimal option, header or setting value read
 * whole, or refused.
 *
 * Every place that reads a number from text a person or a peer wrote (command-line options,
 * the benchmarks' options) reads it here, so that all of them refuse the same things: nothing,
 * anything after the digits, a value past 2^64-1, a value outside the caller's range.
 */
#ifndef KVFENCE_PARSE_H
#define KVFENCE_PARSE_H

#include <stdint.h>

/*
 * Reads the NUL-terminated s as a decimal integer in [lo, hi]. The digits are read as strtoull
 * reads them in base 10: leading white space and one sign are taken, and a '-' negates modulo
 * 2^64 (so "-0" is 0, and "-1" is 2^64-1, in range only when hi is UINT64_MAX).
 *
 * Returns 0 with *out set; -EINVAL when s holds no digits (empty, white space only, a sign
 * alone, not a number) or anything after them; -ERANGE when the number is past 2^64-1 or
 * outside [lo, hi]. On failure *out is untouched. Work: O(strlen(s)), no allocation.
 */
int kvf_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);

#endif /* KVFENCE_PARSE_H */
