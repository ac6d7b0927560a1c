#pragma once
/* Egress secrets and a sandbox's egress audit log. */
#include "daemon/http.h"

enum MHD_Result handle_secrets_list(Req *r);
enum MHD_Result handle_secret_get(Req *r);
enum MHD_Result handle_secret_put(Req *r);
enum MHD_Result handle_secret_delete(Req *r);
enum MHD_Result handle_sandbox_egress(Req *r);
