/* The API answers counted per key and hour in PostgreSQL
 * (store_requests.h): the SQLite backend's statements in PostgreSQL's
 * words; an add is an upsert, atomic for every host. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_requests.h"

struct StoreRequests {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_requests_open(const char *location, StoreRequests **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_requests_close(StoreRequests *h) {
        pgdb_handle_close(h);
}

typedef struct Batch {
        const RequestCount *c;
        size_t n;
} Batch;

static int add_tx(PgConn *c, void *userdata) {
        const Batch *b = userdata;
        for (size_t i = 0; i < b->n; i++) {
                PgParams p = { 0 };
                pgp_text(&p, b->c[i].owner);
                pgp_text(&p, b->c[i].key_id);
                pgp_int(&p, b->c[i].hour);
                pgp_int(&p, b->c[i].requests);
                pgp_int(&p, b->c[i].client_errors);
                pgp_int(&p, b->c[i].server_errors);
                int r = pgdb_exec_locked(c,
                                         "INSERT INTO request_counts (owner, key_id, hour, requests, client_errors, "
                                         "server_errors) VALUES ($1, $2, $3, $4, $5, $6) "
                                         "ON CONFLICT (owner, hour, key_id) DO UPDATE SET "
                                         "requests = request_counts.requests + EXCLUDED.requests, "
                                         "client_errors = request_counts.client_errors + EXCLUDED.client_errors, "
                                         "server_errors = request_counts.server_errors + EXCLUDED.server_errors",
                                         &p);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int pg_requests_set_writer(StoreRequests *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int pg_requests_add(StoreRequests *h, const RequestCount *c, size_t n) {
        if (n == 0)
                return 0;
        Batch b = { .c = c, .n = n };
        return pgdb_write(&h->c, add_tx, &b);
}

static int pg_requests_list(StoreRequests *h, const char *owner, int64_t since, StoreRequestFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_int(&p, since);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT key_id, hour, requests, client_errors, server_errors FROM request_counts "
                         "WHERE owner = $1 AND hour >= $2 ORDER BY hour, key_id",
                         &p, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++) {
                RequestCount c = { .owner = owner, .key_id = pgv(res, i, 0), .hour = pgi(res, i, 1),
                                   .requests = pgi(res, i, 2), .client_errors = pgi(res, i, 3),
                                   .server_errors = pgi(res, i, 4) };
                if ((r = fn(userdata, &c)) < 0)
                        return r;
        }
        return 0;
}

static int pg_requests_prune(StoreRequests *h, int64_t before, int64_t *ret_n) {
        return pgdb_delete_before(&h->c, "DELETE FROM request_counts WHERE hour < $1", before, ret_n);
}

const StoreRequestOps store_postgres_requests = {
        .open = pg_requests_open,
        .close = pg_requests_close,
        .set_writer = pg_requests_set_writer,
        .add = pg_requests_add,
        .list = pg_requests_list,
        .prune = pg_requests_prune,
};
