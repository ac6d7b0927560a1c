/* The agent's tar reader and writer (src/agent/tar.c) in a temporary
 * directory: a round trip, the bounds, and the members it refuses. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/tar.h"

typedef struct Dir {
        char path[PATH_MAX];
        int fd;
} Dir;

static int setup(void **state) {
        Dir *d = calloc(1, sizeof(Dir));
        snprintf(d->path, sizeof d->path, "%s/runtime-test-tar-XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        assert_non_null(mkdtemp(d->path));
        d->fd = open(d->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(d->fd >= 0);
        *state = d;
        return 0;
}

static int teardown(void **state) {
        Dir *d = *state;
        char cmd[2 * PATH_MAX + 64];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->path);
        close(d->fd);
        assert_int_equal(system(cmd), 0);
        free(d);
        return 0;
}

typedef struct Buf {
        uint8_t *p;
        size_t n;
} Buf;

static int buf_write(void *userdata, const void *data, size_t n) {
        Buf *b = userdata;
        b->p = realloc(b->p, b->n + n);
        memcpy(b->p + b->n, data, n);
        b->n += n;
        return 0;
}

/* One header block, as a writer of the archive would make it. */
static void block(Buf *b, const char *name, char type, size_t size, const char *link) {
        uint8_t h[512] = { 0 };
        snprintf((char *)h, 100, "%s", name);
        snprintf((char *)h + 100, 8, "%07o", 0644);
        snprintf((char *)h + 124, 12, "%011zo", size);
        h[156] = (uint8_t)type;
        if (link)
                snprintf((char *)h + 157, 100, "%s", link);
        memcpy(h + 257, "ustar", 6);
        memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (int i = 0; i < 512; i++)
                sum += h[i];
        snprintf((char *)h + 148, 8, "%06o", sum);
        buf_write(b, h, 512);
}

static void body(Buf *b, const char *data) {
        size_t n = strlen(data);
        buf_write(b, data, n);
        uint8_t pad[512] = { 0 };
        if (n % 512)
                buf_write(b, pad, 512 - n % 512);
}

static void end(Buf *b) {
        uint8_t z[1024] = { 0 };
        buf_write(b, z, sizeof z);
}

static int extract_into(int fd, Buf *b, uint64_t max_bytes, uint64_t max_entries, size_t step, char *why) {
        TarLimits lim = { max_bytes, max_entries };
        TarExtract *x = NULL;
        assert_int_equal(tar_extract_new(fd, &lim, &x), 0);
        int k = 0;
        for (size_t off = 0; off < b->n && k == 0; off += step)
                k = tar_extract_feed(x, b->p + off, b->n - off < step ? b->n - off : step);
        if (k == 0)
                k = tar_extract_finish(x);
        if (why)
                snprintf(why, 256, "%s", tar_extract_error(x));
        tar_extract_free(x);
        return k;
}

static void test_round_trip(void **state) {
        Dir *d = *state;
        assert_int_equal(mkdirat(d->fd, "src", 0755), 0);
        assert_int_equal(mkdirat(d->fd, "src/sub", 0700), 0);
        int f = openat(d->fd, "src/sub/a.txt", O_CREAT | O_WRONLY | O_CLOEXEC, 0640);
        assert_int_equal(write(f, "hello", 5), 5);
        close(f);
        char longname[300] = "src/";
        memset(longname + 4, 'x', 200);
        f = openat(d->fd, longname, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        close(f);
        assert_int_equal(symlinkat("sub/a.txt", d->fd, "src/link"), 0);
        assert_int_equal(linkat(d->fd, "src/sub/a.txt", d->fd, "src/hard", 0), 0);
        assert_int_equal(mkfifoat(d->fd, "src/fifo", 0600), 0);
        int src = openat(d->fd, "src", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        Buf b = { 0 };
        assert_int_equal(tar_create(src, NULL, 0, buf_write, &b), 0);
        close(src);
        assert_int_equal(mkdirat(d->fd, "dst", 0755), 0);
        int dst = openat(d->fd, "dst", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        /* Fed in odd pieces: the reader keeps its place across them. */
        assert_int_equal(extract_into(dst, &b, 1 << 20, 100, 7, NULL), 0);
        struct stat st;
        assert_int_equal(fstatat(dst, "sub/a.txt", &st, 0), 0);
        assert_int_equal(st.st_size, 5);
        assert_int_equal(st.st_mode & 0777, 0640);
        assert_int_equal(st.st_nlink, 2);
        assert_int_equal(fstatat(dst, longname + 4, &st, 0), 0);
        char target[64] = { 0 };
        assert_int_equal(readlinkat(dst, "link", target, sizeof target), 9);
        assert_string_equal(target, "sub/a.txt");
        assert_int_equal(fstatat(dst, "fifo", &st, AT_SYMLINK_NOFOLLOW), -1); /* not carried */
        /* Excluded paths are left out with all below them. */
        free(b.p);
        b = (Buf){ 0 };
        src = openat(d->fd, "src", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        const char *ex[] = { "sub" };
        assert_int_equal(tar_create(src, ex, 1, buf_write, &b), 0);
        close(src);
        assert_null(memmem(b.p, b.n, "./sub", 5));
        free(b.p);
        close(dst);
}

static void refused(Dir *d, Buf *b, int want, const char *what) {
        char why[256];
        int dst = openat(d->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(extract_into(dst, b, 1 << 20, 100, 512, why), want);
        close(dst);
        assert_non_null(strstr(why, what));
        free(b->p);
        *b = (Buf){ 0 };
}

static void test_refusals_and_bounds(void **state) {
        Dir *d = *state;
        Buf b = { 0 };
        block(&b, "/etc/x", '0', 0, NULL);
        end(&b);
        refused(d, &b, -EPERM, "outside");
        block(&b, "a/../../x", '0', 0, NULL);
        end(&b);
        refused(d, &b, -EPERM, "outside");
        block(&b, "l", '2', 0, "../x");
        end(&b);
        refused(d, &b, -EPERM, "leads outside");
        block(&b, "ok", '2', 0, "."), block(&b, "l", '2', 0, "/etc");
        end(&b);
        refused(d, &b, -EPERM, "leads outside");
        struct stat st;
        assert_int_equal(fstatat(d->fd, "ok", &st, AT_SYMLINK_NOFOLLOW), -1); /* all links or none */
        block(&b, "h", '1', 0, "/etc/passwd");
        end(&b);
        refused(d, &b, -EPERM, "hard link");
        block(&b, "dev", '3', 0, NULL);
        end(&b);
        refused(d, &b, -EPERM, "device");
        block(&b, "fifo", '6', 0, NULL);
        end(&b);
        refused(d, &b, -EPERM, "FIFO");
        block(&b, "big", '0', 5, NULL);
        body(&b, "12345");
        end(&b);
        char why[256];
        int dst = openat(d->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(extract_into(dst, &b, 4, 100, 512, why), -EFBIG);
        assert_int_equal(extract_into(dst, &b, 5, 100, 512, why), 0);
        free(b.p);
        b = (Buf){ 0 };
        for (int i = 0; i < 4; i++) {
                char n[16];
                snprintf(n, sizeof n, "d%d", i);
                block(&b, n, '5', 0, NULL);
        }
        end(&b);
        assert_int_equal(extract_into(dst, &b, 5, 3, 512, why), -EFBIG);
        /* Cut short, and a header whose checksum does not hold. */
        b.n -= 1024;
        assert_int_equal(extract_into(dst, &b, 5, 100, 512, why), -EBADMSG);
        b.p[0] ^= 1;
        assert_int_equal(extract_into(dst, &b, 5, 100, 512, why), -EBADMSG);
        free(b.p);
        close(dst);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_refusals_and_bounds, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
