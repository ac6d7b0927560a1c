/* The uploads in PostgreSQL (store_uploads.h): the SQLite backend's
 * statements in PostgreSQL's words, on the tables of postgres_schema.c. A
 * part's row refers to its upload's (ON DELETE CASCADE), so an upload's
 * parts go with it; a file's digest is BYTEA, handed over as hex. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store_uploads.h"

struct StoreUploads {
        PgConn c;
};

static const char *const user_names[] = { [REQ_AS_DEFAULT] = "default", [REQ_AS_SANDBOX] = "sandbox",
                                          [REQ_AS_ROOT] = "root" };

/* The handle is its connection: pgdb_handle_open's (c is first). */
static int pg_uploads_open(const char *location, StoreUploads **ret) {
        return pgdb_handle_open(location, sizeof(**ret), (void **)ret);
}

static void pg_uploads_close(StoreUploads *h) {
        pgdb_handle_close(h);
}

static int pg_uploads_set_writer(StoreUploads *h, const char *host_id, int64_t epoch) {
        return pgdb_set_writer(&h->c, host_id, epoch);
}

static int pg_uploads_insert(StoreUploads *h, const StoreUpload *u) {
        if ((unsigned)u->user >= ELEMENTSOF(user_names))
                return -EINVAL;
        char sha_hex[2 * sizeof(u->sha256) + 1];
        for (size_t i = 0; i < sizeof(u->sha256); i++)
                snprintf(sha_hex + 2 * i, 3, "%02x", u->sha256[i]);
        PgParams p = { 0 };
        pgp_text(&p, u->id);
        pgp_text(&p, u->sandbox_id);
        pgp_text(&p, u->owner);
        pgp_text(&p, u->archive ? "archive" : "file");
        pgp_text(&p, u->path);
        pgp_text(&p, user_names[u->user]);
        pgp_int(&p, u->mode);
        if (u->archive) {
                pgp_text(&p, NULL);
                pgp_text(&p, NULL);
        } else {
                pgp_int(&p, u->size);
                pgp_text(&p, u->has_sha256 ? sha_hex : NULL);
        }
        pgp_int(&p, u->chunk_bytes);
        pgp_int(&p, u->parts);
        pgp_int(&p, u->created_at);
        pgp_int(&p, u->touched_at);
        return pgdb_exec_write(&h->c,
                               "INSERT INTO uploads (id, sandbox_id, owner, kind, path, \"user\", mode, size, sha256, "
                               "chunk_bytes, parts, created_at, touched_at) "
                               "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, decode($9, 'hex'), $10, $11, $12, $13)",
                               &p, NULL);
}

typedef struct RecordPart {
        const char *id;
        int64_t index, bytes, now;
} RecordPart;

static int record_part_tx(PgConn *c, void *userdata) {
        const RecordPart *a = userdata;
        PgParams t = { 0 };
        pgp_int(&t, a->now);
        pgp_text(&t, a->id);
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run_locked(c, "UPDATE uploads SET touched_at = $1 WHERE id = $2", &t, &res);
        if (r < 0)
                return r;
        /* No row touched: the upload went, and no part is recorded for it. */
        if (strcmp(PQcmdTuples(res), "0") == 0)
                return -ENOENT;
        PgParams p = { 0 };
        pgp_text(&p, a->id);
        pgp_int(&p, a->index);
        pgp_int(&p, a->bytes);
        return pgdb_exec_locked(c,
                                "INSERT INTO upload_parts (upload_id, part, bytes) VALUES ($1, $2, $3) "
                                "ON CONFLICT (upload_id, part) DO UPDATE SET bytes = excluded.bytes",
                                &p);
}

static int pg_uploads_record_part(StoreUploads *h, const char *id, uint64_t index, uint64_t bytes, int64_t now) {
        if (index > INT64_MAX || bytes > INT64_MAX)
                return -EINVAL;
        RecordPart a = { .id = id, .index = (int64_t)index, .bytes = (int64_t)bytes, .now = now };
        return pgdb_write(&h->c, record_part_tx, &a);
}

static int pg_uploads_remove(StoreUploads *h, const char *id) {
        PgParams p = { 0 };
        pgp_text(&p, id);
        return pgdb_exec_write(&h->c, "DELETE FROM uploads WHERE id = $1", &p, NULL);
}

static int pg_uploads_remove_sandbox(StoreUploads *h, const char *sandbox_id) {
        PgParams p = { 0 };
        pgp_text(&p, sandbox_id);
        return pgdb_exec_write(&h->c, "DELETE FROM uploads WHERE sandbox_id = $1", &p, NULL);
}

static int hex_digit(char ch) {
        if (ch >= '0' && ch <= '9')
                return ch - '0';
        if (ch >= 'a' && ch <= 'f')
                return ch - 'a' + 10;
        return -1;
}

/* A digest as encode(sha256, 'hex') gives it; false when it is not one. */
static bool sha256_of_hex(const char *hex, uint8_t out[32]) {
        if (!hex || strlen(hex) != 64)
                return false;
        for (size_t i = 0; i < 32; i++) {
                int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
                if (hi < 0 || lo < 0)
                        return false;
                out[i] = (uint8_t)(hi << 4 | lo);
        }
        return true;
}

static const char *text_of(const PGresult *res, int row, int col) {
        const char *v = pgv(res, row, col);
        return v ? v : "";
}

/* The upload of a row of the listing's statement. */
static StoreUploadListed listed_of(const PGresult *res, int i) {
        const char *kind = text_of(res, i, 3), *user = text_of(res, i, 5), *live = text_of(res, i, 13);
        StoreUploadListed l = {
                .row = {
                        .id = text_of(res, i, 0),
                        .sandbox_id = text_of(res, i, 1),
                        .owner = text_of(res, i, 2),
                        .archive = strcmp(kind, "archive") == 0,
                        .path = text_of(res, i, 4),
                        .user = strcmp(user, "root") == 0      ? REQ_AS_ROOT
                                : strcmp(user, "sandbox") == 0 ? REQ_AS_SANDBOX
                                                               : REQ_AS_DEFAULT,
                        .mode = (unsigned)pgi(res, i, 6),
                        .size = pgi(res, i, 7),
                        .chunk_bytes = pgi(res, i, 9),
                        .parts = pgi(res, i, 10),
                        .created_at = pgi(res, i, 11),
                        .touched_at = pgi(res, i, 12),
                },
                .sandbox_live = strcmp(live, "t") == 0,
        };
        l.row.has_sha256 = sha256_of_hex(pgv(res, i, 8), l.row.sha256);
        return l;
}

static int pg_uploads_list(StoreUploads *h, StoreUploadEach each, void *userdata) {
        /* One statement, so one snapshot: each upload's rows, one per part
         * (or one with no part), come together in the upload's order. */
        _cleanup_pgres_ PGresult *res = NULL;
        int r = pgdb_run(&h->c,
                         "SELECT u.id, u.sandbox_id, u.owner, u.kind, u.path, u.\"user\", u.mode, u.size, "
                         "encode(u.sha256, 'hex'), u.chunk_bytes, u.parts, u.created_at, u.touched_at, "
                         "s.id IS NOT NULL AND s.deleted_at IS NULL, p.part, p.bytes "
                         "FROM uploads u LEFT JOIN sandboxes s ON s.id = u.sandbox_id "
                         "LEFT JOIN upload_parts p ON p.upload_id = u.id "
                         "ORDER BY u.created_at, u.id, p.part",
                         NULL, &res);
        if (r < 0)
                return r;
        _cleanup_free_ StoreUploadPart *parts = NULL;
        size_t cap = 0;
        int n = PQntuples(res);
        for (int i = 0; i < n;) {
                StoreUploadListed l = listed_of(res, i);
                size_t np = 0;
                int j = i;
                for (; j < n && strcmp(text_of(res, j, 0), l.row.id) == 0; j++) {
                        if (pgnull(res, j, 14))
                                continue;
                        if (np == cap) {
                                size_t want = cap ? cap * 2 : 64;
                                StoreUploadPart *grown = reallocarray(parts, want, sizeof(*parts));
                                if (!grown)
                                        return -ENOMEM;
                                parts = grown;
                                cap = want;
                        }
                        parts[np++] = (StoreUploadPart){ .index = pgi(res, j, 14), .bytes = pgi(res, j, 15) };
                }
                l.parts = parts;
                l.n_parts = np;
                if ((r = each(&l, userdata)) < 0)
                        return r;
                i = j;
        }
        return 0;
}

const StoreUploadOps store_postgres_uploads = {
        .open = pg_uploads_open,
        .close = pg_uploads_close,
        .insert = pg_uploads_insert,
        .set_writer = pg_uploads_set_writer,
        .record_part = pg_uploads_record_part,
        .remove = pg_uploads_remove,
        .remove_sandbox = pg_uploads_remove_sandbox,
        .list = pg_uploads_list,
};
