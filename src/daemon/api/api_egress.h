#pragma once
/* Egress secrets and a sandbox's egress audit log. */
#include "daemon/http/http.h"

enum MHD_Result handle_secrets_list(Req *r);
enum MHD_Result handle_secret_get(Req *r);
enum MHD_Result handle_secret_put(Req *r);
enum MHD_Result handle_secret_delete(Req *r);
enum MHD_Result handle_sandbox_egress(Req *r);
enum MHD_Result handle_secret_rotate(Req *r);
/* 501 not_implemented, with what to do instead, for the published client's
 * calls of features a self-hosted daemon does not have. */
enum MHD_Result handle_not_offered(Req *r);
