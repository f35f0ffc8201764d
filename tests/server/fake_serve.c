/*
 * fake_serve — the server over the fake engine as a process, for clients written in other
 * languages (tests/server/openai_client.mjs). Prints "port N" once listening, serves until its
 * stdin closes (or after a 120 s safety bound), then stops and exits 0 only if every engine
 * handle was released.
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "server_test_util.h"

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    struct srv s;
    srv_init(&s);
    s.f.token_delay_ms = 1;
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
