/* limits.c — the table of kvfence/limits.h and its two checks. */
#include "kvfence/limits.h"

#include <math.h>

const struct kvf_field_limit kvf_field_limits[KVF_FIELD__COUNT] = {
    [KVF_FIELD_TEMPERATURE] = {.name = "temperature", .lo = 0, .hi = KVF_LIMIT_TEMPERATURE_MAX},
    [KVF_FIELD_TOP_P] = {.name = "top_p", .lo = 0, .hi = 1, .lo_open = true},
    [KVF_FIELD_TOP_K] = {.name = "top_k", .integer = true, .ilo = -1, .ihi = UINT32_MAX},
    [KVF_FIELD_LOGPROBS] = {.name = "logprobs",
                            .integer = true,
                            .ilo = 0,
                            .ihi = KVF_LIMIT_LOGPROBS_MAX},
    [KVF_FIELD_SEED] = {.name = "seed", .integer = true, .ilo = INT64_MIN, .ihi = INT64_MAX},
    [KVF_FIELD_MIN_P] = {.name = "min_p", .lo = 0, .hi = 1},
    [KVF_FIELD_PRESENCE_PENALTY] = {.name = "presence_penalty",
                                    .lo = -KVF_LIMIT_PENALTY_MAX,
                                    .hi = KVF_LIMIT_PENALTY_MAX},
    [KVF_FIELD_FREQUENCY_PENALTY] = {.name = "frequency_penalty",
                                     .lo = -KVF_LIMIT_PENALTY_MAX,
                                     .hi = KVF_LIMIT_PENALTY_MAX},
    [KVF_FIELD_REPETITION_PENALTY] = {.name = "repetition_penalty",
                                      .lo = 0,
                                      .hi = KVF_LIMIT_REPETITION_MAX,
                                      .lo_open = true},
};

bool kvf_field_real_ok(enum kvf_field f, double v, bool wire)
{
    const struct kvf_field_limit *l = &kvf_field_limits[f];
    if (!isfinite(v) || v > l->hi) return false;
    return l->lo_open && !wire ? v > l->lo : v >= l->lo;
}

bool kvf_field_int_ok(enum kvf_field f, int64_t v)
{
    const struct kvf_field_limit *l = &kvf_field_limits[f];
    if (v < l->ilo) return false;
    return v < 0 || (uint64_t)v <= l->ihi;
}
