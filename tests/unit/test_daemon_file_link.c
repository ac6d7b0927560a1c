/* Signed file links (daemon/model/file_link.h): a link verifies under its
 * own secret only; a change of one byte anywhere in what it signs, another
 * sandbox, another operation or another secret fails; its query reads back
 * into the same link; arguments it was not made with, or given twice, are
 * refused. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/model/file_link.h"

static const uint8_t SECRET[FILE_LINK_SECRET_LEN] = { 9, 8, 7, 6, 5, 4, 3, 2, 1 };

static FileLink a_link(void) {
        FileLink l = { .sandbox_id = "sbx_0123456789abcdef0123", .op = FILE_LINK_DOWNLOAD,
                       .path = "/workspace/report.csv", .path_len = strlen("/workspace/report.csv"),
                       .expires_at = 1800000000, .id = "lnk_00112233445566ff", .wake = true };
        return l;
}

static void test_sign_and_verify(void **state) {
        FileLink l = a_link();
        char sig[FILE_LINK_SIG_HEX_LEN + 1], again[FILE_LINK_SIG_HEX_LEN + 1];
        assert_int_equal(file_link_sign(SECRET, &l, sig), 0);
        assert_int_equal(strlen(sig), FILE_LINK_SIG_HEX_LEN);
        assert_int_equal(file_link_sign(SECRET, &l, again), 0);
        assert_string_equal(sig, again);
        assert_true(file_link_verify(SECRET, &l, sig));
        /* Another secret (a revoke made a new one). */
        uint8_t other[FILE_LINK_SECRET_LEN];
        memcpy(other, SECRET, sizeof other);
        other[31] ^= 1;
        assert_false(file_link_verify(other, &l, sig));
        /* A signature with one hex digit changed, cut short, or not hex. */
        for (size_t i = 0; i < FILE_LINK_SIG_HEX_LEN; i++) {
                char bad[FILE_LINK_SIG_HEX_LEN + 1];
                memcpy(bad, sig, sizeof bad);
                bad[i] = bad[i] == '0' ? '1' : '0';
                assert_false(file_link_verify(SECRET, &l, bad));
        }
        sig[FILE_LINK_SIG_HEX_LEN - 1] = '\0';
        assert_false(file_link_verify(SECRET, &l, sig));
        assert_false(file_link_verify(SECRET, &l, NULL));
}

static void test_every_signed_field_counts(void **state) {
        FileLink base = a_link();
        char sig[FILE_LINK_SIG_HEX_LEN + 1];
        assert_int_equal(file_link_sign(SECRET, &base, sig), 0);
        /* The path changed by one byte, at each byte. */
        char path[64];
        snprintf(path, sizeof path, "%s", base.path);
        for (size_t i = 0; i < base.path_len; i++) {
                FileLink l = base;
                char saved = path[i];
                path[i] = (char)(saved ^ 1);
                l.path = path;
                assert_false(file_link_verify(SECRET, &l, sig));
                path[i] = saved;
        }
        FileLink l = base;
        l.path_len--; /* a path cut short */
        assert_false(file_link_verify(SECRET, &l, sig));
        l = base;
        l.sandbox_id[sizeof("sbx_") - 1] = '1'; /* another sandbox */
        assert_false(file_link_verify(SECRET, &l, sig));
        l = base;
        l.op = FILE_LINK_UPLOAD; /* a download link used to upload */
        assert_false(file_link_verify(SECRET, &l, sig));
        l.op = FILE_LINK_ARCHIVE;
        assert_false(file_link_verify(SECRET, &l, sig));
        l = base;
        l.expires_at++;
        assert_false(file_link_verify(SECRET, &l, sig));
        l = base;
        l.id[FILE_LINK_ID_LEN - 1] = 'e';
        assert_false(file_link_verify(SECRET, &l, sig));
        l = base;
        l.once = true;
        assert_false(file_link_verify(SECRET, &l, sig));
        l = base;
        l.wake = false;
        assert_false(file_link_verify(SECRET, &l, sig));
        l = base;
        l.max_bytes = 1;
        assert_false(file_link_verify(SECRET, &l, sig));
        l = base;
        l.filename = "report.csv";
        assert_false(file_link_verify(SECRET, &l, sig));
        /* Fields are length-prefixed: bytes moved from one field to its
         * neighbour sign differently. */
        FileLink p = base, q = base;
        p.filename = "ab";
        q.filename = "a";
        assert_int_equal(file_link_sign(SECRET, &p, sig), 0);
        assert_false(file_link_verify(SECRET, &q, sig));
        /* A link out of shape is not signed at all. */
        l = base;
        l.path_len = 0;
        assert_int_equal(file_link_sign(SECRET, &l, sig), -EINVAL);
        l = base;
        snprintf(l.id, sizeof l.id, "lnk_XYZ");
        assert_int_equal(file_link_sign(SECRET, &l, sig), -EINVAL);
        l = base;
        l.filename = "a\"b";
        assert_int_equal(file_link_sign(SECRET, &l, sig), -EINVAL);
}

/* Feeds a query (as the server decodes it: here, no escapes but %2F, %20
 * and %3D) to the parser. */
static int parse_query(const char *query, FileLinkParse *p, char store[][256], size_t n) {
        file_link_parse_init(p);
        size_t i = 0;
        for (const char *s = query; *s && i < n; i++) {
                const char *amp = strchr(s, '&');
                size_t len = amp ? (size_t)(amp - s) : strlen(s);
                char arg[512];
                snprintf(arg, sizeof arg, "%.*s", (int)len, s);
                char *eq = strchr(arg, '=');
                assert_non_null(eq);
                *eq = '\0';
                char *out = store[i];
                size_t o = 0;
                for (const char *v = eq + 1; *v && o + 1 < 256; v++) {
                        if (v[0] == '%' && v[1] && v[2]) {
                                char hex[3] = { v[1], v[2], 0 };
                                out[o++] = (char)strtol(hex, NULL, 16);
                                v += 2;
                        } else
                                out[o++] = *v;
                }
                out[o] = '\0';
                int r = file_link_parse_arg(p, arg, out, o);
                if (r < 0)
                        return r;
                s += len + (amp ? 1 : 0);
        }
        return file_link_parse_done(p);
}

static void test_query_round_trip(void **state) {
        FileLink l = a_link();
        l.path = "/workspace/a b/c=d";
        l.path_len = strlen(l.path);
        l.once = true;
        l.wake = false;
        l.filename = "c d.txt";
        char sig[FILE_LINK_SIG_HEX_LEN + 1];
        char *query = NULL;
        assert_int_equal(file_link_sign(SECRET, &l, sig), 0);
        assert_int_equal(file_link_query(&l, sig, &query), 0);
        assert_non_null(strstr(query, "path=/workspace/a%20b/c%3Dd&expires=1800000000&id=lnk_00112233445566ff"
                                      "&once=1&wake=0&filename=c%20d.txt&sig="));
        char store[16][256];
        FileLinkParse p;
        assert_int_equal(parse_query(query, &p, store, 16), 0);
        snprintf(p.link.sandbox_id, sizeof p.link.sandbox_id, "%s", l.sandbox_id);
        p.link.op = FILE_LINK_DOWNLOAD;
        assert_true(file_link_verify(SECRET, &p.link, p.sig));
        free(query);
        /* An upload's bound comes back too; a default link says only what
         * it must. */
        l = a_link();
        l.op = FILE_LINK_UPLOAD;
        l.max_bytes = 4096;
        assert_int_equal(file_link_sign(SECRET, &l, sig), 0);
        assert_int_equal(file_link_query(&l, sig, &query), 0);
        assert_null(strstr(query, "once="));
        assert_null(strstr(query, "wake="));
        assert_int_equal(parse_query(query, &p, store, 16), 0);
        assert_int_equal(p.link.max_bytes, 4096);
        assert_true(p.link.wake);
        snprintf(p.link.sandbox_id, sizeof p.link.sandbox_id, "%s", l.sandbox_id);
        p.link.op = FILE_LINK_UPLOAD;
        assert_true(file_link_verify(SECRET, &p.link, p.sig));
        free(query);
}

static void test_arguments_refused(void **state) {
        char store[16][256];
        FileLinkParse p;
        const char *sig = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        char q[512];
        /* What the link was not made with (a user, a mode), or twice. */
        const char *extra[] = { "user=root", "mode=0777", "path=/etc/passwd", "sig=00", "expires=1", "gzip=0" };
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
                snprintf(q, sizeof q, "path=/w&expires=5&id=lnk_00112233445566ff&sig=%s&%s", sig, extra[i]);
                assert_int_equal(parse_query(q, &p, store, 16), -EINVAL);
        }
        /* Values out of shape. */
        const char *bad[] = {
                "path=/w&expires=-5&id=lnk_00112233445566ff&sig=SIG",
                "path=/w&expires=05&id=lnk_00112233445566ff&sig=SIG",
                "path=/w&expires=99999999999999999999&id=lnk_00112233445566ff&sig=SIG",
                "path=/w&expires=5&id=lnk_00112233445566FF&sig=SIG",
                "path=/w&expires=5&id=key_00112233445566ff&sig=SIG",
                "path=/w&expires=5&id=lnk_00112233445566ff&once=2&sig=SIG",
                "path=/w&expires=5&id=lnk_00112233445566ff&maxBytes=0&sig=SIG",
                "path=/w&expires=5&id=lnk_00112233445566ff&filename=a%2Fb&sig=SIG",
                "path=&expires=5&id=lnk_00112233445566ff&sig=SIG",
                "path=/w&expires=5&id=lnk_00112233445566ff&sig=SIGAB",
                "path=/w&expires=5&id=lnk_00112233445566ff",
                "path=/w&id=lnk_00112233445566ff&sig=SIG",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                const char *at = strstr(bad[i], "SIG");
                if (at)
                        snprintf(q, sizeof q, "%.*s%s%s", (int)(at - bad[i]), bad[i], sig, at + 3);
                else
                        snprintf(q, sizeof q, "%s", bad[i]);
                assert_int_equal(parse_query(q, &p, store, 16), -EINVAL);
        }
        /* A NUL inside a value never cuts it into another, valid one. */
        file_link_parse_init(&p);
        assert_int_equal(file_link_parse_arg(&p, "path", "/w\0/x", 5), -EINVAL);
        assert_false(file_link_arg_known("user"));
        assert_true(file_link_arg_known("sig"));
}

static void test_ids_and_names(void **state) {
        char a[FILE_LINK_ID_LEN + 1], b[FILE_LINK_ID_LEN + 1];
        assert_int_equal(file_link_new_id(a), 0);
        assert_int_equal(file_link_new_id(b), 0);
        assert_true(file_link_id_ok(a));
        assert_string_not_equal(a, b);
        uint8_t s1[FILE_LINK_SECRET_LEN], s2[FILE_LINK_SECRET_LEN];
        assert_int_equal(file_link_new_secret(s1), 0);
        assert_int_equal(file_link_new_secret(s2), 0);
        assert_memory_not_equal(s1, s2, sizeof s1);
        assert_true(file_link_filename_ok("report 2026.csv"));
        assert_false(file_link_filename_ok(""));
        assert_false(file_link_filename_ok("a/b"));
        assert_false(file_link_filename_ok("a\\b"));
        assert_false(file_link_filename_ok("a\r\nSet-Cookie: x"));
        assert_false(file_link_filename_ok("caf\xc3\xa9"));
        char longest[FILE_LINK_FILENAME_MAX + 2];
        memset(longest, 'a', sizeof longest - 1);
        longest[sizeof longest - 1] = '\0';
        assert_false(file_link_filename_ok(longest));
        longest[FILE_LINK_FILENAME_MAX] = '\0';
        assert_true(file_link_filename_ok(longest));
        assert_string_equal(file_link_op_name(FILE_LINK_UPLOAD), "upload");
        assert_string_equal(file_link_op_name(FILE_LINK_ARCHIVE), "archive");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_sign_and_verify),
                cmocka_unit_test(test_every_signed_field_counts),
                cmocka_unit_test(test_query_round_trip),
                cmocka_unit_test(test_arguments_refused),
                cmocka_unit_test(test_ids_and_names),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
