/*
 * test_kernels.c — the packed matmul kernels on their own, on random weights: every variant
 * this machine runs against a reference that reads the unpacked rows (F32) or the file's blocks
 * (Q8_0, Q4_0, Q5_0 and the K-quants), bit for bit, for any row range (starting and ending
 * inside 16-row groups), any token count, the extremes of the integer products, and without
 * writing a row outside the range.
 */
#include "model/kernels.h"
#include "model_test_util.h"

/* The recipe of kernels.h read straight from the file's blocks (row r at w + r · nb). */
static float ref_q8(const struct kvf_block_q8_0 *w, uint32_t nb, const int16_t *x, float xd)
{
    float acc = 0.0f;
    for (uint32_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (uint32_t i = 0; i < KVF_QK; i++)
            s += w[b].qs[i] * x[b * KVF_QK + i];
        acc = fmaf((float)s, kvf_fp16_to_f32(w[b].d), acc);
    }
    return acc * xd;
}

/* Uniform in [-1, 1). */
static float rand_unit(struct kvf_rng *r)
{
    return (float)((double)(kvf_rng_next(r) >> 40) * 0x1p-23 - 1.0);
}

/* The variants to check: the scalar one and whichever x86 ones this CPU runs. */
static uint32_t variants(const struct kvf_kern **out)
{
    uint32_t n = 0;
    out[n++] = &kvf__kern_scalar;
    kvf__kernels_init();
    if (kvf__kern == &kvf__kern_scalar) return n; /* KVF_KERNELS=scalar, or no AVX2 */
    out[n++] = kvf__kern_avx2;
    if (kvf__kern == kvf__kern_vnni) out[n++] = kvf__kern_vnni;
    return n;
}

/* The row range of try `which`: 0 the whole [0, rows), 1 a random one (usually starting and
 * ending inside 16-row groups). */
static void pick_range(struct kvf_rng *r, int which, uint32_t rows, uint32_t *r0, uint32_t *r1)
{
    *r0 = which ? kvf_rng_below(r, rows) : 0;
    *r1 = which ? *r0 + 1 + kvf_rng_below(r, rows - *r0) : rows;
}

/* Rows [r0, r1) of got must be want's bits and every other row the -7 it was filled with.
 * Prints the first difference, labelled with what, and returns false there. */
static bool rows_match(const char *what, const float *got, const float *want, uint32_t rows,
                       uint32_t nt, uint32_t r0, uint32_t r1)
{
    for (uint32_t t = 0; t < nt; t++)
        for (uint32_t k = 0; k < rows; k++) {
            float g = got[t * rows + k];
            float e = k >= r0 && k < r1 ? want[t * rows + k] : -7.0f;
            if (memcmp(&g, &e, sizeof(g)) != 0) {
                printf("# %s, rows [%u, %u) of %u, %u tokens: row %u token %u is %a, expected %a\n",
                       what, r0, r1, rows, nt, k, t, (double)g, (double)e);
                return false;
            }
        }
    return true;
}

/* Fills a weight: extreme = every weight ±127/-128 and every activation ±32767/-32768 (the
 * largest block sums, 32 · 128 · 32768 = 2^27), else uniform values. */
static void fill(struct kvf_rng *r, struct kvf_block_q8_0 *w, size_t nblocks, int16_t *x, size_t nx,
                 bool extreme)
{
    for (size_t i = 0; i < nblocks; i++) {
        w[i].d = kvf_f32_to_fp16(0.001f + (float)kvf_rng_below(r, 1000) * 1e-4f);
        for (int k = 0; k < KVF_QK; k++)
            w[i].qs[k] = extreme ? (kvf_rng_below(r, 2) ? 127 : -128)
                                 : (int8_t)((int)kvf_rng_below(r, 256) - 128);
    }
    for (size_t i = 0; i < nx; i++)
        x[i] = extreme ? (kvf_rng_below(r, 2) ? 32767 : -32768)
                       : (int16_t)((int)kvf_rng_below(r, 65536) - 32768);
}

static void test_q8_variants_match_reference(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    const struct kvf_kern *vs[3];
    uint32_t nv = variants(vs);
    const uint32_t shapes[][2] = {{1, 1}, {15, 2}, {16, 1}, {17, 3}, {47, 18}, {100, 9}, {64, 5}};
    const uint32_t nts[] = {1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 37};
    uint32_t cases = 0;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        uint32_t rows = shapes[si][0], nb = shapes[si][1], cols = nb * KVF_QK;
        for (int extreme = 0; extreme < 2; extreme++) {
            uint32_t max_nt = 37;
            struct kvf_block_q8_0 *w = malloc((size_t)rows * nb * sizeof(*w));
            /* C11 asks aligned_alloc for a size that is a multiple of the alignment. */
            size_t packed_bytes =
                (kvf__q8g_blocks(rows, nb) * sizeof(struct kvf_q8g) + 63) / 64 * 64;
            struct kvf_q8g *packed = aligned_alloc(64, packed_bytes);
            int16_t *x = malloc((size_t)max_nt * cols * sizeof(int16_t));
            float *xd = malloc(max_nt * sizeof(float));
            float *want = malloc((size_t)max_nt * rows * sizeof(float));
            float *got = malloc((size_t)max_nt * rows * sizeof(float));
            fill(&r, w, (size_t)rows * nb, x, (size_t)max_nt * cols, extreme);
            for (uint32_t t = 0; t < max_nt; t++)
                xd[t] = 1e-5f * (1 + (float)kvf_rng_below(&r, 100));
            kvf__q8g_pack(w, rows, nb, packed);
            for (uint32_t t = 0; t < max_nt; t++)
                for (uint32_t k = 0; k < rows; k++)
                    want[t * rows + k] =
                        ref_q8(w + (size_t)k * nb, nb, x + (size_t)t * cols, xd[t]);
            for (size_t ni = 0; ni < sizeof(nts) / sizeof(nts[0]); ni++) {
                uint32_t nt = nts[ni];
                for (int which = 0; which < 2; which++) {
                    uint32_t r0, r1;
                    pick_range(&r, which, rows, &r0, &r1);
                    for (uint32_t v = 0; v < nv; v++) {
                        for (size_t i = 0; i < (size_t)nt * rows; i++)
                            got[i] = -7.0f;
                        vs[v]->q8_rows(packed, nb, x, xd, cols, nt, got, rows, r0, r1);
                        char what[64];
                        snprintf(what, sizeof(what), "%s Q8_0, nb %u, extreme %d", vs[v]->name, nb,
                                 extreme);
                        ASSERT_TRUE(rows_match(what, got, want, rows, nt, r0, r1));
                        cases++;
                    }
                }
            }
            free(w);
            free(packed);
            free(x);
            free(xd);
            free(want);
            free(got);
        }
    }
    printf("# Q8_0 kernels equal to the reference in %u cases (%u variants:", cases, nv);
    for (uint32_t v = 0; v < nv; v++)
        printf(" %s", vs[v]->name);
    printf(")\n");
}

/* Rows past the last full group are padded with zero weights and scales, and the packed bytes
 * are exactly the blocks' values moved (every weight and scale found where kernels.h says). */
static void test_q8_pack_layout(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed() ^ 0x5a);
    uint32_t rows = 21, nb = 2;
    struct kvf_block_q8_0 w[21 * 2];
    int16_t x[1];
    fill(&r, w, 21 * 2, x, 1, false);
    struct kvf_q8g packed[4];
    ASSERT_EQ_U64(kvf__q8g_blocks(rows, nb), 4);
    memset(packed, 0x55, sizeof(packed));
    kvf__q8g_pack(w, rows, nb, packed);
    for (uint32_t g = 0; g < 2; g++)
        for (uint32_t b = 0; b < nb; b++)
            for (uint32_t lane = 0; lane < KVF_Q8G_ROWS; lane++) {
                uint32_t row = g * KVF_Q8G_ROWS + lane;
                const struct kvf_q8g *pb = &packed[g * nb + b];
                ASSERT_EQ_INT(pb->d[lane], row < rows ? w[row * nb + b].d : 0);
                for (uint32_t c = 0; c < KVF_QK; c++)
                    ASSERT_EQ_INT(pb->qs[32 * (c / 2) + 2 * lane + c % 2],
                                  row < rows ? w[row * nb + b].qs[c] : 0);
            }
}

/* The packed F32 recipe read straight from a row: one fmaf chain in column order. */
static float ref_f32(const float *w, const float *x, uint32_t n)
{
    float acc = 0.0f;
    for (uint32_t c = 0; c < n; c++)
        acc = fmaf(w[c], x[c], acc);
    return acc;
}

static void test_f32_variants_match_reference(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed() ^ 0xf32);
    const struct kvf_kern *vs[3];
    uint32_t nv = variants(vs);
    const uint32_t shapes[][2] = {{1, 1},    {15, 7},   {16, 64}, {17, 33},
                                  {47, 100}, {100, 96}, {130, 9}};
    const uint32_t nts[] = {1, 2, 3, 5, 6, 7, 8, 9, 13, 16, 37};
    uint32_t cases = 0, max_nt = 37;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        uint32_t rows = shapes[si][0], n = shapes[si][1];
        float *w = malloc((size_t)rows * n * sizeof(float));
        float *packed = malloc(kvf__f32g_floats(rows, n) * sizeof(float));
        float *x = malloc((size_t)max_nt * n * sizeof(float));
        float *want = malloc((size_t)max_nt * rows * sizeof(float));
        float *got = malloc((size_t)max_nt * rows * sizeof(float));
        for (size_t i = 0; i < (size_t)rows * n; i++)
            w[i] = rand_unit(&r);
        for (size_t i = 0; i < (size_t)max_nt * n; i++)
            x[i] = rand_unit(&r);
        kvf__f32g_pack(w, n, rows, n, packed);
        for (uint32_t t = 0; t < max_nt; t++)
            for (uint32_t k = 0; k < rows; k++)
                want[t * rows + k] = ref_f32(w + (size_t)k * n, x + (size_t)t * n, n);
        for (size_t ni = 0; ni < sizeof(nts) / sizeof(nts[0]); ni++) {
            uint32_t nt = nts[ni];
            for (int which = 0; which < 2; which++) {
                uint32_t r0, r1;
                pick_range(&r, which, rows, &r0, &r1);
                for (uint32_t v = 0; v < nv; v++) {
                    for (size_t i = 0; i < (size_t)nt * rows; i++)
                        got[i] = -7.0f;
                    vs[v]->f32g_rows(packed, n, x, n, nt, got, rows, r0, r1);
                    char what[64];
                    snprintf(what, sizeof(what), "%s F32, n %u", vs[v]->name, n);
                    ASSERT_TRUE(rows_match(what, got, want, rows, nt, r0, r1));
                    cases++;
                }
            }
        }
        free(w);
        free(packed);
        free(x);
        free(want);
        free(got);
    }
    printf("# packed F32 kernels equal to the reference in %u cases (%u variants)\n", cases, nv);
}

/* K/V rows stored as halves: every variant writes kvf_f32_to_fp16's bits, on values across the
 * whole float range (ties, half subnormals, overflow to infinity, every kind of NaN). */
static void test_f16_rows_match_scalar(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed() ^ 0xf16);
    const struct kvf_kern *vs[3];
    uint32_t nv = variants(vs);
    enum { N = 4099 };
    static float x[N];
    static uint16_t want[N], got[N];
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
        0x7f800001u, 0x7fbfffffu, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x47800000u,
        0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u, 0x33000001u, 0x00000001u,
        0x3f801000u, 0x3f803000u, 0x3f801001u, 0x3f802fffu, 0x387fe000u, 0x38002000u};
    for (int round = 0; round < 40; round++) {
        for (uint32_t i = 0; i < N; i++) {
            uint32_t u;
            if (i < KVF_ARRAY_LEN(special)) u = special[i];
            /* Any bits at all, or exponents near the half range, with low bits at a tie. */
            else if (i % 3 == 0)
                u = (uint32_t)kvf_rng_next(&r);
            else
                u = ((uint32_t)kvf_rng_next(&r) & 0x80000000u) |
                    ((100u + kvf_rng_below(&r, 50)) << 23) |
                    ((uint32_t)kvf_rng_next(&r) & 0x7fe000u) | (i % 2 ? 0x1000u : 0x0fffu);
            memcpy(&x[i], &u, sizeof(u));
        }
        for (uint32_t i = 0; i < N; i++)
            want[i] = kvf_f32_to_fp16(x[i]);
        for (uint32_t v = 0; v < nv; v++) {
            memset(got, 0xa5, sizeof(got));
            vs[v]->f16_row(x, got, N);
            for (uint32_t i = 0; i < N; i++)
                if (got[i] != want[i]) {
                    uint32_t u;
                    memcpy(&u, &x[i], sizeof(u));
                    KVF_FAIL("%s: half of 0x%08x is 0x%04x, expected 0x%04x", vs[v]->name, u,
                             got[i], want[i]);
                }
        }
    }
    printf("# halves of %u floats: %u variants equal to kvf_f32_to_fp16\n", 40 * N, nv);
}

/* RMSNorm: every variant gives kvf__rmsnorm_scalar's bits (both NaN counts as equal: a NaN's
 * payload may come from either operand), at lengths around multiples of 8 and over magnitudes
 * from 1e-30 to 1e30, with an Inf or NaN now and then. */
static void test_rmsnorm_matches_scalar(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed() ^ 0x4a5);
    const struct kvf_kern *vs[3];
    uint32_t nv = variants(vs);
    static const uint32_t lens[] = {1, 7, 8, 9, 15, 64, 172, 288, 577, 1536};
    float x[1536], w[1536], want[1536], got[1536];
    uint32_t rows = 0;
    for (int round = 0; round < 60; round++)
        for (size_t li = 0; li < KVF_ARRAY_LEN(lens); li++) {
            uint32_t n = lens[li];
            float mag = powf(10.0f, (float)((int)kvf_rng_below(&r, 61) - 30));
            for (uint32_t i = 0; i < n; i++) {
                x[i] = rand_unit(&r) * mag;
                w[i] = 1.0f + rand_unit(&r);
            }
            if (round % 10 == 9) x[kvf_rng_below(&r, n)] = round % 20 == 9 ? INFINITY : NAN;
            kvf__rmsnorm_scalar(want, x, w, n, 1e-5f);
            for (uint32_t v = 0; v < nv; v++) {
                memset(got, 0, sizeof(got));
                vs[v]->rmsnorm(got, x, w, n, 1e-5f);
                for (uint32_t i = 0; i < n; i++)
                    if (memcmp(&got[i], &want[i], sizeof(float)) != 0 &&
                        !(isnan(got[i]) && isnan(want[i])))
                        KVF_FAIL("%s: rmsnorm of %u at magnitude %g: element %u is %a, expected "
                                 "%a",
                                 vs[v]->name, n, (double)mag, i, (double)got[i], (double)want[i]);
            }
            rows++;
        }
    printf("# rmsnorm: %u rows, %u variants equal to the scalar form\n", rows, nv);
}

/* --- Q4_0, Q5_0, Q4_K, Q5_K and Q6_K: the recipes of kernels.h read straight from the file's
 * blocks. ---------------------------------------------------------------------------------- */

/* Q5_0's fifth bits as one word, read byte by byte (little-endian, as the format says). */
static uint32_t q5_0_word(const struct kvf_block_q5_0 *x)
{
    return x->qh[0] | (uint32_t)x->qh[1] << 8 | (uint32_t)x->qh[2] << 16 | (uint32_t)x->qh[3] << 24;
}

/* Block b (32 values) of a row: each value's integer quant and the float(s) the recipe applies
 * — Q4, Q5: value = a · q + off; Q6: value = a[c / 16] · q — from the layouts in gguf.h. */
static void kq_block(uint32_t type, const uint8_t *row, uint32_t b, int q[32], float a[2],
                     float *off)
{
    if (type == KVF_GGML_Q4_0) {
        const struct kvf_block_q4_0 *x = (const struct kvf_block_q4_0 *)row + b;
        a[0] = a[1] = kvf_fp16_to_f32(x->d);
        *off = -8.0f * a[0];
        for (int j = 0; j < 16; j++)
            q[j] = x->qs[j] & 15, q[j + 16] = x->qs[j] >> 4;
    } else if (type == KVF_GGML_Q4_1) {
        const struct kvf_block_q4_1 *x = (const struct kvf_block_q4_1 *)row + b;
        a[0] = a[1] = kvf_fp16_to_f32(x->d);
        *off = kvf_fp16_to_f32(x->m);
        for (int j = 0; j < 16; j++)
            q[j] = x->qs[j] & 15, q[j + 16] = x->qs[j] >> 4;
    } else if (type == KVF_GGML_Q5_1) {
        const struct kvf_block_q5_1 *x = (const struct kvf_block_q5_1 *)row + b;
        uint32_t h = x->qh[0] | (uint32_t)x->qh[1] << 8 | (uint32_t)x->qh[2] << 16 |
                     (uint32_t)x->qh[3] << 24;
        a[0] = a[1] = kvf_fp16_to_f32(x->d);
        *off = kvf_fp16_to_f32(x->m);
        for (int j = 0; j < 16; j++) {
            q[j] = (x->qs[j] & 15) + 16 * (int)(h >> j & 1);
            q[j + 16] = (x->qs[j] >> 4) + 16 * (int)(h >> (16 + j) & 1);
        }
    } else if (type == KVF_GGML_Q5_0) {
        const struct kvf_block_q5_0 *x = (const struct kvf_block_q5_0 *)row + b;
        uint32_t h = q5_0_word(x);
        a[0] = a[1] = kvf_fp16_to_f32(x->d);
        *off = -16.0f * a[0];
        for (int j = 0; j < 16; j++) {
            q[j] = (x->qs[j] & 15) + 16 * (int)(h >> j & 1);
            q[j + 16] = (x->qs[j] >> 4) + 16 * (int)(h >> (16 + j) & 1);
        }
    } else if (type == KVF_GGML_Q4_K || type == KVF_GGML_Q5_K) {
        /* The two layouts differ only in qh, which sits before qs in Q5_K. */
        const struct kvf_block_q4_k *x4 = (const struct kvf_block_q4_k *)row + b / 8;
        const struct kvf_block_q5_k *x5 = (const struct kvf_block_q5_k *)row + b / 8;
        bool five = type == KVF_GGML_Q5_K;
        const uint8_t *scales = five ? x5->scales : x4->scales, *qs = five ? x5->qs : x4->qs;
        uint8_t sc, m;
        kvf_kquant_scale_min(scales, (int)(b % 8), &sc, &m);
        a[0] = a[1] = kvf_fp16_to_f32(five ? x5->d : x4->d) * sc;
        *off = -(kvf_fp16_to_f32(five ? x5->dmin : x4->dmin) * m);
        for (int l = 0; l < 32; l++) {
            uint8_t byte = qs[32 * ((b % 8) / 2) + l];
            q[l] = (b % 2) ? byte >> 4 : byte & 15;
            if (five) q[l] += 16 * ((x5->qh[l] >> (b % 8)) & 1);
        }
    } else {
        const struct kvf_block_q6_k *x = (const struct kvf_block_q6_k *)row + b / 8;
        uint32_t sub = b % 8;
        a[0] = kvf_fp16_to_f32(x->d) * x->scales[2 * sub];
        a[1] = kvf_fp16_to_f32(x->d) * x->scales[2 * sub + 1];
        *off = 0.0f;
        /* Values 32·sub .. +31 of the super-block: half sub / 4, quarter sub % 4. */
        uint32_t half = sub / 4, quarter = sub % 4;
        for (int l = 0; l < 32; l++) {
            uint8_t lo = x->ql[64 * half + 32 * (quarter & 1) + l];
            lo = quarter < 2 ? lo & 15 : lo >> 4;
            q[l] = (lo | ((x->qh[32 * half + l] >> (2 * quarter)) & 3) << 4) - 32;
        }
    }
}

/* as_q8: Q5_0 packed as Q8_0 (kvf__q5_0_q8g_pack), whose recipe is Q8_0's on the weights
 * q − 16 and the scale d. */
static float ref_kq(uint32_t type, bool as_q8, const uint8_t *row, uint32_t nb, const int16_t *x,
                    float xd)
{
    float acc = 0.0f;
    for (uint32_t b = 0; b < nb; b++) {
        int q[32];
        float a[2], off;
        kq_block(type, row, b, q, a, &off);
        int32_t s[2] = {0, 0}, sx = 0;
        for (int i = 0; i < 32; i++) {
            int w = as_q8 ? q[i] - 16 : q[i];
            s[i / 16] += w * x[b * 32 + i], sx += x[b * 32 + i];
        }
        if (as_q8) {
            acc = fmaf((float)(s[0] + s[1]), a[0], acc);
        } else if (type == KVF_GGML_Q6_K) {
            acc = fmaf((float)s[0], a[0], acc);
            acc = fmaf((float)s[1], a[1], acc);
        } else {
            acc = fmaf((float)(s[0] + s[1]), a[0], acc);
            acc = fmaf((float)sx, off, acc);
        }
    }
    return acc * xd;
}

/* Row k of a weight of `type`: quantized from values with a shift, or (raw) random bytes with
 * sane half scales, which reach every quant, every fifth bit and every 6-bit scale and min. */
static void kq_row(struct kvf_rng *r, uint32_t type, uint8_t *dst, uint64_t row_bytes,
                   uint32_t cols, uint32_t k, bool raw, float *wf)
{
    if (raw) {
        for (uint64_t i = 0; i < row_bytes; i++)
            dst[i] = (uint8_t)kvf_rng_below(r, 256);
        uint16_t h[2];
        for (int i = 0; i < 2; i++)
            h[i] = kvf_f32_to_fp16((0.001f + (float)kvf_rng_below(r, 1000) * 1e-5f) *
                                   (kvf_rng_below(r, 2) ? 1.0f : -1.0f));
        /* The halves' offsets: d at 0 (and dmin at 2) but for Q6_K, whose d ends the block. */
        size_t bb = type == KVF_GGML_Q4_0   ? sizeof(struct kvf_block_q4_0)
                    : type == KVF_GGML_Q4_1 ? sizeof(struct kvf_block_q4_1)
                    : type == KVF_GGML_Q5_1 ? sizeof(struct kvf_block_q5_1)
                    : type == KVF_GGML_Q5_0 ? sizeof(struct kvf_block_q5_0)
                    : type == KVF_GGML_Q4_K ? sizeof(struct kvf_block_q4_k)
                    : type == KVF_GGML_Q5_K ? sizeof(struct kvf_block_q5_k)
                                            : sizeof(struct kvf_block_q6_k);
        for (uint8_t *blk = dst; blk < dst + row_bytes; blk += bb) {
            if (type == KVF_GGML_Q6_K)
                memcpy(blk + bb - 2, &h[0], 2);
            else
                memcpy(blk, &h[0], 2);
            if (type == KVF_GGML_Q4_K || type == KVF_GGML_Q5_K || type == KVF_GGML_Q4_1 ||
                type == KVF_GGML_Q5_1)
                memcpy(blk + 2, &h[1], 2); /* dmin, or Q4_1's and Q5_1's m */
        }
        return;
    }
    float shift = (k % 3) * 0.3f; /* rows with a non-zero minimum too */
    for (uint32_t c = 0; c < cols; c++)
        wf[c] = shift + rand_unit(r);
    switch (type) {
    case KVF_GGML_Q4_0:
        kvf_quantize_row_q4_0(wf, (void *)dst, cols);
        break;
    case KVF_GGML_Q5_0:
        kvf_quantize_row_q5_0(wf, (void *)dst, cols);
        break;
    case KVF_GGML_Q4_1:
        kvf_quantize_row_q4_1(wf, (void *)dst, cols);
        break;
    case KVF_GGML_Q5_1:
        kvf_quantize_row_q5_1(wf, (void *)dst, cols);
        break;
    case KVF_GGML_Q4_K:
        kvf_quantize_row_q4_k(wf, (void *)dst, cols);
        break;
    case KVF_GGML_Q5_K:
        kvf_quantize_row_q5_k(wf, (void *)dst, cols);
        break;
    default:
        kvf_quantize_row_q6_k(wf, (void *)dst, cols);
        break;
    }
}

/* Every variant's Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K products equal the reference bit
 * for bit (Q5_1 packed as the model packs it, struct kvf_q8mg, on the Q8_0 tiles with minima),
 * over row ranges inside groups and token counts that take every tile shape (1 to 8 tokens and
 * a remainder, up to 19); and the reference itself is the dot product of the dequantized row
 * (to float rounding), so the packing and the recipes read the values the file holds. The
 * activations' block sums are the quantizer's (kvf_act16). */
static void test_kq_variants_match_reference(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    const struct kvf_kern *vs[3];
    uint32_t nv = variants(vs);
    /* The last Q5_0 is packed as the model packs it, as Q8_0 (q8_rows); the first as
     * struct kvf_q5g (q5_rows), which Q5_K shares. */
    const uint32_t types[] = {KVF_GGML_Q4_0, KVF_GGML_Q4_1, KVF_GGML_Q5_1, KVF_GGML_Q5_0,
                              KVF_GGML_Q4_K, KVF_GGML_Q5_K, KVF_GGML_Q6_K, KVF_GGML_Q5_0};
    /* rows, blocks of 32, raw bytes */
    const uint32_t shapes[][3] = {{1, 8, 0},   {17, 8, 0},  {47, 16, 1},
                                  {100, 8, 0}, {64, 24, 1}, {33, 8, 1}};
    const uint32_t nts[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 19};
    enum { MAX_NT = 19 };
    uint32_t cases = 0;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            uint32_t type = types[ti], rows = shapes[si][0], nb = shapes[si][1], cols = nb * 32;
            bool raw = shapes[si][2] != 0, as_q8 = ti == sizeof(types) / sizeof(types[0]) - 1;
            uint64_t row_bytes;
            ASSERT_OK(kvf_quant_row_bytes(type, cols, &row_bytes));
            uint8_t *w = malloc(rows * row_bytes);
            float *wf = malloc((size_t)cols * sizeof(float)),
                  *deq = malloc((size_t)cols * sizeof(float));
            for (uint32_t k = 0; k < rows; k++)
                kq_row(&r, type, w + k * row_bytes, row_bytes, cols, k, raw, wf);
            /* kvf__packed_bytes gives Q5_0's size as the model packs it, as Q8_0. */
            size_t pb = type == KVF_GGML_Q5_0 && !as_q8
                            ? kvf__q8g_blocks(rows, nb) * sizeof(struct kvf_q5g)
                            : kvf__packed_bytes(type, rows, cols);
            pb = (pb + 63) / 64 * 64;
            void *packed = aligned_alloc(64, pb);
            if (as_q8)
                kvf__q5_0_q8g_pack((const void *)w, rows, nb, packed);
            else if (type == KVF_GGML_Q5_1)
                kvf__q5_1_q8mg_pack((const void *)w, rows, nb, packed);
            else if (type == KVF_GGML_Q6_K)
                kvf__q6g_pack(w, row_bytes, rows, cols, packed);
            else if (type == KVF_GGML_Q5_0 || type == KVF_GGML_Q5_K)
                kvf__q5g_pack(type, w, row_bytes, rows, cols, packed);
            else
                kvf__q4g_pack(type, w, row_bytes, rows, cols, packed);
            int16_t *x = malloc((size_t)MAX_NT * cols * sizeof(int16_t));
            float *xd = malloc(MAX_NT * sizeof(float)),
                  *xs = malloc((size_t)MAX_NT * nb * sizeof(float));
            float *want = malloc((size_t)MAX_NT * rows * sizeof(float));
            float *got = malloc((size_t)MAX_NT * rows * sizeof(float));
            for (size_t i = 0; i < (size_t)MAX_NT * cols; i++)
                x[i] = (int16_t)((int)kvf_rng_below(&r, 65536) - 32768);
            /* One token at the extremes: the largest sums of products and of activations. */
            for (uint32_t c = 0; c < cols; c++)
                x[(size_t)(MAX_NT - 1) * cols + c] = c % 5 ? -32768 : 32767;
            for (size_t i = 0; i < (size_t)MAX_NT * nb; i++) {
                int32_t sum = 0;
                for (int k = 0; k < 32; k++)
                    sum += x[32 * i + k];
                xs[i] = (float)sum;
            }
            for (uint32_t t = 0; t < MAX_NT; t++)
                xd[t] = 1e-5f * (1 + (float)kvf_rng_below(&r, 100));
            for (uint32_t t = 0; t < MAX_NT; t++)
                for (uint32_t k = 0; k < rows; k++) {
                    const int16_t *xt = x + (size_t)t * cols;
                    float v = ref_kq(type, as_q8, w + k * row_bytes, nb, xt, xd[t]);
                    want[t * rows + k] = v;
                    ASSERT_OK(kvf_dequant_row(type, w + k * row_bytes, deq, cols));
                    double exact = 0.0, mag = 0.0;
                    for (uint32_t c = 0; c < cols; c++)
                        exact += (double)deq[c] * xt[c], mag += fabs((double)deq[c] * xt[c]);
                    ASSERT_NEAR(v, exact * xd[t], 1e-5 * mag * xd[t]);
                }
            for (size_t ni = 0; ni < sizeof(nts) / sizeof(nts[0]); ni++)
                for (int which = 0; which < 2; which++) {
                    uint32_t nt = nts[ni], r0, r1;
                    pick_range(&r, which, rows, &r0, &r1);
                    /* The last nt tokens, so that the extreme one is in every case. */
                    const int16_t *xt = x + (size_t)(MAX_NT - nt) * cols;
                    const float *xdt = xd + MAX_NT - nt, *xst = xs + (size_t)(MAX_NT - nt) * nb;
                    const float *wt = want + (size_t)(MAX_NT - nt) * rows;
                    for (uint32_t v = 0; v < nv; v++) {
                        for (size_t i = 0; i < (size_t)nt * rows; i++)
                            got[i] = -7.0f;
                        if (as_q8)
                            vs[v]->q8_rows(packed, nb, xt, xdt, cols, nt, got, rows, r0, r1);
                        else if (type == KVF_GGML_Q5_1)
                            vs[v]->q8m_rows(packed, nb, xt, xdt, xst, cols, nt, got, rows, r0, r1);
                        else if (type == KVF_GGML_Q6_K)
                            vs[v]->q6_rows(packed, nb, xt, xdt, cols, nt, got, rows, r0, r1);
                        else if (type == KVF_GGML_Q5_0 || type == KVF_GGML_Q5_K)
                            vs[v]->q5_rows(packed, nb, xt, xdt, xst, cols, nt, got, rows, r0, r1);
                        else
                            vs[v]->q4_rows(packed, nb, xt, xdt, xst, cols, nt, got, rows, r0, r1);
                        char what[64];
                        snprintf(what, sizeof(what), "%s %s%s, nb %u%s", vs[v]->name,
                                 kvf_ggml_type_name(type), as_q8 ? " as Q8_0" : "", nb,
                                 raw ? ", raw" : "");
                        ASSERT_TRUE(rows_match(what, got, wt, rows, nt, r0, r1));
                        cases++;
                    }
                }
            free(w), free(wf), free(deq), free(packed), free(x), free(xd), free(xs), free(want),
                free(got);
        }
    printf("# Q4_0, Q4_1, Q5_1 (as kvf_q8mg), Q5_0 (as kvf_q5g and as Q8_0), Q4_K, Q5_K, Q6_K "
           "kernels equal to the "
           "reference in %u cases (%u variants)\n",
           cases, nv);
}

/* Q5_0 dequantization: a block built by hand from the format's definition (gguf.h), then
 * random blocks against the definition, bit for bit; and the quantizer's error within half a
 * step (plus the scale's rounding to a half). */
static void test_q5_0_layout(void)
{
    struct kvf_block_q5_0 b;
    memset(&b, 0, sizeof(b));
    b.d = kvf_f32_to_fp16(0.5f);
    b.qs[0] = 0x3f;  /* value 0: low nibble 15; value 16: high nibble 3 */
    b.qs[15] = 0x80; /* value 15: 0; value 31: 8 */
    b.qh[0] = 0x01;  /* bit 0: value 0 takes 16 */
    b.qh[2] = 0x01;  /* bit 16: value 16 takes 16 */
    b.qh[3] = 0x80;  /* bit 31: value 31 takes 16 */
    float out[32];
    ASSERT_OK(kvf_dequant_row(KVF_GGML_Q5_0, &b, out, 32));
    ASSERT_TRUE(out[0] == (31 - 16) * 0.5f && out[16] == (19 - 16) * 0.5f);
    ASSERT_TRUE(out[15] == -16 * 0.5f && out[31] == (24 - 16) * 0.5f);
    ASSERT_TRUE(out[1] == -8.0f && out[17] == -8.0f);
    uint64_t n;
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_Q5_0, 64, &n));
    ASSERT_EQ_U64(n, 44);
    ASSERT_ERR(kvf_quant_row_bytes(KVF_GGML_Q5_0, 48, &n), -EINVAL);
    ASSERT_TRUE(kvf_ggml_type_supported(KVF_GGML_Q5_0));
    ASSERT_STREQ(kvf_ggml_type_name(KVF_GGML_Q5_0), "Q5_0");

    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    enum { NB = 64 };
    struct kvf_block_q5_0 blocks[NB];
    float y[NB * 32], x[NB * 32];
    for (int rep = 0; rep < 20; rep++) {
        uint8_t *raw = (uint8_t *)blocks;
        for (size_t i = 0; i < sizeof(blocks); i++)
            raw[i] = (uint8_t)kvf_rng_below(&r, 256);
        for (int k = 0; k < NB; k++)
            if (blocks[k].d >> 10 == 31) blocks[k].d &= 0x83ff; /* no Inf or NaN scales */
        ASSERT_OK(kvf_dequant_row(KVF_GGML_Q5_0, blocks, y, NB * 32));
        for (int k = 0; k < NB; k++) {
            float d = kvf_fp16_to_f32(blocks[k].d);
            uint32_t h = q5_0_word(&blocks[k]);
            for (int j = 0; j < 32; j++) {
                int nib = j < 16 ? blocks[k].qs[j] & 15 : blocks[k].qs[j - 16] >> 4;
                float want = (float)(nib + 16 * (int)(h >> j & 1) - 16) * d;
                if (memcmp(&want, &y[32 * k + j], sizeof(float)) != 0)
                    KVF_FAIL("Q5_0 block %d value %d: %a, expected %a", k, j, (double)y[32 * k + j],
                             (double)want);
            }
        }
        for (int i = 0; i < NB * 32; i++)
            x[i] = rand_unit(&r) * (float)(1 + rep);
        kvf_quantize_row_q5_0(x, blocks, NB * 32);
        ASSERT_OK(kvf_dequant_row(KVF_GGML_Q5_0, blocks, y, NB * 32));
        /* Half a step inside the range; a whole one at its positive end, where the value
         * opposite the one mapped to -16 would need the 32 that 5 bits lack (as Q4_0); plus 16
         * times the rounding of the step to a half (2^-11 of it). */
        for (int k = 0; k < NB; k++) {
            float step = fabsf(kvf_fp16_to_f32(blocks[k].d));
            for (int j = 0; j < 32; j++)
                ASSERT_TRUE(fabsf(y[32 * k + j] - x[32 * k + j]) <= step * (1.0f + 17 * 0x1p-11f));
        }
    }
    printf("# Q5_0: the hand-built block, 1280 random blocks and the quantizer's error\n");
}

/* Q4_1 and Q5_1 as GGML's loops read them: a block's fifth bits as one word whose bit j (j < 16)
 * moved to bit 4 by a shift left and bit j + 16 by a shift right of 12, each quant times d plus
 * m. Written apart from quant.c, in those loop shapes. */
static void ref_dequant_x1(bool five, const uint8_t *blk, float y[32])
{
    uint16_t dh, mh;
    memcpy(&dh, blk, 2);
    memcpy(&mh, blk + 2, 2);
    const float d = kvf_fp16_to_f32(dh), m = kvf_fp16_to_f32(mh);
    uint32_t qh = 0;
    if (five) memcpy(&qh, blk + 4, 4); /* little-endian host: x86 */
    const uint8_t *qs = blk + (five ? 8 : 4);
    for (int j = 0; j < 16; j++) {
        const int h0 = five ? (int)((qh >> j) << 4 & 0x10) : 0;
        const int h1 = five ? (int)((qh >> (j + 12)) & 0x10) : 0;
        y[j] = (float)((qs[j] & 0x0f) | h0) * d + m;
        y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
    }
}

/* Q4_1 and Q5_1 dequantization: a hand-built Q5_1 block from the format's definition, then
 * random blocks (every quant, fifth bit and sign of d and m; finite halves) against the loop
 * above, bit for bit; row sizes; and the quantizers' error within a step of the block's range. */
static void test_q4_1_q5_1_layout(void)
{
    struct kvf_block_q5_1 b;
    memset(&b, 0, sizeof(b));
    b.d = kvf_f32_to_fp16(0.5f);
    b.m = kvf_f32_to_fp16(-3.0f);
    b.qs[0] = 0x3f; /* value 0: low nibble 15; value 16: high nibble 3 */
    b.qh[0] = 0x01; /* value 0 takes 16 */
    b.qh[3] = 0x80; /* value 31 takes 16 */
    float out[32];
    ASSERT_OK(kvf_dequant_row(KVF_GGML_Q5_1, &b, out, 32));
    ASSERT_TRUE(out[0] == 31 * 0.5f - 3.0f && out[16] == 3 * 0.5f - 3.0f);
    ASSERT_TRUE(out[31] == 16 * 0.5f - 3.0f && out[1] == -3.0f);
    uint64_t n;
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_Q5_1, 64, &n));
    ASSERT_EQ_U64(n, 48);
    ASSERT_OK(kvf_quant_row_bytes(KVF_GGML_Q4_1, 64, &n));
    ASSERT_EQ_U64(n, 40);
    ASSERT_ERR(kvf_quant_row_bytes(KVF_GGML_Q5_1, 48, &n), -EINVAL);
    ASSERT_TRUE(kvf_ggml_type_supported(KVF_GGML_Q5_1) && kvf_ggml_type_supported(KVF_GGML_Q4_1));
    ASSERT_STREQ(kvf_ggml_type_name(KVF_GGML_Q5_1), "Q5_1");
    ASSERT_STREQ(kvf_ggml_type_name(KVF_GGML_Q4_1), "Q4_1");

    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    enum { NB = 64 };
    uint8_t raw[NB * sizeof(struct kvf_block_q5_1)];
    float y[NB * 32], want[32], x[NB * 32];
    uint32_t blocks = 0;
    for (int rep = 0; rep < 40; rep++) {
        const bool five = rep % 2 == 0;
        const uint32_t type = five ? KVF_GGML_Q5_1 : KVF_GGML_Q4_1;
        const size_t bb = five ? sizeof(struct kvf_block_q5_1) : sizeof(struct kvf_block_q4_1);
        for (size_t i = 0; i < NB * bb; i++)
            raw[i] = (uint8_t)kvf_rng_below(&r, 256);
        for (int k = 0; k < NB; k++)
            for (int h = 0; h < 2; h++) { /* no Inf or NaN d or m */
                uint16_t v;
                memcpy(&v, raw + k * bb + 2 * h, 2);
                if (v >> 10 == 31 || v >> 10 == 63) v &= 0x83ff;
                memcpy(raw + k * bb + 2 * h, &v, 2);
            }
        ASSERT_OK(kvf_dequant_row(type, raw, y, NB * 32));
        for (int k = 0; k < NB; k++, blocks++) {
            ref_dequant_x1(five, raw + k * bb, want);
            if (memcmp(want, y + 32 * k, sizeof(want)) != 0)
                KVF_FAIL("%s block %d differs from the reference", five ? "Q5_1" : "Q4_1", k);
        }
        /* The quantizer: within a step of the block's range, plus the halves' rounding. */
        for (int i = 0; i < NB * 32; i++)
            x[i] = (rand_unit(&r) + 0.5f) * (float)(1 + rep);
        if (five)
            kvf_quantize_row_q5_1(x, (void *)raw, NB * 32);
        else
            kvf_quantize_row_q4_1(x, (void *)raw, NB * 32);
        ASSERT_OK(kvf_dequant_row(type, raw, y, NB * 32));
        for (int k = 0; k < NB; k++) {
            float lo = x[32 * k], hi = x[32 * k];
            for (int j = 1; j < 32; j++)
                lo = fminf(lo, x[32 * k + j]), hi = fmaxf(hi, x[32 * k + j]);
            float step = (hi - lo) / (five ? 31.0f : 15.0f), amax = fmaxf(fabsf(lo), fabsf(hi));
            for (int j = 0; j < 32; j++)
                ASSERT_TRUE(fabsf(y[32 * k + j] - x[32 * k + j]) <= step + amax * 0x1p-9f);
        }
    }
    printf("# Q4_1, Q5_1: the hand-built block, %u random blocks and the quantizers' error\n",
           blocks);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_kq_variants_match_reference),
    KVF_CASE(test_q5_0_layout),
    KVF_CASE(test_q4_1_q5_1_layout),
    KVF_CASE(test_rmsnorm_matches_scalar),
    KVF_CASE(test_f16_rows_match_scalar),
    KVF_CASE(test_f32_variants_match_reference),
    KVF_CASE(test_q8_variants_match_reference),
    KVF_CASE(test_q8_pack_layout),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
