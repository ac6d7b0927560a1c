#pragma once
/*
 * The one way the daemon uses PostgreSQL (libpq), as sqldb.h is for SQLite:
 * every kind of the PostgreSQL backend opens its connection here, with one
 * policy: the URL as given (libpq's multi-host strings with
 * target_session_attrs=read-write follow a primary after a failover), the
 * schema made or migrated once per process (versioned, under an advisory
 * lock, so that hosts starting at once take turns), a mutex per connection
 * so that its transactions never interleave, and SQLSTATEs turned into
 * negative errnos.
 */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How long a connect may take, and how long sent data may go unacknowledged
 * on a cut link, before the connection counts as lost (its call answers
 * -ENOTCONN): the fleet's fence must not wait on a dead socket. */
#define PGDB_CONNECT_TIMEOUT_S "5"
#define PGDB_TCP_USER_TIMEOUT_MS "10000"

typedef struct PgConn {
        PGconn *pg;
        pthread_mutex_t lock; /* one statement or transaction at a time */
        /* Under lock: the host whose writes these are and the epoch it
         * registered at (pgdb_set_writer); epoch 0, no condition. */
        char writer[64];
        int64_t writer_epoch;
} PgConn;

/* Connects to url and makes or migrates the schema (pgdb_schema). */
int pgdb_open(const char *url, PgConn *ret);
void pgdb_close(PgConn *c);
/* A kind's handle: size bytes, zeroed, whose first member is a PgConn,
 * connected to url (pgdb_open); freed by pgdb_handle_close (NULL is fine). */
int pgdb_handle_open(const char *url, size_t size, void **ret);
void pgdb_handle_close(void *h);
/* The schema of every kind, version by version (postgres_schema.c). */
int pgdb_schema(PGconn *pg);

/* A negative errno for a result: 0 for a command or tuples; -EEXIST for a
 * unique violation, -EINVAL for another constraint, -EAGAIN for a
 * serialization failure or deadlock (run the transaction again),
 * -ENOTCONN when the connection is lost (the host answers 503), -ENOSPC for
 * a full disk, -ETIMEDOUT, else -EIO. */
int pgdb_errno(const PGresult *res);

/* Parameters of a statement, as text. */
#define PGDB_MAX_PARAMS 24
typedef struct PgParams {
        const char *v[PGDB_MAX_PARAMS];
        char num[PGDB_MAX_PARAMS][24];
        int n;
} PgParams;
void pgp_text(PgParams *p, const char *s); /* NULL: SQL NULL */
void pgp_int(PgParams *p, int64_t v);
void pgp_opt_int(PgParams *p, int64_t v); /* 0: SQL NULL */
void pgp_bool(PgParams *p, bool v);

/* Runs sql with p (NULL: none, and then sql may be several statements);
 * *ret the result when it has tuples or is a
 * command (cleared by the caller), else a negative errno and no result. A
 * lost connection is reset once before the error is returned. */
int pgdb_run(PgConn *c, const char *sql, const PgParams *p, PGresult **ret);
/* pgdb_run for a statement whose result is not wanted. */
int pgdb_exec(PgConn *c, const char *sql, const PgParams *p);
/* Runs a DELETE whose one parameter is a time (a retention's pruning);
 * how many rows went in *ret_n. */
int pgdb_delete_before(PgConn *c, const char *sql, int64_t before, int64_t *ret_n);

/* A transaction: fn runs between BEGIN (SERIALIZABLE) and COMMIT with the
 * connection's lock held, and the whole runs again on a serialization
 * failure, up to a few times; fn's negative return rolls back and is
 * returned. */
typedef int (*PgTxFn)(PgConn *c, void *userdata);
int pgdb_transaction(PgConn *c, PgTxFn fn, void *userdata);

/* The condition every write of a host's is made under once it registered
 * (a fleet), with the host and its epoch as parameters W and E (W NULL: no
 * condition, a single host): a host declared dead, or whose id registered
 * again since, writes nothing. */
#define WRITER_LIVE(W, E)                                                                                   \
        "(" W "::text IS NULL OR EXISTS (SELECT 1 FROM hosts WHERE hosts.id = " W " AND hosts.epoch = " E \
        "::bigint AND hosts.state <> 'dead'))"

/* Inside a transaction: 0 when host (NULL or "": no condition) is still
 * registered at epoch and not declared dead, -EOWNERDEAD when not. */
int pgdb_writer_live_locked(PgConn *c, const char *host, int64_t epoch);

/* The writes made through pgdb_write and pgdb_exec_write from now on are
 * host's at epoch (a fleet): each is made only while the host is still
 * registered at that epoch and not declared dead, and is -EOWNERDEAD,
 * changing nothing, otherwise. Epoch 0: no condition. -EINVAL for a host
 * id too long. */
int pgdb_set_writer(PgConn *c, const char *host, int64_t epoch);
/* The writer as parameters of a statement that puts WRITER_LIVE in its own
 * WHERE (one statement, no transaction): host (NULL without a writer) and
 * epoch, host copied into buf. */
void pgp_conn_writer(PgParams *p, PgConn *c, char buf[64]);
/* pgdb_transaction whose first step checks the writer (pgdb_set_writer). */
int pgdb_write(PgConn *c, PgTxFn fn, void *userdata);
/* One statement under the writer's check: pgdb_exec without a writer, a
 * transaction of the check and the statement with one. *ret_affected (may
 * be NULL) gets the rows the statement changed. */
int pgdb_exec_write(PgConn *c, const char *sql, const PgParams *p, int64_t *ret_affected);

/* Inside a transaction (the lock held): pgdb_run without taking it. */
int pgdb_run_locked(PgConn *c, const char *sql, const PgParams *p, PGresult **ret);
int pgdb_exec_locked(PgConn *c, const char *sql, const PgParams *p);

/* Column helpers: a text column (NULL for SQL NULL), an integer (0 for
 * NULL), and whether it is NULL. */
const char *pgv(const PGresult *r, int row, int col);
int64_t pgi(const PGresult *r, int row, int col);
bool pgnull(const PGresult *r, int row, int col);

static inline void pgdb_clearp(PGresult **r) {
        if (*r)
                PQclear(*r);
}
#define _cleanup_pgres_ __attribute__((cleanup(pgdb_clearp)))

/* Whether location names a PostgreSQL database (a postgresql:// or
 * postgres:// URL). */
bool pgdb_is_url(const char *location);
