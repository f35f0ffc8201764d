/* kvf_log(): the one sink library code logs through. Library code never prints; it hands each
 * line to the process's sink, which the program embedding the library sets (the CLI sets one
 * that writes where the HTTP server's log goes). Until one is set, lines go to stderr. */
#include "kvfence/common.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

static void log_default(void *arg, enum kvf_log_level level, const char *line)
{
    (void)arg;
    (void)level;
    flockfile(stderr);
    fputs(line, stderr);
    fputc('\n', stderr);
    funlockfile(stderr);
}

/* The sink and its argument, set together: under sink_mu. */
static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER;
static kvf_log_fn *sink_fn = log_default;
static void *sink_arg;

void kvf_log_set(kvf_log_fn *fn, void *arg)
{
    pthread_mutex_lock(&sink_mu);
    sink_fn = fn ? fn : log_default;
    sink_arg = fn ? arg : NULL;
    pthread_mutex_unlock(&sink_mu);
}

void kvf_log(enum kvf_log_level level, const char *fmt, ...)
{
    /* A line longer than this is cut; every caller's line is a few hundred bytes at most. */
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    /* Callers' formats may end in a newline; the sink takes the line without one. */
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (len > 0 && line[len - 1] == '\n') line[len - 1] = '\0';

    pthread_mutex_lock(&sink_mu);
    kvf_log_fn *fn = sink_fn;
    void *arg = sink_arg;
    pthread_mutex_unlock(&sink_mu);
    /* Called outside the lock, so a sink may itself log or set the sink. */
    fn(arg, level, line);
}

void kvf_log_line(void *arg, const char *line)
{
    (void)arg;
    kvf_log(KVF_LOG_INFO, "%s", line);
}
