/* The sandboxes' resource readings in PostgreSQL (store_samples.h): the
 * SQLite backend's statements in PostgreSQL's words. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_samples.h"

struct StoreSamples {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_samples_open(const char *location, StoreSamples **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_samples_close(StoreSamples *h) {
        pgdb_handle_close(h);
}

static int insert_sample(PgConn *c, const SampleRecord *s) {
        PgParams p = { 0 };
        pgp_text(&p, s->sandbox_id);
        pgp_text(&p, s->owner);
        pgp_int(&p, s->at);
        pgp_int(&p, s->interval_ms);
        pgp_int(&p, s->cpu_ns);
        pgp_int(&p, s->memory_bytes);
        pgp_int(&p, s->disk_bytes);
        pgp_int(&p, s->net_in_bytes);
        pgp_int(&p, s->net_out_bytes);
        return pgdb_exec_locked(c,
                                "INSERT INTO sandbox_samples (sandbox_id, owner, at, interval_ms, cpu_ns, memory_bytes, "
                                "disk_bytes, net_in_bytes, net_out_bytes) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                                &p);
}

typedef struct Batch {
        const SampleRecord *s;
        size_t n;
} Batch;

static int append_tx(PgConn *c, void *userdata) {
        const Batch *b = userdata;
        int r = 0;
        for (size_t i = 0; r == 0 && i < b->n; i++)
                r = insert_sample(c, &b->s[i]);
        return r;
}

static int pg_samples_set_writer(StoreSamples *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int pg_samples_append(StoreSamples *h, const SampleRecord *s, size_t n) {
        if (n == 0)
                return 0;
        Batch b = { .s = s, .n = n };
        return pgdb_write(&h->c, append_tx, &b);
}

static int walk_steps(PGresult *res, StoreSampleFn fn, void *userdata, bool one) {
        int rows = PQntuples(res);
        if (one && rows == 0)
                return -ENOENT;
        for (int i = 0; i < rows; i++) {
                SampleStep s = { .at = pgi(res, i, 0), .n = pgi(res, i, 1), .interval_ms = pgi(res, i, 2),
                                 .cpu_ns = pgi(res, i, 3), .memory_bytes = pgi(res, i, 4), .disk_bytes = pgi(res, i, 5),
                                 .net_in_bytes = pgi(res, i, 6), .net_out_bytes = pgi(res, i, 7) };
                int r = fn(userdata, &s);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int pg_samples_series(StoreSamples *h, const char *sandbox_id, int64_t since, int64_t step, StoreSampleFn fn,
                             void *userdata) {
        if (step < 1)
                return -EINVAL;
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        pgp_int(&p, since);
        pgp_int(&p, step);
        _cleanup_pgres_ PGresult *res = NULL;
        /* Integer division of non-negative bigints: the step's start, as SQLite's. */
        int r = pgdb_run(&h->c,
                         "SELECT (at / $3) * $3 AS b, count(*), sum(interval_ms), sum(cpu_ns), max(memory_bytes), "
                         "max(disk_bytes), sum(net_in_bytes), sum(net_out_bytes) FROM sandbox_samples "
                         "WHERE sandbox_id = $1 AND at >= $2 GROUP BY b ORDER BY b",
                         &p, &res);
        return r < 0 ? r : walk_steps(res, fn, userdata, false);
}

static int pg_samples_latest(StoreSamples *h, const char *sandbox_id, StoreSampleFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT at, 1, interval_ms, cpu_ns, memory_bytes, disk_bytes, net_in_bytes, net_out_bytes "
                         "FROM sandbox_samples WHERE sandbox_id = $1 ORDER BY at DESC, seq DESC LIMIT 1",
                         &p, &res);
        return r < 0 ? r : walk_steps(res, fn, userdata, true);
}

static int pg_samples_readings(StoreSamples *h, const char *owner, int64_t after, int64_t until, unsigned limit,
                               StoreReadingFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_int(&p, after);
        pgp_int(&p, until);
        pgp_int(&p, limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT sandbox_id, at, interval_ms, cpu_ns, memory_bytes, disk_bytes, net_in_bytes, "
                         "net_out_bytes FROM sandbox_samples WHERE owner = $1 AND at > $2 AND at <= $3 "
                         "ORDER BY at, sandbox_id LIMIT $4",
                         &p, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++) {
                SampleRecord s = { .sandbox_id = pgv(res, i, 0), .owner = owner, .at = pgi(res, i, 1),
                                   .interval_ms = pgi(res, i, 2), .cpu_ns = pgi(res, i, 3),
                                   .memory_bytes = pgi(res, i, 4), .disk_bytes = pgi(res, i, 5),
                                   .net_in_bytes = pgi(res, i, 6), .net_out_bytes = pgi(res, i, 7) };
                if ((r = fn(userdata, &s)) < 0)
                        return r;
        }
        return 0;
}

static int pg_samples_prune(StoreSamples *h, int64_t before, int64_t *ret_n) {
        return pgdb_delete_before(&h->c, "DELETE FROM sandbox_samples WHERE at < $1", before, ret_n);
}

const StoreSampleOps store_postgres_samples = {
        .open = pg_samples_open,
        .close = pg_samples_close,
        .set_writer = pg_samples_set_writer,
        .append = pg_samples_append,
        .series = pg_samples_series,
        .latest = pg_samples_latest,
        .readings = pg_samples_readings,
        .prune = pg_samples_prune,
};
