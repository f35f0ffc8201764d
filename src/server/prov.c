/*
 * prov.c — provenance records: which pages each response read and what decode verified of them
 * (struct kvf_gen_prov, kvfence/gen.h), kept for the operator, rendered for the tenant, logged.
 *
 * The decode worker makes a record when a request's handoff is verified and committed, before
 * its first token (in the split roles it travels to the router as an rpc PROV frame); the run
 * reads it off the handle at the first token (run.c). At the end of a request each choice's
 * record goes into this process's ring: fixed memory (KVF__SRV_PROV_RING records, allocated at
 * start), the oldest overwritten. GET /admin/provenance/{id} reads it back by response id, as
 * the operator endpoints allow (admin.c). Records hold ids and numbers only, never content.
 *
 * Work: put O(1); get O(ring) string compares under one mutex (an operator's lookup).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

int kvf__srv_prov_init(struct kvf__srv_prov_ring *r, uint32_t cap)
{
    memset(r, 0, sizeof *r);
    r->v = calloc(cap, sizeof *r->v);
    if (!r->v) return -1;
    r->cap = cap;
    pthread_mutex_init(&r->mu, NULL);
    return 0;
}

void kvf__srv_prov_destroy(struct kvf__srv_prov_ring *r)
{
    if (!r->v) return;
    pthread_mutex_destroy(&r->mu);
    free(r->v);
    r->v = NULL;
}

void kvf__srv_prov_put(struct kvf__srv_prov_ring *r, const char *id, uint32_t choice,
                       const struct kvf_gen_prov *pv)
{
    if (!r->v) return;
    pthread_mutex_lock(&r->mu);
    struct kvf__srv_prov_slot *s = &r->v[r->next];
    r->next = (r->next + 1) % r->cap;
    snprintf(s->id, sizeof s->id, "%s", id);
    s->choice = choice;
    s->pv = *pv;
    r->recorded++;
    pthread_mutex_unlock(&r->mu);
}

size_t kvf__srv_prov_get(struct kvf__srv_prov_ring *r, const char *id,
                         struct kvf__srv_prov_slot *out, size_t max)
{
    size_t n = 0;
    if (!r->v) return 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->cap && n < max; i++)
        if (r->v[i].id[0] && strcmp(r->v[i].id, id) == 0) out[n++] = r->v[i];
    pthread_mutex_unlock(&r->mu);
    /* In choice order (a response has few). */
    for (size_t i = 1; i < n; i++)
        for (size_t k = i; k > 0 && out[k - 1].choice > out[k].choice; k--) {
            struct kvf__srv_prov_slot t = out[k];
            out[k] = out[k - 1];
            out[k - 1] = t;
        }
    return n;
}

bool kvf__srv_prov_id_ok(const char *id, size_t len)
{
    static const char *const prefixes[] = {"cmpl-", "chatcmpl-"};
    for (size_t k = 0; k < 2; k++) {
        size_t pl = strlen(prefixes[k]);
        if (len != pl + 16 || strncmp(id, prefixes[k], pl) != 0) continue;
        for (size_t i = pl; i < len; i++)
            if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f'))) return false;
        return true;
    }
    return false;
}

static json_t *hex64(uint64_t v)
{
    char b[20];
    snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    return json_string(b);
}

json_t *kvf__srv_prov_json(const struct kvf_gen_prov *pv, bool with_pages)
{
    char req[40];
    snprintf(req, sizeof req, "%016llx%016llx", (unsigned long long)pv->req_hi,
             (unsigned long long)pv->req_lo);
    json_t *j = json_pack(
        "{s:{s:o, s:s}, s:s, s:{s:s, s:i, s:I}, s:{s:o, s:I, s:I}, s:{s:b, s:I, s:I, s:o}}",
        "decode", "id", hex64(pv->decode_id), "addr", pv->decode_addr, "request", req, "prefill",
        "addr", pv->prefill_addr, "peer", (int)pv->prefill_peer, "epoch",
        (json_int_t)pv->writer_epoch, "grant", "nonce", hex64(pv->grant_nonce), "tenant",
        (json_int_t)pv->tenant, "tokens", (json_int_t)pv->tokens_granted, "verified", "ok",
        pv->verified, "tokens", (json_int_t)pv->tokens_verified, "pages", (json_int_t)pv->n_pages,
        "digest", hex64(pv->pages_digest));
    if (!j) return NULL;
    json_t *pages = json_array();
    uint32_t listed = pv->n_pages < KVF_GEN_PROV_PAGES ? pv->n_pages : KVF_GEN_PROV_PAGES;
    for (uint32_t i = 0; with_pages && pages && i < listed; i++)
        json_array_append_new(
            pages, json_pack("{s:I, s:o, s:o}", "page", (json_int_t)pv->pages[i].page, "tag",
                             hex64(pv->pages[i].tag), "checksum", hex64(pv->pages[i].checksum)));
    json_object_set_new(j, "pages", pages ? pages : json_array());
    return j;
}

size_t kvf__srv_prov_brief(const struct kvf_gen_prov *pv, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%016llx:%016llx%016llx:%s@%u:%016llx:%u/%u:%d:%u:%016llx",
                     (unsigned long long)pv->decode_id, (unsigned long long)pv->req_hi,
                     (unsigned long long)pv->req_lo, pv->prefill_addr, pv->writer_epoch,
                     (unsigned long long)pv->grant_nonce, pv->tokens_verified, pv->tokens_granted,
                     pv->verified, pv->n_pages, (unsigned long long)pv->pages_digest);
    return n < 0 ? 0 : ((size_t)n < cap ? (size_t)n : cap - 1);
}
