/* The fake engine (see fake_engine.h). One mutex guards everything; next waits on a condvar. */
#include "fake_engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kvf_gen {
    struct fake_engine *f;
    uint32_t rec;   /* index into the records (capped) */
    uint32_t pages; /* of the pool (pool_pages), held until release */
    int32_t *out;   /* the tokens it will emit, cycling */
    uint32_t n_out;
    struct kvf_gen_params p; /* prompt: NULL */
    int64_t t0;
    uint32_t emitted;
    int32_t last;
    bool cancelled, ended;
};

int64_t fake_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fake_init(struct fake_engine *f, uint32_t n_vocab, uint32_t served_limit)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&f->cv, &ca);
    pthread_condattr_destroy(&ca);
    f->n_vocab = n_vocab;
    f->served_limit = served_limit;
    f->prefill_up = true;
}

void fake_destroy(struct fake_engine *f)
{
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
}

static int fake_submit(void *e, const struct kvf_gen_params *p, kvf_gen_t **out)
{
    struct fake_engine *f = e;
    if (p->n_prompt == 0 || p->max_tokens == 0 || p->n_prompt + p->max_tokens > f->served_limit)
        return p->n_prompt + p->max_tokens > f->served_limit ? KVF_E_PROTO_REJECTED : -EINVAL;
    for (uint32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || (uint32_t)p->prompt[i] >= f->n_vocab) return -EINVAL;
    pthread_mutex_lock(&f->mu);
    int rc = f->submit_err;
    if (!rc && f->max_live && f->live >= f->max_live) rc = -EAGAIN;
    uint32_t pages = (p->n_prompt + p->max_tokens + 15) / 16;
    if (!rc && f->pool_pages && f->pool_used + pages > f->pool_pages) rc = -EBUSY;
    if (rc) {
        pthread_mutex_unlock(&f->mu);
        return rc;
    }
    struct kvf_gen *g = calloc(1, sizeof *g);
    uint32_t skip = p->n_prompt > 1 && p->prompt[0] == 1 ? 1 : 0; /* BOS is id 1 in the tests */
    g->n_out = f->script ? f->n_script : p->n_prompt - skip;
    g->out = malloc(g->n_out * sizeof *g->out);
    if (!g || !g->out) abort();
    memcpy(g->out, f->script ? f->script : p->prompt + skip, g->n_out * sizeof *g->out);
    g->f = f;
    g->pages = f->pool_pages ? pages : 0;
    f->pool_used += g->pages;
    g->p = *p;
    g->p.prompt = NULL;
    g->t0 = fake_now_ms();
    g->rec = f->submits < FAKE_MAX_RECORDS ? f->submits : FAKE_MAX_RECORDS - 1;
    f->params[g->rec] = g->p;
    f->cancel_ms[g->rec] = 0;
    if (f->submits < FAKE_MAX_SEEDS) f->seeds[f->submits] = p->sample.seed;
    f->n_last_prompt = p->n_prompt < 4096 ? p->n_prompt : 4096;
    memcpy(f->last_prompt, p->prompt, f->n_last_prompt * sizeof(int32_t));
    f->submits++;
    f->live++;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    *out = g;
    return 0;
}

static bool is_stop(const struct kvf_gen *g, int32_t t)
{
    if (g->p.ignore_eos) return false;
    for (uint32_t i = 0; i < g->p.n_stop_ids; i++)
        if (g->p.stop_ids[i] == t) return true;
    return false;
}

static int fake_next(void *e, kvf_gen_t *g, struct kvf_gen_event *ev, int timeout_ms)
{
    struct fake_engine *f = e;
    memset(ev, 0, sizeof *ev);
    pthread_mutex_lock(&f->mu);
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : fake_now_ms() + timeout_ms;
    for (;;) {
        ev->kind = KVF_GEN_END;
        if (g->cancelled) {
            ev->err = KVF_E_PROTO_CANCELLED;
            break;
        }
        if (g->emitted > 0 && is_stop(g, g->last)) {
            ev->stopped = true;
            break;
        }
        if (g->emitted >= g->p.max_tokens) break;
        if (f->end_err && g->emitted >= f->end_after) {
            ev->err = f->end_err;
            break;
        }
        int64_t first = f->slow_tenant && g->p.tenant != f->slow_tenant ? 0 : f->first_delay_ms;
        int64_t due = g->t0 + first + (int64_t)g->emitted * f->token_delay_ms;
        int64_t now = fake_now_ms();
        if (now >= due) {
            int32_t t = g->out[g->emitted % g->n_out];
            ev->kind = KVF_GEN_TOKEN;
            ev->token = t;
            ev->logprob = -(float)(g->emitted + 1) / 16.0f;
            ev->n_top = g->p.n_logprobs;
            for (uint32_t k = 0; k < ev->n_top; k++) {
                ev->top_ids[k] = k == 0 ? t : (int32_t)(((uint32_t)t + k) % f->n_vocab);
                ev->top_logprobs[k] = ev->logprob - (float)k;
            }
            g->emitted++;
            g->last = t;
            pthread_mutex_unlock(&f->mu);
            return 1;
        }
        if (now >= deadline) {
            pthread_mutex_unlock(&f->mu);
            return 0;
        }
        int64_t until = due < deadline ? due : deadline;
        struct timespec ts = {until / 1000, (long)(until % 1000) * 1000000};
        pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    g->ended = true;
    pthread_mutex_unlock(&f->mu);
    return 1;
}

static void fake_cancel(void *e, kvf_gen_t *g)
{
    struct fake_engine *f = e;
    pthread_mutex_lock(&f->mu);
    if (!g->cancelled) {
        g->cancelled = true;
        f->cancels++;
        f->cancel_ms[g->rec] = fake_now_ms();
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
}

static void fake_release(void *e, kvf_gen_t *g)
{
    struct fake_engine *f = e;
    pthread_mutex_lock(&f->mu);
    f->releases++;
    f->live--;
    f->pool_used -= g->pages;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    free(g->out);
    free(g);
}

static void fake_info(void *e, struct kvf_engine_info *out)
{
    struct fake_engine *f = e;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&f->mu);
    out->n_vocab = f->n_vocab;
    out->served_limit = f->served_limit;
    out->page_tokens = 16;
    out->decode_pages = 64;
    out->decode_free = 60;
    out->decode_reserved = 4;
    out->decode_by_state[0] = 60;
    out->decode_by_state[1] = 4;
    if (f->pool_pages) {
        out->decode_pages = f->pool_pages;
        out->decode_free = f->pool_pages - f->pool_used;
        out->decode_reserved = f->pool_used;
        out->decode_by_state[0] = out->decode_free;
        out->decode_by_state[1] = f->pool_used;
    }
    out->prefill_pages = 32;
    out->prefill_free = 32;
    out->running = f->live;
    out->prefill_up = f->prefill_up;
    out->verify_count = f->verify[0];
    out->verify_trailer = f->verify[1];
    out->verify_checksum = f->verify[2];
    out->verify_failed = f->verify[0] + f->verify[1] + f->verify[2];
    out->foreign_tails = f->verify[3];
    pthread_mutex_unlock(&f->mu);
}

/* With prov set: a record naming the handle (request id lo = its submit's number from 1), one
 * page per 16 prompt tokens, tag and checksum derived from the page. */
static int fake_prov(void *e, kvf_gen_t *g, struct kvf_gen_prov *out)
{
    struct fake_engine *f = e;
    pthread_mutex_lock(&f->mu);
    bool on = f->prov;
    pthread_mutex_unlock(&f->mu);
    if (!on) return 0;
    memset(out, 0, sizeof *out);
    out->decode_id = 0xfeedULL;
    out->req_lo = (uint64_t)g->rec + 1;
    out->req_hi = 0xfeedULL;
    snprintf(out->prefill_addr, sizeof out->prefill_addr, "127.0.0.1:9101");
    out->writer_epoch = 3;
    out->grant_nonce = 0xabcULL + g->rec;
    out->tenant = g->p.tenant;
    out->tokens_granted = out->tokens_verified = g->p.n_prompt;
    out->verified = true;
    out->n_pages = (g->p.n_prompt + 15) / 16;
    for (uint32_t i = 0; i < out->n_pages && i < KVF_GEN_PROV_PAGES; i++)
        out->pages[i] = (struct kvf_gen_prov_page){i + 10, 0x1000u + i, 0x2000u + i};
    out->pages_digest = 0x77;
    return 1;
}

const struct kvf_gen_ops fake_ops = {
    .submit = fake_submit,
    .next = fake_next,
    .cancel = fake_cancel,
    .release = fake_release,
    .info = fake_info,
    .prov = fake_prov,
};

uint32_t fake_live(struct fake_engine *f)
{
    pthread_mutex_lock(&f->mu);
    uint32_t n = f->live;
    pthread_mutex_unlock(&f->mu);
    return n;
}

uint32_t fake_cancels(struct fake_engine *f)
{
    pthread_mutex_lock(&f->mu);
    uint32_t n = f->cancels;
    pthread_mutex_unlock(&f->mu);
    return n;
}

int64_t fake_wait_cancels(struct fake_engine *f, uint32_t n, int timeout_ms)
{
    int64_t deadline = fake_now_ms() + timeout_ms;
    pthread_mutex_lock(&f->mu);
    while (f->cancels < n && fake_now_ms() < deadline) {
        struct timespec ts = {deadline / 1000, (long)(deadline % 1000) * 1000000};
        pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    int64_t t = -1;
    if (f->cancels >= n) {
        for (uint32_t i = 0; i < FAKE_MAX_RECORDS && i < f->submits; i++)
            if (f->cancel_ms[i] > t) t = f->cancel_ms[i];
    }
    pthread_mutex_unlock(&f->mu);
    return t;
}

bool fake_wait_live(struct fake_engine *f, uint32_t n, int timeout_ms)
{
    int64_t deadline = fake_now_ms() + timeout_ms;
    pthread_mutex_lock(&f->mu);
    while (f->live != n && fake_now_ms() < deadline) {
        struct timespec ts = {deadline / 1000, (long)(deadline % 1000) * 1000000};
        pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    bool ok = f->live == n;
    pthread_mutex_unlock(&f->mu);
    return ok;
}
