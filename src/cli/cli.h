/* cli.h — the kvfence binary's subcommands. Each lives in its own cmd_<name>.c and takes the
 * arguments after its name (argv[0] is the subcommand's name). It returns the process exit
 * status: 0 on success, 1 on failure, 2 on a usage error. Only the CLI prints and exits. */
#ifndef KVF_CLI_H
#define KVF_CLI_H

#include <stdbool.h>
#include <stdint.h>

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

/* True when argv (after the subcommand) asks for help. */
bool kvf_cli_wants_help(int argc, char **argv);

#endif
