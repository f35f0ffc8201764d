/*
 * forward.c — the decoder forward pass (llama, qwen2, qwen3) over pool pages, batched across
 * sequences.
 *
 * The batch is flattened into T tokens (every new token of every sequence that passed its page
 * checks). Per layer, in the order of the math:
 *
 *   xb  = RMSNorm(x) ⊙ attn_norm                 (T, dim)
 *   q   = xb Wqᵀ, k = xb Wkᵀ, v = xb Wvᵀ          (T, q_dim), (T, kv_dim), (T, kv_dim)
 *        (+ bq, bk, bv: qwen2)
 *   q,k = RMSNorm(each head) ⊙ q_norm, k_norm     (qwen3)
 *   q,k = RoPE(q, k, pos)                         pairs (2i, 2i+1) (llama) or (i, i + hd/2)
 *                                                 (qwen2, qwen3), θ_i = base^(-2i/hd)
 *   pages[pos] ← k, v                             each token's K/V into its own sequence's page
 *   att = softmax(q kᵀ / √hd) v                   per (token, head), over positions 0..pos of
 *                                                 that token's sequence, read from its pages
 *   x  += att Woᵀ                                 (T, dim)
 *   xb  = RMSNorm(x) ⊙ ffn_norm
 *   h   = silu(xb Wgateᵀ) ⊙ (xb Wupᵀ)             (T, ffn_dim)
 *   x  += h Wdownᵀ
 *
 * and at the end, for the last new token of each sequence that asked for logits:
 *   logits = (RMSNorm(x) ⊙ out_norm) Woutputᵀ      (n_vocab)
 *
 * Matmuls are split into chunks of output rows, attention into chunks of (token, head) pairs,
 * and the chunks are run by whichever thread claims them (forward_pool.h); no sum is ever split
 * (kernels.h). Norms and activation quantization are chunked by token for batches of
 * PAR_ROWS_MIN tokens or more; RoPE and copying K/V into pages run on the calling thread.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "forward_pool.h"
#include "kvfence/common.h"
#include "model_internal.h"

struct kvf_fwd {
    const kvf_model_t *m;
    uint64_t layers_done; /* layers computed, ever: read by other threads (atomic access) */
    const struct kvf_alloc_ops *alloc; /* where this and the arena came from */
    uint8_t *arena; /* every scratch buffer below, 64-byte aligned, one allocation */
    size_t arena_bytes;
    struct kvf_tpool *tp;
    uint32_t max_tokens, max_seqs;
    uint32_t max_ctx;    /* positions a sequence may reach: the scratch is sized for it */
    uint32_t n_chunks;   /* chunks per parallel phase: 4 per thread, 1 without workers;
                          * the matrix products and a decode step's attention take one per
                          * thread (kvf_fwd_run) */
    float *x;            /* (max_tokens, dim) the residual stream */
    float *xb;           /* (max_tokens, max(dim, q_dim)) normed input, or attention out */
    float *o;            /* (max_tokens, dim) output of Wo and Wdown before the residual add */
    struct kvf_act16 xq; /* the current matmul input quantized for Q8_0 weights: (max_tokens,
                          * max(dim, q_dim, ffn_dim) rounded up to 32) int16, a scale each,
                          * and a sum per 32 */
    float *q;            /* (max_tokens, q_dim) */
    float *k, *v;        /* (max_tokens, kv_dim) */
    float *hg, *hu;      /* (max_tokens, ffn_dim) gate (then h), up */
    float *rope;         /* (max_tokens, head_dim / 2, 2) cos, sin per token and pair */
    float *scores;       /* (n_threads, kvf__attn_scratch_floats) attention scratch */
    size_t scores_per_thread;
    float *attn_part;  /* kvf__attn_part_floats: attention partials shared by threads */
    float *wrow;       /* (n_threads, max(dim, q_dim, ffn_dim)) one dequantized row */
    float *outx;       /* (max_seqs, dim) normed final rows of logit tokens */
    float *out;        /* (max_seqs, n_vocab) logits before they are copied out */
    uint32_t *tok_seq; /* [max_tokens] which sequence a token belongs to */
    uint32_t *tok_pos; /* [max_tokens] its position */
    int32_t *tok_id;   /* [max_tokens] its id */
    uint32_t *out_tok; /* [max_seqs] which token's row gives each sequence's logits */
    uint32_t *out_seq; /* [max_seqs] and which sequence it is */
    /* The batch between kvf_fwd_prepare and kvf_fwd_commit. */
    bool prepared, computed;
    struct kvf_fwd_seq *seqs;
    uint32_t n_seqs, nt, n_out, n_ok;
    uint8_t *pool_base; /* the pool's data region (fixed for the pool's life) */
    size_t page_bytes;
    struct kvf_pool_geometry geo;
};

/* What one parallel phase needs. */
struct job {
    struct kvf_fwd *f;
    const struct kvf_layer *L;
    uint32_t nt; /* tokens in the batch */
    const struct kvf_fwd_seq *seqs;
    const uint8_t *pool_base; /* page p's data is at pool_base + p * page_bytes */
    size_t page_bytes;
    const struct kvf_pool_geometry *geo;
    uint32_t layer;
    uint32_t n_out;             /* logit rows */
    struct kvf_attn_batch attn; /* this layer's attention (attention.h) */
    /* The per-row phase (norm_quant): rows [0, nt) of src (stride ld) are RMS-normed with
     * norm_w when norm_w is set — into dst, or with dst NULL into a scratch row that only the
     * quantization reads — then quantized into f->xq (16 bits) when quant is set. */
    const float *src;
    float *resid; /* with add: src's rows, x, get add's rows added first */
    const float *add;
    float *dst;
    const float *norm_w;
    size_t ld;
    uint32_t cols;
    bool quant;
};

/* Batches at least this many tokens do their per-row work (norms, activation quantization) on
 * every thread; smaller ones on the calling thread, where a dispatch would cost more than it
 * saves. A batched decode step of 16 rows spent about 6% of its time in this work on one
 * thread while the other waited. Either way each row gets the same operations. */
#define PAR_ROWS_MIN 8

static size_t max3(size_t a, size_t b, size_t c)
{
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* Carves the next buffer of `bytes` out of the arena (64-byte aligned); with base NULL only
 * counts. */
static void *carve(uint8_t *base, size_t *off, size_t bytes)
{
    size_t at = (*off + 63) & ~(size_t)63;
    *off = at + bytes;
    return base ? base + at : NULL;
}

/* Lays the scratch out in the arena at base (or, base NULL, only measures it): the same order
 * both times, so one pass sizes the arena and the next hands out the pointers. */
static size_t layout(kvf_fwd_t *f, uint8_t *base, uint32_t nth, size_t T, size_t S)
{
    const struct kvf_model_hparams *hp = &f->m->hp;
    size_t q_dim = (size_t)hp->n_heads * hp->head_dim,
           kv_dim = (size_t)hp->n_kv_heads * hp->head_dim;
    size_t widest = max3(hp->dim, q_dim, hp->ffn_dim), off = 0;
    f->xq.ld = (widest + KVF_QK - 1) / KVF_QK * KVF_QK;
    f->scores_per_thread = kvf__attn_scratch_floats(f->max_ctx, hp->n_heads, hp->head_dim);
    f->x = carve(base, &off, T * hp->dim * sizeof(float));
    f->xb = carve(base, &off, T * (q_dim > hp->dim ? q_dim : hp->dim) * sizeof(float));
    f->o = carve(base, &off, T * hp->dim * sizeof(float));
    f->xq.q = carve(base, &off, T * f->xq.ld * sizeof(int16_t));
    f->xq.d = carve(base, &off, T * sizeof(float));
    f->xq.s = carve(base, &off, T * (f->xq.ld / KVF_QK) * sizeof(float));
    f->q = carve(base, &off, T * q_dim * sizeof(float));
    f->k = carve(base, &off, T * kv_dim * sizeof(float));
    f->v = carve(base, &off, T * kv_dim * sizeof(float));
    f->hg = carve(base, &off, T * hp->ffn_dim * sizeof(float));
    f->hu = carve(base, &off, T * hp->ffn_dim * sizeof(float));
    f->rope = carve(base, &off, T * hp->head_dim * sizeof(float));
    f->scores = carve(base, &off, (size_t)nth * f->scores_per_thread * sizeof(float));
    f->attn_part = carve(
        base, &off,
        kvf__attn_part_floats(f->max_ctx, hp->n_heads, hp->head_dim, (uint32_t)T, f->n_chunks) *
            sizeof(float));
    f->wrow = carve(base, &off, (size_t)nth * widest * sizeof(float));
    f->outx = carve(base, &off, S * hp->dim * sizeof(float));
    f->out = carve(base, &off, S * hp->n_vocab * sizeof(float));
    f->tok_seq = carve(base, &off, T * sizeof(uint32_t));
    f->tok_pos = carve(base, &off, T * sizeof(uint32_t));
    f->tok_id = carve(base, &off, T * sizeof(int32_t));
    f->out_tok = carve(base, &off, S * sizeof(uint32_t));
    f->out_seq = carve(base, &off, S * sizeof(uint32_t));
    return off;
}

int kvf_fwd_create(const kvf_model_t *m, const struct kvf_fwd_config *cfg, kvf_fwd_t **out)
{
    if (!m || !cfg || !out || cfg->max_tokens == 0 || cfg->max_seqs == 0 ||
        cfg->max_tokens > (1u << 20) || cfg->max_seqs > cfg->max_tokens)
        return -EINVAL;
    const struct kvf_alloc_ops *a = cfg->alloc ? cfg->alloc : &kvf_default_alloc;
    uint32_t nth = cfg->n_threads ? cfg->n_threads : 1;
    size_t T = cfg->max_tokens, S = cfg->max_seqs;
    kvf_fwd_t *f = a->alloc(a->ctx, sizeof(*f), 64);
    if (!f) return -ENOMEM;
    memset(f, 0, sizeof(*f));
    f->alloc = a;
    f->m = m;
    f->max_tokens = cfg->max_tokens;
    f->max_seqs = cfg->max_seqs;
    f->max_ctx =
        cfg->max_context && cfg->max_context < m->hp.n_ctx ? cfg->max_context : m->hp.n_ctx;
    f->n_chunks = nth > 1 ? 4 * nth : 1;
    /* Every scratch buffer in one arena from the allocation seam: one allocation to fail, and
     * nothing allocated after create (a step allocates nothing). */
    f->arena_bytes = layout(f, NULL, nth, T, S);
    f->arena = a->alloc(a->ctx, f->arena_bytes, 64);
    int rc = -ENOMEM;
    if (!f->arena) goto free_f;
    layout(f, f->arena, nth, T, S);
    /* Touch the scratch now, so the first batch does not pay for page faults. */
    memset(f->arena, 0, f->arena_bytes);
    rc = kvf__tpool_create(nth, a, &f->tp);
    if (rc < 0) goto free_f;
    *out = f;
    return 0;

free_f:
    kvf_fwd_destroy(f);
    return rc;
}

void kvf_fwd_destroy(kvf_fwd_t *f)
{
    if (!f) return;
    const struct kvf_alloc_ops *a = f->alloc;
    kvf__tpool_destroy(f->tp);
    if (f->arena) a->free(a->ctx, f->arena, f->arena_bytes);
    a->free(a->ctx, f, sizeof(*f));
}

/* --- Page checks. -------------------------------------------------------------------------- */

/*
 * Checks everything about seq before anything of it is read or written (see model.h): 0,
 * -EINVAL for a malformed entry, KVF_E_MODEL_PAGE for a page that does not check.
 * O(pages of the sequence).
 */
static int check_seq(const kvf_model_t *m, uint32_t max_ctx, const kvf_pool_t *pool,
                     const struct kvf_pool_geometry *geo, const struct kvf_fwd_seq *s)
{
    uint32_t pt = geo->page_tokens;
    if (!s->tokens || s->n_tokens == 0 || !s->pages) return -EINVAL;
    if ((uint64_t)s->pos + s->n_tokens > max_ctx) return -EINVAL;
    uint32_t end = s->pos + s->n_tokens;
    if ((end + pt - 1) / pt > s->n_pages) return -EINVAL;
    for (uint32_t i = 0; i < s->n_tokens; i++)
        if (s->tokens[i] < 0 || (uint32_t)s->tokens[i] >= m->hp.n_vocab) return -EINVAL;
    /* Every page in use: OWNED by this request, with the tag in the table. Pages holding past
     * positions: the last slot this sequence will read in each is below the verified fill.
     * Pages receiving new positions: filled exactly up to where the new tokens start, so
     * nothing verified is overwritten and no slot is skipped. */
    const uint8_t *base = kvf_pool_data(pool, &(size_t){0});
    size_t stride = kvf_pool_page_bytes(pool);
#if !defined(KVF_NO_SAFETY_CHECKS)
    /* The request's tenant: the owner of the page its first new position goes to, which must
     * be the request's own (checked in the walk below). */
    struct kvf_page_info first;
    bool own_tenant = kvf_pool_page_info(pool, s->pages[s->pos / pt].page, &first) == 0 &&
                      kvf_req_id_eq(first.owner.req, s->req);
    uint32_t tenant = first.owner.tenant;
#endif
    for (uint32_t i = 0; (uint64_t)i * pt < end; i++) {
        /* Compute threads address page p as base + p × stride (pool.h's layout); a page that is
         * not where that says is refused rather than misread. */
        const uint8_t *data = kvf_pool_page_data(pool, s->pages[i].page);
        if (!data || data != base + (size_t)s->pages[i].page * stride) return KVF_E_MODEL_PAGE;
#if !defined(KVF_NO_SAFETY_CHECKS)
        /* The reader checks (owner, tag, verified fill), compiled out only in `make
         * bench-overhead`'s comparison binary; the layout check above stays, compute needs it. */
        struct kvf_page_info info;
        if (kvf_pool_page_info(pool, s->pages[i].page, &info) != 0 ||
            info.state != KVF_PAGE_OWNED || info.tag != s->pages[i].tag)
            return KVF_E_MODEL_PAGE;
        /* Another request's page only when sealed (never written again), of this request's
         * tenant (the owner of the page its new positions go to), and wholly in the past: the
         * prefix cache's pages (docs/PREFIX_CACHE.md). */
        if (!kvf_req_id_eq(info.owner.req, s->req) &&
            !(info.sealed && own_tenant && info.owner.tenant == tenant &&
              (uint64_t)(i + 1) * pt <= s->pos))
            return KVF_E_MODEL_PAGE;
        if ((uint64_t)i * pt < s->pos) {
            uint32_t last = s->pos - i * pt >= pt ? pt - 1 : s->pos - i * pt - 1;
            if (kvf_pool_read_check(pool, s->pages[i].page, s->pages[i].tag, last) != 0)
                return KVF_E_MODEL_PAGE;
        }
        if ((uint64_t)(i + 1) * pt > s->pos) {
            uint32_t want = i == s->pos / pt ? s->pos % pt : 0;
            if (info.fill != want) return KVF_E_MODEL_PAGE;
        }
#endif /* !KVF_NO_SAFETY_CHECKS */
    }
    return 0;
}

/* --- Parallel phases. ---------------------------------------------------------------------- */

/* Thread `thread`'s scratch row in f->wrow: max(dim, q_dim, ffn_dim) floats. */
static float *thread_row(const struct kvf_fwd *f, uint32_t thread)
{
    const struct kvf_model_hparams *hp = &f->m->hp;
    return f->wrow +
           (size_t)thread * max3(hp->dim, (size_t)hp->n_heads * hp->head_dim, hp->ffn_dim);
}

/* x[c] += o[c] for c < n, in order (the residual add: one rounding per element). */
static void add_row(float *restrict x, const float *restrict o, uint32_t n)
{
    for (uint32_t c = 0; c < n; c++)
        x[c] += o[c];
}

static void norm_quant_rows(struct job *j, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct kvf_fwd *f = j->f;
    const struct kvf_model_hparams *hp = &f->m->hp;
    for (uint32_t t = lo; t < hi; t++) {
        const float *row = j->src + (size_t)t * j->ld;
        if (j->add) {
            /* The residual add of the product before, done here by the thread that owns the
             * token's row rather than by each product's threads on their columns. */
            float *x = j->resid + (size_t)t * j->ld;
            add_row(x, j->add + (size_t)t * j->ld, j->cols);
            row = x;
        }
        if (j->norm_w) {
            /* Normed rows only the quantization reads go to this thread's scratch row. */
            float *out = j->dst ? j->dst + (size_t)t * j->ld : thread_row(f, thread);
            kvf__rmsnorm(out, row, j->norm_w, j->cols, hp->rms_eps);
            row = out;
        }
        if (j->quant)
            kvf__kern->quant_a16(row, f->xq.q + t * f->xq.ld, f->xq.d + t,
                                 f->xq.s + t * (f->xq.ld / KVF_QK), j->cols);
    }
}

static void job_norm_quant(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    uint32_t lo, hi;
    kvf__split(j->nt, i, n, &lo, &hi);
    norm_quant_rows(j, lo, hi, thread);
}

/* Whether a product with W reads its input quantized to 16 bits (a packed Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K or Q6_K weight: kvf__matmul) rather than as floats (every other). */
static bool reads_act16(const struct kvf_weight *W)
{
    return W->packed && kvf__packed_act16(W->type);
}

static bool reads_floats(const struct kvf_weight *W)
{
    return !reads_act16(W);
}

/* The per-row pass over rows [0, nt): with add, x's rows (src, stride ld) get add's rows added
 * first; then RMSNorm and quantization as the job's fields say (struct job). */
static void rows_pass(struct job *j, const float *add, const float *src, float *dst, size_t ld,
                      uint32_t cols, const float *norm_w, bool quant)
{
    j->resid = add ? j->f->x : NULL;
    j->add = add;
    j->src = src;
    j->dst = dst;
    j->ld = ld;
    j->cols = cols;
    j->norm_w = norm_w;
    j->quant = quant;
    if (j->nt >= PAR_ROWS_MIN)
        kvf__tpool_run(j->f->tp, job_norm_quant, j, j->f->n_chunks);
    else
        norm_quant_rows(j, 0, j->nt, 0);
}

/* RMSNorm (when norm_w; into dst, or when no product reads the normed floats, dst NULL, only
 * on the way to the quantization) and 16-bit quantization (when quant) of the rows [0, nt) of
 * src. */
static void norm_quant(struct job *j, const float *src, float *dst, size_t ld, uint32_t cols,
                       const float *norm_w, bool quant)
{
    if (norm_w || quant) rows_pass(j, NULL, src, dst, ld, cols, norm_w, quant);
}

/* x += add (a product's output rows, (nt, dim)), then norm_quant of x's rows: the residual add
 * after Wo and after Wdown, which those phases leave to the next per-row pass. There each
 * token's row is updated by the one thread that norms it, so a line of x is not written by one
 * thread and read by the other every layer (smol135m Q8_0 batch-16 decode, per-phase timers:
 * Wo 20% and down 11% faster, the norm passes 15% slower, the step 3% faster). */
static void resid_norm_quant(struct job *j, const float *add, float *dst, const float *norm_w,
                             bool quant)
{
    uint32_t dim = j->f->m->hp.dim;
    rows_pass(j, add, j->f->x, dst, dim, dim, norm_w, quant);
}

/* y[t][r] += b[r] for the columns [lo, hi) of nt rows of width ld (a projection's bias, one
 * add per element whichever thread owns the columns); nothing without a bias. */
static void add_bias(const float *b, float *y, uint32_t ld, uint32_t nt, uint32_t lo, uint32_t hi)
{
    if (!b) return;
    for (uint32_t t = 0; t < nt; t++)
        add_row(y + (size_t)t * ld + lo, b + lo, hi - lo);
}

static void job_qkv(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    struct kvf_fwd *f = j->f;
    const struct kvf_layer *L = j->L;
    const struct kvf_model_hparams *hp = &f->m->hp;
    float *scratch = thread_row(f, thread);
    uint32_t lo, hi;
    kvf__split_rows(L->wq.rows, i, n, &lo, &hi);
    kvf__matmul(&L->wq, f->xb, hp->dim, &f->xq, j->nt, f->q, L->wq.rows, lo, hi, scratch);
    add_bias(L->bq, f->q, L->wq.rows, j->nt, lo, hi);
    kvf__split_rows(L->wk.rows, i, n, &lo, &hi);
    kvf__matmul(&L->wk, f->xb, hp->dim, &f->xq, j->nt, f->k, L->wk.rows, lo, hi, scratch);
    add_bias(L->bk, f->k, L->wk.rows, j->nt, lo, hi);
    kvf__split_rows(L->wv.rows, i, n, &lo, &hi);
    kvf__matmul(&L->wv, f->xb, hp->dim, &f->xq, j->nt, f->v, L->wv.rows, lo, hi, scratch);
    add_bias(L->bv, f->v, L->wv.rows, j->nt, lo, hi);
    /* The attention's first item on this thread, asked for across RoPE and the K/V stores. */
    if (j->attn.first_asked) kvf__attn_ask_first(&j->attn, i, n);
}

/* The first groups of this chunk's rows of W, for a matrix product that follows a phase of as
 * many chunks as the products have (so that chunk i there is chunk i here). */
static void warm(const struct job *j, const struct kvf_weight *W, uint32_t i, uint32_t n)
{
    uint32_t lo, hi;
    if (n != kvf__tpool_size(j->f->tp)) return;
    kvf__split_rows(W->rows, i, n, &lo, &hi);
    kvf__matmul_warm(W, lo, hi, 2);
}

static void job_attn(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    kvf__attn_chunk(&j->attn, i, n, thread);
    warm(j, &j->L->wo, i, n);
}

/* o = in Wᵀ over this thread's rows of W (W has dim rows); the residual add is the next
 * per-row pass's (resid_norm_quant). */
static void out_matmul(struct job *j, const struct kvf_weight *W, const float *in, size_t ldin,
                       uint32_t i, uint32_t n, uint32_t thread)
{
    struct kvf_fwd *f = j->f;
    const struct kvf_model_hparams *hp = &f->m->hp;
    float *scratch = thread_row(f, thread);
    uint32_t lo, hi;
    kvf__split_rows(W->rows, i, n, &lo, &hi);
    kvf__matmul(W, in, ldin, &f->xq, j->nt, f->o, hp->dim, lo, hi, scratch);
}

static void job_wo(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    const struct kvf_model_hparams *hp = &j->f->m->hp;
    out_matmul(j, &j->L->wo, j->f->xb, (size_t)hp->n_heads * hp->head_dim, i, n, thread);
    warm(j, &j->L->w_gate, i, n);
    warm(j, &j->L->w_up, i, n);
}

static void job_down(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    out_matmul(j, &j->L->w_down, j->f->hg, j->f->m->hp.ffn_dim, i, n, thread);
    if (j->layer + 1 < j->f->m->hp.n_layers) {
        const struct kvf_layer *next = &j->f->m->layers[j->layer + 1];
        warm(j, &next->wq, i, n);
        warm(j, &next->wk, i, n);
        warm(j, &next->wv, i, n);
    }
}

/* gate and up over this thread's rows, then h = silu(gate) ⊙ up on those same rows. */
static void job_gate_up(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    struct kvf_fwd *f = j->f;
    const struct kvf_layer *L = j->L;
    const struct kvf_model_hparams *hp = &f->m->hp;
    float *scratch = thread_row(f, thread);
    uint32_t lo, hi, F = hp->ffn_dim;
    kvf__split_rows(F, i, n, &lo, &hi);
    kvf__matmul(&L->w_gate, f->xb, hp->dim, &f->xq, j->nt, f->hg, F, lo, hi, scratch);
    kvf__matmul(&L->w_up, f->xb, hp->dim, &f->xq, j->nt, f->hu, F, lo, hi, scratch);
    for (uint32_t t = 0; t < j->nt; t++)
        kvf__swiglu(f->hg + (size_t)t * F + lo, f->hu + (size_t)t * F + lo, hi - lo);
    warm(j, &L->w_down, i, n);
}

static void job_logits(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    struct kvf_fwd *f = j->f;
    const struct kvf_model_hparams *hp = &f->m->hp;
    float *scratch = thread_row(f, thread);
    uint32_t lo, hi;
    kvf__split_rows(hp->n_vocab, i, n, &lo, &hi);
    kvf__matmul(&f->m->output, f->outx, hp->dim, &f->xq, j->n_out, f->out, hp->n_vocab, lo, hi,
                scratch);
    /* Each chunk copies its own rows out while they are in cache: copied on the calling thread
     * after the phase, a batch-16 decode step's 3 MB of logits took 2-3% of the step. */
    for (uint32_t o = 0; o < j->n_out; o++)
        memcpy(j->seqs[f->out_seq[o]].logits + lo, f->out + (size_t)o * hp->n_vocab + lo,
               (hi - lo) * sizeof(float));
}

/* --- The pass. ----------------------------------------------------------------------------- */

/* cos and sin of pos × scale × base^(-2i/hd) / factor_i for each pair i (scale 1 and factors 1
 * unless the file scales its RoPE), computed in double from (pos, i) alone. */
static void rope_table(float *dst, uint32_t pos, const kvf_model_t *m)
{
    uint32_t hd = m->hp.head_dim;
    double base = m->hp.rope_base, p = (double)pos * m->hp.rope_pos_scale;
    for (uint32_t i = 0; i < hd / 2; i++) {
        double ang = p * pow(base, -2.0 * i / hd);
        if (m->rope_factors) ang /= m->rope_factors[i];
        dst[2 * i] = (float)cos(ang);
        dst[2 * i + 1] = (float)sin(ang);
    }
}

/* A token's K or V row of n floats into its page slot: as floats (eb 4), or as IEEE halves
 * (eb 2) rounded to nearest-even — the one rounding a half K/V cache adds, the same bits on
 * every path since every variant reads the stored halves. */
static void store_kv(uint8_t *dst, const float *src, size_t n, uint32_t eb)
{
    if (eb == 4) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    kvf__kern->f16_row(src, (uint16_t *)dst, (uint32_t)n);
}

/* RoPE on each of n_heads heads of x: pair i is (2i, 2i+1), or (i, i + hd/2) with halves. */
static void rope_apply(float *x, const float *cs, uint32_t n_heads, uint32_t hd, bool halves)
{
    uint32_t stride = halves ? 1 : 2, off = halves ? hd / 2 : 1;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * hd;
        for (uint32_t i = 0; i < hd / 2; i++) {
            float *p = v + i * stride;
            float c = cs[2 * i], s = cs[2 * i + 1], a = p[0], b = p[off];
            p[0] = a * c - b * s;
            p[off] = a * s + b * c;
        }
    }
}

/* RMSNorm of each of n_heads heads of x in place, weight w (head_dim), where the model asks. */
static void head_norm(float *x, const float *w, uint32_t n_heads, uint32_t hd, float eps)
{
    if (!w) return;
    for (uint32_t h = 0; h < n_heads; h++)
        kvf__rmsnorm(x + (size_t)h * hd, x + (size_t)h * hd, w, hd, eps);
}

/* Each token of [lo, hi): its embedding row into x, and its RoPE angles (double sin and cos,
 * which cost as much as the row in a prefill). */
static void embed_rows(struct job *j, uint32_t lo, uint32_t hi)
{
    struct kvf_fwd *f = j->f;
    const kvf_model_t *m = f->m;
    uint32_t dim = m->hp.dim, hd = m->hp.head_dim;
    for (uint32_t t = lo; t < hi; t++) {
        const uint8_t *row =
            (const uint8_t *)m->tok_embd.data + (size_t)f->tok_id[t] * m->tok_embd.row_bytes;
        kvf_dequant_row(m->tok_embd.type, row, f->x + (size_t)t * dim, dim);
        rope_table(f->rope + (size_t)t * hd, f->tok_pos[t], m);
    }
}

static void job_embed(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    uint32_t lo, hi;
    kvf__split(j->nt, i, n, &lo, &hi);
    embed_rows(j, lo, hi);
}

/* The per-head Q/K norm (qwen3) and RoPE on the q and k rows of tokens [lo, hi) (each token's
 * own rows and angles). */
static void rope_rows(struct job *j, uint32_t lo, uint32_t hi)
{
    struct kvf_fwd *f = j->f;
    const struct kvf_model_hparams *hp = &f->m->hp;
    uint32_t hd = hp->head_dim;
    size_t q_dim = (size_t)hp->n_heads * hd, kv_dim = (size_t)hp->n_kv_heads * hd;
    for (uint32_t t = lo; t < hi; t++) {
        float *q = f->q + t * q_dim, *k = f->k + t * kv_dim;
        head_norm(q, j->L->q_norm, hp->n_heads, hd, hp->rms_eps);
        head_norm(k, j->L->k_norm, hp->n_kv_heads, hd, hp->rms_eps);
        rope_apply(q, f->rope + (size_t)t * hd, hp->n_heads, hd, hp->rope_halves);
        rope_apply(k, f->rope + (size_t)t * hd, hp->n_kv_heads, hd, hp->rope_halves);
    }
}

/* RoPE for a batch of PAR_ROWS_MIN tokens or more, on every thread (it was 5% of an s15m
 * prefill on the calling thread alone). The K/V stores that follow stay on the calling thread,
 * which alone writes page data. */
static void job_rope(void *ctx, uint32_t i, uint32_t n, uint32_t thread)
{
    struct job *j = ctx;
    uint32_t lo, hi;
    kvf__split(j->nt, i, n, &lo, &hi);
    rope_rows(j, lo, hi);
}

int kvf_fwd_prepare(kvf_fwd_t *f, const kvf_pool_t *pool, struct kvf_fwd_seq *seqs, uint32_t n_seqs)
{
    if (!f || !pool || (!seqs && n_seqs) || f->prepared) return -EINVAL;
    const kvf_model_t *m = f->m;
    const struct kvf_model_hparams *hp = &m->hp;
    const struct kvf_pool_geometry *geo = kvf_pool_geometry(pool);
    if (geo->n_layers != hp->n_layers || geo->n_kv_heads != hp->n_kv_heads ||
        geo->head_dim != hp->head_dim || (geo->elem_bytes != 4 && geo->elem_bytes != 2) ||
        geo->page_tokens == 0)
        return -EINVAL;
    if (n_seqs > f->max_seqs) return -EINVAL;
    uint64_t total = 0;
    for (uint32_t s = 0; s < n_seqs; s++)
        total += seqs[s].n_tokens;
    if (total > f->max_tokens) return -EINVAL;

    /* Checks first; a sequence that fails is out before anything is read or written. */
    uint32_t nt = 0, n_out = 0, n_ok = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        struct kvf_fwd_seq *sq = &seqs[s];
        sq->status = check_seq(m, f->max_ctx, pool, geo, sq);
        /* One entry per request: two would write the same slots. O(n_seqs²), n_seqs is small. */
        for (uint32_t e = 0; e < s && sq->status == 0; e++)
            if (seqs[e].status == 0 && kvf_req_id_eq(seqs[e].req, sq->req)) sq->status = -EINVAL;
        if (sq->status != 0) continue;
        n_ok++;
        for (uint32_t i = 0; i < sq->n_tokens; i++, nt++) {
            f->tok_seq[nt] = s;
            f->tok_pos[nt] = sq->pos + i;
            f->tok_id[nt] = sq->tokens[i];
        }
        if (sq->logits) {
            f->out_tok[n_out] = nt - 1;
            f->out_seq[n_out++] = s;
        }
    }
    size_t pool_bytes = 0;
    f->seqs = seqs;
    f->n_seqs = n_seqs;
    f->nt = nt;
    f->n_out = n_out;
    f->n_ok = n_ok;
    f->pool_base = kvf_pool_data(pool, &pool_bytes);
    f->page_bytes = kvf_pool_page_bytes(pool);
    f->geo = *geo;
    f->prepared = true;
    f->computed = false;
    return (int)n_ok;
}

int kvf_fwd_compute(kvf_fwd_t *f)
{
    if (!f || !f->prepared || f->computed) return -EINVAL;
    f->computed = true;
    const kvf_model_t *m = f->m;
    const struct kvf_model_hparams *hp = &m->hp;
    const struct kvf_pool_geometry *geo = &f->geo;
    struct kvf_fwd_seq *seqs = f->seqs;
    uint32_t nt = f->nt, n_out = f->n_out, n_ok = f->n_ok;
    if (nt == 0) return 0;

    struct job j = {
        .f = f,
        .nt = nt,
        .seqs = seqs,
        .pool_base = f->pool_base,
        .page_bytes = f->page_bytes,
        .geo = geo,
        .n_out = n_out,
    };
    uint32_t dim = hp->dim, hd = hp->head_dim, pt = geo->page_tokens, eb = geo->elem_bytes;
    size_t q_dim = (size_t)hp->n_heads * hd, kv_dim = (size_t)hp->n_kv_heads * hd;
    uint8_t *base = f->pool_base;

    if (nt >= PAR_ROWS_MIN)
        kvf__tpool_run(f->tp, job_embed, &j, f->n_chunks);
    else
        embed_rows(&j, 0, nt);
    /* A decode step's attention (one token per sequence, enough of them for whole-token items)
     * runs as one chunk per thread: each thread's items then follow one another in a known
     * order, so each can queue the next one's K/V while it computes (attention.h). Other
     * batches keep n_chunks, for balance between threads. */
    /* The layer matrix products run as one chunk per thread: each thread streams one
     * contiguous range of every matrix, its prefetch of the next groups running on through the
     * range, instead of four ranges each starting cold. In a 128-token prefill the threads'
     * idle time in those phases fell from about 6% to about 2%; prefill 2-12% and decode
     * 6-19% faster (alternated run by run, docs/MODEL_ENGINE.md). The price: a thread the OS
     * deschedules holds up the phase, where four chunks let the other take over. */
    uint32_t mm_chunks = kvf__tpool_size(f->tp);
    uint32_t attn_chunks =
        nt == n_ok && nt >= 2u * f->n_chunks ? kvf__tpool_size(f->tp) : f->n_chunks;

    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const struct kvf_layer *L = &m->layers[l];
        j.L = L;
        j.layer = l;
        float *xb_qkv =
            reads_floats(&L->wq) || reads_floats(&L->wk) || reads_floats(&L->wv) ? f->xb : NULL;
        bool q_qkv = reads_act16(&L->wq) || reads_act16(&L->wk) || reads_act16(&L->wv);
        /* x += the previous layer's down output, then the attention norm. */
        if (l == 0)
            norm_quant(&j, f->x, xb_qkv, dim, dim, L->attn_norm, q_qkv);
        else
            resid_norm_quant(&j, f->o, xb_qkv, L->attn_norm, q_qkv);
        size_t k_off = kvf_geo_kv_offset(geo, l, 0), v_off = kvf_geo_kv_offset(geo, l, 1);
        j.attn = (struct kvf_attn_batch){
            .nt = nt,
            .n_heads = hp->n_heads,
            .n_kv_heads = hp->n_kv_heads,
            .head_dim = hd,
            .q = f->q,
            .out = f->xb,
            .tok_seq = f->tok_seq,
            .tok_pos = f->tok_pos,
            .seqs = seqs,
            .pool_base = base,
            .page_bytes = j.page_bytes,
            .page_tokens = pt,
            .k_off = k_off,
            .v_off = v_off,
            .elem_bytes = eb,
            .scratch = f->scores,
            .scratch_floats = f->scores_per_thread,
            .part = f->attn_part,
            .outq = reads_act16(&L->wo) ? &f->xq : NULL,
            .first_asked = mm_chunks == attn_chunks,
        };
        kvf__tpool_run(f->tp, job_qkv, &j, mm_chunks);
        if (nt >= PAR_ROWS_MIN)
            kvf__tpool_run(f->tp, job_rope, &j, f->n_chunks);
        else
            rope_rows(&j, 0, nt);
        for (uint32_t t = 0; t < nt; t++) {
            /* K/V into this token's own slot: (slot, kv_head, dim) inside the layer's block. */
            const struct kvf_fwd_seq *s = &seqs[f->tok_seq[t]];
            uint32_t p = f->tok_pos[t];
            uint8_t *page = base + (size_t)s->pages[p / pt].page * j.page_bytes;
            size_t slot = (size_t)(p % pt) * kv_dim * eb;
            store_kv(page + k_off + slot, f->k + t * kv_dim, kv_dim, eb);
            store_kv(page + v_off + slot, f->v + t * kv_dim, kv_dim, eb);
        }
        kvf__tpool_run(f->tp, job_attn, &j, attn_chunks);
        kvf__attn_finish(&j.attn, attn_chunks);
        /* A decode step's attention quantized each token's row as it finished it (a phase of
         * its own was 1.5% of a batch-16 decode step of smol135m Q8_0). */
        norm_quant(&j, f->xb, NULL, q_dim, (uint32_t)q_dim, NULL,
                   reads_act16(&L->wo) && !kvf__attn_quantizes(&j.attn, attn_chunks));
        kvf__tpool_run(f->tp, job_wo, &j, mm_chunks);
        resid_norm_quant(&j, f->o,
                         reads_floats(&L->w_gate) || reads_floats(&L->w_up) ? f->xb : NULL,
                         L->ffn_norm, reads_act16(&L->w_gate) || reads_act16(&L->w_up));
        kvf__tpool_run(f->tp, job_gate_up, &j, mm_chunks);
        norm_quant(&j, f->hg, NULL, hp->ffn_dim, hp->ffn_dim, NULL, reads_act16(&L->w_down));
        kvf__tpool_run(f->tp, job_down, &j, mm_chunks);
        __atomic_fetch_add(&f->layers_done, 1, __ATOMIC_RELAXED);
    }

    if (n_out > 0) {
        /* The last layer's residual add, for the rows that give logits (the others' x is not
         * read again). */
        for (uint32_t o = 0; o < n_out; o++)
            add_row(f->x + (size_t)f->out_tok[o] * dim, f->o + (size_t)f->out_tok[o] * dim, dim);
        for (uint32_t o = 0; o < n_out; o++)
            kvf__rmsnorm(f->outx + (size_t)o * dim, f->x + (size_t)f->out_tok[o] * dim, m->out_norm,
                         dim, hp->rms_eps);
        if (reads_act16(&m->output))
            for (uint32_t o = 0; o < n_out; o++)
                kvf__kern->quant_a16(f->outx + (size_t)o * dim, f->xq.q + o * f->xq.ld, f->xq.d + o,
                                     f->xq.s + o * (f->xq.ld / KVF_QK), dim);
        kvf__tpool_run(f->tp, job_logits, &j, f->n_chunks);
    }

    return (int)n_ok;
}

uint64_t kvf_fwd_layers_done(const kvf_fwd_t *f)
{
    return __atomic_load_n(&f->layers_done, __ATOMIC_RELAXED);
}

int kvf_fwd_commit(kvf_fwd_t *f, kvf_pool_t *pool)
{
    if (!f || !pool || !f->prepared || !f->computed) return -EINVAL;
    struct kvf_fwd_seq *seqs = f->seqs;
    uint32_t n_seqs = f->n_seqs, pt = f->geo.page_tokens;
    f->prepared = f->computed = false;
    /* The new slots are written for every layer: raise each page's verified fill over them. */
    for (uint32_t s = 0; s < n_seqs; s++) {
        struct kvf_fwd_seq *sq = &seqs[s];
        if (sq->status != 0) continue;
        uint32_t end = sq->pos + sq->n_tokens;
        for (uint32_t i = sq->pos / pt; (uint64_t)i * pt < end; i++) {
            uint32_t fill = end - i * pt >= pt ? pt : end - i * pt;
            int rc = kvf_pool_set_fill(pool, sq->pages[i], fill);
            if (NEVER(rc != 0)) sq->status = rc;
        }
    }
    return (int)f->n_ok;
}

int kvf_fwd_run(kvf_fwd_t *f, kvf_pool_t *pool, struct kvf_fwd_seq *seqs, uint32_t n_seqs)
{
    int rc = kvf_fwd_prepare(f, pool, seqs, n_seqs);
    if (rc < 0) return rc;
    kvf_fwd_compute(f);
    return kvf_fwd_commit(f, pool);
}
