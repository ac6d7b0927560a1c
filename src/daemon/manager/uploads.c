/* The registry of uploads in parts: the slots in memory (who works on which
 * upload now, its staging file, the parts that arrived) mirror the store's
 * uploads and their parts (store/store_uploads.h), which are the truth
 * across a restart.
 * Order of writes: a staging file is made and synced before its row; a part's
 * bytes are synced before its row; a row goes before its file. A crash
 * between two steps leaves a file without a row or a row without a file,
 * which the next start removes. */
#include "daemon/manager/uploads.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/store/store_uploads.h"

#define SWEEP_SECONDS 60
#define UPLOAD_PATH_MAX 4096
/* A sandbox id and an owner as the database holds them. */
#define SANDBOX_ID_MAX 32
#define OWNER_MAX 128

typedef struct Slot {
        bool used;
        bool busy;   /* a commit or an abort is at work on it */
        bool doomed; /* its sandbox was deleted while busy: dropped when given back */
        char id[UPLOAD_ID_LEN + 1];
        char sandbox_id[SANDBOX_ID_MAX];
        char owner[OWNER_MAX];
        char *path;
        unsigned mode;
        uint64_t size;
        uint8_t sha256[32];
        int fd;
        uint8_t *received; /* per part: 0 missing, 1 whole, 2 short (the last) */
        uint64_t parts;    /* a file's part count, or an archive's bound */
        int64_t touched;
        bool archive;
        ReqUser user;
        /* Syncs of the staging file, shared by the parts that finish while
         * one runs (each sync a flush down to the host's disk). */
        uint64_t sync_asked, sync_done;
        bool syncing;
} Slot;

struct Uploads {
        pthread_mutex_t lock; /* the slots; taken before the store's own */
        pthread_cond_t synced; /* a slot's sync ended */
        const StoreUploadOps *ops;
        StoreUploads *h;
        char *dir;            /* state_dir/uploads */
        Slot slots[UPLOADS_MAX];
        unsigned owner_max;       /* under lock */
        uint64_t owner_max_bytes; /* under lock */
        pthread_mutex_t quit_lock;
        pthread_cond_t quit_cond;
        bool quit, started;
        pthread_t thread;
};

static bool id_ok(const char *s) {
        if (!s || strlen(s) != UPLOAD_ID_LEN || strncmp(s, "upl_", 4) != 0)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static char *staging_path(Uploads *u, const char *id) {
        char *p = NULL;
        return asprintf(&p, "%s/%s", u->dir, id) < 0 ? NULL : p;
}

static uint64_t declared(const Slot *s) {
        return s->archive ? s->parts * UPLOAD_CHUNK : s->size;
}

static void slot_clear(Slot *s) {
        if (s->fd >= 0)
                close(s->fd);
        free(s->path);
        free(s->received);
        *s = (Slot){ .fd = -1 };
}

static int fsync_dir(const char *dir) {
        _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) < 0)
                return -errno;
        return 0;
}

int uploads_open(const StoreBackend *b, const char *location, const char *state_dir, Uploads **ret) {
        if (!b || !b->uploads)
                return -EPROTONOSUPPORT;
        Uploads *u = calloc(1, sizeof(*u));
        if (!u || asprintf(&u->dir, "%s/uploads", state_dir) < 0) {
                free(u);
                return -ENOMEM;
        }
        int r = 0;
        if (mkdir(u->dir, 0700) < 0 && errno != EEXIST)
                r = -errno;
        u->ops = b->uploads;
        if (r == 0)
                r = u->ops->open(location, &u->h);
        if (r < 0) {
                free(u->dir);
                free(u);
                return r;
        }
        for (size_t i = 0; i < UPLOADS_MAX; i++)
                u->slots[i].fd = -1;
        u->owner_max = UPLOADS_PER_OWNER_DEFAULT;
        u->owner_max_bytes = (uint64_t)UPLOADS_PER_OWNER_MIB_DEFAULT << 20;
        pthread_mutex_init(&u->lock, NULL);
        pthread_cond_init(&u->synced, NULL);
        pthread_mutex_init(&u->quit_lock, NULL);
        pthread_cond_init(&u->quit_cond, NULL);
        *ret = u;
        return 0;
}

void uploads_close(Uploads *u) {
        if (!u)
                return;
        if (u->started) {
                pthread_mutex_lock(&u->quit_lock);
                u->quit = true;
                pthread_cond_broadcast(&u->quit_cond);
                pthread_mutex_unlock(&u->quit_lock);
                pthread_join(u->thread, NULL);
        }
        for (size_t i = 0; i < UPLOADS_MAX; i++)
                slot_clear(&u->slots[i]);
        u->ops->close(u->h);
        pthread_mutex_destroy(&u->lock);
        pthread_cond_destroy(&u->synced);
        pthread_mutex_destroy(&u->quit_lock);
        pthread_cond_destroy(&u->quit_cond);
        free(u->dir);
        free(u);
}

/* Drops a slot's upload: the row first, so that nothing more is recorded for
 * it, then its file. The lock is held. */
static void drop_locked(Uploads *u, Slot *s) {
        (void)u->ops->remove(u->h, s->id);
        _cleanup_free_ char *p = staging_path(u, s->id);
        if (p)
                (void)unlink(p);
        slot_clear(s);
}

static void sweep_locked(Uploads *u, int64_t now) {
        for (size_t i = 0; i < UPLOADS_MAX; i++) {
                Slot *s = &u->slots[i];
                if (s->used && !s->busy && now - s->touched > UPLOAD_IDLE_S)
                        drop_locked(u, s);
        }
}

static void *sweep_thread(void *arg) {
        Uploads *u = arg;
        pthread_mutex_lock(&u->quit_lock);
        while (!u->quit) {
                pthread_mutex_unlock(&u->quit_lock);
                pthread_mutex_lock(&u->lock);
                sweep_locked(u, time_now_unix());
                pthread_mutex_unlock(&u->lock);
                pthread_mutex_lock(&u->quit_lock);
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += SWEEP_SECONDS;
                if (!u->quit)
                        pthread_cond_timedwait(&u->quit_cond, &u->quit_lock, &ts);
        }
        pthread_mutex_unlock(&u->quit_lock);
        return NULL;
}

int uploads_start(Uploads *u) {
        int r = pthread_create(&u->thread, NULL, sweep_thread, u);
        if (r != 0)
                return -r;
        u->started = true;
        return 0;
}

int uploads_set_epoch(Uploads *u, const char *host_id, int64_t epoch) {
        return u->ops->set_writer(u->h, host_id, epoch);
}

void uploads_set_owner_bounds(Uploads *u, unsigned max_uploads, uint64_t max_mib) {
        pthread_mutex_lock(&u->lock);
        u->owner_max = max_uploads;
        u->owner_max_bytes = max_mib << 20;
        pthread_mutex_unlock(&u->lock);
}

void uploads_owner_bounds(Uploads *u, unsigned *ret_max_uploads, uint64_t *ret_max_mib) {
        pthread_mutex_lock(&u->lock);
        *ret_max_uploads = u->owner_max;
        *ret_max_mib = u->owner_max_bytes >> 20;
        pthread_mutex_unlock(&u->lock);
}

/* A free slot within the bounds for an upload of owner's sandbox_id
 * declaring bytes; the lock is held. The owner's bounds are checked before
 * the host's, so that an owner at its own bound is told so. -EMFILE past
 * the owner's, -EMLINK past the sandbox's, -EUSERS past the host's. */
static int slot_find_locked(Uploads *u, const char *owner, const char *sandbox_id, uint64_t bytes, Slot **ret) {
        size_t mine = 0, owners = 0;
        uint64_t total = 0, owners_bytes = 0;
        Slot *free_slot = NULL;
        for (size_t i = 0; i < UPLOADS_MAX; i++) {
                Slot *s = &u->slots[i];
                if (!s->used) {
                        if (!free_slot)
                                free_slot = s;
                        continue;
                }
                total += declared(s);
                if (strcmp(s->sandbox_id, sandbox_id) == 0)
                        mine++;
                if (strcmp(s->owner, owner) == 0) {
                        owners++;
                        owners_bytes += declared(s);
                }
        }
        if (owners >= u->owner_max || owners_bytes + bytes > u->owner_max_bytes)
                return -EMFILE;
        if (mine >= UPLOADS_PER_SANDBOX)
                return -EMLINK;
        if (!free_slot || total + bytes > (uint64_t)UPLOADS_MAX_TOTAL_MIB << 20)
                return -EUSERS;
        *ret = free_slot;
        return 0;
}

static int row_insert(Uploads *u, const Slot *s, int64_t now) {
        StoreUpload row = { .id = s->id, .sandbox_id = s->sandbox_id, .owner = s->owner, .path = s->path,
                            .archive = s->archive, .user = s->user, .mode = s->mode,
                            .size = s->archive ? 0 : (int64_t)s->size, .has_sha256 = !s->archive,
                            .chunk_bytes = UPLOAD_CHUNK, .parts = (int64_t)s->parts, .created_at = now,
                            .touched_at = now };
        memcpy(row.sha256, s->sha256, 32);
        return u->ops->insert(u->h, &row);
}

int uploads_begin(Uploads *u, const UploadSpec *spec, char ret_id[UPLOAD_ID_LEN + 1]) {
        if (strlen(spec->sandbox_id) >= SANDBOX_ID_MAX || strlen(spec->owner) >= OWNER_MAX ||
            strlen(spec->path) > UPLOAD_PATH_MAX || (unsigned)spec->user > REQ_AS_ROOT)
                return -EINVAL;
        uint64_t parts = spec->archive ? spec->max_parts : (spec->size + UPLOAD_CHUNK - 1) / UPLOAD_CHUNK;
        Slot s = { .used = true, .fd = -1, .mode = spec->mode, .size = spec->archive ? 0 : spec->size,
                   .parts = parts, .archive = spec->archive, .user = spec->user };
        memcpy(s.id, "upl_", 5);
        int r = random_hex(s.id + 4, 8);
        if (r < 0)
                return r;
        snprintf(s.sandbox_id, sizeof(s.sandbox_id), "%s", spec->sandbox_id);
        snprintf(s.owner, sizeof(s.owner), "%s", spec->owner);
        memcpy(s.sha256, spec->sha256, 32);
        s.path = strdup(spec->path);
        s.received = calloc(parts ? parts : 1, 1);
        _cleanup_free_ char *staged = staging_path(u, s.id);
        if (!s.path || !s.received || !staged) {
                slot_clear(&s);
                return -ENOMEM;
        }
        s.fd = open(staged, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        /* The file and its name durable before the row that names it. */
        if (s.fd < 0 || ftruncate(s.fd, (off_t)s.size) < 0 || fsync(s.fd) < 0 || (r = fsync_dir(u->dir)) < 0) {
                r = s.fd < 0 || r == 0 ? -errno : r;
                if (s.fd >= 0)
                        (void)unlink(staged);
                slot_clear(&s);
                return r;
        }
        int64_t now = time_now_unix();
        s.touched = now;
        pthread_mutex_lock(&u->lock);
        sweep_locked(u, now);
        Slot *slot = NULL;
        r = slot_find_locked(u, s.owner, s.sandbox_id, declared(&s), &slot);
        if (r == 0)
                r = row_insert(u, &s, now);
        if (r < 0) {
                pthread_mutex_unlock(&u->lock);
                (void)unlink(staged);
                slot_clear(&s);
                return r;
        }
        *slot = s;
        memcpy(ret_id, s.id, UPLOAD_ID_LEN + 1);
        pthread_mutex_unlock(&u->lock);
        return 0;
}

int uploads_take(Uploads *u, const char *id, const char *sandbox_id, const char *owner, bool exclusive,
                 UploadRef *ret) {
        pthread_mutex_lock(&u->lock);
        for (size_t i = 0; i < UPLOADS_MAX; i++) {
                Slot *s = &u->slots[i];
                if (!s->used || s->doomed || strcmp(s->id, id) != 0 || strcmp(s->sandbox_id, sandbox_id) != 0 ||
                    strcmp(s->owner, owner) != 0)
                        continue;
                if (s->busy && exclusive) {
                        pthread_mutex_unlock(&u->lock);
                        return -EBUSY;
                }
                /* A descriptor of its own: a commit or an abort may close the slot's. */
                UploadRef r = { .slot = i, .archive = s->archive, .exclusive = exclusive, .mode = s->mode,
                                .size = s->size, .parts = s->parts, .user = s->user,
                                .fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 3) };
                r.path = strdup(s->path);
                if (r.fd < 0 || !r.path) {
                        int k = r.fd < 0 ? -errno : -ENOMEM;
                        pthread_mutex_unlock(&u->lock);
                        upload_ref_done(&r);
                        return k;
                }
                memcpy(r.id, s->id, sizeof(r.id));
                memcpy(r.sha256, s->sha256, 32);
                if (exclusive)
                        s->busy = true;
                s->touched = time_now_unix();
                pthread_mutex_unlock(&u->lock);
                *ret = r;
                return 0;
        }
        pthread_mutex_unlock(&u->lock);
        return -ENOENT;
}

void upload_ref_done(UploadRef *r) {
        if (!r)
                return;
        if (r->fd >= 0)
                close(r->fd);
        free(r->path);
        *r = (UploadRef){ .fd = -1 };
}

/* The ref's slot, if it still holds the same upload; the lock is held. */
static Slot *slot_of_locked(Uploads *u, const UploadRef *r) {
        Slot *s = r->slot < UPLOADS_MAX ? &u->slots[r->slot] : NULL;
        return s && s->used && strcmp(s->id, r->id) == 0 ? s : NULL;
}

/* Makes what was written through r->fd durable: a sync that starts after
 * the call covers it, so parts that finish while one runs wait for the next
 * and share it. -ENOENT when the upload went meanwhile. */
static int part_sync(Uploads *u, const UploadRef *r) {
        int rc = 0;
        pthread_mutex_lock(&u->lock);
        Slot *s = slot_of_locked(u, r);
        uint64_t mine = s ? ++s->sync_asked : 0;
        while ((s = slot_of_locked(u, r)) && s->sync_done < mine) {
                if (s->syncing) {
                        pthread_cond_wait(&u->synced, &u->lock);
                        continue;
                }
                s->syncing = true;
                uint64_t covers = s->sync_asked;
                pthread_mutex_unlock(&u->lock);
                rc = fdatasync(r->fd) < 0 ? -errno : 0;
                pthread_mutex_lock(&u->lock);
                if ((s = slot_of_locked(u, r))) {
                        s->syncing = false;
                        if (rc == 0)
                                s->sync_done = covers;
                }
                pthread_cond_broadcast(&u->synced);
                if (rc < 0)
                        break;
        }
        pthread_mutex_unlock(&u->lock);
        return rc < 0 ? rc : s ? 0 : -ENOENT;
}

int uploads_part_arrived(Uploads *u, const UploadRef *r, uint64_t index, uint64_t bytes) {
        if (index >= r->parts || bytes == 0 || bytes > UPLOAD_CHUNK)
                return -EINVAL;
        /* The bytes first: a recorded part must never read back as zeros. */
        int rc = part_sync(u, r);
        if (rc < 0)
                return rc;
        int64_t now = time_now_unix();
        /* The part's row and the upload's time, in one transaction of the
         * store; without the slots' lock: the sync of the commit holds up
         * no other part's start. */
        rc = u->ops->record_part(u->h, r->id, index, bytes, now);
        if (rc < 0)
                return rc;
        /* Recorded: the upload may have gone meanwhile (its parts with it). */
        pthread_mutex_lock(&u->lock);
        Slot *s = slot_of_locked(u, r);
        if (s && !s->doomed) {
                s->received[index] = bytes == UPLOAD_CHUNK ? 1 : 2;
                s->touched = now;
        } else
                rc = -ENOENT;
        pthread_mutex_unlock(&u->lock);
        return rc;
}

int uploads_received(Uploads *u, const UploadRef *r, uint8_t **ret) {
        pthread_mutex_lock(&u->lock);
        Slot *s = slot_of_locked(u, r);
        uint8_t *copy = s ? malloc(s->parts ? s->parts : 1) : NULL;
        if (copy && s->parts)
                memcpy(copy, s->received, s->parts);
        pthread_mutex_unlock(&u->lock);
        if (!copy)
                return s ? -ENOMEM : -ENOENT;
        *ret = copy;
        return 0;
}

void uploads_release(Uploads *u, UploadRef *r) {
        pthread_mutex_lock(&u->lock);
        Slot *s = slot_of_locked(u, r);
        if (s && r->exclusive) {
                s->busy = false;
                if (s->doomed)
                        drop_locked(u, s);
        }
        pthread_mutex_unlock(&u->lock);
        upload_ref_done(r);
}

void uploads_drop(Uploads *u, UploadRef *r) {
        pthread_mutex_lock(&u->lock);
        Slot *s = slot_of_locked(u, r);
        if (s)
                drop_locked(u, s);
        pthread_mutex_unlock(&u->lock);
        upload_ref_done(r);
}

void uploads_drop_sandbox(Uploads *u, const char *sandbox_id) {
        if (!u)
                return;
        pthread_mutex_lock(&u->lock);
        for (size_t i = 0; i < UPLOADS_MAX; i++) {
                Slot *s = &u->slots[i];
                if (!s->used || strcmp(s->sandbox_id, sandbox_id) != 0)
                        continue;
                if (!s->busy)
                        drop_locked(u, s);
                else {
                        /* Its commit holds it: no longer found, and gone
                         * when given back. The row goes now. */
                        s->doomed = true;
                        (void)u->ops->remove(u->h, s->id);
                }
        }
        /* Rows no slot holds (before the restore took them) go as well. */
        (void)u->ops->remove_sandbox(u->h, sandbox_id);
        pthread_mutex_unlock(&u->lock);
}

unsigned uploads_count(Uploads *u) {
        unsigned n = 0;
        pthread_mutex_lock(&u->lock);
        for (size_t i = 0; i < UPLOADS_MAX; i++)
                n += u->slots[i].used;
        pthread_mutex_unlock(&u->lock);
        return n;
}

/* ---- after a restart ---- */

/* The parts recorded for s, checked against its shape; -EINVAL for one that
 * cannot be (past its end, of a wrong length). The lock is held. */
static int parts_load_locked(Slot *s, const StoreUploadListed *l) {
        for (size_t k = 0; k < l->n_parts; k++) {
                int64_t i = l->parts[k].index, n = l->parts[k].bytes;
                if (i < 0 || (uint64_t)i >= s->parts || n <= 0 || n > (int64_t)UPLOAD_CHUNK)
                        return -EINVAL;
                uint64_t want = UPLOAD_CHUNK;
                if (!s->archive && s->size - (uint64_t)i * UPLOAD_CHUNK < UPLOAD_CHUNK)
                        want = s->size - (uint64_t)i * UPLOAD_CHUNK;
                if (!s->archive && (uint64_t)n != want)
                        return -EINVAL;
                s->received[i] = n == (int64_t)UPLOAD_CHUNK ? 1 : 2;
        }
        return 0;
}

/* One upload of the store into a slot, or a reason to drop it; the lock is
 * held. */
static int restore_one_locked(Uploads *u, const StoreUploadListed *l, uint64_t max_bytes, int64_t now) {
        const StoreUpload *row = &l->row;
        const char *id = row->id, *sandbox = row->sandbox_id, *owner = row->owner, *path = row->path;
        bool archive = row->archive;
        int64_t size = row->size, parts = row->parts;
        if (!id_ok(id) || !l->sandbox_live || !*path || strlen(path) > UPLOAD_PATH_MAX || *path != '/' ||
            strlen(sandbox) >= SANDBOX_ID_MAX || strlen(owner) >= OWNER_MAX ||
            row->chunk_bytes != (int64_t)UPLOAD_CHUNK || now - row->touched_at > UPLOAD_IDLE_S || size < 0 ||
            parts < 0)
                return -EINVAL;
        uint64_t bound = (max_bytes + UPLOAD_CHUNK - 1) / UPLOAD_CHUNK;
        Slot s = { .used = true, .fd = -1, .archive = archive, .touched = row->touched_at,
                   .mode = row->mode & 0777, .user = row->user };
        if (archive) {
                /* The bound of the daemon now: a lower --max-file-mib holds
                 * for the parts still to come. */
                s.parts = (uint64_t)parts < bound ? (uint64_t)parts : bound;
        } else {
                if ((uint64_t)size > max_bytes || !row->has_sha256)
                        return -EINVAL;
                s.size = (uint64_t)size;
                s.parts = (s.size + UPLOAD_CHUNK - 1) / UPLOAD_CHUNK;
                if ((uint64_t)parts != s.parts)
                        return -EINVAL;
                memcpy(s.sha256, row->sha256, 32);
        }
        Slot *slot = NULL;
        if (slot_find_locked(u, owner, sandbox, declared(&s), &slot) < 0)
                return -EUSERS;
        memcpy(s.id, id, UPLOAD_ID_LEN + 1);
        snprintf(s.sandbox_id, sizeof(s.sandbox_id), "%s", sandbox);
        snprintf(s.owner, sizeof(s.owner), "%s", owner);
        s.path = strdup(path);
        s.received = calloc(s.parts ? s.parts : 1, 1);
        _cleanup_free_ char *staged = staging_path(u, id);
        int r = !s.path || !s.received || !staged ? -ENOMEM : 0;
        struct stat sb = { 0 };
        if (r == 0) {
                s.fd = open(staged, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
                if (s.fd < 0 || fstat(s.fd, &sb) < 0 || !S_ISREG(sb.st_mode))
                        r = -ENOENT;
                else if (!archive && (uint64_t)sb.st_size != s.size)
                        r = -EINVAL;
        }
        if (r == 0)
                r = parts_load_locked(&s, l);
        /* An archive's parts come in order: one past a lowered bound is
         * already more than the daemon takes now. */
        if (r == 0 && archive && (uint64_t)sb.st_size > s.parts * UPLOAD_CHUNK)
                r = -EFBIG;
        if (r < 0) {
                slot_clear(&s);
                return r;
        }
        *slot = s;
        return 0;
}

/* What a restore walks the store's uploads with. */
typedef struct RestoreWalk {
        Uploads *u;
        uint64_t max_bytes;
        int64_t now;
        unsigned kept, dropped;
        char **gone; /* the ids of the dropped, whose rows go after the walk */
        size_t n_gone;
        UploadsOurs ours;
        void *ours_data;
} RestoreWalk;

static int restore_each(const StoreUploadListed *l, void *userdata) {
        RestoreWalk *w = userdata;
        if (w->ours && !w->ours(w->ours_data, l->row.sandbox_id))
                return 0;
        if (restore_one_locked(w->u, l, w->max_bytes, w->now) == 0) {
                w->kept++;
                return 0;
        }
        w->dropped++;
        char **grown = realloc(w->gone, (w->n_gone + 1) * sizeof(*w->gone));
        if (!grown)
                return 0;
        w->gone = grown;
        if ((w->gone[w->n_gone] = strdup(l->row.id)))
                w->n_gone++;
        return 0;
}

int uploads_restore(Uploads *u, uint64_t max_bytes, UploadsOurs ours, void *userdata, unsigned *ret_kept,
                    unsigned *ret_dropped) {
        RestoreWalk w = { .u = u, .max_bytes = max_bytes, .now = time_now_unix(), .ours = ours, .ours_data = userdata };
        pthread_mutex_lock(&u->lock);
        /* Oldest first: past a bound, the newest go. */
        int r = u->ops->list(u->h, restore_each, &w);
        for (size_t i = 0; i < w.n_gone; i++) {
                if (r == 0)
                        (void)u->ops->remove(u->h, w.gone[i]);
                free(w.gone[i]);
        }
        free(w.gone);
        if (r < 0) {
                pthread_mutex_unlock(&u->lock);
                return r;
        }
        /* What the directory holds beyond the kept uploads: a begin or a drop
         * cut by the crash. */
        DIR *d = opendir(u->dir);
        if (d) {
                struct dirent *de;
                while ((de = readdir(d))) {
                        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                                continue;
                        bool known = false;
                        for (size_t i = 0; i < UPLOADS_MAX && !known; i++)
                                known = u->slots[i].used && strcmp(u->slots[i].id, de->d_name) == 0;
                        if (!known)
                                (void)unlinkat(dirfd(d), de->d_name, 0);
                }
                closedir(d);
        }
        pthread_mutex_unlock(&u->lock);
        *ret_kept = w.kept;
        *ret_dropped = w.dropped;
        return 0;
}
