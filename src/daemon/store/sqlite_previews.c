/* The previews in the SQLite backend (store_previews.h): one table keyed by
 * sandbox and port. */
#include "daemon/store/store_previews.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StorePreviews {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The previews' history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS previews ("
          "  sandbox_id TEXT NOT NULL,"
          "  port INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),"
          "  owner TEXT NOT NULL,"
          "  public INTEGER NOT NULL CHECK (public IN (0, 1)),"
          "  secret TEXT NOT NULL,"
          "  created_at INTEGER NOT NULL,"
          "  rotated_at INTEGER NOT NULL,"
          "  expires_at INTEGER NOT NULL DEFAULT 0,"
          "  PRIMARY KEY (sandbox_id, port));" },
        /* 2: the sites that may frame a preview */
        { "previews", "embed_origins", "ALTER TABLE previews ADD COLUMN embed_origins TEXT NOT NULL DEFAULT '';" },
};

#define COLUMNS "sandbox_id, port, owner, public, secret, created_at, rotated_at, expires_at, embed_origins"

static int sqlite_previews_open(const char *location, StorePreviews **ret) {
        return sqldb_handle_open(location, "previews", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_previews_close(StorePreviews *h) {
        sqldb_handle_close(h);
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_previews_set_writer(StorePreviews *h, const char *host_id, int64_t epoch) {
        return 0;
}

static void row_of(sqlite3_stmt *st, StorePreview *p) {
        *p = (StorePreview){ .port = (unsigned)sqlite3_column_int(st, 1), .public = sqlite3_column_int(st, 3) != 0,
                             .created_at = sqlite3_column_int64(st, 5), .rotated_at = sqlite3_column_int64(st, 6),
                             .expires_at = sqlite3_column_int64(st, 7) };
        snprintf(p->sandbox_id, sizeof p->sandbox_id, "%s", sqldb_col(st, 0) ?: "");
        snprintf(p->owner, sizeof p->owner, "%s", sqldb_col(st, 2) ?: "");
        snprintf(p->secret, sizeof p->secret, "%s", sqldb_col(st, 4) ?: "");
        snprintf(p->embed_origins, sizeof p->embed_origins, "%s", sqldb_col(st, 8) ?: "");
}

static int read_one(StorePreviews *h, const char *sandbox_id, unsigned port, StorePreview *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT " COLUMNS " FROM previews WHERE sandbox_id = ? AND port = ?", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 2, (int)port);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        row_of(st, ret);
        return 0;
}

static int sqlite_previews_put(StorePreviews *h, const StorePreview *p, bool set_embed, StorePreview *ret) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO previews (" COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) "
                               "ON CONFLICT (sandbox_id, port) DO UPDATE SET "
                               "public = excluded.public, expires_at = excluded.expires_at, "
                               "embed_origins = CASE WHEN ?10 THEN excluded.embed_origins "
                               "ELSE previews.embed_origins END",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, p->sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 2, (int)p->port);
        sqlite3_bind_text(st, 3, p->owner, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, p->public);
        sqlite3_bind_text(st, 5, p->secret, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 6, p->created_at);
        sqlite3_bind_int64(st, 7, p->rotated_at);
        sqlite3_bind_int64(st, 8, p->expires_at);
        sqlite3_bind_text(st, 9, p->embed_origins, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 10, set_embed);
        int r = sqldb_errno(sqlite3_step(st));
        return r < 0 ? r : read_one(h, p->sandbox_id, p->port, ret);
}

static int sqlite_previews_get(StorePreviews *h, const char *sandbox_id, unsigned port, StorePreview *ret) {
        LOCKED(h);
        return read_one(h, sandbox_id, port, ret);
}

static int sqlite_previews_list(StorePreviews *h, const char *sandbox_id, StorePreview **ret, size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT " COLUMNS " FROM previews WHERE sandbox_id = ? ORDER BY port", -1,
                               &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        StorePreview *all = NULL;
        size_t n = 0;
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                StorePreview *more = realloc(all, (n + 1) * sizeof(*all));
                if (!more) {
                        free(all);
                        return -ENOMEM;
                }
                all = more;
                row_of(st, &all[n++]);
        }
        if (rc != SQLITE_DONE) {
                free(all);
                return sqldb_errno(rc) ?: -EIO;
        }
        *ret = all;
        *ret_n = n;
        return 0;
}

static int sqlite_previews_rotate(StorePreviews *h, const char *sandbox_id, unsigned port, const char *sealed,
                                  int64_t now) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "UPDATE previews SET secret = ?, rotated_at = ? WHERE sandbox_id = ? AND port = ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sealed, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, now);
        sqlite3_bind_text(st, 3, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, (int)port);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) > 0 ? 0 : -ENOENT;
}

static int sqlite_previews_remove(StorePreviews *h, const char *sandbox_id, unsigned port) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               port ? "DELETE FROM previews WHERE sandbox_id = ? AND port = ?"
                                    : "DELETE FROM previews WHERE sandbox_id = ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        if (port)
                sqlite3_bind_int(st, 2, (int)port);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return port && sqlite3_changes(h->sql) == 0 ? -ENOENT : 0;
}

const StorePreviewOps store_sqlite_previews = {
        .open = sqlite_previews_open,
        .close = sqlite_previews_close,
        .set_writer = sqlite_previews_set_writer,
        .put = sqlite_previews_put,
        .get = sqlite_previews_get,
        .list = sqlite_previews_list,
        .rotate = sqlite_previews_rotate,
        .remove = sqlite_previews_remove,
};
