/* `kvfence mkmodel OUT.gguf --shape SHAPE [--type f32|q8_0|q4_k_m|q5_k_m] [--seed N]`:
 * writes a llama, qwen2 or qwen3 GGUF test model with seeded random weights and a byte-level
 * SentencePiece vocab, or the constructed "hist" model (src/gguf/mkmodel_hist.c). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"

struct mkmodel_opts {
    const char *out, *shape, *type;
    uint64_t seed;
};

/* Any base strtoull takes (0x..), never negative. */
static int parse_seed(const char *v, void *dst)
{
    char *end;
    errno = 0;
    uint64_t seed = strtoull(v, &end, 0);
    if (errno || *end || v[0] == '\0' || v[0] == '-') return -1;
    *(uint64_t *)dst = seed;
    return 0;
}

/* No environment variables: a test model is written where the command says. */
#define O(f) offsetof(struct mkmodel_opts, f)
static const struct kvf_cli_opt mkmodel_opts[] = {
    {.name = "--shape",
     .metavar = "SHAPE",
     .kind = KVF_CLI_STR,
     .off = O(shape),
     .flags = KVF_CLI_REQUIRED,
     .help = "one of the shapes below"},
    {.name = "--type",
     .metavar = "f32|q8_0|q4_k_m|q5_k_m",
     .kind = KVF_CLI_STR,
     .off = O(type),
     .def = "f32",
     .help = "the weights' type (below)"},
    {.name = "--seed",
     .metavar = "N",
     .kind = KVF_CLI_FN,
     .off = O(seed),
     .fn = parse_seed,
     .def = "1",
     .bad = "--seed takes a non-negative integer",
     .help = "the weights' stream: the same shape, type and seed always give the same file"},
};
#undef O

static const struct kvf_cli_spec mkmodel_spec = {
    .name = "mkmodel",
    .opts = mkmodel_opts,
    .n_opts = KVF_ARRAY_LEN(mkmodel_opts),
    .opts_size = sizeof(struct mkmodel_opts),
    .positional = "OUT.gguf",
    .positional_off = offsetof(struct mkmodel_opts, out),
    .positional_required = true,
    .about = "Writes a standard GGUF with seeded random weights (scaled so activations\n"
             "stay near unit size) and a byte-level SentencePiece vocab: <unk>, <s>, </s>,\n"
             "<0x00>..<0xFF>, then <extra_N> up to the vocab size.\n",
    .after = "shapes (dim/layers/heads/kv heads/ffn/vocab/context):\n"
             "  tiny      64/2/4/2/172/512/2048 (separate output.weight)\n"
             "  s15m      288/6/6/6/768/32000/2048 (output tied to token_embd)\n"
             "  smol135m  576/30/9/3/1536/49152/8192 (output tied to token_embd)\n"
             "  hist      512/1/8/8/64/1024/4096, constructed, not random (no seed): greedy\n"
             "            output repeats the word most frequent in what the token attends to,\n"
             "            from 242 lower-case English words and the digits 0-9, so a KV\n"
             "            leak shows in the text (docs/TEST_MODELS.md)\n"
             "  ktiny       256/2/4/2/512/512/2048, llama (separate output.weight)\n"
             "  qwen2-tiny  256/2/4/2/512/512/2048, qwen2: Q/K/V biases (output tied)\n"
             "  qwen3-tiny  256/2/4/2/768/512/2048, qwen3: heads of 128 (q_dim 512), Q/K\n"
             "              norms (separate output.weight)\n"
             "  rope-tiny   256/2/4/2/512/512/2048, llama with scaled RoPE: base 500000,\n"
             "              Llama 3's per-pair factors (rope_freqs.weight) and linear 2\n"
             "released models' geometry, random weights:\n"
             "  llama3.2-1b   2048/16/32/8/8192/128256/131072, llama, output tied, RoPE base\n"
             "                500000 with Llama 3's factors (32, low 1, high 4, original\n"
             "                context 8192) in rope_freqs.weight\n"
             "  qwen2.5-0.5b  896/24/14/2/4864/151936/32768, qwen2: Q/K/V biases, RoPE base\n"
             "                1000000 (output tied)\n"
             "  qwen3-0.6b    1024/28/16/8/3072/151936/40960, qwen3: heads of 128 (q_dim\n"
             "                2048), Q/K norms, RoPE base 1000000 (output tied)\n"
             "  llama3-8b     4096/32/32/8/14336/128256/8192, llama, RoPE base 500000\n"
             "                (separate output.weight); f32 is 32 GB, q4_k_m 4.9 GB\n"
             "--type q8_0 quantizes every 2-D weight whose rows are whole 32-value blocks;\n"
             "the others and all norms stay f32. --type q4_k_m mixes as llama.cpp's Q4_K_M:\n"
             "Q6_K for the output projection (the embedding when tied) and for attn_v and\n"
             "ffn_down of the first and last eighth of the layers and every third between,\n"
             "Q4_K elsewhere; rows not whole 256-value super-blocks take Q5_0 for Q4_K and\n"
             "Q8_0 for Q6_K (F16 where not whole 32-value blocks). --type q5_k_m is\n"
             "llama.cpp's Q5_K_M: the same with Q5_K for Q4_K, and Q5_1 its fallback.\n",
};

int kvf_cmd_mkmodel(int argc, char **argv)
{
    struct mkmodel_opts o = {0};
    int exit_status = 0;
    if (kvf_cli_parse(&mkmodel_spec, argc, argv, &o, &exit_status) < 0) return exit_status;
    const char *out = o.out, *shape_name = o.shape, *type_name = o.type;
    uint64_t seed = o.seed;
    const struct kvf_mkmodel_shape *shape = kvf_mkmodel_shape_by_name(shape_name);
    if (!shape) {
        fprintf(stderr, "kvfence mkmodel: unknown shape '%s' (", shape_name);
        for (size_t i = 0; (shape = kvf_mkmodel_shape_at(i)); i++)
            fprintf(stderr, "%s%s", i ? ", " : "", shape->name);
        fprintf(stderr, ")\n");
        return 2;
    }
    uint32_t type;
    if (strcmp(type_name, "f32") == 0) {
        type = KVF_GGML_F32;
    } else if (strcmp(type_name, "q8_0") == 0) {
        type = KVF_GGML_Q8_0;
    } else if (strcmp(type_name, "q4_k_m") == 0) {
        type = KVF_MKMODEL_Q4_K_M;
    } else if (strcmp(type_name, "q5_k_m") == 0) {
        type = KVF_MKMODEL_Q5_K_M;
    } else {
        fprintf(stderr, "kvfence mkmodel: unknown type '%s' (f32, q8_0, q4_k_m, q5_k_m)\n",
                type_name);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char err[256];
    int rc = kvf_mkmodel_write(out, shape, type, seed, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc < 0) {
        fprintf(stderr, "kvfence mkmodel: %s\n", err[0] ? err : kvf_strerror(rc));
        return 1;
    }
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("wrote %s: shape %s, type %s, seed %" PRIu64 " in %.2f s\n", out, shape->name, type_name,
           seed, s);
    return 0;
}
