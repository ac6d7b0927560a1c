/* The sandboxes and the Idempotency-Key records in PostgreSQL
 * (store_sandboxes.h): the SQLite backend's statements in PostgreSQL's
 * words. A write that checks before it writes (the insert under the limits,
 * a claim) is one serializable transaction, run again when another host's
 * write came between; a conditional update is one statement. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store_sandboxes.h"

struct StoreSandboxes {
        PgConn c;
        char writer[64]; /* set_writer's host; "" until then */
        int64_t writer_epoch;
};

/* Every write of a writer's is made under WRITER_LIVE (pgdb.h) with the
 * writer and its epoch (set_writer). */

static void pgp_writer(PgParams *p, const StoreSandboxes *h) {
        pgp_text(p, h->writer[0] ? h->writer : NULL);
        pgp_int(p, h->writer_epoch);
}

/* Unlike the SQLite backend, open leaves pending claims alone: in a shared
 * database a pending claim may be a request another host is serving now. */
/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_sandboxes_open(const char *location, StoreSandboxes **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_sandboxes_close(StoreSandboxes *h) {
        pgdb_handle_close(h);
}

static int64_t affected(const PGresult *res) {
        return strtoll(PQcmdTuples((PGresult *)res), NULL, 10);
}

/* The undeleted sandboxes of an owner, or (owner NULL) of a host. */
static int count_locked(PgConn *c, const char *owner, const char *host_id, int64_t *ret) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, host_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c,
                                "SELECT count(*) FROM sandboxes WHERE deleted_at IS NULL "
                                "AND ($1::text IS NULL OR owner = $1) AND ($1::text IS NOT NULL OR host_id = $2)",
                                &p, &res);
        if (r < 0)
                return r;
        *ret = pgi(res, 0, 0);
        return 0;
}

typedef struct Insert {
        const StoreSandboxes *h;
        const SandboxRow *row;
        const char *spec;
        unsigned max_total, max_owner;
} Insert;

static int insert_tx(PgConn *c, void *userdata) {
        const Insert *a = userdata;
        const SandboxRow *s = a->row;
        int64_t total, mine;
        int r;
        /* The host's bound counts its own sandboxes; an owner's, the fleet's. */
        if ((r = count_locked(c, NULL, s->host_id, &total)) < 0 || (r = count_locked(c, s->owner, NULL, &mine)) < 0)
                return r;
        if (total >= (int64_t)a->max_total)
                return -EUSERS;
        if (mine >= (int64_t)a->max_owner)
                return -EDQUOT;
        PgParams p = { 0 };
        pgp_text(&p, s->id);
        pgp_text(&p, s->owner);
        pgp_text(&p, s->key_id);
        pgp_text(&p, s->name);
        pgp_text(&p, s->labels);
        pgp_text(&p, a->spec);
        pgp_text(&p, sandbox_state_name(s->state));
        pgp_int(&p, s->created_at);
        pgp_opt_int(&p, s->lease_ends_at);
        pgp_text(&p, s->run_as_root ? "root" : "sandbox");
        pgp_int(&p, SANDBOX_SPEC_VERSION);
        pgp_text(&p, s->host_id);
        pgp_writer(&p, a->h);
        pgp_int(&p, s->created_msec);
        _cleanup_pgres_ PGresult *res = NULL;
        if ((r = pgdb_run_locked(c,
                                 "INSERT INTO sandboxes (id, owner, key_id, name, labels, spec, state, created_at, "
                                 "lease_ends_at, run_as, spec_version, version, host_id, created_msec) "
                                 "SELECT $1, $2, $3, $4, $5, $6, $7, $8::bigint, $9::bigint, $10, $11::bigint, 1, $12, "
                                 "$15::integer WHERE " WRITER_LIVE("$13", "$14"),
                                 &p, &res)) < 0)
                return r;
        return affected(res) == 1 ? 0 : -EOWNERDEAD;
}

static int pg_sandboxes_insert(StoreSandboxes *h, SandboxRow *row, unsigned max_total, unsigned max_owner) {
        _cleanup_free_ char *spec = sandbox_spec_encode(&row->spec);
        if (!spec)
                return -ENOMEM;
        Insert a = { .h = h, .row = row, .spec = spec, .max_total = max_total, .max_owner = max_owner };
        int r = pgdb_transaction(&h->c, insert_tx, &a);
        if (r < 0)
                return r;
        row->version = 1;
        return 0;
}

/* One statement: the write, conditional on the version the caller read,
 * and whether the row is there at all (to tell -ESTALE from -ENOENT). */
static int pg_sandboxes_update(StoreSandboxes *h, SandboxRow *row) {
        _cleanup_free_ char *spec = sandbox_spec_encode(&row->spec);
        if (!spec)
                return -ENOMEM;
        PgParams p = { 0 };
        pgp_text(&p, spec);
        pgp_text(&p, sandbox_state_name(row->state));
        pgp_text(&p, row->failure_reason);
        pgp_opt_int(&p, row->started_at);
        pgp_opt_int(&p, row->stopped_at);
        pgp_opt_int(&p, row->lease_ends_at);
        pgp_int(&p, row->run_seconds);
        pgp_opt_int(&p, row->deleted_at);
        pgp_text(&p, row->run_as_root ? "root" : "sandbox");
        pgp_int(&p, SANDBOX_SPEC_VERSION);
        pgp_text(&p, row->id);
        pgp_int(&p, row->version);
        pgp_writer(&p, h);
        pgp_int(&p, row->started_at ? row->started_msec : 0);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "WITH u AS (UPDATE sandboxes SET spec = $1, state = $2, failure_reason = $3, "
                         "started_at = $4, stopped_at = $5, lease_ends_at = $6, run_seconds = $7, deleted_at = $8, "
                         "run_as = $9, spec_version = $10, started_msec = $15::integer, version = version + 1 "
                         "WHERE id = $11 AND version = $12 AND " WRITER_LIVE("$13", "$14") " RETURNING 1) "
                         "SELECT (SELECT count(*) FROM u), EXISTS (SELECT 1 FROM sandboxes WHERE id = $11), "
                         WRITER_LIVE("$13", "$14"),
                         &p, &res);
        if (r < 0)
                return r;
        if (pgi(res, 0, 0) == 1) {
                row->version++;
                return 0;
        }
        const char *live = pgv(res, 0, 2), *found = pgv(res, 0, 1);
        if (!live || strcmp(live, "t") != 0)
                return -EOWNERDEAD;
        return found && strcmp(found, "t") == 0 ? -ESTALE : -ENOENT;
}

static int pg_sandboxes_set_meta(StoreSandboxes *h, const char *id, const char *name, const char *labels) {
        PgParams p = { 0 };
        pgp_text(&p, name);
        pgp_text(&p, labels);
        pgp_text(&p, id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "UPDATE sandboxes SET name = $1, labels = $2 WHERE id = $3 AND deleted_at IS NULL", &p,
                         &res);
        if (r < 0)
                return r;
        return affected(res) == 1 ? 0 : -ENOENT;
}

#define ROW_COLUMNS                                                                                         \
        "id, owner, key_id, name, labels, spec, state, failure_reason, created_at, started_at, stopped_at, " \
        "lease_ends_at, run_seconds, deleted_at, run_as, spec_version, version, host_id, created_msec, "    \
        "started_msec"

static char *dup_col(const PGresult *res, int i, int col) {
        const char *t = pgv(res, i, col);
        return t ? strdup(t) : NULL;
}

/* Row i of ROW_COLUMNS; -EBADMSG or -EPROTONOSUPPORT (why in err) when its
 * spec or state cannot be read. */
static int read_row(const PGresult *res, int i, SandboxRow *r, char *err, size_t err_len) {
        *r = (SandboxRow){ 0 };
        snprintf(r->id, sizeof(r->id), "%s", pgv(res, i, 0) ?: "");
        r->owner = dup_col(res, i, 1);
        r->key_id = dup_col(res, i, 2);
        r->name = dup_col(res, i, 3);
        r->labels = dup_col(res, i, 4);
        r->failure_reason = dup_col(res, i, 7);
        r->created_at = pgi(res, i, 8);
        r->started_at = pgi(res, i, 9);
        r->stopped_at = pgi(res, i, 10);
        r->lease_ends_at = pgi(res, i, 11);
        r->run_seconds = pgi(res, i, 12);
        r->deleted_at = pgi(res, i, 13);
        const char *run_as = pgv(res, i, 14);
        r->run_as_root = run_as && strcmp(run_as, "root") == 0;
        r->version = pgi(res, i, 16);
        snprintf(r->host_id, sizeof(r->host_id), "%s", pgv(res, i, 17) ?: "");
        r->created_msec = (int)pgi(res, i, 18);
        r->started_msec = (int)pgi(res, i, 19);
        if (!r->owner || !r->key_id || !r->labels || (!pgnull(res, i, 3) && !r->name) ||
            (!pgnull(res, i, 7) && !r->failure_reason)) {
                sandbox_row_done(r);
                return -ENOMEM;
        }
        const char *state = pgv(res, i, 6);
        if (sandbox_state_from_name(state, &r->state) < 0) {
                snprintf(err, err_len, "its state \"%.32s\" is none this daemon knows", state ? state : "");
                sandbox_row_done(r);
                return -EBADMSG;
        }
        int rc = sandbox_spec_decode(pgv(res, i, 5), pgi(res, i, 15), &r->spec, err, err_len);
        if (rc < 0) {
                sandbox_row_done(r);
                return rc;
        }
        return 0;
}

static int pg_sandboxes_get(StoreSandboxes *h, const char *id, SandboxRow *ret) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT " ROW_COLUMNS " FROM sandboxes WHERE id = $1 AND deleted_at IS NULL", &p,
                         &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        char why[256];
        return read_row(res, 0, ret, why, sizeof(why));
}

static int pg_sandboxes_query(StoreSandboxes *h, StoreSandboxQuery q, const char *scope, int64_t now,
                              StoreSandboxFn fn, void *userdata) {
        PgParams p = { 0 };
        const char *sql;
        switch (q) {
        case STORE_SANDBOXES_OF_OWNER:
                sql = "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL AND owner = $1 "
                      "ORDER BY created_at DESC, created_msec DESC, id COLLATE \"C\" DESC";
                pgp_text(&p, scope);
                break;
        case STORE_SANDBOXES_ACTIVE:
                sql = "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL "
                      "AND ($1::text IS NULL OR host_id = $1) "
                      "AND state IN ('starting', 'running', 'pausing', 'paused', 'resuming', 'stopping')";
                pgp_text(&p, scope);
                break;
        case STORE_SANDBOXES_LEASE_DUE:
                /* A running sandbox whose lease is over, or one of any state
                 * that is to be deleted at lease end. */
                sql = "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL "
                      "AND ($1::text IS NULL OR host_id = $1) "
                      "AND lease_ends_at IS NOT NULL AND lease_ends_at <= $2 "
                      "AND (state = 'running' OR (state != 'starting' AND "
                      "(spec::jsonb ->> 'onLeaseEnd') = 'delete'))";
                pgp_text(&p, scope);
                pgp_int(&p, now);
                break;
        case STORE_SANDBOXES_LOST:
                sql = "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL "
                      "AND ($1::text IS NULL OR host_id = $1) AND state = 'lost'";
                pgp_text(&p, scope);
                break;
        default:
                return -EINVAL;
        }
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, sql, &p, &res);
        if (r < 0)
                return r;
        /* Every row read before fn runs: a row that cannot be read fails
         * the query before any is acted on, as in the SQLite backend. */
        int n = PQntuples(res);
        SandboxRow *rows = calloc(n > 0 ? (size_t)n : 1, sizeof(*rows));
        if (!rows)
                return -ENOMEM;
        int got = 0;
        for (; got < n; got++) {
                char why[256];
                if ((r = read_row(res, got, &rows[got], why, sizeof(why))) < 0)
                        break;
        }
        for (int i = 0; i < got; i++) {
                if (r == 0)
                        r = fn(userdata, &rows[i]);
                sandbox_row_done(&rows[i]);
        }
        free(rows);
        return r < 0 ? r : 0;
}

static int pg_sandboxes_state_counts(StoreSandboxes *h, StoreStateCountFn fn, void *userdata) {
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT state, count(*) FROM sandboxes WHERE deleted_at IS NULL GROUP BY state",
                         NULL, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++) {
                SandboxState state;
                if (sandbox_state_from_name(pgv(res, i, 0), &state) == 0)
                        fn(userdata, state, pgi(res, i, 1));
        }
        return 0;
}

static int pg_sandboxes_check(StoreSandboxes *h, StoreBadRowFn bad, void *userdata) {
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL", NULL, &res);
        if (r < 0)
                return r;
        int n = 0;
        for (int i = 0; i < PQntuples(res); i++) {
                SandboxRow row;
                char why[256] = "";
                if ((r = read_row(res, i, &row, why, sizeof(why))) == -ENOMEM)
                        return r;
                if (r < 0) {
                        bad(userdata, pgv(res, i, 0) ?: "", r, why);
                        n++;
                } else
                        sandbox_row_done(&row);
        }
        return n;
}

/* ---- Idempotency-Key records ---- */

static int idem_trim_locked(PgConn *c, const char *owner, int64_t now) {
        PgParams age = { 0 };
        pgp_int(&age, now - STORE_IDEM_MAX_AGE_SECONDS);
        int r = pgdb_exec_locked(c, "DELETE FROM idempotency WHERE created_at < $1", &age);
        if (r < 0)
                return r;
        /* Per owner, so one owner's flood of keys never pushes out another's. */
        PgParams count = { 0 };
        pgp_text(&count, owner);
        pgp_int(&count, STORE_IDEM_MAX_PER_OWNER - 1); /* and the one about to be added */
        return pgdb_exec_locked(c,
                                "DELETE FROM idempotency WHERE owner = $1 AND seq IN (SELECT seq FROM idempotency "
                                "WHERE owner = $1 ORDER BY created_at DESC, seq DESC OFFSET $2)",
                                &count);
}

/* The transaction's outcome is kept here, not returned: a transaction's
 * non-negative return is its COMMIT's. */
typedef struct Claim {
        const char *owner, *key, *hash, *host_id;
        int64_t now;
        StoreIdem outcome;
        unsigned status;
        char *body;
} Claim;

static int claim_tx(PgConn *c, void *userdata) {
        Claim *a = userdata;
        PgParams p = { 0 };
        pgp_text(&p, a->owner);
        pgp_text(&p, a->key);
        pgp_int(&p, a->now - STORE_IDEM_MAX_AGE_SECONDS);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c,
                                "SELECT hash, status, body FROM idempotency WHERE owner = $1 AND key = $2 "
                                "AND created_at >= $3",
                                &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) > 0) {
                const char *hash = pgv(res, 0, 0);
                int64_t status = pgi(res, 0, 1);
                if (!hash || strcmp(hash, a->hash) != 0)
                        a->outcome = STORE_IDEM_MISMATCH;
                else if (status == 0)
                        a->outcome = STORE_IDEM_PENDING;
                else {
                        free(a->body); /* from a try that was run again */
                        a->body = strdup(pgv(res, 0, 2) ?: "");
                        if (!a->body)
                                return -ENOMEM;
                        a->status = (unsigned)status;
                        a->outcome = STORE_IDEM_REPLAY;
                }
                return 0;
        }
        /* Only a new record grows the table: the bounds are kept here (an
         * aged record of this key goes too, before the insert). */
        if ((r = idem_trim_locked(c, a->owner, a->now)) < 0)
                return r;
        PgParams put = { 0 };
        pgp_text(&put, a->owner);
        pgp_text(&put, a->key);
        pgp_text(&put, a->hash);
        pgp_int(&put, a->now);
        pgp_text(&put, a->host_id);
        if ((r = pgdb_exec_locked(c,
                                  "INSERT INTO idempotency (owner, key, hash, status, created_at, host_id) "
                                  "VALUES ($1, $2, $3, 0, $4, $5)",
                                  &put)) < 0)
                return r;
        a->outcome = STORE_IDEM_CLAIMED;
        return 0;
}

static int pg_sandboxes_idem_claim(StoreSandboxes *h, const char *owner, const char *key, const char *hash,
                                   int64_t now, unsigned *ret_status, char **ret_body) {
        Claim a = { .owner = owner, .key = key, .hash = hash, .host_id = h->writer, .now = now };
        int r = pgdb_transaction(&h->c, claim_tx, &a);
        if (r < 0) {
                free(a.body);
                return r;
        }
        if (a.outcome == STORE_IDEM_REPLAY) {
                *ret_status = a.status;
                *ret_body = a.body;
        } else
                free(a.body);
        return (int)a.outcome;
}

static int pg_sandboxes_idem_finish(StoreSandboxes *h, const char *owner, const char *key, unsigned status,
                                    const char *body) {
        /* A 408 or 429 asks for a retry: never replayed. */
        bool keep = status >= 200 && status < 500 && status != 408 && status != 429 && body &&
                    strlen(body) <= STORE_IDEM_MAX_BODY;
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, key);
        if (keep) {
                pgp_int(&p, status);
                pgp_text(&p, body);
        }
        return pgdb_exec(&h->c,
                         keep ? "UPDATE idempotency SET status = $3, body = $4 WHERE owner = $1 AND key = $2"
                              : "DELETE FROM idempotency WHERE owner = $1 AND key = $2",
                         &p);
}

static int pg_sandboxes_idem_drop_pending(StoreSandboxes *h, const char *host_id) {
        PgParams p = { 0 };
        pgp_text(&p, host_id);
        return pgdb_exec(&h->c, "DELETE FROM idempotency WHERE status = 0 AND host_id IN ($1, '')", &p);
}

static int pg_sandboxes_set_writer(StoreSandboxes *h, const char *host_id, int64_t epoch) {
        if (strlen(host_id) >= sizeof(h->writer))
                return -EINVAL;
        pthread_mutex_lock(&h->c.lock);
        snprintf(h->writer, sizeof(h->writer), "%s", host_id);
        h->writer_epoch = epoch;
        pthread_mutex_unlock(&h->c.lock);
        return 0;
}

static int pg_sandboxes_adopt(StoreSandboxes *h, const char *host_id) {
        PgParams p = { 0 };
        pgp_text(&p, host_id);
        return pgdb_exec(&h->c, "UPDATE sandboxes SET host_id = $1 WHERE host_id = ''", &p);
}

const StoreSandboxOps store_postgres_sandboxes = {
        .open = pg_sandboxes_open,
        .close = pg_sandboxes_close,
        .set_writer = pg_sandboxes_set_writer,
        .adopt = pg_sandboxes_adopt,
        .insert = pg_sandboxes_insert,
        .update = pg_sandboxes_update,
        .set_meta = pg_sandboxes_set_meta,
        .get = pg_sandboxes_get,
        .query = pg_sandboxes_query,
        .state_counts = pg_sandboxes_state_counts,
        .check = pg_sandboxes_check,
        .idem_claim = pg_sandboxes_idem_claim,
        .idem_finish = pg_sandboxes_idem_finish,
        .idem_drop_pending = pg_sandboxes_idem_drop_pending,
};
