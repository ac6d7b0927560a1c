/* Forwarding a request to the host that runs its sandbox: see forward.h. */
#include "daemon/http/forward.h"

#include <errno.h>
#include <fcntl.h>
#include <http_parser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/log.h"
#include "common/macro.h"

#define MAX_HEADERS 64
#define MAX_HEADER_BYTES 8192
#define HEAD_MAX (64 * 1024)
#define RAW_BUF (64 * 1024)
#define POLL_MS 250
#define SEND_TIMEOUT_S 30
/* Kept-alive connections to the hosts, for the next hop to the same one:
 * at most POOL_PER_HOST idle for one URL and POOL_MAX in all, each for
 * POOL_IDLE_MS at most, well within the time an owner keeps an idle
 * connection open (its head timeout), so that a pooled connection is
 * never one the owner is closing. */
#define POOL_MAX 64
#define POOL_PER_HOST 8
#define POOL_IDLE_MS 2000

/* forward_set_tls: how https:// hosts are reached; NULL: they are not. */
static SSL_CTX *hop_tls;

void forward_set_tls(void *client_ctx) {
        hop_tls = client_ctx;
}

/* ---- the pool of kept-alive connections ---- */

typedef struct Idle {
        char url[256];
        int fd;
        SSL *ssl;
        uint64_t since_ms;
} Idle;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static Idle pool[POOL_MAX];
static size_t pool_n;

static uint64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void idle_close(Idle *c) {
        SSL_free(c->ssl);
        close(c->fd);
}

/* An idle connection to url that is still quiet (the owner sent nothing
 * and did not close it), the newest first; false when there is none. */
static bool pool_take(const char *url, int *ret_fd, SSL **ret_ssl) {
        Idle stale[POOL_MAX];
        size_t n_stale = 0;
        bool found = false;
        uint64_t now = now_ms();
        pthread_mutex_lock(&pool_lock);
        for (size_t i = pool_n; i-- > 0;) {
                Idle *c = &pool[i];
                bool old = now - c->since_ms > POOL_IDLE_MS;
                if (!old && (found || strcmp(c->url, url) != 0))
                        continue;
                Idle got = *c;
                pool[i] = pool[--pool_n];
                if (old) {
                        stale[n_stale++] = got;
                        continue;
                }
                struct pollfd p = { .fd = got.fd, .events = POLLIN | POLLRDHUP };
                if (poll(&p, 1, 0) != 0 || (got.ssl && SSL_pending(got.ssl) > 0)) {
                        stale[n_stale++] = got; /* closed, or bytes nobody asked for */
                        continue;
                }
                *ret_fd = got.fd;
                *ret_ssl = got.ssl;
                found = true;
        }
        pthread_mutex_unlock(&pool_lock);
        for (size_t i = 0; i < n_stale; i++)
                idle_close(&stale[i]);
        return found;
}

/* Keeps a connection to url for the next hop to that host, or closes it. */
static void pool_put(const char *url, int fd, SSL *ssl) {
        Idle c = { .fd = fd, .ssl = ssl, .since_ms = now_ms() };
        snprintf(c.url, sizeof c.url, "%s", url);
        size_t same = 0;
        bool kept = false;
        pthread_mutex_lock(&pool_lock);
        for (size_t i = 0; i < pool_n; i++)
                same += strcmp(pool[i].url, c.url) == 0;
        if (same < POOL_PER_HOST && pool_n < POOL_MAX) {
                pool[pool_n++] = c;
                kept = true;
        }
        pthread_mutex_unlock(&pool_lock);
        if (!kept)
                idle_close(&c);
}

void forward_pool_drain(void) {
        pthread_mutex_lock(&pool_lock);
        size_t n = pool_n;
        Idle all[POOL_MAX];
        memcpy(all, pool, n * sizeof *all);
        pool_n = 0;
        pthread_mutex_unlock(&pool_lock);
        for (size_t i = 0; i < n; i++)
                idle_close(&all[i]);
}

struct Forward {
        int fd;
        SSL *ssl; /* an https:// host's */
        char url[256]; /* the host's base URL: the pool's key */
        bool pooled;   /* the connection came from the pool */
        bool chunked_out; /* the body goes on in chunks (the client's length unknown) */
        bool ws;          /* a WebSocket upgrade */
        int client_fd;    /* the client's connection: its hang-up ends the hop */
        http_parser hp;
        http_parser_settings hs;
        /* The answer's head. */
        char *names[MAX_HEADERS], *values[MAX_HEADERS];
        size_t n_headers;
        bool in_value, head_done, head_bad;
        size_t head_bytes;
        /* Bytes read from the owner and not yet parsed. */
        char raw[RAW_BUF];
        size_t raw_off, raw_len;
        /* The body being handed to the client. */
        char *out;
        size_t out_len, out_max;
        bool complete;
        uint64_t deadline_ms; /* the answer head's, monotonic; 0: none */
};

/* Whether f's connection may carry the next hop: its answer was read
 * whole, to the byte, and neither side asked to close it. */
static bool reusable(const Forward *f) {
        return f->fd >= 0 && f->complete && !f->ws && f->raw_off == f->raw_len && http_should_keep_alive(&f->hp);
}

/* Once the answer is read whole its connection goes back to the pool at
 * once, not when the client's connection lets the answer go. */
static void hop_release(Forward *f) {
        if (!reusable(f))
                return;
        pool_put(f->url, f->fd, f->ssl);
        f->fd = -1;
        f->ssl = NULL;
}

void forward_free(Forward *f) {
        if (!f)
                return;
        hop_release(f);
        SSL_free(f->ssl);
        if (f->fd >= 0)
                close(f->fd);
        for (size_t i = 0; i < MAX_HEADERS; i++) {
                free(f->names[i]);
                free(f->values[i]);
        }
        free(f);
}

bool forward_secret_ok(const char *secret, const char *value) {
        if (!secret || !*secret || !value)
                return false;
        size_t a = strlen(secret), b = strlen(value);
        /* The lengths' difference is not the secret's. */
        return a == b && CRYPTO_memcmp(secret, value, a) == 0;
}

/* ---- the owner's answer head ---- */

static Forward *of(http_parser *hp) {
        return hp->data;
}

/* Appends piece to *s (NULL: empty), within MAX_HEADER_BYTES. */
static int append(char **s, const char *at, size_t n) {
        size_t have = *s ? strlen(*s) : 0;
        if (have + n > MAX_HEADER_BYTES)
                return -1;
        char *g = realloc(*s, have + n + 1);
        if (!g)
                return -1;
        memcpy(g + have, at, n);
        g[have + n] = '\0';
        *s = g;
        return 0;
}

static int on_header_field(http_parser *hp, const char *at, size_t n) {
        Forward *f = of(hp);
        if (f->in_value) {
                f->in_value = false;
                f->n_headers++;
        }
        f->head_bytes += n;
        if (f->n_headers >= MAX_HEADERS || f->head_bytes > HEAD_MAX || append(&f->names[f->n_headers], at, n) < 0) {
                f->head_bad = true;
                return -1;
        }
        return 0;
}

static int on_header_value(http_parser *hp, const char *at, size_t n) {
        Forward *f = of(hp);
        f->in_value = true;
        f->head_bytes += n;
        if (f->n_headers >= MAX_HEADERS || f->head_bytes > HEAD_MAX || append(&f->values[f->n_headers], at, n) < 0) {
                f->head_bad = true;
                return -1;
        }
        return 0;
}

static int on_headers_complete(http_parser *hp) {
        Forward *f = of(hp);
        if (f->in_value) {
                f->in_value = false;
                f->n_headers++;
        }
        f->head_done = true;
        /* Stop here: the body is read as the client takes it. */
        http_parser_pause(hp, 1);
        return 0;
}

static int on_body(http_parser *hp, const char *at, size_t n) {
        Forward *f = of(hp);
        /* Never more than fits: the reader feeds no more raw bytes than the
         * room left, and a body is never longer than its raw bytes. */
        if (!f->out || f->out_len + n > f->out_max)
                return -1;
        memcpy(f->out + f->out_len, at, n);
        f->out_len += n;
        return 0;
}

static int on_message_complete(http_parser *hp) {
        of(hp)->complete = true;
        return 0;
}

/* ---- the connection ---- */

static int write_all(int fd, const char *p, size_t n) {
        while (n > 0) {
                ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        return w < 0 ? -errno : -EPIPE;
                p += w;
                n -= (size_t)w;
        }
        return 0;
}

/* The hop's own writes and reads: through TLS for an https:// host. */
static int hop_write(Forward *f, const char *p, size_t n) {
        if (!f->ssl)
                return write_all(f->fd, p, n);
        while (n > 0) {
                int w = SSL_write(f->ssl, p, n > INT_MAX ? INT_MAX : (int)n);
                if (w <= 0) {
                        ERR_clear_error();
                        return -EPIPE;
                }
                p += w;
                n -= (size_t)w;
        }
        return 0;
}

/* Bytes read (0 at the end), or -errno. */
static ssize_t hop_read(Forward *f, char *buf, size_t n) {
        if (!f->ssl) {
                ssize_t got;
                do
                        got = recv(f->fd, buf, n, 0);
                while (got < 0 && errno == EINTR);
                return got < 0 ? -errno : got;
        }
        int got = SSL_read(f->ssl, buf, n > INT_MAX ? INT_MAX : (int)n);
        if (got <= 0) {
                int err = SSL_get_error(f->ssl, got);
                ERR_clear_error();
                return err == SSL_ERROR_ZERO_RETURN ? 0 : -EIO;
        }
        /* A read gives one record (16 KiB at most): the records already
         * received are taken too, without waiting for more. */
        size_t total = (size_t)got;
        while (total < n && SSL_has_pending(f->ssl)) {
                size_t more = 0;
                if (SSL_read_ex(f->ssl, buf + total, n - total, &more) != 1 || more == 0) {
                        ERR_clear_error();
                        break;
                }
                total += more;
        }
        return (ssize_t)total;
}

/* Whether the hop has bytes read and not yet taken (TLS keeps a record's
 * rest): then nothing needs to be waited for. */
static bool hop_pending(const Forward *f) {
        return f->ssl && SSL_pending(f->ssl) > 0;
}

static bool client_left(int fd) {
        if (fd < 0)
                return false;
        struct pollfd p = { .fd = fd, .events = POLLRDHUP };
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Waits until fd can be read, watching the client: -ECONNRESET when the
 * client left (the hop ends, and the owner sees it end). */
static int wait_readable(Forward *f) {
        if (hop_pending(f))
                return 0;
        for (;;) {
                struct pollfd p = { .fd = f->fd, .events = POLLIN };
                int n = poll(&p, 1, POLL_MS);
                if (n > 0)
                        return 0;
                if (n < 0 && errno != EINTR)
                        return -errno;
                if (client_left(f->client_fd))
                        return -ECONNRESET;
                if (f->deadline_ms && now_ms() >= f->deadline_ms)
                        return -ETIMEDOUT;
        }
}

/* http://HOST:PORT or https://HOST:PORT (HOST a name, an IPv4 address or
 * [IPv6]); no path. *tls for https. */
static int parse_url(const char *url, char *host, size_t host_len, char *port, size_t port_len, bool *tls) {
        size_t skip = strncmp(url, "http://", 7) == 0 ? 7 : strncmp(url, "https://", 8) == 0 ? 8 : 0;
        if (!skip)
                return -EPROTONOSUPPORT;
        *tls = skip == 8;
        const char *h = url + skip, *end = h + strcspn(h, "/");
        const char *colon;
        if (*h == '[') {
                const char *close = memchr(h, ']', (size_t)(end - h));
                if (!close)
                        return -EINVAL;
                if ((size_t)(close - h - 1) >= host_len)
                        return -ENAMETOOLONG;
                memcpy(host, h + 1, (size_t)(close - h - 1));
                host[close - h - 1] = '\0';
                colon = close + 1 < end && close[1] == ':' ? close + 1 : NULL;
        } else {
                colon = memrchr(h, ':', (size_t)(end - h));
                size_t n = (size_t)((colon ? colon : end) - h);
                if (n == 0 || n >= host_len)
                        return -EINVAL;
                memcpy(host, h, n);
                host[n] = '\0';
        }
        size_t pn = colon ? (size_t)(end - colon - 1) : 2;
        if (pn == 0 || pn >= port_len)
                return -EINVAL;
        if (colon) {
                memcpy(port, colon + 1, pn);
                port[pn] = '\0';
        } else
                snprintf(port, port_len, "%s", *tls ? "443" : "80");
        return 0;
}

static int connect_to(const char *host, const char *port) {
        int r;
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
        if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
                return -EHOSTUNREACH;
        int fd = -1;
        r = -EHOSTUNREACH;
        for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
                fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                if (fd < 0)
                        continue;
                if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 && errno != EINPROGRESS) {
                        r = -errno;
                        close(fd);
                        fd = -1;
                        continue;
                }
                struct pollfd p = { .fd = fd, .events = POLLOUT };
                int err = 0;
                socklen_t len = sizeof(err);
                if (poll(&p, 1, FORWARD_CONNECT_TIMEOUT_MS) != 1 ||
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
                        r = err ? -err : -ETIMEDOUT;
                        close(fd);
                        fd = -1;
                }
        }
        freeaddrinfo(ai);
        if (fd < 0)
                return r;
        int flags = fcntl(fd, F_GETFL);
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct timeval tv = { .tv_sec = SEND_TIMEOUT_S };
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        return fd;
}

/* TLS over f->fd to host: its certificate must chain to the fleet's CA and
 * name host (an address as an IP address, a name as a DNS name). The
 * handshake has FORWARD_CONNECT_TIMEOUT_MS. On failure *why says why. */
static int tls_start(Forward *f, const char *host, char *why, size_t why_len) {
        if (!hop_tls) {
                snprintf(why, why_len, "it is reached over TLS and this host has no --fleet-tls-dir");
                return -EPROTONOSUPPORT;
        }
        if (!(f->ssl = SSL_new(hop_tls)) || SSL_set_fd(f->ssl, f->fd) != 1)
                return -ENOMEM;
        unsigned char addr[16];
        bool is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
        X509_VERIFY_PARAM *vp = SSL_get0_param(f->ssl);
        if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, host) != 1
                  : SSL_set1_host(f->ssl, host) != 1 || SSL_set_tlsext_host_name(f->ssl, host) != 1)
                return -EINVAL;
        struct timeval tv = { .tv_sec = FORWARD_CONNECT_TIMEOUT_MS / 1000,
                              .tv_usec = (FORWARD_CONNECT_TIMEOUT_MS % 1000) * 1000 };
        (void)setsockopt(f->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        int r = SSL_connect(f->ssl);
        tv = (struct timeval){ 0 };
        (void)setsockopt(f->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        if (r == 1)
                return 0;
        long v = SSL_get_verify_result(f->ssl);
        unsigned long e = ERR_get_error();
        ERR_clear_error();
        if (v != X509_V_OK)
                snprintf(why, why_len, "its certificate is refused: %s", X509_verify_cert_error_string(v));
        else
                snprintf(why, why_len, "the TLS handshake failed: %s",
                         e ? ERR_reason_error_string(e) ?: "unknown" : "the connection ended");
        return -ECONNREFUSED;
}

/* ---- the request head ---- */

typedef struct Head {
        FILE *f;
        bool ws;
} Head;

/* Headers of the hop, and the framing this end decides, are not copied. */
static bool hop_header(const char *name, bool ws) {
        static const char *const hop[] = { "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization",
                                           "Transfer-Encoding", "TE", "Trailer", "Host", "Content-Length",
                                           "Expect", FORWARD_SECRET_HEADER, FORWARD_BY_HEADER,
                                           FORWARD_CLAIM_HEADER };
        for (size_t i = 0; i < ELEMENTSOF(hop); i++)
                if (strcasecmp(name, hop[i]) == 0)
                        return true;
        return strcasecmp(name, "Upgrade") == 0 && !ws;
}

static enum MHD_Result copy_header(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                   const char *value, size_t value_size) {
        Head *h = cls;
        if (!key || hop_header(key, h->ws))
                return MHD_YES;
        fprintf(h->f, "%.*s: %.*s\r\n", (int)key_size, key, (int)value_size, value ? value : "");
        return MHD_YES;
}

static void put_encoded(FILE *f, const char *s, size_t n) {
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)s[i];
                if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.' || c == '~')
                        fputc(c, f);
                else
                        fprintf(f, "%%%02X", c);
        }
}

typedef struct Query {
        FILE *f;
        bool first;
} Query;

static enum MHD_Result copy_arg(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                const char *value, size_t value_size) {
        Query *q = cls;
        fputc(q->first ? '?' : '&', q->f);
        q->first = false;
        put_encoded(q->f, key, key_size);
        if (value) {
                fputc('=', q->f);
                put_encoded(q->f, value, value_size);
        }
        return MHD_YES;
}

/* A connection to the host for f: a pooled one (f->pooled) or a new one,
 * through TLS for https://. On failure *e says why. */
static int hop_connect(Forward *f, const ForwardRequest *q, const char *host_name, const char *port, bool tls,
                       bool pooled_ok, ApiError *e) {
        int fd;
        SSL *ssl;
        if (pooled_ok && pool_take(f->url, &fd, &ssl)) {
                f->fd = fd;
                f->ssl = ssl;
                f->pooled = true;
                return 0;
        }
        f->pooled = false;
        f->fd = connect_to(host_name, port);
        if (f->fd < 0) {
                int rc = f->fd;
                f->fd = -1;
                log_warn(q->rid, "forwarding to %s: %s", f->url, strerror(-rc));
                return api_error(e, 503, "host_unavailable", "try again; the host may be restarting",
                                 "the host that runs sandbox %s does not answer", q->sandbox_id);
        }
        char why[256] = "";
        int rc = tls ? tls_start(f, host_name, why, sizeof why) : 0;
        if (rc < 0) {
                log_warn(q->rid, "forwarding to %s: %s", f->url, why[0] ? why : strerror(-rc));
                return api_error(e, 503, "host_unavailable", "see docs/fleet.md, \"TLS between hosts\"",
                                 "the host that runs sandbox %s cannot be reached safely: %s", q->sandbox_id,
                                 why[0] ? why : strerror(-rc));
        }
        return 0;
}

/* Drops f's connection (a pooled one the owner closed meanwhile). */
static void hop_drop(Forward *f) {
        SSL_free(f->ssl);
        f->ssl = NULL;
        if (f->fd >= 0)
                close(f->fd);
        f->fd = -1;
}

int forward_open(const ForwardRequest *q, const char *base_url, const char *secret, const char *by, Forward **ret,
                 ApiError *e) {
        Forward *f = calloc(1, sizeof(*f));
        if (!f)
                return api_error(e, 500, "internal", NULL, "out of memory");
        f->fd = -1;
        char host_name[256], port[8];
        bool tls = false;
        if (parse_url(base_url, host_name, sizeof host_name, port, sizeof port, &tls) < 0 ||
            strlen(base_url) >= sizeof f->url) {
                forward_free(f);
                log_warn(q->rid, "forwarding to %.300s: not an http:// or https:// URL", base_url);
                return api_error(e, 503, "host_unavailable", "see docs/fleet.md",
                                 "the host that runs sandbox %s has an address this host cannot use", q->sandbox_id);
        }
        snprintf(f->url, sizeof f->url, "%s", base_url);
        f->client_fd = q->client_fd;
        const char *upgrade = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Upgrade");
        f->ws = upgrade && strcasecmp(upgrade, "websocket") == 0;
        char *text = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&text, &len);
        if (!out) {
                forward_free(f);
                return api_error(e, 500, "internal", NULL, "out of memory");
        }
        fprintf(out, "%s %s", q->method, q->url);
        Query qs = { .f = out, .first = true };
        MHD_get_connection_values_n(q->conn, MHD_GET_ARGUMENT_KIND, copy_arg, &qs);
        char host[300];
        snprintf(host, sizeof host, "%s", base_url + (tls ? 8 : 7));
        host[strcspn(host, "/")] = '\0';
        fprintf(out, " HTTP/1.1\r\nHost: %s\r\n", host);
        Head h = { .f = out, .ws = f->ws };
        MHD_get_connection_values_n(q->conn, MHD_HEADER_KIND, copy_header, &h);
        fprintf(out, "%s: %s\r\n%s: %s\r\n", FORWARD_SECRET_HEADER, secret, FORWARD_BY_HEADER, by);
        if (q->claimed)
                fprintf(out, "%s: 1\r\n", FORWARD_CLAIM_HEADER);
        const char *cl = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Content-Length");
        const char *te = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Transfer-Encoding");
        if (q->body_len >= 0)
                fprintf(out, "Content-Length: %lld\r\n", q->body_len);
        else if (cl)
                fprintf(out, "Content-Length: %s\r\n", cl);
        else if (te) {
                fputs("Transfer-Encoding: chunked\r\n", out);
                f->chunked_out = true;
        }
        /* A WebSocket's connection is spliced and then closed; any other
         * stays open for the next hop to this host. */
        fputs(f->ws ? "Connection: Upgrade\r\n\r\n" : "Connection: keep-alive\r\n\r\n", out);
        if (fclose(out) != 0) {
                free(text);
                forward_free(f);
                return api_error(e, 500, "internal", NULL, "out of memory");
        }
        /* A pooled connection the owner closed a moment ago fails as the
         * head is written, before the owner could act on any of it: the
         * head goes again on a new connection. */
        int rc = hop_connect(f, q, host_name, port, tls, !f->ws, e);
        if (rc == 0 && (rc = hop_write(f, text, len)) < 0 && f->pooled) {
                hop_drop(f);
                rc = hop_connect(f, q, host_name, port, tls, false, e);
                if (rc == 0)
                        rc = hop_write(f, text, len);
        }
        free(text);
        if (rc < 0) {
                forward_free(f);
                if (!e->status)
                        api_error(e, 503, "host_unavailable", "try again", "the host that runs sandbox %s hung up",
                                  q->sandbox_id);
                return -1;
        }
        http_parser_init(&f->hp, HTTP_RESPONSE);
        f->hp.data = f;
        http_parser_settings_init(&f->hs);
        f->hs.on_header_field = on_header_field;
        f->hs.on_header_value = on_header_value;
        f->hs.on_headers_complete = on_headers_complete;
        f->hs.on_body = on_body;
        f->hs.on_message_complete = on_message_complete;
        *ret = f;
        return 0;
}

int forward_body(Forward *f, const char *data, size_t n) {
        if (!f->chunked_out)
                return hop_write(f, data, n);
        char size[24];
        int m = snprintf(size, sizeof size, "%zx\r\n", n);
        int r = hop_write(f, size, (size_t)m);
        if (r == 0)
                r = hop_write(f, data, n);
        return r == 0 ? hop_write(f, "\r\n", 2) : r;
}

/* ---- the answer ---- */

/* Parses what is read, up to room bytes of it. */
static int parse_some(Forward *f, size_t room) {
        size_t take = f->raw_len - f->raw_off;
        if (take > room)
                take = room;
        size_t n = http_parser_execute(&f->hp, &f->hs, f->raw + f->raw_off, take);
        f->raw_off += n;
        enum http_errno err = HTTP_PARSER_ERRNO(&f->hp);
        if (err == HPE_PAUSED)
                return 0;
        return err == HPE_OK ? 0 : -EBADMSG;
}

static int read_more(Forward *f, size_t max) {
        int r = wait_readable(f);
        if (r < 0)
                return r;
        if (max > sizeof f->raw)
                max = sizeof f->raw;
        ssize_t n = hop_read(f, f->raw, max);
        if (n < 0)
                return (int)n;
        f->raw_off = 0;
        f->raw_len = (size_t)n;
        return (int)(n > 0);
}

/* Reads and parses until the answer's head is whole: 0, or -EBADMSG for a
 * head the parser refuses, -EPIPE for a hop closed before its end. */
static int read_head(Forward *f) {
        int rc = 0;
        while (rc >= 0 && !f->head_done) {
                if (f->raw_off < f->raw_len) {
                        if (parse_some(f, f->raw_len - f->raw_off) < 0 || f->head_bad)
                                rc = -EBADMSG;
                        continue;
                }
                rc = read_more(f, sizeof f->raw);
                if (rc == 0)
                        rc = -EPIPE;
        }
        return rc < 0 ? rc : 0;
}

static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max) {
        Forward *f = cls;
        f->out = buf;
        f->out_len = 0;
        f->out_max = max;
        for (;;) {
                if (f->complete) {
                        hop_release(f);
                        return f->out_len ? (ssize_t)f->out_len : MHD_CONTENT_READER_END_OF_STREAM;
                }
                if (f->raw_off < f->raw_len) {
                        if (parse_some(f, max - f->out_len) < 0)
                                return MHD_CONTENT_READER_END_WITH_ERROR;
                        /* The last bytes may fill the buffer: with a known
                         * length, no call comes after them. */
                        if (f->complete)
                                hop_release(f);
                        if (f->out_len == max)
                                return (ssize_t)f->out_len;
                        continue;
                }
                if (f->out_len > 0)
                        return (ssize_t)f->out_len;
                int r = read_more(f, max);
                if (r < 0)
                        return MHD_CONTENT_READER_END_WITH_ERROR;
                if (r == 0) {
                        /* The owner closed: whole only if its framing says so. */
                        (void)http_parser_execute(&f->hp, &f->hs, NULL, 0);
                        return f->complete ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
                }
        }
}

static void free_body(void *cls) {
        forward_free(cls);
}

/* Headers of the answer that go back to the client: not the hop's, not
 * the framing (MHD's), not those reply_response sets. */
static bool relayed(const char *name) {
        static const char *const dropped[] = { "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length",
                                               "Upgrade", "Date", "Cache-Control", "X-Request-Id", "Trailer" };
        for (size_t i = 0; i < ELEMENTSOF(dropped); i++)
                if (strcasecmp(name, dropped[i]) == 0)
                        return false;
        return true;
}

static const char *answer_header(const Forward *f, const char *name) {
        for (size_t i = 0; i < f->n_headers; i++)
                if (f->names[i] && strcasecmp(f->names[i], name) == 0)
                        return f->values[i];
        return NULL;
}

static void add_headers(const Forward *f, struct MHD_Response *resp) {
        for (size_t i = 0; i < f->n_headers; i++)
                if (f->names[i] && f->values[i] && relayed(f->names[i]))
                        MHD_add_response_header(resp, f->names[i], f->values[i]);
        const char *rid = answer_header(f, "X-Request-Id");
        if (rid)
                MHD_add_response_header(resp, "X-Forwarded-Request-Id", rid);
}

/* ---- a WebSocket, spliced ---- */

typedef struct Splice {
        Forward *f;
        int sock;
        struct MHD_UpgradeResponseHandle *urh;
        char *extra;
        size_t extra_len;
} Splice;

static void *splice_main(void *arg) {
        Splice *s = arg;
        Forward *f = s->f;
        /* What came after each side's head goes first. */
        bool ok = write_all(s->sock, f->raw + f->raw_off, f->raw_len - f->raw_off) == 0 &&
                  hop_write(f, s->extra, s->extra_len) == 0;
        char buf[16384];
        while (ok) {
                struct pollfd p[2] = { { .fd = s->sock, .events = POLLIN }, { .fd = f->fd, .events = POLLIN } };
                /* Bytes TLS holds already are the owner's to relay now. */
                if (hop_pending(f))
                        p[1].revents = POLLIN;
                else if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                if (ok && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
                        ssize_t n;
                        do
                                n = recv(s->sock, buf, sizeof buf, 0);
                        while (n < 0 && errno == EINTR);
                        ok = n > 0 && hop_write(f, buf, (size_t)n) == 0;
                }
                if (ok && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
                        ssize_t n = hop_read(f, buf, sizeof buf);
                        ok = n > 0 && write_all(s->sock, buf, (size_t)n) == 0;
                }
        }
        MHD_upgrade_action(s->urh, MHD_UPGRADE_ACTION_CLOSE);
        forward_free(f);
        free(s->extra);
        free(s);
        return NULL;
}

static void upgraded(void *cls, struct MHD_Connection *connection, void *req_cls, const char *extra_in,
                     size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh) {
        Splice *s = calloc(1, sizeof(*s));
        Forward *f = cls;
        pthread_t th;
        pthread_attr_t attr;
        bool started = false;
        if (s) {
                s->f = f;
                s->sock = sock;
                s->urh = urh;
                if (extra_in_size && (s->extra = malloc(extra_in_size))) {
                        memcpy(s->extra, extra_in, extra_in_size);
                        s->extra_len = extra_in_size;
                }
                if (pthread_attr_init(&attr) == 0) {
                        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
                        started = pthread_create(&th, &attr, splice_main, s) == 0;
                        pthread_attr_destroy(&attr);
                }
        }
        if (started)
                return;
        MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        forward_free(f);
        if (s)
                free(s->extra);
        free(s);
}

int forward_answer(Forward *f, unsigned *ret_status, struct MHD_Response **ret, ApiError *e) {
        int rc = f->chunked_out ? hop_write(f, "0\r\n\r\n", 5) : 0;
        if (rc >= 0)
                rc = read_head(f);
        if (rc < 0) {
                bool left = rc == -ECONNRESET;
                forward_free(f);
                if (left)
                        return -ECONNRESET; /* the client left: nobody to answer */
                log_warn(NULL, "a forwarded request's answer: %s", strerror(-rc));
                return api_error(e, 502, "host_unavailable", "try again", "the host that runs the sandbox gave no answer");
        }
        unsigned status = f->hp.status_code;
        http_parser_pause(&f->hp, 0);
        struct MHD_Response *resp;
        if (f->ws && status == 101) {
                /* A pause in on_headers_complete leaves the head's last
                 * byte unparsed; parsing on, an upgrade stops where the
                 * new protocol's bytes begin. */
                f->raw_off += http_parser_execute(&f->hp, &f->hs, f->raw + f->raw_off, f->raw_len - f->raw_off);
                const char *accept = answer_header(f, "Sec-WebSocket-Accept");
                const char *proto = answer_header(f, "Sec-WebSocket-Protocol");
                if (!(resp = MHD_create_response_for_upgrade(upgraded, f))) {
                        forward_free(f);
                        return api_error(e, 500, "internal", NULL, "out of memory");
                }
                MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, "websocket");
                if (accept)
                        MHD_add_response_header(resp, "Sec-WebSocket-Accept", accept);
                if (proto)
                        MHD_add_response_header(resp, "Sec-WebSocket-Protocol", proto);
                *ret_status = 101;
                *ret = resp;
                return 0;
        }
        if (status < 200 || status > 599) {
                forward_free(f);
                return api_error(e, 502, "host_unavailable", "try again", "the host that runs the sandbox answered %u",
                                 status);
        }
        /* A known length is kept; otherwise MHD chunks the answer. An
         * answer that has no body by its status has none here either. */
        uint64_t size = status == 204 || status == 304                                     ? 0
                        : (f->hp.flags & F_CHUNKED) || f->hp.content_length == ULLONG_MAX ? MHD_SIZE_UNKNOWN
                                                                                          : f->hp.content_length;
        if (!(resp = MHD_create_response_from_callback(size, 32 * 1024, read_body, f, free_body))) {
                forward_free(f);
                return api_error(e, 500, "internal", NULL, "out of memory");
        }
        add_headers(f, resp);
        *ret_status = status;
        *ret = resp;
        return 0;
}

/* ---- a tunnel: another protocol over a connection of its own ---- */

int forward_tunnel_open(const ForwardTunnel *t, Forward **ret, ApiError *e) {
        Forward *f = calloc(1, sizeof(*f));
        if (!f)
                return api_error(e, 500, "internal", NULL, "out of memory");
        f->fd = -1;
        f->client_fd = t->client_fd;
        f->ws = true; /* its connection is its own, never pooled */
        char host_name[256], port[8];
        bool tls = false;
        if (parse_url(t->base_url, host_name, sizeof host_name, port, sizeof port, &tls) < 0 ||
            strlen(t->base_url) >= sizeof f->url) {
                forward_free(f);
                return api_error(e, 503, "host_unavailable", "see docs/fleet.md",
                                 "the host that runs sandbox %s has an address this host cannot use", t->sandbox_id);
        }
        snprintf(f->url, sizeof f->url, "%s", t->base_url);
        char host[300];
        snprintf(host, sizeof host, "%s", t->base_url + (tls ? 8 : 7));
        host[strcspn(host, "/")] = '\0';
        char *text = NULL;
        int len = asprintf(&text,
                           "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %s\r\n%s: %s\r\n\r\n",
                           t->path, host, t->protocol, FORWARD_SECRET_HEADER, t->secret, FORWARD_BY_HEADER, t->by);
        if (len < 0) {
                forward_free(f);
                return api_error(e, 500, "internal", NULL, "out of memory");
        }
        ForwardRequest q = { .rid = t->rid, .sandbox_id = t->sandbox_id };
        int rc = hop_connect(f, &q, host_name, port, tls, false, e);
        if (rc == 0 && hop_write(f, text, (size_t)len) < 0)
                rc = api_error(e, 503, "host_unavailable", "try again", "the host that runs sandbox %s hung up",
                               t->sandbox_id);
        free(text);
        if (rc < 0) {
                forward_free(f);
                return -1;
        }
        /* A host that died without closing its connections is noticed
         * within a minute, not when the client gives up. */
        int one = 1, idle = 20, intvl = 10, cnt = 3;
        unsigned user_timeout = 30000;
        (void)setsockopt(f->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        (void)setsockopt(f->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        (void)setsockopt(f->fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
        (void)setsockopt(f->fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
        (void)setsockopt(f->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
        http_parser_init(&f->hp, HTTP_RESPONSE);
        f->hp.data = f;
        http_parser_settings_init(&f->hs);
        f->hs.on_header_field = on_header_field;
        f->hs.on_header_value = on_header_value;
        f->hs.on_headers_complete = on_headers_complete;
        f->deadline_ms = now_ms() + FORWARD_TUNNEL_ANSWER_MS;
        if (rc >= 0)
                rc = read_head(f);
        f->deadline_ms = 0;
        if (rc < 0) {
                forward_free(f);
                if (rc == -ECONNRESET)
                        return -ECONNRESET;
                log_warn(t->rid, "a tunnel to %s: %s", t->base_url, strerror(-rc));
                return api_error(e, 502, "host_unavailable", "try again",
                                 rc == -ETIMEDOUT ? "the host that runs sandbox %s did not answer in time"
                                                  : "the host that runs sandbox %s gave no answer",
                                 t->sandbox_id);
        }
        unsigned status = f->hp.status_code;
        if (status != 101) {
                forward_free(f);
                log_warn(t->rid, "a tunnel to %s: refused with %u", t->base_url, status);
                return api_error(e, 502, "host_unavailable", "see the logs of both hosts",
                                 "the host that runs sandbox %s refused the relay (%u)", t->sandbox_id, status);
        }
        /* What follows the head is the new protocol's: parsed no more. */
        http_parser_pause(&f->hp, 0);
        f->raw_off += http_parser_execute(&f->hp, &f->hs, f->raw + f->raw_off, f->raw_len - f->raw_off);
        *ret = f;
        return 0;
}

int forward_fd(const Forward *f) {
        return f->fd;
}

bool forward_pending(const Forward *f) {
        return f->raw_off < f->raw_len || hop_pending(f);
}

ssize_t forward_read(Forward *f, char *buf, size_t n) {
        if (f->raw_off < f->raw_len) {
                size_t k = f->raw_len - f->raw_off < n ? f->raw_len - f->raw_off : n;
                memcpy(buf, f->raw + f->raw_off, k);
                f->raw_off += k;
                return (ssize_t)k;
        }
        return hop_read(f, buf, n);
}

int forward_write(Forward *f, const char *p, size_t n) {
        return hop_write(f, p, n);
}

void forward_shutdown_write(Forward *f) {
        if (f->ssl) {
                (void)SSL_shutdown(f->ssl);
                ERR_clear_error();
        }
        (void)shutdown(f->fd, SHUT_WR);
}
