/*
 * libFuzzer target for the agent's tar reader (src/agent/tar.c): an archive
 * is whatever a client sends. The input is fed in pieces whose sizes come
 * from its first byte, into a fresh directory below a scratch one, with
 * small bounds so that they are reached. Whatever the input, the reader must
 * not crash, must end within its bounds, and nothing may appear beside the
 * target directory (a write outside it is an escape: abort).
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/tar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char scratch[PATH_MAX];

static void remove_tree(int dir_fd, const char *name) {
        int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
                unlinkat(dir_fd, name, 0);
                return;
        }
        DIR *d = fdopendir(fd);
        struct dirent *de;
        while (d && (de = readdir(d)))
                if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                        remove_tree(dirfd(d), de->d_name);
        if (d)
                closedir(d);
        unlinkat(dir_fd, name, AT_REMOVEDIR);
}

static size_t entries_of(const char *path) {
        DIR *d = opendir(path);
        size_t n = 0;
        struct dirent *de;
        while (d && (de = readdir(d)))
                if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                        n++;
        if (d)
                closedir(d);
        return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!scratch[0]) {
                snprintf(scratch, sizeof scratch, "%s/runtime-fuzz-tar-XXXXXX",
                         access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
                if (!mkdtemp(scratch))
                        abort();
        }
        int top = open(scratch, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (top < 0 || mkdirat(top, "t", 0755) < 0)
                abort();
        int root = openat(top, "t", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        TarLimits lim = { .max_bytes = 1 << 16, .max_entries = 64 };
        TarExtract *x = NULL;
        if (root < 0 || tar_extract_new(root, &lim, &x) < 0)
                abort();
        size_t step = size ? (size_t)data[0] * 7 + 1 : 1;
        int k = 0;
        for (size_t off = 1; off < size && k == 0; off += step)
                k = tar_extract_feed(x, data + off, size - off < step ? size - off : step);
        if (k == 0)
                (void)tar_extract_finish(x);
        tar_extract_free(x);
        close(root);
        /* Only the target may hold anything. */
        if (entries_of(scratch) != 1)
                abort();
        remove_tree(top, "t");
        close(top);
        return 0;
}
