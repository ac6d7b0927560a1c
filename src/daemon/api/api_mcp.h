#pragma once
/* The Model Context Protocol endpoint (docs/mcp.md): POST /mcp takes
 * JSON-RPC messages of the streamable HTTP transport, DELETE /mcp ends a
 * session. Its tools run the daemon's own sandbox operations in-process,
 * under the request's key. */
#include "daemon/api/api.h"

enum MHD_Result handle_mcp_post(Req *r);
enum MHD_Result handle_mcp_delete(Req *r);
/* The body bound of POST /mcp: a write_file's content, in base64, and
 * JSON-RPC's envelope. */
#define MCP_MAX_BODY (4u * 1024u * 1024u)

/* The sessions of the endpoint: bounded in all and per owner (a new one
 * past the owner's bound ends that owner's least recently used), each
 * ended by DELETE /mcp or after MCP_SESSION_IDLE_S unused. */
#define MCP_SESSIONS_MAX 4096u
#define MCP_SESSIONS_PER_OWNER 32u
#define MCP_SESSION_IDLE_S 1800
typedef struct McpSessions McpSessions;
McpSessions *mcp_sessions_new(void);
void mcp_sessions_free(McpSessions *s);
