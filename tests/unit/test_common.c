/* The shared helpers of src/common: the monotonic clock and its deadlines,
 * whole-buffer writes, the sparse copy, path joining and tree removal (which
 * must never follow a link or cross a mount out of the tree). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/io.h"
#include "common/path.h"
#include "common/timeutil.h"

static char *tmpdir(void) {
        char tmpl[] = "/tmp/runtime-test-common-XXXXXX";
        char *d = mkdtemp(tmpl);
        assert_non_null(d);
        return strdup(d);
}

static void test_mono_deadline(void **state) {
        struct timespec now, dl;
        clock_gettime(CLOCK_MONOTONIC, &now);
        time_mono_deadline(&dl, 1500);
        int64_t diff = (int64_t)(dl.tv_sec - now.tv_sec) * 1000 + (dl.tv_nsec - now.tv_nsec) / 1000000;
        assert_true(diff >= 1500 && diff < 2500);
        assert_true(dl.tv_nsec >= 0 && dl.tv_nsec < 1000000000L);
        /* A negative wait is now, not the past. */
        time_mono_deadline(&dl, -5000);
        assert_true(dl.tv_sec >= now.tv_sec);
}

static void test_cond_mono_times_out(void **state) {
        pthread_cond_t c;
        pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
        assert_int_equal(time_cond_init_mono(&c), 0);
        uint64_t t0 = time_now_mono_ms();
        struct timespec dl;
        time_mono_deadline(&dl, 50);
        pthread_mutex_lock(&m);
        int r;
        while ((r = pthread_cond_timedwait(&c, &m, &dl)) == 0)
                ;
        pthread_mutex_unlock(&m);
        assert_int_equal(r, ETIMEDOUT);
        assert_true(time_now_mono_ms() - t0 >= 49);
        pthread_cond_destroy(&c);
}

static void test_write_all_pipe(void **state) {
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        /* More than a pipe holds at once: a reader drains it meanwhile. */
        size_t n = 256 * 1024;
        uint8_t *buf = malloc(n), *got = malloc(n);
        for (size_t i = 0; i < n; i++)
                buf[i] = (uint8_t)(i * 7);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                close(p[0]);
                _exit(io_write_all(p[1], buf, n) == 0 ? 0 : 1);
        }
        close(p[1]);
        size_t have = 0;
        ssize_t k;
        while ((k = read(p[0], got + have, n - have)) > 0)
                have += (size_t)k;
        close(p[0]);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_int_equal(have, n);
        assert_memory_equal(buf, got, n);
        free(buf);
        free(got);
}

static void test_read_full_short_reads_and_cap(void **state) {
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        /* Written in small pieces: the reader meets short reads. */
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                close(p[0]);
                for (int i = 0; i < 100; i++)
                        if (io_write_all(p[1], "0123456789", 10) < 0)
                                _exit(1);
                _exit(0);
        }
        close(p[1]);
        char buf[2048];
        size_t len = 0;
        assert_int_equal(io_read_full(p[0], buf, sizeof(buf), &len), 0);
        assert_int_equal(len, 1000);
        assert_memory_equal(buf + 990, "0123456789", 10);
        close(p[0]);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        /* A source longer than the cap: exactly cap bytes, the rest left. */
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        assert_int_equal(io_write_all(p[1], "abcdefgh", 8), 0);
        assert_int_equal(io_read_full(p[0], buf, 5, &len), 0);
        assert_int_equal(len, 5);
        assert_memory_equal(buf, "abcde", 5);
        close(p[0]);
        close(p[1]);
        assert_int_equal(io_read_full(-1, buf, 5, &len), -EBADF);
}

static void test_send_all_peer_gone(void **state) {
        /* A peer that closed is -EPIPE, not a SIGPIPE that ends the process
         * (the default action is left in place on purpose). */
        signal(SIGPIPE, SIG_DFL);
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        close(sv[1]);
        assert_int_equal(io_send_all(sv[0], "x", 1), -EPIPE);
        close(sv[0]);
        /* On a pipe it writes as io_write_all does. */
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        assert_int_equal(io_send_all(p[1], "abc", 3), 0);
        char b[4] = {0};
        assert_int_equal(read(p[0], b, 3), 3);
        assert_string_equal(b, "abc");
        close(p[0]);
        close(p[1]);
        assert_int_equal(io_write_all(-1, "x", 1), -EBADF);
}

static void test_copy_sparse(void **state) {
        char *d = tmpdir(), a[PATH_MAX], b[PATH_MAX];
        assert_int_equal(path_join(a, sizeof a, d, "in"), 0);
        assert_int_equal(path_join(b, sizeof b, d, "out"), 0);
        int in = open(a, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(in >= 0);
        const off_t size = 64 << 20;
        assert_int_equal(ftruncate(in, size), 0);
        assert_int_equal(pwrite(in, "head", 4, 0), 4);
        assert_int_equal(pwrite(in, "middle", 6, 32 << 20), 6);
        assert_int_equal(pwrite(in, "tail", 4, size - 4), 4);
        int out = open(b, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(out >= 0);
        assert_int_equal(io_copy_sparse(in, out), 0);
        struct stat st;
        assert_int_equal(fstat(out, &st), 0);
        assert_int_equal(st.st_size, size);
        /* The holes stayed holes: far less than the size is allocated. */
        assert_true((off_t)st.st_blocks * 512 < size / 4);
        char buf[8] = {0};
        assert_int_equal(pread(out, buf, 6, 32 << 20), 6);
        assert_string_equal(buf, "middle");
        memset(buf, 0, sizeof buf);
        assert_int_equal(pread(out, buf, 4, size - 4), 4);
        assert_string_equal(buf, "tail");
        assert_int_equal(pread(out, buf, 4, 1 << 20), 4);
        assert_memory_equal(buf, "\0\0\0\0", 4);
        close(in);
        close(out);
        /* Only a regular file is copied. */
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        out = open(b, O_RDWR | O_CLOEXEC);
        assert_int_equal(io_copy_sparse(dfd, out), -EINVAL);
        close(dfd);
        close(out);
        assert_int_equal(path_remove_tree_at(AT_FDCWD, d), 0);
        free(d);
}

/* Whether every extent of fd that FIEMAP reports is shared with another
 * file (FIEMAP_EXTENT_SHARED), and there is at least one. */
static bool all_extents_shared(int fd) {
        struct {
                struct fiemap fm;
                struct fiemap_extent ext[64];
        } q;
        memset(&q, 0, sizeof q);
        q.fm.fm_length = FIEMAP_MAX_OFFSET;
        q.fm.fm_flags = FIEMAP_FLAG_SYNC;
        q.fm.fm_extent_count = 64;
        assert_int_equal(ioctl(fd, FS_IOC_FIEMAP, &q.fm), 0);
        if (q.fm.fm_mapped_extents == 0)
                return false;
        for (unsigned i = 0; i < q.fm.fm_mapped_extents; i++)
                if (!(q.ext[i].fe_flags & FIEMAP_EXTENT_SHARED))
                        return false;
        return true;
}

/* On a filesystem that shares blocks the copy is a clone; where it refuses
 * (the ext4 of most test hosts), the sparse copy above. RUNTIME_TEST_REFLINK_DIR
 * names a directory on XFS with reflink or btrfs for the first half. */
static void test_copy_clones_where_it_can(void **state) {
        char *d = tmpdir();
        int probe = io_clone_probe(d);
        assert_true(probe == 0 || probe == -EOPNOTSUPP || probe == -EXDEV || probe == -EINVAL);
        assert_int_equal(io_clone_probe("/nonexistent-dir-of-no-one"), -ENOENT);
        const char *rd = getenv("RUNTIME_TEST_REFLINK_DIR");
        if (!rd || !*rd) {
                print_message("RUNTIME_TEST_REFLINK_DIR unset: the clone half is not run\n");
                assert_int_equal(path_remove_tree_at(AT_FDCWD, d), 0);
                free(d);
                return;
        }
        assert_int_equal(io_clone_probe(rd), 0);
        char a[PATH_MAX], b[PATH_MAX];
        assert_true(snprintf(a, sizeof a, "%s/clone-in-%d", rd, (int)getpid()) < (int)sizeof a);
        assert_true(snprintf(b, sizeof b, "%s/clone-out-%d", rd, (int)getpid()) < (int)sizeof b);
        int in = open(a, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(in >= 0);
        static char chunk[1 << 20];
        memset(chunk, 'x', sizeof chunk);
        for (int i = 0; i < 8; i++)
                assert_int_equal(pwrite(in, chunk, sizeof chunk, (off_t)i << 20), (ssize_t)sizeof chunk);
        assert_int_equal(fsync(in), 0);
        int out = open(b, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(out >= 0);
        assert_int_equal(io_copy_sparse(in, out), 0);
        struct stat st;
        assert_int_equal(fstat(out, &st), 0);
        assert_int_equal(st.st_size, 8 << 20);
        assert_true(all_extents_shared(out));
        /* A write to the copy is its own: the source keeps its bytes. */
        assert_int_equal(pwrite(out, "copy", 4, 0), 4);
        char buf[4];
        assert_int_equal(pread(in, buf, 4, 0), 4);
        assert_memory_equal(buf, "xxxx", 4);
        assert_int_equal(pread(out, buf, 4, 0), 4);
        assert_memory_equal(buf, "copy", 4);
        close(in);
        close(out);
        unlink(a);
        unlink(b);
        assert_int_equal(path_remove_tree_at(AT_FDCWD, d), 0);
        free(d);
}

static void test_read_text(void **state) {
        char *d = tmpdir(), p[PATH_MAX], buf[8];
        assert_int_equal(path_join(p, sizeof p, d, "stamp"), 0);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "abc \n\n", 6), 6);
        close(fd);
        assert_int_equal(io_read_text(p, buf, sizeof buf), 0);
        assert_string_equal(buf, "abc");
        /* A longer file is cut at the buffer, always terminated. */
        assert_int_equal(io_read_text(p, buf, 3), 0);
        assert_string_equal(buf, "ab");
        assert_int_equal(io_read_text(p, buf, 0), -EINVAL);
        assert_int_equal(path_join(p, sizeof p, d, "missing"), 0);
        assert_int_equal(io_read_text(p, buf, sizeof buf), -ENOENT);
        assert_int_equal(path_remove_tree_at(AT_FDCWD, d), 0);
        free(d);
}

static void test_path_join(void **state) {
        char buf[8];
        assert_int_equal(path_join(buf, sizeof buf, "ab", "cd"), 0);
        assert_string_equal(buf, "ab/cd");
        assert_int_equal(path_join(buf, sizeof buf, "abcd", "efg"), -ENAMETOOLONG);
        assert_int_equal(path_join(buf, sizeof buf, "abc", "efg"), 0);
}

static void test_path_identity(void **state) {
        char *d = tmpdir(), p[PATH_MAX], a[PATH_IDENTITY_MAX], b[PATH_IDENTITY_MAX];
        assert_int_equal(path_join(p, sizeof p, d, "f"), 0);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(path_identity(p, a, sizeof a), 0);
        assert_int_equal(path_identity(p, b, sizeof b), 0);
        assert_string_equal(a, b);
        /* Another version of the file (its size) is another identity. */
        assert_int_equal(write(fd, "x", 1), 1);
        close(fd);
        assert_int_equal(path_identity(p, b, sizeof b), 0);
        assert_string_not_equal(a, b);
        assert_int_equal(path_identity(p, b, 4), -ENOBUFS);
        assert_int_equal(path_join(p, sizeof p, d, "missing"), 0);
        assert_int_equal(path_identity(p, b, sizeof b), -ENOENT);
        assert_int_equal(path_remove_tree_at(AT_FDCWD, d), 0);
        free(d);
}

static void test_write_text_at(void **state) {
        char *d = tmpdir(), buf[16];
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(dfd >= 0);
        assert_int_equal(io_write_text_at(dfd, "k", "first", true, 0600), 0);
        /* O_EXCL: never over a file already there; else the file is replaced whole. */
        assert_int_equal(io_write_text_at(dfd, "k", "x", true, 0600), -EEXIST);
        assert_int_equal(io_write_text_at(dfd, "k", "two", false, 0600), 0);
        char p[PATH_MAX];
        assert_int_equal(path_join(p, sizeof p, d, "k"), 0);
        assert_int_equal(io_read_text(p, buf, sizeof buf), 0);
        assert_string_equal(buf, "two");
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0600);
        /* A symbolic link in its place is not followed. */
        assert_int_equal(symlinkat("k", dfd, "l"), 0);
        assert_int_equal(io_write_text_at(dfd, "l", "x", false, 0600), -ELOOP);
        close(dfd);
        assert_int_equal(path_remove_tree_at(AT_FDCWD, d), 0);
        free(d);
}

static void test_self_dir(void **state) {
        char dir[PATH_MAX], exe[PATH_MAX];
        assert_int_equal(path_self_dir(dir, sizeof dir), 0);
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        assert_true(n > 0);
        exe[n] = '\0';
        size_t len = strlen(dir);
        assert_memory_equal(dir, exe, len);
        assert_int_equal(exe[len], '/');
        assert_null(strchr(exe + len + 1, '/'));
        /* Too small a buffer is refused, never cut short. */
        assert_int_equal(path_self_dir(dir, 4), -ENAMETOOLONG);
}

static void write_file(int dfd, const char *name) {
        int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "x", 1), 1);
        close(fd);
}

static void test_remove_tree(void **state) {
        char *d = tmpdir(), *outside = tmpdir(), p[PATH_MAX];
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(dfd >= 0);
        assert_int_equal(mkdirat(dfd, "t", 0700), 0);
        assert_int_equal(mkdirat(dfd, "t/a", 0700), 0);
        assert_int_equal(mkdirat(dfd, "t/a/b", 0700), 0);
        write_file(dfd, "t/f");
        write_file(dfd, "t/a/b/g");
        /* Links inside lead out: what they lead to must survive. */
        int ofd = open(outside, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        write_file(ofd, "keep");
        assert_int_equal(symlinkat(outside, dfd, "t/a/to-dir"), 0);
        assert_int_equal(path_join(p, sizeof p, outside, "keep"), 0);
        assert_int_equal(symlinkat(p, dfd, "t/to-file"), 0);
        /* A directory that is itself a link is removed as a link. */
        assert_int_equal(symlinkat(outside, dfd, "link-to-dir"), 0);
        assert_int_equal(path_remove_tree_at(dfd, "link-to-dir"), 0);
        assert_int_equal(path_remove_tree_at(dfd, "t"), 0);
        struct stat st;
        assert_int_equal(fstatat(dfd, "t", &st, AT_SYMLINK_NOFOLLOW), -1);
        assert_int_equal(errno, ENOENT);
        assert_int_equal(fstatat(ofd, "keep", &st, 0), 0);
        /* Missing is done; a single file is removed too. */
        assert_int_equal(path_remove_tree_at(dfd, "t"), 0);
        write_file(dfd, "plain");
        assert_int_equal(path_remove_tree_at(dfd, "plain"), 0);
        assert_int_equal(fstatat(dfd, "plain", &st, 0), -1);
        /* Nesting past the bound is refused, not recursed without end. */
        assert_int_equal(mkdirat(dfd, "deep", 0700), 0);
        int cur = openat(dfd, "deep", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        for (int i = 0; i < 300; i++) {
                assert_int_equal(mkdirat(cur, "d", 0700), 0);
                int next = openat(cur, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                assert_true(next >= 0);
                close(cur);
                cur = next;
        }
        close(cur);
        assert_int_equal(path_remove_tree_at(dfd, "deep"), -ELOOP);
        close(dfd);
        close(ofd);
        /* What is left (the deep tree) goes with a shell's help. */
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
        assert_int_equal(system(cmd), 0);
        assert_int_equal(path_remove_tree_at(AT_FDCWD, outside), 0);
        free(d);
        free(outside);
}

/* The files API's choices: count what goes, stop at the first failure or go
 * on past it, and answer with the errors asked for. */
static void make_tree_with_deep_branch(int dfd) {
        assert_int_equal(mkdirat(dfd, "t", 0700), 0);
        assert_int_equal(mkdirat(dfd, "t/deep", 0700), 0);
        assert_int_equal(mkdirat(dfd, "t/deep/a", 0700), 0);
        assert_int_equal(mkdirat(dfd, "t/deep/a/b", 0700), 0);
        for (int i = 0; i < 20; i++) {
                char name[16];
                snprintf(name, sizeof name, "t/f%02d", i);
                write_file(dfd, name);
        }
}

static unsigned count_entries(int dfd, const char *name) {
        int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(fd >= 0);
        DIR *dir = fdopendir(fd);
        assert_non_null(dir);
        unsigned n = 0;
        for (struct dirent *de; (de = readdir(dir));)
                n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
        closedir(dir);
        return n;
}

static void test_remove_tree_options(void **state) {
        char *d = tmpdir();
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(dfd >= 0);
        PathRemove bad = { .max_depth = 0, .mount_error = -EXDEV, .depth_error = -E2BIG };
        assert_int_equal(path_remove_tree(dfd, "t", &bad), -EINVAL);
        /* Within the bound: everything, counted (directories too). */
        make_tree_with_deep_branch(dfd);
        PathRemove all = { .max_depth = 8, .mount_error = -EXDEV, .depth_error = -E2BIG, .stop_at_first_error = true };
        assert_int_equal(path_remove_tree(dfd, "t", &all), 0);
        assert_int_equal(all.removed, 24);
        /* A branch past the bound: going on removes every file beside it and
         * answers the bound's error; the branch stays. */
        make_tree_with_deep_branch(dfd);
        PathRemove go_on = { .max_depth = 2, .mount_error = -EBUSY, .depth_error = -ELOOP };
        assert_int_equal(path_remove_tree(dfd, "t", &go_on), -ELOOP);
        assert_int_equal(go_on.removed, 20);
        assert_int_equal(count_entries(dfd, "t"), 1);
        assert_int_equal(path_remove_tree_at(dfd, "t"), 0);
        /* Stopping at it leaves what came after it in the directory's order. */
        make_tree_with_deep_branch(dfd);
        PathRemove stop = { .max_depth = 2, .mount_error = -EXDEV, .depth_error = -E2BIG, .stop_at_first_error = true };
        assert_int_equal(path_remove_tree(dfd, "t", &stop), -E2BIG);
        assert_true(stop.removed <= 20);
        assert_int_equal(count_entries(dfd, "t"), 21 - stop.removed);
        assert_int_equal(path_remove_tree_at(dfd, "t"), 0);
        close(dfd);
        assert_int_equal(path_remove_tree_at(AT_FDCWD, d), 0);
        free(d);
}

static void test_mkdir_private(void **state) {
        mode_t old = umask(0022);
        char base[] = "/tmp/runtime-mkdir-XXXXXX";
        assert_non_null(mkdtemp(base));
        char deep[PATH_MAX], file[PATH_MAX];
        snprintf(deep, sizeof deep, "%s/a/b/c", base);
        assert_int_equal(path_mkdir_private(deep), 0);
        struct stat st;
        assert_int_equal(stat(deep, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0700);
        char mid[PATH_MAX];
        snprintf(mid, sizeof mid, "%s/a/b", base);
        assert_int_equal(stat(mid, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0755 & ~(mode_t)0022);
        /* Again: nothing to do. Through a file: ENOTDIR. */
        assert_int_equal(path_mkdir_private(deep), 0);
        snprintf(file, sizeof file, "%s/f", base);
        int fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        close(fd);
        snprintf(deep, sizeof deep, "%s/f/x", base);
        assert_int_equal(path_mkdir_private(deep), -ENOTDIR);
        assert_int_equal(path_remove_tree_at(AT_FDCWD, base), 0);
        umask(old);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_mono_deadline),     cmocka_unit_test(test_cond_mono_times_out),
                cmocka_unit_test(test_write_all_pipe),    cmocka_unit_test(test_send_all_peer_gone),
                cmocka_unit_test(test_copy_sparse), cmocka_unit_test(test_copy_clones_where_it_can),       cmocka_unit_test(test_read_text),
                cmocka_unit_test(test_path_join),          cmocka_unit_test(test_read_full_short_reads_and_cap),
                cmocka_unit_test(test_remove_tree),       cmocka_unit_test(test_remove_tree_options),       cmocka_unit_test(test_self_dir),
                cmocka_unit_test(test_path_identity), cmocka_unit_test(test_mkdir_private),         cmocka_unit_test(test_write_text_at),
        };
        return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
