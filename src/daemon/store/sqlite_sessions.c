/* The sandboxes' sessions in the SQLite backend (store_sessions.h). */
#include "daemon/store/store_sessions.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreSessions {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The sessions' history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS sandbox_sessions ("
          "  id TEXT PRIMARY KEY,"
          "  sandbox_id TEXT NOT NULL,"
          "  owner TEXT NOT NULL,"
          "  token_hash TEXT NOT NULL UNIQUE,"
          "  key_hash TEXT NOT NULL,"
          "  name TEXT NOT NULL DEFAULT '',"
          "  origins TEXT NOT NULL DEFAULT '',"
          "  created_at INTEGER NOT NULL,"
          "  expires_at INTEGER NOT NULL,"
          "  revoked_at INTEGER NOT NULL DEFAULT 0);"
          "CREATE INDEX IF NOT EXISTS sandbox_sessions_sandbox ON sandbox_sessions (sandbox_id, created_at);" },
};

#define COLUMNS "id, sandbox_id, owner, token_hash, key_hash, name, origins, created_at, expires_at, revoked_at"

static int sqlite_sessions_open(const char *location, StoreSessions **ret) {
        return sqldb_handle_open(location, "sessions", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_sessions_close(StoreSessions *h) {
        sqldb_handle_close(h);
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_sessions_set_writer(StoreSessions *h, const char *host_id, int64_t epoch) {
        return 0;
}

static void row_of(sqlite3_stmt *st, StoreSession *s) {
        *s = (StoreSession){ .created_at = sqlite3_column_int64(st, 7), .expires_at = sqlite3_column_int64(st, 8),
                             .revoked_at = sqlite3_column_int64(st, 9) };
        snprintf(s->id, sizeof s->id, "%s", sqldb_col(st, 0) ?: "");
        snprintf(s->sandbox_id, sizeof s->sandbox_id, "%s", sqldb_col(st, 1) ?: "");
        snprintf(s->owner, sizeof s->owner, "%s", sqldb_col(st, 2) ?: "");
        snprintf(s->token_hash, sizeof s->token_hash, "%s", sqldb_col(st, 3) ?: "");
        snprintf(s->key_hash, sizeof s->key_hash, "%s", sqldb_col(st, 4) ?: "");
        snprintf(s->name, sizeof s->name, "%s", sqldb_col(st, 5) ?: "");
        snprintf(s->origins, sizeof s->origins, "%s", sqldb_col(st, 6) ?: "");
}

static int sqlite_sessions_insert(StoreSessions *h, const StoreSession *s) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "INSERT INTO sandbox_sessions (" COLUMNS ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        const char *texts[] = { s->id, s->sandbox_id, s->owner, s->token_hash, s->key_hash, s->name, s->origins };
        for (int i = 0; i < (int)ELEMENTSOF(texts); i++)
                sqlite3_bind_text(st, i + 1, texts[i], -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 8, s->created_at);
        sqlite3_bind_int64(st, 9, s->expires_at);
        sqlite3_bind_int64(st, 10, s->revoked_at);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_CONSTRAINT)
                return -EEXIST;
        return sqldb_errno(rc);
}

static int read_one(StoreSessions *h, const char *sql, const char *a, const char *b, const char *c,
                    StoreSession *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, sql, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, a, -1, SQLITE_STATIC);
        if (b)
                sqlite3_bind_text(st, 2, b, -1, SQLITE_STATIC);
        if (c)
                sqlite3_bind_text(st, 3, c, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        row_of(st, ret);
        return 0;
}

static int sqlite_sessions_by_token(StoreSessions *h, const char *token_hash, StoreSession *ret) {
        LOCKED(h);
        return read_one(h, "SELECT " COLUMNS " FROM sandbox_sessions WHERE token_hash = ?", token_hash, NULL, NULL,
                        ret);
}

static int sqlite_sessions_list(StoreSessions *h, const char *sandbox_id, const char *owner, int64_t since,
                                size_t max, StoreSession **ret, size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT " COLUMNS " FROM sandbox_sessions WHERE sandbox_id = ? AND (?2 IS NULL OR owner = ?2) "
                               "AND (revoked_at = 0 OR revoked_at >= ?) AND expires_at >= ? "
                               "ORDER BY created_at DESC, id DESC LIMIT ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        if (owner)
                sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        else
                sqlite3_bind_null(st, 2);
        sqlite3_bind_int64(st, 3, since);
        sqlite3_bind_int64(st, 4, since);
        sqlite3_bind_int64(st, 5, (int64_t)max);
        StoreSession *all = calloc(max ? max : 1, sizeof(*all));
        if (!all)
                return -ENOMEM;
        size_t n = 0;
        int rc = SQLITE_DONE;
        while (n < max && (rc = sqlite3_step(st)) == SQLITE_ROW)
                row_of(st, &all[n++]);
        if (n < max && rc != SQLITE_DONE) {
                free(all);
                return sqldb_errno(rc) ?: -EIO;
        }
        *ret = all;
        *ret_n = n;
        return 0;
}

static int sqlite_sessions_count_active(StoreSessions *h, const char *sandbox_id, int64_t now, int64_t *ret) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT COUNT(*) FROM sandbox_sessions WHERE sandbox_id = ? AND revoked_at = 0 "
                               "AND expires_at > ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, now);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        *ret = sqlite3_column_int64(st, 0);
        return 0;
}

static int sqlite_sessions_revoke(StoreSessions *h, const char *id, const char *sandbox_id, const char *owner,
                                  int64_t now, StoreSession *ret) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE sandbox_sessions SET revoked_at = ? WHERE id = ? AND sandbox_id = ? "
                               "AND owner = ? AND revoked_at = 0",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, owner, -1, SQLITE_STATIC);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return read_one(h, "SELECT " COLUMNS " FROM sandbox_sessions WHERE id = ? AND sandbox_id = ? AND owner = ?", id,
                        sandbox_id, owner, ret);
}

const StoreSessionOps store_sqlite_sessions = {
        .open = sqlite_sessions_open,
        .close = sqlite_sessions_close,
        .set_writer = sqlite_sessions_set_writer,
        .insert = sqlite_sessions_insert,
        .by_token = sqlite_sessions_by_token,
        .list = sqlite_sessions_list,
        .count_active = sqlite_sessions_count_active,
        .revoke = sqlite_sessions_revoke,
};
