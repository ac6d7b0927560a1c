#include "egress/proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "egress/addr.h"
#include "egress/httphead.h"
#include "egress/intercept.h"

#define MAX_ADDRS 16

int egress_test_host_parse(const char *text, EgressTestHost *ret) {
        const char *eq = strchr(text, '=');
        if (!eq || eq == text)
                return -EINVAL;
        char name[EGRESS_MAX_HOST + 2];
        size_t nl = (size_t)(eq - text);
        if (nl >= sizeof(name))
                return -EINVAL;
        memcpy(name, text, nl);
        name[nl] = '\0';
        EgressTestHost h = { 0 };
        if (egress_host_normalize(name, h.name, sizeof(h.name)) < 0)
                return -EINVAL;

        const char *addr = eq + 1, *colon = strrchr(addr, ':');
        if (!colon)
                return -EINVAL;
        char host[64];
        size_t hl = (size_t)(colon - addr);
        if (hl == 0 || hl >= sizeof(host))
                return -EINVAL;
        memcpy(host, addr, hl);
        host[hl] = '\0';
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (*end || port <= 0 || port > 65535)
                return -EINVAL;
        struct sockaddr_in in = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
        if (inet_pton(AF_INET, host, &in.sin_addr) != 1)
                return -EINVAL;
        /* The point of the setting is to reach servers of the test suite on
         * this machine; anything else would be a way around the checks. */
        if (egress_addr_classify((struct sockaddr *)&in) != EGRESS_ADDR_LOOPBACK)
                return -EINVAL;
        memcpy(&h.addr, &in, sizeof(in));
        h.addr_len = sizeof(in);
        *ret = h;
        return 0;
}

static int respond(const EgressIo *io, int status, const char *title, const char *message) {
        char body[512];
        int bl = snprintf(body, sizeof(body), "runtime egress: %s\n", message);
        char buf[1024];
        int n = snprintf(buf, sizeof(buf),
                         "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                         "Connection: close\r\nX-Runtime-Egress: refused\r\n\r\n%s",
                         status, title, bl, body);
        int r = io->write(io->ctx, (const uint8_t *)buf, (size_t)n);
        io->close_write(io->ctx);
        return r < 0 ? r : 0;
}

/* The decision reaches its listener before anything else happens to the
 * connection. */
static void decide(const EgressProxyConfig *cfg, const EgressRecord *rec) {
        if (cfg && cfg->decided)
                cfg->decided(cfg->decided_ctx, rec);
}

/* A refusal: recorded first, then answered. */
static int refuse(const EgressIo *io, const EgressProxyConfig *cfg, EgressRecord *rec, int status, const char *title,
                  const char *message) {
        snprintf(rec->end, sizeof(rec->end), "refused");
        decide(cfg, rec);
        return respond(io, status, title, message);
}

__attribute__((format(printf, 2, 3))) static void record_refusal(EgressRecord *rec, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        rec->allowed = false;
        vsnprintf(rec->reason, sizeof(rec->reason), fmt, ap);
        va_end(ap);
}

static int connect_with_timeout(const struct sockaddr *sa, socklen_t len, int timeout_ms) {
        int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        if (connect(fd, sa, len) < 0 && errno != EINPROGRESS) {
                int e = -errno;
                close(fd);
                return e;
        }
        struct pollfd pfd = { .fd = fd, .events = POLLOUT };
        int r;
        do
                r = poll(&pfd, 1, timeout_ms);
        while (r < 0 && errno == EINTR);
        if (r == 0) {
                close(fd);
                return -ETIMEDOUT;
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (r < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr != 0) {
                close(fd);
                return soerr ? -soerr : -EIO;
        }
        int flags = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
}

typedef struct Pump {
        const EgressIo *io;
        int upstream;
        EgressParser *parser; /* plain HTTP: where the one request ends; NULL for tunnels */
        bool message_done;
        atomic_bool stop;
        atomic_bool sandbox_gone; /* its side failed, not merely half-closed */
        atomic_uint_fast64_t last_activity;
        uint64_t bytes_out;
} Pump;

/* Forwards what the sandbox sends. For plain HTTP, only up to the end of
 * the one request that was decided on. */
static int forward_up(Pump *p, const uint8_t *buf, size_t len) {
        if (p->parser && !p->message_done) {
                size_t used = 0;
                char err[64];
                int r = egress_parser_feed(p->parser, buf, len, &used, err, sizeof(err));
                if (r < 0)
                        return r;
                if (r == EGRESS_PARSE_DONE)
                        p->message_done = true;
                len = used;
        } else if (p->parser)
                return 0;
        if (len == 0)
                return 0;
        p->bytes_out += len;
        atomic_store(&p->last_activity, time_now_mono_ms());
        return io_send_all(p->upstream, buf, len);
}

static void *pump_up(void *arg) {
        Pump *p = arg;
        uint8_t buf[64 * 1024];
        while (!atomic_load(&p->stop) && !(p->parser && p->message_done)) {
                ssize_t n = p->io->read(p->io->ctx, buf, sizeof(buf));
                if (n == -EAGAIN || n == -EINTR)
                        continue;
                if (n < 0)
                        atomic_store(&p->sandbox_gone, true);
                if (n <= 0)
                        break;
                if (forward_up(p, buf, (size_t)n) < 0)
                        break;
        }
        shutdown(p->upstream, SHUT_WR);
        return NULL;
}

static int resolve_checked(const char *host, uint16_t port, const EgressProxyConfig *cfg,
                           struct sockaddr_storage *addrs, socklen_t *lens, size_t *ret_n, bool *ret_test,
                           const EgressCidr **ranges, EgressRecord *rec) {
        char norm[EGRESS_MAX_HOST + 1];
        if (egress_host_normalize(host, norm, sizeof(norm)) < 0) {
                record_refusal(rec, "%s is not a valid host name", host);
                return -EINVAL;
        }
        for (size_t i = 0; cfg && i < cfg->n_test_hosts; i++)
                if (strcmp(cfg->test_hosts[i].name, norm) == 0) {
                        addrs[0] = cfg->test_hosts[i].addr;
                        lens[0] = cfg->test_hosts[i].addr_len;
                        *ret_n = 1;
                        *ret_test = true;
                        return 0;
                }

        struct sockaddr_storage lit;
        int r = egress_parse_ip_literal(host, &lit);
        if (r < 0) {
                record_refusal(rec, "%s is not a valid host", host);
                return -EINVAL;
        }
        size_t n = 0;
        if (r == 1) {
                addrs[0] = lit;
                lens[0] = lit.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
                n = 1;
        } else {
                struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
                int gr = getaddrinfo(norm, NULL, &hints, &res);
                if (gr != 0) {
                        record_refusal(rec, "could not resolve %s", norm);
                        return -EHOSTUNREACH;
                }
                for (struct addrinfo *ai = res; ai && n < MAX_ADDRS; ai = ai->ai_next) {
                        if (ai->ai_addrlen > sizeof(addrs[0]))
                                continue;
                        memcpy(&addrs[n], ai->ai_addr, ai->ai_addrlen);
                        lens[n] = ai->ai_addrlen;
                        n++;
                }
                freeaddrinfo(res);
        }
        /* Every address must be one a sandbox may reach: a name that mixes a
         * public address with a private one is an attack, not an accident. */
        for (size_t i = 0; i < n; i++) {
                EgressAddrClass c = egress_addr_classify((struct sockaddr *)&addrs[i]);
                /* ranges[i]: the operator range that admits it, if any. */
                ranges[i] = c == EGRESS_ADDR_PUBLIC || !cfg ? NULL
                                                            : egress_cidr_admit(cfg->public_cidrs, cfg->n_public_cidrs,
                                                                                (struct sockaddr *)&addrs[i]);
                if (ranges[i])
                        c = EGRESS_ADDR_PUBLIC;
                if (c != EGRESS_ADDR_PUBLIC) {
                        char text[64] = "?";
                        egress_addr_format((struct sockaddr *)&addrs[i], text, sizeof(text));
                        const char *cls = egress_addr_class_name(c);
                        record_refusal(rec, "%s resolves to %s, %s %s address", norm, text,
                                       strchr("aeiou", cls[0]) ? "an" : "a", cls);
                        return -EACCES;
                }
                if (addrs[i].ss_family == AF_INET)
                        ((struct sockaddr_in *)&addrs[i])->sin_port = htons(port);
                else
                        ((struct sockaddr_in6 *)&addrs[i])->sin6_port = htons(port);
        }
        if (n == 0) {
                record_refusal(rec, "%s has no address", norm);
                return -EHOSTUNREACH;
        }
        *ret_n = n;
        *ret_test = false;
        return 0;
}

/* One connection being served: what each step of egress_proxy_serve
 * hands the next. A step answers < 0 (the connection failed: that is the
 * result), SERVE_DONE (it ended, answered or refused) or 0 (go on). */
typedef struct Serve {
        const EgressIo *io;
        const EgressProxyConfig *cfg;
        EgressRecord *rec;
        EgressParser *parser;
        uint8_t *buf;
        size_t cap, len, parsed; /* buf[parsed, len) came after the request's head */
        int parse_result;        /* EGRESS_PARSE_DONE: the whole request is in buf */
        int upstream;
        uint64_t started;
} Serve;

#define SERVE_DONE 1

/* Reads until the request's head is parsed, refusing a slow, oversized or
 * malformed one with an answer. */
static int read_head(Serve *s) {
        char err[160];
        int r = 0;
        for (;;) {
                if (s->len == s->cap) {
                        r = -E2BIG;
                        break;
                }
                ssize_t n = s->io->read(s->io->ctx, s->buf + s->len, s->cap - s->len);
                if (n == -EAGAIN || n == -EINTR) {
                        if (time_now_mono_ms() - s->started > 30000) {
                                record_refusal(s->rec, "%s", "no request within 30 s");
                                refuse(s->io, s->cfg, s->rec, 408, "Request Timeout", "no request within 30 s");
                                return SERVE_DONE;
                        }
                        continue;
                }
                if (n <= 0) {
                        record_refusal(s->rec, "%s", "the connection closed before a request");
                        snprintf(s->rec->end, sizeof(s->rec->end), "the sandbox closed the connection");
                        decide(s->cfg, s->rec);
                        return n < 0 ? (int)n : SERVE_DONE;
                }
                s->len += (size_t)n;
                size_t used = 0;
                r = egress_parser_feed(s->parser, s->buf + s->parsed, s->len - s->parsed, &used, err, sizeof(err));
                s->parsed += used;
                if (r != EGRESS_PARSE_MORE)
                        break;
        }
        if (r < 0) {
                const char *msg = r == -E2BIG ? "request head too large" : err;
                record_refusal(s->rec, "%s", msg);
                refuse(s->io, s->cfg, s->rec, r == -E2BIG ? 431 : 400,
                       r == -E2BIG ? "Request Header Fields Too Large" : "Bad Request", msg);
                return SERVE_DONE;
        }
        s->parse_result = r;
        return 0;
}

/* Decides on the request (ports, the policy), resolves its host once,
 * refuses what a sandbox must not reach, and connects to an address it
 * checked. */
static int connect_upstream(Serve *s, const EgressPolicy *policy, int connect_timeout) {
        const EgressHead *head = egress_parser_head(s->parser);
        EgressRecord *rec = s->rec;
        snprintf(rec->host, sizeof(rec->host), "%.253s", head->host);
        rec->port = head->port;
        rec->connect = head->is_connect;
        if (s->cfg && s->cfg->web_ports_only && head->port != 80 && head->port != 443) {
                record_refusal(rec, "this sandbox reaches ports 80 and 443 only (a trial key)");
                refuse(s->io, s->cfg, rec, 403, "Forbidden", rec->reason);
                return SERVE_DONE;
        }
        EgressVerdict v = egress_policy_check_rule(policy, head->host, head->port, rec->rule, sizeof(rec->rule));
        if (v != EGRESS_ALLOW) {
                char msg[320];
                snprintf(msg, sizeof(msg), "%.200s:%u refused: %s", head->host, head->port, egress_verdict_reason(v));
                record_refusal(rec, "%s", egress_verdict_reason(v));
                refuse(s->io, s->cfg, rec, 403, "Forbidden", msg);
                return SERVE_DONE;
        }
        struct sockaddr_storage addrs[MAX_ADDRS];
        socklen_t lens[MAX_ADDRS];
        size_t n_addrs = 0;
        bool test_host = false;
        const EgressCidr *ranges[MAX_ADDRS] = { 0 }, *range = NULL;
        int r = resolve_checked(head->host, head->port, s->cfg, addrs, lens, &n_addrs, &test_host, ranges, rec);
        if (r < 0) {
                refuse(s->io, s->cfg, rec, r == -EACCES ? 403 : 502, r == -EACCES ? "Forbidden" : "Bad Gateway",
                       rec->reason);
                return SERVE_DONE;
        }
        for (size_t i = 0; i < n_addrs && s->upstream < 0; i++) {
                s->upstream = connect_with_timeout((struct sockaddr *)&addrs[i], lens[i], connect_timeout);
                if (s->upstream >= 0) {
                        egress_addr_format((struct sockaddr *)&addrs[i], rec->addr, sizeof(rec->addr));
                        range = ranges[i];
                }
        }
        if (s->upstream < 0) {
                char msg[320];
                snprintf(msg, sizeof(msg), "could not connect to %.200s:%u (%s)", head->host, head->port,
                         s->upstream == -ETIMEDOUT ? "timed out" : "refused or unreachable");
                record_refusal(rec, "%s", msg);
                refuse(s->io, s->cfg, rec, s->upstream == -ETIMEDOUT ? 504 : 502,
                       s->upstream == -ETIMEDOUT ? "Gateway Timeout" : "Bad Gateway", msg);
                return SERVE_DONE;
        }
        rec->allowed = true;
        if (range) {
                char text[80] = "?";
                egress_cidr_format(range, text, sizeof(text));
                snprintf(rec->reason, sizeof(rec->reason), "allowed (operator public range %s)", text);
        } else
                snprintf(rec->reason, sizeof(rec->reason), "%s", test_host ? "allowed (test upstream)" : "allowed");
        return 0;
}

/* A CONNECT: the sandbox is told the tunnel is open, then it is either
 * intercepted (a secret applies: served to its end here) or pumped. */
static int open_tunnel(Serve *s, Pump *pump) {
        static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
        const EgressHead *head = egress_parser_head(s->parser);
        const EgressProxyConfig *cfg = s->cfg;
        /* The decision says whether the tunnel is to be intercepted; the end
         * says whether it was (both TLS handshakes done). */
        bool intercept = cfg && cfg->ca && cfg->upstream_ctx &&
                         egress_any_secret_applies(cfg->secrets, cfg->n_secrets, head->host, head->port);
        s->rec->intercepted = intercept;
        decide(cfg, s->rec);
        s->rec->intercepted = false;
        if (s->io->write(s->io->ctx, (const uint8_t *)ok, sizeof(ok) - 1) < 0) {
                snprintf(s->rec->end, sizeof(s->rec->end), "the sandbox closed the connection");
                return SERVE_DONE;
        }
        if (intercept) {
                int r = egress_intercept(s->io, s->upstream, head->host, head->port, cfg, s->buf + s->parsed,
                                         s->len - s->parsed, s->rec);
                return r < 0 ? r : SERVE_DONE;
        }
        if (s->len > s->parsed && forward_up(pump, s->buf + s->parsed, s->len - s->parsed) < 0)
                return SERVE_DONE;
        return 0;
}

/* A plain HTTP request: its head with the placeholders of the secrets that
 * apply replaced (or refused by their rules) goes upstream, then what
 * follows of the one request. */
static int send_request(Serve *s, Pump *pump) {
        const EgressHead *head = egress_parser_head(s->parser);
        const EgressProxyConfig *cfg = s->cfg;
        char *fwd = NULL;
        size_t fwd_len = 0;
        char why[160] = "";
        int n = egress_secret_prepare_head(head->forward, head->forward_len, cfg ? cfg->secrets : NULL,
                                           cfg ? cfg->n_secrets : 0, head->host, head->port, &fwd, &fwd_len, why,
                                           sizeof(why));
        if (n == -EACCES) {
                s->rec->allowed = false;
                record_refusal(s->rec, "%s", why);
                refuse(s->io, cfg, s->rec, 403, "Forbidden", why);
                return SERVE_DONE;
        }
        if (n < 0) {
                snprintf(s->rec->end, sizeof(s->rec->end), "the request head could not be rewritten");
                return SERVE_DONE;
        }
        s->rec->secrets_used = (unsigned)n;
        decide(cfg, s->rec);
        pump->bytes_out = fwd_len;
        int w = io_send_all(s->upstream, (const uint8_t *)fwd, fwd_len);
        free(fwd);
        if (w < 0) {
                snprintf(s->rec->end, sizeof(s->rec->end), "the upstream connection failed");
                return SERVE_DONE;
        }
        pump->message_done = s->parse_result == EGRESS_PARSE_DONE;
        if (!pump->message_done && s->len > s->parsed &&
            forward_up(pump, s->buf + s->parsed, s->len - s->parsed) < 0)
                return SERVE_DONE;
        return 0;
}

/* Both directions until one ends or the connection idles: the sandbox's
 * bytes go up on a thread of their own, the upstream's come down here. */
static int pump_both(Serve *s, Pump *pump, int idle_timeout) {
        pthread_t up;
        if (pthread_create(&up, NULL, pump_up, pump) != 0) {
                snprintf(s->rec->end, sizeof(s->rec->end), "the egress proxy is out of resources");
                return -EAGAIN;
        }
        const char *end = "the egress proxy failed";
        for (;;) {
                struct pollfd pfd = { .fd = s->upstream, .events = POLLIN };
                int pr = poll(&pfd, 1, 1000);
                if (pr < 0 && errno == EINTR)
                        continue;
                if (atomic_load(&pump->sandbox_gone)) {
                        end = "the sandbox closed the connection";
                        break;
                }
                if (pr == 0) {
                        if (time_now_mono_ms() - atomic_load(&pump->last_activity) > (uint64_t)idle_timeout) {
                                end = "idle timeout";
                                break;
                        }
                        continue;
                }
                ssize_t got = recv(s->upstream, s->buf, s->cap, 0);
                if (got < 0 && errno == EINTR)
                        continue;
                if (got <= 0) {
                        end = got == 0 ? "the upstream closed the connection" : "the upstream connection failed";
                        break;
                }
                s->rec->bytes_in += (uint64_t)got;
                atomic_store(&pump->last_activity, time_now_mono_ms());
                if (s->io->write(s->io->ctx, s->buf, (size_t)got) < 0) {
                        end = "the sandbox closed the connection";
                        break;
                }
        }
        snprintf(s->rec->end, sizeof(s->rec->end), "%s", end);
        s->io->close_write(s->io->ctx);
        atomic_store(&pump->stop, true);
        shutdown(s->upstream, SHUT_RDWR);
        pthread_join(up, NULL);
        s->rec->bytes_out = pump->bytes_out;
        return SERVE_DONE;
}

int egress_proxy_serve(const EgressIo *io, const EgressPolicy *policy, const EgressProxyConfig *cfg,
                       EgressRecord *rec) {
        memset(rec, 0, sizeof(*rec));
        int connect_timeout = cfg && cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 10000;
        int idle_timeout = cfg && cfg->idle_timeout_ms > 0 ? cfg->idle_timeout_ms : 300000;
        Serve s = { .io = io, .cfg = cfg, .rec = rec, .cap = EGRESS_MAX_HEAD + 64 * 1024, .upstream = -1,
                    .started = time_now_mono_ms() };
        int r = -ENOMEM;
        s.parser = egress_parser_new();
        s.buf = s.parser ? malloc(s.cap) : NULL;
        if (s.buf && (r = read_head(&s)) == 0 && (r = connect_upstream(&s, policy, connect_timeout)) == 0) {
                const EgressHead *head = egress_parser_head(s.parser);
                Pump pump = { .io = io, .upstream = s.upstream, .parser = head->is_connect ? NULL : s.parser };
                atomic_store(&pump.last_activity, time_now_mono_ms());
                r = head->is_connect ? open_tunnel(&s, &pump) : send_request(&s, &pump);
                if (r == 0)
                        r = pump_both(&s, &pump, idle_timeout);
        }
        int ret = r < 0 ? r : 0;
        if (s.upstream >= 0)
                close(s.upstream);
        free(s.buf);
        egress_parser_free(s.parser);
        rec->duration_ms = time_now_mono_ms() - s.started;
        if (!rec->end[0])
                snprintf(rec->end, sizeof(rec->end), "%s", ret < 0 ? "the egress proxy failed" : "closed");
        return ret;
}

int egress_upstream_ctx_new(const char *extra_ca_file, SSL_CTX **ret) {
        SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
        if (!ctx)
                return -ENOMEM;
        if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) || !SSL_CTX_set_default_verify_paths(ctx) ||
            (extra_ca_file && !SSL_CTX_load_verify_locations(ctx, extra_ca_file, NULL))) {
                SSL_CTX_free(ctx);
                return -EINVAL;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        *ret = ctx;
        return 0;
}
