#include "daemon/api_snapshots.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api.h"
#include "common/log.h"
#include "daemon/request.h"
#include "daemon/snapshot.h"

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

enum MHD_Result handle_snapshot_update(Req *r) {
        ApiError e = { 0 };
        const char *name;
        _cleanup_json_ json_t *labels = NULL;
        int64_t days;
        if (snapshot_update_parse_body(r->json, &name, &labels, &days, &e) < 0)
                return reply_error(r, &e);
        SnapshotRow cur;
        int rc = snapshot_store_get(r->app->snapshots, r->key.owner, r->route.snapshot_id, &cur);
        if (rc == -ENOENT)
                return reply_not_found(r, r->route.snapshot_id);
        if (rc < 0)
                return reply_internal(r);
        /* ifLabels fences a replacement: it applies only over the labels the
         * caller saw. */
        json_t *if_labels = json_object_get(r->json, "ifLabels");
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
        snapshot_row_done(&cur);
        _cleanup_free_ char *ltext = labels ? json_dumps(labels, JSON_COMPACT) : NULL;
        SnapshotRow s;
        rc = snapshot_store_update(r->app->snapshots, r->key.owner, r->route.snapshot_id,
                                   json_object_get(r->json, "name") != NULL, name, ltext, expires, &s);
        if (rc == -ENOENT)
                return reply_not_found(r, r->route.snapshot_id);
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
        int rc = snapshot_store_update(r->app->snapshots, r->key.owner, r->route.snapshot_id, false, NULL, NULL,
                                       time_now_unix() + days * 86400, &s);
        if (rc == -ENOENT)
                return reply_not_found(r, r->route.snapshot_id);
        if (rc < 0)
                return reply_internal(r);
        return reply_snapshot(r, 200, &s);
}

enum MHD_Result handle_snapshot_delete(Req *r) {
        int rc = snapshot_store_delete(r->app->snapshots, r->key.owner, r->route.snapshot_id);
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
        const DaemonConfig *cfg = r->app->cfg;
        ApiError e = { 0 };
        const char *name, *mode;
        _cleanup_json_ json_t *labels = NULL;
        int64_t count;
        if (fork_parse_body(r->json, &count, &name, &mode, &labels, &e) < 0)
                return reply_error(r, &e);
        json_t *keep = json_object_get(r->json, "keepSnapshot");
        json_t *secrets = json_object_get(r->json, "secrets");
        /* The source's spec: what every copy is made of, and what it costs. */
        SandboxError se;
        SandboxRow src;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, &src, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        _cleanup_json_ json_t *spec = json_loads(src.spec, 0, NULL);
        _cleanup_json_ json_t *src_labels = json_loads(src.labels, 0, NULL);
        bool src_root = src.run_as_root; /* the copies run as their source does */
        sandbox_row_done(&src);
        if (!spec)
                return reply_internal(r);
        /* All or none against the daily limit: every copy's first lease
         * together, before any is made (each create reserves its own as
         * well, so a race can only refuse more, never overshoot). */
        int64_t lease = json_integer_value(json_object_get(spec, "timeoutSeconds"));
        if (lease <= 0)
                lease = 300;
        uint64_t per_hour = config_cost_per_hour(cfg, (unsigned)json_integer_value(json_object_get(spec, "vcpu")),
                                                 (unsigned)json_integer_value(json_object_get(spec, "memoryMiB")));
        uint64_t each = ledger_cost_ceil(per_hour, lease);
        if (r->app->ledger && r->key.daily_limit_micros >= 0) {
                LedgerKeyUse use;
                if (ledger_key_use(r->app->ledger, r->key.id, time_now_unix(), &use) < 0)
                        return reply_internal(r);
                if (use.used_micros + (int64_t)(each * (uint64_t)count) > r->key.daily_limit_micros) {
                        api_error(&e, 402, "spending_limit_reached", "fork fewer copies, or raise the key's daily limit",
                                  "%lld copies would cost up to %llu micro-dollars for their first lease; the key has "
                                  "%lld of its daily limit left; no copy was made",
                                  (long long)count, (unsigned long long)(each * (uint64_t)count),
                                  (long long)(r->key.daily_limit_micros - use.used_micros));
                        return reply_error(r, &e);
                }
        }
        SnapshotRequest sr = { .mode = mode, .retention_days = 1, .transient = !json_is_true(keep) };
        SnapshotRow snap;
        if (sandbox_snapshot(r->app->manager, &r->key, r->route.sandbox_id, &sr, r->rid, &snap, &se) < 0) {
                api_sandbox_error(&se, &e);
                return reply_error(r, &e);
        }
        _cleanup_free_ char *dir = snapshot_store_dir(r->app->snapshots, snap.id);
        json_t *made = json_array();
        ReqLimits lim = { cfg->max_vcpu, cfg->max_memory_mib, cfg->max_disk_mib };
        int rc = dir && made ? 0 : -ENOMEM;
        for (json_int_t i = 0; i < count && rc == 0; i++) {
                _cleanup_json_ json_t *body = json_object();
                static const char *const copied[] = { "driver", "image", "vcpu", "memoryMiB", "diskMiB",
                                                      "timeoutSeconds", "env", "network", "idlePauseSeconds",
                                                      "autoWake", NULL };
                for (size_t k = 0; body && copied[k]; k++) {
                        json_t *v = json_object_get(spec, copied[k]);
                        if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 0 &&
                                                       strcmp(copied[k], "idlePauseSeconds") == 0))
                                json_object_set(body, copied[k], v);
                }
                json_t *ole = json_object_get(spec, "onLeaseEnd");
                if (json_is_string(ole))
                        json_object_set(body, "onLeaseEnd", ole);
                if (secrets && json_is_array(secrets))
                        json_object_set(body, "secrets", secrets);
                if (src_root)
                        json_object_set_new(body, "user", json_string(REQ_USER_ROOT));
                json_object_set(body, "labels", labels ? labels : src_labels ? src_labels : json_object());
                if (name) {
                        char nb[160];
                        if (count > 1)
                                snprintf(nb, sizeof nb, "%s-%lld", name, (long long)i + 1);
                        else
                                snprintf(nb, sizeof nb, "%s", name);
                        json_object_set_new(body, "name", json_string(nb));
                }
                CreateRequest cr;
                ApiError pe = { 0 };
                if (!body || request_parse_create(body, &lim, &cr, &pe) < 0) {
                        log_error(r->rid, "fork of %s: the source's spec does not make a create: %s",
                                  r->route.sandbox_id, pe.message);
                        rc = -EINVAL;
                        api_error(&e, 500, "internal", NULL, "could not make the copy's request");
                        break;
                }
                cr.restore_dir = dir;
                SandboxRow row;
                if (sandbox_create(r->app->manager, &r->key, &cr, r->rid, &row, &se) < 0) {
                        create_request_done(&cr);
                        api_sandbox_error(&se, &e);
                        rc = -EIO;
                        break;
                }
                create_request_done(&cr);
                json_t *j = api_sandbox_json(r->app->manager, &row);
                sandbox_row_done(&row);
                if (!j || json_array_append_new(made, j) < 0)
                        rc = -ENOMEM;
        }
        if (rc < 0) {
                /* None or all: the copies made so far go. */
                for (size_t i = 0; made && i < json_array_size(made); i++) {
                        const char *id = json_string_value(json_object_get(json_array_get(made, i), "id"));
                        SandboxError de;
                        if (id && sandbox_delete(r->app->manager, &r->key, id, r->rid, &de) < 0)
                                log_error(r->rid, "fork of %s: deleting copy %s: %s", r->route.sandbox_id, id,
                                          de.message);
                }
        }
        bool keep_snapshot = json_is_true(keep) && rc == 0;
        if (!keep_snapshot)
                (void)snapshot_store_delete(r->app->snapshots, r->key.owner, snap.id);
        if (rc < 0) {
                json_decref(made);
                snapshot_row_done(&snap);
                if (!e.status)
                        return reply_internal(r);
                return reply_error(r, &e);
        }
        json_t *j = json_pack("{s:o,s:s?}", "sandboxes", made, "snapshotId", keep_snapshot ? snap.id : NULL);
        snapshot_row_done(&snap);
        return j ? reply_json(r, 201, j) : reply_internal(r);
}
