/* Human output of the CLI: times, money, the sandbox table and detail. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/client.h"
#include "cli/format.h"

static const char sandbox_json[] =
        "{\"id\": \"sbx_9f2c4e1a7b3d5c6e8f01\", \"name\": \"demo\", \"labels\": {\"team\": \"a\"},"
        " \"state\": \"running\", \"driver\": \"namespace\", \"image\": \"default\","
        " \"vcpu\": 1, \"memoryMiB\": 1024, \"diskMiB\": 2048,"
        " \"network\": {\"internet\": true, \"allow\": [\"pypi.org\", \"*.pythonhosted.org\"], \"deny\": "
        "[]},"
        " \"timeoutSeconds\": 300, \"onLeaseEnd\": \"stop\","
        " \"createdAt\": \"2026-11-30T09:00:00Z\", \"startedAt\": \"2026-11-30T09:00:01Z\", \"stoppedAt\": "
        "null,"
        " \"leaseEndsAt\": \"2026-11-30T09:05:00Z\","
        " \"costMicrosPerHour\": 12500, \"costMicros\": 12, \"maxCostMicros\": null, \"failureReason\": "
        "null}";

static char *render(void (*fn)(FILE *, json_t *, time_t), json_t *j, time_t now) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);

        assert_non_null(f);
        fn(f, j, now);
        fclose(f);
        return buf;
}

static time_t at(const char *s) {
        time_t t;
        assert_int_equal(rfc3339_parse(s, &t), 0);
        return t;
}

static void test_rfc3339(void **state) {
        time_t t;

        assert_int_equal(rfc3339_parse("1970-01-01T00:00:00Z", &t), 0);
        assert_int_equal(t, 0);
        assert_int_equal(rfc3339_parse("2026-11-30T09:00:00Z", &t), 0);
        assert_int_equal(t, 1796029200);
        assert_int_equal(rfc3339_parse("2026-11-30T09:00:00.123456Z", &t), 0);
        assert_int_equal(t, 1796029200);
        assert_int_equal(rfc3339_parse("2026-11-30T10:00:00+01:00", &t), 0);
        assert_int_equal(t, 1796029200);
        assert_int_equal(rfc3339_parse("2026-11-30T09:00:00", &t), -EINVAL);
        assert_int_equal(rfc3339_parse("2026-11-30T09:00:00Zjunk", &t), -EINVAL);
        assert_int_equal(rfc3339_parse("yesterday", &t), -EINVAL);
        assert_int_equal(rfc3339_parse(NULL, &t), -EINVAL);
}

static void test_spans_money_bytes(void **state) {
        char b[64];

        format_span(b, sizeof(b), 45);
        assert_string_equal(b, "45s");
        format_span(b, sizeof(b), 12 * 60 + 5);
        assert_string_equal(b, "12m");
        format_span(b, sizeof(b), 3 * 3600 + 12 * 60);
        assert_string_equal(b, "3h12m");
        format_span(b, sizeof(b), 2 * 86400 + 3 * 3600);
        assert_string_equal(b, "2d3h");

        format_relative(b, sizeof(b), "2026-11-30T09:00:00Z", at("2026-11-30T09:02:00Z"));
        assert_string_equal(b, "2m ago");
        format_relative(b, sizeof(b), "2026-11-30T09:05:00Z", at("2026-11-30T09:02:00Z"));
        assert_string_equal(b, "in 3m");
        format_relative(b, sizeof(b), NULL, 0);
        assert_string_equal(b, "-");

        format_money(b, sizeof(b), 31250);
        assert_string_equal(b, "$0.031250");
        format_money(b, sizeof(b), 12345678);
        assert_string_equal(b, "$12.345678");
        format_money(b, sizeof(b), 0);
        assert_string_equal(b, "$0.000000");

        format_bytes(b, sizeof(b), 512);
        assert_string_equal(b, "512 B");
        format_bytes(b, sizeof(b), 1536);
        assert_string_equal(b, "1.5 KiB");
        format_bytes(b, sizeof(b), 270LL * 1024 * 1024);
        assert_string_equal(b, "270.0 MiB");
}

static void test_detail(void **state) {
        json_t *s = json_loads(sandbox_json, 0, NULL);
        char *out;

        assert_non_null(s);
        out = render(format_sandbox_detail, s, at("2026-11-30T09:02:00Z"));
        assert_non_null(strstr(out, "id: sbx_9f2c4e1a7b3d5c6e8f01\n"));
        assert_non_null(strstr(out, "name: demo\n"));
        assert_non_null(strstr(out, "state: running\n"));
        assert_non_null(strstr(out, "driver: namespace\n"));
        assert_non_null(strstr(out, "memory: 1024 MiB\n"));
        assert_non_null(strstr(out, "disk: 2048 MiB\n"));
        assert_non_null(strstr(out, "internet: yes\n"));
        assert_non_null(strstr(out, "allow: pypi.org, *.pythonhosted.org\n"));
        assert_null(strstr(out, "deny:"));
        assert_non_null(strstr(out, "lease: 300 s\n"));
        assert_non_null(strstr(out, "created: 2026-11-30T09:00:00Z (2m ago)\n"));
        assert_non_null(strstr(out, "stopped: -\n"));
        assert_non_null(strstr(out, "lease ends: 2026-11-30T09:05:00Z (in 3m)\n"));
        assert_non_null(strstr(out, "cost per hour: $0.012500/h\n"));
        assert_non_null(strstr(out, "cost so far: $0.000012\n"));
        assert_non_null(strstr(out, "max cost: -\n"));
        assert_non_null(strstr(out, "labels: team=a\n"));
        assert_null(strstr(out, "failure"));
        free(out);

        /* A failed sandbox says why; daemon strings cannot drive the terminal. */
        json_object_set_new(s, "state", json_string("failed"));
        json_object_set_new(s, "failureReason", json_string("oom"));
        json_object_set_new(s, "name", json_string("evil\x1b[2Jname"));
        out = render(format_sandbox_detail, s, at("2026-11-30T09:02:00Z"));
        assert_non_null(strstr(out, "failure reason: oom\n"));
        assert_non_null(strstr(out, "name: evil?[2Jname\n"));
        assert_null(strchr(out, '\x1b'));
        free(out);
        json_decref(s);
}

static void format_table_of(FILE *f, json_t *list, time_t now) {
        format_sandbox_table(f, list, now);
}

static void test_table(void **state) {
        json_t *s = json_loads(sandbox_json, 0, NULL), *list = json_array(), *s2 = json_deep_copy(s);
        char *out;

        json_object_set_new(s2, "id", json_string("sbx_2"));
        json_object_set_new(s2, "name", json_null());
        json_object_set_new(s2, "state", json_string("stopped"));
        json_array_append_new(list, s);
        json_array_append_new(list, s2);
        out = render(format_table_of, list, at("2026-11-30T09:02:00Z"));
        assert_string_equal(out, "ID                        NAME  STATE    DRIVER     CREATED  LEASE ENDS\n"
                                 "sbx_9f2c4e1a7b3d5c6e8f01  demo  running  namespace  2m ago   in 3m\n"
                                 "sbx_2                     -     stopped  namespace  2m ago   -\n");
        free(out);
        json_decref(list);

        list = json_array();
        out = render(format_table_of, list, 0);
        assert_string_equal(out, "ID  NAME  STATE  DRIVER  CREATED  LEASE ENDS\n");
        free(out);
        json_decref(list);
}

static void images_of(FILE *f, json_t *j, time_t now) {
        format_image_table(f, j);
}

static void entries_of(FILE *f, json_t *j, time_t now) {
        format_file_entries(f, j);
}

static void test_images_and_entries(void **state) {
        json_t *imgs =
                json_loads("[{\"name\":\"default\",\"built\":true,\"builtAt\":\"2026-11-30T08:00:00Z\","
                           "\"sizeBytes\":283115520},{\"name\":\"other\",\"built\":false}]",
                           0, NULL);
        json_t *ents = json_loads(
                "[{\"path\":\"/workspace/a.txt\",\"name\":\"a.txt\",\"type\":\"file\",\"size\":12,"
                "\"mode\":420,\"mtime\":\"2026-11-30T09:00:00Z\"},"
                "{\"path\":\"/workspace/l\",\"name\":\"l\",\"type\":\"symlink\",\"size\":1,"
                "\"mode\":511,\"mtime\":\"2026-11-30T09:00:00Z\",\"target\":\"/\"}]",
                0, NULL);
        char *out;

        out = render(images_of, imgs, 0);
        assert_non_null(strstr(out, "NAME     BUILT  BUILT AT              SIZE\n"));
        assert_non_null(strstr(out, "default  yes    2026-11-30T08:00:00Z  270.0 MiB\n"));
        assert_non_null(strstr(out, "other    no     -                     -\n"));
        free(out);
        out = render(entries_of, ents, 0);
        assert_non_null(strstr(out, "file     0644  12    2026-11-30T09:00:00Z  /workspace/a.txt\n"));
        assert_non_null(strstr(out, "symlink  0777  1     2026-11-30T09:00:00Z  /workspace/l -> /\n"));
        free(out);
        json_decref(imgs);
        json_decref(ents);
}

static void test_error_object(void **state) {
        static const char body[] =
                "{\"error\": {\"code\": \"not_found\", \"status\": 404, \"message\": \"no sandbox "
                "sbx_1\", \"hint\": \"list your sandboxes\\u001b[31m\", \"requestId\": \"req_1\"}}";
        CliError e;

        cli_error_from_json(&e, 404, body, strlen(body));
        assert_int_equal(e.status, 404);
        assert_string_equal(e.code, "not_found");
        assert_string_equal(e.message, "no sandbox sbx_1");
        assert_string_equal(e.hint, "list your sandboxes?[31m");
        assert_string_equal(e.request_id, "req_1");

        /* An exec or build stream's error event, in both spellings. */
        {
                static const char ev1[] =
                        "{\"type\":\"error\",\"error\":{\"code\":\"unavailable\",\"message\":\"stopped\"}}";
                static const char ev2[] =
                        "{\"type\":\"error\",\"error\":{\"error\":{\"code\":\"unavailable\","
                        "\"status\":503,\"message\":\"stopped\",\"hint\":\"create one\"}}}";
                cli_error_from_json(&e, 0, ev1, strlen(ev1));
                assert_string_equal(e.message, "stopped");
                assert_string_equal(e.code, "unavailable");
                cli_error_from_json(&e, 0, ev2, strlen(ev2));
                assert_string_equal(e.message, "stopped");
                assert_string_equal(e.hint, "create one");
                assert_int_equal(e.status, 503);
                cli_error_from_json(&e, 0, "{\"type\":\"error\"}", 16);
                assert_string_equal(e.message, "runtimed reported an error without a message");
        }

        cli_error_from_json(&e, 502, "<html>bad gateway</html>", 24);
        assert_int_equal(e.status, 502);
        assert_string_equal(e.message, "runtimed answered HTTP 502 without an error object");
        assert_string_equal(e.hint, "");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rfc3339),
                cmocka_unit_test(test_spans_money_bytes),
                cmocka_unit_test(test_detail),
                cmocka_unit_test(test_table),
                cmocka_unit_test(test_images_and_entries),
                cmocka_unit_test(test_error_object),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
