#pragma once
/* The guard rails' routes: keys, limits, trial. */
#include "daemon/http/http.h"

enum MHD_Result handle_keys_list(Req *r);
enum MHD_Result handle_keys_create(Req *r);
enum MHD_Result handle_key_revoke(Req *r);
enum MHD_Result handle_limits(Req *r);
enum MHD_Result handle_me(Req *r);
enum MHD_Result handle_trial(Req *r);
