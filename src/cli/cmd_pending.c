/* Subcommands whose modules have not been built yet. Each says so plainly, with --help
 * describing what it will do, and exits non-zero: nothing here pretends to work. When a module
 * lands, its command moves to its own cmd_<name>.c. */
#include <stdio.h>

#include "cli.h"

static int pending(int argc, char **argv, const char *what)
{
    if (kvf_cli_wants_help(argc, argv)) {
        printf("usage: kvfence %s [options]\n\n%s\n\nNot available in this build yet.\n", argv[0],
               what);
        return 0;
    }
    fprintf(stderr, "kvfence %s: not available in this build yet\n", argv[0]);
    return 1;
}

int kvf_cmd_router(int argc, char **argv)
{
    return pending(argc, argv, "Runs the HTTP router (OpenAI API, tenants, admission, streaming).");
}

int kvf_cmd_decode(int argc, char **argv)
{
    return pending(argc, argv, "Runs a decode worker that owns a fenced page pool and decodes.");
}
