/* The MCP endpoint's JSON-RPC reading (daemon/model/mcp_rpc.h): the
 * versions it negotiates and where batches are allowed; what a body may
 * be (an object, or a batch of 1..MCP_MAX_BATCH) and what is a parse
 * error (not JSON, too deep, a name repeated); each message's kind; the
 * shapes of the answers. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/model/mcp_rpc.h"

static void test_versions(void **state) {
        McpVersion v;
        assert_int_equal(mcp_version_parse("2025-06-18", &v), 0);
        assert_int_equal(v, MCP_V_2025_06_18);
        assert_string_equal(mcp_version_name(v), "2025-06-18");
        assert_int_equal(mcp_version_parse("2025-06-18 ", &v), -EINVAL);
        assert_int_equal(mcp_version_parse("", &v), -EINVAL);
        assert_int_equal(mcp_version_parse(NULL, &v), -EINVAL);
        assert_int_equal(mcp_version_negotiate("2024-11-05"), MCP_V_2024_11_05);
        assert_int_equal(mcp_version_negotiate("2099-01-01"), MCP_V_LATEST);
        assert_int_equal(mcp_version_negotiate(NULL), MCP_V_LATEST);
        assert_string_equal(mcp_version_name(MCP_V_LATEST), "2025-11-25");
        assert_true(mcp_version_batches(MCP_V_2025_03_26));
        assert_true(mcp_version_batches(MCP_V_2024_11_05));
        assert_false(mcp_version_batches(MCP_V_2025_06_18));
        assert_false(mcp_version_batches(MCP_V_2025_11_25));
}

static int parse(const char *s, json_t **ret) {
        return mcp_body_parse(s, strlen(s), ret);
}

static void test_bodies(void **state) {
        json_t *doc = NULL;
        assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", &doc), 0);
        assert_true(json_is_object(doc));
        json_decref(doc);
        assert_int_equal(parse("[{\"jsonrpc\":\"2.0\",\"method\":\"x\"}]", &doc), 0);
        assert_true(json_is_array(doc));
        json_decref(doc);
        /* Parse errors. */
        assert_int_equal(parse("{\"jsonrpc\":", &doc), -EBADMSG);
        assert_int_equal(parse("", &doc), -EBADMSG);
        assert_int_equal(parse("{\"id\":1,\"id\":2}", &doc), -EBADMSG);
        assert_int_equal(parse("{} {}", &doc), -EBADMSG);
        assert_int_equal(mcp_body_parse(NULL, 0, &doc), -EBADMSG);
        char deep[2 * (MCP_MAX_DEPTH + 1) + 1];
        memset(deep, '[', MCP_MAX_DEPTH + 1);
        memset(deep + MCP_MAX_DEPTH + 1, ']', MCP_MAX_DEPTH + 1);
        deep[sizeof deep - 1] = '\0';
        assert_int_equal(parse(deep, &doc), -EBADMSG);
        /* JSON, but neither a message nor a batch. */
        assert_int_equal(parse("\"ping\"", &doc), -EINVAL);
        assert_int_equal(parse("42", &doc), -EINVAL);
        assert_int_equal(parse("null", &doc), -EINVAL);
        assert_int_equal(parse("[]", &doc), -EINVAL);
        char batch[64 * (MCP_MAX_BATCH + 1) + 4] = "[";
        for (unsigned i = 0; i <= MCP_MAX_BATCH; i++)
                strcat(batch, i ? ",{}" : "{}");
        strcat(batch, "]");
        assert_int_equal(parse(batch, &doc), -EINVAL);
}

static McpKind kind_of(const char *s, McpMessage *m, json_t **doc) {
        *doc = json_loads(s, JSON_DECODE_ANY, NULL);
        assert_non_null(*doc);
        mcp_message_classify(*doc, m);
        return m->kind;
}

static void test_messages(void **state) {
        McpMessage m;
        json_t *doc;
        assert_int_equal(kind_of("{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"tools/list\",\"params\":{}}", &m,
                                 &doc), MCP_MSG_REQUEST);
        assert_string_equal(m.method, "tools/list");
        assert_string_equal(json_string_value(m.id), "a");
        assert_non_null(m.params);
        json_decref(doc);
        assert_int_equal(kind_of("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", &m, &doc),
                         MCP_MSG_NOTIFICATION);
        assert_null(m.id);
        assert_null(m.params);
        json_decref(doc);
        assert_int_equal(kind_of("{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}", &m, &doc), MCP_MSG_RESPONSE);
        json_decref(doc);
        assert_int_equal(kind_of("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"x\",\"params\":null}", &m, &doc),
                         MCP_MSG_REQUEST);
        assert_null(m.params);
        json_decref(doc);
        static const char *const invalid[] = {
                "[]",
                "{\"id\":1,\"method\":\"ping\"}",
                "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}",
                "{\"jsonrpc\":2,\"id\":1,\"method\":\"ping\"}",
                "{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}",
                "{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}",
                "{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}",
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":7}",
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\"}",
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\\u0000b\"}",
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\\nb\"}",
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":[1]}",
                "{\"jsonrpc\":\"2.0\",\"id\":1}",
                "{\"jsonrpc\":\"2.0\",\"result\":{}}",
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{},\"error\":{}}",
        };
        for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) {
                doc = json_loads(invalid[i], JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
                assert_non_null(doc);
                mcp_message_classify(doc, &m);
                if (m.kind != MCP_MSG_INVALID)
                        fail_msg("taken: %s", invalid[i]);
                assert_non_null(m.error);
                json_decref(doc);
        }
        /* An invalid message keeps a usable id for its error. */
        kind_of("{\"jsonrpc\":\"1.0\",\"id\":9,\"method\":\"ping\"}", &m, &doc);
        assert_int_equal(json_integer_value(m.id), 9);
        json_decref(doc);
        char long_id[MCP_MAX_ID + 64];
        snprintf(long_id, sizeof long_id, "{\"jsonrpc\":\"2.0\",\"id\":\"%0*d\",\"method\":\"ping\"}", MCP_MAX_ID + 1, 0);
        assert_int_equal(kind_of(long_id, &m, &doc), MCP_MSG_INVALID);
        assert_null(m.id);
        json_decref(doc);
}

static void test_answers(void **state) {
        json_t *id = json_integer(4);
        json_t *r = mcp_result(id, json_pack("{s:b}", "ok", 1));
        assert_non_null(r);
        assert_string_equal(json_string_value(json_object_get(r, "jsonrpc")), "2.0");
        assert_int_equal(json_integer_value(json_object_get(r, "id")), 4);
        assert_true(json_is_true(json_object_get(json_object_get(r, "result"), "ok")));
        json_decref(r);
        json_t *e = mcp_error(NULL, MCP_METHOD_NOT_FOUND, "method %s", "x/y");
        assert_true(json_is_null(json_object_get(e, "id")));
        json_t *err = json_object_get(e, "error");
        assert_int_equal(json_integer_value(json_object_get(err, "code")), -32601);
        assert_string_equal(json_string_value(json_object_get(err, "message")), "method x/y");
        json_decref(e);
        json_decref(id);
        assert_null(mcp_result(NULL, NULL));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_versions),
                cmocka_unit_test(test_bodies),
                cmocka_unit_test(test_messages),
                cmocka_unit_test(test_answers),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
