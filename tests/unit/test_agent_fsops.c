/* The agent's file operations (src/agent/fsops.c) in a temporary directory. */
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

#include "agent/fsops.h"

typedef struct Dir {
        char path[PATH_MAX];
} Dir;

static int setup(void **state) {
        Dir *d = calloc(1, sizeof(Dir));
        /* A tmpfs where there is one: creating 10000 files on a virtual
         * disk takes seconds. */
        snprintf(d->path, sizeof d->path, "%s/runtime-test-fsops-XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        assert_non_null(mkdtemp(d->path));
        *state = d;
        return 0;
}

static int teardown(void **state) {
        Dir *d = *state;
        char cmd[2 * PATH_MAX + 64];
        snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s'; rm -rf '%s'", d->path, d->path);
        assert_int_equal(system(cmd), 0);
        free(d);
        return 0;
}

static char *at(Dir *d, const char *rel) {
        static char buf[4][PATH_MAX + 64];
        static int i;
        char *b = buf[i++ % 4];
        snprintf(b, sizeof buf[0], "%s/%s", d->path, rel);
        return b;
}

static void touch(const char *path, const char *content) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(content, f);
        fclose(f);
}

static void test_error_codes(void **state) {
        assert_string_equal(fsops_error_code(-ENOENT), "not_found");
        assert_string_equal(fsops_error_code(-EEXIST), "exists");
        assert_string_equal(fsops_error_code(-ENOTDIR), "not_a_directory");
        assert_string_equal(fsops_error_code(-EISDIR), "is_a_directory");
        assert_string_equal(fsops_error_code(-ENOTEMPTY), "not_empty");
        assert_string_equal(fsops_error_code(-EACCES), "permission_denied");
        assert_string_equal(fsops_error_code(-EROFS), "permission_denied");
        assert_string_equal(fsops_error_code(-ENOSPC), "no_space");
        assert_string_equal(fsops_error_code(-EFBIG), "too_large");
        assert_string_equal(fsops_error_code(-EINVAL), "invalid");
        assert_string_equal(fsops_error_code(-EBUSY), "busy");
        assert_string_equal(fsops_error_code(-EIO), "io");
}

/* A listing of everything below a directory, as the daemon asks for one. */
static int list(const char *path, unsigned depth, json_t **ret, bool *truncated) {
        FsListOptions o = { .path = path, .depth = depth, .hidden = true, .limit = FSOPS_MAX_LIST_ENTRIES };
        return fsops_list(&o, ret, truncated);
}

static void test_list_truncates(void **state) {
        Dir *d = *state;
        assert_int_equal(mkdir(at(d, "many"), 0755), 0);
        for (int i = 0; i < FSOPS_MAX_LIST_ENTRIES + 5; i++) {
                char name[64];
                snprintf(name, sizeof name, "many/f%05d", i);
                int fd = open(at(d, name), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
                assert_true(fd >= 0);
                close(fd);
        }
        json_t *entries = NULL;
        bool truncated = false;
        assert_int_equal(list(at(d, "many"), 1, &entries, &truncated), 0);
        assert_true(truncated);
        assert_int_equal(json_array_size(entries), FSOPS_MAX_LIST_ENTRIES);
        json_decref(entries);
}

static void test_list_depth_and_names(void **state) {
        Dir *d = *state;
        assert_int_equal(fsops_mkdir_p(at(d, "a/b/c/d"), 0755), 0);
        touch(at(d, "a/b/c/d/deep.txt"), "x");
        touch(at(d, "a/\xff\xfe-latin1"), "y");
        assert_int_equal(symlink("/", at(d, "a/root")), 0);
        json_t *entries = NULL;
        bool truncated = true;
        assert_int_equal(list(at(d, "a"), 1, &entries, &truncated), 0);
        assert_false(truncated);
        assert_int_equal(json_array_size(entries), 3); /* b, root, the odd name */
        bool saw_odd = false, saw_link = false;
        size_t i;
        json_t *e;
        json_array_foreach(entries, i, e) {
                const char *name = json_string_value(json_object_get(e, "name"));
                assert_non_null(name);
                if (strcmp(name, "\xef\xbf\xbd\xef\xbf\xbd-latin1") == 0)
                        saw_odd = true;
                if (strcmp(name, "root") == 0) {
                        saw_link = true;
                        assert_string_equal(json_string_value(json_object_get(e, "type")), "symlink");
                        assert_string_equal(json_string_value(json_object_get(e, "target")), "/");
                }
        }
        assert_true(saw_odd && saw_link);
        json_decref(entries);
        /* The symlink to / is never entered, whatever the depth. */
        assert_int_equal(list(at(d, "a"), 10, &entries, &truncated), 0);
        assert_int_equal(json_array_size(entries), 6); /* + b/c, b/c/d, deep.txt */
        json_decref(entries);
        assert_int_equal(list(at(d, "a/b/c/d/deep.txt"), 1, &entries, &truncated), -ENOTDIR);
        assert_int_equal(list(at(d, "nope"), 1, &entries, &truncated), -ENOENT);
}

static void test_glob_match(void **state) {
        (void)state;
        assert_int_equal(fsops_glob_match("*.py", "a.py"), 1);
        assert_int_equal(fsops_glob_match("*.py", "src/a.py"), 0);
        assert_int_equal(fsops_glob_match("**/*.py", "a.py"), 1);
        assert_int_equal(fsops_glob_match("**/*.py", "src/x/y/a.py"), 1);
        assert_int_equal(fsops_glob_match("src/**", "src/x/y"), 1);
        assert_int_equal(fsops_glob_match("src/*/y", "src/x/y"), 1);
        assert_int_equal(fsops_glob_match("src/*/y", "src/x/z/y"), 0);
        assert_int_equal(fsops_glob_match("./a/[bc]?", "a/bd"), 1);
        /* Many "**" cost a table, not backtracking: this returns at once. */
        assert_int_equal(fsops_glob_match("**/**/**/**/**/**/**/**/**/**/**/**/**/**/**/z",
                                          "a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/y"),
                         0);
        char many[FSOPS_MAX_GLOB_SEGMENTS * 2 + 8] = "";
        for (int i = 0; i <= FSOPS_MAX_GLOB_SEGMENTS; i++)
                strcat(many, "a/");
        assert_int_equal(fsops_glob_match(many, "a"), -EINVAL);
}

static void test_list_glob_hidden_limit(void **state) {
        Dir *d = *state;
        assert_int_equal(fsops_mkdir_p(at(d, "g/src/pkg"), 0755), 0);
        assert_int_equal(fsops_mkdir_p(at(d, "g/.git"), 0755), 0);
        touch(at(d, "g/top.py"), "");
        touch(at(d, "g/notes.txt"), "");
        touch(at(d, "g/src/a.py"), "");
        touch(at(d, "g/src/pkg/b.py"), "");
        touch(at(d, "g/.git/c.py"), "");
        touch(at(d, "g/.hidden.py"), "");
        json_t *entries = NULL;
        bool truncated = true;
        FsListOptions o = { .path = at(d, "g"), .glob = "**/*.py", .hidden = true, .limit = 100 };
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_false(truncated);
        assert_int_equal(json_array_size(entries), 5);
        json_decref(entries);
        o.hidden = false;
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_int_equal(json_array_size(entries), 3); /* top, src/a, src/pkg/b */
        json_decref(entries);
        o.glob = "*.py";
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_int_equal(json_array_size(entries), 1);
        assert_string_equal(json_string_value(json_object_get(json_array_get(entries, 0), "name")), "top.py");
        json_decref(entries);
        o.glob = "**/*.py";
        o.limit = 2;
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_true(truncated);
        assert_int_equal(json_array_size(entries), 2);
        json_decref(entries);
        /* A depth bounds a glob walk too. */
        o.limit = 100;
        o.depth = 2;
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_int_equal(json_array_size(entries), 2); /* top.py, src/a.py */
        json_decref(entries);
}

static void test_remove(void **state) {
        Dir *d = *state;
        assert_int_equal(fsops_mkdir_p(at(d, "keep/inner"), 0755), 0);
        touch(at(d, "keep/inner/precious"), "p");
        assert_int_equal(fsops_mkdir_p(at(d, "gone/x/y"), 0755), 0);
        touch(at(d, "gone/x/y/f"), "f");
        assert_int_equal(symlink(at(d, "keep"), at(d, "gone/link-to-keep")), 0);
        assert_int_equal(symlink(at(d, "keep/inner"), at(d, "gone/x/link2")), 0);

        uint64_t n = 99;
        assert_int_equal(fsops_remove(at(d, "gone"), false, &n), -ENOTEMPTY);
        assert_int_equal(fsops_remove(at(d, "gone"), true, &n), 0);
        assert_int_equal(n, 6); /* gone, x, y, f and the two links */
        struct stat st;
        assert_int_equal(lstat(at(d, "gone"), &st), -1);
        assert_int_equal(stat(at(d, "keep/inner/precious"), &st), 0);
        /* Nothing there is not an error: the answer says nothing went. */
        assert_int_equal(fsops_remove(at(d, "gone"), true, &n), 0);
        assert_int_equal(n, 0);
        assert_int_equal(fsops_remove(at(d, "gone/deeper/still"), false, &n), 0);
        assert_int_equal(n, 0);
        /* A symlink itself is removed, not its target. */
        assert_int_equal(symlink(at(d, "keep"), at(d, "l")), 0);
        assert_int_equal(fsops_remove(at(d, "l"), true, &n), 0);
        assert_int_equal(n, 1);
        assert_int_equal(stat(at(d, "keep/inner/precious"), &st), 0);
        assert_int_equal(fsops_remove("/", true, &n), -EINVAL);

        /* A tree deeper than the bound is refused, not a crash. */
        char rel[FSOPS_MAX_REMOVE_DEPTH * 2 + 16] = "deep";
        for (int i = 0; i < FSOPS_MAX_REMOVE_DEPTH + 4; i++)
                strcat(rel, "/d");
        assert_int_equal(fsops_mkdir_p(at(d, rel), 0755), 0);
        assert_int_equal(fsops_remove(at(d, "deep"), true, &n), -E2BIG);
}

static void test_write(void **state) {
        Dir *d = *state;
        mode_t old = umask(077);
        FsWrite *w = NULL;
        assert_int_equal(fsops_write_begin(at(d, "new/dir/file"), 0644, false, &w), -ENOENT);
        assert_int_equal(fsops_write_begin(at(d, "new/dir/file"), 0644, true, &w), 0);
        assert_int_equal(fsops_write_data(w, "hello ", 6), 0);
        assert_int_equal(fsops_write_data(w, "world", 5), 0);
        /* Nothing is visible until the commit. */
        struct stat st;
        assert_int_equal(stat(at(d, "new/dir/file"), &st), -1);
        uint64_t size = 0;
        assert_int_equal(fsops_write_commit(w, &size), 0);
        assert_int_equal(size, 11);
        assert_int_equal(stat(at(d, "new/dir/file"), &st), 0);
        assert_int_equal(st.st_mode & 07777, 0644); /* not narrowed by the umask */
        umask(old);

        /* An aborted write leaves the old content and no temporary file. */
        assert_int_equal(fsops_write_begin(at(d, "new/dir/file"), 0600, false, &w), 0);
        assert_int_equal(fsops_write_data(w, "junk", 4), 0);
        fsops_write_abort(w);
        fsops_write_abort(NULL);
        json_t *entries;
        bool truncated;
        assert_int_equal(list(at(d, "new/dir"), 1, &entries, &truncated), 0);
        assert_int_equal(json_array_size(entries), 1);
        json_decref(entries);
        char buf[32] = "";
        FILE *f = fopen(at(d, "new/dir/file"), "r");
        assert_non_null(fgets(buf, sizeof buf, f));
        fclose(f);
        assert_string_equal(buf, "hello world");

        assert_int_equal(fsops_write_begin(at(d, "new/dir"), 0644, false, &w), -EISDIR);
        assert_int_equal(fsops_write_begin(at(d, "new/dir/file/x"), 0644, true, &w), -ENOTDIR);
}

static void test_read_and_stat(void **state) {
        Dir *d = *state;
        touch(at(d, "f"), "12345");
        int fd;
        struct stat st;
        assert_int_equal(fsops_open_read(at(d, "f"), &fd, &st), 0);
        assert_int_equal(st.st_size, 5);
        close(fd);
        assert_int_equal(fsops_open_read(d->path, &fd, &st), -EISDIR);
        /* A FIFO is refused without blocking on the open. */
        assert_int_equal(mkfifo(at(d, "fifo"), 0644), 0);
        assert_int_equal(fsops_open_read(at(d, "fifo"), &fd, &st), -EINVAL);

        json_t *e = NULL;
        assert_int_equal(fsops_stat(at(d, "f"), &e), 0);
        assert_string_equal(json_string_value(json_object_get(e, "type")), "file");
        assert_int_equal(json_integer_value(json_object_get(e, "size")), 5);
        const char *mtime = json_string_value(json_object_get(e, "mtime"));
        assert_non_null(mtime);
        assert_int_equal(strlen(mtime), 20); /* 2026-11-30T09:00:00Z */
        json_decref(e);
        assert_int_equal(fsops_stat(at(d, "fifo"), &e), 0);
        assert_string_equal(json_string_value(json_object_get(e, "type")), "other");
        json_decref(e);
        assert_int_equal(fsops_stat("/", &e), 0);
        assert_string_equal(json_string_value(json_object_get(e, "type")), "dir");
        json_decref(e);
        assert_int_equal(fsops_stat(at(d, "f/x"), &e), -ENOTDIR);
        assert_int_equal(fsops_stat(at(d, "missing"), &e), -ENOENT);
}

static void test_mkdir_rename(void **state) {
        Dir *d = *state;
        assert_int_equal(fsops_mkdir(at(d, "m/n"), false), -ENOENT);
        assert_int_equal(fsops_mkdir(at(d, "m/n"), true), 0);
        assert_int_equal(fsops_mkdir(at(d, "m/n"), true), 0);
        assert_int_equal(fsops_mkdir(at(d, "m/n"), false), -EEXIST);
        assert_int_equal(fsops_mkdir(at(d, "m/n/"), false), -EEXIST);
        touch(at(d, "m/file"), "");
        assert_int_equal(fsops_mkdir(at(d, "m/file"), true), -EEXIST);
        assert_int_equal(fsops_mkdir("/", false), -EEXIST);

        assert_int_equal(fsops_rename(at(d, "m/file"), at(d, "m/n/moved"), false), 0);
        struct stat st;
        assert_int_equal(stat(at(d, "m/n/moved"), &st), 0);
        assert_int_equal(fsops_rename(at(d, "m/file"), at(d, "m/x"), true), -ENOENT);
        /* Without overwrite an existing target stays; with it, it is replaced. */
        touch(at(d, "m/a"), "a");
        touch(at(d, "m/b"), "b");
        assert_int_equal(fsops_rename(at(d, "m/a"), at(d, "m/b"), false), -EEXIST);
        assert_int_equal(stat(at(d, "m/a"), &st), 0);
        assert_int_equal(fsops_rename(at(d, "m/a"), at(d, "m/b"), true), 0);
        assert_int_equal(stat(at(d, "m/a"), &st), -1);
        assert_int_equal(fsops_mkdir(at(d, "other"), false), 0);
        assert_int_equal(fsops_rename(at(d, "other"), at(d, "m"), true), -ENOTEMPTY);
        assert_int_equal(fsops_rename(at(d, "m/.."), at(d, "z"), true), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_error_codes),
                cmocka_unit_test_setup_teardown(test_list_truncates, setup, teardown),
                cmocka_unit_test_setup_teardown(test_list_depth_and_names, setup, teardown),
                cmocka_unit_test(test_glob_match),
                cmocka_unit_test_setup_teardown(test_list_glob_hidden_limit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_and_stat, setup, teardown),
                cmocka_unit_test_setup_teardown(test_mkdir_rename, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
