/* A tunnel to another host (http/forward.h, forward_tunnel_open), against
 * a listener on loopback that answers as the test says: a 101 and the bytes
 * after it, a refusal, a head too large, an end before any answer, nothing
 * listening, an address that is no URL. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/http/forward.h"

typedef struct Peer {
        int fd;
        const char *answer; /* NULL: close at once */
        char head[1024];    /* what the tunnel sent */
        char more[64];      /* what came after it */
        pthread_t thread;
} Peer;

static void *peer_main(void *arg) {
        Peer *p = arg;
        int c = accept(p->fd, NULL, NULL);
        if (c < 0)
                return NULL;
        size_t n = 0;
        while (n + 1 < sizeof p->head && !strstr(p->head, "\r\n\r\n")) {
                ssize_t k = recv(c, p->head + n, sizeof p->head - 1 - n, 0);
                if (k <= 0)
                        break;
                n += (size_t)k;
                p->head[n] = '\0';
        }
        if (p->answer) {
                (void)!write(c, p->answer, strlen(p->answer));
                ssize_t k = recv(c, p->more, sizeof p->more - 1, 0);
                if (k > 0)
                        p->more[k] = '\0';
        }
        close(c);
        return NULL;
}

/* A listener on a free loopback port, answering once; its URL in url. */
static void peer_start(Peer *p, const char *answer, char *url, size_t n) {
        memset(p, 0, sizeof *p);
        p->answer = answer;
        p->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t sl = sizeof sa;
        assert_int_equal(bind(p->fd, (struct sockaddr *)&sa, sizeof sa), 0);
        assert_int_equal(listen(p->fd, 4), 0);
        assert_int_equal(getsockname(p->fd, (struct sockaddr *)&sa, &sl), 0);
        snprintf(url, n, "http://127.0.0.1:%u", ntohs(sa.sin_port));
        assert_int_equal(pthread_create(&p->thread, NULL, peer_main, p), 0);
}

static void peer_end(Peer *p) {
        pthread_join(p->thread, NULL);
        close(p->fd);
}

static ForwardTunnel tunnel(const char *url) {
        return (ForwardTunnel){ .base_url = url, .path = "/v1/sandboxes/sbx_1/previews/8000:relay",
                                .protocol = "runtime-preview", .secret = "s3cret", .by = "host-b",
                                .sandbox_id = "sbx_1", .client_fd = -1 };
}

static void test_an_upgrade(void **state) {
        Peer p;
        char url[64];
        peer_start(&p, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: runtime-preview\r\nConnection: Upgrade\r\n\r\n"
                       "HTTP/1.1 200 OK\r\n",
                   url, sizeof url);
        ForwardTunnel t = tunnel(url);
        Forward *f = NULL;
        ApiError e = { 0 };
        assert_int_equal(forward_tunnel_open(&t, &f, &e), 0);
        /* The request: the route, the protocol, the fleet's secret and the host. */
        assert_non_null(strstr(p.head, "GET /v1/sandboxes/sbx_1/previews/8000:relay HTTP/1.1\r\n"));
        assert_non_null(strstr(p.head, "\r\nUpgrade: runtime-preview\r\n"));
        assert_non_null(strstr(p.head, "\r\nRuntime-Fleet-Secret: s3cret\r\n"));
        assert_non_null(strstr(p.head, "\r\nRuntime-Forwarded-By: host-b\r\n"));
        /* What came after the 101 is the new protocol's, read first. */
        char buf[64] = "";
        size_t got = 0;
        while (got < 17) {
                ssize_t k = forward_read(f, buf + got, sizeof buf - 1 - got);
                assert_true(k > 0);
                got += (size_t)k;
        }
        assert_memory_equal(buf, "HTTP/1.1 200 OK\r\n", 17);
        assert_int_equal(forward_write(f, "bytes", 5), 0);
        forward_shutdown_write(f);
        peer_end(&p);
        assert_string_equal(p.more, "bytes");
        forward_free(f);
}

static void test_refusals(void **state) {
        static const char *const answers[] = {
                "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                "not http at all\r\n\r\n",
                NULL, /* closed before any answer */
        };
        for (size_t i = 0; i < sizeof answers / sizeof *answers; i++) {
                Peer p;
                char url[64];
                peer_start(&p, answers[i], url, sizeof url);
                ForwardTunnel t = tunnel(url);
                Forward *f = NULL;
                ApiError e = { 0 };
                assert_true(forward_tunnel_open(&t, &f, &e) < 0);
                assert_null(f);
                assert_int_equal(e.status, 502);
                assert_string_equal(e.code, "host_unavailable");
                assert_non_null(strstr(e.message, "sbx_1"));
                if (i == 0)
                        assert_non_null(strstr(e.message, "refused the relay (403)"));
                peer_end(&p);
        }
}

static void test_nobody_there(void **state) {
        /* A port nothing listens on, and addresses that are no URL: 503,
         * at once. */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t sl = sizeof sa;
        assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
        char url[64];
        snprintf(url, sizeof url, "http://127.0.0.1:%u", ntohs(sa.sin_port));
        close(fd);
        const char *urls[] = { url, "ftp://127.0.0.1:1", "http://", "https://[::1" };
        for (size_t i = 0; i < sizeof urls / sizeof *urls; i++) {
                ForwardTunnel t = tunnel(urls[i]);
                Forward *f = NULL;
                ApiError e = { 0 };
                assert_true(forward_tunnel_open(&t, &f, &e) < 0);
                assert_null(f);
                assert_int_equal(e.status, 503);
                assert_string_equal(e.code, "host_unavailable");
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_an_upgrade),
                cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_nobody_there),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
