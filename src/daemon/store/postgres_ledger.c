/* The ledger in PostgreSQL (store_ledger.h): the SQLite backend's statements
 * in PostgreSQL's words, on the tables of postgres_schema.c. A reservation's
 * check against its budget and its write are one serializable transaction,
 * so that hosts reserving against one key at once never overshoot it
 * together: the server refuses all but one of two that read each other's
 * rows, and the loser runs again and sees the winner's. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_ledger.h"

struct StoreLedger {
        PgConn c;
        char host[64]; /* set_host's; "" until then */
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_ledger_open(const char *location, StoreLedger **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_ledger_close(StoreLedger *h) {
        pgdb_handle_close(h);
}

/* What the key has used, in one statement and so in one snapshot. `except`
 * is a sandbox whose reservation is left out of the sums (it is being
 * replaced); the earliest end counts every open reservation. */
static int key_use_run(PgConn *c, bool locked, const char *key_id, const char *except, int64_t since,
                       StoreLedgerUse *ret) {
        PgParams p = { 0 };
        pgp_text(&p, key_id);
        pgp_int(&p, since);
        pgp_text(&p, except ? except : "");
        static const char sql[] =
                "SELECT "
                "(SELECT COALESCE(sum(micros), 0) FROM ledger "
                " WHERE key_id = $1 AND open = 0 AND ended_at > $2::bigint), "
                "(SELECT COALESCE(min(ended_at), 0) FROM ledger "
                " WHERE key_id = $1 AND open = 0 AND ended_at > $2::bigint AND micros > 0), "
                "(SELECT COALESCE(sum(seconds), 0) FROM ledger "
                " WHERE key_id = $1 AND open = 0 AND sandbox_id NOT LIKE '%" LEDGER_DISK_SUFFIX "'), "
                "(SELECT COALESCE(min(expires_at), 0) FROM reservations "
                " WHERE key_id = $1 AND settled_at IS NULL), "
                "(SELECT COALESCE(sum(amount_micros), 0) FROM reservations "
                " WHERE key_id = $1 AND settled_at IS NULL AND sandbox_id <> $3::text), "
                "(SELECT COALESCE(sum(seconds), 0) FROM reservations "
                " WHERE key_id = $1 AND settled_at IS NULL AND sandbox_id <> $3::text)";
        _cleanup_pgres_ PGresult *res = NULL;
        int r = locked ? pgdb_run_locked(c, sql, &p, &res) : pgdb_run(c, sql, &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1)
                return -EIO;
        *ret = (StoreLedgerUse){
                .settled_micros = pgi(res, 0, 0),
                .oldest_charge_end = pgi(res, 0, 1),
                .settled_seconds = pgi(res, 0, 2),
                .reservations_end = pgi(res, 0, 3),
                .reserved_micros = pgi(res, 0, 4),
                .reserved_seconds = pgi(res, 0, 5),
        };
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

typedef struct Reserve {
        const StoreReservation *res;
        const LedgerBudget *budget;
        int64_t since, now;
        StoreLedgerUse use;
        bool counted;
} Reserve;

static int reserve_tx(PgConn *c, void *userdata) {
        Reserve *a = userdata;
        const StoreReservation *res = a->res;
        a->counted = false;
        int r = key_use_run(c, true, res->key_id, res->sandbox_id, a->since, &a->use);
        if (r < 0)
                return r;
        a->counted = true;
        if (!within(&a->use, res, a->budget))
                return -EDQUOT;
        PgParams p = { 0 };
        pgp_text(&p, res->sandbox_id);
        pgp_text(&p, res->key_id);
        pgp_text(&p, res->owner);
        pgp_int(&p, res->amount_micros);
        pgp_int(&p, res->seconds);
        pgp_int(&p, a->now);
        pgp_int(&p, res->expires_at);
        /* A settled reservation opened again starts anew; an open one keeps
         * its start. */
        return pgdb_exec_locked(c,
                                "INSERT INTO reservations (sandbox_id, key_id, owner, amount_micros, seconds, "
                                "created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7) "
                                "ON CONFLICT (sandbox_id) DO UPDATE SET amount_micros = excluded.amount_micros, "
                                "seconds = excluded.seconds, expires_at = excluded.expires_at, "
                                "created_at = CASE WHEN reservations.settled_at IS NULL "
                                "THEN reservations.created_at ELSE excluded.created_at END, settled_at = NULL",
                                &p);
}

static int pg_ledger_reserve(StoreLedger *h, const StoreReservation *res, const LedgerBudget *budget, int64_t since,
                             int64_t now, StoreLedgerUse *ret_use) {
        if (res->amount_micros < 0 || res->seconds < 0)
                return -EINVAL;
        Reserve a = { .res = res, .budget = budget, .since = since, .now = now };
        int r = pgdb_write(&h->c, reserve_tx, &a);
        if (a.counted && (r == 0 || r == -EDQUOT))
                *ret_use = a.use;
        return r;
}

#define RELEASE_SQL "UPDATE reservations SET settled_at = $2 WHERE sandbox_id = $1 AND settled_at IS NULL"

/* Inside a transaction. */
static int release_locked(PgConn *c, const char *sandbox_id, int64_t now) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        pgp_int(&p, now);
        return pgdb_exec_locked(c, RELEASE_SQL, &p);
}

static int pg_ledger_release(StoreLedger *h, const char *sandbox_id, int64_t now) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        pgp_int(&p, now);
        return pgdb_exec_write(&h->c, RELEASE_SQL, &p, NULL);
}

typedef struct Begin {
        const char *sandbox_id, *key_id, *owner;
        const char *host_id;
        int64_t started_at, per_hour, lease_ends_at;
} Begin;

static int begin_tx(PgConn *c, void *userdata) {
        const Begin *a = userdata;
        /* The reservation now ends with the lease, which starts only now. */
        PgParams u = { 0 };
        pgp_text(&u, a->sandbox_id);
        pgp_int(&u, a->lease_ends_at);
        int r = pgdb_exec_locked(c,
                                 "UPDATE reservations SET expires_at = $2 WHERE sandbox_id = $1 AND settled_at IS NULL",
                                 &u);
        if (r < 0)
                return r;
        PgParams p = { 0 };
        pgp_text(&p, a->sandbox_id);
        pgp_text(&p, a->key_id);
        pgp_text(&p, a->owner);
        pgp_int(&p, a->started_at);
        pgp_int(&p, a->per_hour);
        pgp_text(&p, a->host_id);
        return pgdb_exec_locked(c,
                                "INSERT INTO ledger (sandbox_id, key_id, owner, started_at, ended_at, price_per_hour, "
                                "prior_seconds, host_id) VALUES ($1, $2, $3, $4, $4, $5, (SELECT COALESCE(sum(seconds), 0) "
                                "FROM ledger WHERE sandbox_id = $1 AND open = 0), $6)",
                                &p);
}

static int pg_ledger_begin(StoreLedger *h, const char *sandbox_id, const char *key_id, const char *owner,
                           int64_t started_at, uint64_t per_hour, int64_t lease_ends_at) {
        Begin a = { .sandbox_id = sandbox_id,
                    .host_id = h->host,
                    .key_id = key_id,
                    .owner = owner,
                    .started_at = started_at,
                    .per_hour = (int64_t)(per_hour > INT64_MAX ? INT64_MAX : per_hour),
                    .lease_ends_at = lease_ends_at };
        return pgdb_write(&h->c, begin_tx, &a);
}

typedef struct Settle {
        const char *sandbox_id;
        int64_t end, now;
        bool at_heartbeat;
        StoreLedgerCost cost;
        int closed; /* 0, or -ENOENT when no charge was open */
        int64_t last_end;
} Settle;

/* Closes the open charges of a series at `end` (or at their heartbeat when
 * at_heartbeat, no later than end), inside the transaction. */
static int close_locked(PgConn *c, Settle *a) {
        PgParams p = { 0 };
        pgp_text(&p, a->sandbox_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c,
                                "SELECT id, started_at, ended_at, price_per_hour, prior_seconds FROM ledger "
                                "WHERE sandbox_id = $1 AND open = 1 ORDER BY id",
                                &p, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        for (int i = 0; i < n; i++) {
                int64_t id = pgi(res, i, 0), started = pgi(res, i, 1), beat = pgi(res, i, 2), price = pgi(res, i, 3),
                        prior = pgi(res, i, 4);
                int64_t stop = a->at_heartbeat ? (beat < a->end ? beat : a->end) : a->end;
                if (stop < started)
                        stop = started;
                int64_t secs = stop - started;
                int64_t micros =
                        (int64_t)(a->cost((uint64_t)price, prior + secs) - a->cost((uint64_t)price, prior));
                PgParams u = { 0 };
                pgp_int(&u, id);
                pgp_int(&u, stop);
                pgp_int(&u, secs);
                pgp_int(&u, micros);
                if ((r = pgdb_exec_locked(c, "UPDATE ledger SET open = 0, ended_at = $2, seconds = $3, micros = $4 "
                                             "WHERE id = $1",
                                          &u)) < 0)
                        return r;
                a->last_end = stop;
        }
        return n > 0 ? 0 : -ENOENT;
}

static int settle_tx(PgConn *c, void *userdata) {
        Settle *a = userdata;
        a->closed = close_locked(c, a);
        if (a->closed < 0 && a->closed != -ENOENT)
                return a->closed;
        /* No open charge: the reservation settles all the same, so the
         * transaction commits and the -ENOENT is returned after it. */
        return release_locked(c, a->sandbox_id, a->now);
}

static int pg_ledger_settle(StoreLedger *h, const char *sandbox_id, int64_t end, bool at_heartbeat, int64_t now,
                            StoreLedgerCost cost, int64_t *ret_end) {
        Settle a = { .sandbox_id = sandbox_id, .end = end, .now = now, .at_heartbeat = at_heartbeat, .cost = cost };
        int r = pgdb_write(&h->c, settle_tx, &a);
        if (r < 0)
                return r;
        if (a.closed == 0 && ret_end)
                *ret_end = a.last_end;
        return a.closed;
}

static int pg_ledger_heartbeat(StoreLedger *h, int64_t now) {
        PgParams p = { 0 };
        pgp_int(&p, now);
        pgp_text(&p, h->host);
        return pgdb_exec_write(&h->c,
                               "UPDATE ledger SET ended_at = $1 WHERE open = 1 AND ended_at < $1 AND host_id IN ($2, '')",
                               &p, NULL);
}

static int pg_ledger_set_epoch(StoreLedger *h, int64_t epoch) {
        pthread_mutex_lock(&h->c.lock);
        char host[sizeof(h->host)];
        memcpy(host, h->host, sizeof(host));
        pthread_mutex_unlock(&h->c.lock);
        return pgdb_set_writer(&h->c, host, epoch);
}

static int pg_ledger_set_host(StoreLedger *h, const char *host_id) {
        if (strlen(host_id) >= sizeof(h->host))
                return -EINVAL;
        pthread_mutex_lock(&h->c.lock);
        snprintf(h->host, sizeof(h->host), "%s", host_id);
        pthread_mutex_unlock(&h->c.lock);
        return 0;
}

static int pg_ledger_settle_orphans(StoreLedger *h, int64_t now) {
        PgParams p = { 0 };
        pgp_int(&p, now);
        pgp_text(&p, h->host);
        pgp_int(&p, now - LEDGER_ORPHAN_GRACE_SECONDS);
        return pgdb_exec_write(&h->c,
                               "UPDATE reservations SET settled_at = $1 WHERE settled_at IS NULL AND ("
                               "sandbox_id IN (SELECT id FROM sandboxes WHERE host_id IN ($2, '') AND NOT "
                               "(deleted_at IS NULL AND state IN ('starting', 'running'))) OR "
                               "(created_at <= $3 AND sandbox_id NOT IN (SELECT id FROM sandboxes)))",
                               &p, NULL);
}

static int pg_ledger_key_budget(StoreLedger *h, const char *key_id, StoreLedgerKey *ret) {
        PgParams p = { 0 };
        pgp_text(&p, key_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT daily_limit_micros, trial FROM keys WHERE id = $1", &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        ret->daily_limit_micros = pgnull(res, 0, 0) ? -1 : pgi(res, 0, 0);
        ret->trial = pgi(res, 0, 1) != 0;
        return 0;
}

static int pg_ledger_key_use(StoreLedger *h, const char *key_id, int64_t since, StoreLedgerUse *ret) {
        return key_use_run(&h->c, false, key_id, NULL, since, ret);
}

static int pg_ledger_owner_intervals(StoreLedger *h, const char *owner, int64_t since, int64_t until,
                                     StoreLedgerEach each, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_int(&p, since);
        pgp_int(&p, until);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT l.sandbox_id, l.key_id, l.started_at, l.ended_at, l.open, l.price_per_hour, "
                         "l.prior_seconds, COALESCE(k.name, ''), "
                         "COALESCE((SELECT r.expires_at FROM reservations r WHERE r.sandbox_id = l.sandbox_id), 0), "
                         "l.seconds, l.micros "
                         "FROM ledger l LEFT JOIN keys k ON k.id = l.key_id "
                         "WHERE l.owner = $1 AND (l.open = 1 OR l.ended_at >= $2) AND l.started_at <= $3 "
                         "ORDER BY l.started_at, l.id",
                         &p, &res);
        if (r < 0)
                return r;
        /* The rows are all here: the callback runs without the connection. */
        int n = PQntuples(res);
        for (int i = 0; i < n; i++) {
                const char *kname = pgv(res, i, 7);
                StoreLedgerInterval iv = {
                        .sandbox_id = pgv(res, i, 0),
                        .key_id = pgv(res, i, 1),
                        .key_name = kname ? kname : "",
                        .started_at = pgi(res, i, 2),
                        .ended_at = pgi(res, i, 3),
                        .open = pgi(res, i, 4) != 0,
                        .price_per_hour = pgi(res, i, 5),
                        .prior_seconds = pgi(res, i, 6),
                        .reservation_expires_at = pgi(res, i, 8),
                        .seconds = pgi(res, i, 9),
                        .micros = pgi(res, i, 10),
                };
                if (!iv.sandbox_id || !iv.key_id)
                        continue;
                if ((r = each(&iv, userdata)) < 0)
                        return r;
        }
        return 0;
}

static int pg_ledger_sandbox_intervals(StoreLedger *h, const char *sandbox_id, StoreLedgerEach each,
                                       void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT sandbox_id, key_id, started_at, ended_at, open, price_per_hour, prior_seconds, "
                         "seconds, micros FROM ledger WHERE sandbox_id = $1 ORDER BY id",
                         &p, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        for (int i = 0; i < n; i++) {
                const char *sid = pgv(res, i, 0), *kid = pgv(res, i, 1);
                StoreLedgerInterval iv = {
                        .sandbox_id = sid ? sid : "",
                        .key_id = kid ? kid : "",
                        .key_name = "",
                        .started_at = pgi(res, i, 2),
                        .ended_at = pgi(res, i, 3),
                        .open = pgi(res, i, 4) != 0,
                        .price_per_hour = pgi(res, i, 5),
                        .prior_seconds = pgi(res, i, 6),
                        .seconds = pgi(res, i, 7),
                        .micros = pgi(res, i, 8),
                };
                if ((r = each(&iv, userdata)) < 0)
                        return r;
        }
        return 0;
}

const StoreLedgerOps store_postgres_ledger = {
        .open = pg_ledger_open,
        .close = pg_ledger_close,
        .key_budget = pg_ledger_key_budget,
        .reserve = pg_ledger_reserve,
        .release = pg_ledger_release,
        .begin = pg_ledger_begin,
        .settle = pg_ledger_settle,
        .heartbeat = pg_ledger_heartbeat,
        .settle_orphans = pg_ledger_settle_orphans,
        .set_host = pg_ledger_set_host,
        .set_epoch = pg_ledger_set_epoch,
        .key_use = pg_ledger_key_use,
        .owner_intervals = pg_ledger_owner_intervals,
        .sandbox_intervals = pg_ledger_sandbox_intervals,
};
