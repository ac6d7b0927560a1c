#include "driver/microvm_disk.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/macro.h"
#include "driver/launch.h"

#define MKE2FS_TIMEOUT_MS 60000

static const char *mke2fs_path(void) {
        static const char *const candidates[] = { "/usr/sbin/mke2fs", "/sbin/mke2fs" };
        for (size_t i = 0; i < ELEMENTSOF(candidates); i++)
                if (access(candidates[i], X_OK) == 0)
                        return candidates[i];
        return NULL;
}

bool microvm_disk_tool_found(void) {
        return mke2fs_path() != NULL;
}

int microvm_disk_make(const char *path, unsigned disk_mib, int log_fd) {
        if (access(path, F_OK) == 0)
                return 0;
        const char *mke2fs = mke2fs_path();
        if (!mke2fs)
                return -ENOENT;
        char tmp[PATH_MAX];
        if (snprintf(tmp, sizeof(tmp), "%s.new", path) >= (int)sizeof(tmp))
                return -ENAMETOOLONG;
        unlink(tmp);
        {
                _cleanup_close_ int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (fd < 0)
                        return -errno;
                if (ftruncate(fd, (off_t)disk_mib * 1024 * 1024) < 0) {
                        int e = -errno;
                        unlink(tmp);
                        return e;
                }
        }
        _cleanup_close_ int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (devnull < 0)
                return -errno;
        /* lazy_*_init: nothing but metadata is written, the file stays
         * sparse; the guest's ext4 zeroes inode tables in the background. */
        char *const argv[] = { (char *)mke2fs, "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0", "-L", "runtime-upper",
                               "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", tmp, NULL };
        static char *const env[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", NULL };
        LaunchFds f = { .stdin_fd = devnull, .stdout_fd = log_fd, .stderr_fd = log_fd };
        pid_t pid;
        int r = launch_spawn(argv, env, &f, &pid);
        int status = 0;
        if (r == 0)
                r = launch_wait_or_kill(pid, MKE2FS_TIMEOUT_MS, &status);
        if (r == 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
                r = -EIO;
        if (r == 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp);
        return r;
}
