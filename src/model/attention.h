/*
 * attention.h — causal attention over pool pages, and the SwiGLU activation (internal to
 * src/model). forward.c describes a batch once per layer in a kvf_attn_batch and lets the
 * thread pool call kvf__attn_chunk for every chunk.
 *
 * Invariance: each (token, head) output is computed by one fixed sequence of operations that
 * depends only on that token's query, its own sequence's K/V and its position — never on
 * which other tokens share the batch, how the work is chunked, or which thread runs it.
 */
#ifndef KVF_MODEL_ATTENTION_H
#define KVF_MODEL_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "kvfence/model.h"
#include "kvfence/pool.h"

struct kvf_attn_batch {
    uint32_t nt;                      /* tokens in the batch */
    uint32_t n_heads, n_kv_heads, head_dim;
    const float *q;                   /* (nt, n_heads · head_dim), RoPE applied */
    float *out;                       /* (nt, n_heads · head_dim) attention output */
    const uint32_t *tok_seq;          /* [nt] index into seqs */
    const uint32_t *tok_pos;          /* [nt] position: attends over 0..pos of its sequence */
    const struct kvf_fwd_seq *seqs;   /* page tables, checked by forward.c before this runs */
    const uint8_t *pool_base;         /* page p's data is at pool_base + p · page_bytes */
    size_t page_bytes;
    uint32_t page_tokens;
    size_t k_off, v_off;              /* this layer's K and V blocks inside a page */
    float *scratch;                   /* per thread: scratch_floats floats at thread · scratch_floats */
    size_t scratch_floats;
};

/* Floats of per-thread scratch kvf__attn_chunk needs for a model with this context length and
 * head count. */
size_t kvf__attn_scratch_floats(uint32_t n_ctx, uint32_t n_heads);

/* Chunk i of n of the batch's (token, head) work, run by thread `thread`. */
void kvf__attn_chunk(const struct kvf_attn_batch *b, uint32_t i, uint32_t n, uint32_t thread);

/* g[i] = silu(g[i]) · u[i] for i < n; each element's value depends on g[i] and u[i] alone. */
void kvf__swiglu(float *g, const float *u, uint32_t n);

#endif
