/*
 * kvfence/utf8.h — the one UTF-8 validator: what a well-formed sequence is, for the HTTP
 * server's body scan, the tokenizer's input check and its streaming detokenizer, and the
 * template interpreter.
 *
 * Well-formed is Unicode's Table 3-7: the shortest form only (no overlong sequence), no
 * surrogate (U+D800..U+DFFF), nothing past U+10FFFF, no stray continuation byte, no sequence
 * cut short. NUL is a character like any other here; callers that refuse it say so.
 *
 *   lead byte   second byte   then
 *   00..7F      -             -
 *   C2..DF      80..BF        -
 *   E0          A0..BF        80..BF
 *   E1..EC      80..BF        80..BF
 *   ED          80..9F        80..BF
 *   EE..EF      80..BF        80..BF
 *   F0          90..BF        80..BF 80..BF
 *   F1..F3      80..BF        80..BF 80..BF
 *   F4          80..8F        80..BF 80..BF
 *
 * Every function is O(bytes looked at), allocates nothing and never reads past s[n - 1].
 */
#ifndef KVFENCE_UTF8_H
#define KVFENCE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The length (1..4) a sequence starting with lead byte b must have, or 0 if b cannot start
 * one (80..C1, F5..FF). For a decoder fed one byte at a time. */
size_t kvf_utf8_lead_len(uint8_t b);

/* Whether b may follow `lead` as a sequence's second byte (the table's second column). Every
 * later byte is any of 80..BF. */
bool kvf_utf8_second_ok(uint8_t lead, uint8_t b);

/* The length (1..4) of the well-formed sequence at s[0..n), or 0 if none starts there
 * (n == 0 included). */
size_t kvf_utf8_seq_len(const uint8_t *s, size_t n);

/* kvf_utf8_seq_len, and the sequence's code point into *cp when it is one (*cp is untouched
 * when 0 is returned). */
size_t kvf_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);

/* Whether s[0..n) is a run of well-formed sequences (true for n == 0). */
bool kvf_utf8_valid(const char *s, size_t n);

#endif /* KVFENCE_UTF8_H */
