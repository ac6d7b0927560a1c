/* The owners' OpenTelemetry exports in the SQLite backend (store_otel.h):
 * one table, each write conditional on the version it read. */
#include "daemon/store/store_otel.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreOtel {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The exports table's history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS otel_exports ("
          "  id TEXT PRIMARY KEY,"
          "  owner TEXT NOT NULL,"
          "  endpoint TEXT NOT NULL,"
          "  headers TEXT,"
          "  signals TEXT NOT NULL,"
          "  enabled INTEGER NOT NULL,"
          "  created_at INTEGER NOT NULL,"
          "  updated_at INTEGER NOT NULL,"
          "  events_after INTEGER NOT NULL,"
          "  metrics_after INTEGER NOT NULL,"
          "  next_at INTEGER NOT NULL,"
          "  claimed_by TEXT,"
          "  claimed_until INTEGER NOT NULL,"
          "  last_push_at INTEGER NOT NULL,"
          "  last_status INTEGER NOT NULL,"
          "  last_error TEXT,"
          "  sent_logs INTEGER NOT NULL,"
          "  sent_points INTEGER NOT NULL,"
          "  dropped INTEGER NOT NULL,"
          "  version INTEGER NOT NULL);"
          "CREATE INDEX IF NOT EXISTS otel_exports_owner ON otel_exports (owner, created_at);" },
};

/* The columns every write sets, in the order of the binds below (2..19). */
#define OTEL_FIELDS                                                                                       \
        "endpoint, headers, signals, enabled, updated_at, events_after, metrics_after, next_at, claimed_by, " \
        "claimed_until, last_push_at, last_status, last_error, sent_logs, sent_points, dropped"
#define OTEL_COLUMNS "id, owner, created_at, version, " OTEL_FIELDS

static int sqlite_otel_open(const char *location, StoreOtel **ret) {
        return sqldb_handle_open(location, "otel", migrations, ELEMENTSOF(migrations), sizeof(**ret), (void **)ret);
}

static void sqlite_otel_close(StoreOtel *h) {
        sqldb_handle_close(h);
}

/* Binds the fields of x from `at` on (OTEL_FIELDS' order). */
static void bind_fields(sqlite3_stmt *st, int at, const OtelExportRecord *x) {
        sqlite3_bind_text(st, at, x->endpoint, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, at + 1, x->headers);
        sqlite3_bind_text(st, at + 2, x->signals, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, at + 3, x->enabled ? 1 : 0);
        sqlite3_bind_int64(st, at + 4, x->updated_at);
        sqlite3_bind_int64(st, at + 5, x->events_after);
        sqlite3_bind_int64(st, at + 6, x->metrics_after);
        sqlite3_bind_int64(st, at + 7, x->next_at);
        sqldb_bind_opt(st, at + 8, x->claimed_by);
        sqlite3_bind_int64(st, at + 9, x->claimed_until);
        sqlite3_bind_int64(st, at + 10, x->last_push_at);
        sqlite3_bind_int(st, at + 11, x->last_status);
        sqldb_bind_opt(st, at + 12, x->last_error);
        sqlite3_bind_int64(st, at + 13, x->sent_logs);
        sqlite3_bind_int64(st, at + 14, x->sent_points);
        sqlite3_bind_int64(st, at + 15, x->dropped);
}

static OtelExportRecord export_row(sqlite3_stmt *st) {
        OtelExportRecord x = { .owner = sqldb_col(st, 1), .created_at = sqlite3_column_int64(st, 2),
                               .version = sqlite3_column_int64(st, 3), .endpoint = sqldb_col(st, 4),
                               .headers = sqldb_col(st, 5), .signals = sqldb_col(st, 6),
                               .enabled = sqlite3_column_int(st, 7) != 0, .updated_at = sqlite3_column_int64(st, 8),
                               .events_after = sqlite3_column_int64(st, 9),
                               .metrics_after = sqlite3_column_int64(st, 10), .next_at = sqlite3_column_int64(st, 11),
                               .claimed_by = sqldb_col(st, 12), .claimed_until = sqlite3_column_int64(st, 13),
                               .last_push_at = sqlite3_column_int64(st, 14), .last_status = sqlite3_column_int(st, 15),
                               .last_error = sqldb_col(st, 16), .sent_logs = sqlite3_column_int64(st, 17),
                               .sent_points = sqlite3_column_int64(st, 18), .dropped = sqlite3_column_int64(st, 19) };
        snprintf(x.id, sizeof x.id, "%s", sqldb_col(st, 0) ?: "");
        return x;
}

static int walk(sqlite3_stmt *st, StoreOtelFn fn, void *userdata, bool one) {
        int rc, r = 0;
        bool any = false;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                OtelExportRecord x = export_row(st);
                any = true;
                r = fn(userdata, &x);
        }
        if (r < 0)
                return r;
        if (rc != SQLITE_DONE && rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        return one && !any ? -ENOENT : 0;
}

typedef struct Put {
        StoreOtel *h;
        const OtelExportRecord *x;
        unsigned max;
} Put;

static int put_tx(void *userdata) {
        const Put *p = userdata;
        _cleanup_stmt_ sqlite3_stmt *count = NULL;
        if (sqlite3_prepare_v2(p->h->sql, "SELECT count(*) FROM otel_exports WHERE owner = ?", -1, &count, NULL) !=
            SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(count, 1, p->x->owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(count);
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        if (p->max > 0 && sqlite3_column_int64(count, 0) >= (int64_t)p->max)
                return -EDQUOT;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(p->h->sql,
                               "INSERT INTO otel_exports (" OTEL_COLUMNS ") VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, "
                               "?, ?, ?, ?, ?, ?, ?, ?)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, p->x->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, p->x->owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, p->x->created_at);
        bind_fields(st, 4, p->x);
        return sqldb_errno(sqlite3_step(st)); /* a taken id: -EEXIST */
}

static int sqlite_otel_put(StoreOtel *h, const OtelExportRecord *x, unsigned max_per_owner) {
        if (!x->owner || !x->endpoint || !x->signals)
                return -EINVAL;
        LOCKED(h);
        Put p = { .h = h, .x = x, .max = max_per_owner };
        return sqldb_transaction(h->sql, put_tx, &p);
}

static int sqlite_otel_get(StoreOtel *h, const char *id, const char *owner, StoreOtelFn fn, void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT " OTEL_COLUMNS " FROM otel_exports WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 2, owner);
        return walk(st, fn, userdata, true);
}

static int sqlite_otel_list(StoreOtel *h, const char *owner, StoreOtelFn fn, void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT " OTEL_COLUMNS " FROM otel_exports WHERE (?1 IS NULL OR owner = ?1) "
                               "ORDER BY created_at, id",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqldb_bind_opt(st, 1, owner);
        return walk(st, fn, userdata, false);
}

static int missing_or_stale(StoreOtel *h, const char *id, const char *owner) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT 1 FROM otel_exports WHERE id = ? AND owner = ?", -1, &st, NULL) !=
            SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        return rc == SQLITE_ROW ? -ESTALE : rc == SQLITE_DONE ? -ENOENT : sqldb_errno(rc) ?: -EIO;
}

static int sqlite_otel_update(StoreOtel *h, const OtelExportRecord *x) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE otel_exports SET endpoint = ?1, headers = ?2, signals = ?3, enabled = ?4, "
                               "updated_at = ?5, events_after = ?6, metrics_after = ?7, next_at = ?8, claimed_by = ?9, "
                               "claimed_until = ?10, last_push_at = ?11, last_status = ?12, last_error = ?13, "
                               "sent_logs = ?14, sent_points = ?15, dropped = ?16, version = version + 1 "
                               "WHERE id = ?17 AND owner = ?18 AND version = ?19",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        bind_fields(st, 1, x);
        sqlite3_bind_text(st, 17, x->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 18, x->owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 19, x->version);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : missing_or_stale(h, x->id, x->owner);
}

static int sqlite_otel_remove(StoreOtel *h, const char *id, const char *owner) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "DELETE FROM otel_exports WHERE id = ? AND owner = ?", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : -ENOENT;
}

const StoreOtelOps store_sqlite_otel = {
        .open = sqlite_otel_open,
        .close = sqlite_otel_close,
        .put = sqlite_otel_put,
        .get = sqlite_otel_get,
        .list = sqlite_otel_list,
        .update = sqlite_otel_update,
        .remove = sqlite_otel_remove,
};
