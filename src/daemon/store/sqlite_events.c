/* The events in the SQLite backend (store_events.h): one table, rowid the
 * cursor. */
#include "daemon/store/store_events.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreEvents {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The events table's history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS events ("
          "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
          "  id TEXT NOT NULL UNIQUE,"
          "  owner TEXT NOT NULL,"
          "  type TEXT NOT NULL,"
          "  resource_type TEXT NOT NULL,"
          "  resource_id TEXT NOT NULL,"
          "  key_id TEXT,"
          "  host_id TEXT NOT NULL,"
          "  data TEXT,"
          "  at INTEGER NOT NULL);"
          "CREATE INDEX IF NOT EXISTS events_owner ON events (owner, seq);"
          "CREATE INDEX IF NOT EXISTS events_resource ON events (resource_id, seq);"
          "CREATE INDEX IF NOT EXISTS events_at ON events (at);" },
};

static int sqlite_events_open(const char *location, StoreEvents **ret) {
        return sqldb_handle_open(location, "events", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_events_close(StoreEvents *h) {
        sqldb_handle_close(h);
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_events_set_writer(StoreEvents *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int sqlite_events_append(StoreEvents *h, const EventRecord *e) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO events (id, owner, type, resource_type, resource_id, key_id, host_id, "
                               "data, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, e->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, e->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, e->type, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, e->resource_type, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, e->resource_id, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 6, e->key_id);
        sqlite3_bind_text(st, 7, e->host_id ? e->host_id : "", -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 8, e->data);
        sqlite3_bind_int64(st, 9, e->at);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_events_list(StoreEvents *h, const EventFilter *f, StoreEventFn fn, void *userdata) {
        /* ?3 a type, or a group when it ends in '.': matched as a prefix
         * (instr, so that no character of it is a pattern). */
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT seq, id, owner, type, resource_type, resource_id, key_id, host_id, data, at "
                               "FROM events WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR resource_id = ?2) "
                               "AND (?3 IS NULL OR (substr(?3, -1) = '.' AND instr(type, ?3) = 1) OR type = ?3) "
                               "AND (?6 OR ?4 = 0 OR seq < ?4) AND (NOT ?6 OR seq > ?7) AND (?8 = 0 OR at <= ?8) "
                               "ORDER BY CASE WHEN ?6 THEN seq ELSE -seq END LIMIT ?5",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqldb_bind_opt(st, 1, f->owner);
        sqldb_bind_opt(st, 2, f->resource_id);
        sqldb_bind_opt(st, 3, f->type);
        sqlite3_bind_int64(st, 4, f->before);
        sqlite3_bind_int64(st, 5, f->limit);
        sqlite3_bind_int(st, 6, f->oldest_first ? 1 : 0);
        sqlite3_bind_int64(st, 7, f->after);
        sqlite3_bind_int64(st, 8, f->until);
        int rc, r = 0;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                EventRecord e = { .seq = sqlite3_column_int64(st, 0), .owner = sqldb_col(st, 2), .type = sqldb_col(st, 3),
                                  .resource_type = sqldb_col(st, 4), .resource_id = sqldb_col(st, 5), .key_id = sqldb_col(st, 6),
                                  .host_id = sqldb_col(st, 7), .data = sqldb_col(st, 8), .at = sqlite3_column_int64(st, 9) };
                snprintf(e.id, sizeof e.id, "%s", sqldb_col(st, 1) ?: "");
                r = fn(userdata, &e);
        }
        if (r < 0)
                return r;
        return rc == SQLITE_DONE ? 0 : (sqldb_errno(rc) ?: -EIO);
}

static int sqlite_events_prune(StoreEvents *h, int64_t before, int64_t *ret_n) {
        LOCKED(h);
        return sqldb_delete_before(h->sql, "DELETE FROM events WHERE at < ?", before, ret_n);
}

const StoreEventOps store_sqlite_events = {
        .open = sqlite_events_open,
        .close = sqlite_events_close,
        .set_writer = sqlite_events_set_writer,
        .append = sqlite_events_append,
        .list = sqlite_events_list,
        .prune = sqlite_events_prune,
};
