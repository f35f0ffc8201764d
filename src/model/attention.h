/*
 * attention.h — causal attention over pool pages, and the SwiGLU activation (internal to
 * src/model). forward.c describes a batch once per layer in a kvf_attn_batch, lets the thread
 * pool call kvf__attn_chunk for every chunk, then calls kvf__attn_finish; the arithmetic is
 * done by the kernel variant's attn_seg and swiglu (kernels.h), scalar ones in attention.c and
 * AVX2 ones in attention_x86.c.
 *
 * Segments. A token's positions 0..pos are cut into segments of KVF_ATTN_SEG positions
 * ([0, SEG), [SEG, 2·SEG), ...), always, whatever the batch. For each segment and query head a
 * kernel computes a partial: m = the segment's max score, l = Σ exp(s_p − m), and
 * acc = Σ exp(s_p − m) · v_p. The partials are then combined in segment order
 * (attention.c): M = max m, w = exp(m − M), out = (Σ w · acc) / (Σ w · l). A single
 * segment gives w = 1, so short contexts are plain two-pass softmax.
 *
 * Who computes what. Normally one work item is a token's K/V group (its query heads share
 * every K and V row read) with all its segments, combined on the spot in the thread's scratch.
 * When a batch has too few such items to keep every chunk busy — a decode step of one or a few
 * sequences — items are (token, group, segment) instead, the partials go to the shared
 * b->part, and kvf__attn_finish combines them once all chunks are done.
 *
 * Invariance: each (token, head) output is computed by one fixed sequence of operations that
 * depends only on that token's query, its own sequence's K/V and its position — never on
 * which other tokens share the batch, how the work is chunked or split into items, which
 * thread runs it, or which other query heads of its K/V group are computed in the same call.
 */
#ifndef KVF_MODEL_ATTENTION_H
#define KVF_MODEL_ATTENTION_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/common.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"
#include "kvfence/gguf.h"

struct kvf_act16;

struct kvf_attn_batch {
    uint32_t nt; /* tokens in the batch */
    uint32_t n_heads, n_kv_heads, head_dim;
    const float *q;                 /* (nt, n_heads · head_dim), RoPE applied */
    float *out;                     /* (nt, n_heads · head_dim) attention output */
    const uint32_t *tok_seq;        /* [nt] index into seqs */
    const uint32_t *tok_pos;        /* [nt] position: attends over 0..pos of its sequence */
    const struct kvf_fwd_seq *seqs; /* page tables, checked by forward.c before this runs */
    const uint8_t *pool_base;       /* page p's data is at pool_base + p · page_bytes */
    size_t page_bytes;
    uint32_t page_tokens;
    size_t k_off, v_off; /* this layer's K and V blocks inside a page */
    uint32_t elem_bytes; /* a K/V element: 4, a float; 2, an IEEE half */
    float *scratch;      /* per thread: scratch_floats floats at thread · scratch_floats */
    size_t scratch_floats;
    float *part;            /* kvf__attn_part_floats floats, shared: split partials */
    bool first_asked;       /* a decode step's chunk i of n: kvf__attn_ask_first(b, i,
                             * n) ran in an earlier phase, so its first item's K/V
                             * lines are on their way */
    struct kvf_act16 *outq; /* when set, and items are whole decode tokens, each token's
                             * out row is also quantized into it, at row t
                             * (kvf__attn_quantizes) */
};

/* Tokens of one sequence a prefill work item takes together (attention_x86.c's attn_segs):
 * they share each K and V row while it is in L1. */
#define KVF_ATTN_BLOCK 4

/* Positions per segment (see above). A multiple of 8. Long enough that the per-segment work
 * (a partial's store and its share of the combine, about 2 · head_dim operations) is a few
 * percent of the segment's 4 · SEG · head_dim; short enough that a decode step at a context
 * of a few hundred already has several items per K/V group to share between threads. */
#define KVF_ATTN_SEG 128

/* Floats in one partial: acc[head_dim], then m, then l. */
static inline size_t kvf__attn_part_size(uint32_t head_dim)
{
    return (size_t)head_dim + 2;
}

/* Floats of per-thread scratch kvf__attn_chunk needs for a model with this context length and
 * head shape: for each of KVF_ATTN_BLOCK tokens, a row of KVF_ATTN_SEG scores per query head
 * (padded by one vector, which a kernel may store past the last position), and every segment's
 * partial for every query head. */
size_t kvf__attn_scratch_floats(uint32_t n_ctx, uint32_t n_heads, uint32_t head_dim);

/* Floats of the shared partials (b->part) for batches of up to max_tokens tokens run in
 * n_chunks chunks: the split happens only for fewer than 2 · n_chunks tokens. At least 1. */
size_t kvf__attn_part_floats(uint32_t n_ctx, uint32_t n_heads, uint32_t head_dim,
                             uint32_t max_tokens, uint32_t n_chunks);

/*
 * The next work item's K/V lines, asked for a few at a time while a kernel computes the current
 * item: in a decode step every token's slots come from memory, and asking for a whole segment
 * at once (as for a chunk's first item) leaves the thread idle until they have all arrived;
 * spread over the arithmetic of the item before, the fetch overlaps it. Measured with
 * `kvfence bench attention` (16 sequences at 192 positions, 30 layers of F32 K/V), together
 * with one chunk per thread (forward.c): about 23% less time on 2 threads, 36% on 1.
 *
 * runs[] are contiguous byte ranges (a segment's K or V slots on one page), lines[] their
 * 64-byte lines; a segment on more than KVF_ATTN_PF_RUNS / 2 pages is queued only in part,
 * which only fetches less ahead. Filled by attention.c, drained by kvf__attn_pf_step.
 */
#define KVF_ATTN_PF_RUNS (2 * (KVF_ATTN_SEG / 8 + 1))

struct kvf_attn_pf {
    const uint8_t *run[KVF_ATTN_PF_RUNS];
    uint32_t lines[KVF_ATTN_PF_RUNS];
    uint32_t n_runs;
    uint32_t run_at, line_at; /* the next line to ask for */
    uint32_t per_step;        /* lines asked for per kvf__attn_pf_step */
};

/* Kernels call this once per (block of 8 positions, query head) of the score pass: the steps
 * of one item number n_heads · ceil(positions / 8), which is what the queue was sized for.
 * pf may be NULL (nothing queued). */
static inline void kvf__attn_pf_step(struct kvf_attn_pf *pf)
{
    if (!pf) return;
    /* The lines in order, per_step of them: a run at a time, so the inner loop is the
     * prefetches alone (it was a run-boundary test per line, a tenth of an item's time). */
    for (uint32_t c = pf->per_step; c > 0 && pf->run_at < pf->n_runs;) {
        const uint8_t *r = pf->run[pf->run_at];
        uint32_t at = pf->line_at, end = pf->lines[pf->run_at];
        uint32_t k = end - at < c ? end - at : c;
        for (uint32_t i = 0; i < k; i++)
            __builtin_prefetch(r + (size_t)(at + i) * 64, 0, 2);
        c -= k;
        if (at + k == end) {
            pf->line_at = 0;
            pf->run_at++;
        } else {
            pf->line_at = at + k;
        }
    }
}

/* Chunk i of n of the batch's attention, run by thread `thread`. */
void kvf__attn_chunk(const struct kvf_attn_batch *b, uint32_t i, uint32_t n, uint32_t thread);

/* Asks for the K/V lines of the first item of chunk i of n, when the batch's items are whole
 * decode tokens (nothing otherwise): called by the thread that will run the chunk, in a phase
 * before it, with b->first_asked set. O(pages of a segment). */
void kvf__attn_ask_first(const struct kvf_attn_batch *b, uint32_t i, uint32_t n);

/* Whether kvf__attn_chunk(b, i, n, ...) quantizes the out rows into b->outq (kernels.h's
 * quant_a16, the bits a separate pass would give): b->outq set, and the batch a decode step
 * whose items are whole tokens, each finished by one chunk. O(nt). */
bool kvf__attn_quantizes(const struct kvf_attn_batch *b, uint32_t n);

/* After every chunk i < n of kvf__attn_chunk(b, i, n, ...) has returned: combines the split
 * partials, if the batch was split (nothing to do otherwise). On the calling thread; O(tokens ·
 * heads · segments · head_dim), small, as it only splits batches of a few tokens. */
void kvf__attn_finish(const struct kvf_attn_batch *b, uint32_t n);

/* g[i] = silu(g[i]) · u[i] for i < n, by the chosen variant; each element's value depends on
 * g[i] and u[i] alone, wherever the range starts. */
void kvf__swiglu(float *g, const float *u, uint32_t n);

/* Stride, in floats, between the score rows of the heads of one kernel call: a segment, plus
 * one vector of room for stores past its end. */
#define KVF_ATTN_SCORE_STRIDE (KVF_ATTN_SEG + 8)

/*
 * Pointers to the K (off = b->k_off) or V (off = b->v_off) rows of kv head kvh at positions
 * p0 .. p0 + n - 1 of sequence s, into rows[0..n): head_dim elements of b->elem_bytes each.
 * One division for the first position, then a walk along the page table: O(n).
 */
static inline void kvf__attn_rows(const struct kvf_attn_batch *b, const struct kvf_fwd_seq *s,
                                  size_t off, uint32_t kvh, uint32_t p0, uint32_t n,
                                  const void **rows)
{
    uint32_t pt = b->page_tokens, pi = p0 / pt, slot = p0 % pt;
    size_t row_bytes = (size_t)b->n_kv_heads * b->head_dim * b->elem_bytes;
    size_t head = (size_t)kvh * b->head_dim * b->elem_bytes;
    const uint8_t *base = b->pool_base + off;
    const uint8_t *blk = base + (size_t)s->pages[pi].page * b->page_bytes;
    for (uint32_t j = 0; j < n; j++) {
        rows[j] = blk + slot * row_bytes + head;
        if (++slot == pt && j + 1 < n) {
            slot = 0;
            pi++;
            blk = base + (size_t)s->pages[pi].page * b->page_bytes;
        }
    }
}

/* Positions of segment seg that token t attends over: 0 when its position is before it. */
static inline uint32_t kvf__attn_seg_len(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg)
{
    uint32_t p0 = seg * KVF_ATTN_SEG, end = b->tok_pos[t] + 1;
    if (end <= p0) return 0;
    return end - p0 < KVF_ATTN_SEG ? end - p0 : KVF_ATTN_SEG;
}

/* Whether tokens t0 .. t0 + nb - 1 are what attn_segs takes: 1 to KVF_ATTN_BLOCK of them, of
 * one sequence, at consecutive positions. O(nb). */
static inline bool kvf__attn_run_ok(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb)
{
    if (nb == 0 || nb > KVF_ATTN_BLOCK) return false;
    for (uint32_t u = 1; u < nb; u++)
        if (b->tok_seq[t0 + u] != b->tok_seq[t0] || b->tok_pos[t0 + u] != b->tok_pos[t0] + u)
            return false;
    return true;
}

/* Whether token t is its sequence's only token in the batch (a decode step, not a prefill
 * chunk, whose tokens share their sequence's K/V rows and so find them cached). */
static inline bool kvf__attn_tok_alone(const struct kvf_attn_batch *b, uint32_t t)
{
    return (t == 0 || b->tok_seq[t - 1] != b->tok_seq[t]) &&
           (t + 1 == b->nt || b->tok_seq[t + 1] != b->tok_seq[t]);
}

/* Element e of a K/V row of elem_bytes-wide elements, as a float (a half converts exactly). */
static inline float kvf__kv_elem(const void *row, uint32_t e, uint32_t elem_bytes)
{
    if (elem_bytes == 2) return kvf_fp16_to_f32(((const uint16_t *)row)[e]);
    return ((const float *)row)[e];
}

/*
 * e^x in float: x = k·ln 2 + r with k = round(x · log2 e) and |r| ≤ ln 2 / 2 (Cody-Waite, two
 * FMA steps), e^r by its Taylor polynomial of degree 7 (truncation error below 1e-8 relative),
 * times 2^k applied as 2^(k/2) · 2^(k - k/2) so that both factors are normal floats. Within
 * 1.5 ulp of e^x for results above FLT_MIN (tested; about 0.93 ulp at worst measured); smaller
 * results lose bits in the second scaling step's rounding, to 0 below about -103.3; +inf
 * above 88.72; NaN stays NaN.
 *
 * The AVX2 variant's vector exp (attention_x86.c) is this same sequence of operations lane by
 * lane — the clamp written as its max/min, fmaf where it uses FMA, the same constants — so the
 * two give the same bits, and a scalar tail computes exactly what a vector lane would.
 */
#define KVF_EXP_LO     (-110.0f) /* below: e^x rounds to 0 anyway */
#define KVF_EXP_HI     90.0f     /* above: e^x overflows to +inf anyway */
#define KVF_EXP_LOG2E  1.44269502f
#define KVF_EXP_LN2_HI 0.693359375f      /* 355/512: k · LN2_HI is exact */
#define KVF_EXP_LN2_LO (-2.12194440e-4f) /* ln 2 − LN2_HI */
#define KVF_EXP_C2     (1.0f / 2.0f)
#define KVF_EXP_C3     (1.0f / 6.0f)
#define KVF_EXP_C4     (1.0f / 24.0f)
#define KVF_EXP_C5     (1.0f / 120.0f)
#define KVF_EXP_C6     (1.0f / 720.0f)
#define KVF_EXP_C7     (1.0f / 5040.0f)

static inline float kvf__expf(float x)
{
    if (x != x) return x;
    float xc = x > KVF_EXP_LO ? x : KVF_EXP_LO;
    xc = xc < KVF_EXP_HI ? xc : KVF_EXP_HI;
    float k = nearbyintf(xc * KVF_EXP_LOG2E);
    float r = fmaf(k, -KVF_EXP_LN2_HI, xc);
    r = fmaf(k, -KVF_EXP_LN2_LO, r);
    float p = fmaf(KVF_EXP_C7, r, KVF_EXP_C6);
    p = fmaf(p, r, KVF_EXP_C5);
    p = fmaf(p, r, KVF_EXP_C4);
    p = fmaf(p, r, KVF_EXP_C3);
    p = fmaf(p, r, KVF_EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t ki = (int32_t)k;
    int32_t k1 = (ki - (ki & 1)) / 2; /* floor(ki / 2), as the vector's arithmetic shift */
    int32_t k2 = ki - k1;
    union {
        uint32_t u;
        float f;
    } s1, s2;
    s1.u = (uint32_t)(k1 + 127) << 23;
    s2.u = (uint32_t)(k2 + 127) << 23;
    return p * s1.f * s2.f;
}

/* silu(g) · u, written as the vector kernels compute it: (g / (1 + e^-g)) · u. */
static inline float kvf__swiglu1(float g, float u)
{
    return g / (1.0f + kvf__expf(-g)) * u;
}

/* The scalar variant's kernels (kernels.h's attn_seg and swiglu). */
void kvf__attn_seg_scalar(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                          uint32_t seg, float *part, size_t part_stride, float *scores,
                          struct kvf_attn_pf *pf);
void kvf__attn_segs_scalar(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                           uint32_t h1, uint32_t seg, float *part, size_t part_stride,
                           size_t tok_stride, float *scores);
void kvf__attn_tok_scalar(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                          size_t part_stride, float *scores, struct kvf_attn_pf *pf);
void kvf__swiglu_scalar(float *g, const float *u, uint32_t n);

/* The AVX2 ones (attention_x86.c; defined where KVF_HAVE_X86_KERNELS is), and the vector exp
 * they share, y[i] = kvf__expf(x[i]) bit for bit, which the tests check directly. */
void kvf__attn_seg_avx2(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                        uint32_t seg, float *part, size_t part_stride, float *scores,
                        struct kvf_attn_pf *pf);
void kvf__attn_segs_avx2(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                         uint32_t h1, uint32_t seg, float *part, size_t part_stride,
                         size_t tok_stride, float *scores);
void kvf__attn_tok_avx2(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                        size_t part_stride, float *scores, struct kvf_attn_pf *pf);
void kvf__swiglu_avx2(float *g, const float *u, uint32_t n);
void kvf__exp_avx2(float *y, const float *x, uint32_t n);
/* The "avx2+vnni" variant's: the AVX2 ones' values, several query heads at a time, and SwiGLU
 * 16 lanes at a time. */
void kvf__swiglu_vnni(float *g, const float *u, uint32_t n);
void kvf__attn_tok_vnni(const struct kvf_attn_batch *b, uint32_t t, uint32_t seg, float *part,
                        size_t part_stride, float *scores, struct kvf_attn_pf *pf);
void kvf__attn_seg_vnni(const struct kvf_attn_batch *b, uint32_t t, uint32_t h0, uint32_t h1,
                        uint32_t seg, float *part, size_t part_stride, float *scores,
                        struct kvf_attn_pf *pf);
void kvf__attn_segs_vnni(const struct kvf_attn_batch *b, uint32_t t0, uint32_t nb, uint32_t h0,
                         uint32_t h1, uint32_t seg, float *part, size_t part_stride,
                         size_t tok_stride, float *scores);

#endif
