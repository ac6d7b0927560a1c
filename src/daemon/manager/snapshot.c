#include "daemon/manager/snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/path.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "common/log.h"
#include "driver/rootfs.h"

#define EXPIRY_CHECK_SECONDS 5

struct SnapshotStore {
        const StoreSnapshotOps *ops;
        StoreSnapshots *h;
        char *dir; /* state_dir/snapshots */
        uint64_t price_gib_hour;
        int64_t owner_max_bytes; /* set before the daemon serves */
        Ledger *ledger;
        char host_id[64]; /* this host: the home of the snapshots it makes */
        pthread_mutex_t quit_lock;
        pthread_cond_t quit_cond;
        bool quit, started;
        pthread_t thread;
};

void snapshot_row_done(SnapshotRow *r) {
        store_snapshot_row_clear(r);
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

int snapshot_store_open(const StoreBackend *b, const char *location, const char *state_dir, uint64_t price,
                        SnapshotStore **ret) {
        if (!b || !b->snapshots)
                return -EPROTONOSUPPORT;
        SnapshotStore *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->ops = b->snapshots;
        int r = -ENOMEM;
        if (asprintf(&s->dir, "%s/snapshots", state_dir) < 0) {
                s->dir = NULL;
                goto fail;
        }
        if (mkdir(s->dir, 0700) < 0 && errno != EEXIST) {
                r = -errno;
                goto fail;
        }
        if ((r = s->ops->open(location, &s->h)) < 0)
                goto fail;
        s->price_gib_hour = price;
        s->owner_max_bytes = (int64_t)SNAPSHOT_OWNER_MIB_DEFAULT << 20;
        pthread_mutex_init(&s->quit_lock, NULL);
        pthread_cond_init(&s->quit_cond, NULL);
        *ret = s;
        return 0;
fail:
        free(s->dir);
        free(s);
        return r;
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
        s->ops->close(s->h);
        pthread_mutex_destroy(&s->quit_lock);
        pthread_cond_destroy(&s->quit_cond);
        free(s->dir);
        free(s);
}

void snapshot_store_set_host(SnapshotStore *s, const char *host_id) {
        snprintf(s->host_id, sizeof(s->host_id), "%s", host_id);
}

int snapshot_store_set_epoch(SnapshotStore *s, const char *host_id, int64_t epoch) {
        return s->ops->set_writer(s->h, host_id, epoch);
}

void snapshot_store_set_ledger(SnapshotStore *s, Ledger *ledger) {
        s->ledger = ledger;
}

int snapshot_store_set_owner_max_mib(SnapshotStore *s, uint64_t mib) {
        if (mib < 1 || mib > SNAPSHOT_OWNER_MIB_MAX)
                return -ERANGE;
        s->owner_max_bytes = (int64_t)(mib << 20);
        return 0;
}

uint64_t snapshot_store_owner_max_mib(SnapshotStore *s) {
        return (uint64_t)s->owner_max_bytes >> 20;
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

/* A DIR stream of its own over directory fd dfd, which stays the caller's
 * for the *at calls of the walk. */
static int walk_open(int dfd, DIR **ret) {
        int dup_fd = dup(dfd);
        if (dup_fd < 0)
                return -errno;
        DIR *d = fdopendir(dup_fd);
        if (!d) {
                int r = -errno;
                close(dup_fd);
                return r;
        }
        *ret = d;
        return 0;
}

/* Syncs every regular file of dir and dir itself; adds the sizes of those
 * it holds alone: a file linked from elsewhere (a layer shared with the
 * snapshot a sandbox came from) is already kept and billed there. With
 * count_shared, linked files count too: a snapshot that shares another's
 * layer (snapshot_store_link) outlives it, and its bytes must be counted
 * and billed from the start, or deleting the first would leave them in
 * no bound. */
static int sync_dir(const char *dir, bool count_shared, int64_t *ret_bytes) {
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (dfd < 0)
                return -errno;
        DIR *d = NULL;
        int r = walk_open(dfd, &d);
        if (r < 0)
                return r;
        int64_t total = 0;
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
                else if (S_ISREG(st.st_mode) && (st.st_nlink == 1 || count_shared))
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

static int commit(SnapshotStore *s, SnapshotRow *row, bool count_shared) {
        _cleanup_free_ char *tmp = part_of(s, row->id), *final = path_of(s, row->id);
        if (!tmp || !final)
                return -ENOMEM;
        int64_t bytes = 0;
        int r = sync_dir(tmp, count_shared, &bytes);
        if (r < 0)
                goto fail;
        row->size_bytes = bytes;
        if (rename(tmp, final) < 0) {
                r = -errno;
                goto fail;
        }
        if ((r = fsync_path(s->dir)) < 0)
                goto fail_final;
        snprintf(row->host_id, sizeof(row->host_id), "%s", s->host_id);
        if ((r = s->ops->insert(s->h, row, SNAPSHOT_MAX_PER_OWNER, s->owner_max_bytes)) < 0)
                goto fail_final;
        /* A layer is not billed: its own bound keeps it small. */
        if (s->ledger && !row->layer) {
                char ser[48];
                series(row->id, ser, sizeof ser);
                int lr = ledger_begin(s->ledger, ser, row->key_id, row->owner, row->created_at,
                                      per_hour(s, row->size_bytes), 0);
                if (lr < 0)
                        log_error(NULL, "snapshot %s: opening its storage charge: %s", row->id, strerror(-lr));
        }
        row->version = 1;
        snprintf(row->state, sizeof row->state, "ready");
        return 0;
fail_final:
        (void)path_remove_tree_at(AT_FDCWD, final);
        return r;
fail:
        (void)path_remove_tree_at(AT_FDCWD, tmp);
        return r;
}

/* Links every regular file of from (a snapshot's directory or its bases/)
 * into to, and bases/ by the same walk. */
static int link_tree(int from_fd, int to_fd, unsigned depth) {
        DIR *d = NULL;
        int r = walk_open(from_fd, &d);
        if (r < 0)
                return r;
        struct dirent *de;
        while (r == 0 && (de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                struct stat st;
                if (fstatat(from_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                        r = -errno;
                        break;
                }
                if (S_ISREG(st.st_mode)) {
                        if (linkat(from_fd, de->d_name, to_fd, de->d_name, 0) < 0)
                                r = -errno;
                } else if (S_ISDIR(st.st_mode) && depth == 0 && strcmp(de->d_name, "bases") == 0) {
                        if (mkdirat(to_fd, de->d_name, 0700) < 0) {
                                r = -errno;
                                break;
                        }
                        _cleanup_close_ int sub_from = openat(from_fd, de->d_name,
                                                              O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                        _cleanup_close_ int sub_to = openat(to_fd, de->d_name,
                                                            O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                        if (sub_from < 0 || sub_to < 0)
                                r = -errno;
                        else if ((r = link_tree(sub_from, sub_to, depth + 1)) == 0 && fsync(sub_to) < 0)
                                r = -errno;
                } else
                        r = -EBADMSG; /* a disk snapshot holds its layer and bases/ only */
        }
        closedir(d);
        return r;
}

/* The spec of a layer made from a snapshot's spec: SNAPSHOT_LAYER added
 * (a new string; NULL on failure). */
static char *layer_spec(const char *spec) {
        _cleanup_json_ json_t *doc = json_loads(spec, 0, NULL);
        if (!json_is_object(doc) || json_object_set_new(doc, SNAPSHOT_LAYER, json_true()) < 0)
                return NULL;
        return json_dumps(doc, JSON_COMPACT);
}

int snapshot_store_link(SnapshotStore *s, const char *owner, const char *source, const char *key_id,
                        const char *labels, bool layer, SnapshotRow *ret) {
        SnapshotRow src = { 0 };
        int r = snapshot_store_get(s, owner, source, &src);
        if (r < 0)
                return r;
        if (strcmp(src.mode, "disk") != 0) {
                snapshot_row_done(&src);
                return -EOPNOTSUPP;
        }
        SnapshotRow row = { .sandbox_id = TAKE_PTR(src.sandbox_id),
                            .spec = layer ? layer_spec(src.spec) : TAKE_PTR(src.spec),
                            .layer = layer };
        snapshot_row_done(&src);
        row.owner = strdup(owner);
        row.key_id = strdup(key_id);
        row.labels = strdup(labels);
        snprintf(row.mode, sizeof row.mode, "disk");
        row.created_at = time_now_unix();
        _cleanup_free_ char *tmp = NULL, *from = path_of(s, source);
        if (!row.owner || !row.key_id || !row.labels || !row.sandbox_id || !row.spec || !from) {
                snapshot_row_done(&row);
                return -ENOMEM;
        }
        if ((r = snapshot_store_begin(s, row.id, &tmp)) < 0) {
                snapshot_row_done(&row);
                return r;
        }
        _cleanup_close_ int from_fd = open(from, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int to_fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (from_fd < 0 || to_fd < 0)
                r = -errno;
        else
                r = link_tree(from_fd, to_fd, 0);
        if (r < 0) {
                snapshot_store_abort(s, row.id);
                snapshot_row_done(&row);
                return r;
        }
        if ((r = commit(s, &row, true)) < 0) {
                snapshot_row_done(&row);
                return r;
        }
        *ret = row;
        return 0;
}

int snapshot_store_commit(SnapshotStore *s, SnapshotRow *row) {
        return commit(s, row, false);
}

int snapshot_store_get(SnapshotStore *s, const char *owner, const char *id, SnapshotRow *ret) {
        if (!snapshot_id_ok(id))
                return -ENOENT;
        return s->ops->get(s->h, owner, id, ret);
}

int snapshot_store_get_layer(SnapshotStore *s, const char *owner, const char *id, SnapshotRow *ret) {
        if (!snapshot_id_ok(id))
                return -ENOENT;
        SnapshotRow row;
        int r = s->ops->get_any(s->h, id, &row);
        if (r < 0)
                return r;
        if (!row.layer || strcmp(row.owner, owner) != 0) {
                snapshot_row_done(&row);
                return -ENOENT;
        }
        *ret = row;
        return 0;
}

int snapshot_store_list(SnapshotStore *s, const char *owner, const char *sandbox_id, const char *name,
                        int64_t cursor_at, const char *cursor_id, unsigned limit, SnapshotFn fn, void *userdata) {
        StoreSnapshotFilter f = { .owner = owner, .sandbox_id = sandbox_id, .name = name, .cursor_at = cursor_at,
                                  .cursor_id = cursor_id, .limit = limit };
        SnapshotRow *rows = NULL;
        size_t n = 0;
        int r = s->ops->list(s->h, &f, &rows, &n);
        if (r < 0)
                return r;
        /* The callbacks run with no call into the backend under way. */
        for (size_t i = 0; i < n; i++) {
                if (r == 0)
                        r = fn(userdata, &rows[i]);
                snapshot_row_done(&rows[i]);
        }
        free(rows);
        return r < 0 ? r : 0;
}

int snapshot_store_update(SnapshotStore *s, const char *owner, const char *id, uint64_t version, bool set_name,
                          const char *name, const char *labels, int64_t expires_at, SnapshotRow *ret) {
        if (!snapshot_id_ok(id))
                return -ENOENT;
        StoreSnapshotChange c = { .set_name = set_name, .name = name, .labels = labels, .expires_at = expires_at };
        return s->ops->update(s->h, owner, id, version, &c, ret);
}

/* owner NULL: any owner's (expiry). */
static int delete_one(SnapshotStore *s, const char *owner, const char *id) {
        int r = s->ops->delete(s->h, owner, id);
        if (r < 0)
                return r;
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

int snapshot_store_delete_visible(SnapshotStore *s, const char *owner, const char *id) {
        /* A row's kind never changes, so the delete after the check is of
         * the row the check saw, or of none. */
        SnapshotRow row;
        int r = snapshot_store_get(s, owner, id, &row);
        if (r < 0)
                return r;
        snapshot_row_done(&row);
        return delete_one(s, owner, id);
}

/* Whether id has a record; when in doubt (the backend failed), yes: its
 * files are kept. */
static bool row_exists(SnapshotStore *s, const char *id) {
        SnapshotRow row;
        int r = s->ops->get_any(s->h, id, &row);
        if (r == 0)
                snapshot_row_done(&row);
        return r != -ENOENT;
}

typedef char SnapshotId[SNAPSHOT_ID_LEN + 1];

/* Deletes the transient snapshots: a fork's, cut by the daemon's stop. */
static void recover_transient(SnapshotStore *s) {
        SnapshotId *cut = NULL;
        size_t n = 0;
        int r = s->ops->ids(s->h, STORE_SNAPSHOT_IDS_TRANSIENT, s->host_id, 0, SIZE_MAX, &cut, &n);
        if (r < 0) {
                log_error(NULL, "listing the transient snapshots: %s", strerror(-r));
                return;
        }
        for (size_t i = 0; i < n; i++) {
                log_info(NULL, "removing snapshot %s, made for a fork that the daemon's stop cut", cut[i]);
                if (s->ledger) {
                        /* Billed up to the last heartbeat before the crash. */
                        char ser[48];
                        int64_t end, now = time_now_unix();
                        series(cut[i], ser, sizeof ser);
                        (void)ledger_settle_at_heartbeat(s->ledger, ser, now, now, &end);
                }
                (void)delete_one(s, NULL, cut[i]);
        }
        free(cut);
}

/* A snapshot's own files never have dot names: one inside its directory is
 * a driver's work on it that a killed daemon cut short (the microVM's disk
 * of an image built here, made under a dot name and renamed into place). */
static void recover_dot_files(SnapshotStore *s, const char *id) {
        _cleanup_free_ char *p = path_of(s, id);
        _cleanup_close_ int dfd = p ? open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        DIR *d = NULL;
        if (dfd < 0 || walk_open(dfd, &d) < 0)
                return;
        struct dirent *de;
        while ((de = readdir(d)))
                if (de->d_name[0] == '.' && strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
                        log_info(NULL, "removing %s of snapshot %s, left by a stopped daemon", de->d_name, id);
                        (void)path_remove_tree_at(dfd, de->d_name);
                }
        closedir(d);
}

/* Removes every .part directory and every directory without a record. */
static int recover_files(SnapshotStore *s) {
        DIR *d = opendir(s->dir);
        if (!d)
                return -errno;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                bool partial = de->d_name[0] == '.';
                if (!partial && snapshot_id_ok(de->d_name) && row_exists(s, de->d_name)) {
                        recover_dot_files(s, de->d_name);
                        continue;
                }
                _cleanup_free_ char *p = path_of(s, de->d_name);
                if (p) {
                        log_info(NULL, "removing %s snapshot files %s", partial ? "partial" : "unrecorded", de->d_name);
                        (void)path_remove_tree_at(AT_FDCWD, p);
                }
        }
        closedir(d);
        return 0;
}

int snapshot_store_each(SnapshotStore *s, int (*fn)(void *userdata, const SnapshotRow *row), void *userdata) {
        SnapshotId *ids = NULL;
        size_t n = 0;
        int r = s->ops->ids(s->h, STORE_SNAPSHOT_IDS_ALL, s->host_id, 0, SIZE_MAX, &ids, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n && r == 0; i++) {
                SnapshotRow row;
                if (s->ops->get_any(s->h, ids[i], &row) < 0)
                        continue;
                r = fn(userdata, &row);
                snapshot_row_done(&row);
        }
        free(ids);
        return r;
}

/* A snapshot's storage charge: closed at the last heartbeat before the
 * crash, and open again from now. */
static int recover_charge(void *userdata, const SnapshotRow *row) {
        SnapshotStore *s = userdata;
        if (row->layer)
                return 0; /* never billed */
        char ser[48];
        int64_t end, now = time_now_unix();
        series(row->id, ser, sizeof ser);
        int lr = ledger_settle_at_heartbeat(s->ledger, ser, now, now, &end);
        if (lr == 0 || lr == -ENOENT)
                lr = ledger_begin(s->ledger, ser, row->key_id, row->owner, now, per_hour(s, row->size_bytes), 0);
        if (lr < 0)
                log_error(NULL, "snapshot %s: its storage charge: %s", row->id, strerror(-lr));
        return 0;
}

int snapshot_store_recover(SnapshotStore *s) {
        recover_transient(s);
        int r = recover_files(s);
        if (r < 0 || !s->ledger)
                return r;
        return snapshot_store_each(s, recover_charge, s);
}

static void expire_due(SnapshotStore *s) {
        SnapshotId *ids = NULL;
        size_t n = 0;
        if (s->ops->ids(s->h, STORE_SNAPSHOT_IDS_EXPIRED, s->host_id, time_now_unix(), 64, &ids, &n) < 0)
                return;
        for (size_t i = 0; i < n; i++)
                if (delete_one(s, NULL, ids[i]) == 0)
                        log_info(NULL, "snapshot %s deleted: its retention ended", ids[i]);
        free(ids);
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

int snapshot_store_usage(SnapshotStore *s, const char *owner, StoreSnapshotUsage *ret) {
        return s->ops->usage(s->h, owner, ret);
}
