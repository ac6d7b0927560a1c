/* The volumes in the SQLite backend (store_volumes.h): the statements of
 * store_volumes_sql.h, each one atomic on the one connection. */
#include "daemon/store/store_volumes.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"
#include "daemon/store/store_volumes_sql.h"

struct StoreVolumes {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The volumes' history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the tables as first released */
        { NULL, NULL, VOLUMES_SQL_SCHEMA },
        /* 2: backup policies and the backups' expiry */
        { NULL, NULL, VOLUMES_SQL_SCHEDULES },
        /* 3: cron schedules and keep counts */
        { NULL, NULL, VOLUMES_SQL_RULES },
};

static int sqlite_volumes_open(const char *location, StoreVolumes **ret) {
        return sqldb_handle_open(location, "volumes", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_volumes_close(StoreVolumes *h) {
        sqldb_handle_close(h);
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_volumes_set_writer(StoreVolumes *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int prepare(StoreVolumes *h, const char *text, sqlite3_stmt **ret) {
        return sqlite3_prepare_v2(h->sql, text, -1, ret, NULL) == SQLITE_OK ? 0 : -EIO;
}

/* Runs a statement that answers nothing; *ret_changes the rows it changed. */
static int step_done(StoreVolumes *h, sqlite3_stmt *st, int *ret_changes) {
        int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        if (ret_changes)
                *ret_changes = sqlite3_changes(h->sql);
        return 0;
}

/* The one number a COUNT answers. */
static int count_of(StoreVolumes *h, const char *text, const char *arg, int64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, text, &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_ROW)
                return -EIO;
        *ret = sqlite3_column_int64(st, 0);
        return 0;
}

static void volume_of(sqlite3_stmt *st, StoreVolume *v) {
        *v = (StoreVolume){ .size_mib = (uint32_t)sqlite3_column_int64(st, 4), .shared = sqlite3_column_int(st, 5) != 0,
                            .created_at = sqlite3_column_int64(st, 7),
                            .policy = { .every_minutes = (uint32_t)sqlite3_column_int64(st, 8),
                                        .retention_days = (uint32_t)sqlite3_column_int64(st, 9),
                                        .next_at = sqlite3_column_int64(st, 10),
                                        .keep = { .last = (uint32_t)sqlite3_column_int64(st, 12),
                                                  .hourly = (uint32_t)sqlite3_column_int64(st, 13),
                                                  .daily = (uint32_t)sqlite3_column_int64(st, 14),
                                                  .weekly = (uint32_t)sqlite3_column_int64(st, 15),
                                                  .monthly = (uint32_t)sqlite3_column_int64(st, 16),
                                                  .yearly = (uint32_t)sqlite3_column_int64(st, 17) } } };
        snprintf(v->policy.cron, sizeof v->policy.cron, "%s", sqldb_col(st, 11) ?: "");
        snprintf(v->id, sizeof v->id, "%s", sqldb_col(st, 0) ?: "");
        snprintf(v->owner, sizeof v->owner, "%s", sqldb_col(st, 1) ?: "");
        snprintf(v->name, sizeof v->name, "%s", sqldb_col(st, 2) ?: "");
        snprintf(v->labels, sizeof v->labels, "%s", sqldb_col(st, 3) ?: "{}");
        if (store_volume_state_from_name(sqldb_col(st, 6), &v->state) < 0)
                v->state = STORE_VOLUME_RESIZING; /* unknown: not attachable */
}

static int get_locked(StoreVolumes *h, const char *owner, const char *id, StoreVolume *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_GET("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        volume_of(st, ret);
        return 0;
}

static int sqlite_volumes_insert(StoreVolumes *h, const StoreVolume *v, const StoreVolumeBounds *b) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_INSERT("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, v->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, v->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, v->name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, v->labels, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, v->size_mib);
        sqlite3_bind_int(st, 6, v->shared);
        sqlite3_bind_text(st, 7, store_volume_state_name(v->state), -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 8, v->created_at);
        sqlite3_bind_int64(st, 9, b->max_count);
        sqlite3_bind_int64(st, 10, (sqlite3_int64)b->max_total_mib);
        int changes = 0, r = step_done(h, st, &changes);
        if (r < 0 || changes > 0)
                return r;
        int64_t n = 0;
        if ((r = count_of(h, VOLUMES_SQL_COUNT("?"), v->owner, &n)) < 0)
                return r;
        return n >= b->max_count ? -EUSERS : -EDQUOT;
}

static int sqlite_volumes_get(StoreVolumes *h, const char *owner, const char *id, StoreVolume *ret) {
        LOCKED(h);
        return get_locked(h, owner, id, ret);
}

/* A page's parameters: 1 owner, 2 what narrows it ("" nothing), 3 and 4
 * the row after which it starts, 5 its length. */
static void bind_page(sqlite3_stmt *st, const char *owner, const char *which, int64_t after_created,
                      const char *after_id, size_t limit) {
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, which, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, after_created);
        sqlite3_bind_text(st, 4, after_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)limit);
}

/* The volumes st answers, at most limit, into *ret (malloc'd). */
static int volume_rows(sqlite3_stmt *st, size_t limit, StoreVolume **ret, size_t *ret_n) {
        StoreVolume *all = calloc(limit ? limit : 1, sizeof(*all));
        if (!all)
                return -ENOMEM;
        size_t n = 0;
        int rc = SQLITE_DONE;
        while (n < limit && (rc = sqlite3_step(st)) == SQLITE_ROW)
                volume_of(st, &all[n++]);
        if (n < limit && rc != SQLITE_DONE) {
                free(all);
                return sqldb_errno(rc) ?: -EIO;
        }
        *ret = all;
        *ret_n = n;
        return 0;
}

static int sqlite_volumes_list(StoreVolumes *h, const char *owner, const char *name, int64_t after_created,
                               const char *after_id, size_t limit, StoreVolume **ret, size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_LIST("?"), &st) < 0)
                return -EIO;
        bind_page(st, owner, name, after_created, after_id, limit);
        return volume_rows(st, limit, ret, ret_n);
}

static int sqlite_volumes_resize_begin(StoreVolumes *h, const char *owner, const char *id, uint32_t new_mib,
                                       const StoreVolumeBounds *b) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_RESIZE_BEGIN("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, new_mib);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)b->max_total_mib);
        int changes = 0, r = step_done(h, st, &changes);
        if (r < 0 || changes > 0)
                return r;
        StoreVolume v;
        int64_t attached = 0;
        if ((r = get_locked(h, owner, id, &v)) < 0 ||
            (r = count_of(h, VOLUMES_SQL_ATTACHED("?"), id, &attached)) < 0)
                return r;
        return v.state != STORE_VOLUME_READY || attached > 0 ? -EBUSY : -EDQUOT;
}

static int sqlite_volumes_resize_end(StoreVolumes *h, const char *id, uint32_t size_mib) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_RESIZE_END("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, size_mib);
        int changes = 0, r = step_done(h, st, &changes);
        return r < 0 ? r : changes > 0 ? 0 : -ENOENT;
}

/* Runs text with (owner, id); *ret_changes the rows changed. */
static int owner_id_step(StoreVolumes *h, const char *text, const char *owner, const char *id, int *ret_changes) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, text, &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
        return step_done(h, st, ret_changes);
}

typedef struct Removal {
        StoreVolumes *h;
        const char *owner, *id;
        int changes;
} Removal;

static int remove_forced(void *userdata) {
        Removal *m = userdata;
        int r = owner_id_step(m->h, VOLUMES_SQL_DETACH_ALL("?"), m->owner, m->id, NULL);
        return r < 0 ? r : owner_id_step(m->h, VOLUMES_SQL_REMOVE_FORCED("?"), m->owner, m->id, &m->changes);
}

static int sqlite_volumes_remove(StoreVolumes *h, const char *owner, const char *id, bool force) {
        LOCKED(h);
        Removal m = { .h = h, .owner = owner, .id = id };
        int r = force ? sqldb_transaction(h->sql, remove_forced, &m)
                      : owner_id_step(h, VOLUMES_SQL_REMOVE("?"), owner, id, &m.changes);
        if (r < 0 || m.changes > 0)
                return r;
        StoreVolume v;
        r = get_locked(h, owner, id, &v);
        return r < 0 ? r : -EBUSY;
}

static int sqlite_volumes_attach(StoreVolumes *h, const char *owner, const StoreVolumeAttachment *a) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_ATTACH("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, a->volume_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, a->sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, a->path, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, a->read_only);
        sqlite3_bind_int64(st, 5, a->created_at);
        sqlite3_bind_text(st, 6, owner, -1, SQLITE_STATIC);
        int changes = 0, r = step_done(h, st, &changes);
        if (r == -EEXIST)
                return -EBUSY;
        if (r < 0 || changes > 0)
                return r;
        StoreVolume v;
        r = get_locked(h, owner, a->volume_id, &v);
        return r < 0 ? r : -EAGAIN;
}

static int sqlite_volumes_detach(StoreVolumes *h, const char *volume_id, const char *sandbox_id) {
        LOCKED(h);
        int changes = 0, r = owner_id_step(h, VOLUMES_SQL_DETACH("?"), volume_id, sandbox_id, &changes);
        return r < 0 ? r : changes > 0 ? 0 : -ENOENT;
}

static int sqlite_volumes_detach_sandbox(StoreVolumes *h, const char *sandbox_id) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_DETACH_SANDBOX("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        return step_done(h, st, NULL);
}

static int sqlite_volumes_attachments(StoreVolumes *h, const char *volume_id, StoreVolumeAttachment **ret,
                                      size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_ATTACHMENTS("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, volume_id, -1, SQLITE_STATIC);
        StoreVolumeAttachment *all = NULL;
        size_t n = 0;
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                StoreVolumeAttachment *more = realloc(all, (n + 1) * sizeof(*all));
                if (!more) {
                        free(all);
                        return -ENOMEM;
                }
                all = more;
                StoreVolumeAttachment *a = &all[n++];
                *a = (StoreVolumeAttachment){ .read_only = sqlite3_column_int(st, 3) != 0,
                                              .created_at = sqlite3_column_int64(st, 4) };
                snprintf(a->volume_id, sizeof a->volume_id, "%s", sqldb_col(st, 0) ?: "");
                snprintf(a->sandbox_id, sizeof a->sandbox_id, "%s", sqldb_col(st, 1) ?: "");
                snprintf(a->path, sizeof a->path, "%s", sqldb_col(st, 2) ?: "");
        }
        if (rc != SQLITE_DONE) {
                free(all);
                return sqldb_errno(rc) ?: -EIO;
        }
        *ret = all;
        *ret_n = n;
        return 0;
}

static void backup_of(sqlite3_stmt *st, StoreVolumeBackup *b) {
        *b = (StoreVolumeBackup){ .size_mib = (uint32_t)sqlite3_column_int64(st, 4),
                                  .created_at = sqlite3_column_int64(st, 5),
                                  .expires_at = sqlite3_column_int64(st, 6),
                                  .scheduled = sqlite3_column_int(st, 7) != 0 };
        snprintf(b->id, sizeof b->id, "%s", sqldb_col(st, 0) ?: "");
        snprintf(b->owner, sizeof b->owner, "%s", sqldb_col(st, 1) ?: "");
        snprintf(b->volume_id, sizeof b->volume_id, "%s", sqldb_col(st, 2) ?: "");
        snprintf(b->name, sizeof b->name, "%s", sqldb_col(st, 3) ?: "");
}

static int sqlite_volumes_backup_insert(StoreVolumes *h, const StoreVolumeBackup *b, uint32_t max_count) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_BACKUP_INSERT("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, b->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, b->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, b->volume_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, b->name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, b->size_mib);
        sqlite3_bind_int64(st, 6, b->created_at);
        sqlite3_bind_int64(st, 7, max_count);
        sqlite3_bind_int64(st, 8, b->expires_at);
        sqlite3_bind_int(st, 9, b->scheduled);
        int changes = 0, r = step_done(h, st, &changes);
        return r < 0 ? r : changes > 0 ? 0 : -EUSERS;
}

static int sqlite_volumes_backup_get(StoreVolumes *h, const char *owner, const char *id, StoreVolumeBackup *ret) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_BACKUP_GET("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        backup_of(st, ret);
        return 0;
}

static int sqlite_volumes_backup_list(StoreVolumes *h, const char *owner, const char *volume_id,
                                      int64_t after_created, const char *after_id, size_t limit,
                                      StoreVolumeBackup **ret, size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_BACKUP_LIST("?"), &st) < 0)
                return -EIO;
        bind_page(st, owner, volume_id, after_created, after_id, limit);
        StoreVolumeBackup *all = calloc(limit ? limit : 1, sizeof(*all));
        if (!all)
                return -ENOMEM;
        size_t n = 0;
        int rc = SQLITE_DONE;
        while (n < limit && (rc = sqlite3_step(st)) == SQLITE_ROW)
                backup_of(st, &all[n++]);
        if (n < limit && rc != SQLITE_DONE) {
                free(all);
                return sqldb_errno(rc) ?: -EIO;
        }
        *ret = all;
        *ret_n = n;
        return 0;
}

/* Every row of st (bound but for its last two, now and limit) read by
 * row_of into *ret, an array of `size`-byte entries. */
static int rows_by_time(StoreVolumes *h, const char *text, int64_t now, size_t limit, size_t size,
                        void (*row_of)(sqlite3_stmt *, void *), void **ret, size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, text, &st) < 0)
                return -EIO;
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)limit);
        char *all = calloc(limit ? limit : 1, size);
        if (!all)
                return -ENOMEM;
        size_t n = 0;
        int rc = SQLITE_DONE;
        while (n < limit && (rc = sqlite3_step(st)) == SQLITE_ROW)
                row_of(st, all + size * n++);
        if (n < limit && rc != SQLITE_DONE) {
                free(all);
                return sqldb_errno(rc) ?: -EIO;
        }
        *ret = all;
        *ret_n = n;
        return 0;
}

static void backup_row(sqlite3_stmt *st, void *ret) {
        backup_of(st, ret);
}

static void volume_row(sqlite3_stmt *st, void *ret) {
        volume_of(st, ret);
}

static int sqlite_volumes_backups_expired(StoreVolumes *h, int64_t now, size_t limit, StoreVolumeBackup **ret,
                                          size_t *ret_n) {
        return rows_by_time(h, VOLUMES_SQL_BACKUPS_EXPIRED("?"), now, limit, sizeof(**ret), backup_row,
                            (void **)ret, ret_n);
}

static int sqlite_volumes_backups_due(StoreVolumes *h, int64_t now, size_t limit, StoreVolume **ret, size_t *ret_n) {
        return rows_by_time(h, VOLUMES_SQL_BACKUPS_DUE("?"), now, limit, sizeof(**ret), volume_row, (void **)ret,
                            ret_n);
}

static int sqlite_volumes_set_policy(StoreVolumes *h, const char *owner, const char *id,
                                     const StoreVolumeBackupPolicy *p) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_SET_POLICY("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, p->every_minutes);
        sqlite3_bind_int64(st, 4, p->retention_days);
        sqlite3_bind_int64(st, 5, p->next_at);
        sqlite3_bind_text(st, 6, p->cron, -1, SQLITE_STATIC);
        const uint32_t keep[] = { p->keep.last, p->keep.hourly, p->keep.daily,
                                  p->keep.weekly, p->keep.monthly, p->keep.yearly };
        for (int i = 0; i < 6; i++)
                sqlite3_bind_int64(st, 7 + i, keep[i]);
        int changes = 0, r = step_done(h, st, &changes);
        return r < 0 ? r : changes > 0 ? 0 : -ENOENT;
}

static int sqlite_volumes_claim_backup(StoreVolumes *h, const char *id, int64_t due_at, int64_t next_at) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_CLAIM_BACKUP("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, due_at);
        sqlite3_bind_int64(st, 3, next_at);
        int changes = 0, r = step_done(h, st, &changes);
        return r < 0 ? r : changes > 0 ? 0 : -EALREADY;
}

static int sqlite_volumes_kept_by_counts(StoreVolumes *h, const char *after_id, size_t limit, StoreVolume **ret,
                                         size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(h, VOLUMES_SQL_KEPT_BY_COUNTS("?"), &st) < 0)
                return -EIO;
        sqlite3_bind_text(st, 1, after_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)limit);
        return volume_rows(st, limit, ret, ret_n);
}

static int sqlite_volumes_backup_remove(StoreVolumes *h, const char *owner, const char *id) {
        LOCKED(h);
        int changes = 0, r = owner_id_step(h, VOLUMES_SQL_BACKUP_REMOVE("?"), owner, id, &changes);
        return r < 0 ? r : changes > 0 ? 0 : -ENOENT;
}

const StoreVolumeOps store_sqlite_volumes = {
        .open = sqlite_volumes_open,
        .close = sqlite_volumes_close,
        .set_writer = sqlite_volumes_set_writer,
        .insert = sqlite_volumes_insert,
        .get = sqlite_volumes_get,
        .list = sqlite_volumes_list,
        .resize_begin = sqlite_volumes_resize_begin,
        .resize_end = sqlite_volumes_resize_end,
        .remove = sqlite_volumes_remove,
        .attach = sqlite_volumes_attach,
        .detach = sqlite_volumes_detach,
        .detach_sandbox = sqlite_volumes_detach_sandbox,
        .attachments = sqlite_volumes_attachments,
        .backup_insert = sqlite_volumes_backup_insert,
        .backup_get = sqlite_volumes_backup_get,
        .backup_list = sqlite_volumes_backup_list,
        .backup_remove = sqlite_volumes_backup_remove,
        .backups_expired = sqlite_volumes_backups_expired,
        .set_policy = sqlite_volumes_set_policy,
        .backups_due = sqlite_volumes_backups_due,
        .claim_backup = sqlite_volumes_claim_backup,
        .kept_by_counts = sqlite_volumes_kept_by_counts,
};
