#include "daemon/http/websocket.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <poll.h>
#include <unistd.h>
#include <wslay/wslay.h>

#include "common/random.h"
#include "common/timeutil.h"

struct WsConn {
        wslay_event_context_ptr ctx;
        int fd;
        uint8_t *pending; /* fed bytes not yet taken by wslay */
        size_t pending_len, pending_off;
        bool broken; /* the socket failed or reached EOF */
        WsMessageFn fn;
        void *userdata;
};

static const char ws_guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

bool ws_client_key_ok(const char *key) {
        if (!key || strlen(key) != 24 || strcmp(key + 22, "==") != 0)
                return false;
        for (size_t i = 0; i < 22; i++) {
                char ch = key[i];
                bool b64 = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                           ch == '+' || ch == '/';
                if (!b64)
                        return false;
        }
        return true;
}

int ws_accept_value(const char *key, char ret[29]) {
        if (!ws_client_key_ok(key))
                return -EINVAL;
        char in[24 + sizeof ws_guid];
        memcpy(in, key, 24);
        memcpy(in + 24, ws_guid, sizeof ws_guid);
        unsigned char digest[SHA_DIGEST_LENGTH];
        SHA1((const unsigned char *)in, 24 + sizeof ws_guid - 1, digest);
        return EVP_EncodeBlock((unsigned char *)ret, digest, SHA_DIGEST_LENGTH) == 28 ? 0 : -EIO;
}

static ssize_t recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user_data) {
        WsConn *c = user_data;
        if (c->pending_off < c->pending_len) {
                size_t n = c->pending_len - c->pending_off;
                if (n > len)
                        n = len;
                memcpy(buf, c->pending + c->pending_off, n);
                c->pending_off += n;
                return (ssize_t)n;
        }
        if (c->fd < 0) {
                wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
                return -1;
        }
        for (;;) {
                ssize_t n = recv(c->fd, buf, len, 0);
                if (n > 0)
                        return n;
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
                        return -1;
                }
                c->broken = true;
                wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
                return -1;
        }
}

static ssize_t send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user_data) {
        WsConn *c = user_data;
        if (c->fd < 0)
                return (ssize_t)len;
        for (;;) {
                ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
                if (n >= 0)
                        return n;
                if (errno == EINTR)
                        continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
                        return -1;
                }
                c->broken = true;
                wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
                return -1;
        }
}

/* Masks are the client's to choose; a server never masks. */
static int genmask_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *user_data) {
        return random_bytes(buf, len) == 0 ? 0 : -1;
}

static void msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *user_data) {
        WsConn *c = user_data;
        if (arg->opcode == WSLAY_TEXT_FRAME || arg->opcode == WSLAY_BINARY_FRAME)
                c->fn(c->userdata, arg->opcode == WSLAY_TEXT_FRAME, arg->msg, arg->msg_length);
}

WsConn *ws_conn_new(int fd, size_t max_message, WsMessageFn fn, void *userdata) {
        WsConn *c = calloc(1, sizeof(*c));
        if (!c)
                return NULL;
        c->fd = fd;
        c->fn = fn;
        c->userdata = userdata;
        if (fd >= 0) {
                /* A key's echo is a few bytes: Nagle would hold it for the
                 * client's delayed ACK (40 ms). Not a TCP socket (a unix
                 * one): nothing to do. */
                int one = 1;
                (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                int fl = fcntl(fd, F_GETFL);
                if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
                        free(c);
                        return NULL;
                }
        }
        struct wslay_event_callbacks cb = {
                .recv_callback = recv_cb,
                .send_callback = send_cb,
                .genmask_callback = genmask_cb,
                .on_msg_recv_callback = msg_cb,
        };
        if (wslay_event_context_server_init(&c->ctx, &cb, c) != 0) {
                free(c);
                return NULL;
        }
        wslay_event_config_set_max_recv_msg_length(c->ctx, max_message);
        return c;
}

void ws_conn_free(WsConn *c) {
        if (!c)
                return;
        wslay_event_context_free(c->ctx);
        free(c->pending);
        free(c);
}

int ws_conn_feed(WsConn *c, const uint8_t *data, size_t len) {
        size_t left = c->pending_len - c->pending_off;
        uint8_t *b = malloc(left + len + 1);
        if (!b)
                return -ENOMEM;
        if (left)
                memcpy(b, c->pending + c->pending_off, left);
        if (len)
                memcpy(b + left, data, len);
        free(c->pending);
        c->pending = b;
        c->pending_len = left + len;
        c->pending_off = 0;
        return 0;
}

int ws_conn_read(WsConn *c) {
        if (wslay_event_want_read(c->ctx) && wslay_event_recv(c->ctx) != 0)
                return -EPIPE;
        return c->broken ? -EPIPE : 0;
}

int ws_conn_write(WsConn *c) {
        if (wslay_event_want_write(c->ctx) && wslay_event_send(c->ctx) != 0)
                return -EPIPE;
        return c->broken ? -EPIPE : 0;
}

int ws_conn_send(WsConn *c, bool text, const void *data, size_t len) {
        struct wslay_event_msg m = {
                .opcode = text ? WSLAY_TEXT_FRAME : WSLAY_BINARY_FRAME,
                .msg = data,
                .msg_length = len,
        };
        int r = wslay_event_queue_msg(c->ctx, &m);
        return r == 0 ? 0 : r == WSLAY_ERR_NOMEM ? -ENOMEM : -EPIPE;
}

int ws_conn_close(WsConn *c, uint16_t code, const char *reason) {
        int r = wslay_event_queue_close(c->ctx, code, (const uint8_t *)reason, reason ? strlen(reason) : 0);
        return r == 0 ? 0 : -EPIPE;
}

bool ws_conn_want_read(WsConn *c) {
        return !c->broken && wslay_event_want_read(c->ctx);
}

bool ws_conn_want_write(WsConn *c) {
        return !c->broken && wslay_event_want_write(c->ctx);
}

size_t ws_conn_queued(WsConn *c) {
        return wslay_event_get_queued_msg_length(c->ctx);
}

bool ws_conn_close_sent(WsConn *c) {
        return wslay_event_get_close_sent(c->ctx);
}

void ws_conn_linger(WsConn *c, int timeout_ms) {
        if (c->fd < 0 || shutdown(c->fd, SHUT_WR) < 0)
                return;
        uint64_t end = time_now_mono_ms() + (uint64_t)timeout_ms;
        size_t dropped = 0;
        uint8_t buf[16384];
        while (dropped < 1024u * 1024u) {
                uint64_t now = time_now_mono_ms();
                if (now >= end)
                        return;
                struct pollfd p = { .fd = c->fd, .events = POLLIN };
                if (poll(&p, 1, (int)(end - now)) <= 0)
                        return;
                ssize_t n = recv(c->fd, buf, sizeof buf, 0);
                if (n <= 0 && !(n < 0 && (errno == EINTR || errno == EAGAIN)))
                        return;
                if (n > 0)
                        dropped += (size_t)n;
        }
}

bool ws_conn_close_received(WsConn *c) {
        return wslay_event_get_close_received(c->ctx);
}
