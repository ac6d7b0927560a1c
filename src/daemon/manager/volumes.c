/* Volumes: the store's records and the disks on the host (volumes.h). */
#include "daemon/manager/volumes.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/model/backup_policy.h"
#include "driver/rootfs.h"
#include "driver/volume_disk.h"

struct Volumes {
        const StoreVolumeOps *ops;
        StoreVolumes *h;
        VolumeLimits lim;
        char dir[PATH_MAX]; /* state_dir/volumes: the images and their mount points */
        /* Mounts, unmounts and grows of the disks: two starts of one shared
         * volume must not mount its image twice (two ext4 instances on one
         * file corrupt it). */
        pthread_mutex_t disk_lock;
        /* An SQLite store is one host's: every file is here. In a fleet a
         * volume's and a backup's files are on the host that made them. */
        bool one_host;
        unsigned day_seconds; /* the length of a day in backup policies */
        unsigned sweep_seconds;
        pthread_t sweeper;
        bool sweeping;
        bool quit;
        pthread_mutex_t quit_lock;
        pthread_cond_t quit_cond;
};

static StoreVolumeBounds bounds_of(const Volumes *vs) {
        return (StoreVolumeBounds){ .max_count = vs->lim.max_count, .max_total_mib = vs->lim.max_total_mib };
}

static int image_path(const Volumes *vs, const char *id, char *buf, size_t n) {
        return snprintf(buf, n, "%s/%s.img", vs->dir, id) >= (int)n ? -ENAMETOOLONG : 0;
}

static int mount_path(const Volumes *vs, const char *id, char *buf, size_t n) {
        return snprintf(buf, n, "%s/%s.mnt", vs->dir, id) >= (int)n ? -ENAMETOOLONG : 0;
}

int volumes_open(const StoreBackend *b, const char *location, const char *state_dir, const VolumeLimits *lim,
                 Volumes **ret) {
        if (!b->volumes)
                return -EOPNOTSUPP;
        Volumes *vs = calloc(1, sizeof(*vs));
        if (!vs)
                return -ENOMEM;
        vs->ops = b->volumes;
        vs->lim = *lim;
        vs->one_host = b->volumes == &store_sqlite_volumes;
        vs->day_seconds = VOLUME_DAY_SECONDS;
        pthread_mutex_init(&vs->disk_lock, NULL);
        pthread_mutex_init(&vs->quit_lock, NULL);
        pthread_cond_init(&vs->quit_cond, NULL);
        int r = snprintf(vs->dir, sizeof vs->dir, "%s/volumes", state_dir) >= (int)sizeof vs->dir ? -ENAMETOOLONG : 0;
        if (r == 0 && mkdir(vs->dir, 0700) < 0 && errno != EEXIST)
                r = -errno;
        if (r == 0)
                r = vs->ops->open(location, &vs->h);
        if (r < 0) {
                volumes_close(vs);
                return r;
        }
        *ret = vs;
        return 0;
}

/* The host's mounts of the volumes go with the daemon: a sandbox left
 * running holds its own bind of each, and the next daemon mounts a volume
 * again when a start needs it. */
static void unmount_all(Volumes *vs) {
        DIR *d = opendir(vs->dir);
        if (!d)
                return;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t n = strlen(de->d_name);
                char mnt[PATH_MAX];
                if (n < 5 || strcmp(de->d_name + n - 4, ".mnt") != 0 ||
                    snprintf(mnt, sizeof mnt, "%s/%s", vs->dir, de->d_name) >= (int)sizeof mnt)
                        continue;
                (void)volume_disk_unmount(mnt);
        }
        closedir(d);
}

void volumes_close(Volumes *vs) {
        if (!vs)
                return;
        if (vs->sweeping) {
                pthread_mutex_lock(&vs->quit_lock);
                vs->quit = true;
                pthread_cond_signal(&vs->quit_cond);
                pthread_mutex_unlock(&vs->quit_lock);
                pthread_join(vs->sweeper, NULL);
        }
        if (vs->h)
                unmount_all(vs);
        if (vs->h)
                vs->ops->close(vs->h);
        pthread_mutex_destroy(&vs->disk_lock);
        pthread_mutex_destroy(&vs->quit_lock);
        pthread_cond_destroy(&vs->quit_cond);
        free(vs);
}

const VolumeLimits *volumes_limits(const Volumes *vs) {
        return &vs->lim;
}

int volumes_set_epoch(Volumes *vs, const char *host_id, int64_t epoch) {
        return vs->ops->set_writer(vs->h, host_id, epoch);
}

int volumes_create(Volumes *vs, const char *owner, const char *name, const char *labels, uint32_t size_mib,
                   bool shared, StoreVolume *ret) {
        StoreVolume v = { .size_mib = size_mib, .shared = shared, .state = STORE_VOLUME_READY,
                          .created_at = time_now_unix() };
        char hex[21], img[PATH_MAX];
        int r = random_hex(hex, 10);
        if (r < 0)
                return r;
        snprintf(v.id, sizeof v.id, "vol_%s", hex);
        snprintf(v.owner, sizeof v.owner, "%s", owner);
        snprintf(v.name, sizeof v.name, "%s", name ? name : "");
        snprintf(v.labels, sizeof v.labels, "%s", labels ? labels : "{}");
        if ((r = image_path(vs, v.id, img, sizeof img)) < 0)
                return r;
        StoreVolumeBounds b = bounds_of(vs);
        /* The record first: the bounds are checked there, before any disk. */
        if ((r = vs->ops->insert(vs->h, &v, &b)) < 0)
                return r;
        if ((r = volume_disk_create(img, size_mib)) < 0) {
                (void)vs->ops->remove(vs->h, owner, v.id, true);
                return r;
        }
        *ret = v;
        return 0;
}

int volumes_get(Volumes *vs, const char *owner, const char *id, StoreVolume *ret) {
        return vs->ops->get(vs->h, owner, id, ret);
}

int volumes_list(Volumes *vs, const char *owner, const char *name, int64_t after_created, const char *after_id,
                 size_t limit, StoreVolume **ret, size_t *ret_n) {
        return vs->ops->list(vs->h, owner, name ? name : "", after_created, after_id ? after_id : "", limit, ret,
                             ret_n);
}

int volumes_attachments(Volumes *vs, const char *id, StoreVolumeAttachment **ret, size_t *ret_n) {
        return vs->ops->attachments(vs->h, id, ret, ret_n);
}

int volumes_resize(Volumes *vs, const char *owner, const char *id, uint32_t size_mib, StoreVolume *ret) {
        StoreVolume v;
        char img[PATH_MAX], mnt[PATH_MAX];
        int r = vs->ops->get(vs->h, owner, id, &v);
        if (r < 0)
                return r;
        if (size_mib <= v.size_mib)
                return size_mib == v.size_mib ? (*ret = v, 0) : -EINVAL;
        if ((r = image_path(vs, id, img, sizeof img)) < 0 || (r = mount_path(vs, id, mnt, sizeof mnt)) < 0)
                return r;
        StoreVolumeBounds b = bounds_of(vs);
        if ((r = vs->ops->resize_begin(vs->h, owner, id, size_mib, &b)) < 0)
                return r;
        /* Nothing is attached, so nothing holds the host's mount. */
        pthread_mutex_lock(&vs->disk_lock);
        r = volume_disk_unmount(mnt);
        if (r == 0)
                r = volume_disk_grow(img, size_mib);
        pthread_mutex_unlock(&vs->disk_lock);
        /* A grow that failed leaves the filesystem at its old size (resize2fs
         * changes nothing it cannot finish); the record says so. */
        int e = vs->ops->resize_end(vs->h, id, r == 0 ? size_mib : v.size_mib);
        if (r < 0)
                return r;
        if (e < 0)
                return e;
        return vs->ops->get(vs->h, owner, id, ret);
}

int volumes_delete(Volumes *vs, const char *owner, const char *id, bool force) {
        char img[PATH_MAX], mnt[PATH_MAX];
        int r;
        if ((r = image_path(vs, id, img, sizeof img)) < 0 || (r = mount_path(vs, id, mnt, sizeof mnt)) < 0)
                return r;
        if ((r = vs->ops->remove(vs->h, owner, id, force)) < 0)
                return r;
        /* A sandbox still running with it (a forced delete) keeps its view
         * until it ends; the file's blocks go then. */
        pthread_mutex_lock(&vs->disk_lock);
        (void)volume_disk_unmount(mnt);
        (void)rmdir(mnt);
        r = unlink(img) < 0 && errno != ENOENT ? -errno : 0;
        pthread_mutex_unlock(&vs->disk_lock);
        return r;
}

static int backup_path(const Volumes *vs, const char *id, char *buf, size_t n) {
        return snprintf(buf, n, "%s/backups/%s.img", vs->dir, id) >= (int)n ? -ENAMETOOLONG : 0;
}

/* A copy of img at to; a mounted filesystem at mnt frozen meanwhile. */
static int copy_disk(const char *img, const char *mnt, const char *to) {
        /* A guest holding it writing (a microVM's volume) cannot be frozen
         * from here: a copy of it would be torn. */
        if (volume_disk_held(img))
                return -EBUSY;
        /* A sandbox left running by a live restore binds a filesystem the
         * daemon's mount no longer shows: mounted again (the same one), it
         * is frozen for the copy as any other. */
        if (!volume_disk_mounted(mnt) && rootfs_loop_backed(img))
                (void)volume_disk_mount(img, mnt);
        _cleanup_close_ int fd = volume_disk_mounted(mnt) ? open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        bool frozen = fd >= 0 && ioctl(fd, FIFREEZE, 0) == 0;
        int r = rootfs_copy_image(img, to);
        if (frozen)
                (void)ioctl(fd, FITHAW, 0);
        if (r < 0)
                (void)unlink(to);
        return r;
}

int64_t volumes_expiry(const Volumes *vs, int64_t now, uint32_t retention_days) {
        return retention_days ? now + (int64_t)retention_days * vs->day_seconds : 0;
}

/* A backup, by request or (scheduled) by the sweep. */
static int take_backup(Volumes *vs, const char *owner, const char *id, const char *name, uint32_t retention_days,
                       bool scheduled, StoreVolumeBackup *ret) {
        StoreVolume v;
        StoreVolumeBackup b = { .created_at = time_now_unix(), .scheduled = scheduled };
        b.expires_at = volumes_expiry(vs, b.created_at, retention_days);
        char hex[21], img[PATH_MAX], mnt[PATH_MAX], to[PATH_MAX], dir[PATH_MAX];
        int r = vs->ops->get(vs->h, owner, id, &v);
        if (r < 0 || (r = random_hex(hex, 10)) < 0)
                return r;
        snprintf(b.id, sizeof b.id, "vb_%s", hex);
        snprintf(b.owner, sizeof b.owner, "%s", owner);
        snprintf(b.volume_id, sizeof b.volume_id, "%s", id);
        snprintf(b.name, sizeof b.name, "%s", name ? name : "");
        b.size_mib = v.size_mib;
        if ((r = image_path(vs, id, img, sizeof img)) < 0 || (r = mount_path(vs, id, mnt, sizeof mnt)) < 0 ||
            (r = backup_path(vs, b.id, to, sizeof to)) < 0)
                return r;
        if (snprintf(dir, sizeof dir, "%s/backups", vs->dir) >= (int)sizeof dir)
                return -ENAMETOOLONG;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if ((r = vs->ops->backup_insert(vs->h, &b, VOLUME_BACKUPS_PER_OWNER)) < 0)
                return r;
        pthread_mutex_lock(&vs->disk_lock);
        r = copy_disk(img, mnt, to);
        pthread_mutex_unlock(&vs->disk_lock);
        if (r < 0) {
                (void)vs->ops->backup_remove(vs->h, owner, b.id);
                return r;
        }
        *ret = b;
        return 0;
}

int volumes_backup(Volumes *vs, const char *owner, const char *id, const char *name, uint32_t retention_days,
                   StoreVolumeBackup *ret) {
        return take_backup(vs, owner, id, name, retention_days, false, ret);
}

int volumes_backup_get(Volumes *vs, const char *owner, const char *id, StoreVolumeBackup *ret) {
        return vs->ops->backup_get(vs->h, owner, id, ret);
}

int volumes_backup_list(Volumes *vs, const char *owner, const char *volume_id, int64_t after_created,
                        const char *after_id, size_t limit, StoreVolumeBackup **ret, size_t *ret_n) {
        return vs->ops->backup_list(vs->h, owner, volume_id ? volume_id : "", after_created, after_id ? after_id : "",
                                    limit, ret, ret_n);
}

int volumes_backup_delete(Volumes *vs, const char *owner, const char *id) {
        char path[PATH_MAX];
        int r = backup_path(vs, id, path, sizeof path);
        if (r < 0 || (r = vs->ops->backup_remove(vs->h, owner, id)) < 0)
                return r;
        return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
}

int volumes_restore(Volumes *vs, const char *owner, const char *backup_id, const char *name, StoreVolume *ret) {
        StoreVolumeBackup b;
        char from[PATH_MAX], img[PATH_MAX], hex[21];
        int r = vs->ops->backup_get(vs->h, owner, backup_id, &b);
        if (r < 0 || (r = backup_path(vs, backup_id, from, sizeof from)) < 0 || (r = random_hex(hex, 10)) < 0)
                return r;
        StoreVolume v = { .size_mib = b.size_mib, .state = STORE_VOLUME_READY, .created_at = time_now_unix() };
        snprintf(v.id, sizeof v.id, "vol_%s", hex);
        snprintf(v.owner, sizeof v.owner, "%s", owner);
        snprintf(v.name, sizeof v.name, "%s", name ? name : "");
        snprintf(v.labels, sizeof v.labels, "{}");
        if ((r = image_path(vs, v.id, img, sizeof img)) < 0)
                return r;
        StoreVolumeBounds bounds = bounds_of(vs);
        if ((r = vs->ops->insert(vs->h, &v, &bounds)) < 0)
                return r;
        if ((r = rootfs_copy_sparse(from, img)) < 0) {
                (void)unlink(img);
                (void)vs->ops->remove(vs->h, owner, v.id, true);
                return r;
        }
        *ret = v;
        return 0;
}

/* The first time after now that a policy's cron falls on. */
static int cron_after(const char *text, int64_t now, int64_t *ret) {
        CronSchedule c;
        CronField f;
        return cron_parse(text, &c, &f) < 0 ? -EINVAL : cron_next(&c, now, ret);
}

/* When a schedule set at now is first due: an interval at the next sweep,
 * a cron at its next time; never without either. */
static int first_due(const StoreVolumeBackupPolicy *p, int64_t now, int64_t *ret) {
        if (p->cron[0])
                return cron_after(p->cron, now, ret);
        *ret = p->every_minutes ? now : 0;
        return 0;
}

int volumes_set_backup_policy(Volumes *vs, const char *owner, const char *id, const StoreVolumeBackupPolicy *want,
                              StoreVolume *ret) {
        StoreVolume v;
        int r = vs->ops->get(vs->h, owner, id, &v);
        if (r < 0)
                return r;
        StoreVolumeBackupPolicy p = *want;
        p.next_at = v.policy.next_at;
        if ((p.every_minutes != v.policy.every_minutes || strcmp(p.cron, v.policy.cron) != 0) &&
            (r = first_due(&p, time_now_unix(), &p.next_at)) < 0)
                return r;
        if ((r = vs->ops->set_policy(vs->h, owner, id, &p)) < 0)
                return r;
        return vs->ops->get(vs->h, owner, id, ret);
}

static bool file_here(const Volumes *vs, int (*path_of)(const Volumes *, const char *, char *, size_t),
                      const char *id) {
        char path[PATH_MAX];
        return path_of(vs, id, path, sizeof path) == 0 && access(path, F_OK) == 0;
}

#define SWEEP_BATCH 64u

/* The backups past their retention whose files are here (or, on one host,
 * whose files are gone) go; the store's delete lets one host do each. */
static void expire_backups(Volumes *vs, int64_t now) {
        StoreVolumeBackup *all = NULL;
        size_t n = 0;
        int r = vs->ops->backups_expired(vs->h, now, SWEEP_BATCH, &all, &n);
        if (r < 0) {
                log_warn(NULL, "volume backups: reading the expired ones: %s", strerror(-r));
                return;
        }
        for (size_t i = 0; i < n; i++) {
                if (!vs->one_host && !file_here(vs, backup_path, all[i].id))
                        continue;
                r = volumes_backup_delete(vs, all[i].owner, all[i].id);
                if (r == 0)
                        log_info(NULL, "volume backup %s of %s deleted: its retention ended", all[i].id,
                                 all[i].volume_id);
                else if (r != -ENOENT)
                        log_warn(NULL, "volume backup %s: deleting it at its retention's end: %s", all[i].id,
                                 strerror(-r));
        }
        free(all);
}

/* The next time after now on the policy's schedule: a daemon that was
 * down takes one backup for the times it missed. An interval's grid is in
 * the daemon's days (day_seconds); a cron's times are UTC's. */
static int next_due(const Volumes *vs, const StoreVolumeBackupPolicy *p, int64_t now, int64_t *ret) {
        if (p->cron[0])
                return cron_after(p->cron, now, ret);
        int64_t every = (int64_t)p->every_minutes * vs->day_seconds / VOLUME_BACKUP_DAILY_MINUTES;
        if (every < 1)
                every = 1;
        *ret = p->next_at + ((now - p->next_at) / every + 1) * every;
        return 0;
}

/* Each due volume whose image is here: the claim moves its next time on,
 * then the copy is made, kept as its policy says. A copy that fails (the
 * owner's bound on backups, no room) waits for the next time. */
static void take_due_backups(Volumes *vs, int64_t now) {
        StoreVolume *all = NULL;
        size_t n = 0;
        int r = vs->ops->backups_due(vs->h, now, SWEEP_BATCH, &all, &n);
        if (r < 0) {
                log_warn(NULL, "volume backups: reading the due ones: %s", strerror(-r));
                return;
        }
        for (size_t i = 0; i < n; i++) {
                const StoreVolume *v = &all[i];
                int64_t next;
                if (!file_here(vs, image_path, v->id))
                        continue;
                if ((r = next_due(vs, &v->policy, now, &next)) < 0) {
                        log_warn(NULL, "volume %s: its backup schedule %s: %s", v->id, v->policy.cron, strerror(-r));
                        continue;
                }
                if (vs->ops->claim_backup(vs->h, v->id, v->policy.next_at, next) < 0)
                        continue;
                StoreVolumeBackup b;
                r = take_backup(vs, v->owner, v->id, "scheduled", v->policy.retention_days, true, &b);
                if (r == 0)
                        log_info(NULL, "volume %s backed up as %s on its schedule", v->id, b.id);
                else
                        log_warn(NULL, "volume %s: its scheduled backup: %s", v->id,
                                 r == -EUSERS ? "its owner has the most backups this daemon keeps" : strerror(-r));
        }
        free(all);
}

/* The volume's scheduled backups that none of its keep counts keeps go,
 * those whose files are here (or, on one host, all). Its backups are one
 * page: an owner has at most VOLUME_BACKUPS_PER_OWNER. */
static void prune_volume(Volumes *vs, const StoreVolume *v) {
        _cleanup_free_ StoreVolumeBackup *all = NULL;
        size_t n = 0, kept = 0;
        int r = vs->ops->backup_list(vs->h, v->owner, v->id, 0, "", VOLUME_BACKUPS_PER_OWNER, &all, &n);
        if (r < 0) {
                log_warn(NULL, "volume %s: reading its backups to prune: %s", v->id, strerror(-r));
                return;
        }
        StoreVolumeBackup *sched[VOLUME_BACKUPS_PER_OWNER];
        int64_t created[VOLUME_BACKUPS_PER_OWNER];
        bool keep[VOLUME_BACKUPS_PER_OWNER];
        for (size_t i = 0; i < n && kept < VOLUME_BACKUPS_PER_OWNER; i++)
                if (all[i].scheduled) {
                        sched[kept] = &all[i];
                        created[kept++] = all[i].created_at;
                }
        backup_keep_select(&v->policy.keep, created, kept, keep);
        for (size_t i = 0; i < kept; i++) {
                if (keep[i] || (!vs->one_host && !file_here(vs, backup_path, sched[i]->id)))
                        continue;
                r = volumes_backup_delete(vs, sched[i]->owner, sched[i]->id);
                if (r == 0)
                        log_info(NULL, "volume backup %s of %s deleted: no keep count of its policy keeps it",
                                 sched[i]->id, v->id);
                else if (r != -ENOENT)
                        log_warn(NULL, "volume backup %s: deleting it past its policy's keep counts: %s",
                                 sched[i]->id, strerror(-r));
        }
}

static void prune_backups(Volumes *vs) {
        char after[STORE_VOLUME_ID_MAX] = "";
        size_t n = SWEEP_BATCH;
        while (n == SWEEP_BATCH) {
                _cleanup_free_ StoreVolume *all = NULL;
                int r = vs->ops->kept_by_counts(vs->h, after, SWEEP_BATCH, &all, &n);
                if (r < 0) {
                        log_warn(NULL, "volume backups: reading the policies with keep counts: %s", strerror(-r));
                        return;
                }
                for (size_t i = 0; i < n; i++)
                        prune_volume(vs, &all[i]);
                if (n > 0)
                        snprintf(after, sizeof after, "%s", all[n - 1].id);
        }
}

static void *sweep_thread(void *userdata) {
        Volumes *vs = userdata;
        pthread_mutex_lock(&vs->quit_lock);
        while (!vs->quit) {
                pthread_mutex_unlock(&vs->quit_lock);
                int64_t now = time_now_unix();
                expire_backups(vs, now);
                take_due_backups(vs, now);
                prune_backups(vs);
                pthread_mutex_lock(&vs->quit_lock);
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += vs->sweep_seconds;
                if (!vs->quit)
                        pthread_cond_timedwait(&vs->quit_cond, &vs->quit_lock, &ts);
        }
        pthread_mutex_unlock(&vs->quit_lock);
        return NULL;
}

int volumes_start_sweep(Volumes *vs, unsigned sweep_seconds, unsigned day_seconds) {
        vs->sweep_seconds = sweep_seconds ? sweep_seconds : VOLUME_SWEEP_DEFAULT_SECONDS;
        vs->day_seconds = day_seconds ? day_seconds : VOLUME_DAY_SECONDS;
        int r = pthread_create(&vs->sweeper, NULL, sweep_thread, vs);
        if (r != 0)
                return -r;
        vs->sweeping = true;
        return 0;
}

int volumes_attach(Volumes *vs, const char *owner, const char *sandbox_id, const SandboxVolume *v) {
        StoreVolumeAttachment a = { .read_only = v->read_only, .created_at = time_now_unix() };
        snprintf(a.volume_id, sizeof a.volume_id, "%s", v->volume_id);
        snprintf(a.sandbox_id, sizeof a.sandbox_id, "%s", sandbox_id);
        snprintf(a.path, sizeof a.path, "%s", v->path);
        return vs->ops->attach(vs->h, owner, &a);
}

int volumes_detach(Volumes *vs, const char *volume_id, const char *sandbox_id) {
        return vs->ops->detach(vs->h, volume_id, sandbox_id);
}

int volumes_attach_spec(Volumes *vs, const char *owner, const char *sandbox_id, const SandboxSpec *spec,
                        size_t *ret_failed) {
        for (size_t i = 0; i < spec->n_volumes; i++) {
                int r = volumes_attach(vs, owner, sandbox_id, &spec->volumes[i]);
                if (r < 0) {
                        (void)vs->ops->detach_sandbox(vs->h, sandbox_id);
                        *ret_failed = i;
                        return r;
                }
        }
        return 0;
}

int volumes_release(Volumes *vs, const char *sandbox_id) {
        return vs->ops->detach_sandbox(vs->h, sandbox_id);
}

/* The volume's image for a guest kernel: the host's mount of it goes
 * first, unless a sandbox still binds it. */
static int hold_image(const char *img, const char *mnt, bool read_only, int *ret_fd) {
        int r = volume_disk_release_host(img, mnt);
        return r < 0 ? r : volume_disk_hold(img, read_only, ret_fd);
}

int volumes_mounts(Volumes *vs, const SandboxSpec *spec, bool images, VolumeMountPaths *ret, size_t *ret_failed) {
        int r = 0;
        ret->n = 0;
        pthread_mutex_lock(&vs->disk_lock);
        for (size_t i = 0; r == 0 && i < spec->n_volumes; i++) {
                const SandboxVolume *sv = &spec->volumes[i];
                char img[PATH_MAX], mnt[PATH_MAX];
                int fd = -1;
                *ret_failed = i;
                if ((r = image_path(vs, sv->volume_id, img, sizeof img)) < 0 ||
                    (r = mount_path(vs, sv->volume_id, mnt, sizeof mnt)) < 0)
                        break;
                if (access(img, F_OK) < 0) {
                        r = -ENOENT;
                        break;
                }
                if (images)
                        r = hold_image(img, mnt, sv->read_only, &fd);
                else
                        r = volume_disk_mount(img, mnt);
                if (r < 0)
                        break;
                snprintf(ret->source[i], sizeof ret->source[i], "%s", images ? img : mnt);
                ret->mounts[i] = (DriverMount){ .source = ret->source[i], .dest = sv->path,
                                                .read_only = sv->read_only, .image_fd = fd };
                ret->n = i + 1;
        }
        pthread_mutex_unlock(&vs->disk_lock);
        if (r < 0)
                volumes_mounts_close(ret);
        return r;
}

void volumes_mounts_close(VolumeMountPaths *m) {
        for (size_t i = 0; i < m->n; i++)
                if (m->mounts[i].image_fd >= 0) {
                        close(m->mounts[i].image_fd);
                        m->mounts[i].image_fd = -1;
                }
        m->n = 0;
}
