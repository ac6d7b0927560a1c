#include "common/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"

/* A heap buffer: a static or thread-local one would cost every thread. */
#define COPY_BUF (1u << 20)

/* off: where in the file (pwrite), or -1 for the descriptor's position. */
static int write_loop(int fd, const uint8_t *p, size_t n, off_t off, bool is_socket) {
        while (n > 0) {
                ssize_t k = off >= 0 ? pwrite(fd, p, n, off)
                            : is_socket ? send(fd, p, n, MSG_NOSIGNAL)
                                        : write(fd, p, n);
                if (k < 0 && is_socket && errno == ENOTSOCK) {
                        is_socket = false;
                        continue;
                }
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return k < 0 ? -errno : -EIO;
                p += k;
                n -= (size_t)k;
                if (off >= 0)
                        off += k;
        }
        return 0;
}

int io_write_all(int fd, const void *buf, size_t n) {
        return write_loop(fd, buf, n, -1, false);
}

int io_send_all(int fd, const void *buf, size_t n) {
        return write_loop(fd, buf, n, -1, true);
}

/* FICLONE refusals that mean "this filesystem (or this pair) cannot share
 * blocks", after which a byte copy is the way: no reflink support, two
 * filesystems or mounts, a file type or flag it will not clone. A full
 * filesystem or an I/O error is the copy's own failure, not one of these. */
static bool clone_refused(int err) {
        return err == EOPNOTSUPP || err == ENOTTY || err == EXDEV || err == EINVAL || err == EPERM ||
               err == ETXTBSY || err == EBADF || err == ENOSYS;
}

int io_copy_sparse(int in, int out) {
        struct stat st;
        if (fstat(in, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        /* Where the filesystem shares blocks between files (XFS with
         * reflink, btrfs) the copy is a clone: no data is read or written,
         * the two files share every extent until one of them writes it. */
        if (ioctl(out, FICLONE, in) == 0)
                return 0;
        if (!clone_refused(errno))
                return -errno;
        if (ftruncate(out, st.st_size) < 0)
                return -errno;
        _cleanup_free_ uint8_t *buf = malloc(COPY_BUF);
        if (!buf)
                return -ENOMEM;
        off_t pos = 0;
        while (pos < st.st_size) {
                off_t data = lseek(in, pos, SEEK_DATA);
                if (data < 0)
                        return errno == ENXIO ? 0 : -errno; /* only a hole is left */
                off_t hole = lseek(in, data, SEEK_HOLE);
                if (hole < 0)
                        return -errno;
                for (off_t o = data; o < hole;) {
                        size_t want = (size_t)(hole - o) < COPY_BUF ? (size_t)(hole - o) : COPY_BUF;
                        ssize_t k = pread(in, buf, want, o);
                        if (k < 0 && errno == EINTR)
                                continue;
                        if (k <= 0)
                                return k < 0 ? -errno : -EIO; /* the file shrank under us */
                        int r = write_loop(out, buf, (size_t)k, o, false);
                        if (r < 0)
                                return r;
                        o += k;
                }
                pos = hole;
        }
        return 0;
}

int io_read_full(int fd, void *buf, size_t cap, size_t *ret_len) {
        size_t len = 0;
        while (len < cap) {
                ssize_t n = read(fd, (char *)buf + len, cap - len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        break;
                len += (size_t)n;
        }
        *ret_len = len;
        return 0;
}

int io_read_text(const char *path, char *buf, size_t len) {
        if (len == 0)
                return -EINVAL;
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t n;
        do
                n = read(fd, buf, len - 1);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        buf[n] = '\0';
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
                buf[--n] = '\0';
        return 0;
}

int io_clone_probe(const char *dir) {
        _cleanup_close_ int a = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (a < 0)
                return -errno;
        _cleanup_close_ int b = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (b < 0)
                return -errno;
        static const char block[4096];
        int r = io_write_all(a, block, sizeof block);
        if (r < 0)
                return r;
        if (fsync(a) < 0)
                return -errno;
        return ioctl(b, FICLONE, a) == 0 ? 0 : -errno;
}

int io_write_text_at(int dfd, const char *name, const char *text, bool excl, unsigned mode) {
        int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (excl ? O_EXCL : O_TRUNC);
        _cleanup_close_ int fd = openat(dfd, name, flags, (mode_t)mode);
        if (fd < 0)
                return -errno;
        int r = io_write_all(fd, text, strlen(text));
        if (r == 0 && fsync(fd) < 0)
                r = -errno;
        return r;
}

int io_write_knob(const char *dir, const char *name, const char *value) {
        char p[PATH_MAX];
        if (!dir)
                return -ENOENT;
        if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p)
                return -ENAMETOOLONG;
        _cleanup_close_ int fd = open(p, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_TRUNC);
        if (fd < 0)
                return -errno;
        size_t n = strlen(value);
        ssize_t w = write(fd, value, n);
        if (w < 0)
                return -errno;
        return (size_t)w == n ? 0 : -EIO;
}
