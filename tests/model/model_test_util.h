/*
 * model_test_util.h — helpers shared by the model tests: seeded test models written with
 * mkmodel, pools with the model's geometry, sequences with page tables, and a naive
 * double-precision reference forward to check the engine against.
 */
#ifndef KVF_MODEL_TEST_UTIL_H
#define KVF_MODEL_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvf_test.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"
#include "model/model_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* F16C from CPUID leaf 1 (ECX bit 29), asked directly: clang's __builtin_cpu_supports does not
 * know the "f16c" feature name. */
static inline bool test_cpu_f16c(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
#else
    return false;
#endif
}

struct tmodel {
    char dir[64];
    char path[128];
    kvf_gguf_t *g;
    kvf_model_t *m;
};

/* Writes shape/type/seed with mkmodel into a fresh temp dir and loads it. */
static inline void tmodel_open(struct tmodel *t, const char *shape, uint32_t type, uint64_t seed)
{
    char err[256] = "";
    snprintf(t->dir, sizeof(t->dir), "/tmp/kvf_model_XXXXXX");
    ASSERT_NOT_NULL(mkdtemp(t->dir));
    snprintf(t->path, sizeof(t->path), "%s/m.gguf", t->dir);
    const struct kvf_mkmodel_shape *sh = kvf_mkmodel_shape_by_name(shape);
    ASSERT_NOT_NULL(sh);
    int rc = kvf_mkmodel_write(t->path, sh, type, seed, err, sizeof(err));
    if (rc < 0) KVF_FAIL("mkmodel: %s", err);
    rc = kvf_gguf_open(t->path, &t->g, err, sizeof(err));
    if (rc < 0) KVF_FAIL("gguf open: %s", err);
    rc = kvf_model_load(t->g, &t->m, err, sizeof(err));
    if (rc < 0) KVF_FAIL("model load: %s", err);
}

static inline void tmodel_close(struct tmodel *t)
{
    kvf_model_free(t->m);
    kvf_gguf_close(t->g);
    unlink(t->path);
    rmdir(t->dir);
}

/* Replaces every occurrence of `from` in the file at path by `to` (the same length). */
static inline void patch_file(const char *path, const char *from, const char *to)
{
    FILE *fp = fopen(path, "r+b");
    ASSERT_NOT_NULL(fp);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    char *buf = malloc((size_t)len);
    rewind(fp);
    ASSERT_EQ_U64(fread(buf, 1, (size_t)len, fp), (uint64_t)len);
    size_t n = strlen(from);
    for (long i = 0; i + (long)n <= len; i++)
        if (memcmp(buf + i, from, n) == 0) memcpy(buf + i, to, n);
    rewind(fp);
    ASSERT_EQ_U64(fwrite(buf, 1, (size_t)len, fp), (uint64_t)len);
    fclose(fp);
    free(buf);
}

/* Bytes per K/V element of the pools tpool_create makes: 4 (floats) unless a test sets 2
 * (IEEE halves). */
static uint32_t tpool_kv_bytes = 4;

static inline kvf_pool_t *tpool_create(const kvf_model_t *m, uint32_t page_tokens, uint32_t n_pages,
                                       bool poison)
{
    struct kvf_pool_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    kvf_model_geometry(m, page_tokens, &cfg.geo);
    cfg.geo.elem_bytes = tpool_kv_bytes;
    cfg.n_pages = n_pages;
    cfg.max_peers = 1;
    cfg.tag_seed = 1000;
    cfg.poison_on_free = poison;
    kvf_pool_t *p = NULL;
    ASSERT_OK(kvf_pool_create(&cfg, &p));
    return p;
}

#define TSEQ_MAX_PAGES 256

/* One sequence: its page table and how many tokens its pages hold. */
struct tseq {
    struct kvf_page_ref pages[TSEQ_MAX_PAGES];
    uint32_t n_pages;
    uint32_t pos;
    kvf_req_id_t req;
};

/* Allocates n pages for request `req` and fills their data with NaN, so that reading any slot
 * that was not written turns the output to NaN. */
static inline void tseq_alloc(kvf_pool_t *pool, struct tseq *s, uint32_t n, uint64_t req)
{
    struct kvf_owner own = {{req, 0}, (uint32_t)req};
    memset(s, 0, sizeof(*s));
    ASSERT_LE_INT(n, TSEQ_MAX_PAGES);
    ASSERT_OK(kvf_pool_alloc(pool, &own, KVF_HOLDER_SEQ, n, false, s->pages));
    s->n_pages = n;
    s->req = own.req;
    size_t bytes = kvf_geo_data_bytes(kvf_pool_geometry(pool));
    for (uint32_t i = 0; i < n; i++) {
        float *d = kvf_pool_page_data(pool, s->pages[i].page);
        for (size_t k = 0; k < bytes / 4; k++)
            d[k] = NAN;
    }
}

static inline void tseq_release(kvf_pool_t *pool, struct tseq *s)
{
    for (uint32_t i = 0; i < s->n_pages; i++)
        ASSERT_OK(kvf_pool_release(pool, s->pages[i], KVF_HOLDER_SEQ, 0));
    s->n_pages = 0;
}

static inline struct kvf_fwd_seq tseq_step(struct tseq *s, const int32_t *toks, uint32_t n,
                                           float *logits)
{
    struct kvf_fwd_seq f = {s->req, toks, n, s->pos, s->pages, s->n_pages, logits, 1};
    return f;
}

static inline kvf_fwd_t *tfwd_create(const kvf_model_t *m, uint32_t threads, uint32_t max_tokens,
                                     uint32_t max_seqs)
{
    struct kvf_fwd_config c = {threads, max_tokens, max_seqs, NULL, 0};
    kvf_fwd_t *f = NULL;
    ASSERT_OK(kvf_fwd_create(m, &c, &f));
    return f;
}

/* The relative error of a against the reference b, norm-wise: ‖a − b‖₂ / ‖b‖₂ (NaN anywhere
 * gives +inf). *max_rel gets the element-wise view, max |a − b| / max |b|. */
static inline double rel_err(const float *a, const double *b, size_t n, double *max_rel)
{
    double md = 0.0, mb = 0.0, sd = 0.0, sb = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > md) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
        sd += d * d;
        sb += b[i] * b[i];
    }
    if (max_rel) *max_rel = md / (mb > 0 ? mb : 1.0);
    return sqrt(sd) / (sb > 0 ? sqrt(sb) : 1.0);
}

/* --- The reference: the model's math in double, with no cache, no pages and no threads. --- */

/* y[t][r] = Σ_i W[r][i] x[t][i] for n tokens, W dequantized one row at a time. */
static inline void ref_matmul(const struct kvf_weight *W, const double *x, uint32_t n, double *y)
{
    float *row = malloc(W->cols * sizeof(float));
    for (uint32_t r = 0; r < W->rows; r++) {
        ASSERT_OK(kvf_dequant_row(W->type, (const uint8_t *)W->data + (size_t)r * W->row_bytes, row,
                                  W->cols));
        for (uint32_t t = 0; t < n; t++) {
            double s = 0.0;
            const double *xt = x + (size_t)t * W->cols;
            for (uint32_t i = 0; i < W->cols; i++)
                s += (double)row[i] * xt[i];
            y[(size_t)t * W->rows + r] = s;
        }
    }
    free(row);
}

static inline void ref_rmsnorm(double *out, const double *x, const float *w, uint32_t n, double eps)
{
    double ss = 0.0;
    for (uint32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++)
        out[i] = x[i] * sc * w[i];
}

/* RoPE on each head: pair i is elements (2i, 2i+1) (llama), or (i, i + hd/2) with halves
 * (qwen2, qwen3: GGML's "neox" mode), rotated by pos × scale × base^(-2i/hd) / factor_i, where
 * scale is 1 / the linear scaling factor and factor_i the file's rope_freqs.weight (both 1 when
 * the file has none), as llama.cpp applies them. */
static inline void ref_rope(double *v, uint32_t pos, uint32_t n_heads, const kvf_model_t *m)
{
    const struct kvf_model_hparams *hp = &m->hp;
    uint32_t hd = hp->head_dim;
    bool halves = hp->rope_halves;
    for (uint32_t h = 0; h < n_heads; h++)
        for (uint32_t i = 0; i < hd / 2; i++) {
            double ang =
                pos * (double)hp->rope_pos_scale * pow((double)hp->rope_base, -2.0 * i / hd);
            if (m->rope_factors) ang /= m->rope_factors[i];
            double c = cos(ang), s = sin(ang);
            double *p0 = v + (size_t)h * hd + (halves ? i : 2 * i);
            double *p1 = halves ? p0 + hd / 2 : p0 + 1, a = *p0, b = *p1;
            *p0 = a * c - b * s;
            *p1 = a * s + b * c;
        }
}

/* The per-head parts of the attention block: a bias on each projection (qwen2), then each
 * head RMS-normed (qwen3). */
static inline void ref_bias(double *y, const float *b, uint32_t n, uint32_t width)
{
    if (!b) return;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < width; i++)
            y[(size_t)t * width + i] += b[i];
}

static inline void ref_head_norm(double *y, const float *w, uint32_t n_heads, uint32_t hd,
                                 double eps)
{
    if (!w) return;
    for (uint32_t h = 0; h < n_heads; h++)
        ref_rmsnorm(y + (size_t)h * hd, y + (size_t)h * hd, w, hd, eps);
}

/* Logits of every position of toks[0..n) into out (n × n_vocab). */
static inline void ref_forward(const kvf_model_t *m, const int32_t *toks, uint32_t n, double *out)
{
    const struct kvf_model_hparams *hp = &m->hp;
    uint32_t D = hp->dim, hd = hp->head_dim, H = hp->n_heads, KV = hp->n_kv_heads, F = hp->ffn_dim;
    uint32_t QD = H * hd, KD = KV * hd;
    double *x = calloc((size_t)n * D, 8), *xb = calloc((size_t)n * D, 8);
    double *q = calloc((size_t)n * QD, 8), *k = calloc((size_t)n * KD, 8),
           *v = calloc((size_t)n * KD, 8);
    double *att = calloc((size_t)n * QD, 8), *o = calloc((size_t)n * D, 8), *sc = calloc(n, 8);
    double *g = calloc((size_t)n * F, 8), *u = calloc((size_t)n * F, 8);
    float *row = malloc(D * sizeof(float));
    for (uint32_t t = 0; t < n; t++) {
        ASSERT_OK(kvf_dequant_row(
            m->tok_embd.type,
            (const uint8_t *)m->tok_embd.data + (size_t)toks[t] * m->tok_embd.row_bytes, row, D));
        for (uint32_t i = 0; i < D; i++)
            x[(size_t)t * D + i] = row[i];
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const struct kvf_layer *L = &m->layers[l];
        for (uint32_t t = 0; t < n; t++)
            ref_rmsnorm(xb + (size_t)t * D, x + (size_t)t * D, L->attn_norm, D, hp->rms_eps);
        ref_matmul(&L->wq, xb, n, q);
        ref_matmul(&L->wk, xb, n, k);
        ref_matmul(&L->wv, xb, n, v);
        ref_bias(q, L->bq, n, QD);
        ref_bias(k, L->bk, n, KD);
        ref_bias(v, L->bv, n, KD);
        for (uint32_t t = 0; t < n; t++) {
            ref_head_norm(q + (size_t)t * QD, L->q_norm, H, hd, hp->rms_eps);
            ref_head_norm(k + (size_t)t * KD, L->k_norm, KV, hd, hp->rms_eps);
            ref_rope(q + (size_t)t * QD, t, H, m);
            ref_rope(k + (size_t)t * KD, t, KV, m);
        }
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t h = 0; h < H; h++) {
                uint32_t kh = h / (H / KV);
                double mx = -INFINITY, sum = 0.0;
                for (uint32_t p = 0; p <= t; p++) {
                    double d = 0.0;
                    for (uint32_t e = 0; e < hd; e++)
                        d += q[(size_t)t * QD + h * hd + e] * k[(size_t)p * KD + kh * hd + e];
                    sc[p] = d / sqrt((double)hd);
                    if (sc[p] > mx) mx = sc[p];
                }
                for (uint32_t p = 0; p <= t; p++)
                    sum += (sc[p] = exp(sc[p] - mx));
                for (uint32_t e = 0; e < hd; e++) {
                    double a = 0.0;
                    for (uint32_t p = 0; p <= t; p++)
                        a += sc[p] / sum * v[(size_t)p * KD + kh * hd + e];
                    att[(size_t)t * QD + h * hd + e] = a;
                }
            }
        ref_matmul(&L->wo, att, n, o);
        for (size_t i = 0; i < (size_t)n * D; i++)
            x[i] += o[i];
        for (uint32_t t = 0; t < n; t++)
            ref_rmsnorm(xb + (size_t)t * D, x + (size_t)t * D, L->ffn_norm, D, hp->rms_eps);
        ref_matmul(&L->w_gate, xb, n, g);
        ref_matmul(&L->w_up, xb, n, u);
        for (size_t i = 0; i < (size_t)n * F; i++)
            g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        ref_matmul(&L->w_down, g, n, o);
        for (size_t i = 0; i < (size_t)n * D; i++)
            x[i] += o[i];
    }
    for (uint32_t t = 0; t < n; t++)
        ref_rmsnorm(xb + (size_t)t * D, x + (size_t)t * D, m->out_norm, D, hp->rms_eps);
    ref_matmul(&m->output, xb, n, out);
    free(x);
    free(xb);
    free(q);
    free(k);
    free(v);
    free(att);
    free(o);
    free(sc);
    free(g);
    free(u);
    free(row);
}

/* n seeded token ids in [3, n_vocab) (past <unk>, <s>, </s>). */
static inline void rand_tokens(struct kvf_rng *r, int32_t *t, uint32_t n, uint32_t n_vocab)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = 3 + (int32_t)(kvf_rng_next(r) % (n_vocab - 3));
}

#endif
