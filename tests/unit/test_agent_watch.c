/* The agent's file watches (src/agent/watch.c) on a directory of the test's
 * own: the changes as lines, a recursive watch following a new directory,
 * the descriptors' bound reported, a link refused, the root's end. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

#include "agent/watch.h"

typedef struct Fixture {
        char dir[64];
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        snprintf(f->dir, sizeof f->dir, "/tmp/agent-watch-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
        int r = system(cmd);
        free(f);
        return r == 0 ? 0 : -1;
}

/* Every line the watch has within a second, joined. */
static void read_all(AgentWatch *w, char *out, size_t cap, WatchEnd *ret_end) {
        static char buf[4 * WATCH_MAX_LINE];
        size_t at = 0;
        *ret_end = WATCH_RUNNING;
        for (int i = 0; i < 10; i++) {
                struct pollfd p = { .fd = agent_watch_fd(w), .events = POLLIN };
                if (!agent_watch_pending(w) && poll(&p, 1, 100) <= 0)
                        continue;
                ssize_t n = agent_watch_read(w, buf, sizeof buf, ret_end);
                assert_true(n >= 0);
                assert_true(at + (size_t)n < cap);
                memcpy(out + at, buf, (size_t)n);
                at += (size_t)n;
                if (*ret_end != WATCH_RUNNING)
                        break;
        }
        out[at] = '\0';
}

static void touch(const char *dir, const char *name) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "x", 1), 1);
        close(fd);
}

static void test_changes_as_lines(void **state) {
        Fixture *f = *state;
        AgentWatch *w = NULL;
        assert_int_equal(agent_watch_open(f->dir, true, 0, -1, -1, &w), 0);
        char sub[128], lines[65536], want[256];
        snprintf(sub, sizeof sub, "%s/sub", f->dir);
        assert_int_equal(mkdir(sub, 0755), 0);
        WatchEnd end;
        read_all(w, lines, sizeof lines, &end);
        snprintf(want, sizeof want, "{\"e\":\"create\",\"p\":\"%s\",\"d\":true}\n", sub);
        assert_non_null(strstr(lines, want));
        /* The directory made after the watch began is watched too. */
        touch(sub, "a.txt");
        read_all(w, lines, sizeof lines, &end);
        snprintf(want, sizeof want, "{\"e\":\"create\",\"p\":\"%s/a.txt\",\"d\":false}\n", sub);
        assert_non_null(strstr(lines, want));
        snprintf(want, sizeof want, "{\"e\":\"write\",\"p\":\"%s/a.txt\",\"d\":false}\n", sub);
        assert_non_null(strstr(lines, want));
        /* The root's end ends the watch. */
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
        assert_int_equal(system(cmd), 0);
        read_all(w, lines, sizeof lines, &end);
        assert_int_equal(end, WATCH_ROOT_REMOVED);
        agent_watch_free(w);
        assert_int_equal(mkdir(f->dir, 0700), 0);
}

/* What a new directory holds before its descriptor is added (made in the
 * same breath as the directory) is reported too, after the directory, and
 * is watched. */
static void test_new_tree_reported_whole(void **state) {
        Fixture *f = *state;
        AgentWatch *w = NULL;
        assert_int_equal(agent_watch_open(f->dir, true, 0, -1, -1, &w), 0);
        char a[128], b[160], lines[65536], want[256];
        snprintf(a, sizeof a, "%s/a", f->dir);
        snprintf(b, sizeof b, "%s/a/b", f->dir);
        assert_int_equal(mkdir(a, 0755), 0);
        assert_int_equal(mkdir(b, 0755), 0);
        touch(b, "c.txt");
        touch(a, "d.txt");
        WatchEnd end;
        read_all(w, lines, sizeof lines, &end);
        snprintf(want, sizeof want, "{\"e\":\"create\",\"p\":\"%s\",\"d\":true}\n", a);
        const char *at_a = strstr(lines, want);
        assert_non_null(at_a);
        snprintf(want, sizeof want, "{\"e\":\"create\",\"p\":\"%s\",\"d\":true}\n", b);
        const char *at_b = strstr(lines, want);
        assert_non_null(at_b);
        assert_true(at_b > at_a);
        snprintf(want, sizeof want, "{\"e\":\"create\",\"p\":\"%s/c.txt\",\"d\":false}\n", b);
        assert_non_null(strstr(lines, want));
        snprintf(want, sizeof want, "{\"e\":\"create\",\"p\":\"%s/d.txt\",\"d\":false}\n", a);
        assert_non_null(strstr(lines, want));
        /* a/b found by the walk is watched from then on. */
        touch(b, "e.txt");
        read_all(w, lines, sizeof lines, &end);
        snprintf(want, sizeof want, "{\"e\":\"create\",\"p\":\"%s/e.txt\",\"d\":false}\n", b);
        assert_non_null(strstr(lines, want));
        agent_watch_free(w);
}

static void test_bound_reported_and_links_refused(void **state) {
        Fixture *f = *state;
        char p[128];
        for (int i = 0; i < 4; i++) {
                snprintf(p, sizeof p, "%s/d%d", f->dir, i);
                assert_int_equal(mkdir(p, 0755), 0);
        }
        AgentWatch *w = NULL;
        assert_int_equal(agent_watch_open(f->dir, true, 2, -1, -1, &w), 0);
        assert_true(agent_watch_pending(w));
        char lines[65536];
        WatchEnd end;
        read_all(w, lines, sizeof lines, &end);
        assert_non_null(strstr(lines, "{\"e\":\"limit\",\"watches\":2}\n"));
        agent_watch_free(w);
        snprintf(p, sizeof p, "%s/link", f->dir);
        assert_int_equal(symlink("/etc", p), 0);
        assert_int_equal(agent_watch_open(p, false, 0, -1, -1, &w), -ENOTDIR);
        snprintf(p, sizeof p, "%s/missing", f->dir);
        assert_int_equal(agent_watch_open(p, false, 0, -1, -1, &w), -ENOENT);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_changes_as_lines, setup, teardown),
                cmocka_unit_test_setup_teardown(test_new_tree_reported_whole, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bound_reported_and_links_refused, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
