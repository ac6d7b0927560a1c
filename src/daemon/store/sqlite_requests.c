/* The API answers counted per key and hour in the SQLite backend
 * (store_requests.h): one table, an add an upsert. */
#include "daemon/store/store_requests.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreRequests {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The request counts' history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS request_counts ("
          "  owner TEXT NOT NULL,"
          "  key_id TEXT NOT NULL,"
          "  hour INTEGER NOT NULL,"
          "  requests INTEGER NOT NULL,"
          "  client_errors INTEGER NOT NULL,"
          "  server_errors INTEGER NOT NULL,"
          "  PRIMARY KEY (owner, hour, key_id));"
          "CREATE INDEX IF NOT EXISTS request_counts_hour ON request_counts (hour);" },
};

static int sqlite_requests_open(const char *location, StoreRequests **ret) {
        return sqldb_handle_open(location, "requests", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_requests_close(StoreRequests *h) {
        sqldb_handle_close(h);
}

typedef struct Batch {
        StoreRequests *h;
        const RequestCount *c;
        size_t n;
} Batch;

static int add_all(void *userdata) {
        const Batch *b = userdata;
        StoreRequests *h = b->h;
        const RequestCount *c = b->c;
        size_t n = b->n;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO request_counts (owner, key_id, hour, requests, client_errors, server_errors) "
                               "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, hour, key_id) DO UPDATE SET "
                               "requests = requests + excluded.requests, "
                               "client_errors = client_errors + excluded.client_errors, "
                               "server_errors = server_errors + excluded.server_errors",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        for (size_t i = 0; i < n; i++) {
                sqlite3_reset(st);
                sqlite3_bind_text(st, 1, c[i].owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, c[i].key_id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 3, c[i].hour);
                sqlite3_bind_int64(st, 4, c[i].requests);
                sqlite3_bind_int64(st, 5, c[i].client_errors);
                sqlite3_bind_int64(st, 6, c[i].server_errors);
                int r = sqldb_errno(sqlite3_step(st));
                if (r < 0)
                        return r;
        }
        return 0;
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_requests_set_writer(StoreRequests *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int sqlite_requests_add(StoreRequests *h, const RequestCount *c, size_t n) {
        if (n == 0)
                return 0;
        LOCKED(h);
        Batch b = { .h = h, .c = c, .n = n };
        return sqldb_transaction(h->sql, add_all, &b);
}

static int sqlite_requests_list(StoreRequests *h, const char *owner, int64_t since, StoreRequestFn fn,
                                void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT key_id, hour, requests, client_errors, server_errors FROM request_counts "
                               "WHERE owner = ? AND hour >= ? ORDER BY hour, key_id",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, since);
        int rc, r = 0;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                RequestCount c = { .owner = owner, .key_id = sqldb_col(st, 0), .hour = sqlite3_column_int64(st, 1),
                                   .requests = sqlite3_column_int64(st, 2),
                                   .client_errors = sqlite3_column_int64(st, 3),
                                   .server_errors = sqlite3_column_int64(st, 4) };
                r = fn(userdata, &c);
        }
        if (r < 0)
                return r;
        return rc == SQLITE_DONE ? 0 : (sqldb_errno(rc) ?: -EIO);
}

static int sqlite_requests_prune(StoreRequests *h, int64_t before, int64_t *ret_n) {
        LOCKED(h);
        return sqldb_delete_before(h->sql, "DELETE FROM request_counts WHERE hour < ?", before, ret_n);
}

const StoreRequestOps store_sqlite_requests = {
        .open = sqlite_requests_open,
        .close = sqlite_requests_close,
        .set_writer = sqlite_requests_set_writer,
        .add = sqlite_requests_add,
        .list = sqlite_requests_list,
        .prune = sqlite_requests_prune,
};
