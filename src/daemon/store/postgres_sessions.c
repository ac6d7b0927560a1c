/* The sandboxes' sessions in PostgreSQL (store_sessions.h): the SQLite
 * backend's statements in PostgreSQL's words, on the table every host
 * shares. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store_sessions.h"

struct StoreSessions {
        PgConn c;
};

#define COLUMNS "id, sandbox_id, owner, token_hash, key_hash, name, origins, created_at, expires_at, revoked_at"

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_sessions_open(const char *location, StoreSessions **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_sessions_close(StoreSessions *h) {
        pgdb_handle_close(h);
}

static int pg_sessions_set_writer(StoreSessions *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static void row_of(const PGresult *res, int i, StoreSession *s) {
        *s = (StoreSession){ .created_at = pgi(res, i, 7), .expires_at = pgi(res, i, 8),
                             .revoked_at = pgi(res, i, 9) };
        snprintf(s->id, sizeof s->id, "%s", pgv(res, i, 0) ?: "");
        snprintf(s->sandbox_id, sizeof s->sandbox_id, "%s", pgv(res, i, 1) ?: "");
        snprintf(s->owner, sizeof s->owner, "%s", pgv(res, i, 2) ?: "");
        snprintf(s->token_hash, sizeof s->token_hash, "%s", pgv(res, i, 3) ?: "");
        snprintf(s->key_hash, sizeof s->key_hash, "%s", pgv(res, i, 4) ?: "");
        snprintf(s->name, sizeof s->name, "%s", pgv(res, i, 5) ?: "");
        snprintf(s->origins, sizeof s->origins, "%s", pgv(res, i, 6) ?: "");
}

static int pg_sessions_insert(StoreSessions *h, const StoreSession *s) {
        PgParams p = { 0 };
        const char *texts[] = { s->id, s->sandbox_id, s->owner, s->token_hash, s->key_hash, s->name, s->origins };
        for (size_t i = 0; i < ELEMENTSOF(texts); i++)
                pgp_text(&p, texts[i]);
        pgp_int(&p, s->created_at);
        pgp_int(&p, s->expires_at);
        pgp_int(&p, s->revoked_at);
        return pgdb_exec_write(&h->c,
                               "INSERT INTO sandbox_sessions (" COLUMNS ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                               &p, NULL);
}

static int one_row(StoreSessions *h, const char *sql, PgParams *p, StoreSession *ret) {
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, sql, p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        row_of(res, 0, ret);
        return 0;
}

static int pg_sessions_by_token(StoreSessions *h, const char *token_hash, StoreSession *ret) {
        PgParams p = { 0 };
        pgp_text(&p, token_hash);
        return one_row(h, "SELECT " COLUMNS " FROM sandbox_sessions WHERE token_hash = $1", &p, ret);
}

static int pg_sessions_list(StoreSessions *h, const char *sandbox_id, const char *owner, int64_t since, size_t max,
                            StoreSession **ret, size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        pgp_text(&p, owner ? owner : "");
        pgp_int(&p, since);
        pgp_int(&p, (int64_t)max);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " COLUMNS " FROM sandbox_sessions WHERE sandbox_id = $1 AND ($2 = '' OR owner = $2) "
                         "AND (revoked_at = 0 OR revoked_at >= $3) AND expires_at >= $3 "
                         "ORDER BY created_at DESC, id DESC LIMIT $4",
                         &p, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        StoreSession *all = calloc(n > 0 ? (size_t)n : 1, sizeof(*all));
        if (!all)
                return -ENOMEM;
        for (int i = 0; i < n; i++)
                row_of(res, i, &all[i]);
        *ret = all;
        *ret_n = (size_t)n;
        return 0;
}

static int pg_sessions_count_active(StoreSessions *h, const char *sandbox_id, int64_t now, int64_t *ret) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        pgp_int(&p, now);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT COUNT(*) FROM sandbox_sessions WHERE sandbox_id = $1 AND revoked_at = 0 "
                         "AND expires_at > $2",
                         &p, &res);
        if (r < 0)
                return r;
        *ret = PQntuples(res) ? pgi(res, 0, 0) : 0;
        return 0;
}

static int pg_sessions_revoke(StoreSessions *h, const char *id, const char *sandbox_id, const char *owner, int64_t now,
                              StoreSession *ret) {
        PgParams p = { 0 };
        pgp_int(&p, now);
        pgp_text(&p, id);
        pgp_text(&p, sandbox_id);
        pgp_text(&p, owner);
        int r = pgdb_exec_write(&h->c,
                                "UPDATE sandbox_sessions SET revoked_at = $1 WHERE id = $2 AND sandbox_id = $3 "
                                "AND owner = $4 AND revoked_at = 0",
                                &p, NULL);
        if (r < 0)
                return r;
        PgParams q = { 0 };
        pgp_text(&q, id);
        pgp_text(&q, sandbox_id);
        pgp_text(&q, owner);
        return one_row(h, "SELECT " COLUMNS " FROM sandbox_sessions WHERE id = $1 AND sandbox_id = $2 AND owner = $3",
                       &q, ret);
}

const StoreSessionOps store_postgres_sessions = {
        .open = pg_sessions_open,
        .close = pg_sessions_close,
        .set_writer = pg_sessions_set_writer,
        .insert = pg_sessions_insert,
        .by_token = pg_sessions_by_token,
        .list = pg_sessions_list,
        .count_active = pg_sessions_count_active,
        .revoke = pg_sessions_revoke,
};
