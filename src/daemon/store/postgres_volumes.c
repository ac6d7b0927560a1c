/* The volumes in PostgreSQL (store_volumes.h): the statements of
 * store_volumes_sql.h on the tables every host shares. The unique index on
 * a volume's writing attachment decides a race between hosts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_volumes.h"
#include "daemon/store/store_volumes_sql.h"

struct StoreVolumes {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_volumes_open(const char *location, StoreVolumes **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_volumes_close(StoreVolumes *h) {
        pgdb_handle_close(h);
}

static int pg_volumes_set_writer(StoreVolumes *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static void volume_of(const PGresult *res, int i, StoreVolume *v) {
        *v = (StoreVolume){ .size_mib = (uint32_t)pgi(res, i, 4), .shared = pgi(res, i, 5) != 0,
                            .created_at = pgi(res, i, 7),
                            .policy = { .every_minutes = (uint32_t)pgi(res, i, 8),
                                        .retention_days = (uint32_t)pgi(res, i, 9), .next_at = pgi(res, i, 10),
                                        .keep = { .last = (uint32_t)pgi(res, i, 12),
                                                  .hourly = (uint32_t)pgi(res, i, 13),
                                                  .daily = (uint32_t)pgi(res, i, 14),
                                                  .weekly = (uint32_t)pgi(res, i, 15),
                                                  .monthly = (uint32_t)pgi(res, i, 16),
                                                  .yearly = (uint32_t)pgi(res, i, 17) } } };
        snprintf(v->policy.cron, sizeof v->policy.cron, "%s", pgv(res, i, 11) ?: "");
        snprintf(v->id, sizeof v->id, "%s", pgv(res, i, 0) ?: "");
        snprintf(v->owner, sizeof v->owner, "%s", pgv(res, i, 1) ?: "");
        snprintf(v->name, sizeof v->name, "%s", pgv(res, i, 2) ?: "");
        snprintf(v->labels, sizeof v->labels, "%s", pgv(res, i, 3) ?: "{}");
        if (store_volume_state_from_name(pgv(res, i, 6), &v->state) < 0)
                v->state = STORE_VOLUME_RESIZING; /* unknown: not attachable */
}

/* The one number a COUNT answers. */
static int count_of(StoreVolumes *h, const char *text, const char *arg, int64_t *ret) {
        PgParams p = { 0 };
        pgp_text(&p, arg);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, text, &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1)
                return -EIO;
        *ret = pgi(res, 0, 0);
        return 0;
}

static int pg_volumes_get(StoreVolumes *h, const char *owner, const char *id, StoreVolume *ret) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, VOLUMES_SQL_GET("$"), &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        volume_of(res, 0, ret);
        return 0;
}

static int pg_volumes_insert(StoreVolumes *h, const StoreVolume *v, const StoreVolumeBounds *b) {
        PgParams p = { 0 };
        pgp_text(&p, v->id);
        pgp_text(&p, v->owner);
        pgp_text(&p, v->name);
        pgp_text(&p, v->labels);
        pgp_int(&p, v->size_mib);
        pgp_int(&p, v->shared);
        pgp_text(&p, store_volume_state_name(v->state));
        pgp_int(&p, v->created_at);
        pgp_int(&p, b->max_count);
        pgp_int(&p, (int64_t)b->max_total_mib);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_INSERT("$"), &p, &affected);
        if (r < 0 || affected > 0)
                return r;
        int64_t n = 0;
        if ((r = count_of(h, VOLUMES_SQL_COUNT("$"), v->owner, &n)) < 0)
                return r;
        return n >= b->max_count ? -EUSERS : -EDQUOT;
}

/* The volumes res holds, into *ret (malloc'd). */
static int volume_rows(const PGresult *res, StoreVolume **ret, size_t *ret_n) {
        int n = PQntuples(res);
        StoreVolume *all = calloc(n > 0 ? (size_t)n : 1, sizeof(*all));
        if (!all)
                return -ENOMEM;
        for (int i = 0; i < n; i++)
                volume_of(res, i, &all[i]);
        *ret = all;
        *ret_n = (size_t)n;
        return 0;
}

static int pg_volumes_list(StoreVolumes *h, const char *owner, const char *name, int64_t after_created,
                           const char *after_id, size_t limit, StoreVolume **ret, size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, name);
        pgp_int(&p, after_created);
        pgp_text(&p, after_id);
        pgp_int(&p, (int64_t)limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, VOLUMES_SQL_LIST("$"), &p, &res);
        return r < 0 ? r : volume_rows(res, ret, ret_n);
}

static int pg_volumes_resize_begin(StoreVolumes *h, const char *owner, const char *id, uint32_t new_mib,
                                   const StoreVolumeBounds *b) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, id);
        pgp_int(&p, new_mib);
        pgp_int(&p, (int64_t)b->max_total_mib);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_RESIZE_BEGIN("$"), &p, &affected);
        if (r < 0 || affected > 0)
                return r;
        StoreVolume v;
        int64_t attached = 0;
        if ((r = pg_volumes_get(h, owner, id, &v)) < 0 ||
            (r = count_of(h, VOLUMES_SQL_ATTACHED("$"), id, &attached)) < 0)
                return r;
        return v.state != STORE_VOLUME_READY || attached > 0 ? -EBUSY : -EDQUOT;
}

static int pg_volumes_resize_end(StoreVolumes *h, const char *id, uint32_t size_mib) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_int(&p, size_mib);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_RESIZE_END("$"), &p, &affected);
        return r < 0 ? r : affected > 0 ? 0 : -ENOENT;
}

typedef struct Removal {
        const char *owner, *id;
        int64_t changes;
} Removal;

static int remove_forced_tx(PgConn *c, void *userdata) {
        Removal *m = userdata;
        PgParams p = { 0 };
        pgp_text(&p, m->owner);
        pgp_text(&p, m->id);
        int r = pgdb_exec_locked(c, VOLUMES_SQL_DETACH_ALL("$"), &p);
        if (r < 0)
                return r;
        _cleanup_pgres_ PGresult *res = NULL;
        if ((r = pgdb_run_locked(c, VOLUMES_SQL_REMOVE_FORCED("$"), &p, &res)) < 0)
                return r;
        m->changes = strtoll(PQcmdTuples(res), NULL, 10);
        return 0;
}

static int pg_volumes_remove(StoreVolumes *h, const char *owner, const char *id, bool force) {
        Removal m = { .owner = owner, .id = id };
        int r;
        if (force)
                r = pgdb_write(&h->c, remove_forced_tx, &m);
        else {
                PgParams p = { 0 };
                pgp_text(&p, owner);
                pgp_text(&p, id);
                r = pgdb_exec_write(&h->c, VOLUMES_SQL_REMOVE("$"), &p, &m.changes);
        }
        if (r < 0 || m.changes > 0)
                return r;
        StoreVolume v;
        r = pg_volumes_get(h, owner, id, &v);
        return r < 0 ? r : -EBUSY;
}

static int pg_volumes_attach(StoreVolumes *h, const char *owner, const StoreVolumeAttachment *a) {
        PgParams p = { 0 };
        pgp_text(&p, a->volume_id);
        pgp_text(&p, a->sandbox_id);
        pgp_text(&p, a->path);
        pgp_int(&p, a->read_only);
        pgp_int(&p, a->created_at);
        pgp_text(&p, owner);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_ATTACH("$"), &p, &affected);
        if (r == -EEXIST)
                return -EBUSY;
        if (r < 0 || affected > 0)
                return r;
        StoreVolume v;
        r = pg_volumes_get(h, owner, a->volume_id, &v);
        return r < 0 ? r : -EAGAIN;
}

static int pg_volumes_detach(StoreVolumes *h, const char *volume_id, const char *sandbox_id) {
        PgParams p = { 0 };
        pgp_text(&p, volume_id);
        pgp_text(&p, sandbox_id);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_DETACH("$"), &p, &affected);
        return r < 0 ? r : affected > 0 ? 0 : -ENOENT;
}

static int pg_volumes_detach_sandbox(StoreVolumes *h, const char *sandbox_id) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        return pgdb_exec_write(&h->c, VOLUMES_SQL_DETACH_SANDBOX("$"), &p, NULL);
}

static int pg_volumes_attachments(StoreVolumes *h, const char *volume_id, StoreVolumeAttachment **ret,
                                  size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, volume_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, VOLUMES_SQL_ATTACHMENTS("$"), &p, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        StoreVolumeAttachment *all = calloc(n > 0 ? (size_t)n : 1, sizeof(*all));
        if (!all)
                return -ENOMEM;
        for (int i = 0; i < n; i++) {
                StoreVolumeAttachment *a = &all[i];
                a->read_only = pgi(res, i, 3) != 0;
                a->created_at = pgi(res, i, 4);
                snprintf(a->volume_id, sizeof a->volume_id, "%s", pgv(res, i, 0) ?: "");
                snprintf(a->sandbox_id, sizeof a->sandbox_id, "%s", pgv(res, i, 1) ?: "");
                snprintf(a->path, sizeof a->path, "%s", pgv(res, i, 2) ?: "");
        }
        *ret = all;
        *ret_n = (size_t)n;
        return 0;
}

static void backup_of(const PGresult *res, int i, StoreVolumeBackup *b) {
        *b = (StoreVolumeBackup){ .size_mib = (uint32_t)pgi(res, i, 4), .created_at = pgi(res, i, 5),
                                  .expires_at = pgi(res, i, 6), .scheduled = pgi(res, i, 7) != 0 };
        snprintf(b->id, sizeof b->id, "%s", pgv(res, i, 0) ?: "");
        snprintf(b->owner, sizeof b->owner, "%s", pgv(res, i, 1) ?: "");
        snprintf(b->volume_id, sizeof b->volume_id, "%s", pgv(res, i, 2) ?: "");
        snprintf(b->name, sizeof b->name, "%s", pgv(res, i, 3) ?: "");
}

static int pg_volumes_backup_insert(StoreVolumes *h, const StoreVolumeBackup *b, uint32_t max_count) {
        PgParams p = { 0 };
        pgp_text(&p, b->id);
        pgp_text(&p, b->owner);
        pgp_text(&p, b->volume_id);
        pgp_text(&p, b->name);
        pgp_int(&p, b->size_mib);
        pgp_int(&p, b->created_at);
        pgp_int(&p, max_count);
        pgp_int(&p, b->expires_at);
        pgp_int(&p, b->scheduled);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_BACKUP_INSERT("$"), &p, &affected);
        return r < 0 ? r : affected > 0 ? 0 : -EUSERS;
}

static int pg_volumes_backup_get(StoreVolumes *h, const char *owner, const char *id, StoreVolumeBackup *ret) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, VOLUMES_SQL_BACKUP_GET("$"), &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        backup_of(res, 0, ret);
        return 0;
}

static int pg_volumes_backup_list(StoreVolumes *h, const char *owner, const char *volume_id, int64_t after_created,
                                  const char *after_id, size_t limit, StoreVolumeBackup **ret, size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, volume_id);
        pgp_int(&p, after_created);
        pgp_text(&p, after_id);
        pgp_int(&p, (int64_t)limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, VOLUMES_SQL_BACKUP_LIST("$"), &p, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        StoreVolumeBackup *all = calloc(n > 0 ? (size_t)n : 1, sizeof(*all));
        if (!all)
                return -ENOMEM;
        for (int i = 0; i < n; i++)
                backup_of(res, i, &all[i]);
        *ret = all;
        *ret_n = (size_t)n;
        return 0;
}

/* The rows text answers for (now, limit), each read by row_of into *ret,
 * an array of `size`-byte entries. */
static int rows_by_time(StoreVolumes *h, const char *text, int64_t now, size_t limit, size_t size,
                        void (*row_of)(const PGresult *, int, void *), void **ret, size_t *ret_n) {
        PgParams p = { 0 };
        pgp_int(&p, now);
        pgp_int(&p, (int64_t)limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, text, &p, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        char *all = calloc(n > 0 ? (size_t)n : 1, size);
        if (!all)
                return -ENOMEM;
        for (int i = 0; i < n; i++)
                row_of(res, i, all + size * (size_t)i);
        *ret = all;
        *ret_n = (size_t)n;
        return 0;
}

static void backup_row(const PGresult *res, int i, void *ret) {
        backup_of(res, i, ret);
}

static void volume_row(const PGresult *res, int i, void *ret) {
        volume_of(res, i, ret);
}

static int pg_volumes_backups_expired(StoreVolumes *h, int64_t now, size_t limit, StoreVolumeBackup **ret,
                                      size_t *ret_n) {
        return rows_by_time(h, VOLUMES_SQL_BACKUPS_EXPIRED("$"), now, limit, sizeof(**ret), backup_row,
                            (void **)ret, ret_n);
}

static int pg_volumes_backups_due(StoreVolumes *h, int64_t now, size_t limit, StoreVolume **ret, size_t *ret_n) {
        return rows_by_time(h, VOLUMES_SQL_BACKUPS_DUE("$"), now, limit, sizeof(**ret), volume_row, (void **)ret,
                            ret_n);
}

static int pg_volumes_set_policy(StoreVolumes *h, const char *owner, const char *id,
                                 const StoreVolumeBackupPolicy *pol) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, id);
        pgp_int(&p, pol->every_minutes);
        pgp_int(&p, pol->retention_days);
        pgp_int(&p, pol->next_at);
        pgp_text(&p, pol->cron);
        const uint32_t keep[] = { pol->keep.last, pol->keep.hourly, pol->keep.daily,
                                  pol->keep.weekly, pol->keep.monthly, pol->keep.yearly };
        for (int i = 0; i < 6; i++)
                pgp_int(&p, keep[i]);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_SET_POLICY("$"), &p, &affected);
        return r < 0 ? r : affected > 0 ? 0 : -ENOENT;
}

/* One UPDATE of the row as it was read: of two hosts claiming one due
 * time, PostgreSQL lets the second's update find the row changed. */
static int pg_volumes_claim_backup(StoreVolumes *h, const char *id, int64_t due_at, int64_t next_at) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_int(&p, due_at);
        pgp_int(&p, next_at);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_CLAIM_BACKUP("$"), &p, &affected);
        return r < 0 ? r : affected > 0 ? 0 : -EALREADY;
}

static int pg_volumes_kept_by_counts(StoreVolumes *h, const char *after_id, size_t limit, StoreVolume **ret,
                                     size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, after_id);
        pgp_int(&p, (int64_t)limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, VOLUMES_SQL_KEPT_BY_COUNTS("$"), &p, &res);
        return r < 0 ? r : volume_rows(res, ret, ret_n);
}

static int pg_volumes_backup_remove(StoreVolumes *h, const char *owner, const char *id) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, id);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c, VOLUMES_SQL_BACKUP_REMOVE("$"), &p, &affected);
        return r < 0 ? r : affected > 0 ? 0 : -ENOENT;
}

const StoreVolumeOps store_postgres_volumes = {
        .open = pg_volumes_open,
        .close = pg_volumes_close,
        .set_writer = pg_volumes_set_writer,
        .insert = pg_volumes_insert,
        .get = pg_volumes_get,
        .list = pg_volumes_list,
        .resize_begin = pg_volumes_resize_begin,
        .resize_end = pg_volumes_resize_end,
        .remove = pg_volumes_remove,
        .attach = pg_volumes_attach,
        .detach = pg_volumes_detach,
        .detach_sandbox = pg_volumes_detach_sandbox,
        .attachments = pg_volumes_attachments,
        .backup_insert = pg_volumes_backup_insert,
        .backup_get = pg_volumes_backup_get,
        .backup_list = pg_volumes_backup_list,
        .backup_remove = pg_volumes_backup_remove,
        .backups_expired = pg_volumes_backups_expired,
        .set_policy = pg_volumes_set_policy,
        .backups_due = pg_volumes_backups_due,
        .claim_backup = pg_volumes_claim_backup,
        .kept_by_counts = pg_volumes_kept_by_counts,
};
