#include "daemon/api/api.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/audit.h"
#include "daemon/manager/output.h"
#include "daemon/http/websocket.h"
#include "daemon/http/request.h"
#include "proto/proto.h"

void api_agent_error(json_t *result, const char *path, ApiError *e) {
        const char *msg = NULL;
        const char *code = agent_result_error(result, &msg);
        if (!code)
                code = "internal";
        /* The agent's message is about the sandbox's own files: safe to pass on,
         * but bounded. */
        char text[300];
        if (path)
                snprintf(text, sizeof(text), "%.180s: %.100s", path, msg ? msg : code);
        else
                snprintf(text, sizeof(text), "%.200s", msg ? msg : code);
        static const struct {
                const char *agent;
                int status;
                const char *code;
        } map[] = {
                { "invalid", 400, "invalid_request" },          { "not_found", 404, "not_found" },
                { "exists", 409, "conflict" },                  { "not_a_directory", 400, "invalid_request" },
                { "is_a_directory", 400, "invalid_request" },   { "not_empty", 409, "conflict" },
                { "permission_denied", 403, "forbidden" },      { "no_space", 413, "payload_too_large" },
                { "too_large", 413, "payload_too_large" },      { "busy", 409, "conflict" },
                { "io", 500, "internal" },                      { "internal", 500, "internal" },
        };
        for (size_t i = 0; i < ELEMENTSOF(map); i++)
                if (strcmp(code, map[i].agent) == 0) {
                        api_error(e, map[i].status, map[i].code, NULL, "%s", text);
                        return;
                }
        api_error(e, 500, "internal", NULL, "%s", text);
}


int api_archive_error(int code, const char *path, const char *why, ApiError *e) {
        switch (code) {
        case ARCHIVE_EXIT_NOT_FOUND:
                return api_error(e, 404, "not_found", NULL, "%.180s: no such directory", path);
        case ARCHIVE_EXIT_NOT_A_DIRECTORY:
                return api_error(e, 400, "invalid_request", NULL, "%.180s: not a directory", path);
        case ARCHIVE_EXIT_MALFORMED:
                return api_error(e, 400, "invalid_request", "send a tar, gzip-compressed or not",
                                 "the archive is malformed: %.200s", why);
        case ARCHIVE_EXIT_REFUSED:
                return api_error(e, 400, "invalid_request",
                                 "archives may hold files, directories and links that stay inside the target",
                                 "%.240s", why);
        case ARCHIVE_EXIT_TOO_LARGE:
                return api_error(e, 413, "payload_too_large", "split it, or copy fewer files at once", "%.240s", why);
        case ARCHIVE_EXIT_PERMISSION:
                return api_error(e, 403, "forbidden", "use a place the user may write, or run as root",
                                 "%.180s: permission denied", path);
        case ARCHIVE_EXIT_NO_SPACE:
                /* As a full disk on every other file route: 413, the
                 * sandbox's diskMiB is the bound that was reached. */
                return api_error(e, 413, "payload_too_large", "free space in the sandbox, or create it with more diskMiB",
                                 "%.180s: the sandbox's disk is full", path);
        default:
                return api_error(e, 500, "internal", NULL, "%.180s: %.100s", path, why);
        }
}

int api_sandbox_error(const SandboxError *se, ApiError *e) {
        static const struct {
                int status;
                const char *code;
        } map[] = {
                [SANDBOX_ERR_INTERNAL] = { 500, "internal" },
                [SANDBOX_ERR_INVALID] = { 400, "invalid_request" },
                [SANDBOX_ERR_NOT_FOUND] = { 404, "not_found" },
                [SANDBOX_ERR_CONFLICT] = { 409, "conflict" },
                [SANDBOX_ERR_NOT_PAUSED] = { 409, "not_paused" },
                [SANDBOX_ERR_OVER_BUDGET] = { 409, "budget_exceeded" },
                [SANDBOX_ERR_SPENDING] = { 402, "spending_limit_reached" },
                [SANDBOX_ERR_TOO_LARGE] = { 413, "payload_too_large" },
                [SANDBOX_ERR_TOO_MANY] = { 429, "rate_limited" },
                [SANDBOX_ERR_UNAVAILABLE] = { 503, "unavailable" },
                [SANDBOX_ERR_NOT_IMPLEMENTED] = { 501, "not_implemented" },
        };
        unsigned k = (unsigned)se->kind < ELEMENTSOF(map) ? (unsigned)se->kind : SANDBOX_ERR_INTERNAL;
        return api_error(e, map[k].status, map[k].code, se->hint[0] ? se->hint : NULL, "%s", se->message);
}

int api_sandbox_acquire(Req *r, Sandbox **ret, ApiError *e) {
        SandboxError se;
        if (sandbox_acquire(r->app->manager, &r->key, r->route.sandbox_id, ret, &se) < 0)
                return api_sandbox_error(&se, e);
        return 0;
}

int api_sandbox_owned(Req *r, ApiError *e) {
        SandboxError se;
        SandboxRow row;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se) < 0)
                return api_sandbox_error(&se, e);
        sandbox_row_done(&row);
        return 0;
}

int api_req_set_user(json_t *req, Sandbox *sb, ReqUser u) {
        return agent_req_set_user(req, sandbox_runs_as_root(sb, u));
}

int api_req_user(json_t *req, Sandbox *sb) {
        if (json_object_get(req, "user"))
                return 0;
        return api_req_set_user(req, sb, REQ_AS_DEFAULT);
}

int api_open_stream(Sandbox *sb, json_t *request, ChanStream **ret, ApiError *e) {
        SandboxError se;
        if (sandbox_open_stream(sb, request, ret, &se) < 0)
                return api_sandbox_error(&se, e);
        return 0;
}

static bool header_has_token(Req *r, const char *name, const char *token) {
        const char *v = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
        if (!v)
                return false;
        size_t n = strlen(token);
        for (const char *s = v; *s;) {
                while (*s == ' ' || *s == '\t' || *s == ',')
                        s++;
                size_t len = strcspn(s, ", \t");
                if (len == n && strncasecmp(s, token, n) == 0)
                        return true;
                s += len;
        }
        return false;
}

/* The WebSocket handshake's request side (RFC 6455 4.2.1): Upgrade and
 * Connection tokens, a well-formed Sec-WebSocket-Key (its accept value in
 * accept) and version 13. A 400 naming what to use otherwise. */
int api_websocket_handshake(Req *r, const char *client, char accept[29], ApiError *e) {
        const char *key = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Sec-WebSocket-Key");
        const char *version = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Sec-WebSocket-Version");
        if (!header_has_token(r, "Upgrade", "websocket") || !header_has_token(r, "Connection", "upgrade") ||
            ws_accept_value(key, accept) < 0 || !version || strcmp(version, "13") != 0)
                return api_error(e, 400, "invalid_request", client,
                                 "this route is a WebSocket: send Upgrade: websocket, Connection: Upgrade, a "
                                 "Sec-WebSocket-Key and Sec-WebSocket-Version: 13");
        return 0;
}

json_t *api_image_json(const ImageInfo *info) {
        return json_pack("{s:s,s:b,s:o,s:I}", "name", info->name, "built", info->built, "builtAt",
                         info->built_at[0] ? json_string(info->built_at) : json_null(), "sizeBytes",
                         (json_int_t)info->size_bytes);
}

static int image_append(void *userdata, const ImageInfo *info) {
        json_t *j = api_image_json(info);
        return j && json_array_append_new(userdata, j) == 0 ? 0 : -ENOMEM;
}

json_t *api_images_json(const DaemonConfig *cfg) {
        json_t *arr = json_array();
        if (arr && images_list(cfg, image_append, arr) < 0) {
                json_decref(arr);
                return NULL;
        }
        return arr;
}

/* ---- processes: what the exec and process handlers share ---- */

#define READ_POLL_MS 250
/* One response carries at most this much output, or lasts this long, then
 * ends with a `continue` event naming the cursor to resume from: a proxy in
 * between, or the client's own read timeout, never cuts a long stream
 * somewhere unknown. */
#define STREAM_MAX_BYTES (1024ull * 1024ull * 1024ull)
#define STREAM_MAX_MS (5ull * 60ull * 1000ull)

/* A test setting: RUNTIME_TEST_STREAM_MAX_BYTES makes responses end (with
 * `continue`) after that many output bytes, so the resume path is tested
 * without a gigabyte. */
static uint64_t stream_max_bytes(void) {
        const char *v = getenv("RUNTIME_TEST_STREAM_MAX_BYTES");
        char *end = NULL;
        unsigned long long n = v ? strtoull(v, &end, 10) : 0;
        return v && *end == '\0' && n > 0 ? n : STREAM_MAX_BYTES;
}

json_t *api_process_json(const ProcInfo *i) {
        json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:s,s:b}", "id", i->id, "command", i->command, "user",
                              i->user, "state", proc_state_name(i->exit.state), "outputBytes", (json_int_t)i->output_bytes,
                              "stdinOffset", (json_int_t)i->stdin_offset, "startedAt", (json_int_t)i->started_unix,
                              "outputEncoding", i->base64 ? "base64" : "utf8", "stdinOpen", i->stdin_open);
        if (!j)
                return NULL;
        json_object_set_new(j, "exitCode", i->exit.state == PROC_EXITED ? json_integer(i->exit.exit_code) : json_null());
        json_object_set_new(j, "pid", i->pid > 0 ? json_integer(i->pid) : json_null());
        json_object_set_new(j, "endedAt", i->ended_unix ? json_integer(i->ended_unix) : json_null());
        json_object_set_new(j, "pty", i->pty ? json_pack("{s:i,s:i}", "cols", (int)i->pty_cols, "rows", (int)i->pty_rows)
                                            : json_null());
        return j;
}

json_t *api_out_of_memory(int64_t processes_killed, unsigned memory_mib) {
        char msg[160];
        snprintf(msg, sizeof msg, "The command used up the sandbox's memory (%u MiB) and was killed.", memory_mib);
        return json_pack("{s:s,s:I,s:i,s:s,s:s}", "code", "out_of_memory", "processesKilled",
                         (json_int_t)processes_killed, "memoryMiB", (int)memory_mib, "message", msg, "hint",
                         "Use less memory, or create the sandbox with a larger memoryMiB.");
}

/* The last event of a process's output: its exit, or why it has none. */
json_t *api_process_exit_event(const ProcExit *x) {
        if (x->state == PROC_LOST || x->state == PROC_FAILED) {
                ApiError e;
                if (x->state == PROC_LOST)
                        api_error(&e, 409, "conflict", "create a new sandbox", "%s", x->reason);
                else
                        api_error(&e, 500, "internal", NULL, "%s", x->reason);
                json_t *body = api_error_json(&e, NULL);
                json_t *line = body ? json_pack("{s:s,s:O}", "type", "error", "error", json_object_get(body, "error"))
                                    : NULL;
                json_decref(body);
                return line;
        }
        json_t *ev = json_pack("{s:s,s:o,s:b,s:I,s:n,s:s}", "type", "exit", "exitCode",
                               x->has_exit_code ? json_integer(x->exit_code) : json_null(), "timedOut", x->timed_out,
                               "durationMs", (json_int_t)x->duration_ms, "outOfMemory", "state",
                               proc_state_name(x->state));
        if (ev && x->oom_killed > 0) {
                json_t *oom = api_out_of_memory(x->oom_killed, x->memory_mib);
                if (!oom || json_object_set_new(ev, "outOfMemory", oom) < 0)
                        json_decref(TAKE_PTR(ev));
        }
        return ev;
}

/* Base64 of len bytes into out ((len + 2) / 3 * 4 bytes); the length. */
static size_t base64_encode_into(const uint8_t *b, size_t len, char *out) {
        static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        size_t o = 0, i = 0;
        for (; i + 2 < len; i += 3) {
                uint32_t v = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8 | b[i + 2];
                out[o++] = tab[v >> 18];
                out[o++] = tab[(v >> 12) & 63];
                out[o++] = tab[(v >> 6) & 63];
                out[o++] = tab[v & 63];
        }
        if (i < len) {
                uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < len ? (uint32_t)b[i + 1] << 8 : 0);
                out[o++] = tab[v >> 18];
                out[o++] = tab[(v >> 12) & 63];
                out[o++] = i + 1 < len ? tab[(v >> 6) & 63] : '=';
                out[o++] = '=';
        }
        return o;
}

/* JSON string content for bytes: printable ASCII copied in runs, the JSON
 * escapes, valid multi-byte UTF-8 as it is, any other byte as U+FFFD. out
 * holds 6 * len bytes. Returns the length; *ret_exact is whether the text is
 * the bytes themselves. jansson's own path (sanitize, pack, dump) ran at a
 * few MB/s here: this is the hot loop of every output read. */
/* Whether any of the 8 bytes in v is one json_text must look at: a control
 * byte, a non-ASCII byte, '"' or '\\' (exact as a whole: the bit tricks'
 * borrows only misplace flags above a byte that is flagged anyway). */
static inline bool word_needs_escape(uint64_t v) {
        const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
        uint64_t below_space = (v - ones * 0x20) & ~v;
        uint64_t quote = v ^ (ones * '"'), backslash = v ^ (ones * '\\');
        uint64_t is_quote = (quote - ones) & ~quote, is_backslash = (backslash - ones) & ~backslash;
        return ((v | below_space | is_quote | is_backslash) & highs) != 0;
}

static size_t json_text(const uint8_t *b, size_t len, char *out, bool *ret_exact) {
        static const char hex[] = "0123456789abcdef";
        size_t o = 0;
        bool exact = true;
        for (size_t i = 0; i < len;) {
                /* One pass: a word with nothing to escape is copied as it is
                 * looked at, so plain text is read once and written once. */
                for (uint64_t v; i + 8 <= len; i += 8, o += 8) {
                        memcpy(&v, b + i, 8);
                        if (word_needs_escape(v))
                                break;
                        memcpy(out + o, &v, 8);
                }
                while (i < len && b[i] >= 0x20 && b[i] < 0x80 && b[i] != '"' && b[i] != '\\')
                        out[o++] = (char)b[i++];
                if (i >= len)
                        break;
                uint8_t c = b[i];
                if (c == '"' || c == '\\') {
                        out[o++] = '\\';
                        out[o++] = (char)c;
                        i++;
                } else if (c < 0x20) {
                        out[o++] = '\\';
                        switch (c) {
                        case '\n': out[o++] = 'n'; break;
                        case '\t': out[o++] = 't'; break;
                        case '\r': out[o++] = 'r'; break;
                        default:
                                out[o++] = 'u';
                                out[o++] = '0';
                                out[o++] = '0';
                                out[o++] = hex[c >> 4];
                                out[o++] = hex[c & 15];
                        }
                        i++;
                } else {
                        int sl = utf8_seq_len(b + i, len - i);
                        if (sl > 0) {
                                memcpy(out + o, b + i, (size_t)sl);
                                o += (size_t)sl;
                                i += (size_t)sl;
                        } else {
                                memcpy(out + o, "\xef\xbf\xbd", 3);
                                o += 3;
                                i++;
                                exact = false;
                        }
                }
        }
        *ret_exact = exact;
        return o;
}

/* The most bytes output_line_into writes for len bytes of output: the
 * head, every byte escaped as \u00XX, and the bytes again in base64. */
#define OUTPUT_LINE_HEAD 96
static size_t output_line_max(size_t len) {
        return OUTPUT_LINE_HEAD + 6 * len + (len + 2) / 3 * 4 + 32;
}

/* The most output bytes whose line fits in room bytes (with its newline). */
static size_t output_bytes_for(size_t room) {
        return room > OUTPUT_LINE_HEAD + 64 ? (room - OUTPUT_LINE_HEAD - 64) * 3 / 22 : 0;
}

/* Output bytes as an NDJSON line (without its newline) into out, which holds
 * output_line_max(len) bytes. Returns the line's length. */
static size_t output_line_into(char *out, int fd, uint64_t off, const uint8_t *b, size_t len, bool base64) {
        int hn = snprintf(out, OUTPUT_LINE_HEAD, "{\"type\":\"%s\",\"offset\":%llu,\"data\":\"",
                          fd == PROTO_FD_OUT ? "stdout" : "stderr", (unsigned long long)off);
        bool exact;
        size_t o = (size_t)hn + json_text(b, len, out + hn, &exact);
        out[o++] = '"';
        /* Text that is not the bytes themselves would move a reader's cursor
         * wrongly: the bytes go along. */
        if (base64 || !exact) {
                memcpy(out + o, ",\"base64\":\"", 11);
                o += 11;
                o += base64_encode_into(b, len, out + o);
                out[o++] = '"';
        }
        out[o++] = '}';
        return o;
}

static char *output_line(int fd, uint64_t off, const uint8_t *b, size_t len, bool base64, size_t *ret_len) {
        char *line = malloc(output_line_max(len) + 1);
        if (!line)
                return NULL;
        size_t o = output_line_into(line, fd, off, b, len, base64);
        line[o] = '\0';
        *ret_len = o;
        return line;
}

static char *dump_line(json_t *j, size_t *ret_len) {
        char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (line)
                *ret_len = strlen(line);
        return line;
}

/* One event as a line of JSON text (malloc'ed, without its newline). */
static char *event_line(ProcEvent *ev, size_t *ret_len) {
        switch (ev->kind) {
        case PROC_EV_OUTPUT: {
                char *line = output_line(ev->fd, ev->offset, ev->data, ev->len, ev->base64, ret_len);
                free(TAKE_PTR(ev->data));
                return line;
        }
        case PROC_EV_TRUNCATED:
                return dump_line(json_pack("{s:s,s:I,s:I}", "type", "truncated", "droppedBytes",
                                           (json_int_t)ev->dropped, "resumeAt", (json_int_t)ev->resume_at),
                                 ret_len);
        case PROC_EV_EXIT:
                return dump_line(api_process_exit_event(&ev->exit), ret_len);
        }
        return NULL;
}
json_t *api_exec_request(const ExecRequest *q, Sandbox *sb) {
        _cleanup_json_ json_t *base = sandbox_env(sb);
        _cleanup_json_ json_t *env = json_deep_copy(base);
        if (!env || json_object_update(env, q->env) < 0)
                return NULL;
        if (q->pty && !json_object_get(env, "TERM") && json_object_set_new(env, "TERM", json_string("xterm-256color")) < 0)
                return NULL;
        json_t *req = agent_req_exec(q->command, q->argv, q->cwd, env, q->timeout_ms, q->has_stdin || q->stdin_pipe);
        if (req && agent_req_set_user(req, sandbox_runs_as_root(sb, q->user)) < 0)
                json_decref(TAKE_PTR(req));
        if (req && q->pty &&
            json_object_set_new(req, "pty", json_pack("{s:i,s:i}", "cols", (int)q->pty_cols, "rows", (int)q->pty_rows)) < 0)
                json_decref(TAKE_PTR(req));
        return req;
}

typedef struct OutputStream {
        char rid[24];
        Proc *p;
        ProcCursor cur;
        int sock;
        json_t *first; /* the start event of an exec, sent before the output */
        uint64_t sent_bytes, t0, max_bytes;
        bool follow;
        bool done;
        char *line;
        size_t line_len, line_off;
} OutputStream;

/* Output responses open now: a daemon's stop waits for them to send their
 * last event (api_output_streams_wait). */
static atomic_int open_output_streams;

bool api_output_streams_wait(int timeout_ms) {
        int64_t end = (int64_t)time_now_mono_ms() + timeout_ms;
        while (atomic_load(&open_output_streams) > 0) {
                if ((int64_t)time_now_mono_ms() >= end)
                        return false;
                struct timespec ts = { .tv_nsec = 10 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
        return true;
}

static void output_stream_free(void *cls) {
        OutputStream *o = cls;
        if (!o)
                return;
        atomic_fetch_sub(&open_output_streams, 1);
        proc_cursor_done(o->p, &o->cur);
        proc_unref(o->p);
        json_decref(o->first);
        free(o->line);
        free(o);
}

/* Takes line (malloc'ed, NUL-terminated, len bytes) as the next to send. */
static int take_line(OutputStream *o, char *line, size_t len) {
        free(o->line);
        o->line = line;
        if (!o->line)
                return -ENOMEM;
        o->line_len = len;
        o->line[o->line_len++] = '\n'; /* over the NUL: the length says where it ends */
        o->line_off = 0;
        return 0;
}

static int set_line(OutputStream *o, json_t *j) {
        char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        return take_line(o, line, line ? strlen(line) : 0);
}

/* The next line to send: 0, -EAGAIN (nothing within wait_ms), -ENODATA (the
 * end). With dst, an output event is written straight there (dst holds room
 * bytes, and the cursor asks for no more than fits) and *ret_direct says how
 * many bytes; any other line is kept in o->line. */
static int next_line(OutputStream *o, int wait_ms, char *dst, size_t room, size_t *ret_direct) {
        *ret_direct = 0;
        if (o->first)
                return set_line(o, TAKE_PTR(o->first));
        if (o->done)
                return -ENODATA;
        if (!o->cur.ended &&
            (o->sent_bytes >= o->max_bytes || time_now_mono_ms() - o->t0 >= STREAM_MAX_MS)) {
                o->done = true;
                return set_line(o, json_pack("{s:s,s:s,s:I}", "type", "continue", "processId", proc_id(o->p),
                                             "cursor", (json_int_t)o->cur.at));
        }
        ProcEvent ev;
        uint64_t before = o->cur.at;
        o->cur.max_bytes = dst ? output_bytes_for(room) : 0;
        int r = proc_next_event(o->p, &o->cur, o->follow ? wait_ms : 0, &ev);
        if (r == -ENODATA) {
                o->done = true;
                return -ENODATA;
        }
        if (r == -EAGAIN) {
                if (!o->follow) {
                        o->done = true;
                        return -ENODATA;
                }
                return -EAGAIN;
        }
        if (r < 0)
                return r;
        o->sent_bytes += o->cur.at - before;
        if (o->cur.ended)
                o->done = true;
        if (dst && ev.kind == PROC_EV_OUTPUT) {
                size_t n = output_line_into(dst, ev.fd, ev.offset, ev.data, ev.len, ev.base64);
                dst[n++] = '\n';
                free(ev.data);
                *ret_direct = n;
                return 0;
        }
        /* The daemon is stopping and leaves the process running for the
         * next start: the reader is told to read on from here then. */
        if (ev.kind == PROC_EV_EXIT && ev.exit.detached)
                return set_line(o, json_pack("{s:s,s:s,s:I}", "type", "continue", "processId", proc_id(o->p),
                                             "cursor", (json_int_t)o->cur.at));
        size_t len = 0;
        char *line = event_line(&ev, &len);
        return take_line(o, line, len);
}

/* MHD's buffer per output reply: a whole event of 256 KiB, formatted
 * there at its worst (every byte escaped, and in base64), fits. */
#define OUTPUT_BLOCK (2u * 1024u * 1024u)

/* Below this much room in MHD's buffer an output event is not written into
 * it directly (it would be a small one): what is there goes out first. */
#define DIRECT_MIN (64u * 1024u)

/* Fills buf with as many lines as are ready: under load every hand-over
 * between threads costs a scheduling delay, so a write carries what there is.
 * Output events are formatted straight into buf, without a copy between. */
static ssize_t output_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        OutputStream *o = cls;
        size_t filled = 0;
        for (;;) {
                if (o->line && o->line_off < o->line_len) {
                        size_t n = o->line_len - o->line_off;
                        if (n > max - filled)
                                n = max - filled;
                        memcpy(buf + filled, o->line + o->line_off, n);
                        o->line_off += n;
                        filled += n;
                        if (filled == max)
                                return (ssize_t)filled;
                        continue;
                }
                size_t room = max - filled, direct = 0;
                if (filled && room < DIRECT_MIN)
                        return (ssize_t)filled;
                bool into = room >= DIRECT_MIN;
                int r = next_line(o, filled ? 0 : READ_POLL_MS, into ? buf + filled : NULL, room, &direct);
                if (r == 0 && direct) {
                        filled += direct;
                        continue;
                }
                if (filled && r < 0 && r != -ENOMEM)
                        return (ssize_t)filled;
                if (r == -ENODATA)
                        return MHD_CONTENT_READER_END_OF_STREAM;
                if (r == -EAGAIN) {
                        /* The process runs on when its reader leaves. */
                        if (socket_hung_up(o->sock))
                                return MHD_CONTENT_READER_END_WITH_ERROR;
                        continue;
                }
                if (r < 0)
                        return MHD_CONTENT_READER_END_WITH_ERROR;
        }
}

enum MHD_Result api_process_output(Req *r, Proc *p, uint64_t cursor, bool follow, json_t *first) {
        OutputStream *o = calloc(1, sizeof(*o));
        if (!o) {
                proc_unref(p);
                json_decref(first);
                return reply_internal(r);
        }
        atomic_fetch_add(&open_output_streams, 1);
        snprintf(o->rid, sizeof(o->rid), "%s", r->rid);
        o->p = p;
        o->cur.at = cursor;
        o->sock = req_socket(r);
        o->first = first;
        o->follow = follow;
        o->t0 = time_now_mono_ms();
        o->max_bytes = stream_max_bytes();
        struct MHD_Response *resp =
                MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, OUTPUT_BLOCK, output_reader, o, output_stream_free);
        if (!resp) {
                output_stream_free(o);
                return reply_internal(r);
        }
        return reply_response(r, 200, resp, "application/x-ndjson");
}

/* Starts a process for an exec or spawn body. */
int api_process_start(Req *r, const ExecRequest *q, Proc **ret, bool *ret_replayed, ApiError *e) {
        if (r->idem_replay) {
                /* The key started a process before: the same one again. */
                _cleanup_json_ json_t *rec = json_loads(r->idem_replay, 0, NULL);
                const char *id = json_string_value(json_object_get(rec, "processId"));
                Proc *p = id ? proc_find(r->app->procs, r->key.owner, r->route.sandbox_id, id) : NULL;
                if (!p)
                        return api_error(e, 409, "conflict", "use a new Idempotency-Key",
                                         "the process this Idempotency-Key started is no longer kept");
                *ret = p;
                *ret_replayed = true;
                return 0;
        }
        Sandbox *sb;
        int rc = api_sandbox_acquire(r, &sb, e);
        if (rc < 0)
                return rc;
        _cleanup_json_ json_t *areq = api_exec_request(q, sb);
        if (!areq) {
                sandbox_release(sb);
                return -ENOMEM;
        }
        ProcSpec spec = {
                .owner = r->key.owner,
                .user = sandbox_runs_as_root(sb, q->user) ? REQ_USER_ROOT : REQ_USER_SANDBOX,
                .base64 = q->base64,
                .stdin_pipe = q->stdin_pipe,
                .pty = q->pty,
                .pty_cols = q->pty_cols,
                .pty_rows = q->pty_rows,
                .stdin_data = q->stdin_data,
                .stdin_len = q->stdin_len,
        };
        SandboxError se;
        if (proc_start(r->app->procs, sb, areq, &spec, ret, &se) < 0)
                return api_sandbox_error(&se, e);
        *ret_replayed = false;
        _cleanup_json_ json_t *rec = json_pack("{s:s}", "processId", proc_id(*ret));
        _cleanup_free_ char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
        if (text)
                req_idem_record(r, text);
        return 0;
}

/* The API's sandbox object for a row. */
json_t *api_sandbox_json(Manager *m, const SandboxRow *r) {
        const SandboxSpec *spec = &r->spec;
        _cleanup_json_ json_t *labels = json_loads(r->labels, 0, NULL);
        if (!labels)
                return NULL;
        uint64_t per_hour = sandbox_row_cost_per_hour(m, r);
        int64_t now = time_now_unix();
        int64_t run_seconds = sandbox_row_run_seconds(r, now);
        uint64_t cost = sandbox_row_cost(m, r, now);
        json_t *j = json_pack("{s:s,s:o,s:O,s:s,s:s,s:s,s:i,s:i,s:i,s:O,s:I,s:s,s:o,s:o,s:o,s:o,s:I,s:I,s:o,s:o}",
                              "id", r->id, "name", r->name ? json_string(r->name) : json_null(), "labels", labels,
                              "state", sandbox_state_name(r->state), "driver", sandbox_driver_name(spec->driver) ?: "",
                              "image", spec->image ? spec->image : "", "vcpu", (int)spec->vcpu, "memoryMiB",
                              (int)spec->memory_mib, "diskMiB", (int)spec->disk_mib, "network",
                              spec->network ? spec->network : json_null(), "timeoutSeconds",
                              (json_int_t)spec->timeout_seconds, "onLeaseEnd", lease_end_name(spec->on_lease_end),
                              "createdAt", json_time_ms_or_null(r->created_at, r->created_msec), "startedAt",
                              json_time_ms_or_null(r->started_at, r->started_msec), "stoppedAt",
                              json_time_or_null(r->stopped_at),
                              "leaseEndsAt", json_time_or_null(r->lease_ends_at), "costMicrosPerHour",
                              (json_int_t)per_hour, "costMicros", (json_int_t)cost, "maxCostMicros",
                              spec->max_cost_micros >= 0 ? json_integer(spec->max_cost_micros) : json_null(),
                              "failureReason", r->failure_reason ? json_string(r->failure_reason) : json_null());
        /* The lifecycle's fields: a paused sandbox costs its disk only. endsAt is the name the
         * published client (and its E2B drop-in's end_at) reads for when the sandbox's time
         * limit ends: the lease's end, null while there is none running. */
        if (j && (json_object_set_new(j, "pausedAt", json_time_or_null(spec->paused_at)) < 0 ||
                  json_object_set_new(j, "endsAt", json_time_or_null(r->lease_ends_at)) < 0 ||
                  json_object_set_new(j, "idlePauseSeconds", json_integer(spec->idle_pause_seconds)) < 0 ||
                  json_object_set_new(j, "autoWake", json_boolean(spec->auto_wake)) < 0 ||
                  json_object_set_new(j, "pausable", json_boolean(spec->pausable)) < 0 ||
                  json_object_set_new(j, "runSeconds", json_integer(run_seconds)) < 0 ||
                  json_object_set_new(j, "maxTotalCostMicros",
                                      spec->max_total_cost_micros >= 0 ? json_integer(spec->max_total_cost_micros)
                                                                       : json_null()) < 0 ||
                  json_object_set(j, "secrets", spec->secrets ? spec->secrets : json_null()) < 0 ||
                  json_object_set_new(j, "user", json_string(r->run_as_root ? REQ_USER_ROOT : REQ_USER_SANDBOX)) < 0)) {
                json_decref(j);
                return NULL;
        }
        return j;
}

enum MHD_Result api_reply_store_error(Req *r, int rc, const char *what) {
        ApiError e;
        log_error(r->rid, "%s: %s", what, strerror(-rc));
        if (rc == -ENOTCONN || rc == -ETIMEDOUT || rc == -EBUSY)
                api_error(&e, 503, "unavailable", "try again", "the store did not answer");
        else
                api_error(&e, 500, "internal", "the daemon's log has details", "could not %s", what);
        return reply_error(r, &e);
}

enum MHD_Result api_reply_invalid(Req *r, const char *hint, const char *msg) {
        ApiError e;
        api_error(&e, 400, "invalid_request", hint, "%s", msg);
        return reply_error(r, &e);
}

enum MHD_Result api_reply_not_offered(Req *r, const char *what) {
        ApiError e;
        api_error(&e, 503, "unavailable", NULL, "%s not offered by this daemon", what);
        return reply_error(r, &e);
}

int api_page_query(Req *r, unsigned def, unsigned max, unsigned *ret_limit, int64_t *ret_before, ApiError *e) {
        return api_page_query_as(r, "cursor", def, max, ret_limit, ret_before, e);
}

int api_page_query_as(Req *r, const char *cursor_name, unsigned def, unsigned max, unsigned *ret_limit,
                      int64_t *ret_before, ApiError *e) {
        *ret_limit = def;
        *ret_before = 0;
        const char *l = req_query(r, "limit");
        if (l) {
                char *end;
                long v = strtol(l, &end, 10);
                if (*l == '\0' || *end || v < 1 || v > (long)max)
                        return api_error(e, 400, "invalid_request", NULL, "limit must be an integer from 1 to %u",
                                         max);
                *ret_limit = (unsigned)v;
        }
        const char *cursor = req_query(r, cursor_name);
        if (cursor) {
                char *end;
                long long v = strtoll(cursor, &end, 10);
                if (*cursor == '\0' || *end || v < 1 || strlen(cursor) > 19)
                        return api_error(e, 400, "invalid_request", "pass back what the page before gave for it",
                                         "%s is not one this server gave", cursor_name);
                *ret_before = v;
        }
        return 0;
}

json_t *api_page_json(json_t *data, unsigned limit, int64_t last_seq) {
        json_t *next = json_null();
        if (json_array_size(data) > limit) {
                json_array_remove(data, limit);
                char buf[24];
                snprintf(buf, sizeof buf, "%lld", (long long)last_seq);
                next = json_string(buf);
        }
        return json_pack("{s:o,s:o,s:b}", "data", data, "nextCursor", next, "hasMore", !json_is_null(next));
}

void api_audit_command(Req *r, const ExecRequest *q) {
        if (q->command) {
                req_audit_note(r, "command", q->command);
                return;
        }
        char *line = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&line, &len);
        if (!f)
                return;
        size_t i;
        json_t *v;
        json_array_foreach(q->argv, i, v) {
                if (len > 4 * AUDIT_DETAIL_MAX)
                        break;
                fprintf(f, "%s%s", i ? " " : "", json_string_value(v) ? json_string_value(v) : "");
                fflush(f);
        }
        if (fclose(f) == 0)
                req_audit_note(r, "command", line);
        free(line);
}

bool api_filter_ok(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > 64)
                return false;
        for (const char *c = s; *c; c++)
                if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
                      *c == '_' || *c == '-'))
                        return false;
        return true;
}
