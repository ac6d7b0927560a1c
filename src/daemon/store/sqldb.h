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
#include <sqlite3.h>
#include <stddef.h>

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

/* One step of a kind's schema history. A step that adds a column is skipped
 * when the column is there already: tables from before the versions were
 * kept gained their columns one ad-hoc ALTER TABLE at a time, so one may
 * have any of them. */
typedef struct SqldbMigration {
        const char *table, *column; /* the column the step adds, or NULL */
        const char *sql;
} SqldbMigration;
/* Brings the tables of kind to version n (the number of steps) and records
 * it in store_versions (kind TEXT PRIMARY KEY, version INTEGER), every step
 * in one transaction: another daemon opening the same file at once waits,
 * then finds the tables at their version. -EPROTONOSUPPORT when a newer
 * version wrote them. */
int sqldb_migrate(sqlite3 *sql, const char *kind, const SqldbMigration *steps, size_t n);

static inline void sqldb_finalizep(sqlite3_stmt **s) {
        if (*s)
                sqlite3_finalize(*s);
}
#define _cleanup_stmt_ __attribute__((cleanup(sqldb_finalizep)))

static inline void sqldb_unlockp(pthread_mutex_t **m) {
        if (*m)
                pthread_mutex_unlock(*m);
}
/* Holds x->lock until the end of the scope. */
#define LOCKED(x)                                                                                           \
        pthread_mutex_lock(&(x)->lock);                                                                     \
        __attribute__((cleanup(sqldb_unlockp), unused)) pthread_mutex_t *_held_ = &(x)->lock
