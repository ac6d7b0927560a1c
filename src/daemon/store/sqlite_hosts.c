/* The hosts in the SQLite backend. Registering and heartbeating are one
 * statement each, atomic under the database's write lock. */
#include "daemon/store/store_hosts.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreHosts {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The hosts table's history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS hosts ("
          "  id TEXT PRIMARY KEY,"
          "  url TEXT NOT NULL,"
          "  drivers TEXT NOT NULL,"
          "  version TEXT NOT NULL,"
          "  vcpu INTEGER NOT NULL,"
          "  memory_mib INTEGER NOT NULL,"
          "  epoch INTEGER NOT NULL,"
          "  started_at INTEGER NOT NULL,"
          "  heartbeat_at INTEGER NOT NULL)" },
};

static int sqlite_hosts_open(const char *location, StoreHosts **ret) {
        return sqldb_handle_open(location, "hosts", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_hosts_close(StoreHosts *h) {
        sqldb_handle_close(h);
}

static int sqlite_hosts_register(StoreHosts *h, const HostRecord *in, int64_t now, int64_t *ret_epoch) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO hosts (id, url, drivers, version, vcpu, memory_mib, epoch, started_at, "
                               "heartbeat_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?7) "
                               "ON CONFLICT (id) DO UPDATE SET url = excluded.url, drivers = excluded.drivers, "
                               "version = excluded.version, vcpu = excluded.vcpu, memory_mib = excluded.memory_mib, "
                               "epoch = hosts.epoch + 1, started_at = excluded.started_at, "
                               "heartbeat_at = excluded.heartbeat_at RETURNING epoch",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, in->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, in->url ? in->url : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, in->drivers ? in->drivers : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, in->version ? in->version : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, in->vcpu);
        sqlite3_bind_int64(st, 6, in->memory_mib);
        sqlite3_bind_int64(st, 7, now);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        int64_t epoch = sqlite3_column_int64(st, 0);
        if ((rc = sqlite3_step(st)) != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        *ret_epoch = epoch;
        return 0;
}

/* Whether id is stored: 0, -ENOENT, or an error. */
static int exists_locked(StoreHosts *h, const char *id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT 1 FROM hosts WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
                return 0;
        return rc == SQLITE_DONE ? -ENOENT : (sqldb_errno(rc) ?: -EIO);
}

static int sqlite_hosts_heartbeat(StoreHosts *h, const char *id, int64_t epoch, int64_t now) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "UPDATE hosts SET heartbeat_at = ? WHERE id = ? AND epoch = ?", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, epoch);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        if (sqlite3_changes(h->sql) > 0)
                return 0;
        /* No row of this epoch: a record of another epoch means a later
         * registration took the id. Records are never deleted, so the
         * answer cannot turn stale between the two statements. */
        int r = exists_locked(h, id);
        return r == 0 ? -ESTALE : r;
}

static char *dup_col(sqlite3_stmt *st, int col) {
        const unsigned char *t = sqlite3_column_text(st, col);
        return strdup(t ? (const char *)t : "");
}

static int sqlite_hosts_list(StoreHosts *h, HostRecord **ret, size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT id, url, drivers, version, vcpu, memory_mib, epoch, started_at, heartbeat_at "
                               "FROM hosts ORDER BY id",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        HostRecord *list = NULL;
        size_t n = 0, cap = 0;
        int rc, r = 0;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 8;
                        HostRecord *grown = realloc(list, ncap * sizeof(*list));
                        if (!grown) {
                                r = -ENOMEM;
                                break;
                        }
                        list = grown;
                        cap = ncap;
                }
                HostRecord *rec = &list[n];
                *rec = (HostRecord){ 0 };
                const unsigned char *id = sqlite3_column_text(st, 0);
                snprintf(rec->id, sizeof rec->id, "%s", id ? (const char *)id : "");
                rec->url = dup_col(st, 1);
                rec->drivers = dup_col(st, 2);
                rec->version = dup_col(st, 3);
                rec->vcpu = sqlite3_column_int64(st, 4);
                rec->memory_mib = sqlite3_column_int64(st, 5);
                rec->epoch = sqlite3_column_int64(st, 6);
                rec->started_at = sqlite3_column_int64(st, 7);
                rec->heartbeat_at = sqlite3_column_int64(st, 8);
                n++;
                if (!rec->url || !rec->drivers || !rec->version) {
                        r = -ENOMEM;
                        break;
                }
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = sqldb_errno(rc) ?: -EIO;
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        store_host_record_clear(&list[i]);
                free(list);
                return r;
        }
        if (!list && !(list = calloc(1, sizeof(*list))))
                return -ENOMEM;
        *ret = list;
        *ret_n = n;
        return 0;
}

const StoreHostOps store_sqlite_hosts = {
        .open = sqlite_hosts_open,
        .close = sqlite_hosts_close,
        .register_host = sqlite_hosts_register,
        .heartbeat = sqlite_hosts_heartbeat,
        .list = sqlite_hosts_list,
};
