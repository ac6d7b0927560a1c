#include "daemon/store/pgdb.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

bool pgdb_is_url(const char *location) {
        return location && (strncmp(location, "postgresql://", 13) == 0 || strncmp(location, "postgres://", 11) == 0);
}

int pgdb_errno(const PGresult *res) {
        if (!res)
                return -ENOMEM;
        ExecStatusType st = PQresultStatus(res);
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_EMPTY_QUERY)
                return 0;
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (!state)
                return -ENOTCONN; /* no server answer: the connection is gone */
        if (strcmp(state, "23505") == 0)
                return -EEXIST;
        if (strncmp(state, "23", 2) == 0)
                return -EINVAL;
        if (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0)
                return -EAGAIN;
        if (strncmp(state, "08", 2) == 0 || strcmp(state, "57P01") == 0 || strcmp(state, "57P02") == 0 ||
            strcmp(state, "57P03") == 0 || strcmp(state, "25006") == 0)
                return -ENOTCONN; /* connection, shutdown, or a standby that cannot write */
        if (strcmp(state, "53100") == 0)
                return -ENOSPC;
        if (strcmp(state, "57014") == 0)
                return -ETIMEDOUT;
        return -EIO;
}

/* The server's notices ("already exists, skipping") are not the log's. */
static void quiet(void *arg, const char *message) {
}

/* A connection to url, with bounds on how long a dead server or a cut link
 * can hold it: libpq waits forever by default, for a connect and for an
 * answer. The URL's own settings come after these and win. */
static PGconn *connect_bounded(const char *url) {
        static const char *const keys[] = { "connect_timeout", "keepalives", "keepalives_idle",
                                             "keepalives_interval", "keepalives_count", "tcp_user_timeout",
                                             "dbname", NULL };
        const char *values[] = { PGDB_CONNECT_TIMEOUT_S, "1", "5", "2", "3", PGDB_TCP_USER_TIMEOUT_MS, url, NULL };
        return PQconnectdbParams(keys, values, 1);
}

int pgdb_open(const char *url, PgConn *ret) {
        PGconn *pg = connect_bounded(url);
        if (!pg)
                return -ENOMEM;
        if (PQstatus(pg) != CONNECTION_OK) {
                log_error(NULL, "connecting to the database: %s", PQerrorMessage(pg));
                PQfinish(pg);
                return -ENOTCONN;
        }
        PQsetNoticeProcessor(pg, quiet, NULL);
        int r = pgdb_schema(pg);
        if (r < 0) {
                PQfinish(pg);
                return r;
        }
        ret->pg = pg;
        ret->writer[0] = '\0';
        ret->writer_epoch = 0;
        pthread_mutex_init(&ret->lock, NULL);
        return 0;
}

int pgdb_handle_open(const char *url, size_t size, void **ret) {
        PgConn *h = calloc(1, size);
        if (!h)
                return -ENOMEM;
        int r = pgdb_open(url, h);
        if (r < 0) {
                free(h);
                return r;
        }
        *ret = h;
        return 0;
}

void pgdb_handle_close(void *h) {
        if (!h)
                return;
        pgdb_close(h);
        free(h);
}

void pgdb_close(PgConn *c) {
        if (!c || !c->pg)
                return;
        PQfinish(c->pg);
        c->pg = NULL;
        pthread_mutex_destroy(&c->lock);
}

static void add(PgParams *p, const char *v) {
        if (p->n < PGDB_MAX_PARAMS)
                p->v[p->n] = v;
        p->n++;
}

void pgp_text(PgParams *p, const char *s) {
        add(p, s);
}

void pgp_int(PgParams *p, int64_t v) {
        if (p->n < PGDB_MAX_PARAMS) {
                snprintf(p->num[p->n], sizeof(p->num[p->n]), "%" PRId64, v);
                add(p, p->num[p->n]);
        } else
                p->n++;
}

void pgp_opt_int(PgParams *p, int64_t v) {
        if (v)
                pgp_int(p, v);
        else
                add(p, NULL);
}

void pgp_bool(PgParams *p, bool v) {
        add(p, v ? "true" : "false");
}

int pgdb_run_locked(PgConn *c, const char *sql, const PgParams *p, PGresult **ret) {
        if (p && p->n > PGDB_MAX_PARAMS)
                return -E2BIG;
        /* Without parameters, the simple protocol: a migration's step is
         * several statements, which the extended protocol refuses. */
        PGresult *res = p ? PQexecParams(c->pg, sql, p->n, NULL, p->v, NULL, NULL, 0) : PQexec(c->pg, sql);
        /* No result at all from a connection that is gone is that, not a
         * lack of memory. */
        int r = !res && PQstatus(c->pg) == CONNECTION_BAD ? -ENOTCONN : pgdb_errno(res);
        if (r < 0) {
                if (r != -EEXIST && r != -EAGAIN)
                        log_debug(NULL, "database: %s", res ? PQresultErrorMessage(res) : "out of memory");
                PQclear(res);
                return r;
        }
        if (ret)
                *ret = res;
        else
                PQclear(res);
        return 0;
}

int pgdb_exec_locked(PgConn *c, const char *sql, const PgParams *p) {
        return pgdb_run_locked(c, sql, p, NULL);
}

int pgdb_run(PgConn *c, const char *sql, const PgParams *p, PGresult **ret) {
        pthread_mutex_lock(&c->lock);
        /* Lost before (the server was away): try it anew, once. */
        bool was_lost = PQstatus(c->pg) == CONNECTION_BAD;
        if (was_lost)
                PQreset(c->pg);
        int r = pgdb_run_locked(c, sql, p, ret);
        /* Lost now (the server restarted, a failover): reset once and run
         * it again, for a single statement is whole or not at all. */
        if (r == -ENOTCONN && !was_lost && PQstatus(c->pg) == CONNECTION_BAD) {
                PQreset(c->pg);
                if (PQstatus(c->pg) == CONNECTION_OK)
                        r = pgdb_run_locked(c, sql, p, ret);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

int pgdb_exec(PgConn *c, const char *sql, const PgParams *p) {
        return pgdb_run(c, sql, p, NULL);
}

int pgdb_delete_before(PgConn *c, const char *sql, int64_t before, int64_t *ret_n) {
        PgParams p = { 0 };
        pgp_int(&p, before);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(c, sql, &p, &res);
        if (r < 0)
                return r;
        *ret_n = strtoll(PQcmdTuples(res), NULL, 10);
        return 0;
}

#define PGDB_TX_TRIES 8

int pgdb_transaction(PgConn *c, PgTxFn fn, void *userdata) {
        pthread_mutex_lock(&c->lock);
        int r = -EAGAIN;
        for (int i = 0; i < PGDB_TX_TRIES && r == -EAGAIN; i++) {
                if (PQstatus(c->pg) == CONNECTION_BAD)
                        PQreset(c->pg);
                r = pgdb_exec_locked(c, "BEGIN ISOLATION LEVEL SERIALIZABLE", NULL);
                if (r < 0)
                        continue;
                r = fn(c, userdata);
                if (r >= 0)
                        r = pgdb_exec_locked(c, "COMMIT", NULL);
                else
                        (void)pgdb_exec_locked(c, "ROLLBACK", NULL);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

const char *pgv(const PGresult *r, int row, int col) {
        return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

int64_t pgi(const PGresult *r, int row, int col) {
        const char *v = pgv(r, row, col);
        return v ? strtoll(v, NULL, 10) : 0;
}

bool pgnull(const PGresult *r, int row, int col) {
        return PQgetisnull(r, row, col);
}

int pgdb_writer_live_locked(PgConn *c, const char *host, int64_t epoch) {
        if (!host || !host[0])
                return 0;
        PgParams p = { 0 };
        pgp_text(&p, host);
        pgp_int(&p, epoch);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c, "SELECT " WRITER_LIVE("$1", "$2"), &p, &res);
        if (r < 0)
                return r;
        const char *v = PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : NULL;
        return v && strcmp(v, "t") == 0 ? 0 : -EOWNERDEAD;
}

int pgdb_set_writer(PgConn *c, const char *host, int64_t epoch) {
        if (!host || strlen(host) >= sizeof(c->writer) || epoch < 0)
                return -EINVAL;
        pthread_mutex_lock(&c->lock);
        snprintf(c->writer, sizeof(c->writer), "%s", host);
        c->writer_epoch = epoch;
        pthread_mutex_unlock(&c->lock);
        return 0;
}

void pgp_conn_writer(PgParams *p, PgConn *c, char buf[64]) {
        pthread_mutex_lock(&c->lock);
        int64_t epoch = c->writer_epoch;
        snprintf(buf, 64, "%s", c->writer);
        pthread_mutex_unlock(&c->lock);
        pgp_text(p, epoch > 0 && buf[0] ? buf : NULL);
        pgp_int(p, epoch);
}

typedef struct Write {
        PgTxFn fn;
        void *userdata;
        const char *sql;
        const PgParams *p;
        int64_t affected;
} Write;

static int write_tx(PgConn *c, void *userdata) {
        Write *w = userdata;
        int r = c->writer_epoch > 0 ? pgdb_writer_live_locked(c, c->writer, c->writer_epoch) : 0;
        if (r < 0)
                return r;
        if (w->fn)
                return w->fn(c, w->userdata);
        _cleanup_pgres_ PGresult *res = NULL;
        r = pgdb_run_locked(c, w->sql, w->p, &res);
        if (r == 0)
                w->affected = strtoll(PQcmdTuples(res), NULL, 10);
        return r;
}

int pgdb_write(PgConn *c, PgTxFn fn, void *userdata) {
        Write w = { .fn = fn, .userdata = userdata };
        return pgdb_transaction(c, write_tx, &w);
}

int pgdb_exec_write(PgConn *c, const char *sql, const PgParams *p, int64_t *ret_affected) {
        pthread_mutex_lock(&c->lock);
        bool checked = c->writer_epoch > 0;
        pthread_mutex_unlock(&c->lock);
        Write w = { .sql = sql, .p = p };
        int r;
        if (checked)
                r = pgdb_transaction(c, write_tx, &w);
        else {
                _cleanup_pgres_ PGresult *res = NULL;
                r = pgdb_run(c, sql, p, &res);
                if (r == 0)
                        w.affected = strtoll(PQcmdTuples(res), NULL, 10);
        }
        if (r == 0 && ret_affected)
                *ret_affected = w.affected;
        return r;
}
