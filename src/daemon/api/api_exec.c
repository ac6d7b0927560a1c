/* POST /v1/sandboxes/{id}:exec, buffered or streamed as NDJSON. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/api/api.h"
#include "daemon/api/api_exec.h"
#include "common/log.h"
#include "daemon/manager/metrics.h"
#include "daemon/manager/output.h"
#include "daemon/http/request.h"
#include "proto/proto.h"

#define POLL_MS 250
#define STDIN_CHUNK (64u * 1024u)
#define CANCEL_GRACE_MS 5000

typedef struct ExecRun {
        char rid[24];
        Sandbox *sb;
        ChanStream *stream;
        int sock;
        uint8_t *stdin_data;
        size_t stdin_len;
        pthread_t stdin_thread;
        bool stdin_thread_started;
        atomic_bool cancelled;
        /* streamed mode */
        Utf8Holder hold[3];
        char *out;
        size_t out_len, out_off, out_cap;
        bool done;
        bool result_seen;
        char user[16]; /* who ran it, as the agent's start event says */
} ExecRun;

/* Feeds stdin to the agent. A command that never reads its stdin must not
 * block the output, so anything larger than the stream's initial credit goes
 * through this thread; the writes give up once the stream is cancelled or
 * finished. */
static void *stdin_feeder(void *userdata) {
        ExecRun *x = userdata;
        size_t off = 0;
        while (off < x->stdin_len && !atomic_load(&x->cancelled)) {
                size_t n = x->stdin_len - off > STDIN_CHUNK ? STDIN_CHUNK : x->stdin_len - off;
                int r = chan_stream_write(x->stream, x->stdin_data + off, n, 1000);
                if (r == -ETIMEDOUT)
                        continue;
                if (r < 0)
                        return NULL;
                off += n;
        }
        if (!atomic_load(&x->cancelled))
                chan_stream_close_write(x->stream);
        return NULL;
}

static int send_stdin(ExecRun *x) {
        if (x->stdin_len <= PROTO_INITIAL_WINDOW) {
                int r = x->stdin_len ? chan_stream_write(x->stream, x->stdin_data, x->stdin_len, 10000) : 0;
                if (r == 0)
                        r = chan_stream_close_write(x->stream);
                return r;
        }
        int r = pthread_create(&x->stdin_thread, NULL, stdin_feeder, x);
        if (r != 0)
                return -r;
        x->stdin_thread_started = true;
        return 0;
}

static void exec_run_free(ExecRun *x) {
        if (!x)
                return;
        if (!x->result_seen && x->stream) {
                atomic_store(&x->cancelled, true);
                chan_stream_cancel(x->stream);
        }
        if (x->stdin_thread_started) {
                atomic_store(&x->cancelled, true);
                pthread_join(x->stdin_thread, NULL);
        }
        chan_stream_free(x->stream);
        sandbox_release(x->sb);
        free(x->stdin_data);
        free(x->out);
        free(x);
}

/* The agent's RESULT says how many of the command's processes were killed
 * for memory; the API's answer carries it as the published client reads it:
 * `outOfMemory` {code, processesKilled, memoryMiB, message, hint}, absent
 * when none was. It is an event of the sandbox too. */
static int add_out_of_memory(json_t *body, json_t *result, Sandbox *sb) {
        json_int_t killed = json_integer_value(json_object_get(result, "outOfMemory"));
        if (killed <= 0 || killed > 1000000)
                return 0;
        sandbox_emit(sb, "sandbox.oom_killed", NULL,
                     json_pack("{s:I,s:I}", "processesKilled", killed, "memoryMiB",
                               (json_int_t)sandbox_memory_mib(sb)));
        json_t *oom = api_out_of_memory(killed, sandbox_memory_mib(sb));
        return oom && json_object_set_new(body, "outOfMemory", oom) == 0 ? 0 : -ENOMEM;
}


static json_t *closed_error(const char *rid, const char *id) {
        ApiError e;
        api_error(&e, 409, "conflict", "create a new sandbox", "sandbox %s stopped while the command ran", id);
        return api_error_json(&e, rid);
}

/* A stream's last line on failure: {"type":"error","error":{code,...}}, the
 * error object itself, not the {"error":...} body that wraps it elsewhere. */
static json_t *error_line(json_t *body) {
        json_t *inner = body ? json_object_get(body, "error") : NULL;
        json_t *line = inner ? json_pack("{s:s,s:O}", "type", "error", "error", inner) : NULL;
        json_decref(body);
        return line;
}

/* Waits for the RESULT after a cancel, briefly, so the process group is gone
 * before we answer. */
static void drain_after_cancel(ExecRun *x) {
        _cleanup_json_ json_t *res = NULL;
        int r = agent_wait_result(x->stream, CANCEL_GRACE_MS, NULL, NULL, &res);
        if (r == 0 || r == -ECONNRESET)
                x->result_seen = true;
}

static void observe_result(json_t *res) {
        json_int_t ms = json_integer_value(json_object_get(res, "durationMs"));
        metrics_exec_done(ms > 0 ? (uint64_t)ms : 0);
}

/* ---- buffered ---- */

/* Waits for the exec's end, its output's tail kept per stream: 0 and *ret
 * the answer's body; -EPIPE when the client left (the command cancelled);
 * -EIO with e filled; -ENOMEM. x stays the caller's. */
static int exec_collect(ExecRun *x, size_t max_out, int64_t timeout_ms, json_t **ret, ApiError *e) {
        /* The agent enforces timeoutMs; this deadline only guards against an
         * agent that stopped answering, which gets as long past the
         * timeout as its driver's heartbeat gives it to answer at all:
         * killing a fork bomb's tasks on a loaded host has taken gVisor's
         * agent 16.8 s past the timeout, namespace's more than 15 s at load
         * 190, and both went on (docs/drivers.md). */
        uint64_t deadline = time_now_mono_ms() + (uint64_t)timeout_ms + (uint64_t)sandbox_driver_heartbeat_ms(x->sb);
        int64_t paused0 = sandbox_paused_ms(x->sb); /* a pause stops the agent's clock too */
        bool wedged = false;
        TailBuf bufs[3];
        tailbuf_init(&bufs[1], max_out);
        tailbuf_init(&bufs[2], max_out);
        json_t *result = NULL;
        bool closed = false, gone = false;
        while (!result && !closed) {
                ChanEvent ev;
                int rc = chan_stream_next(x->stream, POLL_MS, &ev);
                if (rc == -ETIMEDOUT) {
                        if (socket_hung_up(x->sock)) {
                                gone = true;
                                break;
                        }
                        if (time_now_mono_ms() > deadline + (uint64_t)(sandbox_paused_ms(x->sb) - paused0)) {
                                wedged = true;
                                break;
                        }
                        continue;
                }
                if (rc < 0) {
                        closed = true;
                        break;
                }
                switch (ev.type) {
                case CHAN_EV_EVENT: {
                        const char *u = json_string_value(json_object_get(ev.json, "user"));
                        if (u && (strcmp(u, "root") == 0 || strcmp(u, "sandbox") == 0))
                                snprintf(x->user, sizeof(x->user), "%s", u);
                        break;
                }
                case CHAN_EV_DATA:
                        if (ev.fd == PROTO_FD_OUT || ev.fd == PROTO_FD_ERR)
                                tailbuf_append(&bufs[ev.fd], ev.data, ev.len);
                        break;
                case CHAN_EV_RESULT:
                        result = json_incref(ev.json);
                        x->result_seen = true;
                        break;
                case CHAN_EV_CLOSED:
                        closed = true;
                        x->result_seen = true;
                        break;
                default:
                        break;
                }
                chan_event_clear(&ev);
        }
        int rc = 0;
        if (wedged) {
                log_error(x->rid, "the agent of %s gave no result in time: failing the sandbox", sandbox_id(x->sb));
                atomic_store(&x->cancelled, true);
                chan_stream_cancel(x->stream);
                drain_after_cancel(x);
                /* An agent that cannot kill a timed-out command within the
                 * grace (a fork bomb starving it of CPU) leaves a sandbox
                 * nobody can use: it is ended rather than left half alive. */
                sandbox_fail(x->sb, "its agent stopped answering (starved or stuck)");
                api_error(e, 503, "unavailable", "create a new sandbox",
                          "the sandbox stopped answering and was stopped");
                rc = -EIO;
        } else if (gone) {
                log_info(x->rid, "client left during exec on %s: cancelling", sandbox_id(x->sb));
                atomic_store(&x->cancelled, true);
                chan_stream_cancel(x->stream);
                drain_after_cancel(x);
                rc = -EPIPE;
        } else if (closed) {
                api_error(e, 409, "conflict", "create a new sandbox", "sandbox %s stopped while the command ran",
                          sandbox_id(x->sb));
                rc = -EIO;
        } else if (agent_result_error(result, NULL)) {
                api_agent_error(result, NULL, e);
                rc = -EIO;
        } else {
                observe_result(result);
                size_t ol, el;
                char *out = tailbuf_text(&bufs[1], &ol), *err = tailbuf_text(&bufs[2], &el);
                json_t *body = NULL;
                if (out && err) {
                        json_t *ec = json_object_get(result, "exitCode");
                        body = json_pack("{s:O,s:s%,s:s%,s:b,s:b,s:b,s:I}", "exitCode", ec ? ec : json_null(),
                                         "stdout", out, ol, "stderr", err, el, "timedOut",
                                         json_is_true(json_object_get(result, "timedOut")), "stdoutTruncated",
                                         bufs[1].truncated, "stderrTruncated", bufs[2].truncated, "durationMs",
                                         (json_int_t)json_integer_value(json_object_get(result, "durationMs")));
                        if (body && x->user[0] && json_object_set_new(body, "user", json_string(x->user)) < 0)
                                json_decref(TAKE_PTR(body));
                        if (body && add_out_of_memory(body, result, x->sb) < 0)
                                json_decref(TAKE_PTR(body));
                }
                free(out);
                free(err);
                *ret = body;
                rc = body ? 0 : -ENOMEM;
        }
        json_decref(result);
        tailbuf_done(&bufs[1]);
        tailbuf_done(&bufs[2]);
        return rc;
}

/* An exec's run on sb (the reference taken): its agent stream open and its
 * stdin (taken from q) on the way. */
static int exec_start(Sandbox *sb, ExecRequest *q, int sock, const char *rid, ExecRun **ret, ApiError *e) {
        ExecRun *x = calloc(1, sizeof(*x));
        if (!x) {
                sandbox_release(sb);
                return -ENOMEM;
        }
        snprintf(x->rid, sizeof(x->rid), "%s", rid);
        x->sb = sb;
        x->sock = sock;
        atomic_init(&x->cancelled, false);
        _cleanup_json_ json_t *areq = api_exec_request(q, sb);
        if (!areq) {
                exec_run_free(x);
                return -ENOMEM;
        }
        if (api_open_stream(sb, areq, &x->stream, e) < 0) {
                exec_run_free(x);
                return -EIO;
        }
        if (q->has_stdin) {
                x->stdin_data = TAKE_PTR(q->stdin_data);
                x->stdin_len = q->stdin_len;
                int rc = send_stdin(x);
                if (rc < 0)
                        log_warn(rid, "sending stdin to %s: %s", sandbox_id(sb), strerror(-rc));
        }
        *ret = x;
        return 0;
}

int api_exec_run(Sandbox *sb, ExecRequest *q, int sock, const char *rid, json_t **ret, ApiError *e) {
        ExecRun *x;
        int rc = exec_start(sb, q, sock, rid, &x, e);
        if (rc < 0)
                return rc;
        rc = exec_collect(x, q->max_output_bytes, q->timeout_ms, ret, e);
        exec_run_free(x);
        return rc;
}

/* ---- streamed ---- */

static int push_line(ExecRun *x, json_t *j) {
        LineQueue q = { x->out, x->out_off, x->out_len, x->out_cap };
        int r = line_queue_push(&q, j);
        x->out = q.buf, x->out_off = q.off, x->out_len = q.len, x->out_cap = q.cap;
        return r;
}

static int push_text(ExecRun *x, int fd, char *text, size_t len) {
        int r = 0;
        if (len > 0)
                r = push_line(x, json_pack("{s:s,s:s%}", "type", fd == PROTO_FD_OUT ? "stdout" : "stderr", "data",
                                           text, len));
        free(text);
        return r;
}

/* Turns the next event into lines; -EPIPE when the client left. */
static int stream_step(ExecRun *x) {
        ChanEvent ev;
        int rc = chan_stream_next(x->stream, POLL_MS, &ev);
        if (rc == -ETIMEDOUT)
                return socket_hung_up(x->sock) ? -EPIPE : 0;
        if (rc < 0) {
                x->done = true;
                x->result_seen = true;
                return push_line(x, error_line(closed_error(x->rid, sandbox_id(x->sb))));
        }
        char *text;
        size_t len;
        int r = 0;
        switch (ev.type) {
        case CHAN_EV_EVENT: {
                const char *name = json_string_value(json_object_get(ev.json, "event"));
                if (name && strcmp(name, "start") == 0)
                        r = push_line(x, json_pack("{s:s,s:O}", "type", "start", "pid",
                                                   json_object_get(ev.json, "pid") ?: json_null()));
                break;
        }
        case CHAN_EV_DATA:
                if (ev.fd == PROTO_FD_OUT || ev.fd == PROTO_FD_ERR) {
                        r = utf8_holder_feed(&x->hold[ev.fd], ev.data, ev.len, &text, &len);
                        if (r == 0)
                                r = push_text(x, ev.fd, text, len);
                }
                break;
        case CHAN_EV_EOF:
                if (ev.fd == PROTO_FD_OUT || ev.fd == PROTO_FD_ERR) {
                        r = utf8_holder_flush(&x->hold[ev.fd], &text, &len);
                        if (r == 0)
                                r = push_text(x, ev.fd, text, len);
                }
                break;
        case CHAN_EV_RESULT:
                x->result_seen = true;
                x->done = true;
                for (int fd = PROTO_FD_OUT; fd <= PROTO_FD_ERR && r == 0; fd++) {
                        r = utf8_holder_flush(&x->hold[fd], &text, &len);
                        if (r == 0)
                                r = push_text(x, fd, text, len);
                }
                if (r < 0)
                        break;
                if (agent_result_error(ev.json, NULL)) {
                        ApiError e;
                        api_agent_error(ev.json, NULL, &e);
                        r = push_line(x, error_line(api_error_json(&e, x->rid)));
                } else {
                        observe_result(ev.json);
                        json_t *ec = json_object_get(ev.json, "exitCode");
                        json_int_t ms = json_integer_value(json_object_get(ev.json, "durationMs"));
                        json_t *exit = json_pack("{s:s,s:O,s:b,s:I}", "type", "exit", "exitCode", ec ?: json_null(),
                                                 "timedOut", json_is_true(json_object_get(ev.json, "timedOut")),
                                                 "durationMs", ms);
                        if (exit && add_out_of_memory(exit, ev.json, x->sb) < 0)
                                json_decref(TAKE_PTR(exit));
                        r = push_line(x, exit);
                }
                break;
        case CHAN_EV_CLOSED:
                x->result_seen = true;
                x->done = true;
                r = push_line(x, error_line(closed_error(x->rid, sandbox_id(x->sb))));
                break;
        }
        chan_event_clear(&ev);
        return r;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        ExecRun *x = cls;
        for (;;) {
                if (x->out_off < x->out_len) {
                        size_t n = x->out_len - x->out_off;
                        if (n > max)
                                n = max;
                        memcpy(buf, x->out + x->out_off, n);
                        x->out_off += n;
                        return (ssize_t)n;
                }
                if (x->done)
                        return MHD_CONTENT_READER_END_OF_STREAM;
                int r = stream_step(x);
                if (r == -EPIPE) {
                        log_info(x->rid, "client left during exec on %s: cancelling", sandbox_id(x->sb));
                        return MHD_CONTENT_READER_END_WITH_ERROR;
                }
                if (r < 0)
                        return MHD_CONTENT_READER_END_WITH_ERROR;
        }
}

static void stream_free(void *cls) {
        exec_run_free(cls);
}

enum MHD_Result handle_exec(Req *r) {
        ApiError e = { 0 };
        ExecRequest q;
        if (request_parse_exec(r->json, &q, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        api_audit_command(r, &q);
        if (q.stream) {
                /* A streamed exec is a process read from its start. */
                Proc *p;
                bool replayed;
                int rc = api_process_start(r, &q, &p, &replayed, &e);
                exec_request_done(&q);
                if (rc < 0)
                        return e.code ? reply_error(r, &e) : reply_internal(r);
                /* The start event names the pid, as it always did: the
                 * agent's start comes within milliseconds. */
                proc_wait_started(p, 10000);
                ProcInfo info;
                proc_info(p, &info);
                json_t *first = json_pack("{s:s,s:s,s:b,s:o,s:s}", "type", "start", "processId", info.id, "replayed",
                                          replayed, "pid", info.pid > 0 ? json_integer(info.pid) : json_null(),
                                          "user", info.user);
                return api_process_output(r, p, 0, true, first);
        }
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0) {
                exec_request_done(&q);
                return reply_error(r, &e);
        }
        if (!q.stream) {
                json_t *body = NULL;
                int rc = api_exec_run(sb, &q, req_socket(r), r->rid, &body, &e);
                exec_request_done(&q);
                if (rc == -EPIPE)
                        return MHD_NO;
                if (rc < 0)
                        return e.code ? reply_error(r, &e) : reply_internal(r);
                json_t *ec = json_object_get(body, "exitCode");
                if (json_is_integer(ec))
                        req_audit_note_json(r, "exitCode", json_copy(ec));
                return reply_json(r, 200, body);
        }
        ExecRun *x;
        int rc = exec_start(sb, &q, req_socket(r), r->rid, &x, &e);
        exec_request_done(&q);
        if (rc < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        struct MHD_Response *resp =
                MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_reader, x, stream_free);
        if (!resp) {
                exec_run_free(x);
                return reply_internal(r);
        }
        return reply_response(r, 200, resp, "application/x-ndjson");
}
