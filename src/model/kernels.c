/*
 * kernels.c — variant selection, the matmul driver that tiles rows × tokens, and the small
 * per-row kernels (RMSNorm).
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kvfence/model.h"

const struct kvf_kern *kvf__kern = &kvf__kern_scalar;

static pthread_once_t kern_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
/* F16C from CPUID leaf 1 (ECX bit 29). Asked directly because clang's __builtin_cpu_supports
 * does not know the "f16c" feature name; the AVX2 check that precedes it already requires the
 * OS to save the YMM state F16C uses. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    return (c >> 29) & 1u;
}
#endif

static void kern_choose(void)
{
    const char *force = getenv("KVF_KERNELS");
    if (force && strcmp(force, "scalar") == 0) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!kvf__kern_avx2 || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !cpu_has_f16c())
        return;
    kvf__kern = kvf__kern_avx2;
    if (force && strcmp(force, "avx2") == 0) return;
    if (kvf__kern_vnni && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        kvf__kern = kvf__kern_vnni;
#endif
}

void kvf__kernels_init(void)
{
    pthread_once(&kern_once, kern_choose);
}

const char *kvf_kernels_name(void)
{
    kvf__kernels_init();
    return kvf__kern->name;
}

void kvf__matmul_warm(const struct kvf_weight *W, uint32_t r0, uint32_t r1, uint32_t groups)
{
    if (!W->packed || r0 >= r1) return;
    uint32_t g0 = r0 / KVF_Q8G_ROWS, g1 = (r1 + KVF_Q8G_ROWS - 1) / KVF_Q8G_ROWS;
    if (g1 - g0 < groups) groups = g1 - g0;
    /* One group of 16 rows, for every packed type (F32's groups are 16 rows too). */
    _Static_assert(KVF_F32G_ROWS == KVF_Q8G_ROWS, "every packed type groups 16 rows");
    size_t group_bytes = kvf__packed_bytes(W->type, KVF_Q8G_ROWS, W->cols);
    if (group_bytes == 0) return;
    const char *p = (const char *)W->packed + (size_t)g0 * group_bytes;
    for (size_t off = 0; off < groups * group_bytes; off += 64)
        __builtin_prefetch(p + off, 0, 2);
}

void kvf__matmul(const struct kvf_weight *W, const float *x, size_t ldx, const struct kvf_act16 *xq,
                 uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1, float *scratch)
{
    if (r0 >= r1 || nt == 0) return;
    switch (W->type) {
    case KVF_GGML_F32:
        if (W->packed) {
            kvf__kern->f32g_rows(W->packed, W->cols, x, ldx, nt, y, ldy, r0, r1);
            return;
        }
        kvf__kern->f32_rows(W->data, W->row_bytes / sizeof(float), x, ldx, nt, W->cols, y, ldy, r0,
                            r1);
        return;
    case KVF_GGML_Q8_0:
    case KVF_GGML_Q5_0: /* packed as Q8_0 (kvf__q5_0_q8g_pack) */
        if (W->packed) {
            kvf__kern->q8_rows(W->packed, W->cols / KVF_QK, xq->q, xq->d, xq->ld, nt, y, ldy, r0,
                               r1);
            return;
        }
        /* A weight built by hand without the packed form: the row-at-a-time path below. */
        goto rows;
    case KVF_GGML_Q5_1:
        if (!W->packed) goto rows;
        kvf__kern->q8m_rows(W->packed, W->cols / KVF_QK, xq->q, xq->d, xq->s, xq->ld, nt, y, ldy,
                            r0, r1);
        return;
    case KVF_GGML_Q4_0:
    case KVF_GGML_Q4_1:
    case KVF_GGML_Q4_K:
        if (!W->packed) goto rows;
        kvf__kern->q4_rows(W->packed, W->cols / KVF_QK, xq->q, xq->d, xq->s, xq->ld, nt, y, ldy, r0,
                           r1);
        return;
    case KVF_GGML_Q5_K:
        if (!W->packed) goto rows;
        kvf__kern->q5_rows(W->packed, W->cols / KVF_QK, xq->q, xq->d, xq->s, xq->ld, nt, y, ldy, r0,
                           r1);
        return;
    case KVF_GGML_Q6_K:
        if (!W->packed) goto rows;
        kvf__kern->q6_rows(W->packed, W->cols / KVF_QK, xq->q, xq->d, xq->ld, nt, y, ldy, r0, r1);
        return;
    default:
    rows:
        /* F16, BF16, and any weight without its packed form: one row at a time, dequantized
         * into scratch, then the F32 kernel for that one row — the same pair-wise operations
         * as any F32 weight. */
        for (uint32_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
            kvf_dequant_row(W->type, row, scratch, W->cols);
            kvf__kern->f32_rows(scratch, 0, x, ldx, nt, W->cols, y + r, ldy, 0, 1);
        }
        return;
    }
}

size_t kvf__packed_bytes(uint32_t type, uint32_t rows, uint32_t cols)
{
    size_t groups = kvf__q8g_blocks(rows, cols / KVF_QK);
    switch (type) {
    case KVF_GGML_F32:
        return kvf__f32g_floats(rows, cols) * sizeof(float);
    case KVF_GGML_Q8_0:
        return groups * sizeof(struct kvf_q8g);
    case KVF_GGML_Q5_0:
        return groups * sizeof(struct kvf_q8g); /* kvf__q5_0_q8g_pack */
    case KVF_GGML_Q5_1:
        return groups * sizeof(struct kvf_q8mg);
    case KVF_GGML_Q4_0:
    case KVF_GGML_Q4_1:
    case KVF_GGML_Q4_K:
        return groups * sizeof(struct kvf_q4g);
    case KVF_GGML_Q5_K:
        return groups * sizeof(struct kvf_q5g);
    case KVF_GGML_Q6_K:
        return groups * sizeof(struct kvf_q6g);
    default:
        return 0;
    }
}

/* Block blk (32 values) of a Q4_0, Q4_1, Q5_0, Q4_K or Q5_K row: its scale a, offset b (value =
 * a · q + b, both exact in float) and its quants q[32] (0..15, or 0..31 for the 5-bit types), read
 * from the layouts of gguf.h. */
static void affine_block(uint32_t type, const uint8_t *row, uint32_t blk, float *a, float *b,
                         uint8_t q[KVF_QK])
{
    if (type == KVF_GGML_Q4_0) {
        const struct kvf_block_q4_0 *x = (const struct kvf_block_q4_0 *)row + blk;
        *a = kvf_fp16_to_f32(x->d);
        *b = -8.0f * *a;
        for (int j = 0; j < KVF_QK / 2; j++)
            q[j] = x->qs[j] & 15, q[j + 16] = x->qs[j] >> 4;
        return;
    }
    if (type == KVF_GGML_Q4_1) {
        const struct kvf_block_q4_1 *x = (const struct kvf_block_q4_1 *)row + blk;
        *a = kvf_fp16_to_f32(x->d);
        *b = kvf_fp16_to_f32(x->m);
        for (int j = 0; j < KVF_QK / 2; j++)
            q[j] = x->qs[j] & 15, q[j + 16] = x->qs[j] >> 4;
        return;
    }
    if (type == KVF_GGML_Q5_0) {
        const struct kvf_block_q5_0 *x = (const struct kvf_block_q5_0 *)row + blk;
        uint32_t h = (uint32_t)x->qh[0] | (uint32_t)x->qh[1] << 8 | (uint32_t)x->qh[2] << 16 |
                     (uint32_t)x->qh[3] << 24;
        *a = kvf_fp16_to_f32(x->d);
        *b = -16.0f * *a;
        for (int j = 0; j < KVF_QK / 2; j++) {
            q[j] = (uint8_t)((x->qs[j] & 15) | (h >> j & 1) << 4);
            q[j + 16] = (uint8_t)((x->qs[j] >> 4) | (h >> (j + 16) & 1) << 4);
        }
        return;
    }
    /* Q4_K and Q5_K: sub-block j of the super-block, 32 values. */
    const uint8_t *scales, *qs;
    uint16_t d, dmin;
    const uint8_t *qh = NULL;
    uint32_t j = blk % 8;
    if (type == KVF_GGML_Q4_K) {
        const struct kvf_block_q4_k *x = (const struct kvf_block_q4_k *)row + blk / 8;
        scales = x->scales, qs = x->qs, d = x->d, dmin = x->dmin;
    } else {
        const struct kvf_block_q5_k *x = (const struct kvf_block_q5_k *)row + blk / 8;
        scales = x->scales, qs = x->qs, d = x->d, dmin = x->dmin, qh = x->qh;
    }
    uint8_t sc, m;
    kvf_kquant_scale_min(scales, (int)j, &sc, &m);
    *a = kvf_fp16_to_f32(d) * (float)sc;
    *b = -(kvf_fp16_to_f32(dmin) * (float)m);
    qs += 32 * (j / 2);
    for (int l = 0; l < KVF_QK; l++) {
        q[l] = j % 2 ? qs[l] >> 4 : qs[l] & 15;
        if (qh) q[l] |= (uint8_t)((qh[l] >> j & 1) << 4);
    }
}

/* The packed block layouts of kvf_q4g and kvf_q5g share their beginning, so one packer writes
 * both: the low nibbles into qs, and for 5-bit types the fifth bits into the words at qh. */
_Static_assert(offsetof(struct kvf_q5g, a) == offsetof(struct kvf_q4g, a) &&
                   offsetof(struct kvf_q5g, b) == offsetof(struct kvf_q4g, b) &&
                   offsetof(struct kvf_q5g, qs) == offsetof(struct kvf_q4g, qs),
               "kvf_q5g begins as kvf_q4g");
_Static_assert(sizeof(struct kvf_q4g) % 64 == 0 && sizeof(struct kvf_q5g) % 64 == 0,
               "packed blocks are whole cache lines");

static void affine_pack(uint32_t type, const void *src, size_t row_bytes, uint32_t rows,
                        uint32_t cols, uint8_t *dst, size_t block_bytes, bool five)
{
    uint32_t nb = cols / KVF_QK;
    memset(dst, 0, kvf__q8g_blocks(rows, nb) * block_bytes);
    for (uint32_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)src + (size_t)r * row_bytes;
        uint8_t *g = dst + (size_t)(r / KVF_Q8G_ROWS) * nb * block_bytes;
        uint32_t lane = r % KVF_Q8G_ROWS;
        for (uint32_t b = 0; b < nb; b++) {
            /* Every field of both layouts through struct kvf_q5g, which holds all of them. */
            struct kvf_q5g *blk = (struct kvf_q5g *)(g + b * block_bytes);
            uint8_t q[KVF_QK];
            affine_block(type, row, b, &blk->a[lane], &blk->b[lane], q);
            for (uint32_t p = 0; p < 8; p++)
                for (uint32_t k = 0; k < 2; k++) {
                    uint8_t lo = q[2 * p + k], hi = q[16 + 2 * p + k];
                    blk->qs[32 * p + 2 * lane + k] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                    if (!five) continue;
                    blk->qh[2 * p] |= (uint32_t)(lo >> 4) << (2 * lane + k);
                    blk->qh[2 * p + 1] |= (uint32_t)(hi >> 4) << (2 * lane + k);
                }
        }
    }
}

void kvf__q4g_pack(uint32_t type, const void *src, size_t row_bytes, uint32_t rows, uint32_t cols,
                   struct kvf_q4g *dst)
{
    affine_pack(type, src, row_bytes, rows, cols, (uint8_t *)dst, sizeof(*dst), false);
}

void kvf__q5g_pack(uint32_t type, const void *src, size_t row_bytes, uint32_t rows, uint32_t cols,
                   struct kvf_q5g *dst)
{
    affine_pack(type, src, row_bytes, rows, cols, (uint8_t *)dst, sizeof(*dst), true);
}

void kvf__q6g_pack(const void *src, size_t row_bytes, uint32_t rows, uint32_t cols,
                   struct kvf_q6g *dst)
{
    uint32_t nb = cols / KVF_QK;
    memset(dst, 0, kvf__packed_bytes(KVF_GGML_Q6_K, rows, cols));
    for (uint32_t r = 0; r < rows; r++) {
        const struct kvf_block_q6_k *row =
            (const struct kvf_block_q6_k *)((const uint8_t *)src + (size_t)r * row_bytes);
        struct kvf_q6g *g = dst + (size_t)(r / KVF_Q8G_ROWS) * nb;
        uint32_t lane = r % KVF_Q8G_ROWS;
        for (uint32_t b = 0; b < nb; b++) {
            const struct kvf_block_q6_k *x = row + b / 8;
            float d = kvf_fp16_to_f32(x->d);
            for (int h = 0; h < 2; h++)
                g[b].a[h][lane] = d * (float)x->scales[(b % 8) * 2 + h];
            for (int c = 0; c < KVF_QK; c++) {
                /* Value i of the super-block: its low nibble and its two high bits (gguf.h). */
                int i = (int)(b % 8) * KVF_QK + c, half = i / 128, rr = i % 128, quarter = rr / 32,
                    l = rr % 32;
                uint8_t lo = x->ql[64 * half + 32 * (quarter & 1) + l];
                lo = quarter < 2 ? lo & 15 : lo >> 4;
                int qv = lo | ((x->qh[32 * half + l] >> (2 * quarter)) & 3) << 4;
                g[b].qs[32 * (c / 2) + 2 * lane + c % 2] = (int8_t)(qv - 32);
            }
        }
    }
}

void kvf__f32g_pack(const float *src, size_t ws, uint32_t rows, uint32_t n, float *dst)
{
    memset(dst, 0, kvf__f32g_floats(rows, n) * sizeof(float));
    for (uint32_t r = 0; r < rows; r++) {
        float *g = dst + (size_t)(r / KVF_F32G_ROWS) * KVF_F32G_ROWS * n + r % KVF_F32G_ROWS;
        for (uint32_t c = 0; c < n; c++)
            g[(size_t)c * KVF_F32G_ROWS] = src[(size_t)r * ws + c];
    }
}

void kvf__q8g_pack(const struct kvf_block_q8_0 *src, uint32_t rows, uint32_t nb,
                   struct kvf_q8g *dst)
{
    memset(dst, 0, kvf__q8g_blocks(rows, nb) * sizeof(*dst));
    for (uint32_t r = 0; r < rows; r++) {
        struct kvf_q8g *g = dst + (size_t)(r / KVF_Q8G_ROWS) * nb;
        uint32_t lane = r % KVF_Q8G_ROWS;
        for (uint32_t b = 0; b < nb; b++) {
            const struct kvf_block_q8_0 *blk = &src[(size_t)r * nb + b];
            g[b].d[lane] = blk->d;
            for (uint32_t p = 0; p < KVF_QK / 2; p++) {
                g[b].qs[32 * p + 2 * lane] = blk->qs[2 * p];
                g[b].qs[32 * p + 2 * lane + 1] = blk->qs[2 * p + 1];
            }
        }
    }
}

void kvf__q5_0_q8g_pack(const struct kvf_block_q5_0 *src, uint32_t rows, uint32_t nb,
                        struct kvf_q8g *dst)
{
    memset(dst, 0, kvf__q8g_blocks(rows, nb) * sizeof(*dst));
    for (uint32_t r = 0; r < rows; r++) {
        struct kvf_q8g *g = dst + (size_t)(r / KVF_Q8G_ROWS) * nb;
        uint32_t lane = r % KVF_Q8G_ROWS;
        for (uint32_t b = 0; b < nb; b++) {
            float a, off;
            uint8_t q[KVF_QK];
            affine_block(KVF_GGML_Q5_0, (const uint8_t *)(src + (size_t)r * nb), b, &a, &off, q);
            g[b].d[lane] = src[(size_t)r * nb + b].d;
            for (uint32_t c = 0; c < KVF_QK; c++)
                g[b].qs[32 * (c / 2) + 2 * lane + c % 2] = (int8_t)(q[c] - 16);
        }
    }
}

_Static_assert(sizeof(struct kvf_q8mg) == 9 * 64, "a packed Q5_1 block is 9 cache lines");

void kvf__q5_1_q8mg_pack(const struct kvf_block_q5_1 *src, uint32_t rows, uint32_t nb,
                         struct kvf_q8mg *dst)
{
    memset(dst, 0, kvf__q8g_blocks(rows, nb) * sizeof(*dst));
    for (uint32_t r = 0; r < rows; r++) {
        struct kvf_q8mg *g = dst + (size_t)(r / KVF_Q8G_ROWS) * nb;
        uint32_t lane = r % KVF_Q8G_ROWS;
        for (uint32_t b = 0; b < nb; b++) {
            const struct kvf_block_q5_1 *x = &src[(size_t)r * nb + b];
            uint32_t h = (uint32_t)x->qh[0] | (uint32_t)x->qh[1] << 8 | (uint32_t)x->qh[2] << 16 |
                         (uint32_t)x->qh[3] << 24;
            g[b].d[lane] = x->d;
            g[b].m[lane] = x->m;
            for (uint32_t c = 0; c < KVF_QK; c++) {
                uint32_t nib = c < 16 ? x->qs[c] & 15u : x->qs[c - 16] >> 4;
                g[b].qs[32 * (c / 2) + 2 * lane + c % 2] = (int8_t)(nib | (h >> c & 1u) << 4);
            }
        }
    }
}

/* The sum of squares runs in 8 interleaved double accumulators (element i into s[i % 8]),
 * summed in a fixed tree at the end: one fixed order for every row, batch and thread, like a
 * plain loop, but 8 independent chains instead of one chain of dependent adds (the serial part
 * of a batched decode step spent most of its time here). */
void kvf__rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    kvf__kern->rmsnorm(out, x, w, n, eps);
}

void kvf__rmsnorm_scalar(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    double s[8] = {0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++)
        s[i % 8] += (double)x[i] * x[i];
    double ss = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}
