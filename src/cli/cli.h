/* cli.h — the kvfence binary's subcommands. Each lives in its own cmd_<name>.c and takes the
 * arguments after its name (argv[0] is the subcommand's name). It returns the process exit
 * status: 0 on success, 1 on failure, 2 on a usage error. Only the CLI prints and exits. */
#ifndef KVF_CLI_H
#define KVF_CLI_H

#include <stdbool.h>
#include <signal.h>
#include <stdint.h>

#include "kvfence/gguf.h"
#include "kvfence/model.h"
#include "kvfence/tokenizer.h"

struct kvf_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
};

int kvf_cmd_bench(int argc, char **argv);
int kvf_cmd_serve(int argc, char **argv);
int kvf_cmd_router(int argc, char **argv);
int kvf_cmd_prefill(int argc, char **argv);
int kvf_cmd_decode(int argc, char **argv);
int kvf_cmd_mkmodel(int argc, char **argv);
int kvf_cmd_run(int argc, char **argv);

/* "512M", "2G", "1.5GiB", "4096": bytes. 0, or -1 for a bad value. */
int kvf_cli_parse_size(const char *v, uint64_t *out);
/* A decimal in [lo, hi]. 0, or -1. */
int kvf_cli_parse_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *out);
/* The model's fingerprint: XXH3 of the whole file, so workers agree only on the same bytes. */
int kvf_cli_file_fp(const char *path, uint64_t *fp);

/* Blocks SIGINT and SIGTERM (the caller takes them with sigwait, so every thread it starts
 * afterwards inherits them blocked) and ignores SIGPIPE. */
void kvf_cli_block_stop_signals(sigset_t *sigs);
/* Opens path's GGUF, loads the model, the tokenizer when tok is not NULL, and the fingerprint.
 * 0, or -1 after printing "kvfence <cmd>: ..." (what was opened is left for the caller to
 * free: every output is NULL or valid). */
int kvf_cli_open_model(const char *cmd, const char *path, kvf_gguf_t **g, kvf_model_t **m,
                       kvf_tokenizer_t **tok, uint64_t *fp);

/* True when argv (after the subcommand) asks for help. */
bool kvf_cli_wants_help(int argc, char **argv);

#endif
