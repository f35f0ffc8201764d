/* grammar_internal.h — the compiled grammar's layout, shared by grammar.c (rules, matcher) and
 * grammar_mask.c (vocabulary walk, mask cache). */
#ifndef KVF_TEXT_GRAMMAR_INTERNAL_H
#define KVF_TEXT_GRAMMAR_INTERNAL_H

#include <stdint.h>

#include "kvfence/grammar.h"

/* An element: its type in the top two bits, a rule id or class id below. */
enum { E_END = 0, E_ALT = 1, E_REF = 2, E_CLS = 3 };
#define EL(t, v)   ((uint32_t)(t) << 30 | (uint32_t)(v))
#define EL_TYPE(e) ((e) >> 30)
#define EL_VAL(e)  ((e)&0x3fffffffu)

/* One cached mask: the state's words (the key) and n_vocab bits after them. */
struct kvf__gcache {
    uint64_t hash;
    uint32_t n_key; /* words of the state */
    uint32_t *key;  /* [n_key] */
    uint64_t *bits; /* [(n_vocab + 63) / 64] */
    struct kvf__gcache *next;
};

struct kvf_grammar {
    uint32_t n_rules, root, n_elems, n_cls;
    uint32_t *rule_start; /* [n_rules]: first element of each rule */
    uint32_t *elems;      /* [n_elems]: every rule's run, ALT-separated, END-terminated */
    uint64_t (*cls)[4];   /* [n_cls]: 256-bit byte classes */
    /* The mask cache: a hash table of states seen, cleared whole when it outgrows
     * KVF_GRAMMAR_CACHE_BYTES. */
    struct kvf__gcache **cache; /* [KVF__GCACHE_SLOTS] or NULL */
    size_t cache_bytes;
    uint32_t cache_vocab; /* n_vocab the cached masks are for */
    uint64_t *work;       /* a mask being built, n_vocab bits */
};
#define KVF__GCACHE_SLOTS 1024

/* One byte of input: out = the stacks of in that take b, advanced and expanded. */
void kvf__grammar_step(const kvf_grammar_t *g, const struct kvf_grammar_state *in, uint8_t b,
                       struct kvf_grammar_state *out);
void kvf__grammar_cache_clear(kvf_grammar_t *g);

#endif /* KVF_TEXT_GRAMMAR_INTERNAL_H */
