#include "daemon/manager/agent_client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "proto/proto.h"

/* How often a wait looks at its deadline and its caller. */
#define POLL_MS 250

json_t *agent_req_exec(const char *command, json_t *argv, const char *cwd, json_t *env, int64_t timeout_ms,
                       bool has_stdin) {
        json_t *req = json_pack("{s:s,s:s,s:O,s:I,s:b}", "op", "exec", "cwd", cwd, "env", env, "timeoutMs",
                                (json_int_t)timeout_ms, "stdin", has_stdin);
        if (!req)
                return NULL;
        int r = command ? json_object_set_new(req, "command", json_string(command))
                        : json_object_set(req, "argv", argv);
        if (r < 0) {
                json_decref(req);
                return NULL;
        }
        return req;
}

int agent_req_set_user(json_t *req, bool root) {
        if (!req || json_object_set_new(req, "user", json_string(root ? "root" : "sandbox")) < 0)
                return -ENOMEM;
        return 0;
}

json_t *agent_req_forward(unsigned port) {
        return json_pack("{s:s,s:i}", "op", "forward", "port", (int)port);
}

json_t *agent_req_signal(uint32_t stream, int signo) {
        return json_pack("{s:s,s:I,s:i}", "op", "signal", "stream", (json_int_t)stream, "signal", signo);
}

json_t *agent_req_read(const char *path) {
        return json_pack("{s:s,s:s}", "op", "read", "path", path);
}

json_t *agent_req_write(const char *path, unsigned mode, bool mkdirs) {
        return json_pack("{s:s,s:s,s:i,s:b}", "op", "write", "path", path, "mode", (int)mode, "mkdirs", mkdirs);
}

json_t *agent_req_list(const char *path, unsigned depth, const char *glob, bool hidden, unsigned limit) {
        json_t *j = json_pack("{s:s,s:s,s:b,s:i}", "op", "list", "path", path, "hidden", hidden, "limit", (int)limit);
        if (j && depth > 0 && json_object_set_new(j, "depth", json_integer(depth)) < 0)
                json_decref(TAKE_PTR(j));
        if (j && glob && json_object_set_new(j, "glob", json_string(glob)) < 0)
                json_decref(TAKE_PTR(j));
        return j;
}

json_t *agent_req_archive(const char *path, bool gzip, json_t *exclude) {
        return json_pack("{s:s,s:s,s:b,s:O}", "op", "archive", "path", path, "gzip", gzip, "exclude", exclude);
}

json_t *agent_req_unarchive(const char *path, uint64_t max_bytes, uint64_t max_entries) {
        return json_pack("{s:s,s:s,s:I,s:I}", "op", "unarchive", "path", path, "maxBytes", (json_int_t)max_bytes,
                         "maxEntries", (json_int_t)max_entries);
}

json_t *agent_req_checkpoint(void) {
        return json_pack("{s:s}", "op", "checkpoint");
}

json_t *agent_req_stat(const char *path) {
        return json_pack("{s:s,s:s}", "op", "stat", "path", path);
}

json_t *agent_req_watch(const char *path, bool recursive, unsigned max_watches) {
        return json_pack("{s:s,s:s,s:b,s:I}", "op", "watch", "path", path, "recursive", recursive, "maxWatches",
                         (json_int_t)max_watches);
}

json_t *agent_req_mkdir(const char *path, bool parents) {
        return json_pack("{s:s,s:s,s:b}", "op", "mkdir", "path", path, "parents", parents);
}

json_t *agent_req_mount(const char *path, const char *name, bool read_only) {
        return json_pack("{s:s,s:s,s:s,s:b}", "op", "mount", "path", path, "name", name, "readOnly", read_only);
}

json_t *agent_req_unmount(const char *path) {
        return json_pack("{s:s,s:s}", "op", "unmount", "path", path);
}

json_t *agent_req_remove(const char *path, bool recursive) {
        return json_pack("{s:s,s:s,s:b}", "op", "remove", "path", path, "recursive", recursive);
}

json_t *agent_req_rename(const char *from, const char *to, bool overwrite) {
        return json_pack("{s:s,s:s,s:s,s:b}", "op", "rename", "from", from, "to", to, "overwrite", overwrite);
}

const char *agent_result_error(json_t *result, const char **ret_message) {
        json_t *err = json_object_get(result, "error");
        if (!err)
                return NULL;
        if (ret_message)
                *ret_message = json_string_value(json_object_get(err, "message"));
        const char *code = json_string_value(json_object_get(err, "code"));
        return code ? code : "internal";
}

int agent_wait_result(ChanStream *s, int64_t timeout_ms, AgentGiveUpFn give_up, void *userdata, json_t **ret) {
        uint64_t deadline = time_now_mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
        _cleanup_json_ json_t *batched = NULL;
        /* The first line an exec-like op (an unarchive) printed on each of
         * stdout and stderr, bounded: its counts, or why it failed. */
        char head[2][256] = { "", "" };
        for (;;) {
                ChanEvent ev;
                int n = chan_stream_next(s, POLL_MS, &ev);
                if (n == -ETIMEDOUT) {
                        if (give_up && give_up(userdata))
                                return -ECANCELED;
                        if (time_now_mono_ms() >= deadline)
                                return -ETIMEDOUT;
                        continue;
                }
                if (n < 0 || ev.type == CHAN_EV_CLOSED) {
                        if (n == 0)
                                chan_event_clear(&ev);
                        return -ECONNRESET;
                }
                if (ev.type == CHAN_EV_DATA && (ev.fd == PROTO_FD_OUT || ev.fd == PROTO_FD_ERR)) {
                        char *h = head[ev.fd - PROTO_FD_OUT];
                        size_t have = strlen(h);
                        for (size_t i = 0; i < ev.len && have + 1 < sizeof(head[0]) && !memchr(h, '\n', have); i++)
                                h[have++] = ev.data[i] == '\n' || (ev.data[i] >= 0x20 && ev.data[i] < 0x7f) ? (char)ev.data[i] : '?';
                        h[have] = '\0';
                }
                if (ev.type == CHAN_EV_RESULT) {
                        json_t *res = TAKE_PTR(ev.json);
                        chan_event_clear(&ev);
                        for (int i = 0; i < 2; i++)
                                if (head[i][0]) {
                                        head[i][strcspn(head[i], "\n")] = '\0';
                                        json_object_set_new(res, i ? "stderrHead" : "stdoutHead", json_string(head[i]));
                                }
                        json_t *last = json_object_get(res, "entries");
                        if (batched && json_is_array(last)) {
                                json_array_extend(batched, last);
                                json_object_set(res, "entries", batched);
                        }
                        *ret = res;
                        return 0;
                }
                /* A long listing comes in EVENT batches before its RESULT. */
                json_t *batch = ev.type == CHAN_EV_EVENT ? json_object_get(ev.json, "entries") : NULL;
                if (json_is_array(batch)) {
                        if (!batched)
                                batched = json_array();
                        if (batched)
                                json_array_extend(batched, batch);
                }
                chan_event_clear(&ev);
        }
}

int agent_send_all(ChanStream *s, const void *data, size_t len, int timeout_ms) {
        int r = len ? chan_stream_write(s, data, len, timeout_ms) : 0;
        if (r == 0)
                r = chan_stream_close_write(s);
        return r;
}

int agent_read_file(Channel *c, const char *path, size_t max, int timeout_ms, char **ret, size_t *ret_len) {
        _cleanup_json_ json_t *req = agent_req_read(path);
        ChanStream *s = NULL;
        int r = req ? channel_open_stream(c, req, &s) : -ENOMEM;
        if (r < 0)
                return r;
        char *buf = NULL;
        size_t len = 0;
        r = -EIO;
        for (;;) {
                ChanEvent ev;
                if (chan_stream_next(s, timeout_ms, &ev) < 0)
                        break;
                if (ev.type == CHAN_EV_DATA) {
                        char *nb = len + ev.len <= max ? realloc(buf, len + ev.len + 1) : NULL;
                        if (!nb) {
                                chan_event_clear(&ev);
                                r = -E2BIG;
                                break;
                        }
                        buf = nb;
                        memcpy(buf + len, ev.data, ev.len);
                        len += ev.len;
                } else if (ev.type == CHAN_EV_RESULT) {
                        const char *code = agent_result_error(ev.json, NULL);
                        r = !code ? 0 : strcmp(code, "not_found") == 0 ? -ENOENT : -EIO;
                        chan_event_clear(&ev);
                        break;
                } else if (ev.type == CHAN_EV_CLOSED)
                        break;
                chan_event_clear(&ev);
        }
        chan_stream_free(s);
        if (r < 0) {
                free(buf);
                return r;
        }
        if (!buf && !(buf = malloc(1)))
                return -ENOMEM;
        buf[len] = '\0';
        *ret = buf;
        *ret_len = len;
        return 0;
}

int agent_write_begin(Channel *c, const char *path, const void *data, size_t len, int timeout_ms,
                      ChanStream **ret) {
        _cleanup_json_ json_t *req = agent_req_write(path, 0644, true);
        ChanStream *s = NULL;
        int r = req ? channel_open_stream(c, req, &s) : -ENOMEM;
        if (r < 0)
                return r;
        r = agent_send_all(s, data, len, timeout_ms);
        if (r < 0) {
                chan_stream_free(s);
                return r;
        }
        *ret = s;
        return 0;
}

int agent_write_finish(ChanStream *s, int timeout_ms) {
        _cleanup_json_ json_t *res = NULL;
        int r = agent_wait_result(s, timeout_ms, NULL, NULL, &res);
        chan_stream_free(s);
        if (r < 0 || agent_result_error(res, NULL))
                return -EIO;
        return 0;
}
