/*
 * The agent heartbeat of the daemon's channel (channel_heartbeat) against a
 * scripted peer on a socketpair, and the console tail that ends a failed
 * sandbox's reason (console_tail_*): hostile bytes in, valid bounded UTF-8
 * out.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/timeutil.h"
#include "daemon/manager/channel.h"
#include "daemon/manager/console_tail.h"
#include "proto/proto.h"

#define FFFD "\xef\xbf\xbd"

static void sleep_ms(int ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
}

/* ---- console tail ---- */

static void assert_valid_json_string(const char *s) {
        json_t *j = json_string(s);
        assert_non_null(j); /* jansson refuses invalid UTF-8 */
        json_decref(j);
        for (const unsigned char *p = (const unsigned char *)s; *p; p++)
                assert_true(*p == '\n' || (*p >= 0x20 && *p != 0x7f));
}

static void assert_tail(const char *in, size_t len, bool partial, size_t out_size, const char *want) {
        char out[4096];
        assert_true(out_size <= sizeof out);
        size_t n = console_tail_sanitize((const uint8_t *)in, len, CONSOLE_TAIL_LINES, partial, out, out_size);
        assert_int_equal(n, strlen(out));
        assert_string_equal(out, want);
        assert_valid_json_string(out);
}

static void test_tail_last_lines(void **state) {
        const char *in = "l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\nl9\nl10\n";
        assert_tail(in, strlen(in), false, 1025, "l3\nl4\nl5\nl6\nl7\nl8\nl9\nl10");
        /* Serial consoles end lines with \r\n; blank lines do not count. */
        const char *crlf = "a\r\n\r\n   \r\nb\r\n\tc\t\r\n";
        assert_tail(crlf, strlen(crlf), false, 1025, "a\nb\n c");
        assert_tail("", 0, false, 1025, "");
        assert_tail("\n\n \n", 4, false, 1025, "");
        /* No final newline: the last line still counts. */
        assert_tail("x\ny", 3, false, 1025, "x\ny");
}

static void test_tail_partial_first(void **state) {
        const char *in = "ut of a line\nwhole one\nlast\n";
        assert_tail(in, strlen(in), true, 1025, "whole one\nlast");
        /* A single line with no break is kept even when cut. */
        assert_tail("only", 4, true, 1025, "only");
        /* A cut in the middle of a character is inside the dropped line. */
        const char *cut = "\xa9 caf\xc3\xa9\nnext\n";
        assert_tail(cut, strlen(cut), true, 1025, "next");
}

static void test_tail_hostile_bytes(void **state) {
        /* C0 controls, DEL, an ANSI escape, NUL, C1 controls (U+0085), bad
         * and overlong sequences, a surrogate, beyond U+10FFFF, a truncated
         * sequence at the end. */
        const char in[] = "a\x01" "b\x7f" "c\x1b[0m" "d\0e" "\xc2\x85" "f\xff" "g\xc0\xaf" "h\xed\xa0\x80"
                          "i\xf4\x90\x80\x80" "j\xe2\x82";
        assert_tail(in, sizeof in - 1, false, 1025,
                    "a?b?c?[0md?e?f" FFFD "g" FFFD FFFD "h" FFFD FFFD FFFD "i" FFFD FFFD FFFD FFFD "j" FFFD FFFD);
        /* Valid multibyte text passes unchanged. */
        const char ok[] = "Kernel panic - not syncing: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0";
        assert_tail(ok, sizeof ok - 1, false, 1025, ok);
}

static void test_tail_headline(void **state) {
        /* A panic's line, then more register dump than fits in eight lines:
         * it comes first, then the last seven. */
        const char *in = "[1] sysrq: Trigger a crash\n[1] Kernel panic - not syncing: sysrq triggered crash\n"
                         "r1\nr2\nr3\nr4\nr5\nr6\nr7\nr8\nr9\n";
        assert_tail(in, strlen(in), false, 1025,
                    "[1] Kernel panic - not syncing: sysrq triggered crash\nr3\nr4\nr5\nr6\nr7\nr8\nr9");
        /* Among the last lines already: nothing moves. */
        const char *near = "a\nb\nOops: 0002\nc\n";
        assert_tail(near, strlen(near), false, 1025, "a\nb\nOops: 0002\nc");
        /* The newest of several. */
        const char *two = "BUG: one\nx\nBUG: two\n1\n2\n3\n4\n5\n6\n7\n8\n";
        assert_tail(two, strlen(two), false, 1025, "BUG: two\n2\n3\n4\n5\n6\n7\n8");
        /* A long headline gets at most a quarter of the room; the lines after
         * it still show. */
        char big[2000];
        memcpy(big, "Kernel panic ", 13);
        memset(big + 13, 'x', 1500);
        memcpy(big + 1513, "\na\nb\nc\nd\ne\nf\ng\nh\n", 16);
        char out[CONSOLE_TAIL_MAX + 1];
        size_t n = console_tail_sanitize((const uint8_t *)big, 1529, CONSOLE_TAIL_LINES, false, out, sizeof out);
        assert_true(n <= CONSOLE_TAIL_MAX);
        assert_int_equal(strncmp(out, "Kernel panic xxx", 16), 0);
        assert_non_null(strstr(out, "\nb\nc\nd\ne\nf\ng\nh"));
        assert_true(strchr(out, '\n') - out <= (CONSOLE_TAIL_MAX) / 4);
        assert_valid_json_string(out);
}

static void test_tail_bounded(void **state) {
        /* Eight long lines: only the newest whole lines that fit. */
        char in[8 * 301 + 1];
        size_t o = 0;
        for (int i = 0; i < 8; i++) {
                memset(in + o, 'a' + i, 300);
                o += 300;
                in[o++] = '\n';
        }
        char out[CONSOLE_TAIL_MAX + 1];
        size_t n = console_tail_sanitize((const uint8_t *)in, o, CONSOLE_TAIL_LINES, false, out, sizeof out);
        assert_true(n <= CONSOLE_TAIL_MAX);
        assert_int_equal(n, 3 * 300 + 2);
        assert_int_equal(out[0], 'f');
        assert_int_equal(out[n - 1], 'h');
        assert_valid_json_string(out);

        /* One line longer than the bound, of 3-byte characters and invalid
         * bytes: its end is kept, cut at a character boundary. */
        char big[3000];
        for (size_t i = 0; i + 3 <= sizeof big; i += 3)
                memcpy(big + i, (i / 3) % 5 == 0 ? "\xff\xfe\x80" : "\xe2\x82\xac", 3);
        n = console_tail_sanitize((const uint8_t *)big, sizeof big, CONSOLE_TAIL_LINES, false, out, sizeof out);
        assert_true(n <= CONSOLE_TAIL_MAX && n > CONSOLE_TAIL_MAX - 4);
        assert_valid_json_string(out);

        /* Tiny buffers never overflow. */
        char small[5];
        n = console_tail_sanitize((const uint8_t *)"\xe2\x82\xac\xe2\x82\xac", 6, 8, false, small, sizeof small);
        assert_int_equal(n, 3);
        assert_string_equal(small, "\xe2\x82\xac");
        n = console_tail_sanitize((const uint8_t *)"abc", 3, 8, false, small, 1);
        assert_int_equal(n, 0);
        assert_string_equal(small, "");
}

static void test_tail_random_bytes(void **state) {
        /* Whatever the guest writes, the result is valid and bounded. */
        srand(12345);
        static uint8_t buf[CONSOLE_TAIL_READ];
        char out[CONSOLE_TAIL_MAX + 1];
        for (int round = 0; round < 2000; round++) {
                size_t n = (size_t)rand() % sizeof buf;
                for (size_t i = 0; i < n; i++)
                        buf[i] = (uint8_t)(rand() % 7 == 0 ? '\n' : rand());
                size_t len = console_tail_sanitize(buf, n, CONSOLE_TAIL_LINES, round & 1, out, sizeof out);
                assert_true(len <= CONSOLE_TAIL_MAX);
                assert_int_equal(len, strlen(out));
                assert_valid_json_string(out);
                size_t lines = 1;
                for (size_t i = 0; i < len; i++)
                        lines += out[i] == '\n';
                assert_true(len == 0 || lines <= CONSOLE_TAIL_LINES);
        }
}

static void test_tail_read(void **state) {
        char dir[] = "/tmp/test-console-tail-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[256], link[256], out[CONSOLE_TAIL_MAX + 1];
        snprintf(path, sizeof path, "%s/console.log", dir);
        snprintf(link, sizeof link, "%s/link.log", dir);

        assert_int_equal(console_tail_read(dir, "console.log", out, sizeof out), -ENOENT);

        /* A big log: only its end is read, and the cut first line dropped. */
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        for (int i = 0; i < 5000; i++)
                fprintf(f, "boot line %d\r\n", i);
        fprintf(f, "Kernel panic - not syncing: sysrq triggered crash\r\n\x1b[0m\r\n");
        fclose(f);
        assert_int_equal(console_tail_read(dir, "console.log", out, sizeof out), 0);
        assert_string_equal(out, "boot line 4994\nboot line 4995\nboot line 4996\n"
                                 "boot line 4997\nboot line 4998\nboot line 4999\n"
                                 "Kernel panic - not syncing: sysrq triggered crash\n?[0m");

        /* Symlinks are not followed, names with a slash refused. */
        assert_int_equal(symlink("/etc/passwd", link), 0);
        assert_int_equal(console_tail_read(dir, "link.log", out, sizeof out), -ELOOP);
        assert_int_equal(console_tail_read(dir, "../console.log", out, sizeof out), -EINVAL);
        assert_string_equal(out, "");

        unlink(link);
        unlink(path);
        /* Not a regular file. */
        assert_int_equal(mkdir(path, 0700), 0);
        assert_int_equal(console_tail_read(dir, "console.log", out, sizeof out), -EINVAL);
        rmdir(path);
        rmdir(dir);
}

/* ---- heartbeat ---- */

typedef struct Peer {
        int fd;     /* the agent's end */
        int raw;    /* a duplicate of the daemon's end, to fill its socket */
        Channel *c;
} Peer;

static void on_closed(void *userdata, const char *reason) {
}

static int peer_setup(void **state) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        Peer *p = calloc(1, sizeof *p);
        p->fd = sv[1];
        p->raw = fcntl(sv[0], F_DUPFD_CLOEXEC, 0);
        p->c = channel_new(sv[0], on_closed, NULL);
        assert_non_null(p->c);
        *state = p;
        return 0;
}

static int peer_teardown(void **state) {
        Peer *p = *state;
        channel_free(p->c);
        close(p->raw);
        if (p->fd >= 0)
                close(p->fd);
        free(p);
        return 0;
}

/* The next frame the daemon sent, within timeout_ms; false when none. */
static bool peer_read(Peer *p, int timeout_ms, ProtoHeader *h, uint8_t *payload, size_t cap) {
        uint8_t hdr[PROTO_HEADER_SIZE];
        size_t got = 0;
        while (got < sizeof hdr) {
                struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
                if (poll(&pfd, 1, timeout_ms) != 1)
                        return false;
                ssize_t n = read(p->fd, hdr + got, sizeof hdr - got);
                if (n <= 0)
                        return false;
                got += (size_t)n;
        }
        assert_int_equal(proto_header_decode(hdr, h), 0);
        assert_true(h->length <= cap);
        for (got = 0; got < h->length;) {
                ssize_t n = read(p->fd, payload + got, h->length - got);
                assert_true(n > 0);
                got += (size_t)n;
        }
        return true;
}

static void test_hb_answered(void **state) {
        Peer *p = *state;
        int64_t t0 = (int64_t)time_now_mono_ms();
        assert_int_equal(channel_heartbeat(p->c, t0, 5000, 1000), 0);
        ProtoHeader h;
        uint8_t buf[64];
        assert_true(peer_read(p, 2000, &h, buf, sizeof buf));
        assert_int_equal(h.type, PROTO_PING);
        assert_int_equal(h.length, 8);
        /* No second ping while one is awaited. */
        assert_int_equal(channel_heartbeat(p->c, t0 + 10, 1, 1000), 0);
        assert_false(peer_read(p, 100, &h, buf, sizeof buf));
        assert_int_equal(proto_write_frame(p->fd, PROTO_PONG, 0, 0, buf, 8), 0);
        sleep_ms(100);
        /* Answered: well past the deadline since the ping, still alive, and
         * the next ping goes out (the interval is over). */
        int64_t t1 = t0 + 3000;
        assert_int_equal(channel_heartbeat(p->c, t1, 2000, 1000), 0);
        assert_true(peer_read(p, 2000, &h, buf, sizeof buf));
        assert_int_equal(h.type, PROTO_PING);
        /* This one is never answered: dead once the deadline passed since
         * it went out, not before. */
        assert_int_equal(channel_heartbeat(p->c, t1 + 999, 2000, 1000), 0);
        assert_int_equal(channel_heartbeat(p->c, t1 + 1000, 2000, 1000), -ETIMEDOUT);
        assert_true(channel_is_open(p->c));
}

static void test_hb_any_frame_is_life(void **state) {
        Peer *p = *state;
        int64_t t0 = (int64_t)time_now_mono_ms();
        assert_int_equal(channel_heartbeat(p->c, t0, 5000, 1000), 0);
        ProtoHeader h;
        uint8_t buf[64];
        assert_true(peer_read(p, 2000, &h, buf, sizeof buf));
        assert_int_equal(h.type, PROTO_PING);
        /* No PONG, but the agent is busy talking (a WINDOW for a stream that
         * is gone: ignored, yet a sign of life). */
        sleep_ms(300);
        uint8_t win[4] = {0, 0, 1, 0};
        assert_int_equal(proto_write_frame(p->fd, PROTO_WINDOW, 0, 7, win, 4), 0);
        sleep_ms(100);
        int64_t t1 = (int64_t)time_now_mono_ms();
        assert_int_equal(channel_heartbeat(p->c, t0 + 1100, 5000, 1000), 0);
        assert_int_equal(channel_heartbeat(p->c, t1 + 1000, 5000, 1000), -ETIMEDOUT);
}

static void test_hb_full_socket_never_blocks(void **state) {
        Peer *p = *state;
        /* The agent reads nothing: fill the daemon's sending side. */
        static uint8_t junk[4096];
        size_t filled = 0;
        for (;;) {
                ssize_t n = send(p->raw, junk, sizeof junk, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (n < 0) {
                        assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
                        break;
                }
                filled += (size_t)n;
        }
        assert_true(filled > 0);
        int64_t t0 = (int64_t)time_now_mono_ms();
        assert_int_equal(channel_heartbeat(p->c, t0, 5000, 1000), 0);
        assert_int_equal(channel_heartbeat(p->c, t0 + 999, 5000, 1000), 0);
        /* Not sent, yet due since t0: the silence counts. */
        assert_int_equal(channel_heartbeat(p->c, t0 + 1000, 5000, 1000), -ETIMEDOUT);
        assert_true((int64_t)time_now_mono_ms() - t0 < 500);
        assert_true(channel_is_open(p->c));
}

static void test_hb_closed(void **state) {
        Peer *p = *state;
        close(p->fd);
        p->fd = -1;
        int64_t t0 = (int64_t)time_now_mono_ms();
        int r = 0;
        while (r == 0 && (int64_t)time_now_mono_ms() - t0 < 5000) {
                r = channel_heartbeat(p->c, (int64_t)time_now_mono_ms(), 1, 100000);
                sleep_ms(20);
        }
        assert_int_equal(r, -EPIPE);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_tail_last_lines),
                cmocka_unit_test(test_tail_partial_first),
                cmocka_unit_test(test_tail_hostile_bytes),
                cmocka_unit_test(test_tail_headline),
                cmocka_unit_test(test_tail_bounded),
                cmocka_unit_test(test_tail_random_bytes),
                cmocka_unit_test(test_tail_read),
                cmocka_unit_test_setup_teardown(test_hb_answered, peer_setup, peer_teardown),
                cmocka_unit_test_setup_teardown(test_hb_any_frame_is_life, peer_setup, peer_teardown),
                cmocka_unit_test_setup_teardown(test_hb_full_socket_never_blocks, peer_setup, peer_teardown),
                cmocka_unit_test_setup_teardown(test_hb_closed, peer_setup, peer_teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
