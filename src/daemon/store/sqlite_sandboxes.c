#include "daemon/store/store_sandboxes.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/store/sqldb.h"

struct StoreSandboxes {
        sqlite3 *sql;
        pthread_mutex_t lock;
        char writer[64]; /* set_writer's host; "" until then */
        int64_t writer_epoch;
};

/* The condition every write of a writer's is made under (set_writer); ?30
 * and ?31 are the writer and its epoch. Only named once a writer is set:
 * the hosts table is another kind's, which a database of the sandboxes
 * alone (a test's) does not have. */
#define WRITER_LIVE                                                                                 \
        "EXISTS (SELECT 1 FROM hosts WHERE hosts.id = ?30 AND hosts.epoch = ?31 "                 \
        "AND hosts.state <> 'dead')"

static void bind_writer(StoreSandboxes *db, sqlite3_stmt *st) {
        if (db->writer[0]) {
                sqlite3_bind_text(st, 30, db->writer, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 31, db->writer_epoch);
        }
}

/* 0 while the writer may write (or none is set), -EOWNERDEAD when not. */
static int writer_check(StoreSandboxes *db) {
        if (!db->writer[0])
                return 0;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db->sql, "SELECT 1 WHERE " WRITER_LIVE, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        bind_writer(db, st);
        int rc = sqlite3_step(st);
        return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? -EOWNERDEAD : sqldb_errno(rc);
}

/* Migrations, in order; the schema_version table says how many ran. Never
 * edit one that shipped: append. */
static const char *const migrations[] = {
        "CREATE TABLE keys ("
        "  id TEXT PRIMARY KEY,"
        "  name TEXT NOT NULL,"
        "  owner TEXT NOT NULL,"
        "  access TEXT NOT NULL CHECK (access IN ('full', 'read')),"
        "  hash TEXT NOT NULL UNIQUE,"
        "  daily_limit_micros INTEGER,"
        "  trial INTEGER NOT NULL DEFAULT 0,"
        "  created_at INTEGER NOT NULL,"
        "  revoked_at INTEGER);"
        "CREATE TABLE sandboxes ("
        "  id TEXT PRIMARY KEY,"
        "  owner TEXT NOT NULL,"
        "  key_id TEXT NOT NULL REFERENCES keys(id),"
        "  name TEXT,"
        "  labels TEXT NOT NULL,"
        "  spec TEXT NOT NULL,"
        "  state TEXT NOT NULL,"
        "  failure_reason TEXT,"
        "  created_at INTEGER NOT NULL,"
        "  started_at INTEGER,"
        "  stopped_at INTEGER,"
        "  lease_ends_at INTEGER,"
        "  run_seconds INTEGER NOT NULL DEFAULT 0,"
        "  deleted_at INTEGER);"
        "CREATE INDEX sandboxes_owner ON sandboxes (owner, created_at);"
        "CREATE INDEX sandboxes_live ON sandboxes (deleted_at, state);",
        /* Who a request that names no user runs as. Sandboxes made before
         * it ran such requests as the sandbox user, which the default keeps. */
        "ALTER TABLE sandboxes ADD COLUMN run_as TEXT NOT NULL DEFAULT 'sandbox'"
        "  CHECK (run_as IN ('sandbox', 'root'));",
        /* Uploads in parts (uploads.c), kept across a restart: parts is a
         * file's part count or an archive's bound; a row of upload_parts
         * for each part whose bytes are on the disk. */
        "CREATE TABLE uploads ("
        "  id TEXT PRIMARY KEY,"
        "  sandbox_id TEXT NOT NULL,"
        "  owner TEXT NOT NULL,"
        "  kind TEXT NOT NULL CHECK (kind IN ('file', 'archive')),"
        "  path TEXT NOT NULL,"
        "  user TEXT NOT NULL CHECK (user IN ('default', 'sandbox', 'root')),"
        "  mode INTEGER NOT NULL,"
        "  size INTEGER,"
        "  sha256 BLOB,"
        "  chunk_bytes INTEGER NOT NULL,"
        "  parts INTEGER NOT NULL,"
        "  created_at INTEGER NOT NULL,"
        "  touched_at INTEGER NOT NULL);"
        "CREATE INDEX uploads_sandbox ON uploads (sandbox_id);"
        "CREATE TABLE upload_parts ("
        "  upload_id TEXT NOT NULL REFERENCES uploads(id) ON DELETE CASCADE,"
        "  part INTEGER NOT NULL,"
        "  bytes INTEGER NOT NULL,"
        "  PRIMARY KEY (upload_id, part));",
        /* The spec's codec version (model/sandbox_spec.h: rows written
         * before it are version 1) and the row's version, which each write
         * bumps and a conditional write checks. */
        "ALTER TABLE sandboxes ADD COLUMN spec_version INTEGER NOT NULL DEFAULT 1;"
        "ALTER TABLE sandboxes ADD COLUMN version INTEGER NOT NULL DEFAULT 1;",
        /* The host whose drivers run a sandbox, and the host that claimed
         * an Idempotency-Key (whose pending claims go when it is gone). The
         * idempotency table was made outside these steps before: made here
         * if missing, then given its column. */
        "ALTER TABLE sandboxes ADD COLUMN host_id TEXT NOT NULL DEFAULT '';"
        "CREATE INDEX sandboxes_host ON sandboxes (host_id, state);"
        "CREATE TABLE IF NOT EXISTS idempotency ("
        "  owner TEXT NOT NULL, key TEXT NOT NULL, hash TEXT NOT NULL,"
        "  status INTEGER NOT NULL, body TEXT, created_at INTEGER NOT NULL,"
        "  PRIMARY KEY (owner, key));"
        "CREATE INDEX IF NOT EXISTS idempotency_age ON idempotency (created_at);"
        "ALTER TABLE idempotency ADD COLUMN host_id TEXT NOT NULL DEFAULT '';",
        /* Whether a read key's requests are activity that keeps a sandbox
         * from its idle pause (store_keys.h); keys made before it are not. */
        "ALTER TABLE keys ADD COLUMN keeps_awake INTEGER NOT NULL DEFAULT 0 CHECK (keeps_awake IN (0, 1));",
        /* The millisecond within created_at's and started_at's second, so
         * that sandboxes made within one second keep their order; rows made
         * before it read as whole seconds. */
        "ALTER TABLE sandboxes ADD COLUMN created_msec INTEGER NOT NULL DEFAULT 0"
        "  CHECK (created_msec BETWEEN 0 AND 999);"
        "ALTER TABLE sandboxes ADD COLUMN started_msec INTEGER NOT NULL DEFAULT 0"
        "  CHECK (started_msec BETWEEN 0 AND 999);",
};

static int migrate(sqlite3 *sql) {
        int r = sqldb_exec(sql, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);");
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(sql, "SELECT max(version) FROM schema_version", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        int64_t version = 0;
        if (sqlite3_step(st) == SQLITE_ROW)
                version = sqlite3_column_int64(st, 0);
        if (version > (int64_t)ELEMENTSOF(migrations))
                return -EPROTONOSUPPORT; /* a newer daemon wrote this database */
        for (size_t i = (size_t)version; i < ELEMENTSOF(migrations); i++) {
                if ((r = sqldb_exec(sql, "BEGIN IMMEDIATE")) < 0)
                        return r;
                char bump[96];
                snprintf(bump, sizeof(bump), "INSERT INTO schema_version (version) VALUES (%zu);", i + 1);
                if ((r = sqldb_exec(sql, migrations[i])) < 0 || (r = sqldb_exec(sql, bump)) < 0) {
                        sqldb_exec(sql, "ROLLBACK");
                        return r;
                }
                if ((r = sqldb_exec(sql, "COMMIT")) < 0)
                        return r;
        }
        return 0;
}

static void sq_close(StoreSandboxes *db);

static int sq_open(const char *path, StoreSandboxes **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open(path, &sql);
        if (r < 0)
                return r;
        if ((r = migrate(sql)) < 0) {
                sqlite3_close(sql);
                return r;
        }
        StoreSandboxes *db = calloc(1, sizeof(*db));
        if (!db) {
                sqlite3_close(sql);
                return -ENOMEM;
        }
        db->sql = sql;
        pthread_mutex_init(&db->lock, NULL);
        *ret = db;
        return 0;
}

static void sq_close(StoreSandboxes *db) {
        if (!db)
                return;
        sqlite3_close(db->sql);
        pthread_mutex_destroy(&db->lock);
        free(db);
}

static void copy_text(char *dst, size_t n, sqlite3_stmt *st, int col) {
        const unsigned char *t = sqlite3_column_text(st, col);
        snprintf(dst, n, "%s", t ? (const char *)t : "");
}

static void bind_opt_int(sqlite3_stmt *st, int i, int64_t v) {
        if (v)
                sqlite3_bind_int64(st, i, v);
        else
                sqlite3_bind_null(st, i);
}

static void bind_opt_text(sqlite3_stmt *st, int i, const char *v) {
        if (v)
                sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
        else
                sqlite3_bind_null(st, i);
}

static int count_where(sqlite3 *sql, const char *owner, int64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        const char *q = owner ? "SELECT count(*) FROM sandboxes WHERE deleted_at IS NULL AND owner = ?"
                              : "SELECT count(*) FROM sandboxes WHERE deleted_at IS NULL";
        if (sqlite3_prepare_v2(sql, q, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        if (owner)
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_ROW)
                return -EIO;
        *ret = sqlite3_column_int64(st, 0);
        return 0;
}

static int sq_insert(StoreSandboxes *db, SandboxRow *r, unsigned max_total, unsigned max_owner) {
        LOCKED(db);
        int rc = sqldb_exec(db->sql, "BEGIN IMMEDIATE");
        if (rc < 0)
                return rc;
        int64_t total, mine;
        if ((rc = count_where(db->sql, NULL, &total)) < 0 || (rc = count_where(db->sql, r->owner, &mine)) < 0)
                goto rollback;
        if (total >= max_total) {
                rc = -EUSERS;
                goto rollback;
        }
        if (mine >= max_owner) {
                rc = -EDQUOT;
                goto rollback;
        }
        if ((rc = writer_check(db)) < 0)
                goto rollback;
        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                _cleanup_free_ char *spec = sandbox_spec_encode(&r->spec);
                if (!spec) {
                        rc = -ENOMEM;
                        goto rollback;
                }
                if (sqlite3_prepare_v2(db->sql,
                                       "INSERT INTO sandboxes (id, owner, key_id, name, labels, spec, state, "
                                       "created_at, lease_ends_at, run_as, spec_version, version, host_id, "
                                       "created_msec) "
                                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
                                       -1, &st, NULL) != SQLITE_OK) {
                        rc = -EIO;
                        goto rollback;
                }
                sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, r->owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, r->key_id, -1, SQLITE_STATIC);
                bind_opt_text(st, 4, r->name);
                sqlite3_bind_text(st, 5, r->labels, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 6, spec, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 7, sandbox_state_name(r->state), -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 8, r->created_at);
                bind_opt_int(st, 9, r->lease_ends_at);
                sqlite3_bind_text(st, 10, r->run_as_root ? "root" : "sandbox", -1, SQLITE_STATIC);
                sqlite3_bind_int(st, 11, SANDBOX_SPEC_VERSION);
                sqlite3_bind_text(st, 12, r->host_id, -1, SQLITE_STATIC);
                sqlite3_bind_int(st, 13, r->created_msec);
                if ((rc = sqldb_errno(sqlite3_step(st))) < 0)
                        goto rollback;
        }
        if ((rc = sqldb_exec(db->sql, "COMMIT")) == 0)
                r->version = 1;
        return rc;
rollback:
        sqldb_exec(db->sql, "ROLLBACK");
        return rc;
}

static int exists(StoreSandboxes *db, const char *id) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db->sql, "SELECT 1 FROM sandboxes WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : sqldb_errno(rc);
}

static int sq_update(StoreSandboxes *db, SandboxRow *r) {
        _cleanup_free_ char *spec = sandbox_spec_encode(&r->spec);
        if (!spec)
                return -ENOMEM;
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
#define UPDATE_ROW                                                                                    \
        "UPDATE sandboxes SET spec = ?, state = ?, failure_reason = ?, started_at = ?, stopped_at = ?, "      \
        "lease_ends_at = ?, run_seconds = ?, deleted_at = ?, run_as = ?, spec_version = ?, "                  \
        "started_msec = ?, version = version + 1 WHERE id = ? AND version = ?"
        if (sqlite3_prepare_v2(db->sql, db->writer[0] ? UPDATE_ROW " AND " WRITER_LIVE : UPDATE_ROW, -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, spec, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, sandbox_state_name(r->state), -1, SQLITE_STATIC);
        bind_opt_text(st, 3, r->failure_reason);
        bind_opt_int(st, 4, r->started_at);
        bind_opt_int(st, 5, r->stopped_at);
        bind_opt_int(st, 6, r->lease_ends_at);
        sqlite3_bind_int64(st, 7, r->run_seconds);
        bind_opt_int(st, 8, r->deleted_at);
        sqlite3_bind_text(st, 9, r->run_as_root ? "root" : "sandbox", -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 10, SANDBOX_SPEC_VERSION);
        sqlite3_bind_int(st, 11, r->started_at ? r->started_msec : 0);
        sqlite3_bind_text(st, 12, r->id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 13, r->version);
        bind_writer(db, st);
        int rc = sqldb_errno(sqlite3_step(st));
        if (rc < 0)
                return rc;
        if (sqlite3_changes(db->sql) == 1) {
                r->version++;
                return 0;
        }
        if ((rc = writer_check(db)) < 0)
                return rc;
        rc = exists(db, r->id);
        return rc < 0 ? rc : rc ? -ESTALE : -ENOENT;
}

static int sq_set_meta(StoreSandboxes *db, const char *id, const char *name, const char *labels) {
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db->sql, "UPDATE sandboxes SET name = ?, labels = ? WHERE id = ? AND deleted_at IS NULL",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        bind_opt_text(st, 1, name);
        sqlite3_bind_text(st, 2, labels, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, id, -1, SQLITE_STATIC);
        int rc = sqldb_errno(sqlite3_step(st));
        if (rc < 0)
                return rc;
        return sqlite3_changes(db->sql) == 1 ? 0 : -ENOENT;
}

#define ROW_COLUMNS                                                                                         \
        "id, owner, key_id, name, labels, spec, state, failure_reason, created_at, started_at, stopped_at, " \
        "lease_ends_at, run_seconds, deleted_at, run_as, spec_version, version, host_id, created_msec, "    \
        "started_msec"

static char *dup_col(sqlite3_stmt *st, int col) {
        const unsigned char *t = sqlite3_column_text(st, col);
        return t ? strdup((const char *)t) : NULL;
}

/* A row; -EBADMSG or -EPROTONOSUPPORT (why in err) when its spec or state
 * cannot be read. */
static int read_row(sqlite3_stmt *st, SandboxRow *r, char *err, size_t err_len) {
        *r = (SandboxRow){ 0 };
        copy_text(r->id, sizeof(r->id), st, 0);
        r->owner = dup_col(st, 1);
        r->key_id = dup_col(st, 2);
        r->name = dup_col(st, 3);
        r->labels = dup_col(st, 4);
        r->failure_reason = dup_col(st, 7);
        r->created_at = sqlite3_column_int64(st, 8);
        r->started_at = sqlite3_column_int64(st, 9);
        r->stopped_at = sqlite3_column_int64(st, 10);
        r->lease_ends_at = sqlite3_column_int64(st, 11);
        r->run_seconds = sqlite3_column_int64(st, 12);
        r->deleted_at = sqlite3_column_int64(st, 13);
        const unsigned char *run_as = sqlite3_column_text(st, 14);
        r->run_as_root = run_as && strcmp((const char *)run_as, "root") == 0;
        r->version = sqlite3_column_int64(st, 16);
        copy_text(r->host_id, sizeof(r->host_id), st, 17);
        r->created_msec = sqlite3_column_int(st, 18);
        r->started_msec = sqlite3_column_int(st, 19);
        if (!r->owner || !r->key_id || !r->labels) {
                sandbox_row_done(r);
                return -ENOMEM;
        }
        const char *state = (const char *)sqlite3_column_text(st, 6);
        if (sandbox_state_from_name(state, &r->state) < 0) {
                snprintf(err, err_len, "its state \"%.32s\" is none this daemon knows", state ? state : "");
                sandbox_row_done(r);
                return -EBADMSG;
        }
        int rc = sandbox_spec_decode((const char *)sqlite3_column_text(st, 5), sqlite3_column_int64(st, 15),
                                     &r->spec, err, err_len);
        if (rc < 0) {
                sandbox_row_done(r);
                return rc;
        }
        return 0;
}

static int sq_get(StoreSandboxes *db, const char *id, SandboxRow *ret) {
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db->sql, "SELECT " ROW_COLUMNS " FROM sandboxes WHERE id = ? AND deleted_at IS NULL",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return -EIO;
        char why[256];
        return read_row(st, ret, why, sizeof(why));
}

static int sq_query(StoreSandboxes *db, StoreSandboxQuery q, const char *scope, int64_t now, StoreSandboxFn fn,
                    void *userdata) {
        const char *sql;
        switch (q) {
        case STORE_SANDBOXES_OF_OWNER:
                sql = "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL AND owner = ?1 "
                      "ORDER BY created_at DESC, created_msec DESC, id DESC";
                break;
        case STORE_SANDBOXES_ACTIVE:
                sql = "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL "
                      "AND (?1 IS NULL OR host_id = ?1) "
                      "AND state IN ('starting', 'running', 'pausing', 'paused', 'resuming', 'stopping')";
                break;
        case STORE_SANDBOXES_LEASE_DUE:
                /* A running sandbox whose lease is over, or one of any state
                 * that is to be deleted at lease end. */
                sql = "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL "
                      "AND (?1 IS NULL OR host_id = ?1) "
                      "AND lease_ends_at IS NOT NULL AND lease_ends_at <= ?2 "
                      "AND (state = 'running' OR (state != 'starting' AND "
                      "json_extract(spec, '$.onLeaseEnd') = 'delete'))";
                break;
        case STORE_SANDBOXES_LOST:
                sql = "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL "
                      "AND (?1 IS NULL OR host_id = ?1) AND state = 'lost'";
                break;
        default:
                return -EINVAL;
        }
        /* Collect first, call later: fn may write to the database. */
        SandboxRow *rows = NULL;
        size_t n = 0;
        int rc = 0;
        {
                LOCKED(db);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(db->sql, sql, -1, &st, NULL) != SQLITE_OK)
                        return -EIO;
                if (scope)
                        sqlite3_bind_text(st, 1, scope, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 2, now);
                while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                        SandboxRow *nr = realloc(rows, (n + 1) * sizeof(*rows));
                        if (!nr) {
                                rc = -ENOMEM;
                                break;
                        }
                        rows = nr;
                        char why[256];
                        if ((rc = read_row(st, &rows[n], why, sizeof(why))) < 0)
                                break;
                        n++;
                }
                rc = rc == SQLITE_DONE ? 0 : (rc < 0 ? rc : -EIO);
        }
        for (size_t i = 0; i < n; i++) {
                if (rc == 0)
                        rc = fn(userdata, &rows[i]);
                sandbox_row_done(&rows[i]);
        }
        free(rows);
        return rc < 0 ? rc : 0;
}

static int sq_state_counts(StoreSandboxes *db, StoreStateCountFn fn, void *userdata) {
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db->sql,
                               "SELECT state, count(*) FROM sandboxes WHERE deleted_at IS NULL GROUP BY state", -1,
                               &st, NULL) != SQLITE_OK)
                return -EIO;
        while (sqlite3_step(st) == SQLITE_ROW) {
                SandboxState state;
                if (sandbox_state_from_name((const char *)sqlite3_column_text(st, 0), &state) == 0)
                        fn(userdata, state, sqlite3_column_int64(st, 1));
        }
        return 0;
}

static int sq_check(StoreSandboxes *db, StoreBadRowFn bad, void *userdata) {
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db->sql, "SELECT " ROW_COLUMNS " FROM sandboxes WHERE deleted_at IS NULL", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        int rc, n = 0;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                SandboxRow row;
                char why[256] = "";
                int r = read_row(st, &row, why, sizeof(why));
                if (r == -ENOMEM)
                        return r;
                if (r < 0) {
                        const unsigned char *id = sqlite3_column_text(st, 0);
                        bad(userdata, id ? (const char *)id : "", r, why);
                        n++;
                } else
                        sandbox_row_done(&row);
        }
        return rc == SQLITE_DONE ? n : sqldb_errno(rc);
}

/* ---- Idempotency-Key records ---- */

static int idem_trim(StoreSandboxes *db, const char *owner, int64_t now) {
        _cleanup_stmt_ sqlite3_stmt *age = NULL, *count = NULL;
        if (sqlite3_prepare_v2(db->sql, "DELETE FROM idempotency WHERE created_at < ?1", -1, &age, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_int64(age, 1, now - STORE_IDEM_MAX_AGE_SECONDS);
        if (sqlite3_step(age) != SQLITE_DONE)
                return -EIO;
        /* Per owner, so one owner's flood of keys never pushes out another's. */
        if (sqlite3_prepare_v2(db->sql,
                               "DELETE FROM idempotency WHERE owner = ?1 AND rowid IN (SELECT rowid FROM idempotency "
                               "WHERE owner = ?1 ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?2)",
                               -1, &count, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(count, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_int(count, 2, STORE_IDEM_MAX_PER_OWNER - 1); /* and the one about to be added */
        return sqlite3_step(count) == SQLITE_DONE ? 0 : -EIO;
}

static int sq_idem_claim(StoreSandboxes *db, const char *owner, const char *key, const char *hash, int64_t now, unsigned *ret_status,
                  char **ret_body) {
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *get = NULL, *put = NULL;
        if (sqlite3_prepare_v2(db->sql,
                               "SELECT hash, status, body FROM idempotency WHERE owner = ?1 AND key = ?2 "
                               "AND created_at >= ?3",
                               -1, &get, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(get, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(get, 2, key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(get, 3, now - STORE_IDEM_MAX_AGE_SECONDS);
        int rc = sqlite3_step(get);
        if (rc == SQLITE_ROW) {
                if (strcmp((const char *)sqlite3_column_text(get, 0), hash) != 0)
                        return STORE_IDEM_MISMATCH;
                int status = sqlite3_column_int(get, 1);
                if (status == 0)
                        return STORE_IDEM_PENDING;
                const char *body = (const char *)sqlite3_column_text(get, 2);
                char *copy = strdup(body ? body : "");
                if (!copy)
                        return -ENOMEM;
                *ret_status = (unsigned)status;
                *ret_body = copy;
                return STORE_IDEM_REPLAY;
        }
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc);
        /* Only a new record grows the table: the bounds are kept here (an
         * aged record of this key goes too, before the insert). */
        int r = idem_trim(db, owner, now);
        if (r < 0)
                return r;
        if (sqlite3_prepare_v2(db->sql,
                               "INSERT INTO idempotency (owner, key, hash, status, created_at, host_id) "
                               "VALUES (?1, ?2, ?3, 0, ?4, ?5)",
                               -1, &put, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(put, 5, db->writer, -1, SQLITE_STATIC);
        sqlite3_bind_text(put, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(put, 2, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(put, 3, hash, -1, SQLITE_STATIC);
        sqlite3_bind_int64(put, 4, now);
        rc = sqlite3_step(put);
        return rc == SQLITE_DONE ? STORE_IDEM_CLAIMED : sqldb_errno(rc);
}

static int sq_idem_finish(StoreSandboxes *db, const char *owner, const char *key, unsigned status, const char *body) {
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        /* A 408 or 429 asks for a retry: never replayed. */
        bool keep = status >= 200 && status < 500 && status != 408 && status != 429 && body &&
                    strlen(body) <= STORE_IDEM_MAX_BODY;
        if (sqlite3_prepare_v2(db->sql,
                               keep ? "UPDATE idempotency SET status = ?3, body = ?4 WHERE owner = ?1 AND key = ?2"
                                    : "DELETE FROM idempotency WHERE owner = ?1 AND key = ?2",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
        if (keep) {
                sqlite3_bind_int(st, 3, (int)status);
                sqlite3_bind_text(st, 4, body, -1, SQLITE_STATIC);
        }
        int rc = sqlite3_step(st);
        return rc == SQLITE_DONE ? 0 : sqldb_errno(rc);
}

static int sq_idem_drop_pending(StoreSandboxes *db, const char *host_id) {
        LOCKED(db);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db->sql, "DELETE FROM idempotency WHERE status = 0 AND host_id IN (?1, '')", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, host_id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        return rc == SQLITE_DONE ? 0 : sqldb_errno(rc);
}

static int sq_set_writer(StoreSandboxes *db, const char *host_id, int64_t epoch) {
        if (strlen(host_id) >= sizeof(db->writer))
                return -EINVAL;
        LOCKED(db);
        snprintf(db->writer, sizeof(db->writer), "%s", host_id);
        db->writer_epoch = epoch;
        return 0;
}

/* A SQLite file is one host's store (its state directory's, under its
 * lock): every row is this host's, whatever id an earlier run had (its
 * host.id replaced, --host-id changed), snapshots' homes included. */
static int sq_adopt(StoreSandboxes *db, const char *host_id) {
        static const char *const adopt[] = {
                "UPDATE sandboxes SET host_id = ?1 WHERE host_id <> ?1",
                "UPDATE snapshots SET host_id = ?1 WHERE host_id <> ?1 AND "
                "EXISTS (SELECT 1 FROM pragma_table_info('snapshots') WHERE name = 'host_id')",
        };
        LOCKED(db);
        for (size_t i = 0; i < ELEMENTSOF(adopt); i++) {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                /* A file without the snapshots' table (a test's) has none to adopt. */
                if (sqlite3_prepare_v2(db->sql, adopt[i], -1, &st, NULL) != SQLITE_OK) {
                        if (i > 0)
                                continue;
                        return -EIO;
                }
                sqlite3_bind_text(st, 1, host_id, -1, SQLITE_STATIC);
                int rc = sqlite3_step(st);
                if (rc != SQLITE_DONE)
                        return sqldb_errno(rc);
        }
        return 0;
}

const StoreSandboxOps store_sqlite_sandboxes = {
        .open = sq_open,
        .close = sq_close,
        .set_writer = sq_set_writer,
        .adopt = sq_adopt,
        .insert = sq_insert,
        .update = sq_update,
        .set_meta = sq_set_meta,
        .get = sq_get,
        .query = sq_query,
        .state_counts = sq_state_counts,
        .check = sq_check,
        .idem_claim = sq_idem_claim,
        .idem_drop_pending = sq_idem_drop_pending,
        .idem_finish = sq_idem_finish,
};
