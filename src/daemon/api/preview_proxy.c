/* The preview listener: an accept thread and a thread per connection (with
 * one more relaying the sandbox's bytes back once the connection is
 * admitted). The head of each request is parsed strictly (preview_head.h);
 * its body is framed (Content-Length or chunked) so that the next head is
 * found where the server in the sandbox will find it. */
#include "daemon/api/preview_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/http/forward.h"
#include "daemon/http/preview_head.h"
#include "daemon/http/http.h"
#include "daemon/manager/agent_client.h"
#include "daemon/manager/fleet.h"
#include "daemon/manager/previews.h"
#include "daemon/manager/sandbox.h"

#define MAX_CONNS 512
#define MAX_CONNS_PER_PEER 64
/* A head must arrive whole within this of its first byte (a slow client
 * holds a thread, not the listener). */
#define HEAD_TIMEOUT_MS 10000
/* A kept-alive connection quiet both ways this long is closed. */
#define IDLE_TIMEOUT_MS 60000
/* A body's bytes, a write to a client, or credit to send into the sandbox:
 * none for this long ends the connection. */
#define STALL_TIMEOUT_MS 60000
#define OPEN_TIMEOUT_MS 30000
#define POLL_MS 250

typedef struct Conn {
        struct Conn *next;
        PreviewProxy *px;
        int fd;
        /* The client's address, or "host:ID" for a connection another host
         * of the fleet relays here. */
        char peer[80];
        char sandbox_id[STORE_PREVIEW_ID_MAX];
        unsigned port;
        pthread_t thread, pump;
        bool pump_started;
        ChanStream *s;
        SSL *ssl;                 /* NULL: plain HTTP */
        pthread_mutex_t io;       /* ssl: its reader and writer take turns */
        atomic_bool closing;
        _Atomic int64_t active_ms; /* the last byte either way (monotonic) */
        char cookie[256];          /* Set-Cookie for the first answer; "": none */
        /* The preview's Content-Security-Policy line when only some sites
         * may frame it (its embed origins); "": any site, answers pass
         * unchanged. */
        char frame[STORE_PREVIEW_EMBED_MAX + 64];
        /* A connection another host relays here (preview_proxy_adopt): the
         * API's upgraded socket (closed through MHD), the bytes that came
         * with its head, the one preview it may name, and that host. */
        struct MHD_UpgradeResponseHandle *urh;
        char *pre;
        size_t pre_len;
        char relayed_by[64];
        char expect_id[STORE_PREVIEW_ID_MAX];
        unsigned expect_port;
        /* The host this connection is relayed to; "": none. */
        char relay_host[64];
} Conn;

struct PreviewProxy {
        App *app;
        int fd;
        SSL_CTX *tls; /* NULL: plain HTTP */
        pthread_t accept_thread;
        atomic_bool stop;
        _Atomic(const char *) fleet_secret; /* NULL: previews of other hosts' sandboxes are not relayed */
};

/* The listener that takes the connections other hosts relay. */
static _Atomic(PreviewProxy *) serving;

/* Every open connection of every listener, for preview_proxy_close. */
static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;
/* Connections relayed between two hosts of a fleet, each way. */
static _Atomic unsigned relay_max = PREVIEW_RELAY_MAX_DEFAULT;
_Static_assert(PREVIEW_RELAY_MAX_LIMIT <= MAX_CONNS, "relayed connections are within the listener's bound");
static pthread_cond_t conns_gone = PTHREAD_COND_INITIALIZER;
static Conn *conns;
static unsigned n_conns;

static unsigned peer_count_locked(const char *peer) {
        unsigned n = 0;
        for (Conn *c = conns; c; c = c->next)
                n += strcmp(c->peer, peer) == 0;
        return n;
}

static void conn_unlink(Conn *c) {
        pthread_mutex_lock(&conns_lock);
        for (Conn **pp = &conns; *pp; pp = &(*pp)->next)
                if (*pp == c) {
                        *pp = c->next;
                        break;
                }
        n_conns--;
        pthread_cond_broadcast(&conns_gone);
        pthread_mutex_unlock(&conns_lock);
}

void preview_proxy_close(const char *sandbox_id, unsigned port) {
        pthread_mutex_lock(&conns_lock);
        for (Conn *c = conns; c; c = c->next)
                if (strcmp(c->sandbox_id, sandbox_id) == 0 && (port == 0 || c->port == port)) {
                        atomic_store(&c->closing, true);
                        (void)shutdown(c->fd, SHUT_RDWR);
                }
        pthread_mutex_unlock(&conns_lock);
}

/* ---- the client's socket (non-blocking), plain or TLS ---- */

/* Waits until the socket is ready for events, up to deadline_ms: 1; 0
 * when the connection is being closed; -ETIMEDOUT. */
static int wait_fd(Conn *c, short events, int64_t deadline_ms) {
        for (;;) {
                if (atomic_load(&c->closing) || atomic_load(&c->px->stop))
                        return 0;
                int64_t left = deadline_ms - (int64_t)time_now_mono_ms();
                if (left <= 0)
                        return -ETIMEDOUT;
                struct pollfd p = { .fd = c->fd, .events = events };
                int k = poll(&p, 1, left < POLL_MS ? (int)left : POLL_MS);
                if (k > 0)
                        return 1;
                if (k < 0 && errno != EINTR)
                        return 0;
        }
}

/* One read: > 0, 0 at the end (or a TLS error), -EAGAIN. */
static ssize_t io_recv(Conn *c, void *buf, size_t n) {
        if (!c->ssl) {
                ssize_t r = recv(c->fd, buf, n, 0);
                if (r < 0)
                        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -EAGAIN : 0;
                return r;
        }
        pthread_mutex_lock(&c->io);
        ERR_clear_error();
        int r = SSL_read(c->ssl, buf, n > INT_MAX ? INT_MAX : (int)n);
        int e = r > 0 ? SSL_ERROR_NONE : SSL_get_error(c->ssl, r);
        pthread_mutex_unlock(&c->io);
        if (r > 0)
                return r;
        return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? -EAGAIN : 0;
}

/* One write: > 0, -EAGAIN, -EPIPE. */
static ssize_t io_send(Conn *c, const void *buf, size_t n) {
        if (!c->ssl) {
                ssize_t w = send(c->fd, buf, n, MSG_NOSIGNAL);
                if (w < 0)
                        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -EAGAIN : -EPIPE;
                return w > 0 ? w : -EPIPE;
        }
        pthread_mutex_lock(&c->io);
        ERR_clear_error();
        int w = SSL_write(c->ssl, buf, n > INT_MAX ? INT_MAX : (int)n);
        int e = w > 0 ? SSL_ERROR_NONE : SSL_get_error(c->ssl, w);
        pthread_mutex_unlock(&c->io);
        if (w > 0)
                return w;
        return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? -EAGAIN : -EPIPE;
}

/* Bytes TLS decrypted already, which no poll of the socket shows. */
static bool io_pending(Conn *c) {
        if (!c->ssl)
                return false;
        pthread_mutex_lock(&c->io);
        bool pending = SSL_pending(c->ssl) > 0;
        pthread_mutex_unlock(&c->io);
        return pending;
}

/* The TLS handshake, within the head's time. */
static bool io_handshake(Conn *c) {
        int64_t deadline = (int64_t)time_now_mono_ms() + HEAD_TIMEOUT_MS;
        for (;;) {
                ERR_clear_error();
                int r = SSL_accept(c->ssl);
                if (r == 1)
                        return true;
                int e = SSL_get_error(c->ssl, r);
                if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                        return false;
                if (wait_fd(c, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline) <= 0)
                        return false;
        }
}

/* The end of what this side sends: TLS's close_notify, then the socket's. */
static void io_shutdown_write(Conn *c) {
        if (c->ssl) {
                pthread_mutex_lock(&c->io);
                (void)SSL_shutdown(c->ssl);
                pthread_mutex_unlock(&c->io);
        }
        (void)shutdown(c->fd, SHUT_WR);
}

static int send_all(Conn *c, const void *buf, size_t n) {
        const char *p = buf;
        while (n > 0) {
                ssize_t w = io_send(c, p, n);
                if (w == -EAGAIN) {
                        if (wait_fd(c, POLLOUT, (int64_t)time_now_mono_ms() + STALL_TIMEOUT_MS) <= 0)
                                return -EPIPE;
                        continue;
                }
                if (w < 0)
                        return -EPIPE;
                p += w;
                n -= (size_t)w;
        }
        atomic_store(&c->active_ms, (int64_t)time_now_mono_ms());
        return 0;
}

/* An answer of the listener's own: a short page saying what happened and
 * what to do, then the connection closes. */
static void send_page(Conn *c, unsigned status, const char *reason, const char *title, const char *text) {
        char body[1400], head[512];
        int bn = snprintf(body, sizeof body,
                          "<!doctype html><html><head><meta charset=\"utf-8\"><title>%s</title></head>"
                          "<body style=\"font-family:sans-serif;max-width:40em;margin:3em auto\">"
                          "<h1>%s</h1><p>%s</p></body></html>\n",
                          title, title, text);
        if (bn < 0 || (size_t)bn >= sizeof body)
                bn = (int)strlen(body);
        int hn = snprintf(head, sizeof head,
                          "HTTP/1.1 %u %s\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n"
                          "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                          "X-Runtime-Preview-Error: %u\r\nConnection: close\r\n\r\n",
                          status, reason, bn, status);
        if (send_all(c, head, (size_t)hn) == 0)
                (void)send_all(c, body, (size_t)bn);
}

/* ---- reading from the client ---- */

typedef struct Input {
        char buf[PREVIEW_HEAD_MAX + 1];
        size_t len;
} Input;

/* More bytes into in: > 0, 0 at EOF or when the connection is being
 * closed, -ETIMEDOUT. */
static ssize_t read_more(Conn *c, Input *in, int64_t deadline_ms) {
        for (;;) {
                if (!io_pending(c)) {
                        int k = wait_fd(c, POLLIN, deadline_ms);
                        if (k <= 0)
                                return k;
                }
                ssize_t n = io_recv(c, in->buf + in->len, PREVIEW_HEAD_MAX - in->len);
                if (n == -EAGAIN)
                        continue;
                in->len += (size_t)n;
                in->buf[in->len] = '\0';
                if (n > 0)
                        atomic_store(&c->active_ms, (int64_t)time_now_mono_ms());
                return n;
        }
}

/* A whole head: 0 and *h; -ETIMEDOUT (408), -EMSGSIZE (431), -EINVAL
 * (400), -ENOTSUP (501/505) with *why; -EPIPE when the client went. A
 * kept-alive connection waits for the first byte while anything moved
 * either way within IDLE_TIMEOUT_MS. */
static int read_head(Conn *c, Input *in, PreviewHead *h, const char **why) {
        int64_t deadline = 0;
        for (;;) {
                if (in->len > 0) {
                        int r = preview_head_parse(in->buf, in->len, h, why);
                        if (r != -EAGAIN)
                                return r;
                        if (!deadline)
                                deadline = (int64_t)time_now_mono_ms() + HEAD_TIMEOUT_MS;
                }
                int64_t until = deadline ? deadline : atomic_load(&c->active_ms) + IDLE_TIMEOUT_MS;
                ssize_t n = read_more(c, in, until);
                if (n == -ETIMEDOUT && !deadline && (int64_t)time_now_mono_ms() < atomic_load(&c->active_ms) + IDLE_TIMEOUT_MS)
                        continue; /* the answer was still moving */
                if (n == -ETIMEDOUT)
                        return in->len > 0 ? -ETIMEDOUT : -EPIPE;
                if (n == 0)
                        return -EPIPE;
        }
}

/* ---- the preview a head names ---- */

static bool lower_eq(const char *a, size_t n, const char *b) {
        return strlen(b) == n && strncasecmp(a, b, n) == 0;
}

/* PORT-SANDBOX.DOMAIN[:N]: 0, -ENOENT (not a preview's name), -ERANGE
 * (a port out of range). */
static int parse_host(const PreviewSite *site, PreviewSpan host, char *ret_id, size_t id_len, unsigned *ret_port) {
        const char *p = host.p, *end = host.p + host.n;
        const char *colon = memchr(p, ':', host.n);
        if (colon) {
                for (const char *d = colon + 1; d < end; d++)
                        if (*d < '0' || *d > '9')
                                return -ENOENT;
                end = colon;
        }
        if (end > p && end[-1] == '.')
                end--; /* a fully qualified name's dot */
        size_t dn = strlen(site->domain);
        if ((size_t)(end - p) <= dn + 1 || end[-(ptrdiff_t)dn - 1] != '.' ||
            !lower_eq(end - dn, dn, site->domain))
                return -ENOENT;
        end -= dn + 1;
        const char *dash = memchr(p, '-', (size_t)(end - p));
        if (!dash || dash == p || dash - p > 5 || (size_t)(end - dash - 1) >= id_len)
                return -ENOENT;
        unsigned long port = 0;
        for (const char *d = p; d < dash; d++) {
                if (*d < '0' || *d > '9')
                        return -ENOENT;
                port = port * 10 + (unsigned long)(*d - '0');
        }
        size_t n = (size_t)(end - dash - 1);
        for (size_t i = 0; i < n; i++) {
                char ch = dash[1 + i];
                ret_id[i] = ch >= 'A' && ch <= 'Z' ? (char)(ch - 'A' + 'a') : ch;
        }
        ret_id[n] = '\0';
        /* URLs spell the id sbx-HEX: an underscore is not a host name's
         * character, and TLS wildcard matches refuse it. sbx_HEX is taken
         * too. */
        if (n > 4 && memcmp(ret_id, "sbx-", 4) == 0)
                ret_id[3] = '_';
        if (!route_sandbox_id_ok(ret_id))
                return -ENOENT;
        if (port < 1 || port > 65535)
                return -ERANGE;
        *ret_port = (unsigned)port;
        return 0;
}

/* The token in the target's query (runtime_preview_token=...): its span,
 * and the target without it in ret (for the server in the sandbox). */
static PreviewSpan query_token(PreviewSpan target, char *ret, size_t ret_len) {
        PreviewSpan tok = { 0 };
        const char *q = memchr(target.p, '?', target.n), *end = target.p + target.n;
        size_t keep = q ? (size_t)(q - target.p) : target.n;
        if (keep >= ret_len)
                keep = ret_len - 1;
        memcpy(ret, target.p, keep);
        ret[keep] = '\0';
        if (!q)
                return tok;
        size_t at = keep;
        bool first = true;
        for (const char *a = q + 1; a < end;) {
                const char *amp = memchr(a, '&', (size_t)(end - a));
                const char *stop = amp ? amp : end;
                size_t an = (size_t)(stop - a), kn = strlen(PREVIEW_TOKEN_ARG);
                if (an > kn && a[kn] == '=' && strncmp(a, PREVIEW_TOKEN_ARG, kn) == 0 && !tok.n)
                        tok = (PreviewSpan){ a + kn + 1, an - kn - 1 };
                else if (an > 0 && at + an + 2 < ret_len) {
                        ret[at++] = first ? '?' : '&';
                        memcpy(ret + at, a, an);
                        at += an;
                        ret[at] = '\0';
                        first = false;
                }
                a = amp ? amp + 1 : end;
        }
        return tok;
}

/* Calls fn on every runtime_preview_token cookie's value until it says
 * true. */
static bool cookie_tokens(const PreviewHead *h, bool (*fn)(void *, PreviewSpan), void *userdata) {
        size_t kn = strlen(PREVIEW_TOKEN_ARG);
        for (size_t i = 0; i < h->n_fields; i++) {
                if (!preview_field_is(h->fields[i], "cookie"))
                        continue;
                PreviewSpan v = preview_field_value(h->fields[i]);
                for (const char *a = v.p, *end = v.p + v.n; a < end;) {
                        while (a < end && (*a == ' ' || *a == ';'))
                                a++;
                        const char *semi = memchr(a, ';', (size_t)(end - a));
                        const char *stop = semi ? semi : end;
                        if ((size_t)(stop - a) > kn && a[kn] == '=' && strncmp(a, PREVIEW_TOKEN_ARG, kn) == 0 &&
                            fn(userdata, (PreviewSpan){ a + kn + 1, (size_t)(stop - a) - kn - 1 }))
                                return true;
                        a = stop;
                }
        }
        return false;
}

typedef struct TokenCheck {
        Previews *pv;
        const StorePreview *p;
        int64_t now;
} TokenCheck;

static bool token_ok(void *userdata, PreviewSpan t) {
        TokenCheck *tc = userdata;
        return previews_token_ok(tc->pv, tc->p, t.p, t.n, tc->now);
}

/* The head as the server in the sandbox gets it: the request line with
 * target, every header but the token's, and the Cookie header without the
 * token's cookie. one_answer: the connection ends after this request's
 * answer (Connection: close in place of the client's Connection and
 * Keep-Alive), unless it asks for an upgrade. */
static int rewrite_head(const PreviewHead *h, const char *target, bool one_answer, char *out, size_t cap,
                        size_t *ret_len) {
        size_t at = 0;
        int n = snprintf(out, cap, "%.*s %s HTTP/1.%c\r\n", (int)h->method.n, h->method.p, target,
                         h->http10 ? '0' : '1');
        if (n < 0 || (size_t)n >= cap)
                return -EMSGSIZE;
        at = (size_t)n;
        size_t kn = strlen(PREVIEW_TOKEN_ARG);
        for (size_t i = 0; i < h->n_fields; i++) {
                PreviewSpan f = h->fields[i];
                if (preview_field_is(f, PREVIEW_TOKEN_HEADER))
                        continue;
                if (one_answer && !h->upgrade && (preview_field_is(f, "connection") || preview_field_is(f, "keep-alive")))
                        continue;
                if (preview_field_is(f, "cookie")) {
                        PreviewSpan v = preview_field_value(f);
                        char kept[PREVIEW_HEAD_MAX];
                        size_t k = 0;
                        for (const char *a = v.p, *end = v.p + v.n; a < end;) {
                                while (a < end && (*a == ' ' || *a == ';'))
                                        a++;
                                const char *semi = memchr(a, ';', (size_t)(end - a));
                                const char *stop = semi ? semi : end;
                                bool ours = (size_t)(stop - a) > kn && a[kn] == '=' &&
                                            strncmp(a, PREVIEW_TOKEN_ARG, kn) == 0;
                                if (!ours && stop > a && k + (size_t)(stop - a) + 2 < sizeof kept) {
                                        if (k) {
                                                kept[k++] = ';';
                                                kept[k++] = ' ';
                                        }
                                        memcpy(kept + k, a, (size_t)(stop - a));
                                        k += (size_t)(stop - a);
                                }
                                a = stop;
                        }
                        if (!k)
                                continue;
                        n = snprintf(out + at, cap - at, "Cookie: %.*s\r\n", (int)k, kept);
                } else
                        n = snprintf(out + at, cap - at, "%.*s\r\n", (int)f.n, f.p);
                if (n < 0 || (size_t)n >= cap - at)
                        return -EMSGSIZE;
                at += (size_t)n;
        }
        if (one_answer && !h->upgrade) {
                n = snprintf(out + at, cap - at, "Connection: close\r\n");
                if (n < 0 || (size_t)n >= cap - at)
                        return -EMSGSIZE;
                at += (size_t)n;
        }
        if (cap - at < 3)
                return -EMSGSIZE;
        memcpy(out + at, "\r\n", 3);
        *ret_len = at + 2;
        return 0;
}

/* ---- the sandbox's side ---- */

static bool line_names(const char *line, size_t n, const char *name) {
        size_t k = strlen(name);
        if (n <= k || strncasecmp(line, name, k) != 0)
                return false;
        /* "X-Frame-Options :" too: whatever a browser might still read as
         * that header goes. */
        while (k < n && (line[k] == ' ' || line[k] == '\t'))
                k++;
        return k < n && line[k] == ':';
}

/* Sends the head of an answer (n bytes, its blank line included) of a
 * preview that only some sites may frame: the server's headers but
 * X-Frame-Options (it cannot name sites, and a browser that reads the
 * policy below ignores it anyway), then the preview's policy beside the
 * server's own (a browser enforces every policy an answer carries, so the
 * server's frame-ancestors can narrow the owner's list, never widen it),
 * the token's cookie when due, and Connection: close (the connection
 * carries one answer: the answers after it would need their framing
 * parsed to be found). */
static int send_framed_head(Conn *c, const char *head, size_t n, bool upgraded) {
        size_t cap = n + strlen(c->frame) + strlen(c->cookie) + 32, at = 0;
        _cleanup_free_ char *out = malloc(cap);
        if (!out)
                return -ENOMEM;
        const char *eol = memmem(head, n, "\r\n", 2);
        size_t line = (size_t)(eol - head) + 2;
        memcpy(out, head, line);
        at = line;
        bool dropping = false;
        for (const char *p = head + line; p < head + n - 2;) {
                const char *e = memmem(p, (size_t)(head + n - p), "\r\n", 2);
                size_t len = (size_t)(e - p);
                /* A folded line (obs-fold) goes with the header it
                 * continues. */
                if (len == 0 || (*p != ' ' && *p != '\t'))
                        dropping = line_names(p, len, "x-frame-options") ||
                                   (!upgraded && (line_names(p, len, "connection") || line_names(p, len, "keep-alive")));
                if (!dropping) {
                        memcpy(out + at, p, len + 2);
                        at += len + 2;
                }
                p = e + 2;
        }
        at += (size_t)snprintf(out + at, cap - at, "%s%s%s\r\n", c->frame, c->cookie,
                               upgraded ? "" : "Connection: close\r\n");
        return send_all(c, out, at);
}

/* The answers' heads in held (len bytes so far) of a preview that only
 * some sites may frame: interim answers (1xx but 101) pass as they are,
 * the final one is rewritten (send_framed_head). 1 once the final head
 * went, with the bytes after it; 0 while it is incomplete; < 0 when the
 * server's answer is no HTTP/1 head within PREVIEW_HEAD_MAX bytes (a 502
 * page went). */
static int send_framed(Conn *c, char *held, size_t *len) {
        for (;;) {
                const char *end = memmem(held, *len, "\r\n\r\n", 4);
                if (!end) {
                        if (*len < PREVIEW_HEAD_MAX)
                                return 0;
                        break;
                }
                size_t n = (size_t)(end - held) + 4;
                unsigned status = 0;
                if (n < 16 || strncmp(held, "HTTP/1.", 7) != 0 || held[8] != ' ' ||
                    sscanf(held + 9, "%3u", &status) != 1 || status < 100 || status > 599)
                        break;
                if (status >= 200 || status == 101) {
                        int w = send_framed_head(c, held, n, status == 101);
                        if (w == 0)
                                w = send_all(c, held + n, *len - n);
                        return w < 0 ? w : 1;
                }
                if (send_all(c, held, n) < 0)
                        return -EPIPE;
                memmove(held, held + n, *len - n);
                *len -= n;
        }
        send_page(c, 502, "Bad Gateway", "Not an HTTP answer",
                  "the server in the sandbox answered with no HTTP/1.1 head within 16 KiB (its lines must end with CRLF)");
        return -EPROTO;
}

/* Sends the sandbox's bytes to the client until either side ends; the
 * first answer gets the token's cookie when the first request brought the
 * token in its query. */
static void *pump_main(void *arg) {
        Conn *c = arg;
        char first[PREVIEW_HEAD_MAX];
        size_t held = 0;
        bool framed = c->frame[0] != '\0';
        bool inject = framed || c->cookie[0] != '\0';
        for (;;) {
                ChanEvent ev;
                int k = chan_stream_next(c->s, POLL_MS, &ev);
                if (k == -ETIMEDOUT) {
                        if (atomic_load(&c->closing) || atomic_load(&c->px->stop))
                                break;
                        continue;
                }
                if (k < 0)
                        break;
                bool end = ev.type == CHAN_EV_RESULT || ev.type == CHAN_EV_CLOSED || ev.type == CHAN_EV_EOF;
                int w = 0;
                if (ev.type == CHAN_EV_DATA && framed && inject) {
                        /* Held until the final answer's head is whole. */
                        size_t take = ev.len < sizeof first - held ? ev.len : sizeof first - held;
                        memcpy(first + held, ev.data, take);
                        held += take;
                        w = send_framed(c, first, &held);
                        if (w > 0) {
                                inject = false;
                                w = take < ev.len ? send_all(c, ev.data + take, ev.len - take) : 0;
                        }
                } else if (ev.type == CHAN_EV_DATA && inject) {
                        /* Held until the status line is whole, then the cookie
                         * goes in after it. */
                        size_t take = ev.len < sizeof first - held ? ev.len : sizeof first - held;
                        memcpy(first + held, ev.data, take);
                        held += take;
                        const char *eol = memmem(first, held, "\r\n", 2);
                        if (eol || held == sizeof first) {
                                inject = false;
                                size_t line = eol ? (size_t)(eol - first) + 2 : 0;
                                w = send_all(c, first, line);
                                if (w == 0 && eol)
                                        w = send_all(c, c->cookie, strlen(c->cookie));
                                if (w == 0)
                                        w = send_all(c, first + line, held - line);
                                if (w == 0 && take < ev.len)
                                        w = send_all(c, ev.data + take, ev.len - take);
                        }
                } else if (ev.type == CHAN_EV_DATA)
                        w = send_all(c, ev.data, ev.len);
                chan_event_clear(&ev);
                if (end || w < 0)
                        break;
        }
        if (inject && held && !framed)
                (void)send_all(c, first, held);
        else if (inject && held)
                send_page(c, 502, "Bad Gateway", "No whole answer",
                          "the server in the sandbox closed the connection before its answer's head was whole");
        /* Either side's end is the connection's: the reader wakes. */
        atomic_store(&c->closing, true);
        (void)shutdown(c->fd, SHUT_RDWR);
        return NULL;
}

/* Writes to the sandbox, waiting for credit as long as the stream moves. */
static int to_sandbox(Conn *c, const char *buf, size_t n) {
        if (n == 0)
                return 0;
        int r = chan_stream_write(c->s, buf, n, STALL_TIMEOUT_MS);
        if (r == 0)
                atomic_store(&c->active_ms, (int64_t)time_now_mono_ms());
        return r;
}

/* ---- a connection ---- */

typedef enum BodyKind { BODY_NONE, BODY_LENGTH, BODY_CHUNKED, BODY_RAW } BodyKind;

/* Relays the body that follows a head, then the next heads on the
 * connection, each naming the same preview. Returns when either side
 * ends: true when the client is done sending but its answer is still to
 * come (it half-closed, or its last request said Connection: close). */
static bool relay(Conn *c, Input *in, const PreviewHead *first, const char *host) {
        PreviewHead h = *first;
        char rewritten[PREVIEW_HEAD_MAX + 64];
        for (;;) {
                /* in holds the head h at its start; what follows is body. */
                size_t off = h.head_len;
                BodyKind kind = h.upgrade ? BODY_RAW
                                : h.chunked ? BODY_CHUNKED
                                : h.content_length > 0 ? BODY_LENGTH
                                                        : BODY_NONE;
                uint64_t left = h.content_length > 0 ? (uint64_t)h.content_length : 0;
                PreviewChunked ck = { 0 };
                for (;;) {
                        size_t avail = in->len - off;
                        size_t take = 0;
                        bool done = false;
                        if (kind == BODY_NONE)
                                done = true;
                        else if (kind == BODY_RAW)
                                take = avail;
                        else if (kind == BODY_LENGTH) {
                                take = avail < left ? avail : (size_t)left;
                                left -= take;
                                done = left == 0;
                        } else {
                                ssize_t k = preview_chunked_feed(&ck, in->buf + off, avail);
                                if (k < 0) {
                                        log_info(NULL, "preview %s: a malformed chunked body; closing", host);
                                        return false;
                                }
                                take = (size_t)k;
                                done = ck.state == CHUNK_DONE;
                        }
                        if (to_sandbox(c, in->buf + off, take) < 0)
                                return false;
                        off += take;
                        if (done)
                                break;
                        /* Room for more: what was relayed goes. */
                        in->len = 0;
                        off = 0;
                        ssize_t n = read_more(c, in, (int64_t)time_now_mono_ms() +
                                                             (kind == BODY_RAW ? 24 * 3600 * 1000LL : STALL_TIMEOUT_MS));
                        if (n == -ETIMEDOUT && kind == BODY_RAW)
                                continue;
                        if (n <= 0) {
                                if (n == 0)
                                        (void)chan_stream_close_write(c->s);
                                return n == 0;
                        }
                }
                /* The next request's bytes, if any, move to the front. */
                memmove(in->buf, in->buf + off, in->len - off);
                in->len -= off;
                in->buf[in->len] = '\0';
                if (h.close || c->frame[0])
                        return true;
                const char *why = NULL;
                int r = read_head(c, in, &h, &why);
                if (r < 0) {
                        if (r != -EPIPE) {
                                log_info(NULL, "preview %s: a later request refused (%s); closing", host,
                                         why ? why : strerror(-r));
                                return false;
                        }
                        (void)chan_stream_close_write(c->s);
                        return true;
                }
                /* A connection serves one preview. */
                if (!lower_eq(h.host.p, h.host.n, host)) {
                        log_info(NULL, "preview %s: a later request names %.*s; closing", host, (int)h.host.n,
                                 h.host.p);
                        return false;
                }
                char target[PREVIEW_HEAD_MAX];
                (void)query_token(h.target, target, sizeof target);
                size_t len = 0;
                if (rewrite_head(&h, target, c->frame[0] != '\0', rewritten, sizeof rewritten, &len) < 0 ||
                    to_sandbox(c, rewritten, len) < 0)
                        return false;
        }
}

static const char *status_reason(unsigned s) {
        switch (s) {
        case 400: return "Bad Request";
        case 401: return "Unauthorized";
        case 403: return "Forbidden";
        case 404: return "Not Found";
        case 408: return "Request Timeout";
        case 409: return "Conflict";
        case 410: return "Gone";
        case 431: return "Request Header Fields Too Large";
        case 501: return "Not Implemented";
        case 502: return "Bad Gateway";
        case 503: return "Service Unavailable";
        case 505: return "HTTP Version Not Supported";
        default: return "Error";
        }
}

static void refuse(Conn *c, unsigned status, const char *title, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void refuse(Conn *c, unsigned status, const char *title, const char *fmt, ...) {
        char text[700];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
        /* The text names sandboxes and ports, never markup: escaped anyway. */
        char safe[1000];
        size_t k = 0;
        for (const char *p = text; *p && k + 7 < sizeof safe; p++) {
                if (*p == '<' || *p == '>' || *p == '&' || *p == '"') {
                        const char *e = *p == '<' ? "&lt;" : *p == '>' ? "&gt;" : *p == '&' ? "&amp;" : "&quot;";
                        k += (size_t)snprintf(safe + k, sizeof safe - k, "%s", e);
                } else
                        safe[k++] = *p;
        }
        safe[k] = '\0';
        send_page(c, status, status_reason(status), title, safe);
        /* A lingering close: what the client still sends is read and
         * dropped for a moment, so that its socket does not reset before
         * it has read the page. */
        io_shutdown_write(c);
        char sink[4096];
        size_t drained = 0;
        int64_t until = (int64_t)time_now_mono_ms() + 500;
        while (drained < 256 * 1024) {
                if (!io_pending(c) && wait_fd(c, POLLIN, until) <= 0)
                        break;
                ssize_t n = io_recv(c, sink, sizeof sink);
                if (n == -EAGAIN)
                        continue;
                if (n <= 0)
                        break;
                drained += (size_t)n;
        }
}

/* A private preview's token, from the header, the query or the cookie:
 * true when one is valid (a token in the query then sets the cookie on the
 * first answer); false once the refusal was sent. */
static bool admit(Conn *c, App *app, const PreviewHead *h, const StorePreview *p, PreviewSpan qtok, int64_t now) {
        TokenCheck tc = { .pv = app->previews, .p = p, .now = now };
        bool ok = false, offered = h->token.n || qtok.n;
        if (h->token.n)
                ok = token_ok(&tc, h->token);
        else if (qtok.n)
                ok = token_ok(&tc, qtok);
        else {
                ok = cookie_tokens(h, token_ok, &tc);
                for (size_t i = 0; !offered && i < h->n_fields; i++) {
                        const char *at = preview_field_is(h->fields[i], "cookie")
                                                 ? memmem(h->fields[i].p, h->fields[i].n, PREVIEW_TOKEN_ARG "=",
                                                          strlen(PREVIEW_TOKEN_ARG) + 1)
                                                 : NULL;
                        offered = at != NULL;
                }
        }
        if (!ok) {
                if (offered)
                        refuse(c, 403, "Token refused",
                               "this preview's token is wrong, expired or was rotated: ask the sandbox's owner for "
                               "its urlWithToken again");
                else
                        refuse(c, 401, "Token needed",
                               "this preview is private: open its urlWithToken, or send its token in the %s header",
                               PREVIEW_TOKEN_HEADER);
                return false;
        }
        if (qtok.n && !h->token.n) {
                /* The cookie lets the page's own requests in: this host's
                 * only (no Domain), never sent to another preview. */
                int64_t exp = 0;
                for (size_t i = 0; i < qtok.n && qtok.p[i] != '.'; i++)
                        exp = exp * 10 + (qtok.p[i] - '0');
                /* A preview other sites may frame is a third party in their
                 * pages, where a Lax cookie is never sent: over HTTPS its
                 * cookie is SameSite=None and Partitioned (kept apart per
                 * top-level site, so no other site's page sends it). */
                bool third_party = p->embed_origins[0] && app->preview_site->https;
                snprintf(c->cookie, sizeof c->cookie,
                         "Set-Cookie: %s=%.*s; Path=/; Max-Age=%" PRId64 "; HttpOnly; %s\r\n", PREVIEW_TOKEN_ARG,
                         (int)qtok.n, qtok.p, exp - now,
                         third_party                  ? "SameSite=None; Secure; Partitioned"
                         : app->preview_site->https ? "SameSite=Lax; Secure"
                                                      : "SameSite=Lax");
        }
        return true;
}

/* The policy line of a preview that only the sites of origins (one a
 * line, each checked by preview_embed_origin_ok when stored) may frame:
 * the preview's own pages may frame it too. */
static void frame_policy(const char *origins, char *ret, size_t n) {
        size_t at = (size_t)snprintf(ret, n, "Content-Security-Policy: frame-ancestors 'self' ");
        for (const char *o = origins; *o && at + 4 < n; o++)
                ret[at++] = *o == '\n' ? ' ' : *o;
        if (at + 3 > n)
                at = n - 3;
        memcpy(ret + at, "\r\n", 3);
}

/* The host that runs the sandbox when it is another one (a fleet), in
 * ret; "" otherwise. A paused or stopped sandbox of another host is that
 * host's too: it wakes it, or says how to start it. */
static void runs_elsewhere(App *app, const KeyInfo *key, const char *sandbox_id, char *ret, size_t n) {
        SandboxRow row;
        SandboxError se;
        if (!app->fleet || sandbox_get(app->manager, key, sandbox_id, &row, &se) < 0)
                return;
        const char *self = fleet_host_id(app->fleet);
        if (row.state != SANDBOX_LOST && row.host_id[0] && self && strcmp(row.host_id, self) != 0)
                snprintf(ret, n, "%s", row.host_id);
        sandbox_row_done(&row);
}

/* Copies bytes between the client and the host that runs the sandbox
 * until either ends. That host parses, bounds and times every request as
 * its own listener does (its clients' bounds and this one's both hold):
 * this end only passes bytes, and ends when that host does. */
static void splice_host(Conn *c, Forward *f, const Input *in) {
        char *buf = malloc(16384);
        bool ok = buf && forward_write(f, in->buf, in->len) == 0, client_open = true;
        while (ok && !atomic_load(&c->closing) && !atomic_load(&c->px->stop)) {
                bool from_client = client_open && io_pending(c), from_host = forward_pending(f);
                if (!from_client && !from_host) {
                        struct pollfd p[2] = { { .fd = client_open ? c->fd : -1, .events = POLLIN },
                                               { .fd = forward_fd(f), .events = POLLIN } };
                        int k = poll(p, 2, POLL_MS);
                        if (k < 0 && errno != EINTR)
                                break;
                        if (k <= 0)
                                continue;
                        from_client = p[0].revents & (POLLIN | POLLHUP | POLLERR);
                        from_host = p[1].revents & (POLLIN | POLLHUP | POLLERR);
                }
                if (from_client) {
                        ssize_t n = io_recv(c, buf, 16384);
                        if (n == 0) {
                                /* Done sending: its answers still come. */
                                client_open = false;
                                forward_shutdown_write(f);
                        } else if (n > 0)
                                ok = forward_write(f, buf, (size_t)n) == 0;
                }
                if (ok && from_host) {
                        ssize_t n = forward_read(f, buf, 16384);
                        ok = n > 0 && send_all(c, buf, (size_t)n) == 0;
                }
        }
        free(buf);
}

/* Relays the connection to host, which runs the sandbox: through the
 * fleet's own hop (its secret, its TLS), to that host's API, which hands
 * the connection to its preview listener. A page when it cannot be. */
static void relay_to_host(Conn *c, Input *in, const char *host) {
        App *app = c->px->app;
        pthread_mutex_lock(&conns_lock);
        unsigned n = 0;
        for (Conn *x = conns; x; x = x->next)
                n += strcmp(x->relay_host, host) == 0;
        bool room = n < atomic_load(&relay_max);
        if (room)
                snprintf(c->relay_host, sizeof c->relay_host, "%s", host);
        pthread_mutex_unlock(&conns_lock);
        if (!room) {
                refuse(c, 503, "Too many connections",
                       "this server relays %u connections to host %s, which runs sandbox %s, the most it may; try "
                       "again shortly", atomic_load(&relay_max), host, c->sandbox_id);
                return;
        }
        char url[512], path[160];
        int rc = fleet_host_url(app->fleet, host, url, sizeof url);
        if (rc == -ENOENT && fleet_refresh(app->fleet) == 0) /* a host that joined since the last look */
                rc = fleet_host_url(app->fleet, host, url, sizeof url);
        if (rc < 0) {
                refuse(c, 503, "Host unavailable",
                       "sandbox %s runs on host %s, which does not answer; try again shortly (once the fleet "
                       "declares that host dead, the sandbox shows as lost)", c->sandbox_id, host);
                return;
        }
        snprintf(path, sizeof path, "/v1/sandboxes/%s/previews/%u:relay", c->sandbox_id, c->port);
        ForwardTunnel t = { .base_url = url, .path = path, .protocol = PREVIEW_RELAY_PROTOCOL,
                            .secret = atomic_load(&c->px->fleet_secret), .by = fleet_host_id(app->fleet),
                            .sandbox_id = c->sandbox_id, .client_fd = c->fd };
        Forward *f = NULL;
        ApiError e = { 0 };
        rc = forward_tunnel_open(&t, &f, &e);
        if (rc == -ECONNRESET)
                return;
        if (rc < 0) {
                log_warn(NULL, "preview %u-%s: relaying it to host %s: %s", c->port, c->sandbox_id, host, e.message);
                refuse(c, e.status == 503 ? 503 : 502, e.status == 503 ? "Host unavailable" : "Bad gateway",
                       "%s; try again shortly", e.message);
                return;
        }
        splice_host(c, f, in);
        forward_free(f);
}

/* Connects c->s to the preview's port inside; false once the refusal was
 * sent. */
static bool connect_port(Conn *c, Sandbox *sb) {
        SandboxError se;
        json_t *req = agent_req_forward(c->port);
        int r = req ? sandbox_open_stream(sb, req, &c->s, &se) : -ENOMEM;
        json_decref(req);
        char failed[600] = "the sandbox stopped";
        if (r == 0) {
                ChanEvent ev;
                int k = chan_stream_next(c->s, OPEN_TIMEOUT_MS, &ev);
                if (k == 0 && ev.type == CHAN_EV_EVENT) {
                        chan_event_clear(&ev);
                        return true;
                }
                if (k == 0 && ev.type == CHAN_EV_RESULT) {
                        const char *msg = NULL;
                        agent_result_error(ev.json, &msg);
                        snprintf(failed, sizeof failed, "%s", msg ? msg : "the connection was refused");
                } else if (k == -ETIMEDOUT)
                        snprintf(failed, sizeof failed, "the connection did not open in time");
                if (k == 0)
                        chan_event_clear(&ev);
        } else
                snprintf(failed, sizeof failed, "%s", r == -ENOMEM ? "out of memory" : se.message);
        refuse(c, 502, "Nothing answers on this port",
               "nothing in sandbox %s accepted a connection on port %u (%s). Start a server there listening on "
               "0.0.0.0 or 127.0.0.1.",
               c->sandbox_id, c->port, failed);
        return false;
}

static void serve(Conn *c) {
        App *app = c->px->app;
        Input *in = calloc(1, sizeof(*in));
        if (!in)
                return;
        PreviewHead h;
        const char *why = NULL;
        atomic_store(&c->active_ms, (int64_t)time_now_mono_ms());
        /* What came with a relayed connection's upgrade is its first bytes. */
        in->len = c->pre_len < PREVIEW_HEAD_MAX ? c->pre_len : PREVIEW_HEAD_MAX;
        if (in->len)
                memcpy(in->buf, c->pre, in->len);
        int r = read_head(c, in, &h, &why);
        if (r == -ETIMEDOUT)
                refuse(c, 408, "Request timeout", "the request's head did not arrive within %d seconds",
                       HEAD_TIMEOUT_MS / 1000);
        else if (r == -EMSGSIZE)
                refuse(c, 431, "Request head too large", "a request head is at most %u bytes", PREVIEW_HEAD_MAX);
        else if (r == -EINVAL)
                refuse(c, 400, "Bad request", "%s", why);
        else if (r == -ENOTSUP)
                refuse(c, why && strstr(why, "HTTP/1") ? 505 : 501, "Not served", "%s", why);
        if (r < 0) {
                free(in);
                return;
        }
        char host[300];
        snprintf(host, sizeof host, "%.*s", (int)h.host.n, h.host.p);
        r = parse_host(app->preview_site, h.host, c->sandbox_id, sizeof c->sandbox_id, &c->port);
        if (r == -ERANGE) {
                refuse(c, 400, "Port out of range", "a preview's port is 1 to 65535: %s names another", host);
                goto out;
        }
        if (r < 0) {
                refuse(c, 404, "No preview here",
                       "%s is not a preview's address: previews are at PORT-SANDBOX.%s", host,
                       app->preview_site->domain);
                goto out;
        }
        /* A relayed connection serves the preview the relaying host asked
         * for, and no other. */
        if (c->relayed_by[0] && (strcmp(c->sandbox_id, c->expect_id) != 0 || c->port != c->expect_port)) {
                log_warn(NULL, "preview %s: relayed by host %s for port %u of %s; refused", host, c->relayed_by,
                         c->expect_port, c->expect_id);
                refuse(c, 400, "Bad request", "this connection was relayed for another preview");
                goto out;
        }
        StorePreview p;
        int64_t now = time_now_unix();
        r = previews_get(app->previews, c->sandbox_id, c->port, &p);
        if (r == 0 && preview_expired(&p, now))
                r = -ENOENT;
        if (r == -ENOENT) {
                refuse(c, 404, "No preview here",
                       "port %u of sandbox %s is not shared (it never was, it was deleted or it expired)", c->port,
                       c->sandbox_id);
                goto out;
        }
        if (r < 0) {
                log_error(NULL, "preview %s: reading it: %s", host, strerror(-r));
                refuse(c, 503, "Try again", "the preview could not be looked up");
                goto out;
        }
        char target[PREVIEW_HEAD_MAX];
        PreviewSpan qtok = query_token(h.target, target, sizeof target);
        if (!p.public && !admit(c, app, &h, &p, qtok, now))
                goto out;
        /* The owner's sandbox, woken when paused with autoWake: the owner
         * shared it. */
        KeyInfo key = { .access = KEY_ACCESS_FULL, .daily_limit_micros = -1 };
        snprintf(key.id, sizeof key.id, "preview");
        snprintf(key.name, sizeof key.name, "preview");
        snprintf(key.owner, sizeof key.owner, "%s", p.owner);
        explicit_bzero(p.secret, sizeof p.secret);
        /* Another host's sandbox: the connection goes on to that host once
         * the token passed here (it is checked there again). A connection
         * relayed here never goes on. */
        if (app->fleet && atomic_load(&c->px->fleet_secret) && !c->relayed_by[0] && !fleet_runs_here(app->fleet, c->sandbox_id)) {
                char elsewhere[64] = "";
                runs_elsewhere(app, &key, c->sandbox_id, elsewhere, sizeof elsewhere);
                if (elsewhere[0]) {
                        relay_to_host(c, in, elsewhere);
                        goto out;
                }
        }
        if (p.embed_origins[0])
                frame_policy(p.embed_origins, c->frame, sizeof c->frame);
        Sandbox *sb = NULL;
        SandboxError se;
        if (sandbox_acquire(app->manager, &key, c->sandbox_id, &sb, &se) < 0) {
                char elsewhere[64] = "";
                if (se.kind != SANDBOX_ERR_NOT_FOUND)
                        runs_elsewhere(app, &key, c->sandbox_id, elsewhere, sizeof elsewhere);
                if (se.kind == SANDBOX_ERR_NOT_FOUND)
                        refuse(c, 404, "No preview here", "sandbox %s does not exist (any more)", c->sandbox_id);
                else if (elsewhere[0])
                        /* No fleet secret to relay it with (or relayed here
                         * already): that host's listener serves it. */
                        refuse(c, 503, "Served by another host",
                               "sandbox %s runs on host %s, and this server does not relay previews to it: open "
                               "it at that host's preview listener, or give the hosts a fleet secret "
                               "(docs/previews.md, \"A fleet\")",
                               c->sandbox_id, elsewhere);
                else
                        refuse(c, 503, "Sandbox not running",
                               "sandbox %s is not running, so port %u cannot answer: %s. Its owner can start it "
                               "again (POST /v1/sandboxes/%s:wake or :restart).",
                               c->sandbox_id, c->port, se.message, c->sandbox_id);
                goto out;
        }
        if (!connect_port(c, sb)) {
                chan_stream_free(c->s);
                c->s = NULL;
                sandbox_release(sb);
                goto out;
        }
        size_t len = 0;
        char *rewritten = malloc(PREVIEW_HEAD_MAX + 64);
        if (rewritten && rewrite_head(&h, target, c->frame[0] != '\0', rewritten, PREVIEW_HEAD_MAX + 64, &len) == 0 &&
            to_sandbox(c, rewritten, len) == 0 &&
            pthread_create(&c->pump, NULL, pump_main, c) == 0) {
                c->pump_started = true;
                /* A client done sending still gets its answer: the server
                 * inside ends it, or the idle bound does. */
                if (relay(c, in, &h, host))
                        while (!atomic_load(&c->closing) && !atomic_load(&c->px->stop) &&
                               (int64_t)time_now_mono_ms() < atomic_load(&c->active_ms) + IDLE_TIMEOUT_MS)
                                usleep(POLL_MS * 1000);
        }
        free(rewritten);
        atomic_store(&c->closing, true);
        (void)shutdown(c->fd, SHUT_RDWR);
        if (c->pump_started)
                pthread_join(c->pump, NULL);
        chan_stream_free(c->s);
        c->s = NULL;
        sandbox_release(sb);
out:
        free(in);
}

static void *conn_main(void *arg) {
        Conn *c = arg;
        if (c->px->tls) {
                c->ssl = SSL_new(c->px->tls);
                /* A client that fails the handshake (plain HTTP on the TLS
                 * port, a scanner) is closed without an answer. */
                if (c->ssl && SSL_set_fd(c->ssl, c->fd) == 1 && io_handshake(c))
                        serve(c);
        } else
                serve(c);
        /* Out of the list before its descriptor closes: a close of the
         * preview must never shut down a number another connection got. */
        conn_unlink(c);
        SSL_free(c->ssl);
        pthread_mutex_destroy(&c->io);
        if (c->urh)
                MHD_upgrade_action(c->urh, MHD_UPGRADE_ACTION_CLOSE);
        else
                close(c->fd);
        free(c->pre);
        free(c);
        return NULL;
}

static void *accept_main(void *arg) {
        PreviewProxy *px = arg;
        while (!atomic_load(&px->stop)) {
                struct pollfd p = { .fd = px->fd, .events = POLLIN };
                if (poll(&p, 1, POLL_MS) <= 0)
                        continue;
                struct sockaddr_storage sa;
                socklen_t sl = sizeof sa;
                int fd = accept4(px->fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0)
                        continue;
                Conn *c = calloc(1, sizeof(*c));
                if (!c) {
                        close(fd);
                        continue;
                }
                c->px = px;
                c->fd = fd;
                pthread_mutex_init(&c->io, NULL);
                if (sa.ss_family == AF_INET)
                        inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, c->peer, sizeof c->peer);
                else if (sa.ss_family == AF_INET6)
                        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, c->peer, sizeof c->peer);
                /* An answer arrives in the channel's pieces: each goes at
                 * once, not held for the client's delayed ACK. */
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                pthread_mutex_lock(&conns_lock);
                bool room = n_conns < MAX_CONNS, peer_room = peer_count_locked(c->peer) < MAX_CONNS_PER_PEER;
                if (room && peer_room) {
                        c->next = conns;
                        conns = c;
                        n_conns++;
                }
                pthread_mutex_unlock(&conns_lock);
                if (!room || !peer_room) {
                        /* Over TLS a page would need a handshake first: closed. */
                        if (!px->tls)
                                refuse(c, 503, "Too many connections",
                                       peer_room ? "this server has %d preview connections open; try again shortly"
                                                 : "your address has %d preview connections open, the most one may",
                                       peer_room ? MAX_CONNS : MAX_CONNS_PER_PEER);
                        close(fd);
                        pthread_mutex_destroy(&c->io);
                        free(c);
                        continue;
                }
                pthread_attr_t attr;
                pthread_attr_init(&attr);
                pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
                if (pthread_create(&c->thread, &attr, conn_main, c) != 0) {
                        close(fd);
                        conn_unlink(c);
                        pthread_mutex_destroy(&c->io);
                        free(c);
                }
                pthread_attr_destroy(&attr);
        }
        return NULL;
}

int preview_proxy_start(App *app, int fd, void *tls, PreviewProxy **ret) {
        PreviewProxy *px = calloc(1, sizeof(*px));
        if (!px)
                return -ENOMEM;
        px->app = app;
        px->fd = fd;
        px->tls = tls;
        int r = pthread_create(&px->accept_thread, NULL, accept_main, px);
        if (r != 0) {
                free(px);
                return -r;
        }
        atomic_store(&serving, px);
        *ret = px;
        return 0;
}

void preview_proxy_set_relay_max(unsigned n) {
        atomic_store(&relay_max, n ? n : PREVIEW_RELAY_MAX_DEFAULT);
}

void preview_proxy_set_fleet_secret(PreviewProxy *px, const char *secret) {
        atomic_store(&px->fleet_secret, secret && *secret ? secret : NULL);
}

int preview_proxy_adopt(int sock, struct MHD_UpgradeResponseHandle *urh, const char *extra, size_t extra_len,
                        const char *by, const char *sandbox_id, unsigned port) {
        PreviewProxy *px = atomic_load(&serving);
        if (!px || atomic_load(&px->stop))
                return -ESHUTDOWN;
        Conn *c = calloc(1, sizeof(*c));
        if (!c || (extra_len && !(c->pre = malloc(extra_len)))) {
                free(c);
                return -ENOMEM;
        }
        if (extra_len)
                memcpy(c->pre, extra, extra_len);
        c->pre_len = extra_len;
        c->px = px;
        c->fd = sock;
        c->urh = urh;
        pthread_mutex_init(&c->io, NULL);
        snprintf(c->relayed_by, sizeof c->relayed_by, "%s", by);
        snprintf(c->peer, sizeof c->peer, "host:%s", by);
        snprintf(c->expect_id, sizeof c->expect_id, "%s", sandbox_id);
        c->expect_port = port;
        (void)fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) | O_NONBLOCK);
        pthread_mutex_lock(&conns_lock);
        bool room = n_conns < MAX_CONNS && peer_count_locked(c->peer) < atomic_load(&relay_max);
        if (room) {
                c->next = conns;
                conns = c;
                n_conns++;
        }
        pthread_mutex_unlock(&conns_lock);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int r = room ? pthread_create(&c->thread, &attr, conn_main, c) : EBUSY;
        pthread_attr_destroy(&attr);
        if (r == 0)
                return 0;
        if (room)
                conn_unlink(c);
        else
                refuse(c, 503, "Too many connections",
                       "the server that runs this sandbox has as many preview connections open as it may; try "
                       "again shortly");
        pthread_mutex_destroy(&c->io);
        free(c->pre);
        free(c);
        return -r;
}

void preview_proxy_stop(PreviewProxy *px) {
        if (!px)
                return;
        PreviewProxy *was = px;
        atomic_compare_exchange_strong(&serving, &was, NULL);
        atomic_store(&px->stop, true);
        pthread_join(px->accept_thread, NULL);
        close(px->fd);
        pthread_mutex_lock(&conns_lock);
        for (Conn *c = conns; c; c = c->next)
                if (c->px == px) {
                        atomic_store(&c->closing, true);
                        (void)shutdown(c->fd, SHUT_RDWR);
                }
        for (;;) {
                bool mine = false;
                for (Conn *c = conns; c; c = c->next)
                        mine |= c->px == px;
                if (!mine)
                        break;
                pthread_cond_wait(&conns_gone, &conns_lock);
        }
        pthread_mutex_unlock(&conns_lock);
        free(px);
}

void preview_proxy_forget_sandbox(App *app, const char *sandbox_id) {
        if (!app->previews)
                return;
        int rc = previews_remove(app->previews, sandbox_id, 0);
        if (rc < 0)
                log_warn(NULL, "removing the previews of deleted sandbox %s: %s", sandbox_id, strerror(-rc));
        preview_proxy_close(sandbox_id, 0);
}
