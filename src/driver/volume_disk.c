/* A volume's disk on the host: an ext4 image file, mounted through a loop
 * device (volume_disk.h). */
#include "driver/volume_disk.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "driver/launch.h"
#include "driver/rootfs.h"

int volume_disk_create(const char *img, unsigned mib) {
        if (access(img, F_OK) == 0)
                return -EEXIST;
        int r = rootfs_mkfs(img, mib, LAUNCH_DEFAULT_UID_SHIFT + LAUNCH_SANDBOX_UID);
        if (r < 0)
                (void)unlink(img);
        return r;
}

bool volume_disk_mounted(const char *dir) {
        char parent[PATH_MAX];
        struct stat a, b;
        if (snprintf(parent, sizeof parent, "%s/..", dir) >= (int)sizeof parent)
                return false;
        if (stat(dir, &a) < 0 || stat(parent, &b) < 0)
                return false;
        return a.st_dev != b.st_dev;
}

/* The daemon's own mount of img at dir again, on the loop device that
 * still holds it: the same filesystem (one superblock), not a second. */
static int mount_again(const char *img, const char *dir) {
        char name[32], dev[64];
        int r = rootfs_loop_device(img, name, sizeof name);
        if (r < 0)
                return r;
        snprintf(dev, sizeof dev, "/dev/%s", name);
        return mount(dev, dir, "ext4", MS_NODEV | MS_NOSUID | MS_NOATIME, "errors=remount-ro") < 0 ? -errno : 0;
}

int volume_disk_mount(const char *img, const char *dir) {
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if (volume_disk_mounted(dir))
                return 0;
        /* A guest kernel holds it (volume_disk_hold): two ext4 instances on
         * one file corrupt it. */
        if (volume_disk_held(img))
                return -EBUSY;
        /* A loop device holds it without the daemon's mount: a sandbox that
         * an earlier daemon left running (a live restore) binds it still.
         * Mounted again from that device it is the same filesystem (one
         * superblock), never a second one through another device. */
        if (rootfs_loop_backed(img))
                return mount_again(img, dir) < 0 ? -EBUSY : 0;
        int fd = -1;
        char dev[64];
        int r = rootfs_loop_attach(img, false, &fd, dev, sizeof dev);
        if (r < 0)
                return r;
        /* errors=remount-ro: a filesystem error stops writes to the volume,
         * never the host. nodev, nosuid: a volume carries data only. */
        r = mount(dev, dir, "ext4", MS_NODEV | MS_NOSUID | MS_NOATIME, "errors=remount-ro") < 0 ? -errno : 0;
        /* The mount holds the device now; autoclear detaches it with the
         * last unmount. */
        close(fd);
        return r;
}

int volume_disk_unmount(const char *dir) {
        if (!volume_disk_mounted(dir))
                return 0;
        if (umount2(dir, UMOUNT_NOFOLLOW) == 0)
                return 0;
        return umount2(dir, MNT_DETACH | UMOUNT_NOFOLLOW) < 0 ? -errno : 0;
}

int volume_disk_grow(const char *img, unsigned mib) {
        char fsck[64], resize[64], size[32];
        if (!rootfs_find_tool("e2fsck", fsck, sizeof fsck) || !rootfs_find_tool("resize2fs", resize, sizeof resize))
                return -ENOENT;
        if (rootfs_loop_backed(img))
                return -EBUSY;
        {
                _cleanup_close_ int fd = open(img, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
                if (fd < 0)
                        return -errno;
                if (ftruncate(fd, (off_t)mib << 20) < 0)
                        return -errno;
        }
        /* resize2fs grows only a filesystem checked since it was last
         * mounted; e2fsck's 1 means it fixed something, and is fine. */
        char *const check[] = { fsck, "-f", "-p", (char *)img, NULL };
        int r = rootfs_run(check, 1);
        if (r < 0)
                return r;
        snprintf(size, sizeof size, "%uM", mib);
        char *const grow[] = { resize, (char *)img, size, NULL };
        return rootfs_run(grow, 0);
}

static int image_lock(int fd, short type, int cmd, struct flock *ret) {
        struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
        if (fcntl(fd, cmd, &fl) < 0)
                return -errno;
        if (ret)
                *ret = fl;
        return 0;
}

/* How long a release waits for a loop device on its way out. */
#define RELEASE_WAIT_MS 3000u
#define RELEASE_POLL_MS 20u

int volume_disk_release_host(const char *img, const char *dir) {
        bool was = volume_disk_mounted(dir);
        int r = volume_disk_unmount(dir);
        if (r < 0)
                return r;
        /* The kernel detaches an autoclear loop device after its last user
         * is gone, not within the unmount's call: a mount just ended (the
         * daemon's, or a deleted sandbox's bind) holds it a moment longer. */
        for (unsigned waited = 0; rootfs_loop_backed(img); waited += RELEASE_POLL_MS) {
                if (waited >= RELEASE_WAIT_MS) {
                        /* A running sandbox binds it still: the daemon's
                         * mount goes back, for that sandbox's peers. */
                        if (was)
                                (void)mount_again(img, dir);
                        return -EBUSY;
                }
                (void)nanosleep(&(struct timespec){ .tv_nsec = RELEASE_POLL_MS * 1000000L }, NULL);
        }
        return 0;
}

bool volume_disk_held(const char *img) {
        _cleanup_close_ int fd = open(img, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct flock fl = { .l_type = F_UNLCK };
        return fd >= 0 && image_lock(fd, F_WRLCK, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

int volume_disk_hold(const char *img, bool read_only, int *ret_fd) {
        _cleanup_close_ int fd = open(img, (read_only ? O_RDONLY : O_RDWR) | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        int r = image_lock(fd, read_only ? F_RDLCK : F_WRLCK, F_OFD_SETLK, NULL);
        if (r < 0)
                return r == -EAGAIN || r == -EACCES ? -EBUSY : r;
        /* After the lock: a host mount made before it is seen here, and one
         * tried after it sees the lock (both under the daemon's disk lock). */
        if (rootfs_loop_backed(img))
                return -EBUSY;
        *ret_fd = TAKE_FD(fd);
        return 0;
}
