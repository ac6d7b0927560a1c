/*
 * A microVM disk from another driver's layers (microvm_layers.h).
 *
 * The layers are mounted read-only (noload: their journals were replayed
 * when the snapshot was taken) and the new disk read-write, each as a
 * detached mount (fsopen/fsmount): no mount point exists in any namespace,
 * nothing is left mounted when the descriptors close, a daemon killed in the
 * middle included. Those layers were written by the host's own ext4 (the
 * namespace and gVisor drivers' sandboxes write through it), so mounting
 * them parses nothing a guest kernel made; the new disk is the host's until
 * a guest boots on a copy of it.
 *
 * What the layers hold is the sandbox's making and read as hostile: every
 * name is opened relative to its directory without following a symbolic
 * link, the depth and the bytes copied are bounded.
 */
#include "driver/microvm_layers.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <search.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "common/path.h"
#include "driver/launch.h"
#include "driver/microvm_disk.h"
#include "driver/rootfs.h"

#define UPPER_NAME "upper.ext4"
/* Dot names: a snapshot's links (snapshot.c) and size pass them over. */
#define PART_NAME ".upper.ext4.part"
#define LOCK_NAME ".upper.ext4.lock"
/* Where an id outside the image's range goes: nobody, as a user namespace
 * shows an unmapped id. */
#define GUEST_NOBODY 65534u
#define XATTR_NAMES_MAX 65536
#define XATTR_VALUE_MAX 65536

typedef struct HardLink {
        ino_t ino;
        char path[]; /* relative to upper/ */
} HardLink;

typedef struct Copy {
        uid_t shift;
        int dst_root;        /* upper/ of the new disk */
        char path[PATH_MAX]; /* the entry's path under upper/ */
        void *links;         /* this layer's files with more than one name (a tsearch tree of HardLink) */
        uint64_t bytes, max_bytes;
        char *names, *value; /* xattr buffers */
} Copy;

static unsigned guest_id(const Copy *c, unsigned id) {
        return id >= c->shift && id - c->shift < LAUNCH_UID_RANGE ? id - c->shift : GUEST_NOBODY;
}

static int link_cmp(const void *a, const void *b) {
        ino_t x = ((const HardLink *)a)->ino, y = ((const HardLink *)b)->ino;
        return x < y ? -1 : x > y;
}

static void links_clear(Copy *c) {
        tdestroy(c->links, free);
        c->links = NULL;
}

static const char *link_find(const Copy *c, ino_t ino) {
        HardLink key = { .ino = ino };
        HardLink **found = tfind(&key, &c->links, link_cmp);
        return found ? (*found)->path : NULL;
}

static int link_remember(Copy *c, ino_t ino) {
        size_t n = strlen(c->path + 1) + 1;
        HardLink *l = malloc(sizeof(*l) + n);
        if (!l)
                return -ENOMEM;
        l->ino = ino;
        memcpy(l->path, c->path + 1, n);
        HardLink **at = tsearch(l, &c->links, link_cmp);
        if (!at || *at != l)
                free(l);
        return at ? 0 : -ENOMEM;
}

/* The host overlay's notes about its own lower layers (file handles and
 * ids of the host's filesystems): nothing the guest's overlay could use,
 * and origin would have it look for a layer it does not have. */
static bool xattr_dropped(const char *name) {
        static const char *const dropped[] = { "trusted.overlay.origin", "trusted.overlay.impure",
                                               "trusted.overlay.nlink",  "trusted.overlay.uuid",
                                               "trusted.overlay.upper",  "trusted.overlay.protattr" };
        for (size_t i = 0; i < ELEMENTSOF(dropped); i++)
                if (strcmp(name, dropped[i]) == 0)
                        return true;
        return false;
}

/* A POSIX ACL names host ids: its named users and groups are shifted as
 * the owners are. Its layout: a 4-byte version, then entries of tag (16
 * bits), permissions (16) and id (32), little-endian. */
static void acl_shift(const Copy *c, char *v, size_t n) {
        if (n < 4 || (n - 4) % 8)
                return;
        for (size_t off = 4; off + 8 <= n; off += 8) {
                uint16_t tag;
                uint32_t id;
                memcpy(&tag, v + off, 2);
                memcpy(&id, v + off + 4, 4);
                tag = le16toh(tag);
                if (tag == 0x02 || tag == 0x08) { /* ACL_USER, ACL_GROUP */
                        id = htole32(guest_id(c, le32toh(id)));
                        memcpy(v + off + 4, &id, 4);
                }
        }
}

/* File capabilities set by root inside the host's user namespace are
 * version 3, naming that root's host uid; for the guest's root, which is
 * uid 0 of its only namespace, they are version 2. Returns the new size. */
static size_t caps_shift(const Copy *c, char *v, size_t n) {
        uint32_t magic, rootid;
        if (n != 24)
                return n;
        memcpy(&magic, v, 4);
        memcpy(&rootid, v + 20, 4);
        magic = le32toh(magic);
        if ((magic & 0xFF000000u) != 0x03000000u || le32toh(rootid) != c->shift)
                return n;
        magic = htole32((magic & ~0xFF000000u) | 0x02000000u);
        memcpy(v, &magic, 4);
        return 20;
}

/* The xattrs of src (an open file or directory) onto dst. */
static int xattrs_copy(Copy *c, int src, int dst) {
        ssize_t n = flistxattr(src, c->names, XATTR_NAMES_MAX);
        if (n < 0)
                return errno == ENOTSUP ? 0 : -errno;
        for (ssize_t off = 0; off < n; off += (ssize_t)strlen(c->names + off) + 1) {
                const char *name = c->names + off;
                if (xattr_dropped(name))
                        continue;
                if (strcmp(name, "trusted.overlay.metacopy") == 0)
                        return -EOPNOTSUPP; /* its data is in a layer below, which the guest lacks */
                ssize_t len = fgetxattr(src, name, c->value, XATTR_VALUE_MAX);
                if (len < 0)
                        return -errno;
                size_t size = (size_t)len;
                if (strcmp(name, "system.posix_acl_access") == 0 || strcmp(name, "system.posix_acl_default") == 0)
                        acl_shift(c, c->value, size);
                else if (strcmp(name, "security.capability") == 0)
                        size = caps_shift(c, c->value, size);
                if (fsetxattr(dst, name, c->value, size, 0) < 0)
                        return -errno;
        }
        return 0;
}

/* Owner, mode, xattrs and times of an open file or directory, in that
 * order: a chown clears set-id bits and capabilities, which come after. */
static int meta_fd(Copy *c, int src, int dst, const struct stat *st) {
        if (fchown(dst, guest_id(c, st->st_uid), guest_id(c, st->st_gid)) < 0 || fchmod(dst, st->st_mode & 07777) < 0)
                return -errno;
        int r = xattrs_copy(c, src, dst);
        if (r < 0)
                return r;
        struct timespec ts[2] = { st->st_atim, st->st_mtim };
        return futimens(dst, ts) < 0 ? -errno : 0;
}

/* Owner, mode and times of an entry that cannot be opened (a symbolic
 * link, a whiteout, a device, a FIFO). */
static int meta_at(const Copy *c, int dir, const char *name, const struct stat *st) {
        if (fchownat(dir, name, guest_id(c, st->st_uid), guest_id(c, st->st_gid), AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        if (!S_ISLNK(st->st_mode) && fchmodat(dir, name, st->st_mode & 07777, 0) < 0)
                return -errno;
        struct timespec ts[2] = { st->st_atim, st->st_mtim };
        return utimensat(dir, name, ts, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

/* What a lower layer had at name goes (a directory with its tree). */
static int remove_entry(int dir, const char *name) {
        struct stat st;
        if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (S_ISDIR(st.st_mode))
                return path_remove_tree_at(dir, name);
        return unlinkat(dir, name, 0) < 0 ? -errno : 0;
}

static bool opaque(int dir) {
        char v[2];
        ssize_t n = fgetxattr(dir, "trusted.overlay.opaque", v, sizeof v);
        return n == 1 && v[0] == 'y';
}

static int copy_dir(Copy *c, int src, int dst, size_t len, unsigned depth);

static int copy_file(Copy *c, int src, int dst, const char *name, const struct stat *st) {
        if (st->st_nlink > 1) {
                const char *first = link_find(c, st->st_ino);
                if (first)
                        return linkat(c->dst_root, first, dst, name, 0) < 0 ? -errno : 0;
        }
        c->bytes += (uint64_t)st->st_blocks * 512u;
        if (c->bytes > c->max_bytes)
                return -EFBIG;
        _cleanup_close_ int in = openat(src, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
        if (in < 0)
                return -errno;
        _cleanup_close_ int out = openat(dst, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (out < 0)
                return -errno;
        int r = io_copy_sparse(in, out);
        if (r == 0)
                r = meta_fd(c, in, out, st);
        if (r == 0 && st->st_nlink > 1)
                r = link_remember(c, st->st_ino);
        return r;
}

static int copy_subdir(Copy *c, int src, int dst, const char *name, const struct stat *st, size_t len,
                       unsigned depth) {
        _cleanup_close_ int in = openat(src, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (in < 0)
                return -errno;
        /* An opaque directory hides what the layers below had there. */
        struct stat have;
        bool exists = fstatat(dst, name, &have, AT_SYMLINK_NOFOLLOW) == 0;
        if (exists && (!S_ISDIR(have.st_mode) || opaque(in))) {
                int r = remove_entry(dst, name);
                if (r < 0)
                        return r;
                exists = false;
        }
        if (!exists && mkdirat(dst, name, 0700) < 0)
                return -errno;
        _cleanup_close_ int out = openat(dst, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (out < 0)
                return -errno;
        int r = copy_dir(c, in, out, len, depth + 1);
        /* Last: the entries made above changed its times. */
        return r < 0 ? r : meta_fd(c, in, out, st);
}

static int copy_entry(Copy *c, int src, int dst, const char *name, size_t len, unsigned depth) {
        struct stat st;
        if (fstatat(src, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        int w = snprintf(c->path + len, sizeof c->path - len, "/%s", name);
        if (w < 0 || (size_t)w >= sizeof c->path - len)
                return -ENAMETOOLONG;
        if (S_ISDIR(st.st_mode))
                return copy_subdir(c, src, dst, name, &st, len + (size_t)w, depth);
        int r = remove_entry(dst, name);
        if (r < 0)
                return r;
        if (S_ISREG(st.st_mode))
                return copy_file(c, src, dst, name, &st);
        if (S_ISLNK(st.st_mode)) {
                char target[PATH_MAX];
                ssize_t n = readlinkat(src, name, target, sizeof target - 1);
                if (n < 0)
                        return -errno;
                target[n] = '\0';
                if (symlinkat(target, dst, name) < 0)
                        return -errno;
        } else if (mknodat(dst, name, st.st_mode & (S_IFMT | 07777), st.st_rdev) < 0)
                /* A whiteout (a character device 0:0) is one of these: the
                 * guest's overlay reads it as the host's did. */
                return -errno;
        return meta_at(c, dst, name, &st);
}

static int copy_dir(Copy *c, int src, int dst, size_t len, unsigned depth) {
        if (depth > MICROVM_LAYERS_MAX_DEPTH)
                return -ELOOP;
        int fd = fcntl(src, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return -errno;
        DIR *d = fdopendir(fd);
        if (!d) {
                int e = -errno;
                close(fd);
                return e;
        }
        int r = 0;
        struct dirent *de;
        while (r == 0 && (errno = 0, de = readdir(d)))
                if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                        r = copy_entry(c, src, dst, de->d_name, len, depth);
        if (r == 0 && errno)
                r = -errno;
        c->path[len] = '\0';
        closedir(d);
        return r;
}

/* The ext4 file img on a loop device of its own, mounted nowhere: the
 * mount's descriptor, which unmounts it when closed. */
static int mount_detached(const char *img, bool ro, int *ret) {
        _cleanup_close_ int loop = -1;
        char dev[64];
        int r = rootfs_loop_attach(img, ro, &loop, dev, sizeof dev);
        if (r < 0)
                return r;
        _cleanup_close_ int fs = fsopen("ext4", FSOPEN_CLOEXEC);
        if (fs < 0)
                return -errno;
        if (fsconfig(fs, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
            (ro && (fsconfig(fs, FSCONFIG_SET_FLAG, "ro", NULL, 0) < 0 ||
                    fsconfig(fs, FSCONFIG_SET_FLAG, "noload", NULL, 0) < 0)) ||
            /* The new disk's inode tables were left for lazy init: zeroing
             * them here would write the whole sparse file. */
            (!ro && fsconfig(fs, FSCONFIG_SET_FLAG, "noinit_itable", NULL, 0) < 0) ||
            fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
                return -errno;
        int m = fsmount(fs, FSMOUNT_CLOEXEC,
                        MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC | (ro ? MOUNT_ATTR_RDONLY : 0));
        if (m < 0)
                return -errno;
        *ret = m;
        return 0;
}

/* The layers of snap_dir, oldest first (bases/0.img .. then layer.img):
 * how many, into imgs. */
static int layer_files(const char *snap_dir, char imgs[][PATH_MAX], unsigned *ret_n, uint64_t *ret_bytes) {
        unsigned n = 0;
        uint64_t bytes = 0;
        for (;; n++) {
                struct stat st;
                if (n > ROOTFS_MAX_BASES)
                        return -E2BIG;
                if (snprintf(imgs[n], PATH_MAX, "%s/bases/%u.img", snap_dir, n) >= PATH_MAX)
                        return -ENAMETOOLONG;
                if (stat(imgs[n], &st) < 0)
                        break;
                bytes += (uint64_t)st.st_blocks * 512u;
        }
        struct stat st;
        if (path_join(imgs[n], PATH_MAX, snap_dir, "layer.img") < 0)
                return -ENAMETOOLONG;
        if (stat(imgs[n], &st) < 0)
                return -errno;
        *ret_n = n + 1;
        *ret_bytes = bytes + (uint64_t)st.st_blocks * 512u;
        return 0;
}

/* The names the agent mounts its own filesystems on (stage 2): always
 * directories, whatever the tree had there, so that no entry of it turns
 * a mount aside or fails the start. */
static const char *const AGENT_MOUNT_DIRS[] = { "dev", "proc", "sys", "run", "tmp" };

static int mount_dirs(int upper) {
        /* The agent's own directory: stage 1 mounts it afresh, and the tree
         * keeps nothing there. */
        int r = remove_entry(upper, ".runtime");
        for (size_t i = 0; r == 0 && i < ELEMENTSOF(AGENT_MOUNT_DIRS); i++) {
                const char *name = AGENT_MOUNT_DIRS[i];
                mode_t mode = strcmp(name, "tmp") == 0 ? 01777 : 0755;
                struct stat st;
                if (fstatat(upper, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
                        continue;
                if ((r = remove_entry(upper, name)) < 0)
                        break;
                if (mkdirat(upper, name, mode) < 0 || fchownat(upper, name, 0, 0, AT_SYMLINK_NOFOLLOW) < 0 ||
                    fchmodat(upper, name, mode, 0) < 0)
                        r = -errno;
        }
        return r;
}

/* A registry's root is the whole of the guest's: the built-in root beneath
 * (boot_root, the daemon's own disk) shows through nowhere. Every top-level
 * directory of the disk is opaque, and every top-level name of boot_root
 * the disk lacks is a whiteout. (An opaque mark on upper/ itself would not
 * do: the overlay reads none on its root.) */
static int hide_boot_root(int upper, const char *boot_root) {
        int r = mount_dirs(upper);
        if (r < 0)
                return r;
        _cleanup_close_ int top = openat(upper, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = top >= 0 ? fdopendir(top) : NULL;
        if (!d)
                return -errno;
        top = -1;
        struct dirent *de;
        while (r == 0 && (errno = 0, de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                _cleanup_close_ int sub = openat(upper, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sub < 0)
                        r = errno == ENOTDIR || errno == ELOOP ? 0 : -errno;
                else if (fsetxattr(sub, "trusted.overlay.opaque", "y", 1, 0) < 0)
                        r = -errno;
        }
        if (r == 0 && errno)
                r = -errno;
        closedir(d);
        if (r < 0)
                return r;
        _cleanup_close_ int disk = -1;
        if ((r = mount_detached(boot_root, true, &disk)) < 0)
                return r;
        _cleanup_close_ int lower = openat(disk, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        d = lower >= 0 ? fdopendir(lower) : NULL;
        if (!d)
                return -errno;
        lower = -1;
        while (r == 0 && (errno = 0, de = readdir(d))) {
                struct stat st;
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
                    fstatat(upper, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
                        continue;
                if (errno != ENOENT || mknodat(upper, de->d_name, S_IFCHR | 0600, makedev(0, 0)) < 0)
                        r = -errno;
        }
        if (r == 0 && errno)
                r = -errno;
        closedir(d);
        return r;
}

/* Copies the registry's tree (base, or none) and each layer's upper/ into
 * the disk part's upper/, oldest first. */
static int fill(Copy *c, const char *part, char imgs[][PATH_MAX], unsigned n, const MicrovmLayersBase *base) {
        _cleanup_close_ int disk = -1, upper = -1;
        int r = mount_detached(part, false, &disk);
        if (r < 0)
                return r;
        _cleanup_close_ int root = openat(disk, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (root < 0)
                return -errno;
        /* The agent's stage 1 finds these (it would make them, empty). */
        if (mkdirat(root, "upper", 0755) < 0 || mkdirat(root, "work", 0755) < 0)
                return -errno;
        upper = openat(root, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        /* The guest's / takes its owner and mode from upper/. */
        if (upper < 0 || fchmod(upper, 0755) < 0)
                return -errno;
        c->dst_root = upper;
        if (base) {
                /* The tree is the daemon's pull, unpacked from what a
                 * registry sent: read as hostile as a layer. */
                _cleanup_close_ int tree = open(base->tree, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (tree < 0)
                        return -errno;
                c->path[0] = '\0';
                r = copy_dir(c, tree, upper, 0, 0);
                links_clear(c);
        }
        for (unsigned i = 0; i < n && r == 0; i++) {
                _cleanup_close_ int layer = -1;
                if ((r = mount_detached(imgs[i], true, &layer)) < 0)
                        break;
                _cleanup_close_ int src = openat(layer, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (src < 0) {
                        r = errno == ENOENT ? 0 : -errno; /* a layer of nothing */
                        continue;
                }
                c->path[0] = '\0';
                r = copy_dir(c, src, upper, 0, 0);
                links_clear(c);
        }
        if (r == 0 && base)
                r = hide_boot_root(upper, base->boot_root);
        /* Written out before the mount goes, so that its end writes nothing
         * that could fail unseen. */
        if (r == 0 && syncfs(upper) < 0)
                r = -errno;
        return r;
}

static void copy_done(Copy *c) {
        links_clear(c);
        free(c->names);
        free(c->value);
}

/* The disk made under PART_NAME in dir (snap_dir's descriptor), synced. */
static int convert(const char *snap_dir, int dir, unsigned disk_mib, uid_t shift, const MicrovmLayersBase *base) {
        char part[PATH_MAX];
        if (path_join(part, sizeof part, snap_dir, PART_NAME) < 0)
                return -ENAMETOOLONG;
        _cleanup_free_ char(*imgs)[PATH_MAX] = calloc(ROOTFS_MAX_BASES + 2, PATH_MAX);
        _cleanup_(copy_done) Copy c = { .shift = shift, .dst_root = -1 };
        c.names = malloc(XATTR_NAMES_MAX);
        c.value = malloc(XATTR_VALUE_MAX);
        if (!imgs || !c.names || !c.value)
                return -ENOMEM;
        unsigned n = 0;
        int r = layer_files(snap_dir, imgs, &n, &c.max_bytes);
        if (r < 0)
                return r;
        /* What the tree held when it was pulled; a tree pulled before that
         * was recorded is bounded by the disk alone. */
        if (base)
                c.max_bytes = base->tree_bytes ? c.max_bytes + base->tree_bytes : UINT64_MAX;
        (void)unlinkat(dir, PART_NAME, 0);
        _cleanup_close_ int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (devnull < 0)
                return -errno;
        if ((r = microvm_disk_make(part, disk_mib, devnull)) < 0)
                return r;
        r = fill(&c, part, imgs, n, base);
        /* The new disk's own file system full (the host's would fail the
         * loop device's writes, not ext4's): the files do not fit disk_mib. */
        if (r == -ENOSPC || r == -EDQUOT)
                r = -EFBIG;
        /* Its loop device goes with the mount; the file is whole once it
         * has (a little later: the device is released asynchronously). */
        for (int waited = 0; r == 0 && rootfs_loop_backed(part); waited += 5) {
                if (waited >= 5000) {
                        r = -EBUSY;
                        break;
                }
                nanosleep(&(struct timespec){ 0, 5000000 }, NULL);
        }
        if (r == 0) {
                _cleanup_close_ int fd = openat(dir, PART_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0 || fsync(fd) < 0)
                        r = -errno;
        }
        return r;
}

int microvm_layers_disk(const char *snap_dir, unsigned disk_mib, uid_t shift, const MicrovmLayersBase *base,
                       bool *ret_made) {
        if (ret_made)
                *ret_made = false;
        _cleanup_close_ int dir = open(snap_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dir < 0)
                return -errno;
        /* Two first creates from one image: the second waits for the
         * first's disk rather than making its own. The lock goes with the
         * descriptor, a killed daemon's included. */
        _cleanup_close_ int lock = openat(dir, LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (lock < 0)
                return -errno;
        while (flock(lock, LOCK_EX) < 0)
                if (errno != EINTR)
                        return -errno;
        if (faccessat(dir, UPPER_NAME, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
                return 0;
        int r = convert(snap_dir, dir, disk_mib, shift, base);
        if (r == 0 && renameat(dir, PART_NAME, dir, UPPER_NAME) < 0)
                r = -errno;
        if (r == 0 && fsync(dir) < 0)
                r = -errno;
        if (r < 0) {
                (void)unlinkat(dir, PART_NAME, 0);
                return r;
        }
        if (ret_made)
                *ret_made = true;
        return 0;
}
