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

#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
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
        pthread_mutex_init(&vs->disk_lock, NULL);
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
        if (vs->h)
                unmount_all(vs);
        if (vs->h)
                vs->ops->close(vs->h);
        pthread_mutex_destroy(&vs->disk_lock);
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
        _cleanup_close_ int fd = volume_disk_mounted(mnt) ? open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        bool frozen = fd >= 0 && ioctl(fd, FIFREEZE, 0) == 0;
        int r = rootfs_copy_image(img, to);
        if (frozen)
                (void)ioctl(fd, FITHAW, 0);
        if (r < 0)
                (void)unlink(to);
        return r;
}

int volumes_backup(Volumes *vs, const char *owner, const char *id, const char *name, StoreVolumeBackup *ret) {
        StoreVolume v;
        StoreVolumeBackup b = { .created_at = time_now_unix() };
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

int volumes_attach_spec(Volumes *vs, const char *owner, const char *sandbox_id, const SandboxSpec *spec,
                        size_t *ret_failed) {
        for (size_t i = 0; i < spec->n_volumes; i++) {
                StoreVolumeAttachment a = { .read_only = spec->volumes[i].read_only, .created_at = time_now_unix() };
                snprintf(a.volume_id, sizeof a.volume_id, "%s", spec->volumes[i].volume_id);
                snprintf(a.sandbox_id, sizeof a.sandbox_id, "%s", sandbox_id);
                snprintf(a.path, sizeof a.path, "%s", spec->volumes[i].path);
                int r = vs->ops->attach(vs->h, owner, &a);
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
