/* rpc.c — encoding and bounds-checked decoding of the router ↔ decode frames (rpc.h). */
#include <errno.h>
#include <string.h>

#include "rpc.h"

/* --- Writing: a cursor that stops (and remembers it) when the room ends. ------------------- */

struct wr {
    uint8_t *p;
    size_t cap, n;
    bool over;
};

static void put(struct wr *w, const void *v, size_t len)
{
    if (w->over || w->cap - w->n < len) {
        w->over = true;
        return;
    }
    memcpy(w->p + w->n, v, len);
    w->n += len;
}

static void put_u8(struct wr *w, uint8_t v)
{
    put(w, &v, 1);
}

static void put_le(struct wr *w, uint64_t v, unsigned bytes)
{
    uint8_t b[8];
    for (unsigned i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put(w, b, bytes);
}

static void put_u16(struct wr *w, uint16_t v)
{
    put_le(w, v, 2);
}
static void put_u32(struct wr *w, uint32_t v)
{
    put_le(w, v, 4);
}
static void put_u64(struct wr *w, uint64_t v)
{
    put_le(w, v, 8);
}

static void put_f32(struct wr *w, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    put_u32(w, v);
}

static void put_str(struct wr *w, const char *s, size_t max)
{
    size_t len = strnlen(s, max - 1);
    put_u16(w, (uint16_t)len);
    put(w, s, len);
}

static void put_head(struct wr *w, enum kvf_rpc_type t)
{
    put_u8(w, (uint8_t)t);
    put_u8(w, KVF_RPC_VERSION);
}

static long done(const struct wr *w)
{
    return w->over ? -EMSGSIZE : (long)w->n;
}

/* --- Reading: the same, refusing anything short or long. ----------------------------------- */

struct rd {
    const uint8_t *p;
    size_t len, n;
    bool bad;
};

static void get(struct rd *r, void *v, size_t len)
{
    if (r->bad || r->len - r->n < len) {
        r->bad = true;
        memset(v, 0, len);
        return;
    }
    memcpy(v, r->p + r->n, len);
    r->n += len;
}

static uint64_t get_le(struct rd *r, unsigned bytes)
{
    uint8_t b[8];
    get(r, b, bytes);
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static uint8_t get_u8(struct rd *r)
{
    return (uint8_t)get_le(r, 1);
}
static uint16_t get_u16(struct rd *r)
{
    return (uint16_t)get_le(r, 2);
}
static uint32_t get_u32(struct rd *r)
{
    return (uint32_t)get_le(r, 4);
}
static uint64_t get_u64(struct rd *r)
{
    return get_le(r, 8);
}

static float get_f32(struct rd *r)
{
    uint32_t v = get_u32(r);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* A string of at most max-1 bytes, without NULs, into out (NUL-terminated). */
static void get_str(struct rd *r, char *out, size_t max)
{
    uint16_t len = get_u16(r);
    if (len >= max) {
        r->bad = true;
        out[0] = 0;
        return;
    }
    get(r, out, len);
    out[r->bad ? 0 : len] = 0;
    if (strlen(out) != len) r->bad = true;
}

/* --- Frames. -------------------------------------------------------------------------------- */

long kvf_rpc_put_hello(uint8_t *buf, size_t cap, enum kvf_rpc_type type,
                       const struct kvf_rpc_hello *h)
{
    struct wr w = {buf, cap, 0, false};
    put_head(&w, type);
    put_u64(&w, h->model_fp);
    put_u32(&w, h->max_context);
    put_u32(&w, h->page_tokens);
    if (type == KVF_RPC_HELLO_D) {
        put_u32(&w, h->n_vocab);
        put_u32(&w, (uint32_t)h->status);
        put_str(&w, h->status ? h->why : "", sizeof h->why);
    } else {
        if (h->n_prefills > KVF_RPC_MAX_PREFILLS) return -EINVAL;
        put_u16(&w, (uint16_t)h->n_prefills);
        for (uint32_t i = 0; i < h->n_prefills; i++) {
            put_str(&w, h->prefills[i].host, sizeof h->prefills[i].host);
            put_u16(&w, h->prefills[i].port);
        }
    }
    return done(&w);
}

size_t kvf_rpc_submit_bytes(uint32_t n_prompt)
{
    return 2 + 8 + 4 * 4 + 4 + 4 + 4 + 8 + 4 * 4 + 4 + 8 * KVF_GEN_MAX_LOGIT_BIAS + 1 + 4 +
           4 * KVF_GEN_MAX_STOP_IDS + 4 + KVF_GEN_MAX_GRAMMAR + 4 + 4 * (size_t)n_prompt;
}

enum { F_WANT_LOGPROB = 1, F_IGNORE_EOS = 2 };

long kvf_rpc_put_submit(uint8_t *buf, size_t cap, uint64_t rid, const struct kvf_gen_params *p)
{
    if (p->n_stop_ids > KVF_GEN_MAX_STOP_IDS) return -EINVAL;
    struct wr w = {buf, cap, 0, false};
    put_head(&w, KVF_RPC_SUBMIT);
    put_u64(&w, rid);
    put_u32(&w, p->tenant);
    put_u32(&w, p->max_tokens);
    put_u32(&w, p->n_logprobs);
    put_u32(&w, p->sample.top_k);
    put_f32(&w, p->sample.temperature);
    put_f32(&w, p->sample.top_p);
    put_u64(&w, p->sample.seed);
    put_f32(&w, p->sample.min_p);
    put_f32(&w, p->sample.presence_penalty);
    put_f32(&w, p->sample.frequency_penalty);
    put_f32(&w, p->sample.repetition_penalty);
    if (p->sample.n_logit_bias > KVF_GEN_MAX_LOGIT_BIAS) return -EINVAL;
    put_u32(&w, p->sample.n_logit_bias);
    for (uint32_t i = 0; i < p->sample.n_logit_bias; i++) {
        put_u32(&w, (uint32_t)p->sample.logit_bias[i].id);
        put_f32(&w, p->sample.logit_bias[i].bias);
    }
    put_u8(&w,
           (uint8_t)((p->want_logprob ? F_WANT_LOGPROB : 0) | (p->ignore_eos ? F_IGNORE_EOS : 0)));
    put_u32(&w, p->n_stop_ids);
    for (uint32_t i = 0; i < p->n_stop_ids; i++)
        put_u32(&w, (uint32_t)p->stop_ids[i]);
    if (p->n_grammar > KVF_GEN_MAX_GRAMMAR || (p->n_grammar && !p->grammar)) return -EINVAL;
    put_u32(&w, p->n_grammar);
    if (p->n_grammar) put(&w, p->grammar, p->n_grammar);
    put_u32(&w, p->n_prompt);
    for (uint32_t i = 0; i < p->n_prompt; i++)
        put_u32(&w, (uint32_t)p->prompt[i]);
    return done(&w);
}

long kvf_rpc_put_cancel(uint8_t *buf, size_t cap, uint64_t rid)
{
    struct wr w = {buf, cap, 0, false};
    put_head(&w, KVF_RPC_CANCEL);
    put_u64(&w, rid);
    return done(&w);
}

long kvf_rpc_put_event(uint8_t *buf, size_t cap, uint64_t rid, const struct kvf_gen_event *ev)
{
    struct wr w = {buf, cap, 0, false};
    if (ev->kind == KVF_GEN_TOKEN) {
        if (ev->n_top > KVF_GEN_MAX_LOGPROBS) return -EINVAL;
        put_head(&w, KVF_RPC_TOKEN);
        put_u64(&w, rid);
        put_u32(&w, (uint32_t)ev->token);
        put_f32(&w, ev->logprob);
        put_u8(&w, (uint8_t)ev->n_top);
        for (uint32_t k = 0; k < ev->n_top; k++) {
            put_u32(&w, (uint32_t)ev->top_ids[k]);
            put_f32(&w, ev->top_logprobs[k]);
        }
    } else {
        put_head(&w, KVF_RPC_END);
        put_u64(&w, rid);
        put_u32(&w, (uint32_t)ev->err);
        put_u8(&w, ev->stopped ? 1 : 0);
    }
    return done(&w);
}

long kvf_rpc_put_prov(uint8_t *buf, size_t cap, uint64_t rid, const struct kvf_gen_prov *pv)
{
    struct wr w = {buf, cap, 0, false};
    put_head(&w, KVF_RPC_PROV);
    put_u64(&w, rid);
    put_u64(&w, pv->decode_id);
    put_u64(&w, pv->req_lo);
    put_u64(&w, pv->req_hi);
    put_str(&w, pv->prefill_addr, sizeof pv->prefill_addr);
    put_u16(&w, pv->prefill_peer);
    put_u32(&w, pv->writer_epoch);
    put_u64(&w, pv->grant_nonce);
    put_u32(&w, pv->tenant);
    put_u32(&w, pv->tokens_granted);
    put_u32(&w, pv->tokens_verified);
    put_u8(&w, pv->verified ? 1 : 0);
    put_u32(&w, pv->n_pages);
    put_u64(&w, pv->pages_digest);
    uint32_t listed = pv->n_pages < KVF_GEN_PROV_PAGES ? pv->n_pages : KVF_GEN_PROV_PAGES;
    for (uint32_t i = 0; i < listed; i++) {
        put_u32(&w, pv->pages[i].page);
        put_u64(&w, pv->pages[i].tag);
        put_u64(&w, pv->pages[i].checksum);
    }
    return done(&w);
}

/* The figures of kvf_engine_info a decode worker reports, in this order. */
/* An X-macro list, one figure per line (left as written by the formatter). */
/* clang-format off */
#define INFO_U32S(X) \
    X(n_vocab) \
    X(served_limit) \
    X(page_tokens) \
    X(decode_pages) \
    X(decode_free) \
    X(decode_reserved) \
    X(decode_by_state[0]) \
    X(decode_by_state[1]) \
    X(decode_by_state[2]) \
    X(decode_by_state[3]) \
    X(decode_by_state[4]) \
    X(queued) \
    X(running) \
    X(prefills) \
    X(prefills_up)
#define INFO_U64S(X) \
    X(fences) \
    X(verify_failed) \
    X(stale_msgs) \
    X(rejected_before_handoff) \
    X(holds) \
    X(quarantines) \
    X(committed) \
    X(failed) \
    X(foreign_tails) \
    X(hash_slices) \
    X(bad_frames) \
    X(decoded_tokens) \
    X(verify_count) \
    X(verify_trailer) \
    X(verify_checksum)
/* clang-format on */

long kvf_rpc_put_status(uint8_t *buf, size_t cap, const struct kvf_rpc_status *st)
{
    if (st->n_prefills > KVF_RPC_MAX_PREFILLS) return -EINVAL;
    struct wr w = {buf, cap, 0, false};
    put_head(&w, KVF_RPC_STATUS);
    const struct kvf_engine_info *in = &st->info;
#define PUT32(f) put_u32(&w, in->f);
#define PUT64(f) put_u64(&w, in->f);
    INFO_U32S(PUT32)
    INFO_U64S(PUT64)
    put_u8(&w, in->prefill_up ? 1 : 0);
    put_u16(&w, (uint16_t)st->n_prefills);
    for (uint32_t i = 0; i < st->n_prefills; i++) {
        const struct kvf_prefill_status *p = &st->prefills[i];
        put_str(&w, p->host, sizeof p->host);
        put_u16(&w, p->port);
        put_u8(&w, p->up ? 1 : 0);
        put_str(&w, p->why, sizeof p->why);
        put_u64(&w, p->granted);
    }
    return done(&w);
}

int kvf_rpc_decode(const uint8_t *buf, size_t len, struct kvf_rpc_msg *m, int32_t *prompt_room,
                   uint32_t prompt_cap, struct kvf_rpc_hello *hello, struct kvf_rpc_status *status)
{
    struct rd r = {buf, len, 0, false};
    memset(m, 0, sizeof(*m));
    uint8_t type = get_u8(&r);
    if (get_u8(&r) != KVF_RPC_VERSION || r.bad) return -EBADMSG;
    m->type = (enum kvf_rpc_type)type;
    switch (type) {
    case KVF_RPC_HELLO_R:
    case KVF_RPC_HELLO_D: {
        if (!hello) return -EBADMSG;
        memset(hello, 0, sizeof(*hello));
        m->hello = hello;
        hello->model_fp = get_u64(&r);
        hello->max_context = get_u32(&r);
        hello->page_tokens = get_u32(&r);
        if (type == KVF_RPC_HELLO_D) {
            hello->n_vocab = get_u32(&r);
            hello->status = (int32_t)get_u32(&r);
            get_str(&r, hello->why, sizeof hello->why);
            if (hello->status == 0 && hello->why[0]) return -EBADMSG; /* "ok" carries no reason */
        } else {
            hello->n_prefills = get_u16(&r);
            if (hello->n_prefills > KVF_RPC_MAX_PREFILLS) return -EBADMSG;
            for (uint32_t i = 0; i < hello->n_prefills && !r.bad; i++) {
                get_str(&r, hello->prefills[i].host, sizeof hello->prefills[i].host);
                hello->prefills[i].port = get_u16(&r);
            }
        }
        break;
    }
    case KVF_RPC_SUBMIT: {
        struct kvf_gen_params *p = &m->params;
        m->rid = get_u64(&r);
        p->tenant = get_u32(&r);
        p->max_tokens = get_u32(&r);
        p->n_logprobs = get_u32(&r);
        p->sample.top_k = get_u32(&r);
        p->sample.temperature = get_f32(&r);
        p->sample.top_p = get_f32(&r);
        p->sample.seed = get_u64(&r);
        p->sample.min_p = get_f32(&r);
        p->sample.presence_penalty = get_f32(&r);
        p->sample.frequency_penalty = get_f32(&r);
        p->sample.repetition_penalty = get_f32(&r);
        /* Their ranges are the seam's submit's to check (gen.c), as for the fields above. */
        p->sample.n_logit_bias = get_u32(&r);
        if (p->sample.n_logit_bias > KVF_GEN_MAX_LOGIT_BIAS) return -EBADMSG;
        for (uint32_t i = 0; i < p->sample.n_logit_bias; i++) {
            p->sample.logit_bias[i].id = (int32_t)get_u32(&r);
            p->sample.logit_bias[i].bias = get_f32(&r);
        }
        uint8_t flags = get_u8(&r);
        if (flags & ~(F_WANT_LOGPROB | F_IGNORE_EOS)) return -EBADMSG;
        p->want_logprob = flags & F_WANT_LOGPROB;
        p->ignore_eos = flags & F_IGNORE_EOS;
        p->n_stop_ids = get_u32(&r);
        if (p->n_stop_ids > KVF_GEN_MAX_STOP_IDS) return -EBADMSG;
        for (uint32_t i = 0; i < p->n_stop_ids; i++)
            p->stop_ids[i] = (int32_t)get_u32(&r);
        /* The grammar: a view into buf (the submit copies it). */
        p->n_grammar = get_u32(&r);
        if (r.bad || p->n_grammar > KVF_GEN_MAX_GRAMMAR || len - r.n < p->n_grammar)
            return -EBADMSG;
        p->grammar = p->n_grammar ? (const char *)buf + r.n : NULL;
        r.n += p->n_grammar;
        p->n_prompt = get_u32(&r);
        if (p->n_prompt > prompt_cap || !prompt_room) return -EBADMSG;
        if (r.bad || (len - r.n) / 4 < p->n_prompt) return -EBADMSG;
        for (uint32_t i = 0; i < p->n_prompt; i++)
            prompt_room[i] = (int32_t)get_u32(&r);
        p->prompt = prompt_room;
        break;
    }
    case KVF_RPC_CANCEL:
        m->rid = get_u64(&r);
        break;
    case KVF_RPC_TOKEN: {
        m->rid = get_u64(&r);
        m->ev.kind = KVF_GEN_TOKEN;
        m->ev.token = (int32_t)get_u32(&r);
        m->ev.logprob = get_f32(&r);
        m->ev.n_top = get_u8(&r);
        if (m->ev.n_top > KVF_GEN_MAX_LOGPROBS) return -EBADMSG;
        for (uint32_t k = 0; k < m->ev.n_top; k++) {
            m->ev.top_ids[k] = (int32_t)get_u32(&r);
            m->ev.top_logprobs[k] = get_f32(&r);
        }
        break;
    }
    case KVF_RPC_END: {
        m->rid = get_u64(&r);
        m->ev.kind = KVF_GEN_END;
        m->ev.err = (int)(int32_t)get_u32(&r);
        uint8_t stopped = get_u8(&r);
        if (stopped > 1) return -EBADMSG;
        m->ev.stopped = stopped;
        break;
    }
    case KVF_RPC_PROV: {
        struct kvf_gen_prov *pv = &m->prov;
        m->rid = get_u64(&r);
        pv->decode_id = get_u64(&r);
        pv->req_lo = get_u64(&r);
        pv->req_hi = get_u64(&r);
        get_str(&r, pv->prefill_addr, sizeof pv->prefill_addr);
        pv->prefill_peer = get_u16(&r);
        pv->writer_epoch = get_u32(&r);
        pv->grant_nonce = get_u64(&r);
        pv->tenant = get_u32(&r);
        pv->tokens_granted = get_u32(&r);
        pv->tokens_verified = get_u32(&r);
        uint8_t verified = get_u8(&r);
        if (verified > 1) return -EBADMSG;
        pv->verified = verified;
        pv->n_pages = get_u32(&r);
        pv->pages_digest = get_u64(&r);
        uint32_t listed = pv->n_pages < KVF_GEN_PROV_PAGES ? pv->n_pages : KVF_GEN_PROV_PAGES;
        if (r.bad || (len - r.n) / 20 < listed) return -EBADMSG;
        for (uint32_t i = 0; i < listed; i++) {
            pv->pages[i].page = get_u32(&r);
            pv->pages[i].tag = get_u64(&r);
            pv->pages[i].checksum = get_u64(&r);
        }
        break;
    }
    case KVF_RPC_STATUS: {
        if (!status) return -EBADMSG;
        memset(status, 0, sizeof(*status));
        m->status = status;
        struct kvf_engine_info *in = &status->info;
#define GET32(f) in->f = get_u32(&r);
#define GET64(f) in->f = get_u64(&r);
        INFO_U32S(GET32)
        INFO_U64S(GET64)
        uint8_t up = get_u8(&r);
        if (up > 1) return -EBADMSG;
        in->prefill_up = up;
        status->n_prefills = get_u16(&r);
        if (status->n_prefills > KVF_RPC_MAX_PREFILLS) return -EBADMSG;
        for (uint32_t i = 0; i < status->n_prefills && !r.bad; i++) {
            struct kvf_prefill_status *p = &status->prefills[i];
            get_str(&r, p->host, sizeof p->host);
            p->port = get_u16(&r);
            uint8_t pu = get_u8(&r);
            if (pu > 1) return -EBADMSG;
            p->up = pu;
            get_str(&r, p->why, sizeof p->why);
            p->granted = get_u64(&r);
        }
        break;
    }
    default:
        return -EBADMSG;
    }
    if (r.bad || r.n != len) return -EBADMSG;
    return 0;
}
