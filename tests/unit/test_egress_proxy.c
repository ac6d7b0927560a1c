/* The egress proxy against real sockets on loopback: decisions, refusals,
 * tunnels, and that one connection carries exactly one decided request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "egress/httphead.h"
#include "egress/proxy.h"

/* Policies below are printf formats with the upstream's port. */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"

typedef struct Upstream {
        int listen_fd;
        uint16_t port;
        pthread_t thread;
        char seen[8192]; /* everything the last connection sent */
        size_t seen_len;
        int connections;
} Upstream;

/* Answers every connection with one fixed response after the first blank
 * line, then keeps reading what else arrives until the peer closes. */
static void *upstream_main(void *arg) {
        Upstream *u = arg;
        for (;;) {
                int c = accept(u->listen_fd, NULL, NULL);
                if (c < 0)
                        return NULL;
                u->connections++;
                u->seen_len = 0;
                bool answered = false;
                for (;;) {
                        ssize_t n = recv(c, u->seen + u->seen_len, sizeof(u->seen) - 1 - u->seen_len, 0);
                        if (n <= 0)
                                break;
                        u->seen_len += (size_t)n;
                        u->seen[u->seen_len] = '\0';
                        if (!answered && strstr(u->seen, "\r\n\r\n")) {
                                const char *resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                                send(c, resp, strlen(resp), MSG_NOSIGNAL);
                                answered = true;
                        }
                }
                close(c);
        }
}

static Upstream upstream;

static int setup(void **state) {
        upstream.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        assert_int_equal(bind(upstream.listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
        socklen_t l = sizeof(a);
        getsockname(upstream.listen_fd, (struct sockaddr *)&a, &l);
        upstream.port = ntohs(a.sin_port);
        assert_int_equal(listen(upstream.listen_fd, 16), 0);
        pthread_create(&upstream.thread, NULL, upstream_main, &upstream);
        return 0;
}

static ssize_t sock_read(void *ctx, uint8_t *buf, size_t len) {
        int fd = *(int *)ctx;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 200) == 0)
                return -EAGAIN;
        ssize_t n = recv(fd, buf, len, 0);
        return n < 0 ? -errno : n;
}
/* Bytes the proxy has answered the sandbox so far in this exchange. */
static size_t answered;

static int sock_write(void *ctx, const uint8_t *buf, size_t len) {
        int fd = *(int *)ctx;
        while (len) {
                ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
                if (n < 0)
                        return -errno;
                buf += n;
                len -= (size_t)n;
        }
        return 0;
}
/* The proxy's writes towards the sandbox, counted. */
static int proxy_write(void *ctx, const uint8_t *buf, size_t len) {
        __atomic_add_fetch(&answered, len, __ATOMIC_SEQ_CST);
        return sock_write(ctx, buf, len);
}
static void sock_close_write(void *ctx) {
        shutdown(*(int *)ctx, SHUT_WR);
}

typedef struct Served {
        int fd;
        EgressPolicy *policy;
        EgressProxyConfig cfg;
        EgressRecord rec;
        int ret;
} Served;

static void *serve_main(void *arg) {
        Served *s = arg;
        EgressIo io = { .ctx = &s->fd, .read = sock_read, .write = proxy_write, .close_write = sock_close_write };
        s->ret = egress_proxy_serve(&io, s->policy, &s->cfg, &s->rec);
        close(s->fd);
        return NULL;
}

/* What the proxy said when it decided: the first decision, how many there
 * were, and how much the sandbox had been answered by then. */
typedef struct Decisions {
        int calls;
        EgressRecord first, last;
        size_t answered_at_first;
} Decisions;

static void on_decided(void *ctx, const EgressRecord *rec) {
        Decisions *d = ctx;
        if (d->calls++ == 0) {
                d->first = *rec;
                d->answered_at_first = __atomic_load_n(&answered, __ATOMIC_SEQ_CST);
        }
        d->last = *rec;
}

static Decisions decisions;

static EgressPolicy *policy_of(const char *fmt) {
        char text[512];
        snprintf(text, sizeof(text), fmt, upstream.port);
        json_t *j = json_loads(text, 0, NULL);
        assert_non_null(j);
        EgressPolicy *p = NULL;
        assert_int_equal(egress_policy_parse(j, &p, NULL, 0), 0);
        json_decref(j);
        return p;
}

/* Operator public ranges for the next exchanges. */
static const EgressCidr *ranges;
static size_t n_ranges;

/* Sends `request` as the sandbox would, then half-closes after `close_after`
 * and returns everything the proxy answered. */
static void exchange(const char *policy_fmt, const char *request, char *answer, size_t answer_len,
                     EgressRecord *rec) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        EgressTestHost th;
        char spec[128];
        snprintf(spec, sizeof(spec), "upstream.test=127.0.0.1:%u", upstream.port);
        assert_int_equal(egress_test_host_parse(spec, &th), 0);
        Served s = { .fd = sv[1], .policy = policy_of(policy_fmt),
                     .cfg = { .test_hosts = &th,
                              .n_test_hosts = 1,
                              .connect_timeout_ms = 2000,
                              .public_cidrs = ranges,
                              .n_public_cidrs = n_ranges,
                              .decided = on_decided,
                              .decided_ctx = &decisions } };
        memset(&decisions, 0, sizeof(decisions));
        __atomic_store_n(&answered, 0, __ATOMIC_SEQ_CST);
        pthread_t t;
        pthread_create(&t, NULL, serve_main, &s);
        sock_write(&sv[0], (const uint8_t *)request, strlen(request));
        size_t got = 0;
        for (;;) {
                ssize_t n = recv(sv[0], answer + got, answer_len - 1 - got, 0);
                if (n <= 0)
                        break;
                got += (size_t)n;
                answer[got] = '\0';
                /* Tunnels stay open until the sandbox side closes. */
                if (strstr(answer, "\r\n\r\nok") || (strstr(answer, " 200 Connection") && strstr(answer, "ok")))
                        break;
        }
        answer[got] = '\0';
        shutdown(sv[0], SHUT_WR);
        pthread_join(t, NULL);
        close(sv[0]);
        *rec = s.rec;
        egress_policy_free(s.policy);
        /* Every exchange here gets a request and is decided once, before the
         * sandbox hears a byte (a refusal, or the tunnel's 200), with what the
         * end then completes. */
        assert_int_equal(decisions.calls, 1);
        assert_int_equal(decisions.answered_at_first, 0);
        assert_int_equal(decisions.first.allowed, rec->allowed);
        assert_string_equal(decisions.first.reason, rec->reason);
        assert_string_equal(decisions.first.host, rec->host);
        assert_string_equal(decisions.first.rule, rec->rule);
        assert_true(rec->end[0] != '\0');
        assert_true(rec->allowed || strcmp(rec->end, "refused") == 0);
}

static void test_plain_http_allowed(void **state) {
        char ans[4096], req[512];
        EgressRecord rec;
        snprintf(req, sizeof(req),
                 "GET http://upstream.test:%u/x?y=1 HTTP/1.1\r\nHost: evil.example\r\nProxy-Connection: keep-alive\r\n"
                 "Proxy-Authorization: Basic abc\r\n\r\n"
                 "GET http://upstream.test:%u/second HTTP/1.1\r\n\r\n",
                 upstream.port, upstream.port);
        exchange("{\"internet\": true, \"allow\": [\"upstream.test:%u\"]}", req, ans, sizeof(ans), &rec);
        assert_true(rec.allowed);
        assert_non_null(strstr(ans, "200 OK"));
        char rule[64];
        snprintf(rule, sizeof(rule), "allow upstream.test:%u", upstream.port);
        assert_string_equal(rec.rule, rule);
        assert_int_equal(decisions.first.bytes_out, 0); /* decided before a byte went upstream */
        char host[64];
        snprintf(host, sizeof(host), "Host: upstream.test:%u\r\n", upstream.port);
        assert_non_null(strstr(upstream.seen, "GET /x?y=1 HTTP/1.1\r\n"));
        assert_non_null(strstr(upstream.seen, host));
        assert_null(strstr(upstream.seen, "evil.example"));
        assert_null(strstr(upstream.seen, "Proxy-"));
        assert_non_null(strstr(upstream.seen, "Connection: close"));
        /* The pipelined second request was never forwarded. */
        assert_null(strstr(upstream.seen, "/second"));
}

static void test_connect_tunnel(void **state) {
        char ans[4096], req[512];
        EgressRecord rec;
        snprintf(req, sizeof(req), "CONNECT upstream.test:%u HTTP/1.1\r\n\r\nHELLO /raw\r\n\r\n", upstream.port);
        exchange("{\"internet\": true, \"allow\": [\"upstream.test:%u\"]}", req, ans, sizeof(ans), &rec);
        assert_true(rec.allowed);
        assert_true(rec.connect);
        assert_non_null(strstr(ans, "HTTP/1.1 200 Connection established\r\n\r\n"));
        assert_non_null(strstr(upstream.seen, "HELLO /raw"));
        assert_int_equal(rec.bytes_out, strlen("HELLO /raw\r\n\r\n"));
}

static void test_refusals(void **state) {
        char ans[4096];
        EgressRecord rec;
        int before = upstream.connections;
        exchange("{\"internet\": true, \"allow\": [\"pypi.org\"]}",
                 "CONNECT upstream.test:443 HTTP/1.1\r\n\r\n", ans, sizeof(ans), &rec);
        assert_false(rec.allowed);
        assert_non_null(strstr(ans, "403 Forbidden"));
        assert_non_null(strstr(ans, "allow list"));
        assert_string_equal(rec.rule, ""); /* no rule matched */

        exchange("{\"internet\": false}", "CONNECT pypi.org:443 HTTP/1.1\r\n\r\n", ans, sizeof(ans), &rec);
        assert_non_null(strstr(ans, "no internet access"));
        assert_string_equal(rec.rule, "internet: false");

        exchange("{\"internet\": true, \"deny\": [\"*.test\"]}", "CONNECT upstream.test:443 HTTP/1.1\r\n\r\n", ans,
                 sizeof(ans), &rec);
        assert_non_null(strstr(ans, "deny list"));
        assert_string_equal(rec.rule, "deny *.test");

        /* Named in the policy, but loopback: the SSRF rules are always on. */
        const char *spellings[] = { "127.0.0.1", "127.1", "2130706433", "0x7f000001", "[::1]",
                                    "[::ffff:127.0.0.1]", "169.254.169.254", "0xa9fea9fe" };
        for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
                char req[256], pol[256];
                snprintf(req, sizeof(req), "CONNECT %s:443 HTTP/1.1\r\n\r\n", spellings[i]);
                snprintf(pol, sizeof(pol), "{\"internet\": true, \"allow\": [\"%s\"]}", spellings[i]);
                exchange(pol, req, ans, sizeof(ans), &rec);
                if (rec.allowed || !strstr(ans, "403"))
                        fail_msg("%s was not refused: %s", spellings[i], ans);
        }
        /* A name that resolves to loopback. */
        exchange("{\"internet\": true, \"allow\": [\"localhost\"]}", "CONNECT localhost:443 HTTP/1.1\r\n\r\n", ans,
                 sizeof(ans), &rec);
        assert_false(rec.allowed);
        assert_non_null(strstr(ans, "loopback"));
        assert_int_equal(upstream.connections, before);
}

/* An operator range admits nothing a sandbox must never reach, even a range
 * that covers everything (made here past the start-up check that refuses
 * it), and it opens addresses, never hosts the policy does not allow. */
static void test_public_ranges(void **state) {
        char ans[4096];
        EgressRecord rec;
        EgressCidr doc, all[2];
        assert_int_equal(egress_cidr_parse("198.51.100.0/24", &doc), 0);

        /* Without the range: a documentation address is refused. */
        exchange("{\"internet\": true, \"allow\": [\"198.51.100.7\"]}", "CONNECT 198.51.100.7:443 HTTP/1.1\r\n\r\n",
                 ans, sizeof(ans), &rec);
        assert_false(rec.allowed);
        assert_non_null(strstr(ans, "403"));
        assert_non_null(strstr(rec.reason, "reserved"));

        /* Admission of an address in a range is egress_cidr_admit's (see
         * test_egress_cidr.c); a connection to it would leave the machine. */
        ranges = &doc;
        n_ranges = 1;
        /* The policy still decides: the range opens addresses, not hosts. */
        exchange("{\"internet\": true, \"allow\": [\"pypi.org\"]}", "CONNECT 198.51.100.7:443 HTTP/1.1\r\n\r\n", ans,
                 sizeof(ans), &rec);
        assert_non_null(strstr(ans, "403"));

        assert_int_equal(egress_cidr_parse("0.0.0.0/0", &all[0]), 0);
        assert_int_equal(egress_cidr_parse("::/0", &all[1]), 0);
        ranges = all;
        n_ranges = 2;
        int before = upstream.connections;
        const char *spellings[] = { "127.0.0.1", "127.1",         "2130706433", "[::1]", "[::ffff:127.0.0.1]",
                                    "169.254.169.254", "0xa9fea9fe", "[fe80::1]", "0.0.0.0", "100.100.100.200" };
        for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
                char req[256], pol[256];
                snprintf(req, sizeof(req), "CONNECT %s:%u HTTP/1.1\r\n\r\n", spellings[i], upstream.port);
                snprintf(pol, sizeof(pol), "{\"internet\": true, \"allow\": [\"%s:%u\"]}", spellings[i],
                         upstream.port);
                exchange(pol, req, ans, sizeof(ans), &rec);
                if (rec.allowed || !strstr(ans, "403"))
                        fail_msg("%s was not refused: %s", spellings[i], ans);
        }
        exchange("{\"internet\": true, \"allow\": [\"localhost:%u\"]}", "CONNECT localhost:443 HTTP/1.1\r\n\r\n", ans,
                 sizeof(ans), &rec);
        assert_false(rec.allowed);
        assert_int_equal(upstream.connections, before);
        ranges = NULL;
        n_ranges = 0;
}

static void test_malformed(void **state) {
        char ans[4096];
        EgressRecord rec;
        exchange("{\"internet\": true}", "GET /relative HTTP/1.1\r\n\r\n", ans, sizeof(ans), &rec);
        assert_non_null(strstr(ans, "400 Bad Request"));
        exchange("{\"internet\": true}", "\x01\x02garbage\r\n\r\n", ans, sizeof(ans), &rec);
        assert_non_null(strstr(ans, "400 Bad Request"));
        static char big[EGRESS_MAX_HEAD + 2048];
        memset(big, 0, sizeof(big));
        strcpy(big, "GET http://upstream.test/ HTTP/1.1\r\nX-A: ");
        memset(big + strlen(big), 'a', EGRESS_MAX_HEAD);
        exchange("{\"internet\": true}", big, ans, sizeof(ans), &rec);
        assert_non_null(strstr(ans, "431"));
}

static void test_test_host_parse(void **state) {
        EgressTestHost th;
        assert_int_equal(egress_test_host_parse("a.test=127.0.0.1:8080", &th), 0);
        assert_int_equal(egress_test_host_parse("a.test=10.0.0.1:8080", &th), -EINVAL);
        assert_int_equal(egress_test_host_parse("a.test=127.0.0.1", &th), -EINVAL);
        assert_int_equal(egress_test_host_parse("=127.0.0.1:1", &th), -EINVAL);
        assert_int_equal(egress_test_host_parse("a.test=127.0.0.1:0", &th), -EINVAL);
}

int main(void) {
        signal(SIGPIPE, SIG_IGN);
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_test_host_parse), cmocka_unit_test(test_plain_http_allowed),
                cmocka_unit_test(test_connect_tunnel),  cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_malformed),       cmocka_unit_test(test_public_ranges),
        };
        return cmocka_run_group_tests_name("egress_proxy", tests, setup, NULL);
}
