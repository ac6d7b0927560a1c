/*
 * src/driver/launch.c's spawn, the one every driver starts its supervisor
 * with (bwrap, runsc, QEMU): a failure before the exec comes back as an
 * error from the exec-status pipe, never as an exit code; the child starts
 * with default signal state, only the descriptors it is handed, and, when
 * asked, other ids, groups and a seccomp filter under no_new_privs.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/macro.h"
#include "driver/launch.h"
#include "driver/seccomp.h"

static char *const env[] = { "PATH=/usr/bin:/bin", "LC_ALL=C", NULL };

/* Runs argv with stdout into a pipe: the spawn's result, the exit status
 * and what it wrote. */
static int run(char *const argv[], LaunchFds *f, int *ret_status, char *out, size_t out_len) {
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        _cleanup_close_ int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        assert_true(devnull >= 0);
        f->stdin_fd = devnull;
        f->stdout_fd = p[1];
        f->stderr_fd = p[1];
        pid_t pid = -1;
        int r = launch_spawn(argv, env, f, &pid);
        close(p[1]);
        size_t n = 0;
        ssize_t got;
        while (n < out_len - 1 && (got = read(p[0], out + n, out_len - 1 - n)) > 0)
                n += (size_t)got;
        out[n] = 0;
        close(p[0]);
        if (r == 0)
                assert_int_equal(launch_wait(pid, 10000, ret_status), 0);
        return r;
}

/* The value of a /proc/<pid>/status field in text, or NULL. */
static const char *field(const char *text, const char *name, char *buf, size_t len) {
        char key[64];
        snprintf(key, sizeof(key), "\n%s:", name);
        const char *p = strstr(text, key);
        if (!p)
                return NULL;
        p += strlen(key);
        p += strspn(p, " \t");
        size_t n = strcspn(p, "\n");
        snprintf(buf, len, "%.*s", (int)n, p);
        return buf;
}

static void test_exec_failure_is_an_error(void **state) {
        (void)state;
        char out[256];
        int status = -1;
        char *const missing[] = { "/nonexistent/program", NULL };
        LaunchFds f = { 0 };
        assert_int_equal(run(missing, &f, &status, out, sizeof(out)), -ENOENT);
        char *const not_exec[] = { "/proc/self/status", NULL };
        int r = run(not_exec, &f, &status, out, sizeof(out));
        assert_true(r == -EACCES || r == -ENOEXEC);
        /* No child left behind by either. */
        assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
        assert_int_equal(errno, ECHILD);
}

static void test_exit_codes_are_the_programs(void **state) {
        (void)state;
        /* 119-127 were the old spawn's own failure codes: now a program's
         * exit code means only what the program says. */
        static const int codes[] = { 0, 1, 119, 122, 125, 126, 127 };
        for (size_t i = 0; i < ELEMENTSOF(codes); i++) {
                char script[32], out[64];
                snprintf(script, sizeof(script), "exit %d", codes[i]);
                char *const argv[] = { "/bin/sh", "-c", script, NULL };
                LaunchFds f = { 0 };
                int status = -1;
                assert_int_equal(run(argv, &f, &status, out, sizeof(out)), 0);
                assert_true(WIFEXITED(status));
                assert_int_equal(WEXITSTATUS(status), codes[i]);
        }
}

static void test_signals_reset_and_fds_closed(void **state) {
        (void)state;
        /* What a daemon thread may have: SIGPIPE ignored, SIGTERM blocked,
         * and a descriptor opened without O_CLOEXEC. */
        struct sigaction ign = { .sa_handler = SIG_IGN }, old_pipe;
        sigaction(SIGPIPE, &ign, &old_pipe);
        sigset_t term, old_mask;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &term, &old_mask);
        /* High numbers: ls's own descriptors are the lowest free ones. */
        _cleanup_close_ int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        int leak = fcntl(null, F_DUPFD, 50);
        assert_true(leak >= 50);
        _cleanup_close_ int kept = fcntl(null, F_DUPFD_CLOEXEC, 60);
        assert_true(kept >= 60);

        char script[128], out[8192], v[128];
        snprintf(script, sizeof(script), "cat /proc/self/status; ls -1 /proc/self/fd | tr '\\n' ' '; echo");
        char *const argv[] = { "/bin/sh", "-c", script, NULL };
        const int keep[] = { kept };
        LaunchFds f = { .keep = keep, .n_keep = 1 };
        int status = -1;
        assert_int_equal(run(argv, &f, &status, out, sizeof(out)), 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        assert_string_equal(field(out, "SigBlk", v, sizeof(v)), "0000000000000000");
        /* sh ignores nothing of its own accord with -c; SIGPIPE is back. */
        unsigned long long ignored = strtoull(field(out, "SigIgn", v, sizeof(v)), NULL, 16);
        assert_int_equal(ignored & (1ull << (SIGPIPE - 1)), 0);
        const char *fds = strrchr(out, '\n');
        while (fds > out && fds[-1] != '\n')
                fds--;
        char want[16];
        snprintf(want, sizeof(want), " %d ", kept);
        char line[sizeof(out) + 1];
        snprintf(line, sizeof(line), " %s", fds);
        assert_non_null(strstr(line, want));
        snprintf(want, sizeof(want), " %d ", leak);
        assert_null(strstr(line, want));

        close(leak);
        pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
        sigaction(SIGPIPE, &old_pipe, NULL);
}

static void test_ids_groups_and_seccomp(void **state) {
        (void)state;
        if (geteuid() != 0) {
                skip();
                return;
        }
        const uint8_t *prog;
        size_t len;
        assert_int_equal(seccomp_policy_bpf(&prog, &len), 0);
        struct sock_fprog fp = { .len = (unsigned short)(len / sizeof(struct sock_filter)),
                                 .filter = (struct sock_filter *)(uintptr_t)prog };
        const gid_t groups[] = { 1500000777 };
        char *const argv[] = { "/bin/cat", "/proc/self/status", NULL };
        LaunchFds f = { .set_ids = true, .uid = 1500000123, .gid = 1500000124, .groups = groups, .n_groups = 1,
                        .seccomp = &fp };
        int status = -1;
        char out[8192], v[128];
        assert_int_equal(run(argv, &f, &status, out, sizeof(out)), 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        assert_string_equal(field(out, "Uid", v, sizeof(v)), "1500000123\t1500000123\t1500000123\t1500000123");
        assert_string_equal(field(out, "Gid", v, sizeof(v)), "1500000124\t1500000124\t1500000124\t1500000124");
        assert_string_equal(field(out, "Groups", v, sizeof(v)), "1500000777 ");
        assert_string_equal(field(out, "NoNewPrivs", v, sizeof(v)), "1");
        assert_string_equal(field(out, "Seccomp", v, sizeof(v)), "2");
        assert_string_equal(field(out, "CapEff", v, sizeof(v)), "0000000000000000");
}

static void test_wait_or_kill(void **state) {
        (void)state;
        char *const argv[] = { "/bin/sleep", "60", NULL };
        _cleanup_close_ int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
        LaunchFds f = { .stdin_fd = devnull, .stdout_fd = devnull, .stderr_fd = devnull };
        pid_t pid;
        assert_int_equal(launch_spawn(argv, env, &f, &pid), 0);
        int status;
        assert_int_equal(launch_wait_or_kill(pid, 100, &status), -ETIMEDOUT);
        /* Reaped: nothing left to wait for. */
        assert_int_equal(waitpid(pid, NULL, WNOHANG), -1);
        assert_int_equal(errno, ECHILD);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_exec_failure_is_an_error),
                cmocka_unit_test(test_exit_codes_are_the_programs),
                cmocka_unit_test(test_signals_reset_and_fds_closed),
                cmocka_unit_test(test_ids_groups_and_seccomp),
                cmocka_unit_test(test_wait_or_kill),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
