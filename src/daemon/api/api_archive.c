/* The archive routes: a directory out as a tar (gzip or not), streamed as
 * the agent's tar writer makes it, and a tar into a directory, streamed into
 * the agent's reader. Both run in a child of the sandbox's agent; a hostile
 * archive is parsed inside the sandbox, never here (docs/api.md). */
#include "daemon/api/api_archive.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/api/api.h"
#include "daemon/manager/config.h"
#include "common/log.h"
#include "daemon/http/request.h"
#include "proto/proto.h"

#define POLL_MS 250
#define FIRST_BYTES_TIMEOUT_MS 120000
#define WRITE_TIMEOUT_MS 120000
#define RESULT_TIMEOUT_MS 600000
#define EXCLUDES_MAX 256
/* An archive unpacks to at most this many times the daemon's file bound (a
 * gzip bomb stops there) and this many members. */
#define UNPACK_RATIO 4u
#define UNPACK_ENTRIES_MAX 100000u
#define UPLOAD_MAX_DISCARD (8u * 1024u * 1024u)

/* One line of what the child said on stderr, bounded, without its newline. */
static void keep_reason(char *dst, size_t cap, const uint8_t *data, size_t len) {
        size_t have = strlen(dst);
        for (size_t i = 0; i < len && have + 1 < cap; i++) {
                if (data[i] == '\n')
                        break;
                dst[have++] = data[i] >= 0x20 && data[i] < 0x7f ? (char)data[i] : '?';
        }
        dst[have] = '\0';
}

static int query_dir(Req *r, char **ret, ApiError *e) {
        const char *p = NULL;
        size_t len = 0;
        if (!req_query_n(r, "path", &p, &len))
                return api_error(e, 400, "invalid_request", NULL, "the path query argument is required");
        return request_resolve_path(p, len, "path", ret, e);
}

/* user: the published client sends "sandbox" (its default) or "root"; the
 * archive is read or unpacked with that user's rights, and what it unpacks
 * is that user's. */
static int query_user(Req *r, ReqUser *ret, ApiError *e) {
        return request_parse_user_text(req_query(r, "user"), ret, e);
}

/* ---- GET: a directory out ---- */

typedef struct ArchiveRead {
        char rid[24];
        Sandbox *sb;
        ChanStream *stream;
        int sock;
        uint8_t *chunk;
        size_t chunk_len, chunk_off;
        bool done;
        char reason[200];
} ArchiveRead;

static void archive_read_free(void *cls) {
        ArchiveRead *a = cls;
        chan_stream_free(a->stream);
        sandbox_release(a->sb);
        free(a->chunk);
        free(a);
}

/* The next event; DATA on stdout becomes the chunk, stderr is kept as the
 * reason. 1: a chunk, 0: the RESULT (*ret_code), <0: closed or timed out. */
static int next_chunk(ArchiveRead *a, int64_t deadline_ms, int *ret_code) {
        for (;;) {
                ChanEvent ev;
                int rc = chan_stream_next(a->stream, POLL_MS, &ev);
                if (rc == -ETIMEDOUT) {
                        if (socket_hung_up(a->sock) || (deadline_ms && (int64_t)time_now_mono_ms() > deadline_ms))
                                return -ETIMEDOUT;
                        continue;
                }
                if (rc < 0)
                        return rc;
                int out = 2;
                switch (ev.type) {
                case CHAN_EV_DATA:
                        if (ev.fd == PROTO_FD_OUT && ev.len > 0) {
                                free(a->chunk);
                                a->chunk = TAKE_PTR(ev.data);
                                a->chunk_len = ev.len;
                                a->chunk_off = 0;
                                out = 1;
                        } else if (ev.fd == PROTO_FD_ERR)
                                keep_reason(a->reason, sizeof(a->reason), ev.data, ev.len);
                        break;
                case CHAN_EV_RESULT: {
                        json_t *c = json_object_get(ev.json, "exitCode");
                        *ret_code = agent_result_error(ev.json, NULL) ? 1 : json_is_integer(c) ? (int)json_integer_value(c) : 1;
                        out = 0;
                        break;
                }
                case CHAN_EV_CLOSED:
                        out = -EPIPE;
                        break;
                default:
                        break;
                }
                chan_event_clear(&ev);
                if (out != 2)
                        return out;
        }
}

static ssize_t archive_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        ArchiveRead *a = cls;
        for (;;) {
                if (a->chunk_off < a->chunk_len) {
                        size_t n = a->chunk_len - a->chunk_off < max ? a->chunk_len - a->chunk_off : max;
                        memcpy(buf, a->chunk + a->chunk_off, n);
                        a->chunk_off += n;
                        return (ssize_t)n;
                }
                if (a->done)
                        return MHD_CONTENT_READER_END_OF_STREAM;
                int code = 1;
                int rc = next_chunk(a, 0, &code);
                if (rc == 1)
                        continue;
                if (rc == 0 && code == 0) {
                        a->done = true;
                        continue;
                }
                /* Cut off without the chunked ending: the client sees a
                 * stream that did not end, never a short archive as whole. */
                log_warn(a->rid, "an archive of %s stopped part way: %s", sandbox_id(a->sb),
                         a->reason[0] ? a->reason : "the sandbox went away");
                return MHD_CONTENT_READER_END_WITH_ERROR;
        }
}

typedef struct Excludes {
        json_t *list;
        bool too_many;
} Excludes;

static enum MHD_Result collect_exclude(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        Excludes *x = cls;
        if (!key || !value || strcmp(key, "exclude") != 0)
                return MHD_YES;
        if (json_array_size(x->list) >= EXCLUDES_MAX || !*value || strlen(value) > REQ_MAX_PATH || value[0] == '/') {
                x->too_many = true;
                return MHD_YES;
        }
        json_array_append_new(x->list, json_string(value));
        return MHD_YES;
}

enum MHD_Result handle_files_archive_get(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *path = NULL;
        ReqUser user;
        if (query_dir(r, &path, &e) < 0 || query_user(r, &user, &e) < 0)
                return reply_error(r, &e);
        bool gzip = true;
        const char *g = req_query(r, "gzip");
        if (g) {
                if (strcmp(g, "true") == 0 || strcmp(g, "1") == 0)
                        gzip = true;
                else if (strcmp(g, "false") == 0 || strcmp(g, "0") == 0)
                        gzip = false;
                else {
                        api_error(&e, 400, "invalid_request", NULL, "gzip must be true or false");
                        return reply_error(r, &e);
                }
        }
        Excludes ex = { .list = json_array() };
        _cleanup_json_ json_t *list = ex.list;
        if (!list)
                return reply_internal(r);
        MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, collect_exclude, &ex);
        if (ex.too_many) {
                api_error(&e, 400, "invalid_request", NULL, "exclude takes at most %d relative paths",
                          EXCLUDES_MAX);
                return reply_error(r, &e);
        }
        _cleanup_json_ json_t *req = agent_req_archive(path, gzip, list);
        if (!req)
                return reply_internal(r);
        ArchiveRead *a = calloc(1, sizeof(*a));
        if (!a)
                return reply_internal(r);
        snprintf(a->rid, sizeof(a->rid), "%s", r->rid);
        a->sock = req_socket(r);
        if (api_sandbox_acquire(r, &a->sb, &e) < 0) {
                free(a);
                return reply_error(r, &e);
        }
        if (api_req_set_user(req, a->sb, user) < 0) {
                archive_read_free(a);
                return reply_internal(r);
        }
        if (api_open_stream(a->sb, req, &a->stream, &e) < 0) {
                archive_read_free(a);
                return reply_error(r, &e);
        }
        /* The first bytes, or the child's failure: only then is the status known. */
        int code = 1;
        int rc = next_chunk(a, (int64_t)time_now_mono_ms() + FIRST_BYTES_TIMEOUT_MS, &code);
        if (rc <= 0) {
                if (rc == 0)
                        api_archive_error(code ? code : 1, path, a->reason[0] ? a->reason : "the archive is empty", &e);
                else if (rc == -ETIMEDOUT && socket_hung_up(a->sock)) {
                        archive_read_free(a);
                        return MHD_NO;
                } else
                        api_error(&e, rc == -ETIMEDOUT ? 503 : 409, rc == -ETIMEDOUT ? "unavailable" : "conflict", NULL,
                                  rc == -ETIMEDOUT ? "the sandbox did not answer in time"
                                                   : "the sandbox stopped during the archive");
                archive_read_free(a);
                return reply_error(r, &e);
        }
        struct MHD_Response *resp =
                MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 256 * 1024, archive_reader, a, archive_read_free);
        if (!resp) {
                archive_read_free(a);
                return reply_internal(r);
        }
        return reply_response(r, 200, resp, gzip ? "application/gzip" : "application/x-tar");
}

/* ---- PUT: a tar into a directory ---- */

typedef struct ArchiveWrite {
        Sandbox *sb;
        ChanStream *stream;
        char *path;
        uint64_t written, max, discarded;
        bool failed, too_large;
} ArchiveWrite;

static void archive_write_free(void *cls) {
        ArchiveWrite *w = cls;
        if (!w)
                return;
        chan_stream_free(w->stream);
        sandbox_release(w->sb);
        free(w->path);
        free(w);
}

static enum MHD_Result archive_write_begin(Req *r) {
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        _cleanup_free_ char *path = NULL;
        ReqUser user;
        if (query_dir(r, &path, &e) < 0 || query_user(r, &user, &e) < 0)
                return reply_error(r, &e);
        uint64_t max = (uint64_t)cfg->max_file_mib * 1024u * 1024u;
        const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > max) {
                api_error(&e, 413, "payload_too_large", "archives are limited by the daemon's --max-file-mib",
                          "the archive is larger than %u MiB", cfg->max_file_mib);
                return reply_error(r, &e);
        }
        ArchiveWrite *w = calloc(1, sizeof(*w));
        if (!w)
                return reply_internal(r);
        w->max = max;
        w->path = TAKE_PTR(path);
        r->upload = w;
        if (api_sandbox_acquire(r, &w->sb, &e) < 0)
                return reply_error(r, &e);
        _cleanup_json_ json_t *req = agent_req_unarchive(w->path, max * UNPACK_RATIO, UNPACK_ENTRIES_MAX);
        if (!req || api_req_set_user(req, w->sb, user) < 0)
                return reply_internal(r);
        if (api_open_stream(w->sb, req, &w->stream, &e) < 0)
                return reply_error(r, &e);
        return MHD_YES;
}

static enum MHD_Result archive_write_data(Req *r, const char *data, size_t len) {
        ArchiveWrite *w = r->upload;
        if (!w || !w->stream)
                return MHD_NO;
        if (w->failed || w->too_large) {
                w->discarded += len;
                return w->discarded > UPLOAD_MAX_DISCARD ? MHD_NO : MHD_YES;
        }
        if (w->written + len > w->max) {
                w->too_large = true;
                chan_stream_cancel(w->stream);
                return MHD_YES;
        }
        /* The child stops reading once it refuses a member: the rest is
         * dropped and the answer says why. */
        if (chan_stream_write(w->stream, data, len, WRITE_TIMEOUT_MS) < 0) {
                w->failed = true;
                return MHD_YES;
        }
        w->written += len;
        return MHD_YES;
}

enum MHD_Result handle_files_archive_put(Req *r) {
        ArchiveWrite *w = r->upload;
        ApiError e = { 0 };
        if (!w || !w->stream)
                return reply_internal(r);
        if (w->too_large) {
                api_error(&e, 413, "payload_too_large", "archives are limited by the daemon's --max-file-mib",
                          "the archive is larger than %u MiB", r->app->cfg->max_file_mib);
                return reply_error(r, &e);
        }
        chan_stream_close_write(w->stream);
        char reason[200] = "", out[200] = "";
        int code = -1;
        int sock = req_socket(r);
        int64_t deadline = (int64_t)time_now_mono_ms() + RESULT_TIMEOUT_MS;
        while (code < 0) {
                ChanEvent ev;
                int rc = chan_stream_next(w->stream, POLL_MS, &ev);
                if (rc == -ETIMEDOUT) {
                        if (socket_hung_up(sock))
                                return MHD_NO;
                        if ((int64_t)time_now_mono_ms() > deadline) {
                                api_error(&e, 503, "unavailable", NULL, "the sandbox did not answer in time");
                                return reply_error(r, &e);
                        }
                        continue;
                }
                if (rc < 0 || ev.type == CHAN_EV_CLOSED) {
                        if (rc == 0)
                                chan_event_clear(&ev);
                        api_error(&e, 409, "conflict", "create a new sandbox", "the sandbox stopped during the unpack");
                        return reply_error(r, &e);
                }
                if (ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_ERR)
                        keep_reason(reason, sizeof(reason), ev.data, ev.len);
                else if (ev.type == CHAN_EV_DATA && ev.fd == PROTO_FD_OUT)
                        keep_reason(out, sizeof(out), ev.data, ev.len);
                else if (ev.type == CHAN_EV_RESULT) {
                        json_t *c = json_object_get(ev.json, "exitCode");
                        code = agent_result_error(ev.json, NULL) ? 1 : json_is_integer(c) ? (int)json_integer_value(c) : 1;
                }
                chan_event_clear(&ev);
        }
        if (code != 0) {
                api_archive_error(code, w->path, reason[0] ? reason : "the unpack failed", &e);
                return reply_error(r, &e);
        }
        _cleanup_json_ json_t *counts = json_loads(out, 0, NULL);
        json_t *n = json_object_get(counts, "entries"), *b = json_object_get(counts, "bytes");
        return reply_json(r, 200, json_pack("{s:s,s:I,s:I}", "path", w->path, "entries",
                                            (json_int_t)(json_is_integer(n) ? json_integer_value(n) : 0), "bytes",
                                            (json_int_t)(json_is_integer(b) ? json_integer_value(b) : 0)));
}

const HttpUpload archive_upload = {
        .begin = archive_write_begin,
        .data = archive_write_data,
        .free = archive_write_free,
};
