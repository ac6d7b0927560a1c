#include "agent/sudo_front.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/sudo_wire.h"
#include "common/io.h"
#include "common/macro.h"

extern char **environ;

/* How long a connection to the gateway may take: a gateway that is gone
 * is an error at once (ECONNREFUSED, ENOENT), a stuck one after this. */
#define FRONT_CONNECT_MS 10000

/* The signals a terminal, a timeout or :signal send that the command must
 * get too: it is in a session of its own, not in the caller's group. */
static const int relayed[] = { SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM, SIGWINCH, SIGCONT };

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "sudo: ");
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        return 1;
}

static void usage(FILE *f) {
        fprintf(f, "usage: sudo -h | -K | -k | -V\n"
                   "usage: sudo -v [-AknS] [-u user]\n"
                   "usage: sudo -l [-AknS] [-u user] [command]\n"
                   "usage: sudo [-AEHknS] [-u user] [VAR=value] [-i|-s] [<command>]\n"
                   "This sandbox's sudo runs commands through the sandbox's agent: -g, -b, -e, -P, -C, -D, -R,\n"
                   "-T, -r, -t and -U are not supported.\n");
}

static int connect_gateway(int *ret) {
        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", SUDO_SOCKET_PATH);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
                if (errno != EINPROGRESS && errno != EAGAIN)
                        return -errno;
                struct pollfd p = { .fd = fd, .events = POLLOUT };
                if (poll(&p, 1, FRONT_CONNECT_MS) <= 0)
                        return -ETIMEDOUT;
                int err = 0;
                socklen_t l = sizeof err;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err)
                        return -(err ? err : errno);
        }
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
                return -errno;
        *ret = TAKE_FD(fd);
        return 0;
}

/* The header goes with the caller's stdin, stdout and stderr and with its
 * credentials, which the kernel checks (a process may claim only its own
 * pid and ids): the gateway decides on those. */
static int send_request(int fd, const SudoHeader *h, const char *payload) {
        int fds[3] = { STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO };
        struct ucred cred = { .pid = getpid(), .uid = getuid(), .gid = getgid() };
        union {
                char buf[CMSG_SPACE(sizeof fds) + CMSG_SPACE(sizeof cred)];
                struct cmsghdr align;
        } u;
        memset(&u, 0, sizeof u);
        struct iovec iov = { .iov_base = (void *)h, .iov_len = sizeof *h };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof fds);
        memcpy(CMSG_DATA(c), fds, sizeof fds);
        c = CMSG_NXTHDR(&m, c);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_CREDENTIALS;
        c->cmsg_len = CMSG_LEN(sizeof cred);
        memcpy(CMSG_DATA(c), &cred, sizeof cred);
        ssize_t k;
        do
                k = sendmsg(fd, &m, MSG_NOSIGNAL);
        while (k < 0 && errno == EINTR);
        if (k < 0)
                return -errno;
        if ((size_t)k < sizeof *h && io_send_all(fd, (const char *)h + k, sizeof *h - (size_t)k) < 0)
                return -EPIPE;
        return io_send_all(fd, payload, h->len);
}

/* Ends this process as the command ended: its exit code, or its signal. */
static int end_as(int status) {
        if (WIFEXITED(status))
                return WEXITSTATUS(status);
        if (WIFSIGNALED(status)) {
                int sig = WTERMSIG(status);
                signal(sig, SIG_DFL);
                sigset_t one;
                sigemptyset(&one);
                sigaddset(&one, sig);
                sigprocmask(SIG_UNBLOCK, &one, NULL);
                /* No core of the front's own for the command's. */
                if (sig != SIGKILL && sig != SIGSTOP)
                        raise(sig);
                return 128 + sig;
        }
        return 1;
}

static int relay(int fd, int sig_fd) {
        for (;;) {
                struct pollfd p[2] = { { .fd = fd, .events = POLLIN }, { .fd = sig_fd, .events = POLLIN } };
                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        return fail("poll: %s", strerror(errno));
                }
                if (p[1].revents) {
                        struct signalfd_siginfo si;
                        while (read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
                                SudoFrame f = { .type = SUDO_FRAME_SIGNAL, .value = (int32_t)si.ssi_signo };
                                (void)io_send_all(fd, &f, sizeof f);
                        }
                }
                if (!p[0].revents)
                        continue;
                SudoFrame f;
                size_t got = 0;
                int r = io_read_full(fd, &f, sizeof f, &got);
                if (r < 0 || got != sizeof f)
                        return fail("%s", "the sandbox's sudo gateway ended before the command did");
                if (f.type == SUDO_FRAME_EXIT)
                        return end_as(f.value);
                if (f.type == SUDO_FRAME_ERROR) {
                        char msg[SUDO_MESSAGE_MAX + 1];
                        size_t ml = f.len < SUDO_MESSAGE_MAX ? f.len : SUDO_MESSAGE_MAX;
                        if (io_read_full(fd, msg, ml, &got) < 0)
                                got = 0;
                        msg[got] = '\0';
                        fail("%s", msg);
                        return f.value > 0 && f.value < 256 ? f.value : 1;
                }
                return fail("%s", "unexpected answer from the sandbox's sudo gateway");
        }
}

int sudo_front_main(int argc, char **argv) {
        char err[256] = "";
        SudoOptions o;
        if (sudo_parse_options(argc, argv, &o, err, sizeof err) < 0) {
                fail("%s", err);
                usage(stderr);
                return 1;
        }
        _cleanup_free_ char **set = o.set;
        switch (o.action) {
        case SUDO_ACTION_HELP:
                usage(stdout);
                return 0;
        case SUDO_ACTION_VERSION:
                printf("Sudo version 1.9 (runtime sandbox sudo, through the agent's gateway)\n");
                return 0;
        case SUDO_ACTION_VALIDATE:
                return 0;
        case SUDO_ACTION_LIST:
                if (o.argc) {
                        printf("%s\n", o.argv[0]);
                        return 0;
                }
                printf("User %s may run the following commands on this sandbox:\n    (ALL : ALL) NOPASSWD: ALL\n",
                       getenv("USER") ? getenv("USER") : "this user");
                return 0;
        case SUDO_ACTION_RUN:
                break;
        }
        /* A closed stdin, stdout or stderr is passed on as /dev/null. */
        for (int i = 0; i < 3; i++)
                if (fcntl(i, F_GETFD) < 0 && open("/dev/null", O_RDWR) != i)
                        return fail("%s", "cannot open /dev/null");
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
                snprintf(cwd, sizeof cwd, "/");
        SudoHeader h;
        _cleanup_free_ char *payload = NULL;
        int r = sudo_request_encode(&o, cwd, environ, &h, &payload);
        if (r < 0)
                return fail("%s", r == -E2BIG ? "argument list too long" : "out of memory");

        /* The signals to relay are taken from a signalfd from here on. */
        sigset_t mask;
        sigemptyset(&mask);
        for (size_t i = 0; i < ELEMENTSOF(relayed); i++)
                sigaddset(&mask, relayed[i]);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return fail("signals: %s", strerror(errno));
        _cleanup_close_ int sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        if (sig_fd < 0)
                return fail("signals: %s", strerror(errno));

        _cleanup_close_ int fd = -1;
        r = connect_gateway(&fd);
        if (r < 0) {
                fprintf(stderr,
                        "sudo: cannot reach the sandbox's sudo gateway (%s): %s\n"
                        "sudo: this sandbox has no working sudo; ask for user \"root\" in the request instead\n",
                        SUDO_SOCKET_PATH, strerror(-r));
                return 1;
        }
        r = send_request(fd, &h, payload);
        if (r < 0) {
                /* A refusal may already be waiting to be read. */
                int s = relay(fd, sig_fd);
                return s ? s : fail("sending to the sudo gateway: %s", strerror(-r));
        }
        return relay(fd, sig_fd);
}
