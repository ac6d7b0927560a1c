/* The file routes: content streamed both ways, list, stat, mkdir, remove,
 * rename, each mapped onto one agent stream. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/api/api.h"
#include "daemon/api/api_files.h"
#include "common/log.h"
#include "daemon/http/request.h"
#include "proto/proto.h"

#define POLL_MS 250
/* A file operation that takes longer than this has a wedged agent. */
#define OP_TIMEOUT_MS 120000
#define WRITE_TIMEOUT_MS 120000
#define UPLOAD_MAX_DISCARD (8u * 1024u * 1024u)


/* Who a file route acts as, with that user's rights and as the owner of
 * what it makes: ?user=sandbox or root; left out, the sandbox's own user,
 * filled in as the request is sent (api_req_user). 0, a 400 in *e, or
 * -ENOMEM. */
static int with_user(Req *r, json_t *req, ApiError *e) {
        ReqUser u;
        int rc = request_parse_user_text(req_query(r, "user"), &u, e);
        if (rc < 0 || u == REQ_AS_DEFAULT)
                return rc;
        return agent_req_set_user(req, u == REQ_AS_ROOT);
}

static bool client_left(void *userdata) {
        return socket_hung_up(*(int *)userdata);
}

/* Runs one request-response op on a sandbox. 0 and *ret (the RESULT), or a
 * negative value with e filled. */
static int run_op(Req *r, Sandbox *sb, json_t *request, json_t **ret, ApiError *e) {
        ChanStream *s = NULL;
        if (api_req_user(request, sb) < 0)
                return -ENOMEM;
        if (api_open_stream(sb, request, &s, e) < 0)
                return -EINVAL;
        int sock = req_socket(r);
        int rc = agent_wait_result(s, OP_TIMEOUT_MS, client_left, &sock, ret);
        chan_stream_free(s);
        if (rc == -ECANCELED)
                rc = -EPIPE;
        if (rc == -ETIMEDOUT)
                api_error(e, 503, "unavailable", "try again; the daemon's log has details",
                          "the sandbox did not answer in time");
        else if (rc == -ECONNRESET)
                api_error(e, 409, "conflict", "create a new sandbox", "sandbox %s stopped during the operation",
                          sandbox_id(sb));
        else if (rc == -EPIPE)
                api_error(e, 499, "cancelled", NULL, "the client left");
        return rc;
}

/* An owner's or group's name as the agent sends it: 1..32 bytes of
 * [A-Za-z0-9._-] (a '$' last), or an id's digits. The agent bounds them
 * already; the agent runs inside the sandbox, so its answer is checked
 * again before it reaches a client. */
static bool owner_text_valid(json_t *v) {
        const char *s = json_string_value(v);
        size_t n = s ? json_string_length(v) : 0;
        if (n == 0 || n > 32 || s[0] == '-')
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                          c == '.' || c == '_' || c == '-' || (c == '$' && i == n - 1);
                if (!ok)
                        return false;
        }
        return true;
}

/* An agent's entry in the API's shape, the published client's: "type" is
 * file, directory, symlink or other, and a symlink's "targetType" the same
 * but symlink (null when it leads nowhere); "mode" the permission bits as an
 * octal string; "modifiedAt" and "symlinkTarget" beside the older "mtime" and
 * "target", which our first clients read. "owner" and "group" are names or
 * numbers as text; one that is neither is left out. */
static json_t *api_entry(json_t *entry) {
        json_t *out = json_deep_copy(entry);
        if (!out)
                return NULL;
        json_t *mt = json_object_get(out, "mtime");
        if (json_is_integer(mt)) {
                char buf[RFC3339_LEN];
                if (time_format_rfc3339(json_integer_value(mt), buf) == 0)
                        json_object_set_new(out, "mtime", json_string(buf));
                else
                        json_object_set_new(out, "mtime", json_null());
        }
        json_object_set(out, "modifiedAt", json_object_get(out, "mtime"));
        const char *type = json_string_value(json_object_get(out, "type"));
        if (type && strcmp(type, "dir") == 0)
                json_object_set_new(out, "type", json_string("directory"));
        json_t *tt = json_object_get(out, "targetType");
        const char *target_type = json_string_value(tt);
        if (target_type && strcmp(target_type, "dir") == 0)
                json_object_set_new(out, "targetType", json_string("directory"));
        else if (tt && !json_is_null(tt) &&
                 !(target_type && (strcmp(target_type, "file") == 0 || strcmp(target_type, "other") == 0)))
                json_object_del(out, "targetType");
        static const char *const owner_keys[] = { "owner", "group" };
        for (size_t i = 0; i < ELEMENTSOF(owner_keys); i++) {
                json_t *v = json_object_get(out, owner_keys[i]);
                if (v && !owner_text_valid(v))
                        json_object_del(out, owner_keys[i]);
        }
        json_t *mode = json_object_get(out, "mode");
        if (json_is_integer(mode)) {
                char buf[8];
                snprintf(buf, sizeof(buf), "%04o", (unsigned)json_integer_value(mode) & 07777u);
                json_object_set_new(out, "mode", json_string(buf));
        }
        json_t *target = json_object_get(out, "target");
        if (target)
                json_object_set(out, "symlinkTarget", target);
        return out;
}

/* The path of a query argument (required). */
static int query_path(Req *r, const char *name, const char *def, char **ret, ApiError *e) {
        /* With its real length: a %00 in the query must not cut the path
         * short into another, valid one. */
        const char *p = NULL;
        size_t len = 0;
        if (!req_query_n(r, name, &p, &len)) {
                p = def;
                len = p ? strlen(p) : 0;
        }
        if (!p)
                return api_error(e, 400, "invalid_request", NULL, "the %s query argument is required", name);
        return request_resolve_path(p, len, name, ret, e);
}

static enum MHD_Result op_reply(Req *r, json_t *request, const char *path, json_t **ret_result) {
        ApiError e = { 0 };
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        json_t *result = NULL;
        int rc = run_op(r, sb, request, &result, &e);
        sandbox_release(sb);
        if (rc == -EPIPE)
                return MHD_NO;
        if (rc < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        if (agent_result_error(result, NULL)) {
                api_agent_error(result, path, &e);
                json_decref(result);
                return reply_error(r, &e);
        }
        *ret_result = result;
        return MHD_YES;
}

/* A boolean query argument: true/false (1/0 too); def when absent. */
static int query_bool(Req *r, const char *name, bool def, bool *ret, ApiError *e) {
        const char *v = req_query(r, name);
        if (!v) {
                *ret = def;
                return 0;
        }
        if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
                *ret = true;
        else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
                *ret = false;
        else
                return api_error(e, 400, "invalid_request", NULL, "%s must be true or false", name);
        return 0;
}

#define LIST_LIMIT_MAX 10000
#define GLOB_MAX 1024

enum MHD_Result handle_files_list(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *path = NULL;
        unsigned depth = 1, limit = LIST_LIMIT_MAX;
        bool hidden = true;
        if (query_path(r, "path", "/workspace", &path, &e) < 0)
                return reply_error(r, &e);
        const char *glob = NULL;
        size_t glen = 0;
        if (req_query_n(r, "glob", &glob, &glen) && (glen == 0 || glen > GLOB_MAX || memchr(glob, '\0', glen))) {
                api_error(&e, 400, "invalid_request", "e.g. **/*.py", "glob must be a pattern of 1 to %d bytes",
                          GLOB_MAX);
                return reply_error(r, &e);
        }
        const char *d = req_query(r, "depth");
        if (glob)
                depth = 0; /* as deep as the pattern reaches */
        if (d && request_parse_depth(d, &depth, &e) < 0)
                return reply_error(r, &e);
        const char *l = req_query(r, "limit");
        if (l) {
                char *end = NULL;
                errno = 0;
                unsigned long v = strtoul(l, &end, 10);
                if (errno || !*l || *end || l[0] == '-' || v < 1 || v > LIST_LIMIT_MAX) {
                        api_error(&e, 400, "invalid_request", NULL, "limit must be an integer from 1 to %d",
                                  LIST_LIMIT_MAX);
                        return reply_error(r, &e);
                }
                limit = (unsigned)v;
        }
        /* Dotfiles are listed unless asked not to: a listing that leaves
         * files out without being asked would hide what an agent wrote. */
        if (query_bool(r, "hidden", true, &hidden, &e) < 0)
                return reply_error(r, &e);
        _cleanup_json_ json_t *req = agent_req_list(path, depth, glob, hidden, limit);
        if (!req)
                return reply_internal(r);
        if (with_user(r, req, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        json_t *result = NULL;
        enum MHD_Result m = op_reply(r, req, path, &result);
        if (!result)
                return m;
        _cleanup_json_ json_t *res = result;
        json_t *entries = json_array();
        size_t i;
        json_t *ent;
        json_array_foreach(json_object_get(res, "entries"), i, ent) {
                json_t *a = api_entry(ent);
                if (a)
                        json_array_append_new(entries, a);
        }
        bool truncated = json_is_true(json_object_get(res, "truncated"));
        return reply_json(r, 200, json_pack("{s:s,s:o,s:b,s:b}", "path", path, "data", entries, "truncated",
                                            truncated, "hasMore", truncated));
}

enum MHD_Result handle_files_stat(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *path = NULL;
        if (query_path(r, "path", NULL, &path, &e) < 0)
                return reply_error(r, &e);
        _cleanup_json_ json_t *req = agent_req_stat(path);
        if (!req)
                return reply_internal(r);
        if (with_user(r, req, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        Sandbox *sb;
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        json_t *result = NULL;
        int rc = run_op(r, sb, req, &result, &e);
        sandbox_release(sb);
        if (rc == -EPIPE)
                return MHD_NO;
        if (rc < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        _cleanup_json_ json_t *res = result;
        const char *code = agent_result_error(res, NULL);
        /* Nothing there (or a file where a directory would be) is an answer,
         * not a failure: {"exists": false}. */
        if (code && (strcmp(code, "not_found") == 0 || strcmp(code, "not_a_directory") == 0))
                return reply_json(r, 200, json_pack("{s:s,s:b}", "path", path, "exists", false));
        if (code) {
                api_agent_error(res, path, &e);
                return reply_error(r, &e);
        }
        json_t *entry = api_entry(res);
        if (!entry || json_object_set_new(entry, "exists", json_true()) < 0) {
                json_decref(entry);
                return reply_internal(r);
        }
        return reply_json(r, 200, entry);
}

static enum MHD_Result files_op(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *path = NULL, *to = NULL;
        _cleanup_json_ json_t *req = NULL, *answer = NULL;
        bool flag;
        int rc;
        switch (r->route.kind) {
        case ROUTE_FILES_MKDIR:
                if ((rc = request_parse_mkdir(r->json, &path, &flag, &e)) == 0) {
                        req = agent_req_mkdir(path, flag);
                        answer = json_pack("{s:s}", "path", path);
                }
                break;
        case ROUTE_FILES_REMOVE:
                if ((rc = request_parse_remove(r->json, &path, &flag, &e)) == 0) {
                        req = agent_req_remove(path, flag);
                        answer = json_pack("{s:s}", "path", path);
                }
                break;
        default:
                if ((rc = request_parse_rename(r->json, &path, &to, &flag, &e)) == 0) {
                        req = agent_req_rename(path, to, flag);
                        answer = json_pack("{s:s,s:s}", "from", path, "to", to);
                }
                break;
        }
        if (rc < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        if (!req || !answer)
                return reply_internal(r);
        if (with_user(r, req, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        json_t *result = NULL;
        enum MHD_Result m = op_reply(r, req, path, &result);
        if (!result)
                return m;
        if (r->route.kind == ROUTE_FILES_REMOVE) {
                /* What went: whether anything did, and how many entries (a
                 * directory counts itself and all it held). */
                json_t *n = json_object_get(result, "removed");
                json_int_t count = json_is_integer(n) ? json_integer_value(n) : 1;
                json_object_set_new(answer, "removed", json_boolean(count > 0));
                json_object_set_new(answer, "entries", json_integer(count));
        }
        json_decref(result);
        return reply_json(r, 200, TAKE_PTR(answer));
}

enum MHD_Result handle_files_mkdir(Req *r) {
        return files_op(r);
}

enum MHD_Result handle_files_remove(Req *r) {
        return files_op(r);
}

enum MHD_Result handle_files_rename(Req *r) {
        return files_op(r);
}

/* ---- GET content: the agent's DATA straight to the client ---- */

typedef struct FileRead {
        char rid[24];
        Sandbox *sb;
        ChanStream *stream;
        int sock;
        uint64_t size;
        uint8_t *chunk;
        size_t chunk_len, chunk_off;
        bool eof;
} FileRead;

static void file_read_free(void *cls) {
        FileRead *f = cls;
        chan_stream_free(f->stream); /* cancels if unfinished */
        sandbox_release(f->sb);
        free(f->chunk);
        free(f);
}

static ssize_t file_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        FileRead *f = cls;
        for (;;) {
                if (f->chunk_off < f->chunk_len) {
                        size_t n = f->chunk_len - f->chunk_off;
                        if (n > max)
                                n = max;
                        if (pos + n > f->size)
                                n = (size_t)(f->size - pos); /* the file grew: send what was announced */
                        if (n == 0)
                                return MHD_CONTENT_READER_END_OF_STREAM;
                        memcpy(buf, f->chunk + f->chunk_off, n);
                        f->chunk_off += n;
                        return (ssize_t)n;
                }
                if (f->eof)
                        return pos >= f->size ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
                ChanEvent ev;
                int rc = chan_stream_next(f->stream, POLL_MS, &ev);
                if (rc == -ETIMEDOUT) {
                        if (socket_hung_up(f->sock))
                                return MHD_CONTENT_READER_END_WITH_ERROR;
                        continue;
                }
                if (rc < 0)
                        return MHD_CONTENT_READER_END_WITH_ERROR;
                switch (ev.type) {
                case CHAN_EV_DATA:
                        if (ev.fd == PROTO_FD_OUT) {
                                free(f->chunk);
                                f->chunk = TAKE_PTR(ev.data);
                                f->chunk_len = ev.len;
                                f->chunk_off = 0;
                        }
                        break;
                case CHAN_EV_EOF:
                        f->eof = true;
                        break;
                case CHAN_EV_RESULT:
                        f->eof = true;
                        if (agent_result_error(ev.json, NULL))
                                log_warn(f->rid, "reading a file from %s failed mid-way", sandbox_id(f->sb));
                        break;
                case CHAN_EV_CLOSED:
                        chan_event_clear(&ev);
                        return MHD_CONTENT_READER_END_WITH_ERROR;
                default:
                        break;
                }
                chan_event_clear(&ev);
        }
}

/* The agent's read request req of path on the route's sandbox, answered as
 * the file's bytes. */
static enum MHD_Result send_file(Req *r, json_t *req, const char *path, const char *content_type) {
        ApiError e = { 0 };
        FileRead *f = calloc(1, sizeof(*f));
        if (!f)
                return reply_internal(r);
        snprintf(f->rid, sizeof(f->rid), "%s", r->rid);
        f->sock = req_socket(r);
        if (api_sandbox_acquire(r, &f->sb, &e) < 0) {
                free(f);
                return reply_error(r, &e);
        }
        if (api_req_user(req, f->sb) < 0 || api_open_stream(f->sb, req, &f->stream, &e) < 0) {
                file_read_free(f);
                if (!e.code)
                        return reply_internal(r);
                return reply_error(r, &e);
        }
        /* The first event says the size, or the RESULT says why not. */
        uint64_t deadline = time_now_mono_ms() + OP_TIMEOUT_MS;
        for (;;) {
                ChanEvent ev;
                int rc = chan_stream_next(f->stream, POLL_MS, &ev);
                if (rc == -ETIMEDOUT) {
                        if (socket_hung_up(f->sock)) {
                                file_read_free(f);
                                return MHD_NO;
                        }
                        if (time_now_mono_ms() > deadline) {
                                file_read_free(f);
                                api_error(&e, 503, "unavailable", NULL, "the sandbox did not answer in time");
                                return reply_error(r, &e);
                        }
                        continue;
                }
                if (rc < 0 || ev.type == CHAN_EV_CLOSED) {
                        if (rc == 0)
                                chan_event_clear(&ev);
                        file_read_free(f);
                        api_error(&e, 409, "conflict", "create a new sandbox", "the sandbox stopped during the read");
                        return reply_error(r, &e);
                }
                if (ev.type == CHAN_EV_RESULT) {
                        if (agent_result_error(ev.json, NULL))
                                api_agent_error(ev.json, path, &e);
                        else
                                api_error(&e, 500, "internal", NULL, "the agent sent no file");
                        chan_event_clear(&ev);
                        file_read_free(f);
                        return reply_error(r, &e);
                }
                if (ev.type == CHAN_EV_EVENT) {
                        json_t *sz = json_object_get(ev.json, "size");
                        f->size = json_is_integer(sz) && json_integer_value(sz) >= 0 ? (uint64_t)json_integer_value(sz) : 0;
                        chan_event_clear(&ev);
                        break;
                }
                chan_event_clear(&ev);
        }
        struct MHD_Response *resp = MHD_create_response_from_callback(f->size, 256 * 1024, file_reader, f, file_read_free);
        if (!resp) {
                file_read_free(f);
                return reply_internal(r);
        }
        /* The length again where a client reads it even when something in
         * between re-frames the body: a stream cut short is then told from a
         * whole one. */
        char len[24];
        snprintf(len, sizeof(len), "%" PRIu64, f->size);
        MHD_add_response_header(resp, "X-Content-Length", len);
        return reply_response(r, 200, resp, content_type);
}

enum MHD_Result handle_files_read(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *path = NULL;
        if (query_path(r, "path", NULL, &path, &e) < 0)
                return reply_error(r, &e);
        _cleanup_json_ json_t *req = agent_req_read(path);
        if (!req)
                return reply_internal(r);
        if (with_user(r, req, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        return send_file(r, req, path, "application/octet-stream");
}

enum MHD_Result api_files_send(Req *r, const char *path, const char *content_type) {
        _cleanup_json_ json_t *req = agent_req_read(path);
        if (!req)
                return reply_internal(r);
        return send_file(r, req, path, content_type);
}

/* ---- PUT content: the upload straight into the agent ---- */

typedef struct FileUpload {
        Sandbox *sb;
        ChanStream *stream;
        char *path;
        uint64_t written;
        uint64_t max;
        uint64_t discarded;
        bool failed;     /* the agent stopped taking data; its RESULT says why */
        bool too_large;
} FileUpload;

static void files_upload_free(void *upload) {
        FileUpload *u = upload;
        if (!u)
                return;
        chan_stream_free(u->stream); /* a write without RESULT is cancelled: the target stays untouched */
        sandbox_release(u->sb);
        free(u->path);
        free(u);
}

static const ApiError *too_large(Req *r, ApiError *e) {
        uint64_t daemon_max = (uint64_t)r->app->cfg->max_file_mib << 20;
        if (r->link.max_bytes && r->link.max_bytes < daemon_max)
                api_error(e, 413, "payload_too_large", "ask for a link with a larger maxBytes",
                          "the file is larger than this link's maxBytes, %" PRIu64 " bytes", r->link.max_bytes);
        else
                api_error(e, 413, "payload_too_large", "files are limited by the daemon's --max-file-mib",
                          "the file is larger than %u MiB", r->app->cfg->max_file_mib);
        return e;
}

static enum MHD_Result files_upload_begin(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *path = NULL;
        unsigned mode = 0644;
        if (query_path(r, "path", NULL, &path, &e) < 0)
                return reply_error(r, &e);
        const char *m = req_query(r, "mode");
        if (m && request_parse_mode(m, &mode, &e) < 0)
                return reply_error(r, &e);
        uint64_t max = (uint64_t)r->app->cfg->max_file_mib * 1024u * 1024u;
        /* A link's own bound, under the daemon's. */
        if (r->link.max_bytes && r->link.max_bytes < max)
                max = r->link.max_bytes;
        const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > max)
                return reply_error(r, too_large(r, &e));
        FileUpload *u = calloc(1, sizeof(*u));
        if (!u)
                return reply_internal(r);
        u->max = max;
        u->path = TAKE_PTR(path);
        r->upload = u;
        if (api_sandbox_acquire(r, &u->sb, &e) < 0)
                return reply_error(r, &e);
        _cleanup_json_ json_t *req =
                agent_req_write(u->path, mode, true);
        if (!req)
                return reply_internal(r);
        if (with_user(r, req, &e) < 0 || api_req_user(req, u->sb) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        if (api_open_stream(u->sb, req, &u->stream, &e) < 0)
                return reply_error(r, &e);
        return MHD_YES;
}

static enum MHD_Result files_upload_data(Req *r, const char *data, size_t len) {
        FileUpload *u = r->upload;
        if (!u || !u->stream)
                return MHD_NO;
        if (u->failed || u->too_large) {
                /* The answer comes at the end; a client that keeps sending far
                 * past the limit is cut off. */
                u->discarded += len;
                return u->discarded > UPLOAD_MAX_DISCARD ? MHD_NO : MHD_YES;
        }
        if (u->written + len > u->max) {
                u->too_large = true;
                chan_stream_cancel(u->stream);
                return MHD_YES;
        }
        int rc = chan_stream_write(u->stream, data, len, WRITE_TIMEOUT_MS);
        if (rc < 0) {
                u->failed = true;
                if (rc == -ETIMEDOUT)
                        chan_stream_cancel(u->stream);
                return MHD_YES;
        }
        u->written += len;
        return MHD_YES;
}

enum MHD_Result handle_files_write(Req *r) {
        FileUpload *u = r->upload;
        ApiError e = { 0 };
        if (!u || !u->stream)
                return reply_internal(r);
        if (u->too_large)
                return reply_error(r, too_large(r, &e));
        if (!u->failed)
                chan_stream_close_write(u->stream);
        _cleanup_json_ json_t *res = NULL;
        int sock = req_socket(r);
        int rc = agent_wait_result(u->stream, OP_TIMEOUT_MS, client_left, &sock, &res);
        if (rc == -ECANCELED)
                return MHD_NO;
        if (rc == -ETIMEDOUT) {
                api_error(&e, 503, "unavailable", NULL, "the sandbox did not answer in time");
                return reply_error(r, &e);
        }
        if (rc < 0) {
                api_error(&e, 409, "conflict", "create a new sandbox", "the sandbox stopped during the write");
                return reply_error(r, &e);
        }
        if (agent_result_error(res, NULL)) {
                api_agent_error(res, u->path, &e);
                return reply_error(r, &e);
        }
        json_t *size = json_object_get(res, "size");
        return reply_json(r, 200, json_pack("{s:s,s:I}", "path", u->path, "size",
                                            (json_int_t)(json_is_integer(size) ? json_integer_value(size)
                                                                               : (json_int_t)u->written)));
}

const HttpUpload files_upload = {
        .begin = files_upload_begin,
        .data = files_upload_data,
        .free = files_upload_free,
};
