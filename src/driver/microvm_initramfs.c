#include "driver/microvm_initramfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "driver/microvm-internal.h"

typedef struct CpioWriter {
        int fd;
        uint32_t ino;
        uint64_t off;
} CpioWriter;

static int cpio_pad(CpioWriter *w, size_t align) {
        static const uint8_t zeros[512];
        size_t pad = (align - w->off % align) % align;
        if (pad == 0)
                return 0;
        w->off += pad;
        return io_write_all(w->fd, zeros, pad);
}

/* One newc entry; the body comes from body_fd (size bytes) or is empty. */
static int cpio_entry(CpioWriter *w, const char *name, uint32_t mode, uint32_t rmaj, uint32_t rmin, int body_fd,
                      uint64_t size) {
        if (size > UINT32_MAX)
                return -EFBIG;
        size_t namesize = strlen(name) + 1;
        if (namesize > 4096)
                return -ENAMETOOLONG;
        char hdr[128];
        snprintf(hdr, sizeof(hdr), "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", ++w->ino, mode, 0u,
                 0u, 1u, 0u, (uint32_t)size, 0u, 0u, rmaj, rmin, (uint32_t)namesize, 0u);
        int r = io_write_all(w->fd, hdr, 110);
        if (r < 0)
                return r;
        r = io_write_all(w->fd, name, namesize);
        if (r < 0)
                return r;
        w->off += 110 + namesize;
        r = cpio_pad(w, 4);
        if (r < 0)
                return r;
        uint8_t buf[65536];
        uint64_t left = size;
        while (left > 0) {
                ssize_t n = read(body_fd, buf, left < sizeof(buf) ? left : sizeof(buf));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return n < 0 ? -errno : -EIO; /* the file shrank under us */
                r = io_write_all(w->fd, buf, (size_t)n);
                if (r < 0)
                        return r;
                left -= (uint64_t)n;
                w->off += (uint64_t)n;
        }
        return cpio_pad(w, 4);
}

static int cpio_file(CpioWriter *w, const char *name, const char *path, uint32_t perm) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        return cpio_entry(w, name, S_IFREG | perm, 0, 0, fd, (uint64_t)st.st_size);
}

/* A small file of the archive from text (a pipe as the body's source). */
static int cpio_text(CpioWriter *w, const char *name, const char *text) {
        size_t n = strlen(text);
        int p[2];
        if (n > 4096)
                return -E2BIG;
        if (pipe2(p, O_CLOEXEC) < 0)
                return -errno;
        int r = io_write_all(p[1], text, n);
        close(p[1]);
        if (r == 0)
                r = cpio_entry(w, name, S_IFREG | 0644, 0, 0, p[0], n);
        close(p[0]);
        return r;
}

static int cmp_str(const void *a, const void *b) {
        return strcmp(*(char *const *)a, *(char *const *)b);
}

int microvm_write_initramfs(int fd, const char *modules_dir, const char *agent, const char *volumes) {
        CpioWriter w = { .fd = fd };
        int r;
        if ((r = cpio_entry(&w, "dev", S_IFDIR | 0755, 0, 0, -1, 0)) < 0 ||
            (r = cpio_entry(&w, "dev/console", S_IFCHR | 0600, 5, 1, -1, 0)) < 0 ||
            (r = cpio_entry(&w, "lib", S_IFDIR | 0755, 0, 0, -1, 0)) < 0 ||
            (r = cpio_entry(&w, "lib/runtime-modules", S_IFDIR | 0755, 0, 0, -1, 0)) < 0)
                return r;

        DIR *d = opendir(modules_dir);
        if (!d)
                return -errno;
        char *names[64];
        size_t n = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l < 4 || l > 64 || strcmp(de->d_name + l - 3, ".ko") != 0)
                        continue;
                if (n == ELEMENTSOF(names))
                        break;
                names[n] = strdup(de->d_name);
                if (!names[n]) {
                        r = -ENOMEM;
                        break;
                }
                n++;
        }
        closedir(d);
        if (r == 0)
                qsort(names, n, sizeof(names[0]), cmp_str);
        for (size_t i = 0; i < n && r == 0; i++) {
                char src[PATH_MAX], dst[128];
                snprintf(dst, sizeof(dst), "lib/runtime-modules/%s", names[i]);
                r = snprintf(src, sizeof(src), "%s/%s", modules_dir, names[i]) >= (int)sizeof(src) ? -ENAMETOOLONG : 0;
                if (r == 0)
                        r = cpio_file(&w, dst, src, 0644);
        }
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        if (r < 0)
                return r;
        if (volumes && (r = cpio_text(&w, MICROVM_VOLUMES_FILE, volumes)) < 0)
                return r;
        if ((r = cpio_file(&w, "init", agent, 0755)) < 0 ||
            (r = cpio_entry(&w, "TRAILER!!!", 0, 0, 0, -1, 0)) < 0)
                return r;
        return cpio_pad(&w, 512);
}

int microvm_initramfs_file(const char *path, const char *modules_dir, const char *agent, const char *volumes) {
        _cleanup_close_ int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
                return -errno;
        int r = microvm_write_initramfs(fd, modules_dir, agent, volumes);
        if (r == 0 && (fchmod(fd, 0644) < 0 || fsync(fd) < 0))
                r = -errno;
        if (r < 0)
                unlink(path);
        return r;
}
