/* Webhooks and their deliveries in the SQLite backend (store_webhooks.h):
 * two tables; the deliveries' rowid (seq) is the cursor. What must be atomic
 * (an insert under the owner's limit, a claim, a removal with its
 * deliveries) is one BEGIN IMMEDIATE transaction. */
#include "daemon/store/store_webhooks.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreWebhooks {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The webhooks tables' history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the tables as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS webhooks ("
          "  id TEXT PRIMARY KEY,"
          "  owner TEXT NOT NULL,"
          "  url TEXT NOT NULL,"
          "  events TEXT NOT NULL,"
          "  description TEXT,"
          "  enabled INTEGER NOT NULL,"
          "  secret TEXT NOT NULL,"
          "  previous_secret TEXT,"
          "  previous_until INTEGER NOT NULL DEFAULT 0,"
          "  created_at INTEGER NOT NULL,"
          "  updated_at INTEGER NOT NULL,"
          "  version INTEGER NOT NULL);"
          "CREATE INDEX IF NOT EXISTS webhooks_owner ON webhooks (owner, created_at);"
          "CREATE TABLE IF NOT EXISTS webhook_deliveries ("
          "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
          "  id TEXT NOT NULL UNIQUE,"
          "  webhook_id TEXT NOT NULL,"
          "  owner TEXT NOT NULL,"
          "  event_id TEXT NOT NULL,"
          "  event_type TEXT NOT NULL,"
          "  body TEXT NOT NULL,"
          "  state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),"
          "  attempts INTEGER NOT NULL DEFAULT 0,"
          "  next_at INTEGER NOT NULL DEFAULT 0,"
          "  response_status INTEGER NOT NULL DEFAULT 0,"
          "  last_error TEXT,"
          "  claimed_by TEXT,"
          "  claimed_until INTEGER NOT NULL DEFAULT 0,"
          "  created_at INTEGER NOT NULL,"
          "  updated_at INTEGER NOT NULL);"
          "CREATE INDEX IF NOT EXISTS webhook_deliveries_hook ON webhook_deliveries (webhook_id, seq);"
          "CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (state, next_at);"
          "CREATE INDEX IF NOT EXISTS webhook_deliveries_updated ON webhook_deliveries (updated_at);" },
};

static int sqlite_webhooks_open(const char *location, StoreWebhooks **ret) {
        return sqldb_handle_open(location, "webhooks", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_webhooks_close(StoreWebhooks *h) {
        sqldb_handle_close(h);
}

static int step_errno(int rc) {
        return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : sqldb_errno(rc) ?: -EIO;
}

/* Ends a transaction begun with BEGIN IMMEDIATE: COMMIT when r is not an
 * error, else ROLLBACK. */
static int transaction_end(StoreWebhooks *h, int r) {
        if (r >= 0 && (r = sqldb_exec(h->sql, "COMMIT")) >= 0)
                return r;
        (void)sqldb_exec(h->sql, "ROLLBACK");
        return r;
}

/* ---- webhooks ---- */

#define HOOK_COLUMNS                                                                                        \
        "id, owner, url, events, description, enabled, secret, previous_secret, previous_until, created_at, " \
        "updated_at, version"

static WebhookRecord hook_row(sqlite3_stmt *st) {
        WebhookRecord w = { .owner = sqldb_col(st, 1), .url = sqldb_col(st, 2), .events = sqldb_col(st, 3), .description = sqldb_col(st, 4),
                            .enabled = sqlite3_column_int(st, 5) != 0, .secret = sqldb_col(st, 6),
                            .previous_secret = sqldb_col(st, 7), .previous_until = sqlite3_column_int64(st, 8),
                            .created_at = sqlite3_column_int64(st, 9), .updated_at = sqlite3_column_int64(st, 10),
                            .version = sqlite3_column_int64(st, 11) };
        snprintf(w.id, sizeof w.id, "%s", sqldb_col(st, 0) ?: "");
        return w;
}

static int hook_count(StoreWebhooks *h, const char *owner, int64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT count(*) FROM webhooks WHERE owner = ?", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
                return step_errno(rc) ?: -EIO;
        *ret = sqlite3_column_int64(st, 0);
        return 0;
}

static int hook_insert(StoreWebhooks *h, const WebhookRecord *w) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "INSERT INTO webhooks (" HOOK_COLUMNS ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, w->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, w->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, w->url, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, w->events ? w->events : "[]", -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 5, w->description);
        sqlite3_bind_int(st, 6, w->enabled ? 1 : 0);
        sqlite3_bind_text(st, 7, w->secret, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 8, w->previous_secret);
        sqlite3_bind_int64(st, 9, w->previous_until);
        sqlite3_bind_int64(st, 10, w->created_at);
        sqlite3_bind_int64(st, 11, w->updated_at);
        return step_errno(sqlite3_step(st));
}

static int hook_put_tx(StoreWebhooks *h, const WebhookRecord *w, unsigned max_per_owner) {
        int64_t n = 0;
        int r = hook_count(h, w->owner, &n);
        if (r < 0)
                return r;
        if (max_per_owner > 0 && n >= (int64_t)max_per_owner)
                return -EDQUOT;
        return hook_insert(h, w);
}

static int sqlite_webhooks_put(StoreWebhooks *h, const WebhookRecord *w, unsigned max_per_owner) {
        if (!w->owner || !w->url || !w->secret)
                return -EINVAL;
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        return transaction_end(h, hook_put_tx(h, w, max_per_owner));
}

static int walk_hooks(sqlite3_stmt *st, StoreWebhookFn fn, void *userdata, bool one) {
        int rc, r = 0;
        bool any = false;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                WebhookRecord w = hook_row(st);
                any = true;
                r = fn(userdata, &w);
        }
        if (r < 0)
                return r;
        if (rc != SQLITE_DONE && rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        return one && !any ? -ENOENT : 0;
}

static int sqlite_webhooks_get(StoreWebhooks *h, const char *id, const char *owner, StoreWebhookFn fn,
                               void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT " HOOK_COLUMNS " FROM webhooks WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 2, owner);
        return walk_hooks(st, fn, userdata, true);
}

static int sqlite_webhooks_list(StoreWebhooks *h, const char *owner, StoreWebhookFn fn, void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT " HOOK_COLUMNS " FROM webhooks WHERE (?1 IS NULL OR owner = ?1) "
                               "ORDER BY created_at, id",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqldb_bind_opt(st, 1, owner);
        return walk_hooks(st, fn, userdata, false);
}

/* -ENOENT or -ESTALE for an update that changed nothing. */
static int hook_missing_or_stale(StoreWebhooks *h, const WebhookRecord *w) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT 1 FROM webhooks WHERE id = ? AND owner = ?", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, w->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, w->owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        return rc == SQLITE_ROW ? -ESTALE : rc == SQLITE_DONE ? -ENOENT : sqldb_errno(rc) ?: -EIO;
}

static int sqlite_webhooks_update(StoreWebhooks *h, const WebhookRecord *w) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE webhooks SET url = ?, events = ?, description = ?, enabled = ?, secret = ?, "
                               "previous_secret = ?, previous_until = ?, updated_at = ?, version = version + 1 "
                               "WHERE id = ? AND owner = ? AND version = ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, w->url, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, w->events ? w->events : "[]", -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 3, w->description);
        sqlite3_bind_int(st, 4, w->enabled ? 1 : 0);
        sqlite3_bind_text(st, 5, w->secret, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 6, w->previous_secret);
        sqlite3_bind_int64(st, 7, w->previous_until);
        sqlite3_bind_int64(st, 8, w->updated_at);
        sqlite3_bind_text(st, 9, w->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 10, w->owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 11, w->version);
        int r = step_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : hook_missing_or_stale(h, w);
}

static int exec_bound(StoreWebhooks *h, const char *sql, const char *a, const char *b, int *ret_changes) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, sql, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, a, -1, SQLITE_STATIC);
        if (b)
                sqlite3_bind_text(st, 2, b, -1, SQLITE_STATIC);
        int r = step_errno(sqlite3_step(st));
        if (r == 0 && ret_changes)
                *ret_changes = sqlite3_changes(h->sql);
        return r;
}

static int hook_remove_tx(StoreWebhooks *h, const char *id, const char *owner) {
        int n = 0;
        int r = exec_bound(h, "DELETE FROM webhooks WHERE id = ? AND owner = ?", id, owner, &n);
        if (r < 0)
                return r;
        if (n == 0)
                return -ENOENT;
        return exec_bound(h, "DELETE FROM webhook_deliveries WHERE webhook_id = ?", id, NULL, NULL);
}

static int sqlite_webhooks_remove(StoreWebhooks *h, const char *id, const char *owner) {
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        return transaction_end(h, hook_remove_tx(h, id, owner));
}

/* ---- deliveries ---- */

#define DELIVERY_COLUMNS                                                                                      \
        "seq, id, webhook_id, owner, event_id, event_type, body, state, attempts, next_at, response_status, " \
        "last_error, claimed_by, claimed_until, created_at, updated_at"

static DeliveryRecord delivery_row(sqlite3_stmt *st) {
        DeliveryRecord d = { .seq = sqlite3_column_int64(st, 0), .webhook_id = sqldb_col(st, 2), .owner = sqldb_col(st, 3),
                             .event_id = sqldb_col(st, 4), .event_type = sqldb_col(st, 5), .body = sqldb_col(st, 6),
                             .state = sqldb_col(st, 7), .attempts = sqlite3_column_int(st, 8),
                             .next_at = sqlite3_column_int64(st, 9), .response_status = sqlite3_column_int(st, 10),
                             .last_error = sqldb_col(st, 11), .claimed_by = sqldb_col(st, 12),
                             .claimed_until = sqlite3_column_int64(st, 13), .created_at = sqlite3_column_int64(st, 14),
                             .updated_at = sqlite3_column_int64(st, 15) };
        snprintf(d.id, sizeof d.id, "%s", sqldb_col(st, 1) ?: "");
        return d;
}

static int walk_deliveries(sqlite3_stmt *st, StoreDeliveryFn fn, void *userdata, bool one) {
        int rc, r = 0;
        bool any = false;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                DeliveryRecord d = delivery_row(st);
                any = true;
                r = fn ? fn(userdata, &d) : 0;
        }
        if (r < 0)
                return r;
        if (rc != SQLITE_DONE && rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        return one && !any ? -ENOENT : 0;
}

static int insert_delivery(StoreWebhooks *h, const DeliveryRecord *d) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO webhook_deliveries (id, webhook_id, owner, event_id, event_type, body, "
                               "state, attempts, next_at, response_status, last_error, created_at, updated_at) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, d->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, d->webhook_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, d->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, d->event_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, d->event_type, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 6, d->body, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 7, d->state ? d->state : "pending", -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 8, d->attempts);
        sqlite3_bind_int64(st, 9, d->next_at);
        sqlite3_bind_int(st, 10, d->response_status);
        sqldb_bind_opt(st, 11, d->last_error);
        sqlite3_bind_int64(st, 12, d->created_at);
        sqlite3_bind_int64(st, 13, d->updated_at);
        return step_errno(sqlite3_step(st));
}

static int enqueue_tx(StoreWebhooks *h, const DeliveryRecord *d, size_t n) {
        int r = 0;
        for (size_t i = 0; r == 0 && i < n; i++)
                r = insert_delivery(h, &d[i]);
        return r;
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_webhooks_set_writer(StoreWebhooks *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int sqlite_webhooks_enqueue(StoreWebhooks *h, const DeliveryRecord *d, size_t n) {
        LOCKED(h);
        if (n == 1)
                return insert_delivery(h, d);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        return transaction_end(h, enqueue_tx(h, d, n));
}

/* The ids of up to max deliveries due at now that no live claim holds, all
 * of the owner of the oldest due one among the owners not in skip. */
static int due_ids(StoreWebhooks *h, int64_t now, unsigned max, const char *const *skip, size_t n_skip,
                   char (*ids)[DELIVERY_ID_LEN + 1], unsigned *n) {
        char cond[DELIVERY_CLAIM_SKIP_MAX * 8 + 32], sql[1024];
        if (!store_not_in(cond, sizeof cond, "owner", '?', 3, n_skip))
                return -E2BIG;
        snprintf(sql, sizeof sql,
                 "SELECT id FROM webhook_deliveries WHERE state = 'pending' AND next_at <= ?1 "
                 "AND claimed_until < ?1 AND owner = (SELECT owner FROM webhook_deliveries "
                 "WHERE state = 'pending' AND next_at <= ?1 AND claimed_until < ?1%s "
                 "ORDER BY next_at, seq LIMIT 1) ORDER BY next_at, seq LIMIT ?2",
                 cond);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, sql, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_int64(st, 2, max);
        for (size_t i = 0; i < n_skip; i++)
                sqlite3_bind_text(st, 3 + (int)i, skip[i], -1, SQLITE_STATIC);
        int rc = SQLITE_DONE;
        *n = 0;
        while (*n < max && (rc = sqlite3_step(st)) == SQLITE_ROW)
                snprintf(ids[(*n)++], DELIVERY_ID_LEN + 1, "%s", sqldb_col(st, 0) ?: "");
        return *n == max ? 0 : step_errno(rc);
}

/* A claim is a write: the delivery's updated_at moves too, so that pruning
 * never takes one while an attempt of it is in flight. */
static int set_claim(StoreWebhooks *h, const char *id, const char *host, int64_t now, int64_t until) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE webhook_deliveries SET claimed_by = ?, claimed_until = ?, updated_at = ? WHERE id = ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, host, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, until);
        sqlite3_bind_int64(st, 3, now);
        sqlite3_bind_text(st, 4, id, -1, SQLITE_STATIC);
        return step_errno(sqlite3_step(st));
}

static int read_delivery(StoreWebhooks *h, const char *id, const char *owner, StoreDeliveryFn fn, void *userdata) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT " DELIVERY_COLUMNS " FROM webhook_deliveries WHERE id = ?1 "
                               "AND (?2 IS NULL OR owner = ?2)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 2, owner);
        return walk_deliveries(st, fn, userdata, true);
}

#define CLAIM_MAX 64

static int claim_tx(StoreWebhooks *h, const char *host, int64_t now, int64_t until, unsigned max,
                    const char *const *skip, size_t n_skip, StoreDeliveryFn fn, void *userdata) {
        char ids[CLAIM_MAX][DELIVERY_ID_LEN + 1];
        unsigned n = 0;
        int r = due_ids(h, now, max > CLAIM_MAX ? CLAIM_MAX : max, skip, n_skip, ids, &n);
        for (unsigned i = 0; r == 0 && i < n; i++)
                r = set_claim(h, ids[i], host, now, until);
        for (unsigned i = 0; r == 0 && i < n; i++)
                r = read_delivery(h, ids[i], NULL, fn, userdata);
        return r;
}

static int sqlite_webhooks_claim(StoreWebhooks *h, const char *host, int64_t now, int64_t until, unsigned max,
                                 const char *const *skip, size_t n_skip, StoreDeliveryFn fn, void *userdata) {
        if (n_skip > DELIVERY_CLAIM_SKIP_MAX)
                return -E2BIG;
        LOCKED(h);
        /* Most calls find nothing due: a read first, and the write lock only
         * when there is something to claim. */
        char probe[1][DELIVERY_ID_LEN + 1];
        unsigned n = 0;
        int r = due_ids(h, now, 1, skip, n_skip, probe, &n);
        if (r < 0 || n == 0)
                return r;
        if ((r = sqldb_exec(h->sql, "BEGIN IMMEDIATE")) < 0)
                return r;
        return transaction_end(h, claim_tx(h, host, now, until, max, skip, n_skip, fn, userdata));
}

typedef struct Claimable {
        const char *host;
        int64_t now;
        bool busy;
} Claimable;

static int check_claimable(void *userdata, const DeliveryRecord *d) {
        Claimable *c = userdata;
        c->busy = d->claimed_by && *d->claimed_by && d->claimed_until >= c->now;
        return 0;
}

static int claim_one_tx(StoreWebhooks *h, const char *id, const char *owner, const char *host, int64_t now,
                        int64_t until, StoreDeliveryFn fn, void *userdata) {
        Claimable c = { .host = host, .now = now };
        int r = read_delivery(h, id, owner, check_claimable, &c);
        if (r < 0)
                return r;
        if (c.busy)
                return -EBUSY;
        if ((r = set_claim(h, id, host, now, until)) < 0)
                return r;
        return read_delivery(h, id, owner, fn, userdata);
}

static int sqlite_webhooks_claim_one(StoreWebhooks *h, const char *id, const char *owner, const char *host,
                                     int64_t now, int64_t until, StoreDeliveryFn fn, void *userdata) {
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        return transaction_end(h, claim_one_tx(h, id, owner, host, now, until, fn, userdata));
}

static int sqlite_webhooks_finish(StoreWebhooks *h, const DeliveryRecord *d) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE webhook_deliveries SET state = ?, attempts = ?, next_at = ?, response_status = ?, "
                               "last_error = ?, updated_at = ?, claimed_by = NULL, claimed_until = 0 "
                               "WHERE id = ? AND claimed_by = ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, d->state, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 2, d->attempts);
        sqlite3_bind_int64(st, 3, d->next_at);
        sqlite3_bind_int(st, 4, d->response_status);
        sqldb_bind_opt(st, 5, d->last_error);
        sqlite3_bind_int64(st, 6, d->updated_at);
        sqlite3_bind_text(st, 7, d->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 8, d->claimed_by ? d->claimed_by : "", -1, SQLITE_STATIC);
        int r = step_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : -ESTALE;
}

static int sqlite_webhooks_get_delivery(StoreWebhooks *h, const char *id, const char *owner, StoreDeliveryFn fn,
                                        void *userdata) {
        LOCKED(h);
        return read_delivery(h, id, owner, fn, userdata);
}

static int sqlite_webhooks_deliveries(StoreWebhooks *h, const DeliveryFilter *f, StoreDeliveryFn fn,
                                      void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT " DELIVERY_COLUMNS " FROM webhook_deliveries WHERE webhook_id = ?1 "
                               "AND (?2 IS NULL OR state = ?2) AND (?3 = 0 OR seq < ?3) ORDER BY seq DESC LIMIT ?4",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, f->webhook_id, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 2, f->state);
        sqlite3_bind_int64(st, 3, f->before);
        sqlite3_bind_int64(st, 4, f->limit);
        return walk_deliveries(st, fn, userdata, false);
}

static int sqlite_webhooks_prune(StoreWebhooks *h, int64_t before, int64_t *ret_n) {
        LOCKED(h);
        return sqldb_delete_before(h->sql, "DELETE FROM webhook_deliveries WHERE state <> 'pending' AND updated_at < ?",
                                   before, ret_n);
}

const StoreWebhookOps store_sqlite_webhooks = {
        .open = sqlite_webhooks_open,
        .close = sqlite_webhooks_close,
        .put = sqlite_webhooks_put,
        .get = sqlite_webhooks_get,
        .list = sqlite_webhooks_list,
        .update = sqlite_webhooks_update,
        .remove = sqlite_webhooks_remove,
        .set_writer = sqlite_webhooks_set_writer,
        .enqueue = sqlite_webhooks_enqueue,
        .claim = sqlite_webhooks_claim,
        .claim_one = sqlite_webhooks_claim_one,
        .finish = sqlite_webhooks_finish,
        .get_delivery = sqlite_webhooks_get_delivery,
        .deliveries = sqlite_webhooks_deliveries,
        .prune = sqlite_webhooks_prune,
};
