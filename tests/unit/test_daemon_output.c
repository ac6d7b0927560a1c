/* UTF-8 sanitising, the keep-the-tail buffer and the streamed character
 * holder of the daemon's exec output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/manager/output.h"

static void assert_sanitized(const char *in, size_t len, const char *want) {
        size_t out_len;
        char *out = utf8_sanitize((const uint8_t *)in, len, &out_len);
        assert_non_null(out);
        assert_int_equal(out_len, strlen(want));
        assert_memory_equal(out, want, out_len);
        free(out);
}

#define FFFD "\xef\xbf\xbd"

static void test_seq_len(void **state) {
        assert_int_equal(utf8_seq_len((const uint8_t *)"a", 1), 1);
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xc3\xa9", 2), 2);
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xc3", 1), -1);
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xe2\x82\xac", 3), 3);
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xe2\x82", 2), -1);
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xf0\x9f\x98\x80", 4), 4);
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xc0\xaf", 2), 0);         /* overlong */
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xe0\x80\xaf", 3), 0);     /* overlong */
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xed\xa0\x80", 3), 0);     /* surrogate */
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xf4\x90\x80\x80", 4), 0); /* > U+10FFFF */
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xf5", 1), 0);
        assert_int_equal(utf8_seq_len((const uint8_t *)"\x80", 1), 0);
        assert_int_equal(utf8_seq_len((const uint8_t *)"\xe2\x41", 2), 0);
}

static void test_sanitize(void **state) {
        assert_sanitized("hello", 5, "hello");
        assert_sanitized("caf\xc3\xa9", 5, "caf\xc3\xa9");
        assert_sanitized("\xff", 1, FFFD);
        assert_sanitized("a\xffz", 3, "a" FFFD "z");
        assert_sanitized("\xe2\x82", 2, FFFD FFFD); /* each invalid byte */
        assert_sanitized("\xed\xa0\x80", 3, FFFD FFFD FFFD);
        size_t n;
        char *nul = utf8_sanitize((const uint8_t *)"a\0b", 3, &n); /* NUL is valid UTF-8 */
        assert_int_equal(n, 3);
        assert_memory_equal(nul, "a\0b", 3);
        free(nul);
        assert_sanitized("", 0, "");
}

static void test_tail_keeps_last_bytes(void **state) {
        TailBuf t;
        tailbuf_init(&t, 5);
        assert_int_equal(tailbuf_append(&t, "abc", 3), 0);
        assert_false(t.truncated);
        assert_int_equal(tailbuf_append(&t, "defg", 4), 0);
        assert_true(t.truncated);
        size_t len;
        char *s = tailbuf_text(&t, &len);
        assert_string_equal(s, "cdefg");
        free(s);
        /* A chunk bigger than the cap alone. */
        assert_int_equal(tailbuf_append(&t, "0123456789", 10), 0);
        s = tailbuf_text(&t, &len);
        assert_string_equal(s, "56789");
        free(s);
        for (int i = 0; i < 1000; i++)
                tailbuf_append(&t, "xy", 2);
        tailbuf_append(&t, "END", 3);
        s = tailbuf_text(&t, &len);
        assert_string_equal(s, "xyEND");
        free(s);
        assert_int_equal(t.total, 3 + 4 + 10 + 2000 + 3);
        tailbuf_done(&t);
}

/* Against the plain model: whatever the chunk sizes, the tail is the last
 * cap bytes of all appended, and truncated says whether there were more. */
static void test_tail_matches_model(void **state) {
        enum { TOTAL = 20000 };
        static char all[TOTAL];
        unsigned seed = 7;
        for (size_t i = 0; i < TOTAL; i++)
                all[i] = (char)('a' + i % 26);
        const size_t caps[] = {1, 7, 64, 1000, 4096};
        for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
                TailBuf t;
                tailbuf_init(&t, caps[c]);
                size_t at = 0;
                while (at < TOTAL) {
                        seed = seed * 1103515245u + 12345u;
                        size_t n = (seed >> 8) % (caps[c] * 2 + 3);
                        if (n > TOTAL - at)
                                n = TOTAL - at;
                        assert_int_equal(tailbuf_append(&t, all + at, n), 0);
                        at += n;
                        size_t want = at < caps[c] ? at : caps[c], len;
                        char *s = tailbuf_text(&t, &len);
                        assert_int_equal(len, want);
                        assert_memory_equal(s, all + at - want, want);
                        assert_int_equal(t.truncated, at > caps[c]);
                        free(s);
                }
                tailbuf_done(&t);
        }
}

static void test_tail_exact_fit_not_truncated(void **state) {
        TailBuf t;
        tailbuf_init(&t, 4);
        tailbuf_append(&t, "ab", 2);
        tailbuf_append(&t, "cd", 2);
        assert_false(t.truncated);
        size_t len;
        char *s = tailbuf_text(&t, &len);
        assert_string_equal(s, "abcd");
        free(s);
        tailbuf_done(&t);
}

static void test_tail_zero_cap(void **state) {
        TailBuf t;
        tailbuf_init(&t, 0);
        tailbuf_append(&t, "", 0);
        assert_false(t.truncated);
        tailbuf_append(&t, "x", 1);
        assert_true(t.truncated);
        size_t len;
        char *s = tailbuf_text(&t, &len);
        assert_string_equal(s, "");
        free(s);
        tailbuf_done(&t);
}

static void test_tail_drops_cut_character(void **state) {
        TailBuf t;
        tailbuf_init(&t, 4);
        /* "€" is e2 82 ac: keeping the last 4 bytes of "a€€" cuts the first euro. */
        tailbuf_append(&t, "a\xe2\x82\xac\xe2\x82\xac", 7);
        size_t len;
        char *s = tailbuf_text(&t, &len);
        assert_string_equal(s, "\xe2\x82\xac");
        free(s);
        tailbuf_done(&t);
        /* Without truncation an invalid start stays visible. */
        tailbuf_init(&t, 8);
        tailbuf_append(&t, "\x82x", 2);
        s = tailbuf_text(&t, &len);
        assert_string_equal(s, FFFD "x");
        free(s);
        tailbuf_done(&t);
}

static char *feed(Utf8Holder *h, const char *data, size_t len) {
        char *out;
        size_t out_len;
        assert_int_equal(utf8_holder_feed(h, (const uint8_t *)data, len, &out, &out_len), 0);
        assert_int_equal(strlen(out), out_len);
        return out;
}

static void test_holder_never_splits(void **state) {
        Utf8Holder h = { 0 };
        char *s = feed(&h, "ab\xe2", 3);
        assert_string_equal(s, "ab");
        free(s);
        s = feed(&h, "\x82", 1);
        assert_string_equal(s, "");
        free(s);
        s = feed(&h, "\xac!", 2);
        assert_string_equal(s, "\xe2\x82\xac!");
        free(s);
        /* Four-byte character, one byte at a time. */
        const char *emoji = "\xf0\x9f\x98\x80";
        for (int i = 0; i < 3; i++) {
                s = feed(&h, emoji + i, 1);
                assert_string_equal(s, "");
                free(s);
        }
        s = feed(&h, emoji + 3, 1);
        assert_string_equal(s, emoji);
        free(s);
        assert_int_equal(h.n, 0);
}

static void test_holder_invalid_and_flush(void **state) {
        Utf8Holder h = { 0 };
        /* An invalid byte is not held back. */
        char *s = feed(&h, "\xff", 1);
        assert_string_equal(s, FFFD);
        free(s);
        /* A started character broken by the next byte. */
        s = feed(&h, "\xe2", 1);
        assert_string_equal(s, "");
        free(s);
        s = feed(&h, "A", 1);
        assert_string_equal(s, FFFD "A");
        free(s);
        /* Held bytes that never complete come out at the end. */
        s = feed(&h, "\xe2\x82", 2);
        assert_string_equal(s, "");
        free(s);
        size_t len;
        assert_int_equal(utf8_holder_flush(&h, &s, &len), 0);
        assert_string_equal(s, FFFD FFFD);
        free(s);
        assert_int_equal(h.n, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_seq_len),
                cmocka_unit_test(test_sanitize),
                cmocka_unit_test(test_tail_keeps_last_bytes),
                cmocka_unit_test(test_tail_matches_model),
                cmocka_unit_test(test_tail_exact_fit_not_truncated),
                cmocka_unit_test(test_tail_zero_cap),
                cmocka_unit_test(test_tail_drops_cut_character),
                cmocka_unit_test(test_holder_never_splits),
                cmocka_unit_test(test_holder_invalid_and_flush),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
