/* The agent's own protection and its memory watch (src/agent/limits.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/agent.h"
#include "agent/limits.h"

static int status_of(int how) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                if (how < 0)
                        raise(-how);
                _exit(how);
        }
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        return st;
}

/* Only a SIGKILL that the agent did not send, with the kernel's count of
 * OOM kills gone up since the start, is an OOM kill. */
/* --cgroup-fds: a list of open fds, each marked close-on-exec; a child
 * writes "0" (itself) to each before it execs. */
/* The memory watch's next look: at once near the limit, no later than a
 * fill at AGENT_MEMORY_FILL_BYTES_PER_S could reach it, at most a second. */
static void test_memory_look_ms(void **state) {
        (void)state;
        assert_int_equal(agent_memory_look_ms(0), AGENT_MEMORY_POLL_MS);
        assert_int_equal(agent_memory_look_ms(64ull << 20), AGENT_MEMORY_POLL_MS);   /* 15 ms of filling */
        assert_int_equal(agent_memory_look_ms(1ull << 30), 250);                   /* a GiB: a quarter second */
        assert_int_equal(agent_memory_look_ms(16ull << 30), AGENT_MEMORY_IDLE_POLL_MS);
        assert_int_equal(agent_memory_look_ms(UINT64_MAX), AGENT_MEMORY_IDLE_POLL_MS);
        for (uint64_t free = 0; free < (8ull << 30); free += 7ull << 20) {
                uint64_t ms = agent_memory_look_ms(free);
                assert_true(ms >= AGENT_MEMORY_POLL_MS && ms <= AGENT_MEMORY_IDLE_POLL_MS);
                /* Never later than the fill could take the free memory. */
                assert_true(ms == AGENT_MEMORY_POLL_MS || ms * (AGENT_MEMORY_FILL_BYTES_PER_S / 1000) <= free);
        }
}

static void test_child_cgroup_fds(void **state) {
        (void)state;
        assert_int_equal(limits_set_child_cgroup_fds(""), -EINVAL);
        assert_int_equal(limits_set_child_cgroup_fds("x"), -EINVAL);
        assert_int_equal(limits_set_child_cgroup_fds("2"), -EINVAL);      /* stdio */
        assert_int_equal(limits_set_child_cgroup_fds("1048577"), -EINVAL); /* past the bound */
        /* A daemon with a few hundred sandboxes numbers its fds past 1023. */
        assert_int_equal(limits_set_child_cgroup_fds("1024"), -EBADF);    /* taken, not open */
        assert_int_equal(limits_set_child_cgroup_fds("1048576"), -EBADF);
        assert_int_equal(limits_set_child_cgroup_fds("99999999999999999999"), -EINVAL);
        assert_int_equal(limits_set_child_cgroup_fds("1000"), -EBADF);    /* not open */

        int a[2], b[2];
        assert_int_equal(pipe(a), 0);
        assert_int_equal(pipe(b), 0);
        char list[32];
        snprintf(list, sizeof list, "%d,,%d", a[1], b[1]);
        assert_int_equal(limits_set_child_cgroup_fds(list), -EINVAL);
        snprintf(list, sizeof list, "%d,", a[1]);
        assert_int_equal(limits_set_child_cgroup_fds(list), -EINVAL);
        char many[256] = "";
        for (int i = 0; i <= LIMITS_CGROUP_FDS_MAX; i++)
                snprintf(many + strlen(many), sizeof many - strlen(many), "%s%d", i ? "," : "", a[1]);
        assert_int_equal(limits_set_child_cgroup_fds(many), -EINVAL);
        snprintf(list, sizeof list, "%d,%d", a[1], b[1]);
        assert_int_equal(limits_set_child_cgroup_fds(list), 0);
        assert_true(fcntl(a[1], F_GETFD) & FD_CLOEXEC);
        assert_true(fcntl(b[1], F_GETFD) & FD_CLOEXEC);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                limits_child_defaults();
                _exit(0);
        }
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        char c[4] = "";
        assert_int_equal(read(a[0], c, sizeof c), 1);
        assert_int_equal(c[0], '0');
        assert_int_equal(read(b[0], c, sizeof c), 1);
        assert_int_equal(c[0], '0');

        /* A join that fails: the child does not go on to exec. */
        close(b[0]);
        signal(SIGPIPE, SIG_IGN);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                limits_child_defaults();
                _exit(0);
        }
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 126);
        close(a[0]);
        close(a[1]);
        close(b[1]);
}

/* What the sudo gateway keeps when it closes the rest: the join files (its
 * commands still join the work leaf: they wrote to closed ones and exited
 * 126 before) and its own socket. */
static void test_close_keeping_cgroup_fds(void **state) {
        (void)state;
        int a[2], b[2], other = open("/dev/null", O_RDONLY | O_CLOEXEC), mine = open("/dev/null", O_RDONLY);
        assert_int_equal(pipe(a), 0);
        assert_int_equal(pipe(b), 0);
        assert_true(other >= 0 && mine >= 0);
        char list[32];
        /* Out of order, as the daemon may pass them. */
        snprintf(list, sizeof list, "%d,%d", b[1], a[1]);
        assert_int_equal(limits_set_child_cgroup_fds(list), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                limits_close_fds_keeping_cgroup(3, mine);
                int bad = fcntl(a[1], F_GETFD) < 0 || fcntl(b[1], F_GETFD) < 0 || fcntl(mine, F_GETFD) < 0 ||
                          fcntl(other, F_GETFD) >= 0 || fcntl(a[0], F_GETFD) >= 0 || fcntl(b[0], F_GETFD) >= 0;
                if (bad)
                        _exit(2);
                limits_child_defaults();
                _exit(0);
        }
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        char c[4] = "";
        assert_int_equal(read(a[0], c, sizeof c), 1);
        assert_int_equal(read(b[0], c, sizeof c), 1);
        close(a[0]);
        close(a[1]);
        close(b[0]);
        close(b[1]);
        close(other);
        close(mine);
}

static void test_was_oom_kill(void **state) {
        uint64_t now = limits_oom_kills();
        if (now == UINT64_MAX)
                skip();
        int killed = status_of(-SIGKILL), exited = status_of(137), term = status_of(-SIGTERM);
        assert_false(limits_was_oom_kill(killed, false, now)); /* count did not move */
        /* A count that went up by one since `before`: on a host that never
         * OOM-killed anything (a count of 0) there is no earlier count to
         * give (0 - 1 is the "unreadable" UINT64_MAX). */
        if (now == 0) {
                assert_false(limits_was_oom_kill(killed, true, 0));
                return;
        }
        uint64_t before = now - 1;
        assert_true(limits_was_oom_kill(killed, false, before));  /* it did */
        assert_false(limits_was_oom_kill(killed, true, before));  /* the agent's own kill */
        assert_false(limits_was_oom_kill(exited, false, before)); /* exit 137 is a choice */
        assert_false(limits_was_oom_kill(term, false, before));
        assert_false(limits_was_oom_kill(killed, false, UINT64_MAX));
}

/* The number of a /proc file's line that starts with name, read the plain
 * way (fopen by name, line by line). */
static unsigned long long proc_field_fopen(const char *path, const char *name) {
        FILE *f = fopen(path, "re");
        assert_non_null(f);
        char line[256];
        unsigned long long v = ULLONG_MAX;
        while (fgets(line, sizeof line, f))
                if (strncmp(line, name, strlen(name)) == 0) {
                        v = strtoull(line + strlen(name), NULL, 10);
                        break;
                }
        fclose(f);
        return v;
}

static size_t open_fds(void) {
        size_t n = 0;
        DIR *d = opendir("/proc/self/fd");
        assert_non_null(d);
        while (readdir(d))
                n++;
        closedir(d);
        return n;
}

/* The memory in use and the OOM-kill count are read from /proc files the
 * agent keeps open: each look reads them again from their start, gives what
 * reading them by name gives, and opens nothing more after the first. (That
 * a look sees the count move is the gVisor memory tests' to show: this
 * host's kernel may leave MemAvailable where it was after a program touches
 * hundreds of MiB.) */
static void test_memory_used(void **state) {
        uint64_t used = 0;
        assert_int_equal(limits_memory_used(&used), 0);
        assert_true(used > 0);
        unsigned long long total = proc_field_fopen("/proc/meminfo", "MemTotal:");
        assert_true(used < total * 1024);
        size_t fds = open_fds();
        for (int i = 0; i < 3; i++) {
                assert_int_equal(limits_memory_used(&used), 0);
                unsigned long long avail = proc_field_fopen("/proc/meminfo", "MemAvailable:");
                uint64_t plain = (total - avail) * 1024;
                assert_true(used < plain + (64u << 20) && plain < used + (64u << 20));
                assert_int_equal(limits_oom_kills(), proc_field_fopen("/proc/vmstat", "oom_kill "));
        }
        assert_int_equal(open_fds(), fds);
}

/* The largest process is found by its resident set, and the caller (the
 * agent) is never the one. */
static void test_largest_process(void **state) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        pid_t big = fork();
        assert_true(big >= 0);
        if (big == 0) {
                size_t n = 512u << 20;
                char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (m == MAP_FAILED)
                        _exit(1);
                memset(m, 1, n);
                (void)!write(p[1], "x", 1);
                pause();
                _exit(0);
        }
        char c;
        assert_int_equal(read(p[0], &c, 1), 1);
        pid_t pid = 0, pgid = 0;
        int r = limits_largest_process(&pid, &pgid);
        kill(big, SIGKILL);
        waitpid(big, NULL, 0);
        close(p[0]);
        close(p[1]);
        assert_int_equal(r, 0);
        assert_int_not_equal(pid, getpid());
        /* On a busy host something else may be larger still; it is never us. */
        if (pid == big)
                assert_int_equal(pgid, getpgid(0));
}

/* gVisor's cgroup view: the driver's argument parsed strictly, and the
 * files written where gVisor's cgroupfs keeps them (a plain tree here). */
static void test_cgroup_view(void **state) {
        (void)state;
        LimitsView v;
        assert_int_equal(limits_parse_cgroup_view("512:1:4000", &v), 0);
        assert_int_equal(v.memory_mib, 512);
        assert_int_equal(v.vcpu, 1);
        assert_int_equal(v.pids_max, 4000);
        assert_int_equal(limits_parse_cgroup_view("64:0:1", &v), 0);
        assert_int_equal(v.vcpu, 0);
        static const char *const bad[] = {
                "", "512", "512:1", "512:1:", ":1:1", "512:1:4000:1", "512:1:4000x", "-512:1:1", "512:-1:1",
                "512: 1:1", "15:1:1", "4194305:1:1", "512:257:1", "512:1:0", "512:1:99999999999999999999999",
                "18446744073709551617:1:1", "0x200:1:1",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                assert_int_equal(limits_parse_cgroup_view(bad[i], &v), -EINVAL);
        assert_int_equal(limits_parse_cgroup_view(NULL, &v), -EINVAL);

        char root[] = "/tmp/runtime-viewtest-XXXXXX";
        assert_non_null(mkdtemp(root));
        char p[PATH_MAX];
        static const char *const dirs[] = {"memory", "cpu", "pids"};
        static const char *const files[] = {"memory/memory.limit_in_bytes", "cpu/cpu.cfs_period_us",
                                            "cpu/cpu.cfs_quota_us", "pids/pids.max"};
        for (size_t i = 0; i < 3; i++) {
                snprintf(p, sizeof p, "%s/%s", root, dirs[i]);
                assert_int_equal(mkdir(p, 0755), 0);
        }
        /* A controller missing: an error, and no file made. */
        assert_int_equal(limits_write_cgroup_view(root, &(LimitsView){512, 2, 100}), -ENOENT);
        for (size_t i = 0; i < 4; i++) {
                snprintf(p, sizeof p, "%s/%s", root, files[i]);
                FILE *f = fopen(p, "w");
                assert_non_null(f);
                fputs("9223372036854771712\n", f);
                fclose(f);
        }
        assert_int_equal(limits_write_cgroup_view(root, &(LimitsView){512, 2, 100}), 0);
        static const char *const want[] = {"536870912", "100000", "200000", "100"};
        for (size_t i = 0; i < 4; i++) {
                char buf[64] = {0};
                snprintf(p, sizeof p, "%s/%s", root, files[i]);
                FILE *f = fopen(p, "r");
                assert_non_null(f);
                assert_non_null(fgets(buf, sizeof buf, f));
                fclose(f);
                assert_string_equal(buf, want[i]);
        }
        assert_int_equal(limits_write_cgroup_view(root, &(LimitsView){64, 0, 1}), 0);
        char buf[64] = {0};
        snprintf(p, sizeof p, "%s/cpu/cpu.cfs_quota_us", root);
        FILE *f = fopen(p, "r");
        assert_non_null(fgets(buf, sizeof buf, f));
        fclose(f);
        assert_string_equal(buf, "-1");
        for (size_t i = 0; i < 4; i++) {
                snprintf(p, sizeof p, "%s/%s", root, files[i]);
                unlink(p);
        }
        for (size_t i = 0; i < 3; i++) {
                snprintf(p, sizeof p, "%s/%s", root, dirs[i]);
                rmdir(p);
        }
        rmdir(root);
}

/* gVisor's commands cgroup: made below each controller with the view's
 * limits less the agent's pids, and joined by every child. Checked in a
 * process of its own, as the join files are the agent's global state. */
static int command_cgroup_in_child(const char *root) {
        int keep[2];
        if (pipe(keep) < 0)
                return 10;
        char one[16];
        snprintf(one, sizeof one, "%d", keep[1]);
        if (limits_set_child_cgroup_fds(one) < 0)
                return 11;
        /* A controller's directory missing: an error. */
        if (limits_make_command_cgroup(root, &(LimitsView){512, 2, 1000}) != -ENOENT)
                return 12;
        static const char *const ctl[] = {"memory", "cpu", "pids"};
        static const char *const knobs[] = {"memory/sandbox/memory.limit_in_bytes", "cpu/sandbox/cpu.cfs_period_us",
                                            "cpu/sandbox/cpu.cfs_quota_us", "pids/sandbox/pids.max"};
        char p[PATH_MAX];
        for (size_t i = 0; i < 3; i++) {
                snprintf(p, sizeof p, "%s/%s", root, ctl[i]);
                if (mkdir(p, 0755) < 0 && errno != EEXIST)
                        return 13;
                /* cgroupfs makes a new cgroup's files with it; a copy
                 * restored from a snapshot finds the directory there. */
                snprintf(p, sizeof p, "%s/%s/sandbox", root, ctl[i]);
                if (mkdir(p, 0755) < 0)
                        return 14;
                snprintf(p, sizeof p, "%s/%s/sandbox/cgroup.procs", root, ctl[i]);
                if (close(open(p, O_WRONLY | O_CREAT, 0644)) < 0)
                        return 15;
        }
        for (size_t i = 0; i < 4; i++) {
                snprintf(p, sizeof p, "%s/%s", root, knobs[i]);
                if (close(open(p, O_WRONLY | O_CREAT, 0644)) < 0)
                        return 16;
        }
        if (limits_make_command_cgroup(root, &(LimitsView){512, 2, 1000}) != 0)
                return 17;
        static const char *const want[] = {"536870912", "100000", "200000", "938"}; /* 1000 - 1000/16 */
        for (size_t i = 0; i < 4; i++) {
                char buf[64] = {0};
                snprintf(p, sizeof p, "%s/%s", root, knobs[i]);
                FILE *f = fopen(p, "r");
                if (!f || !fgets(buf, sizeof buf, f) || strcmp(buf, want[i]) != 0)
                        return 20 + (int)i;
                fclose(f);
        }
        /* Small limits keep 16. */
        if (limits_make_command_cgroup(root, &(LimitsView){64, 1, 64}) != 0)
                return 30;
        snprintf(p, sizeof p, "%s/pids/sandbox/pids.max", root);
        char buf[64] = {0};
        FILE *f = fopen(p, "r");
        if (!f || !fgets(buf, sizeof buf, f) || strcmp(buf, "48") != 0)
                return 31;
        fclose(f);
        pid_t pid = fork();
        if (pid < 0)
                return 32;
        if (pid == 0) {
                limits_child_defaults();
                _exit(0);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
                return 33;
        for (size_t i = 0; i < 3; i++) {
                char c[8] = "";
                snprintf(p, sizeof p, "%s/%s/sandbox/cgroup.procs", root, ctl[i]);
                int fd = open(p, O_RDONLY);
                if (fd < 0 || read(fd, c, sizeof c) != 1 || c[0] != '0')
                        return 40 + (int)i;
                close(fd);
        }
        return 0;
}

static void test_command_cgroup(void **state) {
        (void)state;
        char root[] = "/tmp/runtime-cmdcg-XXXXXX";
        assert_non_null(mkdtemp(root));
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
                _exit(command_cgroup_in_child(root));
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", root);
        assert_int_equal(system(cmd), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_child_cgroup_fds),
                cmocka_unit_test(test_close_keeping_cgroup_fds),
                cmocka_unit_test(test_was_oom_kill),
                cmocka_unit_test(test_memory_used),
                cmocka_unit_test(test_memory_look_ms),
                cmocka_unit_test(test_largest_process),
                cmocka_unit_test(test_cgroup_view),
                cmocka_unit_test(test_command_cgroup),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
