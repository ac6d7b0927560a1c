#include "daemon/manager/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"

/* The handshake's lines are short: "ATTACH <v> <id> <nonce>" one way,
 * "OK <v> <pid> <n> <state>" the other. */
#define SUPERVISE_LINE_MAX (64 + DRIVER_STATE_MAX)
/* Where a child moves the fds it passes on before it puts them in place,
 * so that no dup2 clobbers a source not yet moved. */
#define SUPERVISE_FD_PARK 64

int supervise_nonce(char ret[SUPERVISE_NONCE_LEN + 1]) {
        return random_hex(ret, SUPERVISE_NONCE_LEN / 2);
}

void supervise_handles_close(SuperviseHandles *h) {
        for (size_t i = 0; i < h->n; i++)
                if (h->fds[i] >= 0) {
                        close(h->fds[i]);
                        h->fds[i] = -1;
                }
        h->n = 0;
}

/* The socket's address, through the directory's fd (/proc/self/fd/N/...)
 * so that a long state directory still fits in sun_path. */
static int socket_address(int dirfd, struct sockaddr_un *sa) {
        memset(sa, 0, sizeof *sa);
        sa->sun_family = AF_UNIX;
        int w = snprintf(sa->sun_path, sizeof sa->sun_path, "/proc/self/fd/%d/" SUPERVISE_SOCKET, dirfd);
        return w < 0 || (size_t)w >= sizeof sa->sun_path ? -ENAMETOOLONG : 0;
}

static int listen_socket(const char *sandbox_dir, int *ret) {
        _cleanup_close_ int dirfd = open(sandbox_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0)
                return -errno;
        struct sockaddr_un sa;
        int r = socket_address(dirfd, &sa);
        if (r < 0)
                return r;
        if (unlinkat(dirfd, SUPERVISE_SOCKET, 0) < 0 && errno != ENOENT)
                return -errno;
        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
            fchmodat(dirfd, SUPERVISE_SOCKET, 0600, 0) < 0 || listen(fd, 4) < 0)
                return -errno;
        *ret = TAKE_FD(fd);
        return 0;
}

/* In the forked children: async-signal-safe calls only. */
static _Noreturn void grandchild(char *const argv[], char *const envp[], const int *src, const int *dst, size_t n,
                                 int devnull) {
        int parked[3 + DRIVER_MAX_HANDLES + 3];
        for (size_t i = 0; i < n; i++)
                if ((parked[i] = fcntl(src[i], F_DUPFD, SUPERVISE_FD_PARK)) < 0)
                        _exit(127);
        int null_parked = fcntl(devnull, F_DUPFD, SUPERVISE_FD_PARK);
        if (null_parked < 0 || dup2(null_parked, 0) < 0 || dup2(null_parked, 1) < 0)
                _exit(127);
        for (size_t i = 0; i < n; i++)
                if (dup2(parked[i], dst[i]) < 0)
                        _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve(argv[0], argv, envp);
        _exit(127);
}

int supervise_start(const char *program, const char *sandbox_dir, const char *id, const char *nonce, int agent_fd,
                    SuperviseHandles *h, int *ret_conn) {
        const int agent = agent_fd;
        _cleanup_close_ int listen_fd = -1, devnull = -1;
        int pair[2] = { -1, -1 }, pidpipe[2] = { -1, -1 };
        int r = 0;
        char keep[16], env_nonce[64];
        snprintf(keep, sizeof keep, "%zu", h->n);
        snprintf(env_nonce, sizeof env_nonce, "RUNTIME_SUPERVISOR_NONCE=%s", nonce);
        char *argv[] = { (char *)program, "--sandbox", (char *)id, "--keep", keep,
                         h->state[0] ? "--state" : NULL, h->state, NULL };
        char *envp[] = { env_nonce, NULL };
        if (h->n > DRIVER_MAX_HANDLES) {
                r = -EINVAL;
                goto out;
        }
        if ((r = listen_socket(sandbox_dir, &listen_fd)) < 0)
                goto out;
        if ((devnull = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0 ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0 || pipe2(pidpipe, O_CLOEXEC) < 0) {
                r = -errno;
                goto out;
        }
        int src[3 + DRIVER_MAX_HANDLES], dst[3 + DRIVER_MAX_HANDLES];
        size_t n = 0;
        src[n] = agent, dst[n++] = 3;
        src[n] = listen_fd, dst[n++] = 4;
        src[n] = pair[1], dst[n++] = 5;
        for (size_t i = 0; i < h->n; i++)
                src[n] = h->fds[i], dst[n++] = 6 + (int)i;
        pid_t child = fork();
        if (child < 0) {
                r = -errno;
                goto out;
        }
        if (child == 0) {
                /* Its own session, so that a signal to the daemon's group
                 * (a terminal's Ctrl-C) does not reach it; and a grandchild,
                 * so that it is never the daemon's child. */
                setsid();
                pid_t g = fork();
                if (g == 0)
                        grandchild(argv, envp, src, dst, n, devnull);
                int32_t v = g;
                (void)!write(pidpipe[1], &v, sizeof v);
                _exit(g < 0 ? 1 : 0);
        }
        close(pidpipe[1]);
        pidpipe[1] = -1;
        int status;
        while (waitpid(child, &status, 0) < 0 && errno == EINTR)
                ;
        int32_t gpid = -1;
        ssize_t got;
        while ((got = read(pidpipe[0], &gpid, sizeof gpid)) < 0 && errno == EINTR)
                ;
        if (got != (ssize_t)sizeof gpid || gpid <= 0) {
                r = -ECHILD;
                goto out;
        }
        h->pid = gpid;
        *ret_conn = pair[0];
        pair[0] = -1;
out:
        for (int i = 0; i < 2; i++) {
                if (pair[i] >= 0)
                        close(pair[i]);
                if (pidpipe[i] >= 0)
                        close(pidpipe[i]);
        }
        supervise_handles_close(h);
        if (r < 0 && listen_fd >= 0) {
                _cleanup_close_ int dirfd = open(sandbox_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
                if (dirfd >= 0)
                        (void)unlinkat(dirfd, SUPERVISE_SOCKET, 0);
        }
        return r;
}

static void say(char *why, size_t n, const char *text) {
        if (why && n)
                snprintf(why, n, "%s", text);
}

/* One byte at a time: nothing past the line's end may be taken from the
 * socket, which carries the channel's frames right after it. The first
 * byte brings the handles. */
static int read_reply(int fd, int timeout_ms, char *line, size_t max, int *fds, size_t *n_fds) {
        int64_t deadline = (int64_t)time_now_mono_ms() + timeout_ms;
        size_t len = 0;
        for (;;) {
                int64_t left = deadline - (int64_t)time_now_mono_ms();
                if (left <= 0)
                        return -ETIMEDOUT;
                struct pollfd pfd = { .fd = fd, .events = POLLIN };
                int p = poll(&pfd, 1, (int)left);
                if (p < 0 && errno == EINTR)
                        continue;
                if (p < 0)
                        return -errno;
                if (p == 0)
                        return -ETIMEDOUT;
                char c;
                union {
                        struct cmsghdr h;
                        char buf[CMSG_SPACE(sizeof(int) * (1 + DRIVER_MAX_HANDLES))];
                } control;
                struct iovec iov = { .iov_base = &c, .iov_len = 1 };
                struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
                if (len == 0) {
                        msg.msg_control = control.buf;
                        msg.msg_controllen = sizeof control.buf;
                }
                ssize_t got = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
                if (got < 0 && errno == EINTR)
                        continue;
                if (got < 0)
                        return -errno;
                if (got == 0)
                        return -EPROTO;
                if (len == 0) {
                        if (msg.msg_flags & MSG_CTRUNC)
                                return -EPROTO; /* more fds than any driver keeps: not ours */
                        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
                                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                                        continue;
                                size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                                for (size_t i = 0; i < k && *n_fds < 1 + DRIVER_MAX_HANDLES; i++)
                                        memcpy(&fds[(*n_fds)++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                        }
                }
                if (c == '\n') {
                        line[len] = '\0';
                        return 0;
                }
                if (len + 1 >= max || c < 0x20 || c > 0x7e)
                        return -EPROTO;
                line[len++] = c;
        }
}

static void close_fds(int *fds, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
}

/* One handshake at `version`: 0 and the connection, or a negative errno;
 * *ret_refusal is the supervisor's NO line's rest when it refused. */
static int handshake(int dirfd, const char *id, const char *nonce, unsigned version, int timeout_ms, int *ret_conn,
                     int *fds, size_t *n_fds, char *line, size_t line_len, char *why, size_t why_len) {
        struct sockaddr_un sa;
        int r = socket_address(dirfd, &sa);
        if (r < 0)
                return r;
        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
                r = -errno;
                say(why, why_len, r == -ENOENT ? "it has no supervisor" : "its supervisor is gone");
                return r == -ENOENT ? -ENOENT : -ECONNREFUSED;
        }
        int w = snprintf(line, line_len, "ATTACH %u %s %s\n", version, id, nonce);
        if (w < 0 || (size_t)w >= line_len)
                return -EINVAL;
        if (send(fd, line, (size_t)w, MSG_NOSIGNAL) != w) {
                say(why, why_len, "its supervisor is gone");
                return -ECONNREFUSED;
        }
        *n_fds = 0;
        r = read_reply(fd, timeout_ms, line, line_len, fds, n_fds);
        if (r < 0) {
                close_fds(fds, *n_fds);
                *n_fds = 0;
                say(why, why_len, r == -ETIMEDOUT ? "its supervisor did not answer" : "its supervisor answered garbage");
                return r;
        }
        *ret_conn = TAKE_FD(fd);
        return 0;
}

int supervise_attach(const char *sandbox_dir, const char *id, const char *nonce, int timeout_ms, int *ret_channel,
                     int *ret_conn, SuperviseHandles *ret, char *why, size_t why_len) {
        memset(ret, 0, sizeof *ret);
        for (size_t i = 0; i < DRIVER_MAX_HANDLES; i++)
                ret->fds[i] = -1;
        _cleanup_close_ int dirfd = open(sandbox_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0) {
                say(why, why_len, "its directory is gone");
                return -ENOENT;
        }
        char line[SUPERVISE_LINE_MAX + 1];
        int fds[1 + DRIVER_MAX_HANDLES];
        size_t n_fds = 0;
        _cleanup_close_ int conn = -1;
        unsigned asked = SUPERVISE_PROTOCOL_VERSION;
        int r = handshake(dirfd, id, nonce, asked, timeout_ms, &conn, fds, &n_fds, line, sizeof line, why, why_len);
        /* A supervisor of the first version (started by a daemon before the
         * upgrade) answers that it speaks 1: asked again in its words. */
        if (r == 0 && strcmp(line, "NO version 1") == 0) {
                close_fds(fds, n_fds);
                closep(&conn);
                conn = -1;
                asked = 1;
                r = handshake(dirfd, id, nonce, asked, timeout_ms, &conn, fds, &n_fds, line, sizeof line, why,
                              why_len);
        }
        if (r < 0)
                return r;
        if (strncmp(line, "NO ", 3) == 0) {
                close_fds(fds, n_fds);
                if (why && why_len)
                        snprintf(why, why_len, "its supervisor refused: %.64s", line + 3);
                return -EPERM;
        }
        unsigned version = 0, n = 0;
        int pid = 0, used = 0;
        /* Version 2 hands the agent's channel over first, then the kept fds;
         * version 1 only the kept fds (its connection carries the frames). */
        size_t extra = asked >= 2 ? 1 : 0;
        if (sscanf(line, "OK %u %d %u %n", &version, &pid, &n, &used) != 3 || version != asked || pid <= 1 ||
            n > DRIVER_MAX_HANDLES || n + extra != n_fds || strlen(line + used) > DRIVER_STATE_MAX ||
            strchr(line + used, ' ')) {
                close_fds(fds, n_fds);
                say(why, why_len, "its supervisor answered garbage");
                return -EPROTO;
        }
        if (strcmp(line + used, "-") != 0)
                snprintf(ret->state, sizeof ret->state, "%s", line + used);
        for (size_t i = 0; i < n; i++)
                ret->fds[i] = fds[extra + i];
        ret->n = n;
        ret->pid = pid;
        ret->version = version;
        if (extra) {
                *ret_channel = fds[0];
                *ret_conn = TAKE_FD(conn);
        } else {
                *ret_channel = TAKE_FD(conn);
                *ret_conn = -1;
        }
        return 0;
}

void supervise_wait_end(pid_t pid, int timeout_ms, bool kill_after) {
        if (pid <= 1)
                return;
        _cleanup_close_ int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pidfd < 0)
                return; /* gone already */
        struct pollfd pfd = { .fd = pidfd, .events = POLLIN };
        int p;
        while ((p = poll(&pfd, 1, timeout_ms)) < 0 && errno == EINTR)
                ;
        if (p == 0 && kill_after)
                (void)syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
}
