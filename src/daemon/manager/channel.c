#include "daemon/manager/channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "proto/proto.h"

/* JSON from the agent nests no deeper than this; deeper is a protocol error. */
#define CHAN_MAX_JSON_DEPTH 64
/* Non-DATA events (EVENT, EOF, RESULT) a stream may hold unconsumed, with a
 * fixed charge per event so that a flood of empty frames counts too. The list
 * reply (EVENT batches of up to PROTO_MAX_JSON) of 10000 entries fits. */
#define CHAN_MAX_QUEUED_CONTROL (4u * 1024u * 1024u)
#define CHAN_EVENT_CHARGE 256u
/* Past this many queued events a stream's DATA is merged into the newest
 * queued DATA of the same fd (stdout and stderr may then reorder between
 * each other, never within one fd), so that a flood of tiny frames costs
 * bytes, not events. */
#define CHAN_MAX_EVENTS 4096u
/* Consumed DATA goes back to the agent as WINDOW in batches of this much.
 * Holding back less than a batch never stalls the agent: it still has the
 * rest of its window, and whatever fills that gets consumed and acked. */
#define CHAN_WINDOW_BATCH (64u * 1024u)
/* A write that makes no progress for this long means the agent is stuck:
 * the channel is closed rather than holding every request thread. */
#define CHAN_SEND_TIMEOUT_S 60
/* A frame this small leaves in one piece of a unix stream socket (one
 * buffer of the kernel's): the agent never gets part of it, whenever the
 * daemon dies. A bigger one is written only once the socket has room for all
 * of it (frame_room), and DATA to the agent is cut so that a frame fits in
 * what a writable socket has free (c->data_max, from its send buffer, which
 * the daemon raises to CHAN_SNDBUF where it may). */
#define CHAN_ONE_PIECE (32u * 1024u)
#define CHAN_SNDBUF (1024 * 1024)
#define CHAN_DATA_MIN (16u * 1024u)
/* What the kernel counts beyond the bytes of a frame's pieces. */
#define CHAN_ROOM_SLACK (16u * 1024u)
/* A daemon taking a channel over skips what the agent sent before its
 * DETACH's echo: a header and the token (docs/protocol.md). */
#define CHAN_SYNC_LEN (PROTO_HEADER_SIZE + CHANNEL_TOKEN_LEN)

typedef struct QueuedEvent {
        struct QueuedEvent *next;
        size_t charge; /* against queued_control */
        size_t cap;    /* allocated bytes of ev.data */
        ChanEvent ev;
} QueuedEvent;

struct ChanStream {
        Channel *c;
        uint32_t id;
        pthread_cond_t cond;
        QueuedEvent *head, *tail;
        size_t n_events;
        QueuedEvent *last_data[3]; /* the newest queued DATA event per fd */
        size_t queued_data;        /* DATA bytes in the queue */
        size_t queued_control;     /* charge of other events in the queue */
        uint64_t credit;           /* DATA bytes we may still send */
        uint64_t in_held;          /* DATA bytes received and not yet credited back */
        uint64_t to_ack;           /* consumed, not yet sent as WINDOW */
        bool remote;               /* opened by the agent (egress relay): roles reversed */
        bool result;               /* RESULT received (or, remote, sent): the stream is over */
        bool result_taken;
        bool cancel_sent;
        ChanCreditFn on_credit; /* under c->lock */
        void *on_credit_userdata;
        ChanStream *prev, *next;
};

struct Channel {
        int fd;
        int wake[2]; /* pipe that wakes the reader thread */
        /* Taken over from a supervisor (taken_over, fixed at the start): the
         * reader skips all before the agent's echo of sync (syncing and the
         * tail are the reader thread's alone). Let go at the daemon's stop
         * (keep_socket, under lock): the socket, which the supervisor
         * shares, is not shut down. */
        bool taken_over;
        bool syncing;
        bool keep_socket;
        size_t sndbuf;   /* the socket's send buffer, fixed at the start; 0: not a socket */
        size_t data_max; /* the largest DATA payload to the agent */
        uint8_t sync[CHAN_SYNC_LEN];
        uint8_t sync_tail[CHAN_SYNC_LEN - 1];
        size_t sync_tail_len;
        pthread_mutex_t lock;
        pthread_mutex_t write_lock; /* held around each whole frame */
        pthread_cond_t cond;        /* hello, pong, closed */
        pthread_t reader;
        bool open;
        bool freeing;
        char reason[128];
        json_t *hello;
        uint64_t ping_sent, pong_seen;
        /* When anything last arrived from the agent (monotonic ms): written
         * by the reader thread on every read, without the lock. */
        _Atomic int64_t last_rx_ms;
        /* The heartbeat, under lock: the token of the ping it waits for, when
         * that ping came due (0: none waited for), whether it still has to go
         * out (the socket was full), and when the last one went out. */
        uint64_t hb_token;
        int64_t hb_due_ms;
        bool hb_unsent;
        int64_t hb_sent_ms;
        ChanStream *streams;
        size_t n_streams;
        uint32_t next_id;
        unsigned refs;
        ChannelClosedFn on_closed;
        void *userdata;
        ChannelAcceptFn accept_fn;
        void *accept_userdata;
};

static void channel_unref(Channel *c) {
        pthread_mutex_lock(&c->lock);
        bool last = --c->refs == 0;
        pthread_mutex_unlock(&c->lock);
        if (!last)
                return;
        pthread_mutex_destroy(&c->lock);
        pthread_mutex_destroy(&c->write_lock);
        pthread_cond_destroy(&c->cond);
        if (c->hello)
                json_decref(c->hello);
        free(c);
}

/* Waits on cond with c->lock held; -ETIMEDOUT once the deadline passed
 * (NULL: no deadline). */
static int wait_until(pthread_cond_t *cond, pthread_mutex_t *lock, const struct timespec *deadline) {
        if (!deadline) {
                pthread_cond_wait(cond, lock);
                return 0;
        }
        return pthread_cond_timedwait(cond, lock, deadline) == ETIMEDOUT ? -ETIMEDOUT : 0;
}

/* With c->lock held. */
static void mark_closed_locked(Channel *c, const char *reason) {
        if (!c->open)
                return;
        c->open = false;
        snprintf(c->reason, sizeof c->reason, "%s", reason);
        pthread_cond_broadcast(&c->cond);
        for (ChanStream *s = c->streams; s; s = s->next)
                pthread_cond_broadcast(&s->cond);
        if (c->wake[1] >= 0)
                (void)!write(c->wake[1], "x", 1);
}

static void mark_closed(Channel *c, const char *reason) {
        pthread_mutex_lock(&c->lock);
        mark_closed_locked(c, reason);
        pthread_mutex_unlock(&c->lock);
}

/* Waits, with the write lock held, until the socket (whose send buffer is
 * sndbuf) has room for a whole frame of `total` bytes, so that the write
 * never blocks half-way: 0, or -ETIMEDOUT after the send timeout. Not a
 * socket, or one whose buffer is smaller than the frame: 0 at once (no piece
 * is promised there). */
static int frame_room(int fd, size_t sndbuf, size_t total) {
        if (total + CHAN_ROOM_SLACK > sndbuf)
                return 0;
        int64_t end = (int64_t)time_now_mono_ms() + CHAN_SEND_TIMEOUT_S * 1000;
        for (;;) {
                int queued = 0;
                if (ioctl(fd, SIOCOUTQ, &queued) < 0 || queued < 0)
                        return 0;
                if ((size_t)queued + total + CHAN_ROOM_SLACK <= sndbuf)
                        return 0;
                int64_t left = end - (int64_t)time_now_mono_ms();
                if (left <= 0)
                        return -ETIMEDOUT;
                /* Writable: at most a quarter of the buffer is in use. */
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                if (poll(&pfd, 1, (int)left) < 0 && errno != EINTR)
                        return -errno;
        }
}

/* fd's send buffer, raised first where the daemon may (CAP_NET_ADMIN); 0
 * for what is not a socket. */
static size_t channel_sndbuf(int fd) {
        int want = CHAN_SNDBUF, sndbuf = 0;
        socklen_t len = sizeof sndbuf;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof want);
        if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) < 0 || sndbuf <= 0)
                return 0;
        return (size_t)sndbuf;
}

/* The largest DATA payload for a send buffer of sndbuf: what frame_room
 * finds free in a writable socket (at most a quarter of its buffer in use),
 * less the slack; a default buffer holds frames of about 128 KiB. Not a
 * socket: the protocol's largest. */
static size_t channel_data_max(size_t sndbuf) {
        if (sndbuf == 0)
                return PROTO_MAX_PAYLOAD;
        size_t free_room = sndbuf / 4 * 3;
        if (free_room < PROTO_HEADER_SIZE + CHAN_ROOM_SLACK + CHAN_DATA_MIN)
                return CHAN_DATA_MIN;
        size_t max = free_room - PROTO_HEADER_SIZE - CHAN_ROOM_SLACK;
        return max < PROTO_MAX_PAYLOAD ? max : PROTO_MAX_PAYLOAD;
}

static int send_frame(Channel *c, uint8_t type, uint8_t flags, uint32_t stream, const void *payload,
                      size_t len) {
        pthread_mutex_lock(&c->write_lock);
        int r = c->fd < 0 ? -EPIPE : 0;
        if (r == 0 && PROTO_HEADER_SIZE + len > CHAN_ONE_PIECE)
                r = frame_room(c->fd, c->sndbuf, PROTO_HEADER_SIZE + len);
        if (r == 0)
                r = proto_write_frame(c->fd, type, flags, stream, payload, len);
        pthread_mutex_unlock(&c->write_lock);
        if (r < 0 && r != -EINVAL) {
                mark_closed(c, "write to the agent failed");
                return -EPIPE;
        }
        return r;
}

static json_t *parse_json(const uint8_t *p, size_t len) {
        if (!json_depth_ok(p, len, CHAN_MAX_JSON_DEPTH))
                return NULL;
        json_error_t err;
        return json_loadb((const char *)p, len, 0, &err);
}

static ChanStream *find_stream(Channel *c, uint32_t id) {
        for (ChanStream *s = c->streams; s; s = s->next)
                if (s->id == id)
                        return s;
        return NULL;
}

static void queue_event(ChanStream *s, QueuedEvent *q) {
        if (s->tail)
                s->tail->next = q;
        else
                s->head = q;
        s->tail = q;
        s->n_events++;
        pthread_cond_broadcast(&s->cond);
}

/* One stream frame, with c->lock held. Returns a reason to close the channel,
 * or NULL. */
static const char *dispatch_stream_locked(Channel *c, const ProtoHeader *h, const uint8_t *p) {
        ChanStream *s = find_stream(c, h->stream);
        if (!s || s->result)
                return NULL; /* unknown or finished: may have been in flight */
        if (h->type == PROTO_WINDOW) {
                uint32_t v = proto_get_u32(p);
                bool had_none = s->credit == 0;
                if (s->credit + v <= (1ull << 40))
                        s->credit += v;
                pthread_cond_broadcast(&s->cond);
                if (had_none && s->credit > 0 && s->on_credit)
                        s->on_credit(s->on_credit_userdata);
                return NULL;
        }
        if (h->type == PROTO_OPEN)
                return NULL;
        if (h->type == PROTO_CANCEL) {
                if (!s->remote)
                        return NULL;
                /* The agent gave up on its connection: the end, for the reader. */
                QueuedEvent *q = calloc(1, sizeof(QueuedEvent));
                if (!q)
                        return "out of memory";
                q->ev.type = CHAN_EV_RESULT;
                q->ev.json = json_pack("{s:b}", "cancelled", 1);
                q->charge = CHAN_EVENT_CHARGE;
                s->queued_control += q->charge;
                s->result = true;
                queue_event(s, q);
                return NULL;
        }
        /* Each side sends DATA only on its own fds: the agent says nothing on
         * fd 0 of a host stream, nor anything but fd 0 on its own streams. */
        if (h->type == PROTO_DATA && (s->remote ? h->flags != PROTO_FD_IN : h->flags == PROTO_FD_IN))
                return NULL;
        if (s->remote && (h->type == PROTO_EVENT || h->type == PROTO_RESULT))
                return NULL;
        if (h->type == PROTO_DATA && s->in_held + h->length > PROTO_INITIAL_WINDOW)
                return "agent sent DATA beyond its credit";
        if (h->type != PROTO_DATA &&
            s->queued_control + h->length + CHAN_EVENT_CHARGE > CHAN_MAX_QUEUED_CONTROL)
                return "agent queued too many events on one stream";

        if (h->type == PROTO_DATA) {
                if (h->length == 0)
                        return NULL;
                QueuedEvent *last = s->last_data[h->flags];
                if (last && (last == s->tail || s->n_events >= CHAN_MAX_EVENTS)) {
                        if (last->ev.len + h->length > last->cap) {
                                size_t cap = 2 * (last->ev.len + h->length);
                                uint8_t *nd = realloc(last->ev.data, cap);
                                if (!nd)
                                        return "out of memory";
                                last->ev.data = nd;
                                last->cap = cap;
                        }
                        memcpy(last->ev.data + last->ev.len, p, h->length);
                        last->ev.len += h->length;
                        s->in_held += h->length;
                        s->queued_data += h->length;
                        return NULL;
                }
        }

        QueuedEvent *q = calloc(1, sizeof(QueuedEvent));
        if (!q)
                return "out of memory";
        switch (h->type) {
        case PROTO_DATA:
                q->ev.type = CHAN_EV_DATA;
                q->ev.fd = h->flags;
                q->ev.len = h->length;
                q->cap = h->length;
                q->ev.data = malloc(h->length);
                if (!q->ev.data) {
                        free(q);
                        return "out of memory";
                }
                memcpy(q->ev.data, p, h->length);
                s->in_held += h->length;
                s->queued_data += h->length;
                s->last_data[h->flags] = q;
                break;
        case PROTO_EOF:
                q->ev.type = CHAN_EV_EOF;
                q->ev.fd = h->flags;
                break;
        case PROTO_EVENT:
        case PROTO_RESULT:
                q->ev.type = h->type == PROTO_EVENT ? CHAN_EV_EVENT : CHAN_EV_RESULT;
                q->ev.json = parse_json(p, h->length);
                if (!q->ev.json) {
                        free(q);
                        return "agent sent invalid JSON";
                }
                if (h->type == PROTO_RESULT)
                        s->result = true;
                break;
        default:
                free(q);
                return NULL;
        }
        if (h->type != PROTO_DATA) {
                q->charge = h->length + CHAN_EVENT_CHARGE;
                s->queued_control += q->charge;
        }
        queue_event(s, q);
        return NULL;
}

static void stream_link_locked(Channel *c, ChanStream *s) {
        s->c = c;
        s->next = c->streams;
        if (c->streams)
                c->streams->prev = s;
        c->streams = s;
        c->n_streams++;
        c->refs++;
}

static ChanStream *stream_alloc(void) {
        ChanStream *s = calloc(1, sizeof(ChanStream));
        if (!s)
                return NULL;
        if (time_cond_init_mono(&s->cond) < 0) {
                free(s);
                return NULL;
        }
        s->credit = PROTO_INITIAL_WINDOW;
        return s;
}

static int refuse_remote(Channel *c, uint32_t id, const char *message) {
        _cleanup_json_ json_t *j = json_pack("{s:{s:s,s:s}}", "error", "code", "busy", "message", message);
        _cleanup_free_ char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
        if (!body)
                return -ENOMEM;
        return send_frame(c, PROTO_RESULT, 0, id, body, strlen(body));
}

/* An OPEN from the agent: a connection to the egress relay. */
static const char *accept_remote(Channel *c, uint32_t id, const uint8_t *p, size_t len) {
        json_t *req = parse_json(p, len);
        if (!req || !json_is_object(req)) {
                if (req)
                        json_decref(req);
                return "agent sent an invalid OPEN";
        }
        ChanStream *s = stream_alloc();
        pthread_mutex_lock(&c->lock);
        ChannelAcceptFn fn = c->accept_fn;
        void *ud = c->accept_userdata;
        const char *refusal = !fn                                  ? "egress is not enabled"
                              : !s                                 ? "out of memory"
                              : find_stream(c, id)                 ? "stream id in use"
                              : c->n_streams >= CHANNEL_MAX_STREAMS ? "too many connections"
                                                                   : NULL;
        if (!refusal) {
                s->id = id;
                s->remote = true;
                stream_link_locked(c, s);
        }
        pthread_mutex_unlock(&c->lock);
        if (refusal) {
                json_decref(req);
                if (s) {
                        pthread_cond_destroy(&s->cond);
                        free(s);
                }
                return refuse_remote(c, id, refusal) < 0 ? "write to the agent failed" : NULL;
        }
        fn(ud, s, req);
        return NULL;
}

void channel_set_acceptor(Channel *c, ChannelAcceptFn fn, void *userdata) {
        pthread_mutex_lock(&c->lock);
        c->accept_fn = fn;
        c->accept_userdata = userdata;
        pthread_mutex_unlock(&c->lock);
}

static const char *dispatch(Channel *c, const ProtoHeader *h, const uint8_t *p) {
        switch (h->type) {
        case PROTO_PING:
                return send_frame(c, PROTO_PONG, 0, 0, p, h->length) < 0 ? "write to the agent failed"
                                                                         : NULL;
        case PROTO_PONG:
                if (h->length == 8) {
                        uint64_t token = ((uint64_t)proto_get_u32(p) << 32) | proto_get_u32(p + 4);
                        pthread_mutex_lock(&c->lock);
                        if (token > c->pong_seen && token <= c->ping_sent)
                                c->pong_seen = token;
                        pthread_cond_broadcast(&c->cond);
                        pthread_mutex_unlock(&c->lock);
                }
                return NULL;
        case PROTO_HELLO: {
                json_t *j = parse_json(p, h->length);
                if (!j || !json_is_object(j)) {
                        if (j)
                                json_decref(j);
                        return "agent sent an invalid HELLO";
                }
                pthread_mutex_lock(&c->lock);
                if (!c->hello)
                        c->hello = TAKE_PTR(j);
                pthread_cond_broadcast(&c->cond);
                pthread_mutex_unlock(&c->lock);
                if (j)
                        json_decref(j);
                return NULL;
        }
        case PROTO_OPEN:
                if ((h->stream & 1u) == 0)
                        return accept_remote(c, h->stream, p, h->length);
                return NULL;
        default: {
                pthread_mutex_lock(&c->lock);
                const char *why = dispatch_stream_locked(c, h, p);
                pthread_mutex_unlock(&c->lock);
                return why;
        }
        }
}

/* While syncing: how many bytes of buf to skip, all of them until the echo
 * of c->sync has been read (the bytes after it are the agent's frames). The
 * echo may straddle reads: the last bytes seen are kept. */
static size_t sync_skip(Channel *c, const uint8_t *buf, size_t n) {
        uint8_t edge[2 * CHAN_SYNC_LEN];
        size_t head = n < CHAN_SYNC_LEN - 1 ? n : CHAN_SYNC_LEN - 1;
        memcpy(edge, c->sync_tail, c->sync_tail_len);
        memcpy(edge + c->sync_tail_len, buf, head);
        const uint8_t *at = memmem(edge, c->sync_tail_len + head, c->sync, CHAN_SYNC_LEN);
        size_t end = 0;
        if (at)
                end = (size_t)(at - edge) + CHAN_SYNC_LEN - c->sync_tail_len;
        else if ((at = memmem(buf, n, c->sync, CHAN_SYNC_LEN)))
                end = (size_t)(at - buf) + CHAN_SYNC_LEN;
        if (end) {
                c->syncing = false;
                return end;
        }
        /* Not yet: keep the last CHAN_SYNC_LEN - 1 bytes of tail and buf. */
        size_t total = c->sync_tail_len + n, keep = total < sizeof c->sync_tail ? total : sizeof c->sync_tail;
        uint8_t next[sizeof c->sync_tail];
        for (size_t i = 0; i < keep; i++) {
                size_t from = total - keep + i;
                next[i] = from < c->sync_tail_len ? c->sync_tail[from] : buf[from - c->sync_tail_len];
        }
        memcpy(c->sync_tail, next, keep);
        c->sync_tail_len = keep;
        return n;
}

static void *reader_main(void *arg) {
        Channel *c = arg;
        ProtoReader *r = proto_reader_new();
        /* Room for the largest frame, so that one arrives in one read; on the
         * heap, as threads have bounded stacks. */
        const size_t buf_size = PROTO_HEADER_SIZE + PROTO_MAX_PAYLOAD;
        uint8_t *buf = malloc(buf_size);
        const char *why = r && buf ? NULL : "out of memory";
        while (!why) {
                struct pollfd pfd[2] = {{.fd = c->fd, .events = POLLIN},
                                        {.fd = c->wake[0], .events = POLLIN}};
                if (poll(pfd, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        why = "poll failed";
                        break;
                }
                if (pfd[1].revents)
                        break; /* closed by a writer or channel_free; reason already set */
                ssize_t n = read(c->fd, buf, buf_size);
                if (n < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        why = "read from the agent failed";
                        break;
                }
                if (n == 0) {
                        why = "the agent closed the channel";
                        break;
                }
                /* Any byte is a sign of life, even a frame still incomplete:
                 * a busy sandbox that streams output is never taken for dead. */
                atomic_store_explicit(&c->last_rx_ms, (int64_t)time_now_mono_ms(), memory_order_relaxed);
                size_t skip = c->syncing ? sync_skip(c, buf, (size_t)n) : 0;
                if (skip == (size_t)n)
                        continue;
                if (proto_reader_feed(r, buf + skip, (size_t)n - skip) < 0) {
                        why = "malformed frame from the agent";
                        break;
                }
                for (;;) {
                        ProtoHeader h;
                        const uint8_t *payload;
                        int k = proto_reader_next(r, &h, &payload);
                        if (k == 0)
                                break;
                        if (k < 0) {
                                why = "malformed frame from the agent";
                                break;
                        }
                        why = dispatch(c, &h, payload);
                        if (why)
                                break;
                }
        }
        proto_reader_free(r);
        free(buf);
        /* The agent learns at once that the channel is over (it exits, which
         * ends the sandbox), and writers blocked on a full socket wake up.
         * Not a socket: the owner's on_closed has to end the agent. Not
         * when the channel was let go: the supervisor holds it on. */
        pthread_mutex_lock(&c->lock);
        bool keep = c->keep_socket;
        pthread_mutex_unlock(&c->lock);
        if (!keep)
                shutdown(c->fd, SHUT_RDWR);

        pthread_mutex_lock(&c->lock);
        mark_closed_locked(c, why ? why : "closed");
        bool notify = !c->freeing && c->on_closed;
        char reason[sizeof c->reason];
        memcpy(reason, c->reason, sizeof reason);
        pthread_mutex_unlock(&c->lock);
        if (notify)
                c->on_closed(c->userdata, reason);
        return NULL;
}

static Channel *channel_start(int fd, bool take_over, ChannelClosedFn on_closed, void *userdata) {
        if (fd < 0)
                return NULL;
        Channel *c = calloc(1, sizeof(Channel));
        if (!c) {
                close(fd);
                return NULL;
        }
        if (take_over) {
                ProtoHeader h = {.length = CHANNEL_TOKEN_LEN, .type = PROTO_DETACH};
                if (proto_header_encode(&h, c->sync) < 0 ||
                    random_bytes(c->sync + PROTO_HEADER_SIZE, CHANNEL_TOKEN_LEN) < 0) {
                        close(fd);
                        free(c);
                        return NULL;
                }
                c->syncing = c->taken_over = true;
        }
        c->fd = fd;
        c->wake[0] = c->wake[1] = -1;
        c->open = true;
        c->refs = 1;
        c->next_id = 1;
        c->on_closed = on_closed;
        c->userdata = userdata;
        atomic_init(&c->last_rx_ms, (int64_t)time_now_mono_ms());
        pthread_mutex_init(&c->lock, NULL);
        pthread_mutex_init(&c->write_lock, NULL);
        if (time_cond_init_mono(&c->cond) < 0 || pipe2(c->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
                pthread_mutex_destroy(&c->lock);
                pthread_mutex_destroy(&c->write_lock);
                close(fd);
                free(c);
                return NULL;
        }
        /* Writes block (whole frames under the write lock); reads are polled. */
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0 && (fl & O_NONBLOCK))
                (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        struct timeval tv = {.tv_sec = CHAN_SEND_TIMEOUT_S};
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* not a socket: no bound */
        c->sndbuf = channel_sndbuf(fd);
        c->data_max = channel_data_max(c->sndbuf);
        if (pthread_create(&c->reader, NULL, reader_main, c) != 0) {
                close(c->wake[0]);
                close(c->wake[1]);
                pthread_mutex_destroy(&c->lock);
                pthread_mutex_destroy(&c->write_lock);
                pthread_cond_destroy(&c->cond);
                close(fd);
                free(c);
                return NULL;
        }
        return c;
}

Channel *channel_new(int fd, ChannelClosedFn on_closed, void *userdata) {
        return channel_start(fd, false, on_closed, userdata);
}

Channel *channel_take_over(int fd, ChannelClosedFn on_closed, void *userdata) {
        return channel_start(fd, true, on_closed, userdata);
}

int channel_wait_hello(Channel *c, int timeout_ms, json_t **ret_hello) {
        struct timespec dl;
        if (timeout_ms >= 0)
                time_mono_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&c->lock);
        int r = 0;
        while (!c->hello && c->open && r == 0)
                r = wait_until(&c->cond, &c->lock, timeout_ms >= 0 ? &dl : NULL);
        if (c->hello) {
                *ret_hello = json_incref(c->hello);
                r = 0;
        } else if (!c->open)
                r = -EPIPE;
        pthread_mutex_unlock(&c->lock);
        return r;
}

int channel_attach(Channel *c, int timeout_ms, json_t **ret_hello) {
        static const char body[] = "{}";
        int r = 0;
        /* Taken over: DETACH first, whose echo marks where the agent's
         * frames begin (read by the reader thread alone once started, but
         * c->sync is fixed before). */
        if (c->taken_over)
                r = send_frame(c, PROTO_DETACH, 0, 0, c->sync + PROTO_HEADER_SIZE, CHANNEL_TOKEN_LEN);
        if (r == 0)
                r = send_frame(c, PROTO_ATTACH, 0, 0, body, sizeof(body) - 1);
        if (r < 0)
                return -EPIPE;
        return channel_wait_hello(c, timeout_ms, ret_hello);
}

int channel_adopt_stream(Channel *c, uint32_t id, ChanStream **ret) {
        if ((id & 1u) == 0 || id == UINT32_MAX)
                return -EINVAL;
        ChanStream *s = stream_alloc();
        if (!s)
                return -ENOMEM;
        pthread_mutex_lock(&c->lock);
        int r = !c->open                              ? -EPIPE
                : find_stream(c, id)                  ? -EEXIST
                : c->n_streams >= CHANNEL_MAX_STREAMS ? -EMFILE
                                                      : 0;
        if (r == 0) {
                s->id = id;
                stream_link_locked(c, s);
                /* The ids the daemon opens from now on start past it. */
                if (c->next_id <= id && id + 2 > id)
                        c->next_id = id + 2;
        }
        pthread_mutex_unlock(&c->lock);
        if (r < 0) {
                pthread_cond_destroy(&s->cond);
                free(s);
                return r;
        }
        /* Its first credit: what the agent held for it may now come. */
        uint8_t credit[4];
        proto_put_u32(credit, PROTO_INITIAL_WINDOW);
        if (send_frame(c, PROTO_WINDOW, 0, id, credit, sizeof credit) < 0) {
                s->result = true; /* nothing to cancel */
                chan_stream_free(s);
                return -EPIPE;
        }
        *ret = s;
        return 0;
}

int channel_ping(Channel *c, int timeout_ms) {
        struct timespec dl;
        if (timeout_ms >= 0)
                time_mono_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&c->lock);
        if (!c->open) {
                pthread_mutex_unlock(&c->lock);
                return -EPIPE;
        }
        uint64_t token = ++c->ping_sent;
        pthread_mutex_unlock(&c->lock);
        uint8_t p[8];
        proto_put_u32(p, (uint32_t)(token >> 32));
        proto_put_u32(p + 4, (uint32_t)token);
        if (send_frame(c, PROTO_PING, 0, 0, p, sizeof p) < 0)
                return -EPIPE;
        pthread_mutex_lock(&c->lock);
        int r = 0;
        while (c->pong_seen < token && c->open && r == 0)
                r = wait_until(&c->cond, &c->lock, timeout_ms >= 0 ? &dl : NULL);
        if (c->pong_seen >= token)
                r = 0;
        else if (!c->open)
                r = -EPIPE;
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* Sends one small frame only if that cannot block: the write lock is free and
 * the socket has room. 0 sent, -EAGAIN not now, -EPIPE the channel broke. */
static int try_send_small(Channel *c, uint8_t type, const void *payload, size_t len) {
        uint8_t buf[PROTO_HEADER_SIZE + 16];
        ProtoHeader h = {.length = (uint32_t)len, .type = type};
        if (len > 16 || proto_header_encode(&h, buf) < 0)
                return -EINVAL;
        memcpy(buf + PROTO_HEADER_SIZE, payload, len);
        size_t total = PROTO_HEADER_SIZE + len;
        if (pthread_mutex_trylock(&c->write_lock) != 0)
                return -EAGAIN;
        if (c->fd < 0) {
                pthread_mutex_unlock(&c->write_lock);
                return -EPIPE;
        }
        ssize_t n = send(c->fd, buf, total, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK) {
                /* A pipe: writable means room for a write this small, which
                 * the kernel makes atomic (below PIPE_BUF). */
                struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
                n = poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLOUT) ? write(c->fd, buf, total) : -1;
                if (n < 0 && errno != EPIPE)
                        errno = EAGAIN;
        }
        int r = 0;
        if (n < 0)
                r = errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -EAGAIN : -EPIPE;
        else if ((size_t)n < total) {
                /* Part of a frame is out: the rest must follow before any
                 * other frame, or the stream is garbage. Blocking here is
                 * bounded by the socket's send timeout. */
                if (io_write_all(c->fd, buf + n, total - (size_t)n) < 0)
                        r = -EPIPE;
        }
        pthread_mutex_unlock(&c->write_lock);
        if (r == -EPIPE)
                mark_closed(c, "write to the agent failed");
        return r;
}

int channel_heartbeat(Channel *c, int64_t now_ms, int64_t interval_ms, int64_t deadline_ms) {
        pthread_mutex_lock(&c->lock);
        if (!c->open) {
                pthread_mutex_unlock(&c->lock);
                return -EPIPE;
        }
        if (c->hb_due_ms && !c->hb_unsent && c->pong_seen >= c->hb_token)
                c->hb_due_ms = 0; /* answered */
        if (!c->hb_due_ms && now_ms - c->hb_sent_ms >= interval_ms) {
                c->hb_due_ms = now_ms;
                c->hb_unsent = true;
        }
        uint64_t token = 0;
        if (c->hb_unsent)
                token = ++c->ping_sent;
        pthread_mutex_unlock(&c->lock);

        if (token) {
                uint8_t p[8];
                proto_put_u32(p, (uint32_t)(token >> 32));
                proto_put_u32(p + 4, (uint32_t)token);
                int r = try_send_small(c, PROTO_PING, p, sizeof p);
                if (r == -EPIPE)
                        return -EPIPE;
                if (r == 0) {
                        pthread_mutex_lock(&c->lock);
                        c->hb_token = token;
                        c->hb_unsent = false;
                        c->hb_sent_ms = now_ms;
                        pthread_mutex_unlock(&c->lock);
                }
                /* Not sent (a writer holds the lock, or the socket is full):
                 * tried again next round; the silence counts from when it came
                 * due all the same. An agent that reads would make room. */
        }

        pthread_mutex_lock(&c->lock);
        int64_t since = c->hb_due_ms;
        pthread_mutex_unlock(&c->lock);
        if (!since)
                return 0;
        int64_t rx = atomic_load_explicit(&c->last_rx_ms, memory_order_relaxed);
        if (rx > since)
                since = rx;
        return now_ms - since >= deadline_ms ? -ETIMEDOUT : 0;
}

void channel_heartbeat_reset(Channel *c, int64_t now_ms) {
        pthread_mutex_lock(&c->lock);
        c->hb_due_ms = 0;
        c->hb_unsent = false;
        c->hb_sent_ms = now_ms;
        pthread_mutex_unlock(&c->lock);
        atomic_store_explicit(&c->last_rx_ms, now_ms, memory_order_relaxed);
}

size_t channel_stream_count(Channel *c) {
        pthread_mutex_lock(&c->lock);
        size_t n = c->n_streams;
        pthread_mutex_unlock(&c->lock);
        return n;
}

bool channel_is_open(Channel *c) {
        pthread_mutex_lock(&c->lock);
        bool open = c->open;
        pthread_mutex_unlock(&c->lock);
        return open;
}

void channel_shutdown(Channel *c) {
        if (!c)
                return;
        mark_closed(c, "closed by the host");
        pthread_mutex_lock(&c->write_lock);
        if (c->fd >= 0)
                shutdown(c->fd, SHUT_RDWR);
        pthread_mutex_unlock(&c->write_lock);
}

void channel_let_go(Channel *c) {
        if (!c)
                return;
        pthread_mutex_lock(&c->lock);
        c->keep_socket = true;
        mark_closed_locked(c, "closed by the host");
        pthread_mutex_unlock(&c->lock);
}

void channel_free(Channel *c) {
        if (!c)
                return;
        pthread_mutex_lock(&c->lock);
        c->freeing = true;
        mark_closed_locked(c, "closed by the host");
        bool keep = c->keep_socket;
        pthread_mutex_unlock(&c->lock);
        /* Wakes writers blocked on a full socket; pipes have no equivalent.
         * Not one let go: its supervisor holds it on for the agent. */
        if (!keep)
                shutdown(c->fd, SHUT_RDWR);
        pthread_join(c->reader, NULL);
        pthread_mutex_lock(&c->write_lock);
        close(c->fd);
        c->fd = -1;
        pthread_mutex_unlock(&c->write_lock);
        pthread_mutex_lock(&c->lock);
        close(c->wake[0]);
        close(c->wake[1]);
        c->wake[0] = c->wake[1] = -1;
        pthread_mutex_unlock(&c->lock);
        channel_unref(c);
}

/* write_locked: the caller holds write_lock (a checkpoint). */
static int open_stream(Channel *c, json_t *request, bool write_locked, ChanStream **ret) {
        _cleanup_free_ char *body = json_dumps(request, JSON_COMPACT);
        if (!body)
                return -ENOMEM;
        size_t len = strlen(body);
        if (len > PROTO_MAX_JSON)
                return -E2BIG;
        ChanStream *s = stream_alloc();
        if (!s)
                return -ENOMEM;

        pthread_mutex_lock(&c->lock);
        if (!c->open || c->n_streams >= CHANNEL_MAX_STREAMS) {
                int r = c->open ? -EMFILE : -EPIPE;
                pthread_mutex_unlock(&c->lock);
                pthread_cond_destroy(&s->cond);
                free(s);
                return r;
        }
        /* Odd ids, skipping those still in use after a wrap-around. */
        do {
                s->id = c->next_id;
                c->next_id += 2;
                if (c->next_id < 2)
                        c->next_id = 1;
        } while (find_stream(c, s->id));
        stream_link_locked(c, s);
        pthread_mutex_unlock(&c->lock);

        /* Linked before the OPEN goes out, so that no reply can be missed. */
        int w;
        if (write_locked) {
                w = c->fd < 0 ? -EPIPE : 0;
                if (w == 0 && PROTO_HEADER_SIZE + len > CHAN_ONE_PIECE)
                        w = frame_room(c->fd, c->sndbuf, PROTO_HEADER_SIZE + len);
                if (w == 0)
                        w = proto_write_frame(c->fd, PROTO_OPEN, 0, s->id, body, len);
                if (w < 0) {
                        mark_closed(c, "write to the agent failed");
                        w = -EPIPE;
                }
        } else
                w = send_frame(c, PROTO_OPEN, 0, s->id, body, len);
        if (w < 0) {
                s->result = true; /* nothing to cancel */
                chan_stream_free(s);
                return -EPIPE;
        }
        *ret = s;
        return 0;
}

int channel_open_stream(Channel *c, json_t *request, ChanStream **ret) {
        return open_stream(c, request, false, ret);
}

int channel_checkpoint_begin(Channel *c, json_t *request, int timeout_ms) {
        pthread_mutex_lock(&c->write_lock);
        ChanStream *s = NULL;
        int r = open_stream(c, request, true, &s);
        if (r < 0) {
                pthread_mutex_unlock(&c->write_lock);
                return r;
        }
        /* Waited for by its flag, not taken with chan_stream_next: taking
         * DATA (which a hostile agent may send) returns credit, a write,
         * and the write lock is ours. */
        struct timespec dl;
        time_mono_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&c->lock);
        int w = 0;
        while (!s->result && c->open && w == 0)
                w = wait_until(&s->cond, &c->lock, &dl);
        bool answered = s->result, open = c->open;
        bool ok = false;
        for (QueuedEvent *q = s->head; q; q = q->next)
                if (q->ev.type == CHAN_EV_RESULT)
                        ok = json_is_object(q->ev.json) && !json_object_get(q->ev.json, "error");
        pthread_mutex_unlock(&c->lock);
        r = !answered ? (open ? -ETIMEDOUT : -EPIPE) : ok ? 0 : -EPROTO;
        if (r < 0)
                pthread_mutex_unlock(&c->write_lock); /* before the free: it may send CANCEL */
        chan_stream_free(s);
        return r;
}

void channel_checkpoint_end(Channel *c) {
        pthread_mutex_unlock(&c->write_lock);
}

int chan_stream_write(ChanStream *s, const void *buf, size_t n, int timeout_ms) {
        Channel *c = s->c;
        struct timespec dl;
        if (timeout_ms >= 0)
                time_mono_deadline(&dl, timeout_ms);
        const uint8_t *p = buf;
        while (n > 0) {
                pthread_mutex_lock(&c->lock);
                int r = 0;
                while (s->credit == 0 && c->open && !s->result && r == 0)
                        r = wait_until(&s->cond, &c->lock, timeout_ms >= 0 ? &dl : NULL);
                if (!c->open || s->result) {
                        pthread_mutex_unlock(&c->lock);
                        return -EPIPE;
                }
                if (s->credit == 0) {
                        pthread_mutex_unlock(&c->lock);
                        return -ETIMEDOUT;
                }
                size_t chunk = n;
                if (chunk > s->credit)
                        chunk = (size_t)s->credit;
                if (chunk > c->data_max)
                        chunk = c->data_max;
                s->credit -= chunk;
                pthread_mutex_unlock(&c->lock);
                if (send_frame(c, PROTO_DATA, s->remote ? PROTO_FD_OUT : PROTO_FD_IN, s->id, p, chunk) < 0)
                        return -EPIPE;
                p += chunk;
                n -= chunk;
        }
        return 0;
}

ssize_t chan_stream_write_some(ChanStream *s, const void *buf, size_t n, int timeout_ms) {
        Channel *c = s->c;
        struct timespec dl;
        time_mono_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&c->lock);
        int r = 0;
        while (s->credit == 0 && c->open && !s->result && r == 0)
                r = wait_until(&s->cond, &c->lock, &dl);
        if (!c->open || s->result) {
                pthread_mutex_unlock(&c->lock);
                return -EPIPE;
        }
        size_t chunk = n;
        if (chunk > s->credit)
                chunk = (size_t)s->credit;
        if (chunk > c->data_max)
                chunk = c->data_max;
        s->credit -= chunk;
        pthread_mutex_unlock(&c->lock);
        if (chunk > 0 && send_frame(c, PROTO_DATA, PROTO_FD_IN, s->id, buf, chunk) < 0)
                return -EPIPE;
        return (ssize_t)chunk;
}

void chan_stream_on_credit(ChanStream *s, ChanCreditFn fn, void *userdata) {
        pthread_mutex_lock(&s->c->lock);
        s->on_credit = fn;
        s->on_credit_userdata = userdata;
        pthread_mutex_unlock(&s->c->lock);
}

uint32_t chan_stream_id(ChanStream *s) {
        return s->id;
}

static bool stream_sendable(ChanStream *s) {
        pthread_mutex_lock(&s->c->lock);
        bool ok = s->c->open && !s->result;
        pthread_mutex_unlock(&s->c->lock);
        return ok;
}

int chan_stream_close_write(ChanStream *s) {
        if (!stream_sendable(s))
                return -EPIPE;
        return send_frame(s->c, PROTO_EOF, s->remote ? PROTO_FD_OUT : PROTO_FD_IN, s->id, NULL, 0);
}

int chan_stream_send_event(ChanStream *s, json_t *event) {
        if (!stream_sendable(s))
                return -EPIPE;
        _cleanup_free_ char *body = json_dumps(event, JSON_COMPACT);
        if (!body)
                return -ENOMEM;
        size_t len = strlen(body);
        if (len > PROTO_MAX_JSON)
                return -EINVAL;
        return send_frame(s->c, PROTO_EVENT, 0, s->id, body, len);
}

int chan_stream_finish(ChanStream *s, json_t *result) {
        Channel *c = s->c;
        if (!s->remote)
                return -EINVAL;
        pthread_mutex_lock(&c->lock);
        bool send = c->open && !s->result;
        s->result = true;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&c->lock);
        if (!send)
                return 0;
        _cleanup_free_ char *body = result ? json_dumps(result, JSON_COMPACT) : strdup("{}");
        if (!body)
                return -ENOMEM;
        return send_frame(c, PROTO_RESULT, 0, s->id, body, strlen(body));
}

void chan_stream_cancel(ChanStream *s) {
        Channel *c = s->c;
        pthread_mutex_lock(&c->lock);
        bool send = c->open && !s->result && !s->cancel_sent;
        s->cancel_sent = true;
        pthread_mutex_unlock(&c->lock);
        if (send)
                (void)send_frame(c, PROTO_CANCEL, 0, s->id, NULL, 0);
}

int chan_stream_next(ChanStream *s, int timeout_ms, ChanEvent *ret) {
        Channel *c = s->c;
        struct timespec dl;
        if (timeout_ms >= 0)
                time_mono_deadline(&dl, timeout_ms);
        pthread_mutex_lock(&c->lock);
        int r = 0;
        while (!s->head && !s->result_taken && c->open && r == 0)
                r = wait_until(&s->cond, &c->lock, timeout_ms >= 0 ? &dl : NULL);
        QueuedEvent *q = s->head;
        if (!q) {
                if (s->result_taken || !c->open) {
                        *ret = (ChanEvent){.type = CHAN_EV_CLOSED};
                        r = 0;
                } else
                        r = -ETIMEDOUT;
                pthread_mutex_unlock(&c->lock);
                return r;
        }
        s->head = q->next;
        if (!s->head)
                s->tail = NULL;
        s->n_events--;
        if (q->ev.type == CHAN_EV_DATA && s->last_data[q->ev.fd] == q)
                s->last_data[q->ev.fd] = NULL;
        uint32_t ack = 0;
        if (q->ev.type == CHAN_EV_DATA) {
                s->queued_data -= q->ev.len;
                s->to_ack += q->ev.len;
                if (!s->result && c->open && s->to_ack >= CHAN_WINDOW_BATCH) {
                        ack = (uint32_t)s->to_ack;
                        s->in_held -= s->to_ack;
                        s->to_ack = 0;
                }
        } else {
                s->queued_control -= q->charge;
                if (q->ev.type == CHAN_EV_RESULT)
                        s->result_taken = true;
        }
        pthread_mutex_unlock(&c->lock);
        *ret = q->ev;
        free(q);
        if (ack) {
                uint8_t p[4];
                proto_put_u32(p, ack);
                (void)send_frame(c, PROTO_WINDOW, 0, s->id, p, sizeof p);
        }
        return 0;
}

void chan_event_clear(ChanEvent *e) {
        if (!e)
                return;
        free(e->data);
        if (e->json)
                json_decref(e->json);
        *e = (ChanEvent){0};
}

void chan_stream_free(ChanStream *s) {
        if (!s)
                return;
        Channel *c = s->c;
        pthread_mutex_lock(&c->lock);
        bool cancel = c->open && !s->result && !s->cancel_sent;
        if (s->prev)
                s->prev->next = s->next;
        else
                c->streams = s->next;
        if (s->next)
                s->next->prev = s->prev;
        c->n_streams--;
        pthread_mutex_unlock(&c->lock);
        /* Unlinked first: whatever the agent still sends for it is dropped.
         * The agent's own streams end with our RESULT, host streams with a
         * CANCEL. */
        if (cancel && s->remote)
                (void)send_frame(c, PROTO_RESULT, 0, s->id, "{}", 2);
        else if (cancel)
                (void)send_frame(c, PROTO_CANCEL, 0, s->id, NULL, 0);
        while (s->head) {
                QueuedEvent *q = s->head;
                s->head = q->next;
                chan_event_clear(&q->ev);
                free(q);
        }
        pthread_cond_destroy(&s->cond);
        free(s);
        channel_unref(c);
}
