#include "driver/seccomp.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <pthread.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <unistd.h>

#include "common/macro.h"

static void seccomp_releasep(scmp_filter_ctx *ctx) {
        if (*ctx)
                seccomp_release(*ctx);
}
#define _cleanup_seccomp_ _cleanup_(seccomp_releasep)

/* Refused outright: host-wide state (modules, kexec, clocks, swap, reboot,
 * accounting, quotas, the kernel log), kernel attack surface a sandbox has no
 * use for (bpf, perf, userfaultfd, keyrings, io_uring), mount changes after
 * setup, and file handles, which can name inodes outside the sandbox's root. */
static const char *const denied[] = {
        "kexec_load",      "kexec_file_load", "init_module",     "finit_module",     "delete_module",
        "bpf",             "perf_event_open", "userfaultfd",     "keyctl",           "add_key",
        "request_key",     "io_uring_setup",  "io_uring_enter",  "io_uring_register", "mount",
        "umount2",         "pivot_root",      "move_mount",      "open_tree",        "fsopen",
        "fsconfig",        "fsmount",         "fspick",          "mount_setattr",    "swapon",
        "swapoff",         "reboot",          "acct",            "settimeofday",     "clock_settime",
        "clock_adjtime",   "adjtimex",        "open_by_handle_at", "name_to_handle_at", "setns",
        "lookup_dcookie",  "quotactl",        "quotactl_fd",     "syslog",           "iopl",
        "ioperm",          "nfsservctl",      "vhangup",         "uselib",           "sysfs",
        "_sysctl",         "fanotify_init",   "kcmp",            "pidfd_getfd",      "process_madvise",
        "landlock_create_ruleset",
};

static int build(scmp_filter_ctx *ret) {
        _cleanup_seccomp_ scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        if (!ctx)
                return -ENOMEM;
        int r;
        /* Only the native ABI: syscalls through another ABI (int 0x80, x32)
         * would bypass the numbers below, so they kill the process. */
        r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
        if (r < 0)
                return r;
        r = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 1);
        if (r < 0)
                return r;

        for (size_t i = 0; i < ELEMENTSOF(denied); i++) {
                int nr = seccomp_syscall_resolve_name(denied[i]);
                if (nr == __NR_SCMP_ERROR)
                        continue; /* not on this architecture */
                r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
                if (r < 0)
                        return r;
        }

        /* New user namespaces are where most kernel privilege bugs start: a
         * sandbox may not create one. clone3 passes its flags in memory the
         * filter cannot read, so it answers ENOSYS and libc falls back to
         * clone, whose flags are checked. */
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
        if (r < 0)
                return r;
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
        if (r < 0)
                return r;
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
        if (r < 0)
                return r;

        /* personality(2): the types and the UNAME26 / PER_LINUX32 bits stay
         * below 0x20009; every flag above that (ADDR_NO_RANDOMIZE,
         * READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...) only weakens the hardening
         * of the sandbox's own processes. One comparison per rule is all
         * libseccomp takes, so the 0xffffffff query is refused too. */
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                             SCMP_A0(SCMP_CMP_GT, (scmp_datum_t)(UNAME26 | PER_LINUX32)));
        if (r < 0)
                return r;

        /* Pushing input into a terminal (TIOCSTI) or TIOCLINUX console
         * tricks: no legitimate use, and the classic escape through a
         * shared tty. */
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, TIOCSTI));
        if (r < 0)
                return r;
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, TIOCLINUX));
        if (r < 0)
                return r;

        *ret = TAKE_PTR(ctx);
        return 0;
}

static pthread_once_t prog_once = PTHREAD_ONCE_INIT;
static uint8_t *prog;
static size_t prog_len;
static int prog_error;

static void prog_build(void) {
        _cleanup_seccomp_ scmp_filter_ctx ctx = NULL;
        int r = build(&ctx);
        if (r < 0) {
                prog_error = r;
                return;
        }
        _cleanup_close_ int fd = memfd_create("seccomp-build", MFD_CLOEXEC);
        if (fd < 0) {
                prog_error = -errno;
                return;
        }
        r = seccomp_export_bpf(ctx, fd);
        if (r < 0) {
                prog_error = r;
                return;
        }
        off_t len = lseek(fd, 0, SEEK_END);
        if (len <= 0 || len > 1 << 20) {
                prog_error = -EIO;
                return;
        }
        uint8_t *p = malloc((size_t)len);
        if (!p) {
                prog_error = -ENOMEM;
                return;
        }
        if (pread(fd, p, (size_t)len, 0) != len) {
                free(p);
                prog_error = -EIO;
                return;
        }
        prog = p;
        prog_len = (size_t)len;
}

int seccomp_policy_bpf(const uint8_t **ret_prog, size_t *ret_len) {
        pthread_once(&prog_once, prog_build);
        if (!prog)
                return prog_error ? prog_error : -EIO;
        *ret_prog = prog;
        *ret_len = prog_len;
        return 0;
}

int seccomp_policy_export_fd(int *ret_fd) {
        const uint8_t *p = NULL;
        size_t n = 0;
        int r = seccomp_policy_bpf(&p, &n);
        if (r < 0)
                return r;
        _cleanup_close_ int fd = memfd_create("runtime-seccomp", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        for (size_t off = 0; off < n;) {
                ssize_t w = write(fd, p + off, n - off);
                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                off += (size_t)w;
        }
        /* Sealed: whoever else holds the fd cannot change the program
         * between here and bwrap reading it. */
        (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
        if (lseek(fd, 0, SEEK_SET) < 0)
                return -errno;
        *ret_fd = TAKE_FD(fd);
        return 0;
}
