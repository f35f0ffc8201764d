/*
 * kvfence/gguf.h — the GGUF model file: a reader over mmap (or a caller's buffer), the element
 * formats of its tensors (half floats, row sizes, dequantization and quantization of a row), a
 * streaming writer, and `mkmodel`, which writes Llama test models with seeded random weights.
 * The module (src/gguf) depends on kvfence/common.h alone; the tokenizers (kvfence/text.h) and
 * the forward pass (kvfence/model.h) read models through it.
 *
 * Reader. kvf_gguf_open() maps the file read-only and parses it once: header, every key/value,
 * every tensor description. Every offset, size, count, alignment and string length is checked
 * against the end of the file and for overflow before it is used, so a truncated or hostile file
 * gives a negative code and a one-line explanation in `err`, never a crash or an over-read.
 * GGUF versions 2 and 3 are read (version 1 used 32-bit counts and is refused). Tensor types are
 * F32, F16, BF16, Q8_0 and Q4_0; a file holding any other type is refused by naming it.
 *
 *   open ──▶ (get_* / find_tensor, any number of times, from any number of threads) ──▶ close
 *
 * Ownership: the kvf_gguf_t owns the mapping. Every pointer it hands out (key strings, string
 * values, tensor names and tensor data) is a view that stays valid until kvf_gguf_close().
 * String values are views into the file: they are NOT NUL-terminated; use the length. Tensor
 * names are NUL-terminated copies. With kvf_gguf_open_mem() the caller's buffer is borrowed and
 * must outlive the kvf_gguf_t.
 *
 * Tensor data pointers are aligned for their element type (4 bytes for F32, 2 for the others);
 * a file whose layout breaks that is refused, so readers may cast `data` directly.
 *
 * Errors: KVF_E_MODEL_FORMAT (not GGUF or malformed), KVF_E_MODEL_TRUNCATED (something points
 * past the end), KVF_E_MODEL_UNSUPPORTED (version, tensor type, nested array), -ENOMEM, or a
 * negated errno from open/mmap. The get_* functions return KVF_E_MODEL_MISSING for an absent
 * key, KVF_E_MODEL_FORMAT for a value of the wrong type or out of the asked type's range, and
 * -ERANGE for an array index past the end. On failure they leave *out untouched.
 *
 * Work bounds: open is O(file metadata) plus O(n_kv + n_tensors) hash inserts; a string array
 * of n elements costs 8n bytes of index so element i is found in O(1). Lookups are O(1)
 * expected (hashed by key). Tensor data is never read by open.
 */
#ifndef KVFENCE_GGUF_H
#define KVFENCE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_gguf kvf_gguf_t;

/* Tensor element types, with GGUF's own numbering. */
enum kvf_ggml_type {
    KVF_GGML_F32 = 0,
    KVF_GGML_F16 = 1,
    KVF_GGML_Q4_0 = 2,
    KVF_GGML_Q8_0 = 8,
    KVF_GGML_Q4_K = 12,
    KVF_GGML_Q5_K = 13,
    KVF_GGML_Q6_K = 14,
    KVF_GGML_BF16 = 30,
};

/* Metadata value types, with GGUF's own numbering. */
enum kvf_gguf_type {
    KVF_GGUF_U8 = 0,
    KVF_GGUF_I8 = 1,
    KVF_GGUF_U16 = 2,
    KVF_GGUF_I16 = 3,
    KVF_GGUF_U32 = 4,
    KVF_GGUF_I32 = 5,
    KVF_GGUF_F32 = 6,
    KVF_GGUF_BOOL = 7,
    KVF_GGUF_STRING = 8,
    KVF_GGUF_ARRAY = 9,
    KVF_GGUF_U64 = 10,
    KVF_GGUF_I64 = 11,
    KVF_GGUF_F64 = 12,
};

/* Token types, as tokenizer.ggml.token_type stores them (the tokenizer, kvfence/text.h, reads
 * them; mkmodel writes them). */
enum kvf_token_type {
    KVF_TOKEN_NORMAL = 1,
    KVF_TOKEN_UNKNOWN = 2,
    KVF_TOKEN_CONTROL = 3,
    KVF_TOKEN_USER_DEFINED = 4,
    KVF_TOKEN_UNUSED = 5,
    KVF_TOKEN_BYTE = 6,
};

/* The alignment of the data section and of each tensor when general.alignment is absent. */
#define KVF_GGUF_DEFAULT_ALIGNMENT 32u
/* Tensors have at most this many dimensions. */
#define KVF_GGUF_MAX_DIMS 4u

/* One tensor as the file describes it. ne[0] is the fastest-varying dimension; unused
 * dimensions are 1. A 2-D weight with ne = [in, out] holds `out` rows of `in` values each. */
struct kvf_gguf_tensor {
    const char *name; /* NUL-terminated; owned by the kvf_gguf_t */
    uint32_t type;    /* enum kvf_ggml_type */
    uint32_t n_dims;  /* 1..4 */
    uint64_t ne[4];   /* elements per dimension */
    const void *data; /* view into the file, n_bytes long */
    uint64_t n_bytes; /* exact size of the data */
};

/* Opens and parses the GGUF file at `path` (mapped read-only). On success *out owns the mapping.
 * On failure *out is untouched, nothing stays mapped or open, and `err` (if err_len > 0) holds a
 * NUL-terminated explanation. */
int kvf_gguf_open(const char *path, kvf_gguf_t **out, char *err, size_t err_len);

/* Like kvf_gguf_open() over `len` bytes at `buf` (borrowed: it must outlive the result). */
int kvf_gguf_open_mem(const void *buf, size_t len, kvf_gguf_t **out, char *err, size_t err_len);

/* Unmaps and frees everything. NULL is a no-op. Every view handed out becomes invalid. */
void kvf_gguf_close(kvf_gguf_t *g);

/* The file's GGUF version (2 or 3). */
uint32_t kvf_gguf_version(const kvf_gguf_t *g);

/* Tensors, in file order: count, i-th (NULL past the end), and lookup by name (NULL if absent). */
uint64_t kvf_gguf_n_tensors(const kvf_gguf_t *g);
const struct kvf_gguf_tensor *kvf_gguf_tensor_at(const kvf_gguf_t *g, uint64_t i);
const struct kvf_gguf_tensor *kvf_gguf_find_tensor(const kvf_gguf_t *g, const char *name);

/* Keys, in file order: count; the i-th key (a view, not NUL-terminated) and its value type.
 * kvf_gguf_kv_at returns 0, or -ERANGE for i past the end. */
uint64_t kvf_gguf_n_kv(const kvf_gguf_t *g);
int kvf_gguf_kv_at(const kvf_gguf_t *g, uint64_t i, const char **key, size_t *key_len,
                   uint32_t *type);

/* The value type of `key` (enum kvf_gguf_type), or KVF_E_MODEL_MISSING. */
int kvf_gguf_get_type(const kvf_gguf_t *g, const char *key, uint32_t *type);

/* Scalars. get_u32/get_u64/get_i32 accept any integer type whose value fits; get_f32 accepts
 * F32 and F64 (F64 narrowed); get_bool accepts BOOL only. */
int kvf_gguf_get_u32(const kvf_gguf_t *g, const char *key, uint32_t *out);
int kvf_gguf_get_u64(const kvf_gguf_t *g, const char *key, uint64_t *out);
int kvf_gguf_get_i32(const kvf_gguf_t *g, const char *key, int32_t *out);
int kvf_gguf_get_f32(const kvf_gguf_t *g, const char *key, float *out);
int kvf_gguf_get_bool(const kvf_gguf_t *g, const char *key, bool *out);

/* A string value: a view of *len bytes, not NUL-terminated. */
int kvf_gguf_get_str(const kvf_gguf_t *g, const char *key, const char **s, size_t *len);

/* An array's element type and length. */
int kvf_gguf_get_arr(const kvf_gguf_t *g, const char *key, uint32_t *elem_type, uint64_t *n);

/* Element i of an array: a string view; an F32 (or F64) value; an integer that fits in int32. */
int kvf_gguf_get_arr_str(const kvf_gguf_t *g, const char *key, uint64_t i, const char **s,
                         size_t *len);
int kvf_gguf_get_arr_f32(const kvf_gguf_t *g, const char *key, uint64_t i, float *out);
int kvf_gguf_get_arr_i32(const kvf_gguf_t *g, const char *key, uint64_t i, int32_t *out);

/* ---------------------------------------------------------------------------------------------
 * Element formats of GGUF tensors: half-precision conversions, the size of a
 * row of each type, dequantization of a row to f32, and quantization of a row to Q8_0 / Q4_0.
 *
 * Block formats (GGML's, bit for bit), each covering KVF_QK = 32 consecutive values of a row:
 *   Q8_0: { fp16 d; int8 q[32]; }      34 bytes; value[j] = q[j] * d
 *   Q4_0: { fp16 d; uint8 q[16]; }     18 bytes; value[j] = ((q[j] & 15) - 8) * d for j < 16,
 *                                                  value[j+16] = ((q[j] >> 4) - 8) * d
 *   Q5_0: { fp16 d; uint8 qh[4]; uint8 q[16]; }  22 bytes; with h = qh read as a little-endian
 *         uint32, value[j] = (((q[j] & 15) | (h >> j & 1) << 4) - 16) * d for j < 16,
 *         value[j+16] = (((q[j] >> 4) | (h >> (j + 16) & 1) << 4) - 16) * d
 * A row of a quantized type holds a whole number of blocks (its length is a multiple of 32).
 *
 * The K-quants group KVF_QK_K = 256 values into a super-block of sub-blocks, each sub-block
 * with its own integer scale (and min), those integers scaled in turn by the super-block's
 * halves d (and dmin):
 *   Q4_K: { fp16 d, dmin; uint8 scales[12]; uint8 qs[128]; }            144 bytes, 4.5 bits
 *         8 sub-blocks of 32, each a 6-bit scale sc and 6-bit min m (scales[] below);
 *         value = (d · sc) · q − (dmin · m), q the 4-bit quant, 0..15. Values 64c .. 64c+31 are
 *         the low nibbles of qs[32c .. 32c+31] (sub-block 2c), 64c+32 .. 64c+63 their high
 *         nibbles (sub-block 2c+1).
 *   Q5_K: { fp16 d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; } 176 bytes, 5.5 bits
 *         as Q4_K with a fifth bit: value 64c+l (l < 32) takes bit 2c of qh[l] as its 16s bit,
 *         value 64c+32+l bit 2c+1; q is 0..31.
 *   Q6_K: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d; }      210 bytes, 6.5625 bits
 *         16 sub-blocks of 16, each an 8-bit signed scale; value = (d · sc) · (q − 32), q the
 *         6-bit quant. In half h (values 128h .. 128h+127), for l < 32: value 128h+l is
 *         low nibble of ql[64h+l] | bits 0-1 of qh[32h+l] << 4, +32 is the low nibble of
 *         ql[64h+32+l] | bits 2-3, +64 the high nibble of ql[64h+l] | bits 4-5, +96 the high
 *         nibble of ql[64h+32+l] | bits 6-7; value 16j .. 16j+15 has scale scales[j].
 *   The 12 scale bytes of Q4_K and Q5_K (kvf_kquant_scale_min): sub-block j < 4 has
 *   sc = scales[j] & 63, m = scales[j+4] & 63; j ≥ 4 has sc = (scales[j+4] & 15) |
 *   (scales[j-4] >> 6) << 4, m = (scales[j+4] >> 4) | (scales[j] >> 6) << 4.
 * The float operations of dequantization are exactly GGML's, in its order, so the values are
 * bit for bit the same.
 *
 * All functions are pure, thread-safe, and O(n) in the row length. Block structs have no
 * padding (static asserts in quant.c) and need only 2-byte alignment.
 * ------------------------------------------------------------------------------------------- */
#define KVF_QK   32
#define KVF_QK_K 256

/* GGML's type number of Q5_0, which the enum of the types kvfence reads above does not list (it
 * has only the others): the type of the matrices a Q4_K_M file keeps at 5 bits where a row is
 * not whole 256-value super-blocks. */
#define KVF_GGML_Q5_0 6u
/* Likewise Q4_1 and Q5_1, the affine 32-value blocks: Q5_1 is what llama.cpp's Q5_K_M puts
 * where a row is not whole super-blocks, Q4_1 what older Q4_1 and some Q4_K_S files hold. */
#define KVF_GGML_Q4_1 3u
#define KVF_GGML_Q5_1 7u

struct kvf_block_q8_0 {
    uint16_t d;        /* scale, IEEE half */
    int8_t qs[KVF_QK]; /* quantized values */
};

struct kvf_block_q4_0 {
    uint16_t d;             /* scale, IEEE half */
    uint8_t qs[KVF_QK / 2]; /* element j in the low nibble of qs[j], j+16 in the high one */
};

struct kvf_block_q5_0 {
    uint16_t d;             /* scale, IEEE half */
    uint8_t qh[4];          /* the fifth bits: bit j of the little-endian word is element j's */
    uint8_t qs[KVF_QK / 2]; /* the low 4 bits, placed as Q4_0's */
};

struct kvf_block_q4_1 {
    uint16_t d, m;          /* scale and minimum, IEEE halves */
    uint8_t qs[KVF_QK / 2]; /* placed as Q4_0's */
};

struct kvf_block_q5_1 {
    uint16_t d, m;          /* scale and minimum, IEEE halves */
    uint8_t qh[4];          /* the fifth bits, as Q5_0's */
    uint8_t qs[KVF_QK / 2]; /* the low 4 bits, as Q5_0's */
};

struct kvf_block_q4_k {
    uint16_t d, dmin;         /* super-block scales of the scales and of the mins */
    uint8_t scales[12];       /* 8 × (6-bit scale, 6-bit min), packed as above */
    uint8_t qs[KVF_QK_K / 2]; /* 4-bit quants */
};

struct kvf_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[KVF_QK_K / 8]; /* the fifth bit of each quant */
    uint8_t qs[KVF_QK_K / 2]; /* the low 4 bits */
};

struct kvf_block_q6_k {
    uint8_t ql[KVF_QK_K / 2];     /* the low 4 bits */
    uint8_t qh[KVF_QK_K / 4];     /* the high 2 bits */
    int8_t scales[KVF_QK_K / 16]; /* one per 16 values */
    uint16_t d;                   /* super-block scale, IEEE half */
};

/* IEEE half <-> float (round to nearest even; NaN stays NaN, overflow becomes infinity). */
float kvf_fp16_to_f32(uint16_t h);
uint16_t kvf_f32_to_fp16(float f);
/* bfloat16 <-> float (round to nearest even; NaN stays NaN). */
float kvf_bf16_to_f32(uint16_t b);
uint16_t kvf_f32_to_bf16(float f);

/* The name of a tensor type ("F32", "Q8_0", and also the GGML types kvfence does not read,
 * such as "Q4_K"), or "unknown". Never NULL. */
const char *kvf_ggml_type_name(uint32_t type);

/* True for the types kvfence reads: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K. */
int kvf_ggml_type_supported(uint32_t type);

/* Bytes of a row of n elements of `type` into *bytes. Returns 0, KVF_E_MODEL_UNSUPPORTED for
 * a type kvfence does not read, -EINVAL if n is not a multiple of the type's block size, or
 * -EOVERFLOW. */
int kvf_quant_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes);

/* Dequantizes n elements of `type` at src into dst[0..n). src needs the alignment stated in
 * the reader's section above (4 for F32, 2 otherwise). Returns 0, or the errors of
 * kvf_quant_row_bytes (then dst is untouched). */
int kvf_dequant_row(uint32_t type, const void *src, float *dst, uint64_t n);

/* Quantizes n values (n a multiple of 32) into n/32 blocks at dst. */
void kvf_quantize_row_q8_0(const float *src, struct kvf_block_q8_0 *dst, uint64_t n);
void kvf_quantize_row_q4_0(const float *src, struct kvf_block_q4_0 *dst, uint64_t n);
void kvf_quantize_row_q5_0(const float *src, struct kvf_block_q5_0 *dst, uint64_t n);
/* Affine: each block's [min, max] mapped onto 0..15 (0..31), m the minimum as a half. */
void kvf_quantize_row_q4_1(const float *src, struct kvf_block_q4_1 *dst, uint64_t n);
void kvf_quantize_row_q5_1(const float *src, struct kvf_block_q5_1 *dst, uint64_t n);

/* Quantizes n values (n a multiple of 256) into n/256 super-blocks at dst. A plain min-max
 * quantizer per sub-block (not GGML's iterative search): good enough for test models, and its
 * error is bounded as tests/gguf/test_quant.c checks. */
void kvf_quantize_row_q4_k(const float *src, struct kvf_block_q4_k *dst, uint64_t n);
void kvf_quantize_row_q5_k(const float *src, struct kvf_block_q5_k *dst, uint64_t n);
void kvf_quantize_row_q6_k(const float *src, struct kvf_block_q6_k *dst, uint64_t n);

/* Sub-block j's (0..7) 6-bit scale and min from the 12 scale bytes of a Q4_K or Q5_K block. */
void kvf_kquant_scale_min(const uint8_t scales[12], int j, uint8_t *sc, uint8_t *m);

/* ---------------------------------------------------------------------------------------------
 * Writer. Collects keys and tensor descriptions in memory, then writes a GGUF v3 file in one
 * pass, streaming tensor data so the file is never held in memory: a tensor's data is either a
 * caller's buffer (borrowed until kvf_gguf_writer_write returns) or produced row by row by a
 * callback. The file is written to "<path>.tmp" and renamed over `path` only when complete, so
 * a failed write leaves no partial file at `path`.
 *
 *   create ──▶ add_* (keys and tensors, in the order they will appear) ──▶ write ──▶ destroy
 *
 * Keys and names are copied. A duplicate key or tensor name is refused with -EEXIST.
 * ------------------------------------------------------------------------------------------- */
typedef struct kvf_gguf_writer kvf_gguf_writer_t;

/* Produces row `row` (0 ≤ row < ne[1]*ne[2]*ne[3]) of a tensor into `dst`, which holds exactly
 * one row's bytes (ne[0] elements in the tensor's type). Returns 0 or a negative code, which
 * aborts the write. Rows are asked for in order, each once. */
typedef int (*kvf_gguf_row_fn)(void *ctx, uint64_t row, void *dst, size_t row_bytes);

/* alignment: a power of two (0 means the default, 32); written as general.alignment if not 32. */
int kvf_gguf_writer_create(uint32_t alignment, kvf_gguf_writer_t **out);
void kvf_gguf_writer_destroy(kvf_gguf_writer_t *w);

int kvf_gguf_writer_add_u32(kvf_gguf_writer_t *w, const char *key, uint32_t v);
int kvf_gguf_writer_add_i32(kvf_gguf_writer_t *w, const char *key, int32_t v);
int kvf_gguf_writer_add_u64(kvf_gguf_writer_t *w, const char *key, uint64_t v);
int kvf_gguf_writer_add_f32(kvf_gguf_writer_t *w, const char *key, float v);
int kvf_gguf_writer_add_bool(kvf_gguf_writer_t *w, const char *key, bool v);
int kvf_gguf_writer_add_str(kvf_gguf_writer_t *w, const char *key, const char *s, size_t len);
/* Arrays; the values are copied. strs[i] has lens[i] bytes (lens NULL: NUL-terminated). */
int kvf_gguf_writer_add_arr_str(kvf_gguf_writer_t *w, const char *key, const char *const *strs,
                                const size_t *lens, uint64_t n);
int kvf_gguf_writer_add_arr_f32(kvf_gguf_writer_t *w, const char *key, const float *v, uint64_t n);
int kvf_gguf_writer_add_arr_i32(kvf_gguf_writer_t *w, const char *key, const int32_t *v,
                                uint64_t n);

/* A tensor of `type` with n_dims (1..4) dimensions ne[0..n_dims-1] (ne[0] a multiple of the
 * type's block size). Exactly one of `data` (borrowed until write returns; the tensor's full
 * size) or `fn` (called row by row during write) is given. */
int kvf_gguf_writer_add_tensor(kvf_gguf_writer_t *w, const char *name, uint32_t type,
                               uint32_t n_dims, const uint64_t *ne, const void *data,
                               kvf_gguf_row_fn fn, void *fn_ctx);

/* Writes the file. On failure no file is left at `path` (an older one stays as it was) and
 * `err` explains. The writer may be written again or destroyed afterwards. */
int kvf_gguf_writer_write(kvf_gguf_writer_t *w, const char *path, char *err, size_t err_len);

/* ---------------------------------------------------------------------------------------------
 * mkmodel: Llama test models with seeded random weights and a byte-level SentencePiece vocab
 * (<unk>, <s>, </s>, <0x00>..<0xFF>, then <extra_N> up to n_vocab). Weights are scaled so that
 * activations stay near unit size through every layer; norm weights are near 1 and always F32.
 * The same (shape, type, seed) gives the same bytes.
 * ------------------------------------------------------------------------------------------- */
/* Llama 3's long-context RoPE as a model's config.json gives it (rope_scaling, rope_type
 * "llama3"). mkmodel writes it as llama.cpp's converters do: per-pair factors in
 * rope_freqs.weight, 1 for pairs whose wavelength is under original_ctx / high_freq_factor,
 * `factor` for those over original_ctx / low_freq_factor, and a smooth blend between. */
struct kvf_mkmodel_llama3_rope {
    float factor, low_freq_factor, high_freq_factor;
    uint32_t original_ctx; /* original_max_position_embeddings, tokens */
};

struct kvf_mkmodel_shape {
    const char *name;
    uint32_t dim, n_layers, n_heads, n_kv_heads, ffn_dim, n_vocab, n_ctx;
    bool tied_output;  /* no output.weight: the output projection is token_embd.weight */
    const char *arch;  /* general.architecture: "llama" (NULL), "qwen2" or "qwen3" */
    uint32_t head_dim; /* written as <arch>.attention.key_length; 0: dim / n_heads */
    /* RoPE: the base (<arch>.rope.freq_base, > 1), Llama 3's per-pair factors (NULL: none) and
     * a linear scaling of the positions (<arch>.rope.scaling.type "linear" with this factor;
     * 0: none). */
    float rope_base;
    const struct kvf_mkmodel_llama3_rope *rope_llama3;
    float rope_linear;
};

/* tiny (64/2/4/2/172/512/2048, untied output), s15m (288/6/6/6/768/32000/2048, tied),
 * smol135m (576/30/9/3/1536/49152/8192, tied), hist (512/1/8/8/64/1024/4096: constructed
 * weights and a word vocabulary, see docs/TEST_MODELS.md; the seed is unused), and three whose
 * widths are whole K-quant super-blocks: ktiny (llama 256/2/4/2/512/512/2048, untied),
 * qwen2-tiny (256/2/4/2/512/512/2048, tied, Q/K/V biases), qwen3-tiny (256/2/4/2/768/512/2048,
 * untied, heads of 128 so q_dim 512 ≠ dim, Q/K norms), rope-tiny (ktiny's widths with every RoPE
 * scaling kvfence reads: base 500000, Llama 3's factors 8, low 1, high 4 over an original
 * context of 64, and linear 2). The shapes of released models, random weights in their
 * geometry: llama3.2-1b (2048/16/32/8/8192/128256/131072, tied, base 500000 and Llama 3's
 * factors 32, low 1, high 4 over 8192), qwen2.5-0.5b (qwen2 896/24/14/2/4864/151936/32768,
 * tied), qwen3-0.6b (qwen3 1024/28/16/8/3072/151936/40960, heads of 128, tied) and llama3-8b
 * (4096/32/32/8/14336/128256/8192, untied, base 500000). NULL for an unknown name. */
const struct kvf_mkmodel_shape *kvf_mkmodel_shape_by_name(const char *name);

/* The i-th shape kvf_mkmodel_shape_by_name knows, for listing them all; NULL past the last. */
const struct kvf_mkmodel_shape *kvf_mkmodel_shape_at(size_t i);

/* The file type "Q4_K_M" for kvf_mkmodel_write (not a tensor type): the 2-D weights mostly
 * Q4_K, the output projection (the embedding when tied) and attn_v and ffn_down of a few layers
 * Q6_K, as llama.cpp's Q4_K_M chooses (docs/MODEL_ENGINE.md has the rule); a weight whose rows
 * are not whole 256-value super-blocks falls back to Q5_0 (for Q4_K) or Q8_0 (for Q6_K), and to
 * F16 where they are not whole 32-value blocks either, as llama.cpp's do. */
#define KVF_MKMODEL_Q4_K_M 0x10000u
/* The file type "Q5_K_M": the same choice with Q5_K in place of Q4_K, as llama.cpp's Q5_K_M; its
 * fallback for Q5_K is Q5_1 (Q8_0 for Q6_K, F16 as above). */
#define KVF_MKMODEL_Q5_K_M 0x10001u

/* Writes a model of `shape` to `path`. type: KVF_GGML_F32, KVF_GGML_Q8_0 (a weight whose row
 * length is not a multiple of 32 stays F32), KVF_MKMODEL_Q4_K_M or KVF_MKMODEL_Q5_K_M for the
 * 2-D weights. Norms
 * and biases are F32. Memory use is a few rows, not the model. On failure no file is left at
 * `path` and `err` explains. */
int kvf_mkmodel_write(const char *path, const struct kvf_mkmodel_shape *shape, uint32_t type,
                      uint64_t seed, char *err, size_t err_len);

#endif /* KVFENCE_GGUF_H */
