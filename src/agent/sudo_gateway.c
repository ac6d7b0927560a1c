#include "agent/sudo_gateway.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "agent/fsops.h"
#include "agent/limits.h"
#include "agent/sudo_wire.h"
#include "agent/user.h"
#include "common/io.h"
#include "common/macro.h"
#include "common/timeutil.h"

/* Commands run through the gateway at once; one more is refused, not queued. */
#define GATEWAY_RUNNING_MAX 64
/* A connected front has this long to send its whole request. */
#define GATEWAY_REQUEST_MS 10000
#define GATEWAY_GROUPS_MAX 64
#define SANDBOX_USER_NAME "sandbox"

__attribute__((format(printf, 1, 3))) static void gw_log(const char *fmt, int err, ...) {
        va_list ap;
        va_start(ap, err);
        fprintf(stderr, "runtime-agent: sudo gateway: ");
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        if (err)
                fprintf(stderr, ": %s", strerror(err));
        fputc('\n', stderr);
}

/* The target user: its passwd entry and shell, and its groups. */
static int target_lookup(const char *name, SudoTarget *t, gid_t *gids, size_t *n_gids) {
        AgentUser u;
        int r = user_lookup("/etc/passwd", name, &u);
        if (r < 0)
                return r;
        *t = (SudoTarget){ .uid = u.uid, .gid = u.gid };
        snprintf(t->name, sizeof t->name, "%s", u.name);
        snprintf(t->home, sizeof t->home, "%s", u.home);
        _cleanup_free_ char *buf = NULL;
        size_t len = 0;
        if (user_read_db("/etc/passwd", &buf, &len) < 0 || sudo_parse_shell(buf, len, name, t->shell, sizeof t->shell) < 0)
                snprintf(t->shell, sizeof t->shell, "/bin/sh");
        free(buf);
        buf = NULL;
        *n_gids = 1;
        gids[0] = u.gid;
        if (user_read_db("/etc/group", &buf, &len) == 0)
                *n_gids = sudo_parse_groups(buf, len, name, u.gid, gids, GATEWAY_GROUPS_MAX);
        return 0;
}

static int send_frame(int fd, uint32_t type, int32_t value, const char *msg) {
        size_t ml = msg ? strnlen(msg, SUDO_MESSAGE_MAX) : 0;
        char buf[sizeof(SudoFrame) + SUDO_MESSAGE_MAX];
        SudoFrame f = { .type = type, .value = value, .len = (uint32_t)ml };
        memcpy(buf, &f, sizeof f);
        if (ml)
                memcpy(buf + sizeof f, msg, ml);
        return io_send_all(fd, buf, sizeof f + ml);
}

__attribute__((format(printf, 3, 4))) static _Noreturn void refuse(int fd, int code, const char *fmt, ...) {
        char msg[SUDO_MESSAGE_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        (void)send_frame(fd, SUDO_FRAME_ERROR, code, msg);
        _exit(0);
}

/* Reads exactly n bytes before the deadline. */
static int read_exact(int fd, void *buf, size_t n, uint64_t deadline) {
        size_t got = 0;
        while (got < n) {
                uint64_t now = time_now_mono_ms();
                if (now >= deadline)
                        return -ETIMEDOUT;
                struct pollfd p = { .fd = fd, .events = POLLIN };
                int r = poll(&p, 1, (int)(deadline - now));
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return r < 0 ? -errno : -ETIMEDOUT;
                ssize_t k = read(fd, (char *)buf + got, n - got);
                if (k < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (k <= 0)
                        return k < 0 ? -errno : -EPIPE;
                got += (size_t)k;
        }
        return 0;
}

/* The header, exactly three descriptors and the sender's credentials with
 * it. The credentials are SCM_CREDENTIALS, which the kernel checks or fills
 * in itself (SO_PASSCRED), not SO_PEERCRED: gVisor's (before its 2025
 * releases) answers with the asking socket's own task, which is root here. */
static int read_header(int fd, SudoHeader *h, int fds[3], struct ucred *ret_cred, uint64_t deadline) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        uint64_t now = time_now_mono_ms();
        if (now >= deadline || poll(&p, 1, (int)(deadline - now)) <= 0)
                return -ETIMEDOUT;
        union {
                char buf[CMSG_SPACE(4 * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
                struct cmsghdr align;
        } u;
        struct iovec iov = { .iov_base = h, .iov_len = sizeof *h };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
        ssize_t k = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (k <= 0)
                return k < 0 ? -errno : -EPIPE;
        int n_fds = 0;
        bool have_cred = false;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
                    c->cmsg_len == CMSG_LEN(sizeof(struct ucred))) {
                        memcpy(ret_cred, CMSG_DATA(c), sizeof *ret_cred);
                        have_cred = true;
                        continue;
                }
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                int *in = (int *)CMSG_DATA(c);
                for (size_t i = 0; i < n; i++) {
                        if (n_fds < 3)
                                fds[n_fds++] = in[i];
                        else
                                close(in[i]);
                }
        }
        /* Truncated descriptors are closed by the kernel; a request without
         * all three is refused below either way. */
        if (n_fds != 3 || !have_cred || (m.msg_flags & MSG_CTRUNC))
                return -EPROTO;
        if ((size_t)k < sizeof *h)
                return read_exact(fd, (char *)h + k, sizeof *h - (size_t)k, deadline);
        return 0;
}

static SudoPty *raw_pty;

/* The caller's terminal back as it was: on every way out. */
static void pty_restore(void) {
        if (raw_pty && raw_pty->raw) {
                (void)tcsetattr(raw_pty->in, TCSANOW, &raw_pty->termios);
                raw_pty->raw = false;
        }
}

/* The caller's window size onto the command's terminal, when it changed
 * (setting it signals the command's foreground group). */
static void pty_sync_size(SudoPty *p) {
        struct winsize ws;
        if (p->master < 0 || p->size_of < 0 || ioctl(p->size_of, TIOCGWINSZ, &ws) < 0)
                return;
        if (p->have_ws && memcmp(&ws, &p->ws, sizeof ws) == 0)
                return;
        if (ioctl(p->master, TIOCSWINSZ, &ws) == 0) {
                p->ws = ws;
                p->have_ws = true;
        }
}

int sudo_pty_open(SudoPty *p, const int fds[3]) {
        *p = (SudoPty){ .master = -1, .slave = -1, .in = -1, .out = -1, .size_of = -1 };
        for (int i = 0; i < 3; i++)
                p->slave_for[i] = isatty(fds[i]) == 1;
        if (!p->slave_for[0] && !p->slave_for[1] && !p->slave_for[2])
                return 0;
        p->in = p->slave_for[0] ? fds[0] : -1;
        p->out = p->slave_for[1] ? fds[1] : p->slave_for[2] ? fds[2] : fds[0];
        p->size_of = p->slave_for[0] ? fds[0] : p->out;
        p->have_termios = tcgetattr(p->size_of, &p->termios) == 0;
        int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (m < 0)
                return -errno;
        char slave[64];
        if (grantpt(m) < 0 || unlockpt(m) < 0 || ptsname_r(m, slave, sizeof slave) != 0) {
                int e = errno;
                close(m);
                return -e;
        }
        /* Opened here, before the command's fork: gVisor loses what a
         * command writes first when its side is opened in the child. */
        p->slave = open(slave, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (p->slave < 0) {
                int e = errno;
                close(m);
                return -e;
        }
        int fl = fcntl(m, F_GETFL);
        (void)fcntl(m, F_SETFL, fl | O_NONBLOCK);
        p->master = m;
        pty_sync_size(p);
        return 0;
}

static void pty_make_raw(SudoPty *p) {
        if (p->in < 0 || !p->have_termios)
                return;
        struct termios raw = p->termios;
        cfmakeraw(&raw);
        raw_pty = p;
        if (tcsetattr(p->in, TCSADRAIN, &raw) == 0)
                p->raw = true;
}

/* Whatever the command's terminal still holds, to the caller's, once the
 * command is gone. */
static void pty_drain(SudoPty *p) {
        if (p->master < 0 || p->master_gone)
                return;
        if (p->to_user_len > p->to_user_off)
                (void)io_write_all(p->out, p->to_user + p->to_user_off, p->to_user_len - p->to_user_off);
        for (int i = 0; i < 1024; i++) {
                ssize_t k = read(p->master, p->to_user, sizeof p->to_user);
                if (k <= 0)
                        break;
                if (io_write_all(p->out, p->to_user, (size_t)k) < 0)
                        break;
        }
}

/* One round of the relay after poll: fills its pollfds the next time. */
static void pty_pollfds(const SudoPty *p, struct pollfd *in, struct pollfd *master, struct pollfd *out) {
        *in = (struct pollfd){ .fd = -1 };
        *master = (struct pollfd){ .fd = -1 };
        *out = (struct pollfd){ .fd = -1 };
        if (p->master < 0)
                return;
        if (p->in >= 0 && p->to_cmd_len == 0)
                *in = (struct pollfd){ .fd = p->in, .events = POLLIN };
        /* Once every holder of the command's side closed it, the master
         * only says so again and again: left alone until the command ends. */
        if (!p->master_gone) {
                master->fd = p->master;
                master->events = (p->to_user_len == 0 ? POLLIN : 0) | (p->to_cmd_len ? POLLOUT : 0);
        }
        if (p->to_user_len)
                *out = (struct pollfd){ .fd = p->out, .events = POLLOUT };
}

void sudo_pty_relay(SudoPty *p, const struct pollfd *in, const struct pollfd *master, const struct pollfd *out) {
        if (in->fd >= 0 && (in->revents & (POLLIN | POLLHUP))) {
                /* The caller's descriptor stays blocking (its file is shared with
                 * the caller's shell); poll said it has bytes. */
                ssize_t k = read(p->in, p->to_cmd, sizeof p->to_cmd);
                if (k > 0) {
                        /* Bytes typed after a resize must find the command's
                         * terminal at the new size: the front's SIGWINCH frame
                         * that says so can come after them. */
                        pty_sync_size(p);
                        p->to_cmd_len = (size_t)k;
                        p->to_cmd_off = 0;
                } else if (k == 0 || (errno != EINTR && errno != EAGAIN))
                        p->in = -1;
        }
        if (master->fd >= 0 && (master->revents & POLLOUT) && p->to_cmd_len) {
                ssize_t k = write(p->master, p->to_cmd + p->to_cmd_off, p->to_cmd_len - p->to_cmd_off);
                if (k > 0 && (p->to_cmd_off += (size_t)k) == p->to_cmd_len)
                        p->to_cmd_len = p->to_cmd_off = 0;
        }
        if (master->fd >= 0 && (master->revents & (POLLIN | POLLHUP | POLLERR)) && p->to_user_len == 0) {
                ssize_t k = read(p->master, p->to_user, sizeof p->to_user);
                if (k > 0) {
                        p->to_user_len = (size_t)k;
                        p->to_user_off = 0;
                } else if (k == 0 || (errno != EINTR && errno != EAGAIN))
                        p->master_gone = true;
        }
        if (out->fd >= 0 && (out->revents & (POLLOUT | POLLERR | POLLHUP)) && p->to_user_len) {
                ssize_t k = write(p->out, p->to_user + p->to_user_off, p->to_user_len - p->to_user_off);
                if (k > 0 && (p->to_user_off += (size_t)k) == p->to_user_len)
                        p->to_user_len = p->to_user_off = 0;
                else if (k < 0 && errno != EINTR && errno != EAGAIN)
                        p->to_user_len = p->to_user_off = 0; /* the caller's terminal is gone */
        }
}

static _Noreturn void command_fail(const char *what, const char *arg, int err) {
        char msg[512];
        int n = snprintf(msg, sizeof msg, "sudo: %s%s%s\n", arg ? arg : "", arg ? ": " : "",
                         err == ENOENT && arg ? "command not found" : what);
        if (err && !(err == ENOENT && arg))
                n = snprintf(msg, sizeof msg, "sudo: %s%s%s: %s\n", arg ? arg : "", arg ? ": " : "", what,
                             strerror(err));
        if (n > 0)
                (void)!write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        _exit(1);
}

/* In the command's child: the caller's descriptors, a session of its own,
 * the target's ids, the directory, the program. */
static _Noreturn void command_exec(const int fds[3], const SudoPty *pty, int ready, const SudoTarget *t,
                                   const gid_t *gids, size_t n_gids, const char *cwd, char **argv, char **env) {
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        for (int s = 1; s < NSIG; s++)
                if (s != SIGKILL && s != SIGSTOP)
                        signal(s, SIG_DFL);
        setsid();
        limits_child_defaults();
        /* Moved above 2 first, so that dup2 never overwrites one not yet moved. */
        int hi[3];
        int tty = pty->slave;
        if (tty >= 0) {
                /* A session leader without a terminal: this one becomes its own. */
                if (ioctl(tty, TIOCSCTTY, 0) < 0)
                        command_fail("terminal", NULL, errno);
                if (pty->have_termios)
                        (void)tcsetattr(tty, TCSANOW, &pty->termios);
        }
        /* The terminal has its session and foreground group now: a ^C
         * relayed from here on reaches this process (command_wait_ready). */
        close(ready);
        for (int i = 0; i < 3; i++)
                if ((hi[i] = fcntl(pty->slave_for[i] && tty >= 0 ? tty : fds[i], F_DUPFD_CLOEXEC, 3)) < 0)
                        command_fail("descriptor", NULL, errno);
        for (int i = 0; i < 3; i++)
                if (dup2(hi[i], i) < 0)
                        command_fail("descriptor", NULL, errno);
        syscall(SYS_close_range, 3U, ~0U, 0U);
        if (setgroups(n_gids, gids) < 0)
                command_fail("setgroups", NULL, errno);
        if (setgid(t->gid) < 0)
                command_fail("setgid", NULL, errno);
        if (setuid(t->uid) < 0)
                command_fail("setuid", NULL, errno);
        if (t->uid != 0 && (setuid(0) == 0 || geteuid() == 0))
                command_fail("setuid", NULL, EPERM);
        if (chdir(cwd) < 0) {
                char msg[PATH_MAX + 64];
                int n = snprintf(msg, sizeof msg, "sudo: unable to change directory to %s: %s\n", cwd,
                                 strerror(errno));
                if (n > 0)
                        (void)!write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
                _exit(1);
        }
        /* argv[0] is looked up in secure_path, the PATH of env. */
        for (size_t i = 0; env[i]; i++)
                if (strncmp(env[i], "PATH=", 5) == 0)
                        setenv("PATH", env[i] + 5, 1);
        const char *prog = argv[0][0] == '-' ? argv[0] + 1 : argv[0];
        char login_prog[256];
        if (argv[0][0] == '-') {
                /* A login shell's argv[0] is "-bash"; it runs the target's shell. */
                snprintf(login_prog, sizeof login_prog, "%s", t->shell);
                prog = login_prog;
        }
        execvpe(prog, argv, env);
        command_fail("", prog, errno);
}

/* Waits until the command's child has its session and, with a terminal,
 * that terminal as its controlling one with its group in the foreground:
 * it closes its end of the pipe then (or ends). Until then the terminal
 * has no foreground group, and a ^C relayed to it would signal nobody and
 * be lost: the caller's bytes (typed as early as the command's start) are
 * left in the caller's terminal until this returns. */
static void command_wait_ready(int ready) {
        char c;
        ssize_t k;
        do
                k = read(ready, &c, 1);
        while (k < 0 && errno == EINTR);
}

int sudo_command_start(const int fds[3], SudoPty *pty, const SudoTarget *t, const gid_t *gids, size_t n_gids,
                       const char *cwd, char **argv, char **env, pid_t *ret_pid) {
        int ready[2];
        if (pipe2(ready, O_CLOEXEC) < 0)
                return -errno;
        pid_t pid = fork();
        if (pid < 0) {
                int e = errno;
                close(ready[0]);
                close(ready[1]);
                return -e;
        }
        if (pid == 0) {
                close(ready[0]);
                command_exec(fds, pty, ready[1], t, gids, n_gids, cwd, argv, env);
        }
        close(ready[1]);
        command_wait_ready(ready[0]);
        close(ready[0]);
        if (pty->master >= 0) {
                close(pty->slave);
                pty->slave = -1;
        }
        *ret_pid = pid;
        return 0;
}

/* Kills the command's group until nothing of it is left (gVisor's kill of
 * a group can miss a child forked at that moment), at most a few seconds. */
static void kill_command(pid_t pid) {
        for (int i = 0; i < 300; i++) {
                if (kill(-pid, SIGKILL) < 0 && errno == ESRCH)
                        return;
                struct timespec ts = { .tv_sec = 0, .tv_nsec = 10 * 1000 * 1000 };
                nanosleep(&ts, NULL);
                (void)waitpid(pid, NULL, WNOHANG);
        }
}

/* One connection, in a process of its own: a front's request, its command,
 * the signals for it, its status. */
static _Noreturn void serve_connection(int fd) {
        int one = 1;
        if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) < 0)
                _exit(0);
        uint64_t deadline = time_now_mono_ms() + GATEWAY_REQUEST_MS;
        SudoHeader h;
        int fds[3] = { -1, -1, -1 };
        struct ucred cred;
        int r = read_header(fd, &h, fds, &cred, deadline);
        if (r < 0)
                refuse(fd, 1, "%s", "malformed request");
        AgentUser sandbox;
        bool sandbox_ok = user_lookup("/etc/passwd", SANDBOX_USER_NAME, &sandbox) == 0;
        /* The image's sudoers: "sandbox ALL=(ALL:ALL) NOPASSWD: ALL", and root. */
        const char *caller;
        if (cred.uid == 0)
                caller = "root";
        else if (sandbox_ok && cred.uid == sandbox.uid)
                caller = SANDBOX_USER_NAME;
        else {
                char uid[16];
                snprintf(uid, sizeof uid, "%u", (unsigned)cred.uid);
                /* Not logged: any process inside could fill the agent's log. */
                refuse(fd, 1, "user with uid %s is not in the sudoers file; only root and the sandbox user "
                              "may use sudo here", uid);
        }
        if ((r = sudo_header_check(&h)) < 0)
                refuse(fd, 1, "%s", r == -E2BIG ? "request too large" : "malformed request");
        char *payload = malloc(h.len ? h.len : 1);
        if (!payload)
                refuse(fd, 1, "%s", "out of memory");
        if (read_exact(fd, payload, h.len, deadline) < 0)
                refuse(fd, 1, "%s", "malformed request");
        SudoRequest req;
        if ((r = sudo_request_parse(&h, payload, &req)) < 0)
                refuse(fd, 1, "%s", r == -E2BIG ? "request too large" : "malformed request");

        const char *target_name = req.user[0] ? req.user : "root";
        if (strcmp(target_name, "#0") == 0)
                target_name = "root";
        if (!user_name_valid(target_name))
                refuse(fd, 1, "unknown user %s", target_name);
        SudoTarget t;
        gid_t gids[GATEWAY_GROUPS_MAX];
        size_t n_gids = 0;
        if (target_lookup(target_name, &t, gids, &n_gids) < 0)
                refuse(fd, 1, "unknown user %s", target_name);
        const char *caller_shell = NULL;
        for (size_t i = 0; i < req.envc; i++)
                if (strncmp(req.env[i], "SHELL=", 6) == 0)
                        caller_shell = req.env[i] + 6;
        char **env = sudo_build_env(&req, &t, caller, cred.uid, cred.gid);
        char **argv = sudo_build_argv(&req, &t, caller_shell);
        if (!env || !argv || !argv[0])
                refuse(fd, 1, "%s", "out of memory");
        const char *cwd = req.flags & SUDO_LOGIN ? t.home : req.cwd;

        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGCHLD);
        sigprocmask(SIG_BLOCK, &mask, NULL);
        int sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        if (sig_fd < 0)
                refuse(fd, 1, "%s", "internal error");
        SudoPty pty;
        if ((r = sudo_pty_open(&pty, fds)) < 0)
                refuse(fd, 1, "cannot make a terminal: %s", strerror(-r));
        pid_t pid;
        if ((r = sudo_command_start(fds, &pty, &t, gids, n_gids, cwd, argv, env, &pid)) < 0)
                refuse(fd, 1, "cannot start the command: %s", strerror(-r));
        if (pty.master >= 0)
                pty_make_raw(&pty);
        else
                for (int i = 0; i < 3; i++)
                        close(fds[i]);

        /* Relay: a front's signal to the command's group; the front gone
         * (killed, its exec timed out) takes the command down with it, as
         * the group kill it was meant for would have. */
        for (;;) {
                struct pollfd p[5] = { { .fd = fd, .events = POLLIN }, { .fd = sig_fd, .events = POLLIN } };
                pty_pollfds(&pty, &p[2], &p[3], &p[4]);
                if (poll(p, 5, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                sudo_pty_relay(&pty, &p[2], &p[3], &p[4]);
                int status;
                if (p[1].revents) {
                        struct signalfd_siginfo si;
                        while (read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si)
                                ;
                        if (waitpid(pid, &status, WNOHANG) == pid) {
                                pty_drain(&pty);
                                pty_restore();
                                (void)send_frame(fd, SUDO_FRAME_EXIT, status, NULL);
                                _exit(0);
                        }
                }
                if (p[0].revents) {
                        SudoFrame f;
                        ssize_t k = recv(fd, &f, sizeof f, MSG_DONTWAIT);
                        if (k < 0 && (errno == EAGAIN || errno == EINTR))
                                continue;
                        /* End of file, an error, or anything but a whole
                         * signal frame: the front is gone or broken. */
                        if (k != (ssize_t)sizeof f || f.type != SUDO_FRAME_SIGNAL || f.len != 0 || f.value <= 0 ||
                            f.value >= NSIG || f.value == SIGKILL || f.value == SIGSTOP) {
                                pty_restore();
                                kill_command(pid);
                                (void)waitpid(pid, &status, 0);
                                _exit(0);
                        }
                        /* A new window size is the command's terminal's, which
                         * signals its foreground itself. */
                        if (f.value == SIGWINCH && pty.master >= 0) {
                                pty_sync_size(&pty);
                                continue;
                        }
                        if (kill(-pid, f.value) < 0 && errno == ESRCH)
                                (void)kill(pid, f.value);
                }
        }
        pty_restore();
        kill_command(pid);
        _exit(0);
}

static _Noreturn void gateway_loop(int listen_fd) {
        size_t running = 0;
        for (;;) {
                while (waitpid(-1, NULL, WNOHANG) > 0)
                        running--;
                struct pollfd p = { .fd = listen_fd, .events = POLLIN };
                /* Ended connections are reaped at least once a second. */
                if (poll(&p, 1, 1000) <= 0)
                        continue;
                int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
                if (fd < 0)
                        continue;
                if (running >= GATEWAY_RUNNING_MAX) {
                        (void)send_frame(fd, SUDO_FRAME_ERROR, 1, "too many sudo commands running in this sandbox");
                        close(fd);
                        continue;
                }
                pid_t pid = fork();
                if (pid == 0) {
                        close(listen_fd);
                        serve_connection(fd);
                }
                if (pid > 0)
                        running++;
                close(fd);
        }
}

static bool gateway_wanted(void) {
        /* Where set-uid works (the microVM; a gVisor that implements it),
         * the image's own sudo does the job. */
        if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1)
                return false;
        struct stat st;
        if (stat("/usr/bin/sudo", &st) < 0 || lstat(SUDO_OFF_PATH, &st) == 0)
                return false;
        AgentUser u;
        return user_lookup("/etc/passwd", SANDBOX_USER_NAME, &u) == 0;
}

/* The front is this binary under the name sudo: a symlink in
 * /usr/local/bin, replaced at each start, never over a file of the
 * image's or the sandbox's own. */
static int place_front(void) {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
                return n < 0 ? -errno : -ENOENT;
        self[n] = '\0';
        int r = fsops_mkdir_p("/usr/local/bin", 0755);
        if (r < 0)
                return r;
        struct stat st;
        if (lstat(SUDO_FRONT_PATH, &st) == 0) {
                if (!S_ISLNK(st.st_mode))
                        return -EEXIST;
                if (unlink(SUDO_FRONT_PATH) < 0)
                        return -errno;
        }
        return symlink(self, SUDO_FRONT_PATH) < 0 ? -errno : 0;
}

/* A front and a socket an earlier start left in the sandbox's files (they
 * outlive a stop) go when the gateway is off now: sudo is then the image's
 * own again. Only a symlink to this binary is ours to remove. */
static void remove_front(void) {
        char self[PATH_MAX], link[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        ssize_t m = readlink(SUDO_FRONT_PATH, link, sizeof link - 1);
        if (n > 0 && m > 0) {
                self[n] = link[m] = '\0';
                if (strcmp(self, link) == 0)
                        (void)unlink(SUDO_FRONT_PATH);
        }
        struct stat st;
        if (lstat(SUDO_SOCKET_PATH, &st) == 0 && S_ISSOCK(st.st_mode))
                (void)unlink(SUDO_SOCKET_PATH);
}

int sudo_gateway_start(pid_t *ret_pid) {
        if (!gateway_wanted()) {
                remove_front();
                *ret_pid = 0;
                return 0;
        }
        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", SUDO_SOCKET_PATH);
        (void)unlink(SUDO_SOCKET_PATH);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
                return -errno;
        /* Anyone inside may connect; the sender's credentials decide. */
        int one = 1;
        if (chmod(SUDO_SOCKET_PATH, 0666) < 0 || setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) < 0 ||
            listen(fd, 64) < 0)
                return -errno;
        int r = place_front();
        if (r < 0)
                gw_log("cannot place %s", -r, SUDO_FRONT_PATH);
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                /* Not the agent's channel (its stdin and stdout on some
                 * drivers): the daemon must see it close when the agent ends. */
                int null = open("/dev/null", O_RDWR | O_CLOEXEC);
                if (null >= 0) {
                        dup2(null, STDIN_FILENO);
                        dup2(null, STDOUT_FILENO);
                }
                int lfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                if (lfd < 0)
                        _exit(1);
                /* Its commands join the work leaf as every command does. */
                limits_close_fds_keeping_cgroup(3, lfd);
                sigset_t all;
                sigemptyset(&all);
                sigprocmask(SIG_SETMASK, &all, NULL);
                signal(SIGCHLD, SIG_DFL);
                signal(SIGTERM, SIG_DFL);
                signal(SIGINT, SIG_DFL);
                signal(SIGPIPE, SIG_IGN);
                setsid();
                (void)prctl(PR_SET_NAME, "sudo-gateway", 0, 0, 0);
                gateway_loop(lfd);
        }
        *ret_pid = pid;
        return 0;
}
