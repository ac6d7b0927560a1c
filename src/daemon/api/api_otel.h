#pragma once
/* The OpenTelemetry exports' routes: /v1/otel-exports. */
#include "daemon/http/http.h"

enum MHD_Result handle_otel_list(Req *r);
enum MHD_Result handle_otel_create(Req *r);
enum MHD_Result handle_otel_get(Req *r);
enum MHD_Result handle_otel_update(Req *r);
enum MHD_Result handle_otel_flush(Req *r);
enum MHD_Result handle_otel_delete(Req *r);
