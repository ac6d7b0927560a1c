/* The terminal route: the WebSocket handshake, then a thread per terminal
 * between the client's socket and its PTY process. */
#include "daemon/api/api_terminal.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "common/log.h"
#include "daemon/manager/process.h"
#include "daemon/http/request.h"
#include "daemon/http/websocket.h"
#include "daemon/http/ws_session.h"

#define POLL_MS 250

typedef struct Terminal {
        WsSession s;     /* first: the session's callbacks get it */
        Proc *p;         /* NULL: err says why, sent after the upgrade */
        ApiError err;
        bool attached;   /* processId: the process outlives the terminal */
        unsigned cols, rows;

        /* Under s.lock: */
        bool ended; /* the process ended and its exit was queued */
        /* The close to send once every queued message is out: a close frame
         * would overtake them (control frames go first). */
        uint16_t close_code;
        const char *close_reason;
        bool pump_started;
        pthread_t pump;
} Terminal;

static WsSessionList open_terminals = WS_SESSION_LIST_INIT(TERMINAL_MAX_OPEN, TERMINAL_MAX_OPEN_PER_OWNER);

/* ---- parsing ---- */

static int parse_side(const char *s, const char *name, unsigned def, unsigned *ret, ApiError *e) {
        if (!s) {
                *ret = def;
                return 0;
        }
        unsigned v = 0;
        size_t n = strlen(s);
        if (n == 0 || n > 4)
                goto bad;
        for (size_t i = 0; i < n; i++) {
                if (s[i] < '0' || s[i] > '9')
                        goto bad;
                v = v * 10 + (unsigned)(s[i] - '0');
        }
        if (v < 1 || v > REQ_MAX_PTY_SIDE)
                goto bad;
        *ret = v;
        return 0;
bad:
        return api_error(e, 400, "invalid_request", NULL, "%s must be an integer between 1 and %d", name,
                         REQ_MAX_PTY_SIDE);
}

int terminal_parse_query(const char *cols, const char *rows, const char *command, size_t command_len,
                         const char *cwd, size_t cwd_len, const char *user, const char *process_id,
                         TerminalQuery *ret, ApiError *e) {
        TerminalQuery q = { 0 };
        int r;
        if ((r = parse_side(cols, "cols", 80, &q.cols, e)) < 0 || (r = parse_side(rows, "rows", 24, &q.rows, e)) < 0)
                return r;
        if (command) {
                if (command_len == 0 || command_len > TERMINAL_MAX_COMMAND || memchr(command, '\0', command_len))
                        return api_error(e, 400, "invalid_request", NULL,
                                         "command must be 1 to %d bytes without NUL", TERMINAL_MAX_COMMAND);
                q.command = command;
                q.command_len = command_len;
        }
        if ((r = request_parse_user_text(user, &q.user, e)) < 0)
                return r;
        if (process_id) {
                size_t n = strlen(process_id);
                bool ok = n == HTTP_PROCESS_ID_LEN && strncmp(process_id, "proc_", 5) == 0;
                for (size_t i = 5; ok && i < n; i++)
                        ok = (process_id[i] >= '0' && process_id[i] <= '9') || (process_id[i] >= 'a' && process_id[i] <= 'f');
                if (!ok)
                        return api_error(e, 400, "invalid_request", "list them: GET /v1/sandboxes/{id}/processes",
                                         "processId must be a process id (proc_ and 16 hex digits)");
                if (command || cwd || user)
                        return api_error(e, 400, "invalid_request", NULL,
                                         "processId attaches to a running terminal: command, cwd and user are its own");
                memcpy(q.process_id, process_id, n + 1);
        }
        if (cwd && (r = request_resolve_path(cwd, cwd_len, "cwd", &q.cwd, e)) < 0)
                return r;
        if (!q.cwd && !(q.cwd = strdup("/workspace")))
                return -ENOMEM;
        *ret = q;
        return 0;
}

void terminal_query_done(TerminalQuery *q) {
        free(q->cwd);
        q->cwd = NULL;
}

TerminalControlKind terminal_parse_control(const uint8_t *data, size_t len, unsigned *ret_cols, unsigned *ret_rows) {
        if (!json_depth_ok(data, len, 4))
                return TERMINAL_CONTROL_IGNORED;
        json_error_t err;
        _cleanup_json_ json_t *o = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &err);
        const char *type = o ? json_string_value(json_object_get(o, "type")) : NULL;
        if (!type || strcmp(type, "resize") != 0)
                return TERMINAL_CONTROL_IGNORED;
        json_t *c = json_object_get(o, "cols"), *w = json_object_get(o, "rows");
        if (!json_is_integer(c) || !json_is_integer(w))
                return TERMINAL_CONTROL_IGNORED;
        json_int_t cols = json_integer_value(c), rows = json_integer_value(w);
        if (cols < 1 || cols > REQ_MAX_PTY_SIDE || rows < 1 || rows > REQ_MAX_PTY_SIDE)
                return TERMINAL_CONTROL_IGNORED;
        *ret_cols = (unsigned)cols;
        *ret_rows = (unsigned)rows;
        return TERMINAL_CONTROL_RESIZE;
}

/* ---- the session ---- */

static void terminal_free(WsSession *s) {
        Terminal *t = (Terminal *)s;
        proc_unref(t->p);
        ws_session_destroy(&t->s);
        free(t);
}

/* Keys and resizes from the client, under t->s.lock (wslay calls this from
 * ws_conn_read). Input goes to the process at once: a process that does not
 * read its terminal holds up this one terminal's input for at most the
 * write's own bound. */
static void on_message(void *userdata, bool text, const uint8_t *data, size_t len) {
        Terminal *t = userdata;
        SandboxError se;
        if (!t->p || t->ended)
                return;
        if (text) {
                unsigned cols, rows;
                if (terminal_parse_control(data, len, &cols, &rows) == TERMINAL_CONTROL_RESIZE)
                        (void)proc_resize(t->p, cols, rows, &se);
                return;
        }
        uint64_t at;
        (void)proc_write(t->p, data, len, -1, false, &at, &se);
}

/* The process's output to the client, in its own thread: reading the ring
 * blocks, reading the socket must not. */
static void *pump(void *arg) {
        Terminal *t = arg;
        ProcCursor cur = { 0 };
        pthread_mutex_lock(&t->s.lock);
        while (!t->s.stop) {
                while (!t->s.stop && ws_conn_queued(t->s.ws) > WS_SESSION_OUT_HIGH)
                        pthread_cond_wait(&t->s.drained, &t->s.lock);
                if (t->s.stop)
                        break;
                pthread_mutex_unlock(&t->s.lock);
                ProcEvent ev;
                int r = proc_next_event(t->p, &cur, POLL_MS, &ev);
                pthread_mutex_lock(&t->s.lock);
                if (r == -EAGAIN)
                        continue;
                if (r < 0)
                        break;
                if (ev.kind == PROC_EV_OUTPUT) {
                        (void)ws_conn_send(t->s.ws, false, ev.data, ev.len);
                        free(ev.data);
                } else if (ev.kind == PROC_EV_TRUNCATED) {
                        ws_session_send_json_locked(&t->s, json_pack("{s:s,s:I,s:I}", "type", "truncated", "dropped",
                                                      (json_int_t)ev.dropped, "resumeAt", (json_int_t)ev.resume_at));
                } else {
                        ws_session_send_json_locked(&t->s, api_process_exit_event(&ev.exit));
                        t->close_code = WS_CLOSE_NORMAL;
                        t->close_reason = "the process ended";
                        t->ended = true;
                }
                ws_session_wake(&t->s);
                if (t->ended)
                        break;
        }
        pthread_mutex_unlock(&t->s.lock);
        proc_cursor_done(t->p, &cur);
        return NULL;
}

/* The client left or broke the protocol: a terminal started here hangs up
 * as a real one does (SIGHUP to its group), and is killed if it does not
 * end. An attached process goes on. */
static void hang_up(Terminal *t) {
        SandboxError se;
        if (t->attached || !t->p || proc_ended(t->p))
                return;
        if (proc_signal(t->p, SIGHUP, &se) == 0 && proc_wait(t->p, WS_SESSION_CLOSE_WAIT_MS))
                return;
        (void)proc_signal(t->p, SIGKILL, &se);
}

static void run(WsSession *s) {
        Terminal *t = (Terminal *)s;
        pthread_mutex_lock(&t->s.lock);
        ws_session_start_locked(&t->s);
        if (!t->p) {
                ws_session_send_error_locked(&t->s, &t->err);
                t->close_code = t->err.status >= 500 ? WS_CLOSE_INTERNAL : WS_CLOSE_POLICY;
        } else {
                ProcInfo info;
                proc_info(t->p, &info);
                ws_session_send_json_locked(&t->s, json_pack("{s:s,s:s,s:i,s:i}", "type", "ready", "processId",
                                                             info.id, "cols", (int)info.pty_cols, "rows",
                                                             (int)info.pty_rows));
                if (pthread_create(&t->pump, NULL, pump, t) == 0)
                        t->pump_started = true;
                else {
                        (void)ws_conn_close(t->s.ws, WS_CLOSE_INTERNAL, NULL);
                        t->s.stop = true;
                }
        }
        for (;;) {
                if (t->close_code && !ws_conn_want_write(t->s.ws) && !ws_conn_close_sent(t->s.ws)) {
                        (void)ws_conn_close(t->s.ws, t->close_code, t->close_reason);
                        t->close_code = 0;
                }
                if (!ws_session_pump_locked(&t->s, POLL_MS))
                        break;
        }
        bool ended = t->ended;
        ws_session_end_locked(&t->s);
        pthread_mutex_unlock(&t->s.lock);
        if (t->pump_started)
                pthread_join(t->pump, NULL);
        if (!ended)
                hang_up(t);
}

/* A terminal that never ran: a process started for it goes. */
static void abandon(WsSession *s) {
        Terminal *t = (Terminal *)s;
        if (!t->attached && t->p) {
                SandboxError se;
                (void)proc_signal(t->p, SIGKILL, &se);
        }
}

static const WsSessionOps terminal_ops = {
        .what = "terminal",
        .max_message = TERMINAL_MAX_MESSAGE,
        .on_message = on_message,
        .run = run,
        .abandon = abandon,
        .free = terminal_free,
};

/* ---- the route ---- */

/* The process the terminal shows: a new PTY process, or the running one
 * processId names. */
static int open_process(Req *r, const TerminalQuery *q, Terminal *t, ApiError *e) {
        if (q->process_id[0]) {
                SandboxRow row;
                SandboxError se;
                if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se) < 0)
                        return api_sandbox_error(&se, e);
                sandbox_row_done(&row);
                Proc *p = proc_find(r->app->procs, r->key.owner, r->route.sandbox_id, q->process_id);
                if (!p)
                        return api_error(e, 404, "not_found", "list them: GET /v1/sandboxes/{id}/processes",
                                         "no process %s in sandbox %s", q->process_id, r->route.sandbox_id);
                ProcInfo info;
                proc_info(p, &info);
                if (!info.pty || proc_ended(p)) {
                        proc_unref(p);
                        return api_error(e, 409, "conflict", "spawn a process with pty, or open a new terminal",
                                         "process %s %s", q->process_id,
                                         info.pty ? "has ended" : "has no terminal");
                }
                t->p = p;
                t->attached = true;
                return 0;
        }
        ExecRequest x = {
                .cwd = q->cwd,
                .env = json_object(),
                .timeout_ms = REQ_MAX_EXEC_TIMEOUT_MS,
                .user = q->user,
                .stdin_pipe = true,
                .pty = true,
                .pty_cols = q->cols,
                .pty_rows = q->rows,
        };
        if (!x.env)
                return -ENOMEM;
        if (q->command)
                x.command = strndup(q->command, q->command_len);
        else
                x.argv = json_pack("[s,s]", "bash", "-l");
        int rc = -ENOMEM;
        bool replayed;
        if (x.command || x.argv)
                rc = api_process_start(r, &x, &t->p, &replayed, e);
        free(x.command);
        json_decref(x.argv);
        json_decref(x.env);
        return rc;
}

enum MHD_Result handle_terminal(Req *r) {
        ApiError e = { 0 };
        char accept[29];
        if (api_websocket_handshake(r, "open it with a WebSocket client (withruntime's terminal())", accept, &e) < 0)
                return reply_error(r, &e);
        Terminal *t = (Terminal *)ws_session_new(sizeof(*t), &terminal_ops, &open_terminals, r->key.owner, r->rid);
        if (!t)
                return reply_internal(r);
        WsAdmit room = ws_session_admit(&t->s);
        /* Past the upgrade, errors go to the client as an error message and
         * a close: that is where the published client reads them. */
        if (room == WS_REFUSED_OWNER)
                api_error(&t->err, 429, "rate_limited", "close one of your terminals first",
                          "you have %d terminals open, the most one owner may", TERMINAL_MAX_OPEN_PER_OWNER);
        else if (room != WS_ADMITTED)
                api_error(&t->err, 429, "rate_limited", "close a terminal first", "this server has %d terminals open",
                          TERMINAL_MAX_OPEN);
        else {
                const char *command = NULL, *cwd = NULL;
                size_t command_len = 0, cwd_len = 0;
                bool has_command = req_query_n(r, "command", &command, &command_len);
                bool has_cwd = req_query_n(r, "cwd", &cwd, &cwd_len);
                TerminalQuery q;
                int rc = terminal_parse_query(req_query(r, "cols"), req_query(r, "rows"), has_command ? command : NULL,
                                              command_len, has_cwd ? cwd : NULL, cwd_len, req_query(r, "user"),
                                              req_query(r, "processId"), &q, &t->err);
                if (rc == 0) {
                        rc = open_process(r, &q, t, &t->err);
                        terminal_query_done(&q);
                }
                if (rc < 0 && !t->err.code)
                        api_error(&t->err, 500, "internal", NULL, "the terminal could not be opened");
        }
        return ws_session_upgrade(r, &t->s, accept);
}

void terminal_close_all(void) {
        ws_session_close_all(&open_terminals);
}
