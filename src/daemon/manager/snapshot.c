#include "daemon/manager/snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/path.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "common/log.h"
#include "daemon/store/sqldb.h"
#include "driver/rootfs.h"

#define EXPIRY_CHECK_SECONDS 5

struct SnapshotStore {
        sqlite3 *sql;
        pthread_mutex_t lock;
        char *dir; /* state_dir/snapshots */
        uint64_t price_gib_hour;
        Ledger *ledger;
        pthread_mutex_t quit_lock;
        pthread_cond_t quit_cond;
        bool quit, started;
        pthread_t thread;
};

static const char schema[] = "CREATE TABLE IF NOT EXISTS snapshots ("
                             "  id TEXT PRIMARY KEY,"
                             "  owner TEXT NOT NULL,"
                             "  key_id TEXT NOT NULL,"
                             "  sandbox_id TEXT NOT NULL,"
                             "  name TEXT,"
                             "  labels TEXT NOT NULL,"
                             "  spec TEXT NOT NULL,"
                             "  mode TEXT NOT NULL,"
                             "  size_bytes INTEGER NOT NULL,"
                             "  created_at INTEGER NOT NULL,"
                             "  expires_at INTEGER NOT NULL DEFAULT 0);"
                             "CREATE INDEX IF NOT EXISTS snapshots_owner ON snapshots (owner, created_at, id);";

void snapshot_row_done(SnapshotRow *r) {
        if (!r)
                return;
        free(r->owner);
        free(r->key_id);
        free(r->sandbox_id);
        free(r->name);
        free(r->labels);
        free(r->spec);
        *r = (SnapshotRow){ 0 };
}

bool snapshot_id_ok(const char *s) {
        if (!s || strncmp(s, "snp_", 4) != 0 || strlen(s) != SNAPSHOT_ID_LEN)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static void series(const char *id, char *buf, size_t n) {
        snprintf(buf, n, "%s" LEDGER_DISK_SUFFIX, id);
}

int snapshot_store_open(const char *db_path, const char *state_dir, uint64_t price, SnapshotStore **ret) {
        sqlite3 *sql = NULL;
        int r = sqldb_open_schema(db_path, schema, &sql);
        if (r < 0)
                return r;
        SnapshotStore *s = calloc(1, sizeof(*s));
        if (!s || asprintf(&s->dir, "%s/snapshots", state_dir) < 0) {
                free(s);
                sqlite3_close(sql);
                return -ENOMEM;
        }
        if (mkdir(s->dir, 0700) < 0 && errno != EEXIST) {
                r = -errno;
                free(s->dir);
                free(s);
                sqlite3_close(sql);
                return r;
        }
        s->sql = sql;
        s->price_gib_hour = price;
        pthread_mutex_init(&s->lock, NULL);
        pthread_mutex_init(&s->quit_lock, NULL);
        pthread_cond_init(&s->quit_cond, NULL);
        *ret = s;
        return 0;
}

void snapshot_store_close(SnapshotStore *s) {
        if (!s)
                return;
        if (s->started) {
                pthread_mutex_lock(&s->quit_lock);
                s->quit = true;
                pthread_cond_broadcast(&s->quit_cond);
                pthread_mutex_unlock(&s->quit_lock);
                pthread_join(s->thread, NULL);
        }
        sqlite3_close(s->sql);
        pthread_mutex_destroy(&s->lock);
        free(s->dir);
        free(s);
}

void snapshot_store_set_ledger(SnapshotStore *s, Ledger *ledger) {
        s->ledger = ledger;
}

static uint64_t per_hour(SnapshotStore *s, int64_t bytes) {
        uint64_t mib = ((uint64_t)(bytes > 0 ? bytes : 0) + (1u << 20) - 1) >> 20;
        uint64_t p = s->price_gib_hour * mib / 1024u;
        return p == 0 && mib > 0 && s->price_gib_hour > 0 ? 1 : p;
}

static char *path_of(SnapshotStore *s, const char *name) {
        char *p = NULL;
        return asprintf(&p, "%s/%s", s->dir, name) < 0 ? NULL : p;
}

char *snapshot_store_dir(SnapshotStore *s, const char *id) {
        return path_of(s, id);
}

static char *part_of(SnapshotStore *s, const char *id) {
        char *p = NULL;
        return asprintf(&p, "%s/.%s.part", s->dir, id) < 0 ? NULL : p;
}

int snapshot_store_begin(SnapshotStore *s, char ret_id[SNAPSHOT_ID_LEN + 1], char **ret_tmpdir) {
        char hex[21];
        int r = random_hex(hex, 10);
        if (r < 0)
                return r;
        char id[SNAPSHOT_ID_LEN + 1];
        snprintf(id, sizeof id, "snp_%s", hex);
        char *tmp = part_of(s, id);
        if (!tmp)
                return -ENOMEM;
        if (mkdir(tmp, 0700) < 0) {
                r = -errno;
                free(tmp);
                return r;
        }
        memcpy(ret_id, id, sizeof id);
        *ret_tmpdir = tmp;
        return 0;
}

void snapshot_store_abort(SnapshotStore *s, const char *id) {
        _cleanup_free_ char *tmp = part_of(s, id);
        if (tmp)
                (void)path_remove_tree_at(AT_FDCWD, tmp);
}

/* Syncs every regular file of dir and dir itself; adds the sizes of those
 * it holds alone: a file linked from elsewhere (a layer shared with the
 * snapshot a sandbox came from) is already kept and billed there. */
static int sync_dir(const char *dir, int64_t *ret_bytes) {
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (dfd < 0)
                return -errno;
        int dup_fd = dup(dfd);
        if (dup_fd < 0)
                return -errno;
        DIR *d = fdopendir(dup_fd);
        if (!d) {
                close(dup_fd);
                return -errno;
        }
        int64_t total = 0;
        int r = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                int fd = openat(dfd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (fd < 0) {
                        r = -errno;
                        break;
                }
                struct stat st;
                if (fstat(fd, &st) < 0 || fsync(fd) < 0)
                        r = -errno;
                else if (st.st_nlink == 1)
                        total += (int64_t)st.st_blocks * 512;
                close(fd);
                if (r < 0)
                        break;
        }
        closedir(d);
        if (r == 0 && fsync(dfd) < 0)
                r = -errno;
        if (r == 0)
                *ret_bytes = total;
        return r;
}

static int fsync_path(const char *path) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) < 0)
                return -errno;
        return 0;
}

int snapshot_store_commit(SnapshotStore *s, SnapshotRow *row) {
        _cleanup_free_ char *tmp = part_of(s, row->id), *final = path_of(s, row->id);
        if (!tmp || !final)
                return -ENOMEM;
        int64_t bytes = 0;
        int r = sync_dir(tmp, &bytes);
        if (r < 0)
                goto fail;
        row->size_bytes = bytes;
        if (rename(tmp, final) < 0) {
                r = -errno;
                goto fail;
        }
        if ((r = fsync_path(s->dir)) < 0)
                goto fail_final;
        {
                LOCKED(s);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(s->sql,
                                       "INSERT INTO snapshots (id, owner, key_id, sandbox_id, name, labels, spec, "
                                       "mode, size_bytes, created_at, expires_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                                       -1, &st, NULL) != SQLITE_OK) {
                        r = -EIO;
                        goto fail_final;
                }
                sqlite3_bind_text(st, 1, row->id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, row->owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, row->key_id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 4, row->sandbox_id, -1, SQLITE_STATIC);
                if (row->name)
                        sqlite3_bind_text(st, 5, row->name, -1, SQLITE_STATIC);
                else
                        sqlite3_bind_null(st, 5);
                sqlite3_bind_text(st, 6, row->labels, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 7, row->spec, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 8, row->mode, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 9, row->size_bytes);
                sqlite3_bind_int64(st, 10, row->created_at);
                sqlite3_bind_int64(st, 11, row->expires_at);
                if ((r = sqldb_errno(sqlite3_step(st))) < 0)
                        goto fail_final;
        }
        if (s->ledger) {
                char ser[48];
                series(row->id, ser, sizeof ser);
                int lr = ledger_begin(s->ledger, ser, row->key_id, row->owner, row->created_at,
                                      per_hour(s, row->size_bytes), 0);
                if (lr < 0)
                        log_error(NULL, "snapshot %s: opening its storage charge: %s", row->id, strerror(-lr));
        }
        snprintf(row->state, sizeof row->state, "ready");
        return 0;
fail_final:
        (void)path_remove_tree_at(AT_FDCWD, final);
        return r;
fail:
        (void)path_remove_tree_at(AT_FDCWD, tmp);
        return r;
}

static char *dup_col(sqlite3_stmt *st, int col) {
        const unsigned char *t = sqlite3_column_text(st, col);
        return t ? strdup((const char *)t) : NULL;
}

/* Rows a client may see: a transient one is a fork's working copy. */
#define NOT_TRANSIENT "json_extract(spec, '$." SNAPSHOT_TRANSIENT "') IS NULL"
#define COLUMNS "id, owner, key_id, sandbox_id, name, labels, spec, mode, size_bytes, created_at, expires_at"

static int read_row(sqlite3_stmt *st, SnapshotRow *r) {
        *r = (SnapshotRow){ 0 };
        const unsigned char *id = sqlite3_column_text(st, 0);
        snprintf(r->id, sizeof r->id, "%s", id ? (const char *)id : "");
        r->owner = dup_col(st, 1);
        r->key_id = dup_col(st, 2);
        r->sandbox_id = dup_col(st, 3);
        r->name = dup_col(st, 4);
        r->labels = dup_col(st, 5);
        r->spec = dup_col(st, 6);
        const unsigned char *mode = sqlite3_column_text(st, 7);
        snprintf(r->mode, sizeof r->mode, "%s", mode ? (const char *)mode : "disk");
        snprintf(r->state, sizeof r->state, "ready");
        r->size_bytes = sqlite3_column_int64(st, 8);
        r->created_at = sqlite3_column_int64(st, 9);
        r->expires_at = sqlite3_column_int64(st, 10);
        if (!r->owner || !r->key_id || !r->sandbox_id || !r->labels || !r->spec) {
                snapshot_row_done(r);
                return -ENOMEM;
        }
        return 0;
}

int snapshot_store_get(SnapshotStore *s, const char *owner, const char *id, SnapshotRow *ret) {
        if (!snapshot_id_ok(id))
                return -ENOENT;
        LOCKED(s);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s->sql, "SELECT " COLUMNS " FROM snapshots WHERE id = ? AND owner = ? AND " NOT_TRANSIENT, -1, &st,
                               NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
                return -ENOENT;
        if (rc != SQLITE_ROW)
                return sqldb_errno(rc);
        return read_row(st, ret);
}

int snapshot_store_list(SnapshotStore *s, const char *owner, const char *sandbox_id, const char *name,
                        int64_t cursor_at, const char *cursor_id, unsigned limit, SnapshotFn fn, void *userdata) {
        SnapshotRow *rows = calloc(limit ? limit : 1, sizeof(*rows));
        if (!rows)
                return -ENOMEM;
        size_t n = 0;
        int r = 0;
        {
                LOCKED(s);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(s->sql,
                                       "SELECT " COLUMNS " FROM snapshots WHERE owner = ?1 AND " NOT_TRANSIENT " "
                                       "AND (?2 IS NULL OR sandbox_id = ?2) AND (?3 IS NULL OR name = ?3) "
                                       "AND (?5 IS NULL OR created_at > ?4 OR (created_at = ?4 AND id > ?5)) "
                                       "ORDER BY created_at, id LIMIT ?6",
                                       -1, &st, NULL) != SQLITE_OK) {
                        free(rows);
                        return -EIO;
                }
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                if (sandbox_id)
                        sqlite3_bind_text(st, 2, sandbox_id, -1, SQLITE_STATIC);
                if (name)
                        sqlite3_bind_text(st, 3, name, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 4, cursor_at);
                if (cursor_id)
                        sqlite3_bind_text(st, 5, cursor_id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 6, limit);
                int rc;
                while (n < limit && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                        if ((r = read_row(st, &rows[n])) < 0)
                                break;
                        n++;
                }
        }
        /* The callbacks run without the store's lock. */
        for (size_t i = 0; i < n; i++) {
                if (r == 0)
                        r = fn(userdata, &rows[i]);
                snapshot_row_done(&rows[i]);
        }
        free(rows);
        return r < 0 ? r : 0;
}

int snapshot_store_update(SnapshotStore *s, const char *owner, const char *id, bool set_name, const char *name,
                          const char *labels, int64_t expires_at, SnapshotRow *ret) {
        if (!snapshot_id_ok(id))
                return -ENOENT;
        {
                LOCKED(s);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(s->sql,
                                       "UPDATE snapshots SET name = CASE WHEN ?3 THEN ?4 ELSE name END, "
                                       "labels = coalesce(?5, labels), "
                                       "expires_at = CASE WHEN ?6 > 0 THEN ?6 ELSE expires_at END "
                                       "WHERE id = ?1 AND owner = ?2",
                                       -1, &st, NULL) != SQLITE_OK)
                        return -EIO;
                sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
                sqlite3_bind_int(st, 3, set_name);
                if (name)
                        sqlite3_bind_text(st, 4, name, -1, SQLITE_STATIC);
                if (labels)
                        sqlite3_bind_text(st, 5, labels, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 6, expires_at);
                int r = sqldb_errno(sqlite3_step(st));
                if (r < 0)
                        return r;
                if (sqlite3_changes(s->sql) == 0)
                        return -ENOENT;
        }
        return snapshot_store_get(s, owner, id, ret);
}

/* owner NULL: any owner's (expiry). */
static int delete_one(SnapshotStore *s, const char *owner, const char *id) {
        {
                LOCKED(s);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(s->sql, "DELETE FROM snapshots WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
                                       -1, &st, NULL) != SQLITE_OK)
                        return -EIO;
                sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
                if (owner)
                        sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
                int r = sqldb_errno(sqlite3_step(st));
                if (r < 0)
                        return r;
                if (sqlite3_changes(s->sql) == 0)
                        return -ENOENT;
        }
        if (s->ledger) {
                char ser[48];
                series(id, ser, sizeof ser);
                int64_t now = time_now_unix();
                int lr = ledger_settle(s->ledger, ser, now, now);
                if (lr < 0)
                        log_error(NULL, "snapshot %s: closing its storage charge: %s", id, strerror(-lr));
        }
        /* The row is gone first: a crash here leaves files without a row,
         * which recovery removes. */
        _cleanup_free_ char *dir = path_of(s, id);
        if (dir)
                (void)path_remove_tree_at(AT_FDCWD, dir);
        return 0;
}

int snapshot_store_delete(SnapshotStore *s, const char *owner, const char *id) {
        if (!snapshot_id_ok(id))
                return -ENOENT;
        return delete_one(s, owner, id);
}

/* The ids of the transient snapshots (a fork's, cut by a crash); NULL-ended. */
static char **transient_ids(SnapshotStore *s) {
        LOCKED(s);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s->sql, "SELECT id FROM snapshots WHERE NOT " NOT_TRANSIENT, -1, &st, NULL) != SQLITE_OK)
                return NULL;
        char **ids = calloc(1, sizeof(*ids));
        size_t n = 0;
        while (ids && sqlite3_step(st) == SQLITE_ROW) {
                char **grown = realloc(ids, (n + 2) * sizeof(*ids));
                if (!grown)
                        break;
                ids = grown;
                if ((ids[n] = dup_col(st, 0)))
                        n++;
                ids[n] = NULL;
        }
        return ids;
}

static bool row_exists(SnapshotStore *s, const char *id) {
        LOCKED(s);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s->sql, "SELECT 1 FROM snapshots WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
                return true; /* when in doubt, keep the files */
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        return sqlite3_step(st) != SQLITE_DONE;
}

int snapshot_store_recover(SnapshotStore *s) {
        char **cut = transient_ids(s);
        for (size_t i = 0; cut && cut[i]; i++) {
                log_info(NULL, "removing snapshot %s, made for a fork that the daemon's stop cut", cut[i]);
                if (s->ledger) {
                        /* Billed up to the last heartbeat before the crash. */
                        char ser[48];
                        int64_t end, now = time_now_unix();
                        series(cut[i], ser, sizeof ser);
                        (void)ledger_settle_at_heartbeat(s->ledger, ser, now, now, &end);
                }
                (void)delete_one(s, NULL, cut[i]);
                free(cut[i]);
        }
        free(cut);
        DIR *d = opendir(s->dir);
        if (!d)
                return -errno;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                bool partial = de->d_name[0] == '.';
                if (!partial && snapshot_id_ok(de->d_name) && row_exists(s, de->d_name))
                        continue;
                _cleanup_free_ char *p = path_of(s, de->d_name);
                if (p) {
                        log_info(NULL, "removing %s snapshot files %s", partial ? "partial" : "unrecorded", de->d_name);
                        (void)path_remove_tree_at(AT_FDCWD, p);
                }
        }
        closedir(d);
        if (!s->ledger)
                return 0;
        /* Storage charges: closed at the last heartbeat before the crash,
         * and open again from now. */
        char **ids = NULL;
        size_t n = 0;
        {
                LOCKED(s);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(s->sql, "SELECT id FROM snapshots", -1, &st, NULL) != SQLITE_OK)
                        return -EIO;
                while (sqlite3_step(st) == SQLITE_ROW) {
                        char **grown = realloc(ids, (n + 1) * sizeof(*ids));
                        if (!grown)
                                break;
                        ids = grown;
                        ids[n] = dup_col(st, 0);
                        if (ids[n])
                                n++;
                }
        }
        int64_t now = time_now_unix();
        for (size_t i = 0; i < n; i++) {
                SnapshotRow row;
                LOCKED(s);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(s->sql, "SELECT " COLUMNS " FROM snapshots WHERE id = ?", -1, &st, NULL) ==
                            SQLITE_OK &&
                    (sqlite3_bind_text(st, 1, ids[i], -1, SQLITE_STATIC), sqlite3_step(st) == SQLITE_ROW) &&
                    read_row(st, &row) == 0) {
                        char ser[48];
                        int64_t end;
                        series(row.id, ser, sizeof ser);
                        int lr = ledger_settle_at_heartbeat(s->ledger, ser, now, now, &end);
                        if (lr == 0 || lr == -ENOENT)
                                lr = ledger_begin(s->ledger, ser, row.key_id, row.owner, now,
                                                  per_hour(s, row.size_bytes), 0);
                        if (lr < 0)
                                log_error(NULL, "snapshot %s: its storage charge: %s", row.id, strerror(-lr));
                        snapshot_row_done(&row);
                }
                free(ids[i]);
        }
        free(ids);
        return 0;
}

static void expire_due(SnapshotStore *s) {
        char ids[64][SNAPSHOT_ID_LEN + 1];
        size_t n = 0;
        {
                LOCKED(s);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(s->sql,
                                       "SELECT id FROM snapshots WHERE expires_at > 0 AND expires_at <= ? LIMIT 64",
                                       -1, &st, NULL) != SQLITE_OK)
                        return;
                sqlite3_bind_int64(st, 1, time_now_unix());
                while (n < ELEMENTSOF(ids) && sqlite3_step(st) == SQLITE_ROW) {
                        const unsigned char *t = sqlite3_column_text(st, 0);
                        snprintf(ids[n++], sizeof ids[0], "%s", t ? (const char *)t : "");
                }
        }
        for (size_t i = 0; i < n; i++)
                if (delete_one(s, NULL, ids[i]) == 0)
                        log_info(NULL, "snapshot %s deleted: its retention ended", ids[i]);
}

static void *expiry_thread(void *userdata) {
        SnapshotStore *s = userdata;
        pthread_mutex_lock(&s->quit_lock);
        while (!s->quit) {
                pthread_mutex_unlock(&s->quit_lock);
                expire_due(s);
                pthread_mutex_lock(&s->quit_lock);
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += EXPIRY_CHECK_SECONDS;
                if (!s->quit)
                        pthread_cond_timedwait(&s->quit_cond, &s->quit_lock, &ts);
        }
        pthread_mutex_unlock(&s->quit_lock);
        return NULL;
}

int snapshot_store_start(SnapshotStore *s) {
        int r = pthread_create(&s->thread, NULL, expiry_thread, s);
        if (r != 0)
                return -r;
        s->started = true;
        return 0;
}

int snapshot_store_count(SnapshotStore *s, const char *owner, int64_t *ret) {
        LOCKED(s);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s->sql, "SELECT count(*) FROM snapshots WHERE owner = ?", -1, &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_ROW)
                return -EIO;
        *ret = sqlite3_column_int64(st, 0);
        return 0;
}
