#pragma once
/* GET /v1/hosts: the hosts that registered themselves in the store. */
#include "daemon/http/http.h"

enum MHD_Result handle_hosts(Req *r);
/* POST /v1/hosts/{host}:drain and :undrain (the route's kind says which). */
enum MHD_Result handle_host_drain(Req *r);
