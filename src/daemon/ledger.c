#include "daemon/ledger.h"

#include <errno.h>
#include <pthread.h>
#include <search.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct Ledger {
        sqlite3 *sql;
        pthread_mutex_t lock; /* one transaction at a time on this connection */
};

/* The ledger's tables live in the daemon's database but are the ledger's
 * alone; IF NOT EXISTS keeps this independent of the daemon's migrations. */
static const char schema[] =
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
        "CREATE INDEX IF NOT EXISTS reservations_key ON reservations (key_id, settled_at);";

int ledger_open(const char *db_path, Ledger **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open_schema(db_path, schema, &sql);
        if (r < 0)
                return r;
        Ledger *l = calloc(1, sizeof(*l));
        if (!l) {
                sqlite3_close(sql);
                return -ENOMEM;
        }
        l->sql = sql;
        pthread_mutex_init(&l->lock, NULL);
        *ret = l;
        return 0;
}

void ledger_close(Ledger *l) {
        if (!l)
                return;
        sqlite3_close(l->sql);
        pthread_mutex_destroy(&l->lock);
        free(l);
}

uint64_t ledger_cost(uint64_t per_hour, int64_t seconds) {
        if (seconds <= 0)
                return 0;
        unsigned __int128 v = (unsigned __int128)per_hour * (uint64_t)seconds / 3600u;
        return v > INT64_MAX ? INT64_MAX : (uint64_t)v;
}

uint64_t ledger_cost_ceil(uint64_t per_hour, int64_t seconds) {
        if (seconds <= 0)
                return 0;
        unsigned __int128 v = ((unsigned __int128)per_hour * (uint64_t)seconds + 3599u) / 3600u;
        return v > INT64_MAX ? INT64_MAX : (uint64_t)v;
}

static int prepare(Ledger *l, const char *text, sqlite3_stmt **ret) {
        return sqlite3_prepare_v2(l->sql, text, -1, ret, NULL) == SQLITE_OK ? 0 : -EIO;
}

static int64_t query_int(Ledger *l, const char *text, const char *s1, int64_t i2, int *err) {
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
static int key_use_locked(Ledger *l, const char *key_id, const char *except, int64_t now, LedgerKeyUse *ret) {
        int err = 0;
        LedgerKeyUse u = { 0 };
        int64_t since = now - LEDGER_WINDOW_SECONDS;
        u.settled_micros = query_int(l,
                                     "SELECT coalesce(sum(micros), 0) FROM ledger "
                                     "WHERE key_id = ?1 AND open = 0 AND ended_at > ?2",
                                     key_id, since, &err);
        u.frees_at = query_int(l,
                               "SELECT coalesce(min(ended_at), 0) FROM ledger "
                               "WHERE key_id = ?1 AND open = 0 AND ended_at > ?2 AND micros > 0",
                               key_id, since, &err);
        if (u.frees_at)
                u.frees_at += LEDGER_WINDOW_SECONDS;
        int64_t settled_seconds = query_int(l,
                                            "SELECT coalesce(sum(seconds), 0) FROM ledger "
                                            "WHERE key_id = ?1 AND open = 0 AND sandbox_id NOT LIKE '%" LEDGER_DISK_SUFFIX "'",
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
                u.used_seconds = settled_seconds + sqlite3_column_int64(st, 1);
        }
        if (err < 0)
                return err;
        u.used_micros = u.settled_micros + u.reserved_micros;
        *ret = u;
        return 0;
}

static int64_t earliest_reservation_end(Ledger *l, const char *key_id) {
        int err = 0;
        return query_int(l,
                         "SELECT coalesce(min(expires_at), 0) FROM reservations "
                         "WHERE key_id = ?1 AND settled_at IS NULL",
                         key_id, 0, &err);
}

int ledger_reserve(Ledger *l, const char *key_id, const char *owner, const char *sandbox_id,
                   const LedgerBudget *budget, int64_t amount, int64_t seconds, int64_t expires_at, int64_t now,
                   LedgerRefusal *ret_refusal) {
        if (amount < 0 || seconds < 0)
                return -EINVAL;
        LOCKED(l);
        int r = sqldb_exec(l->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        LedgerKeyUse u;
        if ((r = key_use_locked(l, key_id, sandbox_id, now, &u)) < 0)
                goto rollback;
        LedgerRefusal refusal = { 0 };
        bool refused = false;
        if (budget->daily_limit_micros >= 0 && u.used_micros + amount > budget->daily_limit_micros) {
                refusal = (LedgerRefusal){ .limit = budget->daily_limit_micros, .used = u.used_micros,
                                           .wanted = amount, .frees_at = u.frees_at };
                refused = true;
        } else if (budget->allowance_seconds >= 0 && u.used_seconds + seconds > budget->allowance_seconds) {
                refusal = (LedgerRefusal){ .allowance = true, .limit = budget->allowance_seconds,
                                           .used = u.used_seconds, .wanted = seconds };
                refused = true;
        }
        if (refused) {
                refusal.reservations_end = earliest_reservation_end(l, key_id);
                sqldb_exec(l->sql, "ROLLBACK");
                *ret_refusal = refusal;
                return -EDQUOT;
        }
        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if ((r = prepare(l,
                                 "INSERT INTO reservations (sandbox_id, key_id, owner, amount_micros, seconds, "
                                 "created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
                                 "ON CONFLICT (sandbox_id) DO UPDATE SET amount_micros = ?4, seconds = ?5, "
                                 "expires_at = ?7, created_at = CASE WHEN settled_at IS NULL THEN created_at "
                                 "ELSE ?6 END, settled_at = NULL",
                                 &st)) < 0)
                        goto rollback;
                sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, key_id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, owner, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 4, amount);
                sqlite3_bind_int64(st, 5, seconds);
                sqlite3_bind_int64(st, 6, now);
                sqlite3_bind_int64(st, 7, expires_at);
                if ((r = sqldb_errno(sqlite3_step(st))) < 0)
                        goto rollback;
        }
        return sqldb_exec(l->sql, "COMMIT");
rollback:
        sqldb_exec(l->sql, "ROLLBACK");
        return r;
}

static int release_locked(Ledger *l, const char *sandbox_id, int64_t now) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l, "UPDATE reservations SET settled_at = ?2 WHERE sandbox_id = ?1 AND settled_at IS NULL",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, now);
        return sqldb_errno(sqlite3_step(st));
}

int ledger_release(Ledger *l, const char *sandbox_id, int64_t now) {
        LOCKED(l);
        return release_locked(l, sandbox_id, now);
}

static int begin_locked(Ledger *l, const char *sandbox_id, const char *key_id, const char *owner, int64_t started_at,
                        uint64_t per_hour, int64_t lease_ends_at);

int ledger_begin(Ledger *l, const char *sandbox_id, const char *key_id, const char *owner, int64_t started_at,
                 uint64_t per_hour, int64_t lease_ends_at) {
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

static int begin_locked(Ledger *l, const char *sandbox_id, const char *key_id, const char *owner, int64_t started_at,
                        uint64_t per_hour, int64_t lease_ends_at) {
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
                        "prior_seconds) VALUES (?1, ?2, ?3, ?4, ?4, ?5, (SELECT coalesce(sum(seconds), 0) "
                        "FROM ledger WHERE sandbox_id = ?1 AND open = 0))",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, key_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, started_at);
        sqlite3_bind_int64(st, 5, (int64_t)(per_hour > INT64_MAX ? INT64_MAX : per_hour));
        return sqldb_errno(sqlite3_step(st));
}

/* Closes the open interval of a sandbox at `end` (or at its heartbeat when
 * at_heartbeat), inside a transaction. */
static int close_locked(Ledger *l, const char *sandbox_id, int64_t end, bool at_heartbeat, int64_t *ret_end) {
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
                int64_t micros = (int64_t)(ledger_cost((uint64_t)price, prior + secs) -
                                           ledger_cost((uint64_t)price, prior));
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

static int settle(Ledger *l, const char *sandbox_id, int64_t end, bool at_heartbeat, int64_t now,
                  int64_t *ret_end) {
        LOCKED(l);
        int r = sqldb_exec(l->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        int closed = close_locked(l, sandbox_id, end, at_heartbeat, ret_end);
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

int ledger_settle(Ledger *l, const char *sandbox_id, int64_t end, int64_t now) {
        int r = settle(l, sandbox_id, end, false, now, NULL);
        return r == -ENOENT ? 0 : r;
}

int ledger_settle_at_heartbeat(Ledger *l, const char *sandbox_id, int64_t cap, int64_t now, int64_t *ret_end) {
        return settle(l, sandbox_id, cap, true, now, ret_end);
}

int ledger_heartbeat(Ledger *l, int64_t now) {
        LOCKED(l);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l, "UPDATE ledger SET ended_at = ?1 WHERE open = 1 AND ended_at < ?1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, now);
        return sqldb_errno(sqlite3_step(st));
}

int ledger_settle_orphans(Ledger *l, int64_t now) {
        LOCKED(l);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l,
                        "UPDATE reservations SET settled_at = ?1 WHERE settled_at IS NULL AND sandbox_id NOT IN "
                        "(SELECT id FROM sandboxes WHERE deleted_at IS NULL AND state IN ('starting', 'running'))",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, now);
        return sqldb_errno(sqlite3_step(st));
}

int ledger_key_budget(Ledger *l, const char *key_id, int64_t trial_allowance_seconds, LedgerBudget *ret) {
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
        ret->allowance_seconds = sqlite3_column_int(st, 1) ? trial_allowance_seconds : -1;
        return 0;
}

int ledger_key_use(Ledger *l, const char *key_id, int64_t now, LedgerKeyUse *ret) {
        LOCKED(l);
        int r = sqldb_exec(l->sql, "BEGIN");
        if (r < 0)
                return r;
        r = key_use_locked(l, key_id, NULL, now, ret);
        sqldb_exec(l->sql, "COMMIT");
        return r;
}

/* Micros of an interval between two of its instants, exact on totals. */
static int64_t span_micros(int64_t price, int64_t prior, int64_t started, int64_t a, int64_t b) {
        if (b <= a)
                return 0;
        return (int64_t)(ledger_cost((uint64_t)price, prior + (b - started)) -
                         ledger_cost((uint64_t)price, prior + (a - started)));
}

void ledger_usage_done(LedgerUsage *u) {
        if (!u)
                return;
        for (size_t i = 0; i < u->n_sandboxes; i++) {
                free(u->sandboxes[i].sandbox_id);
                free(u->sandboxes[i].key_id);
        }
        for (size_t i = 0; i < u->n_keys; i++) {
                free(u->keys[i].key_id);
                free(u->keys[i].name);
        }
        free(u->sandboxes);
        free(u->keys);
        *u = (LedgerUsage){ 0 };
}

/* An entry's place in its list, found by id: a window may hold thousands of
 * sandboxes and many intervals of each, so no scan of the list per row. */
typedef struct UsageSlot {
        const char *id; /* the entry's own copy */
        size_t at;
} UsageSlot;

static int slot_cmp(const void *a, const void *b) {
        return strcmp(((const UsageSlot *)a)->id, ((const UsageSlot *)b)->id);
}

/* A usage as it is summed up, with the lists' capacities and indexes. */
typedef struct UsageSum {
        LedgerUsage u;
        size_t cap_sandboxes, cap_keys;
        void *sandbox_index, *key_index; /* tsearch trees of UsageSlot */
} UsageSum;

static void usage_sum_done(UsageSum *s) {
        tdestroy(s->sandbox_index, free);
        tdestroy(s->key_index, free);
        ledger_usage_done(&s->u);
}

/* The index of id's entry in a list, or -ENOENT. */
static ssize_t slot_find(void *const *index, const char *id) {
        UsageSlot probe = { .id = id };
        UsageSlot *const *found = tfind(&probe, index, slot_cmp);
        return found ? (ssize_t)(*found)->at : -ENOENT;
}

static int slot_add(void **index, const char *id, size_t at) {
        UsageSlot *slot = malloc(sizeof(*slot));
        if (!slot)
                return -ENOMEM;
        *slot = (UsageSlot){ .id = id, .at = at };
        if (!tsearch(slot, index, slot_cmp)) {
                free(slot);
                return -ENOMEM;
        }
        return 0;
}

/* Room for one more of `size` bytes in *list of *cap. */
static int grow(void **list, size_t *cap, size_t n, size_t size) {
        if (n < *cap)
                return 0;
        size_t want = *cap ? *cap * 2 : 16;
        void *p = reallocarray(*list, want, size);
        if (!p)
                return -ENOMEM;
        *list = p;
        *cap = want;
        return 0;
}

static int add_key_share(UsageSum *s, const char *key_id, const char *name, int64_t seconds, int64_t micros) {
        ssize_t at = slot_find(&s->key_index, key_id);
        if (at < 0) {
                int r = grow((void **)&s->u.keys, &s->cap_keys, s->u.n_keys, sizeof(*s->u.keys));
                if (r < 0)
                        return r;
                LedgerUsageKey *k = &s->u.keys[s->u.n_keys];
                *k = (LedgerUsageKey){ .key_id = strdup(key_id), .name = strdup(name) };
                if (!k->key_id || !k->name || slot_add(&s->key_index, k->key_id, s->u.n_keys) < 0) {
                        free(k->key_id);
                        free(k->name);
                        return -ENOMEM;
                }
                at = (ssize_t)s->u.n_keys++;
        }
        s->u.keys[at].seconds += seconds;
        s->u.keys[at].micros += micros;
        return 0;
}

static int add_sandbox_share(UsageSum *s, const char *sandbox_id, const char *key_id, bool open, int64_t seconds,
                             int64_t micros) {
        ssize_t at = slot_find(&s->sandbox_index, sandbox_id);
        if (at < 0) {
                if (s->u.n_sandboxes >= LEDGER_USAGE_MAX_SANDBOXES) {
                        s->u.truncated = true;
                        return 0;
                }
                int r = grow((void **)&s->u.sandboxes, &s->cap_sandboxes, s->u.n_sandboxes, sizeof(*s->u.sandboxes));
                if (r < 0)
                        return r;
                LedgerUsageSandbox *sb = &s->u.sandboxes[s->u.n_sandboxes];
                *sb = (LedgerUsageSandbox){ .sandbox_id = strdup(sandbox_id), .key_id = strdup(key_id) };
                if (!sb->sandbox_id || !sb->key_id ||
                    slot_add(&s->sandbox_index, sb->sandbox_id, s->u.n_sandboxes) < 0) {
                        free(sb->sandbox_id);
                        free(sb->key_id);
                        return -ENOMEM;
                }
                at = (ssize_t)s->u.n_sandboxes++;
        }
        LedgerUsageSandbox *sb = &s->u.sandboxes[at];
        if (strcmp(sb->key_id, key_id) != 0) {
                char *k = strdup(key_id);
                if (!k)
                        return -ENOMEM;
                free(sb->key_id);
                sb->key_id = k;
        }
        sb->seconds += seconds;
        sb->micros += micros;
        sb->running = open;
        return 0;
}

int ledger_usage(Ledger *l, const char *owner, int64_t since, int64_t until, int64_t now, LedgerUsage *ret) {
        _cleanup_(usage_sum_done) UsageSum s = { 0 };
        {
                LOCKED(l);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                int r = prepare(l,
                                "SELECT l.sandbox_id, l.key_id, l.started_at, l.ended_at, l.open, l.price_per_hour, "
                                "l.prior_seconds, coalesce(k.name, ''), "
                                "(SELECT r.expires_at FROM reservations r WHERE r.sandbox_id = l.sandbox_id) "
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
                        const char *sid = (const char *)sqlite3_column_text(st, 0);
                        const char *kid = (const char *)sqlite3_column_text(st, 1);
                        int64_t started = sqlite3_column_int64(st, 2), ended = sqlite3_column_int64(st, 3);
                        bool open = sqlite3_column_int(st, 4) != 0;
                        int64_t price = sqlite3_column_int64(st, 5), prior = sqlite3_column_int64(st, 6);
                        const char *kname = (const char *)sqlite3_column_text(st, 7);
                        int64_t expires = sqlite3_column_int64(st, 8);
                        if (!sid || !kid)
                                continue;
                        if (open) {
                                ended = now;
                                if (expires && ended > expires)
                                        ended = expires;
                        }
                        int64_t a = started > since ? started : since;
                        int64_t b = ended < until ? ended : until;
                        if (b < a)
                                b = a;
                        int64_t secs = b - a, micros = span_micros(price, prior, started, a, b);
                        s.u.total_seconds += secs;
                        s.u.total_micros += micros;
                        if ((r = add_key_share(&s, kid, kname ? kname : "", secs, micros)) < 0 ||
                            (r = add_sandbox_share(&s, sid, kid, open, secs, micros)) < 0)
                                return r;
                }
                if (rc != SQLITE_DONE)
                        return -EIO;
        }
        *ret = s.u;
        s.u = (LedgerUsage){ 0 };
        return 0;
}

int ledger_sandbox_total(Ledger *l, const char *sandbox_id, int64_t now, int64_t cap, int64_t *ret_seconds,
                         int64_t *ret_micros) {
        LOCKED(l);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = prepare(l,
                        "SELECT started_at, ended_at, open, price_per_hour, prior_seconds, seconds, micros "
                        "FROM ledger WHERE sandbox_id = ?1",
                        &st);
        if (r < 0)
                return r;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        int64_t secs = 0, micros = 0;
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (sqlite3_column_int(st, 2)) {
                        int64_t started = sqlite3_column_int64(st, 0), end = now;
                        if (cap > 0 && end > cap)
                                end = cap;
                        if (end < started)
                                end = started;
                        secs += end - started;
                        micros += span_micros(sqlite3_column_int64(st, 3), sqlite3_column_int64(st, 4), started,
                                              started, end);
                } else {
                        secs += sqlite3_column_int64(st, 5);
                        micros += sqlite3_column_int64(st, 6);
                }
        }
        if (rc != SQLITE_DONE)
                return -EIO;
        *ret_seconds = secs;
        *ret_micros = micros;
        return 0;
}
