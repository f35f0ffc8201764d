/*
 * test_attention.c — the attention and SwiGLU kernels on their own: the polynomial exp against
 * double exp, the vector exp and SwiGLU against their scalar forms bit for bit (wherever a range
 * starts), and attention over real pool pages against a double reference, with every kernel
 * variant this machine runs, across page boundaries, at pos 0, with GQA groups, and bit-identical
 * however the batch is made up and chunked.
 */
#include "model/attention.h"
#include "model/kernels.h"
#include "model_test_util.h"

/* Whether the "avx2+vnni" kernels can run here: the chooser took them. */
static bool have_vnni(void)
{
    kvf__kernels_init();
    return kvf__kern_vnni && kvf__kern == kvf__kern_vnni;
}

/* Whether the AVX2 kernels can run here: the variant chooser took an x86 variant (so with
 * KVF_KERNELS=scalar only the scalar kernels are tested). */
static bool have_avx2(void)
{
    kvf__kernels_init();
    return kvf__kern != &kvf__kern_scalar;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Same bits, or both NaN (a NaN's payload may come from either operand of the op that made it). */
static bool same(float a, float b)
{
    return f2u(a) == f2u(b) || (isnan(a) && isnan(b));
}

static float rand_float(struct kvf_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((kvf_rng_next(r) >> 40) * 0x1p-24);
}

/* Distance in ulps between float a and the exact value x (at a's magnitude). */
static double ulps(float a, double x)
{
    int e;
    frexp(x, &e);
    double ulp = ldexp(1.0, (e - 24 > -149 ? e - 24 : -149));
    return fabs((double)a - x) / ulp;
}

/* kvf__expf within 1.5 ulp of exp over every normal result, and the edges exact. */
static void test_exp_accuracy(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    double worst = 0.0, worst_x = 0.0;
    /* A dense sweep of [-87.3, 88.7] (normal results), then random points in it. */
    for (uint32_t i = 0; i <= 4000000; i++) {
        float x =
            i < 2000000 ? -87.3f + 176.0f * (float)i / 2000000.0f : rand_float(&r, -87.3f, 88.7f);
        double u = ulps(kvf__expf(x), exp((double)x));
        if (u > worst) worst = u, worst_x = x;
    }
    printf("# exp: worst %.3f ulp at x = %.9g\n", worst, worst_x);
    ASSERT_TRUE(worst <= 1.5);
    ASSERT_TRUE(kvf__expf(0.0f) == 1.0f);
    ASSERT_TRUE(kvf__expf(-0.0f) == 1.0f);
    ASSERT_TRUE(kvf__expf(-INFINITY) == 0.0f);
    ASSERT_TRUE(kvf__expf(-200.0f) == 0.0f);
    ASSERT_TRUE(kvf__expf(INFINITY) == INFINITY);
    ASSERT_TRUE(kvf__expf(89.0f) == INFINITY);
    ASSERT_TRUE(kvf__expf(88.7f) < INFINITY && kvf__expf(88.7f) > 3.2e38f);
    ASSERT_TRUE(isnan(kvf__expf(NAN)));
    /* Results below FLT_MIN lose bits but stay close in absolute terms and never go negative. */
    for (float x = -103.0f; x < -87.3f; x += 0.01f) {
        float y = kvf__expf(x);
        ASSERT_TRUE(y >= 0.0f && fabs((double)y - exp((double)x)) <= 0x1p-149);
    }
}

/* Inputs that reach every branch of the exp: ordinary values, both zeros, huge, infinite, NaN. */
static void fill_extremes(struct kvf_rng *r, float *x, uint32_t n)
{
    static const float special[] = {0.0f,   -0.0f,   1e-30f,  -1e-30f, 88.7f,  -88.7f, 89.0f,
                                    -89.0f, 200.0f,  -200.0f, 1e30f,   -1e30f, 87.33f, -87.33f,
                                    104.0f, -104.0f, 110.0f,  -110.0f, 0.5f,   -0.5f};
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = kvf_rng_below(r, 30);
        if (k < (uint32_t)(sizeof(special) / sizeof(special[0])))
            x[i] = special[k];
        else if (k == 20)
            x[i] = INFINITY;
        else if (k == 21)
            x[i] = -INFINITY;
        else if (k == 22)
            x[i] = NAN;
        else if (k == 23)
            x[i] = -NAN;
        else
            x[i] = rand_float(r, -120.0f, 120.0f);
    }
}

/* The vector exp gives kvf__expf's bits, in vector lanes and in the scalar tail. */
static void test_exp_vector_matches(void)
{
    if (!have_avx2()) {
        printf("# no AVX2 here: nothing to compare\n");
        return;
    }
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    enum { N = 4099 };
    static float x[N], y[N];
    for (int round = 0; round < 50; round++) {
        if (round % 2)
            fill_extremes(&r, x, N);
        else
            for (uint32_t i = 0; i < N; i++)
                x[i] = rand_float(&r, -100.0f, 95.0f);
        kvf__exp_avx2(y, x, N);
        for (uint32_t i = 0; i < N; i++)
            if (!same(y[i], kvf__expf(x[i])))
                KVF_FAIL("exp(%.9g): vector %.9g, scalar %.9g", x[i], y[i], kvf__expf(x[i]));
    }
}

/* SwiGLU over [lo, hi) gives every element the same bits wherever lo is (the range bounds move
 * with the thread count), in every variant; and it is close to silu(g)·u in double. */
static void test_swiglu_ranges(void)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    enum { N = 203 };
    float g[N], u[N], want[N], got[N];
    void (*fns[3])(float *, const float *, uint32_t) = {kvf__swiglu_scalar, NULL, NULL};
    if (have_avx2()) fns[1] = kvf__swiglu_avx2;
    if (have_vnni()) fns[2] = kvf__swiglu_vnni;
    for (int round = 0; round < 40; round++) {
        if (round % 2)
            fill_extremes(&r, g, N);
        else
            for (uint32_t i = 0; i < N; i++)
                g[i] = rand_float(&r, -20.0f, 20.0f);
        for (uint32_t i = 0; i < N; i++)
            u[i] = rand_float(&r, -3.0f, 3.0f);
        for (uint32_t i = 0; i < N; i++)
            want[i] = kvf__swiglu1(g[i], u[i]);
        for (uint32_t i = 0; i < N; i++) {
            if (!isfinite(g[i])) continue;
            double gd = g[i], ref = gd / (1.0 + exp(-gd)) * u[i];
            if (!(fabs(want[i] - ref) <= 1e-6 * fabs(ref) + 1e-35))
                KVF_FAIL("silu(%.9g) * %.9g = %.9g, want %.9g", g[i], u[i], want[i], ref);
        }
        for (int f = 0; f < 3; f++) {
            if (!fns[f]) continue;
            for (uint32_t lo = 0; lo < 17; lo++) {
                uint32_t hi = N - kvf_rng_below(&r, 9);
                memcpy(got, g, sizeof(got));
                fns[f](got + lo, u + lo, hi - lo);
                for (uint32_t i = lo; i < hi; i++)
                    if (!same(got[i], want[i]))
                        KVF_FAIL("swiglu variant %d, range from %u: element %u (g %.9g) gives "
                                 "%.9g, want %.9g",
                                 f, lo, i, g[i], got[i], want[i]);
            }
        }
    }
}

/* --- Attention over pool pages. ----------------------------------------------------------- */

_Static_assert(KVF_ATTN_BLOCK == 4, "check_attention's tokens 16-19 are meant as one work item");

struct ashape {
    uint32_t n_kv, group, hd, page_tokens, n_pos; /* n_pos: positions written in the pages */
};

/* out (n_heads · hd) for one token at pos, in double, from the K/V rows as written. */
static void attn_ref(const struct kvf_attn_batch *b, const struct kvf_fwd_seq *s, uint32_t pos,
                     const float *q, double *out)
{
    uint32_t hd = b->head_dim, group = b->n_heads / b->n_kv_heads, eb = b->elem_bytes;
    const void *rows[1];
    double *sc = malloc((pos + 1) * sizeof(double));
    for (uint32_t h = 0; h < b->n_heads; h++) {
        double mx = -INFINITY, sum = 0.0;
        for (uint32_t p = 0; p <= pos; p++) {
            kvf__attn_rows(b, s, b->k_off, h / group, p, 1, rows);
            double d = 0.0;
            for (uint32_t e = 0; e < hd; e++)
                d += (double)q[h * hd + e] * kvf__kv_elem(rows[0], e, eb);
            sc[p] = d / sqrt((double)hd);
            if (sc[p] > mx) mx = sc[p];
        }
        for (uint32_t p = 0; p <= pos; p++)
            sum += sc[p] = exp(sc[p] - mx);
        for (uint32_t e = 0; e < hd; e++)
            out[h * hd + e] = 0.0;
        for (uint32_t p = 0; p <= pos; p++) {
            kvf__attn_rows(b, s, b->v_off, h / group, p, 1, rows);
            for (uint32_t e = 0; e < hd; e++)
                out[h * hd + e] += sc[p] / sum * kvf__kv_elem(rows[0], e, eb);
        }
    }
    free(sc);
}

/* keep, when set, receives both layers' outputs (2 · 24 tokens · n_heads · hd floats). */
static void check_attention(const struct ashape *sh, const struct kvf_kern *kern, uint64_t seed,
                            uint32_t eb, float *keep)
{
    struct kvf_rng r;
    kvf_rng_seed(&r, seed);
    uint32_t n_heads = sh->n_kv * sh->group, hd = sh->hd, pt = sh->page_tokens;
    uint32_t n_pages = (sh->n_pos + pt - 1) / pt;
    struct kvf_pool_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.geo = (struct kvf_pool_geometry){2, sh->n_kv, hd, pt, eb};
    cfg.n_pages = n_pages + 3;
    cfg.max_peers = 1;
    cfg.tag_seed = 77;
    kvf_pool_t *pool = NULL;
    ASSERT_OK(kvf_pool_create(&cfg, &pool));
    /* Pages are taken in a shuffled order, so that neighbours in the table are not neighbours
     * in memory; slots past n_pos stay NaN (tseq_alloc), so reading one would show. */
    struct tseq *ts = malloc(sizeof(*ts));
    struct tseq *spare = malloc(sizeof(*spare));
    tseq_alloc(pool, spare, 3, 900);
    tseq_alloc(pool, ts, n_pages, 901);
    tseq_release(pool, spare);
    for (uint32_t i = n_pages; i > 1; i--) {
        uint32_t k = kvf_rng_below(&r, i);
        struct kvf_page_ref tmp = ts->pages[i - 1];
        ts->pages[i - 1] = ts->pages[k];
        ts->pages[k] = tmp;
    }
    struct kvf_fwd_seq seq = tseq_step(ts, NULL, 1, NULL);
    uint8_t *base = kvf_pool_data(pool, &(size_t){0});
    size_t page_bytes = kvf_pool_page_bytes(pool);
    size_t row = (size_t)sh->n_kv * hd;
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t p = 0; p < sh->n_pos; p++)
            for (int kv = 0; kv < 2; kv++) {
                uint8_t *d = base + (size_t)ts->pages[p / pt].page * page_bytes +
                             kvf_geo_kv_offset(&cfg.geo, l, kv) + (p % pt) * row * eb;
                /* Spread scores, so that softmax has both peaked and flat rows. */
                for (size_t e = 0; e < row; e++) {
                    float v = rand_float(&r, -1.5f, 1.5f);
                    if (eb == 2)
                        ((uint16_t *)d)[e] = kvf_f32_to_fp16(v);
                    else
                        ((float *)d)[e] = v;
                }
            }

    /* Tokens: pos 0, the ends and starts of pages and segments, the last position, runs of
     * consecutive positions, and random ones. */
    enum { NT = 24 };
    uint32_t tok_pos[NT], tok_seq[NT] = {0};
    for (uint32_t t = 0; t < NT; t++) {
        uint32_t want[] = {0,
                           1,
                           pt - 1,
                           pt,
                           pt + 1,
                           2 * pt - 1,
                           2 * pt,
                           sh->n_pos - 1,
                           7,
                           8,
                           9,
                           KVF_ATTN_SEG - 1,
                           KVF_ATTN_SEG,
                           KVF_ATTN_SEG + 1,
                           2 * KVF_ATTN_SEG};
        tok_pos[t] = t < 15 ? want[t] : kvf_rng_below(&r, sh->n_pos);
        /* Tokens 16-19, one work item of KVF_ATTN_BLOCK prefill tokens: consecutive positions
         * across the first segment boundary, so the item's later tokens have a segment its
         * first two lack. */
        if (t >= 16 && t < 20) tok_pos[t] = KVF_ATTN_SEG - 2 + (t - 16);
        if (tok_pos[t] >= sh->n_pos) tok_pos[t] = sh->n_pos - 1;
    }
    size_t q_dim = (size_t)n_heads * hd;
    float *q = malloc(NT * q_dim * sizeof(float));
    for (size_t i = 0; i < NT * q_dim; i++)
        q[i] = rand_float(&r, -1.5f, 1.5f);
    size_t sf = kvf__attn_scratch_floats(sh->n_pos, n_heads, hd);
    float *scratch = malloc(3 * sf * sizeof(float));
    float *part = malloc(kvf__attn_part_floats(sh->n_pos, n_heads, hd, NT, 64) * sizeof(float));
    float *outs[5];
    double *ref = malloc(q_dim * sizeof(double));
    const struct kvf_kern *saved = kvf__kern;
    kvf__kern = kern;
    for (int layer = 0; layer < 2; layer++) {
        struct kvf_attn_batch b = {
            .nt = NT,
            .n_heads = n_heads,
            .n_kv_heads = sh->n_kv,
            .head_dim = hd,
            .q = q,
            .tok_seq = tok_seq,
            .tok_pos = tok_pos,
            .seqs = &seq,
            .pool_base = base,
            .page_bytes = page_bytes,
            .page_tokens = pt,
            .k_off = kvf_geo_kv_offset(&cfg.geo, layer, 0),
            .v_off = kvf_geo_kv_offset(&cfg.geo, layer, 1),
            .elem_bytes = eb,
            .scratch = scratch,
            .scratch_floats = sf,
            .part = part,
        };
        /* Five ways to cut the same work: the whole batch as one chunk and in 7 chunks on
         * "threads" 0-2 (whole tokens per item), in 16 chunks ((token, K/V group) items), each
         * token alone in 8 chunks and the whole batch in 64 (split into segments, combined by
         * finish). */
        for (int way = 0; way < 5; way++) {
            outs[way] = malloc(NT * q_dim * sizeof(float));
            for (size_t i = 0; i < NT * q_dim; i++)
                outs[way][i] = NAN;
            b.out = outs[way];
            if (way == 0) kvf__attn_chunk(&b, 0, 1, 0);
            if (way == 1)
                for (uint32_t c = 0; c < 7; c++)
                    kvf__attn_chunk(&b, c, 7, c % 3);
            if (way == 2)
                for (uint32_t t = 0; t < NT; t++) {
                    struct kvf_attn_batch one = b;
                    one.nt = 1;
                    one.q = q + t * q_dim;
                    one.out = outs[way] + t * q_dim;
                    one.tok_pos = tok_pos + t;
                    for (uint32_t c = 0; c < 8; c++)
                        kvf__attn_chunk(&one, c, 8, (c + t) % 3);
                    kvf__attn_finish(&one, 8);
                }
            if (way == 3) {
                for (uint32_t c = 0; c < 64; c++)
                    kvf__attn_chunk(&b, c, 64, c % 3);
                kvf__attn_finish(&b, 64);
            }
            if (way == 4) {
                for (uint32_t c = 0; c < 16; c++)
                    kvf__attn_chunk(&b, c, 16, c % 3);
                kvf__attn_finish(&b, 16);
            }
        }
        for (int way = 1; way < 5; way++)
            ASSERT_MEMEQ(outs[0], outs[way], NT * q_dim * sizeof(float));
        /* A decode token's kernel, every K/V group at once (attn_tok), against one group at a
         * time (attn_seg): the same partial for every head and segment, bit for bit. */
        size_t ps = kvf__attn_part_size(hd);
        float *pa = malloc(n_heads * ps * sizeof(float)),
              *pb = malloc(n_heads * ps * sizeof(float));
        for (uint32_t t = 0; t < NT; t++)
            for (uint32_t seg = 0; seg <= tok_pos[t] / KVF_ATTN_SEG; seg++) {
                for (size_t i = 0; i < n_heads * ps; i++)
                    pa[i] = pb[i] = NAN;
                for (uint32_t h = 0; h < n_heads; h += sh->group)
                    kern->attn_seg(&b, t, h, h + sh->group, seg, pa + h * ps, ps, scratch, NULL);
                kern->attn_tok(&b, t, seg, pb, ps, scratch, NULL);
                ASSERT_MEMEQ(pa, pb, n_heads * ps * sizeof(float));
            }
        free(pa);
        free(pb);
        if (keep) memcpy(keep + (size_t)layer * NT * q_dim, outs[0], NT * q_dim * sizeof(float));
        for (uint32_t t = 0; t < NT; t++) {
            attn_ref(&b, &seq, tok_pos[t], q + t * q_dim, ref);
            double mr, e = rel_err(outs[0] + t * q_dim, ref, q_dim, &mr);
            if (!(e <= 2e-6))
                KVF_FAIL("%s, K/V of %u bytes: token at pos %u: relative error %g", kern->name, eb,
                         tok_pos[t], e);
        }
        for (int way = 0; way < 5; way++)
            free(outs[way]);
    }
    kvf__kern = saved;
    free(ref);
    free(part);
    free(scratch);
    free(q);
    tseq_release(pool, ts);
    free(ts);
    free(spare);
    kvf_pool_destroy(pool);
}

static void test_attention_reference(void)
{
    static const struct ashape shapes[] = {
        {2, 2, 16, 5, 40},   /* the tiny test model's heads, small pages, one segment */
        {3, 3, 64, 16, 450}, /* smol135m's heads, four segments */
        {6, 1, 48, 16, 300}, /* s15m's: no GQA */
        {1, 4, 24, 7, 200},  /* head_dim 3 vectors, one K/V head */
        {2, 2, 12, 3, 260},  /* head_dim not a multiple of 8: the scalar path everywhere */
        {1, 2, 136, 9, 140}, /* head_dim 17 vectors: two column blocks in the V sum */
    };
    const struct kvf_kern *vars[3] = {&kvf__kern_scalar, have_avx2() ? kvf__kern_avx2 : NULL,
                                      have_vnni() ? kvf__kern_vnni : NULL};
    /* K/V as floats and as IEEE halves (the reference reads the same halves). The VNNI
     * variant, which takes up to three heads of a group at a time, must give the AVX2
     * variant's outputs bit for bit: groups of 1-4 heads (4 = three, then one). */
    for (uint32_t eb = 4; eb >= 2; eb -= 2)
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            const struct ashape *sh = &shapes[i];
            size_t n = 2 * 24 * (size_t)sh->n_kv * sh->group * sh->hd;
            float *out[3] = {NULL, malloc(n * sizeof(float)), malloc(n * sizeof(float))};
            for (int v = 0; v < 3; v++)
                if (vars[v]) check_attention(sh, vars[v], kvf_test_seed() + i, eb, out[v]);
            if (vars[2]) ASSERT_MEMEQ(out[1], out[2], n * sizeof(float));
            free(out[1]);
            free(out[2]);
        }
    printf("# attention variants checked: scalar%s%s\n", vars[1] ? ", avx2" : "",
           vars[2] ? ", avx2+vnni (= avx2 bit for bit)" : "");
}

/* --- Through the forward pass. ---------------------------------------------------------- */

#define LONG_N 300

/* Logits of every position of toks, one token per call, on `threads` threads: with several
 * threads a single token is split into (group, segment) items, with one it is not. */
static void run_steps(const kvf_model_t *m, const int32_t *toks, uint32_t threads, float *logits)
{
    uint32_t V = kvf_model_hparams(m)->n_vocab;
    kvf_pool_t *pool = tpool_create(m, 16, (LONG_N + 15) / 16, false);
    kvf_fwd_t *f = tfwd_create(m, threads, 1, 1);
    struct tseq *s = malloc(sizeof(*s));
    tseq_alloc(pool, s, (LONG_N + 15) / 16, 1);
    for (uint32_t i = 0; i < LONG_N; i++) {
        struct kvf_fwd_seq fs = tseq_step(s, toks + i, 1, logits + (size_t)i * V);
        ASSERT_EQ_INT(kvf_fwd_run(f, pool, &fs, 1), 1);
        ASSERT_EQ_INT(fs.status, 0);
        s->pos++;
    }
    tseq_release(pool, s);
    free(s);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
}

/* A sequence longer than two segments gives the same logits at every position whether its
 * attention was split across threads (decode steps on 2 threads), done whole per group (1
 * thread), or done in prefill chunks of random length beside another sequence (3 threads,
 * 5-slot pages). */
static void test_long_context_invariance(void)
{
    struct tmodel tm;
    tmodel_open(&tm, "tiny", KVF_GGML_F32, 5);
    uint32_t V = kvf_model_hparams(tm.m)->n_vocab;
    struct kvf_rng r;
    kvf_rng_seed(&r, kvf_test_seed());
    static int32_t toks[2][LONG_N];
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; i < LONG_N; i++)
            toks[k][i] = (int32_t)kvf_rng_below(&r, V);
    float *split = malloc((size_t)LONG_N * V * sizeof(float));
    float *whole = malloc((size_t)LONG_N * V * sizeof(float));
    run_steps(tm.m, toks[0], 2, split);
    run_steps(tm.m, toks[0], 1, whole);
    ASSERT_MEMEQ(split, whole, (size_t)LONG_N * V * sizeof(float));

    uint32_t per = (LONG_N + 4) / 5;
    kvf_pool_t *pool = tpool_create(tm.m, 5, 2 * per, false);
    kvf_fwd_t *f = tfwd_create(tm.m, 3, 2 * 70, 2);
    struct tseq *s = calloc(2, sizeof(*s));
    float *logits = malloc(2 * (size_t)V * sizeof(float));
    tseq_alloc(pool, &s[0], per, 10);
    tseq_alloc(pool, &s[1], per, 11);
    while (s[0].pos < LONG_N) {
        struct kvf_fwd_seq fs[2];
        uint32_t k = 0;
        for (int i = 0; i < 2; i++) {
            if (s[i].pos == LONG_N) continue;
            uint32_t len = 1 + kvf_rng_below(&r, 70);
            if (len > LONG_N - s[i].pos) len = LONG_N - s[i].pos;
            fs[k++] = tseq_step(&s[i], toks[i] + s[i].pos, len, logits + (size_t)i * V);
        }
        ASSERT_EQ_INT(kvf_fwd_run(f, pool, fs, k), k);
        s[0].pos += fs[0].n_tokens; /* the main sequence is always fs[0] */
        if (k == 2) s[1].pos += fs[1].n_tokens;
        if (memcmp(logits, split + (size_t)(s[0].pos - 1) * V, V * sizeof(float)) != 0)
            KVF_FAIL("position %u differs between a prefill chunk and a split decode step",
                     s[0].pos - 1);
    }
    tseq_release(pool, &s[0]);
    tseq_release(pool, &s[1]);
    free(s);
    free(logits);
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    free(split);
    free(whole);
    tmodel_close(&tm);
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_exp_accuracy),
    KVF_CASE(test_exp_vector_matches),
    KVF_CASE(test_swiglu_ranges),
    KVF_CASE(test_attention_reference),
    KVF_CASE(test_long_context_invariance),
};

int main(int argc, char **argv)
{
    return KVF_TEST_MAIN(argc, argv, cases);
}
