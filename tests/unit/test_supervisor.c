/* runtime-supervisor (src/supervisor): the handshake's parser on its own, then
 * the built binary, seccomp filter and all, with socketpairs standing in for
 * the agent's channel (whose host end the test keeps a copy of, as the daemon
 * does) and the daemon's connection, and a listening socket in a temporary
 * directory. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sockios.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/timeutil.h"
#include "proto/proto.h"
#include "supervisor/supervisor.h"

#define SANDBOX_ID "sbx-test_1"
#define NONCE "0123456789abcdef0123456789abcdef"
#define OTHER_NONCE "0123456789abcdef0123456789abcdee"
#define STATE "ns:pid=42,start=1234"
/* How long any one expected event may take. */
#define WAIT_MS 10000

static char supervisor_path[PATH_MAX];

typedef struct Harness {
        char dir[PATH_MAX - 64];
        char sock[PATH_MAX];
        char log[PATH_MAX];
        pid_t pid;
        int pidfd;
        int agent;     /* the test's end of the agent channel: the agent's */
        int chan;      /* the host's end of it, shared with the supervisor: the daemon's */
        int daemon;    /* the test's end of the first daemon's connection */
        int keep_read; /* the read end of the pipe whose write end is kept */
} Harness;

static void find_supervisor(void) {
        char self[PATH_MAX - 64];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
                return;
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (!slash)
                return;
        *slash = '\0';
        /* Beside the tests' folder (build/), else the release one beside
         * a sanitizer build's (build/asan/tests/../../): the sanitizer
         * lane runs the release supervisor, as it runs the release agent. */
        char guess[PATH_MAX];
        snprintf(guess, sizeof guess, "%s/../runtime-supervisor", self);
        if (realpath(guess, supervisor_path) && access(supervisor_path, X_OK) == 0)
                return;
        snprintf(guess, sizeof guess, "%s/../../runtime-supervisor", self);
        if (!realpath(guess, supervisor_path) || access(supervisor_path, X_OK) != 0) {
                fprintf(stderr, "%s is missing: run `make build/runtime-supervisor` first; skipping\n", guess);
                supervisor_path[0] = '\0';
        }
}

static int64_t ms_left(uint64_t deadline) {
        uint64_t now = time_now_mono_ms();
        return now >= deadline ? 0 : (int64_t)(deadline - now);
}

/* 1 when fd has the event before the deadline, 0 when not. */
static int wait_fd(int fd, short events, uint64_t deadline) {
        for (;;) {
                struct pollfd p = { .fd = fd, .events = events };
                int n = poll(&p, 1, (int)ms_left(deadline));
                if (n < 0 && errno == EINTR)
                        continue;
                assert_true(n >= 0);
                return n > 0;
        }
}

/* 0, -ETIMEDOUT, or -EPIPE at end of file. */
static int read_exact(int fd, void *buf, size_t n, int timeout_ms) {
        uint64_t deadline = time_now_mono_ms() + (uint64_t)timeout_ms;
        size_t got = 0;
        while (got < n) {
                if (!wait_fd(fd, POLLIN, deadline))
                        return -ETIMEDOUT;
                ssize_t k = read(fd, (uint8_t *)buf + got, n - got);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return errno == ECONNRESET ? -EPIPE : -errno;
                if (k == 0)
                        return -EPIPE;
                got += (size_t)k;
        }
        return 0;
}

static void send_all(int fd, const void *buf, size_t n) {
        const uint8_t *p = buf;
        while (n > 0) {
                ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
                if (k < 0 && errno == EINTR)
                        continue;
                assert_true(k > 0);
                p += k;
                n -= (size_t)k;
        }
}

static void send_frame(int fd, uint8_t type, uint8_t flags, uint32_t stream, const void *payload, size_t len) {
        assert_int_equal(proto_write_frame(fd, type, flags, stream, payload, len), 0);
}

static void send_text(int fd, uint8_t type, uint32_t stream, const char *text) {
        send_frame(fd, type, 0, stream, text, strlen(text));
}

/* The next frame on fd, whole; its payload in *ret (malloc'ed). */
static ProtoHeader recv_frame(int fd, uint8_t **ret) {
        uint8_t head[PROTO_HEADER_SIZE];
        assert_int_equal(read_exact(fd, head, sizeof head, WAIT_MS), 0);
        ProtoHeader h;
        assert_int_equal(proto_header_decode(head, &h), 0);
        uint8_t *payload = malloc(h.length + 1);
        assert_non_null(payload);
        assert_int_equal(read_exact(fd, payload, h.length, WAIT_MS), 0);
        payload[h.length] = '\0';
        if (ret)
                *ret = payload;
        else
                free(payload);
        return h;
}

static void expect_text(int fd, uint8_t type, uint32_t stream, const char *text) {
        uint8_t *payload;
        ProtoHeader h = recv_frame(fd, &payload);
        assert_int_equal(h.type, type);
        assert_int_equal(h.stream, stream);
        assert_string_equal((char *)payload, text);
        free(payload);
}

static void expect_detach(int fd) {
        ProtoHeader h = recv_frame(fd, NULL);
        assert_int_equal(h.type, PROTO_DETACH);
        assert_int_equal(h.stream, 0);
        assert_int_equal(h.length, 0);
}

static void expect_eof(int fd) {
        uint8_t c;
        assert_int_equal(read_exact(fd, &c, 1, WAIT_MS), -EPIPE);
}

/* Until the peer of fd (a unix stream socket) has read all we sent: the
 * supervisor has taken it in. */
static void wait_consumed(int fd) {
        uint64_t deadline = time_now_mono_ms() + WAIT_MS;
        for (;;) {
                int queued = -1;
                assert_int_equal(ioctl(fd, SIOCOUTQ, &queued), 0);
                if (queued == 0)
                        return;
                assert_true(ms_left(deadline) > 0);
                struct timespec ts = { 0, 1000000 };
                nanosleep(&ts, NULL);
        }
}

static void start(Harness *h, bool with_keep) {
        if (!supervisor_path[0]) {
                print_message("skipped: runtime-supervisor is not built (make build/runtime-supervisor)\n");
                skip();
        }
        memset(h, 0, sizeof *h);
        const char *tmp = getenv("TMPDIR");
        snprintf(h->dir, sizeof h->dir, "%s/supervisor-test-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        assert_non_null(mkdtemp(h->dir));
        snprintf(h->sock, sizeof h->sock, "%s/supervisor.sock", h->dir);
        snprintf(h->log, sizeof h->log, "%s/stderr.log", h->dir);

        int listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(listen_fd >= 0);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        assert_true(strlen(h->sock) < sizeof sa.sun_path);
        strcpy(sa.sun_path, h->sock);
        assert_int_equal(bind(listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
        assert_int_equal(listen(listen_fd, 4), 0);
        int agent[2], daemon[2], keep[2] = { -1, -1 };
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, agent), 0);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, daemon), 0);
        if (with_keep)
                assert_int_equal(pipe2(keep, O_CLOEXEC), 0);
        int log_fd = open(h->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_true(log_fd >= 0);
        int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        assert_true(null_fd >= 0);

        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                int src[] = { null_fd, null_fd, log_fd, agent[1], listen_fd, daemon[1], keep[1] };
                size_t n = with_keep ? 7 : 6;
                int parked[7];
                for (size_t i = 0; i < n; i++)
                        if ((parked[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 100)) < 0)
                                _exit(127);
                for (size_t i = 0; i < n; i++)
                        if (dup2(parked[i], (int)i) < 0)
                                _exit(127);
                char *argv[] = { supervisor_path, "--sandbox", SANDBOX_ID, "--keep", with_keep ? "1" : "0",
                                 "--state", STATE, NULL };
                char *envp[] = { "RUNTIME_SUPERVISOR_NONCE=" NONCE, NULL };
                execve(supervisor_path, argv, envp);
                _exit(127);
        }
        close(listen_fd);
        close(daemon[1]);
        close(log_fd);
        close(null_fd);
        if (with_keep)
                close(keep[1]);
        h->pid = pid;
        h->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        assert_true(h->pidfd >= 0);
        h->agent = agent[0];
        h->chan = fcntl(agent[1], F_DUPFD_CLOEXEC, 3);
        assert_true(h->chan >= 0);
        close(agent[1]);
        h->daemon = daemon[0];
        h->keep_read = keep[0];
}

/* The supervisor's exit status, waiting for it to end. */
static int wait_exit(Harness *h) {
        assert_true(wait_fd(h->pidfd, POLLIN, time_now_mono_ms() + WAIT_MS));
        int status;
        assert_int_equal(waitpid(h->pid, &status, 0), h->pid);
        h->pid = 0;
        return status;
}

static char *read_log(const Harness *h) {
        static char text[1 << 16];
        int fd = open(h->log, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        ssize_t n = read(fd, text, sizeof text - 1);
        assert_true(n >= 0);
        text[n] = '\0';
        close(fd);
        return text;
}

/* Ends the supervisor (the agent's side closing) unless it has ended
 * already, checks its log, and cleans up. */
static void stop(Harness *h) {
        if (h->pid > 0) {
                close(h->agent);
                h->agent = -1;
                /* Still attached, it learns of the agent's end only once
                 * nobody holds the host's end open but itself. */
                if (h->chan >= 0)
                        close(h->chan);
                h->chan = -1;
                int status = wait_exit(h);
                assert_true(WIFEXITED(status));
                assert_int_equal(WEXITSTATUS(status), 0);
        }
        static const char prefix[] = "runtime-supervisor[" SANDBOX_ID "]: ";
        const char *log = read_log(h);
        assert_non_null(strstr(log, "runtime-supervisor[" SANDBOX_ID "]: started"));
        assert_null(strstr(log, NONCE));
        for (const char *line = log; *line;) {
                assert_int_equal(strncmp(line, prefix, sizeof prefix - 1), 0);
                const char *nl = strchr(line, '\n');
                assert_non_null(nl);
                line = nl + 1;
        }
        if (h->agent >= 0)
                close(h->agent);
        if (h->chan >= 0)
                close(h->chan);
        if (h->daemon >= 0)
                close(h->daemon);
        if (h->keep_read >= 0)
                close(h->keep_read);
        close(h->pidfd);
        unlink(h->log);
        unlink(h->sock);
        rmdir(h->dir);
}

static int connect_socket(const Harness *h) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        strcpy(sa.sun_path, h->sock);
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        return fd;
}

/* Reads the answer line a byte at a time, as the daemon does: nothing past
 * it is taken. The fds come with its first byte. */
static void read_reply(int fd, char *line, size_t cap, int *fds, size_t *n_fds) {
        uint64_t deadline = time_now_mono_ms() + WAIT_MS;
        size_t len = 0;
        *n_fds = 0;
        for (;;) {
                assert_true(wait_fd(fd, POLLIN, deadline));
                char c;
                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * 8)];
                } control;
                struct iovec iov = { .iov_base = &c, .iov_len = 1 };
                struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
                if (len == 0) {
                        msg.msg_control = control.buf;
                        msg.msg_controllen = sizeof control.buf;
                }
                ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
                assert_int_equal(n, 1);
                if (len == 0)
                        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
                                assert_int_equal(cm->cmsg_type, SCM_RIGHTS);
                                size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                                memcpy(fds + *n_fds, CMSG_DATA(cm), k * sizeof(int));
                                *n_fds += k;
                        }
                if (c == '\n') {
                        line[len] = '\0';
                        return;
                }
                assert_true(len + 1 < cap);
                line[len++] = c;
        }
}

/* Sends text on a new connection and expects the refusal `no` and the
 * connection's end. */
static void expect_refusal(const Harness *h, const char *text, size_t len, const char *no) {
        int fd = connect_socket(h);
        send_all(fd, text, len);
        char line[1024];
        int fds[8];
        size_t n_fds;
        read_reply(fd, line, sizeof line, fds, &n_fds);
        assert_string_equal(line, no);
        assert_int_equal(n_fds, 0);
        expect_eof(fd);
        close(fd);
}

/* A right handshake: the new daemon's connection, its OK line checked; the
 * agent channel it was handed in *ret_chan and the kept fd in *ret_fd (each
 * closed when NULL). */
static int attach(const Harness *h, int *ret_chan, int *ret_fd) {
        int fd = connect_socket(h);
        const char *text = "ATTACH 2 " SANDBOX_ID " " NONCE "\n";
        send_all(fd, text, strlen(text));
        char line[1024], want[1024];
        int fds[8];
        size_t n_fds;
        read_reply(fd, line, sizeof line, fds, &n_fds);
        size_t n_keep = h->keep_read >= 0 ? 1 : 0;
        snprintf(want, sizeof want, "OK 2 %d %zu " STATE, (int)h->pid, n_keep);
        assert_string_equal(line, want);
        assert_int_equal(n_fds, 1 + n_keep);
        if (ret_chan)
                *ret_chan = fds[0];
        else
                close(fds[0]);
        if (ret_fd)
                *ret_fd = n_keep ? fds[1] : -1;
        else if (n_keep)
                close(fds[1]);
        return fd;
}

/* Nothing to read on fd now (after the bytes sent to its peer were taken). */
static void expect_nothing(int fd) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        assert_int_equal(poll(&p, 1, 0), 0);
}

static void test_handshake_parse(void **state) {
        unsigned v = 0;
        const char *ok = "ATTACH 2 " SANDBOX_ID " " NONCE "\n";
        assert_int_equal(supervisor_handshake_parse(ok, strlen(ok), SANDBOX_ID, NONCE, &v), 0);
        assert_int_equal(v, 2);
        const char *leading_zero = "ATTACH 02 " SANDBOX_ID " " NONCE "\n";
        assert_int_equal(supervisor_handshake_parse(leading_zero, strlen(leading_zero), SANDBOX_ID, NONCE, &v), 0);

        static const struct {
                const char *line;
                int want;
        } cases[] = {
                { "ATTACH 2 " SANDBOX_ID " " OTHER_NONCE "\n", -EPERM },
                { "ATTACH 2 sbx-other " NONCE "\n", -EPERM },
                { "ATTACH 2 " SANDBOX_ID " " NONCE "0\n", -EPERM },
                { "ATTACH 2 " SANDBOX_ID " 0123\n", -EPERM },
                { "ATTACH 3 " SANDBOX_ID " " NONCE "\n", -EPROTONOSUPPORT },
                /* The first version relayed frames: not spoken any more. */
                { "ATTACH 1 " SANDBOX_ID " " NONCE "\n", -EPROTONOSUPPORT },
                { "ATTACH 0 " SANDBOX_ID " " NONCE "\n", -EPROTONOSUPPORT },
                { "ATTACH 7 anything at all, laid out otherwise\n", -EPROTONOSUPPORT },
                { "ATTACH 2 " SANDBOX_ID " " NONCE, -EBADMSG },
                { "ATTACH 2 " SANDBOX_ID " " NONCE " \n", -EBADMSG },
                { "ATTACH 2 " SANDBOX_ID " " NONCE " extra\n", -EBADMSG },
                { "ATTACH 2  " SANDBOX_ID " " NONCE "\n", -EBADMSG },
                { "ATTACH 2 " SANDBOX_ID "\n", -EBADMSG },
                { "ATTACH 2\n", -EBADMSG },
                { "ATTACH 2 \n", -EBADMSG },
                { "ATTACH x " SANDBOX_ID " " NONCE "\n", -EBADMSG },
                { "ATTACH -1 " SANDBOX_ID " " NONCE "\n", -EBADMSG },
                { "ATTACH 2x " SANDBOX_ID " " NONCE "\n", -EBADMSG },
                { "ATTACH 9999999999 " SANDBOX_ID " " NONCE "\n", -EBADMSG },
                { "ATTACH  2 " SANDBOX_ID " " NONCE "\n", -EBADMSG },
                { "attach 2 " SANDBOX_ID " " NONCE "\n", -EBADMSG },
                { "HELLO\n", -EBADMSG },
                { "\n", -EBADMSG },
                { "", -EBADMSG },
                { "ATTACH 2 " SANDBOX_ID "\t" NONCE "\n", -EBADMSG },
                { "ATTACH 2 " SANDBOX_ID " " NONCE "\r\n", -EBADMSG },
                { "ATTACH 2 " SANDBOX_ID " \x80" NONCE "\n", -EBADMSG },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                v = 99;
                int r = supervisor_handshake_parse(cases[i].line, strlen(cases[i].line), SANDBOX_ID, NONCE, &v);
                if (r != cases[i].want)
                        fail_msg("\"%s\": %d, not %d", cases[i].line, r, cases[i].want);
                assert_int_equal(v, 99);
        }

        /* A NUL inside the line, and the length limit with its '\n'. */
        char nul[] = "ATTACH 2 " SANDBOX_ID " " NONCE "\n";
        nul[3] = '\0';
        assert_int_equal(supervisor_handshake_parse(nul, sizeof nul - 1, SANDBOX_ID, NONCE, &v), -EBADMSG);
        char long_line[SUPERVISOR_LINE_MAX + 2];
        int n = snprintf(long_line, sizeof long_line, "ATTACH 2 " SANDBOX_ID " %s\n", "");
        memset(long_line + n - 1, 'a', sizeof long_line - (size_t)n);
        long_line[SUPERVISOR_LINE_MAX - 1] = '\n';
        assert_int_equal(supervisor_handshake_parse(long_line, SUPERVISOR_LINE_MAX, SANDBOX_ID, NONCE, &v), -EPERM);
        long_line[SUPERVISOR_LINE_MAX - 1] = 'a';
        long_line[SUPERVISOR_LINE_MAX] = '\n';
        assert_int_equal(supervisor_handshake_parse(long_line, SUPERVISOR_LINE_MAX + 1, SANDBOX_ID, NONCE, &v),
                         -EBADMSG);
}

static void test_argument_checks(void **state) {
        assert_true(supervisor_id_valid("a"));
        assert_true(supervisor_id_valid("sbx_0-9"));
        assert_false(supervisor_id_valid(""));
        assert_false(supervisor_id_valid("Sbx"));
        assert_false(supervisor_id_valid("sbx/1"));
        assert_false(supervisor_id_valid(NULL));
        char id[SUPERVISOR_ID_MAX + 2];
        memset(id, 'a', sizeof id);
        id[SUPERVISOR_ID_MAX] = '\0';
        assert_true(supervisor_id_valid(id));
        id[SUPERVISOR_ID_MAX] = 'a';
        id[SUPERVISOR_ID_MAX + 1] = '\0';
        assert_false(supervisor_id_valid(id));

        assert_true(supervisor_nonce_valid(NONCE));
        assert_false(supervisor_nonce_valid("0123456789ABCDEF0123456789abcdef"));
        assert_false(supervisor_nonce_valid("0123456789abcdef"));
        assert_false(supervisor_nonce_valid(NONCE "0"));
        assert_false(supervisor_nonce_valid(NULL));

        assert_true(supervisor_state_valid(STATE));
        assert_true(supervisor_state_valid(""));
        assert_false(supervisor_state_valid("a b"));
        assert_false(supervisor_state_valid("a\nb"));
        char st[SUPERVISOR_STATE_MAX + 2];
        memset(st, 'x', sizeof st);
        st[SUPERVISOR_STATE_MAX] = '\0';
        assert_true(supervisor_state_valid(st));
        st[SUPERVISOR_STATE_MAX] = 'x';
        st[SUPERVISOR_STATE_MAX + 1] = '\0';
        assert_false(supervisor_state_valid(st));
}

/* The binary's exit status for a command line and environment; its stderr
 * is dropped. */
static int run_binary(char *const argv[], char *const envp[]) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                int null_fd = open("/dev/null", O_RDWR);
                dup2(null_fd, 0);
                dup2(null_fd, 1);
                dup2(null_fd, 2);
                syscall(SYS_close_range, 3U, ~0U, 0U);
                execve(argv[0], argv, envp);
                _exit(127);
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        return WEXITSTATUS(status);
}

static void test_bad_arguments(void **state) {
        if (!supervisor_path[0]) {
                print_message("skipped: runtime-supervisor is not built (make build/runtime-supervisor)\n");
                skip();
        }
        char *p = supervisor_path;
        char *env[] = { "RUNTIME_SUPERVISOR_NONCE=" NONCE, NULL };
        char *no_env[] = { NULL };
        char *bad_env[] = { "RUNTIME_SUPERVISOR_NONCE=0123", NULL };
        char *a1[] = { p, "--sandbox", SANDBOX_ID, "--keep", "0", NULL };
        assert_int_equal(run_binary(a1, no_env), 2);
        assert_int_equal(run_binary(a1, bad_env), 2);
        char *a2[] = { p, "--sandbox", "Bad/Id", "--keep", "0", NULL };
        assert_int_equal(run_binary(a2, env), 2);
        char *a3[] = { p, "--sandbox", SANDBOX_ID, "--keep", "x", NULL };
        assert_int_equal(run_binary(a3, env), 2);
        char *a4[] = { p, "--sandbox", SANDBOX_ID, NULL };
        assert_int_equal(run_binary(a4, env), 2);
        char *a5[] = { p, "--sandbox", SANDBOX_ID, "--keep", "0", "--state", "a b", NULL };
        assert_int_equal(run_binary(a5, env), 2);
        char *a6[] = { p, "--sandbox", SANDBOX_ID, "--keep", "0", "--bogus", NULL };
        assert_int_equal(run_binary(a6, env), 2);
        char *a7[] = { p, "--sandbox", SANDBOX_ID, "--keep", "0", "stray", NULL };
        assert_int_equal(run_binary(a7, env), 2);
        /* Good arguments, but fds 3, 4 and 5 are not open. */
        assert_int_equal(run_binary(a1, env), 2);
}

/* While a daemon is attached, the channel is the daemon's alone: what the
 * agent sends reaches the daemon's end, the largest frame and a burst of
 * small ones, none taken by the supervisor. */
static void test_attached_daemon_owns_the_channel(void **state) {
        Harness h;
        start(&h, false);
        send_text(h.chan, PROTO_PING, 0, "ping");
        expect_text(h.agent, PROTO_PING, 0, "ping");
        send_text(h.agent, PROTO_PONG, 0, "ping");
        expect_text(h.chan, PROTO_PONG, 0, "ping");

        uint8_t *big = malloc(PROTO_MAX_PAYLOAD);
        assert_non_null(big);
        for (size_t i = 0; i < PROTO_MAX_PAYLOAD; i++)
                big[i] = (uint8_t)(i * 7 + i / 251);
        uint8_t burst[200 * (PROTO_HEADER_SIZE + 4)];
        for (uint32_t i = 0; i < 200; i++) {
                ProtoHeader hd = { .length = 4, .stream = 2 * i + 1, .type = PROTO_WINDOW };
                uint8_t *f = burst + i * (PROTO_HEADER_SIZE + 4);
                assert_int_equal(proto_header_encode(&hd, f), 0);
                proto_put_u32(f + PROTO_HEADER_SIZE, i);
        }
        for (int round = 0; round < 3; round++) {
                pid_t child = fork();
                assert_true(child >= 0);
                if (child == 0) {
                        if (proto_write_frame(h.agent, PROTO_DATA, PROTO_FD_OUT, 3, big, PROTO_MAX_PAYLOAD) < 0)
                                _exit(1);
                        size_t off = 0;
                        while (off < sizeof burst) {
                                ssize_t n = write(h.agent, burst + off, sizeof burst - off);
                                if (n <= 0)
                                        _exit(2);
                                off += (size_t)n;
                        }
                        _exit(0);
                }
                uint8_t *got;
                ProtoHeader hd = recv_frame(h.chan, &got);
                assert_int_equal(hd.type, PROTO_DATA);
                assert_int_equal(hd.length, PROTO_MAX_PAYLOAD);
                assert_memory_equal(got, big, PROTO_MAX_PAYLOAD);
                free(got);
                for (uint32_t i = 0; i < 200; i++) {
                        hd = recv_frame(h.chan, &got);
                        assert_int_equal(hd.type, PROTO_WINDOW);
                        assert_int_equal(hd.stream, 2 * i + 1);
                        assert_int_equal(proto_get_u32(got), i);
                        free(got);
                }
                int status;
                assert_int_equal(waitpid(child, &status, 0), child);
                assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        free(big);
        assert_null(strstr(read_log(&h), "detached"));
        stop(&h);
}

/* A status line of /proc/<pid>/status, the value after the tab. */
static void status_field(pid_t pid, const char *name, char *out, size_t cap) {
        char path[64], text[8192];
        snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        ssize_t n = read(fd, text, sizeof text - 1);
        close(fd);
        assert_true(n > 0);
        text[n] = '\0';
        char key[64];
        snprintf(key, sizeof key, "\n%s:\t", name);
        const char *at = strstr(text, key);
        assert_non_null(at);
        at += strlen(key);
        size_t len = strcspn(at, "\n");
        assert_true(len < cap);
        memcpy(out, at, len);
        out[len] = '\0';
}

static void test_privileges_dropped(void **state) {
        Harness h;
        start(&h, false);
        /* Its loop answers only once the privileges are gone and the filter
         * is in. */
        const char *right = "ATTACH 2 " SANDBOX_ID " " NONCE "\n";
        expect_refusal(&h, right, strlen(right), "NO busy");
        char v[64];
        status_field(h.pid, "Seccomp", v, sizeof v);
        assert_string_equal(v, "2");
        status_field(h.pid, "NoNewPrivs", v, sizeof v);
        assert_string_equal(v, "1");
        static const char *const empty[] = { "CapInh", "CapPrm", "CapEff", "CapAmb" };
        for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
                status_field(h.pid, empty[i], v, sizeof v);
                assert_string_equal(v, "0000000000000000");
        }
        /* The bounding set can be emptied only by a process that holds
         * CAP_SETPCAP; the supervisor has it when we do. */
        status_field(getpid(), "CapEff", v, sizeof v);
        if (strtoull(v, NULL, 16) & (1ull << 8)) {
                status_field(h.pid, "CapBnd", v, sizeof v);
                assert_string_equal(v, "0000000000000000");
        }
        /* Its uid is ours. */
        status_field(h.pid, "Uid", v, sizeof v);
        char want[64];
        snprintf(want, sizeof want, "%u\t", (unsigned)getuid());
        assert_int_equal(strncmp(v, want, strlen(want)), 0);
        stop(&h);
}

/* The daemon goes: the agent gets DETACH (no payload) next, and what it
 * sends from then on is read and dropped, whatever it is. */
static void test_daemon_leaves(void **state) {
        Harness h;
        start(&h, false);
        close(h.daemon);
        h.daemon = -1;
        expect_detach(h.agent);
        /* The daemon that left held the host's end too; it is gone. */
        close(h.chan);
        h.chan = -1;
        send_text(h.agent, PROTO_EVENT, 2, "lost");
        uint8_t garbage[5000];
        memset(garbage, 0xff, sizeof garbage);
        send_all(h.agent, garbage, sizeof garbage);
        wait_consumed(h.agent);
        assert_non_null(strstr(read_log(&h), "detached: the daemon left (its connection closed)"));
        stop(&h);
}

/* The connection carries nothing after the handshake: a byte on it is the
 * daemon's going too. */
static void test_daemon_byte_detaches(void **state) {
        Harness h;
        start(&h, false);
        send_all(h.daemon, "x", 1);
        expect_detach(h.agent);
        expect_eof(h.daemon);
        assert_non_null(strstr(read_log(&h), "it sent bytes after its handshake"));
        stop(&h);
}

/* The agent reads nothing while its daemon goes: the DETACH waits for room
 * and comes whole, after every byte the daemon wrote. */
static void test_detach_waits_for_room(void **state) {
        Harness h;
        start(&h, false);
        int fl = fcntl(h.chan, F_GETFL);
        assert_int_equal(fcntl(h.chan, F_SETFL, fl | O_NONBLOCK), 0);
        uint8_t frame[PROTO_HEADER_SIZE + 1000];
        ProtoHeader hd = { .length = 1000, .stream = 1, .type = PROTO_DATA, .flags = PROTO_FD_IN };
        assert_int_equal(proto_header_encode(&hd, frame), 0);
        memset(frame + PROTO_HEADER_SIZE, 'f', 1000);
        size_t frames = 0;
        for (;;) {
                ssize_t n = send(h.chan, frame, sizeof frame, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n < 0 && errno == EAGAIN)
                        break;
                /* A unix stream socket takes a write this small whole or not at all. */
                assert_int_equal(n, (ssize_t)sizeof frame);
                frames++;
        }
        close(h.chan);
        h.chan = -1;
        close(h.daemon);
        h.daemon = -1;
        /* The supervisor has seen the daemon go, and waits. */
        uint64_t deadline = time_now_mono_ms() + WAIT_MS;
        while (!strstr(read_log(&h), "detached")) {
                assert_true(ms_left(deadline) > 0);
                struct timespec ts = { 0, 1000000 };
                nanosleep(&ts, NULL);
        }
        for (size_t i = 0; i < frames; i++) {
                uint8_t *got;
                ProtoHeader g = recv_frame(h.agent, &got);
                assert_int_equal(g.type, PROTO_DATA);
                assert_int_equal(g.length, 1000);
                free(got);
        }
        expect_detach(h.agent);
        stop(&h);
}

static void test_reattach(void **state) {
        Harness h;
        start(&h, true);
        const char *wrong_nonce = "ATTACH 2 " SANDBOX_ID " " OTHER_NONCE "\n";
        expect_refusal(&h, wrong_nonce, strlen(wrong_nonce), "NO nonce");
        const char *wrong_id = "ATTACH 2 sbx-other " NONCE "\n";
        expect_refusal(&h, wrong_id, strlen(wrong_id), "NO nonce");
        const char *right = "ATTACH 2 " SANDBOX_ID " " NONCE "\n";
        expect_refusal(&h, right, strlen(right), "NO busy");
        expect_refusal(&h, "HELLO\n", 6, "NO malformed");
        const char *newer = "ATTACH 3 " SANDBOX_ID " " NONCE "\n";
        expect_refusal(&h, newer, strlen(newer), "NO version 2");
        const char *first = "ATTACH 1 " SANDBOX_ID " " NONCE "\n";
        expect_refusal(&h, first, strlen(first), "NO version 2");
        char over[SUPERVISOR_LINE_MAX + 10];
        memset(over, 'A', sizeof over);
        expect_refusal(&h, over, sizeof over, "NO malformed");
        /* The first daemon kept its channel through all that. */
        send_text(h.chan, PROTO_PING, 0, "still");
        expect_text(h.agent, PROTO_PING, 0, "still");

        close(h.daemon);
        h.daemon = -1;
        close(h.chan);
        h.chan = -1;
        expect_detach(h.agent);

        /* A handshake in two pieces. */
        int conn = connect_socket(&h);
        send_all(conn, "ATTA", 4);
        wait_consumed(conn);
        const char *rest = "CH 2 " SANDBOX_ID " " NONCE "\n";
        send_all(conn, rest, strlen(rest));
        char line[1024], want[1024];
        int fds[8];
        size_t n_fds;
        read_reply(conn, line, sizeof line, fds, &n_fds);
        snprintf(want, sizeof want, "OK 2 %d 1 " STATE, (int)h.pid);
        assert_string_equal(line, want);
        assert_int_equal(n_fds, 2);

        /* The first fd handed back is the agent's channel, both ways. */
        int chan = fds[0];
        send_text(chan, PROTO_OPEN, 1, "{\"a\"}");
        expect_text(h.agent, PROTO_OPEN, 1, "{\"a\"}");
        send_text(h.agent, PROTO_PONG, 0, "back");
        expect_text(chan, PROTO_PONG, 0, "back");
        /* The second is the kept pipe's write end. */
        assert_int_equal(write(fds[1], "k", 1), 1);
        close(fds[1]);
        char c = 0;
        assert_int_equal(read_exact(h.keep_read, &c, 1, WAIT_MS), 0);
        assert_int_equal(c, 'k');

        /* And once more, after this daemon leaves too. */
        close(conn);
        close(chan);
        expect_detach(h.agent);
        int kept = -1;
        conn = attach(&h, &chan, &kept);
        assert_true(kept >= 0);
        close(kept);
        send_text(h.agent, PROTO_PONG, 0, "third");
        expect_text(chan, PROTO_PONG, 0, "third");
        close(chan);
        close(conn);
        expect_detach(h.agent);

        const char *log = read_log(&h);
        assert_non_null(strstr(log, "attached: protocol 2"));
        assert_non_null(strstr(log, "refused an attach: a wrong sandbox id or nonce"));
        assert_non_null(strstr(log, "refused an attach: a daemon is attached"));
        assert_non_null(strstr(log, "refused an attach: a protocol version it does not speak"));
        stop(&h);
}

/* What the agent sent while detached stays dropped: a daemon that attaches
 * gets only what comes after its attach (the agent's echo of its own DETACH
 * tells it where its frames begin). */
static void test_detached_drops_agent_bytes(void **state) {
        Harness h;
        start(&h, false);
        close(h.daemon);
        h.daemon = -1;
        close(h.chan);
        h.chan = -1;
        expect_detach(h.agent);
        uint8_t half[PROTO_HEADER_SIZE + 4];
        ProtoHeader hd = { .length = 10, .stream = 4, .type = PROTO_EVENT };
        assert_int_equal(proto_header_encode(&hd, half), 0);
        memcpy(half + PROTO_HEADER_SIZE, "half", 4);
        send_all(h.agent, half, sizeof half);
        wait_consumed(h.agent);
        int chan = -1;
        int conn = attach(&h, &chan, NULL);
        expect_nothing(chan);
        send_text(h.agent, PROTO_EVENT, 2, "kept");
        expect_text(chan, PROTO_EVENT, 2, "kept");
        close(chan);
        close(conn);
        stop(&h);
}

static void test_agent_eof_exits(void **state) {
        Harness h;
        start(&h, true);
        close(h.agent);
        h.agent = -1;
        /* The daemon's copy of the host's end sees the agent's end; the
         * supervisor sees it once that copy is closed too. */
        expect_eof(h.chan);
        close(h.chan);
        h.chan = -1;
        int status = wait_exit(&h);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        expect_eof(h.daemon);
        /* Its socket no longer answers, and the kept fd is closed with it. */
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        strcpy(sa.sun_path, h.sock);
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), -1);
        assert_int_equal(errno, ECONNREFUSED);
        close(fd);
        char c;
        assert_int_equal(read_exact(h.keep_read, &c, 1, WAIT_MS), -EPIPE);
        assert_non_null(strstr(read_log(&h), "exiting"));
        stop(&h);
}

static void test_agent_eof_while_detached_exits(void **state) {
        Harness h;
        start(&h, false);
        close(h.daemon);
        h.daemon = -1;
        close(h.chan);
        h.chan = -1;
        expect_detach(h.agent);
        close(h.agent);
        h.agent = -1;
        int status = wait_exit(&h);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        stop(&h);
}

/* The daemon ends the agent's channel on purpose (shutdown, as after a
 * malformed frame from the agent): the supervisor ends with it. */
static void test_daemon_shutdown_ends_it(void **state) {
        Harness h;
        start(&h, false);
        assert_int_equal(shutdown(h.chan, SHUT_RDWR), 0);
        int status = wait_exit(&h);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        expect_eof(h.agent);
        expect_eof(h.daemon);
        stop(&h);
}

static void test_sigterm_exits(void **state) {
        Harness h;
        start(&h, false);
        const char *right = "ATTACH 2 " SANDBOX_ID " " NONCE "\n";
        expect_refusal(&h, right, strlen(right), "NO busy");
        assert_int_equal(kill(h.pid, SIGTERM), 0);
        int status = wait_exit(&h);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        expect_eof(h.daemon);
        /* The daemon's channel lives on without it. */
        send_text(h.chan, PROTO_PING, 0, "on");
        expect_text(h.agent, PROTO_PING, 0, "on");
        stop(&h);
}

/* A peer of another uid is closed on at once, even with the right
 * handshake. Needs root, to connect as someone else. */
static void test_peer_uid_checked(void **state) {
        if (geteuid() != 0) {
                print_message("skipped: needs root, to connect as another uid\n");
                skip();
        }
        Harness h;
        start(&h, false);
        close(h.daemon);
        h.daemon = -1;
        expect_detach(h.agent);
        assert_int_equal(chmod(h.dir, 0755), 0);
        assert_int_equal(chmod(h.sock, 0666), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
                        _exit(10);
                int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
                struct sockaddr_un sa = { .sun_family = AF_UNIX };
                strcpy(sa.sun_path, h.sock);
                if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
                        _exit(11);
                const char *line = "ATTACH 2 " SANDBOX_ID " " NONCE "\n";
                (void)!send(fd, line, strlen(line), MSG_NOSIGNAL);
                char c;
                struct pollfd p = { .fd = fd, .events = POLLIN };
                if (poll(&p, 1, WAIT_MS) != 1)
                        _exit(12);
                ssize_t n = read(fd, &c, 1);
                _exit(n == 0 || (n < 0 && errno == ECONNRESET) ? 0 : 13);
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        assert_non_null(strstr(read_log(&h), "refused a connection from uid 65534"));
        /* Our own uid still gets in. */
        int conn = attach(&h, NULL, NULL);
        close(conn);
        stop(&h);
}

/* Stopped and continued while it waits with a timeout (a handshake is
 * pending): the kernel resumes its poll through restart_syscall, which the
 * filter must allow. */
static void test_stop_and_continue(void **state) {
        Harness h;
        start(&h, false);
        close(h.daemon);
        h.daemon = -1;
        close(h.chan);
        h.chan = -1;
        expect_detach(h.agent);
        int conn = connect_socket(&h);
        send_all(conn, "ATTACH 2 ", 9);
        wait_consumed(conn);
        int status;
        assert_int_equal(kill(h.pid, SIGSTOP), 0);
        assert_int_equal(waitpid(h.pid, &status, WUNTRACED), h.pid);
        assert_true(WIFSTOPPED(status));
        assert_int_equal(kill(h.pid, SIGCONT), 0);
        assert_int_equal(waitpid(h.pid, &status, WCONTINUED), h.pid);
        assert_true(WIFCONTINUED(status));
        const char *rest = SANDBOX_ID " " NONCE "\n";
        send_all(conn, rest, strlen(rest));
        char line[1024];
        int fds[8];
        size_t n_fds;
        read_reply(conn, line, sizeof line, fds, &n_fds);
        assert_int_equal(strncmp(line, "OK 2 ", 5), 0);
        assert_int_equal(n_fds, 1);
        send_text(fds[0], PROTO_PING, 0, "resumed");
        expect_text(h.agent, PROTO_PING, 0, "resumed");
        close(fds[0]);
        close(conn);
        stop(&h);
}

/* Last: it takes the handshake's 5 s. */
static void test_handshake_timeout(void **state) {
        Harness h;
        start(&h, false);
        uint64_t began = time_now_mono_ms();
        int fds[SUPERVISOR_PENDING_MAX + 1];
        for (size_t i = 0; i < SUPERVISOR_PENDING_MAX + 1; i++)
                fds[i] = connect_socket(&h);
        /* One too many: closed at once, without an answer. */
        int closed = -1;
        uint64_t deadline = began + 2500;
        while (closed < 0) {
                struct pollfd p[SUPERVISOR_PENDING_MAX + 1];
                for (size_t i = 0; i < SUPERVISOR_PENDING_MAX + 1; i++)
                        p[i] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
                int n = poll(p, SUPERVISOR_PENDING_MAX + 1, (int)ms_left(deadline));
                assert_true(n > 0);
                for (size_t i = 0; i < SUPERVISOR_PENDING_MAX + 1; i++)
                        if (p[i].revents) {
                                assert_int_equal(closed, -1);
                                closed = (int)i;
                        }
        }
        expect_eof(fds[closed]);
        close(fds[closed]);
        fds[closed] = -1;
        /* The others, silent, are closed after 5 s. */
        for (size_t i = 0; i < SUPERVISOR_PENDING_MAX + 1; i++) {
                if (fds[i] < 0)
                        continue;
                expect_eof(fds[i]);
                close(fds[i]);
        }
        uint64_t took = time_now_mono_ms() - began;
        assert_true(took >= SUPERVISOR_HANDSHAKE_TIMEOUT_MS - 100);
        assert_true(took < SUPERVISOR_HANDSHAKE_TIMEOUT_MS + 4000);
        /* The attached daemon was not disturbed. */
        assert_null(strstr(read_log(&h), "detached"));
        send_text(h.chan, PROTO_PING, 0, "meanwhile");
        expect_text(h.agent, PROTO_PING, 0, "meanwhile");
        /* And a daemon may still attach after them. */
        close(h.daemon);
        h.daemon = -1;
        close(h.chan);
        h.chan = -1;
        expect_detach(h.agent);
        int conn = attach(&h, NULL, NULL);
        close(conn);
        assert_non_null(strstr(read_log(&h), "no handshake within 5 s"));
        stop(&h);
}

int main(void) {
        find_supervisor();
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_handshake_parse),
                cmocka_unit_test(test_argument_checks),
                cmocka_unit_test(test_bad_arguments),
                cmocka_unit_test(test_attached_daemon_owns_the_channel),
                cmocka_unit_test(test_privileges_dropped),
                cmocka_unit_test(test_daemon_leaves),
                cmocka_unit_test(test_daemon_byte_detaches),
                cmocka_unit_test(test_detach_waits_for_room),
                cmocka_unit_test(test_reattach),
                cmocka_unit_test(test_detached_drops_agent_bytes),
                cmocka_unit_test(test_agent_eof_exits),
                cmocka_unit_test(test_agent_eof_while_detached_exits),
                cmocka_unit_test(test_daemon_shutdown_ends_it),
                cmocka_unit_test(test_sigterm_exits),
                cmocka_unit_test(test_peer_uid_checked),
                cmocka_unit_test(test_stop_and_continue),
                cmocka_unit_test(test_handshake_timeout),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
