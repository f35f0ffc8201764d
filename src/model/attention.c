/*
 * attention.c — causal attention over pool pages, and SwiGLU.
 *
 * For a token at position pos of its sequence, and query head h (K/V head h / group):
 *   s_p  = (q · k_p) / √head_dim            p = 0..pos, k_p read from its page slot
 *   a_p  = exp(s_p − max s) / Σ exp(s − max s)
 *   out  = Σ_p a_p · v_p                    in index order
 * Position p lives in slot p mod page_tokens of page-table entry p / page_tokens; forward.c
 * checked every page (owner, tag, verified fill) before this runs, and positions past pos are
 * never read.
 */
#include "attention.h"

#include <math.h>

#include "kernels.h"

size_t kvf__attn_scratch_floats(uint32_t n_ctx, uint32_t n_heads)
{
    return (size_t)n_ctx * n_heads;
}

void kvf__attn_chunk(const struct kvf_attn_batch *b, uint32_t i, uint32_t n, uint32_t thread)
{
    uint32_t hd = b->head_dim, n_kv = b->n_kv_heads, group = b->n_heads / n_kv;
    uint32_t pt = b->page_tokens;
    size_t q_dim = (size_t)b->n_heads * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = b->scratch + (size_t)thread * b->scratch_floats;
    const struct kvf_kern *kern = kvf__kern;
    /* Items are dealt round-robin rather than in ranges: in a prefill chunk, later tokens attend
     * over more positions, and a range split would give the last thread most of the work. */
    for (uint32_t item = i; item < b->nt * b->n_heads; item += n) {
        uint32_t t = item / b->n_heads, h = item % b->n_heads, kvh = h / group;
        const struct kvf_fwd_seq *s = &b->seqs[b->tok_seq[t]];
        uint32_t pos = b->tok_pos[t];
        const float *q = b->q + (size_t)t * q_dim + (size_t)h * hd;
        float mx = -INFINITY;
        for (uint32_t p = 0; p <= pos; p++) {
            const uint8_t *page = b->pool_base + (size_t)s->pages[p / pt].page * b->page_bytes;
            const float *kp = (const float *)(page + b->k_off) + ((size_t)(p % pt) * n_kv + kvh) * hd;
            float d = kern->dot(q, kp, hd) * scale;
            sc[p] = d;
            if (d > mx) mx = d;
        }
        float sum = 0.0f;
        for (uint32_t p = 0; p <= pos; p++) {
            sc[p] = expf(sc[p] - mx);
            sum += sc[p];
        }
        float inv = 1.0f / sum;
        float *out = b->out + (size_t)t * q_dim + (size_t)h * hd;
        for (uint32_t e = 0; e < hd; e++) out[e] = 0.0f;
        for (uint32_t p = 0; p <= pos; p++) {
            const uint8_t *page = b->pool_base + (size_t)s->pages[p / pt].page * b->page_bytes;
            const float *vp = (const float *)(page + b->v_off) + ((size_t)(p % pt) * n_kv + kvh) * hd;
            kern->axpy(out, sc[p] * inv, vp, hd);
        }
    }
}

void kvf__swiglu(float *g, const float *u, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
