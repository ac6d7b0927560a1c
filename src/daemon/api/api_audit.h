#pragma once
/* GET /v1/audit: the key's owner's audit trail, newest first. */
#include "daemon/http/http.h"

enum MHD_Result handle_audit(Req *r);
