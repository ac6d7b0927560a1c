#pragma once
/* POST /v1/sandboxes/{id}:exec, buffered or streamed as NDJSON. */
#include "daemon/http/http.h"

enum MHD_Result handle_exec(Req *r);
