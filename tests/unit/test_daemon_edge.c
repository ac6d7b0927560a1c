/* The HTTP edge: where a head ends, and a live edge on a loopback socket:
 * whole heads handed on, a NUL answered 400, a trickled head closed at its
 * time, the peer's bound, the oldest closed past the bound in all, and a
 * server's connection cut when its next head is late. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/timeutil.h"
#include "daemon/http/edge.h"

static void test_head_end(void **state) {
        assert_int_equal(edge_head_end("", 0), 0);
        assert_int_equal(edge_head_end("GET / HTTP/1.1\r\n", 16), 0);
        const char *h = "GET / HTTP/1.1\r\nHost: x\r\n\r\nbody";
        assert_int_equal(edge_head_end(h, strlen(h)), (long)(strlen(h) - 4));
        const char *lf = "GET / HTTP/1.1\nHost: x\n\nrest";
        assert_int_equal(edge_head_end(lf, strlen(lf)), (long)(strlen(lf) - 4));
        /* Line breaks before the request line are not its end. */
        const char *lead = "\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        assert_int_equal(edge_head_end(lead, strlen(lead)), (long)strlen(lead));
        assert_int_equal(edge_head_end("\r\n\r\n", 4), 0);
        /* A NUL anywhere in the head, however early. */
        const char nul[] = "GET / HTTP/1.1\r\nIdempotency-Key: a\0b\r\n\r\n";
        assert_int_equal(edge_head_end(nul, sizeof nul - 1), -EBADMSG);
        const char nul_line[] = "GET /\0 HTTP/1.1\r\n";
        assert_int_equal(edge_head_end(nul_line, sizeof nul_line - 1), -EBADMSG);
        /* A NUL in the body after a whole head is not the head's. */
        const char body[] = "GET / HTTP/1.1\r\n\r\n\0\0";
        assert_int_equal(edge_head_end(body, sizeof body - 1), 18);
}

/* ---- a live edge ---- */

typedef struct Handed {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        int fds[16];
        size_t n;
        _Atomic unsigned held; /* what the server says it holds */
} Handed;

static unsigned held_now(void *userdata) {
        return atomic_load(&((Handed *)userdata)->held);
}

static bool record(void *userdata, int fd, const struct sockaddr *sa, socklen_t len) {
        Handed *h = userdata;
        pthread_mutex_lock(&h->lock);
        if (h->n < 16)
                h->fds[h->n++] = fd;
        else
                close(fd);
        pthread_cond_broadcast(&h->cond);
        pthread_mutex_unlock(&h->lock);
        return true;
}

/* Waits for the n-th hand-off, 5 s at most. */
static bool handed(Handed *h, size_t n) {
        uint64_t until = time_now_mono_ms() + 5000;
        pthread_mutex_lock(&h->lock);
        while (h->n < n && time_now_mono_ms() < until) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000 * 1000;
                if (ts.tv_nsec >= 1000000000) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000;
                }
                pthread_cond_timedwait(&h->cond, &h->lock, &ts);
        }
        bool ok = h->n >= n;
        pthread_mutex_unlock(&h->lock);
        return ok;
}

static int listener(int *ret_port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof sa;
        assert_true(fd >= 0);
        assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        assert_int_equal(listen(fd, 64), 0);
        assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
        *ret_port = ntohs(sa.sin_port);
        return fd;
}

static int dial(int port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                  .sin_port = htons((uint16_t)port) };
        assert_true(fd >= 0);
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        return fd;
}

static void say(int fd, const char *text, size_t n) {
        assert_int_equal(send(fd, text, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads until the end (or a reset) within ms; what was read goes into buf.
 * Whether the end came. */
static bool ends_within(int fd, unsigned ms, char *buf, size_t cap) {
        uint64_t until = time_now_mono_ms() + ms;
        size_t got = 0;
        for (;;) {
                uint64_t now = time_now_mono_ms();
                if (now >= until)
                        return false;
                struct pollfd p = { .fd = fd, .events = POLLIN };
                if (poll(&p, 1, (int)(until - now)) <= 0)
                        continue;
                char tmp[512];
                ssize_t n = recv(fd, tmp, sizeof tmp, 0);
                if (n <= 0)
                        break;
                if (buf && got + (size_t)n < cap) {
                        memcpy(buf + got, tmp, (size_t)n);
                        got += (size_t)n;
                }
        }
        if (buf)
                buf[got] = '\0';
        return true;
}

typedef struct Live {
        Edge *edge;
        Handed h;
        int port;
} Live;

static void live_start_held(Live *l, unsigned max_waiting, unsigned per_peer, unsigned head_ms, unsigned max_held) {
        memset(l, 0, sizeof *l);
        pthread_mutex_init(&l->h.lock, NULL);
        pthread_cond_init(&l->h.cond, NULL);
        int lfd = listener(&l->port);
        EdgeConfig cfg = { .max_waiting = max_waiting, .max_waiting_per_peer = per_peer, .head_ms = head_ms,
                           .head_max = 4096, .max_held = max_held, .held = held_now };
        assert_int_equal(edge_start(lfd, &cfg, record, &l->h, &l->edge), 0);
}

static void live_start(Live *l, unsigned max_waiting, unsigned per_peer, unsigned head_ms) {
        live_start_held(l, max_waiting, per_peer, head_ms, 0);
}

static void live_stop(Live *l) {
        edge_free(l->edge);
        for (size_t i = 0; i < l->h.n; i++)
                close(l->h.fds[i]);
        pthread_cond_destroy(&l->h.cond);
        pthread_mutex_destroy(&l->h.lock);
}

static void test_whole_heads_are_handed_on(void **state) {
        Live l;
        live_start(&l, 64, 8, 5000);
        int c = dial(l.port);
        say(c, "GET / HTTP/1.1\r\n", 16);
        say(c, "Host: x\r\n", 9);
        say(c, "\r\n", 2);
        assert_true(handed(&l.h, 1));
        /* The head is still in the socket for the server to read. */
        char buf[64];
        ssize_t n = recv(l.h.fds[0], buf, sizeof buf - 1, MSG_DONTWAIT);
        assert_int_equal(n, 27);
        EdgeStats st;
        edge_stats(l.edge, &st);
        assert_int_equal(st.handed, 1);
        assert_int_equal(st.waiting, 0);
        close(c);
        live_stop(&l);
}

static void test_a_nul_is_answered_400(void **state) {
        Live l;
        live_start(&l, 64, 8, 5000);
        int c = dial(l.port);
        const char head[] = "GET / HTTP/1.1\r\nIdempotency-Key: a\0b\r\n\r\n";
        say(c, head, sizeof head - 1);
        char buf[2048];
        assert_true(ends_within(c, 5000, buf, sizeof buf));
        assert_non_null(strstr(buf, "HTTP/1.1 400 "));
        assert_non_null(strstr(buf, "\"invalid_request\""));
        assert_non_null(strstr(buf, "NUL"));
        EdgeStats st;
        edge_stats(l.edge, &st);
        assert_int_equal(st.malformed, 1);
        assert_int_equal(st.handed, 0);
        close(c);
        live_stop(&l);
}

static void test_a_head_too_long_is_431(void **state) {
        Live l;
        live_start(&l, 64, 8, 5000);
        int c = dial(l.port);
        char big[5000];
        memset(big, 'a', sizeof big);
        memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
        say(c, big, sizeof big);
        char buf[2048];
        assert_true(ends_within(c, 5000, buf, sizeof buf));
        assert_non_null(strstr(buf, "HTTP/1.1 431 "));
        close(c);
        live_stop(&l);
}

static void test_a_trickled_head_is_closed_at_its_time(void **state) {
        Live l;
        live_start(&l, 64, 8, 300);
        int c = dial(l.port);
        uint64_t t0 = time_now_mono_ms();
        say(c, "GET / HTTP/1.1\r\n", 16);
        /* A byte every 50 ms: the time runs from the start all the same. */
        bool closed = false;
        while (!closed && time_now_mono_ms() - t0 < 3000) {
                if (send(c, "X", 1, MSG_NOSIGNAL) != 1)
                        break;
                closed = ends_within(c, 50, NULL, 0);
        }
        if (!closed)
                closed = ends_within(c, 3000, NULL, 0);
        assert_true(closed);
        assert_true(time_now_mono_ms() - t0 >= 250);
        EdgeStats st;
        edge_stats(l.edge, &st);
        assert_int_equal(st.timed_out, 1);
        assert_int_equal(st.handed, 0);
        close(c);
        live_stop(&l);
}

static void test_bounds(void **state) {
        /* Two per peer: the third from the same address is closed at once. */
        Live l;
        live_start(&l, 64, 2, 10000);
        int a = dial(l.port), b = dial(l.port), c = dial(l.port);
        assert_true(ends_within(c, 3000, NULL, 0));
        EdgeStats st;
        edge_stats(l.edge, &st);
        assert_int_equal(st.refused_peer, 1);
        assert_int_equal(st.waiting, 2);
        /* The two waiting ones still go on once whole. */
        say(a, "GET / HTTP/1.1\r\n\r\n", 18);
        assert_true(handed(&l.h, 1));
        close(a);
        close(b);
        close(c);
        live_stop(&l);

        /* Three in all: a fourth makes the oldest go. */
        live_start(&l, 3, 8, 10000);
        int w[4];
        for (int i = 0; i < 3; i++)
                w[i] = dial(l.port);
        /* Each is taken in turn (the per-peer count shows them). */
        uint64_t until = time_now_mono_ms() + 3000;
        for (edge_stats(l.edge, &st); st.waiting < 3 && time_now_mono_ms() < until; edge_stats(l.edge, &st))
                usleep(1000);
        assert_int_equal(st.waiting, 3);
        w[3] = dial(l.port);
        assert_true(ends_within(w[0], 3000, NULL, 0));
        edge_stats(l.edge, &st);
        assert_int_equal(st.evicted, 1);
        say(w[3], "GET / HTTP/1.1\r\n\r\n", 18);
        assert_true(handed(&l.h, 1));
        for (int i = 0; i < 4; i++)
                close(w[i]);
        live_stop(&l);
}

static void test_a_late_next_head_is_cut(void **state) {
        Live l;
        live_start(&l, 64, 8, 300);
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        /* A server's connection in a request, then answered and idle. */
        EdgeConn *conn = edge_conn_add(l.edge, sv[0]);
        assert_non_null(conn);
        edge_conn_busy(conn);
        assert_false(ends_within(sv[1], 1200, NULL, 0)); /* busy: never cut */
        edge_conn_idle(conn);
        uint64_t t0 = time_now_mono_ms();
        assert_true(ends_within(sv[1], 3000, NULL, 0));
        assert_true(time_now_mono_ms() - t0 >= 250);
        edge_conn_remove(conn);
        close(sv[0]);
        close(sv[1]);
        /* An upgraded one is never cut. */
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        conn = edge_conn_add(l.edge, sv[0]);
        edge_conn_upgraded(conn);
        edge_conn_idle(conn);
        assert_false(ends_within(sv[1], 1200, NULL, 0));
        edge_conn_remove(conn);
        close(sv[0]);
        close(sv[1]);
        live_stop(&l);
}

typedef struct Later {
        int fd;
        const char *text;
} Later;

static void *say_later(void *arg) {
        Later *l = arg;
        usleep(100 * 1000);
        (void)!send(l->fd, l->text, strlen(l->text), MSG_NOSIGNAL);
        return NULL;
}

static void test_next_head(void **state) {
        Live l;
        live_start(&l, 64, 8, 5000);
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        /* Whole and clean: at once, and still there for the server. */
        say(sv[1], "GET / HTTP/1.1\r\n\r\n", 18);
        assert_int_equal(edge_next_head(l.edge, sv[0], 5000), 0);
        char buf[2048];
        assert_int_equal(recv(sv[0], buf, sizeof buf, MSG_DONTWAIT), 18);
        /* Nothing comes: back when the time is up. */
        uint64_t t0 = time_now_mono_ms();
        assert_int_equal(edge_next_head(l.edge, sv[0], 200), 0);
        assert_true(time_now_mono_ms() - t0 >= 150);
        /* Half now, the rest later (after the first look): waited for. */
        say(sv[1], "GET / HTTP/1.1\r\n", 16);
        Later later = { .fd = sv[1], .text = "Host: x\r\n\r\n" };
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, say_later, &later), 0);
        t0 = time_now_mono_ms();
        assert_int_equal(edge_next_head(l.edge, sv[0], 5000), 0);
        assert_true(time_now_mono_ms() - t0 < 4000);
        pthread_join(th, NULL);
        assert_int_equal(recv(sv[0], buf, sizeof buf, MSG_DONTWAIT), 27);
        /* A NUL: answered 400, read, and the connection shut down. */
        const char nul[] = "GET / HTTP/1.1\r\nX: a\0b\r\n\r\n";
        say(sv[1], nul, sizeof nul - 1);
        assert_int_equal(edge_next_head(l.edge, sv[0], 5000), -EBADMSG);
        assert_true(ends_within(sv[1], 3000, buf, sizeof buf));
        assert_non_null(strstr(buf, "HTTP/1.1 400 "));
        assert_int_equal(recv(sv[0], buf, sizeof buf, MSG_DONTWAIT), 0);
        close(sv[0]);
        close(sv[1]);
        live_stop(&l);
}

static void test_a_whole_head_waits_for_room(void **state) {
        Live l;
        live_start_held(&l, 64, 8, 600, 1);
        atomic_store(&l.h.held, 1);
        int c = dial(l.port);
        say(c, "GET / HTTP/1.1\r\n\r\n", 18);
        /* The server holds all it may: not handed on yet. */
        EdgeStats st;
        uint64_t until = time_now_mono_ms() + 3000;
        for (edge_stats(l.edge, &st); st.ready < 1 && time_now_mono_ms() < until; edge_stats(l.edge, &st))
                usleep(1000);
        assert_int_equal(st.ready, 1);
        assert_int_equal(l.h.n, 0);
        /* Room again, and the server says a connection closed: handed on. */
        atomic_store(&l.h.held, 0);
        edge_server_closed(l.edge);
        assert_true(handed(&l.h, 1));
        close(c);
        /* No room until its time is up: a 503. */
        atomic_store(&l.h.held, 1);
        c = dial(l.port);
        say(c, "GET / HTTP/1.1\r\n\r\n", 18);
        char buf[2048];
        assert_true(ends_within(c, 5000, buf, sizeof buf));
        assert_non_null(strstr(buf, "HTTP/1.1 503 "));
        assert_int_equal(l.h.n, 1);
        close(c);
        live_stop(&l);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_head_end),
                cmocka_unit_test(test_whole_heads_are_handed_on),
                cmocka_unit_test(test_a_nul_is_answered_400),
                cmocka_unit_test(test_a_head_too_long_is_431),
                cmocka_unit_test(test_a_trickled_head_is_closed_at_its_time),
                cmocka_unit_test(test_bounds),
                cmocka_unit_test(test_a_late_next_head_is_cut),
                cmocka_unit_test(test_next_head),
                cmocka_unit_test(test_a_whole_head_waits_for_room),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
