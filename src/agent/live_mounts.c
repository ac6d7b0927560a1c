#include "agent/live_mounts.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/macro.h"

#if defined(__x86_64__)
#define LIVE_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define LIVE_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "unsupported architecture"
#endif

/* How long the agent waits for the helper's answer. */
#define LIVE_HELPER_TIMEOUT_MS 10000

enum { LIVE_BIND = 1, LIVE_UNBIND = 2 };

typedef struct LiveReq {
        int op;
        int read_only;
        char name[AGENT_LIVE_NAME_LEN + 1];
        char dest[4097];
} LiveReq;

static int helper_sock = -1;

/* The directory at path (absolute, normalized), each part opened with no
 * symbolic link followed; made where missing when make. The parent of the
 * last part instead when parent, its name then in last. */
static int walk(const char *path, bool make, bool parent, char *last, size_t last_len) {
        int dfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        const char *p = path;
        while (dfd >= 0 && *p == '/') {
                const char *end = strchr(p + 1, '/');
                size_t n = end ? (size_t)(end - p - 1) : strlen(p + 1);
                char part[256];
                if (n == 0 || n >= sizeof part || (n == 1 && p[1] == '.') || (n == 2 && p[1] == '.' && p[2] == '.')) {
                        close(dfd);
                        return -EINVAL;
                }
                memcpy(part, p + 1, n);
                part[n] = 0;
                p += n + 1;
                if (parent && !*p) {
                        if (n >= last_len) {
                                close(dfd);
                                return -ENAMETOOLONG;
                        }
                        memcpy(last, part, n + 1);
                        return dfd;
                }
                if (make && mkdirat(dfd, part, 0755) < 0 && errno != EEXIST) {
                        int e = -errno;
                        close(dfd);
                        return e;
                }
                int next = openat(dfd, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                int e = -errno;
                close(dfd);
                if (next < 0)
                        return e == -ELOOP ? -ENOTDIR : e;
                struct stat st;
                if (fstat(next, &st) < 0 || !S_ISDIR(st.st_mode)) {
                        close(next);
                        return -ENOTDIR;
                }
                dfd = next;
        }
        if (dfd >= 0 && *p) {
                close(dfd);
                return -EINVAL;
        }
        return dfd < 0 ? -errno : dfd;
}

static int fd_path(char *buf, size_t len, int fd) {
        return snprintf(buf, len, "/proc/self/fd/%d", fd) >= (int)len ? -ENAMETOOLONG : 0;
}

/* In the helper: the volume's directory bound at dest, then its flags set
 * on the new mount, reached from dest's parent by name and checked to be
 * the volume's root (not what a racing process put there). */
static int helper_bind(int live_fd, const LiveReq *q) {
        _cleanup_close_ int src = openat(live_fd, q->name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (src < 0)
                return errno == ELOOP ? -ENOTDIR : -errno;
        int r = walk(q->dest, true, false, NULL, 0);
        if (r < 0)
                return r;
        _cleanup_close_ int dst = r;
        char last[256];
        r = walk(q->dest, false, true, last, sizeof last);
        if (r < 0)
                return r;
        _cleanup_close_ int parent = r;
        char s[64], d[64];
        if ((r = fd_path(s, sizeof s, src)) < 0 || (r = fd_path(d, sizeof d, dst)) < 0)
                return r;
        if (mount(s, d, NULL, MS_BIND, NULL) < 0)
                return -errno;
        _cleanup_close_ int top = openat(parent, last, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat a, b;
        r = top < 0 ? -ENOTDIR : 0;
        if (r == 0 && (fstat(top, &a) < 0 || fstat(src, &b) < 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino))
                r = -ENOTDIR;
        char t[64];
        if (r == 0)
                r = fd_path(t, sizeof t, top);
        unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (q->read_only ? MS_RDONLY : 0);
        if (r == 0 && mount(NULL, t, NULL, flags, NULL) < 0)
                r = -errno;
        if (r < 0 && fchdir(parent) == 0) {
                (void)umount2(last, UMOUNT_NOFOLLOW);
                if (chdir("/") < 0)
                        _exit(1);
        }
        return r;
}

static int helper_unbind(const LiveReq *q) {
        char last[256];
        int r = walk(q->dest, false, true, last, sizeof last);
        if (r < 0)
                return r;
        _cleanup_close_ int parent = r;
        if (fchdir(parent) < 0)
                return -errno;
        r = umount2(last, UMOUNT_NOFOLLOW) < 0 ? -errno : 0;
        if (chdir("/") < 0)
                _exit(1);
        return r;
}

static _Noreturn void helper_main(int sock, int live_fd) {
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        (void)prctl(PR_SET_NAME, "runtime-mounts");
        /* No other process of the sandbox reads its memory or fds. */
        (void)prctl(PR_SET_DUMPABLE, 0);
        umask(022);
        (void)setsid();
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
                (void)dup2(null, 0);
                (void)dup2(null, 1);
                (void)dup2(null, 2);
        }
        for (int fd = 3; fd < 1024; fd++)
                if (fd != sock && fd != live_fd)
                        (void)close(fd);
        for (;;) {
                LiveReq q;
                ssize_t n = recv(sock, &q, sizeof q, 0);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        _exit(0);
                int r = -EINVAL;
                q.name[sizeof q.name - 1] = q.dest[sizeof q.dest - 1] = 0;
                if (n == (ssize_t)sizeof q && q.dest[0] == '/') {
                        if (q.op == LIVE_BIND && live_mounts_name_valid(q.name))
                                r = helper_bind(live_fd, &q);
                        else if (q.op == LIVE_UNBIND)
                                r = helper_unbind(&q);
                }
                (void)send(sock, &r, sizeof r, MSG_NOSIGNAL);
        }
}

/* mount(2), umount2(2) and the newer mount calls refused (EPERM) to the
 * agent and everything it starts from now on. */
static int deny_mounts(void) {
        struct sock_filter f[] = {
                BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, LIVE_AUDIT_ARCH, 1, 0),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
                BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mount, 8, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_umount2, 7, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_open_tree, 6, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_move_mount, 5, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fsopen, 4, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fsmount, 3, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fspick, 2, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mount_setattr, 1, 0),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        };
        struct sock_fprog prog = { .len = ELEMENTSOF(f), .filter = f };
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
                return -errno;
        return 0;
}

static int drop_sys_admin(void) {
        if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) < 0)
                return -errno;
        struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
        struct __user_cap_data_struct d[2];
        if (syscall(SYS_capget, &h, d) < 0)
                return -errno;
        d[0].effective &= ~(1u << CAP_SYS_ADMIN);
        d[0].permitted &= ~(1u << CAP_SYS_ADMIN);
        d[0].inheritable &= ~(1u << CAP_SYS_ADMIN);
        return syscall(SYS_capset, &h, d) < 0 ? -errno : 0;
}

int live_mounts_start(void) {
        int r = 0;
        _cleanup_close_ int live_fd = open(AGENT_LIVE_DIR, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int sv[2] = { -1, -1 };
        if (live_fd < 0)
                r = -errno;
        else if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                r = -errno;
        pid_t pid = r == 0 ? fork() : -1;
        if (r == 0 && pid < 0)
                r = -errno;
        if (pid == 0) {
                close(sv[0]);
                helper_main(sv[1], live_fd);
        }
        if (sv[1] >= 0)
                close(sv[1]);
        if (r == 0)
                helper_sock = sv[0];
        else if (sv[0] >= 0)
                close(sv[0]);
        /* Whatever happened above: nothing else in the sandbox mounts, or
         * reaches the volumes the host binds for the helper. */
        int k = mount("runtime-live", AGENT_LIVE_DIR, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                      "size=4k,mode=0555");
        if (k < 0 && errno != ENOENT)
                r = r < 0 ? r : -errno;
        /* Both, whatever either says; an agent that could not do both
         * must not run anything (the caller ends it). */
        int denied = deny_mounts(), dropped = drop_sys_admin();
        if (denied < 0 || dropped < 0)
                return -ENOTRECOVERABLE;
        if (r < 0 && helper_sock >= 0) {
                close(helper_sock);
                helper_sock = -1;
        }
        return r;
}

static int helper_call(const LiveReq *q) {
        if (helper_sock < 0)
                return -ENOSYS;
        if (send(helper_sock, q, sizeof *q, MSG_NOSIGNAL) != (ssize_t)sizeof *q)
                return -EIO;
        struct pollfd pf = { .fd = helper_sock, .events = POLLIN };
        int k;
        while ((k = poll(&pf, 1, LIVE_HELPER_TIMEOUT_MS)) < 0 && errno == EINTR)
                ;
        int r;
        if (k <= 0 || recv(helper_sock, &r, sizeof r, 0) != (ssize_t)sizeof r) {
                /* A helper that does not answer answers nothing later. */
                close(helper_sock);
                helper_sock = -1;
                return -EIO;
        }
        return r > 0 ? -EIO : r;
}

int live_mounts_bind(const char *name, const char *dest, bool read_only) {
        LiveReq q = { .op = LIVE_BIND, .read_only = read_only };
        if (!live_mounts_name_valid(name) || strlen(dest) >= sizeof q.dest || dest[0] != '/')
                return -EINVAL;
        memcpy(q.name, name, AGENT_LIVE_NAME_LEN + 1);
        memcpy(q.dest, dest, strlen(dest) + 1);
        return helper_call(&q);
}

int live_mounts_unbind(const char *dest) {
        LiveReq q = { .op = LIVE_UNBIND };
        if (strlen(dest) >= sizeof q.dest || dest[0] != '/')
                return -EINVAL;
        memcpy(q.dest, dest, strlen(dest) + 1);
        return helper_call(&q);
}
