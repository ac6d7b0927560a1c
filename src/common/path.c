#include "common/path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"

/* One descriptor per level is open at a time: bounded so that a hostile tree
 * cannot exhaust them or the stack. */
#define TREE_MAX_DEPTH 256u

int path_join(char *buf, size_t len, const char *a, const char *b) {
        int n = snprintf(buf, len, "%s/%s", a, b);
        return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int path_self_dir(char *buf, size_t len) {
        if (len < 2)
                return -ENAMETOOLONG;
        ssize_t n = readlink("/proc/self/exe", buf, len - 1);
        if (n < 0)
                return -errno;
        if ((size_t)n >= len - 1)
                return -ENAMETOOLONG; /* possibly cut short */
        buf[n] = '\0';
        char *slash = strrchr(buf, '/');
        if (!slash)
                return -ENOENT;
        *(slash == buf ? slash + 1 : slash) = '\0';
        return 0;
}

/* Empties the directory fd (on device dev); fd is closed. */
static int empty_dir(int fd, dev_t dev, unsigned depth) {
        if (depth > TREE_MAX_DEPTH) {
                close(fd);
                return -ELOOP;
        }
        DIR *d = fdopendir(fd);
        if (!d) {
                int r = -errno;
                close(fd);
                return r;
        }
        int ret = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                if (st.st_dev != dev) {
                        if (ret == 0)
                                ret = -EBUSY; /* a mount we do not remove through */
                        continue;
                }
                int r = 0;
                if (S_ISDIR(st.st_mode)) {
                        int cfd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        r = cfd < 0 ? -errno : empty_dir(cfd, dev, depth + 1);
                        if (unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) < 0 && errno != ENOENT && r == 0)
                                r = -errno;
                } else if (unlinkat(dirfd(d), de->d_name, 0) < 0 && errno != ENOENT)
                        r = -errno;
                if (r < 0 && ret == 0)
                        ret = r;
        }
        closedir(d);
        return ret;
}

int path_remove_tree_at(int dfd, const char *name) {
        if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
                return 0;
        if (errno != EISDIR)
                return -errno;
        int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? 0 : -errno;
        struct stat st;
        if (fstat(fd, &st) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        int r = empty_dir(fd, st.st_dev, 0);
        if (r < 0)
                return r;
        if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
                return -errno;
        return 0;
}
