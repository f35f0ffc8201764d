/*
 * kvfence/model.h — the decoder forward pass over pool pages, and sampling. The module
 * (src/model) reads weights through kvfence/gguf.h and K/V from kvfence/pool.h pages; the
 * workers (kvfence/engine.h), the CLI and the benchmarks use it.
 *
 * Architectures (general.architecture): "llama", "qwen2" (a bias on Q, K and V; RoPE on the
 * two halves of each head) and "qwen3" (RMSNorm of each Q and K head before RoPE, no bias;
 * RoPE on halves; the head width may differ from dim / n_heads), each read from its own
 * "<arch>.*" keys; any other is refused by name at load. The output projection is
 * output.weight or, without one, the token embedding (tied).
 *
 * A kvf_model_t is a set of hyper-parameters and per-layer weight views into a GGUF file
 * (F32, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights are also repacked once for
 * the kernels; F16 and BF16 are dequantized one row at a time as they are used). A kvf_fwd_t is
 * the compute context that runs it: a small pthread pool and scratch buffers sized for a maximum
 * batch.
 *
 *   kvf_model_load ──▶ kvf_fwd_create ──▶ kvf_fwd_run (any number of times) ──▶ kvf_fwd_destroy
 *                                                                               ──▶ kvf_model_free
 *
 * K and V live in pool pages (kvfence/pool.h), f32, in the page-major layout: a page holds
 * every layer's K and V for page_tokens token slots. A sequence names its pages by a page table
 * of (page, tag); token position p lives in table entry p / page_tokens, slot p % page_tokens.
 *
 * What kvf_fwd_run checks before it touches a sequence's pages (for each sequence on its own):
 *   - every page in use is OWNED, carries the tag in the table, and belongs to the sequence's
 *     request (the pool's owner record), so a page table can never name another request's page;
 *   - every page holding a past position (p < pos) passes kvf_pool_read_check for the last slot
 *     it will read: its tag is current, it is OWNED, and the slot is below its verified fill;
 *   - every page that will receive new positions is OWNED with the tag in the table, and its
 *     verified fill is exactly the first slot to be written (new K/V never overwrite verified
 *     slots and never leave a gap).
 * A sequence that fails a check gets status KVF_E_MODEL_PAGE and is dropped from the batch
 * before any page is read or written; the others run as if it had never been there. After the
 * compute, the fill of each page written is raised with kvf_pool_set_fill, so the pool's
 * verified fill always covers exactly what was written.
 *
 * Batch invariance: a sequence's logits are bit-identical whether it runs alone or with others,
 * at any batch size, any thread count and any prefill chunking (docs/MODEL_ENGINE.md has the
 * argument). They depend only on the model, the tokens, and the kernel variant chosen at start
 * (kvf_kernels_name()).
 *
 * Threading: the model is immutable after load and may be shared. A kvf_fwd_t and the pool it
 * is given belong to one calling thread; kvf_fwd_run uses the fwd's own worker threads inside
 * the call and returns with them idle. Compute threads read page data; only the calling thread
 * touches pool metadata.
 *
 * Work bounds: kvf_fwd_run does O(weights × tokens) arithmetic plus attention O(Σ tokens × pos);
 * it allocates nothing. Load is O(n_tensors).
 */
#ifndef KVFENCE_MODEL_H
#define KVFENCE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvfence/gen.h"
#include "kvfence/gguf.h"
#include "kvfence/pool.h"

typedef struct kvf_model kvf_model_t;
typedef struct kvf_fwd kvf_fwd_t;

enum kvf_model_arch {
    KVF_ARCH_LLAMA = 0,
    KVF_ARCH_QWEN2 = 1,
    KVF_ARCH_QWEN3 = 2,
};

struct kvf_model_hparams {
    uint32_t n_vocab; /* vocabulary size */
    uint32_t dim;     /* residual width */
    uint32_t n_layers;
    uint32_t n_heads;       /* query heads */
    uint32_t n_kv_heads;    /* K/V heads (grouped-query attention: n_heads % n_kv_heads == 0) */
    uint32_t head_dim;      /* <arch>.attention.key_length, else dim / n_heads */
    uint32_t ffn_dim;       /* SwiGLU hidden width */
    uint32_t n_ctx;         /* trained context length */
    float rms_eps;          /* RMSNorm epsilon */
    float rope_base;        /* RoPE frequency base */
    float rope_pos_scale;   /* positions are multiplied by this before RoPE: 1, or 1 / the factor
                               of <arch>.rope.scaling.type "linear" */
    bool rope_freq_factors; /* the file's rope_freqs.weight divides each pair's angle (llama 3.1
                               and 3.2's long-context factors) */
    uint32_t arch;          /* enum kvf_model_arch */
    bool rope_halves;       /* RoPE rotates pairs (i, i + head_dim/2) (GGML's "neox" mode: qwen2,
                               qwen3) rather than adjacent pairs (2i, 2i+1) (llama) */
    bool qkv_bias;          /* Q, K, V projections add a bias (qwen2) */
    bool qk_norm;           /* each Q and K head is RMS-normed before RoPE (qwen3) */
};

/* A 2-D weight: `rows` rows of `cols` elements of `type`, row r at data + r * row_bytes.
 * A view into the GGUF mapping (or a caller's buffer). A loaded model's F32, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights also have `packed`, the same values regrouped for the
 * kernels (owned by the model); without it they are read row by row, more slowly. */
struct kvf_weight {
    const void *data;
    const void *packed;
    uint32_t type; /* enum kvf_ggml_type */
    uint32_t rows, cols;
    size_t row_bytes;
};

/*
 * Loads the model in g (borrowed: g must outlive the model). general.architecture must be
 * "llama", "qwen2" or "qwen3". On success *out owns a new model. On failure nothing is allocated,
 * *out is untouched, and err explains: KVF_E_MODEL_UNSUPPORTED, KVF_E_MODEL_MISSING,
 * KVF_E_MODEL_SHAPE, -ENOMEM.
 */
int kvf_model_load(const kvf_gguf_t *g, kvf_model_t **out, char *err, size_t err_len);
void kvf_model_free(kvf_model_t *m);

const struct kvf_model_hparams *kvf_model_hparams(const kvf_model_t *m);
/* The page geometry this model needs for page_tokens slots per page. K/V elements are IEEE
 * halves (elem_bytes 2) when any of its matrices is quantized (Q8_0, Q4_0, the K-quants) and
 * floats (4)
 * otherwise; a caller may set elem_bytes to the other before creating the pool — the forward
 * pass takes either. */
void kvf_model_geometry(const kvf_model_t *m, uint32_t page_tokens, struct kvf_pool_geometry *geo);
/* Bytes of weights one decode step streams (every matrix once, in the packed form the kernels
 * read where there is one, plus the embedding row). */
uint64_t kvf_model_weight_bytes(const kvf_model_t *m);
/* The weight type of the largest matrix ("F32", "Q8_0", ...). */
const char *kvf_model_type_name(const kvf_model_t *m);

/* --- Forward. ------------------------------------------------------------------------------- */

/*
 * One sequence's part of a batch: n_tokens new tokens at positions pos .. pos + n_tokens - 1.
 * Positions 0 .. pos - 1 are already in the sequence's pages (verified fill). Prefill passes the
 * prompt (in one or several chunks), decode passes one token.
 */
struct kvf_fwd_seq {
    kvf_req_id_t req;      /* the request: every page must be owned by it */
    const int32_t *tokens; /* borrowed, n_tokens ids < n_vocab */
    uint32_t n_tokens;     /* ≥ 1 */
    uint32_t pos;          /* tokens already in the pages */
    const struct kvf_page_ref
        *pages; /* borrowed page table, ≥ ceil((pos + n_tokens) / page_tokens) */
    uint32_t n_pages;
    float *logits; /* out: n_vocab logits of the last new token, or NULL
                      (no output projection: an inner prefill chunk) */
    int status;    /* out: 0, KVF_E_MODEL_PAGE, or -EINVAL (malformed, or a
                      second entry for a request already in the batch) */
};

struct kvf_fwd_config {
    uint32_t n_threads;                /* compute threads including the caller; 0 = 1 */
    uint32_t max_tokens;               /* most tokens in one kvf_fwd_run (all sequences together) */
    uint32_t max_seqs;                 /* most sequences in one kvf_fwd_run */
    const struct kvf_alloc_ops *alloc; /* every allocation of the context (three: the context,
                                          one scratch arena, the thread table); NULL = default.
                                          Nothing is allocated after create. */
    uint32_t max_context; /* positions a sequence may reach (its attention scratch is sized
                             for them; a sequence past them is refused, -EINVAL); 0 or more
                             than the model's: the model's context */
};

/*
 * Creates a compute context for m (borrowed: it must outlive the context). Starts
 * n_threads - 1 worker threads. On failure nothing is left running or allocated, *out is
 * untouched: -EINVAL, -ENOMEM, or a negated pthread error.
 */
int kvf_fwd_create(const kvf_model_t *m, const struct kvf_fwd_config *cfg, kvf_fwd_t **out);
void kvf_fwd_destroy(kvf_fwd_t *f);

/*
 * Runs the forward pass for seqs[0..n_seqs), writing their new K/V into their pages and their
 * logits. pool must have the geometry kvf_model_geometry() gives (page_tokens may be any).
 * Each sequence's status says how it went; sequences that fail a page check are left out
 * (nothing of theirs is read or written). Returns the number of sequences that ran, or -EINVAL
 * (bad batch: too many tokens or sequences, wrong geometry) with nothing done.
 */
int kvf_fwd_run(kvf_fwd_t *f, kvf_pool_t *pool, struct kvf_fwd_seq *seqs, uint32_t n_seqs);

/*
 * kvf_fwd_run in three parts, so that the pool's owner thread keeps the pool while the compute
 * runs elsewhere (a worker loop handling messages during a decode step):
 *   kvf_fwd_prepare  on the pool's owner thread: every check kvf_fwd_run makes (statuses set,
 *                    failing sequences out); returns the number of sequences that will run, or
 *                    -EINVAL as kvf_fwd_run (also when a batch is already prepared);
 *   kvf_fwd_compute  on any one thread: the math, reading and writing only page data (the
 *                    batch's pages) and the fwd's own buffers — no pool metadata — so the owner
 *                    may meanwhile change other pages' metadata, but must not free, reassign or
 *                    write the batch's pages until kvf_fwd_commit;
 *   kvf_fwd_commit   on the pool's owner thread: raises the fills of the pages written; returns
 *                    the number of sequences that ran.
 * seqs stays borrowed from prepare to commit. Calling them out of order is -EINVAL.
 */
int kvf_fwd_prepare(kvf_fwd_t *f, const kvf_pool_t *pool, struct kvf_fwd_seq *seqs,
                    uint32_t n_seqs);
int kvf_fwd_compute(kvf_fwd_t *f);
int kvf_fwd_commit(kvf_fwd_t *f, kvf_pool_t *pool);
/* Layers this context has computed since it was created (every sequence of a batch together),
 * readable from any thread while a kvf_fwd_compute runs: the evidence that a long compute is
 * advancing (a prefill worker reports it to decode as progress). */
uint64_t kvf_fwd_layers_done(const kvf_fwd_t *f);

/* The kernel variant in use: "avx2+vnni", "avx2" or "scalar". Chosen once per process from the
 * CPU; the environment variable KVF_KERNELS=avx2 or =scalar asks for a lesser one (read at the
 * first model load). */
const char *kvf_kernels_name(void);

/* --- Sampling. ------------------------------------------------------------------------------ */

/* struct kvf_sample_params, what a request asks of the sampler, is in kvfence/gen.h: it travels
 * with the request through the generation seam. */

/*
 * Picks the next token from logits[0..n_vocab) (borrowed, unchanged). Deterministic: the same
 * (params, step, logits) give the same token on every machine with the same libm. Returns the
 * token id, or -EINVAL (bad params, n_vocab 0), -ENOMEM. Allocates O(n_vocab) scratch per call
 * unless temperature is 0. Work: O(n_vocab) for greedy and plain temperature, O(n_vocab log
 * n_vocab) with top-k or top-p.
 */
int kvf_sample(const float *logits, uint32_t n_vocab, const struct kvf_sample_params *p,
               uint64_t step);

/* kvf_sample with the caller's scratch (kvf_sample_scratch_bytes(n_vocab) bytes, 8-aligned;
 * may be NULL for greedy without logit_bias), so a serving loop samples without allocating.
 * Same tokens. The penalties see no tokens here (kvf_sample_seq gives them the history). */
size_t kvf_sample_scratch_bytes(uint32_t n_vocab);
int kvf_sample_with(const float *logits, uint32_t n_vocab, const struct kvf_sample_params *p,
                    uint64_t step, void *scratch);

/* The tokens a request's penalties see (borrowed; ids outside the vocabulary are skipped). */
struct kvf_sample_hist {
    const int32_t *prompt; /* [n_prompt]: repetition_penalty only */
    uint32_t n_prompt;
    const int32_t *out; /* [n_out]: the output so far: every penalty */
    uint32_t n_out;
};

/* Whether p changes the logits before the draw (logit_bias or a penalty): then sampling needs
 * the scratch even when greedy. */
bool kvf_sample_shapes_logits(const struct kvf_sample_params *p);

/*
 * The logits as the draw sees them: logits + logit_bias, then the penalties over h (see struct
 * kvf_sample_params for the order), into dst[0..n_vocab). marks: n_vocab words, zero on entry
 * and left zero. Work: O(n_vocab + n_logit_bias + n_prompt + n_out). Can't fail.
 */
void kvf_sample_shape(const float *logits, uint32_t n_vocab, const struct kvf_sample_params *p,
                      const struct kvf_sample_hist *h, float *dst, uint32_t *marks);

/*
 * Step `step` of a sequence whose history is h (NULL: none): kvf_sample_shape into the scratch,
 * then kvf_sample_with on the result. scratch as kvf_sample_with's, whose last n_vocab words
 * must be zero before the first call (calloc) and are left so. Returns the token or -EINVAL.
 */
int kvf_sample_seq(const float *logits, uint32_t n_vocab, const struct kvf_sample_params *p,
                   const struct kvf_sample_hist *h, uint64_t step, void *scratch);

/*
 * The top_n most likely tokens under the full softmax of logits (temperature 1), most likely
 * first (lower id on ties), with their natural-log probabilities. Returns how many were
 * written (min(top_n, n_vocab)) or -EINVAL. O(n_vocab × top_n); for the API's few logprobs.
 */
int kvf_sample_top_logprobs(const float *logits, uint32_t n_vocab, uint32_t top_n, int32_t *ids,
                            float *logprobs);

/* The natural-log probability of token `tok` under the full softmax of logits (temperature 1):
 * the same figure kvf_sample_top_logprobs gives for it, bit for bit. NAN for a bad argument.
 * O(n_vocab). */
float kvf_sample_logprob(const float *logits, uint32_t n_vocab, int32_t tok);

#endif /* KVFENCE_MODEL_H */
