/*
 * kvfence/limits.h — the numeric bounds of every sampling field that travels from the HTTP API
 * to the workers, in one table.
 *
 * The API's validation (src/server/request.c) refuses a value outside its field's range with a
 * 400 naming the field and the range, and the handoff codec (src/proto/codec.c) refuses a frame
 * carrying one: both read this table, so every value the API accepts is one the codec carries
 * (test_server_http's limits property test sends each field at and past its extremes through the
 * server and the codec).
 *
 *   field        API name(s)                       range (API)              on the wire
 *   temperature  temperature                       [0, 1e6], finite         f32, same range
 *   top_p        top_p                             (0, 1]                   f32, [0, 1] (0: no cut)
 *   top_k        top_k                             [-1, 2^32-1] integer     u32 (-1 as 0)
 *   logprobs     logprobs (completions),           [0, 20] integer          low byte of a u32
 *                top_logprobs (chat)
 *   seed         seed                              [-2^63, 2^63-1] integer  u64 (two's complement)
 *   min_p        min_p                             [0, 1]                   f32, same range
 *   presence_penalty, frequency_penalty            [-2, 2]                  f32, same range
 *   repetition_penalty repetition_penalty          (0, 1e6]                 f32, [0, 1e6] (0: off)
 *
 * top_k also takes -1 (vLLM's "off"), carried as 0. logit_bias, an object, is checked apart:
 * at most KVF_GEN_MAX_LOGIT_BIAS entries, each a token id (as a string) below n_vocab with a bias
 * in [-KVF_LIMIT_LOGIT_BIAS_MAX, KVF_LIMIT_LOGIT_BIAS_MAX].
 *
 * A real value is carried as the nearest f32: the API rounds it so, except that a positive top_p
 * below the smallest normal f32 is carried as that (never as 0, which would mean no cut), and a
 * positive temperature that rounds to 0 is greedy, as it would be in effect.
 */
#ifndef KVFENCE_LIMITS_H
#define KVFENCE_LIMITS_H

#include <stdbool.h>
#include <stdint.h>

#define KVF_LIMIT_TEMPERATURE_MAX 1e6
#define KVF_LIMIT_LOGPROBS_MAX    20
#define KVF_LIMIT_PENALTY_MAX     2.0
#define KVF_LIMIT_REPETITION_MAX  1e6
#define KVF_LIMIT_LOGIT_BIAS_MAX  100.0f

enum kvf_field {
    KVF_FIELD_TEMPERATURE = 0,
    KVF_FIELD_TOP_P,
    KVF_FIELD_TOP_K,
    KVF_FIELD_LOGPROBS,
    KVF_FIELD_SEED,
    KVF_FIELD_MIN_P,
    KVF_FIELD_PRESENCE_PENALTY,
    KVF_FIELD_FREQUENCY_PENALTY,
    KVF_FIELD_REPETITION_PENALTY,
    KVF_FIELD__COUNT
};

struct kvf_field_limit {
    const char *name; /* the field as the API spells it (logprobs: the completions name) */
    bool integer;     /* an integer field: ilo, ihi; else a finite real: lo, hi */
    double lo, hi;    /* real fields: the range, closed at hi */
    bool lo_open;     /* real fields: lo itself is refused by the API (the wire takes it) */
    int64_t ilo;      /* integer fields: the range, closed */
    uint64_t ihi;
};

/* [KVF_FIELD__COUNT], in enum order. */
extern const struct kvf_field_limit kvf_field_limits[KVF_FIELD__COUNT];

/* Whether the real v is within field f's range: as the API takes it (wire false: lo_open
 * honoured) or as the codec does (wire true: lo taken). NaN and infinities never are. */
bool kvf_field_real_ok(enum kvf_field f, double v, bool wire);

/* Whether the integer v is within field f's range (v as signed when ilo < 0). */
bool kvf_field_int_ok(enum kvf_field f, int64_t v);

#endif /* KVFENCE_LIMITS_H */
