#include "daemon/store/sqldb.h"

#include <errno.h>

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
            (r = sqldb_exec(sql, "PRAGMA foreign_keys=ON;")) < 0) {
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
