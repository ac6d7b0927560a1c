/* Webhooks and their deliveries in PostgreSQL (store_webhooks.h): the
 * SQLite backend's tables in PostgreSQL's words. The insert under the
 * owner's limit and a removal with its deliveries are serializable
 * transactions; a claim is one UPDATE over rows taken FOR UPDATE SKIP LOCKED,
 * so hosts claiming at once never take the same delivery and never wait on
 * each other's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store_webhooks.h"

struct StoreWebhooks {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_webhooks_open(const char *location, StoreWebhooks **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_webhooks_close(StoreWebhooks *h) {
        pgdb_handle_close(h);
}

static const char *opt(const char *v) {
        return v && *v ? v : NULL;
}

/* ---- webhooks ---- */

#define HOOK_COLUMNS                                                                                        \
        "id, owner, url, events, description, enabled, secret, previous_secret, previous_until, created_at, " \
        "updated_at, version"

static int walk_hooks(const PGresult *res, StoreWebhookFn fn, void *userdata, bool one) {
        int n = PQntuples(res);
        if (one && n == 0)
                return -ENOENT;
        for (int i = 0; i < n; i++) {
                WebhookRecord w = { .owner = pgv(res, i, 1), .url = pgv(res, i, 2), .events = pgv(res, i, 3),
                                    .description = pgv(res, i, 4), .enabled = pgi(res, i, 5) != 0,
                                    .secret = pgv(res, i, 6), .previous_secret = pgv(res, i, 7),
                                    .previous_until = pgi(res, i, 8), .created_at = pgi(res, i, 9),
                                    .updated_at = pgi(res, i, 10), .version = pgi(res, i, 11) };
                snprintf(w.id, sizeof w.id, "%s", pgv(res, i, 0) ?: "");
                int r = fn(userdata, &w);
                if (r < 0)
                        return r;
        }
        return 0;
}

typedef struct Put {
        const WebhookRecord *w;
        unsigned max_per_owner;
} Put;

static int put_tx(PgConn *c, void *userdata) {
        const Put *a = userdata;
        const WebhookRecord *w = a->w;
        PgParams p = { 0 };
        pgp_text(&p, w->owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c, "SELECT count(*) FROM webhooks WHERE owner = $1", &p, &res);
        if (r < 0)
                return r;
        if (a->max_per_owner > 0 && pgi(res, 0, 0) >= (int64_t)a->max_per_owner)
                return -EDQUOT;
        p = (PgParams){ 0 };
        pgp_text(&p, w->id);
        pgp_text(&p, w->owner);
        pgp_text(&p, w->url);
        pgp_text(&p, w->events ? w->events : "[]");
        pgp_text(&p, opt(w->description));
        pgp_int(&p, w->enabled ? 1 : 0);
        pgp_text(&p, w->secret);
        pgp_text(&p, opt(w->previous_secret));
        pgp_int(&p, w->previous_until);
        pgp_int(&p, w->created_at);
        pgp_int(&p, w->updated_at);
        return pgdb_exec_locked(c,
                                "INSERT INTO webhooks (" HOOK_COLUMNS ") "
                                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 1)",
                                &p);
}

static int pg_webhooks_put(StoreWebhooks *h, const WebhookRecord *w, unsigned max_per_owner) {
        if (!w->owner || !w->url || !w->secret)
                return -EINVAL;
        Put a = { .w = w, .max_per_owner = max_per_owner };
        return pgdb_transaction(&h->c, put_tx, &a);
}

static int pg_webhooks_get(StoreWebhooks *h, const char *id, const char *owner, StoreWebhookFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, opt(owner));
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT " HOOK_COLUMNS " FROM webhooks WHERE id = $1 AND ($2::text IS NULL OR owner = $2)",
                         &p, &res);
        return r < 0 ? r : walk_hooks(res, fn, userdata, true);
}

static int pg_webhooks_list(StoreWebhooks *h, const char *owner, StoreWebhookFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, opt(owner));
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " HOOK_COLUMNS " FROM webhooks WHERE ($1::text IS NULL OR owner = $1) "
                         "ORDER BY created_at, id",
                         &p, &res);
        return r < 0 ? r : walk_hooks(res, fn, userdata, false);
}

/* -ENOENT or -ESTALE for a conditional write that changed nothing. */
static int hook_missing_or_stale(StoreWebhooks *h, const char *id, const char *owner) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT 1 FROM webhooks WHERE id = $1 AND owner = $2", &p, &res);
        return r < 0 ? r : PQntuples(res) ? -ESTALE : -ENOENT;
}

static int pg_webhooks_update(StoreWebhooks *h, const WebhookRecord *w) {
        PgParams p = { 0 };
        pgp_text(&p, w->url);
        pgp_text(&p, w->events ? w->events : "[]");
        pgp_text(&p, opt(w->description));
        pgp_int(&p, w->enabled ? 1 : 0);
        pgp_text(&p, w->secret);
        pgp_text(&p, opt(w->previous_secret));
        pgp_int(&p, w->previous_until);
        pgp_int(&p, w->updated_at);
        pgp_text(&p, w->id);
        pgp_text(&p, w->owner);
        pgp_int(&p, w->version);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "UPDATE webhooks SET url = $1, events = $2, description = $3, enabled = $4, secret = $5, "
                         "previous_secret = $6, previous_until = $7, updated_at = $8, version = version + 1 "
                         "WHERE id = $9 AND owner = $10 AND version = $11",
                         &p, &res);
        if (r < 0)
                return r;
        return strtoll(PQcmdTuples(res), NULL, 10) == 1 ? 0 : hook_missing_or_stale(h, w->id, w->owner);
}

typedef struct Remove {
        const char *id, *owner;
} Remove;

static int remove_tx(PgConn *c, void *userdata) {
        const Remove *a = userdata;
        PgParams p = { 0 };
        pgp_text(&p, a->id);
        pgp_text(&p, a->owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c, "DELETE FROM webhooks WHERE id = $1 AND owner = $2", &p, &res);
        if (r < 0)
                return r;
        if (strtoll(PQcmdTuples(res), NULL, 10) == 0)
                return -ENOENT;
        p = (PgParams){ 0 };
        pgp_text(&p, a->id);
        return pgdb_exec_locked(c, "DELETE FROM webhook_deliveries WHERE webhook_id = $1", &p);
}

static int pg_webhooks_remove(StoreWebhooks *h, const char *id, const char *owner) {
        Remove a = { .id = id, .owner = owner };
        return pgdb_transaction(&h->c, remove_tx, &a);
}

/* ---- deliveries ---- */

#define DELIVERY_COLUMNS                                                                                      \
        "seq, id, webhook_id, owner, event_id, event_type, body, state, attempts, next_at, response_status, " \
        "last_error, claimed_by, claimed_until, created_at, updated_at"

static int walk_deliveries(const PGresult *res, StoreDeliveryFn fn, void *userdata, bool one) {
        int n = PQntuples(res);
        if (one && n == 0)
                return -ENOENT;
        for (int i = 0; i < n && fn; i++) {
                DeliveryRecord d = { .seq = pgi(res, i, 0), .webhook_id = pgv(res, i, 2), .owner = pgv(res, i, 3),
                                     .event_id = pgv(res, i, 4), .event_type = pgv(res, i, 5), .body = pgv(res, i, 6),
                                     .state = pgv(res, i, 7), .attempts = (int)pgi(res, i, 8),
                                     .next_at = pgi(res, i, 9), .response_status = (int)pgi(res, i, 10),
                                     .last_error = pgv(res, i, 11), .claimed_by = pgv(res, i, 12),
                                     .claimed_until = pgi(res, i, 13), .created_at = pgi(res, i, 14),
                                     .updated_at = pgi(res, i, 15) };
                snprintf(d.id, sizeof d.id, "%s", pgv(res, i, 1) ?: "");
                int r = fn(userdata, &d);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int insert_delivery(PgConn *c, const DeliveryRecord *d, bool locked) {
        PgParams p = { 0 };
        pgp_text(&p, d->id);
        pgp_text(&p, d->webhook_id);
        pgp_text(&p, d->owner);
        pgp_text(&p, d->event_id);
        pgp_text(&p, d->event_type);
        pgp_text(&p, d->body);
        pgp_text(&p, d->state ? d->state : "pending");
        pgp_int(&p, d->attempts);
        pgp_int(&p, d->next_at);
        pgp_int(&p, d->response_status);
        pgp_text(&p, opt(d->last_error));
        pgp_int(&p, d->created_at);
        pgp_int(&p, d->updated_at);
        static const char sql[] = "INSERT INTO webhook_deliveries (id, webhook_id, owner, event_id, event_type, body, "
                                  "state, attempts, next_at, response_status, last_error, created_at, updated_at) "
                                  "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";
        return locked ? pgdb_exec_locked(c, sql, &p) : pgdb_exec(c, sql, &p);
}

typedef struct Batch {
        const DeliveryRecord *d;
        size_t n;
} Batch;

static int enqueue_tx(PgConn *c, void *userdata) {
        const Batch *b = userdata;
        int r = 0;
        for (size_t i = 0; r == 0 && i < b->n; i++)
                r = insert_delivery(c, &b->d[i], true);
        return r;
}

static int pg_webhooks_set_writer(StoreWebhooks *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int pg_webhooks_enqueue(StoreWebhooks *h, const DeliveryRecord *d, size_t n) {
        if (n == 0)
                return 0;
        Batch b = { .d = d, .n = n };
        return pgdb_write(&h->c, enqueue_tx, &b);
}

static int pg_webhooks_claim(StoreWebhooks *h, const char *host, int64_t now, int64_t until, unsigned max,
                             const char *const *skip, size_t n_skip, StoreDeliveryFn fn, void *userdata) {
        char cond[DELIVERY_CLAIM_SKIP_MAX * 8 + 32], sql[2048];
        if (n_skip > DELIVERY_CLAIM_SKIP_MAX || !store_not_in(cond, sizeof cond, "owner", '$', 7, n_skip))
                return -E2BIG;
        PgParams p = { 0 };
        pgp_text(&p, host);
        pgp_int(&p, until);
        pgp_int(&p, now);
        pgp_int(&p, max);
        char writer[64];
        pgp_conn_writer(&p, &h->c, writer);
        for (size_t i = 0; i < n_skip; i++)
                pgp_text(&p, skip[i]);
        /* READ COMMITTED: a row another host claimed and committed meanwhile
         * is checked again after its lock and left; one it holds is skipped.
         * The owner is the one of the oldest due row this statement could
         * lock, which it keeps. A host no longer at its epoch claims
         * nothing. */
        snprintf(sql, sizeof sql,
                 "UPDATE webhook_deliveries SET claimed_by = $1, claimed_until = $2, updated_at = $3 WHERE id IN ("
                 " SELECT id FROM webhook_deliveries WHERE state = 'pending' AND next_at <= $3"
                 " AND claimed_until < $3 AND owner = (SELECT owner FROM webhook_deliveries"
                 " WHERE state = 'pending' AND next_at <= $3 AND claimed_until < $3%s"
                 " ORDER BY next_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED)"
                 " ORDER BY next_at, seq LIMIT $4 FOR UPDATE SKIP LOCKED) "
                 "AND " WRITER_LIVE("$5", "$6") " RETURNING " DELIVERY_COLUMNS,
                 cond);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, sql, &p, &res);
        return r < 0 ? r : walk_deliveries(res, fn, userdata, false);
}

static int pg_webhooks_claim_one(StoreWebhooks *h, const char *id, const char *owner, const char *host, int64_t now,
                                 int64_t until, StoreDeliveryFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, host);
        pgp_int(&p, until);
        pgp_text(&p, id);
        pgp_text(&p, opt(owner));
        pgp_int(&p, now);
        char writer[64];
        pgp_conn_writer(&p, &h->c, writer);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "UPDATE webhook_deliveries SET claimed_by = $1, claimed_until = $2, updated_at = $5 WHERE id = $3 "
                         "AND ($4::text IS NULL OR owner = $4) "
                         "AND NOT (coalesce(claimed_by, '') <> '' AND claimed_until >= $5) "
                         "AND " WRITER_LIVE("$6", "$7") " RETURNING " DELIVERY_COLUMNS,
                         &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 1)
                return walk_deliveries(res, fn, userdata, true);
        /* Nothing claimed: held by another attempt, or not there. */
        PgParams q = { 0 };
        pgp_text(&q, id);
        pgp_text(&q, opt(owner));
        _cleanup_pgres_ PGresult *there = NULL;
        r = pgdb_run(&h->c, "SELECT 1 FROM webhook_deliveries WHERE id = $1 AND ($2::text IS NULL OR owner = $2)", &q,
                     &there);
        return r < 0 ? r : PQntuples(there) ? -EBUSY : -ENOENT;
}

static int pg_webhooks_finish(StoreWebhooks *h, const DeliveryRecord *d) {
        PgParams p = { 0 };
        pgp_text(&p, d->state);
        pgp_int(&p, d->attempts);
        pgp_int(&p, d->next_at);
        pgp_int(&p, d->response_status);
        pgp_text(&p, opt(d->last_error));
        pgp_int(&p, d->updated_at);
        pgp_text(&p, d->id);
        pgp_text(&p, d->claimed_by ? d->claimed_by : "");
        char writer[64];
        pgp_conn_writer(&p, &h->c, writer);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "UPDATE webhook_deliveries SET state = $1, attempts = $2, next_at = $3, response_status = $4, "
                         "last_error = $5, updated_at = $6, claimed_by = NULL, claimed_until = 0 "
                         "WHERE id = $7 AND claimed_by = $8 AND " WRITER_LIVE("$9", "$10"),
                         &p, &res);
        if (r < 0)
                return r;
        return strtoll(PQcmdTuples(res), NULL, 10) == 1 ? 0 : -ESTALE;
}

static int pg_webhooks_get_delivery(StoreWebhooks *h, const char *id, const char *owner, StoreDeliveryFn fn,
                                    void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, opt(owner));
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " DELIVERY_COLUMNS " FROM webhook_deliveries WHERE id = $1 "
                         "AND ($2::text IS NULL OR owner = $2)",
                         &p, &res);
        return r < 0 ? r : walk_deliveries(res, fn, userdata, true);
}

static int pg_webhooks_deliveries(StoreWebhooks *h, const DeliveryFilter *f, StoreDeliveryFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, f->webhook_id);
        pgp_text(&p, opt(f->state));
        pgp_int(&p, f->before);
        pgp_int(&p, f->limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " DELIVERY_COLUMNS " FROM webhook_deliveries WHERE webhook_id = $1 "
                         "AND ($2::text IS NULL OR state = $2) AND ($3::bigint = 0 OR seq < $3) "
                         "ORDER BY seq DESC LIMIT $4",
                         &p, &res);
        return r < 0 ? r : walk_deliveries(res, fn, userdata, false);
}

static int pg_webhooks_prune(StoreWebhooks *h, int64_t before, int64_t *ret_n) {
        return pgdb_delete_before(&h->c, "DELETE FROM webhook_deliveries WHERE state <> 'pending' AND updated_at < $1",
                                  before, ret_n);
}

const StoreWebhookOps store_postgres_webhooks = {
        .open = pg_webhooks_open,
        .close = pg_webhooks_close,
        .put = pg_webhooks_put,
        .get = pg_webhooks_get,
        .list = pg_webhooks_list,
        .update = pg_webhooks_update,
        .remove = pg_webhooks_remove,
        .set_writer = pg_webhooks_set_writer,
        .enqueue = pg_webhooks_enqueue,
        .claim = pg_webhooks_claim,
        .claim_one = pg_webhooks_claim_one,
        .finish = pg_webhooks_finish,
        .get_delivery = pg_webhooks_get_delivery,
        .deliveries = pg_webhooks_deliveries,
        .prune = pg_webhooks_prune,
};
