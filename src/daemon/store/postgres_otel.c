/* The owners' OpenTelemetry exports in PostgreSQL (store_otel.h): the
 * SQLite backend's statements in PostgreSQL's words. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_otel.h"

struct StoreOtel {
        PgConn c;
};

#define OTEL_COLUMNS                                                                                          \
        "id, owner, created_at, version, endpoint, headers, signals, enabled, updated_at, events_after, "    \
        "metrics_after, next_at, claimed_by, claimed_until, last_push_at, last_status, last_error, sent_logs, " \
        "sent_points, dropped"

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_otel_open(const char *location, StoreOtel **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_otel_close(StoreOtel *h) {
        pgdb_handle_close(h);
}

static const char *opt(const char *v) {
        return v && *v ? v : NULL;
}

/* The fields every write sets, as $n.. in OTEL_COLUMNS' order from endpoint. */
static void params_fields(PgParams *p, const OtelExportRecord *x) {
        pgp_text(p, x->endpoint);
        pgp_text(p, opt(x->headers));
        pgp_text(p, x->signals);
        pgp_int(p, x->enabled ? 1 : 0);
        pgp_int(p, x->updated_at);
        pgp_int(p, x->events_after);
        pgp_int(p, x->metrics_after);
        pgp_int(p, x->next_at);
        pgp_text(p, opt(x->claimed_by));
        pgp_int(p, x->claimed_until);
        pgp_int(p, x->last_push_at);
        pgp_int(p, x->last_status);
        pgp_text(p, opt(x->last_error));
        pgp_int(p, x->sent_logs);
        pgp_int(p, x->sent_points);
        pgp_int(p, x->dropped);
}

static int walk(PGresult *res, StoreOtelFn fn, void *userdata, bool one) {
        int rows = PQntuples(res);
        if (one && rows == 0)
                return -ENOENT;
        for (int i = 0; i < rows; i++) {
                OtelExportRecord x = { .owner = pgv(res, i, 1), .created_at = pgi(res, i, 2), .version = pgi(res, i, 3),
                                       .endpoint = pgv(res, i, 4), .headers = pgv(res, i, 5), .signals = pgv(res, i, 6),
                                       .enabled = pgi(res, i, 7) != 0, .updated_at = pgi(res, i, 8),
                                       .events_after = pgi(res, i, 9), .metrics_after = pgi(res, i, 10),
                                       .next_at = pgi(res, i, 11), .claimed_by = pgv(res, i, 12),
                                       .claimed_until = pgi(res, i, 13), .last_push_at = pgi(res, i, 14),
                                       .last_status = (int)pgi(res, i, 15), .last_error = pgv(res, i, 16),
                                       .sent_logs = pgi(res, i, 17), .sent_points = pgi(res, i, 18),
                                       .dropped = pgi(res, i, 19) };
                snprintf(x.id, sizeof x.id, "%s", pgv(res, i, 0) ?: "");
                int r = fn(userdata, &x);
                if (r < 0)
                        return r;
        }
        return 0;
}

typedef struct Put {
        const OtelExportRecord *x;
        unsigned max;
} Put;

static int put_tx(PgConn *c, void *userdata) {
        const Put *a = userdata;
        PgParams p = { 0 };
        pgp_text(&p, a->x->owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c, "SELECT count(*) FROM otel_exports WHERE owner = $1", &p, &res);
        if (r < 0)
                return r;
        if (a->max > 0 && pgi(res, 0, 0) >= (int64_t)a->max)
                return -EDQUOT;
        p = (PgParams){ 0 };
        pgp_text(&p, a->x->id);
        pgp_text(&p, a->x->owner);
        pgp_int(&p, a->x->created_at);
        params_fields(&p, a->x);
        return pgdb_exec_locked(c,
                                "INSERT INTO otel_exports (" OTEL_COLUMNS ") VALUES ($1, $2, $3, 1, $4, $5, $6, $7, $8, "
                                "$9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
                                &p);
}

static int pg_otel_put(StoreOtel *h, const OtelExportRecord *x, unsigned max_per_owner) {
        if (!x->owner || !x->endpoint || !x->signals)
                return -EINVAL;
        Put a = { .x = x, .max = max_per_owner };
        return pgdb_transaction(&h->c, put_tx, &a);
}

static int pg_otel_get(StoreOtel *h, const char *id, const char *owner, StoreOtelFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, opt(owner));
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " OTEL_COLUMNS " FROM otel_exports WHERE id = $1 AND ($2::text IS NULL OR owner = $2)",
                         &p, &res);
        return r < 0 ? r : walk(res, fn, userdata, true);
}

static int pg_otel_list(StoreOtel *h, const char *owner, StoreOtelFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, opt(owner));
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " OTEL_COLUMNS " FROM otel_exports WHERE ($1::text IS NULL OR owner = $1) "
                         "ORDER BY created_at, id",
                         &p, &res);
        return r < 0 ? r : walk(res, fn, userdata, false);
}

static int pg_otel_update(StoreOtel *h, const OtelExportRecord *x) {
        PgParams p = { 0 };
        params_fields(&p, x);
        pgp_text(&p, x->id);
        pgp_text(&p, x->owner);
        pgp_int(&p, x->version);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "UPDATE otel_exports SET endpoint = $1, headers = $2, signals = $3, enabled = $4, "
                         "updated_at = $5, events_after = $6, metrics_after = $7, next_at = $8, claimed_by = $9, "
                         "claimed_until = $10, last_push_at = $11, last_status = $12, last_error = $13, "
                         "sent_logs = $14, sent_points = $15, dropped = $16, version = version + 1 "
                         "WHERE id = $17 AND owner = $18 AND version = $19",
                         &p, &res);
        if (r < 0)
                return r;
        if (strtoll(PQcmdTuples(res), NULL, 10) == 1)
                return 0;
        PgParams q = { 0 };
        pgp_text(&q, x->id);
        pgp_text(&q, x->owner);
        _cleanup_pgres_ PGresult *found = NULL;
        r = pgdb_run(&h->c, "SELECT 1 FROM otel_exports WHERE id = $1 AND owner = $2", &q, &found);
        return r < 0 ? r : PQntuples(found) ? -ESTALE : -ENOENT;
}

static int pg_otel_remove(StoreOtel *h, const char *id, const char *owner) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "DELETE FROM otel_exports WHERE id = $1 AND owner = $2", &p, &res);
        if (r < 0)
                return r;
        return strtoll(PQcmdTuples(res), NULL, 10) == 1 ? 0 : -ENOENT;
}

const StoreOtelOps store_postgres_otel = {
        .open = pg_otel_open,
        .close = pg_otel_close,
        .put = pg_otel_put,
        .get = pg_otel_get,
        .list = pg_otel_list,
        .update = pg_otel_update,
        .remove = pg_otel_remove,
};
