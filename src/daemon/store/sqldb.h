#pragma once
/*
 * The one way the daemon uses SQLite. Every part that keeps state in the
 * daemon's database file (the store, the ledger, the key store, the egress
 * state) opens its connection here, with one policy: serialized mode, no
 * symlinks, WAL, synchronous=NORMAL, foreign keys, and one busy timeout.
 * Each part keeps its own connection and a mutex so that its transactions
 * (BEGIN IMMEDIATE ... COMMIT) never interleave on it.
 */
#include <pthread.h>
#include <stddef.h>
#include <sqlite3.h>
#include <stdint.h>

/* How long a writer waits for another connection's write lock. */
#define SQLDB_BUSY_TIMEOUT_MS 10000

/* Opens (and creates) the database at path. */
int sqldb_open(const char *path, sqlite3 **ret);
/* sqldb_open, with synchronous=FULL: each commit of this connection is on
 * the disk before it returns, not only in the WAL's page cache (which a
 * host's crash or power loss can take), at the cost of a sync per commit. */
int sqldb_open_durable(const char *path, sqlite3 **ret);
/* sqldb_open, then the schema's statements in one transaction (closed again
 * when they fail). */
int sqldb_open_schema(const char *path, const char *schema, sqlite3 **ret);
/* A negative errno for an SQLite result code (0 for OK, DONE and ROW):
 * -EBUSY when locked, -ENOSPC, -EEXIST for a constraint, -EPERM, else -EIO. */
int sqldb_errno(int rc);
/* Runs SQL text (no results). */
int sqldb_exec(sqlite3 *sql, const char *text);
/* Runs SQL text inside BEGIN IMMEDIATE ... COMMIT (rolled back on failure). */
int sqldb_exec_transaction(sqlite3 *sql, const char *text);
/* Runs fn(userdata) between BEGIN IMMEDIATE and COMMIT; a negative return
 * (or a failed commit) rolls back and is returned. */
typedef int (*SqlTxFn)(void *userdata);
int sqldb_transaction(sqlite3 *sql, SqlTxFn fn, void *userdata);
/* Runs a DELETE whose one parameter is a time (a retention's pruning);
 * how many rows went in *ret_n. */
int sqldb_delete_before(sqlite3 *sql, const char *text, int64_t before, int64_t *ret_n);

static inline void sqldb_finalizep(sqlite3_stmt **s) {
        if (*s)
                sqlite3_finalize(*s);
}
#define _cleanup_stmt_ __attribute__((cleanup(sqldb_finalizep)))

/* A statement a handle keeps prepared across calls (made under its lock,
 * finalized by the handle's close with sqldb_finalizep): each use rewinds
 * it at its end, its bindings (a caller's strings) dropped with its row. */
static inline void sqldb_rewindp(sqlite3_stmt **s) {
        if (*s) {
                sqlite3_reset(*s);
                sqlite3_clear_bindings(*s);
        }
}
#define _rewind_stmt_ __attribute__((cleanup(sqldb_rewindp)))

/* Binds v, or NULL when v is NULL or empty (an optional text column). */
static inline void sqldb_bind_opt(sqlite3_stmt *st, int i, const char *v) {
        if (v && *v)
                sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
        else
                sqlite3_bind_null(st, i);
}

/* A text column, NULL for SQL NULL. */
static inline const char *sqldb_col(sqlite3_stmt *st, int i) {
        const unsigned char *t = sqlite3_column_text(st, i);
        return t ? (const char *)t : NULL;
}

static inline void sqldb_unlockp(pthread_mutex_t **m) {
        if (*m)
                pthread_mutex_unlock(*m);
}
/* Holds x->lock until the end of the scope. */
#define LOCKED(x)                                                                                           \
        pthread_mutex_lock(&(x)->lock);                                                                     \
        __attribute__((cleanup(sqldb_unlockp), unused)) pthread_mutex_t *_held_ = &(x)->lock

/* One step of a kind's schema history. A step that adds a column names it
 * (table, column) and is skipped when the column is there already, for
 * databases that gained it before the versions were kept. */
typedef struct SqlMigration {
        const char *table, *column; /* the column the step adds, or NULL */
        const char *sql;
} SqlMigration;
/* Brings a kind's tables to the last of its n steps, in one transaction
 * (another process opening the file at once waits, then finds them done):
 * the table store_versions keeps each kind's version. -EPROTONOSUPPORT when
 * the database is of a later version than the steps know (a newer daemon
 * wrote it). Steps are only ever appended. */
int sqldb_migrate(sqlite3 *sql, const char *kind, const SqlMigration *steps, size_t n);

/* What every SQLite kind's handle starts with: its connection and the lock
 * that keeps its statements from interleaving. */
typedef struct SqlHandle {
        sqlite3 *sql;
        pthread_mutex_t lock;
} SqlHandle;
/* A kind's handle of size bytes (zeroed, a SqlHandle first), its
 * connection opened at path and its kind's steps run (n 0: none). */
int sqldb_handle_open(const char *path, const char *kind, const SqlMigration *steps, size_t n, size_t size,
                      void **ret);
/* Closes and frees what sqldb_handle_open made; NULL is fine. */
void sqldb_handle_close(void *h);
