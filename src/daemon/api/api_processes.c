/* The process routes: JSON in, the process table (process.c), JSON or
 * NDJSON out. */
#include "daemon/api/api_processes.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "daemon/api/api.h"
#include "daemon/manager/process.h"
#include "daemon/http/request.h"

#define WAIT_MAX_MS 60000

/* The route's process, for the request's key: the sandbox first, so that
 * another owner's sandbox, or a deleted one, is a 404 for its processes too. */
static int find(Req *r, Proc **ret, ApiError *e) {
        SandboxRow row;
        SandboxError se;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se) < 0)
                return api_sandbox_error(&se, e);
        sandbox_row_done(&row);
        Proc *p = proc_find(r->app->procs, r->key.owner, r->route.sandbox_id, r->route.proc_id);
        if (!p)
                return api_error(e, 404, "not_found", "list them: GET /v1/sandboxes/{id}/processes",
                                 "no process %s in sandbox %s", r->route.proc_id, r->route.sandbox_id);
        *ret = p;
        return 0;
}

static json_t *info_json(Proc *p) {
        ProcInfo info;
        proc_info(p, &info);
        return api_process_json(&info);
}

/* Answers the process (and drops the reference) or the error. */
static enum MHD_Result answer(Req *r, int rc, Proc *p, ApiError *e, unsigned status) {
        json_t *j = rc == 0 ? info_json(p) : NULL;
        proc_unref(p);
        return reply_result(r, rc == 0 && !j ? -ENOMEM : rc, j, e, status);
}

static int list_append(void *userdata, const ProcInfo *info) {
        json_t *j = api_process_json(info);
        return j && json_array_append_new(userdata, j) == 0 ? 0 : -ENOMEM;
}

enum MHD_Result handle_proc_list(Req *r) {
        ApiError e = { 0 };
        SandboxRow row;
        SandboxError se;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &row, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        sandbox_row_done(&row);
        json_t *data = json_array();
        int rc = data ? proc_list(r->app->procs, r->key.owner, r->route.sandbox_id, list_append, data) : -ENOMEM;
        json_t *j = rc == 0 ? json_pack("{s:o}", "data", data) : NULL;
        if (rc < 0)
                json_decref(data);
        return reply_result(r, j ? 0 : -ENOMEM, j, &e, 200);
}

enum MHD_Result handle_proc_spawn(Req *r) {
        ApiError e = { 0 };
        ExecRequest q;
        if (request_parse_spawn(r->json, &q, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        api_audit_command(r, &q);
        Proc *p = NULL;
        bool replayed = false;
        int rc = api_process_start(r, &q, &p, &replayed, &e);
        exec_request_done(&q);
        json_t *j = rc == 0 ? info_json(p) : NULL;
        if (j && replayed)
                json_object_set_new(j, "replayed", json_true());
        proc_unref(p);
        return reply_result(r, rc == 0 && !j ? -ENOMEM : rc, j, &e, replayed ? 200 : 201);
}

enum MHD_Result handle_proc_get(Req *r) {
        ApiError e = { 0 };
        Proc *p = NULL;
        int rc = find(r, &p, &e);
        return answer(r, rc, p, &e, 200);
}

enum MHD_Result handle_proc_output(Req *r) {
        ApiError e = { 0 };
        uint64_t cursor;
        const char *f = req_query(r, "follow");
        if (request_parse_cursor(req_query(r, "cursor"), &cursor, &e) < 0)
                return reply_error(r, &e);
        if (f && strcmp(f, "true") != 0 && strcmp(f, "false") != 0 && strcmp(f, "1") != 0 && strcmp(f, "0") != 0) {
                api_error(&e, 400, "invalid_request", NULL, "follow must be true or false");
                return reply_error(r, &e);
        }
        Proc *p;
        if (find(r, &p, &e) < 0)
                return reply_error(r, &e);
        bool follow = f && (strcmp(f, "true") == 0 || strcmp(f, "1") == 0);
        return api_process_output(r, p, cursor, follow, NULL);
}

enum MHD_Result handle_proc_write(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ uint8_t *data = NULL;
        size_t len;
        int64_t offset;
        bool eof;
        uint64_t at = 0;
        if (request_parse_proc_write(r->json, &data, &len, &offset, &eof, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        Proc *p = NULL;
        int rc = find(r, &p, &e);
        if (rc == 0) {
                SandboxError se;
                if ((rc = proc_write(p, data, len, offset, eof, &at, &se)) < 0)
                        api_sandbox_error(&se, &e);
        }
        proc_unref(p);
        json_t *j = rc == 0 ? json_pack("{s:I}", "offset", (json_int_t)at) : NULL;
        return reply_result(r, rc == 0 && !j ? -ENOMEM : rc, j, &e, 200);
}

enum MHD_Result handle_proc_signal(Req *r) {
        ApiError e = { 0 };
        int signo;
        if (request_parse_signal(r->json, &signo, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        Proc *p = NULL;
        int rc = find(r, &p, &e);
        if (rc == 0) {
                SandboxError se;
                if ((rc = proc_signal(p, signo, &se)) < 0)
                        api_sandbox_error(&se, &e);
        }
        return answer(r, rc, p, &e, 200);
}

/* A PTY process's terminal size, as the terminal WebSocket's resize message
 * sets it: the agent gets the same event. Answers the process with its new
 * size; one without a terminal, or that ended, is a 409. */
enum MHD_Result handle_proc_resize(Req *r) {
        ApiError e = { 0 };
        unsigned cols, rows;
        if (request_parse_resize(r->json, &cols, &rows, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        Proc *p = NULL;
        int rc = find(r, &p, &e);
        if (rc == 0) {
                SandboxError se;
                if ((rc = proc_resize(p, cols, rows, &se)) < 0)
                        api_sandbox_error(&se, &e);
        }
        return answer(r, rc, p, &e, 200);
}

enum MHD_Result handle_proc_wait(Req *r) {
        ApiError e = { 0 };
        int64_t ms = WAIT_MAX_MS;
        json_t *t = json_object_get(r->json, "timeoutMs");
        if (t && (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > WAIT_MAX_MS)) {
                api_error(&e, 400, "invalid_request", NULL, "timeoutMs must be an integer 0..60000");
                return reply_error(r, &e);
        }
        if (t)
                ms = json_integer_value(t);
        Proc *p = NULL;
        int rc = find(r, &p, &e);
        if (rc == 0)
                proc_wait(p, (int)ms);
        return answer(r, rc, p, &e, 200);
}
