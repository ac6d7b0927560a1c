#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static LogLevel max_level = LOG_INFO;
static LogSink sink;
static const char *const level_names[] = { "error", "warn", "info", "debug" };

void log_set_sink(LogSink s) {
        sink = s;
}

void log_set_level(LogLevel l) {
        max_level = l;
}

int log_parse_level(const char *name, LogLevel *ret) {
        for (int i = 0; i <= LOG_DEBUG; i++)
                if (strcmp(name, level_names[i]) == 0) {
                        *ret = (LogLevel)i;
                        return 0;
                }
        return -EINVAL;
}

void log_msg(LogLevel l, const char *rid, const char *fmt, ...) {
        if (l > max_level)
                return;
        char msg[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        /* Client text may reach the log: keep every event on one line. */
        for (char *p = msg; *p; p++)
                if (*p == '\n' || *p == '\r')
                        *p = ' ';
        if (sink) {
                sink(l, rid, msg);
                return;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        /* One fprintf per line: stdio locks the stream, so lines never interleave. */
        fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s%s%s%s %s\n", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level_names[l],
                rid ? " [" : "", rid ? rid : "", rid ? "]" : "", msg);
}
