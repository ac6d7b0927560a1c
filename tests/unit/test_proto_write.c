/* proto_write_frame's one-call path (header and payload gathered into one
 * sendmsg, or writev on a descriptor that is no socket) under short writes:
 * a tiny pipe and a socket with a small send buffer, both drained slowly,
 * must still carry every frame whole and in order. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/proto.h"

typedef struct Drain {
        int fd;
        uint8_t *buf;
        size_t len, cap;
} Drain;

/* Reads in small pieces with pauses, so that the writer keeps meeting a
 * full pipe or socket and has to resume mid-frame. */
static void *drain_main(void *arg) {
        Drain *d = arg;
        for (;;) {
                if (d->len + 1500 > d->cap) {
                        d->cap = d->cap ? 2 * d->cap : 1 << 20;
                        d->buf = realloc(d->buf, d->cap);
                        if (!d->buf)
                                return NULL;
                }
                ssize_t n = read(d->fd, d->buf + d->len, 1500);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return NULL;
                d->len += (size_t)n;
                if (d->len % 7 == 0) {
                        struct timespec ts = {0, 100000};
                        nanosleep(&ts, NULL);
                }
        }
}

static void check_frames(const Drain *d, const uint8_t *payload) {
        ProtoReader *r = proto_reader_new();
        assert_non_null(r);
        ProtoHeader h;
        const uint8_t *p;
        size_t off = 0;
        int frames = 0;
        /* Fed in odd-sized pieces, as reads would return them. */
        while (off < d->len) {
                size_t n = d->len - off < 4093 ? d->len - off : 4093;
                assert_int_equal(proto_reader_feed(r, d->buf + off, n), 0);
                off += n;
                int k;
                while ((k = proto_reader_next(r, &h, &p)) == 1) {
                        switch (frames) {
                        case 0:
                        case 2:
                                assert_int_equal(h.type, PROTO_DATA);
                                assert_int_equal(h.stream, 3 + frames);
                                assert_int_equal(h.length, PROTO_MAX_PAYLOAD);
                                assert_memory_equal(p, payload, PROTO_MAX_PAYLOAD);
                                break;
                        case 1:
                                assert_int_equal(h.type, PROTO_WINDOW);
                                assert_int_equal(proto_get_u32(p), 12345u);
                                break;
                        case 3:
                                assert_int_equal(h.type, PROTO_DATA);
                                assert_int_equal(h.length, 4097);
                                assert_memory_equal(p, payload + 1, 4097);
                                break;
                        default:
                                fail();
                        }
                        frames++;
                }
                assert_int_equal(k, 0);
        }
        assert_int_equal(frames, 4);
        proto_reader_free(r);
}

static void write_frames(int fd, const uint8_t *payload) {
        uint8_t w[4];
        proto_put_u32(w, 12345u);
        assert_int_equal(proto_write_frame(fd, PROTO_DATA, PROTO_FD_OUT, 3, payload, PROTO_MAX_PAYLOAD), 0);
        assert_int_equal(proto_write_frame(fd, PROTO_WINDOW, 0, 4, w, 4), 0);
        assert_int_equal(proto_write_frame(fd, PROTO_DATA, PROTO_FD_IN, 5, payload, PROTO_MAX_PAYLOAD), 0);
        assert_int_equal(proto_write_frame(fd, PROTO_DATA, PROTO_FD_ERR, 6, payload + 1, 4097), 0);
}

static uint8_t *pattern(void) {
        uint8_t *p = malloc(PROTO_MAX_PAYLOAD + 1);
        assert_non_null(p);
        for (size_t i = 0; i < PROTO_MAX_PAYLOAD + 1; i++)
                p[i] = (uint8_t)(i * 131u + (i >> 9));
        return p;
}

static void test_pipe_short_writes(void **state) {
        int pp[2];
        assert_int_equal(pipe(pp), 0);
        (void)fcntl(pp[1], F_SETPIPE_SZ, 4096);
        uint8_t *payload = pattern();
        Drain d = {.fd = pp[0]};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, drain_main, &d), 0);
        write_frames(pp[1], payload);
        close(pp[1]);
        pthread_join(th, NULL);
        close(pp[0]);
        check_frames(&d, payload);
        free(d.buf);
        free(payload);
}

static void test_socket_short_writes(void **state) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        int small = 4096;
        (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
        (void)setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        uint8_t *payload = pattern();
        Drain d = {.fd = sv[1]};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, drain_main, &d), 0);
        write_frames(sv[0], payload);
        close(sv[0]);
        pthread_join(th, NULL);
        close(sv[1]);
        check_frames(&d, payload);
        free(d.buf);
        free(payload);
}

static void test_closed_peer_is_an_error(void **state) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        close(sv[1]);
        uint8_t *payload = pattern();
        /* EPIPE, not a SIGPIPE that kills the test. */
        assert_int_equal(proto_write_frame(sv[0], PROTO_DATA, PROTO_FD_OUT, 1, payload, PROTO_MAX_PAYLOAD), -EPIPE);
        assert_int_equal(proto_write_frame(sv[0], PROTO_DATA, PROTO_FD_OUT, 1, payload, 10), -EPIPE);
        close(sv[0]);
        assert_int_equal(proto_write_frame(-1, PROTO_DATA, PROTO_FD_OUT, 1, payload, 5000), -EBADF);
        assert_int_equal(proto_write_frame(3, PROTO_DATA, PROTO_FD_OUT, 1, payload, PROTO_MAX_PAYLOAD + 1), -EINVAL);
        free(payload);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_pipe_short_writes),
                cmocka_unit_test(test_socket_short_writes),
                cmocka_unit_test(test_closed_peer_is_an_error),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
