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
        /* 2: standing, use, and the leases of the fleet's timed work */
        { NULL, NULL,
          "ALTER TABLE hosts ADD COLUMN state TEXT NOT NULL DEFAULT 'live'"
          "  CHECK (state IN ('live', 'draining', 'dead'));"
          "ALTER TABLE hosts ADD COLUMN used_vcpu INTEGER NOT NULL DEFAULT 0;"
          "ALTER TABLE hosts ADD COLUMN used_memory_mib INTEGER NOT NULL DEFAULT 0;"
          "ALTER TABLE hosts ADD COLUMN sandboxes INTEGER NOT NULL DEFAULT 0;"
          "ALTER TABLE hosts ADD COLUMN dead_at INTEGER;"
          "CREATE TABLE fleet_leases ("
          "  name TEXT PRIMARY KEY, holder TEXT NOT NULL, holder_epoch INTEGER NOT NULL,"
          "  epoch INTEGER NOT NULL, expires_at INTEGER NOT NULL)" },
};

static int sqlite_hosts_open(const char *location, StoreHosts **ret) {
        return sqldb_handle_open(location, "hosts", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_hosts_close(StoreHosts *h) {
        sqldb_handle_close(h);
}

/* Runs an upsert ... RETURNING epoch: the epoch in *ret; -ENOENT when the
 * statement returned no row (its WHERE kept the row as it was). */
static int step_epoch(sqlite3_stmt *st, int64_t *ret) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        int64_t epoch = sqlite3_column_int64(st, 0);
        if ((rc = sqlite3_step(st)) != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        *ret = epoch;
        return 0;
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
                               "heartbeat_at = excluded.heartbeat_at, dead_at = NULL, "
                               "state = CASE hosts.state WHEN 'draining' THEN 'draining' ELSE 'live' END "
                               "RETURNING epoch",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, in->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, in->url ? in->url : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, in->drivers ? in->drivers : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, in->version ? in->version : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, in->vcpu);
        sqlite3_bind_int64(st, 6, in->memory_mib);
        sqlite3_bind_int64(st, 7, now);
        return step_epoch(st, ret_epoch);
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

static int sqlite_hosts_heartbeat(StoreHosts *h, const char *id, int64_t epoch, int64_t now, const HostUse *use) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE hosts SET heartbeat_at = ?1, used_vcpu = ?4, used_memory_mib = ?5, "
                               "sandboxes = ?6 WHERE id = ?2 AND epoch = ?3 AND state <> 'dead'",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, epoch);
        sqlite3_bind_int64(st, 4, use ? use->vcpu : 0);
        sqlite3_bind_int64(st, 5, use ? use->memory_mib : 0);
        sqlite3_bind_int64(st, 6, use ? use->sandboxes : 0);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        if (sqlite3_changes(h->sql) > 0)
                return 0;
        /* No live row of this epoch: a record of another epoch means a
         * later registration took the id, a dead one that the fleet gave
         * this host up. Records are never deleted, so the
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
                               "SELECT id, url, drivers, version, vcpu, memory_mib, epoch, started_at, heartbeat_at, "
                               "state, used_vcpu, used_memory_mib, sandboxes, dead_at FROM hosts ORDER BY id",
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
                const unsigned char *state = sqlite3_column_text(st, 9);
                rec->state = host_state_from_name(state ? (const char *)state : "");
                rec->used.vcpu = sqlite3_column_int64(st, 10);
                rec->used.memory_mib = sqlite3_column_int64(st, 11);
                rec->used.sandboxes = sqlite3_column_int64(st, 12);
                rec->dead_at = sqlite3_column_int64(st, 13);
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

static int sqlite_hosts_declare_dead(StoreHosts *h, const char *id, int64_t epoch, int64_t heartbeat_at,
                                     int64_t now) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE hosts SET state = 'dead', dead_at = ?4 WHERE id = ?1 AND epoch = ?2 "
                               "AND heartbeat_at = ?3 AND state <> 'dead'",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, epoch);
        sqlite3_bind_int64(st, 3, heartbeat_at);
        sqlite3_bind_int64(st, 4, now);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        return sqlite3_changes(h->sql) > 0 ? 0 : -ESTALE;
}

static int sqlite_hosts_set_draining(StoreHosts *h, const char *id, bool draining) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "UPDATE hosts SET state = ?2 WHERE id = ?1 AND state <> 'dead'", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, draining ? "draining" : "live", -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        if (sqlite3_changes(h->sql) > 0)
                return 0;
        int r = exists_locked(h, id);
        return r == 0 ? -ESTALE : r;
}

static int sqlite_hosts_lease(StoreHosts *h, const char *name, const char *holder, int64_t holder_epoch,
                              int64_t ttl_seconds, int64_t now, int64_t *ret_epoch) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        /* One statement: taken when missing or expired (its epoch bumped),
         * renewed by its holder at the same holder epoch (kept). */
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO fleet_leases (name, holder, holder_epoch, epoch, expires_at) "
                               "VALUES (?1, ?2, ?3, 1, ?4 + ?5) ON CONFLICT (name) DO UPDATE SET "
                               "epoch = fleet_leases.epoch + (fleet_leases.holder <> excluded.holder OR "
                               "fleet_leases.holder_epoch <> excluded.holder_epoch), holder = excluded.holder, "
                               "holder_epoch = excluded.holder_epoch, expires_at = excluded.expires_at "
                               "WHERE fleet_leases.expires_at < ?4 OR (fleet_leases.holder = excluded.holder AND "
                               "fleet_leases.holder_epoch = excluded.holder_epoch) RETURNING epoch",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, holder, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, holder_epoch);
        sqlite3_bind_int64(st, 4, now);
        sqlite3_bind_int64(st, 5, ttl_seconds);
        int r = step_epoch(st, ret_epoch);
        return r == -ENOENT ? -EBUSY : r; /* no row: another holds it */
}

const StoreHostOps store_sqlite_hosts = {
        .declare_dead = sqlite_hosts_declare_dead,
        .set_draining = sqlite_hosts_set_draining,
        .lease = sqlite_hosts_lease,
        .open = sqlite_hosts_open,
        .close = sqlite_hosts_close,
        .register_host = sqlite_hosts_register,
        .heartbeat = sqlite_hosts_heartbeat,
        .list = sqlite_hosts_list,
};
