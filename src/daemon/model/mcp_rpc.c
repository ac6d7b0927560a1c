#include "daemon/model/mcp_rpc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/jsonutil.h"

static const char *const version_names[_MCP_V_MAX] = {
        [MCP_V_2024_11_05] = "2024-11-05",
        [MCP_V_2025_03_26] = "2025-03-26",
        [MCP_V_2025_06_18] = "2025-06-18",
        [MCP_V_2025_11_25] = "2025-11-25",
};

const char *mcp_version_name(McpVersion v) {
        return (unsigned)v < _MCP_V_MAX ? version_names[v] : version_names[MCP_V_LATEST];
}

int mcp_version_parse(const char *s, McpVersion *ret) {
        if (!s)
                return -EINVAL;
        for (unsigned v = 0; v < _MCP_V_MAX; v++)
                if (strcmp(s, version_names[v]) == 0) {
                        *ret = (McpVersion)v;
                        return 0;
                }
        return -EINVAL;
}

McpVersion mcp_version_negotiate(const char *asked) {
        McpVersion v;
        return mcp_version_parse(asked, &v) == 0 ? v : MCP_V_LATEST;
}

bool mcp_version_batches(McpVersion v) {
        return v == MCP_V_2024_11_05 || v == MCP_V_2025_03_26;
}

int mcp_body_parse(const char *buf, size_t len, json_t **ret) {
        /* Counted before the parser recurses into it. */
        if (!buf || !json_depth_ok(buf, len, MCP_MAX_DEPTH))
                return -EBADMSG;
        json_error_t err;
        json_t *doc = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
        if (!doc)
                return -EBADMSG;
        if (json_is_object(doc) ||
            (json_is_array(doc) && json_array_size(doc) >= 1 && json_array_size(doc) <= MCP_MAX_BATCH)) {
                *ret = doc;
                return 0;
        }
        json_decref(doc);
        return -EINVAL;
}

/* An id JSON-RPC allows and MCP keeps: a string or an integer (MCP forbids
 * null; a fraction is no id either). */
static bool id_ok(json_t *id) {
        if (json_is_integer(id))
                return true;
        return json_is_string(id) && json_string_length(id) <= MCP_MAX_ID;
}

static bool method_ok(const char *m, size_t len) {
        if (len == 0 || len > MCP_MAX_METHOD || strlen(m) != len)
                return false;
        for (size_t i = 0; i < len; i++)
                if ((unsigned char)m[i] < 0x20 || m[i] == 0x7f)
                        return false;
        return true;
}

void mcp_message_classify(json_t *msg, McpMessage *ret) {
        *ret = (McpMessage){ .kind = MCP_MSG_INVALID };
        if (!json_is_object(msg)) {
                ret->error = "a message is a JSON object";
                return;
        }
        json_t *id = json_object_get(msg, "id");
        if (id && id_ok(id))
                ret->id = id;
        const char *v = json_string_value(json_object_get(msg, "jsonrpc"));
        if (!v || strcmp(v, "2.0") != 0) {
                ret->error = "jsonrpc must be \"2.0\"";
                return;
        }
        if (id && !ret->id) {
                ret->error = "id must be a string or an integer";
                return;
        }
        json_t *method = json_object_get(msg, "method");
        if (!method) {
                bool has_result = json_object_get(msg, "result"), has_error = json_object_get(msg, "error");
                if (ret->id && has_result != has_error) {
                        ret->kind = MCP_MSG_RESPONSE;
                        return;
                }
                ret->error = "a message has a method, or is a response with an id and one of result and error";
                return;
        }
        if (!json_is_string(method) || !method_ok(json_string_value(method), json_string_length(method))) {
                ret->error = "method must be a name";
                return;
        }
        json_t *params = json_object_get(msg, "params");
        if (params && !json_is_object(params) && !json_is_null(params)) {
                /* MCP's params are always named. */
                ret->error = "params must be an object";
                return;
        }
        ret->method = json_string_value(method);
        ret->params = json_is_object(params) ? params : NULL;
        ret->kind = ret->id ? MCP_MSG_REQUEST : MCP_MSG_NOTIFICATION;
}

json_t *mcp_result(json_t *id, json_t *result) {
        if (!result)
                return NULL;
        return json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(), "result", result);
}

json_t *mcp_error(json_t *id, int code, const char *fmt, ...) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        return json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", "code", code,
                         "message", msg);
}
