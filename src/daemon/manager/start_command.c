#include "daemon/manager/start_command.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/channel.h"

/* The command as the processes list shows it: its words joined, bounded. */
static void command_line(json_t *argv, char *buf, size_t len) {
        size_t at = 0, i;
        json_t *w;
        buf[0] = '\0';
        json_array_foreach(argv, i, w) {
                int n = snprintf(buf + at, len - at, "%s%s", i ? " " : "", json_string_value(w));
                if (n < 0 || (size_t)n >= len - at)
                        return;
                at += (size_t)n;
        }
}

/* A port listening, as the kernel lists sockets (LISTEN is state 0A):
 * /proc/net/tcp is read by every image's shell and grep, with no client
 * of its own in the image. */
static json_t *port_check(json_int_t port) {
        char line[160];
        snprintf(line, sizeof line, "grep -qE '^ *[0-9]+: [0-9A-F]+:%04X [0-9A-F]+:[0-9A-F]+ 0A ' /proc/net/tcp "
                 "/proc/net/tcp6 2>/dev/null", (unsigned)port);
        return json_pack("[s,s,s]", "/bin/sh", "-c", line);
}

/* One readiness check: 0 when it exited 0, 1 when it did not, negative
 * when the sandbox could not run it. */
static int check_once(Manager *m, const KeyInfo *key, const char *id, json_t *argv, const char *workdir) {
        Sandbox *sb = NULL;
        SandboxError se;
        if (sandbox_acquire(m, key, id, &sb, &se) < 0)
                return -ESRCH;
        _cleanup_json_ json_t *env = sandbox_env(sb);
        _cleanup_json_ json_t *req = agent_req_exec(NULL, argv, workdir, env, START_CHECK_MS, false);
        ChanStream *s = NULL;
        int r = req ? agent_req_set_user(req, sandbox_runs_as_root(sb, REQ_AS_DEFAULT)) : -ENOMEM;
        if (r == 0 && sandbox_open_stream(sb, req, &s, &se) < 0)
                r = -EIO;
        int code = -1;
        int64_t deadline = (int64_t)time_now_mono_ms() + START_CHECK_MS + 1000;
        while (r == 0 && (int64_t)time_now_mono_ms() < deadline) {
                ChanEvent ev;
                int n = chan_stream_next(s, 500, &ev);
                if (n == -ETIMEDOUT)
                        continue;
                if (n < 0 || ev.type == CHAN_EV_CLOSED) {
                        if (n == 0)
                                chan_event_clear(&ev);
                        r = -EIO;
                        break;
                }
                if (ev.type == CHAN_EV_RESULT) {
                        json_t *c = json_object_get(ev.json, "exitCode");
                        code = json_is_integer(c) ? (int)json_integer_value(c) : -1;
                        chan_event_clear(&ev);
                        break;
                }
                chan_event_clear(&ev);
        }
        chan_stream_free(s);
        sandbox_release(sb);
        return r < 0 ? r : code == 0 ? 0 : 1;
}

/* The last START_OUTPUT_TAIL bytes of p's output, as text (a byte that is
 * not ASCII becomes '?', so that a cut character is no bad UTF-8). */
static json_t *output_tail(Proc *p) {
        ProcInfo info;
        proc_info(p, &info);
        char buf[START_OUTPUT_TAIL + 1];
        size_t n = 0;
        ProcCursor c = { .at = info.output_bytes > START_OUTPUT_TAIL ? info.output_bytes - START_OUTPUT_TAIL : 0 };
        for (;;) {
                ProcEvent ev = { 0 };
                if (proc_next_event(p, &c, 0, &ev) < 0)
                        break;
                if (ev.kind == PROC_EV_OUTPUT)
                        for (size_t i = 0; i < ev.len && n < START_OUTPUT_TAIL; i++)
                                buf[n++] = ev.data[i] < 0x80 && (ev.data[i] >= 0x20 || ev.data[i] == '\n' ||
                                                                 ev.data[i] == '\t') ? (char)ev.data[i] : '?';
                free(ev.data);
                if (ev.kind == PROC_EV_EXIT || n >= START_OUTPUT_TAIL)
                        break;
        }
        proc_cursor_done(p, &c);
        return json_stringn(buf, n);
}

static int report(json_t *rep, const char *state, json_t *ready_ms, const char *error, Proc *p) {
        if (json_object_set_new(rep, "state", json_string(state)) < 0 ||
            json_object_set_new(rep, "readyMs", ready_ms ? ready_ms : json_null()) < 0 ||
            json_object_set_new(rep, "error", error ? json_string(error) : json_null()) < 0 ||
            json_object_set_new(rep, "output", p && strcmp(state, "failed") == 0 ? output_tail(p) : json_null()) < 0)
                return -ENOMEM;
        return 0;
}

static void exit_reason(Proc *p, char *buf, size_t len) {
        ProcInfo info;
        proc_info(p, &info);
        if (info.exit.state == PROC_FAILED)
                snprintf(buf, len, "the command could not run: %s", info.exit.reason);
        else if (info.exit.has_exit_code)
                snprintf(buf, len, "the command exited with code %d before it was ready", info.exit.exit_code);
        else
                snprintf(buf, len, "the command ended (%s) before it was ready", proc_state_name(info.exit.state));
}

int start_command_run(Manager *m, ProcTable *procs, const KeyInfo *key, const char *id, json_t *start,
                      const char *workdir, json_t **ret) {
        json_t *argv = json_object_get(start, "command");
        json_t *port = json_object_get(start, "readyPort");
        _cleanup_json_ json_t *check = json_is_integer(port) ? port_check(json_integer_value(port))
                                                              : json_incref(json_object_get(start, "readyCommand"));
        _cleanup_json_ json_t *rep = json_pack("{s:O,s:n}", "command", argv, "processId");
        if (!rep || (json_is_integer(port) && !check))
                return -ENOMEM;
        int64_t t0 = (int64_t)time_now_mono_ms();
        int64_t deadline = t0 + json_integer_value(json_object_get(start, "readyTimeoutSeconds")) * 1000;
        Sandbox *sb = NULL;
        SandboxError se;
        Proc *p = NULL;
        char line[1025];
        command_line(argv, line, sizeof line);
        int r = 0;
        _cleanup_json_ json_t *env = NULL, *req = NULL;
        if (sandbox_acquire(m, key, id, &sb, &se) < 0) {
                r = report(rep, "failed", NULL, se.message, NULL);
                goto out;
        }
        bool root = sandbox_runs_as_root(sb, REQ_AS_DEFAULT);
        env = sandbox_env(sb);
        req = agent_req_exec(NULL, argv, workdir, env, START_RUN_MS, false);
        if (!req || agent_req_set_user(req, root) < 0) {
                sandbox_release(sb);
                return -ENOMEM;
        }
        ProcSpec spec = { .owner = key->owner, .command = line, .user = root ? "root" : "sandbox" };
        if (proc_start(procs, sb, req, &spec, &p, &se) < 0) {
                r = report(rep, "failed", NULL, se.message, NULL);
                goto out;
        }
        json_object_set_new(rep, "processId", json_string(proc_id(p)));
        proc_wait_started(p, START_CHECK_MS);
        char why[384];
        if (!check) {
                /* No readiness check: it runs, unless it is already gone. */
                if (proc_ended(p)) {
                        exit_reason(p, why, sizeof why);
                        r = report(rep, "failed", NULL, why, p);
                } else
                        r = report(rep, "running", NULL, NULL, p);
                goto out;
        }
        for (;;) {
                if (proc_ended(p)) {
                        exit_reason(p, why, sizeof why);
                        r = report(rep, "failed", NULL, why, p);
                        break;
                }
                int c = check_once(m, key, id, check, workdir);
                if (c == 0) {
                        r = report(rep, "ready", json_integer((int64_t)time_now_mono_ms() - t0), NULL, p);
                        break;
                }
                if (c < 0) {
                        r = report(rep, "failed", NULL, "the sandbox could not run the readiness check", p);
                        break;
                }
                if ((int64_t)time_now_mono_ms() + START_POLL_MS > deadline) {
                        snprintf(why, sizeof why, "not ready after %lld s: %s",
                                 (long long)json_integer_value(json_object_get(start, "readyTimeoutSeconds")),
                                 json_is_integer(port) ? "nothing listens on the port" : "the ready command fails");
                        r = report(rep, "failed", NULL, why, p);
                        break;
                }
                proc_wait(p, START_POLL_MS);
        }
out:
        proc_unref(p);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(rep);
        return 0;
}
