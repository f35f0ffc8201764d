/*
 * constrain.c — constrained decoding in the workers (kvfence/grammar.h): each worker keeps the
 * grammars its live requests use, compiled once per distinct text (so requests with the same
 * schema share one mask cache), and masks the logits before the draw.
 *
 * The registry belongs to one thread (the decode loop; the prefill loop): get and put run
 * there. A grammar's mask cache is used by whichever thread draws the request's tokens while
 * the request holds a reference, and the registry frees only grammars no request holds.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

void kvf__gram_reg_init(struct kvf__gram_reg *r, uint32_t cap)
{
    memset(r, 0, sizeof *r);
    r->cap = cap;
}

void kvf__gram_reg_free(struct kvf__gram_reg *r)
{
    for (uint32_t i = 0; i < r->n; i++) {
        kvf_grammar_free(r->e[i].g);
        free(r->e[i].text);
    }
    free(r->e);
    memset(r, 0, sizeof *r);
}

int kvf__gram_get(struct kvf__gram_reg *r, const char *text, uint32_t n, kvf_grammar_t **out)
{
    for (uint32_t i = 0; i < r->n; i++)
        if (r->e[i].n == n && memcmp(r->e[i].text, text, n) == 0) {
            r->e[i].refs++;
            *out = r->e[i].g;
            return 0;
        }
    /* A slot: a new one while under cap, else the first no request holds. */
    uint32_t at = r->n;
    if (r->n >= r->cap) {
        for (at = 0; at < r->n && r->e[at].refs; at++)
            ;
        if (at == r->n) return -EBUSY;
    } else if (!r->e || r->n % 16 == 0) {
        struct kvf__gram_ent *e = realloc(r->e, ((size_t)r->n + 16) * sizeof *e);
        if (!e) return -ENOMEM;
        r->e = e;
    }
    kvf_grammar_t *g;
    char err[160];
    int rc = kvf_grammar_compile(text, n, &g, err, sizeof err);
    if (rc < 0) return rc;
    char *copy = malloc(n ? n : 1);
    if (!copy) {
        kvf_grammar_free(g);
        return -ENOMEM;
    }
    memcpy(copy, text, n);
    if (at < r->n) {
        kvf_grammar_free(r->e[at].g);
        free(r->e[at].text);
    } else {
        r->n++;
    }
    r->e[at] = (struct kvf__gram_ent){copy, n, g, 1};
    *out = g;
    return 0;
}

void kvf__gram_put(struct kvf__gram_reg *r, kvf_grammar_t *g)
{
    uint32_t at = r->n, idle = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->e[i].g == g && r->e[i].refs && at == r->n) {
            r->e[i].refs--;
            at = i;
        }
        idle += r->e[i].refs == 0;
    }
    /* Memory stays bounded: the grammars of live requests, and at most KVF__GRAM_IDLE others
     * (each with its mask cache, at most KVF_GRAMMAR_CACHE_BYTES). */
    if (at < r->n && r->e[at].refs == 0 && idle > KVF__GRAM_IDLE) {
        kvf_grammar_free(r->e[at].g);
        free(r->e[at].text);
        r->e[at] = r->e[--r->n];
    }
}

int kvf__constrain(const struct kvf__constraint *c, const float *logits, uint32_t n_vocab)
{
    int left =
        kvf_grammar_apply_to(c->g, c->v, c->s, logits, c->buf, n_vocab, c->stop_ids, c->n_stop_ids);
    if (left < 0) return left;
    /* A dead end (the vocabulary cannot spell any continuation): end the output here. */
    if (left == 0) return c->n_stop_ids ? c->stop_ids[0] : KVF_E_ENGINE;
    return -1 - 0x7fffffff; /* INT_MIN: draw from c->buf */
}
