/* `kvfence run`: generates a completion from a GGUF model on the command line, without a
 * server — the same forward pass over pool pages that the workers run, for one request. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"
#include "kvfence/text.h"

/* Prompt tokens go through the forward pass in chunks of at most this many. */
#define RUN_CHUNK 256u
#define RUN_PAGE_TOKENS 16u

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvfence run --model F.gguf --prompt TEXT [--max-tokens N] [--temperature T]\n"
            "                   [--top-k K] [--top-p P] [--seed S] [--threads N]\n"
            "                   [--print-token-ids [--print-logprobs]]\n\n"
            "Prints the completion of TEXT as it is generated (stopping at an end-of-generation\n"
            "token or after N tokens, default 64; BOS first when the vocabulary asks for it). Temperature 0 (the default) is greedy; otherwise tokens\n"
            "are drawn with top-k / top-p from a stream fixed by the seed (default 1), so a run\n"
            "repeats exactly. --print-token-ids then prints two more lines:\n"
            "  prompt_token_ids: <ids of the prompt>\n"
            "  output_token_ids: <ids generated>\n"
            "and --print-logprobs one more, each generated token's natural log probability at\n"
            "temperature 1 (the figure a server's logprobs give, computed the same way):\n"
            "  output_logprobs: <one %%.9g float per generated token>\n");
}

static int parse_ul(const char *v, unsigned long max, unsigned long *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long x = strtoul(v, &end, 10);
    if (errno || !end || *end || end == v || x > max) return -1;
    *out = x;
    return 0;
}

static int parse_f(const char *v, float lo, float hi, float *out)
{
    char *end = NULL;
    float x = strtof(v, &end);
    if (!end || *end || end == v || !(x >= lo && x <= hi)) return -1;
    *out = x;
    return 0;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    printf("%s:", label);
    for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

int kvf_cmd_run(int argc, char **argv)
{
    const char *path = NULL, *prompt = NULL;
    unsigned long max_tokens = 64, seed = 1, top_k = 0, threads = 0;
    float temperature = 0.0f, top_p = 1.0f;
    bool print_ids_flag = false, print_lp_flag = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--print-token-ids") == 0) {
            print_ids_flag = true;
            continue;
        }
        if (strcmp(a, "--print-logprobs") == 0) {
            print_lp_flag = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvfence run: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (strcmp(a, "--model") == 0) path = v;
        else if (strcmp(a, "--prompt") == 0) prompt = v;
        else if (strcmp(a, "--max-tokens") == 0) bad = parse_ul(v, 1u << 20, &max_tokens);
        else if (strcmp(a, "--seed") == 0) bad = parse_ul(v, ~0ul, &seed);
        else if (strcmp(a, "--top-k") == 0) bad = parse_ul(v, 1u << 24, &top_k);
        else if (strcmp(a, "--threads") == 0) bad = parse_ul(v, 256, &threads);
        else if (strcmp(a, "--temperature") == 0) bad = parse_f(v, 0.0f, 100.0f, &temperature);
        else if (strcmp(a, "--top-p") == 0) bad = parse_f(v, 1e-6f, 1.0f, &top_p);
        else {
            fprintf(stderr, "kvfence run: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvfence run: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (!path || !prompt) {
        usage(stderr);
        return 2;
    }
    if (print_lp_flag && !print_ids_flag) {
        fprintf(stderr, "kvfence run: --print-logprobs goes with --print-token-ids\n");
        return 2;
    }
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned long)n : 1;
    }

    char err[256] = "";
    int rc, status = 1;
    kvf_gguf_t *g = NULL;
    kvf_model_t *m = NULL;
    kvf_tokenizer_t *tok = NULL;
    kvf_pool_t *pool = NULL;
    kvf_fwd_t *f = NULL;
    int32_t *ids = NULL;
    struct kvf_page_ref *pages = NULL;
    float *logits = NULL, *lps = NULL;
    if ((rc = kvf_gguf_open(path, &g, err, sizeof(err))) < 0) {
        fprintf(stderr, "kvfence run: %s\n", err); /* err names the file */
        goto out;
    }
    if ((rc = kvf_model_load(g, &m, err, sizeof(err))) < 0 ||
        (rc = kvf_tokenizer_create(g, &tok, err, sizeof(err))) < 0) {
        fprintf(stderr, "kvfence run: %s: %s\n", path, err);
        goto out;
    }
    const struct kvf_model_hparams *hp = kvf_model_hparams(m);
    if (kvf_tokenizer_n_vocab(tok) > hp->n_vocab) {
        fprintf(stderr, "kvfence run: %s: the vocabulary (%u) is larger than the model's (%u)\n",
                path, kvf_tokenizer_n_vocab(tok), hp->n_vocab);
        goto out;
    }
    size_t plen = strlen(prompt);
    /* BOS as the vocabulary asks, and every end-of-generation token ends the run: what the
     * server does with a string prompt, so `run` is the reference a served completion is
     * compared against. */
    bool add_bos = kvf_tokenizer_wants_bos(tok);
    int n_prompt = kvf_tokenizer_encode(tok, prompt, plen, add_bos, NULL, 0);
    if (n_prompt < 0) {
        fprintf(stderr, "kvfence run: the prompt cannot be tokenized: %s\n", kvf_strerror(n_prompt));
        goto out;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "kvfence run: the prompt is empty and the model has no BOS token\n");
        goto out;
    }
    if ((unsigned long)n_prompt >= hp->n_ctx) {
        fprintf(stderr, "kvfence run: the prompt is %d tokens; the context holds %u\n", n_prompt,
                hp->n_ctx);
        goto out;
    }
    if (max_tokens > hp->n_ctx - (unsigned long)n_prompt) max_tokens = hp->n_ctx - (unsigned long)n_prompt;
    size_t total = (size_t)n_prompt + max_tokens;
    ids = malloc((total + 1) * sizeof(int32_t));
    uint32_t n_pages = (uint32_t)((total + RUN_PAGE_TOKENS - 1) / RUN_PAGE_TOKENS);
    pages = malloc(n_pages * sizeof(*pages));
    logits = malloc(hp->n_vocab * sizeof(float));
    lps = malloc((max_tokens + 1) * sizeof(float));
    if (!ids || !pages || !logits || !lps) {
        fprintf(stderr, "kvfence run: out of memory\n");
        goto out;
    }
    kvf_tokenizer_encode(tok, prompt, plen, add_bos, ids, (size_t)n_prompt);

    struct kvf_pool_config pc;
    memset(&pc, 0, sizeof(pc));
    kvf_model_geometry(m, RUN_PAGE_TOKENS, &pc.geo);
    pc.n_pages = n_pages;
    pc.max_peers = 1;
    pc.tag_seed = 1;
    struct kvf_owner own = {{1, 0}, 0};
    uint32_t chunk = (uint32_t)n_prompt < RUN_CHUNK ? (uint32_t)n_prompt : RUN_CHUNK;
    struct kvf_fwd_config fc = {(uint32_t)threads, chunk, 1, NULL, 0};
    if ((rc = kvf_pool_create(&pc, &pool)) < 0 ||
        (rc = kvf_pool_alloc(pool, &own, KVF_HOLDER_SEQ, n_pages, false, pages)) < 0 ||
        (rc = kvf_fwd_create(m, &fc, &f)) < 0) {
        fprintf(stderr, "kvfence run: cannot set up the engine: %s\n", kvf_strerror(rc));
        goto out;
    }

    struct kvf_sample_params sp = {temperature, (uint32_t)top_k, top_p, seed};
    struct kvf_detok dt;
    kvf_detok_init(&dt);
    char text[KVF_DETOK_MAX_OUT];
    size_t n_out = 0;
    uint32_t pos = 0;
    /* The prompt, in chunks; then one token at a time, each sampled from the last logits. */
    while (pos < total) {
        uint32_t len = pos < (uint32_t)n_prompt ? (uint32_t)n_prompt - pos : 1;
        if (len > chunk) len = chunk;
        bool last_of_prompt = pos + len >= (uint32_t)n_prompt;
        struct kvf_fwd_seq s = {own.req, ids + pos, len, pos, pages, n_pages,
                                last_of_prompt ? logits : NULL, 0};
        rc = kvf_fwd_run(f, pool, &s, 1);
        if (rc != 1 || s.status != 0) {
            fprintf(stderr, "\nkvfence run: forward pass failed: %s\n",
                    kvf_strerror(rc < 0 ? rc : s.status));
            goto out;
        }
        pos += len;
        if (!last_of_prompt) continue;
        if (n_out == max_tokens) break;
        int t = kvf_sample(logits, hp->n_vocab, &sp, n_out);
        if (t < 0) {
            fprintf(stderr, "\nkvfence run: sampling failed: %s\n", kvf_strerror(t));
            goto out;
        }
        lps[n_out] = kvf_sample_logprob(logits, hp->n_vocab, t);
        ids[n_prompt + n_out++] = t;
        if (kvf_tokenizer_is_eog(tok, t)) break;
        size_t nb = kvf_detok_push(&dt, tok, t, text, sizeof(text));
        fwrite(text, 1, nb, stdout);
        fflush(stdout);
        if (n_out == max_tokens) break;
    }
    size_t nb = kvf_detok_finish(&dt, text, sizeof(text));
    fwrite(text, 1, nb, stdout);
    printf("\n");
    if (print_ids_flag) {
        print_ids("prompt_token_ids", ids, (size_t)n_prompt);
        print_ids("output_token_ids", ids + n_prompt, n_out);
    }
    if (print_lp_flag) {
        printf("output_logprobs:");
        for (size_t i = 0; i < n_out; i++) printf(" %.9g", (double)lps[i]);
        printf("\n");
    }
    status = 0;

out:
    kvf_fwd_destroy(f);
    kvf_pool_destroy(pool);
    free(lps);
    free(logits);
    free(pages);
    free(ids);
    kvf_tokenizer_destroy(tok);
    kvf_model_free(m);
    kvf_gguf_close(g);
    return status;
}
