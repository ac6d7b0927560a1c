/* Value parsing of the CLI: numbers, durations, sizes, K=V, ids, base64, URL escaping. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/client.h"
#include "cli/parse.h"

static char err[CLI_ERR_MAX];

static void test_uint(void **state) {
        long long v = -1;

        assert_int_equal(parse_uint_bounded("--vcpu", "4", 1, 8, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 4);
        v = 99;
        assert_int_equal(parse_uint_bounded("--vcpu", "0", 1, 8, &v, err, sizeof(err)), -ERANGE);
        assert_int_equal(v, 99); /* untouched on failure */
        assert_non_null(strstr(err, "out of range"));
        assert_int_equal(parse_uint_bounded("--vcpu", "-1", 1, 8, &v, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "negative"));
        assert_int_equal(parse_uint_bounded("--vcpu", "two", 1, 8, &v, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "not a whole number"));
        assert_int_equal(parse_uint_bounded("--vcpu", "4x", 1, 8, &v, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_uint_bounded("--vcpu", " 4", 1, 8, &v, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_uint_bounded("--vcpu", "", 1, 8, &v, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_uint_bounded("--vcpu", "99999999999999999999999", 1, 8, &v, err, sizeof(err)),
                         -EINVAL);
        assert_non_null(strstr(err, "too large"));
}

static void test_duration(void **state) {
        long long v;

        assert_int_equal(parse_duration_ms("--timeout", "30", 1, 86400000, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 30000);
        assert_int_equal(parse_duration_ms("--timeout", "30s", 1, 86400000, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 30000);
        assert_int_equal(parse_duration_ms("--timeout", "1500ms", 1, 86400000, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 1500);
        assert_int_equal(parse_duration_ms("--timeout", "5m", 1, 86400000, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 300000);
        assert_int_equal(parse_duration_ms("--timeout", "2h", 1, 86400000, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 7200000);
        assert_int_equal(parse_duration_ms("--timeout", "1d", 1, 86400000, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 86400000);

        assert_int_equal(parse_duration_ms("--timeout", "2d", 1, 86400000, &v, err, sizeof(err)), -ERANGE);
        assert_int_equal(parse_duration_ms("--timeout", "0", 1, 86400000, &v, err, sizeof(err)), -ERANGE);
        assert_int_equal(parse_duration_ms("--timeout", "-5", 1, 86400000, &v, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "negative"));
        assert_int_equal(parse_duration_ms("--timeout", "5x", 1, 86400000, &v, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "unknown unit"));
        assert_int_equal(parse_duration_ms("--timeout", "s", 1, 86400000, &v, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_duration_ms("--timeout", "1.5s", 1, 86400000, &v, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_duration_ms("--timeout", "", 1, 86400000, &v, err, sizeof(err)), -EINVAL);
        /* Overflow in the multiplication is caught, not wrapped. */
        assert_int_equal(
                parse_duration_ms("--timeout", "9223372036854775807d", 1, 86400000, &v, err, sizeof(err)),
                -ERANGE);

        assert_int_equal(parse_duration_s("--lease", "10m", 1, 86400, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 600);
        assert_int_equal(parse_duration_s("--lease", "1500ms", 1, 86400, &v, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_duration_s("--lease", "86401", 1, 86400, &v, err, sizeof(err)), -ERANGE);
}

static void test_size(void **state) {
        long long v;

        assert_int_equal(parse_size_mib("--memory", "512", 64, 1 << 24, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 512);
        assert_int_equal(parse_size_mib("--memory", "512M", 64, 1 << 24, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 512);
        assert_int_equal(parse_size_mib("--memory", "512MiB", 64, 1 << 24, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 512);
        assert_int_equal(parse_size_mib("--memory", "2G", 64, 1 << 24, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 2048);
        assert_int_equal(parse_size_mib("--memory", "2GiB", 64, 1 << 24, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 2048);
        assert_int_equal(parse_size_mib("--memory", "1T", 64, 1 << 24, &v, err, sizeof(err)), 0);
        assert_int_equal(v, 1024 * 1024);

        assert_int_equal(parse_size_mib("--memory", "32", 64, 1 << 24, &v, err, sizeof(err)), -ERANGE);
        assert_int_equal(parse_size_mib("--memory", "99999T", 64, 1 << 24, &v, err, sizeof(err)), -ERANGE);
        assert_int_equal(parse_size_mib("--memory", "lots", 64, 1 << 24, &v, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "not a size"));
        assert_int_equal(parse_size_mib("--memory", "-512", 64, 1 << 24, &v, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_size_mib("--memory", "2K", 64, 1 << 24, &v, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_size_mib("--memory", "2 G", 64, 1 << 24, &v, err, sizeof(err)), -EINVAL);
}

static void test_kv(void **state) {
        json_t *o = json_object();

        assert_int_equal(parse_kv_into(KV_ENV, "A=1", o, err, sizeof(err)), 0);
        assert_int_equal(parse_kv_into(KV_ENV, "_B2=x=y", o, err, sizeof(err)), 0);
        assert_int_equal(parse_kv_into(KV_ENV, "EMPTY=", o, err, sizeof(err)), 0);
        assert_int_equal(parse_kv_into(KV_ENV, "A=2", o, err, sizeof(err)), 0); /* last wins */
        assert_string_equal(json_string_value(json_object_get(o, "A")), "2");
        assert_string_equal(json_string_value(json_object_get(o, "_B2")), "x=y");
        assert_string_equal(json_string_value(json_object_get(o, "EMPTY")), "");
        assert_int_equal(json_object_size(o), 3);

        assert_int_equal(parse_kv_into(KV_ENV, "NOEQUALS", o, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "expected K=V"));
        assert_int_equal(parse_kv_into(KV_ENV, "=v", o, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_kv_into(KV_ENV, "1A=v", o, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_kv_into(KV_ENV, "A-B=v", o, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_kv_into(KV_ENV, "A B=v", o, err, sizeof(err)), -EINVAL);
        assert_int_equal(json_object_size(o), 3);

        /* Value bounds. */
        {
                size_t n = CLI_ENV_VALUE_MAX + 1 + 2;
                char *big = malloc(n + 1);
                memset(big, 'x', n);
                big[0] = 'V';
                big[1] = '=';
                big[n] = '\0';
                assert_int_equal(parse_kv_into(KV_ENV, big, o, err, sizeof(err)), -EINVAL);
                big[n - 1] = '\0';
                assert_int_equal(parse_kv_into(KV_ENV, big, o, err, sizeof(err)), 0);
                free(big);
        }
        /* Entry count. */
        for (int i = json_object_size(o); i < CLI_ENV_MAX; i++) {
                char kv[32];
                snprintf(kv, sizeof(kv), "V%d=1", i);
                assert_int_equal(parse_kv_into(KV_ENV, kv, o, err, sizeof(err)), 0);
        }
        assert_int_equal(json_object_size(o), CLI_ENV_MAX);
        assert_int_equal(parse_kv_into(KV_ENV, "ONEMORE=1", o, err, sizeof(err)), -E2BIG);
        assert_int_equal(parse_kv_into(KV_ENV, "A=replaced", o, err, sizeof(err)),
                         0); /* replacing is fine */
        json_decref(o);

        o = json_object();
        assert_int_equal(parse_kv_into(KV_LABEL, "team=a", o, err, sizeof(err)), 0);
        assert_int_equal(parse_kv_into(KV_LABEL, "app.kubernetes.io/name=x", o, err, sizeof(err)), 0);
        assert_int_equal(parse_kv_into(KV_LABEL, "=a", o, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_kv_into(KV_LABEL, "a\tb=a", o, err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_kv_into(KV_LABEL, "k", o, err, sizeof(err)), -EINVAL);
        /* A value that is not UTF-8 is refused, not sent. */
        assert_int_equal(parse_kv_into(KV_LABEL, "k=\xff\xfe", o, err, sizeof(err)), -EINVAL);
        json_decref(o);
}

static void test_ids_and_names(void **state) {
        assert_true(sandbox_id_valid("sbx_9f2c4e1a7b3d5c6e8f01"));
        assert_true(sandbox_id_valid("a-b"));
        assert_false(sandbox_id_valid(""));
        assert_false(sandbox_id_valid(NULL));
        assert_false(sandbox_id_valid("../keys"));
        assert_false(sandbox_id_valid("sbx_1/files"));
        assert_false(sandbox_id_valid("sbx_1:exec"));
        assert_false(sandbox_id_valid("sbx_1?x=1"));
        assert_false(sandbox_id_valid("sbx 1"));
        assert_false(
                sandbox_id_valid("0123456789012345678901234567890123456789012345678901234567890123456789"));

        assert_true(image_name_valid("default"));
        assert_true(image_name_valid("py3.12-slim"));
        assert_false(image_name_valid("Default"));
        assert_false(image_name_valid("-x"));
        assert_false(image_name_valid("a/b"));
        assert_false(image_name_valid(""));

        assert_int_equal(sandbox_path_check("/workspace/a", err, sizeof(err)), 0);
        assert_int_equal(sandbox_path_check("", err, sizeof(err)), -EINVAL);
        {
                char *p = malloc(CLI_PATH_MAX + 2);
                memset(p, 'a', CLI_PATH_MAX + 1);
                p[CLI_PATH_MAX + 1] = '\0';
                assert_int_equal(sandbox_path_check(p, err, sizeof(err)), -ENAMETOOLONG);
                free(p);
        }
}

static void test_base64(void **state) {
        static const struct {
                const char *in, *out;
        } cases[] = {
                {"", ""},
                {"f", "Zg=="},
                {"fo", "Zm8="},
                {"foo", "Zm9v"},
                {"foob", "Zm9vYg=="},
                {"fooba", "Zm9vYmE="},
                {"foobar", "Zm9vYmFy"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                char *s = base64_encode(cases[i].in, strlen(cases[i].in));
                assert_string_equal(s, cases[i].out);
                free(s);
        }
        {
                const unsigned char bin[] = {0x00, 0xff, 0xfe, 0x80};
                char *s = base64_encode(bin, sizeof(bin));
                assert_string_equal(s, "AP/+gA==");
                free(s);
        }
}

static void test_url_escape(void **state) {
        char *s = url_escape("/workspace/a b&c=d?e#f%g+h/ü");
        assert_string_equal(s, "/workspace/a%20b%26c%3Dd%3Fe%23f%25g%2Bh/%C3%BC");
        free(s);
        s = url_escape("");
        assert_string_equal(s, "");
        free(s);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_uint),          cmocka_unit_test(test_duration),
                cmocka_unit_test(test_size),          cmocka_unit_test(test_kv),
                cmocka_unit_test(test_ids_and_names), cmocka_unit_test(test_base64),
                cmocka_unit_test(test_url_escape),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
