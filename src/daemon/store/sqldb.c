#include "daemon/store/sqldb.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int sqldb_errno(int rc) {
        switch (rc & 0xff) {
        case SQLITE_OK:
        case SQLITE_DONE:
        case SQLITE_ROW:
                return 0;
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
                return -EBUSY;
        case SQLITE_NOMEM:
                return -ENOMEM;
        case SQLITE_FULL:
                return -ENOSPC;
        case SQLITE_CONSTRAINT:
                return -EEXIST;
        case SQLITE_READONLY:
        case SQLITE_PERM:
        case SQLITE_AUTH:
                return -EPERM;
        default:
                return -EIO;
        }
}

int sqldb_exec(sqlite3 *sql, const char *text) {
        return sqldb_errno(sqlite3_exec(sql, text, NULL, NULL, NULL));
}

int sqldb_exec_transaction(sqlite3 *sql, const char *text) {
        int r = sqldb_exec(sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        if ((r = sqldb_exec(sql, text)) < 0 || (r = sqldb_exec(sql, "COMMIT")) < 0) {
                sqldb_exec(sql, "ROLLBACK");
                return r;
        }
        return 0;
}

int sqldb_transaction(sqlite3 *sql, SqlTxFn fn, void *userdata) {
        int r = sqldb_exec(sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        if ((r = fn(userdata)) >= 0 && (r = sqldb_exec(sql, "COMMIT")) >= 0)
                return 0;
        (void)sqldb_exec(sql, "ROLLBACK");
        return r;
}

int sqldb_delete_before(sqlite3 *sql, const char *text, int64_t before, int64_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(sql, text, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_int64(st, 1, before);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        *ret_n = sqlite3_changes(sql);
        return 0;
}

int sqldb_open(const char *path, sqlite3 **ret) {
        sqlite3 *sql = NULL;
        int rc = sqlite3_open_v2(path, &sql,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX |
                                         SQLITE_OPEN_NOFOLLOW,
                                 NULL);
        if (rc != SQLITE_OK) {
                sqlite3_close(sql);
                return sqldb_errno(rc) ?: -EIO;
        }
        sqlite3_busy_timeout(sql, SQLDB_BUSY_TIMEOUT_MS);
        int r;
        if ((r = sqldb_exec(sql, "PRAGMA journal_mode=WAL;")) < 0 ||
            (r = sqldb_exec(sql, "PRAGMA synchronous=NORMAL;")) < 0 ||
            (r = sqldb_exec(sql, "PRAGMA foreign_keys=ON;")) < 0 ||
            /* Reads through a mapping of the file, not pread: after another
             * connection's write (the audit's, one a request) a reader reads
             * its pages again (create_exec A/B: exec after quiet 0.96). */
            (r = sqldb_exec(sql, "PRAGMA mmap_size=67108864;")) < 0) {
                sqlite3_close(sql);
                return r;
        }
        *ret = sql;
        return 0;
}

int sqldb_open_durable(const char *path, sqlite3 **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open(path, &sql);
        if (r < 0)
                return r;
        if ((r = sqldb_exec(sql, "PRAGMA synchronous=FULL;")) < 0) {
                sqlite3_close(sql);
                return r;
        }
        *ret = sql;
        return 0;
}

int sqldb_open_schema(const char *path, const char *schema, sqlite3 **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open(path, &sql);
        if (r < 0)
                return r;
        if ((r = sqldb_exec_transaction(sql, schema)) < 0) {
                sqlite3_close(sql);
                return r;
        }
        *ret = sql;
        return 0;
}

static bool column_exists(sqlite3 *sql, const char *table, const char *column) {
        char q[160];
        snprintf(q, sizeof(q), "SELECT %s FROM %s LIMIT 0", column, table);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        return sqlite3_prepare_v2(sql, q, -1, &st, NULL) == SQLITE_OK;
}

static int kind_version(sqlite3 *sql, const char *kind, int64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(sql, "SELECT version FROM store_versions WHERE kind = ?1", -1, &st, NULL);
        if (rc != SQLITE_OK)
                return sqldb_errno(rc) ?: -EIO;
        sqlite3_bind_text(st, 1, kind, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        *ret = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
        return 0;
}

static int kind_set_version(sqlite3 *sql, const char *kind, int64_t version) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(sql,
                                    "INSERT INTO store_versions (kind, version) VALUES (?1, ?2) "
                                    "ON CONFLICT (kind) DO UPDATE SET version = excluded.version",
                                    -1, &st, NULL);
        if (rc != SQLITE_OK)
                return sqldb_errno(rc) ?: -EIO;
        sqlite3_bind_text(st, 1, kind, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, version);
        rc = sqlite3_step(st);
        return rc == SQLITE_DONE ? 0 : sqldb_errno(rc) ?: -EIO;
}

static int migrate_locked(sqlite3 *sql, const char *kind, const SqlMigration *steps, size_t n) {
        int r = sqldb_exec(sql, "CREATE TABLE IF NOT EXISTS store_versions ("
                                " kind TEXT PRIMARY KEY, version INTEGER NOT NULL)");
        int64_t version = 0;
        if (r < 0 || (r = kind_version(sql, kind, &version)) < 0)
                return r;
        if (version > (int64_t)n)
                return -EPROTONOSUPPORT;
        if (version == (int64_t)n)
                return 0;
        for (size_t i = (size_t)version; i < n; i++) {
                if (steps[i].column && column_exists(sql, steps[i].table, steps[i].column))
                        continue;
                if ((r = sqldb_exec(sql, steps[i].sql)) < 0)
                        return r;
        }
        return kind_set_version(sql, kind, (int64_t)n);
}

int sqldb_migrate(sqlite3 *sql, const char *kind, const SqlMigration *steps, size_t n) {
        int r = sqldb_exec(sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        if ((r = migrate_locked(sql, kind, steps, n)) < 0 || (r = sqldb_exec(sql, "COMMIT")) < 0) {
                (void)sqldb_exec(sql, "ROLLBACK");
                return r;
        }
        return 0;
}

int sqldb_handle_open(const char *path, const char *kind, const SqlMigration *steps, size_t n, size_t size,
                      void **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open(path, &sql);
        if (r < 0)
                return r;
        if (n > 0 && (r = sqldb_migrate(sql, kind, steps, n)) < 0) {
                sqlite3_close(sql);
                return r;
        }
        SqlHandle *h = calloc(1, size);
        if (!h) {
                sqlite3_close(sql);
                return -ENOMEM;
        }
        h->sql = sql;
        pthread_mutex_init(&h->lock, NULL);
        *ret = h;
        return 0;
}

void sqldb_handle_close(void *p) {
        SqlHandle *h = p;
        if (!h)
                return;
        sqlite3_close(h->sql);
        pthread_mutex_destroy(&h->lock);
        free(h);
}
