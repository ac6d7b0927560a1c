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
#include "common/macro.h"

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

/* The relative paths of a listing, one string "a|a/x|b" to compare whole. */
static char *rel_paths(json_t *entries, const char *base) {
        static char out[8192];
        size_t o = 0, n = strlen(base);
        out[0] = '\0';
        size_t i;
        json_t *e;
        json_array_foreach(entries, i, e) {
                const char *p = json_string_value(json_object_get(e, "path"));
                assert_non_null(p);
                assert_true(strncmp(p, base, n) == 0 && p[n] == '/');
                o += (size_t)snprintf(out + o, sizeof out - o, "%s%s", i ? "|" : "", p + n + 1);
                assert_true(o < sizeof out);
        }
        return out;
}

static void test_list_sorted(void **state) {
        Dir *d = *state;
        assert_int_equal(mkdir(at(d, "s"), 0755), 0);
        /* Made in an order that is not the names' order: tmpfs lists the
         * newest first, ext4 by hash. Bytewise: upper case before lower,
         * '-' and '.' before '/', UTF-8 after ASCII. */
        static const char *const made[] = { "b", "\xc3\xa9t\xc3\xa9", "a-b", "Z9", "a.b", "_x", "Z10", "B" };
        for (size_t i = 0; i < ELEMENTSOF(made); i++) {
                char rel[64];
                snprintf(rel, sizeof rel, "s/%s", made[i]);
                touch(at(d, rel), "");
        }
        assert_int_equal(fsops_mkdir_p(at(d, "s/a/z"), 0755), 0);
        touch(at(d, "s/a/y"), "");
        touch(at(d, "s/a/Y"), "");
        json_t *entries = NULL;
        bool truncated = true;
        assert_int_equal(list(at(d, "s"), 1, &entries, &truncated), 0);
        assert_false(truncated);
        assert_string_equal(rel_paths(entries, at(d, "s")), "B|Z10|Z9|_x|a|a-b|a.b|b|\xc3\xa9t\xc3\xa9");
        json_decref(entries);
        /* Deeper: each directory followed by what it holds, in order. */
        assert_int_equal(list(at(d, "s"), 2, &entries, &truncated), 0);
        assert_string_equal(rel_paths(entries, at(d, "s")),
                            "B|Z10|Z9|_x|a|a/Y|a/y|a/z|a-b|a.b|b|\xc3\xa9t\xc3\xa9");
        json_decref(entries);
        /* A limit cuts the ordered listing: its start, whatever the
         * directory's own order. */
        FsListOptions o = { .path = at(d, "s"), .depth = 2, .hidden = true, .limit = 6 };
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_true(truncated);
        assert_string_equal(rel_paths(entries, at(d, "s")), "B|Z10|Z9|_x|a|a/Y");
        json_decref(entries);
        o.glob = "**/[a-z]*";
        o.limit = 100;
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_false(truncated);
        assert_string_equal(rel_paths(entries, at(d, "s")), "a|a/y|a/z|a-b|a.b|b");
        json_decref(entries);
}

static void test_list_sorted_many(void **state) {
        Dir *d = *state;
        assert_int_equal(mkdir(at(d, "m"), 0755), 0);
        /* Made last to first: the directory's order is the reverse one on
         * tmpfs, and the first ten by name are the last ten made. */
        for (int i = 2999; i >= 0; i--) {
                char rel[64];
                snprintf(rel, sizeof rel, "m/n%04d", i);
                touch(at(d, rel), "");
        }
        json_t *entries = NULL;
        bool truncated = false;
        FsListOptions o = { .path = at(d, "m"), .depth = 1, .hidden = true, .limit = 10 };
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_true(truncated);
        assert_string_equal(rel_paths(entries, at(d, "m")),
                            "n0000|n0001|n0002|n0003|n0004|n0005|n0006|n0007|n0008|n0009");
        json_decref(entries);
        o.limit = FSOPS_MAX_LIST_ENTRIES;
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_false(truncated);
        assert_int_equal(json_array_size(entries), 3000);
        for (size_t i = 1; i < json_array_size(entries); i++) {
                json_t *prev = json_object_get(json_array_get(entries, i - 1), "name");
                json_t *cur = json_object_get(json_array_get(entries, i), "name");
                assert_true(strcmp(json_string_value(prev), json_string_value(cur)) < 0);
        }
        json_decref(entries);
}

static void test_list_directory_bound(void **state) {
        Dir *d = *state;
        /* More directories than one directory may keep, each a way down for
         * the glob: the first FSOPS_MAX_DIR_NAMES by name are walked, then
         * the listing stops, truncated, without the match past them. */
        assert_int_equal(mkdir(at(d, "w"), 0755), 0);
        for (int i = 0; i < FSOPS_MAX_DIR_NAMES + 3; i++) {
                char rel[64];
                snprintf(rel, sizeof rel, "w/d%05d", i);
                assert_int_equal(mkdir(at(d, rel), 0755), 0);
        }
        touch(at(d, "w/d00003/x"), "");
        char last[64];
        snprintf(last, sizeof last, "w/d%05d/x", FSOPS_MAX_DIR_NAMES + 2);
        touch(at(d, last), "");
        json_t *entries = NULL;
        bool truncated = false;
        FsListOptions o = { .path = at(d, "w"), .glob = "*/x", .hidden = true, .limit = 100 };
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_true(truncated);
        assert_string_equal(rel_paths(entries, at(d, "w")), "d00003/x");
        json_decref(entries);
}

static void test_user_names(void **state) {
        (void)state;
        static const char text[] =
                "root:x:0:0:root:/root:/bin/sh\n"
                "-bad:x:1:1::/:\n"                         /* a leading '-' */
                "has space:x:2:2::/:\n"
                "caf\xc3\xa9:x:3:3::/:\n"                  /* not ASCII */
                "ctl\x01:x:4:4::/:\n"
                "quote\":x:5:5::/:\n"
                "abcdefghijklmnopqrstuvwxyz0123456:x:6:6::/:\n" /* 33 bytes */
                "abcdefghijklmnopqrstuvwxyz012345:x:7:7::/:\n"  /* 32 bytes */
                "host$:x:8:8::/:\n"
                "mid$dle:x:9:9::/:\n"
                "first:x:10:10::/:\n"
                "second:x:10:10::/:\n"
                "nobody:x:65534:65534::/:\n"
                "big:x:4294967295:1::/:\n"
                "huge:x:4294967296:1::/:\n"
                "neg:x:-1:1::/:\n"
                "empty:x::1::/:\n"
                ":x:11:11::/:\n"
                "short:x\n"
                "+nis:x:12:12::/:\n"
                "Mixed.Case_1-2:x:13:13::/:\n"
                "last:x:14"; /* no newline at the end, no more fields */
        UserNames *n = NULL;
        assert_int_equal(user_names_parse(text, sizeof text - 1, &n), 0);
        char buf[USER_ID_TEXT_MAX];
        static const struct {
                uint32_t id;
                const char *want;
        } cases[] = {
                { 0, "root" },   { 1, "1" },
                { 2, "2" },      { 3, "3" },
                { 4, "4" },      { 5, "5" },
                { 6, "6" },      { 7, "abcdefghijklmnopqrstuvwxyz012345" },
                { 8, "host$" },  { 9, "9" },
                { 10, "first" }, { 11, "11" },
                { 12, "12" },    { 13, "Mixed.Case_1-2" },
                { 14, "last" },  { 65534, "nobody" },
                { UINT32_MAX, "big" }, { 424242, "424242" },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++)
                assert_string_equal(user_names_get(n, cases[i].id, buf), cases[i].want);
        user_names_free(n);
        assert_string_equal(user_names_get(NULL, 1000, buf), "1000");
        assert_int_equal(user_names_parse("", 0, &n), 0);
        assert_string_equal(user_names_get(n, 0, buf), "0");
        user_names_free(n);
        /* A file that is not there gives numbers, not an error. */
        assert_int_equal(user_names_load("/nonexistent/passwd", &n), 0);
        assert_string_equal(user_names_get(n, 0, buf), "0");
        user_names_free(n);
}

static void test_owner_and_group(void **state) {
        Dir *d = *state;
        touch(at(d, "mine"), "");
        char passwd[256], group[256];
        snprintf(passwd, sizeof passwd, "bad name:x:%u:0::/:\nme:x:%u:0::/:\n", (unsigned)geteuid(),
                 (unsigned)geteuid());
        snprintf(group, sizeof group, "grp:x:%u:\n", (unsigned)getegid());
        FsNames names = { 0 };
        assert_int_equal(user_names_parse(passwd, strlen(passwd), &names.users), 0);
        assert_int_equal(user_names_parse(group, strlen(group), &names.groups), 0);
        json_t *e = NULL;
        assert_int_equal(fsops_stat(at(d, "mine"), &names, &e), 0);
        assert_string_equal(json_string_value(json_object_get(e, "owner")), "me");
        assert_string_equal(json_string_value(json_object_get(e, "group")), "grp");
        json_decref(e);
        json_t *entries = NULL;
        bool truncated;
        FsListOptions o = { .path = d->path, .depth = 1, .hidden = true, .limit = 10, .names = &names };
        assert_int_equal(fsops_list(&o, &entries, &truncated), 0);
        assert_int_equal(json_array_size(entries), 1);
        assert_string_equal(json_string_value(json_object_get(json_array_get(entries, 0), "owner")), "me");
        assert_string_equal(json_string_value(json_object_get(json_array_get(entries, 0), "group")), "grp");
        json_decref(entries);
        fsops_names_done(&names);
        /* Without names: the numbers, as text. */
        char uid[16], gid[16];
        snprintf(uid, sizeof uid, "%u", (unsigned)geteuid());
        snprintf(gid, sizeof gid, "%u", (unsigned)getegid());
        assert_int_equal(fsops_stat(at(d, "mine"), NULL, &e), 0);
        assert_string_equal(json_string_value(json_object_get(e, "owner")), uid);
        assert_string_equal(json_string_value(json_object_get(e, "group")), gid);
        json_decref(e);
}

static void test_symlink_target_type(void **state) {
        Dir *d = *state;
        touch(at(d, "file"), "abc");
        assert_int_equal(mkdir(at(d, "dir"), 0755), 0);
        assert_int_equal(mkfifo(at(d, "fifo"), 0644), 0);
        assert_int_equal(symlink("file", at(d, "to-file")), 0);
        assert_int_equal(symlink(at(d, "dir"), at(d, "to-dir")), 0);
        assert_int_equal(symlink("fifo", at(d, "to-fifo")), 0);
        assert_int_equal(symlink("nothing", at(d, "dangling")), 0);
        assert_int_equal(symlink("loop-b", at(d, "loop-a")), 0);
        assert_int_equal(symlink("loop-a", at(d, "loop-b")), 0);
        assert_int_equal(symlink("to-file", at(d, "chain")), 0);
        static const struct {
                const char *name, *target_type; /* NULL: null */
        } cases[] = {
                { "to-file", "file" }, { "to-dir", "dir" },   { "to-fifo", "other" }, { "dangling", NULL },
                { "loop-a", NULL },    { "loop-b", NULL },    { "chain", "file" },
        };
        json_t *entries = NULL;
        bool truncated;
        assert_int_equal(list(d->path, 1, &entries, &truncated), 0);
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                json_t *e = NULL;
                assert_int_equal(fsops_stat(at(d, cases[i].name), NULL, &e), 0);
                json_t *listed = NULL;
                size_t k;
                json_t *x;
                json_array_foreach(entries, k, x)
                        if (strcmp(json_string_value(json_object_get(x, "name")), cases[i].name) == 0)
                                listed = x;
                assert_non_null(listed);
                json_t *both[2] = { e, listed };
                for (size_t j = 0; j < 2; j++) {
                        assert_string_equal(json_string_value(json_object_get(both[j], "type")), "symlink");
                        json_t *tt = json_object_get(both[j], "targetType");
                        assert_non_null(tt);
                        if (cases[i].target_type)
                                assert_string_equal(json_string_value(tt), cases[i].target_type);
                        else
                                assert_true(json_is_null(tt));
                }
                json_decref(e);
        }
        /* A file is no link: no target, no targetType. */
        json_t *e = NULL;
        assert_int_equal(fsops_stat(at(d, "file"), NULL, &e), 0);
        assert_null(json_object_get(e, "targetType"));
        assert_null(json_object_get(e, "target"));
        json_decref(e);
        json_decref(entries);
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
        assert_int_equal(fsops_stat(at(d, "f"), NULL, &e), 0);
        assert_string_equal(json_string_value(json_object_get(e, "type")), "file");
        assert_int_equal(json_integer_value(json_object_get(e, "size")), 5);
        const char *mtime = json_string_value(json_object_get(e, "mtime"));
        assert_non_null(mtime);
        assert_int_equal(strlen(mtime), 20); /* 2026-11-30T09:00:00Z */
        json_decref(e);
        assert_int_equal(fsops_stat(at(d, "fifo"), NULL, &e), 0);
        assert_string_equal(json_string_value(json_object_get(e, "type")), "other");
        json_decref(e);
        assert_int_equal(fsops_stat("/", NULL, &e), 0);
        assert_string_equal(json_string_value(json_object_get(e, "type")), "dir");
        json_decref(e);
        assert_int_equal(fsops_stat(at(d, "f/x"), NULL, &e), -ENOTDIR);
        assert_int_equal(fsops_stat(at(d, "missing"), NULL, &e), -ENOENT);
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
                cmocka_unit_test_setup_teardown(test_list_sorted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_list_sorted_many, setup, teardown),
                cmocka_unit_test_setup_teardown(test_list_directory_bound, setup, teardown),
                cmocka_unit_test(test_user_names),
                cmocka_unit_test_setup_teardown(test_owner_and_group, setup, teardown),
                cmocka_unit_test_setup_teardown(test_symlink_target_type, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
