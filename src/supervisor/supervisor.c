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

/* Reads each way, and connections accepted, before poll() is asked again:
 * one busy direction must not starve the other or the socket. */
#define PUMP_ROUNDS 16
#define ACCEPT_BURST 8

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static const char reply_busy[] = "NO busy\n";
static const char reply_version[] = "NO version " STRINGIFY(SUPERVISOR_PROTOCOL_VERSION) "\n";
static const char reply_nonce[] = "NO nonce\n";
static const char reply_malformed[] = "NO malformed\n";

/* One direction of the relay: a buffer of bytes read, of which only whole
 * frames are ever written on. [start, ready) are whole frames not yet written,
 * [ready, end) the beginning of the next frame. One read takes what the socket
 * has and one write passes on every whole frame in it, so that a burst of
 * small frames (an exec's start, output and exit) costs a read and a write,
 * not two reads and a write each. Nothing is read while the buffer is full:
 * the backpressure of the other side. */
typedef struct Relay {
        uint8_t *buf;     /* RELAY_CAP bytes */
        size_t start;     /* the first byte not written yet */
        size_t ready;     /* the end of the whole frames */
        size_t end;       /* the end of the bytes read */
        size_t reserve;   /* bytes kept free at the end (down: room for our DETACH) */
        size_t keep_from; /* up: a frame whose header was read before this offset goes nowhere */
        bool detach_last; /* down: the last whole frame is our own DETACH */
} Relay;

/* Room for the largest frame wherever a partial one begins after a
 * compaction, plus slack for the frames read with it, plus our DETACH. */
#define RELAY_SLACK (64u * 1024u)
#define RELAY_CAP (PROTO_HEADER_SIZE + PROTO_MAX_PAYLOAD + RELAY_SLACK + PROTO_HEADER_SIZE)

static size_t relay_space(const Relay *r) {
        return RELAY_CAP - r->reserve - r->end;
}

static bool relay_pending(const Relay *r) {
        return r->start < r->ready;
}

/* Moves the beginning of a frame to the front once every whole frame before
 * it is out: a frame begun near the end then has room to finish. */
static void relay_compact(Relay *r) {
        if (r->start != r->ready || r->start == 0)
                return;
        size_t tail = r->end - r->start;
        if (tail > 0)
                memmove(r->buf, r->buf + r->start, tail);
        r->keep_from = r->keep_from > r->start ? r->keep_from - r->start : 0;
        r->start = r->ready = 0;
        r->end = tail;
}

/* Advances ready over the whole frames read: 0, or -EPROTO for a malformed
 * header (ready stops before it). */
static int relay_scan(Relay *r) {
        while (r->end - r->ready >= PROTO_HEADER_SIZE) {
                ProtoHeader h;
                if (proto_header_decode(r->buf + r->ready, &h) < 0)
                        return -EPROTO;
                size_t size = PROTO_HEADER_SIZE + h.length;
                if (r->end - r->ready < size)
                        break;
                r->ready += size;
                r->detach_last = false;
        }
        return 0;
}

/* One read into the free space: the bytes read (> 0), 0 when fd has nothing
 * for now, -EPIPE at its end, or a negative errno. */
static ssize_t relay_fill(Relay *r, int fd) {
        for (;;) {
                ssize_t n = read(fd, r->buf + r->end, relay_space(r));
                if (n > 0) {
                        r->end += (size_t)n;
                        return n;
                }
                if (n == 0)
                        return -EPIPE;
                if (errno == EINTR)
                        continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                        return 0;
                return errno == EPIPE ? -ECONNRESET : -errno;
        }
}

/* Writes the whole frames on: 1 when all are out, 0 when fd takes no more for
 * now, or a negative errno (-EPIPE: the reader is gone). */
static int relay_flush(Relay *r, int fd) {
        while (r->start < r->ready) {
                ssize_t n = write(fd, r->buf + r->start, r->ready - r->start);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN || errno == EWOULDBLOCK)
                                return 0;
                        return errno == EPROTO ? -EIO : -errno;
                }
                if (n == 0)
                        return -EIO;
                r->start += (size_t)n;
        }
        return 1;
}

/* Skips the whole frames at the front that go nowhere: all of them while no
 * daemon is attached, else those whose header was read before it attached. */
static void relay_discard(Relay *r, bool attached) {
        if (!attached) {
                r->start = r->ready;
                return;
        }
        while (r->start < r->ready && r->start < r->keep_from) {
                ProtoHeader h;
                (void)proto_header_decode(r->buf + r->start, &h); /* scanned before */
                r->start += PROTO_HEADER_SIZE + h.length;
        }
}

/* Our own DETACH after the whole frames, in place of a partial one. */
static void relay_append_detach(Relay *r) {
        r->end = r->ready;
        if (r->detach_last)
                return; /* the agent has it, or will: it is not said twice */
        ProtoHeader h = { .type = PROTO_DETACH };
        (void)proto_header_encode(&h, r->buf + r->end);
        r->end += PROTO_HEADER_SIZE;
        r->ready = r->end;
        r->detach_last = true;
}

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
        int conn;            /* the attached daemon's connection; -1 while detached */
        Relay up;            /* agent -> daemon */
        Relay down;          /* daemon -> agent */
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
        if (version < 1 || version > SUPERVISOR_PROTOCOL_VERSION)
                return -EPROTONOSUPPORT;

        /* Version 1: " <sandbox-id> <nonce>" and nothing more. */
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

static const char *end_reason(int r) {
        switch (r) {
        case -EPIPE:
                return "its connection closed";
        case -EPROTO:
                return "it sent a malformed frame header";
        default:
                return strerror(-r);
        }
}

static void daemon_left(Supervisor *s, int r) {
        supervisor_log(s->cfg.sandbox_id, "detached: the daemon left (%s)", end_reason(r));
        close(s->conn);
        s->conn = -1;
        /* agent -> daemon: what that daemon did not get is gone, the rest of
         * a frame it got part of included. */
        relay_discard(&s->up, false);
        /* daemon -> agent: the whole frames still go to the agent, a frame
         * only partly received is dropped, and DETACH follows, so that the
         * agent never sees half a frame. */
        relay_append_detach(&s->down);
}

/* daemon -> agent. 0, or the agent's side ended (a negative errno). */
static int pump_down(Supervisor *s, bool readable) {
        Relay *r = &s->down;
        for (int i = 0; i < PUMP_ROUNDS; i++) {
                bool full = false;
                if (readable && s->conn >= 0 && relay_space(r) > 0) {
                        size_t want = relay_space(r);
                        ssize_t n = relay_fill(r, s->conn);
                        int k = n < 0 ? (int)n : relay_scan(r);
                        if (k < 0)
                                daemon_left(s, k);
                        /* A short read took all there was: no second read
                         * to learn that it would block. */
                        full = n > 0 && (size_t)n == want;
                }
                if (relay_pending(r)) {
                        int k = relay_flush(r, s->cfg.agent_fd);
                        if (k < 0)
                                return k;
                }
                relay_compact(r);
                if (!full)
                        return 0;
        }
        return 0;
}

/* agent -> daemon. 0, or the agent's side ended: -EPROTO for a malformed
 * header, another negative errno otherwise. */
static int pump_up(Supervisor *s, bool readable) {
        Relay *r = &s->up;
        for (int i = 0; i < PUMP_ROUNDS; i++) {
                bool full = false;
                int end = 0;
                if (readable && relay_space(r) > 0) {
                        size_t want = relay_space(r);
                        ssize_t n = relay_fill(r, s->cfg.agent_fd);
                        end = n < 0 ? (int)n : relay_scan(r);
                        full = n > 0 && (size_t)n == want;
                }
                relay_discard(r, s->conn >= 0);
                if (s->conn >= 0 && relay_pending(r)) {
                        int k = relay_flush(r, s->conn);
                        if (k < 0)
                                daemon_left(s, k);
                }
                relay_compact(r);
                /* At the agent's end, its last whole frames were passed on
                 * first (as far as the daemon's socket takes them). */
                if (end < 0)
                        return end;
                if (!full)
                        return 0;
        }
        return 0;
}

static void pending_remove(Supervisor *s, size_t i) {
        close(s->pending[i].fd);
        s->pending[i] = s->pending[--s->n_pending];
}

static ssize_t recv_some(int fd, void *buf, size_t n, int flags) {
        struct iovec iov = { .iov_base = buf, .iov_len = n };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t got;
        do
                got = recvmsg(fd, &msg, flags | MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        while (got < 0 && errno == EINTR);
        return got;
}

static void send_line(int fd, const char *line) {
        struct iovec iov = { .iov_base = (void *)line, .iov_len = strlen(line) };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t w;
        do
                w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (w < 0 && errno == EINTR);
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

/* The OK line and the kept fds, in one sendmsg: the daemon takes the fds
 * with the line's first byte. */
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
                char buf[CMSG_SPACE(sizeof(int) * SUPERVISOR_KEEP_MAX)];
        } control;
        if (s->cfg.n_keep > 0) {
                memset(&control, 0, sizeof control);
                msg.msg_control = control.buf;
                msg.msg_controllen = CMSG_SPACE(sizeof(int) * s->cfg.n_keep);
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int) * s->cfg.n_keep);
                memcpy(CMSG_DATA(cm), s->cfg.keep_fds, sizeof(int) * s->cfg.n_keep);
        }
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
        /* Frames the agent begins from now on go to this daemon; the rest of
         * one begun while detached is still dropped. */
        s->up.keep_from = s->up.end;
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
        if (r == -EPROTO) {
                supervisor_log(s->cfg.sandbox_id, "exiting: the agent sent a malformed frame header");
                return -EPROTO;
        }
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
                /* Backpressure: a side is read only while the frame from it
                 * has somewhere to go, and polled only for what we want of
                 * it (a hung-up fd polled for nothing would wake us forever). */
                short agent_ev = (short)((relay_space(&s->up) > 0 ? POLLIN : 0) |
                                         (relay_pending(&s->down) ? POLLOUT : 0));
                short conn_ev = 0;
                if (s->conn >= 0)
                        conn_ev = (short)((relay_space(&s->down) > 0 ? POLLIN : 0) |
                                          (relay_pending(&s->up) ? POLLOUT : 0));
                p[POLL_SIGNAL] = (struct pollfd){ .fd = s->signal_fd, .events = POLLIN };
                p[POLL_AGENT] = (struct pollfd){ .fd = agent_ev ? s->cfg.agent_fd : -1, .events = agent_ev };
                p[POLL_CONN] = (struct pollfd){ .fd = conn_ev ? s->conn : -1, .events = conn_ev };
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

                const short in = POLLIN | POLLHUP | POLLERR;
                /* Writes are tried whenever whole frames wait: a non-blocking
                 * write that would block says so at once. */
                bool agent_in = (agent_ev & POLLIN) && (p[POLL_AGENT].revents & in);
                bool conn_in = (conn_ev & POLLIN) && (p[POLL_CONN].revents & in);
                int r = pump_down(s, conn_in);
                if (r < 0)
                        return agent_ended(s, r);
                r = pump_up(s, agent_in);
                if (r < 0)
                        return agent_ended(s, r);

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
        free(s->up.buf);
        free(s->down.buf);
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
        s->up.buf = malloc(RELAY_CAP);
        s->down.buf = malloc(RELAY_CAP);
        if (!s->up.buf || !s->down.buf)
                return -ENOMEM;
        s->down.reserve = PROTO_HEADER_SIZE;

        int r;
        if ((r = set_nonblock(cfg->agent_fd)) < 0 || (r = set_nonblock(cfg->listen_fd)) < 0 ||
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
