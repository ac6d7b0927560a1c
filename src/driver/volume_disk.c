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

int volume_disk_mount(const char *img, const char *dir) {
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if (volume_disk_mounted(dir))
                return 0;
        if (rootfs_loop_backed(img))
                return -EBUSY;
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
