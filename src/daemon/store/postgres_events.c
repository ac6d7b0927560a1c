/* The events in PostgreSQL (store_events.h): the SQLite backend's
 * statements in PostgreSQL's words; seq, a serial, the cursor. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_events.h"

struct StoreEvents {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_events_open(const char *location, StoreEvents **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_events_close(StoreEvents *h) {
        pgdb_handle_close(h);
}

static const char *opt(const char *v) {
        return v && *v ? v : NULL;
}

static int pg_events_set_writer(StoreEvents *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int pg_events_append(StoreEvents *h, const EventRecord *e) {
        PgParams p = { 0 };
        pgp_text(&p, e->id);
        pgp_text(&p, e->owner);
        pgp_text(&p, e->type);
        pgp_text(&p, e->resource_type);
        pgp_text(&p, e->resource_id);
        pgp_text(&p, opt(e->key_id));
        pgp_text(&p, e->host_id ? e->host_id : "");
        pgp_text(&p, opt(e->data));
        pgp_int(&p, e->at);
        return pgdb_exec_write(&h->c,
                               "INSERT INTO events (id, owner, type, resource_type, resource_id, key_id, host_id, data, "
                               "at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                               &p, NULL);
}

static int pg_events_list(StoreEvents *h, const EventFilter *f, StoreEventFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, opt(f->owner));
        pgp_text(&p, opt(f->resource_id));
        pgp_text(&p, opt(f->type));
        pgp_int(&p, f->before);
        pgp_int(&p, f->limit);
        pgp_bool(&p, f->oldest_first);
        pgp_int(&p, f->after);
        pgp_int(&p, f->until);
        _cleanup_pgres_ PGresult *res = NULL;
        /* $3 a type, or a group when it ends in '.': a prefix compared as
         * text (left), so that no character of it is a pattern. */
        int r = pgdb_run(&h->c,
                         "SELECT seq, id, owner, type, resource_type, resource_id, key_id, host_id, data, at "
                         "FROM events WHERE ($1::text IS NULL OR owner = $1) AND ($2::text IS NULL OR resource_id = $2) "
                         "AND ($3::text IS NULL OR (right($3, 1) = '.' AND left(type, length($3)) = $3) OR type = $3) "
                         "AND ($6::boolean OR $4::bigint = 0 OR seq < $4) AND (NOT $6::boolean OR seq > $7) "
                         "AND ($8::bigint = 0 OR at <= $8) ORDER BY CASE WHEN $6::boolean THEN seq ELSE -seq END LIMIT $5",
                         &p, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++) {
                EventRecord e = { .seq = pgi(res, i, 0), .owner = pgv(res, i, 2), .type = pgv(res, i, 3),
                                  .resource_type = pgv(res, i, 4), .resource_id = pgv(res, i, 5),
                                  .key_id = pgv(res, i, 6), .host_id = pgv(res, i, 7), .data = pgv(res, i, 8),
                                  .at = pgi(res, i, 9) };
                snprintf(e.id, sizeof e.id, "%s", pgv(res, i, 1) ?: "");
                if ((r = fn(userdata, &e)) < 0)
                        return r;
        }
        return 0;
}

static int pg_events_prune(StoreEvents *h, int64_t before, int64_t *ret_n) {
        return pgdb_delete_before(&h->c, "DELETE FROM events WHERE at < $1", before, ret_n);
}

const StoreEventOps store_postgres_events = {
        .open = pg_events_open,
        .close = pg_events_close,
        .set_writer = pg_events_set_writer,
        .append = pg_events_append,
        .list = pg_events_list,
        .prune = pg_events_prune,
};
