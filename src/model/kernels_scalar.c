/*
 * kernels_scalar.c — the portable fallback. Each (row, token) pair is one fixed sequence of
 * operations (a sequential sum in index order for F32), so it is invariant by construction.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "attention.h"
#include "kernels.h"

static float dot_f32(const float *w, const float *x, uint32_t n)
{
    float s = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        s += w[i] * x[i];
    return s;
}

static void f32_rows(const float *w, size_t ws, const float *x, size_t ldx, uint32_t nt, uint32_t n,
                     float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t t = 0; t < nt; t++)
            y[t * ldy + r] = dot_f32(w + r * ws, x + t * ldx, n);
}

/* The packed F32 recipe of kernels.h: one fused multiply-add chain per pair, in column order. */
static void f32g_rows(const float *w, uint32_t n, const float *x, size_t ldx, uint32_t nt, float *y,
                      size_t ldy, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++) {
        const float *g = w + (size_t)(r / KVF_F32G_ROWS) * KVF_F32G_ROWS * n + r % KVF_F32G_ROWS;
        for (uint32_t t = 0; t < nt; t++) {
            const float *xt = x + t * ldx;
            float acc = 0.0f;
            for (uint32_t c = 0; c < n; c++)
                acc = fmaf(g[(size_t)c * KVF_F32G_ROWS], xt[c], acc);
            y[t * ldy + r] = acc;
        }
    }
}

/* The Q8_0 × int16 recipe of kernels.h, on the packed layout, one (row, token) pair at a time:
 * row r of group g is lane r of every block of the group. */
static float dot_q8(const struct kvf_q8g *g, uint32_t r, const int16_t *x, float xd, uint32_t nb)
{
    float acc = 0.0f;
    for (uint32_t b = 0; b < nb; b++, x += KVF_QK) {
        int32_t s = 0;
        for (uint32_t p = 0; p < KVF_QK / 2; p++)
            s += g[b].qs[32 * p + 2 * r] * x[2 * p] + g[b].qs[32 * p + 2 * r + 1] * x[2 * p + 1];
        acc = fmaf((float)s, kvf_fp16_to_f32(g[b].d[r]), acc);
    }
    return acc * xd;
}

static void q8_rows(const struct kvf_q8g *w, uint32_t nb, const int16_t *x, const float *xd,
                    size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++) {
        const struct kvf_q8g *g = w + (size_t)(r / KVF_Q8G_ROWS) * nb;
        for (uint32_t t = 0; t < nt; t++)
            y[t * ldy + r] = dot_q8(g, r % KVF_Q8G_ROWS, x + t * ldx, xd[t], nb);
    }
}

/* The Q8m recipe of kernels.h (packed Q5_1): Q8_0's integer sum times d, then the block sum of
 * the activations times m. */
static float dot_q8m(const struct kvf_q8mg *g, uint32_t r, const int16_t *x, float xd,
                     const float *xs, uint32_t nb)
{
    float acc = 0.0f;
    for (uint32_t b = 0; b < nb; b++, x += KVF_QK) {
        int32_t s = 0;
        for (uint32_t p = 0; p < KVF_QK / 2; p++)
            s += g[b].qs[32 * p + 2 * r] * x[2 * p] + g[b].qs[32 * p + 2 * r + 1] * x[2 * p + 1];
        acc = fmaf((float)s, kvf_fp16_to_f32(g[b].d[r]), acc);
        acc = fmaf(xs[b], kvf_fp16_to_f32(g[b].m[r]), acc);
    }
    return acc * xd;
}

static void q8m_rows(const struct kvf_q8mg *w, uint32_t nb, const int16_t *x, const float *xd,
                     const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                     uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++) {
        const struct kvf_q8mg *g = w + (size_t)(r / KVF_Q8G_ROWS) * nb;
        for (uint32_t t = 0; t < nt; t++)
            y[t * ldy + r] =
                dot_q8m(g, r % KVF_Q8G_ROWS, x + t * ldx, xd[t], xs + t * (ldx / KVF_QK), nb);
    }
}

/* The Q4 recipe of kernels.h for row r (lane r of its group) and one token; five: the quants
 * have their fifth bits in the words at qh (struct kvf_q5g), block b at w + b · block_bytes. */
static float dot_q45(const uint8_t *w, size_t block_bytes, bool five, uint32_t r, const int16_t *x,
                     float xd, const float *xs, uint32_t nb)
{
    float acc = 0.0f;
    for (uint32_t b = 0; b < nb; b++, x += KVF_QK) {
        const struct kvf_q5g *g = (const struct kvf_q5g *)(w + b * block_bytes);
        int32_t s = 0;
        for (uint32_t p = 0; p < 8; p++)
            for (uint32_t k = 0; k < 2; k++) {
                uint32_t lane = 2 * r + k;
                uint8_t byte = g->qs[32 * p + lane];
                int lo = byte & 15, hi = byte >> 4;
                if (five) {
                    lo |= (int)(g->qh[2 * p] >> lane & 1) << 4;
                    hi |= (int)(g->qh[2 * p + 1] >> lane & 1) << 4;
                }
                s += lo * x[2 * p + k] + hi * x[16 + 2 * p + k];
            }
        acc = fmaf((float)s, g->a[r], acc);
        acc = fmaf(xs[b], g->b[r], acc);
    }
    return acc * xd;
}

static void q45_rows(const uint8_t *w, size_t block_bytes, bool five, uint32_t nb, const int16_t *x,
                     const float *xd, const float *xs, size_t ldx, uint32_t nt, float *y,
                     size_t ldy, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *g = w + (size_t)(r / KVF_Q8G_ROWS) * nb * block_bytes;
        for (uint32_t t = 0; t < nt; t++)
            y[t * ldy + r] = dot_q45(g, block_bytes, five, r % KVF_Q8G_ROWS, x + t * ldx, xd[t],
                                     xs + t * (ldx / KVF_QK), nb);
    }
}

static void q4_rows(const struct kvf_q4g *w, uint32_t nb, const int16_t *x, const float *xd,
                    const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                    uint32_t r1)
{
    q45_rows((const uint8_t *)w, sizeof(*w), false, nb, x, xd, xs, ldx, nt, y, ldy, r0, r1);
}

static void q5_rows(const struct kvf_q5g *w, uint32_t nb, const int16_t *x, const float *xd,
                    const float *xs, size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0,
                    uint32_t r1)
{
    q45_rows((const uint8_t *)w, sizeof(*w), true, nb, x, xd, xs, ldx, nt, y, ldy, r0, r1);
}

/* The Q6 recipe of kernels.h. */
static float dot_q6(const struct kvf_q6g *g, uint32_t r, const int16_t *x, float xd, uint32_t nb)
{
    float acc = 0.0f;
    for (uint32_t b = 0; b < nb; b++, x += KVF_QK) {
        int32_t s[2] = {0, 0};
        for (uint32_t p = 0; p < KVF_QK / 2; p++)
            s[p / 8] +=
                g[b].qs[32 * p + 2 * r] * x[2 * p] + g[b].qs[32 * p + 2 * r + 1] * x[2 * p + 1];
        acc = fmaf((float)s[0], g[b].a[0][r], acc);
        acc = fmaf((float)s[1], g[b].a[1][r], acc);
    }
    return acc * xd;
}

static void q6_rows(const struct kvf_q6g *w, uint32_t nb, const int16_t *x, const float *xd,
                    size_t ldx, uint32_t nt, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++) {
        const struct kvf_q6g *g = w + (size_t)(r / KVF_Q8G_ROWS) * nb;
        for (uint32_t t = 0; t < nt; t++)
            y[t * ldy + r] = dot_q6(g, r % KVF_Q8G_ROWS, x + t * ldx, xd[t], nb);
    }
}

static void f16_row(const float *x, uint16_t *h, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        h[i] = kvf_f32_to_fp16(x[i]);
}

/* The reference activation quantizer (struct kvf_act16 in kernels.h); the vector ones match
 * its bytes. The clamp never acts on finite rows (|x · (1 / d)| ≤ 32767 + a few ulps, which
 * rounds to 32767) and mirrors the saturating packs of the vector form. */
static void quant_a16(const float *x, int16_t *q, float *d, float *s, uint32_t n)
{
    float amax = 0.0f;
    bool finite = true;
    for (uint32_t i = 0; i < n; i++) {
        finite &= isfinite(x[i]) != 0;
        amax = fmaxf(amax, fabsf(x[i]));
    }
    float dd = amax / 32767.0f;
    if (!finite || dd < FLT_MIN) {
        *d = finite ? 0.0f : NAN;
        memset(q, 0, n * sizeof(int16_t));
        memset(s, 0, n / KVF_QK * sizeof(float));
        return;
    }
    float id = 1.0f / dd;
    *d = dd;
    for (uint32_t i = 0; i < n; i++) {
        long v = lrintf(x[i] * id);
        q[i] = (int16_t)(v > 32767 ? 32767 : v < -32768 ? -32768 : v);
    }
    for (uint32_t b = 0; b < n / KVF_QK; b++) {
        int32_t sum = 0;
        for (uint32_t i = 0; i < KVF_QK; i++)
            sum += q[KVF_QK * b + i];
        s[b] = (float)sum;
    }
}

const struct kvf_kern kvf__kern_scalar = {
    .name = "scalar",
    .f32_rows = f32_rows,
    .f32g_rows = f32g_rows,
    .q8_rows = q8_rows,
    .q4_rows = q4_rows,
    .q5_rows = q5_rows,
    .q6_rows = q6_rows,
    .q8m_rows = q8m_rows,
    .f16_row = f16_row,
    .quant_a16 = quant_a16,
    .attn_seg = kvf__attn_seg_scalar,
    .attn_tok = kvf__attn_tok_scalar,
    .attn_segs = kvf__attn_segs_scalar,
    .rmsnorm = kvf__rmsnorm_scalar,
    .swiglu = kvf__swiglu_scalar,
};
