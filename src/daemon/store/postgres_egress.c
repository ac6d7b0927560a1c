/* The egress secrets and the egress audit log in PostgreSQL (store_egress.h):
 * the SQLite backend's statements in PostgreSQL's words; each secret's write
 * with its checks (the version, the owner's count) is one serializable
 * transaction, run again when another host's write came between. */
#include "daemon/store/store_egress.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"

struct StoreEgress {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_egress_open(const char *location, StoreEgress **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_egress_close(StoreEgress *h) {
        pgdb_handle_close(h);
}

/* ---- secrets ---- */

#define SECRET_COLUMNS "name, hosts, placeholder, created_at, updated_at, header, format, rules, version, value"

static char *column_dup(const PGresult *res, int row, int col, bool *oom) {
        const char *t = pgv(res, row, col);
        char *s = t ? strdup(t) : NULL;
        if (t && !s)
                *oom = true;
        return s;
}

/* A row of SECRET_COLUMNS. */
static int secret_row(const PGresult *res, int i, bool with_value, StoreEgressSecret *ret) {
        bool oom = false;
        StoreEgressSecret s = {
                .name = column_dup(res, i, 0, &oom),
                .hosts = column_dup(res, i, 1, &oom),
                .placeholder = column_dup(res, i, 2, &oom),
                .created_at = pgi(res, i, 3),
                .updated_at = pgi(res, i, 4),
                .header = column_dup(res, i, 5, &oom),
                .format = column_dup(res, i, 6, &oom),
                .rules = column_dup(res, i, 7, &oom),
                .version = (uint64_t)pgi(res, i, 8),
                .value = with_value ? column_dup(res, i, 9, &oom) : NULL,
        };
        if (oom || !s.name || !s.hosts || !s.placeholder || (with_value && !s.value)) {
                store_egress_secret_done(&s);
                return oom ? -ENOMEM : -EIO;
        }
        *ret = s;
        return 0;
}

/* The current version of a secret (-ENOENT), checked against if_version. */
static int secret_check_version(PgConn *c, const char *owner, const char *name, uint64_t if_version) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, name);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c, "SELECT version FROM egress_secrets WHERE owner = $1 AND name = $2", &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        if (if_version != STORE_EGRESS_ANY_VERSION && (uint64_t)pgi(res, 0, 0) != if_version)
                return -ESTALE;
        return 0;
}

typedef struct SecretPut {
        const char *owner;
        const StoreEgressSecret *in;
        uint64_t if_version;
        unsigned max_per_owner;
        StoreEgressSecret out;
} SecretPut;

static int secret_put_tx(PgConn *c, void *userdata) {
        SecretPut *a = userdata;
        const StoreEgressSecret *in = a->in;
        int r;
        if (a->if_version != STORE_EGRESS_ANY_VERSION &&
            (r = secret_check_version(c, a->owner, in->name, a->if_version)) < 0)
                return r;
        if (a->max_per_owner > 0) {
                PgParams q = { 0 };
                pgp_text(&q, a->owner);
                pgp_text(&q, in->name);
                _cleanup_pgres_ PGresult *count = NULL;
                if ((r = pgdb_run_locked(c, "SELECT count(*) FROM egress_secrets WHERE owner = $1 AND name <> $2", &q,
                                         &count)) < 0)
                        return r;
                if (pgi(count, 0, 0) >= (int64_t)a->max_per_owner)
                        return -EDQUOT;
        }
        PgParams p = { 0 };
        pgp_text(&p, a->owner);
        pgp_text(&p, in->name);
        pgp_text(&p, in->value);
        pgp_text(&p, in->hosts);
        pgp_text(&p, in->placeholder);
        pgp_int(&p, in->updated_at);
        pgp_text(&p, in->header);
        pgp_text(&p, in->format);
        pgp_text(&p, in->rules);
        _cleanup_pgres_ PGresult *res = NULL;
        /* A replace sets every field but the placeholder and created_at:
         * rules or a header left out are cleared, never kept. */
        if ((r = pgdb_run_locked(c,
                                 "INSERT INTO egress_secrets (owner, name, value, hosts, placeholder, created_at, "
                                 "updated_at, header, format, rules, version) "
                                 "VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9, 1) "
                                 "ON CONFLICT (owner, name) DO UPDATE SET value = excluded.value, "
                                 "hosts = excluded.hosts, header = excluded.header, format = excluded.format, "
                                 "rules = excluded.rules, updated_at = excluded.updated_at, "
                                 "version = egress_secrets.version + 1 RETURNING " SECRET_COLUMNS,
                                 &p, &res)) < 0)
                return r;
        /* A COMMIT refused for a conflict runs all of this again. */
        store_egress_secret_done(&a->out);
        return secret_row(res, 0, false, &a->out);
}

static int pg_egress_secret_put(StoreEgress *h, const char *owner, const StoreEgressSecret *in, uint64_t if_version,
                                unsigned max_per_owner, StoreEgressSecret *ret) {
        if (!in->name || !in->value || !in->hosts || !in->placeholder)
                return -EINVAL;
        SecretPut a = { .owner = owner, .in = in, .if_version = if_version, .max_per_owner = max_per_owner };
        int r = pgdb_transaction(&h->c, secret_put_tx, &a);
        if (r < 0) {
                store_egress_secret_done(&a.out);
                return r;
        }
        *ret = a.out;
        return 0;
}

typedef struct SecretRotate {
        const char *owner, *name, *value;
        int64_t now;
        uint64_t if_version;
        StoreEgressSecret out;
} SecretRotate;

static int secret_rotate_tx(PgConn *c, void *userdata) {
        SecretRotate *a = userdata;
        int r = secret_check_version(c, a->owner, a->name, a->if_version);
        if (r < 0)
                return r;
        PgParams p = { 0 };
        pgp_text(&p, a->owner);
        pgp_text(&p, a->name);
        pgp_text(&p, a->value);
        pgp_int(&p, a->now);
        _cleanup_pgres_ PGresult *res = NULL;
        if ((r = pgdb_run_locked(c,
                                 "UPDATE egress_secrets SET value = $3, updated_at = $4, version = version + 1 "
                                 "WHERE owner = $1 AND name = $2 RETURNING " SECRET_COLUMNS,
                                 &p, &res)) < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        store_egress_secret_done(&a->out);
        return secret_row(res, 0, false, &a->out);
}

static int pg_egress_secret_rotate(StoreEgress *h, const char *owner, const char *name, const char *value,
                                   int64_t now, uint64_t if_version, StoreEgressSecret *ret) {
        SecretRotate a = { .owner = owner, .name = name, .value = value, .now = now, .if_version = if_version };
        int r = pgdb_transaction(&h->c, secret_rotate_tx, &a);
        if (r < 0) {
                store_egress_secret_done(&a.out);
                return r;
        }
        *ret = a.out;
        return 0;
}

static int pg_egress_secret_get(StoreEgress *h, const char *owner, const char *name, StoreEgressSecret *ret) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, name);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT " SECRET_COLUMNS " FROM egress_secrets WHERE owner = $1 AND name = $2", &p,
                         &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        return secret_row(res, 0, false, ret);
}

static int pg_egress_secret_list(StoreEgress *h, const char *owner, const char *after, unsigned limit,
                                 bool with_values, StoreEgressSecret **ret, size_t *ret_n, bool *ret_more) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, after ? after : "");
        pgp_opt_int(&p, limit ? (int64_t)limit + 1 : 0); /* NULL: LIMIT ALL */
        _cleanup_pgres_ PGresult *res = NULL;
        /* Names in byte order, as SQLite keeps them, whatever the
         * database's collation: a page's `after` is the last name seen. */
        int r = pgdb_run(&h->c,
                         "SELECT " SECRET_COLUMNS " FROM egress_secrets WHERE owner = $1 "
                         "AND name COLLATE \"C\" > $2 ORDER BY name COLLATE \"C\" LIMIT $3",
                         &p, &res);
        if (r < 0)
                return r;
        size_t rows = (size_t)PQntuples(res);
        bool more = limit && rows > limit;
        size_t n = more ? limit : rows;
        StoreEgressSecret *list = calloc(n ? n : 1, sizeof(*list));
        if (!list)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                if ((r = secret_row(res, (int)i, with_values, &list[i])) < 0) {
                        store_egress_secrets_free(list, i);
                        return r;
                }
        *ret = list;
        *ret_n = n;
        *ret_more = more;
        return 0;
}

typedef struct SecretDelete {
        const char *owner, *name;
        uint64_t if_version;
} SecretDelete;

static int secret_delete_tx(PgConn *c, void *userdata) {
        const SecretDelete *a = userdata;
        int r = secret_check_version(c, a->owner, a->name, a->if_version);
        if (r < 0)
                return r;
        PgParams p = { 0 };
        pgp_text(&p, a->owner);
        pgp_text(&p, a->name);
        return pgdb_exec_locked(c, "DELETE FROM egress_secrets WHERE owner = $1 AND name = $2", &p);
}

static int pg_egress_secret_delete(StoreEgress *h, const char *owner, const char *name, uint64_t if_version) {
        SecretDelete a = { .owner = owner, .name = name, .if_version = if_version };
        return pgdb_transaction(&h->c, secret_delete_tx, &a);
}

/* ---- the audit log ---- */

static int pg_egress_audit_append(StoreEgress *h, const char *sandbox, const char *owner, const StoreEgressAudit *e,
                                  int64_t *ret_id) {
        const EgressRecord *rec = &e->rec;
        PgParams p = { 0 };
        pgp_text(&p, sandbox);
        pgp_int(&p, e->at);
        pgp_text(&p, rec->host);
        pgp_int(&p, rec->port);
        pgp_text(&p, e->kind);
        pgp_int(&p, rec->allowed);
        pgp_text(&p, rec->reason);
        pgp_text(&p, rec->addr[0] ? rec->addr : NULL);
        pgp_int(&p, (int64_t)rec->bytes_out);
        pgp_int(&p, (int64_t)rec->bytes_in);
        pgp_int(&p, rec->intercepted);
        pgp_int(&p, rec->secrets_used);
        pgp_text(&p, rec->rule[0] ? rec->rule : NULL);
        /* An entry still open has neither (a duration of 0 is not NULL). */
        if (e->ended) {
                pgp_int(&p, (int64_t)rec->duration_ms);
                pgp_text(&p, rec->end);
        } else {
                pgp_text(&p, NULL);
                pgp_text(&p, NULL);
        }
        pgp_text(&p, owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "INSERT INTO egress_log (sandbox, at, host, port, kind, allowed, reason, addr, "
                         "bytes_out, bytes_in, intercepted, secrets_used, rule, duration_ms, end_reason, owner) "
                         "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) "
                         "RETURNING id",
                         &p, &res);
        if (r < 0)
                return r;
        if (ret_id)
                *ret_id = pgi(res, 0, 0);
        return 0;
}

static int pg_egress_audit_update(StoreEgress *h, const char *sandbox, int64_t id, const StoreEgressAudit *e) {
        const EgressRecord *rec = &e->rec;
        PgParams p = { 0 };
        pgp_int(&p, id);
        pgp_text(&p, sandbox);
        pgp_int(&p, rec->allowed);
        pgp_text(&p, rec->reason);
        if (e->ended) {
                pgp_int(&p, (int64_t)rec->bytes_out);
                pgp_int(&p, (int64_t)rec->bytes_in);
                pgp_int(&p, rec->intercepted);
                pgp_int(&p, rec->secrets_used);
                pgp_int(&p, (int64_t)rec->duration_ms);
                pgp_text(&p, rec->end);
        }
        const char *sql = e->ended ? "UPDATE egress_log SET allowed = $3, reason = $4, bytes_out = $5, bytes_in = $6, "
                                     "intercepted = $7, secrets_used = $8, duration_ms = $9, end_reason = $10 "
                                     "WHERE id = $1 AND sandbox = $2"
                                   : "UPDATE egress_log SET allowed = $3, reason = $4 WHERE id = $1 AND sandbox = $2";
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, sql, &p, &res);
        if (r < 0)
                return r;
        return strtoll(PQcmdTuples(res), NULL, 10) > 0 ? 0 : -ENOENT;
}

static void column_copy(const PGresult *res, int row, int col, char *buf, size_t len) {
        const char *t = pgv(res, row, col);
        snprintf(buf, len, "%s", t ? t : "");
}

static void audit_row(const PGresult *res, int i, StoreEgressAudit *a) {
        a->at = pgi(res, i, 0);
        column_copy(res, i, 1, a->rec.host, sizeof a->rec.host);
        a->rec.port = (uint16_t)pgi(res, i, 2);
        column_copy(res, i, 3, a->kind, sizeof a->kind);
        a->rec.connect = strcmp(a->kind, "connect") == 0;
        a->rec.allowed = pgi(res, i, 4) != 0;
        column_copy(res, i, 5, a->rec.reason, sizeof a->rec.reason);
        column_copy(res, i, 6, a->rec.addr, sizeof a->rec.addr);
        a->rec.bytes_out = (uint64_t)pgi(res, i, 7);
        a->rec.bytes_in = (uint64_t)pgi(res, i, 8);
        a->rec.intercepted = pgi(res, i, 9) != 0;
        a->rec.secrets_used = (unsigned)pgi(res, i, 10);
        column_copy(res, i, 11, a->rec.rule, sizeof a->rec.rule);
        a->ended = !pgnull(res, i, 13);
        a->rec.duration_ms = (uint64_t)pgi(res, i, 12);
        column_copy(res, i, 13, a->rec.end, sizeof a->rec.end);
}

static int pg_egress_audit_list(StoreEgress *h, const char *sandbox, unsigned limit, StoreEgressAudit **ret,
                                size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox);
        pgp_int(&p, limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT at, host, port, kind, allowed, reason, addr, bytes_out, bytes_in, "
                         "intercepted, secrets_used, rule, duration_ms, end_reason FROM egress_log "
                         "WHERE sandbox = $1 ORDER BY id DESC LIMIT $2",
                         &p, &res);
        if (r < 0)
                return r;
        size_t n = (size_t)PQntuples(res);
        if (n > limit)
                n = limit;
        StoreEgressAudit *list = calloc(n ? n : 1, sizeof(*list));
        if (!list)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                audit_row(res, (int)i, &list[i]);
        *ret = list;
        *ret_n = n;
        return 0;
}

static int pg_egress_audit_prune(StoreEgress *h, const char *sandbox, unsigned keep) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox);
        pgp_int(&p, keep);
        return pgdb_exec(&h->c,
                         "DELETE FROM egress_log WHERE sandbox = $1 AND id <= (SELECT id FROM egress_log "
                         "WHERE sandbox = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)",
                         &p);
}

static int pg_egress_audit_end_open(StoreEgress *h, const char *why) {
        PgParams p = { 0 };
        pgp_text(&p, why);
        return pgdb_exec(&h->c, "UPDATE egress_log SET end_reason = $1 WHERE end_reason IS NULL", &p);
}

const StoreEgressOps store_postgres_egress = {
        .open = pg_egress_open,
        .close = pg_egress_close,
        .secret_put = pg_egress_secret_put,
        .secret_rotate = pg_egress_secret_rotate,
        .secret_get = pg_egress_secret_get,
        .secret_list = pg_egress_secret_list,
        .secret_delete = pg_egress_secret_delete,
        .audit_append = pg_egress_audit_append,
        .audit_update = pg_egress_audit_update,
        .audit_list = pg_egress_audit_list,
        .audit_prune = pg_egress_audit_prune,
        .audit_end_open = pg_egress_audit_end_open,
};
