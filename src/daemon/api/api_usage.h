#pragma once
/* The usage routes: GET /v1/usage, /v1/usage/export and /v1/usage/requests. */
#include "daemon/http/http.h"

enum MHD_Result handle_usage(Req *r);
enum MHD_Result handle_usage_export(Req *r);
enum MHD_Result handle_usage_requests(Req *r);
