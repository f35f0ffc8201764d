/*
 * attention.c — causal attention over pool pages, and SwiGLU: work items, the combine of
 * segment partials, and the scalar variant's kernels.
 *
 * For a token at position pos of its sequence, and query head h (K/V head h / group):
 *   s_p  = (q · k_p) / √head_dim            p = 0..pos, k_p read from its page slot
 *   out  = Σ_p softmax(s)_p · v_p
 * computed segment by segment and combined as attention.h describes. Position p lives in slot
 * p mod page_tokens of page-table entry p / page_tokens; forward.c checked every page (owner,
 * tag, verified fill) before this runs, and positions past pos are never read.
 */
#include "attention.h"

#include "kernels.h"

static uint32_t n_segs(uint32_t n_ctx)
{
    return (n_ctx + KVF_ATTN_SEG - 1) / KVF_ATTN_SEG;
}

size_t kvf__attn_scratch_floats(uint32_t n_ctx, uint32_t n_heads, uint32_t head_dim)
{
    size_t parts = (size_t)n_segs(n_ctx) * kvf__attn_part_size(head_dim);
    return (size_t)KVF_ATTN_BLOCK * n_heads * (KVF_ATTN_SCORE_STRIDE + parts);
}

/* Splits only when whole groups would leave chunks idle, and there is more than one chunk. */
static bool split_batch(const struct kvf_attn_batch *b, uint32_t n)
{
    return n > 1 && (uint64_t)b->nt * b->n_kv_heads < 2u * n;
}

size_t kvf__attn_part_floats(uint32_t n_ctx, uint32_t n_heads, uint32_t head_dim,
                             uint32_t max_tokens, uint32_t n_chunks)
{
    size_t tokens = n_chunks > 1 ? 2u * n_chunks : 0;
    if (tokens > max_tokens) tokens = max_tokens;
    return tokens * n_heads * n_segs(n_ctx) * kvf__attn_part_size(head_dim) + 1;
}

/* The most segments any token of the batch has: the stride of the shared partials. O(nt). */
static uint32_t batch_segs(const struct kvf_attn_batch *b)
{
    uint32_t most = 0;
    for (uint32_t t = 0; t < b->nt; t++)
        if (b->tok_pos[t] > most) most = b->tok_pos[t];
    return most / KVF_ATTN_SEG + 1;
}

/* out[0..hd) from the n_seg partials of one (token, head), at part + s · kvf__attn_part_size.
 * Every variant combines with this code, so the split and the unsplit path agree bit for bit.
 * A NaN anywhere in a partial reaches the output: through l, which is NaN whenever a score or
 * m is. O(n_seg · hd). On x86 a second copy is built for CPUs with FMA and chosen at load:
 * there the fmaf and nearbyintf of kvf__expf are single instructions rather than library
 * calls (a tenth of a decode step's attention went to them); both are exactly rounded, so the
 * two copies give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("fma", "default")))
#endif
static void
combine(const float *part, uint32_t n_seg, uint32_t hd, float *out)
{
    size_t ps = kvf__attn_part_size(hd);
    float mx = part[hd], l = 0.0f;
    for (uint32_t s = 1; s < n_seg; s++)
        if (part[s * ps + hd] > mx) mx = part[s * ps + hd];
    for (uint32_t s = 0; s < n_seg; s++) {
        const float *acc = part + s * ps;
        float w = kvf__expf(acc[hd] - mx);
        l += acc[hd + 1] * w;
        /* Multiply, then add: this file is built for baseline x86-64, where fmaf would be a
         * library call per element. */
        if (s == 0)
            for (uint32_t e = 0; e < hd; e++)
                out[e] = acc[e] * w;
        else
            for (uint32_t e = 0; e < hd; e++)
                out[e] += acc[e] * w;
    }
    float inv = 1.0f / l;
    for (uint32_t e = 0; e < hd; e++)
        out[e] *= inv;
}

/* Queues the whole slots (every K/V head) of segment seg of token t, K and V, into pf: on each
 * page a contiguous run of bytes, which memory serves far better than the K/V heads' rows one
 * by one (a head's row is a few hundred bytes of every slot). per_step is set for a drain in
 * `steps` steps. O(pages of the segment). */
static void queue_slots(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, uint32_t steps,
                        struct kvf_attn_pf *pf)
{
    const struct kvf_fwd_seq *s = &b->seqs[b->tok_seq[t]];
    uint32_t pt = b->page_tokens, p0 = seg * KVF_ATTN_SEG, p1 = p0 + kvf__attn_seg_len(b, t, seg);
    size_t slot_bytes = (size_t)b->n_kv_heads * b->head_dim * b->elem_bytes;
    uint64_t total = 0;
    pf->n_runs = pf->run_at = pf->line_at = 0;
    for (uint32_t p = p0; p < p1 && pf->n_runs + 2 <= KVF_ATTN_PF_RUNS;) {
        uint32_t pi = p / pt, s0 = p % pt, s1 = p1 - p + s0 < pt ? p1 - p + s0 : pt;
        const uint8_t *page = b->pool_base + (size_t)s->pages[pi].page * b->page_bytes;
        for (int kv = 0; kv < 2; kv++) {
            pf->run[pf->n_runs] = page + (kv ? b->v_off : b->k_off) + s0 * slot_bytes;
            pf->lines[pf->n_runs] = (uint32_t)(((s1 - s0) * slot_bytes + 63) / 64);
            total += pf->lines[pf->n_runs++];
        }
        p += s1 - s0;
    }
    pf->per_step = (uint32_t)((total + steps - 1) / steps);
}

/* Asks for segment seg of token t's slots into L2 all at once, for an item that nothing before
 * it on this thread could queue: the heads of the token then find them in L2 (measured on a
 * batched decode step of smol135m Q8_0, 16 sequences at 128-192 positions: 6-8% faster than
 * leaving it to the kernel's own per-row requests). */
static void prefetch_slots(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg)
{
    struct kvf_attn_pf pf;
    queue_slots(b, t, seg, 1, &pf);
    kvf__attn_pf_step(&pf);
}

/* Whether the batch's items are whole decode tokens: more than one token per chunk (twice the
 * chunks), every token its sequence's only one (tokens come grouped by sequence). O(nt). */
static bool decode_items(const struct kvf_attn_batch *b, uint32_t n)
{
    if (split_batch(b, n) || b->nt < 2u * n) return false;
    for (uint32_t t = 1; t < b->nt; t++)
        if (b->tok_seq[t] == b->tok_seq[t - 1]) return false;
    return true;
}

void kvf__attn_ask_first(const struct kvf_attn_batch *b, uint32_t i, uint32_t n)
{
    if (i < b->nt && decode_items(b, n)) prefetch_slots(b, i, 0);
}

bool kvf__attn_quantizes(const struct kvf_attn_batch *b, uint32_t n)
{
    return b->outq && decode_items(b, n);
}

void kvf__attn_chunk(const struct kvf_attn_batch *b, uint32_t i, uint32_t n, uint32_t thread)
{
    uint32_t hd = b->head_dim, n_kv = b->n_kv_heads, group = b->n_heads / n_kv;
    size_t ps = kvf__attn_part_size(hd);
    float *scores = b->scratch + (size_t)thread * b->scratch_floats;
    const struct kvf_kern *kern = kvf__kern;
    /* Items are dealt round-robin rather than in ranges: in a prefill chunk, later tokens attend
     * over more positions, and a range split would give the last thread most of the work. */
    if (split_batch(b, n)) {
        uint32_t S = batch_segs(b);
        for (uint32_t item = i; item < b->nt * n_kv * S; item += n) {
            uint32_t t = item / (n_kv * S), kvh = item / S % n_kv, seg = item % S;
            if (seg > b->tok_pos[t] / KVF_ATTN_SEG) continue;
            float *part = b->part + (((size_t)t * b->n_heads + kvh * group) * S + seg) * ps;
            kern->attn_seg(b, t, kvh * group, (kvh + 1) * group, seg, part, S * ps, scores, NULL);
        }
        return;
    }
    float *part = scores + (size_t)KVF_ATTN_BLOCK * b->n_heads * KVF_ATTN_SCORE_STRIDE;
    size_t q_dim = (size_t)b->n_heads * hd;
    bool decode = decode_items(b, n);
    /* A prefill chunk, with enough tokens for every chunk: an item is a block of
     * KVF_ATTN_BLOCK consecutive tokens of the batch, taken as runs of one sequence's tokens at
     * consecutive positions (a prefill chunk's are; any others make runs of one); each run's
     * tokens share every K and V row read (attn_segs), segment by segment, all K/V heads,
     * then combine their partials. */
    if (b->nt >= 2u * n && !decode) {
        for (uint32_t a0 = i * KVF_ATTN_BLOCK; a0 < b->nt; a0 += n * KVF_ATTN_BLOCK) {
            uint32_t e = b->nt - a0 < KVF_ATTN_BLOCK ? b->nt : a0 + KVF_ATTN_BLOCK;
            for (uint32_t a = a0, z; a < e; a = z) {
                for (z = a + 1; z < e && b->tok_seq[z] == b->tok_seq[a] &&
                                b->tok_pos[z] == b->tok_pos[z - 1] + 1;)
                    z++;
                uint32_t segs = b->tok_pos[z - 1] / KVF_ATTN_SEG + 1;
                size_t ts = (size_t)b->n_heads * segs * ps;
                for (uint32_t seg = 0; seg < segs; seg++)
                    for (uint32_t kvh = 0; kvh < n_kv; kvh++)
                        kern->attn_segs(b, a, z - a, kvh * group, (kvh + 1) * group, seg,
                                        part + ((size_t)kvh * group * segs + seg) * ps, segs * ps,
                                        ts, scores);
                for (uint32_t u = a; u < z; u++)
                    for (uint32_t h = 0; h < b->n_heads; h++)
                        combine(part + (u - a) * ts + (size_t)h * segs * ps,
                                b->tok_pos[u] / KVF_ATTN_SEG + 1, hd,
                                b->out + (size_t)u * q_dim + (size_t)h * hd);
            }
        }
        return;
    }
    /* A decode step with enough tokens for every chunk: an item is a whole token, for each
     * segment all its K/V heads in turn. The heads of a position sit side by side in its slot,
     * so the segment's K and V are then read as whole slots, close together in time (measured:
     * a batched decode step about 3% faster at 400 positions). The chunk's first item asks for
     * its slots at once; every other one was queued by the item before (attention.h). Fewer
     * tokens are cut finer, by K/V head. */
    if (decode) {
        struct kvf_attn_pf pf;
        for (uint32_t t = i; t < b->nt; t += n) {
            uint32_t segs = b->tok_pos[t] / KVF_ATTN_SEG + 1;
            for (uint32_t seg = 0; seg < segs; seg++) {
                if (t == i && seg == 0 && !b->first_asked) prefetch_slots(b, t, seg);
                /* This chunk's next item, while this one computes. */
                uint32_t t2 = seg + 1 < segs ? t : t + n, s2 = seg + 1 < segs ? seg + 1 : 0;
                struct kvf_attn_pf *next = NULL;
                if (t2 < b->nt) {
                    uint32_t steps = b->n_heads * ((kvf__attn_seg_len(b, t, seg) + 7) / 8);
                    queue_slots(b, t2, s2, steps, &pf);
                    next = &pf;
                }
                kern->attn_tok(b, t, seg, part + (size_t)seg * ps, segs * ps, scores, next);
            }
            for (uint32_t h = 0; h < b->n_heads; h++)
                combine(part + (size_t)h * segs * ps, segs, hd,
                        b->out + (size_t)t * q_dim + (size_t)h * hd);
            if (b->outq)
                kern->quant_a16(b->out + (size_t)t * q_dim, b->outq->q + (size_t)t * b->outq->ld,
                                b->outq->d + t, b->outq->s + (size_t)t * (b->outq->ld / KVF_QK),
                                (uint32_t)q_dim);
        }
        return;
    }
    for (uint32_t item = i; item < b->nt * n_kv; item += n) {
        uint32_t t = item / n_kv, h0 = item % n_kv * group;
        uint32_t segs = b->tok_pos[t] / KVF_ATTN_SEG + 1;
        for (uint32_t seg = 0; seg < segs; seg++)
            kern->attn_seg(b, t, h0, h0 + group, seg, part + seg * ps, segs * ps, scores, NULL);
        for (uint32_t h = h0; h < h0 + group; h++)
            combine(part + (h - h0) * segs * ps, segs, hd,
                    b->out + (size_t)t * q_dim + (size_t)h * hd);
    }
}

void kvf__attn_finish(const struct kvf_attn_batch *b, uint32_t n)
{
    if (!split_batch(b, n)) return;
    uint32_t S = batch_segs(b), hd = b->head_dim;
    size_t ps = kvf__attn_part_size(hd);
    for (uint32_t t = 0; t < b->nt; t++)
        for (uint32_t h = 0; h < b->n_heads; h++)
            combine(b->part + ((size_t)t * b->n_heads + h) * S * ps,
                    b->tok_pos[t] / KVF_ATTN_SEG + 1, hd,
                    b->out + ((size_t)t * b->n_heads + h) * hd);
}

/*
 * The scalar variant: each head on its own, every sum a plain loop in index order.
 * O((h1 - h0) · KVF_ATTN_SEG · hd).
 */
void kvf__attn_seg_scalar(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                          uint32_t seg, float *part, size_t part_stride, float *scores,
                          struct kvf_attn_pf *pf)
{
    const void *rows[KVF_ATTN_SEG];
    uint32_t eb = b->elem_bytes, hd = b->head_dim, group = b->n_heads / b->n_kv_heads;
    uint32_t kvh = h0 / group;
    size_t q_dim = (size_t)b->n_heads * hd;
    const struct kvf_fwd_seq *s = &b->seqs[b->tok_seq[t]];
    uint32_t p0 = seg * KVF_ATTN_SEG, n = kvf__attn_seg_len(b, t, seg);
    float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t h = h0; h < h1; h++) {
        const float *q = b->q + (size_t)t * q_dim + (size_t)h * hd;
        float *acc = part + (h - h0) * part_stride, mx = -INFINITY, sum = 0.0f;
        kvf__attn_rows(b, s, b->k_off, kvh, p0, n, rows);
        for (uint32_t j = 0; j < n; j++) {
            if (j % 8 == 0) kvf__attn_pf_step(pf);
            float d = 0.0f;
            for (uint32_t e = 0; e < hd; e++)
                d += q[e] * kvf__kv_elem(rows[j], e, eb);
            scores[j] = d * scale;
            /* A NaN score is skipped here but not lost: its own exp, and so l, is NaN. */
            if (scores[j] > mx) mx = scores[j];
        }
        for (uint32_t j = 0; j < n; j++) {
            scores[j] = kvf__expf(scores[j] - mx);
            sum += scores[j];
        }
        for (uint32_t e = 0; e < hd; e++)
            acc[e] = 0.0f;
        kvf__attn_rows(b, s, b->v_off, kvh, p0, n, rows);
        for (uint32_t j = 0; j < n; j++)
            for (uint32_t e = 0; e < hd; e++)
                acc[e] += scores[j] * kvf__kv_elem(rows[j], e, eb);
        acc[hd] = mx;
        acc[hd + 1] = sum;
    }
}

void kvf__attn_segs_scalar(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                           uint32_t h1, uint32_t seg, float *part, size_t part_stride,
                           size_t tok_stride, float *scores)
{
    if (NEVER(!kvf__attn_run_ok(b, t0, nb))) return;
    for (uint32_t u = 0; u < nb; u++)
        if (kvf__attn_seg_len(b, t0 + u, seg) > 0)
            kvf__attn_seg_scalar(b, t0 + u, h0, h1, seg, part + u * tok_stride, part_stride,
                                 scores + (size_t)u * (h1 - h0) * KVF_ATTN_SCORE_STRIDE, NULL);
}

void kvf__attn_tok_scalar(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                          size_t part_stride, float *scores, struct kvf_attn_pf *pf)
{
    uint32_t group = b->n_heads / b->n_kv_heads;
    for (uint32_t h = 0; h < b->n_heads; h += group)
        kvf__attn_seg_scalar(b, t, h, h + group, seg, part + h * part_stride, part_stride, scores,
                             pf);
}

void kvf__swiglu_scalar(float *g, const float *u, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        g[i] = kvf__swiglu1(g[i], u[i]);
}

void kvf__swiglu(float *g, const float *u, uint32_t n)
{
    kvf__kern->swiglu(g, u, n);
}
