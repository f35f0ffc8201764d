/*
 * log.c — the server's log lines: one per event, key=value, handed to the configured sink.
 * What goes into a line is decided by the callers in http.c: ids, tenant names, numbers and
 * static codes only (BAD_INPUTS row 8).
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "server_internal.h"

int64_t kvf__srv_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void kvf__srv_log(const struct kvf_server_config *cfg, const char *fmt, ...)
{
    if (!cfg->log) return;
    char line[1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int k =
        snprintf(line, sizeof line, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + k, sizeof line - (size_t)k, fmt, ap);
    va_end(ap);
    cfg->log(cfg->log_arg, line);
}
