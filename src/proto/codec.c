/*
 * codec.c — the handoff protocol's binary encoding (see the wire table in kvfence/proto.h).
 *
 * The decoder is written for hostile input: it reads only through bounds-checked cursor helpers,
 * checks every count against its protocol bound and the caller's scratch room before reading the
 * array, and requires the declared frame length to equal exactly what the body needs. It never
 * allocates. Work is O(frame length).
 */
#include "kvfence/proto.h"

#include <string.h>

#include "kvfence/limits.h"

_Static_assert(KVF_LIMIT_LOGPROBS_MAX <= KVF_PROTO_MAX_LOGPROBS,
               "a DONE carries every top logprob the API may ask for");
_Static_assert(KVF_LIMIT_LOGPROBS_MAX <= 0xff, "n_logprobs travels in one byte");

/* Little-endian stores and loads, byte by byte, so host order and alignment never matter. */
static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_f32(uint8_t *p, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(p, u);
}

static float get_f32(const uint8_t *p)
{
    uint32_t u = get_u32(p);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* The sampling block's fixed part; its logit_bias pairs follow it (put_bias). */
static void put_sampling(uint8_t *p, const struct kvf_msg_sampling *s)
{
    put_f32(p, s->temperature);
    put_f32(p + 4, s->top_p);
    put_u32(p + 8, s->top_k);
    /* n_logprobs in the low byte, want_logprob in bit 8. */
    put_u32(p + 12, s->n_logprobs | (s->want_logprob ? 0x100u : 0u));
    put_u64(p + 16, s->seed);
    put_f32(p + 24, s->min_p);
    put_f32(p + 28, s->presence_penalty);
    put_f32(p + 32, s->frequency_penalty);
    put_f32(p + 36, s->repetition_penalty);
    put_u32(p + 40, s->n_logit_bias);
    put_u32(p + 44, s->grammar ? s->n_grammar : 0);
}

/* The logit_bias pairs (id u32, bias f32); returns the bytes written. */
static size_t put_bias(uint8_t *p, const struct kvf_msg_sampling *s)
{
    for (uint32_t i = 0; i < s->n_logit_bias; i++) {
        put_u32(p + 8 * i, (uint32_t)s->logit_bias[i].id);
        put_f32(p + 4 + 8 * i, s->logit_bias[i].bias);
    }
    p += 8u * s->n_logit_bias;
    uint32_t ng = s->grammar ? s->n_grammar : 0;
    if (ng) memcpy(p, s->grammar, ng);
    return 8u * s->n_logit_bias + ng;
}

/* Refuses what no well-formed peer sends: a temperature, top_p, logprobs count, min_p or penalty
 * outside its range in kvfence/limits.h — the table the HTTP API validates with, so nothing it
 * accepts is refused here — or more logit_bias pairs than the bound. */
static int get_sampling(const uint8_t *p, struct kvf_msg_sampling *s)
{
    s->temperature = get_f32(p);
    s->top_p = get_f32(p + 4);
    s->top_k = get_u32(p + 8);
    uint32_t lp = get_u32(p + 12);
    s->n_logprobs = lp & 0xffu;
    s->want_logprob = (lp >> 8) & 1u;
    s->seed = get_u64(p + 16);
    s->min_p = get_f32(p + 24);
    s->presence_penalty = get_f32(p + 28);
    s->frequency_penalty = get_f32(p + 32);
    s->repetition_penalty = get_f32(p + 36);
    s->n_logit_bias = get_u32(p + 40);
    s->n_grammar = get_u32(p + 44);
    s->grammar = NULL;
    if (lp >> 9 || s->n_logit_bias > KVF_GEN_MAX_LOGIT_BIAS || s->n_grammar > KVF_GEN_MAX_GRAMMAR)
        return KVF_E_PROTO_BOUNDS;
    if (!kvf_field_real_ok(KVF_FIELD_TEMPERATURE, s->temperature, true) ||
        !kvf_field_real_ok(KVF_FIELD_TOP_P, s->top_p, true) ||
        !kvf_field_int_ok(KVF_FIELD_LOGPROBS, s->n_logprobs) ||
        !kvf_field_int_ok(KVF_FIELD_TOP_K, s->top_k) ||
        !kvf_field_real_ok(KVF_FIELD_MIN_P, s->min_p, true) ||
        !kvf_field_real_ok(KVF_FIELD_PRESENCE_PENALTY, s->presence_penalty, true) ||
        !kvf_field_real_ok(KVF_FIELD_FREQUENCY_PENALTY, s->frequency_penalty, true) ||
        !kvf_field_real_ok(KVF_FIELD_REPETITION_PENALTY, s->repetition_penalty, true))
        return KVF_E_PROTO_BOUNDS;
    return 0;
}

/* The n_logit_bias pairs at p (the frame's length already checked to hold them): ids ascending
 * (so distinct, one encoding per set), each bias within [-100, 100]. */
static int get_bias(const uint8_t *p, struct kvf_msg_sampling *s)
{
    for (uint32_t i = 0; i < s->n_logit_bias; i++) {
        uint32_t id = get_u32(p + 8 * i);
        float b = get_f32(p + 4 + 8 * i);
        if (id > INT32_MAX || (i > 0 && id <= (uint32_t)s->logit_bias[i - 1].id) ||
            !(b >= -KVF_LIMIT_LOGIT_BIAS_MAX && b <= KVF_LIMIT_LOGIT_BIAS_MAX))
            return KVF_E_PROTO_BOUNDS;
        s->logit_bias[i] = (struct kvf_logit_bias){(int32_t)id, b};
    }
    if (s->n_grammar) s->grammar = (const char *)p + 8u * s->n_logit_bias;
    return 0;
}

/* The grammar bytes a sampling block carries. */
static uint32_t grammar_bytes(const struct kvf_msg_sampling *s)
{
    return s->grammar ? s->n_grammar : 0;
}

/* Fixed body bytes per type, before any array. */
enum {
    HELLO_BODY =
        8 + 5 * 4 + 4 + 4 + 2 + 1 + 1, /* fp, geometry, max_context, max_pages, peer, role, pad */
    SAMPLING_BYTES = KVF_PROTO_SAMPLING_FIXED_BYTES, /* see kvfence/proto.h */
    NEW_BODY = 4 * 4 + SAMPLING_BYTES,   /* tenant, prompt_len, max_tokens, n_tokens, sampling */
    GRANT_BODY = 4 * 4 + SAMPLING_BYTES, /* tenant, expected, n_pages, n_tokens, sampling */
    FIRST_LP_BYTES = 4 + 4 + 8 * KVF_PROTO_MAX_LOGPROBS, /* logprob, n_top, (id, logprob) × 20 */
    DONE_BODY = 3 * 4 + FIRST_LP_BYTES, /* tokens_written, first_token, n_pages, logprobs */
    REASON_BODY = 4,
    PROGRESS_BODY = 2 * 4, /* tokens_done, pages_posted */
    PAGE_REF_BYTES = 12,   /* page u32, tag u64 */
};

const char *kvf_msg_type_name(int type)
{
    switch (type) {
    case KVF_MSG_HELLO:
        return "KVF_MSG_HELLO";
    case KVF_MSG_NEW:
        return "KVF_MSG_NEW";
    case KVF_MSG_GRANT:
        return "KVF_MSG_GRANT";
    case KVF_MSG_DONE:
        return "KVF_MSG_DONE";
    case KVF_MSG_CANCEL:
        return "KVF_MSG_CANCEL";
    case KVF_MSG_CANCEL_ACK:
        return "KVF_MSG_CANCEL_ACK";
    case KVF_MSG_REJECT:
        return "KVF_MSG_REJECT";
    case KVF_MSG_FAIL:
        return "KVF_MSG_FAIL";
    case KVF_MSG_PROGRESS:
        return "KVF_MSG_PROGRESS";
    default:
        return "?";
    }
}

/* Body bytes of m, or a negative code. Every product below is of values already bounded, so
 * none can overflow a long (the largest is KVF_PROTO_MAX_MSG_BYTES, about 4.8 MiB). */
static long body_size(const struct kvf_msg *m)
{
    switch (m->type) {
    case KVF_MSG_HELLO:
        return HELLO_BODY;
    case KVF_MSG_NEW:
        if (m->u.nreq.n_tokens > KVF_PROTO_MAX_TOKENS ||
            m->u.nreq.sampling.n_logit_bias > KVF_GEN_MAX_LOGIT_BIAS ||
            grammar_bytes(&m->u.nreq.sampling) > KVF_GEN_MAX_GRAMMAR)
            return KVF_E_PROTO_BOUNDS;
        if (m->u.nreq.n_tokens && !m->u.nreq.tokens) return KVF_E_PROTO_BOUNDS;
        return NEW_BODY + 8L * m->u.nreq.sampling.n_logit_bias +
               (long)grammar_bytes(&m->u.nreq.sampling) + 4L * m->u.nreq.n_tokens;
    case KVF_MSG_GRANT:
        if (m->u.grant.n_pages > KVF_PROTO_MAX_PAGES ||
            m->u.grant.n_tokens > KVF_PROTO_MAX_TOKENS ||
            m->u.grant.sampling.n_logit_bias > KVF_GEN_MAX_LOGIT_BIAS ||
            grammar_bytes(&m->u.grant.sampling) > KVF_GEN_MAX_GRAMMAR)
            return KVF_E_PROTO_BOUNDS;
        if ((m->u.grant.n_pages && !m->u.grant.pages) ||
            (m->u.grant.n_tokens && !m->u.grant.tokens))
            return KVF_E_PROTO_BOUNDS;
        return GRANT_BODY + 8L * m->u.grant.sampling.n_logit_bias +
               (long)grammar_bytes(&m->u.grant.sampling) +
               (long)PAGE_REF_BYTES * m->u.grant.n_pages + 4L * m->u.grant.n_tokens;
    case KVF_MSG_DONE:
        if (m->u.done.n_pages > KVF_PROTO_MAX_PAGES) return KVF_E_PROTO_BOUNDS;
        if (m->u.done.n_pages && !m->u.done.checksums) return KVF_E_PROTO_BOUNDS;
        return DONE_BODY + 8L * m->u.done.n_pages;
    case KVF_MSG_CANCEL:
    case KVF_MSG_CANCEL_ACK:
    case KVF_MSG_REJECT:
    case KVF_MSG_FAIL:
        return REASON_BODY;
    case KVF_MSG_PROGRESS:
        return PROGRESS_BODY;
    default:
        return KVF_E_PROTO_TYPE;
    }
}

long kvf_msg_encoded_size(const struct kvf_msg *m)
{
    long b = body_size(m);
    return b < 0 ? b : (long)KVF_PROTO_HEADER_BYTES + b;
}

long kvf_msg_encode(const struct kvf_msg *m, uint8_t *buf, size_t cap)
{
    long total = kvf_msg_encoded_size(m);
    if (total < 0) return total;
    if ((size_t)total > cap) return -ENOSPC;

    uint8_t *p = buf;
    put_u16(p, KVF_PROTO_VERSION);
    p[2] = (uint8_t)m->type;
    p[3] = 0;
    put_u32(p + 4, (uint32_t)total);
    put_u64(p + 8, m->req.lo);
    put_u64(p + 16, m->req.hi);
    put_u64(p + 24, m->nonce);
    put_u32(p + 32, m->epoch);
    put_u32(p + 36, 0);
    p += KVF_PROTO_HEADER_BYTES;

    switch (m->type) {
    case KVF_MSG_HELLO: {
        const struct kvf_msg_hello *h = &m->u.hello;
        put_u64(p, h->model_fp);
        put_u32(p + 8, h->geo.n_layers);
        put_u32(p + 12, h->geo.n_kv_heads);
        put_u32(p + 16, h->geo.head_dim);
        put_u32(p + 20, h->geo.page_tokens);
        put_u32(p + 24, h->geo.elem_bytes);
        put_u32(p + 28, h->max_context);
        put_u32(p + 32, h->max_grant_pages);
        put_u16(p + 36, h->peer);
        p[38] = h->role;
        p[39] = 0;
        break;
    }
    case KVF_MSG_NEW: {
        const struct kvf_msg_new *n = &m->u.nreq;
        put_u32(p, n->tenant);
        put_u32(p + 4, n->prompt_len);
        put_u32(p + 8, n->max_tokens);
        put_u32(p + 12, n->n_tokens);
        put_sampling(p + 16, &n->sampling);
        p += NEW_BODY;
        p += put_bias(p, &n->sampling);
        for (uint32_t i = 0; i < n->n_tokens; i++, p += 4)
            put_u32(p, n->tokens[i]);
        break;
    }
    case KVF_MSG_GRANT: {
        const struct kvf_msg_grant *g = &m->u.grant;
        put_u32(p, g->tenant);
        put_u32(p + 4, g->expected_tokens);
        put_u32(p + 8, g->n_pages);
        put_u32(p + 12, g->n_tokens);
        put_sampling(p + 16, &g->sampling);
        p += GRANT_BODY;
        p += put_bias(p, &g->sampling);
        for (uint32_t i = 0; i < g->n_pages; i++, p += PAGE_REF_BYTES) {
            put_u32(p, g->pages[i].page);
            put_u64(p + 4, g->pages[i].tag);
        }
        for (uint32_t i = 0; i < g->n_tokens; i++, p += 4)
            put_u32(p, g->tokens[i]);
        break;
    }
    case KVF_MSG_DONE: {
        const struct kvf_msg_done *d = &m->u.done;
        put_u32(p, d->tokens_written);
        put_u32(p + 4, d->first_token);
        put_u32(p + 8, d->n_pages);
        put_f32(p + 12, d->first_logprob);
        put_u32(p + 16, d->n_top);
        for (uint32_t i = 0; i < KVF_PROTO_MAX_LOGPROBS; i++) {
            bool on = i < d->n_top;
            put_u32(p + 20 + 8 * i, on ? d->top_ids[i] : 0);
            put_f32(p + 24 + 8 * i, on ? d->top_logprobs[i] : 0.0f);
        }
        p += DONE_BODY;
        for (uint32_t i = 0; i < d->n_pages; i++, p += 8)
            put_u64(p, d->checksums[i]);
        break;
    }
    case KVF_MSG_PROGRESS:
        put_u32(p, m->u.progress.tokens_done);
        put_u32(p + 4, m->u.progress.pages_posted);
        break;
    default:
        put_u32(p, (uint32_t)m->u.reason);
        break;
    }
    return total;
}

int kvf_msg_frame_len(const uint8_t *buf, size_t len, uint32_t *frame_len)
{
    if (len < KVF_PROTO_HEADER_BYTES) return KVF_E_PROTO_SHORT;
    if (get_u16(buf) != KVF_PROTO_VERSION) return KVF_E_PROTO_VERSION;
    if (buf[2] < KVF_MSG_HELLO || buf[2] >= KVF_MSG__END) return KVF_E_PROTO_TYPE;
    uint32_t n = get_u32(buf + 4);
    if (n < KVF_PROTO_HEADER_BYTES || n > KVF_PROTO_MAX_MSG_BYTES) return KVF_E_PROTO_BOUNDS;
    *frame_len = n;
    return 0;
}

/* Checks that a body of `have` bytes holds exactly `fixed` bytes plus `count` items of `item`
 * bytes, with count ≤ bound and ≤ room. The arithmetic is in uint64_t: count is a peer's
 * u32 and item ≤ 12, so nothing overflows. */
static int check_array(uint64_t have, uint64_t fixed, uint32_t count, uint32_t item, uint32_t bound,
                       uint32_t room)
{
    if (count > bound || count > room) return KVF_E_PROTO_BOUNDS;
    if (have != fixed + (uint64_t)count * item) return KVF_E_PROTO_BOUNDS;
    return 0;
}

long kvf_msg_decode(const uint8_t *buf, size_t len, struct kvf_msg *out,
                    const struct kvf_msg_scratch *scratch)
{
    static const struct kvf_msg_scratch none;
    const struct kvf_msg_scratch *s = scratch ? scratch : &none;
    uint32_t total;
    int rc = kvf_msg_frame_len(buf, len, &total);
    if (rc < 0) return rc;
    if (total > len) return KVF_E_PROTO_SHORT;
    if (buf[3] != 0 || get_u32(buf + 36) != 0) return KVF_E_PROTO_BOUNDS;

    memset(out, 0, sizeof(*out));
    out->type = (enum kvf_msg_type)buf[2];
    out->req.lo = get_u64(buf + 8);
    out->req.hi = get_u64(buf + 16);
    out->nonce = get_u64(buf + 24);
    out->epoch = get_u32(buf + 32);
    const uint8_t *p = buf + KVF_PROTO_HEADER_BYTES;
    uint64_t have = total - KVF_PROTO_HEADER_BYTES;

    switch (out->type) {
    case KVF_MSG_HELLO: {
        if (have != HELLO_BODY) return KVF_E_PROTO_BOUNDS;
        struct kvf_msg_hello *h = &out->u.hello;
        h->model_fp = get_u64(p);
        h->geo.n_layers = get_u32(p + 8);
        h->geo.n_kv_heads = get_u32(p + 12);
        h->geo.head_dim = get_u32(p + 16);
        h->geo.page_tokens = get_u32(p + 20);
        h->geo.elem_bytes = get_u32(p + 24);
        h->max_context = get_u32(p + 28);
        h->max_grant_pages = get_u32(p + 32);
        h->peer = get_u16(p + 36);
        h->role = p[38];
        if (p[39] != 0 || h->role < KVF_ROLE_ROUTER || h->role > KVF_ROLE_DECODE)
            return KVF_E_PROTO_BOUNDS;
        if (h->max_grant_pages > KVF_PROTO_MAX_PAGES) return KVF_E_PROTO_BOUNDS;
        break;
    }
    case KVF_MSG_NEW: {
        if (have < NEW_BODY) return KVF_E_PROTO_BOUNDS;
        struct kvf_msg_new *n = &out->u.nreq;
        n->tenant = get_u32(p);
        n->prompt_len = get_u32(p + 4);
        n->max_tokens = get_u32(p + 8);
        n->n_tokens = get_u32(p + 12);
        if ((rc = get_sampling(p + 16, &n->sampling)) < 0) return rc;
        uint64_t fixed = NEW_BODY + 8ull * n->sampling.n_logit_bias + n->sampling.n_grammar;
        if (have < fixed) return KVF_E_PROTO_BOUNDS;
        rc = check_array(have, fixed, n->n_tokens, 4, KVF_PROTO_MAX_TOKENS, s->tokens_cap);
        if (rc < 0) return rc;
        p += NEW_BODY;
        if ((rc = get_bias(p, &n->sampling)) < 0) return rc;
        p += 8u * n->sampling.n_logit_bias + n->sampling.n_grammar;
        for (uint32_t i = 0; i < n->n_tokens; i++, p += 4)
            s->tokens[i] = get_u32(p);
        n->tokens = n->n_tokens ? s->tokens : NULL;
        break;
    }
    case KVF_MSG_GRANT: {
        if (have < GRANT_BODY) return KVF_E_PROTO_BOUNDS;
        struct kvf_msg_grant *g = &out->u.grant;
        g->tenant = get_u32(p);
        g->expected_tokens = get_u32(p + 4);
        g->n_pages = get_u32(p + 8);
        g->n_tokens = get_u32(p + 12);
        if ((rc = get_sampling(p + 16, &g->sampling)) < 0) return rc;
        if (g->n_pages > KVF_PROTO_MAX_PAGES || g->n_pages > s->pages_cap ||
            g->n_tokens > KVF_PROTO_MAX_TOKENS || g->n_tokens > s->tokens_cap)
            return KVF_E_PROTO_BOUNDS;
        if (have != GRANT_BODY + 8ull * g->sampling.n_logit_bias + g->sampling.n_grammar +
                        (uint64_t)PAGE_REF_BYTES * g->n_pages + 4ull * g->n_tokens)
            return KVF_E_PROTO_BOUNDS;
        p += GRANT_BODY;
        if ((rc = get_bias(p, &g->sampling)) < 0) return rc;
        p += 8u * g->sampling.n_logit_bias + g->sampling.n_grammar;
        for (uint32_t i = 0; i < g->n_pages; i++, p += PAGE_REF_BYTES) {
            s->pages[i].page = get_u32(p);
            s->pages[i].tag = get_u64(p + 4);
        }
        for (uint32_t i = 0; i < g->n_tokens; i++, p += 4)
            s->tokens[i] = get_u32(p);
        g->pages = g->n_pages ? s->pages : NULL;
        g->tokens = g->n_tokens ? s->tokens : NULL;
        break;
    }
    case KVF_MSG_DONE: {
        if (have < DONE_BODY) return KVF_E_PROTO_BOUNDS;
        struct kvf_msg_done *d = &out->u.done;
        d->tokens_written = get_u32(p);
        d->first_token = get_u32(p + 4);
        d->n_pages = get_u32(p + 8);
        d->first_logprob = get_f32(p + 12);
        d->n_top = get_u32(p + 16);
        if (d->n_top > KVF_PROTO_MAX_LOGPROBS) return KVF_E_PROTO_BOUNDS;
        for (uint32_t i = 0; i < KVF_PROTO_MAX_LOGPROBS; i++) {
            d->top_ids[i] = get_u32(p + 20 + 8 * i);
            d->top_logprobs[i] = get_f32(p + 24 + 8 * i);
            /* Entries past n_top are zero: one encoding per message. */
            if (i >= d->n_top && (get_u32(p + 20 + 8 * i) | get_u32(p + 24 + 8 * i)))
                return KVF_E_PROTO_BOUNDS;
        }
        rc = check_array(have, DONE_BODY, d->n_pages, 8, KVF_PROTO_MAX_PAGES, s->checksums_cap);
        if (rc < 0) return rc;
        p += DONE_BODY;
        for (uint32_t i = 0; i < d->n_pages; i++, p += 8)
            s->checksums[i] = get_u64(p);
        d->checksums = d->n_pages ? s->checksums : NULL;
        break;
    }
    case KVF_MSG_PROGRESS: {
        if (have != PROGRESS_BODY) return KVF_E_PROTO_BOUNDS;
        out->u.progress.tokens_done = get_u32(p);
        out->u.progress.pages_posted = get_u32(p + 4);
        /* Counts beyond the protocol's bounds cannot have come from a well-formed peer. */
        if (out->u.progress.tokens_done > KVF_PROTO_MAX_TOKENS ||
            out->u.progress.pages_posted > KVF_PROTO_MAX_PAGES)
            return KVF_E_PROTO_BOUNDS;
        break;
    }
    default: {
        if (have != REASON_BODY) return KVF_E_PROTO_BOUNDS;
        out->u.reason = (int32_t)get_u32(p);
        /* A reason is a kvfence code or a negated errno, or 0 for CANCEL_ACK; anything else
         * cannot have come from a well-formed peer. */
        if (out->u.reason > 0 || out->u.reason < -100000) return KVF_E_PROTO_BOUNDS;
        break;
    }
    }
    return (long)total;
}

int kvf_proto_hello_check(const struct kvf_msg_hello *local, const struct kvf_msg_hello *remote)
{
    if (local->model_fp != remote->model_fp) return KVF_E_PROTO_MISMATCH;
    if (memcmp(&local->geo, &remote->geo, sizeof(local->geo)) != 0) return KVF_E_PROTO_MISMATCH;
    if (local->max_context != remote->max_context) return KVF_E_PROTO_MISMATCH;
    return 0;
}
