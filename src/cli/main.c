/* The kvfence binary: `kvfence <command> [options]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvfence/common.h"

static const struct kvf_cmd commands[] = {
    {"serve", "run router + prefill + decode in one process (OpenAI-compatible HTTP)",
     kvf_cmd_serve},
    {"router", "run the HTTP router alone", kvf_cmd_router},
    {"prefill", "run a prefill worker", kvf_cmd_prefill},
    {"decode", "run a decode worker", kvf_cmd_decode},
    {"run", "generate from a model on the command line, without a server", kvf_cmd_run},
    {"mkmodel", "write a Llama GGUF test model with seeded random weights", kvf_cmd_mkmodel},
    {"bench", "run a benchmark and print its figures", kvf_cmd_bench},
    {"keygen", "write a new cluster key file for the fabric", kvf_cmd_keygen},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvfence <command> [options]\n"
               "       kvfence --version | --help\n\n"
               "kvfence serves LLMs to many tenants with prefill and decode on separate workers;\n"
               "a KV page is free only when nothing can still write to it.\n\ncommands:\n");
    for (size_t i = 0; i < KVF_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`kvfence <command> --help` describes each command. Every option of serve,\n"
               "router, prefill and decode can also be set from the environment as\n"
               "KVFENCE_<OPTION> (upper case, '-' as '_': KVFENCE_KV_MEMORY=2G is --kv-memory 2G;\n"
               "KVFENCE_NO_AUTH=1 is --no-auth; each command's --help names them); the command\n"
               "line wins.\n");
}

/* The process's log sink (kvf_log_set): the library's lines and the HTTP server's (which its
 * config hands to kvf_log_line) go one per line to stderr; stdio's stream lock keeps lines whole.
 */
static void log_stderr(void *arg, enum kvf_log_level level, const char *line)
{
    (void)arg;
    (void)level;
    flockfile(stderr);
    fputs(line, stderr);
    fputc('\n', stderr);
    funlockfile(stderr);
}

int main(int argc, char **argv)
{
    kvf_log_set(log_stderr, NULL);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("kvfence %s\n", kvf_version());
        return 0;
    }
    for (size_t i = 0; i < KVF_ARRAY_LEN(commands); i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvfence: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
