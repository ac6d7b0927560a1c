#pragma once
/*
 * The Model Context Protocol's messages as runtimed takes them (docs/mcp.md):
 * JSON-RPC 2.0 over the streamable HTTP transport, the protocol versions
 * it negotiates, and the shape of each message a client sends. Pure
 * functions (no I/O, no globals), unit-tested and fuzzed: a body is
 * hostile until these have read it.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* JSON-RPC's error codes. */
#define MCP_PARSE_ERROR (-32700)
#define MCP_INVALID_REQUEST (-32600)
#define MCP_METHOD_NOT_FOUND (-32601)
#define MCP_INVALID_PARAMS (-32602)
#define MCP_INTERNAL_ERROR (-32603)
/* Ours, in the range JSON-RPC leaves to servers. */
#define MCP_SERVER_BUSY (-32000)

/* Messages in one batch: a client sends one, or a handful. */
#define MCP_MAX_BATCH 32u
#define MCP_MAX_DEPTH 32u
#define MCP_MAX_METHOD 128u
#define MCP_MAX_ID 256u /* a string id's bytes */

typedef enum McpVersion {
        MCP_V_2024_11_05,
        MCP_V_2025_03_26,
        MCP_V_2025_06_18,
        MCP_V_2025_11_25,
        _MCP_V_MAX,
} McpVersion;
#define MCP_V_LATEST (_MCP_V_MAX - 1)

const char *mcp_version_name(McpVersion v);
/* 0 and *ret for a version this server speaks; -EINVAL for any other. */
int mcp_version_parse(const char *s, McpVersion *ret);
/* The version an initialize answers: the one asked when this server speaks
 * it, else its latest (the client then decides whether it goes on). */
McpVersion mcp_version_negotiate(const char *asked);
/* Whether a POST may carry a JSON-RPC batch under v: 2025-03-26 allowed
 * them (2024-11-05 too, as JSON-RPC does); 2025-06-18 removed them. */
bool mcp_version_batches(McpVersion v);

/* A body: 0 and *ret (a new reference): an object (one message) or an
 * array of 1..MCP_MAX_BATCH of them. -EBADMSG when it is not JSON, has
 * duplicate names or nests deeper than MCP_MAX_DEPTH (a parse error);
 * -EINVAL for JSON that is no message or batch (an invalid request). */
int mcp_body_parse(const char *buf, size_t len, json_t **ret);

typedef enum McpKind {
        MCP_MSG_REQUEST,      /* method and id: answered */
        MCP_MSG_NOTIFICATION, /* method, no id: never answered */
        MCP_MSG_RESPONSE,     /* result or error and id: a client's answer */
        MCP_MSG_INVALID,      /* answered with error and message */
} McpKind;

typedef struct McpMessage {
        McpKind kind;
        json_t *id;         /* borrowed; NULL when none or unusable */
        const char *method; /* borrowed; requests and notifications */
        json_t *params;     /* borrowed; an object, or NULL when absent */
        const char *error;  /* MCP_MSG_INVALID: why, a static string */
} McpMessage;

/* What one element of a body is. */
void mcp_message_classify(json_t *msg, McpMessage *ret);

/* {"jsonrpc":"2.0","id":id,"result":result}: steals result; id borrowed
 * (null when NULL). NULL on ENOMEM. */
json_t *mcp_result(json_t *id, json_t *result);
/* {"jsonrpc":"2.0","id":id,"error":{"code","message"}}. */
json_t *mcp_error(json_t *id, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
