/* The audit trail in the SQLite backend (store_audit.h): one table, rowid
 * the cursor. */
#include "daemon/store/store_audit.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreAudit {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
        sqlite3_stmt *insert; /* kept prepared: a record is written per call served */
};

/* The audit table's history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the table as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS audit ("
          "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
          "  id TEXT NOT NULL UNIQUE,"
          "  owner TEXT NOT NULL,"
          "  action TEXT NOT NULL,"
          "  key_id TEXT,"
          "  method TEXT,"
          "  path TEXT,"
          "  sandbox_id TEXT,"
          "  detail TEXT,"
          "  status INTEGER NOT NULL DEFAULT 0,"
          "  client TEXT,"
          "  request_id TEXT,"
          "  host_id TEXT NOT NULL,"
          "  at INTEGER NOT NULL);"
          "CREATE INDEX IF NOT EXISTS audit_owner ON audit (owner, seq);"
          "CREATE INDEX IF NOT EXISTS audit_at ON audit (at);"
          "CREATE INDEX IF NOT EXISTS audit_sandbox ON audit (sandbox_id, seq);" },
};

static int sqlite_audit_open(const char *location, StoreAudit **ret) {
        return sqldb_handle_open(location, "audit", migrations, ELEMENTSOF(migrations), sizeof(**ret), (void **)ret);
}

static void sqlite_audit_close(StoreAudit *h) {
        if (h)
                sqldb_finalizep(&h->insert);
        sqldb_handle_close(h);
}

/* Called under the handle's lock. */
static int insert_one(StoreAudit *h, const AuditRecord *a) {
        if (!h->insert &&
            sqlite3_prepare_v3(h->sql,
                               "INSERT INTO audit (id, owner, action, key_id, method, path, sandbox_id, detail, "
                               "status, client, request_id, host_id, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               -1, SQLITE_PREPARE_PERSISTENT, &h->insert, NULL) != SQLITE_OK)
                return -EIO;
        _rewind_stmt_ sqlite3_stmt *st = h->insert;
        sqlite3_bind_text(st, 1, a->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, a->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, a->action, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 4, a->key_id);
        sqldb_bind_opt(st, 5, a->method);
        sqldb_bind_opt(st, 6, a->path);
        sqldb_bind_opt(st, 7, a->sandbox_id);
        sqldb_bind_opt(st, 8, a->detail);
        sqlite3_bind_int(st, 9, a->status);
        sqldb_bind_opt(st, 10, a->client);
        sqldb_bind_opt(st, 11, a->request_id);
        sqlite3_bind_text(st, 12, a->host_id ? a->host_id : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 13, a->at);
        return sqldb_errno(sqlite3_step(st));
}

typedef struct Batch {
        StoreAudit *h;
        const AuditRecord *a;
        size_t n;
} Batch;

static int append_tx(void *userdata) {
        const Batch *b = userdata;
        int r = 0;
        for (size_t i = 0; r == 0 && i < b->n; i++)
                r = insert_one(b->h, &b->a[i]);
        return r;
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_audit_set_writer(StoreAudit *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int sqlite_audit_append(StoreAudit *h, const AuditRecord *a, size_t n) {
        LOCKED(h);
        if (n == 1)
                return insert_one(h, a);
        Batch b = { .h = h, .a = a, .n = n };
        return n ? sqldb_transaction(h->sql, append_tx, &b) : 0;
}

static int sqlite_audit_list(StoreAudit *h, const AuditFilter *f, StoreAuditFn fn, void *userdata) {
        /* ?2 an action, or a group when it ends in '.': matched as a prefix
         * (instr, so that no character of it is a pattern). */
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT seq, id, owner, action, key_id, method, path, sandbox_id, detail, status, client, "
                               "request_id, host_id, at FROM audit WHERE (?1 IS NULL OR owner = ?1) "
                               "AND (?2 IS NULL OR (substr(?2, -1) = '.' AND instr(action, ?2) = 1) OR action = ?2) "
                               "AND (?3 = 0 OR seq < ?3) AND (?5 IS NULL OR sandbox_id = ?5) "
                               "ORDER BY seq DESC LIMIT ?4",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqldb_bind_opt(st, 1, f->owner);
        sqldb_bind_opt(st, 2, f->action);
        sqlite3_bind_int64(st, 3, f->before);
        sqlite3_bind_int64(st, 4, f->limit);
        sqldb_bind_opt(st, 5, f->sandbox_id);
        int rc, r = 0;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                AuditRecord a = { .seq = sqlite3_column_int64(st, 0), .owner = sqldb_col(st, 2), .action = sqldb_col(st, 3),
                                  .key_id = sqldb_col(st, 4), .method = sqldb_col(st, 5), .path = sqldb_col(st, 6),
                                  .sandbox_id = sqldb_col(st, 7), .detail = sqldb_col(st, 8), .status = sqlite3_column_int(st, 9),
                                  .client = sqldb_col(st, 10), .request_id = sqldb_col(st, 11), .host_id = sqldb_col(st, 12),
                                  .at = sqlite3_column_int64(st, 13) };
                snprintf(a.id, sizeof a.id, "%s", sqldb_col(st, 1) ?: "");
                r = fn(userdata, &a);
        }
        if (r < 0)
                return r;
        return rc == SQLITE_DONE ? 0 : (sqldb_errno(rc) ?: -EIO);
}

static int sqlite_audit_prune(StoreAudit *h, int64_t before, int64_t *ret_n) {
        LOCKED(h);
        return sqldb_delete_before(h->sql, "DELETE FROM audit WHERE at < ?", before, ret_n);
}

const StoreAuditOps store_sqlite_audit = {
        .open = sqlite_audit_open,
        .close = sqlite_audit_close,
        .set_writer = sqlite_audit_set_writer,
        .append = sqlite_audit_append,
        .list = sqlite_audit_list,
        .prune = sqlite_audit_prune,
};
