/* The NDJSON line splitter under the streamed answers: lines split across
 * reads, a last line without '\n', bounds. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/ndjson.h"

typedef struct Seen {
        char lines[16][64];
        int n;
        int fail_at; /* the call that returns an error, or -1 */
} Seen;

static int collect(const char *line, size_t len, void *userdata) {
        Seen *s = userdata;

        if (s->n == s->fail_at)
                return -EPIPE;
        assert_true(s->n < 16 && len < 64);
        memcpy(s->lines[s->n], line, len);
        s->lines[s->n][len] = '\0';
        s->n++;
        return 0;
}

static void feed(ByteBuf *b, const char *s, Seen *seen) {
        assert_int_equal(bytebuf_append(b, s, strlen(s), 1 << 20), 0);
        assert_int_equal(ndjson_take_lines(b, false, collect, seen), 0);
}

static void test_split_across_reads(void **state) {
        ByteBuf b = {0};
        Seen s = {.fail_at = -1};

        feed(&b, "{\"type\":\"st", &s);
        assert_int_equal(s.n, 0);
        feed(&b, "art\"}\n{\"a\"", &s);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.lines[0], "{\"type\":\"start\"}");
        feed(&b, ":1}\n\n\r\n{\"b\":2}\n{\"c\"", &s);
        assert_int_equal(s.n, 3); /* empty lines are skipped */
        assert_string_equal(s.lines[1], "{\"a\":1}");
        assert_string_equal(s.lines[2], "{\"b\":2}");
        assert_int_equal(b.len, 4);
        /* The last line without its '\n' still counts at the end. */
        feed(&b, ":3}", &s);
        assert_int_equal(s.n, 3);
        assert_int_equal(ndjson_take_lines(&b, true, collect, &s), 0);
        assert_int_equal(s.n, 4);
        assert_string_equal(s.lines[3], "{\"c\":3}");
        assert_int_equal(b.len, 0);
        bytebuf_done(&b);
}

static void test_byte_at_a_time(void **state) {
        const char *text = "one\ntwo\nthree\n";
        ByteBuf b = {0};
        Seen s = {.fail_at = -1};

        for (const char *p = text; *p; p++) {
                assert_int_equal(bytebuf_append(&b, p, 1, 1 << 20), 0);
                assert_int_equal(ndjson_take_lines(&b, false, collect, &s), 0);
        }
        assert_int_equal(s.n, 3);
        assert_string_equal(s.lines[2], "three");
        bytebuf_done(&b);
}

static void test_callback_error_stops(void **state) {
        ByteBuf b = {0};
        Seen s = {.fail_at = 1};

        assert_int_equal(bytebuf_append(&b, "a\nb\nc\n", 6, 1 << 20), 0);
        assert_int_equal(ndjson_take_lines(&b, false, collect, &s), -EPIPE);
        assert_int_equal(s.n, 1);
        bytebuf_done(&b);
}

static void test_bounds(void **state) {
        ByteBuf b = {0};

        assert_int_equal(bytebuf_append(&b, "12345678", 8, 10), 0);
        assert_int_equal(bytebuf_append(&b, "123", 3, 10), -EFBIG);
        assert_int_equal(b.len, 8);
        assert_int_equal(bytebuf_append(&b, "12", 2, 10), 0);
        assert_int_equal(bytebuf_append(&b, "", 0, 10), 0);
        assert_int_equal(bytebuf_append(&b, "1", 1, 10), -EFBIG);
        assert_int_equal(bytebuf_append(&b, "1", SIZE_MAX, SIZE_MAX - 1), -EFBIG);
        bytebuf_done(&b);
}

static int record_length(const char *line, size_t len, void *userdata) {
        size_t *lens = userdata;

        lens[lens[0] + 1] = len;
        lens[0]++;
        return 0;
}

static void test_long_line(void **state) {
        /* A line that arrives in many pieces is not searched again from its start each time. */
        ByteBuf b = {0};
        size_t lens[4] = {0};
        char chunk[4096];

        memset(chunk, 'x', sizeof(chunk));
        for (int i = 0; i < 256; i++) {
                assert_int_equal(bytebuf_append(&b, chunk, sizeof(chunk), 8 << 20), 0);
                assert_int_equal(ndjson_take_lines(&b, false, record_length, lens), 0);
                assert_int_equal(b.scanned, b.len);
        }
        assert_int_equal(lens[0], 0);
        assert_int_equal(bytebuf_append(&b, "\nok\npart", 8, 8 << 20), 0);
        assert_int_equal(ndjson_take_lines(&b, false, record_length, lens), 0);
        assert_int_equal(lens[0], 2);
        assert_int_equal(lens[1], 256 * sizeof(chunk));
        assert_int_equal(lens[2], 2);
        assert_int_equal(b.len, 4);
        assert_true(b.scanned <= b.len);
        bytebuf_done(&b);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_split_across_reads),
                cmocka_unit_test(test_byte_at_a_time),
                cmocka_unit_test(test_callback_error_stops),
                cmocka_unit_test(test_bounds),
                cmocka_unit_test(test_long_line),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
