#pragma once
/* GET /healthz, GET /v1/info, GET /metrics. */
#include "daemon/http/http.h"

enum MHD_Result handle_healthz(Req *r);
enum MHD_Result handle_info(Req *r);
enum MHD_Result handle_metrics(Req *r);
