/* The uploads in SQLite. The tables uploads and upload_parts are made by
 * the daemon's migrations (db.c's migrations[], which has shipped: a change
 * to them is a migration appended there); this file holds only the
 * statements. A part's row refers to its upload's (ON DELETE CASCADE), so an
 * upload's parts go with it. */
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/sqldb.h"
#include "daemon/store/store_uploads.h"

struct StoreUploads {
        sqlite3 *sql;
        pthread_mutex_t lock; /* one transaction at a time on this connection */
};

static const char *const user_names[] = { [REQ_AS_DEFAULT] = "default", [REQ_AS_SANDBOX] = "sandbox",
                                          [REQ_AS_ROOT] = "root" };

static int sqlite_uploads_open(const char *location, StoreUploads **ret) {
        /* Each commit reaches the disk before it returns: a part is
         * acknowledged only once it would survive the host. */
        sqlite3 *sql = NULL;
        int r = sqldb_open_durable(location, &sql);
        if (r < 0)
                return r;
        StoreUploads *h = calloc(1, sizeof(*h));
        if (!h) {
                sqlite3_close(sql);
                return -ENOMEM;
        }
        h->sql = sql;
        pthread_mutex_init(&h->lock, NULL);
        *ret = h;
        return 0;
}

static void sqlite_uploads_close(StoreUploads *h) {
        sqldb_handle_close(h);
}

/* One host writes an SQLite database: no epoch to check. */
static int sqlite_uploads_set_writer(StoreUploads *h, const char *host_id, int64_t epoch) {
        return 0;
}

static int sqlite_uploads_insert(StoreUploads *h, const StoreUpload *u) {
        if ((unsigned)u->user >= ELEMENTSOF(user_names))
                return -EINVAL;
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "INSERT INTO uploads (id, sandbox_id, owner, kind, path, user, mode, size, sha256, "
                               "chunk_bytes, parts, created_at, touched_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, u->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, u->sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, u->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, u->archive ? "archive" : "file", -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, u->path, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 6, user_names[u->user], -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 7, (int)u->mode);
        if (u->archive) {
                sqlite3_bind_null(st, 8);
                sqlite3_bind_null(st, 9);
        } else {
                sqlite3_bind_int64(st, 8, u->size);
                if (u->has_sha256)
                        sqlite3_bind_blob(st, 9, u->sha256, 32, SQLITE_STATIC);
                else
                        sqlite3_bind_null(st, 9);
        }
        sqlite3_bind_int64(st, 10, u->chunk_bytes);
        sqlite3_bind_int64(st, 11, u->parts);
        sqlite3_bind_int64(st, 12, u->created_at);
        sqlite3_bind_int64(st, 13, u->touched_at);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_uploads_record_part(StoreUploads *h, const char *id, uint64_t index, uint64_t bytes,
                                      int64_t now) {
        LOCKED(h);
        int rc = sqldb_exec(h->sql, "BEGIN IMMEDIATE");
        _cleanup_stmt_ sqlite3_stmt *part = NULL, *touch = NULL;
        if (rc == 0 &&
            (sqlite3_prepare_v2(h->sql, "INSERT OR REPLACE INTO upload_parts (upload_id, part, bytes) VALUES (?,?,?)",
                                -1, &part, NULL) != SQLITE_OK ||
             sqlite3_prepare_v2(h->sql, "UPDATE uploads SET touched_at = ? WHERE id = ?", -1, &touch, NULL) !=
                     SQLITE_OK))
                rc = -EIO;
        if (rc == 0) {
                sqlite3_bind_text(part, 1, id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(part, 2, (sqlite3_int64)index);
                sqlite3_bind_int64(part, 3, (sqlite3_int64)bytes);
                sqlite3_bind_int64(touch, 1, now);
                sqlite3_bind_text(touch, 2, id, -1, SQLITE_STATIC);
                /* The foreign key refuses a part of an upload that went. */
                if ((rc = sqldb_errno(sqlite3_step(part))) == -EEXIST)
                        rc = -ENOENT;
                if (rc == 0)
                        rc = sqldb_errno(sqlite3_step(touch));
        }
        if (rc == 0)
                rc = sqldb_exec(h->sql, "COMMIT");
        if (rc < 0)
                (void)sqldb_exec(h->sql, "ROLLBACK");
        return rc;
}

static int delete_where(StoreUploads *h, const char *text, const char *arg) {
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, text, -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
        return sqldb_errno(sqlite3_step(st));
}

static int sqlite_uploads_remove(StoreUploads *h, const char *id) {
        return delete_where(h, "DELETE FROM uploads WHERE id = ?", id);
}

static int sqlite_uploads_remove_sandbox(StoreUploads *h, const char *sandbox_id) {
        return delete_where(h, "DELETE FROM uploads WHERE sandbox_id = ?", sandbox_id);
}

static const char *col_text(sqlite3_stmt *st, int col) {
        const unsigned char *t = sqlite3_column_text(st, col);
        return t ? (const char *)t : "";
}

/* The parts recorded for an upload, into *parts (grown as needed). */
static int parts_read(StoreUploads *h, const char *id, StoreUploadPart **parts, size_t *cap, size_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql, "SELECT part, bytes FROM upload_parts WHERE upload_id = ?", -1, &st, NULL) !=
            SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        size_t n = 0;
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == *cap) {
                        size_t want = *cap ? *cap * 2 : 64;
                        StoreUploadPart *grown = reallocarray(*parts, want, sizeof(**parts));
                        if (!grown)
                                return -ENOMEM;
                        *parts = grown;
                        *cap = want;
                }
                (*parts)[n++] = (StoreUploadPart){ .index = sqlite3_column_int64(st, 0),
                                                   .bytes = sqlite3_column_int64(st, 1) };
        }
        if (rc != SQLITE_DONE)
                return sqldb_errno(rc) ?: -EIO;
        *ret_n = n;
        return 0;
}

/* A row of the listing's statement. */
static StoreUploadListed listed_of(sqlite3_stmt *st) {
        const char *kind = col_text(st, 3), *user = col_text(st, 5);
        StoreUploadListed l = {
                .row = {
                        .id = col_text(st, 0),
                        .sandbox_id = col_text(st, 1),
                        .owner = col_text(st, 2),
                        .archive = strcmp(kind, "archive") == 0,
                        .path = col_text(st, 4),
                        .user = strcmp(user, "root") == 0      ? REQ_AS_ROOT
                                : strcmp(user, "sandbox") == 0 ? REQ_AS_SANDBOX
                                                               : REQ_AS_DEFAULT,
                        .mode = (unsigned)sqlite3_column_int(st, 6),
                        .size = sqlite3_column_int64(st, 7),
                        .has_sha256 = sqlite3_column_bytes(st, 8) == 32,
                        .chunk_bytes = sqlite3_column_int64(st, 9),
                        .parts = sqlite3_column_int64(st, 10),
                        .created_at = sqlite3_column_int64(st, 11),
                        .touched_at = sqlite3_column_int64(st, 12),
                },
                .sandbox_live = sqlite3_column_int(st, 13) != 0,
        };
        if (l.row.has_sha256)
                memcpy(l.row.sha256, sqlite3_column_blob(st, 8), 32);
        return l;
}

static int sqlite_uploads_list(StoreUploads *h, StoreUploadEach each, void *userdata) {
        _cleanup_free_ StoreUploadPart *parts = NULL;
        size_t cap = 0;
        LOCKED(h);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h->sql,
                               "SELECT u.id, u.sandbox_id, u.owner, u.kind, u.path, u.user, u.mode, u.size, "
                               "u.sha256, u.chunk_bytes, u.parts, u.created_at, u.touched_at, "
                               "s.id IS NOT NULL AND s.deleted_at IS NULL "
                               "FROM uploads u LEFT JOIN sandboxes s ON s.id = u.sandbox_id "
                               "ORDER BY u.created_at, u.id",
                               -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        int rc, r;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                StoreUploadListed l = listed_of(st);
                if ((r = parts_read(h, l.row.id, &parts, &cap, &l.n_parts)) < 0)
                        return r;
                l.parts = parts;
                if ((r = each(&l, userdata)) < 0)
                        return r;
        }
        return rc == SQLITE_DONE ? 0 : sqldb_errno(rc) ?: -EIO;
}

const StoreUploadOps store_sqlite_uploads = {
        .open = sqlite_uploads_open,
        .close = sqlite_uploads_close,
        .insert = sqlite_uploads_insert,
        .set_writer = sqlite_uploads_set_writer,
        .record_part = sqlite_uploads_record_part,
        .remove = sqlite_uploads_remove,
        .remove_sandbox = sqlite_uploads_remove_sandbox,
        .list = sqlite_uploads_list,
};
