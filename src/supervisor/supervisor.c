#include "supervisor/supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/timeutil.h"
#include "proto/proto.h"

/* Connections accepted, and reads of what the agent sends while detached,
 * before poll() is asked again. */
#define ACCEPT_BURST 8
#define DRAIN_READS 16
#define DRAIN_BUF (64u * 1024u)

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static const char reply_busy[] = "NO busy\n";
static const char reply_version[] = "NO version " STRINGIFY(SUPERVISOR_PROTOCOL_VERSION) "\n";
static const char reply_nonce[] = "NO nonce\n";
static const char reply_malformed[] = "NO malformed\n";

/* A connection on the listening socket that has not sent its handshake yet. */
typedef struct Pending {
        int fd;
        uint64_t deadline_ms;
        size_t len;
        char line[SUPERVISOR_LINE_MAX];
} Pending;

struct Supervisor {
        SupervisorConfig cfg;
        pid_t pid;
        uid_t uid;
        int signal_fd;
        int conn; /* the attached daemon's connection; -1 while detached */
        /* Our DETACH to the agent, once its daemon left: 12 bytes, which a
         * unix stream socket takes whole or not at all. */
        uint8_t detach[PROTO_HEADER_SIZE];
        bool detach_pending;
        uint8_t *drain; /* DRAIN_BUF bytes: what the agent sends while detached */
        Pending pending[SUPERVISOR_PENDING_MAX];
        size_t n_pending;
};

void supervisor_log(const char *sandbox_id, const char *fmt, ...) {
        char line[1024];
        int n = snprintf(line, sizeof line, "runtime-supervisor[%s]: ", sandbox_id ? sandbox_id : "");
        if (n < 0)
                return;
        size_t len = (size_t)n < sizeof line - 1 ? (size_t)n : sizeof line - 1;
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + len, sizeof line - len, fmt, ap);
        va_end(ap);
        if (m > 0)
                len += (size_t)m < sizeof line - len ? (size_t)m : sizeof line - len - 1;
        if (len > sizeof line - 1)
                len = sizeof line - 1;
        line[len++] = '\n';
        /* One write per line, so that lines of several supervisors sharing
         * the daemon's stderr never interleave. */
        ssize_t w = write(STDERR_FILENO, line, len);
        (void)w;
}

bool supervisor_id_valid(const char *id) {
        if (!id)
                return false;
        size_t n = strlen(id);
        if (n == 0 || n > SUPERVISOR_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9') || id[i] == '_' ||
                      id[i] == '-'))
                        return false;
        return true;
}

bool supervisor_nonce_valid(const char *nonce) {
        if (!nonce || strlen(nonce) != SUPERVISOR_NONCE_LEN)
                return false;
        for (size_t i = 0; i < SUPERVISOR_NONCE_LEN; i++)
                if (!((nonce[i] >= '0' && nonce[i] <= '9') || (nonce[i] >= 'a' && nonce[i] <= 'f')))
                        return false;
        return true;
}

bool supervisor_state_valid(const char *state) {
        if (!state || strlen(state) > SUPERVISOR_STATE_MAX)
                return false;
        for (const char *p = state; *p; p++)
                if ((unsigned char)*p <= ' ' || (unsigned char)*p > '~')
                        return false;
        return true;
}

/* Compares n bytes in a time that does not depend on where they differ, so
 * that a peer cannot find the nonce a byte at a time. */
static bool secret_equal(const char *a, const char *b, size_t n) {
        volatile unsigned char diff = 0;
        for (size_t i = 0; i < n; i++)
                diff |= (unsigned char)(a[i] ^ b[i]);
        return diff == 0;
}

int supervisor_handshake_parse(const char *line, size_t len, const char *sandbox_id, const char *nonce,
                               unsigned *ret_version) {
        static const char word[] = "ATTACH ";
        const size_t word_len = sizeof word - 1;
        if (!line || !sandbox_id || !nonce || len < 2 || len > SUPERVISOR_LINE_MAX || line[len - 1] != '\n')
                return -EBADMSG;
        len--;
        for (size_t i = 0; i < len; i++)
                if ((unsigned char)line[i] < ' ' || (unsigned char)line[i] > '~')
                        return -EBADMSG;
        if (len < word_len || memcmp(line, word, word_len) != 0)
                return -EBADMSG;

        size_t i = word_len, digits = 0;
        unsigned long version = 0;
        for (; i < len && line[i] >= '0' && line[i] <= '9'; i++) {
                if (++digits > 9)
                        return -EBADMSG;
                version = version * 10 + (unsigned long)(line[i] - '0');
        }
        if (digits == 0 || (i < len && line[i] != ' '))
                return -EBADMSG;
        /* Before the rest: a later version may lay its line out otherwise,
         * and its daemon must learn which version to speak. */
        if (version < SUPERVISOR_PROTOCOL_MIN || version > SUPERVISOR_PROTOCOL_VERSION)
                return -EPROTONOSUPPORT;

        /* Versions 1 and 2: " <sandbox-id> <nonce>" and nothing more. */
        if (i == len)
                return -EBADMSG;
        const char *id = line + i + 1, *end = line + len;
        const char *space = memchr(id, ' ', (size_t)(end - id));
        if (!space || space == id)
                return -EBADMSG;
        const char *got = space + 1;
        size_t id_len = (size_t)(space - id), got_len = (size_t)(end - got);
        if (got_len == 0 || memchr(got, ' ', got_len))
                return -EBADMSG;
        bool id_ok = id_len == strlen(sandbox_id) && memcmp(id, sandbox_id, id_len) == 0;
        bool nonce_ok = got_len == strlen(nonce) && secret_equal(got, nonce, got_len);
        if (!id_ok || !nonce_ok)
                return -EPERM;
        *ret_version = (unsigned)version;
        return 0;
}

/* recvmsg and sendmsg stand for recv and send (the filter allows no
 * other), without blocking. */
static ssize_t recv_some(int fd, void *buf, size_t n, int flags) {
        struct iovec iov = { .iov_base = buf, .iov_len = n };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t got;
        do
                got = recvmsg(fd, &msg, flags | MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        while (got < 0 && errno == EINTR);
        return got;
}

static ssize_t send_some(int fd, const void *buf, size_t n) {
        struct iovec iov = { .iov_base = (void *)buf, .iov_len = n };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t w;
        do
                w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (w < 0 && errno == EINTR);
        return w;
}

/* Writes our DETACH to the agent if it is pending: 0 when it is out or
 * waits for room, a negative errno when the agent's side failed. */
static int detach_flush(Supervisor *s) {
        if (!s->detach_pending)
                return 0;
        ssize_t n = send_some(s->cfg.agent_fd, s->detach, sizeof s->detach);
        if (n < 0)
                return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
        /* A unix stream socket queues a write this small in one piece. */
        if (n != (ssize_t)sizeof s->detach)
                return -EIO;
        s->detach_pending = false;
        return 0;
}

static void daemon_left(Supervisor *s, const char *why) {
        supervisor_log(s->cfg.sandbox_id, "detached: the daemon left (%s)", why);
        close(s->conn);
        s->conn = -1;
        /* The daemon wrote every frame of its in one piece (docs/protocol.md),
         * so the agent's side is at a frame's start: DETACH goes next. */
        s->detach_pending = true;
}

/* The attached daemon's connection carries nothing after the handshake:
 * its end, or any byte, is the daemon's going. */
static void conn_readable(Supervisor *s) {
        uint8_t b;
        ssize_t n = recv_some(s->conn, &b, 1, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
        daemon_left(s, n == 0 ? "its connection closed" : n > 0 ? "it sent bytes after its handshake" : strerror(errno));
}

/* While detached, what the agent sends goes nowhere: it is read so that the
 * agent never blocks, and dropped. 0, or the agent's side ended: -EPIPE at
 * its end, another negative errno otherwise. */
static int drain_agent(Supervisor *s) {
        for (int i = 0; i < DRAIN_READS; i++) {
                ssize_t n = recv_some(s->cfg.agent_fd, s->drain, DRAIN_BUF, 0);
                if (n > 0)
                        continue;
                if (n == 0)
                        return -EPIPE;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                        return 0;
                return -errno;
        }
        return 0;
}

static void pending_remove(Supervisor *s, size_t i) {
        close(s->pending[i].fd);
        s->pending[i] = s->pending[--s->n_pending];
}

static void send_line(int fd, const char *line) {
        (void)send_some(fd, line, strlen(line));
}

/* Reads the handshake on: 1 when the line is in (p->len bytes, '\n' last), 0
 * for more, -EPIPE when the peer closed, -EMSGSIZE when it is too long. The
 * bytes are peeked at first so that nothing past the '\n' is taken: after an
 * OK, those are the daemon's frames. */
static int pending_read(Pending *p) {
        for (;;) {
                char *at = p->line + p->len;
                ssize_t n = recv_some(p->fd, at, sizeof p->line - p->len, MSG_PEEK);
                if (n < 0)
                        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
                if (n == 0)
                        return -EPIPE;
                const char *nl = memchr(at, '\n', (size_t)n);
                size_t take = nl ? (size_t)(nl - at) + 1 : (size_t)n;
                if (recv_some(p->fd, at, take, 0) != (ssize_t)take)
                        return -EIO;
                p->len += take;
                if (nl)
                        return 1;
                if (p->len == sizeof p->line)
                        return -EMSGSIZE;
        }
}

/* The OK line with the agent channel and the kept fds, in one sendmsg: the
 * daemon takes the fds with the line's first byte. */
static int send_ok(Supervisor *s, int fd, unsigned version) {
        char line[64 + SUPERVISOR_STATE_MAX];
        const char *state = s->cfg.state && s->cfg.state[0] ? s->cfg.state : "-";
        int n = snprintf(line, sizeof line, "OK %u %d %zu %s\n", version, (int)s->pid, s->cfg.n_keep, state);
        if (n < 0 || (size_t)n >= sizeof line)
                return -EINVAL;
        struct iovec iov = { .iov_base = line, .iov_len = (size_t)n };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * (1 + SUPERVISOR_KEEP_MAX))];
        } control;
        size_t n_fds = 1 + s->cfg.n_keep;
        memset(&control, 0, sizeof control);
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(cm), &s->cfg.agent_fd, sizeof(int));
        if (s->cfg.n_keep > 0)
                memcpy(CMSG_DATA(cm) + sizeof(int), s->cfg.keep_fds, sizeof(int) * s->cfg.n_keep);
        ssize_t w;
        do
                w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (w < 0 && errno == EINTR);
        if (w < 0)
                return -errno;
        /* A new connection's buffer takes a few hundred bytes at once; a
         * short write would leave the daemon half a line. */
        return w == n ? 0 : -EAGAIN;
}

/* The answer to a complete handshake line, or NULL to attach; *ret_why
 * for the log. */
static const char *handshake_verdict(const Supervisor *s, const Pending *p, unsigned *ret_version,
                                     const char **ret_why) {
        int r = supervisor_handshake_parse(p->line, p->len, s->cfg.sandbox_id, s->cfg.nonce, ret_version);
        if (r == -EPROTONOSUPPORT) {
                *ret_why = "a protocol version it does not speak";
                return reply_version;
        }
        if (r == -EPERM) {
                *ret_why = "a wrong sandbox id or nonce";
                return reply_nonce;
        }
        if (r < 0) {
                *ret_why = "a malformed handshake";
                return reply_malformed;
        }
        /* Checked only once the peer has proved itself, so that it learns
         * nothing before. */
        if (s->conn >= 0) {
                *ret_why = "a daemon is attached";
                return reply_busy;
        }
        return NULL;
}

static void pending_handle(Supervisor *s, size_t i) {
        Pending *p = &s->pending[i];
        int r = pending_read(p);
        if (r == 0)
                return;
        if (r < 0 && r != -EMSGSIZE) {
                supervisor_log(s->cfg.sandbox_id, "refused an attach: the connection ended before its handshake");
                pending_remove(s, i);
                return;
        }
        unsigned version = 0;
        const char *why = "an over-long handshake";
        const char *reply = r == -EMSGSIZE ? reply_malformed : handshake_verdict(s, p, &version, &why);
        if (reply) {
                send_line(p->fd, reply);
                supervisor_log(s->cfg.sandbox_id, "refused an attach: %s", why);
                pending_remove(s, i);
                return;
        }
        r = send_ok(s, p->fd, version);
        if (r < 0) {
                supervisor_log(s->cfg.sandbox_id, "refused an attach: answering it failed: %s", strerror(-r));
                pending_remove(s, i);
                return;
        }
        s->conn = p->fd;
        s->pending[i] = s->pending[--s->n_pending];
        /* From here the daemon reads and writes the agent's channel itself.
         * A DETACH not written yet is not needed: the daemon sends its own
         * first (docs/protocol.md). */
        s->detach_pending = false;
        supervisor_log(s->cfg.sandbox_id, "attached: protocol %u, %zu handles handed back", version,
                       s->cfg.n_keep);
}

static void accept_new(Supervisor *s) {
        for (int i = 0; i < ACCEPT_BURST; i++) {
                int fd = accept4(s->cfg.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) {
                        if (errno == EINTR || errno == ECONNABORTED)
                                continue;
                        return;
                }
                struct ucred cred;
                socklen_t len = sizeof cred;
                if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof cred) {
                        supervisor_log(s->cfg.sandbox_id, "refused a connection: its peer is unknown");
                        close(fd);
                        continue;
                }
                if (cred.uid != s->uid) {
                        supervisor_log(s->cfg.sandbox_id, "refused a connection from uid %u", (unsigned)cred.uid);
                        close(fd);
                        continue;
                }
                if (s->n_pending == SUPERVISOR_PENDING_MAX) {
                        supervisor_log(s->cfg.sandbox_id, "refused a connection: %d are waiting for a handshake",
                                       SUPERVISOR_PENDING_MAX);
                        close(fd);
                        continue;
                }
                s->pending[s->n_pending++] = (Pending){
                        .fd = fd,
                        .deadline_ms = time_now_mono_ms() + SUPERVISOR_HANDSHAKE_TIMEOUT_MS,
                };
        }
}

static void pending_expire(Supervisor *s) {
        uint64_t now = time_now_mono_ms();
        for (size_t i = s->n_pending; i-- > 0;)
                if (s->pending[i].deadline_ms <= now) {
                        supervisor_log(s->cfg.sandbox_id, "refused an attach: no handshake within %d s",
                                       SUPERVISOR_HANDSHAKE_TIMEOUT_MS / 1000);
                        pending_remove(s, i);
                }
}

static int poll_timeout(const Supervisor *s) {
        if (s->n_pending == 0)
                return -1;
        uint64_t now = time_now_mono_ms(), first = UINT64_MAX;
        for (size_t i = 0; i < s->n_pending; i++)
                if (s->pending[i].deadline_ms < first)
                        first = s->pending[i].deadline_ms;
        return first <= now ? 0 : (int)(first - now);
}

static int agent_ended(Supervisor *s, int r) {
        if (r == -EPIPE)
                supervisor_log(s->cfg.sandbox_id, "exiting: the agent's channel closed");
        else
                supervisor_log(s->cfg.sandbox_id, "exiting: the agent's channel failed: %s", strerror(-r));
        return 0;
}

enum { POLL_SIGNAL, POLL_AGENT, POLL_CONN, POLL_LISTEN, POLL_PENDING };

int supervisor_run(Supervisor *s) {
        for (;;) {
                struct pollfd p[POLL_PENDING + SUPERVISOR_PENDING_MAX];
                /* Attached, the agent's side is the daemon's: it is polled for
                 * nothing, which still tells its end (POLLHUP). Detached, what
                 * the agent sends is read and dropped, and our DETACH waits
                 * for room. */
                short agent_ev = s->conn >= 0 ? 0 : (short)(POLLIN | (s->detach_pending ? POLLOUT : 0));
                p[POLL_SIGNAL] = (struct pollfd){ .fd = s->signal_fd, .events = POLLIN };
                p[POLL_AGENT] = (struct pollfd){ .fd = s->cfg.agent_fd, .events = agent_ev };
                p[POLL_CONN] = (struct pollfd){ .fd = s->conn, .events = POLLIN };
                p[POLL_LISTEN] = (struct pollfd){ .fd = s->cfg.listen_fd, .events = POLLIN };
                size_t n_pending = s->n_pending;
                for (size_t i = 0; i < n_pending; i++)
                        p[POLL_PENDING + i] = (struct pollfd){ .fd = s->pending[i].fd, .events = POLLIN };

                if (poll(p, POLL_PENDING + n_pending, poll_timeout(s)) < 0) {
                        if (errno == EINTR)
                                continue;
                        int r = -errno;
                        supervisor_log(s->cfg.sandbox_id, "exiting: poll failed: %s", strerror(-r));
                        return r;
                }
                if (p[POLL_SIGNAL].revents) {
                        struct signalfd_siginfo si = { 0 };
                        ssize_t n = read(s->signal_fd, &si, sizeof si);
                        if (n == (ssize_t)sizeof si) {
                                supervisor_log(s->cfg.sandbox_id, "exiting: %s",
                                               si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
                                return 0;
                        }
                }

                if (s->conn >= 0 && p[POLL_CONN].revents)
                        conn_readable(s);
                short agent_rev = p[POLL_AGENT].revents;
                if (agent_ev == 0 && (agent_rev & (POLLHUP | POLLERR))) {
                        /* The agent's end closed under the attached daemon;
                         * one detached finds it in its next read. */
                        return agent_ended(s, -EPIPE);
                }
                if (s->conn < 0) {
                        int r = detach_flush(s);
                        if (r == 0 && (agent_ev & POLLIN) && (agent_rev & (POLLIN | POLLHUP | POLLERR)))
                                r = drain_agent(s);
                        if (r < 0)
                                return agent_ended(s, r);
                }

                /* Backwards: removing entry i moves the last one, already
                 * handled, into its place. */
                for (size_t i = n_pending; i-- > 0;)
                        if (p[POLL_PENDING + i].revents)
                                pending_handle(s, i);
                pending_expire(s);
                if (p[POLL_LISTEN].revents)
                        accept_new(s);
        }
}

static int set_nonblock(int fd) {
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
                return -errno;
        return 0;
}

void supervisor_free(Supervisor *s) {
        if (!s)
                return;
        if (s->conn >= 0)
                close(s->conn);
        for (size_t i = 0; i < s->n_pending; i++)
                close(s->pending[i].fd);
        if (s->signal_fd >= 0)
                close(s->signal_fd);
        free(s->drain);
        free(s);
}

static void supervisor_freep(Supervisor **s) {
        supervisor_free(*s);
}

int supervisor_new(const SupervisorConfig *cfg, Supervisor **ret) {
        if (!cfg || !ret || !supervisor_id_valid(cfg->sandbox_id) || !supervisor_nonce_valid(cfg->nonce) ||
            (cfg->state && !supervisor_state_valid(cfg->state)) || cfg->n_keep > SUPERVISOR_KEEP_MAX ||
            (cfg->n_keep > 0 && !cfg->keep_fds) || cfg->agent_fd < 0 || cfg->listen_fd < 0)
                return -EINVAL;
        _cleanup_(supervisor_freep) Supervisor *s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->cfg = *cfg;
        s->conn = -1;
        s->signal_fd = -1;
        s->drain = malloc(DRAIN_BUF);
        if (!s->drain)
                return -ENOMEM;
        ProtoHeader h = { .type = PROTO_DETACH };
        (void)proto_header_encode(&h, s->detach);

        int r;
        /* Not the agent's fd: its file is shared with the daemon, whose
         * writes block; our reads and writes on it say MSG_DONTWAIT. */
        if ((r = set_nonblock(cfg->listen_fd)) < 0 ||
            (cfg->conn_fd >= 0 && (r = set_nonblock(cfg->conn_fd)) < 0))
                return r;
        /* A daemon or agent that went away is an EPIPE from write, not a
         * death by signal. */
        struct sigaction ign = { .sa_handler = SIG_IGN };
        if (sigaction(SIGPIPE, &ign, NULL) < 0)
                return -errno;
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
                return -errno;
        s->signal_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
        if (s->signal_fd < 0)
                return -errno;
        s->pid = getpid();
        s->uid = geteuid();
        s->conn = cfg->conn_fd;
        *ret = TAKE_PTR(s);
        return 0;
}
