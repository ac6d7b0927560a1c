/* The snapshots in PostgreSQL (store_snapshots.h): the SQLite backend's
 * statements in PostgreSQL's words. The insert with its owner's usage and
 * the conditional update with its read back are each one serializable
 * transaction, run again when another host's write came between. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store_snapshots.h"

struct StoreSnapshots {
        PgConn c;
};

/* Records a client may see: the spec says whether a snapshot is transient
 * (sqlite_snapshots.c says why it is not a column). */
#define NOT_TRANSIENT "(spec::jsonb ->> '" SNAPSHOT_TRANSIENT "') IS NULL"
/* A build's layer, said by its spec as a transient one is. */
#define NOT_LAYER "(spec::jsonb ->> '" SNAPSHOT_LAYER "') IS NULL"
#define VISIBLE NOT_TRANSIENT " AND " NOT_LAYER
/* The last, whether it is a layer, as 1 or 0 (pgi reads it). */
#define COLUMNS                                                                                             \
        "id, owner, key_id, sandbox_id, name, labels, spec, mode, size_bytes, created_at, expires_at, version, " \
        "host_id, (NOT " NOT_LAYER ")::int"

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_snapshots_open(const char *location, StoreSnapshots **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_snapshots_close(StoreSnapshots *h) {
        pgdb_handle_close(h);
}

static char *dup_col(const PGresult *res, int i, int col) {
        const char *t = pgv(res, i, col);
        return t ? strdup(t) : NULL;
}

/* Row i of COLUMNS. */
static int read_row(const PGresult *res, int i, SnapshotRow *ret) {
        SnapshotRow r = { 0 };
        snprintf(r.id, sizeof r.id, "%s", pgv(res, i, 0) ?: "");
        r.owner = dup_col(res, i, 1);
        r.key_id = dup_col(res, i, 2);
        r.sandbox_id = dup_col(res, i, 3);
        r.name = dup_col(res, i, 4);
        r.labels = dup_col(res, i, 5);
        r.spec = dup_col(res, i, 6);
        snprintf(r.mode, sizeof r.mode, "%s", pgv(res, i, 7) ?: "disk");
        snprintf(r.state, sizeof r.state, "ready");
        r.size_bytes = pgi(res, i, 8);
        r.created_at = pgi(res, i, 9);
        r.expires_at = pgi(res, i, 10);
        r.version = (uint64_t)pgi(res, i, 11);
        snprintf(r.host_id, sizeof r.host_id, "%s", pgv(res, i, 12) ?: "");
        r.layer = pgi(res, i, 13) != 0;
        if (!r.owner || !r.key_id || !r.sandbox_id || !r.labels || !r.spec || (!pgnull(res, i, 4) && !r.name)) {
                store_snapshot_row_clear(&r);
                return -ENOMEM;
        }
        *ret = r;
        return 0;
}

static int usage_run(PgConn *c, bool locked, const char *owner, StoreSnapshotUsage *ret) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        _cleanup_pgres_ PGresult *res = NULL;
        /* sum() of a bigint is a numeric: cast back, as the column is. */
        static const char sql[] =
                "SELECT count(*), coalesce(sum(size_bytes), 0)::bigint FROM snapshots WHERE owner = $1 AND " NOT_LAYER;
        int r = locked ? pgdb_run_locked(c, sql, &p, &res) : pgdb_run(c, sql, &p, &res);
        if (r < 0)
                return r;
        *ret = (StoreSnapshotUsage){ .count = pgi(res, 0, 0), .bytes = pgi(res, 0, 1) };
        return 0;
}

typedef struct Insert {
        const SnapshotRow *row;
        unsigned max_per_owner;
        int64_t max_bytes_per_owner;
} Insert;

static int insert_tx(PgConn *c, void *userdata) {
        const Insert *a = userdata;
        const SnapshotRow *s = a->row;
        StoreSnapshotUsage u;
        int r = s->layer ? 0 : usage_run(c, true, s->owner, &u);
        if (r < 0)
                return r;
        if (!s->layer && (r = store_snapshot_fits(&u, s, a->max_per_owner, a->max_bytes_per_owner)) < 0)
                return r;
        PgParams p = { 0 };
        pgp_text(&p, s->id);
        pgp_text(&p, s->owner);
        pgp_text(&p, s->key_id);
        pgp_text(&p, s->sandbox_id);
        pgp_text(&p, s->name);
        pgp_text(&p, s->labels);
        pgp_text(&p, s->spec);
        pgp_text(&p, s->mode);
        pgp_int(&p, s->size_bytes);
        pgp_int(&p, s->created_at);
        pgp_int(&p, s->expires_at);
        pgp_text(&p, s->host_id);
        return pgdb_exec_locked(c,
                                "INSERT INTO snapshots (id, owner, key_id, sandbox_id, name, labels, spec, mode, "
                                "size_bytes, created_at, expires_at, version, host_id) "
                                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 1, $12)",
                                &p);
}

static int pg_snapshots_set_writer(StoreSnapshots *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int pg_snapshots_insert(StoreSnapshots *h, const SnapshotRow *row, unsigned max_per_owner,
                               int64_t max_bytes_per_owner) {
        Insert a = { .row = row, .max_per_owner = max_per_owner, .max_bytes_per_owner = max_bytes_per_owner };
        return pgdb_write(&h->c, insert_tx, &a);
}

/* One row by id: of owner and neither transient nor a layer, or (owner
 * NULL) any. */
static int get_run(PgConn *c, bool locked, const char *owner, const char *id, SnapshotRow *ret) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        if (owner)
                pgp_text(&p, owner);
        const char *sql = owner ? "SELECT " COLUMNS " FROM snapshots WHERE id = $1 AND owner = $2 AND " VISIBLE
                                : "SELECT " COLUMNS " FROM snapshots WHERE id = $1";
        _cleanup_pgres_ PGresult *res = NULL;
        int r = locked ? pgdb_run_locked(c, sql, &p, &res) : pgdb_run(c, sql, &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        return read_row(res, 0, ret);
}

static int pg_snapshots_get(StoreSnapshots *h, const char *owner, const char *id, SnapshotRow *ret) {
        if (!owner)
                return -ENOENT;
        return get_run(&h->c, false, owner, id, ret);
}

static int pg_snapshots_get_any(StoreSnapshots *h, const char *id, SnapshotRow *ret) {
        return get_run(&h->c, false, NULL, id, ret);
}

static int pg_snapshots_list(StoreSnapshots *h, const StoreSnapshotFilter *f, SnapshotRow **ret, size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, f->owner);
        pgp_text(&p, f->sandbox_id);
        pgp_text(&p, f->name);
        pgp_int(&p, f->cursor_at);
        pgp_text(&p, f->cursor_id);
        pgp_int(&p, f->limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " COLUMNS " FROM snapshots WHERE owner = $1 AND " VISIBLE " "
                         "AND ($2::text IS NULL OR sandbox_id = $2) AND ($3::text IS NULL OR name = $3) "
                         "AND ($5::text IS NULL OR created_at > $4::bigint "
                         "OR (created_at = $4::bigint AND id > $5)) "
                         "ORDER BY created_at, id LIMIT $6",
                         &p, &res);
        if (r < 0)
                return r;
        size_t n = (size_t)PQntuples(res);
        if (n > f->limit)
                n = f->limit;
        SnapshotRow *rows = calloc(n ? n : 1, sizeof(*rows));
        if (!rows)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                if ((r = read_row(res, (int)i, &rows[i])) < 0) {
                        for (size_t j = 0; j < i; j++)
                                store_snapshot_row_clear(&rows[j]);
                        free(rows);
                        return r;
                }
        *ret = rows;
        *ret_n = n;
        return 0;
}

typedef struct Update {
        const char *owner, *id;
        uint64_t version;
        const StoreSnapshotChange *change;
        SnapshotRow out;
} Update;

static int update_tx(PgConn *c, void *userdata) {
        Update *a = userdata;
        const StoreSnapshotChange *ch = a->change;
        PgParams p = { 0 };
        pgp_text(&p, a->id);
        pgp_text(&p, a->owner);
        pgp_bool(&p, ch->set_name);
        pgp_text(&p, ch->name);
        pgp_text(&p, ch->labels);
        pgp_int(&p, ch->expires_at);
        pgp_int(&p, (int64_t)a->version);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c,
                                "UPDATE snapshots SET name = CASE WHEN $3::boolean THEN $4::text ELSE name END, "
                                "labels = coalesce($5::text, labels), "
                                "expires_at = CASE WHEN $6::bigint > 0 THEN $6::bigint ELSE expires_at END, "
                                "version = version + 1 "
                                "WHERE id = $1 AND owner = $2 AND ($7::bigint = 0 OR version = $7::bigint) "
                                "AND " VISIBLE " RETURNING " COLUMNS,
                                &p, &res);
        if (r < 0)
                return r;
        store_snapshot_row_clear(&a->out); /* from a try that was run again */
        if (PQntuples(res) > 0)
                return read_row(res, 0, &a->out);
        /* Nothing changed: the row is gone (or not owner's) or has moved on
         * from the version the caller read. */
        SnapshotRow row = { 0 };
        r = get_run(c, true, a->owner, a->id, &row);
        store_snapshot_row_clear(&row);
        return r == 0 ? -ESTALE : r;
}

static int pg_snapshots_update(StoreSnapshots *h, const char *owner, const char *id, uint64_t version,
                               const StoreSnapshotChange *c, SnapshotRow *ret) {
        if (!owner)
                return -ENOENT;
        Update a = { .owner = owner, .id = id, .version = version, .change = c };
        int r = pgdb_write(&h->c, update_tx, &a);
        if (r < 0) {
                store_snapshot_row_clear(&a.out);
                return r;
        }
        *ret = a.out;
        return 0;
}

static int pg_snapshots_delete(StoreSnapshots *h, const char *owner, const char *id) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, owner);
        int64_t n = 0;
        int r = pgdb_exec_write(&h->c, "DELETE FROM snapshots WHERE id = $1 AND ($2::text IS NULL OR owner = $2)", &p,
                                &n);
        if (r < 0)
                return r;
        return n == 0 ? -ENOENT : 0;
}

static int pg_snapshots_usage(StoreSnapshots *h, const char *owner, StoreSnapshotUsage *ret) {
        return usage_run(&h->c, false, owner, ret);
}

#define OF_HOST "($2::text IS NULL OR host_id IN ($2, ''))"
static int pg_snapshots_ids(StoreSnapshots *h, StoreSnapshotIds which, const char *host, int64_t now, size_t max,
                            char (**ret)[SNAPSHOT_ID_LEN + 1], size_t *ret_n) {
        /* $1 the bound; $2 the host; $3, for the expired ones, `now`. */
        static const char *const queries[] = {
                [STORE_SNAPSHOT_IDS_ALL] = "SELECT id FROM snapshots WHERE " OF_HOST " ORDER BY id LIMIT $1",
                [STORE_SNAPSHOT_IDS_TRANSIENT] = "SELECT id FROM snapshots WHERE NOT " NOT_TRANSIENT " AND " OF_HOST
                                                 " ORDER BY id LIMIT $1",
                [STORE_SNAPSHOT_IDS_EXPIRED] = "SELECT id FROM snapshots WHERE expires_at > 0 AND expires_at <= $3 "
                                               "AND " OF_HOST " ORDER BY expires_at, id LIMIT $1",
        };
        if ((size_t)which >= ELEMENTSOF(queries))
                return -EINVAL;
        PgParams p = { 0 };
        pgp_int(&p, max > INT64_MAX ? INT64_MAX : (int64_t)max);
        pgp_text(&p, host);
        if (which == STORE_SNAPSHOT_IDS_EXPIRED)
                pgp_int(&p, now);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, queries[which], &p, &res);
        if (r < 0)
                return r;
        size_t n = (size_t)PQntuples(res);
        char(*ids)[SNAPSHOT_ID_LEN + 1] = calloc(n ? n : 1, sizeof(*ids));
        if (!ids)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                snprintf(ids[i], sizeof ids[0], "%s", pgv(res, (int)i, 0) ?: "");
        *ret = ids;
        *ret_n = n;
        return 0;
}

const StoreSnapshotOps store_postgres_snapshots = {
        .open = pg_snapshots_open,
        .close = pg_snapshots_close,
        .insert = pg_snapshots_insert,
        .set_writer = pg_snapshots_set_writer,
        .get = pg_snapshots_get,
        .get_any = pg_snapshots_get_any,
        .list = pg_snapshots_list,
        .update = pg_snapshots_update,
        .delete = pg_snapshots_delete,
        .usage = pg_snapshots_usage,
        .ids = pg_snapshots_ids,
};
