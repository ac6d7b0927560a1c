/* Volumes: disks of a fixed size that outlive sandboxes. The owner makes,
 * reads, grows and deletes them here; another owner's key gets 404. A
 * sandbox attaches them at its create (request.c's volumes). */
#include "daemon/api/api_volumes.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/manager/sandbox.h"
#include "daemon/manager/volumes.h"
#include "daemon/model/backup_policy.h"
#include "daemon/model/sandbox_spec.h"

#define VOLUMES_PAGE_DEFAULT 50u
#define VOLUMES_PAGE_MAX 200u
#define VOLUME_LABELS_MAX 32u

static enum MHD_Result fail(Req *r, unsigned status, const char *code, const char *hint, const char *msg) {
        ApiError e = { 0 };
        api_error(&e, status, code, hint, "%s", msg);
        return reply_error(r, &e);
}

static enum MHD_Result not_found(Req *r) {
        char msg[96];
        snprintf(msg, sizeof msg, "volume %s not found", r->route.volume_id);
        return fail(r, 404, "not_found", "GET /v1/volumes lists your volumes", msg);
}

static const char *const keep_names[] = { "last", "hourly", "daily", "weekly", "monthly", "yearly" };

static uint32_t *keep_count(BackupKeep *k, size_t i) {
        uint32_t *const counts[] = { &k->last, &k->hourly, &k->daily, &k->weekly, &k->monthly, &k->yearly };
        return counts[i];
}

/* A volume's backup policy as set_backup_policy sends it: daily, a
 * schedule of its own (every so many minutes, or a cron), or none when
 * off; the keep counts, or null. */
static json_t *policy_json(const StoreVolumeBackupPolicy *p) {
        bool daily = p->every_minutes == VOLUME_BACKUP_DAILY_MINUTES, on = p->every_minutes || p->cron[0];
        json_t *schedule = p->cron[0] ? json_pack("{s:s}", "cron", p->cron)
                           : p->every_minutes && !daily
                                   ? json_pack("{s:I}", "everyMinutes", (json_int_t)p->every_minutes)
                                   : json_null();
        json_t *next = json_null(), *keep = json_null();
        char at[RFC3339_LEN];
        if (on && time_format_rfc3339(p->next_at, at) == 0)
                next = json_string(at);
        if (backup_keep_any(&p->keep)) {
                BackupKeep k = p->keep;
                keep = json_object();
                for (size_t i = 0; keep && i < ELEMENTSOF(keep_names); i++)
                        json_object_set_new(keep, keep_names[i], json_integer(*keep_count(&k, i)));
        }
        return json_pack("{s:b,s:b,s:o,s:o,s:o,s:o}", "enabled", (int)on, "daily", (int)daily, "retentionDays",
                         p->retention_days ? json_integer(p->retention_days) : json_null(), "schedule", schedule,
                         "keep", keep, "nextBackupAt", next);
}

/* An attachment; its id is its sandbox's (a volume is attached to a
 * sandbox once at most). */
static json_t *attachment_json(const StoreVolumeAttachment *a) {
        char at[RFC3339_LEN];
        if (time_format_rfc3339(a->created_at, at) < 0)
                return NULL;
        return json_pack("{s:s,s:s,s:s,s:s,s:b,s:s,s:s}", "id", a->sandbox_id, "volumeId", a->volume_id, "sandboxId",
                         a->sandbox_id, "path", a->path, "readOnly", (int)a->read_only, "state", "attached",
                         "createdAt", at);
}

static json_t *volume_json(Req *r, const StoreVolume *v) {
        char created[RFC3339_LEN];
        if (time_format_rfc3339(v->created_at, created) < 0)
                return NULL;
        _cleanup_json_ json_t *labels = json_loads(v->labels, 0, NULL);
        _cleanup_json_ json_t *j = json_pack("{s:s,s:s?,s:O,s:I,s:b,s:s,s:s,s:n,s:[]}", "id", v->id, "name",
                                             v->name[0] ? v->name : NULL, "labels", labels ? labels : json_object(),
                                             "sizeMiB", (json_int_t)v->size_mib, "shared", (int)v->shared, "state",
                                             store_volume_state_name(v->state), "createdAt", created, "region",
                                             "attachments");
        if (!j)
                return NULL;
        StoreVolumeAttachment *atts = NULL;
        size_t n = 0;
        if (volumes_attachments(r->app->volumes, v->id, &atts, &n) < 0)
                return NULL;
        json_t *arr = json_object_get(j, "attachments");
        for (size_t i = 0; i < n; i++) {
                if (json_array_append_new(arr, attachment_json(&atts[i])) < 0) {
                        free(atts);
                        return NULL;
                }
        }
        free(atts);
        json_object_set_new(j, "attached", json_boolean(n > 0));
        json_t *policy = policy_json(&v->policy);
        if (!policy || json_object_set_new(j, "backupPolicy", policy) < 0)
                return NULL;
        return TAKE_PTR(j);
}

static enum MHD_Result reply_volume(Req *r, unsigned status, const StoreVolume *v) {
        json_t *j = volume_json(r, v);
        return j ? reply_json(r, status, j) : reply_internal(r);
}

/* Unknown fields are refused, naming the first one. */
static const char *unknown_field(json_t *body, const char *const *allowed) {
        const char *key;
        json_t *v;
        json_object_foreach(body, key, v) {
                size_t i = 0;
                while (allowed[i] && strcmp(key, allowed[i]) != 0)
                        i++;
                if (!allowed[i])
                        return key;
        }
        return NULL;
}

static enum MHD_Result refuse_unknown(Req *r, const char *key) {
        char msg[128];
        snprintf(msg, sizeof msg, "unknown field %.64s", key);
        return api_reply_invalid(r, NULL, msg);
}

/* sizeMiB: VOLUME_MIN_MIB to the daemon's bound; def when absent (0: required). */
static int size_of(Req *r, json_t *body, uint32_t def, uint32_t *ret, char *why, size_t n) {
        json_t *v = json_object_get(body, "sizeMiB");
        uint32_t max = volumes_limits(r->app->volumes)->max_mib;
        if (!v || json_is_null(v)) {
                if (!def) {
                        snprintf(why, n, "sizeMiB is missing");
                        return -EINVAL;
                }
                *ret = def < max ? def : max;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < VOLUME_MIN_MIB || json_integer_value(v) > max) {
                snprintf(why, n, "sizeMiB is a whole number from %u to %u on this daemon", VOLUME_MIN_MIB, max);
                return -EINVAL;
        }
        *ret = (uint32_t)json_integer_value(v);
        return 0;
}

/* A name: 1 to 63 letters, digits, '.', '_' or '-'. */
static bool name_ok(const char *s) {
        size_t n = strlen(s);
        return n > 0 && n < STORE_VOLUME_NAME_MAX && api_filter_ok(s);
}

/* labels: up to 32 string values, keys and values 1..63 and 0..255 bytes,
 * the whole kept under STORE_VOLUME_LABELS_MAX. */
static int labels_of(json_t *v, char **ret, char *why, size_t n) {
        if (!v || json_is_null(v)) {
                *ret = strdup("{}");
                return *ret ? 0 : -ENOMEM;
        }
        if (!json_is_object(v) || json_object_size(v) > VOLUME_LABELS_MAX) {
                snprintf(why, n, "labels is an object of up to %u strings", VOLUME_LABELS_MAX);
                return -EINVAL;
        }
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
                if (!json_is_string(x) || !*k || strlen(k) > 63 || strlen(json_string_value(x)) > 255) {
                        snprintf(why, n, "a label is a key of 1 to 63 bytes and a string value of up to 255");
                        return -EINVAL;
                }
        }
        char *text = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
        if (!text)
                return -ENOMEM;
        if (strlen(text) >= STORE_VOLUME_LABELS_MAX) {
                free(text);
                snprintf(why, n, "labels take up to %d bytes together", STORE_VOLUME_LABELS_MAX - 1);
                return -EINVAL;
        }
        *ret = text;
        return 0;
}

/* A create with fromBackup: a new volume of the backup's size. */
static enum MHD_Result restore(Req *r, json_t *from) {
        static const char *const fields[] = { "fromBackup", "name", NULL };
        const char *unknown = unknown_field(r->json, fields);
        json_t *jname = json_object_get(r->json, "name");
        if (unknown)
                return api_reply_invalid(r, "a restore has the backup's size, labels and sharing: leave them out",
                                         "a restore takes fromBackup and name only");
        const char *id = json_string_value(from), *name = NULL;
        if (!id || strlen(id) >= STORE_VOLUME_ID_MAX || !api_filter_ok(id))
                return api_reply_invalid(r, NULL, "fromBackup is a backup's id");
        if (jname && !json_is_null(jname)) {
                if (!json_is_string(jname) || !name_ok(json_string_value(jname)))
                        return api_reply_invalid(r, NULL, "name is 1 to 63 letters, digits, '.', '_' or '-'");
                name = json_string_value(jname);
        }
        StoreVolume v;
        int rc = volumes_restore(r->app->volumes, r->key.owner, id, name, &v);
        char msg[160];
        switch (rc) {
        case 0:
                log_info(r->rid, "volume %s restored from %s by key %s", v.id, id, r->key.id);
                return reply_volume(r, 201, &v);
        case -ENOENT:
                snprintf(msg, sizeof msg, "volume backup %.32s not found", id);
                return fail(r, 404, "not_found", "GET /v1/volume-backups lists your backups", msg);
        case -EUSERS:
        case -EDQUOT:
                return fail(r, 429, "quota_exceeded", "delete volumes you no longer need",
                            "a volume of the backup's size would pass this daemon's bounds on your volumes");
        case -ENOSPC:
                return fail(r, 503, "unavailable", "try later", "the host has no room for the volume");
        default:
                return api_reply_store_error(r, rc, "restore the volume");
        }
}

enum MHD_Result handle_volumes_create(Req *r) {
        static const char *const fields[] = { "sizeMiB", "name", "labels", "shared", "region", "fromBackup", NULL };
        const char *unknown = unknown_field(r->json, fields);
        if (unknown)
                return refuse_unknown(r, unknown);
        json_t *from = json_object_get(r->json, "fromBackup"), *region = json_object_get(r->json, "region");
        if (from && !json_is_null(from))
                return restore(r, from);
        if (region && !json_is_null(region))
                return fail(r, 501, "not_implemented", "leave it out", "region: this daemon keeps volumes on its own host");
        char why[160] = "";
        uint32_t mib = 0;
        if (size_of(r, r->json, VOLUME_DEFAULT_MIB, &mib, why, sizeof why) < 0)
                return api_reply_invalid(r, NULL, why);
        json_t *jname = json_object_get(r->json, "name"), *jshared = json_object_get(r->json, "shared");
        const char *name = NULL;
        if (jname && !json_is_null(jname)) {
                if (!json_is_string(jname) || !name_ok(json_string_value(jname)))
                        return api_reply_invalid(r, NULL, "name is 1 to 63 letters, digits, '.', '_' or '-'");
                name = json_string_value(jname);
        }
        if (jshared && !json_is_null(jshared) && !json_is_boolean(jshared))
                return api_reply_invalid(r, NULL, "shared is a boolean");
        _cleanup_free_ char *labels = NULL;
        int rc = labels_of(json_object_get(r->json, "labels"), &labels, why, sizeof why);
        if (rc == -EINVAL)
                return api_reply_invalid(r, NULL, why);
        if (rc < 0)
                return reply_internal(r);
        StoreVolume v;
        rc = volumes_create(r->app->volumes, r->key.owner, name, labels, mib, json_is_true(jshared), &v);
        const VolumeLimits *lim = volumes_limits(r->app->volumes);
        char msg[160];
        switch (rc) {
        case 0:
                log_info(r->rid, "volume %s (%u MiB) created by key %s", v.id, mib, r->key.id);
                return reply_volume(r, 201, &v);
        case -EUSERS:
                snprintf(msg, sizeof msg, "you have the most volumes this daemon keeps for one owner: %u",
                         lim->max_count);
                return fail(r, 429, "quota_exceeded", "delete volumes you no longer need", msg);
        case -EDQUOT:
                snprintf(msg, sizeof msg, "your volumes would pass %" PRIu64 " MiB together, this daemon's bound",
                         lim->max_total_mib);
                return fail(r, 429, "quota_exceeded", "delete or shrink your use of volumes", msg);
        case -ENOSPC:
                return fail(r, 503, "unavailable", "try a smaller volume, or later", "the host has no room for the volume");
        default:
                return api_reply_store_error(r, rc, "create the volume");
        }
}

enum MHD_Result handle_volumes_list(Req *r) {
        const char *limit_s = req_query(r, "limit"), *cursor = req_query(r, "cursor");
        const char *name = req_query(r, "name"), *state = req_query(r, "state");
        unsigned limit = VOLUMES_PAGE_DEFAULT;
        if (limit_s) {
                char *end;
                long l = strtol(limit_s, &end, 10);
                if (*end || l < 1 || l > (long)VOLUMES_PAGE_MAX)
                        return api_reply_invalid(r, NULL, "limit must be from 1 to 200");
                limit = (unsigned)l;
        }
        if (name && *name && !name_ok(name))
                return api_reply_invalid(r, NULL, "name is 1 to 63 letters, digits, '.', '_' or '-'");
        StoreVolumeState want = STORE_VOLUME_READY;
        if (state && *state && store_volume_state_from_name(state, &want) < 0)
                return api_reply_invalid(r, NULL, "state is \"ready\" or \"resizing\"");
        int64_t after = 0;
        char after_id[STORE_VOLUME_ID_MAX] = "";
        if (cursor && *cursor) {
                /* The cursor is the last volume's createdAt (Unix seconds) and id. */
                char *dot = NULL;
                long long at = strtoll(cursor, &dot, 10);
                if (!dot || *dot != '.' || at < 0 || strlen(dot + 1) != 24 || strncmp(dot + 1, "vol_", 4) != 0 ||
                    !api_filter_ok(dot + 1))
                        return api_reply_invalid(r, NULL, "cursor is not one this daemon gave");
                after = at;
                snprintf(after_id, sizeof after_id, "%s", dot + 1);
        }
        StoreVolume *all = NULL;
        size_t n = 0;
        int rc = volumes_list(r->app->volumes, r->key.owner, name, after, after_id, limit, &all, &n);
        if (rc < 0)
                return api_reply_store_error(r, rc, "list the volumes");
        _cleanup_json_ json_t *data = json_array();
        for (size_t i = 0; data && i < n; i++) {
                if (state && *state && all[i].state != want)
                        continue;
                json_t *j = volume_json(r, &all[i]);
                if (!j || json_array_append_new(data, j) < 0) {
                        free(all);
                        return reply_internal(r);
                }
        }
        json_t *next = json_null();
        if (n == limit && n > 0) {
                char buf[64];
                snprintf(buf, sizeof buf, "%lld.%s", (long long)all[n - 1].created_at, all[n - 1].id);
                next = json_string(buf);
        }
        free(all);
        json_t *body = data ? json_pack("{s:O,s:o}", "data", data, "nextCursor", next) : NULL;
        return body ? reply_json(r, 200, body) : reply_internal(r);
}

enum MHD_Result handle_volume_get(Req *r) {
        StoreVolume v;
        int rc = volumes_get(r->app->volumes, r->key.owner, r->route.volume_id, &v);
        if (rc == -ENOENT)
                return not_found(r);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the volume");
        return reply_volume(r, 200, &v);
}

enum MHD_Result handle_volume_resize(Req *r) {
        static const char *const fields[] = { "sizeMiB", NULL };
        const char *unknown = unknown_field(r->json, fields);
        if (unknown)
                return refuse_unknown(r, unknown);
        char why[160] = "";
        uint32_t mib = 0;
        if (size_of(r, r->json, 0, &mib, why, sizeof why) < 0)
                return api_reply_invalid(r, NULL, why);
        StoreVolume v;
        int rc = volumes_resize(r->app->volumes, r->key.owner, r->route.volume_id, mib, &v);
        char msg[160];
        switch (rc) {
        case 0:
                log_info(r->rid, "volume %s resized to %u MiB by key %s", v.id, v.size_mib, r->key.id);
                return reply_volume(r, 200, &v);
        case -ENOENT:
                return not_found(r);
        case -EINVAL:
                return fail(r, 400, "invalid_request", "give a sizeMiB larger than the volume's",
                            "a volume only grows: shrinking it would cut off what is written at its end");
        case -EBUSY:
                return fail(r, 409, "conflict", "delete the sandboxes it is attached to, then resize it",
                            "the volume is attached to a sandbox, or being resized");
        case -EDQUOT:
                snprintf(msg, sizeof msg, "your volumes would pass %" PRIu64 " MiB together, this daemon's bound",
                         volumes_limits(r->app->volumes)->max_total_mib);
                return fail(r, 429, "quota_exceeded", "delete volumes you no longer need", msg);
        case -ENOSPC:
                return fail(r, 503, "unavailable", "try a smaller size, or later", "the host has no room to grow the volume");
        default:
                return api_reply_store_error(r, rc, "resize the volume");
        }
}

enum MHD_Result handle_volume_delete(Req *r) {
        bool force = false;
        const char *q = req_query(r, "force");
        if (q)
                force = strcmp(q, "true") == 0 || strcmp(q, "1") == 0;
        if (r->json) {
                static const char *const fields[] = { "force", NULL };
                const char *unknown = unknown_field(r->json, fields);
                if (unknown)
                        return refuse_unknown(r, unknown);
                json_t *f = json_object_get(r->json, "force");
                if (f && !json_is_null(f) && !json_is_boolean(f))
                        return api_reply_invalid(r, NULL, "force is a boolean");
                force = force || json_is_true(f);
        }
        int rc = volumes_delete(r->app->volumes, r->key.owner, r->route.volume_id, force);
        if (rc == -ENOENT)
                return not_found(r);
        if (rc == -EBUSY)
                return fail(r, 409, "conflict",
                            "delete the sandboxes it is attached to, or delete it with force: true (they lose it)",
                            "the volume is attached to a sandbox");
        if (rc < 0)
                return api_reply_store_error(r, rc, "delete the volume");
        log_info(r->rid, "volume %s deleted%s by key %s", r->route.volume_id, force ? " (forced)" : "", r->key.id);
        json_t *j = json_pack("{s:s,s:b}", "id", r->route.volume_id, "deleted", 1);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

/* The volume's attachment to sandbox r->route.sandbox_id, the owner's:
 * -ENOENT for none. */
static int find_attachment(Req *r, StoreVolumeAttachment *ret) {
        StoreVolume v;
        int rc = volumes_get(r->app->volumes, r->key.owner, r->route.volume_id, &v);
        StoreVolumeAttachment *atts = NULL;
        size_t n = 0;
        if (rc < 0 || (rc = volumes_attachments(r->app->volumes, v.id, &atts, &n)) < 0)
                return rc;
        rc = -ENOENT;
        for (size_t i = 0; i < n && rc < 0; i++)
                if (strcmp(atts[i].sandbox_id, r->route.sandbox_id) == 0) {
                        *ret = atts[i];
                        rc = 0;
                }
        free(atts);
        return rc;
}

static enum MHD_Result attachment_not_found(Req *r) {
        char msg[128];
        snprintf(msg, sizeof msg, "volume %s has no attachment %s", r->route.volume_id, r->route.sandbox_id);
        return fail(r, 404, "not_found", "GET /v1/volumes/{id} lists its attachments", msg);
}

static enum MHD_Result reply_sandbox_error(Req *r, const SandboxError *se) {
        ApiError e = { 0 };
        api_sandbox_error(se, &e);
        return reply_error(r, &e);
}

/* POST /v1/volumes/{volume}:attach {sandboxId, path, readOnly}: the volume
 * bound into the running sandbox (docs/volumes.md). */
enum MHD_Result handle_volume_attach(Req *r) {
        static const char *const fields[] = { "sandboxId", "path", "readOnly", NULL };
        const char *unknown = unknown_field(r->json, fields);
        if (unknown)
                return refuse_unknown(r, unknown);
        const char *sid = json_string_value(json_object_get(r->json, "sandboxId"));
        const char *path = json_string_value(json_object_get(r->json, "path"));
        json_t *jro = json_object_get(r->json, "readOnly");
        if (!sid || !*sid || strlen(sid) >= sizeof r->route.sandbox_id || !api_filter_ok(sid))
                return api_reply_invalid(r, NULL, "sandboxId is a sandbox's id");
        if (!path)
                return api_reply_invalid(r, NULL, "path is the absolute path to attach the volume at");
        const char *why = sandbox_volume_path_check(path);
        if (why) {
                char msg[192];
                snprintf(msg, sizeof msg, "path: %s", why);
                return api_reply_invalid(r, NULL, msg);
        }
        if (jro && !json_is_null(jro) && !json_is_boolean(jro))
                return api_reply_invalid(r, NULL, "readOnly is a boolean");
        /* The sandbox's host binds it (and holds the volume's image when
         * the attach can work at all). */
        enum MHD_Result fwd;
        if (http_forward_to_sandbox(r, sid, &fwd))
                return fwd;
        StoreVolume v;
        int rc = volumes_get(r->app->volumes, r->key.owner, r->route.volume_id, &v);
        if (rc == -ENOENT)
                return not_found(r);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the volume");
        SandboxVolume sv = { .read_only = json_is_true(jro) };
        snprintf(sv.volume_id, sizeof sv.volume_id, "%s", v.id);
        snprintf(sv.path, sizeof sv.path, "%s", path);
        SandboxError se;
        if (sandbox_volume_attach(r->app->manager, &r->key, sid, &sv, r->rid, &se) < 0)
                return reply_sandbox_error(r, &se);
        snprintf(r->route.sandbox_id, sizeof r->route.sandbox_id, "%s", sid);
        StoreVolumeAttachment a;
        if ((rc = find_attachment(r, &a)) < 0)
                return api_reply_store_error(r, rc, "read the attachment");
        json_t *j = attachment_json(&a);
        return j ? reply_json(r, 201, j) : reply_internal(r);
}

enum MHD_Result handle_volume_attachment_get(Req *r) {
        StoreVolumeAttachment a;
        int rc = find_attachment(r, &a);
        if (rc == -ENOENT)
                return attachment_not_found(r);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the attachment");
        json_t *j = attachment_json(&a);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_volume_detach(Req *r) {
        if (r->json && json_object_size(r->json) > 0)
                return refuse_unknown(r, json_object_iter_key(json_object_iter(r->json)));
        StoreVolumeAttachment a;
        int rc = find_attachment(r, &a);
        if (rc == -ENOENT)
                return attachment_not_found(r);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the attachment");
        SandboxError se;
        if (sandbox_volume_detach(r->app->manager, &r->key, a.sandbox_id, a.volume_id, r->rid, &se) < 0)
                return reply_sandbox_error(r, &se);
        json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s}", "id", a.sandbox_id, "volumeId", a.volume_id, "sandboxId",
                              a.sandbox_id, "path", a.path, "state", "detached");
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

/* retentionDays: absent or null is none (0); else 1 to the bound. */
static int retention_of(json_t *v, uint32_t *ret) {
        if (!v || json_is_null(v)) {
                *ret = 0;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > VOLUME_RETENTION_MAX_DAYS)
                return -EINVAL;
        *ret = (uint32_t)json_integer_value(v);
        return 0;
}

static enum MHD_Result refuse_retention(Req *r) {
        char msg[96];
        snprintf(msg, sizeof msg, "retentionDays is a whole number of days from 1 to %u", VOLUME_RETENTION_MAX_DAYS);
        return api_reply_invalid(r, NULL, msg);
}

/* keep: {last, hourly, daily, weekly, monthly, yearly}, each a whole
 * number to BACKUP_KEEP_MAX; null, {} or all 0 is none. msg says what is
 * wrong. */
static int keep_of(json_t *v, BackupKeep *ret, char *msg, size_t n) {
        BackupKeep k = { 0 };
        if (json_is_null(v)) {
                *ret = k;
                return 0;
        }
        if (!json_is_object(v)) {
                snprintf(msg, n, "keep is an object of counts (last, hourly, daily, weekly, monthly, yearly) or null");
                return -EINVAL;
        }
        const char *key;
        json_t *c;
        json_object_foreach(v, key, c) {
                size_t i = 0;
                while (i < ELEMENTSOF(keep_names) && strcmp(key, keep_names[i]) != 0)
                        i++;
                if (i == ELEMENTSOF(keep_names)) {
                        snprintf(msg, n, "keep.%.32s is not a count; they are last, hourly, daily, weekly, monthly, yearly",
                                 key);
                        return -EINVAL;
                }
                if (!json_is_integer(c) || json_integer_value(c) < 0 || json_integer_value(c) > BACKUP_KEEP_MAX) {
                        snprintf(msg, n, "keep.%s is a whole number from 0 to %u", keep_names[i], BACKUP_KEEP_MAX);
                        return -EINVAL;
                }
                *keep_count(&k, i) = (uint32_t)json_integer_value(c);
        }
        /* No count above 0 ({} included) is null's: backups kept by age
         * only. A client that sends keep only when given clears it so. */
        *ret = k;
        return 0;
}

/* schedule.cron: the text, read strictly; msg names the field at fault. */
static int cron_of(json_t *v, char *ret, char *msg, size_t n) {
        static const char *const forms[] = {
                [CRON_MINUTE] = "0-59", [CRON_HOUR] = "0-23", [CRON_DAY_OF_MONTH] = "1-31, a day its months have",
                [CRON_MONTH] = "1-12 or jan-dec", [CRON_DAY_OF_WEEK] = "0-7 or sun-sat",
        };
        CronSchedule c;
        CronField f;
        if (!json_is_string(v)) {
                snprintf(msg, n, "schedule.cron is a string: minute hour day-of-month month day-of-week, in UTC");
                return -EINVAL;
        }
        if (cron_parse(json_string_value(v), &c, &f) < 0) {
                if (f == CRON_WHOLE)
                        snprintf(msg, n, "schedule.cron is five fields (minute hour day-of-month month day-of-week) "
                                         "in at most %u characters", CRON_TEXT_MAX);
                else
                        snprintf(msg, n, "schedule.cron: its %s field is not valid: values %s, as *, a list, a "
                                         "range or a step (*/15, 1-5, 0,30)", cron_field_name(f), forms[f]);
                return -EINVAL;
        }
        snprintf(ret, CRON_TEXT_MAX + 1, "%s", json_string_value(v));
        return 0;
}

/* The schedule asked for: {everyMinutes}, {cron} or null (daily). */
static int schedule_of(json_t *v, StoreVolumeBackupPolicy *p, char *msg, size_t n) {
        json_t *jmin = json_object_get(v, "everyMinutes"), *jcron = json_object_get(v, "cron");
        if (json_is_null(v)) {
                p->every_minutes = VOLUME_BACKUP_DAILY_MINUTES;
                p->cron[0] = '\0';
                return 0;
        }
        if (!json_is_object(v) || json_object_size(v) != 1 || (!jmin && !jcron)) {
                snprintf(msg, n, "schedule is {\"everyMinutes\": n}, {\"cron\": \"m h dom mon dow\"} or null");
                return -EINVAL;
        }
        if (jcron) {
                p->every_minutes = 0;
                return cron_of(jcron, p->cron, msg, n);
        }
        if (!json_is_integer(jmin) || json_integer_value(jmin) < VOLUME_BACKUP_EVERY_MIN_MINUTES ||
            json_integer_value(jmin) > VOLUME_BACKUP_EVERY_MAX_MINUTES) {
                snprintf(msg, n, "schedule.everyMinutes is a whole number from %u to %u",
                         VOLUME_BACKUP_EVERY_MIN_MINUTES, VOLUME_BACKUP_EVERY_MAX_MINUTES);
                return -EINVAL;
        }
        p->every_minutes = (uint32_t)json_integer_value(jmin);
        p->cron[0] = '\0';
        return 0;
}

/* POST /v1/volumes/{volume}:backup-policy: {daily, retentionDays,
 * schedule: {everyMinutes} | {cron} | null, keep}. A field left out keeps
 * what the policy has; schedule null goes back to daily backups. */
enum MHD_Result handle_volume_backup_policy(Req *r) {
        static const char *const fields[] = { "daily", "retentionDays", "schedule", "keep", NULL };
        const char *unknown = r->json ? unknown_field(r->json, fields) : NULL;
        if (unknown)
                return refuse_unknown(r, unknown);
        json_t *jdaily = r->json ? json_object_get(r->json, "daily") : NULL;
        json_t *jdays = r->json ? json_object_get(r->json, "retentionDays") : NULL;
        json_t *jsched = r->json ? json_object_get(r->json, "schedule") : NULL;
        json_t *jkeep = r->json ? json_object_get(r->json, "keep") : NULL;
        if (jdaily && !json_is_null(jdaily) && !json_is_boolean(jdaily))
                return api_reply_invalid(r, NULL, "daily is a boolean");
        StoreVolume v;
        int rc = volumes_get(r->app->volumes, r->key.owner, r->route.volume_id, &v);
        if (rc == -ENOENT)
                return not_found(r);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the volume");
        StoreVolumeBackupPolicy p = v.policy;
        char msg[192];
        if (jdays && retention_of(jdays, &p.retention_days) < 0)
                return refuse_retention(r);
        if (jkeep && keep_of(jkeep, &p.keep, msg, sizeof msg) < 0)
                return api_reply_invalid(r, NULL, msg);
        if (jsched) {
                if (schedule_of(jsched, &p, msg, sizeof msg) < 0)
                        return api_reply_invalid(r, NULL, msg);
                if (json_is_false(jdaily))
                        return api_reply_invalid(r, "leave daily out, or send it without a schedule",
                                                 "daily: false turns backups off; a schedule turns them on");
        } else if (json_is_true(jdaily) && p.every_minutes == 0 && !p.cron[0])
                p.every_minutes = VOLUME_BACKUP_DAILY_MINUTES;
        else if (json_is_false(jdaily)) {
                p.every_minutes = 0;
                p.cron[0] = '\0';
        }
        rc = volumes_set_backup_policy(r->app->volumes, r->key.owner, r->route.volume_id, &p, &v);
        if (rc == -ENOENT)
                return not_found(r);
        if (rc == -ERANGE)
                return api_reply_invalid(r, "give days and weekdays that fall together",
                                         "schedule.cron: its day-of-month, month and day-of-week never fall together");
        if (rc < 0)
                return api_reply_store_error(r, rc, "set the volume's backup policy");
        log_info(r->rid, "volume %s backup policy: every %u minutes, cron \"%s\", kept %u days, by key %s", v.id,
                 p.every_minutes, p.cron, p.retention_days, r->key.id);
        return reply_volume(r, 200, &v);
}

static json_t *backup_json(const StoreVolumeBackup *b) {
        char created[RFC3339_LEN], expires[RFC3339_LEN];
        if (time_format_rfc3339(b->created_at, created) < 0 ||
            (b->expires_at && time_format_rfc3339(b->expires_at, expires) < 0))
                return NULL;
        return json_pack("{s:s,s:s,s:s?,s:I,s:s,s:s,s:s?}", "id", b->id, "volumeId", b->volume_id, "name",
                         b->name[0] ? b->name : NULL, "sizeMiB", (json_int_t)b->size_mib, "state", "ready",
                         "createdAt", created, "expiresAt", b->expires_at ? expires : NULL);
}

static enum MHD_Result backup_not_found(Req *r) {
        char msg[96];
        snprintf(msg, sizeof msg, "volume backup %s not found", r->route.backup_id);
        return fail(r, 404, "not_found", "GET /v1/volume-backups lists your backups", msg);
}

enum MHD_Result handle_volume_backup(Req *r) {
        static const char *const fields[] = { "name", "retentionDays", NULL };
        const char *unknown = unknown_field(r->json, fields);
        if (unknown)
                return refuse_unknown(r, unknown);
        json_t *jname = json_object_get(r->json, "name"), *jdays = json_object_get(r->json, "retentionDays");
        uint32_t days = 0;
        if (retention_of(jdays, &days) < 0)
                return refuse_retention(r);
        const char *name = NULL;
        if (jname && !json_is_null(jname)) {
                if (!json_is_string(jname) || !name_ok(json_string_value(jname)))
                        return api_reply_invalid(r, NULL, "name is 1 to 63 letters, digits, '.', '_' or '-'");
                name = json_string_value(jname);
        }
        StoreVolumeBackup b;
        int rc = volumes_backup(r->app->volumes, r->key.owner, r->route.volume_id, name, days, &b);
        char msg[128];
        switch (rc) {
        case 0: {
                log_info(r->rid, "volume %s backed up as %s by key %s", r->route.volume_id, b.id, r->key.id);
                json_t *j = backup_json(&b);
                return j ? reply_json(r, 201, j) : reply_internal(r);
        }
        case -ENOENT:
                return not_found(r);
        case -EUSERS:
                snprintf(msg, sizeof msg, "you have the most volume backups this daemon keeps for one owner: %u",
                         VOLUME_BACKUPS_PER_OWNER);
                return fail(r, 429, "quota_exceeded", "delete backups you no longer need", msg);
        case -ENOSPC:
                return fail(r, 503, "unavailable", "free room on the host, or try later",
                            "the host has no room for the backup");
        case -EBUSY:
                /* A microVM's guest has it mounted: the host cannot freeze a
                 * filesystem another kernel writes, and a copy would be torn. */
                return fail(r, 409, "conflict", "back it up once the microVM sandbox that holds it has stopped",
                            "the volume is a running microVM's disk");
        default:
                return api_reply_store_error(r, rc, "back the volume up");
        }
}

enum MHD_Result handle_volume_backups_list(Req *r) {
        const char *limit_s = req_query(r, "limit"), *cursor = req_query(r, "cursor");
        const char *volume = req_query(r, "volumeId"), *state = req_query(r, "state");
        unsigned limit = VOLUMES_PAGE_DEFAULT;
        if (limit_s) {
                char *end;
                long l = strtol(limit_s, &end, 10);
                if (*end || l < 1 || l > (long)VOLUMES_PAGE_MAX)
                        return api_reply_invalid(r, NULL, "limit must be from 1 to 200");
                limit = (unsigned)l;
        }
        if (volume && *volume && (strlen(volume) >= STORE_VOLUME_ID_MAX || !api_filter_ok(volume)))
                return api_reply_invalid(r, NULL, "volumeId is not a volume's id");
        /* Every backup here is ready once it is answered. */
        bool none = state && *state && strcmp(state, "ready") != 0;
        int64_t after = 0;
        char after_id[STORE_VOLUME_ID_MAX] = "";
        if (cursor && *cursor) {
                char *dot = NULL;
                long long at = strtoll(cursor, &dot, 10);
                if (!dot || *dot != '.' || at < 0 || strlen(dot + 1) != 23 || strncmp(dot + 1, "vb_", 3) != 0 ||
                    !api_filter_ok(dot + 1))
                        return api_reply_invalid(r, NULL, "cursor is not one this daemon gave");
                after = at;
                snprintf(after_id, sizeof after_id, "%s", dot + 1);
        }
        StoreVolumeBackup *all = NULL;
        size_t n = 0;
        int rc = none ? 0 : volumes_backup_list(r->app->volumes, r->key.owner, volume, after, after_id, limit, &all, &n);
        if (rc < 0)
                return api_reply_store_error(r, rc, "list the volume backups");
        _cleanup_json_ json_t *data = json_array();
        for (size_t i = 0; data && i < n; i++) {
                json_t *j = backup_json(&all[i]);
                if (!j || json_array_append_new(data, j) < 0) {
                        free(all);
                        return reply_internal(r);
                }
        }
        json_t *next = json_null();
        if (n == limit && n > 0) {
                char buf[64];
                snprintf(buf, sizeof buf, "%lld.%s", (long long)all[n - 1].created_at, all[n - 1].id);
                next = json_string(buf);
        }
        free(all);
        json_t *body = data ? json_pack("{s:O,s:o}", "data", data, "nextCursor", next) : NULL;
        return body ? reply_json(r, 200, body) : reply_internal(r);
}

enum MHD_Result handle_volume_backup_get(Req *r) {
        StoreVolumeBackup b;
        int rc = volumes_backup_get(r->app->volumes, r->key.owner, r->route.backup_id, &b);
        if (rc == -ENOENT)
                return backup_not_found(r);
        if (rc < 0)
                return api_reply_store_error(r, rc, "read the volume backup");
        json_t *j = backup_json(&b);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}

enum MHD_Result handle_volume_backup_delete(Req *r) {
        int rc = volumes_backup_delete(r->app->volumes, r->key.owner, r->route.backup_id);
        if (rc == -ENOENT)
                return backup_not_found(r);
        if (rc < 0)
                return api_reply_store_error(r, rc, "delete the volume backup");
        json_t *j = json_pack("{s:s,s:b}", "id", r->route.backup_id, "deleted", 1);
        return j ? reply_json(r, 200, j) : reply_internal(r);
}
