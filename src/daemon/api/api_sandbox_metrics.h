#pragma once
/* GET /v1/sandboxes/{sandbox}/metrics: a sandbox's readings over a range. */
#include "daemon/http/http.h"

enum MHD_Result handle_sandbox_metrics(Req *r);
