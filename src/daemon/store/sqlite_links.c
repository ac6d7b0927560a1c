/* The file links' secrets and one-time uses in the SQLite backend
 * (store_links.h): two tables; a use claimed by its primary key. */
#include "daemon/store/store_links.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreLinks {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The file links' history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the tables as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS file_link_secrets ("
          "  sandbox_id TEXT PRIMARY KEY,"
          "  owner TEXT NOT NULL,"
          "  secret TEXT NOT NULL,"
          "  rotated_at INTEGER NOT NULL);"
          "CREATE TABLE IF NOT EXISTS file_link_uses ("
          "  link_id TEXT PRIMARY KEY,"
          "  sandbox_id TEXT NOT NULL,"
          "  expires_at INTEGER NOT NULL);"
          "CREATE INDEX IF NOT EXISTS file_link_uses_expiry ON file_link_uses (expires_at);" },
};

static int sqlite_links_open(const char *location, StoreLinks **ret) {
        return sqldb_handle_open(location, "links", migrations, ELEMENTSOF(migrations), sizeof(**ret), (void **)ret);
}

static void sqlite_links_close(StoreLinks *h) {
        sqldb_handle_close(h);
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_links_set_writer(StoreLinks *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int secret_read(StoreLinks *h, const char *sandbox_id, StoreLinkSecret *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT owner, secret, rotated_at FROM file_link_secrets WHERE sandbox_id = ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        StoreLinkSecret s = { .owner = strdup(sqldb_col(st, 0) ?: ""), .secret = strdup(sqldb_col(st, 1) ?: ""),
                              .rotated_at = sqlite3_column_int64(st, 2) };
        if (!s.owner || !s.secret) {
                store_link_secret_clear(&s);
                return -ENOMEM;
        }
        *ret = s;
        return 0;
}

static int sqlite_links_secret_get(StoreLinks *h, const char *sandbox_id, StoreLinkSecret *ret) {
        LOCKED(h);
        return secret_read(h, sandbox_id, ret);
}

static int secret_write(StoreLinks *h, const char *sql, const char *sandbox_id, const char *owner,
                        const char *sealed, int64_t now) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, sql, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, sealed, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, now);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_links_secret_add(StoreLinks *h, const char *sandbox_id, const char *owner, const char *sealed,
                                   int64_t now, StoreLinkSecret *ret) {
        LOCKED(h);
        int r = secret_write(h,
                             "INSERT INTO file_link_secrets (sandbox_id, owner, secret, rotated_at) "
                             "VALUES (?, ?, ?, ?) ON CONFLICT (sandbox_id) DO NOTHING",
                             sandbox_id, owner, sealed, now);
        return r < 0 ? r : secret_read(h, sandbox_id, ret);
}

static int sqlite_links_secret_rotate(StoreLinks *h, const char *sandbox_id, const char *owner, const char *sealed,
                                      int64_t now) {
        LOCKED(h);
        return secret_write(h,
                            "INSERT INTO file_link_secrets (sandbox_id, owner, secret, rotated_at) "
                            "VALUES (?, ?, ?, ?) ON CONFLICT (sandbox_id) DO UPDATE SET "
                            "secret = excluded.secret, rotated_at = excluded.rotated_at",
                            sandbox_id, owner, sealed, now);
}

static int sqlite_links_use_once(StoreLinks *h, const char *link_id, const char *sandbox_id, int64_t expires_at,
                                 int64_t now) {
        LOCKED(h);
        int64_t gone = 0;
        int r = sqldb_delete_before(h->sql, "DELETE FROM file_link_uses WHERE expires_at < ?", now, &gone);
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO file_link_uses (link_id, sandbox_id, expires_at) VALUES (?, ?, ?) "
                               "ON CONFLICT (link_id) DO NOTHING",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, link_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, expires_at);
        if ((r = sqldb_errno(sqlite3_step(st))) < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : -EALREADY;
}

const StoreLinkOps store_sqlite_links = {
        .open = sqlite_links_open,
        .close = sqlite_links_close,
        .set_writer = sqlite_links_set_writer,
        .secret_get = sqlite_links_secret_get,
        .secret_add = sqlite_links_secret_add,
        .secret_rotate = sqlite_links_secret_rotate,
        .use_once = sqlite_links_use_once,
};
