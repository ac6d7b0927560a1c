/* The file watch routes: a watch's start, listing and stop, and its
 * changes read by cursor or followed as NDJSON (manager/watches.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/api/api_watches.h"
#include "daemon/http/request.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/watches.h"

/* The longest wait of a read by cursor (the client asks 8 s at most). */
#define WAIT_MAX_MS 8000
/* A followed read ends with a `continue` this often, and the client
 * reads on from its cursor: no request lasts past a proxy's patience. */
#define FOLLOW_MAX_MS 110000
/* A followed read looks at its client and its watch this often. */
#define FOLLOW_POLL_MS 250
#define BATCH_MAX_MS 10000

static int glob_list(json_t *v, const char *field, json_t **ret, ApiError *e) {
        *ret = NULL;
        if (!v || json_is_null(v))
                return 0;
        if (!json_is_array(v) || json_array_size(v) > WATCHES_MAX_GLOBS)
                return api_error(e, 400, "invalid_request", NULL, "%s is a list of at most %u globs", field,
                                 WATCHES_MAX_GLOBS);
        size_t i;
        json_t *g;
        json_array_foreach(v, i, g) {
                const char *s = json_string_value(g);
                size_t n = s ? json_string_length(g) : 0;
                if (!s || n == 0 || n > WATCHES_MAX_GLOB || strlen(s) != n)
                        return api_error(e, 400, "invalid_request", NULL,
                                         "%s holds globs of 1 to %u bytes without NUL", field, WATCHES_MAX_GLOB);
        }
        *ret = json_incref(v);
        return 0;
}

static int int_field(json_t *body, const char *field, int64_t min, int64_t max, int64_t def, int64_t *ret,
                     ApiError *e) {
        json_t *v = json_object_get(body, field);
        if (!v || json_is_null(v)) {
                *ret = def;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
                return api_error(e, 400, "invalid_request", NULL, "%s is an integer from %lld to %lld", field,
                                 (long long)min, (long long)max);
        *ret = json_integer_value(v);
        return 0;
}

/* POST .../files/watches: what the published client's Watches.start sends. */
static int parse_start(json_t *body, WatchSpec *s, ApiError *e) {
        static const char *const fields[] = { "path",      "recursive",  "events", "include", "exclude",
                                              "batchMs",   "timeoutMs",  "maxWatches", "id", "webhook" };
        const char *key;
        json_t *v;
        json_object_foreach(body, key, v) {
                size_t i;
                for (i = 0; i < ELEMENTSOF(fields); i++)
                        if (strcmp(key, fields[i]) == 0)
                                break;
                if (i == ELEMENTSOF(fields))
                        return api_error(e, 400, "invalid_request", NULL, "unknown field %.64s", key);
        }
        int rc = request_path_field(body, "path", true, &s->path, e);
        if (rc < 0)
                return rc;
        json_t *rec = json_object_get(body, "recursive");
        if (rec && !json_is_null(rec) && !json_is_boolean(rec))
                return api_error(e, 400, "invalid_request", NULL, "recursive is a boolean");
        s->recursive = json_is_true(rec);
        json_t *hook = json_object_get(body, "webhook");
        if (hook && !json_is_null(hook) && !json_is_boolean(hook))
                return api_error(e, 400, "invalid_request", NULL, "webhook is a boolean");
        if (json_is_true(hook))
                return api_error(e, 501, "not_implemented", "read the changes with the watch's events instead",
                                 "this server does not send a watch's changes to webhooks");
        json_t *ev = json_object_get(body, "events");
        if (ev && !json_is_null(ev)) {
                size_t i;
                json_t *k;
                if (!json_is_array(ev) || json_array_size(ev) == 0 || json_array_size(ev) > 5)
                        return api_error(e, 400, "invalid_request", NULL,
                                         "events is a list of create, write, remove, rename and chmod");
                json_array_foreach(ev, i, k) {
                        unsigned bit = watch_kind_bit(json_string_value(k));
                        if (!bit)
                                return api_error(e, 400, "invalid_request", NULL,
                                                 "events is a list of create, write, remove, rename and chmod");
                        s->kinds |= bit;
                }
        }
        if ((rc = glob_list(json_object_get(body, "include"), "include", &s->include, e)) < 0 ||
            (rc = glob_list(json_object_get(body, "exclude"), "exclude", &s->exclude, e)) < 0)
                return rc;
        int64_t n;
        if ((rc = int_field(body, "batchMs", 0, BATCH_MAX_MS, 0, &s->batch_ms, e)) < 0 ||
            (rc = int_field(body, "timeoutMs", 0, WATCHES_MAX_TIMEOUT_MS, WATCHES_DEFAULT_TIMEOUT_MS, &s->timeout_ms,
                            e)) < 0)
                return rc;
        if ((rc = int_field(body, "maxWatches", 1, 65536, 8192, &n, e)) < 0)
                return rc;
        s->max_watches = (unsigned)n;
        json_t *id = json_object_get(body, "id");
        if (id && !json_is_null(id)) {
                const char *text = json_string_value(id);
                if (!text || strlen(text) != json_string_length(id) || !watch_id_ok(text))
                        return api_error(e, 400, "invalid_request", NULL,
                                         "id is 1 to 63 letters, digits, '_', '.' or '-', a letter or digit first");
                snprintf(s->id, sizeof s->id, "%s", text);
        }
        return 0;
}

enum MHD_Result handle_watch_start(Req *r) {
        ApiError e = { 0 };
        _cleanup_(watch_spec_done) WatchSpec spec = { 0 };
        if (parse_start(r->json, &spec, &e) < 0)
                return e.code ? reply_error(r, &e) : reply_internal(r);
        _cleanup_json_ json_t *areq = agent_req_watch(spec.path, spec.recursive, spec.max_watches);
        Sandbox *sb;
        if (!areq)
                return reply_internal(r);
        if (api_sandbox_acquire(r, &sb, &e) < 0)
                return reply_error(r, &e);
        if (api_req_user(areq, sb) < 0) {
                sandbox_release(sb);
                return reply_internal(r);
        }
        Watch *w = NULL;
        json_t *result = NULL;
        SandboxError se;
        int rc = watch_start(r->app->watches, sb, areq, &spec, &w, &result, &se);
        if (rc < 0) {
                sandbox_release(sb);
                _cleanup_json_ json_t *res = result;
                if (rc == -EEXIST)
                        api_error(&e, 409, "conflict", "stop it first, or leave id out",
                                  "a watch %s runs on this sandbox already", spec.id);
                else if (rc == -EUSERS)
                        api_error(&e, 429, "rate_limited", "stop a watch first",
                                  "this sandbox has %u watches, its bound", WATCHES_MAX_PER_SANDBOX);
                else if (rc == -EPROTO && res)
                        api_agent_error(res, spec.path, &e);
                else if (rc == -ENOMEM)
                        return reply_internal(r);
                else
                        api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        req_audit_note(r, "path", spec.path);
        json_t *j = watch_json(w);
        watch_unref(w);
        return j ? reply_json(r, 201, j) : reply_internal(r);
}

/* The route's watch, or a 404 in e. */
static Watch *route_watch(Req *r, ApiError *e) {
        Watch *w = watch_find(r->app->watches, r->key.owner, r->route.sandbox_id, r->route.watch_id);
        if (!w)
                api_error(e, 404, "not_found", "list them: GET /v1/sandboxes/{id}/files/watches",
                          "no watch %s on sandbox %s", r->route.watch_id, r->route.sandbox_id);
        return w;
}

enum MHD_Result handle_watch_list(Req *r) {
        r->audit_skip = true;
        json_t *data = watch_list(r->app->watches, r->key.owner, r->route.sandbox_id);
        return data ? reply_json(r, 200, json_pack("{s:o}", "data", data)) : reply_internal(r);
}

enum MHD_Result handle_watch_get(Req *r) {
        ApiError e = { 0 };
        r->audit_skip = true;
        Watch *w = route_watch(r, &e);
        if (!w)
                return reply_error(r, &e);
        json_t *j = watch_json(w);
        watch_unref(w);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_watch_stop(Req *r) {
        ApiError e = { 0 };
        Watch *w = route_watch(r, &e);
        if (!w)
                return reply_error(r, &e);
        watch_stop(r->app->watches, w);
        watch_unref(w);
        return reply_json(r, 200, json_pack("{s:b,s:s}", "stopped", true, "id", r->route.watch_id));
}

typedef struct FollowStream {
        Watch *w;
        uint64_t cursor;
        int sock;
        uint64_t t0;
        int64_t batch_ms;
        char *line;
        size_t line_len, line_off;
        bool done;
} FollowStream;

static void follow_free(void *cls) {
        FollowStream *f = cls;
        watch_unref(f->w);
        free(f->line);
        free(f);
}

static bool set_line(FollowStream *f, json_t *j) {
        free(f->line);
        f->line = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!f->line)
                return false;
        f->line_len = strlen(f->line);
        f->line_off = 0;
        char *grown = realloc(f->line, f->line_len + 2);
        if (!grown)
                return false;
        f->line = grown;
        f->line[f->line_len++] = '\n';
        f->line[f->line_len] = '\0';
        return true;
}

/* The next line of a followed read: 0, -EAGAIN (nothing yet), -ENODATA (the end). */
static int follow_next(FollowStream *f) {
        if (f->done)
                return -ENODATA;
        if (time_now_mono_ms() - f->t0 >= FOLLOW_MAX_MS) {
                f->done = true;
                return set_line(f, json_pack("{s:s,s:I}", "k", "continue", "cursor", (json_int_t)f->cursor)) ? 0
                                                                                                          : -ENOMEM;
        }
        WatchRead rd;
        if (watch_read(f->w, f->cursor, FOLLOW_POLL_MS, &rd) < 0)
                return -ENOMEM;
        /* A batch: the changes that follow the first within batchMs go out with it. */
        if (f->batch_ms > 0 && json_array_size(rd.events) > 0 && !rd.ended) {
                uint64_t until = time_now_mono_ms() + (uint64_t)f->batch_ms;
                watch_read_done(&rd);
                while (time_now_mono_ms() < until && !socket_hung_up(f->sock)) {
                        struct timespec ts = { .tv_sec = 0, .tv_nsec = 20 * 1000 * 1000 };
                        nanosleep(&ts, NULL);
                }
                if (watch_read(f->w, f->cursor, 0, &rd) < 0)
                        return -ENOMEM;
        }
        int rc = -EAGAIN;
        json_t *out = json_array();
        if (!out) {
                watch_read_done(&rd);
                return -ENOMEM;
        }
        size_t i;
        json_t *n;
        json_array_foreach(rd.notices, i, n) {
                json_t *copy = json_copy(n);
                if (copy && json_object_set_new(copy, "cursor", json_integer((json_int_t)rd.next)) == 0)
                        json_array_append_new(out, copy);
                else
                        json_decref(copy);
        }
        if (json_array_size(rd.events))
                json_array_append_new(out, json_pack("{s:s,s:O,s:I}", "k", "events", "events", rd.events, "cursor",
                                                     (json_int_t)rd.next));
        f->cursor = rd.next;
        if (rd.ended)
                f->done = true;
        watch_read_done(&rd);
        if (json_array_size(out)) {
                /* Lines joined: one write carries them all. */
                size_t total = 0;
                char *all = NULL;
                json_array_foreach(out, i, n) {
                        char *text = json_dumps(n, JSON_COMPACT);
                        size_t len = text ? strlen(text) : 0;
                        char *grown = text ? realloc(all, total + len + 2) : NULL;
                        if (!grown) {
                                free(text);
                                free(all);
                                json_decref(out);
                                return -ENOMEM;
                        }
                        all = grown;
                        memcpy(all + total, text, len);
                        total += len;
                        all[total++] = '\n';
                        all[total] = '\0';
                        free(text);
                }
                free(f->line);
                f->line = all;
                f->line_len = total;
                f->line_off = 0;
                rc = 0;
        } else if (f->done)
                rc = -ENODATA;
        json_decref(out);
        return rc;
}

static ssize_t follow_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        FollowStream *f = cls;
        for (;;) {
                if (f->line && f->line_off < f->line_len) {
                        size_t n = f->line_len - f->line_off;
                        if (n > max)
                                n = max;
                        memcpy(buf, f->line + f->line_off, n);
                        f->line_off += n;
                        return (ssize_t)n;
                }
                int rc = follow_next(f);
                if (rc == -ENODATA)
                        return MHD_CONTENT_READER_END_OF_STREAM;
                if (rc == -EAGAIN) {
                        if (socket_hung_up(f->sock))
                                return MHD_CONTENT_READER_END_WITH_ERROR;
                        continue;
                }
                if (rc < 0)
                        return MHD_CONTENT_READER_END_WITH_ERROR;
        }
}

enum MHD_Result handle_watch_events(Req *r) {
        ApiError e = { 0 };
        r->audit_skip = true;
        uint64_t cursor = 0;
        const char *c = req_query(r, "cursor");
        if (c && request_parse_cursor(c, &cursor, &e) < 0)
                return reply_error(r, &e);
        const char *fw = req_query(r, "follow");
        bool follow = fw && (strcmp(fw, "true") == 0 || strcmp(fw, "1") == 0);
        if (fw && !follow && strcmp(fw, "false") != 0 && strcmp(fw, "0") != 0)
                return api_reply_invalid(r, NULL, "follow is true or false");
        int64_t wait_ms = 0;
        const char *wm = req_query(r, "waitMs");
        if (wm) {
                char *end = NULL;
                long long v = strtoll(wm, &end, 10);
                if (!*wm || *end || v < 0)
                        return api_reply_invalid(r, NULL, "waitMs is a number of milliseconds");
                wait_ms = v > WAIT_MAX_MS ? WAIT_MAX_MS : v;
        }
        Watch *w = route_watch(r, &e);
        if (!w)
                return reply_error(r, &e);
        if (follow) {
                FollowStream *f = calloc(1, sizeof(*f));
                if (!f) {
                        watch_unref(w);
                        return reply_internal(r);
                }
                f->w = w;
                f->cursor = cursor;
                f->sock = req_socket(r);
                f->t0 = time_now_mono_ms();
                f->batch_ms = watch_batch_ms(w);
                struct MHD_Response *resp =
                        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, follow_reader, f, follow_free);
                if (!resp) {
                        follow_free(f);
                        return reply_internal(r);
                }
                return reply_response(r, 200, resp, "application/x-ndjson");
        }
        WatchRead rd;
        int rc = watch_read(w, cursor, (int)wait_ms, &rd);
        watch_unref(w);
        if (rc < 0)
                return reply_internal(r);
        if (rd.ended) {
                /* A reader past the queue's own end notice is told again. */
                size_t i;
                json_t *n;
                bool told = false;
                json_array_foreach(rd.notices, i, n) {
                        const char *k = json_string_value(json_object_get(n, "k"));
                        told = told || (k && strcmp(k, "end") == 0);
                }
                if (!told)
                        json_array_append_new(rd.notices, json_pack("{s:s,s:s}", "k", "end", "reason", rd.reason));
        }
        json_t *j = json_pack("{s:O,s:O,s:I,s:I,s:b}", "events", rd.events, "notices", rd.notices, "cursor",
                              (json_int_t)cursor, "nextCursor", (json_int_t)rd.next, "ended", rd.ended);
        watch_read_done(&rd);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}
