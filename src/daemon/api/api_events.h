#pragma once
/* GET /v1/events: an owner's lifecycle events, newest first. */
#include "daemon/http/http.h"

enum MHD_Result handle_events(Req *r);
