/* The ledger in SQLite: its tables (ledger, reservations) live in the
 * daemon's database but are the ledger's alone, made here. */
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"
#include "daemon/store/store_ledger.h"

struct StoreLedger {
        sqlite3 *sql;
        pthread_mutex_t lock; /* one transaction at a time on this connection */
        char host[64];        /* set_host's; "" until then */
};

/* The ledger's history, step by step (sqldb_migrate, kind "ledger"). The
 * first step is the schema as it shipped before the versions were kept: IF
 * NOT EXISTS, so that a database that has it already takes it as done. */
static const SqlMigration migrations[] = {
        { NULL, NULL,
        "CREATE TABLE IF NOT EXISTS ledger ("
        "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
        "  sandbox_id TEXT NOT NULL,"
        "  key_id TEXT NOT NULL,"
        "  owner TEXT NOT NULL,"
        "  started_at INTEGER NOT NULL,"
        "  ended_at INTEGER NOT NULL," /* the heartbeat while open */
        "  open INTEGER NOT NULL DEFAULT 1,"
        "  price_per_hour INTEGER NOT NULL CHECK (price_per_hour >= 0),"
        "  prior_seconds INTEGER NOT NULL DEFAULT 0 CHECK (prior_seconds >= 0),"
        "  seconds INTEGER NOT NULL DEFAULT 0 CHECK (seconds >= 0),"
        "  micros INTEGER NOT NULL DEFAULT 0 CHECK (micros >= 0),"
        "  CHECK (ended_at >= started_at));"
        "CREATE INDEX IF NOT EXISTS ledger_key ON ledger (key_id, ended_at);"
        "CREATE INDEX IF NOT EXISTS ledger_owner ON ledger (owner, ended_at);"
        "CREATE INDEX IF NOT EXISTS ledger_sandbox ON ledger (sandbox_id);"
        "CREATE INDEX IF NOT EXISTS ledger_open ON ledger (open) WHERE open = 1;"
        "CREATE TABLE IF NOT EXISTS reservations ("
        "  sandbox_id TEXT PRIMARY KEY,"
        "  key_id TEXT NOT NULL,"
        "  owner TEXT NOT NULL,"
        "  amount_micros INTEGER NOT NULL CHECK (amount_micros >= 0),"
        "  seconds INTEGER NOT NULL CHECK (seconds >= 0),"
        "  created_at INTEGER NOT NULL,"
        "  expires_at INTEGER NOT NULL,"
        "  settled_at INTEGER);"
        "CREATE INDEX IF NOT EXISTS reservations_key ON reservations (key_id, settled_at);" },
        /* 2: the host that opened a charge (heartbeats move only its own) */
        { "ledger", "host_id", "ALTER TABLE ledger ADD COLUMN host_id TEXT NOT NULL DEFAULT ''" },
};

static int sqlite_ledger_open(const char *location, StoreLedger **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open(location, &sql);
        if (r < 0)
                return r;
        if ((r = sqldb_migrate(sql, "ledger", migrations, ELEMENTSOF(migrations))) < 0) {
                sqlite3_close(sql);
                return r;
        }
        StoreLedger *l = calloc(1, sizeof(*l));
        if (!l) {
                sqlite3_close(sql);
                return -ENOMEM;
        }
        l->sql = sql;
        pthread_mutex_init(&l->lock, NULL);
        *ret = l;
        return 0;
}

static void sqlite_ledger_close(StoreLedger *l) {
        if (!l)
                return;
        sqlite3_close(l->sql);
        pthread_mutex_destroy(&l->lock);
        free(l);
}

static int prepare(StoreLedger *l, const char *text, sqlite3_stmt **ret) {
        return sqlite3_prepare_v2(l->sql, text, -1, ret, NULL) == SQLITE_OK ? 0 : -EIO;
}

static int64_t query_int(StoreLedger *l, const char *text, const char *s1, int64_t i2, int *err) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (prepare(l, text, &st) < 0) {
                *err = -EIO;
                return 0;
        }
        sqlite3_bind_text(st, 1, s1, -1, SQLITE_STATIC);
        if (sqlite3_bind_parameter_count(st) >= 2)
                sqlite3_bind_int64(st, 2, i2);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW) {
                *err = -EIO;
                return 0;
        }
        return sqlite3_column_int64(st, 0);
}

/* What the key has used, inside a transaction. `except` is a sandbox whose
 * reservation is left out (it is being replaced). */
static int key_use_locked(StoreLedger *l, const char *key_id, const char *except, int64_t since,
                          StoreLedgerUse *ret) {
        int err = 0;
        StoreLedgerUse u = { 0 };
        u.settled_micros = query_int(l,
                                     "SELECT coalesce(sum(micros), 0) FROM ledger "
                                     "WHERE key_id = ?1 AND open = 0 AND ended_at > ?2",
                                     key_id, since, &err);
        u.oldest_charge_end = query_int(l,
                                        "SELECT coalesce(min(ended_at), 0) FROM ledger "
                                        "WHERE key_id = ?1 AND open = 0 AND ended_at > ?2 AND micros > 0",
                                        key_id, since, &err);
        u.settled_seconds = query_int(l,
                                      "SELECT coalesce(sum(seconds), 0) FROM ledger "
                                      "WHERE key_id = ?1 AND open = 0 AND sandbox_id NOT LIKE '%" LEDGER_DISK_SUFFIX "'",
                                      key_id, 0, &err);
        u.reservations_end = query_int(l,
                                       "SELECT coalesce(min(expires_at), 0) FROM reservations "
                                       "WHERE key_id = ?1 AND settled_at IS NULL",
                                       key_id, 0, &err);
        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (prepare(l,
                            "SELECT coalesce(sum(amount_micros), 0), coalesce(sum(seconds), 0) FROM reservations "
                            "WHERE key_id = ?1 AND settled_at IS NULL AND sandbox_id != ?2",
                            &st) < 0)
                        return -EIO;
                sqlite3_bind_text(st, 1, key_id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, except ? except : "", -1, SQLITE_STATIC);
                if (sqlite3_step(st) != SQLITE_ROW)
                        return -EIO;
                u.reserved_micros = sqlite3_column_int64(st, 0);
                u.reserved_seconds = sqlite3_column_int64(st, 1);
        }
        if (err < 0)
                return err;
        *ret = u;
        return 0;
}

static bool within(const StoreLedgerUse *u, const StoreReservation *res, const LedgerBudget *b) {
        if (b->daily_limit_micros >= 0 &&
            u->settled_micros + u->reserved_micros + res->amount_micros > b->daily_limit_micros)
                return false;
        if (b->allowance_seconds >= 0 &&
            u->settled_seconds + u->reserved_seconds + res->seconds > b->allowance_seconds)
                return false;
        return true;
}

static int upsert_reservation_locked(StoreLedger *l, const StoreReservation *res, int64_t now) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l,
                        "INSERT INTO reservations (sandbox_id, key_id, owner, amount_micros, seconds, "
                        "created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
                        "ON CONFLICT (sandbox_id) DO UPDATE SET amount_micros = ?4, seconds = ?5, "
                        "expires_at = ?7, created_at = CASE WHEN settled_at IS NULL THEN created_at "
                        "ELSE ?6 END, settled_at = NULL",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, res->sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, res->key_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, res->owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, res->amount_micros);
        sqlite3_bind_int64(st, 5, res->seconds);
        sqlite3_bind_int64(st, 6, now);
        sqlite3_bind_int64(st, 7, res->expires_at);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_ledger_reserve(StoreLedger *l, const StoreReservation *res, const LedgerBudget *budget, int64_t since,
                          int64_t now, StoreLedgerUse *ret_use) {
        if (res->amount_micros < 0 || res->seconds < 0)
                return -EINVAL;
        LOCKED(l);
        int r = sqldb_exec(l->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        StoreLedgerUse u;
        if ((r = key_use_locked(l, res->key_id, res->sandbox_id, since, &u)) < 0)
                goto rollback;
        *ret_use = u;
        if (!within(&u, res, budget)) {
                r = -EDQUOT;
                goto rollback;
        }
        if ((r = upsert_reservation_locked(l, res, now)) < 0)
                goto rollback;
        if ((r = sqldb_exec(l->sql, "COMMIT")) < 0)
                goto rollback;
        return 0;
rollback:
        sqldb_exec(l->sql, "ROLLBACK");
        return r;
}

static int release_locked(StoreLedger *l, const char *sandbox_id, int64_t now) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l, "UPDATE reservations SET settled_at = ?2 WHERE sandbox_id = ?1 AND settled_at IS NULL",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, now);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_ledger_release(StoreLedger *l, const char *sandbox_id, int64_t now) {
        LOCKED(l);
        return release_locked(l, sandbox_id, now);
}

static int begin_locked(StoreLedger *l, const char *sandbox_id, const char *key_id, const char *owner,
                        int64_t started_at, uint64_t per_hour, int64_t lease_ends_at) {
        /* The reservation now ends with the lease, which starts only now. */
        {
                _cleanup_stmt_ sqlite3_stmt *up = NULL;
                int r = prepare(l, "UPDATE reservations SET expires_at = ?2 WHERE sandbox_id = ?1 AND settled_at IS NULL",
                                &up);
                if (r < 0)
                        return r;
                sqlite3_bind_text(up, 1, sandbox_id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(up, 2, lease_ends_at);
                if ((r = sqldb_errno(sqlite3_step(up))) < 0)
                        return r;
        }
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l,
                        "INSERT INTO ledger (sandbox_id, key_id, owner, started_at, ended_at, price_per_hour, "
                        "prior_seconds, host_id) VALUES (?1, ?2, ?3, ?4, ?4, ?5, (SELECT coalesce(sum(seconds), 0) "
                        "FROM ledger WHERE sandbox_id = ?1 AND open = 0), ?6)",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 6, l->host, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, key_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, started_at);
        sqlite3_bind_int64(st, 5, (int64_t)(per_hour > INT64_MAX ? INT64_MAX : per_hour));
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_ledger_begin(StoreLedger *l, const char *sandbox_id, const char *key_id, const char *owner,
                        int64_t started_at, uint64_t per_hour, int64_t lease_ends_at) {
        LOCKED(l);
        int r = sqldb_exec(l->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        if ((r = begin_locked(l, sandbox_id, key_id, owner, started_at, per_hour, lease_ends_at)) < 0) {
                sqldb_exec(l->sql, "ROLLBACK");
                return r;
        }
        if ((r = sqldb_exec(l->sql, "COMMIT")) < 0)
                sqldb_exec(l->sql, "ROLLBACK");
        return r;
}

/* Closes the open charges of a series at `end` (or at their heartbeat when
 * at_heartbeat), inside a transaction. */
static int close_locked(StoreLedger *l, const char *sandbox_id, int64_t end, bool at_heartbeat,
                        StoreLedgerCost cost, int64_t *ret_end) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l,
                        "SELECT id, started_at, ended_at, price_per_hour, prior_seconds FROM ledger "
                        "WHERE sandbox_id = ?1 AND open = 1 ORDER BY id",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        bool found = false;
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                int64_t id = sqlite3_column_int64(st, 0), started = sqlite3_column_int64(st, 1),
                        beat = sqlite3_column_int64(st, 2), price = sqlite3_column_int64(st, 3),
                        prior = sqlite3_column_int64(st, 4);
                int64_t stop = at_heartbeat ? (beat < end ? beat : end) : end;
                if (stop < started)
                        stop = started;
                int64_t secs = stop - started;
                int64_t micros = (int64_t)(cost((uint64_t)price, prior + secs) - cost((uint64_t)price, prior));
                _cleanup_stmt_ sqlite3_stmt *up = NULL;
                if ((r = prepare(l,
                                 "UPDATE ledger SET open = 0, ended_at = ?2, seconds = ?3, micros = ?4 "
                                 "WHERE id = ?1",
                                 &up)) < 0)
                        return r;
                sqlite3_bind_int64(up, 1, id);
                sqlite3_bind_int64(up, 2, stop);
                sqlite3_bind_int64(up, 3, secs);
                sqlite3_bind_int64(up, 4, micros);
                if ((r = sqldb_errno(sqlite3_step(up))) < 0)
                        return r;
                found = true;
                if (ret_end)
                        *ret_end = stop;
        }
        if (rc != SQLITE_DONE)
                return -EIO;
        return found ? 0 : -ENOENT;
}

static int sqlite_ledger_settle(StoreLedger *l, const char *sandbox_id, int64_t end, bool at_heartbeat, int64_t now,
                         StoreLedgerCost cost, int64_t *ret_end) {
        LOCKED(l);
        int r = sqldb_exec(l->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        int closed = close_locked(l, sandbox_id, end, at_heartbeat, cost, ret_end);
        if (closed < 0 && closed != -ENOENT) {
                r = closed;
                goto rollback;
        }
        if ((r = release_locked(l, sandbox_id, now)) < 0)
                goto rollback;
        if ((r = sqldb_exec(l->sql, "COMMIT")) < 0)
                goto rollback;
        return closed;
rollback:
        sqldb_exec(l->sql, "ROLLBACK");
        return r;
}

static int sqlite_ledger_heartbeat(StoreLedger *l, int64_t now) {
        LOCKED(l);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l, "UPDATE ledger SET ended_at = ?1 WHERE open = 1 AND ended_at < ?1 AND host_id IN (?2, '')",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_text(st, 2, l->host, -1, SQLITE_STATIC);
        return sqldb_errno(sqlite3_step(st));
}

/* One host writes an SQLite ledger: no epoch to check. */
static int sqlite_ledger_set_epoch(StoreLedger *l, int64_t epoch) {
        return 0;
}

static int sqlite_ledger_set_host(StoreLedger *l, const char *host_id) {
        if (strlen(host_id) >= sizeof(l->host))
                return -EINVAL;
        LOCKED(l);
        snprintf(l->host, sizeof(l->host), "%s", host_id);
        return 0;
}

static int sqlite_ledger_settle_orphans(StoreLedger *l, int64_t now) {
        LOCKED(l);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l,
                        "UPDATE reservations SET settled_at = ?1 WHERE settled_at IS NULL AND ("
                        "sandbox_id IN (SELECT id FROM sandboxes WHERE host_id IN (?2, '') AND NOT "
                        "(deleted_at IS NULL AND state IN ('starting', 'running'))) OR "
                        "(created_at <= ?3 AND sandbox_id NOT IN (SELECT id FROM sandboxes)))",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_text(st, 2, l->host, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, now - LEDGER_ORPHAN_GRACE_SECONDS);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_ledger_key_budget(StoreLedger *l, const char *key_id, StoreLedgerKey *ret) {
        LOCKED(l);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l, "SELECT daily_limit_micros, trial FROM keys WHERE id = ?1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, key_id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return -EIO;
        ret->daily_limit_micros = sqlite3_column_type(st, 0) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 0);
        ret->trial = sqlite3_column_int(st, 1) != 0;
        return 0;
}

static int sqlite_ledger_key_use(StoreLedger *l, const char *key_id, int64_t since, StoreLedgerUse *ret) {
        LOCKED(l);
        int r = sqldb_exec(l->sql, "BEGIN");
        if (r < 0)
                return r;
        r = key_use_locked(l, key_id, NULL, since, ret);
        sqldb_exec(l->sql, "COMMIT");
        return r;
}

static const char *col_text(sqlite3_stmt *st, int col) {
        return (const char *)sqlite3_column_text(st, col);
}

static int sqlite_ledger_owner_intervals(StoreLedger *l, const char *owner, int64_t since, int64_t until,
                                  StoreLedgerEach each, void *userdata) {
        LOCKED(l);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l,
                        "SELECT l.sandbox_id, l.key_id, l.started_at, l.ended_at, l.open, l.price_per_hour, "
                        "l.prior_seconds, coalesce(k.name, ''), "
                        "(SELECT r.expires_at FROM reservations r WHERE r.sandbox_id = l.sandbox_id), "
                        "l.seconds, l.micros "
                        "FROM ledger l LEFT JOIN keys k ON k.id = l.key_id "
                        "WHERE l.owner = ?1 AND (l.open = 1 OR l.ended_at >= ?2) AND l.started_at <= ?3 "
                        "ORDER BY l.started_at, l.id",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, since);
        sqlite3_bind_int64(st, 3, until);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                const char *kname = col_text(st, 7);
                StoreLedgerInterval iv = {
                        .sandbox_id = col_text(st, 0),
                        .key_id = col_text(st, 1),
                        .key_name = kname ? kname : "",
                        .started_at = sqlite3_column_int64(st, 2),
                        .ended_at = sqlite3_column_int64(st, 3),
                        .open = sqlite3_column_int(st, 4) != 0,
                        .price_per_hour = sqlite3_column_int64(st, 5),
                        .prior_seconds = sqlite3_column_int64(st, 6),
                        .reservation_expires_at = sqlite3_column_int64(st, 8),
                        .seconds = sqlite3_column_int64(st, 9),
                        .micros = sqlite3_column_int64(st, 10),
                };
                if (!iv.sandbox_id || !iv.key_id)
                        continue;
                if ((r = each(&iv, userdata)) < 0)
                        return r;
        }
        return rc == SQLITE_DONE ? 0 : -EIO;
}

static int sqlite_ledger_sandbox_intervals(StoreLedger *l, const char *sandbox_id, StoreLedgerEach each, void *userdata) {
        LOCKED(l);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l,
                        "SELECT sandbox_id, key_id, started_at, ended_at, open, price_per_hour, prior_seconds, "
                        "seconds, micros FROM ledger WHERE sandbox_id = ?1 ORDER BY id",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                const char *sid = col_text(st, 0), *kid = col_text(st, 1);
                StoreLedgerInterval iv = {
                        .sandbox_id = sid ? sid : "",
                        .key_id = kid ? kid : "",
                        .key_name = "",
                        .started_at = sqlite3_column_int64(st, 2),
                        .ended_at = sqlite3_column_int64(st, 3),
                        .open = sqlite3_column_int(st, 4) != 0,
                        .price_per_hour = sqlite3_column_int64(st, 5),
                        .prior_seconds = sqlite3_column_int64(st, 6),
                        .seconds = sqlite3_column_int64(st, 7),
                        .micros = sqlite3_column_int64(st, 8),
                };
                if ((r = each(&iv, userdata)) < 0)
                        return r;
        }
        return rc == SQLITE_DONE ? 0 : -EIO;
}

const StoreLedgerOps store_sqlite_ledger = {
        .open = sqlite_ledger_open,
        .close = sqlite_ledger_close,
        .key_budget = sqlite_ledger_key_budget,
        .reserve = sqlite_ledger_reserve,
        .release = sqlite_ledger_release,
        .begin = sqlite_ledger_begin,
        .settle = sqlite_ledger_settle,
        .heartbeat = sqlite_ledger_heartbeat,
        .set_host = sqlite_ledger_set_host,
        .set_epoch = sqlite_ledger_set_epoch,
        .settle_orphans = sqlite_ledger_settle_orphans,
        .key_use = sqlite_ledger_key_use,
        .owner_intervals = sqlite_ledger_owner_intervals,
        .sandbox_intervals = sqlite_ledger_sandbox_intervals,
};
