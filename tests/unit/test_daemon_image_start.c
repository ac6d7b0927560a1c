/* An image's start command (daemon/model/image_start.h): the wire's start
 * normalized (a string run by /bin/sh -c, the timeout's default), every bad
 * field refused with its name, and the default a Dockerfile's CMD and
 * ENTRYPOINT give, combined by Docker's rules. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/jsonutil.h"
#include "daemon/model/image_start.h"

static json_t *parse_ok(const char *text) {
        _cleanup_json_ json_t *v = json_loads(text, 0, NULL);
        assert_non_null(v);
        json_t *out = NULL;
        char msg[256] = "";
        assert_int_equal(image_start_parse(v, &out, msg, sizeof msg), 0);
        assert_non_null(out);
        return out;
}

static void refused(json_t *v, const char *says) {
        json_t *out = NULL;
        char msg[256] = "";
        assert_int_equal(image_start_parse(v, &out, msg, sizeof msg), -EINVAL);
        assert_null(out);
        if (!strstr(msg, says))
                fail_msg("\"%s\" does not say \"%s\"", msg, says);
        json_decref(v);
}

static void test_normalized(void **state) {
        _cleanup_json_ json_t *a = parse_ok("{\"command\": \"python3 -m http.server 8000\", \"readyPort\": 8000}");
        _cleanup_json_ json_t *want = json_loads("{\"command\": [\"/bin/sh\", \"-c\", \"python3 -m http.server "
                                                 "8000\"], \"readyPort\": 8000, \"readyTimeoutSeconds\": 60}",
                                                 0, NULL);
        assert_true(json_equal(a, want));
        _cleanup_json_ json_t *b = parse_ok("{\"command\": [\"srv\", \"--port\", \"1\"], \"readyCommand\": "
                                            "\"curl -f localhost:1\", \"readyTimeoutSeconds\": 600, "
                                            "\"readyPort\": null}");
        assert_int_equal(json_array_size(json_object_get(b, "command")), 3);
        assert_int_equal(json_array_size(json_object_get(b, "readyCommand")), 3);
        assert_null(json_object_get(b, "readyPort"));
        assert_int_equal(json_integer_value(json_object_get(b, "readyTimeoutSeconds")), 600);
}

static void test_refusals(void **state) {
        refused(json_string("x"), "start must be an object");
        refused(json_pack("{s:s}", "command", ""), "start.command");
        refused(json_pack("{s:[]}", "command"), "start.command");
        refused(json_pack("{s:[s]}", "command", ""), "name a program");
        refused(json_pack("{s:[s,i]}", "command", "a", 1), "start.command[1]");
        refused(json_pack("{s:i}", "readyPort", 80), "start.command is required");
        refused(json_pack("{s:s,s:i}", "command", "x", "readyPort", 0), "readyPort");
        refused(json_pack("{s:s,s:i}", "command", "x", "readyPort", 65536), "readyPort");
        refused(json_pack("{s:s,s:s}", "command", "x", "readyPort", "80"), "readyPort");
        refused(json_pack("{s:s,s:i,s:s}", "command", "x", "readyPort", 80, "readyCommand", "true"), "not both");
        refused(json_pack("{s:s,s:i}", "command", "x", "readyTimeoutSeconds", 0), "readyTimeoutSeconds");
        refused(json_pack("{s:s,s:i}", "command", "x", "readyTimeoutSeconds", 601), "readyTimeoutSeconds");
        refused(json_pack("{s:s,s:b}", "command", "x", "readyTimeoutSeconds", 1), "readyTimeoutSeconds");
        refused(json_pack("{s:s,s:i}", "command", "x", "bogus", 1), "start.bogus");
        refused(json_pack("{s:s,s:s}", "command", "x", "readyCommand", ""), "readyCommand");
        /* Bounds: words, bytes, and a NUL inside a string. */
        json_t *many = json_array();
        for (int i = 0; i < IMAGE_START_ARGV_MAX + 1; i++)
                json_array_append_new(many, json_string("w"));
        refused(json_pack("{s:o}", "command", many), "start.command");
        char *big = malloc(IMAGE_START_COMMAND_MAX + 2);
        memset(big, 'x', IMAGE_START_COMMAND_MAX + 1);
        big[IMAGE_START_COMMAND_MAX + 1] = '\0';
        refused(json_pack("{s:s}", "command", big), "start.command");
        big[IMAGE_START_READY_COMMAND_MAX + 1] = '\0';
        refused(json_pack("{s:s,s:s}", "command", "x", "readyCommand", big), "readyCommand");
        free(big);
        refused(json_pack("{s:s#}", "command", "a\0b", (size_t)3), "start.command");
}

static json_t *from(const char *config) {
        _cleanup_json_ json_t *c = json_loads(config, 0, NULL);
        assert_non_null(c);
        json_t *out = NULL;
        assert_int_equal(image_start_from_config(c, &out), 0);
        return out;
}

static void test_cmd_and_entrypoint(void **state) {
        assert_null(from("{}"));
        assert_null(from("{\"cmd\": [], \"entrypoint\": []}"));
        _cleanup_json_ json_t *cmd = from("{\"cmd\": [\"python3\", \"app.py\"]}");
        _cleanup_json_ json_t *want = json_loads("{\"command\": [\"python3\", \"app.py\"], "
                                                 "\"readyTimeoutSeconds\": 60}", 0, NULL);
        assert_true(json_equal(cmd, want));
        /* An exec-form ENTRYPOINT takes the CMD as its arguments. */
        _cleanup_json_ json_t *both = from("{\"entrypoint\": [\"srv\"], \"cmd\": [\"--port\", \"1\"]}");
        _cleanup_json_ json_t *argv = json_loads("[\"srv\", \"--port\", \"1\"]", 0, NULL);
        assert_true(json_equal(json_object_get(both, "command"), argv));
        /* A shell-form one takes none. */
        _cleanup_json_ json_t *shell = from("{\"entrypoint\": [\"/bin/sh\", \"-c\", \"srv\"], \"entrypointShell\": "
                                            "true, \"cmd\": [\"--port\"]}");
        assert_int_equal(json_array_size(json_object_get(shell, "command")), 3);
        /* A HEALTHCHECK CMD is the readiness check; alone it starts nothing. */
        _cleanup_json_ json_t *hc = from("{\"cmd\": [\"srv\"], \"healthcheck\": [\"/bin/sh\", \"-c\", \"check\"]}");
        assert_int_equal(json_array_size(json_object_get(hc, "readyCommand")), 3);
        assert_null(from("{\"healthcheck\": [\"check\"]}"));
        /* A registry's config that is not argv gives no start, and no check. */
        assert_null(from("{\"cmd\": [\"srv\", 1]}"));
        assert_null(from("{\"cmd\": [\"\"]}"));
        _cleanup_json_ json_t *bad_hc = from("{\"cmd\": [\"srv\"], \"healthcheck\": [2]}");
        assert_null(json_object_get(bad_hc, "readyCommand"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_normalized),
                cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_cmd_and_entrypoint),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
