/* The tunnel route: the WebSocket handshake, then one thread per tunnel
 * between the client's frames and its connections' channel streams. */
#include "daemon/api/api_tunnel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "daemon/api/api.h"
#include "common/log.h"
#include "daemon/manager/sandbox.h"
#include "daemon/http/websocket.h"
#include "daemon/http/ws_session.h"

#define POLL_MS 250
#define OPEN_TIMEOUT_MS 30000
/* Credit goes back to the client in steps of this, or when nothing waits. */
#define ACK_STEP (64u * 1024u)

typedef struct Tunnel Tunnel;

typedef struct Conn {
        struct Conn *next;
        Tunnel *t;
        uint32_t id;
        unsigned port;
        ChanStream *s;  /* set by its thread once connected; freed by the tunnel */
        pthread_t thread;
        bool thread_started;
        uint8_t *in;    /* the client's bytes not yet taken by the channel */
        size_t in_len, in_off, in_cap;
        bool in_eof, eof_sent;
        bool closed_by_client;
        bool done;      /* its thread ended */
} Conn;

struct Tunnel {
        WsSession s;  /* first: the session's callbacks get it */
        Sandbox *sb;
        ApiError err; /* err.code: refused, sent after the upgrade */

        /* Under s.lock: */
        Conn *conns;
        unsigned n_conns;
        size_t buffered;           /* bytes in every Conn's in */
        uint64_t consumed, acked;  /* the client's data bytes taken, and credited back */
        bool broken;               /* the client broke the protocol: the tunnel closes */
};

static WsSessionList open_tunnels = WS_SESSION_LIST_INIT(TUNNEL_MAX_OPEN, TUNNEL_MAX_OPEN_PER_OWNER);

static uint32_t get_u32(const uint8_t *p) {
        return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int tunnel_parse_frame(const uint8_t *msg, size_t len, TunnelFrame *ret) {
        if (len < 5 || len > TUNNEL_MAX_MESSAGE)
                return -EINVAL;
        TunnelFrame f = { .kind = msg[0], .stream = get_u32(msg + 1), .payload = msg + 5, .len = len - 5 };
        if (f.stream == 0)
                return -EINVAL;
        switch (f.kind) {
        case TUNNEL_OPEN: {
                /* "tcp PORT": the one kind of target a forward has. */
                if (f.len < 5 || f.len > 9 || memcmp(f.payload, "tcp ", 4) != 0)
                        return -EINVAL;
                unsigned port = 0;
                for (size_t i = 4; i < f.len; i++) {
                        if (f.payload[i] < '0' || f.payload[i] > '9')
                                return -EINVAL;
                        port = port * 10 + (unsigned)(f.payload[i] - '0');
                }
                if (port < 1 || port > 65535 || (f.payload[4] == '0'))
                        return -EINVAL;
                f.port = port;
                break;
        }
        case TUNNEL_DATA:
                break;
        case TUNNEL_END:
        case TUNNEL_CLOSE:
                if (f.len != 0)
                        return -EINVAL;
                break;
        default:
                return -EINVAL;
        }
        *ret = f;
        return 0;
}

/* ---- frames to the client (under t->s.lock) ---- */

/* A connection's stream has credit again: the session thread, asleep in
 * its poll with the client's bytes waiting, moves them on at once. */
static void credit_returned(void *userdata) {
        Tunnel *t = userdata;
        ws_session_wake(&t->s);
}

static void send_frame_locked(Tunnel *t, char kind, uint32_t stream, const void *payload, size_t len) {
        uint8_t *m = malloc(5 + len);
        if (!m)
                return;
        m[0] = (uint8_t)kind;
        m[1] = (uint8_t)(stream >> 24);
        m[2] = (uint8_t)(stream >> 16);
        m[3] = (uint8_t)(stream >> 8);
        m[4] = (uint8_t)stream;
        if (len)
                memcpy(m + 5, payload, len);
        (void)ws_conn_send(t->s.ws, false, m, 5 + len);
        free(m);
}

static void ack_locked(Tunnel *t, bool force) {
        if (t->consumed == t->acked || (!force && t->consumed - t->acked < ACK_STEP))
                return;
        uint8_t p[8];
        for (int i = 0; i < 8; i++)
                p[i] = (uint8_t)(t->consumed >> (56 - 8 * i));
        send_frame_locked(t, TUNNEL_ACK, 1, p, 8);
        t->acked = t->consumed;
}

/* Bytes of the client that will never reach the sandbox still count as
 * taken: its window must not shrink for ever. */
static void drop_input_locked(Tunnel *t, Conn *c) {
        size_t n = c->in_len - c->in_off;
        t->buffered -= n;
        t->consumed += n;
        c->in_len = c->in_off = 0;
}

/* ---- a connection's sandbox side, in its own thread ---- */

static void *conn_main(void *arg) {
        Conn *c = arg;
        Tunnel *t = c->t;
        ChanStream *s = NULL;
        SandboxError se;
        char why[600] = "the tunnel closed";
        json_t *req = agent_req_forward(c->port);
        int r = req ? sandbox_open_stream(t->sb, req, &s, &se) : -ENOMEM;
        json_decref(req);
        bool connected = false;
        if (r < 0)
                snprintf(why, sizeof why, "%s", r == -ENOMEM ? "out of memory" : se.message);
        else {
                ChanEvent ev;
                int k = chan_stream_next(s, OPEN_TIMEOUT_MS, &ev);
                if (k == 0 && ev.type == CHAN_EV_EVENT)
                        connected = true;
                else if (k == 0 && ev.type == CHAN_EV_RESULT) {
                        const char *msg = NULL;
                        agent_result_error(ev.json, &msg);
                        snprintf(why, sizeof why, "%s", msg ? msg : "the connection was refused");
                } else
                        snprintf(why, sizeof why, "%s",
                                 k == -ETIMEDOUT ? "the connection did not open in time" : "the sandbox stopped");
                if (k == 0)
                        chan_event_clear(&ev);
        }
        pthread_mutex_lock(&t->s.lock);
        c->s = s;
        if (!connected || t->s.stop || c->closed_by_client) {
                /* Anything but "o" tells the client the open failed. */
                if (!c->closed_by_client && !t->s.stop)
                        send_frame_locked(t, TUNNEL_CLOSE, c->id, why, strlen(why));
                drop_input_locked(t, c);
                c->done = true;
                ws_session_wake(&t->s);
                pthread_mutex_unlock(&t->s.lock);
                return NULL;
        }
        send_frame_locked(t, TUNNEL_OPEN, c->id, NULL, 0);
        chan_stream_on_credit(s, credit_returned, t);
        ws_session_wake(&t->s);
        pthread_mutex_unlock(&t->s.lock);

        bool closed_sent = false;
        for (;;) {
                ChanEvent ev;
                int k = chan_stream_next(s, POLL_MS, &ev);
                pthread_mutex_lock(&t->s.lock);
                if (t->s.stop || c->closed_by_client) {
                        pthread_mutex_unlock(&t->s.lock);
                        if (k == 0)
                                chan_event_clear(&ev);
                        break;
                }
                if (k == -ETIMEDOUT) {
                        pthread_mutex_unlock(&t->s.lock);
                        continue;
                }
                bool end = k < 0 || ev.type == CHAN_EV_RESULT || ev.type == CHAN_EV_CLOSED;
                if (!end && ev.type == CHAN_EV_DATA) {
                        /* Taking the event hands its credit back to the agent:
                         * wait for the client first, so a slow one stalls
                         * this connection only. */
                        while (!t->s.stop && ws_conn_queued(t->s.ws) > WS_SESSION_OUT_HIGH)
                                pthread_cond_wait(&t->s.drained, &t->s.lock);
                        send_frame_locked(t, TUNNEL_DATA, c->id, ev.data, ev.len);
                } else if (!end && ev.type == CHAN_EV_EOF)
                        send_frame_locked(t, TUNNEL_END, c->id, NULL, 0);
                if (end) {
                        send_frame_locked(t, TUNNEL_CLOSE, c->id, NULL, 0);
                        closed_sent = true;
                        drop_input_locked(t, c);
                }
                ws_session_wake(&t->s);
                pthread_mutex_unlock(&t->s.lock);
                if (k == 0)
                        chan_event_clear(&ev);
                if (end)
                        break;
        }
        (void)closed_sent;
        pthread_mutex_lock(&t->s.lock);
        c->done = true;
        ws_session_wake(&t->s);
        pthread_mutex_unlock(&t->s.lock);
        return NULL;
}

static void conn_free(Conn *c) {
        if (c->thread_started)
                pthread_join(c->thread, NULL);
        chan_stream_free(c->s);
        free(c->in);
        free(c);
}

/* ---- the client's frames (under t->s.lock, from ws_conn_read) ---- */

static Conn *conn_find(Tunnel *t, uint32_t id) {
        for (Conn *c = t->conns; c; c = c->next)
                if (c->id == id)
                        return c;
        return NULL;
}

static void on_message(void *userdata, bool text, const uint8_t *data, size_t len) {
        Tunnel *t = userdata;
        TunnelFrame f;
        if (text || t->broken)
                return; /* the client sends no text */
        if (tunnel_parse_frame(data, len, &f) < 0) {
                t->broken = true;
                return;
        }
        Conn *c = conn_find(t, f.stream);
        switch (f.kind) {
        case TUNNEL_OPEN: {
                if (c) {
                        t->broken = true; /* a stream number in use */
                        return;
                }
                if (t->n_conns >= TUNNEL_MAX_CONNS) {
                        static const char msg[] = "too many connections in this tunnel";
                        send_frame_locked(t, TUNNEL_CLOSE, f.stream, msg, sizeof msg - 1);
                        return;
                }
                c = calloc(1, sizeof(*c));
                if (!c) {
                        send_frame_locked(t, TUNNEL_CLOSE, f.stream, "out of memory", 13);
                        return;
                }
                c->t = t;
                c->id = f.stream;
                c->port = f.port;
                if (pthread_create(&c->thread, NULL, conn_main, c) != 0) {
                        free(c);
                        send_frame_locked(t, TUNNEL_CLOSE, f.stream, "out of threads", 14);
                        return;
                }
                c->thread_started = true;
                c->next = t->conns;
                t->conns = c;
                t->n_conns++;
                return;
        }
        case TUNNEL_DATA:
                if (!c || c->done || c->in_eof || c->closed_by_client) {
                        t->consumed += f.len; /* for a connection that is gone: dropped, credited */
                        return;
                }
                if (t->buffered + f.len > TUNNEL_MAX_BUFFERED) {
                        t->broken = true; /* past its window */
                        return;
                }
                if (c->in_len + f.len > c->in_cap) {
                        if (c->in_off > 0) {
                                memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
                                c->in_len -= c->in_off;
                                c->in_off = 0;
                        }
                        if (c->in_len + f.len > c->in_cap) {
                                size_t cap = c->in_len + f.len + ACK_STEP;
                                uint8_t *b = realloc(c->in, cap);
                                if (!b) {
                                        t->broken = true;
                                        return;
                                }
                                c->in = b;
                                c->in_cap = cap;
                        }
                }
                memcpy(c->in + c->in_len, f.payload, f.len);
                c->in_len += f.len;
                t->buffered += f.len;
                return;
        case TUNNEL_END:
                if (c)
                        c->in_eof = true;
                return;
        case TUNNEL_CLOSE:
                if (c && !c->closed_by_client) {
                        c->closed_by_client = true;
                        drop_input_locked(t, c);
                        if (c->s)
                                chan_stream_cancel(c->s);
                }
                return;
        default:
                return;
        }
}

/* Moves the client's bytes into the channel as far as its credit allows
 * now (never waiting: this thread also serves the socket). True when some
 * are still waiting. */
static bool flush_locked(Tunnel *t) {
        bool waiting = false;
        for (Conn *c = t->conns; c; c = c->next) {
                if (!c->s || c->done)
                        continue;
                while (c->in_off < c->in_len) {
                        ssize_t n = chan_stream_write_some(c->s, c->in + c->in_off, c->in_len - c->in_off, 0);
                        if (n < 0) {
                                drop_input_locked(t, c);
                                break;
                        }
                        if (n == 0) {
                                waiting = true;
                                break;
                        }
                        c->in_off += (size_t)n;
                        t->buffered -= (size_t)n;
                        t->consumed += (uint64_t)n;
                }
                if (c->in_off == c->in_len) {
                        c->in_off = c->in_len = 0;
                        if (c->in_eof && !c->eof_sent) {
                                c->eof_sent = true;
                                (void)chan_stream_close_write(c->s);
                        }
                }
        }
        ack_locked(t, !waiting);
        return waiting;
}

/* Connections whose thread ended: joined and freed. */
static void reap_locked(Tunnel *t) {
        for (Conn **pp = &t->conns; *pp;) {
                Conn *c = *pp;
                if (!c->done) {
                        pp = &c->next;
                        continue;
                }
                *pp = c->next;
                t->n_conns--;
                pthread_mutex_unlock(&t->s.lock);
                conn_free(c);
                pthread_mutex_lock(&t->s.lock);
                pp = &t->conns; /* the list may have changed meanwhile */
        }
}

/* ---- the session ---- */

static void tunnel_free(WsSession *s) {
        Tunnel *t = (Tunnel *)s;
        if (t->sb)
                sandbox_release(t->sb);
        ws_session_destroy(&t->s);
        free(t);
}

static void run(WsSession *s) {
        Tunnel *t = (Tunnel *)s;
        pthread_mutex_lock(&t->s.lock);
        ws_session_start_locked(&t->s);
        bool refused = t->err.code != NULL;
        if (refused)
                ws_session_send_error_locked(&t->s, &t->err);
        else
                ws_session_send_json_locked(&t->s, json_pack("{s:s}", "type", "ready"));
        bool close_queued = false;
        for (;;) {
                (void)flush_locked(t);
                reap_locked(t);
                if ((refused || t->broken) && !close_queued && !ws_conn_want_write(t->s.ws)) {
                        uint16_t code = !refused ? 1002 : t->err.status >= 500 ? WS_CLOSE_INTERNAL : WS_CLOSE_POLICY;
                        (void)ws_conn_close(t->s.ws, code, refused ? NULL : "not a tunnel frame, or past the window");
                        close_queued = true;
                }
                /* Bytes waiting for credit need no timer: the credit wakes
                 * this poll (credit_returned). */
                if (!ws_session_pump_locked(&t->s, POLL_MS))
                        break;
        }
        ws_session_end_locked(&t->s);
        /* Every connection ends with the tunnel. */
        for (Conn *c = t->conns; c; c = c->next)
                if (c->s)
                        chan_stream_cancel(c->s);
        Conn *all = t->conns;
        t->conns = NULL;
        pthread_mutex_unlock(&t->s.lock);
        while (all) {
                Conn *c = all;
                all = c->next;
                conn_free(c);
        }
}

static const WsSessionOps tunnel_ops = {
        .what = "tunnel",
        .max_message = TUNNEL_MAX_MESSAGE,
        .on_message = on_message,
        .run = run,
        .free = tunnel_free,
};

enum MHD_Result handle_tunnel(Req *r) {
        ApiError e = { 0 };
        char accept[29];
        if (api_websocket_handshake(r, "open it with a WebSocket client (withruntime's forward_port())", accept, &e) < 0)
                return reply_error(r, &e);
        Tunnel *t = (Tunnel *)ws_session_new(sizeof(*t), &tunnel_ops, &open_tunnels, r->key.owner, r->rid);
        if (!t)
                return reply_internal(r);
        WsAdmit room = ws_session_admit(&t->s);
        /* Past the upgrade, refusals go to the client as an error message:
         * where the published client reads them. */
        if (room == WS_REFUSED_OWNER)
                api_error(&t->err, 429, "rate_limited", "close one of your port forwards first",
                          "you have %d tunnels open, the most one owner may", TUNNEL_MAX_OPEN_PER_OWNER);
        else if (room != WS_ADMITTED)
                api_error(&t->err, 429, "rate_limited", "close a port forward first",
                          "this server has %d tunnels open", TUNNEL_MAX_OPEN);
        else if (api_sandbox_acquire(r, &t->sb, &t->err) < 0 && !t->err.code)
                api_error(&t->err, 500, "internal", NULL, "the tunnel could not be opened");
        return ws_session_upgrade(r, &t->s, accept);
}

void tunnel_close_all(void) {
        ws_session_close_all(&open_tunnels);
}
