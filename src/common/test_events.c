/* kvf__test_event(): test builds' structured channel to the harness. When KVF_TEST_EVENTS names
 * a file, each event is appended to it as one JSON object on one line, written with a single
 * write(2) to a file opened O_APPEND, so lines of concurrent threads (and of processes sharing
 * the file) never interleave. The suites count what a test switch did from these lines (a
 * fixed schema they own), never from the words of the log (docs/ISOLATION.md, "Test events").
 * Compiled in test builds only (src/common/CMakeLists.txt). */
#include "kvfence/common.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_once_t events_once = PTHREAD_ONCE_INIT;
static int events_fd = -1;

static void events_open(void)
{
    const char *path = getenv("KVF_TEST_EVENTS");
    if (!path || !*path) return;
    events_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (events_fd < 0)
        kvf_log(KVF_LOG_ERROR, "kvfence: KVF_TEST_EVENTS=%s cannot be opened (errno %d)", path,
                errno);
}

/* The in-process listener (kvf__test_event_listen): the simulator on the real loops reads the
 * events of the workers it runs, in their thread, as they happen. */
static kvf__test_event_fn *listen_fn;
static void *listen_ctx;

void kvf__test_event_listen(kvf__test_event_fn *fn, void *ctx)
{
    listen_fn = fn;
    listen_ctx = ctx;
}

void kvf__test_event(const char *kind, const char *fmt, ...)
{
    pthread_once(&events_once, events_open);
    if (events_fd < 0 && !listen_fn) return;
    char line[1024];
    int n = snprintf(line, sizeof line, "{\"event\":\"%s\"", kind);
    if (n < 0 || (size_t)n >= sizeof line) return;
    size_t len = (size_t)n;
    if (fmt && *fmt) {
        va_list ap;
        va_start(ap, fmt);
        n = vsnprintf(line + len, sizeof line - len, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t)n >= sizeof line - len - 3) return; /* never a cut object */
        len += (size_t)n;
    }
    line[len++] = '}';
    line[len] = '\0';
    if (listen_fn) listen_fn(listen_ctx, kind, line);
    if (events_fd < 0) return;
    line[len++] = '\n';
    ssize_t w;
    do
        w = write(events_fd, line, len);
    while (w < 0 && errno == EINTR);
}
