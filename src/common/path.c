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

static int remove_entry(int dfd, const char *name, dev_t dev, unsigned depth, PathRemove *o);

/* Removes what the directory fd (on device dev) holds; fd is closed. Either
 * stops at the first failure or goes on past it and returns the first. */
static int remove_entries(int fd, dev_t dev, unsigned depth, PathRemove *o) {
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
                int r = remove_entry(dirfd(d), de->d_name, dev, depth, o);
                if (r < 0 && ret == 0)
                        ret = r;
                if (r < 0 && o->stop_at_first_error)
                        break;
        }
        closedir(d);
        return ret;
}

/* One entry of a tree: a file is unlinked, a directory emptied then removed
 * (emptied again, up to three times, when something appeared in it
 * meanwhile). Never follows a link, never enters another filesystem. */
static int remove_entry(int dfd, const char *name, dev_t dev, unsigned depth, PathRemove *o) {
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISDIR(st.st_mode)) {
                /* Only a directory's device tells a mount: overlayfs gives
                 * a file the device of the layer it lives on. A file that is
                 * a mount point fails its unlink (EBUSY). */
                if (unlinkat(dfd, name, 0) < 0)
                        return errno == ENOENT ? 0 : -errno;
                o->removed++;
                return 0;
        }
        if (st.st_dev != dev)
                return o->mount_error; /* a mount we do not remove through */
        if (depth >= o->max_depth)
                return o->depth_error;
        for (int pass = 0; pass < 3; pass++) {
                int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                        return errno == ENOENT ? 0 : -errno;
                int r = remove_entries(fd, dev, depth + 1, o);
                if (r < 0)
                        return r;
                if (unlinkat(dfd, name, AT_REMOVEDIR) == 0) {
                        o->removed++;
                        return 0;
                }
                if (errno == ENOENT)
                        return 0;
                if (errno != ENOTEMPTY && errno != EEXIST)
                        return -errno;
        }
        return -ENOTEMPTY;
}

int path_remove_tree(int dfd, const char *name, PathRemove *o) {
        if (o->max_depth == 0 || o->mount_error >= 0 || o->depth_error >= 0)
                return -EINVAL;
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        return remove_entry(dfd, name, st.st_dev, 0, o);
}

int path_remove_tree_at(int dfd, const char *name) {
        PathRemove o = { .max_depth = TREE_MAX_DEPTH, .mount_error = -EBUSY, .depth_error = -ELOOP };
        return path_remove_tree(dfd, name, &o);
}

int path_identity(const char *path, char *buf, size_t len) {
        struct stat st;
        if (stat(path, &st) < 0)
                return -errno;
        int n = snprintf(buf, len, "%llu:%llu:%lld:%lld.%09ld", (unsigned long long)st.st_dev,
                         (unsigned long long)st.st_ino, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                         (long)st.st_mtim.tv_nsec);
        return n < 0 || (size_t)n >= len ? -ENOBUFS : 0;
}

int path_mkdir_private(const char *path) {
        _cleanup_free_ char *p = strdup(path);
        if (!p)
                return -ENOMEM;
        for (char *s = p + 1; *s; s++)
                if (*s == '/') {
                        *s = '\0';
                        if (mkdir(p, 0755) < 0 && errno != EEXIST)
                                return -errno;
                        *s = '/';
                }
        if (mkdir(p, 0700) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}
