/*
 * libFuzzer target for the MCP endpoint's JSON-RPC reading, which any key
 * holder feeds: the input is a POST /mcp body. Whatever the parser takes is
 * an object or a batch of 1..MCP_MAX_BATCH; each message classifies into
 * exactly one kind, a request with an id and a method, a notification with
 * a method and no id, an invalid one with its reason; and every answer
 * built from it (a result, an error echoing the id) dumps as JSON that
 * parses back with the same id.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/mcp_rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_answer(json_t *answer, json_t *id) {
        if (!answer)
                abort();
        char *text = json_dumps(answer, JSON_COMPACT);
        if (!text)
                abort();
        json_t *back = json_loads(text, 0, NULL);
        if (!back || !json_equal(json_object_get(back, "id"), id ? id : json_null()))
                abort();
        json_decref(back);
        free(text);
        json_decref(answer);
}

static void check_message(json_t *msg) {
        McpMessage m;
        mcp_message_classify(msg, &m);
        switch (m.kind) {
        case MCP_MSG_REQUEST:
                if (!m.id || !m.method || !*m.method || strlen(m.method) > MCP_MAX_METHOD)
                        abort();
                break;
        case MCP_MSG_NOTIFICATION:
                if (m.id || !m.method)
                        abort();
                break;
        case MCP_MSG_RESPONSE:
                if (!m.id || m.method)
                        abort();
                break;
        case MCP_MSG_INVALID:
                if (!m.error || m.method)
                        abort();
                break;
        }
        if (m.params && !json_is_object(m.params))
                abort();
        if (m.id && !json_is_integer(m.id) && !(json_is_string(m.id) && json_string_length(m.id) <= MCP_MAX_ID))
                abort();
        check_answer(mcp_result(m.id, json_object()), m.id);
        check_answer(mcp_error(m.id, MCP_INVALID_REQUEST, "%s", m.error ? m.error : "x"), m.id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        json_t *doc = NULL;
        int rc = mcp_body_parse((const char *)data, size, &doc);
        if (rc < 0) {
                if (doc)
                        abort();
                return 0;
        }
        if (json_is_object(doc))
                check_message(doc);
        else if (json_is_array(doc) && json_array_size(doc) >= 1 && json_array_size(doc) <= MCP_MAX_BATCH) {
                size_t i;
                json_t *msg;
                json_array_foreach(doc, i, msg)
                        check_message(msg);
        } else
                abort();
        json_decref(doc);
        McpVersion v;
        char version[16];
        size_t n = size < sizeof version - 1 ? size : sizeof version - 1;
        memcpy(version, data, n);
        version[n] = '\0';
        if (mcp_version_parse(version, &v) == 0 && strcmp(mcp_version_name(v), version) != 0)
                abort();
        return 0;
}
