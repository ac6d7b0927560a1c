/* The sandboxes' resource readings in the SQLite backend (store_samples.h):
 * one table, read by sandbox and time. */
#include "daemon/store/store_samples.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreSamples {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The samples table's history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS sandbox_samples ("
          "  sandbox_id TEXT NOT NULL,"
          "  owner TEXT NOT NULL,"
          "  at INTEGER NOT NULL,"
          "  interval_ms INTEGER NOT NULL,"
          "  cpu_ns INTEGER NOT NULL,"
          "  memory_bytes INTEGER NOT NULL,"
          "  disk_bytes INTEGER NOT NULL,"
          "  net_in_bytes INTEGER NOT NULL,"
          "  net_out_bytes INTEGER NOT NULL);"
          "CREATE INDEX IF NOT EXISTS sandbox_samples_sandbox ON sandbox_samples (sandbox_id, at);"
          "CREATE INDEX IF NOT EXISTS sandbox_samples_at ON sandbox_samples (at);"
          "CREATE INDEX IF NOT EXISTS sandbox_samples_owner ON sandbox_samples (owner, at);" },
};

static int sqlite_samples_open(const char *location, StoreSamples **ret) {
        return sqldb_handle_open(location, "samples", migrations, ELEMENTSOF(migrations), sizeof(**ret),
                                 (void **)ret);
}

static void sqlite_samples_close(StoreSamples *h) {
        sqldb_handle_close(h);
}

typedef struct Batch {
        StoreSamples *h;
        const SampleRecord *s;
        size_t n;
} Batch;

static int append_all(void *userdata) {
        const Batch *b = userdata;
        StoreSamples *h = b->h;
        const SampleRecord *s = b->s;
        size_t n = b->n;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO sandbox_samples (sandbox_id, owner, at, interval_ms, cpu_ns, memory_bytes, "
                               "disk_bytes, net_in_bytes, net_out_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        for (size_t i = 0; i < n; i++) {
                sqlite3_reset(st);
                sqlite3_bind_text(st, 1, s[i].sandbox_id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, s[i].owner, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 3, s[i].at);
                sqlite3_bind_int64(st, 4, s[i].interval_ms);
                sqlite3_bind_int64(st, 5, s[i].cpu_ns);
                sqlite3_bind_int64(st, 6, s[i].memory_bytes);
                sqlite3_bind_int64(st, 7, s[i].disk_bytes);
                sqlite3_bind_int64(st, 8, s[i].net_in_bytes);
                sqlite3_bind_int64(st, 9, s[i].net_out_bytes);
                int r = sqldb_errno(sqlite3_step(st));
                if (r < 0)
                        return r;
        }
        return 0;
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_samples_set_writer(StoreSamples *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int sqlite_samples_append(StoreSamples *h, const SampleRecord *s, size_t n) {
        if (n == 0)
                return 0;
        LOCKED(h);
        Batch b = { .h = h, .s = s, .n = n };
        return sqldb_transaction(h->sql, append_all, &b);
}

static int walk_steps(sqlite3_stmt *st, StoreSampleFn fn, void *userdata, bool one) {
        int rc, r = 0;
        bool any = false;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                SampleStep s = { .at = sqlite3_column_int64(st, 0), .n = sqlite3_column_int64(st, 1),
                                 .interval_ms = sqlite3_column_int64(st, 2), .cpu_ns = sqlite3_column_int64(st, 3),
                                 .memory_bytes = sqlite3_column_int64(st, 4), .disk_bytes = sqlite3_column_int64(st, 5),
                                 .net_in_bytes = sqlite3_column_int64(st, 6), .net_out_bytes = sqlite3_column_int64(st, 7) };
                any = true;
                r = fn(userdata, &s);
        }
        if (r < 0)
                return r;
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        return one && !any ? -ENOENT : 0;
}

static int sqlite_samples_series(StoreSamples *h, const char *sandbox_id, int64_t since, int64_t step,
                                 StoreSampleFn fn, void *userdata) {
        if (step < 1)
                return -EINVAL;
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT (at / ?3) * ?3 AS b, count(*), sum(interval_ms), sum(cpu_ns), max(memory_bytes), "
                               "max(disk_bytes), sum(net_in_bytes), sum(net_out_bytes) FROM sandbox_samples "
                               "WHERE sandbox_id = ?1 AND at >= ?2 GROUP BY b ORDER BY b",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, since);
        sqlite3_bind_int64(st, 3, step);
        return walk_steps(st, fn, userdata, false);
}

static int sqlite_samples_latest(StoreSamples *h, const char *sandbox_id, StoreSampleFn fn, void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT at, 1, interval_ms, cpu_ns, memory_bytes, disk_bytes, net_in_bytes, net_out_bytes "
                               "FROM sandbox_samples WHERE sandbox_id = ? ORDER BY at DESC, rowid DESC LIMIT 1",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
        return walk_steps(st, fn, userdata, true);
}

static int sqlite_samples_readings(StoreSamples *h, const char *owner, int64_t after, int64_t until, unsigned limit,
                                   StoreReadingFn fn, void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT sandbox_id, at, interval_ms, cpu_ns, memory_bytes, disk_bytes, net_in_bytes, "
                               "net_out_bytes FROM sandbox_samples WHERE owner = ? AND at > ? AND at <= ? "
                               "ORDER BY at, sandbox_id LIMIT ?",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, after);
        sqlite3_bind_int64(st, 3, until);
        sqlite3_bind_int64(st, 4, limit);
        int rc, r = 0;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                SampleRecord s = { .sandbox_id = sqldb_col(st, 0), .owner = owner, .at = sqlite3_column_int64(st, 1),
                                   .interval_ms = sqlite3_column_int64(st, 2), .cpu_ns = sqlite3_column_int64(st, 3),
                                   .memory_bytes = sqlite3_column_int64(st, 4), .disk_bytes = sqlite3_column_int64(st, 5),
                                   .net_in_bytes = sqlite3_column_int64(st, 6),
                                   .net_out_bytes = sqlite3_column_int64(st, 7) };
                r = fn(userdata, &s);
        }
        if (r < 0)
                return r;
        return rc == SQLITE_DONE ? 0 : (sqldb_errno(rc) ?: -EIO);
}

static int sqlite_samples_prune(StoreSamples *h, int64_t before, int64_t *ret_n) {
        LOCKED(h);
        return sqldb_delete_before(h->sql, "DELETE FROM sandbox_samples WHERE at < ?", before, ret_n);
}

const StoreSampleOps store_sqlite_samples = {
        .open = sqlite_samples_open,
        .close = sqlite_samples_close,
        .set_writer = sqlite_samples_set_writer,
        .append = sqlite_samples_append,
        .series = sqlite_samples_series,
        .latest = sqlite_samples_latest,
        .readings = sqlite_samples_readings,
        .prune = sqlite_samples_prune,
};
