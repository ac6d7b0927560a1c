/* The images users build in the SQLite backend (store_images.h): a table of
 * images and one of tags; a version is taken by the insert's own statement,
 * a tag moved by one upsert. */
#include "daemon/store/store_images.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"

struct StoreImages {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection: its statements never interleave */
};

/* The images' history (sqldb.h's SqlMigration). */
static const SqlMigration migrations[] = {
        /* 1: the tables as first released */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS images ("
          "  id TEXT PRIMARY KEY,"
          "  owner TEXT NOT NULL,"
          "  name TEXT NOT NULL,"
          "  version INTEGER NOT NULL,"
          "  state TEXT NOT NULL,"
          "  error TEXT,"
          "  doc TEXT NOT NULL,"
          "  created_at INTEGER NOT NULL,"
          "  finished_at INTEGER NOT NULL DEFAULT 0,"
          "  host_id TEXT NOT NULL DEFAULT '',"
          "  UNIQUE (owner, name, version));"
          "CREATE INDEX IF NOT EXISTS images_owner ON images (owner, created_at, id);"
          "CREATE TABLE IF NOT EXISTS image_tags ("
          "  owner TEXT NOT NULL,"
          "  name TEXT NOT NULL,"
          "  tag TEXT NOT NULL,"
          "  image_id TEXT NOT NULL,"
          "  PRIMARY KEY (owner, name, tag));"
          "CREATE INDEX IF NOT EXISTS image_tags_image ON image_tags (image_id);" },
        /* 2: the owners' registry credentials, the secret sealed */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS image_registries ("
          "  owner TEXT NOT NULL,"
          "  registry TEXT NOT NULL,"
          "  username TEXT NOT NULL,"
          "  sealed TEXT NOT NULL,"
          "  updated_at INTEGER NOT NULL,"
          "  PRIMARY KEY (owner, registry));" },
        /* 3: the builds' per-step layers, each held by a snapshot */
        { NULL, NULL,
          "CREATE TABLE IF NOT EXISTS image_layers ("
          "  owner TEXT NOT NULL,"
          "  key TEXT NOT NULL,"
          "  snapshot_id TEXT NOT NULL,"
          "  host_id TEXT NOT NULL,"
          "  size_bytes INTEGER NOT NULL,"
          "  used_at INTEGER NOT NULL,"
          "  PRIMARY KEY (owner, key));"
          "CREATE INDEX IF NOT EXISTS image_layers_used ON image_layers (owner, host_id, used_at, key);" },
        /* 4: a layer's key is one host's (its snapshot is that host's
         * files): the key is unique per owner and host */
        { NULL, NULL,
          "CREATE TABLE image_layers_by_host ("
          "  owner TEXT NOT NULL,"
          "  key TEXT NOT NULL,"
          "  snapshot_id TEXT NOT NULL,"
          "  host_id TEXT NOT NULL,"
          "  size_bytes INTEGER NOT NULL,"
          "  used_at INTEGER NOT NULL,"
          "  PRIMARY KEY (owner, host_id, key));"
          "INSERT INTO image_layers_by_host SELECT owner, key, snapshot_id, host_id, size_bytes, used_at "
          "  FROM image_layers;"
          "DROP TABLE image_layers;"
          "ALTER TABLE image_layers_by_host RENAME TO image_layers;"
          "CREATE INDEX IF NOT EXISTS image_layers_used ON image_layers (owner, host_id, used_at, key);" },
};

#define COLUMNS "id, owner, name, version, state, error, doc, created_at, finished_at, host_id"

static int sqlite_images_open(const char *location, StoreImages **ret) {
        return sqldb_handle_open(location, "images", migrations, ELEMENTSOF(migrations), sizeof(**ret), (void **)ret);
}

static void sqlite_images_close(StoreImages *h) {
        sqldb_handle_close(h);
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_images_set_writer(StoreImages *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int row_read(sqlite3_stmt *st, ImageRow *r) {
        *r = (ImageRow){ 0 };
        snprintf(r->id, sizeof r->id, "%s", sqldb_col(st, 0) ?: "");
        r->owner = strdup(sqldb_col(st, 1) ?: "");
        r->name = strdup(sqldb_col(st, 2) ?: "");
        r->version = sqlite3_column_int64(st, 3);
        snprintf(r->state, sizeof r->state, "%s", sqldb_col(st, 4) ?: "");
        r->error = sqldb_col(st, 5) ? strdup(sqldb_col(st, 5)) : NULL;
        r->doc = strdup(sqldb_col(st, 6) ?: "{}");
        r->created_at = sqlite3_column_int64(st, 7);
        r->finished_at = sqlite3_column_int64(st, 8);
        snprintf(r->host_id, sizeof r->host_id, "%s", sqldb_col(st, 9) ?: "");
        if (!r->owner || !r->name || !r->doc || (sqldb_col(st, 5) && !r->error)) {
                store_image_row_clear(r);
                return -ENOMEM;
        }
        return 0;
}

static int sqlite_images_insert(StoreImages *h, ImageRow *row) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO images (id, owner, name, version, state, error, doc, created_at, host_id) "
                               "VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(version), 0) + 1 FROM images "
                               "WHERE owner = ?2 AND name = ?3), ?4, ?5, ?6, ?7, ?8) RETURNING version",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, row->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, row->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, row->name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, row->state, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 5, row->error);
        sqlite3_bind_text(st, 6, row->doc ? row->doc : "{}", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 7, row->created_at);
        sqlite3_bind_text(st, 8, row->host_id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        row->version = sqlite3_column_int64(st, 0);
        return 0;
}

static int sqlite_images_get(StoreImages *h, const char *owner, const char *id, ImageRow *ret) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT " COLUMNS " FROM images WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        if (owner)
                sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        return row_read(st, ret);
}

/* The rows of a listing, read under the lock and handed to fn after it, so
 * that fn may call the store again. */
static int list_locked(StoreImages *h, const char *owner, const char *name, const char *state, int64_t before_created,
                       const char *before_id, unsigned limit, ImageRow **ret, size_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT " COLUMNS " FROM images WHERE owner = ?1 AND (?2 IS NULL OR name = ?2) "
                               "AND (?3 IS NULL OR state = ?3) "
                               "AND (?5 = '' OR created_at < ?4 OR (created_at = ?4 AND id < ?5)) "
                               "ORDER BY created_at DESC, id DESC LIMIT ?6",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 2, name);
        sqldb_bind_opt(st, 3, state);
        sqlite3_bind_int64(st, 4, before_created);
        sqlite3_bind_text(st, 5, before_id ? before_id : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 6, limit);
        ImageRow *rows = calloc(limit ? limit : 1, sizeof(*rows));
        if (!rows)
                return -ENOMEM;
        size_t n = 0;
        int rc, e = 0;
        while (n < limit && (rc = sqlite3_step(st)) == SQLITE_ROW && (e = row_read(st, &rows[n])) == 0)
                n++;
        if (e == 0 && n < limit && rc != SQLITE_DONE)
                e = sqldb_errno(rc) ?: -EIO;
        if (e < 0) {
                for (size_t i = 0; i < n; i++)
                        store_image_row_clear(&rows[i]);
                free(rows);
                return e;
        }
        *ret = rows;
        *ret_n = n;
        return 0;
}

static int sqlite_images_list(StoreImages *h, const char *owner, const char *name, const char *state,
                              int64_t before_created, const char *before_id, unsigned limit, StoreImageFn fn,
                              void *userdata) {
        ImageRow *rows = NULL;
        size_t n = 0;
        int r = list_locked(h, owner, name, state, before_created, before_id, limit, &rows, &n);
        for (size_t i = 0; i < n; i++) {
                if (r == 0)
                        r = fn(userdata, &rows[i]);
                store_image_row_clear(&rows[i]);
        }
        free(rows);
        return r;
}

static int sqlite_images_finish(StoreImages *h, const char *id, const char *state, const char *error,
                                const char *doc, int64_t finished_at) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE images SET state = ?2, error = ?3, doc = COALESCE(?4, doc), finished_at = ?5 "
                               "WHERE id = ?1 AND (state = 'queued' OR (?2 <> 'building' AND state = 'building'))",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
        sqldb_bind_opt(st, 3, error);
        sqldb_bind_opt(st, 4, doc);
        sqlite3_bind_int64(st, 5, finished_at);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : -ENOENT;
}

static int sqlite_images_fail_unfinished(StoreImages *h, const char *host_id, const char *error, int64_t now,
                                         int64_t *ret_n) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE images SET state = 'failed', error = ?2, finished_at = ?3 "
                               "WHERE host_id = ?1 AND state IN ('queued', 'building')",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, host_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, error, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, now);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        *ret_n = sqlite3_changes(h->sql);
        return 0;
}

/* One host writes an SQLite database: no other declares it dead. */
static int sqlite_images_fail_dead_host(StoreImages *h, const char *host_id, const char *error, int64_t now,
                                        int64_t *ret_n) {
        *ret_n = 0;
        return 0;
}

static int sqlite_images_tag(StoreImages *h, const char *owner, const char *name, const char *tag, const char *id) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO image_tags (owner, name, tag, image_id) VALUES (?1, ?2, ?3, ?4) "
                               "ON CONFLICT (owner, name, tag) DO UPDATE SET image_id = excluded.image_id",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, tag, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, id, -1, SQLITE_STATIC);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_images_untag(StoreImages *h, const char *id, const char *tag) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "DELETE FROM image_tags WHERE image_id = ?1 AND tag = ?2", -1, &st, NULL) !=
            SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, tag, -1, SQLITE_STATIC);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : -ENOENT;
}

static int sqlite_images_tags(StoreImages *h, const char *id, StoreImageTagFn fn, void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT tag FROM image_tags WHERE image_id = ?1 ORDER BY tag", -1, &st, NULL) !=
            SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                int e = fn(userdata, sqldb_col(st, 0) ?: "");
                if (e < 0)
                        return e;
        }
        return rc == SQLITE_DONE ? 0 : sqldb_errno(rc) ?: -EIO;
}

static int sqlite_images_resolve(StoreImages *h, const char *owner, const char *name, const char *tag,
                                 int64_t version, char ret_id[IMAGE_ID_LEN + 1]) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        const char *q = version ? "SELECT id FROM images WHERE owner = ?1 AND name = ?2 AND version = ?3"
                                : "SELECT image_id FROM image_tags WHERE owner = ?1 AND name = ?2 AND tag = ?4";
        if (sqlite3_prepare_v2(h->sql, q, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        if (version)
                sqlite3_bind_int64(st, 3, version);
        else
                sqlite3_bind_text(st, 4, tag, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        snprintf(ret_id, IMAGE_ID_LEN + 1, "%s", sqldb_col(st, 0) ?: "");
        return 0;
}

static int sqlite_images_delete(StoreImages *h, const char *owner, const char *id) {
        LOCKED(h);
        int r = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *st = NULL, *tags = NULL;
        if (sqlite3_prepare_v2(h->sql, "DELETE FROM images WHERE id = ?1 AND owner = ?2", -1, &st, NULL) != SQLITE_OK ||
            sqlite3_prepare_v2(h->sql, "DELETE FROM image_tags WHERE image_id = ?1", -1, &tags, NULL) != SQLITE_OK)
                r = -EIO;
        if (r == 0) {
                sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
                r = sqldb_errno(sqlite3_step(st));
                if (r == 0 && sqlite3_changes(h->sql) != 1)
                        r = -ENOENT;
        }
        if (r == 0) {
                sqlite3_bind_text(tags, 1, id, -1, SQLITE_STATIC);
                r = sqldb_errno(sqlite3_step(tags));
        }
        int e = sqldb_exec(h->sql, r == 0 ? "COMMIT" : "ROLLBACK");
        return r < 0 ? r : e;
}

static int sqlite_images_registry_set(StoreImages *h, const char *owner, const char *registry, const char *username,
                                      const char *sealed, int64_t updated_at) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO image_registries (owner, registry, username, sealed, updated_at) "
                               "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (owner, registry) DO UPDATE SET "
                               "username = excluded.username, sealed = excluded.sealed, updated_at = excluded.updated_at",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, registry, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, username, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, sealed, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, updated_at);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_images_registry_list(StoreImages *h, const char *owner, StoreRegistryFn fn, void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT registry, username, updated_at FROM image_registries WHERE owner = ?1 "
                               "ORDER BY registry",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                int e = fn(userdata, sqldb_col(st, 0) ?: "", sqldb_col(st, 1) ?: "", sqlite3_column_int64(st, 2));
                if (e < 0)
                        return e;
        }
        return rc == SQLITE_DONE ? 0 : sqldb_errno(rc) ?: -EIO;
}

static int sqlite_images_registry_get(StoreImages *h, const char *owner, const char *registry, char **ret_sealed) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT sealed FROM image_registries WHERE owner = ?1 AND registry = ?2", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, registry, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        char *s = strdup(sqldb_col(st, 0) ?: "");
        if (!s)
                return -ENOMEM;
        *ret_sealed = s;
        return 0;
}

static int sqlite_images_registry_delete(StoreImages *h, const char *owner, const char *registry) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "DELETE FROM image_registries WHERE owner = ?1 AND registry = ?2", -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, registry, -1, SQLITE_STATIC);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : -ENOENT;
}

static int sqlite_images_layer_put(StoreImages *h, const char *owner, const char *key, const char *snapshot_id,
                                   const char *host_id, int64_t size_bytes, int64_t now) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO image_layers (owner, key, snapshot_id, host_id, size_bytes, used_at) "
                               "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (owner, host_id, key) DO NOTHING",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, snapshot_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, host_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, size_bytes);
        sqlite3_bind_int64(st, 6, now);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : -EEXIST;
}

static int sqlite_images_layer_use(StoreImages *h, const char *owner, const char *key, const char *host_id, int64_t now,
                                   char **ret_snapshot) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "UPDATE image_layers SET used_at = ?4 WHERE owner = ?1 AND key = ?2 AND host_id = ?3 "
                               "RETURNING snapshot_id",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, host_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, now);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc) ?: -EIO;
        char *s = strdup(sqldb_col(st, 0) ?: "");
        if (!s)
                return -ENOMEM;
        *ret_snapshot = s;
        return 0;
}

static int sqlite_images_layer_list(StoreImages *h, const char *owner, const char *host_id, StoreLayerFn fn,
                                    void *userdata) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT key, snapshot_id, size_bytes, used_at FROM image_layers "
                               "WHERE owner = ?1 AND host_id = ?2 ORDER BY used_at, key",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, host_id, -1, SQLITE_STATIC);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                int e = fn(userdata, sqldb_col(st, 0) ?: "", sqldb_col(st, 1) ?: "", sqlite3_column_int64(st, 2),
                           sqlite3_column_int64(st, 3));
                if (e < 0)
                        return e;
        }
        return rc == SQLITE_DONE ? 0 : sqldb_errno(rc) ?: -EIO;
}

static int sqlite_images_layer_delete(StoreImages *h, const char *owner, const char *key, const char *host_id) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "DELETE FROM image_layers WHERE owner = ?1 AND key = ?2 AND host_id = ?3", -1,
                               &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, host_id, -1, SQLITE_STATIC);
        int r = sqldb_errno(sqlite3_step(st));
        if (r < 0)
                return r;
        return sqlite3_changes(h->sql) == 1 ? 0 : -ENOENT;
}

const StoreImageOps store_sqlite_images = {
        .open = sqlite_images_open,
        .close = sqlite_images_close,
        .set_writer = sqlite_images_set_writer,
        .insert = sqlite_images_insert,
        .get = sqlite_images_get,
        .list = sqlite_images_list,
        .finish = sqlite_images_finish,
        .fail_unfinished = sqlite_images_fail_unfinished,
        .fail_dead_host = sqlite_images_fail_dead_host,
        .tag = sqlite_images_tag,
        .untag = sqlite_images_untag,
        .tags = sqlite_images_tags,
        .resolve = sqlite_images_resolve,
        .delete = sqlite_images_delete,
        .registry_set = sqlite_images_registry_set,
        .registry_list = sqlite_images_registry_list,
        .registry_get = sqlite_images_registry_get,
        .registry_delete = sqlite_images_registry_delete,
        .layer_put = sqlite_images_layer_put,
        .layer_use = sqlite_images_layer_use,
        .layer_list = sqlite_images_layer_list,
        .layer_delete = sqlite_images_layer_delete,
};
