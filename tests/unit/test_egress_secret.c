/* Egress secrets: header names, formats, rules, and the head the proxy sends. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "egress/secret.h"

static void test_header_names(void **state) {
        assert_true(egress_secret_header_valid("Authorization"));
        assert_true(egress_secret_header_valid("x-api-key"));
        assert_false(egress_secret_header_valid(""));
        assert_false(egress_secret_header_valid(NULL));
        assert_false(egress_secret_header_valid("X-Evil\r\nX-Injected"));
        assert_false(egress_secret_header_valid("Bad Header"));
        assert_false(egress_secret_header_valid("Colon:"));
        for (const char *const *h = (const char *const[]){ "Host", "content-length", "Transfer-Encoding", "Connection",
                                                           "Upgrade", "TE", "Trailer", "Expect", "Proxy-Foo",
                                                           "proxy-authorization", NULL };
             *h; h++)
                assert_false(egress_secret_header_valid(*h));
        char long_name[70];
        memset(long_name, 'x', 65);
        long_name[65] = '\0';
        assert_false(egress_secret_header_valid(long_name));
        long_name[64] = '\0';
        assert_true(egress_secret_header_valid(long_name));
}

static void test_formats_and_values(void **state) {
        assert_true(egress_secret_format_valid("Bearer {value}"));
        assert_true(egress_secret_format_valid("{value}"));
        assert_false(egress_secret_format_valid("Bearer"));
        assert_false(egress_secret_format_valid("{value}{value}"));
        assert_false(egress_secret_format_valid("Bearer {value}\r\nX: y"));
        assert_false(egress_secret_format_valid(""));
        assert_true(egress_secret_value_valid("abc def~", 8));
        assert_false(egress_secret_value_valid("a\tb", 3));
        assert_false(egress_secret_value_valid("a\x7f", 2));
        assert_false(egress_secret_value_valid("caf\xc3\xa9", 5));
        assert_false(egress_secret_value_valid("a\0b", 3));
}

static int rules_error(const char *text) {
        json_t *j = json_loads(text, 0, NULL);
        assert_non_null(j);
        json_t *norm = NULL;
        char err[256];
        int r = egress_secret_rules_parse(j, &norm, NULL, NULL, err, sizeof(err));
        json_decref(j);
        json_decref(norm);
        return r;
}

static void test_rules_parsed_strictly(void **state) {
        assert_int_equal(rules_error("[{\"paths\": [\"/a/*\", \"/b\"]}]"), 0);
        assert_int_equal(rules_error("[{\"methods\": [\"get\"], \"paths\": [\"/\"]}]"), 0);
        const char *bad[] = {
                "[]", "{}", "[1]", "[{\"paths\": []}]", "[{\"methods\": [\"GET\"]}]",
                "[{\"paths\": [\"a\"]}]", "[{\"paths\": [\"/a/../b\"]}]", "[{\"paths\": [\"/a/.\"]}]",
                "[{\"paths\": [\"/a//b\"]}]", "[{\"paths\": [\"/a%2fb\"]}]", "[{\"paths\": [\"/a%2E%2E\"]}]",
                "[{\"paths\": [\"/a%5cb\"]}]", "[{\"paths\": [\"/a;b\"]}]", "[{\"paths\": [\"/a\\\\b\"]}]",
                "[{\"paths\": [\"/a?b\"]}]", "[{\"paths\": [\"/a#b\"]}]", "[{\"paths\": [\"/a*\"]}]",
                "[{\"paths\": [\"/*/b\"]}]", "[{\"paths\": [\"/a b\"]}]", "[{\"paths\": [\"/a%\"]}]",
                "[{\"methods\": [], \"paths\": [\"/a\"]}]", "[{\"methods\": [\"G-T\"], \"paths\": [\"/a\"]}]",
                "[{\"methods\": [1], \"paths\": [\"/a\"]}]", "[{\"paths\": [\"/a\"], \"x\": 1}]",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                if (rules_error(bad[i]) != -EINVAL)
                        fail_msg("accepted %s", bad[i]);
}

static EgressSecret secret(const char *name, const char *value, const char *host, const char *header,
                           const char *format, const char *rules) {
        EgressSecret s = { 0 };
        snprintf(s.name, sizeof(s.name), "%s", name);
        snprintf(s.placeholder, sizeof(s.placeholder), "runtime-secret-%s-0123", name);
        s.value = strdup(value);
        json_t *net = json_pack("{s:b,s:[s]}", "internet", 1, "allow", host);
        assert_int_equal(egress_policy_parse(net, &s.hosts, NULL, 0), 0);
        json_decref(net);
        if (header)
                snprintf(s.header, sizeof(s.header), "%s", header);
        s.format = format ? strdup(format) : NULL;
        if (rules) {
                json_t *j = json_loads(rules, 0, NULL), *norm = NULL;
                char err[128];
                assert_int_equal(egress_secret_rules_parse(j, &norm, &s.rules, &s.n_rules, err, sizeof(err)), 0);
                json_decref(j);
                json_decref(norm);
        }
        return s;
}

static void secret_done(EgressSecret *s) {
        free(s->value);
        free(s->format);
        egress_policy_free(s->hosts);
        egress_secret_rules_free(s->rules, s->n_rules);
}

static int prepare(const EgressSecret *s, size_t n, const char *head, const char *host, char **out, char *why) {
        size_t len = 0;
        return egress_secret_prepare_head(head, strlen(head), s, n, host, 443, out, &len, why, 160);
}

static void test_header_secret_set_replacing_the_sandbox_header(void **state) {
        EgressSecret s[] = { secret("GH", "s3cret", "api.test", "Authorization", "Bearer {value}",
                                    "[{\"methods\": [\"GET\"], \"paths\": [\"/repos/*\", \"/user\"]}]") };
        char *out = NULL, why[160] = "";
        int r = prepare(s, 1, "GET /repos/a HTTP/1.1\r\nHost: api.test\r\nauthorization: forged\r\n\r\n", "api.test",
                        &out, why);
        assert_int_equal(r, 1);
        assert_string_equal(out, "GET /repos/a HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer s3cret\r\n\r\n");
        free(out);
        /* Another host: the head as it was, no value. */
        r = prepare(s, 1, "GET /x HTTP/1.1\r\nHost: echo.test\r\n\r\n", "echo.test", &out, why);
        assert_int_equal(r, 0);
        assert_null(strstr(out, "s3cret"));
        free(out);
        /* Refused: a method or path no rule allows, or a path only made to look allowed. */
        const char *refused[] = {
                "POST /repos/a HTTP/1.1\r\nHost: api.test\r\n\r\n",  "GET /other HTTP/1.1\r\nHost: api.test\r\n\r\n",
                "GET /repos HTTP/1.1\r\nHost: api.test\r\n\r\n",     "GET /user/x HTTP/1.1\r\nHost: api.test\r\n\r\n",
                "GET /repos/../admin HTTP/1.1\r\nHost: api.test\r\n\r\n",
                "GET /repos/%2e%2e/admin HTTP/1.1\r\nHost: api.test\r\n\r\n",
                "GET /repos/a%2fb HTTP/1.1\r\nHost: api.test\r\n\r\n", "GET /repos//a HTTP/1.1\r\nHost: api.test\r\n\r\n",
                "GET /repos/a;x HTTP/1.1\r\nHost: api.test\r\n\r\n",
        };
        for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
                out = NULL;
                why[0] = '\0';
                r = prepare(s, 1, refused[i], "api.test", &out, why);
                if (r != -EACCES)
                        fail_msg("not refused: %s", refused[i]);
                assert_null(out);
                assert_non_null(strstr(why, "secret GH"));
                assert_null(strstr(why, "s3cret"));
        }
        /* The query does not count against the path. */
        r = prepare(s, 1, "GET /user?x=/../y HTTP/1.1\r\nHost: api.test\r\n\r\n", "api.test", &out, why);
        assert_int_equal(r, 1);
        free(out);
        secret_done(&s[0]);
}

static void test_placeholder_rules_and_scope(void **state) {
        EgressSecret s[] = { secret("A", "aaa", "api.test", NULL, NULL, "[{\"paths\": [\"/ok\"]}]"),
                             secret("B", "bbb", "echo.test", NULL, NULL, NULL) };
        char *out = NULL, why[160];
        /* A's placeholder on a path its rules allow: replaced; B's (another host's) kept. */
        int r = prepare(s, 2,
                        "GET /ok HTTP/1.1\r\nX-A: runtime-secret-A-0123\r\nX-B: runtime-secret-B-0123\r\n\r\n",
                        "api.test", &out, why);
        assert_int_equal(r, 1);
        assert_non_null(strstr(out, "X-A: aaa\r\n"));
        assert_non_null(strstr(out, "X-B: runtime-secret-B-0123\r\n"));
        free(out);
        /* A request without A's placeholder is not A's to judge. */
        r = prepare(s, 2, "GET /other HTTP/1.1\r\nX: y\r\n\r\n", "api.test", &out, why);
        assert_int_equal(r, 0);
        free(out);
        r = prepare(s, 2, "GET /other HTTP/1.1\r\nX-A: runtime-secret-A-0123\r\n\r\n", "api.test", &out, why);
        assert_int_equal(r, -EACCES);
        secret_done(&s[0]);
        secret_done(&s[1]);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_header_names),
                cmocka_unit_test(test_formats_and_values),
                cmocka_unit_test(test_rules_parsed_strictly),
                cmocka_unit_test(test_header_secret_set_replacing_the_sandbox_header),
                cmocka_unit_test(test_placeholder_rules_and_scope),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
