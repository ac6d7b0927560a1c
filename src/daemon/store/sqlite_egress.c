/* The egress secrets and the egress audit log in the SQLite backend. */
#include "daemon/store/store_egress.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreEgress {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its transactions never interleave */
};

/* ---- the schema, version by version (sqldb_migrate) ---- */

/* Databases from before the versions were kept gained their columns one
 * ad-hoc ALTER TABLE at a time, so one may have any of them: a step that
 * adds a column names it, and is skipped when it is there. */
static const SqlMigration migrations[] = {
        /* 1: the tables as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS egress_secrets ("
          " owner TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, hosts TEXT NOT NULL,"
          " placeholder TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,"
          " PRIMARY KEY (owner, name));"
          "CREATE TABLE IF NOT EXISTS egress_log ("
          " id INTEGER PRIMARY KEY AUTOINCREMENT, sandbox TEXT NOT NULL, at INTEGER NOT NULL,"
          " host TEXT NOT NULL, port INTEGER NOT NULL, kind TEXT NOT NULL, allowed INTEGER NOT NULL,"
          " reason TEXT NOT NULL, addr TEXT, bytes_out INTEGER NOT NULL, bytes_in INTEGER NOT NULL,"
          " intercepted INTEGER NOT NULL, secrets_used INTEGER NOT NULL);"
          "CREATE INDEX IF NOT EXISTS egress_log_by_sandbox ON egress_log (sandbox, id);" },
        /* 2-4: a secret's header, format and rules */
        { "egress_secrets", "header", "ALTER TABLE egress_secrets ADD COLUMN header TEXT" },
        { "egress_secrets", "format", "ALTER TABLE egress_secrets ADD COLUMN format TEXT" },
        { "egress_secrets", "rules", "ALTER TABLE egress_secrets ADD COLUMN rules TEXT" },
        /* 5-6: the rule that decided, and how long the connection was open */
        { "egress_log", "rule", "ALTER TABLE egress_log ADD COLUMN rule TEXT" },
        { "egress_log", "duration_ms", "ALTER TABLE egress_log ADD COLUMN duration_ms INTEGER" },
        /* 7: why it ended. Entries from before the column were written when
         * their connection ended; since then one is written at the decision
         * and ended later (end_reason NULL while open). */
        { "egress_log", "end_reason",
          "ALTER TABLE egress_log ADD COLUMN end_reason TEXT;"
          "UPDATE egress_log SET end_reason = 'closed' WHERE end_reason IS NULL;" },
        /* 8: a secret's version, for conditional writes */
        { "egress_secrets", "version", "ALTER TABLE egress_secrets ADD COLUMN version INTEGER NOT NULL DEFAULT 1" },
        /* 9: the owner of an entry's sandbox */
        { "egress_log", "owner", "ALTER TABLE egress_log ADD COLUMN owner TEXT" },
};

static int sqlite_egress_open(const char *location, StoreEgress **ret) {
        StoreEgress *h = calloc(1, sizeof(*h));
        if (!h)
                return -ENOMEM;
        int r = sqldb_open(location, &h->sql);
        if (r < 0) {
                free(h);
                return r;
        }
        if ((r = sqldb_migrate(h->sql, "egress", migrations, ELEMENTSOF(migrations))) < 0) {
                sqlite3_close(h->sql);
                free(h);
                return r;
        }
        pthread_mutex_init(&h->lock, NULL);
        *ret = h;
        return 0;
}

static void sqlite_egress_close(StoreEgress *h) {
        sqldb_handle_close(h);
}

/* Ends a transaction begun with BEGIN IMMEDIATE: COMMIT when r is not an
 * error, else ROLLBACK. The statements inside run in functions of their own,
 * so they are finalized before the COMMIT. */
static int transaction_end(StoreEgress *h, int r) {
        if (r >= 0 && (r = sqldb_exec(h->sql, "COMMIT")) >= 0)
                return r;
        (void)sqldb_exec(h->sql, "ROLLBACK");
        return r;
}

static int step_errno(int rc) {
        return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : sqldb_errno(rc) ?: -EIO;
}

/* ---- secrets ---- */

#define SECRET_COLUMNS "name, hosts, placeholder, created_at, updated_at, header, format, rules, version, value"

static char *column_dup(sqlite3_stmt *st, int col, bool *oom) {
        const char *t = (const char *)sqlite3_column_text(st, col);
        char *s = t ? strdup(t) : NULL;
        if (t && !s)
                *oom = true;
        return s;
}

/* A row of SECRET_COLUMNS. */
static int secret_row(sqlite3_stmt *st, bool with_value, StoreEgressSecret *ret) {
        bool oom = false;
        StoreEgressSecret s = {
                .name = column_dup(st, 0, &oom),
                .hosts = column_dup(st, 1, &oom),
                .placeholder = column_dup(st, 2, &oom),
                .created_at = sqlite3_column_int64(st, 3),
                .updated_at = sqlite3_column_int64(st, 4),
                .header = column_dup(st, 5, &oom),
                .format = column_dup(st, 6, &oom),
                .rules = column_dup(st, 7, &oom),
                .version = (uint64_t)sqlite3_column_int64(st, 8),
                .value = with_value ? column_dup(st, 9, &oom) : NULL,
        };
        if (oom || !s.name || !s.hosts || !s.placeholder || (with_value && !s.value)) {
                store_egress_secret_done(&s);
                return oom ? -ENOMEM : -EIO;
        }
        *ret = s;
        return 0;
}

static int secret_query(StoreEgress *h, const char *owner, const char *name, StoreEgressSecret *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT " SECRET_COLUMNS " FROM egress_secrets WHERE owner = ?1 AND name = ?2",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return step_errno(rc);
        return secret_row(st, false, ret);
}

/* The current version of a secret (-ENOENT), checked against if_version. */
static int secret_check_version(StoreEgress *h, const char *owner, const char *name, uint64_t if_version) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT version FROM egress_secrets WHERE owner = ?1 AND name = ?2", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return step_errno(rc);
        if (if_version != STORE_EGRESS_ANY_VERSION && (uint64_t)sqlite3_column_int64(st, 0) != if_version)
                return -ESTALE;
        return 0;
}

static int secret_count_others(StoreEgress *h, const char *owner, const char *name, int64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT COUNT(*) FROM egress_secrets WHERE owner = ?1 AND name != ?2", -1,
                               &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
                return step_errno(rc) ?: -EIO;
        *ret = sqlite3_column_int64(st, 0);
        return 0;
}

static int secret_upsert(StoreEgress *h, const char *owner, const StoreEgressSecret *in) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        /* A replace sets every field but the placeholder and created_at:
         * rules or a header left out are cleared, never kept. */
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO egress_secrets (owner, name, value, hosts, placeholder, created_at, "
                               "updated_at, header, format, rules, version) "
                               "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?9, 1) "
                               "ON CONFLICT (owner, name) DO UPDATE SET value = excluded.value, hosts = "
                               "excluded.hosts, header = excluded.header, format = excluded.format, rules = "
                               "excluded.rules, updated_at = excluded.updated_at, version = version + 1",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, in->name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, in->value, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, in->hosts, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, in->placeholder, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 6, in->updated_at);
        if (in->header)
                sqlite3_bind_text(st, 7, in->header, -1, SQLITE_STATIC);
        if (in->format)
                sqlite3_bind_text(st, 8, in->format, -1, SQLITE_STATIC);
        if (in->rules)
                sqlite3_bind_text(st, 9, in->rules, -1, SQLITE_STATIC);
        return step_errno(sqlite3_step(st));
}

static int secret_put_tx(StoreEgress *h, const char *owner, const StoreEgressSecret *in, uint64_t if_version,
                         unsigned max_per_owner, StoreEgressSecret *ret) {
        int r;
        if (if_version != STORE_EGRESS_ANY_VERSION && (r = secret_check_version(h, owner, in->name, if_version)) < 0)
                return r;
        int64_t others = 0;
        if (max_per_owner > 0 && (r = secret_count_others(h, owner, in->name, &others)) < 0)
                return r;
        if (max_per_owner > 0 && others >= max_per_owner)
                return -EDQUOT;
        if ((r = secret_upsert(h, owner, in)) < 0)
                return r;
        return secret_query(h, owner, in->name, ret);
}

static int sqlite_egress_secret_put(StoreEgress *h, const char *owner, const StoreEgressSecret *in, uint64_t if_version,
                             unsigned max_per_owner, StoreEgressSecret *ret) {
        if (!in->name || !in->value || !in->hosts || !in->placeholder)
                return -EINVAL;
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        StoreEgressSecret out = { 0 };
        if ((r = transaction_end(h, secret_put_tx(h, owner, in, if_version, max_per_owner, &out))) < 0) {
                store_egress_secret_done(&out);
                return r;
        }
        *ret = out;
        return 0;
}

static int secret_rotate_tx(StoreEgress *h, const char *owner, const char *name, const char *value, int64_t now,
                            uint64_t if_version, StoreEgressSecret *ret) {
        int r = secret_check_version(h, owner, name, if_version);
        if (r < 0)
                return r;
        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(h->sql,
                                       "UPDATE egress_secrets SET value = ?3, updated_at = ?4, version = version + 1 "
                                       "WHERE owner = ?1 AND name = ?2",
                                       -1, &st, NULL) != SQLITE_OK)
                        return -EIO;
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, value, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 4, now);
                if ((r = step_errno(sqlite3_step(st))) < 0)
                        return r;
        }
        return secret_query(h, owner, name, ret);
}

static int sqlite_egress_secret_rotate(StoreEgress *h, const char *owner, const char *name, const char *value, int64_t now,
                                uint64_t if_version, StoreEgressSecret *ret) {
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        StoreEgressSecret out = { 0 };
        if ((r = transaction_end(h, secret_rotate_tx(h, owner, name, value, now, if_version, &out))) < 0) {
                store_egress_secret_done(&out);
                return r;
        }
        *ret = out;
        return 0;
}

static int sqlite_egress_secret_get(StoreEgress *h, const char *owner, const char *name, StoreEgressSecret *ret) {
        LOCKED(h);
        return secret_query(h, owner, name, ret);
}

static int sqlite_egress_secret_list(StoreEgress *h, const char *owner, const char *after, unsigned limit, bool with_values,
                              StoreEgressSecret **ret, size_t *ret_n, bool *ret_more) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT " SECRET_COLUMNS " FROM egress_secrets WHERE owner = ?1 AND name > ?2 "
                               "ORDER BY name LIMIT ?3",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, after ? after : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, limit ? (int64_t)limit + 1 : -1);
        StoreEgressSecret *list = NULL;
        size_t n = 0, cap = 0;
        bool more = false;
        int r = 0, rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (limit && n == limit) {
                        more = true;
                        break;
                }
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 16;
                        StoreEgressSecret *nl = realloc(list, ncap * sizeof(*nl));
                        if (!nl) {
                                r = -ENOMEM;
                                break;
                        }
                        list = nl;
                        cap = ncap;
                }
                if ((r = secret_row(st, with_values, &list[n])) < 0)
                        break;
                n++;
        }
        if (r == 0 && rc != SQLITE_ROW)
                r = step_errno(rc);
        if (r == 0 && !list && !(list = calloc(1, sizeof(*list))))
                r = -ENOMEM;
        if (r < 0) {
                store_egress_secrets_free(list, n);
                return r;
        }
        *ret = list;
        *ret_n = n;
        *ret_more = more;
        return 0;
}

static int secret_delete_tx(StoreEgress *h, const char *owner, const char *name, uint64_t if_version) {
        int r = secret_check_version(h, owner, name, if_version);
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "DELETE FROM egress_secrets WHERE owner = ?1 AND name = ?2", -1, &st, NULL) !=
            SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        return step_errno(sqlite3_step(st));
}

static int sqlite_egress_secret_delete(StoreEgress *h, const char *owner, const char *name, uint64_t if_version) {
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        return transaction_end(h, secret_delete_tx(h, owner, name, if_version));
}

/* ---- the audit log ---- */

static int sqlite_egress_audit_append(StoreEgress *h, const char *sandbox, const char *owner, const StoreEgressAudit *e,
                               int64_t *ret_id) {
        const EgressRecord *rec = &e->rec;
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO egress_log (sandbox, at, host, port, kind, allowed, reason, addr, "
                               "bytes_out, bytes_in, intercepted, secrets_used, rule, duration_ms, end_reason, owner) "
                               "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, e->at);
        sqlite3_bind_text(st, 3, rec->host, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, rec->port);
        sqlite3_bind_text(st, 5, e->kind, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 6, rec->allowed);
        sqlite3_bind_text(st, 7, rec->reason, -1, SQLITE_STATIC);
        if (rec->addr[0])
                sqlite3_bind_text(st, 8, rec->addr, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 9, (sqlite3_int64)rec->bytes_out);
        sqlite3_bind_int64(st, 10, (sqlite3_int64)rec->bytes_in);
        sqlite3_bind_int(st, 11, rec->intercepted);
        sqlite3_bind_int(st, 12, (int)rec->secrets_used);
        if (rec->rule[0])
                sqlite3_bind_text(st, 13, rec->rule, -1, SQLITE_STATIC);
        if (e->ended) {
                sqlite3_bind_int64(st, 14, (sqlite3_int64)rec->duration_ms);
                sqlite3_bind_text(st, 15, rec->end, -1, SQLITE_STATIC);
        }
        if (owner)
                sqlite3_bind_text(st, 16, owner, -1, SQLITE_STATIC);
        int r = step_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        if (ret_id)
                *ret_id = sqlite3_last_insert_rowid(h->sql);
        return 0;
}

static int sqlite_egress_audit_update(StoreEgress *h, const char *sandbox, int64_t id, const StoreEgressAudit *e) {
        const EgressRecord *rec = &e->rec;
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        const char *text = e->ended
                                   ? "UPDATE egress_log SET allowed = ?3, reason = ?4, bytes_out = ?5, bytes_in = ?6, "
                                     "intercepted = ?7, secrets_used = ?8, duration_ms = ?9, end_reason = ?10 "
                                     "WHERE id = ?1 AND sandbox = ?2"
                                   : "UPDATE egress_log SET allowed = ?3, reason = ?4 WHERE id = ?1 AND sandbox = ?2";
        if (sqlite3_prepare_v2(h->sql, text, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_text(st, 2, sandbox, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 3, rec->allowed);
        sqlite3_bind_text(st, 4, rec->reason, -1, SQLITE_STATIC);
        if (e->ended) {
                sqlite3_bind_int64(st, 5, (sqlite3_int64)rec->bytes_out);
                sqlite3_bind_int64(st, 6, (sqlite3_int64)rec->bytes_in);
                sqlite3_bind_int(st, 7, rec->intercepted);
                sqlite3_bind_int(st, 8, (int)rec->secrets_used);
                sqlite3_bind_int64(st, 9, (sqlite3_int64)rec->duration_ms);
                sqlite3_bind_text(st, 10, rec->end, -1, SQLITE_STATIC);
        }
        int r = step_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) > 0 ? 0 : -ENOENT;
}

static void column_copy(sqlite3_stmt *st, int col, char *buf, size_t len) {
        const char *t = (const char *)sqlite3_column_text(st, col);
        snprintf(buf, len, "%s", t ? t : "");
}

static void audit_row(sqlite3_stmt *st, StoreEgressAudit *a) {
        a->at = sqlite3_column_int64(st, 0);
        column_copy(st, 1, a->rec.host, sizeof a->rec.host);
        a->rec.port = (uint16_t)sqlite3_column_int(st, 2);
        column_copy(st, 3, a->kind, sizeof a->kind);
        a->rec.connect = strcmp(a->kind, "connect") == 0;
        a->rec.allowed = sqlite3_column_int(st, 4) != 0;
        column_copy(st, 5, a->rec.reason, sizeof a->rec.reason);
        column_copy(st, 6, a->rec.addr, sizeof a->rec.addr);
        a->rec.bytes_out = (uint64_t)sqlite3_column_int64(st, 7);
        a->rec.bytes_in = (uint64_t)sqlite3_column_int64(st, 8);
        a->rec.intercepted = sqlite3_column_int(st, 9) != 0;
        a->rec.secrets_used = (unsigned)sqlite3_column_int(st, 10);
        column_copy(st, 11, a->rec.rule, sizeof a->rec.rule);
        a->ended = sqlite3_column_type(st, 13) != SQLITE_NULL;
        a->rec.duration_ms = (uint64_t)sqlite3_column_int64(st, 12);
        column_copy(st, 13, a->rec.end, sizeof a->rec.end);
}

static int sqlite_egress_audit_list(StoreEgress *h, const char *sandbox, unsigned limit, StoreEgressAudit **ret,
                             size_t *ret_n) {
        StoreEgressAudit *list = calloc(limit ? limit : 1, sizeof(*list));
        if (!list)
                return -ENOMEM;
        size_t n = 0;
        int r = 0;
        {
                LOCKED(h);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(h->sql,
                                       "SELECT at, host, port, kind, allowed, reason, addr, bytes_out, bytes_in, "
                                       "intercepted, secrets_used, rule, duration_ms, end_reason FROM egress_log "
                                       "WHERE sandbox = ?1 ORDER BY id DESC LIMIT ?2",
                                       -1, &st, NULL) != SQLITE_OK)
                        r = -EIO;
                else {
                        sqlite3_bind_text(st, 1, sandbox, -1, SQLITE_STATIC);
                        sqlite3_bind_int64(st, 2, limit);
                        int rc = SQLITE_DONE;
                        while (n < limit && (rc = sqlite3_step(st)) == SQLITE_ROW)
                                audit_row(st, &list[n++]);
                        if (n < limit)
                                r = step_errno(rc);
                }
        }
        if (r < 0) {
                free(list);
                return r;
        }
        *ret = list;
        *ret_n = n;
        return 0;
}

static int sqlite_egress_audit_prune(StoreEgress *h, const char *sandbox, unsigned keep) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "DELETE FROM egress_log WHERE sandbox = ?1 AND id <= (SELECT id FROM egress_log "
                               "WHERE sandbox = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, sandbox, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, keep);
        return step_errno(sqlite3_step(st));
}

static int sqlite_egress_audit_end_open(StoreEgress *h, const char *why) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "UPDATE egress_log SET end_reason = ?1 WHERE end_reason IS NULL", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, why, -1, SQLITE_STATIC);
        return step_errno(sqlite3_step(st));
}

const StoreEgressOps store_sqlite_egress = {
        .open = sqlite_egress_open,
        .close = sqlite_egress_close,
        .secret_put = sqlite_egress_secret_put,
        .secret_rotate = sqlite_egress_secret_rotate,
        .secret_get = sqlite_egress_secret_get,
        .secret_list = sqlite_egress_secret_list,
        .secret_delete = sqlite_egress_secret_delete,
        .audit_append = sqlite_egress_audit_append,
        .audit_update = sqlite_egress_audit_update,
        .audit_list = sqlite_egress_audit_list,
        .audit_prune = sqlite_egress_audit_prune,
        .audit_end_open = sqlite_egress_audit_end_open,
};
