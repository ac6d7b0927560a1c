#pragma once
/* The log of the daemon and the egress process: one line per event on stderr, with the request id when
 * there is one. Only the edges (main, handlers, supervisors) log. */
typedef enum LogLevel { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG } LogLevel;

void log_set_level(LogLevel l);
/* -EINVAL for an unknown name. */
int log_parse_level(const char *name, LogLevel *ret);
void log_msg(LogLevel l, const char *rid, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define log_error(rid, ...) log_msg(LOG_ERROR, rid, __VA_ARGS__)
#define log_warn(rid, ...) log_msg(LOG_WARN, rid, __VA_ARGS__)
#define log_info(rid, ...) log_msg(LOG_INFO, rid, __VA_ARGS__)
#define log_debug(rid, ...) log_msg(LOG_DEBUG, rid, __VA_ARGS__)

/* Where the log's lines go instead of stderr, once formatted (one line,
 * no newline): the daemon's journal sink under systemd. NULL: stderr. Set
 * before any thread logs. */
typedef void (*LogSink)(LogLevel l, const char *rid, const char *msg);
void log_set_sink(LogSink sink);
