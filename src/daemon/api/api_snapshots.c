#include "daemon/api/api_snapshots.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "common/log.h"
#include "daemon/http/request.h"
#include "daemon/manager/snapshot.h"

/* Copies one :fork makes at most: each is a whole sandbox with its own disk. */
#define FORK_MAX_COUNT 16
#define LIST_LIMIT_MAX 100

static json_t *snapshot_json(const SnapshotRow *s) {
        _cleanup_json_ json_t *spec = json_loads(s->spec, 0, NULL);
        json_t *labels = json_loads(s->labels, 0, NULL);
        int64_t days = s->expires_at > 0 ? (s->expires_at - s->created_at + 86399) / 86400 : 0;
        return json_pack("{s:s,s:s,s:s,s:s?,s:o,s:s,s:s,s:I,s:o,s:o,s:I,s:O?,s:O?,s:O?,s:n}", "id", s->id, "state",
                         s->state, "mode", s->mode, "name", s->name, "labels", labels ? labels : json_object(),
                         "sandboxId", s->sandbox_id, "sourceSandboxId", s->sandbox_id, "sizeBytes",
                         (json_int_t)s->size_bytes, "createdAt", json_time_or_null(s->created_at), "expiresAt",
                         json_time_or_null(s->expires_at), "retentionDays", (json_int_t)days, "driver",
                         json_object_get(spec, "driver"), "image", json_object_get(spec, "image"), "diskMiB",
                         json_object_get(spec, "diskMiB"), "error");
}

static enum MHD_Result reply_snapshot(Req *r, unsigned status, SnapshotRow *s) {
        json_t *j = snapshot_json(s);
        snapshot_row_done(s);
        return j ? reply_json(r, status, j) : reply_internal(r);
}

static enum MHD_Result reply_not_found(Req *r, const char *id) {
        ApiError e = { 0 };
        api_error(&e, 404, "not_found", "GET /v1/snapshots lists yours", "no snapshot %.32s", id);
        return reply_error(r, &e);
}

static int check_fields(json_t *body, const char *const *fields, ApiError *e) {
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v) {
                bool known = false;
                for (size_t i = 0; fields[i]; i++)
                        known |= strcmp(k, fields[i]) == 0;
                if (!known)
                        return api_error(e, 400, "invalid_request", NULL, "unknown field %.64s", k);
        }
        return 0;
}

static int retention_field(json_t *body, int64_t *ret, ApiError *e) {
        json_t *v = json_object_get(body, "retentionDays");
        *ret = 0;
        if (!v || json_is_null(v))
                return 0;
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > SNAPSHOT_MAX_RETENTION_DAYS)
                return api_error(e, 400, "invalid_request", NULL, "retentionDays must be an integer from 1 to %d",
                                 SNAPSHOT_MAX_RETENTION_DAYS);
        *ret = json_integer_value(v);
        return 0;
}

/* mode: "disk" (the default) or "memory". */
static int mode_field(json_t *body, const char **ret, ApiError *e) {
        json_t *mode = json_object_get(body, "mode");
        *ret = "disk";
        if (!mode || json_is_null(mode))
                return 0;
        const char *m = json_string_value(mode);
        if (!m || (strcmp(m, "disk") != 0 && strcmp(m, "memory") != 0))
                return api_error(e, 400, "invalid_request", NULL, "mode must be \"disk\" or \"memory\"");
        *ret = m;
        return 0;
}

int snapshot_parse_body(json_t *body, SnapshotRequest *sr, json_t **ret_labels, ApiError *e) {
        static const char *const fields[] = { "mode", "name", "labels", "retentionDays", NULL };
        *sr = (SnapshotRequest){ 0 };
        *ret_labels = NULL;
        if (check_fields(body, fields, e) < 0 || retention_field(body, &sr->retention_days, e) < 0 ||
            mode_field(body, &sr->mode, e) < 0 || request_parse_name_labels(body, &sr->name, ret_labels, e) < 0)
                return -EINVAL;
        sr->labels = *ret_labels;
        return 0;
}

enum MHD_Result handle_sandbox_snapshot(Req *r) {
        ApiError e = { 0 };
        SnapshotRequest sr;
        _cleanup_json_ json_t *labels = NULL;
        if (snapshot_parse_body(r->json, &sr, &labels, &e) < 0)
                return reply_error(r, &e);
        SandboxError se;
        SnapshotRow snap;
        if (sandbox_snapshot(r->app->manager, &r->key, r->route.sandbox_id, &sr, r->rid, &snap, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        return reply_snapshot(r, 201, &snap);
}

enum MHD_Result handle_snapshot_get(Req *r) {
        SnapshotRow s;
        int rc = snapshot_store_get(r->app->snapshots, r->key.owner, r->route.snapshot_id, &s);
        if (rc == -ENOENT)
                return reply_not_found(r, r->route.snapshot_id);
        if (rc < 0)
                return reply_internal(r);
        return reply_snapshot(r, 200, &s);
}

typedef struct ListCtx {
        json_t *data;
        unsigned limit;
        /* The (createdAt, id) of the page's last row: the next page's cursor. */
        int64_t cursor_at;
        char cursor_id[SNAPSHOT_ID_LEN + 1];
} ListCtx;

static int list_one(void *userdata, SnapshotRow *row) {
        ListCtx *c = userdata;
        json_t *j = snapshot_json(row);
        if (!j || json_array_append_new(c->data, j) < 0)
                return -ENOMEM;
        if (json_array_size(c->data) == c->limit) {
                c->cursor_at = row->created_at;
                snprintf(c->cursor_id, sizeof c->cursor_id, "%s", row->id);
        }
        return 0;
}

enum MHD_Result handle_snapshot_list(Req *r) {
        ApiError e = { 0 };
        unsigned limit = LIST_LIMIT_MAX;
        const char *l = req_query(r, "limit");
        if (l) {
                char *end;
                long v = strtol(l, &end, 10);
                if (*l == '\0' || *end || v < 1 || v > LIST_LIMIT_MAX) {
                        api_error(&e, 400, "invalid_request", NULL, "limit must be an integer from 1 to %d",
                                  LIST_LIMIT_MAX);
                        return reply_error(r, &e);
                }
                limit = (unsigned)v;
        }
        /* A cursor: "<createdAt>.<id>" of the last one answered. */
        int64_t at = 0;
        char after[SNAPSHOT_ID_LEN + 1] = "";
        const char *cursor = req_query(r, "cursor");
        if (cursor) {
                const char *dot = strchr(cursor, '.');
                char *end;
                long long v = strtoll(cursor, &end, 10);
                if (!dot || end != dot || v < 0 || !snapshot_id_ok(dot + 1)) {
                        api_error(&e, 400, "invalid_request", "pass back the nextCursor of the page before",
                                  "cursor is not one this server gave");
                        return reply_error(r, &e);
                }
                at = v;
                snprintf(after, sizeof after, "%s", dot + 1);
        }
        const char *sandbox_id = req_query(r, "sandboxId");
        const char *name = req_query(r, "name");
        const char *state = req_query(r, "state");
        if ((sandbox_id && strlen(sandbox_id) > 64) || (name && strlen(name) > 256)) {
                api_error(&e, 400, "invalid_request", NULL, "sandboxId or name is too long");
                return reply_error(r, &e);
        }
        ListCtx c = { .data = json_array(), .limit = limit };
        if (!c.data)
                return reply_internal(r);
        /* Every kept snapshot is ready: a capture in progress has no row. */
        int rc = state && strcmp(state, "ready") != 0
                         ? 0
                         : snapshot_store_list(r->app->snapshots, r->key.owner, sandbox_id, name, at,
                                               after[0] ? after : NULL, limit + 1, list_one, &c);
        if (rc < 0) {
                json_decref(c.data);
                return reply_internal(r);
        }
        /* One row past the page says whether there is a next one. */
        json_t *next = json_null();
        if (json_array_size(c.data) > limit) {
                json_array_remove(c.data, limit);
                char buf[64];
                snprintf(buf, sizeof buf, "%lld.%s", (long long)c.cursor_at, c.cursor_id);
                next = json_string(buf);
        }
        json_t *j = json_pack("{s:o,s:o,s:b}", "data", c.data, "nextCursor", next, "hasMore", !json_is_null(next));
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

int snapshot_update_parse_body(json_t *body, const char **ret_name, json_t **ret_labels, int64_t *ret_days,
                               ApiError *e) {
        static const char *const fields[] = { "name", "labels", "ifLabels", "retentionDays", NULL };
        *ret_name = NULL;
        *ret_labels = NULL;
        if (check_fields(body, fields, e) < 0 || retention_field(body, ret_days, e) < 0 ||
            request_parse_name_labels(body, ret_name, ret_labels, e) < 0)
                return -EINVAL;
        return 0;
}

/* How often an update reads the snapshot again when another update came
 * between its read and its write. */
#define SNAPSHOT_UPDATE_TRIES 3

enum MHD_Result handle_snapshot_update(Req *r) {
        ApiError e = { 0 };
        const char *name;
        _cleanup_json_ json_t *labels = NULL;
        int64_t days;
        if (snapshot_update_parse_body(r->json, &name, &labels, &days, &e) < 0)
                return reply_error(r, &e);
        _cleanup_free_ char *ltext = labels ? json_dumps(labels, JSON_COMPACT) : NULL;
        if (labels && !ltext)
                return reply_internal(r);
        /* ifLabels fences a replacement: it applies only over the labels the
         * caller saw. The write is conditional on the version of the row
         * the fence was checked against, so a write between the two is
         * seen and the check made again. */
        json_t *if_labels = json_object_get(r->json, "ifLabels");
        int rc = -ESTALE;
        SnapshotRow s;
        for (int tries = 0; rc == -ESTALE && tries < SNAPSHOT_UPDATE_TRIES; tries++) {
                SnapshotRow cur;
                rc = snapshot_store_get(r->app->snapshots, r->key.owner, r->route.snapshot_id, &cur);
                if (rc < 0)
                        break;
                if (if_labels && !json_is_null(if_labels)) {
                        _cleanup_json_ json_t *now = json_loads(cur.labels, 0, NULL);
                        if (!json_equal(now, if_labels)) {
                                snapshot_row_done(&cur);
                                api_error(&e, 409, "conflict", "read the snapshot again and retry",
                                          "the snapshot's labels changed since they were read");
                                return reply_error(r, &e);
                        }
                }
                int64_t expires = days > 0 ? cur.created_at + days * 86400 : 0;
                uint64_t version = cur.version;
                snapshot_row_done(&cur);
                rc = snapshot_store_update(r->app->snapshots, r->key.owner, r->route.snapshot_id, version,
                                           json_object_get(r->json, "name") != NULL, name, ltext, expires, &s);
        }
        if (rc == -ENOENT)
                return reply_not_found(r, r->route.snapshot_id);
        if (rc == -ESTALE) {
                api_error(&e, 409, "conflict", "retry",
                          "the snapshot was changed by other requests while this one was written");
                return reply_error(r, &e);
        }
        if (rc < 0)
                return reply_internal(r);
        return reply_snapshot(r, 200, &s);
}

int snapshot_extend_parse_body(json_t *body, int64_t *ret_days, ApiError *e) {
        static const char *const fields[] = { "retentionDays", NULL };
        if (check_fields(body, fields, e) < 0 || retention_field(body, ret_days, e) < 0)
                return -EINVAL;
        if (*ret_days == 0)
                return api_error(e, 400, "invalid_request", NULL, "retentionDays is required");
        return 0;
}

enum MHD_Result handle_snapshot_extend(Req *r) {
        ApiError e = { 0 };
        int64_t days;
        if (snapshot_extend_parse_body(r->json, &days, &e) < 0)
                return reply_error(r, &e);
        SnapshotRow s;
        int rc = snapshot_store_update(r->app->snapshots, r->key.owner, r->route.snapshot_id,
                                       STORE_SNAPSHOT_ANY_VERSION, false, NULL, NULL, time_now_unix() + days * 86400,
                                       &s);
        if (rc == -ENOENT)
                return reply_not_found(r, r->route.snapshot_id);
        if (rc < 0)
                return reply_internal(r);
        return reply_snapshot(r, 200, &s);
}

enum MHD_Result handle_snapshot_delete(Req *r) {
        int rc = snapshot_store_delete_visible(r->app->snapshots, r->key.owner, r->route.snapshot_id);
        if (rc == -ENOENT)
                return reply_not_found(r, r->route.snapshot_id);
        if (rc < 0)
                return reply_internal(r);
        json_t *j = json_pack("{s:s,s:s}", "id", r->route.snapshot_id, "state", "deleted");
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

int fork_parse_body(json_t *body, int64_t *ret_count, const char **ret_name, const char **ret_mode, json_t **ret_labels,
                    ApiError *e) {
        static const char *const fields[] = { "count", "name", "labels", "keepSnapshot", "secrets", "funding",
                                              "mode", NULL };
        *ret_count = 1;
        *ret_name = NULL;
        *ret_labels = NULL;
        if (check_fields(body, fields, e) < 0 || mode_field(body, ret_mode, e) < 0 ||
            request_parse_name_labels(body, ret_name, ret_labels, e) < 0)
                return -EINVAL;
        json_t *cv = json_object_get(body, "count");
        json_t *keep = json_object_get(body, "keepSnapshot");
        json_t *secrets = json_object_get(body, "secrets");
        int rc = 0;
        if (cv && !json_is_null(cv)) {
                if (!json_is_integer(cv) || json_integer_value(cv) < 1 || json_integer_value(cv) > FORK_MAX_COUNT)
                        rc = api_error(e, 400, "invalid_request", NULL, "count must be an integer from 1 to %d",
                                       FORK_MAX_COUNT);
                else
                        *ret_count = json_integer_value(cv);
        }
        if (rc == 0 && ((keep && !json_is_null(keep) && !json_is_boolean(keep)) ||
                        (secrets && !json_is_null(secrets) && !json_is_array(secrets))))
                rc = api_error(e, 400, "invalid_request", NULL,
                               "keepSnapshot must be a boolean and secrets a list of names");
        if (rc < 0) {
                json_decref(*ret_labels);
                *ret_labels = NULL;
        }
        return rc;
}

enum MHD_Result handle_sandbox_fork(Req *r) {
        ApiError e = { 0 };
        ForkRequest fr = { 0 };
        _cleanup_json_ json_t *labels = NULL, *secrets = NULL;
        if (fork_parse_body(r->json, &fr.count, &fr.name, &fr.mode, &labels, &e) < 0)
                return reply_error(r, &e);
        json_t *s = json_object_get(r->json, "secrets");
        if (json_is_array(s) && request_parse_secret_scope(s, "secrets", &secrets, &e) < 0)
                return reply_error(r, &e);
        fr.labels = labels;
        fr.secrets = secrets;
        fr.keep_snapshot = json_is_true(json_object_get(r->json, "keepSnapshot"));
        SandboxError se;
        ForkResult out;
        if (sandbox_fork(r->app->manager, &r->key, r->route.sandbox_id, &fr, r->rid, &out, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        json_t *made = json_array();
        for (size_t i = 0; made && i < out.n; i++)
                if (json_array_append_new(made, api_sandbox_json(r->app->manager, &out.copies[i])) < 0)
                        json_decref(TAKE_PTR(made));
        json_t *j = made ? json_pack("{s:o,s:s?}", "sandboxes", made, "snapshotId",
                                     out.snapshot_id[0] ? out.snapshot_id : NULL)
                         : NULL;
        fork_result_done(&out);
        return j ? reply_json(r, 201, j) : reply_internal(r);
}
