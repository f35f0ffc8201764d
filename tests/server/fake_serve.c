/*
 * fake_serve — the server over the fake engine as a process, for clients written in other
 * languages (tests/server/openai_client.mjs, slow_clients.mjs). Prints "port N" once listening,
 * serves until its stdin closes (or after a 120 s safety bound), then stops and exits 0 only if
 * every engine handle was released.
 *
 * Options (each sets the server's config field of that name; 0 or absent: the default):
 *   --header-timeout-ms N  --body-timeout-ms N  --send-timeout-ms N  --max-conn-per-ip N
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "server_test_util.h"

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    struct srv s;
    srv_init(&s);
    s.f.token_delay_ms = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        uint32_t v = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--header-timeout-ms") == 0)
            s.cfg.header_timeout_ms = v;
        else if (strcmp(argv[i], "--body-timeout-ms") == 0)
            s.cfg.body_timeout_ms = v;
        else if (strcmp(argv[i], "--send-timeout-ms") == 0)
            s.cfg.send_timeout_ms = v;
        else if (strcmp(argv[i], "--max-conn-per-ip") == 0)
            s.cfg.max_conn_per_ip = v;
        else {
            fprintf(stderr, "fake_serve: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    srv_start(&s);
    printf("port %u\n", s.port);
    fflush(stdout);
    char buf[64];
    int64_t until = fake_now_ms() + 120000;
    while (fake_now_ms() < until) {
        struct pollfd p = {.fd = 0, .events = POLLIN};
        if (poll(&p, 1, 1000) > 0 && read(0, buf, sizeof buf) <= 0) break;
    }
    kvf_server_stop(s.s);
    uint32_t live = fake_live(&s.f);
    fprintf(stderr, "fake_serve: %u submits, %u cancels, %u live at exit\n", s.f.submits,
            s.f.cancels, live);
    int ok = live == 0 && s.f.releases == s.f.submits;
    kvf_tokenizer_destroy(s.tok);
    fake_destroy(&s.f);
    return ok ? 0 : 1;
}
