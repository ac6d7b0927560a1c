#pragma once
/* The sandbox routes: list, create, get, delete, stop, extend, network. */
#include "daemon/http.h"
#include "daemon/sandbox.h"

enum MHD_Result handle_sandbox_list(Req *r);
enum MHD_Result handle_sandbox_create(Req *r);
enum MHD_Result handle_sandbox_get(Req *r);
enum MHD_Result handle_sandbox_delete(Req *r);
enum MHD_Result handle_sandbox_stop(Req *r);
enum MHD_Result handle_sandbox_extend(Req *r);
enum MHD_Result handle_sandbox_network(Req *r);
/* The sandbox's network settings as they are now: {internet, allow, deny}. */
enum MHD_Result handle_sandbox_network_get(Req *r);
/* Answers a manager call's row (cleared here) with status, or its error:
 * the one place the API's sandbox object is made. */
enum MHD_Result api_reply_sandbox_row(Req *r, int rc, SandboxRow *row, const SandboxError *se, unsigned status);
