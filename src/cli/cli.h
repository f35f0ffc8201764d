/* cli.h — the kvfence binary's subcommands. Each lives in its own cmd_<name>.c and takes the
 * arguments after its name (argv[0] is the subcommand's name). It returns the process exit
 * status: 0 on success, 1 on failure, 2 on a usage error. Only the CLI prints and exits. */
#ifndef KVF_CLI_H
#define KVF_CLI_H

#include <stdbool.h>

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

/* True when argv (after the subcommand) asks for help. */
bool kvf_cli_wants_help(int argc, char **argv);

#endif
