#include "driver/rootfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <linux/loop.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "common/path.h"

extern char **environ;

#define LAYER_MIN_MIB 16u
#define LAYER_MAX_MIB (1024u * 1024u)

/* A mount point's device differs from its parent's (or the kernel marks
 * it): enough to find our own mounts, which are never bind mounts of the
 * same filesystem. */
static bool is_mountpoint(const char *path) {
        struct stat a, b;
        char parent[PATH_MAX];
        if (lstat(path, &a) < 0 || !S_ISDIR(a.st_mode))
                return false;
        if (path_join(parent, sizeof parent, path, "..") < 0 || stat(parent, &b) < 0)
                return false;
        return a.st_dev != b.st_dev || a.st_ino == b.st_ino;
}

static int umount_path(const char *path) {
        for (int tries = 0; tries < 50; tries++) {
                if (!is_mountpoint(path))
                        return 0;
                if (umount2(path, UMOUNT_NOFOLLOW) == 0)
                        continue; /* stacked mounts: go again */
                if (errno == EINVAL || errno == ENOENT)
                        return 0;
                if (errno != EBUSY)
                        return -errno;
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
        }
        /* Still busy after 100 ms: something holds a reference. Detach so
         * the tree is gone from the host; the kernel frees it (and the loop
         * device, autoclear) when the last user lets go. */
        if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL)
                return -errno;
        return 0;
}

static bool wait_loop_free(const char *img, int timeout_ms);
static unsigned count_bases(const char *dir);

int rootfs_unmount(const char *sandbox_dir) {
        char root[PATH_MAX], layer[PATH_MAX];
        int r = path_join(root, sizeof root, sandbox_dir, "root");
        if (r < 0)
                return r;
        r = path_join(layer, sizeof layer, sandbox_dir, "layer");
        if (r < 0)
                return r;
        int r1 = umount_path(root);
        int r2 = umount_path(layer);
        char img[PATH_MAX];
        /* Autoclear detaches the loop device with the last reference to the
         * filesystem; wait for it, so that "stopped" means nothing is left
         * and a restart never sees the file attached twice. */
        if (path_join(img, sizeof img, sandbox_dir, "layer.img") >= 0 && !wait_loop_free(img, 2000) && r1 >= 0 && r2 >= 0)
                r2 = -EBUSY;
        return r1 < 0 ? r1 : r2;
}

bool rootfs_is_mounted(const char *sandbox_dir) {
        _cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
        if (!f)
                return false;
        size_t dl = strlen(sandbox_dir);
        char line[4096];
        while (fgets(line, sizeof line, f)) {
                /* id parent major:minor root mountpoint ... */
                char *s = line;
                for (int i = 0; i < 4 && s; i++) {
                        s = strchr(s, ' ');
                        if (s)
                                s++;
                }
                if (!s)
                        continue;
                if (strncmp(s, sandbox_dir, dl) == 0 && (s[dl] == ' ' || s[dl] == '/'))
                        return true;
        }
        return false;
}

int rootfs_run(char *const argv[], int max_ok_status) {
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        pid_t pid;
        int r = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        if (r != 0)
                return -r;
        int status;
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        return WIFEXITED(status) && WEXITSTATUS(status) <= max_ok_status ? 0 : -EIO;
}

const char *rootfs_find_tool(const char *name, char *buf, size_t n) {
        static const char *const dirs[] = {"/usr/sbin", "/sbin", "/usr/bin"};
        for (size_t i = 0; i < ELEMENTSOF(dirs); i++)
                if (snprintf(buf, n, "%s/%s", dirs[i], name) < (int)n && access(buf, X_OK) == 0)
                        return buf;
        return NULL;
}

int rootfs_mkfs(const char *img, unsigned mib, uid_t owner) {
        char mkfs[64];
        if (!rootfs_find_tool("mkfs.ext4", mkfs, sizeof mkfs))
                return -ENOENT;
        int r;
        {
                _cleanup_close_ int fd = open(img, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (fd < 0)
                        return -errno;
                if (ftruncate(fd, (off_t)mib << 20) < 0)
                        return -errno;
        }
        char owner_opt[96];
        snprintf(owner_opt, sizeof owner_opt,
                 "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=%u:%u", (unsigned)owner,
                 (unsigned)owner);
        /* -m 0: no blocks reserved for a root that does not exist here.
         * -b 4096 also below 512 MiB, where mkfs would pick 1 KiB blocks: a
         * layer cloned on XFS (reflink) takes direct I/O only in whole
         * filesystem blocks, so its loop device gets 4 KiB sectors, on which
         * an ext4 of 1 KiB blocks does not mount ("bad block size"). */
        char *const argv[] = {mkfs, "-q", "-F", "-b", "4096", "-m", "0", "-E", owner_opt, (char *)img, NULL};
        r = rootfs_run(argv, 0);
        return r;
}

/* Copies a sparse file's data extents only (the template is a few MiB of
 * metadata in a file of diskMiB), synced when `sync`: a copy whose journal
 * is replayed next is synced once, after the replay. */
static int copy_extents(const char *from, const char *to, bool sync) {
        _cleanup_close_ int in = open(from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0)
                return -errno;
        _cleanup_close_ int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (out < 0)
                return -errno;
        int r = io_copy_sparse(in, out);
        if (r < 0)
                return r;
        if (sync && fsync(out) < 0)
                return -errno;
        return 0;
}

static int sparse_copy(const char *from, const char *to) {
        return copy_extents(from, to, true);
}

static int templates_dir(const char *sandbox_dir, char *ret, size_t ret_len) {
        char tmp[PATH_MAX];
        if (snprintf(tmp, sizeof tmp, "%s", sandbox_dir) >= (int)sizeof tmp)
                return -ENAMETOOLONG;
        if (snprintf(ret, ret_len, "%s/.layer-templates", dirname(tmp)) >= (int)ret_len)
                return -ENAMETOOLONG;
        return 0;
}

/* An empty ext4 of `mib` owned by `owner`, made once per (size, owner) next
 * to the sandbox directories and copied for each new sandbox: mkfs costs tens
 * of milliseconds, a sparse copy a few. */
static int layer_template(const char *sandbox_dir, unsigned mib, uid_t owner, char *ret, size_t ret_len) {
        char tmp[PATH_MAX], dir[PATH_MAX];
        int r = templates_dir(sandbox_dir, dir, sizeof dir);
        if (r < 0)
                return r;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if (snprintf(ret, ret_len, "%s/ext4-%u-%u.img", dir, mib, (unsigned)owner) >= (int)ret_len)
                return -ENAMETOOLONG;
        if (access(ret, F_OK) == 0)
                return 0;

        if (snprintf(tmp, sizeof tmp, "%s.tmp-%d-%lx", ret, (int)getpid(), (unsigned long)gettid()) >=
            (int)sizeof tmp)
                return -ENAMETOOLONG;
        r = rootfs_mkfs(tmp, mib, owner);
        if (r < 0) {
                unlink(tmp);
                return r;
        }
        if (rename(tmp, ret) < 0) {
                r = -errno;
                unlink(tmp);
                return r;
        }
        return 0;
}

/*
 * One copy of the template, synced and ready, waits next to it per (size,
 * owner): a new sandbox takes it with a rename, and the copy and its fsync
 * (several milliseconds, most of them the host's journal and disk flush)
 * are made for the next sandbox on a thread of their own
 * (rootfs_replenish_async), off every start's path. It is an empty ext4
 * nothing has mounted yet, and one sandbox at most gets it: the rename
 * moves it.
 */
static int ready_path(const char *sandbox_dir, unsigned mib, uid_t owner, const char *suffix, char *ret,
                      size_t ret_len) {
        char dir[PATH_MAX];
        int r = templates_dir(sandbox_dir, dir, sizeof dir);
        if (r < 0)
                return r;
        if (snprintf(ret, ret_len, "%s/ready-%u-%u.img%s", dir, mib, (unsigned)owner, suffix) >= (int)ret_len)
                return -ENAMETOOLONG;
        return 0;
}

/* A part file older than this was left by a daemon that died mid-copy. */
#define READY_PART_STALE_S 60

int rootfs_replenish(const char *sandbox_dir, unsigned disk_mib, uid_t owner) {
        if (disk_mib < LAYER_MIN_MIB)
                disk_mib = LAYER_MIN_MIB;
        if (disk_mib > LAYER_MAX_MIB)
                return -EINVAL;
        char ready[PATH_MAX], part[PATH_MAX], tmpl[PATH_MAX];
        int r = ready_path(sandbox_dir, disk_mib, owner, "", ready, sizeof ready);
        if (r < 0)
                return r;
        r = ready_path(sandbox_dir, disk_mib, owner, ".part", part, sizeof part);
        if (r < 0)
                return r;
        if (access(ready, F_OK) == 0)
                return 0;
        /* Only next to a template a start has made: never a mkfs from here,
         * nor a directory that is being removed made again. */
        char dir[PATH_MAX];
        r = templates_dir(sandbox_dir, dir, sizeof dir);
        if (r < 0)
                return r;
        if (snprintf(tmpl, sizeof tmpl, "%s/ext4-%u-%u.img", dir, disk_mib, (unsigned)owner) >= (int)sizeof tmpl)
                return -ENAMETOOLONG;
        if (access(tmpl, F_OK) < 0)
                return -errno;
        /* The part file is the lock: whoever made it copies. */
        struct stat st;
        if (lstat(part, &st) == 0) {
                if (time(NULL) - st.st_mtime < READY_PART_STALE_S)
                        return -EBUSY;
                (void)unlink(part);
        }
        r = sparse_copy(tmpl, part);
        if (r < 0) {
                if (r != -EEXIST)
                        (void)unlink(part);
                return r;
        }
        if (rename(part, ready) < 0) {
                r = -errno;
                (void)unlink(part);
                return r;
        }
        return 0;
}

typedef struct Replenish {
        char sandbox_dir[PATH_MAX];
        unsigned disk_mib;
        uid_t owner;
} Replenish;

/* The replenishing waits until the start that asked for it is over: its
 * fsync would otherwise queue in the host's journal with the new sandbox's
 * own first writes. */
#define REPLENISH_DELAY_MS 100

static void *replenish_main(void *arg) {
        Replenish *job = arg;
        struct timespec ts = {0, REPLENISH_DELAY_MS * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        (void)rootfs_replenish(job->sandbox_dir, job->disk_mib, job->owner);
        free(job);
        return NULL;
}

void rootfs_replenish_async(const char *sandbox_dir, unsigned disk_mib, uid_t owner) {
        Replenish *job = calloc(1, sizeof *job);
        if (!job)
                return;
        if (snprintf(job->sandbox_dir, sizeof job->sandbox_dir, "%s", sandbox_dir) >= (int)sizeof job->sandbox_dir) {
                free(job);
                return;
        }
        job->disk_mib = disk_mib;
        job->owner = owner;
        pthread_attr_t attr;
        pthread_t t;
        if (pthread_attr_init(&attr) != 0) {
                free(job);
                return;
        }
        (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        /* The copy needs little stack. */
        (void)pthread_attr_setstacksize(&attr, 256 * 1024);
        if (pthread_create(&t, &attr, replenish_main, job) != 0)
                free(job);
        pthread_attr_destroy(&attr);
}

/* Takes the ready copy as `img`; -ENOENT when there is none. */
static int claim_ready(const char *sandbox_dir, unsigned mib, uid_t owner, const char *img) {
        char ready[PATH_MAX];
        int r = ready_path(sandbox_dir, mib, owner, "", ready, sizeof ready);
        if (r < 0)
                return r;
        return rename(ready, img) < 0 ? -errno : 0;
}

/* Attaches `file` to a free loop device (autoclear: it detaches itself
 * with the last unmount) and returns the open device fd and its path.
 *
 * In direct I/O mode: the layer's blocks go from the sandbox's page cache
 * straight to the host's disk instead of being cached twice, so an fsync
 * inside finds its data already written (the agent starts writeback while a
 * file comes in: the fsync of a 100 MiB upload falls from about 250 ms to 45
 * here) rather than all of it still dirty in the host's cache, and the host
 * keeps no second copy of every sandbox's writes. The file is synced before
 * it is attached, so no dirty page of its own makes direct reads wait. A
 * host filesystem without O_DIRECT gets the buffered mode. */
/* Where the loop device a writable layer file is attached to is noted
 * (FILE.loop: "loopN"), so that whether the file is still attached reads
 * one device's backing file instead of every loop device's: a host with
 * hundreds of sandboxes has hundreds of them, and a stop waits on that check
 * until the sandbox's mounts are gone. The note is written before the
 * device is configured, so a daemon killed between the two leaves a note
 * naming the device the file may be on, never another. */
static int loop_note_path(const char *file, char *buf, size_t len) {
        return snprintf(buf, len, "%s.loop", file) >= (int)len ? -ENAMETOOLONG : 0;
}

static int loop_note(const char *file, int n) {
        char p[PATH_MAX], tmp[PATH_MAX + 8], text[32];
        int r = loop_note_path(file, p, sizeof p);
        if (r < 0)
                return r;
        snprintf(tmp, sizeof tmp, "%s.part", p);
        int len = snprintf(text, sizeof text, "loop%d\n", n);
        _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -errno;
        if (write(fd, text, (size_t)len) != len)
                return errno ? -errno : -EIO;
        return rename(tmp, p) < 0 ? -errno : 0;
}

static int loop_attach_core(const char *file, bool ro, bool note, int *ret_fd, char *ret_path, size_t ret_len) {
        _cleanup_close_ int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
        if (ctl < 0)
                return -errno;
        _cleanup_close_ int backing = open(file, (ro ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NOFOLLOW);
        if (backing < 0)
                return -errno;
        for (int tries = 0; tries < 64; tries++) {
                int n = ioctl(ctl, LOOP_CTL_GET_FREE);
                if (n < 0)
                        return -errno;
                char dev[64];
                snprintf(dev, sizeof dev, "/dev/loop%d", n);
                _cleanup_close_ int fd = open(dev, O_RDWR | O_CLOEXEC);
                if (fd < 0) {
                        if (errno == ENOENT) {
                                /* The node was never made in this /dev. */
                                return -ENODEV;
                        }
                        return -errno;
                }
                struct loop_config cfg = {
                        .fd = (uint32_t)backing,
                        .block_size = 0,
                        .info = {.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO | (ro ? LO_FLAGS_READ_ONLY : 0)},
                };
                size_t fl = strlen(file);
                if (fl >= sizeof cfg.info.lo_file_name)
                        fl = sizeof cfg.info.lo_file_name - 1;
                memcpy(cfg.info.lo_file_name, file, fl);
                int nr = note ? loop_note(file, n) : 0;
                if (nr < 0)
                        return nr;
                int k = ioctl(fd, LOOP_CONFIGURE, &cfg);
                if (k < 0 && errno == EINVAL) {
                        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (ro ? LO_FLAGS_READ_ONLY : 0);
                        k = ioctl(fd, LOOP_CONFIGURE, &cfg);
                }
                if (k == 0) {
                        snprintf(ret_path, ret_len, "%s", dev);
                        *ret_fd = TAKE_FD(fd);
                        return 0;
                }
                if (errno != EBUSY)
                        return -errno;
                /* Another thread took it between GET_FREE and CONFIGURE. */
        }
        return -EBUSY;
}

/* Files other than a sandbox's layer (its read-only bases, volumes) are
 * attached without a note: they are checked by reading every device. */
int rootfs_loop_attach(const char *file, bool ro, int *ret_fd, char *ret_path, size_t ret_len) {
        return loop_attach_core(file, ro, false, ret_fd, ret_path, ret_len);
}

/* Whether some loop device is still backed by `img`. Two ext4 instances on
 * one file corrupt it, and a stopped sandbox's loop device lingers while the
 * last reference to its mount (a dying mount namespace) goes away. */
static bool loop_device_backed_by(const char *name, const char *want) {
        char p[PATH_MAX], got[PATH_MAX];
        if (snprintf(p, sizeof p, "/sys/block/%s/loop/backing_file", name) >= (int)sizeof p)
                return false;
        _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        ssize_t n = read(fd, got, sizeof got - 1);
        if (n <= 0)
                return false;
        got[n] = '\0';
        got[strcspn(got, "\n")] = '\0';
        return strcmp(got, want) == 0;
}

/* The device FILE.loop names ("loopN"), into name; -ENOENT when there is
 * no such note (a layer attached by an older build: every device is read). */
static int loop_noted(const char *file, char *name, size_t len) {
        char p[PATH_MAX];
        int r = loop_note_path(file, p, sizeof p);
        if (r < 0)
                return r;
        _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        char text[32];
        ssize_t n = read(fd, text, sizeof text - 1);
        if (n <= 0)
                return -ENOENT;
        text[n] = '\0';
        text[strcspn(text, "\n")] = '\0';
        size_t digits = strspn(text + 4, "0123456789");
        if (strncmp(text, "loop", 4) != 0 || digits == 0 || digits > 9 || text[4 + digits] || strlen(text) >= len)
                return -ENOENT;
        memcpy(name, text, strlen(text) + 1);
        return 0;
}

int rootfs_loop_device(const char *img, char *ret_name, size_t len) {
        char want[PATH_MAX], name[32];
        if (!realpath(img, want))
                return -errno;
        bool found = loop_noted(img, name, sizeof name) == 0 && loop_device_backed_by(name, want);
        DIR *d = found ? NULL : opendir("/sys/block");
        struct dirent *de;
        while (d && !found && (de = readdir(d))) {
                if (strncmp(de->d_name, "loop", 4) == 0 && strlen(de->d_name) < sizeof name &&
                    (found = loop_device_backed_by(de->d_name, want)))
                        memcpy(name, de->d_name, strlen(de->d_name) + 1);
        }
        if (d)
                closedir(d);
        if (!found)
                return -ENOENT;
        if (snprintf(ret_name, len, "%s", name) >= (int)len)
                return -ENAMETOOLONG;
        return 0;
}

bool rootfs_loop_backed(const char *img) {
        char name[32];
        return rootfs_loop_device(img, name, sizeof name) == 0;
}

static bool wait_loop_free(const char *img, int timeout_ms) {
        for (int waited = 0;; waited += 5) {
                if (!rootfs_loop_backed(img))
                        return true;
                if (waited >= timeout_ms)
                        return false;
                struct timespec ts = {0, 5000000};
                nanosleep(&ts, NULL);
        }
}

static bool overlay_path_ok(const char *p) {
        /* overlayfs splits its options on ',' and lowerdir on ':'. */
        return strpbrk(p, ",:\\\n") == NULL;
}

static unsigned count_bases(const char *dir) {
        unsigned n = 0;
        char p[PATH_MAX];
        while (n < ROOTFS_MAX_BASES + 1 && snprintf(p, sizeof p, "%s/bases/%u.img", dir, n) < (int)sizeof p &&
               access(p, F_OK) == 0)
                n++;
        return n;
}

static void bases_close(RootfsLayer *l) {
        for (unsigned i = 0; i < l->nbase; i++)
                if (l->base_fd[i] >= 0) {
                        close(l->base_fd[i]);
                        l->base_fd[i] = -1;
                }
}

/* Attaches the sandbox's lower layers read-only and writes the overlay's
 * options with them between its upper layer and the image. */
static int bases_prepare(const char *image_rootfs, const char *sandbox_dir, RootfsLayer *l) {
        unsigned n = count_bases(sandbox_dir);
        if (n == 0)
                return 0;
        if (n > ROOTFS_MAX_BASES)
                return -E2BIG;
        char lower[4096] = "";
        size_t used = 0;
        for (unsigned i = 0; i < n; i++)
                l->base_fd[i] = -1;
        l->nbase = n;
        for (unsigned k = n; k-- > 0;) {
                char img[PATH_MAX];
                if (snprintf(img, sizeof img, "%s/bases/%u.img", sandbox_dir, k) >= (int)sizeof img ||
                    snprintf(l->base_mnt[k], sizeof l->base_mnt[k], "%s/b%u", sandbox_dir, k) >=
                            (int)sizeof l->base_mnt[k])
                        return -ENAMETOOLONG;
                int r = rootfs_loop_attach(img, true, &l->base_fd[k], l->base_dev[k], sizeof l->base_dev[k]);
                if (r < 0)
                        return r;
                if ((mkdir(l->base_mnt[k], 0700) < 0 && errno != EEXIST))
                        return -errno;
                int w = snprintf(lower + used, sizeof lower - used, "%s/upper:", l->base_mnt[k]);
                if (w < 0 || (size_t)w >= sizeof lower - used)
                        return -ENAMETOOLONG;
                used += (size_t)w;
        }
        /* The kernel takes one page of mount options. */
        if (snprintf(l->overlay_opts, sizeof l->overlay_opts, "lowerdir=%s%s,upperdir=%s,workdir=%s", lower,
                     image_rootfs, l->upper, l->work) >= 4096)
                return -ENAMETOOLONG;
        return 0;
}

int rootfs_prepare(const char *image_rootfs, const char *sandbox_dir, unsigned disk_mib, uid_t owner,
                   RootfsLayer *ret) {
        RootfsLayer l = {.loop_fd = -1, .owner = owner};
        char img[PATH_MAX];
        struct stat st;
        int r;

        if (stat(image_rootfs, &st) < 0)
                return -errno;
        if (!S_ISDIR(st.st_mode))
                return -ENOTDIR;
        if (!overlay_path_ok(image_rootfs) || !overlay_path_ok(sandbox_dir))
                return -EINVAL;
        if (disk_mib < LAYER_MIN_MIB)
                disk_mib = LAYER_MIN_MIB;
        if (disk_mib > LAYER_MAX_MIB)
                return -EINVAL;
        l.disk_mib = disk_mib;
        if ((r = path_join(l.layer, sizeof l.layer, sandbox_dir, "layer")) < 0 ||
            (r = path_join(l.root, sizeof l.root, sandbox_dir, "root")) < 0 ||
            (r = path_join(l.upper, sizeof l.upper, l.layer, "upper")) < 0 ||
            (r = path_join(l.work, sizeof l.work, l.layer, "work")) < 0 ||
            (r = path_join(l.log, sizeof l.log, l.layer, "agent.log")) < 0 ||
            (r = path_join(img, sizeof img, sandbox_dir, "layer.img")) < 0)
                return r;
        if (snprintf(l.overlay_opts, sizeof l.overlay_opts, "lowerdir=%s,upperdir=%s,workdir=%s", image_rootfs,
                     l.upper, l.work) >= (int)sizeof l.overlay_opts)
                return -ENAMETOOLONG;
        snprintf(l.tmpfs_opts, sizeof l.tmpfs_opts, "size=%um,mode=0755,nr_inodes=%u", disk_mib,
                 disk_mib * 64 < 1000000 ? disk_mib * 64 : 1000000);

        if (mkdir(sandbox_dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if (lstat(sandbox_dir, &st) < 0)
                return -errno;
        if (!S_ISDIR(st.st_mode))
                return -ENOTDIR;
        /* Host mounts of an older daemon, if any. */
        (void)rootfs_unmount(sandbox_dir);
        if ((mkdir(l.layer, 0700) < 0 && errno != EEXIST) || (mkdir(l.root, 0755) < 0 && errno != EEXIST))
                return -errno;

        if (access(img, F_OK) < 0 && claim_ready(sandbox_dir, disk_mib, owner, img) == 0)
                l.created = true;
        else if (access(img, F_OK) < 0) {
                char tmpl[PATH_MAX], part[PATH_MAX];
                r = layer_template(sandbox_dir, disk_mib, owner, tmpl, sizeof tmpl);
                if (r >= 0) {
                        r = path_join(part, sizeof part, sandbox_dir, "layer.img.part");
                        if (r < 0)
                                return r;
                        (void)unlink(part);
                        r = sparse_copy(tmpl, part);
                        if (r >= 0 && rename(part, img) < 0)
                                r = -errno;
                        if (r < 0)
                                (void)unlink(part);
                        else
                                l.created = true;
                }
        }
        if (r >= 0) {
                /* The previous run's filesystem must be gone before this
                 * one attaches: two ext4 instances on one file corrupt it.
                 * A layer made just now is a new inode nothing can hold. */
                if (!l.created && !wait_loop_free(img, 2000))
                        return -EBUSY;
                r = loop_attach_core(img, false, true, &l.loop_fd, l.loop_dev, sizeof l.loop_dev);
        }
        if (r < 0) {
                /* No usable loop device (or no mkfs.ext4): a tmpfs of the
                 * same size. Bounded all the same, but gone at stop. */
                l.tmpfs = true;
                l.created = true;
        }
        if ((r = bases_prepare(image_rootfs, sandbox_dir, &l)) < 0) {
                bases_close(&l);
                if (l.loop_fd >= 0)
                        close(l.loop_fd);
                return r;
        }
        *ret = l;
        return 0;
}

void rootfs_layer_done(RootfsLayer *l) {
        if (l && l->loop_fd >= 0) {
                close(l->loop_fd);
                l->loop_fd = -1;
        }
        if (l)
                bases_close(l);
}

int rootfs_mount_child(const RootfsLayer *l) {
        /* Private, not slave: nothing mounted here is ever seen by the host
         * or by another sandbox, and everything goes with the namespace. */
        if (unshare(CLONE_NEWNS) < 0)
                return -1;
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                return -1;
        if (l->tmpfs) {
                if (mount("runtime-layer", l->layer, "tmpfs", MS_NODEV | MS_NOSUID, l->tmpfs_opts) < 0)
                        return -1;
        } else {
                /* noinit_itable: the template's inode tables were left for
                 * lazy init; zeroing them in the background would turn the
                 * sparse file into a full one. */
                if (mount(l->loop_dev, l->layer, "ext4", MS_NODEV | MS_NOATIME, "noinit_itable,errors=remount-ro") < 0)
                        return -1;
        }
        if ((mkdir(l->upper, 0755) < 0 && errno != EEXIST) || (mkdir(l->work, 0700) < 0 && errno != EEXIST))
                return -1;
        /* A snapshot's layers, read-only: noload, for nothing may write
         * their journal (it was replayed when the snapshot was taken). */
        for (unsigned i = 0; i < l->nbase; i++)
                if (mount(l->base_dev[i], l->base_mnt[i], "ext4", MS_RDONLY | MS_NODEV | MS_NOSUID | MS_NOATIME,
                          "noload") < 0)
                        return -1;
        /* The overlay's root takes its owner and mode from the upper dir. */
        int ufd = open(l->upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (ufd < 0)
                return -1;
        if (fchown(ufd, l->owner, l->owner) < 0 || fchmod(ufd, 0755) < 0) {
                close(ufd);
                return -1;
        }
        close(ufd);
        if (mount("runtime-root", l->root, "overlay", MS_NODEV, l->overlay_opts) < 0)
                return -1;
        /* The agent's stderr: on the layer, outside the overlay, so bounded
         * by diskMiB like everything the sandbox writes, and out of its
         * sight. */
        int fd = open(l->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -1;
        if (dup2(fd, 2) < 0)
                return -1;
        close(fd);
        return 0;
}

int rootfs_wait_released(const char *sandbox_dir, int timeout_ms) {
        char img[PATH_MAX];
        int r = path_join(img, sizeof img, sandbox_dir, "layer.img");
        if (r < 0)
                return r;
        return wait_loop_free(img, timeout_ms) ? 0 : -EBUSY;
}

int rootfs_disk_used(pid_t pid, const char *sandbox_dir, uint64_t *ret) {
        /* The layer is mounted only in the sandbox's own mount namespace:
         * reach it through a process that lives there. */
        char layer[PATH_MAX];
        if (snprintf(layer, sizeof layer, "/proc/%d/root%s/layer", (int)pid, sandbox_dir) >= (int)sizeof layer)
                return -ENAMETOOLONG;
        struct statfs sf;
        if (statfs(layer, &sf) < 0)
                return -errno;
        if (sf.f_type != 0xEF53 && sf.f_type != 0x01021994) /* ext4, tmpfs */
                return -ENOENT;
        *ret = (uint64_t)(sf.f_blocks - sf.f_bfree) * (uint64_t)sf.f_bsize;
        return 0;
}

int rootfs_remove(const char *sandbox_dir) {
        int r = rootfs_unmount(sandbox_dir);
        if (r < 0)
                return r;
        r = rootfs_wait_released(sandbox_dir, 2000);
        if (r < 0)
                return r;
        if (rootfs_is_mounted(sandbox_dir))
                return -EBUSY;
        return path_remove_tree_at(AT_FDCWD, sandbox_dir);
}

static const char *find_e2fsck(void) {
        static const char *const cands[] = {"/usr/sbin/e2fsck", "/sbin/e2fsck", "/usr/bin/e2fsck"};
        for (size_t i = 0; i < ELEMENTSOF(cands); i++)
                if (access(cands[i], X_OK) == 0)
                        return cands[i];
        return NULL;
}

/* What a journal replay may need to write: at most a journal's worth
 * (ext4's default for these layer sizes: 64 MiB). */
#define REPLAY_ROOM_BYTES (64ull << 20)

/* e2fsck says only that it failed. The replay writes into a clone, whose
 * every rewritten block needs a new one in the store: where the store has
 * no room for them left (a full layer pool) that is the cause, and the
 * caller's answer is "out of disk space" (503), not an internal error. */
static int replay_failure(const char *out) {
        char dir[PATH_MAX];
        if (snprintf(dir, sizeof dir, "%s", out) >= (int)sizeof dir)
                return -EIO;
        struct statvfs sv;
        if (statvfs(dirname(dir), &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < REPLAY_ROOM_BYTES)
                return -ENOSPC;
        return -EIO;
}

/* Replays the committed transactions left in the journal of a copy of a
 * mounted ext4 (e2fsck -E journal_only; exit codes 0 and 1 are success), so
 * that it mounts clean, read-only too, anywhere; then syncs it. */
static int replay_journal(const char *out) {
        int r;
        const char *fsck = find_e2fsck();
        if (!fsck)
                return -ENOENT;
        char *const argv[] = {(char *)fsck, "-p", "-E", "journal_only", (char *)out, NULL};
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        pid_t child;
        r = posix_spawn(&child, argv[0], &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        if (r != 0)
                return -r;
        int status;
        while (waitpid(child, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        if (!WIFEXITED(status) || WEXITSTATUS(status) > 1)
                return replay_failure(out);
        _cleanup_close_ int ofd = open(out, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (ofd < 0 || fsync(ofd) < 0)
                return -errno;
        return 0;
}

int rootfs_copy_image(const char *from, const char *to) {
        int r = copy_extents(from, to, false);
        return r < 0 ? r : replay_journal(to);
}

int rootfs_copy_sparse(const char *from, const char *to) {
        return sparse_copy(from, to);
}

int rootfs_snapshot(const char *sandbox_dir, pid_t pid, const char *dest_dir) {
        char img[PATH_MAX], out[PATH_MAX];
        int r;
        if ((r = path_join(img, sizeof img, sandbox_dir, "layer.img")) < 0 ||
            (r = path_join(out, sizeof out, dest_dir, "layer.img")) < 0)
                return r;
        if (access(img, F_OK) < 0)
                return errno == ENOENT ? -EOPNOTSUPP : -errno;
        /* Its copies will read this snapshot's layers and its own. */
        if (count_bases(sandbox_dir) + 1 > ROOTFS_MAX_BASES)
                return -E2BIG;
        if (pid > 0) {
                /* The layer is mounted in the sandbox's own namespace only:
                 * syncfs through a process there writes its dirty pages and
                 * commits its journal into layer.img. The sandbox is frozen,
                 * so nothing dirties it again before the copy ends. */
                char layer[PATH_MAX];
                if (snprintf(layer, sizeof layer, "/proc/%d/root%s/layer", (int)pid, sandbox_dir) >=
                    (int)sizeof layer)
                        return -ENAMETOOLONG;
                _cleanup_close_ int fd = open(layer, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (fd < 0)
                        return -errno;
                struct statfs sf;
                if (fstatfs(fd, &sf) < 0)
                        return -errno;
                if (sf.f_type != 0xEF53)
                        return -EOPNOTSUPP; /* a tmpfs layer: nothing on disk to keep */
                if (syncfs(fd) < 0)
                        return -errno;
        } else if (!wait_loop_free(img, 2000))
                return -EBUSY;
        /* Not synced here: the copy is synced once its journal is replayed,
         * below, and a sync while the sandbox is frozen would keep it frozen
         * for the host's disk flush. */
        if ((r = copy_extents(img, out, false)) < 0)
                return r;
        /* The sandbox's own lower layers go with it as they are: links,
         * never copies (they are read-only for everyone). */
        unsigned n = count_bases(sandbox_dir);
        if (n > 0) {
                char bases[PATH_MAX];
                if ((r = path_join(bases, sizeof bases, dest_dir, "bases")) < 0)
                        return r;
                if (mkdir(bases, 0700) < 0)
                        return -errno;
        }
        for (unsigned i = 0; i < n && i < ROOTFS_MAX_BASES; i++) {
                char from[PATH_MAX], to[PATH_MAX];
                if (snprintf(from, sizeof from, "%s/bases/%u.img", sandbox_dir, i) >= (int)sizeof from ||
                    snprintf(to, sizeof to, "%s/bases/%u.img", dest_dir, i) >= (int)sizeof to)
                        return -ENAMETOOLONG;
                if (link(from, to) < 0)
                        return -errno;
        }
        return replay_journal(out);
}

int rootfs_restore(const char *snap_dir, const char *sandbox_dir) {
        char img[PATH_MAX], bases[PATH_MAX], part[PATH_MAX];
        int r;
        if ((r = path_join(img, sizeof img, sandbox_dir, "layer.img")) < 0 ||
            (r = path_join(bases, sizeof bases, sandbox_dir, "bases")) < 0 ||
            (r = path_join(part, sizeof part, sandbox_dir, "bases.part")) < 0)
                return r;
        unsigned n = count_bases(snap_dir);
        if (n + 1 > ROOTFS_MAX_BASES)
                return -E2BIG;
        if (mkdir(sandbox_dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if (access(img, F_OK) == 0 || access(bases, F_OK) == 0)
                return -EEXIST;
        /* All the layers appear at once (one rename of their directory) or
         * none: a daemon killed half way must not leave a disk missing a
         * layer, which would boot with files quietly gone. */
        (void)path_remove_tree_at(AT_FDCWD, part);
        if (mkdir(part, 0700) < 0)
                return -errno;
        for (unsigned i = 0; i <= n; i++) {
                char from[PATH_MAX], to[PATH_MAX];
                if ((i < n ? snprintf(from, sizeof from, "%s/bases/%u.img", snap_dir, i)
                           : snprintf(from, sizeof from, "%s/layer.img", snap_dir)) >= (int)sizeof from ||
                    snprintf(to, sizeof to, "%s/%u.img", part, i) >= (int)sizeof to) {
                        r = -ENAMETOOLONG;
                        break;
                }
                if (link(from, to) < 0) {
                        r = -errno;
                        break;
                }
        }
        if (r >= 0) {
                _cleanup_close_ int pfd = open(part, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (pfd < 0 || fsync(pfd) < 0 || rename(part, bases) < 0)
                        r = -errno;
        }
        if (r < 0) {
                (void)path_remove_tree_at(AT_FDCWD, part);
                return r;
        }
        _cleanup_close_ int dfd = open(sandbox_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0)
                return -errno;
        return 0;
}
