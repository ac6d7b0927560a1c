#include "egress/intercept.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/timeutil.h"
#include "egress/addr.h"
#include "egress/httphead.h"

/*
 * Two OpenSSL sessions, each used from two threads (one per direction), so
 * each has its own lock: OpenSSL does not allow concurrent calls on one SSL.
 * The sandbox side runs over memory BIOs (its bytes come from the agent
 * channel), the upstream side over a non-blocking socket, so no thread ever
 * blocks inside OpenSSL while holding a lock.
 */
typedef struct Tls {
        const EgressIo *io;
        const EgressProxyConfig *cfg;
        EgressRecord *rec;
        const char *host;
        uint16_t port;
        SSL *client;
        BIO *crbio, *cwbio;
        pthread_mutex_t client_lock;
        SSL *up;
        int upfd;
        pthread_mutex_t up_lock;
        atomic_bool stop;
        atomic_uint_fast64_t last_activity;
        uint64_t bytes_out;
        unsigned secrets_used;
        char refused[192]; /* a request a secret's rules refused: "" if none */
} Tls;

/* With client_lock held: TLS records OpenSSL produced go to the sandbox. */
static int client_flush(Tls *t) {
        uint8_t buf[16384];
        int n;
        while ((n = BIO_read(t->cwbio, buf, sizeof(buf))) > 0)
                if (t->io->write(t->io->ctx, buf, (size_t)n) < 0)
                        return -EPIPE;
        return 0;
}

static int client_feed(Tls *t) {
        uint8_t buf[16384];
        ssize_t n = t->io->read(t->io->ctx, buf, sizeof(buf));
        if (n == -EAGAIN || n == -EINTR)
                return -EAGAIN;
        if (n <= 0)
                return -EPIPE;
        pthread_mutex_lock(&t->client_lock);
        BIO_write(t->crbio, buf, (int)n);
        pthread_mutex_unlock(&t->client_lock);
        return 0;
}

static int client_handshake(Tls *t) {
        uint64_t deadline = time_now_mono_ms() + 30000;
        for (;;) {
                pthread_mutex_lock(&t->client_lock);
                int r = SSL_do_handshake(t->client);
                int err = SSL_get_error(t->client, r);
                int fr = client_flush(t);
                pthread_mutex_unlock(&t->client_lock);
                if (r == 1)
                        return fr;
                if (err != SSL_ERROR_WANT_READ || fr < 0)
                        return -EPROTO;
                int f;
                while ((f = client_feed(t)) == -EAGAIN)
                        if (time_now_mono_ms() > deadline)
                                return -ETIMEDOUT;
                if (f < 0)
                        return f;
        }
}

/* Plaintext from the sandbox: > 0, 0 at its end. */
static ssize_t client_read(Tls *t, uint8_t *buf, size_t len) {
        for (;;) {
                pthread_mutex_lock(&t->client_lock);
                int n = SSL_read(t->client, buf, (int)len);
                int err = SSL_get_error(t->client, n);
                client_flush(t);
                pthread_mutex_unlock(&t->client_lock);
                if (n > 0)
                        return n;
                if (err != SSL_ERROR_WANT_READ)
                        return 0;
                int f;
                while ((f = client_feed(t)) == -EAGAIN)
                        if (atomic_load(&t->stop))
                                return 0;
                if (f < 0)
                        return 0;
        }
}

static int client_write(Tls *t, const void *buf, size_t len) {
        pthread_mutex_lock(&t->client_lock);
        int n = len ? SSL_write(t->client, buf, (int)len) : 1;
        int r = n > 0 ? client_flush(t) : -EPIPE;
        pthread_mutex_unlock(&t->client_lock);
        return r;
}

static int wait_fd(int fd, short events, int timeout_ms) {
        struct pollfd p = { .fd = fd, .events = events };
        int r;
        do
                r = poll(&p, 1, timeout_ms);
        while (r < 0 && errno == EINTR);
        return r;
}

static int up_write(Tls *t, const void *buf, size_t len) {
        size_t off = 0;
        while (off < len) {
                pthread_mutex_lock(&t->up_lock);
                int n = SSL_write(t->up, (const uint8_t *)buf + off, (int)(len - off));
                int err = SSL_get_error(t->up, n);
                pthread_mutex_unlock(&t->up_lock);
                if (n > 0) {
                        off += (size_t)n;
                        continue;
                }
                if (err == SSL_ERROR_WANT_WRITE)
                        wait_fd(t->upfd, POLLOUT, 1000);
                else if (err == SSL_ERROR_WANT_READ)
                        wait_fd(t->upfd, POLLIN, 50);
                else
                        return -EPIPE;
                if (atomic_load(&t->stop))
                        return -EPIPE;
        }
        t->bytes_out += len;
        atomic_store(&t->last_activity, time_now_mono_ms());
        return 0;
}

static void answer_error(Tls *t, int status, const char *title, const char *msg) {
        char buf[1024];
        int bl = (int)strlen(msg) + 17;
        int n = snprintf(buf, sizeof(buf),
                         "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                         "Connection: close\r\nX-Runtime-Egress: refused\r\n\r\nruntime egress: %s\n",
                         status, title, bl, msg);
        if (n > 0 && (size_t)n < sizeof(buf))
                client_write(t, buf, (size_t)n);
}

/* Requests from the sandbox, one after another on the kept-alive tunnel,
 * each with its placeholders replaced in the head. */
static void *pump_requests(void *arg) {
        Tls *t = arg;
        uint8_t *buf = malloc(64 * 1024);
        EgressParser *parser = egress_parser_new_tunnel(t->host, t->port);
        bool in_body = false;
        if (!buf || !parser)
                goto out;
        for (;;) {
                ssize_t have = client_read(t, buf, 64 * 1024);
                if (have <= 0)
                        break;
                size_t off = 0;
                while (off < (size_t)have) {
                        size_t used = 0;
                        char err[160];
                        int r = egress_parser_feed(parser, buf + off, (size_t)have - off, &used, err, sizeof(err));
                        if (r < 0) {
                                answer_error(t, r == -E2BIG ? 431 : 400, "Bad Request", err);
                                goto out;
                        }
                        if (!in_body) {
                                off += used;
                                if (r != EGRESS_PARSE_HEAD)
                                        continue;
                                const EgressHead *h = egress_parser_head(parser);
                                char *fwd = NULL;
                                size_t fwd_len = 0;
                                char why[160] = "";
                                int n = egress_secret_prepare_head(h->forward, h->forward_len, t->cfg->secrets,
                                                                   t->cfg->n_secrets, t->host, t->port, &fwd,
                                                                   &fwd_len, why, sizeof(why));
                                if (n == -EACCES) {
                                        snprintf(t->refused, sizeof(t->refused), "%s", why);
                                        /* The tunnel's entry says so before the
                                         * sandbox hears it. Only fields no other
                                         * thread writes are read here. */
                                        EgressRecord d = { .port = t->port, .connect = true, .intercepted = true };
                                        snprintf(d.host, sizeof(d.host), "%s", t->rec->host);
                                        snprintf(d.addr, sizeof(d.addr), "%s", t->rec->addr);
                                        snprintf(d.rule, sizeof(d.rule), "%s", t->rec->rule);
                                        snprintf(d.reason, sizeof(d.reason), "%s", why);
                                        if (t->cfg->decided)
                                                t->cfg->decided(t->cfg->decided_ctx, &d);
                                        answer_error(t, 403, "Forbidden", why);
                                        goto out;
                                }
                                if (n < 0) {
                                        answer_error(t, 431, "Request Header Fields Too Large", "request head too large");
                                        goto out;
                                }
                                t->secrets_used += (unsigned)n;
                                int w = up_write(t, fwd, fwd_len);
                                free(fwd);
                                if (w < 0)
                                        goto out;
                                in_body = true;
                                continue;
                        }
                        if (used > 0 && up_write(t, buf + off, used) < 0)
                                goto out;
                        off += used;
                        if (r == EGRESS_PARSE_DONE) {
                                egress_parser_free(parser);
                                parser = egress_parser_new_tunnel(t->host, t->port);
                                in_body = false;
                                if (!parser)
                                        goto out;
                        } else if (used == 0)
                                break;
                }
        }
out:
        egress_parser_free(parser);
        free(buf);
        pthread_mutex_lock(&t->up_lock);
        SSL_shutdown(t->up);
        pthread_mutex_unlock(&t->up_lock);
        shutdown(t->upfd, SHUT_WR);
        return NULL;
}

static int upstream_handshake(Tls *t, char *why, size_t why_len) {
        uint64_t deadline = time_now_mono_ms() + 15000;
        for (;;) {
                int r = SSL_connect(t->up);
                if (r == 1)
                        return 0;
                int err = SSL_get_error(t->up, r);
                if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
                        if (time_now_mono_ms() > deadline) {
                                snprintf(why, why_len, "the TLS handshake with %s timed out", t->host);
                                return -ETIMEDOUT;
                        }
                        wait_fd(t->upfd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, 1000);
                        continue;
                }
                long v = SSL_get_verify_result(t->up);
                if (v != X509_V_OK)
                        snprintf(why, why_len, "the certificate of %s failed verification: %s", t->host,
                                 X509_verify_cert_error_string(v));
                else
                        snprintf(why, why_len, "the TLS handshake with %s failed", t->host);
                return -EPROTO;
        }
}

int egress_intercept(const EgressIo *io, int upstream, const char *host, uint16_t port,
                     const EgressProxyConfig *cfg, const uint8_t *early, size_t early_len, EgressRecord *rec) {
        if (!cfg->ca || !cfg->upstream_ctx)
                return -EINVAL;
        Tls t = { .io = io, .cfg = cfg, .rec = rec, .host = host, .port = port, .upfd = upstream };
        pthread_mutex_init(&t.client_lock, NULL);
        pthread_mutex_init(&t.up_lock, NULL);
        atomic_store(&t.last_activity, time_now_mono_ms());
        int ret = -EPROTO;
        SSL_CTX *sctx = NULL;
        if (egress_ca_server_ctx(cfg->ca, host, &sctx) < 0)
                goto out;
        t.client = SSL_new(sctx);
        t.crbio = BIO_new(BIO_s_mem());
        t.cwbio = BIO_new(BIO_s_mem());
        if (!t.client || !t.crbio || !t.cwbio) {
                BIO_free(t.crbio);
                BIO_free(t.cwbio);
                goto out;
        }
        SSL_set_bio(t.client, t.crbio, t.cwbio);
        SSL_set_accept_state(t.client);
        if (early_len > 0)
                BIO_write(t.crbio, early, (int)early_len);
        if (client_handshake(&t) < 0) {
                snprintf(rec->reason, sizeof(rec->reason),
                         "the sandbox did not complete TLS with the egress CA (does it trust it?)");
                snprintf(rec->end, sizeof(rec->end), "the sandbox did not complete TLS");
                goto out;
        }

        char why[256];
        fcntl(upstream, F_SETFL, fcntl(upstream, F_GETFL) | O_NONBLOCK);
        t.up = SSL_new(cfg->upstream_ctx);
        if (!t.up)
                goto out;
        SSL_set_mode(t.up, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        SSL_set_fd(t.up, upstream);
        struct sockaddr_storage ss;
        if (egress_parse_ip_literal(host, &ss) == 1) {
                char text[64];
                egress_addr_format((struct sockaddr *)&ss, text, sizeof(text));
                X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t.up), text);
        } else {
                SSL_set_tlsext_host_name(t.up, host);
                SSL_set1_host(t.up, host);
        }
        SSL_set_verify(t.up, SSL_VERIFY_PEER, NULL);
        if (upstream_handshake(&t, why, sizeof(why)) < 0) {
                /* Fail closed, and say why in words the sandbox's client shows. */
                rec->allowed = false;
                snprintf(rec->reason, sizeof(rec->reason), "%.190s", why);
                snprintf(rec->end, sizeof(rec->end), "refused");
                if (cfg->decided)
                        cfg->decided(cfg->decided_ctx, rec);
                answer_error(&t, 502, "Bad Gateway", why);
                ret = 0;
                goto out;
        }
        rec->intercepted = true;

        pthread_t thread;
        if (pthread_create(&thread, NULL, pump_requests, &t) != 0)
                goto out;
        int idle_timeout = cfg->idle_timeout_ms > 0 ? cfg->idle_timeout_ms : 300000;
        uint8_t buf[16384];
        const char *end = "the upstream closed the connection";
        for (;;) {
                pthread_mutex_lock(&t.up_lock);
                int n = SSL_read(t.up, buf, sizeof(buf));
                int err = SSL_get_error(t.up, n);
                pthread_mutex_unlock(&t.up_lock);
                if (n > 0) {
                        rec->bytes_in += (uint64_t)n;
                        atomic_store(&t.last_activity, time_now_mono_ms());
                        if (client_write(&t, buf, (size_t)n) < 0) {
                                end = "the sandbox closed the connection";
                                break;
                        }
                        continue;
                }
                if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
                        int w = wait_fd(upstream, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, 1000);
                        if (w == 0 && time_now_mono_ms() - atomic_load(&t.last_activity) > (uint64_t)idle_timeout) {
                                end = "idle timeout";
                                break;
                        }
                        continue;
                }
                break;
        }
        snprintf(rec->end, sizeof(rec->end), "%s", end);
        pthread_mutex_lock(&t.client_lock);
        SSL_shutdown(t.client);
        client_flush(&t);
        pthread_mutex_unlock(&t.client_lock);
        io->close_write(io->ctx);
        atomic_store(&t.stop, true);
        shutdown(upstream, SHUT_RDWR);
        pthread_join(thread, NULL);
        rec->bytes_out = t.bytes_out;
        rec->secrets_used = t.secrets_used;
        if (t.refused[0]) {
                rec->allowed = false;
                snprintf(rec->reason, sizeof(rec->reason), "%s", t.refused);
                snprintf(rec->end, sizeof(rec->end), "refused");
        }
        ret = 0;
out:
        SSL_free(t.up);
        SSL_free(t.client);
        SSL_CTX_free(sctx);
        pthread_mutex_destroy(&t.client_lock);
        pthread_mutex_destroy(&t.up_lock);
        return ret;
}
