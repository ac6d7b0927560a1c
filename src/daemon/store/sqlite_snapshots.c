/* The snapshots in the SQLite backend. */
#include "daemon/store/store_snapshots.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreSnapshots {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its transactions never interleave */
};

/* The snapshots table's history (sqldb.h's SqlMigration). Step 1 is the
 * table as the daemon made it before the versions were kept (CREATE ... IF
 * NOT EXISTS on every start), so a database of that time takes it as done. */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS snapshots ("
          "  id TEXT PRIMARY KEY,"
          "  owner TEXT NOT NULL,"
          "  key_id TEXT NOT NULL,"
          "  sandbox_id TEXT NOT NULL,"
          "  name TEXT,"
          "  labels TEXT NOT NULL,"
          "  spec TEXT NOT NULL,"
          "  mode TEXT NOT NULL,"
          "  size_bytes INTEGER NOT NULL,"
          "  created_at INTEGER NOT NULL,"
          "  expires_at INTEGER NOT NULL DEFAULT 0);"
          "CREATE INDEX IF NOT EXISTS snapshots_owner ON snapshots (owner, created_at, id);" },
        /* 2: a record's version, for conditional updates */
        { "snapshots", "version", "ALTER TABLE snapshots ADD COLUMN version INTEGER NOT NULL DEFAULT 1" },
        /* 3: its home host */
        { "snapshots", "host_id", "ALTER TABLE snapshots ADD COLUMN host_id TEXT NOT NULL DEFAULT ''" },
};

/* Records a client may see. Whether a snapshot is transient is read from
 * its spec, where the fork that makes it says so, rather than kept in a
 * column of its own: the spec stays the one place that says it, and the
 * rows it hides are few (a fork's, for the time of the fork). */
#define NOT_TRANSIENT "json_extract(spec, '$." SNAPSHOT_TRANSIENT "') IS NULL"
/* A build's layer, said by its spec as a transient one is. */
#define NOT_LAYER "json_extract(spec, '$." SNAPSHOT_LAYER "') IS NULL"
#define VISIBLE NOT_TRANSIENT " AND " NOT_LAYER
#define COLUMNS                                                                                             \
        "id, owner, key_id, sandbox_id, name, labels, spec, mode, size_bytes, created_at, expires_at, version, " \
        "host_id, NOT (" NOT_LAYER ")"

static int sqlite_snapshots_open(const char *location, StoreSnapshots **ret) {
        return sqldb_handle_open(location, "snapshots", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_snapshots_close(StoreSnapshots *h) {
        sqldb_handle_close(h);
}

/* Ends a transaction begun with BEGIN IMMEDIATE: COMMIT when r is not an
 * error, else ROLLBACK. */
static int transaction_end(StoreSnapshots *h, int r) {
        if (r >= 0 && (r = sqldb_exec(h->sql, "COMMIT")) >= 0)
                return r;
        (void)sqldb_exec(h->sql, "ROLLBACK");
        return r;
}

static void bind_opt_text(sqlite3_stmt *st, int col, const char *text) {
        if (text)
                sqlite3_bind_text(st, col, text, -1, SQLITE_STATIC);
        else
                sqlite3_bind_null(st, col);
}

static char *dup_col(sqlite3_stmt *st, int col) {
        const unsigned char *t = sqlite3_column_text(st, col);
        return t ? strdup((const char *)t) : NULL;
}

/* A row of COLUMNS. */
static int read_row(sqlite3_stmt *st, SnapshotRow *ret) {
        SnapshotRow r = { 0 };
        const unsigned char *id = sqlite3_column_text(st, 0), *mode = sqlite3_column_text(st, 7);
        snprintf(r.id, sizeof r.id, "%s", id ? (const char *)id : "");
        r.owner = dup_col(st, 1);
        r.key_id = dup_col(st, 2);
        r.sandbox_id = dup_col(st, 3);
        r.name = dup_col(st, 4);
        r.labels = dup_col(st, 5);
        r.spec = dup_col(st, 6);
        snprintf(r.mode, sizeof r.mode, "%s", mode ? (const char *)mode : "disk");
        snprintf(r.state, sizeof r.state, "ready");
        r.size_bytes = sqlite3_column_int64(st, 8);
        r.created_at = sqlite3_column_int64(st, 9);
        r.expires_at = sqlite3_column_int64(st, 10);
        r.version = (uint64_t)sqlite3_column_int64(st, 11);
        const unsigned char *host = sqlite3_column_text(st, 12);
        snprintf(r.host_id, sizeof r.host_id, "%s", host ? (const char *)host : "");
        r.layer = sqlite3_column_int(st, 13) != 0;
        if (!r.owner || !r.key_id || !r.sandbox_id || !r.labels || !r.spec ||
            (sqlite3_column_type(st, 4) != SQLITE_NULL && !r.name)) {
                store_snapshot_row_clear(&r);
                return -ENOMEM;
        }
        *ret = r;
        return 0;
}

static int usage_locked(StoreSnapshots *h, const char *owner, StoreSnapshotUsage *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT count(*), coalesce(sum(size_bytes), 0) FROM snapshots WHERE owner = ? AND " NOT_LAYER,
                               -1,
                               &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        *ret = (StoreSnapshotUsage){ .count = sqlite3_column_int64(st, 0), .bytes = sqlite3_column_int64(st, 1) };
        return 0;
}

static int insert_locked(StoreSnapshots *h, const SnapshotRow *row) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO snapshots (id, owner, key_id, sandbox_id, name, labels, spec, mode, "
                               "size_bytes, created_at, expires_at, version, host_id) "
                               "VALUES (?,?,?,?,?,?,?,?,?,?,?,1,?)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, row->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, row->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, row->key_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, row->sandbox_id, -1, SQLITE_STATIC);
        bind_opt_text(st, 5, row->name);
        sqlite3_bind_text(st, 6, row->labels, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 7, row->spec, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 8, row->mode, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 9, row->size_bytes);
        sqlite3_bind_int64(st, 10, row->created_at);
        sqlite3_bind_int64(st, 11, row->expires_at);
        sqlite3_bind_text(st, 12, row->host_id, -1, SQLITE_STATIC);
        return sqldb_errno(sqlite3_step(st));
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_snapshots_set_writer(StoreSnapshots *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int sqlite_snapshots_insert(StoreSnapshots *h, const SnapshotRow *row, unsigned max_per_owner,
                                   int64_t max_bytes_per_owner) {
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        StoreSnapshotUsage u;
        if (row->layer || ((r = usage_locked(h, row->owner, &u)) == 0 &&
                           (r = store_snapshot_fits(&u, row, max_per_owner, max_bytes_per_owner)) == 0))
                r = insert_locked(h, row);
        return transaction_end(h, r);
}

/* One row by id: of owner and neither transient nor a layer, or (owner
 * NULL) any. */
static int get_locked(StoreSnapshots *h, const char *owner, const char *id, SnapshotRow *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        const char *q = owner ? "SELECT " COLUMNS " FROM snapshots WHERE id = ?1 AND owner = ?2 AND " VISIBLE
                              : "SELECT " COLUMNS " FROM snapshots WHERE id = ?1";
        if (sqlite3_prepare_v2(h->sql, q, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        if (owner)
                sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        return read_row(st, ret);
}

static int sqlite_snapshots_get(StoreSnapshots *h, const char *owner, const char *id, SnapshotRow *ret) {
        if (!owner)
                return -ENOENT;
        LOCKED(h);
        return get_locked(h, owner, id, ret);
}

static int sqlite_snapshots_get_any(StoreSnapshots *h, const char *id, SnapshotRow *ret) {
        LOCKED(h);
        return get_locked(h, NULL, id, ret);
}

static int sqlite_snapshots_list(StoreSnapshots *h, const StoreSnapshotFilter *f, SnapshotRow **ret,
                                 size_t *ret_n) {
        SnapshotRow *rows = calloc(f->limit ? f->limit : 1, sizeof(*rows));
        if (!rows)
                return -ENOMEM;
        size_t n = 0;
        int r = 0;
        {
                LOCKED(h);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(h->sql,
                                       "SELECT " COLUMNS " FROM snapshots WHERE owner = ?1 AND " VISIBLE " "
                                       "AND (?2 IS NULL OR sandbox_id = ?2) AND (?3 IS NULL OR name = ?3) "
                                       "AND (?5 IS NULL OR created_at > ?4 OR (created_at = ?4 AND id > ?5)) "
                                       "ORDER BY created_at, id LIMIT ?6",
                                       -1, &st, NULL) != SQLITE_OK) {
                        free(rows);
                        return -EIO;
                }
                sqlite3_bind_text(st, 1, f->owner, -1, SQLITE_STATIC);
                bind_opt_text(st, 2, f->sandbox_id);
                bind_opt_text(st, 3, f->name);
                sqlite3_bind_int64(st, 4, f->cursor_at);
                bind_opt_text(st, 5, f->cursor_id);
                sqlite3_bind_int64(st, 6, f->limit);
                int rc = SQLITE_DONE;
                while (n < f->limit && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                        if ((r = read_row(st, &rows[n])) < 0)
                                break;
                        n++;
                }
                if (r == 0 && rc != SQLITE_ROW && rc != SQLITE_DONE)
                        r = sqldb_errno(rc) ?: -EIO;
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        store_snapshot_row_clear(&rows[i]);
                free(rows);
                return r;
        }
        *ret = rows;
        *ret_n = n;
        return 0;
}

/* The update, inside the transaction: 1 when a row changed, 0 when none. */
static int update_locked(StoreSnapshots *h, const char *owner, const char *id, uint64_t version,
                         const StoreSnapshotChange *c) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE snapshots SET name = CASE WHEN ?3 THEN ?4 ELSE name END, "
                               "labels = coalesce(?5, labels), "
                               "expires_at = CASE WHEN ?6 > 0 THEN ?6 ELSE expires_at END, "
                               "version = version + 1 "
                               "WHERE id = ?1 AND owner = ?2 AND (?7 = 0 OR version = ?7) AND " VISIBLE,
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 3, c->set_name);
        bind_opt_text(st, 4, c->name);
        bind_opt_text(st, 5, c->labels);
        sqlite3_bind_int64(st, 6, c->expires_at);
        sqlite3_bind_int64(st, 7, (sqlite3_int64)version);
        int r = sqldb_errno(sqlite3_step(st));
        return r < 0 ? r : sqlite3_changes(h->sql) > 0;
}

static int sqlite_snapshots_update(StoreSnapshots *h, const char *owner, const char *id, uint64_t version,
                                   const StoreSnapshotChange *c, SnapshotRow *ret) {
        SnapshotRow row = { 0 };
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        if ((r = update_locked(h, owner, id, version, c)) == 0) {
                /* Nothing changed: the row is gone (or not owner's) or has
                 * moved on from the version the caller read. */
                r = get_locked(h, owner, id, &row);
                store_snapshot_row_clear(&row);
                r = r == 0 ? -ESTALE : r;
        } else if (r > 0)
                r = get_locked(h, owner, id, &row);
        if ((r = transaction_end(h, r)) < 0) {
                store_snapshot_row_clear(&row);
                return r;
        }
        *ret = row;
        return 0;
}

static int sqlite_snapshots_delete(StoreSnapshots *h, const char *owner, const char *id) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "DELETE FROM snapshots WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        bind_opt_text(st, 2, owner);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 0 ? -ENOENT : 0;
}

static int sqlite_snapshots_usage(StoreSnapshots *h, const char *owner, StoreSnapshotUsage *ret) {
        LOCKED(h);
        return usage_locked(h, owner, ret);
}

#define OF_HOST "(?3 IS NULL OR host_id IN (?3, ''))"
static int sqlite_snapshots_ids(StoreSnapshots *h, StoreSnapshotIds which, const char *host, int64_t now,
                                size_t max, char (**ret)[SNAPSHOT_ID_LEN + 1], size_t *ret_n) {
        static const char *const queries[] = {
                [STORE_SNAPSHOT_IDS_ALL] = "SELECT id FROM snapshots WHERE " OF_HOST " ORDER BY id LIMIT ?2",
                [STORE_SNAPSHOT_IDS_TRANSIENT] = "SELECT id FROM snapshots WHERE NOT " NOT_TRANSIENT " AND " OF_HOST
                                                 " ORDER BY id LIMIT ?2",
                [STORE_SNAPSHOT_IDS_EXPIRED] = "SELECT id FROM snapshots WHERE expires_at > 0 AND expires_at <= ?1 "
                                               "AND " OF_HOST " ORDER BY expires_at, id LIMIT ?2",
        };
        if ((size_t)which >= ELEMENTSOF(queries))
                return -EINVAL;
        char(*ids)[SNAPSHOT_ID_LEN + 1] = NULL;
        size_t n = 0, cap = 0;
        int r = 0;
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, queries[which], -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_int64(st, 2, max > INT64_MAX ? INT64_MAX : (sqlite3_int64)max);
        if (host)
                sqlite3_bind_text(st, 3, host, -1, SQLITE_STATIC);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == cap) {
                        size_t want = cap ? cap * 2 : 16;
                        void *grown = reallocarray(ids, want, sizeof(*ids));
                        if (!grown) {
                                r = -ENOMEM;
                                break;
                        }
                        ids = grown;
                        cap = want;
                }
                const unsigned char *t = sqlite3_column_text(st, 0);
                snprintf(ids[n++], sizeof ids[0], "%s", t ? (const char *)t : "");
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = sqldb_errno(rc) ?: -EIO;
        if (r < 0) {
                free(ids);
                return r;
        }
        *ret = ids;
        *ret_n = n;
        return 0;
}

const StoreSnapshotOps store_sqlite_snapshots = {
        .open = sqlite_snapshots_open,
        .close = sqlite_snapshots_close,
        .insert = sqlite_snapshots_insert,
        .set_writer = sqlite_snapshots_set_writer,
        .get = sqlite_snapshots_get,
        .get_any = sqlite_snapshots_get_any,
        .list = sqlite_snapshots_list,
        .update = sqlite_snapshots_update,
        .delete = sqlite_snapshots_delete,
        .usage = sqlite_snapshots_usage,
        .ids = sqlite_snapshots_ids,
};
