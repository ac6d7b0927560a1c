/*
 * The sandbox seccomp policy (src/driver/seccomp.c), loaded for real in a
 * forked child: what it refuses is refused with the errno we promise, and
 * what a sandbox needs (threads, plain clone, personality queries of the
 * usual kind) still works.
 */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "driver/seccomp.h"

static void test_export_fd(void **state) {
        (void)state;
        int fd = -1;
        assert_int_equal(seccomp_policy_export_fd(&fd), 0);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        assert_true(st.st_size > 0);
        assert_int_equal(st.st_size % sizeof(struct sock_filter), 0);
        assert_int_equal(lseek(fd, 0, SEEK_CUR), 0);
        /* Sealed: nobody can rewrite the program before bwrap reads it. */
        assert_int_equal(write(fd, "x", 1), -1);
        const uint8_t *p;
        size_t n;
        assert_int_equal(seccomp_policy_bpf(&p, &n), 0);
        assert_int_equal((size_t)st.st_size, n);
        close(fd);
}

static void *thread_fn(void *arg) {
        return arg;
}

/* Result codes of one check in the child: 0 as expected, else the check's
 * number, so a failure names what went wrong. */
static int child_checks(void) {
        const uint8_t *p;
        size_t n;
        if (seccomp_policy_bpf(&p, &n) < 0)
                return 100;
        struct sock_fprog prog = {.len = (unsigned short)(n / sizeof(struct sock_filter)),
                                  .filter = (struct sock_filter *)(uintptr_t)p};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                return 101;
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0)
                return 102;

        errno = 0;
        if (unshare(CLONE_NEWUSER) != -1 || errno != EPERM)
                return 1;
        errno = 0;
        if (syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | SIGCHLD), 0, 0, 0, 0) != -1 || errno != EPERM)
                return 2;
        errno = 0;
        if (syscall(SYS_clone3, NULL, 0) != -1 || errno != ENOSYS)
                return 3;
        errno = 0;
        if (syscall(SYS_keyctl, 0, 0, 0, 0, 0) != -1 || errno != EPERM)
                return 4;
        errno = 0;
        if (syscall(SYS_bpf, 0, NULL, 0) != -1 || errno != EPERM)
                return 5;
        errno = 0;
        if (syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0) != -1 || errno != EPERM)
                return 6;
        errno = 0;
        if (syscall(SYS_userfaultfd, 0) != -1 || errno != EPERM)
                return 7;
        errno = 0;
        if (syscall(SYS_io_uring_setup, 1, NULL) != -1 || errno != EPERM)
                return 8;
        errno = 0;
        if (syscall(SYS_mount, "none", "/", "tmpfs", 0, NULL) != -1 || errno != EPERM)
                return 9;
        errno = 0;
        if (syscall(SYS_setns, 0, 0) != -1 || errno != EPERM)
                return 10;
        errno = 0;
        if (personality(ADDR_NO_RANDOMIZE) != -1 || errno != EPERM)
                return 11;
        if (personality(PER_LINUX) == -1)
                return 12;
        errno = 0;
        if (syscall(SYS_kexec_load, 0, 0, NULL, 0) != -1 || errno != EPERM)
                return 13;
        errno = 0;
        if (syscall(SYS_init_module, NULL, 0, "") != -1 || errno != EPERM)
                return 14;
        errno = 0;
        if (ioctl(0, TIOCSTI, "x") != -1 || errno != EPERM)
                return 15;
        errno = 0;
        if (syscall(SYS_open_by_handle_at, -1, NULL, 0) != -1 || errno != EPERM)
                return 16;

        /* What a sandbox needs keeps working: threads (glibc falls back
         * from clone3 to clone), fork, a harmless unshare. */
        pthread_t t;
        if (pthread_create(&t, NULL, thread_fn, NULL) != 0)
                return 20;
        pthread_join(t, NULL);
        pid_t c = fork();
        if (c < 0)
                return 21;
        if (c == 0)
                _exit(0);
        int st;
        if (waitpid(c, &st, 0) != c || !WIFEXITED(st))
                return 22;
        if (getpid() <= 0)
                return 23;
        return 0;
}

static void test_policy_in_child(void **state) {
        (void)state;
        /* Built in the parent: the child should not allocate after fork. */
        const uint8_t *p;
        size_t n;
        assert_int_equal(seccomp_policy_bpf(&p, &n), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
                _exit(child_checks());
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        if (WEXITSTATUS(st) != 0)
                fail_msg("seccomp check %d failed", WEXITSTATUS(st));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_export_fd),
                cmocka_unit_test(test_policy_in_child),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
