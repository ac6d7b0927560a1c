#pragma once
/* MCP servers inside a sandbox (docs/mcp.md, "Inside a sandbox"):
 * GET /v1/mcp/catalog, and POST, GET and DELETE /v1/sandboxes/{id}/mcp. */
#include "daemon/http/http.h"

enum MHD_Result handle_mcp_catalog(Req *r);
enum MHD_Result handle_sandbox_mcp_start(Req *r);
enum MHD_Result handle_sandbox_mcp_get(Req *r);
enum MHD_Result handle_sandbox_mcp_stop(Req *r);
