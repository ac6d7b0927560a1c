/* The file links' secrets and one-time uses in PostgreSQL
 * (store_links.h): the SQLite backend's statements in PostgreSQL's words;
 * a use is claimed by its primary key, which every host shares. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_links.h"

struct StoreLinks {
        PgConn c;
};

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_links_open(const char *location, StoreLinks **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_links_close(StoreLinks *h) {
        pgdb_handle_close(h);
}

static int pg_links_set_writer(StoreLinks *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int pg_links_secret_get(StoreLinks *h, const char *sandbox_id, StoreLinkSecret *ret) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT owner, secret, rotated_at FROM file_link_secrets WHERE sandbox_id = $1", &p,
                         &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        StoreLinkSecret s = { .owner = strdup(pgv(res, 0, 0) ?: ""), .secret = strdup(pgv(res, 0, 1) ?: ""),
                              .rotated_at = pgi(res, 0, 2) };
        if (!s.owner || !s.secret) {
                store_link_secret_clear(&s);
                return -ENOMEM;
        }
        *ret = s;
        return 0;
}

static int secret_write(StoreLinks *h, const char *sql, const char *sandbox_id, const char *owner,
                        const char *sealed, int64_t now) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        pgp_text(&p, owner);
        pgp_text(&p, sealed);
        pgp_int(&p, now);
        return pgdb_exec_write(&h->c, sql, &p, NULL);
}

static int pg_links_secret_add(StoreLinks *h, const char *sandbox_id, const char *owner, const char *sealed,
                               int64_t now, StoreLinkSecret *ret) {
        int r = secret_write(h,
                             "INSERT INTO file_link_secrets (sandbox_id, owner, secret, rotated_at) "
                             "VALUES ($1, $2, $3, $4) ON CONFLICT (sandbox_id) DO NOTHING",
                             sandbox_id, owner, sealed, now);
        return r < 0 ? r : pg_links_secret_get(h, sandbox_id, ret);
}

static int pg_links_secret_rotate(StoreLinks *h, const char *sandbox_id, const char *owner, const char *sealed,
                                  int64_t now) {
        return secret_write(h,
                            "INSERT INTO file_link_secrets (sandbox_id, owner, secret, rotated_at) "
                            "VALUES ($1, $2, $3, $4) ON CONFLICT (sandbox_id) DO UPDATE SET "
                            "secret = EXCLUDED.secret, rotated_at = EXCLUDED.rotated_at",
                            sandbox_id, owner, sealed, now);
}

static int pg_links_use_once(StoreLinks *h, const char *link_id, const char *sandbox_id, int64_t expires_at,
                             int64_t now) {
        int64_t gone = 0, affected = 0;
        int r = pgdb_delete_before(&h->c, "DELETE FROM file_link_uses WHERE expires_at < $1", now, &gone);
        if (r < 0)
                return r;
        PgParams p = { 0 };
        pgp_text(&p, link_id);
        pgp_text(&p, sandbox_id);
        pgp_int(&p, expires_at);
        r = pgdb_exec_write(&h->c,
                            "INSERT INTO file_link_uses (link_id, sandbox_id, expires_at) VALUES ($1, $2, $3) "
                            "ON CONFLICT (link_id) DO NOTHING",
                            &p, &affected);
        if (r < 0)
                return r;
        return affected == 1 ? 0 : -EALREADY;
}

const StoreLinkOps store_postgres_links = {
        .open = pg_links_open,
        .close = pg_links_close,
        .set_writer = pg_links_set_writer,
        .secret_get = pg_links_secret_get,
        .secret_add = pg_links_secret_add,
        .secret_rotate = pg_links_secret_rotate,
        .use_once = pg_links_use_once,
};
