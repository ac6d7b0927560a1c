/* The channel codec (src/proto/proto.c): headers, the incremental reader and
 * frame writers. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/proto.h"

static void raw_header(uint8_t out[PROTO_HEADER_SIZE], uint32_t length, uint32_t stream, uint8_t type,
                       uint8_t flags, uint8_t r0, uint8_t r1) {
        proto_put_u32(out, length);
        proto_put_u32(out + 4, stream);
        out[8] = type;
        out[9] = flags;
        out[10] = r0;
        out[11] = r1;
}

static void test_u32(void **state) {
        uint8_t b[4];
        proto_put_u32(b, 0x01020304u);
        assert_int_equal(b[0], 1);
        assert_int_equal(b[3], 4);
        assert_int_equal(proto_get_u32(b), 0x01020304u);
        proto_put_u32(b, 0xffffffffu);
        assert_int_equal(proto_get_u32(b), 0xffffffffu);
}

static void test_header_round_trip(void **state) {
        static const ProtoHeader valid[] = {
                {.length = 20, .stream = 0, .type = PROTO_HELLO},
                {.length = PROTO_MAX_JSON, .stream = 1, .type = PROTO_OPEN},
                {.length = PROTO_MAX_PAYLOAD, .stream = 3, .type = PROTO_DATA, .flags = PROTO_FD_IN},
                {.length = 0, .stream = 0xfffffffeu, .type = PROTO_DATA, .flags = PROTO_FD_ERR},
                {.length = 0, .stream = 5, .type = PROTO_EOF, .flags = PROTO_FD_OUT},
                {.length = 4, .stream = 7, .type = PROTO_WINDOW},
                {.length = 100, .stream = 9, .type = PROTO_EVENT},
                {.length = 0, .stream = 11, .type = PROTO_RESULT},
                {.length = 0, .stream = 13, .type = PROTO_CANCEL},
                {.length = 64, .stream = 0, .type = PROTO_PING},
                {.length = 0, .stream = 0, .type = PROTO_PONG},
        };
        for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
                uint8_t buf[PROTO_HEADER_SIZE];
                ProtoHeader back;
                assert_int_equal(proto_header_encode(&valid[i], buf), 0);
                assert_int_equal(buf[10], 0);
                assert_int_equal(buf[11], 0);
                assert_int_equal(proto_header_decode(buf, &back), 0);
                assert_int_equal(back.length, valid[i].length);
                assert_int_equal(back.stream, valid[i].stream);
                assert_int_equal(back.type, valid[i].type);
                assert_int_equal(back.flags, valid[i].flags);
        }
        /* Big-endian on the wire. */
        uint8_t buf[PROTO_HEADER_SIZE];
        ProtoHeader h = {.length = 0x0102, .stream = 0x0a0b0c0d, .type = PROTO_EVENT};
        assert_int_equal(proto_header_encode(&h, buf), 0);
        static const uint8_t want[] = {0, 0, 1, 2, 0x0a, 0x0b, 0x0c, 0x0d, PROTO_EVENT, 0, 0, 0};
        assert_memory_equal(buf, want, sizeof want);
}

static void test_header_malformed(void **state) {
        struct {
                uint32_t length, stream;
                uint8_t type, flags, r0, r1;
        } bad[] = {
                /* unknown types */
                {0, 1, 0, 0, 0, 0},
                {0, 1, _PROTO_TYPE_MAX, 0, 0, 0},
                {0, 1, 255, 0, 0, 0},
                /* lengths above the type's bound */
                {PROTO_MAX_PAYLOAD + 1, 1, PROTO_DATA, 0, 0, 0},
                {0xffffffffu, 1, PROTO_DATA, 0, 0, 0},
                {PROTO_MAX_JSON + 1, 1, PROTO_OPEN, 0, 0, 0},
                {PROTO_MAX_JSON + 1, 1, PROTO_EVENT, 0, 0, 0},
                {PROTO_MAX_JSON + 1, 1, PROTO_RESULT, 0, 0, 0},
                {PROTO_MAX_JSON + 1, 0, PROTO_HELLO, 0, 0, 0},
                {PROTO_MAX_JSON + 1, 0, PROTO_PING, 0, 0, 0},
                {1, 1, PROTO_EOF, 0, 0, 0},
                {1, 1, PROTO_CANCEL, 0, 0, 0},
                {0, 1, PROTO_WINDOW, 0, 0, 0},
                {3, 1, PROTO_WINDOW, 0, 0, 0},
                {5, 1, PROTO_WINDOW, 0, 0, 0},
                /* flags out of range */
                {1, 1, PROTO_DATA, 3, 0, 0},
                {0, 1, PROTO_EOF, 0xff, 0, 0},
                {2, 1, PROTO_OPEN, 1, 0, 0},
                {4, 1, PROTO_WINDOW, 1, 0, 0},
                {0, 0, PROTO_PING, 1, 0, 0},
                /* reserved bytes */
                {0, 1, PROTO_DATA, 0, 1, 0},
                {0, 1, PROTO_DATA, 0, 0, 1},
                /* channel-level types on a stream and the reverse */
                {2, 1, PROTO_HELLO, 0, 0, 0},
                {0, 7, PROTO_PING, 0, 0, 0},
                {0, 7, PROTO_PONG, 0, 0, 0},
                {2, 0, PROTO_OPEN, 0, 0, 0},
                {1, 0, PROTO_DATA, 0, 0, 0},
                {0, 0, PROTO_EOF, 0, 0, 0},
                {4, 0, PROTO_WINDOW, 0, 0, 0},
                {0, 0, PROTO_CANCEL, 0, 0, 0},
                {2, 0, PROTO_RESULT, 0, 0, 0},
                {2, 0, PROTO_EVENT, 0, 0, 0},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                uint8_t buf[PROTO_HEADER_SIZE];
                raw_header(buf, bad[i].length, bad[i].stream, bad[i].type, bad[i].flags, bad[i].r0,
                           bad[i].r1);
                ProtoHeader h = {.length = 12345};
                if (proto_header_decode(buf, &h) != -EPROTO)
                        fail_msg("bad header %zu decoded", i);
                assert_int_equal(h.length, 12345); /* untouched on failure */
                if (bad[i].r0 == 0 && bad[i].r1 == 0) {
                        ProtoHeader e = {.length = bad[i].length,
                                         .stream = bad[i].stream,
                                         .type = bad[i].type,
                                         .flags = bad[i].flags};
                        if (proto_header_encode(&e, buf) != -EINVAL)
                                fail_msg("bad header %zu encoded", i);
                }
        }
        assert_int_equal(proto_header_encode(NULL, (uint8_t[PROTO_HEADER_SIZE]){0}), -EINVAL);
}

/* Three frames back to back. */
static size_t build_stream(uint8_t *out) {
        size_t n = 0;
        uint8_t *f;
        size_t len;
        assert_int_equal(proto_frame_build(PROTO_OPEN, 0, 1, "{\"op\":\"stat\"}", 13, &f, &len), 0);
        memcpy(out + n, f, len);
        n += len;
        free(f);
        assert_int_equal(proto_frame_build(PROTO_EOF, PROTO_FD_IN, 1, NULL, 0, &f, &len), 0);
        memcpy(out + n, f, len);
        n += len;
        free(f);
        uint8_t w[4];
        proto_put_u32(w, 65536);
        assert_int_equal(proto_frame_build(PROTO_WINDOW, 0, 3, w, 4, &f, &len), 0);
        memcpy(out + n, f, len);
        n += len;
        free(f);
        return n;
}

static void check_frames(ProtoHeader *h, const uint8_t **p, int i) {
        switch (i) {
        case 0:
                assert_int_equal(h->type, PROTO_OPEN);
                assert_int_equal(h->stream, 1);
                assert_int_equal(h->length, 13);
                assert_memory_equal(*p, "{\"op\":\"stat\"}", 13);
                break;
        case 1:
                assert_int_equal(h->type, PROTO_EOF);
                assert_int_equal(h->flags, PROTO_FD_IN);
                assert_int_equal(h->length, 0);
                break;
        case 2:
                assert_int_equal(h->type, PROTO_WINDOW);
                assert_int_equal(h->stream, 3);
                assert_int_equal(proto_get_u32(*p), 65536);
                break;
        default:
                fail();
        }
}

static void test_reader_byte_at_a_time(void **state) {
        uint8_t bytes[256];
        size_t n = build_stream(bytes);
        ProtoReader *r = proto_reader_new();
        assert_non_null(r);
        int seen = 0;
        for (size_t i = 0; i < n; i++) {
                assert_int_equal(proto_reader_feed(r, bytes + i, 1), 0);
                ProtoHeader h;
                const uint8_t *p;
                int k;
                while ((k = proto_reader_next(r, &h, &p)) == 1)
                        check_frames(&h, &p, seen++);
                assert_int_equal(k, 0);
        }
        assert_int_equal(seen, 3);
        /* Empty feeds are harmless. */
        assert_int_equal(proto_reader_feed(r, NULL, 0), 0);
        ProtoHeader h;
        const uint8_t *p;
        assert_int_equal(proto_reader_next(r, &h, &p), 0);
        proto_reader_free(r);
        proto_reader_free(NULL);
}

static void test_reader_all_at_once(void **state) {
        uint8_t bytes[256];
        size_t n = build_stream(bytes);
        ProtoReader *r = proto_reader_new();
        assert_int_equal(proto_reader_feed(r, bytes, n), 0);
        ProtoHeader h;
        const uint8_t *p;
        for (int i = 0; i < 3; i++) {
                assert_int_equal(proto_reader_next(r, &h, &p), 1);
                check_frames(&h, &p, i);
        }
        assert_int_equal(proto_reader_next(r, &h, &p), 0);
        proto_reader_free(r);
}

static void test_reader_oversized_and_sticky(void **state) {
        ProtoReader *r = proto_reader_new();
        uint8_t bytes[256];
        size_t n = build_stream(bytes);
        assert_int_equal(proto_reader_feed(r, bytes, n), 0);
        /* A DATA header announcing one byte more than the maximum: malformed
         * as soon as the header is in, without waiting for (or allocating)
         * the payload. */
        uint8_t hdr[PROTO_HEADER_SIZE];
        raw_header(hdr, PROTO_MAX_PAYLOAD + 1, 1, PROTO_DATA, PROTO_FD_IN, 0, 0);
        assert_int_equal(proto_reader_feed(r, hdr, sizeof hdr), 0);
        ProtoHeader h;
        const uint8_t *p;
        /* The good frames before it still come out. */
        for (int i = 0; i < 3; i++) {
                assert_int_equal(proto_reader_next(r, &h, &p), 1);
                check_frames(&h, &p, i);
        }
        assert_int_equal(proto_reader_next(r, &h, &p), -EPROTO);
        /* Sticky: a valid frame afterwards changes nothing. */
        assert_int_equal(proto_reader_feed(r, bytes, n), -EPROTO);
        assert_int_equal(proto_reader_next(r, &h, &p), -EPROTO);
        proto_reader_free(r);

        /* The largest valid DATA frame goes through, fed in odd pieces. */
        r = proto_reader_new();
        uint8_t *f;
        size_t len;
        uint8_t *payload = malloc(PROTO_MAX_PAYLOAD);
        for (size_t i = 0; i < PROTO_MAX_PAYLOAD; i++)
                payload[i] = (uint8_t)(i * 31);
        assert_int_equal(
                proto_frame_build(PROTO_DATA, PROTO_FD_OUT, 9, payload, PROTO_MAX_PAYLOAD, &f, &len), 0);
        assert_int_equal(len, PROTO_HEADER_SIZE + PROTO_MAX_PAYLOAD);
        for (size_t off = 0; off < len;) {
                size_t chunk = len - off < 4093 ? len - off : 4093;
                assert_int_equal(proto_reader_feed(r, f + off, chunk), 0);
                off += chunk;
                int k = proto_reader_next(r, &h, &p);
                if (off < len)
                        assert_int_equal(k, 0);
                else {
                        assert_int_equal(k, 1);
                        assert_int_equal(h.length, PROTO_MAX_PAYLOAD);
                        assert_memory_equal(p, payload, PROTO_MAX_PAYLOAD);
                }
        }
        free(f);
        free(payload);
        proto_reader_free(r);

        /* Garbage right at the start. */
        r = proto_reader_new();
        uint8_t junk[PROTO_HEADER_SIZE];
        memset(junk, 0xff, sizeof junk);
        assert_int_equal(proto_reader_feed(r, junk, 11), 0);
        assert_int_equal(proto_reader_next(r, &h, &p), 0); /* header incomplete */
        assert_int_equal(proto_reader_feed(r, junk + 11, 1), 0);
        assert_int_equal(proto_reader_next(r, &h, &p), -EPROTO);
        proto_reader_free(r);
}

static void test_frame_build_rejects(void **state) {
        uint8_t *f = NULL;
        size_t len = 0;
        static uint8_t big[PROTO_MAX_PAYLOAD + 1];
        assert_int_equal(proto_frame_build(PROTO_DATA, 0, 1, big, sizeof big, &f, &len), -EINVAL);
        assert_int_equal(proto_frame_build(PROTO_DATA, 0, 1, NULL, 1, &f, &len), -EINVAL);
        assert_int_equal(proto_frame_build(PROTO_EOF, 0, 1, "x", 1, &f, &len), -EINVAL);
        assert_int_equal(proto_frame_build(PROTO_PING, 0, 1, NULL, 0, &f, &len), -EINVAL);
        assert_int_equal(proto_frame_build(0, 0, 1, NULL, 0, &f, &len), -EINVAL);
        assert_null(f);
        assert_int_equal(proto_write_frame(-1, PROTO_DATA, 0, 1, big, sizeof big), -EINVAL);
        assert_int_equal(proto_write_frame(-1, PROTO_DATA, 7, 1, NULL, 0), -EINVAL);
}

typedef struct Sink {
        int fd;
        uint8_t *buf;
        size_t len;
} Sink;

static void *sink_main(void *arg) {
        Sink *s = arg;
        uint8_t tmp[65536];
        ssize_t n;
        while ((n = read(s->fd, tmp, sizeof tmp)) > 0) {
                s->buf = realloc(s->buf, s->len + (size_t)n);
                memcpy(s->buf + s->len, tmp, (size_t)n);
                s->len += (size_t)n;
        }
        return NULL;
}

static void test_write_frame(void **state) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        Sink sink = {.fd = sv[1]};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, sink_main, &sink), 0);
        uint8_t *payload = malloc(200000);
        for (size_t i = 0; i < 200000; i++)
                payload[i] = (uint8_t)(i ^ (i >> 8));
        /* A small frame (one write) and a large one (header, then payload). */
        assert_int_equal(proto_write_frame(sv[0], PROTO_PING, 0, 0, "12345678", 8), 0);
        assert_int_equal(proto_write_frame(sv[0], PROTO_DATA, PROTO_FD_ERR, 77, payload, 200000), 0);
        assert_int_equal(proto_write_frame(sv[0], PROTO_CANCEL, 0, 77, NULL, 0), 0);
        close(sv[0]);
        pthread_join(th, NULL);
        close(sv[1]);

        ProtoReader *r = proto_reader_new();
        assert_int_equal(proto_reader_feed(r, sink.buf, sink.len), 0);
        ProtoHeader h;
        const uint8_t *p;
        assert_int_equal(proto_reader_next(r, &h, &p), 1);
        assert_int_equal(h.type, PROTO_PING);
        assert_memory_equal(p, "12345678", 8);
        assert_int_equal(proto_reader_next(r, &h, &p), 1);
        assert_int_equal(h.type, PROTO_DATA);
        assert_int_equal(h.flags, PROTO_FD_ERR);
        assert_int_equal(h.stream, 77);
        assert_int_equal(h.length, 200000);
        assert_memory_equal(p, payload, 200000);
        assert_int_equal(proto_reader_next(r, &h, &p), 1);
        assert_int_equal(h.type, PROTO_CANCEL);
        assert_int_equal(proto_reader_next(r, &h, &p), 0);
        proto_reader_free(r);
        free(sink.buf);
        free(payload);

        /* A closed socket peer is an error, not a SIGPIPE (not ignored here). */
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        close(sv[1]);
        assert_int_equal(proto_write_frame(sv[0], PROTO_PING, 0, 0, NULL, 0), -EPIPE);
        close(sv[0]);

        /* Pipes work too (stdio channels). */
        int pp[2];
        assert_int_equal(pipe(pp), 0);
        assert_int_equal(proto_write_frame(pp[1], PROTO_EOF, PROTO_FD_OUT, 3, NULL, 0), 0);
        uint8_t hdr[PROTO_HEADER_SIZE];
        assert_int_equal(read(pp[0], hdr, sizeof hdr), (ssize_t)sizeof hdr);
        ProtoHeader back;
        assert_int_equal(proto_header_decode(hdr, &back), 0);
        assert_int_equal(back.type, PROTO_EOF);
        assert_int_equal(back.stream, 3);
        close(pp[0]);
        close(pp[1]);
        assert_int_equal(proto_write_frame(-1, PROTO_PING, 0, 0, NULL, 0), -EBADF);
}

static void test_type_names(void **state) {
        assert_string_equal(proto_type_name(PROTO_HELLO), "HELLO");
        assert_string_equal(proto_type_name(PROTO_PONG), "PONG");
        assert_string_equal(proto_type_name(0), "?");
        assert_string_equal(proto_type_name(200), "?");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_u32),
                cmocka_unit_test(test_header_round_trip),
                cmocka_unit_test(test_header_malformed),
                cmocka_unit_test(test_reader_byte_at_a_time),
                cmocka_unit_test(test_reader_all_at_once),
                cmocka_unit_test(test_reader_oversized_and_sticky),
                cmocka_unit_test(test_frame_build_rejects),
                cmocka_unit_test(test_write_frame),
                cmocka_unit_test(test_type_names),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
