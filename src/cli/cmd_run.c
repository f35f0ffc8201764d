/* `kvfence run`: generates a completion from a GGUF model on the command line, without a
 * server — the same forward pass over pool pages that the workers run, for one request. */
#include <math.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvfence/grammar.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/pool.h"
#include "kvfence/text.h"

/* Prompt tokens go through the forward pass in chunks of at most this many. */
#define RUN_CHUNK       256u
#define RUN_PAGE_TOKENS 16u

struct run_opts {
    const char *model, *prompt;
    uint32_t max_tokens, top_k, threads; /* threads 0: every core */
    uint64_t seed;
    float temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
    const char *logit_bias; /* "ID:BIAS,..." */
    bool print_ids, print_logprobs;
    /* Structured output: at most one of these (the server's response_format and grammar). */
    const char *response_format; /* "text" or "json_object" */
    const char *json_schema;     /* a file holding a JSON Schema */
    const char *grammar;         /* a file holding GBNF */
};

/* No environment variables: `run` is a one-shot tool whose every value is given where it runs
 * (a deployment's KVFENCE_MODEL must not turn into its model). */
#define O(f) offsetof(struct run_opts, f)
static const struct kvf_cli_opt run_opts[] = {
    {.name = "--model",
     .metavar = "F.gguf",
     .kind = KVF_CLI_STR,
     .off = O(model),
     .flags = KVF_CLI_REQUIRED,
     .help = "the model"},
    {.name = "--prompt",
     .metavar = "TEXT",
     .kind = KVF_CLI_STR,
     .off = O(prompt),
     .flags = KVF_CLI_REQUIRED,
     .help = "the text to complete"},
    {.name = "--max-tokens",
     .metavar = "N",
     .kind = KVF_CLI_U32,
     .off = O(max_tokens),
     .lo = 0,
     .hi = 1u << 20,
     .def = "64",
     .help = "tokens generated at most; an end-of-generation token stops it sooner"},
    {.name = "--temperature",
     .metavar = "T",
     .kind = KVF_CLI_FLOAT,
     .off = O(temperature),
     .flo = 0.0f,
     .fhi = 100.0f,
     .def = "0",
     .help = "0 is greedy"},
    {.name = "--top-k",
     .metavar = "K",
     .kind = KVF_CLI_U32,
     .off = O(top_k),
     .lo = 0,
     .hi = 1u << 24,
     .help = "draw from the K most likely tokens only (default 0: all)"},
    {.name = "--top-p",
     .metavar = "P",
     .kind = KVF_CLI_FLOAT,
     .off = O(top_p),
     .flo = 1e-6f,
     .fhi = 1.0f,
     .def = "1",
     .help = "draw from the most likely tokens whose mass reaches P"},
    {.name = "--min-p",
     .metavar = "P",
     .kind = KVF_CLI_FLOAT,
     .off = O(min_p),
     .flo = 0.0f,
     .fhi = 1.0f,
     .def = "0",
     .help = "draw only tokens at least P times as likely as the likeliest (0: all)"},
    {.name = "--presence-penalty",
     .metavar = "X",
     .kind = KVF_CLI_FLOAT,
     .off = O(presence_penalty),
     .flo = -2.0f,
     .fhi = 2.0f,
     .def = "0",
     .help = "subtracted from the logit of each token the output already holds"},
    {.name = "--frequency-penalty",
     .metavar = "X",
     .kind = KVF_CLI_FLOAT,
     .off = O(frequency_penalty),
     .flo = -2.0f,
     .fhi = 2.0f,
     .def = "0",
     .help = "times its count in the output, subtracted from each token's logit"},
    {.name = "--repetition-penalty",
     .metavar = "X",
     .kind = KVF_CLI_FLOAT,
     .off = O(repetition_penalty),
     .flo = 1e-6f,
     .fhi = 1e6f,
     .def = "1",
     .help = "divides the positive logits (multiplies the negative) of every token of the prompt "
             "and the output (1: off)"},
    {.name = "--logit-bias",
     .metavar = "ID:B,...",
     .kind = KVF_CLI_STR,
     .off = O(logit_bias),
     .help = "add B (in [-100, 100]) to token ID's logit before anything else"},
    {.name = "--response-format",
     .metavar = "TYPE",
     .kind = KVF_CLI_STR,
     .off = O(response_format),
     .help = "json_object: the output is a JSON object, as the server's response_format "
             "{\"type\": \"json_object\"} (text: unconstrained)"},
    {.name = "--json-schema",
     .metavar = "FILE",
     .kind = KVF_CLI_STR,
     .off = O(json_schema),
     .help = "the output matches the JSON Schema in FILE, as the server's response_format "
             "json_schema"},
    {.name = "--grammar",
     .metavar = "FILE",
     .kind = KVF_CLI_STR,
     .off = O(grammar),
     .help = "the output matches the GBNF grammar in FILE, as the server's grammar field"},
    {.name = "--seed",
     .metavar = "S",
     .kind = KVF_CLI_U64,
     .off = O(seed),
     .lo = 0,
     .hi = UINT64_MAX,
     .def = "1",
     .help = "the sampling stream, so a run repeats exactly"},
    {.name = "--threads",
     .metavar = "N",
     .kind = KVF_CLI_U32,
     .off = O(threads),
     .lo = 0,
     .hi = 256,
     .help = "compute threads (default 0: every core)"},
    {.name = "--print-token-ids",
     .kind = KVF_CLI_FLAG,
     .off = O(print_ids),
     .help = "then print the prompt's and the output's token ids (two lines)"},
    {.name = "--print-logprobs",
     .kind = KVF_CLI_FLAG,
     .off = O(print_logprobs),
     .help = "with --print-token-ids: then print each generated token's log probability"},
};
#undef O

static const struct kvf_cli_spec run_spec = {
    .name = "run",
    .opts = run_opts,
    .n_opts = KVF_ARRAY_LEN(run_opts),
    .opts_size = sizeof(struct run_opts),
    .about =
        "Prints the completion of TEXT as it is generated (stopping at an end-of-generation\n"
        "token or after N tokens; BOS first when the vocabulary asks for it). Temperature 0 is\n"
        "greedy; otherwise tokens are drawn with min-p / top-k / top-p from a stream fixed by\n"
        "the seed, so a run repeats exactly. --logit-bias and the penalties shape the logits\n"
        "first, as the server's fields of the same names do (docs/API_FIELDS.md).\n",
    .after = "--print-token-ids prints two more lines:\n"
             "  prompt_token_ids: <ids of the prompt>\n"
             "  output_token_ids: <ids generated>\n"
             "and --print-logprobs one more, each generated token's natural log probability at\n"
             "temperature 1 (the figure a server's logprobs give, computed the same way):\n"
             "  output_logprobs: <one %.9g float per generated token>\n",
};

/* What one run holds; run_free releases every part, each NULL or valid. */
struct run {
    kvf_gguf_t *g;
    kvf_model_t *m;
    kvf_tokenizer_t *tok;
    kvf_pool_t *pool;
    kvf_fwd_t *f;
    const struct kvf_model_hparams *hp;
    int32_t *ids;               /* (n_prompt + max_tokens + 1): the prompt, then the output */
    struct kvf_page_ref *pages; /* (n_pages): every position's page, allocated up front */
    float *logits;              /* (n_vocab): the last position's */
    float *lps;                 /* (max_tokens + 1): each output token's log probability */
    void *scratch;              /* kvf_sample_scratch_bytes(n_vocab), zeroed: the sampler's */
    /* Structured output (NULL gram: none): the grammar, its vocabulary view, the output's
     * state, and the masked logits (n_vocab). */
    kvf_grammar_t *gram;
    kvf_grammar_vocab_t *gv;
    struct kvf_grammar_state *gst;
    float *masked;
    uint32_t n_prompt, max_tokens, n_pages, chunk;
    size_t n_out;
    struct kvf_owner own;
};

/* The model, its tokenizer, and the prompt's tokens, with max_tokens cut to the context. 0, or
 * -1 (printed). BOS as the vocabulary asks, and every end-of-generation token ends the run: what
 * the server does with a string prompt, so `run` is the reference a served completion is
 * compared against. */
static int run_open(struct run *r, const struct run_opts *o)
{
    char err[256] = "";
    if (kvf_gguf_open(o->model, &r->g, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence run: %s\n", err); /* err names the file */
        return -1;
    }
    if (kvf_model_load(r->g, &r->m, err, sizeof(err)) < 0 ||
        kvf_tokenizer_create(r->g, &r->tok, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvfence run: %s: %s\n", o->model, err);
        return -1;
    }
    r->hp = kvf_model_hparams(r->m);
    if (kvf_tokenizer_n_vocab(r->tok) > r->hp->n_vocab) {
        fprintf(stderr, "kvfence run: %s: the vocabulary (%u) is larger than the model's (%u)\n",
                o->model, kvf_tokenizer_n_vocab(r->tok), r->hp->n_vocab);
        return -1;
    }
    size_t plen = strlen(o->prompt);
    bool add_bos = kvf_tokenizer_wants_bos(r->tok);
    int n = kvf_tokenizer_encode(r->tok, o->prompt, plen, add_bos, NULL, 0);
    if (n < 0) {
        fprintf(stderr, "kvfence run: the prompt cannot be tokenized: %s\n", kvf_strerror(n));
        return -1;
    }
    if (n == 0) {
        fprintf(stderr, "kvfence run: the prompt is empty and the model has no BOS token\n");
        return -1;
    }
    if ((uint32_t)n >= r->hp->n_ctx) {
        fprintf(stderr, "kvfence run: the prompt is %d tokens; the context holds %u\n", n,
                r->hp->n_ctx);
        return -1;
    }
    r->n_prompt = (uint32_t)n;
    r->max_tokens = o->max_tokens;
    if (r->max_tokens > r->hp->n_ctx - r->n_prompt) r->max_tokens = r->hp->n_ctx - r->n_prompt;
    size_t total = (size_t)r->n_prompt + r->max_tokens;
    r->n_pages = (uint32_t)((total + RUN_PAGE_TOKENS - 1) / RUN_PAGE_TOKENS);
    r->ids = malloc((total + 1) * sizeof(int32_t));
    r->pages = malloc(r->n_pages * sizeof(*r->pages));
    r->logits = malloc(r->hp->n_vocab * sizeof(float));
    r->lps = malloc(((size_t)r->max_tokens + 1) * sizeof(float));
    r->scratch = calloc(1, kvf_sample_scratch_bytes(r->hp->n_vocab));
    if (!r->ids || !r->pages || !r->logits || !r->lps || !r->scratch) {
        fprintf(stderr, "kvfence run: out of memory\n");
        return -1;
    }
    kvf_tokenizer_encode(r->tok, o->prompt, plen, add_bos, r->ids, r->n_prompt);
    return 0;
}

/* A pool of exactly the run's pages, all allocated to it, and the forward pass. 0, or -1. */
static int run_engine(struct run *r, uint32_t threads)
{
    struct kvf_pool_config pc;
    memset(&pc, 0, sizeof(pc));
    kvf_model_geometry(r->m, RUN_PAGE_TOKENS, &pc.geo);
    pc.n_pages = r->n_pages;
    pc.max_peers = 1;
    pc.tag_seed = 1;
    r->own = (struct kvf_owner){{1, 0}, 0};
    r->chunk = r->n_prompt < RUN_CHUNK ? r->n_prompt : RUN_CHUNK;
    struct kvf_fwd_config fc = {threads, r->chunk, 1, NULL, 0};
    int rc;
    if ((rc = kvf_pool_create(&pc, &r->pool)) < 0 ||
        (rc = kvf_pool_alloc(r->pool, &r->own, KVF_HOLDER_SEQ, r->n_pages, false, r->pages)) < 0 ||
        (rc = kvf_fwd_create(r->m, &fc, &r->f)) < 0) {
        fprintf(stderr, "kvfence run: cannot set up the engine: %s\n", kvf_strerror(rc));
        return -1;
    }
    return 0;
}

/* Masks r->logits into r->masked by the grammar, as the workers do (kvf__constrain in
 * src/engine/constrain.c): the end-of-generation tokens the server stops at (the first
 * KVF_GEN_MAX_STOP_IDS) only where the output is complete, and never as the first token (the
 * prefill worker draws that one without them). INT_MIN: draw from r->masked; else the token a
 * dead end takes, or a negative code. */
static int constrain(struct run *r)
{
    const int32_t *eog;
    size_t n_eog = kvf_tokenizer_eog(r->tok, &eog);
    if (n_eog > KVF_GEN_MAX_STOP_IDS) n_eog = KVF_GEN_MAX_STOP_IDS;
    if (r->n_out == 0) n_eog = 0;
    int left = kvf_grammar_apply_to(r->gram, r->gv, r->gst, r->logits, r->masked, r->hp->n_vocab,
                                    eog, (uint32_t)n_eog);
    if (left < 0) return left;
    if (left == 0) return n_eog ? eog[0] : KVF_E_ENGINE;
    return INT_MIN;
}

/* Reads the structured-output option into r (the grammar compiled, its start state). 0, or -1
 * (printed). */
static int run_structured(struct run *r, const struct run_opts *o)
{
    int given = (o->response_format && strcmp(o->response_format, "text") != 0) +
                (o->json_schema != NULL) + (o->grammar != NULL);
    if (given == 0) return 0;
    if (given > 1) {
        fprintf(stderr, "kvfence run: --response-format, --json-schema and --grammar exclude "
                        "one another\n");
        return -1;
    }
    if (o->response_format && strcmp(o->response_format, "json_object") != 0) {
        fprintf(stderr, "kvfence run: --response-format is text or json_object\n");
        return -1;
    }
    char *text = malloc(KVF_GRAMMAR_MAX_BYTES + 1), *file = NULL, err[256] = "";
    size_t flen = 0;
    int n = -1;
    const char *path = o->json_schema ? o->json_schema : o->grammar;
    if (!text) goto fail;
    if (path) {
        FILE *f = fopen(path, "rb");
        file = malloc(4 * KVF_GRAMMAR_MAX_BYTES + 1);
        if (!f || !file) {
            snprintf(err, sizeof err, "cannot read %s", path);
            if (f) fclose(f);
            goto fail;
        }
        flen = fread(file, 1, 4 * KVF_GRAMMAR_MAX_BYTES + 1, f);
        fclose(f);
        if (flen > 4 * KVF_GRAMMAR_MAX_BYTES) {
            snprintf(err, sizeof err, "%s is too large", path);
            goto fail;
        }
    }
    if (o->grammar) {
        if (flen > KVF_GRAMMAR_MAX_BYTES) {
            snprintf(err, sizeof err, "%s: at most %d bytes", path, KVF_GRAMMAR_MAX_BYTES);
            goto fail;
        }
        memcpy(text, file, flen);
        n = (int)flen;
    } else {
        n = kvf_schema_to_grammar(o->json_schema ? file : NULL, flen, text,
                                  KVF_GRAMMAR_MAX_BYTES + 1, err, sizeof err);
        if (n < 0) goto fail;
    }
    if (kvf_grammar_compile(text, (size_t)n, &r->gram, err, sizeof err) < 0) goto fail;
    if (kvf_grammar_vocab_create(r->tok, &r->gv) < 0 || !(r->gst = malloc(sizeof *r->gst)) ||
        !(r->masked = malloc(r->hp->n_vocab * sizeof(float)))) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    kvf_grammar_state_init(r->gram, r->gst);
    free(text);
    free(file);
    return 0;
fail:
    fprintf(stderr, "kvfence run: %s\n", err[0] ? err : "out of memory");
    free(text);
    free(file);
    return -1;
}

/* The prompt, in chunks; then one token at a time, each sampled from the last logits and
 * printed as soon as it makes whole text. At most n_prompt / chunk + max_tokens forward calls.
 * 0, or -1 (printed). */
static int run_generate(struct run *r, const struct kvf_sample_params *sp)
{
    for (uint32_t i = 0; i < sp->n_logit_bias; i++)
        if ((uint32_t)sp->logit_bias[i].id >= r->hp->n_vocab) {
            fprintf(stderr, "kvfence run: --logit-bias names token %d; the vocabulary has %u\n",
                    (int)sp->logit_bias[i].id, r->hp->n_vocab);
            return -1;
        }
    struct kvf_detok dt;
    kvf_detok_init(&dt);
    char text[KVF_DETOK_MAX_OUT];
    size_t total = (size_t)r->n_prompt + r->max_tokens;
    uint32_t pos = 0;
    while (pos < total) {
        uint32_t len = pos < r->n_prompt ? r->n_prompt - pos : 1;
        if (len > r->chunk) len = r->chunk;
        bool last_of_prompt = pos + len >= r->n_prompt;
        struct kvf_fwd_seq s = {r->own.req,
                                r->ids + pos,
                                len,
                                pos,
                                r->pages,
                                r->n_pages,
                                last_of_prompt ? r->logits : NULL,
                                0};
        int rc = kvf_fwd_run(r->f, r->pool, &s, 1);
        if (rc != 1 || s.status != 0) {
            fprintf(stderr, "\nkvfence run: forward pass failed: %s\n",
                    kvf_strerror(rc < 0 ? rc : s.status));
            return -1;
        }
        pos += len;
        if (!last_of_prompt) continue;
        if (r->n_out == r->max_tokens) break;
        /* The penalties see the prompt and the output so far, as the server's do. */
        struct kvf_sample_hist h = {r->ids, r->n_prompt, r->ids + r->n_prompt, (uint32_t)r->n_out};
        int t = r->gram ? constrain(r) : INT_MIN;
        if (t == INT_MIN)
            t = kvf_sample_seq(r->gram ? r->masked : r->logits, r->hp->n_vocab, sp, &h, r->n_out,
                               r->scratch);
        if (t < 0) {
            fprintf(stderr, "\nkvfence run: sampling failed: %s\n", kvf_strerror(t));
            return -1;
        }
        r->lps[r->n_out] = kvf_sample_logprob(r->logits, r->hp->n_vocab, t);
        r->ids[r->n_prompt + r->n_out++] = t;
        if (kvf_tokenizer_is_eog(r->tok, t)) break;
        if (r->gram && kvf_grammar_state_advance(r->gram, r->gv, r->gst, t) < 0) {
            fprintf(stderr, "\nkvfence run: token %d leaves the grammar\n", t);
            return -1;
        }
        size_t nb = kvf_detok_push(&dt, r->tok, t, text, sizeof(text));
        fwrite(text, 1, nb, stdout);
        fflush(stdout);
        if (r->n_out == r->max_tokens) break;
    }
    size_t nb = kvf_detok_finish(&dt, text, sizeof(text));
    fwrite(text, 1, nb, stdout);
    printf("\n");
    return 0;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    printf("%s:", label);
    for (size_t i = 0; i < n; i++)
        printf(" %d", ids[i]);
    printf("\n");
}

static void run_free(struct run *r)
{
    kvf_fwd_destroy(r->f);
    kvf_pool_destroy(r->pool);
    free(r->lps);
    free(r->scratch);
    free(r->masked);
    free(r->gst);
    kvf_grammar_vocab_free(r->gv);
    kvf_grammar_free(r->gram);
    free(r->logits);
    free(r->pages);
    free(r->ids);
    kvf_tokenizer_destroy(r->tok);
    kvf_model_free(r->m);
    kvf_gguf_close(r->g);
}

static int bias_cmp(const void *a, const void *b)
{
    const struct kvf_logit_bias *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* "ID:BIAS[,ID:BIAS...]" into sp (ids sorted, each once). 0, or -1 (printed). The ids are
 * checked against the vocabulary once the model is open. */
static int parse_logit_bias(const char *s, struct kvf_sample_params *sp)
{
    const char *p = s;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9') goto bad;
        unsigned long id = strtoul(p, &end, 10);
        if (*end != ':' || id > INT32_MAX) goto bad;
        p = end + 1;
        float b = strtof(p, &end);
        if (end == p || !(b >= -100.0f && b <= 100.0f)) goto bad;
        if (sp->n_logit_bias == KVF_GEN_MAX_LOGIT_BIAS) goto bad;
        for (uint32_t i = 0; i < sp->n_logit_bias; i++)
            if (sp->logit_bias[i].id == (int32_t)id) goto bad;
        sp->logit_bias[sp->n_logit_bias++] = (struct kvf_logit_bias){(int32_t)id, b};
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            goto bad;
    }
    qsort(sp->logit_bias, sp->n_logit_bias, sizeof sp->logit_bias[0], bias_cmp);
    return 0;
bad:
    fprintf(stderr,
            "kvfence run: --logit-bias takes ID:BIAS[,ID:BIAS...], distinct token ids, each bias "
            "in [-100, 100] (at most %d)\n",
            KVF_GEN_MAX_LOGIT_BIAS);
    return -1;
}

int kvf_cmd_run(int argc, char **argv)
{
    struct run_opts o = {0};
    int exit_status = 0;
    if (kvf_cli_parse(&run_spec, argc, argv, &o, &exit_status) < 0) return exit_status;
    if (o.print_logprobs && !o.print_ids) {
        fprintf(stderr, "kvfence run: --print-logprobs goes with --print-token-ids\n");
        return 2;
    }
    uint32_t threads = o.threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint32_t)n : 1;
    }
    struct run r = {0};
    struct kvf_sample_params sp = {
        .temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p, .seed = o.seed};
    sp.min_p = o.min_p;
    sp.presence_penalty = o.presence_penalty;
    sp.frequency_penalty = o.frequency_penalty;
    sp.repetition_penalty = o.repetition_penalty;
    if (o.logit_bias && parse_logit_bias(o.logit_bias, &sp) < 0) return 2;
    int status = 1;
    if (run_open(&r, &o) < 0 || run_structured(&r, &o) < 0 || run_engine(&r, threads) < 0 ||
        run_generate(&r, &sp) < 0)
        goto out;
    if (o.print_ids) {
        print_ids("prompt_token_ids", r.ids, r.n_prompt);
        print_ids("output_token_ids", r.ids + r.n_prompt, r.n_out);
    }
    if (o.print_logprobs) {
        printf("output_logprobs:");
        for (size_t i = 0; i < r.n_out; i++)
            printf(" %.9g", (double)r.lps[i]);
        printf("\n");
    }
    status = 0;
out:
    run_free(&r);
    return status;
}
