/*
 * attention.c — causal attention over pool pages, and SwiGLU: the chunking, and the scalar
 * variant's kernels.
 *
 * For a token at position pos of its sequence, and query head h (K/V head h / group):
 *   s_p  = (q · k_p) / √head_dim            p = 0..pos, k_p read from its page slot
 *   e_p  = exp(s_p − max s)
 *   out  = (Σ_p e_p · v_p) / Σ_p e_p        both sums in a fixed order
 * Position p lives in slot p mod page_tokens of page-table entry p / page_tokens; forward.c
 * checked every page (owner, tag, verified fill) before this runs, and positions past pos are
 * never read.
 *
 * A kernel call takes the query heads [h0, h1) of one K/V group of one token, so that the
 * group's K and V rows are fetched once for all of them; what it computes for each head is the
 * same whichever other heads of the group share the call (attention.h).
 */
#include "attention.h"

#include "kernels.h"

size_t kvf__attn_scratch_floats(uint32_t n_ctx, uint32_t n_heads)
{
    return (size_t)n_heads * kvf__attn_score_stride(n_ctx ? n_ctx - 1 : 0);
}

void kvf__attn_chunk(const struct kvf_attn_batch *b, uint32_t i, uint32_t n, uint32_t thread)
{
    uint32_t group = b->n_heads / b->n_kv_heads;
    float *scratch = b->scratch + (size_t)thread * b->scratch_floats;
    /* Work items are whole K/V groups of a token when there are enough of them to keep every
     * chunk busy, and single query heads otherwise (a decode step of one sequence on a model
     * with 3 K/V heads would leave most chunks idle). The values do not depend on it.
     * Items are dealt round-robin rather than in ranges: in a prefill chunk, later tokens attend
     * over more positions, and a range split would give the last thread most of the work. */
    uint32_t per = (uint64_t)b->nt * b->n_kv_heads >= 2u * n ? group : 1;
    uint32_t per_tok = b->n_heads / per;
    for (uint32_t item = i; item < b->nt * per_tok; item += n) {
        uint32_t t = item / per_tok, h0 = item % per_tok * per;
        kvf__kern->attn_heads(b, t, h0, h0 + per, scratch);
    }
}

/*
 * The scalar variant: each head on its own, every sum a plain loop in index order. scratch
 * holds one score row of kvf__attn_score_stride(pos) floats. O((h1 - h0) · (pos + 1) · hd).
 */
void kvf__attn_heads_scalar(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                            float *scratch)
{
    /* Positions are walked in runs of this many, so that the row pointers fit on the stack. */
    enum { RUN = 64 };
    const float *rows[RUN];
    uint32_t hd = b->head_dim, group = b->n_heads / b->n_kv_heads, kvh = h0 / group;
    size_t q_dim = (size_t)b->n_heads * hd;
    const struct kvf_fwd_seq *s = &b->seqs[b->tok_seq[t]];
    uint32_t n = b->tok_pos[t] + 1;
    float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t h = h0; h < h1; h++) {
        const float *q = b->q + (size_t)t * q_dim + (size_t)h * hd;
        float *out = b->out + (size_t)t * q_dim + (size_t)h * hd;
        float mx = -INFINITY;
        for (uint32_t p0 = 0; p0 < n; p0 += RUN) {
            uint32_t m = n - p0 < RUN ? n - p0 : RUN;
            kvf__attn_rows(b, s, b->k_off, kvh, p0, m, rows);
            for (uint32_t j = 0; j < m; j++) {
                float d = 0.0f;
                for (uint32_t e = 0; e < hd; e++) d += q[e] * rows[j][e];
                d *= scale;
                scratch[p0 + j] = d;
                /* A NaN score is skipped here but not lost: its own exp, and so the sum, is NaN. */
                if (d > mx) mx = d;
            }
        }
        float sum = 0.0f;
        for (uint32_t p = 0; p < n; p++) {
            scratch[p] = kvf__expf(scratch[p] - mx);
            sum += scratch[p];
        }
        for (uint32_t e = 0; e < hd; e++) out[e] = 0.0f;
        for (uint32_t p0 = 0; p0 < n; p0 += RUN) {
            uint32_t m = n - p0 < RUN ? n - p0 : RUN;
            kvf__attn_rows(b, s, b->v_off, kvh, p0, m, rows);
            for (uint32_t j = 0; j < m; j++)
                for (uint32_t e = 0; e < hd; e++) out[e] += scratch[p0 + j] * rows[j][e];
        }
        float inv = 1.0f / sum;
        for (uint32_t e = 0; e < hd; e++) out[e] *= inv;
    }
}

void kvf__swiglu_scalar(float *g, const float *u, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) g[i] = kvf__swiglu1(g[i], u[i]);
}

void kvf__swiglu(float *g, const float *u, uint32_t n)
{
    kvf__kern->swiglu(g, u, n);
}
