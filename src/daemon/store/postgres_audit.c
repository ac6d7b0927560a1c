/* The audit trail in PostgreSQL (store_audit.h): the SQLite backend's
 * statements in PostgreSQL's words; seq, a serial, the cursor. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_audit.h"

struct StoreAudit {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_audit_open(const char *location, StoreAudit **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_audit_close(StoreAudit *h) {
        pgdb_handle_close(h);
}

static const char *opt(const char *v) {
        return v && *v ? v : NULL;
}

static int insert_one(PgConn *c, const AuditRecord *a, bool locked) {
        PgParams p = { 0 };
        pgp_text(&p, a->id);
        pgp_text(&p, a->owner);
        pgp_text(&p, a->action);
        pgp_text(&p, opt(a->key_id));
        pgp_text(&p, opt(a->method));
        pgp_text(&p, opt(a->path));
        pgp_text(&p, opt(a->sandbox_id));
        pgp_text(&p, opt(a->detail));
        pgp_int(&p, a->status);
        pgp_text(&p, opt(a->client));
        pgp_text(&p, opt(a->request_id));
        pgp_text(&p, a->host_id ? a->host_id : "");
        pgp_int(&p, a->at);
        static const char sql[] =
                "INSERT INTO audit (id, owner, action, key_id, method, path, sandbox_id, detail, status, client, "
                "request_id, host_id, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";
        return locked ? pgdb_exec_locked(c, sql, &p) : pgdb_exec(c, sql, &p);
}

typedef struct Batch {
        const AuditRecord *a;
        size_t n;
} Batch;

static int append_tx(PgConn *c, void *userdata) {
        const Batch *b = userdata;
        int r = 0;
        for (size_t i = 0; r == 0 && i < b->n; i++)
                r = insert_one(c, &b->a[i], true);
        return r;
}

static int pg_audit_set_writer(StoreAudit *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int pg_audit_append(StoreAudit *h, const AuditRecord *a, size_t n) {
        Batch b = { .a = a, .n = n };
        return n ? pgdb_write(&h->c, append_tx, &b) : 0;
}

static int pg_audit_list(StoreAudit *h, const AuditFilter *f, StoreAuditFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, opt(f->owner));
        pgp_text(&p, opt(f->action));
        pgp_int(&p, f->before);
        pgp_int(&p, f->limit);
        pgp_text(&p, opt(f->sandbox_id));
        _cleanup_pgres_ PGresult *res = NULL;
        /* $2 an action, or a group when it ends in '.': a prefix compared as
         * text (left), so that no character of it is a pattern. */
        int r = pgdb_run(&h->c,
                         "SELECT seq, id, owner, action, key_id, method, path, sandbox_id, detail, status, client, "
                         "request_id, host_id, at FROM audit WHERE ($1::text IS NULL OR owner = $1) "
                         "AND ($2::text IS NULL OR (right($2, 1) = '.' AND left(action, length($2)) = $2) OR action = $2) "
                         "AND ($3::bigint = 0 OR seq < $3) AND ($5::text IS NULL OR sandbox_id = $5) "
                         "ORDER BY seq DESC LIMIT $4",
                         &p, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++) {
                AuditRecord a = { .seq = pgi(res, i, 0), .owner = pgv(res, i, 2), .action = pgv(res, i, 3),
                                  .key_id = pgv(res, i, 4), .method = pgv(res, i, 5), .path = pgv(res, i, 6),
                                  .sandbox_id = pgv(res, i, 7), .detail = pgv(res, i, 8), .status = (int)pgi(res, i, 9),
                                  .client = pgv(res, i, 10), .request_id = pgv(res, i, 11), .host_id = pgv(res, i, 12),
                                  .at = pgi(res, i, 13) };
                snprintf(a.id, sizeof a.id, "%s", pgv(res, i, 1) ?: "");
                if ((r = fn(userdata, &a)) < 0)
                        return r;
        }
        return 0;
}

static int pg_audit_prune(StoreAudit *h, int64_t before, int64_t *ret_n) {
        return pgdb_delete_before(&h->c, "DELETE FROM audit WHERE at < $1", before, ret_n);
}

const StoreAuditOps store_postgres_audit = {
        .open = pg_audit_open,
        .close = pg_audit_close,
        .set_writer = pg_audit_set_writer,
        .append = pg_audit_append,
        .list = pg_audit_list,
        .prune = pg_audit_prune,
};
