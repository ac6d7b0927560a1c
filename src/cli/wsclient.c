#include "cli/wsclient.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wslay/wslay.h>

#include "common/macro.h"
#include "common/random.h"

/* The handshake's answer is read up to this; an error body too. */
#define HEAD_MAX (16u * 1024u)

struct WsClient {
        Client *c;
        wslay_event_context_ptr ws;
        bool closed;
        uint8_t *pending; /* bytes read with the handshake's answer */
        size_t pending_len, pending_off;
        WsClientMessageFn fn;
        void *userdata;
};

static ssize_t ws_recv(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user_data) {
        WsClient *s = user_data;
        if (s->pending_off < s->pending_len) {
                size_t n = s->pending_len - s->pending_off < len ? s->pending_len - s->pending_off : len;
                memcpy(buf, s->pending + s->pending_off, n);
                s->pending_off += n;
                return (ssize_t)n;
        }
        ssize_t n = client_raw_recv(s->c, buf, len);
        if (n == -EAGAIN) {
                wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
                return -1;
        }
        if (n < 0) {
                s->closed = true;
                wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
                return -1;
        }
        return n;
}

static ssize_t ws_send(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user_data) {
        WsClient *s = user_data;
        ssize_t n = client_raw_send(s->c, data, len);
        if (n == -EAGAIN) {
                wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
                return -1;
        }
        if (n < 0) {
                s->closed = true;
                wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
                return -1;
        }
        return n;
}

/* A client masks every frame with fresh random bytes. */
static int ws_mask(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *user_data) {
        return random_bytes(buf, len) == 0 ? 0 : -1;
}

static void ws_message(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *user_data) {
        WsClient *s = user_data;
        if (arg->opcode == WSLAY_BINARY_FRAME || arg->opcode == WSLAY_TEXT_FRAME)
                s->fn(s->userdata, arg->opcode == WSLAY_TEXT_FRAME, arg->msg, arg->msg_length);
}

/* Sends the handshake and reads the answer: 0 on 101 (bytes after it kept for
 * the WebSocket), else the API's error in err. */
static int handshake(WsClient *s, const char *target, CliError *err) {
        uint8_t nonce[16];
        char key[32];
        if (random_bytes(nonce, sizeof nonce) < 0)
                return -EIO;
        static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        size_t k = 0;
        for (size_t i = 0; i < 15; i += 3) {
                uint32_t v = (uint32_t)nonce[i] << 16 | (uint32_t)nonce[i + 1] << 8 | nonce[i + 2];
                key[k++] = b64[v >> 18];
                key[k++] = b64[(v >> 12) & 63];
                key[k++] = b64[(v >> 6) & 63];
                key[k++] = b64[v & 63];
        }
        key[k++] = b64[nonce[15] >> 2];
        key[k++] = b64[(nonce[15] & 3) << 4];
        key[k++] = '=';
        key[k++] = '=';
        key[k] = '\0';
        const char *base = client_base(s->c);
        const char *host = strstr(base, "://");
        host = host ? host + 3 : base;
        size_t host_len = strcspn(host, "/");
        _cleanup_free_ char *req = NULL;
        if (asprintf(&req,
                     "GET %s%s HTTP/1.1\r\nHost: %.*s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nUser-Agent: runtime-cli/" RUNTIME_VERSION
                     "\r\n%s\r\n\r\n",
                     host + host_len, target, (int)host_len, host, key, client_auth_header(s->c) ?: "X-No-Key: 1") < 0)
                return -ENOMEM;
        size_t off = 0, len = strlen(req);
        int fd = client_raw_socket(s->c);
        while (off < len) {
                ssize_t n = client_raw_send(s->c, req + off, len - off);
                if (n == -EAGAIN) {
                        struct pollfd p = { .fd = fd, .events = POLLOUT };
                        poll(&p, 1, 1000);
                        continue;
                }
                if (n < 0) {
                        cli_error_set(err, "the daemon closed the connection");
                        return -EPIPE;
                }
                off += (size_t)n;
        }
        uint8_t *buf = malloc(HEAD_MAX + 1);
        if (!buf)
                return -ENOMEM;
        size_t have = 0;
        char *end = NULL;
        for (int waited = 0; !end && have < HEAD_MAX && waited < 60000;) {
                ssize_t n = client_raw_recv(s->c, buf + have, HEAD_MAX - have);
                if (n == -EAGAIN) {
                        struct pollfd p = { .fd = fd, .events = POLLIN };
                        poll(&p, 1, 1000);
                        waited += 1000;
                        continue;
                }
                if (n < 0)
                        break;
                have += (size_t)n;
                buf[have] = '\0';
                end = strstr((char *)buf, "\r\n\r\n");
        }
        if (!end) {
                free(buf);
                cli_error_set(err, "the daemon did not answer the terminal's handshake");
                return -EPROTO;
        }
        size_t head_len = (size_t)(end - (char *)buf) + 4;
        int status = 0;
        if (sscanf((char *)buf, "HTTP/1.%*d %d", &status) != 1 || status != 101) {
                /* An API error: its JSON body follows the head. */
                cli_error_from_json(err, status, (char *)buf + head_len, have - head_len);
                free(buf);
                return -EPROTO;
        }
        s->pending = buf;
        s->pending_off = head_len;
        s->pending_len = have;
        return 0;
}

int ws_client_open(Client *c, const char *target, size_t max_message, WsClientMessageFn fn, void *userdata,
                   WsClient **ret, CliError *err) {
        WsClient *w = calloc(1, sizeof(*w));
        if (!w) {
                cli_error_set(err, "out of memory");
                return -ENOMEM;
        }
        w->c = c;
        w->fn = fn;
        w->userdata = userdata;
        int r = client_raw_connect(c, err);
        if (r == 0)
                r = handshake(w, target, err);
        if (r < 0) {
                free(w->pending);
                free(w);
                return r;
        }
        struct wslay_event_callbacks cb = {
                .recv_callback = ws_recv, .send_callback = ws_send, .genmask_callback = ws_mask,
                .on_msg_recv_callback = ws_message,
        };
        if (wslay_event_context_client_init(&w->ws, &cb, w) != 0) {
                free(w->pending);
                free(w);
                cli_error_set(err, "out of memory");
                return -ENOMEM;
        }
        wslay_event_config_set_max_recv_msg_length(w->ws, max_message);
        *ret = w;
        return 0;
}

void ws_client_free(WsClient *w) {
        if (!w)
                return;
        wslay_event_context_free(w->ws);
        free(w->pending);
        free(w);
}

int ws_client_fd(WsClient *w) {
        return client_raw_socket(w->c);
}

bool ws_client_pending(WsClient *w) {
        return w->pending_off < w->pending_len;
}

bool ws_client_want_read(WsClient *w) {
        return !w->closed && wslay_event_want_read(w->ws);
}

bool ws_client_want_write(WsClient *w) {
        return !w->closed && wslay_event_want_write(w->ws);
}

int ws_client_read(WsClient *w) {
        if (wslay_event_want_read(w->ws) && wslay_event_recv(w->ws) != 0)
                return -EPIPE;
        return w->closed ? -EPIPE : 0;
}

int ws_client_write(WsClient *w) {
        if (wslay_event_want_write(w->ws) && wslay_event_send(w->ws) != 0)
                return -EPIPE;
        return w->closed ? -EPIPE : 0;
}

int ws_client_send(WsClient *w, bool text, const void *data, size_t len) {
        struct wslay_event_msg m = { .opcode = text ? WSLAY_TEXT_FRAME : WSLAY_BINARY_FRAME, .msg = data,
                                     .msg_length = len };
        return wslay_event_queue_msg(w->ws, &m) == 0 ? 0 : -EPIPE;
}

int ws_client_close(WsClient *w, uint16_t code) {
        return wslay_event_queue_close(w->ws, code, NULL, 0) == 0 ? 0 : -EPIPE;
}

bool ws_client_close_sent(WsClient *w) {
        return wslay_event_get_close_sent(w->ws);
}

size_t ws_client_queued(WsClient *w) {
        return wslay_event_get_queued_msg_length(w->ws);
}
