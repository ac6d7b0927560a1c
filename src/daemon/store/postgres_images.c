/* The images users build in PostgreSQL (store_images.h): the SQLite
 * backend's statements in PostgreSQL's words. Two hosts inserting a version
 * of one name at once: one takes the number, the other's unique violation
 * sends it round again for the next. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store_images.h"

struct StoreImages {
        PgConn c;
};

#define COLUMNS "id, owner, name, version, state, error, doc, created_at, finished_at, host_id"

static int pg_images_open(const char *location, StoreImages **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_images_close(StoreImages *h) {
        pgdb_handle_close(h);
}

static int pg_images_set_writer(StoreImages *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int row_read(const PGresult *res, int i, ImageRow *r) {
        *r = (ImageRow){ 0 };
        snprintf(r->id, sizeof r->id, "%s", pgv(res, i, 0) ?: "");
        r->owner = strdup(pgv(res, i, 1) ?: "");
        r->name = strdup(pgv(res, i, 2) ?: "");
        r->version = pgi(res, i, 3);
        snprintf(r->state, sizeof r->state, "%s", pgv(res, i, 4) ?: "");
        r->error = pgnull(res, i, 5) ? NULL : strdup(pgv(res, i, 5));
        r->doc = strdup(pgv(res, i, 6) ?: "{}");
        r->created_at = pgi(res, i, 7);
        r->finished_at = pgi(res, i, 8);
        snprintf(r->host_id, sizeof r->host_id, "%s", pgv(res, i, 9) ?: "");
        if (!r->owner || !r->name || !r->doc || (!pgnull(res, i, 5) && !r->error)) {
                store_image_row_clear(r);
                return -ENOMEM;
        }
        return 0;
}

typedef struct Insert {
        ImageRow *row;
} Insert;

/* The insert, inside the writer's check (pgdb_write). */
static int insert_tx(PgConn *c, void *userdata) {
        ImageRow *row = ((Insert *)userdata)->row;
        PgParams p = { 0 };
        pgp_text(&p, row->id);
        pgp_text(&p, row->owner);
        pgp_text(&p, row->name);
        pgp_text(&p, row->state);
        pgp_text(&p, row->error && *row->error ? row->error : NULL);
        pgp_text(&p, row->doc ? row->doc : "{}");
        pgp_int(&p, row->created_at);
        pgp_text(&p, row->host_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c,
                                "INSERT INTO images (id, owner, name, version, state, error, doc, created_at, host_id) "
                                "VALUES ($1, $2, $3, (SELECT COALESCE(MAX(version), 0) + 1 FROM images "
                                "WHERE owner = $2 AND name = $3), $4, $5, $6, $7, $8) RETURNING version",
                                &p, &res);
        if (r == 0 && PQntuples(res) == 1)
                row->version = pgi(res, 0, 0);
        return r;
}

static int pg_images_insert(StoreImages *h, ImageRow *row) {
        int r = -EEXIST;
        for (int attempt = 0; attempt < 5 && r == -EEXIST; attempt++) {
                /* A host that lost its epoch records no build. */
                r = pgdb_write(&h->c, insert_tx, &(Insert){ .row = row });
                if (r == -EEXIST) {
                        /* The id itself taken is not a race to go round for. */
                        ImageRow same;
                        PgParams q = { 0 };
                        pgp_text(&q, row->id);
                        _cleanup_pgres_ PGresult *got = NULL;
                        if (pgdb_run(&h->c, "SELECT " COLUMNS " FROM images WHERE id = $1", &q, &got) == 0 &&
                            PQntuples(got) == 1 && row_read(got, 0, &same) == 0) {
                                store_image_row_clear(&same);
                                return -EEXIST;
                        }
                }
        }
        return r;
}

static int pg_images_get(StoreImages *h, const char *owner, const char *id, ImageRow *ret) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT " COLUMNS " FROM images WHERE id = $1 AND ($2::text IS NULL OR owner = $2)",
                         &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        return row_read(res, 0, ret);
}

static int pg_images_list(StoreImages *h, const char *owner, const char *name, const char *state,
                          int64_t before_created, const char *before_id, unsigned limit, StoreImageFn fn,
                          void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, name);
        pgp_text(&p, state);
        pgp_int(&p, before_created);
        pgp_text(&p, before_id ? before_id : "");
        pgp_int(&p, limit);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT " COLUMNS " FROM images WHERE owner = $1 AND ($2::text IS NULL OR name = $2) "
                         "AND ($3::text IS NULL OR state = $3) "
                         "AND ($5 = '' OR created_at < $4 OR (created_at = $4 AND id < $5)) "
                         "ORDER BY created_at DESC, id DESC LIMIT $6",
                         &p, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++) {
                ImageRow row;
                int e = row_read(res, i, &row);
                if (e == 0) {
                        e = fn(userdata, &row);
                        store_image_row_clear(&row);
                }
                if (e < 0)
                        return e;
        }
        return 0;
}

static int pg_images_finish(StoreImages *h, const char *id, const char *state, const char *error, const char *doc,
                            int64_t finished_at) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, state);
        pgp_text(&p, error && *error ? error : NULL);
        pgp_text(&p, doc && *doc ? doc : NULL);
        pgp_int(&p, finished_at);
        int64_t n = 0;
        /* A build's end is written once, and only over a build that has
         * not ended: a late write of a host fenced meanwhile (its build
         * failed by the sweeper) changes nothing. */
        int r = pgdb_exec_write(&h->c,
                                "UPDATE images SET state = $2, error = $3, doc = COALESCE($4, doc), finished_at = $5 "
                                "WHERE id = $1 AND (state = 'queued' OR ($2 <> 'building' AND state = 'building'))",
                                &p, &n);
        if (r < 0)
                return r;
        return n == 1 ? 0 : -ENOENT;
}

/* The builds host_id left queued or building are failed with error; only
 * while the store has that host dead when dead_only. */
static int pg_images_fail_builds(StoreImages *h, const char *host_id, const char *error, int64_t now, bool dead_only,
                                 int64_t *ret_n) {
        PgParams p = { 0 };
        pgp_text(&p, host_id);
        pgp_text(&p, error);
        pgp_int(&p, now);
        return pgdb_exec_write(&h->c,
                               dead_only ? "UPDATE images SET state = 'failed', error = $2, finished_at = $3 "
                                           "WHERE host_id = $1 AND state IN ('queued', 'building') "
                                           "AND EXISTS (SELECT 1 FROM hosts WHERE hosts.id = $1 AND hosts.state = 'dead')"
                                         : "UPDATE images SET state = 'failed', error = $2, finished_at = $3 "
                                           "WHERE host_id = $1 AND state IN ('queued', 'building')",
                               &p, ret_n);
}

static int pg_images_fail_unfinished(StoreImages *h, const char *host_id, const char *error, int64_t now,
                                     int64_t *ret_n) {
        return pg_images_fail_builds(h, host_id, error, now, false, ret_n);
}

static int pg_images_fail_dead_host(StoreImages *h, const char *host_id, const char *error, int64_t now,
                                    int64_t *ret_n) {
        return pg_images_fail_builds(h, host_id, error, now, true, ret_n);
}

static int pg_images_tag(StoreImages *h, const char *owner, const char *name, const char *tag, const char *id) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, name);
        pgp_text(&p, tag);
        pgp_text(&p, id);
        return pgdb_exec_write(&h->c,
                               "INSERT INTO image_tags (owner, name, tag, image_id) VALUES ($1, $2, $3, $4) "
                               "ON CONFLICT (owner, name, tag) DO UPDATE SET image_id = EXCLUDED.image_id",
                               &p, NULL);
}

static int pg_images_untag(StoreImages *h, const char *id, const char *tag) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, tag);
        int64_t n = 0;
        int r = pgdb_exec_write(&h->c, "DELETE FROM image_tags WHERE image_id = $1 AND tag = $2", &p, &n);
        if (r < 0)
                return r;
        return n == 1 ? 0 : -ENOENT;
}

static int pg_images_tags(StoreImages *h, const char *id, StoreImageTagFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT tag FROM image_tags WHERE image_id = $1 ORDER BY tag", &p, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++)
                if ((r = fn(userdata, pgv(res, i, 0) ?: "")) < 0)
                        return r;
        return 0;
}

static int pg_images_resolve(StoreImages *h, const char *owner, const char *name, const char *tag, int64_t version,
                             char ret_id[IMAGE_ID_LEN + 1]) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, name);
        if (version)
                pgp_int(&p, version);
        else
                pgp_text(&p, tag);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         version ? "SELECT id FROM images WHERE owner = $1 AND name = $2 AND version = $3"
                                 : "SELECT image_id FROM image_tags WHERE owner = $1 AND name = $2 AND tag = $3",
                         &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        snprintf(ret_id, IMAGE_ID_LEN + 1, "%s", pgv(res, 0, 0) ?: "");
        return 0;
}

static int pg_images_delete(StoreImages *h, const char *owner, const char *id) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        pgp_text(&p, owner);
        int64_t n = 0;
        /* One statement: the tags go with the image or not at all. */
        int r = pgdb_exec_write(&h->c,
                                "WITH gone AS (DELETE FROM images WHERE id = $1 AND owner = $2 RETURNING id), "
                                "untagged AS (DELETE FROM image_tags WHERE image_id IN (SELECT id FROM gone)) "
                                "SELECT 1 FROM gone",
                                &p, &n);
        if (r < 0)
                return r;
        return n == 1 ? 0 : -ENOENT;
}

static int pg_images_registry_set(StoreImages *h, const char *owner, const char *registry, const char *username,
                                  const char *sealed, int64_t updated_at) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, registry);
        pgp_text(&p, username);
        pgp_text(&p, sealed);
        pgp_int(&p, updated_at);
        return pgdb_exec_write(&h->c,
                               "INSERT INTO image_registries (owner, registry, username, sealed, updated_at) "
                               "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (owner, registry) DO UPDATE SET "
                               "username = EXCLUDED.username, sealed = EXCLUDED.sealed, updated_at = EXCLUDED.updated_at",
                               &p, NULL);
}

static int pg_images_registry_list(StoreImages *h, const char *owner, StoreRegistryFn fn, void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT registry, username, updated_at FROM image_registries WHERE owner = $1 ORDER BY registry",
                         &p, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++)
                if ((r = fn(userdata, pgv(res, i, 0) ?: "", pgv(res, i, 1) ?: "", pgi(res, i, 2))) < 0)
                        return r;
        return 0;
}

static int pg_images_registry_get(StoreImages *h, const char *owner, const char *registry, char **ret_sealed) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, registry);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c, "SELECT sealed FROM image_registries WHERE owner = $1 AND registry = $2", &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        char *s = strdup(pgv(res, 0, 0) ?: "");
        if (!s)
                return -ENOMEM;
        *ret_sealed = s;
        return 0;
}

static int pg_images_registry_delete(StoreImages *h, const char *owner, const char *registry) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, registry);
        int64_t n = 0;
        int r = pgdb_exec_write(&h->c, "DELETE FROM image_registries WHERE owner = $1 AND registry = $2", &p, &n);
        if (r < 0)
                return r;
        return n == 1 ? 0 : -ENOENT;
}

static int pg_images_layer_put(StoreImages *h, const char *owner, const char *key, const char *snapshot_id,
                               const char *host_id, int64_t size_bytes, int64_t now) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, key);
        pgp_text(&p, snapshot_id);
        pgp_text(&p, host_id);
        pgp_int(&p, size_bytes);
        pgp_int(&p, now);
        int64_t n = 0;
        int r = pgdb_exec_write(&h->c,
                                "INSERT INTO image_layers (owner, key, snapshot_id, host_id, size_bytes, used_at) "
                                "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (owner, host_id, key) DO NOTHING",
                                &p, &n);
        if (r < 0)
                return r;
        return n == 1 ? 0 : -EEXIST;
}

static int pg_images_layer_use(StoreImages *h, const char *owner, const char *key, const char *host_id, int64_t now,
                               char **ret_snapshot) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, key);
        pgp_text(&p, host_id);
        pgp_int(&p, now);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "UPDATE image_layers SET used_at = $4 WHERE owner = $1 AND key = $2 AND host_id = $3 "
                         "RETURNING snapshot_id",
                         &p, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0)
                return -ENOENT;
        char *s = strdup(pgv(res, 0, 0) ?: "");
        if (!s)
                return -ENOMEM;
        *ret_snapshot = s;
        return 0;
}

static int pg_images_layer_list(StoreImages *h, const char *owner, const char *host_id, StoreLayerFn fn,
                                void *userdata) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, host_id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT key, snapshot_id, size_bytes, used_at FROM image_layers "
                         "WHERE owner = $1 AND host_id = $2 ORDER BY used_at, key",
                         &p, &res);
        if (r < 0)
                return r;
        for (int i = 0; i < PQntuples(res); i++)
                if ((r = fn(userdata, pgv(res, i, 0) ?: "", pgv(res, i, 1) ?: "", pgi(res, i, 2), pgi(res, i, 3))) < 0)
                        return r;
        return 0;
}

static int pg_images_layer_delete(StoreImages *h, const char *owner, const char *key, const char *host_id) {
        PgParams p = { 0 };
        pgp_text(&p, owner);
        pgp_text(&p, key);
        pgp_text(&p, host_id);
        int64_t n = 0;
        int r = pgdb_exec_write(&h->c, "DELETE FROM image_layers WHERE owner = $1 AND key = $2 AND host_id = $3", &p,
                                &n);
        if (r < 0)
                return r;
        return n == 1 ? 0 : -ENOENT;
}

const StoreImageOps store_postgres_images = {
        .open = pg_images_open,
        .close = pg_images_close,
        .set_writer = pg_images_set_writer,
        .insert = pg_images_insert,
        .get = pg_images_get,
        .list = pg_images_list,
        .finish = pg_images_finish,
        .fail_unfinished = pg_images_fail_unfinished,
        .fail_dead_host = pg_images_fail_dead_host,
        .tag = pg_images_tag,
        .untag = pg_images_untag,
        .tags = pg_images_tags,
        .resolve = pg_images_resolve,
        .delete = pg_images_delete,
        .registry_set = pg_images_registry_set,
        .registry_list = pg_images_registry_list,
        .registry_get = pg_images_registry_get,
        .registry_delete = pg_images_registry_delete,
        .layer_put = pg_images_layer_put,
        .layer_use = pg_images_layer_use,
        .layer_list = pg_images_layer_list,
        .layer_delete = pg_images_layer_delete,
};
