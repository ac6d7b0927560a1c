/* The terminal route: the WebSocket handshake, then a thread per terminal
 * between the client's socket and its PTY process. */
#include "daemon/api_terminal.h"

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
#include "daemon/api.h"
#include "daemon/log.h"
#include "daemon/process.h"
#include "daemon/request.h"
#include "daemon/websocket.h"

/* Output queued for a client beyond this stops reading the process's ring
 * until it drains: a client that does not read holds up its own terminal
 * only (the ring, bounded, reports what it dropped). */
#define OUT_HIGH (1024u * 1024u)
#define POLL_MS 250
/* How long a close handshake, or a hung-up process, is waited for. */
#define CLOSE_WAIT_MS 2000

typedef struct Terminal {
        struct Terminal *next;
        char rid[24];
        Proc *p;         /* NULL: err says why, sent after the upgrade */
        ApiError err;
        bool attached;   /* processId: the process outlives the terminal */
        unsigned cols, rows;
        int sock;
        struct MHD_UpgradeResponseHandle *urh;
        uint8_t *extra;
        size_t extra_len;

        pthread_mutex_t lock; /* ws, stop, ended */
        pthread_cond_t drained;
        WsConn *ws;
        int wake[2];
        bool stop;  /* the session is ending: the pump stops */
        bool ended; /* the process ended and its exit was queued */
        /* The close to send once every queued message is out: a close frame
         * would overtake them (control frames go first). */
        uint16_t close_code;
        const char *close_reason;
        bool pump_started;
        pthread_t pump;
} Terminal;

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t open_cond = PTHREAD_COND_INITIALIZER;
static Terminal *open_list;
static unsigned open_count;
static bool closing_all;

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
        if ((r = request_parse_user_text(user, &q.root, e)) < 0)
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

static void terminal_free(Terminal *t) {
        if (!t)
                return;
        proc_unref(t->p);
        ws_conn_free(t->ws);
        free(t->extra);
        for (int i = 0; i < 2; i++)
                if (t->wake[i] >= 0)
                        close(t->wake[i]);
        pthread_mutex_destroy(&t->lock);
        pthread_cond_destroy(&t->drained);
        free(t);
}

static void wake(Terminal *t) {
        (void)!write(t->wake[1], "x", 1);
}

/* Under t->lock. */
static void send_json_locked(Terminal *t, json_t *j) {
        _cleanup_free_ char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (s)
                (void)ws_conn_send(t->ws, true, s, strlen(s));
}

static void send_error_locked(Terminal *t, const ApiError *e) {
        json_t *body = api_error_json(e, t->rid);
        send_json_locked(t, body ? json_pack("{s:s,s:O}", "type", "error", "error", json_object_get(body, "error"))
                                 : NULL);
        json_decref(body);
}

/* Keys and resizes from the client, under t->lock (wslay calls this from
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
        pthread_mutex_lock(&t->lock);
        while (!t->stop) {
                while (!t->stop && ws_conn_queued(t->ws) > OUT_HIGH)
                        pthread_cond_wait(&t->drained, &t->lock);
                if (t->stop)
                        break;
                pthread_mutex_unlock(&t->lock);
                ProcEvent ev;
                int r = proc_next_event(t->p, &cur, POLL_MS, &ev);
                pthread_mutex_lock(&t->lock);
                if (r == -EAGAIN)
                        continue;
                if (r < 0)
                        break;
                if (ev.kind == PROC_EV_OUTPUT) {
                        (void)ws_conn_send(t->ws, false, ev.data, ev.len);
                        free(ev.data);
                } else if (ev.kind == PROC_EV_TRUNCATED) {
                        send_json_locked(t, json_pack("{s:s,s:I,s:I}", "type", "truncated", "dropped",
                                                      (json_int_t)ev.dropped, "resumeAt", (json_int_t)ev.resume_at));
                } else {
                        send_json_locked(t, api_process_exit_event(&ev.exit));
                        t->close_code = WS_CLOSE_NORMAL;
                        t->close_reason = "the process ended";
                        t->ended = true;
                }
                wake(t);
                if (t->ended)
                        break;
        }
        pthread_mutex_unlock(&t->lock);
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
        if (proc_signal(t->p, SIGHUP, &se) == 0 && proc_wait(t->p, CLOSE_WAIT_MS))
                return;
        (void)proc_signal(t->p, SIGKILL, &se);
}

static void run(Terminal *t) {
        pthread_mutex_lock(&t->lock);
        if (t->extra_len)
                (void)ws_conn_feed(t->ws, t->extra, t->extra_len);
        if (!t->p) {
                send_error_locked(t, &t->err);
                t->close_code = t->err.status >= 500 ? WS_CLOSE_INTERNAL : WS_CLOSE_POLICY;
        } else {
                ProcInfo info;
                proc_info(t->p, &info);
                send_json_locked(t, json_pack("{s:s,s:s,s:i,s:i}", "type", "ready", "processId", info.id, "cols",
                                              (int)info.pty_cols, "rows", (int)info.pty_rows));
                if (pthread_create(&t->pump, NULL, pump, t) == 0)
                        t->pump_started = true;
                else {
                        (void)ws_conn_close(t->ws, WS_CLOSE_INTERNAL, NULL);
                        t->stop = true;
                }
        }
        uint64_t close_deadline = 0;
        bool gone = false;
        for (;;) {
                if (t->close_code && !ws_conn_want_write(t->ws) && !ws_conn_close_sent(t->ws)) {
                        (void)ws_conn_close(t->ws, t->close_code, t->close_reason);
                        t->close_code = 0;
                }
                bool rd = ws_conn_want_read(t->ws), wr = ws_conn_want_write(t->ws);
                if (ws_conn_close_sent(t->ws) && !close_deadline)
                        close_deadline = time_now_mono_ms() + CLOSE_WAIT_MS;
                if ((!rd && !wr) || gone || closing_all ||
                    (close_deadline && time_now_mono_ms() >= close_deadline))
                        break;
                pthread_mutex_unlock(&t->lock);
                struct pollfd fds[2] = {
                        { .fd = t->sock, .events = (short)((rd ? POLLIN : 0) | (wr ? POLLOUT : 0)) },
                        { .fd = t->wake[0], .events = POLLIN },
                };
                (void)poll(fds, 2, POLL_MS);
                if (fds[1].revents & POLLIN) {
                        char buf[64];
                        while (read(t->wake[0], buf, sizeof buf) > 0)
                                ;
                }
                pthread_mutex_lock(&t->lock);
                if (fds[0].revents & (POLLIN | POLLHUP | POLLERR))
                        gone = ws_conn_read(t->ws) < 0;
                if (!gone && ws_conn_want_write(t->ws))
                        gone = ws_conn_write(t->ws) < 0;
                if (ws_conn_queued(t->ws) <= OUT_HIGH / 2)
                        pthread_cond_broadcast(&t->drained);
        }
        bool ended = t->ended;
        if (!gone)
                ws_conn_linger(t->ws, 1000);
        t->stop = true;
        pthread_cond_broadcast(&t->drained);
        pthread_mutex_unlock(&t->lock);
        if (t->pump_started)
                pthread_join(t->pump, NULL);
        if (!ended)
                hang_up(t);
}

static void *session(void *arg) {
        Terminal *t = arg;
        run(t);
        MHD_upgrade_action(t->urh, MHD_UPGRADE_ACTION_CLOSE);
        pthread_mutex_lock(&open_lock);
        for (Terminal **pp = &open_list; *pp; pp = &(*pp)->next)
                if (*pp == t) {
                        *pp = t->next;
                        break;
                }
        open_count--;
        pthread_cond_broadcast(&open_cond);
        pthread_mutex_unlock(&open_lock);
        terminal_free(t);
        return NULL;
}

static void upgraded(void *cls, struct MHD_Connection *connection, void *req_cls, const char *extra_in,
                     size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh) {
        Terminal *t = cls;
        t->sock = sock;
        t->urh = urh;
        if (extra_in_size && (t->extra = malloc(extra_in_size))) {
                memcpy(t->extra, extra_in, extra_in_size);
                t->extra_len = extra_in_size;
        }
        t->ws = ws_conn_new(sock, TERMINAL_MAX_MESSAGE, on_message, t);
        pthread_attr_t attr;
        pthread_t th;
        bool started = false;
        if (t->ws && pthread_attr_init(&attr) == 0) {
                pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
                started = pthread_create(&th, &attr, session, t) == 0;
                pthread_attr_destroy(&attr);
        }
        if (started)
                return;
        log_warn(t->rid, "terminal: cannot start its thread");
        MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        if (!t->attached && t->p) {
                SandboxError se;
                (void)proc_signal(t->p, SIGKILL, &se);
        }
        pthread_mutex_lock(&open_lock);
        open_count--;
        pthread_cond_broadcast(&open_cond);
        pthread_mutex_unlock(&open_lock);
        terminal_free(t);
}

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
                .root = q->root,
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
        Terminal *t = calloc(1, sizeof(*t));
        if (!t)
                return reply_internal(r);
        t->wake[0] = t->wake[1] = -1;
        t->sock = -1;
        pthread_mutex_init(&t->lock, NULL);
        pthread_cond_init(&t->drained, NULL);
        snprintf(t->rid, sizeof t->rid, "%s", r->rid);
        if (pipe2(t->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
                terminal_free(t);
                return reply_internal(r);
        }

        pthread_mutex_lock(&open_lock);
        bool room = open_count < TERMINAL_MAX_OPEN && !closing_all;
        if (room)
                open_count++;
        pthread_mutex_unlock(&open_lock);
        /* Past the upgrade, errors go to the client as an error message and
         * a close: that is where the published client reads them. */
        if (!room)
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

        struct MHD_Response *resp = MHD_create_response_for_upgrade(upgraded, t);
        if (!resp || MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, "websocket") != MHD_YES ||
            MHD_add_response_header(resp, "Sec-WebSocket-Accept", accept) != MHD_YES) {
                if (resp)
                        MHD_destroy_response(resp);
                goto fail;
        }
        if (room) {
                pthread_mutex_lock(&open_lock);
                t->next = open_list;
                open_list = t;
                pthread_mutex_unlock(&open_lock);
        }
        if (reply_response(r, MHD_HTTP_SWITCHING_PROTOCOLS, resp, NULL) == MHD_YES)
                return MHD_YES;
        if (room) {
                pthread_mutex_lock(&open_lock);
                for (Terminal **pp = &open_list; *pp; pp = &(*pp)->next)
                        if (*pp == t) {
                                *pp = t->next;
                                break;
                        }
                pthread_mutex_unlock(&open_lock);
        }
fail:
        if (t->p && !t->attached) {
                SandboxError se;
                (void)proc_signal(t->p, SIGKILL, &se);
        }
        if (room) {
                pthread_mutex_lock(&open_lock);
                open_count--;
                pthread_mutex_unlock(&open_lock);
        }
        terminal_free(t);
        return reply_internal(r);
}

void terminal_close_all(void) {
        pthread_mutex_lock(&open_lock);
        closing_all = true;
        for (Terminal *t = open_list; t; t = t->next)
                wake(t);
        while (open_count > 0)
                pthread_cond_wait(&open_cond, &open_lock);
        pthread_mutex_unlock(&open_lock);
}
