#include "daemon/http/edge.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <jansson.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/http/apierror.h"

/* How often the server's connections are looked at, at most: a kept-alive
 * connection is cut within this much after its time. */
#define SWEEP_MS 500u
/* After accept fails for want of a descriptor: how long before the next try. */
#define ACCEPT_PAUSE_MS 100u
#define PEER_BUCKETS 1024u
/* A refused connection is read a while after its answer, so that what its
 * client was still sending does not make the close a reset, which could
 * take the answer with it: at most this long, or this many bytes. */
#define LINGER_MS 2000u
/* How often whole heads waiting for room look for it. */
#define READY_POLL_MS 20u
#define LINGER_BYTES (1024u * 1024u)

/* A peer: its address (IPv4 as IPv4-mapped IPv6), or the uid of a unix
 * socket's peer. */
typedef struct PeerKey {
        uint8_t kind; /* 6 or 'u' */
        uint8_t bytes[16];
} PeerKey;

typedef struct Peer {
        PeerKey key;
        unsigned waiting;
        struct Peer *next;
} Peer;

typedef struct Waiting {
        int fd;
        Peer *peer;
        uint64_t deadline;
        socklen_t salen;
        struct sockaddr_storage sa;
        bool ready;       /* its head is whole; it waits for room in the server */
        bool lingering;   /* answered and shut for writing: what it still sends is read and dropped */
        size_t discarded; /* ... this much so far */
        struct Waiting *prev, *next;
} Waiting;

enum { CONN_AWAITING, CONN_BUSY, CONN_UPGRADED, CONN_CUT };

struct EdgeConn {
        Edge *edge;
        int fd;
        int state;      /* under the edge's lock */
        uint64_t since; /* CONN_AWAITING: since when */
        EdgeConn *prev, *next;
};

struct Edge {
        EdgeConfig cfg;
        int listen_fd, epfd, wake_fd;
        EdgeHandOff hand_off;
        void *userdata;
        pthread_t thread;
        bool started;
        char *buf; /* head_max + 1: the peeked head */
        /* The edge thread's own. */
        Waiting *first, *last; /* oldest first: deadline order */
        Peer *peers[PEER_BUCKETS];
        uint64_t accept_paused_until;
        /* Asked of the edge thread through wake_fd, answered under lock. */
        bool quiesce_asked, quiesced, stop_asked;
        pthread_mutex_t lock;
        pthread_cond_t done;
        EdgeConn *conns; /* under lock */
        /* Counters, read by edge_stats. */
        atomic_uint waiting;
        atomic_uint ready; /* whole heads waiting for room */
        atomic_ullong handed, refused_peer, evicted, timed_out, malformed;
};

/* Tags in epoll's data for the two descriptors that are not connections. */
static char listen_tag, wake_tag;

long edge_head_end(const char *buf, size_t n) {
        size_t i = 0;
        while (i < n && (buf[i] == '\r' || buf[i] == '\n'))
                i++;
        for (; i < n; i++) {
                if (buf[i] == '\0')
                        return -EBADMSG;
                if (buf[i] != '\n')
                        continue;
                if (i + 1 < n && buf[i + 1] == '\n')
                        return (long)(i + 2);
                if (i + 2 < n && buf[i + 1] == '\r' && buf[i + 2] == '\n')
                        return (long)(i + 3);
        }
        return 0;
}

/* ---- peers ---- */

static void peer_key(int fd, const struct sockaddr_storage *sa, PeerKey *k) {
        memset(k, 0, sizeof *k);
        if (sa->ss_family == AF_INET) {
                const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
                k->kind = 6;
                k->bytes[10] = 0xff;
                k->bytes[11] = 0xff;
                memcpy(k->bytes + 12, &in->sin_addr, 4);
        } else if (sa->ss_family == AF_INET6) {
                k->kind = 6;
                memcpy(k->bytes, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        } else {
                struct ucred cred = { .uid = (uid_t)-1 };
                socklen_t len = sizeof cred;
                (void)getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
                k->kind = 'u';
                memcpy(k->bytes, &cred.uid, sizeof cred.uid);
        }
}

static unsigned peer_bucket(const PeerKey *k) {
        uint64_t h = fnv1a64_byte(FNV1A64_INIT, k->kind);
        for (size_t i = 0; i < sizeof k->bytes; i++)
                h = fnv1a64_byte(h, k->bytes[i]);
        return (unsigned)(h % PEER_BUCKETS);
}

static Peer *peer_get(Edge *e, const PeerKey *k) {
        unsigned b = peer_bucket(k);
        for (Peer *p = e->peers[b]; p; p = p->next)
                if (memcmp(&p->key, k, sizeof *k) == 0)
                        return p;
        Peer *p = calloc(1, sizeof *p);
        if (!p)
                return NULL;
        p->key = *k;
        p->next = e->peers[b];
        e->peers[b] = p;
        return p;
}

/* Forgets a peer with nothing waiting. */
static void peer_put(Edge *e, Peer *peer) {
        if (peer->waiting)
                return;
        for (Peer **pp = &e->peers[peer_bucket(&peer->key)]; *pp; pp = &(*pp)->next)
                if (*pp == peer) {
                        *pp = peer->next;
                        free(peer);
                        return;
                }
}

/* ---- connections awaiting their head ---- */

static void waiting_unlink(Edge *e, Waiting *w) {
        if (w->prev)
                w->prev->next = w->next;
        else
                e->first = w->next;
        if (w->next)
                w->next->prev = w->prev;
        else
                e->last = w->prev;
        (void)epoll_ctl(e->epfd, EPOLL_CTL_DEL, w->fd, NULL);
        if (w->ready) {
                w->ready = false;
                atomic_fetch_sub(&e->ready, 1);
        }
        w->peer->waiting--;
        peer_put(e, w->peer);
        atomic_fetch_sub(&e->waiting, 1);
}

/* Reads the n bytes a look found in fd (buf holds cap). Bytes sent and
 * never read would make a close a reset, which can take an answer written
 * just before with it. */
static void drain(int fd, char *buf, size_t cap, size_t n) {
        while (n > 0) {
                ssize_t k = recv(fd, buf, n < cap ? n : cap, MSG_DONTWAIT);
                if (k <= 0)
                        break;
                n -= (size_t)k;
        }
}

/* Closes a waiting connection, reading first what it sent (peeked is how
 * many bytes are known to be there). */
static void waiting_close(Edge *e, Waiting *w, size_t peeked) {
        waiting_unlink(e, w);
        drain(w->fd, e->buf, e->cfg.head_max, peeked);
        close(w->fd);
        free(w);
}

/* Answers a head the server must never see, on fd. */
static void refusal_send(Edge *e, int fd, int status, const char *reason, const char *message) {
        char rid[24], hex[17];
        if (random_hex(hex, 8) < 0)
                snprintf(hex, sizeof hex, "0000000000000000");
        snprintf(rid, sizeof rid, "req_%s", hex);
        ApiError err;
        api_error(&err, status, status == 431 ? "payload_too_large" : "invalid_request", NULL, "%s", message);
        json_t *j = api_error_json(&err, rid);
        char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        char head[256];
        int hn = snprintf(head, sizeof head,
                          "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                          "X-Request-Id: %s\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
                          status, reason, body ? strlen(body) : 0, rid);
        /* Small enough for any socket's buffer: one try, never a wait. */
        if (hn > 0 && (size_t)hn < sizeof head && send(fd, head, (size_t)hn, MSG_NOSIGNAL | MSG_DONTWAIT) == hn &&
            body)
                (void)send(fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT);
        free(body);
        log_debug(rid, "http: a connection's head refused (%d): %s", status, message);
        if (status != 503)
                atomic_fetch_add(&e->malformed, 1);
        (void)shutdown(fd, SHUT_WR);
}

/* What is wrong with a head of n bytes (end as edge_head_end gave it):
 * 0, nothing (whole, or not yet and still room), else the status, with
 * its reason and message. */
static int head_fault(const Edge *e, long end, size_t n, size_t room, const char **reason, char *msg, size_t len) {
        if (end == -EBADMSG) {
                *reason = "Bad Request";
                snprintf(msg, len, "the request's head has a NUL byte (header values are visible characters, "
                                   "spaces and tabs)");
                return 400;
        }
        if (end == 0 && n >= room) {
                *reason = "Request Header Fields Too Large";
                snprintf(msg, len, "the request's head is over %zu KiB", e->cfg.head_max >> 10);
                return 431;
        }
        return 0;
}

static void waiting_refuse(Edge *e, Waiting *w, int status, const char *reason, const char *message, size_t peeked) {
        refusal_send(e, w->fd, status, reason, message);
        drain(w->fd, e->buf, e->cfg.head_max, peeked);
        /* Last in line, with a time of its own: the oldest go first, so it
         * goes at the later of the two. */
        w->lingering = true;
        w->deadline = time_now_mono_ms() + LINGER_MS;
        if (w != e->last) {
                if (w->prev)
                        w->prev->next = w->next;
                else
                        e->first = w->next;
                w->next->prev = w->prev;
                w->prev = e->last;
                w->next = NULL;
                e->last->next = w;
                e->last = w;
        }
}

/* A refused connection's bytes, read and dropped until it ends. */
static void waiting_linger(Edge *e, Waiting *w) {
        for (;;) {
                ssize_t n = recv(w->fd, e->buf, e->cfg.head_max, MSG_DONTWAIT);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && w->discarded <= LINGER_BYTES)
                        return;
                if (n <= 0 || (w->discarded += (size_t)n) > LINGER_BYTES)
                        break;
        }
        waiting_close(e, w, 0);
}

/* Asked of the server itself, so that no count of ours can drift from
 * what it holds. */
static bool room(Edge *e) {
        return !e->cfg.max_held || !e->cfg.held || e->cfg.held(e->userdata) < e->cfg.max_held;
}

static void waiting_hand_off(Edge *e, Waiting *w) {
        waiting_unlink(e, w);
        atomic_fetch_add(&e->handed, 1);
        (void)e->hand_off(e->userdata, w->fd, (const struct sockaddr *)&w->sa, w->salen);
        free(w);
}

/* Whole heads that waited for room, oldest first, while there is room. */
static void hand_off_ready(Edge *e) {
        for (Waiting *w = e->first, *next; w && atomic_load(&e->ready) > 0 && room(e); w = next) {
                next = w->next;
                if (w->ready)
                        waiting_hand_off(e, w);
        }
}

void edge_server_closed(Edge *e) {
        if (e && atomic_load(&e->ready) > 0) {
                uint64_t one = 1;
                (void)!write(e->wake_fd, &one, sizeof one);
        }
}

/* New bytes (or an end) on a waiting connection. */
static void waiting_read(Edge *e, Waiting *w, uint32_t events) {
        if (w->lingering) {
                waiting_linger(e, w);
                return;
        }
        if (w->ready) {
                /* A client that waits for its answer sends nothing more
                 * and never ends its side: one that does has given up. */
                if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP))
                        waiting_close(e, w, 0);
                return;
        }
        ssize_t n = recv(w->fd, e->buf, e->cfg.head_max, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0) {
                if ((errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) &&
                    !(events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)))
                        return;
                waiting_close(e, w, 0);
                return;
        }
        if (n == 0) {
                waiting_close(e, w, 0);
                return;
        }
        long end = edge_head_end(e->buf, (size_t)n);
        const char *reason = NULL;
        char msg[160];
        int status = head_fault(e, end, (size_t)n, e->cfg.head_max, &reason, msg, sizeof msg);
        if (status) {
                waiting_refuse(e, w, status, reason, msg, (size_t)n);
                return;
        }
        if (end > 0 && room(e)) {
                waiting_hand_off(e, w);
                return;
        }
        if (end > 0) {
                /* The server holds all it may: this one waits its turn. */
                w->ready = true;
                atomic_fetch_add(&e->ready, 1);
                return;
        }
        /* Half a head and then the end: nothing more will come. */
        if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP))
                waiting_close(e, w, (size_t)n);
}

static void accept_all(Edge *e, uint64_t now) {
        for (;;) {
                struct sockaddr_storage sa;
                socklen_t salen = sizeof sa;
                int fd = accept4(e->listen_fd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) {
                        if (errno == EINTR || errno == ECONNABORTED)
                                continue;
                        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                                /* Out of descriptors: the oldest waiting
                                 * one makes room, else a pause (the
                                 * listening socket stays readable). */
                                if (e->first) {
                                        atomic_fetch_add(&e->evicted, 1);
                                        waiting_close(e, e->first, 0);
                                        continue;
                                }
                                log_warn(NULL, "http: accepting a connection: %s", strerror(errno));
                                e->accept_paused_until = now + ACCEPT_PAUSE_MS;
                                struct epoll_event ev = { .events = 0, .data.ptr = &listen_tag };
                                (void)epoll_ctl(e->epfd, EPOLL_CTL_MOD, e->listen_fd, &ev);
                        }
                        return;
                }
                PeerKey k;
                peer_key(fd, &sa, &k);
                Peer *peer = peer_get(e, &k);
                if (!peer || peer->waiting >= e->cfg.max_waiting_per_peer) {
                        if (peer)
                                atomic_fetch_add(&e->refused_peer, 1);
                        close(fd);
                        continue;
                }
                Waiting *w = calloc(1, sizeof *w);
                if (!w) {
                        peer_put(e, peer);
                        close(fd);
                        continue;
                }
                w->fd = fd;
                w->peer = peer;
                w->deadline = now + e->cfg.head_ms;
                w->sa = sa;
                w->salen = salen;
                struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = w };
                if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
                        peer_put(e, peer);
                        close(fd);
                        free(w);
                        continue;
                }
                peer->waiting++;
                w->prev = e->last;
                if (e->last)
                        e->last->next = w;
                else
                        e->first = w;
                e->last = w;
                /* Past the bound in all: the oldest goes, which has waited
                 * longest without a head; a client that sends its request
                 * at once is never the oldest for long. */
                if (atomic_fetch_add(&e->waiting, 1) + 1 > e->cfg.max_waiting && e->first != w) {
                        atomic_fetch_add(&e->evicted, 1);
                        waiting_close(e, e->first, 0);
                }
        }
}

/* ---- the server's connections ---- */

EdgeConn *edge_conn_add(Edge *e, int fd) {
        EdgeConn *c = calloc(1, sizeof *c);
        if (!c || !e)
                return c;
        c->edge = e;
        c->fd = fd;
        c->state = CONN_AWAITING;
        c->since = time_now_mono_ms();
        pthread_mutex_lock(&e->lock);
        c->next = e->conns;
        if (e->conns)
                e->conns->prev = c;
        e->conns = c;
        pthread_mutex_unlock(&e->lock);
        return c;
}

static void conn_set(EdgeConn *c, int state) {
        if (!c || !c->edge)
                return;
        pthread_mutex_lock(&c->edge->lock);
        if (c->state != CONN_CUT && c->state != CONN_UPGRADED) {
                c->state = state;
                c->since = time_now_mono_ms();
        }
        pthread_mutex_unlock(&c->edge->lock);
}

void edge_conn_busy(EdgeConn *c) {
        conn_set(c, CONN_BUSY);
}

void edge_conn_idle(EdgeConn *c) {
        conn_set(c, CONN_AWAITING);
}

void edge_conn_upgraded(EdgeConn *c) {
        conn_set(c, CONN_UPGRADED);
}

void edge_conn_remove(EdgeConn *c) {
        if (!c)
                return;
        Edge *e = c->edge;
        if (e) {
                pthread_mutex_lock(&e->lock);
                if (c->prev)
                        c->prev->next = c->next;
                else
                        e->conns = c->next;
                if (c->next)
                        c->next->prev = c->prev;
                pthread_mutex_unlock(&e->lock);
        }
        free(c);
}

/* Cuts the server's connections whose next head is late: the server's
 * thread for it reads the end and closes. The socket is the server's
 * until edge_conn_remove, which waits for this lock. */
static void sweep_conns(Edge *e, uint64_t now) {
        pthread_mutex_lock(&e->lock);
        for (EdgeConn *c = e->conns; c; c = c->next)
                if (c->state == CONN_AWAITING && now - c->since >= e->cfg.head_ms) {
                        c->state = CONN_CUT;
                        (void)shutdown(c->fd, SHUT_RDWR);
                        atomic_fetch_add(&e->timed_out, 1);
                }
        pthread_mutex_unlock(&e->lock);
}

/* Waits for fd to have more than it had: new bytes, its end, or the time
 * (until). Level-triggered poll would return at once while peeked bytes
 * wait unread, so a second look waits on an edge of its own. */
static int more_bytes(int fd, int *epfd, bool first, uint64_t until) {
        uint64_t now = time_now_mono_ms();
        if (now >= until)
                return 0;
        if (first) {
                struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
                int r = poll(&p, 1, (int)(until - now));
                return r < 0 ? -errno : r;
        }
        if (*epfd < 0) {
                *epfd = epoll_create1(EPOLL_CLOEXEC);
                struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLET };
                if (*epfd < 0 || epoll_ctl(*epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
                        return -errno;
                /* Registered with bytes waiting: one event for those,
                 * taken; a look again catches what came before it was
                 * registered, and anything after it is an edge. */
                struct epoll_event got;
                (void)epoll_wait(*epfd, &got, 1, 0);
                return 1;
        }
        struct epoll_event got;
        int r = epoll_wait(*epfd, &got, 1, (int)(until - now));
        return r < 0 ? -errno : r;
}

int edge_next_head(Edge *e, int fd, unsigned wait_ms) {
        if (!e || fd < 0)
                return 0;
        uint64_t until = time_now_mono_ms() + wait_ms;
        char small[4096];
        char *buf = small, *big = NULL;
        size_t room = sizeof small;
        int epfd = -1, rc = 0;
        for (bool first = true;; first = false) {
                int r = more_bytes(fd, &epfd, first, until);
                if (r == -EINTR)
                        continue;
                if (r <= 0)
                        break;
                ssize_t n = recv(fd, buf, room, MSG_PEEK | MSG_DONTWAIT);
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                        continue;
                if (n <= 0)
                        break; /* the client's end: the server reads it too */
                long end = edge_head_end(buf, (size_t)n);
                if (end == 0 && (size_t)n >= room && room < e->cfg.head_max) {
                        /* A long head: look again with room for the longest. */
                        if (!(big = malloc(e->cfg.head_max)))
                                break;
                        buf = big;
                        room = e->cfg.head_max;
                        n = recv(fd, buf, room, MSG_PEEK | MSG_DONTWAIT);
                        if (n <= 0)
                                break;
                        end = edge_head_end(buf, (size_t)n);
                }
                const char *reason = NULL;
                char msg[160];
                int status = head_fault(e, end, (size_t)n, room, &reason, msg, sizeof msg);
                if (status) {
                        refusal_send(e, fd, status, reason, msg);
                        /* What it sent is read here, so that the server
                         * reads nothing but the end. */
                        drain(fd, buf, room, (size_t)n);
                        (void)shutdown(fd, SHUT_RDWR);
                        rc = -EBADMSG;
                        break;
                }
                if (end > 0)
                        break;
        }
        if (epfd >= 0)
                close(epfd);
        free(big);
        return rc;
}

/* ---- the thread ---- */

static void close_listening(Edge *e) {
        if (e->listen_fd < 0)
                return;
        (void)epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->listen_fd, NULL);
        close(e->listen_fd);
        e->listen_fd = -1;
        while (e->first)
                waiting_close(e, e->first, 0);
}

static void *edge_main(void *arg) {
        Edge *e = arg;
        uint64_t next_sweep = time_now_mono_ms() + SWEEP_MS;
        for (;;) {
                uint64_t now = time_now_mono_ms();
                uint64_t wake = next_sweep;
                if (e->first && e->first->deadline < wake)
                        wake = e->first->deadline;
                if (e->accept_paused_until && e->accept_paused_until < wake)
                        wake = e->accept_paused_until;
                /* Heads waiting for room: the server's count drops a moment
                 * after it says a connection closed. */
                if (atomic_load(&e->ready) > 0 && now + READY_POLL_MS < wake)
                        wake = now + READY_POLL_MS;
                int timeout = wake > now ? (int)(wake - now) : 0;
                struct epoll_event evs[64];
                int n = epoll_wait(e->epfd, evs, (int)ELEMENTSOF(evs), timeout);
                if (n < 0 && errno != EINTR) {
                        log_error(NULL, "http: the edge's wait: %s", strerror(errno));
                        break;
                }
                now = time_now_mono_ms();
                for (int i = 0; i < n; i++) {
                        void *p = evs[i].data.ptr;
                        if (p == &listen_tag) {
                                if (e->listen_fd >= 0)
                                        accept_all(e, now);
                        } else if (p == &wake_tag) {
                                uint64_t v;
                                (void)!read(e->wake_fd, &v, sizeof v);
                        } else
                                waiting_read(e, p, evs[i].events);
                }
                pthread_mutex_lock(&e->lock);
                bool quiesce = e->quiesce_asked && !e->quiesced, stop = e->stop_asked;
                pthread_mutex_unlock(&e->lock);
                if (quiesce || stop) {
                        close_listening(e);
                        pthread_mutex_lock(&e->lock);
                        e->quiesced = true;
                        pthread_cond_broadcast(&e->done);
                        pthread_mutex_unlock(&e->lock);
                        if (stop)
                                break;
                }
                hand_off_ready(e);
                while (e->first && e->first->deadline <= now) {
                        Waiting *w = e->first;
                        if (w->ready) {
                                w->ready = false;
                                atomic_fetch_sub(&e->ready, 1);
                                waiting_refuse(e, w, 503, "Service Unavailable",
                                               "the daemon holds as many connections as it may "
                                               "(--max-connections); try again", 0);
                                /* Its head, never read: read now, so
                                 * that the close is no reset. */
                                waiting_linger(e, w);
                                continue;
                        }
                        if (!w->lingering)
                                atomic_fetch_add(&e->timed_out, 1);
                        waiting_close(e, w, 0);
                }
                if (e->accept_paused_until && e->accept_paused_until <= now && e->listen_fd >= 0) {
                        e->accept_paused_until = 0;
                        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &listen_tag };
                        (void)epoll_ctl(e->epfd, EPOLL_CTL_MOD, e->listen_fd, &ev);
                }
                if (now >= next_sweep) {
                        sweep_conns(e, now);
                        next_sweep = now + SWEEP_MS;
                }
        }
        return NULL;
}

int edge_start(int listen_fd, const EdgeConfig *cfg, EdgeHandOff hand_off, void *userdata, Edge **ret) {
        if (!cfg->max_waiting || !cfg->max_waiting_per_peer || !cfg->head_ms || cfg->head_max < 1024)
                return -EINVAL;
        Edge *e = calloc(1, sizeof *e);
        if (!e)
                return -ENOMEM;
        e->cfg = *cfg;
        e->hand_off = hand_off;
        e->userdata = userdata;
        e->listen_fd = -1;
        e->epfd = -1;
        e->wake_fd = -1;
        pthread_mutex_init(&e->lock, NULL);
        pthread_cond_init(&e->done, NULL);
        int r = -ENOMEM;
        if (!(e->buf = malloc(cfg->head_max + 1)))
                goto fail;
        e->epfd = epoll_create1(EPOLL_CLOEXEC);
        e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        int fl = fcntl(listen_fd, F_GETFL);
        if (e->epfd < 0 || e->wake_fd < 0 || fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
                r = -errno;
                goto fail;
        }
        struct epoll_event lev = { .events = EPOLLIN, .data.ptr = &listen_tag };
        struct epoll_event wev = { .events = EPOLLIN, .data.ptr = &wake_tag };
        if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, listen_fd, &lev) < 0 ||
            epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->wake_fd, &wev) < 0) {
                r = -errno;
                goto fail;
        }
        e->listen_fd = listen_fd;
        if ((r = -pthread_create(&e->thread, NULL, edge_main, e)) < 0) {
                e->listen_fd = -1;
                goto fail;
        }
        e->started = true;
        *ret = e;
        return 0;
fail:
        if (e->epfd >= 0)
                close(e->epfd);
        if (e->wake_fd >= 0)
                close(e->wake_fd);
        free(e->buf);
        pthread_cond_destroy(&e->done);
        pthread_mutex_destroy(&e->lock);
        free(e);
        return r;
}

static void ask(Edge *e, bool stop) {
        pthread_mutex_lock(&e->lock);
        e->quiesce_asked = true;
        if (stop)
                e->stop_asked = true;
        pthread_mutex_unlock(&e->lock);
        uint64_t one = 1;
        (void)!write(e->wake_fd, &one, sizeof one);
}

void edge_quiesce(Edge *e) {
        if (!e || !e->started)
                return;
        ask(e, false);
        pthread_mutex_lock(&e->lock);
        while (!e->quiesced)
                pthread_cond_wait(&e->done, &e->lock);
        pthread_mutex_unlock(&e->lock);
}

void edge_free(Edge *e) {
        if (!e)
                return;
        if (e->started) {
                ask(e, true);
                pthread_join(e->thread, NULL);
        }
        /* The server's connections are its own; it is stopped before this. */
        for (unsigned b = 0; b < PEER_BUCKETS; b++)
                while (e->peers[b]) {
                        Peer *p = e->peers[b];
                        e->peers[b] = p->next;
                        free(p);
                }
        close(e->epfd);
        close(e->wake_fd);
        free(e->buf);
        pthread_cond_destroy(&e->done);
        pthread_mutex_destroy(&e->lock);
        free(e);
}

void edge_stats(Edge *e, EdgeStats *ret) {
        *ret = (EdgeStats){ 0 };
        if (!e)
                return;
        ret->waiting = atomic_load(&e->waiting);
        ret->ready = atomic_load(&e->ready);
        ret->handed = atomic_load(&e->handed);
        ret->refused_peer = atomic_load(&e->refused_peer);
        ret->evicted = atomic_load(&e->evicted);
        ret->timed_out = atomic_load(&e->timed_out);
        ret->malformed = atomic_load(&e->malformed);
}
