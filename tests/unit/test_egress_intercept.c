/* Secrets through the egress proxy: the value reaches the secret's own host
 * through an intercepted tunnel, never any other host, and a bad upstream
 * certificate fails closed with a clear answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "egress/ca.h"
#include "egress/proxy.h"
#include "egress/secret.h"

#define PLACEHOLDER "runtime-secret-API_TOKEN-0123456789abcdef0123456789abcdef"

typedef struct Server {
        int fd;
        uint16_t port;
        SSL_CTX *tls; /* NULL: plain HTTP */
        char seen[8192];
        pthread_t thread;
} Server;

static void *server_main(void *arg) {
        Server *s = arg;
        for (;;) {
                int c = accept(s->fd, NULL, NULL);
                if (c < 0)
                        return NULL;
                SSL *ssl = NULL;
                if (s->tls) {
                        ssl = SSL_new(s->tls);
                        SSL_set_fd(ssl, c);
                        if (SSL_accept(ssl) != 1) {
                                SSL_free(ssl);
                                close(c);
                                continue;
                        }
                }
                size_t got = 0;
                memset(s->seen, 0, sizeof(s->seen));
                while (got < sizeof(s->seen) - 1 && !strstr(s->seen, "\r\n\r\n")) {
                        int n = ssl ? SSL_read(ssl, s->seen + got, (int)(sizeof(s->seen) - 1 - got))
                                    : (int)recv(c, s->seen + got, sizeof(s->seen) - 1 - got, 0);
                        if (n <= 0)
                                break;
                        got += (size_t)n;
                }
                /* An echoing server: it sends back what it was sent. */
                char resp[9000];
                int n = snprintf(resp, sizeof(resp), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                                 strlen(s->seen), s->seen);
                if (ssl) {
                        SSL_write(ssl, resp, n);
                        SSL_shutdown(ssl);
                        SSL_free(ssl);
                } else
                        send(c, resp, (size_t)n, MSG_NOSIGNAL);
                close(c);
        }
}

static void server_start(Server *s, SSL_CTX *tls) {
        s->tls = tls;
        s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        assert_int_equal(bind(s->fd, (struct sockaddr *)&a, sizeof(a)), 0);
        socklen_t l = sizeof(a);
        getsockname(s->fd, (struct sockaddr *)&a, &l);
        s->port = ntohs(a.sin_port);
        listen(s->fd, 8);
        pthread_create(&s->thread, NULL, server_main, s);
}

static char dir_proxy[64] = "/tmp/rt-egress-ca-XXXXXX", dir_upstream[64] = "/tmp/rt-upstream-ca-XXXXXX";
static EgressCa *proxy_ca, *upstream_ca;
static Server tls_server, plain_server;
static SSL_CTX *trusting, *not_trusting;
static EgressSecret secret;
static EgressTestHost test_hosts[2];

static int setup(void **state) {
        assert_non_null(mkdtemp(dir_proxy));
        assert_non_null(mkdtemp(dir_upstream));
        assert_int_equal(egress_ca_load_or_create(dir_proxy, &proxy_ca), 0);
        assert_int_equal(egress_ca_load_or_create(dir_upstream, &upstream_ca), 0);
        SSL_CTX *up_tls = NULL;
        assert_int_equal(egress_ca_server_ctx(upstream_ca, "api.test", &up_tls), 0);
        server_start(&tls_server, up_tls);
        server_start(&plain_server, NULL);
        char ca_file[128];
        snprintf(ca_file, sizeof(ca_file), "%s/egress-ca.crt", dir_upstream);
        assert_int_equal(egress_upstream_ctx_new(ca_file, &trusting), 0);
        assert_int_equal(egress_upstream_ctx_new(NULL, &not_trusting), 0);

        char spec[128];
        snprintf(spec, sizeof(spec), "api.test=127.0.0.1:%u", tls_server.port);
        assert_int_equal(egress_test_host_parse(spec, &test_hosts[0]), 0);
        snprintf(spec, sizeof(spec), "echo.test=127.0.0.1:%u", plain_server.port);
        assert_int_equal(egress_test_host_parse(spec, &test_hosts[1]), 0);

        snprintf(secret.name, sizeof(secret.name), "API_TOKEN");
        snprintf(secret.placeholder, sizeof(secret.placeholder), PLACEHOLDER);
        secret.value = strdup("s3cr3t-value");
        char hosts[128];
        snprintf(hosts, sizeof(hosts), "{\"internet\": true, \"allow\": [\"api.test:%u\"]}", tls_server.port);
        json_t *j = json_loads(hosts, 0, NULL);
        assert_int_equal(egress_policy_parse(j, &secret.hosts, NULL, 0), 0);
        json_decref(j);
        return 0;
}

typedef struct Served {
        int fd;
        EgressPolicy *policy;
        EgressProxyConfig cfg;
        EgressRecord rec;
} Served;

static ssize_t sock_read(void *ctx, uint8_t *buf, size_t len) {
        int fd = *(int *)ctx;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 200) == 0)
                return -EAGAIN;
        ssize_t n = recv(fd, buf, len, 0);
        return n < 0 ? -errno : n;
}
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
static void sock_close_write(void *ctx) {
        shutdown(*(int *)ctx, SHUT_WR);
}
static void *serve_main(void *arg) {
        Served *s = arg;
        EgressIo io = { .ctx = &s->fd, .read = sock_read, .write = sock_write, .close_write = sock_close_write };
        egress_proxy_serve(&io, s->policy, &s->cfg, &s->rec);
        close(s->fd);
        return NULL;
}

static void start_proxy(Served *s, int *client_fd, SSL_CTX *upstream_ctx) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        json_t *j = json_pack("{s:b}", "internet", 1);
        json_t *allow = json_array();
        char p1[64], p2[64];
        snprintf(p1, sizeof(p1), "api.test:%u", tls_server.port);
        snprintf(p2, sizeof(p2), "echo.test:%u", plain_server.port);
        json_array_append_new(allow, json_string(p1));
        json_array_append_new(allow, json_string(p2));
        json_object_set_new(j, "allow", allow);
        assert_int_equal(egress_policy_parse(j, &s->policy, NULL, 0), 0);
        json_decref(j);
        s->fd = sv[1];
        s->cfg = (EgressProxyConfig){ .test_hosts = test_hosts, .n_test_hosts = 2, .secrets = &secret,
                                      .n_secrets = 1, .ca = proxy_ca, .upstream_ctx = upstream_ctx };
        *client_fd = sv[0];
}

static size_t read_all_plain(int fd, char *buf, size_t cap) {
        size_t got = 0;
        for (;;) {
                ssize_t n = recv(fd, buf + got, cap - 1 - got, 0);
                if (n <= 0)
                        break;
                got += (size_t)n;
        }
        buf[got] = '\0';
        return got;
}

/* CONNECT, then TLS as a sandbox would speak it, trusting the egress CA. */
static void https_request(SSL_CTX *upstream_ctx, char *answer, size_t cap, EgressRecord *rec) {
        Served s;
        int c;
        start_proxy(&s, &c, upstream_ctx);
        pthread_t t;
        pthread_create(&t, NULL, serve_main, &s);
        char req[256];
        snprintf(req, sizeof(req), "CONNECT api.test:%u HTTP/1.1\r\n\r\n", tls_server.port);
        sock_write(&c, (const uint8_t *)req, strlen(req));
        char line[128] = "";
        size_t got = 0;
        while (!strstr(line, "\r\n\r\n") && got < sizeof(line) - 1) {
                ssize_t n = recv(c, line + got, 1, 0);
                if (n <= 0)
                        break;
                got += (size_t)n;
        }
        assert_non_null(strstr(line, "200 Connection established"));

        SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
        char ca_file[128];
        snprintf(ca_file, sizeof(ca_file), "%s/egress-ca.crt", dir_proxy);
        assert_true(SSL_CTX_load_verify_locations(cctx, ca_file, NULL));
        SSL *ssl = SSL_new(cctx);
        SSL_set_fd(ssl, c);
        SSL_set_tlsext_host_name(ssl, "api.test");
        SSL_set1_host(ssl, "api.test");
        SSL_set_verify(ssl, SSL_VERIFY_PEER, NULL);
        assert_int_equal(SSL_connect(ssl), 1);
        assert_int_equal(SSL_get_verify_result(ssl), X509_V_OK);
        const char *r = "GET /v1/me?token=" PLACEHOLDER " HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " PLACEHOLDER
                        "\r\n\r\n";
        SSL_write(ssl, r, (int)strlen(r));
        size_t n = 0;
        for (;;) {
                int k = SSL_read(ssl, answer + n, (int)(cap - 1 - n));
                if (k <= 0)
                        break;
                n += (size_t)k;
        }
        answer[n] = '\0';
        SSL_free(ssl);
        SSL_CTX_free(cctx);
        close(c);
        pthread_join(t, NULL);
        *rec = s.rec;
        egress_policy_free(s.policy);
}

static void test_secret_reaches_its_host(void **state) {
        char answer[16384];
        EgressRecord rec;
        https_request(trusting, answer, sizeof(answer), &rec);
        assert_true(rec.intercepted);
        assert_int_equal(rec.secrets_used, 2);
        assert_non_null(strstr(tls_server.seen, "Authorization: Bearer s3cr3t-value\r\n"));
        assert_non_null(strstr(tls_server.seen, "GET /v1/me?token=s3cr3t-value HTTP/1.1"));
        assert_null(strstr(tls_server.seen, PLACEHOLDER));
        assert_non_null(strstr(answer, "200 OK"));
}

static void test_bad_upstream_certificate_fails_closed(void **state) {
        char answer[16384];
        EgressRecord rec;
        memset(tls_server.seen, 0, sizeof(tls_server.seen));
        https_request(not_trusting, answer, sizeof(answer), &rec);
        assert_false(rec.allowed);
        assert_non_null(strstr(answer, "502 Bad Gateway"));
        assert_non_null(strstr(answer, "failed verification"));
        assert_null(strstr(tls_server.seen, "s3cr3t"));
}

static void test_placeholder_unchanged_elsewhere(void **state) {
        Served s;
        int c;
        start_proxy(&s, &c, trusting);
        pthread_t t;
        pthread_create(&t, NULL, serve_main, &s);
        char req[512];
        snprintf(req, sizeof(req),
                 "GET http://echo.test:%u/?q=" PLACEHOLDER " HTTP/1.1\r\nAuthorization: Bearer " PLACEHOLDER "\r\n\r\n",
                 plain_server.port);
        sock_write(&c, (const uint8_t *)req, strlen(req));
        char answer[16384];
        read_all_plain(c, answer, sizeof(answer));
        close(c);
        pthread_join(t, NULL);
        assert_int_equal(s.rec.secrets_used, 0);
        assert_non_null(strstr(answer, "Bearer " PLACEHOLDER));
        assert_null(strstr(answer, "s3cr3t"));
        egress_policy_free(s.policy);
}

static void test_secret_values(void **state) {
        assert_true(egress_secret_value_valid("abc", 3));
        assert_false(egress_secret_value_valid("a\r\nX-Injected: 1", 17));
        assert_false(egress_secret_value_valid("", 0));
        assert_false(egress_secret_value_valid("a\0b", 3));
}

static void remove_ca_dir(const char *dir) {
        char path[128];
        snprintf(path, sizeof(path), "%s/egress-ca.key", dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/egress-ca.crt", dir);
        unlink(path);
        rmdir(dir);
}

static int teardown(void **state) {
        remove_ca_dir(dir_proxy);
        remove_ca_dir(dir_upstream);
        return 0;
}

int main(void) {
        /* As in the daemon: a peer that went away is an error return, not a
         * signal. */
        signal(SIGPIPE, SIG_IGN);
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_secret_values),
                cmocka_unit_test(test_secret_reaches_its_host),
                cmocka_unit_test(test_placeholder_unchanged_elsewhere),
                cmocka_unit_test(test_bad_upstream_certificate_fails_closed),
        };
        return cmocka_run_group_tests_name("egress_intercept", tests, setup, teardown);
}
