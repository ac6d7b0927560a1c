/* The previews in PostgreSQL (store_previews.h): the SQLite backend's
 * statements in PostgreSQL's words, on the table every host shares. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_previews.h"

struct StorePreviews {
        PgConn c;
};

#define COLUMNS "sandbox_id, port, owner, public, secret, created_at, rotated_at, expires_at, embed_origins"

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_previews_open(const char *location, StorePreviews **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_previews_close(StorePreviews *h) {
        pgdb_handle_close(h);
}

static int pg_previews_set_writer(StorePreviews *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static void row_of(const PGresult *res, int i, StorePreview *p) {
        *p = (StorePreview){ .port = (unsigned)pgi(res, i, 1), .public = pgi(res, i, 3) != 0,
                             .created_at = pgi(res, i, 5), .rotated_at = pgi(res, i, 6),
                             .expires_at = pgi(res, i, 7) };
        snprintf(p->sandbox_id, sizeof p->sandbox_id, "%s", pgv(res, i, 0) ?: "");
        snprintf(p->owner, sizeof p->owner, "%s", pgv(res, i, 2) ?: "");
        snprintf(p->secret, sizeof p->secret, "%s", pgv(res, i, 4) ?: "");
        snprintf(p->embed_origins, sizeof p->embed_origins, "%s", pgv(res, i, 8) ?: "");
}

static int pg_previews_get(StorePreviews *h, const char *sandbox_id, unsigned port, StorePreview *ret) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        pgp_int(&p, port);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT " COLUMNS " FROM previews WHERE sandbox_id = $1 AND port = $2", &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        row_of(res, 0, ret);
        return 0;
}

static int pg_previews_put(StorePreviews *h, const StorePreview *v, bool set_embed, StorePreview *ret) {
        PgParams p = { 0 };
        pgp_text(&p, v->sandbox_id);
        pgp_int(&p, v->port);
        pgp_text(&p, v->owner);
        pgp_int(&p, v->public);
        pgp_text(&p, v->secret);
        pgp_int(&p, v->created_at);
        pgp_int(&p, v->rotated_at);
        pgp_int(&p, v->expires_at);
        pgp_text(&p, v->embed_origins);
        pgp_bool(&p, set_embed);
        int r = pgdb_exec_write(&h->c,
                                "INSERT INTO previews (" COLUMNS ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
                                "ON CONFLICT (sandbox_id, port) DO UPDATE SET "
                                "public = EXCLUDED.public, expires_at = EXCLUDED.expires_at, "
                                "embed_origins = CASE WHEN $10::boolean THEN EXCLUDED.embed_origins "
                                "ELSE previews.embed_origins END",
                                &p, NULL);
        return r < 0 ? r : pg_previews_get(h, v->sandbox_id, v->port, ret);
}

static int pg_previews_list(StorePreviews *h, const char *sandbox_id, StorePreview **ret, size_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT " COLUMNS " FROM previews WHERE sandbox_id = $1 ORDER BY port", &p, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        StorePreview *all = calloc(n > 0 ? (size_t)n : 1, sizeof(*all));
        if (!all)
                return -ENOMEM;
        for (int i = 0; i < n; i++)
                row_of(res, i, &all[i]);
        *ret = all;
        *ret_n = (size_t)n;
        return 0;
}

static int pg_previews_rotate(StorePreviews *h, const char *sandbox_id, unsigned port, const char *sealed,
                              int64_t now) {
        PgParams p = { 0 };
        pgp_text(&p, sealed);
        pgp_int(&p, now);
        pgp_text(&p, sandbox_id);
        pgp_int(&p, port);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c,
                                "UPDATE previews SET secret = $1, rotated_at = $2 WHERE sandbox_id = $3 AND port = $4",
                                &p, &affected);
        if (r < 0)
                return r;
        return affected > 0 ? 0 : -ENOENT;
}

static int pg_previews_remove(StorePreviews *h, const char *sandbox_id, unsigned port) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        if (port)
                pgp_int(&p, port);
        int64_t affected = 0;
        int r = pgdb_exec_write(&h->c,
                                port ? "DELETE FROM previews WHERE sandbox_id = $1 AND port = $2"
                                     : "DELETE FROM previews WHERE sandbox_id = $1",
                                &p, &affected);
        if (r < 0)
                return r;
        return port && affected == 0 ? -ENOENT : 0;
}

const StorePreviewOps store_postgres_previews = {
        .open = pg_previews_open,
        .close = pg_previews_close,
        .set_writer = pg_previews_set_writer,
        .put = pg_previews_put,
        .get = pg_previews_get,
        .list = pg_previews_list,
        .rotate = pg_previews_rotate,
        .remove = pg_previews_remove,
};
